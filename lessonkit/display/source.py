"""The kernel's source as the lessons show it: real line numbers, found through the
``== segment N: title ==`` / ``== end segment N ==`` comments in the C file, a function's
definition or a line's text, so that no lesson or exercise hard-codes a line number
(introduced in lesson 00; segments in lesson 04)."""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from ..core.language import _, from_c
from ..core.native import NATIVE_DIR

KERNEL_FILE = NATIVE_DIR / "flash_attn_q8_neon.c"
SIMD_HEADER = NATIVE_DIR / "q8_simd.h"  # i8x16_dot_s32, vkq_add_i8x16, q_code, KVQ_INV, ...
SIMD_X86_HEADER = NATIVE_DIR / "q8_simd_x86.h"  # the AVX2 / AVX-512 / VNNI forms of a few of those helpers
STEPS_FILE = NATIVE_DIR / "flash_attn_q8_steps.c"  # the versions of lesson 09, one function each
_BEGIN = re.compile(r"/\*\s*== segment (\d+): (.*?) ==\s*\*/")
_END = re.compile(r"/\*\s*== end segment (\d+) ==\s*\*/")
_HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


@dataclass(frozen=True)
class Segment:
    number: int
    title: str  # as the marker comment has it
    begin: int  # 1-based line of the opening marker
    end: int    # 1-based line of the closing marker

    @property
    def shown_title(self) -> str:
        """The title in the current language (the C comment stays English, as C source does)."""
        return from_c(self.title)


def kernel_segments(path: Path | str = KERNEL_FILE) -> dict[int, Segment]:
    """The marked segments of the kernel file, by number. Raises ValueError on a marker that
    is opened twice, closed without being opened, or never closed."""
    opened: dict[int, tuple[str, int]] = {}
    found: dict[int, Segment] = {}
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if m := _BEGIN.search(line):
            n = int(m.group(1))
            if n in opened or n in found:
                raise ValueError(_("{path}:{lineno}: segment {n} opened twice").format(
                                   path=path, lineno=lineno, n=n))
            opened[n] = (m.group(2), lineno)
        elif m := _END.search(line):
            n = int(m.group(1))
            if n not in opened:
                raise ValueError(_("{path}:{lineno}: segment {n} closed but never opened").format(
                                   path=path, lineno=lineno, n=n))
            title, begin = opened.pop(n)
            found[n] = Segment(n, title, begin, lineno)
    if opened:
        raise ValueError(_("{path}: segment(s) {opened} never closed").format(path=path, opened=sorted(opened)))
    return dict(sorted(found.items()))


def numbered_lines(first: int, last: int, path: Path | str = KERNEL_FILE, marked: tuple[int, int] | None = None,
                   mark: str = ">>") -> str:
    """Lines first..last (1-based, inclusive) of a source file, each with its line number; with ``marked``,
    ``mark`` before those in that inclusive range (lesson 04 marks the branch this build compiled)."""
    lines = Path(path).read_text().splitlines()
    width, blank = len(str(last)), " " * len(mark)

    def prefix(n: int) -> str:
        return "" if marked is None else f"{mark if marked[0] <= n <= marked[1] else blank} "
    return "\n".join(f"{prefix(n)}{n:>{width}}  {lines[n - 1]}" for n in range(first, min(last, len(lines)) + 1))


def declaration(name: str, path: Path | str = NATIVE_DIR / "flash_attn_q8.h") -> str:
    """The declaration of C function ``name`` in a header, with its line numbers (lesson 00)."""
    lines = Path(path).read_text().splitlines()
    first = next((i for i, l in enumerate(lines) if re.search(rf"\b{re.escape(name)}\s*\(", l)), None)
    if first is None:
        raise ValueError(_("{name} is not declared in {path}").format(name=name, path=Path(path).name))
    last = next(i for i in range(first, len(lines)) if lines[i].rstrip().endswith(";"))
    return numbered_lines(first + 1, last + 1, path)


def _without_comments(text: str) -> str:
    """C text with comments blanked out (newlines kept, so line numbers stay the same)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    return re.sub(r"/\*.*?\*/|//[^\n]*", blank, text, flags=re.S)


def function_lines(name: str, path: Path | str = KERNEL_FILE) -> tuple[int, int]:
    """1-based (first, last) lines of the *definition* of C function ``name``: from the line that
    names it, where the next of ``{`` or ``;`` after the name is a ``{`` (so a prototype or a call
    is skipped; comments are ignored), to the first later line that is a lone ``}`` at column 0.
    Raises ValueError if there is no definition (lesson 04)."""
    raw = Path(path).read_text()
    text = _without_comments(raw)
    lines = raw.splitlines()
    for m in re.finditer(rf"\b{re.escape(name)}\s*\(", text):
        nxt = re.compile(r"[{;]").search(text, m.end())
        if nxt is None or nxt.group(0) != "{":
            continue
        first = text.count("\n", 0, m.start())  # 0-based line of the name
        brace = text.count("\n", 0, nxt.start())
        last = next((k for k in range(brace, len(lines)) if lines[k].rstrip() == "}"), None)
        if last is None:
            raise ValueError(_("{name}: no closing '}}' at column 0 in {path}").format(
                               name=name, path=Path(path).name))
        return first + 1, last + 1
    raise ValueError(_("no definition of {name} in {path}").format(name=name, path=Path(path).name))


def _commented_function(name: str, path: Path | str) -> tuple[int, list[str]]:
    """The first line number and the lines of C function ``name``'s definition, from the comment
    lines just above it to its closing brace."""
    first, last = function_lines(name, path)
    lines = Path(path).read_text().splitlines()
    while first > 1 and lines[first - 2].lstrip().startswith(("/*", "*", "//")):
        first -= 1
    return first, lines[first - 1:last]


def show_function(name: str, path: Path | str = KERNEL_FILE) -> str:
    """The definition of C function ``name`` with real line numbers, with the comment lines just
    above it (lesson 01 shows ``q_code`` from ``SIMD_HEADER`` this way)."""
    first, lines = _commented_function(name, path)
    return numbered_lines(first, first + len(lines) - 1, path)


def function_diff(path: Path | str, a: str, b: str, path_b: Path | str | None = None, context: int = 3) -> str:
    """A unified diff (difflib) from C function ``a`` to ``b``, each with the comment above it, as
    lesson 09 shows one version against the one before it. ``b`` is read from ``path_b`` if given,
    else from ``path``; the hunk headers (``@@ -first,count +first,count @@``) carry the files' real
    line numbers."""
    path_b = path if path_b is None else path_b
    (fa, la), (fb, lb) = _commented_function(a, path), _commented_function(b, path_b)
    diff = difflib.unified_diff(la, lb, f"{Path(path).name}:{a}", f"{Path(path_b).name}:{b}", n=context, lineterm="")
    at = lambda m: f"@@ -{int(m[1]) + fa - 1}{m[2] or ''} +{int(m[3]) + fb - 1}{m[4] or ''} @@"  # noqa: E731
    return "\n".join(_HUNK.sub(at, line) if line.startswith("@@") else line for line in diff)


def find_line(text: str, segment: int | None = None, path: Path | str = KERNEL_FILE) -> int:
    """The 1-based number of the first line that contains ``text``, searched inside segment
    ``segment`` of the kernel (between its markers) or, with ``segment=None``, the whole file.
    Raises ValueError when no line there contains it (lesson 03)."""
    lines = Path(path).read_text().splitlines()
    if segment is None:
        first, last = 1, len(lines)
    else:
        segs = kernel_segments(path)
        if segment not in segs:
            raise ValueError(_("no segment {segment} in {path}").format(segment=segment, path=Path(path).name))
        first, last = segs[segment].begin, segs[segment].end
    for n in range(first, last + 1):
        if text in lines[n - 1]:
            return n
    if segment is None:
        raise ValueError(_("no line of the file of {path} contains {text!r}").format(
                           path=Path(path).name, text=text))
    raise ValueError(_("no line of segment {segment} of {path} contains {text!r}").format(
                       segment=segment, path=Path(path).name, text=text))
