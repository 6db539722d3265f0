"""Segment 1 taken apart: Q's per-32 quantization under other rounding rules, and attention
recomputed in numpy with substituted Q codes (introduced in lesson 01).

Only the engine's rule (``"engine"``: ``(int)(v + (v >= 0 ? 0.5 : -0.5))``) runs in the compiled
kernel. The other rules exist here so that a lesson can measure what a different choice would
have cost; ``attend_with_q_codes`` recomputes the kernel's math in numpy around any Q codes."""
from __future__ import annotations

import numpy as np

from . import validate as check
from .cache import KVCacheQ8
from .reference import attention, scores_from_q_codes, softmax_weighted_v
from .quant import KVQ_INV
from .language import tr
from .validate import QBLOCK, float32_array, head_dim

#: the rounding rules lesson 01 compares, by name
RULES = ("engine", "roundf", "ties_even", "trunc")

RULE_LABELS = {
    "engine": "engine: (int)(v + (v>=0 ? 0.5 : -0.5))",
    "roundf": "C roundf (ties away, exact)",
    "ties_even": "ties to even (vcvtnq_s32_f32)",
    "trunc": "truncation (int)v",
}


def q_block_scaled(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values segment 1 rounds, before rounding: ``v = q * (127 / qm)`` per 32-block in float32,
    with the kernel's guard (``qm < 1e-6 -> qm = 1``). q is float32 ``[hd]`` or a batch ``[n, hd]``.
    Returns (v float32, same shape as q; scales float32 ``[hd/32]`` or ``[n, hd/32]``), the scales
    being qm / 127 as the kernel stores them."""
    if not isinstance(q, np.ndarray) or q.ndim not in (1, 2):
        raise ValueError(tr("q must be a float32 numpy array of shape [hd] or [n, hd]",
                            "q 必须是形状为 [hd] 或 [n, hd] 的 float32 numpy 数组"))
    q = float32_array("q", q, (None,) * q.ndim)
    hd = head_dim(q.shape[-1])
    blocks = q.reshape(*q.shape[:-1], hd // QBLOCK, QBLOCK)
    qm = np.abs(blocks).max(axis=-1)
    qm = np.where(qm < np.float32(1e-6), np.float32(1.0), qm).astype(np.float32)
    v = (blocks * (np.float32(127.0) / qm)[..., None]).astype(np.float32)
    return v.reshape(q.shape), (qm * KVQ_INV).astype(np.float32)


def round_codes(v: np.ndarray, rule: str) -> np.ndarray:
    """Round float32 values ``v`` to int8 codes with ``rule`` (one of RULES), then clamp to
    [-128, 127].

    - "engine": ``(int)(v + (v >= 0 ? 0.5f : -0.5f))``, the addition done in float32 (so
      0.49999997f + 0.5f rounds to 1.0f and the code is 1);
    - "roundf": C's roundf, halfway cases away from zero, computed exactly (0.49999997f -> 0);
    - "ties_even": round to nearest, halfway cases to the even integer (NEON's vcvtnq_s32_f32,
      numpy's rint);
    - "trunc": toward zero, the plain C cast ``(int)v``.
    """
    v = np.asarray(v, np.float32)
    if rule == "engine":
        half = np.where(v >= 0, np.float32(0.5), np.float32(-0.5)).astype(np.float32)
        r = np.trunc((v + half).astype(np.float32))
    elif rule == "roundf":
        a = np.abs(v.astype(np.float64))
        r = np.sign(v) * np.floor(a + 0.5)  # exact: a float32 plus 0.5 is exact in float64 here
    elif rule == "ties_even":
        r = np.rint(v)
    elif rule == "trunc":
        r = np.trunc(v)
    else:
        raise ValueError(tr(f"rule must be one of {', '.join(map(repr, RULES))}; got {rule!r}",
                            f"rule 必须是 {', '.join(map(repr, RULES))} 之一；收到的是 {rule!r}"))
    return np.clip(r, -128, 127).astype(np.int8)


def quantize_q_rule(q: np.ndarray, rule: str = "engine") -> tuple[np.ndarray, np.ndarray]:
    """Segment 1 with another rounding rule: (codes int8 [hd], scales float32 [hd/32]).
    With rule "engine" this is exactly ``lessonkit.quant.quantize_q``."""
    v, scales = q_block_scaled(q)
    return round_codes(v, rule), scales


def attend_with_q_codes(codes: np.ndarray, q_scales: np.ndarray, cache: KVCacheQ8, kv_head: int,
                        scale: float) -> np.ndarray:
    """The kernel's output recomputed in numpy around substituted Q codes, with the cache's own
    int8 K/V codes and scales (float64 [hd]). With the engine's codes it reproduces the kernel
    to float32 rounding."""
    return softmax_weighted_v(scores_from_q_codes(codes, q_scales, cache, kv_head, scale), cache, kv_head)


def attend_float_q(q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float) -> np.ndarray:
    """Attention with Q left unquantized (float64) against the cache's int8 K and V: the baseline
    that isolates what Q's quantization adds. float64 [hd]."""
    K, _ = cache.dequantized(kv_head)
    s = (K.astype(np.float64) @ np.asarray(q, np.float64)) * check.scale(scale, cache.head_dim)
    return softmax_weighted_v(s, cache, kv_head)


def outlier_q(head_dim: int, rng: np.random.Generator, channels=(5, 6, 70), factor: float = 20.0,
              sigma: float = 1.0) -> np.ndarray:
    """A query that looks like a real model's: Gaussian channels of std ``sigma``, plus a few
    outlier channels ``factor`` times larger (float32 [head_dim])."""
    q = rng.standard_normal(head_dim).astype(np.float32) * np.float32(sigma)
    idx = np.asarray(channels)
    q[idx] = np.where(q[idx] < 0, np.float32(-factor * sigma), np.float32(factor * sigma))
    return q


def dot_error_sigma(q: np.ndarray, K: np.ndarray, q_scales: np.ndarray, k_scales: np.ndarray) -> np.ndarray:
    """Predicted standard deviation of (quantized dot - exact dot) for q against each row of K,
    if every rounding error is uniform in half a step either side (variance step^2 / 12):
    var = (k_step^2 / 12) * sum_i q_i^2 + sum_b (q_step_b^2 / 12) * sum_{i in b} k_i^2,
    with q_step_b = q_scales[b] and k_step = k_scales / 127 (raw max scales). float64 [n]."""
    q = np.asarray(q, np.float64)
    K = np.asarray(K, np.float64)
    qs = np.asarray(q_scales, np.float64)
    kstep = np.asarray(k_scales, np.float64) / 127.0
    nblk = qs.shape[0]
    k_energy = (K.reshape(K.shape[0], nblk, -1) ** 2).sum(axis=2)   # [n, nblk]
    var = kstep ** 2 / 12.0 * (q ** 2).sum() + (k_energy * qs ** 2 / 12.0).sum(axis=1)
    return np.sqrt(var)


def rule_errors(q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float, K: np.ndarray,
                V: np.ndarray) -> dict[str, dict[str, float]]:
    """For each rule in RULES: quantize q with it, recompute the kernel's output in numpy with those
    codes and the cache's int8 K/V, and measure it. Returns ``{rule: {...}}`` with
    ``q_rms``, ``q_max``: |code - v| in units of the block's step (RMS and max over q's values);
    ``q_bias``: mean of (code - v) * sign(v), negative = toward zero;
    ``out_vs_float_q``: RMS of (output - output with unquantized q), same int8 K/V: Q's share;
    ``out_vs_exact``: RMS of (output - float64 attention on the unquantized K, V).
    K, V: the float32 ``[seq_len, hd]`` rows of this kv head before quantization."""
    v, scales = q_block_scaled(q)
    scale = check.scale(scale, cache.head_dim)
    base = attend_float_q(q, cache, kv_head, scale)
    exact = attention(q, K, V, scale)
    result = {}
    for rule in RULES:
        codes = round_codes(v, rule)
        d = codes.astype(np.float64) - v
        out = attend_with_q_codes(codes, scales, cache, kv_head, scale)
        result[rule] = dict(q_rms=float(np.sqrt(np.mean(d ** 2))), q_max=float(np.abs(d).max()),
                            q_bias=float(np.mean(d * np.sign(v))),
                            out_vs_float_q=float(np.sqrt(np.mean((out - base) ** 2))),
                            out_vs_exact=float(np.sqrt(np.mean((out - exact) ** 2))))
    return result
