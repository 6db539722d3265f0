"""The exercises of lesson 06."""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import numpy as np

from .. import debug
from .. import source
from ..validate import short
from .core import (register, Wrong, Blank, filled, whole, field_of, close, Choice, Exercise, pick, lesson04_data)

@functools.lru_cache(maxsize=None)
def _default_observation():
    return debug.observe_generation(16)


def _l06_tier_a_truth(observation=None) -> dict:
    """The six answers, read from the records (not from the toy's settings)."""
    obs = observation or _default_observation()
    rs, s = obs.records, obs.summary()
    first = rs[0].seq_len
    per_step = sum(1 for r in rs if r.seq_len == first)
    return {"seq_len_first": first, "seq_len_last": rs[-1].seq_len, "calls_per_step": per_step,
            "grows_by_per_step": (rs[per_step].seq_len - first) if len(rs) > per_step else 0,
            "loop_runs_seq_len": s["token loop ran exactly seq_len times in every call"],
            "M_non_decreasing": s["M never decreased within a call"]}


TIER_A_HINTS = {"seq_len_first": "the first record's seq_len", "seq_len_last": "the last record's seq_len",
                "calls_per_step": "count the records of the first step (one per query head)",
                "grows_by_per_step": "seq_len of the second step minus seq_len of the first",
                "loop_runs_seq_len": "compare each record's iterations (stops in segment 3) with its seq_len",
                "M_non_decreasing": "look at M after each token, within each call"}


def _l06_tier_a(answer, observation=None):
    obs = observation or _default_observation()
    truth = _l06_tier_a_truth(obs)
    for key, kind in (("seq_len_first", int), ("seq_len_last", int), ("calls_per_step", int),
                      ("grows_by_per_step", int), ("loop_runs_seq_len", bool), ("M_non_decreasing", bool)):
        got = field_of(answer, key, kind)
        if got != truth[key]:
            raise Wrong(f"{key} = {got!r} is not what the {obs.source} records show: {TIER_A_HINTS[key]}")
    return (f"{len(obs.records)} calls, seq_len {truth['seq_len_first']} .. {truth['seq_len_last']}, "
            f"+{truth['grows_by_per_step']} per step of {truth['calls_per_step']} calls; the token loop ran "
            f"seq_len times and M never fell (records from {obs.source})")


ex06_a = Exercise(
    lesson="06", name="tier_a", title="tier A: seq_len, the token loop, M",
    question="From the debugger's records of the 16-token generation: seq_len at entry of the first and the last call, "
    "kernel calls per generation step, how much seq_len grows from one step to the next, whether the token "
    "loop ran exactly seq_len times in every call, whether M never decreased within a call. "
    "Pass the observation: check(answer, observation=obs).",
    template={"seq_len_first": ..., "seq_len_last": ..., "calls_per_step": ..., "grows_by_per_step": ...,
     "loop_runs_seq_len": ..., "M_non_decreasing": ...}, check=_l06_tier_a,
    solution=_l06_tier_a_truth,
    hint="obs.records: r.seq_len, r.iterations, r.M (one value per token); obs.summary() computes the same.")

ARTICLE_PARTS = {1: "Q 量化 (Q quantization)", 2: "打分 (scoring)", 3: "rescale + accumulate V (online softmax)",
                 4: "归一 (normalization)"}


def _segment_key(k) -> int:
    try:
        n = whole(k, "a segment key")
    except Wrong:
        raise Wrong(f"keys are the segment numbers 1 to 4; got {short(k)}") from None
    if n not in ARTICLE_PARTS:
        raise Wrong(f"keys are the segment numbers 1 to 4; got {short(k)}")
    return n


def _direction(got: int, accepted: tuple[int, int], what: str) -> str:
    lo, hi = accepted
    if got < lo:
        return f"{what} is {lo - got} line(s) too early"
    return f"{what} is {got - hi} line(s) too late"


def _l06_segments(answer, path=None):
    """Lines of the copy without markers (debug.unmarked_kernel); the truth comes from the
    markers of ``path`` (default: native/flash_attn_q8_neon.c), mapped to the copy's numbers."""
    path = path or source.KERNEL_FILE
    accepted = debug.unmarked_segments(path)
    if not isinstance(answer, Mapping):
        if not isinstance(answer, (list, tuple)) or len(answer) > 16:
            raise Wrong("give a dict {1: (start, end), 2: ..., 3: ..., 4: ...}")
        answer = dict(enumerate(answer, start=1))
    if len(answer) > 16:
        raise Wrong("give a dict {1: (start, end), 2: ..., 3: ..., 4: ...}: four segments")
    given = {_segment_key(k): v for k, v in answer.items()}
    problems = []
    for n, (ok_start, ok_end) in accepted.items():
        if n not in given:
            raise Wrong(f"segment {n} ({ARTICLE_PARTS[n]}) is missing")
        if not filled(given[n]) or (isinstance(given[n], (tuple, list)) and not all(map(filled, given[n]))):
            raise Blank(f"fill in segment {n}")
        if not isinstance(given[n], (tuple, list)) or len(given[n]) != 2:
            raise Wrong(f"segment {n}: give (start line, end line); got {short(given[n])}")
        start, end = (whole(x, f"segment {n}'s line") for x in given[n])
        if not ok_start[0] <= start <= ok_start[1]:
            problems.append(f"segment {n} ({ARTICLE_PARTS[n]}): " + _direction(start, ok_start, "your start"))
        if not ok_end[0] <= end <= ok_end[1]:
            problems.append(f"segment {n} ({ARTICLE_PARTS[n]}): " + _direction(end, ok_end, "your end"))
    if problems:
        raise Wrong("; ".join(problems) + " (line numbers of " + debug.UNMARKED_NAME + ")")
    return ("all four parts match the code of " + debug.UNMARKED_NAME + ": "
            + ", ".join(f"{n}: {s[0]}-{e[1]}" for n, (s, e) in accepted.items()))


ex06_b1 = Exercise(
    lesson="06", name="tier_b_segments", title="tier B: the four segments' lines",
    question="debug.unmarked_kernel() writes the kernel without its segment comments to my-work/"
    + debug.UNMARKED_NAME + ". Read that copy (print it with source.numbered_lines(first, last, path=copy)) and give "
    "the start and end line, in the copy's numbering, of each part: 1 Q 量化 (Q to int8), 2 打分 (the score s of "
    "token t), 3 rescale (the article's name; the part also adds token t's V row into VKQ), 4 归一 (divide by S). "
    "Rules: a part starts with the declarations of its own variables (Q's buffers qsc and qi belong to part 1). "
    "The token loop's own line (for ...) and the lines before the loop that set up M, S and VKQ belong to no part. "
    "A blank line, a comment line or a TRACE_ line (a hook of the traced build) at the edge of a part may be "
    "counted in or out. Give line numbers as whole numbers.",
    template={1: (..., ...), 2: (..., ...), 3: (..., ...), 4: (..., ...)}, check=_l06_segments,
    solution=lambda path=None: {n: (s[0], e[1]) for n, (s, e) in debug.unmarked_segments(path or source.KERNEL_FILE).items()},
    hint="part 1 ends where Q's codes and block scales are done; part 2 ends when the score s of token t is final; "
    "part 3 is the rest of the loop body; part 4 is after the loop. A TRACE_ hook or a blank line at the edge "
    "may be in or out.")

WHY_CHOICES = {
    "a": Choice("Q is the same for every token, so it is coded once; each K row was quantized when "
                "written, with its own scale",
                "right: the trace shows segment 1 running once and (nearly) as many K scales as tokens"),
    "b": Choice("Quantizing Q is expensive, so it is done once; K's scale could just as well be "
                "applied once at the end, to the output",
                "no: each token's score is multiplied by its own ks before exp(); a factor that differs per token "
                "cannot be taken out of the sum of exponentials"),
    "c": Choice("The K cache holds float32; the kernel quantizes each K row as it reads it, and "
                "that needs the row's own scale each time",
                "no: K is already int8 in the cache (quantized once, when written); the kernel only reads its stored scale"),
    "d": Choice("Q changes during the scan, because the online rescale multiplies Q by "
                "exp(M_old - M_new) whenever M rises",
                "no: the rescale multiplies S and VKQ, never Q; Q's codes stay fixed for the whole call"),
}


def _why_truth():
    cache, q, kh, scale, out, tr = lesson04_data()
    n_k = len(np.unique(cache.k_scales(kh)))
    right = "a" if tr.n_q_quantized == 1 and n_k > 1 else "b"
    return right, tr.n_q_quantized, n_k, cache.seq_len


def _l06_why(answer):
    right, runs, n_k, T = _why_truth()
    if not isinstance(answer, Mapping):
        answer = {"choice": answer}
    return pick(answer, "choice", WHY_CHOICES, right) + f" (segment 1 ran {runs} time; {n_k} distinct K scales over {T} tokens)"


ex06_b2 = Exercise(
    lesson="06", name="tier_b_why", title="tier B: why Q once, K's scale per token?",
    question="Why is Q quantized only once per call, while K's scale is multiplied in for every token?",
    template={"choice": ...}, check=_l06_why, solution=lambda: {"choice": _why_truth()[0]},
    hint="which of the two depends on the token index t?", choices=WHY_CHOICES)

RESCALE_CHOICES = {
    "a": Choice("the tokens before the last new max, each by exp(M_final - M_t) against the later tokens",
                "right: their terms stayed relative to an older, lower M and were never multiplied by ms; after the "
                "division by the inflated sum, the tokens from the last maximum on all come out too light"),
    "b": Choice("only the tokens that raised M, each by exp(s_t) against the tokens that did not", "no: a token that raises M gets weight exp(0) = 1, as in the intact "
                "kernel; it is everything summed before it that is never shrunk"),
    "c": Choice("the tokens after the last new max, each by exp(M_final - s_t) against the earlier ones", "no: after the last new max M no longer moves, so those "
                "tokens keep the right weights relative to each other; it is the earlier ones that are too heavy"),
    "d": Choice("none of them: the weights keep their ratios, only the final division by S is off", "no: S and VKQ miss the same factors, and the division "
                "does not repair the mix of weights: the output leans toward the past"),
}
RESCALE_SCORES = (0.0, 1.0, 2.0, 3.0)


@functools.lru_cache(maxsize=None)
def _l06_rescale_truth():
    b = debug.break_kernel("no_rescale")
    wrong = debug.kernel_weights(b.ffi, b.lib, RESCALE_SCORES).astype(np.float64)
    right = debug.softmax_weights(RESCALE_SCORES)
    ratio = wrong / right
    last_max = int(np.flatnonzero(np.array(RESCALE_SCORES) == np.maximum.accumulate(RESCALE_SCORES))[-1])
    heavy = np.flatnonzero(ratio > ratio[last_max] * (1 + 1e-4)).tolist()   # relative to the last maximum
    choice = "a" if heavy == list(range(last_max)) else "b"
    return choice, float(wrong[0] / right[0])


def _l06_rescale(answer):
    choice, factor = _l06_rescale_truth()
    msg = pick(answer, "too_heavy", RESCALE_CHOICES, choice)
    f = field_of(answer, "factor_token0", float)
    if not close(f, factor, 0.02):
        raise Wrong(f"{msg}. But token 0's weight is too large by a factor {'larger' if factor > f else 'smaller'} "
                    f"than {f:.3g}: broken weight / right weight, for scores {list(RESCALE_SCORES)}")
    return f"{msg}. Token 0 is {factor:.2f}x too heavy for scores {list(RESCALE_SCORES)}"


ex06_break1 = Exercise(
    lesson="06", name="break_rescale", title="break it: no online rescale",
    question=f"In your copy of the kernel (src = workspace.student_native(); edit src / 'flash_attn_q8_neon.c'), comment "
    "out the two lines that rescale on a new max: S *= ms; and the loop that multiplies VKQ by msv. They are in "
    "segment 3 (the online softmax update: the second half of the article's 段2). Rebuild and load "
    "it with lk.native.load(src_dir=src, verify='crashes'), then read its weights for the scores "
    f"{list(RESCALE_SCORES)} with debug.kernel_weights(ffi, lib, scores). Which tokens get too much weight "
    "(too_heavy: a letter, 'a' to 'd'), and by what factor is token 0's (normalized) weight too large "
    "(factor_token0: a number, broken / right)? Undo the edit afterwards.",
    template={"too_heavy": ..., "factor_token0": ...}, check=_l06_rescale,
    solution=_l06_rescale_truth,
    hint="every score here is a new max, so without the rescale every token keeps weight exp(0) = 1; the right "
    "weights are debug.softmax_weights(scores). If your copy does not build, debug.break_kernel('no_rescale') "
    "makes the same edit in a temporary copy.", choices=RESCALE_CHOICES)

register(__name__, [ex06_a, ex06_b1, ex06_b2, ex06_break1])
