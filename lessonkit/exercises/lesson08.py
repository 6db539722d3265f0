"""The exercises of lesson 08 (GQA in one scan, split-KV): the KV bytes of one decode step of a GQA
model, a merge of two partial states worked by hand, and when a second thread helps split-KV.
Right answers are computed when the check runs (``traffic.model_bytes``, ``streaming.merge``)."""
from __future__ import annotations

import math

import numpy as np

from .. import traffic
from ..streaming import Partial, merge
from .core import Choice, Exercise, Wrong, close, field_of, pick, register

L08_MODEL = dict(n_layers=36, n_kv_heads=8, group=4, seq_len=32768, head_dim=128)   # Qwen3-8B's config.json


def _layer_truth():
    c = L08_MODEL
    heads = c["n_layers"] * c["n_kv_heads"]
    per = heads * traffic.model_bytes(f"per_head{c['group']}", c["seq_len"], c["head_dim"])["total"]
    grp = heads * traffic.model_bytes(f"group{c['group']}", c["seq_len"], c["head_dim"])["total"]
    return grp / 2**30, per / 2**30       # in the template's order


def _layer(answer):
    grp, per = _layer_truth()
    c = L08_MODEL
    codes_only = c["n_layers"] * c["n_kv_heads"] * c["seq_len"] * 2 * c["head_dim"] / 2**30
    g = field_of(answer, "grouped_gib", float)
    if not close(g, grp, 0.01):
        why = (" (you left out the two 4-byte scales per token)" if close(g, codes_only, 0.01)
               else " (you counted one layer only)" if close(g * c["n_layers"], grp, 0.01) else "")
        raise Wrong(f"grouped_gib = {g:g} is not within 1% of the bytes of 36 layers x 8 kv heads' K, V and scales "
                    f"read once{why}: per token and kv head, hd bytes of K, hd of V, 4 + 4 of scales")
    p = field_of(answer, "per_head_gib", float)
    if not close(p, per, 0.01):
        raise Wrong(f"per_head_gib = {p:g}: each of the 4 query heads of a group reads its kv head's whole KV "
                    f"again, so per-head calls read {per / grp:.0f} times the grouped bytes, not {p / grp:.2g} times")
    return (f"{grp:.2f} GiB with grouped calls, {per:.2f} GiB with per-head calls, for one decode step of the "
            "whole model, when nothing is reused from a cache")


ex08_1 = Exercise(
    lesson="08", name="layer_bytes", title="exercise 1: the KV bytes of one decode step",
    question="Qwen3-8B has 36 layers; each layer has 8 kv heads, each shared by 4 query heads; head_dim 128. "
    "The cache holds 32768 tokens. How many GiB (2**30 bytes) of K, V and scales does one decode step of the "
    "whole model read when nothing is reused from a cache: with one grouped call per kv head, and with one "
    "call per query head? Answer with two numbers (float).",
    template={"grouped_gib": ..., "per_head_gib": ...}, check=_layer,
    solution=_layer_truth,
    hint="traffic.model_bytes('group4', 32768)['total'] is one kv head's bytes for its 4 query heads; "
    "'per_head4' the same for 4 separate calls. Multiply by the 8 kv heads and the 36 layers.")

L08_A = (2.0, 3.0)      # (M, S) of run A
L08_B = (5.0, 1.5)      # (M, S) of run B


def _merge_truth():
    a = Partial(L08_A[0], L08_A[1], np.zeros(1), 1)
    b = Partial(L08_B[0], L08_B[1], np.zeros(1), 1)
    ab = merge(a, b)
    with_empty = merge(ab, Partial(-1e9, 0.0, np.zeros(1), 0))   # the kernel's state of no token
    return ab.M, ab.S, with_empty.S != ab.S


def _merge(answer):
    M, S, changes = _merge_truth()
    m = field_of(answer, "M", float)
    if not close(m, M, 1e-6):
        raise Wrong(f"M = {m:g}: the merged state's M is the larger of the two runs' maxima")
    s = field_of(answer, "S", float)
    if not close(s, S, 1e-4):
        hint = " (you added the two S without moving A's to the new M)" if close(s, L08_A[1] + L08_B[1], 1e-6) else ""
        raise Wrong(f"S = {s:g} is not within 1e-4 relative of S_A * exp(M_A - M) + S_B * exp(M_B - M){hint}")
    c = field_of(answer, "empty_changes_S", bool)
    if c != changes:
        raise Wrong("the empty state (-1e9, 0) has S = 0, and its factor exp(-1e9 - M) is 0 in float64: "
                    "merging it adds nothing" if c else "compare S before and after merging the empty state")
    return f"M = {M:g}, S = 3 * exp(-3) + 1.5 = {S:.6f}; the empty state changes nothing"


ex08_2 = Exercise(
    lesson="08", name="merge_by_hand", title="exercise 2: a merge by hand",
    question=f"Run A's state has M = {L08_A[0]}, S = {L08_A[1]}; run B's has M = {L08_B[0]}, S = {L08_B[1]} "
    "(leave acc out). What are M and S of the merged state of A and B? Then merge the result with the "
    "kernel's state of no token, (M = -1e9, S = 0): does S change?",
    template={"M": ..., "S": ..., "empty_changes_S": ...}, check=_merge,
    solution=_merge_truth,
    hint="M = max(M_A, M_B); S = S_A * exp(M_A - M) + S_B * exp(M_B - M). "
    "Check with streaming.merge(Partial(2.0, 3.0, np.zeros(1), 1), Partial(5.0, 1.5, np.zeros(1), 1)).")

THREADS = {
    "a": Choice("when one core's arithmetic is the limit and a second core is idle",
                "two cores do the same work in about half the time; the merge adds little"),
    "b": Choice("when one core already pulls all the memory bandwidth there is",
                "then a second core waits for the same memory: the bytes per second do not grow"),
    "c": Choice("when the chunks are so short that the merge is most of the work",
                "then the thread start, the wait and the merge cost more than the chunk itself"),
}


def _threads(answer):
    return pick(answer, "choice", THREADS, "a")


ex08_3 = Exercise(
    lesson="08", name="two_threads", title="exercise 3: when does a second thread help?",
    question="Split-KV cuts one query head's tokens into 2 chunks and runs them on 2 threads. When does that "
    "finish the head clearly faster than the same 2 chunks on 1 thread?",
    template={"choice": ...}, check=_threads, solution=lambda: {"choice": "a"}, choices=THREADS,
    hint="Look at the split rows of the timing table at 8K and at 256K, and at the parallel capacity under it.")

register(__name__, [ex08_1, ex08_2, ex08_3])
