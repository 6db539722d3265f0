"""Timing the compiled kernels (introduced in lesson 01): the call loop runs in C
(native/fa_timing.c), Python takes the median of several repeats. Every timing a lesson shows is
labelled with ``lessonkit.env.machine_label()``: on x86-64 it times SIMDe, not NEON."""
from __future__ import annotations

import math

import numpy as np

from . import native
from . import validate as check
from .cache import KVCacheQ8

VARIANTS = {"neon": 0, "scalar": 1, "two_pass_scores": 2, "two_pass_recompute": 3}  # fa_time_calls


def time_kernel(q: np.ndarray, cache: KVCacheQ8, kv_head: int = 0, backend: str = "neon",
                seq_len: int | None = None, scale: float | None = None, repeats: int = 7,
                number: int | None = None, min_repeat_s: float = 0.02, cold: bool = False,
                defines: dict | None = None) -> float:
    """Median nanoseconds per kernel call over ``repeats`` repeats of ``number`` back-to-back calls
    (warm: after the first call, whatever fits in the caches is there).

    ``seq_len`` (default: the whole cache) may be smaller than the cache, down to 0: a call with
    seq_len 0 runs only segment 1 (Q to int8) and segment 4. ``number`` defaults to enough calls
    for one repeat to last about ``min_repeat_s`` seconds. ``cold=True`` instead times single
    calls after writing a buffer of 4 x the last-level cache (at least 64 MiB), so that the KV
    comes from DRAM. ``defines`` selects a build, e.g. ``{"FA_PREFETCH": 0}`` (lesson 05)."""
    if not isinstance(cache, KVCacheQ8):
        raise TypeError(f"cache must be a lessonkit.KVCacheQ8; got {type(cache).__name__}")
    q = check.float32_array("q", q, (cache.head_dim,))
    if backend not in VARIANTS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, VARIANTS))}; got {backend!r}")
    T = cache.seq_len if seq_len is None else check.integer("seq_len", seq_len, minimum=0,
                                                             below=cache.seq_len + 1)
    scale = 1.0 / math.sqrt(cache.head_dim) if scale is None else check.finite_float("scale", scale)
    repeats = check.integer("repeats", repeats, minimum=1)
    ffi, lib = native.load(defines=defines)
    out = np.empty(cache.head_dim, np.float32)
    k, v, ks, vs, _, kv_dim, kv_bs, nkv, kh_off = cache.kernel_args(kv_head, ffi)
    args = (ffi.from_buffer("float[]", out, require_writable=True), ffi.from_buffer("float[]", q),
            k, v, ks, vs, T, kv_dim, kv_bs, nkv, kh_off, cache.head_dim, scale)

    if cold:
        flush = _flush_buffer()
        fbuf = ffi.from_buffer("unsigned char[]", flush, require_writable=True)
        return float(np.median([lib.fa_time_call_cold(VARIANTS[backend], fbuf, flush.nbytes, *args)
                                for _ in range(repeats)]))

    return median_calls(lambda n: lib.fa_time_calls(VARIANTS[backend], n, *args), repeats, number,
                        min_repeat_s)


def median_calls(run, repeats: int, number: int | None, min_repeat_s: float) -> float:
    """Median of ``repeats`` results of ``run(number)`` (a C loop of ``number`` calls returning ns
    per call); ``number=None`` picks enough calls for one repeat to last ``min_repeat_s``."""
    if number is None:
        number = 1
        while number < 1 << 30 and run(number) * number < min_repeat_s * 1e9:
            number *= 4
    number = check.integer("number", number, minimum=1)
    return float(np.median([run(number) for _ in range(repeats)]))


def _last_level_bytes() -> int:
    try:
        from .traffic import host_preset
        return host_preset().ll.size
    except Exception:  # no /sys (macOS): assume a large last level
        return 64 << 20


_flush: list[np.ndarray] = []


def _flush_buffer() -> np.ndarray:
    """The buffer written before a cold call: 4 x the last-level cache, at least 64 MiB,
    allocated once per process."""
    if not _flush:
        _flush.append(np.zeros(max(64 << 20, 4 * _last_level_bytes()), np.uint8))
    return _flush[0]
