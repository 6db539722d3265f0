/* q8_simd.h: the SIMD building blocks of the q8 kernels (course lesson 6-1's helpers), written
 * once in NEON intrinsics: real NEON on aarch64, SIMDe's emulation of the same intrinsics
 * elsewhere. On x86, where SIMDe's generic code would time the emulation instead of the
 * algorithm, a few helpers call the AVX2 / AVX-512 / VNNI forms of q8_simd_x86.h instead.
 *
 * Each #if branch of a helper defines the name of its path (Q8_DOT_PATH "sdot", ...), so that the
 * branch a build compiled can report itself: Q8_SIMD_PATHS, at the end, is what fa_simd_paths()
 * returns (lesson 00 prints it, lesson 04 marks that branch). */
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

/* The magic-number conversion of V (version 9 of lesson 09): an int8 added to the bits of
 * 1.5 * 2^23 = 12582912.0f (0x4B400000) is that float plus the int8, exactly; subtracting
 * 12582912.0f leaves the int8 as a float, without an int -> float instruction (scvtf). */
#define Q8_MAGIC_BITS 0x4B400000
#define Q8_MAGIC_F 12582912.0f

/* The low-precision accumulation of lesson 09's version lowp (flash_attn_q8_v14_lowp): V times
 * the weights by int8 dot products instead of one fp32 multiply-add per value. The weights of a group
 * of up to FA_LOWP_GROUP = 16 tokens share one fp32 step d; each weight is the integer code
 * C = 128 * hi + lo (0 <= C <= 16256, hi = C >> 7 and lo = C & 127 both in [0, 127]: two int8 halves,
 * 14 bits in all, that are valid signed AND unsigned bytes), so that
 * VKQ[i] += d * (128 * sum_j hi_j v_j[i] + sum_j lo_j v_j[i]): two int32 dot products per value and
 * token group, exact in int32 (|sum| <= 16 * 127 * 127 * 128 < 2^31).
 * fa_online.h makes the codes (fa_lowp_codes); these helpers do the dot products.
 *
 * A dot product sums four neighbouring bytes, and a V row holds neighbouring COLUMNS: so four V rows
 * (four tokens) are interleaved first, byte by byte (two rounds of zips), giving for each column its
 * four tokens' values side by side; then one sdot by element multiplies them by the four tokens'
 * codes, held in one lane of the register of the group's 16 codes. */
#define FA_LOWP_GROUP 16
#define FA_LOWP_CMAX 16256 /* 127 * 128: the largest code, hi = 127, lo = 0 */
typedef struct {
    int8_t hi[FA_LOWP_GROUP], lo[FA_LOWP_GROUP]; /* the two halves of each token's code */
    float d;                                     /* the group's step: weight ~= C * d */
} fa_lowp_codes;

#if !defined(__aarch64__)
#include "q8_simd_x86.h"
#endif
#ifndef Q8_ADDV_PATH
#define Q8_ADDV_PATH "native" /* vaddvq_s32 as NEON (or SIMDe) has it */
#endif

/* Dot product of 16 int8 pairs, added into 4 int32 lanes: lane j gets a[4j..4j+3] . b[4j..4j+3]. */
static inline int32x4_t i8x16_dot_s32(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
#define Q8_DOT_PATH "sdot"
    return vdotq_s32(acc, a, b); /* one sdot instruction */
#elif defined(__aarch64__)
#define Q8_DOT_PATH "widen"
    /* NEON without dotprod (Cortex-A53/A55 builds for armv8-a): widen to int16 products,
     * then add neighbours pairwise so that every lane holds the same sum sdot would give. */
    int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    int16x8_t hi = vmull_high_s8(a, b);
    int32x4_t sums = vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi));
    return vaddq_s32(acc, sums);
#elif defined(__AVX2__)
#define Q8_DOT_PATH "avx2"
    /* x86: SIMDe's vdotq_s32 is a plain C loop, slower than scalar code. q8_simd_x86.h gives the
     * same lanes with AVX2: sign-extend to int16, _mm256_madd_epi16, then one horizontal add. */
    return q8_avx2_dot_s32(acc, a, b);
#else
#define Q8_DOT_PATH "simde"
    return vdotq_s32(acc, a, b); /* SIMDe's portable version of sdot */
#endif
}

/* VKQ[0..16) += V[0..16) * w: sixteen int8 values of V widened to fp32 and multiply-added. */
static inline void vkq_add_i8x16(float *vkq, const int8_t *v, float32x4_t w)
{
#if defined(__aarch64__) || !defined(__AVX2__)
#define Q8_VKQ_PATH "neon"
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
#define Q8_VKQ_PATH "avx512"
    q8_avx512_vkq_add(vkq, v, vgetq_lane_f32(w, 0)); /* q8_simd_x86.h: all sixteen in one FMA */
#else
#define Q8_VKQ_PATH "avx2"
    q8_avx2_vkq_add(vkq, v, vgetq_lane_f32(w, 0));   /* q8_simd_x86.h: two FMAs of eight */
#endif
}

/* Four 32-value block dots of one Q block against four K rows: [q.k0, q.k1, q.k2, q.k3] in int32.
 * The four rows' lane sums are reduced together (two pairwise adds) instead of one horizontal add
 * per row: the score step of the tiled versions (fa_online.h, fa_score4). */
static inline int32x4_t i8x32_dot4_s32(const int8_t *q, const int8_t *k0, const int8_t *k1,
    const int8_t *k2, const int8_t *k3)
{
#if !defined(__aarch64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define Q8_DOT4_PATH "vnni"
    return q8_vnni_dot4(q, k0, k1, k2, k3); /* q8_simd_x86.h: one vpdpbusd per row */
#elif !defined(__aarch64__) && defined(__AVX2__)
#define Q8_DOT4_PATH "avx2"
    return q8_avx2_dot4(q, k0, k1, k2, k3); /* q8_simd_x86.h: vpmaddwd per row half */
#else
#define Q8_DOT4_PATH "neon"
    int8x16_t qa = vld1q_s8(q), qb = vld1q_s8(q + 16);
    int32x4_t z = vdupq_n_s32(0);
    int32x4_t a0 = i8x16_dot_s32(i8x16_dot_s32(z, qa, vld1q_s8(k0)), qb, vld1q_s8(k0 + 16));
    int32x4_t a1 = i8x16_dot_s32(i8x16_dot_s32(z, qa, vld1q_s8(k1)), qb, vld1q_s8(k1 + 16));
    int32x4_t a2 = i8x16_dot_s32(i8x16_dot_s32(z, qa, vld1q_s8(k2)), qb, vld1q_s8(k2 + 16));
    int32x4_t a3 = i8x16_dot_s32(i8x16_dot_s32(z, qa, vld1q_s8(k3)), qb, vld1q_s8(k3 + 16));
    return vpaddq_s32(vpaddq_s32(a0, a1), vpaddq_s32(a2, a3));
#endif
}

/* Columns of VKQ that the tiled versions hold in registers while a tile's V rows add into them:
 * 32 floats, 8 NEON registers of 32 (2 AVX-512 ones); hd is a multiple of 32, so chunks tile it. */
#define FA_VKQ_COLS 32

/* V's sixteen int8 to two int16x8 for the magic-number conversion. On aarch64 as saddl with a zero
 * register, not sxtl: the same values, but in LLVM's Neoverse N1 model (the A76's sibling) sxtl, a
 * shift, issues on the V1 pipe only, while saddl issues on V0 or V1, so the widening spreads over
 * both vector pipes (make bench-a76 reports which pipe bounds a loop). A model's estimate, to be
 * checked on a board. */
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

/* sixteen int8 of V to four float32x4 by the magic-number add (Q8_MAGIC_BITS above) */
static inline void v_i8x16_to_f32_magic(const int8_t *v, float32x4_t f[4])
{
    const int32x4_t mb = vdupq_n_s32(Q8_MAGIC_BITS);
    const float32x4_t mf = vdupq_n_f32(Q8_MAGIC_F);
    int16x8_t lo, hi;
    q8_widen_s8(vld1q_s8(v), &lo, &hi);
    f[0] = vsubq_f32(vreinterpretq_f32_s32(vaddw_s16(mb, vget_low_s16(lo))), mf);
    f[1] = vsubq_f32(vreinterpretq_f32_s32(vaddw_high_s16(mb, lo)), mf);
    f[2] = vsubq_f32(vreinterpretq_f32_s32(vaddw_s16(mb, vget_low_s16(hi))), mf);
    f[3] = vsubq_f32(vreinterpretq_f32_s32(vaddw_high_s16(mb, hi)), mf);
}

/* sixteen int8 of V to four float32x4 by sxtl + scvtf (widen to int32, then int -> float) */
static inline void v_i8x16_to_f32(const int8_t *v, float32x4_t f[4])
{
    int8x16_t v8 = vld1q_s8(v);
    int16x8_t lo = vmovl_s8(vget_low_s8(v8)), hi = vmovl_high_s8(v8);
    f[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    f[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    f[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    f[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
}

/* vkq[0..32) += sum_{j<n} w[j] * vr[j][c .. c+32): the 32 accumulators stay in registers over the
 * n rows; magic chooses V's conversion (v_i8x16_to_f32_magic or v_i8x16_to_f32). */
static inline void vkq_cols_rows_impl(float *vkq, const int8_t *const *vr, int c, const float *w, int n,
    int magic)
{
#if !defined(__aarch64__) && defined(__AVX512F__)
    q8_avx512_vkq_cols_rows(vkq, vr, c, w, n, magic); /* q8_simd_x86.h: two zmm accumulators */
#elif !defined(__aarch64__) && defined(__AVX2__) && defined(__FMA__)
    q8_avx2_vkq_cols_rows(vkq, vr, c, w, n, magic);   /* q8_simd_x86.h: four ymm accumulators */
#else
    float32x4_t a[8];
    for (int i = 0; i < 8; i++) a[i] = vld1q_f32(vkq + 4 * i);
    for (int j = 0; j < n; j++) {
        float32x4_t wj = vdupq_n_f32(w[j]);
        for (int h = 0; h < 2; h++) {
            float32x4_t f[4];
            if (magic) v_i8x16_to_f32_magic(vr[j] + c + 16 * h, f);
            else v_i8x16_to_f32(vr[j] + c + 16 * h, f);
            for (int i = 0; i < 4; i++) a[4 * h + i] = vfmaq_f32(a[4 * h + i], f[i], wj);
        }
    }
    for (int i = 0; i < 8; i++) vst1q_f32(vkq + 4 * i, a[i]);
#endif
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
#if !defined(__aarch64__) && defined(__AVX512F__)
#define FA_GROUP_COLS 32
#else
#define FA_GROUP_COLS 16
/* vkq_cols_rows_group's NEON body for a G the caller makes a constant. Each head's weights for four
 * rows come in ONE vector load and feed fmla by element (vfmaq_laneq_f32): no broadcast load per
 * row and head. With G = 4: 16 accumulators, 4 weight vectors, 4 converted V vectors and the two
 * magic constants, 26 of the 32 registers. fmla by element is the same fused multiply-add as
 * vfmaq_f32 with the weight broadcast, so every head's sums are the same bits either way. */
static inline __attribute__((always_inline)) void vkq_group_neon(float *const *vkq, const int8_t *const *vr,
    int c, const float *w, int wstride, int n, const int G)
{
    float32x4_t a[GQA_MAX][4];
    for (int g = 0; g < G; g++)
        for (int i = 0; i < 4; i++) a[g][i] = vld1q_f32(vkq[g] + c + 4 * i);
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        float32x4_t wq[GQA_MAX], f[4];
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
    q8_avx512_vkq_group(vkq, vr, c, w, wstride, n, G); /* q8_simd_x86.h */
#elif !defined(__aarch64__) && defined(__AVX2__) && defined(__FMA__)
    switch (G) { /* q8_simd_x86.h; a constant G per case, as below */
    case 1: q8_avx2_vkq_group(vkq, vr, c, w, wstride, n, 1); break;
    case 2: q8_avx2_vkq_group(vkq, vr, c, w, wstride, n, 2); break;
    case 3: q8_avx2_vkq_group(vkq, vr, c, w, wstride, n, 3); break;
    case 4: q8_avx2_vkq_group(vkq, vr, c, w, wstride, n, 4); break;
    default: q8_avx2_vkq_group(vkq, vr, c, w, wstride, n, G); break;
    }
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

#if !defined(__aarch64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define Q8_LOWP_PATH "vnni"
#elif !defined(__aarch64__) && defined(__AVX2__)
#define Q8_LOWP_PATH "avx2" /* q8_simd_x86.h: vpmaddubsw and vpmaddwd for each sdot by element */
#else
#if defined(__ARM_FEATURE_DOTPROD)
#define Q8_LOWP_PATH "sdot"
#else
#define Q8_LOWP_PATH "widen"
#endif
/* acc += the dot of each 4 bytes of a with the 4 bytes of lane `lane` of w (sdot by element) */
#if defined(__ARM_FEATURE_DOTPROD)
#define q8_dot_lane(acc, a, w, lane) vdotq_laneq_s32((acc), (a), (w), (lane))
#else /* no dotprod: the lane broadcast, then i8x16_dot_s32's widening fallback (same sums) */
#define q8_dot_lane(acc, a, w, lane) \
    i8x16_dot_s32((acc), (a), vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(w), (lane))))
#endif
/* NEON: for heads g0 .. g0+H-1 (H <= 2: 16 int32 accumulators), 16 columns from c, over ng groups
 * of 4 rows; V's rows are loaded and interleaved once for the H heads. */
static inline __attribute__((always_inline)) void vkq_lowp16_neon(float *const *vkq, const int8_t *const *vr,
    int c, const fa_lowp_codes *lc, int ng, const int H)
{
    int32x4_t ah[2][4], al[2][4];
    for (int h = 0; h < H; h++)
        for (int i = 0; i < 4; i++) ah[h][i] = al[h][i] = vdupq_n_s32(0);
    int8x16_t wh[2][FA_LOWP_GROUP / 16], wl[2][FA_LOWP_GROUP / 16];
    for (int h = 0; h < H; h++) {
        wh[h][0] = vld1q_s8(lc[h].hi);
        wl[h][0] = vld1q_s8(lc[h].lo);
    }
#define Q8_LOWP_ROWS(g)                                                                                     \
    if ((g) < ng) {                                                                                         \
        int8x16_t r0 = vld1q_s8(vr[4 * (g)] + c), r1 = vld1q_s8(vr[4 * (g) + 1] + c);                       \
        int8x16_t r2 = vld1q_s8(vr[4 * (g) + 2] + c), r3 = vld1q_s8(vr[4 * (g) + 3] + c);                   \
        int16x8_t z01a = vreinterpretq_s16_s8(vzip1q_s8(r0, r1)), z01b = vreinterpretq_s16_s8(vzip2q_s8(r0, r1)); \
        int16x8_t z23a = vreinterpretq_s16_s8(vzip1q_s8(r2, r3)), z23b = vreinterpretq_s16_s8(vzip2q_s8(r2, r3)); \
        int8x16_t x[4] = {vreinterpretq_s8_s16(vzip1q_s16(z01a, z23a)), vreinterpretq_s8_s16(vzip2q_s16(z01a, z23a)), \
                          vreinterpretq_s8_s16(vzip1q_s16(z01b, z23b)), vreinterpretq_s8_s16(vzip2q_s16(z01b, z23b))}; \
        for (int h = 0; h < H; h++)                                                                         \
            for (int i = 0; i < 4; i++) {                                                                   \
                ah[h][i] = q8_dot_lane(ah[h][i], x[i], wh[h][0], (g));                                      \
                al[h][i] = q8_dot_lane(al[h][i], x[i], wl[h][0], (g));                                      \
            }                                                                                               \
    }
    Q8_LOWP_ROWS(0) Q8_LOWP_ROWS(1) Q8_LOWP_ROWS(2) Q8_LOWP_ROWS(3)
#undef Q8_LOWP_ROWS
    for (int h = 0; h < H; h++) {
        float32x4_t d = vdupq_n_f32(lc[h].d);
        for (int i = 0; i < 4; i++) {
            int32x4_t sum = vaddq_s32(vshlq_n_s32(ah[h][i], 7), al[h][i]); /* 128 * hi-part + lo-part */
            float *o = vkq[h] + c + 4 * i;
            vst1q_f32(o, vfmaq_f32(vld1q_f32(o), vcvtq_f32_s32(sum), d));
        }
    }
}
#endif

/* The codes of 16 weights u (zero past the group's tokens) for r = 16256 / (their largest):
 * C = (int)(u * r + 0.5) (one fused multiply-add, truncated: the same integers on every path),
 * hi = C >> 7, lo = C & 127. */
static inline void q8_lowp_codes16(fa_lowp_codes *lc, const float *u, float r)
{
#if !defined(__aarch64__) && defined(__AVX512F__)
    q8_avx512_lowp_codes16(lc, u, r); /* q8_simd_x86.h: all sixteen in one register */
#elif !defined(__aarch64__) && defined(__AVX2__) && defined(__FMA__)
    q8_avx2_lowp_codes16(lc, u, r);   /* q8_simd_x86.h: in two registers */
#else
    for (int k = 0; k < FA_LOWP_GROUP; k += 8) {
        int32x4_t c0 = vcvtq_s32_f32(vfmaq_f32(vdupq_n_f32(0.5f), vld1q_f32(u + k), vdupq_n_f32(r)));
        int32x4_t c1 = vcvtq_s32_f32(vfmaq_f32(vdupq_n_f32(0.5f), vld1q_f32(u + k + 4), vdupq_n_f32(r)));
        c0 = vminq_s32(c0, vdupq_n_s32(FA_LOWP_CMAX));
        c1 = vminq_s32(c1, vdupq_n_s32(FA_LOWP_CMAX));
        int32x4_t h0 = vshrq_n_s32(c0, 7), h1 = vshrq_n_s32(c1, 7);
        int32x4_t l0 = vandq_s32(c0, vdupq_n_s32(127)), l1 = vandq_s32(c1, vdupq_n_s32(127));
        vst1_s8(lc->hi + k, vmovn_s16(vcombine_s16(vmovn_s32(h0), vmovn_s32(h1))));
        vst1_s8(lc->lo + k, vmovn_s16(vcombine_s16(vmovn_s32(l0), vmovn_s32(l1))));
    }
#endif
}

/* vkq[g][0 .. hd) += d_g * sum_j C_gj * V_j[0 .. hd) for the G heads of lc[G] over the rows
 * vr[0 .. 4 ng) (a multiple of 4: padding rows have codes 0); G <= GQA_MAX. Heads go in pairs, so
 * that the accumulators of a pair stay in registers (16 of them on NEON and on x86). */
static inline __attribute__((always_inline)) void vkq_lowp_rows_impl(float *const *vkq, const int8_t *const *vr,
    const fa_lowp_codes *lc, int ng, const int G, int hd)
{
#if !defined(__aarch64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    q8_vnni_lowp_rows(vkq, vr, lc, ng, G, hd); /* q8_simd_x86.h */
#elif !defined(__aarch64__) && defined(__AVX2__)
    q8_avx2_lowp_rows(vkq, vr, lc, ng, G, hd); /* q8_simd_x86.h */
#else
    for (int g = 0; g < G; g += 2)
        for (int c = 0; c < hd; c += 16) {
            if (g + 1 < G) vkq_lowp16_neon(vkq + g, vr, c, lc + g, ng, 2);
            else vkq_lowp16_neon(vkq + g, vr, c, lc + g, ng, 1);
        }
#endif
}
static inline void vkq_lowp_rows(float *vkq, const int8_t *const *vr, const fa_lowp_codes *lc, int ng, int hd)
{
    vkq_lowp_rows_impl(&vkq, vr, lc, ng, 1, hd);
}
static inline void vkq_lowp_rows_group(float *const *vkq, const int8_t *const *vr, const fa_lowp_codes *lc,
    int ng, int G, int hd)
{
    switch (G) { /* a constant G per case, as in vkq_cols_rows_group */
    case 1: vkq_lowp_rows_impl(vkq, vr, lc, ng, 1, hd); break;
    case 2: vkq_lowp_rows_impl(vkq, vr, lc, ng, 2, hd); break;
    case 4: vkq_lowp_rows_impl(vkq, vr, lc, ng, 4, hd); break;
    default: vkq_lowp_rows_impl(vkq, vr, lc, ng, G, hd); break;
    }
}

/* The engine's float -> int8 cast for Q: round half away from zero, then clamp. */
static inline int8_t q_code(float v)
{
    int r = (int)(v + (v >= 0.0f ? 0.5f : -0.5f));
    return (int8_t)(r < -128 ? -128 : (r > 127 ? 127 : r));
}

#if !defined(__aarch64__) && defined(__FMA__) && defined(__SSE4_1__)
#define Q8_EXP_PATH "inline"
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
#ifndef Q8_EXP_PATH
#define Q8_EXP_PATH "libm" /* ARM, and x86 builds without FMA or SSE4.1 */
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

/* A token's place in the cache: block b = t / kv_bs, row r = t % kv_bs. The prefetch walks it one
 * token at a time (fa_pos_next) instead of dividing by the runtime kv_bs for every token: a division
 * is tens of cycles of latency on both targets (in llvm-mca's Neoverse N1 model, make bench-a76, the
 * prefetch's and the V rows' divisions were about 5 of lowp's 65 cycles per token). */
typedef struct { int b, r; } fa_pos;
static inline fa_pos fa_pos_of(int t, int kv_bs) { return (fa_pos){t / kv_bs, t % kv_bs}; }
static inline void fa_pos_next(fa_pos *p, int kv_bs)
{
    /* past a block's last row: the next block's first (the block table says where it is). In
     * arithmetic, not a branch (a select became one), so that every tile runs the same instructions */
    int wrap = ++p->r == kv_bs; /* 1 at a block's end, else 0 */
    p->r &= wrap - 1;           /* 0 at a block's end, else unchanged */
    p->b += wrap;
}

/* Ask for the rows of the token at p (K and V, hd bytes each) to be brought into cache. */
static inline void prefetch_token(int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    fa_pos p, int kv_dim, int kh_off, int hd)
{
    size_t off = (size_t)p.r * kv_dim + kh_off;
    for (int i = 0; i < hd; i += 64) {  /* one prefetch per 64-byte cache line */
        __builtin_prefetch(k_cache_q8[p.b] + off + i);
        __builtin_prefetch(v_cache_q8[p.b] + off + i);
    }
}

/* The path of each helper this build compiled, e.g. "dot=avx2 dot4=vnni vkq=avx512 exp=inline
 * addv=ssse3": each name is defined by the #if branch it names, above (and in q8_simd_x86.h). */
#define Q8_SIMD_PATHS \
    "dot=" Q8_DOT_PATH " dot4=" Q8_DOT4_PATH " vkq=" Q8_VKQ_PATH " exp=" Q8_EXP_PATH " addv=" Q8_ADDV_PATH " lowp=" Q8_LOWP_PATH

#endif
