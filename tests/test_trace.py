"""The traced kernel: the same source as the fast one, recording what it computes."""
from __future__ import annotations

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import softmax
from lessonkit.reference import scores_numpy
from lessonkit.quant import quantize_q

from conftest import make_case

SHAPES = [(1, 1, 32, 1), (33, 2, 64, 7), (1000, 8, 128, 16), (517, 1, 256, 64), (64, 3, 96, 5)]


@pytest.mark.parametrize("seq_len,n_kv,hd,bs", SHAPES)
def test_traced_output_equals_untraced_bit_for_bit(seq_len, n_kv, hd, bs):
    cache, q, _, _ = make_case(seq_len, seq_len, n_kv, hd, bs)
    for kh in range(n_kv):
        out, tr = lk.attend(q, cache, kh, trace=True)
        assert out.tobytes() == lk.attend(q, cache, kh).tobytes()
        assert tr.seq_len == seq_len


@pytest.mark.parametrize("seq_len,n_kv,hd,bs", SHAPES)
def test_trace_agrees_with_replay(seq_len, n_kv, hd, bs):
    cache, q, _, _ = make_case(seq_len + 1, seq_len, n_kv, hd, bs)
    kh = n_kv - 1
    out, tr = lk.attend(q, cache, kh, trace=True)
    # M is the running maximum of s (from the start value -1e9), exactly
    np.testing.assert_array_equal(tr.M, np.maximum.accumulate(np.maximum(tr.s, np.float32(-1e9))))
    assert (np.diff(tr.M) >= 0).all()
    # S and the rescale events agree with a float64 replay of the same scores
    replay = softmax.online(tr.s.astype(np.float64))  # the kernel's online update (article section 2), in float64
    np.testing.assert_array_equal(tr.rescaled, replay.rescaled)
    np.testing.assert_allclose(tr.S, replay.S, rtol=1e-5)
    assert tr.rescaled[0] and tr.ms[0] == 0.0  # the first token always replaces M = -1e9
    # Q's codes and block scales are what the numpy mirror of segment 1 computes
    codes, scales = quantize_q(q)
    np.testing.assert_array_equal(tr.q_codes, codes)
    np.testing.assert_array_equal(tr.q_scales, scales)
    # the int32 block dots are exact, and the scores follow from them
    k = cache.k_codes(kh).astype(np.int32).reshape(seq_len, -1, 32)
    np.testing.assert_array_equal(tr.dots, np.einsum("tbi,bi->tb", k, codes.astype(np.int32).reshape(-1, 32)))
    np.testing.assert_allclose(tr.s, scores_numpy(q, cache, kh, 1 / np.sqrt(hd)), rtol=1e-6, atol=1e-6)
    # the accumulator after the last token, divided once by S, is the output
    np.testing.assert_allclose(tr.vkq[-1] / tr.S[-1], out, rtol=1e-6, atol=1e-7)


def test_trace_only_for_the_compiled_kernel(small_case):
    cache, q = small_case[0], np.ones(64, np.float32)
    with pytest.raises(ValueError, match="backend='neon'"):
        lk.attend(q, cache, 0, backend="numpy", trace=True)
    with pytest.raises(TypeError, match="trace must be True or False"):
        lk.attend(q, cache, 0, trace="yes")


def test_q_quantized_once_and_each_row_read_once():
    cache, q, _, _ = make_case(9, 100, 2, 64, 7)
    ffi, _ = lk.native.load()
    for kh in range(2):
        _, tr = lk.attend(q, cache, kh, trace=True)
        assert tr.n_q_quantized == 1
        kptr, vptr, *_ = cache.kernel_args(kh, ffi)
        expect_k = [int(ffi.cast("uintptr_t", kptr[t // 7])) + (t % 7) * 128 + kh * 64 for t in range(100)]
        expect_v = [int(ffi.cast("uintptr_t", vptr[t // 7])) + (t % 7) * 128 + kh * 64 for t in range(100)]
        assert tr.k_rows.tolist() == expect_k and tr.v_rows.tolist() == expect_v
        assert len(set(expect_k)) == 100  # 100 different rows, each read for exactly one token
