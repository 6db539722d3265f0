"""Working copies (lessonkit/lessons/workspace.py, make lab / update / reset): a student who runs a lesson,
saves it and edits the kernel copy leaves git clean, so `git pull` never meets their work; making
copies never overwrites one; a reset keeps the old copy.

Each test works in a fresh `git clone` of this checkout's HEAD (what is committed, not the files
being edited), with that clone's lessonkit imported in child processes: the folders it writes are
the clone's, and a file it should not write shows up in the clone's `git status`."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from childproc import assert_clean, run_python

REPO = Path(__file__).resolve().parent.parent
JUPYTER = Path(sys.executable).with_name("jupyter")
GIT_ID = ["-c", "user.name=workbook test", "-c", "user.email=test@example.invalid"]

pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(),
                                reason="needs git and a git checkout of the workbook")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *GIT_ID, *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def clone(tmp_path) -> Path:
    """A clone of this checkout's HEAD (detached: CI checks out a commit, not a branch)."""
    head = git(REPO, "rev-parse", "HEAD").strip()
    dest = tmp_path / "workbook"
    git(tmp_path, "clone", "--quiet", "--no-checkout", str(REPO), str(dest))
    git(dest, "checkout", "--quiet", "--detach", head)
    return dest


def in_clone(clone: Path, code: str, timeout: float = 300) -> str:
    """Run code with the clone's lessonkit; builds go where they go by default (no
    LESSONKIT_BUILD_DIR), so the test sees whether that place is ignored; no saved results."""
    env = {"PYTHONPATH": os.pathsep.join([str(clone), str(REPO / "tests")]),
           "LESSONKIT_BUILD_DIR": "", "LESSONKIT_SAVE_RESULTS": ""}
    first = (f"import lessonkit, workbench\nassert lessonkit.__file__.startswith({str(clone)!r})\n"
             f"assert workbench.__file__.startswith({str(clone)!r})\n")
    return assert_clean(run_python(first + textwrap.dedent(code), timeout=timeout, env=env, cwd=clone))


def copies(clone: Path) -> str:
    return in_clone(clone, "from workbench import workspace\nworkspace.main(['copies'])")


def porcelain(clone: Path, *extra: str) -> str:
    return git(clone, "status", "--porcelain", *extra)


@pytest.mark.slow
@pytest.mark.skipif(not JUPYTER.exists(), reason="needs jupyter (nbconvert) beside this Python")
def test_run_a_lesson_and_edit_the_kernel_copy_git_stays_clean(clone):
    """About 10 s here: a lesson runs in Jupyter and the edited copy of the kernel is built."""
    out = copies(clone)
    work = clone / "my-work"
    shipped = sorted((clone / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert shipped and all((work / p.name).read_bytes() == p.read_bytes() for p in shipped)
    assert all(f"my-work/{p.name}" in out for p in shipped)

    # Lesson 00 (about 7 s here; the fastest) executed and saved in place, from the working copy's
    # folder, as a student's JupyterLab does it. nbconvert fails on a cell that raises.
    lesson = work / "00_start_here.ipynb"
    env = {**os.environ, "PYTHONPATH": str(clone), "LESSONKIT_BUILD_DIR": "", "LESSONKIT_SAVE_RESULTS": ""}
    proc = subprocess.run([str(JUPYTER), "nbconvert", "--to", "notebook", "--execute", "--inplace",
                           "--ExecutePreprocessor.timeout=600", lesson.name], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = json.loads(lesson.read_text())
    counts = [c.get("execution_count") for c in ran["cells"] if c["cell_type"] == "code"]
    assert counts and all(isinstance(n, int) for n in counts), "the copy was not executed and saved"
    assert lesson.read_bytes() != (clone / "notebooks" / lesson.name).read_bytes()

    # The kernel copy: edited, built, checked and loaded from my-work/native/, beside the shipped one
    built = in_clone(clone, """
        from pathlib import Path
        from lessonkit import native, workspace
        src = workspace.student_native()
        kernel = src / "flash_attn_q8_neon.c"
        kernel.write_text(kernel.read_text() + "\\n/* a student's note: the bytes changed, the code did not */\\n")
        ffi, lib = native.load(src_dir=src)
        print(native.build(src_dir=src))
        print(native.build())
        print(ffi.string(lib.fa_backend()).decode())
    """).split()
    student_lib, shipped_lib = map(Path, built[-3:-1])
    assert student_lib.is_relative_to(work / ".build")
    assert shipped_lib.is_relative_to(clone / ".build")
    assert student_lib.name != shipped_lib.name  # the edit was compiled: another hash, another file
    assert "student's note" in (work / "native" / "flash_attn_q8_neon.c").read_text()

    assert porcelain(clone) == "", "running a lesson or building the kernel copy left files that git sees"
    # ... and not because nothing was written: the work is there, ignored
    ignored = porcelain(clone, "--ignored")
    assert "!! my-work/" in ignored and "!! .build/" in ignored


def test_copies_never_overwrite_and_reset_keeps_the_old_copy(clone):
    work = clone / "my-work"
    copies(clone)
    mine = work / "01_quantize_q.ipynb"
    mine.write_text(mine.read_text().replace("# 01", "# 01 (my notes)", 1))
    assert "(my notes)" in mine.read_text()
    (work / "02_online_softmax.ipynb").unlink()

    # An update brings a new lesson and changes lesson 01
    shutil.copyfile(clone / "notebooks" / "00_start_here.ipynb", clone / "notebooks" / "09_added.ipynb")
    shipped01 = clone / "notebooks" / "01_quantize_q.ipynb"
    nb = json.loads(shipped01.read_text())
    nb["cells"][0]["source"] = ["# 01 · updated\n"] + nb["cells"][0]["source"][1:]
    shipped01.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    git(clone, "add", "notebooks")
    git(clone, "commit", "--quiet", "-m", "an update")

    out = copies(clone)
    assert "(my notes)" in mine.read_text(), "an existing working copy was overwritten"
    assert (work / "09_added.ipynb").read_bytes() == (clone / "notebooks" / "09_added.ipynb").read_bytes()
    assert (work / "02_online_softmax.ipynb").is_file()  # a copy the student deleted comes back
    assert "notebooks/01_quantize_q.ipynb changed since your copy was made" in out
    assert "00_start_here.ipynb changed" not in out

    # make reset LESSON=01, twice: the shipped lesson again, each old copy kept under its own number
    if shutil.which("make"):
        reset = lambda: subprocess.run(["make", "-s", "reset", "LESSON=01", f"PY={sys.executable}"], cwd=clone,
                                       env={**os.environ, "PYTHONPATH": str(clone)}, check=True,
                                       capture_output=True, text=True).stdout
    else:  # what the target runs
        reset = lambda: in_clone(clone, "from workbench import workspace\nworkspace.main(['reset', '01'])")
    first = reset()
    old1 = work / "old" / "01_quantize_q.1.ipynb"
    assert "my-work/old/01_quantize_q.1.ipynb" in first
    assert "(my notes)" in old1.read_text()
    assert mine.read_bytes() == shipped01.read_bytes()
    reset()
    assert "(my notes)" in old1.read_text() and (work / "old" / "01_quantize_q.2.ipynb").is_file()
    assert "changed since" not in copies(clone)  # the fresh copy is of the current lesson

    # The kernel copy: an update of native/ is announced, never copied over it; reset only when
    # asked, and the edited copy is kept
    in_clone(clone, "from lessonkit import workspace\nworkspace.student_native()")
    assert "native/ changed" not in copies(clone)
    quant_c = clone / "native" / "kvq8_quant.c"
    quant_c.write_text("/* an update */\n" + quant_c.read_text())
    git(clone, "commit", "--quiet", "-am", "an update of native/")
    assert "native/ changed since my-work/native was made" in copies(clone)
    assert not (work / "native" / "kvq8_quant.c").read_text().startswith("/* an update */")
    out = in_clone(clone, """
        from lessonkit import workspace
        src = workspace.student_native()
        (src / "q8_simd.h").write_text("/* edited */\\n" + (src / "q8_simd.h").read_text())
        assert workspace.student_native() == src and (src / "q8_simd.h").read_text().startswith("/* edited */")
        try:
            workspace.reset_native()
        except ValueError as e:
            print("refused:", e)
        new, old = workspace.reset_native(confirm=True)
        print(new.relative_to(workspace.REPO_DIR), old.relative_to(workspace.REPO_DIR))
    """)
    assert "refused: " in out and out.split()[-2:] == ["my-work/native", "my-work/old/native.1"]
    assert (work / "old" / "native.1" / "q8_simd.h").read_text().startswith("/* edited */")
    assert (work / "native" / "q8_simd.h").read_bytes() == (clone / "native" / "q8_simd.h").read_bytes()
    assert porcelain(clone) == ""


def test_the_chinese_lessons_and_the_glossary_get_copies_too(clone):
    """make lab copies notebooks/zh/ into my-work/zh/ (make lab-zh opens the Chinese lesson 00 there)
    and the glossary both editions link, so that the copies' relative links work; LESSON=zh/04
    resets a Chinese lesson and keeps the old copy, named apart from the English one."""
    work = clone / "my-work"
    out = copies(clone)
    shipped = sorted((clone / "notebooks" / "zh").glob("[0-9][0-9]*_*.ipynb"))
    assert shipped and all((work / "zh" / p.name).read_bytes() == p.read_bytes() for p in shipped)
    assert (work / "glossary.md").read_bytes() == (clone / "notebooks" / "glossary.md").read_bytes()
    assert "my-work/zh/00_start_here.ipynb" in out
    mine = work / "zh" / "04_kernel_walkthrough.ipynb"
    mine.write_text(mine.read_text().replace("\"# 04", "\"# 04 (我的笔记)", 1))
    assert "(我的笔记)" in mine.read_text()
    reset = in_clone(clone, "from workbench import workspace\nworkspace.main(['reset', 'zh/04'])")
    assert "my-work/old/zh-04_kernel_walkthrough.1.ipynb" in reset
    assert "(我的笔记)" in (work / "old" / "zh-04_kernel_walkthrough.1.ipynb").read_text()
    assert mine.read_bytes() == (clone / "notebooks" / "zh" / mine.name).read_bytes()
    assert porcelain(clone) == ""


def test_reset_names_a_lesson_that_exists(clone):
    out = run_python("""
        from workbench import workspace
        for bad in ("99", "kernel", "", "../native"):
            try:
                workspace.find_lesson(bad)
            except ValueError as e:
                print("refused", repr(bad))
        print(workspace.find_lesson(4).name, workspace.find_lesson("04_kernel_walkthrough.ipynb").name)
    """, env={"PYTHONPATH": os.pathsep.join([str(clone), str(REPO / "tests")])}, cwd=clone)
    lines = assert_clean(out).splitlines()
    assert lines[:4] == ["refused '99'", "refused 'kernel'", "refused ''", "refused '../native'"]
    assert lines[4] == "04_kernel_walkthrough.ipynb 04_kernel_walkthrough.ipynb"


@pytest.mark.skipif(shutil.which("make") is None, reason="tests the Makefile's reset target")
def test_make_reset_takes_lesson_as_typed_and_refuses_what_is_no_lesson(clone):
    """LESSON reaches the reset as one value, whatever quotes, $, ; or leading - it holds: not as
    argparse's -h (help, and nothing reset, with status 0), not as shell syntax, not run."""
    copies(clone)
    for value in ("-h", "--help", '0"4', "0'4", "a$b", "0 4", "01; touch pwned", "`touch pwned`", "$(touch pwned)",
                  "$(shell touch pwned)", "$(error boom)", "$(LESSON)"):  # the last three: make's own syntax
        proc = subprocess.run(["make", "-s", "reset", f"LESSON={value}", f"PY={sys.executable}"], cwd=clone,
                              env={**os.environ, "PYTHONPATH": str(clone)}, capture_output=True, text=True)
        assert proc.returncode != 0, (value, proc.stdout)
        assert proc.stderr.strip().startswith(f"no single lesson {value!r};"), (value, proc.stderr)
    assert not (clone / "my-work" / "old").exists() and not (clone / "pwned").exists()
    assert porcelain(clone) == ""


def test_a_changed_glossary_is_reset_never_deleted(clone):
    """The glossary copy holds the student's notes: when notebooks/glossary.md changes, the advice is
    make reset LESSON=glossary, which keeps the old copy in my-work/old/ (no advice to delete it)."""
    work = clone / "my-work"
    copies(clone)
    mine, shipped = work / "glossary.md", clone / "notebooks" / "glossary.md"
    mine.write_text(mine.read_text() + "\nmy note: the scale is per 32 values\n")
    shipped.write_text(shipped.read_text() + "\nan added term\n")
    git(clone, "commit", "--quiet", "-am", "an update of the glossary")
    out = copies(clone)
    assert ("notebooks/glossary.md changed since your copy was made; `make reset LESSON=glossary` gives you "
            "the new one (yours is kept in my-work/old/)") in out
    assert "delete" not in out and "my note" in mine.read_text()
    reset = in_clone(clone, "from workbench import workspace\nworkspace.main(['reset', 'glossary'])")
    assert "my-work/old/glossary.1.md: your previous copy" in reset
    assert "my note" in (work / "old" / "glossary.1.md").read_text()
    assert mine.read_bytes() == shipped.read_bytes()
    assert "glossary" not in copies(clone)  # the fresh copy is of the current glossary


@pytest.mark.parametrize("damage", ["not JSON", "not an object", "a wrong value", "a folder"])
def test_a_damaged_record_is_reported_kept_and_replaces_no_copy(clone, damage):
    """my-work/.copied.json says which version of each lesson a copy was made from. Damaged, it is said so
    in one line, kept in my-work/old/ and written again clean; no copy is replaced on its strength, and a
    copy whose entry is lost is named as possibly changed (a copy that is its lesson as shipped now is not)."""
    work, nb = clone / "my-work", clone / "notebooks"
    copies(clone)
    record = work / ".copied.json"
    mine = work / "01_quantize_q.ipynb"
    mine.write_text(mine.read_text().replace("# 01", "# 01 (my notes)", 1))
    untouched = (work / "02_online_softmax.ipynb").read_bytes()
    for name in ("01_quantize_q.ipynb", "02_online_softmax.ipynb"):
        (nb / name).write_text((nb / name).read_text().replace('"cells": [', '"cells": [ ', 1))
    git(clone, "commit", "--quiet", "-am", "an update of lessons 01 and 02")
    entries = json.loads(record.read_text())
    damaged = {"not JSON": record.read_bytes()[:40], "not an object": b"[]\n",
               "a wrong value": json.dumps({**entries, "02_online_softmax.ipynb": 5}).encode()}.get(damage)
    if damaged is None:
        record.unlink()
        record.mkdir()
    else:
        record.write_bytes(damaged)

    out = copies(clone)
    lines = out.splitlines()
    assert lines[0] == ("my-work/.copied.json, the record of which version of each lesson your copies were made "
                        "from, was unreadable or damaged: it is kept as my-work/old/copied.1.json, and a clean one "
                        "was written from what was sound in it; a copy it no longer vouches for is never replaced, "
                        "and is listed as possibly changed")
    kept = work / "old" / "copied.1.json"
    assert kept.is_dir() if damaged is None else kept.read_bytes() == damaged
    assert (work / "02_online_softmax.ipynb").read_bytes() == untouched, "a copy was replaced on a damaged record"
    assert "(my notes)" in mine.read_text()
    lost = ["02"] if damage == "a wrong value" else ["01", "02"]
    for n in lost:
        assert any(line.startswith("no record says which version of notebooks/" + n) and
                   f"`make reset LESSON={n}` gives you the new one" in line for line in lines), (n, out)
    if damage == "a wrong value":  # its sound entries were kept
        assert "notebooks/01_quantize_q.ipynb changed since your copy was made" in out
    assert "00_start_here" not in out  # its copy is the lesson as shipped now: not in doubt
    clean = json.loads(record.read_text())
    assert isinstance(clean, dict) and all(isinstance(v, str) and len(v) == 64 for v in clean.values())
    assert "00_start_here.ipynb" in clean and "02_online_softmax.ipynb" not in clean

    again = copies(clone)  # the next run reads a clean record, and still names the copies in doubt
    assert "damaged" not in again and not (work / "old" / "copied.2.json").exists()
    assert "no record says which version of notebooks/02_online_softmax.ipynb" in again
    assert porcelain(clone) == ""


FULL_DISK = """
    import errno, os, shutil
    from lessonkit import workspace
    from workbench import workspace as tool
    real = shutil.copyfile
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    for what in (workspace.student_native, tool.make_copies):
        shutil.copyfile = full
        try:
            what()
        except OSError as e:
            print(type(e).__name__, e.errno == errno.ENOSPC, e, sep=" | ")
        shutil.copyfile = real
    print(sorted(p.name for p in workspace.WORK_DIR.rglob("*")))
    print(workspace.student_native().relative_to(workspace.REPO_DIR))
"""


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_full_disk_says_so_in_one_line_and_leaves_no_partial_copy(clone, lang):
    """shutil.copyfile raising ENOSPC (a full disk): the kernel copy and the lesson copies fail with an
    OSError that says, in the student's language, what failed, about how much room it needs and what to
    do, and nothing half copied stays in my-work/; with room again, the copy is made."""
    out = assert_clean(run_python(FULL_DISK, cwd=clone, env={"PYTHONPATH": str(clone), "LESSONKIT_LANG": lang}))
    native, lessons, left, made = out.splitlines()
    if lang == "en":
        assert re.fullmatch(r"DiskFullError \| True \| copying native/ to my-work/native/ failed: the disk is full\. "
                            r"It needs about 0\.\d MB free; free some space, then run it again", native), native
        assert re.fullmatch(r"DiskFullError \| True \| copying the lessons to my-work/ failed: the disk is full\. "
                            r"It needs about \d+\.\d MB free; free some space, then run it again", lessons), lessons
    else:
        assert native.startswith("DiskFullError | True | 把 native/ 复制到 my-work/native/失败：磁盘已满。"), native
        assert lessons.startswith("DiskFullError | True | 把课程复制到 my-work/失败：磁盘已满。"), lessons
    assert left == "[]", "a failed copy left files in my-work/"
    assert made == "my-work/native"


def test_stale_temporaries_of_stopped_runs_are_cleared_and_young_ones_kept(clone):
    """A run that stopped mid-copy leaves a hidden .native-* folder or a .<name>.*.tmp file. The next
    make_copies or student_native removes those untouched for STALE_S (10 minutes); a younger one may be
    a concurrent run's and stays, and so does a file of the student's that merely looks alike."""
    work = clone / "my-work"
    copies(clone)
    stale = [work / ".native-k2j4h5g6", work / ".01_quantize_q.ipynb.abcd_123.tmp", work / "..copied.json.q_8r7t6y.tmp",
             work / ".copied.json.4242.tmp",
             work / "zh" / ".00_start_here.ipynb.x9y8z7w6.tmp"]
    young = [work / ".native-q1w2e3r4", work / ".01_quantize_q.ipynb.fresh_12.tmp"]
    students = [work / ".notes.tmp", work / ".native-notes", work / "old" / ".01_quantize_q.ipynb.abcd_123.tmp"]
    hour_ago = time.time() - 3600

    def make(paths, mtime=None):
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.name.startswith(".native-") and p not in students:
                (p / "native").mkdir(parents=True)
                (p / "native" / "flash_attn_q8.h").write_text("/* half a copy */")
            else:
                p.write_text("half a copy")
            if mtime:
                os.utime(p, (mtime, mtime))

    make(stale, hour_ago)
    make(young)
    make(students, hour_ago)
    copies(clone)
    assert [p for p in stale if p.exists()] == []
    assert all(p.exists() for p in young + students)
    make(stale[:2], hour_ago)
    in_clone(clone, "from lessonkit import workspace\nworkspace.student_native()")
    assert [p for p in stale if p.exists()] == [] and all(p.exists() for p in young + students)


def test_make_update_refuses_an_update_that_brings_files_into_my_work(clone, tmp_path, monkeypatch):
    """git treats an ignored file as expendable: an upstream commit that tracks my-work/01_... would replace
    the student's edited copy on git pull. make update fetches, refuses such an update in one line and
    changes nothing; once the upstream no longer brings files there, it fast-forwards as before."""
    for name in [k for k in os.environ if k.startswith("GIT_")]:
        monkeypatch.delenv(name)  # a hook's GIT_DIR or GIT_WORK_TREE would point every git below elsewhere
    git(clone, "checkout", "--quiet", "-B", "main")
    upstream, publisher, student = tmp_path / "upstream.git", tmp_path / "publisher", tmp_path / "student"
    git(tmp_path, "clone", "--quiet", "--bare", str(clone), str(upstream))
    for dest in (publisher, student):
        git(tmp_path, "clone", "--quiet", str(upstream), str(dest))
    copies(student)
    mine = student / "my-work" / "01_quantize_q.ipynb"
    mine.write_text(mine.read_text().replace("# 01", "# 01 (my notes)", 1))
    stamp = tmp_path / "installed-stamp"  # make update's setup: done, after the clone's pyproject.toml
    stamp.touch()

    def publish(*paths: str) -> str:
        git(publisher, "add", "--force", "--", *paths)
        git(publisher, "commit", "--quiet", "-m", "an update")
        git(publisher, "push", "--quiet", "origin", "main")
        return git(publisher, "rev-parse", "HEAD").strip()

    def update() -> subprocess.CompletedProcess:
        if shutil.which("make"):
            return subprocess.run(["make", "-s", "update", f"PY={sys.executable}", f"STAMP={stamp}"], cwd=student,
                                  env={**os.environ, "PYTHONPATH": str(student)}, capture_output=True, text=True)
        return run_python("import sys\nfrom workbench import workspace\nsys.exit(workspace.main(['update']))",
                          cwd=student, env={"PYTHONPATH": str(student)})

    (publisher / "my-work").mkdir()
    shutil.copyfile(publisher / "notebooks" / mine.name, publisher / "my-work" / mine.name)
    publish("my-work")
    before = git(student, "rev-parse", "HEAD")
    proc = update()
    assert proc.returncode != 0
    assert (
        "make update stopped, and left your files as they were: the update brings files into my-work/, where git "
        "would overwrite your copies without asking (my-work/01_quantize_q.ipynb); tell whoever publishes the "
        "workbook that my-work/ must stay out of git") in proc.stderr.splitlines(), proc.stderr
    assert "(my notes)" in mine.read_text() and git(student, "rev-parse", "HEAD") == before

    # The upstream takes the file out again and adds a lesson: nothing comes into my-work/ from git
    git(publisher, "rm", "--quiet", "--cached", "--", f"my-work/{mine.name}")
    shutil.copyfile(publisher / "notebooks" / "00_start_here.ipynb", publisher / "notebooks" / "10_added.ipynb")
    head = publish("notebooks/10_added.ipynb")
    proc = update()
    assert proc.returncode == 0, proc.stderr
    assert git(student, "rev-parse", "HEAD").strip() == head
    assert "(my notes)" in mine.read_text() and porcelain(student) == ""
    if shutil.which("make"):  # make update's second step
        assert "new working copy: my-work/10_added.ipynb" in proc.stdout


def test_an_interrupted_make_copies_keeps_the_record_of_the_copies_it_made(clone):
    """The record is written as each copy is made: a make copies stopped (Ctrl-C) after 11 copies has
    recorded those 11, so that the next run knows they are the shipped lessons, not possibly changed."""
    out = in_clone(clone, """
import json
from lessonkit import workspace as ws
from workbench import workspace
real, made = workspace._copy_new, []
def copy_then_stop(src, dest):
    if len(made) == 11:
        raise KeyboardInterrupt
    made.append(dest)
    return real(src, dest)
workspace._copy_new = copy_then_stop
try:
    workspace.make_copies()
except KeyboardInterrupt:
    pass
record = json.loads(ws.MANIFEST.read_text())
print("RECORDED", len(record), sorted(record) == sorted(ws.key_of(ws.LESSONS_DIR / d.relative_to(ws.WORK_DIR)) for d in made))
""")
    assert "RECORDED 11 True" in out


@pytest.mark.parametrize("kind", ["fifo", "device", "deep"])
def test_a_record_that_is_no_file_is_damaged_not_read(clone, kind):
    """A FIFO would block the read for ever, /dev/zero would never end it, JSON nested 100,000 deep
    overflows the parser: each is a damaged record (moved to my-work/old/, reported), in bounded time."""
    copies(clone)
    record = clone / "my-work" / ".copied.json"
    record.unlink()
    if kind == "fifo":
        os.mkfifo(record)
    elif kind == "device":
        record.symlink_to("/dev/zero")
    else:
        record.write_text("[" * 100_000)
    out = in_clone(clone, "from workbench import workspace\nworkspace.main(['copies'])", timeout=60)
    assert "was unreadable or damaged: it is kept as my-work/old/copied.1.json" in out
