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
 * same steps, so the result equals G calls of flash_attn_single_q_q8_fast (and those of the article's
 * kernel within the kernel tolerance).
 *
 * The token loop is the fast variant's steps (fa_online.h), with the query-independent work done
 * once per token for all G heads: the row addresses, the K and V scales, and the V row's int8 ->
 * fp32 conversion (once per token, then one multiply-add per head), with every head's VKQ columns
 * in registers over the tile (vkq_cols_rows_group): held per head in memory instead, VKQ's load
 * and store per token and head cost more than the shared reads save. On AVX-512 VNNI builds the
 * four K rows of a score step are also loaded once for every head's scores (fa_score4_group).
 * native/tools/fa_perf.c times it against four fast calls (contenders group4 and fast4).
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
#include "fa_online.h"

void flash_attn_group_q8_neon(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale, int G)
{
    if (!fa_hd_ok(hd) || G < 1 || G > GQA_MAX) return;
    const int nblk = hd / QBLK;

    /* segment 1, once per query head: G sets of int8 codes and block scales */
    int8_t qi[GQA_MAX][HD_MAX];
    float qsc[GQA_MAX][HD_MAX / QBLK];
    for (int g = 0; g < G; g++) fa_quantize_q(q + (size_t)g * hd, nblk, qi[g], qsc[g]);

    /* one online-softmax state per query head: 4 + 4 + 4 * hd bytes each */
    float M[GQA_MAX], S[GQA_MAX];
    float VKQ[GQA_MAX][HD_MAX];
    for (int g = 0; g < G; g++) {
        M[g] = -1e9f;
        S[g] = 0.0f;
        for (int i = 0; i < hd; i++) VKQ[g][i] = 0.0f;
    }

#ifdef Q8_GROUP_SHARED_K
    q8_vnni_q pq[GQA_MAX]; /* each head's Q prepared for q8_vnni_score4_group (q8_simd_x86.h) */
    for (int g = 0; g < G; g++) q8_vnni_q_prepare(&pq[g], qi[g], qsc[g], nblk);
#endif
    float *vkq[GQA_MAX];
    for (int g = 0; g < G; g++) vkq[g] = VKQ[g];
    float st[GQA_MAX][FA_TILE4], w[GQA_MAX][FA_TILE4]; /* the tile's scores, then weights, per head */
    const int8_t *kr[FA_TILE4], *vr[FA_TILE];
    float ks[FA_TILE4], vs[FA_TILE];
    fa_pos pf = fa_pos_of(FA_PREFETCH, kv_bs); /* the token to prefetch next (v10) */
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        /* as version prefetch (v10): the K and V rows FA_PREFETCH tokens ahead asked for now */
        const int ahead = seq_len - t0 - FA_PREFETCH < n ? seq_len - t0 - FA_PREFETCH : n;
        for (int j = 0; FA_PREFETCH > 0 && j < ahead; j++, fa_pos_next(&pf, kv_bs))
            prefetch_token(k_cache_q8, v_cache_q8, pf, kv_dim, kh_off, hd);
        /* the query-independent part of the tile, once: row addresses (one division per tile,
         * fa_tile_rows) and scales */
        fa_tile_rows(kr, k_cache_q8, t0, n, kv_bs, kv_dim, kh_off);
        fa_tile_rows(vr, v_cache_q8, t0, n, kv_bs, kv_dim, kh_off);
        for (int j = 0; j < (n + 3) / 4 * 4; j++) {
            int t = t0 + (j < n ? j : n - 1); /* a last group of four repeats the last row */
            kr[j] = kr[t - t0];
            ks[j] = kscale[(size_t)t * nkv] * KVQ_INV * scale;
        }
        for (int j = 0; j < n; j++) vs[j] = vscale[(size_t)(t0 + j) * nkv] * KVQ_INV;

        /* segment 2 and 3's weights, per query head: the K rows come from memory once, for head 0;
         * heads 1 .. G-1 find them in the L1 cache */
#ifdef Q8_GROUP_SHARED_K
        for (int j = 0; j < n; j += 4) {
            switch (G) { /* a constant G per case: the G score accumulators stay in registers */
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

        /* segment 3's accumulation: each V row converted to fp32 once for all G heads, and every
         * head's VKQ columns held in registers over the tile's rows (vkq_cols_rows_group) */
        for (int c = 0; c < hd; c += FA_GROUP_COLS) vkq_cols_rows_group(vkq, vr, c, &w[0][0], FA_TILE4, n, G);
    }

    /* segment 4: normalize each query head once */
    for (int g = 0; g < G; g++) fa_normalize(attn_out + (size_t)g * hd, VKQ[g], S[g], hd);
}
