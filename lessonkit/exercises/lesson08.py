"""The exercises of lesson 08 (GQA in one scan, split-KV): the KV bytes of one decode step of a GQA
model, a merge of two partial states worked by hand, and when a second thread helps split-KV.
Right answers are computed when the check runs (``traffic.model_bytes``, ``streaming.merge``)."""
from __future__ import annotations

import numpy as np

from ..lessons import traffic
from ..core.language import N_, _
from ..lessons.streaming import Partial, merge
from .core import Choice, Exercise, Field, register

L08_MODEL = dict(n_layers=36, n_kv_heads=8, group=4, seq_len=32768, head_dim=128)   # Qwen3-8B's config.json


def _layer_facts():
    c = L08_MODEL
    heads = c["n_layers"] * c["n_kv_heads"]
    grp, per = (heads * traffic.model_bytes(f"{kind}{c['group']}", c["seq_len"], c["head_dim"])["total"] / 2**30
                for kind in ("group", "per_head"))
    return {"grouped_gib": grp, "per_head_gib": per, "times": per / grp,
            "codes_only": heads * c["seq_len"] * 2 * c["head_dim"] / 2**30, "one_layer": grp / c["n_layers"]}


ex1 = Exercise(
    "layer_bytes", N_("exercise 1: the KV bytes of one decode step"),
    question=N_("Qwen3-8B has 36 layers; each layer has 8 kv heads, each shared by 4 query heads; head_dim 128. "
                "The cache holds 32768 tokens. How many GiB (2**30 bytes) of K, V and scales does one decode step "
                "of the whole model read when nothing is reused from a cache: with one grouped call per kv head, "
                "and with one call per query head? Answer with two numbers (float)."),
    facts=_layer_facts,
    fields={"grouped_gib": Field(float, N_("grouped_gib = {got:g} is not within 1% of the bytes of 36 layers x 8 "
                                           "kv heads' K, V and scales read once: per token and kv head, hd bytes "
                                           "of K, hd of V, 4 + 4 of scales"), rtol=0.01, mistakes=(
                (lambda codes_only, **unused: codes_only, N_("grouped_gib = {got:g} is not within 1% of the bytes of 36 "
                                                        "layers x 8 kv heads' K, V and scales read once (you left "
                                                        "out the two 4-byte scales per token): per token and kv "
                                                        "head, hd bytes of K, hd of V, 4 + 4 of scales")),
                (lambda one_layer, **unused: one_layer, N_("grouped_gib = {got:g} is not within 1% of the bytes of 36 "
                                                      "layers x 8 kv heads' K, V and scales read once (you counted "
                                                      "one layer only): per token and kv head, hd bytes of K, hd "
                                                      "of V, 4 + 4 of scales")))),
            "per_head_gib": Field(float, lambda got, grouped_gib, times, **unused: _("per_head_gib = {got:g}: each of "
                    "the 4 query heads of a group reads its kv head's whole KV again, so per-head calls read "
                    "{times:.0f} times the grouped bytes, not {got_grouped_gib:.2g} times").format(
                    got=got, times=times, got_grouped_gib=got / grouped_gib), rtol=0.01)},
    correct=N_("{grouped_gib:.2f} GiB with grouped calls, {per_head_gib:.2f} GiB with per-head calls, for one "
               "decode step of the whole model, when nothing is reused from a cache"),
    hint=N_("traffic.model_bytes('group4', 32768)['total'] is one kv head's bytes for its 4 query heads; "
            "'per_head4' the same for 4 separate calls. Multiply by the 8 kv heads and the 36 layers."))

L08_A = (2.0, 3.0)      # (M, S) of run A
L08_B = (5.0, 1.5)      # (M, S) of run B


def _merge_facts():
    ab = merge(Partial(L08_A[0], L08_A[1], np.zeros(1), 1), Partial(L08_B[0], L08_B[1], np.zeros(1), 1))
    with_empty = merge(ab, Partial(-1e9, 0.0, np.zeros(1), 0))   # the kernel's state of no token
    return {"M": ab.M, "S": ab.S, "empty_changes_S": with_empty.S != ab.S}


ex2 = Exercise(
    "merge_by_hand", N_("exercise 2: a merge by hand"),
    question=N_("Run A's state has M = {l08_a}, S = {l08_a2}; run B's has M = {l08_b}, S = {l08_b2} (leave acc "
                "out). What are M and S of the merged state of A and B? Then merge the result with the kernel's "
                "state of no token, (M = -1e9, S = 0): does S change?", l08_a=L08_A[0], l08_a2=L08_A[1], l08_b=L08_B[0], l08_b2=L08_B[1]),
    facts=_merge_facts,
    fields={"M": Field(float, N_("M = {got:g}: the merged state's M is the larger of the two runs' maxima"), rtol=1e-6),
            "S": Field(float, N_("S = {got:g} is not within 1e-4 relative of S_A * exp(M_A - M) + S_B * exp(M_B - "
                                 "M)"), rtol=1e-4,
                mistakes=((L08_A[1] + L08_B[1], N_("S = {got:g} is not within 1e-4 relative of S_A * exp(M_A - M) "
                                                   "+ S_B * exp(M_B - M) (you added the two S without moving A's "
                                                   "to the new M)")),)),
            "empty_changes_S": Field(bool, (   # (the truth is True, the truth is False)
                N_("compare S before and after merging the empty state"),
                N_("the empty state (-1e9, 0) has S = 0, and its factor exp(-1e9 - M) is 0 in float64: merging it "
                   "adds nothing")))},
    correct=N_("M = {M:g}, S = 3 * exp(-3) + 1.5 = {S:.6f}; the empty state changes nothing"),
    hint=N_("M = max(M_A, M_B); S = S_A * exp(M_A - M) + S_B * exp(M_B - M). Check with "
            "streaming.merge(streaming.Partial(2.0, 3.0, np.zeros(1), 1), "
            "streaming.Partial(5.0, 1.5, np.zeros(1), 1))."))

THREADS = {
    "a": Choice(N_("when one core's arithmetic is the limit and a second core is idle"),
                N_("two cores do the same work in about half the time; the merge adds little when the chunks are long")),
    "b": Choice(N_("when one core already pulls all the memory bandwidth there is"),
                N_("then a second core waits for the same memory: the bytes per second do not grow")),
    "c": Choice(N_("when the chunks are so short that the merge is most of the work"),
                N_("then the thread start, the wait and the merge cost more than the chunk itself")),
}


ex3 = Exercise(
    "two_threads", N_("exercise 3: when does a second thread help?"),
    question=N_("Split-KV cuts one query head's tokens into 2 chunks and runs them on 2 threads. When does that "
                "finish the head clearly faster than the same 2 chunks on 1 thread?"),
    facts={"choice": "a"}, fields={"choice": Field(THREADS)},
    hint=N_("What does each half need to run at the same time as the other: a free core for its arithmetic, or bytes "
            "from the memory both halves read? And what does a split call cost besides the two scans? The two-thread "
            "verdicts of section 3 say what this machine gave; Going further times the parts of a split call."))

register(__name__, [ex1, ex2, ex3])
