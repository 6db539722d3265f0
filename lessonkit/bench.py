"""The benchmark: ``make bench`` or ``python -m lessonkit.bench [--quick] [--json PATH]``
(introduced in lesson 05).

For each sequence length, one kv head of head_dim 128 (by default a cache of one kv head, so
that each head's rows are contiguous, as the numpy reference's arrays are; ``--n-kv-heads 8``
gives Qwen3-8B's interleaved layout, where a head's rows are kv_dim bytes apart), it times: the NEON kernel (SIMDe's build on x86), the scalar C kernel, the two two-pass
variants of article section 3, a vectorized numpy float32 reference over fp32 K/V, and a numpy
version over the same int8 cache (dequantize, then the same math: what a student writes first).
It measures this machine's single-thread read bandwidth in the same run and prints the target
ratios. Everything runs on one thread (numpy's BLAS is limited to one with threadpoolctl), except
the split-KV row with 2 threads.

Lesson 08's rows, at 8K, 64K and 256K: GQA, four query heads of one kv head in one grouped call
(flash_attn_group_q8_neon) against four per-head calls of the kernel (the engine's way); and
split-KV, the tokens cut in two chunks (flash_attn_partial_q8_neon, merged in Python), run on 1 and
on 2 threads (lessonkit.attend_split, timed from Python: chunks, threads and merge). Their ns per
token are for all four heads (GQA) or for the one head (split).
Timings are medians of repeats; on x86 they time SIMDe's build, not NEON. On a machine with
several core types the whole run is pinned to one (``--cores``, default the big cores: the
Cortex-A76 of the RK3588; ``lessonkit.env.pinned``). Lengths, kv heads and repeats are bounded
(MAX_LENGTH, MAX_KV_HEADS, MAX_BENCH_REPEATS, and MAX_BENCH_BYTES for the inputs of one length)."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from . import env, kernels, native
from . import timing
from . import validate as check
from .cache import KVCacheQ8
from .kernels import split
from .timing import time_kernel

FULL_LENGTHS = (1024, 8192, 65536, 262144)
QUICK_LENGTHS = (1024, 8192, 65536)
HEAD_DIM, N_KV_HEADS, KV_HEAD, BLOCK_SIZE = 128, 1, 0, 64
KERNELS = ("neon", "scalar", "two_pass_scores", "two_pass_recompute")
BEYOND_LENGTHS = (8192, 65536, 262144)  # lesson 08's rows, where the cache is long
GQA_G, SPLIT_CHUNKS = 4, 2              # Qwen3-8B's group size; chunks of the split rows
BEYOND = ("group4", "per_head4", "split_1t", "split_2t")
LABELS = {"group4": "GQA: 4 query heads, 1 grouped call", "per_head4": "GQA: 4 query heads, 4 per-head calls",
          "split_1t": "split-KV, 2 chunks, 1 thread", "split_2t": "split-KV, 2 chunks, 2 threads",
          "neon": "flash_attn_single_q_q8_neon", "scalar": "scalar C kernel",
          "two_pass_scores": "two-pass, stored scores", "two_pass_recompute": "two-pass, K read twice",
          "numpy_f32": "numpy float32 reference (fp32 K/V)",
          "numpy_int8": "numpy over the int8 cache (dequantize)"}
# the figures cited for this kind of machine: llama.cpp's q8_0 flash attention, one query row,
# one thread, ns per token in cache and at 256K
LLAMA_CPP_CITED = {8192: 44.0, 262144: 81.0}


MAX_LENGTH = 1 << 20         # tokens of one row: 4x the longest the benchmark measures
MAX_KV_HEADS = 64
MAX_BENCH_REPEATS = 100
MAX_BENCH_BYTES = 4 << 30    # fp32 K and V of the head plus the q8 cache, for one length
MAX_READ_BYTES = 1 << 30     # the read-bandwidth buffer: far beyond any last-level cache


def progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def make_inputs(seq_len: int, n_kv_heads: int = N_KV_HEADS, seed: int = 0):
    """A cache of N_KV_HEADS heads (only KV_HEAD random, the others zero: cheap to build) and the
    fp32 K, V of that head for the numpy reference."""
    seq_len = check.integer("seq_len", seq_len, minimum=1)
    check.at_most("seq_len", seq_len, MAX_LENGTH, "tokens of one benchmark row")
    n_kv_heads = check.integer("n_kv_heads", n_kv_heads, minimum=1)
    check.at_most("n_kv_heads", n_kv_heads, MAX_KV_HEADS, "kv heads of the benchmark's cache")
    check.memory(f"the inputs of seq_len {seq_len} with {n_kv_heads} kv heads", input_bytes(seq_len, n_kv_heads),
                 MAX_BENCH_BYTES, "use a shorter seq_len or fewer kv heads")
    rng = np.random.default_rng(seed)
    cache = KVCacheQ8(n_kv_heads, HEAD_DIM, BLOCK_SIZE)
    kv_head = min(KV_HEAD, n_kv_heads - 1)
    K = rng.standard_normal((seq_len, HEAD_DIM), dtype=np.float32)
    V = rng.standard_normal((seq_len, HEAD_DIM), dtype=np.float32)
    chunk = 16384
    for t0 in range(0, seq_len, chunk):
        k = np.zeros((min(chunk, seq_len - t0), n_kv_heads, HEAD_DIM), np.float32)
        v = np.zeros_like(k)
        k[:, kv_head] = K[t0:t0 + chunk]
        v[:, kv_head] = V[t0:t0 + chunk]
        cache.append(k, v)
    return cache, kv_head, rng.standard_normal(HEAD_DIM, dtype=np.float32), K, V


def input_bytes(seq_len: int, n_kv_heads: int) -> int:
    """What make_inputs allocates: fp32 K and V of the head, the q8 cache (codes and scales of every
    head), and one chunk of fp32 K and V of every head."""
    chunk = min(seq_len, 16384)
    return (2 * seq_len * HEAD_DIM * 4 + seq_len * (2 * n_kv_heads * HEAD_DIM + 2 * 4 * n_kv_heads)
            + 2 * chunk * n_kv_heads * HEAD_DIM * 4)


def numpy_f32(q, K, V, scale):
    s = (K @ q) * np.float32(scale)
    w = np.exp(s - s.max())
    return (w @ V) / w.sum()


def numpy_int8(q, cache: KVCacheQ8, kv_head: int, scale):
    """The first thing a student writes: gather the head's rows from the blocks, dequantize to
    float32, then the same math as numpy_f32."""
    cols = slice(kv_head * cache.head_dim, (kv_head + 1) * cache.head_dim)
    T = cache.seq_len
    K = np.concatenate([b[:, cols] for b in cache.k_blocks])[:T].astype(np.float32)
    V = np.concatenate([b[:, cols] for b in cache.v_blocks])[:T].astype(np.float32)
    K *= (cache.k_scales(kv_head) / np.float32(127))[:, None]
    V *= (cache.v_scales(kv_head) / np.float32(127))[:, None]
    return numpy_f32(q, K, V, scale)


def median_ns(fn, repeats: int, cores: str | None = None) -> float:
    """Median ns of ``repeats`` calls of ``fn()`` from Python, after one warm-up call, pinned to
    one core type like the kernel timings (``cores``, as in ``lessonkit.env.timing_cores``), so
    that a numpy reference and the kernel are timed on the same kind of core."""
    if not callable(fn):
        raise TypeError(f"fn must be a function of no arguments; got {type(fn).__name__}")
    repeats = check.integer("repeats", repeats, minimum=1)
    check.at_most("repeats", repeats, timing.MAX_REPEATS, "repeats of one timing")
    with env.pinned(cores):
        fn()  # warm up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t0)
    return float(np.median(times))


def group_queries(seed: int = 1) -> np.ndarray:
    """The GQA rows' four query heads, float32 [GQA_G, HEAD_DIM]."""
    return np.random.default_rng(seed).standard_normal((GQA_G, HEAD_DIM), dtype=np.float32)


def time_beyond(cache: KVCacheQ8, kv_head: int, q: np.ndarray, repeats: int, cores=None) -> dict[str, float]:
    """ns per call of lesson 08's four rows. The two split rows are timed in alternation (one call
    of each per round, after a warm-up), so that a busy moment of the machine hits both alike."""
    qs = group_queries()
    ns = {name: kernels.time_group(qs, cache, kv_head, variant=name[:-1], repeats=repeats, cores=cores)
          for name in ("group4", "per_head4")}
    number = max(1, 65536 // cache.seq_len)  # calls per sample: at least 64K tokens' worth
    runs: dict[str, list[float]] = {"split_1t": [], "split_2t": []}
    for threads in (1, 2):
        split.attend_split(q, cache, kv_head, SPLIT_CHUNKS, threads)  # warm-up
    for _ in range(repeats):
        for threads in (1, 2):
            t0 = time.perf_counter_ns()
            for _ in range(number):
                split.attend_split(q, cache, kv_head, SPLIT_CHUNKS, threads)
            runs[f"split_{threads}t"].append((time.perf_counter_ns() - t0) / number)
    ns.update({name: float(np.median(r)) for name, r in runs.items()})
    return ns


def read_bandwidth_gbps(ffi=None, lib=None, nbytes: int = 256 << 20, cores: str | None = None) -> float:
    """Single-thread read bandwidth in GB/s: the best of 5 sums over a buffer of ``nbytes`` (a
    multiple of 64 between 64 bytes and MAX_READ_BYTES), by fa_read_gbps of ``lib`` (default the
    workbook's build), pinned like the timings (``cores``)."""
    ffi, lib = check.library(ffi, lib, ("fa_read_gbps",))
    nbytes = check.integer("nbytes", nbytes, minimum=64)
    check.at_most("nbytes", nbytes, MAX_READ_BYTES, "bytes of the read-bandwidth buffer")
    if nbytes % 64:
        raise ValueError(f"nbytes must be a multiple of 64 (the probe reads whole 64-byte lines); "
                         f"got {nbytes}: use {nbytes - nbytes % 64}")
    buf = np.ones(nbytes, np.uint8)  # numpy aligns it for the probe's 8-byte loads
    with env.pinned(cores):
        return float(lib.fa_read_gbps(ffi.from_buffer("unsigned char[]", buf), nbytes, 5))


def _lengths(name: str, values) -> list[int]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a list of sequence lengths; got {type(values).__name__}")
    check.at_most(f"len({name})", len(values), 64, "lengths of one benchmark run")
    out = [check.integer(name[:-1] if name.endswith("s") else name, T, minimum=1) for T in values]
    for T in out:
        check.at_most(name, T, MAX_LENGTH, "tokens of one benchmark row")
    return out


def run(lengths, repeats: int, n_kv_heads: int = N_KV_HEADS, beyond_lengths=None, cores: str | None = None) -> dict:
    """Every row at every length; lesson 08's rows at ``beyond_lengths`` (default: those of
    ``lengths`` in BEYOND_LENGTHS). Pinned to one core type for the whole run (``cores``, as in
    ``lessonkit.env.timing_cores``)."""
    lengths = _lengths("lengths", lengths)
    beyond_lengths = [T for T in lengths if T in BEYOND_LENGTHS] if beyond_lengths is None else _lengths(
        "beyond_lengths", beyond_lengths)
    repeats = check.integer("repeats", repeats, minimum=1)
    check.at_most("repeats", repeats, MAX_BENCH_REPEATS, "repeats of one benchmark row")
    n_kv_heads = check.integer("n_kv_heads", n_kv_heads, minimum=1)
    check.at_most("n_kv_heads", n_kv_heads, MAX_KV_HEADS, "kv heads of the benchmark's cache")
    for T in lengths:  # refuse before the first row is timed, not halfway through the run
        check.memory(f"the inputs of seq_len {T} with {n_kv_heads} kv heads", input_bytes(T, n_kv_heads),
                     MAX_BENCH_BYTES, "use shorter lengths or fewer kv heads")
    plan = env.timing_cores(cores)
    with env.pinned(plan):
        return _run(lengths, repeats, n_kv_heads, beyond_lengths, plan, cores)


def _run(lengths, repeats, n_kv_heads, beyond_lengths, plan, cores) -> dict:
    ffi, lib = native.load()
    result = dict(machine=env.machine_label(cores), simd_paths=native.simd_paths(), head_dim=HEAD_DIM,
                  n_kv_heads=n_kv_heads, block_size=BLOCK_SIZE, rows={})
    progress("single-thread read bandwidth (256 MiB)")
    result["read_gbps"] = read_bandwidth_gbps(ffi, lib, cores=plan)
    if beyond_lengths:
        progress("parallel capacity: the kernel on 2 threads against 1, on a 4K cache")
        cache4, kh4, q4 = make_inputs(4096)[:3]
        result["parallel_capacity"] = split.parallel_capacity(q4, cache4, kh4, 2, number=200, cores=plan)
    scale = 1 / math.sqrt(HEAD_DIM)
    for T in lengths:
        progress(f"seq_len {T}: building the cache")
        cache, kv_head, q, K, V = make_inputs(T, n_kv_heads)
        kv_bytes = T * (2 * HEAD_DIM + 2 * 4)  # this head's K and V rows and their scales
        row = {}
        for name in KERNELS:
            progress(f"seq_len {T}: {LABELS[name]}")
            row[name] = time_kernel(q, cache, kv_head, backend=name, repeats=repeats, cores=plan)
        with threadpool_limits(1):
            progress(f"seq_len {T}: numpy float32 reference")
            row["numpy_f32"] = median_ns(lambda: numpy_f32(q, K, V, scale), repeats)
            progress(f"seq_len {T}: numpy over the int8 cache")
            row["numpy_int8"] = median_ns(lambda: numpy_int8(q, cache, kv_head, scale), max(3, repeats // 2))
        if T in beyond_lengths:
            progress(f"seq_len {T}: GQA grouped and per-head, split-KV on 1 and 2 threads")
            row.update(time_beyond(cache, kv_head, q, repeats, plan))
        result["rows"][T] = {name: dict(ns_per_token=ns / T, gbps=kv_bytes / ns) for name, ns in row.items()}
    return result


def targets(result: dict) -> list[tuple[str, float, float, bool]]:
    """(what, measured, target, met) for every target that the measured lengths allow."""
    rows, out = result["rows"], []
    for T in (8192, 262144):
        if T not in rows:
            continue
        r = rows[T]
        kernel = r["neon"]["ns_per_token"]
        out.append((f"{T // 1024}K: kernel vs numpy float32, x faster", r["numpy_f32"]["ns_per_token"] / kernel, 2.0,
                    r["numpy_f32"]["ns_per_token"] / kernel >= 2.0))
        out.append((f"{T // 1024}K: kernel vs numpy int8, x faster", r["numpy_int8"]["ns_per_token"] / kernel, 20.0,
                    r["numpy_int8"]["ns_per_token"] / kernel >= 20.0))
        out.append((f"{T // 1024}K: kernel ns/token vs llama.cpp's cited {LLAMA_CPP_CITED[T]:.0f} (lower is better)",
                    kernel, LLAMA_CPP_CITED[T], kernel < LLAMA_CPP_CITED[T]))
    if 262144 in rows:
        share = rows[262144]["neon"]["gbps"] / result["read_gbps"]
        out.append(("256K: kernel GB/s as a share of read bandwidth", share, 0.6, share >= 0.6))
    r = rows.get(262144, {})
    if "group4" in r:
        g = beyond_ratios(r)
        out.append(("256K: GQA, 1 grouped call vs 4 per-head calls, x faster", g["group"], 2.0, g["group"] >= 2.0))
        out.append(("256K: split-KV, 2 threads vs 1 thread, x faster", g["split"], 1.6, g["split"] >= 1.6))
    return out


def beyond_ratios(row: dict) -> dict[str, float]:
    """Lesson 08's two ratios at one length: per-head time / grouped time, 1 thread / 2 threads."""
    return dict(group=row["per_head4"]["ns_per_token"] / row["group4"]["ns_per_token"],
                split=row["split_1t"]["ns_per_token"] / row["split_2t"]["ns_per_token"])


def report(result: dict) -> str:
    lines = [f"machine: {result['machine']}",
             "simd paths: " + " ".join(f"{k}={v}" for k, v in result["simd_paths"].items()),
             f"one kv head of head_dim {result['head_dim']} in a cache of {result['n_kv_heads']} kv heads, "
             f"block size {result['block_size']}; one thread",
             f"single-thread read bandwidth (this run): {result['read_gbps']:.1f} GB/s"]
    if "parallel_capacity" in result:
        lines.append(f"parallel capacity (this run): the kernel on 2 threads runs {result['parallel_capacity']:.2f}x "
                     "as many calls per second as on 1 (4K cache, C loops): what this machine offered for the split-KV rows")
    lines.append("")
    head = f"{'seq_len':>8}  {'variant':<40} {'ns/token':>9} {'GB/s KV':>8} {'of read BW':>10}"
    lines += [head, "-" * len(head)]
    for T, row in result["rows"].items():
        for name, r in row.items():
            lines.append(f"{T:>8}  {LABELS[name]:<40} {r['ns_per_token']:>9.1f} {r['gbps']:>8.2f} "
                         f"{r['gbps'] / result['read_gbps']:>10.0%}")
        lines.append("")
    for T, row in result["rows"].items():
        if "group4" in row:
            g = beyond_ratios(row)
            lines.append(f"lesson 08 at {T // 1024}K: grouped {g['group']:.2f}x faster than 4 per-head calls; "
                         f"split-KV on 2 threads {g['split']:.2f}x faster than on 1")
    lines.append("targets (measured in this run):")
    for what, got, want, ok in targets(result):
        lines.append(f"  {'met ' if ok else 'MISS'}  {what}: {got:.2f} (target {want:g})")
    lines.append("GB/s KV counts the head's K and V rows and scales once, whatever a variant reads.")
    lines.append("GQA rows: ns per token for all 4 query heads; split rows: timed from Python, with the merge.")
    if result["machine"].endswith(("simde-x86_64", "simde-generic")):
        lines.append("x86: the 'neon' row is SIMDe's build of the NEON source, not NEON.")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lessonkit.bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1K, 8K and 64K only, fewer repeats (under a minute)")
    p.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    p.add_argument("--n-kv-heads", type=int, default=N_KV_HEADS,
                   help=f"kv heads in the cache (default {N_KV_HEADS}; Qwen3-8B has 8); one is attended")
    p.add_argument("--cores", default=None,
                   help="core type to run on where there are several, e.g. Cortex-A55 (default: the big cores; "
                        "'any': no pinning)")
    args = p.parse_args(argv)
    lengths, repeats = (QUICK_LENGTHS, 3) if args.quick else (FULL_LENGTHS, 7)
    result = run(lengths, repeats, args.n_kv_heads, cores=args.cores)
    print(report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**result, "targets": targets(result)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
