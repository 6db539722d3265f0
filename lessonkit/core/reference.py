"""Every numpy reference of the workbook, written once (introduced in lesson 00).

- ``softmax``, ``attention``: float64 softmax and attention on unquantized K and V, the ground truth
  every kernel is measured against (``attention`` takes one query or a batch);
- ``scores_from_q_codes``, ``scores_numpy``, ``softmax_weighted_v``, ``kernel_math``: the kernel's
  quantized math step for step in numpy (``lk.attend(..., backend="numpy")``; lesson 01 swaps in
  other Q codes)."""
from __future__ import annotations

import math

import numpy as np

from . import validate as check
from .language import _
from .quant import KVQ_INV, quantize_q

M_START = -1e9  # the kernel's starting value of M (llama.cpp starts at -INFINITY)


def softmax(s) -> np.ndarray:
    """Softmax of a score vector in float64 (max subtracted first)."""
    s = np.asarray(s, np.float64)
    w = np.exp(s - s.max())
    return w / w.sum()


def attention(q, K, V, scale: float | None = None, dtype=np.float64) -> np.ndarray:
    """softmax(scale * K q) V in float64. q ``[hd]`` (or a batch of queries ``[n, hd]``: one output
    row each), K and V ``[seq_len, hd]``; scale defaults to 1/sqrt(hd). Any real dtype is accepted
    and converted to float64. A batch is one matrix product: each row may differ from the one-query
    result in the last bits, since BLAS adds the same terms in another order.
    ``dtype=np.float32`` computes the same in float32 instead: the vectorized numpy peer that
    ``make bench`` times against the kernel (float32 inputs are then used without a copy)."""
    q, K, V = (np.asarray(x, dtype=dtype) for x in (q, K, V))
    if q.ndim not in (1, 2):
        raise ValueError(_("q must have shape [hd] or [n, hd]; got {shape_q}").format(shape_q=list(q.shape)))
    hd = q.shape[-1]
    for name, x in (("K", K), ("V", V)):
        if x.ndim != 2 or x.shape[1] != hd:
            raise ValueError(_("{name} must have shape [seq_len, {hd}]; got {shape_x}").format(
                               name=name, hd=hd, shape_x=list(x.shape)))
    if K.shape[0] != V.shape[0] or K.shape[0] == 0:
        raise ValueError(_("K and V must hold the same number (>= 1) of tokens; got {shape_k} and {shape_v}").format(
                           shape_k=K.shape[0], shape_v=V.shape[0]))
    scale = 1.0 / math.sqrt(hd) if scale is None else check.scale(scale, hd)
    scale = q.dtype.type(scale)  # a Python float would promote float32 products to float64
    if q.ndim == 2:
        s = scale * (q @ K.T)
        w = np.exp(s - s.max(axis=1, keepdims=True))
        return (w @ V) / w.sum(axis=1, keepdims=True)
    s = scale * (K @ q)
    w = np.exp(s - s.max())
    return (w @ V) / w.sum()


def scores_from_q_codes(codes: np.ndarray, q_scales: np.ndarray, cache, kv_head: int,
                        scale: float) -> np.ndarray:
    """The kernel's scores s_t in float32 ``[seq_len]`` for given Q codes and block scales, step
    for step as segment 2 computes them: int32 block dots with K's codes, ``s += dot32 * qsc[b]``
    block by block, then times K's scale/127 and ``scale`` (lesson 01 swaps in other codes)."""
    scale = check.scale(scale, cache.head_dim)
    nblk = cache.head_dim // check.QBLOCK
    codes = np.asarray(codes).astype(np.int32).reshape(nblk, check.QBLOCK)
    q_scales = np.asarray(q_scales, np.float32).reshape(nblk)
    k = cache.k_codes(kv_head).astype(np.int32).reshape(cache.seq_len, nblk, check.QBLOCK)
    dots = np.einsum("tbi,bi->tb", k, codes)
    s = np.zeros(cache.seq_len, np.float32)
    for b in range(nblk):
        s += dots[:, b].astype(np.float32) * q_scales[b]
    ks = cache.k_scales(kv_head) * KVQ_INV
    return s * ks * np.float32(scale)


def scores_numpy(q: np.ndarray, cache, kv_head: int, scale: float) -> np.ndarray:
    """The kernel's scores for query q: Q quantized as segment 1 does, then scores_from_q_codes."""
    return scores_from_q_codes(*quantize_q(q), cache, kv_head, scale)


def softmax_weighted_v(s: np.ndarray, cache, kv_head: int) -> np.ndarray:
    """What segments 3 and 4 compute, all scores at once in float64: the softmax over s with the
    kernel's start M = -1e9 and its S > 0 guard, weights applied to int8 V times V's scale/127.
    float64 ``[head_dim]``."""
    s = np.asarray(s, np.float64)
    w = np.exp(s - max(float(np.float32(M_START)), s.max()))
    total = w.sum()
    vw = w * (cache.v_scales(kv_head).astype(np.float64) / 127.0)
    acc = vw @ cache.v_codes(kv_head).astype(np.float64)
    return acc / total if total > 0 else np.zeros_like(acc)


def kernel_math(q, cache, kv_head, scale) -> np.ndarray:
    """The kernel's quantized math in numpy, all scores at once, float32 ``[head_dim]`` (backend
    "numpy" of ``lk.attend``; arguments already checked there)."""
    return softmax_weighted_v(scores_numpy(q, cache, kv_head, scale), cache, kv_head).astype(np.float32)
