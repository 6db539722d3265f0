"""The registry of the kernel's variants (native/fa_variants.h), as Python reads it.

``VARIANTS`` is a tuple of ``Variant(version, name, function, adds)`` in the registry's order:
``version`` is the index ``fa_time_calls`` takes, ``name`` what ``lessonkit.timing.time_kernel``
takes as ``backend=``, ``function`` the C function (article 9-2's signature), ``adds`` the one idea
that version adds. It is parsed from the header rather than read from the built library so that it
exists at import, without a compiler (a student's build may be broken, or not made yet); the smoke
check of every new build (lessonkit/smoke.py) and tests/test_kernel_accuracy.py check that the
library's own table (``fa_variant_name(i)`` ...) says the same, entry by entry."""
from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from .language import _, from_c

HEADER = Path(__file__).resolve().parents[2] / "native" / "fa_variants.h"


class Variant(NamedTuple):
    version: int
    name: str
    function: str
    adds: str


# one X(...) per line: X(version, "name", function, "adds")
_ROW = re.compile(r'^\s*X\(\s*(\d+)\s*,\s*"([^"]+)"\s*,\s*(\w+)\s*,\s*"((?:[^"\\]|\\.)*)"\s*\)\s*\\?\s*$')


def parse(text: str) -> tuple[Variant, ...]:
    """The X rows of FA_VARIANTS in ``text``; ValueError if there are none or their versions are
    not 0, 1, 2, ... in order (fa_time_calls indexes the table by position)."""
    rows = tuple(Variant(int(m[1]), m[2], m[3], m[4]) for m in map(_ROW.match, text.splitlines()) if m)
    if not rows:
        raise ValueError(_("no X(version, name, function, adds) rows in the registry"))
    if [v.version for v in rows] != list(range(len(rows))):
        raise ValueError(_("registry versions must be 0, 1, 2, ... in order; got {version_v_rows}").format(
                           version_v_rows=[v.version for v in rows]))
    if len({v.name for v in rows}) != len(rows):
        raise ValueError(_("registry names must be unique"))
    return rows


VARIANTS: tuple[Variant, ...] = parse(HEADER.read_text(encoding="utf-8"))
BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANTS}

def adds_text(name: str) -> str:
    """What version ``name`` adds, in the current language (lessonkit.language)."""
    return from_c(BY_NAME[name].adds)

