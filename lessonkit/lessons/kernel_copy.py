"""Editing a copy of the kernel: "break it, rebuild, see" (article 9-2, section 3; lessons 04 and 06), a temporary
copy or the student's ``my-work/native/``. ``native.load(src_dir=copy)`` checks the build in a child process first:
an edit that does not compile, crashes, hangs or computes wrong results is refused, and the student's process keeps
its state and its library. Also tier B's copy of the kernel without its segment markers (lesson 06)."""
from __future__ import annotations

import math
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import attention, native
from ..display import source
from . import workspace
from ..core import validate as check
from ..core.cache import KVCacheQ8, attention_call
from ..core.files import write_atomic
from ..core.language import _
from ..core.reference import softmax as softmax_weights  # noqa: F401  (the right weights, lesson 06)
from .synthetic import cache_with_scores
from ..core.trace import TRACED_FUNCTIONS, Trace, run_traced
from .toy import KERNEL


def copy_native(parent: Path | str | None = None) -> Path:
    """native/ (not its tests/) copied into ``parent`` (default: a new temporary folder); its builds go to
    ``<copy>/../.build``."""
    parent = Path(tempfile.mkdtemp(prefix="native_copy_") if parent is None else parent)
    dest = parent / "native"
    shutil.copytree(native.NATIVE_DIR, dest, ignore=shutil.ignore_patterns("tests"))
    return dest


@dataclass(frozen=True)
class Edit:
    """Replace the one line of ``file`` (inside kernel segment ``segment``, if given) that contains
    ``text`` by ``new`` (with the old line's indentation); ``new=None`` comments it out."""
    file: str
    text: str
    new: str | None = None
    segment: int | None = None


@dataclass(frozen=True)
class Change:
    file: str
    line: int
    old: str
    new: str


@dataclass
class BrokenKernel:
    kind: str
    copy: Path
    changes: list[Change]
    ffi: object
    lib: object
    folder: tempfile.TemporaryDirectory   # removed with the process; removed sooner, the next break_kernel builds anew


def edit_line(copy: Path | str, edit: Edit) -> Change:
    """One Edit applied to a copy of native/, never to native/ itself."""
    if not isinstance(edit, Edit):
        raise TypeError(_("edit must be a lessonkit.debug.Edit; got {edit}").format(edit=type(edit).__name__))
    copy = Path(copy).resolve()
    path = (copy / edit.file).resolve()
    if copy == native.NATIVE_DIR.resolve() or not path.is_relative_to(copy):
        raise ValueError(_("edit a copy (lessonkit.debug.copy_native()), not the workbook's native/"))
    n = source.find_line(edit.text, segment=edit.segment, path=path)
    lines = path.read_text().splitlines(keepends=True)
    old = lines[n - 1].rstrip("\n")
    new = old[:len(old) - len(old.lstrip())] + (edit.new if edit.new is not None
                                                  else f"// removed in lesson 06: {old.strip()}")
    lines[n - 1] = new + "\n"
    write_atomic(path, "".join(lines))
    native.sources_changed()  # the next load() of the copy looks at its files at once
    return Change(edit.file, n, old, new)


BREAKS = {
    # article section 3: no online rescale. On a new max, S and VKQ keep their old scale.
    "no_rescale": (Edit(source.KERNEL_FILE.name, "S *= ms;", segment=3),
                   Edit(source.KERNEL_FILE.name, "vmulq_f32(vld1q_f32(VKQ + i), msv)", segment=3)),
    # q_code: truncation toward zero instead of rounding half away from zero
    "truncate": (Edit(source.SIMD_HEADER.name, "int r = (int)(v + (v >= 0.0f ? 0.5f : -0.5f));", "int r = (int)v;"),),
}
_broken: dict[str, BrokenKernel] = {}


def break_kernel(kind: str) -> BrokenKernel:
    """``BREAKS[kind]`` in a copy of native/, built and loaded once per kind and process (a notebook and the
    exercise checks share it). Loaded with ``verify="crashes"``: its check in a child process still refuses a
    crash or a hang, and lets the wrong results through."""
    check.one_of("kind", kind, BREAKS)
    if kind not in _broken or not _broken[kind].copy.is_dir():
        folder = tempfile.TemporaryDirectory(prefix="native_copy_")
        copy = copy_native(folder.name)
        changes = [edit_line(copy, e) for e in BREAKS[kind]]
        with warnings.catch_warnings():  # wrong results are the point here: the lesson shows them
            warnings.simplefilter("ignore", native.BuildWarning)
            ffi, lib = native.load(src_dir=copy, verify="crashes")
        _broken[kind] = BrokenKernel(kind, copy, changes, ffi, lib, folder)
    return _broken[kind]


def _checked_call(ffi, lib, functions, q, cache: KVCacheQ8, kv_head: int, scale: float) -> tuple:
    ffi, lib = native.library(ffi, lib, functions)
    kv_head, scale = attention_call(cache, kv_head, scale)   # the cache first: q's shape is its head_dim
    return ffi, lib, np.empty(cache.head_dim, np.float32), check.float32_like("q", q, (cache.head_dim,)), kv_head, scale


def call_kernel(ffi, lib, q, cache: KVCacheQ8, kv_head: int, scale: float) -> np.ndarray:
    """The kernel of a library (an edited copy's; ``None, None``: the workbook's), after the checks: it keeps the
    workbook's signature, q (converted to float32) is finite with head_dim values, kv_head is one of the
    cache's, scale is finite in float32."""
    ffi, lib, out, q, kv_head, scale = _checked_call(ffi, lib, (KERNEL,), q, cache, kv_head, scale)
    return attention.call_kernel(ffi, lib, out, q, cache, kv_head, scale)


def trace_with(ffi, lib, q, cache: KVCacheQ8, kv_head: int, scale: float) -> Trace:
    """The traced build of a library (an edited copy's from its edited source), checked as ``call_kernel``."""
    ffi, lib, out, q, kv_head, scale = _checked_call(ffi, lib, TRACED_FUNCTIONS, q, cache, kv_head, scale)
    return run_traced(out, q, cache, kv_head, scale, ffi, lib)


def kernel_weights(ffi, lib, scores) -> np.ndarray:
    """The weights a library's kernel gives ``scores`` (float32 [n], 1 <= n <= 256): a cache whose scores are these
    and whose V rows are one-hot (V[t] = e_t), so that output element t IS the weight the kernel gave token t."""
    ffi, lib = native.library(ffi, lib, (KERNEL,))
    s = check.float32_like("scores", scores, (None,))
    if not 1 <= s.shape[0] <= 256:
        raise ValueError(_("kernel_weights takes 1 to 256 scores; got {shape_s}").format(shape_s=s.shape[0]))
    hd = 32 * math.ceil(s.shape[0] / 32)   # one column per token
    cache, q, scale = cache_with_scores(s, head_dim=hd, block_size=16, V=np.eye(s.shape[0], hd, dtype=np.float32))
    return attention.call_kernel(ffi, lib, np.empty(hd, np.float32), q, cache, 0, scale)[:cache.seq_len]


# ------------------------------------------------------------------ tier B: the kernel without its markers

UNMARKED_NAME = "06_kernel_without_markers.c"
_MARKER = re.compile(r"^\s*/\* == (end )?segment \d")


def _unmarked(path: Path) -> tuple[list[str], dict[int, int]]:
    """The kernel's lines without the segment markers (and the header's sentence about them), and the map old
    line number -> new line number of every kept line."""
    kept, new_of = [], {}
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if _MARKER.search(line) or "segment N ==" in line or "lessons' line ranges through them" in line:
            continue
        if kept and line.strip() == "*" and kept[-1].strip() == "*":
            continue   # the header's paragraph break, left twice by the sentence removed above
        kept.append(line)
        new_of[n] = len(kept)
    return kept, new_of


def unmarked_kernel(dest: Path | str | None = None, path: Path | str = source.KERNEL_FILE) -> Path:
    """The kernel file without its ``== segment N ==`` comments, for tier B (lesson 06): the parts are found by
    reading the code. Default ``dest``: ``my-work/06_kernel_without_markers.c``, written whole or not at all."""
    dest = Path(dest) if dest is not None else workspace.WORK_DIR / UNMARKED_NAME
    dest.parent.mkdir(parents=True, exist_ok=True)
    kept, unused = _unmarked(Path(path))
    return write_atomic(dest, "\n".join(kept) + "\n")


def unmarked_segments(path: Path | str = source.KERNEL_FILE) -> dict[int, tuple[tuple[int, int], tuple[int, int]]]:
    """For each part, in ``unmarked_kernel``'s line numbers: the accepted start lines and end lines (inclusive
    ranges); a blank line, a comment or a TRACE_ hook at a part's edge may be in or out."""
    lines = [line.strip() for line in Path(path).read_text().splitlines()]
    unused, new_of = _unmarked(Path(path))
    out = {}
    for n, seg in source.kernel_segments(path).items():
        inner = list(range(seg.begin + 1, seg.end))
        core = [k for k in inner if lines[k - 1] and not lines[k - 1].startswith(("/*", "//", "*", "TRACE_"))]
        if not core:
            raise ValueError(_("segment {n} of {path} has no code").format(n=n, path=Path(path).name))
        out[n] = ((new_of[inner[0]], new_of[core[0]]), (new_of[core[-1]], new_of[inner[-1]]))
    return out
