"""The stop button (Ctrl-C) during a build, the check of a new build or a valgrind run: one line in the
student's language instead of a traceback through subprocess and selectors, once the processes of what
was stopped are ended (``lessonkit.native``, ``lessonkit.traffic``)."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

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
