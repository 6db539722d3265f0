"""lessonkit.native: flags per host, the build cache, rebuild after an edit, readable compile
errors, and the debug build. Edits happen in a temporary copy of native/."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import native, toolchain

from conftest import make_case

NORMALIZE = "float inv = S > 0.0f ? 1.0f / S : 0.0f;"


@pytest.fixture
def native_copy(tmp_path):
    src = tmp_path / "native"
    shutil.copytree(native.NATIVE_DIR, src, ignore=shutil.ignore_patterns("tests"))
    return src


def run_kernel(ffi, lib, cache, q):
    out = np.empty(cache.head_dim, np.float32)
    lib.flash_attn_single_q_q8_neon(ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", q),
                                    *cache.kernel_args(0, ffi), cache.head_dim, 0.125)
    return out


def test_backend_names_the_compiled_path():
    name = native.backend()
    assert name in ("neon+dotprod", "neon", "simde-x86_64", "simde-generic")
    assert name.startswith("neon") == native.is_arm64()


def test_unchanged_sources_are_not_rebuilt(native_copy):
    first = native.build(src_dir=native_copy)
    mtime = first.stat().st_mtime_ns
    assert native.build(src_dir=native_copy) == first and first.stat().st_mtime_ns == mtime
    assert first.parent == native_copy.parent / ".build"


def test_edit_rebuild_and_compile_error(native_copy):
    cache, q, _, _ = make_case(2, 45, 1, 64, 8)
    kernel_c = native_copy / "flash_attn_q8_neon.c"
    ffi, lib = native.load(src_dir=native_copy)
    before = run_kernel(ffi, lib, cache, q)

    # an edit is picked up by the next load(), in the same process; this one doubles the output,
    # so its check fails and it loads only with verify="crashes", with a warning that says why
    kernel_c.write_text(kernel_c.read_text().replace(NORMALIZE, NORMALIZE.replace("1.0f / S", "2.0f / S")))
    with pytest.raises(native.KernelCheckError, match="wrong results"):
        native.load(src_dir=native_copy)
    with pytest.warns(native.BuildWarning, match="computes wrong results"):
        ffi2, lib2 = native.load(src_dir=native_copy, verify="crashes")
    assert lib2 is not lib
    np.testing.assert_array_equal(run_kernel(ffi2, lib2, cache, q), 2 * before)
    # and the library loaded before is untouched
    np.testing.assert_array_equal(run_kernel(ffi, lib, cache, q), before)

    # a syntax error: a readable BuildError naming file and line, and the old libraries still work
    text = kernel_c.read_text()
    line = text[:text.index("float M = -1e9f")].count("\n") + 1
    kernel_c.write_text(text.replace("float M = -1e9f, S = 0.0f;", "float M = -1e9f S = 0.0f;"))
    with pytest.raises(lk.BuildError) as err:
        native.load(src_dir=native_copy, verify="crashes")
    message = str(err.value)
    assert f"native/flash_attn_q8_neon.c:{line}:" in message and "error" in message
    assert str(native_copy) not in message  # paths are shown relative, as a student sees them
    np.testing.assert_array_equal(run_kernel(ffi2, lib2, cache, q), 2 * before)

    # restoring the source brings back the first build from the cache, without compiling
    kernel_c.write_text(text.replace(NORMALIZE.replace("1.0f / S", "2.0f / S"), NORMALIZE))
    ffi3, lib3 = native.load(src_dir=native_copy)
    assert lib3 is lib
    np.testing.assert_array_equal(run_kernel(ffi3, lib3, cache, q), before)


def test_debug_build_is_unoptimized_with_symbols(native_copy):
    path = native.build(debug=True, src_dir=native_copy)
    assert "_debug_" in path.name and path != native.build(src_dir=native_copy)
    assert "-O0" in native.compile_flags(debug=True) and "-g" in native.compile_flags(debug=True)
    if shutil.which("gdb"):
        out = subprocess.run(["gdb", "-batch", "-ex", "info line flash_attn_single_q_q8_neon", str(path)],
                             capture_output=True, text=True).stdout
        assert "flash_attn_q8_neon.c" in out  # line information, so a breakpoint can be set
    ffi, lib = native.load(debug=True, src_dir=native_copy)
    cache, q, _, _ = make_case(3, 20, 1, 32, 4)
    ffi_fast, lib_fast = native.load(src_dir=native_copy)
    np.testing.assert_allclose(run_kernel(ffi, lib, cache, q), run_kernel(ffi_fast, lib_fast, cache, q),
                               rtol=1e-5, atol=1e-7)


def test_arch_flags_for_this_host():
    flags = native.arch_flags()
    if native.is_arm64():
        assert flags[0] in ("-march=armv8.2-a+dotprod", "-march=armv8-a")
        assert native.arch_flags(dotprod=False) == ["-march=armv8-a"]
    else:
        assert any(f.startswith("-I") and (native.simde_include_dir() / "simde").is_dir()
                   for f in flags if f.startswith("-I"))


def test_missing_simde_is_explained(monkeypatch):
    if native.is_arm64():
        pytest.skip("ARM builds use arm_neon.h, not SIMDe")
    monkeypatch.setattr(toolchain, "simde_include_dir", lambda: None)
    with pytest.raises(lk.BuildError, match="pip install cmeel-simde"):
        native.arch_flags()


def test_missing_compiler_is_explained(monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with pytest.raises(lk.BuildError, match="No C compiler found"):
        native.compiler()


def test_not_a_native_folder(tmp_path):
    with pytest.raises(lk.BuildError, match="flash_attn_q8.h"):
        native.build(src_dir=tmp_path)
