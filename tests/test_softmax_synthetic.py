"""lessonkit.softmax (three-pass and online softmax in numpy) and lessonkit.synthetic."""
from __future__ import annotations

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import softmax
from lessonkit.synthetic import cache_with_scores


def test_online_equals_three_pass():
    rng = np.random.default_rng(0)
    s = rng.normal(0, 5, 500)
    V = rng.standard_normal((500, 16))
    run = softmax.online(s, V)
    np.testing.assert_allclose(run.out, softmax.three_pass(s, V), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(run.M, np.maximum.accumulate(s))
    assert run.rescaled.sum() == (s == np.maximum.accumulate(s)).sum()  # no ties in random reals


def test_online_ordered_extremes():
    up, down = np.arange(10.0), np.arange(10.0)[::-1]
    assert softmax.online(up).rescaled.all()           # every score a new max: worst case
    assert softmax.online(down).rescaled.sum() == 1    # only the first: best case


def test_online_start_value_matters_only_below_it():
    s = np.array([-2e9, -3e9])
    assert softmax.online(s).S[-1] == 0                      # M = -1e9 is never raised
    assert softmax.online(s, m_start=-np.inf).S[-1] == 1.0   # -inf is always raised
    np.testing.assert_array_equal(softmax.online(np.array([1.0, 2.0]), m_start=-np.inf).S,
                                  softmax.online(np.array([1.0, 2.0])).S)


def test_harmonic():
    assert softmax.harmonic(1) == 1.0
    assert softmax.harmonic(4) == pytest.approx(1 + 1 / 2 + 1 / 3 + 1 / 4)


@pytest.mark.parametrize("head_dim", [32, 128])
def test_cache_with_scores_gives_those_scores(head_dim):
    want = np.array([0.0, -3.5, 7.25, 80.0, -80.0, 1e-3, 2.0, 2.0], np.float32)
    cache, q, scale = cache_with_scores(want, head_dim=head_dim, block_size=3)
    out, tr = lk.attend(q, cache, 0, scale=scale, trace=True)
    np.testing.assert_allclose(tr.s, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="non-empty"):
        cache_with_scores([])
    with pytest.raises(ValueError, match="V must have shape"):
        cache_with_scores([1.0, 2.0], V=np.zeros((3, 64), np.float32))


def test_cache_pointer_table_and_blocks():
    cache, _, _ = cache_with_scores(np.arange(10, dtype=np.float32), block_size=4)
    table = cache.pointer_table("k")
    assert table.shape == (3,) and table.dtype == np.uint64
    assert [b.ctypes.data for b in cache.k_blocks] == table.tolist()
    assert not cache.k_blocks[0].flags.writeable
    with pytest.raises(ValueError, match="which must be"):
        cache.pointer_table("x")
