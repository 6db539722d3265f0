"""The exercises of lesson 03."""
from __future__ import annotations

import functools
import numpy as np

from ..lessons import layout
from ..core import native
from ..display import source
from ..core.attention import attend
from ..core.language import N_, _
from ..core.quant import quantize_kv_rows
from .core import Exercise, Field, make_cache, register


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
       "by their RMS error in the real cache. One scale per row:\n"
       "    from lessonkit.quant import quantize_kv_rows\n"
       "    codes, scales = quantize_kv_rows(K.reshape(len(K), -1))   # one scale per token row\n"
       "    values = (codes * scales[:, None] / 127).reshape(K.shape)  # values[:, h] is head h's K\n"
       "  The real cache:\n"
       "    c = lk.KVCacheQ8(8, 128, 64)\n"
       "    c.append(K, K)   # c.dequantized(h)[0] is head h's K\n"
       "  lines (two whole numbers): the two kernel lines, as numbered in section 2's listing, that would change "
       "(the caller still passes nkv = the number of kv heads)."),
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

ZERO_TOKEN, ZERO_HEAD = 5, 1


def l03_zero_key_data(T: int = 64, seed: int = 53):
    """K, V for 2 kv heads of 32 (T tokens) where token 5's K row of kv head 1 is all zero, and a query."""
    rng = np.random.default_rng(seed)
    K = rng.standard_normal((T, 2, 32), dtype=np.float32)
    V = rng.standard_normal((T, 2, 32), dtype=np.float32)
    K[ZERO_TOKEN, ZERO_HEAD] = 0.0
    return K, V, rng.standard_normal(32, dtype=np.float32)


@functools.lru_cache(maxsize=None)
def _zero_key_facts():
    """From the compiled kernel's trace on the question's cache: the zero row's stored scale and score,
    and its share exp(s - M) / S of the weights with the call's final M and S."""
    K, V, q = l03_zero_key_data()
    cache = make_cache(K, V, 16)
    unused, tr = attend(q, cache, ZERO_HEAD, trace=True)
    t = ZERO_TOKEN
    return {"stored_scale": float(cache.k_scales(ZERO_HEAD)[t]), "score": float(tr.s[t]),
            "weight_share": float(np.exp(np.float64(tr.s[t]) - tr.M[-1]) / tr.S[-1]),
            "uniform": 1 / len(K), "n": len(K)}


ex3 = Exercise(
    "zero_key", N_("exercise 3: a key of zeros"),
    N_("The data: 64 tokens, 2 kv heads of 32, and a query; token 5's K row of kv head 1 is all zero. Build the "
       "cache and call the kernel on kv head 1:\n"
       "    K, V, q = ex.lesson03.l03_zero_key_data()\n"
       "    c = lk.KVCacheQ8(2, 32, 16)\n"
       "    c.append(K, V)\n"
       "    out, tr = lk.attend(q, c, 1, trace=True)   # tr.s[t]: token t's score; tr.M[-1], tr.S[-1]: the final M, S\n"
       "  stored_scale (a number): the K scale the cache stores for that row.\n  score (a number): the kernel's score "
       "for token 5.\n  weight_share (a number): token 5's share of the softmax weights in this call, its weight "
       "divided by the sum of all."),
    facts=_zero_key_facts,
    fields={"stored_scale": Field(float, N_("not {got}: the stored scale is the row's raw max|x|"), atol=0.0),
            "score": Field(float, N_("not {got}: all codes of the row are 0, so every block's int32 dot is 0"),
                           atol=1e-12),
            # the kernel's own S is float32 over 64 terms (relative error ~1e-6); 1e-4 accepts any honest
            # recomputation from tr and rejects a share from the unquantized K (5e-4 off here)
            "weight_share": Field(float, (N_("{got:.3g} is too small: a zero key is not an absent key; its weight is "
                                             "exp(score - M) divided by S"),
                                          N_("{got:.3g} is too large: divide exp(score - M) by the final S")),
                                  rtol=1e-4,
                                  mistakes=((0.0, N_("a zero key is not an absent key: score 0 still gets the weight "
                                                     "exp(0 - M), divided by S")),
                                            (lambda uniform, **unused: uniform,
                                             N_("1/{n} is the share if every score were equal; this token's weight is "
                                                "exp(0 - M) / S with the call's final M and S"))))},
    correct=N_("scale {stored_scale:g}, score {score:g}: the zero row still takes {weight_share:.2%} of the weights "
               "(a missing token would take none)"),
    hint=N_("the guard in kvq8_quant.c writes codes 0; the scale is max|x|. The weight of token t is "
            "exp(tr.s[t] - tr.M[-1]) and the weights sum to tr.S[-1]."),
    explain=N_("Dequantizing is a multiplication, so a zero row needs no guard in the kernel: its score is exactly 0, "
               "and 0 is not minus infinity. To leave a token out, the caller must not pass it (seq_len)."))

register(__name__, [ex1, ex2, ex3])
