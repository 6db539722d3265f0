"""Memory traffic of the single pass and its two-pass alternatives (introduced in lesson 05):
an analytic byte model, and valgrind's cache simulation of the kernel call alone.

The model counts the bytes each variant's loads and stores touch, pass by pass, for one kv head.
The simulation runs native/tools/fa_driver.c under ``valgrind --tool=callgrind --cache-sim=yes``
with explicit cache sizes (a preset) and counts only the kernel call: the driver switches
collection on and off around it with callgrind's client requests (``CALLGRIND_TOGGLE_COLLECT``
from ``<valgrind/callgrind.h>``), and valgrind runs with ``--collect-atstart=no``. It reports
reads, writes, first-level and last-level misses. Last-level misses times the line size is the
traffic to DRAM. valgrind simulates two levels, a first-level data cache and a last level.
(Where valgrind's headers are missing, the driver is built without the requests and the call is
collected with ``--toggle-collect=<function>`` instead; see ``measure_method``.)"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from . import native
from .language import Text, tr

VARIANTS = ("single", "scalar", "two_pass_scores", "two_pass_recompute")
# lesson 08: G query heads of one kv head (GQA), in one grouped call ("group4") or in G calls of the
# single-pass kernel, one per query head ("per_head4"); G from 1 to 8
GQA_VARIANTS = tuple(f"{kind}{g}" for kind in ("group", "per_head") for g in range(1, 9))
SOFTMAXES = ("softmax_naive", "softmax_safe", "softmax_online")
DRIVER_SOURCE = native.NATIVE_DIR / "tools" / "fa_driver.c"


@dataclass(frozen=True)
class CacheLevel:
    size: int   # bytes
    assoc: int  # ways
    line: int   # bytes

    def valgrind(self) -> str:
        return f"{self.size},{self.assoc},{self.line}"


@dataclass(frozen=True)
class Preset:
    name: str | Text  # shown to the student: str() is the current language's name
    d1: CacheLevel
    ll: CacheLevel  # the last level valgrind simulates


# Caches of the sizes of a Cortex-A76 in the RK3588 (simulated; valgrind is not an A76): L1d 64 KB
# (Arm's Cortex-A76 TRM), L2 512 KB private to each core, and an L3 of 3 MB that the RK3588's four
# A76 cores (and its four A55) share (Rockchip's RK3588 datasheet). valgrind models one last level:
# "a76" takes the whole L3 (one core alone on the chip), "a76-l2" one core's L2 (the part no other
# core competes for). (3 MB is simulated 12-way so that the number of sets is a power of two, as
# valgrind requires.) The keys stay short; the names say "A76-sized", never "A76".
PRESETS = {
    "a76": Preset(Text("A76-sized caches (simulated): L1d 64 KiB, last level 3 MiB (the RK3588's shared L3)",
                       "A76 大小的缓存（模拟）：L1d 64 KiB，最后一级 3 MiB（RK3588 共享的 L3）"),
                  CacheLevel(64 << 10, 4, 64), CacheLevel(3 << 20, 12, 64)),
    "a76-l2": Preset(Text("A76-sized caches (simulated): L1d 64 KiB, last level 512 KiB (one core's L2)",
                          "A76 大小的缓存（模拟）：L1d 64 KiB，最后一级 512 KiB（一个核的 L2）"),
                     CacheLevel(64 << 10, 4, 64), CacheLevel(512 << 10, 8, 64)),
}


def host_preset() -> Preset:
    """This machine's L1d and last-level cache, read from /sys (Linux)."""
    levels = {}
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind = (d / "type").read_text().strip()
            level = int((d / "level").read_text())
            size = (d / "size").read_text().strip()
            ways = int((d / "ways_of_associativity").read_text())
            line = int((d / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        size_b = int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20}[size[-1]] if size[-1] in "KM" else int(size)
        levels[level] = CacheLevel(size_b, ways, line)
    if 1 not in levels or len(levels) < 2:
        raise RuntimeError(tr("could not read this machine's caches from /sys; use the 'a76' preset",
                              "无法从 /sys 读出这台机器的缓存；请改用 'a76' 预设"))
    last = levels[max(levels)]
    return Preset(Text(f"this machine: L1d {levels[1].size >> 10} KiB, last level {last.size >> 20} MiB",
                       f"这台机器：L1d {levels[1].size >> 10} KiB，最后一级 {last.size >> 20} MiB"),
                  levels[1], last)


def preset(name: str) -> Preset:
    if name == "host":
        return host_preset()
    if name not in PRESETS:
        raise ValueError(tr(f"preset must be one of {', '.join([*PRESETS, 'host'])}; got {name!r}",
                            f"预设只能是 {', '.join([*PRESETS, 'host'])} 之一；收到的是 {name!r}"))
    return PRESETS[name]


# ----------------------------------------------------------------------------- the model

def model_bytes(variant: str, seq_len: int, head_dim: int = 128, n_kv_heads: int = 1,
                line: int = 64) -> dict[str, int]:
    """Bytes each part of a variant touches, for one kv head, when nothing is reused from cache.

    K and V rows are ``head_dim`` int8 each. The fp32 scales are read one per token, ``nkv``
    apart, so every token's scale read brings a cache line shared by ``line / (4 nkv)`` tokens:
    ``4 * nkv`` bytes per token, at most one line. The score array (two_pass_scores) is
    4 bytes per token, written in pass 1, read and written in pass 2, read in pass 3.

    Lesson 08's GQA variants: ``group<G>`` reads the kv head's K, V and scales once for its G query
    heads (the single pass's bytes); ``per_head<G>`` makes G single-pass calls, G times the bytes."""
    if variant in GQA_VARIANTS:
        G = int(variant[-1])  # one digit, 1 to 8
        one = model_bytes("single", seq_len, head_dim, n_kv_heads, line)
        return one if variant.startswith("group") else {k: G * b for k, b in one.items()}
    if variant not in VARIANTS:
        raise ValueError(tr(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}",
                            f"variant 只能是 {', '.join(VARIANTS)} 之一；收到的是 {variant!r}"))
    T = seq_len
    scale_bytes = min(4 * n_kv_heads, line) * T  # per pass over K's or V's scales
    k_reads = 2 if variant == "two_pass_recompute" else 1
    parts = dict(k=k_reads * T * head_dim, v=T * head_dim, scales=(k_reads + 1) * scale_bytes,
                 scores_written=0, scores_read=0)
    if variant == "two_pass_scores":
        parts["scores_written"] = 2 * 4 * T
        parts["scores_read"] = 2 * 4 * T
    parts["total"] = sum(parts.values())
    # the same bytes by what they are, for stacked bars (not added to the total again)
    parts["k_first"] = T * head_dim
    parts["k_second"] = (k_reads - 1) * T * head_dim
    parts["score_array"] = parts["scores_written"] + parts["scores_read"]
    return parts


PARTS = ("k_first", "k_second", "v", "scales", "score_array")  # model_bytes' parts that sum to its total


def bytes_per_token(head_dim: int = 128, n_kv_heads: int = 1, line: int = 64) -> dict[str, int]:
    """Bytes of cache lines one token of one kv head occupies: K row + its scale's share of a line,
    and K + V. With ``n_kv_heads`` heads interleaved per token (the engine's layout), a token's
    scales of all heads sit side by side, so one head's scale read brings ``4 * n_kv_heads`` bytes
    (at most a line): 264 bytes for K + V at head_dim 128 and one head, 320 at eight heads."""
    scale = min(4 * n_kv_heads, line)
    return dict(k=head_dim + scale, kv=2 * (head_dim + scale))


def fit_limits(preset_name: str, head_dim: int = 128, n_kv_heads: int = 1) -> dict[str, float]:
    """The sequence lengths up to which one kv head's K + V, and its K alone, fit in the preset's
    last level (bytes of lines per token from ``bytes_per_token``): the bounds of the regions
    "K+V fit", "K fits", "neither"."""
    size = preset(preset_name).ll.size
    per = bytes_per_token(head_dim, n_kv_heads, preset(preset_name).ll.line)
    return dict(kv_fits=size / per["kv"], k_fits=size / per["k"])


def softmax_accesses_per_element(variant: str) -> dict[str, int]:
    """Loads and stores per element of the three softmaxes (Milakov and Gimelshein 2018, table 1)."""
    return {"softmax_naive": dict(loads=2, stores=1), "softmax_safe": dict(loads=3, stores=1),
            "softmax_online": dict(loads=2, stores=1)}[variant]


# ----------------------------------------------------------------------------- the simulation

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
    n_kv_heads: int = 1  # kv heads interleaved per token in the simulated cache (the one measured: the last)

    @property
    def dram_bytes(self) -> int:
        """Traffic between the last level and memory: one line per last-level miss."""
        return self.ll_misses * self.line

    @property
    def l1_bytes(self) -> int:
        """Traffic into the first-level data cache: one line per first-level miss."""
        return self.d1_misses * self.line

    def as_dict(self) -> dict:
        return {**asdict(self), "dram_bytes": self.dram_bytes, "l1_bytes": self.l1_bytes}


def valgrind_available() -> bool:
    return shutil.which("valgrind") is not None


def driver() -> Path:
    """The driver program, compiled for valgrind: -O2 -g, and only instructions valgrind 3.19
    decodes. x86: AVX2 at most (no AVX-512, which -march=native would emit on some CPUs).
    arm64: ``-march=armv8-a``, the NEON path without ``sdot``, even where the CPU has the dot
    product (the RK3588's Cortex-A76 does): valgrind 3.19 stops at ``sdot`` with "unrecognised
    instruction". The kernel loads and stores the same bytes on every path, so the simulated
    traffic is the same; only instruction counts differ."""
    if native.is_arm64():
        arch = [native.AARCH64_MARCH[False]]
    else:
        arch = [f"-I{native.simde_include_dir()}"] if native.simde_include_dir() else []
        if platform.machine().lower() in ("x86_64", "amd64") and _host_has("avx2"):
            arch += ["-mavx2", "-mfma"]
    return native.build_program(DRIVER_SOURCE, ["-O2", "-g", *arch], "fa_driver")


_methods: dict[Path, str] = {}


def measure_method(program: Path | None = None) -> str:
    """How the driver marks the measured call: ``"client-requests"`` (built with
    ``<valgrind/callgrind.h>``: collection switched on and off around the kernel call, valgrind run
    with ``--collect-atstart=no``) or ``"toggle-collect"`` (no header: the measured function is
    collected with ``--toggle-collect``; right on x86, while on arm64 callgrind can miss the
    function's return and count the code after the call too). The driver itself says which."""
    program = Path(program or driver())
    if program not in _methods:
        proc = subprocess.run([str(program), "method"], capture_output=True, text=True, timeout=60)
        method = proc.stdout.strip()
        if proc.returncode != 0 or method not in ("client-requests", "toggle-collect"):
            raise RuntimeError(f"{program.name} method: unexpected answer {proc.stdout!r} {proc.stderr[-500:]!r}")
        _methods[program] = method
    return _methods[program]


def collect_options(measured: str, program: Path | None = None) -> list[str]:
    """callgrind's options that restrict collection to the measured call of ``measured``."""
    if measure_method(program) == "client-requests":
        return ["--collect-atstart=no"]
    return [f"--toggle-collect={measured}"]


def _host_has(flag: str) -> bool:
    try:
        return re.search(rf"\b{flag}\b", Path("/proc/cpuinfo").read_text()) is not None
    except OSError:
        return False


def simulate(variant: str, seq_len: int, head_dim: int = 128, n_kv_heads: int = 1,
             block_size: int = 64, preset_name: str = "a76", warm: bool = False) -> Simulated:
    """Run one call of ``variant`` (a kernel of VARIANTS, a softmax of SOFTMAXES over ``seq_len``
    floats, or lesson 08's ``group<G>`` / ``per_head<G>``: G query heads in one grouped call or in
    G single-pass calls, all measured) under valgrind's cache simulation and return its counts. Cold (the
    default): nothing of the data is in the simulated caches; warm: after one call of the same."""
    if variant not in VARIANTS + SOFTMAXES + GQA_VARIANTS:
        raise ValueError(tr(f"variant must be one of {', '.join(VARIANTS + SOFTMAXES)}, group1..group8 or "
                            f"per_head1..per_head8; got {variant!r}",
                            f"variant 只能是 {', '.join(VARIANTS + SOFTMAXES)}、group1..group8 或 "
                            f"per_head1..per_head8 之一；收到的是 {variant!r}"))
    if not valgrind_available():
        raise RuntimeError(tr("valgrind is not installed (Debian/Ubuntu: sudo apt install valgrind; "
                              "it does not run on macOS): the lesson shows its saved results instead",
                              "没有安装 valgrind（Debian/Ubuntu：sudo apt install valgrind；"
                              "它不能在 macOS 上运行）：课程改为显示保存好的结果"))
    p = preset(preset_name)
    measured = ("measured_softmax" if variant in SOFTMAXES
                else "measured_group" if variant in GQA_VARIANTS else "measured_call")
    program = driver()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--cache-sim=yes", f"--D1={p.d1.valgrind()}",
               f"--LL={p.ll.valgrind()}", f"--I1={p.d1.valgrind()}", *collect_options(measured, program),
               f"--callgrind-out-file={out}", str(program), variant, str(seq_len), str(head_dim),
               str(n_kv_heads), str(block_size), "warm" if warm else "cold", str(2 * p.ll.size)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(tr(f"valgrind failed ({proc.returncode}):\n{proc.stderr[-2000:]}",
                                  f"valgrind 运行失败（{proc.returncode}）：\n{proc.stderr[-2000:]}"))
        text = out.read_text()
    events = re.search(r"^events: (.*)$", text, re.M).group(1).split()
    totals = [int(x) for x in re.search(r"^totals: (.*)$", text, re.M).group(1).split()]
    c = dict(zip(events, totals + [0] * (len(events) - len(totals))))  # trailing zeros are omitted
    return Simulated(variant, seq_len, preset_name, c["Ir"], c["Dr"], c["Dw"],
                     c["D1mr"] + c["D1mw"], c["DLmr"] + c["DLmw"], p.ll.line, n_kv_heads)
