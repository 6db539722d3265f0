"""The set-up check of lesson 00 says what is missing and how to install it."""
from __future__ import annotations

import shutil

from lessonkit import env, setup


def test_all_rows_present():
    checks = setup.check_setup()
    names = [c.what for c in checks]
    assert names[:2] == ["C compiler", "kernel build"]
    assert {"gdb", "valgrind", "aarch64 cross compiler", "qemu-aarch64"} <= set(names)
    build = checks[1]
    assert build.ok and build.found in ("neon+dotprod", "neon", "simde-x86_64", "simde-generic")


def test_missing_tool_is_reported_with_install_hint(monkeypatch, capsys):
    real_which = shutil.which
    monkeypatch.setattr(setup.shutil, "which", lambda cmd: None if cmd == "gdb" else real_which(cmd))
    setup.print_setup()
    out = capsys.readouterr().out
    assert "| MISSING | gdb |" in out
    assert "-> gdb:" in out and "install gdb" in out


def test_machine_label_names_cpu_and_backend():
    label = env.machine_label()
    assert env.cpu_name() in label and "kernel backend" in label
