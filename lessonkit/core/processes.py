"""Child processes that never outlive their job, the stop button's one line, and locks a forked child can
take: every subprocess lessonkit starts (the check of a new build, a debugger, valgrind) runs through
``run_bounded``; an interrupt (Ctrl-C) during a build, a check or a valgrind run becomes one line in the
student's language (``stopped``) once the processes of what was stopped are ended."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import weakref
from pathlib import Path
from typing import NamedTuple

from .language import _


class BuildInterrupted(KeyboardInterrupt):
    """The stop button (Ctrl-C) during a build, the check of a new build or a valgrind run. Still a
    KeyboardInterrupt, so the cell stops; its one line says what was stopped and which library is in
    use. The processes of what was stopped are ended first, and nothing half-written is left."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback: one line, not 40 frames of subprocess and selectors
        return [str(self)]


class stopped:
    """A block in which an interrupt becomes a BuildInterrupted that names ``what`` was stopped
    (``then``: a sentence added after it). A class, not a generator: a plain Python traceback of it is
    then one frame shorter."""

    def __init__(self, what: str, then: str = ""):
        self.what, self.then = what, then

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None and issubclass(kind, KeyboardInterrupt) and not issubclass(kind, BuildInterrupted):
            raise BuildInterrupted(" ".join(filter(None, (
                _("Stopped {what}: nothing new was loaded.").format(what=self.what), self.then)))) from None
        return False


def compile_stoppably(run_compiler, cc, flags, tmp_src, files, tmp_lib, src_dir) -> str:
    """``run_compiler(cc, flags, ...)`` (toolchain's) in a worker thread, so that an interrupt can end the
    compiler's processes before the cell stops: toolchain starts them in this process's group, and its pool
    starts the next files as soon as the first ones die, or they run on to the end where the signal
    reached this process alone. Linux (/proc); elsewhere the interrupt waits for them."""
    before, result, done = children(), {}, threading.Event()

    def work():
        try:
            result["messages"] = run_compiler(cc, flags, tmp_src, files, tmp_lib, src_dir)
        except BaseException as e:  # handed to the caller's thread below
            result["error"] = e
        finally:
            done.set()

    # an Event, not Thread.join: Python 3.11's join, interrupted, marks a running thread as ended
    threading.Thread(target=work, name="lessonkit-compile", daemon=True).start()
    try:
        while not done.wait(0.1):  # a wait with a timeout lets the interrupt in
            pass
    except KeyboardInterrupt:
        while not done.is_set():  # the pool starts the next files as the first ones die: end them too
            for pid in children() - before:
                if argv0(pid) == os.path.basename(cc.split()[0]):  # the compiler's, nothing else started here
                    kill_tree(pid)
            done.wait(0.05)
        raise
    if "error" in result:
        raise result["error"]
    return result["messages"]


def children(pid: int | str = "self") -> set[int]:
    """The child processes of ``pid`` (Linux's /proc; an empty set elsewhere)."""
    found = set()
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found.update(int(c) for c in (task / "children").read_text().split())
    except OSError:
        pass
    return found


def argv0(pid: int) -> str:
    try:
        return os.path.basename(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"))
    except OSError:
        return ""


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants, the deepest first (cc1 and as under the compiler driver)."""
    for child in children(pid):
        kill_tree(child)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- a bounded child

KILLED_READ_S = 5.0  # how long the output a killed group left in its pipes is read after a timeout


class Finished(NamedTuple):
    """How a bounded child ended: its exit code (negative: the signal that ended it; None: out of time),
    what it wrote to the pipes it was given (``""`` for a file or DEVNULL), and how many other processes of
    its group were still running when it ended (a fork it made: they were killed)."""
    returncode: int | None
    stdout: str
    stderr: str
    left_behind: int


def group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (Linux's /proc; an empty list elsewhere)."""
    found = []
    for d in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else ():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                found.append(int(d.name))
    return found


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_bounded(argv: list[str], timeout: float, input: str | None = None, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, **popen) -> Finished:
    """Run ``argv`` in a process group of its own for at most ``timeout`` seconds and kill the whole group
    when it ends: after its exit, on the timeout and on an interrupt, so that nothing it started (a forked
    copy, a debugger's program, valgrind's tool) keeps running. ``input``: text for its stdin; ``stdout`` and
    ``stderr``: PIPE (read, as text), a file or DEVNULL; ``popen``: Popen's other arguments (env, cwd)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL, stdout=stdout,
                            stderr=stderr, text=True, start_new_session=True, **popen)
    out = err = None
    try:
        try:
            out, err = proc.communicate(input, timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
            _kill_group(proc.pid)
            try:  # a helper that left the group (setsid) may still hold the pipes open: read them for a while only
                out, err = proc.communicate(timeout=KILLED_READ_S)
            except subprocess.TimeoutExpired:
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
        left = len(group_members(proc.pid)) if code is not None else 0
    finally:  # also on an interrupt
        _kill_group(proc.pid)
        proc.wait()
    return Finished(code, out or "", err or "", left)


# ----------------------------------------------------------------------------- locks across fork()

_renew: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # owner -> {attribute: lock factory}


def fork_safe_lock(owner, name: str, reentrant: bool = False):
    """A new ``threading.Lock`` (``RLock`` with ``reentrant``) for ``owner.<name>`` (an object, or a module for a
    global), put there afresh in every child forked from now on: a thread that held it does not exist in the
    child, which would otherwise wait for it for ever (a cache appending, a timing pinning threads, a check
    running when the student's code forks). The lock itself is threading's, so that ``with`` takes and leaves it
    with no Python line in between, where an interrupt could leave it held."""
    factory = threading.RLock if reentrant else threading.Lock
    _renew.setdefault(owner, {})[name] = factory
    return factory()


_after_fork: list = []


def after_fork_in_child(fn) -> None:
    """Call ``fn()`` in every child forked from now on (POSIX; nothing elsewhere), after the locks are freed."""
    _after_fork.append(fn)


def _in_child() -> None:
    for owner, locks in list(_renew.items()):
        for name, factory in locks.items():
            setattr(owner, name, factory())
    for fn in _after_fork:
        fn()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
