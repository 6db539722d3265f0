"""The student's copies of the lessons, for the Makefile: ``make lab`` and ``make copies`` (``copies``), ``make
update`` (``update``), ``make reset LESSON=04`` (``reset``), ``make reset-native`` (``reset-native``), each
``python -m workbench workspace WHAT``. The copies live in ``my-work/`` (``lessonkit/lessons/workspace.py`` says why
and keeps the record of which version each copy was made from, which the lessons' ``student_native()`` shares).
Standard library only, with lessonkit's own: ``make reset`` works even where the kernel does not build."""
from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lessonkit.core.language import _
from lessonkit.lessons import workspace as ws
from lessonkit.lessons.workspace import reset_native

GIT_TIMEOUT_S = 300  # one git step of make update (a fetch over a slow network included)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


def make_copies() -> dict:
    """Copy every shipped lesson (both editions, and the glossary they link) that has no working copy
    yet into ``my-work/``. Returns ``{"copied": [...], "updated": [...], "changed": [...], "unknown":
    [...], "record": notice}``: the copies made now; the copies the student never changed whose lesson
    changed, now replaced by the new lesson; the copies the student changed whose lesson changed since,
    kept (``reset_lesson`` gets the new one), and ``my-work/native`` if ``native/`` changed since it was
    copied; the copies no record vouches for (its entry lost) that differ from their lesson: possibly
    changed, kept; and the notice of a damaged record (ws.read_manifest), or None."""
    with ws.room_for(_("copying the lessons to my-work/"), ws.shipped()):
        ws.WORK_DIR.mkdir(exist_ok=True)
        ws.clear_stale()
        manifest, notice = ws.read_manifest()
        copied, updated, changed, unknown = [], [], [], []
        for lesson in ws.shipped():
            key = ws.key_of(lesson)
            dest, now, was = ws.WORK_DIR / key, sha256_file(lesson), manifest.get(key)
            if _copy_new(lesson, dest):
                copied.append(dest)
                ws.record({key: now})
            elif was is None:
                if not _vouch(key, dest, now, sha256_file):
                    unknown.append(dest)
            elif was != now:
                (updated if _replace_untouched(lesson, dest, was, now) else changed).append(dest)
        native = ws.WORK_DIR / "native"
        if native.is_dir() and any(native.iterdir()):
            was, now = manifest.get("native/"), ws.sha256_tree(ws.NATIVE_DIR)
            if was is None:
                if not _vouch("native/", native, now, ws.sha256_tree):
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
    ws.record({key: now})
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
        if sha256_file(dest) != was:
            return False
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)
    ws.record({ws.key_of(lesson): now})
    return True


def find_lesson(which: str | int) -> Path:
    """The shipped lesson named by its number (``"04"``, ``4``, ``"05b"``) or its name
    (``"04_kernel_walkthrough"``, with or without ``.ipynb``); ``"zh/04"`` names the Chinese one;
    ``"glossary"`` the glossary both editions share."""
    text = str(which).strip()
    edition, text = ("zh", text[3:]) if text.startswith("zh/") else ("en", text)
    text = text.removesuffix(".ipynb")
    if text.removesuffix(".md") == ws.GLOSSARY.stem and ws.GLOSSARY.exists():
        return ws.GLOSSARY
    pool = ws.lessons(edition)
    if m := re.fullmatch(r"(\d{1,2})([a-z]?)", text):
        matches = [p for p in pool if p.stem.split("_", 1)[0] == f"{int(m[1]):02d}{m[2]}"]
    else:
        matches = [p for p in pool if p.stem == Path(text).name]
    if len(matches) != 1:
        names = ", ".join([p.stem for p in pool] + [ws.GLOSSARY.stem])
        raise ValueError(_("no single lesson {which!r}; the lessons are {names} (give the number, e.g. LESSON=04, "
                           "or LESSON=zh/04 for the Chinese one)").format(which=which, names=names))
    return matches[0]


def reset_lesson(which: str | int) -> tuple[Path, Path | None]:
    """``make reset LESSON=04``: move the lesson's copy to ``my-work/old/<name>.<n>.ipynb`` (the glossary's
    to ``glossary.<n>.md``) and copy the shipped lesson again. Returns (the new copy, where the old one
    went or None)."""
    lesson = find_lesson(which)
    dest = ws.WORK_DIR / ws.key_of(lesson)
    ws.WORK_DIR.mkdir(exist_ok=True)
    stem = lesson.stem if lesson.parent == ws.LESSONS_DIR else f"{lesson.parent.name}-{lesson.stem}"
    old = ws.move_to_old(dest, stem, lesson.suffix) if dest.exists() else None
    if not _copy_new(lesson, dest):  # another process made a copy in between: keep theirs
        raise FileExistsError(errno.EEXIST, "a new working copy appeared during the reset; run it again", str(dest))
    ws.record({ws.key_of(lesson): sha256_file(lesson)})
    return dest, old


def update() -> None:
    """``make update``: fetch, refuse an update whose incoming changes touch my-work/, then fast-forward.
    git treats an ignored file as expendable: a commit that tracks a file under my-work/ would replace
    the student's copy of it without a word. The merge takes the commit checked here, not ``git pull``,
    which would fetch again and could bring one nobody checked."""
    _git("fetch")
    upstream = _git("rev-parse", "--verify", "@{upstream}").strip()
    # from where the two histories part (HEAD...): what the update brings, not what HEAD has over it
    incoming = _git("diff", "--name-only", "--no-renames", "-z", f"HEAD...{upstream}", "--", ws.WORK_DIR.name)
    if paths := [p for p in incoming.split("\0") if p]:
        raise OSError(_("make update stopped, and left your files as they were: the update brings files into "
                        "my-work/, where git would overwrite your copies without asking ({paths}); tell whoever "
                        "publishes the workbook that my-work/ must stay out of git").format(paths=", ".join(paths)))
    print(_git("merge", "--ff-only", upstream), end="")


def _git(*args: str) -> str:
    """git's output; its error messages go to the terminal as they are, and a failure stops the update."""
    try:  # bounded: a fetch from an unreachable server gives up instead of hanging the update
        proc = subprocess.run(["git", *args], cwd=ws.REPO_DIR, stdout=subprocess.PIPE, text=True, timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc = subprocess.CompletedProcess(args, 1)
    if proc.returncode:
        raise OSError(_("make update stopped: `git {command}` failed (git says why above); see 'Your own "
                        "copies: update and reset' in README.md").format(command=" ".join(args)))
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench workspace copies | update | reset LESSON | reset-native``: for the Makefile
    (make lab, make update, make reset, make reset-native)."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m workbench workspace", description=main.__doc__)
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
                print(_("new working copy: ") + ws.shown(path))
            for path in result["updated"]:
                print(_("updated: {shown_path} (the lesson changed, and you had not changed your copy)").format(
                        shown_path=ws.shown(path)))
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
                    rel = path.relative_to(ws.WORK_DIR).as_posix()
                    which = ws.GLOSSARY.stem if path.name == ws.GLOSSARY.name else rel.split("_", 1)[0]
                    print((native_text if path.name == "native" else lesson_text).format(
                          shown_path=ws.shown(path), rel=rel, which=which))
        elif args.what == "update":
            update()
        elif args.what == "reset":
            new, old = reset_lesson(args.lesson)
            print(_("{shown_old}: your previous copy").format(shown_old=ws.shown(old)) if old
                  else _("there was no working copy"))
            print(_("{shown_new}: a fresh copy of notebooks/{as_posix_relative_to_wor}").format(
                    shown_new=ws.shown(new), as_posix_relative_to_wor=new.relative_to(ws.WORK_DIR).as_posix()))
        else:
            new, old = reset_native(confirm=True)
            print(_("{shown_old}: your previous kernel copy").format(shown_old=ws.shown(old)) if old
                  else _("there was no kernel copy"))
            print(_("{shown_new}: a fresh copy of native/").format(shown_new=ws.shown(new)))
    except (ValueError, OSError) as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
