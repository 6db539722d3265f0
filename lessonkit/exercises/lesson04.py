"""The exercises of lesson 04."""
from __future__ import annotations

import functools
import shutil

import numpy as np

from .. import debug, native, source
from ..language import Text, tr
from ..validate import short
from .core import MAX_ANSWER_ITEMS, Exercise, Field, Wrong, items_of, lesson04_data, register, whole


def _outside_facts():
    first, last = source.function_lines(debug.KERNEL)
    text = source.KERNEL_FILE.read_text().splitlines()
    inside = {n for s in source.kernel_segments().values() for n in range(s.begin, s.end + 1)}
    return {"lines": sorted(n for n in range(first, last + 1) if n not in inside and text[n - 1].strip()),
            "text": text}


def _outside(answer, facts):
    """Line numbers and (first, last) ranges, each range cut to the file's lines (lines beyond them
    count for nothing, so (1, 10**9) builds no billion numbers); blank lines are ignored."""
    text, got = facts["text"], set()
    for v in items_of(answer, "lines", MAX_ANSWER_ITEMS):
        if isinstance(v, (tuple, list, range)):
            if len(v) != 2:
                raise Wrong(tr(f"{short(v)}: give a line number or a (first, last) range",
                               f"{short(v)}：请给一个行号，或一个 (first, last) 范围"))
            first = whole(v[0], tr("a range's first line", "范围的第一行"))
            last = whole(v[1], tr("a range's last line", "范围的最后一行"))
            got |= set(range(max(first, 1), min(last, len(text)) + 1))
        else:
            got.add(whole(v, tr("a line number", "行号")))
    got = {n for n in got if 0 < n <= len(text) and text[n - 1].strip()}
    missing, extra = sorted(set(facts["lines"]) - got), sorted(got - set(facts["lines"]))
    if extra:
        more = " ..." if len(extra) > 6 else ""
        raise Wrong(tr(f"lines {extra[:6]}{more} are inside a segment or outside the function",
                       f"第 {extra[:6]}{more} 行在某个 segment 里，或在函数之外"))
    if missing:
        raise Wrong(tr(f"{len(missing)} non-blank line(s) of the function outside every segment are missing, "
                       f"the first at line {missing[0]}",
                       f"函数里不属于任何 segment 的非空行少了 {len(missing)} 行，第一行是第 {missing[0]} 行"))
    n = len(facts["lines"])
    return tr(f"{n} non-blank lines belong to no segment: the signature and the argument check, the running state M, "
              "S, VKQ and the token loop around segments 2-3, and closing braces",
              f"有 {n} 个非空行不属于任何 segment：函数签名和参数检查，运行态 M、S、VKQ 以及包住 segment 2-3 的 "
              "token 循环，还有右花括号")


ex1 = Exercise(
    "outside_segments", Text("exercise 1: lines in no segment", "练习 1：不属于任何 segment 的行"),
    Text("List the lines of flash_attn_single_q_q8_neon that lie in no segment (numbers or (first, last) ranges; "
         "blank lines may be left out).",
         "列出 flash_attn_single_q_q8_neon 里不属于任何 segment 的行（行号，或 (first, last) 范围；空行可以不列）。"),
    facts=_outside_facts, template={"lines": [...]}, check=_outside,
    hint=Text("source.function_lines('flash_attn_single_q_q8_neon') and source.kernel_segments(): every line of the "
              "first range that is in none of the second.",
              "用 source.function_lines('flash_attn_single_q_q8_neon') 和 source.kernel_segments()：前者范围里、"
              "不在后者任何一个 segment 里的每一行。"),
    explain=Text("They belong to the article's parts as follows: the signature and `if (hd ...)` to the call itself, "
                 "M/S/VKQ and the token loop to the online softmax (the article's segment 2 declares them).",
                 "它们在文章里的归属：签名和 `if (hd ...)` 属于调用本身，M/S/VKQ 和 token 循环属于在线 softmax"
                 "（文章的段 2 声明了它们）。"))


def _once_facts():
    cache, q, kh, scale, out, trace = lesson04_data()
    return {"distinct_k_scales": len(np.unique(cache.k_scales(kh))),
            "distinct_q_scales": len(np.unique(trace.q_scales)),
            "runs": trace.n_q_quantized, "q_code_calls_if_per_token": cache.seq_len * cache.head_dim,
            "hd": cache.head_dim}


ex2 = Exercise(
    "once_per_token", Text("exercise 2: once versus per token", "练习 2：一次 vs 每 token 一次"),
    Text("Lesson 04's traced call (seed 4, 1000 tokens, kv head 1): how many distinct values does "
         "cache.k_scales(1) hold, how many does trace.q_scales hold, and how many q_code calls would one call "
         "make if Q were quantized inside the token loop?",
         "第 04 课的跟踪调用（种子 4，1000 个 token，kv 头 1）：cache.k_scales(1) 里有多少个不同的值？"
         "trace.q_scales 里有多少个？如果在 token 循环里量化 Q，一次调用要调用多少次 q_code？"),
    facts=_once_facts,
    fields={"distinct_k_scales": Field(int, lambda got, want, **_: tr(
                f"np.unique(cache.k_scales(1)) has {'more' if want > got else 'fewer'} than {got} values",
                f"np.unique(cache.k_scales(1)) 的值{'多于' if want > got else '少于'} {got} 个")),
            "distinct_q_scales": Field(int, lambda got, want, **_: tr(
                f"trace.q_scales holds {'more' if want > got else 'fewer'} than {got} distinct values",
                f"trace.q_scales 里不同的值{'多于' if want > got else '少于'} {got} 个")),
            "q_code_calls_if_per_token": Field(int, Text(
                "not {got}: one q_code per value of Q ({hd}) for every token",
                "不是 {got}：每个 token 都要对 Q 的每个值调用一次 q_code（{hd} 个值）"))},
    correct=Text("{distinct_k_scales} K scales (one per token) against {distinct_q_scales} Q scales; segment 1 ran "
                 "{runs} time; quantizing Q per token would call q_code {q_code_calls_if_per_token} times instead of "
                 "{hd}",
                 "{distinct_k_scales} 个 K scale（每 token 一个），而 Q scale 只有 {distinct_q_scales} 个；segment 1 "
                 "运行了 {runs} 次；如果每个 token 都量化 Q，q_code 要调用 {q_code_calls_if_per_token} 次，而不是 "
                 "{hd} 次"),
    hint=Text("len(np.unique(...)); segment 1 calls q_code once per value of Q.",
              "len(np.unique(...))；segment 1 对 Q 的每个值调用一次 q_code。"))

FOLD_EDITS = (debug.Edit(source.KERNEL_FILE.name, "qsc[b] = qm * KVQ_INV;", "qsc[b] = qm * KVQ_INV * scale;", 1),
              debug.Edit(source.KERNEL_FILE.name, "s = s * ks * scale;", "s = s * ks;", 2))


@functools.lru_cache(maxsize=None)
def _fold_facts():
    copy = debug.copy_native()
    try:
        changes = [debug.edit_line(copy, e) for e in FOLD_EDITS]
        ffi, lib = native.load(src_dir=copy)
        cache, q, kh, scale, out, trace = lesson04_data()
        folded = debug.trace_with(ffi, lib, q, cache, kh, scale)
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    per_token = next(c for c in changes if c.new.strip().startswith("s ="))
    rel = float(np.abs(folded.s - trace.s).max() / np.abs(trace.s).max())
    return {"multiplies_saved_per_token": per_token.old.count("*") - per_token.new.count("*"),
            "scores_change_only_in_last_bits": bool(rel < 1e-5), "rel": rel}


ex3 = Exercise(
    "fold_scale", Text("exercise 3: fold scale into qsc", "练习 3：把 scale 并进 qsc"),
    Text("Fold the multiply by scale into Q's block scales, in YOUR copy of the kernel (never in native/).\n"
         "  1. src = workspace.student_native() (from lessonkit import debug, workspace) copies native/ to "
         "my-work/native/.\n"
         "  2. In src / 'flash_attn_q8_neon.c' change segment 1's line to  qsc[b] = qm * KVQ_INV * scale;  and "
         "segment 2's line to  s = s * ks;\n"
         "  3. ffi2, lib2 = lk.native.load(src_dir=src) builds your copy. tr2 = debug.trace_with(ffi2, lib2, q, "
         "cache, kh, scale) runs its traced build on this lesson's q, cache, kh and scale and returns the same "
         "kind of trace as lk.attend(..., trace=True).\n"
         "  multiplies_saved_per_token (a whole number): how many multiplies per token the edit saves.\n"
         "  scores_change_only_in_last_bits (True or False): do the scores tr2.s differ from tr.s by less than "
         "1e-5 relative?\n"
         "(The check makes the same edit in a temporary copy of its own.)",
         "把乘 scale 这一步并进 Q 的块 scale，在你自己的内核副本里改（不要改 native/）。\n"
         "  1. src = workspace.student_native()（from lessonkit import debug, workspace）把 native/ 复制到 "
         "my-work/native/。\n"
         "  2. 在 src / 'flash_attn_q8_neon.c' 里，把 segment 1 的那一行改成  qsc[b] = qm * KVQ_INV * scale;  并把 "
         "segment 2 的那一行改成  s = s * ks;\n"
         "  3. ffi2, lib2 = lk.native.load(src_dir=src) 构建你的副本。tr2 = debug.trace_with(ffi2, lib2, q, "
         "cache, kh, scale) 用本课的 q、cache、kh 和 scale 运行它的跟踪构建，返回的跟踪与 "
         "lk.attend(..., trace=True) 的同类。\n"
         "  multiplies_saved_per_token（整数）：这样改每个 token 省几次乘法。\n"
         "  scores_change_only_in_last_bits（True 或 False）：分数 tr2.s 与 tr.s 的相对差是否小于 1e-5？\n"
         "（check 会在它自己的临时副本里做同样的修改。）"),
    facts=_fold_facts,
    fields={"multiplies_saved_per_token": Field(int, Text(
                "not {got}: compare the per-token line of segment 2 before and after (the per-block line does not "
                "change)",
                "不是 {got}：对比 segment 2 里每 token 那一行改之前和改之后（每块那一行没有变）")),
            "scores_change_only_in_last_bits": Field(bool, Text(
                "the folded kernel's scores differ from the original's by at most {rel:.1e} relative",
                "合并后内核的分数与原来相比，相对差至多 {rel:.1e}"))},
    correct=Text("{multiplies_saved_per_token} multiply per token saved; the scores change by at most {rel:.1e} "
                 "relative: the same product, rounded in another order",
                 "每个 token 省 {multiplies_saved_per_token} 次乘法；分数的相对变化至多 {rel:.1e}：同样的乘积，"
                 "只是舍入顺序不同"),
    hint=Text("the multiply by scale moves from the token loop into segment 1 (4 blocks, once per call); float32 "
              "multiplication is not associative, so (a * b) * c and a * (b * c) may round differently.",
              "乘 scale 从 token 循环移到了 segment 1（4 个块，每次调用一次）；float32 乘法不满足结合律，"
              "所以 (a * b) * c 和 a * (b * c) 的舍入可能不同。"))

register(__name__, [ex1, ex2, ex3])
