"""The exercises of lesson 07 (how precise is q8 KV): codes lost to an outlier, the bytes of two
scale layouts, and which half of the cache to keep in fp16. Every right answer is computed when
the check runs: codes from the C quantizer, bytes from ``precision.bytes_per_row``, errors from
``precision.attend_scheme`` on the fixed-seed data the question names (``l07_protect_data``)."""
from __future__ import annotations

import functools

import numpy as np

from ..lessons import precision
from ..core.language import N_, _
from ..core.quant import quantize_kv_rows
from ..core.reference import attention
from .core import Choice, Exercise, Field, register

L07_OUTLIER = 30.0    # the offset of channel 7 in exercise 1's row, in units of the others' std
L07_CHANNEL = 7


def l07_outlier_row() -> np.ndarray:
    """Exercise 1's K row: 128 standard normal values (seed 7), channel 7 shifted by +30."""
    row = np.random.default_rng(7).standard_normal(128).astype(np.float32)
    row[L07_CHANNEL] += np.float32(L07_OUTLIER)
    return row


@functools.lru_cache(maxsize=None)
def _zero_codes_facts():
    row = l07_outlier_row()
    ordinary = np.delete(np.arange(row.size), L07_CHANNEL)
    engine = quantize_kv_rows(row[None])[0][0]                 # the C quantizer the cache uses
    return {"engine_zero_codes": int(np.sum(engine[ordinary] == 0)),
            "q8_0_zero_codes": int(np.sum(precision.quantize_q8_0(row[None])[0][0][ordinary] == 0))}


ex1 = Exercise(
    "zero_codes", N_("exercise 1: codes lost to one outlier"),
    question=N_("exercises.lesson07.l07_outlier_row() is one K row of 128 values: standard normal, with channel 7 "
                "shifted by +30. Quantize it the engine's way (lessonkit.quant.quantize_kv_rows, one raw max per "
                "row) and llama.cpp's q8_0 way (precision.quantize_q8_0, one scale per 32 values). How many of the "
                "127 ordinary values (every channel except 7) get code 0 in each?"),
    facts=_zero_codes_facts,
    fields={"engine_zero_codes": Field(int, lambda got, want, **unused: _("engine_zero_codes = {got} is too {got_want}: "
            "with one raw max per row, a value gets code 0 when |x| < max|row| / 254 (half a step); count those "
            "among the 127 ordinary values (quantize_kv_rows)").format(
            got=got, got_want=_('low') if got < want else _('high'))),
            "q8_0_zero_codes": Field(int, lambda got, want, **unused: _("q8_0_zero_codes = {got} is too {got_want}: "
                    "with q8_0 only the block of 32 that holds channel 7 has the outlier's step; the other 3 "
                    "blocks use their own max (precision.quantize_q8_0)").format(
                    got=got, got_want=_('low') if got < want else _('high')))},
    correct=N_("{engine_zero_codes} of the 127 ordinary values are lost to code 0 with one scale per row, "
               "{q8_0_zero_codes} with one scale per 32 values: the outlier sets the step only for its own block"),
    hint=N_("codes = quantize_kv_rows(row[None])[0][0]; ordinary = np.delete(np.arange(128), 7); "
            "np.sum(codes[ordinary] == 0). The same with precision.quantize_q8_0(row[None])[0][0]."))


def _bytes_facts():
    same = [hd for hd in range(32, 513, 32)
            if precision.bytes_per_row(hd, "engine") == precision.bytes_per_row(hd, "q8_0")]
    return {"engine_bytes": precision.bytes_per_row(128, "engine"), "q8_0_bytes": precision.bytes_per_row(128, "q8_0"),
            "same_cost_hd": same[0]}


def _same_cost_wrong(got, **unused):
    e_h = precision.bytes_per_row(got, "engine") if got > 0 else "?"
    q_h = precision.bytes_per_row(got, "q8_0") if got > 0 and got % 32 == 0 else "?"
    return _("at hd = {got} the two cost {e_h} and {q_h} bytes: solve hd + 4 = hd + 2 * hd / 32").format(
             got=got, e_h=e_h, q_h=q_h)


ex2 = Exercise(
    "scale_bytes", N_("exercise 2: what a finer scale costs"),
    question=N_("How many bytes does one K row (one token, one kv head) cost at hd = 128 in this engine's layout "
                "(int8 codes, one fp32 raw max) and in q8_0 (int8 codes, one fp16 scale per 32 values)? At which "
                "head dimension (a multiple of 32) do the two cost the same?"),
    facts=_bytes_facts,
    fields={"engine_bytes": Field(int, N_("engine_bytes = {got}: one K row of this engine is hd int8 codes plus "
                                          "one fp32 scale"), mistakes=((128, N_("engine_bytes = {got}: one K "
                        "row of this engine is hd int8 codes plus one fp32 scale (you counted the codes only)")),)),
            "q8_0_bytes": Field(int, N_("q8_0_bytes = {got}: q8_0 stores one fp16 scale (2 bytes) per 32 int8 codes"), mistakes=((128 + 4 * 4, N_("q8_0_bytes = {got}: q8_0 "
                        "stores one fp16 scale (2 bytes) per 32 int8 codes (you counted 4 bytes per scale)")),)),
            "same_cost_hd": Field(int, _same_cost_wrong)},
    correct=N_("{engine_bytes} and {q8_0_bytes} bytes per K row at hd = 128; the two layouts cost the same at hd = "
               "{same_cost_hd}, and q8_0 costs more above it"),
    hint=N_("precision.bytes_per_row(128, 'engine') and precision.bytes_per_row(128, 'q8_0'); then hd + 4 = hd + 2 "
            "* hd / 32."))


def l07_protect_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exercise 3's float32 (Q [16, 128], K, V [2048, 128]), seed 70: K with outlier channels 11, 64, 97 (factor
    20), V standard normal, Q = 2 * normal. ``_protect_data``: median errors with K, or V, in fp16."""
    rng = np.random.default_rng(70)
    K = precision.outlier_rows(2048, 128, rng, channels=(11, 64, 97), factor=20.0)
    V = rng.standard_normal((2048, 128), dtype=np.float32)
    return (2 * rng.standard_normal((16, 128))).astype(np.float32), K, V


@functools.lru_cache(maxsize=None)
def _protect_data():
    Q, K, V = l07_protect_data()
    ref = attention(Q, K, V)
    k16 = float(np.median(precision.rel_error(precision.attend_scheme(Q, K, V, "fp16", v_scheme="engine"), ref)))
    v16 = float(np.median(precision.rel_error(precision.attend_scheme(Q, K, V, "engine", v_scheme="fp16"), ref)))
    return k16, v16


PROTECT = {
    "a": Choice(N_("K in fp16: the outliers set K's step, and a K error moves every weight"),
                N_("keeping K in fp16 removes the coarse step the outlier channels give K's rows")),
    "b": Choice(N_("V in fp16: a V error goes straight into the output, token by token"),
                N_("V here is Gaussian; its q8 step is fine. The outliers are in K")),
    "c": Choice(N_("Either one: both halves add about the same error, so it is a tie"),
                N_("measure both with precision.attend_scheme: the two medians are far apart")),
}


def _protect_facts():
    k16, v16 = _protect_data()
    return {"choice": "a" if k16 < v16 else "b", "k16": k16, "v16": v16}


ex3 = Exercise(
    "protect_half", N_("exercise 3: which half to keep in fp16"),
    question=N_("Q, K, V = exercises.lesson07.l07_protect_data() gives the data: 16 queries, and K and V of 2048 "
                "tokens, K with 3 outlier channels (factor 20), V Gaussian. You may keep either K or V in fp16 (256 "
                "bytes per row at hd = 128), not both; the other one stays in this engine's q8. Which choice gives "
                "the smaller attention error on these data? Measure it with precision.attend_scheme(Q, K, V, "
                "'fp16', v_scheme='engine') and precision.attend_scheme(Q, K, V, 'engine', v_scheme='fp16'), each "
                "against lessonkit.reference.attention(Q, K, V)."),
    facts=_protect_facts, fields={"choice": Field(PROTECT)},
    correct=N_("{why} (median relative error: K in fp16 {k16:.4f}, V in fp16 {v16:.4f})"),
    hint=N_("Q, K, V = exercises.lesson07.l07_protect_data(); then compare the medians of "
            "precision.rel_error(..., lessonkit.reference.attention(Q, K, V)) for the two outputs."))

register(__name__, [ex1, ex2, ex3])
