"""lessonkit.precision (lesson 07): error metrics, the Q / K-V split of the kernel's error, K/V
quantized as this engine and as llama.cpp's q8_0 in numpy, the attention over them, bytes."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import precision as P
from lessonkit import rounding
from lessonkit.quant import quantize_kv_rows, quantize_q

from conftest import make_case


def _fp16(x: float) -> float:
    """Round a float to IEEE half precision and back, through struct (independent of numpy)."""
    return struct.unpack("<e", struct.pack("<e", x))[0]


def _roundf(x: float) -> int:
    """C roundf: halfway cases away from zero."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


# ------------------------------------------------------------------------------------ metrics

def test_rel_error_vector_batch_and_channels():
    ref = np.array([3.0, 4.0, 0.0, 0.0])
    out = np.array([3.0, 4.0, 1.0, 0.0])
    assert P.rel_error(out, ref) == pytest.approx(1 / 5)
    assert P.rel_error(out, ref, channels=[0, 1]) == 0.0
    assert P.rel_error(out, ref, channels=[1, 2]) == pytest.approx(1 / 4)
    batch = P.rel_error(np.stack([out, ref]), np.stack([ref, ref]))
    assert batch.shape == (2,) and batch[0] == pytest.approx(0.2) and batch[1] == 0.0


def _kl(p, q) -> float:
    """KL(p || q) written out over probability vectors (terms with p_t = 0 count 0)."""
    m = p > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(p[m] * (np.log(p[m]) - np.log(q[m]))))


def test_kl_from_scores_matches_and_survives_underflow():
    assert P.kl_from_scores(np.log([0.5, 0.5]), np.log([0.25, 0.75])) == pytest.approx(
        0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75), rel=1e-12)
    with pytest.raises(ValueError):
        P.kl_from_scores([1.0], [0.5, 0.5])
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(30), rng.standard_normal(30)
    assert P.kl_from_scores(a, b) == pytest.approx(_kl(lk.reference.softmax(a), lk.reference.softmax(b)), rel=1e-10)
    assert P.kl_from_scores(a, a) == 0.0
    # two tokens; the approximate scores put token 1 1000 behind: its weight underflows to 0
    s_p, s_q = np.array([0.0, 0.0]), np.array([0.0, -1000.0])
    assert lk.reference.softmax(s_q)[1] == 0.0
    assert _kl(lk.reference.softmax(s_p), lk.reference.softmax(s_q)) == math.inf
    # exact: 0.5 log(0.5 / 1) + 0.5 log(0.5 / e^-1000) = 500 - ln 2
    assert P.kl_from_scores(s_p, s_q) == pytest.approx(500.0 - math.log(2), rel=1e-9)
    np.testing.assert_allclose(P.log_softmax([1.0, 2.0]), np.log(lk.reference.softmax([1.0, 2.0])), rtol=1e-12)


def test_softmax_sums_to_one_and_is_shift_invariant():
    s = np.array([1000.0, 1001.0, 999.0])
    w = lk.reference.softmax(s)
    assert w.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(w, lk.reference.softmax(s - 1000.0), rtol=1e-12)
    e = np.exp([0.0, 1.0, -1.0])
    np.testing.assert_allclose(w, e / e.sum(), rtol=1e-12)


def _reordering_bound(q, K, V, scale: float) -> np.ndarray:
    """How far two float64 evaluations of softmax(scale K q) V may lie apart, per output component,
    when they add the same terms in different orders (a batch multiplies a matrix of
    queries, reference.attention one query at a time: BLAS sums each dot product, and the sums
    over tokens, in another order). With u = 2^-53 and gamma_n = n u / (1 - n u), the standard
    bound for a sum of n terms is |computed - exact| <= gamma_n * sum |terms|. To first order:
      s_t = scale * sum_j K_tj q_j: error <= gamma_hd scale sum_j |K_tj q_j|, plus a few roundings
        (the scale, the shift by the max, exp): together eps_t, a relative error of w_t = e^(s_t - M)
        (an error in M itself scales every w_t alike and cancels in N / D);
      N_i = sum_t w_t V_ti and D = sum_t w_t: |dN_i| <= sum_t w_t |V_ti| (eps_t + gamma_T), likewise dD;
      out_i = N_i / D: |d out_i| <= (|dN_i| + |out_i| |dD|) / D, plus the division's rounding.
    Each evaluation is within that of the exact value, so the two are within twice it."""
    q, K, V = (np.asarray(x, np.float64) for x in (q, K, V))
    T, hd = K.shape
    u = np.finfo(np.float64).eps / 2
    gamma = lambda n: n * u / (1 - n * u)
    w = np.exp(scale * (K @ q) - (scale * (K @ q)).max())
    rel_w = gamma(hd) * abs(scale) * (np.abs(K) @ np.abs(q)) + 6 * u + gamma(T)
    D = w.sum()
    out = np.abs(w @ V) / D
    return 2 * ((w * rel_w) @ np.abs(V) / D + out * (w * rel_w).sum() / D + u * out)


def test_batch_attention_equals_one_query_attention():
    """Same math, other summation order: equal within the rounding bound of _reordering_bound, which
    is below 1e-12 of the largest output here (the differences seen are a few thousandths of it,
    about 1e-12 relative to a component); a change of the scale by 1e-11 relative exceeds it."""
    _, q, K, V = make_case(seed=2, seq_len=70, n_kv_heads=1, head_dim=64, block_size=16)
    K0, V0 = K[:, 0], V[:, 0]
    Q = np.stack([q, 2 * q, -q]).astype(np.float32)
    got = lk.reference.attention(Q, K0, V0, 0.3)
    off = lk.reference.attention(Q, K0, V0, 0.3 * (1 + 1e-11))  # a real, tiny difference
    for i in range(3):
        ref = lk.reference.attention(Q[i], K0, V0, 0.3)
        bound = _reordering_bound(Q[i], K0, V0, 0.3)
        assert bound.max() < 1e-11 * np.abs(ref).max()  # the tolerance stays at rounding level
        assert (np.abs(got[i] - ref) <= bound).all(), (np.abs(got[i] - ref) / bound).max()
        assert (np.abs(off[i] - ref) > bound).any()
    ref = lk.reference.attention(q, K0, V0)
    assert (np.abs(lk.reference.attention(q[None], K0, V0)[0] - ref) <= _reordering_bound(q, K0, V0, 1 / 8)).all()


# -------------------------------------------------------------------------- the error split

def test_split_error_parts_and_baselines():
    cache, q, K, V = make_case(seed=4, seq_len=300, n_kv_heads=2, head_dim=128, block_size=32)
    kh, scale = 1, 1 / math.sqrt(128)
    Q = np.stack([q, 1.5 * q[::-1]]).astype(np.float32)
    sp = P.split_error(Q, cache, kh, K[:, kh], V[:, kh])
    np.testing.assert_allclose(sp.q_part + sp.kv_part, sp.total, atol=1e-15)
    for i in range(2):
        np.testing.assert_array_equal(sp.kernel[i], lk.attend(Q[i], cache, kh).astype(np.float64))
        np.testing.assert_allclose(sp.ref[i], lk.reference.attention(Q[i], K[:, kh], V[:, kh]), rtol=1e-12)
        # the middle term: lesson 01's float-q baseline over the cache's int8 K, V
        np.testing.assert_allclose(sp.float_q[i], rounding.attend_float_q(Q[i], cache, kh, scale), atol=1e-6)
    rel = sp.rel()
    assert set(rel) == {"total", "q_part", "kv_part"}
    assert all(0 < rel[k].min() and rel[k].max() < 0.1 for k in rel)


# ----------------------------------------------------------------------- quantizers in numpy

def test_engine_quantizer_equals_the_c_quantizer():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((500, 128)).astype(np.float32) * rng.uniform(1e-3, 1e3, (500, 1)).astype(np.float32)
    x[3] = 0.0                                   # zero row
    x[4, 5] = 1e4                                # one huge value
    x[5] = np.float32(0.5) * np.arange(-64, 64, dtype=np.float32) * np.float32(127 / 32)   # many exact halves
    codes, scales = P.quantize_rows_engine(x)
    c_codes, c_scales = quantize_kv_rows(x)
    np.testing.assert_array_equal(codes, c_codes)
    np.testing.assert_array_equal(scales, c_scales)
    assert (codes[3] == 0).all() and scales[3] == 0


def test_q8_0_against_a_hand_written_loop():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 64)).astype(np.float32) * 3
    x[1, :32] = 0.0                              # an all-zero block
    x[2, 40] = 250.0                             # a block with an outlier
    codes, d = P.quantize_q8_0(x)
    assert codes.dtype == np.int8 and codes.shape == x.shape
    assert d.dtype == np.float16 and d.shape == (3, 2)
    for r in range(3):
        for b in range(2):
            blk = x[r, 32 * b:32 * b + 32]
            amax = float(np.float32(max(abs(float(v)) for v in blk)))
            dd = float(np.float32(amax) / np.float32(127))
            inv = float(np.float32(1) / np.float32(dd)) if dd else 0.0
            want = [_roundf(float(np.float32(v) * np.float32(inv))) for v in blk]
            assert codes[r, 32 * b:32 * b + 32].tolist() == want
            assert float(d[r, b]) == _fp16(dd)
    assert (codes[1, :32] == 0).all() and d[1, 0] == 0
    back = P.dequantize_q8_0(codes, d)
    np.testing.assert_array_equal(back, codes.astype(np.float32) * np.repeat(d.astype(np.float32), 32, axis=1))


def test_q8_0_known_block():
    x = np.zeros(32, np.float32)
    x[:4] = [1.27, -0.635, 0.005, -0.015]
    codes, d = P.quantize_q8_0(x)
    assert codes[:4].tolist() == [127, -64, 1, -2]   # -0.635 / 0.01 = -63.5 rounds away from zero
    assert float(d[0]) == _fp16(float(np.float32(1.27) / np.float32(127)))
    with pytest.raises(ValueError):
        P.quantize_q8_0(np.ones(40, np.float32))


def test_dequantization_errors_are_within_half_a_step():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((200, 128)).astype(np.float32)
    eng = P.dequantized(x, "engine")
    step = np.abs(x).max(axis=1, keepdims=True) / 127
    assert (np.abs(eng - x) <= 0.5 * step * (1 + 1e-5)).all()
    np.testing.assert_array_equal(eng, lk.quant.dequantize(*quantize_kv_rows(x)))
    q80 = P.dequantized(x, "q8_0")
    bstep = np.repeat(np.abs(x.reshape(200, 4, 32)).max(axis=2) / 127, 32, axis=1)
    # half a step, plus what the fp16 rounding of d (relative 2^-11) does to code 127
    assert (np.abs(q80 - x) <= 0.5 * bstep + 127 * bstep * 2.0 ** -11 + 1e-7).all()
    # per-32 steps are never coarser than the row's step, so its error is smaller on Gaussian rows
    assert np.sqrt(np.mean((q80 - x) ** 2)) < np.sqrt(np.mean((eng - x) ** 2))
    np.testing.assert_array_equal(P.dequantized(x, "fp16"), x.astype(np.float16).astype(np.float32))


def test_fp16_channels_keeps_the_named_channels_out_of_the_max():
    rng = np.random.default_rng(9)
    x = P.outlier_rows(100, 64, rng, channels=(3, 40), factor=30.0)
    got = P.dequantized(x, "fp16_channels", channels=(3, 40))
    np.testing.assert_array_equal(got[:, [3, 40]], x[:, [3, 40]].astype(np.float16).astype(np.float32))
    rest = np.setdiff1d(np.arange(64), [3, 40])
    np.testing.assert_array_equal(got[:, rest], P.dequantized(x[:, rest], "engine"))
    # the rest is quantized with its own max, much finer than the engine's whole-row step
    err_rest = np.abs(got[:, rest] - x[:, rest]).max()
    err_engine = np.abs(P.dequantized(x, "engine")[:, rest] - x[:, rest]).max()
    assert err_rest < err_engine / 5
    with pytest.raises(ValueError):
        P.dequantized(x, "q4")


def test_bytes_per_row():
    assert P.bytes_per_row(128, "engine") == 132
    assert P.bytes_per_row(128, "q8_0") == 136
    assert P.bytes_per_row(64, "engine") == P.bytes_per_row(64, "q8_0") == 68
    assert P.bytes_per_row(256, "q8_0") == 272
    assert P.bytes_per_row(128, "fp16_channels", 3) == 135
    assert P.bytes_per_row(128, "fp16") == 256 and P.bytes_per_row(128, "fp32") == 512
    # the cache's own count: K and V rows of every (token, kv head)
    cache, *_ = make_case(seed=1, seq_len=10, n_kv_heads=2, head_dim=128, block_size=4)
    assert cache.nbytes == 10 * 2 * 2 * P.bytes_per_row(128, "engine")
    with pytest.raises(ValueError):
        P.bytes_per_row(128, "int4")


# -------------------------------------------------------------- the numpy path vs the kernel

def test_dequantized_q_is_segment_1():
    rng = np.random.default_rng(10)
    Q = rng.standard_normal((5, 128)).astype(np.float32)
    Q[2, :32] = 0.0
    got = P.dequantized_q(Q)
    for i in range(5):
        codes, scales = quantize_q(Q[i])
        np.testing.assert_array_equal(got[i], codes.astype(np.float64) * np.repeat(scales.astype(np.float64), 32))
    np.testing.assert_array_equal(P.dequantized_q(Q[0]), got[0])


def test_numpy_engine_path_reproduces_the_kernel():
    cache, q, K, V = make_case(seed=11, seq_len=1000, n_kv_heads=1, head_dim=128, block_size=64)
    rng = np.random.default_rng(11)
    Q = (rng.standard_normal((6, 128)) * 2).astype(np.float32)
    num = P.attend_scheme(Q, K[:, 0], V[:, 0], "engine")
    for i in range(6):
        kern = lk.attend(Q[i], cache, 0)
        assert P.rel_error(kern, num[i]) < 1e-5
    # and q8_0 is a different scheme: not within that tolerance
    other = P.attend_scheme(Q, K[:, 0], V[:, 0], "q8_0")
    assert P.rel_error(other, num).min() > 1e-4
    # without Q quantization the numpy path is the split's float_q baseline
    sp = P.split_error(Q, cache, 0, K[:, 0], V[:, 0])
    np.testing.assert_allclose(P.attend_scheme(Q, K[:, 0], V[:, 0], quantize_query=False), sp.float_q, atol=1e-7)


def test_outlier_rows():
    rng = np.random.default_rng(12)
    x = P.outlier_rows(4000, 128, rng, channels=(1, 2, 99), factor=25.0)
    assert x.dtype == np.float32 and x.shape == (4000, 128)
    np.testing.assert_allclose(x[:, [1, 2, 99]].mean(axis=0), [25, -25, 25], atol=0.1)
    np.testing.assert_allclose(x[:, [1, 2, 99]].std(axis=0), 1.0, atol=0.05)
    assert abs(x[:, 10].mean()) < 0.1
