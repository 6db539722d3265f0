"""Rescale events of the online softmax (a new max: S and VKQ times ``exp(M_old - s)``), counted on the compiled
kernel's trace (lesson 02), with the random-order theory beside them."""
from __future__ import annotations

import numpy as np

from ..core import native
from ..display import plotstyle
from ..core import validate as check
from ..core.cache import KVCacheQ8, attention_args
from ..core.attention import call_kernel
from ..core.language import _
from .bench import lengths
from .synthetic import cache_with_scores
from ..core.trace import run_traced

MAX_SCORES = 1 << 24   # scores of one sequence (realistic_scores, records_variance)
MAX_COUNTED = 1 << 24  # tokens random_order_counts runs through the traced kernel in all


def realistic_scores(n: int = 2000, seed: int = 0, sink: float = 7.0, level: float = 1.0, drift_step: float = 0.05,
                     noise: float = 1.0, recency: float = 6.0, recency_tokens: float = 40.0, n_spikes: int = 8,
                     spike_height: tuple[float, float] = (3.0, 8.0)) -> np.ndarray:
    """A made-up decode score sequence, float32 ``[n]``, imitating real ones: a drifting level (random walk,
    centred), noise on every token, a recency rise at the end, spikes, and an attention sink at token 0."""
    n = check.integer("n", n, minimum=2)
    check.at_most("n", n, MAX_SCORES, "scores of one sequence")
    n_spikes = check.integer("n_spikes", n_spikes, minimum=0, below=n - 1)
    rng = np.random.default_rng(seed)
    drift = np.cumsum(rng.normal(0.0, drift_step, n))
    s = level + drift - drift.mean() + rng.normal(0.0, noise, n)
    s += recency * np.exp(-(n - 1 - np.arange(n)) / recency_tokens)
    spikes = rng.choice(np.arange(1, n - 1), n_spikes, replace=False)
    s[spikes] += rng.uniform(spike_height[0], spike_height[1], n_spikes)
    s[0] = sink
    return s.astype(np.float32)


def count_rescales(scores, head_dim: int = 32, block_size: int = 64) -> int:
    """How many times the compiled kernel raised M over ``scores``, read from its trace."""
    cache, q, scale = cache_with_scores(scores, head_dim=head_dim, block_size=block_size)
    return run_traced(np.empty(cache.head_dim, np.float32), q, cache, 0, scale, fields=("ms",)).n_rescales


def random_order_counts(ns, trials: int = 50, seed: int = 0, head_dim: int = 32) -> np.ndarray:
    """The kernel's rescale counts, int ``[len(ns), trials]``, for ``trials`` sequences of n standard-normal scores
    per n of ``ns``."""
    trials = check.integer("trials", trials, minimum=1)
    ns = lengths("ns", ns, 10_000, "sequence lengths of one call", longest=None)
    check.at_most("sum(ns) x trials", sum(ns) * trials, MAX_COUNTED, "tokens run through the traced kernel")
    rng = np.random.default_rng(seed)
    return np.array([[count_rescales(rng.standard_normal(n, dtype=np.float32), head_dim) for unused in range(trials)]
                     for n in ns], np.int64)


def records_variance(n: int) -> float:
    """Variance of the number of records among n distinct values in random order: value k is one with probability
    1/k, independently, so Var = sum 1/k (1 - 1/k) (the mean is H_n)."""
    n = check.at_most("n", check.integer("n", n, minimum=1), MAX_SCORES, "values summed")
    k = np.arange(1, n + 1, dtype=np.float64)
    return float(np.sum(1.0 / k - 1.0 / k**2))


def attend_first(q: np.ndarray, cache: KVCacheQ8, kv_head: int, seq_len: int, scale: float) -> np.ndarray:
    """The compiled kernel over the first ``seq_len`` tokens of ``cache``, float32 ``[head_dim]``; 0 tokens too
    (the loop over t does not run), which ``lessonkit.attend`` cannot ask for."""
    q, kv_head, scale = attention_args(q, cache, kv_head, scale)
    seq_len = check.integer("seq_len", seq_len, minimum=0, below=cache.seq_len + 1)
    out = np.full(cache.head_dim, np.nan, np.float32)
    return call_kernel(*native.load(), out, q, cache, kv_head, scale, seq_len=seq_len)


def plot_running_max(trace, ax_m, ax_s, title: str = "") -> None:
    """A kernel trace on two axes: scores, running max M and the rescales on ``ax_m``; the running sum S (log scale)
    with the same rescales on ``ax_s``."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    plotstyle.use()
    t, ev = np.arange(trace.seq_len), np.flatnonzero(trace.rescaled)
    ax_m.plot(t, trace.s, ".", ms=2.5, color="0.6")
    ax_m.step(t, trace.M, where="post", color="C0", lw=2)
    ax_m.plot(ev, trace.M[ev], "v", color="C3", ms=9, ls="none")
    # legend handles of their own: a 2.5-pt dot is invisible in a legend
    handles = [Line2D([], [], marker="o", ms=7, ls="none", color="0.6", label=_("score $s_t$")),
               Line2D([], [], color="C0", lw=2, label=_("running max $M_t$")),
               Line2D([], [], marker="v", ms=9, ls="none", color="C3",
                      label=_("rescale (new max): {size}").format(size=ev.size))]
    lo, hi = float(min(trace.s.min(), trace.M.min())), float(trace.M.max())
    span = max(hi - lo, 1e-6)
    ax_m.set_ylim(lo - 0.05 * span, hi + 0.35 * span)  # headroom for the legend: it hides no point
    ax_m.legend(handles=handles, loc="upper center", ncol=3, fontsize=plotstyle.MIN_PT)
    ax_m.set(ylabel=_("score (logit, no unit)"), title=title)
    ax_s.plot(t, trace.S, color="C2", lw=1.8, label=_("running sum $S_t$"))
    ax_s.plot(ev, trace.S[ev], "v", color="C3", ms=9, ls="none", label=_("rescale"))
    ax_s.set_yscale("log")
    ax_s.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax_s.yaxis.set_major_formatter(FuncFormatter(lambda v, unused: f"{v:g}"))
    ax_s.yaxis.set_minor_formatter(NullFormatter())
    ax_s.set(xlabel=_("token t (position in the KV cache)"), ylabel=_("$S_t$ (no unit, log scale)"))
    ax_s.legend(loc="lower right", fontsize=plotstyle.MIN_PT)
    for ax in (ax_m, ax_s):  # made by the caller, perhaps before the style was applied
        plotstyle.apply(ax)
