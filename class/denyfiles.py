"""The class's names in /etc/cron.deny and /etc/at.deny, and how they come out again.

Each account the hub makes is denied cron and at (accounts.py: their jobs would run outside the
student's limits). When the class's last name leaves a file, the file is again exactly what it was
before the class first changed it: the same bytes, mode and owner, or no file at all where there
was none. An empty file left behind is not the same as no file:

- at.allow(5) (Debian's at): "If /etc/at.allow does not exist, /etc/at.deny is checked, every
  username not mentioned in it is then allowed to use at. An empty /etc/at.deny means that every
  user may use at. If neither exists, only the superuser is allowed to use at."
- crontab(1) (Debian's cron): "If neither of these files exists, then depending on site-dependent
  configuration parameters, only the super user will be allowed to use this command, or all users
  will be able to use this command." The files, "if they exist, must be either world-readable, or
  readable by group crontab", so a file the class makes is mode 0644.

Crash safety: before its first change of a file the class records, in STATE_DIR (root only), what
the file was, and it records each name before it writes that name into the file. A teardown after
a crash (of the hub or of the machine) reads the record, so it still removes exactly the class's
names and restores the file. A name that was in a file before the class is never the class's and
is never removed. Every file and record is written whole to a temporary file and renamed over the
old one (a crash leaves the old or the new, never half), and the hub and a teardown running at once
take turns (an flock).

Standard library only: classroom.py's teardown runs it before anything is installed.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path

DENY_FILES = ("/etc/cron.deny", "/etc/at.deny")  # a user name a line; no groups in that format
# Machine-wide, not in a class's folder: the deny files are the machine's, shared by every class and
# demo on it, and make class-teardown knows no class folder
STATE_DIR = "/var/lib/flash-attn-class"


class DenyFiles:
    """The class's denials in ``files``, with their record in ``state_dir`` (the defaults: the
    machine's; the tests give folders of their own)."""

    def __init__(self, files=DENY_FILES, state_dir=STATE_DIR):
        self.files = [Path(f) for f in files]
        self.state_dir = Path(state_dir)

    # ------------------------------------------------------------------ the three operations

    def deny(self, user: str) -> None:
        """``user`` is in every deny file (whose folder exists), as one of the class's names."""
        with self._locked():
            for path in self.files:
                if not path.parent.is_dir():
                    continue
                # no record yet: the class has not changed this file, so it is as it was before
                record = self._load(path) or {"file": str(path), "before": _snapshot(path), "names": []}
                current = _read(path)
                if user not in record["names"]:
                    if user in _names(current):
                        continue  # denied before the class: not the class's to add or to remove
                    record["names"].append(user)
                    self._save(path, record)  # before the file changes: a crash leaves it known
                if user not in _names(current):
                    ending = b"" if not current or current.endswith(b"\n") else b"\n"
                    _write(path, (current or b"") + ending + user.encode() + b"\n",
                           like=path if current is not None else None)

    def forget(self, user: str) -> list[str]:
        """``user``'s denials made by the class come out; a file the class has no name left in is
        restored. Returns notes for the teacher (a file someone else changed meanwhile is kept)."""
        notes = []
        with self._locked():
            for path in self.files:
                record = self._load(path)
                if record is None or user not in record["names"]:
                    continue
                current = _read(path)
                if current is not None and user in _names(current):
                    kept = b"".join(ln for ln in current.splitlines(keepends=True) if ln.strip() != user.encode())
                    _write(path, kept, like=path)
                record["names"].remove(user)
                if record["names"]:
                    self._save(path, record)
                else:
                    notes += _restore(path, record["before"])
                    self._drop(path)
        return notes

    def forget_prefix(self, prefix: str) -> tuple[list[str], list[str]]:
        """Every recorded name starting with ``prefix`` is forgotten, whether or not its account is
        still there (a teardown after a crash, an account removed by hand). Returns the names and
        the notes."""
        names = sorted({n for path in self.files if (r := self._load(path)) for n in r["names"] if n.startswith(prefix)})
        notes = []
        for name in names:
            notes += self.forget(name)
        return names, notes

    def names(self) -> set[str]:
        """The class's names in the deny files, from the record."""
        return {n for path in self.files if (r := self._load(path)) for n in r["names"]}

    # ------------------------------------------------------------------ the record

    def _record_path(self, path: Path) -> Path:
        return self.state_dir / (path.name + ".json")

    def _load(self, path: Path) -> dict | None:
        try:
            return json.loads(self._record_path(path).read_text())
        except FileNotFoundError:
            return None

    def _save(self, path: Path, record: dict) -> None:
        self.state_dir.mkdir(mode=0o700, exist_ok=True)
        _write(self._record_path(path), json.dumps(record, indent=1).encode() + b"\n", mode=0o600)

    def _drop(self, path: Path) -> None:
        self._record_path(path).unlink(missing_ok=True)
        try:
            self.state_dir.rmdir()  # the last record gone: the machine holds nothing of the class's
        except OSError:
            pass  # another file's record is still there

    @contextmanager
    def _locked(self):
        # the lock is on the state folder's parent, which stays: a lock file of its own would be
        # left behind, or removed under a process waiting for it
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_dir.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _names(content: bytes | None) -> set[str]:
    return {ln.strip().decode(errors="replace") for ln in (content or b"").splitlines()} - {""}


def _snapshot(path: Path) -> dict | None:
    """What ``path`` is now: its bytes, mode and owner, or None for no file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return {"bytes": base64.b64encode(path.read_bytes()).decode(), "mode": st.st_mode & 0o7777,
            "uid": st.st_uid, "gid": st.st_gid}


def _restore(path: Path, before: dict | None) -> list[str]:
    """``path`` as it was before the class, unless someone else changed it since (then it is kept,
    without the class's names, and a note says so)."""
    current = _read(path)
    if before is None:
        if current is not None and not _names(current):
            path.unlink()  # the class made it: gone again, not left empty
        elif current is not None:
            return [f"{path} was made by the class, and someone has since added names to it; kept as it is "
                    f"now, without the class's names"]
        return []
    content = base64.b64decode(before["bytes"])
    if current is None:
        return [f"{path} was removed by someone else while the class ran; left removed"]
    if _names(current) != _names(content):
        return [f"{path} was changed by someone else while the class ran; kept as it is now, without "
                f"the class's names"]
    _write(path, content, mode=before["mode"], owner=(before["uid"], before["gid"]))
    return []


def _write(path: Path, content: bytes, like: Path | None = None, mode: int = 0o644,
           owner: tuple[int, int] | None = None) -> None:
    """``content`` into ``path`` at once (a temporary file renamed over it), with the mode and
    owner of the file ``like`` (the file being replaced keeps its own), else ``mode`` and ``owner``
    (default: this process's)."""
    if like is not None:
        st = like.stat()
        mode, owner = st.st_mode & 0o7777, (st.st_uid, st.st_gid)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as f:
            f.write(content)
            f.flush()
            if owner is not None:
                os.fchown(f.fileno(), *owner)
            os.fchmod(f.fileno(), mode)  # after fchown, which clears set-id bits
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    dirfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dirfd)  # the rename itself survives a crash of the machine
    finally:
        os.close(dirfd)
