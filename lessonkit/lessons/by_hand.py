"""The debugger sessions a student types in lesson 06: the by-hand session's committed transcripts
(``notebooks/data/06_session_*.txt``, made by ``tests/transcripts.py``) shown one step at a time, and tier A's
session, printed for this machine (``show_tier_a``), handed in and read back (``read_session``)."""
from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..core import native
from ..display import source
from ..core import validate as check
from ..core.language import _
from .debugger import (DEBUGGERS, PROMPT, TOKEN_TEXT, checked_debugger, debugger_path, install_hint, lldb_values, pairs)
from .toy import KERNEL

TRANSCRIPTS_DIR = native.REPO_DIR / "notebooks" / "data"
REFRESH_COMMAND = "python tests/transcripts.py  # from the workbook's folder, after a change of native/"
# The session in steps, for the lesson to show one at a time: each step is named by the first command it starts
# with, in gdb and in lldb, and runs up to the next step's first command.
SESSION_STEPS = {
    "start":     ("set breakpoint pending on", "breakpoint set -n"),
    "locations": ("info breakpoints", "breakpoint list"),
    "bt":        ("bt 8", "bt 8"),
    "pick_one":  ("delete 1", "breakpoint delete 1"),
    "arrays":    ("advance ", "thread until "),
    "display":   ("display M", "display M"),
    "finish":    ("undisplay", "undisplay 1"),
    "condition": ("disable 2 3", "breakpoint disable 2 3"),
    "watch":     ("watch M", "watchpoint set"),
}
# Left out when a step is shown (kept in the transcript): gdb reports each helper process the program starts
# (Python's subprocess uses vfork), which says nothing about the kernel.
SHOWN_NOISE = re.compile(r"^\[Detaching after v?fork from child process")


def transcript_path(debugger: str = "gdb") -> Path:
    return TRANSCRIPTS_DIR / f"06_session_{checked_debugger(debugger)}.txt"


def engine_debug_recipe() -> str:
    """What to type to debug the real engine's kernel (``vllm_safetensors.c``): markdown, "not run here"."""
    return (TRANSCRIPTS_DIR / _("06_engine_debug_recipe.md")).read_text()


def _step(step: str, debugger: str) -> tuple[str, list[tuple[str, list[str]]]]:
    """(the committed session's shell line, [(each command of ``step`` but comments, what it printed)])."""
    check.one_of("step", step, SESSION_STEPS)
    prompt, lines = f"({debugger}) ", transcript_path(debugger).read_text().splitlines()
    start = lines.pop(0) if lines and lines[0].startswith("$ ") else ""
    typed: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith(prompt) and not line.startswith(prompt + "#"):
            typed.append((line[len(prompt):], []))
        elif typed and not line.startswith(prompt):
            typed[-1][1].append(line)
    names, bounds = list(SESSION_STEPS), []
    for name in names[names.index(step):names.index(step) + 2]:   # this step's first command, then the next's
        prefix = SESSION_STEPS[name][DEBUGGERS.index(debugger)]
        bounds.append(next((i for i in range(bounds[0] + 1 if bounds else 0, len(typed))
                            if typed[i][0].startswith(prefix)), None))
        if bounds[-1] is None:
            raise ValueError(_("the {debugger} transcript has no command starting with {prefix!r} (step {name!r}); "
                               "re-run {REFRESH_COMMAND}").format(
                               debugger=debugger, prefix=prefix, name=name, REFRESH_COMMAND=REFRESH_COMMAND))
    return start, typed[bounds[0]:(bounds + [len(typed)])[1]]


def session_step(step: str, debugger: str = "gdb", max_lines: int = 12) -> str:
    """One step of the committed session (``SHOWN_NOISE`` left out), each command's output cut after
    ``max_lines`` lines, saying how many were left out; "start" begins with the shell command."""
    d = checked_debugger(debugger)
    max_lines = check.integer("max_lines", max_lines, minimum=1)
    start, typed = _step(step, d)
    out = [start] if step == "start" and start else []
    for command, printed in typed:
        out.append(f"({d}) {command}")
        body = [x for x in printed if x.strip() and not SHOWN_NOISE.match(x)]
        if len(body) > max_lines:
            body = body[:max_lines] + [_("   [... {max_lines_body} more lines: {transcript_path_d}]").format(
                                         max_lines_body=len(body) - max_lines,
                                         transcript_path_d=transcript_path(d).name)]
        out.extend(body)
    return "\n".join(out)


def show_step(step: str, max_lines: int = 12) -> None:
    """One step of the gdb session with its output, then the lldb commands of the same step."""
    print(session_step(step, "gdb", max_lines))
    # the transcript hides the build's hash; a command to type names the library as it is on this machine
    real = native.library_path(debug=True).name
    print(_("\nthe same step in lldb:  ") + "  |  ".join(
        c.replace("libflash_attn_q8_debug_<hash>.so", real) for c, unused in _step(step, "lldb")[1]))


# ============================================================ tier A, typed by the student (lesson 06, section 4)
# One short toy generation under gdb or lldb in a terminal; ``exercises.lesson06.ex1`` compares the calls and
# stops of the transcript the student hands in with the kernel's trace of the same generation.

TIER_A_TOKENS = 3      # 3 steps x 4 query heads = 12 calls and 24 stops in the loop: a few minutes of typing
TIER_A_PROGRAM = f"from lessonkit import toy; toy.generate({TIER_A_TOKENS}, debug=True)"
ENTRY_TEXT = "if (hd <= 0"     # the kernel's first statement: where a breakpoint on its name stops
MAX_TRANSCRIPT_CHARS = 8 << 20
_GDB_STOP = re.compile(r"[Bb]reakpoint [\d.]+, (?:0x[0-9a-fA-F]+ in )?(\w+) ?\((.*)\) ?at (\S+?):(\d+)\s*$")
_GDB_DISPLAY = re.compile(PROMPT + r"\d+: (t|M|seq_len) = (\S+)\s*$")
_GDB_PRINT = re.compile(r"^(?:\(gdb\) |\+)(?:p|print) (t|M)\s*$")
_GDB_VALUE = re.compile(PROMPT + r"\$\d+ = (\S+)\s*$")
_STOP_START = re.compile(r"[Bb]reakpoint [\d.]+, ")
_NOT_WRAPPED = re.compile(r"\s*$|\(gdb\)|\+|\d+: \w+ = |.*[Bb]reakpoint [\d.]+, ")  # no piece of a stop line


def _from_folder(path) -> str:
    """As typed after the session's ``cd`` into the workbook's folder: relative where it lies inside it."""
    path = Path(path)
    return str(path.relative_to(native.REPO_DIR) if path.is_relative_to(native.REPO_DIR) else path)


def tier_a_log(debugger: str = "gdb") -> Path:
    """``my-work/06_tier_a_gdb.txt`` (or ``_lldb``), where the session of tier A writes its transcript."""
    return native.REPO_DIR / "my-work" / f"06_tier_a_{checked_debugger(debugger)}.txt"


def tier_a_lines() -> tuple[int, int]:
    """(the line a breakpoint on the kernel's name stops at, the loop's line where M is updated for token t)."""
    return source.find_line(ENTRY_TEXT), source.find_line(TOKEN_TEXT, segment=3)


def tier_a_command_line(debugger: str = "gdb", python: str | None = None) -> str:
    """The folder, the debugger as it is installed here, the Python of this notebook and the toy generation."""
    exe = Path(debugger_path(checked_debugger(debugger)) or debugger).name
    # debuginfod off: gdb would ask whether to download debug symbols for Python from the network
    start = [exe, "-q", "-iex", "set debuginfod enabled off", "--args"] if debugger == "gdb" else [exe, "--"]
    program = [_from_folder(python or sys.executable), "-c", TIER_A_PROGRAM]
    return f"cd {shlex.quote(str(native.REPO_DIR))}\n{shlex.join(start + program)}"


def tier_a_commands(debugger: str = "gdb", library: Path | str | None = None,
                    log: Path | str | None = None) -> list[tuple[str, str]]:
    """(command, why) in order. ``library``: the debug build, whose file name (it carries a hash of the
    sources) goes into lldb's ``-s``; default: the current one. ``log`` defaults to ``tier_a_log``."""
    debugger = checked_debugger(debugger)
    entry, loop = tier_a_lines()
    log, file = _from_folder(log or tier_a_log(debugger)), source.KERNEL_FILE.name
    exited = "[Inferior 1 (process N) exited normally]" if debugger == "gdb" else "Process N exited with status = 0"
    presses = _("then press Enter again and again (Enter repeats continue) until {debugger} says {exited}; each "
                "press runs to the next stop, and the run has a few dozen").format(debugger=debugger, exited=exited)
    if debugger == "gdb":
        return [
            (f"set logging file {log}", _("gdb copies what it prints into this file")),
            ("set logging overwrite on", _("a new session replaces the file")),
            ("set trace-commands on", _("each command goes into the file too, as +command")),
            ("set logging enabled on", _("from here on, the file records")),
            ("set pagination off", _("a long output would stop and wait for a key")),
            ("set breakpoint pending on", _("cffi loads the library after the program starts")),
            (f"break {KERNEL}", _("stops at every call, line {entry}").format(entry=entry)),
            ("run", _("first stop: the frame line shows seq_len=...")),
            ("p seq_len", _("the argument itself")),
            (f"break {file}:{loop}", _("inside the for (t) loop, after M and S were updated for token t")),
            ("continue", _("first stop in the loop")),
            ("display t", _("print t at every stop from now on")),
            ("display M", _("and M (at the entry stops M is not set yet: ignore it there)")),
            ("continue", presses),
            ("set logging enabled off", _("closes the file")),
            ("quit", ""),
        ]
    lib = Path(library).name if library else native.library_path(debug=True).name
    return [
        (f'breakpoint set -n {KERNEL} -s {lib} -C "frame variable seq_len"',
         _("stops at every call of the debug build, line {entry}, and prints seq_len").format(entry=entry)),
        ("run", _("first stop: seq_len of the first call")),
        (f'breakpoint set -f {file} -l {loop} -C "frame variable t M"',
         _("inside the for (t) loop, after M and S were updated: prints t and M at each stop")),
        ("continue", presses),
        (f"session save {log}", _("writes every command and its output to this file")),
        ("quit", ""),
    ]


def show_tier_a(debugger: str = "gdb") -> None:
    """Tier A's session for this machine: the shell command, the library, what to type."""
    lib = native.build(debug=True)   # built now, so that the program under the debugger does not build it
    debugger = checked_debugger(debugger)
    print(_("In a terminal (JupyterLab: File > New > Terminal):"))
    print(tier_a_command_line(debugger))
    print(_("\nThe program loads the debug build {lib}.").format(lib=_from_folder(lib)))
    print(_("At the ({debugger}) prompt, type:").format(debugger=debugger))
    for command, why in tier_a_commands(debugger, lib):
        print(f"\n  # {why}\n  {command}" if why else f"\n  {command}")
    if debugger_path(debugger) is None:
        print(install_hint(debugger))


@dataclass
class SessionCall:   # one kernel call as a typed session shows it
    seq_len: int
    line: int                                        # where the transcript shows it (0-based)
    kv_head: int | None = None                       # from gdb's frame line (kh_off / hd); lldb does not print it
    stops: list[tuple] = field(default_factory=list)  # (t, M, seq_len on the stop's frame line or None, M's line)


@dataclass
class Session:
    debugger: str
    calls: list[SessionCall]
    other_lines: list[int]          # kernel lines the session also stopped at (neither entry nor loop line)


def transcript_text(transcript) -> str:
    """The text itself, or a path (a ``Path``, or a one-line string) to gdb's log or lldb's ``session save``."""
    if isinstance(transcript, Path) or (isinstance(transcript, str) and "\n" not in transcript
                                        and transcript.strip().endswith(".txt")):
        path = Path(transcript).expanduser()
        if not path.is_file() and not path.is_absolute():   # a notebook runs in notebooks/ or my-work/
            path = native.REPO_DIR / path
        if not path.is_file():
            raise ValueError(_("no file {path}: the session writes it when you type the logging commands "
                               "(gdb) or session save (lldb)").format(path=path))
        if path.stat().st_size > MAX_TRANSCRIPT_CHARS:
            raise ValueError(_("{path} is larger than a session of tier A can be").format(path=path))
        return path.read_text(errors="replace")
    if not isinstance(transcript, str):
        raise ValueError(_("give the transcript as text (a string) or as a file (pathlib.Path); got {t}").format(
                           t=type(transcript).__name__))
    if len(transcript) > MAX_TRANSCRIPT_CHARS:
        raise ValueError(_("the transcript is larger than a session of tier A can be"))
    return transcript


def _stop(values: dict[str, tuple[str, int]]) -> tuple:
    """{name: (value, line)} of one stop in the loop -> (t, M, seq_len, M's line), None for what is not shown."""
    t, M, seq = (k(values[n][0].rstrip(",")) if n in values else None for n, k in (("t", int), ("M", float),
                                                                                  ("seq_len", int)))
    return t, M, seq, values["M"][1] if "M" in values else None


def read_session(text: str) -> Session:
    """A typed session of tier A (pasted from the terminal, gdb's log or lldb's ``session save``) -> its kernel
    calls. gdb: each stop's frame line says where it stopped and seq_len; ``display`` (or ``p``) prints t and
    M after it. lldb: the breakpoints' ``frame variable`` print seq_len at each entry, t and M at each stop in
    the loop (``debugger.lldb_values``). ValueError for a value that is not a number."""
    lines = text.splitlines()
    for i in range(len(lines)):   # a stop line that a terminal copied broken at its width, joined again
        j = i + 1                 # (a piece of digits only ends its line number); the pieces' lines left empty
        while (j < min(len(lines), i + 40) and _STOP_START.search(lines[i]) and not _NOT_WRAPPED.match(lines[j])
               and (not _GDB_STOP.search(lines[i]) or lines[j].strip().isdigit())):
            lines[i], lines[j], j = lines[i] + lines[j], "", j + 1
    if any(l.startswith("(lldb)") for l in lines) and not any(_GDB_STOP.search(l) for l in lines):
        calls, pending = [], {}
        for i, name, value in lldb_values(lines):
            if name == "seq_len":
                calls.append(SessionCall(int(value.rstrip(",")), i))
                pending = {}
            elif calls and name in ("t", "M"):
                pending[name] = (value, i)
                if len(pending) == 2:
                    calls[-1].stops.append(_stop(pending))
                    pending = {}
        return Session("lldb", calls, [])
    entry, loop = tier_a_lines()
    calls, other, stop, pending = [], [], None, None
    for i, line in enumerate(lines):
        if (m := _GDB_STOP.search(line)) and m.group(1) == KERNEL:
            args, n, stop = pairs(m.group(2)), int(m.group(4)), None
            if n == entry and "seq_len" in args:
                hd = int(args.get("hd", 0))
                calls.append(SessionCall(int(args["seq_len"]), i,
                                         int(args["kh_off"]) // hd if hd and "kh_off" in args else None))
            elif n == loop and calls:
                stop = {"seq_len": (args["seq_len"], i)} if "seq_len" in args else {}
                calls[-1].stops.append(stop)
            else:
                other.append(n)
        elif stop is not None:
            d, p, v = (r.match(line.strip()) for r in (_GDB_DISPLAY, _GDB_PRINT, _GDB_VALUE))
            if d or (v and pending):   # a displayed value, or the value of the p command just before it
                name, value = (d.group(1), d.group(2)) if d else (pending, v.group(1))
                stop.setdefault(name, (value, i))
            pending = p.group(1) if p else pending if d else None
    for c in calls:
        c.stops = [_stop(s) for s in c.stops]
    return Session("gdb", calls, sorted(set(other)))
