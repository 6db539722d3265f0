/* flash_attn_partial_q8_neon: the article's single pass over a range of tokens [t_begin, t_end)
 * of one query head, stopped before the division: it returns the unnormalized online-softmax
 * state instead of the output. Beyond the article: lesson 08 (split-KV, Flash-Decoding 2023).
 *
 * The state of a run of tokens is (M, S, VKQ): M the largest score, S = sum exp(s - M) and
 * VKQ[hd] = sum exp(s - M) * v over the run. States of disjoint runs merge exactly:
 *     M = max(M1, M2),  S = S1 e^(M1 - M) + S2 e^(M2 - M),  VKQ = VKQ1 e^(M1 - M) + VKQ2 e^(M2 - M),
 * and the output is VKQ / S. So one long sequence can be cut into chunks scanned in parallel
 * (lessonkit.attend_split runs them on threads and merges with lessonkit.streaming.merge).
 * The original engine has no such split (docs/references.md).
 *
 * Arguments: those of flash_attn_single_q_q8_neon, except
 *   vkq_out [hd], m_out, s_out   the state written (no attn_out);
 *   t_begin, t_end               the token range, 0 <= t_begin <= t_end, in place of seq_len;
 *                                token t is read where the kernel reads it (kscale[t * nkv], ...).
 * An empty range gives the state of no token: M = -1e9 (the kernel's start), S = 0, VKQ = 0.
 * Per token the arithmetic is the kernel's (same helpers, same order): a chunk's state is the
 * kernel's M, S, VKQ after that chunk's last token, had the kernel started at t_begin.
 */
#include "flash_attn_q8.h"
#include "q8_simd.h"

#ifndef FA_TILE
#define FA_TILE 8 /* tokens scored before the softmax folds them in, as in the article's kernel */
#endif

void flash_attn_partial_q8_neon(float *restrict vkq_out, float *restrict m_out, float *restrict s_out,
    const float *restrict q, int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int t_begin, int t_end, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (hd <= 0 || hd > HD_MAX || hd % QBLK != 0) return;
    const int nblk = hd / QBLK;

    /* segment 1: Q to int8, once per call */
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    q8_quantize_q(q, nblk, qi, qsc);

    float M = -1e9f, S = 0.0f; /* the state of no token */
    float *VKQ = vkq_out;      /* accumulated in place */
    for (int i = 0; i < hd; i += 4) vst1q_f32(VKQ + i, vdupq_n_f32(0.0f));

    float st[FA_TILE];
    for (int t0 = t_begin; t0 < t_end; t0 += FA_TILE) {
        const int t1 = t0 + FA_TILE < t_end ? t0 + FA_TILE : t_end;

        /* segment 2: score tokens t0 .. t1-1 */
        for (int t = t0; t < t1; t++) {
            if (FA_PREFETCH > 0 && t + FA_PREFETCH < t_end)
                prefetch_token(k_cache_q8, v_cache_q8, t + FA_PREFETCH, kv_bs, kv_dim, kh_off, hd);
            const int8_t *kt = k_cache_q8[t / kv_bs] + (size_t)(t % kv_bs) * kv_dim + kh_off;
            st[t - t0] = q8_dot_row(qi, qsc, kt, nblk) * (kscale[(size_t)t * nkv] * KVQ_INV) * scale;
        }

        /* segment 3: online softmax, token by token */
        for (int t = t0; t < t1; t++) {
            float s = st[t - t0];
            float vsf;
            if (s > M) {
                float ms = expf(M - s);
                M = s;
                S *= ms;
                float32x4_t msv = vdupq_n_f32(ms);
                for (int i = 0; i < hd; i += 4) vst1q_f32(VKQ + i, vmulq_f32(vld1q_f32(VKQ + i), msv));
                vsf = 1.0f;
            } else {
                vsf = expf(s - M);
            }
            S += vsf;
            const int8_t *vt = v_cache_q8[t / kv_bs] + (size_t)(t % kv_bs) * kv_dim + kh_off;
            float32x4_t w = vdupq_n_f32(vsf * (vscale[(size_t)t * nkv] * KVQ_INV));
            for (int i = 0; i < hd; i += 16) vkq_add_i8x16(VKQ + i, vt + i, w);
        }
    }

    /* no segment 4: the caller merges states and divides once, at the very end */
    *m_out = M;
    *s_out = S;
}
