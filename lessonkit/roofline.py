"""How fast can the kernel go (lesson 09): the numbered versions of the registry (native/fa_variants.h,
``lessonkit.variants``) against the memory floor, bytes per token over the read bandwidth.

``path()`` is the article's kernel, each version that adds one idea to the one before it ("on v..."),
then "fast"; ``check_variants()`` holds each to the scalar C kernel on awkward shapes; ``measure()``
times them in alternation and keeps the minimum of the rounds (load on a shared machine only adds
time); ``results(saved)`` measures everything and saves it (LESSONKIT_SAVE_RESULTS=1) or reads it back,
with llvm-mca's ESTIMATES for the Cortex-A76 (lessonkit.cycles) beside the timings."""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np

from . import cycles, env, native
from . import validate as check
from .cache import KVCacheQ8, attention_call, kv_cache
from .files import write_atomic
from .language import _
from .table import Table
from .traffic import SYS_CACHE, size_bytes
from .variants import BY_NAME, VARIANTS  # noqa: F401  (lesson 09 calls it here)
from .variants import adds_text as what_it_adds  # noqa: F401  (lesson 09 calls it here)

SAVE_ENV = "LESSONKIT_SAVE_RESULTS"
HEAD_DIM = 128
LENGTHS = (1024, 8192, 65536, 262144)
# lengths traced for llvm-mca, in order: 7 and 13 tiles of 16, so the tiled loops repeat often enough;
# the second pair when the first finds no loop (seen once for "magic")
TRACE_TOKENS = ((112, 208), (144, 272))
# the board's all-core sequential DRAM bandwidth, a cited range (docs/references.md, "All-core memory
# bandwidth of an RK3588 board"); its single-thread figure is lessonkit.cycles.BOARD_GBPS
BOARD_ALLCORE_GBPS = (17.0, 22.0)
ROUNDS = 9   # interleaved rounds of the saved table (a sample is ~1 ms)
RTOL = 1e-5  # of max|scalar out|: the versions only reorder float32 sums and fuse multiply-adds
# (seq_len, n_kv_heads, head_dim, block_size, kv_head): one token, a tile and a bit, odd blocks, hd 32..256
SHAPES = ((1, 1, 32, 1, 0), (15, 2, 64, 16, 1), (17, 1, 128, 4, 0), (100, 3, 96, 7, 2),
          (333, 8, 128, 64, 5), (40, 1, 256, 64, 0), (1000, 2, 128, 3, 1))


def bytes_per_token(head_dim: int = HEAD_DIM) -> int:
    """What one token of one kv head reads at least: its int8 K and V rows and their two fp32 scales."""
    return 2 * head_dim + 2 * 4


def floor_ns(nbytes: float, gbps: float) -> float:
    """The memory floor: ns per token to read ``nbytes`` at ``gbps`` GB/s."""
    return float(nbytes) / float(gbps)


def demand_gbps(cycles_per_token: float, ghz: float, cores: int = 1, nbytes: float | None = None) -> float:
    """GB/s ``cores`` cores ask of memory, each running a loop of ``cycles_per_token`` at ``ghz`` on its head."""
    return cores * (bytes_per_token() if nbytes is None else nbytes) / (cycles_per_token / ghz)


def path() -> list[str]:
    """The article's kernel, each version that builds on the one before it, then "fast"."""
    return ["neon"] + [v.name for v in VARIANTS if v.adds.startswith("on v")] + (["fast"] if "fast" in BY_NAME else [])


def run_variant(name: str, q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float | None = None) -> np.ndarray:
    """One call of registry version ``name`` through the library's table (fa_time_calls(version, 1, ...))."""
    if name not in BY_NAME:
        raise ValueError(_("name must be one of {map_by_name}; got {short_check}").format(
                           map_by_name=', '.join(map(repr, BY_NAME)), short_check=check.short(name)))
    kv_cache(cache)
    q = check.float32_array("q", q, (cache.head_dim,))
    kv_head, scale = attention_call(cache, kv_head, scale)
    ffi, lib = native.load()
    out = np.full(cache.head_dim, np.nan, np.float32)  # a version that writes nothing fails the check
    lib.fa_time_calls(BY_NAME[name].version, 1, ffi.from_buffer("float[]", out, require_writable=True),
                      ffi.from_buffer("float[]", q), *cache.kernel_args(kv_head, ffi, lib), cache.head_dim, scale)
    return out


def check_variants(names=None, shapes=SHAPES, rtol: float = RTOL) -> tuple[int, list[str]]:
    """Each version of ``names`` (default ``path()``) on each shape against the scalar C kernel,
    ``|out - scalar| <= rtol * max|scalar|``: (checks passed, failure messages)."""
    names = path() if names is None else list(names)
    passed, failures = 0, []
    for i, (T, nkv, hd, bs, kh) in enumerate(shapes):
        rng = np.random.default_rng(90 + i)
        cache = KVCacheQ8(nkv, hd, bs)
        cache.append(rng.standard_normal((T, nkv, hd), dtype=np.float32) * 2,
                     rng.standard_normal((T, nkv, hd), dtype=np.float32))
        q = rng.standard_normal(hd, dtype=np.float32)
        ref = run_variant("scalar", q, cache, kh)
        tol = rtol * max(float(np.abs(ref).max()), 1e-30)
        for name in names:
            out = run_variant(name, q, cache, kh)
            err = float(np.abs(out - ref).max()) if np.isfinite(out).all() else math.inf
            if err <= tol:
                passed += 1
            else:
                failures.append(_("{name} at seq_len {T}, {nkv} kv heads, hd {hd}, blocks of {bs}: max error "
                                  "{err:.3g} > {tol:.3g}").format(
                                  name=name, T=T, nkv=nkv, hd=hd, bs=bs, err=err, tol=tol))
    return passed, failures


def cache_bytes(sysfs: Path | str = SYS_CACHE) -> int | None:
    """The largest CPU cache (its last level) in bytes from Linux's sysfs, None where it does not say."""
    sizes = []
    for f in Path(sysfs).glob("index*/size"):
        try:
            sizes.append(size_bytes(f.read_text()))
        except ValueError:
            continue
    return max(sizes) if sizes else None


def measure(lengths=(8192,), names=None, rounds: int = 5, extra_at: int | None = None) -> dict:
    """ns/token of each version at each length (one kv head of head_dim 128), the minimum of ``rounds``
    interleaved rounds; the single-thread read bandwidth (highest of the probes) and the largest CPU
    cache; at ``extra_at`` tokens lesson 08's rows, "fast" and llama.cpp's (skipped with the reason)."""
    from . import bench
    names = path() if names is None else list(names)
    res = dict(machine=env.machine_label(), head_dim=HEAD_DIM, bytes_per_token=bytes_per_token(),
               read_gbps=bench.read_bandwidth_gbps(), cache_bytes=cache_bytes(), rounds=rounds, rows={}, extra={},
               extra_at=extra_at, skipped={})
    for T in bench._lengths("lengths", list(lengths)):
        cache, kh, q = bench.make_inputs(T)[:3]
        number = max(1, 65536 // T)
        cont = bench.kernel_contenders(names, q, cache, kh, number)
        res["rows"][T] = {n: ns / T for n, ns in bench.interleaved(cont, rounds, stat="min").items()}
        res["read_gbps"] = max(res["read_gbps"], bench.read_bandwidth_gbps())
    if extra_at:
        T = extra_at
        cache, kh, q, K, V = bench.make_inputs(T)
        number = max(1, 65536 // T)
        cont = bench.beyond_contenders(q, bench.group_queries(), cache, kh, number)
        cont.update(bench.kernel_contenders(["fast"], q, cache, kh, number))
        gc, closing, unused, why = bench.ggml_contenders(q, K, V, 1 / math.sqrt(HEAD_DIM), number)
        cont.update({k: gc[k] for k in ("ggml_h1_t1", "ggml_h4_t1") if k in gc})
        if why:
            res["skipped"]["ggml"] = why
        res["extra"] = {n: ns / T for n, ns in bench.interleaved(cont, rounds, stat="min", close=closing).items()}
    return res


def a76_estimates(names=None) -> dict:
    """{name: llvm-mca's ESTIMATE on the Neoverse N1 model (an Estimate as a dict), or why there is
    none}; {} without the tools."""
    if cycles.missing_tools():
        return {}
    out = {}
    for n in path() if names is None else list(names):
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
    res.update(a76=a76_estimates(), llvm_mca=cycles.MCA)
    return res


def results(saved: Path | str, save: bool | None = None) -> tuple[dict, str]:
    """(the figures, where they come from): measured now and written to ``saved`` with ``save``
    (default: LESSONKIT_SAVE_RESULTS is "1"), else read from ``saved`` (lesson 09 passes the absolute
    path under notebooks/data/, which both editions share)."""
    saved = Path(saved)
    if save if save is not None else os.environ.get(SAVE_ENV) == "1":
        res = collect()
        saved.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(saved, json.dumps(res, indent=1) + "\n")  # minutes of figures: never half a file
        return res, _("measured now and saved to {name}").format(name=saved.name)
    if not saved.is_file():
        raise RuntimeError(_("no saved results in {name}: run the notebook with {SAVE_ENV}=1").format(
                             name=saved.name, SAVE_ENV=SAVE_ENV))
    res = json.loads(saved.read_text())
    res["rows"] = {int(k): v for k, v in res["rows"].items()}
    # the machine label was saved in English (env.machine_label); its words follow the language
    res["machine"] = res.get("machine", "").replace("kernel backend ", _("kernel backend "))
    return res, _("saved in {name} (run the notebook with {SAVE_ENV}=1 to measure them on your machine)").format(
                  name=saved.name, SAVE_ENV=SAVE_ENV)


def table(res: dict) -> Table:
    """One row per version: ns/token at each length, the A76 estimate and its instruction mix."""
    lengths = sorted(res["rows"])
    rounds = (_(", fastest of {res} interleaved rounds").format(res=res['rounds'])
              if res.get("rounds") else "")
    rows = []
    for n in (n for n in path() if n in res["rows"][lengths[0]]):
        e = res.get("a76", {}).get(n)
        if isinstance(e, dict):
            est = [e["cycles_per_token"], e["mix"]["total"],
                   f"{e['mix']['loads']:.0f}/{e['mix']['simd']:.0f}/{e['mix']['scalar']:.0f}"]
        else:
            est = ["-", "-", _("no estimate") if e else _("no llvm-mca here")]
        rows.append([n, *(res["rows"][T][n] for T in lengths), *est])
    k = len(lengths)
    return Table(rows, header=[_("version"), *(f"{T // 1024}K" for T in lengths), _("A76 est."),
                               _("instr."),
                               _("mix per token (loads/simd/scalar)")],
                 caption=_("ns/token on {res}{rounds} (x86 runs SIMDe's build of the NEON source, not NEON); A76 "
                           "est.: llvm-mca ESTIMATE, Neoverse N1 model, cycles/token").format(
                           res=res['machine'], rounds=rounds),
                 formats={**{1 + i: ".1f" for i in range(k)}, 1 + k: ".0f", 2 + k: ".0f"})
