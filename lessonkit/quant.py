"""Quantization as the engine does it (introduced in lesson 01; K/V rows in lesson 03).

Q: quantized once per kernel call, per 32-value block, ties away from zero (segment 1 of the
kernel, mirrored here in numpy float32 so that lessons can look at its codes and scales).
K/V: one raw max|x| per (token, kv head); the C function ``kvq8_quantize_rows`` is the one
implementation, and the cache calls it through ``quantize_kv_rows_into``."""
from __future__ import annotations

import numpy as np

from . import native
from . import validate as check
from .language import tr
from .validate import QBLOCK, float32_array, head_dim

KVQ_INV = np.float32(1.0) / np.float32(127.0)  # the kernel's KVQ_INV = 1.0f / 127.0f


def quantize_q(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment 1 of the kernel in numpy float32: returns (codes int8 [hd], block scales float32 [hd/32]).

    Per block: qm = max|q_b| (1 when below 1e-6), scale = qm * (1/127),
    code = (int)(v + (v >= 0 ? 0.5 : -0.5)) of v = q * (127 / qm), clamped to [-128, 127]."""
    q = float32_array("q", q, (None,))
    head_dim(q.shape[0])
    blocks = q.reshape(-1, QBLOCK)
    qm = np.abs(blocks).max(axis=1)
    qm = np.where(qm < np.float32(1e-6), np.float32(1.0), qm).astype(np.float32)
    scales = (qm * KVQ_INV).astype(np.float32)
    v = blocks * (np.float32(127.0) / qm)[:, None]
    r = np.trunc(v + np.where(v >= 0, np.float32(0.5), np.float32(-0.5)))
    codes = np.clip(r, -128, 127).astype(np.int8).reshape(-1)
    return codes, scales


def quantize_kv_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantize rows of K or V with the C quantizer: x float32 [n, hd] -> (codes int8 [n, hd],
    raw max scales float32 [n]). Dequantize with ``codes * (scales / 127)``."""
    x = _rows("x", x)
    codes = np.empty(x.shape, np.int8)
    scales = np.empty(x.shape[0], np.float32)
    _quantize_rows(x, codes, scales, *native.load())
    return codes, scales


def quantize_kv_rows_into(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, ffi=None, lib=None) -> None:
    """Write the codes of x float32 [n, hd] into ``codes`` (int8 [n, hd]) and the raw maxima into
    ``scales`` (float32 [n]); both must be writable, C-contiguous arrays of exactly those shapes,
    since C writes n * hd codes and n scales wherever they point. ``ffi, lib``: a loaded library
    (``lessonkit.native.load()``), for a caller that quantizes many chunks; default the workbook's.

    Every argument is checked (O(1), plus one pass over x for NaN/Inf); the cache, which sizes
    its own blocks, may call ``_quantize_rows`` directly after its own checks."""
    x = _rows("x", x)
    n, hd = x.shape
    codes = check.int8_array("codes", codes, (n, hd), writable=True)
    scales = check.float32_array("scales", scales, (n,), writable=True)
    if np.may_share_memory(codes, x) or np.may_share_memory(scales, x) or np.may_share_memory(codes, scales):
        raise ValueError(tr("x, codes and scales must not overlap: C reads x while it writes the others",
                            "x、codes 和 scales 的内存不能重叠：C 一边读 x，一边写另外两个"))
    _quantize_rows(x, codes, scales, *check.library(ffi, lib, ("kvq8_quantize_rows",)))


def _rows(name: str, x) -> np.ndarray:
    x = float32_array(name, x, (None, None))
    n, hd = x.shape
    check.c_int(tr(f"{name}.shape[0] (rows)", f"{name}.shape[0]（行数）"), n)      # C counts rows and values with int
    check.c_int(tr(f"{name}.shape[1] (values per row)", f"{name}.shape[1]（每行的值数）"), hd)
    return x


def _quantize_rows(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, ffi, lib) -> None:
    """The C call itself, without checks: x [n, hd] float32, codes [n, hd] int8, scales [n] float32,
    all C-contiguous (codes and scales writable), sizes below 2**31."""
    n, hd = x.shape
    lib.kvq8_quantize_rows(ffi.from_buffer("float[]", x), n, hd, hd,
                           ffi.from_buffer("int8_t[]", codes, require_writable=True), hd,
                           ffi.from_buffer("float[]", scales, require_writable=True), 1)


def dequantize(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """codes [..., hd] int8 with raw-max scales [...] -> float32 values, as the kernel reads them."""
    return codes.astype(np.float32) * (scales.astype(np.float32) * KVQ_INV)[..., None]
