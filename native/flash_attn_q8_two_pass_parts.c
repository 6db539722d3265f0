/* Lesson 05b: the passes of article 9-2 section 3's variants, and the article's single pass, over a
 * token range, so that KV arriving chunk by chunk can be compared fairly. Every kernel here can fold
 * a chunk in as soon as it arrives; only what needs M (and S) over ALL tokens waits for the last chunk.
 *
 *   flash_attn_single_pass_fold_q8:      the article's token loop (segments 2 and 3) over [t0, t1),
 *                                        continuing the online state (M, S, VKQ) in place.
 *                                        Segment 4 (VKQ / S) is the caller's, once, at the end.
 *   flash_attn_two_pass_scores_pass1_q8: pass 1 of flash_attn_two_pass_scores_q8 over [t0, t1):
 *                                        scores[t] stored, *M raised to their max.
 *   flash_attn_two_pass_scores_rest_q8:  its passes 2 and 3 over tokens [0, seq_len): exp in place
 *                                        and the sum, then V weighted; needs the final M.
 *   flash_attn_two_pass_recompute_pass1_q8: pass 1 of flash_attn_two_pass_recompute_q8 over
 *                                        [t0, t1): M and S online, no V.
 *   flash_attn_two_pass_recompute_pass2_q8: its pass 2 over [0, seq_len): K scored again, and V,
 *                                        with the final M and S.
 *
 * Run over consecutive ranges from 0 to seq_len, each gives the full kernel's result: the same
 * operations in the same order (the max and the online update do not care where a range ends).
 * The arguments are the kernel's; t0, t1 replace seq_len for a pass over a range (0 <= t0 <= t1).
 * Each pass quantizes Q again (segment 1): hd values, nothing next to a chunk of K rows.
 * lessonkit.streaming checks every argument before it calls these.
 */
#include "flash_attn_q8.h"
#include "fa_online.h"

void flash_attn_single_pass_fold_q8(float *restrict vkq, float *restrict m_io, float *restrict s_io,
    const float *restrict q, int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int t0, int t1, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);
    float M = *m_io, S = *s_io;
    for (int t = t0; t < t1; t++) {
        const int8_t *kt = fa_row(k_cache_q8, t, kv_bs, kv_dim, kh_off);
        float s = q8_dot_row(qi, qsc, kt, nblk) * fa_step(kscale, t, nkv) * scale;
        float vsf = fa_online_token(s, &M, &S, vkq, hd); /* segment 3: rescale on a new max */
        const int8_t *vt = fa_row(v_cache_q8, t, kv_bs, kv_dim, kh_off);
        fa_add_row(vkq, vt, vsf * fa_step(vscale, t, nkv), hd);
    }
    *m_io = M;
    *s_io = S;
}

void flash_attn_two_pass_scores_pass1_q8(float *restrict scores, float *restrict m_io, const float *restrict q,
    int8_t *const *k_cache_q8, const float *restrict kscale,
    int t0, int t1, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);
    float M = *m_io;
    for (int t = t0; t < t1; t++) {
        const int8_t *kt = fa_row(k_cache_q8, t, kv_bs, kv_dim, kh_off);
        scores[t] = q8_dot_row(qi, qsc, kt, nblk) * fa_step(kscale, t, nkv) * scale;
        if (scores[t] > M) M = scores[t];
    }
    *m_io = M;
}

void flash_attn_two_pass_scores_rest_q8(float *restrict attn_out, float *restrict scores, float M,
    int8_t *const *v_cache_q8, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd)
{
    if (!fa_hd_ok(hd)) return;
    /* pass 2: exp(s - M) in place, and their sum */
    float S = 0.0f;
    for (int t = 0; t < seq_len; t++) {
        scores[t] = expf(scores[t] - M);
        S += scores[t];
    }
    /* pass 3: weight V by the stored weights */
    float VKQ[HD_MAX] = {0};
    for (int t = 0; t < seq_len; t++) {
        const int8_t *vt = fa_row(v_cache_q8, t, kv_bs, kv_dim, kh_off);
        fa_add_row(VKQ, vt, scores[t] * fa_step(vscale, t, nkv), hd);
    }
    float inv = S > 0.0f ? 1.0f / S : 0.0f;
    for (int i = 0; i < hd; i++) attn_out[i] = VKQ[i] * inv;
}

void flash_attn_two_pass_recompute_pass1_q8(float *restrict m_io, float *restrict s_io, const float *restrict q,
    int8_t *const *k_cache_q8, const float *restrict kscale,
    int t0, int t1, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);
    float M = *m_io, S = *s_io;
    for (int t = t0; t < t1; t++) {
        const int8_t *kt = fa_row(k_cache_q8, t, kv_bs, kv_dim, kh_off);
        float s = q8_dot_row(qi, qsc, kt, nblk) * fa_step(kscale, t, nkv) * scale;
        if (s > M) {
            S *= expf(M - s);
            M = s;
        }
        S += expf(s - M);
    }
    *m_io = M;
    *s_io = S;
}

void flash_attn_two_pass_recompute_pass2_q8(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale, float M, float S,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);
    float inv = S > 0.0f ? 1.0f / S : 0.0f;
    float VKQ[HD_MAX] = {0};
    for (int t = 0; t < seq_len; t++) {
        const int8_t *kt = fa_row(k_cache_q8, t, kv_bs, kv_dim, kh_off);
        float s = q8_dot_row(qi, qsc, kt, nblk) * fa_step(kscale, t, nkv) * scale;
        const int8_t *vt = fa_row(v_cache_q8, t, kv_bs, kv_dim, kh_off);
        fa_add_row(VKQ, vt, expf(s - M) * inv * fa_step(vscale, t, nkv), hd);
    }
    for (int i = 0; i < hd; i++) attn_out[i] = VKQ[i];
}
