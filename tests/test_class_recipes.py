"""The class image recipe (apt.txt, postBuild, environment.yml: what repo2docker reads) and the
Zero to JupyterHub values (class/z2jh-config.yaml), checked without a cluster or a Docker engine:
the values against the chart's own schema (vendored in class/z2jh/), apt.txt against .ci/run's
package list, postBuild's syntax, and, where repo2docker is installed, the Dockerfile it would
build from this repository."""
from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "class" / "z2jh-config.yaml"
Z2JH = REPO / "class" / "z2jh"

# .ci/run's packages that apt.txt leaves out, each with its reason
NOT_IN_IMAGE = {
    "python3": "the image's Python is the conda environment of environment.yml",
    "python3-venv": "no virtual environment in the image: the Makefile's .venv is not used there",
    "python3-dev": "the conda environment has its own Python headers",
    "git": "repo2docker's base image (buildpack-deps) has git, which nbgitpuller uses",
    "procps": "in repo2docker's base image already; .ci/run needs it for the one-machine hub's tests",
    "passwd": "Kubernetes runs each student as the image's one user: no useradd in the image",
    "iproute2": "only for make test-class and test-offline's namespace with no network, not run in the image",
    "gettext": "msgfmt checks and compiles the message catalog for the tests; lessonkit reads the committed .mo",
    "bubblewrap": "make grade's sandbox, for the teacher's grading; the students' image never grades",
    "poppler-utils": "pdffonts and pdftotext check make handouts' PDFs in the tests; the image makes no handouts",
}
# apt.txt's packages that .ci/run does not install, each with its reason
IMAGE_ONLY = {
    "fonts-noto-cjk": "the Chinese font lessonkit.plotstyle prefers; CI's smaller one is enough there",
}


def _yaml():
    return pytest.importorskip("yaml", reason="pip install pyyaml (the test extra has it)")


def _validator():
    jsonschema = pytest.importorskip("jsonschema", reason="pip install jsonschema (the test extra has it)")
    yaml = _yaml()
    schema = yaml.safe_load((Z2JH / "values.schema.yaml").read_text(encoding="utf-8"))
    # the schema says which draft it is written in (draft 7); validate it as that draft
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _merged(values: dict) -> dict:
    """The chart's default values updated with ours, as helm merges them before it validates:
    mappings merged key by key, anything else (lists too) replaced, and null removes a key."""
    yaml = _yaml()
    defaults = yaml.safe_load((Z2JH / "values.yaml").read_text(encoding="utf-8"))

    def merge(base, over):
        out = dict(base)
        for k, v in over.items():
            if v is None:
                out.pop(k, None)
            elif isinstance(v, dict) and isinstance(out.get(k), dict):
                out[k] = merge(out[k], v)
            else:
                out[k] = v
        return out

    return merge(defaults, values)


def _config() -> dict:
    return _yaml().safe_load(CONFIG.read_text(encoding="utf-8"))


def _errors(values: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in _validator().iter_errors(_merged(values))]


def test_z2jh_values_validate_against_the_charts_schema():
    assert _errors(_config()) == []


@pytest.mark.parametrize("break_it", [
    pytest.param(lambda v: v.__setitem__("singleusr", v.pop("singleuser")), id="misspelled-top-level-key"),
    pytest.param(lambda v: v["singleuser"]["memory"].__setitem__("limit", ["2G"]), id="memory-limit-a-list"),
    pytest.param(lambda v: v["singleuser"]["cpu"].__setitem__("limit", "one"), id="cpu-limit-a-string"),
    pytest.param(lambda v: v["cull"].__setitem__("timeout", "1h"), id="cull-timeout-a-string"),
])
def test_a_broken_copy_of_the_values_is_rejected(break_it):
    # the check above can fail: the same schema refuses a copy with one deliberate mistake
    broken = copy.deepcopy(_config())
    break_it(broken)
    assert _errors(broken), "the schema accepted a broken copy of class/z2jh-config.yaml"


def test_z2jh_values_keep_the_class_defaults():
    v = _config()
    hub = v["hub"]["config"]
    assert hub["JupyterHub"]["authenticator_class"] == "nativeauthenticator.NativeAuthenticator"
    assert hub["NativeAuthenticator"]["open_signup"] is False
    assert hub["Authenticator"]["admin_users"]
    su = v["singleuser"]
    assert (su["memory"]["limit"], su["memory"]["guarantee"]) == ("2G", "1G")
    assert (su["cpu"]["limit"], su["cpu"]["guarantee"]) == (1, 0.5)
    assert v["cull"]["enabled"] is True and v["cull"]["timeout"] == 3600
    url = su["defaultUrl"]
    assert url.startswith("/git-pull?") and "branch=main" in url and "targetPath=flash-attn-q8" in url
    assert "urlpath=lab%2Ftree%2Fflash-attn-q8%2Fmy-work%2Fzh%2F00_start_here.ipynb" in url
    hook = " ".join(su["lifecycleHooks"]["postStart"]["exec"]["command"])
    assert "gitpuller " in hook and "python -m workbench workspace copies" in hook
    # the lesson the student lands on is one the copies make
    assert (REPO / "notebooks" / "zh" / "00_start_here.ipynb").is_file()


def test_the_post_start_hook_is_valid_bash():
    script = _config()["singleuser"]["lifecycleHooks"]["postStart"]["exec"]["command"][-1]
    r = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _ci_packages() -> set[str]:
    """Every package .ci/run installs: its packages=(...) line and the packages+=(...) of the
    other CPUs than arm64, the x86-64 case the class image is built for."""
    text = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    found = re.findall(r"^\s*packages\+?=\(([^)]*)\)", text, flags=re.M)
    assert found, ".ci/run has no packages=(...) line any more"
    return {p for group in found for p in group.split()}


def _apt_txt() -> list[str]:
    # as repo2docker reads it: what precedes a # on each line, blanks skipped
    lines = (REPO / "apt.txt").read_text(encoding="utf-8").splitlines()
    return [p for p in (line.partition("#")[0].strip() for line in lines) if p]


def test_apt_txt_names_cis_packages():
    apt, ci = _apt_txt(), _ci_packages()
    assert len(apt) == len(set(apt)), "a package named twice in apt.txt"
    assert all(re.fullmatch(r"[a-z0-9.+-]+", p) for p in apt), apt
    missing = ci - set(apt) - set(NOT_IN_IMAGE)
    extra = set(apt) - ci - set(IMAGE_ONLY)
    assert not missing, f".ci/run installs {sorted(missing)}, apt.txt does not (or add a reason to NOT_IN_IMAGE)"
    assert not extra, f"apt.txt has {sorted(extra)}, .ci/run does not (or add a reason to IMAGE_ONLY)"
    # the allow-lists name nothing that no longer differs
    assert set(NOT_IN_IMAGE) <= ci - set(apt) and set(IMAGE_ONLY) <= set(apt) - ci


def test_post_build_is_an_executable_bash_script():
    post = REPO / "postBuild"
    assert os.access(post, os.X_OK), "postBuild is not executable"
    text = post.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    r = subprocess.run(["bash", "-n", str(post)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for step in ("-m lessonkit build\n", "-m lessonkit build --debug\n", "overrides.json",
                 '"locale": "zh_CN"', "share/jupyter/lab/settings"):
        assert step in text, step


def test_environment_yml_has_the_class_packages():
    deps = _yaml().safe_load((REPO / "environment.yml").read_text(encoding="utf-8"))["dependencies"]
    names = {re.split(r"[<>=! ]", d, maxsplit=1)[0] for d in deps if isinstance(d, str)}
    assert {"nbgitpuller", "jupyterlab-language-pack-zh-cn", "jupyterlab", "simde"} <= names


def _repo2docker() -> list[str] | None:
    for name in ("jupyter-repo2docker", "repo2docker"):
        exe = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
        if exe:
            return [exe]
    try:
        import repo2docker  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "repo2docker"]


@pytest.mark.slow
def test_repo2docker_writes_a_dockerfile_with_the_recipe(tmp_path):
    cmd = _repo2docker()
    if cmd is None:
        pytest.skip("pip install jupyter-repo2docker")
    # a copy of the tracked files, as a fresh clone has them (no .venv, no builds)
    src = tmp_path / "repo"
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, check=True).stdout.split(b"\0")
    for f in filter(None, files):
        path = REPO / os.fsdecode(f)
        if path.is_file():
            (src / os.fsdecode(f)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / os.fsdecode(f))
    # --no-build --debug: repo2docker detects the buildpacks and prints the Dockerfile it would
    # hand to the engine, without asking a Docker daemon anything
    r = subprocess.run([*cmd, "--no-build", "--debug", "--user-id", "1000", "--user-name", "jovyan",
                        str(src)], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "FROM " in out, out[-4000:]
    for package in _apt_txt():
        assert package in out, f"apt.txt's {package} is not in the Dockerfile"
    assert "./postBuild" in out and "environment.yml" in out


def test_a_teachers_roster_is_never_committed():
    """class/roster.csv, where the README tells a teacher to put the class, holds first passwords."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a checkout")
    r = subprocess.run(["git", "check-ignore", "-q", "class/roster.csv"], cwd=REPO)
    assert r.returncode == 0, "class/roster.csv is not git-ignored"
