/* flash_attn_group_q8_neon: decode attention for the G query heads that share one kv head (GQA),
 * in ONE scan over that kv head's KV. Beyond the article: lesson 08.
 *
 * Under grouped-query attention several query heads share one kv head (Qwen3-8B: 32 query heads
 * over 8 kv heads, G = 4 per group). The original engine, like the article's kernel, runs one call
 * per query head, so each of the G calls reads the same K and V rows again (see docs/references.md):
 * "for each head: for each token". Here the two loops are interchanged, "for each token: for each
 * head": one walk over the tokens serves all G query heads, so each K row, V row and scale comes
 * from memory once, and heads 1 .. G-1 find it in the L1 cache. Every query head keeps its own Q
 * codes, its own M, S and VKQ, and goes through exactly the per-head kernel's arithmetic in the
 * same order, so the result equals G calls of flash_attn_single_q_q8_neon (up to where a compiler
 * fuses a multiply-add in one and not in the other).
 *
 * Arguments: those of flash_attn_single_q_q8_neon, except
 *   q         [G][hd]: the group's G query heads, one after the other;
 *   attn_out  [G][hd]: their outputs, in the same order;
 *   G         the number of query heads in the group, 1 <= G <= 8 (GQA_MAX: the fixed buffers
 *             below); any other G, like a bad hd, returns without writing anything.
 * The segment comments follow the article's kernel (flash_attn_q8_neon.c); here they carry no
 * "== segment ==" markers, which belong to the article's kernel alone.
 */
#include "flash_attn_q8.h"
#include "q8_simd.h"

#define GQA_MAX 8 /* query heads per call (Qwen3-8B: 4); more would need bigger buffers */

#ifndef FA_TILE
#define FA_TILE 8 /* tokens scored before the softmax folds them in, as in the article's kernel */
#endif

void flash_attn_group_q8_neon(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale, int G)
{
    if (hd <= 0 || hd > HD_MAX || hd % QBLK != 0 || G < 1 || G > GQA_MAX) return;
    const int nblk = hd / QBLK;

    /* segment 1, once per query head: G sets of int8 codes and block scales */
    int8_t qi[GQA_MAX][HD_MAX];
    float qsc[GQA_MAX][HD_MAX / QBLK];
    for (int g = 0; g < G; g++) q8_quantize_q(q + (size_t)g * hd, nblk, qi[g], qsc[g]);

    /* one online-softmax state per query head: 4 + 4 + 4 * hd bytes each */
    float M[GQA_MAX], S[GQA_MAX];
    float VKQ[GQA_MAX][HD_MAX];
    for (int g = 0; g < G; g++) {
        M[g] = -1e9f;
        S[g] = 0.0f;
        for (int i = 0; i < hd; i += 4) vst1q_f32(VKQ[g] + i, vdupq_n_f32(0.0f));
    }

    float st[FA_TILE][GQA_MAX]; /* the tile's scores, one per (token, query head) */
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int t1 = t0 + FA_TILE < seq_len ? t0 + FA_TILE : seq_len;

        /* segment 2: score tokens t0 .. t1-1 for all G query heads. The K row comes from memory
         * once, for head 0; heads 1 .. G-1 find it in the L1 cache a few nanoseconds later. */
        for (int t = t0; t < t1; t++) {
            if (FA_PREFETCH > 0 && t + FA_PREFETCH < seq_len)
                prefetch_token(k_cache_q8, v_cache_q8, t + FA_PREFETCH, kv_bs, kv_dim, kh_off, hd);
            const int8_t *kt = k_cache_q8[t / kv_bs] + (size_t)(t % kv_bs) * kv_dim + kh_off;
            float ks = kscale[(size_t)t * nkv] * KVQ_INV;
            for (int g = 0; g < G; g++) st[t - t0][g] = q8_dot_row(qi[g], qsc[g], kt, nblk) * ks * scale;
        }

        /* segment 3: each query head's online softmax, then the V row into every head's VKQ */
        for (int t = t0; t < t1; t++) {
            float vs = vscale[(size_t)t * nkv] * KVQ_INV;
            float32x4_t w[GQA_MAX]; /* query head g's weight for this token's V row: vsf * vs */
            for (int g = 0; g < G; g++) {
                float s = st[t - t0][g];
                float vsf;
                if (s > M[g]) {
                    float ms = expf(M[g] - s); /* head g's new max shrinks only head g's sums */
                    M[g] = s;
                    S[g] *= ms;
                    float32x4_t msv = vdupq_n_f32(ms);
                    for (int i = 0; i < hd; i += 4) vst1q_f32(VKQ[g] + i, vmulq_f32(vld1q_f32(VKQ[g] + i), msv));
                    vsf = 1.0f;
                } else {
                    vsf = expf(s - M[g]);
                }
                S[g] += vsf;
                w[g] = vdupq_n_f32(vsf * vs);
            }
            const int8_t *vt = v_cache_q8[t / kv_bs] + (size_t)(t % kv_bs) * kv_dim + kh_off;
            for (int g = 0; g < G; g++) /* the V row, from memory once, then from L1 */
                for (int i = 0; i < hd; i += 16) vkq_add_i8x16(VKQ[g] + i, vt + i, w[g]);
        }
    }

    /* segment 4: normalize each query head once */
    for (int g = 0; g < G; g++) {
        float32x4_t invv = vdupq_n_f32(S[g] > 0.0f ? 1.0f / S[g] : 0.0f);
        for (int i = 0; i < hd; i += 4)
            vst1q_f32(attn_out + (size_t)g * hd + i, vmulq_f32(vld1q_f32(VKQ[g] + i), invv));
    }
}
