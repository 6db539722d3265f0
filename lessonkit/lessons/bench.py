"""The benchmark's inputs and this machine's read bandwidth, which lessons 03, 08 and 09 use beside their timings
(``make bench``'s command line and report are ``workbench/bench.py``; ``median_ns`` is ``lessonkit.timing``'s)."""
from __future__ import annotations

import threading
import time

import numpy as np

from ..core import env, native
from ..core import validate as check
from ..core.cache import KVCacheQ8, mapped_zeros
from ..core.language import _
from ..core.timing import median_ns  # noqa: F401  (lesson 08 calls it bench.median_ns)

HEAD_DIM, N_KV_HEADS, KV_HEAD, BLOCK_SIZE = 128, 1, 0, 64
GQA_G, SPLIT_CHUNKS = 4, 2   # Qwen3-8B's group size; chunks of the split rows
MAX_LENGTH = 1 << 20         # tokens of one row: 4x the longest the benchmark measures
MAX_KV_HEADS = 64
MAX_BENCH_BYTES = 4 << 30    # fp32 K and V of the head plus the q8 cache, for one length
MAX_READ_BYTES = 1 << 30     # the read-bandwidth buffer: far beyond any last-level cache
CHUNK = 16384                # tokens make_inputs appends at a time


def check_inputs(seq_len: int, n_kv_heads: int) -> None:
    check.at_most("seq_len", seq_len, MAX_LENGTH, _("tokens of one benchmark row"))
    check.at_most("n_kv_heads", n_kv_heads, MAX_KV_HEADS, _("kv heads of the benchmark's cache"))
    # fp32 K and V of the head, the q8 cache of every head, one chunk of fp32 K and V of every head
    nbytes = (2 * seq_len * HEAD_DIM * 4 + seq_len * (2 * n_kv_heads * HEAD_DIM + 2 * 4 * n_kv_heads)
              + 2 * min(seq_len, CHUNK) * n_kv_heads * HEAD_DIM * 4)
    check.memory(_("the inputs of seq_len {seq_len} with {n_kv_heads} kv heads").format(seq_len=seq_len,
                 n_kv_heads=n_kv_heads), nbytes, MAX_BENCH_BYTES, _("use a shorter seq_len or fewer kv heads"))


def make_inputs(seq_len: int, n_kv_heads: int = N_KV_HEADS, seed: int = 0, huge_pages: bool = True):
    """``(cache, kv_head, q, K, V)``: a cache of ``n_kv_heads`` heads (only KV_HEAD random, the others zero: cheap
    to build; on huge pages or 4 KiB ones, ``KVCacheQ8``'s ``huge_pages``) and that head's fp32 K, V for the numpy
    reference."""
    seq_len = check.integer("seq_len", seq_len, minimum=1)
    n_kv_heads = check.integer("n_kv_heads", n_kv_heads, minimum=1)
    check_inputs(seq_len, n_kv_heads)
    rng = np.random.default_rng(seed)
    cache = KVCacheQ8(n_kv_heads, HEAD_DIM, BLOCK_SIZE, huge_pages)
    kv_head = min(KV_HEAD, n_kv_heads - 1)
    K = rng.standard_normal((seq_len, HEAD_DIM), dtype=np.float32)
    V = rng.standard_normal((seq_len, HEAD_DIM), dtype=np.float32)
    for t0 in range(0, seq_len, CHUNK):
        k = np.zeros((min(CHUNK, seq_len - t0), n_kv_heads, HEAD_DIM), np.float32)
        v = np.zeros_like(k)
        k[:, kv_head], v[:, kv_head] = K[t0:t0 + CHUNK], V[t0:t0 + CHUNK]
        cache.append(k, v)
    return cache, kv_head, rng.standard_normal(HEAD_DIM, dtype=np.float32), K, V


def group_queries(seed: int = 1) -> np.ndarray:
    """The GQA rows' four query heads, float32 [GQA_G, HEAD_DIM]."""
    return np.random.default_rng(seed).standard_normal((GQA_G, HEAD_DIM), dtype=np.float32)


def _read_buffer(ffi, lib, nbytes, line: int, huge_pages: bool = True):
    ffi, lib = native.library(ffi, lib, ("fa_read_gbps",))
    nbytes = check.integer("nbytes", nbytes, minimum=line)
    check.at_most("nbytes", nbytes, MAX_READ_BYTES, _("bytes of the read-bandwidth buffer"))
    if nbytes % line:
        raise ValueError(_("nbytes must be a multiple of {line} (the probe reads whole 64-byte lines); got {nbytes}: "
                           "use {nbytes_line}").format(line=line, nbytes=nbytes, nbytes_line=nbytes - nbytes % line))
    buf = mapped_zeros((nbytes,), np.uint8, check.flag("huge_pages", huge_pages))  # paged as a KVCacheQ8 is
    buf.fill(1)  # touched before it is timed: the pages exist
    return ffi, lib, nbytes, buf


def read_bandwidth_gbps(ffi=None, lib=None, nbytes: int = 256 << 20, cores: str | None = None,
                        huge_pages: bool = True) -> float:
    """Single-thread read bandwidth in GB/s: the best of 5 sums (fa_read_gbps of ``lib``, default the workbook's
    build) over ``nbytes``, pinned like the timings; the buffer on huge pages or 4 KiB ones (``huge_pages``, as
    ``KVCacheQ8`` takes it)."""
    ffi, lib, nbytes, buf = _read_buffer(ffi, lib, nbytes, 64, huge_pages)
    with env.pinned(cores):
        return float(lib.fa_read_gbps(ffi.from_buffer("unsigned char[]", buf), nbytes, 5))


def read_bandwidth_2t_gbps(ffi=None, lib=None, nbytes: int = 256 << 20, reps: int = 5,
                           cores: str | None = None) -> float:
    """Read bandwidth of 2 threads in GB/s, each summing half the buffer (cffi lets go of the GIL): all the bytes over
    the first thread's start to the last one's end (each times itself), best of ``reps`` passes."""
    ffi, lib, nbytes, buf = _read_buffer(ffi, lib, nbytes, 128)
    reps = check.integer("reps", reps, minimum=1)
    check.at_most("reps", reps, 20, _("passes of the read-bandwidth probe"))
    half = nbytes // 2
    ptrs = [ffi.from_buffer("unsigned char[]", buf[i * half:(i + 1) * half]) for i in range(2)]
    start, done = threading.Barrier(3), threading.Barrier(3)
    spans = [[None] * reps for unused in range(2)]

    def reader(i, p):  # each times its own pass: the main thread may be scheduled late after the barrier
        for r in range(reps):
            start.wait()
            t0 = time.perf_counter_ns()
            lib.fa_read_gbps(p, half, 1)
            spans[i][r] = (t0, time.perf_counter_ns())
            done.wait()

    best = 0.0
    with env.pinned(cores):
        threads = [threading.Thread(target=reader, args=(i, p), daemon=True) for i, p in enumerate(ptrs)]
        for t in threads:
            t.start()
        for r in range(reps):
            start.wait()
            done.wait()
            span = max(s[r][1] for s in spans) - min(s[r][0] for s in spans)
            best = max(best, nbytes / max(span, 1))
        for t in threads:
            t.join()
    return best


def lengths(name: str, values, most: int = 64, why: str | None = None, longest: int | None = MAX_LENGTH) -> list[int]:
    """``values`` as a list of at most ``most`` sequence lengths (``why``: the cap's reason), each at most ``longest``
    (None: any); the benchmark's and the lessons' lists of lengths alike."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(_("{name} must be a list of sequence lengths; got {values}").format(
                          name=name, values=type(values).__name__))
    check.at_most(f"len({name})", len(values), most, why or _("lengths of one benchmark run"))
    out = [check.integer(name[:-1] if name.endswith("s") else name, T, minimum=1) for T in values]
    for T in out if longest else ():
        check.at_most(name, T, longest, _("tokens of one benchmark row"))
    return out
