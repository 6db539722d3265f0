"""The class roster: one CSV file the teacher writes, one row per person.

    name,password,role,language
    teacher,change-me-1,teacher,zh
    alice,first-password,student,zh
    bob,first-password,student,en

- name: the login name on the hub, lower case (a-z, 0-9, '-', '_'; 1-24 characters, starting with a
  letter). Each person also gets a Unix account named PREFIX + name (``jupyter-alice`` by default,
  as The Littlest JupyterHub names them), so students' files are apart by the operating system's
  own permissions.
- password: the first password. The hub keeps only a bcrypt hash of it and asks for a new one at
  the first login (a student cannot start a server before changing it). This file keeps the plain
  text: classroom.py refuses it when other users can read it (chmod 600), and class/roster.csv is
  git-ignored.
- role: ``teacher`` (an admin of the hub: approves sign-ups, sees every server) or ``student``.
- language: ``zh`` (the default: the Chinese lessons and a Chinese JupyterLab) or ``en``. Someone
  who signs up at /hub/signup, not being on the roster, gets CLASS_DEFAULT_LANG (zh unless set).

Standard library only: the class commands read the roster before any package is installed.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

COLUMNS = ("name", "password", "role", "language")
ROLES = ("teacher", "student")
LANGUAGES = ("zh", "en")
# A Unix user name has to fit useradd's rules and stay short with the prefix in front of it.
NAME = re.compile(r"[a-z][a-z0-9_-]{0,23}")


@dataclass(frozen=True)
class Person:
    name: str
    password: str
    role: str
    language: str

    @property
    def is_teacher(self) -> bool:
        return self.role == "teacher"


class RosterError(ValueError):
    """A roster that cannot be used as it is; the message names the file, the line and the fix."""


def read(path: Path | str) -> list[Person]:
    """The people of the roster at ``path``, checked: every column present, names valid and unique,
    roles and languages from the lists above, at least one teacher."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM from a spreadsheet program is not part of a name
    except OSError as e:
        raise RosterError(f"cannot read the roster {path}: {e.strerror or e}") from None
    rows = csv.DictReader(text.splitlines())
    missing = [c for c in COLUMNS if c not in (rows.fieldnames or [])]
    if missing:
        raise RosterError(f"{path}: the first line must name the columns {','.join(COLUMNS)}; "
                          f"missing: {', '.join(missing)}")
    people, seen = [], set()
    for line, row in enumerate(rows, start=2):
        values = {c: (row.get(c) or "").strip() for c in COLUMNS}
        if not any(values.values()):
            continue  # a blank line
        where = f"{path}, line {line}"
        name = values["name"].lower()
        if not NAME.fullmatch(name):
            raise RosterError(f"{where}: name {values['name']!r} must be 1-24 characters of a-z, 0-9, '-' "
                              "or '_', starting with a letter (it becomes a Unix user name)")
        if name in seen:
            raise RosterError(f"{where}: {name!r} appears twice")
        if not values["password"]:
            raise RosterError(f"{where}: {name} has no first password")
        role = values["role"].lower() or "student"
        if role not in ROLES:
            raise RosterError(f"{where}: role {values['role']!r} must be one of {', '.join(ROLES)}")
        language = values["language"].lower() or "zh"
        if language not in LANGUAGES:
            raise RosterError(f"{where}: language {values['language']!r} must be one of {', '.join(LANGUAGES)}")
        seen.add(name)
        people.append(Person(name, values["password"], role, language))
    if not any(p.is_teacher for p in people):
        raise RosterError(f"{path}: no one has the role 'teacher'; the hub needs an admin")
    return people
