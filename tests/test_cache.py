"""KVCacheQ8 holds the kernel's layout exactly: read a token back through the article's arithmetic."""
from __future__ import annotations

import numpy as np
import pytest

import lessonkit as lk
from lessonkit.quant import quantize_kv_rows

from conftest import make_case


def read_token(ffi, ptr_table, scale_ptr, t, kv_bs, kv_dim, nkv, kh_off, hd):
    """Token t through the kernel's own arithmetic: block t / kv_bs, row t % kv_bs, kscale[t * nkv]."""
    row = ptr_table[t // kv_bs] + (t % kv_bs) * kv_dim + kh_off
    return np.array(ffi.unpack(row, hd), np.int8), scale_ptr[t * nkv]


@pytest.mark.parametrize("n_kv_heads,head_dim,block_size,seq_len",
                         [(1, 32, 1, 5), (2, 64, 7, 30), (8, 128, 16, 33), (3, 96, 64, 200)])
def test_layout_read_back(n_kv_heads, head_dim, block_size, seq_len):
    cache, q, K, V = make_case(0, seq_len, n_kv_heads, head_dim, block_size)
    ffi, _ = lk.native.load()
    assert cache.n_blocks == -(-seq_len // block_size)      # grown block by block, no more
    for kh in range(n_kv_heads):
        kptr, vptr, ks, vs, T, kv_dim, kv_bs, nkv, kh_off = cache.kernel_args(kh, ffi)
        assert (T, kv_dim, kv_bs, nkv, kh_off) == (seq_len, n_kv_heads * head_dim, block_size,
                                                   n_kv_heads, kh * head_dim)
        # cffi buffers of exactly what the kernel may read: n_blocks entries, kscale[t * nkv] for t < T
        assert len(kptr) == len(vptr) == cache.n_blocks
        assert len(ks) == len(vs) == T * nkv - kh   # from k_scale + kh to the end of row T - 1
        assert [int(ffi.cast("uintptr_t", kptr[b])) for b in range(cache.n_blocks)] == cache.pointer_table("k").tolist()
        k_codes, k_scales = quantize_kv_rows(np.ascontiguousarray(K[:, kh]))
        v_codes, v_scales = quantize_kv_rows(np.ascontiguousarray(V[:, kh]))
        for t in range(seq_len):
            codes, scale = read_token(ffi, kptr, ks, t, kv_bs, kv_dim, nkv, kh_off, head_dim)
            np.testing.assert_array_equal(codes, k_codes[t])
            assert scale == k_scales[t]
            codes, scale = read_token(ffi, vptr, vs, t, kv_bs, kv_dim, nkv, kh_off, head_dim)
            np.testing.assert_array_equal(codes, v_codes[t])
            assert scale == v_scales[t]
        np.testing.assert_array_equal(cache.k_codes(kh), k_codes)
        np.testing.assert_array_equal(cache.v_scales(kh), v_scales)


def test_append_one_by_one_equals_append_all():
    """Growing token by token (new blocks, bigger scale arrays and pointer tables, none moved
    under the kernel) gives the same cache and the same output as one append."""
    whole, q, K, V = make_case(5, 137, 2, 64, 7)
    grown = lk.KVCacheQ8(2, 64, 7)
    outs = []
    for t in range(137):
        grown.append(K[t], V[t])                   # one token: [n_kv_heads, head_dim]
        outs.append(lk.attend(q, grown, 1))        # the kernel runs between appends
    assert len(grown) == 137 and grown.n_blocks == 20
    for kh in range(2):
        np.testing.assert_array_equal(grown.k_codes(kh), whole.k_codes(kh))
        np.testing.assert_array_equal(grown.v_scales(kh), whole.v_scales(kh))
        np.testing.assert_array_equal(lk.attend(q, grown, kh), lk.attend(q, whole, kh))
    # the output after t tokens is attention over the first t tokens
    partial = lk.KVCacheQ8(2, 64, 7)
    partial.append(K[:50], V[:50])
    np.testing.assert_array_equal(outs[49], lk.attend(q, partial, 1))


def test_append_in_uneven_chunks():
    whole, q, K, V = make_case(6, 100, 1, 32, 16)
    chunked = lk.KVCacheQ8(1, 32, 16)
    for a, b in [(0, 3), (3, 3), (3, 40), (40, 41), (41, 100)]:   # includes an empty chunk
        chunked.append(K[a:b], V[a:b])
    np.testing.assert_array_equal(chunked.k_codes(0), whole.k_codes(0))
    np.testing.assert_array_equal(lk.attend(q, chunked, 0), lk.attend(q, whole, 0))


def test_dequantized_matches_codes_times_scale():
    cache, q, K, V = make_case(8, 20, 2, 64, 4)
    Kd, Vd = cache.dequantized(1)
    np.testing.assert_allclose(Kd, cache.k_codes(1) * (cache.k_scales(1)[:, None] / 127), rtol=1e-6)
    assert np.abs(Vd - V[:, 1]).max() <= np.abs(V[:, 1]).max() / 254 * 1.0001


def _thp_mode() -> str | None:
    """The [bracketed] mode of /sys/kernel/mm/transparent_hugepage/enabled, None without THP."""
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")]


def _huge_kb(a: np.ndarray) -> int:
    """AnonHugePages (kB) of the mappings that hold a's first byte (/proc/self/smaps)."""
    addr, inside, kb = a.ctypes.data, False, 0
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "AnonHugePages:":
            kb += int(line.split()[1])
    return kb


@pytest.mark.parametrize("huge", [True, False])
def test_pages_as_asked_and_the_same_results(huge):
    """Blocks of 2 MiB or more start on a 2 MiB boundary (a huge page can back them whole); on Linux with
    THP "always" or "madvise" a filled slab is on huge pages when asked and never when not; either way
    the cache holds and computes the same, and copies and pickles keep the choice."""
    import copy
    import pickle
    cache, q, K, V = make_case(9, 300, 1, 128, 16)
    big = lk.KVCacheQ8(1, 128, 16384, huge_pages=huge)          # blocks of 2 MiB
    big.append(np.tile(K, (60, 1, 1)), np.tile(V, (60, 1, 1)))  # 18000 tokens: two blocks
    assert big.huge_pages is huge and all(b.ctypes.data % (2 << 20) == 0 for b in big.k_blocks)
    small = lk.KVCacheQ8(1, 128, 16, huge_pages=huge)
    small.append(K, V)
    np.testing.assert_array_equal(lk.attend(q, small, 0), lk.attend(q, cache, 0))
    for c in (copy.copy(small), pickle.loads(pickle.dumps(small))):
        assert c.huge_pages is huge
        np.testing.assert_array_equal(lk.attend(q, c, 0), lk.attend(q, cache, 0))
    with pytest.raises(TypeError, match="huge_pages"):
        lk.KVCacheQ8(1, 32, 4, huge_pages="yes")
    if _thp_mode() not in ("always", "madvise"):
        return  # not Linux, or no THP: 4 KiB pages either way
    if not huge:
        assert _huge_kb(big.k_blocks[0]) == 0
    elif _huge_kb(big.k_blocks[0]) == 0:  # advice, not a promise: no free 2 MiB page gives 4 KiB ones
        pytest.skip("no huge page was free when the block was written")
