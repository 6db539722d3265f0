"""The kernel's own trace (introduced in lesson 02, used in lessons 01 and 04).

``lessonkit.attend(q, cache, kv_head, trace=True)`` runs ``flash_attn_single_q_q8_neon_traced``:
the same C source as the fast kernel, compiled a second time with its trace hooks filled in
(native/flash_attn_q8_traced.c). It returns the output and a ``Trace`` of what the kernel computed."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import native


@dataclass
class Trace:
    """What the compiled kernel computed in one call, token by token."""
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
        return self.s.shape[0]


def run_traced(out: np.ndarray, q: np.ndarray, cache, kv_head: int, scale: float,
               ffi=None, lib=None) -> Trace:
    """Call the traced kernel, writing the output into ``out``; arguments already checked.
    ``ffi, lib``: another build's library (lesson 06 traces an edited copy), default the workbook's."""
    if lib is None:
        ffi, lib = native.load()
    args = cache.kernel_args(kv_head, ffi)  # first: the trace is sized for the tokens the call reads
    T, hd = args[4], cache.head_dim
    nblk = hd // 32
    tr = Trace(q_codes=np.zeros(hd, np.int8), q_scales=np.zeros(nblk, np.float32),
               dots=np.zeros((T, nblk), np.int32), k_rows=np.zeros(T, np.uint64),
               v_rows=np.zeros(T, np.uint64), s=np.zeros(T, np.float32),
               M=np.zeros(T, np.float32), S=np.zeros(T, np.float32),
               ms=np.full(T, np.nan, np.float32), vkq=np.zeros((T, hd), np.float32))
    c = ffi.new("fa_trace *")
    keep = []  # the buffers must outlive the call
    for field, ctype in (("q_codes", "int8_t[]"), ("q_scales", "float[]"), ("dots", "int32_t[]"),
                         ("k_rows", "uint64_t[]"), ("v_rows", "uint64_t[]"),
                         ("s", "float[]"), ("M", "float[]"), ("S", "float[]"), ("ms", "float[]"),
                         ("vkq", "float[]")):
        buf = ffi.from_buffer(ctype, getattr(tr, field), require_writable=True)
        keep.append(buf)
        setattr(c, field, buf)
    lib.fa_trace_set(c)
    try:
        lib.flash_attn_single_q_q8_neon_traced(
            ffi.from_buffer("float[]", out, require_writable=True), ffi.from_buffer("float[]", q),
            *args, hd, scale)
    finally:
        lib.fa_trace_set(ffi.NULL)
    tr.n_q_quantized = int(c.n_q_quantized)
    return tr
