"""What students read cites only what they have: no reference to the developers' notes (by the name
of their file) anywhere in the repository, this file included, and nbval's markers as cell tags, not as lines in the student's view."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# my-work/: the student's own copies (lessonkit/lessons/workspace.py), git-ignored, not the repository's text
# wheelhouse/ and build/: make wheelhouse's downloads (other projects' files) and setuptools' scratch copy, git-ignored too
SKIP_DIRS = {".git", ".venv", ".build", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", "my-work", "wheelhouse", "build"}
# the developers' notes, which students never see; spelled in two parts so that this file names them nowhere
FORBIDDEN = "".join(("GUI", "DE"))


def _files():
    for path in REPO.rglob("*"):
        if path.is_file() and not SKIP_DIRS & set(path.relative_to(REPO).parts) and path.suffix != ".pyc":
            yield path


def test_no_citation_of_the_developers_notes():
    hits = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{path.relative_to(REPO)}:{n}" for n, line in enumerate(text.splitlines(), 1) if FORBIDDEN in line]
    assert not hits, f"cite the primary source (docs/references.md) instead: {hits}"


def test_no_code_cell_shows_an_nbval_marker():
    shown = []
    for path in sorted((REPO / "notebooks").rglob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            lines = "".join(cell["source"]).splitlines() if cell["cell_type"] == "code" else []
            if any(line.strip().startswith("# NBVAL") for line in lines):
                shown.append(f"{path.name} cell {i}")
    assert not shown, f"use the cell tags nbval-check-output etc. instead: {shown}"


def test_lessons_link_the_references_that_exist():
    refs = REPO / "docs" / "references.md"
    assert refs.is_file()
    linked = [p.name for p in (REPO / "notebooks").glob("*.ipynb") if "../docs/references.md" in p.read_text()]
    assert linked, "no lesson links docs/references.md"


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs git and a checkout")
def test_nothing_under_my_work_is_tracked():
    """my-work/ holds the students' own copies, git-ignored. git treats an ignored file as expendable: a
    tracked file there would overwrite a student's copy on their next pull (make update refuses it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # the checkout that cwd names
    listed = subprocess.run(["git", "ls-files", "-z", "--", "my-work"], cwd=REPO, env=env, check=True,
                            capture_output=True, text=True).stdout
    tracked = [p for p in listed.split("\0") if p]
    assert not tracked, f"take these out of git (git rm --cached): {tracked}"
