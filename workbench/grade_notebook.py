"""One student's notebook graded (``python -m workbench grade``; workbench/grade.py runs many).

Otter-grader's own ``otter run`` executes the notebook and then runs the tests in the same kernel,
and reads the results back with pickle from a file that kernel writes: a notebook that replaces
``check`` (or otter's Checker) gives itself full marks, and one that writes its own pickle runs its
code in the grader. So the work is split in two processes, each in a sandbox of its own:

1. ``execute``: the student's notebook runs in its kernel (nbclient, the executor otter and
   nbconvert use), in a copy whose extra cells, one after each exercise's answer cell, write the
   variables the lesson's check call passes as data (workbench/grade_capture.py).
2. ``check``: a fresh Python that never imports the student's code runs otter's test files, one
   per exercise, generated from the registry (``write_tests``): each calls the exercise's ``check``
   with the answer read back from that data, in the student's language.

The sandbox is bubblewrap (``bwrap``): no network, its own processes (all ended with it), the
teacher's lessonkit, native/ and lessons read-only at /workbook, the student's my-work/ at
/workbook/my-work, and nothing else of the machine's files but the system's and Python's. Without
bwrap (``--sandbox none``), the phases run unconfined, as the grader's user, with a copy of the
teacher's code: a notebook can then read and change whatever that user can.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent   # the teacher's checkout
CAPTURE_TAG = "lessonkit-grade"                  # the metadata key of the cells the grader adds
# the kernel's environment passes these on (they name the compiler and the kernel's build, and so
# the library that the cache holds)
PASSED_ON = ("CC", "SIMDE_INCLUDE_DIR", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LESSONKIT_DOTPROD",
             "LESSONKIT_SANITIZE", "LANG", "LC_ALL", "PATH")
ETC = ("passwd", "group", "nsswitch.conf", "hosts", "host.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
       "localtime", "fonts", "alternatives", "gdb", "mime.types", "ssl", "matplotlibrc", "python3", "python3.11")
TOP_LEVEL_SKIPPED = {"my-work", ".git", ".build", ".venv", "wheelhouse", "__pycache__"}


# ----------------------------------------------------------------------------- the lessons' check calls

@dataclass(frozen=True)
class CallSite:
    """An exercise's check call in a lesson: ``ex.lesson06.ex1.check(transcript, answers=answers)``."""
    index: int                     # the exercise's place in REGISTRY[lesson]
    args: tuple[str, ...]          # the names passed by position
    kwargs: tuple[tuple[str, str], ...]   # keyword -> name
    text: str                      # the call as the lesson writes it

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys([*self.args, *(v for unused, v in self.kwargs)]))


def _code(cell) -> ast.AST | None:
    from IPython.core.inputtransformer2 import TransformerManager   # %magics and !commands as Python
    try:
        return ast.parse(TransformerManager().transform_cell("".join(cell.get("source", ""))))
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None


def _exercise_of(call: ast.Call, lesson: str, exercises) -> int | None:
    """The index of the exercise whose check ``call`` calls, in a notebook of ``lesson``:
    ``<...>.exK.check(...)`` or ``<...>.<slug>.check(...)``, with no other lesson in the chain."""
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == "check"):
        return None
    chain, node = [], f.value
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if not chain or any(c.startswith("lesson") and c != f"lesson{lesson}" for c in chain):
        return None
    for i, ex in enumerate(exercises):
        if chain[0] in (f"ex{i + 1}", ex.slug):
            return i
    return None


def check_calls(nb: dict, lesson: str) -> dict[int, tuple[int, CallSite]]:
    """{exercise index: (cell index, its call)} for the last cell of ``nb`` that checks each exercise."""
    from lessonkit.exercises import REGISTRY
    found = {}
    for c, cell in enumerate(nb.get("cells", [])):
        tree = _code(cell) if isinstance(cell, dict) and cell.get("cell_type") == "code" else None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Call) and (i := _exercise_of(node, lesson, REGISTRY[lesson])) is not None:
                plain = all(isinstance(a, ast.Name) for a in [*node.args, *(k.value for k in node.keywords)])
                found[i] = (c, CallSite(i, tuple(a.id for a in node.args) if plain else (),
                                        tuple((k.arg, k.value.id) for k in node.keywords) if plain else (),
                                        ast.unparse(node)))
    return found


def lesson_calls(shipped: Path, lesson: str) -> dict[int, CallSite]:
    """Each exercise's check call in the shipped lesson; an error for an author if one is missing or
    passes something other than names (the graded copy reads those variables)."""
    from lessonkit.exercises import REGISTRY
    calls = {i: site for i, (unused, site) in check_calls(json.loads(shipped.read_text("utf-8")), lesson).items()}
    for i, ex in enumerate(REGISTRY[lesson]):
        if i not in calls or not calls[i].names:
            raise ValueError(f"{shipped}: no cell runs {ex.marker}'s check with variables, as "
                             f"'exercises.lesson{lesson}.ex{i + 1}.check(answer)': the grader reads them")
    return calls


# ----------------------------------------------------------------------------- otter's test files

TEST_FILE = '''"""{marker}: lesson {lesson}, exercise {number}. Generated by workbench/grade_notebook.py from
lessonkit.exercises.REGISTRY and the lesson's cell that runs {text} (written anew at each run)."""
from otter.test_files import test_case

from lessonkit.exercises import REGISTRY

OK_FORMAT = False
name = {marker!r}
points = {points!r}


@test_case(points={points!r}, hidden=False)
def {marker}(env, {params}):
    env["__verdict__"] = verdict = REGISTRY[{lesson!r}][{index}].check({call_args})
    assert verdict, str(verdict)
'''


def write_tests(folder: Path, lesson: str, calls: dict[int, CallSite], points: float = 1) -> dict[str, Path]:
    """One otter test file (exception-based, OK_FORMAT = False) per exercise of ``lesson``, in
    ``folder``: {marker: path}."""
    from lessonkit.exercises import REGISTRY
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for i, ex in enumerate(REGISTRY[lesson]):
        site = calls[i]
        call_args = ", ".join([*site.args, *(f"{k}={v}" for k, v in site.kwargs)])
        path = folder / f"{ex.marker}.py"
        path.write_text(TEST_FILE.format(marker=ex.marker, lesson=lesson, number=i + 1, index=i, points=points,
                                         params=", ".join(site.names), call_args=call_args, text=site.text),
                        encoding="utf-8")
        paths[ex.marker] = path
    return paths


# ----------------------------------------------------------------------------- the graded copy

def capture_cell(marker: str, names: list[str], answers: str) -> dict:
    import nbformat
    cell = nbformat.v4.new_code_cell(
        f'__import__("workbench.grade_capture", fromlist=["capture"]).capture({marker!r}, {names!r}, globals(), '
        f'{answers!r})')
    cell.metadata[CAPTURE_TAG] = marker
    return cell


def graded_copy(nb, lesson: str, calls: dict[int, CallSite], answers: str) -> tuple[object, dict, dict]:
    """The notebook with a capture cell after each exercise's (last) answer cell, outputs cleared;
    {marker: the lesson's check call} of each exercise whose answer cell is not there; {marker: the
    number of its answer cell} of the others."""
    from lessonkit.exercises import REGISTRY
    found = check_calls(nb, lesson)
    absent, after, where = {}, {}, {}
    for i, ex in enumerate(REGISTRY[lesson]):
        if i in found:
            after.setdefault(found[i][0], []).append(capture_cell(ex.marker, calls[i].names, answers))
            where[ex.marker] = found[i][0] + 1
        else:
            absent[ex.marker] = calls[i].text
    cells = []
    for c, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.metadata["lessonkit-grade-cell"] = c + 1   # the cell's number in the student's notebook
        cells += [cell, *after.get(c, [])]
    nb.cells = cells
    return nb, absent, where


# ----------------------------------------------------------------------------- the sandbox

@dataclass
class Sandbox:
    """How a phase runs: "bwrap" (confined) or "none", and the folders it sees, by their inside names."""
    mode: str
    cache: Path
    tests: Path
    binds: list[str] = field(default_factory=list)

    def inside(self, job: Path) -> dict[str, str]:
        if self.mode == "bwrap":
            return {"workbook": "/workbook", "job": "/job", "cache": "/cache", "tests": "/tests", "out": "/out"}
        return {"workbook": str(job / "workbook"), "job": str(job / "run"), "cache": str(self.cache),
                "tests": str(self.tests), "out": str(job / "check")}

    def argv(self, job: Path, phase: str, command: list[str]) -> list[str]:
        if self.mode != "bwrap":
            return command
        run = "--bind" if phase == "execute" else "--ro-bind"
        argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--ro-bind", "/usr", "/usr"]
        for top in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
            p = Path("/", top)
            if p.is_symlink():
                argv += ["--symlink", os.readlink(p), str(p)]
            elif p.is_dir():
                argv += ["--ro-bind", str(p), str(p)]
        argv += [a for e in ETC if Path("/etc", e).exists() for a in ("--ro-bind", f"/etc/{e}", f"/etc/{e}")]
        for prefix in {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.prefix)}:
            if not str(prefix).startswith("/usr/"):
                argv += ["--ro-bind", str(prefix), str(prefix)]
        for entry in workbook_entries(self.binds_resolved()):
            argv += ["--ro-bind", str(entry), f"/workbook/{entry.name}"]
        argv += [run, str(job / "workbook" / "my-work"), "/workbook/my-work", run, str(job / "run"), "/job",
                 "--ro-bind", str(self.cache), "/cache", "--ro-bind", str(self.tests), "/tests"]
        if phase == "check":
            argv += ["--bind", str(job / "check"), "/out"]
        return argv + ["--chdir", "/tmp", "--", *command]

    def binds_resolved(self) -> set[Path]:
        return {Path(b).resolve() for b in self.binds}   # the students' and the output folders: never shown

    def prepare(self, job: Path) -> None:
        """The job's folders; without bwrap, a copy of the teacher's code whose my-work/ is the student's."""
        for d in ("workbook/my-work", "run/answers", "run/home", "run/build", "check/home", "check/build"):
            (job / d).mkdir(parents=True, exist_ok=True)
        if self.mode == "bwrap":
            return
        for entry in workbook_entries(self.binds_resolved()):
            if entry.name in ("lessonkit", "workbench", "native"):   # copies: lessonkit finds my-work beside them
                shutil.copytree(entry, job / "workbook" / entry.name,
                                ignore=shutil.ignore_patterns("__pycache__", ".build"))
            else:
                (job / "workbook" / entry.name).symlink_to(entry)


def workbook_entries(hidden: set[Path]) -> list[Path]:
    """What a notebook sees of the teacher's checkout: its top-level files and folders that git tracks
    (never a folder of hand-ins or grades put beside them), less ``hidden``; without git, every entry
    but the skipped ones."""
    try:
        names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", "HEAD"], capture_output=True,
                               text=True, timeout=60, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        names = [p.name for p in ROOT.iterdir()]
    entries = [ROOT / n for n in names if n and n not in TOP_LEVEL_SKIPPED and not n.startswith(".")]
    return sorted(e for e in entries if e.exists() and e.resolve() not in hidden)


def available_sandbox() -> str | None:
    """"bwrap" if bubblewrap runs here (it needs user namespaces, or root), else None."""
    exe = shutil.which("bwrap")
    if exe is None:
        return None
    probe = subprocess.run([exe, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr", "--symlink",
                            "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                            "--", "/usr/bin/true"], capture_output=True, timeout=60)
    return "bwrap" if probe.returncode == 0 else None


def run_phase(argv: list[str], env: dict, timeout: float, log: Path) -> tuple[int | None, str]:
    """Run a phase in a session of its own; kill the whole session after ``timeout`` s. Its return code
    (None: killed on time), and the end of what it printed."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)   # whatever the phase left behind in its session
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    with open(log, "rb") as f:
        f.seek(max(0, log.stat().st_size - 4000))
        return code, f.read().decode("utf-8", "replace")


def phase_env(inside: dict[str, str], language: str, phase: str) -> dict[str, str]:
    """The environment of a phase: only what names the compiler and the build is passed on; its home
    and builds in the one folder it may write."""
    env = {k: v for k, v in os.environ.items() if k in PASSED_ON}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    job = inside["job"] if phase == "execute" else inside["out"]
    return {**env, "HOME": f"{job}/home", "MPLCONFIGDIR": f"{job}/home/.matplotlib", "MPLBACKEND": "Agg",
            "LESSONKIT_PREBUILT_DIR": inside["cache"], "LESSONKIT_BUILD_DIR": f"{job}/build",
            "LESSONKIT_GRADED": "1", "LESSONKIT_LANG": language, "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": inside["workbook"],   # the kernel's (the phases themselves run with -I)
            "TMPDIR": "/tmp" if inside["workbook"] == "/workbook" else f"{job}/home"}


def bootstrap(workbook: str, *args: str) -> list[str]:
    """This module's main in a Python that imports the teacher's code only (-I: no PYTHONPATH, no
    user site, not the current folder)."""
    return [sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
            "from workbench.grade_notebook import main; sys.exit(main(sys.argv[2:]))", workbook, *args]


# ----------------------------------------------------------------------------- the phases (inside)

def execute(notebook: Path, progress: Path, cell_timeout: float, total_timeout: float) -> None:
    """Run the graded copy cell by cell in one kernel; log each cell's end, and how the run ended."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(nb, timeout=int(cell_timeout), kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(notebook.parent)}})
    start, end = time.monotonic(), {"end": "done"}
    with open(progress, "a", encoding="utf-8") as log:
        def say(record):
            log.write(json.dumps(record) + "\n")
            log.flush()

        with client.setup_kernel(cwd=str(notebook.parent), env={**os.environ}):
            for i, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                # the cell as the student finds it: its number, and its first line
                number = cell.metadata.get("lessonkit-grade-cell")
                first = next((ln.strip() for ln in cell.source.splitlines() if ln.strip()), "")[:60]
                left = total_timeout - (time.monotonic() - start)
                if left < 1:
                    end = {"end": "notebook timeout", "cell": number, "line": first, "seconds": total_timeout}
                    break
                client.timeout = int(max(1, min(cell_timeout, left)))
                try:
                    client.execute_cell(cell, i)
                except CellTimeoutError:
                    end = {"end": "cell timeout" if client.timeout == int(cell_timeout) else "notebook timeout",
                           "cell": number, "line": first, "seconds": cell_timeout if client.timeout == int(cell_timeout)
                           else total_timeout}
                    break
                except DeadKernelError:
                    process = getattr(client.km.provisioner, "process", None)
                    code = process.poll() if process is not None else None
                    end = {"end": "died", "cell": number, "line": first, "code": code}
                    break
                errors = [o for o in cell.outputs if o.get("output_type") == "error"]
                if errors and CAPTURE_TAG not in cell.metadata:
                    say({"cell": number, "line": first,
                         "error": f"{errors[0].get('ename')}: {errors[0].get('evalue')}"[:300]})
        say(end)


def check(plan: dict, tests: Path, answers: Path, out: Path) -> None:
    """Run the otter test of each exercise on the student's captured answer; write the verdicts."""
    from lessonkit import set_language
    from lessonkit.exercises import CORRECT
    from otter.test_files import GradingResults, create_test_file

    from workbench import grade_capture

    set_language(plan["language"])
    results, files = {}, []
    for marker in plan["markers"]:
        path = answers / f"{marker}.json"
        if not path.is_file() or path.is_symlink():
            continue
        try:
            captured = grade_capture.load(path)
        except (OSError, ValueError, UnicodeDecodeError) as e:
            results[marker] = {"missing": [], "error": str(e)[:300]}
            continue
        if captured["missing"]:
            results[marker] = {"missing": captured["missing"]}
            continue
        test = create_test_file(str(tests / plan["tests"][marker]), None)
        env = dict(captured["values"])
        test.run(env)
        files.append(test)
        verdict = env.get("__verdict__")
        if verdict is None:   # the check itself failed (not the answer): lessonkit's error, for the teacher
            message = test.test_case_results[0].message.strip().splitlines()
            results[marker] = {"missing": [], "error": message[-1][:300] if message else "no verdict"}
            continue
        results[marker] = {"points": test.score, "possible": test.possible, "status": verdict.status,
                           "verdict": str(verdict), "passed": test.passed_all and verdict.status == CORRECT}
    total = GradingResults(files) if files else None
    (out / "results.json").write_text(json.dumps({"exercises": results, "total": total.total if total else 0}),
                                      encoding="utf-8")


def warm(lessons: list[str]) -> dict:
    """Compute every exercise's right answer of ``lessons`` once, so that the builds the checks need
    (the broken kernels of lesson 06, the traced build) are in the cache; {marker: encoded answer}."""
    from lessonkit.exercises import REGISTRY

    from workbench import grade_capture
    answers = {}
    for lesson in lessons:
        for ex in REGISTRY[lesson]:
            answers[ex.marker] = grade_capture.encode(ex.answer())
    return answers


# What one process of a student's notebook may take (the kernel, the compiler, whatever it starts):
# memory (address space), the size of one file it writes, and no core file when it crashes
LIMITS = {"RLIMIT_AS": 6 << 30, "RLIMIT_FSIZE": 1 << 30, "RLIMIT_CORE": 0}


def limit_resources() -> None:
    import resource
    for name, most in LIMITS.items():
        soft, hard = resource.getrlimit(getattr(resource, name))
        most = most if hard == resource.RLIM_INFINITY else min(most, hard)
        try:
            resource.setrlimit(getattr(resource, name), (most, most))
        except (ValueError, OSError):   # a system that refuses one (macOS and RLIMIT_AS): the others hold
            pass


def main(argv: list[str]) -> int:
    phase, rest = argv[0], argv[1:]
    if phase == "execute":
        limit_resources()   # before the kernel starts: it and what it runs inherit them
        notebook, progress, cell_timeout, total_timeout = rest
        execute(Path(notebook), Path(progress), float(cell_timeout), float(total_timeout))
    elif phase == "check":
        tests, answers, out = map(Path, rest)
        check(json.loads((out / "plan.json").read_text("utf-8")), tests, answers, out)
    elif phase == "warm":
        os.environ.pop("LESSONKIT_GRADED", None)
        print(json.dumps(warm(rest)))
    else:
        raise SystemExit(f"no phase {phase!r}: execute, check or warm")
    return 0
