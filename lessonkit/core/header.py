"""The sizes C and Python share, read from the kernel's header ``native/flash_attn_q8.h``.

The header defines them once (``#define QBLK 32`` ...); every C file uses those macros and
lessonkit reads the same lines here, so no number is typed twice. This module imports nothing
from lessonkit: ``lessonkit.validate``, the lowest module, takes its limits from it."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

HEADER_FILE = Path(__file__).resolve().parents[2] / "native" / "flash_attn_q8.h"

# a whole-number macro: "#define NAME 123", optionally followed by a C comment
_DEFINE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)\s+(-?\d+)\s*(?:/\*.*\*/\s*|//.*)?$")


def constants(path: Path | str = HEADER_FILE) -> dict[str, int]:
    """Every ``#define NAME <whole number>`` of the header at ``path``, as {NAME: value}. Macros
    whose value is not a plain whole number (expressions, floats, empty guards) are skipped; a name
    defined twice with different values is an error, since C would then use the last one silently."""
    found: dict[str, int] = {}
    for line in Path(path).read_text().splitlines():
        m = _DEFINE.match(line)
        if m:
            name, value = m.group(1), int(m.group(2))
            if found.get(name, value) != value:
                raise ValueError(f"{Path(path).name} defines {name} twice: {found[name]} and {value}")
            found[name] = value
    return found


def declared(path: Path | str = HEADER_FILE) -> set[str]:
    """The names the header writes before a "(": its functions, what cffi can call by name."""
    return set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", Path(path).read_text()))


def cdef(text: str) -> str:
    """The header's text as cffi's ``cdef`` reads it: without preprocessor lines, a ``#define``
    continued over several lines (a trailing backslash) included. Line numbers stay those of the
    file (each dropped line leaves an empty one), so that cffi's errors point at the student's line."""
    lines, continued = [], False
    for line in text.splitlines():
        directive = continued or line.lstrip().startswith("#")
        continued = directive and line.rstrip().endswith("\\")
        lines.append("" if directive else line)
    return "\n".join(lines)


def _required(values: dict[str, int], name: str) -> int:
    if name not in values:
        raise RuntimeError(f"{HEADER_FILE.name} no longer defines {name}: lessonkit reads it from there")
    return values[name]


_VALUES = constants()
QBLK = _required(_VALUES, "QBLK")        # Q is quantized in blocks of QBLK values
HD_MAX = _required(_VALUES, "HD_MAX")    # largest head_dim of the kernels' fixed buffers
GQA_MAX = _required(_VALUES, "GQA_MAX")  # query heads per grouped call
KVQ_INV = np.float32(1.0) / np.float32(127.0)  # the kernel's KVQ_INV = 1.0f / 127.0f (K/V scales are raw max|x|)
