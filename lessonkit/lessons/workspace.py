"""Your own copies of the lessons and of the kernel, in ``my-work/`` (git-ignored; ``make lab``,
introduced in lesson 00). ``notebooks/`` and ``native/`` are tracked by git: a lesson saved or a C file
edited there would conflict with the next ``git pull``. So the student works on copies:

    my-work/00_start_here.ipynb ...   one copy per lesson (my-work/zh/: the Chinese ones), and the glossary
    my-work/native/                   the student's copy of the kernel: student_native(); its builds
                                      go to my-work/.build/ and are checked like native/'s
    my-work/old/                      what a reset moved aside; a reset never deletes anything

``make lab`` and ``make update`` add the missing copies, replace a copy you never changed when its
lesson changed, and name the changed lessons whose copy you changed (``make update`` first refuses an
update that would bring files into my-work/: ``update``); ``make reset LESSON=04`` moves your copy to
``my-work/old/`` and copies the lesson again. This module itself needs only the
standard library, so that ``make reset`` works even when the kernel does not build.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..core.files import write_atomic
from ..core.language import _

REPO_DIR = Path(__file__).resolve().parents[2]
LESSONS_DIR = REPO_DIR / "notebooks"
NATIVE_DIR = REPO_DIR / "native"
# One folder at the same depth as notebooks/, so that the lessons' relative links
# (../docs/references.md) work from the copies too. Listed in .gitignore.
WORK_DIR = REPO_DIR / "my-work"
OLD_DIR = WORK_DIR / "old"
# sha256 of each shipped file when its copy was made: tells "the lesson changed in an update"
# from "you changed your copy" without ever reading or touching the copy.
MANIFEST = WORK_DIR / ".copied.json"
LESSON_GLOB = "[0-9][0-9]*_*.ipynb"
# The editions: English in notebooks/, Chinese in notebooks/zh/ (lessonkit.edition makes them)
EDITIONS = {"en": LESSONS_DIR, "zh": LESSONS_DIR / "zh"}
GLOSSARY = LESSONS_DIR / "glossary.md"
# A hidden temporary of this module untouched this long was left by a run that stopped (_clear_stale)
STALE_S = 600
MANIFEST_MAX_BYTES = 1 << 20  # the record holds a line per lesson: far larger is not a record
GIT_TIMEOUT_S = 300  # one git step of make update (a fetch over a slow network included)


class DiskFullError(OSError):
    """A copy the disk (or the quota) had no room for; its message, in the student's language, says
    what failed, about how much room it needs and what to do."""

    def __str__(self) -> str:
        return self.strerror


def lessons(edition: str | None = "en") -> list[Path]:
    """The shipped lessons of one edition ("en": notebooks/, "zh": notebooks/zh/), in order; None: both."""
    if edition is None:
        return [p for e in EDITIONS for p in lessons(e)]
    return sorted(EDITIONS[edition].glob(LESSON_GLOB))


def _shipped() -> list[Path]:
    """Every file that gets a copy in my-work/: the lessons of both editions, and the glossary."""
    return lessons(None) + ([GLOSSARY] if GLOSSARY.exists() else [])


def _key(lesson: Path) -> str:
    """A shipped file's path under notebooks/ ("04_x.ipynb", "zh/04_x.ipynb"): its name in the
    manifest, and its copy's path under my-work/."""
    return lesson.relative_to(LESSONS_DIR).as_posix()


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sha256_tree(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _read_manifest() -> tuple[dict, str | None]:
    """The record's sound entries (a sha256 each), and None, or a notice if the record was unreadable or
    damaged. A damaged record is moved to my-work/old/ (nothing is deleted) and written again with its
    sound entries, so that the next run reads a clean one; a copy whose entry is lost is never replaced
    on the strength of it (make_copies lists it as possibly changed)."""
    try:
        # a regular file of sane size only: a FIFO would block the read, /dev/zero would never end it
        if not MANIFEST.is_file() or MANIFEST.stat().st_size > MANIFEST_MAX_BYTES:
            raise ValueError(MANIFEST)
        data = json.loads(MANIFEST.read_text(encoding="utf-8"))
    except FileNotFoundError:  # no copy made yet
        return {}, None
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON, nested too deep
        if not MANIFEST.is_symlink() and not MANIFEST.exists():
            return {}, None  # nothing there (is_file() is False for a missing file too)
        data = None
    sound = {k: v for k, v in data.items() if isinstance(v, str) and re.fullmatch("[0-9a-f]{64}", v)} \
        if isinstance(data, dict) else {}
    if isinstance(data, dict) and len(sound) == len(data):
        return sound, None
    try:
        kept = _move_to_old(MANIFEST, "copied", ".json")
    except FileNotFoundError:  # another run moved it a moment ago, and writes the same sound entries
        return sound, None
    _record(sound)  # (the damaged one is out of the way: _record starts from nothing)
    return sound, _("{record}, the record of which version of each lesson your copies were made from, was "
                    "unreadable or damaged: it is kept as {kept}, and a clean one was written from what was sound "
                    "in it; a copy it no longer vouches for is never replaced, and is listed as possibly "
                    "changed").format(record=_shown(MANIFEST), kept=_shown(kept))


def _record(updates: dict) -> None:
    write_atomic(MANIFEST, json.dumps({**_read_manifest()[0], **updates}, indent=1, sort_keys=True) + "\n")


def _copy_new(src: Path, dest: Path) -> bool:
    """Copy src to dest unless dest exists; never overwrite. True if copied. The copy is written
    beside dest and hard-linked to its name, which is atomic and fails on an existing name: two
    processes making copies at once cannot both write (or half-write) the same one."""
    if dest.exists():
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)  # contents only: the copy is the student's file, with their mode
        try:
            os.link(tmp, dest)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: check, then rename (a tiny race window)
            if dest.exists():
                return False
            os.replace(tmp, dest)
        return True
    finally:
        Path(tmp).unlink(missing_ok=True)


def _move_to_old(path: Path, stem: str, suffix: str) -> Path:
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


def make_copies() -> dict:
    """Copy every shipped lesson (both editions, and the glossary they link) that has no working copy
    yet into ``my-work/``. Returns ``{"copied": [...], "updated": [...], "changed": [...], "unknown":
    [...], "record": notice}``: the copies made now; the copies the student never changed whose lesson
    changed, now replaced by the new lesson; the copies the student changed whose lesson changed since,
    kept (``reset_lesson`` gets the new one), and ``my-work/native`` if ``native/`` changed since it was
    copied; the copies no record vouches for (its entry lost) that differ from their lesson: possibly
    changed, kept; and the notice of a damaged record (_read_manifest), or None."""
    with _room_for(_("copying the lessons to my-work/"), _shipped()):
        WORK_DIR.mkdir(exist_ok=True)
        _clear_stale()
        manifest, notice = _read_manifest()
        copied, updated, changed, unknown = [], [], [], []
        for lesson in _shipped():
            key = _key(lesson)
            dest, now, was = WORK_DIR / key, _sha256_file(lesson), manifest.get(key)
            if _copy_new(lesson, dest):
                copied.append(dest)
                _record({key: now})
            elif was is None:
                if not _vouch(key, dest, now, _sha256_file):
                    unknown.append(dest)
            elif was != now:
                (updated if _replace_untouched(lesson, dest, was, now) else changed).append(dest)
        native = WORK_DIR / "native"
        if native.is_dir() and any(native.iterdir()):
            was, now = manifest.get("native/"), _sha256_tree(NATIVE_DIR)
            if was is None:
                if not _vouch("native/", native, now, _sha256_tree):
                    unknown.append(native)
            elif was != now:
                changed.append(native)
    return {"copied": copied, "updated": updated, "changed": changed, "unknown": unknown, "record": notice}


def _vouch(key: str, copy: Path, now: str, digest) -> bool:
    """A copy with no entry in the record: only its bytes can tell, and only that it is the shipped file
    as it is now (sha256 ``now``), so nothing of the student's is in it; then it is recorded as such (an
    update may replace it later). True if so."""
    if digest(copy) != now:
        return False
    _record({key: now})
    return True


def _replace_untouched(lesson: Path, dest: Path, was: str, now: str) -> bool:
    """Put the new ``lesson`` (sha256 ``now``) in place of its copy ``dest`` if the copy is byte for
    byte the shipped file it was made from (sha256 ``was``). True if replaced. The new file is
    written beside the copy and renamed over it; the copy is checked just before (a student saving
    at that moment keeps their save)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        shutil.copyfile(lesson, tmp)
        shutil.copymode(dest, tmp)  # the copy's mode stays the student's, not mkstemp's 0600
        if _sha256_file(dest) != was:
            return False
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)
    _record({_key(lesson): now})
    return True


def find_lesson(which: str | int) -> Path:
    """The shipped lesson named by its number (``"04"``, ``4``, ``"05b"``) or its name
    (``"04_kernel_walkthrough"``, with or without ``.ipynb``); ``"zh/04"`` names the Chinese one;
    ``"glossary"`` the glossary both editions share."""
    text = str(which).strip()
    edition, text = ("zh", text[3:]) if text.startswith("zh/") else ("en", text)
    text = text.removesuffix(".ipynb")
    if text.removesuffix(".md") == GLOSSARY.stem and GLOSSARY.exists():
        return GLOSSARY
    pool = lessons(edition)
    if m := re.fullmatch(r"(\d{1,2})([a-z]?)", text):
        matches = [p for p in pool if p.stem.split("_", 1)[0] == f"{int(m[1]):02d}{m[2]}"]
    else:
        matches = [p for p in pool if p.stem == Path(text).name]
    if len(matches) != 1:
        names = ", ".join([p.stem for p in pool] + [GLOSSARY.stem])
        raise ValueError(_("no single lesson {which!r}; the lessons are {names} (give the number, e.g. LESSON=04, "
                           "or LESSON=zh/04 for the Chinese one)").format(which=which, names=names))
    return matches[0]


def reset_lesson(which: str | int) -> tuple[Path, Path | None]:
    """``make reset LESSON=04``: move the lesson's copy to ``my-work/old/<name>.<n>.ipynb`` (the glossary's
    to ``glossary.<n>.md``) and copy the shipped lesson again. Returns (the new copy, where the old one
    went or None)."""
    lesson = find_lesson(which)
    dest = WORK_DIR / _key(lesson)
    WORK_DIR.mkdir(exist_ok=True)
    stem = lesson.stem if lesson.parent == LESSONS_DIR else f"{lesson.parent.name}-{lesson.stem}"
    old = _move_to_old(dest, stem, lesson.suffix) if dest.exists() else None
    if not _copy_new(lesson, dest):  # another process made a copy in between: keep theirs
        raise FileExistsError(errno.EEXIST, "a new working copy appeared during the reset; run it again", str(dest))
    _record({_key(lesson): _sha256_file(lesson)})
    return dest, old


def student_native() -> Path:
    """``my-work/native/``, your copy of ``native/`` to edit (lessons 04 and 06), made on first use and
    never overwritten after. ``lessonkit.native.load(src_dir=workspace.student_native())`` builds it
    (into ``my-work/.build/``), checks the build in a child process and loads it, as for ``native/``."""
    dest = WORK_DIR / "native"
    if dest.is_dir() and any(dest.iterdir()):
        return dest
    with _room_for(_("copying native/ to my-work/native/"), [NATIVE_DIR]):
        WORK_DIR.mkdir(exist_ok=True)
        _clear_stale()
        tmp = Path(tempfile.mkdtemp(prefix=".native-", dir=WORK_DIR))
        try:
            # a finished copy appears under its name at once (rename), or not at all: a second
            # Jupyter kernel calling this at the same time gets the first one's copy
            _copy_tree(NATIVE_DIR, tmp / "native")
            digest = _sha256_tree(tmp / "native")
            try:
                os.rename(tmp / "native", dest)  # replaces only an empty folder, never a copy with files
                _record({"native/": digest})
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
def _room_for(what: str, sources: list[Path]):
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


def _clear_stale() -> None:
    """Remove the hidden temporaries that runs which stopped mid-copy (a kernel restarted, a power cut)
    left in my-work/: student_native's ``.native-*`` folders, the ``.<name>.*.tmp`` files beside a copy or
    the record. By age, not by the pid of their maker: mkstemp's names hold none, and a pid proves little
    (reused; another container's, where a class hub's servers share a home). Every maker finishes within
    seconds and writes as it goes, so a temporary untouched for STALE_S has no maker left; a younger one
    may be a concurrent run's, and stays."""
    cutoff = time.time() - STALE_S
    # (the record's own name is hidden already; before write_atomic, its temporaries were .copied.json.<pid>.tmp)
    found = [(f.parent, f".{f.name}.*.tmp") for f in [*(WORK_DIR / _key(p) for p in _shipped()), MANIFEST]]
    found += [(WORK_DIR, ".native-*"), (WORK_DIR, f"{MANIFEST.name}.*.tmp")]
    for tmp in [t for folder, pattern in found for t in folder.glob(pattern)]:
        try:
            if tmp.lstat().st_mtime >= cutoff:
                continue
            if tmp.name.startswith(".native-"):
                shutil.rmtree(tmp)  # a folder only: raises on a file or a link, which stays
            else:
                tmp.unlink()
        except OSError:  # removed by another run a moment ago, or a file of the student's: left alone
            pass


def reset_native(confirm: bool = False) -> tuple[Path, Path | None]:
    """Move ``my-work/native/`` to ``my-work/old/native.<n>/`` and copy ``native/`` again; asks for
    ``confirm=True`` (what you load afterwards is the shipped code). Returns (new copy, old one or None)."""
    if confirm is not True:
        raise ValueError(_("reset_native moves your edited kernel (my-work/native/) to my-work/old/ and starts "
                           "over from native/; call reset_native(confirm=True) to do it"))
    dest = WORK_DIR / "native"
    old = _move_to_old(dest, "native", "") if dest.exists() else None
    return student_native(), old


def update() -> None:
    """``make update``: fetch, refuse an update whose incoming changes touch my-work/, then fast-forward.
    git treats an ignored file as expendable: a commit that tracks a file under my-work/ would replace
    the student's copy of it without a word. The merge takes the commit checked here, not ``git pull``,
    which would fetch again and could bring one nobody checked."""
    _git("fetch")
    upstream = _git("rev-parse", "--verify", "@{upstream}").strip()
    # from where the two histories part (HEAD...): what the update brings, not what HEAD has over it
    incoming = _git("diff", "--name-only", "--no-renames", "-z", f"HEAD...{upstream}", "--", WORK_DIR.name)
    if paths := [p for p in incoming.split("\0") if p]:
        raise OSError(_("make update stopped, and left your files as they were: the update brings files into "
                        "my-work/, where git would overwrite your copies without asking ({paths}); tell whoever "
                        "publishes the workbook that my-work/ must stay out of git").format(paths=", ".join(paths)))
    print(_git("merge", "--ff-only", upstream), end="")


def _git(*args: str) -> str:
    """git's output; its error messages go to the terminal as they are, and a failure stops the update."""
    try:  # bounded: a fetch from an unreachable server gives up instead of hanging the update
        proc = subprocess.run(["git", *args], cwd=REPO_DIR, stdout=subprocess.PIPE, text=True, timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc = subprocess.CompletedProcess(args, 1)
    if proc.returncode:
        raise OSError(_("make update stopped: `git {command}` failed (git says why above); see 'Your own "
                        "copies: update and reset' in README.md").format(command=" ".join(args)))
    return proc.stdout


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_DIR))


def main(argv: list[str] | None = None) -> int:
    """``python -m lessonkit.workspace copies | update | reset LESSON | reset-native``: for the Makefile
    (make lab, make update, make reset, make reset-native)."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m lessonkit.workspace", description=main.__doc__)
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("copies", help="copy the lessons that have no working copy yet")
    sub.add_parser("update", help="git fetch, and fast-forward unless the update touches my-work/")
    r = sub.add_parser("reset", help="move a lesson's working copy to my-work/old/ and copy it again")
    r.add_argument("lesson", help="its number, e.g. 04")
    sub.add_parser("reset-native", help="move my-work/native/ to my-work/old/ and copy native/ again")
    args = p.parse_args(argv)
    try:
        if args.what == "copies":
            result = make_copies()
            if result["record"]:
                print(result["record"])
            for path in result["copied"]:
                print(_("new working copy: ") + _shown(path))
            for path in result["updated"]:
                print(_("updated: {shown_path} (the lesson changed, and you had not changed your copy)").format(
                        shown_path=_shown(path)))
            advice = [(result["changed"],
                       _("native/ changed since {shown_path} was made; `make reset-native` starts your copy "
                         "over from it (yours is kept in my-work/old/)"),
                       _("notebooks/{rel} changed since your copy was made; `make reset LESSON={which}` gives "
                         "you the new one (yours is kept in my-work/old/)")),
                      (result["unknown"],
                       _("no record says which version of native/ {shown_path} was copied from, so native/ has "
                         "possibly changed since; `make reset-native` starts your copy over from it (yours is kept "
                         "in my-work/old/)"),
                       _("no record says which version of notebooks/{rel} your copy was made from, so the lesson "
                         "has possibly changed since; `make reset LESSON={which}` gives you the new one (yours is "
                         "kept in my-work/old/)"))]
            for paths, native_text, lesson_text in advice:
                for path in paths:
                    # a lesson, or the glossary (the student's notes may be in it: reset, never delete)
                    rel = path.relative_to(WORK_DIR).as_posix()
                    which = GLOSSARY.stem if path.name == GLOSSARY.name else rel.split("_", 1)[0]
                    print((native_text if path.name == "native" else lesson_text).format(
                          shown_path=_shown(path), rel=rel, which=which))
        elif args.what == "update":
            update()
        elif args.what == "reset":
            new, old = reset_lesson(args.lesson)
            print(_("{shown_old}: your previous copy").format(shown_old=_shown(old)) if old
                  else _("there was no working copy"))
            print(_("{shown_new}: a fresh copy of notebooks/{as_posix_relative_to_wor}").format(
                    shown_new=_shown(new), as_posix_relative_to_wor=new.relative_to(WORK_DIR).as_posix()))
        else:
            new, old = reset_native(confirm=True)
            print(_("{shown_old}: your previous kernel copy").format(shown_old=_shown(old)) if old
                  else _("there was no kernel copy"))
            print(_("{shown_new}: a fresh copy of native/").format(shown_new=_shown(new)))
    except (ValueError, OSError) as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
