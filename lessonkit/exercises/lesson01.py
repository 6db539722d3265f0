"""The exercises of lesson 01."""
from __future__ import annotations

import functools

import numpy as np

from .. import header, rounding
from ..language import N_, _
from ..quant import quantize_q
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
       "the four codes (indices) would ties-to-even change? Careful: 1.27 and -0.635 are not exact in float32, so "
       "q_i * iq may land just off k + 0.5; compute it in float32. Fields: qsc is a number; codes is a list of 4 "
       "whole numbers; ties_even_changes is a list of indices (whole numbers), [] if none."),
    facts=_predict_facts, template={"qsc": ..., "codes": [..., ..., ..., ...], "ties_even_changes": [...]},
    fields={"qsc": Field(float, N_("qsc[0] = {got!r} is not the block's step: it is max|q_b| / 127"), rtol=1e-5),
            "codes": Field(tuple, _codes_wrong),
            "ties_even_changes": Field(list, lambda got, want, **unused: _("ties-to-even changes the codes at indices "
                    "{want}, not {got}: it differs from the engine only on an exact .5").format(
                    want=want if want else _('none'), got=got))},
    correct=N_("qsc = {qsc:.6f}, codes {codes}; ties-to-even changes index {ties_even_changes}"),
    hint=N_("127 / 1.27 in float32 is not exactly 100: compute np.float32(127) / np.float32(1.27) and multiply. A "
            "value landing on k + 0.5 exactly is where the rules differ."))


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
            "distinct_without": len(np.unique(kernel_q_codes(q)[0][others]))}


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
               "outlier sets qm, so the step is about 50x coarser for the rest of its block"),
    hint=N_("codes = lk.attend(q_out, cache, 0, trace=True)[1].q_codes; np.unique(np.delete(codes[:32], 5))."))


@functools.lru_cache(maxsize=None)
def _per128_facts():
    hd, qblk = 128, header.constants()["QBLK"]   # QBLK as the kernel's header defines it now
    err32, err128 = [], []
    for seed in range(6):
        q = rounding.outlier_q(hd, np.random.default_rng(100 + seed))
        codes, sc = quantize_q(q)
        err32.append(np.sqrt(np.mean((codes * np.repeat(sc, 32) - q) ** 2)))
        qm = np.abs(q).max()
        c128 = rounding.round_codes(q * np.float32(127 / qm), "engine")
        err128.append(np.sqrt(np.mean((c128 * (qm / 127) - q) ** 2)))
    # one `s += dot32 * qsc[b]` multiply per block, against one for the whole head
    return {"multiplies_saved_per_token": hd // qblk - 1, "qblk": qblk,
            "ratio": float(np.mean(err128) / np.mean(err32)),
            "larger_q_error": "per128" if np.mean(err128) > np.mean(err32) else "per32"}


ex3 = Exercise(
    "per128", N_("exercise 3: why not per 128?"),
    N_("For head_dim 128, segment 2 does `s += (float)dot32 * qsc[b]` once per block of 32 and token. With one "
       "scale for all 128 values, the int32 dots could be added first and that multiply done once per token. How "
       "many multiplies per token does that save? On lesson 01's outlier queries (rounding.outlier_q), which gives "
       "the larger RMS error of the dequantized Q: one scale per 128 ('per128') or per 32 ('per32')? Fields: a "
       "whole number; the text 'per128' or 'per32'."),
    facts=_per128_facts,
    fields={"multiplies_saved_per_token": Field(int, N_("not {got}: count the float multiplies by qsc[b] per token "
                                                        "in segment 2 (one per block of {qblk}) and how many one "
                                                        "scale for the whole head needs")),
            "larger_q_error": Field({"per128": "per128", "per32": "per32"}, N_("measure it: on the outlier "
                    "queries, the RMS error of the dequantized Q is larger with {want}"))},
    correct=N_("{multiplies_saved_per_token} multiplies per token saved, for an RMS error of Q {ratio:.1f}x larger "
               "on outlier queries: q8_0's 32 keeps an outlier's damage inside its block"),
    hint=N_("segment 2 does s += dot32 * qsc[b] once per block; with one block the int32 dots could be summed "
            "first. For the error: codes * step - q, RMS, with qm over the whole vector."))

register(__name__, [ex1, ex2, ex3])
