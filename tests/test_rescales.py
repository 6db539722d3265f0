"""lessonkit.rescales (lesson 02): rescale counts from the compiled kernel's trace, the
random-order theory, the kernel over a prefix of the cache, the synthetic score sequence."""
from __future__ import annotations

import itertools
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import lessonkit as lk  # noqa: E402
from lessonkit import rescales, softmax  # noqa: E402
from lessonkit.synthetic import cache_with_scores  # noqa: E402

from conftest import make_case  # noqa: E402


def _records(x) -> int:
    """New maxima counted the plain way, independently of the kernel and of lessonkit.softmax."""
    best, n = -math.inf, 0
    for v in x:
        if v > best:
            best, n = v, n + 1
    return n


def test_count_rescales_ordered_and_hand_made():
    assert rescales.count_rescales(np.arange(50, dtype=np.float32)) == 50       # increasing
    assert rescales.count_rescales(np.arange(50, dtype=np.float32)[::-1]) == 1  # decreasing
    s = np.array([1.0, 3.0, 2.0, 3.0, 5.0, -1.0, 5.5], np.float32)             # a tie does not count
    assert rescales.count_rescales(s) == 4 == _records(s)


def test_count_rescales_matches_plain_count_on_random_scores():
    rng = np.random.default_rng(3)
    for n in (1, 7, 300):
        s = rng.normal(0, 3, n).astype(np.float32)
        assert rescales.count_rescales(s, head_dim=64, block_size=5) == _records(s)


def test_records_theory_against_all_permutations():
    for n in (1, 2, 5, 6):
        counts = np.array([_records(p) for p in itertools.permutations(range(n))], float)
        assert softmax.harmonic(n) == pytest.approx(counts.mean(), rel=1e-12)
        assert rescales.records_variance(n) == pytest.approx(counts.var(), rel=1e-12, abs=1e-12)


def test_random_order_counts_shape_seed_and_mean():
    ns = [8, 64]
    a = rescales.random_order_counts(ns, trials=40, seed=5)
    assert a.shape == (2, 40) and a.dtype == np.int64
    assert (a >= 1).all() and (a[0] <= 8).all()
    np.testing.assert_array_equal(a, rescales.random_order_counts(ns, trials=40, seed=5))
    for i, n in enumerate(ns):  # mean within 5 standard errors of H_n
        se = math.sqrt(rescales.records_variance(n) / 40)
        assert abs(a[i].mean() - softmax.harmonic(n)) < 5 * se


def test_realistic_scores_has_its_features():
    s = rescales.realistic_scores(2000, seed=4)
    assert s.shape == (2000,) and s.dtype == np.float32 and np.isfinite(s).all()
    assert s[0] == np.float32(7.0)                       # the sink
    assert s[-20:].mean() > s[:-20].mean() + 2           # the recency rise
    np.testing.assert_array_equal(s, rescales.realistic_scores(2000, seed=4))
    assert not np.array_equal(s, rescales.realistic_scores(2000, seed=5))
    flat = rescales.realistic_scores(500, seed=1, n_spikes=0, recency=0, drift_step=0, noise=0)
    np.testing.assert_allclose(flat[1:], 1.0)            # only the level is left
    spiky = rescales.realistic_scores(500, seed=1, n_spikes=3, recency=0, drift_step=0, noise=0,
                                      spike_height=(4.0, 5.0))
    assert ((spiky[1:] > 4.9) == (spiky[1:] > 1.5)).all() and (spiky[1:] > 1.5).sum() == 3
    with pytest.raises(ValueError):
        rescales.realistic_scores(1)


def test_attend_first_is_the_kernel_on_a_prefix_and_zero_on_nothing():
    cache, q, K, V = make_case(2, 30, 2, 64, 8)
    full = lk.attend(q, cache, 1)
    assert rescales.attend_first(q, cache, 1, 30, 1 / 8).tobytes() == full.tobytes()
    short = lk.KVCacheQ8(2, 64, 8)
    short.append(K[:11], V[:11])
    assert rescales.attend_first(q, cache, 1, 11, 1 / 8).tobytes() == lk.attend(q, short, 1).tobytes()
    zero = rescales.attend_first(q, cache, 1, 0, 1 / 8)  # the loop never runs: S == 0 guard
    assert (zero == 0).all()
    with pytest.raises(ValueError, match="seq_len"):
        rescales.attend_first(q, cache, 1, 31, 1 / 8)


def test_scores_below_start_give_zeros():
    cache, q, scale = cache_with_scores(np.array([-2e9, -3e9, -1.5e9], np.float32), head_dim=32)
    out, tr = lk.attend(q, cache, 0, scale=scale, trace=True)
    assert (out == 0).all() and (tr.S == 0).all() and tr.n_rescales == 0


def test_plot_running_max_marks_the_rescales():
    s = np.array([1.0, 0.5, 2.0, 1.0, 3.0, 2.5], np.float32)
    cache, q, scale = cache_with_scores(s, head_dim=32)
    _, tr = lk.attend(q, cache, 0, scale=scale, trace=True)
    fig, (a, b) = plt.subplots(2, 1)
    rescales.plot_running_max(tr, a, b, "t")
    marks = [line for line in a.get_lines() if line.get_marker() == "v"]
    assert len(marks) == 1 and marks[0].get_xdata().tolist() == [0, 2, 4]
    assert b.get_yscale() == "log" and a.get_title() == "t"
    plt.close(fig)
