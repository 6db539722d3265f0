/* flash_attn_single_q_q8_neon: decode attention for one query over the q8 KV cache, in one pass.
 * Article 9-2, section 2. It reads top to bottom like the article: Q to int8 once, then one scan
 * over the tokens that scores each one and folds it into an online softmax, then one division.
 *
 * The "== segment N ==" comments mark the article's four segments; lessonkit.source finds the
 * lessons' line ranges through them, so keep them when you edit.
 *
 * The SIMD helpers it calls (i8x16_dot_s32, vkq_add_i8x16, q_code) are in q8_simd.h;
 * on x86 that header also turns expf into an inline version (libm's is a function call there).
 *
 * Compile lines (lessonkit.native.build() runs the right one for your machine):
 *   aarch64 with dotprod:  cc -O3 -march=armv8.2-a+dotprod -shared -fPIC -o fa.so *.c -lm
 *   aarch64 without:       cc -O3 -march=armv8-a           -shared -fPIC -o fa.so *.c -lm
 *   x86-64 through SIMDe:  cc -O3 -march=native -I<simde include dir> -shared -fPIC -o fa.so *.c -lm
 */
#include "flash_attn_q8.h"
#include "q8_simd.h"

/* Hooks that let flash_attn_q8_traced.c compile this same kernel a second time, under another
 * name, recording what it computes. Here they are empty: this build does no extra work. */
#ifndef TRACE_Q
#define TRACE_Q(qi, qsc, nblk)
#define TRACE_DOT(t, b, dot32)
#define TRACE_RESCALE(t, ms)
#define TRACE_K_ROW(t, kt)
#define TRACE_TOKEN(t, vt, s, M, S, VKQ, hd)
#endif

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

    for (int t = 0; t < seq_len; t++) { /* one pass over the tokens: each K and V row is read once */
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
        TRACE_K_ROW(t, kt);
        /* == end segment 2 == */

        /* == segment 3: online softmax: rescale on a new max, accumulate V == */
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
        for (int i = 0; i < hd; i += 16) vkq_add_i8x16(VKQ + i, vt + i, w);
        TRACE_TOKEN(t, vt, s, M, S, VKQ, hd);
        /* == end segment 3 == */
    }

    /* == segment 4: normalize once == */
    float inv = S > 0.0f ? 1.0f / S : 0.0f;
    float32x4_t invv = vdupq_n_f32(inv);
    for (int i = 0; i < hd; i += 4) vst1q_f32(attn_out + i, vmulq_f32(vld1q_f32(VKQ + i), invv));
    /* == end segment 4 == */
}
