"""The kernel's own trace (introduced in lesson 02, used in lessons 01 and 04).

``lessonkit.attend(q, cache, kv_head, trace=True)`` runs ``flash_attn_single_q_q8_neon_traced``:
the same C source as the fast kernel, compiled a second time with its trace hooks filled in
(native/flash_attn_q8_traced.c). It returns the output and a ``Trace`` of what the kernel computed."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import native
from . import validate as check
from .cache import attention_args
from .language import _


@dataclass
class Trace:
    """What the compiled kernel computed in one call, token by token."""
    # run_traced(fields=...) may leave a field out: it is None then
    q_codes: np.ndarray   # int8 [hd]: Q after segment 1
    q_scales: np.ndarray  # float32 [hd/32]: one scale per 32-value block of Q
    dots: np.ndarray      # int32 [seq_len, hd/32]: the integer block dots of segment 2
    k_rows: np.ndarray    # uint64 [seq_len]: address of the K row read for token t
    v_rows: np.ndarray    # uint64 [seq_len]: address of the V row read for token t
    s: np.ndarray         # float32 [seq_len]: the score of each token
    M: np.ndarray         # float32 [seq_len]: the running max after token t
    S: np.ndarray         # float32 [seq_len]: the running sum after token t
    ms: np.ndarray        # float32 [seq_len]: the rescale factor exp(M_old - s) where token t raised M, else NaN
    vkq: np.ndarray       # float32 [seq_len, hd]: the unnormalized accumulator after token t
    n_q_quantized: int = 0  # how many times segment 1 (Q to int8) ran in the call

    @property
    def rescaled(self) -> np.ndarray:
        """bool [seq_len]: did token t raise M (and so rescale S and VKQ)?"""
        return ~np.isnan(self.ms)

    @property
    def n_rescales(self) -> int:
        return int(self.rescaled.sum())

    @property
    def seq_len(self) -> int:
        for a in (self.s, self.M, self.S, self.ms, self.k_rows, self.v_rows, self.dots, self.vkq):
            if a is not None:
                return a.shape[0]
        raise ValueError(_("this trace recorded no per-token field"))


FIELDS = ("q_codes", "q_scales", "dots", "k_rows", "v_rows", "s", "M", "S", "ms", "vkq")
_CTYPES = {"q_codes": "int8_t[]", "q_scales": "float[]", "dots": "int32_t[]", "k_rows": "uint64_t[]",
           "v_rows": "uint64_t[]", "s": "float[]", "M": "float[]", "S": "float[]", "ms": "float[]",
           "vkq": "float[]"}
TRACED_FUNCTIONS = ("flash_attn_single_q_q8_neon_traced", "fa_trace_set")


def run_traced(out: np.ndarray, q: np.ndarray, cache, kv_head: int, scale: float | None = None,
               ffi=None, lib=None, fields=None) -> Trace:
    """Call the traced kernel on query ``q`` (float32 ``[head_dim]``) over kv head ``kv_head`` of
    ``cache``, writing the output into ``out`` (float32 ``[head_dim]``, writable); every argument
    is checked first. ``ffi, lib``: another build's library (lesson 06 traces an edited copy),
    default the workbook's. ``fields``: the Trace fields to record (default all of ``FIELDS``);
    the others stay None and the kernel is handed NULL for them. ``vkq`` alone is
    ``seq_len x head_dim`` floats: leave it out when only the scores or M and S are needed."""
    q, kv_head, scale = attention_args(q, cache, kv_head, scale)
    out = check.float32_array("out", out, (cache.head_dim,), writable=True)
    if fields is None:
        fields = FIELDS
    elif isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
        raise TypeError(_("fields must be a tuple of Trace field names, e.g. ('s', 'M', 'S'); got "
                          "{short_fields_check}").format(short_fields_check=check.short(fields)))
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ValueError(_("fields {unknown} are not Trace fields; choose from {fields}").format(
                           unknown=unknown, fields=', '.join(FIELDS)))
    return traced(out, q, cache, kv_head, scale, *native.library(ffi, lib, TRACED_FUNCTIONS), fields)


def traced(out, q, cache, kv_head, scale, ffi=None, lib=None, fields=FIELDS) -> Trace:
    """``run_traced`` with arguments already checked (``lk.attend(..., trace=True)`` has checked them)."""
    if ffi is None:
        ffi, lib = native.load()
    args = cache.kernel_args(kv_head, ffi, lib)  # first: the trace is sized for the tokens the call reads
    T, hd = args[4], cache.head_dim  # (another thread may append meanwhile; this call reads only these)
    nblk = hd // check.QBLOCK
    shapes = {"q_codes": ((hd,), np.int8), "q_scales": ((nblk,), np.float32), "dots": ((T, nblk), np.int32),
              "k_rows": ((T,), np.uint64), "v_rows": ((T,), np.uint64), "s": ((T,), np.float32),
              "M": ((T,), np.float32), "S": ((T,), np.float32), "ms": ((T,), np.float32),
              "vkq": ((T, hd), np.float32)}
    arrays = {f: (np.full(shapes[f][0], np.nan, shapes[f][1]) if f == "ms" else np.zeros(*shapes[f]))
              if f in fields else None for f in FIELDS}
    result = Trace(**arrays)
    c = ffi.new("fa_trace *")  # every pointer starts NULL: the kernel skips what is not recorded
    keep = []  # the buffers must outlive the call
    for field in fields:
        keep.append(ffi.from_buffer(_CTYPES[field], getattr(result, field), require_writable=True))
        setattr(c, field, keep[-1])
    lib.fa_trace_set(c)
    try:
        lib.flash_attn_single_q_q8_neon_traced(ffi.from_buffer("float[]", out, require_writable=True),
                                               ffi.from_buffer("float[]", q), *args, hd, scale)
    finally:
        lib.fa_trace_set(ffi.NULL)
    result.n_q_quantized = int(c.n_q_quantized)
    return result
