"""The exercises of lesson 01."""
from __future__ import annotations

import functools

import numpy as np

from ..core import header
from ..lessons import rounding
from ..core.language import N_, _
from ..core.quant import quantize_q
from .core import Exercise, Field, kernel_q_codes, register


def l01_predict_q() -> np.ndarray:
    """Lesson 01 exercise 1's query: block 0 is zero except 4 values, the other blocks are zero."""
    q = np.zeros(128, np.float32)
    q[:4] = [1.27, -0.635, 0.005, 0.0149]
    return q


def _predict_facts():
    q = l01_predict_q()
    codes, scales = kernel_q_codes(q)
    ties = rounding.quantize_q_rule(q, "ties_even")[0]
    return {"qsc": float(scales[0]), "codes": [int(c) for c in codes[:4]],
            "ties_even_changes": [i for i in range(4) if ties[i] != codes[i]]}


def _codes_wrong(got, want, **unused):
    if len(got) != 4:
        return _("give the four codes of q[0..3]")
    i = next(i for i in range(4) if got[i] != want[i])
    v = rounding.q_block_scaled(l01_predict_q())[0][i]
    return _("code {i} is not {got_i} (q[{i}] * 127 / qm in float32 is {v:.7f}; the engine adds ±0.5, then "
             "truncates)").format(i=i, got_i=got[i], v=v)


ex1 = Exercise(
    "predict_codes", N_("exercise 1: predict the codes"),
    N_("q = exercises.l01_predict_q(): block 0 is zero except q[0] = 1.27, q[1] = -0.635, q[2] = 0.005, q[3] = "
       "0.0149. Predict qsc[0] and the four codes, then check them in the kernel's trace: `_, tr = lk.attend(q, "
       "cache0, kv_head=0, trace=True)` (any cache of head_dim 128 will do), tr.q_scales and tr.q_codes. Which of "
       "the four codes (indices) would ties-to-even change? Careful: 1.27, -0.635 and 0.005 are not exact in "
       "float32, so whether q_i * iq is exactly k + 0.5 is decided by float32 rounding: compute it in float32. "
       "Fields: qsc is a number; codes is a list of 4 "
       "whole numbers; ties_even_changes is a list of indices (whole numbers), [] if none."),
    facts=_predict_facts, template={"qsc": ..., "codes": [..., ..., ..., ...], "ties_even_changes": [...]},
    fields={"qsc": Field(float, N_("qsc[0] = {got!r} is not the block's step: it is max|q_b| / 127"), rtol=1e-5),
            "codes": Field(tuple, _codes_wrong),
            "ties_even_changes": Field(list, lambda got, want, **unused: _("ties_even_changes is not {got}: in this "
                    "block ties-to-even differs from the engine only where q_i * iq is exactly k + 0.5 in float32 "
                    "and the code away from zero is odd").format(got=got))},
    correct=N_("qsc = {qsc:.6f}, codes {codes}; ties-to-even changes index {ties_even_changes}"),
    hint=N_("work in float32, as the kernel does: iq = np.float32(127) / np.float32(1.27); q is float32 already, "
            "so q[:4] * iq gives the four products, each rounded to float32 (print them with repr). The inputs are "
            "not exact in float32, yet a product can still round to exactly k + 0.5: check each one. Among these "
            "four, ties-to-even differs from the engine only on such an exact k + 0.5 whose code away from zero is "
            "odd."))


def l01_outlier_q() -> tuple[np.ndarray, np.ndarray]:
    """Lesson 01 exercise 2's queries: Gaussian (seed 1), and the same with channel 5 set to
    50 times the RMS of block 0."""
    q = np.random.default_rng(1).standard_normal(128).astype(np.float32)
    q_out = q.copy()
    q_out[5] = np.float32(50 * np.sqrt(np.mean(q[:32].astype(np.float64) ** 2)))
    return q, q_out


def _outlier_facts():
    q, q_out = l01_outlier_q()
    others = [i for i in range(32) if i != 5]
    return {"distinct_with_outlier": len(np.unique(kernel_q_codes(q_out)[0][others])),
            "distinct_without": len(np.unique(kernel_q_codes(q)[0][others])),
            "coarser": float(np.abs(q_out[:32]).max() / np.abs(q[:32]).max())}  # the step is max|block| / 127


ex2 = Exercise(
    "outlier", N_("exercise 2: a 50x outlier"),
    N_("q, q_out = exercises.l01_outlier_q() (q_out has channel 5 at 50 x the RMS of block 0). How many distinct "
       "codes do the other 31 values of block 0 use in the kernel's trace, with and without the outlier? Fields: "
       "two whole numbers."),
    facts=_outlier_facts,
    fields={"distinct_with_outlier": Field(int, lambda got, want, **unused: _("with the outlier the other 31 values of "
            "block 0 use {want_got} than {got} distinct codes (np.unique of the trace's q_codes[:32] without index "
            "5)").format(want_got=_('more') if want > got else _('fewer'), got=got)),
            "distinct_without": Field(int, lambda got, want, **unused: _("without the outlier they use {want_got} than "
                    "{got} distinct codes").format(want_got=_('more') if want > got else _('fewer'), got=got))},
    correct=N_("{distinct_with_outlier} distinct codes with the outlier against {distinct_without} without: the "
               "outlier sets qm, so the step is {coarser:.0f}x coarser for the rest of its block"),
    hint=N_("codes = lk.attend(q_out, cache, 0, trace=True)[1].q_codes; np.unique(np.delete(codes[:32], 5))."))


def l01_per128_queries() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Lesson 01 exercise 3's queries: 12 Gaussian ones (standard deviation 2, as in the lesson) and 12
    with the lesson's outlier channels 5, 6 and 70 (blocks 0 and 2), seed 2."""
    rng = np.random.default_rng(2)
    gaussian = [rng.standard_normal(128).astype(np.float32) * 2 for unused in range(12)]
    return gaussian, [rounding.outlier_q(128, rng, channels=OUTLIER_CHANNELS) for unused in range(12)]


OUTLIER_CHANNELS = (5, 6, 70)
CLEAN_BLOCKS = (1, 3)   # the blocks of 32 without an outlier channel


@functools.lru_cache(maxsize=None)
def _per128_facts():
    hd, qblk = 128, header.constants()["QBLK"]   # QBLK as the kernel's header defines it now
    gaussian, outliers = l01_per128_queries()
    clean = np.zeros(hd, bool)
    for b in CLEAN_BLOCKS:
        clean[b * 32:(b + 1) * 32] = True

    def errors(q):   # (per-32 error from the kernel's own codes and scales, per-128 error), float64 [hd]
        codes, scales = kernel_q_codes(q)
        q64 = q.astype(np.float64)
        qm = np.abs(q).max()
        c128 = rounding.round_codes(q * (np.float32(127) / qm), "engine")
        return (codes * np.repeat(scales.astype(np.float64), 32) - q64, c128 * (float(qm) / 127) - q64)

    def ratio(queries, mask):   # RMS over the pooled values of all queries, per 128 over per 32
        e32, e128 = (np.concatenate([errors(q)[k][mask] for q in queries]) for k in (0, 1))
        return float(np.sqrt(np.mean(e128 ** 2)) / np.sqrt(np.mean(e32 ** 2)))

    # one `s += dot32 * qsc[b]` multiply per block, against one for the whole head
    return {"multiplies_saved_per_token": hd // qblk - 1, "qblk": qblk,
            "ratio_gaussian": ratio(gaussian, np.ones(hd, bool)), "ratio_clean_blocks": ratio(outliers, clean)}


ex3 = Exercise(
    "per128", N_("exercise 3: what one scale per 128 would cost"),
    N_("For head_dim 128, segment 2 does `s += (float)dot32 * qsc[b]` once per block of 32 and token. With one "
       "scale for the whole head (qm = max|q| over all 128 values), the int32 dots could be added first and that "
       "multiply done once per token. (1) How many multiplies per token would that save? (2) What would it cost? "
       "qs_gauss, qs_outlier = exercises.l01_per128_queries() gives 12 Gaussian queries and 12 with outlier "
       "channels 5, 6 and 70 (in blocks 0 and 2). Quantize each query both ways: per 32 as the kernel does "
       "(quantize_q), per 128 with one qm for the whole vector (rounding.round_codes(q * (127 / qm), 'engine')). "
       "Dequantize and give the RMS error against q, per 128 divided by per 32, over the values of all 12 "
       "queries together: for the Gaussian queries over all values, for the outlier queries over blocks 1 and 3 "
       "only (the blocks without an outlier). Fields: a whole number; two ratios (within 5 %)."),
    facts=_per128_facts,
    fields={"multiplies_saved_per_token": Field(int, N_("not {got}: count the float multiplies by qsc[b] per token "
                                                        "in segment 2 (one per block of {qblk}) and how many one "
                                                        "scale for the whole head needs")),
            # 5 %: pooling the values or averaging the per-query ratios differ by about 3 % here
            "ratio_gaussian": Field(float, N_("on the Gaussian queries the per-128 RMS error is not {got} times "
                                              "the per-32 one: dequantize both ways (codes times step), subtract "
                                              "q, and divide the two RMS errors"), rtol=0.05),
            "ratio_clean_blocks": Field(float, N_("in blocks 1 and 3 of the outlier queries the ratio is not "
                                                  "{got}: take the errors of channels 32-63 and 96-127 only, for "
                                                  "both ways of quantizing"), rtol=0.05)},
    correct=N_("{multiplies_saved_per_token} multiplies per token saved, for a Q error {ratio_gaussian:.2f}x larger "
               "on Gaussian queries, but {ratio_clean_blocks:.1f}x larger in the blocks an outlier never touched: "
               "with one scale per head, the outlier sets every value's step. q8_0's 32 keeps that damage inside "
               "its block"),
    hint=N_("segment 2 multiplies by qsc[b] once per block. For the cost: per 32, codes * np.repeat(scales, 32); "
            "per 128, codes * qm / 127; the error is that minus q; pool the 12 queries' errors (np.concatenate) "
            "before taking the RMS."))

register(__name__, [ex1, ex2, ex3])
