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

#include "fa_variants.h"
#include "fa_online.h"

#define row fa_row

void flash_attn_two_pass_scores_q8(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    memset(attn_out, 0, (size_t)hd * sizeof(float));
    float *scores = seq_len > 0 ? malloc((size_t)seq_len * sizeof(float)) : NULL;
    if (scores == NULL) return; /* no tokens (or no memory): the output stays 0 */
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);

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
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);

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

/* The same two alternatives built from the fast variant's steps (fa_online.h): K rows scored four
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
            w[j] = scores[t0 + j] * (vscale[(size_t)(t0 + j) * nkv] * KVQ_INV);
            vr[j] = row(v_cache_q8, t0 + j, kv_bs, kv_dim, kh_off);
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
        fa_online_tile(w, st, n, &M, &S, NULL, 0); /* no VKQ yet: hd 0 rescales nothing */
    }
    /* pass 2: read K again for each score, and V, with the final M and S known */
    float inv = S > 0.0f ? 1.0f / S : 0.0f;
    float VKQ[HD_MAX] = {0};
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        for (int j = n; j < (n + 3) / 4 * 4; j++) st[j] = -INFINITY;
        float32x4_t mv = vdupq_n_f32(M);
        for (int j = 0; j < n; j += 4) vst1q_f32(w + j, fa_expq_f32(vsubq_f32(vld1q_f32(st + j), mv)));
        for (int j = 0; j < n; j++) {
            w[j] *= inv * (vscale[(size_t)(t0 + j) * nkv] * KVQ_INV);
            vr[j] = row(v_cache_q8, t0 + j, kv_bs, kv_dim, kh_off);
        }
        fa_vkq_tile_magic(VKQ, vr, w, n, hd);
    }
    for (int i = 0; i < hd; i++) attn_out[i] = VKQ[i];
}
