"""Build the C kernel for this machine and load it with cffi (introduced in lesson 00).

Why our own compiler call instead of cffi's setuptools build: a student edits ``native/*.c`` and
re-runs a cell, so we need (1) the compiler's messages captured and shown in the notebook, not
lost on the terminal, (2) a new file name for every version of the source, because a library
loaded into a process is never unloaded, and (3) the exact flags per CPU, including a ``-O0 -g``
build that gdb can step through. cffi's ABI mode (``ffi.dlopen``) loads the result.

    ffi, lib = load()            # fast build, rebuilt whenever a file in native/ changed
    ffi, lib = load(debug=True)  # -O0 -g build for debuggers
    backend()                    # "neon+dotprod", "neon" or "simde-x86_64": what was compiled

A student's Jupyter process holds their unsaved work, so a build never reaches it unproven:

- the sources are read once into memory, hashed, and compiled from a private copy of those bytes,
  so the file name of a library always names exactly what was compiled (a file saved during a
  build cannot slip in under the old hash);
- the hash includes the compiler, the flags and what ``-march=native`` resolved to on this CPU,
  so a checkout moved to another machine rebuilds instead of dying of SIGILL;
- every new library is first run in a child process (``lessonkit/smoke.py``) against the
  engine's quantized math on a few small caches, with a timeout; a crash, a hang or a wrong
  result there becomes a ``KernelCheckError`` here and nothing is loaded;
- a library in ``.build/`` is loaded only if its bytes are the ones that passed that check
  (their SHA-256 is recorded beside it); an empty or truncated file is rebuilt.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from pathlib import Path

import cffi

from . import validate as check
from .language import language, tr

REPO_DIR = Path(__file__).resolve().parent.parent
NATIVE_DIR = REPO_DIR / "native"
HEADER = "flash_attn_q8.h"
SMOKE_SCRIPT = Path(__file__).resolve().parent / "smoke.py"

# How long the check of a new build may run in its child process before it counts as a hang.
# It takes about a second; the margin is for a slow board or a loaded machine.
SMOKE_TIMEOUT_S = float(os.environ.get("LESSONKIT_SMOKE_TIMEOUT", "60"))
COMPILE_TIMEOUT_S = 300.0
KEEP_BUILDS = 6          # newest libraries kept per kind (fast, debug, ...); older ones are pruned
MAX_ERRORS_SHOWN = 3     # compiler errors shown in a BuildError: the first one is the one to fix

# Build-time tunables of native/ and the values they may take. FA_TILE sizes arrays on the stack
# (0 would never advance the token loop); FA_PREFETCH is added to a token index in C int.
DEFINES = {"FA_TILE": (1, 256), "FA_PREFETCH": (0, 1024)}

# What the check in the child process may run: every new build is checked for results, crashes
# and hangs; "crashes" still catches crashes and hangs but lets wrong results through (with a
# warning), for a kernel broken on purpose (lesson 06); "skip" loads without any check.
VERIFY_LEVELS = ("skip", "crashes", "results")


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
        raise BuildError(tr("CC is set to an empty string, so there is no compiler to call. Unset it "
                            "(`unset CC` in the shell, or `os.environ.pop('CC')` in the notebook) or set "
                            "it to a compiler such as cc, gcc or clang.",
                            "CC 被设成了空字符串，所以没有编译器可调用。请取消它（在 shell 里 `unset CC`，"
                            "或在 notebook 里 `os.environ.pop('CC')`），或把它设成一个编译器，比如 cc、gcc 或 clang。"))
    if shutil.which(cc.split()[0]) is None:
        raise BuildError(tr(
            f"No C compiler found (looked for {cc!r}). Install one: Debian/Ubuntu "
            "`sudo apt install build-essential`, macOS `xcode-select --install`, conda "
            "`conda install -c conda-forge c-compiler`.",
            f"找不到 C 编译器（找的是 {cc!r}）。请装一个：Debian/Ubuntu 用 "
            "`sudo apt install build-essential`，macOS 用 `xcode-select --install`，conda 用 "
            "`conda install -c conda-forge c-compiler`。"))
    return cc


def _cpu_has_dotprod() -> bool:
    """ARMv8.2 dot product (sdot): 'asimddp' in /proc/cpuinfo on Linux, FEAT_DotProd on macOS.
    ``LESSONKIT_DOTPROD=1`` or ``=0`` overrides the detection (emulators and containers whose
    /proc/cpuinfo is not the CPU's: ``make build DOTPROD=0``)."""
    forced = os.environ.get("LESSONKIT_DOTPROD", "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise BuildError(tr(f"LESSONKIT_DOTPROD must be 1 (build with sdot) or 0 (without); got {forced!r}",
                                f"LESSONKIT_DOTPROD 必须是 1（用 sdot 构建）或 0（不用）；现在是 {forced!r}"))
        return forced == "1"
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_DotProd"],
                                 capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
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
        raise BuildError(tr(
            "SIMDe headers not found: on this CPU the NEON intrinsics are compiled through SIMDe. "
            "Install them with `pip install cmeel-simde` (done by `make lab`), "
            "`conda install -c conda-forge simde`, or `sudo apt install libsimde-dev`; "
            "or point SIMDE_INCLUDE_DIR at the folder that holds simde/.",
            "找不到 SIMDe 的头文件：在这种 CPU 上，NEON intrinsics 要经过 SIMDe 编译。"
            "请用 `pip install cmeel-simde`（`make lab` 会做这一步）、"
            "`conda install -c conda-forge simde` 或 `sudo apt install libsimde-dev` 安装；"
            "或者让 SIMDE_INCLUDE_DIR 指向包含 simde/ 的文件夹。"))
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
        raise TypeError(tr(f"defines must be a dict such as {{'FA_PREFETCH': 0}}; got {type(defines).__name__}",
                           f"defines 应是一个 dict，比如 {{'FA_PREFETCH': 0}}；你给的是 {type(defines).__name__}"))
    checked = {}
    for name, value in defines.items():
        if name not in DEFINES:
            known = ", ".join(f"{n} ({lo}..{hi})" for n, (lo, hi) in DEFINES.items())
            raise ValueError(tr(f"unknown build define {name!r}; the tunables of native/ are {known}",
                                f"未知的构建宏 {name!r}；native/ 可调的宏是 {known}"))
        lo, hi = DEFINES[name]
        value = check.integer(name, value)  # a -D value goes into C source text: an int, nothing else
        if not lo <= value <= hi:
            raise ValueError(tr(f"{name} must be between {lo} and {hi}; got {value}",
                                f"{name} 必须在 {lo} 到 {hi} 之间；你给的是 {value}"))
        checked[name] = value
    return checked


def sanitizer_flags() -> list[str]:
    """``LESSONKIT_SANITIZE=address,undefined`` builds every library with those sanitizers
    (``make test-asan-py``); the process must then preload the sanitizer runtime."""
    value = os.environ.get("LESSONKIT_SANITIZE", "").strip()
    if not value:
        return []
    if not re.fullmatch(r"[a-z-]+(,[a-z-]+)*", value):
        raise BuildError(tr(f"LESSONKIT_SANITIZE must look like 'address,undefined'; got {value!r}",
                            f"LESSONKIT_SANITIZE 的格式应像 'address,undefined'；现在是 {value!r}"))
    return [f"-fsanitize={value}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]


def compile_flags(debug: bool = False, dotprod: bool | None = None,
                  defines: dict | None = None) -> list[str]:
    """Every flag of a build, in order (without sources and output). ``defines`` become
    ``-DNAME=VALUE``, e.g. ``{"FA_PREFETCH": 0}`` for a build without software prefetch."""
    macros = [f"-D{name}={value}" for name, value in sorted(check_defines(defines).items())]
    return [*language_flags(debug), "-shared", *macros, *arch_flags(dotprod), *sanitizer_flags()]


def language_flags(debug: bool = False) -> list[str]:
    """The flags of every build that do not depend on the CPU: C dialect, optimization, PIC,
    warnings (also what lessonkit.cycles compiles the aarch64 assembly with)."""
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
            raise BuildError(tr(f"Could not run the C compiler {cc!r}: {e}. Check that it is installed "
                                "and runs from a terminal (`cc --version`).",
                                f"无法运行 C 编译器 {cc!r}：{e}。请检查它已安装，并能在终端里运行"
                                "（`cc --version`）。")) from None
        _identities[key] = (version + "\0" + "\n".join(sorted(macros.splitlines()))).encode()
    return _identities[key]


def _read_sources(src_dir: Path) -> dict[str, bytes]:
    """The bytes of every ``*.c`` and ``*.h`` of src_dir, read once: what gets hashed is what gets
    compiled."""
    try:
        names = sorted(p.name for p in src_dir.iterdir() if p.suffix in (".c", ".h") and p.is_file())
        return {name: (src_dir / name).read_bytes() for name in names}
    except OSError as e:
        raise BuildError(tr(f"Could not read the sources in {src_dir}: {e.strerror or e}. "
                            "Check that the folder exists and is readable.",
                            f"无法读取 {src_dir} 里的源码：{e.strerror or e}。请检查这个文件夹存在并且可读。")) from None


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


# ----------------------------------------------------------------------------- build

def build_dir_for(src_dir: Path) -> Path:
    """Where builds of src_dir go: ``$LESSONKIT_BUILD_DIR`` if set, else ``.build/`` beside it."""
    env = os.environ.get("LESSONKIT_BUILD_DIR", "").strip()
    return Path(env).resolve() if env else src_dir.parent / ".build"


def build(debug: bool = False, dotprod: bool | None = None, defines: dict | None = None,
          src_dir: Path | str | None = None, build_dir: Path | str | None = None,
          verify: str = "results") -> Path:
    """Compile ``native/*.c`` into a shared library, check it in a child process, and return its path.

    The library goes to ``.build/`` beside ``native/`` unless build_dir says otherwise; its
    file name carries a hash of the sources and flags, so an unchanged tree is not compiled
    again and an edited one gets a new file that can be loaded beside the old one.
    Raises BuildError with the compiler's first errors when the sources do not compile, and
    KernelCheckError when the new library crashes, hangs or computes wrong results in its check
    (see ``verify`` of ``load``)."""
    return _build(debug, dotprod, defines, src_dir, build_dir, verify)[0]


def _build(debug, dotprod, defines, src_dir, build_dir, verify) -> tuple[Path, dict]:
    """build(), also returning the library's record (what load() needs to load it)."""
    if verify not in VERIFY_LEVELS:
        raise ValueError(tr(f"verify must be one of {', '.join(map(repr, VERIFY_LEVELS))}; got {verify!r}",
                            f"verify 必须是 {', '.join(map(repr, VERIFY_LEVELS))} 之一；你给的是 {verify!r}"))
    flags = compile_flags(debug, dotprod, defines)
    return _library(flags, f"libflash_attn_q8{'_debug' if debug else ''}", src_dir, build_dir, verify)


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
        raise BuildError(tr(f"Could not read {main_source}: {e.strerror or e}",
                            f"无法读取 {main_source}：{e.strerror or e}")) from None
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


def _native_dir(src_dir) -> Path:
    src_dir = Path(src_dir or NATIVE_DIR).resolve()
    if not (src_dir / HEADER).is_file():
        raise BuildError(tr(f"{src_dir} has no {HEADER}: is this the workbook's native/ folder?",
                            f"{src_dir} 里没有 {HEADER}：这是本项目的 native/ 文件夹吗？"))
    return src_dir


def _c_files(folder: Path, sources: dict[str, bytes]) -> list[Path]:
    return [folder / name for name in sorted(sources) if name.endswith(".c")]


def _library(flags: list[str], stem: str, src_dir, build_dir, verify: str) -> tuple[Path, dict]:
    """The checked library of these flags and the current sources, built if needed, and its record:
    the SHA-256 it passed its check with, the header it was compiled with, the compiler's
    warnings, the check's level and failures."""
    src_dir = _native_dir(src_dir)
    build_dir = Path(build_dir).resolve() if build_dir else build_dir_for(src_dir)
    cc = compiler()
    sources = _read_sources(src_dir)
    key = _build_key(sources, cc, flags, {})
    out = build_dir / f"{stem}_{key}.so"
    header = sources[HEADER].decode(errors="replace")

    record = _read_record(out)
    if record is not None and _level_ok(record, verify):
        return out, record
    if record is None and (shared := _prebuilt(out.name, verify)):
        return shared
    if record is not None:  # built and intact, but checked less than now asked: check it again
        result = _smoke(out, header, verify)
        record = {**record, **result}
        _write_record(out, record)
        _judge(result, verify)
        return out, record

    with _workspace(build_dir) as work:
        tmp_src = _write_copy(work, src_dir.name, sources)
        tmp_lib = work / "lib.so"
        messages = _run_compiler(cc, flags, tmp_src, _c_files(tmp_src, sources), tmp_lib, src_dir)
        result = _smoke(tmp_lib, header, verify)
        _judge(result, verify)  # raises before anything is published
        _publish(tmp_lib, out)
        record = {"sha256": _sha256(out), "warnings": messages, "header": header, **result}
        _write_record(out, record)
    _prune(build_dir, stem)
    return out, record


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
        what = tr("the disk is full. Free some space (`make clean` removes old builds) and run the cell again.",
                  "磁盘满了。请腾出一些空间（`make clean` 会删掉旧的构建），再运行这个单元。")
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        what = tr("this folder cannot be written (a read-only checkout?). Make it writable, or set "
                  "LESSONKIT_BUILD_DIR to a folder you can write, e.g. "
                  "`os.environ['LESSONKIT_BUILD_DIR'] = '/tmp/lessonkit-build'`.",
                  "这个文件夹不能写（只读的检出？）。请让它可写，或者把 LESSONKIT_BUILD_DIR "
                  "设成一个你能写的文件夹，例如 `os.environ['LESSONKIT_BUILD_DIR'] = '/tmp/lessonkit-build'`。")
    elif e.errno == errno.ENOENT:
        what = tr("a file or folder disappeared during the build (did `make clean` run at the same "
                  "time?). Run the cell again.",
                  "构建途中有文件或文件夹不见了（是不是同时运行了 `make clean`？）。请再运行一次这个单元。")
    else:
        what = tr("see the error above; run the cell again once it is fixed.",
                  "见上面的错误；改好后再运行这个单元。")
    return BuildError(tr(f"Could not build in {build_dir}: {e.strerror or e} ({type(e).__name__}): {what}",
                         f"无法在 {build_dir} 里构建：{e.strerror or e}（{type(e).__name__}）：{what}"))


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
    # list and break in the files the student reads.
    prefix_map = [f"-fdebug-prefix-map={tmp_src}={src_dir}"]
    base = [*cc.split(), *flags, *prefix_map, f"-I{tmp_src}"]
    try:
        proc = _compile_and_link(base, sources, out)
    except subprocess.TimeoutExpired:
        raise BuildError(tr(f"The compiler did not finish in {COMPILE_TIMEOUT_S:.0f} s; nothing new was "
                            "loaded. Run the cell again; if it happens again, restart the machine's "
                            "compiler jobs.",
                            f"编译器 {COMPILE_TIMEOUT_S:.0f} s 内没有完成；没有载入任何新东西。请再运行一次这个单元；"
                            "如果还是这样，请重启这台机器上的编译任务。")) from None
    except OSError as e:
        raise BuildError(tr(f"Could not run the C compiler {cc!r}: {e.strerror or e}. Check `cc --version` "
                            "in a terminal.",
                            f"无法运行 C 编译器 {cc!r}：{e.strerror or e}。请在终端里检查 `cc --version`。")) from None
    text = clean_compiler_output(proc.stderr, tmp_src, src_dir.name)
    if proc.returncode != 0:
        if not tmp_src.is_dir():
            raise BuildError(tr("The build folder was removed while the compiler ran (did `make clean` run "
                                "at the same time?). Nothing new was loaded; run the cell again.",
                                "编译器运行时构建文件夹被删掉了（是不是同时运行了 `make clean`？）。"
                                "没有载入任何新东西；请再运行一次这个单元。"))
        if "No space left on device" in proc.stderr:
            raise _os_error(OSError(errno.ENOSPC, "No space left on device"), out.parent.parent)
        raise BuildError(first_errors(text) + tr("\n\nThe C sources did not compile: fix the first error "
                                                 "above and run the cell again. Nothing new was loaded; libraries "
                                                 "loaded before keep working.",
                                                 "\n\nC 源码没有编译通过：改好上面的第一个错误，再运行这个单元。"
                                                 "没有载入任何新东西；之前载入的库照常可用。"))
    return text.strip()


def _compile_and_link(base: list[str], sources: list[Path], out: Path) -> subprocess.CompletedProcess:
    """Compile each source to an object file, as many at a time as the machine has cores, then link
    them into ``out``: a build takes about the time of its slowest file (flash_attn_q8_steps.c), not
    the sum of all of them. Returns one result: the first failing step's return code (0 if none)
    and every step's messages, in the order of ``sources`` (so the first error shown is the same
    whatever finished first). Raises what subprocess.run raises (a time-out, a missing compiler)."""
    from concurrent.futures import ThreadPoolExecutor
    obj_dir = out.parent / "obj"
    try:
        obj_dir.mkdir(exist_ok=True)
    except OSError as e:  # the build folder went away (`make clean` meanwhile): a failed step, named by the caller
        return subprocess.CompletedProcess([], 1, "", f"{obj_dir}: {e.strerror or e}\n")
    objects = [obj_dir / f"{i:02d}_{src.stem}.o" for i, src in enumerate(sources)]

    def run(cmd):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)

    jobs = [[*base, "-c", str(src), "-o", str(obj)] for src, obj in zip(sources, objects)]
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        steps = list(pool.map(run, jobs))  # in order; re-raises a step's exception here
    failed = next((p.returncode for p in steps if p.returncode != 0), 0)
    if not failed:
        steps.append(run([*base, *map(str, objects), "-o", str(out), "-lm"]))
        failed = steps[-1].returncode
    return subprocess.CompletedProcess(jobs, failed, "", "".join(p.stderr for p in steps))


def _publish(tmp: Path, out: Path) -> None:
    try:
        os.replace(tmp, out)  # atomic: a concurrent loader sees the old file or the new, never half
    except OSError as e:
        raise _os_error(e, out.parent) from None


# ----------------------------------------------------------------------------- compiler messages

_DIAG = re.compile(r"^(?P<where>[^:\s][^:]*:\d+(?::\d+)?): (?P<kind>fatal error|error|warning|note): ")


def clean_compiler_output(text: str, tmp_src: Path | None = None, name: str = "native") -> str:
    """The compiler's output as a student should read it: paths of the private build copy shown
    as ``native/``, long paths of installed headers shortened, lines that only say where a file
    was included from dropped (the traced build includes the kernel a second time)."""
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
        out += tr(f"\n... and {hidden} more error{'s' if hidden > 1 else ''} (fix the first one first)",
                  f"\n……还有 {hidden} 个错误（先改第一个）")
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
    msg = (tr("the C sources compiled, with warnings:\n", "C 源码编译通过了，但有警告：\n") + body
           + (tr(f"\n... and {more} more warnings", f"\n……还有 {more} 条警告") if more > 0 else ""))
    warnings.warn_explicit(BuildWarning(msg), BuildWarning, where[0], int(where[1]))


# ----------------------------------------------------------------------------- the check of a new build

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _record_path(lib: Path) -> Path:
    return lib.with_name(lib.name + ".json")


def _prebuilt(name: str, verify: str) -> tuple[Path, dict] | None:
    """A library of this very name (the same sources, flags and compiler) that a class hub built and
    checked once for every student, in the read-only folder ``$LESSONKIT_PREBUILT_DIR`` (set for each
    student's server by class/jupyterhub_config.py): a student whose native/ is as published loads it instead of building their own."""
    folder = os.environ.get("LESSONKIT_PREBUILT_DIR", "").strip()
    if not folder:
        return None
    lib = Path(folder) / name
    record = _read_record(lib)
    return (lib, record) if record is not None and _level_ok(record, verify) else None


def _read_record(lib: Path) -> dict | None:
    """The record written when ``lib`` passed its check, if ``lib`` is still exactly those bytes.
    An empty, truncated or replaced library (or one without a record) gives None: rebuild it."""
    try:
        record = json.loads(_record_path(lib).read_text())
        if lib.stat().st_size > 0 and record.get("sha256") == _sha256(lib):
            return record
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _write_record(lib: Path, record: dict) -> None:
    path = _record_path(lib)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise _os_error(e, lib.parent) from None


def _level_ok(record: dict, verify: str) -> bool:
    """Was the library checked at least as far as ``verify`` asks, and did it pass?"""
    done = record.get("verified", "skip")
    if VERIFY_LEVELS.index(done) < VERIFY_LEVELS.index(verify):
        return False
    return verify != "results" or not record.get("failures")


def _smoke(lib: Path, header: str, verify: str) -> dict:
    """Run lessonkit/smoke.py on ``lib`` in a child process. Returns
    ``{"verified": level, "failures": [...], "crash": str|None}``."""
    if verify == "skip":
        return {"verified": "skip", "failures": [], "crash": None}
    request = json.dumps({"library": str(lib), "header": header, "lang": language()})
    try:
        proc = subprocess.run([sys.executable, "-I", str(SMOKE_SCRIPT)], input=request,
                              capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        last = _last_step(e.stderr)
        return {"verified": verify, "failures": [],
                "crash": tr(f"did not finish in {SMOKE_TIMEOUT_S:.0f} s (a hang: an endless loop?)"
                            + (f" while running {last}" if last else ""),
                            f"在 {SMOKE_TIMEOUT_S:.0f} s 内没有跑完（卡住了：死循环？）"
                            + (f"，当时在运行 {last}" if last else ""))}
    except OSError as e:
        raise BuildError(tr(f"Could not start the check of the new build ({sys.executable}): {e}",
                            f"无法启动对新构建的检查（{sys.executable}）：{e}")) from None
    last = _last_step(proc.stderr)
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
            what = {"SIGSEGV": tr("segmentation fault: a read or write outside the memory it owns",
                                  "段错误：读写了不属于它的内存"),
                    "SIGBUS": tr("bus error: a bad address", "总线错误：地址不对"),
                    "SIGILL": tr("illegal instruction", "非法指令"),
                    "SIGFPE": tr("arithmetic exception", "算术异常"), "SIGABRT": tr("abort", "中止")}.get(name, "")
        except ValueError:
            name, what = f"signal {-proc.returncode}", ""
        return {"verified": verify, "failures": [],
                "crash": tr(f"crashed with {name}" + (f" ({what})" if what else "")
                            + (f" while running {last}" if last else ""),
                            f"崩溃了，信号 {name}" + (f"（{what}）" if what else "")
                            + (f"，当时在运行 {last}" if last else ""))}
    try:
        report = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        return {"verified": verify, "failures": [],
                "crash": tr(f"stopped with exit code {proc.returncode}" + (f" while running {last}" if last else ""),
                            f"以退出码 {proc.returncode} 停止" + (f"，当时在运行 {last}" if last else ""))
                         + (f":\n{tail}" if tail else "")}
    return {"verified": verify, "failures": report["failures"], "crash": None}


def _last_step(stderr) -> str:
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    steps = [l[len("running "):] for l in (stderr or "").splitlines() if l.startswith("running ")]
    return steps[-1] if steps else ""


def _judge(result: dict, verify: str) -> None:
    """Raise KernelCheckError for a crash or hang (always) and for wrong results (verify="results").
    Wrong results allowed by verify="crashes" are shown by load() as a warning."""
    keep = tr("Nothing new was loaded; what was loaded before keeps working. Fix the edit and run the "
              "cell again.",
              "没有载入任何新东西；之前载入的照常可用。改好你的修改，再运行这个单元。")
    if result.get("crash"):
        raise KernelCheckError(tr(f"The new build of the kernel {result['crash']}.\n{keep}",
                                  f"内核的新构建{result['crash']}。\n{keep}"))
    failures = result.get("failures") or []
    if not failures:
        return
    if verify == "results":
        raise KernelCheckError(tr(
            "The new build of the kernel gives wrong results against the reference (the engine's "
            f"quantized math in numpy, float64):\n{_failure_lines(failures)}\n{keep} To load a kernel "
            "you broke on purpose, pass verify='crashes' (crashes and hangs are still caught; "
            "results are not).",
            "内核的新构建与参考结果（引擎的量化算法，用 numpy 的 float64 重算）对不上，结果是错的："
            f"\n{_failure_lines(failures)}\n{keep}要载入你故意改坏的内核，请传 verify='crashes'"
            "（仍会捕获崩溃和卡死，但不再检查结果）。"))


def _failure_lines(failures: list[str], keep: int = 5) -> str:
    """The first failure of each function (the functions share most of their code, so one line
    each says enough), at most ``keep`` of them, and how many other checks failed."""
    firsts: dict[str, str] = {}
    for f in failures:
        firsts.setdefault(re.split(r" on | \(|:", f, maxsplit=1)[0], f)
    shown = list(firsts.values())[:keep]
    more = len(failures) - len(shown)
    return "\n".join(f"  {f}" for f in shown) + (tr(f"\n  ({more} more failed checks not shown)",
                                                     f"\n  （另有 {more} 项未通过的检查没有列出）") if more else "")


def _prune(build_dir: Path, stem: str) -> None:
    """Keep the newest KEEP_BUILDS libraries of this kind (and any loaded in this process); remove
    temporary folders that a killed process left behind more than an hour ago."""
    try:
        libs = sorted(build_dir.glob(f"{stem}_" + "?" * 16 + ".so"), key=lambda p: p.stat().st_mtime,
                      reverse=True)
        for old in libs[KEEP_BUILDS:]:
            if old not in _libs:
                old.unlink(missing_ok=True)
                _record_path(old).unlink(missing_ok=True)
        for tmp in build_dir.glob("tmp-*"):
            if time.time() - tmp.stat().st_mtime > 3600:
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # pruning is housekeeping: never let it fail a build


# ----------------------------------------------------------------------------- load

_ffis: dict[str, cffi.FFI] = {}
_libs: dict[Path, object] = {}
_current: dict[tuple, tuple] = {}  # (src_dir, debug, dotprod, defines, verify, env) -> (fingerprint, ffi, lib, path)


def _ffi_for(header: str) -> cffi.FFI:
    """One FFI per text of the header: its non-preprocessor lines are the cdef."""
    if header not in _ffis:
        ffi = cffi.FFI()
        try:
            ffi.cdef("\n".join(l for l in header.splitlines() if not l.lstrip().startswith("#")))
        except cffi.CDefError as e:
            raise BuildError(tr(f"cffi cannot read {HEADER}: {e}. Keep its declarations plain C "
                                "(no macros, no inline code).",
                                f"cffi 读不懂 {HEADER}：{e}。请让其中的声明保持为普通 C（不用宏，不写内联代码）。")) from None
        _ffis[header] = ffi
    return _ffis[header]


def load(debug: bool = False, dotprod: bool | None = None, defines: dict | None = None,
         src_dir: Path | str | None = None, verify: str = "results"):
    """Return ``(ffi, lib)`` for the current sources, building (and checking) first if they changed.

    Cheap to call before every kernel call: it only looks at file sizes and times unless
    something changed. A library loaded earlier stays valid for as long as you hold it.
    ``verify``: "results" (default) loads a new build only once a child process has run it
    without a crash or hang and with correct results; "crashes" skips the results (a kernel
    broken on purpose, lesson 06) but still catches crashes and hangs; "skip" checks nothing."""
    src_dir = Path(src_dir or NATIVE_DIR).resolve()
    env = tuple(os.environ.get(v, "") for v in ("CC", "LESSONKIT_DOTPROD", "LESSONKIT_SANITIZE",
                                                "LESSONKIT_BUILD_DIR"))
    slot = (src_dir, debug, dotprod, tuple(sorted(check_defines(defines).items())), verify, env)
    fp = _fingerprint(src_dir)
    cur = _current.get(slot)
    if cur is not None and cur[0] == fp:
        return cur[1], cur[2]
    path, record = _build(debug, dotprod, defines, src_dir, None, verify)
    if path not in _libs:
        ffi = _ffi_for(record["header"])  # the declarations it was compiled with
        try:
            _libs[path] = (ffi, ffi.dlopen(str(path)))
        except OSError as e:
            # The file passed its check in a child process, so this is the environment (a
            # sanitizer runtime not preloaded, say), not the code: say so, and forget the file.
            _record_path(path).unlink(missing_ok=True)
            raise BuildError(tr(f"The library {path.name} could not be loaded: {e}. It was removed; run "
                                "the cell again to rebuild it.",
                                f"库 {path.name} 无法载入：{e}。它已被删除；请再运行一次这个单元来重新构建。")) from None
        if record.get("warnings"):
            _show_warnings(record["warnings"])
        if record.get("failures"):
            # named after the call, not the caller's file: a notebook's cell has a temporary path
            warnings.warn_explicit(BuildWarning(tr(f"loaded with verify={verify!r}: this build computes wrong "
                                                   "results (as you meant it to?):",
                                                   f"已用 verify={verify!r} 载入：这个构建算出的结果是错的"
                                                   "（正如你的本意？）：")
                                                + f"\n{_failure_lines(record['failures'])}"),
                                   BuildWarning, "lessonkit.native.load", 0)
    ffi, lib = _libs[path]
    _current[slot] = (fp, ffi, lib, path)
    return ffi, lib


def library_path(debug: bool = False, dotprod: bool | None = None) -> Path:
    """The file of the library that load() gives, e.g. for gdb or valgrind."""
    return build(debug=debug, dotprod=dotprod)


def backend(debug: bool = False, dotprod: bool | None = None) -> str:
    """The compiled path, as the library itself reports it: "neon+dotprod", "neon", "simde-x86_64"."""
    ffi, lib = load(debug=debug, dotprod=dotprod)
    return ffi.string(lib.fa_backend()).decode()


def simd_paths(debug: bool = False) -> dict[str, str]:
    """The branch each SIMD helper of native/q8_simd.h compiled to, e.g.
    ``{"dot": "avx2", "vkq": "avx512", "exp": "inline", "addv": "ssse3"}`` (lesson 04)."""
    ffi, lib = load(debug=debug)
    return dict(item.split("=") for item in ffi.string(lib.fa_simd_paths()).decode().split())


_checked_libraries: dict[int, tuple] = {}


def library(ffi, lib, functions: tuple[str, ...]):
    """``(ffi, lib)`` to call ``functions`` in: both None gives the workbook's own build; else
    ``lib`` must come from ``load(...)`` (e.g. of an edited copy of native/), and each function must
    have the C signature the workbook's header gives it: a changed signature would make Python hand
    the wrong arguments to C."""
    if ffi is None and lib is None:
        return load()
    if ffi is None or lib is None:
        raise TypeError(tr("pass both ffi and lib (ffi, lib = lessonkit.native.load(...)), or neither",
                           "ffi 和 lib 要么都传（ffi, lib = lessonkit.native.load(...)），要么都不传"))
    if not isinstance(ffi, cffi.FFI):
        raise TypeError(tr(f"ffi must be the cffi.FFI of lessonkit.native.load(); got {type(ffi).__name__}",
                           f"ffi 必须是 lessonkit.native.load() 返回的 cffi.FFI；收到的是 {type(ffi).__name__}"))
    done = _checked_libraries.get(id(lib))
    done = done if done is not None and done[0] is lib and done[1] is ffi else None
    if done is not None and set(functions) <= done[2]:
        return ffi, lib  # checked before: a cache appending many chunks pays this once
    own_ffi, own_lib = load()
    for fn in functions:
        try:
            theirs = ffi.getctype(ffi.typeof(getattr(lib, fn)))
        except (AttributeError, TypeError, cffi.FFIError) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TypeError(tr(f"lib has no C function {fn} (lib must come from lessonkit.native.load(...)): {why}",
                               f"lib 里没有 C 函数 {fn}（lib 必须来自 lessonkit.native.load(...)）：{why}")) from None
        ours = own_ffi.getctype(own_ffi.typeof(getattr(own_lib, fn)))
        if theirs != ours:
            raise TypeError(tr(f"lib's {fn} has the C type {theirs}, not the workbook's {ours}: "
                               "an edited header changed its signature; restore it in the copy",
                               f"lib 里 {fn} 的 C 类型是 {theirs}，不是练习册的 {ours}：改过的头文件改变了它的签名；"
                               "请在副本里把签名改回去"))
    # the entry holds lib and ffi themselves, so that their id cannot be reused by another object
    _checked_libraries[id(lib)] = (lib, ffi, set(functions) | (done[2] if done else set()))
    return ffi, lib
