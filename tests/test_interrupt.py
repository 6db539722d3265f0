"""The stop button during a build or the check of a new build, in a real IPython kernel (started with
jupyter_client, as JupyterLab starts one) and in a plain Python process: one line in the student's
language says what was stopped and which library is still in use, instead of a traceback through
native.py, subprocess and selectors; the check's processes are gone, nothing half-written is left, the
cell stops, and the library loaded before still works. Also: the one progress line a check prints,
and which library ``lib`` still is after a failed rebuild."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from childproc import REPO

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

# A copy of native/, its intact build loaded and called once; then an edit that hangs the kernel.
SETUP = """
import os, shutil, tempfile
from pathlib import Path
import numpy as np
from lessonkit import native
from conftest import make_case
work = Path(tempfile.mkdtemp())
src = work / "native"
shutil.copytree(native.NATIVE_DIR, src, ignore=shutil.ignore_patterns("tests"))
kernel_c = src / "flash_attn_q8_neon.c"
ANCHOR = "const int nblk = hd / QBLK;"
def edit(code):
    text = kernel_c.read_text()
    kernel_c.write_text(text.replace(ANCHOR, ANCHOR + "\\n    " + code, 1))
cache, q, _, _ = make_case(5, 40, 2, 64, 16)
def call(ffi, lib):
    out = np.empty(64, np.float32)
    lib.flash_attn_single_q_q8_neon(ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", q),
                                    *cache.kernel_args(1, ffi), 64, 0.125)
    return out
ffi0, lib0 = native.load(src_dir=src)
before = call(ffi0, lib0)
"""
HANG = 'edit("for (;;) { }")\nffi1, lib1 = native.load(src_dir=src)\n'
CHECKED = "Checking the new build in a separate process (up to 300 s) ..."
LEFT = """
# the library loaded before still works; the check left no process (this one's children) and no files
assert np.array_equal(call(ffi0, lib0), before)
children = [c for t in Path("/proc/self/task").iterdir() for c in (t / "children").read_text().split()]
left = sorted(p.name for p in (work / ".build").iterdir() if not p.name.startswith("libflash_attn_q8_"))
print("LEFT", children, left, "ffi1" in globals())
"""
def _as_a_shell_starts_it():
    """A child's SIGINT at its default action and not blocked, as a shell starts python, whatever the process
    that runs the test inherited (a test runner's worker): its preexec_fn."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signal_state(pid: int) -> str:
    """What a process does with signals (/proc: blocked, ignored, caught masks), for a failure's message."""
    try:
        return " ".join(l for l in open(f"/proc/{pid}/status").read().splitlines() if l.startswith(("SigBlk",
                                                                                                     "SigIgn", "SigCgt")))
    except OSError as e:
        return str(e)


ENV = {"LESSONKIT_SMOKE_TIMEOUT": "300", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}


class Kernel:
    """An IPython kernel in a child process, and what each cell run there printed and raised."""

    def __init__(self, env: dict):
        self.km = jupyter_client.KernelManager(kernel_name="python3")
        self.km.start_kernel(env={**os.environ, **env}, cwd=str(REPO), extra_arguments=[])
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 600, interrupt_on: str | None = None) -> dict:
        """Run a cell; ``interrupt_on``: interrupt the kernel (the stop button) once its output shows this."""
        msg_id = self.kc.execute(code)
        out = {"stream": "", "errors": []}
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the cell did not finish in {timeout} s; output so far: {out}") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out["stream"] += content["text"]
                if interrupt_on and interrupt_on in out["stream"]:
                    time.sleep(1.0)  # the check is running its hung kernel by now
                    self.km.interrupt_kernel()
                    interrupt_on = None
            elif kind == "error":
                out["errors"].append(content)
            elif kind == "status" and content["execution_state"] == "idle":
                return out

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture
def kernel(tmp_path):
    k = Kernel(ENV)
    yield k
    k.close()


def test_the_stop_button_during_the_check_shows_one_line_in_ipython(kernel):
    """A Jupyter kernel starts, builds a copy, then an edit that hangs, whose check the stop button ends."""
    setup = kernel.run(SETUP)
    assert not setup["errors"], setup
    stopped = kernel.run(HANG, interrupt_on=CHECKED)
    # the one progress line while it ran, then the one line of the interrupt, and no traceback
    assert stopped["stream"].strip() == CHECKED, stopped
    (error,) = stopped["errors"]
    assert error["ename"] == "BuildInterrupted" and len(error["traceback"]) == 1, error
    line = error["traceback"][0]
    assert line.startswith("Stopped the check of the build in a separate process"), line
    assert "nothing new was loaded" in line and "is still your previous build of" in line, line
    assert not any(w in line for w in ("Traceback", "selectors", "subprocess", ".py")), line
    left = kernel.run(LEFT)
    assert not left["errors"], left
    # no child process, nothing but finished libraries in the build folder, and ffi1 never assigned
    assert "LEFT [] [] False" in left["stream"], left


def test_a_failed_rebuild_says_which_library_lib_still_is_in_ipython(kernel):
    """An IPython shell starts, builds a copy, then fails to build its edit."""
    kernel.run(SETUP)
    # a new cell looks at the sources again (the IPython hook), whatever the time since the last look
    hooked = kernel.run("g = native._generation[0]")
    assert not hooked["errors"], hooked
    failed = kernel.run('edit("int x = ;")\nffi1, lib1 = native.load(src_dir=src)\n')
    (error,) = failed["errors"]
    text = "\n".join(error["traceback"])
    assert error["ename"] == "BuildError" and "The C sources did not compile" in text, text
    assert "lib (what load(src_dir=...) returned before) is still your previous build of" in text, text
    assert "Traceback" not in text
    # nothing was checked: no progress line
    assert CHECKED not in failed["stream"], failed
    bumped = kernel.run("print('BUMPED', native._generation[0] > g)")
    assert "BUMPED True" in bumped["stream"], bumped


PLAIN = SETUP + """
import sys
print("SETUP DONE", flush=True)
""" + HANG + """
print("CARRIED ON")
"""


def test_ctrl_c_during_the_check_is_short_in_plain_python(tmp_path):
    """The same interrupt in a plain ``python`` (SIGINT to that process only, as Jupyter sends it): a
    short message (the frames of the script and load, then the line), an exit by SIGINT, and no check
    process left behind (the kernel's fork-free hang runs in the check's own process group).
    A copy is built and loaded, then an edit that hangs is built and its check interrupted."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PLAIN)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **ENV},
                            preexec_fn=_as_a_shell_starts_it)
    state = ""
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.strip() == CHECKED and any("SETUP DONE" in l for l in lines):
                break
        else:
            raise AssertionError(f"no progress line: {lines} {proc.stderr.read()}")
        time.sleep(1.0)
        state = _signal_state(proc.pid)
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # stopped, not carried on (CPython exits by SIGINT for KeyboardInterrupt itself, with 1 for a subclass)
    assert proc.returncode in (1, -signal.SIGINT), (proc.returncode, err, state)
    assert "CARRIED ON" not in rest
    assert "lessonkit.core.processes.BuildInterrupted: Stopped the check of the build" in err, err
    assert "is still your previous build of" in err and "subprocess" not in err and "selectors" not in err, err
    assert len(err.strip().splitlines()) <= 8, err


VALGRIND = """
from lessonkit import traffic
traffic.simulate("single", 64)   # the driver is built and valgrind runs once
print("READY", flush=True)
traffic.simulate("single", 777777)
print("CARRIED ON")
"""


def _running_with(marker: str) -> list[int]:
    """Pids of valgrind processes whose command line holds ``marker``."""
    pids = []
    for d in os.listdir("/proc"):
        try:
            line = open(f"/proc/{d}/cmdline", "rb").read().decode(errors="replace") if d.isdigit() else ""
            if marker in line and "--callgrind-out-file" in line:
                pids.append(int(d))
        except OSError:
            continue
    return pids


@pytest.mark.skipif(not __import__("shutil").which("valgrind"), reason="valgrind is not installed")
def test_ctrl_c_during_a_valgrind_run_ends_valgrind_and_is_one_line(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(VALGRIND)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **ENV},
                            preexec_fn=_as_a_shell_starts_it)
    try:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
        for unused in range(100):  # valgrind of the long run has started
            if _running_with("777777"):
                break
            time.sleep(0.1)
        assert _running_with("777777"), "valgrind did not start"
        state = _signal_state(proc.pid)
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (1, -signal.SIGINT) and "CARRIED ON" not in rest, (proc.returncode, err, state)
    assert "BuildInterrupted: Stopped valgrind's simulation of single over 777777 tokens" in err, err
    assert "subprocess" not in err and len(err.strip().splitlines()) <= 8, err
    assert not _running_with("777777")


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, name) of every process under ``pid``."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            kids = open(f"/proc/{pid}/task/{t}/children").read().split()
        except OSError:
            continue
        for k in map(int, kids):
            try:
                out.append((k, open(f"/proc/{k}/comm").read().strip()))
            except OSError:
                continue
            out += _descendants(k)
    return out


def test_the_stop_button_during_the_compile_ends_the_compilers(kernel):
    """Jupyter's stop button signals the kernel process alone; the compilers it started end at once too."""
    kernel.run(SETUP)
    pid = int(kernel.run("print('PID', os.getpid())")["stream"].split()[1])
    msg_id = kernel.kc.execute('edit("/* a new build */")\nffi1, lib1 = native.load(src_dir=src)\n')
    for unused in range(600):  # a compiler of this build is running
        if any(d[1].startswith(("cc1", "cc", "gcc", "as")) for d in _descendants(pid)):
            break
        time.sleep(0.05)
    kernel.km.interrupt_kernel()
    errors = []
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            errors.append(msg["content"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    (error,) = errors
    assert error["ename"] == "BuildInterrupted" and len(error["traceback"]) == 1, error
    assert error["traceback"][0].startswith("Stopped the build of the kernel (the compiler)"), error
    assert _descendants(pid) == []
    left = kernel.run(LEFT)
    assert "LEFT [] [] False" in left["stream"], left
