"""The class kit's checks that need no root and no hub (class/roster.py, class/classroom.py): a
roster is refused for each kind of mistake with a message naming the line; a class's roster that
others can read, or that still has the demo's published passwords, is refused before the hub
starts; the systemd unit keeps every setting given to make class."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

CLASS = Path(__file__).resolve().parent.parent / "class"
sys.path.insert(0, str(CLASS))
import classroom  # noqa: E402
import roster  # noqa: E402

GOOD = "name,password,role,language\nteacher,Teach-2026-x,teacher,zh\nming,Ming-first-1,student,\nsam,Sam-first-2,,en\n"


def write(tmp_path, text, mode=0o600) -> Path:
    path = tmp_path / "roster.csv"
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)
    return path


def test_a_good_roster_reads_with_its_defaults(tmp_path):
    people = roster.read(write(tmp_path, "\ufeff" + GOOD))  # a spreadsheet's byte-order mark is no part of a name
    assert [(p.name, p.role, p.language) for p in people] == [
        ("teacher", "teacher", "zh"), ("ming", "student", "zh"), ("sam", "student", "en")]


@pytest.mark.parametrize("text, message", [
    ("name,password,role\nteacher,x,teacher\n", "missing: language"),
    ("name,password,role,language\nteacher,x,teacher,zh\nMing Li,x,student,zh\n", "line 3: name 'Ming Li'"),
    ("name,password,role,language\nteacher,x,teacher,zh\nming,x,student,zh\nMING,y,student,zh\n", "line 4: 'ming' appears twice"),
    ("name,password,role,language\nteacher,x,teacher,zh\nming,,student,zh\n", "line 3: ming has no first password"),
    ("name,password,role,language\nteacher,x,admin,zh\n", "role 'admin'"),
    ("name,password,role,language\nteacher,x,teacher,fr\n", "language 'fr'"),
    ("name,password,role,language\nming,x,student,zh\n", "no one has the role 'teacher'"),
])
def test_each_mistake_in_a_roster_is_named(tmp_path, text, message):
    with pytest.raises(roster.RosterError, match=message):
        roster.read(write(tmp_path, text))


def test_the_demo_roster_is_a_valid_roster():
    people = roster.read(CLASS / "demo-roster.csv")
    assert sum(p.is_teacher for p in people) == 1 and len(people) == 4


def test_a_class_roster_others_can_read_or_with_the_demos_passwords_is_refused(tmp_path):
    path = write(tmp_path, GOOD, 0o644)
    with pytest.raises(SystemExit, match="chmod 600"):
        classroom.check_roster(path, roster.read(path), demo=False)
    os.chmod(path, 0o600)
    classroom.check_roster(path, roster.read(path), demo=False)  # its own passwords, mode 600: accepted
    demo = (CLASS / "demo-roster.csv").read_text()
    path = write(tmp_path, demo, 0o600)
    with pytest.raises(SystemExit, match="demo-roster.csv, which are public"):
        classroom.check_roster(path, roster.read(path), demo=False)
    classroom.check_roster(path, roster.read(path), demo=True)  # the demo itself may


def test_the_systemd_unit_keeps_every_setting(monkeypatch):
    monkeypatch.setenv("CLASS_SPAWNER", "local")
    monkeypatch.setenv("CLASS_DEFAULT_LANG", "en")  # the login page's language when the browser names neither
    args = argparse.Namespace(class_dir=Path("/srv/c"), roster=Path("/etc/r.csv"), ip="0.0.0.0", port=8100,
                              prefix="stu-", mem_gb=3.0, cpus=0.5, tasks=300, cull_timeout=1800, home_root="/data")
    unit = classroom.systemd_unit(args)
    start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    for flag in ("serve", "--class-dir /srv/c", "--roster /etc/r.csv", "--port 8100", "--prefix stu-",
                 "--mem-gb 3", "--cpus 0.5", "--tasks 300", "--cull-timeout 1800", "--home-root /data"):
        assert flag in start, (flag, start)
    assert "Environment=CLASS_SPAWNER=local" in unit.splitlines()
    assert "Environment=CLASS_DEFAULT_LANG=en" in unit.splitlines()
