/* Article 9-2, section 3: "what if the online rescale were dropped and all scores stored first?"
 * Two such kernels, with the single-pass kernel's arguments and output, so that lesson 05 and
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
 *
 * The passes themselves are the functions of flash_attn_q8_two_pass_parts.c, which lesson 05b
 * also runs chunk by chunk: here each kernel runs them once over all seq_len tokens.
 */
#include <stdlib.h>
#include <string.h>

#include "fa_variants.h"
#include "fa_online.h"

void flash_attn_two_pass_scores_q8(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    memset(attn_out, 0, (size_t)hd * sizeof(float));
    float *scores = seq_len > 0 ? malloc((size_t)seq_len * sizeof(float)) : NULL;
    if (scores == NULL) return; /* no tokens (or no memory): the output stays 0 */
    float M = -1e9f;
    /* pass 1: every score, stored; their max */
    flash_attn_two_pass_scores_pass1_q8(scores, &M, q, k_cache_q8, kscale, 0, seq_len, kv_dim, kv_bs, nkv,
                                        kh_off, hd, scale);
    /* pass 2: exp(s - M) in place, and their sum; pass 3: V weighted by the stored weights */
    flash_attn_two_pass_scores_rest_q8(attn_out, scores, M, v_cache_q8, vscale, seq_len, kv_dim, kv_bs, nkv,
                                       kh_off, hd);
    free(scores);
}

void flash_attn_two_pass_recompute_q8(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    float M = -1e9f, S = 0.0f;
    /* pass 1: read K for the max M and the sum S (online, but without V) */
    flash_attn_two_pass_recompute_pass1_q8(&M, &S, q, k_cache_q8, kscale, 0, seq_len, kv_dim, kv_bs, nkv,
                                           kh_off, hd, scale);
    /* pass 2: read K again for each score, and V, with the final M and S known */
    flash_attn_two_pass_recompute_pass2_q8(attn_out, q, k_cache_q8, v_cache_q8, kscale, vscale, M, S, seq_len,
                                           kv_dim, kv_bs, nkv, kh_off, hd, scale);
}

/* The same two kernels built from the fast version's steps (fa_online.h): K rows scored four
 * at a time (fa_score_tile), weights by the 4-lane exp, V added with VKQ's columns in registers over
 * a tile of FA_TILE rows, magic-number conversion. What lesson 05 compares with the fast variant. */
void flash_attn_two_pass_scores_q8_fast(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    memset(attn_out, 0, (size_t)hd * sizeof(float));
    /* rounded up to whole groups of four: fa_score_tile writes four lanes at a time */
    float *scores = seq_len > 0 ? malloc(((size_t)seq_len + 4) * sizeof(float)) : NULL;
    if (scores == NULL) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);

    /* pass 1: every score, stored; their max */
    float M = -1e9f;
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        fa_score_tile(scores + t0, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        for (int j = 0; j < n; j++) M = scores[t0 + j] > M ? scores[t0 + j] : M;
    }
    /* pass 2: exp(s - M) in place, four at a time, and their sum */
    float32x4_t mv = vdupq_n_f32(M), sum = vdupq_n_f32(0.0f);
    int t = 0;
    for (; t + 4 <= seq_len; t += 4) {
        float32x4_t e = fa_expq_f32(vsubq_f32(vld1q_f32(scores + t), mv));
        vst1q_f32(scores + t, e);
        sum = vaddq_f32(sum, e);
    }
    float S = vaddvq_f32(sum);
    for (; t < seq_len; t++) {
        scores[t] = expf(scores[t] - M);
        S += scores[t];
    }
    /* pass 3: V weighted by the stored weights, a tile of rows at a time */
    float VKQ[HD_MAX] = {0};
    float w[FA_TILE];
    const int8_t *vr[FA_TILE];
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        for (int j = 0; j < n; j++) {
            w[j] = scores[t0 + j] * fa_step(vscale, t0 + j, nkv);
            vr[j] = fa_row(v_cache_q8, t0 + j, kv_bs, kv_dim, kh_off);
        }
        fa_vkq_tile_magic(VKQ, vr, w, n, hd);
    }
    free(scores);
    fa_normalize(attn_out, VKQ, S, hd);
}

void flash_attn_two_pass_recompute_q8_fast(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);
    float st[FA_TILE4], w[FA_TILE4];
    const int8_t *vr[FA_TILE];

    /* pass 1: read K for the max M and the sum S, a tile at a time (one rescale of S per tile) */
    float M = -1e9f, S = 0.0f;
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        fa_rescale_tile(st, n, &M, &S, NULL, 0); /* no VKQ yet: hd 0 rescales nothing */
        S += fa_exp_tile(w, st, n, M);
    }
    /* pass 2: read K again for each score, and V, with the final M and S known */
    float inv = S > 0.0f ? 1.0f / S : 0.0f;
    float VKQ[HD_MAX] = {0};
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        fa_exp_tile(w, st, n, M); /* the weights; their sum is known already */
        for (int j = 0; j < n; j++) {
            w[j] *= inv * fa_step(vscale, t0 + j, nkv);
            vr[j] = fa_row(v_cache_q8, t0 + j, kv_bs, kv_dim, kh_off);
        }
        fa_vkq_tile_magic(VKQ, vr, w, n, hd);
    }
    for (int i = 0; i < hd; i++) attn_out[i] = VKQ[i];
}
