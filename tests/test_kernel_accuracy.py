"""The compiled kernel against the scalar C reference, the numpy quantized math and float64
attention, on awkward shapes.

Tolerances, and why:
- NEON vs scalar C: the same operations in the same order; they differ only where one build
  fuses a multiply-add (SIMDe's vfmaq_f32 with -march=native, or the compiler contracting the
  scalar code). 1e-5 relative to the largest output.
- kernel vs numpy quantized math, and vs the two-pass variants of lesson 05: numpy repeats the scores in float32 step for step, then does
  the softmax in float64 with all scores at once instead of online in float32; what remains is
  float32 rounding in the running sums: 2e-5 relative to max|V|. The two-pass variants use the
  same quantized scores, with the max known before the exps instead of found online.
- kernel vs float64 on unquantized K, V: the quantization error, bounded per case from the
  actual quantized values (quantization_error_bound below), plus the float32 slack above.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import native, variants
from lessonkit.quant import quantize_q

from conftest import make_case

NEON_VS_SCALAR_RTOL = 1e-5
FLOAT32_SLACK = 2e-5  # relative to max|V|


def quantization_error_bound(q, K, V, cache, kv_head, scale) -> float:
    """A rigorous bound on |attention(quantized) - attention(exact)| for every output element.

    With exact scores s_t, quantized scores s'_t = s_t + d_t (|d_t| <= D) and V'_t = V_t + e_t:
      out' - out = sum p'_t e_t + sum (p'_t - p_t)(V_t - c)   for any constant c,
    since both weight vectors sum to 1. p'_t / p_t lies in [exp(-2D), exp(2D)], so
    sum |p'_t - p_t| <= exp(2D) - 1, and
      |out' - out| <= max|e| + (exp(2D) - 1) * max_t |V_t - c|,  c = the midrange of each column.
    D and e are computed here from the cache's own codes and Q's codes."""
    codes, qsc = quantize_q(q)
    q_deq = codes.astype(np.float64) * np.repeat(qsc.astype(np.float64), 32)
    K_deq, V_deq = (x.astype(np.float64) for x in cache.dequantized(kv_head))
    Kx, Vx = K.astype(np.float64), V.astype(np.float64)
    D = np.abs(scale * (K_deq @ q_deq - Kx @ q.astype(np.float64))).max()
    e = np.abs(V_deq - Vx).max()
    half_range = ((Vx.max(axis=0) - Vx.min(axis=0)) / 2).max()
    return e + math.expm1(2 * D) * half_range


def check_case(cache, q, K, V, scale=None):
    hd = cache.head_dim
    s = 1 / math.sqrt(hd) if scale is None else scale
    for kh in range(cache.n_kv_heads):
        neon = lk.attend(q, cache, kh, scale=scale)
        scalar = lk.attend(q, cache, kh, scale=scale, backend="scalar")
        mirror = lk.attend(q, cache, kh, scale=scale, backend="numpy")
        ref = lk.reference.attention(q, K[:, kh], V[:, kh], s)
        vmax = float(np.abs(V[:, kh]).max())

        assert neon.dtype == np.float32 and neon.shape == (hd,)
        np.testing.assert_allclose(neon, scalar, rtol=0,
                                   atol=NEON_VS_SCALAR_RTOL * max(np.abs(scalar).max(), 1e-30),
                                   err_msg=f"neon vs scalar, kv_head {kh}")
        np.testing.assert_allclose(neon, mirror, rtol=0, atol=FLOAT32_SLACK * vmax,
                                   err_msg=f"neon vs numpy quantized math, kv_head {kh}")
        for variant in ("two_pass_scores", "two_pass_recompute"):  # article section 3's alternatives
            np.testing.assert_allclose(lk.attend(q, cache, kh, scale=scale, backend=variant), neon,
                                       rtol=0, atol=FLOAT32_SLACK * vmax, err_msg=f"{variant}, kv_head {kh}")
        for v, out in registry_outputs(q, cache, kh, scale).items():  # every entry of fa_variants.h
            # lowp's weights are 14-bit codes: the bound derived in native/tests/test_kernel.c on top
            extra = lowp_bound(cache, kh) if v == "lowp" else 0.0
            np.testing.assert_allclose(out, scalar, rtol=0,
                                       atol=NEON_VS_SCALAR_RTOL * max(np.abs(scalar).max(), 1e-30) + extra,
                                       err_msg=f"registry variant {v} vs scalar, kv_head {kh}")
        bound = quantization_error_bound(q, K[:, kh], V[:, kh], cache, kh, s)
        err = np.abs(neon - ref).max()
        assert err <= bound + FLOAT32_SLACK * vmax, \
            f"kv_head {kh}: error {err:.3g} against float64 exceeds the quantization bound {bound:.3g}"


def lowp_bound(cache, kv_head) -> float:
    """How far lowp (version 14) may be from the scalar kernel beyond float rounding: each weight off by
    at most 0.51 of its 16-token group's step, 1/16256 of the group's largest weight, which bounds every
    output value by 0.51 max|V| / 1016 (the derivation: native/tests/test_kernel.c, LOWP_BOUND)."""
    return 0.51 * float(cache.v_scales(kv_head).max(initial=0.0)) / 1016


def registry_outputs(q, cache, kv_head, scale) -> dict[str, np.ndarray]:
    """Every registry variant's output, each run once through fa_time_calls(index, 1, ...) (the
    library's table, in fa_variants.h's order), NaN-filled first so that a variant that writes
    nothing fails. The two-pass ones too: 1e-5 of the scalar's max holds for them as well (same
    quantized scores; the max known before the exps changes a few roundings)."""
    ffi, lib = native.load()
    if scale is None:
        scale = 1.0 / math.sqrt(cache.head_dim)
    q = np.ascontiguousarray(q, np.float32)
    k, v, ks, vs, T, kv_dim, kv_bs, nkv, kh_off = cache.kernel_args(kv_head, ffi)
    outs = {}
    for var in variants.VARIANTS:
        out = np.full(cache.head_dim, np.nan, np.float32)
        ns = lib.fa_time_calls(var.version, 1, ffi.from_buffer("float[]", out, require_writable=True),
                               ffi.from_buffer("float[]", q), k, v, ks, vs, cache.seq_len, kv_dim, kv_bs, nkv,
                               kh_off, cache.head_dim, float(scale))
        assert ns >= 0, f"fa_time_calls refused registry entry {var.version} ({var.name})"
        outs[var.name] = out
    return outs


def test_registry_parsed_equals_library():
    """lessonkit.variants parses native/fa_variants.h; the built library's own table must agree."""
    ffi, lib = native.load()
    lib_rows = [(lib.fa_variant_version(i), ffi.string(lib.fa_variant_name(i)).decode(),
                 ffi.string(lib.fa_variant_adds(i)).decode()) for i in range(lib.fa_variant_count())]
    assert lib_rows == [(v.version, v.name, v.adds) for v in variants.VARIANTS]
    assert {"neon", "scalar", "two_pass_scores", "two_pass_recompute", "fast"} <= set(variants.BY_NAME)
    assert lib.fa_variant_name(len(lib_rows)) == ffi.NULL and lib.fa_variant_version(-1) == -1


GRID = list(itertools.product([32, 64, 96, 128, 256], [1, 7, 16, 64], [1, 2, 31, 33, 1000, 5000]))
KV_HEADS = [1, 2, 8]


@pytest.mark.parametrize("i,head_dim,block_size,seq_len",
                         [(i, *g) for i, g in enumerate(GRID)],
                         ids=[f"hd{h}-bs{b}-T{t}" for h, b, t in GRID])
def test_grid(i, head_dim, block_size, seq_len):
    n_kv = KV_HEADS[i % len(KV_HEADS)]  # every kv head of 1, 2 or 8 is checked
    check_case(*make_case(i, seq_len, n_kv, head_dim, block_size))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_large_scores(head_dim):
    """Scores up to |s| = 80: exp over a wide range, many tokens with weight ~0, a sharp max."""
    cache, q, K, V = make_case(7, 700, 2, head_dim, 16)
    for kh in range(2):
        raw = K[:, kh].astype(np.float64) @ q
        scale = 80.0 / np.abs(raw).max()
        s = scale * (cache.dequantized(kh)[0].astype(np.float64) @ q)
        assert 70 < np.abs(s).max() < 90
        check_case(cache, q, K, V, scale=scale)


def test_query_with_zero_block():
    """A 32-block of zeros in q goes through the qm < 1e-6 guard instead of dividing by zero."""
    cache, q, K, V = make_case(3, 77, 2, 128, 7)
    q[32:64] = 0
    check_case(cache, q, K, V)
    q[:] = 0  # all scores 0: uniform weights, the plain mean of the dequantized V
    for kh in range(2):
        np.testing.assert_allclose(lk.attend(q, cache, kh), cache.dequantized(kh)[1].mean(axis=0),
                                   rtol=0, atol=1e-5)


def test_scores_below_start_of_M_give_zero():
    """M starts at -1e9, not -inf: if every score is below it, no token ever raises M, every
    weight exp(s - M) underflows to 0, S stays 0 and the S > 0 guard returns zeros."""
    rng = np.random.default_rng(4)
    q = np.abs(rng.standard_normal(64, dtype=np.float32))
    cache = lk.KVCacheQ8(1, 64, 8)
    cache.append(np.abs(rng.standard_normal((50, 1, 64), dtype=np.float32)),
                 rng.standard_normal((50, 1, 64), dtype=np.float32))
    scale = -1e12  # every score about -1e12 * (positive dot) < -1e9
    for backend in lk.kernels.attention.BACKENDS:
        out = lk.attend(q, cache, 0, scale=scale, backend=backend)
        assert np.array_equal(out, np.zeros(64, np.float32)), backend


def test_typical_error_against_float64():
    """On Gaussian K, V, q at Qwen's head_dim over 2048 tokens the q8 kernel is within 1e-3 of
    max|V| of float64 attention (measured: 3.5e-4). A fixed number, so that a coarser quantizer
    could not hide behind the per-case bound: 4-bit codes (16x the step) would fail it."""
    cache, q, K, V = make_case(11, 2048, 8, 128, 64)
    for kh in range(8):
        ref = lk.reference.attention(q, K[:, kh], V[:, kh])
        err = np.abs(lk.attend(q, cache, kh) - ref).max()
        assert err < 1e-3 * np.abs(V[:, kh]).max(), (kh, err)
