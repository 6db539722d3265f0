"""load() does not look at the sources on every call (that cost 40 us a call), yet it notices an edit
at the next call: after lessonkit's edit helpers at once (a change counter), at the start of a cell
(the IPython hook, tests/test_interrupt.py), and for any other write once SOURCES_WATCH_S has passed."""
from __future__ import annotations

import re
import shutil
import time

import pytest

from lessonkit import kernel_copy, native


@pytest.fixture
def native_copy(tmp_path):
    src = tmp_path / "native"
    shutil.copytree(native.NATIVE_DIR, src, ignore=shutil.ignore_patterns("tests"))
    return src


def _backend(ffi, lib) -> str:
    return ffi.string(lib.fa_backend()).decode()


def _line_of_backend(src, name: str) -> str:
    """The line of fa_build.c that returns this build's backend name (a visible edit that keeps results)."""
    (line,) = [l.strip() for l in (src / "fa_build.c").read_text().splitlines() if re.search(rf'return "{re.escape(name)}";', l)]
    return line


def test_an_edit_helper_is_noticed_at_the_next_call_whatever_the_time(native_copy, monkeypatch):
    monkeypatch.setattr(native, "SOURCES_WATCH_S", 3600.0)  # only the change counter can notice it now
    ffi, lib = native.load(src_dir=native_copy, verify="skip")
    name = _backend(ffi, lib)
    assert native.load(src_dir=native_copy, verify="skip")[1] is lib   # nothing changed: the same library
    kernel_copy.edit_line(native_copy, kernel_copy.Edit("fa_build.c", _line_of_backend(native_copy, name),
                                                        'return "edited-by-helper";'))
    ffi2, lib2 = native.load(src_dir=native_copy, verify="skip")
    assert lib2 is not lib and _backend(ffi2, lib2) == "edited-by-helper"


def test_any_write_is_noticed_once_the_watch_interval_passed(native_copy, monkeypatch):
    ffi, lib = native.load(src_dir=native_copy, verify="skip")
    name = _backend(ffi, lib)
    path = native_copy / "fa_build.c"
    path.write_text(path.read_text().replace(f'return "{name}";', 'return "edited-raw";'))
    time.sleep(native.SOURCES_WATCH_S)
    ffi2, lib2 = native.load(src_dir=native_copy, verify="skip")
    assert lib2 is not lib and _backend(ffi2, lib2) == "edited-raw"


def test_within_the_interval_a_raw_write_waits_for_the_counter(native_copy, monkeypatch):
    """The stated limit: a raw write (no helper) and a call within the interval, in one cell, get the
    library of before; sources_changed() (what a cell's start calls) makes the next call look."""
    monkeypatch.setattr(native, "SOURCES_WATCH_S", 3600.0)
    ffi, lib = native.load(src_dir=native_copy, verify="skip")
    name = _backend(ffi, lib)
    path = native_copy / "fa_build.c"
    path.write_text(path.read_text().replace(f'return "{name}";', 'return "edited-later";'))
    assert native.load(src_dir=native_copy, verify="skip")[1] is lib
    native.sources_changed()
    ffi2, lib2 = native.load(src_dir=native_copy, verify="skip")
    assert _backend(ffi2, lib2) == "edited-later"
