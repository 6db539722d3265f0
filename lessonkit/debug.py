"""The article's debugging tasks with a real debugger, and "break it, rebuild, see" (introduced in
lesson 06; article 9-2, sections 3 and 4).

Tier A (A 档) asks: put a breakpoint in the kernel of a debug build, run one generation, and observe
``seq_len`` at entry, whether the token loop runs exactly ``seq_len`` times, and whether ``M`` never
decreases. Here that runs on any machine with gdb:

    obs = observe_generation(16)   # lessonkit.toy.generate(16, debug=True) under gdb, batch mode
    obs.records[0]                 # one CallRecord per kernel call: seq_len, iterations, M after each token
    obs.summary()                  # the three observations, computed from the records
    print(by_hand_commands(16))    # the same in a terminal, typed by hand
    observe_aarch64()              # the real aarch64 build (sdot) under qemu-aarch64 + gdb-multiarch

Where gdb is missing, ``observe_generation`` says so and makes the same records from the traced
build of the kernel instead (``source == "trace"``).

Break it (article section 3): ``copy_native()`` copies native/ into a temporary folder,
``edit_line`` changes one line of the copy, ``lessonkit.native.load(src_dir=copy)`` builds and
loads it; ``BREAKS`` holds the two edits of lesson 06 (no online rescale; truncation instead of
rounding) and ``break_kernel(kind)`` does all three steps. The student's own native/ is never touched.
"""
from __future__ import annotations

import atexit
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import native, source
from .env import lldb_path  # where lldb is: the set-up check lists it too
from . import validate as check
from .kernels.attention import attend
from .language import tr
from .cache import KVCacheQ8
from .synthetic import cache_with_scores
from .trace import Trace, run_traced
from .toy import ToyConfig, generate

KERNEL = "flash_attn_single_q_q8_neon"
MAX_OBSERVED_TOKENS = 256   # the records of a generation grow with its length squared (one value per token per call)
MAX_TIMEOUT_S = 3600.0      # the longest wait for a debugger run
# Where the gdb breakpoints go, found by text (never by a typed line number):
TOKEN_TEXT = "v_cache_q8[t / kv_bs]"   # segment 3, after this token's update of M and S
LEAVE_TEXT = "float inv"               # segment 4's first statement: the token loop is over
MARK = "@@"                            # prefix of the lines our gdb commands print


# ============================================================================ gdb: tier A

@dataclass(frozen=True)
class Breakpoints:
    """The three places the gdb run stops, with the line numbers of the current source."""
    file: str        # the kernel file's name, as gdb's linespec wants it
    token_line: int  # segment 3: once per token, M and S already updated for token t
    leave_line: int  # segment 4: the call's last stop
    function: str = KERNEL


def breakpoints(path: Path | str = source.KERNEL_FILE) -> Breakpoints:
    """Find the breakpoint lines in the kernel source by their text, inside their segments.

    Why not the ``TRACE_TOKEN(`` line: in the fast and debug builds that macro is empty, so the
    line has no machine code of its own and a breakpoint there would land in the traced copy of
    the kernel only. The line that finds token t's V row runs once per token, right after
    ``S += vsf``, so M and S there are the values after token t."""
    return Breakpoints(Path(path).name, source.find_line(TOKEN_TEXT, segment=3, path=path),
                       source.find_line(LEAVE_TEXT, segment=4, path=path))


def gdb_commands(bp: Breakpoints | None = None) -> str:
    """The gdb command file of the batch run (without the final ``run``): a breakpoint at the
    kernel's entry, one in segment 3, one in segment 4, each printing one parseable line."""
    bp = bp or breakpoints()
    return "\n".join([
        "set pagination off",
        "set confirm off",
        "set breakpoint pending on",       # the library is not loaded yet: cffi dlopens it later
        "set print thread-events off",
        f"break {bp.function}",
        "commands", "silent",
        f'printf "{MARK}enter seq_len=%d kh_off=%d hd=%d\\n", seq_len, kh_off, hd',
        "continue", "end",
        f"break {bp.file}:{bp.token_line}",
        "commands", "silent",
        f'printf "{MARK}token t=%d s=%.9g M=%.9g S=%.9g\\n", t, s, M, S',
        "continue", "end",
        f"break {bp.file}:{bp.leave_line}",
        "commands", "silent",
        f'printf "{MARK}leave S=%.9g\\n", S',
        "continue", "end",
    ]) + "\n"


def gdb_path() -> str | None:
    return shutil.which("gdb")


DEBUGGERS = ("gdb", "lldb")
INSTALL = {
    "gdb": "gdb is not installed (Debian/Ubuntu: sudo apt install gdb; on an Apple Silicon Mac gdb does "
           "not run: use debugger=\"lldb\", from Xcode's command line tools)",
    "lldb": "lldb is not installed (Debian/Ubuntu: sudo apt install lldb; macOS: lldb comes with Xcode's "
            "command line tools: xcode-select --install)",
}
INSTALL_ZH = {
    "gdb": "没有安装 gdb（Debian/Ubuntu：sudo apt install gdb；在 Apple Silicon 的 Mac 上 gdb 跑不起来："
           "请用 debugger=\"lldb\"，它随 Xcode 的命令行工具提供）",
    "lldb": "没有安装 lldb（Debian/Ubuntu：sudo apt install lldb；macOS：lldb 随 Xcode 的命令行工具提供："
            "xcode-select --install）",
}


def _install(debugger: str) -> str:
    """What to install for ``debugger``, in the current language (``INSTALL`` is the English)."""
    return tr(INSTALL[debugger], INSTALL_ZH[debugger])


def debugger_path(debugger: str = "gdb") -> str | None:
    """The executable of ``debugger`` ("gdb" or "lldb"), None when it is not installed."""
    return gdb_path() if _debugger_name(debugger) == "gdb" else lldb_path()


def _debugger_name(debugger) -> str:
    if debugger not in DEBUGGERS:
        raise ValueError(tr(f"debugger must be one of {', '.join(map(repr, DEBUGGERS))}; got "
                            f"{check.short(debugger)}. Use debugger=\"lldb\" on macOS, \"gdb\" elsewhere; "
                            "use_debugger=False makes the same records without a debugger (the traced build)",
                            f"debugger 必须是 {', '.join(map(repr, DEBUGGERS))} 之一；你给的是 "
                            f"{check.short(debugger)}。macOS 上用 debugger=\"lldb\"，其他系统用 \"gdb\"；"
                            "use_debugger=False 不用调试器也能得到同样的记录（用跟踪构建）"))
    return debugger


# What each of lldb's breakpoints prints: lldb has no printf, so each stop runs one
# ``frame variable`` and the set of names says which stop it was.
LLDB_STOPS = {"enter": ("seq_len", "kh_off", "hd"), "token": ("t", "s", "M", "S"), "leave": ("S",)}


def lldb_commands(bp: Breakpoints | None = None) -> str:
    """The lldb command file of the batch run (without the final ``run``): the same three
    breakpoints as ``gdb_commands``, each auto-continuing (``-G true``) after one ``frame
    variable``. lldb keeps breakpoints pending until a library that has them is loaded."""
    bp = bp or breakpoints()
    where = {"enter": f"-n {bp.function}", "token": f"-f {bp.file} -l {bp.token_line}",
             "leave": f"-f {bp.file} -l {bp.leave_line}"}
    lines = ["settings set auto-confirm true"]
    for kind, names in LLDB_STOPS.items():
        lines.append(f'breakpoint set {where[kind]} -G true -C "frame variable {" ".join(names)}"')
    return "\n".join(lines) + "\n"


def parse_lldb_output(text: str) -> list[CallRecord]:
    """Turn lldb's echo of the ``frame variable`` commands of ``lldb_commands`` and the values it
    printed (``(float) M = 1.25``) into CallRecords, through the same parser as gdb's output."""
    by_names = {names: kind for kind, names in LLDB_STOPS.items()}
    cmd = re.compile(r"\(lldb\)\s+frame variable ((?:\w+ ?)+)\s*$")
    val = re.compile(r"^\([^()]*\) (\w+) = (\S+)")
    out, kind, want, got = [], None, (), {}

    def flush():
        if kind is not None:
            out.append(f"{MARK}{kind} " + " ".join(f"{n}={got.get(n, '?')}" for n in want))

    for line in text.splitlines():
        m = cmd.search(line)
        if m:
            flush()
            want = tuple(m.group(1).split())
            kind, got = by_names.get(want), {}
            continue
        v = val.match(line.strip())
        if kind is not None and v and v.group(1) in want:
            got[v.group(1)] = v.group(2)
            continue
        if kind is not None and line.startswith("(lldb)"):
            flush()
            kind = None
    flush()
    return parse_gdb_output("\n".join(out))


def line_functions(line: int, library: Path | str | None = None,
                   file: str = source.KERNEL_FILE.name) -> list[str]:
    """The functions of the debug library that have machine code for ``file:line``, as gdb's
    ``info line`` reports them ([] without gdb). An empty hook macro such as ``TRACE_TOKEN`` has
    code only in the traced copy of the kernel."""
    line = check.integer("line", line, minimum=1)
    gdb = gdb_path()
    if gdb is None:
        return []
    lib = library or native.library_path(debug=True)
    out = subprocess.run([gdb, "-batch", "-nx", "-iex", "set debuginfod enabled off",
                          "-ex", f"info line {file}:{line}", str(lib)],
                         capture_output=True, text=True, timeout=60).stdout
    return sorted(set(re.findall(r"starts at address 0x[0-9a-f]+ <([A-Za-z_]\w*)", out)))


@dataclass
class CallRecord:
    """What the debugger saw in one kernel call."""
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

    @property
    def iterations(self) -> int:
        """How many times the token loop ran (stops in segment 3)."""
        return len(self.t)

    @property
    def loop_runs_seq_len(self) -> bool:
        """Exactly seq_len iterations, for t = 0, 1, ..., seq_len - 1 in order."""
        return self.t == list(range(self.seq_len))

    @property
    def M_non_decreasing(self) -> bool:
        return all(b >= a for a, b in zip(self.M, self.M[1:]))


def parse_gdb_output(text: str) -> list[CallRecord]:
    """Turn the lines printed by ``gdb_commands`` into one CallRecord per kernel entry. Lines
    without the marker (gdb's own messages, the program's output) are ignored; the marker may
    follow other text on the same line. Raises ValueError on a stop outside a call."""
    records: list[CallRecord] = []
    pat = re.compile(re.escape(MARK) + r"(enter|token|leave) (.*)")
    for n, line in enumerate(text.splitlines(), start=1):
        m = pat.search(line)
        if not m:
            continue
        kind, rest = m.groups()
        try:
            vals = dict(kv.split("=", 1) for kv in rest.split())
            if kind == "enter":
                hd = int(vals["hd"])
                records.append(CallRecord(len(records), int(vals["seq_len"]),
                                          int(vals["kh_off"]) // hd if hd else -1, [], [], [], []))
                continue
            if not records or records[-1].final_S is not None:
                raise ValueError(f"a {kind} stop outside a kernel call")
            r = records[-1]
            if kind == "token":
                r.t.append(int(vals["t"]))
                r.s.append(float(vals["s"]))
                r.M.append(float(vals["M"]))
                r.S.append(float(vals["S"]))
            else:
                r.final_S = float(vals["S"])
        except (KeyError, ValueError) as e:
            raise ValueError(f"line {n} of the gdb output: {line.strip()!r}: {e}") from None
    return records


@dataclass
class Observation:
    """The records of one observed generation, and how they were obtained."""
    records: list[CallRecord]
    source: str                    # "gdb", "lldb" or "trace"
    n_tokens: int
    config: ToyConfig
    tokens: list[int] = field(default_factory=list)  # the generated ids, as the program printed them
    commands: str = ""             # the debugger's command file used ("" for the trace)
    message: str = ""              # why the trace was used, if it was

    @property
    def calls_per_step(self) -> int:
        return self.config.n_q_heads

    def summary(self) -> dict:
        """The three observations of tier A, computed from the records."""
        rs = self.records
        seq = [r.seq_len for r in rs]
        per_head = {}
        for r in rs:
            per_head.setdefault(r.q_head, []).append(r.seq_len)
        steps = [seq[i:i + self.calls_per_step] for i in range(0, len(seq), self.calls_per_step)]
        return {
            "kernel calls": len(rs),
            "calls per step": self.calls_per_step,
            "seq_len at first call": seq[0] if seq else None,
            "seq_len at last call": seq[-1] if seq else None,
            "same seq_len for all calls of a step": all(len(set(s)) == 1 for s in steps),
            "seq_len grows by one per step": all(b[0] - a[0] == 1 for a, b in zip(steps, steps[1:])),
            "seq_len grows by one per call of each query head":
                all(all(b - a == 1 for a, b in zip(v, v[1:])) for v in per_head.values()),
            "token loop ran exactly seq_len times in every call": all(r.loop_runs_seq_len for r in rs),
            "M never decreased within a call": all(r.M_non_decreasing for r in rs),
            "token-loop iterations in all": sum(r.iterations for r in rs),
        }

    def table(self, calls=None) -> str:
        """A text table of some calls (default: the first and last step's)."""
        rs = self.records
        if calls is None:
            k = self.calls_per_step
            calls = [*range(min(k, len(rs))), *range(max(k, len(rs) - k), len(rs))]
        out = [tr(f"{'call':>4} {'step':>4} {'q head':>6} {'kv head':>7} {'seq_len':>7} {'loop ran':>8}  "
                  f"{'t in order':>10}  {'M non-decr.':>11}  M after the last token",
                  f"{'调用':>2} {'步':>3} {'查询头':>3} {'kv 头':>5} {'seq_len':>7} {'循环次数':>4}  "
                  f"{'t 按顺序':>6}  {'M 不降':>8}  最后一个 token 之后的 M")]
        for i in calls:
            r = rs[i]
            out.append(f"{r.call:>4} {r.step:>4} {r.q_head:>6} {r.kv_head:>7} {r.seq_len:>7} {r.iterations:>8}  "
                       f"{str(r.loop_runs_seq_len):>10}  {str(r.M_non_decreasing):>11}  {r.M[-1]:.4f}")
        return "\n".join(out)


def _annotate(records: list[CallRecord], calls) -> None:
    """Give each record the step and query head of the toy's call with the same index."""
    for r, c in zip(records, calls):
        r.step, r.q_head = c.step, c.q_head


def _child_code(n_tokens: int, config: ToyConfig) -> str:
    conf = "" if config == ToyConfig() else f"config=toy.{config!r}, "
    return f"from lessonkit import toy; toy.generate({n_tokens}, {conf}debug=True)"


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(native.REPO_DIR), env.get("PYTHONPATH")]))
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"   # no thread pools: fewer threads for gdb to follow, a shorter run
    return env


def records_from_trace(n_tokens: int, config: ToyConfig | None = None) -> tuple[list[CallRecord], list[int]]:
    """The same records without a debugger: the toy generation on the traced build of the kernel.
    The iterations are the tokens whose V row the kernel recorded (``trace.v_rows`` starts at 0
    and each pass through segment 3 writes a nonzero address). Only what the records hold is
    traced (V row addresses, s, M, S: not the accumulator, ``head_dim`` floats per token), and
    at most MAX_OBSERVED_TOKENS tokens."""
    n_tokens = _observed_tokens(n_tokens)
    config = config or ToyConfig()
    gen = generate(n_tokens, config=config, trace=True, verbose=False, trace_fields=("v_rows", "s", "M", "S"))
    records = []
    traces, gen.traces = gen.traces, None
    for i, c in enumerate(gen.calls):
        tr, traces[i] = traces[i], None  # each call's trace goes as soon as its record is made
        done = np.flatnonzero(tr.v_rows != 0).tolist()
        records.append(CallRecord(i, c.seq_len, c.kv_head, done, tr.s[done].tolist(),
                                  tr.M[done].tolist(), tr.S[done].tolist(), float(tr.S[-1])))
    _annotate(records, gen.calls)
    return records, gen.tokens


def _observed_tokens(n_tokens) -> int:
    n_tokens = check.integer("n_tokens", n_tokens, minimum=1)
    return check.at_most("n_tokens", n_tokens, MAX_OBSERVED_TOKENS,
                         tr("tokens of an observed generation: its records grow with the square of its length",
                            "一次观察的生成最多的 token 数：记录随长度的平方增长"))


def _timeout(timeout) -> float:
    value = check.finite_float("timeout", timeout, maximum=MAX_TIMEOUT_S)
    if value <= 0:
        raise ValueError(tr(f"timeout must be above 0 seconds; got {value:g}",
                            f"timeout 必须大于 0 秒；你给的是 {value:g}"))
    return value


def _run_bounded(argv: list[str], timeout: float, merge: bool = False, **kw) -> subprocess.CompletedProcess:
    """Run a command in its own process group; on timeout kill the whole group (gdb and the
    program it debugs), then raise subprocess.TimeoutExpired. ``merge``: stderr into stdout, in
    the order they were written (a transcript)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=True,
                            start_new_session=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err or "")


def run_under_gdb(n_tokens: int = 16, config: ToyConfig | None = None, timeout: float = 120.0):
    """The batch run itself: (gdb's stdout, stderr, the command file). gdb must be installed."""
    return run_under_debugger(n_tokens, config, timeout, "gdb")


def run_under_debugger(n_tokens: int = 16, config: ToyConfig | None = None, timeout: float = 120.0,
                       debugger: str = "gdb"):
    """The batch run under ``debugger`` ("gdb" or "lldb"): (its stdout, stderr, the command
    file). The debugger must be installed (RuntimeError saying what to install otherwise)."""
    debugger = _debugger_name(debugger)
    n_tokens, timeout = _observed_tokens(n_tokens), _timeout(timeout)
    config = config or ToyConfig()
    if not isinstance(config, ToyConfig):
        raise TypeError(tr(f"config must be a lessonkit.toy.ToyConfig; got {type(config).__name__}",
                           f"config 应是一个 lessonkit.toy.ToyConfig；你给的是 {type(config).__name__}"))
    exe = debugger_path(debugger)
    if exe is None:
        raise RuntimeError(_install(debugger))
    native.build(debug=True)   # build in this process, so the child finds it ready
    child = [sys.executable, "-c", _child_code(n_tokens, config)]
    with tempfile.TemporaryDirectory() as tmp:
        if debugger == "gdb":
            commands = gdb_commands()
            cmd_file = Path(tmp) / "tier_a.gdb"
            cmd_file.write_text(commands + "run\n")
            argv = [exe, "-batch", "-nx", "-iex", "set debuginfod enabled off",
                    "-iex", "set auto-load python-scripts off", "-x", str(cmd_file), "--args", *child]
        else:
            commands = lldb_commands()
            cmd_file = Path(tmp) / "tier_a.lldb"
            cmd_file.write_text(commands + "run\n")
            # -x: no ~/.lldbinit; -b: batch, quit when the commands are done (lldb kills a
            # program still running then; ours has exited by the end of the file's "run")
            argv = [exe, "-x", "-b", "-s", str(cmd_file), "--", *child]
        proc = _run_bounded(argv, timeout, cwd=native.REPO_DIR, env=_child_env())
    return proc.stdout, proc.stderr, commands


def observe_generation(n_tokens: int = 16, config: ToyConfig | None = None, use_gdb: bool | None = None,
                       timeout: float = 120.0, debugger: str = "gdb",
                       use_debugger: bool | None = None) -> Observation:
    """Run ``lessonkit.toy.generate(n_tokens, debug=True)`` in a child Python under a debugger
    (gdb or lldb, batch mode, breakpoints pending until cffi loads the -O0 -g library) and return
    one CallRecord per kernel call. The child loads the debug library itself, through
    ``lessonkit.native.load(debug=True)``, so the breakpoints stop in the very code a student
    would step through.

    ``debugger``: "gdb" (default) or "lldb" (on macOS, and on Apple Silicon the only one that
    runs); both set the same three breakpoints (``breakpoints()``) and give the same records;
    ``Observation.source`` names the one used. Another name raises ValueError.

    ``use_debugger`` (``use_gdb`` is its older name; give at most one): None (default) uses the
    debugger where it is installed and works; without it, or when it cannot run the program (e.g.
    a system that forbids ptrace), the records come from the traced build instead and ``message``
    says why and what to install. True requires the debugger (RuntimeError saying what to install
    otherwise); False always uses the trace. At most MAX_OBSERVED_TOKENS tokens; ``timeout``
    (seconds, at most MAX_TIMEOUT_S) bounds the debugger run, which is killed when it passes.

    Example (lesson 06): ``observe_generation(16, debugger="lldb").summary()``: 64 kernel calls
    (4 query heads x 16 steps), seq_len 1..16, the loop ran seq_len times, M never decreased."""
    debugger = _debugger_name(debugger)
    n_tokens, timeout = _observed_tokens(n_tokens), _timeout(timeout)
    if use_gdb is not None and use_debugger is not None:
        raise TypeError(tr("give use_debugger or its older name use_gdb, not both",
                           "use_debugger 和它的旧名字 use_gdb 只能给一个"))
    use = use_gdb if use_debugger is None else use_debugger
    if use is not None and not isinstance(use, bool):
        raise TypeError(tr(f"use_debugger must be None, True or False; got {check.short(use)}",
                           f"use_debugger 必须是 None、True 或 False；你给的是 {check.short(use)}"))
    config = config or ToyConfig()
    if not isinstance(config, ToyConfig):
        raise TypeError(tr(f"config must be a lessonkit.toy.ToyConfig; got {type(config).__name__}",
                           f"config 应是一个 lessonkit.toy.ToyConfig；你给的是 {type(config).__name__}"))
    exe = debugger_path(debugger)
    expected = generate(n_tokens, config=config, verbose=False).calls   # the call order, fast build

    def from_trace(why: str) -> Observation:
        records, tokens = records_from_trace(n_tokens, config)
        return Observation(records, "trace", n_tokens, config, tokens,
                           message=why + tr("; the records come from the traced build of the kernel instead",
                                            "；所以记录改由内核的跟踪构建得出"))

    if use is False:
        return from_trace(tr(f"{debugger} not requested", f"没有要求用 {debugger}"))
    if exe is None:
        if use:
            raise RuntimeError(_install(debugger))
        return from_trace(_install(debugger))
    parse = parse_gdb_output if debugger == "gdb" else parse_lldb_output
    try:
        out, err, commands = (run_under_gdb(n_tokens, config, timeout) if debugger == "gdb"
                              else run_under_debugger(n_tokens, config, timeout, debugger))
        records = parse(out)
        if len(records) != len(expected):
            tail = "\n".join((out + err).strip().splitlines()[-15:])
            raise RuntimeError(tr(f"{debugger} saw {len(records)} kernel calls, expected {len(expected)}; "
                                  f"the end of its output:\n{tail}",
                                  f"{debugger} 看到 {len(records)} 次内核调用，应为 {len(expected)} 次；"
                                  f"它输出的末尾：\n{tail}"))
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as e:
        if use:
            raise RuntimeError(tr(f"the {debugger} run failed: {e}", f"{debugger} 运行失败：{e}")) from e
        return from_trace(tr(f"{debugger} could not run the generation ({str(e).splitlines()[0]})",
                             f"{debugger} 无法运行这次生成（{str(e).splitlines()[0]}）"))
    _annotate(records, expected)
    m = re.search(r"generated token ids: \[([\d, ]*)\]", out)
    tokens = [int(x) for x in m.group(1).split(",") if x.strip()] if m else []
    return Observation(records, debugger, n_tokens, config, tokens, commands=commands)


def by_hand_commands(n_tokens: int = 16, config: ToyConfig | None = None) -> str:
    """The session to type in a terminal, from the workbook's folder, for tier A by hand."""
    bp = breakpoints()
    config = config or ToyConfig()
    last = n_tokens  # seq_len in the last step, with the default one-token prompt
    steps = [
        (tr("# in a terminal, in the workbook's folder (the one with Makefile and native/):",
            "# 在终端里，在项目文件夹中（有 Makefile 和 native/ 的那个）："), ""),
        (".venv/bin/python -m lessonkit build --debug", tr("the -O0 -g library, once", "-O0 -g 的库，构建一次")),
        (f"gdb --args .venv/bin/python -c \"{_child_code(n_tokens, config)}\"", ""),
        ("(gdb) set breakpoint pending on", tr("the library is loaded later, by cffi", "库稍后才由 cffi 载入")),
        (f"(gdb) break {bp.function}", tr("breakpoint 1: the entry", "断点 1：入口")),
        (f"(gdb) break {bp.file}:{bp.token_line}", tr("breakpoint 2: segment 3, once per token",
                                                      "断点 2：segment 3，每个 token 一次")),
        ("(gdb) run", ""),
        ("(gdb) print seq_len", tr("at the entry", "在入口处")),
        ("(gdb) continue", tr("now in segment 3, token 0", "现在在 segment 3，token 0")),
        ("(gdb) print t", ""),
        ("(gdb) print M", ""),
        ("(gdb) info locals", tr("s, vsf, ... of this token", "这个 token 的 s、vsf……")),
        ("(gdb) next", tr("vt is set now", "现在 vt 已赋值")),
        ("(gdb) p/d *vt@16", tr("V's int8 codes as numbers ('p vt' prints a string)",
                                "把 V 的 int8 码按数字打印（'p vt' 会打印成字符串）")),
        (f"(gdb) condition 1 seq_len == {last}", tr("entry stops only in the last step", "入口断点只在最后一步停")),
        ("(gdb) disable 2", tr("no segment-3 stops until 'enable 2'", "在 'enable 2' 之前不在 segment 3 停")),
        ("(gdb) continue", tr(f"runs on to the first call with seq_len {last}",
                              f"一直运行到第一个 seq_len 为 {last} 的调用")),
        ("(gdb) enable 2", ""),
        ("(gdb) info breakpoints", tr("'breakpoint already hit N times'", "看 'breakpoint already hit N times'")),
        ("(gdb) continue", ""),
        ("(gdb) quit", ""),
    ]
    width = max(len(cmd) for cmd, note in steps if note) + 2
    lines = [f"{cmd:<{width}}# {note}" if note else cmd for cmd, note in steps]
    lines.append(tr(f"# line {bp.token_line} is the line of segment 3 that contains '{TOKEN_TEXT}'; "
                    "lessonkit.debug.breakpoints() finds it again after you edit the file",
                    f"# 第 {bp.token_line} 行是 segment 3 中含有 '{TOKEN_TEXT}' 的那一行；"
                    "你改过文件后，lessonkit.debug.breakpoints() 会重新找到它"))
    return "\n".join(lines)


# ============================================================================ aarch64 under qemu

A64_TOOLS = ("aarch64-linux-gnu-gcc", "qemu-aarch64", "gdb-multiarch")
A64_SYSROOT = "/usr/aarch64-linux-gnu"
A64_FLAGS = ["-std=gnu11", "-O0", "-g", "-march=armv8.2-a+dotprod"]
DRIVER = native.NATIVE_DIR / "tools" / "fa_driver.c"


def aarch64_tools() -> dict[str, str | None]:
    """Where each tool of the aarch64 recipe is (None: missing)."""
    return {t: shutil.which(t) for t in A64_TOOLS}


def aarch64_recipe(seq_len: int = 20, head_dim: int = 64, n_kv_heads: int = 2, block_size: int = 8,
                   port: int = 1234) -> str:
    """The commands of the aarch64 recipe, to run by hand from the workbook's folder."""
    bp = breakpoints()
    return "\n".join([
        "# Debian/Ubuntu: sudo apt install gcc-aarch64-linux-gnu qemu-user gdb-multiarch",
        tr("# 1. cross-compile the driver (it builds a q8 cache and calls the kernel once) with the kernel, -O0 -g:",
           "# 1. 把驱动程序（它建一个 q8 缓存，调用一次内核）和内核一起交叉编译，-O0 -g："),
        f"aarch64-linux-gnu-gcc {' '.join(A64_FLAGS)} -Inative native/tools/fa_driver.c native/*.c -lm -o fa_driver_a64",
        tr(f"# 2. run it under qemu, stopped until a debugger connects on port {port}:",
           f"# 2. 在 qemu 下运行它，停住等调试器连到端口 {port}："),
        f"qemu-aarch64 -L {A64_SYSROOT} -g {port} ./fa_driver_a64 single {seq_len} {head_dim} {n_kv_heads} {block_size} cold 4096 &",
        tr("# 3. connect gdb-multiarch and stop in the kernel:", "# 3. 连上 gdb-multiarch，停在内核里："),
        f"gdb-multiarch -ex 'set sysroot {A64_SYSROOT}' -ex 'file fa_driver_a64' -ex 'target remote :{port}'",
        f"(gdb) break {bp.function}",
        f"(gdb) break {bp.file}:{bp.token_line}",
        "(gdb) continue",
        f"(gdb) print seq_len                  # {seq_len}",
        tr("(gdb) disassemble i8x16_dot_s32      # the sdot instruction of the dot-product extension",
           "(gdb) disassemble i8x16_dot_s32      # 点积扩展的 sdot 指令"),
        tr("(gdb) continue                       # segment 3, token 0: print t, print M",
           "(gdb) continue                       # segment 3，token 0：print t，print M"),
        tr("# on the board itself (RK3588), no qemu: the x86 session above works as it is, with gdb.",
           "# 在板子本身（RK3588）上不用 qemu：上面 x86 的调试会话用 gdb 原样可用。"),
    ])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class A64Observation:
    record: CallRecord
    sdot: bool              # the disassembly of i8x16_dot_s32 holds an sdot instruction
    disassembly: list[str]  # its instruction lines
    commands: str


def observe_aarch64(seq_len: int = 20, head_dim: int = 64, n_kv_heads: int = 2, block_size: int = 8,
                    timeout: float = 60.0, workdir: Path | str | None = None) -> A64Observation:
    """The aarch64 recipe, run: cross-compile ``native/tools/fa_driver.c`` with the kernel
    (``-O0 -g -march=armv8.2-a+dotprod``), start it under ``qemu-aarch64 -g PORT`` (a free local
    port), connect ``gdb-multiarch`` with ``target remote``, and record the one kernel call as
    observe_generation does (seq_len at entry, the token loop, M), plus whether the dot helper
    was compiled to ``sdot``. Raises RuntimeError when a tool is missing; every wait is bounded."""
    seq_len = check.integer("seq_len", seq_len, minimum=1, below=1 << 16)
    head_dim = check.head_dim(head_dim)
    n_kv_heads = check.integer("n_kv_heads", n_kv_heads, minimum=1, below=65)
    block_size = check.integer("block_size", block_size, minimum=1, below=1 << 16)
    timeout = _timeout(timeout)
    missing = [t for t, p in aarch64_tools().items() if p is None]
    if missing:
        raise RuntimeError(tr(f"missing: {', '.join(missing)} (Debian/Ubuntu: sudo apt install "
                              "gcc-aarch64-linux-gnu qemu-user gdb-multiarch)",
                              f"缺少：{', '.join(missing)}（Debian/Ubuntu：sudo apt install "
                              "gcc-aarch64-linux-gnu qemu-user gdb-multiarch）"))
    own_tmp = workdir is None
    work = Path(tempfile.mkdtemp(prefix="fa_a64_") if own_tmp else workdir)
    qemu = None
    try:
        exe = work / "fa_driver_a64"
        cc = subprocess.run(["aarch64-linux-gnu-gcc", *A64_FLAGS, f"-I{native.NATIVE_DIR}", str(DRIVER),
                             *map(str, sorted(native.NATIVE_DIR.glob("*.c"))), "-lm", "-o", str(exe)],
                            capture_output=True, text=True, timeout=timeout)
        if cc.returncode != 0:
            raise RuntimeError(tr("cross-compilation failed:\n", "交叉编译失败：\n") + cc.stderr[-2000:])
        port = _free_port()
        qemu = subprocess.Popen(["qemu-aarch64", "-L", A64_SYSROOT, "-g", str(port), str(exe), "single",
                                 str(seq_len), str(head_dim), str(n_kv_heads), str(block_size), "cold", "4096"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        commands = "\n".join([f"set sysroot {A64_SYSROOT}", f"file {exe}",
                              "set tcp connect-timeout 20", f"target remote :{port}", gdb_commands(),
                              f"echo {MARK}disassembly\\n", "disassemble i8x16_dot_s32",
                              f"echo {MARK}end disassembly\\n", "continue"]) + "\n"
        cmd_file = work / "a64.gdb"
        cmd_file.write_text(commands)
        gdb = _run_bounded(["gdb-multiarch", "-batch", "-nx", "-iex", "set debuginfod enabled off",
                            "-x", str(cmd_file)], timeout)
        qemu.wait(timeout=timeout)
        records = parse_gdb_output(gdb.stdout)
        if len(records) != 1:
            raise RuntimeError(tr(f"gdb-multiarch saw {len(records)} kernel calls, expected 1:\n",
                                  f"gdb-multiarch 看到 {len(records)} 次内核调用，应为 1 次：\n")
                               + (gdb.stdout + gdb.stderr)[-2000:])
        dis = gdb.stdout.split(f"{MARK}disassembly", 1)[-1].split(f"{MARK}end disassembly", 1)[0]
        lines = [l.strip() for l in dis.splitlines() if re.match(r"\s*0x[0-9a-f]+", l)]
        return A64Observation(records[0], any(re.search(r"\bsdot\b", l) for l in lines), lines,
                              commands.replace(str(work) + os.sep, ""))
    finally:
        if qemu is not None and qemu.poll() is None:
            qemu.kill()
            qemu.wait(timeout=10)
        if own_tmp:
            shutil.rmtree(work, ignore_errors=True)


# ============================================================================ break it, rebuild, see

def copy_native(parent: Path | str | None = None) -> Path:
    """Copy native/ (without its tests/) into a new temporary folder; return the copy's path.
    Builds of the copy go to ``<copy>/../.build``, inside the same temporary folder."""
    parent = Path(tempfile.mkdtemp(prefix="native_copy_") if parent is None else parent)
    dest = parent / "native"
    shutil.copytree(native.NATIVE_DIR, dest, ignore=shutil.ignore_patterns("tests"))
    return dest


@dataclass(frozen=True)
class Edit:
    """Replace the one line of ``file`` (inside kernel segment ``segment``, if given) that
    contains ``text`` by ``new`` (with the old line's indentation); ``new=None`` comments it out."""
    file: str
    text: str
    new: str | None = None
    segment: int | None = None


@dataclass(frozen=True)
class Change:
    file: str
    line: int
    old: str
    new: str


def edit_line(copy: Path | str, edit: Edit) -> Change:
    """Apply one Edit to a copy of native/ (never to native/ itself) and return what changed."""
    copy = Path(copy).resolve()
    if copy == native.NATIVE_DIR.resolve():
        raise ValueError(tr("edit a copy (lessonkit.debug.copy_native()), not the workbook's native/",
                            "请改副本（lessonkit.debug.copy_native()），不要改项目里的 native/"))
    path = copy / edit.file
    n = source.find_line(edit.text, segment=edit.segment, path=path)
    lines = path.read_text().splitlines(keepends=True)
    old = lines[n - 1].rstrip("\n")
    indent = old[:len(old) - len(old.lstrip())]
    new = indent + (edit.new if edit.new is not None else f"// removed in lesson 06: {old.strip()}")
    lines[n - 1] = new + "\n"
    path.write_text("".join(lines))
    return Change(edit.file, n, old, new)


KERNEL_C = source.KERNEL_FILE.name
SIMD_H = source.SIMD_HEADER.name
BREAKS = {
    # article section 3: no online rescale. On a new max, S and VKQ keep their old scale.
    "no_rescale": (Edit(KERNEL_C, "S *= ms;", segment=3),
                   Edit(KERNEL_C, "vmulq_f32(vld1q_f32(VKQ + i), msv)", segment=3)),
    # q_code: truncation toward zero instead of rounding half away from zero
    "truncate": (Edit(SIMD_H, "int r = (int)(v + (v >= 0.0f ? 0.5f : -0.5f));", "int r = (int)v;"),),
}


@dataclass
class BrokenKernel:
    kind: str
    copy: Path
    changes: list[Change]
    ffi: object
    lib: object

    def restore(self) -> None:
        """Delete the copy (the library already loaded stays usable until the process ends)."""
        shutil.rmtree(self.copy.parent, ignore_errors=True)
        _broken.pop(self.kind, None)


_broken: dict[str, BrokenKernel] = {}


@atexit.register
def _remove_copies() -> None:
    """Copies made by break_kernel go away with the process that made them."""
    for b in list(_broken.values()):
        b.restore()


def break_kernel(kind: str) -> BrokenKernel:
    """Copy native/, apply ``BREAKS[kind]``, build and load the copy (cached per kind for this
    process, so that a notebook and the exercise checks share one build).

    The broken build is loaded on purpose with ``verify="crashes"``: its check in a child process
    still refuses a crash or a hang, but lets the wrong results through, with a warning."""
    if kind not in BREAKS:
        raise ValueError(tr(f"kind must be one of {', '.join(map(repr, BREAKS))}; got {kind!r}",
                            f"kind 必须是 {', '.join(map(repr, BREAKS))} 之一；你给的是 {kind!r}"))
    if kind not in _broken or not _broken[kind].copy.is_dir():
        copy = copy_native()
        changes = [edit_line(copy, e) for e in BREAKS[kind]]
        with warnings.catch_warnings():  # wrong results are the point here: the lesson shows them
            warnings.simplefilter("ignore", native.BuildWarning)
            ffi, lib = native.load(src_dir=copy, verify="crashes")
        _broken[kind] = BrokenKernel(kind, copy, changes, ffi, lib)
    return _broken[kind]


def call_kernel(ffi, lib, q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float) -> np.ndarray:
    """One call of ``flash_attn_single_q_q8_neon`` from a given library (e.g. an edited copy;
    ``None, None``: the workbook's). Checked first: the library's kernel must keep the workbook's
    signature, q (float32, or a list or other float array, converted) must be finite with
    head_dim values, kv_head one of the cache's, scale finite in float32."""
    ffi, lib = check.library(ffi, lib, (KERNEL,))
    check.kv_cache(cache)
    q = check.float32_like("q", q, (cache.head_dim,))
    kv_head = check.integer("kv_head", kv_head, minimum=0, below=cache.n_kv_heads)
    scale = check.scale(scale, cache.head_dim)
    if cache.seq_len == 0:
        raise ValueError(tr("the cache is empty: append at least one token before attending",
                            "缓存是空的：先 append 至少一个 token，再做注意力"))
    out = np.empty(cache.head_dim, np.float32)
    lib.flash_attn_single_q_q8_neon(ffi.from_buffer("float[]", out, require_writable=True),
                                    ffi.from_buffer("float[]", q),
                                    *cache.kernel_args(kv_head, ffi), cache.head_dim, scale)
    return out


def trace_with(ffi, lib, q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float) -> Trace:
    """The traced build of a given library (an edited copy compiles its own traced kernel from
    the edited source); arguments checked as in ``call_kernel``."""
    check.kv_cache(cache)
    q = check.float32_like("q", q, (cache.head_dim,))
    out = np.empty(cache.head_dim, np.float32)
    return run_traced(out, q, cache, kv_head, check.scale(scale, cache.head_dim), ffi, lib)


def weights_case(scores, seed: int = 0):
    """A cache whose kernel scores are ``scores`` and whose V rows are one-hot (V[t] = e_t), so
    that output element t of a kernel call IS the softmax weight the kernel gave token t.
    Returns (cache, q, scale). At most 256 tokens (head_dim grows to hold one column per token)."""
    s = check.float32_like("scores", scores, (None,))
    n = s.shape[0]
    if not 1 <= n <= 256:
        raise ValueError(tr(f"weights_case takes 1 to 256 scores; got {n}",
                            f"weights_case 接受 1 到 256 个分数；你给了 {n} 个"))
    hd = 32 * math.ceil(n / 32)
    return cache_with_scores(s, head_dim=hd, block_size=16, V=np.eye(n, hd, dtype=np.float32), seed=seed)


def kernel_weights(ffi, lib, scores) -> np.ndarray:
    """The weights a library's kernel gives to ``scores`` (float32 [n], 1 <= n <= 256), read from
    its output."""
    ffi, lib = check.library(ffi, lib, (KERNEL,))
    cache, q, scale = weights_case(scores)
    return call_kernel(ffi, lib, q, cache, 0, scale)[:cache.seq_len]


def softmax_weights(scores) -> np.ndarray:
    """The right weights, float64: exp(s - max) / sum."""
    s = np.asarray(scores, np.float64)
    w = np.exp(s - s.max())
    return w / w.sum()


def weights_without_rescale(scores) -> np.ndarray:
    """What a kernel without the online rescale computes, in float64: every token keeps the
    weight exp(s_t - M_t) relative to the running max M_t *of its own time*, never brought
    down to the final max; then the division by their sum."""
    s = np.asarray(scores, np.float64)
    w = np.exp(s - np.maximum.accumulate(s))
    return w / w.sum()


@dataclass
class CaseResult:
    name: str
    rel_error: float   # max |kernel - reference| / max |reference|
    passed: bool


@dataclass
class KernelCheck:
    cases: list[CaseResult]
    tol: float

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    def __str__(self) -> str:
        lines = [tr(f"{'PASS' if c.passed else 'FAIL'}  {c.name:<44} max|kernel - reference| / max|reference| "
                    f"= {c.rel_error:.1e}  (tolerance {self.tol:.0e})",
                    f"{'通过' if c.passed else '失败'}  {c.name:<44} max|kernel - reference| / max|reference| "
                    f"= {c.rel_error:.1e}（容差 {self.tol:.0e}）") for c in self.cases]
        return "\n".join(lines + [tr(f"kernel check: {'PASSED' if self.passed else 'FAILED'}",
                                     f"内核检查：{'通过' if self.passed else '失败'}")])


def check_kernel(ffi=None, lib=None, tol: float = 1e-4) -> KernelCheck:
    """Check a library's kernel (default: the workbook's own) against the engine's quantized math
    recomputed in numpy (``lk.attend(..., backend="numpy")``: same int8 codes, softmax in float64)
    on two cases: random Gaussian K, V, q (200 tokens, 2 kv heads, kv head 1) and 64 rising scores
    with one-hot V (every token raises the max). The intact kernel agrees to float32 rounding."""
    ffi, lib = check.library(ffi, lib, (KERNEL,))
    tol = check.finite_float("tol", tol, minimum=0.0)
    rng = np.random.default_rng(0)
    T, nkv, hd = 200, 2, 64
    cache = KVCacheQ8(nkv, hd, 16)
    cache.append(rng.standard_normal((T, nkv, hd), dtype=np.float32),
                 rng.standard_normal((T, nkv, hd), dtype=np.float32))
    q = rng.standard_normal(hd).astype(np.float32)
    rising = weights_case(np.linspace(0.0, 8.0, 64))
    results = []
    for name, (c, qq, kh, sc) in (("random K, V, q (200 tokens, kv head 1)", (cache, q, 1, 1 / math.sqrt(hd))),
                                   ("64 rising scores, one-hot V", (rising[0], rising[1], 0, rising[2]))):
        ref = attend(qq, c, kh, scale=sc, backend="numpy")
        out = call_kernel(ffi, lib, qq, c, kh, sc)
        err = float(np.abs(out - ref).max() / np.abs(ref).max())
        results.append(CaseResult(name, err, bool(err <= tol)))
    return KernelCheck(results, tol)


# ============================================================================ by-hand sessions, captured

SESSIONS_DIR = native.NATIVE_DIR / "tools" / "sessions"            # the command scripts (templates)
TRANSCRIPTS_DIR = native.REPO_DIR / "notebooks" / "data"            # their committed, cleaned output
SESSION_PROGRAM = "from lessonkit import native, toy; native.load(); toy.generate(4, debug=True)"
REFRESH_COMMAND = ("python -c \"from lessonkit import debug; debug.refresh_transcripts()\"  "
                   "# from the workbook's folder, after a change of native/")
_SESSION_EXT = {"gdb": "gdb", "lldb": "lldb"}
_PLACEHOLDER = re.compile(r"@(FUNCTION|FILE|DEBUG_LIBRARY|LINE\((.+?)\))@")


def session_script(debugger: str = "gdb") -> Path:
    """The command script of the by-hand session: ``native/tools/sessions/by_hand.gdb`` or
    ``by_hand.lldb``. Its comments say why each command is there; ``@LINE(text)@`` marks a line
    number that ``session_commands`` finds in the kernel source by its text."""
    return SESSIONS_DIR / f"by_hand.{_SESSION_EXT[_debugger_name(debugger)]}"


def session_commands(debugger: str = "gdb", library: Path | str | None = None) -> str:
    """The by-hand session's commands with the current line numbers filled in (comments kept):
    what a student types, one command a line, at the ``(gdb)`` or ``(lldb)`` prompt.
    ``@DEBUG_LIBRARY@`` (lldb's ``-s``) becomes the debug library's file name (default: the
    current debug build's; its name carries a hash of the sources and the compiler)."""
    text = session_script(debugger).read_text()
    lib_name = Path(library).name if library else None

    def fill(m):
        if m.group(1) == "FUNCTION":
            return KERNEL
        if m.group(1) == "FILE":
            return source.KERNEL_FILE.name
        if m.group(1) == "DEBUG_LIBRARY":
            return lib_name or native.library_path(debug=True).name
        return str(source.find_line(m.group(2)))

    return "\n".join(l if l.lstrip().startswith("#") else _PLACEHOLDER.sub(fill, l)
                     for l in text.splitlines()) + "\n"


def session_start(debugger: str = "gdb") -> str:
    """The shell command that starts the by-hand session, from the workbook's folder."""
    if _debugger_name(debugger) == "gdb":
        return f"gdb --args .venv/bin/python -c \"{SESSION_PROGRAM}\""
    return f"lldb -- .venv/bin/python -c \"{SESSION_PROGRAM}\""


def clean_transcript(text: str, debugger: str = "gdb", exe: str | None = None) -> str:
    """A debugger's output made stable and path-free: addresses -> ``0x<addr>``, process and
    thread ids -> ``<pid>``, the build's hash -> ``<hash>``, the workbook's folder -> ``<repo>``,
    the Python environment -> ``<python>``. Debugger noise that depends on the machine, not on the
    kernel, is dropped: lldb's echo of its own start-up, the Debian lldb 14 packaging error
    ``No module named 'lldb.embedded_interpreter'`` (lldb's Python scripting is broken there; the
    sessions never use it), missing-LZMA warnings about other libraries."""
    repo = str(native.REPO_DIR)
    prefixes = sorted({sys.prefix, sys.base_prefix, os.path.realpath(sys.base_prefix)}, key=len, reverse=True)
    out = []
    skip_tb = False
    for line in text.splitlines():
        if line.startswith("Traceback (most recent call last):"):
            skip_tb = True
            continue
        if skip_tb:
            if "lldb.embedded_interpreter" in line:
                skip_tb = False
            continue
        if debugger == "lldb" and re.match(r"\(lldb\) (target create|settings set -- target\.run-args|command source)"
                                           r"|Current executable set to|Executing commands in", line):
            continue
        if "No LZMA support found" in line:
            continue
        # the environment first: a venv inside the workbook's folder (make's .venv) is <python>
        # wherever the folder is, as it is for a venv elsewhere
        if exe:
            line = line.replace(exe, "<python>")
        for p in prefixes:
            line = line.replace(p, "<python>")
        line = line.replace(repo, "<repo>")
        line = re.sub(r"0x[0-9a-fA-F]{5,}", "0x<addr>", line)
        line = re.sub(r"(?i)(process|LWP|child process) \d+", r"\1 <pid>", line)
        line = re.sub(r"(libflash_attn_q8(?:_debug)?)_[0-9a-f]{16}", r"\1_<hash>", line)
        out.append(line.rstrip())
    return "\n".join(out).strip("\n") + "\n"


def run_session(debugger: str = "gdb", timeout: float = 120.0) -> str:
    """Run the by-hand session (``session_commands``) under the real debugger, in batch mode, and
    return the cleaned transcript (``clean_transcript``): the shell command that starts it, then
    each command after its ``(gdb)``/``(lldb)`` prompt with the comments above it, then what the
    debugger printed. Raises RuntimeError when the debugger is missing (saying what to install).

    The numbers in it (Q's codes, scores, M, S) come from the toy model's fixed seed through this
    machine's backend (``lessonkit.native.backend(debug=True)``); another CPU path may differ in
    the last printed digits of a float, which is why ``transcripts_match`` masks floats."""
    debugger = _debugger_name(debugger)
    timeout = _timeout(timeout)
    exe = debugger_path(debugger)
    if exe is None:
        raise RuntimeError(_install(debugger))
    native.build(debug=False)   # both builds ready before the child starts: it loads both
    lib = native.build(debug=True)
    commands = session_commands(debugger, lib)
    child = [sys.executable, "-c", SESSION_PROGRAM]
    with tempfile.TemporaryDirectory() as tmp:
        cmd_file = Path(tmp) / f"by_hand.{debugger}"
        cmd_file.write_text(commands)
        if debugger == "gdb":
            # trace-commands echoes each command as "+cmd"; it and the options before it are
            # not part of the student's session: they keep the batch run quiet and path-free
            argv = [exe, "-q", "-batch", "-nx", "-iex", "set debuginfod enabled off",
                    "-iex", "set auto-load python-scripts off", "-iex", "set trace-commands on",
                    "-x", str(cmd_file), "--args", *child]
        else:
            argv = [exe, "-x", "-b", "-s", str(cmd_file), "--", *child]
        proc = _run_bounded(argv, timeout, merge=True, cwd=native.REPO_DIR, env=_child_env())
    text = proc.stdout
    if debugger == "gdb":
        text = _gdb_prompts(text, commands)
    return f"$ {session_start(debugger)}\n" + clean_transcript(text, debugger, sys.executable)


def _gdb_prompts(text: str, commands: str) -> str:
    """gdb's ``+cmd`` echo -> ``(gdb) cmd``, with the script's comments above each command (gdb
    does not echo comments; lldb does)."""
    comments: list[list[str]] = []
    pending: list[str] = []
    for line in commands.splitlines():
        if line.lstrip().startswith("#"):
            pending.append(line)
        elif line.strip():
            comments.append(pending)
            pending = []
    out, i = [], 0
    for line in text.splitlines():
        if line.startswith("+") and not line.startswith("++"):
            if i < len(comments):
                out.extend(f"(gdb) {c}" for c in comments[i])
            i += 1
            out.append("(gdb) " + line[1:])
        else:
            out.append(line)
    return "\n".join(out)


def transcript_path(debugger: str = "gdb") -> Path:
    """The committed transcript: ``notebooks/data/06_session_gdb.txt`` or ``06_session_lldb.txt``."""
    return TRANSCRIPTS_DIR / f"06_session_{_debugger_name(debugger)}.txt"


def saved_transcript(debugger: str = "gdb") -> str:
    """The committed transcript of the by-hand session, for the lesson to show (made on the
    machine and backend that ``refresh_transcripts`` ran on: x86-64 through SIMDe, -O0 -g)."""
    return transcript_path(debugger).read_text()


def refresh_transcripts(debuggers=DEBUGGERS) -> list[Path]:
    """Re-run the by-hand sessions and write their transcripts to notebooks/data/ (after a change
    of the kernel that moves its lines). Returns the files written."""
    written = []
    for d in debuggers:
        path = transcript_path(d)
        path.write_text(run_session(d))
        path.with_suffix(".env").write_text(capture_environment(d) + "\n")
        written.append(path)
    return written


def capture_environment(debugger: str = "gdb") -> str:
    """What a transcript's exact text depends on besides the kernel: the system, the CPU, the
    Python (its frames in ``bt``) and the debugger's version. Saved beside each transcript."""
    import platform
    exe = debugger_path(debugger)
    version = ""
    if exe is not None:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        version = (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else ""
    return (f"{platform.system()} {platform.machine()}, Python {sys.version_info.major}.{sys.version_info.minor}, "
            f"{version}")


def kernel_lines(text: str) -> list[str]:
    """The kernel's line numbers a transcript shows, in order (``flash_attn_q8_neon.c:NN``)."""
    return re.findall(r"flash_attn_q8_neon\.c:(\d+)", text)


_FLOAT = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+(?=[eE]))(?:[eE][-+]?\d+)?(?![\w.])")


def mask_floats(text: str) -> str:
    """Floats (``-0.379045874``, ``1.0E+9``) -> ``<float>``: the comparison of transcripts keeps
    the line numbers, the integers, the stops and their order, not the last digits of a float."""
    return _FLOAT.sub("<float>", text)


def transcripts_match(debugger: str = "gdb", timeout: float = 120.0) -> tuple[bool, str]:
    """Re-run the session and compare it with the committed transcript, floats masked. Returns
    (match, a unified diff of the masked texts, "" when they match). On another environment than
    the one the transcript was captured on (``capture_environment``, saved beside it), only the
    kernel's line numbers are compared."""
    import difflib
    new, old = mask_floats(run_session(debugger, timeout)), mask_floats(saved_transcript(debugger))
    env_file = transcript_path(debugger).with_suffix(".env")
    saved_env = env_file.read_text().strip() if env_file.is_file() else ""
    if saved_env != capture_environment(debugger):
        # Another system, Python or debugger prints other frames and messages: compare what the
        # kernel decides, the line numbers the session stops at, which a moved line changes.
        a, b = kernel_lines(old), kernel_lines(new)
        return a == b, ("" if a == b else f"kernel lines (committed, captured on {saved_env}): {a}\n"
                        f"kernel lines (this run, {capture_environment(debugger)}): {b}")
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        str(transcript_path(debugger).name) + " (committed)", "this run", n=1))
    return new == old, diff


ENGINE_RECIPE = TRANSCRIPTS_DIR / "06_engine_debug_recipe.md"
ENGINE_RECIPE_ZH = TRANSCRIPTS_DIR / "06_engine_debug_recipe.zh.md"


def engine_debug_recipe() -> str:
    """What to type to debug the real engine's kernel (``vllm_safetensors.c``, function
    ``flash_attn_single_q_q8_neon``; line 6594 according to the article): a markdown text, labelled
    "not run here" (the engine is not part of the workbook); in Chinese when the workbook speaks
    Chinese (``06_engine_debug_recipe.zh.md``, the same commands)."""
    return Path(tr(str(ENGINE_RECIPE), str(ENGINE_RECIPE_ZH))).read_text()


# ============================================================================ the session, step by step

# The by-hand session in steps, for the lesson to show one step at a time beside its explanation.
# Each step is named by the first command it starts with, in gdb and in lldb; it runs up to the
# next step's first command. The names follow native/tools/sessions/by_hand.gdb and by_hand.lldb.
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


@dataclass(frozen=True)
class SessionLine:
    """One command of a captured session: the comments above it, the command, what it printed."""
    comments: tuple[str, ...]
    command: str
    output: tuple[str, ...]


def parse_transcript(text: str, debugger: str = "gdb") -> tuple[str, list[SessionLine]]:
    """A committed transcript (``saved_transcript``) -> (the shell line that started it, one
    SessionLine per command). Lines after ``(gdb) #`` / ``(lldb) #`` are the script's comments."""
    prompt = f"({_debugger_name(debugger)}) "
    lines = text.splitlines()
    start = lines[0] if lines and lines[0].startswith("$ ") else ""
    out: list[SessionLine] = []
    comments: list[str] = []
    for line in lines[1 if start else 0:]:
        if line.startswith(prompt + "#"):
            comments.append(line[len(prompt):])
        elif line.startswith(prompt):
            out.append(SessionLine(tuple(comments), line[len(prompt):], ()))
            comments = []
        elif out:
            last = out[-1]
            out[-1] = SessionLine(last.comments, last.command, last.output + (line,))
    return start, out


def _step_range(step: str, commands: list[str], debugger: str) -> tuple[int, int]:
    if step not in SESSION_STEPS:
        raise ValueError(tr(f"step must be one of {', '.join(map(repr, SESSION_STEPS))}; got {check.short(step)}",
                            f"step 必须是 {', '.join(map(repr, SESSION_STEPS))} 之一；你给的是 {check.short(step)}"))
    col = DEBUGGERS.index(_debugger_name(debugger))
    names = list(SESSION_STEPS)

    def first(name, after=0):
        prefix = SESSION_STEPS[name][col]
        for i in range(after, len(commands)):
            if commands[i].startswith(prefix):
                return i
        raise ValueError(tr(f"the {debugger} transcript has no command starting with {prefix!r} (step {name!r}); "
                            f"re-run {REFRESH_COMMAND}",
                            f"{debugger} 的会话记录里没有以 {prefix!r} 开头的命令（步骤 {name!r}）；"
                            f"请重新运行 {REFRESH_COMMAND}"))

    begin = first(step)
    nxt = names.index(step) + 1
    end = first(names[nxt], begin + 1) if nxt < len(names) else len(commands)
    return begin, end


def step_commands(step: str, debugger: str = "gdb") -> list[str]:
    """The commands of one step of the by-hand session (``SESSION_STEPS``), as typed."""
    _, lines = parse_transcript(saved_transcript(debugger), debugger)
    begin, end = _step_range(step, [l.command for l in lines], debugger)
    return [l.command for l in lines[begin:end]]


# Lines a step leaves out when shown (they stay in the committed transcript): gdb reports each
# helper process the program starts (Python's subprocess uses vfork), which says nothing about
# the kernel. The lesson says in one sentence that a terminal session prints them.
SHOWN_NOISE = re.compile(r"^\[Detaching after v?fork from child process")


def session_step(step: str, debugger: str = "gdb", max_lines: int = 12) -> str:
    """One step of the committed by-hand session: each command after its prompt, then what the
    debugger printed (from ``notebooks/data/06_session_*.txt``, never retyped; ``SHOWN_NOISE``
    lines left out). Output longer
    than ``max_lines`` lines per command is cut, saying how many lines were left out; the step
    "start" begins with the shell command that started the debugger."""
    d = _debugger_name(debugger)
    start, lines = parse_transcript(saved_transcript(d), d)
    begin, end = _step_range(step, [l.command for l in lines], d)
    out = [start] if step == "start" and start else []
    for l in lines[begin:end]:
        out.append(f"({d}) {l.command}")
        body = [x for x in l.output if x.strip() and not SHOWN_NOISE.match(x)]
        if len(body) > max_lines:
            body = body[:max_lines] + [tr(f"   [... {len(body) - max_lines} more lines: {transcript_path(d).name}]",
                                          f"   [……还有 {len(body) - max_lines} 行：{transcript_path(d).name}]")]
        out.extend(body)
    return "\n".join(out)


def show_step(step: str, max_lines: int = 12) -> None:
    """Print one step of the gdb session with its output, then the lldb commands of the same step."""
    print(session_step(step, "gdb", max_lines))
    print(tr("\nthe same step in lldb:  ", "\n同一步在 lldb 里：  ") + "  |  ".join(step_commands(step, "lldb")))


# ============================================================================ tier B without the markers

UNMARKED_NAME = "06_kernel_without_markers.c"
_MARKER = re.compile(r"^\s*/\* == (end )?segment \d")


def _unmarked(path: Path | str = source.KERNEL_FILE) -> tuple[list[str], dict[int, int]]:
    """The kernel's lines without the segment markers (and without the header's sentence about
    them), and the map old line number -> new line number of every kept line."""
    kept, new_of = [], {}
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if _MARKER.search(line) or "segment N ==" in line or "lessons' line ranges through them" in line:
            continue
        if kept and line.strip() == "*" and kept[-1].strip() == "*":
            continue   # the header's paragraph break, left twice by the sentence removed above
        kept.append(line)
        new_of[n] = len(kept)
    return kept, new_of


def unmarked_kernel(dest: Path | str | None = None, path: Path | str = source.KERNEL_FILE) -> Path:
    """Write a copy of the kernel file with its ``== segment N ==`` comments removed, for tier B
    (lesson 06): the student finds the four parts by reading the code, not by searching for the
    markers. The line numbers move (the copy is shorter), so the markers of native/ do not give the
    answer either. Default ``dest``: ``my-work/06_kernel_without_markers.c`` (the student's working
    folder, git-ignored). Written whole or not at all (a temporary file, then a rename)."""
    from . import workspace
    dest = Path(dest) if dest is not None else workspace.WORK_DIR / UNMARKED_NAME
    dest.parent.mkdir(parents=True, exist_ok=True)
    kept, _ = _unmarked(path)
    fd, tmp = tempfile.mkstemp(prefix=".unmarked-", dir=dest.parent)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(kept) + "\n")
    os.replace(tmp, dest)
    return dest


def _is_edge(line: str) -> bool:
    """A line that may be left out at the edge of a part: blank, comment only, or a trace hook."""
    s = line.strip()
    return not s or s.startswith(("/*", "//", "*")) or s.startswith("TRACE_")


def unmarked_segments(path: Path | str = source.KERNEL_FILE) -> dict[int, tuple[tuple[int, int], tuple[int, int]]]:
    """For each of the four parts, in the line numbers of ``unmarked_kernel``'s copy: the range of
    accepted start lines and of accepted end lines (inclusive). A part is what lay between its two
    markers; a blank line, a comment-only line or a TRACE_ hook at its edge may be left in or out."""
    lines = Path(path).read_text().splitlines()
    _, new_of = _unmarked(path)
    out = {}
    for n, seg in source.kernel_segments(path).items():
        inner = list(range(seg.begin + 1, seg.end))
        core = [k for k in inner if not _is_edge(lines[k - 1])]
        if not core:
            raise ValueError(f"segment {n} of {Path(path).name} has no code")
        out[n] = ((new_of[inner[0]], new_of[core[0]]), (new_of[core[-1]], new_of[inner[-1]]))
    return out


def same_records(observation: Observation, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    """Do a debugger's records match the traced build's for the same generation (same n_tokens and
    config): the same calls, seq_len, kv head and token order, and M after every token within
    ``rtol``? gdb and lldb print float32 with 9 significant digits (exact); the traced build is
    the -O3 one (with FMA contraction), the debugged one -O0, so M may differ in its last bits:
    1e-5 relative is about 100 float32 steps, far below any real change of M (lesson 06)."""
    traced, _ = records_from_trace(observation.n_tokens, observation.config)
    got = observation.records
    return (len(got) == len(traced)
            and all((g.seq_len, g.kv_head, g.t) == (t.seq_len, t.kv_head, t.t) for g, t in zip(got, traced))
            and all(np.allclose(g.M, t.M, rtol=rtol, atol=atol) for g, t in zip(got, traced)))
