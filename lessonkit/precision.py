"""How precise is q8 KV? The helpers of lesson 07 (a preview of article 9-3): error metrics, the
split of the kernel's error into Q's part and K/V's part, K/V quantized other ways in numpy, and
the attention over those values (introduced in lesson 07).

The compiled kernel implements one scheme only, this engine's: one raw ``max|x|`` per
(token, kv head), codes ``floor(x * 127 / max + 0.5)`` (``kvq8_quantize_rows``). The other schemes
here are numpy what-ifs, for a lesson to measure what a different choice would cost:

- ``"q8_0"``: llama.cpp's q8_0 block, one fp16 scale per 32 values. As its reference quantizer
  ``quantize_row_q8_0_ref`` does: ``d = max|x_b| / 127`` in float32, codes ``roundf(x * (1/d))``
  (ties away from zero; 0 for an all-zero block), and ``d`` stored as float16, so that the values
  read back are ``code * float16(d)``.
- ``"fp16"``: every value rounded to float16 (no codes, no scales), for comparison.
- ``"fp16_channels"``: this engine's scheme on all channels but a few named ones, which are kept in
  float16 and left out of the row's max (a "keep the outlier channels in fp16" what-if; no engine
  in this course does it).

``attend_dequantized`` is the attention over dequantized K, V in numpy float64; with the engine's
scheme and the engine's Q codes it reproduces the compiled kernel to float32 rounding, which is
what makes a comparison of schemes through it fair."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import validate as check
from .cache import KVCacheQ8
from .kernels.attention import attend
from .language import tr
from .reference import attention
from .rounding import q_block_scaled, round_codes
from .trace import run_traced
from .quant import KVQ_INV
from .validate import QBLOCK

#: the K/V quantization schemes ``dequantized`` knows
SCHEMES = ("engine", "q8_0", "fp16_channels", "fp16")


# ---------------------------------------------------------------------------------- metrics

def rel_error(out, ref, channels=None) -> np.ndarray | float:
    """Relative error ``||out - ref||_2 / ||ref||_2`` (unitless) over the last axis, or over the
    given ``channels`` of it only. Works on one vector (returns a float) or a batch ``[n, hd]``."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if channels is not None:
        out, ref = out[..., channels], ref[..., channels]
    r = np.linalg.norm(out - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    return float(r) if np.ndim(r) == 0 else r


def kl_divergence(p, q) -> float:
    """KL(p || q) = sum_t p_t log(p_t / q_t) in nats, for two probability vectors of the same
    length (terms with p_t = 0 count 0). float64; 0 when p == q. Infinite where q_t = 0 < p_t:
    for softmax weights, use ``kl_from_scores``, which never underflows."""
    p = np.asarray(p, np.float64)
    q = np.asarray(q, np.float64)
    if p.shape != q.shape:
        raise ValueError(tr(f"p and q must have the same shape; got {p.shape} and {q.shape}",
                            f"p 和 q 的形状必须相同；实际是 {p.shape} 和 {q.shape}"))
    m = p > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(p[m] * (np.log(p[m]) - np.log(q[m]))))


def log_softmax(s) -> np.ndarray:
    """log of the softmax of a score vector, float64, without forming tiny weights first."""
    s = np.asarray(s, np.float64)
    z = s - s.max()
    return z - np.log(np.exp(z).sum())


def kl_from_scores(s_p, s_q) -> float:
    """KL(softmax(s_p) || softmax(s_q)) in nats from the two score vectors, through log-softmax:
    finite even where a weight of softmax(s_q) underflows to 0 in float64 (very peaked attention)."""
    lp, lq = log_softmax(s_p), log_softmax(s_q)
    if lp.shape != lq.shape:
        raise ValueError(tr(f"the score vectors must have the same shape; got {lp.shape} and {lq.shape}",
                            f"两个分数向量的形状必须相同；实际是 {lp.shape} 和 {lq.shape}"))
    return float(np.sum(np.exp(lp) * (lp - lq)))


# --------------------------------------------------------- the error of the kernel, split in two

@dataclass
class ErrorSplit:
    """The error of the kernel's outputs for a batch of queries over one kv head, split (all
    float64 ``[n, hd]``, one row per query):

    - ``ref``: float64 attention on the unquantized K, V and q (fp32 KV's answer);
    - ``float_q``: float64 attention with unquantized q over the cache's dequantized int8 K, V;
    - ``kernel``: the compiled kernel's outputs.

    ``kv_part = float_q - ref`` is what K/V quantization adds, ``q_part = kernel - float_q`` what
    Q's quantization adds (with the kernel's float32 arithmetic, which is far smaller);
    ``total = kernel - ref``, so ``total == q_part + kv_part`` by construction."""
    ref: np.ndarray
    float_q: np.ndarray
    kernel: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.kernel - self.ref

    @property
    def kv_part(self) -> np.ndarray:
        return self.float_q - self.ref

    @property
    def q_part(self) -> np.ndarray:
        return self.kernel - self.float_q

    def rel(self) -> dict[str, np.ndarray]:
        """The three parts as relative errors ``||part|| / ||ref||`` (unitless), one per query."""
        n = np.linalg.norm(self.ref, axis=-1)
        return {name: np.linalg.norm(getattr(self, name), axis=-1) / n
                for name in ("total", "q_part", "kv_part")}


def split_error(Q: np.ndarray, cache: KVCacheQ8, kv_head: int, K: np.ndarray, V: np.ndarray,
                scale: float | None = None) -> ErrorSplit:
    """Run the compiled kernel for every query of ``Q`` (float32 ``[n, hd]``) over ``cache``'s kv
    head and split its error against float64 attention on the unquantized rows ``K``, ``V``
    (float32 ``[seq_len, hd]``, the values the cache was filled with) into Q's part and K/V's
    part (``ErrorSplit``). The middle term uses the cache's own dequantized values."""
    check.kv_cache(cache)
    Q = check.float32_like("Q", np.atleast_2d(Q), (None, cache.head_dim))
    scale = check.scale(scale, cache.head_dim)
    kernel = np.stack([attend(q, cache, kv_head, scale=scale) for q in Q]).astype(np.float64)
    Kd, Vd = cache.dequantized(kv_head)
    return ErrorSplit(ref=attention(Q, K, V, scale), float_q=attention(Q, Kd, Vd, scale),
                      kernel=kernel)


def attention_kl(q: np.ndarray, cache: KVCacheQ8, kv_head: int, K: np.ndarray,
                 scale: float | None = None) -> float:
    """KL(p_fp32 || p_q8) between the attention weights of float64 attention on the unquantized
    K (``[seq_len, hd]``) and those of the compiled kernel. The kernel never stores its weights:
    its scores ``s_t`` come from its trace, and the KL is taken from both score vectors in float64
    (``kl_from_scores``)."""
    check.kv_cache(cache)
    scale = check.scale(scale, cache.head_dim)
    traced = run_traced(np.empty(cache.head_dim, np.float32), q, cache, kv_head, scale, fields=("s",))
    return kl_from_scores(scale * (np.asarray(K, np.float64) @ np.asarray(q, np.float64)), traced.s)


# ------------------------------------------------------------ K/V quantization schemes in numpy

def quantize_rows_engine(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This engine's K/V quantizer recomputed in numpy (the C one is ``kvq8_quantize_rows``):
    rows ``x [..., hd]`` -> (codes int8, raw max float32 ``[...]``); codes
    ``floor(x * 127 / max + 0.5)`` computed in float64, a zero row gets scale 0 and codes 0."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(axis=-1)
    safe = np.where(amax > 0, amax, np.float32(1)).astype(np.float64)
    codes = np.floor(x.astype(np.float64) * 127.0 / safe[..., None] + 0.5)
    codes = np.where(amax[..., None] > 0, codes, 0.0)
    return codes.astype(np.int8), amax.astype(np.float32)


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's q8_0 in numpy: rows ``x [..., hd]`` (hd a multiple of 32) -> (codes int8
    ``[..., hd]``, scales float16 ``[..., hd/32]``). Per 32 values: ``d = max|x| / 127`` (float32),
    ``id = 1/d`` (0 when d is 0), code = ``roundf(x * id)``, d stored as float16."""
    x = np.asarray(x, np.float32)
    hd = x.shape[-1]
    if hd % QBLOCK:
        raise ValueError(tr(f"the last axis must be a multiple of {QBLOCK}; got {hd}",
                            f"最后一维必须是 {QBLOCK} 的倍数；实际是 {hd}"))
    blocks = x.reshape(*x.shape[:-1], hd // QBLOCK, QBLOCK)
    d = (np.abs(blocks).max(axis=-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    codes = round_codes((blocks * inv[..., None]).astype(np.float32), "roundf")
    return codes.reshape(x.shape), d.astype(np.float16)


def dequantize_q8_0(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """q8_0 codes ``[..., hd]`` and float16 scales ``[..., hd/32]`` -> float32 values
    ``code * float(d)``."""
    codes = np.asarray(codes)
    blocks = codes.reshape(*codes.shape[:-1], -1, QBLOCK).astype(np.float32)
    return (blocks * np.asarray(d).astype(np.float32)[..., None]).reshape(codes.shape)


def dequantized(x: np.ndarray, scheme: str = "engine", channels=()) -> np.ndarray:
    """Rows ``x [..., hd]`` quantized with ``scheme`` (one of SCHEMES) and read back, float32:

    - "engine": ``code * (max * 1/127)`` as the kernel reads its cache;
    - "q8_0": ``code * float16(d)`` per 32 values;
    - "fp16_channels": the ``channels`` kept as float16, the others quantized the engine's way
      with the max taken over them only;
    - "fp16": every value rounded to float16."""
    x = np.asarray(x, np.float32)
    if scheme == "engine":
        codes, amax = quantize_rows_engine(x)
        return codes.astype(np.float32) * (amax * KVQ_INV)[..., None]
    if scheme == "q8_0":
        return dequantize_q8_0(*quantize_q8_0(x))
    if scheme == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if scheme == "fp16_channels":
        ch = np.asarray(channels, int)
        rest = np.setdiff1d(np.arange(x.shape[-1]), ch)
        out = np.empty_like(x)
        out[..., ch] = x[..., ch].astype(np.float16).astype(np.float32)
        out[..., rest] = dequantized(x[..., rest], "engine")
        return out
    raise ValueError(tr(f"scheme must be one of {', '.join(map(repr, SCHEMES))}; got {scheme!r}",
                        f"scheme 只能是 {', '.join(map(repr, SCHEMES))} 之一；你给的是 {scheme!r}"))


def bytes_per_row(head_dim: int, scheme: str, n_fp16_channels: int = 0) -> int:
    """Bytes one (token, kv head) row of K (or of V) costs: "engine" hd + 4 (int8 codes and one
    fp32 scale), "q8_0" hd + 2 * hd / 32 (int8 codes and one fp16 scale per 32), "fp16_channels"
    (hd - n) + 4 + 2 * n, "fp16" 2 * hd, "fp32" 4 * hd. (A list of the fp16 channels, once per
    layer, is not counted.)"""
    if scheme == "engine":
        return head_dim + 4
    if scheme == "q8_0":
        return head_dim + 2 * (head_dim // QBLOCK)
    if scheme == "fp16_channels":
        return head_dim - n_fp16_channels + 4 + 2 * n_fp16_channels
    if scheme == "fp16":
        return 2 * head_dim
    if scheme == "fp32":
        return 4 * head_dim
    raise ValueError(tr(f"unknown scheme {scheme!r}", f"未知的 scheme {scheme!r}"))


def dequantized_q(Q: np.ndarray) -> np.ndarray:
    """The query the kernel actually uses: segment 1's codes times their block scales, float64,
    for one ``q [hd]`` or a batch ``[n, hd]`` (float32 input)."""
    v, scales = q_block_scaled(np.asarray(Q, np.float32))
    codes = round_codes(v, "engine").astype(np.float64)
    return codes * np.repeat(scales.astype(np.float64), QBLOCK, axis=-1)


def attend_dequantized(Q: np.ndarray, Kd: np.ndarray, Vd: np.ndarray, scale: float | None = None,
                       quantize_query: bool = True) -> np.ndarray:
    """Attention in numpy float64 over already dequantized K, V (``[seq_len, hd]``) for one query
    ``[hd]`` or a batch ``[n, hd]``. With ``quantize_query`` each query is first replaced by the
    engine's int8 Q (segment 1, ``dequantized_q``), as the kernel does; without, it is used as it
    is. float64, the shape of Q."""
    Q = dequantized_q(Q) if quantize_query else np.asarray(Q, np.float64)
    out = attention(np.atleast_2d(Q), Kd, Vd, scale)  # one matrix product, whatever Q's shape
    return out[0] if Q.ndim == 1 else out


def attend_scheme(Q: np.ndarray, K: np.ndarray, V: np.ndarray, scheme: str = "engine",
                  scale: float | None = None, quantize_query: bool = True, channels=(),
                  v_scheme: str | None = None) -> np.ndarray:
    """K and V (float32 ``[seq_len, hd]``) quantized with ``scheme`` (V with ``v_scheme`` if
    given), read back, then ``attend_dequantized``: float64, one output per query of Q."""
    Kd = dequantized(K, scheme, channels)
    Vd = dequantized(V, scheme if v_scheme is None else v_scheme, channels)
    return attend_dequantized(Q, Kd, Vd, scale, quantize_query)


# --------------------------------------------------------------------------------- test data

def outlier_rows(n: int, head_dim: int, rng: np.random.Generator, channels=(11, 64, 97),
                 factor: float = 20.0, signs=None) -> np.ndarray:
    """Rows like a real model's K: standard normal values, plus a constant offset of
    ``factor`` (with a fixed sign per channel) on a few ``channels``: those channels are about
    ``factor`` times larger than the rest in every row, while their variation from token to token
    stays that of the others. float32 ``[n, head_dim]``. ``signs``: +-1 per channel (default:
    alternating +, -, +, ...)."""
    x = rng.standard_normal((n, head_dim), dtype=np.float32)
    ch = np.asarray(channels, int)
    if signs is None:
        signs = np.where(np.arange(ch.size) % 2 == 0, 1.0, -1.0)
    x[:, ch] += np.float32(factor) * np.asarray(signs, np.float32)
    return x
