"""The kernel's source as the lessons show it: real line numbers, found through the
``== segment N: title ==`` / ``== end segment N ==`` comments in the C file, so that no lesson
or exercise hard-codes a line number (introduced in lesson 04)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .native import NATIVE_DIR

KERNEL_FILE = NATIVE_DIR / "flash_attn_q8_neon.c"
_BEGIN = re.compile(r"/\*\s*== segment (\d+): (.*?) ==\s*\*/")
_END = re.compile(r"/\*\s*== end segment (\d+) ==\s*\*/")


@dataclass(frozen=True)
class Segment:
    number: int
    title: str
    begin: int  # 1-based line of the opening marker
    end: int    # 1-based line of the closing marker


def kernel_segments(path: Path | str = KERNEL_FILE) -> dict[int, Segment]:
    """The marked segments of the kernel file, by number. Raises ValueError on a marker that
    is opened twice, closed without being opened, or never closed."""
    opened: dict[int, tuple[str, int]] = {}
    found: dict[int, Segment] = {}
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if m := _BEGIN.search(line):
            n = int(m.group(1))
            if n in opened or n in found:
                raise ValueError(f"{path}:{lineno}: segment {n} opened twice")
            opened[n] = (m.group(2), lineno)
        elif m := _END.search(line):
            n = int(m.group(1))
            if n not in opened:
                raise ValueError(f"{path}:{lineno}: segment {n} closed but never opened")
            title, begin = opened.pop(n)
            found[n] = Segment(n, title, begin, lineno)
    if opened:
        raise ValueError(f"{path}: segment(s) {sorted(opened)} never closed")
    return dict(sorted(found.items()))


def numbered_lines(first: int, last: int, path: Path | str = KERNEL_FILE) -> str:
    """Lines first..last (1-based, inclusive) of a source file, each with its line number."""
    lines = Path(path).read_text().splitlines()
    width = len(str(last))
    return "\n".join(f"{n:>{width}}  {lines[n - 1]}" for n in range(first, min(last, len(lines)) + 1))


def declaration(name: str, path: Path | str = NATIVE_DIR / "flash_attn_q8.h") -> str:
    """The declaration of C function ``name`` in a header, with its line numbers (lesson 00)."""
    lines = Path(path).read_text().splitlines()
    first = next((i for i, l in enumerate(lines) if re.search(rf"\b{re.escape(name)}\s*\(", l)), None)
    if first is None:
        raise ValueError(f"{name} is not declared in {Path(path).name}")
    last = next(i for i in range(first, len(lines)) if lines[i].rstrip().endswith(";"))
    return numbered_lines(first + 1, last + 1, path)
