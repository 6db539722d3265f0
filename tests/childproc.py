"""Run a piece of Python in a child process, for tests of cases that could crash the process
that runs them: a segfault there fails the test instead of killing pytest."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_python(code: str, timeout: float = 240, env: dict | None = None,
               input: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) with this interpreter, lessonkit from this checkout and the tests'
    modules importable, one BLAS thread, and Python's fault handler on (a crash prints where);
    ``env`` adds to the environment, ``input`` goes to stdin; ``cwd`` (default: this checkout) is
    also the first entry of the child's sys.path. Returns the finished process."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
                "PYTHONFAULTHANDLER": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd or REPO, input=input)


def assert_clean(proc: subprocess.CompletedProcess) -> str:
    """The child exited normally (no signal, exit code 0); returns its stdout."""
    assert proc.returncode == 0, (f"child exited with {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
                                  f"\n--- stderr\n{proc.stderr[-3000:]}")
    return proc.stdout
