"""A BuildError in a notebook starts with the compiler's first error: no library frames above it
(IPython shows ``_render_traceback_`` instead of a traceback), at most a few errors, each once
(the traced build compiles the kernel a second time), no long paths of installed packages."""
from __future__ import annotations

import shutil

import pytest

from lessonkit import native
from childproc import assert_clean, run_python

BROKEN = ("float M = -1e9f, S = 0.0f;", "float M = -1e9f S = 0.0f;")  # a missing comma


@pytest.fixture
def broken_copy(tmp_path):
    src = tmp_path / "native"
    shutil.copytree(native.NATIVE_DIR, src, ignore=shutil.ignore_patterns("tests"))
    kernel = src / "flash_attn_q8_neon.c"
    text = kernel.read_text()
    line = text[:text.index(BROKEN[0])].count("\n") + 1
    kernel.write_text(text.replace(*BROKEN))
    return src, line


def test_the_first_line_a_student_reads_is_the_first_compiler_error(broken_copy):
    """A child python compiles a broken copy."""
    src, line = broken_copy
    with pytest.raises(native.BuildError) as err:
        native.load(src_dir=src)
    shown = err.value._render_traceback_()
    assert shown[0].startswith(f"native/flash_attn_q8_neon.c:{line}:") and "error" in shown[0], shown[:3]
    text = "\n".join(shown)
    assert "site-packages" not in text and str(src) not in text and "tmp-" not in text
    assert "In file included from" not in text
    # the kernel is compiled twice (fast and traced) but each error is shown once
    headers = [l for l in shown if ": error:" in l]
    assert len(headers) == len(set(headers)) and 1 <= len(headers) <= native.MAX_ERRORS_SHOWN
    assert shown[-1] == "(lessonkit.BuildError)"


def test_many_errors_are_cut_to_the_first_few(broken_copy):
    """A child python compiles a copy broken in many places."""
    src, _ = broken_copy
    kernel = src / "flash_attn_q8_neon.c"
    text = kernel.read_text()
    for name in ("qsc", "qi", "nblk"):  # undeclare variables: many distinct errors
        text = text.replace(f" {name}[", f" {name}_gone[")
    kernel.write_text(text)
    with pytest.raises(native.BuildError) as err:
        native.load(src_dir=src)
    shown = err.value._render_traceback_()
    assert sum(": error:" in l for l in shown) == native.MAX_ERRORS_SHOWN
    assert any("more error" in l for l in shown), shown


def test_ipython_shows_the_error_without_a_traceback(broken_copy):
    """A real IPython shell, as in a Jupyter kernel, runs the failing cell.
    An IPython shell starts and compiles a broken copy."""
    src, line = broken_copy
    proc = run_python(f"""
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance(colors="NoColor")
        shell.run_cell("from lessonkit import native; native.load(src_dir={str(src)!r})")
        shell.run_cell("print('still alive', 1 + 1)")
    """)
    out = assert_clean(proc)
    lines = [l for l in out.splitlines() if l.strip()]
    assert lines[0].startswith(f"native/flash_attn_q8_neon.c:{line}:"), lines[:5]
    assert "Traceback" not in out and "native.py" not in out and "site-packages" not in out
    assert "still alive 2" in out


def test_a_failed_check_renders_as_its_message():
    e = native.KernelCheckError("The new build of the kernel crashed with SIGSEGV.\nNothing new was loaded.")
    assert e._render_traceback_() == ["The new build of the kernel crashed with SIGSEGV.",
                                      "Nothing new was loaded.", "(lessonkit.KernelCheckError)"]


def test_clean_compiler_output_shortens_installed_paths(tmp_path):
    raw = (f"In file included from {tmp_path}/native/flash_attn_q8_traced.c:41:\n"
           f"{tmp_path}/native/flash_attn_q8_neon.c: In function 'f':\n"
           f"{tmp_path}/native/flash_attn_q8_neon.c:3:5: error: boom\n"
           "/home/s/.venv/lib/python3.11/site-packages/cmeel.prefix/include/simde/x.h:9:1: note: here\n")
    text = native.clean_compiler_output(raw, tmp_path / "native")
    assert text.splitlines()[0] == "native/flash_attn_q8_neon.c:3:5: error: boom"
    assert "site-packages/" not in text.replace("<site-packages>/", "")
