"""lessonkit.files.write_atomic: a failed write leaves the old file whole and no temporary file."""
import os

import pytest

from lessonkit.files import write_atomic


def test_write_replaces_and_keeps_mode(tmp_path):
    p = tmp_path / "a.json"
    p.write_text("old")
    os.chmod(p, 0o640)
    write_atomic(p, "new ✓")
    assert p.read_text(encoding="utf-8") == "new ✓"
    assert p.stat().st_mode & 0o777 == 0o640
    assert [q.name for q in tmp_path.iterdir()] == ["a.json"]


def test_failed_write_keeps_old_file_and_leaves_no_temporary(tmp_path, full_disk):
    p = tmp_path / "a.json"
    p.write_text("old")
    full_disk()
    with pytest.raises(OSError):
        write_atomic(p, "new")
    assert p.read_text() == "old"
    assert [q.name for q in tmp_path.iterdir()] == ["a.json"]


def test_an_interrupt_right_after_the_temporary_is_made_leaves_nothing(tmp_path, monkeypatch):
    p = tmp_path / "a.json"
    p.write_text("old")

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "fdopen", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(p, "new")
    assert p.read_text() == "old"
    assert [q.name for q in tmp_path.iterdir()] == ["a.json"]
