"""The exercises of lesson 00."""
from __future__ import annotations

import functools

import numpy as np

from .. import native
from ..kernels.attention import attend
from ..language import Text, tr
from ..validate import short
from .core import (Choice, Exercise, Field, Wrong, field_of, items_of, kernel_q_codes, lesson00_data, make_cache,
                   register)

ARG_NAMES = ("k_cache_q8", "v_cache_q8", "kscale", "vscale", "seq_len", "kv_dim", "kv_bs", "nkv", "kh_off")
BACKENDS = ("neon", "scalar", "numpy")


@functools.lru_cache(maxsize=None)
def _block_size_facts():
    K, V, q, kh = lesson00_data()
    ffi, _ = native.load()
    caches = [make_cache(K, V, bs) for bs in (64, 1, 7, 1000)]
    outs = [attend(q, c, kh).tobytes() for c in caches]
    changed, base = set(), caches[0].kernel_args(kh, ffi)
    for c in caches[1:]:
        for name, a, b in zip(ARG_NAMES, base, c.kernel_args(kh, ffi)):
            if name in ("k_cache_q8", "v_cache_q8"):
                if caches[0].n_blocks != c.n_blocks:
                    changed.add(name)   # another number of blocks behind the table
            elif name in ("kscale", "vscale"):
                if any(a[t * c.n_kv_heads] != b[t * c.n_kv_heads] for t in range(0, c.seq_len, 97)):
                    changed.add(name)   # what the kernel reads through the pointer
            elif a != b:
                changed.add(name)
    return {"bit_identical": all(o == outs[0] for o in outs), "changed": sorted(changed)}


def _block_size(answer, facts):
    names = {(n if isinstance(n, str) else short(n)).strip() for n in items_of(answer, "changed", 4 * len(ARG_NAMES))}
    changed = set(facts["changed"])
    if names - set(ARG_NAMES):
        raise Wrong(tr(f"{sorted(names - set(ARG_NAMES))} are not arguments of the kernel; its cache arguments are "
                       f"{', '.join(ARG_NAMES)}",
                       f"{sorted(names - set(ARG_NAMES))} 不是内核的参数；与缓存有关的参数是 {', '.join(ARG_NAMES)}"))
    extra = sorted(names - changed)
    if extra and set(extra) & {"kscale", "vscale"}:
        raise Wrong(tr(f"{extra} did not change: the kernel reads the same values through them (the scale of token "
                       "t, head kh is still at kscale[t * nkv])",
                       f"{extra} 没有变：内核通过它们读到的值还是一样的（token t、头 kh 的 scale 仍在 kscale[t * nkv]）"))
    if extra:
        raise Wrong(tr(f"{extra} did not change: the kernel reads the same values through them in every cache",
                       f"{extra} 没有变：在每个缓存里，内核通过它们读到的值都一样"))
    if changed - names:
        raise Wrong(tr(f"you missed {sorted(changed - names)}: compare cache.kernel_args(kh, ffi) of two caches",
                       f"漏掉了 {sorted(changed - names)}：比较两个缓存的 cache.kernel_args(kh, ffi)"))
    same = facts["bit_identical"]
    return tr(f"the outputs are {'bit-identical' if same else 'not identical'}; only {sorted(changed)} changed: "
              "which block a token sits in changes where it is read, not what is computed with it",
              f"输出{'逐位相同' if same else '并不相同'}；只有 {sorted(changed)} 变了："
              "token 落在哪一块，只改变从哪里读它，不改变用它算什么")


ex1 = Exercise(
    "block_size", Text("exercise 1: does the block size matter?", "练习 1：块大小有影响吗？"),
    Text("Lesson 00's cache (seed 0, 1000 tokens, kv head 3) built with block_size 1, 7 and 1000: are the kernel's "
         "outputs equal bit for bit to the block_size-64 output? Which kernel arguments changed "
         f"(names from {', '.join(ARG_NAMES)})? Fields: bit_identical is True or False; changed is a list of "
         "argument names (strings).",
         "用 block_size 1、7 和 1000 重建第 00 课的缓存（种子 0，1000 个 token，kv 头 3）：内核的输出与 block_size 64 "
         f"的输出逐位相等吗？内核的哪些参数变了（从 {', '.join(ARG_NAMES)} 里选）？字段：bit_identical 是 True 或 "
         "False；changed 是参数名（字符串）的列表。"),
    facts=_block_size_facts, template={"bit_identical": ..., "changed": ...}, check=_block_size,
    fields={"bit_identical": Field(bool, (  # (the truth is True, the truth is False)
        Text("run it: the outputs with block sizes 1, 7 and 1000 are equal bit for bit on this machine",
             "跑一下看看：在这台机器上，块大小 1、7 和 1000 的输出逐位相等"),
        Text("run it: the outputs with block sizes 1, 7 and 1000 are not all equal bit for bit on this machine",
             "跑一下看看：在这台机器上，块大小 1、7 和 1000 的输出并不全都逐位相等")))},
    hint=Text("compare out.tobytes() of the calls; then print cache.kernel_args(3, ffi) for two block sizes: the "
              "pointer tables have a different number of entries, kv_bs differs, the scales sit at the same indices.",
              "比较各次调用的 out.tobytes()；再打印两种块大小下的 cache.kernel_args(3, ffi)：指针表的项数不同，"
              "kv_bs 不同，scale 仍在相同的下标上。"),
    explain=Text("The kernel computes token t's score and weight from its K/V row and scales only; kv_bs and the "
                 "tables only say where that row is. The token order, and so every float32 rounding, stays the same.",
                 "内核只用 token t 的 K/V 行和 scale 来算它的分数和权重；kv_bs 和指针表只说明这一行在哪里。"
                 "token 的顺序不变，所以每一次 float32 舍入也都不变。"))


@functools.lru_cache(maxsize=None)
def _backends_facts():
    K, V, q, kh = lesson00_data()
    cache = make_cache(K, V, 64)
    outs = {b: attend(q, cache, kh, backend=b) for b in BACKENDS}
    pairs = [(a, b) for i, a in enumerate(BACKENDS) for b in BACKENDS[i + 1:]]
    return {"exact_pairs": [tuple(sorted(p)) for p in pairs if outs[p[0]].tobytes() == outs[p[1]].tobytes()],
            "largest_difference": max(float(np.abs(outs[a] - outs[b]).max()) for a, b in pairs)}


def _backends(answer, facts):
    exact, largest = {frozenset(p) for p in facts["exact_pairs"]}, facts["largest_difference"]
    pairs = items_of(answer, "exact_pairs", 16)
    if not all(isinstance(p, (list, tuple, set, frozenset)) and len(p) <= 4 for p in pairs):
        raise Wrong(tr("'exact_pairs' is a list of pairs such as [('neon', 'scalar')] (or [] if none)",
                       "'exact_pairs' 是若干对的列表，例如 [('neon', 'scalar')]（一对都没有就写 []）"))
    got = {frozenset(x if isinstance(x, str) else short(x) for x in p) for p in pairs}
    bad = sorted(sorted(p) for p in got if len(p) != 2 or not p <= set(BACKENDS))
    if bad:
        raise Wrong(tr(f"{bad}: each pair names two different backends of {BACKENDS}",
                       f"{bad}：每一对要写 {BACKENDS} 中两个不同的后端"))
    if got - exact:
        raise Wrong(tr(f"{sorted(sorted(p) for p in got - exact)} differ on this machine: compare with np.array_equal",
                       f"{sorted(sorted(p) for p in got - exact)} 在这台机器上并不相同：用 np.array_equal 比较"))
    if exact - got:
        raise Wrong(tr(f"{sorted(sorted(p) for p in exact - got)} agree bit for bit on this machine too",
                       f"{sorted(sorted(p) for p in exact - got)} 在这台机器上也逐位一致"))
    d = field_of(answer, "largest_difference", float)
    if not (largest / 3 <= d <= largest * 3):
        raise Wrong(tr(f"the largest |difference| between two backends is not {d:.1e}: it is within a factor 3 of "
                       "something else (print np.abs(a - b).max() for the three pairs)",
                       f"两个后端之间最大的 |差| 不是 {d:.1e}：真实值与它相差 3 倍以上"
                       "（对三对后端分别打印 np.abs(a - b).max()）"))
    return tr(f"bit-identical pairs here: {sorted(sorted(p) for p in exact) or 'none'}; the others differ by up to "
              f"{largest:.1e}, float32 rounding (fused multiply-add, order of the sums)",
              f"这里逐位相同的对：{sorted(sorted(p) for p in exact) or '没有'}；其余的最多相差 "
              f"{largest:.1e}，这是 float32 的舍入（融合乘加、求和的顺序）")


ex2 = Exercise(
    "backends", Text("exercise 2: three backends", "练习 2：三个后端"),
    Text("Lesson 00's cache and query: which pairs of lk.attend(q, cache, 3, backend=b) for b in 'neon', 'scalar', "
         "'numpy' agree bit for bit on your machine, and what is the largest |difference| between any two of them "
         "(order of magnitude is enough)? Fields: exact_pairs is a list of tuples of two backend names, like "
         "[('numpy', 'scalar')], or [] if none; largest_difference is a number, like 1e-3.",
         "用第 00 课的缓存和 query：b 取 'neon'、'scalar'、'numpy' 时，lk.attend(q, cache, 3, backend=b) "
         "的哪几对结果在你的机器上逐位一致？任意两个之间最大的 |差| 是多少（数量级对就行）？"
         "字段：exact_pairs 是由两个后端名组成的元组的列表，例如 [('numpy', 'scalar')]，一对都没有就写 []；"
         "largest_difference 是一个数，例如 1e-3。"),
    facts=_backends_facts, template={"exact_pairs": ..., "largest_difference": ...}, check=_backends,
    solution=lambda f: {**f, "largest_difference": float(f"{f['largest_difference']:.2g}")},
    hint=Text("np.array_equal(a, b) for each of the 3 pairs; np.abs(a - b).max() for the size. The numpy backend "
              "sums the softmax in float64, the C ones in float32; SIMDe may fuse multiply and add.",
              "对 3 对后端分别用 np.array_equal(a, b) 判断；用 np.abs(a - b).max() 看差多大。numpy 后端用 float64 "
              "求 softmax 的和，C 后端用 float32；SIMDe 可能把乘法和加法融合成一条指令。"))

GUARD_CHOICES = {
    "a": Choice(Text("iq = 127/0 = inf, and 0 * inf = NaN: C's cast of NaN to int is undefined",
                     "iq = 127/0 = inf，而 0 * inf = NaN：C 把 NaN 强制转换成 int 是未定义行为"),
                Text("right: IEEE float division by zero gives inf, 0 * inf gives NaN, and C leaves the cast of NaN "
                     "to int undefined (x86 gives INT_MIN, AArch64 gives 0)",
                     "对：IEEE 浮点除以零得 inf，0 * inf 得 NaN，而 C 没有规定 NaN 转成 int 的结果"
                     "（x86 上得 INT_MIN，AArch64 上得 0）")),
    "b": Choice(Text("nothing: every value is 0, so every code is 0 with or without the guard",
                     "什么也不会发生：每个值都是 0，所以有没有这道保护，编码都是 0"),
                Text("no: 0 * 127/0 is not 0 but NaN in IEEE arithmetic; the guard is what makes the codes 0",
                     "不对：按 IEEE 算术，0 * 127/0 不是 0 而是 NaN；正是这道保护让编码成为 0")),
    "c": Choice(Text("the program stops at once: dividing by zero raises the signal SIGFPE",
                     "程序立刻停下：除以零会触发信号 SIGFPE"),
                Text("no: float division by zero does not trap by default; it returns inf (only integer division "
                     "traps)",
                     "不对：浮点除以零默认不会触发异常，它返回 inf（只有整数除以零才会触发）")),
    "d": Choice(Text("qsc[0] = 0, so the block adds 0 to every score, which is harmless",
                     "qsc[0] = 0，于是这一块给每个分数加 0，没有害处"),
                Text("no: qsc[b] = 0 would be harmless, but the codes are computed with iq = 127/qm = inf first",
                     "不对：qsc[b] = 0 本身无害，但编码是先用 iq = 127/qm = inf 算出来的")),
}


def _guard_facts():
    with np.errstate(divide="ignore", invalid="ignore"):
        nan = bool(np.isnan(np.float32(0) * (np.float32(127) / np.float32(0))))
    q = lesson00_data()[2].copy()
    q[:32] = 0
    codes, scales = kernel_q_codes(q)
    return {"qsc0": float(scales[0]), "zeros": bool((codes[:32] == 0).all()), "without_guard": "a" if nan else "b"}


ex3 = Exercise(
    "silent_block", Text("exercise 3: a silent block", "练习 3：一个全零块"),
    Text("The kernel's first step (segment 1) cuts q into blocks of 32 values. For each block it takes "
         "qm = max|q_i|, stores the block scale qsc = qm / 127, and multiplies every value by iq = 127 / qm. The line "
         "`if (qm < 1e-6f) qm = 1.0f;` (the guard) runs before that. Set q[:32] = 0 in lesson 00's query. "
         "(1) What qsc[0] does the kernel store? The traced build records it: run "
         "`_, tr = lk.attend(q, cache, 3, trace=True)` and read tr.q_scales[0]. (2) Without the guard, what would "
         "happen in that block? Fields: qsc0 is a number; without_guard is a letter.",
         "内核的第一步（segment 1，即文章的段1）把 q 切成每块 32 个值。对每一块，它取 qm = max|q_i|，存下块 scale "
         "qsc = qm / 127，再把每个值乘以 iq = 127 / qm。在这之前先执行 `if (qm < 1e-6f) qm = 1.0f;` 这一行（保护）。"
         "把第 00 课的 query 设成 q[:32] = 0。(1) 内核存下的 qsc[0] 是多少？跟踪构建会记录它：运行 "
         "`_, tr = lk.attend(q, cache, 3, trace=True)`，读 tr.q_scales[0]。(2) 如果没有这道保护，这一块会发生什么？"
         "字段：qsc0 是一个数；without_guard 是一个字母。"),
    facts=_guard_facts,
    fields={"qsc0": Field(float, Text(
                "the kernel's qsc[0] for the zero block is not {got!r}: read it from "
                "lk.attend(q, cache, kh, trace=True)[1].q_scales[0] (the guard sets qm to 1)",
                "对这个全零块，内核的 qsc[0] 不是 {got!r}：从 "
                "lk.attend(q, cache, kh, trace=True)[1].q_scales[0] 读出来（保护把 qm 设成 1）"), rtol=1e-6),
            "without_guard": Field(GUARD_CHOICES)},
    correct=Text("qsc[0] = 1/127 = {qsc0:.6f}, codes all 0: {zeros}. {why}",
                 "qsc[0] = 1/127 = {qsc0:.6f}，编码全为 0：{zeros}。{why}"),
    hint=Text("trace.q_scales[0]; for the second part, do the float32 arithmetic of segment 1 with qm = 0 in numpy "
              "(np.float32(127) / np.float32(0), then times 0).",
              "读 trace.q_scales[0]；第二问，在 numpy 里用 qm = 0 做一遍 segment 1 的 float32 运算"
              "（先 np.float32(127) / np.float32(0)，再乘以 0）。"))

register(__name__, [ex1, ex2, ex3])
