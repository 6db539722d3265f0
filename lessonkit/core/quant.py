"""Quantization as the engine does it (introduced in lesson 01; K/V rows in lesson 03).

Q: quantized once per kernel call, per 32-value block, ties away from zero (segment 1 of the
kernel, mirrored here in numpy float32 so that lessons can look at its codes and scales; the check
of every new build, ``lessonkit/smoke.py``, uses the same function).
K/V: one raw max|x| per (token, kv head); the C function ``kvq8_quantize_rows`` is the one
implementation, and the cache calls it directly."""
from __future__ import annotations

import numpy as np

from . import native
from . import validate as check
from .header import KVQ_INV
from .language import _


def quantize_q(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment 1 of the kernel in numpy float32: returns (codes int8 [hd], block scales float32 [hd/32]).

    Per block: qm = max|q_b| (1 when below 1e-6), scale = qm * (1/127),
    code = (int)(v + (v >= 0 ? 0.5 : -0.5)) of v = q * (127 / qm), clamped to [-128, 127]."""
    q = check.float32_array("q", q, (None,))
    check.head_dim(q.shape[0])
    return q_codes(q)


def q_codes(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``quantize_q`` of a float32 q whose length is a multiple of 32, unchecked."""
    blocks = q.reshape(-1, check.QBLOCK)
    qm = np.abs(blocks).max(axis=1)
    qm = np.where(qm < np.float32(1e-6), np.float32(1.0), qm).astype(np.float32)
    v = blocks * (np.float32(127.0) / qm)[:, None]
    r = np.trunc(v + np.where(v >= 0, np.float32(0.5), np.float32(-0.5)))
    return np.clip(r, -128, 127).astype(np.int8).reshape(-1), (qm * KVQ_INV).astype(np.float32)


def quantize_kv_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantize rows of K or V with the C quantizer: x float32 [n, hd] -> (codes int8 [n, hd],
    raw max scales float32 [n]). Dequantize with ``codes * (scales / 127)``."""
    x = _rows(x)
    codes, scales = np.empty(x.shape, np.int8), np.empty(x.shape[0], np.float32)
    _quantize_rows(x, codes, scales, *native.load())
    return codes, scales


def _rows(x) -> np.ndarray:
    x = check.float32_array("x", x, (None, None))
    check.c_int(_("x.shape[0] (rows)"), x.shape[0])  # C counts them with int
    check.c_int(_("x.shape[1] (values per row)"), x.shape[1])
    return x


def _quantize_rows(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, ffi, lib) -> None:
    n, hd = x.shape
    lib.kvq8_quantize_rows(ffi.from_buffer("float[]", x), n, hd, hd,
                           ffi.from_buffer("int8_t[]", codes, require_writable=True), hd,
                           ffi.from_buffer("float[]", scales, require_writable=True), 1)


def dequantize(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """codes [..., hd] int8 with raw-max scales [...] -> float32 values, as the kernel reads them."""
    return codes.astype(np.float32) * (scales.astype(np.float32) * KVQ_INV)[..., None]
