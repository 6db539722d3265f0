"""The exercises of lesson 06."""
from __future__ import annotations

import functools

import numpy as np

from .. import debug, source
from ..language import Text, tr
from ..validate import short
from .core import Blank, Choice, Exercise, Field, Wrong, filled, lesson04_data, register, whole


@functools.lru_cache(maxsize=None)
def _default_observation():
    return debug.observe_generation(16)


def _tier_a_facts(observation=None) -> dict:
    """The six answers, read from the records (not from the toy's settings)."""
    obs = observation or _default_observation()
    rs, s = obs.records, obs.summary()
    first = rs[0].seq_len
    per_step = sum(1 for r in rs if r.seq_len == first)
    return {"seq_len_first": first, "seq_len_last": rs[-1].seq_len, "calls_per_step": per_step,
            "grows_by_per_step": (rs[per_step].seq_len - first) if len(rs) > per_step else 0,
            "loop_runs_seq_len": s["token loop ran exactly seq_len times in every call"],
            "M_non_decreasing": s["M never decreased within a call"], "source": obs.source, "calls": len(rs)}


def _tier_a_field(kind, hint: Text) -> Field:
    return Field(kind, lambda key, got, source, **_: tr(
        f"{key} = {got!r} is not what the {source} records show: {hint}", f"{key} = {got!r} 与 {source} 的记录不符：{hint}"))


ex1 = Exercise(
    "tier_a", Text("tier A: seq_len, the token loop, M", "A 档：seq_len、token 循环、M"),
    Text("From the debugger's records of the 16-token generation: seq_len at entry of the first and the last call, "
         "kernel calls per generation step, how much seq_len grows from one step to the next, whether the token "
         "loop ran exactly seq_len times in every call, whether M never decreased within a call. "
         "Pass the observation: check(answer, observation=obs).",
         "根据调试器对 16 个 token 生成过程的记录回答：第一次和最后一次调用进入时的 seq_len；"
         "每个生成步调用几次内核；seq_len 每步增长多少；token 循环是否在每次调用里都正好跑 seq_len 遍；"
         "M 在一次调用之内是否从不下降。把观察结果一起传进去：check(answer, observation=obs)。"),
    facts=_tier_a_facts,
    fields={"seq_len_first": _tier_a_field(int, Text("the first record's seq_len", "看第一条记录的 seq_len")),
            "seq_len_last": _tier_a_field(int, Text("the last record's seq_len", "看最后一条记录的 seq_len")),
            "calls_per_step": _tier_a_field(int, Text("count the records of the first step (one per query head)",
                                                      "数一数第一步的记录（每个查询头一条）")),
            "grows_by_per_step": _tier_a_field(int, Text("seq_len of the second step minus seq_len of the first",
                                                         "第二步的 seq_len 减去第一步的 seq_len")),
            "loop_runs_seq_len": _tier_a_field(bool, Text(
                "compare each record's iterations (stops in segment 3) with its seq_len",
                "把每条记录的 iterations（在 segment 3 停下的次数）和它的 seq_len 比一比")),
            "M_non_decreasing": _tier_a_field(bool, Text("look at M after each token, within each call",
                                                         "在每次调用之内，看每个 token 之后的 M"))},
    correct=Text("{calls} calls, seq_len {seq_len_first} .. {seq_len_last}, +{grows_by_per_step} per step of "
                 "{calls_per_step} calls; the token loop ran seq_len times and M never fell (records from {source})",
                 "{calls} 次调用，seq_len 从 {seq_len_first} 到 {seq_len_last}，每步 {calls_per_step} 次调用、每步 "
                 "+{grows_by_per_step}；token 循环正好跑了 seq_len 遍，M 从没下降（记录来自 {source}）"),
    hint=Text("obs.records: r.seq_len, r.iterations, r.M (one value per token); obs.summary() computes the same.",
              "obs.records 里有 r.seq_len、r.iterations、r.M（每个 token 一个值）；obs.summary() 算的是同样的东西。"))

ARTICLE_PARTS = {1: Text("Q 量化 (Q quantization)", "Q 量化"), 2: Text("打分 (scoring)", "打分"),
                 3: Text("rescale + accumulate V (online softmax)", "rescale 与 V 累加，在线 softmax"),
                 4: Text("归一 (normalization)", "归一")}


def _segments_facts(path=None):
    """The lines of the copy without markers (debug.unmarked_kernel), from the markers of ``path``
    (default: native/flash_attn_q8_neon.c) mapped to the copy's numbers."""
    return {"accepted": debug.unmarked_segments(path or source.KERNEL_FILE), "copy": debug.UNMARKED_NAME}


def _off(n: int, start: bool, got: int, accepted: tuple[int, int]) -> str | None:
    (lo, hi), part = accepted, ARTICLE_PARTS[n]
    if lo <= got <= hi:
        return None
    d = lo - got if got < lo else got - hi
    if start and got < lo:
        return tr(f"segment {n} ({part}): your start is {d} line(s) too early",
                  f"segment {n}（{part}）：你的起始行早了 {d} 行")
    if start:
        return tr(f"segment {n} ({part}): your start is {d} line(s) too late",
                  f"segment {n}（{part}）：你的起始行晚了 {d} 行")
    if got < lo:
        return tr(f"segment {n} ({part}): your end is {d} line(s) too early", f"segment {n}（{part}）：你的结束行早了 {d} 行")
    return tr(f"segment {n} ({part}): your end is {d} line(s) too late", f"segment {n}（{part}）：你的结束行晚了 {d} 行")


def _segment_number(k) -> int:
    try:
        n = whole(k, "")
    except Wrong:
        n = 0
    if n not in ARTICLE_PARTS:
        raise Wrong(tr(f"keys are the segment numbers 1 to 4; got {short(k)}",
                       f"键应是 segment 的编号 1 到 4；你给的是 {short(k)}"))
    return n


def _segments(answer, facts):
    if len(answer) > 16:
        raise Wrong(tr("give a dict {1: (start, end), 2: ..., 3: ..., 4: ...}: four segments",
                       "请给一个 dict：{1: (start, end), 2: ..., 3: ..., 4: ...}：四个 segment"))
    given = {_segment_number(k): v for k, v in answer.items()}
    problems, accepted, copy = [], facts["accepted"], facts["copy"]
    for n, (ok_start, ok_end) in accepted.items():
        if n not in given:
            raise Wrong(tr(f"segment {n} ({ARTICLE_PARTS[n]}) is missing", f"缺了 segment {n}（{ARTICLE_PARTS[n]}）"))
        if not filled(given[n]) or (isinstance(given[n], (tuple, list)) and not all(map(filled, given[n]))):
            raise Blank(tr(f"fill in segment {n}", f"请填上 segment {n}"))
        if not isinstance(given[n], (tuple, list)) or len(given[n]) != 2:
            raise Wrong(tr(f"segment {n}: give (start line, end line); got {short(given[n])}",
                           f"segment {n}：请给 (起始行, 结束行)；你给的是 {short(given[n])}"))
        start, end = (whole(x, tr(f"segment {n}'s line", f"segment {n} 的行号")) for x in given[n])
        problems += [p for p in (_off(n, True, start, ok_start), _off(n, False, end, ok_end)) if p]
    if problems:
        raise Wrong(tr(f"{'; '.join(problems)} (line numbers of {copy})", f"{'；'.join(problems)}（{copy} 的行号）"))
    parts = [f"{n}: {s[0]}-{e[1]}" for n, (s, e) in accepted.items()]
    return tr(f"all four parts match the code of {copy}: {', '.join(parts)}",
              f"四个 segment 都与 {copy} 的代码吻合：{'，'.join(parts)}")


ex2 = Exercise(
    "tier_b_segments", Text("tier B: the four segments' lines", "B 档：四个 segment 的起止行号"),
    Text(f"debug.unmarked_kernel() writes the kernel without its segment comments to my-work/{debug.UNMARKED_NAME}. "
         "Read that copy (print it with source.numbered_lines(first, last, path=copy)) and give the start and end "
         "line, in the copy's numbering, of each part: 1 Q 量化 (Q to int8), 2 打分 (the score s of token t), "
         "3 rescale (the article's name; the part also adds token t's V row into VKQ), 4 归一 (divide by S). "
         "Rules: a part starts with the declarations of its own variables (Q's buffers qsc and qi belong to part 1). "
         "The token loop's own line (for ...) and the lines before the loop that set up M, S and VKQ belong to no "
         "part. A blank line, a comment line or a TRACE_ line (a hook of the traced build) at the edge of a part may "
         "be counted in or out. Give line numbers as whole numbers.",
         f"debug.unmarked_kernel() 把去掉了 segment 注释的内核写到 my-work/{debug.UNMARKED_NAME}。"
         "读这份副本（用 source.numbered_lines(first, last, path=copy) 打印），按副本的行号，"
         "给出每个 segment 的起始行和结束行。四个 segment 就是文章 B 档说的"
         "“Q 量化 / 打分 / rescale / 归一”四段：segment 1 Q 量化（Q 变成 int8），"
         "segment 2 打分（token t 的分数 s），segment 3 rescale（文章的叫法；"
         "这一部分还把 token t 的 V 行累加进 VKQ），segment 4 归一（除以 S）。"
         "规则：一个 segment 从它自己的变量声明开始（Q 的缓冲区 qsc 和 qi 属于 segment 1）。"
         "token 循环本身那一行（for ...），以及循环之前设置 M、S、VKQ 的那几行，不属于任何 segment。"
         "segment 边缘的空行、注释行或 TRACE_ 行（跟踪构建的钩子）算进去或不算都行。行号用整数。"),
    facts=_segments_facts, check=_segments, template={1: (..., ...), 2: (..., ...), 3: (..., ...), 4: (..., ...)},
    solution=lambda f: {n: (s[0], e[1]) for n, (s, e) in f["accepted"].items()},
    hint=Text("part 1 ends where Q's codes and block scales are done; part 2 ends when the score s of token t is "
              "final; part 3 is the rest of the loop body; part 4 is after the loop. A TRACE_ hook or a blank line at "
              "the edge may be in or out.",
              "segment 1 在 Q 的 int8 码和块 scale 算完处结束；segment 2 在 token t 的分数 s 定下来时结束；"
              "segment 3 是循环体的其余部分；segment 4 在循环之后。边缘的 TRACE_ 钩子或空行算不算都行。"))

WHY_CHOICES = {
    "a": Choice(Text("Q is the same for every token, so it is coded once; each K row was quantized when written, with "
                     "its own scale",
                     "Q 对每个 token 都一样，所以只编码一次；而每一行 K 是在写入时量化的，各有自己的 scale"),
                Text("right: the trace shows segment 1 running once and (nearly) as many K scales as tokens",
                     "没错：跟踪显示 segment 1 只跑了一次，而 K 的 scale（几乎）和 token 一样多")),
    "b": Choice(Text("Quantizing Q is expensive, so it is done once; K's scale could just as well be applied once at "
                     "the end, to the output",
                     "量化 Q 代价高，所以只做一次；K 的 scale 也完全可以在最后对输出乘一次"),
                Text("no: each token's score is multiplied by its own ks before exp(); a factor that differs per token "
                     "cannot be taken out of the sum of exponentials",
                     "不是：每个 token 的分数在 exp() 之前乘的是它自己的 ks；每个 token 都不同的因子，没法从指数和里提出来")),
    "c": Choice(Text("The K cache holds float32; the kernel quantizes each K row as it reads it, and that needs the "
                     "row's own scale each time",
                     "K 缓存存的是 float32；内核每读一行 K 就量化一次，所以每次都要这一行自己的 scale"),
                Text("no: K is already int8 in the cache (quantized once, when written); the kernel only reads its "
                     "stored scale",
                     "不是：K 在缓存里已经是 int8（写入时量化过一次）；内核只是读它存好的 scale")),
    "d": Choice(Text("Q changes during the scan, because the online rescale multiplies Q by exp(M_old - M_new) "
                     "whenever M rises",
                     "扫描过程中 Q 会变，因为每当 M 变大，在线 rescale 就把 Q 乘以 exp(M_old - M_new)"),
                Text("no: the rescale multiplies S and VKQ, never Q; Q's codes stay fixed for the whole call",
                     "不是：rescale 乘的是 S 和 VKQ，从不动 Q；整个调用里 Q 的 int8 码都不变")),
}


def _why_facts():
    cache, q, kh, scale, out, trace = lesson04_data()
    n_k = len(np.unique(cache.k_scales(kh)))
    return {"choice": "a" if trace.n_q_quantized == 1 and n_k > 1 else "b", "runs": trace.n_q_quantized, "n_k": n_k,
            "T": cache.seq_len}


ex3 = Exercise(
    "tier_b_why", Text("tier B: why Q once, K's scale per token?", "B 档：为什么 Q 只量化一次，K 的 scale 却每个 token 都要乘？"),
    Text("Why is Q quantized only once per call, while K's scale is multiplied in for every token?",
         "为什么每次调用 Q 只量化一次，而 K 的 scale 每个 token 都要乘一次？"),
    facts=_why_facts, fields={"choice": Field(WHY_CHOICES)},
    correct=Text("{why} (segment 1 ran {runs} time; {n_k} distinct K scales over {T} tokens)",
                 "{why}（segment 1 跑了 {runs} 次；{T} 个 token 共有 {n_k} 个不同的 K scale）"),
    hint=Text("which of the two depends on the token index t?", "两者之中，哪一个取决于 token 下标 t？"))

RESCALE_CHOICES = {
    "a": Choice(Text("the tokens before the last new max, each by exp(M_final - M_t) against the later tokens",
                     "最后一次新最大值之前的 token，相对后面的 token 各重了 exp(M_final - M_t) 倍"),
                Text("right: their terms stayed relative to an older, lower M and were never multiplied by ms; after "
                     "the division by the inflated sum, the tokens from the last maximum on all come out too light",
                     "没错：它们的项一直相对于一个更早、更低的 M，从没乘过 ms；除以这个被撑大的和之后，"
                     "从最后一个最大值起的 token 全都偏轻")),
    "b": Choice(Text("only the tokens that raised M, each by exp(s_t) against the tokens that did not",
                     "只有抬高了 M 的 token，相对没抬高的各重了 exp(s_t) 倍"),
                Text("no: a token that raises M gets weight exp(0) = 1, as in the intact kernel; it is everything "
                     "summed before it that is never shrunk",
                     "不是：抬高 M 的 token 得到权重 exp(0) = 1，和完好的内核一样；从没被缩小的，是在它之前累加起来的全部")),
    "c": Choice(Text("the tokens after the last new max, each by exp(M_final - s_t) against the earlier ones",
                     "最后一次新最大值之后的 token，相对前面的各重了 exp(M_final - s_t) 倍"),
                Text("no: after the last new max M no longer moves, so those tokens keep the right weights relative "
                     "to each other; it is the earlier ones that are too heavy",
                     "不是：最后一次新最大值之后 M 不再变，所以这些 token 之间的相对权重是对的；太重的是前面那些")),
    "d": Choice(Text("none of them: the weights keep their ratios, only the final division by S is off",
                     "都没有：权重之间的比例不变，只是最后除以 S 时出了错"),
                Text("no: S and VKQ miss the same factors, and the division does not repair the mix of weights: the "
                     "output leans toward the past",
                     "不是：S 和 VKQ 缺的是同样的因子，最后的除法修不好权重的配比：输出偏向过去的 token")),
}
RESCALE_SCORES = (0.0, 1.0, 2.0, 3.0)


@functools.lru_cache(maxsize=None)
def _rescale_facts():
    b = debug.break_kernel("no_rescale")
    wrong = debug.kernel_weights(b.ffi, b.lib, RESCALE_SCORES).astype(np.float64)
    ratio = wrong / debug.softmax_weights(RESCALE_SCORES)
    last_max = int(np.flatnonzero(np.array(RESCALE_SCORES) == np.maximum.accumulate(RESCALE_SCORES))[-1])
    heavy = np.flatnonzero(ratio > ratio[last_max] * (1 + 1e-4)).tolist()   # relative to the last maximum
    return {"too_heavy": "a" if heavy == list(range(last_max)) else "b", "factor_token0": float(ratio[0]),
            "scores": list(RESCALE_SCORES)}


ex4 = Exercise(
    "break_rescale", Text("break it: no online rescale", "改坏它：去掉在线 rescale"),
    Text("In your copy of the kernel (src = workspace.student_native(); edit src / 'flash_attn_q8_neon.c'), comment "
         "out the two lines that rescale on a new max: S *= ms; and the loop that multiplies VKQ by msv. They are in "
         "segment 3 (the online softmax update: the second half of the article's 段2). Rebuild and load it with "
         "lk.native.load(src_dir=src, verify='crashes'), then read its weights for the scores "
         f"{list(RESCALE_SCORES)} with debug.kernel_weights(ffi, lib, scores). Which tokens get too much weight "
         "(too_heavy: a letter, 'a' to 'd'), and by what factor is token 0's (normalized) weight too large "
         "(factor_token0: a number, broken / right)? Undo the edit afterwards.",
         "在你的内核副本里（src = workspace.student_native()；编辑 src / 'flash_attn_q8_neon.c'），"
         "把遇到新最大值时做 rescale 的两处注释掉：S *= ms; 以及把 VKQ 乘以 msv 的那个循环。"
         "它们在 segment 3（在线 softmax 的更新，即文章段2 的后半）。用 lk.native.load(src_dir=src, verify='crashes') "
         f"重新构建并载入，再用 debug.kernel_weights(ffi, lib, scores) 读出分数 {list(RESCALE_SCORES)} "
         "对应的权重。哪些 token 的权重太大（too_heavy：一个字母，'a' 到 'd'）？"
         "token 0（归一后）的权重大了多少倍（factor_token0：一个数，改坏后 / 正确）？做完后撤销修改。"),
    facts=_rescale_facts,
    fields={"too_heavy": Field(RESCALE_CHOICES), "factor_token0": Field(float, lambda got, want, why, scores, **_: tr(
        f"{why}. But token 0's weight is too large by a factor {'larger' if want > got else 'smaller'} than {got:.3g}: "
        f"broken weight / right weight, for scores {scores}",
        f"{why}。但 token 0 的权重过大的倍数比 {got:.3g} {'大' if want > got else '小'}：改坏后的权重 / 正确的权重，"
        f"分数为 {scores}"), rtol=0.02)},
    correct=Text("{why}. Token 0 is {factor_token0:.2f}x too heavy for scores {scores}",
                 "{why}。分数为 {scores} 时，token 0 的权重重了 {factor_token0:.2f} 倍"),
    hint=Text("every score here is a new max, so without the rescale every token keeps weight exp(0) = 1; the right "
              "weights are debug.softmax_weights(scores). If your copy does not build, "
              "debug.break_kernel('no_rescale') makes the same edit in a temporary copy.",
              "这里每个分数都是新的最大值，所以没有 rescale 时每个 token 都保持权重 exp(0) = 1；正确的权重是 "
              "debug.softmax_weights(scores)。如果你的副本构建不了，debug.break_kernel('no_rescale') "
              "会在一个临时副本里做同样的修改。"))

register(__name__, [ex1, ex2, ex3, ex4])
