"""The exercises of lesson 05b: what the K-twice variant still reads after the last chunk when its
first pass streams, and what makes the stored-scores variant fast on x86."""
from __future__ import annotations

from .. import streaming
from ..language import Text
from .core import Choice, Exercise, Field, register

HD, NKV, T, CHUNK = 128, 8, 32768, 512  # 32K: the lesson prints 8K and 64K


def _wait_facts():
    after = {v: streaming.work_after_last_chunk(v, T, CHUNK, HD, NKV)["bytes"]
             for v in ("two_pass_recompute_streamed", "two_pass_recompute", "streaming")}
    return {"bytes_after_last_chunk": after["two_pass_recompute_streamed"], "unstreamed": after["two_pass_recompute"],
            "single_pass": after["streaming"], "mib": after["two_pass_recompute_streamed"] / 2**20}


ex1 = Exercise(
    "wait_bytes", Text("exercise 1: what the K-twice variant reads after the last chunk",
                       "练习 1：K 读两遍的版本在最后一块之后还要读什么"),
    Text(f"KV arrives in chunks of {CHUNK} tokens, {T} tokens in all, {NKV} kv heads interleaved, head_dim {HD}. "
         "The K-twice variant runs its pass 1 (M and S) on each chunk as it arrives. How many bytes of lines "
         "must it read for one head after the last chunk has arrived (within 1%)?",
         f"KV 按每块 {CHUNK} 个 token 到达，共 {T} 个 token，{NKV} 个 kv 头交错存放，head_dim {HD}。"
         "K 读两遍的版本在每块到达时就对它跑第 1 遍（M 和 S）。最后一块到达之后，它为一个头还要读多少字节的"
         "缓存行（误差 1% 以内）？"),
    facts=_wait_facts,
    fields={"bytes_after_last_chunk": Field(float, (
        Text("{got:.4g} bytes is less than the K-twice variant still reads (within 1%)",
             "{got:.4g} 字节不对：K 读两遍的版本实际还要读的字节数比这多（误差须在 1% 以内）"),
        Text("{got:.4g} bytes is more than the K-twice variant still reads (within 1%)",
             "{got:.4g} 字节不对：K 读两遍的版本实际还要读的字节数比这少（误差须在 1% 以内）")), rtol=0.01, mistakes=(
        (lambda unstreamed, **_: unstreamed, Text(
            "you counted pass 1 over all tokens after the last chunk; pass 1 (M and S) runs as the chunks arrive, so "
            "only the last chunk's pass 1 is left",
            "你把全部 token 的第 1 遍都算在了最后一块之后；第 1 遍（M 和 S）在各块到达时就在跑，所以只剩最后一块的第 1 遍")),
        (lambda single_pass, **_: single_pass, Text(
            "that is the online single pass's last chunk; the K-twice variant's second pass needs M and S over all "
            "tokens, so it reads all of K and V after the last chunk",
            "这是在线单遍版最后一块的量；K 读两遍的版本，第二遍要用全部 token 的 M 和 S，"
            "所以最后一块到达后它还要读全部 K 和 V"))))},
    correct=Text(
        "{mib:.1f} MiB: the last chunk's pass 1, then all of K again and all of V; only the pass that needs M and S "
        "over all tokens waits",
        "{mib:.1f} MiB：最后一块的第 1 遍，然后再读一遍全部 K、读全部 V；只有需要全部 token 的 M 和 S 的那一遍要等"),
    hint=Text("pass 1 of the last chunk (its K), then pass 2 over every token (K again and V); bytes per token from "
              "traffic.bytes_per_token(128, 8).",
              "最后一块的第 1 遍（读它的 K），然后第 2 遍扫每个 token（再读 K，并读 V）；每个 token 的字节数用 "
              "traffic.bytes_per_token(128, 8)。"))

EXP_CHOICES = {
    "a": Choice(Text("its pass 2 is a loop of independent exps, which the x86 build vectorizes with the inline exp",
                     "它的第 2 遍是一串互不依赖的 exp，x86 构建用内联的 exp 把这个循环向量化了"),
                Text("right: q8_simd.h turns expf into an inline function on x86, and the compiler runs pass 2 many "
                     "lanes at a time; the single pass computes one exp per token inside a dependent chain, and ARM's "
                     "build calls libm's expf for every score in both",
                     "没错：在 x86 上 q8_simd.h 把 expf 换成内联函数，编译器让第 2 遍一次在很多个通道上同时算；单遍版每个 "
                     "token 算一个 exp，还处在一条前后依赖的链里；而 ARM 构建在两个内核里都为每个分数调用 libm 的 expf")),
    "b": Choice(Text("it reads fewer bytes of K and V than the single pass does on every call",
                     "每次调用它读的 K 和 V 字节比单遍版少"),
                Text("no: it reads the same K and V rows and scales, plus its score array (lesson 05's model)",
                     "不是：它读的 K、V 行和 scale 与单遍版一样，还要多读分数数组（第 05 课的模型）")),
    "c": Choice(Text("its score array stays in the first-level cache, so none of its loads ever miss",
                     "它的分数数组一直留在一级缓存里，所以它的读取从不未命中"),
                Text("no: the simulation shows the score array's lines missing the first level; bytes are not why",
                     "不是：模拟显示分数数组的缓存行在一级缓存里会未命中；原因不在字节数")),
}

ex2 = Exercise(
    "why_fast", Text("exercise 2: why stored scores run fast on x86", "练习 2：为什么存分数的版本在 x86 上跑得快"),
    Text("On this x86 machine the stored-scores variant is faster per token than the single pass. Which "
         "reason do the sources and the disassembly support?",
         "在这台 x86 机器上，存分数的两遍版每个 token 比单遍版快。源码和反汇编支持下面哪个原因？"),
    facts={"choice": "a"}, fields={"choice": Field(EXP_CHOICES)},
    hint=Text("look at the #if around q8_expf in native/q8_simd.h, and at pass 2 of flash_attn_two_pass_scores_q8.",
              "看 native/q8_simd.h 里 q8_expf 外面的 #if，再看 flash_attn_two_pass_scores_q8 的第 2 遍。"))

register(__name__, [ex1, ex2])
