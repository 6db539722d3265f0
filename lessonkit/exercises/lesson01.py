"""The exercises of lesson 01."""
from __future__ import annotations

import functools

import numpy as np

from .. import rounding
from .. import header
from ..quant import quantize_q
from .core import (register, Wrong, items_of, whole, field_of, close, Exercise, kernel_q_codes)

def l01_predict_q() -> np.ndarray:
    """Lesson 01 exercise 1's query: block 0 is zero except 4 values, the other blocks are zero."""
    q = np.zeros(128, np.float32)
    q[:4] = [1.27, -0.635, 0.005, 0.0149]
    return q


def _l01_predict_truth():
    q = l01_predict_q()
    codes, scales = kernel_q_codes(q)
    ties = rounding.quantize_q_rule(q, "ties_even")[0]
    return float(scales[0]), [int(c) for c in codes[:4]], [i for i in range(4) if ties[i] != codes[i]]


def _l01_predict(answer):
    qsc, codes, ties = _l01_predict_truth()
    got = field_of(answer, "qsc", float)
    if not close(got, qsc, 1e-5):
        raise Wrong(f"qsc[0] = {got!r} is not the block's step: it is max|q_b| / 127")
    got_codes = [whole(c, "a code") for c in items_of(answer, "codes", 64)]
    if len(got_codes) != 4:
        raise Wrong("give the four codes of q[0..3]")
    wrong = [i for i in range(4) if got_codes[i] != codes[i]]
    if wrong:
        i = wrong[0]
        raise Wrong(f"code {i} is not {got_codes[i]} (q[{i}] * 127 / qm in float32 is "
                    f"{rounding.q_block_scaled(l01_predict_q())[0][i]:.7f}; the engine adds ±0.5, then truncates)")
    got_ties = sorted(whole(t, "an index") for t in items_of(answer, "ties_even_changes", 64))
    if got_ties != ties:
        raise Wrong(f"ties-to-even changes the codes at indices {ties if ties else 'none'}, not {got_ties}: "
                    "it differs from the engine only on an exact .5")
    return f"qsc = {qsc:.6f}, codes {codes}; ties-to-even changes index {ties}"


ex01_1 = Exercise(
    lesson="01", name="predict_codes", title="exercise 1: predict the codes",
    question="q = exercises.l01_predict_q(): block 0 is zero except q[0] = 1.27, q[1] = -0.635, q[2] = 0.005, "
    "q[3] = 0.0149. Predict qsc[0] and the four codes, then check them in the kernel's trace: "
    "`_, tr = lk.attend(q, cache0, kv_head=0, trace=True)` (any cache of head_dim 128 will do), tr.q_scales "
    "and tr.q_codes. Which of the four codes (indices) would ties-to-even change? Careful: 1.27 and -0.635 "
    "are not exact in float32, so q_i * iq may land just off k + 0.5; compute it in float32. Fields: qsc is a "
    "number; codes is a list of 4 whole numbers; ties_even_changes is a list of indices (whole numbers), "
    "[] if none.",
    template={"qsc": ..., "codes": [..., ..., ..., ...], "ties_even_changes": [...]}, check=_l01_predict,
    solution=_l01_predict_truth,
    hint="127 / 1.27 in float32 is not exactly 100: compute np.float32(127) / np.float32(1.27) and multiply. "
    "A value landing on k + 0.5 exactly is where the rules differ.")


def l01_outlier_q() -> tuple[np.ndarray, np.ndarray]:
    """Lesson 01 exercise 2's queries: Gaussian (seed 1), and the same with channel 5 set to
    50 times the RMS of block 0."""
    q = np.random.default_rng(1).standard_normal(128).astype(np.float32)
    q_out = q.copy()
    q_out[5] = np.float32(50 * np.sqrt(np.mean(q[:32].astype(np.float64) ** 2)))
    return q, q_out


def _l01_outlier_truth():
    q, q_out = l01_outlier_q()
    others = [i for i in range(32) if i != 5]
    with_o = len(np.unique(kernel_q_codes(q_out)[0][others]))
    without = len(np.unique(kernel_q_codes(q)[0][others]))
    return with_o, without


def _l01_outlier(answer):
    with_o, without = _l01_outlier_truth()
    a = field_of(answer, "distinct_with_outlier", int)
    b = field_of(answer, "distinct_without", int)
    if a != with_o:
        raise Wrong(f"with the outlier the other 31 values of block 0 use {'more' if with_o > a else 'fewer'} "
                    f"than {a} distinct codes (np.unique of the trace's q_codes[:32] without index 5)")
    if b != without:
        raise Wrong(f"without the outlier they use {'more' if without > b else 'fewer'} than {b} distinct codes")
    return (f"{with_o} distinct codes with the outlier against {without} without: the outlier sets qm, "
            "so the step is about 50x coarser for the rest of its block")


ex01_2 = Exercise(
    lesson="01", name="outlier", title="exercise 2: a 50x outlier",
    question="q, q_out = exercises.l01_outlier_q() (q_out has channel 5 at 50 x the RMS of block 0). How many "
    "distinct codes do the other 31 values of block 0 use in the kernel's trace, with and without the outlier? "
    "Fields: two whole numbers.",
    template={"distinct_with_outlier": ..., "distinct_without": ...}, check=_l01_outlier,
    solution=_l01_outlier_truth,
    hint="codes = lk.attend(q_out, cache, 0, trace=True)[1].q_codes; np.unique(np.delete(codes[:32], 5)).")


def _qblk() -> int:
    """QBLK as the kernel's header defines it now (``#define QBLK 32``), read from the file."""
    return header.constants()["QBLK"]


@functools.lru_cache(maxsize=None)
def _l01_per128_truth():
    hd = 128
    saved = hd // _qblk() - 1   # one `s += dot32 * qsc[b]` multiply per block, against one for the whole head
    err32, err128 = [], []
    for seed in range(6):
        q = rounding.outlier_q(hd, np.random.default_rng(100 + seed))
        codes, sc = quantize_q(q)
        err32.append(np.sqrt(np.mean((codes * np.repeat(sc, 32) - q) ** 2)))
        qm = np.abs(q).max()
        c128 = rounding.round_codes(q * np.float32(127 / qm), "engine")
        err128.append(np.sqrt(np.mean((c128 * (qm / 127) - q) ** 2)))
    return saved, "per128" if np.mean(err128) > np.mean(err32) else "per32", float(np.mean(err128) / np.mean(err32))


def _l01_per128(answer):
    saved, worse, ratio = _l01_per128_truth()
    got = field_of(answer, "multiplies_saved_per_token", int)
    if got != saved:
        raise Wrong(f"not {got}: count the float multiplies by qsc[b] per token in segment 2 (one per block of "
                    f"{_qblk()}) and how many one scale for the whole head needs")
    w = str(field_of(answer, "larger_q_error")).replace("-", "").replace(" ", "").lower()
    if w not in ("per128", "per32"):
        raise Wrong("'larger_q_error' is 'per128' or 'per32'")
    if w != worse:
        raise Wrong(f"measure it: on the outlier queries, the RMS error of the dequantized Q is larger with {worse}")
    return (f"{saved} multiplies per token saved, for an RMS error of Q {ratio:.1f}x larger on outlier queries: "
            "q8_0's 32 keeps an outlier's damage inside its block")


ex01_3 = Exercise(
    lesson="01", name="per128", title="exercise 3: why not per 128?",
    question="For head_dim 128, segment 2 does `s += (float)dot32 * qsc[b]` once per block of 32 and token. "
    "With one scale for all 128 values, the int32 dots could be added first and that "
    "multiply done once per token. How many multiplies per token does that save? On lesson 01's outlier queries (rounding.outlier_q), which gives the larger RMS error of the "
    "dequantized Q: one scale per 128 ('per128') or per 32 ('per32')? Fields: a whole number; the text "
    "'per128' or 'per32'.",
    template={"multiplies_saved_per_token": ..., "larger_q_error": ...}, check=_l01_per128,
    solution=_l01_per128_truth,
    hint="segment 2 does s += dot32 * qsc[b] once per block; with one block the int32 dots could be summed "
    "first. For the error: codes * step - q, RMS, with qm over the whole vector.")

register(__name__, [ex01_1, ex01_2, ex01_3])
