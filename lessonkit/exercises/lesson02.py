"""The exercises of lesson 02."""
from __future__ import annotations

import functools

import numpy as np

from .. import rescales, softmax, source
from ..kernels.attention import attend
from ..language import Text, tr
from ..synthetic import cache_with_scores
from .core import Exercise, Field, Wrong, field_of, register

ORDERS = {"ascending": "increasing", "rising": "increasing", "sorted": "increasing", "increasing": "increasing",
          "descending": "decreasing", "falling": "decreasing", "decreasing": "decreasing", "random": "random",
          "shuffled": "random"}


@functools.lru_cache(maxsize=None)
def _worst_facts():
    n = 256
    orders = {"increasing": np.arange(n, dtype=np.float32), "decreasing": np.arange(n, dtype=np.float32)[::-1],
              "random": np.random.default_rng(0).permutation(n).astype(np.float32)}
    counts = {k: rescales.count_rescales(v) for k, v in orders.items()}
    # the multiplies of segment 3's rescale branch, read from the source: S *= ms, and the vmulq_f32
    # loop over VKQ (hd = 128 lanes)
    seg = source.kernel_segments()[3]
    lines = source.KERNEL_FILE.read_text().splitlines()[seg.begin - 1:seg.end]
    mult = sum(1 for l in lines if "*=" in l and "ms" in l) + (128 if any("vmulq_f32" in l and "msv" in l
                                                                          for l in lines) else 0)
    return {"order": next(k for k, c in counts.items() if c == n), "counts": counts, "extra_multiplies": mult,
            "extra_expf": 0}


ex1 = Exercise(
    "worst_case", Text("exercise 1: the worst case and its price", "练习 1：最坏情况及其代价"),
    Text("Which order of scores ('increasing', 'decreasing', 'random') makes the kernel rescale at every token? "
         "For hd = 128, how many scalar float multiplies (count each lane of a vector multiply) and how many expf "
         "calls does a rescaling token cost on top of a token that does not raise M?",
         "分数按哪种顺序（'increasing' 递增、'decreasing' 递减、'random' 随机）排列时，内核在每个 token 都要 rescale？"
         "hd = 128 时，一个触发 rescale 的 token 比一个不抬高 M 的 token 多花多少次标量浮点乘法（向量乘法按通道逐个计数）、"
         "多调用几次 expf？"),
    facts=_worst_facts,
    fields={"order": Field(ORDERS, lambda got, counts, **_: tr(
                f"{got} scores rescale {counts[got]} times out of 256 in the kernel's trace, not at every token",
                f"{got} 顺序的分数在内核的 trace 里 256 个 token 只 rescale {counts[got]} 次，不是每个 token 都 rescale")),
            "extra_multiplies": Field(int, Text(
                "not {got} extra multiplies for hd = 128: count S *= ms and the multiplies of the loop over VKQ",
                "hd = 128 时多出的乘法不是 {got} 次：数一数 S *= ms，再数 VKQ 那个循环里的乘法")),
            "extra_expf": Field(int, Text(
                "not {got} extra expf: the rescale branch calls expf(M - s) once, the other branch expf(s - M) once",
                "多出的 expf 不是 {got} 次：rescale 分支调用一次 expf(M - s)，另一个分支调用一次 expf(s - M)"))},
    correct=Text("{order} scores rescale at every token; each rescale costs {extra_multiplies} extra multiplies and "
                 "no extra expf",
                 "{order} 顺序的分数每个 token 都 rescale；每次 rescale 多花 {extra_multiplies} 次乘法，不多花 expf"),
    hint=Text("rescales.count_rescales(np.arange(256.0)); in segment 3 the if-branch has S *= ms and a loop of "
              "vmulq_f32 over hd values; both branches call expf once.",
              "试试 rescales.count_rescales(np.arange(256.0))；segment 3 里 if 分支有 S *= ms，还有一个对 hd 个值做 "
              "vmulq_f32 的循环；两个分支都各调用一次 expf。"))


def l02_descending(n: int = 64) -> np.ndarray:
    return (np.arange(n)[::-1] * 5.0).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _descending_facts():
    cache, q, scale = cache_with_scores(l02_descending(), head_dim=128, block_size=16, seed=3)
    out, trace = attend(q, cache, 0, scale=scale, trace=True)
    w = softmax.kernel_exp((trace.s - trace.M).astype(np.float32))   # the exp this build's kernel calls
    ref = softmax.three_pass(trace.s, cache.dequantized(0)[1])
    return {"rescales": trace.n_rescales, "first_zero_weight_token": int(np.flatnonzero(w == 0)[0]),
            "output_correct": bool(np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()),
            "exp_name": softmax.kernel_exp_name()}


ex2 = Exercise(
    "descending", Text("exercise 2: sorted descending", "练习 2：降序排列"),
    Text("Scores exercises.l02_descending() = np.arange(64)[::-1] * 5.0, in a cache_with_scores(..., head_dim=128). "
         "How many rescales? From which token on is the kernel's weight expf(s - M) exactly 0? (The kernel's build "
         "decides: on x86 it calls the inline expf of native/q8_simd.h, on ARM libm's expf; softmax.kernel_exp_name() "
         "says which, softmax.kernel_exp(x) computes it.) Is the kernel's output still correct (within 1e-5 of "
         "max|out| of softmax.three_pass on the trace's scores)?",
         "分数取 exercises.l02_descending() = np.arange(64)[::-1] * 5.0，放进 cache_with_scores(..., head_dim=128)。"
         "一共 rescale 几次？从哪个 token 起，内核的权重 expf(s - M) 恰好为 0？（这由内核的构建决定：在 x86 上调用 "
         "native/q8_simd.h 的内联 expf，在 ARM 上调用 libm 的 expf；softmax.kernel_exp_name() 告诉你是哪一个，"
         "softmax.kernel_exp(x) 按它计算。）内核的输出还对吗（与 softmax.three_pass 在 trace 分数上的结果相差不超过 "
         "max|out| 的 1e-5）？"),
    facts=_descending_facts,
    fields={"rescales": Field(int, lambda got, want, **_: tr(
                f"the kernel's trace counts {'more' if want > got else 'fewer'} than {got} rescales",
                f"内核的 trace 数出的 rescale 次数{'多于' if want > got else '少于'} {got} 次")),
            "first_zero_weight_token": Field(int, lambda got, want, exp_name, **_: tr(
                f"token {got} is too {'early' if got < want else 'late'}: find the first t where "
                f"softmax.kernel_exp(s_t - M) is exactly 0 (the exp of this build: {exp_name})",
                f"token {got} 太{'早' if got < want else '晚'}了：找出第一个使 softmax.kernel_exp(s_t - M) "
                f"恰好为 0 的 t（这个构建用的 exp：{exp_name}）")),
            "output_correct": Field(bool, Text("compare the kernel's output with softmax.three_pass(trace.s, V) again",
                                               "再把内核的输出和 softmax.three_pass(trace.s, V) 比一比"))},
    correct=lambda rescales, first_zero_weight_token, output_correct, **_: tr(
        f"{rescales} rescale (the first token), weights underflow to 0 from token {first_zero_weight_token} on, and "
        f"the output {'still matches' if output_correct else 'does not match'} the three-pass softmax: those weights "
        "are negligible anyway",
        f"{rescales} 次 rescale（在第一个 token），从 token {first_zero_weight_token} 起权重下溢为 0，输出"
        f"{'仍然与' if output_correct else '不再与'}三遍 softmax 一致：那些权重本来就可以忽略"),
    hint=Text("M stays at the first score; s_t - M = -5 t. The inline expf of q8_simd.h returns 0 below -87; libm's "
              "expf underflows to 0 only below about -103.97.",
              "M 一直停在第一个分数上；s_t - M = -5 t。q8_simd.h 的内联 expf 在 -87 以下返回 0；libm 的 expf "
              "要到约 -103.97 以下才下溢为 0。"))


@functools.lru_cache(maxsize=None)
def _invariant_facts():
    s = rescales.realistic_scores(300, seed=9, sink=2.0)   # 6 rescales: M moves several times
    cache, q, scale = cache_with_scores(s, head_dim=32, block_size=16, seed=1)
    _, trace = attend(q, cache, 0, scale=scale, trace=True)
    return {"trace": trace, "V": cache.dequantized(0)[1], "invariant": invariant_reference}


def invariant_reference(s, M, V):
    """The invariant written out (the right answer of lesson 02 exercise 3), float64:
    S_t = sum_{j<=t} exp(s_j - M_t), VKQ_t = sum_{j<=t} exp(s_j - M_t) v_j."""
    s, M, V = (np.asarray(x, np.float64) for x in (s, M, V))
    E = np.where(np.tri(len(s), dtype=bool), np.exp(np.minimum(s[None, :] - M[:, None], 0.0)), 0.0)   # j <= t
    return E.sum(axis=1), E @ V


def _invariant(answer, facts):
    fn, trace, V = field_of(answer, "invariant"), facts["trace"], facts["V"]
    if not callable(fn):
        raise Wrong(tr("'invariant' is a function f(s, M, V) -> (S, VKQ), S [T], VKQ [T, hd]",
                       "'invariant' 应是一个函数 f(s, M, V) -> (S, VKQ)，S 形状 [T]，VKQ 形状 [T, hd]"))
    try:
        S, VKQ = fn(trace.s.copy(), trace.M.copy(), V.copy())
        S, VKQ = np.asarray(S, np.float64), np.asarray(VKQ, np.float64)
    except Exception as e:  # noqa: BLE001 - any error of the student's function is the verdict
        raise Wrong(tr(f"your function raised {type(e).__name__}: {e}", f"你的函数抛出了 {type(e).__name__}：{e}")) from None
    if S.shape != trace.S.shape or VKQ.shape != trace.vkq.shape:
        raise Wrong(tr(f"shapes: S must be {trace.S.shape} and VKQ {trace.vkq.shape}; got {S.shape} and {VKQ.shape}",
                       f"形状不对：S 应是 {trace.S.shape}，VKQ 应是 {trace.vkq.shape}；收到的是 {S.shape} 和 {VKQ.shape}"))
    dS = np.abs(S - trace.S) / trace.S
    if not dS.max() <= 1e-4:
        t = int(np.argmax(~(dS <= 1e-4)))
        raise Wrong(tr(f"S_t differs from the kernel's trace.S from token {t} on (relative {dS[t]:.1e}): "
                       "is every exponent relative to M_t, the max after token t?",
                       f"从 token {t} 起 S_t 与内核的 trace.S 不符（相对误差 {dS[t]:.1e}）："
                       "每个指数都是相对 M_t（token t 之后的最大值）算的吗？"))
    dV = np.abs(VKQ - trace.vkq).max(axis=1) / np.abs(trace.vkq).max(axis=1)
    if not dV.max() <= 1e-4:
        t = int(np.argmax(~(dV <= 1e-4)))
        raise Wrong(tr(f"S is right, VKQ_t differs from trace.vkq from token {t} on (relative {dV[t]:.1e})",
                       f"S 对了，但从 token {t} 起 VKQ_t 与 trace.vkq 不符（相对误差 {dV[t]:.1e}）"))
    return tr(f"S_t and VKQ_t follow the invariant at all {len(S)} tokens of the kernel's trace "
              f"(largest relative gap {max(dS.max(), dV.max()):.1e}, float32 rounding)",
              f"在内核 trace 的全部 {len(S)} 个 token 上，S_t 和 VKQ_t 都满足不变式"
              f"（最大相对差 {max(dS.max(), dV.max()):.1e}，是 float32 舍入）")


ex3 = Exercise(
    "invariant", Text("exercise 3: the invariant", "练习 3：不变式"),
    Text("Write the state of section 1.3 as a function f(s, M, V) -> (S, VKQ): S[t] = sum_{j<=t} "
         "exp(s_j - M_t), VKQ[t] = sum_{j<=t} exp(s_j - M_t) V[j]. The check feeds it the kernel's trace of a "
         "realistic sequence (s = trace.s, M = trace.M, V dequantized) and compares with trace.S and trace.vkq.",
         "把 1.3 节的运行态写成函数 f(s, M, V) -> (S, VKQ)：S[t] = sum_{j<=t} exp(s_j - M_t)，"
         "VKQ[t] = sum_{j<=t} exp(s_j - M_t) V[j]。检查会把内核对一条拟真序列的 trace 交给它"
         "（s = trace.s，M = trace.M，V 为反量化后的值），再与 trace.S 和 trace.vkq 比较。"),
    facts=_invariant_facts, template={"invariant": ...}, check=_invariant,
    hint=Text("a lower-triangular matrix E[t, j] = exp(s_j - M_t) for j <= t, else 0; S = E.sum(1), VKQ = E @ V.",
              "用一个下三角矩阵：j <= t 时 E[t, j] = exp(s_j - M_t)，否则为 0；S = E.sum(1)，VKQ = E @ V。"),
    explain=Text("lessonkit.exercises.invariant_reference is one way to write it.",
                 "lessonkit.exercises.invariant_reference 是一种写法。"))

register(__name__, [ex1, ex2, ex3])
