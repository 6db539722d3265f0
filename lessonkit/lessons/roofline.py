"""How fast can the kernel go (lesson 09): the numbered versions of the registry (native/fa_variants.h,
``lessonkit.variants``) against the memory floor, bytes per token over the read bandwidth, and on a roofline
(``ops_per_token``, ``intensity`` and the roofs saved with the figures: the N1 model's cycles for the fewest
instructions of a token, numpy's sgemm rate). ``steps`` judges each idea against the version before it, here
(``compare``'s verdict on the saved rounds) and by llvm-mca's ESTIMATE for the Cortex-A76 (its error: MCA_ERROR)."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..core import env, native, timing
from ..core import validate as check
from ..core.cache import KVCacheQ8, attention_args, attention_call
from ..core.compare import MARGIN, MIN_ROUNDS, Verdict, load_average, verdict
from ..core.language import _
from ..display.table import Table
from ..core.variants import BY_NAME, VARIANTS  # noqa: F401  (lesson 09 calls it here)
from ..core.variants import adds_text as what_it_adds  # noqa: F401  (lesson 09 calls it here)

HEAD_DIM = 128
# the board's all-core sequential DRAM bandwidth, a cited range (docs/references.md, "All-core memory
# bandwidth of an RK3588 board"); its single-thread figure is BOARD_GBPS
BOARD_ALLCORE_GBPS = (17.0, 22.0)
# Cited single-thread memcpy bandwidth of an RK3588 board (docs/references.md, "Memory bandwidth"):
# a parameter, not a measurement; on a board measure it with lessonkit.bench.read_bandwidth_gbps().
BOARD_GBPS = 10.8
CLOCK_GHZ = {"neoverse-n1": 2.4, "cortex-a55": 1.8}  # RK3588: A76 up to 2.4 GHz, A55 up to 1.8 GHz
RTOL = 1e-5  # of max|scalar out|: the versions only reorder float32 sums and fuse multiply-adds
# (seq_len, n_kv_heads, head_dim, block_size, kv_head): one token, a tile and a bit, odd blocks, hd 32..256
SHAPES = ((1, 1, 32, 1, 0), (15, 2, 64, 16, 1), (17, 1, 128, 4, 0), (100, 3, 96, 7, 2),
          (333, 8, 128, 64, 5), (40, 1, 256, 64, 0), (1000, 2, 128, 3, 1))
# llvm-mca's accuracy: the average error of basic-block throughput models (llvm-mca among them) against
# measurements lies between 9 % and 36 % (Chen et al., BHive, IISWC 2019, as summarized by Abel and
# Reineke, uiCA, ICS 2022, arXiv:2107.14210; x86 cores: no such study of LLVM's Neoverse N1 model was
# found); lesson 09 puts the top of that range beside every verdict that rests on an estimate
MCA_ERROR = (0.09, 0.36)
MCA_STEP = 0.01  # llvm-mca is deterministic: a change under 1 % between two estimates is rounding of its cycles
# versions that depart from the article's fp32 weights, so not within RTOL of the scalar kernel: lowp's
# 14-bit codes of the weights are off by up to 0.51 of a step each (lessonkit.smoke.lowp_bound derives
# the bound every new build is checked against; native/tests/test_kernel.c the 0.51)
BOUNDED = ("lowp",)
SAVED_BY = "make figures"  # the command that measures the saved figures again (python -m workbench figures)
IN_CACHE = 8192  # lesson 09 judges each idea here at 8K tokens (2.1 MiB of KV) and at the longest length
X86_MNEMONICS = ("vpdpbusd", "vpmaddwd", "vcvtdq2ps", "vpaddd", "prefetcht0")  # dots (VNNI, AVX2), cvt, add, prefetch


def ops_per_token(head_dim: int = HEAD_DIM, heads: int = 1) -> int:
    """The useful arithmetic of one token for ``heads`` query heads: K.q is head_dim multiply-adds and the
    V sum head_dim more, 2 operations each (exp, scales and conversions are not counted: overhead)."""
    return 4 * head_dim * heads


def intensity(head_dim: int = HEAD_DIM, heads: int = 1) -> float:
    """Arithmetic intensity, operations per byte read: the heads share one kv head's bytes."""
    return ops_per_token(head_dim, heads) / bytes_per_token(head_dim)


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
    """The article's kernel, each version that builds on the one before it, then "fast", then the
    versions that leave the article's fp32 weights (``BOUNDED``: lowp), the last rung."""
    steps = [v.name for v in VARIANTS if v.adds.startswith("on v")]
    return (["neon"] + [n for n in steps if n not in BOUNDED] + (["fast"] if "fast" in BY_NAME else [])
            + [n for n in steps if n in BOUNDED])


def run_variant(name: str, q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float | None = None) -> np.ndarray:
    """One call of registry version ``name`` through the library's table (fa_time_calls(version, 1, ...))."""
    check.one_of("name", name, BY_NAME)
    q, kv_head, scale = attention_args(q, cache, kv_head, scale)
    ffi, lib = native.load()
    out = np.full(cache.head_dim, np.nan, np.float32)  # a version that writes nothing fails the check
    lib.fa_time_calls(BY_NAME[name].version, 1, ffi.from_buffer("float[]", out, require_writable=True),
                      ffi.from_buffer("float[]", q), *cache.kernel_args(kv_head, ffi, lib), cache.head_dim, scale)
    return out


def bounded_extra(cache: KVCacheQ8, kv_head: int, q: np.ndarray, scale: float | None = None) -> np.ndarray:
    """float64 ``[head_dim]``: how far lowp's output may be from the exact kernels' per value (smoke.lowp_bound)."""
    from ..core.smoke import lowp_bound
    kv_head, scale = attention_call(cache, kv_head, scale)
    codes = cache.k_codes(kv_head), cache.v_codes(kv_head)
    # the one kv head as lessonkit.smoke's Cache presents it, its kv head 0
    head = SimpleNamespace(T=cache.seq_len, k_scale=cache.k_scales(kv_head)[:, None],
                           v_scale=cache.v_scales(kv_head)[:, None], codes=lambda unused_kh: codes)
    return lowp_bound(head, 0, np.asarray(q, np.float32), scale)


def check_variants(names=None, shapes=SHAPES, rtol: float = RTOL) -> tuple[int, list[str]]:
    """Each version of ``names`` (default ``path()``) on each shape against the scalar C kernel,
    ``|out - scalar| <= rtol * max|scalar|``, plus for a version of ``BOUNDED`` (lowp) its derived bound
    per value (``bounded_extra``): (checks passed, failure messages)."""
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
        extra = bounded_extra(cache, kh, q) if any(n in BOUNDED for n in names) else None
        for name in names:
            out = run_variant(name, q, cache, kh)
            gap = np.abs(out - ref) - (extra if name in BOUNDED else 0.0)
            err = float(gap.max()) if np.isfinite(out).all() else math.inf
            if err <= tol:
                passed += 1
            else:
                failures.append(_("{name} at seq_len {T}, {nkv} kv heads, hd {hd}, blocks of {bs}: max error "
                                  "{err:.3g} > {tol:.3g}").format(
                                  name=name, T=T, nkv=nkv, hd=hd, bs=bs, err=err, tol=tol))
    return passed, failures


def measure(lengths=(8192,), names=None, rounds: int = 5) -> dict:
    """ns/token of each version at each length (one kv head of head_dim 128), the minimum of ``rounds`` interleaved
    rounds, and each round's (``samples[T][name]``, in round order: ``steps`` pairs them); the load average before
    and after, the cores; the single-thread read bandwidth (highest of the probes) and the largest CPU cache."""
    from . import bench
    names = path() if names is None else list(names)
    res = dict(machine=env.machine_label(), head_dim=HEAD_DIM, bytes_per_token=bytes_per_token(),
               read_gbps=bench.read_bandwidth_gbps(), cache_bytes=env.last_level_bytes(), rounds=rounds,
               rows={}, samples={}, load=[load_average()], cores=os.cpu_count() or 1, extra={}, skipped={})
    for T in bench.lengths("lengths", list(lengths)):
        cache, kh, q = bench.make_inputs(T)[:3]
        number = max(1, 65536 // T)
        got = timing._rounds(timing.kernel_contenders(names, q, cache, kh, number), rounds)
        res["samples"][T] = {n: [ns / T for ns in s] for n, s in got.items()}
        res["rows"][T] = {n: min(s) for n, s in res["samples"][T].items()}
        res["read_gbps"] = max(res["read_gbps"], bench.read_bandwidth_gbps())
    res["load"].append(load_average())
    return res


def results(saved: Path | str) -> tuple[dict, str]:
    """(the figures saved in ``saved``, where they come from): lesson 09 passes the absolute path under
    notebooks/data/, which both editions share; ``make figures`` measures them again on this machine."""
    saved = Path(saved)
    if not saved.is_file():
        raise RuntimeError(_("no saved results in {name}: {command} measures them").format(
                             name=saved.name, command=SAVED_BY))
    res = json.loads(saved.read_text())
    for key in ("rows", "samples"):
        if key in res:
            res[key] = {int(k): v for k, v in res[key].items()}
    # the machine label was saved in English (env.machine_label); its words follow the language
    res["machine"] = res.get("machine", "").replace("kernel backend ", _("kernel backend "))
    return res, _("saved in {name} ({command} measures them on your machine)").format(name=saved.name, command=SAVED_BY)


def table(res: dict) -> Table:
    """One row per version: ns/token at each length, the A76 estimate and its instruction mix."""
    lengths = sorted(res["rows"])
    rounds = _(", fastest of {res} interleaved rounds").format(res=res["rounds"]) if res.get("rounds") else ""
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
    return Table(rows, header=[_("version"), *(f"{T // 1024}K" for T in lengths), _("A76 est."), _("instr."),
                               _("mix per token (loads/simd/scalar)")],
                 caption=_("ns/token on {res}{rounds} (x86: the NEON source through SIMDe, its dot products, V sums, "
                           "lane sums and expf in hand-written x86 code, native/q8_simd_x86.h and q8_simd.h; not NEON); A76 "
                           "est.: llvm-mca ESTIMATE, Neoverse N1 model, cycles/token").format(
                           res=res['machine'], rounds=rounds),
                 formats={**{1 + i: ".1f" for i in range(k)}, 1 + k: ".0f", 2 + k: ".0f"})


def lengths_here(res: dict) -> tuple[int, int | None]:
    """(IN_CACHE if its KV cache fits in the CPU's largest cache, else the shortest length; the longest
    length whose KV cache does not fit, None if every one fits): the two cases lesson 09 judges each idea
    at, the loop fed from the CPU's cache and the loop reading DRAM."""
    lengths, cap = sorted(res["rows"]), res.get("cache_bytes")
    fits = [T for T in lengths if cap and T * res["bytes_per_token"] <= cap]
    dram = [T for T in lengths if T not in fits]
    return (IN_CACHE if IN_CACHE in fits else lengths[0]), (dram[-1] if dram else None)


def change_verdict(change: float, margin: float) -> str:
    """"faster" or "slower" when the relative change is beyond ``margin``, else "no clear change"."""
    if change < -margin:
        return _("faster")
    if change > margin:
        return _("slower")
    return _("no clear change")


def step_verdict(res: dict, T: int, before: str, now: str) -> Verdict | None:
    """``now`` against ``before`` at ``T`` tokens by ``compare``'s protocol on the saved rounds, paired (``v.ratio``:
    before's time / now's; ``v.outcome`` "a": now faster); None where the file has under MIN_ROUNDS rounds of them."""
    s = res.get("samples", {}).get(T, {})
    if len(s.get(now, ())) < MIN_ROUNDS or len(s.get(before, ())) != len(s[now]):
        return None
    return verdict({now: s[now], before: s[before]}, res.get("load") or (None,), res.get("cores") or 1)


def steps(res: dict) -> list[dict]:
    """Each idea of path() (not "fast") against the version before it: ``step_verdict`` at the two lengths_here, the
    A76 estimate's relative change with its verdict, and whether the in-cache verdict and the estimate's point the
    same way ("agree", absent when either has no direction; in cache, as llvm-mca counts every load an L1 hit)."""
    est = {n: e for n, e in res.get("a76", {}).items() if isinstance(e, dict)}
    names = [n for n in path() if n != "fast" and n in res["rows"][min(res["rows"])]]
    out = []
    for before, now in zip(names, names[1:]):
        row = {"name": now, "before": before}
        for key, T in zip(("cache", "dram"), lengths_here(res)):
            if T is not None:
                row[key] = step_verdict(res, T, before, now)
        if now in est and before in est:
            c = est[now]["cycles_per_token"] / est[before]["cycles_per_token"] - 1
            row["a76"] = (c, change_verdict(c, MCA_STEP), abs(c) < MCA_ERROR[1])
            row["bottleneck"] = est[now]["bottleneck"]
        here = {"a": _("faster"), "b": _("slower")}.get(getattr(row.get("cache"), "outcome", None))
        if here and "a76" in row and row["a76"][1] != _("no clear change"):
            row["agree"] = here == row["a76"][1]
        out.append(row)
    return out


def _bottleneck(text: str | None) -> str:
    """workbench/a76.py's bottleneck ("Resource Pressure N1UnitV1 (pressure 42% of cycles)") in the lesson's words."""
    m = re.match(r"^(Resource Pressure|Data Dependencies) ?(.*?) \(pressure (\d+)% of cycles\)$", text or "")
    if not m:
        return text or "-"
    what = m.group(2) if m.group(1) == "Resource Pressure" and m.group(2) else _("data dependencies")
    return _("{what} ({pct} % of cycles with backend pressure)").format(what=what, pct=m.group(3))


def steps_table(res: dict) -> Table:
    """steps() as a table: here each verdict, its median ratio and band; the estimate's change in percent."""
    Tc, Td = lengths_here(res)

    def here(v):
        if v is None or v.busy:
            return "-" if v is None else _("cannot tell (the machine was busy)")
        word = {"a": _("faster"), "b": _("slower")}.get(v.outcome, _("cannot tell"))
        return _("{verdict}: {x:.2f} ({lo:.2f}-{hi:.2f})").format(verdict=word, x=v.ratio, lo=v.band[0], hi=v.band[1])

    def a76(v):
        if not v:
            return "-"
        text = f"{100 * v[0]:+.0f} % {v[1]}"
        return _("{text} (within the model's error)").format(text=text) if v[2] else text
    head = [_("version"), _("on"), _("here at {k}K (in cache)").format(k=Tc // 1024)]
    if Td:
        head.append(_("here at {k}K (DRAM)").format(k=Td // 1024))
    head += [_("A76 estimate"), _("same direction at {k}K here and in the estimate").format(k=Tc // 1024),
             _("what bounds it in the model")]
    agree = {True: _("yes"), False: _("no")}
    rows = [[r["name"], r["before"], here(r.get("cache")), *([here(r.get("dram"))] if Td else []), a76(r.get("a76")),
             agree.get(r.get("agree"), "-"), _bottleneck(r.get("bottleneck"))] for r in steps(res)]
    rounds = len(next(iter(res.get("samples", {}).get(Tc, {}).values()), ()))
    how = (_("the version before's time / this version's, median of {n} rounds' ratios (its 95 % band): faster or "
             "slower when the whole band is beyond {margin:.0%}, else cannot tell").format(n=rounds, margin=MARGIN)
           if rounds >= MIN_ROUNDS else _("no rounds saved to judge by: {command} saves them").format(command=SAVED_BY))
    return Table(rows, header=head,
                 caption=_("each version against the one before; here: {machine}, {how}; A76: change of the llvm-mca "
                           "ESTIMATE (Neoverse N1 model), whose average error is {lo:.0f}-{hi:.0f} %").format(
                           machine=res["machine"], how=how, lo=100 * MCA_ERROR[0], hi=100 * MCA_ERROR[1]))


def instruction_counts(library: Path | str, names=None, mnemonics=X86_MNEMONICS) -> dict[str, dict[str, int]] | None:
    """{version: {mnemonic: how often it appears in the version's compiled code}} from ``objdump -d`` of
    ``library``; a static count (each written instruction once, not per token), over the function and the
    parts GCC splits off it (``name.part.0``, ``name.constprop.0``); None without objdump."""
    if shutil.which("objdump") is None:
        return None
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True,
                          check=True, timeout=120).stdout
    per_symbol, jumps, current = {}, {}, None
    for line in text.splitlines():
        if m := re.match(r"^[0-9a-f]+ <([^>]+)>:$", line):
            current = m.group(1)
            per_symbol.setdefault(current, {})
        elif current is not None and len(f := line.split("\t")) >= 2 and f[1].split():
            op = f[1].split()[0]
            per_symbol[current][op] = per_symbol[current].get(op, 0) + 1
            if op == "jmp" and (t := re.search(r"<([^>+@]+)(@plt)?>$", line)) and t.group(1) != current:
                jumps.setdefault(current, set()).add(t.group(1))  # a tail call: fast's jump into v8's code

    def counts(fn):  # over the function, the parts GCC split off it, and what they jump into, each once
        todo, seen = [s for s in per_symbol if s == fn or s.startswith(fn + ".")], set()
        while todo:
            s = todo.pop()
            if s not in seen:
                seen.add(s)
                todo += [t for t in jumps.get(s, ()) if t in per_symbol]
        return {m: sum(per_symbol[s].get(m, 0) for s in seen) for m in mnemonics}
    return {n: counts(BY_NAME[n].function) for n in (path() if names is None else names)}
