"""The workbook's own files, read and written safely. Writing: the new text goes to a hidden
temporary file beside the file, which is renamed over the old one (``os.replace`` is atomic on one
file system), so a failed write (a full disk, an interrupt) leaves the old file as it was and removes
the temporary one. Reading: a file that is not UTF-8, or not a notebook, is a ValueError that names
it and says what to do. Standard library only: ``make reset`` and the edition build use it without
the kernel."""
from __future__ import annotations

import json
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


def _shown(path: Path, root: Path) -> Path:
    """A path as a message names it: from the repository's top (``root``) when it is inside it."""
    return path.relative_to(root) if path.is_relative_to(root) else path


def read_utf8(path: Path, root: Path = REPO_DIR) -> str:
    """The text of a translation file or a notebook. A byte-order mark (Windows editors write one) is
    dropped, line ends become "\\n" (as Path.read_text makes them), and a file that is not UTF-8 is a
    ValueError naming it and the line, not a bare UnicodeDecodeError."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # not utf-8-sig, whose error offsets skip the mark
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ValueError(f"{_shown(path, root)}:{line}: not UTF-8 text ({e.reason} at byte {e.start}); save it as "
                         "UTF-8 (your editor's encoding setting, or iconv -f GBK -t UTF-8 for a GBK file)") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_notebook(path: Path, root: Path = REPO_DIR) -> dict:
    """A notebook's JSON. A file that is not JSON, or not a notebook of cells with ids, is a ValueError
    naming it and what to do, not a bare JSONDecodeError or KeyError."""
    fix = f"restore it (git checkout -- {_shown(path, root)}) or mend it"
    try:
        nb = json.loads(read_utf8(path, root))
    except RecursionError:
        raise ValueError(f"{_shown(path, root)}: nested too deep to be a notebook; {fix}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{_shown(path, root)}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}), so not a notebook; "
                         f"{fix}") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) and {"cell_type", "id"} <= c.keys() for c in cells):
        raise ValueError(f"{_shown(path, root)}: not a notebook (nbformat 4.5: a list of cells, each with a cell_type "
                         f"and an id); {fix}")
    return nb
