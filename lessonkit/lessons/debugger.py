"""gdb and lldb in lesson 06: which one is here, how each runs in batch mode, and one reader of what each prints,
for the batch run and for the session a student types (``by_hand``). Tier A of article 9-2, section 4, in batch
mode: breakpoints in the debug build's kernel during one toy generation show ``seq_len`` at entry, a token loop
that runs ``seq_len`` times and an ``M`` that never decreases; without a debugger the traced build says the same."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core import native
from ..display import source
from ..core import validate as check
from ..core.language import _
from ..core.processes import run_bounded
from .setup import lldb_path
from .toy import KERNEL, ToyConfig, checked_config, generate

DEBUGGERS = ("gdb", "lldb")
MAX_OBSERVED_TOKENS = 256   # the records grow with the square of the generation's length
MAX_TIMEOUT_S = 3600.0      # the longest wait for a debugger run
# Where the breakpoints go, found by text (never by a typed line number):
TOKEN_TEXT = "v_cache_q8[t / kv_bs]"   # segment 3, after this token's update of M and S (the loop's stop)
LEAVE_TEXT = "float inv"               # segment 4's first statement: the token loop is over
MARK = "@@"                            # prefix of the lines the gdb commands print
PROMPT = r"^(?:\((?:gdb|lldb)\) ?)*"   # what stdin not being a terminal may leave before a debugger's output
_LLDB_VALUE = re.compile(PROMPT + r"\((?:const )?(?:int|float)\) (\w+) = (\S+)\s*$")   # (float) M = 1.25
# The batch run's stops and what each prints. lldb has no printf: each stop runs one ``frame variable``, whose
# first name says which stop it was.
STOPS = {"enter": ("seq_len", "kh_off", "hd"), "token": ("t", "s", "M", "S"), "leave": ("S",)}


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
                           map_debuggers=', '.join(map(repr, DEBUGGERS)), short_debugger_check=check.short(debugger)))
    return debugger


def debugger_path(debugger: str = "gdb") -> str | None:
    """None when it is not installed; lldb may be there under a versioned name only (``lldb-14``)."""
    return shutil.which("gdb") if checked_debugger(debugger) == "gdb" else lldb_path()


def batch_argv(debugger: str, exe: str, script: Path | str, program: list[str], *gdb_init: str) -> list[str]:
    """``exe`` running ``script`` on ``program``, then quitting. Neither reads the user's init file; gdb fetches no
    debug symbols (debuginfod would ask about the network) and runs no auto-loaded Python."""
    if debugger == "lldb":
        return [exe, "-x", "-b", "-s", str(script), "--", *program]
    init = ("set debuginfod enabled off", "set auto-load python-scripts off", *gdb_init)
    return [exe, "-batch", "-nx", *(a for cmd in init for a in ("-iex", cmd)), "-x", str(script), "--args", *program]


def child_env() -> dict:
    """A child Python's: this workbook's lessonkit, no thread pools (fewer threads to follow)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(native.REPO_DIR), env.get("PYTHONPATH")]))
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def checked_timeout(timeout) -> float:
    return check.finite_float("timeout", timeout, minimum=0.01, maximum=MAX_TIMEOUT_S)


def pairs(text: str) -> dict[str, str]:
    """gdb's ``name=value`` lists: a stop's frame line (``seq_len=1, kv_dim=64, ...``), the batch run's lines."""
    return dict(re.findall(r"(\w+)=([^,\s]+)", text))


def lldb_values(lines: list[str]):
    """(0-based line, name, value) of each variable lldb printed. The values alone say where the stops are:
    lldb prints them before or after a stop's own lines, and ``session save`` keeps no stop lines."""
    for i, line in enumerate(lines):
        if m := _LLDB_VALUE.match(line.strip()):
            yield i, m.group(1), m.group(2)


@dataclass(frozen=True)
class Breakpoints:
    file: str        # the kernel file's name, as the debuggers' linespecs want it
    token_line: int  # segment 3: once per token, M and S already updated for token t
    leave_line: int  # segment 4: the call's last stop
    function: str = KERNEL


def breakpoints(path: Path | str = source.KERNEL_FILE) -> Breakpoints:
    """Not on the ``TRACE_TOKEN(`` line: that macro is empty outside the traced build, so the line has code only
    in the traced copy of the kernel."""
    return Breakpoints(Path(path).name, source.find_line(TOKEN_TEXT, segment=3, path=path),
                       source.find_line(LEAVE_TEXT, segment=4, path=path))


def gdb_commands(bp: Breakpoints | None = None) -> str:
    """Without ``run`` (make debug-aarch64 starts its own program): each stop prints one line and continues."""
    bp = bp or breakpoints()
    lines = ["set pagination off", "set confirm off", "set print thread-events off",
             "set breakpoint pending on"]   # the library is not loaded yet: cffi dlopens it later
    for where, (kind, names) in zip((bp.function, f"{bp.file}:{bp.token_line}", f"{bp.file}:{bp.leave_line}"),
                                    STOPS.items()):
        fmt = " ".join(f"{n}=%d" if n in ("seq_len", "kh_off", "hd", "t") else f"{n}=%.9g" for n in names)
        printf = f'printf "{MARK}{kind} {fmt}\\n", {", ".join(names)}'
        lines += [f"break {where}", "commands", "silent", printf, "continue", "end"]
    return "\n".join(lines) + "\n"


def lldb_commands(bp: Breakpoints | None = None) -> str:
    bp = bp or breakpoints()
    wheres = (f"-n {bp.function}", f"-f {bp.file} -l {bp.token_line}", f"-f {bp.file} -l {bp.leave_line}")
    return "\n".join(["settings set auto-confirm true"] + [
        f'breakpoint set {where} -G true -C "frame variable {" ".join(names)}"'
        for where, names in zip(wheres, STOPS.values())]) + "\n"


@dataclass
class CallRecord:   # what the debugger saw in one kernel call
    call: int            # index of the call in the run
    seq_len: int         # the argument, at entry
    kv_head: int         # kh_off / hd
    t: list[int]         # the token index at each stop in segment 3, in order
    s: list[float]       # the token's score there
    M: list[float]       # M after that token
    S: list[float]       # S after that token
    final_S: float | None = None  # S at segment 4
    step: int | None = None       # the generation step (from the toy's call order)
    q_head: int | None = None


def _records(lines: list[str], stops, debugger: str) -> list[CallRecord]:
    """(0-based line, kind, {name: value}) of each stop -> one CallRecord per call; ValueError naming the line
    of a stop outside a call, or of a value missing or not a number."""
    records: list[CallRecord] = []
    for i, kind, vals in stops:
        try:
            if kind == "enter":
                hd = int(vals["hd"])
                records.append(CallRecord(len(records), int(vals["seq_len"]),
                                          int(vals["kh_off"]) // hd if hd else -1, [], [], [], []))
            elif not records or records[-1].final_S is not None:
                raise ValueError(f"a {kind} stop outside a kernel call")
            elif kind == "token":
                records[-1].t.append(int(vals["t"]))
                for name in ("s", "M", "S"):
                    getattr(records[-1], name).append(float(vals[name]))
            else:
                records[-1].final_S = float(vals["S"])
        except (KeyError, ValueError) as e:
            raise ValueError(f"line {i + 1} of the {debugger} output: {lines[i].strip()!r}: {e}") from None
    return records


def parse_gdb_output(text: str) -> list[CallRecord]:
    """What ``gdb_commands`` prints (other lines ignored) -> one CallRecord per call."""
    lines = text.splitlines()
    marked = ((i, re.search(re.escape(MARK) + r"(enter|token|leave) (.*)", line)) for i, line in enumerate(lines))
    return _records(lines, [(i, m.group(1), pairs(m.group(2))) for i, m in marked if m], "gdb")


def parse_lldb_output(text: str) -> list[CallRecord]:
    """What ``lldb_commands`` prints -> one CallRecord per call. A stop begins at ``seq_len`` or ``t``, or at a
    name its stop already has (segment 4's S after the loop's)."""
    lines, kinds, stops = text.splitlines(), {names[0]: kind for kind, names in STOPS.items()}, []
    for i, name, value in lldb_values(lines):
        if not stops or name in ("seq_len", "t") or name in stops[-1][2]:
            stops.append((i, kinds.get(name), {}))
        stops[-1][2][name] = value
    return _records(lines, [s for s in stops if s[1]], "lldb")


@dataclass
class Observation:
    records: list[CallRecord]
    source: str                    # "gdb", "lldb" or "trace"
    n_tokens: int
    config: ToyConfig
    tokens: list[int] = field(default_factory=list)  # the generated ids, as the program printed them
    commands: str = ""             # the debugger's command file ("" for the trace)
    message: str = ""              # why the trace was used, if it was


def checked_tokens(n_tokens) -> int:
    return check.at_most("n_tokens", check.integer("n_tokens", n_tokens, minimum=1), MAX_OBSERVED_TOKENS,
                         _("tokens of an observed generation: its records grow with the square of its length"))


def records_from_trace(n_tokens: int, config: ToyConfig | None = None) -> tuple[list[CallRecord], list[int]]:
    """The records without a debugger, from the traced build: the iterations are the tokens whose V row address
    the kernel recorded. Only V rows, s, M and S are traced, for at most MAX_OBSERVED_TOKENS."""
    n_tokens, config = checked_tokens(n_tokens), checked_config(config)
    gen = generate(n_tokens, config=config, trace=True, verbose=False, trace_fields=("v_rows", "s", "M", "S"))
    traces, gen.traces, records = gen.traces, None, []
    for i, c in enumerate(gen.calls):
        t, traces[i] = traces[i], None  # each call's trace goes as soon as its record is made
        done = np.flatnonzero(t.v_rows != 0).tolist()
        records.append(CallRecord(i, c.seq_len, c.kv_head, done, t.s[done].tolist(), t.M[done].tolist(),
                                  t.S[done].tolist(), float(t.S[-1]), c.step, c.q_head))
    return records, gen.tokens


def _run_batch(exe: str, debugger: str, n_tokens: int, config: ToyConfig, timeout: float) -> tuple[str, str, str]:
    native.build(debug=True)   # built here, so that the child finds it ready
    conf = "" if config == ToyConfig() else f"config=toy.{config!r}, "
    child = [sys.executable, "-c", f"from lessonkit import toy; toy.generate({n_tokens}, {conf}debug=True)"]
    commands = gdb_commands() if debugger == "gdb" else lldb_commands()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / f"tier_a.{debugger}"
        script.write_text(commands + "run\n")
        argv = batch_argv(debugger, exe, script, child)
        done = run_bounded(argv, timeout, cwd=native.REPO_DIR, env=child_env())
    if done.returncode is None:
        raise subprocess.TimeoutExpired(argv, timeout, done.stdout, done.stderr)
    return done.stdout, done.stderr, commands


def observe_generation(n_tokens: int = 16, config: ToyConfig | None = None, use_gdb: bool | None = None,
                       timeout: float = 120.0, debugger: str | None = None,
                       use_debugger: bool | None = None) -> Observation:
    """``lessonkit.toy.generate(n_tokens, debug=True)`` in a child Python under ``debugger`` (None: gdb where it
    is installed, else lldb, as on an Apple Silicon Mac), killed after ``timeout`` seconds. ``use_debugger``
    (older name ``use_gdb``): None uses the debugger where it works, else the traced build, ``message`` saying
    why; True requires it (RuntimeError saying what to install); False always uses the trace."""
    lldb_instead = debugger is None and not debugger_path("gdb") and debugger_path("lldb") is not None
    debugger = checked_debugger(("lldb" if lldb_instead else "gdb") if debugger is None else debugger)
    n_tokens, timeout, config = checked_tokens(n_tokens), checked_timeout(timeout), checked_config(config)
    if use_gdb is not None and use_debugger is not None:
        raise TypeError(_("give use_debugger or its older name use_gdb, not both"))
    use = use_gdb if use_debugger is None else use_debugger
    if use is not None and not isinstance(use, bool):
        raise TypeError(_("use_debugger must be None, True or False; got {short_use_check}").format(
                          short_use_check=check.short(use)))

    def from_trace(why: str) -> Observation:
        records, tokens = records_from_trace(n_tokens, config)
        return Observation(records, "trace", n_tokens, config, tokens,
                           message=why + _("; the records come from the traced build of the kernel instead"))

    exe = debugger_path(debugger)
    if use is False:
        return from_trace(_("{debugger} not requested").format(debugger=debugger))
    if exe is None:
        if use:
            raise RuntimeError(install_hint(debugger))
        missing = DEBUGGERS if debugger == "gdb" and debugger_path("lldb") is None else (debugger,)
        return from_trace(_("no debugger ran: {hint}").format(hint=_("; ").join(map(install_hint, missing))))
    expected = n_tokens * config.n_q_heads
    try:
        out, err, commands = _run_batch(exe, debugger, n_tokens, config, timeout)
        records = (parse_gdb_output if debugger == "gdb" else parse_lldb_output)(out)
        if len(records) != expected:
            tail = "\n".join((out + err).strip().splitlines()[-15:])
            raise RuntimeError(_("{debugger} saw {records} kernel calls, expected {expected}; the end of its "
                                 "output:\n{tail}").format(
                                 debugger=debugger, records=len(records), expected=expected, tail=tail))
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as e:
        if use:
            raise RuntimeError(_("the {debugger} run failed: {e}").format(debugger=debugger, e=e)) from e
        return from_trace(_("{debugger} could not run the generation ({splitlines_e})").format(
                            debugger=debugger, splitlines_e=str(e).splitlines()[0]))
    for i, r in enumerate(records):   # the toy's call order: step by step, query head by query head
        r.step, r.q_head = divmod(i, config.n_q_heads)
    m = re.search(r"generated token ids: \[([\d, ]*)\]", out)
    tokens = [int(x) for x in m.group(1).split(",") if x.strip()] if m else []
    return Observation(records, debugger, n_tokens, config, tokens, commands=commands,
                       message=_("gdb is not installed here: lldb ran the generation") if lldb_instead else "")


def same_records(observation: Observation, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    """The same calls, seq_len, kv heads and token order as the traced build, and M within ``rtol``: the debugged
    build is -O0, the traced one -O3 with FMA contraction, so M may differ in its last bits (1e-5 relative is
    about 100 float32 steps)."""
    if not isinstance(observation, Observation):
        raise TypeError(_("observation must be what observe_generation returns; got {observation}").format(
                          observation=type(observation).__name__))
    if observation.source == "trace":   # the trace against itself would agree and prove nothing
        raise ValueError(_("these records come from the traced build, not from a debugger ({message}): there is "
                           "nothing to compare them with").format(message=observation.message))
    traced, unused = records_from_trace(observation.n_tokens, observation.config)
    got = observation.records
    return (len(got) == len(traced)
            and all((g.seq_len, g.kv_head, g.t) == (t.seq_len, t.kv_head, t.t) for g, t in zip(got, traced))
            and all(np.allclose(g.M, t.M, rtol=rtol, atol=atol) for g, t in zip(got, traced)))
