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

/* Four 32-value block dots of one Q block against four K rows: [q.k0, q.k1, q.k2, q.k3] in int32.
 * The four rows' lane sums are reduced together (two pairwise adds) instead of one horizontal add
 * per row: the score step of the tiled variants (fa_online.h, fa_score4). */
static inline int32x4_t i8x32_dot4_s32(const int8_t *q, const int8_t *k0, const int8_t *k1,
    const int8_t *k2, const int8_t *k3)
{
#if !defined(__aarch64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
    /* x86 with AVX-512 VNNI: vpdpbusd multiplies unsigned bytes by signed bytes and adds each
     * group of four products into an int32 lane, one instruction for what the AVX2 path does in
     * five (two widenings, two vpmaddwd, one add). K's codes become unsigned by flipping their sign
     * bit (k ^ 0x80 = k + 128 as a u8), which adds 128 * (sum of Q's four codes) to every lane;
     * the accumulator starts at minus that (one vpdpbusd of 128s against Q), so each lane holds
     * exactly a[4j..4j+3] . b[4j..4j+3] for every int8 K and Q code (no product or sum overflows
     * int32: |sum| <= 4 * 255 * 128). Same int32 lanes as the other paths, so the same scores. */
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const __m256i qv = _mm256_loadu_si256((const __m256i *)q);
    const __m256i base = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), flip, qv));
#define Q8_DOT32(k) _mm256_dpbusd_epi32(base, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(k)), flip), qv)
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(Q8_DOT32(k0), Q8_DOT32(k1)),
                                  _mm256_hadd_epi32(Q8_DOT32(k2), Q8_DOT32(k3)));
#undef Q8_DOT32
    return simde_int32x4_from_m128i(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
#elif !defined(__aarch64__) && defined(__AVX2__)
    /* x86: Q widened to int16 once per block, each K half widened and multiply-added (vpmaddwd),
     * then three horizontal adds leave each row's sum in its own lane of each 128-bit half. */
    __m256i q0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q));
    __m256i q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16)));
#define Q8_DOT32(k) _mm256_add_epi32( \
        _mm256_madd_epi16(q0, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k)))), \
        _mm256_madd_epi16(q1, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((k) + 16)))))
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(Q8_DOT32(k0), Q8_DOT32(k1)),
                                  _mm256_hadd_epi32(Q8_DOT32(k2), Q8_DOT32(k3)));
#undef Q8_DOT32
    return simde_int32x4_from_m128i(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
#else
    int8x16_t qa = vld1q_s8(q), qb = vld1q_s8(q + 16);
    int32x4_t z = vdupq_n_s32(0);
    int32x4_t a0 = i8x16_dot_s32(i8x16_dot_s32(z, qa, vld1q_s8(k0)), qb, vld1q_s8(k0 + 16));
    int32x4_t a1 = i8x16_dot_s32(i8x16_dot_s32(z, qa, vld1q_s8(k1)), qb, vld1q_s8(k1 + 16));
    int32x4_t a2 = i8x16_dot_s32(i8x16_dot_s32(z, qa, vld1q_s8(k2)), qb, vld1q_s8(k2 + 16));
    int32x4_t a3 = i8x16_dot_s32(i8x16_dot_s32(z, qa, vld1q_s8(k3)), qb, vld1q_s8(k3 + 16));
    return vpaddq_s32(vpaddq_s32(a0, a1), vpaddq_s32(a2, a3));
#endif
}

/* Columns of VKQ that the tiled variants hold in registers while a tile's V rows add into them:
 * 32 floats, 8 NEON registers of 32 (2 AVX-512 ones); hd is a multiple of 32, so chunks tile it. */
#define FA_VKQ_COLS 32

/* vkq[0..32) += sum_{j<n} w[j] * vr[j][c .. c+32): the 32 accumulators stay in registers over the
 * n rows. MAGIC 0 converts V with sxtl + scvtf (a widening to int32, then int -> float); MAGIC 1
 * adds the int8 (widened to int16) to the bits of 1.5 * 2^23 = 12582912.0f (0x4B400000) and
 * subtracts 12582912.0f: exact for every int8, and no scvtf. */
/* V's sixteen int8 to two int16x8 for the magic-number conversion. On aarch64 as saddl with a zero
 * register, not sxtl: the same values, but in LLVM's Neoverse N1 model (the A76's sibling) sxtl, a
 * shift, issues on the V1 pipe only while saddl issues on V0 or V1, and V1 was the fast kernel's
 * bottleneck (lessonkit.cycles). An estimate of a model, to be checked on a board. */
static inline void q8_widen_s8(int8x16_t v8, int16x8_t *lo, int16x8_t *hi)
{
#if defined(__aarch64__)
    const int8x16_t z = vdupq_n_s8(0);
    *lo = vaddl_s8(vget_low_s8(v8), vget_low_s8(z));
    *hi = vaddl_high_s8(v8, z);
#else
    *lo = vmovl_s8(vget_low_s8(v8));
    *hi = vmovl_high_s8(v8);
#endif
}

#define Q8_MAGIC_BITS 0x4B400000
#define Q8_MAGIC_F 12582912.0f
static inline void vkq_cols_rows_impl(float *vkq, const int8_t *const *vr, int c, const float *w, int n,
    int magic)
{
#if !defined(__aarch64__) && defined(__AVX512F__)
    __m512 a0 = _mm512_loadu_ps(vkq), a1 = _mm512_loadu_ps(vkq + 16);
    const __m512i mb = _mm512_set1_epi32(Q8_MAGIC_BITS);
    const __m512 mf = _mm512_set1_ps(Q8_MAGIC_F);
    for (int j = 0; j < n; j++) {
        const int8_t *v = vr[j] + c;
        __m512 wj = _mm512_set1_ps(w[j]);
        __m512i i0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)v));
        __m512i i1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(v + 16)));
        __m512 f0, f1;
        if (magic) {
            f0 = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_add_epi32(i0, mb)), mf);
            f1 = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_add_epi32(i1, mb)), mf);
        } else {
            f0 = _mm512_cvtepi32_ps(i0);
            f1 = _mm512_cvtepi32_ps(i1);
        }
        a0 = _mm512_fmadd_ps(f0, wj, a0);
        a1 = _mm512_fmadd_ps(f1, wj, a1);
    }
    _mm512_storeu_ps(vkq, a0);
    _mm512_storeu_ps(vkq + 16, a1);
#else
    float32x4_t a[8];
    for (int i = 0; i < 8; i++) a[i] = vld1q_f32(vkq + 4 * i);
    const int32x4_t mb = vdupq_n_s32(Q8_MAGIC_BITS);
    const float32x4_t mf = vdupq_n_f32(Q8_MAGIC_F);
    for (int j = 0; j < n; j++) {
        const int8_t *v = vr[j] + c;
        float32x4_t wj = vdupq_n_f32(w[j]);
        for (int h = 0; h < 2; h++) {
            int8x16_t v8 = vld1q_s8(v + 16 * h);
            int16x8_t lo, hi;
            if (magic) q8_widen_s8(v8, &lo, &hi);
            else { lo = vmovl_s8(vget_low_s8(v8)); hi = vmovl_high_s8(v8); }
            float32x4_t f[4];
            if (magic) {
                f[0] = vsubq_f32(vreinterpretq_f32_s32(vaddw_s16(mb, vget_low_s16(lo))), mf);
                f[1] = vsubq_f32(vreinterpretq_f32_s32(vaddw_high_s16(mb, lo)), mf);
                f[2] = vsubq_f32(vreinterpretq_f32_s32(vaddw_s16(mb, vget_low_s16(hi))), mf);
                f[3] = vsubq_f32(vreinterpretq_f32_s32(vaddw_high_s16(mb, hi)), mf);
            } else {
                f[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
                f[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
                f[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
                f[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
            }
            for (int i = 0; i < 4; i++) a[4 * h + i] = vfmaq_f32(a[4 * h + i], f[i], wj);
        }
    }
    for (int i = 0; i < 8; i++) vst1q_f32(vkq + 4 * i, a[i]);
#endif
}
/* sixteen int8 of V to four float32x4 by the magic-number add (as vkq_cols_rows_magic) */
static inline void v_i8x16_to_f32_magic(const int8_t *v, float32x4_t f[4])
{
    const int32x4_t mb = vdupq_n_s32(Q8_MAGIC_BITS);
    const float32x4_t mf = vdupq_n_f32(Q8_MAGIC_F);
    int8x16_t v8 = vld1q_s8(v);
    int16x8_t lo, hi;
    q8_widen_s8(v8, &lo, &hi);
    f[0] = vsubq_f32(vreinterpretq_f32_s32(vaddw_s16(mb, vget_low_s16(lo))), mf);
    f[1] = vsubq_f32(vreinterpretq_f32_s32(vaddw_high_s16(mb, lo)), mf);
    f[2] = vsubq_f32(vreinterpretq_f32_s32(vaddw_s16(mb, vget_low_s16(hi))), mf);
    f[3] = vsubq_f32(vreinterpretq_f32_s32(vaddw_high_s16(mb, hi)), mf);
}
static inline void vkq_cols_rows(float *vkq, const int8_t *const *vr, int c, const float *w, int n)
{
    vkq_cols_rows_impl(vkq, vr, c, w, n, 0);
}
static inline void vkq_cols_rows_magic(float *vkq, const int8_t *const *vr, int c, const float *w, int n)
{
    vkq_cols_rows_impl(vkq, vr, c, w, n, 1);
}

/* The grouped kernel's accumulation (flash_attn_q8_group.c): for each of G query heads,
 * vkq[g][0..cols) += sum_{j<n} w[g][j] * vr[j][c .. c+cols), with V's columns converted to fp32
 * ONCE per row for all G heads and every head's accumulators held in registers over the n rows:
 * 32 columns x G heads on AVX-512 (2 zmm per head), 16 x G on NEON (4 q registers per head: with
 * G = 4, 16 accumulators and 4 converted V vectors of the 32 registers). Per head, the same
 * multiply-adds in the same order as vkq_cols_rows over the same columns. */
#define GQA_MAXG 8
#if !defined(__aarch64__) && defined(__AVX512F__)
#define FA_GROUP_COLS 32
#else
#define FA_GROUP_COLS 16
#endif
#if defined(__aarch64__) || !defined(__AVX512F__)
/* vkq_cols_rows_group's NEON body for a G the caller makes a constant. Each head's weights for four
 * rows come in ONE vector load and feed fmla by element (vfmaq_laneq_f32): no broadcast load per
 * row and head. With G = 4: 16 accumulators, 4 weight vectors, 4 converted V vectors and the two
 * magic constants, 26 of the 32 registers. fmla by element is the same fused multiply-add as
 * vfmaq_f32 with the weight broadcast, so every head's sums are bit for bit those of before. */
static inline __attribute__((always_inline)) void vkq_group_neon(float *const *vkq, const int8_t *const *vr,
    int c, const float *w, int wstride, int n, const int G)
{
    float32x4_t a[GQA_MAXG][4];
    for (int g = 0; g < G; g++)
        for (int i = 0; i < 4; i++) a[g][i] = vld1q_f32(vkq[g] + c + 4 * i);
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        float32x4_t wq[GQA_MAXG], f[4];
        for (int g = 0; g < G; g++) wq[g] = vld1q_f32(w + g * wstride + j);
#define Q8_GROUP_ROW(u)                                                                   \
        v_i8x16_to_f32_magic(vr[j + (u)] + c, f);                                         \
        for (int g = 0; g < G; g++)                                                       \
            for (int i = 0; i < 4; i++) a[g][i] = vfmaq_laneq_f32(a[g][i], f[i], wq[g], (u));
        Q8_GROUP_ROW(0) Q8_GROUP_ROW(1) Q8_GROUP_ROW(2) Q8_GROUP_ROW(3)
#undef Q8_GROUP_ROW
    }
    for (; j < n; j++) { /* a last tile's rows beyond a multiple of 4 */
        float32x4_t f[4];
        v_i8x16_to_f32_magic(vr[j] + c, f);
        for (int g = 0; g < G; g++) {
            float32x4_t wj = vdupq_n_f32(w[g * wstride + j]);
            for (int i = 0; i < 4; i++) a[g][i] = vfmaq_f32(a[g][i], f[i], wj);
        }
    }
    for (int g = 0; g < G; g++)
        for (int i = 0; i < 4; i++) vst1q_f32(vkq[g] + c + 4 * i, a[g][i]);
}
#endif
static inline void vkq_cols_rows_group(float *const *vkq, const int8_t *const *vr, int c, const float *w,
    int wstride, int n, int G)
{
#if !defined(__aarch64__) && defined(__AVX512F__)
    __m512 a[GQA_MAXG][2];
    for (int g = 0; g < G; g++) { a[g][0] = _mm512_loadu_ps(vkq[g] + c); a[g][1] = _mm512_loadu_ps(vkq[g] + c + 16); }
    for (int j = 0; j < n; j++) {
        const int8_t *v = vr[j] + c;
        __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)v)));
        __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(v + 16))));
        for (int g = 0; g < G; g++) {
            __m512 wj = _mm512_set1_ps(w[g * wstride + j]);
            a[g][0] = _mm512_fmadd_ps(f0, wj, a[g][0]);
            a[g][1] = _mm512_fmadd_ps(f1, wj, a[g][1]);
        }
    }
    for (int g = 0; g < G; g++) { _mm512_storeu_ps(vkq[g] + c, a[g][0]); _mm512_storeu_ps(vkq[g] + c + 16, a[g][1]); }
#else
    /* NEON: a compile-time G (below) keeps the G x 4 accumulators in registers: with G a runtime
     * value the compiler kept a[][] on the stack, a load and a store per multiply-add. */
    switch (G) {
    case 1: vkq_group_neon(vkq, vr, c, w, wstride, n, 1); break;
    case 2: vkq_group_neon(vkq, vr, c, w, wstride, n, 2); break;
    case 3: vkq_group_neon(vkq, vr, c, w, wstride, n, 3); break;
    case 4: vkq_group_neon(vkq, vr, c, w, wstride, n, 4); break;
    default: vkq_group_neon(vkq, vr, c, w, wstride, n, G); break; /* 5..8: more than 32 registers anyway */
    }
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
