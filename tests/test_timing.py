"""The timing harness measures; these tests only check that it runs the right thing and refuses
bad arguments (speed is never asserted in tests)."""
from __future__ import annotations

import numpy as np
import pytest

import lessonkit as lk
from lessonkit.timing import time_kernel

from conftest import make_case


def test_times_are_positive_and_grow_with_length():
    cache, q, _, _ = make_case(0, 4096, 1, 128, 64)
    t_short = time_kernel(q, cache, seq_len=64, repeats=3, number=50)
    t_long = time_kernel(q, cache, seq_len=4096, repeats=3, number=5)
    assert 0 < t_short and 0 < t_long
    assert t_long > t_short  # 64 times the work; a loose check that seq_len is honoured
    assert time_kernel(q, cache, seq_len=0, backend="scalar", repeats=1, number=10) > 0


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(seq_len=41), ValueError, "seq_len must be below 41"),
    (dict(seq_len=-1), ValueError, "at least 0"),
    (dict(backend="numpy"), ValueError, "backend must be one of"),
    (dict(number=0), ValueError, "number must be at least 1"),
    (dict(repeats=0), ValueError, "repeats must be at least 1"),
])
def test_bad_arguments(small_case, kwargs, exc, words):
    cache = small_case[0]
    with pytest.raises(exc, match=words):
        time_kernel(np.ones(64, np.float32), cache, **kwargs)


def test_cache_bytes():
    cache = lk.KVCacheQ8(8, 128, 64)
    cache.append(np.ones((100, 8, 128), np.float32), np.ones((100, 8, 128), np.float32))
    assert cache.nbytes == 100 * (2 * 8 * 128 + 2 * 4 * 8)
    assert cache.allocated_nbytes >= cache.nbytes
