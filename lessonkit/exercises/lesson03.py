"""The exercises of lesson 03."""
from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

from .. import layout, native, source
from ..kernels.attention import attend
from ..language import N_, _
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
    unused, trace = attend(rng.standard_normal(hd).astype(np.float32), cache, kh, trace=True)
    blocks, offsets = layout.kernel_reads(trace.k_rows, cache, "k")
    w = layout.locate(t, kh, kv_bs, nkv, hd)
    ffi = native.load()[0]
    kscale = cache.kernel_args(kh, ffi)[2]                       # the pointer the kernel is handed
    k_scale = ffi.cast("const float *", kscale - kh)             # the caller's k_scale
    if not (kscale[w.scale_index] == k_scale[w.flat_scale_index] == cache.k_scales(kh)[t]):
        raise RuntimeError("the scale indices do not find token 37's scale: layout and cache disagree")
    return {"block": int(blocks[t]), "offset": int(offsets[t]), "kscale_index": w.scale_index,
            "k_scale_index": w.flat_scale_index}


def _address_field(key, what: N_) -> Field:
    return Field(int, lambda got, want, **unused: _("{key} = {got} is too {got_want}: it is {what}").format(
                                               key=key, got=got, got_want=_('small') if got < want else _('large'),
                                               what=what))


ex1 = Exercise(
    "address", N_("exercise 1: which address?"),
    N_("Qwen3-8B's layer cache with kv_bs = 16 (8 kv heads, hd = 128): for the K row of token 37, kv head 5, give "
       "the pointer-table entry (block), the byte offset in that block, the index the kernel uses on kscale, and "
       "the index into the caller's k_scale."),
    facts=_address_facts,
    fields={"block": _address_field("block", N_("t / kv_bs")),
            "offset": _address_field("offset", N_("(t % kv_bs) * kv_dim + kh * hd, in bytes")),
            "kscale_index": _address_field("kscale_index", N_("t * nkv (the caller already added kh)")),
            "k_scale_index": _address_field("k_scale_index", N_("t * nkv + kh, counted from k_scale itself"))},
    correct=N_("block {block}, offset {offset} bytes, kscale[{kscale_index}] = k_scale[{k_scale_index}]: the "
               "compiled kernel read exactly there"),
    hint=N_("layout.locate(37, 5, 16, 8, 128) gives the arithmetic; the check reads the address the compiled "
            "kernel actually used (trace.k_rows) on a real 40-token cache."))


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
    "per_head", N_("exercise 2: why per (token, head)?"),
    N_("K = ex.lesson03.l03_loud_head_K() holds K for 256 tokens, 8 kv heads of 128; kv head 3 is ten times larger "
       "than the others. Suppose the cache kept one scale per token row (all 1024 values) instead of one per "
       "(token, kv head).\n  bytes_saved_per_token (a whole number): bytes of K and V scales saved per token and "
       "layer.\n  quiet_error_ratio (a number): the RMS error of the 7 quiet heads with one scale per row, divided "
       "by their RMS error in the real cache. One scale per row: from lessonkit.quant import quantize_kv_rows; "
       "codes, scales = quantize_kv_rows(K.reshape(len(K), -1)); value = code * scale / 127. The real cache: c = "
       "lk.KVCacheQ8(8, 128, 64); c.append(K, K); c.dequantized(h)[0] is head h's K.\n  lines (two whole numbers): "
       "the two kernel lines, as numbered in section 2's listing, that would change."),
    facts=_per_head_facts, template={"bytes_saved_per_token": ..., "quiet_error_ratio": ..., "lines": [..., ...]},
    fields={"bytes_saved_per_token": Field(int, N_("not {got}: per (token, kv head) a layer stores {stored} bytes "
                                                   "of K and V scales per token; with one scale per token row it "
                                                   "would store 8")),
            "quiet_error_ratio": Field(float, lambda got, want, **unused: _("the quiet heads' error grows by a factor "
                    "{want_got} than {got:.2g} (RMS over the 7 quiet heads: one scale per row / one per (token, "
                    "head))").format(want_got=_('larger') if want > got else _('smaller'), got=got), rtol=0.15),
            "lines": Field(list, N_("lines {got} are not the two that would change: the ones that read K's and V's "
                                    "scale (their index t * nkv would become t)"))},
    correct=N_("{bytes_saved_per_token} bytes saved per token and layer, for a {quiet_error_ratio:.1f}x larger "
               "error on every quiet head; lines {lines} would read the scale at index t instead of t * nkv"),
    hint=N_("scales: 2 (K, V) x 4 bytes x nkv per token; the loud head sets the max of the whole row; the lines "
            "read K's and V's scale at index t * nkv (source.find_line('kscale[(size_t)t * nkv]', segment=2) and "
            "its V twin in segment 3)."))

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
        raise Wrong(_("'avg_waste_bytes' is a dict {16: ..., 64: ..., 256: ..., 4096: ...}"))
    by_size = {whole(k, "a kv_bs key") if isinstance(k, str) else k: x for k, x in got.items()}
    for bs in KV_BS:
        v = field_of(by_size, bs, float)
        if not close(v, waste[bs], 0.01):
            raise Wrong(_("kv_bs = {bs}: the average waste is {v_waste_bs} than {v:.0f} bytes (unused rows of the "
                          "last block x kv_dim x 2 for K and V, averaged over T = 1..32768)").format(
                          bs=bs, v_waste_bs=_('more') if waste[bs] > v else _('less'), v=v))
    return _("average waste {bs_kv_bs_waste}; {facts} entries (x 8 bytes, per table) with kv_bs = 1; the output "
             "{facts2}").format(
             bs_kv_bs_waste=', '.join((f'{bs}: {waste[bs]:.0f} B' for bs in KV_BS)),
             facts=facts['pointer_entries_kv_bs1'],
             facts2=_('changes') if facts['output_changes'] else _('does not change'))


ex3 = Exercise(
    "kv_bs", N_("exercise 3: what kv_bs costs"),
    N_("Qwen3-8B (8 kv heads, hd 128), one layer, context length uniform in 1..32768: average bytes of K+V codes "
       "in the unused rows of the last block, for kv_bs = 16, 64, 256, 4096? Entries of a pointer table with kv_bs "
       "= 1 at 32768 tokens? Does kv_bs change the kernel's output?"),
    facts=_kv_bs_facts, check=_kv_bs,
    template={"avg_waste_bytes": {16: ..., 64: ..., 256: ..., 4096: ...}, "pointer_entries_kv_bs1": ...,
              "output_changes": ...},
    fields={"pointer_entries_kv_bs1": Field(int, N_("with kv_bs = 1 at 32768 tokens a pointer table has one entry "
                                                    "per block: not {got}")),
            "output_changes": Field(bool, N_("run the kernel on the same data with two block sizes and compare the "
                                             "bytes of the outputs"))},
    hint=N_("unused rows = (-T) % kv_bs; average over every T with numpy; one byte per value, K and V."))

register(__name__, [ex1, ex2, ex3])
