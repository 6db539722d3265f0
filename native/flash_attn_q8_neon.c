/* flash_attn_single_q_q8_neon: decode attention for one query over the q8 KV cache, in one pass.
 * Article 9-2, section 2. It reads top to bottom like the article: Q to int8 once, then one scan
 * over the tokens that scores each one and folds it into an online softmax, then one division.
 *
 * The "== segment N ==" comments mark the article's four segments; lessonkit.source finds the
 * lessons' line ranges through them, so keep them when you edit.
 *
 * Compile lines (lessonkit.native.build() runs the right one for your machine):
 *   aarch64 with dotprod:  cc -O3 -march=armv8.2-a+dotprod -shared -fPIC -o fa.so *.c -lm
 *   aarch64 without:       cc -O3 -march=armv8-a           -shared -fPIC -o fa.so *.c -lm
 *   x86-64 through SIMDe:  cc -O3 -march=native -I<simde include dir> -shared -fPIC -o fa.so *.c -lm
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__aarch64__)
#include <arm_neon.h>
#else
/* Not a 64-bit ARM CPU (the kernel uses AArch64-only intrinsics such as vaddvq_s32): SIMDe provides the same intrinsics, by the same names, in portable C. */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/arm/neon.h>
#endif

#include "flash_attn_q8.h"

#define KVQ_INV (1.0f / 127.0f) /* K/V scales are stored as raw max|x|; code * max / 127 is the value */
#define QBLK 32                 /* Q is quantized in blocks of 32 values, like llama.cpp's q8_0 */
#define HD_MAX 256              /* the fixed buffers below hold at most 256 values of Q */

/* Hooks that let flash_attn_q8_traced.c compile this same kernel a second time, under another
 * name, recording what it computes. Here they are empty: this build does no extra work. */
#ifndef TRACE_Q
#define TRACE_Q(qi, qsc, nblk)
#define TRACE_DOT(t, b, dot32)
#define TRACE_RESCALE(t, ms)
#define TRACE_TOKEN(t, kt, vt, s, M, S, VKQ, hd)
#endif

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
#else
    return vdotq_s32(acc, a, b); /* SIMDe's version of sdot */
#endif
}

/* The engine's float -> int8 cast for Q: round half away from zero, then clamp. */
static inline int8_t q_code(float v)
{
    int r = (int)(v + (v >= 0.0f ? 0.5f : -0.5f));
    return (int8_t)(r < -128 ? -128 : (r > 127 ? 127 : r));
}

void flash_attn_single_q_q8_neon(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (hd <= 0 || hd > HD_MAX || hd % QBLK != 0) return; /* the caller's contract; lessonkit checks it */
    const int nblk = hd / QBLK;

    /* == segment 1: Q -> int8, once per call == */
    float qsc[HD_MAX / QBLK]; /* one scale per 32-value block of Q */
    int8_t qi[HD_MAX];        /* Q's int8 codes */
    for (int b = 0; b < nblk; b++) {
        const float *qb = q + b * QBLK;
        float qm = 0.0f;
        for (int i = 0; i < QBLK; i++) qm = fmaxf(qm, fabsf(qb[i]));
        if (qm < 1e-6f) qm = 1.0f; /* an all-zero block would divide by zero */
        qsc[b] = qm * KVQ_INV;
        float iq = 127.0f / qm;
        for (int i = 0; i < QBLK; i++) qi[b * QBLK + i] = q_code(qb[i] * iq);
    }
    TRACE_Q(qi, qsc, nblk);
    /* == end segment 1 == */

    float M = -1e9f, S = 0.0f; /* running max of the scores, running sum of exp(s - M) */
    float VKQ[HD_MAX];         /* running sum of exp(s - M) * V, not yet divided by S */
    for (int i = 0; i < hd; i += 4) vst1q_f32(VKQ + i, vdupq_n_f32(0.0f));

    for (int t = 0; t < seq_len; t++) {
        /* == segment 2: score token t == */
        const int8_t *kt = k_cache_q8[t / kv_bs] + (size_t)(t % kv_bs) * kv_dim + kh_off;
        float ks = kscale[(size_t)t * nkv] * KVQ_INV;
        float s = 0.0f;
        for (int b = 0; b < nblk; b++) {
            /* the integer dot is the skeleton; the block's float scale is restored right after */
            int32x4_t acc = vdupq_n_s32(0);
            acc = i8x16_dot_s32(acc, vld1q_s8(qi + b * QBLK), vld1q_s8(kt + b * QBLK));
            acc = i8x16_dot_s32(acc, vld1q_s8(qi + b * QBLK + 16), vld1q_s8(kt + b * QBLK + 16));
            int32_t dot32 = vaddvq_s32(acc);
            TRACE_DOT(t, b, dot32);
            s += (float)dot32 * qsc[b];
        }
        s = s * ks * scale;
        /* == end segment 2 == */

        /* == segment 3: online softmax, rescale on a new max, accumulate V == */
        float vsf; /* this token's weight exp(s - M), relative to the current max */
        if (s > M) {
            float ms = expf(M - s); /* shrinks everything summed so far to the new max */
            TRACE_RESCALE(t, ms);
            M = s;
            S *= ms;
            float32x4_t msv = vdupq_n_f32(ms);
            for (int i = 0; i < hd; i += 4) vst1q_f32(VKQ + i, vmulq_f32(vld1q_f32(VKQ + i), msv));
            vsf = 1.0f;
        } else {
            vsf = expf(s - M);
        }
        S += vsf;

        /* VKQ += V_int8 * (vsf * vs): V stays int8 in memory, the weight stays fp32 */
        const int8_t *vt = v_cache_q8[t / kv_bs] + (size_t)(t % kv_bs) * kv_dim + kh_off;
        float vs = vscale[(size_t)t * nkv] * KVQ_INV;
        float32x4_t w = vdupq_n_f32(vsf * vs);
        for (int i = 0; i < hd; i += 16) {
            int8x16_t v8 = vld1q_s8(vt + i);
            int16x8_t v16lo = vmovl_s8(vget_low_s8(v8)), v16hi = vmovl_high_s8(v8);
            float32x4_t f0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(v16lo)));
            float32x4_t f1 = vcvtq_f32_s32(vmovl_high_s16(v16lo));
            float32x4_t f2 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(v16hi)));
            float32x4_t f3 = vcvtq_f32_s32(vmovl_high_s16(v16hi));
            vst1q_f32(VKQ + i + 0, vfmaq_f32(vld1q_f32(VKQ + i + 0), f0, w));
            vst1q_f32(VKQ + i + 4, vfmaq_f32(vld1q_f32(VKQ + i + 4), f1, w));
            vst1q_f32(VKQ + i + 8, vfmaq_f32(vld1q_f32(VKQ + i + 8), f2, w));
            vst1q_f32(VKQ + i + 12, vfmaq_f32(vld1q_f32(VKQ + i + 12), f3, w));
        }
        TRACE_TOKEN(t, kt, vt, s, M, S, VKQ, hd);
        /* == end segment 3 == */
    }

    /* == segment 4: normalize once == */
    float inv = S > 0.0f ? 1.0f / S : 0.0f;
    float32x4_t invv = vdupq_n_f32(inv);
    for (int i = 0; i < hd; i += 4) vst1q_f32(attn_out + i, vmulq_f32(vld1q_f32(VKQ + i), invv));
    /* == end segment 4 == */
}

const char *fa_backend(void)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return "neon+dotprod";
#elif defined(__aarch64__)
    return "neon";
#elif defined(__x86_64__)
    return "simde-x86_64";
#else
    return "simde-generic";
#endif
}
