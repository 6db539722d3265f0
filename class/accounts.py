"""The Unix accounts of a class: one per person of the hub, made when their server first starts
(hub.py) and removed by teardown (classroom.py). Standard library only.

An account is PREFIX + the hub's name (``jupyter-ming``), in the group CLASS_GROUP (how teardown
finds the hub's accounts, and how the hub refuses to take over an account it did not make), with:
- a home only its owner can read (mode 0700);
- no login shell: the hub starts every process of a student inside their limits, and an account
  that could log in over ssh or su would run outside them (JupyterLab's terminals get bash through
  SHELL, which the spawner sets);
- no cron and no at (/etc/cron.deny, /etc/at.deny): their jobs, too, would run outside the limits.
  Those two files are the machine's: denyfiles.py records what they were and restores them.
"""
from __future__ import annotations

import grp
import os
import pwd
import subprocess
import time

from denyfiles import DenyFiles

CLASS_GROUP = "flash-attn-class"
NO_LOGIN = next((p for p in ("/usr/sbin/nologin", "/sbin/nologin") if os.path.exists(p)), "/bin/false")
DENIALS = DenyFiles()


def unix_name(name: str) -> str:
    return os.environ.get("CLASS_USER_PREFIX", "jupyter-") + name


def ensure_unix_user(name: str, home_root: str = "/home") -> pwd.struct_passwd:
    """The Unix account of hub user ``name``, made if missing: no login shell, denied cron and at,
    a home only they can read. An existing account of that name that the hub did not make (not in
    CLASS_GROUP) is refused: the hub never takes over someone's account."""
    user = unix_name(name)
    try:
        subprocess.run(["groupadd", "--force", CLASS_GROUP], check=True, capture_output=True)
        entry = pwd.getpwnam(user)
    except KeyError:
        home = f"{home_root}/{user}"
        made = subprocess.run(["useradd", "--create-home", "--home-dir", home, "--shell", NO_LOGIN,
                               "--user-group", "--groups", CLASS_GROUP, "--comment", f"flash-attn-q8 class {name}",
                               user], capture_output=True, text=True)
        if made.returncode != 0:
            raise RuntimeError(f"useradd {user} failed: {made.stderr.strip()}")
        entry = pwd.getpwnam(user)
    if user in grp.getgrnam(CLASS_GROUP).gr_mem and entry.pw_shell != NO_LOGIN:  # made by an older hub
        subprocess.run(["usermod", "--shell", NO_LOGIN, user], check=True, capture_output=True)
    if user not in grp.getgrnam(CLASS_GROUP).gr_mem:
        raise RuntimeError(f"the Unix account {user} exists and was not made by the class hub; "
                           f"choose another name in the roster or another CLASS_USER_PREFIX")
    os.chmod(entry.pw_dir, 0o700)  # a student's home is theirs alone
    DENIALS.deny(user)
    return entry


def forget_unix_user(user: str) -> list[str]:
    """What ensure_unix_user added outside the account itself (the cron and at denials); returns
    notes for the teacher (denyfiles.py)."""
    return DENIALS.forget(user)


def class_accounts(prefix: str) -> list[str]:
    """The accounts the hub made whose names start with ``prefix``."""
    try:
        members = grp.getgrnam(CLASS_GROUP).gr_mem
    except KeyError:
        return []
    return [m for m in members if m.startswith(prefix)]


def remove(user: str) -> list[str]:
    """End every process of ``user`` (their group's leftovers are limits.py's), then remove the
    account, its home and its cron and at denials; returns notes for the teacher."""
    subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
    for _ in range(50):
        if subprocess.run(["pgrep", "-u", user], capture_output=True).returncode != 0:
            break
        time.sleep(0.1)
    subprocess.run(["userdel", "--remove", user], check=True, capture_output=True)
    return forget_unix_user(user)


def remove_group_if_empty() -> bool:
    try:
        if grp.getgrnam(CLASS_GROUP).gr_mem:
            return False
    except KeyError:
        return True
    subprocess.run(["groupdel", CLASS_GROUP], check=True, capture_output=True)
    return True
