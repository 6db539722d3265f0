"""lessonkit.rounding (lesson 01): rounding rules, segment 1 with substituted rules, attention
recomputed around substituted Q codes, the dot-error prediction."""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import rounding
from lessonkit.quant import quantize_q

from conftest import make_case


def _libm_roundf():
    name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    if name is None:
        pytest.skip("no C math library found for roundf")
    lib = ctypes.CDLL(name)
    lib.roundf.restype, lib.roundf.argtypes = ctypes.c_float, [ctypes.c_float]
    return lib.roundf


def test_round_codes_known_values():
    v = np.array([0.49999997, -0.49999997, 0.5, -0.5, 2.5, -2.5, 3.5, 1.7, -1.7, 126.6, 300.0, -300.0],
                 np.float32)
    expect = {
        "engine":    [1, -1, 1, -1, 3, -3, 4, 2, -2, 127, 127, -128],
        "roundf":    [0, 0, 1, -1, 3, -3, 4, 2, -2, 127, 127, -128],
        "ties_even": [0, 0, 0, 0, 2, -2, 4, 2, -2, 127, 127, -128],
        "trunc":     [0, 0, 0, 0, 2, -2, 3, 1, -1, 126, 127, -128],
    }
    for rule, want in expect.items():
        got = rounding.round_codes(v, rule)
        assert got.dtype == np.int8
        assert got.tolist() == want, rule


def test_engine_edge_case_is_float32_addition():
    x = np.float32(0.49999997)
    assert x == np.nextafter(np.float32(0.5), np.float32(0))
    assert x + np.float32(0.5) == np.float32(1.0)      # the float32 sum rounds up
    assert float(x) + 0.5 < 1.0                          # the exact sum does not


def test_roundf_rule_matches_the_c_library():
    roundf = _libm_roundf()
    rng = np.random.default_rng(3)
    v = np.concatenate([rng.uniform(-130, 130, 3000).astype(np.float32),
                        np.arange(-128, 128, dtype=np.float32) + np.float32(0.5),
                        np.float32([0.49999997, -0.49999997, 1.4999999, 2.4999998])])
    want = np.clip([roundf(float(x)) for x in v], -128, 127).astype(np.int8)
    np.testing.assert_array_equal(rounding.round_codes(v, "roundf"), want)


def test_engine_and_roundf_differ_only_at_the_edge_case():
    """Every float32 in [0.25, 2), both signs: the engine's cast and roundf disagree only at
    0.49999997f and its negative."""
    for lo, hi in ((0.25, 1.0), (1.0, 2.0)):
        vals = np.arange(np.float32(lo).view(np.uint32), np.float32(hi).view(np.uint32),
                         dtype=np.uint32).view(np.float32)
        for sign in (1, -1):
            vv = vals * np.float32(sign)
            bad = vv[rounding.round_codes(vv, "engine") != rounding.round_codes(vv, "roundf")]
            expected = [np.float32(sign * 0.49999997)] if lo < 0.5 else []
            assert bad.tolist() == expected


def test_engine_rule_equals_quantize_q_and_the_kernel(small_case):
    cache, _, _, _ = small_case
    rng = np.random.default_rng(5)
    for q in (rng.standard_normal(64).astype(np.float32) * 3,
              rounding.outlier_q(64, rng, channels=(3, 40), factor=50.0),
              np.zeros(64, np.float32)):
        codes, scales = rounding.quantize_q_rule(q, "engine")
        ref_codes, ref_scales = quantize_q(q)
        np.testing.assert_array_equal(codes, ref_codes)
        np.testing.assert_array_equal(scales, ref_scales)
        _, tr = lk.attend(q, cache, 0, trace=True)
        np.testing.assert_array_equal(tr.q_codes, codes)
        np.testing.assert_array_equal(tr.q_scales, scales)


def test_q_block_scaled_values_and_batch():
    rng = np.random.default_rng(6)
    Q = rng.standard_normal((5, 96)).astype(np.float32)
    Q[2, 32:64] = 0
    v, scales = rounding.q_block_scaled(Q)
    assert v.shape == (5, 96) and scales.shape == (5, 3)
    qm = np.abs(Q.reshape(5, 3, 32)).max(axis=2).astype(np.float64)
    qm[2, 1] = 1.0                                           # the guard
    np.testing.assert_allclose(v.reshape(5, 3, 32), Q.reshape(5, 3, 32) * (127 / qm)[..., None], rtol=1e-6)
    np.testing.assert_allclose(scales, qm / 127, rtol=1e-6)
    for i in range(5):
        vi, si = rounding.q_block_scaled(Q[i])
        np.testing.assert_array_equal(vi, v[i])
        np.testing.assert_array_equal(si, scales[i])


def test_bad_arguments():
    with pytest.raises(ValueError, match="rule must be one of"):
        rounding.round_codes(np.zeros(3, np.float32), "nearest")
    with pytest.raises(ValueError, match="head_dim"):
        rounding.q_block_scaled(np.zeros(40, np.float32))
    with pytest.raises(TypeError, match="float32"):
        rounding.q_block_scaled(np.zeros(64))


def test_truncation_error_is_larger_and_biased():
    rng = np.random.default_rng(8)
    v, _ = rounding.q_block_scaled(rng.standard_normal((200, 128)).astype(np.float32))
    d = {r: rounding.round_codes(v, r).astype(np.float64) - v for r in rounding.RULES}
    for r in ("engine", "roundf", "ties_even"):
        assert np.abs(d[r]).max() <= 0.5 + 1e-5
        assert abs(np.sqrt(np.mean(d[r] ** 2)) - 1 / np.sqrt(12)) < 0.02
    assert np.abs(d["trunc"]).max() < 1.0
    assert np.mean(d["trunc"] * np.sign(v)) < -0.45           # toward zero


def test_scores_from_q_codes_match_the_traced_kernel(small_case):
    """The numpy scores around Q codes (lk.reference.scores_from_q_codes, which lesson 01 feeds
    other rounding rules) are the compiled kernel's own scores, to float32 rounding."""
    cache, q, _, _ = small_case
    codes, scales = quantize_q(q)
    _, tr = lk.attend(q, cache, 1, scale=0.125, trace=True)
    np.testing.assert_allclose(lk.reference.scores_from_q_codes(codes, scales, cache, 1, 0.125), tr.s,
                               rtol=1e-6, atol=1e-6)


def test_attend_with_q_codes_reproduces_the_kernel():
    cache, q, _, _ = make_case(seed=9, seq_len=300, n_kv_heads=2, head_dim=128, block_size=32)
    codes, scales = quantize_q(q)
    scale = 1 / np.sqrt(128)
    ours = rounding.attend_with_q_codes(codes, scales, cache, 1, scale)
    kernel = lk.attend(q, cache, 1)
    np.testing.assert_allclose(ours, kernel, atol=1e-5 * np.abs(kernel).max())
    # another rule's codes give another output: the codes are really used
    tcodes, _ = rounding.quantize_q_rule(q, "trunc")
    assert np.abs(rounding.attend_with_q_codes(tcodes, scales, cache, 1, scale) - kernel).max() > 1e-5


def test_attend_float_q_is_reference_on_dequantized_kv():
    cache, q, _, _ = make_case(seed=10, seq_len=200, n_kv_heads=1, head_dim=64, block_size=16)
    Kd, Vd = cache.dequantized(0)
    np.testing.assert_allclose(rounding.attend_float_q(q, cache, 0, 0.2),
                               lk.reference.attention(q, Kd, Vd, 0.2), rtol=1e-5, atol=1e-7)


def test_rule_errors_keys_and_order():
    cache, q, K, V = make_case(seed=11, seq_len=500, n_kv_heads=1, head_dim=128, block_size=64)
    res = rounding.rule_errors(q * 2, cache, 0, 1 / np.sqrt(128), K[:, 0], V[:, 0])
    assert set(res) == set(rounding.RULES)
    assert res["engine"] == res["roundf"]
    assert res["trunc"]["q_rms"] > 1.5 * res["engine"]["q_rms"]
    assert res["engine"]["out_vs_float_q"] > 0


def test_dot_error_sigma_matches_monte_carlo():
    """Independent check: the formula against the spread of errors of random pairs."""
    rng = np.random.default_rng(12)
    q = rng.standard_normal(128).astype(np.float32)
    K = rng.standard_normal((20000, 128)).astype(np.float32)
    codes, qs = quantize_q(q)
    kc, ks = lk.quant.quantize_kv_rows(K)
    approx = (kc.astype(np.float64).reshape(-1, 4, 32) * (codes.astype(np.float64).reshape(4, 32) * qs[:, None])
              ).sum(axis=(1, 2)) * ks / 127
    err = approx - K.astype(np.float64) @ q.astype(np.float64)
    sigma = rounding.dot_error_sigma(q, K, qs, ks)
    assert 0.9 < (err / sigma).std() < 1.05
    # hand computation for one row
    k0 = K[0].astype(np.float64)
    var = (ks[0] / 127) ** 2 / 12 * (q.astype(np.float64) ** 2).sum() + sum(
        qs[b] ** 2 / 12 * (k0[32 * b:32 * b + 32] ** 2).sum() for b in range(4))
    assert sigma[0] == pytest.approx(np.sqrt(var), rel=1e-6)


def test_outlier_q():
    q = rounding.outlier_q(128, np.random.default_rng(0), channels=(5, 70), factor=20.0)
    assert q.dtype == np.float32 and q.shape == (128,)
    assert np.all(np.abs(q[[5, 70]]) == 20.0)
    rest = np.delete(q, [5, 70])
    assert np.abs(rest).max() < 6
