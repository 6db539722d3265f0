"""``attend``: one query head over a KVCacheQ8, through the compiled kernel (lesson 00)."""
from __future__ import annotations

import numpy as np

from . import native
from . import validate as check
from .cache import KVCacheQ8
from .quant import KVQ_INV, quantize_q
from .trace import Trace, run_traced

# backend name -> the C function it calls ("numpy" is computed in numpy)
KERNELS = {"neon": "flash_attn_single_q_q8_neon", "scalar": "flash_attn_single_q_q8_scalar",
           "two_pass_scores": "flash_attn_two_pass_scores_q8",
           "two_pass_recompute": "flash_attn_two_pass_recompute_q8"}
BACKENDS = (*KERNELS, "numpy")
M_START = np.float32(-1e9)  # the kernel's starting value of M


def attend(q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float | None = None,
           backend: str = "neon", trace: bool = False) -> np.ndarray | tuple[np.ndarray, Trace]:
    """Attention output float32 ``[head_dim]`` of query ``q`` (float32 ``[head_dim]``) over
    kv head ``kv_head`` of ``cache``.

    backend: "neon" calls flash_attn_single_q_q8_neon (SIMDe's NEON off ARM), "scalar" the plain C
    reference, "numpy" the same quantized math written in numpy; "two_pass_scores" and
    "two_pass_recompute" the article's section-3 alternatives (lesson 05). scale defaults to
    1/sqrt(head_dim).
    trace=True (backend "neon" only) runs the traced build of the same kernel and returns
    ``(out, lessonkit.trace.Trace)``: Q's codes, the block dots, and s, M, S, VKQ after every token.
    """
    if not isinstance(cache, KVCacheQ8):
        raise TypeError(f"cache must be a lessonkit.KVCacheQ8; got {type(cache).__name__}")
    q = check.float32_array("q", q, (cache.head_dim,))
    kv_head = check.integer("kv_head", kv_head, minimum=0, below=cache.n_kv_heads)
    scale = check.scale(scale, cache.head_dim)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
    if cache.seq_len == 0:
        raise ValueError("the cache is empty: append at least one token before attending")
    if not isinstance(trace, bool):
        raise TypeError(f"trace must be True or False; got {trace!r}")
    if trace:
        if backend != "neon":
            raise ValueError(f"trace=True records the compiled kernel: use backend='neon', not {backend!r}")
        out = np.empty(cache.head_dim, np.float32)
        return out, run_traced(out, q, cache, kv_head, scale)
    if backend == "numpy":
        return _attend_numpy(q, cache, kv_head, scale)

    ffi, lib = native.load()
    kernel = getattr(lib, KERNELS[backend])
    out = np.empty(cache.head_dim, np.float32)
    kernel(ffi.from_buffer("float[]", out, require_writable=True), ffi.from_buffer("float[]", q),
           *cache.kernel_args(kv_head, ffi), cache.head_dim, scale)
    return out


def scores_from_q_codes(codes: np.ndarray, q_scales: np.ndarray, cache: KVCacheQ8, kv_head: int,
                        scale: float) -> np.ndarray:
    """The kernel's scores s_t in float32 ``[seq_len]`` for given Q codes and block scales, step
    for step as segment 2 computes them: int32 block dots with K's codes, ``s += dot32 * qsc[b]``
    block by block, then times K's scale/127 and ``scale`` (lesson 01 swaps in other codes)."""
    scale = check.scale(scale, cache.head_dim)
    nblk = cache.head_dim // 32
    codes = np.asarray(codes).astype(np.int32).reshape(nblk, 32)
    q_scales = np.asarray(q_scales, np.float32).reshape(nblk)
    k = cache.k_codes(kv_head).astype(np.int32).reshape(cache.seq_len, nblk, 32)
    dots = np.einsum("tbi,bi->tb", k, codes)
    s = np.zeros(cache.seq_len, np.float32)
    for b in range(nblk):
        s += dots[:, b].astype(np.float32) * q_scales[b]
    ks = cache.k_scales(kv_head) * KVQ_INV
    return s * ks * np.float32(scale)


def scores_numpy(q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float) -> np.ndarray:
    """The kernel's scores for query q: Q quantized as segment 1 does, then scores_from_q_codes."""
    return scores_from_q_codes(*quantize_q(q), cache, kv_head, scale)


def softmax_weighted_v(s: np.ndarray, cache: KVCacheQ8, kv_head: int) -> np.ndarray:
    """What segments 3 and 4 compute, all scores at once in float64: the softmax over s with the
    kernel's start M = -1e9 and its S > 0 guard, weights applied to int8 V times V's scale/127.
    float64 ``[head_dim]``."""
    s = np.asarray(s, np.float64)
    w = np.exp(s - max(float(M_START), s.max()))
    total = w.sum()
    vw = w * (cache.v_scales(kv_head).astype(np.float64) / 127.0)
    acc = vw @ cache.v_codes(kv_head).astype(np.float64)
    return acc / total if total > 0 else np.zeros_like(acc)


def _attend_numpy(q, cache, kv_head, scale) -> np.ndarray:
    """The kernel's quantized math in numpy, all scores at once (backend="numpy")."""
    return softmax_weighted_v(scores_numpy(q, cache, kv_head, scale), cache, kv_head).astype(np.float32)
