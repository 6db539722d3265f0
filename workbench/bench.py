"""The benchmark: ``make bench`` or ``python -m workbench bench [--quick] [--json PATH]`` (lesson 05).

At each sequence length, one kv head of head_dim 128 (in a cache of one kv head by default; ``--n-kv-heads
8`` gives Qwen3-8B's interleaved rows), it times the kernel and its variants (the NEON source; SIMDe's build
on x86), numpy over fp32 K/V and over the int8 cache, and llama.cpp's q8_0 flash attention (ggml-python,
workbench/llama_ggml.py; its output checked before it is timed), and from 8K lesson 08's rows: GQA (one
grouped call for 4 query heads against 4 per-head calls) and split-KV (2 chunks on 1 and 2 threads, timed
from Python with the merge). The contenders of a length are timed in alternation, one sample each per
round, so a busy moment hits all alike; it measures this machine's read bandwidth in the same run and
prints the targets, met or MISS. One thread (numpy's BLAS limited) unless a row says 2; pinned to one
core type (``--cores``, default the big cores, ``lessonkit.env.pinned``). Figures are medians, except
the shares of the read bandwidth in the targets: the fastest round against the probe's best pass (``share``)."""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from lessonkit.core import attention as kernels
from lessonkit.core import compare, env, native, reference, timing
from lessonkit.core import validate as check
from lessonkit.core.cache import KVCacheQ8
from lessonkit.core.files import write_atomic
from lessonkit.core.language import _
from lessonkit.display.table import Table
from lessonkit.lessons import roofline, split
from lessonkit.lessons.bench import lengths as checked_lengths
from lessonkit.lessons.bench import (BLOCK_SIZE, GQA_G, HEAD_DIM, N_KV_HEADS, SPLIT_CHUNKS, check_inputs, group_queries,
                                     make_inputs, read_bandwidth_2t_gbps, read_bandwidth_gbps)
from lessonkit.core.timing import interleaved, kernel_contenders, per_call

FULL_LENGTHS = (1024, 8192, 65536, 262144)
QUICK_LENGTHS = (1024, 8192, 65536)
KERNELS = ("neon", "scalar", "two_pass_scores", "two_pass_recompute")
BEYOND_LENGTHS = (8192, 65536, 262144)  # lesson 08's rows, where the cache is long
BEYOND = ("group4", "per_head4", "per_head_fast4", "split_1t", "split_2t")
GGML_ROWS = {"ggml_h1_t1": (1, 1), "ggml_h1_t2": (1, 2), "ggml_h4_t1": (GQA_G, 1), "ggml_h4_t2": (GQA_G, 2)}
LABELS = {"group4": "GQA: 4 query heads, 1 grouped call", "per_head4": "GQA: 4 query heads, 4 per-head calls",
          "per_head_fast4": "GQA: 4 query heads, 4 per-head calls of fast",
          "split_1t": "split-KV, 2 chunks, 1 thread", "split_2t": "split-KV, 2 chunks, 2 threads",
          "neon": "flash_attn_single_q_q8_neon", "scalar": "scalar C kernel", "fast": "flash_attn_single_q_q8_fast",
          "two_pass_scores": "two-pass, stored scores", "two_pass_recompute": "two-pass, K read twice",
          "numpy_f32": "numpy float32 reference (fp32 K/V)", "numpy_int8": "numpy over the int8 cache (dequantize)",
          **{name: f"llama.cpp q8_0 FA, {h} head{'s' * (h > 1)}, {t} thread{'s' * (t > 1)}"
             for name, (h, t) in GGML_ROWS.items()},
          "lowp": "lowp (v14): V by int8 dot products", "group4_lowp": "GQA: 4 query heads, 1 grouped lowp call",
          "fast_4k": "flash_attn_single_q_q8_fast, cache on 4 KiB pages", "lowp_4k": "lowp (v14), cache on 4 KiB pages"}
MAX_BENCH_REPEATS = 100
PAGE_LENGTHS = (262144,)   # where the memory section is measured: both read probes, both pagings
PAGE_ROWS = ("fast", "lowp")  # timed again there over the same cache on 4 KiB pages (the board's case)
BPT = roofline.bytes_per_token(HEAD_DIM)  # one token of one kv head: K, V rows and their scales (264)
FAST_SHARE = 0.75          # fast's bytes/ns at 256K as a share of the plain read probe, at least


def progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def numpy_f32(q, K, V, scale):
    """The vectorized numpy peer: the float64 reference's math in float32 over fp32 K and V."""
    return reference.attention(q, K, V, scale, dtype=np.float32)


def numpy_int8(q, cache: KVCacheQ8, kv_head: int, scale):
    """What a student writes first: gather the head's rows, dequantize to float32, then numpy_f32."""
    cols, T = slice(kv_head * cache.head_dim, (kv_head + 1) * cache.head_dim), cache.seq_len
    K = np.concatenate([b[:, cols] for b in cache.k_blocks])[:T].astype(np.float32)
    V = np.concatenate([b[:, cols] for b in cache.v_blocks])[:T].astype(np.float32)
    K *= (cache.k_scales(kv_head) / np.float32(127))[:, None]
    V *= (cache.v_scales(kv_head) / np.float32(127))[:, None]
    return numpy_f32(q, K, V, scale)


def fast_built() -> bool:
    """Whether this build's timing loop knows the fast kernel."""
    return "fast" in timing.VARIANTS


def beyond_contenders(q, qs, cache, kv_head, number: int, cores=None, fast: bool = True) -> dict:
    """Lesson 08's rows as contenders: the grouped call and 4 per-head calls (of fast too), split-KV."""
    out = {f"{v}4": (lambda v=v: kernels.time_group(qs, cache, kv_head, variant=v, repeats=1, number=number,
                                                    cores=cores))
           for v in ("group", "per_head") + (("per_head_fast",) if fast else ())}
    for n in (1, 2):
        out[f"split_{n}t"] = per_call(lambda n=n: split.attend_split(q, cache, kv_head, SPLIT_CHUNKS, n), number)
    return out


def ggml_contenders(q, K, V, scale, number: int):
    """llama.cpp's rows (GGML_ROWS) as contenders, each graph checked against llama_ggml.expected
    first: (contenders, graphs to close, max error of the checks, None), or ({}, [], None, why)."""
    from . import llama_ggml
    if llama_ggml.load()[0] is None:
        return {}, [], None, llama_ggml.load()[1]
    threads = tuple(sorted({t for unused, t in GGML_ROWS.values() if t <= (os.cpu_count() or 1)}))
    graphs, err = {}, 0.0
    for heads in sorted({h for h, unused in GGML_ROWS.values()}):
        qs = q[None] if heads == 1 else group_queries()
        graphs[heads] = fa = llama_ggml.FlashAttnQ8(qs, K, V, scale, threads)
        want = llama_ggml.expected(qs, K, V, scale)
        for t in threads:
            fa.compute(t)
            err = max(err, llama_ggml.check_output(fa.output(), want, f"ggml, {heads} heads, {t} threads"))
    contenders = {name: per_call(lambda fa=graphs[h], t=t: fa.compute(t), number)
                  for name, (h, t) in GGML_ROWS.items() if t in threads}
    return contenders, list(graphs.values()), err, None


def run(lengths, repeats: int, n_kv_heads: int = N_KV_HEADS, beyond_lengths=None, cores: str | None = None,
        lowp_error: str | None = None) -> dict:
    """Every row at every length, lesson 08's at ``beyond_lengths`` (default: those of ``lengths`` in
    BEYOND_LENGTHS), pinned to one core type (``cores``, as in ``lessonkit.env.timing_cores``);
    ``lowp_error`` "quick" or "full": lowp's error ratio too (``lowp_accuracy``; None: not measured)."""
    if lowp_error not in (None, "quick", "full"):
        raise ValueError(_("lowp_error must be None, 'quick' or 'full'; got {lowp_error!r}").format(
                           lowp_error=lowp_error))
    lengths = checked_lengths("lengths", lengths)
    beyond_lengths = [T for T in lengths if T in BEYOND_LENGTHS] if beyond_lengths is None else checked_lengths(
        "beyond_lengths", beyond_lengths)
    repeats = check.integer("repeats", repeats, minimum=1)
    check.at_most("repeats", repeats, MAX_BENCH_REPEATS, "repeats of one benchmark row")
    n_kv_heads = check.integer("n_kv_heads", n_kv_heads, minimum=1)
    for T in lengths:  # refuse before the first row is timed, not halfway through the run
        check_inputs(T, n_kv_heads)
    plan = env.timing_cores(cores)
    with env.pinned(plan):
        result = _run(lengths, repeats, n_kv_heads, beyond_lengths, plan, cores)
    if lowp_error and "lowp" in timing.VARIANTS:
        progress("lowp's error against the article kernel's (lessonkit.lowp_error)")
        result["lowp_error"] = lowp_accuracy(lowp_error == "quick")
    return result


def _run(lengths, repeats, n_kv_heads, beyond_lengths, plan, cores) -> dict:
    from . import llama_ggml
    ffi, lib = native.load()
    result = dict(machine=env.machine_label(cores), simd_paths=native.simd_paths(), head_dim=HEAD_DIM,
                  n_kv_heads=n_kv_heads, block_size=BLOCK_SIZE, rows={}, skipped={},
                  ggml=llama_ggml.version() or None, ggml_check_error={})
    progress("read bandwidth, 1 and 2 threads (256 MiB)")
    result["read_gbps"] = read_bandwidth_gbps(ffi, lib, cores=plan)
    result["read_gbps_2t"] = read_bandwidth_2t_gbps(ffi, lib, cores=plan)
    if any(T in PAGE_LENGTHS for T in lengths):
        result["read_gbps_4k"] = read_bandwidth_gbps(ffi, lib, cores=plan, huge_pages=False)
        result["memory"] = {}
    if beyond_lengths:
        progress("parallel capacity: the kernel on 2 threads against 1, on a 4K cache")
        cache4, kh4, q4 = make_inputs(4096)[:3]
        result["parallel_capacity"] = split.parallel_capacity(q4, cache4, kh4, 2, number=200, cores=plan)
    if not fast_built():
        result["skipped"]["fast"] = "not built"
    scale = 1 / math.sqrt(HEAD_DIM)
    for T in lengths:
        progress(f"seq_len {T}: building the cache")
        cache, kv_head, q, K, V = make_inputs(T, n_kv_heads)
        number = max(1, 65536 // T)  # calls per sample: at least 64K tokens' worth
        contenders = kernel_contenders(KERNELS + (("fast",) if fast_built() else ()), q, cache, kv_head, number, plan)
        contenders["numpy_f32"] = per_call(lambda: numpy_f32(q, K, V, scale), 1)
        contenders["numpy_int8"] = per_call(lambda: numpy_int8(q, cache, kv_head, scale), 1)
        progress(f"seq_len {T}: llama.cpp's q8_0 flash attention (ggml): build and check")
        gc, closing, err, why = ggml_contenders(q, K, V, scale, number)
        contenders.update(gc)
        if why:
            result["skipped"]["ggml"] = why
        else:
            result["ggml_check_error"][T] = err
        if T in beyond_lengths:
            contenders.update(beyond_contenders(q, group_queries(), cache, kv_head, number, plan, fast_built()))
        contenders.update(lowp_contenders(q, group_queries(), cache, kv_head, number, plan, T in beyond_lengths))
        if T in PAGE_LENGTHS:
            progress(f"seq_len {T}: the same cache on 4 KiB pages, and both read probes")
            cache_4k = make_inputs(T, n_kv_heads, huge_pages=False)[0]
            names = [n for n in PAGE_ROWS if n in timing.VARIANTS]
            contenders.update({f"{n}_4k": fn for n, fn in kernel_contenders(names, q, cache_4k, kv_head, number,
                                                                              plan).items()})
            result["memory"][T] = memory_figures(ffi, lib, cache, cache_4k, kv_head)
        progress(f"seq_len {T}: {len(contenders)} contenders, {repeats} interleaved rounds")
        samples = recorded(contenders)
        # BLAS only: threadpoolctl's default would cap ggml's OpenMP threads too (its 2-thread rows then
        # ran 10-20x slower than 1 thread here)
        load_before = compare.load_average()
        with threadpool_limits(1, user_api="blas"):
            row = interleaved(contenders, repeats, close=closing)
        if T in PAGE_LENGTHS:  # for the pages' verdicts: a busy machine cannot tell
            result["memory"][T]["load"] = (load_before, compare.load_average())
        kv_bytes = T * BPT  # this head's K and V rows and their scales
        result["rows"][T] = {name: dict(ns_per_token=ns / T, gbps=kv_bytes / ns,
                                        rounds=[x / T for x in samples[name][1:]])  # the warm-up call left out
                             for name, ns in row.items()}
        add_cold(result["rows"][T], contenders, T, kv_bytes)
        if T == OVERHEAD_LENGTH:
            result["attend_overhead"] = attend_overhead(q, cache, kv_head)
    if "attend_overhead" not in result:
        cache1, kh1, q1 = make_inputs(OVERHEAD_LENGTH, n_kv_heads)[:3]
        result["attend_overhead"] = attend_overhead(q1, cache1, kh1)
    return result


def recorded(contenders: dict) -> dict[str, list[float]]:
    """Each contender's samples, in the order timed (the first is interleaved's warm-up call): its
    function is wrapped in place, keeping its cold samples (``colds``) where it has them."""
    samples = {name: [] for name in contenders}

    def wrap(name, fn):
        def sample():
            ns = fn()
            samples[name].append(float(ns))
            return ns
        if hasattr(fn, "colds"):
            sample.colds = fn.colds
        return sample
    for name in list(contenders):
        contenders[name] = wrap(name, contenders[name])
    return samples


# ----------------------------------------------------------------------------- memory: probes and pages

def huge_page_share(arrays) -> float | None:
    """The share of the arrays' bytes that Linux backs with transparent huge pages: each mapping's
    AnonHugePages in /proc/self/smaps (Documentation/filesystems/proc.rst), shared out over the bytes of
    the arrays it holds. None where there is no smaps (not Linux). KVCacheQ8 gives every slab a mapping
    of its own, so the figure is exact for its blocks."""
    spans = [(a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays]
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    total, huge, vma = sum(e - b for b, e in spans), 0.0, None
    for line in text.splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            vma = (lo, hi)
        elif head == "AnonHugePages:" and vma:
            inside = sum(max(0, min(vma[1], e) - max(vma[0], b)) for b, e in spans)
            huge += int(line.split()[1]) * 1024 * inside / (vma[1] - vma[0])
    return huge / total if total else None


def layout_gbps(ffi, lib, cache: KVCacheQ8, kv_head: int, reps: int = 5) -> float:
    """fa_read_cache_gbps: the kernel's reads of one head over this cache (its block tables, pages and
    scales) without its arithmetic, best of ``reps``: the roof a kernel over that cache can reach."""
    return float(lib.fa_read_cache_gbps(*cache.kernel_args(kv_head, ffi), cache.head_dim, reps))


def memory_figures(ffi, lib, cache: KVCacheQ8, cache_4k: KVCacheQ8, kv_head: int) -> dict:
    """The layout probe over the cache on huge pages and over its copy on 4 KiB pages, and the share of
    each one's blocks that huge pages back."""
    return dict(layout_gbps=layout_gbps(ffi, lib, cache, kv_head), layout_gbps_4k=layout_gbps(ffi, lib, cache_4k, kv_head),
                huge_share=huge_page_share(cache.k_blocks + cache.v_blocks),
                huge_share_4k=huge_page_share(cache_4k.k_blocks + cache_4k.v_blocks))


# ----------------------------------------------------------------------------- warm and cold

def add_cold(row: dict, contenders: dict, T: int, kv_bytes: int) -> None:
    """Each row's cold figure beside its warm one: the median of its calls timed alone right after the
    other contenders (which evicted what they could of its data). Rows timed only warm (lesson 08's GQA
    loops) get none."""
    for name, fn in contenders.items():
        colds = getattr(fn, "colds", None)
        if colds and name in row:
            ns = float(np.median(colds))
            row[name].update(cold_ns_per_token=ns / T, cold_gbps=kv_bytes / ns)


def cold_result(result: dict) -> dict:
    """The result with each row's cold figures in place of its warm ones (rows without one dropped): the
    same targets, computed cold."""
    rows = {T: {name: dict(ns_per_token=r["cold_ns_per_token"], gbps=r["cold_gbps"])
                for name, r in row.items() if "cold_ns_per_token" in r} for T, row in result["rows"].items()}
    return {**result, "rows": rows}


# ----------------------------------------------------------------------------- lk.attend's own cost

OVERHEAD_LENGTH = 1024
OVERHEAD_CALLS = 2000
OVERHEAD_TARGET_US = 20.0


def attend_overhead(q, cache: KVCacheQ8, kv_head: int, calls: int = OVERHEAD_CALLS) -> dict:
    """What ``lk.attend`` costs per call beyond the kernel: the median of ``calls`` lk.attend calls minus
    the median of as many bare cffi calls of the same kernel with the same arguments, alternated (us)."""
    from lessonkit.core import attention
    calls = check.integer("calls", calls, minimum=1)
    check.at_most("calls", calls, 100000, _("calls of the overhead measurement"))
    ffi, lib = native.load()
    out = np.empty(cache.head_dim, np.float32)
    scale = 1 / math.sqrt(cache.head_dim)
    args = (attention.out_buffer(ffi, out), *attention.kernel_inputs(ffi, q, cache, kv_head, lib), cache.head_dim,
            scale)
    kernel = lib.flash_attn_single_q_q8_neon
    bare, full = np.empty(calls), np.empty(calls)
    kernels.attend(q, cache, kv_head)  # the first call may check the build; not counted
    for i in range(calls):
        t0 = time.perf_counter_ns()
        kernel(*args)
        t1 = time.perf_counter_ns()
        kernels.attend(q, cache, kv_head, scale)
        bare[i], full[i] = t1 - t0, time.perf_counter_ns() - t1
    attend_us, kernel_us = float(np.median(full)) / 1e3, float(np.median(bare)) / 1e3
    return dict(seq_len=cache.seq_len, attend_us=attend_us, kernel_us=kernel_us, overhead_us=attend_us - kernel_us)


def overhead_target(result: dict) -> tuple[str, float | None, float, str]:
    """(what, measured us, target us, "met" (at most the target) or "MISS")."""
    o = result.get("attend_overhead")
    what = f"lk.attend overhead per call beyond the kernel ({OVERHEAD_LENGTH // 1024}K tokens), us"
    if o is None:
        return what, None, OVERHEAD_TARGET_US, "not measured"
    return what, o["overhead_us"], OVERHEAD_TARGET_US, "met" if o["overhead_us"] <= OVERHEAD_TARGET_US else "MISS"


def warm_cold_lines(result: dict) -> list[str]:
    """The report's lines on warm and cold: what each means, the targets' ratios computed cold where they
    differ from the warm ones by more than 10%, and the overhead row."""
    lines = ["warm: back-to-back calls, the data in cache since the call before; cold: a call timed alone right "
             "after the other contenders ran (they evicted what they could of its data). Targets compare warm "
             "with warm."]
    cold = {what: got for what, got, unused, unused2 in targets(cold_result(result))}
    for what, got, want, status in targets(result):
        c = cold.get(what)
        if got is not None and c is not None and abs(c / got - 1) > 0.1:
            lines.append(f"  cold  {what}: {c:.2f} (warm {got:.2f}; target {want:g})")
    what, got, want, status = overhead_target(result)
    o = result.get("attend_overhead")
    detail = "" if o is None else f" (lk.attend {o['attend_us']:.1f} us, the bare cffi call {o['kernel_us']:.1f} us)"
    tag = status if status in ("met", "MISS") else "n/a "
    lines.append(f"  {tag:<4}  {what}: {'-' if got is None else f'{got:.1f}'} (target <= {want:g}){detail}")
    return lines


def ratio(rows: dict, T: int, slow: str, fast: str, times: float = 1.0):
    """ns/token of ``slow`` (x ``times``) over that of ``fast`` at length T; None if either is missing."""
    r = rows.get(T, {})
    if slow not in r or fast not in r:
        return None
    return times * r[slow]["ns_per_token"] / r[fast]["ns_per_token"]


def share(result: dict, T: int, name: str, gbps: float | None = None, at: str = "best"):
    """Row ``name``'s bytes/ns at length T as a share of ``gbps`` (default: the plain read probe, the best of its
    passes); None if either is missing. ``at`` "best": the row's fastest round, so that the best the kernel
    reached meets the best the memory gave, as lesson 09's roofline compares them (lessonkit/lessons/roofline.py,
    measure). A share of a roof asks what the loop can reach; on a shared machine the slower rounds are slowed
    by other work, not by the kernel (the reason Python's timeit documentation gives for its minimum), so their
    median moves from run to run with the machine. "median": the row's median round, printed beside it."""
    r, gbps = result["rows"].get(T, {}).get(name), gbps or result.get("read_gbps")
    if not r or not gbps:
        return None
    rounds = r.get("rounds") if at == "best" else None
    return (BPT / min(rounds) if rounds else r["gbps"]) / gbps


def per_round(result: dict, T: int, a: str, b: str) -> list[float] | None:
    """A ratio target's figure in each interleaved round at length T: row ``a``'s ns over row ``b``'s in the same
    round; None where the rows kept no rounds (a result without them)."""
    rows = result["rows"].get(T, {})
    ra, rb = rows.get(a, {}).get("rounds"), rows.get(b, {}).get("rounds")
    return [x / y for x, y in zip(ra, rb)] if ra and rb else None


def verdict(got: float, want: float, rounds: list[float] | None) -> str:
    """"met" (at least ``want``) or "MISS"; with the figure of every round, the middle half of the rounds
    (25th to 75th percentile) decides, and a middle half on both sides of ``want`` is no verdict: the
    run's spread is too wide to tell (a busy machine, or a figure that moves from round to round)."""
    if not rounds:
        return "met" if got >= want else "MISS"
    lo, hi = np.percentile(rounds, (25, 75))
    if lo >= want or hi < want:
        return "met" if lo >= want else "MISS"
    return f"unclear: the middle half of its {len(rounds)} rounds spans {lo:.2f} to {hi:.2f}, across the target"


def targets(result: dict) -> list[tuple[str, float | None, float, str]]:
    """(what, measured, target, status): "met" (measured >= target), "MISS", "unclear: ..." (``verdict``:
    rounds too spread to tell), or why there is no figure ("not built", "skipped: ...", "not measured ...")."""
    rows, skipped = result["rows"], result.get("skipped", {})
    no_fast, no_ggml = skipped.get("fast"), skipped.get("ggml")
    out = []
    for what, T, got, want, needs, rounds in [
            ("8K: fast vs the article kernel (neon), x faster", 8192, ratio(rows, 8192, "neon", "fast"), 2.4,
             (no_fast,), per_round(result, 8192, "neon", "fast")),
            ("8K: fast vs llama.cpp q8_0, 1 head, 1 thread, x faster", 8192,
             ratio(rows, 8192, "ggml_h1_t1", "fast"), 3.5, (no_fast, no_ggml), None),
            ("8K: fast vs numpy float32, x faster", 8192, ratio(rows, 8192, "numpy_f32", "fast"), 4.0, (no_fast,),
             None),
            ("256K: fast bytes/ns as a share of 1-thread read bandwidth", 262144, share(result, 262144, "fast"),
             FAST_SHARE, (no_fast,), None),  # the fastest round's share: a figure, not a spread of rounds
            ("256K: GQA, 1 grouped call vs 4 calls of fast, x faster", 262144,
             ratio(rows, 262144, "per_head_fast4", "group4"), 3.0, (no_fast,),
             per_round(result, 262144, "per_head_fast4", "group4")),
            ("8K: GQA, 1 grouped call vs 4 calls of fast, x faster", 8192,
             ratio(rows, 8192, "per_head_fast4", "group4"), 1.5, (no_fast,),
             per_round(result, 8192, "per_head_fast4", "group4")),
            ("256K: split-KV 2 chunks, 2 threads vs 1 thread, x faster", 262144,
             ratio(rows, 262144, "split_1t", "split_2t"), 1.6, (), None)]:
        why = next((w for w in needs if w), None)
        if why is None and T not in rows:
            why = f"not measured ({T // 1024}K not in this run)"
        out.append((what, got, want, why or ("not measured" if got is None else verdict(got, want, rounds))))
    # lowp's, where this run measured it (a result without lowp rows, e.g. an older one, has none)
    lowp = "lowp_error" in result or any("lowp" in row for row in rows.values())
    return out + (lowp_targets(result) if lowp else [])


# ---------------------------------------------------------------- lesson 09's lowp (version 14)

LOWP_SHARE, LOWP_GROUP_VS_FAST4, LOWP_ERROR_RATIO = 0.85, 3.0, 1.2


def lowp_contenders(q, qs, cache, kv_head, number: int, cores=None, grouped: bool = True) -> dict:
    """lowp's rows: the single-head version, and (``grouped``) one grouped lowp call for 4 query heads."""
    if "lowp" not in timing.VARIANTS:
        return {}
    out = kernel_contenders(("lowp",), q, cache, kv_head, number, cores)
    if grouped:
        out["group4_lowp"] = lambda: kernels.time_group(qs, cache, kv_head, variant="group_lowp", repeats=1,
                                                        number=number, cores=cores)
    return out


def lowp_accuracy(quick: bool = False) -> dict:
    """lowp's error over the article kernel's, median and worst over lowp_error.CI_CASES (``quick``:
    its 1000-token cases), with the number of cases."""
    from lessonkit.lessons import lowp_error
    cases = [c for c in lowp_error.CI_CASES if c[1] == 1000] if quick else lowp_error.CI_CASES
    median, worst = lowp_error.ratio_summary(lowp_error.error_table(cases))
    return dict(median=median, worst=worst, cases=len(cases))


def lowp_targets(result: dict) -> list[tuple[str, float | None, float, str]]:
    """lowp's targets, as ``targets`` gives them; the error ratio is met when at most its target."""
    rows, out = result["rows"], []
    for what, got, want, rounds in [
            ("256K: lowp bytes/ns as a share of 1-thread read bandwidth", share(result, 262144, "lowp"), LOWP_SHARE,
             None),
            ("256K: GQA, 1 grouped lowp call vs 4 calls of fast, x faster",
             ratio(rows, 262144, "per_head_fast4", "group4_lowp"), LOWP_GROUP_VS_FAST4,
             per_round(result, 262144, "per_head_fast4", "group4_lowp"))]:
        why = "not measured (256K not in this run)" if 262144 not in rows else None
        out.append((what, got, want, why or ("not measured" if got is None else verdict(got, want, rounds))))
    acc = result.get("lowp_error")
    got = acc["median"] if acc else None
    out.append((f"lowp's error / the article kernel's, median over {acc['cases'] if acc else 0} cases "
                f"(worst {acc['worst']:.3f}), AT MOST" if acc else "lowp's error / the article kernel's, AT MOST",
                got, LOWP_ERROR_RATIO, "not measured" if got is None else "met" if got <= LOWP_ERROR_RATIO else "MISS"))
    return out


def lowp_lines(result: dict) -> list[str]:
    """lowp against fast at each length (rows timed in alternation)."""
    return [f"lowp at {T // 1024}K: {ratio(result['rows'], T, 'fast', 'lowp'):.2f}x as fast as fast "
            f"({row['lowp']['ns_per_token']:.2f} vs {row['fast']['ns_per_token']:.2f} ns/token)"
            for T, row in result["rows"].items() if "lowp" in row and "fast" in row]


def beyond_ratios(row: dict) -> dict[str, float]:
    """Lesson 08's two ratios at one length: per-head time / grouped time, 1 thread / 2 threads."""
    return dict(group=row["per_head4"]["ns_per_token"] / row["group4"]["ns_per_token"],
                split=row["split_1t"]["ns_per_token"] / row["split_2t"]["ns_per_token"])


def rows_table(result: dict) -> Table:
    """Every timed row: ns/token, GB/s of the head's KV, and that as a share of the read bandwidth."""
    return Table([(T, LABELS[name], r["ns_per_token"], r.get("cold_ns_per_token"), r["gbps"],
                   r["gbps"] / result["read_gbps"])
                  for T, row in result["rows"].items() for name, r in row.items()],
                 header=["seq_len", "variant", "ns/token warm", "ns/token cold", "GB/s KV warm",
                         "median, of 1-thread read BW"],
                 formats={2: ".1f", 3: ".1f", 4: ".2f", 5: ".0%"})


def report(result: dict) -> str:
    if result.get("ggml"):
        errors = ", ".join(f"{T // 1024}K {e:.1e}" for T, e in result["ggml_check_error"].items())
        ggml = (f"{result['ggml']}, ggml_flash_attn_ext, F32 q over q8_0 K/V quantized by ggml (blocks of 32; "
                f"ours: one scale per token and head), output checked before timing (max error {errors} of max|out|)")
    else:
        ggml = result["skipped"].get("ggml", "skipped")
    lines = [f"machine: {result['machine']}",
             "simd paths: " + " ".join(f"{k}={v}" for k, v in result["simd_paths"].items()),
             f"one kv head of head_dim {result['head_dim']} in a cache of {result['n_kv_heads']} kv heads, "
             f"block size {result['block_size']}; one thread unless a row says 2",
             f"read bandwidth (this run): {result['read_gbps']:.1f} GB/s on 1 thread, "
             f"{result['read_gbps_2t']:.1f} GB/s on 2 threads", f"llama.cpp rows: {ggml}"]
    if "fast" in result["skipped"]:
        lines.append(f"flash_attn_single_q_q8_fast: {result['skipped']['fast']}")
    if "parallel_capacity" in result:
        lines.append(f"parallel capacity (this run): the kernel on 2 threads runs {result['parallel_capacity']:.2f}x "
                     "as many calls per second as on 1 (4K cache, C loops): what this machine offered for the "
                     "split-KV rows")
    lines += ["", str(rows_table(result)), ""]
    for T, row in result["rows"].items():
        if "group4" in row:
            g = beyond_ratios(row)
            lines.append(f"lesson 08 at {T // 1024}K: grouped {g['group']:.2f}x faster than 4 per-head calls; "
                         f"split-KV on 2 threads {g['split']:.2f}x faster than on 1")
    lines += lowp_lines(result)
    lines += memory_lines(result)
    lines += target_lines(result)
    lines += warm_cold_lines(result)
    lines.append(f"GB/s KV counts the head's K and V rows and scales once ({BPT} bytes per token), whatever a variant "
                 "reads; ggml's q8_0 holds 272.")
    lines.append("GQA and 4-head llama.cpp rows: ns per token for all 4 query heads; split rows: timed from Python, "
                 "with the merge.")
    if result["machine"].endswith(("simde-x86_64", "simde-generic")):
        lines.append("x86: the 'neon' row is the NEON source built through SIMDe (x86 SIMD where the 'simd paths' "
                     "line says), not NEON; llama.cpp's rows are its x86 code.")
    return "\n".join(lines)


def target_lines(result: dict) -> list[str]:
    """The report's targets, each tagged met, MISS, wide (``verdict``: the rounds too spread to tell) or n/a."""
    lines = ["targets (ratios of rows timed in alternation in this run; with rounds kept, the middle half of the "
             "rounds decides, 'wide' when it spans the target; a share of the read bandwidth is the row's fastest "
             "round against the probe's best pass, as lesson 09's roofline):"]
    for what, got, want, status in targets(result):
        tag = status if status in ("met", "MISS") else "wide" if status.startswith("unclear") else "n/a "
        extra = f"; 2-thread read bandwidth {result['read_gbps_2t']:.1f} GB/s" if "split-KV" in what else ""
        if "share of 1-thread read bandwidth" in what:
            extra = share_detail(result, 262144, what.split()[1])
        lines.append(f"  {tag:<4}  {what}: {'-' if got is None else f'{got:.2f}'} (target {want:g}){extra}"
                     + ("" if tag in ("met", "MISS") else f" [{status}]"))
    return lines


def share_detail(result: dict, T: int, name: str) -> str:
    """What a share target's figure is of: the row's fastest round against the plain probe; the same against the
    layout probe; and the median round's share, which moves with the machine (``share``)."""
    mem, median = result.get("memory", {}).get(T), share(result, T, name, at="median")
    if median is None:  # the row was not measured
        return ""
    text = f"; fastest of its rounds, of the plain probe ({result['read_gbps']:.1f} GB/s, best pass)"
    of_layout = share(result, T, name, mem["layout_gbps"]) if mem else None
    text += f"; {of_layout:.2f} of the layout probe ({mem['layout_gbps']:.1f} GB/s)" if of_layout else ""
    return text + f"; its median round {median:.2f}"


def memory_lines(result: dict) -> list[str]:
    """The memory section at PAGE_LENGTHS: both read probes on both pagings, how much of each cache huge
    pages back, and the PAGE_ROWS on each paging with their spread over the rounds."""
    lines = []
    for T, mem in result.get("memory", {}).items():
        pct = lambda x: "?" if x is None else f"{100 * x:.0f} %"  # noqa: E731
        lines += ["", f"memory at {T // 1024}K tokens (GB/s of the head's {BPT} bytes per token; 1 thread):",
                  f"  read probes          huge pages  4 KiB pages",
                  f"    plain (fa_read_gbps over 256 MiB, one flat stream)  {result['read_gbps']:6.1f}  "
                  f"{result.get('read_gbps_4k', float('nan')):6.1f}",
                  f"    layout (fa_read_cache_gbps over this cache)         {mem['layout_gbps']:6.1f}  "
                  f"{mem['layout_gbps_4k']:6.1f}",
                  f"  the cache's blocks on huge pages (/proc/self/smaps AnonHugePages): {pct(mem['huge_share'])} "
                  f"(huge_pages=True), {pct(mem['huge_share_4k'])} (huge_pages=False)",
                  "  row, pages: ns/token min / median / max over the rounds; GB/s at the median; share of the plain "
                  "and of the layout probe of the same paging"]
        for name in PAGE_ROWS:
            for suffix, pages, plain, layout in (("", "huge ", result["read_gbps"], mem["layout_gbps"]),
                                                 ("_4k", "4 KiB", result.get("read_gbps_4k"), mem["layout_gbps_4k"])):
                r = result["rows"][T].get(name + suffix)
                if r is None:
                    continue
                lo, med, hi = (np.percentile(r["rounds"], (0, 50, 100)) if r.get("rounds")
                               else (r["ns_per_token"],) * 3)
                lines.append(f"    {name:<5} {pages}  {lo:6.2f} / {med:6.2f} / {hi:6.2f} (max/min {hi / lo:.2f})  "
                             f"{r['gbps']:5.1f} GB/s  {r['gbps'] / plain:.2f} of plain, {r['gbps'] / layout:.2f} "
                             "of layout")
        # huge pages against 4 KiB pages (the board's paging, and any kernel's without transparent huge pages): the
        # two rows were timed in the same interleaved rounds, so compare's verdict (lessonkit/core/compare.py,
        # as lesson 09's pages rung) pairs them by round and may say it cannot tell
        rows, load = result["rows"][T], mem.get("load", (None,))
        pairs = [(n, rows[n].get("rounds") or [], rows[n + "_4k"].get("rounds") or []) for n in PAGE_ROWS
                 if n in rows and n + "_4k" in rows]
        if pairs:
            lines.append("  huge pages against 4 KiB pages (the board's paging), each row's rounds paired:")
            for n, huge, small in pairs:
                if len(huge) == len(small) >= compare.MIN_ROUNDS:
                    paired = {f"{n} on huge pages": huge, f"{n} on 4 KiB pages": small}
                    lines.append(f"    {compare.verdict(paired, load)}")
                else:
                    lines.append(f"    {n}: {min(len(huge), len(small))} rounds, too few for a verdict (at least "
                                 f"{compare.MIN_ROUNDS})")
            lines.append(f"    the layout probe alone (no arithmetic, one reading each): {mem['layout_gbps']:.1f} GB/s "
                         f"on huge pages, {mem['layout_gbps_4k']:.1f} on 4 KiB pages. A stream on 4 KiB pages needs "
                         "a TLB entry and a page walk every 4 KiB (32 tokens of one head), and hardware prefetchers "
                         "stop at page boundaries.")
    if lines and result["machine"].endswith(("simde-x86_64", "simde-generic")):
        lines.append("  x86: the kernels are the NEON source built through SIMDe, with x86 SIMD where the 'simd paths' "
                     "line says (avx2, avx512, ssse3), not NEON.")
    return lines


def _json_path_error(path: Path) -> str | None:
    """Why --json PATH cannot be written, asked before the long run that ends by writing it: by
    making the temporary file write_atomic will make there (os.access answers yes to root, even in
    /proc)."""
    folder = path.parent
    if not str(path).strip() or path == Path("."):  # --json "" would quietly write nothing
        return _("--json needs a file name, e.g. bench.json")
    if path.is_dir():
        return _("--json {path} is a folder; give a file name, e.g. {example}").format(
                 path=path, example=path / "bench.json")
    if not folder.is_dir():
        return _("--json {path}: there is no folder {folder}; make it (mkdir -p {folder}) or choose another "
                 "path").format(path=path, folder=folder)
    try:
        tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.", suffix=".tmp").close()
    except OSError as e:
        return _("--json {path}: cannot write a file in {folder} ({why}); choose another path").format(
                 path=path, folder=folder, why=e.strerror)
    return None


MAX_RUNS = 20
RUNS_SPREAD = 1.15  # the largest max/min of the 256K lowp figure over the runs


def several_runs(n: int, argv: list[str], json_path: str | None) -> int:
    """``--runs N``: the benchmark N times in new processes (each allocates its caches afresh, as a first
    run does), each printing its report; then each target's figure and verdict in every run, in how many
    runs it was met, and the spread of the 256K lowp share over the runs (max/min of the runs' figures)."""
    rest, skip = [], False
    for a in argv:  # the same arguments, without --runs and --json
        if skip or a in ("--runs", "--json"):
            skip = not skip
        elif not a.startswith(("--runs=", "--json=")):
            rest.append(a)
    results = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(n):
            print(f"=== run {i + 1} of {n} (1-minute load average {os.getloadavg()[0]:.2f})", flush=True)
            out = Path(d) / f"run{i}.json"
            subprocess.run([sys.executable, "-m", "workbench", "bench", *rest, "--json", str(out)], check=True)
            results.append(json.loads(out.read_text()))
    print(f"\n=== the targets over {n} runs: met in how many, then each run's figure and verdict")
    table: dict[tuple, list] = {}
    for r in results:
        for what, got, want, status in r["targets"]:
            tag = status if status in ("met", "MISS") else "wide" if status.startswith("unclear") else "n/a"
            table.setdefault((what, want), []).append(f"{'-' if got is None else f'{got:.2f}'} {tag}")
    for (what, want), cells in table.items():
        print(f"  {sum(c.endswith(' met') for c in cells)}/{n}  {what} (target {want:g}): {', '.join(cells)}")
    shares = [got for r in results for what, got, unused, unused2 in r["targets"]
              if what.startswith("256K: lowp bytes/ns") and got]
    if len(shares) == n:
        spread = max(shares) / min(shares)
        print(f"  {'met ' if spread <= RUNS_SPREAD else 'MISS'}  spread of the 256K lowp share over the {n} runs, "
              f"max/min: {spread:.2f} (target <= {RUNS_SPREAD:g}; {min(shares):.2f} to {max(shares):.2f})")
    if json_path is not None:
        write_atomic(json_path, json.dumps(results, indent=1))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1K, 8K and 64K only, fewer repeats (under a minute)")
    p.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    p.add_argument("--n-kv-heads", type=int, default=N_KV_HEADS,
                   help=f"kv heads in the cache (default {N_KV_HEADS}; Qwen3-8B has 8); one is attended")
    p.add_argument("--cores", default=None,
                   help="core type to run on where there are several, e.g. Cortex-A55 (default: the big cores; "
                        "'any': no pinning)")
    p.add_argument("--lengths", type=int, nargs="+", metavar="T",
                   help=f"sequence lengths to time (default {' '.join(map(str, FULL_LENGTHS))}; --quick: "
                        f"{' '.join(map(str, QUICK_LENGTHS))})")
    p.add_argument("--runs", type=int, default=1, metavar="N",
                   help="run the benchmark N times, each in a new process, and end with the table of the targets "
                        "over the N runs (e.g. --runs 5 --lengths 8192 262144)")
    args = p.parse_args(argv)
    if args.json is not None and (why := _json_path_error(Path(args.json))):
        p.error(why)
    if not 1 <= args.runs <= MAX_RUNS:
        p.error(f"--runs must be 1 to {MAX_RUNS}")
    if args.runs > 1:
        return several_runs(args.runs, [a for a in (argv if argv is not None else sys.argv[1:])], args.json)
    lengths, repeats = (QUICK_LENGTHS, 3) if args.quick else (FULL_LENGTHS, 7)
    result = run(args.lengths or lengths, repeats, args.n_kv_heads, cores=args.cores,
                 lowp_error="quick" if args.quick else "full")
    print(report(result))
    if args.json is not None:
        write_atomic(args.json, json.dumps({**result, "targets": targets(result)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
