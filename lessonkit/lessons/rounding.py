"""Segment 1 taken apart (lesson 01): Q's per-32 quantization under other rounding rules, and the kernel's math
recomputed in numpy around substituted Q codes. Only "engine" runs in the kernel."""
from __future__ import annotations

import numpy as np

from ..core import validate as check
from ..core.cache import KVCacheQ8
from ..core.language import _
from ..core.quant import KVQ_INV
from ..core.reference import attention, scores_from_q_codes, softmax_weighted_v

RULES = ("engine", "roundf", "ties_even", "trunc")


def q_block_scaled(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float32 values segment 1 rounds, ``q * (127 / qm)`` per 32-block (``qm < 1e-6 -> 1``), for ``q [hd]`` or
    ``[n, hd]``, and the block scales ``qm / 127`` as the kernel stores them."""
    if not isinstance(q, np.ndarray) or q.ndim not in (1, 2):
        raise ValueError(_("q must be a float32 numpy array of shape [hd] or [n, hd]"))
    q = check.float32_array("q", q, (None,) * q.ndim)
    blocks = q.reshape(*q.shape[:-1], check.head_dim(q.shape[-1]) // check.QBLOCK, check.QBLOCK)
    qm = np.abs(blocks).max(axis=-1)
    qm = np.where(qm < np.float32(1e-6), np.float32(1.0), qm).astype(np.float32)
    v = (blocks * (np.float32(127.0) / qm)[..., None]).astype(np.float32)
    return v.reshape(q.shape), (qm * KVQ_INV).astype(np.float32)


def round_codes(v: np.ndarray, rule: str) -> np.ndarray:
    """float32 ``v`` rounded to int8 codes by ``rule``, clamped to [-128, 127]: "engine"
    ``(int)(v + (v >= 0 ? 0.5f : -0.5f))`` with a float32 addition (0.49999997f -> 1), "roundf"
    exact ties away from zero (0.49999997f -> 0), "ties_even" (vcvtnq_s32_f32), "trunc" ``(int)v``."""
    v = np.asarray(v, np.float32)
    if check.one_of("rule", rule, RULES) == "engine":
        r = np.trunc((v + np.where(v >= 0, np.float32(0.5), np.float32(-0.5))).astype(np.float32))
    elif rule == "roundf":
        r = np.sign(v) * np.floor(np.abs(v.astype(np.float64)) + 0.5)  # exact in float64
    elif rule == "ties_even":
        r = np.rint(v)
    else:  # "trunc"
        r = np.trunc(v)
    return np.clip(r, -128, 127).astype(np.int8)


def quantize_q_rule(q: np.ndarray, rule: str = "engine") -> tuple[np.ndarray, np.ndarray]:
    """Segment 1 with ``rule``: (codes int8, scales float32); "engine" is ``quant.quantize_q``."""
    v, scales = q_block_scaled(q)
    return round_codes(v, rule), scales


def attend_with_q_codes(codes, q_scales, cache: KVCacheQ8, kv_head: int, scale: float) -> np.ndarray:
    """The kernel's output in numpy float64 around substituted Q codes and the cache's int8 K/V."""
    return softmax_weighted_v(scores_from_q_codes(codes, q_scales, cache, kv_head, scale), cache, kv_head)


def attend_float_q(q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float) -> np.ndarray:
    """Unquantized q (float64) against the cache's int8 K and V: Q's quantization left out."""
    K, unused = cache.dequantized(kv_head)
    s = (K.astype(np.float64) @ np.asarray(q, np.float64)) * check.scale(scale, cache.head_dim)
    return softmax_weighted_v(s, cache, kv_head)


def outlier_q(head_dim: int, rng: np.random.Generator, channels=(5, 6, 70), factor: float = 20.0,
              sigma: float = 1.0) -> np.ndarray:
    """A query like a real model's: N(0, sigma) channels, and ``channels`` at +-factor * sigma."""
    q = rng.standard_normal(head_dim).astype(np.float32) * np.float32(sigma)
    idx = np.asarray(channels)
    q[idx] = np.where(q[idx] < 0, np.float32(-factor * sigma), np.float32(factor * sigma))
    return q


def dot_error_sigma(q, K, q_scales, k_scales) -> np.ndarray:
    """Predicted std of (quantized - exact) q.k per row of K if each rounding error is uniform over a step (variance
    step^2 / 12): ``(k_step^2/12) sum q_i^2 + sum_b (qsc_b^2/12) sum_{i in b} k_i^2``."""
    q, K, qs = (np.asarray(a, np.float64) for a in (q, K, q_scales))
    kstep = np.asarray(k_scales, np.float64) / 127.0
    k_energy = (K.reshape(K.shape[0], qs.shape[0], -1) ** 2).sum(axis=2)
    return np.sqrt(kstep ** 2 / 12.0 * (q ** 2).sum() + (k_energy * qs ** 2 / 12.0).sum(axis=1))


def rule_errors(q, cache: KVCacheQ8, kv_head: int, scale: float, K, V) -> dict[str, dict[str, float]]:
    """Per rule: |code - v| in steps (``q_rms``, ``q_max``), ``q_bias`` (mean (code - v) sign(v), < 0 toward zero),
    the output's RMS error against unquantized q and against float64 attention on the unquantized K, V rows."""
    v, scales = q_block_scaled(q)
    scale = check.scale(scale, cache.head_dim)
    base, exact = attend_float_q(q, cache, kv_head, scale), attention(q, K, V, scale)
    result = {}
    for rule in RULES:
        codes = round_codes(v, rule)
        d = codes.astype(np.float64) - v
        out = attend_with_q_codes(codes, scales, cache, kv_head, scale)
        rms = lambda x: float(np.sqrt(np.mean(x ** 2)))  # noqa: E731
        result[rule] = dict(q_rms=rms(d), q_max=float(np.abs(d).max()), q_bias=float(np.mean(d * np.sign(v))),
                            out_vs_float_q=rms(out - base), out_vs_exact=rms(out - exact))
    return result
