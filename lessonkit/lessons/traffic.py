"""Memory traffic of the single pass and its two-pass alternatives (lesson 05): an analytic byte model, and valgrind's
cache simulation of the kernel call alone.

The simulation runs native/tools/fa_driver.c under ``valgrind --tool=callgrind --cache-sim=yes`` with a preset's
cache sizes, counting only the kernel call (``measure_method`` says how). valgrind simulates a first-level data cache
and one last level: last-level misses times the line size is the traffic to DRAM."""
from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core import env, native
from ..core import validate as check
from ..core.language import N_, _
from ..core.processes import run_bounded

VARIANTS = ("single", "scalar", "two_pass_scores", "two_pass_recompute")
# lesson 08: G query heads of one kv head, one grouped call ("group4") or G single-pass calls ("per_head4")
GQA_VARIANTS = tuple(f"{kind}{g}" for kind in ("group", "per_head") for g in range(1, 9))
SOFTMAXES = ("softmax_naive", "softmax_safe", "softmax_online")
DRIVER_SOURCE = native.NATIVE_DIR / "tools" / "fa_driver.c"
SIMULATION_TIMEOUT_S = 900.0  # valgrind is about 100 times slower than the CPU: a lesson's longest takes a minute
PARTS = ("k_first", "k_second", "v", "scales", "score_array")  # model_bytes' parts that sum to its total
_methods: dict[Path, str] = {}  # measure_method's answer, per driver program


@dataclass(frozen=True)
class CacheLevel:
    size: int   # bytes
    assoc: int  # ways
    line: int   # bytes

    def valgrind(self) -> str:
        return f"{self.size},{self.assoc},{self.line}"


@dataclass(frozen=True)
class Preset:
    name: str | N_  # str() is the name in the current language
    d1: CacheLevel
    ll: CacheLevel    # the last level valgrind simulates


# Simulated caches of a Cortex-A76's sizes in the RK3588 (valgrind is not an A76): L1d 64 KB (Arm's
# Cortex-A76 TRM), and as the one last level either the 3 MB L3 the chip's cores share ("a76") or one
# core's 512 KB L2 ("a76-l2") (Rockchip's RK3588 datasheet); 3 MB 12-way so that the sets are a power of 2.
PRESETS = {
    "a76": Preset(N_("A76-sized caches (simulated): L1d 64 KiB, last level 3 MiB (the RK3588's shared L3)"),
                  CacheLevel(64 << 10, 4, 64), CacheLevel(3 << 20, 12, 64)),
    "a76-l2": Preset(N_("A76-sized caches (simulated): L1d 64 KiB, last level 512 KiB (one core's L2)"),
                     CacheLevel(64 << 10, 4, 64), CacheLevel(512 << 10, 8, 64)),
}


def host_preset() -> Preset:
    """This machine's L1d and last-level cache, read from /sys (Linux)."""
    levels = {}
    for d in sorted(env.SYS_CACHE.glob("index*")):
        with contextlib.suppress(OSError, ValueError):  # a level /sys does not fully describe is left out
            if (d / "type").read_text().strip() == "Instruction":
                continue
            levels[int((d / "level").read_text())] = CacheLevel(
                env.size_bytes((d / "size").read_text()), int((d / "ways_of_associativity").read_text()),
                int((d / "coherency_line_size").read_text()))
    if 1 not in levels or len(levels) < 2:
        raise RuntimeError(_("could not read this machine's caches from /sys; use the 'a76' preset"))
    last = levels[max(levels)]
    return Preset(N_("this machine: L1d {size_levels} KiB, last level {size_last} MiB",
                     size_levels=levels[1].size >> 10, size_last=last.size >> 20), levels[1], last)


def preset(name: str) -> Preset:
    return host_preset() if check.one_of("preset", name, (*PRESETS, "host")) == "host" else PRESETS[name]


def model_bytes(variant: str, seq_len: int, head_dim: int = 128, n_kv_heads: int = 1, line: int = 64) -> dict[str, int]:
    """Bytes each part of ``variant`` touches for one kv head, nothing reused from cache: int8 K and V rows; one fp32
    scale per token, ``nkv`` apart, so a scale read costs ``4 nkv`` bytes of its line (at most the line);
    two_pass_scores' score array, 4 bytes a token, written in pass 1, read and written in pass 2, read in pass 3.
    ``group<G>`` reads the single pass's bytes once for G query heads, ``per_head<G>`` G times."""
    if variant in GQA_VARIANTS:
        one = model_bytes("single", seq_len, head_dim, n_kv_heads, line)
        return one if variant.startswith("group") else {k: int(variant[-1]) * b for k, b in one.items()}
    check.one_of("variant", variant, VARIANTS)
    T, k_reads = seq_len, 2 if variant == "two_pass_recompute" else 1
    score = 2 * 4 * T if variant == "two_pass_scores" else 0
    parts = dict(k=k_reads * T * head_dim, v=T * head_dim, scales=(k_reads + 1) * min(4 * n_kv_heads, line) * T,
                 scores_written=score, scores_read=score)
    parts["total"] = sum(parts.values())
    # the same bytes by what they are, for stacked bars (PARTS; not added to the total again)
    parts.update(k_first=T * head_dim, k_second=(k_reads - 1) * T * head_dim, score_array=2 * score)
    return parts


def bytes_per_token(head_dim: int = 128, n_kv_heads: int = 1, line: int = 64) -> dict[str, int]:
    """Bytes of cache lines one token of one kv head occupies, K alone and K + V (its scale's share of a line:
    ``4 * n_kv_heads`` bytes, at most the line): 264 for K + V at hd 128, 320 at 8 heads."""
    scale = min(4 * n_kv_heads, line)
    return dict(k=head_dim + scale, kv=2 * (head_dim + scale))


def fit_limits(preset_name: str, head_dim: int = 128, n_kv_heads: int = 1) -> dict[str, float]:
    """The seq_len up to which one kv head's K + V, and its K alone, fit in the preset's last level."""
    ll = preset(preset_name).ll
    per = bytes_per_token(head_dim, n_kv_heads, ll.line)
    return dict(kv_fits=ll.size / per["kv"], k_fits=ll.size / per["k"])


def softmax_accesses_per_element(variant: str) -> dict[str, int]:
    """Loads and stores per element of the three softmaxes (Milakov and Gimelshein 2018, table 1)."""
    return {"softmax_naive": dict(loads=2, stores=1), "softmax_safe": dict(loads=3, stores=1),
            "softmax_online": dict(loads=2, stores=1)}[variant]


@dataclass
class Simulated:
    variant: str
    seq_len: int
    preset: str
    instructions: int
    reads: int       # data reads (loads), any size
    writes: int
    d1_misses: int   # first-level data misses (reads + writes)
    ll_misses: int   # last-level data misses (reads + writes)
    line: int
    n_kv_heads: int = 1  # kv heads interleaved per token in the simulated cache (the last one is measured)

    dram_bytes = property(lambda self: self.ll_misses * self.line, doc="one line per last-level miss")
    l1_bytes = property(lambda self: self.d1_misses * self.line, doc="one line per first-level miss")

    def as_dict(self) -> dict:
        return {**asdict(self), "dram_bytes": self.dram_bytes, "l1_bytes": self.l1_bytes}


def valgrind_available() -> bool:
    return shutil.which("valgrind") is not None


def driver() -> Path:
    """The driver, -O2 -g, with only instructions valgrind 3.19 decodes: AVX2 at most on x86, ``-march=armv8-a`` on
    arm64 (valgrind stops at ``sdot``). Every path moves the same bytes; only instruction counts differ."""
    if native.is_arm64():
        arch = [native.AARCH64_MARCH[False]]
    else:
        arch = [f"-I{native.simde_include_dir()}"] if native.simde_include_dir() else []
        try:
            avx2 = re.search(r"\bavx2\b", env.CPUINFO.read_text()) is not None
        except OSError:
            avx2 = False
        if platform.machine().lower() in ("x86_64", "amd64") and avx2:
            arch += ["-mavx2", "-mfma"]
    return native.build_program(DRIVER_SOURCE, ["-O2", "-g", *arch], "fa_driver")


def measure_method(program: Path | None = None) -> str:
    """How the driver marks the measured call, as it says itself: "client-requests" (``<valgrind/callgrind.h>``), or
    "toggle-collect" without that header (by the function's name; on arm64 callgrind can then miss its return)."""
    program = Path(program or driver())
    if program not in _methods:
        proc = subprocess.run([str(program), "method"], capture_output=True, text=True, timeout=60)
        method = proc.stdout.strip()
        if proc.returncode != 0 or method not in ("client-requests", "toggle-collect"):
            raise RuntimeError(f"{program.name} method: unexpected answer {proc.stdout!r} {proc.stderr[-500:]!r}")
        _methods[program] = method
    return _methods[program]


def collect_options(measured: str, program: Path | None = None) -> list[str]:
    return ["--collect-atstart=no" if measure_method(program) == "client-requests" else f"--toggle-collect={measured}"]


def simulate(variant: str, seq_len: int, head_dim: int = 128, n_kv_heads: int = 1,
             block_size: int = 64, preset_name: str = "a76", warm: bool = False) -> Simulated:
    """One call of ``variant`` (a kernel, a softmax over ``seq_len`` floats, or ``group<G>`` / ``per_head<G>``) under
    valgrind's cache simulation: cold (nothing of the data in the simulated caches) or ``warm`` (after one call)."""
    if variant not in VARIANTS + SOFTMAXES + GQA_VARIANTS:
        raise ValueError(_("variant must be one of {variants_softmaxes}, group1..group8 or per_head1..per_head8; "
                           "got {variant!r}").format(
                           variants_softmaxes=', '.join(VARIANTS + SOFTMAXES), variant=variant))
    if not valgrind_available():
        raise RuntimeError(_("valgrind is not installed (Debian/Ubuntu: sudo apt install valgrind; it does not run "
                             "on macOS): the lesson shows its saved results instead"))
    p = preset(preset_name)
    measured = ("measured_softmax" if variant in SOFTMAXES
                else "measured_group" if variant in GQA_VARIANTS else "measured_call")
    with native.stopped(_("the build of valgrind's driver (the compiler)")):
        program = driver()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--cache-sim=yes", f"--D1={p.d1.valgrind()}",
               f"--LL={p.ll.valgrind()}", f"--I1={p.d1.valgrind()}", *collect_options(measured, program),
               f"--callgrind-out-file={out}", str(program), variant, str(seq_len), str(head_dim),
               str(n_kv_heads), str(block_size), "warm" if warm else "cold", str(2 * p.ll.size)]
        # LD_BIND_NOW: the dynamic linker resolves every symbol (libm's expf) before main, so the
        # first, cold call counts the kernel alone, not also the linker finding expf on first use
        with native.stopped(_("valgrind's simulation of {variant} over {seq_len} tokens (its processes were "
                              "ended; nothing was measured)").format(variant=variant, seq_len=seq_len),
                            _("The library loaded in this process is unchanged.")):
            done = run_bounded(cmd, SIMULATION_TIMEOUT_S, stdout=subprocess.DEVNULL,
                               env={**os.environ, "LD_BIND_NOW": "1"})
        if done.returncode is None:
            raise RuntimeError(_("valgrind's simulation of {variant} over {seq_len} tokens did not finish in "
                                 "{limit:.0f} s; try a shorter cache").format(
                                 variant=variant, seq_len=seq_len, limit=SIMULATION_TIMEOUT_S))
        if done.returncode != 0:
            raise RuntimeError(_("valgrind failed ({returncode}):\n{stderr_proc}").format(
                                 returncode=done.returncode, stderr_proc=done.stderr[-2000:]))
        text = out.read_text()
    events = re.search(r"^events: (.*)$", text, re.M).group(1).split()
    totals = [int(x) for x in re.search(r"^totals: (.*)$", text, re.M).group(1).split()]
    c = dict(zip(events, totals + [0] * (len(events) - len(totals))))  # trailing zeros are omitted
    return Simulated(variant, seq_len, preset_name, c["Ir"], c["Dr"], c["Dw"],
                     c["D1mr"] + c["D1mw"], c["DLmr"] + c["DLmw"], p.ll.line, n_kv_heads)
