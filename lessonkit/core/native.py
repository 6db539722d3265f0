"""Build the C kernel, check each new build in a child process, and load it with cffi (introduced
in lesson 00). The compiler's side (flags, build key, messages) is ``lessonkit.toolchain``.

    ffi, lib = load()            # fast build, rebuilt whenever a file in native/ changed
    ffi, lib = load(debug=True)  # -O0 -g build for debuggers
    backend()                    # "neon+dotprod", "neon" or "simde-x86_64": what was compiled

A student's Jupyter process holds their unsaved work, so a build never reaches it unproven: every new
library is first run in a child process (``lessonkit/smoke.py``) against the engine's quantized math
on a few small caches, with a timeout; a crash, a hang or a wrong result there becomes a
``KernelCheckError`` here and nothing is loaded. A library in ``.build/`` is loaded only if its bytes
are the ones that passed that check (their SHA-256 is recorded beside it); an empty or truncated file
is rebuilt."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import time
import warnings
from pathlib import Path

import cffi

from . import validate as check
from .check import failure_lines, judge, refusal, smoke
from .processes import BuildInterrupted, compile_stoppably, fork_safe_lock, stopped  # noqa: F401
from .files import write_atomic
from .header import cdef
from .language import _
from .toolchain import (  # noqa: F401
    AARCH64_MARCH,
    DEFINES,
    HEADER,
    MAX_ERRORS_SHOWN,
    NATIVE_DIR,
    REPO_DIR,
    BuildError,
    BuildWarning,
    KernelCheckError,
    _build_key,
    _c_files,
    _fingerprint,
    _native_dir,
    _os_error,
    _publish,
    _read_sources,
    _run_compiler,
    _show_warnings,
    _workspace,
    _write_copy,
    arch_flags,
    build_dir_for,
    build_program,
    check_defines,
    clean_compiler_output,
    compile_flags,
    compiler,
    first_errors,
    is_arm64,
    language_flags,
    seconds_setting,
    simde_include_dir,
    source_dir,
)


KEEP_BUILDS = 6          # newest libraries kept per kind (fast, debug, ...); older ones are pruned

# What the check in the child process may run: every new build is checked for results, crashes
# and hangs; "crashes" still catches crashes and hangs but lets wrong results through (with a
# warning), for a kernel broken on purpose (lesson 06); "skip" loads without any check.
VERIFY_LEVELS = ("skip", "crashes", "results")


# ----------------------------------------------------------------------------- build

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
    check.one_of("verify", verify, VERIFY_LEVELS)
    flags = compile_flags(debug, dotprod, defines)
    return _library(flags, f"libflash_attn_q8{'_debug' if debug else ''}", src_dir, build_dir, verify)


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
    _ffi_for(header)  # a header cffi cannot read is named here, before anything is compiled

    record = _read_record(out)
    if record is not None and _level_ok(record, verify):
        return out, record
    if record is None and (shared := _prebuilt(out.name, verify)):
        return shared
    cache = _build_cache(out.name)
    if record is None and cache and (cached := _read_record(cache)) is not None and _level_ok(cached, verify):
        with _workspace(build_dir) as work:  # the tests' compiler cache: the same bytes, checked before
            shutil.copyfile(cache, work / "lib.so")
            _publish(work / "lib.so", out)
            _write_record(out, cached)
        _prune(build_dir, stem)
        return out, cached
    if record is not None:  # built and intact, but checked less than now asked: check it again
        result = smoke(out, header, verify)
        record = {**record, **result}
        _write_record(out, record)
        judge(result, verify)
        return out, record

    with _workspace(build_dir) as work:
        tmp_src = _write_copy(work, src_dir.name, sources)
        tmp_lib = work / "lib.so"
        with stopped(_("the build of the kernel (the compiler)")):
            messages = compile_stoppably(_run_compiler, cc, flags, tmp_src, _c_files(tmp_src, sources),
                                         tmp_lib, src_dir)
        result = smoke(tmp_lib, header, verify)
        judge(result, verify)  # raises before anything is published
        _publish(tmp_lib, out)
        record = {"sha256": _sha256(out), "warnings": messages, "header": header, **result}
        _write_record(out, record)
        if cache and not result.get("failures") and not messages:  # warnings name the folder compiled: not shared
            with contextlib.suppress(OSError):  # a cache that cannot be written only costs a build later
                shutil.copyfile(out, work / "shared.so")
                os.replace(work / "shared.so", cache)
                write_atomic(_record_path(cache), json.dumps(record, indent=1))
    _prune(build_dir, stem)
    return out, record


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
    student's server by class/jupyterhub_config.py): a student whose native/ is as published loads it
    instead of building their own."""
    folder = os.environ.get("LESSONKIT_PREBUILT_DIR", "").strip()
    if not folder:
        return None
    lib = Path(folder) / name
    record = _read_record(lib)
    return (lib, record) if record is not None and _level_ok(record, verify) else None


def _build_cache(name: str) -> Path | None:
    """Where the tests' compiler cache keeps a library of this name (``$LESSONKIT_BUILD_CACHE``, which
    tests/conftest.py sets): test builds of the same sources, flags and compiler in other folders (a clone, a
    copy of native/) take it from there instead of compiling again. None without a cache."""
    folder = os.environ.get("LESSONKIT_BUILD_CACHE", "").strip()
    return Path(folder) / name if folder and Path(folder).is_dir() else None


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
    try:
        write_atomic(_record_path(lib), json.dumps(record, indent=1))
    except OSError as e:
        raise _os_error(e, lib.parent) from None


def _level_ok(record: dict, verify: str) -> bool:
    """Was the library checked at least as far as ``verify`` asks, and did it pass?"""
    done = record.get("verified", "skip")
    if VERIFY_LEVELS.index(done) < VERIFY_LEVELS.index(verify):
        return False
    return verify != "results" or not record.get("failures")


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
_libs: dict[Path, tuple] = {}            # path -> (ffi, lib) of every library this process opened
_records: dict[int, tuple] = {}          # id(lib) -> (lib, path, record): what cover() knows of a library
_current: dict[tuple, tuple] = {}  # (src_dir, debug, dotprod, defines, verify, env) -> (fingerprint, ffi, lib, path)


def _ffi_for(header: str) -> cffi.FFI:
    """One FFI per text of the header: its non-preprocessor lines are the cdef."""
    if header not in _ffis:
        ffi = cffi.FFI()
        try:
            ffi.cdef(cdef(header))
        except (cffi.CDefError, cffi.FFIError) as e:  # line numbers are the file's: header.cdef keeps every line
            why = str(e).replace("<cdef source string>", HEADER)
            why = re.sub(r"\s*\(for interactive usage, try cdef\(xx, override=True\)\)", "", why)  # not for a file
            raise BuildError(_("cffi cannot read {HEADER}: {e}. Python reads this header as a list of plain C "
                               "declarations: keep function bodies (static inline helpers) in a .c file or in "
                               "q8_simd.h, and types and constants cffi can parse. Nothing new was loaded.").format(
                               HEADER=HEADER, e=why)) from None
        _ffis[header] = ffi
    return _ffis[header]


# An edit of the sources is noticed by looking at them (15 stat calls and a path resolve: about 40 us,
# twice the overhead allowed per kernel call), so load() looks again only when something may have
# changed: at the start of each notebook cell (an IPython hook), after lessonkit's own edit helpers
# (kernel_copy.edit_line calls sources_changed()), or once SOURCES_WATCH_S passed since it last looked.
# A file saved from an editor and a kernel call in the next cell are thus always seen; only a raw write
# and a call within the same 2 ms, in one cell, are not.
SOURCES_WATCH_S = 0.002
_generation = [0]    # bumped by sources_changed(): every cached look at the sources is stale
_fast: dict = {}     # load()'s arguments -> (generation, time looked, fingerprint, ffi, lib, path)
_loaded: dict = {}   # (src_dir, debug) -> (path, time, verify, record) of the last library load() returned
_hooked = [False]


def sources_changed() -> None:
    """Say that a file of some native/ folder may have changed: the next load() looks at the sources
    again (lessonkit's edit helpers call it; a notebook cell's start does the same)."""
    _generation[0] += 1


def _hook_cells() -> None:
    """Look at the sources again at the start of every IPython cell (once per process)."""
    if _hooked[0] or "IPython" not in sys.modules:
        return
    _hooked[0] = True
    shell = sys.modules["IPython"].get_ipython()
    if shell is not None:
        shell.events.register("pre_run_cell", lambda *unused: sources_changed())


def load(debug: bool = False, dotprod: bool | None = None, defines: dict | None = None,
         src_dir: Path | str | None = None, verify: str = "results"):
    """Return ``(ffi, lib)`` for the current sources, building (and checking) first if they changed.

    Cheap to call before every kernel call (about a microsecond): it looks at the files' sizes and
    times at the start of a cell, after an edit helper, or 2 ms after it last looked, and builds only
    if something changed. A library loaded earlier stays valid for as long as you hold it.
    ``verify``: "results" (default) loads a new build only once a child process has run it
    without a crash or hang and with correct results; "crashes" skips the results (a kernel
    broken on purpose, lesson 06) but still catches crashes and hangs; "skip" checks nothing.
    A build that fails, or that you stop, says which library your ``lib`` still is."""
    try:
        fast_key = (debug, dotprod, src_dir, verify, None if defines is None else tuple(sorted(defines.items())))
        hit = _fast.get(fast_key)
    except (TypeError, AttributeError):  # unhashable, or defines not a dict: the full path says what is wrong
        fast_key, hit = None, None
    if hit is not None and hit[0] == _generation[0] and time.monotonic() - hit[1] < SOURCES_WATCH_S \
            and _is_open(hit[4]):
        entry = _records[id(hit[4])]
        if entry[3] != verify:  # cover() judges by the level of the latest load
            _records[id(hit[4])] = (*entry[:3], verify)
        return hit[3], hit[4]
    generation, now = _generation[0], time.monotonic()
    src_dir = source_dir(src_dir)
    env = tuple(os.environ.get(v, "") for v in ("CC", "LESSONKIT_DOTPROD", "LESSONKIT_SANITIZE",
                                                "LESSONKIT_BUILD_DIR"))
    slot = (src_dir, debug, dotprod, tuple(sorted(check_defines(defines).items())), verify, env)
    fp = _fingerprint(src_dir)
    cur = _current.get(slot)
    if cur is not None and cur[0] == fp and _is_open(cur[2]):
        if _records[id(cur[2])][3] != verify:
            _records[id(cur[2])] = (*_records[id(cur[2])][:3], verify)
        if fast_key is not None:
            _fast[fast_key] = (generation, now, fp, cur[1], cur[2], cur[3])
        return cur[1], cur[2]
    _hook_cells()
    in_use = _in_use(src_dir, debug)
    try:
        with stopped(_("loading the kernel")):
            ffi, lib, path, record = _open(debug, dotprod, defines, src_dir, verify)
    except BuildInterrupted as e:
        raise BuildInterrupted(f"{e} {in_use}") from None
    except BuildError as e:  # KernelCheckError too: the same class, with which library is still in use
        raise type(e)(f"{e}\n{in_use}") from None
    _current[slot] = (fp, ffi, lib, path)
    _records[id(lib)] = (lib, path, record, verify)
    _loaded[(src_dir, debug)] = (path, time.localtime(), verify, record)
    if fast_key is not None:
        _fast[fast_key] = (generation, now, fp, ffi, lib, path)
    return ffi, lib


def _open(debug, dotprod, defines, src_dir, verify) -> tuple:
    """Build (and check) if needed, then open the library: (ffi, lib, path, record)."""
    path, record = _build(debug, dotprod, defines, src_dir, None, verify)
    if path not in _libs or not _is_open(_libs[path][1]):
        ffi = _ffi_for(record["header"])  # the declarations it was compiled with
        try:
            _libs[path] = (ffi, ffi.dlopen(str(path)))
        except OSError as e:
            # The file passed its check in a child process, so this is the environment (a
            # sanitizer runtime not preloaded, say), not the code: say so, and forget the file.
            _record_path(path).unlink(missing_ok=True)
            raise BuildError(_("The library {name} could not be loaded: {e}. It was removed; run the cell again to "
                               "rebuild it.").format(name=path.name, e=e)) from None
        if record.get("warnings"):
            _show_warnings(record["warnings"])
        if record.get("output"):
            print(_("Your kernel printed this while its new build was checked in a child process:\n{output}\n"
                    "(In this process its printf output reaches the notebook when C flushes it: end each "
                    "line with fflush(stdout), or print with fprintf(stderr, ...), which is not buffered.)").format(
                    output=record["output"]))
        if record.get("failures"):
            _warn_wrong(verify, record["failures"])
    return (*_libs[path], path, record)


def _in_use(src_dir: Path, debug: bool) -> str:
    """Which library a student's ``lib`` still is when a load of ``src_dir`` fails or is stopped: the
    last one load() returned for that folder in this process, if any (a variable assigned from a load
    that failed keeps what it held)."""
    prev = _loaded.get((src_dir, debug))
    shipped = src_dir == NATIVE_DIR.resolve()
    if prev is None:
        return (_("No build of native/ was loaded in this process before this one.") if shipped else
                _("No build of this folder was loaded in this process before this one: a lib you hold comes "
                  "from another load (lk.native.load() without src_dir is the workbook's own kernel)."))
    path, when, verify, record = prev
    when = time.strftime("%H:%M:%S", when)
    text = (_("lib is still the workbook's own kernel (native/), built as {file} and loaded at {when}.") if shipped
            else _("lib (what load(src_dir=...) returned before) is still your previous build of this folder: "
                   "{file}, loaded at {when}.")).format(file=path.name, when=when)
    if record.get("failures"):
        text += " " + _("That build computes wrong results (loaded with verify={verify!r}): it is still the kernel "
                        "broken on purpose, not a fix.").format(verify=verify)
    return text


def _is_open(lib) -> bool:
    """False once the student closed the library (``ffi.dlclose(lib)``): load() then opens it again
    instead of handing back a handle whose every call says "has already been closed". (cffi's close
    empties the library's attributes, so the probe reaches the closed handle and fails.)"""
    try:
        lib.fa_backend
    except ValueError:  # cffi's "library ... has already been closed"
        return False
    except AttributeError:  # a header without fa_backend: nothing to probe with; it is open
        pass
    return True


def _warn_wrong(verify: str, failures: list, where: str = "") -> None:
    # named after the call, not the caller's file: a notebook's cell has a temporary path
    warnings.warn_explicit(BuildWarning(_("loaded with verify={verify!r}: this build computes wrong results (as "
                                          "you meant it to?):").format(verify=verify) + where
                                        + f"\n{failure_lines(failures)}"),
                           BuildWarning, "lessonkit.native.load", 0)


# ----------------------------------------------------------------------------- larger caches

# A new build is checked on smoke.py's cases, the largest 4,100 tokens of 8 kv heads of head_dim 128 in
# blocks of 16. A call on a cache that no case covers (every size a buffer could be sized by at most a
# case's: _checked_length) first has its library checked again, in a child process, on a cache of the
# call's shape and at least its length: a buffer sized for short caches (a `float seen[8192]` in a
# student's edit, or one sized by tokens x head_dim) then fails there, never in the student's process.
# The length is rounded up to a power of two, at least twice the length covered before, so a cache
# growing token by token is checked a few times, not at every call; each shape that passed is kept in
# the library's record. A record from before shapes were kept covers nothing: its first call re-checks.
ROUND_UP_TO = 1 << 22  # above this, the check runs at the call's own length (no rounding up)
_covered: dict[tuple, tuple] = {}  # (id(lib), kv heads, head_dim, block) -> (record, verify, checked length)
_cover_lock = fork_safe_lock(sys.modules[__name__], "_cover_lock")  # one check at a time: threads calling together wait for the first one


def _checked_length(record: dict, shape: tuple) -> int:
    """The longest cache of ``shape``'s kv heads, head_dim and block size that a case of ``record`` covers:
    one whose every size a buffer could be sized by (tokens, tokens x head_dim, tokens x kv heads, tokens x
    kv_dim, blocks; and per token head_dim and kv_dim) is at most that case's. 0 if none."""
    unused, nkv, hd, bs = shape
    entries = record.get("covered")
    best = 0
    for c in entries if isinstance(entries, list) else []:
        if not (isinstance(c, list) and len(c) == 4 and all(isinstance(x, int) and x > 0 for x in c)):
            continue  # a damaged entry covers nothing
        T2, nkv2, hd2, bs2 = c
        if hd <= hd2 and nkv * hd <= nkv2 * hd2:
            best = max(best, min(T2, T2 * hd2 // hd, T2 * nkv2 // nkv, T2 * nkv2 * hd2 // (nkv * hd),
                                 -(-T2 // bs2) * bs))
    return best


def cover(lib, seq_len: int, n_kv_heads: int, head_dim: int, block_size: int) -> None:
    """Make sure ``lib`` passed its check on a cache at least this large before it is called on one:
    runs the check on a cache of this shape if no case covered it (lessonkit.smoke, in a child
    process) and raises KernelCheckError, before the call, if the library crashes, hangs or (loaded
    with verify="results") computes wrong results there. A library load() did not open is not checked
    here (there is nothing known to check it against)."""
    entry = _records.get(id(lib))
    if entry is None or entry[0] is not lib:
        return
    key = (id(lib), n_kv_heads, head_dim, block_size)
    known = _covered.get(key)  # every call pays this look-up only: the record's cases are not read again
    if known is not None and known[0] is entry[2] and known[1] == entry[3] and seq_len <= known[2]:
        return
    with _cover_lock, stopped(_("the check of this build on a longer cache"),
                              _("The call was not made; lib is unchanged.")):
        _cover(lib, seq_len, n_kv_heads, head_dim, block_size)


def _cover(lib, seq_len: int, n_kv_heads: int, head_dim: int, block_size: int) -> None:
    unused, path, record, verify = _records[id(lib)]
    shape = (seq_len, n_kv_heads, head_dim, block_size)
    checked = _checked_length(record, shape)
    if verify == "skip":
        _covered[(id(lib), *shape[1:])] = (record, verify, float("inf"))
        return
    if seq_len <= checked:  # the record is the library's own; a new check replaces it (load's _records)
        _covered[(id(lib), *shape[1:])] = (record, verify, checked)
        return
    n = max(seq_len, 2 * checked)
    n = 1 << (n - 1).bit_length() if n <= ROUND_UP_TO else seq_len
    refused = record.get("refused", {}).get(shape[1:])  # this process saw it fail on that shape
    if refused and n >= refused[0]:
        raise KernelCheckError(refused[1])
    result = smoke(path, record["header"], verify, [n, *shape[1:]])
    if result["crash"] or (result["failures"] and verify == "results"):
        message = refusal(result, checked, n, shape)
        record.setdefault("refused", {})[shape[1:]] = (n, message)
        raise KernelCheckError(message)
    if result["failures"]:
        _warn_wrong(verify, result["failures"], _(" (on a cache of {n} tokens)").format(n=n))
    record["covered"] = [*record.get("covered", []), [n, *shape[1:]]]
    try:
        _write_record(path, {k: v for k, v in record.items() if k != "refused"})
    except BuildError:
        pass  # a read-only folder (a class hub's prebuilt libraries): this process remembers it


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
        raise TypeError(_("pass both ffi and lib (ffi, lib = lessonkit.native.load(...)), or neither"))
    if not isinstance(ffi, cffi.FFI):
        raise TypeError(_("ffi must be the cffi.FFI of lessonkit.native.load(); got {ffi}").format(
                          ffi=type(ffi).__name__))
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
            raise TypeError(_("lib has no C function {fn} (lib must come from lessonkit.native.load(...)): {why}").format(
                              fn=fn, why=why)) from None
        ours = own_ffi.getctype(own_ffi.typeof(getattr(own_lib, fn)))
        if theirs != ours:
            raise TypeError(_("lib's {fn} has the C type {theirs}, not the workbook's {ours}: an edited header "
                              "changed its signature; restore it in the copy").format(
                              fn=fn, theirs=theirs, ours=ours))
    # the entry holds lib and ffi themselves, so that their id cannot be reused by another object
    _checked_libraries[id(lib)] = (lib, ffi, set(functions) | (done[2] if done else set()))
    return ffi, lib
