"""The exercises of lesson 02."""
from __future__ import annotations

import functools

import numpy as np

from .. import rescales
from .. import softmax
from .. import source
from ..kernels.attention import attend
from ..synthetic import cache_with_scores
from ..language import Text, tr
from .core import (register, Wrong, field_of, Exercise)

def _rescale_extra_multiplies(hd: int) -> int:
    """Multiplies the rescale branch of segment 3 does on top of a normal token: ``S *= ms`` (1)
    and the vmulq_f32 loop over VKQ (hd), both read from the source."""
    seg = source.kernel_segments()[3]
    text = source.KERNEL_FILE.read_text().splitlines()[seg.begin - 1:seg.end]
    scalar = sum(1 for l in text if "*=" in l and "ms" in l)
    vector = hd if any("vmulq_f32" in l and "msv" in l for l in text) else 0
    return scalar + vector


@functools.lru_cache(maxsize=None)
def _l02_worst_truth():
    n = 256
    orders = {"increasing": np.arange(n, dtype=np.float32), "decreasing": np.arange(n, dtype=np.float32)[::-1],
              "random": np.random.default_rng(0).permutation(n).astype(np.float32)}
    counts = {k: rescales.count_rescales(v) for k, v in orders.items()}
    worst = next(k for k, c in counts.items() if c == n)
    return worst, _rescale_extra_multiplies(128), 0, counts


SYNONYMS = {"ascending": "increasing", "rising": "increasing", "sorted": "increasing",
            "increasing": "increasing", "descending": "decreasing", "falling": "decreasing",
            "decreasing": "decreasing", "random": "random", "shuffled": "random"}


def _l02_worst(answer):
    worst, mult, expf_extra, counts = _l02_worst_truth()
    order = SYNONYMS.get(str(field_of(answer, "order")).strip().lower())
    if order is None:
        raise Wrong(tr("'order' is 'increasing', 'decreasing' or 'random'",
                       "'order' 只能是 'increasing'、'decreasing' 或 'random'"))
    if order != worst:
        raise Wrong(tr(f"{order} scores rescale {counts[order]} times out of 256 in the kernel's trace, not at every token",
                       f"{order} 顺序的分数在内核的 trace 里 256 个 token 只 rescale {counts[order]} 次，不是每个 token 都 rescale"))
    m = field_of(answer, "extra_multiplies", int)
    if m != mult:
        raise Wrong(tr(f"not {m} extra multiplies for hd = 128: count S *= ms and the multiplies of the loop over VKQ",
                       f"hd = 128 时多出的乘法不是 {m} 次：数一数 S *= ms，再数 VKQ 那个循环里的乘法"))
    e = field_of(answer, "extra_expf", int)
    if e != expf_extra:
        raise Wrong(tr(f"not {e} extra expf: the rescale branch calls expf(M - s) once, the other branch expf(s - M) once",
                       f"多出的 expf 不是 {e} 次：rescale 分支调用一次 expf(M - s)，另一个分支调用一次 expf(s - M)"))
    return tr(f"{worst} scores rescale at every token; each rescale costs {mult} extra multiplies and no extra expf",
              f"{worst} 顺序的分数每个 token 都 rescale；每次 rescale 多花 {mult} 次乘法，不多花 expf")


ex02_1 = Exercise(
    lesson="02", name="worst_case", title=Text("exercise 1: the worst case and its price", "练习 1：最坏情况及其代价"),
    question=Text(
        "Which order of scores ('increasing', 'decreasing', 'random') makes the kernel rescale at every token? "
        "For hd = 128, how many scalar float multiplies (count each lane of a vector multiply) and how many expf "
        "calls does a rescaling token cost on top of a token that does not raise M?",
        "分数按哪种顺序（'increasing' 递增、'decreasing' 递减、'random' 随机）排列时，内核在每个 token 都要 rescale？"
        "hd = 128 时，一个触发 rescale 的 token 比一个不抬高 M 的 token 多花多少次标量浮点乘法（向量乘法按通道逐个计数）、"
        "多调用几次 expf？"),
    template={"order": ..., "extra_multiplies": ..., "extra_expf": ...}, check=_l02_worst,
    solution=_l02_worst_truth,
    hint=Text("rescales.count_rescales(np.arange(256.0)); in segment 3 the if-branch has S *= ms and a loop of "
              "vmulq_f32 over hd values; both branches call expf once.",
              "试试 rescales.count_rescales(np.arange(256.0))；segment 3 里 if 分支有 S *= ms，还有一个对 hd 个值做 "
              "vmulq_f32 的循环；两个分支都各调用一次 expf。"))


def l02_descending(n: int = 64) -> np.ndarray:
    return (np.arange(n)[::-1] * 5.0).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _l02_desc_truth():
    s = l02_descending()
    cache, q, scale = cache_with_scores(s, head_dim=128, block_size=16, seed=3)
    out, tr = attend(q, cache, 0, scale=scale, trace=True)
    w = softmax.kernel_exp((tr.s - tr.M).astype(np.float32))   # the exp this build's kernel calls
    first_zero = int(np.flatnonzero(w == 0)[0])
    ref = softmax.three_pass(tr.s, cache.dequantized(0)[1])
    ok = bool(np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max())
    return tr.n_rescales, first_zero, ok


def _l02_desc(answer):
    n_resc, first_zero, ok = _l02_desc_truth()
    r = field_of(answer, "rescales", int)
    if r != n_resc:
        raise Wrong(tr(f"the kernel's trace counts {'more' if n_resc > r else 'fewer'} than {r} rescales",
                       f"内核的 trace 数出的 rescale 次数{'多于' if n_resc > r else '少于'} {r} 次"))
    f = field_of(answer, "first_zero_weight_token", int)
    if f != first_zero:
        raise Wrong(tr(f"token {f} is too {'early' if f < first_zero else 'late'}: find the first t where "
                       "softmax.kernel_exp(s_t - M) is exactly 0 (the exp of this build: " + softmax.kernel_exp_name() + ")",
                       f"token {f} 太{'早' if f < first_zero else '晚'}了：找出第一个使 softmax.kernel_exp(s_t - M) "
                       "恰好为 0 的 t（这个构建用的 exp：" + softmax.kernel_exp_name() + "）"))
    c = field_of(answer, "output_correct", bool)
    if c != ok:
        raise Wrong(tr("compare the kernel's output with softmax.three_pass(trace.s, V) again",
                       "再把内核的输出和 softmax.three_pass(trace.s, V) 比一比"))
    return tr(f"{n_resc} rescale (the first token), weights underflow to 0 from token {first_zero} on, and the "
              f"output {'still matches' if ok else 'does not match'} the three-pass softmax: those weights are negligible anyway",
              f"{n_resc} 次 rescale（在第一个 token），从 token {first_zero} 起权重下溢为 0，输出"
              f"{'仍然与' if ok else '不再与'}三遍 softmax 一致：那些权重本来就可以忽略")


ex02_2 = Exercise(
    lesson="02", name="descending", title=Text("exercise 2: sorted descending", "练习 2：降序排列"),
    question=Text(
        "Scores exercises.l02_descending() = np.arange(64)[::-1] * 5.0, in a cache_with_scores(..., head_dim=128). "
        "How many rescales? From which token on is the kernel's weight expf(s - M) exactly 0? (The kernel's build decides: "
        "on x86 it calls the inline expf of native/q8_simd.h, on ARM libm's expf; softmax.kernel_exp_name() says which, "
        "softmax.kernel_exp(x) computes it.) Is the kernel's output "
        "still correct (within 1e-5 of max|out| of softmax.three_pass on the trace's scores)?",
        "分数取 exercises.l02_descending() = np.arange(64)[::-1] * 5.0，放进 cache_with_scores(..., head_dim=128)。"
        "一共 rescale 几次？从哪个 token 起，内核的权重 expf(s - M) 恰好为 0？（这由内核的构建决定：在 x86 上调用 "
        "native/q8_simd.h 的内联 expf，在 ARM 上调用 libm 的 expf；softmax.kernel_exp_name() 告诉你是哪一个，"
        "softmax.kernel_exp(x) 按它计算。）内核的输出还对吗（与 softmax.three_pass 在 trace 分数上的结果相差不超过 "
        "max|out| 的 1e-5）？"),
    template={"rescales": ..., "first_zero_weight_token": ..., "output_correct": ...}, check=_l02_desc,
    solution=_l02_desc_truth,
    hint=Text("M stays at the first score; s_t - M = -5 t. The inline expf of q8_simd.h returns 0 below -87; libm's "
              "expf underflows to 0 only below about -103.97.",
              "M 一直停在第一个分数上；s_t - M = -5 t。q8_simd.h 的内联 expf 在 -87 以下返回 0；libm 的 expf "
              "要到约 -103.97 以下才下溢为 0。"))


@functools.lru_cache(maxsize=None)
def _l02_invariant_case():
    s = rescales.realistic_scores(300, seed=9, sink=2.0)   # 6 rescales: M moves several times
    cache, q, scale = cache_with_scores(s, head_dim=32, block_size=16, seed=1)
    _, tr = attend(q, cache, 0, scale=scale, trace=True)
    return tr, cache.dequantized(0)[1]


def invariant_reference(s, M, V):
    """The invariant written out (the right answer of lesson 02 exercise 3), float64:
    S_t = sum_{j<=t} exp(s_j - M_t), VKQ_t = sum_{j<=t} exp(s_j - M_t) v_j."""
    s, M, V = (np.asarray(x, np.float64) for x in (s, M, V))
    below = np.tri(len(s), dtype=bool)                            # j <= t
    E = np.where(below, np.exp(np.minimum(s[None, :] - M[:, None], 0.0)), 0.0)
    return E.sum(axis=1), E @ V


def _l02_invariant(answer):
    fn = field_of(answer, "invariant")
    if not callable(fn):
        raise Wrong(tr("'invariant' is a function f(s, M, V) -> (S, VKQ), S [T], VKQ [T, hd]",
                       "'invariant' 应是一个函数 f(s, M, V) -> (S, VKQ)，S 形状 [T]，VKQ 形状 [T, hd]"))
    trace, V = _l02_invariant_case()
    try:
        S, VKQ = fn(trace.s.copy(), trace.M.copy(), V.copy())
        S, VKQ = np.asarray(S, np.float64), np.asarray(VKQ, np.float64)
    except Exception as e:  # noqa: BLE001 - any error of the student's function is the verdict
        raise Wrong(tr(f"your function raised {type(e).__name__}: {e}",
                       f"你的函数抛出了 {type(e).__name__}：{e}")) from None
    if S.shape != trace.S.shape or VKQ.shape != trace.vkq.shape:
        raise Wrong(tr(f"shapes: S must be {trace.S.shape} and VKQ {trace.vkq.shape}; got {S.shape} and {VKQ.shape}",
                       f"形状不对：S 应是 {trace.S.shape}，VKQ 应是 {trace.vkq.shape}；收到的是 {S.shape} 和 {VKQ.shape}"))
    dS = np.abs(S - trace.S) / trace.S
    if dS.max() > 1e-4:
        t = int(np.argmax(dS > 1e-4))
        raise Wrong(tr(f"S_t differs from the kernel's trace.S from token {t} on (relative {dS[t]:.1e}): "
                       "is every exponent relative to M_t, the max after token t?",
                       f"从 token {t} 起 S_t 与内核的 trace.S 不符（相对误差 {dS[t]:.1e}）："
                       "每个指数都是相对 M_t（token t 之后的最大值）算的吗？"))
    dV = np.abs(VKQ - trace.vkq).max(axis=1) / np.abs(trace.vkq).max(axis=1)
    if dV.max() > 1e-4:
        t = int(np.argmax(dV > 1e-4))
        raise Wrong(tr(f"S is right, VKQ_t differs from trace.vkq from token {t} on (relative {dV[t]:.1e})",
                       f"S 对了，但从 token {t} 起 VKQ_t 与 trace.vkq 不符（相对误差 {dV[t]:.1e}）"))
    return tr(f"S_t and VKQ_t follow the invariant at all {len(S)} tokens of the kernel's trace "
              f"(largest relative gap {max(dS.max(), dV.max()):.1e}, float32 rounding)",
              f"在内核 trace 的全部 {len(S)} 个 token 上，S_t 和 VKQ_t 都满足不变式"
              f"（最大相对差 {max(dS.max(), dV.max()):.1e}，是 float32 舍入）")


ex02_3 = Exercise(
    lesson="02", name="invariant", title=Text("exercise 3: the invariant", "练习 3：不变式"),
    question=Text(
        "Write the state of section 1.3 as a function f(s, M, V) -> (S, VKQ): S[t] = sum_{j<=t} "
        "exp(s_j - M_t), VKQ[t] = sum_{j<=t} exp(s_j - M_t) V[j]. The check feeds it the kernel's trace of a "
        "realistic sequence (s = trace.s, M = trace.M, V dequantized) and compares with trace.S and trace.vkq.",
        "把 1.3 节的运行态写成函数 f(s, M, V) -> (S, VKQ)：S[t] = sum_{j<=t} exp(s_j - M_t)，"
        "VKQ[t] = sum_{j<=t} exp(s_j - M_t) V[j]。检查会把内核对一条拟真序列的 trace 交给它"
        "（s = trace.s，M = trace.M，V 为反量化后的值），再与 trace.S 和 trace.vkq 比较。"),
    template={"invariant": ...}, check=_l02_invariant,
    solution=lambda: {"invariant": invariant_reference},
    hint=Text("a lower-triangular matrix E[t, j] = exp(s_j - M_t) for j <= t, else 0; S = E.sum(1), VKQ = E @ V.",
              "用一个下三角矩阵：j <= t 时 E[t, j] = exp(s_j - M_t)，否则为 0；S = E.sum(1)，VKQ = E @ V。"),
    explain=Text("lessonkit.exercises.invariant_reference is one way to write it.",
                 "lessonkit.exercises.invariant_reference 是一种写法。"))

register(__name__, [ex02_1, ex02_2, ex02_3])
