/* flash_attn_group_q8_lowp: the grouped kernel of lesson 08 (flash_attn_q8_group.c: the G query heads
 * that share one kv head, in one scan) with the accumulation of lesson 09's version lowp
 * (flash_attn_q8_v14_lowp, with its prefetch): each head's weights of every 16 tokens as 14-bit integer codes with one
 * fp32 step, V times them by int8 dot products. What the heads share is V's part: four V rows are
 * loaded and interleaved once for a pair of heads, then each head's codes meet them in its own dot
 * products (vkq_lowp_rows_group, q8_simd.h). Every head keeps its own fp32 M, S and VKQ, and goes
 * through the single-head version's arithmetic in the same order, so row g equals
 * flash_attn_q8_v14_lowp on query head g (to the last bit where the compiler fuses alike).
 * Arguments: those of flash_attn_group_q8_neon (1 <= G <= 8; anything else, or a bad hd, writes
 * nothing). The scores are the exact grouped kernel's: fa_score4 per head (on AVX-512 VNNI the K
 * rows shared by all heads, q8_vnni_score4_group). */
#include "flash_attn_q8.h"
#include "fa_online.h"

void flash_attn_group_q8_lowp(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale, int G)
{
    if (!fa_hd_ok(hd) || G < 1 || G > GQA_MAX) return;
    const int nblk = hd / QBLK;

    /* segment 1, once per query head */
    int8_t qi[GQA_MAX][HD_MAX];
    float qsc[GQA_MAX][HD_MAX / QBLK];
    for (int g = 0; g < G; g++) fa_quantize_q(q + (size_t)g * hd, nblk, qi[g], qsc[g]);

    float M[GQA_MAX], S[GQA_MAX];
    float VKQ[GQA_MAX][HD_MAX];
    for (int g = 0; g < G; g++) {
        M[g] = -1e9f;
        S[g] = 0.0f;
        for (int i = 0; i < hd; i++) VKQ[g][i] = 0.0f;
    }
#ifdef Q8_GROUP_SHARED_K
    q8_vnni_q pq[GQA_MAX];
    for (int g = 0; g < G; g++) q8_vnni_q_prepare(&pq[g], qi[g], qsc[g], nblk);
#endif
    float *vkq[GQA_MAX];
    for (int g = 0; g < G; g++) vkq[g] = VKQ[g];
    float st[GQA_MAX][FA_TILE4], w[GQA_MAX][FA_TILE4];
    const int8_t *kr[FA_TILE4], *vr[FA_TILE];
    float ks[FA_TILE4], vs[FA_TILE];
    fa_pos pf = fa_pos_of(FA_PREFETCH, kv_bs); /* the token to prefetch next (v10) */
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        /* as version lowp: the K and V rows FA_PREFETCH tokens ahead asked for now (v10) */
        const int ahead = seq_len - t0 - FA_PREFETCH < n ? seq_len - t0 - FA_PREFETCH : n; /* rows that exist */
        for (int j = 0; FA_PREFETCH > 0 && j < ahead; j++, fa_pos_next(&pf, kv_bs))
            prefetch_token(k_cache_q8, v_cache_q8, pf, kv_dim, kh_off, hd);
        fa_tile_rows(kr, k_cache_q8, t0, n, kv_bs, kv_dim, kh_off);
        fa_tile_rows(vr, v_cache_q8, t0, n, kv_bs, kv_dim, kh_off);
        for (int j = 0; j < (n + 3) / 4 * 4; j++) {
            int t = t0 + (j < n ? j : n - 1);
            kr[j] = kr[t - t0];
            ks[j] = kscale[(size_t)t * nkv] * KVQ_INV * scale;
        }
        for (int j = 0; j < n; j++) vs[j] = vscale[(size_t)(t0 + j) * nkv] * KVQ_INV;

        /* segment 2 and 3's weights, per query head, as in flash_attn_group_q8_neon */
#ifdef Q8_GROUP_SHARED_K
        for (int j = 0; j < n; j += 4) {
            switch (G) {
            case 1: q8_vnni_score4_group(&st[0][0], FA_TILE4, j, qi, pq, nblk, kr, ks, 1); break;
            case 2: q8_vnni_score4_group(&st[0][0], FA_TILE4, j, qi, pq, nblk, kr, ks, 2); break;
            case 3: q8_vnni_score4_group(&st[0][0], FA_TILE4, j, qi, pq, nblk, kr, ks, 3); break;
            case 4: q8_vnni_score4_group(&st[0][0], FA_TILE4, j, qi, pq, nblk, kr, ks, 4); break;
            default: q8_vnni_score4_group(&st[0][0], FA_TILE4, j, qi, pq, nblk, kr, ks, G); break;
            }
        }
#endif
        for (int g = 0; g < G; g++) {
#ifndef Q8_GROUP_SHARED_K
            for (int j = 0; j < n; j += 4)
                vst1q_f32(st[g] + j, vmulq_f32(fa_score4(qi[g], qsc[g], nblk, kr[j], kr[j + 1], kr[j + 2], kr[j + 3]),
                                               vld1q_f32(ks + j)));
#endif
            fa_rescale_tile(st[g], n, &M[g], &S[g], VKQ[g], hd);
            S[g] += fa_exp_tile(w[g], st[g], n, M[g]);
            for (int j = 0; j < n; j++) w[g][j] *= vs[j];
        }

        /* segment 3's accumulation, lowp's way: per group of 16 tokens, each head's weights as codes
         * (fa_lowp_codes_of), then V's rows interleaved once per pair of heads and multiplied by
         * every head's codes (vkq_lowp_rows_group) */
        for (int j0 = 0; j0 < n; j0 += FA_LOWP_GROUP) {
            const int m = n - j0 < FA_LOWP_GROUP ? n - j0 : FA_LOWP_GROUP, ng = (m + 3) / 4;
            fa_lowp_codes lc[GQA_MAX];
            for (int g = 0; g < G; g++) fa_lowp_codes_of(&lc[g], w[g] + j0, m);
            const int8_t *rows[FA_LOWP_GROUP];
            for (int j = 0; j < 4 * ng; j++) rows[j] = vr[j0 + (j < m ? j : m - 1)];
            vkq_lowp_rows_group(vkq, rows, lc, ng, G, hd);
        }
    }

    for (int g = 0; g < G; g++) fa_normalize(attn_out + (size_t)g * hd, VKQ[g], S[g], hd);
}
