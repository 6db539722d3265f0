"""The exercises of lesson 05: where one head's K fits (the engine's layout), and the extra bytes
per token of each two-pass variant by the model. Lesson 05b's (streaming, time) are in lesson05b."""
from __future__ import annotations

from ..lessons import traffic
from ..core.language import N_, _
from .core import Exercise, Field, register

# Other head sizes than the lesson's 128, so that the lesson's printed tables do not answer them
HD_FIT, HD_EXTRA, NKV = 64, 256, 8
LEVELS = {"tokens_512k": "a76-l2", "tokens_3m": "a76"}


def _fit_facts():
    per, one_head = traffic.bytes_per_token(HD_FIT, NKV)["k"], traffic.bytes_per_token(HD_FIT, 1)["k"]
    size = {key: traffic.preset(p).ll.size for key, p in LEVELS.items()}
    return {**{key: s // per for key, s in size.items()}, "per": per, "one_head": one_head, "nkv": NKV,
            "scale_bytes": 4 * NKV, "alone": {key: s // one_head for key, s in size.items()},
            "with_v": {key: s // (2 * per) for key, s in size.items()}}


def _fit_field(key: str) -> Field:
    return Field(int, lambda got, want, **unused: _("{key} = {got} is {got_want} tokens: divide the last level's bytes "
                                               "by one head's K row plus its share of the scale lines").format(
                                               key=key, got=got,
                                               got_want=_('too many') if got > want else _('too few')), atol=1, mistakes=(
        (lambda alone, **unused: alone[key], N_("{key} = {got} counts {one_head} bytes per token, one head alone; with "
                                           "{nkv} heads a token's scale read brings {scale_bytes} bytes of a line, "
                                           "not 4")),
        (lambda with_v, **unused: with_v[key], N_("{key} = {got} is where K and V together fit; the question asks for K "
                                             "alone"))))


ex1 = Exercise(
    "k_fits", N_("exercise 1: where one head's K fits"),
    N_("The engine interleaves {NKV} kv heads per token (head_dim {HD_FIT}). Up to how many tokens does one head's "
       "K (its rows plus the lines its scales share with the other heads) fit in a last level of 512 KiB, and of 3 "
       "MiB? Whole tokens.", NKV=NKV, HD_FIT=HD_FIT),
    facts=_fit_facts, fields={key: _fit_field(key) for key in LEVELS},
    correct=N_("{per} bytes per token: K fits in 512 KiB up to {tokens_512k} tokens and in 3 MiB up to "
               "{tokens_3m}; beyond, the K-twice variant's second read of K comes from DRAM"),
    hint=N_("traffic.bytes_per_token(64, 8) gives the bytes of lines per token; the preset's ll.size the bytes of "
            "the last level."))


def _extra_facts():
    n = 4096  # any length: the model's bytes grow linearly with the tokens
    single = traffic.model_bytes("single", n, head_dim=HD_EXTRA, n_kv_heads=NKV)["total"]
    extra = {k: (traffic.model_bytes(v, n, head_dim=HD_EXTRA, n_kv_heads=NKV)["total"] - single) / n
             for k, v in (("k_twice_extra_per_token", "two_pass_recompute"),
                          ("scores_extra_per_token", "two_pass_scores"))}
    return {**extra, "k_row": traffic.bytes_per_token(HD_EXTRA, NKV)["k"], "nkv": NKV, "scale_bytes": 4 * NKV,
            "one_head": traffic.bytes_per_token(HD_EXTRA, 1)["k"]}


ex2 = Exercise(
    "extra_bytes", N_("exercise 2: the extra bytes of each variant, per token"),
    N_("By the model's count (traffic.model_bytes: every write and read, no cache reuse), one kv head's call, "
       "{NKV} kv heads interleaved, head_dim {HD_EXTRA}: how many bytes per token does each two-pass variant touch "
       "beyond the single pass? The K-twice variant, and the stored-scores "
       "variant.", NKV=NKV, HD_EXTRA=HD_EXTRA),
    facts=_extra_facts,
    fields={"k_twice_extra_per_token": Field(float, N_("k_twice_extra_per_token = {got:g} is not the second read "
                                                       "of one K row and its scale's line share"), rtol=0.01,
                mistakes=((lambda one_head, **unused: one_head, N_("k_twice_extra_per_token = {got:g} is one head "
                        "alone; with {nkv} heads interleaved a scale read brings {scale_bytes} bytes of a line")),
                          (HD_EXTRA, N_("k_twice_extra_per_token = {got:g} counts the K row only; the second read "
                                        "of K reads its scale again too")),
                          (lambda k_row, **unused: 2 * k_row, N_("k_twice_extra_per_token = {got:g}: V is not read "
                                  "twice, only K")))),
            "scores_extra_per_token": Field(float, N_("scores_extra_per_token = {got:g}: count 4 bytes per score "
                                                      "for each time the array is touched"), rtol=0.01, mistakes=((4, N_("scores_extra_per_token = 4 "
                        "counts the array once; it is written, read, written and read")),))},
    correct=N_("{k_twice_extra_per_token:.0f} bytes per token for K read twice (half of the single pass's K + V + "
               "scales), {scores_extra_per_token:.0f} for the score array"),
    hint=N_("traffic.bytes_per_token(256, 8)['k'] is one K row with its share of the scale lines; the pass code "
            "shows how often the score array is written and read."))

register(__name__, [ex1, ex2])
