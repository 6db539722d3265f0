"""The exercises of lesson 06."""
from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..lessons import by_hand, debugger, kernel_copy, toy
from ..display import source
from ..core.language import N_, _
from ..core.validate import short
from .core import (Blank, Choice, Exercise, Field, Wrong, _has_blank, field_of, filled, lesson04_data, register,
                   shown, whole)


M_RTOL, M_ATOL = 1e-5, 1e-6   # as debugger.same_records: the session's -O0 build and the traced -O3 one (FMA
                              # contraction) differ in M's last bits; a value copied by hand differs far more


@functools.lru_cache(maxsize=None)
def _tier_a_trace():
    """The kernel's own trace of the generation the session runs (by_hand.TIER_A_PROGRAM)."""
    return tuple(debugger.records_from_trace(by_hand.TIER_A_TOKENS)[0])


ANSWERS_TEMPLATE = {"seq_len_first": ..., "calls_per_step": ..., "loop_runs_seq_len": ..., "M_ever_decreases": ...}


def _tier_a_facts(answers=None) -> dict:
    rs = _tier_a_trace()
    return {"records": rs, "seq_lens": [r.seq_len for r in rs], "calls": len(rs),
            "per_step": toy.ToyConfig().n_q_heads, "tokens": by_hand.TIER_A_TOKENS, "answers": answers}


def _tier_a_answers(answers, facts) -> str:
    """The student's answers to tier A's questions, against the same generation (whose session was
    checked before): the reasons of every wrong one, or the answers as the student gave them."""
    if answers is None or answers is ...:
        raise Blank(_("your session is this generation's; now give your answers to the three questions of "
                      "section 1 with it: check(transcript, answers={template})").format(
                      template=shown(ANSWERS_TEMPLATE)))
    if not isinstance(answers, Mapping):
        raise Wrong(_("answers is a dict like {template}; got {got}").format(
                    template=shown(ANSWERS_TEMPLATE), got=type(answers).__name__))
    if _has_blank(answers):
        raise Blank(_("replace every ... in answers={template} by your answer").format(
                      template=shown(ANSWERS_TEMPLATE)))
    first, per_step = facts["seq_lens"][0], facts["per_step"]
    got = {k: field_of(answers, k, int if k in ("seq_len_first", "calls_per_step") else bool) for k in ANSWERS_TEMPLATE}
    wrong = []
    if got["seq_len_first"] != first:
        wrong.append(_("seq_len_first = {got}: the frame line of your session's first stop shows seq_len={want}; "
                       "the first step appends its token to the cache before it calls the kernel").format(
                       got=got["seq_len_first"], want=first))
    if got["calls_per_step"] != per_step:
        wrong.append(_("calls_per_step = {got}: in your session, seq_len stays the same for {want} entry stops "
                       "before it grows by one: one call per query head").format(
                       got=got["calls_per_step"], want=per_step))
    if got["loop_runs_seq_len"] is not True:
        wrong.append(_("loop_runs_seq_len = False: count the loop's stops after each entry stop of your "
                       "session: t runs 0, 1, ... seq_len-1, seq_len stops in every call"))
    if got["M_ever_decreases"] is not False:
        wrong.append(_("M_ever_decreases = True: within one call of your session, M stays or grows from stop "
                       "to stop (a running max); it starts over only in the next call, from M = -1e9"))
    if wrong:
        raise Wrong(_("your session is this generation's, but {n} answer(s) disagree with it: {reasons}").format(
                    n=len(wrong), reasons="; ".join(wrong)))
    return _("and your answers agree with it: seq_len {seq_len_first} on the first call, {calls_per_step} calls "
             "per step, the loop runs seq_len times: {loop_runs_seq_len}, M ever decreases: "
             "{M_ever_decreases}").format(**got)


def _listed(values) -> str:
    return " ".join(map(str, values))


def _tier_a(answer, facts) -> str:
    try:
        text = by_hand.transcript_text(answer)
    except ValueError as e:
        raise Wrong(str(e)) from None
    if not text.strip():
        raise Wrong(_("the transcript is empty: paste the whole session from the terminal, or pass the file "
                      "the debugger wrote (Path(...))"))
    try:
        session = by_hand.read_session(text)
    except ValueError as e:
        raise Wrong(_("a value of the transcript is not a number: {e}").format(e=e)) from None
    entry, loop = by_hand.tier_a_lines()
    if not session.calls:
        raise Wrong(_("the transcript shows no stop at the kernel's entry (line {entry}, with seq_len): set the "
                      "breakpoint on {kernel} as section 4 shows, run, and hand in the whole session").format(
                      entry=entry, kernel=by_hand.KERNEL))
    rs, want = facts["records"], facts["seq_lens"]
    got = [c.seq_len for c in session.calls]
    if got != want:
        if got == want[:len(got)]:
            raise Wrong(_("the session ends after {n} of the generation's {calls} kernel calls: continue until "
                          "the program exits").format(n=len(got), calls=facts["calls"]))
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want)) + 1   # counted from 1
        raise Wrong(_("the seq_len values on entry ({got}) cannot come from this generation: it makes {per_step} "
                      "calls per step (one per query head) with the same seq_len, and each step adds one token "
                      "({calls} calls: {want}); call {k} differs").format(
                      got=_listed(got), per_step=facts["per_step"], calls=facts["calls"], want=_listed(want), k=k))
    for k, c in enumerate(session.calls, start=1):   # every verdict counts calls and stops from 1
        shown = {s[2] for s in c.stops if s[2] is not None}
        if shown - {c.seq_len}:
            raise Wrong(_("call {k}: its entry shows seq_len={seq_len} but a stop in its loop shows seq_len={other}: "
                          "one call has one seq_len; this transcript was edited").format(
                          k=k, seq_len=c.seq_len, other=min(shown - {c.seq_len})))
    if session.other_lines:
        raise Wrong(_("the session also stops at line(s) {lines}: the stops of tier A are line {entry} (the entry) "
                      "and line {loop} (in the loop, where M is up to date); delete the other breakpoints").format(
                      lines=_listed(session.other_lines), entry=entry, loop=loop))
    for k, c in enumerate(session.calls, start=1):
        if len(c.stops) != c.seq_len:
            raise Wrong(_("call {k} (seq_len {seq_len}): the loop breakpoint (line {loop}) stopped {n} time(s). Set it "
                          "at the first stop, before the first continue, and keep every stop of the run").format(
                          k=k, seq_len=c.seq_len, loop=loop, n=len(c.stops)))
        for j, (t, M, *unused) in enumerate(c.stops, start=1):
            if t is None or M is None:
                raise Wrong(_("call {k}, stop {j} in the loop: t and M are not printed ({how})").format(
                              k=k, j=j, how=_("display t and display M at the first stop in the loop")
                              if session.debugger == "gdb" else _('the loop breakpoint\'s -C "frame variable t M"')))
        Ms = [s[1] for s in c.stops]
        for j in range(1, len(Ms)):
            if Ms[j] < Ms[j - 1]:
                raise Wrong(_("call {k}: M decreases from {a} (t={i}) to {b} (t={j}). M is the running max of the "
                              "scores and the kernel never lowers it: this transcript did not come from the kernel").format(
                              k=k, a=Ms[j - 1], b=Ms[j], i=j - 1, j=j))
    for k, (c, r) in enumerate(zip(session.calls, rs), start=1):
        ts = [s[0] for s in c.stops]
        if ts != r.t:
            raise Wrong(_("call {k}: t runs {got} in the transcript; the kernel's loop runs {want}").format(
                          k=k, got=_listed(ts), want=_listed(r.t)))
        if c.kv_head is not None and c.kv_head != r.kv_head:
            raise Wrong(_("call {k}: kh_off points at kv head {got}; this generation's call {k} reads kv head "
                          "{want}").format(k=k, got=c.kv_head, want=r.kv_head))
        for (t, M, *unused), m in zip(c.stops, r.M):
            if not abs(M - m) <= M_ATOL + M_RTOL * abs(m):
                raise Wrong(_("call {k}, t={t}: M = {got} in the transcript, {want:.9g} in the kernel's trace of the "
                              "same generation: a value typed by hand, or from another run").format(
                              k=k, t=t, got=M, want=m))
    n = sum(len(c.stops) for c in session.calls)
    # the session first: its message states no answer the student has not given
    said = _("your {debugger} session is this generation's: every seq_len, every stop in the loop and all {n} "
             "values of M agree with the kernel's trace (within {rtol:g} relative)").format(
             debugger=session.debugger, n=n, rtol=M_RTOL)
    return said + "; " + _tier_a_answers(facts["answers"], facts)


ex1 = Exercise(
    "tier_a", N_("tier A: seq_len, the token loop, M, in your own session"),
    N_("Run the session of section 4 in a terminal and answer tier A from what the debugger shows you: what is "
       "seq_len on entry, call after call? Does the for (t) loop run exactly seq_len times in one call? Does M "
       "ever decrease within a call? Then hand in the session with your answers: check(transcript, "
       "answers={...}), where transcript is Path('my-work/06_tier_a_gdb.txt') for the file gdb logged (lldb: "
       "my-work/06_tier_a_lldb.txt, written by session save) or the text copied from the terminal. The check "
       "compares every seq_len, every stop in the loop and every M of your session with the kernel's trace of "
       "the same generation, then your answers with that generation."),
    facts=_tier_a_facts, check=_tier_a, template=...,
    solution=lambda f: {"seq_len on entry": f["seq_lens"], "stops in the loop per call": f["seq_lens"],
                        "M": [[round(m, 6) for m in r.M] for r in f["records"]],
                        "answers": {"seq_len_first": f["seq_lens"][0], "calls_per_step": f["per_step"],
                                    "loop_runs_seq_len": True, "M_ever_decreases": False}},
    hint=N_("gdb prints seq_len=... on the frame line of every stop; display t and display M print the loop's "
            "state at every stop in it. Press Enter to repeat continue until the program exits."))

ARTICLE_PARTS = {1: N_("Q 量化 (Q quantization)"), 2: N_("打分 (scoring)"),
                 3: N_("rescale + accumulate V (online softmax)"), 4: N_("归一 (normalization)")}


def _segments_facts(path=None):
    """The parts in the copy without markers (debug.unmarked_kernel) of ``path`` (default: native/'s kernel);
    "accepted" also takes the blank and comment lines just outside a part, as the question allows."""
    path = path or source.KERNEL_FILE
    parts, copy = kernel_copy.unmarked_segments(path), [x.strip() for x in kernel_copy._unmarked(Path(path))[0]]
    loose = [(x or "/*").startswith(("/*", "//", "*")) for x in copy]   # blank or a comment, by line number - 1
    edge = lambda n, step: edge(n + step, step) if 0 < n + step <= len(copy) and loose[n + step - 1] else n  # noqa: E731
    accepted = {n: ((edge(s0, -1), s1), (e0, edge(e1, 1))) for n, ((s0, s1), (e0, e1)) in parts.items()}
    return {"accepted": accepted, "parts": parts, "copy": kernel_copy.UNMARKED_NAME}


def _off(n: int, start: bool, got: int, accepted: tuple[int, int]) -> str | None:
    (lo, hi), part = accepted, ARTICLE_PARTS[n]
    if lo <= got <= hi:
        return None
    d, early = (lo - got, True) if got < lo else (got - hi, False)
    return {(True, True): _("segment {n} ({part}): your start is {d} line(s) too early"),
            (True, False): _("segment {n} ({part}): your start is {d} line(s) too late"),
            (False, True): _("segment {n} ({part}): your end is {d} line(s) too early"),
            (False, False): _("segment {n} ({part}): your end is {d} line(s) too late")}[start, early].format(
            n=n, part=part, d=d)


def _segment_number(k) -> int:
    try:
        n = whole(k, "")
    except Wrong:
        n = 0
    if n not in ARTICLE_PARTS:
        raise Wrong(_("keys are the segment numbers 1 to 4; got {short_k}").format(short_k=short(k)))
    return n


def _segments(answer, facts):
    if len(answer) > 16:
        raise Wrong(_("give a dict {1: (start, end), 2: ..., 3: ..., 4: ...}: four segments"))
    given = {_segment_number(k): v for k, v in answer.items()}
    problems, accepted, copy = [], facts["accepted"], facts["copy"]
    for n, (ok_start, ok_end) in accepted.items():
        if n not in given:
            raise Wrong(_("segment {n} ({article_parts_n}) is missing").format(
                          n=n, article_parts_n=ARTICLE_PARTS[n]))
        if not filled(given[n]) or (isinstance(given[n], (tuple, list)) and not all(map(filled, given[n]))):
            raise Blank(_("fill in segment {n}").format(n=n))
        if not isinstance(given[n], (tuple, list)) or len(given[n]) != 2:
            raise Wrong(_("segment {n}: give (start line, end line); got {short_given_n}").format(
                          n=n, short_given_n=short(given[n])))
        start, end = (whole(x, _("segment {n}'s line").format(n=n)) for x in given[n])
        problems += [p for p in (_off(n, True, start, ok_start), _off(n, False, end, ok_end)) if p]
    if problems:
        raise Wrong(_("{problems} (line numbers of {copy})").format(problems=_('; ').join(problems), copy=copy))
    parts = [f"{n}: {s[0]}-{e[1]}" for n, (s, e) in facts["parts"].items()]
    return _("all four parts match the code of {copy}: {parts}").format(copy=copy, parts=_(', ').join(parts))


ex2 = Exercise(
    "tier_b_segments", N_("tier B: the four segments' lines"),
    N_("debug.unmarked_kernel() writes the kernel without its segment comments to my-work/{UNMARKED_NAME}. Read "
       "that copy (print it with source.numbered_lines(first, last, path=copy)) and give the start and end line, "
       "in the copy's numbering, of each part: 1 Q 量化 (Q to int8), 2 打分 (the score s of token t), 3 rescale (the "
       "article's name; the part also adds token t's V row into VKQ), 4 归一 (divide by S). Rules: a part starts "
       "with the declarations of its own variables (Q's buffers qsc and qi belong to part 1). The token loop's own "
       "line (for ...) and the lines before the loop that set up M, S and VKQ belong to no part. A blank line, a "
       "comment line or a TRACE_ line (a hook of the traced build) at the edge of a part may be counted in or out. "
       "Give line numbers as whole numbers.", UNMARKED_NAME=kernel_copy.UNMARKED_NAME),
    facts=_segments_facts, check=_segments, template={1: (..., ...), 2: (..., ...), 3: (..., ...), 4: (..., ...)},
    solution=lambda f: {n: (s[0], e[1]) for n, (s, e) in f["parts"].items()},
    hint=N_("part 1 ends where Q's codes and block scales are done; part 2 ends when the score s of token t is "
            "final; part 3 is the rest of the loop body; part 4 is after the loop. A TRACE_ hook or a blank line "
            "at the edge may be in or out."))

WHY_CHOICES = {
    "a": Choice(N_("Q is the same for every token, so it is coded once; each K row was quantized when written, "
                   "with its own scale"),
                N_("right: the trace shows segment 1 running once and (nearly) as many K scales as tokens")),
    "b": Choice(N_("Quantizing Q is expensive, so it is done once; K's scale could just as well be applied once at "
                   "the end, to the output"),
                N_("no: each token's score is multiplied by its own ks before exp(); a factor that differs per "
                   "token cannot be taken out of the sum of exponentials")),
    "c": Choice(N_("The K cache holds float32; the kernel quantizes each K row as it reads it, and that needs the "
                   "row's own scale each time"),
                N_("no: K is already int8 in the cache (quantized once, when written); the kernel only reads its "
                   "stored scale")),
    "d": Choice(N_("Q changes during the scan, because the online rescale multiplies Q by exp(M_old - M_new) "
                   "whenever M rises"),
                N_("no: the rescale multiplies S and VKQ, never Q; Q's codes stay fixed for the whole call")),
}


def _why_facts():
    cache, q, kh, scale, out, trace = lesson04_data()
    n_k = len(np.unique(cache.k_scales(kh)))
    return {"choice": "a" if trace.n_q_quantized == 1 and n_k > 1 else "b", "runs": trace.n_q_quantized, "n_k": n_k,
            "T": cache.seq_len}


ex3 = Exercise(
    "tier_b_why", N_("tier B: why Q once, K's scale per token?"),
    N_("Why is Q quantized only once per call, while K's scale is multiplied in for every token?"),
    facts=_why_facts, fields={"choice": Field(WHY_CHOICES)},
    correct=N_("{why} (a trace of lesson 04's call shows it: segment 1 ran {runs} time; {n_k} distinct K scales over {T} "
               "tokens)"),
    hint=N_("which of the two depends on the token index t?"))

RESCALE_CHOICES = {
    "a": Choice(N_("the tokens before the last new max, each by exp(M_final - M_t) against the later tokens"),
                N_("right: their terms stayed relative to an older, lower M and were never multiplied by ms; after "
                   "the division by the inflated sum, the tokens from the last maximum on all come out too light")),
    "b": Choice(N_("only the tokens that raised M, each by exp(s_t) against the tokens that did not"),
                N_("no: a token that raises M gets weight exp(0) = 1, as in the intact kernel; it is everything "
                   "summed before it that is never shrunk")),
    "c": Choice(N_("the tokens after the last new max, each by exp(M_final - s_t) against the earlier ones"),
                N_("no: after the last new max M no longer moves, so those tokens keep the right weights relative "
                   "to each other; it is the earlier ones that are too heavy")),
    "d": Choice(N_("none of them: the weights keep their ratios, only the final division by S is off"),
                N_("no: S and VKQ miss the same factors, and the division does not repair the mix of weights: the "
                   "output leans toward the past")),
}
RESCALE_SCORES = (0.0, 1.0, 2.0, 3.0)


@functools.lru_cache(maxsize=None)
def _rescale_facts():
    b = kernel_copy.break_kernel("no_rescale")
    wrong = kernel_copy.kernel_weights(b.ffi, b.lib, RESCALE_SCORES).astype(np.float64)
    ratio = wrong / kernel_copy.softmax_weights(RESCALE_SCORES)
    last_max = int(np.flatnonzero(np.array(RESCALE_SCORES) == np.maximum.accumulate(RESCALE_SCORES))[-1])
    heavy = np.flatnonzero(ratio > ratio[last_max] * (1 + 1e-4)).tolist()   # relative to the last maximum
    return {"too_heavy": "a" if heavy == list(range(last_max)) else "b", "factor_token0": float(ratio[0]),
            "scores": list(RESCALE_SCORES)}


ex4 = Exercise(
    "break_rescale", N_("break it: no online rescale"),
    N_("In your copy of the kernel (src = workspace.student_native(); edit src / 'flash_attn_q8_neon.c'), comment "
       "out the two lines that rescale on a new max: S *= ms; and the loop that multiplies VKQ by msv. They are in "
       "segment 3 (the online softmax update; lesson 00 maps the segments to the article's parts). Rebuild and load it with "
       "ffi, lib = lk.native.load(src_dir=src, verify='crashes') (the ready cell below does both), then read its "
       "weights for the scores {rescale_scores} with debug.kernel_weights(ffi, lib, {rescale_scores}). Which tokens get too much weight (too_heavy: a letter, 'a' to "
       "'d'), and by what factor is token 0's (normalized) weight too large (factor_token0: a number, broken / "
       "right)? Undo the edit afterwards.", rescale_scores=list(RESCALE_SCORES)),
    facts=_rescale_facts,
    fields={"too_heavy": Field(RESCALE_CHOICES), "factor_token0": Field(float, lambda got, want, why, scores, **unused: _("{why}. But token 0's weight "
            "is too large by a factor {want_got} than {got:.3g}: broken weight / right weight, for scores {scores}").format(
            why=why, want_got=_('larger') if want > got else _('smaller'), got=got, scores=scores), rtol=0.02)},
    correct=N_("{why}. Token 0 is {factor_token0:.2f}x too heavy for scores {scores}"),
    hint=N_("every score here is a new max, so without the rescale every token keeps weight exp(0) = 1; the right "
            "weights are debug.softmax_weights({rescale_scores}). If your copy does not build, "
            "debug.break_kernel('no_rescale') makes the same edit in a temporary copy.", rescale_scores=list(RESCALE_SCORES)))

register(__name__, [ex1, ex2, ex3, ex4])
