"""The exercises of lesson 01."""
from __future__ import annotations

import functools

import numpy as np

from .. import header, rounding
from ..language import Text, tr
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


def _codes_wrong(got, want, **_):
    if len(got) != 4:
        return tr("give the four codes of q[0..3]", "请给出 q[0..3] 的四个编码")
    i = next(i for i in range(4) if got[i] != want[i])
    v = rounding.q_block_scaled(l01_predict_q())[0][i]
    return tr(f"code {i} is not {got[i]} (q[{i}] * 127 / qm in float32 is {v:.7f}; the engine adds ±0.5, then "
              "truncates)",
              f"编码 {i} 不是 {got[i]}（在 float32 里 q[{i}] * 127 / qm 等于 {v:.7f}；引擎先加 ±0.5，再截断）")


ex1 = Exercise(
    "predict_codes", Text("exercise 1: predict the codes", "练习 1：预测编码"),
    Text("q = exercises.l01_predict_q(): block 0 is zero except q[0] = 1.27, q[1] = -0.635, q[2] = 0.005, "
         "q[3] = 0.0149. Predict qsc[0] and the four codes, then check them in the kernel's trace: "
         "`_, tr = lk.attend(q, cache0, kv_head=0, trace=True)` (any cache of head_dim 128 will do), tr.q_scales "
         "and tr.q_codes. Which of the four codes (indices) would ties-to-even change? Careful: 1.27 and -0.635 "
         "are not exact in float32, so q_i * iq may land just off k + 0.5; compute it in float32. Fields: qsc is a "
         "number; codes is a list of 4 whole numbers; ties_even_changes is a list of indices (whole numbers), "
         "[] if none.",
         "q = exercises.l01_predict_q()：块 0 除了 q[0] = 1.27、q[1] = -0.635、q[2] = 0.005、q[3] = 0.0149 之外全是 0。"
         "预测 qsc[0] 和这四个编码，再到内核的跟踪里核对："
         "`_, tr = lk.attend(q, cache0, kv_head=0, trace=True)`（任何 head_dim 为 128 的缓存都行），看 tr.q_scales "
         "和 tr.q_codes。如果改用 ties-to-even（四舍六入五成双），四个编码中哪几个（下标）会变？注意：1.27 和 -0.635 "
         "在 float32 里不是精确值，所以 q_i * iq 可能落在 k + 0.5 旁边一点点；请用 float32 计算。"
         "字段：qsc 是一个数；codes 是 4 个整数的列表；ties_even_changes 是下标（整数）的列表，没有就写 []。"),
    facts=_predict_facts, template={"qsc": ..., "codes": [..., ..., ..., ...], "ties_even_changes": [...]},
    fields={"qsc": Field(float, Text("qsc[0] = {got!r} is not the block's step: it is max|q_b| / 127",
                                     "qsc[0] = {got!r} 不是这一块的步长：步长是 max|q_b| / 127"), rtol=1e-5),
            "codes": Field(tuple, _codes_wrong),
            "ties_even_changes": Field(list, lambda got, want, **_: tr(
                f"ties-to-even changes the codes at indices {want if want else 'none'}, not {got}: it differs from "
                "the engine only on an exact .5",
                f"四舍六入五成双（ties-to-even）改变的是下标 {want if want else '（没有）'} 处的编码，不是 {got}："
                "它只在恰好是 .5 时才与引擎规则不同"))},
    correct=Text("qsc = {qsc:.6f}, codes {codes}; ties-to-even changes index {ties_even_changes}",
                 "qsc = {qsc:.6f}，编码 {codes}；四舍六入五成双改变下标 {ties_even_changes}"),
    hint=Text("127 / 1.27 in float32 is not exactly 100: compute np.float32(127) / np.float32(1.27) and multiply. "
              "A value landing on k + 0.5 exactly is where the rules differ.",
              "在 float32 里 127 / 1.27 不正好是 100：先算 np.float32(127) / np.float32(1.27)，再相乘。"
              "值正好落在 k + 0.5 上，才是两种规则不同的地方。"))


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
    "outlier", Text("exercise 2: a 50x outlier", "练习 2：一个 50 倍的离群值"),
    Text("q, q_out = exercises.l01_outlier_q() (q_out has channel 5 at 50 x the RMS of block 0). How many "
         "distinct codes do the other 31 values of block 0 use in the kernel's trace, with and without the outlier? "
         "Fields: two whole numbers.",
         "q, q_out = exercises.l01_outlier_q()（q_out 的通道 5 是块 0 RMS 的 50 倍）。在内核的跟踪里，"
         "有离群值和没有离群值时，块 0 其他 31 个值各用到多少个不同的编码？字段：两个整数。"),
    facts=_outlier_facts,
    fields={"distinct_with_outlier": Field(int, lambda got, want, **_: tr(
                f"with the outlier the other 31 values of block 0 use {'more' if want > got else 'fewer'} than {got} "
                "distinct codes (np.unique of the trace's q_codes[:32] without index 5)",
                f"有离群值时，块 0 其他 31 个值用到的不同编码{'多于' if want > got else '少于'} {got} 个"
                "（对跟踪里的 q_codes[:32] 去掉下标 5，再用 np.unique）")),
            "distinct_without": Field(int, lambda got, want, **_: tr(
                f"without the outlier they use {'more' if want > got else 'fewer'} than {got} distinct codes",
                f"没有离群值时，它们用到的不同编码{'多于' if want > got else '少于'} {got} 个"))},
    correct=Text("{distinct_with_outlier} distinct codes with the outlier against {distinct_without} without: the "
                 "outlier sets qm, so the step is about 50x coarser for the rest of its block",
                 "有离群值时 {distinct_with_outlier} 个不同编码，没有时 {distinct_without} 个：qm 由离群值决定，"
                 "所以对这一块其余的值来说，步长粗了大约 50 倍"),
    hint=Text("codes = lk.attend(q_out, cache, 0, trace=True)[1].q_codes; np.unique(np.delete(codes[:32], 5)).",
              "codes = lk.attend(q_out, cache, 0, trace=True)[1].q_codes；再看 np.unique(np.delete(codes[:32], 5))。"))


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
    "per128", Text("exercise 3: why not per 128?", "练习 3：为什么不每 128 个值一块？"),
    Text("For head_dim 128, segment 2 does `s += (float)dot32 * qsc[b]` once per block of 32 and token. "
         "With one scale for all 128 values, the int32 dots could be added first and that multiply done once per "
         "token. How many multiplies per token does that save? On lesson 01's outlier queries (rounding.outlier_q), "
         "which gives the larger RMS error of the dequantized Q: one scale per 128 ('per128') or per 32 ('per32')? "
         "Fields: a whole number; the text 'per128' or 'per32'.",
         "head_dim 为 128 时，segment 2（打分）对每个 32 个值的块、每个 token 做一次 `s += (float)dot32 * qsc[b]`。"
         "如果 128 个值只用一个 scale，就可以先把 int32 点积加起来，每个 token 只做一次这个乘法。"
         "这样每个 token 省下几次乘法？在第 01 课带离群值的 query（rounding.outlier_q）上，哪一种让反量化后的 Q "
         "RMS 误差更大：每 128 个值一个 scale（'per128'），还是每 32 个值一个（'per32'）？"
         "字段：一个整数；文本 'per128' 或 'per32'。"),
    facts=_per128_facts,
    fields={"multiplies_saved_per_token": Field(int, Text(
                "not {got}: count the float multiplies by qsc[b] per token in segment 2 (one per block of {qblk}) and "
                "how many one scale for the whole head needs",
                "不是 {got}：数一数 segment 2 里每个 token 乘 qsc[b] 的浮点乘法有几次（每 {qblk} 个值一块，每块一次），"
                "再数整个头只用一个 scale 时要几次")),
            "larger_q_error": Field({"per128": "per128", "per32": "per32"}, Text(
                "measure it: on the outlier queries, the RMS error of the dequantized Q is larger with {want}",
                "测一下：在带离群值的 query 上，反量化后 Q 的 RMS 误差是 {want} 更大"))},
    correct=Text("{multiplies_saved_per_token} multiplies per token saved, for an RMS error of Q {ratio:.1f}x larger "
                 "on outlier queries: q8_0's 32 keeps an outlier's damage inside its block",
                 "每个 token 省下 {multiplies_saved_per_token} 次乘法，代价是在带离群值的 query 上 Q 的 RMS 误差大 "
                 "{ratio:.1f} 倍：q8_0 每 32 个值一块，把离群值的伤害关在它自己那一块里"),
    hint=Text("segment 2 does s += dot32 * qsc[b] once per block; with one block the int32 dots could be summed "
              "first. For the error: codes * step - q, RMS, with qm over the whole vector.",
              "segment 2 每块做一次 s += dot32 * qsc[b]；如果只有一块，int32 点积可以先求和。"
              "误差：算 codes * step - q 的 RMS，其中 qm 取整个向量的最大值。"))

register(__name__, [ex1, ex2, ex3])
