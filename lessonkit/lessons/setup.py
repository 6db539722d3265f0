"""What this machine has for the workbook (introduced in lesson 00): the compiler, the kernel's build, SIMDe or
NEON, and the tools later lessons use, each with what to install when it is missing (``print_setup``); and
where lldb is (``lldb_path``, lesson 06)."""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ..core import native
from ..core.language import _
from ..display.table import Table, show


@dataclass
class Check:
    what: str
    ok: bool
    found: str      # what was found, or "missing"
    needed_for: str
    install: str    # how to get it, when missing


def first_line(cmd: list[str]) -> str | None:
    """The first line ``cmd`` prints (stdout, else stderr, else its name); None if it is missing or does not answer."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):  # a tool that does not answer is as good as missing
        return None
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else cmd[0]


def check_setup() -> list[Check]:
    inst = "brew install" if sys.platform == "darwin" else "sudo apt install"
    checks, every, missing = [], _("every lesson"), _("missing")
    try:
        cc = native.compiler()
        checks.append(Check(_("C compiler"), True, first_line([*cc.split(), "--version"]) or cc, every, ""))
    except native.BuildError as e:
        checks.append(Check(_("C compiler"), False, missing, every, str(e)))
    try:
        checks.append(Check(_("kernel build"), True, native.backend(), every, ""))
    except native.BuildError as e:
        checks.append(Check(_("kernel build"), False, _("failed"), every, str(e).splitlines()[0]))
    if native.is_arm64():
        checks.append(Check("NEON", True, _("arm_neon.h (native)"), every, ""))
    else:
        inc = native.simde_include_dir()
        checks.append(Check(_("SIMDe headers"), inc is not None, _("found") if inc else missing,
                            _("every lesson (NEON off ARM)"),
                            _("pip install cmeel-simde  (or conda install -c conda-forge simde)")))
    # lldb comes with Xcode's command line tools (docs/references.md, "Debuggers on macOS")
    gdb_install = (_("gdb cannot debug native programs on Apple Silicon: use lldb in lesson 06 (xcode-select "
                     "--install)") if sys.platform == "darwin" else f"{inst} gdb")
    lldb_install = "xcode-select --install" if sys.platform == "darwin" else f"{inst} lldb"
    optional = _("make test-aarch64 (optional)")
    tools = [("gdb", ["gdb", "--version"], _("lesson 06 (debugger exercise)"), gdb_install),
             ("lldb", [lldb_path() or "lldb", "--version"], _("lesson 06 (the lldb track)"), lldb_install),
             ("llvm-mca-19", ["llvm-mca-19", "--version"], _("lesson 09 (A76 estimates, make bench-a76)"),
              f"{inst} llvm-19" if sys.platform != "darwin" else
              _("not packaged as llvm-mca-19 on macOS: lesson 09 shows saved estimates")),
             ("valgrind", ["valgrind", "--version"], _("lesson 05 (cache simulation)"),
              _("sudo apt install valgrind  (not available on macOS: lesson 05 shows saved results)")),
             (_("aarch64 cross compiler"), ["aarch64-linux-gnu-gcc", "--version"], optional,
              "sudo apt install gcc-aarch64-linux-gnu"),
             ("qemu-aarch64", ["qemu-aarch64", "--version"], optional, "sudo apt install qemu-user")]
    for what, cmd, needed_for, install in tools:
        v = first_line(cmd)
        checks.append(Check(what, v is not None, v or missing, needed_for, install))
    return checks


def lldb_path() -> str | None:
    """Where lldb is: ``lldb`` on PATH; else the newest versioned ``lldb-NN`` on PATH (Debian and
    Ubuntu install e.g. ``lldb-14`` and ``lldb-19`` side by side, the plain name only with the
    ``lldb`` package); on macOS, Xcode's (``xcrun -f lldb``). None when there is none."""
    if found := shutil.which("lldb"):
        return found
    versioned = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        for full in glob.glob(os.path.join(glob.escape(d), "lldb-*")):
            m = re.fullmatch(r"lldb-(\d+)", os.path.basename(full))
            if m and os.access(full, os.X_OK):
                versioned.append((int(m.group(1)), full))
    if versioned:
        return max(versioned)[1]
    if sys.platform == "darwin" and shutil.which("xcrun"):
        path = first_line(["xcrun", "-f", "lldb"])  # a failure's message is no executable path
        if path and os.access(path, os.X_OK):
            return path
    return None


def print_setup(checks: list[Check] | None = None) -> None:
    """Show check_setup() as a table, then what to install for anything missing."""
    checks = check_setup() if checks is None else checks
    show(Table([(_("ok") if c.ok else _("MISSING"), c.what, c.found, c.needed_for) for c in checks],
               header=[_("status"), _("what"), _("what was found"), _("needed for")]))
    for c in checks:
        if not c.ok:
            print(f"\n-> {c.what}{_(': ')}{c.install}")
    if all(c.ok for c in checks):
        print(_("\nEverything the workbook uses is here."))
