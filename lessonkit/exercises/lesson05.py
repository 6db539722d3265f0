"""The exercises of lesson 05: where one head's K fits (the engine's layout), and the extra bytes
per token of each two-pass variant by the model. Lesson 05b's (streaming, time) are in lesson05b."""
from __future__ import annotations

from .. import traffic
from ..language import Text, tr
from .core import Exercise, Field, register

# Other head sizes than the lesson's 128, so that the lesson's printed tables do not answer them
HD_FIT, HD_EXTRA, NKV = 64, 256, 8
LEVELS = {"tokens_512k": "a76-l2", "tokens_3m": "a76"}


def _fit_facts():
    per, one_head = traffic.bytes_per_token(HD_FIT, NKV)["k"], traffic.bytes_per_token(HD_FIT, 1)["k"]
    size = {key: traffic.preset(p).ll.size for key, p in LEVELS.items()}
    return {**{key: s // per for key, s in size.items()}, "per": per, "one_head": one_head, "nkv": NKV,
            "scale_bytes": 4 * NKV, "alone": {key: s // one_head for key, s in size.items()},
            "with_v": {key: s // (2 * per) for key, s in size.items()}}


def _fit_field(key: str) -> Field:
    return Field(int, lambda got, want, **_: tr(
        f"{key} = {got} is {'too many' if got > want else 'too few'} tokens: divide the last level's bytes by one "
        "head's K row plus its share of the scale lines",
        f"{key} = {got} 个 token {'太多' if got > want else '太少'}：用最后一级缓存的字节数，"
        "除以一个头的 K 行加上它在 scale 缓存行里所占的份额"), atol=1, mistakes=(
        (lambda alone, **_: alone[key], Text(
            "{key} = {got} counts {one_head} bytes per token, one head alone; with {nkv} heads a token's scale read "
            "brings {scale_bytes} bytes of a line, not 4",
            "{key} = {got} 是按每 token {one_head} 字节算的，即只有一个头；有 {nkv} 个头时，读一个 token 的 scale "
            "会带进一条缓存行里的 {scale_bytes} 字节，而不是 4 字节")),
        (lambda with_v, **_: with_v[key], Text(
            "{key} = {got} is where K and V together fit; the question asks for K alone",
            "{key} = {got} 是 K 和 V 一起装得下的长度；题目问的是只有 K"))))


ex1 = Exercise(
    "k_fits", Text("exercise 1: where one head's K fits", "练习 1：一个头的 K 装到多长"),
    Text(f"The engine interleaves {NKV} kv heads per token (head_dim {HD_FIT}). Up to how many tokens does one "
         "head's K (its rows plus the lines its scales share with the other heads) fit in a last level of 512 KiB, "
         "and of 3 MiB? Whole tokens.",
         f"引擎在每个 token 里交错存放 {NKV} 个 kv 头（head_dim {HD_FIT}）。一个头的 K（它的各行，加上它的 scale "
         "与其他头共用的缓存行）在 512 KiB 的最后一级缓存里至多装得下多少个 token？在 3 MiB 里呢？答整数个 token。"),
    facts=_fit_facts, fields={key: _fit_field(key) for key in LEVELS},
    correct=Text("{per} bytes per token: K fits in 512 KiB up to {tokens_512k} tokens and in 3 MiB up to {tokens_3m}; "
                 "beyond, the K-twice variant's second read of K comes from DRAM",
                 "每 token {per} 字节：K 在 512 KiB 里至多装得下 {tokens_512k} 个 token，在 3 MiB 里至多 "
                 "{tokens_3m} 个；超过之后，K 读两遍的变体第二遍读 K 就要从 DRAM 来"),
    hint=Text("traffic.bytes_per_token(64, 8) gives the bytes of lines per token; the preset's ll.size the bytes of "
              "the last level.",
              "traffic.bytes_per_token(64, 8) 给出每 token 占的缓存行字节数；预设的 ll.size 是最后一级缓存的字节数。"))


def _extra_facts():
    n = 4096  # any length: the model's bytes grow linearly with the tokens
    single = traffic.model_bytes("single", n, head_dim=HD_EXTRA, n_kv_heads=NKV)["total"]
    extra = {k: (traffic.model_bytes(v, n, head_dim=HD_EXTRA, n_kv_heads=NKV)["total"] - single) / n
             for k, v in (("k_twice_extra_per_token", "two_pass_recompute"),
                          ("scores_extra_per_token", "two_pass_scores"))}
    return {**extra, "k_row": traffic.bytes_per_token(HD_EXTRA, NKV)["k"], "nkv": NKV, "scale_bytes": 4 * NKV,
            "one_head": traffic.bytes_per_token(HD_EXTRA, 1)["k"]}


ex2 = Exercise(
    "extra_bytes", Text("exercise 2: the extra bytes of each variant, per token", "练习 2：每种变体每 token 多出的字节"),
    Text(f"By the model (no cache reuse), {NKV} kv heads interleaved, head_dim {HD_EXTRA}: how many bytes per token "
         "does each two-pass variant touch beyond the single pass? The K-twice variant, and the stored-scores variant.",
         f"按模型（不考虑缓存复用），{NKV} 个 kv 头交错，head_dim {HD_EXTRA}：每种两遍版变体每 token 比单遍多碰多少字节？"
         "K 读两遍的变体一个，存分数的变体一个。"),
    facts=_extra_facts,
    fields={"k_twice_extra_per_token": Field(float, Text(
                "k_twice_extra_per_token = {got:g} is not the second read of one K row and its scale's line share",
                "k_twice_extra_per_token = {got:g} 不是第二遍读一个 K 行及其 scale 所占缓存行份额的字节数"), rtol=0.01,
                mistakes=((lambda one_head, **_: one_head, Text(
                    "k_twice_extra_per_token = {got:g} is one head alone; with {nkv} heads interleaved a scale read "
                    "brings {scale_bytes} bytes of a line",
                    "k_twice_extra_per_token = {got:g} 是只有一个头的情况；{nkv} 个头交错时，读一次 scale "
                    "会带进一条缓存行里的 {scale_bytes} 字节")),
                          (HD_EXTRA, Text(
                    "k_twice_extra_per_token = {got:g} counts the K row only; the second read of K reads its scale "
                    "again too",
                    "k_twice_extra_per_token = {got:g} 只算了 K 行；第二遍读 K 时也要再读一次它的 scale")),
                          (lambda k_row, **_: 2 * k_row, Text(
                    "k_twice_extra_per_token = {got:g}: V is not read twice, only K",
                    "k_twice_extra_per_token = {got:g}：V 没有读两遍，只有 K 读两遍")))),
            "scores_extra_per_token": Field(float, Text(
                "scores_extra_per_token = {got:g}: count 4 bytes per score for each time the array is touched",
                "scores_extra_per_token = {got:g}：数组每被碰一次，每个分数算 4 字节"), rtol=0.01, mistakes=((4, Text(
                    "scores_extra_per_token = 4 counts the array once; it is written, read, written and read",
                    "scores_extra_per_token = 4 只把数组算了一次；它被写、读、写、读")),))},
    correct=Text("{k_twice_extra_per_token:.0f} bytes per token for K read twice (half of the single pass's K + V + "
                 "scales), {scores_extra_per_token:.0f} for the score array",
                 "K 读两遍每 token 多 {k_twice_extra_per_token:.0f} 字节（单遍 K + V + scale 的一半），"
                 "分数数组多 {scores_extra_per_token:.0f} 字节"),
    hint=Text("traffic.bytes_per_token(256, 8)['k'] is one K row with its share of the scale lines; the pass code "
              "shows how often the score array is written and read.",
              "traffic.bytes_per_token(256, 8)['k'] 是一个 K 行加上它在 scale 缓存行里的份额；各遍的代码说明了"
              "分数数组被写、读了几次。"))

register(__name__, [ex1, ex2])
