"""class/denyfiles.py without root or a hub: the class's names in cron.deny and at.deny, on files
and a state folder of the test's own. A file the class made is gone again after its last name, a
file that was there is again the same bytes with the same mode and owner, a name denied before the
class stays, and a teardown after a crash (a new process reading the record) still restores."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

CLASS = Path(__file__).resolve().parent.parent / "class"
sys.path.insert(0, str(CLASS))
import denyfiles  # noqa: E402


@pytest.fixture
def etc(tmp_path):
    folder = tmp_path / "etc"
    folder.mkdir()
    return folder


def kit(etc: Path, tmp_path: Path) -> denyfiles.DenyFiles:
    """A DenyFiles as a new process makes it: nothing in memory, only the record on disk."""
    return denyfiles.DenyFiles(files=(etc / "cron.deny", etc / "at.deny"), state_dir=tmp_path / "state")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_files_the_class_made_are_gone_after_its_last_name(etc, tmp_path):
    kit(etc, tmp_path).deny("jupyter-ming")
    kit(etc, tmp_path).deny("jupyter-hua")
    for name in ("cron.deny", "at.deny"):
        assert lines(etc / name) == ["jupyter-ming", "jupyter-hua"]
        assert (etc / name).stat().st_mode & 0o777 == 0o644  # crontab(1): readable, or cron denies everyone
    assert kit(etc, tmp_path).forget("jupyter-ming") == []
    assert lines(etc / "at.deny") == ["jupyter-hua"]
    assert kit(etc, tmp_path).forget("jupyter-hua") == []
    # no empty at.deny: with neither file only root may use at; with an empty one, everyone
    assert sorted(os.listdir(etc)) == []
    assert not (tmp_path / "state").exists(), "the record outlived the class's last name"


def test_a_file_that_was_there_is_restored_byte_for_byte_with_its_mode_and_owner(etc, tmp_path):
    before = b"# users who may not use at\ndaemon\nbin\n\nnobody"  # a blank line, no final newline
    path = etc / "at.deny"
    path.write_bytes(before)
    os.chmod(path, 0o640)
    if os.geteuid() == 0:
        os.chown(path, 0, 1)  # root:daemon, as Debian's at ships it
    owner = (path.stat().st_uid, path.stat().st_gid)
    kit(etc, tmp_path).deny("jupyter-ming")
    assert lines(path)[-2:] == ["nobody", "jupyter-ming"]
    assert path.stat().st_mode & 0o777 == 0o640 and (path.stat().st_uid, path.stat().st_gid) == owner
    kit(etc, tmp_path).deny("jupyter-hua")
    kit(etc, tmp_path).forget("jupyter-hua")
    kit(etc, tmp_path).forget("jupyter-ming")
    assert path.read_bytes() == before
    assert path.stat().st_mode & 0o777 == 0o640 and (path.stat().st_uid, path.stat().st_gid) == owner
    assert not (etc / "cron.deny").exists()


def test_a_name_denied_before_the_class_is_not_the_classs(etc, tmp_path):
    (etc / "cron.deny").write_text("jupyter-ming\n")
    kit(etc, tmp_path).deny("jupyter-ming")
    assert (etc / "cron.deny").read_text() == "jupyter-ming\n"
    assert lines(etc / "at.deny") == ["jupyter-ming"]
    assert kit(etc, tmp_path).names() == {"jupyter-ming"}  # the at.deny line only
    kit(etc, tmp_path).forget("jupyter-ming")
    assert (etc / "cron.deny").read_text() == "jupyter-ming\n"  # still denied, as before the class
    assert not (etc / "at.deny").exists()


def test_denying_again_changes_nothing(etc, tmp_path):
    for _ in range(3):  # every start of the student's server
        kit(etc, tmp_path).deny("jupyter-ming")
    assert lines(etc / "cron.deny") == ["jupyter-ming"]
    kit(etc, tmp_path).forget("jupyter-ming")
    assert not (etc / "cron.deny").exists()


def test_a_teardown_after_a_crash_still_restores(etc, tmp_path, monkeypatch):
    (etc / "cron.deny").write_bytes(b"nobody\n")
    kit(etc, tmp_path).deny("jupyter-ming")
    # the hub dies between recording hua and writing hua into the files
    real = denyfiles._write

    def crash(path, *args, **kwargs):
        if path.parent == etc:
            raise KeyboardInterrupt("the machine went down")
        return real(path, *args, **kwargs)
    monkeypatch.setattr(denyfiles, "_write", crash)
    with pytest.raises(KeyboardInterrupt):
        kit(etc, tmp_path).deny("jupyter-hua")
    monkeypatch.setattr(denyfiles, "_write", real)
    assert kit(etc, tmp_path).names() == {"jupyter-ming", "jupyter-hua"}
    assert not [p for p in etc.iterdir() if p.name.endswith(".tmp")]
    # the accounts are gone (removed by hand, or userdel ran before the crash): the teardown finds
    # the names in the record
    names, notes = kit(etc, tmp_path).forget_prefix("jupyter-")
    assert names == ["jupyter-hua", "jupyter-ming"] and notes == []
    assert (etc / "cron.deny").read_bytes() == b"nobody\n"
    assert not (etc / "at.deny").exists() and not (tmp_path / "state").exists()


def test_a_crash_in_the_middle_of_a_removal_leaves_no_empty_file(etc, tmp_path, monkeypatch):
    kit(etc, tmp_path).deny("jupyter-ming")
    # the teardown dies after taking the name out of the file, before the file is restored
    monkeypatch.setattr(denyfiles, "_restore", lambda path, before: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        kit(etc, tmp_path).forget("jupyter-ming")
    monkeypatch.undo()
    assert (etc / "cron.deny").read_bytes() == b""  # an empty deny file: as at.deny, everyone allowed
    kit(etc, tmp_path).forget_prefix("jupyter-")
    assert sorted(os.listdir(etc)) == [] and not (tmp_path / "state").exists()


def test_other_prefixes_are_left_alone(etc, tmp_path):
    kit(etc, tmp_path).deny("jupyter-ming")
    kit(etc, tmp_path).deny("fademo-ming")  # the demo beside a class
    assert kit(etc, tmp_path).forget_prefix("fademo-")[0] == ["fademo-ming"]
    assert lines(etc / "cron.deny") == ["jupyter-ming"]
    kit(etc, tmp_path).forget_prefix("jupyter-")
    assert sorted(os.listdir(etc)) == []


def test_a_change_by_someone_else_is_kept_and_said(etc, tmp_path):
    kit(etc, tmp_path).deny("jupyter-ming")
    with open(etc / "at.deny", "a") as f:
        f.write("guest\n")  # the machine's administrator, while the class ran
    notes = kit(etc, tmp_path).forget("jupyter-ming")
    assert lines(etc / "at.deny") == ["guest"]
    assert len(notes) == 1 and "at.deny" in notes[0] and "kept" in notes[0]
    assert not (etc / "cron.deny").exists()


def test_a_missing_folder_is_skipped(tmp_path):
    kit_ = denyfiles.DenyFiles(files=(tmp_path / "no-such" / "at.deny",), state_dir=tmp_path / "state")
    kit_.deny("jupyter-ming")
    assert kit_.names() == set() and not (tmp_path / "no-such").exists()
