/* q8_simd.h: the SIMD building blocks of the q8 kernels (course lesson 6-1's helpers), shared by
 * flash_attn_q8_neon.c and the two-pass variants: one NEON source everywhere, real NEON on
 * aarch64, SIMDe's emulation of the same intrinsics elsewhere, with x86 paths where SIMDe's
 * generic code would time the emulation instead of the algorithm. */
#ifndef Q8_SIMD_H
#define Q8_SIMD_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__aarch64__)
#include <arm_neon.h>
#else
/* Not a 64-bit ARM CPU (the kernels use AArch64-only intrinsics such as vaddvq_s32): SIMDe
 * provides the same intrinsics, by the same names, in portable C. */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/arm/neon.h>
#endif

#define KVQ_INV (1.0f / 127.0f) /* K/V scales are stored as raw max|x|; code * max / 127 is the value */
#include "flash_attn_q8.h"      /* QBLK, HD_MAX, GQA_MAX: the sizes C and lessonkit share, */
                                /* defined once there (lessonkit reads them from that header) */

/* Dot product of 16 int8 pairs, added into 4 int32 lanes: lane j gets a[4j..4j+3] . b[4j..4j+3]. */
static inline int32x4_t i8x16_dot_s32(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b); /* one sdot instruction */
#elif defined(__aarch64__)
    /* NEON without dotprod (Cortex-A53/A55 builds for armv8-a): widen to int16 products,
     * then add neighbours pairwise so that every lane holds the same sum sdot would give. */
    int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    int16x8_t hi = vmull_high_s8(a, b);
    int32x4_t sums = vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi));
    return vaddq_s32(acc, sums);
#elif defined(__AVX2__)
    /* x86 through SIMDe: SIMDe's vdotq_s32 is a plain C loop, slower than scalar code. The same
     * lanes with AVX2: sign-extend both to sixteen int16, multiply and add neighbours (vpmaddwd:
     * eight int32), then add neighbouring pairs again (vphaddd), so lane j holds
     * a[4j..4j+3] . b[4j..4j+3] exactly as sdot does, for every int8 value. */
    __m256i prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(simde_int8x16_to_m128i(a)),
                                     _mm256_cvtepi8_epi16(simde_int8x16_to_m128i(b)));
    __m128i quads = _mm_hadd_epi32(_mm256_castsi256_si128(prod), _mm256_extracti128_si256(prod, 1));
    return vaddq_s32(acc, simde_int32x4_from_m128i(quads));
#else
    return vdotq_s32(acc, a, b); /* SIMDe's portable version of sdot */
#endif
}

#if !defined(__aarch64__) && defined(__SSSE3__)
/* SIMDe's vaddvq_s32 (add the four lanes) is a plain loop on x86, seven instructions for
 * what two horizontal adds do: replace it there. On aarch64 it is the single addv instruction. */
static inline int32_t q8_vaddvq_s32(int32x4_t v)
{
    __m128i x = simde_int32x4_to_m128i(v);
    x = _mm_hadd_epi32(x, x);
    return _mm_cvtsi128_si32(_mm_hadd_epi32(x, x));
}
#undef vaddvq_s32
#define vaddvq_s32(v) q8_vaddvq_s32(v)
#endif

/* VKQ[0..16) += V[0..16) * w: sixteen int8 values of V widened to fp32 and multiply-added. */
static inline void vkq_add_i8x16(float *vkq, const int8_t *v, float32x4_t w)
{
#if defined(__aarch64__) || !defined(__AVX2__)
    int8x16_t v8 = vld1q_s8(v);
    int16x8_t v16lo = vmovl_s8(vget_low_s8(v8)), v16hi = vmovl_high_s8(v8);
    float32x4_t f0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(v16lo)));
    float32x4_t f1 = vcvtq_f32_s32(vmovl_high_s16(v16lo));
    float32x4_t f2 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(v16hi)));
    float32x4_t f3 = vcvtq_f32_s32(vmovl_high_s16(v16hi));
    vst1q_f32(vkq + 0, vfmaq_f32(vld1q_f32(vkq + 0), f0, w));
    vst1q_f32(vkq + 4, vfmaq_f32(vld1q_f32(vkq + 4), f1, w));
    vst1q_f32(vkq + 8, vfmaq_f32(vld1q_f32(vkq + 8), f2, w));
    vst1q_f32(vkq + 12, vfmaq_f32(vld1q_f32(vkq + 12), f3, w));
#elif defined(__AVX512F__)
    /* x86 with AVX-512: all sixteen at once, int8 straight to int32 (vpmovsxbd), one FMA. */
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)v)));
    _mm512_storeu_ps(vkq, _mm512_fmadd_ps(f, _mm512_set1_ps(vgetq_lane_f32(w, 0)), _mm512_loadu_ps(vkq)));
#else
    /* x86 with AVX2: SIMDe widens int8 -> int16 -> int32 in many shuffles; AVX2 goes from int8
     * straight to eight int32 (vpmovsxbd) and multiply-adds eight floats at a time. */
    __m256 w8 = _mm256_set1_ps(vgetq_lane_f32(w, 0));
    __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)v)));
    __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(v + 8))));
    _mm256_storeu_ps(vkq + 0, _mm256_fmadd_ps(f0, w8, _mm256_loadu_ps(vkq + 0)));
    _mm256_storeu_ps(vkq + 8, _mm256_fmadd_ps(f1, w8, _mm256_loadu_ps(vkq + 8)));
#endif
}

/* The engine's float -> int8 cast for Q: round half away from zero, then clamp. */
static inline int8_t q_code(float v)
{
    int r = (int)(v + (v >= 0.0f ? 0.5f : -0.5f));
    return (int8_t)(r < -128 ? -128 : (r > 127 ? 127 : r));
}

#if !defined(__aarch64__) && defined(__FMA__) && defined(__SSE4_1__)
/* exp(x) for x <= 0, the only arguments the kernels pass (exp(M - s) with s > M, exp(s - M)
 * with s <= M). glibc's expf is a function call: on x86 it cost about a fifth of the token
 * loop, with registers spilled around it. Inline instead: x = n ln2 + r with |r| <= ln2 / 2
 * (ln2 split in two so that n ln2 is exact), exp(r) by its Taylor series to r^7 (truncation
 * error below 1e-8 relative), times 2^n built from the exponent bits. Results within 2 ulp
 * of expf; below -87 the weight would be under FLT_MIN and is 0. ARM keeps libm's expf. */
static inline float q8_expf(float x)
{
    if (!(x >= -87.0f)) return 0.0f;
    float n = rintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    union { int32_t i; float f; } two_n = {.i = ((int32_t)n + 127) << 23};
    return p * two_n.f;
}
#define expf(x) q8_expf(x)
#endif

/* Segment 1 of the kernel as a function, for the comparison variants (the kernel itself keeps
 * its own copy inline, as the article shows it): Q to int8 codes qi and block scales qsc. */
static inline void q8_quantize_q(const float *q, int nblk, int8_t *qi, float *qsc)
{
    for (int b = 0; b < nblk; b++) {
        float qm = 0.0f;
        for (int i = 0; i < QBLK; i++) qm = fmaxf(qm, fabsf(q[b * QBLK + i]));
        if (qm < 1e-6f) qm = 1.0f;
        qsc[b] = qm * KVQ_INV;
        for (int i = 0; i < QBLK; i++) qi[b * QBLK + i] = q_code(q[b * QBLK + i] * (127.0f / qm));
    }
}

/* Segment 2's score of one K row kt (before the K scale and the softmax scale). */
static inline float q8_dot_row(const int8_t *qi, const float *qsc, const int8_t *kt, int nblk)
{
    float s = 0.0f;
    for (int b = 0; b < nblk; b++) {
        int32x4_t acc = i8x16_dot_s32(vdupq_n_s32(0), vld1q_s8(qi + b * QBLK), vld1q_s8(kt + b * QBLK));
        acc = i8x16_dot_s32(acc, vld1q_s8(qi + b * QBLK + 16), vld1q_s8(kt + b * QBLK + 16));
        s += (float)vaddvq_s32(acc) * qsc[b];
    }
    return s;
}

/* Software prefetch distance in tokens (0: none). Long contexts do not fit in any cache, and
 * the per-token work is too short to hide DRAM latency: asking for token t + FA_PREFETCH's K and
 * V rows while token t is scored keeps loads in flight. lesson 05 measures the distance. */
#ifndef FA_PREFETCH
#define FA_PREFETCH 8
#endif

/* Ask for the rows of token t (K and V, hd bytes each) to be brought into cache. */
static inline void prefetch_token(int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    int t, int kv_bs, int kv_dim, int kh_off, int hd)
{
    size_t off = (size_t)(t % kv_bs) * kv_dim + kh_off;
    for (int i = 0; i < hd; i += 64) {  /* one prefetch per 64-byte cache line */
        __builtin_prefetch(k_cache_q8[t / kv_bs] + off + i);
        __builtin_prefetch(v_cache_q8[t / kv_bs] + off + i);
    }
}

#endif
