"""Every bad input gives a Python exception that names the problem; none reaches C.
(A crash here would end the whole pytest process, so this file passing is itself the proof.)
The attention calls share their checks (lessonkit.cache.attention_args): each class of bad input
is fed to every public call that takes it."""
from __future__ import annotations

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import timing, trace
from lessonkit.kernels import split


def q_of(n=64, dtype=np.float32):
    return np.ones(n, dtype)


# every public call of a kernel over (q, cache, kv_head)
CALLS = {
    **{f"attend {b}": (lambda q, c, h=0, b=b: lk.attend(q, c, h, backend=b)) for b in lk.kernels.attention.BACKENDS},
    "attend traced": lambda q, c, h=0: lk.attend(q, c, h, trace=True),
    "attend_split": lambda q, c, h=0: lk.attend_split(q, c, h, 2, 2),
    "attend_chunks": lambda q, c, h=0: split.attend_chunks(q, c, h, [1]),
    "partial": lambda q, c, h=0: split.partial(q, c, h, 0, 1),
    "run_traced": lambda q, c, h=0: trace.run_traced(np.empty(64, np.float32), q, c, h),
    "time_kernel": lambda q, c, h=0: timing.time_kernel(q, c, h, repeats=1, number=1),
    "parallel_capacity": lambda q, c, h=0: split.parallel_capacity(q, c, h, 1, number=1, repeats=1),
}
# ... and with a group of queries (its bad qs: tests/test_kernels_split.py)
CACHE_CALLS = {**CALLS, "attend_group": lambda q, c, h=0: lk.attend_group(np.stack([q, q]), c, h)}


def test_empty_cache():
    empty = lk.KVCacheQ8(2, 64, 16)
    for name, call in CACHE_CALLS.items():
        with pytest.raises(ValueError, match="the cache is empty: append at least one token"):
            call(q_of(), empty)
            pytest.fail(name)


def test_not_a_cache():
    for name, call in CACHE_CALLS.items():
        for bad in ({"k": []}, None, "cache"):
            with pytest.raises(TypeError, match="cache must be a lessonkit.KVCacheQ8"):
                call(q_of(), bad)
                pytest.fail(name)


@pytest.mark.parametrize("q,exc,words", [
    ([1.0] * 64, TypeError, "q must be a numpy array"),
    (np.ones(64, np.float64), TypeError, "q must have dtype float32"),
    (np.ones(64, np.float16), TypeError, "float32"),
    (np.ones(96, np.float32), ValueError, r"q must have shape \[64\]"),
    (np.ones((1, 64), np.float32), ValueError, "shape"),
    (np.ones(128, np.float32)[::2], ValueError, "C-contiguous"),
    (np.full(64, np.nan, np.float32), ValueError, "NaN or Inf"),
    (np.r_[np.ones(63), np.inf].astype(np.float32), ValueError, r"index \(63,\)"),
])
def test_bad_q(small_case, q, exc, words):
    cache = small_case[0]
    for name, call in CALLS.items():
        with pytest.raises(exc, match=words):
            call(q, cache)
            pytest.fail(name)


@pytest.mark.parametrize("kv_head,exc,words", [
    (-1, ValueError, "kv_head must be at least 0"),
    (2, ValueError, "kv_head must be below 2"),
    (10**12, ValueError, "below"),
    (1.0, TypeError, "kv_head must be an int"),
    (True, TypeError, "int"),
    ("0", TypeError, "int"),
])
def test_bad_kv_head(small_case, kv_head, exc, words):
    for name, call in CACHE_CALLS.items():
        with pytest.raises(exc, match=words):
            call(q_of(), small_case[0], kv_head)
            pytest.fail(name)


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
    (dict(scale=float("inf")), ValueError, "finite"),
    (dict(scale="0.1"), TypeError, "scale must be a real number"),
    (dict(backend="cuda"), ValueError, "backend must be one of"),
])
def test_bad_options(small_case, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        lk.attend(q_of(), small_case[0], 0, **kwargs)


@pytest.mark.parametrize("args,exc,words", [
    ((2, 48, 16), ValueError, "multiple of 32"),
    ((2, 16, 16), ValueError, "at least 32"),
    ((2, 288, 16), ValueError, "at most|between"),
    ((2, 512, 16), ValueError, "between 32 and 256"),
    ((0, 64, 16), ValueError, "n_kv_heads must be at least 1"),
    ((2, 64, 0), ValueError, "block_size must be at least 1"),
    ((2, 64.0, 16), TypeError, "head_dim must be an int"),
    ((2, 64, None), TypeError, "block_size must be an int"),
])
def test_bad_cache_shape(args, exc, words):
    with pytest.raises(exc, match=words):
        lk.KVCacheQ8(*args)


GOOD = np.ones((3, 2, 64), np.float32)


@pytest.mark.parametrize("k,v,exc,words", [
    (GOOD.astype(np.float64), GOOD, TypeError, "k must have dtype float32"),
    (GOOD, GOOD.tolist(), TypeError, "v must be a numpy array"),
    (np.ones((3, 3, 64), np.float32), GOOD, ValueError, r"k must have shape \[n, 2, 64\]"),
    (np.ones((3, 2, 32), np.float32), GOOD, ValueError, "shape"),
    (GOOD, np.ones((4, 2, 64), np.float32), ValueError, r"v must have shape \[3, 2, 64\]"),
    (np.ones((2, 64), np.float32), GOOD, ValueError, r"v must have shape \[2, 64\]"),
    (np.ones(64, np.float32), np.ones(64, np.float32), ValueError, "shape"),
    (np.ones((3, 2, 128), np.float32)[:, :, ::2], GOOD, ValueError, "C-contiguous"),
    (np.where(np.arange(384).reshape(3, 2, 64) == 100, np.nan, 1).astype(np.float32), GOOD,
     ValueError, r"k holds NaN or Inf \(first at index \(0, 1, 36\)\)"),
    (GOOD, np.full((3, 2, 64), -np.inf, np.float32), ValueError, "v holds NaN or Inf"),
])
def test_bad_append(k, v, exc, words):
    cache = lk.KVCacheQ8(2, 64, 16)
    cache.append(GOOD, GOOD)
    with pytest.raises(exc, match=words):
        cache.append(k, v)
    assert len(cache) == 3  # a refused append changes nothing
    np.testing.assert_array_equal(cache.k_codes(0), np.full((3, 64), 127, np.int8))


def test_bad_cache_reads(small_case):
    cache = small_case[0]
    with pytest.raises(ValueError, match="kv_head must be below 2"):
        cache.k_codes(2)
    with pytest.raises(ValueError, match="empty"):
        lk.KVCacheQ8(1, 32, 4).kernel_args(0, lk.native.load()[0])


@pytest.mark.parametrize("q,K,V,words", [
    (np.ones((2, 2, 4)), np.ones((3, 4)), np.ones((3, 4)), r"q must have shape \[hd\] or \[n, hd\]"),
    (np.ones((2, 5)), np.ones((3, 4)), np.ones((3, 4)), r"K must have shape \[seq_len, 5\]"),
    (np.ones(4), np.ones((3, 5)), np.ones((3, 4)), r"K must have shape \[seq_len, 4\]"),
    (np.ones(4), np.ones((3, 4)), np.ones((2, 4)), "same number"),
    (np.ones(4), np.ones((0, 4)), np.ones((0, 4)), ">= 1"),
])
def test_bad_reference_inputs(q, K, V, words):
    with pytest.raises(ValueError, match=words):
        lk.reference.attention(q, K, V)
