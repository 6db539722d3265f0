"""Beyond the article: GQA in one scan and split-KV (introduced in lesson 08).

**GQA in one scan** (``attend_group``): under grouped-query attention G query heads share one kv head
(Qwen3-8B: 32 query heads over 8 kv heads, G = 4). The original engine runs one kernel call per
query head, so each of the G calls reads the kv head's whole KV again (GUIDE section 2).
``flash_attn_group_q8_neon`` (native/flash_attn_q8_group.c) reads each K and V row once for all G
query heads, each keeping its own M, S and VKQ.

**Split-KV** (``attend_split``, ``attend_chunks``): the engine has no split over the KV of one long
sequence. ``flash_attn_partial_q8_neon`` (native/flash_attn_q8_partial.c) runs the single pass over
a token range and returns its unnormalized state (M, S, VKQ) instead of the output; chunks run in
parallel on threads (cffi releases the GIL during a C call) and their states are merged as
Flash-Decoding (2023) does. The merge is ``lessonkit.streaming.merge``, lesson 05's, in Python:
it runs once per chunk on head_dim values (nothing next to the scan of thousands of tokens), in
float64, and it keeps one tested implementation of the formula for lessons 05 and 08. The C test
(native/tests/test_kernel.c) has its own merge, written from the same formula.

Every argument is checked in Python before any call into C (``lessonkit.validate``)."""
from __future__ import annotations

import itertools
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import native
from . import validate as check
from .cache import KVCacheQ8
from .streaming import Partial, finish, merge_all
from .timing import median_calls

GQA_MAX = 8  # query heads per grouped call: the C kernel's fixed buffers


# ----------------------------------------------------------------------------- checks

def _cache_head_scale(cache, kv_head, scale) -> tuple[int, float]:
    if not isinstance(cache, KVCacheQ8):
        raise TypeError(f"cache must be a lessonkit.KVCacheQ8; got {type(cache).__name__}")
    kv_head = check.integer("kv_head", kv_head, minimum=0, below=cache.n_kv_heads)
    scale = 1.0 / math.sqrt(cache.head_dim) if scale is None else check.finite_float("scale", scale)
    if cache.seq_len == 0:
        raise ValueError("the cache is empty: append at least one token before attending")
    return kv_head, scale


def _group_queries(qs, cache) -> np.ndarray:
    if isinstance(qs, np.ndarray) and qs.ndim != 2:
        raise ValueError(f"qs must have shape [G, {cache.head_dim}] (one row per query head of the group); "
                         f"got {list(qs.shape)}")
    qs = check.float32_array("qs", qs, (None, cache.head_dim))
    if not 1 <= qs.shape[0] <= GQA_MAX:
        raise ValueError(f"qs must hold between 1 and {GQA_MAX} query heads (G, its first dimension); "
                         f"got G = {qs.shape[0]}")
    return qs


def split_points(seq_len: int, n_chunks: int) -> list[int]:
    """The chunk boundaries ``[0, b1, ..., seq_len]`` of ``n_chunks`` chunks of (nearly) equal size.
    n_chunks must be between 1 and seq_len: more chunks than tokens would leave a chunk empty."""
    seq_len = check.integer("seq_len", seq_len, minimum=1)
    n_chunks = check.integer("n_chunks", n_chunks, minimum=1)
    if n_chunks > seq_len:
        raise ValueError(f"n_chunks = {n_chunks} is more than seq_len = {seq_len}: some chunk would be empty "
                         f"(an empty chunk has no state to merge); use at most {seq_len} chunks")
    return [seq_len * j // n_chunks for j in range(n_chunks + 1)]


def _check_bounds(bounds, seq_len: int) -> list[int]:
    """[0, *bounds, seq_len] after checking that every chunk holds at least one token."""
    if isinstance(bounds, (str, bytes)) or not hasattr(bounds, "__iter__"):
        raise TypeError(f"bounds must be a sequence of split points; got {type(bounds).__name__}")
    inner = [check.integer("split point", b) for b in bounds]
    cuts = [0, *inner, seq_len]
    for j, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        if b <= a:
            raise ValueError(f"chunk {j} would be empty ([{a}, {b}) holds no token): split points must "
                             f"increase strictly and lie strictly between 0 and seq_len = {seq_len}; "
                             f"got {inner}")
    return cuts


# ----------------------------------------------------------------------------- GQA in one scan

def attend_group(qs: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float | None = None) -> np.ndarray:
    """Attention outputs float32 ``[G, head_dim]`` of the G query heads ``qs`` (float32
    ``[G, head_dim]``, 1 <= G <= 8) that share kv head ``kv_head``, in one call of
    flash_attn_group_q8_neon: each K and V row is read once for all G. Row g equals
    ``lk.attend(qs[g], cache, kv_head)`` up to float rounding."""
    if not isinstance(cache, KVCacheQ8):
        raise TypeError(f"cache must be a lessonkit.KVCacheQ8; got {type(cache).__name__}")
    qs = _group_queries(qs, cache)
    kv_head, scale = _cache_head_scale(cache, kv_head, scale)
    ffi, lib = native.load()
    out = np.empty(qs.shape, np.float32)
    lib.flash_attn_group_q8_neon(ffi.from_buffer("float[]", out, require_writable=True),
                                 ffi.from_buffer("float[]", qs), *cache.kernel_args(kv_head, ffi),
                                 cache.head_dim, scale, qs.shape[0])
    return out


# ----------------------------------------------------------------------------- split-KV

def partial(q: np.ndarray, cache: KVCacheQ8, kv_head: int, t_begin: int, t_end: int,
            scale: float | None = None) -> Partial:
    """The unnormalized state (M, S, acc) of tokens ``[t_begin, t_end)`` for query ``q``, from one
    call of flash_attn_partial_q8_neon (a ``lessonkit.streaming.Partial``; acc in float64)."""
    if not isinstance(cache, KVCacheQ8):
        raise TypeError(f"cache must be a lessonkit.KVCacheQ8; got {type(cache).__name__}")
    q = check.float32_array("q", q, (cache.head_dim,))
    kv_head, scale = _cache_head_scale(cache, kv_head, scale)
    t_begin = check.integer("t_begin", t_begin, minimum=0)
    t_end = check.integer("t_end", t_end, below=cache.seq_len + 1)
    if t_end <= t_begin:
        raise ValueError(f"the range [{t_begin}, {t_end}) holds no token: t_end must be above t_begin")
    ffi, lib = native.load()
    return _run_chunks(ffi, lib, q, cache, kv_head, scale, [t_begin, t_end], 1)[0]


def _run_chunks(ffi, lib, q, cache, kv_head, scale, cuts, n_threads) -> list[Partial]:
    """Each chunk [cuts[j], cuts[j+1]) through flash_attn_partial_q8_neon, on up to n_threads
    threads; arguments already checked. Each chunk writes its own output buffers."""
    n = len(cuts) - 1
    vkq = np.empty((n, cache.head_dim), np.float32)
    ms, ss = ffi.new("float[]", n), ffi.new("float[]", n)
    k, v, ks, vs, _, kv_dim, kv_bs, nkv, kh_off = cache.kernel_args(kv_head, ffi)
    qbuf = ffi.from_buffer("float[]", q)
    rows = [ffi.from_buffer("float[]", vkq[j], require_writable=True) for j in range(n)]

    def run(j: int) -> None:
        lib.flash_attn_partial_q8_neon(rows[j], ms + j, ss + j, qbuf, k, v, ks, vs, cuts[j], cuts[j + 1],
                                       kv_dim, kv_bs, nkv, kh_off, cache.head_dim, scale)

    # The calling thread is one of the n_threads: it takes chunks like the pool's workers instead of
    # sitting idle until they are done, so 2 threads need only one worker.
    next_chunk = itertools.count()  # next() on it is atomic under the GIL: each chunk runs once

    def worker() -> None:
        while (j := next(next_chunk)) < n:
            run(j)

    helpers = [_pool(n_threads - 1).submit(worker) for _ in range(min(n_threads, n) - 1)]
    worker()
    for h in helpers:
        h.result()  # wait, and re-raise any error
    return [Partial(float(ms[j]), float(ss[j]), vkq[j].astype(np.float64), cuts[j + 1] - cuts[j])
            for j in range(n)]


_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(n_workers: int) -> ThreadPoolExecutor:
    """One pool of worker threads per size, created once: starting threads on every call would
    cost more than a chunk of a few thousand tokens."""
    if n_workers not in _pools:
        _pools[n_workers] = ThreadPoolExecutor(n_workers, thread_name_prefix="lessonkit-split")
    return _pools[n_workers]


def attend_chunks(q: np.ndarray, cache: KVCacheQ8, kv_head: int, bounds, n_threads: int = 1,
                  scale: float | None = None) -> tuple[np.ndarray, list[Partial]]:
    """Split the tokens before each index of ``bounds`` (strictly increasing, strictly between 0 and
    seq_len: no chunk may be empty), compute every chunk's state with flash_attn_partial_q8_neon on
    up to ``n_threads`` threads, merge the states in order (lessonkit.streaming.merge) and divide.
    Returns (output float32 ``[head_dim]``, the chunks' states)."""
    if not isinstance(cache, KVCacheQ8):
        raise TypeError(f"cache must be a lessonkit.KVCacheQ8; got {type(cache).__name__}")
    q = check.float32_array("q", q, (cache.head_dim,))
    kv_head, scale = _cache_head_scale(cache, kv_head, scale)
    cuts = _check_bounds(bounds, cache.seq_len)
    n_threads = check.integer("n_threads", n_threads, minimum=1)
    ffi, lib = native.load()
    parts = _run_chunks(ffi, lib, q, cache, kv_head, scale, cuts, n_threads)
    return finish(merge_all(parts)), parts


def attend_split(q: np.ndarray, cache: KVCacheQ8, kv_head: int, n_chunks: int, n_threads: int,
                 scale: float | None = None) -> np.ndarray:
    """Attention output float32 ``[head_dim]`` of query ``q`` over kv head ``kv_head``, with the
    tokens cut into ``n_chunks`` chunks of (nearly) equal size (1 <= n_chunks <= seq_len) run on
    ``n_threads`` threads (>= 1) and merged: equal to ``lk.attend(q, cache, kv_head)`` up to float
    rounding."""
    if not isinstance(cache, KVCacheQ8):
        raise TypeError(f"cache must be a lessonkit.KVCacheQ8; got {type(cache).__name__}")
    q = check.float32_array("q", q, (cache.head_dim,))
    kv_head, scale = _cache_head_scale(cache, kv_head, scale)
    cuts = split_points(cache.seq_len, n_chunks)
    n_threads = check.integer("n_threads", n_threads, minimum=1)
    ffi, lib = native.load()
    return finish(merge_all(_run_chunks(ffi, lib, q, cache, kv_head, scale, cuts, n_threads)))


# ----------------------------------------------------------------------------- timing

GROUP_VARIANTS = {"group": 0, "per_head": 1}  # fa_time_group_calls


def time_group(qs: np.ndarray, cache: KVCacheQ8, kv_head: int = 0, variant: str = "group",
               repeats: int = 7, number: int | None = None, min_repeat_s: float = 0.02,
               scale: float | None = None, out: np.ndarray | None = None) -> float:
    """Median ns for all G query heads of ``qs``: variant "group" one flash_attn_group_q8_neon call,
    "per_head" G calls of flash_attn_single_q_q8_neon (the engine's way); the call loop runs in C
    (native/fa_timing.c), like ``lessonkit.timing.time_kernel``. ``out`` (float32 ``[G, head_dim]``,
    optional) receives what the timed calls computed, so that a test can check it."""
    if not isinstance(cache, KVCacheQ8):
        raise TypeError(f"cache must be a lessonkit.KVCacheQ8; got {type(cache).__name__}")
    qs = _group_queries(qs, cache)
    kv_head, scale = _cache_head_scale(cache, kv_head, scale)
    if variant not in GROUP_VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(map(repr, GROUP_VARIANTS))}; got {variant!r}")
    repeats = check.integer("repeats", repeats, minimum=1)
    if out is None:
        out = np.empty(qs.shape, np.float32)
    elif not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == qs.shape
              and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"out must be a writable, C-contiguous float32 array of shape {list(qs.shape)}")
    ffi, lib = native.load()
    args = (ffi.from_buffer("float[]", out, require_writable=True), ffi.from_buffer("float[]", qs),
            *cache.kernel_args(kv_head, ffi), cache.head_dim, scale, qs.shape[0])

    return median_calls(lambda n: lib.fa_time_group_calls(GROUP_VARIANTS[variant], n, *args), repeats,
                        number, min_repeat_s)


def time_split(q: np.ndarray, cache: KVCacheQ8, kv_head: int = 0, n_chunks: int = 2, n_threads: int = 1,
               repeats: int = 7, number: int = 1, scale: float | None = None) -> float:
    """Median ns of one ``attend_split`` call (chunks, threads, merge and all, timed from Python:
    what a caller gets), over ``repeats`` repeats of ``number`` calls each, after one warm-up call."""
    repeats = check.integer("repeats", repeats, minimum=1)
    number = check.integer("number", number, minimum=1)
    attend_split(q, cache, kv_head, n_chunks, n_threads, scale)  # checks the arguments, warms up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(number):
            attend_split(q, cache, kv_head, n_chunks, n_threads, scale)
        times.append((time.perf_counter_ns() - t0) / number)
    return float(np.median(times))


def parallel_capacity(q: np.ndarray, cache: KVCacheQ8, kv_head: int = 0, n_threads: int = 2,
                      number: int = 20, repeats: int = 5) -> float:
    """How many times more kernel calls per second ``n_threads`` threads complete than one thread,
    each thread running ``number`` calls of flash_attn_single_q_q8_neon over ``cache`` in a C loop
    (fa_time_calls): what the machine offers for parallel work right now. About n_threads on free
    cores when ``cache`` fits in the caches (no memory limit); less when another program, or the
    host of a virtual machine, takes a core. The median of ``repeats`` measurements, each timing 1
    and then n_threads threads. Lesson 08 prints it beside the split-KV timings."""
    if not isinstance(cache, KVCacheQ8):
        raise TypeError(f"cache must be a lessonkit.KVCacheQ8; got {type(cache).__name__}")
    q = check.float32_array("q", q, (cache.head_dim,))
    kv_head, scale = _cache_head_scale(cache, kv_head, None)
    n_threads = check.integer("n_threads", n_threads, minimum=1)
    number = check.integer("number", number, minimum=1)
    repeats = check.integer("repeats", repeats, minimum=1)
    ffi, lib = native.load()
    outs = np.empty((n_threads, cache.head_dim), np.float32)
    kargs = cache.kernel_args(kv_head, ffi)
    qbuf = ffi.from_buffer("float[]", q)

    def calls(j: int) -> None:
        lib.fa_time_calls(0, number, ffi.from_buffer("float[]", outs[j], require_writable=True), qbuf,
                          *kargs, cache.head_dim, scale)

    def wall(k: int) -> float:
        """Seconds until k threads, started together, have each run their calls."""
        threads = [threading.Thread(target=calls, args=(j,)) for j in range(k)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    calls(0)  # warm: the cache's rows in this machine's caches
    return float(np.median([n_threads * wall(1) / wall(n_threads) for _ in range(repeats)]))
