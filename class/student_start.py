"""What a student's server runs first, as the student, before it becomes jupyterhub-singleuser.

1. The student's copy of the workbook, ``~/flash-attn-q8``: cloned from the class's published
   bundle (classroom.py publish) on the first start, updated on every later start with nbgitpuller's merge (a file the
   student changed keeps the student's version; a file they deleted comes back).
2. Their lesson copies in ``~/flash-attn-q8/my-work/``, exactly as ``make lab`` and ``make update``
   make them (``python -m workbench workspace copies``): a lesson the student edited is never
   overwritten.
3. For a student whose roster language is English, JupyterLab's language setting is set to English
   once (the class default is Chinese); after that it is the student's own setting.

Nothing here may stop the server from starting: a failed step is printed to the hub's log and the
student still gets their work. Standard library and nbgitpuller only.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def log(message: str) -> None:
    print(f"[student_start {os.environ.get('USER', '?')}] {message}", file=sys.stderr, flush=True)


def sync_workbook(url: str, branch: str, clone: Path) -> None:
    from nbgitpuller.pull import GitPuller
    for line in GitPuller(url, str(clone), branch=branch).pull():
        log(line.rstrip())


def make_copies(clone: Path, language: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(clone), "LESSONKIT_LANG": language}
    out = subprocess.run([sys.executable, "-m", "workbench", "workspace", "copies"], cwd=clone, env=env,
                         capture_output=True, text=True, timeout=120)
    for line in (out.stdout + out.stderr).splitlines():
        log(line)


def english_once(home: Path) -> None:
    settings = home / ".jupyter/lab/user-settings/@jupyterlab/translation-extension/plugin.jupyterlab-settings"
    if not settings.exists():
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps({"locale": "en"}) + "\n")


def main() -> None:
    home = Path(os.environ["HOME"])
    clone = home / os.environ.get("CLASS_CLONE_NAME", "flash-attn-q8")
    language = os.environ.get("CLASS_LANG", "zh")
    steps = [("sync the workbook", lambda: sync_workbook(os.environ["CLASS_REPO_URL"],
                                                        os.environ.get("CLASS_BRANCH", "main"), clone)),
             ("make the lesson copies", lambda: make_copies(clone, language))]
    if language == "en":
        steps.append(("set JupyterLab to English", lambda: english_once(home)))
    for what, step in steps:
        try:
            step()
        except Exception as e:  # noqa: BLE001 -- the server must start whatever happened here
            log(f"could not {what}: {type(e).__name__}: {e}")
    singleuser = os.path.join(os.environ["CLASS_ENV_BIN"], "jupyterhub-singleuser")
    os.execv(singleuser, [singleuser, *sys.argv[1:]])


if __name__ == "__main__":
    main()
