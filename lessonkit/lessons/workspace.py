"""Your own copies of the lessons and of the kernel, in ``my-work/`` (git-ignored; introduced in lesson 00).
``notebooks/`` and ``native/`` are tracked by git: a lesson saved or a C file edited there would conflict with the next
``git pull``. So the student works on copies:

    my-work/00_start_here.ipynb ...   one copy per lesson (my-work/zh/: the Chinese ones), and the glossary
    my-work/native/                   the kernel's copy (student_native()); its builds go to my-work/.build/
    my-work/old/                      what a reset moved aside; a reset never deletes anything

``make lab``, ``make update`` and ``make reset`` make and replace the copies (``workbench/workspace.py``) and share
this module's record of which version each copy was made from. Standard library only, so that ``make reset`` works
even when the kernel does not build."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from ..core.files import write_atomic
from ..core.language import _

REPO_DIR = Path(__file__).resolve().parents[2]
LESSONS_DIR = REPO_DIR / "notebooks"
NATIVE_DIR = REPO_DIR / "native"
# At the depth of notebooks/, so that the lessons' relative links (../docs/references.md) work from the copies too
WORK_DIR = REPO_DIR / "my-work"
OLD_DIR = WORK_DIR / "old"
# sha256 of each shipped file when its copy was made: tells "the lesson changed in an update" from "you changed your
# copy" without ever reading or touching the copy
MANIFEST = WORK_DIR / ".copied.json"
LESSON_GLOB = "[0-9][0-9]*_*.ipynb"
EDITIONS = {"en": LESSONS_DIR, "zh": LESSONS_DIR / "zh"}  # the Chinese one made by workbench/edition.py
GLOSSARY = LESSONS_DIR / "glossary.md"
STALE_S = 600  # a hidden temporary untouched this long was left by a run that stopped (clear_stale)
MANIFEST_MAX_BYTES = 1 << 20  # the record holds a line per lesson: far larger is not a record


class DiskFullError(OSError):
    """A copy the disk (or the quota) had no room for; its message says what failed and the room it needs."""

    def __str__(self) -> str:
        return self.strerror


def lessons(edition: str | None = "en") -> list[Path]:
    """The shipped lessons of one edition ("en": notebooks/, "zh": notebooks/zh/), in order; None: both."""
    if edition is None:
        return [p for e in EDITIONS for p in lessons(e)]
    return sorted(EDITIONS[edition].glob(LESSON_GLOB))


def shipped() -> list[Path]:
    """Every file that gets a copy in my-work/: the lessons of both editions, and the glossary."""
    return lessons(None) + ([GLOSSARY] if GLOSSARY.exists() else [])


def key_of(lesson: Path) -> str:
    """A shipped file's path under notebooks/ ("zh/04_x.ipynb"): its name in the manifest, its copy's in my-work/."""
    return lesson.relative_to(LESSONS_DIR).as_posix()


def sha256_tree(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def read_manifest() -> tuple[dict, str | None]:
    """The record's sound entries (a sha256 each), and None, or a notice if the record was unreadable or damaged:
    then it is moved to my-work/old/ and written again with its sound entries, so that the next run reads a clean
    one; a copy whose entry is lost is never replaced on its strength (make_copies lists it as possibly changed)."""
    try:
        # a regular file of sane size only: a FIFO would block the read, /dev/zero would never end it
        if not MANIFEST.is_file() or MANIFEST.stat().st_size > MANIFEST_MAX_BYTES:
            raise ValueError(MANIFEST)
        data = json.loads(MANIFEST.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON, nested too deep
        if not MANIFEST.is_symlink() and not MANIFEST.exists():
            return {}, None  # nothing there: no copy made yet (is_file() is False for a missing file too)
        data = None
    sound = {k: v for k, v in data.items() if isinstance(v, str) and re.fullmatch("[0-9a-f]{64}", v)} \
        if isinstance(data, dict) else {}
    if isinstance(data, dict) and len(sound) == len(data):
        return sound, None
    try:
        kept = move_to_old(MANIFEST, "copied", ".json")
    except FileNotFoundError:  # another run moved it a moment ago, and writes the same sound entries
        return sound, None
    record(sound)  # (the damaged one is out of the way: record starts from nothing)
    return sound, _("{record}, the record of which version of each lesson your copies were made from, was "
                    "unreadable or damaged: it is kept as {kept}, and a clean one was written from what was sound "
                    "in it; a copy it no longer vouches for is never replaced, and is listed as possibly "
                    "changed").format(record=shown(MANIFEST), kept=shown(kept))


def record(updates: dict) -> None:
    write_atomic(MANIFEST, json.dumps({**read_manifest()[0], **updates}, indent=1, sort_keys=True) + "\n")


def move_to_old(path: Path, stem: str, suffix: str) -> Path:
    """Move ``path`` to ``my-work/old/<stem>.<n><suffix>`` with the first free n (1, 2, ...); an old
    copy is never overwritten. ``.ipynb`` stays last so that JupyterLab opens it as a notebook."""
    OLD_DIR.mkdir(parents=True, exist_ok=True)
    taken = [int(m.group(1)) for p in OLD_DIR.iterdir()
             if (m := re.fullmatch(re.escape(stem) + r"\.(\d+)" + re.escape(suffix), p.name))]
    n = max(taken, default=0)
    while True:
        n += 1
        dest = OLD_DIR / f"{stem}.{n}{suffix}"
        if dest.exists():
            continue
        if path.is_dir():
            os.rename(path, dest)  # the folder moves whole, as the student left it
            return dest
        try:
            os.link(path, dest)  # fails on an existing name
        except FileExistsError:
            continue
        except OSError:  # no hard links on this file system
            os.rename(path, dest)
            return dest
        path.unlink()
        return dest


def student_native() -> Path:
    """``my-work/native/``, your copy of ``native/`` to edit (lessons 04 and 06), made on first use and never
    overwritten after; ``lessonkit.native.load(src_dir=workspace.student_native())`` builds, checks and loads it."""
    dest = WORK_DIR / "native"
    if dest.is_dir() and any(dest.iterdir()):
        return dest
    with room_for(_("copying native/ to my-work/native/"), [NATIVE_DIR]):
        WORK_DIR.mkdir(exist_ok=True)
        clear_stale()
        tmp = Path(tempfile.mkdtemp(prefix=".native-", dir=WORK_DIR))
        try:
            # a finished copy appears under its name at once (rename), or not at all: a second
            # Jupyter kernel calling this at the same time gets the first one's copy
            _copy_tree(NATIVE_DIR, tmp / "native")
            digest = sha256_tree(tmp / "native")
            try:
                os.rename(tmp / "native", dest)  # replaces only an empty folder, never a copy with files
                record({"native/": digest})
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # what a failed copy (a full disk) wrote, too
    return dest


def _copy_tree(src: Path, dest: Path) -> None:
    """shutil.copytree without __pycache__, stopping at the first error and raising it as it is (copytree
    goes on through every file, then raises one shutil.Error that lists them all, their errno lost)."""
    dest.mkdir()
    for p in sorted(src.rglob("*")):  # a folder sorts before what is in it
        if "__pycache__" not in p.relative_to(src).parts:
            to = dest / p.relative_to(src)
            if p.is_dir():
                to.mkdir()
            else:
                shutil.copy2(p, to)


@contextlib.contextmanager
def room_for(what: str, sources: list[Path]):
    """Turn a full disk or quota met inside into a DiskFullError that says ``what`` failed and about how
    much room it needs (the size of ``sources``, files or folders: what the copy writes at most)."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        size = sum(p.stat().st_size for s in sources for p in [s, *s.rglob("*")] if p.is_file())
        raise DiskFullError(e.errno, _("{what} failed: the disk is full. It needs about {mb} MB free; free some "
                                       "space, then run it again").format(what=what, mb=f"{max(size / 1e6, 0.1):.1f}")
                            ) from None


def clear_stale() -> None:
    """Remove the hidden temporaries (``.native-*``, ``.<name>.*.tmp``) that runs which stopped mid-copy left in
    my-work/. By age, not by the pid of their maker: mkstemp's names hold none, and a pid proves little (reused;
    another container's, where a class hub's servers share a home). Every maker writes as it goes and finishes within
    seconds, so a temporary untouched for STALE_S has no maker left; a younger one may be a concurrent run's."""
    cutoff = time.time() - STALE_S
    # (the record's own name is hidden already; before write_atomic, its temporaries were .copied.json.<pid>.tmp)
    found = [(f.parent, f".{f.name}.*.tmp") for f in [*(WORK_DIR / key_of(p) for p in shipped()), MANIFEST]]
    found += [(WORK_DIR, ".native-*"), (WORK_DIR, f"{MANIFEST.name}.*.tmp")]
    for tmp in [t for folder, pattern in found for t in folder.glob(pattern)]:
        with contextlib.suppress(OSError):  # removed by another run a moment ago, or a student's file: left alone
            if tmp.lstat().st_mtime >= cutoff:
                continue
            if tmp.name.startswith(".native-"):
                shutil.rmtree(tmp)  # a folder only: raises on a file or a link, which stays
            else:
                tmp.unlink()


def reset_native(confirm: bool = False) -> tuple[Path, Path | None]:
    """Move ``my-work/native/`` to ``my-work/old/native.<n>/`` and copy ``native/`` again; asks for
    ``confirm=True`` (what you load afterwards is the shipped code). Returns (new copy, old one or None)."""
    if confirm is not True:
        raise ValueError(_("reset_native moves your edited kernel (my-work/native/) to my-work/old/ and starts "
                           "over from native/; call reset_native(confirm=True) to do it"))
    dest = WORK_DIR / "native"
    old = move_to_old(dest, "native", "") if dest.exists() else None
    return student_native(), old


def shown(path: Path) -> str:
    return str(path.relative_to(REPO_DIR))
