"""Rescale events of the online softmax, counted on the compiled kernel (introduced in lesson 02).

A *rescale* happens when token t's score is a new maximum (``s > M`` in segment 3 of the kernel):
S and the accumulator VKQ are multiplied by ``ms = exp(M_old - s)``. The helpers here build score
sequences (a synthetic "realistic" one, random orders), run the traced kernel over them and count
the rescales it recorded; ``lessonkit.softmax.harmonic`` and ``records_variance`` give the
random-order theory."""
from __future__ import annotations

import numpy as np

from . import native
from . import plotstyle
from . import validate as check
from .cache import KVCacheQ8
from .language import tr
from .kernels.attention import call_kernel
from .synthetic import cache_with_scores
from .trace import run_traced

MAX_SCORES = 1 << 24        # scores of one sequence (realistic_scores, records_variance)
MAX_COUNTED = 1 << 24       # tokens random_order_counts runs through the traced kernel in all


def realistic_scores(n: int = 2000, seed: int = 0, sink: float = 7.0, level: float = 1.0,
                     drift_step: float = 0.05, noise: float = 1.0, recency: float = 6.0,
                     recency_tokens: float = 40.0, n_spikes: int = 8,
                     spike_height: tuple[float, float] = (3.0, 8.0)) -> np.ndarray:
    """A synthetic decode-attention score sequence, float32 ``[n]``, shaped like real ones.

    Made of (all from ``np.random.default_rng(seed)``, in this order):
    - a slowly drifting level: ``level`` plus a random walk with N(0, drift_step) steps, centred
      to mean 0;
    - independent noise N(0, noise) on every token;
    - a recency rise toward the end: ``recency * exp(-(n - 1 - t) / recency_tokens)``;
    - ``n_spikes`` sharp spikes at random positions in 1 .. n-2, each raised by
      U(spike_height) above the rest;
    - an attention sink: token 0's score is set to ``sink``.
    It is made up, not recorded from a model: it only imitates the features named above."""
    n = check.integer("n", n, minimum=2)
    check.at_most("n", n, MAX_SCORES, "scores of one sequence")
    n_spikes = check.integer("n_spikes", n_spikes, minimum=0, below=n - 1)
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    drift = np.cumsum(rng.normal(0.0, drift_step, n))
    drift -= drift.mean()
    s = level + drift + rng.normal(0.0, noise, n)
    s += recency * np.exp(-(n - 1 - t) / recency_tokens)
    spikes = rng.choice(np.arange(1, n - 1), n_spikes, replace=False)
    s[spikes] += rng.uniform(spike_height[0], spike_height[1], n_spikes)
    s[0] = sink
    return s.astype(np.float32)


def count_rescales(scores, head_dim: int = 32, block_size: int = 64) -> int:
    """How many times the compiled kernel rescaled (raised M) over ``scores``, read from its
    trace: ``cache_with_scores`` builds a cache whose kernel scores are ``scores``."""
    cache, q, scale = cache_with_scores(scores, head_dim=head_dim, block_size=block_size)
    tr = run_traced(np.empty(cache.head_dim, np.float32), q, cache, 0, scale, fields=("ms",))
    return tr.n_rescales


def random_order_counts(ns, trials: int = 50, seed: int = 0, head_dim: int = 32) -> np.ndarray:
    """Rescale counts of the compiled kernel for scores in random order: for each n in ``ns``,
    ``trials`` sequences of n independent standard-normal float32 scores (distinct values in a
    uniformly random order). Returns int ``[len(ns), trials]``. At most MAX_COUNTED tokens in all
    (sum(ns) x trials), checked before the first run."""
    trials = check.integer("trials", trials, minimum=1)
    if isinstance(ns, (str, bytes)) or not hasattr(ns, "__len__"):
        raise TypeError(tr(f"ns must be a list of sequence lengths; got {type(ns).__name__}",
                           f"ns 应是一组序列长度（list）；收到的是 {type(ns).__name__}"))
    check.at_most("len(ns)", len(ns), 10_000, "sequence lengths of one call")
    ns = [check.integer("n", n, minimum=1) for n in ns]
    check.at_most("sum(ns) x trials", sum(ns) * trials, MAX_COUNTED, "tokens run through the traced kernel")
    rng = np.random.default_rng(seed)
    counts = np.zeros((len(ns), trials), np.int64)
    for i, n in enumerate(ns):
        for j in range(trials):
            counts[i, j] = count_rescales(rng.standard_normal(n, dtype=np.float32), head_dim)
    return counts


def records_variance(n: int) -> float:
    """Variance of the number of new maxima (records) among n distinct values in random order.
    Its mean is H_n (``lessonkit.softmax.harmonic``): value k is a record with probability 1/k,
    and these events are independent, so Var = sum 1/k (1 - 1/k) = H_n - H_n^(2)."""
    n = check.at_most("n", check.integer("n", n, minimum=1), MAX_SCORES, "values summed")
    k = np.arange(1, n + 1, dtype=np.float64)
    return float(np.sum(1.0 / k - 1.0 / k**2))


def attend_first(q: np.ndarray, cache: KVCacheQ8, kv_head: int, seq_len: int,
                 scale: float) -> np.ndarray:
    """The compiled kernel ``flash_attn_single_q_q8_neon`` over the first ``seq_len`` tokens of
    ``cache`` only, 0 included (``lessonkit.attend`` refuses an empty cache; here the loop over
    t simply does not run). Returns float32 ``[head_dim]``."""
    check.kv_cache(cache)
    q = check.float32_array("q", q, (cache.head_dim,))
    kv_head = check.integer("kv_head", kv_head, minimum=0, below=cache.n_kv_heads)
    seq_len = check.integer("seq_len", seq_len, minimum=0, below=cache.seq_len + 1)
    scale = check.scale(scale)
    ffi, lib = native.load()
    out = np.full(cache.head_dim, np.nan, np.float32)  # NaN until the kernel writes it
    return call_kernel(ffi, lib, out, q, cache, kv_head, scale, seq_len=seq_len)


def plot_running_max(trace, ax_m, ax_s, title: str = "") -> None:
    """Draw a kernel trace on two axes: scores, running max M and the rescale events on ``ax_m``;
    the running sum S (log scale) with the same events on ``ax_s``."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    plotstyle.use()
    t = np.arange(trace.seq_len)
    ev = np.flatnonzero(trace.rescaled)
    ax_m.plot(t, trace.s, ".", ms=2.5, color="0.6")
    ax_m.step(t, trace.M, where="post", color="C0", lw=2)
    ax_m.plot(ev, trace.M[ev], "v", color="C3", ms=9, ls="none")
    # Legend handles drawn apart from the data: a 2.5-pt dot, right for 2000 points, is invisible in a legend.
    handles = [Line2D([], [], marker="o", ms=7, ls="none", color="0.6", label=tr("score $s_t$", "分数 sₜ")),
               Line2D([], [], color="C0", lw=2, label=tr("running max $M_t$", "运行最大值 Mₜ")),
               Line2D([], [], marker="v", ms=9, ls="none", color="C3", label=tr(f"rescale (new max): {ev.size}", f"rescale（新最大值）：{ev.size} 次"))]
    # Headroom above the highest score holds the legend, so that it hides no data point.
    lo, hi = float(min(trace.s.min(), trace.M.min())), float(trace.M.max())
    span = max(hi - lo, 1e-6)
    ax_m.set_ylim(lo - 0.05 * span, hi + 0.35 * span)
    ax_m.legend(handles=handles, loc="upper center", ncol=3, fontsize=plotstyle.MIN_PT)
    ax_m.set_ylabel(tr("score (logit, no unit)", "分数（logit，无单位）"))
    ax_m.set_title(title)
    ax_s.plot(t, trace.S, color="C2", lw=1.8, label=tr("running sum $S_t$", "运行和 Sₜ"))
    ax_s.plot(ev, trace.S[ev], "v", color="C3", ms=9, ls="none", label=tr("rescale", "rescale"))
    ax_s.set_yscale("log")
    ax_s.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax_s.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax_s.yaxis.set_minor_formatter(NullFormatter())
    ax_s.set_xlabel(tr("token t (position in the KV cache)", "token t（在 KV 缓存中的位置）"))
    ax_s.set_ylabel(tr("$S_t$ (no unit, log scale)", "Sₜ（无单位，对数坐标）"))
    ax_s.legend(loc="lower right", fontsize=plotstyle.MIN_PT)
    for ax in (ax_m, ax_s):  # the axes were made by the caller, perhaps before the style was applied
        plotstyle.apply(ax)
