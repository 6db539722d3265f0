"""The exercises of lesson 05: where one head's K fits (the engine's layout), and the extra bytes
per token of each two-pass variant by the model. Lesson 05b's (streaming, time) are in lesson05b."""
from __future__ import annotations

from .. import traffic
from ..language import Text, tr
from .core import Choice, Exercise, Wrong, close, field_of, pick, register, whole

# Other head sizes than the lesson's 128, so that the lesson's printed tables do not answer them
HD_FIT, HD_EXTRA, NKV = 64, 256, 8


def _fit_truth():
    per = traffic.bytes_per_token(HD_FIT, NKV)["k"]
    return {p: traffic.preset(p).ll.size // per for p in ("a76-l2", "a76")}


def _l05_fit(answer):
    truth = _fit_truth()
    one_head = traffic.bytes_per_token(HD_FIT, 1)["k"]
    for p, key in (("a76-l2", "tokens_512k"), ("a76", "tokens_3m")):
        got = whole(field_of(answer, key), key)
        if abs(got - truth[p]) <= 1:
            continue
        if abs(got - traffic.preset(p).ll.size // one_head) <= 1:
            raise Wrong(tr(f"{key} = {got} counts {one_head} bytes per token, one head alone; with {NKV} heads "
                           f"a token's scale read brings {4 * NKV} bytes of a line, not 4",
                           f"{key} = {got} 是按每 token {one_head} 字节算的，即只有一个头；有 {NKV} 个头时，"
                           f"读一个 token 的 scale 会带进一条缓存行里的 {4 * NKV} 字节，而不是 4 字节"))
        if abs(got - traffic.preset(p).ll.size // (2 * traffic.bytes_per_token(HD_FIT, NKV)["k"])) <= 1:
            raise Wrong(tr(f"{key} = {got} is where K and V together fit; the question asks for K alone",
                           f"{key} = {got} 是 K 和 V 一起装得下的长度；题目问的是只有 K"))
        raise Wrong(tr(f"{key} = {got} is {'too many' if got > truth[p] else 'too few'} tokens: divide the last "
                       "level's bytes by one head's K row plus its share of the scale lines",
                       f"{key} = {got} 个 token {'太多' if got > truth[p] else '太少'}：用最后一级缓存的字节数，"
                       "除以一个头的 K 行加上它在 scale 缓存行里所占的份额"))
    per = traffic.bytes_per_token(HD_FIT, NKV)["k"]
    return tr(f"{per} bytes per token: K fits in 512 KiB up to {truth['a76-l2']} tokens and in 3 MiB up to "
              f"{truth['a76']}; beyond, the K-twice variant's second read of K comes from DRAM",
              f"每 token {per} 字节：K 在 512 KiB 里至多装得下 {truth['a76-l2']} 个 token，在 3 MiB 里至多 "
              f"{truth['a76']} 个；超过之后，K 读两遍的变体第二遍读 K 就要从 DRAM 来")


ex1 = Exercise(
    lesson="05", name="k_fits", title=Text("exercise 1: where one head's K fits", "练习 1：一个头的 K 装到多长"),
    question=Text(f"The engine interleaves {NKV} kv heads per token (head_dim {HD_FIT}). Up to how many tokens does one "
                  "head's K (its rows plus the lines its scales share with the other heads) fit in a last level of 512 KiB, "
                  "and of 3 MiB? Whole tokens.",
                  f"引擎在每个 token 里交错存放 {NKV} 个 kv 头（head_dim {HD_FIT}）。一个头的 K（它的各行，加上它的 scale "
                  "与其他头共用的缓存行）在 512 KiB 的最后一级缓存里至多装得下多少个 token？在 3 MiB 里呢？答整数个 token。"),
    template={"tokens_512k": ..., "tokens_3m": ...}, check=_l05_fit,
    solution=lambda: {"tokens_512k": _fit_truth()["a76-l2"], "tokens_3m": _fit_truth()["a76"]},
    hint=Text("traffic.bytes_per_token(64, 8) gives the bytes of lines per token; the preset's ll.size the bytes of "
              "the last level.",
              "traffic.bytes_per_token(64, 8) 给出每 token 占的缓存行字节数；预设的 ll.size 是最后一级缓存的字节数。"))


def _extra_truth():
    n = 4096  # any length: the model's bytes grow linearly with the tokens
    single = traffic.model_bytes("single", n, head_dim=HD_EXTRA, n_kv_heads=NKV)["total"]
    return {k: (traffic.model_bytes(v, n, head_dim=HD_EXTRA, n_kv_heads=NKV)["total"] - single) / n
            for k, v in (("k_twice_extra_per_token", "two_pass_recompute"),
                         ("scores_extra_per_token", "two_pass_scores"))}


def _l05_extra(answer):
    truth = _extra_truth()
    got = {k: field_of(answer, k, float) for k in truth}
    k_row, one_head = traffic.bytes_per_token(HD_EXTRA, NKV)["k"], traffic.bytes_per_token(HD_EXTRA, 1)["k"]
    g = got["k_twice_extra_per_token"]
    if not close(g, truth["k_twice_extra_per_token"], 0.01):
        if close(g, one_head, 0.01):
            raise Wrong(tr(f"k_twice_extra_per_token = {g:g} is one head alone; with {NKV} heads interleaved a scale "
                           f"read brings {4 * NKV} bytes of a line",
                           f"k_twice_extra_per_token = {g:g} 是只有一个头的情况；{NKV} 个头交错时，读一次 scale "
                           f"会带进一条缓存行里的 {4 * NKV} 字节"))
        if close(g, HD_EXTRA, 0.01):
            raise Wrong(tr(f"k_twice_extra_per_token = {g:g} counts the K row only; the second read of K reads its "
                           "scale again too",
                           f"k_twice_extra_per_token = {g:g} 只算了 K 行；第二遍读 K 时也要再读一次它的 scale"))
        if close(g, 2 * k_row, 0.01):
            raise Wrong(tr(f"k_twice_extra_per_token = {g:g}: V is not read twice, only K",
                           f"k_twice_extra_per_token = {g:g}：V 没有读两遍，只有 K 读两遍"))
        raise Wrong(tr(f"k_twice_extra_per_token = {g:g} is not the second read of one K row and its scale's line share",
                       f"k_twice_extra_per_token = {g:g} 不是第二遍读一个 K 行及其 scale 所占缓存行份额的字节数"))
    g = got["scores_extra_per_token"]
    if not close(g, truth["scores_extra_per_token"], 0.01):
        if close(g, 4, 0.01):
            raise Wrong(tr("scores_extra_per_token = 4 counts the array once; it is written, read, written and read",
                           "scores_extra_per_token = 4 只把数组算了一次；它被写、读、写、读"))
        raise Wrong(tr(f"scores_extra_per_token = {g:g}: count 4 bytes per score for each time the array is touched",
                       f"scores_extra_per_token = {g:g}：数组每被碰一次，每个分数算 4 字节"))
    return tr(f"{truth['k_twice_extra_per_token']:.0f} bytes per token for K read twice (half of the single pass's "
              f"K + V + scales), {truth['scores_extra_per_token']:.0f} for the score array",
              f"K 读两遍每 token 多 {truth['k_twice_extra_per_token']:.0f} 字节（单遍 K + V + scale 的一半），"
              f"分数数组多 {truth['scores_extra_per_token']:.0f} 字节")


ex2 = Exercise(
    lesson="05", name="extra_bytes",
    title=Text("exercise 2: the extra bytes of each variant, per token", "练习 2：每种变体每 token 多出的字节"),
    question=Text(f"By the model (no cache reuse), {NKV} kv heads interleaved, head_dim {HD_EXTRA}: how many bytes per token "
                  "does each two-pass variant touch beyond the single pass? The K-twice variant, and the stored-scores variant.",
                  f"按模型（不考虑缓存复用），{NKV} 个 kv 头交错，head_dim {HD_EXTRA}：每种两遍版变体每 token 比单遍多碰多少字节？"
                  "K 读两遍的变体一个，存分数的变体一个。"),
    template={"k_twice_extra_per_token": ..., "scores_extra_per_token": ...}, check=_l05_extra,
    solution=_extra_truth,
    hint=Text("traffic.bytes_per_token(256, 8)['k'] is one K row with its share of the scale lines; the pass code "
              "shows how often the score array is written and read.",
              "traffic.bytes_per_token(256, 8)['k'] 是一个 K 行加上它在 scale 缓存行里的份额；各遍的代码说明了"
              "分数数组被写、读了几次。"))

register(__name__, [ex1, ex2])
