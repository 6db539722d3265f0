"""``python -m workbench grade STUDENTS [--out OUT]`` (``make grade STUDENTS=... OUT=...``): grade a class.

STUDENTS holds one folder per student: their notebooks directly, or their ``my-work/`` (a copy of
their workbook, or a class hub's homes: ``/home/jupyter-alice/flash-attn-q8/my-work/``). Each lesson
notebook found there (``NN_name.ipynb``, the Chinese ones in ``zh/``) is run in a sandbox of its own
and its exercises checked by otter-grader tests generated from lessonkit's exercise registry
(workbench/grade_notebook.py says how and why in two steps). Written to OUT:

    grades.csv              student, lesson, exercise, points, verdict (one row per exercise)
    feedback/STUDENT.html   one page per student, in the language of their notebooks (self-contained)
    .tests/                 the otter test files of this run, one per exercise
    .cache/                 the kernel builds the checks need, made once with the teacher's checkout

A notebook that hangs, crashes its kernel or cannot be read gets 0 points for what did not run, with
the reason; the other notebooks are graded all the same.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import grade_notebook as gn
from .grade_report import speaking, write_csv, write_feedback

ROOT = gn.ROOT
LESSON_NAME = re.compile(r"^(\d\d[a-z]?)_[^/]*\.ipynb$")
MAX_NOTEBOOK_BYTES = 64 << 20     # a lesson with all its plots is a few MB
MAX_EXTRA_FILES, MAX_EXTRA_BYTES = 64, 1 << 20   # my-work's own files a notebook may read (a debugger's log)


@dataclass(frozen=True)
class HandIn:
    student: str
    path: Path        # the notebook
    lesson: str       # "01", "05b"
    edition: str      # "en" or "zh" (from its folder; a Chinese lesson elsewhere is found by its content)


@dataclass
class Row:
    student: str
    lesson: str       # "01", or "zh/01" for the Chinese edition
    exercise: str     # the exercise's marker, ex01_predict_codes
    points: float
    possible: float
    status: str
    verdict: str
    title: str
    notebook: str
    language: str


# ----------------------------------------------------------------------------- finding the hand-ins

def _real_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink()


def work_folder(student: Path) -> Path:
    """Where a student's lessons are: their my-work/, or one a level down (a clone in a home), else
    the folder itself. Never through a symbolic link (a student's link to another's home)."""
    for candidate in [student / "my-work", *sorted(c / "my-work" for c in student.iterdir() if _real_dir(c))]:
        if _real_dir(candidate) and _real_dir(candidate.parent):
            return candidate
    return student


def find_hand_ins(students: Path) -> list[HandIn]:
    from lessonkit.exercises import REGISTRY
    found = []
    for student in sorted(p for p in students.iterdir() if _real_dir(p) and not p.name.startswith(".")):
        try:
            root = work_folder(student)
            for folder, edition in ((root, "en"), (root / "zh", "zh")):
                if not _real_dir(folder):
                    continue
                for path in sorted(folder.iterdir()):
                    m = LESSON_NAME.match(path.name)
                    if m and m[1] in REGISTRY and not path.is_symlink() and path.is_file():
                        found.append(HandIn(student.name, path, m[1], edition))
        except OSError as e:   # a home this user may not read
            print(f"warning: {student} is not graded: {e.strerror or e} (a class's homes need root: sudo make grade)",
                  file=sys.stderr)
    return found


def shipped(lesson: str, edition: str) -> Path:
    folder = ROOT / "notebooks" / ("zh" if edition == "zh" else "")
    return next(folder.glob(f"{lesson}_*.ipynb"))


# ----------------------------------------------------------------------------- one notebook

def read_bounded(path: Path, most: int) -> bytes:
    """At most ``most`` bytes of a regular file, opened without following a link (a student's link to
    a file of someone else's) and without waiting on a FIFO; OSError if it is larger."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        data = f.read(most + 1)
    if len(data) > most:
        raise OSError(f"larger than {most >> 20} MB")
    return data


def read_notebook(data: bytes):
    """The notebook, or ValueError saying why it is none."""
    import nbformat
    try:
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
    except Exception as e:  # noqa: BLE001 - not UTF-8, not JSON, not a notebook: all said the same way
        raise ValueError(f"{type(e).__name__}: {str(e)[:200]}") from None
    cells = nb.get("cells")
    if not isinstance(cells, list) or not all(isinstance(c, dict) and c.get("cell_type") in ("code", "markdown", "raw")
                                              and isinstance(c.get("source", ""), str) for c in cells):
        raise ValueError("its cells are not a notebook's")
    for c in cells:
        c.setdefault("metadata", {})
        if c["cell_type"] == "code":
            c.setdefault("outputs", [])
    return nb


def grade_one(h: HandIn, run: "Run") -> list[Row]:
    from lessonkit.exercises import REGISTRY
    from lessonkit.exercises.core import NOT_RUN, Verdict
    from .grade_report import GRADER_SAYS

    exercises = REGISTRY[h.lesson]
    outcome: dict[str, tuple[float, float, str, str]] = {}   # marker -> points, possible, status, verdict
    edition, why = h.edition, {}
    job = Path(tempfile.mkdtemp(prefix=f"grade-{h.lesson}-", dir=run.jobs_dir))
    try:
        try:
            nb = read_notebook(read_bounded(h.path, MAX_NOTEBOOK_BYTES))
        except (OSError, ValueError) as e:
            why = {ex.marker: ("unreadable", {"error": str(e)}) for ex in exercises}
            nb = None
        if nb is not None:
            if any('set_language("zh")' in c.get("source", "") for c in nb.cells[:3]):
                edition = "zh"
            calls = run.calls[(h.lesson, edition)]
            run.sandbox.prepare(job)
            inside = run.sandbox.inside(job)
            nb, absent, where = gn.graded_copy(nb, h.lesson, calls, inside["job"] + "/answers")
            why.update({m: ("no cell", {"call": text}) for m, text in absent.items()})
            _copy_work(h, job / "workbook" / "my-work")
            rel = ("zh/" if h.path.parent.name == "zh" else "") + h.path.name
            target = job / "workbook" / "my-work" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            import nbformat
            nbformat.write(nb, target)
            code, log = gn.run_phase(
                run.sandbox.argv(job, "execute", gn.bootstrap(inside["workbook"], "execute",
                                                              f"{inside['workbook']}/my-work/{rel}",
                                                              f"{inside['job']}/progress.jsonl",
                                                              str(run.cell_timeout), str(run.timeout))),
                gn.phase_env(inside, edition, "execute"), run.timeout + 60, job / "execute.log")
            end, errors = _progress(job / "run" / "progress.jsonl", code, run.timeout, log)
            plan = {"language": edition, "markers": [ex.marker for ex in exercises],
                    "tests": {ex.marker: f"{edition}/{h.lesson}/{ex.marker}.py" for ex in exercises}}
            (job / "check" / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
            code, check_log = gn.run_phase(
                run.sandbox.argv(job, "check", gn.bootstrap(inside["workbook"], "check", inside["tests"],
                                                            inside["job"] + "/answers", inside["out"])),
                gn.phase_env(inside, edition, "check"), run.check_timeout, job / "check.log")
            results = _results(job / "check" / "results.json")
            for ex in exercises:
                r = results.get(ex.marker)
                if ex.marker in why:
                    continue
                if r is None and (job / "run" / "answers" / f"{ex.marker}.json").exists():
                    why[ex.marker] = ("not checked", {"error": _last_line(check_log) or f"exit code {code}"})
                elif r is None:
                    why[ex.marker] = end
                elif r.get("missing"):
                    why[ex.marker] = ("no variable", {"names": ", ".join(r["missing"]),
                                                      "call": calls[exercises.index(ex)].text})
                elif "error" in r:
                    why[ex.marker] = ("not checked", {"error": r["error"]})
                else:
                    outcome[ex.marker] = (float(r.get("points") or 0), float(r.get("possible") or 1),
                                          str(r.get("status")), str(r.get("verdict")))
                if ex.marker in why and where.get(ex.marker) in errors:
                    why[ex.marker] = (*why[ex.marker], errors[where[ex.marker]])
    finally:
        if not run.keep:
            shutil.rmtree(job, ignore_errors=True)
    with speaking(edition):
        rows = []
        for ex in exercises:
            if ex.marker in outcome:
                points, possible, status, verdict = outcome[ex.marker]
            else:
                kind, fields, *cell_error = why.get(ex.marker, end if nb is not None else ("unreadable", {}))
                reason = GRADER_SAYS[kind].format(**fields)
                if cell_error:
                    reason += "; " + GRADER_SAYS["cell error"].format(**cell_error[0])
                points, possible, status, verdict = 0.0, 1.0, NOT_RUN, str(Verdict(NOT_RUN, reason))
            rows.append(Row(h.student, ("zh/" if edition == "zh" else "") + h.lesson, ex.marker, points, possible,
                            status, verdict, str(ex.title), h.path.name, edition))
        return rows


def _copy_work(h: HandIn, dest: Path) -> None:
    """The student's own files beside their lessons (a debugger's log the notebook hands in): regular
    files only, none through a link, few and small."""
    src = h.path.parent.parent if h.path.parent.name == "zh" else h.path.parent
    copied = 0
    for p in sorted(src.iterdir()):
        if copied >= MAX_EXTRA_FILES or p.suffix == ".ipynb" or p.is_symlink() or not p.is_file():
            continue
        try:
            (dest / p.name).write_bytes(read_bounded(p, MAX_EXTRA_BYTES))
            copied += 1
        except OSError:
            pass


def _progress(path: Path, code: int | None, timeout: float, log: str) -> tuple[tuple, dict]:
    """How the run ended, as a GRADER_SAYS reason for what did not run, and {cell: error} of its cells.
    ``code``: the execute phase's (None: killed on time); ``log``: the end of what it printed."""
    records = []
    try:
        for line in read_bounded(path, 1 << 20).decode("utf-8", "replace").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                pass
    except OSError:
        pass
    records = [r for r in records if isinstance(r, dict)]
    errors = {r["cell"]: {"cell": r["cell"], "line": str(r.get("line")), "error": str(r.get("error"))}
              for r in records if "error" in r and "cell" in r}
    end = next((r for r in reversed(records) if "end" in r), None)
    if code is None:   # killed on time, beyond the run's own deadline (a kernel that would not start or stop)
        last = max((r.get("cell") or 0 for r in records if isinstance(r.get("cell"), int)), default=0)
        return ("notebook timeout", {"seconds": timeout, "cell": f"{last + 1}?", "line": "?"}), errors
    if end is None:   # the phase itself failed (no kernel, say): the grader's problem, said as it said it
        return ("not checked", {"error": _last_line(log) or f"exit code {code}"}), errors
    if end["end"] == "died":
        c = end.get("code")
        how = _signal_name(-c) if isinstance(c, int) and c < 0 else f"exit code {c}"
        return ("died", {"cell": end.get("cell"), "line": end.get("line"), "how": how}), errors
    if end["end"] in ("cell timeout", "notebook timeout"):
        return (end["end"], {"cell": end.get("cell"), "line": end.get("line"),
                             "seconds": float(end.get("seconds") or timeout)}), errors
    return ("not checked", {"error": "no answer was recorded after its cell"}), errors


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _results(path: Path) -> dict:
    try:
        data = json.loads(read_bounded(path, 8 << 20))
        return data["exercises"] if isinstance(data.get("exercises"), dict) else {}
    except (OSError, ValueError, KeyError, AttributeError):
        return {}


def _last_line(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


# ----------------------------------------------------------------------------- the run

@dataclass
class Run:
    """What every notebook of one run shares: the sandbox, the generated tests, the limits."""
    sandbox: gn.Sandbox
    calls: dict            # (lesson, edition) -> {exercise index: CallSite}
    jobs_dir: Path
    timeout: float         # one notebook's run, all cells
    cell_timeout: float    # one cell
    check_timeout: float   # the checks of one notebook
    keep: bool = False


def prepare(lessons: list[str], out: Path, cache: Path, sandbox: str, students: Path) -> tuple[gn.Sandbox, dict]:
    """The tests of ``lessons`` (both editions) in out/.tests, and the cache of kernel builds (the
    teacher's builds, .build/, to which warm_cache adds what the checks need); the sandbox, and each
    lesson's check calls {(lesson, edition): {exercise index: CallSite}}."""
    tests, calls = out / ".tests", {}
    shutil.rmtree(tests, ignore_errors=True)
    for lesson in lessons:
        for edition in ("en", "zh"):
            calls[lesson, edition] = gn.lesson_calls(shipped(lesson, edition), lesson)
            gn.write_tests(tests / edition / lesson, lesson, calls[lesson, edition])
    cache.mkdir(parents=True, exist_ok=True)
    for lib in (ROOT / ".build").glob("lib*.so*"):
        if lib.is_file() and not (cache / lib.name).exists():
            shutil.copy2(lib, cache / lib.name)
    return gn.Sandbox(sandbox, cache.resolve(), tests.resolve(), [str(students), str(out)]), calls


def warm_cache(lessons: list[str], cache: Path, timeout: float = 1800) -> dict:
    """Every exercise's right answer, computed once with the teacher's checkout (builds into ``cache``);
    {marker: encoded answer}, or {} with a warning if that failed (each check then builds its own)."""
    env = {k: v for k, v in os.environ.items() if k != "LESSONKIT_GRADED"}
    env.update(LESSONKIT_BUILD_DIR=str(cache), LESSONKIT_PREBUILT_DIR=str(ROOT / ".build"), MPLBACKEND="Agg")
    try:
        done = subprocess.run(gn.bootstrap(str(ROOT), "warm", *lessons), env=env, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode == 0:
            return json.loads(done.stdout.strip().splitlines()[-1])
        print(f"warning: the right answers of lessons {', '.join(lessons)} could not be computed "
              f"({_last_line(done.stderr)}): each notebook's check builds what it needs", file=sys.stderr)
    except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
        print(f"warning: computing the right answers failed ({e})", file=sys.stderr)
    return {}


def grade_all(hand_ins: list[HandIn], run: Run, jobs: int) -> list[Row]:
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return [row for rows in pool.map(lambda h: _grade_or_say(h, run), hand_ins) for row in rows]


def _grade_or_say(h: HandIn, run: Run) -> list[Row]:
    """grade_one, or, should the grader itself fail on this notebook, 0 points with the reason: the
    other notebooks are graded all the same."""
    try:
        return grade_one(h, run)
    except Exception as e:  # noqa: BLE001 - one notebook never stops the run
        from lessonkit.exercises import REGISTRY
        from lessonkit.exercises.core import NOT_RUN, Verdict
        from .grade_report import GRADER_SAYS
        with speaking(h.edition):
            why = GRADER_SAYS["not checked"].format(error=f"{type(e).__name__}: {str(e)[:200]}")
            return [Row(h.student, ("zh/" if h.edition == "zh" else "") + h.lesson, ex.marker, 0.0, 1.0, NOT_RUN,
                        str(Verdict(NOT_RUN, why)), str(ex.title), h.path.name, h.edition) for ex in REGISTRY[h.lesson]]


# ----------------------------------------------------------------------------- the command

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workbench grade",
        description="Grade the students' lesson notebooks with otter-grader: each notebook runs in a sandbox of "
                    "its own, and each exercise is checked by a test generated from lessonkit's exercise registry. "
                    "Writes OUT/grades.csv (student, lesson, exercise, points, verdict) and OUT/feedback/STUDENT.html.",
        epilog="STUDENTS is a folder with one folder per student: their notebooks (NN_name.ipynb, zh/NN_name.ipynb), "
               "or their my-work/ a level or two down, as in a class hub's homes (make grade STUDENTS=/home).")
    p.add_argument("students", type=Path, help="the folder of the students' folders")
    p.add_argument("--out", type=Path, default=Path("grades"),
                   help="where grades.csv and feedback/ go (default: grades)")
    p.add_argument("--jobs", type=int, default=2, help="notebooks graded at once (default: 2)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds one notebook may run in all (default: 1200)")
    p.add_argument("--cell-timeout", type=float, default=600, help="seconds one cell may run (default: 600)")
    p.add_argument("--check-timeout", type=float, default=600, help="seconds the checks of one notebook may take")
    p.add_argument("--sandbox", choices=("auto", "bwrap", "none"), default="auto",
                   help="bwrap: each notebook in a bubblewrap sandbox; none: unconfined (a notebook can then read "
                        "and change what you can); auto: bwrap where it runs (default)")
    p.add_argument("--cache", type=Path, help="the folder of kernel builds the checks share (default: OUT/.cache)")
    p.add_argument("--keep", action="store_true", help="keep each notebook's work folder (for debugging the grader)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.students.is_dir():
        print(f"no folder {args.students}: give the folder that holds one folder per student", file=sys.stderr)
        return 2
    if args.jobs < 1 or min(args.timeout, args.cell_timeout, args.check_timeout) <= 0:
        print("--jobs is at least 1 and each timeout is a positive number of seconds", file=sys.stderr)
        return 2
    try:
        import nbclient  # noqa: F401
        import otter  # noqa: F401
    except ImportError as e:
        print(f"grading needs otter-grader ({e}): make grade installs it, or pip install -e '.[grade]'",
              file=sys.stderr)
        return 2
    sandbox = gn.available_sandbox() if args.sandbox in ("auto", "bwrap") else None
    if sandbox is None and args.sandbox == "bwrap":
        print("bwrap (bubblewrap) is missing or cannot make a sandbox here (Debian: apt install bubblewrap; it "
              "needs user namespaces, or root)", file=sys.stderr)
        return 2
    if sandbox is None:
        print("warning: notebooks run without a sandbox (--sandbox none, or no bubblewrap): each can read and change "
              "what you can. Install bubblewrap (Debian: apt install bubblewrap) to confine them.", file=sys.stderr)
    hand_ins = find_hand_ins(args.students)
    if not hand_ins:
        print(f"no lesson notebook (NN_name.ipynb, zh/NN_name.ipynb) in the students' folders of {args.students}",
              file=sys.stderr)
        return 1
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    lessons = sorted({h.lesson for h in hand_ins})
    cache = (args.cache or out / ".cache").resolve()
    box, calls = prepare(lessons, out, cache, sandbox or "none", args.students.resolve())
    print(f"{len(hand_ins)} notebooks of {len({h.student for h in hand_ins})} students, lessons {', '.join(lessons)}; "
          f"computing the right answers once ...", flush=True)
    warm_cache(lessons, cache)
    jobs_dir = Path(tempfile.mkdtemp(prefix="lessonkit-grade-"))
    try:
        run = Run(box, calls, jobs_dir, args.timeout, args.cell_timeout, args.check_timeout, args.keep)
        rows = grade_all(hand_ins, run, args.jobs)
    finally:
        if args.keep:
            print(f"each notebook's work folder is kept in {jobs_dir}")
        else:
            shutil.rmtree(jobs_dir, ignore_errors=True)
    write_csv(rows, out / "grades.csv")
    pages = write_feedback(rows, out / "feedback")
    print(f"{out / 'grades.csv'}: {len(rows)} exercises; {len(pages)} feedback pages in {out / 'feedback'}")
    return 0
