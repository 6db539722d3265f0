"""The exercises of lesson 06."""
from __future__ import annotations

import functools

import numpy as np

from .. import debugger, kernel_copy, source
from ..language import N_, _
from ..validate import short
from .core import Blank, Choice, Exercise, Field, Wrong, filled, lesson04_data, register, whole


@functools.lru_cache(maxsize=None)
def _default_observation():
    return debugger.observe_generation(16)


def _tier_a_facts(observation=None) -> dict:
    """The six answers, read from the records (not from the toy's settings)."""
    obs = observation or _default_observation()
    rs, s = obs.records, obs.summary()
    first = rs[0].seq_len
    per_step = sum(1 for r in rs if r.seq_len == first)
    return {"seq_len_first": first, "seq_len_last": rs[-1].seq_len, "calls_per_step": per_step,
            "grows_by_per_step": (rs[per_step].seq_len - first) if len(rs) > per_step else 0,
            "loop_runs_seq_len": s["token loop ran exactly seq_len times in every call"],
            "M_non_decreasing": s["M never decreased within a call"], "source": obs.source, "calls": len(rs)}


def _tier_a_field(kind, hint: N_) -> Field:
    return Field(kind, lambda key, got, source, **unused: _("{key} = {got!r} is not what the {source} records show: "
                                                       "{hint}").format(
                                                       key=key, got=got, source=source, hint=hint))


ex1 = Exercise(
    "tier_a", N_("tier A: seq_len, the token loop, M"),
    N_("From the debugger's records of the 16-token generation: seq_len at entry of the first and the last call, "
       "kernel calls per generation step, how much seq_len grows from one step to the next, whether the token loop "
       "ran exactly seq_len times in every call, whether M never decreased within a call. Pass the observation: "
       "check(answer, observation=obs)."),
    facts=_tier_a_facts,
    fields={"seq_len_first": _tier_a_field(int, N_("the first record's seq_len")),
            "seq_len_last": _tier_a_field(int, N_("the last record's seq_len")),
            "calls_per_step": _tier_a_field(int, N_("count the records of the first step (one per query head)")),
            "grows_by_per_step": _tier_a_field(int, N_("seq_len of the second step minus seq_len of the first")),
            "loop_runs_seq_len": _tier_a_field(bool, N_("compare each record's iterations (stops in segment 3) "
                                                        "with its seq_len")),
            "M_non_decreasing": _tier_a_field(bool, N_("look at M after each token, within each call"))},
    correct=N_("{calls} calls, seq_len {seq_len_first} .. {seq_len_last}, +{grows_by_per_step} per step of "
               "{calls_per_step} calls; the token loop ran seq_len times and M never fell (records from {source})"),
    hint=N_("obs.records: r.seq_len, r.iterations, r.M (one value per token); obs.summary() computes the same."))

ARTICLE_PARTS = {1: N_("Q 量化 (Q quantization)"), 2: N_("打分 (scoring)"),
                 3: N_("rescale + accumulate V (online softmax)"),
                 4: N_("归一 (normalization)")}


def _segments_facts(path=None):
    """The lines of the copy without markers (debug.unmarked_kernel), from the markers of ``path``
    (default: native/flash_attn_q8_neon.c) mapped to the copy's numbers."""
    return {"accepted": kernel_copy.unmarked_segments(path or source.KERNEL_FILE), "copy": kernel_copy.UNMARKED_NAME}


def _off(n: int, start: bool, got: int, accepted: tuple[int, int]) -> str | None:
    (lo, hi), part = accepted, ARTICLE_PARTS[n]
    if lo <= got <= hi:
        return None
    d = lo - got if got < lo else got - hi
    if start and got < lo:
        return _("segment {n} ({part}): your start is {d} line(s) too early").format(n=n, part=part, d=d)
    if start:
        return _("segment {n} ({part}): your start is {d} line(s) too late").format(n=n, part=part, d=d)
    if got < lo:
        return _("segment {n} ({part}): your end is {d} line(s) too early").format(n=n, part=part, d=d)
    return _("segment {n} ({part}): your end is {d} line(s) too late").format(n=n, part=part, d=d)


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
    parts = [f"{n}: {s[0]}-{e[1]}" for n, (s, e) in accepted.items()]
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
    solution=lambda f: {n: (s[0], e[1]) for n, (s, e) in f["accepted"].items()},
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
    correct=N_("{why} (segment 1 ran {runs} time; {n_k} distinct K scales over {T} tokens)"),
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
       "segment 3 (the online softmax update: the second half of the article's 段2). Rebuild and load it with "
       "lk.native.load(src_dir=src, verify='crashes'), then read its weights for the scores {rescale_scores} with "
       "debug.kernel_weights(ffi, lib, scores). Which tokens get too much weight (too_heavy: a letter, 'a' to "
       "'d'), and by what factor is token 0's (normalized) weight too large (factor_token0: a number, broken / "
       "right)? Undo the edit afterwards.", rescale_scores=list(RESCALE_SCORES)),
    facts=_rescale_facts,
    fields={"too_heavy": Field(RESCALE_CHOICES), "factor_token0": Field(float, lambda got, want, why, scores, **unused: _("{why}. But token 0's weight "
            "is too large by a factor {want_got} than {got:.3g}: broken weight / right weight, for scores {scores}").format(
            why=why, want_got=_('larger') if want > got else _('smaller'), got=got, scores=scores), rtol=0.02)},
    correct=N_("{why}. Token 0 is {factor_token0:.2f}x too heavy for scores {scores}"),
    hint=N_("every score here is a new max, so without the rescale every token keeps weight exp(0) = 1; the right "
            "weights are debug.softmax_weights(scores). If your copy does not build, "
            "debug.break_kernel('no_rescale') makes the same edit in a temporary copy."))

register(__name__, [ex1, ex2, ex3, ex4])
