"""The exercises of lesson 04."""
from __future__ import annotations

import functools
import shutil

import numpy as np

from .. import debug
from .. import native
from .. import source
from ..validate import short
from .core import (register, MAX_ANSWER_ITEMS, Wrong, items_of, whole, field_of, Exercise, lesson04_data)

def _lines_outside_segments():
    first, last = source.function_lines(debug.KERNEL)
    segs = source.kernel_segments()
    text = source.KERNEL_FILE.read_text().splitlines()
    inside = {n for s in segs.values() for n in range(s.begin, s.end + 1)}
    return {n for n in range(first, last + 1) if n not in inside and text[n - 1].strip()}


def _as_lines(value, n_lines: int) -> set[int]:
    """The line numbers of an answer's numbers and (first, last) ranges, each range cut to the
    file's lines 1..n_lines (lines beyond them count for nothing, so (1, 10**9) builds no billion
    numbers)."""
    out = set()
    for v in items_of({"lines": value}, "lines", MAX_ANSWER_ITEMS):
        if isinstance(v, (tuple, list, range)):
            if len(v) != 2:
                raise Wrong(f"{short(v)}: give a line number or a (first, last) range")
            first, last = whole(v[0], "a range's first line"), whole(v[1], "a range's last line")
            out |= set(range(max(first, 1), min(last, n_lines) + 1))
        else:
            out.add(whole(v, "a line number"))
    return out


def _l04_outside(answer):
    truth = _lines_outside_segments()
    text = source.KERNEL_FILE.read_text().splitlines()
    got = {n for n in _as_lines(field_of(answer, "lines"), len(text)) if 0 < n <= len(text) and text[n - 1].strip()}
    missing, extra = sorted(truth - got), sorted(got - truth)
    if extra:
        raise Wrong(f"lines {extra[:6]}{' ...' if len(extra) > 6 else ''} are inside a segment or outside the function")
    if missing:
        raise Wrong(f"{len(missing)} non-blank line(s) of the function outside every segment are missing, "
                    f"the first at line {missing[0]}")
    return (f"{len(truth)} non-blank lines belong to no segment: the signature and the argument check, the "
            "running state M, S, VKQ and the token loop around segments 2-3, and closing braces")


ex04_1 = Exercise(
    lesson="04", name="outside_segments", title="exercise 1: lines in no segment",
    question="List the lines of flash_attn_single_q_q8_neon that lie in no segment (numbers or (first, last) ranges; "
    "blank lines may be left out).",
    template={"lines": [...]}, check=_l04_outside,
    solution=lambda: {"lines": sorted(_lines_outside_segments())},
    hint="source.function_lines('flash_attn_single_q_q8_neon') and source.kernel_segments(): every line of the "
    "first range that is in none of the second.",
    explain="They belong to the article's parts as follows: the signature and `if (hd ...)` to the call itself, "
    "M/S/VKQ and the token loop to the online softmax (the article's segment 2 declares them).")


def _l04_once_truth():
    cache, q, kh, scale, out, tr = lesson04_data()
    return (len(np.unique(cache.k_scales(kh))), len(np.unique(tr.q_scales)), tr.n_q_quantized,
            cache.seq_len * cache.head_dim)


def _l04_once(answer):
    nk, nq, runs, per_token = _l04_once_truth()
    k = field_of(answer, "distinct_k_scales", int)
    if k != nk:
        raise Wrong(f"np.unique(cache.k_scales(1)) has {'more' if nk > k else 'fewer'} than {k} values")
    qn = field_of(answer, "distinct_q_scales", int)
    if qn != nq:
        raise Wrong(f"trace.q_scales holds {'more' if nq > qn else 'fewer'} than {qn} distinct values")
    c = field_of(answer, "q_code_calls_if_per_token", int)
    if c != per_token:
        raise Wrong(f"not {c}: one q_code per value of Q ({lesson04_data()[0].head_dim}) for every token")
    return (f"{nk} K scales (one per token) against {nq} Q scales; segment 1 ran {runs} time; quantizing Q per "
            f"token would call q_code {per_token} times instead of {lesson04_data()[0].head_dim}")


ex04_2 = Exercise(
    lesson="04", name="once_per_token", title="exercise 2: once versus per token",
    question="Lesson 04's traced call (seed 4, 1000 tokens, kv head 1): how many distinct values does "
    "cache.k_scales(1) hold, how many does trace.q_scales hold, and how many q_code calls would one call "
    "make if Q were quantized inside the token loop?",
    template={"distinct_k_scales": ..., "distinct_q_scales": ..., "q_code_calls_if_per_token": ...}, check=_l04_once,
    solution=lambda: (lambda t: (t[0], t[1], t[3]))(_l04_once_truth()),
    hint="len(np.unique(...)); segment 1 calls q_code once per value of Q.")

FOLD_EDITS = (debug.Edit(source.KERNEL_FILE.name, "qsc[b] = qm * KVQ_INV;", "qsc[b] = qm * KVQ_INV * scale;", 1),
              debug.Edit(source.KERNEL_FILE.name, "s = s * ks * scale;", "s = s * ks;", 2))


@functools.lru_cache(maxsize=None)
def _l04_fold_truth():
    copy = debug.copy_native()
    try:
        changes = [debug.edit_line(copy, e) for e in FOLD_EDITS]
        ffi, lib = native.load(src_dir=copy)
        cache, q, kh, scale, out, tr = lesson04_data()
        folded = debug.trace_with(ffi, lib, q, cache, kh, scale)
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    per_token = next(c for c in changes if c.new.strip().startswith("s ="))
    saved = per_token.old.count("*") - per_token.new.count("*")
    rel = float(np.abs(folded.s - tr.s).max() / np.abs(tr.s).max())
    return saved, bool(rel < 1e-5), rel


def _l04_fold(answer):
    saved, last_bits, rel = _l04_fold_truth()
    s = field_of(answer, "multiplies_saved_per_token", int)
    if s != saved:
        raise Wrong(f"not {s}: compare the per-token line of segment 2 before and after (the per-block line does not change)")
    b = field_of(answer, "scores_change_only_in_last_bits", bool)
    if b != last_bits:
        raise Wrong(f"the folded kernel's scores differ from the original's by at most {rel:.1e} relative")
    return (f"{saved} multiply per token saved; the scores change by at most {rel:.1e} relative: the same "
            "product, rounded in another order")


ex04_3 = Exercise(
    lesson="04", name="fold_scale", title="exercise 3: fold scale into qsc",
    question="Fold the multiply by scale into Q's block scales, in YOUR copy of the kernel (never in "
    "native/).\n"
    "  1. src = workspace.student_native() (from lessonkit import debug, workspace) copies native/ to "
    "my-work/native/.\n"
    "  2. In src / 'flash_attn_q8_neon.c' change segment 1's line to  qsc[b] = qm * KVQ_INV * scale;  and "
    "segment 2's line to  s = s * ks;\n"
    "  3. ffi2, lib2 = lk.native.load(src_dir=src) builds your copy. tr2 = debug.trace_with(ffi2, lib2, q, "
    "cache, kh, scale) runs its traced build on this lesson's q, cache, kh and scale and returns the same "
    "kind of trace as lk.attend(..., trace=True).\n"
    "  multiplies_saved_per_token (a whole number): how many multiplies per token the edit saves.\n"
    "  scores_change_only_in_last_bits (True or False): do the scores tr2.s differ from tr.s by less than "
    "1e-5 relative?\n"
    "(The check makes the same edit in a temporary copy of its own.)",
    template={"multiplies_saved_per_token": ..., "scores_change_only_in_last_bits": ...}, check=_l04_fold,
    solution=_l04_fold_truth,
    hint="the multiply by scale moves from the token loop into segment 1 (4 blocks, once per call); float32 "
    "multiplication is not associative, so (a * b) * c and a * (b * c) may round differently.")

register(__name__, [ex04_1, ex04_2, ex04_3])
