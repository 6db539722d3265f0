"""The exercises of lesson 03."""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import numpy as np

from .. import layout
from .. import native
from .. import source
from ..kernels.attention import attend
from ..quant import quantize_kv_rows
from ..language import Text, tr
from .core import (register, Wrong, items_of, whole, field_of, close, Exercise, lesson00_data, make_cache)

L03_CASE = dict(t=37, kv_head=5, kv_bs=16, n_kv_heads=8, head_dim=128)


@functools.lru_cache(maxsize=None)
def _l03_address_truth():
    """Block and offset from where the compiled kernel read (its trace, on a real 40-token cache);
    the scale indices from the layout arithmetic, checked against that cache's scale array."""
    c = L03_CASE
    t, kh, nkv = c["t"], c["kv_head"], c["n_kv_heads"]
    rng = np.random.default_rng(37)
    cache = make_cache(rng.standard_normal((40, nkv, c["head_dim"]), dtype=np.float32),
                   rng.standard_normal((40, nkv, c["head_dim"]), dtype=np.float32), c["kv_bs"])
    q = rng.standard_normal(c["head_dim"]).astype(np.float32)
    _, trc = attend(q, cache, kh, trace=True)
    blocks, offsets = layout.kernel_reads(trc.k_rows, cache, "k")
    w = layout.locate(t, kh, c["kv_bs"], nkv, c["head_dim"])
    ffi = native.load()[0]
    kscale = cache.kernel_args(kh, ffi)[2]                       # the pointer the kernel is handed
    k_scale = ffi.cast("const float *", kscale - kh)             # the caller's k_scale
    if not (kscale[w.scale_index] == k_scale[w.flat_scale_index] == cache.k_scales(kh)[t]):
        raise RuntimeError("the scale indices do not find token 37's scale: layout and cache disagree")
    return {"block": int(blocks[t]), "offset": int(offsets[t]), "kscale_index": w.scale_index,
            "k_scale_index": w.flat_scale_index}


def _l03_address(answer):
    truth = _l03_address_truth()
    for key, what in (("block", "t / kv_bs"),
                      ("offset", tr("(t % kv_bs) * kv_dim + kh * hd, in bytes", "(t % kv_bs) * kv_dim + kh * hd，以字节计")),
                      ("kscale_index", tr("t * nkv (the caller already added kh)", "t * nkv（调用方已经加上了 kh）")),
                      ("k_scale_index", tr("t * nkv + kh, counted from k_scale itself", "t * nkv + kh，从 k_scale 本身数起"))):
        got = field_of(answer, key, int)
        if got != truth[key]:
            raise Wrong(tr(f"{key} = {got} is too {'small' if got < truth[key] else 'large'}: it is {what}",
                           f"{key} = {got} 太{'小' if got < truth[key] else '大'}了：它是 {what}"))
    return tr(f"block {truth['block']}, offset {truth['offset']} bytes, kscale[{truth['kscale_index']}] = "
              f"k_scale[{truth['k_scale_index']}]: the compiled kernel read exactly there",
              f"块 {truth['block']}，偏移 {truth['offset']} 字节，kscale[{truth['kscale_index']}] = "
              f"k_scale[{truth['k_scale_index']}]：编译后的内核正是从这里读的")


ex03_1 = Exercise(
    lesson="03", name="address", title=Text("exercise 1: which address?", "练习 1：哪个地址？"),
    question=Text(
        "Qwen3-8B's layer cache with kv_bs = 16 (8 kv heads, hd = 128): for the K row of token 37, kv head 5, "
        "give the pointer-table entry (block), the byte offset in that block, the index the kernel uses on "
        "kscale, and the index into the caller's k_scale.",
        "Qwen3-8B 的一层缓存，kv_bs = 16（8 个 kv 头，hd = 128）：对 token 37、kv 头 5 的 K 行，给出块指针表的"
        "表项（block）、在该块内的字节偏移（offset）、内核在 kscale 上用的下标（kscale_index），以及调用方 "
        "k_scale 里的下标（k_scale_index）。"),
    template={"block": ..., "offset": ..., "kscale_index": ..., "k_scale_index": ...}, check=_l03_address,
    solution=_l03_address_truth,
    hint=Text("layout.locate(37, 5, 16, 8, 128) gives the arithmetic; the check reads the address the compiled "
              "kernel actually used (trace.k_rows) on a real 40-token cache.",
              "layout.locate(37, 5, 16, 8, 128) 会给出这套算术；检查读取的是编译后的内核在一个真实的 40 token "
              "缓存上实际用到的地址（trace.k_rows）。"))


def l03_loud_head_K(T: int = 256, seed: int = 2, loud: int = 3) -> np.ndarray:
    """K for 8 kv heads of 128 where kv head ``loud`` is ten times larger than the others."""
    K = np.random.default_rng(seed).standard_normal((T, 8, 128)).astype(np.float32)
    K[:, loud] *= 10
    return K


@functools.lru_cache(maxsize=None)
def _l03_per_head_truth():
    K = l03_loud_head_K()
    T, nkv, hd = K.shape
    cache = make_cache(K, K, 64)
    quiet = [h for h in range(nkv) if h != 3]
    per_head = np.sqrt(np.mean([(cache.dequantized(h)[0] - K[:, h]) ** 2 for h in quiet]))
    codes, scales = quantize_kv_rows(K.reshape(T, -1))
    single = (codes.astype(np.float32) * (scales[:, None] / 127)).reshape(T, nkv, hd)
    single_err = np.sqrt(np.mean((single[:, quiet] - K[:, quiet]) ** 2))
    per_tok_per_head = 2 * 4 * nkv          # bytes of K and V scales per token, one layer
    saved = per_tok_per_head - 2 * 4
    lines = sorted([source.find_line("kscale[(size_t)t * nkv]", segment=2),
                    source.find_line("vscale[(size_t)t * nkv]", segment=3)])
    return saved, float(single_err / per_head), lines


def _l03_per_head(answer):
    saved, ratio, lines = _l03_per_head_truth()
    b = field_of(answer, "bytes_saved_per_token", int)
    if b != saved:
        raise Wrong(tr(f"not {b}: per (token, kv head) a layer stores {saved + 8} bytes of K and V scales per token; "
                       "with one scale per token row it would store 8",
                       f"不是 {b}：按每 (token, kv 头) 一个 scale，一层每个 token 存 {saved + 8} 字节的 K 和 V scale；"
                       "若每个 token 行只有一个 scale，就只存 8 字节"))
    r = field_of(answer, "quiet_error_ratio", float)
    if not close(r, ratio, 0.15):
        raise Wrong(tr(f"the quiet heads' error grows by a factor {'larger' if ratio > r else 'smaller'} than {r:.2g} "
                       "(RMS over the 7 quiet heads: one scale per row / one per (token, head))",
                       f"正常头的误差增大的倍数{'大于' if ratio > r else '小于'} {r:.2g}"
                       "（7 个正常头上的 RMS：每行一个 scale / 每 (token, 头) 一个 scale）"))
    got = sorted(whole(n, "a line number") for n in items_of(answer, "lines", 64))
    if got != lines:
        raise Wrong(tr(f"lines {got} are not the two that would change: the ones that read K's and V's scale "
                       "(their index t * nkv would become t)",
                       f"第 {got} 行不是要改的那两行：要改的是读 K 和 V 的 scale 的两行（它们的下标 t * nkv 会变成 t）"))
    return tr(f"{saved} bytes saved per token and layer, for a {ratio:.1f}x larger error on every quiet head; "
              f"lines {lines} would read the scale at index t instead of t * nkv",
              f"每个 token、每层省下 {saved} 字节，代价是每个正常头的误差变成 {ratio:.1f} 倍；"
              f"第 {lines} 行会改为在下标 t 而不是 t * nkv 处读 scale")


ex03_2 = Exercise(
    lesson="03", name="per_head", title=Text("exercise 2: why per (token, head)?", "练习 2：为什么每 (token, 头) 一个 scale？"),
    question=Text(
        "K = ex.lesson03.l03_loud_head_K() holds K for 256 tokens, 8 kv heads of 128; kv head 3 is ten "
        "times larger than the others. Suppose the cache kept one scale per token row (all 1024 values) instead of "
        "one per (token, kv head).\n"
        "  bytes_saved_per_token (a whole number): bytes of K and V scales saved per token and layer.\n"
        "  quiet_error_ratio (a number): the RMS error of the 7 quiet heads with one scale per row, divided by "
        "their RMS error in the real cache. One scale per row: from lessonkit.quant import quantize_kv_rows; "
        "codes, scales = quantize_kv_rows(K.reshape(len(K), -1)); value = code * scale / 127. The real cache: "
        "c = lk.KVCacheQ8(8, 128, 64); c.append(K, K); c.dequantized(h)[0] is head h's K.\n"
        "  lines (two whole numbers): the two kernel lines, as numbered in section 2's listing, that would "
        "change.",
        "K = ex.lesson03.l03_loud_head_K() 是 256 个 token、8 个 128 维 kv 头的 K；kv 头 3 比其他头大十倍。"
        "假设缓存每个 token 行（全部 1024 个值）只存一个 scale，而不是每 (token, kv 头) 一个。\n"
        "  bytes_saved_per_token（整数）：每个 token、每层省下多少字节的 K 和 V scale。\n"
        "  quiet_error_ratio（一个数）：每行一个 scale 时其余 7 个正常头（kv 头 3 以外）的 RMS 误差，除以它们在真实缓存里的 RMS 误差。"
        "每行一个 scale：from lessonkit.quant import quantize_kv_rows；"
        "codes, scales = quantize_kv_rows(K.reshape(len(K), -1))；value = code * scale / 127。真实缓存："
        "c = lk.KVCacheQ8(8, 128, 64)；c.append(K, K)；c.dequantized(h)[0] 是头 h 的 K。\n"
        "  lines（两个整数）：内核里要改的那两行，行号按第 2 节列出的为准。"),
    template={"bytes_saved_per_token": ..., "quiet_error_ratio": ..., "lines": [..., ...]}, check=_l03_per_head,
    solution=_l03_per_head_truth,
    hint=Text("scales: 2 (K, V) x 4 bytes x nkv per token; the loud head sets the max of the whole row; "
              "the lines read K's and V's scale at index t * nkv (source.find_line('kscale[(size_t)t * nkv]', segment=2) "
              "and its V twin in segment 3).",
              "scale：每个 token 2（K、V）x 4 字节 x nkv；数值大的那个头（kv 头 3）决定整行的 max；"
              "要改的两行在下标 t * nkv 处读 K 和 V 的 scale（source.find_line('kscale[(size_t)t * nkv]', segment=2)，"
              "以及 segment 3 里对应的 V 那一行）。"))

L03_KV_BS = (16, 64, 256, 4096)


@functools.lru_cache(maxsize=None)
def _l03_kv_bs_truth():
    kv_dim, T_max = 8 * 128, 32768
    T = np.arange(1, T_max + 1)
    waste = {bs: float(np.mean((-T) % bs) * 2 * kv_dim) for bs in L03_KV_BS}   # unused rows x K+V codes
    K, V, q, kh = lesson00_data()
    changes = attend(q, make_cache(K[:200], V[:200], 1), kh).tobytes() != attend(q, make_cache(K[:200], V[:200], 4096), kh).tobytes()
    return waste, math.ceil(T_max / 1), changes   # kv_bs = 1: one block per token


def _l03_kv_bs(answer):
    waste, entries, changes = _l03_kv_bs_truth()
    got = field_of(answer, "avg_waste_bytes")
    if not isinstance(got, Mapping) or len(got) > 4 * len(L03_KV_BS):
        raise Wrong(tr("'avg_waste_bytes' is a dict {16: ..., 64: ..., 256: ..., 4096: ...}",
                       "'avg_waste_bytes' 应是一个 dict {16: ..., 64: ..., 256: ..., 4096: ...}"))
    by_size = {}
    for k, x in got.items():
        by_size[whole(k, "a kv_bs key") if isinstance(k, str) else k] = x
    for bs in L03_KV_BS:
        v = field_of(by_size, bs, float)
        if not close(v, waste[bs], 0.01):
            raise Wrong(tr(f"kv_bs = {bs}: the average waste is {'more' if waste[bs] > v else 'less'} than {v:.0f} "
                           "bytes (unused rows of the last block x kv_dim x 2 for K and V, averaged over T = 1..32768)",
                           f"kv_bs = {bs}：平均浪费{'多于' if waste[bs] > v else '少于'} {v:.0f} 字节"
                           "（最后一块的未用行数 x kv_dim x 2（K 和 V），对 T = 1..32768 取平均）"))
    e = field_of(answer, "pointer_entries_kv_bs1", int)
    if e != entries:
        raise Wrong(tr(f"with kv_bs = 1 at 32768 tokens a pointer table has one entry per block: not {e}",
                       f"kv_bs = 1、32768 个 token 时，块指针表每块一个表项：不是 {e}"))
    c = field_of(answer, "output_changes", bool)
    if c != changes:
        raise Wrong(tr("run the kernel on the same data with two block sizes and compare the bytes of the outputs",
                       "用两种块大小在同一份数据上跑内核，逐字节比较输出"))
    return tr(f"average waste {', '.join(f'{bs}: {waste[bs]:.0f} B' for bs in L03_KV_BS)}; {entries} entries "
              f"(x 8 bytes, per table) with kv_bs = 1; the output {'changes' if changes else 'does not change'}",
              f"平均浪费 {', '.join(f'{bs}: {waste[bs]:.0f} B' for bs in L03_KV_BS)}；kv_bs = 1 时 {entries} 个表项"
              f"（每个表，每项 8 字节）；输出{'会变' if changes else '不变'}")


ex03_3 = Exercise(
    lesson="03", name="kv_bs", title=Text("exercise 3: what kv_bs costs", "练习 3：kv_bs 的代价"),
    question=Text(
        "Qwen3-8B (8 kv heads, hd 128), one layer, context length uniform in 1..32768: average bytes of K+V "
        "codes in the unused rows of the last block, for kv_bs = 16, 64, 256, 4096? Entries of a pointer table "
        "with kv_bs = 1 at 32768 tokens? Does kv_bs change the kernel's output?",
        "Qwen3-8B（8 个 kv 头，hd 128），一层，上下文长度在 1..32768 上均匀分布：kv_bs = 16、64、256、4096 时，"
        "最后一块未用的行里平均有多少字节的 K+V 码？kv_bs = 1、32768 个 token 时块指针表有多少个表项？"
        "kv_bs 会改变内核的输出吗？"),
    template={"avg_waste_bytes": {16: ..., 64: ..., 256: ..., 4096: ...}, "pointer_entries_kv_bs1": ...,
     "output_changes": ...}, check=_l03_kv_bs,
    solution=_l03_kv_bs_truth,
    hint=Text("unused rows = (-T) % kv_bs; average over every T with numpy; one byte per value, K and V.",
              "未用行数 = (-T) % kv_bs；用 numpy 对每个 T 取平均；每个值一个字节，K 和 V 都要算。"))

register(__name__, [ex03_1, ex03_2, ex03_3])
