"""`make lab` serves JupyterLab with the student's working copy of lesson 00 (my-work/, made by the
target from notebooks/): run the Makefile's own target on a free local port and ask the server for
the notebook. Loopback only; the server is stopped at the end."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "jupyter").exists() or not shutil.which("make"),
                                reason="make lab needs make and the .venv that `make lab` creates")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, deadline: float, server: subprocess.Popen):
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.load(r)
        except OSError:
            assert server.poll() is None, "make lab exited early"
            time.sleep(0.5)
    raise AssertionError("jupyter lab did not answer in time")


def test_make_lab_serves_lesson_00(tmp_path):
    port, token = free_port(), "workbook-test"
    args = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token}"
    if os.geteuid() == 0:
        args += " --allow-root"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path)}
    server = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        body = get_json(f"{base}/api/contents/my-work/00_start_here.ipynb?token={token}",
                        time.monotonic() + 120, server)
        assert body["type"] == "notebook"
        assert body["content"]["cells"][0]["source"].startswith("# 00 · Start here")
        # every lesson has its working copy (a student's earlier copy is theirs: not compared)
        work = get_json(f"{base}/api/contents/my-work?token={token}", time.monotonic() + 10, server)
        shipped = {p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")}
        assert shipped <= {f["name"] for f in work["content"]} and "glossary.md" in {f["name"] for f in work["content"]}
        # ... and in Chinese, in my-work/zh/
        work_zh = get_json(f"{base}/api/contents/my-work/zh?token={token}", time.monotonic() + 10, server)
        assert {p.name for p in (REPO / "notebooks" / "zh").glob("[0-9][0-9]*_*.ipynb")} <= {f["name"] for f in work_zh["content"]}
        # the whole repository is browsable, so native/*.c can be edited from JupyterLab
        native = get_json(f"{base}/api/contents/native?token={token}", time.monotonic() + 10, server)
        assert "flash_attn_q8_neon.c" in {f["name"] for f in native["content"]}
        with urllib.request.urlopen(f"{base}/lab?token={token}", timeout=10) as r:
            assert r.status == 200 and b"JupyterLab" in r.read()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def locale_default(base: str, token: str, server: subprocess.Popen) -> str:
    setting = get_json(f"{base}/lab/api/settings/@jupyterlab/translation-extension:plugin?token={token}",
                       time.monotonic() + 120, server)
    return setting["schema"]["properties"]["locale"]["default"]


@pytest.mark.parametrize("lang, locale", [("en", "default"), ("zh", "zh_CN")])
def test_make_lab_lang_sets_the_interface_language(tmp_path, lang, locale):
    """make lab LAB_LANG=zh: JupyterLab's menus in Chinese by default (its language pack is installed);
    the English lessons keep JupyterLab's own default ("default": the browser's language, English if none)."""
    port, token = free_port(), "workbook-test"
    args = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token}"
    if os.geteuid() == 0:
        args += " --allow-root"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path)}
    server = subprocess.Popen(["make", "-s", "lab", f"LAB_LANG={lang}", f"LAB_ARGS={args}"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        assert locale_default(base, token, server) == locale
        packs = get_json(f"{base}/lab/api/translations/?token={token}", time.monotonic() + 10, server)
        assert "zh_CN" in packs["data"], "the Chinese language pack is not installed"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_lab_lang_zh_opens_the_chinese_lesson_00():
    """make lab LAB_LANG=zh (make lab-zh) starts JupyterLab on the Chinese lesson 00; other values are refused."""
    make = ["make", "--no-print-directory", "-n", "lab"]  # under make test, make prints its directories otherwise
    out = subprocess.run([*make, "LAB_LANG=zh"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    jupyter = [ln for ln in out.splitlines() if "jupyter lab" in ln]
    assert len(jupyter) == 1 and jupyter[0].endswith("my-work/zh/00_start_here.ipynb"), out
    bad = subprocess.run([*make, "LAB_LANG=fr"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode != 0 and "LAB_LANG must be en" in bad.stderr
