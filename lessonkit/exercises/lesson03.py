"""The exercises of lesson 03."""
from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

from .. import layout, native, source
from ..kernels.attention import attend
from ..language import Text, tr
from ..quant import quantize_kv_rows
from .core import Exercise, Field, Wrong, close, field_of, lesson00_data, make_cache, register, whole


@functools.lru_cache(maxsize=None)
def _address_facts():
    """Block and offset from where the compiled kernel read (its trace, on a real 40-token cache of
    8 kv heads of 128, kv_bs 16); the scale indices from the layout arithmetic, checked against that
    cache's scale array."""
    t, kh, nkv, hd, kv_bs = 37, 5, 8, 128, 16
    rng = np.random.default_rng(37)
    cache = make_cache(rng.standard_normal((40, nkv, hd), dtype=np.float32),
                       rng.standard_normal((40, nkv, hd), dtype=np.float32), kv_bs)
    _, trace = attend(rng.standard_normal(hd).astype(np.float32), cache, kh, trace=True)
    blocks, offsets = layout.kernel_reads(trace.k_rows, cache, "k")
    w = layout.locate(t, kh, kv_bs, nkv, hd)
    ffi = native.load()[0]
    kscale = cache.kernel_args(kh, ffi)[2]                       # the pointer the kernel is handed
    k_scale = ffi.cast("const float *", kscale - kh)             # the caller's k_scale
    if not (kscale[w.scale_index] == k_scale[w.flat_scale_index] == cache.k_scales(kh)[t]):
        raise RuntimeError("the scale indices do not find token 37's scale: layout and cache disagree")
    return {"block": int(blocks[t]), "offset": int(offsets[t]), "kscale_index": w.scale_index,
            "k_scale_index": w.flat_scale_index}


def _address_field(key, what: Text) -> Field:
    return Field(int, lambda got, want, **_: tr(f"{key} = {got} is too {'small' if got < want else 'large'}: it is "
                                                f"{what}", f"{key} = {got} 太{'小' if got < want else '大'}了：它是 {what}"))


ex1 = Exercise(
    "address", Text("exercise 1: which address?", "练习 1：哪个地址？"),
    Text("Qwen3-8B's layer cache with kv_bs = 16 (8 kv heads, hd = 128): for the K row of token 37, kv head 5, "
         "give the pointer-table entry (block), the byte offset in that block, the index the kernel uses on "
         "kscale, and the index into the caller's k_scale.",
         "Qwen3-8B 的一层缓存，kv_bs = 16（8 个 kv 头，hd = 128）：对 token 37、kv 头 5 的 K 行，给出块指针表的"
         "表项（block）、在该块内的字节偏移（offset）、内核在 kscale 上用的下标（kscale_index），以及调用方 "
         "k_scale 里的下标（k_scale_index）。"),
    facts=_address_facts,
    fields={"block": _address_field("block", Text("t / kv_bs", "t / kv_bs")),
            "offset": _address_field("offset", Text("(t % kv_bs) * kv_dim + kh * hd, in bytes",
                                                    "(t % kv_bs) * kv_dim + kh * hd，以字节计")),
            "kscale_index": _address_field("kscale_index", Text("t * nkv (the caller already added kh)",
                                                                "t * nkv（调用方已经加上了 kh）")),
            "k_scale_index": _address_field("k_scale_index", Text("t * nkv + kh, counted from k_scale itself",
                                                                  "t * nkv + kh，从 k_scale 本身数起"))},
    correct=Text("block {block}, offset {offset} bytes, kscale[{kscale_index}] = k_scale[{k_scale_index}]: the "
                 "compiled kernel read exactly there",
                 "块 {block}，偏移 {offset} 字节，kscale[{kscale_index}] = k_scale[{k_scale_index}]：编译后的内核正是"
                 "从这里读的"),
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
def _per_head_facts():
    K = l03_loud_head_K()
    T, nkv, hd = K.shape
    cache, quiet = make_cache(K, K, 64), [h for h in range(nkv) if h != 3]
    per_head = np.sqrt(np.mean([(cache.dequantized(h)[0] - K[:, h]) ** 2 for h in quiet]))
    codes, scales = quantize_kv_rows(K.reshape(T, -1))
    single = (codes.astype(np.float32) * (scales[:, None] / 127)).reshape(T, nkv, hd)
    single_err = np.sqrt(np.mean((single[:, quiet] - K[:, quiet]) ** 2))
    return {"bytes_saved_per_token": 2 * 4 * nkv - 2 * 4, "stored": 2 * 4 * nkv,   # K and V scales per token
            "quiet_error_ratio": float(single_err / per_head),
            "lines": sorted([source.find_line("kscale[(size_t)t * nkv]", segment=2),
                             source.find_line("vscale[(size_t)t * nkv]", segment=3)])}


ex2 = Exercise(
    "per_head", Text("exercise 2: why per (token, head)?", "练习 2：为什么每 (token, 头) 一个 scale？"),
    Text("K = ex.lesson03.l03_loud_head_K() holds K for 256 tokens, 8 kv heads of 128; kv head 3 is ten "
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
         "  quiet_error_ratio（一个数）：每行一个 scale 时其余 7 个正常头（kv 头 3 以外）的 RMS 误差，除以它们在真实缓存"
         "里的 RMS 误差。每行一个 scale：from lessonkit.quant import quantize_kv_rows；"
         "codes, scales = quantize_kv_rows(K.reshape(len(K), -1))；value = code * scale / 127。真实缓存："
         "c = lk.KVCacheQ8(8, 128, 64)；c.append(K, K)；c.dequantized(h)[0] 是头 h 的 K。\n"
         "  lines（两个整数）：内核里要改的那两行，行号按第 2 节列出的为准。"),
    facts=_per_head_facts, template={"bytes_saved_per_token": ..., "quiet_error_ratio": ..., "lines": [..., ...]},
    fields={"bytes_saved_per_token": Field(int, Text(
                "not {got}: per (token, kv head) a layer stores {stored} bytes of K and V scales per token; with one "
                "scale per token row it would store 8",
                "不是 {got}：按每 (token, kv 头) 一个 scale，一层每个 token 存 {stored} 字节的 K 和 V scale；"
                "若每个 token 行只有一个 scale，就只存 8 字节")),
            "quiet_error_ratio": Field(float, lambda got, want, **_: tr(
                f"the quiet heads' error grows by a factor {'larger' if want > got else 'smaller'} than {got:.2g} "
                "(RMS over the 7 quiet heads: one scale per row / one per (token, head))",
                f"正常头的误差增大的倍数{'大于' if want > got else '小于'} {got:.2g}"
                "（7 个正常头上的 RMS：每行一个 scale / 每 (token, 头) 一个 scale）"), rtol=0.15),
            "lines": Field(list, Text(
                "lines {got} are not the two that would change: the ones that read K's and V's scale (their index "
                "t * nkv would become t)",
                "第 {got} 行不是要改的那两行：要改的是读 K 和 V 的 scale 的两行（它们的下标 t * nkv 会变成 t）"))},
    correct=Text("{bytes_saved_per_token} bytes saved per token and layer, for a {quiet_error_ratio:.1f}x larger error "
                 "on every quiet head; lines {lines} would read the scale at index t instead of t * nkv",
                 "每个 token、每层省下 {bytes_saved_per_token} 字节，代价是每个正常头的误差变成 {quiet_error_ratio:.1f} "
                 "倍；第 {lines} 行会改为在下标 t 而不是 t * nkv 处读 scale"),
    hint=Text("scales: 2 (K, V) x 4 bytes x nkv per token; the loud head sets the max of the whole row; "
              "the lines read K's and V's scale at index t * nkv "
              "(source.find_line('kscale[(size_t)t * nkv]', segment=2) and its V twin in segment 3).",
              "scale：每个 token 2（K、V）x 4 字节 x nkv；数值大的那个头（kv 头 3）决定整行的 max；"
              "要改的两行在下标 t * nkv 处读 K 和 V 的 scale（source.find_line('kscale[(size_t)t * nkv]', segment=2)，"
              "以及 segment 3 里对应的 V 那一行）。"))

KV_BS = (16, 64, 256, 4096)


@functools.lru_cache(maxsize=None)
def _kv_bs_facts():
    T = np.arange(1, 32768 + 1)
    K, V, q, kh = lesson00_data()
    outs = [attend(q, make_cache(K[:200], V[:200], bs), kh).tobytes() for bs in (1, 4096)]
    return {"avg_waste_bytes": {bs: float(np.mean((-T) % bs) * 2 * 8 * 128) for bs in KV_BS},  # unused rows x K+V
            "pointer_entries_kv_bs1": 32768, "output_changes": outs[0] != outs[1]}   # kv_bs 1: a block per token


def _kv_bs(answer, facts):
    got, waste = field_of(answer, "avg_waste_bytes"), facts["avg_waste_bytes"]
    if not isinstance(got, Mapping) or len(got) > 4 * len(KV_BS):
        raise Wrong(tr("'avg_waste_bytes' is a dict {16: ..., 64: ..., 256: ..., 4096: ...}",
                       "'avg_waste_bytes' 应是一个 dict {16: ..., 64: ..., 256: ..., 4096: ...}"))
    by_size = {whole(k, "a kv_bs key") if isinstance(k, str) else k: x for k, x in got.items()}
    for bs in KV_BS:
        v = field_of(by_size, bs, float)
        if not close(v, waste[bs], 0.01):
            raise Wrong(tr(f"kv_bs = {bs}: the average waste is {'more' if waste[bs] > v else 'less'} than {v:.0f} "
                           "bytes (unused rows of the last block x kv_dim x 2 for K and V, averaged over T = 1..32768)",
                           f"kv_bs = {bs}：平均浪费{'多于' if waste[bs] > v else '少于'} {v:.0f} 字节"
                           "（最后一块的未用行数 x kv_dim x 2（K 和 V），对 T = 1..32768 取平均）"))
    return tr(f"average waste {', '.join(f'{bs}: {waste[bs]:.0f} B' for bs in KV_BS)}; "
              f"{facts['pointer_entries_kv_bs1']} entries (x 8 bytes, per table) with kv_bs = 1; the output "
              f"{'changes' if facts['output_changes'] else 'does not change'}",
              f"平均浪费 {', '.join(f'{bs}: {waste[bs]:.0f} B' for bs in KV_BS)}；kv_bs = 1 时 "
              f"{facts['pointer_entries_kv_bs1']} 个表项（每个表，每项 8 字节）；输出"
              f"{'会变' if facts['output_changes'] else '不变'}")


ex3 = Exercise(
    "kv_bs", Text("exercise 3: what kv_bs costs", "练习 3：kv_bs 的代价"),
    Text("Qwen3-8B (8 kv heads, hd 128), one layer, context length uniform in 1..32768: average bytes of K+V "
         "codes in the unused rows of the last block, for kv_bs = 16, 64, 256, 4096? Entries of a pointer table "
         "with kv_bs = 1 at 32768 tokens? Does kv_bs change the kernel's output?",
         "Qwen3-8B（8 个 kv 头，hd 128），一层，上下文长度在 1..32768 上均匀分布：kv_bs = 16、64、256、4096 时，"
         "最后一块未用的行里平均有多少字节的 K+V 码？kv_bs = 1、32768 个 token 时块指针表有多少个表项？"
         "kv_bs 会改变内核的输出吗？"),
    facts=_kv_bs_facts, check=_kv_bs,
    template={"avg_waste_bytes": {16: ..., 64: ..., 256: ..., 4096: ...}, "pointer_entries_kv_bs1": ...,
              "output_changes": ...},
    fields={"pointer_entries_kv_bs1": Field(int, Text(
                "with kv_bs = 1 at 32768 tokens a pointer table has one entry per block: not {got}",
                "kv_bs = 1、32768 个 token 时，块指针表每块一个表项：不是 {got}")),
            "output_changes": Field(bool, Text(
                "run the kernel on the same data with two block sizes and compare the bytes of the outputs",
                "用两种块大小在同一份数据上跑内核，逐字节比较输出"))},
    hint=Text("unused rows = (-T) % kv_bs; average over every T with numpy; one byte per value, K and V.",
              "未用行数 = (-T) % kv_bs；用 numpy 对每个 T 取平均；每个值一个字节，K 和 V 都要算。"))

register(__name__, [ex1, ex2, ex3])
