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

from lessonkit import check, native, toolchain
from childproc import assert_clean, run_python
from conftest import make_case

@pytest.fixture
def native_copy(tmp_path):
    src = tmp_path / "native"
    shutil.copytree(native.NATIVE_DIR, src, ignore=shutil.ignore_patterns("tests"))
    return src


@pytest.fixture(autouse=True)
def no_build_cache(monkeypatch):
    """These tests are about the build itself: each compiles, never takes the tests' shared cache."""
    monkeypatch.delenv("LESSONKIT_BUILD_CACHE", raising=False)


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
    # rebuilt, so checked again in a child process (its one progress line), then loaded and right
    assert assert_clean(proc).strip().splitlines() == [
        f"Checking the new build in a separate process (up to {check.smoke_timeout():.0f} s) ...", "OK"]
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


@pytest.mark.parametrize("where", ["a-file/build", "a-file", "/proc/lessonkit-build"])
def test_a_build_folder_setting_that_cannot_be_used_is_named(native_copy, tmp_path, monkeypatch, where):
    """LESSONKIT_BUILD_DIR under a file, at a file, or where no folder can be made (/proc): the
    setting is named with what is wrong, before anything compiles (not "did make clean run?")."""
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("LESSONKIT_BUILD_DIR", where if where.startswith("/") else str(tmp_path / where))
    with pytest.raises(native.BuildError, match="LESSONKIT_BUILD_DIR=.* names a folder lessonkit cannot build in") as e:
        native.build(src_dir=native_copy)
    assert "make clean" not in str(e.value) and "see the error above" not in str(e.value)


def test_a_build_folder_setting_expands_the_home_folder(native_copy, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LESSONKIT_BUILD_DIR", "~/lk-build")
    assert toolchain.build_dir_for(native_copy) == tmp_path / "lk-build"


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf"])
def test_the_check_timeout_setting_is_validated_where_it_is_read(value):
    """LESSONKIT_SMOKE_TIMEOUT=abc no longer breaks `import lessonkit`; it and 0, -1, nan (which
    reported an intact kernel as hung) are refused, by name, when a build is checked."""
    proc = run_python("""
import lessonkit
from lessonkit import check, native
try:
    check.smoke_timeout()
except native.BuildError as e:
    print("MESSAGE", e)
""", env={"LESSONKIT_SMOKE_TIMEOUT": value})
    out = assert_clean(proc)
    assert "MESSAGE LESSONKIT_SMOKE_TIMEOUT must be a number of seconds between 1 and 3600" in out
    assert repr(value) in out


def test_address_sanitizer_without_its_runtime_says_how_to_preload_it(monkeypatch):
    monkeypatch.setenv("LESSONKIT_SANITIZE", "address,undefined")
    monkeypatch.setattr(toolchain, "_asan_runtime_loaded", lambda: False)
    with pytest.raises(native.BuildError, match="LD_PRELOAD=.*libasan.so.*or unset LESSONKIT_SANITIZE"):
        native.build()


@pytest.mark.parametrize("src_dir", ["", " "])
def test_an_empty_src_dir_is_refused_not_taken_for_native(src_dir):
    with pytest.raises(ValueError, match="src_dir is an empty path"):
        native.load(src_dir=src_dir)


@pytest.mark.parametrize("report", ['report {"failures": 5}', 'report [1, 2]', 'report not json',
                                    'report {"failures": [["x", null, null, ["no-such-code"]]]}'])
def test_a_report_that_cannot_be_read_is_a_kernel_check_error(tmp_path, monkeypatch, report):
    """Whatever the child writes as its report, the check of a build is a KernelCheckError, never a
    raw TypeError or KeyError from inside native (the check of the workbook's own library, with the
    child's script replaced by one that writes ``report``)."""
    lib = native.build()
    header = (native.NATIVE_DIR / native.HEADER).read_text()
    fake = tmp_path / "fake_smoke.py"
    fake.write_text("import json, sys\nreq = json.loads(sys.stdin.read())\n"
                    f"open(req['report'], 'w').write({report!r} + '\\n')\n")
    monkeypatch.setattr(check, "SMOKE_SCRIPT", fake)
    result = check.smoke(lib, header, "results")
    with pytest.raises(native.KernelCheckError, match="report of its check that cannot be read"):
        check.judge(result, "results")


def test_a_closed_library_is_opened_again_not_handed_back():
    """ffi.dlclose(lib) by the student: the next load() gives an open library, not the closed one."""
    proc = run_python("""
import numpy as np
import lessonkit as lk
from lessonkit import native
from conftest import make_case
cache, q, _, _ = make_case(3, 50, 1, 64, 16)
ffi, lib = native.load()
want = lk.attend(q, cache, 0)
ffi.dlclose(lib)
assert np.array_equal(lk.attend(q, cache, 0), want)
ffi2, lib2 = native.load()
assert lib2 is not lib
print("OK", ffi2.string(lib2.fa_backend()).decode())
""")
    assert "OK" in assert_clean(proc)


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


@pytest.mark.parametrize("line", ["const char *fa_backend(void);", "typedef int fa_trace;", "void f(int n, float a[n]);"])
def test_a_header_cffi_refuses_is_named_with_its_file(line):
    """Valid C that cffi cannot take (a second prototype, a clashing typedef, a variable-length array
    parameter) is a BuildError naming flash_attn_q8.h, not cffi's bare FFIError and its advice."""
    header = (native.NATIVE_DIR / native.HEADER).read_text()
    i = header.rfind("#endif")
    with pytest.raises(native.BuildError, match="cffi cannot read flash_attn_q8.h") as e:
        native._ffi_for(header[:i] + line + "\n" + header[i:])
    assert "override=True" not in str(e.value)


def test_a_home_folder_that_does_not_exist_is_named(native_copy, monkeypatch):
    monkeypatch.setenv("LESSONKIT_BUILD_DIR", "~no-such-user-xyz/build")
    with pytest.raises(native.BuildError, match="LESSONKIT_BUILD_DIR='~no-such-user-xyz/build' names a folder"):
        native.build(src_dir=native_copy)
    with pytest.raises(ValueError, match="src_dir '~no-such-user-xyz/native'"):
        native.load(src_dir="~no-such-user-xyz/native")


@pytest.fixture
def compiles(tmp_path, monkeypatch):
    """(the kept objects' folder, a list that gets the sorted names of the files each build compiles): builds
    keep their objects in a folder of this test's own, and a spy on toolchain._compile_and_link records them."""
    objects = tmp_path / "objects"
    objects.mkdir()
    monkeypatch.setenv("LESSONKIT_OBJECT_CACHE", str(objects))
    compiled, real = [], toolchain._compile_and_link

    def spy(*args, **kwargs):
        proc = real(*args, **kwargs)
        compiled.append(sorted(Path(job[job.index("-c") + 1]).name for job in proc.args))
        return proc

    monkeypatch.setattr(toolchain, "_compile_and_link", spy)
    return objects, compiled


def test_an_edit_compiles_only_the_files_it_changed(native_copy, compiles):
    """The kept object files (toolchain._object_cache): after an edit of the kernel's file a build compiles that
    file and the traced build's, which includes it; every other object is the one compiled before. A compile that
    warned is not kept (its warning shows on every build), and a kept object damaged since is noticed by the
    linker: every file is compiled again and the build succeeds.
    Slow (about 30 s here): five builds of a copy, two of them of every file."""
    objects, compiled = compiles
    kernel_c = native_copy / "flash_attn_q8_neon.c"
    all_files = sorted(p.name for p in native_copy.glob("*.c"))
    native.build(src_dir=native_copy)
    kernel_c.write_text(kernel_c.read_text() + "\n/* an edit */\n")
    native.build(src_dir=native_copy)
    assert compiled == [all_files, ["flash_attn_q8_neon.c", "flash_attn_q8_traced.c"]], compiled

    kernel_c.write_text(kernel_c.read_text().replace("/* an edit */", "static int never_used;"))
    for unused in range(2):  # a warning (-Wall: unused variable): compiled, and in the library's record, each time
        path = native.build(src_dir=native_copy)
        assert "never_used" in json.loads(Path(f"{path}.json").read_text())["warnings"]
        shutil.rmtree(native_copy.parent / ".build")  # the library goes; the kept objects stay
    assert compiled[2:] == [compiled[1]] * 2, compiled

    for kept in objects.glob("*.o"):
        kept.write_bytes(b"damaged")
    kernel_c.write_text(kernel_c.read_text().replace("static int never_used;", "/* another edit */"))
    native.build(src_dir=native_copy)  # two files compiled, eleven damaged ones taken: the link fails, then ...
    # ... every file is compiled again (the spy sees that second call's files twice: its own, and the first call's
    # result, which is the second's)
    assert compiled[4:] == [all_files, all_files], compiled


def test_a_new_copy_of_native_takes_the_objects_another_copy_compiled(tmp_path, compiles):
    """Each lesson, exercise and test edits a copy of native/ of its own, in a folder of its own: a release build of
    a new copy with one edit compiles the edited file and the traced build's, as an edit of the same copy does. The
    kept objects' key must not hold the copy's folder (the debug-prefix map named it, and every new copy compiled
    all thirteen files). A debug build's objects name the folder in their debug information: they keep the map."""
    compiled = compiles[1]
    copies = []
    for name in ("first", "second"):
        src = tmp_path / name / "native"
        shutil.copytree(native.NATIVE_DIR, src, ignore=shutil.ignore_patterns("tests"))
        copies.append(src)
    native.build(src_dir=copies[0])
    kernel_c = copies[1] / "flash_attn_q8_neon.c"
    kernel_c.write_text(kernel_c.read_text() + "\n/* an edit */\n")
    native.build(src_dir=copies[1])
    all_files = sorted(p.name for p in copies[0].glob("*.c"))
    assert compiled == [all_files, ["flash_attn_q8_neon.c", "flash_attn_q8_traced.c"]], compiled
