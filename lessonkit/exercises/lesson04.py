"""The exercises of lesson 04."""
from __future__ import annotations

import functools
import shutil

import numpy as np

from .. import debug
from .. import native
from .. import source
from ..language import Text, tr
from ..validate import short
from .core import (register, MAX_ANSWER_ITEMS, Wrong, items_of, whole, field_of, Exercise, lesson04_data)

def _lines_outside_segments():
    first, last = source.function_lines(debug.KERNEL)
    segs = source.kernel_segments()
    text = source.KERNEL_FILE.read_text().splitlines()
    inside = {n for s in segs.values() for n in range(s.begin, s.end + 1)}
    return {n for n in range(first, last + 1) if n not in inside and text[n - 1].strip()}


def _as_lines(value, n_lines: int) -> set[int]:
    """The line numbers of an answer's numbers and (first, last) ranges, each range cut to the
    file's lines 1..n_lines (lines beyond them count for nothing, so (1, 10**9) builds no billion
    numbers)."""
    out = set()
    for v in items_of({"lines": value}, "lines", MAX_ANSWER_ITEMS):
        if isinstance(v, (tuple, list, range)):
            if len(v) != 2:
                raise Wrong(tr(f"{short(v)}: give a line number or a (first, last) range",
                               f"{short(v)}：请给一个行号，或一个 (first, last) 范围"))
            first = whole(v[0], tr("a range's first line", "范围的第一行"))
            last = whole(v[1], tr("a range's last line", "范围的最后一行"))
            out |= set(range(max(first, 1), min(last, n_lines) + 1))
        else:
            out.add(whole(v, tr("a line number", "行号")))
    return out


def _l04_outside(answer):
    truth = _lines_outside_segments()
    text = source.KERNEL_FILE.read_text().splitlines()
    got = {n for n in _as_lines(field_of(answer, "lines"), len(text)) if 0 < n <= len(text) and text[n - 1].strip()}
    missing, extra = sorted(truth - got), sorted(got - truth)
    if extra:
        more = ' ...' if len(extra) > 6 else ''
        raise Wrong(tr(f"lines {extra[:6]}{more} are inside a segment or outside the function",
                       f"第 {extra[:6]}{more} 行在某个 segment 里，或在函数之外"))
    if missing:
        raise Wrong(tr(f"{len(missing)} non-blank line(s) of the function outside every segment are missing, "
                       f"the first at line {missing[0]}",
                       f"函数里不属于任何 segment 的非空行少了 {len(missing)} 行，第一行是第 {missing[0]} 行"))
    return tr(f"{len(truth)} non-blank lines belong to no segment: the signature and the argument check, the "
              "running state M, S, VKQ and the token loop around segments 2-3, and closing braces",
              f"有 {len(truth)} 个非空行不属于任何 segment：函数签名和参数检查，运行态 M、S、VKQ 以及包住 segment 2-3 的 "
              "token 循环，还有右花括号")


ex04_1 = Exercise(
    lesson="04", name="outside_segments",
    title=Text("exercise 1: lines in no segment", "练习 1：不属于任何 segment 的行"),
    question=Text("List the lines of flash_attn_single_q_q8_neon that lie in no segment (numbers or (first, last) ranges; "
                  "blank lines may be left out).",
                  "列出 flash_attn_single_q_q8_neon 里不属于任何 segment 的行（行号，或 (first, last) 范围；空行可以不列）。"),
    template={"lines": [...]}, check=_l04_outside,
    solution=lambda: {"lines": sorted(_lines_outside_segments())},
    hint=Text("source.function_lines('flash_attn_single_q_q8_neon') and source.kernel_segments(): every line of the "
              "first range that is in none of the second.",
              "用 source.function_lines('flash_attn_single_q_q8_neon') 和 source.kernel_segments()：前者范围里、"
              "不在后者任何一个 segment 里的每一行。"),
    explain=Text("They belong to the article's parts as follows: the signature and `if (hd ...)` to the call itself, "
                 "M/S/VKQ and the token loop to the online softmax (the article's segment 2 declares them).",
                 "它们在文章里的归属：签名和 `if (hd ...)` 属于调用本身，M/S/VKQ 和 token 循环属于在线 softmax"
                 "（文章的段 2 声明了它们）。"))


def _l04_once_truth():
    cache, q, kh, scale, out, tr = lesson04_data()
    return (len(np.unique(cache.k_scales(kh))), len(np.unique(tr.q_scales)), tr.n_q_quantized,
            cache.seq_len * cache.head_dim)


def _l04_once(answer):
    nk, nq, runs, per_token = _l04_once_truth()
    k = field_of(answer, "distinct_k_scales", int)
    if k != nk:
        raise Wrong(tr(f"np.unique(cache.k_scales(1)) has {'more' if nk > k else 'fewer'} than {k} values",
                       f"np.unique(cache.k_scales(1)) 的值{'多于' if nk > k else '少于'} {k} 个"))
    qn = field_of(answer, "distinct_q_scales", int)
    if qn != nq:
        raise Wrong(tr(f"trace.q_scales holds {'more' if nq > qn else 'fewer'} than {qn} distinct values",
                       f"trace.q_scales 里不同的值{'多于' if nq > qn else '少于'} {qn} 个"))
    c = field_of(answer, "q_code_calls_if_per_token", int)
    if c != per_token:
        raise Wrong(tr(f"not {c}: one q_code per value of Q ({lesson04_data()[0].head_dim}) for every token",
                       f"不是 {c}：每个 token 都要对 Q 的每个值调用一次 q_code（{lesson04_data()[0].head_dim} 个值）"))
    hd = lesson04_data()[0].head_dim
    return tr(f"{nk} K scales (one per token) against {nq} Q scales; segment 1 ran {runs} time; quantizing Q per "
              f"token would call q_code {per_token} times instead of {hd}",
              f"{nk} 个 K scale（每 token 一个），而 Q scale 只有 {nq} 个；segment 1 运行了 {runs} 次；如果每个 token "
              f"都量化 Q，q_code 要调用 {per_token} 次，而不是 {hd} 次")


ex04_2 = Exercise(
    lesson="04", name="once_per_token",
    title=Text("exercise 2: once versus per token", "练习 2：一次 vs 每 token 一次"),
    question=Text("Lesson 04's traced call (seed 4, 1000 tokens, kv head 1): how many distinct values does "
                  "cache.k_scales(1) hold, how many does trace.q_scales hold, and how many q_code calls would one call "
                  "make if Q were quantized inside the token loop?",
                  "第 04 课的跟踪调用（种子 4，1000 个 token，kv 头 1）：cache.k_scales(1) 里有多少个不同的值？"
                  "trace.q_scales 里有多少个？如果在 token 循环里量化 Q，一次调用要调用多少次 q_code？"),
    template={"distinct_k_scales": ..., "distinct_q_scales": ..., "q_code_calls_if_per_token": ...}, check=_l04_once,
    solution=lambda: (lambda t: (t[0], t[1], t[3]))(_l04_once_truth()),
    hint=Text("len(np.unique(...)); segment 1 calls q_code once per value of Q.",
              "len(np.unique(...))；segment 1 对 Q 的每个值调用一次 q_code。"))

FOLD_EDITS = (debug.Edit(source.KERNEL_FILE.name, "qsc[b] = qm * KVQ_INV;", "qsc[b] = qm * KVQ_INV * scale;", 1),
              debug.Edit(source.KERNEL_FILE.name, "s = s * ks * scale;", "s = s * ks;", 2))


@functools.lru_cache(maxsize=None)
def _l04_fold_truth():
    copy = debug.copy_native()
    try:
        changes = [debug.edit_line(copy, e) for e in FOLD_EDITS]
        ffi, lib = native.load(src_dir=copy)
        cache, q, kh, scale, out, tr = lesson04_data()
        folded = debug.trace_with(ffi, lib, q, cache, kh, scale)
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    per_token = next(c for c in changes if c.new.strip().startswith("s ="))
    saved = per_token.old.count("*") - per_token.new.count("*")
    rel = float(np.abs(folded.s - tr.s).max() / np.abs(tr.s).max())
    return saved, bool(rel < 1e-5), rel


def _l04_fold(answer):
    saved, last_bits, rel = _l04_fold_truth()
    s = field_of(answer, "multiplies_saved_per_token", int)
    if s != saved:
        raise Wrong(tr(f"not {s}: compare the per-token line of segment 2 before and after (the per-block line does not change)",
                       f"不是 {s}：对比 segment 2 里每 token 那一行改之前和改之后（每块那一行没有变）"))
    b = field_of(answer, "scores_change_only_in_last_bits", bool)
    if b != last_bits:
        raise Wrong(tr(f"the folded kernel's scores differ from the original's by at most {rel:.1e} relative",
                       f"合并后内核的分数与原来相比，相对差至多 {rel:.1e}"))
    return tr(f"{saved} multiply per token saved; the scores change by at most {rel:.1e} relative: the same "
              "product, rounded in another order",
              f"每个 token 省 {saved} 次乘法；分数的相对变化至多 {rel:.1e}：同样的乘积，只是舍入顺序不同")


ex04_3 = Exercise(
    lesson="04", name="fold_scale",
    title=Text("exercise 3: fold scale into qsc", "练习 3：把 scale 并进 qsc"),
    question=Text(
        "Fold the multiply by scale into Q's block scales, in YOUR copy of the kernel (never in "
        "native/).\n"
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
    template={"multiplies_saved_per_token": ..., "scores_change_only_in_last_bits": ...}, check=_l04_fold,
    solution=_l04_fold_truth,
    hint=Text("the multiply by scale moves from the token loop into segment 1 (4 blocks, once per call); float32 "
              "multiplication is not associative, so (a * b) * c and a * (b * c) may round differently.",
              "乘 scale 从 token 循环移到了 segment 1（4 个块，每次调用一次）；float32 乘法不满足结合律，"
              "所以 (a * b) * c 和 a * (b * c) 的舍入可能不同。"))

register(__name__, [ex04_1, ex04_2, ex04_3])
