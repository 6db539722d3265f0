"""Lesson 09's saved figures, measured again: ``make figures`` (``python -m workbench figures``) writes
``notebooks/data/09_how_fast.json``, which lesson 09 reads (``lessonkit.roofline.results``): the versions'
table with every round's sample (``samples``: lesson 09 judges each idea from them by ``lessonkit.core.compare``'s
protocol), lesson 08's rows and llama.cpp's at 64K, llvm-mca's ESTIMATES for the Cortex-A76 (the Neoverse N1
model: ``workbench/a76.py``) and the roofs. About two minutes here; run it on a quiet machine (the timings are
this machine's, and a load above the core count makes every verdict "cannot tell")."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lessonkit.core import timing
from lessonkit.core.files import REPO_DIR, write_atomic
from lessonkit.lessons import bench, roofline

from . import a76
from .bench import beyond_contenders, ggml_contenders

SAVED = REPO_DIR / "notebooks" / "data" / "09_how_fast.json"
EXTRA_AT = 65536  # lesson 08's rows, fast and llama.cpp's beside the versions, at this length

LENGTHS = (1024, 8192, 65536, 262144)


# lengths traced for llvm-mca, in order: 7 and 13 tiles of 16, so the tiled loops repeat often enough;
# the second pair when the first finds no loop (seen once for "magic")
TRACE_TOKENS = ((112, 208), (144, 272))


ROUNDS = 9   # interleaved rounds of the saved table (a sample is ~1 ms); their 95 % band: the 2nd to the 8th ratio


# LLVM 19's Neoverse N1 model dispatches 8 micro-ops a cycle; Arm's N1 Software Optimization Guide
# gives a narrower front end (LLVM pull request #154495, 2025, which lowered the model's width and
# where "a value of 4 would help match the SWOG"): the lesson re-estimates with 4 to show what that does
SWOG_DISPATCH = 4


# the fewest vector instructions one token's useful arithmetic needs at hd 128 on the A76: 8 sdot
# (16 int8 multiply-adds each) for K.q and 32 fmla (4 fp32 multiply-adds each) for the V sum, on enough
# accumulators (v0-v7, v8-v27) that no chain of dependent adds holds them back: the pipes' rate alone
PEAK_BLOCK = ([f"sdot v{i}.4s, v30.16b, v31.16b" for i in range(8)]
              + [f"fmla v{8 + i % 20}.4s, v28.4s, v29.4s" for i in range(32)])


def a76_estimates(names=None) -> dict:
    """{name: llvm-mca's ESTIMATE on the Neoverse N1 model (an Estimate as a dict), or why there is
    none}; {} without the tools."""
    if a76.missing_tools():
        return {}
    out = {}
    for n in roofline.path() if names is None else list(names):
        for tokens in TRACE_TOKENS:
            try:
                out[n] = dataclasses.asdict(a76.estimate(n, cpu="neoverse-n1", dotprod=True, tokens=tokens)[0])
                break
            except (RuntimeError, ValueError) as err:
                out[n] = f"no estimate: {err}"
    return out


def _mca_cycles(ins: list[str], dispatch: int | None = None) -> float:
    """llvm-mca's cycles per iteration of ``ins`` on the Neoverse N1 model (``dispatch``: another width)."""
    cmd = [a76.MCA, "-mtriple=aarch64", "-mcpu=neoverse-n1", f"-iterations={a76.ITERATIONS}"]
    r = subprocess.run(cmd + ([f"-dispatch={dispatch}"] if dispatch else []), input="\n".join(ins) + "\n",
                       capture_output=True, text=True, timeout=600, check=True)
    return a76.parse_mca(r.stdout)["cycles_per_iteration"]


def a76_dispatch_estimates(names=None, dispatch: int = SWOG_DISPATCH) -> dict:
    """{name: cycles per token on the N1 model with ``dispatch`` micro-ops a cycle instead of the model's
    8}, the same traced loops as a76_estimates; {} without the tools."""
    if a76.missing_tools():
        return {}
    vs = a76.variants()
    index = {v.name: i for i, v in enumerate(vs)}
    out = {}
    with tempfile.TemporaryDirectory() as d:
        exe = a76.build(Path(d), vs, dotprod=True)
        for n in roofline.path() if names is None else list(names):
            for tokens in TRACE_TOKENS:
                try:
                    loops = a76.token_loops(exe, index[n], vs[index[n]].function, tokens)
                    out[n] = sum(_mca_cycles(a76.disassemble(lp["words"], True), dispatch) / lp["tokens_per_period"]
                                 for lp in loops)
                    break
                except (RuntimeError, ValueError, subprocess.CalledProcessError) as err:
                    out[n] = f"no estimate: {err}"
    return out


def a76_peak_cycles() -> float | None:
    """llvm-mca's cycles for PEAK_BLOCK on the N1 model: the fewest cycles a token's useful arithmetic
    takes (the A76's compute roof, an estimate); None without llvm-mca."""
    if a76.missing_tools():
        return None
    return _mca_cycles(PEAK_BLOCK)


def fp32_gflops(n: int = 1024, repeats: int = 7) -> float:
    """GFLOP/s of numpy's float32 matrix product (BLAS sgemm) on one thread, fastest of ``repeats``: a
    multiply-add rate this machine reaches, so a lower bound on its peak (the compute roof of lesson 09)."""
    from threadpoolctl import threadpool_limits
    a = np.random.default_rng(9).standard_normal((n, n), dtype=np.float32)
    best = math.inf
    with threadpool_limits(1):
        for unused in range(repeats):
            t = time.perf_counter()
            a @ a
            best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def collect() -> dict:
    """Everything lesson 09 shows, measured now (about two minutes here): the table with its rounds, the
    estimates, the roofs."""
    res = roofline.measure(LENGTHS, rounds=ROUNDS)
    res.update(extra=beyond_rows(EXTRA_AT, ROUNDS), extra_at=EXTRA_AT, skipped={})
    if isinstance(res["extra"].get("skipped"), str):
        res["skipped"]["ggml"] = res["extra"].pop("skipped")
    res.update(a76=a76_estimates(roofline.path() + [a76.GROUP[1]]), a76_dispatch=a76_dispatch_estimates(),
               a76_peak_cycles=a76_peak_cycles(), fp32_gflops=fp32_gflops(), llvm_mca=a76.MCA)
    return res


def beyond_rows(T: int, rounds: int) -> dict:
    """ns/token at ``T`` tokens of lesson 08's rows, fast and llama.cpp's (1 and 4 heads, 1 thread), the minimum
    of ``rounds`` interleaved rounds; ``"skipped"``: why llama.cpp's rows are missing, where they are."""
    cache, kh, q, K, V = bench.make_inputs(T)
    number = max(1, 65536 // T)
    cont = beyond_contenders(q, bench.group_queries(), cache, kh, number)
    cont.update(timing.kernel_contenders(["fast"], q, cache, kh, number))
    gc, closing, unused, why = ggml_contenders(q, K, V, 1 / math.sqrt(roofline.HEAD_DIM), number)
    cont.update({k: gc[k] for k in ("ggml_h1_t1", "ggml_h4_t1") if k in gc})
    out = {n: ns / T for n, ns in timing.interleaved(cont, rounds, stat="min", close=closing).items()}
    return {**out, "skipped": why} if why else out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench figures", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(SAVED), help=f"where to write (default {SAVED.relative_to(REPO_DIR)})")
    args = p.parse_args(argv)
    res = collect()
    write_atomic(args.out, json.dumps(res, indent=1) + "\n")  # minutes of figures: never half a file
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
