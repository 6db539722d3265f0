"""The workbook's own files, written safely: the new text goes to a hidden temporary file beside the file,
which is renamed over the old one (``os.replace`` is atomic on one file system), so a failed write (a full
disk, an interrupt) leaves the old file as it was and removes the temporary one. Standard library only:
``make reset`` uses it without the kernel."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[2]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, data: str | bytes, encoding: str = "utf-8") -> Path:
    """Write ``data`` to ``path`` in one step: readers see the old file or the new one, never a part.
    The file keeps the mode it had (a new one gets the usual 0666 less the umask, not mkstemp's 0600)."""
    path = Path(path)
    payload = data.encode(encoding) if isinstance(data, str) else data
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd = tmp = None
    try:  # mkstemp inside: an interrupt right after it still removes the file (only one inside it cannot)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            fd = None  # the file object owns it now
            f.write(payload)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt too: the temporary file does not stay behind
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
    return path

