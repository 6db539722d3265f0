"""What this machine has for the workbook (lesson 00), and the label every timing carries."""
from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import native


@dataclass
class Check:
    what: str
    ok: bool
    found: str      # what was found, or "missing"
    needed_for: str
    install: str    # how to get it, when missing


def cpu_name() -> str:
    """The CPU's model name, e.g. "AMD EPYC" or "Apple M1" (the machine type if unknown)."""
    try:
        if sys.platform == "darwin":
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                  capture_output=True, text=True).stdout.strip() or platform.machine()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
        # aarch64 Linux has no model name line: the device tree names the board
        model = Path("/proc/device-tree/model")
        if model.is_file():
            return model.read_text().strip("\0 \n")
    except OSError:
        pass
    return platform.machine()


def machine_label() -> str:
    """"<cpu>, <arch>, kernel backend <backend>": printed beside every timing a lesson shows."""
    return f"{cpu_name()}, {platform.machine()}, kernel backend {native.backend()}"


def _version(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    out = subprocess.run(cmd, capture_output=True, text=True)
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else cmd[0]


def _installer() -> str:
    if sys.platform == "darwin":
        return "brew install"
    return "sudo apt install"


def check_setup() -> list[Check]:
    """Check the compiler, the compiled backend, SIMDe or NEON, and the tools later lessons use."""
    inst = _installer()
    checks = []
    try:
        cc = native.compiler()
        checks.append(Check("C compiler", True, _version([*cc.split(), "--version"]) or cc,
                            "every lesson", ""))
    except native.BuildError as e:
        checks.append(Check("C compiler", False, "missing", "every lesson", str(e)))
    try:
        name = native.backend()
        checks.append(Check("kernel build", True, name, "every lesson", ""))
    except native.BuildError as e:
        checks.append(Check("kernel build", False, "failed", "every lesson", str(e).splitlines()[0]))
    if native.is_arm64():
        checks.append(Check("NEON", True, "arm_neon.h (native)", "every lesson", ""))
    else:
        inc = native.simde_include_dir()
        checks.append(Check("SIMDe headers", inc is not None,
                            "found" if inc else "missing", "every lesson (NEON off ARM)",
                            "pip install cmeel-simde  (or conda install -c conda-forge simde)"))
    tools = [("gdb", ["gdb", "--version"], "lesson 06 (debugger exercise)", f"{inst} gdb"),
             ("valgrind", ["valgrind", "--version"], "lesson 05 (cache simulation)",
              "sudo apt install valgrind  (not available on macOS: lesson 05 shows saved results)"),
             ("aarch64 cross compiler", ["aarch64-linux-gnu-gcc", "--version"],
              "make test-aarch64 (optional)", "sudo apt install gcc-aarch64-linux-gnu"),
             ("qemu-aarch64", ["qemu-aarch64", "--version"], "make test-aarch64 (optional)",
              "sudo apt install qemu-user")]
    for what, cmd, needed_for, install in tools:
        v = _version(cmd)
        checks.append(Check(what, v is not None, v or "missing", needed_for, install))
    return checks


def print_setup(checks: list[Check] | None = None) -> None:
    """Print check_setup() as a table, with what to install for anything missing."""
    checks = check_setup() if checks is None else checks
    for c in checks:
        print(f"{'ok ' if c.ok else 'MISSING'}  {c.what:<24} {c.found[:48]:<48}  for {c.needed_for}")
    for c in checks:
        if not c.ok:
            print(f"\n-> {c.what}: {c.install}")
    if all(c.ok for c in checks):
        print("\nEverything the workbook uses is here.")
