"""Build the C kernel for this machine and load it with cffi (introduced in lesson 00).

Why our own compiler call instead of cffi's setuptools build: a student edits ``native/*.c`` and
re-runs a cell, so we need (1) the compiler's messages captured and shown in the notebook, not
lost on the terminal, (2) a new file name for every version of the source, because a library
loaded into a process is never unloaded, and (3) the exact flags per CPU, including a ``-O0 -g``
build that gdb can step through. cffi's ABI mode (``ffi.dlopen``) loads the result.

    ffi, lib = load()            # fast build, rebuilt whenever a file in native/ changed
    ffi, lib = load(debug=True)  # -O0 -g build for debuggers
    backend()                    # "neon+dotprod", "neon" or "simde-x86_64": what was compiled
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import cffi

REPO_DIR = Path(__file__).resolve().parent.parent
NATIVE_DIR = REPO_DIR / "native"
HEADER = "flash_attn_q8.h"


class BuildError(RuntimeError):
    """The C sources did not compile (the message holds the compiler's output) or no compiler
    or SIMDe headers were found (the message says what to install)."""


# ----------------------------------------------------------------------------- what to compile

def compiler() -> str:
    """The C compiler: $CC if set, else cc."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc.split()[0]) is None:
        raise BuildError(
            f"No C compiler found (looked for {cc!r}). Install one: Debian/Ubuntu "
            "`sudo apt install build-essential`, macOS `xcode-select --install`, conda "
            "`conda install -c conda-forge c-compiler`.")
    return cc


def _cpu_has_dotprod() -> bool:
    """ARMv8.2 dot product (sdot): 'asimddp' in /proc/cpuinfo on Linux, FEAT_DotProd on macOS."""
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_DotProd"],
                                 capture_output=True, text=True, check=False).stdout
            return out.strip() == "1"
        except OSError:
            return False
    try:
        return "asimddp" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def simde_include_dir() -> Path | None:
    """Where SIMDe's headers are: pip's cmeel-simde, conda's simde, or the system's."""
    candidates = []
    if os.environ.get("SIMDE_INCLUDE_DIR"):
        candidates.append(Path(os.environ["SIMDE_INCLUDE_DIR"]))
    for key in ("purelib", "platlib"):
        candidates.append(Path(sysconfig.get_paths()[key]) / "cmeel.prefix" / "include")
    for prefix in (sys.prefix, os.environ.get("CONDA_PREFIX")):
        if prefix:
            candidates.append(Path(prefix) / "include")
    candidates += [Path("/usr/include"), Path("/usr/local/include"), Path("/opt/homebrew/include")]
    for c in candidates:
        if (c / "simde" / "arm" / "neon.h").is_file():
            return c
    return None


def is_arm64() -> bool:
    return platform.machine().lower() in ("aarch64", "arm64")


def arch_flags(dotprod: bool | None = None) -> list[str]:
    """Flags that pick the kernel's path on this CPU.

    aarch64: real NEON, with ``sdot`` where the CPU has it (``dotprod=False`` forces the fallback).
    Elsewhere: SIMDe's portable NEON, with the host's vector units (``-march=native``)."""
    if is_arm64():
        if dotprod is None:
            dotprod = _cpu_has_dotprod()
        return ["-march=armv8.2-a+dotprod" if dotprod else "-march=armv8-a"]
    inc = simde_include_dir()
    if inc is None:
        raise BuildError(
            "SIMDe headers not found: on this CPU the NEON intrinsics are compiled through SIMDe. "
            "Install them with `pip install cmeel-simde` (done by `make lab`), "
            "`conda install -c conda-forge simde`, or `sudo apt install libsimde-dev`; "
            "or point SIMDE_INCLUDE_DIR at the folder that holds simde/.")
    flags = [f"-I{inc}"]
    if platform.machine().lower() in ("x86_64", "amd64"):
        flags.append("-march=native")
    return flags


def compile_flags(debug: bool = False, dotprod: bool | None = None,
                  defines: dict | None = None) -> list[str]:
    """Every flag of a build, in order (without sources and output). ``defines`` become
    ``-DNAME=VALUE``, e.g. ``{"FA_PREFETCH": 0}`` for a build without software prefetch."""
    opt = ["-O0", "-g", "-fno-omit-frame-pointer"] if debug else ["-O3"]
    macros = [f"-D{name}={value}" for name, value in sorted((defines or {}).items())]
    return ["-std=gnu11", *opt, "-fPIC", "-shared", "-Wall", *macros, *arch_flags(dotprod)]


# ----------------------------------------------------------------------------- build

def _sources(src_dir: Path) -> list[Path]:
    return sorted(src_dir.glob("*.c"))


def _fingerprint(src_dir: Path) -> tuple:
    """Cheap change detection: name, size and mtime of each source and header (one directory
    scan, no path globbing: load() runs it before every kernel call)."""
    with os.scandir(src_dir) as entries:
        files = [(e.name, e.stat()) for e in entries if e.name.endswith((".c", ".h")) and e.is_file()]
    return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in files))


def _build_key(src_dir: Path, cc: str, flags: list[str], more_files: list[Path] = ()) -> str:
    """A hash of everything that changes the binary: sources, headers, flags, compiler version."""
    h = hashlib.sha256()
    version = subprocess.run([*cc.split(), "--version"], capture_output=True, text=True).stdout
    h.update(version.encode())
    h.update("\0".join(flags).encode())
    for f in [*sorted([*src_dir.glob("*.c"), *src_dir.glob("*.h")]), *more_files]:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build(debug: bool = False, dotprod: bool | None = None, defines: dict | None = None,
          src_dir: Path | str | None = None, build_dir: Path | str | None = None) -> Path:
    """Compile ``native/*.c`` into a shared library and return its path.

    The library goes to ``.build/`` beside ``native/`` unless build_dir says otherwise; its
    file name carries a hash of the sources and flags, so an unchanged tree is not compiled
    again and an edited one gets a new file that can be loaded beside the old one.
    Raises BuildError with the compiler's messages when the sources do not compile."""
    flags = compile_flags(debug, dotprod, defines)
    return _compile(flags, [], f"libflash_attn_q8{'_debug' if debug else ''}", ".so", src_dir, build_dir)


def build_program(main_source: Path | str, flags: list[str], stem: str,
                  src_dir: Path | str | None = None) -> Path:
    """Compile an executable from ``main_source`` and ``native/*.c`` with exactly ``flags``
    (e.g. the valgrind driver of lessonkit.traffic, built without AVX-512); cached like build()."""
    return _compile(["-std=gnu11", *flags], [Path(main_source)], stem, "", src_dir, None)


def _compile(flags: list[str], extra_sources: list[Path], stem: str, suffix: str,
             src_dir: Path | str | None, build_dir: Path | str | None) -> Path:
    src_dir = Path(src_dir or NATIVE_DIR).resolve()
    build_dir = Path(build_dir).resolve() if build_dir else src_dir.parent / ".build"
    if not (src_dir / HEADER).is_file():
        raise BuildError(f"{src_dir} has no {HEADER}: is this the workbook's native/ folder?")
    cc = compiler()
    sources = [*extra_sources, *_sources(src_dir)]
    key = _build_key(src_dir, cc, flags + [str(p) for p in extra_sources],
                     [p for p in extra_sources if p.parent != src_dir])
    out = build_dir / f"{stem}_{key}{suffix}"
    if out.is_file():
        return out
    build_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=build_dir, suffix=suffix + ".tmp")
    os.close(fd)
    cmd = [*cc.split(), *flags, f"-I{src_dir}", *map(str, sources), "-o", tmp, "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        messages = proc.stderr.replace(str(src_dir) + os.sep, "native/")
        raise BuildError("The C sources did not compile; nothing new was loaded, and libraries "
                         "loaded before keep working.\n\n" + _first_errors(messages))
    os.replace(tmp, out)  # atomic: a concurrent loader sees no half-written file
    return out


def _first_errors(messages: str, keep: int = 40) -> str:
    """The compiler's output, cut to its first errors: the first one is the one to fix."""
    lines = messages.strip().splitlines()
    first = next((i for i, l in enumerate(lines) if re.search(r"\berror\b", l)), 0)
    start = max(0, first - 2)
    cut = lines[start:start + keep]
    more = len(lines) - start - len(cut)
    return "\n".join(cut) + (f"\n... ({more} more lines)" if more > 0 else "")


# ----------------------------------------------------------------------------- load

_ffis: dict[str, cffi.FFI] = {}
_libs: dict[Path, object] = {}
_current: dict[tuple, tuple] = {}  # (src_dir, debug, dotprod, defines) -> (fingerprint, ffi, lib, path)


def _ffi_for(src_dir: Path) -> cffi.FFI:
    """One FFI per text of the header: its non-preprocessor lines are the cdef."""
    text = (src_dir / HEADER).read_text()
    if text not in _ffis:
        ffi = cffi.FFI()
        ffi.cdef("\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
        _ffis[text] = ffi
    return _ffis[text]


def load(debug: bool = False, dotprod: bool | None = None, defines: dict | None = None,
         src_dir: Path | str | None = None):
    """Return ``(ffi, lib)`` for the current sources, building first if they changed.

    Cheap to call before every kernel call: it only looks at file sizes and times unless
    something changed. A library loaded earlier stays valid for as long as you hold it."""
    src_dir = Path(src_dir or NATIVE_DIR).resolve()
    slot = (src_dir, debug, dotprod, tuple(sorted((defines or {}).items())))
    fp = _fingerprint(src_dir)
    cur = _current.get(slot)
    if cur is not None and cur[0] == fp:
        return cur[1], cur[2]
    path = build(debug=debug, dotprod=dotprod, defines=defines, src_dir=src_dir)
    ffi = _ffi_for(src_dir)
    if path not in _libs:
        _libs[path] = ffi.dlopen(str(path))
    _current[slot] = (fp, ffi, _libs[path], path)
    return ffi, _libs[path]


def library_path(debug: bool = False, dotprod: bool | None = None) -> Path:
    """The file of the library that load() gives, e.g. for gdb or valgrind."""
    load(debug=debug, dotprod=dotprod)
    return _current[(NATIVE_DIR.resolve(), debug, dotprod, ())][3]


def backend(debug: bool = False, dotprod: bool | None = None) -> str:
    """The compiled path, as the library itself reports it: "neon+dotprod", "neon", "simde-x86_64"."""
    ffi, lib = load(debug=debug, dotprod=dotprod)
    return ffi.string(lib.fa_backend()).decode()


def simd_paths(debug: bool = False) -> dict[str, str]:
    """The branch each SIMD helper of native/q8_simd.h compiled to, e.g.
    ``{"dot": "avx2", "vkq": "avx512", "exp": "inline", "addv": "ssse3"}`` (lesson 04)."""
    ffi, lib = load(debug=debug)
    return dict(item.split("=") for item in ffi.string(lib.fa_simd_paths()).decode().split())
