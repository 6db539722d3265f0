"""The exercises of lesson 05: where one head's K fits (the engine's layout), and the extra bytes
per token of each two-pass variant by the model. Lesson 05b's (streaming, time) are in lesson05b."""
from __future__ import annotations

from .. import traffic
from .core import Choice, Exercise, Wrong, close, field_of, pick, register, whole

# Other head sizes than the lesson's 128, so that the lesson's printed tables do not answer them
HD_FIT, HD_EXTRA, NKV = 64, 256, 8


def _fit_truth():
    per = traffic.bytes_per_token(HD_FIT, NKV)["k"]
    return {p: traffic.preset(p).ll.size // per for p in ("a76-l2", "a76")}


def _l05_fit(answer):
    truth = _fit_truth()
    one_head = traffic.bytes_per_token(HD_FIT, 1)["k"]
    for p, key in (("a76-l2", "tokens_512k"), ("a76", "tokens_3m")):
        got = whole(field_of(answer, key), key)
        if abs(got - truth[p]) <= 1:
            continue
        if abs(got - traffic.preset(p).ll.size // one_head) <= 1:
            raise Wrong(f"{key} = {got} counts {one_head} bytes per token, one head alone; with {NKV} heads "
                        f"a token's scale read brings {4 * NKV} bytes of a line, not 4")
        if abs(got - traffic.preset(p).ll.size // (2 * traffic.bytes_per_token(HD_FIT, NKV)["k"])) <= 1:
            raise Wrong(f"{key} = {got} is where K and V together fit; the question asks for K alone")
        raise Wrong(f"{key} = {got} is {'too many' if got > truth[p] else 'too few'} tokens: divide the last "
                    "level's bytes by one head's K row plus its share of the scale lines")
    per = traffic.bytes_per_token(HD_FIT, NKV)["k"]
    return (f"{per} bytes per token: K fits in 512 KiB up to {truth['a76-l2']} tokens and in 3 MiB up to "
            f"{truth['a76']}; beyond, the K-twice variant's second read of K comes from DRAM")


ex1 = Exercise(
    lesson="05", name="k_fits", title="exercise 1: where one head's K fits",
    question=f"The engine interleaves {NKV} kv heads per token (head_dim {HD_FIT}). Up to how many tokens does one "
    "head's K (its rows plus the lines its scales share with the other heads) fit in a last level of 512 KiB, "
    "and of 3 MiB? Whole tokens.",
    template={"tokens_512k": ..., "tokens_3m": ...}, check=_l05_fit,
    solution=lambda: {"tokens_512k": _fit_truth()["a76-l2"], "tokens_3m": _fit_truth()["a76"]},
    hint="traffic.bytes_per_token(64, 8) gives the bytes of lines per token; the preset's ll.size the bytes of "
    "the last level.")


def _extra_truth():
    n = 4096  # any length: the model's bytes grow linearly with the tokens
    single = traffic.model_bytes("single", n, head_dim=HD_EXTRA, n_kv_heads=NKV)["total"]
    return {k: (traffic.model_bytes(v, n, head_dim=HD_EXTRA, n_kv_heads=NKV)["total"] - single) / n
            for k, v in (("k_twice_extra_per_token", "two_pass_recompute"),
                         ("scores_extra_per_token", "two_pass_scores"))}


def _l05_extra(answer):
    truth = _extra_truth()
    got = {k: field_of(answer, k, float) for k in truth}
    k_row, one_head = traffic.bytes_per_token(HD_EXTRA, NKV)["k"], traffic.bytes_per_token(HD_EXTRA, 1)["k"]
    g = got["k_twice_extra_per_token"]
    if not close(g, truth["k_twice_extra_per_token"], 0.01):
        if close(g, one_head, 0.01):
            raise Wrong(f"k_twice_extra_per_token = {g:g} is one head alone; with {NKV} heads interleaved a scale "
                        f"read brings {4 * NKV} bytes of a line")
        if close(g, HD_EXTRA, 0.01):
            raise Wrong(f"k_twice_extra_per_token = {g:g} counts the K row only; the second read of K reads its "
                        "scale again too")
        if close(g, 2 * k_row, 0.01):
            raise Wrong(f"k_twice_extra_per_token = {g:g}: V is not read twice, only K")
        raise Wrong(f"k_twice_extra_per_token = {g:g} is not the second read of one K row and its scale's line share")
    g = got["scores_extra_per_token"]
    if not close(g, truth["scores_extra_per_token"], 0.01):
        if close(g, 4, 0.01):
            raise Wrong("scores_extra_per_token = 4 counts the array once; it is written, read, written and read")
        raise Wrong(f"scores_extra_per_token = {g:g}: count 4 bytes per score for each time the array is touched")
    return (f"{truth['k_twice_extra_per_token']:.0f} bytes per token for K read twice (half of the single pass's "
            f"K + V + scales), {truth['scores_extra_per_token']:.0f} for the score array")


ex2 = Exercise(
    lesson="05", name="extra_bytes", title="exercise 2: the extra bytes of each variant, per token",
    question=f"By the model (no cache reuse), {NKV} kv heads interleaved, head_dim {HD_EXTRA}: how many bytes per token "
    "does each two-pass variant touch beyond the single pass? The K-twice variant, and the stored-scores variant.",
    template={"k_twice_extra_per_token": ..., "scores_extra_per_token": ...}, check=_l05_extra,
    solution=_extra_truth,
    hint="traffic.bytes_per_token(256, 8)['k'] is one K row with its share of the scale lines; the pass code "
    "shows how often the score array is written and read.")

register(__name__, [ex1, ex2])
