/* fa_online.h: the steps of article 9-2's kernel (section 2), each written once, that the other
 * kernels are built from: the versions of lesson 09 (flash_attn_q8_steps.c), the two-pass kernels,
 * the split-KV kernel (flash_attn_q8_partial.c) and the grouped kernel (flash_attn_q8_group.c).
 * First the steps of one token, in the article's segments: Q's quantization (segment 1), a K row's
 * score (segment 2, q8_dot_row in q8_simd.h), the online update and V's accumulation (segment 3),
 * the normalisation (segment 4). Then the same steps for a tile of FA_TILE tokens, which the
 * faster versions use. The article's kernel (flash_attn_q8_neon.c) writes every step out itself,
 * because it is the text the lessons display. */
#ifndef FA_ONLINE_H
#define FA_ONLINE_H
#include "q8_simd.h"

/* Tokens scored before the softmax folds them in, in the kernels that tile (build define,
 * lessonkit.native.DEFINES checks 1..256). 16: with VKQ held in registers across a tile, its load
 * and store are paid once per 16 tokens; the tile's scores are 64 bytes, one cache line. */
#ifndef FA_TILE
#define FA_TILE 16
#endif
/* a tile's score array, rounded up to whole groups of 4 tokens (fa_score4 scores four at once) */
#define FA_TILE4 ((FA_TILE + 3) / 4 * 4)

/* the caller's contract on hd (lessonkit checks it first); a kernel returns on anything else */
static inline int fa_hd_ok(int hd) { return hd > 0 && hd <= HD_MAX && hd % QBLK == 0; }

/* token t's row of one kv head: block t / kv_bs, row t % kv_bs, head offset kh_off */
static inline const int8_t *fa_row(int8_t *const *cache, int t, int kv_bs, int kv_dim, int kh_off)
{
    return cache[t / kv_bs] + (size_t)(t % kv_bs) * kv_dim + kh_off;
}

/* token t's K or V scale as the value of one code: the cache stores max|x| per row and head */
static inline float fa_step(const float *scales, int t, int nkv) { return scales[(size_t)t * nkv] * KVQ_INV; }

/* segment 1: Q to int8 codes qi and one scale per 32-value block, qsc */
static inline void fa_quantize_q(const float *q, int nblk, int8_t *qi, float *qsc)
{
    for (int b = 0; b < nblk; b++) {
        float qm = 0.0f;
        for (int i = 0; i < QBLK; i++) qm = fmaxf(qm, fabsf(q[b * QBLK + i]));
        if (qm < 1e-6f) qm = 1.0f; /* an all-zero block would divide by zero */
        qsc[b] = qm * KVQ_INV;
        for (int i = 0; i < QBLK; i++) qi[b * QBLK + i] = q_code(q[b * QBLK + i] * (127.0f / qm));
    }
}

/* VKQ[0..hd) *= f */
static inline void fa_scale_vkq(float *VKQ, int hd, float f)
{
    float32x4_t fv = vdupq_n_f32(f);
    for (int i = 0; i < hd; i += 4) vst1q_f32(VKQ + i, vmulq_f32(vld1q_f32(VKQ + i), fv));
}

/* segment 3, one token: a new max shrinks S and VKQ to it; returns the token's weight exp(s - M) */
static inline float fa_online_token(float s, float *M, float *S, float *VKQ, int hd)
{
    float vsf;
    if (s > *M) {
        float ms = expf(*M - s);
        *M = s;
        *S *= ms;
        fa_scale_vkq(VKQ, hd, ms);
        vsf = 1.0f;
    } else {
        vsf = expf(s - *M);
    }
    *S += vsf;
    return vsf;
}

/* segment 3's accumulation of one token: VKQ += w * V row vt (V int8 in memory, w fp32) */
static inline void fa_add_row(float *VKQ, const int8_t *vt, float w, int hd)
{
    float32x4_t wv = vdupq_n_f32(w);
    for (int i = 0; i < hd; i += 16) vkq_add_i8x16(VKQ + i, vt + i, wv);
}

/* segment 4: out = VKQ / S (0 when no token had weight) */
static inline void fa_normalize(float *out, const float *VKQ, float S, int hd)
{
    float32x4_t inv = vdupq_n_f32(S > 0.0f ? 1.0f / S : 0.0f);
    for (int i = 0; i < hd; i += 4) vst1q_f32(out + i, vmulq_f32(vld1q_f32(VKQ + i), inv));
}

/* segment 2 for four tokens at once: the int32 block dots of four K rows reduced together
 * (two pairwise adds give [dot k0, dot k1, dot k2, dot k3]) instead of one horizontal add per row,
 * and each block's scale applied to the four as one vector. Same sums as q8_dot_row per lane. */
static inline float32x4_t fa_score4(const int8_t *qi, const float *qsc, int nblk, const int8_t *k0,
    const int8_t *k1, const int8_t *k2, const int8_t *k3)
{
    float32x4_t s = vdupq_n_f32(0.0f);
    for (int b = 0; b < nblk; b++) {
        int o = b * QBLK;
        int32x4_t d = i8x32_dot4_s32(qi + o, k0 + o, k1 + o, k2 + o, k3 + o);
        s = vfmaq_f32(s, vcvtq_f32_s32(d), vdupq_n_f32(qsc[b]));
    }
    return s;
}

/* the rows of tokens t0 .. t0+n-1 of one kv head: one division for the tile (block and row of t0),
 * then the next row, or the next block's first, per token, instead of t / kv_bs and t % kv_bs for
 * every row (a division by the runtime kv_bs is tens of cycles of latency on both targets) */
static inline void fa_tile_rows(const int8_t **rows, int8_t *const *cache, int t0, int n, int kv_bs, int kv_dim,
    int kh_off)
{
    int b = t0 / kv_bs, r = t0 % kv_bs;
    for (int j = 0; j < n; j++) {
        rows[j] = cache[b] + (size_t)r * kv_dim + kh_off;
        if (++r == kv_bs) {
            r = 0;
            b++;
        }
    }
}

/* segment 2 for tokens t0 .. t0+n-1 (n <= FA_TILE): st[j] = score of token t0 + j, four at a time;
 * a last group of fewer than four repeats the last row and its extra lanes are ignored. */
static inline void fa_score_tile(float *st, const int8_t *qi, const float *qsc, int nblk,
    int8_t *const *k_cache_q8, const float *kscale, int t0, int n, int kv_dim, int kv_bs, int nkv,
    int kh_off, float scale)
{
    const int8_t *kr[FA_TILE4];
    fa_tile_rows(kr, k_cache_q8, t0, n, kv_bs, kv_dim, kh_off);
    for (int j = 0; j < n; j += 4) {
        const int8_t *k[4];
        float ks[4];
        for (int u = 0; u < 4; u++) {
            int jj = j + u < n ? j + u : n - 1;
            k[u] = kr[jj];
            ks[u] = fa_step(kscale, t0 + jj, nkv) * scale;
        }
        vst1q_f32(st + j, vmulq_f32(fa_score4(qi, qsc, nblk, k[0], k[1], k[2], k[3]), vld1q_f32(ks)));
    }
}

/* segment 3's rescale for a tile of n scores, once: the tile's max m; if m > M, S and VKQ shrink
 * once by exp(M - m), instead of at every new max inside the tile. The weights that follow are
 * then exp(st[j] - M) for the tile's M: mathematically the per-token steps' result; the roundings
 * differ (within the kernel tolerance). */
static inline void fa_rescale_tile(const float *st, int n, float *M, float *S, float *VKQ, int hd)
{
    /* the max four lanes at a time, then across them: n / 4 + 2 dependent steps instead of a chain
     * of n compare-and-selects (in llvm-mca's N1 model, 2 of lowp's 59 cycles per token). The same
     * m: a max is exact, and vmaxnm, like the comparison, passes over a NaN. */
    float32x4_t mv = vdupq_n_f32(*M);
    int j = 0;
    for (; j + 4 <= n; j += 4) mv = vmaxnmq_f32(mv, vld1q_f32(st + j));
    float m = vmaxnmvq_f32(mv);
    for (; j < n; j++) m = st[j] > m ? st[j] : m;
    if (m > *M) {
        float ms = expf(*M - m);
        *S *= ms;
        fa_scale_vkq(VKQ, hd, ms);
        *M = m;
    }
}

/* exp(x) for four x <= 0: q8_expf's reduction and polynomial in NEON intrinsics (SIMDe maps them
 * on x86): x = n ln2 + r, exp(r) to r^7, times 2^n from the exponent bits; below -87 it is 0.
 * Same accuracy class as q8_expf (within 2 ulp of expf). */
static inline float32x4_t fa_expq_f32(float32x4_t x)
{
    uint32x4_t tiny = vcltq_f32(x, vdupq_n_f32(-87.0f));
    x = vmaxq_f32(x, vdupq_n_f32(-87.0f));
    float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-0.693359375f));
    r = vfmaq_f32(r, n, vdupq_n_f32(2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.0f / 5040.0f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vbslq_f32(tiny, vdupq_n_f32(0.0f), vmulq_f32(p, vreinterpretq_f32_s32(e)));
}

/* a tile's weights w[j] = exp(st[j] - M) four at a time (fa_expq_f32); returns their sum. st and w
 * have FA_TILE4 entries: the lanes past n are set to -inf, so that they weigh 0. */
static inline float fa_exp_tile(float *w, float *st, int n, float M)
{
    for (int j = n; j < (n + 3) / 4 * 4; j++) st[j] = -INFINITY;
    float32x4_t mv = vdupq_n_f32(M), sum = vdupq_n_f32(0.0f);
    for (int j = 0; j < n; j += 4) {
        float32x4_t e = fa_expq_f32(vsubq_f32(vld1q_f32(st + j), mv));
        vst1q_f32(w + j, e);
        sum = vaddq_f32(sum, e);
    }
    return vaddvq_f32(sum);
}

/* segment 3's accumulation for a tile: VKQ += sum_j w[j] * V_j over the tile's n V rows, with a
 * column chunk of VKQ held in registers while all n rows add into it (the load and store of VKQ
 * paid once per tile, not once per token). */
static inline void fa_vkq_tile(float *VKQ, const int8_t *const *vr, const float *w, int n, int hd)
{
    for (int c = 0; c < hd; c += FA_VKQ_COLS) vkq_cols_rows(VKQ + c, vr, c, w, n);
}

/* the same with V's int8 -> fp32 conversion by the magic-number add (q8_simd.h) */
static inline void fa_vkq_tile_magic(float *VKQ, const int8_t *const *vr, const float *w, int n, int hd)
{
    for (int c = 0; c < hd; c += FA_VKQ_COLS) vkq_cols_rows_magic(VKQ + c, vr, c, w, n);
}

/* lowp (lesson 09, flash_attn_q8_v14_lowp): the codes of up to FA_LOWP_GROUP weights w[0 .. m),
 * w >= 0. Each weight, relative to the group's largest, becomes an integer code C in [0, 16256]:
 * C = (int)(w * 16256 / wmax + 0.5), so |C * d - w| <= d / 2 (plus float rounding) with the step
 * d = wmax / 16256; C = 128 * hi + lo splits it into two bytes for the dot products (q8_simd.h).
 * The codes past m are 0. A group with no weight above 0 gets d = 0 and codes 0. */
static inline void fa_lowp_codes_of(fa_lowp_codes *lc, const float *w, int m)
{
    float u[FA_LOWP_GROUP] = {0}, wmax = 0.0f;
    for (int j = 0; j < m; j++) {
        u[j] = w[j];
        wmax = w[j] > wmax ? w[j] : wmax;
    }
    float r = wmax > 0.0f ? (float)FA_LOWP_CMAX / wmax : 0.0f;
    if (!(r <= 3.0e38f)) { /* wmax so small that 16256 / wmax overflows: scale the weights up first */
        for (int j = 0; j < m; j++) u[j] *= 0x1p64f;
        wmax *= 0x1p64f;
        r = (float)FA_LOWP_CMAX / wmax;
        lc->d = wmax / (float)FA_LOWP_CMAX * 0x1p-64f;
    } else {
        lc->d = wmax / (float)FA_LOWP_CMAX;
    }
    q8_lowp_codes16(lc, u, r);
}

/* lowp's accumulation for a tile: VKQ += sum_j w[j] * V_j over the tile's n V rows, the weights of
 * each group of 16 tokens as codes (fa_lowp_codes_of) and V times them by int8 dot products
 * (vkq_lowp_rows, q8_simd.h), folded into fp32 VKQ once per group. */
static inline void fa_vkq_tile_lowp(float *VKQ, const int8_t *const *vr, const float *w, int n, int hd)
{
    for (int j0 = 0; j0 < n; j0 += FA_LOWP_GROUP) {
        const int m = n - j0 < FA_LOWP_GROUP ? n - j0 : FA_LOWP_GROUP, ng = (m + 3) / 4;
        fa_lowp_codes lc;
        fa_lowp_codes_of(&lc, w + j0, m);
        const int8_t *rows[FA_LOWP_GROUP];
        for (int j = 0; j < 4 * ng; j++) rows[j] = vr[j0 + (j < m ? j : m - 1)]; /* padding: code 0 */
        vkq_lowp_rows(VKQ, rows, &lc, ng, hd);
    }
}

/* The fast version's token loop over [t_begin, t_end) from the online state (*M, *S, VKQ) on,
 * for Q already quantized (flash_attn_q8_steps.c): the split-KV kernel runs it on its chunk. */
void fa_fast_state(const int8_t *qi, const float *qsc, int nblk, int8_t *const *k_cache_q8,
    int8_t *const *v_cache_q8, const float *kscale, const float *vscale, int t_begin, int t_end,
    int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale, float *M, float *S, float *VKQ);

#endif
