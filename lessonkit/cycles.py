"""Estimated cycles per token of each kernel variant on the board's cores, with llvm-mca.

We have no ARM board here, and timings under qemu-user mean nothing, so this module asks LLVM's
machine-code analyzer (``llvm-mca-19``) how many cycles one token costs. These are ESTIMATES of a
model, not measurements (they are commonly off by 20-30 %):

- **Cortex-A76** (the RK3588's big cores): LLVM has no A76 scheduling model; ``-mcpu=cortex-a76``
  silently falls back to the Cortex-A57 model (docs/references.md, "llvm-mca"). The Neoverse N1
  model (``-mcpu=neoverse-n1``) stands in for it: the N1 is the A76's server sibling, the same
  core microarchitecture (docs/references.md).
- **Cortex-A55** (the little cores): LLVM's own in-order model (``-mcpu=cortex-a55``).

How one token's instructions are found (``trace_block``). The sources of native/ are compiled to
assembly (``-S``) with the flags lessonkit.native uses for aarch64 (``-O3``, ``-march=armv8.2-a+dotprod``
or ``-march=armv8-a``), assembled and linked with a small driver, and run once under qemu-user
with ``-d in_asm,exec,nochain``: qemu logs every executed translation block and its instruction
words. The kernel's token loop then shows up as a periodic stretch of that trace. The driver runs
each variant at two sequence lengths; a stretch whose repeat count grows with the sequence length
is a token loop (an inner loop over the head dimension repeats as often at both lengths), and

    tokens per period = (T2 - T1) / (repeats at T2 - repeats at T1)

so a loop over tiles of 16 tokens counts 16 tokens per period, and cycles per token = llvm-mca's
cycles per iteration of that period / tokens per period. A kernel with two token loops (the
two-pass variants) gets both, and their per-token cycles are added. The data make the common case
run: scores fall from token to token, so after the first token no new maximum is found and no
rescale runs (in random order new maxima are rare: about ln n of n tokens).

How ``expf`` is modelled: the trace follows the call into glibc's ``expf`` in libm.so.6 and back,
so the block holds the exact instructions of the path glibc took (its fast path), inlined where the
call stood, not a 100-cycle black box. llvm-mca charges any call instruction a fixed 100 cycles, so
each ``bl``/``blr`` of the block is given to it as the plain branch ``b``/``br`` to the same place
(one branch, as the call costs on the branch unit; its write of x30 is not modelled).

    estimates = estimate(cpu="neoverse-n1", dotprod=True)   # one Estimate per variant
    python -m lessonkit.cycles [--quick]                    # the table (make bench-a76)
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import native
from . import variants as registry
from .language import tr
from .variants import Variant

MCA = "llvm-mca-19"
MC = "llvm-mc-19"
CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"
TOOLS = (MCA, MC, CC, QEMU)
FAST_TARGET_N1 = 80  # cycles per token the fast version aims at on the N1 model, hd 128 (make bench-a76)
CPUS = ("neoverse-n1", "cortex-a55")
CPU_LABEL = {"neoverse-n1": "N1 (for A76)", "cortex-a55": "A55"}
CLOCK_GHZ = {"neoverse-n1": 2.4, "cortex-a55": 1.8}  # RK3588: A76 up to 2.4 GHz, A55 up to 1.8 GHz
# Cited single-thread memcpy bandwidth of an RK3588 board (docs/references.md, "Memory bandwidth"):
# a parameter, not a measurement; on a board measure it with lessonkit.bench.read_bandwidth_gbps().
BOARD_GBPS = 10.8
HD = 128
KV_BS = 64
GROUP_G = 4          # query heads per call of the grouped kernel
# The two sequence lengths of the trace, multiples of 16 so tiles divide them. A tiled kernel's
# first tile differs from the rest (its first token sets the maximum and rescales), so a tile loop
# shows only (T / tile - 1) identical periods: 80 tokens leave 4 tiles of 16 that repeat, enough
# for periodic_runs (3 at least). A kernel whose loop is still not found at these lengths (a
# bigger tile) is traced again at LONG_TOKENS.
TOKENS = (80, 144)
LONG_TOKENS = (272, 528)
ITERATIONS = 300     # llvm-mca iterations of the block: enough for its steady state
QUICK_ITERATIONS = 20

# Not in the registry (its signature has G): the grouped kernel, estimated after the registry's
# entries; its per-token cycles serve all GROUP_G query heads of the group.
GROUP = (-1, f"group{GROUP_G}", "flash_attn_group_q8_neon",
         f"beyond the article: {GROUP_G} query heads per scan of one kv head (cycles per token for all {GROUP_G})")


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
        """How the per-token figure was derived: each token loop's period cycles / its tokens."""
        parts = [f"{c:.0f} cyc/period / {p:g} tok" for c, p in zip(self.cycles_per_period, self.tokens_per_period)]
        return " + ".join(parts)

    def ns_at_ghz(self, ghz: float | None = None) -> float:
        """Nanoseconds per token at ``ghz`` (default: the board's clock of this core)."""
        return self.cycles_per_token / (ghz or CLOCK_GHZ[self.cpu])


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def variants(native_dir: Path | None = None, group: bool = True) -> list[Variant]:
    """The registry native/fa_variants.h of ``native_dir`` (read by lessonkit.variants' parser);
    then (``group``) the grouped kernel, when native/ has it."""
    src = Path(native_dir or native.NATIVE_DIR)
    found = list(registry.parse((src / "fa_variants.h").read_text()))
    if group and any(GROUP[2] in c.read_text() for c in src.glob("*.c")):
        found.append(Variant(*GROUP))
    return found


# ----------------------------------------------------------------------------- static asm loops

_COND = "eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le|al"
# b, b.cond and GNU's bcond (bne), cbz/cbnz, tbz/tbnz, to a local label
_BRANCH = re.compile(rf"^\s*(b(?:\.?(?:{_COND}))?|cbn?z|tbn?z)\s+(?:[^,]+,\s*)*(\.?L\w+)\s*$")


def asm_loops(asm: str, function: str) -> list[dict]:
    """The loops of ``function`` in GCC's assembly: every branch back to a label above it.
    Each loop: label, first and last line (indexes into the function's lines) and its instructions."""
    lines = asm.splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == f"{function}:")
    except StopIteration:
        raise ValueError(f"no function {function} in the assembly") from None
    end = next((i for i in range(start, len(lines)) if lines[i].strip().startswith(f".size\t{function},")
                or lines[i].strip().startswith(f".size {function},")), len(lines))
    body = lines[start:end]
    labels = {l.strip()[:-1]: i for i, l in enumerate(body) if re.fullmatch(r"\.?L\w+:", l.strip())}
    loops = []
    for i, l in enumerate(body):
        m = _BRANCH.match(l)
        if m and m.group(2) in labels and labels[m.group(2)] < i:
            first = labels[m.group(2)]
            ins = [x.strip() for x in body[first + 1:i + 1]
                   if x.strip() and not x.strip().startswith((".", "//")) and not x.strip().endswith(":")]
            loops.append({"label": m.group(2), "first": first, "last": i, "instructions": ins})
    return loops


# ----------------------------------------------------------------------------- the trace

_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "flash_attn_q8.h"
typedef void (*Kernel)(float *restrict, const float *restrict, int8_t *const *, int8_t *const *,
    const float *restrict, const float *restrict, int, int, int, int, int, int, float);
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
    protos, cases = [], []
    for i, v in enumerate(vs):
        if v.function == "flash_attn_group_q8_neon":
            cases.append(f"    case {i}: {v.function}(out, q, K, V, ks, vs, T, hd, bs, 1, 0, hd, 0.088f, G); break;")
        else:
            cases.append(f"    case {i}: {v.function}(out, q, K, V, ks, vs, T, hd, bs, 1, 0, hd, 0.088f); break;")
            protos.append(f"void {v.function}(float *restrict, const float *restrict, int8_t *const *, "
                          "int8_t *const *, const float *restrict, const float *restrict, int, int, int, "
                          "int, int, int, float);")
    return _DRIVER % {"protos": "\n".join(sorted(set(protos))), "cases": "\n".join(cases),
                      "hd": HD, "bs": KV_BS, "g": GROUP_G}


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}")
    return r


def aarch64_flags(dotprod: bool) -> list[str]:
    """lessonkit.native's -O3 flags for aarch64 (its compile_flags on an ARM machine), for -S."""
    return [*native.language_flags(), native.AARCH64_MARCH[dotprod]]


def build(work: Path, vs: list[Variant], dotprod: bool, native_dir: Path | None = None) -> Path:
    """native/*.c -> assembly (-S) -> an aarch64 executable with the driver; returns its path."""
    src = Path(native_dir or native.NATIVE_DIR)
    flags = aarch64_flags(dotprod)
    objs = []
    for c in sorted(src.glob("*.c")):
        s = work / (c.stem + ".s")
        _run([CC, *flags, f"-I{src}", "-S", str(c), "-o", str(s)])
        objs.append(s)
    drv = work / "cycles_driver.c"
    drv.write_text(_driver_source(vs))
    exe = work / f"driver_{'dotprod' if dotprod else 'armv8a'}"
    _run([CC, "-O1", "-march=armv8-a", f"-I{src}", str(drv), *map(str, objs), "-lm", "-o", str(exe)])
    return exe


_TB_HEAD = re.compile(r"^IN:")
_INSN = re.compile(r"^0x([0-9a-f]+):\s+([0-9a-f]{8})\s")
_EXEC = re.compile(r"^Trace \d+: 0x[0-9a-f]+ \[[0-9a-f]+/([0-9a-f]+)/")


def read_trace(log: str) -> tuple[list[int], dict[int, list[tuple[int, int]]], dict[int, str]]:
    """qemu's ``-d in_asm,exec,nochain`` log -> (start pc of every executed block, in order;
    {start pc: [(pc, instruction word), ...]}; {start pc: symbol qemu named, "" outside the program})."""
    blocks, names, order, cur = {}, {}, [], None
    name = ""
    for line in log.splitlines():
        if _TB_HEAD.match(line):
            cur, name = [], line[3:].strip()
            continue
        m = _INSN.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), int(m.group(2), 16)))
            if len(cur) == 1:
                blocks.setdefault(cur[0][0], cur)
                names.setdefault(cur[0][0], name)
            continue
        m = _EXEC.match(line)
        if m:
            cur = None
            order.append(int(m.group(1), 16))
    return order, blocks, names


def aliases(exe: Path, function: str) -> set[str]:
    """``function`` and every other function symbol of ``exe`` at the same address (nm's table)."""
    out = subprocess.run([CC.replace("gcc", "nm"), str(exe)], capture_output=True, text=True)
    table = [line.split() for line in out.stdout.splitlines()]
    addr = {f[2]: f[0] for f in table if len(f) == 3 and f[1] in "Tt"}
    return {function} | {name for name, a in addr.items() if function in addr and a == addr[function]}


def trace(exe: Path, which: int, tokens: int, function: str) -> tuple[list[int], dict]:
    """The blocks executed from the first entry into ``function`` to its last block (what it
    calls, such as expf, included), and their instruction words."""
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "qemu.log"
        _run([QEMU, "-L", SYSROOT, "-d", "in_asm,exec,nochain", "-D", str(log), str(exe), str(which), str(tokens)])
        order, blocks, names = read_trace(log.read_text(errors="replace"))
    # GCC folds identical functions (-fipa-icf): the folded one may be only another name of the
    # same address (fast and v9 on aarch64), and qemu names its blocks after either
    same = aliases(exe, function)
    inside = [i for i, pc in enumerate(order) if names.get(pc) in same]
    if not inside:
        raise RuntimeError(f"the trace never entered {function}")
    # The call ends where the driver's main runs again. Not at the last block named `function`:
    # GCC folds identical functions (-fipa-icf), so a variant whose steps equal another's (v9 and
    # fast on aarch64) is a single branch into the other's code, named after the other.
    end = next((i for i in range(inside[0] + 1, len(order)) if names.get(order[i]) == "main"), inside[-1] + 1)
    return order[inside[0]:max(end, inside[-1] + 1)], blocks


def periodic_runs(seq: list[int], min_repeats: int = 3, max_period: int = 6000) -> list[tuple[int, int, int]]:
    """Maximal stretches of ``seq`` that repeat one period: (start, period, repeats), largest
    coverage first, non-overlapping. A loop nested in another is covered by the outer one."""
    a = np.asarray(seq, dtype=np.int64)
    n = len(a)
    taken = np.zeros(n, dtype=bool)
    runs = []
    while True:
        best = None
        for p in range(1, min(max_period, n // min_repeats) + 1):
            eq = (a[:-p] == a[p:]) & ~taken[:-p] & ~taken[p:]
            if not eq.any():
                continue
            # longest run of True in eq
            d = np.diff(np.concatenate(([0], eq.view(np.int8), [0])))
            starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
            k = int(np.argmax(ends - starts))
            length = int(ends[k] - starts[k])
            reps = length // p + 1
            if reps >= min_repeats and (best is None or reps * p > best[1] * best[2]):
                best = (int(starts[k]), p, reps)
        if best is None:
            return runs
        s, p, r = best
        # the largest coverage may be a multiple of the loop's period (k periods at a time): the
        # smallest divisor of p that repeats over the same stretch is the period
        span = a[s:s + p * r]
        for d in range(1, p):
            if p % d == 0 and np.array_equal(span[d:], span[:-d]):
                p, r = d, r * (p // d)
                break
        best = (s, p, r)
        taken[s:s + p * r] = True
        runs.append(best)
        if len(runs) > 4:
            return runs


def _period_key(seq, run) -> tuple:
    """A rotation-free name of a run's period: its sorted block addresses."""
    s, p, _ = run
    return tuple(sorted(seq[s:s + p]))


def token_loops(exe: Path, which: int, function: str, tokens=TOKENS) -> list[dict]:
    """The token loops of variant ``which``: their blocks of instruction words (one period) and
    how many tokens a period handles, from traces at two sequence lengths."""
    (t1, t2) = tokens
    seq1, blocks = trace(exe, which, t1, function)
    seq2, blocks2 = trace(exe, which, t2, function)
    blocks.update(blocks2)
    runs1 = {_period_key(seq1, r): r for r in periodic_runs(seq1)}
    loops = []
    for r in periodic_runs(seq2):
        key = _period_key(seq2, r)
        if key not in runs1 or r[2] == runs1[key][2]:
            continue  # not a loop over the tokens: it repeats as often at both lengths
        per = (t2 - t1) / (r[2] - runs1[key][2])
        s, p, _ = r
        pairs = [pw for pc in seq2[s:s + p] for pw in blocks[pc]]
        loops.append({"tokens_per_period": per, "words": [w for _, w in pairs], "pcs": [pc for pc, _ in pairs]})
    if not loops:
        if tokens != LONG_TOKENS and tokens == TOKENS:
            return token_loops(exe, which, function, LONG_TOKENS)
        raise RuntimeError(f"found no token loop in the trace of variant {which} (lengths {tokens})")
    return loops


# ----------------------------------------------------------------------------- llvm-mca

def disassemble(words: list[int], dotprod: bool) -> list[str]:
    """Instruction words -> LLVM assembly (llvm-mc), with calls as plain branches (see the docstring)."""
    text = "\n".join(" ".join(f"0x{(w >> (8 * i)) & 0xff:02x}" for i in range(4)) for w in words)
    out = _run([MC, "--disassemble", "-triple=aarch64", f"-mattr={'+dotprod' if dotprod else '-dotprod'}"],
               input=text).stdout
    ins = [l.strip() for l in out.splitlines() if l.strip() and not l.strip().startswith(".")]
    if len(ins) != len(words):
        raise RuntimeError(f"llvm-mc decoded {len(ins)} of {len(words)} instructions")
    return [re.sub(r"^bl\t", "b\t", re.sub(r"^blr\t", "br\t", i)) for i in ins]


_MIX_BRANCH = re.compile(r"^(b|b\.\w+|bl|blr|br|ret|cbn?z|tbn?z)$")


def instruction_mix(ins: list[str]) -> dict:
    mix = dict(loads=0, stores=0, simd=0, scalar=0, branches=0)
    for i in ins:
        op, _, args = i.partition("\t")
        if _MIX_BRANCH.match(op):
            mix["branches"] += 1
        elif op.startswith("ld") or op.startswith("prfm"):
            mix["loads"] += 1
        elif op.startswith("st"):
            mix["stores"] += 1
        elif re.search(r"\b[vqdshb]\d+\b", args):
            mix["simd"] += 1  # SIMD and floating point registers
        else:
            mix["scalar"] += 1
    mix["total"] = len(ins)
    return mix


def parse_mca(text: str) -> dict:
    """llvm-mca's summary (-bottleneck-analysis): iterations, instructions, total cycles, IPC and
    the bottleneck it names (the largest Resource Pressure / Data Dependencies line)."""
    def num(label):
        m = re.search(rf"^{label}:\s+([\d.]+)", text, re.M)
        if not m:
            raise ValueError(f"llvm-mca output has no '{label}:' line")
        return float(m.group(1))
    out = {"iterations": int(num("Iterations")), "instructions": int(num("Instructions")),
           "total_cycles": int(num("Total Cycles")), "ipc": num("IPC"),
           "block_rthroughput": num("Block RThroughput")}
    out["cycles_per_iteration"] = out["total_cycles"] / out["iterations"]
    pressure = re.search(r"Cycles with backend pressure increase \[\s*([\d.]+)%", text)
    if pressure is None:
        out["bottleneck"] = ("none found" if "No resource or data dependency bottlenecks" in text
                             else "no bottleneck analysis for this model")
        return out
    items = re.findall(r"^\s*-?\s*([\w ]+?)\s*:?\s*\[\s*([\d.]+)%\s*\]", text.split("Throughput Bottlenecks:")[1]
                       .split("Critical sequence")[0], re.M)
    top = {name.strip(): float(v) for name, v in items}
    kinds = {k: top.get(k, 0.0) for k in ("Resource Pressure", "Data Dependencies")}
    kind = max(kinds, key=kinds.get)
    units = [(n, v) for n, v in items if n.strip() not in ("Resource Pressure", "Data Dependencies")]
    if kind == "Resource Pressure":
        units = [(n, v) for n, v in units if "Dependencies" not in n]
    else:
        units = [(n, v) for n, v in units if "Dependencies" in n]
    detail = max(units, key=lambda u: float(u[1]))[0].strip() if units else ""
    out["bottleneck"] = f"{kind} {detail} (pressure {float(pressure.group(1)):.0f}% of cycles)".replace("  ", " ")
    return out


def mca(ins: list[str], cpu: str, iterations: int = ITERATIONS) -> dict:
    r = _run([MCA, "-mtriple=aarch64", f"-mcpu={cpu}", f"-iterations={iterations}", "-bottleneck-analysis"],
             input="\n".join(ins) + "\n")
    return parse_mca(r.stdout)


# ----------------------------------------------------------------------------- the API

def bytes_per_token(variant: Variant, hd: int = HD) -> int:
    """K row + V row (int8) + their two fp32 scales: what a token reads from memory at least."""
    return 2 * hd + 8


def estimate(variant: str | None = None, cpu: str = "neoverse-n1", dotprod: bool = True,
             iterations: int = ITERATIONS, native_dir: Path | None = None, tokens=TOKENS) -> list[Estimate]:
    """llvm-mca's estimated cycles per token of each variant (or of the one named), hd 128.
    ``tokens``: the two traced sequence lengths (see ``token_loops``)."""
    if cpu not in CPUS:
        raise ValueError(tr(f"cpu must be one of {CPUS}; got {cpu!r}", f"cpu 必须是 {CPUS} 之一；实际是 {cpu!r}"))
    return estimate_all([cpu], [dotprod], variant, iterations, native_dir, tokens)


def estimate_all(cpus=CPUS, dotprods=(True, False), variant: str | None = None,
                 iterations: int = ITERATIONS, native_dir: Path | None = None, tokens=TOKENS) -> list[Estimate]:
    missing = missing_tools()
    if missing:
        raise ToolMissing(tr(f"needs {', '.join(missing)} (Debian: apt install llvm-19 gcc-aarch64-linux-gnu "
                             "qemu-user)",
                             f"需要 {', '.join(missing)}（Debian：apt install llvm-19 gcc-aarch64-linux-gnu "
                             "qemu-user）"))
    vs = variants(native_dir)
    if variant is not None:
        if variant not in [v.name for v in vs]:
            raise ValueError(tr(f"unknown variant {variant!r}; known: {', '.join(v.name for v in vs)}",
                                f"没有版本 {variant!r}；已有的版本：{', '.join(v.name for v in vs)}"))
    results = []
    with tempfile.TemporaryDirectory() as d:
        for dotprod in dotprods:
            work = Path(d) / ("dp" if dotprod else "nodp")
            work.mkdir()
            exe = build(work, vs, dotprod, native_dir)
            for i, v in enumerate(vs):
                if variant is not None and v.name != variant:
                    continue
                loops = token_loops(exe, i, v.function, tokens)
                blocks = [(lp["tokens_per_period"], disassemble(lp["words"], dotprod)) for lp in loops]
                mix = {}
                for per, ins in blocks:
                    for k, n in instruction_mix(ins).items():
                        mix[k] = mix.get(k, 0) + n / per
                for cpu in cpus:
                    reports = [(per, mca(ins, cpu, iterations)) for per, ins in blocks]
                    cycles = sum(r["cycles_per_iteration"] / per for per, r in reports)
                    main = max(reports, key=lambda pr: pr[1]["cycles_per_iteration"] / pr[0])[1]
                    results.append(Estimate(v.name, cpu, dotprod, cycles, main["bottleneck"],
                                            {k: round(n, 2) for k, n in mix.items()},
                                            [per for per, _ in blocks], bytes_per_token(v),
                                            [r["cycles_per_iteration"] for _, r in reports]))
    return results


HEADER = f"""\
llvm-mca ESTIMATES (a model, not a measurement; typically +-20-30 %), hd {HD}, per token.
Cortex-A76: LLVM has no A76 model (-mcpu=cortex-a76 falls back to the Cortex-A57 model), so the
  Neoverse N1 model stands in: the N1 is the A76's server sibling, the same microarchitecture.
Cortex-A55: LLVM's in-order cortex-a55 model.
The token loop is one period of the kernel's qemu-aarch64 trace (common path: no rescale);
expf is glibc's own executed path, inlined (calls given to llvm-mca as branches).
cycles/token = llvm-mca's cycles for one period of the token loop / the tokens one period handles,
  found from traces at two lengths (tokens per period = extra tokens / extra periods): 1 for a loop
  token by token, the tile (16) for the tiled variants, whose period is one whole tile (score,
  max, exp, V); a kernel with two token loops (two-pass) adds theirs: shown as (c / t + ...).
group4: the grouped kernel, one scan for 4 query heads: its cycles/token serve all 4 heads.
ns at 2.4 GHz (A76) / 1.8 GHz (A55)."""


def memory_line(bpt: int, gbps: float) -> str:
    ns = bpt / gbps
    return (f"memory budget: {bpt} bytes/token / {gbps} GB/s = {ns:.1f} ns/token = "
            f"{ns * 2.4:.0f} cycles at 2.4 GHz, {ns * 1.8:.0f} at 1.8 GHz "
            f"({gbps} GB/s: cited single-thread memcpy of an RK3588 board, docs/references.md; --gbps to change)")


def format_line(e: Estimate) -> str:
    return (f"{e.variant:<24} {CPU_LABEL[e.cpu]:<13} {e.cycles_per_token:7.1f}/token "
            f"({e.how()})  {e.ns_at_ghz():6.1f} ns at {CLOCK_GHZ[e.cpu]} GHz  "
            f"bottleneck: {e.bottleneck}")


def main(argv: list[str] | None = None) -> int:
    """``python -m lessonkit.cycles [--quick]``: llvm-mca's cycles per token of every variant."""
    p = argparse.ArgumentParser(prog="python -m lessonkit.cycles", description=main.__doc__)
    p.add_argument("--quick", action="store_true",
                   help="CI: one variant, dotprod only, few iterations; checks the tool works, not figures")
    p.add_argument("--gbps", type=float, default=BOARD_GBPS, help="board memory bandwidth for the budget")
    p.add_argument("--variant", default=None)
    args = p.parse_args(argv)
    if not args.gbps > 0:
        p.error("--gbps must be positive")
    missing = missing_tools()
    if missing:
        print(f"SKIPPED lessonkit.cycles: needs {', '.join(missing)} "
              "(Debian: apt install llvm-19 gcc-aarch64-linux-gnu qemu-user)")
        return 0
    vs = variants()
    variant = args.variant or (("neon" if "neon" in [v.name for v in vs] else vs[0].name) if args.quick else None)
    print(HEADER)
    print(memory_line(bytes_per_token(vs[0]), args.gbps))
    try:
        res = estimate_all(CPUS, (True,) if args.quick else (True, False), variant,
                           QUICK_ITERATIONS if args.quick else ITERATIONS)
    except (RuntimeError, ValueError) as e:
        print(f"FAILED lessonkit.cycles: {e}", file=sys.stderr)
        return 1
    for dotprod in (True, False):
        sel = [e for e in res if e.dotprod == dotprod]
        if sel:
            print(f"\n-march={'armv8.2-a+dotprod' if dotprod else 'armv8-a (no sdot)'}")
            for e in sel:
                print(format_line(e))
            for e in sel[::len(CPUS)]:
                print(f"  {e.variant}: {e.mix['total']:.0f} instructions/token (loads {e.mix['loads']:.0f}, "
                      f"stores {e.mix['stores']:.0f}, simd/fp {e.mix['simd']:.0f}, scalar {e.mix['scalar']:.0f}, "
                      f"branches {e.mix['branches']:.0f}); tokens per loop period {e.tokens_per_period}")
    fast = [e for e in res if e.variant == "fast" and e.cpu == "neoverse-n1" and e.dotprod]
    if fast:
        got = fast[0].cycles_per_token
        print(f"\ntarget  {'met ' if got <= FAST_TARGET_N1 else 'MISS'}  fast on the N1 model (for the A76), "
              f"dotprod: {got:.1f} cycles/token (target <= {FAST_TARGET_N1}; an estimate)")
    if args.quick:
        bad = [e for e in res if not e.cycles_per_token > 0]
        if bad:
            print("FAILED lessonkit.cycles --quick: no positive estimate", file=sys.stderr)
            return 1
        print("\n--quick: the tool works (few iterations: the figures are not the point)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
