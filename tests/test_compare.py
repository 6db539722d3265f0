"""The comparison helper (lessonkit.core.compare): its band, its three verdicts and their sentences, on
contenders whose samples are made up here, so that every expected verdict is known exactly."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import lessonkit
from lessonkit.core import compare as cmp


def made_up(values):
    """A contender that returns the given samples in turn (the first is compare's warm-up call)."""
    it = itertools.cycle(values)
    return lambda: next(it)


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(cmp, "load_average", lambda: 0.1)


@pytest.mark.parametrize("n", range(6, 40))
def test_band_holds_the_median_at_95_percent(n):
    """The band's order statistics: its coverage by the binomial formula is at least 95 %, and one step
    narrower would be under 95 % (the band is the narrowest the sign test allows)."""
    med, lo, hi = cmp.median_band(np.arange(n, dtype=float))
    k = int(lo)
    assert hi == n - 1 - k and med == np.median(np.arange(n))
    outside = lambda j: 2 * sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n
    assert outside(k) <= 0.05
    assert k + 1 > (n - 1) // 2 or outside(k + 1) > 0.05


def test_a_faster(quiet):
    v = cmp.compare({"fast": made_up([100, 101, 99]), "slow": made_up([200, 210, 190])}, rounds=7)
    assert v.outcome == v.measured == "a" and v.ns["fast"] == 100 and v.ns["slow"] == 200
    assert v.band[0] > 1.8 and v.band[1] < 2.2
    assert str(v).startswith("fast vs slow: fast faster by 2.00x (this run's band ")


def test_b_faster_and_its_band_inverted(quiet):
    v = cmp.compare({"slow": made_up([300]), "fast": made_up([100, 150])}, rounds=7)
    assert v.outcome == "b"
    # ratios fast/slow are 1/3 or 1/2; the sentence gives slow/fast, so its band is 2x to 3x
    assert str(v).startswith("slow vs fast: fast faster by ") and "band 2.00-3.00x" in str(v)


def test_within_noise_cannot_tell(quiet):
    v = cmp.compare({"a": made_up([100, 120, 90]), "b": made_up([110, 95, 100, 105])}, rounds=9)
    assert v.outcome == "cannot tell" and "cannot tell here" in str(v)


def test_a_small_steady_difference_is_within_the_margin(quiet):
    """3 % every round: this run's band excludes 1, but the margin calls it the same."""
    v = cmp.compare({"a": made_up([100]), "b": made_up([103])}, rounds=7)
    assert v.band == (1.03, 1.03) and v.measured == "same" and v.outcome == "cannot tell"


def test_busy_machine_cannot_tell_and_never_raises(monkeypatch):
    monkeypatch.setattr(cmp, "load_average", lambda: 64.0)
    monkeypatch.setattr(cmp.os, "cpu_count", lambda: 2)
    v = cmp.compare({"fast": made_up([100]), "slow": made_up([300])}, rounds=6)
    assert v.busy and v.measured == "a" and v.outcome == "cannot tell"
    assert "busy" in str(v) and "load 64.0 on 2 cores" in str(v)


def test_no_load_average(monkeypatch):
    monkeypatch.setattr(cmp, "load_average", lambda: None)
    v = cmp.compare({"fast": made_up([100]), "slow": made_up([300])}, rounds=6)
    assert not v.busy and v.outcome == "a" and "load ?" in str(v)


def test_rounds_alternate_and_pair(quiet):
    """Each round samples both contenders, the order alternating: a disturbance that slows one round
    slows both of its samples, and the pairing cancels it."""
    order = []

    def contender(name, ns):
        def sample():
            order.append(name)
            return ns * (10 if len(order) in (7, 8) else 1)  # round 3 (calls 7 and 8, after 2 warm-ups) is slow
        return sample
    v = cmp.compare({"a": contender("a", 100), "b": contender("b", 150)}, rounds=6)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert v.band == (1.5, 1.5) and v.outcome == "a"


def test_chinese_sentences(quiet):
    lessonkit.set_language("zh")
    try:
        fast = str(cmp.compare({"fast": made_up([100]), "slow": made_up([200])}, rounds=6))
        same = str(cmp.compare({"a": made_up([100]), "b": made_up([101])}, rounds=6))
    finally:
        lessonkit.set_language("en")
    assert fast.startswith("fast 对比 slow：fast 更快，速度是另一方的 2.00 倍（")
    assert "cannot tell" not in same and "无法判断" in same


@pytest.mark.parametrize("bad,exc,words", [
    ({"a": made_up([1])}, ValueError, "exactly two"),
    ({"a": made_up([1]), "b": 3}, TypeError, "function of no arguments"),
])
def test_refuses(bad, exc, words):
    with pytest.raises(exc, match=words):
        cmp.compare(bad)


def test_refuses_too_few_rounds():
    with pytest.raises(ValueError, match="rounds must be at least 6"):
        cmp.compare({"a": made_up([1]), "b": made_up([1])}, rounds=5)
