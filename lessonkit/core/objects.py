"""The object files a build keeps for the next one (``toolchain._compile_and_link``): a file compiled from the same
bytes, includes and command line is not compiled again, so that an edit of the kernel compiles two files, not
thirteen (2 s instead of 11 s here). Each is named by a hash of what made it and written whole or not at all."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

OBJECTS_KEPT = 96  # compiled files kept for the next builds: a few dozen edits of the kernel, about 2 MB
UNREADABLE = re.compile(r"file (format )?not recognized|file truncated")  # the linker's words for a damaged object
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def key(identity: bytes, base: list[str], src: Path, tmp_src: Path) -> str:
    """A hash of what one object file is made of: the compiler and its command line (the build's private
    folder named alike, as it differs per build) and the bytes of the file and of every file of the folder it
    includes, through their includes too (all of them, whatever #if would pick: more than it needs, never less)."""
    h = hashlib.sha256(identity)
    h.update("\0".join(base).replace(str(tmp_src), "<copy>").encode())
    todo, seen = [src], set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        data = path.read_bytes()
        h.update(path.name.encode() + b"\0" + data + b"\0")
        todo += [(path.parent / m.decode(errors="replace")).resolve() for m in _INCLUDE.findall(data)]
    return h.hexdigest()[:24]


def folder(out: Path) -> Path:
    """Where compiled files wait for the next build: ``objects/`` in the build folder (``out`` is in its private
    folder), or the folder ``$LESSONKIT_OBJECT_CACHE`` (the tests share one: tests/conftest.py)."""
    shared = os.environ.get("LESSONKIT_OBJECT_CACHE", "").strip()
    return Path(shared) if shared and Path(shared).is_dir() else out.parent.parent / "objects"


def take(kept: Path, obj: Path) -> bool:
    """Put a kept object file in place of compiling it; False if there is none (or it cannot be read)."""
    try:
        shutil.copyfile(kept, obj)
        os.utime(kept)  # used: pruned last
        return True
    except OSError:
        return False


def keep(cache: Path, pairs: list[tuple[Path, Path]]) -> None:
    """Keep new object files for the next builds (each whole or not at all), and the newest OBJECTS_KEPT only.
    Housekeeping: a cache that cannot be written only costs a compile later."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        for obj, kept in pairs:
            tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
            shutil.copyfile(obj, tmp)
            os.replace(tmp, kept)
        old = sorted(cache.glob("*.o"), key=lambda p: p.stat().st_mtime, reverse=True)[OBJECTS_KEPT:]
        for path in old:
            path.unlink(missing_ok=True)
    except OSError:
        pass
