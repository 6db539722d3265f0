"""smoke.py's report, read and put in words: the child that checks a new build reports codes and
numbers (lessonkit/smoke.py); this module reads its report file and its output, and words each code in
the student's language, for ``lessonkit.native``'s messages. Standard library and the catalog only."""
from __future__ import annotations

import json
import re
from pathlib import Path

from .language import _


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
