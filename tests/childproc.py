"""Run a piece of Python in a child process, for tests of cases that could crash the process
that runs them: a segfault there fails the test instead of killing pytest."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_python(code: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) with this interpreter and lessonkit from this checkout importable;
    ``env`` adds to the environment. Returns the finished process (stdout, stderr as text)."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
                **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=REPO)


def assert_clean(proc: subprocess.CompletedProcess) -> str:
    """The child exited normally (no signal, exit code 0); returns its stdout."""
    assert proc.returncode == 0, (f"child exited with {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
                                  f"\n--- stderr\n{proc.stderr[-3000:]}")
    return proc.stdout
