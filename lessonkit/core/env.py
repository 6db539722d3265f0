"""What this machine has for the workbook (lesson 00), the label every timing carries, and the
cores timings run on (lesson 01): on a machine with several core types (big.LITTLE, such as the
course's RK3588 with 4 Cortex-A76 and 4 Cortex-A55) every timing helper runs pinned to one type,
the big cores by default (``timing_cores``, ``pinned``), and ``machine_label`` names it."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import native
from .language import _
from .processes import fork_safe_lock


CPUINFO = Path("/proc/cpuinfo")
DEVICE_TREE_MODEL = Path("/proc/device-tree/model")


SYS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")  # Linux's description of CPU 0's caches


def size_bytes(text: str) -> int:
    """A sysfs cache size ("48K", "3M" or "512") in bytes."""
    text = text.strip().upper()
    return int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)


def last_level_bytes(sysfs: Path | str = SYS_CACHE) -> int | None:
    """The largest CPU cache (its last level) in bytes, as Linux's sysfs lists CPU 0's; None where it lists
    none (macOS)."""
    sizes = []
    for f in Path(sysfs).glob("index*/size"):
        try:
            sizes.append(size_bytes(f.read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


def cpu_name(cpuinfo_path: Path | str | None = None, model_path: Path | str | None = None) -> str:
    """The CPU's model name, e.g. "AMD EPYC" or "Apple M1"; on aarch64 Linux, whose /proc/cpuinfo
    has no model name, the board the device tree names (e.g. "Radxa ROCK 5B"); the machine type if
    unknown. ``cpuinfo_path``, ``model_path``: other files than /proc/cpuinfo and
    /proc/device-tree/model (a test feeds a board's)."""
    try:
        if sys.platform == "darwin" and cpuinfo_path is None:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=30).stdout.strip() or platform.machine()
        for line in Path(cpuinfo_path or CPUINFO).read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
        board = board_name(model_path)
        if board:
            return board
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.machine()


def board_name(model_path: Path | str | None = None) -> str | None:
    """The board from the device tree (a NUL-terminated string), or None where there is none."""
    try:
        text = Path(model_path or DEVICE_TREE_MODEL).read_bytes().split(b"\0", 1)[0]
    except OSError:
        return None
    return text.decode(errors="replace").strip() or None


# ----------------------------------------------------------------------------- big.LITTLE

# MIDR part numbers of Arm's own cores (CPU implementer 0x41), as /proc/cpuinfo prints them in
# "CPU part"; any other part is named by its hex id. The course's RK3588 has 4 Cortex-A55 (cpus
# 0-3) and 4 Cortex-A76 (cpus 4-7).
ARM_PARTS = {0xd03: "Cortex-A53", 0xd04: "Cortex-A35", 0xd05: "Cortex-A55", 0xd07: "Cortex-A57",
             0xd08: "Cortex-A72", 0xd09: "Cortex-A73", 0xd0a: "Cortex-A75", 0xd0b: "Cortex-A76",
             0xd0d: "Cortex-A77", 0xd41: "Cortex-A78", 0xd44: "Cortex-X1", 0xd46: "Cortex-A510",
             0xd47: "Cortex-A710", 0xd48: "Cortex-X2"}
# in-order efficiency cores: never the default when the machine has another type
LITTLE = {"Cortex-A53", "Cortex-A35", "Cortex-A55", "Cortex-A510"}
NO_PINNING = "any"  # cores="any": time on whatever core the scheduler picks


def core_types(cpuinfo_path: Path | str | None = None) -> dict[str, frozenset[int]]:
    """{core type: the CPU numbers of that type} from the "processor" and "CPU part" lines of
    /proc/cpuinfo (or ``cpuinfo_path``); {} where there are none (x86, macOS)."""
    try:
        text = Path(cpuinfo_path or CPUINFO).read_text(errors="replace")
    except OSError:
        return {}
    types: dict[str, set[int]] = {}
    cpu, implementer = None, None
    for line in text.splitlines():
        key, unused, value = (part.strip() for part in line.partition(":"))
        key = key.lower()
        try:
            if key == "processor":
                cpu, implementer = int(value), None
            elif key == "cpu implementer":
                implementer = int(value, 16)
            elif key == "cpu part" and cpu is not None:
                part = int(value, 16)
                name = ARM_PARTS.get(part, f"{part:#05x}") if implementer in (None, 0x41) else f"{part:#05x}"
                types.setdefault(name, set()).add(cpu)
        except ValueError:
            continue  # a line this parser does not know: ignore it rather than fail a timing
    return {name: frozenset(cpus) for name, cpus in sorted(types.items(), key=lambda kv: min(kv[1]))}


@dataclass(frozen=True)
class TimingCores:
    """The CPUs a timing runs on: ``cpus`` empty means not pinned (``why`` says why)."""
    name: str | None                # the core type timed on, e.g. "Cortex-A76"
    cpus: frozenset[int]            # pin to these (empty: no pinning)
    types: dict                     # every core type of the machine: {name: cpus}
    why: str = ""

    def describe(self) -> str:
        if not self.cpus:
            kinds = "; ".join(f"{len(c)}x {n}" for n, c in self.types.items())
            return f"{self.why}{_(': ')}{kinds}" if len(self.types) > 1 else self.why
        others = "; ".join(f"{len(c)}x {n}" for n, c in self.types.items() if n != self.name)
        return (_("timed on the {name} cores (CPUs {cpu_list_cpus}, pinned)").format(
                  name=self.name, cpu_list_cpus=_cpu_list(self.cpus))
                + (_("; also here: {others}").format(others=others) if others else ""))


def _cpu_list(cpus) -> str:
    """{4, 5, 6, 7, 9} -> "4-7, 9"."""
    cpus, parts = sorted(cpus), []
    start = prev = cpus[0]
    for c in cpus[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        if c is not None:
            start = prev = c
    return ", ".join(parts)


def timing_cores(cores: str | TimingCores | None = None, cpuinfo_path: Path | str | None = None) -> TimingCores:
    """Which CPUs timings run on (introduced in lesson 01 with the first timing).

    On a machine with more than one core type (big.LITTLE, e.g. the RK3588: 4 Cortex-A55 + 4
    Cortex-A76), a kernel timed on a little core is about 2-3 times slower, and the scheduler may
    move a timing loop between types; so every timing helper pins itself to one type. ``cores``:
    None (default) the big cores (the type of the highest-numbered CPU that is not an in-order
    little core: the A76 on the RK3588), a type's name (``"Cortex-A55"`` or ``"A55"``, or a hex
    part id such as ``"0xd05"``), or ``"any"`` for no pinning. Where all cores are one type, or
    the system has no ``os.sched_setaffinity`` (macOS), nothing is pinned. A TimingCores passed as
    ``cores`` is returned as it is (a benchmark decides once for all its timings)."""
    if isinstance(cores, TimingCores):
        return cores
    types = core_types(cpuinfo_path)
    if cores is not None and not isinstance(cores, str):
        raise TypeError(_("cores must be None, 'any' or a core type's name such as 'Cortex-A76'; got {cores!r}").format(
                          cores=cores))
    if cores == NO_PINNING:
        return TimingCores(None, frozenset(), types, _("not pinned (cores='any')"))
    if cores is not None:
        wanted = cores.strip().lower()
        try:  # a hex part id names the same type as its name: "0xd05" is "Cortex-A55"
            wanted = ARM_PARTS.get(int(wanted, 16), wanted).lower() if wanted.startswith("0x") else wanted
        except ValueError:
            pass
        match = [n for n in types if wanted in (n.lower(), n.lower().removeprefix("cortex-"))]
        if not match:
            have = ", ".join(f"{n!r}" for n in types) or _("none (/proc/cpuinfo has no 'CPU part' lines here)")
            raise ValueError(_("no {cores!r} cores on this machine; its core types: {have}; or use cores='any'").format(
                               cores=cores, have=have))
        name = match[0]
    if len(types) < 2:
        return TimingCores(next(iter(types), None), frozenset(), types,
                           _("not pinned: all cores are one type")
                           if types else _("not pinned: /proc/cpuinfo names no core types here"))
    if not hasattr(os, "sched_setaffinity"):
        return TimingCores(None, frozenset(), types, _("not pinned: this system has no os.sched_setaffinity"))
    if cores is None:
        big = [n for n in types if n not in LITTLE] or list(types)
        name = max(big, key=lambda n: max(types[n]))
    return TimingCores(name, types[name], types)


_pin_lock = fork_safe_lock(sys.modules[__name__], "_pin_lock", reentrant=True)


def _thread_ids() -> list[int]:
    """The native ids of every thread of this process (0, the calling thread, where /proc is missing).
    Every thread is pinned, not only the caller: split-KV's pool workers run kernel calls too."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


@contextmanager
def pinned(cores: str | TimingCores | None = None, cpuinfo_path: Path | str | None = None):
    """Run the body on one core type (``timing_cores``), then give every thread its CPU set back,
    also when the body raises. Threads started inside (e.g. a pool's workers) get the caller's set
    from before. Yields the TimingCores used. A core type outside this process's CPU set (e.g. after
    ``taskset``) is not forced: the body then runs unpinned, with a RuntimeWarning."""
    plan = cores if isinstance(cores, TimingCores) else timing_cores(cores, cpuinfo_path)
    if not plan.cpus or not hasattr(os, "sched_setaffinity"):
        yield plan
        return
    with _pin_lock:  # two timings pinning and restoring at once would restore each other's masks
        mine = frozenset(os.sched_getaffinity(0))
        target = plan.cpus & mine
        if not target:
            warnings.warn(f"the {plan.name} cores (CPUs {_cpu_list(plan.cpus)}) are outside this process's CPU "
                          f"set ({_cpu_list(mine)}): timing without pinning", RuntimeWarning, stacklevel=3)
            yield plan
            return
        saved: dict[int, frozenset] = {}
        seen = set(_thread_ids())
        try:
            for tid in seen:
                try:
                    before = frozenset(os.sched_getaffinity(tid))
                    os.sched_setaffinity(tid, target)
                    saved[tid] = before
                except OSError:  # the thread ended meanwhile, or may not be moved: leave it
                    continue
            yield plan
        finally:
            for tid in _thread_ids():
                if tid in saved:
                    before = saved[tid]
                elif tid in seen:
                    continue     # was there, could not be pinned: nothing to undo
                else:
                    before = mine  # started inside: it inherited the pinned set from its creator
                try:
                    os.sched_setaffinity(tid, before)
                except OSError:
                    continue


def machine_label(cores: str | None = None, cpuinfo_path: Path | str | None = None,
                  model_path: Path | str | None = None) -> str:
    """"<cpu>, <arch>, kernel backend <backend>": printed beside every timing a lesson shows.
    On a machine with several core types the cpu part names the board and the core type the
    timings are pinned to, e.g. "Radxa ROCK 5B, timed on the Cortex-A76 cores (CPUs 4-7, pinned);
    also here: 4x Cortex-A55, aarch64, kernel backend neon+dotprod" (``cores`` as in
    ``timing_cores``)."""
    name = cpu_name(cpuinfo_path, model_path)
    plan = timing_cores(cores, cpuinfo_path)
    if len(plan.types) > 1:
        name = f"{board_name(model_path) or name}, {plan.describe()}"
    elif len(plan.types) == 1 and plan.name not in name:
        name = f"{name} ({plan.name})"
    return f"{name}, {platform.machine()}, " + _("kernel backend ") + native.backend()

