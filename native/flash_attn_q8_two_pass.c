/* Article 9-2, section 3: "what if the online rescale were dropped and all scores stored first?"
 * Two such variants, with the single-pass kernel's arguments and output, so that lesson 05 and
 * the benchmark can measure what the article claims the single pass saves.
 *
 *   flash_attn_two_pass_scores_q8:    pass 1 reads K and writes seq_len scores (and finds the max),
 *                                     pass 2 exponentiates the scores in place and sums them,
 *                                     pass 3 reads V and weights it by the stored scores.
 *                                     KV is read once, but a score array of 4 * seq_len bytes is
 *                                     written, read, written and read again.
 *   flash_attn_two_pass_recompute_q8: pass 1 reads K for the max M and the sum S, storing nothing;
 *                                     pass 2 reads K again to recompute each score, and V.
 *                                     No score array, but K is read twice.
 */
#include <stdlib.h>
#include <string.h>

#include "flash_attn_q8.h"
#include "q8_simd.h"

/* token t's row of one kv head in a block-pointer cache */
static inline const int8_t *row(int8_t *const *cache, int t, int kv_bs, int kv_dim, int kh_off)
{
    return cache[t / kv_bs] + (size_t)(t % kv_bs) * kv_dim + kh_off;
}

void flash_attn_two_pass_scores_q8(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (hd <= 0 || hd > HD_MAX || hd % QBLK != 0) return;
    memset(attn_out, 0, (size_t)hd * sizeof(float));
    float *scores = seq_len > 0 ? malloc((size_t)seq_len * sizeof(float)) : NULL;
    if (scores == NULL) return; /* no tokens (or no memory): the output stays 0 */
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    q8_quantize_q(q, nblk, qi, qsc);

    /* pass 1: every score, stored; their max */
    float M = -1e9f;
    for (int t = 0; t < seq_len; t++) {
        float ks = kscale[(size_t)t * nkv] * KVQ_INV;
        scores[t] = q8_dot_row(qi, qsc, row(k_cache_q8, t, kv_bs, kv_dim, kh_off), nblk) * ks * scale;
        if (scores[t] > M) M = scores[t];
    }
    /* pass 2: exp(s - M) in place, and their sum */
    float S = 0.0f;
    for (int t = 0; t < seq_len; t++) {
        scores[t] = expf(scores[t] - M);
        S += scores[t];
    }
    /* pass 3: weight V by the stored weights */
    float VKQ[HD_MAX] = {0};
    for (int t = 0; t < seq_len; t++) {
        float32x4_t w = vdupq_n_f32(scores[t] * (vscale[(size_t)t * nkv] * KVQ_INV));
        const int8_t *vt = row(v_cache_q8, t, kv_bs, kv_dim, kh_off);
        for (int i = 0; i < hd; i += 16) vkq_add_i8x16(VKQ + i, vt + i, w);
    }
    free(scores);
    float inv = S > 0.0f ? 1.0f / S : 0.0f;
    for (int i = 0; i < hd; i++) attn_out[i] = VKQ[i] * inv;
}

void flash_attn_two_pass_recompute_q8(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (hd <= 0 || hd > HD_MAX || hd % QBLK != 0) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    q8_quantize_q(q, nblk, qi, qsc);

    /* pass 1: read K for the max M and the sum S (online, but without V) */
    float M = -1e9f, S = 0.0f;
    for (int t = 0; t < seq_len; t++) {
        float ks = kscale[(size_t)t * nkv] * KVQ_INV;
        float s = q8_dot_row(qi, qsc, row(k_cache_q8, t, kv_bs, kv_dim, kh_off), nblk) * ks * scale;
        if (s > M) {
            S *= expf(M - s);
            M = s;
        }
        S += expf(s - M);
    }
    /* pass 2: read K again for each score, and V, with the final M and S known */
    float inv = S > 0.0f ? 1.0f / S : 0.0f;
    float VKQ[HD_MAX] = {0};
    for (int t = 0; t < seq_len; t++) {
        float ks = kscale[(size_t)t * nkv] * KVQ_INV;
        float s = q8_dot_row(qi, qsc, row(k_cache_q8, t, kv_bs, kv_dim, kh_off), nblk) * ks * scale;
        float32x4_t w = vdupq_n_f32(expf(s - M) * inv * (vscale[(size_t)t * nkv] * KVQ_INV));
        const int8_t *vt = row(v_cache_q8, t, kv_bs, kv_dim, kh_off);
        for (int i = 0; i < hd; i += 16) vkq_add_i8x16(VKQ + i, vt + i, w);
    }
    for (int i = 0; i < hd; i++) attn_out[i] = VKQ[i];
}
