/* flash_attn_q8_steps.c: the article's kernel made fast in numbered steps, in the manner of llm.c's
 * dev/cuda kernels. Each version below is a whole kernel with the article's signature; it adds ONE
 * idea to the version before it, stated in the comment above it, so that it reads alone and its
 * diff from that version is the idea (lesson 09 shows both). Every version computes what
 * flash_attn_single_q_q8_scalar computes, within the kernel tolerance (1e-5 of max|out|): the C
 * tests and the smoke check hold each one to it. All but v14 lowp, which gives up the article's fp32
 * weights where they meet V: it is held to a bound derived from its codes' step instead. The steps they share are written once, in
 * fa_online.h; native/fa_variants.h lists the versions, which lessonkit.timing times by name.
 *
 * v0 is the article's kernel (flash_attn_q8_neon.c): one token at a time, score, update, add V.
 * From v4 on, the tokens go by tiles of FA_TILE: what the later versions do to a tile needs the
 * tile's scores at hand. Compile lines: those of flash_attn_q8_neon.c. */
#include "flash_attn_q8.h"
#include "fa_online.h"

/* v4 tile: segment 2 for a whole tile of FA_TILE tokens first, one K row after another, then
 * segment 3 for the tile's tokens one by one, as v0 does. */
void flash_attn_q8_v4_tile(float *restrict attn_out, const float *restrict q, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);                        /* segment 1 */
    float M = -1e9f, S = 0.0f, VKQ[HD_MAX] = {0};
    float st[FA_TILE];                                      /* the tile's scores */
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        for (int j = 0; j < n; j++)                         /* segment 2, the whole tile */
            st[j] = q8_dot_row(qi, qsc, fa_row(k_cache_q8, t0 + j, kv_bs, kv_dim, kh_off), nblk)
                    * fa_step(kscale, t0 + j, nkv) * scale;
        for (int j = 0; j < n; j++) {                       /* segment 3, token by token */
            float vsf = fa_online_token(st[j], &M, &S, VKQ, hd);
            const int8_t *vt = fa_row(v_cache_q8, t0 + j, kv_bs, kv_dim, kh_off);
            fa_add_row(VKQ, vt, vsf * fa_step(vscale, t0 + j, nkv), hd);
        }
    }
    fa_normalize(attn_out, VKQ, S, hd);                     /* segment 4 */
}

/* v5 score4: the tile's K rows scored four at a time (fa_score_tile): the int32 block sums of four
 * rows reduced together, two pairwise adds for the four, instead of one horizontal add per row. */
void flash_attn_q8_v5_score4(float *restrict attn_out, const float *restrict q, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);                        /* segment 1 */
    float M = -1e9f, S = 0.0f, VKQ[HD_MAX] = {0};
    float st[FA_TILE4];                                     /* the tile's scores, in groups of 4 */
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        for (int j = 0; j < n; j++) {                       /* segment 3, token by token */
            float vsf = fa_online_token(st[j], &M, &S, VKQ, hd);
            const int8_t *vt = fa_row(v_cache_q8, t0 + j, kv_bs, kv_dim, kh_off);
            fa_add_row(VKQ, vt, vsf * fa_step(vscale, t0 + j, nkv), hd);
        }
    }
    fa_normalize(attn_out, VKQ, S, hd);                     /* segment 4 */
}

/* v6 tile_rescale: one max and one rescale of S and VKQ per tile (fa_rescale_tile), instead of
 * one at every new max; then every weight of the tile is exp(s - M) for that one M. */
void flash_attn_q8_v6_tile_rescale(float *restrict attn_out, const float *restrict q, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);                        /* segment 1 */
    float M = -1e9f, S = 0.0f, VKQ[HD_MAX] = {0};
    float st[FA_TILE4], w[FA_TILE4];                        /* the tile's scores, then its weights */
    const int8_t *vr[FA_TILE];                              /* the tile's V rows */
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        fa_rescale_tile(st, n, &M, &S, VKQ, hd);            /* segment 3, once for the tile */
        for (int j = 0; j < n; j++) {
            w[j] = expf(st[j] - M);
            S += w[j];
        }
        for (int j = 0; j < n; j++) w[j] *= fa_step(vscale, t0 + j, nkv);
        fa_tile_rows(vr, v_cache_q8, t0, n, kv_bs, kv_dim, kh_off); /* one division per tile */
        for (int j = 0; j < n; j++) fa_add_row(VKQ, vr[j], w[j], hd);
    }
    fa_normalize(attn_out, VKQ, S, hd);                     /* segment 4 */
}

/* v7 vexp: the tile's weights by a 4-lane exp (fa_exp_tile, on fa_expq_f32), four at a time,
 * instead of one expf call per token. */
void flash_attn_q8_v7_vexp(float *restrict attn_out, const float *restrict q, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);                        /* segment 1 */
    float M = -1e9f, S = 0.0f, VKQ[HD_MAX] = {0};
    float st[FA_TILE4], w[FA_TILE4];                        /* the tile's scores, then its weights */
    const int8_t *vr[FA_TILE];                              /* the tile's V rows */
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        fa_rescale_tile(st, n, &M, &S, VKQ, hd);            /* segment 3, once for the tile */
        S += fa_exp_tile(w, st, n, M);
        for (int j = 0; j < n; j++) w[j] *= fa_step(vscale, t0 + j, nkv);
        fa_tile_rows(vr, v_cache_q8, t0, n, kv_bs, kv_dim, kh_off); /* one division per tile */
        for (int j = 0; j < n; j++) fa_add_row(VKQ, vr[j], w[j], hd);
    }
    fa_normalize(attn_out, VKQ, S, hd);                     /* segment 4 */
}

/* v8 vkq_regs: VKQ held in registers, 32 columns at a time, while all the tile's V rows add into
 * them (fa_vkq_tile): its load and store paid once per tile instead of once per token. */
void flash_attn_q8_v8_vkq_regs(float *restrict attn_out, const float *restrict q, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);                        /* segment 1 */
    float M = -1e9f, S = 0.0f, VKQ[HD_MAX] = {0};
    float st[FA_TILE4], w[FA_TILE4];                        /* the tile's scores, then its weights */
    const int8_t *vr[FA_TILE];                              /* the tile's V rows */
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        fa_rescale_tile(st, n, &M, &S, VKQ, hd);            /* segment 3, once for the tile */
        S += fa_exp_tile(w, st, n, M);
        for (int j = 0; j < n; j++) w[j] *= fa_step(vscale, t0 + j, nkv);
        fa_tile_rows(vr, v_cache_q8, t0, n, kv_bs, kv_dim, kh_off); /* one division per tile */
        fa_vkq_tile(VKQ, vr, w, n, hd);
    }
    fa_normalize(attn_out, VKQ, S, hd);                     /* segment 4 */
}

/* v9 magic: V's int8 -> fp32 without an int -> float instruction: added to the bits of 1.5 * 2^23,
 * then 1.5 * 2^23 subtracted (fa_vkq_tile_magic; exact for every int8, q8_simd.h). */
void flash_attn_q8_v9_magic(float *restrict attn_out, const float *restrict q, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);                        /* segment 1 */
    float M = -1e9f, S = 0.0f, VKQ[HD_MAX] = {0};
    float st[FA_TILE4], w[FA_TILE4];                        /* the tile's scores, then its weights */
    const int8_t *vr[FA_TILE];                              /* the tile's V rows */
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        fa_rescale_tile(st, n, &M, &S, VKQ, hd);            /* segment 3, once for the tile */
        S += fa_exp_tile(w, st, n, M);
        for (int j = 0; j < n; j++) w[j] *= fa_step(vscale, t0 + j, nkv);
        fa_tile_rows(vr, v_cache_q8, t0, n, kv_bs, kv_dim, kh_off); /* one division per tile */
        fa_vkq_tile_magic(VKQ, vr, w, n, hd);
    }
    fa_normalize(attn_out, VKQ, S, hd);                     /* segment 4 */
}

/* v10 prefetch: the K and V rows FA_PREFETCH tokens ahead asked for in advance (prefetch_token),
 * so that loads from memory are in flight while the current tile is computed. The token to ask
 * for next (pf) moves on one row at a time, into the next block at a block's end (fa_pos_next):
 * no division by kv_bs per token. */
void flash_attn_q8_v10_prefetch(float *restrict attn_out, const float *restrict q, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);                        /* segment 1 */
    float M = -1e9f, S = 0.0f, VKQ[HD_MAX] = {0};
    float st[FA_TILE4], w[FA_TILE4];                        /* the tile's scores, then its weights */
    const int8_t *vr[FA_TILE];                              /* the tile's V rows */
    fa_pos pf = fa_pos_of(FA_PREFETCH, kv_bs);              /* the token to prefetch next */
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        const int ahead = seq_len - t0 - FA_PREFETCH < n ? seq_len - t0 - FA_PREFETCH : n; /* rows that exist */
        for (int j = 0; FA_PREFETCH > 0 && j < ahead; j++, fa_pos_next(&pf, kv_bs))
            prefetch_token(k_cache_q8, v_cache_q8, pf, kv_dim, kh_off, hd);
        fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        fa_rescale_tile(st, n, &M, &S, VKQ, hd);            /* segment 3, once for the tile */
        S += fa_exp_tile(w, st, n, M);
        for (int j = 0; j < n; j++) w[j] *= fa_step(vscale, t0 + j, nkv);
        fa_tile_rows(vr, v_cache_q8, t0, n, kv_bs, kv_dim, kh_off); /* one division per tile */
        fa_vkq_tile_magic(VKQ, vr, w, n, hd);
    }
    fa_normalize(attn_out, VKQ, S, hd);                     /* segment 4 */
}

/* v14 lowp: on v10 prefetch, V times the weights by int8 dot products instead of the magic-number
 * conversion and one fp32 multiply-add per value (fa_vkq_tile_lowp): each group of 16 tokens' weights exp(s - M) * V scale
 * becomes 14-bit integer codes with one fp32 step for the group, split into two int8 halves, and V's
 * int8 codes meet them in sdot (on x86: VNNI's vpdpbusd where the CPU has it, AVX2's vpmaddubsw and
 * vpmaddwd where not) without any conversion of V to float; the
 * int32 sums are folded into fp32 VKQ once per group. M, S and the rescales stay fp32, as in the
 * article ("softmax 权重保持 F32" is the one thing this version gives up: its weights are not fp32 where
 * they meet V). The price: each weight is off by up to half a step, 1/32512 of its group's largest;
 * tests/test_lowp.py and lessonkit.lowp_error measure what that does to the output. */
void flash_attn_q8_v14_lowp(float *restrict attn_out, const float *restrict q, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);                        /* segment 1 */
    float M = -1e9f, S = 0.0f, VKQ[HD_MAX] = {0};
    float st[FA_TILE4], w[FA_TILE4];                        /* the tile's scores, then its weights */
    const int8_t *vr[FA_TILE];                              /* the tile's V rows */
    fa_pos pf = fa_pos_of(FA_PREFETCH, kv_bs);              /* the token to prefetch next */
    for (int t0 = 0; t0 < seq_len; t0 += FA_TILE) {
        const int n = seq_len - t0 < FA_TILE ? seq_len - t0 : FA_TILE;
        const int ahead = seq_len - t0 - FA_PREFETCH < n ? seq_len - t0 - FA_PREFETCH : n; /* rows that exist */
        for (int j = 0; FA_PREFETCH > 0 && j < ahead; j++, fa_pos_next(&pf, kv_bs))
            prefetch_token(k_cache_q8, v_cache_q8, pf, kv_dim, kh_off, hd);
        fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        fa_rescale_tile(st, n, &M, &S, VKQ, hd);            /* segment 3, once for the tile */
        S += fa_exp_tile(w, st, n, M);                      /* S from the fp32 weights */
        for (int j = 0; j < n; j++) w[j] *= fa_step(vscale, t0 + j, nkv);
        fa_tile_rows(vr, v_cache_q8, t0, n, kv_bs, kv_dim, kh_off); /* one division per tile */
        fa_vkq_tile_lowp(VKQ, vr, w, n, hd);                /* the weights as int8 codes, V by sdot */
    }
    fa_normalize(attn_out, VKQ, S, hd);                     /* segment 4 */
}

/* fast: the single-head version the grouped and split-KV kernels build on and compare
 * with (lessonkit.attend calls the article's kernel unless told otherwise): v9 on aarch64, v8 on x86. On x86 the magic add of v9 takes two
 * instructions (the add and the subtract) where the conversion it replaces takes one (int32 ->
 * fp32, vcvtdq2ps); on aarch64 it replaces sxtl + scvtf, about half the vector work in llvm-mca's
 * Neoverse N1 estimate (an estimate, not a measurement on a board). "fast" is a name, not a
 * timing: lesson 09 and make bench measure each version on your machine, and make bench-a76
 * gives the estimates. */
void flash_attn_single_q_q8_fast(float *restrict attn_out, const float *restrict q, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
#if defined(__aarch64__)
    flash_attn_q8_v9_magic(attn_out, q, k_cache_q8, v_cache_q8, kscale, vscale, seq_len, kv_dim, kv_bs, nkv,
                           kh_off, hd, scale);
#else
    flash_attn_q8_v8_vkq_regs(attn_out, q, k_cache_q8, v_cache_q8, kscale, vscale, seq_len, kv_dim, kv_bs, nkv,
                              kh_off, hd, scale);
#endif
}

/* fast's token loop over [t_begin, t_end), from a given online state (*M, *S, VKQ) on, for Q
 * already quantized: the split-KV kernel (flash_attn_q8_partial.c) runs it on its chunk. The loop
 * of v9 on aarch64, of v8 on x86, as flash_attn_single_q_q8_fast chooses. */
void fa_fast_state(const int8_t *qi, const float *qsc, int nblk, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *kscale, const float *vscale, int t_begin, int t_end,
    int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale, float *M, float *S, float *VKQ)
{
    float st[FA_TILE4], w[FA_TILE4];
    const int8_t *vr[FA_TILE];
    for (int t0 = t_begin; t0 < t_end; t0 += FA_TILE) {
        const int n = t_end - t0 < FA_TILE ? t_end - t0 : FA_TILE;
        fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        fa_rescale_tile(st, n, M, S, VKQ, hd);
        *S += fa_exp_tile(w, st, n, *M);
        for (int j = 0; j < n; j++) w[j] *= fa_step(vscale, t0 + j, nkv);
        fa_tile_rows(vr, v_cache_q8, t0, n, kv_bs, kv_dim, kh_off); /* one division per tile */
#if defined(__aarch64__)
        fa_vkq_tile_magic(VKQ, vr, w, n, hd);
#else
        fa_vkq_tile(VKQ, vr, w, n, hd);
#endif
    }
}
