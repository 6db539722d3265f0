"""llvm-mca ESTIMATES of each kernel variant's cycles per token on the board's cores (no ARM board
here, and qemu-user timings mean nothing): how they are made is HEADER, which ``main`` prints.

    estimates = estimate(cpu="neoverse-n1", dotprod=True)   # one Estimate per variant
    python -m workbench a76 [--quick]                    # the table (make bench-a76)
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from lessonkit.core import native
from lessonkit.core import variants as registry
from lessonkit.core.language import _
from lessonkit.core.toolchain import AARCH64_CC as CC
from lessonkit.core.toolchain import aarch64_flags
from lessonkit.core.variants import Variant
from lessonkit.display.table import Table
from lessonkit.lessons.roofline import BOARD_GBPS, CLOCK_GHZ  # the board's figures, which lesson 09 cites

MCA, MC, QEMU = "llvm-mca-19", "llvm-mc-19", "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"
TOOLS = (MCA, MC, CC, QEMU)
INSTALL = "apt install llvm-19 gcc-aarch64-linux-gnu qemu-user"
FAST_TARGET_N1 = 80  # cycles per token the fast version aims at on the N1 model, hd 128 (make bench-a76)
CPUS = ("neoverse-n1", "cortex-a55")
CPU_LABEL = {"neoverse-n1": "N1 (for A76)", "cortex-a55": "A55"}
HD, KV_BS, GROUP_G = 128, 64, 4  # GROUP_G: query heads per call of the grouped kernel
# Traced lengths, multiples of 16. A tiled kernel's first tile differs (its first token sets the max),
# so 80 tokens leave 4 identical tiles of 16, enough for periodic_runs (3); LONG_TOKENS if none is found.
TOKENS = (80, 144)
LONG_TOKENS = (272, 528)
MIN_COVERAGE = 0.5   # the share of the trace at TOKENS[1] the token loops cover, or LONG_TOKENS are traced
ITERATIONS = 300     # llvm-mca iterations of the block: enough for its steady state
QUICK_ITERATIONS = 20
# not in the registry (its signature has G): estimated after it; its cycles serve all GROUP_G heads
GROUP = (-1, f"group{GROUP_G}", "flash_attn_group_q8_neon",
         f"beyond the article: {GROUP_G} query heads per scan of one kv head (cycles per token for all {GROUP_G})")
GROUP_LOWP = (-1, f"group{GROUP_G}_lowp", "flash_attn_group_q8_lowp",
              f"the grouped scan with lowp's accumulation (cycles per token for all {GROUP_G})")
GROUPED = {GROUP[2], GROUP_LOWP[2]}  # functions with the extra argument G
# cycles per token lowp aims at on the N1 model, hd 128, dotprod (make bench-a76): the A76's memory budget,
# 264 bytes per token at the board's cited single-thread bandwidth and clock (24.4 ns, 59 cycles at 2.4 GHz),
# so that on the board the scan waits for memory, not for the core
LOWP_TARGET_N1 = math.ceil((2 * HD + 8) / BOARD_GBPS * CLOCK_GHZ["neoverse-n1"])


class ToolMissing(RuntimeError):
    """An external tool this module needs (llvm-mca-19, the cross compiler, qemu) is missing."""


@dataclasses.dataclass
class Estimate:
    """llvm-mca's estimate for one variant on one CPU model (an estimate, not a measurement)."""
    variant: str
    cpu: str
    dotprod: bool
    cycles_per_token: float
    bottleneck: str
    mix: dict          # instructions per token: loads, stores, simd, scalar, branches, total
    tokens_per_period: list
    bytes_per_token: int
    cycles_per_period: list = dataclasses.field(default_factory=list)  # llvm-mca's, one per token loop

    def how(self) -> str:
        """Each token loop's cycles per period over its tokens per period."""
        return " + ".join(f"{c:.0f} cyc/period / {p:g} tok" for c, p in zip(self.cycles_per_period,
                                                                             self.tokens_per_period))

    def ns_at_ghz(self, ghz: float | None = None) -> float:
        """ns per token at ``ghz`` (default: the board's clock of this core)."""
        return self.cycles_per_token / (ghz or CLOCK_GHZ[self.cpu])


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def variants(native_dir: Path | None = None, group: bool = True) -> list[Variant]:
    """The registry native/fa_variants.h of ``native_dir``, then the grouped kernel if native/ has it."""
    src = Path(native_dir or native.NATIVE_DIR)
    found = list(registry.parse((src / "fa_variants.h").read_text()))
    for g in (GROUP, GROUP_LOWP) if group else ():
        if any(g[2] in c.read_text() for c in src.glob("*.c")):
            found.append(Variant(*g))
    return found


_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "flash_attn_q8.h"
%(protos)s
int main(int argc, char **argv)
{
    if (argc != 3) return 2;
    int which = atoi(argv[1]), T = atoi(argv[2]), hd = %(hd)d, bs = %(bs)d, G = %(g)d;
    int nblk = (T + bs - 1) / bs;
    int8_t **K = malloc(sizeof *K * nblk), **V = malloc(sizeof *V * nblk);
    for (int b = 0; b < nblk; b++) {
        K[b] = aligned_alloc(64, (size_t)bs * hd); V[b] = aligned_alloc(64, (size_t)bs * hd);
        for (int i = 0; i < bs * hd; i++) { K[b][i] = (int8_t)(20 + i %% 7); V[b][i] = (int8_t)(i %% 11 - 5); }
    }
    float *q = malloc(sizeof *q * hd * G), *out = malloc(sizeof *out * hd * G);
    float *ks = malloc(sizeof *ks * T), *vs = malloc(sizeof *vs * T);
    for (int i = 0; i < hd * G; i++) q[i] = 0.5f + (float)(i %% 5) * 0.1f;
    /* K rows alike, K scales falling: every score is below the one before, so the common path
       (no new maximum, no rescale) runs for every token after the first */
    for (int t = 0; t < T; t++) { ks[t] = 1.0f / (1.0f + t); vs[t] = 1.0f; }
    switch (which) {
%(cases)s
    default: return 3;
    }
    printf("%%f\n", out[0]);
    return 0;
}
"""


def _driver_source(vs: list[Variant]) -> str:
    protos, cases = set(), []
    for i, v in enumerate(vs):
        group = v.function in GROUPED
        cases.append(f"    case {i}: {v.function}(out, q, K, V, ks, vs, T, hd, bs, 1, 0, hd, 0.088f{', G' * group});"
                     " break;")
        if not group:
            protos.add(f"void {v.function}(float *restrict, const float *restrict, int8_t *const *, "
                       "int8_t *const *, const float *restrict, const float *restrict, int, int, int, "
                       "int, int, int, float);")
    return _DRIVER % {"protos": "\n".join(sorted(protos)), "cases": "\n".join(cases),
                      "hd": HD, "bs": KV_BS, "g": GROUP_G}


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}")
    return r


def build(work: Path, vs: list[Variant], dotprod: bool, native_dir: Path | None = None) -> Path:
    """native/*.c -> assembly (-S) -> an aarch64 executable with the driver; returns its path."""
    src = Path(native_dir or native.NATIVE_DIR)
    objs = []
    for c in sorted(src.glob("*.c")):
        objs.append(work / (c.stem + ".s"))
        _run([CC, *aarch64_flags(dotprod), f"-I{src}", "-S", str(c), "-o", str(objs[-1])])
    drv = work / "cycles_driver.c"
    drv.write_text(_driver_source(vs))
    exe = work / f"driver_{'dotprod' if dotprod else 'armv8a'}"
    _run([CC, "-O1", "-march=armv8-a", f"-I{src}", str(drv), *map(str, objs), "-lm", "-o", str(exe)])
    return exe


_INSN = re.compile(r"^0x([0-9a-f]+):\s+([0-9a-f]{8})\s")
_EXEC = re.compile(r"^Trace \d+: 0x[0-9a-f]+ \[[0-9a-f]+/([0-9a-f]+)/")


def read_trace(log: str) -> tuple[list[int], dict[int, list[tuple[int, int]]], dict[int, str]]:
    """qemu's ``-d in_asm,exec,nochain`` log -> (start pc of every executed block in order,
    {start pc: [(pc, instruction word)]}, {start pc: the symbol qemu named, "" outside the program})."""
    blocks, names, order, cur, name = {}, {}, [], None, ""
    for line in log.splitlines():
        if line.startswith("IN:"):
            cur, name = [], line[3:].strip()
        elif (m := _INSN.match(line)) and cur is not None:
            cur.append((int(m.group(1), 16), int(m.group(2), 16)))
            if len(cur) == 1:
                blocks.setdefault(cur[0][0], cur)
                names.setdefault(cur[0][0], name)
        elif m := _EXEC.match(line):
            cur = None
            order.append(int(m.group(1), 16))
    return order, blocks, names


def aliases(exe: Path, function: str) -> set[str]:
    """``function`` and every other function symbol of ``exe`` at its address (nm's table)."""
    out = _run([CC.replace("gcc", "nm"), str(exe)])
    addr = {f[2]: f[0] for f in map(str.split, out.stdout.splitlines()) if len(f) == 3 and f[1] in "Tt"}
    return {function} | {name for name, a in addr.items() if function in addr and a == addr[function]}


def trace(exe: Path, which: int, tokens: int, function: str) -> tuple[list[int], dict]:
    """The blocks executed from the first entry into ``function`` (what it calls, such as expf,
    included) until the driver's main runs again, and their instruction words."""
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "qemu.log"
        _run([QEMU, "-L", SYSROOT, "-d", "in_asm,exec,nochain", "-D", str(log), str(exe), str(which), str(tokens)])
        order, blocks, names = read_trace(log.read_text(errors="replace"))
    # GCC folds identical functions (-fipa-icf): a variant whose steps equal another's (v9 and fast on
    # aarch64) is another name of the same address, or one branch into the other's code, named after it
    same = aliases(exe, function)
    inside = [i for i, pc in enumerate(order) if names.get(pc) in same]
    if not inside:
        raise RuntimeError(f"the trace never entered {function}")
    end = next((i for i in range(inside[0] + 1, len(order)) if names.get(order[i]) == "main"), inside[-1] + 1)
    return order[inside[0]:max(end, inside[-1] + 1)], blocks


# Runs periodic_runs takes, largest first: a kernel's token loops at the short length are among its
# first eight (a two-pass kernel has three, beside the block loops and memset's short runs; with five,
# the 20-period exp loop of two_pass_scores_fast at 80 tokens was left out)
MAX_RUNS = 8


def periodic_runs(seq: list[int], min_repeats: int = 3, max_period: int = 6000) -> list[tuple[int, int, int]]:
    """Non-overlapping maximal stretches of ``seq`` repeating one period, (start, period, repeats),
    largest coverage first; a loop nested in another is covered by the outer one."""
    a = np.asarray(seq, dtype=np.int64)
    taken = np.zeros(len(a), dtype=bool)
    runs = []
    while len(runs) < MAX_RUNS:
        best = None
        for p in range(1, min(max_period, len(a) // min_repeats) + 1):
            eq = (a[:-p] == a[p:]) & ~taken[:-p] & ~taken[p:]
            if not eq.any():
                continue
            d = np.diff(np.concatenate(([0], eq.view(np.int8), [0])))  # the longest run of True
            starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
            k = int(np.argmax(ends - starts))
            reps = int(ends[k] - starts[k]) // p + 1
            if reps >= min_repeats and (best is None or reps * p > best[1] * best[2]):
                best = (int(starts[k]), p, reps)
        if best is None:
            break
        s, p, r = best
        # the largest coverage may be k periods at a time: the smallest divisor of p that repeats
        span = a[s:s + p * r]
        d = next((d for d in range(1, p) if p % d == 0 and np.array_equal(span[d:], span[:-d])), p)
        p, r = d, r * (p // d)
        taken[s:s + p * r] = True
        runs.append((s, p, r))
    return runs


def token_loops(exe: Path, which: int, function: str, tokens=TOKENS) -> list[dict]:
    """The token loops of variant ``which``: one period's instruction words and the tokens a period
    handles, from traces at two sequence lengths (at LONG_TOKENS too when TOKENS finds none)."""
    t1, t2 = tokens
    seq1, blocks = trace(exe, which, t1, function)
    seq2, blocks2 = trace(exe, which, t2, function)
    blocks.update(blocks2)

    def key(seq, run):  # a rotation-free name of a run's period: its sorted block addresses
        return tuple(sorted(seq[run[0]:run[0] + run[1]]))

    runs1 = {key(seq1, r): r for r in periodic_runs(seq1)}
    loops, covered = [], 0
    for s, p, reps in periodic_runs(seq2):
        r1 = runs1.get(key(seq2, (s, p)))
        if r1 is None or reps == r1[2]:
            continue  # not a loop over the tokens: it repeats as often at both lengths
        pairs = [pw for pc in seq2[s:s + p] for pw in blocks[pc]]
        loops.append({"tokens_per_period": (t2 - t1) / (reps - r1[2]), "words": [w for unused, w in pairs],
                      "pcs": [pc for pc, unused in pairs]})
        covered += p * reps
    # A kernel whose tiles differ once per block of KV_BS tokens (a step into the next block taken by a
    # branch) repeats only every KV_BS tokens: too few periods at TOKENS, where what repeats is some
    # short inner loop that covers a sliver of the trace. The token loops cover most of it.
    if tokens == TOKENS and covered < MIN_COVERAGE * len(seq2):
        return token_loops(exe, which, function, LONG_TOKENS)
    if not loops:
        if tokens == TOKENS:
            return token_loops(exe, which, function, LONG_TOKENS)
        raise RuntimeError(f"found no token loop in the trace of variant {which} (lengths {tokens})")
    return loops


def disassemble(words: list[int], dotprod: bool) -> list[str]:
    """Instruction words -> LLVM assembly (llvm-mc), calls given as plain branches."""
    text = "\n".join(" ".join(f"0x{(w >> (8 * i)) & 0xff:02x}" for i in range(4)) for w in words)
    out = _run([MC, "--disassemble", "-triple=aarch64", f"-mattr={'+dotprod' if dotprod else '-dotprod'}"],
               input=text).stdout
    ins = [l.strip() for l in out.splitlines() if l.strip() and not l.strip().startswith(".")]
    if len(ins) != len(words):
        raise RuntimeError(f"llvm-mc decoded {len(ins)} of {len(words)} instructions")
    return [re.sub(r"^bl\t", "b\t", re.sub(r"^blr\t", "br\t", i)) for i in ins]


_MIX_BRANCH = re.compile(r"^(b|b\.\w+|bl|blr|br|ret|cbn?z|tbn?z)$")


def instruction_mix(ins: list[str]) -> dict:
    mix = dict(loads=0, stores=0, simd=0, scalar=0, branches=0, total=len(ins))
    for i in ins:
        op, unused, args = i.partition("\t")
        kind = ("branches" if _MIX_BRANCH.match(op) else "loads" if op.startswith(("ld", "prfm"))
                else "stores" if op.startswith("st") else "simd" if re.search(r"\b[vqdshb]\d+\b", args) else "scalar")
        mix[kind] += 1
    return mix


def parse_mca(text: str) -> dict:
    """llvm-mca's summary (-bottleneck-analysis): iterations, instructions, total cycles, IPC and the
    bottleneck it names (the largest Resource Pressure / Data Dependencies line)."""
    def num(label):
        m = re.search(rf"^{label}:\s+([\d.]+)", text, re.M)
        if not m:
            raise ValueError(f"llvm-mca output has no '{label}:' line")
        return float(m.group(1))
    out = {"iterations": int(num("Iterations")), "instructions": int(num("Instructions")),
           "total_cycles": int(num("Total Cycles")), "ipc": num("IPC"), "block_rthroughput": num("Block RThroughput")}
    out["cycles_per_iteration"] = out["total_cycles"] / out["iterations"]
    pressure = re.search(r"Cycles with backend pressure increase \[\s*([\d.]+)%", text)
    if pressure is None:
        out["bottleneck"] = ("none found" if "No resource or data dependency bottlenecks" in text
                             else "no bottleneck analysis for this model")
        return out
    items = re.findall(r"^\s*-?\s*([\w ]+?)\s*:?\s*\[\s*([\d.]+)%\s*\]",
                       text.split("Throughput Bottlenecks:")[1].split("Critical sequence")[0], re.M)
    top = {name.strip(): float(v) for name, v in items}
    kind = max(("Resource Pressure", "Data Dependencies"), key=lambda k: top.get(k, 0.0))
    units = [(n, v) for n, v in items if n.strip() not in ("Resource Pressure", "Data Dependencies")
             and ("Dependencies" in n) == (kind == "Data Dependencies")]
    detail = max(units, key=lambda u: float(u[1]))[0].strip() if units else ""
    out["bottleneck"] = f"{kind} {detail} (pressure {float(pressure.group(1)):.0f}% of cycles)".replace("  ", " ")
    return out


def mca(ins: list[str], cpu: str, iterations: int = ITERATIONS) -> dict:
    r = _run([MCA, "-mtriple=aarch64", f"-mcpu={cpu}", f"-iterations={iterations}", "-bottleneck-analysis"],
             input="\n".join(ins) + "\n")
    return parse_mca(r.stdout)


def estimate(variant: str | None = None, cpu: str = "neoverse-n1", dotprod: bool = True,
             iterations: int = ITERATIONS, native_dir: Path | None = None, tokens=TOKENS) -> list[Estimate]:
    """llvm-mca's estimated cycles per token of each variant (or the one named) on ``cpu``, hd 128."""
    if cpu not in CPUS:
        raise ValueError(_("cpu must be one of {CPUS}; got {cpu!r}").format(CPUS=CPUS, cpu=cpu))
    return estimate_all([cpu], [dotprod], variant, iterations, native_dir, tokens)


def estimate_all(cpus=CPUS, dotprods=(True, False), variant: str | None = None,
                 iterations: int = ITERATIONS, native_dir: Path | None = None, tokens=TOKENS) -> list[Estimate]:
    missing = missing_tools()
    if missing:
        raise ToolMissing(_("needs {missing} (Debian: {INSTALL})").format(
                            missing=', '.join(missing), INSTALL=INSTALL))
    vs = variants(native_dir)
    if variant is not None and variant not in [v.name for v in vs]:
        raise ValueError(_("unknown variant {variant!r}; known: {v_vs}").format(
                           variant=variant, v_vs=', '.join((v.name for v in vs))))
    results = []
    with tempfile.TemporaryDirectory() as d:
        for dotprod in dotprods:
            work = Path(d) / ("dp" if dotprod else "nodp")
            work.mkdir()
            exe = build(work, vs, dotprod, native_dir)
            for i, v in enumerate(vs):
                if variant is not None and v.name != variant:
                    continue
                blocks = [(lp["tokens_per_period"], disassemble(lp["words"], dotprod))
                          for lp in token_loops(exe, i, v.function, tokens)]
                mix = {}
                for per, ins in blocks:
                    for k, n in instruction_mix(ins).items():
                        mix[k] = mix.get(k, 0) + n / per
                for cpu in cpus:
                    reports = [(per, mca(ins, cpu, iterations)) for per, ins in blocks]
                    main = max(reports, key=lambda pr: pr[1]["cycles_per_iteration"] / pr[0])[1]
                    results.append(Estimate(v.name, cpu, dotprod, sum(r["cycles_per_iteration"] / per
                                                                      for per, r in reports),
                                            main["bottleneck"], {k: round(n, 2) for k, n in mix.items()},
                                            [per for per, unused in blocks], 2 * HD + 8,  # K, V rows and scales
                                            [r["cycles_per_iteration"] for unused, r in reports]))
    return results


HEADER = f"""\
llvm-mca ESTIMATES (a model, not a measurement; typically +-20-30 %), hd {HD}, per token.
Cortex-A76: LLVM has no A76 model (-mcpu=cortex-a76 falls back to the Cortex-A57 model), so the
  Neoverse N1 model stands in: the N1 is the A76's server sibling, the same microarchitecture
  (docs/references.md, "llvm-mca"). Cortex-A55: LLVM's in-order cortex-a55 model.
The token loop is one period of the kernel's qemu-aarch64 trace (-d in_asm,exec,nochain) of native/
  built with lessonkit.native's aarch64 flags; the driver's scores fall token by token, so the common
  path runs (no new max, no rescale). expf is glibc's own executed path, inlined (llvm-mca would charge
  a call 100 cycles: bl/blr are given to it as b/br).
cycles/token = llvm-mca's cycles for one period / the tokens one period handles (extra tokens /
  extra periods between two traced lengths): 1 token by token, the tile (16) for the tiled variants;
  a kernel with two token loops (two-pass) adds theirs (c / t + ...).
group4: the grouped kernel, one scan for 4 query heads: its cycles/token serve all 4 heads.
ns at 2.4 GHz (A76) / 1.8 GHz (A55)."""


def estimates_table(res: list[Estimate]) -> Table:
    """One row per estimate: cycles/token and how they were derived, ns at the board's clock, bottleneck,
    and the instruction mix per token."""
    return Table([(e.variant, CPU_LABEL[e.cpu], e.cycles_per_token, e.how(), e.ns_at_ghz(), e.bottleneck,
                   *(e.mix[k] for k in ("total", "loads", "stores", "simd", "scalar", "branches")),
                   " ".join(f"{t:g}" for t in e.tokens_per_period)) for e in res],
                 caption="llvm-mca ESTIMATES per token (a model, not measurements)",
                 header=["variant", "model", "cycles/token", "how", "ns at 2.4 GHz (A76) / 1.8 GHz (A55)", "bottleneck",
                         "instr./token", "loads", "stores", "simd/fp", "scalar", "branches", "tokens/period"],
                 formats={2: ".1f", 4: ".1f", **{i: ".0f" for i in range(6, 12)}})


def lowp_report(res: list[Estimate]) -> str:
    """lowp's lines of ``make bench-a76``: its target on the N1 model, and lowp and grouped lowp
    against fast and the exact grouped scan on both models (dotprod), as far as ``res`` has them."""
    by = {(e.variant, e.cpu): e.cycles_per_token for e in res if e.dotprod}
    lines = []
    got = by.get(("lowp", "neoverse-n1"))
    status = "n/a " if got is None else "met " if got <= LOWP_TARGET_N1 else "MISS"
    lines.append(f"target  {status}  lowp on the N1 model (for the A76), dotprod: "
                 f"{'-' if got is None else f'{got:.1f}'} cycles/token (target <= {LOWP_TARGET_N1}; an estimate)"
                 + (" [not estimated in this run]" if got is None else ""))
    for cpu in CPUS:
        for mine, peer, what in (("lowp", "fast", "lowp vs fast"),
                                 (GROUP_LOWP[1], GROUP[1], f"grouped lowp vs grouped (G={GROUP_G}, all heads)")):
            a, b = by.get((mine, cpu)), by.get((peer, cpu))
            if a is not None:
                vs = f" against {b:.1f} ({b / a:.2f}x fewer)" if b else ""
                lines.append(f"        {CPU_LABEL[cpu]}: {what}: {a:.1f} cycles/token{vs} (estimates)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench a76 [--quick]``: llvm-mca's cycles per token of every variant."""
    p = argparse.ArgumentParser(prog="python -m workbench a76", description=main.__doc__)
    p.add_argument("--quick", action="store_true",
                   help="CI: one variant, dotprod only, few iterations; checks the tool works, not figures")
    p.add_argument("--gbps", type=float, default=BOARD_GBPS, help="board memory bandwidth for the budget")
    p.add_argument("--variant", default=None)
    args = p.parse_args(argv)
    if not args.gbps > 0:
        p.error("--gbps must be positive")
    missing = missing_tools()
    if missing:
        print(f"SKIPPED workbench a76: needs {', '.join(missing)} (Debian: {INSTALL})")
        return 0
    vs = variants()
    variant = args.variant or (("neon" if "neon" in [v.name for v in vs] else vs[0].name) if args.quick else None)
    ns = (2 * HD + 8) / args.gbps
    print(HEADER)
    print(f"memory budget: {2 * HD + 8} bytes/token / {args.gbps} GB/s = {ns:.1f} ns/token = {ns * 2.4:.0f} cycles "
          f"at 2.4 GHz, {ns * 1.8:.0f} at 1.8 GHz ({args.gbps} GB/s: cited single-thread memcpy of an RK3588 "
          "board, docs/references.md; --gbps to change)")
    try:
        res = estimate_all(CPUS, (True,) if args.quick else (True, False), variant,
                           QUICK_ITERATIONS if args.quick else ITERATIONS)
    except (RuntimeError, ValueError) as e:
        print(f"FAILED workbench a76: {e}", file=sys.stderr)
        return 1
    for dotprod in (True, False):
        if sel := [e for e in res if e.dotprod == dotprod]:
            print(f"\n-march={'armv8.2-a+dotprod' if dotprod else 'armv8-a (no sdot)'}")
            print(estimates_table(sel))
    fast = [e for e in res if e.variant == "fast" and e.cpu == "neoverse-n1" and e.dotprod]
    if fast:
        got = fast[0].cycles_per_token
        print(f"\ntarget  {'met ' if got <= FAST_TARGET_N1 else 'MISS'}  fast on the N1 model (for the A76), "
              f"dotprod: {got:.1f} cycles/token (target <= {FAST_TARGET_N1}; an estimate)")
    if any(e.variant in ("lowp", GROUP_LOWP[1]) for e in res):  # not in --quick, which estimates one variant
        print(lowp_report(res))
    if args.quick:
        if not all(e.cycles_per_token > 0 for e in res):
            print("FAILED workbench a76 --quick: no positive estimate", file=sys.stderr)
            return 1
        print("\n--quick: the tool works (few iterations: the figures are not the point)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
