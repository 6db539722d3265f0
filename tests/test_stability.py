"""Each comparison a lesson publishes (``lessonkit.lessons.comparisons``) keeps its direction: run three times at
a reduced size, its verdict never says "a faster" in one run and "b faster" in another. "Cannot tell" is
allowed (that is what the band is for), and the load is not consulted here (``Verdict.measured``): under
pytest's two workers the machine is loaded by design, and a verdict that flips under load would flip on a
student's busy laptop too. Speed itself is never asserted.

The sizes are the lessons' comparisons made small enough for a test (about 2-6 s each), at lengths where each
comparison's effect still shows: in the last-level cache (8K and under) and, for the pages, beyond it."""
from __future__ import annotations

import inspect

import numpy as np

import pytest

from lessonkit.lessons import comparisons as C

RUNS = 3
_rng = np.random.default_rng(7)
Q_STREAM, KV_STREAM = _rng.standard_normal(128, dtype=np.float32), _rng.standard_normal((2, 4096, 128), dtype=np.float32)
REDUCED = {
    "kernels: fast vs neon": (C.kernels, ("fast", "neon", 4096)),
    "kernels: neon vs two_pass_scores": (C.kernels, ("neon", "two_pass_scores", 4096)),
    "kernels: neon vs two_pass_recompute": (C.kernels, ("neon", "two_pass_recompute", 4096)),
    "grouped_vs_calls: fast": (C.grouped_vs_calls, (8192,)),
    "grouped_vs_calls: neon": (C.grouped_vs_calls, (8192, "per_head")),
    "cold_vs_warm": (C.cold_vs_warm, (16384,)),
    "cold_vs_warm: two_pass_scores": (C.cold_vs_warm, (16384, "two_pass_scores")),
    "streamed": (C.streamed, (Q_STREAM, *KV_STREAM)),   # 8 chunks of 512 tokens
    "layout": (C.layout, (4096,)),
    "pages": (C.pages, (65536,)),
    "threads": (C.threads, (16384,)),
}


def test_every_comparison_is_held():
    """A comparison added to the module without a reduced run here fails this test."""
    public = {n for n, f in inspect.getmembers(C, inspect.isfunction)
              if f.__module__ == C.__name__ and not n.startswith("_") and n != "inputs"}
    assert public == {f.__name__ for f, unused in REDUCED.values()}


@pytest.mark.parametrize("name", REDUCED)
def test_the_verdict_does_not_flip(name):
    """Three runs of one comparison (about 2-6 s each here: it times both contenders in 7 rounds)."""
    fn, args = REDUCED[name]
    runs = [fn(*args) for unused in range(RUNS)]
    measured = [v.measured for v in runs]
    print(name, "; ".join(f"{v.measured} {v.ratio:.2f} ({v.band[0]:.2f}-{v.band[1]:.2f})" for v in runs))
    assert not {"a", "b"} <= set(measured), (f"{name}: the verdict flipped between runs: "
                                           + "; ".join(str(v) for v in runs))
