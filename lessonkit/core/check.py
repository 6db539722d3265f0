"""The check of a new build, run in a child process before anything is loaded (``lessonkit.native``):
``smoke`` runs ``smoke.py`` on the library with a timeout (``processes.run_bounded``), and this module reads
the codes and numbers the child reports and words them in the student's language; ``judge`` turns a crash,
a hang, a fork or wrong results into a KernelCheckError."""
from __future__ import annotations

import json
import re
import signal
import sys
import tempfile
from pathlib import Path

from .language import N_, _
from .processes import run_bounded, stopped
from .toolchain import BuildError, KernelCheckError, seconds_setting


def text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cut(text: str, keep: int = 5) -> str:
    """The first ``keep`` lines of ``text`` (each at most 200 characters), and how many more there were."""
    lines = text.splitlines()
    shown = "\n".join(l[:200] for l in lines[:keep])
    return shown + (_("\n... ({more} more lines)").format(more=len(lines) - keep) if len(lines) > keep else "")


def read_report(steps: list[str]) -> tuple[list, list]:
    """The failures and the cache shapes of smoke.py's last line, ``report {"failures": [...], "covered":
    [[seq_len, n_kv_heads, head_dim, block_size], ...]}``; ValueError if the line is missing or not what
    smoke.py writes (a check that died half way, or another program's output)."""
    if not steps or not steps[-1].startswith("report "):
        raise ValueError("no report")
    report = json.loads(steps[-1][len("report "):])
    failures = report.get("failures") if isinstance(report, dict) else None
    if not isinstance(failures, list):
        raise ValueError("no list of failures")
    for f in failures:
        try:
            failure(f)  # every failure must be one that can be put in words
        except (TypeError, KeyError, IndexError, ValueError, AttributeError):
            raise ValueError(f"unreadable failure {f!r:.80}") from None
    covered = report.get("covered", [])
    if not (isinstance(covered, list) and all(isinstance(c, list) and len(c) == 4 for c in covered)):
        raise ValueError("no list of cache shapes")
    return failures, covered


def while_running(what: str, steps: list[str]) -> str:
    """``what`` happened, and the step of smoke.py that was running then (its last "running" line)."""
    running = [l[len("running "):] for l in steps if l.startswith("running ")]
    try:
        step = subject(*json.loads(running[-1]))
    except (IndexError, ValueError, TypeError, KeyError):
        return what
    return _("{what} while running {step}").format(what=what, step=step)


# The words of smoke.py's codes, with their numbers: one table.
WORDS = {
    "case": lambda T, nkv, hd, bs, kh: _(" on case '{T} tokens, head_dim {hd}, blocks of {bs}, kv head {kh} of "
                                         "{nkv}'").format(T=T, hd=hd, bs=bs, kh=kh, nkv=nkv),
    "case_rising": lambda T, nkv, hd, bs, kh: _(" on case '{T} rising scores (a new max at every token), head_dim "
                                                "{hd}, blocks of {bs}, kv head {kh} of {nkv}'").format(
                                                T=T, hd=hd, bs=bs, kh=kh, nkv=nkv),
    "rows": lambda: _(" on 5 rows (zeros, huge, tiny)"),
    "recording": lambda: _(" (recording)"),
    "not_recording": lambda: _(" (not recording)"),
    "group": lambda G: _(" (G = {G} query heads)").format(G=G),
    "tokens": lambda t0, t1: _(" (tokens [{t0}, {t1}))").format(t0=t0, t1=t1),
    "merged": lambda: _(" (chunks merged)"),
    "two_ranges": lambda: _(" (two ranges)"),
    "variant": lambda v: _(" (variant {v})").format(v=v),
    "nan": lambda: _(": the output holds NaN or Inf"),
    "off": lambda err, tol: _(": off by {err:.1e} of max|reference| (tolerance {tol:.0e})").format(
                              err=err, tol=tol),
    "returned": lambda value: _(": returned {value}").format(value=value),
    "scales": lambda: _(": the scales are not the raw max|x| of each row"),
    "codes": lambda bad, n: _(": {bad} of {n} codes differ from floor(x * 127 / max + 0.5)").format(
                              bad=bad, n=n),
    "not_positive": lambda: _(": did not return a positive bandwidth"),
    "empty_string": lambda: _(": returned an empty string"),
    "missing": lambda why: _("missing function: {why}").format(why=why),
}


def subject(fn: str, case, part) -> str:
    """A step of smoke.py in words: the function, what part of it, on which case."""
    words = fn + (WORDS[part[0]](*part[1:]) if part else "")
    if case:
        words += WORDS["case_rising" if case[5] else "case"](*case[:5])
    return words


def failure(f) -> str:
    """One failure that smoke.py reported, in words (a record of an older lessonkit holds words)."""
    if isinstance(f, str):
        return f
    return subject(*f[:3]) + WORDS[f[3][0]](*f[3][1:])


def failure_lines(failures: list, keep: int = 5) -> str:
    """The first failure of each function (the functions share most of their code, so one line
    each says enough), at most ``keep`` of them, and how many other checks failed."""
    firsts: dict[str, str] = {}
    for f in failures:
        firsts.setdefault(f[0] if isinstance(f, list) else re.split(r" on | \(|:", f, maxsplit=1)[0], failure(f))
    shown = list(firsts.values())[:keep]
    more = len(failures) - len(shown)
    return "\n".join(f"  {f}" for f in shown) + (_("\n  ({more} more failed checks not shown)").format(
                                                   more=more) if more else "")


# ----------------------------------------------------------------------------- the check in a child process

SMOKE_SCRIPT = Path(__file__).resolve().parent / "smoke.py"


# How long the check of a new build may run in its child process before it counts as a hang
# (LESSONKIT_SMOKE_TIMEOUT, seconds). It takes a few seconds; the margin is for a slow board, a loaded
# machine or a sanitizer build.
SMOKE_TIMEOUT_S = 60.0


def smoke_timeout() -> float:
    return seconds_setting("LESSONKIT_SMOKE_TIMEOUT", SMOKE_TIMEOUT_S, 1, 3600)


# The check's progress lines (tests/conftest.py has nbval compare outputs without them: whether a
# cell checks a build depends on what this checkout built before, not on the lesson)
CHECKING_NEW = N_("Checking the new build in a separate process (up to {timeout:.0f} s) ...")
CHECKING_LONGER = N_("Checking this build on a cache of {n} tokens in a separate process (up to {timeout:.0f} s) ...")


def smoke(lib: Path, header: str, verify: str, shape: list | None = None) -> dict:
    """Run lessonkit/core/smoke.py on ``lib`` in a child process (``shape``: only one case, ``[seq_len,
    n_kv_heads, head_dim, block_size]``). Returns ``{"verified": level, "failures": [...], "crash":
    str|None, "output": str, "covered": [shape, ...]}`` (failures as smoke.py codes them; output: what
    the kernel itself printed, cut to a few lines; covered: the cache shapes it ran on)."""
    if verify == "skip":
        return {"verified": "skip", "failures": [], "crash": None, "output": "", "covered": []}
    with tempfile.TemporaryDirectory(prefix="lessonkit-check-") as tmp:
        report, out, err = (Path(tmp) / name for name in ("report", "stdout", "stderr"))
        request = json.dumps({"library": str(lib), "header": header, "report": str(report), "shape": shape})
        timeout = smoke_timeout()
        # one line while it runs: a hung edit makes the student wait up to the timeout
        print(CHECKING_NEW.format(timeout=timeout) if shape is None else
              CHECKING_LONGER.format(n=shape[0], timeout=timeout), flush=True)
        with stopped(_("the check of the build in a separate process (its processes were ended)")), \
                open(out, "wb") as fo, open(err, "wb") as fe:
            try:
                done = run_bounded([sys.executable, "-I", str(SMOKE_SCRIPT)], timeout, input=request, stdout=fo,
                                   stderr=fe)
            except OSError as e:
                raise BuildError(_("Could not start the check of the new build ({executable}): {e}").format(
                                   executable=sys.executable, e=e)) from None
        code = done.returncode
        steps = text(report).splitlines()
        # what the kernel printed: the first lines of its stdout, then of its stderr
        printed = "\n".join(part for part in map(cut, map(text, (out, err))) if part)
    result = {"verified": verify, "failures": [], "crash": None, "output": printed, "covered": []}
    if done.left_behind:  # a fork() at load or in a call: loaded here, it would copy the student's process
        result["crash"] = _("left {n} other processes running after it ended (the library, or its constructor, "
                            "calls fork(): loaded into your notebook it would copy your process); they were "
                            "ended").format(n=done.left_behind)
    elif code is None:
        result["crash"] = while_running(
            _("did not finish in {SMOKE_TIMEOUT_S:.0f} s (a hang: an endless loop?)").format(
              SMOKE_TIMEOUT_S=timeout), steps)
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        what = {"SIGSEGV": _("segmentation fault: a read or write outside the memory it owns"),
                "SIGBUS": _("bus error: a bad address"), "SIGILL": _("illegal instruction"),
                "SIGFPE": _("arithmetic exception"), "SIGABRT": _("abort")}.get(name)
        crash = _("crashed with {name} ({what})").format(name=name, what=what) if what else \
            _("crashed with {name}").format(name=name)
        result["crash"] = while_running(crash, steps) + (f":\n{printed}" if printed else "")
    else:
        try:
            result["failures"], result["covered"] = read_report(steps)
        except ValueError as e:
            crash = (_("wrote a report of its check that cannot be read ({why})").format(why=e)
                     if steps and steps[-1].startswith("report ") else
                     while_running(_("stopped with exit code {returncode}").format(returncode=code), steps))
            result["crash"] = crash + (f":\n{printed}" if printed else "")
    return result


def judge(result: dict, verify: str) -> None:
    """Raise KernelCheckError for a crash or hang (always) and for wrong results (verify="results").
    Wrong results allowed by verify="crashes" are shown by load() as a warning."""
    keep = _("Nothing new was loaded; what was loaded before keeps working. Fix the edit and run the cell again.")
    if result.get("crash"):
        raise KernelCheckError(_("The new build of the kernel {result}.\n{keep}").format(
                                 result=result['crash'], keep=keep))
    failures = result.get("failures") or []
    if failures and verify == "results":
        raise KernelCheckError(_("The new build of the kernel gives wrong results against the reference (the "
                                 "engine's quantized math in numpy, float64):\n{failure_lines_failures}\n{keep} To "
                                 "load a kernel you broke on purpose, pass verify='crashes' (crashes and hangs are "
                                 "still caught; results are not).").format(
                                 failure_lines_failures=failure_lines(failures), keep=keep))


def refusal(result: dict, checked: int, n: int, shape: tuple) -> str:
    seq_len, nkv, hd, bs = shape
    if result["crash"]:
        what, why = result["crash"], _("A buffer sized for short caches (such as float seen[8192]), or by tokens x "
                                       "head_dim, is the usual cause: size it by seq_len, or do without it.")
    else:
        what = _("computes wrong results against the reference:\n{lines}").format(
                 lines=failure_lines(result["failures"]))
        why = _("A counter or a sum that overflows or loses precision on long caches is the usual cause.")
    return _("This build of the kernel passed its check on caches of up to {checked} tokens of this shape "
             "({nkv} kv heads, head_dim {hd}, blocks of {bs}); checked now on a cache of {n} tokens (in a child "
             "process, before your call on {seq_len} tokens), it {what}\nThe call was not made; your process and "
             "what it holds are safe. {why} Calls on smaller caches still run.").format(
             checked=checked, nkv=nkv, hd=hd, bs=bs, n=n, seq_len=seq_len, what=what, why=why)
