"""The one way the workbook compares two timings (lessons 03, 05b, 08 and 09, and the benchmark).

``compare({"a": sample_a, "b": sample_b}, rounds)`` times the two contenders in interleaved rounds
(``timing._rounds``: each round samples both, the order alternating), and pairs them by round: a slow
moment of the machine slows both samples of one round, so the ratio of that round's two samples
(b's time / a's time) is steadier than either time. The ratio reported is the median of the rounds'
ratios; its band is the range that holds the true median ratio with at least 95 % confidence, read
from the sorted ratios by the sign test (each round's ratio falls on either side of the true median
with probability 1/2, whatever the noise's shape; Conover, *Practical Nonparametric Statistics*,
3rd ed., section 3.2). With 6 or 7 rounds the band is the lowest to the highest ratio.

The verdict has three outcomes, and a sentence in the student's language says it:
  * "a faster": the whole band is above 1 + MARGIN;
  * "b faster": the whole band is below 1 / (1 + MARGIN);
  * "cannot tell here": the band reaches into the margin, or the machine was busy (its load average
    above its number of cores, before or after: programs then waited for a core, and one contender
    may have waited more than the other).
A timing on a busy machine never raises: it says that it cannot tell."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from . import validate as check
from .language import _
from .timing import MAX_ROUNDS, _rounds

MIN_ROUNDS = 6   # the fewest rounds whose lowest-to-highest range holds the median at 95 % (1 - 2 / 2**6)
# Differences under 5 % are called "cannot tell" even when this run's band excludes them: between runs of
# one comparison, the same kernel on the same data moved by up to 10 % at 8K tokens here (which pages the
# cache got, clock changes), and a band is this run's noise only.
MARGIN = 0.05
CONFIDENCE = 0.95


def load_average() -> float | None:
    """The 1-minute load average; None where the system does not keep one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def median_band(ratios, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(median, low, high) of ``ratios``: the band [low, high] of order statistics that holds the true
    median with probability at least ``confidence`` (the sign test's interval)."""
    r = np.sort(np.asarray(ratios, float))
    n = len(r)

    def outside(k: int) -> float:  # P(the median lies outside r[k] .. r[n-1-k]) = 2 P(Binomial(n, 1/2) <= k)
        return 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    k = 0
    while k + 1 <= (n - 1) // 2 and outside(k + 1) <= 1 - confidence:
        k += 1
    return float(np.median(r)), float(r[k]), float(r[n - 1 - k])


@dataclass(frozen=True)
class Verdict:
    """What ``compare`` found. ``ratio``: b's time / a's time, the median over the rounds (above 1: a is
    faster); ``band``: its 95 % range; ``ns``: each contender's median sample; ``samples``: every sample,
    in the order of the rounds; ``load``: the 1-minute load average before and after (None where the
    system keeps none); ``cores``: the machine's cores."""
    a: str
    b: str
    ratio: float
    band: tuple[float, float]
    rounds: int
    ns: dict
    samples: dict
    load: tuple
    cores: int

    @property
    def busy(self) -> bool:
        return any(x is not None and x > self.cores for x in self.load)

    @property
    def measured(self) -> str:
        """"a", "b" or "same": what this run's band says, whatever the load (the stability test reads it)."""
        if self.band[0] > 1 + MARGIN:
            return "a"
        if self.band[1] < 1 / (1 + MARGIN):
            return "b"
        return "same"

    @property
    def outcome(self) -> str:
        """"a", "b", or "cannot tell" (the band reaches into the margin, or the machine was busy)."""
        return "cannot tell" if self.busy or self.measured == "same" else self.measured

    def __str__(self) -> str:
        lo, hi = self.band
        loads = [x for x in self.load if x is not None]
        run = _("{rounds} interleaved rounds, load {load} on {cores} cores").format(
            rounds=self.rounds, load=f"{max(loads):.1f}" if loads else "?", cores=self.cores)
        if self.busy:
            return _("{a} vs {b}: cannot tell here, the machine was busy ({run}); run the cell again when it is "
                     "quieter").format(a=self.a, b=self.b, run=run)
        if self.outcome != "cannot tell":  # the sentence names a first, as compare was given them, then the faster
            a_won = self.outcome == "a"
            return _("{a} vs {b}: {fast} faster by {x:.2f}x (this run's band {lo:.2f}-{hi:.2f}x; {run})").format(
                a=self.a, b=self.b, fast=self.a if a_won else self.b, x=self.ratio if a_won else 1 / self.ratio,
                lo=lo if a_won else 1 / hi, hi=hi if a_won else 1 / lo, run=run)
        return _("{a} vs {b}: cannot tell here: the time of {b} / the time of {a} is {x:.2f}, and this run's band "
                 "{lo:.2f}-{hi:.2f} reaches within {margin:.0%} of the same ({run})").format(
                 a=self.a, b=self.b, x=self.ratio, lo=lo, hi=hi, margin=MARGIN, run=run)


def compare(contenders: dict, rounds: int = 7, close=()) -> Verdict:
    """Time two contenders (``{"name a": sample_a, "name b": sample_b}``, each a function of no arguments
    returning one sample's ns, e.g. ``timing.kernel_contenders``) in ``rounds`` interleaved rounds, after a
    warm-up call each, and return the ``Verdict``. The objects of ``close`` are closed after."""
    try:
        if not isinstance(contenders, dict) or len(contenders) != 2:
            raise ValueError(_("compare takes a dict of exactly two contenders, name -> function"))
        for name, fn in contenders.items():
            if not callable(fn):
                raise TypeError(_("contender {name!r} must be a function of no arguments").format(name=name))
        rounds = check.integer("rounds", rounds, minimum=MIN_ROUNDS)
        check.at_most("rounds", rounds, MAX_ROUNDS, _("rounds of one interleaved timing"))
        before = load_average()
        samples = _rounds(contenders, rounds)
        after = load_average()
    finally:
        for c in close:
            c.close()
    return verdict(samples, (before, after))


def verdict(samples: dict, load: tuple = (None,), cores: int | None = None) -> Verdict:
    """The ``Verdict`` of two contenders' samples paired by round (``{a: [ns, ...], b: [ns, ...]}``, a first), as
    ``compare`` timed them or as a file saved them; ``load``: the load averages seen, ``cores``: the machine's."""
    a, b = samples
    ratio, lo, hi = median_band(np.asarray(samples[b]) / np.asarray(samples[a]))
    return Verdict(a, b, ratio, (lo, hi), len(samples[a]), {n: float(np.median(s)) for n, s in samples.items()},
                   samples, tuple(load), cores or os.cpu_count() or 1)
