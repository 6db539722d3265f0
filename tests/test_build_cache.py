"""The build cache cannot be poisoned: a library's file name names exactly the bytes that were
compiled, on this CPU; a damaged library is rebuilt, never loaded; OS errors become BuildErrors
that say what to do, leave no temporary files, and old builds are pruned."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from lessonkit import native, toolchain
from childproc import assert_clean, run_python
from conftest import make_case

@pytest.fixture
def native_copy(tmp_path):
    src = tmp_path / "native"
    shutil.copytree(native.NATIVE_DIR, src, ignore=shutil.ignore_patterns("tests"))
    return src


def _edit_backend_name(src: Path, new: str) -> None:
    """An edit that passes the check (results unchanged) but is visible: fa_backend's strings."""
    path = src / "fa_build.c"
    text, n = re.subn(r'return "(neon\+dotprod|neon|simde-x86_64|simde-generic)";', f'return "{new}";',
                      path.read_text())
    assert n == 4, f"fa_backend's four strings not found in {path.name}"
    path.write_text(text)


def _backend(ffi, lib) -> str:
    return ffi.string(lib.fa_backend()).decode()


def _no_temporaries(build_dir: Path) -> None:
    assert not list(build_dir.glob("tmp-*")), list(build_dir.glob("*"))


def test_a_source_saved_during_the_build_does_not_get_the_old_hash(native_copy, monkeypatch):
    real = native._run_compiler
    saved = []

    def save_while_compiling(*args, **kw):
        if not saved:  # the student saves an edit while the compiler runs
            _edit_backend_name(native_copy, "edited-during-build")
            saved.append(True)
        return real(*args, **kw)

    monkeypatch.setattr(native, "_run_compiler", save_while_compiling)
    first = native.build(src_dir=native_copy)
    ffi, lib = native.load(src_dir=native_copy)
    # load() saw the saved edit and built it: a library under a new hash, with the new text ...
    assert _backend(ffi, lib) == "edited-during-build"
    second = native.build(src_dir=native_copy)
    assert second != first
    # ... while the library built during the save is what its hash names: the bytes before it
    ffi0 = native._ffi_for(json.loads(Path(str(first) + ".json").read_text())["header"])
    assert _backend(ffi0, ffi0.dlopen(str(first))) != "edited-during-build"


def test_the_key_includes_what_march_native_resolved_to(native_copy, monkeypatch):
    cc = native.compiler()
    flags = native.compile_flags()
    here = native._build_key(native._read_sources(native_copy), cc, flags, {})
    # the same compiler and flags on a CPU with other features predefine other macros
    arch = tuple(f for f in flags if f.startswith(("-m", "-f")) or f.startswith("-std"))
    monkeypatch.setitem(toolchain._identities, (cc, arch), toolchain._compiler_identity(cc, flags) + b"\n#define __AVX10_2__ 1")
    there = native._build_key(native._read_sources(native_copy), cc, flags, {})
    assert here != there
    if not native.is_arm64():  # and -march=native really does list this CPU's features
        monkeypatch.delitem(toolchain._identities, (cc, arch))
        assert toolchain._compiler_identity(cc, ["-march=native"]) != toolchain._compiler_identity(cc, ["-march=x86-64"])


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage-without-record"])
def test_a_damaged_library_is_rebuilt_not_loaded(native_copy, damage):
    path = native.build(src_dir=native_copy)
    data = path.read_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(data[:len(data) // 3])
    else:
        path.write_bytes(b"\x7fELF" + b"\0" * 100)
        Path(str(path) + ".json").unlink()
    # a new session loads it: in a child, since loading a truncated library blindly can SIGBUS
    proc = run_python(f"""
        import numpy as np
        from pathlib import Path
        from lessonkit import native
        from conftest import make_case
        ffi, lib = native.load(src_dir=Path({str(native_copy)!r}))
        cache, q, _, _ = make_case(1, 20, 1, 32, 8)
        out = np.empty(32, np.float32)
        lib.flash_attn_single_q_q8_neon(ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", q),
                                        *cache.kernel_args(0, ffi), 32, 0.2)
        import lessonkit as lk
        assert np.allclose(out, lk.attend(q, cache, 0, scale=0.2, backend="numpy"), rtol=1e-5, atol=1e-6)
        print("OK")
    """)
    assert assert_clean(proc).strip() == "OK"
    assert path.read_bytes() == data or len(path.read_bytes()) == len(data)  # rebuilt whole
    _no_temporaries(path.parent)


def test_cc_empty_and_missing_compiler_are_build_errors(monkeypatch):
    monkeypatch.setenv("CC", "")
    with pytest.raises(native.BuildError, match="CC is set to an empty string"):
        native.build()
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with pytest.raises(native.BuildError, match="No C compiler found"):
        native.build()


def test_a_read_only_build_folder_says_what_to_do(native_copy, monkeypatch):
    def refuse(*a, **kw):
        raise PermissionError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(toolchain.tempfile, "mkdtemp", refuse)
    with pytest.raises(native.BuildError, match="LESSONKIT_BUILD_DIR"):
        native.build(src_dir=native_copy)


def test_a_build_folder_that_cannot_exist_is_a_build_error(native_copy, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LESSONKIT_BUILD_DIR", str(blocker / "build"))
    with pytest.raises(native.BuildError, match="Could not build in"):
        native.build(src_dir=native_copy)


def test_a_full_disk_is_a_build_error_and_leaves_nothing_behind(native_copy, monkeypatch):
    real = native._write_copy

    def full(work, name, sources):
        real(work, name, {})
        raise native._os_error(OSError(errno.ENOSPC, "No space left on device"), work.parent)
    monkeypatch.setattr(native, "_write_copy", full)
    with pytest.raises(native.BuildError, match="disk is full"):
        native.build(src_dir=native_copy)
    _no_temporaries(native_copy.parent / ".build")


def test_make_clean_during_a_build_is_a_build_error(native_copy, monkeypatch):
    real = native._run_compiler

    def clean_first(cc, flags, tmp_src, sources, out, src_dir):
        shutil.rmtree(native_copy.parent / ".build")   # what `make clean` does
        return real(cc, flags, tmp_src, sources, out, src_dir)
    monkeypatch.setattr(native, "_run_compiler", clean_first)
    with pytest.raises(native.BuildError, match="make clean"):
        native.build(src_dir=native_copy)
    monkeypatch.setattr(native, "_run_compiler", real)
    assert native.build(src_dir=native_copy).is_file()  # and the next build works


def test_a_compile_error_leaves_no_temporary_files(native_copy):
    kernel = native_copy / "flash_attn_q8_neon.c"
    kernel.write_text(kernel.read_text().replace("float M = -1e9f, S", "float M = -1e9f S"))
    with pytest.raises(native.BuildError):
        native.build(src_dir=native_copy)
    _no_temporaries(native_copy.parent / ".build")


def test_old_builds_are_pruned(native_copy):
    build_dir = native_copy.parent / ".build"
    build_dir.mkdir()
    old = []
    for i in range(native.KEEP_BUILDS + 3):
        p = build_dir / f"libflash_attn_q8_{i:016x}.so"
        p.write_bytes(b"old")
        Path(str(p) + ".json").write_text("{}")
        os.utime(p, (time.time() - 1000 + i, time.time() - 1000 + i))
        old.append(p)
    stale_tmp = build_dir / "tmp-left-by-a-killed-build"
    stale_tmp.mkdir()
    os.utime(stale_tmp, (time.time() - 7200, time.time() - 7200))
    new = native.build(src_dir=native_copy)
    kept = sorted(build_dir.glob("libflash_attn_q8_" + "?" * 16 + ".so"))
    assert new in kept and len(kept) == native.KEEP_BUILDS
    assert not old[0].exists() and not Path(str(old[0]) + ".json").exists()
    assert old[-1].exists()  # the newest old ones stay
    assert not stale_tmp.exists()


@pytest.mark.parametrize("defines, message", [
    ({"FA_TILE": 0}, "FA_TILE must be between 1 and"),
    ({"FA_TILE": -3}, "FA_TILE must be between 1 and"),
    ({"FA_TILE": 10**9}, "FA_TILE must be between 1 and"),
    ({"FA_PREFETCH": -1}, "FA_PREFETCH must be between 0 and"),
    ({"FA_PREFETCH": 2**31}, "FA_PREFETCH must be between 0 and"),
    ({"FA_TILE": 2.5}, "FA_TILE must be an int"),
    ({"FA_TILE": True}, "FA_TILE must be an int"),
    ({"FA_TILE": "8; system(rm)"}, "FA_TILE must be an int"),
    ({"NO_SUCH_THING": 1}, "unknown build define"),
    ("FA_TILE=0", "defines must be a dict"),
])
def test_build_defines_are_validated_before_compiling(defines, message, monkeypatch):
    monkeypatch.setattr(native, "_run_compiler", lambda *a, **k: pytest.fail("compiled"))
    with pytest.raises((ValueError, TypeError), match=message):
        native.load(defines=defines)


def test_a_valid_define_builds(native_copy):
    assert native.check_defines({"FA_TILE": np.int64(4), "FA_PREFETCH": 0}) == {"FA_TILE": 4, "FA_PREFETCH": 0}
    cache, q, _, _ = make_case(4, 30, 1, 32, 8)
    ffi, lib = native.load(src_dir=native_copy, defines={"FA_TILE": 1})
    out = np.empty(32, np.float32)
    lib.flash_attn_single_q_q8_neon(ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", q),
                                    *cache.kernel_args(0, ffi), 32, 0.2)
    assert np.isfinite(out).all()


def test_dotprod_override_is_honoured(monkeypatch):
    monkeypatch.setenv("LESSONKIT_DOTPROD", "0")
    assert toolchain._cpu_has_dotprod() is False
    monkeypatch.setenv("LESSONKIT_DOTPROD", "1")
    assert toolchain._cpu_has_dotprod() is True
    monkeypatch.setenv("LESSONKIT_DOTPROD", "maybe")
    with pytest.raises(native.BuildError, match="LESSONKIT_DOTPROD must be 1"):
        toolchain._cpu_has_dotprod()
