"""How precise is q8 KV? (lesson 07, a preview of article 9-3): error metrics, the kernel's error split into Q's part
and K/V's part, and K/V quantized other ways in numpy.

Only the engine's scheme (one raw ``max|x|`` per token and kv head) runs in the compiled kernel; the others are numpy
what-ifs: llama.cpp's "q8_0", "fp16", and "fp16_channels" (named channels kept in float16 and out of the row's max;
no engine here does it). ``attend_scheme`` over the engine's scheme reproduces the kernel to float32 rounding, which
makes a comparison of schemes through it fair."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import validate as check
from ..core.cache import KVCacheQ8, attention_call
from ..core.attention import attend
from ..core.language import _
from ..core import quant
from ..core.reference import attention
from .rounding import q_block_scaled, round_codes

SCHEMES = ("engine", "q8_0", "fp16_channels", "fp16")
QK8_0 = 32  # values per q8_0 block (ggml-common.h, block_q8_0)


def rel_error(out, ref, channels=None) -> np.ndarray | float:
    """``||out - ref|| / ||ref||`` over the last axis (or its ``channels``): a float or one per row."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if channels is not None:
        out, ref = out[..., channels], ref[..., channels]
    r = np.linalg.norm(out - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    return float(r) if np.ndim(r) == 0 else r


def log_softmax(s) -> np.ndarray:
    s = np.asarray(s, np.float64)
    z = s - s.max()
    return z - np.log(np.exp(z).sum())


def kl_from_scores(s_p, s_q) -> float:
    """KL(softmax(s_p) || softmax(s_q)) in nats, through log-softmax: finite even where a weight of softmax(s_q)
    underflows to 0 (very peaked attention)."""
    lp, lq = log_softmax(s_p), log_softmax(s_q)
    if lp.shape != lq.shape:
        raise ValueError(_("the score vectors must have the same shape; got {shape} and {shape2}").format(
                           shape=lp.shape, shape2=lq.shape))
    return float(np.sum(np.exp(lp) * (lp - lq)))


@dataclass
class ErrorSplit:
    """float64 ``[n, hd]``: ``ref`` (attention on unquantized q, K, V), ``float_q`` (unquantized q over the cache's
    int8 K, V), ``kernel``; ``total = q_part + kv_part`` by construction."""
    ref: np.ndarray
    float_q: np.ndarray
    kernel: np.ndarray

    total = property(lambda self: self.kernel - self.ref)
    kv_part = property(lambda self: self.float_q - self.ref)
    q_part = property(lambda self: self.kernel - self.float_q)

    def rel(self) -> dict[str, np.ndarray]:
        """``||part|| / ||ref||`` of each part, one per query."""
        n = np.linalg.norm(self.ref, axis=-1)
        return {name: np.linalg.norm(getattr(self, name), axis=-1) / n for name in ("total", "q_part", "kv_part")}


def split_error(Q, cache: KVCacheQ8, kv_head: int, K, V, scale: float | None = None) -> ErrorSplit:
    """The compiled kernel's error for every query of ``Q [n, hd]`` against float64 attention on the rows ``K, V``
    the cache was filled with, split into Q's and K/V's parts."""
    kv_head, scale = attention_call(cache, kv_head, scale)
    Q = check.float32_like("Q", np.atleast_2d(Q), (None, cache.head_dim))
    kernel = np.stack([attend(q, cache, kv_head, scale=scale) for q in Q]).astype(np.float64)
    Kd, Vd = cache.dequantized(kv_head)
    return ErrorSplit(ref=attention(Q, K, V, scale), float_q=attention(Q, Kd, Vd, scale), kernel=kernel)


def quantize_rows_engine(x) -> tuple[np.ndarray, np.ndarray]:
    """The engine's K/V quantizer (C: ``kvq8_quantize_rows``) in numpy: (codes int8, raw max float32)."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(axis=-1)
    safe = np.where(amax > 0, amax, np.float32(1)).astype(np.float64)
    codes = np.floor(x.astype(np.float64) * 127.0 / safe[..., None] + 0.5)
    return np.where(amax[..., None] > 0, codes, 0.0).astype(np.int8), amax.astype(np.float32)


def dequantized(x, scheme: str = "engine", channels=()) -> np.ndarray:
    """Rows ``x [..., hd]`` quantized with ``scheme`` (one of SCHEMES) and read back, float32."""
    x = np.asarray(x, np.float32)
    if check.one_of("scheme", scheme, SCHEMES) == "engine":
        return quant.dequantize(*quantize_rows_engine(x))
    if scheme == "q8_0":
        return dequantize_q8_0(*quantize_q8_0(x))
    if scheme == "fp16":
        return x.astype(np.float16).astype(np.float32)
    ch = np.asarray(channels, int)  # "fp16_channels"
    rest = np.setdiff1d(np.arange(x.shape[-1]), ch)
    out = np.empty_like(x)
    out[..., ch] = x[..., ch].astype(np.float16).astype(np.float32)
    out[..., rest] = dequantized(x[..., rest], "engine")
    return out


def bytes_per_row(head_dim: int, scheme: str, n_fp16_channels: int = 0) -> int:
    """Bytes of one (token, kv head) row of K or V under ``scheme`` (or "fp32"); the fp16 channels' list is not."""
    sizes = {"engine": head_dim + 4, "q8_0": head_dim + 2 * (head_dim // check.QBLOCK),
             "fp16_channels": head_dim + n_fp16_channels + 4, "fp16": 2 * head_dim, "fp32": 4 * head_dim}
    return sizes[check.one_of("scheme", scheme, sizes)]


def dequantized_q(Q) -> np.ndarray:
    """The query the kernel uses, float64: segment 1's codes times their block scales."""
    v, scales = q_block_scaled(np.asarray(Q, np.float32))
    return round_codes(v, "engine").astype(np.float64) * np.repeat(scales.astype(np.float64), check.QBLOCK, axis=-1)


def attend_scheme(Q, K, V, scheme: str = "engine", scale: float | None = None, quantize_query: bool = True,
                  channels=(), v_scheme: str | None = None) -> np.ndarray:
    """float64 attention of ``Q`` (``[hd]`` or ``[n, hd]``; the engine's int8 Q with ``quantize_query``) over K, V
    ``[seq_len, hd]`` quantized with ``scheme`` (V: ``v_scheme``)."""
    Kd = dequantized(K, scheme, channels)
    Vd = dequantized(V, scheme if v_scheme is None else v_scheme, channels)
    Q = dequantized_q(Q) if quantize_query else np.asarray(Q, np.float64)
    out = attention(np.atleast_2d(Q), Kd, Vd, scale)
    return out[0] if Q.ndim == 1 else out


def outlier_rows(n: int, head_dim: int, rng: np.random.Generator, channels=(11, 64, 97),
                 factor: float = 20.0, signs=None) -> np.ndarray:
    """Rows like a real model's K, float32 ``[n, head_dim]``: N(0, 1), plus a constant offset of ``factor`` (sign per
    channel, default +, -, +, ...) on ``channels``."""
    x = rng.standard_normal((n, head_dim), dtype=np.float32)
    ch = np.asarray(channels, int)
    if signs is None:
        signs = np.where(np.arange(ch.size) % 2 == 0, 1.0, -1.0)
    x[:, ch] += np.float32(factor) * np.asarray(signs, np.float32)
    return x


def quantize_q8_0(x) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's q8_0 in numpy, as its reference quantizer ``quantize_row_q8_0_ref`` makes it: per 32 values
    ``d = max|x| / 127``, codes ``roundf(x * (1/d))``; (codes int8, scales float16 ``[..., hd/32]``)."""
    x = np.asarray(x, np.float32)
    hd = x.shape[-1]
    if hd % QK8_0:
        raise ValueError(_("the last axis must be a multiple of {QK8_0}; got {hd}").format(QK8_0=QK8_0, hd=hd))
    blocks = x.reshape(*x.shape[:-1], hd // QK8_0, QK8_0)
    d = (np.abs(blocks).max(axis=-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (blocks * inv[..., None]).astype(np.float32).astype(np.float64)
    codes = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -128, 127).astype(np.int8)  # C roundf, exact
    return codes.reshape(x.shape), d.astype(np.float16)


def dequantize_q8_0(codes, d) -> np.ndarray:
    codes = np.asarray(codes)
    blocks = codes.reshape(*codes.shape[:-1], -1, QK8_0).astype(np.float32)
    return (blocks * np.asarray(d).astype(np.float32)[..., None]).reshape(codes.shape)
