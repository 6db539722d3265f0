"""The timing comparisons the lessons print verdicts for, each computed here once with the protocol of
``lessonkit.core.compare`` (interleaved rounds, paired ratios, a 95 % band, the load recorded), so that two
lessons showing one comparison compute it the same way: the grouped call against four calls (lessons 08 and
09), ``fast`` against the article's kernel (08 and 09), cold against warm and the two-pass kernels against the
single pass, and two streamed runs (05b), one head alone against eight heads interleaved (03), 4 KiB pages against huge pages (09),
two threads against one (08).

Every function returns a ``Verdict``: ``print(v)`` says which is faster and by how much, or that this run
cannot tell, in the student's language; ``v.ns`` holds each contender's median ns per call. The inputs are
``bench.make_inputs``'s (head_dim 128, blocks of 64 tokens, on huge pages unless said), built once per length."""
from __future__ import annotations

from functools import lru_cache

from ..core import timing, validate as check
from ..core.attention import time_group
from ..core.compare import Verdict, compare
from ..core.language import _
from . import bench, streaming
from .split import attend_split

ROUNDS = 7          # the fewest rounds whose lowest-to-highest ratio is a 98 % band (compare.MIN_ROUNDS is 6)
SAMPLE_TOKENS = 1 << 18   # tokens of back-to-back calls in one warm sample: about 2-20 ms here


@lru_cache(maxsize=4)
def inputs(n: int, n_kv_heads: int = 1, huge_pages: bool = True):
    """``bench.make_inputs(n, n_kv_heads, huge_pages=huge_pages)``, built once per process (a 256K cache takes
    seconds to build)."""
    return bench.make_inputs(n, n_kv_heads, huge_pages=huge_pages)


def _number(n: int, number) -> int:
    return max(1, SAMPLE_TOKENS // n) if number is None else check.integer("number", number, minimum=1)


def kernels(a: str, b: str, n: int, rounds: int = ROUNDS, number: int | None = None) -> Verdict:
    """Two versions of the registry (``lessonkit.variants``: "neon" the article's kernel, "fast", "lowp",
    "two_pass_scores", ...) on one head of ``n`` tokens, warm (``number`` back-to-back calls a sample)."""
    n = check.integer("n", n, minimum=1)
    cache, kh, q = inputs(n)[:3]
    return compare(timing.kernel_contenders((a, b), q, cache, kh, _number(n, number)), rounds)


def grouped_vs_calls(n: int, calls: str = "per_head_fast", rounds: int = ROUNDS) -> Verdict:
    """One grouped call for ``bench.GQA_G`` query heads against that many calls of one head ("per_head_fast":
    ``fast``, built on the same steps as the grouped call, which also converts each V row once for all heads and
    prefetches; "per_head": the article's kernel), ``n`` tokens."""
    n = check.integer("n", n, minimum=1)
    cache, kh = inputs(n)[:2]
    qs, number = bench.group_queries(), _number(n, None)
    name = {"per_head_fast": _("{g} calls of fast"), "per_head": _("{g} calls of neon")}[check.one_of(
        "calls", calls, ("per_head_fast", "per_head"))].format(g=bench.GQA_G)

    def sample(variant):
        return lambda: time_group(qs, cache, kh, variant=variant, repeats=1, number=number)
    return compare({_("grouped call"): sample("group"), name: sample(calls)}, rounds)


def cold_vs_warm(n: int, backend: str = "neon", rounds: int = ROUNDS) -> Verdict:
    """One call right after a buffer larger than the last-level cache was written (cold: the KV comes from
    DRAM) against back-to-back calls (warm: what fits in the caches is there), ``n`` tokens."""
    n = check.integer("n", n, minimum=1)
    cache, kh, q = inputs(n)[:3]
    number = _number(n, None)
    return compare({_("cold"): lambda: timing.time_kernel(q, cache, kh, backend, repeats=1, cold=True),
                    _("warm"): lambda: timing.time_kernel(q, cache, kh, backend, repeats=1, number=number)}, rounds)


def layout(n: int, n_kv_heads: int = 8, rounds: int = ROUNDS) -> Verdict:
    """The article's kernel on one kv head of ``n`` tokens, in a cache of that head alone (its rows one after
    another) against a cache of ``n_kv_heads`` heads interleaved (each token's row of one head ``n_kv_heads``
    rows apart): the same arithmetic and the same bytes of the head, laid out differently."""
    n = check.integer("n", n, minimum=1)
    number = _number(n, None)
    alone, kh1, q = inputs(n)[:3]
    mixed, khn = inputs(n, check.integer("n_kv_heads", n_kv_heads, minimum=2, below=bench.MAX_KV_HEADS + 1))[:2]
    one = timing.kernel_contenders(("neon",), q, alone, kh1, number)["neon"]
    many = timing.kernel_contenders(("neon",), q, mixed, khn, number)["neon"]
    return compare({_("one head alone"): one, _("{h} heads interleaved").format(h=n_kv_heads): many}, rounds)


def pages(n: int, backend: str = "fast", rounds: int = ROUNDS) -> Verdict:
    """``backend`` on a cache on huge pages (2 MiB, where the system gives them) against one on 4 KiB pages, as
    the board has: the same bytes, more pages to translate, ``n`` tokens, warm."""
    n = check.integer("n", n, minimum=1)
    number = _number(n, None)
    (huge, kh, q), small = inputs(n)[:3], inputs(n, huge_pages=False)[0]
    return compare({_("huge pages"): timing.kernel_contenders((backend,), q, huge, kh, number)[backend],
                    _("4 KiB pages"): timing.kernel_contenders((backend,), q, small, kh, number)[backend]}, rounds)


def threads(n: int, n_chunks: int = 2, rounds: int = ROUNDS) -> Verdict:
    """``lk.attend_split`` of ``n`` tokens cut into ``n_chunks`` chunks, on one thread against ``n_chunks`` threads
    (from Python: the hand-off and the merge are in the time)."""
    n = check.integer("n", n, minimum=1)
    cache, kh, q = inputs(n)[:3]
    number = max(1, (SAMPLE_TOKENS // 4) // n)

    def sample(n_threads):
        attend_split(q, cache, kh, n_chunks, n_threads)  # the pool's threads start before the rounds
        return timing.per_call(lambda: attend_split(q, cache, kh, n_chunks, n_threads), number)
    return compare({_("1 thread"): sample(1), _("{t} threads").format(t=n_chunks): sample(n_chunks)}, rounds)


def streamed(q, K, V, a: str = "streaming", b: str = "two_pass_scores_streamed", chunk: int = 512,
             names: dict | None = None, rounds: int = ROUNDS) -> Verdict:
    """The attention work left after the last chunk of a stream of K, V (``streaming.run_stream``, a chunk every
    3 ms), mode ``a`` against mode ``b`` (``streaming.MODES``); ``names`` gives each mode the name it is shown by."""
    names = names or {}

    def sample(mode):
        return lambda: 1e9 * streaming.run_stream(q, K, V, mode, chunk=chunk, interval_s=0.003).work_s
    return compare({names.get(a, a): sample(a), names.get(b, b): sample(b)}, rounds)
