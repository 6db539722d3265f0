"""The committed transcripts of lesson 06's by-hand sessions (notebooks/data/06_session_gdb.txt and
06_session_lldb.txt, shown by lessonkit.by_hand.session_step): made by running each session's script
(native/tools/sessions/by_hand.gdb, by_hand.lldb) under the real debugger in batch mode, and compared with a
new run by tests/test_debug.py.

    python tests/transcripts.py        # from the workbook's folder, after a change of native/ moved a line
"""
from __future__ import annotations

import difflib
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lessonkit import native, source  # noqa: E402
from lessonkit.by_hand import KERNEL, transcript_path  # noqa: E402
from lessonkit.debugger import (DEBUGGERS, batch_argv, checked_debugger, checked_timeout, child_env,  # noqa: E402
                                debugger_path, install_hint)
from lessonkit.processes import run_bounded  # noqa: E402

SESSIONS_DIR = native.NATIVE_DIR / "tools" / "sessions"   # the sessions' scripts, with placeholders
SESSION_PROGRAM = "from lessonkit import native, toy; native.load(); toy.generate(4, debug=True)"
_PLACEHOLDER = re.compile(r"@(FUNCTION|FILE|DEBUG_LIBRARY|LINE\((.+?)\))@")


def session_commands(debugger: str = "gdb", library: Path | str | None = None) -> str:
    """The session's commands, one a line, comments kept, with ``@LINE(text)@`` replaced by the number
    of the kernel's line that contains ``text`` and ``@DEBUG_LIBRARY@`` (lldb's ``-s``) by the file name
    of ``library`` (default: the current debug build's; it carries a hash of the sources)."""
    text = (SESSIONS_DIR / f"by_hand.{checked_debugger(debugger)}").read_text()

    def fill(m):
        if m.group(1) == "FUNCTION":
            return KERNEL
        if m.group(1) == "FILE":
            return source.KERNEL_FILE.name
        if m.group(1) == "DEBUG_LIBRARY":
            return Path(library).name if library else native.library_path(debug=True).name
        return str(source.find_line(m.group(2)))

    return "\n".join(l if l.lstrip().startswith("#") else _PLACEHOLDER.sub(fill, l)
                     for l in text.splitlines()) + "\n"


def saved_transcript(debugger: str = "gdb") -> str:
    """The committed transcript (the environment it was made in is saved beside it, ``.env``)."""
    return transcript_path(debugger).read_text()


def session_start(debugger: str) -> str:
    """The shell command that starts the session, from the workbook's folder (the transcript's first line)."""
    return f"{'gdb --args' if debugger == 'gdb' else 'lldb --'} .venv/bin/python -c \"{SESSION_PROGRAM}\""


def clean_transcript(text: str, debugger: str = "gdb", exe: str | None = None) -> str:
    """A debugger's output made stable and path-free: addresses -> ``0x<addr>``, process and thread
    ids -> ``<pid>``, the build's hash -> ``<hash>``, the workbook's folder -> ``<repo>``, the Python
    environment -> ``<python>``. Noise that depends on the machine is dropped: lldb's echo of its own
    start-up, Debian lldb 14's ``No module named 'lldb.embedded_interpreter'`` traceback (its Python
    scripting is broken there; the sessions never use it), missing-LZMA warnings."""
    # the debugger names files by their real path: a venv that is a symlink shows its target
    prefixes = sorted({sys.prefix, os.path.realpath(sys.prefix), sys.base_prefix, os.path.realpath(sys.base_prefix)},
                      key=len, reverse=True)
    out, skip_tb = [], False
    for line in text.splitlines():
        if line.startswith("Traceback (most recent call last):"):
            skip_tb = True
        if skip_tb:
            skip_tb = "lldb.embedded_interpreter" not in line
            continue
        if "No LZMA support found" in line or debugger == "lldb" and re.match(
                r"\(lldb\) (target create|settings set -- target\.run-args|command source)"
                r"|Current executable set to|Executing commands in", line):
            continue
        # the environment first: a venv inside the workbook's folder (make's .venv) is <python> too
        for p in ([exe] if exe else []) + prefixes:
            line = line.replace(p, "<python>")
        line = line.replace(str(native.REPO_DIR), "<repo>")
        line = re.sub(r"0x[0-9a-fA-F]{5,}", "0x<addr>", line)
        line = re.sub(r"(?i)(process|LWP|child process) \d+", r"\1 <pid>", line)
        line = re.sub(r"(libflash_attn_q8(?:_debug)?)_[0-9a-f]{16}", r"\1_<hash>", line)
        out.append(line.rstrip())
    return "\n".join(out).strip("\n") + "\n"


def run_session(debugger: str = "gdb", timeout: float = 120.0) -> str:
    """Run the session (``session_commands``) under the real debugger in batch mode and return the
    cleaned transcript: the shell command that starts it, then each command after its prompt with
    the comments above it, then what the debugger printed. RuntimeError when the debugger is missing.
    Its floats come from the toy model's fixed seed through this machine's backend; another CPU path
    may print other last digits, which is why ``transcripts_match`` masks floats."""
    debugger, timeout = checked_debugger(debugger), checked_timeout(timeout)
    exe = debugger_path(debugger)
    if exe is None:
        raise RuntimeError(install_hint(debugger))
    native.build(debug=False)   # both builds ready before the child starts: it loads both
    commands = session_commands(debugger, native.build(debug=True))
    child = [sys.executable, "-c", SESSION_PROGRAM]
    with tempfile.TemporaryDirectory() as tmp:
        cmd_file = Path(tmp) / f"by_hand.{debugger}"
        cmd_file.write_text(commands)
        # gdb's trace-commands echoes each command as "+cmd" (_gdb_prompts makes it a prompt line)
        argv = batch_argv(debugger, exe, cmd_file, child, *(["set trace-commands on"] if debugger == "gdb" else []))
        text = run_bounded(argv, timeout, stderr=subprocess.STDOUT, cwd=native.REPO_DIR, env=child_env()).stdout
    if debugger == "gdb":
        text = _gdb_prompts(text, commands)
    return f"$ {session_start(debugger)}\n" + clean_transcript(text, debugger, sys.executable)


def _gdb_prompts(text: str, commands: str) -> str:
    """gdb's ``+cmd`` echo -> ``(gdb) cmd``, with the script's comments above each command (gdb does
    not echo comments; lldb does)."""
    comments, pending = [], []
    for line in commands.splitlines():
        if line.lstrip().startswith("#"):
            pending.append(line)
        elif line.strip():
            comments.append(pending)
            pending = []
    out, i = [], 0
    for line in text.splitlines():
        if line.startswith("+") and not line.startswith("++"):
            out.extend(f"(gdb) {c}" for c in (comments[i] if i < len(comments) else []))
            i += 1
            line = "(gdb) " + line[1:]
        out.append(line)
    return "\n".join(out)


def refresh_transcripts(debuggers=DEBUGGERS) -> list[Path]:
    """Re-run the sessions and write their transcripts to notebooks/data/ (after a change of the kernel
    that moves its lines). Returns the files written."""
    written = []
    for d in debuggers:
        path = transcript_path(d)
        path.write_text(run_session(d))
        path.with_suffix(".env").write_text(capture_environment(d) + "\n")
        written.append(path)
    return written


def capture_environment(debugger: str = "gdb") -> str:
    """What a transcript's exact text depends on besides the kernel: the system, the CPU, the Python
    (its frames in ``bt``) and the debugger's version."""
    exe, version = debugger_path(debugger), ""
    if exe is not None:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        version = ((out.stdout or out.stderr).strip().splitlines() or [""])[0]
    return (f"{platform.system()} {platform.machine()}, Python {sys.version_info.major}.{sys.version_info.minor}, "
            f"{version}")


def kernel_lines(text: str) -> list[str]:
    """The kernel's line numbers a transcript shows, in order (``flash_attn_q8_neon.c:NN``)."""
    return re.findall(r"flash_attn_q8_neon\.c:(\d+)", text)


_FLOAT = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+(?=[eE]))(?:[eE][-+]?\d+)?(?![\w.])")


def mask_floats(text: str) -> str:
    """Floats (``-0.379045874``, ``1.0E+9``) -> ``<float>``; line numbers and integers stay."""
    return _FLOAT.sub("<float>", text)


def transcripts_match(debugger: str = "gdb", timeout: float = 120.0) -> tuple[bool, str]:
    """Re-run the session and compare it with the committed transcript, floats masked: (match, a diff,
    "" when they match). In another environment than the one the transcript was captured in, only the
    kernel's line numbers are compared (other frames and messages, the same stops)."""
    new, old = mask_floats(run_session(debugger, timeout)), mask_floats(saved_transcript(debugger))
    env_file = transcript_path(debugger).with_suffix(".env")
    saved_env = env_file.read_text().strip() if env_file.is_file() else ""
    if saved_env != capture_environment(debugger):
        a, b = kernel_lines(old), kernel_lines(new)
        return a == b, ("" if a == b else f"kernel lines (committed, captured on {saved_env}): {a}\n"
                        f"kernel lines (this run, {capture_environment(debugger)}): {b}")
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        transcript_path(debugger).name + " (committed)", "this run", n=1))
    return new == old, diff


if __name__ == "__main__":
    for path in refresh_transcripts():
        print("wrote", path)
