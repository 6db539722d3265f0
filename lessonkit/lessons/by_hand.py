"""The by-hand debugger sessions of lesson 06: what a student types at the ``(gdb)`` or ``(lldb)``
prompt (``native/tools/sessions/by_hand.gdb``, ``by_hand.lldb``, with the line numbers of the current
source: ``session_commands``), and the committed transcripts of those sessions
(``notebooks/data/06_session_*.txt``, made by ``tests/transcripts.py``), shown one step at a time; and tier
A's session, which the student types (``show_tier_a``) and hands in, read back by ``read_session``."""
from __future__ import annotations

import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..core import native
from ..display import source
from . import toy
from ..core import validate as check
from .setup import lldb_path
from ..core.attention import KERNELS
from ..core.language import _

KERNEL = KERNELS["neon"]      # flash_attn_single_q_q8_neon, where every session stops
DEBUGGERS = ("gdb", "lldb")

SESSIONS_DIR = native.NATIVE_DIR / "tools" / "sessions"            # the command scripts (templates)
TRANSCRIPTS_DIR = native.REPO_DIR / "notebooks" / "data"            # their committed, cleaned output
SESSION_PROGRAM = "from lessonkit import native, toy; native.load(); toy.generate(4, debug=True)"
REFRESH_COMMAND = "python tests/transcripts.py  # from the workbook's folder, after a change of native/"
_PLACEHOLDER = re.compile(r"@(FUNCTION|FILE|DEBUG_LIBRARY|LINE\((.+?)\))@")


def install_hint(debugger: str) -> str:
    if debugger == "gdb":
        return _("gdb is not installed (Debian/Ubuntu: sudo apt install gdb; on an Apple Silicon Mac gdb does not "
                 "run: use debugger=\"lldb\", from Xcode's command line tools)")
    return _("lldb is not installed (Debian/Ubuntu: sudo apt install lldb; macOS: lldb comes with Xcode's command "
             "line tools: xcode-select --install)")


def checked_debugger(debugger) -> str:
    if debugger not in DEBUGGERS:
        raise ValueError(_("debugger must be one of {map_debuggers}; got {short_debugger_check}. Use "
                           "debugger=\"lldb\" on macOS, \"gdb\" elsewhere; use_debugger=False makes the same "
                           "records without a debugger (the traced build)").format(
                           map_debuggers=', '.join(map(repr, DEBUGGERS)),
                           short_debugger_check=check.short(debugger)))
    return debugger


def debugger_path(debugger: str = "gdb") -> str | None:
    """The executable of ``debugger`` ("gdb" or "lldb"), None when it is not installed."""
    return shutil.which("gdb") if checked_debugger(debugger) == "gdb" else lldb_path()


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


def transcript_path(debugger: str = "gdb") -> Path:
    """The committed transcript: ``notebooks/data/06_session_gdb.txt`` or ``06_session_lldb.txt``."""
    return TRANSCRIPTS_DIR / f"06_session_{checked_debugger(debugger)}.txt"


def saved_transcript(debugger: str = "gdb") -> str:
    """The committed transcript (the environment it was made in is saved beside it, ``.env``)."""
    return transcript_path(debugger).read_text()


def engine_debug_recipe() -> str:
    """What to type to debug the real engine's kernel (``vllm_safetensors.c``; line 6594 according to
    the article): markdown labelled "not run here", in the workbook's language."""
    return (TRANSCRIPTS_DIR / _("06_engine_debug_recipe.md")).read_text()


# The session in steps, for the lesson to show one at a time: each step is named by the first command
# it starts with, in gdb and in lldb, and runs up to the next step's first command.
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
# Left out when a step is shown (kept in the transcript): gdb reports each helper process the program
# starts (Python's subprocess uses vfork), which says nothing about the kernel.
SHOWN_NOISE = re.compile(r"^\[Detaching after v?fork from child process")


def parse_transcript(text: str, debugger: str = "gdb") -> tuple[str, list[tuple[str, list[str]]]]:
    """A committed transcript -> (the shell line that started it, [(each command, what it printed)]);
    the script's comments (``(gdb) # ...``) are left out."""
    prompt = f"({checked_debugger(debugger)}) "
    lines = text.splitlines()
    start = lines[0] if lines and lines[0].startswith("$ ") else ""
    out = []
    for line in lines[1 if start else 0:]:
        if line.startswith(prompt) and not line.startswith(prompt + "#"):
            out.append((line[len(prompt):], []))
        elif out and not line.startswith(prompt):
            out[-1][1].append(line)
    return start, out


def _step(step: str, debugger: str) -> tuple[str, list[tuple[str, list[str]]]]:
    """(the start line, the commands of ``step`` with their output) of the committed transcript."""
    if step not in SESSION_STEPS:
        raise ValueError(_("step must be one of {map_session_steps}; got {short_step_check}").format(
                           map_session_steps=', '.join(map(repr, SESSION_STEPS)),
                           short_step_check=check.short(step)))
    start, lines = parse_transcript(saved_transcript(debugger), debugger)
    col, names = DEBUGGERS.index(debugger), list(SESSION_STEPS)

    def first(name, after=0):
        prefix = SESSION_STEPS[name][col]
        for i in range(after, len(lines)):
            if lines[i][0].startswith(prefix):
                return i
        raise ValueError(_("the {debugger} transcript has no command starting with {prefix!r} (step {name!r}); "
                           "re-run {REFRESH_COMMAND}").format(
                           debugger=debugger, prefix=prefix, name=name, REFRESH_COMMAND=REFRESH_COMMAND))

    begin, nxt = first(step), names.index(step) + 1
    return start, lines[begin:first(names[nxt], begin + 1) if nxt < len(names) else len(lines)]


def step_commands(step: str, debugger: str = "gdb") -> list[str]:
    """The commands of one step of the session (``SESSION_STEPS``), as typed."""
    return [command for command, unused in _step(step, checked_debugger(debugger))[1]]


def session_step(step: str, debugger: str = "gdb", max_lines: int = 12) -> str:
    """One step of the committed session: each command after its prompt, then what the debugger
    printed (``SHOWN_NOISE`` left out), cut after ``max_lines`` lines per command, saying how many
    were left out; the step "start" begins with the shell command that started the debugger."""
    d = checked_debugger(debugger)
    max_lines = check.integer("max_lines", max_lines, minimum=1)
    start, lines = _step(step, d)
    out = [start] if step == "start" and start else []
    for command, printed in lines:
        out.append(f"({d}) {command}")
        body = [x for x in printed if x.strip() and not SHOWN_NOISE.match(x)]
        if len(body) > max_lines:
            body = body[:max_lines] + [_("   [... {max_lines_body} more lines: {transcript_path_d}]").format(
                                         max_lines_body=len(body) - max_lines,
                                         transcript_path_d=transcript_path(d).name)]
        out.extend(body)
    return "\n".join(out)


def show_step(step: str, max_lines: int = 12) -> None:
    """Print one step of the gdb session with its output, then the lldb commands of the same step."""
    print(session_step(step, "gdb", max_lines))
    # the transcript hides the build's hash; a command to type names the library as it is on this machine
    real = native.library_path(debug=True).name
    print(_("\nthe same step in lldb:  ") + "  |  ".join(
        c.replace("libflash_attn_q8_debug_<hash>.so", real) for c in step_commands(step, "lldb")))


# ============================================================ tier A, typed by the student (lesson 06, section 4)
# The student runs one short toy generation under gdb or lldb in a terminal, prints what tier A asks at each
# stop and hands in the transcript; ``read_session`` turns it back into calls and stops, and
# ``exercises.lesson06.ex1`` compares those with the kernel's trace of the same generation.

TIER_A_TOKENS = 3      # 3 steps x 4 query heads = 12 calls and 24 stops in the loop: a few minutes of typing
TIER_A_PROGRAM = f"from lessonkit import toy; toy.generate({TIER_A_TOKENS}, debug=True)"
TIER_A_LOGS = {"gdb": "06_tier_a_gdb.txt", "lldb": "06_tier_a_lldb.txt"}   # in my-work/
ENTRY_TEXT = "if (hd <= 0"     # the kernel's first statement: where a breakpoint on its name stops
TOKEN_TEXT = "v_cache_q8[t / kv_bs]"   # segment 3, after this token's update of M and S (the loop's stop)
MAX_TRANSCRIPT_CHARS = 8 << 20


def _from_folder(path) -> str:
    """``path`` as typed after the session's ``cd`` into the workbook's folder: relative where it lies
    inside it (the lesson's outputs then show no machine's folder but in the ``cd`` line)."""
    path = Path(path)
    try:
        return str(path.relative_to(native.REPO_DIR))
    except ValueError:
        return str(path)


def tier_a_log(debugger: str = "gdb") -> Path:
    """Where the session of tier A writes its transcript: ``my-work/06_tier_a_gdb.txt`` (or ``_lldb``)."""
    return native.REPO_DIR / "my-work" / TIER_A_LOGS[checked_debugger(debugger)]


def tier_a_lines() -> tuple[int, int]:
    """(the line a breakpoint on the kernel's name stops at, the loop line where M is updated for token t)."""
    return source.find_line(ENTRY_TEXT), source.find_line(TOKEN_TEXT, segment=3)


def tier_a_stops() -> tuple[int, int]:
    """(stops at the entry, stops in the loop) of tier A's generation: one call per query head and step,
    and step k's calls see a cache of k tokens."""
    heads = toy.ToyConfig().n_q_heads
    return TIER_A_TOKENS * heads, heads * TIER_A_TOKENS * (TIER_A_TOKENS + 1) // 2


def tier_a_command_line(debugger: str = "gdb", python: str | None = None) -> str:
    """The shell command that starts tier A's session on this machine: the folder, the debugger as it
    is installed here, the Python of this notebook and the toy generation."""
    exe = debugger_path(checked_debugger(debugger)) or debugger
    python = _from_folder(python or sys.executable)
    # debuginfod off: gdb would ask whether to download debug symbols for Python from the network
    start = (f"{Path(exe).name} -q -iex 'set debuginfod enabled off' --args" if debugger == "gdb"
             else f"{Path(exe).name} --")
    return f"cd {shlex.quote(str(native.REPO_DIR))}\n{start} {shlex.quote(python)} -c {shlex.quote(TIER_A_PROGRAM)}"


def tier_a_commands(debugger: str = "gdb", library: Path | str | None = None,
                    log: Path | str | None = None) -> list[tuple[str, str]]:
    """What to type at the prompt, (command, why) in order. ``library``: the debug build (its real file
    name goes into lldb's ``-s``); default: the current one. ``log``: the transcript's file (default
    ``tier_a_log``)."""
    debugger = checked_debugger(debugger)
    entry, loop = tier_a_lines()
    log, file = _from_folder(log or tier_a_log(debugger)), source.KERNEL_FILE.name
    stops = tier_a_stops()
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
            ("continue", _("then press Enter again and again (Enter repeats continue) until gdb says "
                           "[Inferior 1 (process N) exited normally]: the run stops {n} times in all ({entries} "
                           "at the entry, {loops} in the loop), so about {n} presses").format(
                           n=sum(stops), entries=stops[0], loops=stops[1])),
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
        ("continue", _("then press Enter again and again (Enter repeats continue) until lldb says "
                       "Process N exited with status = 0: the run stops {n} times in all ({entries} at the entry, "
                       "{loops} in the loop), so about {n} presses").format(
                       n=sum(stops), entries=stops[0], loops=stops[1])),
        (f"session save {log}", _("writes every command and its output to this file")),
        ("quit", ""),
    ]


def show_tier_a(debugger: str = "gdb") -> None:
    """Print tier A's session for this machine: the shell command, the library, what to type."""
    from ..core import native as _native
    lib = _native.build(debug=True)   # built now, so that the program under the debugger does not build it
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
class SessionCall:
    """One kernel call as a typed session shows it."""
    seq_len: int
    line: int                                        # where the transcript shows it (0-based)
    kv_head: int | None = None                       # from gdb's frame line (kh_off / hd); lldb does not print it
    stops: list[tuple] = field(default_factory=list)  # (t, M, seq_len on the stop's frame line or None, M's line)


@dataclass
class Session:
    debugger: str
    calls: list[SessionCall]
    other_lines: list[int]          # kernel lines the session also stopped at (neither entry nor loop line)


_GDB_STOP = re.compile(r"[Bb]reakpoint [\d.]+, (?:0x[0-9a-fA-F]+ in )?(\w+) \((.*)\) at (\S+?):(\d+)\s*$")
_PROMPT = r"^(?:\((?:gdb|lldb)\) ?)*"   # a prompt that stdin not being a terminal leaves before the output
_GDB_DISPLAY = re.compile(_PROMPT + r"\d+: (t|M|seq_len) = (\S+)\s*$")
_GDB_PRINT = re.compile(r"^(?:\(gdb\) |\+)(?:p|print) (t|M)\s*$")
_GDB_VALUE = re.compile(_PROMPT + r"\$\d+ = (\S+)\s*$")
_LLDB_VALUE = re.compile(_PROMPT + r"\((?:const )?(?:int|float)\) (seq_len|t|M) = (\S+)\s*$")


def transcript_text(transcript) -> str:
    """A transcript as text: the text itself, or a path (``pathlib.Path``, or a one-line string naming a
    file) to the file gdb logged or lldb's ``session save`` wrote."""
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


def _number(text: str, kind):
    return kind(text.rstrip(","))


def read_session(text: str) -> Session:
    """A typed session of tier A (pasted from the terminal, gdb's log or lldb's ``session save``) ->
    its kernel calls. gdb: each stop's frame line says where it stopped and seq_len, and ``display``
    prints t and M after it. lldb: the breakpoints' ``frame variable`` commands print seq_len at
    each entry and t, M at each stop in the loop (lldb prints them before or after the stop's own
    lines, and ``session save`` keeps no stop lines, so lldb's session is read from those values).
    ValueError for a value that is not a number."""
    entry, loop = tier_a_lines()
    lines = text.splitlines()
    if any(l.startswith("(lldb)") for l in lines) and not any(_GDB_STOP.search(l) for l in lines):
        return _read_lldb(lines)
    calls, other, stop, pending = [], [], None, None
    for i, line in enumerate(lines):
        m = _GDB_STOP.search(line)
        if m and m.group(1) == KERNEL:
            args = dict(re.findall(r"(\w+)=([^,\s]+)", m.group(2)))
            n, seq = int(m.group(4)), int(args["seq_len"]) if "seq_len" in args else None
            stop = None
            if n == entry and seq is not None:
                hd = int(args.get("hd", 0))
                calls.append(SessionCall(seq, i, int(args["kh_off"]) // hd if hd and "kh_off" in args else None))
            elif n == loop and calls:
                stop = {"seq_len": seq}
                calls[-1].stops.append(stop)
            else:
                other.append(n)
            continue
        if stop is None:
            continue
        d = _GDB_DISPLAY.match(line.strip())
        if d:
            stop.setdefault(d.group(1), d.group(2))
            stop.setdefault(d.group(1) + "@", i)
            continue
        p = _GDB_PRINT.match(line.strip())
        if p:
            pending = p.group(1)
            continue
        v = _GDB_VALUE.match(line.strip())
        if v and pending:
            stop.setdefault(pending, v.group(1))
            stop.setdefault(pending + "@", i)
        pending = None
    for c in calls:
        c.stops = [(_number(s["t"], int) if "t" in s else None, _number(s["M"], float) if "M" in s else None,
                    s["seq_len"], s.get("M@")) for s in c.stops]
    return Session("gdb", calls, sorted(set(other)))


def _read_lldb(lines: list[str]) -> Session:
    calls, pending = [], {}
    for i, line in enumerate(lines):
        m = _LLDB_VALUE.match(line.strip())
        if not m:
            continue
        name, value = m.groups()
        if name == "seq_len":
            calls.append(SessionCall(_number(value, int), i))
            pending = {}
        elif calls:
            pending[name], pending[name + "@"] = value, i
            if "t" in pending and "M" in pending:
                calls[-1].stops.append((_number(pending["t"], int), _number(pending["M"], float), None, pending["M@"]))
                pending = {}
    return Session("lldb", calls, [])
