"""Q's per-block quantization (numpy mirror of segment 1) and the C K/V row quantizer."""
from __future__ import annotations

import numpy as np
import pytest

from lessonkit.quant import dequantize, quantize_kv_rows, quantize_q


def test_q_codes_and_scales():
    rng = np.random.default_rng(0)
    q = rng.standard_normal(128, dtype=np.float32) * 3
    codes, scales = quantize_q(q)
    assert codes.dtype == np.int8 and codes.shape == (128,)
    assert scales.dtype == np.float32 and scales.shape == (4,)
    blocks = q.reshape(4, 32)
    np.testing.assert_allclose(scales, np.abs(blocks).max(axis=1) / 127, rtol=1e-6)
    # the largest value of each block maps to +-127, and every value is within half a step
    assert (np.abs(codes.reshape(4, 32)).max(axis=1) == 127).all()
    err = np.abs(codes.reshape(4, 32) * scales[:, None] - blocks)
    assert (err <= scales[:, None] / 2 * (1 + 1e-5)).all()


def test_q_rounds_half_away_from_zero():
    """The engine's cast (int)(v + (v >= 0 ? 0.5 : -0.5)): 2.5 -> 3 and -2.5 -> -3, where
    ties-to-even (vcvtnq_s32_f32, numpy's round) would give 2 and -2."""
    q = np.zeros(32, np.float32)
    q[0] = 127.0                      # qm = 127, so the codes are the values themselves
    q[1:5] = [2.5, -2.5, 0.5, -0.5]
    codes, scales = quantize_q(q)
    assert scales[0] == np.float32(127.0) / np.float32(127.0)
    assert codes[:5].tolist() == [127, 3, -3, 1, -1]
    assert np.round(np.float32(2.5)) == 2  # what ties-to-even would have done


def test_q_guard_for_tiny_blocks():
    q = np.zeros(64, np.float32)
    q[32:] = 1e-7                      # max below 1e-6: qm := 1, scale 1/127, codes round to 0
    codes, scales = quantize_q(q)
    assert scales.tolist() == [np.float32(1 / 127)] * 2
    assert (codes == 0).all()


def test_kv_rows_raw_max_and_codes():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 96), dtype=np.float32) * rng.uniform(0.01, 100, (50, 1)).astype(np.float32)
    x[7] = 0                           # a row of zeros: scale 0, codes 0, no division by zero
    codes, scales = quantize_kv_rows(x)
    np.testing.assert_array_equal(scales, np.abs(x).max(axis=1))   # raw max, not max / 127
    assert codes.min() >= -127 and codes.max() <= 127
    assert (codes[7] == 0).all() and scales[7] == 0
    expected = np.floor(x.astype(np.float64) * 127 / np.where(scales == 0, 1, scales)[:, None] + 0.5)
    np.testing.assert_array_equal(codes, expected.astype(np.int8))
    err = np.abs(dequantize(codes, scales) - x)
    assert (err <= scales[:, None] / 254 * (1 + 1e-5) + 1e-30).all()


def test_kv_rows_ties_round_up():
    """floor(v + 0.5): a tie goes up, also for negative values (-2.5 -> -2), unlike Q's cast."""
    x = np.zeros((1, 32), np.float32)
    x[0, :5] = [127, 2.5, -2.5, 0.5, -0.5]
    codes, _ = quantize_kv_rows(x)
    assert codes[0, :5].tolist() == [127, 3, -2, 1, 0]


@pytest.mark.parametrize("amax", [1e-40, 1e-30, 3e38])
def test_kv_rows_extreme_but_finite(amax):
    """Subnormal and near-overflow rows still give codes in range (the C code divides in double)."""
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32) * np.float32(amax)
    codes, scales = quantize_kv_rows(x)
    assert codes.min() == -127 and codes.max() == 127
