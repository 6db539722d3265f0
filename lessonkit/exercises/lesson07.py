"""The exercises of lesson 07 (how precise is q8 KV): codes lost to an outlier, the bytes of two
scale layouts, and which half of the cache to keep in fp16. Every right answer is computed when
the check runs: codes from the C quantizer, bytes from ``precision.bytes_per_row``, errors from
``precision.attend_scheme`` on fixed-seed data."""
from __future__ import annotations

import functools

import numpy as np

from .. import precision
from ..quant import quantize_kv_rows
from ..reference import attention
from ..language import Text, tr
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
    "zero_codes", Text("exercise 1: codes lost to one outlier", "练习 1：一个离群值吃掉多少编码"),
    question=Text(
        "exercises.lesson07.l07_outlier_row() is one K row of 128 values: standard normal, with channel 7 "
        "shifted by +30. Quantize it the engine's way (lessonkit.quant.quantize_kv_rows, one raw max per row) and "
        "llama.cpp's q8_0 way (precision.quantize_q8_0, one scale per 32 values). How many of the 127 ordinary "
        "values (every channel except 7) get code 0 in each?",
        "exercises.lesson07.l07_outlier_row() 是一行 K，共 128 个值：标准正态分布，通道 7 加了 +30。"
        "分别按本引擎的方式（lessonkit.quant.quantize_kv_rows，每行一个原始最大值）和 llama.cpp 的 q8_0 方式"
        "（precision.quantize_q8_0，每 32 个值一个 scale）量化它。两种方式下，127 个普通值（除通道 7 外的全部通道）"
        "各有多少个得到编码 0？"),
    facts=_zero_codes_facts,
    fields={"engine_zero_codes": Field(int, lambda got, want, **_: tr(
                f"engine_zero_codes = {got} is too {'low' if got < want else 'high'}: with one raw max per row, a "
                "value gets code 0 when |x| < max|row| / 254 (half a step); count those among the 127 ordinary values "
                "(quantize_kv_rows)",
                f"engine_zero_codes = {got} 偏{'小' if got < want else '大'}：每行只有一个原始最大值时，"
                "|x| < max|row| / 254（半个步长）的值得到编码 0；在 127 个普通值里数一数这样的值（quantize_kv_rows）")),
            "q8_0_zero_codes": Field(int, lambda got, want, **_: tr(
                f"q8_0_zero_codes = {got} is too {'low' if got < want else 'high'}: with q8_0 only the block of 32 "
                "that holds channel 7 has the outlier's step; the other 3 blocks use their own max "
                "(precision.quantize_q8_0)",
                f"q8_0_zero_codes = {got} 偏{'小' if got < want else '大'}：q8_0 里只有含通道 7 的那一块（32 个值）"
                "用离群值定下的步长；其余 3 块各用自己的最大值（precision.quantize_q8_0）"))},
    correct=Text("{engine_zero_codes} of the 127 ordinary values are lost to code 0 with one scale per row, "
                 "{q8_0_zero_codes} with one scale per 32 values: the outlier sets the step only for its own block",
                 "每行一个 scale 时，127 个普通值里有 {engine_zero_codes} 个变成编码 0；每 32 个值一个 scale 时只有 "
                 "{q8_0_zero_codes} 个：离群值只决定它自己那一块的步长"),
    hint=Text("codes = quantize_kv_rows(row[None])[0][0]; ordinary = np.delete(np.arange(128), 7); "
              "np.sum(codes[ordinary] == 0). The same with precision.quantize_q8_0(row[None])[0][0].",
              "codes = quantize_kv_rows(row[None])[0][0]; ordinary = np.delete(np.arange(128), 7); "
              "np.sum(codes[ordinary] == 0)。再用 precision.quantize_q8_0(row[None])[0][0] 做一遍。"))


def _bytes_facts():
    same = [hd for hd in range(32, 513, 32)
            if precision.bytes_per_row(hd, "engine") == precision.bytes_per_row(hd, "q8_0")]
    return {"engine_bytes": precision.bytes_per_row(128, "engine"), "q8_0_bytes": precision.bytes_per_row(128, "q8_0"),
            "same_cost_hd": same[0]}


def _same_cost_wrong(got, **_):
    e_h = precision.bytes_per_row(got, "engine") if got > 0 else "?"
    q_h = precision.bytes_per_row(got, "q8_0") if got > 0 and got % 32 == 0 else "?"
    return tr(f"at hd = {got} the two cost {e_h} and {q_h} bytes: solve hd + 4 = hd + 2 * hd / 32",
              f"hd = {got} 时两者分别是 {e_h} 和 {q_h} 字节：解方程 hd + 4 = hd + 2 * hd / 32")


ex2 = Exercise(
    "scale_bytes", Text("exercise 2: what a finer scale costs", "练习 2：更细的 scale 要花多少字节"),
    question=Text(
        "How many bytes does one K row (one token, one kv head) cost at hd = 128 in this engine's layout "
        "(int8 codes, one fp32 raw max) and in q8_0 (int8 codes, one fp16 scale per 32 values)? At which head "
        "dimension (a multiple of 32) do the two cost the same?",
        "hd = 128 时，一行 K（一个 token、一个 kv 头）在本引擎的布局（int8 编码加一个 fp32 原始最大值）里占多少字节？"
        "在 q8_0（int8 编码，每 32 个值一个 fp16 scale）里又占多少？头维度（32 的倍数）为多少时两者一样大？"),
    facts=_bytes_facts,
    fields={"engine_bytes": Field(int, Text(
                "engine_bytes = {got}: one K row of this engine is hd int8 codes plus one fp32 scale",
                "engine_bytes = {got}：本引擎的一行 K 是 hd 个 int8 编码加一个 fp32 scale"), mistakes=((128, Text(
                    "engine_bytes = {got}: one K row of this engine is hd int8 codes plus one fp32 scale (you counted "
                    "the codes only)",
                    "engine_bytes = {got}：本引擎的一行 K 是 hd 个 int8 编码加一个 fp32 scale（你只数了编码）")),)),
            "q8_0_bytes": Field(int, Text(
                "q8_0_bytes = {got}: q8_0 stores one fp16 scale (2 bytes) per 32 int8 codes",
                "q8_0_bytes = {got}：q8_0 每 32 个 int8 编码存一个 fp16 scale（2 字节）"), mistakes=((128 + 4 * 4, Text(
                    "q8_0_bytes = {got}: q8_0 stores one fp16 scale (2 bytes) per 32 int8 codes (you counted 4 bytes "
                    "per scale)",
                    "q8_0_bytes = {got}：q8_0 每 32 个 int8 编码存一个 fp16 scale（2 字节）（你按每个 scale 4 字节算了）")),)),
            "same_cost_hd": Field(int, _same_cost_wrong)},
    correct=Text("{engine_bytes} and {q8_0_bytes} bytes per K row at hd = 128; the two layouts cost the same at hd = "
                 "{same_cost_hd}, and q8_0 costs more above it",
                 "hd = 128 时每行 K 分别是 {engine_bytes} 和 {q8_0_bytes} 字节；两种布局在 hd = {same_cost_hd} 时一样大，"
                 "再往上 q8_0 更贵"),
    hint=Text("precision.bytes_per_row(128, 'engine') and precision.bytes_per_row(128, 'q8_0'); "
              "then hd + 4 = hd + 2 * hd / 32.",
              "precision.bytes_per_row(128, 'engine') 和 precision.bytes_per_row(128, 'q8_0')；"
              "然后解 hd + 4 = hd + 2 * hd / 32。"))


@functools.lru_cache(maxsize=None)
def _protect_data():
    """Outlier K (factor 20 on channels 11, 64, 97), Gaussian V, 2048 tokens, 16 queries (seed 70);
    median relative errors with K in fp16 and with V in fp16 (the other half the engine's way)."""
    rng = np.random.default_rng(70)
    K = precision.outlier_rows(2048, 128, rng, channels=(11, 64, 97), factor=20.0)
    V = rng.standard_normal((2048, 128), dtype=np.float32)
    Q = (2 * rng.standard_normal((16, 128))).astype(np.float32)
    ref = attention(Q, K, V)
    k16 = float(np.median(precision.rel_error(precision.attend_scheme(Q, K, V, "fp16", v_scheme="engine"), ref)))
    v16 = float(np.median(precision.rel_error(precision.attend_scheme(Q, K, V, "engine", v_scheme="fp16"), ref)))
    return k16, v16


PROTECT = {
    "a": Choice(Text("K in fp16: the outliers set K's step, and a K error moves every weight",
                     "K 用 fp16：离群值决定了 K 的步长，而 K 的误差会挪动每一个权重"),
                Text("keeping K in fp16 removes the coarse step the outlier channels give K's rows",
                     "K 留在 fp16，就去掉了离群通道给 K 各行带来的粗步长")),
    "b": Choice(Text("V in fp16: a V error goes straight into the output, token by token",
                     "V 用 fp16：V 的误差逐 token 直接进入输出"),
                Text("V here is Gaussian; its q8 step is fine. The outliers are in K",
                     "这里的 V 是高斯分布，它的 q8 步长够细。离群值在 K 里")),
    "c": Choice(Text("Either one: both halves add about the same error, so it is a tie",
                     "哪个都行：两半带来的误差差不多，打个平手"),
                Text("measure both with precision.attend_scheme: the two medians are far apart",
                     "用 precision.attend_scheme 把两种都测一下：两个中位数相差很远")),
}


def _protect_facts():
    k16, v16 = _protect_data()
    return {"choice": "a" if k16 < v16 else "b", "k16": k16, "v16": v16}


ex3 = Exercise(
    "protect_half", Text("exercise 3: which half to keep in fp16", "练习 3：哪一半留在 fp16"),
    question=Text(
        "K has 3 outlier channels (factor 20), V is Gaussian. You may keep either K or V in fp16 "
        "(256 bytes per row at hd = 128), not both; the other one stays in this engine's q8. Which choice gives the "
        "smaller attention error? Measure it with precision.attend_scheme(Q, K, V, 'fp16', v_scheme='engine') and "
        "precision.attend_scheme(Q, K, V, 'engine', v_scheme='fp16').",
        "K 有 3 个离群通道（倍数 20），V 是高斯分布。K 和 V 只能选一个留在 fp16（hd = 128 时每行 256 字节），"
        "另一个仍用本引擎的 q8。哪种选择的注意力误差更小？用 "
        "precision.attend_scheme(Q, K, V, 'fp16', v_scheme='engine') 和 "
        "precision.attend_scheme(Q, K, V, 'engine', v_scheme='fp16') 测一测。"),
    facts=_protect_facts, fields={"choice": Field(PROTECT)},
    correct=Text("{why} (median relative error: K in fp16 {k16:.4f}, V in fp16 {v16:.4f})",
                 "{why}（相对误差中位数：K 用 fp16 为 {k16:.4f}，V 用 fp16 为 {v16:.4f}）"),
    hint=Text("Build K with precision.outlier_rows(2048, 128, rng, factor=20.0), V standard normal, Q = 2 * normal; "
              "compare the medians of precision.rel_error(..., lessonkit.reference.attention(Q, K, V)).",
              "用 precision.outlier_rows(2048, 128, rng, factor=20.0) 造 K，V 取标准正态，Q = 2 * 标准正态；"
              "比较 precision.rel_error(..., lessonkit.reference.attention(Q, K, V)) 的中位数。"))

register(__name__, [ex1, ex2, ex3])
