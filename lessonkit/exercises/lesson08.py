"""The exercises of lesson 08 (GQA in one scan, split-KV): the KV bytes of one decode step of a GQA
model, a merge of two partial states worked by hand, and when a second thread helps split-KV.
Right answers are computed when the check runs (``traffic.model_bytes``, ``streaming.merge``)."""
from __future__ import annotations

import numpy as np

from .. import traffic
from ..streaming import Partial, merge
from ..language import Text, tr
from .core import Choice, Exercise, Field, register

L08_MODEL = dict(n_layers=36, n_kv_heads=8, group=4, seq_len=32768, head_dim=128)   # Qwen3-8B's config.json


def _layer_facts():
    c = L08_MODEL
    heads = c["n_layers"] * c["n_kv_heads"]
    grp, per = (heads * traffic.model_bytes(f"{kind}{c['group']}", c["seq_len"], c["head_dim"])["total"] / 2**30
                for kind in ("group", "per_head"))
    return {"grouped_gib": grp, "per_head_gib": per, "times": per / grp,
            "codes_only": heads * c["seq_len"] * 2 * c["head_dim"] / 2**30, "one_layer": grp / c["n_layers"]}


ex1 = Exercise(
    "layer_bytes", Text("exercise 1: the KV bytes of one decode step", "练习 1：一步 decode 读多少 KV 字节"),
    question=Text(
        "Qwen3-8B has 36 layers; each layer has 8 kv heads, each shared by 4 query heads; head_dim 128. "
        "The cache holds 32768 tokens. How many GiB (2**30 bytes) of K, V and scales does one decode step of the "
        "whole model read when nothing is reused from a cache: with one grouped call per kv head, and with one "
        "call per query head? Answer with two numbers (float).",
        "Qwen3-8B 有 36 层；每层 8 个 kv 头，每个 kv 头由 4 个查询头共用；head_dim 128。缓存里有 32768 个 token。"
        "缓存里什么都不复用时，整个模型的一步 decode 要读多少 GiB（2**30 字节）的 K、V 和 scale："
        "每个 kv 头一次分组调用时是多少，每个查询头一次调用时又是多少？用两个数（float）作答。"),
    facts=_layer_facts,
    fields={"grouped_gib": Field(float, Text(
                "grouped_gib = {got:g} is not within 1% of the bytes of 36 layers x 8 kv heads' K, V and scales read "
                "once: per token and kv head, hd bytes of K, hd of V, 4 + 4 of scales",
                "grouped_gib = {got:g} 与 36 层 × 8 个 kv 头的 K、V 和 scale 各读一遍的字节数相差超过 1%："
                "每个 token、每个 kv 头是 hd 字节 K、hd 字节 V、4 + 4 字节 scale"), rtol=0.01, mistakes=(
                (lambda codes_only, **_: codes_only, Text(
                    "grouped_gib = {got:g} is not within 1% of the bytes of 36 layers x 8 kv heads' K, V and scales "
                    "read once (you left out the two 4-byte scales per token): per token and kv head, hd bytes of K, "
                    "hd of V, 4 + 4 of scales",
                    "grouped_gib = {got:g} 与 36 层 × 8 个 kv 头的 K、V 和 scale 各读一遍的字节数相差超过 1%"
                    "（你漏掉了每个 token 的两个 4 字节 scale）：每个 token、每个 kv 头是 hd 字节 K、hd 字节 V、4 + 4 字节 scale")),
                (lambda one_layer, **_: one_layer, Text(
                    "grouped_gib = {got:g} is not within 1% of the bytes of 36 layers x 8 kv heads' K, V and scales "
                    "read once (you counted one layer only): per token and kv head, hd bytes of K, hd of V, 4 + 4 of "
                    "scales",
                    "grouped_gib = {got:g} 与 36 层 × 8 个 kv 头的 K、V 和 scale 各读一遍的字节数相差超过 1%"
                    "（你只算了一层）：每个 token、每个 kv 头是 hd 字节 K、hd 字节 V、4 + 4 字节 scale")))),
            "per_head_gib": Field(float, lambda got, grouped_gib, times, **_: tr(
                f"per_head_gib = {got:g}: each of the 4 query heads of a group reads its kv head's whole KV again, so "
                f"per-head calls read {times:.0f} times the grouped bytes, not {got / grouped_gib:.2g} times",
                f"per_head_gib = {got:g}：一组的 4 个查询头各自把它们 kv 头的全部 KV 再读一遍，"
                f"所以逐头调用读的字节是分组调用的 {times:.0f} 倍，而不是 {got / grouped_gib:.2g} 倍"), rtol=0.01)},
    correct=Text("{grouped_gib:.2f} GiB with grouped calls, {per_head_gib:.2f} GiB with per-head calls, for one decode "
                 "step of the whole model, when nothing is reused from a cache",
                 "整个模型的一步 decode、缓存里什么都不复用时：分组调用读 {grouped_gib:.2f} GiB，逐头调用读 "
                 "{per_head_gib:.2f} GiB"),
    hint=Text("traffic.model_bytes('group4', 32768)['total'] is one kv head's bytes for its 4 query heads; "
              "'per_head4' the same for 4 separate calls. Multiply by the 8 kv heads and the 36 layers.",
              "traffic.model_bytes('group4', 32768)['total'] 是一个 kv 头为它的 4 个查询头读的字节数；"
              "'per_head4' 是分成 4 次调用时的字节数。再乘以 8 个 kv 头和 36 层。"))

L08_A = (2.0, 3.0)      # (M, S) of run A
L08_B = (5.0, 1.5)      # (M, S) of run B


def _merge_facts():
    ab = merge(Partial(L08_A[0], L08_A[1], np.zeros(1), 1), Partial(L08_B[0], L08_B[1], np.zeros(1), 1))
    with_empty = merge(ab, Partial(-1e9, 0.0, np.zeros(1), 0))   # the kernel's state of no token
    return {"M": ab.M, "S": ab.S, "empty_changes_S": with_empty.S != ab.S}


ex2 = Exercise(
    "merge_by_hand", Text("exercise 2: a merge by hand", "练习 2：手算一次合并"),
    question=Text(
        f"Run A's state has M = {L08_A[0]}, S = {L08_A[1]}; run B's has M = {L08_B[0]}, S = {L08_B[1]} "
        "(leave acc out). What are M and S of the merged state of A and B? Then merge the result with the "
        "kernel's state of no token, (M = -1e9, S = 0): does S change?",
        f"区间 A 的状态是 M = {L08_A[0]}，S = {L08_A[1]}；区间 B 的是 M = {L08_B[0]}，S = {L08_B[1]}（不管 acc）。"
        "A 和 B 合并后的状态，M 和 S 各是多少？再把结果和内核\"一个 token 都没有\"时的状态 (M = -1e9, S = 0) "
        "合并：S 会变吗？"),
    facts=_merge_facts,
    fields={"M": Field(float, Text("M = {got:g}: the merged state's M is the larger of the two runs' maxima",
                                   "M = {got:g}：合并后状态的 M 是两个区间各自最大值中较大的那个"), rtol=1e-6),
            "S": Field(float, Text(
                "S = {got:g} is not within 1e-4 relative of S_A * exp(M_A - M) + S_B * exp(M_B - M)",
                "S = {got:g} 与 S_A * exp(M_A - M) + S_B * exp(M_B - M) 的相对差超过 1e-4"), rtol=1e-4,
                mistakes=((L08_A[1] + L08_B[1], Text(
                    "S = {got:g} is not within 1e-4 relative of S_A * exp(M_A - M) + S_B * exp(M_B - M) (you added "
                    "the two S without moving A's to the new M)",
                    "S = {got:g} 与 S_A * exp(M_A - M) + S_B * exp(M_B - M) 的相对差超过 1e-4"
                    "（你直接把两个 S 相加，没有把 A 的 S 换算到新的 M）")),)),
            "empty_changes_S": Field(bool, (   # (the truth is True, the truth is False)
                Text("compare S before and after merging the empty state", "比较合并空状态前后的 S"),
                Text("the empty state (-1e9, 0) has S = 0, and its factor exp(-1e9 - M) is 0 in float64: merging it "
                     "adds nothing",
                     "空状态 (-1e9, 0) 的 S = 0，它的因子 exp(-1e9 - M) 在 float64 里是 0：合并它什么也不加")))},
    correct=Text("M = {M:g}, S = 3 * exp(-3) + 1.5 = {S:.6f}; the empty state changes nothing",
                 "M = {M:g}，S = 3 * exp(-3) + 1.5 = {S:.6f}；空状态什么也不改变"),
    hint=Text("M = max(M_A, M_B); S = S_A * exp(M_A - M) + S_B * exp(M_B - M). "
              "Check with streaming.merge(Partial(2.0, 3.0, np.zeros(1), 1), Partial(5.0, 1.5, np.zeros(1), 1)).",
              "M = max(M_A, M_B)；S = S_A * exp(M_A - M) + S_B * exp(M_B - M)。"
              "用 streaming.merge(Partial(2.0, 3.0, np.zeros(1), 1), Partial(5.0, 1.5, np.zeros(1), 1)) 验证。"))

THREADS = {
    "a": Choice(Text("when one core's arithmetic is the limit and a second core is idle",
                     "一个核的算力是瓶颈，而第二个核正空闲时"),
                Text("two cores do the same work in about half the time; the merge adds little",
                     "两个核用大约一半的时间做完同样的工作；合并只多花一点")),
    "b": Choice(Text("when one core already pulls all the memory bandwidth there is",
                     "一个核已经用满了全部内存带宽时"),
                Text("then a second core waits for the same memory: the bytes per second do not grow",
                     "那样第二个核也只是在等同一个内存：每秒的字节数不会增加")),
    "c": Choice(Text("when the chunks are so short that the merge is most of the work",
                     "区间短到合并占了大部分工作时"),
                Text("then the thread start, the wait and the merge cost more than the chunk itself",
                     "那样线程启动、等待和合并的开销比扫描区间本身还大")),
}


ex3 = Exercise(
    "two_threads", Text("exercise 3: when does a second thread help?", "练习 3：第二个线程什么时候有用？"),
    question=Text(
        "Split-KV cuts one query head's tokens into 2 chunks and runs them on 2 threads. When does that "
        "finish the head clearly faster than the same 2 chunks on 1 thread?",
        "切分 KV 把一个查询头的 token 切成 2 个区间，在 2 个线程上运行。什么时候它算完这个头明显快于"
        "同样 2 个区间在 1 个线程上运行？"),
    facts={"choice": "a"}, fields={"choice": Field(THREADS)},
    hint=Text("Look at the split rows of the timing table at 8K and at 256K, and at the parallel capacity under it.",
              "看计时表里切分 KV 在 8K 和 256K 的那几行，以及表下面的并行能力。"))

register(__name__, [ex1, ex2, ex3])
