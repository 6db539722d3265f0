"""The exercises of lesson 04."""
from __future__ import annotations

import functools
import shutil

import numpy as np

from ..lessons import kernel_copy
from ..core import native
from ..display import source
from ..core.language import N_, _
from ..core.validate import short
from .core import MAX_ANSWER_ITEMS, Exercise, Field, Wrong, items_of, lesson04_data, register, whole


def _outside_facts():
    first, last = source.function_lines(kernel_copy.KERNEL)
    text = source.KERNEL_FILE.read_text().splitlines()
    inside = {n for s in source.kernel_segments().values() for n in range(s.begin, s.end + 1)}
    return {"lines": sorted(n for n in range(first, last + 1) if n not in inside and text[n - 1].strip()),
            "text": text}


def _outside(answer, facts):
    """Line numbers and (first, last) ranges, each range cut to the file's lines (lines beyond them
    count for nothing, so (1, 10**9) builds no billion numbers); blank lines are ignored."""
    text, got = facts["text"], set()
    for v in items_of(answer, "lines", MAX_ANSWER_ITEMS):
        if isinstance(v, (tuple, list, range)):
            if len(v) != 2:
                raise Wrong(_("{short_v}: give a line number or a (first, last) range").format(short_v=short(v)))
            first = whole(v[0], _("a range's first line"))
            last = whole(v[1], _("a range's last line"))
            got |= set(range(max(first, 1), min(last, len(text)) + 1))
        else:
            got.add(whole(v, _("a line number")))
    got = {n for n in got if 0 < n <= len(text) and text[n - 1].strip()}
    missing, extra = sorted(set(facts["lines"]) - got), sorted(got - set(facts["lines"]))
    if extra:
        more = " ..." if len(extra) > 6 else ""
        raise Wrong(_("lines {extra}{more} are inside a segment or outside the function").format(
                      extra=extra[:6], more=more))
    if missing:
        raise Wrong(_("{missing} non-blank line(s) of the function outside every segment are missing, the first at "
                      "line {missing2}").format(missing=len(missing), missing2=missing[0]))
    n = len(facts["lines"])
    return _("{n} non-blank lines belong to no segment: the signature and the argument check, the running state M, "
             "S, VKQ and the token loop around segments 2-3, and closing braces").format(n=n)


ex1 = Exercise(
    "outside_segments", N_("exercise 1: lines in no segment"),
    N_("List the lines of flash_attn_single_q_q8_neon that lie in no segment (numbers or (first, last) ranges; "
       "blank lines may be left out). Section 2's listings print every line of the function with its number."),
    facts=_outside_facts, template={"lines": [...]}, check=_outside,
    hint=N_("source.function_lines('flash_attn_single_q_q8_neon') and source.kernel_segments(): every line of the "
            "first range that is in none of the second."),
    explain=N_("They belong to the article's parts as follows: the signature and `if (hd ...)` to the call itself, "
               "M/S/VKQ and the token loop to the online softmax (the article's 段2 declares them)."))


def _once_facts():
    cache, q, kh, scale, out, trace = lesson04_data()
    return {"distinct_k_scales": len(np.unique(cache.k_scales(kh))),
            "distinct_q_scales": len(np.unique(trace.q_scales)),
            "runs": trace.n_q_quantized, "q_code_calls_if_per_token": cache.seq_len * cache.head_dim,
            "hd": cache.head_dim}


ex2 = Exercise(
    "once_per_token", N_("exercise 2: once versus per token"),
    N_("Lesson 04's traced call (seed 4, 1000 tokens, kv head 1): how many distinct values does cache.k_scales(1) "
       "hold, how many does trace.q_scales hold, and how many q_code calls would one call make if Q were quantized "
       "inside the token loop?"),
    facts=_once_facts,
    fields={"distinct_k_scales": Field(int, lambda got, want, **unused: _("np.unique(cache.k_scales(1)) has {want_got} "
            "than {got} values").format(want_got=_('more') if want > got else _('fewer'), got=got)),
            "distinct_q_scales": Field(int, lambda got, want, **unused: _("trace.q_scales holds {want_got} than {got} "
                    "distinct values").format(want_got=_('more') if want > got else _('fewer'), got=got)),
            "q_code_calls_if_per_token": Field(int, N_("not {got}: one q_code per value of Q ({hd}) for every token"))},
    correct=N_("{distinct_k_scales} K scales (one per token) against {distinct_q_scales} Q scales; segment 1 ran "
               "{runs} time; quantizing Q per token would call q_code {q_code_calls_if_per_token} times instead of "
               "{hd}"),
    hint=N_("len(np.unique(...)); segment 1 calls q_code once per value of Q."))

FOLD_EDITS = (kernel_copy.Edit(source.KERNEL_FILE.name, "qsc[b] = qm * KVQ_INV;", "qsc[b] = qm * KVQ_INV * scale;", 1),
              kernel_copy.Edit(source.KERNEL_FILE.name, "s = s * ks * scale;", "s = s * ks;", 2))


@functools.lru_cache(maxsize=None)
def _fold_facts():
    copy = kernel_copy.copy_native()
    try:
        changes = [kernel_copy.edit_line(copy, e) for e in FOLD_EDITS]
        ffi, lib = native.load(src_dir=copy)
        cache, q, kh, scale, out, trace = lesson04_data()
        folded = kernel_copy.trace_with(ffi, lib, q, cache, kh, scale)
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    per_token = next(c for c in changes if c.new.strip().startswith("s ="))
    rel = float(np.abs(folded.s - trace.s).max() / np.abs(trace.s).max())
    return {"multiplies_saved_per_token": per_token.old.count("*") - per_token.new.count("*"),
            "scores_change_only_in_last_bits": bool(rel < 1e-5), "rel": rel}


ex3 = Exercise(
    "fold_scale", N_("exercise 3: fold scale into qsc"),
    N_("Fold the multiply by scale into Q's block scales, in YOUR copy of the kernel (never in native/).\n  1. src "
       "= workspace.student_native() (from lessonkit import debug, workspace) copies native/ to my-work/native/.\n "
       " 2. In src / 'flash_attn_q8_neon.c' change segment 1's line to  qsc[b] = qm * KVQ_INV * scale;  and "
       "segment 2's line to  s = s * ks;\n  3. ffi2, lib2 = lk.native.load(src_dir=src) builds your copy. tr2 = "
       "debug.trace_with(ffi2, lib2, q, cache, kh, scale) runs its traced build on this lesson's q, cache, kh and "
       "scale and returns the same kind of trace as lk.attend(..., trace=True).\n  multiplies_saved_per_token (a "
       "whole number): how many multiplies per token the edit saves.\n  scores_change_only_in_last_bits (True or "
       "False): do the scores tr2.s differ from tr.s by less than 1e-5 of max|tr.s|?\n(The check makes the same edit "
       "in a temporary copy of its own.)"),
    facts=_fold_facts,
    fields={"multiplies_saved_per_token": Field(int, N_("not {got}: compare the per-token line of segment 2 before "
                                                        "and after (the per-block line does not change)")),
            "scores_change_only_in_last_bits": Field(bool, N_("the folded kernel's scores differ from the "
                    "original's by at most {rel:.1e} relative"))},
    correct=N_("{multiplies_saved_per_token} multiply per token saved; the scores change by at most {rel:.1e} "
               "relative: the same product, rounded in another order"),
    hint=N_("the multiply by scale moves from the token loop into segment 1 (4 blocks, once per call); float32 "
            "multiplication is not associative, so (a * b) * c and a * (b * c) may round differently."))

register(__name__, [ex1, ex2, ex3])
