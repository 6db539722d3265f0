"""The by-hand debugger sessions of lesson 06: what a student types at the ``(gdb)`` or ``(lldb)``
prompt (``native/tools/sessions/by_hand.gdb``, ``by_hand.lldb``, with the line numbers of the current
source: ``session_commands``), and the committed transcripts of those sessions
(``notebooks/data/06_session_*.txt``, made by ``tests/transcripts.py``), shown one step at a time."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from . import native, source
from . import validate as check
from .env import lldb_path
from .kernels.attention import KERNELS
from .language import _

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
    print(_("\nthe same step in lldb:  ") + "  |  ".join(step_commands(step, "lldb")))
