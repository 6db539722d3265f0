/* flash_attn_q8_steps.c: the article's kernel made fast in numbered steps, in the manner of llm.c's
 * dev/cuda kernels: each version adds ONE idea to the one before it, has the article's signature
 * and computes what flash_attn_single_q_q8_scalar computes (within the kernel tolerance, 1e-5 of
 * max|out|). The registry native/fa_variants.h lists them with the idea each adds; lessonkit.timing
 * times any of them by name, and the tests check every one against the scalar reference.
 *
 * Every version is one function whose token loop is fa_tiled() below, inlined with that version's
 * steps switched on as compile-time constants: each function's machine code holds its own loop
 * (objdump or llvm-mca find it by the function's name), and the shared steps are written once in
 * fa_online.h. Measured ns/token, hd 128, one kv head, by lessonkit.timing.time_kernel on the x86
 * build (SIMDe plus the AVX2/AVX-512 helpers of q8_simd.h): see the comment of each version.
 *
 * Compile lines: those of flash_attn_q8_neon.c (lessonkit.native.build() compiles every file). */
#include "flash_attn_q8.h"
#include "fa_online.h"

enum {
    SCORE4 = 1,        /* v5: four K rows scored together, one reduction for the four */
    TILE_RESCALE = 2,  /* v6: one max and one rescale of S and VKQ per tile */
    VEXP = 4,          /* v7: the tile's weights by a 4-lane exp */
    VKQ_REGS = 8,      /* v8: VKQ's columns held in registers over the tile's V rows */
    MAGIC = 16,        /* v9: V's int8 -> fp32 by the magic-number add */
    PREFETCH = 32,     /* v10: software prefetch FA_PREFETCH tokens ahead */
};

/* The tiled token loop over [t_begin, t_end), from the online state (*M, *S, VKQ) on. */
static inline __attribute__((always_inline)) void fa_tiled(const int8_t *qi, const float *qsc, int nblk,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8, const float *kscale, const float *vscale,
    int t_begin, int t_end, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale,
    float *M, float *S, float *VKQ, const int steps)
{
    float st[FA_TILE4], w[FA_TILE4]; /* the tile's scores, then its weights */
    const int8_t *vr[FA_TILE];       /* the tile's V rows */
    for (int t0 = t_begin; t0 < t_end; t0 += FA_TILE) {
        const int n = t_end - t0 < FA_TILE ? t_end - t0 : FA_TILE;
        if ((steps & PREFETCH) && FA_PREFETCH > 0)
            for (int j = 0; j < n && t0 + j + FA_PREFETCH < t_end; j++)
                prefetch_token(k_cache_q8, v_cache_q8, t0 + j + FA_PREFETCH, kv_bs, kv_dim, kh_off, hd);

        /* segment 2: score the tile */
        if (steps & SCORE4) {
            fa_score_tile(st, qi, qsc, nblk, k_cache_q8, kscale, t0, n, kv_dim, kv_bs, nkv, kh_off, scale);
        } else {
            for (int j = 0; j < n; j++)
                st[j] = q8_dot_row(qi, qsc, fa_row(k_cache_q8, t0 + j, kv_bs, kv_dim, kh_off), nblk)
                        * (kscale[(size_t)(t0 + j) * nkv] * KVQ_INV) * scale;
        }
        for (int j = 0; j < n; j++) vr[j] = fa_row(v_cache_q8, t0 + j, kv_bs, kv_dim, kh_off);

        /* segment 3: fold the tile in */
        if (!(steps & TILE_RESCALE)) { /* token by token, as the article's kernel does */
            for (int j = 0; j < n; j++) {
                float vsf = fa_online_token(st[j], M, S, VKQ, hd);
                float32x4_t wv = vdupq_n_f32(vsf * (vscale[(size_t)(t0 + j) * nkv] * KVQ_INV));
                for (int i = 0; i < hd; i += 16) vkq_add_i8x16(VKQ + i, vr[j] + i, wv);
            }
            continue;
        }
        if (steps & VEXP) {
            fa_online_tile(w, st, n, M, S, VKQ, hd);
        } else {
            float m = *M;
            for (int j = 0; j < n; j++) m = st[j] > m ? st[j] : m;
            if (m > *M) {
                float ms = expf(*M - m);
                *S *= ms;
                fa_scale_vkq(VKQ, hd, ms);
                *M = m;
            }
            for (int j = 0; j < n; j++) {
                w[j] = expf(st[j] - *M);
                *S += w[j];
            }
        }
        for (int j = 0; j < n; j++) w[j] *= vscale[(size_t)(t0 + j) * nkv] * KVQ_INV;
        if (steps & MAGIC) {
            fa_vkq_tile_magic(VKQ, vr, w, n, hd);
        } else if (steps & VKQ_REGS) {
            fa_vkq_tile(VKQ, vr, w, n, hd);
        } else {
            for (int j = 0; j < n; j++) {
                float32x4_t wv = vdupq_n_f32(w[j]);
                for (int i = 0; i < hd; i += 16) vkq_add_i8x16(VKQ + i, vr[j] + i, wv);
            }
        }
    }
}

/* A whole single-head call: segment 1, the tiled loop over [0, seq_len), segment 4. */
static inline __attribute__((always_inline)) void fa_tiled_call(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8, const float *restrict kscale,
    const float *restrict vscale, int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd,
    float scale, const int steps)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);
    float M = -1e9f, S = 0.0f, VKQ[HD_MAX];
    for (int i = 0; i < hd; i++) VKQ[i] = 0.0f;
    fa_tiled(qi, qsc, nblk, k_cache_q8, v_cache_q8, kscale, vscale, 0, seq_len, kv_dim, kv_bs, nkv, kh_off,
             hd, scale, &M, &S, VKQ, steps);
    fa_normalize(attn_out, VKQ, S, hd);
}

#define FA_VERSION(fn, steps)                                                                          \
    void fn(float *restrict attn_out, const float *restrict q, int8_t *const *k_cache_q8,              \
        int8_t *const *v_cache_q8, const float *restrict kscale, const float *restrict vscale,         \
        int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)                   \
    {                                                                                                   \
        fa_tiled_call(attn_out, q, k_cache_q8, v_cache_q8, kscale, vscale, seq_len, kv_dim, kv_bs, nkv,   \
                      kh_off, hd, scale, steps);                                                        \
    }

/* v4 tile: scores a tile of FA_TILE tokens (one dot per K row) before folding them in token by
 * token; what the article's kernel used to do, without its prefetch. */
FA_VERSION(flash_attn_q8_v4_tile, 0)
/* v5 score4: the tile's K rows scored four at a time, their int32 block sums reduced together */
FA_VERSION(flash_attn_q8_v5_score4, SCORE4)
/* v6 tile_rescale: one max per tile, one rescale of S and VKQ per tile (not per new max) */
FA_VERSION(flash_attn_q8_v6_tile_rescale, SCORE4 | TILE_RESCALE)
/* v7 vexp: the tile's weights exp(s - M) by a 4-lane NEON exp (fa_expq_f32) */
FA_VERSION(flash_attn_q8_v7_vexp, SCORE4 | TILE_RESCALE | VEXP)
/* v8 vkq_regs: VKQ in registers, 32 columns at a time, over the tile's V rows */
FA_VERSION(flash_attn_q8_v8_vkq_regs, SCORE4 | TILE_RESCALE | VEXP | VKQ_REGS)
/* v9 magic: V's int8 -> fp32 without scvtf (add to the bits of 1.5 * 2^23, subtract 1.5 * 2^23) */
FA_VERSION(flash_attn_q8_v9_magic, SCORE4 | TILE_RESCALE | VEXP | VKQ_REGS | MAGIC)
/* v10 prefetch: software prefetch of the rows FA_PREFETCH tokens ahead */
FA_VERSION(flash_attn_q8_v10_prefetch, SCORE4 | TILE_RESCALE | VEXP | VKQ_REGS | MAGIC | PREFETCH)

/* The fastest single-head version; the split-KV kernel runs the same steps (fa_fast_state).
 * Which steps: on x86 v8's, because there the magic add of v9 is slower than the conversion it
 * replaces (AVX-512 converts int32 -> fp32 in one instruction; the add and the subtract are two);
 * on aarch64 v9's, because there it replaces sxtl + scvtf, about half the vector work in llvm-mca's
 * Neoverse N1 estimate (an estimate, not a measurement on a board). Lesson 09 and make bench
 * measure each version on your machine; make bench-a76 gives the estimates. */
#if defined(__aarch64__)
#define FA_FAST_STEPS (SCORE4 | TILE_RESCALE | VEXP | VKQ_REGS | MAGIC)
#else
#define FA_FAST_STEPS (SCORE4 | TILE_RESCALE | VEXP | VKQ_REGS)
#endif
FA_VERSION(flash_attn_single_q_q8_fast, FA_FAST_STEPS)

void fa_fast_state(const int8_t *qi, const float *qsc, int nblk, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *kscale, const float *vscale, int t_begin, int t_end,
    int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale, float *M, float *S, float *VKQ)
{
    fa_tiled(qi, qsc, nblk, k_cache_q8, v_cache_q8, kscale, vscale, t_begin, t_end, kv_dim, kv_bs, nkv, kh_off,
             hd, scale, M, S, VKQ, FA_FAST_STEPS);
}
