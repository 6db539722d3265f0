"""Split-KV (introduced in lesson 08): the partial state of a run of tokens, its merge, the split over threads and
its timing (``parallel_capacity``, ``split_times``).

After any run of tokens the online softmax holds an unnormalized state: M (the largest score seen), S (the sum of
exp(s - M)) and acc (the sum of exp(s - M) * v). Two states of disjoint runs merge as Flash-Decoding (2023) merges
its split-KV partial results:

    M = max(M1, M2),  S = S1 e^(M1 - M) + S2 e^(M2 - M),  acc = acc1 e^(M1 - M) + acc2 e^(M2 - M),  out = acc / S.

The merge runs in Python, in float64, once per chunk on head_dim values (nothing next to the scan of thousands of
tokens); lessons 05b and 08 use this one implementation. The engine has no split over the KV of one long sequence:
here ``flash_attn_partial_q8_neon`` runs the single pass over a token range and returns its state, and the chunks
run in parallel on one pool's threads (cffi releases the GIL during a C call), never more than the usable cores."""
from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import math
import os
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import reduce

import numpy as np

from ..core import env, native, timing
from ..core import validate as check
from ..core.cache import KVCacheQ8, attention_args
from ..core.processes import after_fork_in_child, fork_safe_lock
from ..core.language import _
from ..core.attention import kernel_inputs, out_buffer

MAX_CHUNKS = 1 << 16  # chunks of one split call: each is a Python object and one merge step
MAX_CAPACITY_THREADS = 64  # threads parallel_capacity starts (each a real thread, started per repeat)
POOL_WORKERS = max(0, (os.cpu_count() or 1) - 1)  # + the calling thread = os.cpu_count() threads
_pool_lock = fork_safe_lock(sys.modules[__name__], "_pool_lock")
_pool_now: list[ThreadPoolExecutor] = []  # the one pool, once started
# A forked child (os.fork, multiprocessing's fork start method) inherits the pool object but none of its
# threads: work submitted there would wait forever. The child starts a pool of its own instead.
after_fork_in_child(_pool_now.clear)


@dataclass(frozen=True)
class Partial:
    """The unnormalized online-softmax state of a run of tokens."""
    M: float          # the largest score of the run (-inf for no token)
    S: float          # sum over the run of exp(s - M)
    acc: np.ndarray   # float64 [head_dim]: sum over the run of exp(s - M) * v
    n_tokens: int


def empty(head_dim: int) -> Partial:
    """The state of no token: merging it changes nothing."""
    return Partial(-math.inf, 0.0, np.zeros(head_dim), 0)


def merge(a: Partial, b: Partial) -> Partial:
    """The state of the tokens of ``a`` and of ``b`` together, in float64; merge(a, b) == merge(b, a)."""
    if a.acc.shape != b.acc.shape:
        raise ValueError(_("states of different head_dim: {shape} and {shape2}").format(
                           shape=a.acc.shape, shape2=b.acc.shape))
    M = max(a.M, b.M)
    if M == -math.inf:  # both empty
        return Partial(M, 0.0, np.zeros_like(a.acc), a.n_tokens + b.n_tokens)
    wa, wb = math.exp(a.M - M), math.exp(b.M - M)
    return Partial(M, a.S * wa + b.S * wb, a.acc * wa + b.acc * wb, a.n_tokens + b.n_tokens)


def merge_all(parts) -> Partial:
    parts = list(parts)
    if not parts:
        raise ValueError(_("no state to merge"))
    return reduce(merge, parts)


def finish(state: Partial) -> np.ndarray:
    """The attention output acc / S as float32 (zeros where S is 0, like the kernel's guard)."""
    out = state.acc / state.S if state.S > 0 else np.zeros_like(state.acc)
    return out.astype(np.float32)


def split_points(seq_len: int, n_chunks: int) -> list[int]:
    """The chunk boundaries ``[0, b1, ..., seq_len]`` of ``n_chunks`` chunks of (nearly) equal size."""
    seq_len = check.integer("seq_len", seq_len, minimum=1)
    n_chunks = check.integer("n_chunks", n_chunks, minimum=1)
    check.at_most("n_chunks", n_chunks, MAX_CHUNKS, "chunks of one split call")
    if n_chunks > seq_len:
        raise ValueError(_("n_chunks = {n_chunks} is more than seq_len = {seq_len}: some chunk would be empty (an "
                           "empty chunk has no state to merge); use at most {seq_len} chunks").format(
                           n_chunks=n_chunks, seq_len=seq_len))
    return [seq_len * j // n_chunks for j in range(n_chunks + 1)]


def chunk_bounds(bounds, seq_len: int) -> list[int]:
    """[0, *bounds, seq_len] after checking that every chunk holds at least one token (at most
    MAX_CHUNKS chunks, counted before a long or endless iterable is read to its end)."""
    if isinstance(bounds, (str, bytes)) or not hasattr(bounds, "__iter__"):
        raise TypeError(_("bounds must be a sequence of split points; got {bounds}").format(
                          bounds=type(bounds).__name__))
    if isinstance(bounds, np.ndarray):
        bounds = check.base_array("bounds", bounds)
    inner = list(itertools.islice(bounds, MAX_CHUNKS))
    if len(inner) >= MAX_CHUNKS:
        raise ValueError(_("bounds holds {MAX_CHUNKS} split points or more: above the cap of {MAX_CHUNKS} chunks "
                           "of one split call; use at most {max_chunks} split points").format(
                           MAX_CHUNKS=MAX_CHUNKS, max_chunks=MAX_CHUNKS - 1))
    inner = [check.integer("split point", b) for b in inner]
    cuts = [0, *inner, seq_len]
    for j, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        if b <= a:
            raise ValueError(_("chunk {j} would be empty ([{a}, {b}) holds no token): split points must increase "
                               "strictly and lie strictly between 0 and seq_len = {seq_len}; got {inner}").format(
                               j=j, a=a, b=b, seq_len=seq_len, inner=inner))
    return cuts


def partial(q: np.ndarray, cache: KVCacheQ8, kv_head: int, t_begin: int, t_end: int,
            scale: float | None = None) -> Partial:
    """The state (M, S, acc in float64) of tokens ``[t_begin, t_end)``, from one call of flash_attn_partial_q8_neon."""
    q, kv_head, scale = attention_args(q, cache, kv_head, scale)
    t_begin = check.integer("t_begin", t_begin, minimum=0)
    t_end = check.integer("t_end", t_end, below=cache.seq_len + 1)
    if t_end <= t_begin:
        raise ValueError(_("the range [{t_begin}, {t_end}) holds no token: t_end must be above t_begin").format(
                           t_begin=t_begin, t_end=t_end))
    return _run_chunks(q, cache, kv_head, scale, [t_begin, t_end], 1)[0]


def attend_chunks(q: np.ndarray, cache: KVCacheQ8, kv_head: int, bounds, n_threads: int = 1,
                  scale: float | None = None) -> tuple[np.ndarray, list[Partial]]:
    """(output float32 ``[head_dim]``, the chunks' states): the tokens split before each index of ``bounds``, every
    chunk's state from flash_attn_partial_q8_neon on up to ``n_threads`` threads, merged in order."""
    q, kv_head, scale = attention_args(q, cache, kv_head, scale)
    cuts = chunk_bounds(bounds, cache.seq_len)
    parts = _run_chunks(q, cache, kv_head, scale, cuts, check.integer("n_threads", n_threads, minimum=1))
    return finish(merge_all(parts)), parts


def attend_split(q: np.ndarray, cache: KVCacheQ8, kv_head: int, n_chunks: int, n_threads: int,
                 scale: float | None = None) -> np.ndarray:
    """``lk.attend(q, cache, kv_head)`` up to float rounding, with the tokens cut into ``n_chunks`` chunks of (nearly)
    equal size run on ``n_threads`` threads (more than ``usable_cores()`` run on that many) and merged."""
    q, kv_head, scale = attention_args(q, cache, kv_head, scale)
    cuts, n_threads = split_points(cache.seq_len, n_chunks), check.integer("n_threads", n_threads, minimum=1)
    return finish(merge_all(_run_chunks(q, cache, kv_head, scale, cuts, n_threads)))


def _chunk_calls(q, cache, kv_head, scale, cuts):
    """(call(j), states()): ``call(j)`` runs flash_attn_partial_q8_neon on chunk [cuts[j], cuts[j+1]) into that
    chunk's own output buffers (so that chunks may run on several threads), ``states()`` reads their states."""
    ffi, lib = native.load()
    n = len(cuts) - 1
    vkq = np.empty((n, cache.head_dim), np.float32)
    ms, ss = ffi.new("float[]", n), ffi.new("float[]", n)
    qbuf, k, v, ks, vs, unused, *layout = kernel_inputs(ffi, q, cache, kv_head, lib)
    rows = [out_buffer(ffi, vkq[j]) for j in range(n)]

    def call(j: int) -> None:
        lib.flash_attn_partial_q8_neon(rows[j], ms + j, ss + j, qbuf, k, v, ks, vs, cuts[j], cuts[j + 1], *layout,
                                       cache.head_dim, scale)
    return call, lambda: [Partial(float(ms[j]), float(ss[j]), vkq[j].astype(np.float64), cuts[j + 1] - cuts[j])
                          for j in range(n)]


def _run_chunks(q, cache, kv_head, scale, cuts, n_threads) -> list[Partial]:
    """Every chunk's state, on up to n_threads threads (the calling thread one of them)."""
    call, states = _chunk_calls(q, cache, kv_head, scale, cuts)
    n = len(cuts) - 1
    stop = threading.Event()
    next_chunk = itertools.count()  # next() on it is atomic under the GIL: each chunk runs once

    def worker() -> None:
        while not stop.is_set() and (j := next(next_chunk)) < n:
            call(j)

    helpers = []
    for unused in range(min(n_threads, n, usable_cores()) - 1):
        try:
            helpers.append(_pool().submit(worker))
        except RuntimeError:  # the pool is shutting down (interpreter exit): run on this thread
            break
    try:
        worker()
    finally:
        # whatever happened (an error, Ctrl-C between two chunks), no helper may still write into
        # this call's buffers, or read the cache, once the call has returned
        stop.set()
        concurrent.futures.wait(helpers)
    for h in helpers:
        h.result()  # re-raise any error of a helper
    return states()


def usable_cores() -> int:
    """The most threads a split call runs on: the cores this process may use (e.g. those a timing is pinned to)."""
    total = os.cpu_count() or 1
    try:
        return max(1, min(total, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):  # macOS has no sched_getaffinity
        return total


def _pool() -> ThreadPoolExecutor:
    """The process's one pool, started on first use: threads started per call would cost more than a short chunk."""
    with _pool_lock:
        if not _pool_now:
            _pool_now.append(ThreadPoolExecutor(max(1, POOL_WORKERS), thread_name_prefix="lessonkit-split"))
        return _pool_now[0]


@atexit.register
def shutdown_pool() -> None:
    """End the split pool's threads (waiting for running chunks), at interpreter exit; the next split starts another."""
    with _pool_lock:
        pools = list(_pool_now)
        _pool_now.clear()
    for p in pools:
        p.shutdown(wait=True)


def parallel_capacity(q: np.ndarray, cache: KVCacheQ8, kv_head: int = 0, n_threads: int = 2,
                      number: int = 20, repeats: int = 5, cores: str | None = None) -> float:
    """How many times more kernel calls per second ``n_threads`` threads complete than one thread (each ``number``
    calls in a C loop): what the machine offers for parallel work right now (about n_threads on free cores; less
    when another program, or a virtual machine's host, takes a core). Pinned as ``lessonkit.timing.time_kernel``."""
    q, kv_head, scale = attention_args(q, cache, kv_head, None)
    n_threads = check.integer("n_threads", n_threads, minimum=1)
    check.at_most("n_threads", n_threads, MAX_CAPACITY_THREADS, "threads started per measurement")
    repeats, number, unused = timing.check_counts(repeats, number, 0.0)
    plan = env.timing_cores(cores)
    ffi, lib = native.load()
    outs = np.empty((n_threads, cache.head_dim), np.float32)
    qbuf, *kargs = kernel_inputs(ffi, q, cache, kv_head, lib)

    def calls(j: int, n: int = number) -> float:
        return lib.fa_time_calls(0, n, out_buffer(ffi, outs[j]), qbuf, *kargs, cache.head_dim, scale)

    def wall(k: int) -> float:
        """Seconds until k threads, started together, have each run their calls."""
        threads = [threading.Thread(target=calls, args=(j,)) for j in range(k)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    with env.pinned(plan):
        call_s = calls(0, 1) * 1e-9  # a probe of one call
        # one measurement: 1 thread, then n_threads (on one core at worst: n_threads times as long)
        _refuse_long(repeats, number, call_s, 2 + n_threads)
        calls(0)  # warm: the cache's rows in this machine's caches
        deadline = time.perf_counter() + timing.MAX_SECONDS
        ratios = []
        for i in range(repeats):
            ratios.append(n_threads * wall(1) / wall(n_threads))
            if i + 1 < repeats and time.perf_counter() > deadline:
                timing.stopped_early(i + 1, repeats)
                break
    return float(np.median(ratios))


def _refuse_long(repeats: int, number: int, call_s: float, calls_per_repeat: float) -> None:
    """ValueError when repeats x number calls of call_s seconds would pass timing.MAX_SECONDS."""
    need = repeats * number * call_s * calls_per_repeat
    if need > timing.MAX_SECONDS:
        fit = int(timing.MAX_SECONDS // (repeats * call_s * calls_per_repeat))
        raise ValueError(_("{repeats} repeats x {number} calls per thread of about {call_s:.3g} ms would take "
                           "about {need:.0f} s, above the cap of {MAX_SECONDS:g} s per timing call; use {fit}").format(
                           repeats=repeats, number=number, call_s=call_s * 1000.0, need=need,
                           MAX_SECONDS=timing.MAX_SECONDS,
                           fit=f'number <= {fit}' if fit >= 1 else _('fewer repeats or a shorter cache')))


@dataclass(frozen=True)
class SplitTimes:
    """Where the time of a 2-chunk split call goes (``split_times``), in ms, medians over repeats."""
    seq_len: int
    alone: tuple[float, float]     # each half's partial-kernel call, run alone
    together: tuple[float, float]  # each half's call while the other half runs on a second thread
    together_cpu: tuple[float, float]  # the CPU time each thread spent in that call (the rest it waited)
    wall_together: float           # both halves started at once: first start to last end
    overlap: float                 # the time both calls ran at once, as a fraction of the shorter call
    one_thread: float              # both halves one after the other on one thread (kernel calls only)
    inputs: float                  # kernel_inputs: the cffi arguments a split call builds (block pointers)
    handoff: float                 # the pool's round trip: submit a call that does nothing, wait for it
    pool_start: float              # a new pool's first round trip (its thread starts)
    merge: float                   # merge of the two states and the division, in Python
    split_1: float                 # attend_split(q, cache, kv_head, 2, 1), the whole call
    split_2: float                 # attend_split(q, cache, kv_head, 2, 2), the whole call


def split_times(q: np.ndarray, cache: KVCacheQ8, kv_head: int = 0, repeats: int = 11) -> SplitTimes:
    """Time the parts of ``attend_split(q, cache, kv_head, 2, n)`` apart (``SplitTimes``; the two halves started
    together at a barrier, each thread timing its own call). Each repeat runs every part once, interleaved, so a
    disturbance of the shared machine hits all parts alike."""
    q, kv_head, scale = attention_args(q, cache, kv_head, None)
    if cache.seq_len < 2:
        raise ValueError(_("split_times needs at least 2 tokens (one per half); the cache holds {n}").format(
                           n=cache.seq_len))
    if usable_cores() < 2:
        raise ValueError(_("split_times needs 2 cores this process may use; it may use {n}").format(n=usable_cores()))
    repeats, unused, unused2 = timing.check_counts(repeats, 1, 0.0)
    ffi, lib = native.load()
    call, states = _chunk_calls(q, cache, kv_head, scale, split_points(cache.seq_len, 2))

    def half(j: int) -> tuple[int, int, int]:
        """(start, end, CPU time of this thread), ns, of one C call on half j."""
        t0 = time.perf_counter_ns()
        c0 = time.thread_time_ns()  # inside the wall-clock span: the CPU time cannot exceed it
        call(j)
        c1 = time.thread_time_ns()
        return t0, time.perf_counter_ns(), c1 - c0

    def both_at_once() -> list[tuple[int, int, int]]:
        spans: list = [None, None]
        gate = threading.Barrier(2, timeout=10.0)  # a timeout: a failed partner cannot hang the caller

        def run(j: int) -> None:
            gate.wait()
            spans[j] = half(j)

        other = threading.Thread(target=run, args=(1,))
        other.start()
        try:
            run(0)
        finally:
            other.join()
        if spans[1] is None:
            raise RuntimeError(_("the second thread of split_times did not run its half"))
        return spans

    def ms_of(t0: int, t1: int, *unused) -> float:
        return (t1 - t0) / 1e6

    got: dict[str, list] = defaultdict(list)

    def timed(key: str, fn, *args) -> None:
        t0 = time.perf_counter_ns()
        fn(*args)
        got[key].append(ms_of(t0, time.perf_counter_ns()))

    _refuse_long(repeats, 1, sum(ms_of(*half(j)) for j in range(2)) / 1e3, 8)  # a probe (and warm-up)
    attend_split(q, cache, kv_head, 2, 2)  # the pool's threads start before any timing
    for unused in range(repeats):
        for j in range(2):
            got[f"alone{j}"].append(ms_of(*half(j)))
        spans = both_at_once()
        for j in range(2):
            got[f"together{j}"].append(ms_of(*spans[j]))
            got[f"cpu{j}"].append(spans[j][2] / 1e6)
        got["wall"].append(ms_of(min(s[0] for s in spans), max(s[1] for s in spans)))
        both = max(0, min(s[1] for s in spans) - max(s[0] for s in spans))
        got["overlap"].append(both / max(1, min(s[1] - s[0] for s in spans)))
        timed("inputs", kernel_inputs, ffi, q, cache, kv_head, lib)
        a, b = half(0), half(1)
        got["one_thread"].append(ms_of(a[0], b[1]))
        timed("handoff", lambda: _pool().submit(int).result())
        parts = states()
        timed("merge", lambda: finish(merge_all(parts)))
        for n_threads in (1, 2):
            timed(f"split{n_threads}", attend_split, q, cache, kv_head, 2, n_threads)
    starts = []
    for unused in range(3):  # a new pool's first submit starts its thread; a few, they are quick
        t0 = time.perf_counter_ns()
        with ThreadPoolExecutor(1) as fresh:
            fresh.submit(int).result()
            starts.append(ms_of(t0, time.perf_counter_ns()))
    med = {key: float(np.median(x)) for key, x in got.items()}
    return SplitTimes(cache.seq_len, (med["alone0"], med["alone1"]), (med["together0"], med["together1"]),
                      (med["cpu0"], med["cpu1"]), med["wall"], med["overlap"], med["one_thread"], med["inputs"],
                      med["handoff"], float(np.median(starts)), med["merge"], med["split1"], med["split2"])
