"""Compiling the C kernel for this machine (introduced in lesson 00): the flags per CPU, the build
key, the compiler's run and its messages as a student should read them. ``lessonkit.native`` checks
and loads what is compiled here.

Why our own compiler call instead of cffi's setuptools build: a student edits ``native/*.c`` and
re-runs a cell, so we need (1) the compiler's messages captured and shown in the notebook, (2) a new
file name for every version of the source, because a library loaded into a process is never
unloaded, and (3) the exact flags per CPU, including a ``-O0 -g`` build that gdb can step through.
The sources are read once into memory, hashed, and compiled from a private copy of those bytes, so a
file saved during a build cannot slip in under the old hash; the hash includes the compiler, the
flags and what ``-march=native`` resolved to on this CPU, so a checkout moved to another machine
rebuilds instead of dying of SIGILL."""
from __future__ import annotations

import errno
import hashlib
import numbers
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from . import objects
from .language import _

REPO_DIR = Path(__file__).resolve().parents[2]
NATIVE_DIR = REPO_DIR / "native"
HEADER = "flash_attn_q8.h"
COMPILE_TIMEOUT_S = 300.0
MAX_ERRORS_SHOWN = 3     # compiler errors shown in a BuildError: the first one is the one to fix

# Build-time tunables of native/ and the values they may take. FA_TILE sizes arrays on the stack
# (0 would never advance the token loop); FA_PREFETCH is added to a token index in C int.
DEFINES = {"FA_TILE": (1, 256), "FA_PREFETCH": (0, 1024)}


class BuildError(RuntimeError):
    """The C sources did not compile (the message starts with the compiler's first error), or
    the build could not run at all (no compiler, no SIMDe headers, a folder that cannot be
    written); the message says what to do."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback: the student reads the compiler's first error
        # first, not twenty lines of library frames above it.
        return [*str(self).splitlines(), f"({type(self).__module__.split('.')[0]}.{type(self).__name__})"]


class KernelCheckError(BuildError):
    """A new build compiled but failed its check in a child process: it crashed (the signal is
    named), did not finish in time, or computed a wrong result (which one, by how much). It was
    not loaded; what was loaded before keeps working."""


class BuildWarning(UserWarning):
    """The C sources compiled, with compiler warnings (shown once per process and library)."""


# ----------------------------------------------------------------------------- what to compile

def compiler() -> str:
    """The C compiler: $CC if set, else cc."""
    cc = os.environ.get("CC", "cc")
    if not cc.strip():
        raise BuildError(_("CC is set to an empty string, so there is no compiler to call. Unset it (`unset CC` in "
                           "the shell, or `os.environ.pop('CC')` in the notebook) or set it to a compiler such as "
                           "cc, gcc or clang."))
    if shutil.which(cc.split()[0]) is None:
        raise BuildError(_("No C compiler found (looked for {cc!r}). Install one: Debian/Ubuntu `sudo apt install "
                           "build-essential`, macOS `xcode-select --install`, conda `conda install -c conda-forge "
                           "c-compiler`.").format(cc=cc))
    return cc


def _cpu_has_dotprod() -> bool:
    """ARMv8.2 dot product (sdot): 'asimddp' in /proc/cpuinfo on Linux, FEAT_DotProd on macOS.
    ``LESSONKIT_DOTPROD=1`` or ``=0`` overrides the detection (emulators and containers whose
    /proc/cpuinfo is not the CPU's: ``make build DOTPROD=0``)."""
    forced = os.environ.get("LESSONKIT_DOTPROD", "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise BuildError(_("LESSONKIT_DOTPROD must be 1 (build with sdot) or 0 (without); got {forced!r}").format(
                               forced=forced))
        return forced == "1"
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_DotProd"],
                                 capture_output=True, text=True, check=False, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        # macOS 11 has no FEAT_* keys; every Apple Silicon chip (M1 and later) has the dot product
        return out == "1" if out in ("0", "1") else platform.machine() == "arm64"
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


# aarch64's two paths: with the dot-product instruction (sdot), or the plain NEON fallback
AARCH64_MARCH = {True: "-march=armv8.2-a+dotprod", False: "-march=armv8-a"}
AARCH64_CC = "aarch64-linux-gnu-gcc"  # the cross compiler (Debian: gcc-aarch64-linux-gnu) of the ARM listings


def aarch64_flags(dotprod: bool) -> list[str]:
    """The -O3 flags of the aarch64 build (compile_flags on an ARM board), for an assembly listing (lesson 04's
    lines of ARM code, workbench's A76 estimates)."""
    return [*language_flags(), AARCH64_MARCH[dotprod]]


def arch_flags(dotprod: bool | None = None) -> list[str]:
    """Flags that pick the kernel's path on this CPU.

    aarch64: real NEON, with ``sdot`` where the CPU has it (``dotprod=False`` forces the fallback).
    Elsewhere: SIMDe's portable NEON, with the host's vector units (``-march=native``)."""
    if is_arm64():
        if dotprod is None:
            dotprod = _cpu_has_dotprod()
        return [AARCH64_MARCH[bool(dotprod)]]
    inc = simde_include_dir()
    if inc is None:
        raise BuildError(_("SIMDe headers not found: on this CPU the NEON intrinsics are compiled through SIMDe. "
                           "Install them with `pip install cmeel-simde` (done by `make lab`), `conda install -c "
                           "conda-forge simde`, or `sudo apt install libsimde-dev`; or point SIMDE_INCLUDE_DIR at "
                           "the folder that holds simde/."))
    flags = [f"-I{inc}"]
    if platform.machine().lower() in ("x86_64", "amd64"):
        flags.append("-march=native")
    return flags


def check_defines(defines: dict | None) -> dict:
    """Build defines as ``{name: int}``, each within its stated range (``DEFINES``); raises
    ValueError/TypeError before anything is compiled."""
    if defines is None:
        return {}
    if not isinstance(defines, dict):
        raise TypeError(_("defines must be a dict such as {{'FA_PREFETCH': 0}}; got {defines}").format(
                          defines=type(defines).__name__))
    checked = {}
    for name, value in defines.items():
        if name not in DEFINES:
            known = ", ".join(f"{n} ({lo}..{hi})" for n, (lo, hi) in DEFINES.items())
            raise ValueError(_("unknown build define {name!r}; the tunables of native/ are {known}").format(
                               name=name, known=known))
        lo, hi = DEFINES[name]
        value = value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            # a -D value goes into C source text: an int, nothing else
            raise TypeError(_("{name} must be an int; got {value} {value2!r:.60}").format(
                              name=name, value=type(value).__name__, value2=value))
        value = int(value)
        if not lo <= value <= hi:
            raise ValueError(_("{name} must be between {lo} and {hi}; got {value}").format(
                               name=name, lo=lo, hi=hi, value=value))
        checked[name] = value
    return checked


def sanitizer_flags() -> list[str]:
    """``LESSONKIT_SANITIZE=address,undefined`` builds every library with those sanitizers
    (``make test-asan-py``); the process must then preload the sanitizer runtime."""
    value = os.environ.get("LESSONKIT_SANITIZE", "").strip()
    if not value:
        return []
    if not re.fullmatch(r"[a-z-]+(,[a-z-]+)*", value):
        raise BuildError(_("LESSONKIT_SANITIZE must look like 'address,undefined'; got {value!r}").format(
                           value=value))
    if "address" in value.split(",") and not _asan_runtime_loaded():
        raise BuildError(_("LESSONKIT_SANITIZE={value} builds the kernel with AddressSanitizer, and such a library "
                           "loads only into a process started with the sanitizer's runtime: start Python with "
                           "LD_PRELOAD=$(cc -print-file-name=libasan.so) (as make test-asan-py does), or unset "
                           "LESSONKIT_SANITIZE (os.environ.pop('LESSONKIT_SANITIZE')).").format(value=value))
    return [f"-fsanitize={value}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]


def _asan_runtime_loaded() -> bool:
    """Is AddressSanitizer's runtime in this process (preloaded: it must come first)? Linux lists the
    process's libraries in /proc/self/maps; where that cannot be read, assume it is."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return True
    return "libasan" in maps or "libclang_rt.asan" in maps


def compile_flags(debug: bool = False, dotprod: bool | None = None,
                  defines: dict | None = None) -> list[str]:
    """Every flag of a build, in order (without sources and output). ``defines`` become
    ``-DNAME=VALUE``, e.g. ``{"FA_PREFETCH": 0}`` for a build without software prefetch."""
    macros = [f"-D{name}={value}" for name, value in sorted(check_defines(defines).items())]
    return [*language_flags(debug), "-shared", *macros, *arch_flags(dotprod), *sanitizer_flags()]


def language_flags(debug: bool = False) -> list[str]:
    """The flags of every build that do not depend on the CPU: C dialect, optimization, PIC,
    warnings (also what aarch64_flags adds -march to)."""
    opt = ["-O0", "-g", "-fno-omit-frame-pointer"] if debug else ["-O3"]
    return ["-std=gnu11", *opt, "-fPIC", "-Wall"]


# ----------------------------------------------------------------------------- the build key

_identities: dict[tuple, bytes] = {}


def _compiler_identity(cc: str, flags: list[str]) -> bytes:
    """The compiler's version and every macro it predefines with these flags: with
    ``-march=native`` that lists the CPU's features (__AVX512F__, __ARM_FEATURE_DOTPROD, ...),
    so the build key changes when the checkout moves to another CPU. Cached per process."""
    arch = tuple(f for f in flags if f.startswith(("-m", "-f")) or f.startswith("-std"))
    key = (cc, arch)
    if key not in _identities:
        try:
            version = subprocess.run([*cc.split(), "--version"], capture_output=True, text=True,
                                     timeout=60).stdout
            macros = subprocess.run([*cc.split(), *arch, "-dM", "-E", "-x", "c", os.devnull],
                                    capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as e:
            raise BuildError(_("Could not run the C compiler {cc!r}: {e}. Check that it is installed and runs from "
                               "a terminal (`cc --version`).").format(cc=cc, e=e)) from None
        _identities[key] = (version + "\0" + "\n".join(sorted(macros.splitlines()))).encode()
    return _identities[key]


def _read_sources(src_dir: Path) -> dict[str, bytes]:
    """The bytes of every ``*.c`` and ``*.h`` of src_dir, read once: what gets hashed is what gets
    compiled."""
    try:
        names = sorted(p.name for p in src_dir.iterdir() if p.suffix in (".c", ".h") and p.is_file())
        return {name: (src_dir / name).read_bytes() for name in names}
    except OSError as e:
        raise BuildError(_("Could not read the sources in {src_dir}: {strerror_e}. Check that the folder exists "
                           "and is readable.").format(src_dir=src_dir, strerror_e=e.strerror or e)) from None


def _fingerprint(src_dir: Path) -> tuple:
    """Cheap change detection: name, size and mtime of each source and header (one directory
    scan: load() runs it before every kernel call)."""
    try:
        with os.scandir(src_dir) as entries:
            files = [(e.name, e.stat()) for e in entries if e.name.endswith((".c", ".h")) and e.is_file()]
    except OSError:
        return ()
    return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in files))


def _build_key(sources: dict[str, bytes], cc: str, flags: list[str], extra: dict[str, bytes]) -> str:
    """A hash of everything that changes the binary: the source bytes, flags, compiler, CPU."""
    h = hashlib.sha256()
    h.update(_compiler_identity(cc, flags))
    h.update("\0".join(flags).encode())
    for name, data in [*sorted(sources.items()), *sorted(extra.items())]:
        h.update(name.encode() + b"\0" + data + b"\0")
    return h.hexdigest()[:16]


def build_dir_for(src_dir: Path) -> Path:
    """Where builds of src_dir go: ``$LESSONKIT_BUILD_DIR`` if set (``~`` expanded), else ``.build/``
    beside it. A setting that names no folder this process can make and write is refused here, by name."""
    raw = os.environ.get("LESSONKIT_BUILD_DIR", "").strip()
    if not raw:
        return src_dir.parent / ".build"
    folder, why = Path(raw), ""
    try:
        folder = folder.expanduser().resolve()
        folder.mkdir(parents=True, exist_ok=True)
        # a file made and removed, not os.access, which says yes to root even in /proc
        tempfile.NamedTemporaryFile(dir=folder, prefix=".lessonkit-probe-").close()
    except FileExistsError:
        why = _("it is a file, not a folder")
    except RuntimeError as e:  # expanduser of ~nosuchuser
        why = str(e)
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        why = getattr(e, "strerror", None) or str(e)
    if why:
        raise BuildError(_("LESSONKIT_BUILD_DIR={raw!r} names a folder lessonkit cannot build in ({folder}: {why}). "
                           "Set it to a folder you can write, e.g. os.environ['LESSONKIT_BUILD_DIR'] = "
                           "'/tmp/lessonkit-build', or unset it to build in .build/ beside native/.").format(
                           raw=raw, folder=folder, why=why))
    return folder


def seconds_setting(name: str, default: float, lo: float, hi: float) -> float:
    """The environment setting ``name`` as seconds between ``lo`` and ``hi`` (``default`` when unset);
    anything else (a word, 0, a negative number, nan) is refused with the setting's name."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not lo <= value <= hi:  # nan compares false: refused too
        raise BuildError(_("{name} must be a number of seconds between {lo:g} and {hi:g}; got {raw!r}. Fix it, or "
                           "unset it for the default of {default:g} s.").format(
                           name=name, lo=lo, hi=hi, raw=raw, default=default))
    return value


def build_program(main_source: Path | str, flags: list[str], stem: str,
                  src_dir: Path | str | None = None) -> Path:
    """Compile an executable from ``main_source`` and ``native/*.c`` with exactly ``flags``
    (e.g. the valgrind driver of lessonkit.traffic, built without AVX-512); cached like build().
    It runs in its own process, never in this one, so it is not checked like a library."""
    src_dir = _native_dir(src_dir)
    main_source = Path(main_source).resolve()
    try:
        main = {main_source.name: main_source.read_bytes()}
    except OSError as e:
        raise BuildError(_("Could not read {main_source}: {strerror_e}").format(
                           main_source=main_source, strerror_e=e.strerror or e)) from None
    cc = compiler()
    flags = ["-std=gnu11", *flags]
    sources = _read_sources(src_dir)
    key = _build_key(sources, cc, flags, {"main:" + k: v for k, v in main.items()})
    out = build_dir_for(src_dir) / f"{stem}_{key}"
    if out.is_file() and os.access(out, os.X_OK) and out.stat().st_size > 0:
        return out
    with _workspace(build_dir_for(src_dir)) as work:
        tmp_src = _write_copy(work, src_dir.name, {**sources, **main})
        tmp_out = work / "program"
        _run_compiler(cc, flags, tmp_src, [tmp_src / main_source.name, *_c_files(tmp_src, sources)],
                      tmp_out, src_dir)
        _publish(tmp_out, out)
    return out


def source_dir(src_dir) -> Path:
    """``src_dir`` as a resolved folder: None means the workbook's native/; an empty path is refused
    (``Path("")`` would quietly be the current folder, or, through ``or``, native/ itself)."""
    if src_dir is None:
        return NATIVE_DIR
    if isinstance(src_dir, (str, os.PathLike)) and not str(os.fspath(src_dir)).strip():
        raise ValueError(_("src_dir is an empty path. Give the folder of your copy of the kernel, e.g. "
                           "src_dir=lk.workspace.student_native(), or leave src_dir out for the workbook's "
                           "native/."))
    if not isinstance(src_dir, (str, os.PathLike)):
        raise TypeError(_("src_dir must be a folder (a str or a pathlib.Path); got {kind}").format(
                          kind=type(src_dir).__name__))
    try:
        return Path(src_dir).expanduser().resolve()
    except RuntimeError as e:  # ~nosuchuser
        raise ValueError(_("src_dir {src_dir!r}: {e}").format(src_dir=str(src_dir), e=e)) from None


def _native_dir(src_dir) -> Path:
    src_dir = source_dir(src_dir)
    if not (src_dir / HEADER).is_file():
        raise BuildError(_("{src_dir} has no {HEADER}: is this the workbook's native/ folder?").format(
                           src_dir=src_dir, HEADER=HEADER))
    return src_dir


def _c_files(folder: Path, sources: dict[str, bytes]) -> list[Path]:
    return [folder / name for name in sorted(sources) if name.endswith(".c")]


class _workspace:
    """A private temporary folder inside the build folder, removed whatever happens."""

    def __init__(self, build_dir: Path):
        self.build_dir = build_dir

    def __enter__(self) -> Path:
        try:
            self.build_dir.mkdir(parents=True, exist_ok=True)
            self.path = Path(tempfile.mkdtemp(prefix="tmp-", dir=self.build_dir))
        except OSError as e:
            raise _os_error(e, self.build_dir) from None
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _os_error(e: OSError, build_dir: Path) -> BuildError:
    """An OS error of the build as a BuildError that says what to do."""
    if e.errno == errno.ENOSPC:
        what = _("the disk is full. Free some space (`make clean` removes old builds) and run the cell again.")
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        what = _("this folder cannot be written (a read-only checkout?). Make it writable, or set "
                 "LESSONKIT_BUILD_DIR to a folder you can write, e.g. `os.environ['LESSONKIT_BUILD_DIR'] = "
                 "'/tmp/lessonkit-build'`.")
    elif e.errno == errno.ENOENT:
        what = _("a file or folder disappeared during the build (did `make clean` run at the same time?). Run the "
                 "cell again.")
    else:
        what = _("fix what the system's message names, then run the cell again.")
    return BuildError(_("Could not build in {build_dir}: {strerror_e} ({e}): {what}").format(
                        build_dir=build_dir, strerror_e=e.strerror or e, e=type(e).__name__, what=what))


def _write_copy(work: Path, name: str, sources: dict[str, bytes]) -> Path:
    folder = work / name
    try:
        folder.mkdir()
        for fname, data in sources.items():
            (folder / fname).write_bytes(data)
    except OSError as e:
        raise _os_error(e, work.parent) from None
    return folder


def _run_compiler(cc: str, flags: list[str], tmp_src: Path, sources: list[Path], out: Path,
                  src_dir: Path) -> str:
    """Compile; return the cleaned compiler warnings ('' if none), raise BuildError on errors."""
    # Debug information names the real source folder, not the private copy, so that gdb and lldb
    # list and break in the files the student reads. Only a build with debug information gets the map: it
    # names the student's folder, which would make a release build's kept objects (``objects.key`` hashes the
    # command line) differ per copy of native/, so that every new copy compiled all thirteen files again.
    prefix_map = [f"-fdebug-prefix-map={tmp_src}={src_dir}"] if "-g" in flags else []
    base = [*cc.split(), *flags, *prefix_map, f"-I{tmp_src}"]
    try:
        proc = _compile_and_link(base, sources, out, _compiler_identity(cc, flags))
    except subprocess.TimeoutExpired:
        raise BuildError(_("The compiler did not finish in {COMPILE_TIMEOUT_S:.0f} s; nothing new was loaded. Run "
                           "the cell again; if it happens again, restart the machine's compiler jobs.").format(
                           COMPILE_TIMEOUT_S=COMPILE_TIMEOUT_S)) from None
    except OSError as e:
        raise BuildError(_("Could not run the C compiler {cc!r}: {strerror_e}. Check `cc --version` in a terminal.").format(
                           cc=cc, strerror_e=e.strerror or e)) from None
    text = clean_compiler_output(proc.stderr, tmp_src, shown_dir(src_dir))
    if proc.returncode != 0:
        if not tmp_src.is_dir():
            raise BuildError(_("The build folder was removed while the compiler ran (did `make clean` run at the "
                               "same time?). Nothing new was loaded; run the cell again."))
        if "No space left on device" in proc.stderr:
            raise _os_error(OSError(errno.ENOSPC, "No space left on device"), out.parent.parent)
        if twice := re.search(r"multiple definition of [`'\u2018](\w+)", text):
            raise BuildError(_("{name} is defined twice when the library is linked. A helper function you add to "
                               "the kernel's file must be static (write `static` before its return type): the "
                               "traced build (flash_attn_q8_traced.c) compiles that file a second time, and two "
                               "non-static copies of one name clash. Nothing new was loaded.").format(
                               name=twice.group(1)))
        raise BuildError(first_errors(text) + _("\n\nThe C sources did not compile: fix the first error above and "
                                                "run the cell again. Nothing new was loaded; libraries loaded "
                                                "before keep working."))
    return text.strip()


def _compile_and_link(base: list[str], sources: list[Path], out: Path, identity: bytes, reuse: bool = True
                      ) -> subprocess.CompletedProcess:
    """Compile each source to an object file, as many at a time as the machine has cores, then link them into
    ``out``: a build takes about the time of its slowest file, not the sum. A file an earlier build compiled from
    the same bytes, includes and command line comes from ``objects`` (one that printed anything was not kept:
    warnings show on every build). Returns one result: the first failing step's return code (0 if none) and every
    step's messages in the order of ``sources`` (the first error shown is the same whatever finished first).
    Raises what subprocess.run raises (a time-out, a missing compiler)."""
    obj_dir, cache = out.parent / "obj", objects.folder(out)
    try:
        obj_dir.mkdir(exist_ok=True)
    except OSError as e:  # the build folder went away (`make clean` meanwhile): a failed step, named by the caller
        return subprocess.CompletedProcess([], 1, "", f"{obj_dir}: {e.strerror or e}\n")
    objs = [obj_dir / f"{i:02d}_{src.stem}.o" for i, src in enumerate(sources)]
    kept = [cache / f"{objects.key(identity, base, src, src.parent)}.o" for src in sources]
    reused = [reuse and objects.take(k, obj) for k, obj in zip(kept, objs)]

    def run(cmd):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)

    jobs = [[*base, "-c", str(src), "-o", str(obj)] for src, obj, r in zip(sources, objs, reused) if not r]
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        steps = list(pool.map(run, jobs))  # in order; re-raises a step's exception here
    failed = next((p.returncode for p in steps if p.returncode != 0), 0)
    if not failed:
        steps.append(run([*base, *map(str, objs), "-o", str(out), "-lm"]))
        failed = steps[-1].returncode
        if failed and any(reused) and objects.UNREADABLE.search(steps[-1].stderr):  # a kept object damaged since
            return _compile_and_link(base, sources, out, identity, reuse=False)
        compiled = [(obj, k) for obj, k, r in zip(objs, kept, reused) if not r]
        objects.keep(cache, [(obj, k) for (obj, k), step in zip(compiled, steps) if not step.stderr])
    return subprocess.CompletedProcess(jobs, failed, "", "".join(p.stderr for p in steps))


def _publish(tmp: Path, out: Path) -> None:
    try:
        os.replace(tmp, out)  # atomic: a concurrent loader sees the old file or the new, never half
    except OSError as e:
        raise _os_error(e, out.parent) from None


# ----------------------------------------------------------------------------- compiler messages

_DIAG = re.compile(r"^(?P<where>[^:\s][^:]*:\d+(?::\d+)?): (?P<kind>fatal error|error|warning|note): ")


def shown_dir(src_dir: Path) -> str:
    """The folder a student edited, as compiler messages name it: relative to the workbook
    (``my-work/native``, ``native``) when it is inside it, else by its own name (a lesson's temporary
    copy). The student is told never to edit native/, so an error in their copy must not say native/."""
    try:
        return Path(src_dir).resolve().relative_to(REPO_DIR).as_posix()
    except ValueError:
        return Path(src_dir).name


def clean_compiler_output(text: str, tmp_src: Path | None = None, name: str = "native") -> str:
    """The compiler's output as a student should read it: paths of the private build copy shown
    as ``name/`` (``shown_dir`` of the folder compiled: ``my-work/native/`` for the student's copy),
    long paths of installed headers shortened, lines that only say where a file was included from
    dropped (the traced build includes the kernel a second time)."""
    if tmp_src is not None:
        text = text.replace(str(tmp_src) + os.sep, name + "/")
    inc = simde_include_dir() if not is_arm64() else None
    if inc is not None:
        text = text.replace(str(inc) + os.sep, "<SIMDe>/")
    text = re.sub(r"\S*/site-packages/", "<site-packages>/", text)
    keep = [l for l in text.splitlines()
            if not re.match(r"^\s*(In file included from|from) \S", l)
            and not re.match(r"^[^:\s]+: In (function|member function)", l)
            and not re.match(r"^\S+\.(c|h): At top level:", l)]
    return "\n".join(keep)


def _diagnostics(text: str) -> list[tuple[str, str, list[str]]]:
    """(kind, header, lines) per diagnostic: its header line and the source excerpt under it."""
    diags: list[tuple[str, str, list[str]]] = []
    for line in text.splitlines():
        m = _DIAG.match(line)
        if m:
            diags.append((m.group("kind"), line, [line]))
        elif diags:
            diags[-1][2].append(line)
        elif line.strip():
            diags.append(("other", line, [line]))
    return diags


def first_errors(text: str, keep: int = MAX_ERRORS_SHOWN) -> str:
    """The first ``keep`` distinct errors of cleaned compiler output, each with its source excerpt
    and notes; the same error seen twice (the traced build compiles the kernel again) once."""
    seen, shown, hidden = set(), [], 0
    current_error = False
    for kind, header, lines in _diagnostics(text):
        if kind in ("error", "fatal error"):
            current_error = header not in seen
            if not current_error:
                continue
            seen.add(header)
            if len(shown) >= keep:
                hidden += 1
                current_error = False
                continue
            shown.append(lines)
        elif kind == "note" and current_error and shown:
            shown[-1] = shown[-1] + lines
    if not shown:  # no error with a file and line (a linker error, say): the output as it is
        return "\n".join(text.splitlines()[:30])
    out = "\n".join(l for block in shown for l in block)
    if hidden:
        out += "\n" + (_("... and 1 more error (fix the first one first)") if hidden == 1 else
                       _("... and {hidden} more errors (fix the first one first)").format(hidden=hidden))
    return out


def _show_warnings(text: str) -> None:
    """Compiler warnings of a library that did build: an uninitialized variable is what a student
    needs to see. Shown at the first warning's file and line, once per process and library."""
    diags, seen = [], set()
    for d in _diagnostics(text):
        if d[0] == "warning" and d[1] not in seen:  # once: the traced build compiles the kernel again
            seen.add(d[1])
            diags.append(d)
    if not diags:
        return
    where = _DIAG.match(diags[0][1]).group("where").split(":")
    body = "\n".join(l for d in diags[:MAX_ERRORS_SHOWN] for l in d[2])
    more = len(diags) - MAX_ERRORS_SHOWN
    msg = (_("the C sources compiled, with warnings:\n") + body
           + (_("\n... and {more} more warnings").format(more=more) if more > 0 else ""))
    warnings.warn_explicit(BuildWarning(msg), BuildWarning, where[0], int(where[1]))
