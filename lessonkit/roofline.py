"""How fast can the kernel go: its numbered versions against the memory floor (introduced in lesson 09).

A token costs at least its bytes over the memory's bandwidth: ``floor_ns(bytes, GB/s)``. A loop that
needs more time than that per token is compute-bound; one that needs less waits for memory. This
module gathers what lesson 09 shows about the versions of the registry (native/fa_variants.h,
``lessonkit.variants``):

- ``path()``: the article's kernel, then every version that adds one idea to the one before it
  ("on v..." in the registry), then "fast": read from the registry, so new versions appear by
  themselves.
- ``check_variants()``: every version's output on awkward shapes against the scalar C reference
  (1e-5 of max|out|, the registry's tolerance: the versions only reorder float32 sums and fuse
  multiply-adds).
- ``measure()``: ns/token of each version at each length, timed in alternation (``bench.interleaved``),
  the minimum of the rounds (the least disturbed one: on a shared machine load only adds time),
  this machine's single-thread read bandwidth and its last-level cache size, and the grouped, split and llama.cpp (ggml) rows at one
  length.
- ``a76_estimates()``: llvm-mca ESTIMATES of cycles/token on the Neoverse N1 model (the stand-in for the
  Cortex-A76, lessonkit.cycles), with the instruction mix.
- ``results(saved)``: all of it, measured now and written to ``saved`` when LESSONKIT_SAVE_RESULTS=1,
  otherwise read from ``saved`` (a full run takes minutes; CI and students read the saved figures and
  re-measure a small part live with ``measure``).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np

from . import cycles, env, native
from . import validate as check
from .cache import KVCacheQ8
from .language import pad, tr
from .variants import BY_NAME, VARIANTS

SAVE_ENV = "LESSONKIT_SAVE_RESULTS"
HEAD_DIM = 128
LENGTHS = (1024, 8192, 65536, 262144)
# traced lengths for llvm-mca, tried in order: 7 and 13 tiles of 16 so the tiled loops repeat often enough
# (the default 48/80 finds no loop in them); a second pair when the first finds none (seen once for "magic")
TRACE_TOKENS = ((112, 208), (144, 272))
# the board's all-core sequential DRAM bandwidth, a cited range (docs/references.md, "All-core memory
# bandwidth of an RK3588 board"); its single-thread figure is lessonkit.cycles.BOARD_GBPS
BOARD_ALLCORE_GBPS = (17.0, 22.0)
ROUNDS = 9  # interleaved rounds of the saved table; its minimum is kept (cheap: a sample is ~1 ms)
RTOL = 1e-5  # of max|scalar out|: the registry's tolerance for every version
# (seq_len, n_kv_heads, head_dim, block_size, kv_head): one token, a tile and a bit, odd blocks, hd 32..256
SHAPES = ((1, 1, 32, 1, 0), (15, 2, 64, 16, 1), (17, 1, 128, 4, 0), (100, 3, 96, 7, 2),
          (333, 8, 128, 64, 5), (40, 1, 256, 64, 0), (1000, 2, 128, 3, 1))


def bytes_per_token(head_dim: int = HEAD_DIM) -> int:
    """What one token of one kv head reads at least: its int8 K and V rows and their two fp32 scales."""
    return 2 * head_dim + 2 * 4


def floor_ns(nbytes: float, gbps: float) -> float:
    """The memory floor: ns per token to read ``nbytes`` at ``gbps`` GB/s (bytes / (bytes per ns))."""
    return float(nbytes) / float(gbps)


def demand_gbps(cycles_per_token: float, ghz: float, cores: int = 1, nbytes: float | None = None) -> float:
    """GB/s that ``cores`` cores ask of memory when each runs a loop of ``cycles_per_token`` at ``ghz``
    GHz on its own head: bytes per token / ns per token, times the cores."""
    nbytes = bytes_per_token() if nbytes is None else nbytes
    return cores * nbytes / (cycles_per_token / ghz)


def path() -> list[str]:
    """The article's kernel, each version that builds on the one before it, then "fast"."""
    names = ["neon"] + [v.name for v in VARIANTS if v.adds.startswith("on v")]
    return names + (["fast"] if "fast" in BY_NAME else [])


def what_it_adds(name: str) -> str:
    """What version ``name`` adds to the one before it, in the current language (the registry's
    text; lessonkit.variants.ADDS_ZH in Chinese)."""
    from .variants import adds_text
    return adds_text(name)


def run_variant(name: str, q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float | None = None) -> np.ndarray:
    """One call of registry version ``name`` (through the library's table, fa_time_calls(version, 1, ...)),
    its output float32 ``[head_dim]``. Inputs checked first: nothing bad reaches the C code."""
    if name not in BY_NAME:
        raise ValueError(tr(f"name must be one of {', '.join(map(repr, BY_NAME))}; got {check.short(name)}",
                            f"name 必须是 {', '.join(map(repr, BY_NAME))} 之一；实际是 {check.short(name)}"))
    check.kv_cache(cache)
    q = check.float32_array("q", q, (cache.head_dim,))
    kv_head, scale = check.attention_call(cache, kv_head, scale)
    ffi, lib = native.load()
    out = np.full(cache.head_dim, np.nan, np.float32)  # a version that writes nothing fails the check
    k, v, ks, vs, T, kv_dim, kv_bs, nkv, kh_off = cache.kernel_args(kv_head, ffi)
    lib.fa_time_calls(BY_NAME[name].version, 1, ffi.from_buffer("float[]", out, require_writable=True),
                      ffi.from_buffer("float[]", q), k, v, ks, vs, T, kv_dim, kv_bs, nkv, kh_off,
                      cache.head_dim, scale)
    return out


def _shape_case(seq_len, nkv, hd, bs, seed):
    rng = np.random.default_rng(seed)
    cache = KVCacheQ8(nkv, hd, bs)
    cache.append(rng.standard_normal((seq_len, nkv, hd), dtype=np.float32) * 2,
                 rng.standard_normal((seq_len, nkv, hd), dtype=np.float32))
    return cache, rng.standard_normal(hd, dtype=np.float32)


def check_variants(names=None, shapes=SHAPES, rtol: float = RTOL) -> tuple[int, list[str]]:
    """Every version of ``names`` (default: ``path()``) on every shape against the scalar C reference,
    ``|out - scalar| <= rtol * max|scalar|``. Returns (checks passed, failure messages)."""
    names = path() if names is None else list(names)
    passed, failures = 0, []
    for i, (T, nkv, hd, bs, kh) in enumerate(shapes):
        cache, q = _shape_case(T, nkv, hd, bs, seed=90 + i)
        ref = run_variant("scalar", q, cache, kh)
        tol = rtol * max(float(np.abs(ref).max()), 1e-30)
        for name in names:
            out = run_variant(name, q, cache, kh)
            err = float(np.abs(out - ref).max()) if np.isfinite(out).all() else math.inf
            if err <= tol:
                passed += 1
            else:
                failures.append(tr(f"{name} at seq_len {T}, {nkv} kv heads, hd {hd}, blocks of {bs}: "
                                   f"max error {err:.3g} > {tol:.3g}",
                                   f"{name} 在 seq_len {T}、{nkv} 个 kv 头、hd {hd}、块大小 {bs} 时："
                                   f"最大误差 {err:.3g} > {tol:.3g}"))
    return passed, failures


def cache_bytes(sysfs: Path | str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The largest CPU cache of this machine in bytes (its last level, usually L3), from Linux's sysfs;
    None where sysfs does not say. A KV cache smaller than this can stay in it between calls."""
    sizes = []
    for f in Path(sysfs).glob("index*/size"):
        txt = f.read_text().strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1:], 1)
        try:
            sizes.append(int(txt.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return max(sizes) if sizes else None


def measure(lengths=(8192,), names=None, rounds: int = 5, extra_at: int | None = None) -> dict:
    """ns/token of each version at each length, timed in alternation (one sample of each per round;
    the MINIMUM of the rounds is kept: the least disturbed sample, since other load on a shared
    machine only ever adds time), one kv head of head_dim 128; this machine's single-thread read
    bandwidth and largest cache (``cache_bytes``); and, at ``extra_at``
    tokens (if given), the grouped call for 4 query heads, 4 per-head calls of "neon" and of "fast", split-KV on 1
    and 2 threads and llama.cpp's q8_0 flash attention (ggml; skipped with the reason when missing)."""
    from . import bench
    from .kernels import attention, split
    from .timing import time_kernel
    names = path() if names is None else list(names)
    res = dict(machine=env.machine_label(), head_dim=HEAD_DIM, bytes_per_token=bytes_per_token(),
               read_gbps=bench.read_bandwidth_gbps(), cache_bytes=cache_bytes(), rounds=rounds, rows={}, extra={}, extra_at=extra_at, skipped={})
    for T in bench._lengths("lengths", list(lengths)):
        cache, kh, q = bench.make_inputs(T)[:3]
        number = max(1, 65536 // T)
        cont = {n: (lambda n=n: time_kernel(q, cache, kh, backend=n, repeats=1, number=number)) for n in names}
        res["rows"][T] = {n: ns / T for n, ns in bench.interleaved(cont, rounds, stat="min").items()}
        # the probe again after each length, the highest kept: like a timing, load only lowers it
        res["read_gbps"] = max(res["read_gbps"], bench.read_bandwidth_gbps())
    if extra_at:
        T = extra_at
        cache, kh, q, K, V = bench.make_inputs(T)
        qs = bench.group_queries()
        number = max(1, 65536 // T)
        cont = {"group4": lambda: attention.time_group(qs, cache, kh, "group", repeats=1, number=number),
                "per_head4": lambda: attention.time_group(qs, cache, kh, "per_head", repeats=1, number=number),
                "per_head_fast4": lambda: attention.time_group(qs, cache, kh, "per_head_fast", repeats=1,
                                                               number=number),
                "fast": lambda: time_kernel(q, cache, kh, backend="fast", repeats=1, number=number),
                "split_1t": bench._per_call(lambda: split.attend_split(q, cache, kh, 2, 1), number),
                "split_2t": bench._per_call(lambda: split.attend_split(q, cache, kh, 2, 2), number)}
        gc, closing, _ = bench.ggml_contenders(q, K, V, 1 / math.sqrt(HEAD_DIM), number)
        if gc is None:
            res["skipped"]["ggml"] = closing
            closing = []
        else:
            cont.update({k: gc[k] for k in ("ggml_h1_t1", "ggml_h4_t1") if k in gc})
        try:
            res["extra"] = {n: ns / T for n, ns in bench.interleaved(cont, rounds, stat="min").items()}
        finally:
            for fa in closing:
                fa.close()
    return res


def a76_estimates(names=None) -> dict:
    """{name: llvm-mca ESTIMATE on the Neoverse N1 model (dict of lessonkit.cycles.Estimate)} or
    {name: the reason there is none}; {} when the tools are missing."""
    names = path() if names is None else list(names)
    if cycles.missing_tools():
        return {}
    out = {}
    for n in names:
        for tokens in TRACE_TOKENS:
            try:
                out[n] = dataclasses.asdict(cycles.estimate(n, cpu="neoverse-n1", dotprod=True, tokens=tokens)[0])
                break
            except (RuntimeError, ValueError) as err:
                out[n] = f"no estimate: {err}"
    return out


def collect() -> dict:
    """Everything lesson 09 shows, measured now (several minutes)."""
    res = measure(LENGTHS, rounds=ROUNDS, extra_at=65536)
    res["a76"] = a76_estimates()
    res["llvm_mca"] = cycles.MCA
    return res


def _keys_to_int(rows: dict) -> dict:
    return {int(k): v for k, v in rows.items()}


def results(saved: Path | str, save: bool | None = None) -> tuple[dict, str]:
    """(the figures, a note saying where they come from). With ``save`` (default: LESSONKIT_SAVE_RESULTS
    is "1") measure everything now and write it to ``saved``; otherwise read ``saved``. Lesson 09 passes
    the absolute path under notebooks/data/, which both editions share."""
    saved = Path(saved)
    if save if save is not None else os.environ.get(SAVE_ENV) == "1":
        res = collect()
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(res, indent=1) + "\n")
        return res, tr(f"measured now and saved to {saved.name}", f"现在测得，已保存到 {saved.name}")
    if not saved.is_file():
        raise RuntimeError(tr(f"no saved results in {saved.name}: run the notebook with {SAVE_ENV}=1",
                              f"{saved.name} 里没有保存的结果：请设置 {SAVE_ENV}=1 运行本课"))
    res = json.loads(saved.read_text())
    res["rows"] = _keys_to_int(res["rows"])
    # the machine label was saved in English (env.machine_label); its words follow the language
    res["machine"] = res.get("machine", "").replace("kernel backend ", tr("kernel backend ", "内核后端 "))
    return res, tr(f"saved in {saved.name} (run the notebook with {SAVE_ENV}=1 to measure them on your machine)",
                   f"读自保存的 {saved.name}（设置 {SAVE_ENV}=1 运行本课，即可在你的机器上重测）")


def table(res: dict) -> str:
    """One line per version: what it adds, ns/token at each length, the A76 estimate and its mix."""
    lengths = sorted(res["rows"])
    head = pad(tr("version", "版本"), 14) + "".join(f"{f'{T // 1024}K':>8}" for T in lengths) + \
        pad(tr("A76 est.", "A76 估计"), 10, right=True) + pad(tr("instr.", "指令数"), 8, right=True) + \
        tr("  mix per token (loads/simd/scalar)", "  每 token 指令构成（加载/SIMD/标量）")
    rounds = (tr(f", fastest of {res['rounds']} interleaved rounds", f"，交替计时 {res['rounds']} 轮取最快")
              if res.get("rounds") else "")
    lines = [tr(f"ns/token on {res['machine']}{rounds} (x86 runs SIMDe's build of the NEON source, not NEON)",
                f"{res['machine']} 上的 ns/token{rounds}（x86 运行的是 SIMDe 构建的 NEON 源码，不是 NEON）"),
             tr("A76 est.: llvm-mca ESTIMATE, Neoverse N1 model, cycles/token",
                "A76 估计：llvm-mca 的估计值（不是实测），Neoverse N1 模型，周期/token"), head]
    for n in path():
        if n not in res["rows"][lengths[0]]:
            continue
        cells = "".join(f"{res['rows'][T][n]:8.1f}" for T in lengths)
        e = res.get("a76", {}).get(n)
        est = (f"{e['cycles_per_token']:10.0f}{e['mix']['total']:8.0f}  "
               f"{e['mix']['loads']:.0f}/{e['mix']['simd']:.0f}/{e['mix']['scalar']:.0f}") if isinstance(e, dict) \
            else f"{'-':>10}{'-':>8}  {tr('no estimate', '没有估计值') if e else tr('no llvm-mca here', '本机没有 llvm-mca')}"
        lines.append(f"{n:<14}{cells}{est}")
    return "\n".join(lines)
