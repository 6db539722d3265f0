/* test_kernel.c: checks flash_attn_single_q_q8_neon against flash_attn_single_q_q8_scalar on
 * fixed inputs, and kvq8_quantize_rows against its documented contract. Lesson 08's kernels too: the
 * grouped kernel (flash_attn_group_q8_neon, G query heads in one call) per query head, and the
 * partial kernel (flash_attn_partial_q8_neon) over chunks whose states are merged, against the same
 * scalar reference. Self-contained C99/C11:
 * its own main, no test framework, inputs from a small LCG below (no rand(), no clock).
 *
 * `make test-c`, `make test-asan` and `make test-aarch64` run it; by hand, from the repository
 * root (<simde> is the directory that holds simde/arm/neon.h, `python -m lessonkit simde-include`):
 *   1. x86-64 through SIMDe:
 *      gcc -std=c11 -O2 -march=native -Wall -Wextra -Werror -Inative -I<simde> native/tests/test_kernel.c native/flash_attn_q8_neon.c native/flash_attn_q8_scalar.c native/kvq8_quant.c -lm -o /tmp/t && /tmp/t
 *   2. the same under AddressSanitizer and UBSan:
 *      gcc -std=c11 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -Wall -Wextra -Werror -Inative -I<simde> native/tests/test_kernel.c native/flash_attn_q8_neon.c native/flash_attn_q8_scalar.c native/kvq8_quant.c -lm -o /tmp/t_asan && /tmp/t_asan
 *   3. aarch64 with dotprod (sdot), run under qemu-user:
 *      aarch64-linux-gnu-gcc -std=c11 -O2 -march=armv8.2-a+dotprod -Wall -Wextra -Werror -Inative native/tests/test_kernel.c native/flash_attn_q8_neon.c native/flash_attn_q8_scalar.c native/kvq8_quant.c -lm -o /tmp/t_dot && qemu-aarch64 -L /usr/aarch64-linux-gnu /tmp/t_dot
 *   4. aarch64 without dotprod (the vmull/vpadd fallback), likewise:
 *      aarch64-linux-gnu-gcc -std=c11 -O2 -march=armv8-a -Wall -Wextra -Werror -Inative native/tests/test_kernel.c native/flash_attn_q8_neon.c native/flash_attn_q8_scalar.c native/kvq8_quant.c -lm -o /tmp/t_v8 && qemu-aarch64 -L /usr/aarch64-linux-gnu /tmp/t_v8
 *
 * Output: the backend name, one line per failing case (every case with -v), then a last line
 * "N passed, M failed". The exit status is 0 only if M is 0.
 *
 * The KV cache is built the way the engine builds it: an array of block pointers, block b
 * holding kv_bs tokens of kv_dim = nkv * hd int8 codes, each block malloc'd on its own so that
 * AddressSanitizer catches a read past a block; the scales are one raw max|x| per (token, kv head)
 * in an array [seq_len][nkv] allocated to exactly that size. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_variants.h"
#include "fa_online.h"

/* Pass criterion, per output value: |neon - scalar| <= 1e-5 * max(1, max|scalar|) over the head's
 * hd outputs. The two kernels do the same integer dots and the same float operations; they can
 * differ only through fused vs unfused multiply-add (vfmaq_f32 against a * b + c) and the order
 * in which float sums are taken, i.e. by a few roundings, far below this bound. */
#define REL_TOL 1e-5f
#define MAX_SHOWN 3 /* mismatches printed per failing case */

/* lowp (flash_attn_q8_v14_lowp, and flash_attn_group_q8_lowp per head) does not do the scalar
 * kernel's arithmetic: where V meets the weights, each weight u_j = exp(s_j - M) * vstep_j
 * (vstep_j = token j's V scale / 127) is replaced by C_j * d, with d = umax / 16256 the step of its
 * group of 16 tokens (umax: the group's largest u) and C_j = (int)(u_j / d + 0.5) (fa_online.h,
 * fa_lowp_codes_of). So |C_j d - u_j| <= 0.51 d: half a step, plus 2^-23 * 16256 < 0.002 steps of
 * float rounding in u_j * (16256 / umax) before the cast. Output i is sum_j u_j code_j[i] / S; its
 * error from the codes is at most
 *     sum_groups sum_{j in group} 0.51 * (umax_group / 16256) * |code_j[i]| / S
 *  <= sum_groups 16 * 0.51 * 127 * umax_group / (16256 S)            (|code| <= 127, 16 per group)
 *  <= 16 * 0.51 * 127 * vstep_max / 16256                            (umax_group <= vstep_max *
 *                                                                     sum_{j in group} exp(s_j - M),
 *                                                                     summed over groups: S)
 *   = 0.51 * vmax / 1016, with vmax = 127 * vstep_max the largest raw V scale (max|V|) of the head.
 * The M the kernel's weights are relative to changes between tiles (rescales), which scales u and
 * d alike and leaves the bound as it is. On top: the exact kernels' REL_TOL. A lost tile, a wrong
 * row or a wrong column of V is off by a share of max|out| far above this (the cases' outputs are
 * a few hundredths of vmax and more). */
#define LOWP_BOUND(vmax) (0.51f * (vmax) / 1016.0f)

/* ---------- deterministic inputs ---------- */

typedef struct { uint64_t s; } Lcg;

static uint32_t lcg_next(Lcg *g)
{
    g->s = g->s * 6364136223846793005ULL + 1442695040888963407ULL; /* Knuth's MMIX constants */
    return (uint32_t)(g->s >> 32);
}

static float lcg_range(Lcg *g, float lo, float hi) /* uniform in [lo, hi) */
{
    return lo + (hi - lo) * ((float)(lcg_next(g) >> 8) / 16777216.0f);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_kernel: out of memory\n");
        exit(2);
    }
    return p;
}

static void fill_range(Lcg *g, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) x[i] = lcg_range(g, lo, hi);
}

/* rows of hd values, each row with its own size, so that the per-row scales differ */
static void fill_rows(Lcg *g, float *x, size_t rows, int hd)
{
    for (size_t r = 0; r < rows; r++) {
        float m = lcg_range(g, 0.1f, 3.0f);
        for (int i = 0; i < hd; i++) x[r * hd + i] = m * lcg_range(g, -1.0f, 1.0f);
    }
}

/* ---------- the q8 KV cache ---------- */

typedef struct {
    int nblocks;
    int8_t **k, **v;        /* nblocks blocks of kv_bs * kv_dim codes, each its own malloc */
    float *kscale, *vscale; /* [seq_len][nkv] raw max|x| (nkv floats when seq_len is 0) */
} Cache;

/* Quantizes the float rows x ([nblocks * kv_bs][nkv][hd]) into separately allocated blocks; the
 * scales of all rows, padding tokens of the last block included, go to scales_all. */
static int8_t **quantize_blocks(const float *x, int nblocks, int kv_bs, int nkv, int hd, float *scales_all)
{
    const size_t rows = (size_t)kv_bs * nkv, codes = rows * hd;
    int8_t **blocks = xmalloc((size_t)nblocks * sizeof *blocks);
    for (int b = 0; b < nblocks; b++) {
        blocks[b] = xmalloc(codes);
        kvq8_quantize_rows(x + b * codes, (int)rows, hd, hd, blocks[b], hd, scales_all + b * rows, 1);
    }
    return blocks;
}

/* the first seq_len tokens' scales, in an array of exactly that size */
static float *tight_scales(const float *scales_all, int seq_len, int nkv)
{
    size_t n = (size_t)(seq_len > 0 ? seq_len : 1) * nkv;
    float *s = xmalloc(n * sizeof *s);
    memcpy(s, scales_all, (size_t)seq_len * nkv * sizeof *s);
    return s;
}

static Cache build_cache(const float *kf, const float *vf, int seq_len, int kv_bs, int nkv, int hd)
{
    Cache c;
    c.nblocks = (seq_len + kv_bs - 1) / kv_bs;
    float *scales_all = xmalloc((size_t)c.nblocks * kv_bs * nkv * sizeof *scales_all);
    c.k = quantize_blocks(kf, c.nblocks, kv_bs, nkv, hd, scales_all);
    c.kscale = tight_scales(scales_all, seq_len, nkv);
    c.v = quantize_blocks(vf, c.nblocks, kv_bs, nkv, hd, scales_all);
    c.vscale = tight_scales(scales_all, seq_len, nkv);
    free(scales_all);
    return c;
}

static void free_cache(Cache *c)
{
    for (int b = 0; b < c->nblocks; b++) {
        free(c->k[b]);
        free(c->v[b]);
    }
    free(c->k);
    free(c->v);
    free(c->kscale);
    free(c->vscale);
}

/* ---------- attention cases ---------- */

enum Kind { RANDOM, ZERO_QBLOCK, LARGE_SCORES, ZERO_ROWS };
static const char *const KIND_NAME[] = {"random", "zero first Q block", "large scores", "zero K/V rows"};

typedef struct { int hd, kv_bs, seq_len, nkv; enum Kind kind; } Case;

/* The kernels checked against the scalar reference: every entry of the registry (fa_variants.h)
 * but the reference itself -- the article's kernel, the numbered fast steps, the fast kernel, the
 * two-pass alternatives (same quantized math; only float rounding order differs). */
typedef void (*Kernel)(float *restrict, const float *restrict, int8_t *const *, int8_t *const *,
    const float *restrict, const float *restrict, int, int, int, int, int, int, float);
#define AS_KERNEL(version, name, fn, adds) fn,
#define AS_NAME(version, name, fn, adds) name,
static const Kernel KERNELS[] = {FA_VARIANTS(AS_KERNEL)};
static const char *const KERNEL_NAME[] = {FA_VARIANTS(AS_NAME) "group", "partial+merge", "group lowp"};
#define N_KERNELS (int)(sizeof KERNELS / sizeof KERNELS[0])
#define K_GROUP N_KERNELS       /* lesson 08: flash_attn_group_q8_neon, query head g against the scalar kernel */
#define K_SPLIT (N_KERNELS + 1) /* lesson 08: flash_attn_partial_q8_neon over chunks, merged, divided */
#define K_GROUP_LOWP (N_KERNELS + 2) /* flash_attn_group_q8_lowp, query head g, within LOWP_BOUND */

typedef struct { int kernel, kh, i; float neon, scalar; } Mismatch;

typedef struct {
    int count;      /* values outside the tolerance */
    float worst;    /* largest |kernel - scalar| / max(1, max|scalar|) seen */
    Mismatch shown[MAX_SHOWN];
} Result;

/* Keys along +-q (plus a little noise), then a scale that puts the largest |score| at 80:
 * the softmax is then dominated by a few tokens and exp() of the others underflows to 0. */
static float aligned_keys(Lcg *g, const float *q, float *kf, size_t rows, size_t scored_rows, int hd)
{
    double peak = 0.0;
    for (size_t r = 0; r < rows; r++) {
        float sign = (lcg_next(g) & 1u) ? 1.0f : -1.0f, m = lcg_range(g, 0.2f, 1.0f);
        double dot = 0.0;
        for (int i = 0; i < hd; i++) {
            kf[r * hd + i] = sign * m * q[i] + 0.01f * lcg_range(g, -1.0f, 1.0f);
            dot += (double)q[i] * kf[r * hd + i];
        }
        if (r < scored_rows && fabs(dot) > peak) peak = fabs(dot);
    }
    return peak > 0.0 ? (float)(80.0 / peak) : 1.0f;
}

static void zero_row(float *x, size_t token, int kh, int nkv, int hd)
{
    memset(x + (token * nkv + kh) * hd, 0, (size_t)hd * sizeof *x);
}

/* Fills q, K and V ([ntok][nkv][hd]) for the case's kind; returns the softmax scale. */
static float make_inputs(const Case *c, Lcg *g, float *q, float *kf, float *vf, size_t ntok)
{
    const size_t rows = ntok * c->nkv;
    float scale = 1.0f / sqrtf((float)c->hd);
    fill_range(g, q, (size_t)c->hd, -1.0f, 1.0f);
    fill_rows(g, kf, rows, c->hd);
    fill_rows(g, vf, rows, c->hd);
    if (c->kind == ZERO_QBLOCK) memset(q, 0, 32 * sizeof *q);
    if (c->kind == LARGE_SCORES) scale = aligned_keys(g, q, kf, rows, (size_t)c->seq_len * c->nkv, c->hd);
    if (c->kind == ZERO_ROWS && c->seq_len > 0) {
        size_t last = (size_t)c->seq_len - 1;
        for (int kh = 0; kh < c->nkv; kh++) { /* token 0: K and V zero in every head */
            zero_row(kf, 0, kh, c->nkv, c->hd);
            zero_row(vf, 0, kh, c->nkv, c->hd);
        }
        zero_row(kf, last / 2, 0, c->nkv, c->hd);           /* a middle token: K only, head 0 */
        zero_row(vf, last, c->nkv - 1, c->nkv, c->hd);      /* the last token: V only, last head */
    }
    return scale;
}

static float g_lowp_worst = 0.0f; /* largest |lowp - scalar| / LOWP_BOUND seen */

/* Adds one kv head's outputs to the result. With seq_len == 0 both outputs must be exact zeros.
 * lowp_vmax > 0: a lowp kernel, allowed LOWP_BOUND(lowp_vmax) more (the bound above). */
static void compare_tol(Result *r, int kernel, int kh, const float *neon, const float *scalar, int hd,
    int must_be_zero, float lowp_vmax)
{
    float peak = 1.0f;
    for (int i = 0; i < hd; i++)
        if (fabsf(scalar[i]) > peak) peak = fabsf(scalar[i]);
    const float extra = lowp_vmax > 0.0f ? LOWP_BOUND(lowp_vmax) : 0.0f;
    for (int i = 0; i < hd; i++) {
        float d = fabsf(neon[i] - scalar[i]);
        int bad = !(d <= REL_TOL * peak + extra); /* written this way so that a NaN fails */
        if (must_be_zero && (neon[i] != 0.0f || scalar[i] != 0.0f)) bad = 1;
        if (extra > 0.0f) {
            if (!(d / extra <= g_lowp_worst)) g_lowp_worst = d / extra;
        } else if (!(d / peak <= r->worst)) r->worst = d / peak;
        if (!bad) continue;
        if (r->count < MAX_SHOWN) r->shown[r->count] = (Mismatch){kernel, kh, i, neon[i], scalar[i]};
        r->count++;
    }
}

static void compare(Result *r, int kernel, int kh, const float *neon, const float *scalar, int hd,
    int must_be_zero)
{
    compare_tol(r, kernel, kh, neon, scalar, hd, must_be_zero, 0.0f);
}

/* the largest raw V scale (max|V|) of kv head kh over the case's tokens: LOWP_BOUND's vmax */
static float v_max(const Cache *cache, int seq_len, int nkv, int kh)
{
    float m = 0.0f;
    for (int t = 0; t < seq_len; t++) m = fmaxf(m, cache->vscale[(size_t)t * nkv + kh]);
    return m;
}

static void fill_nan(float *x, int n) /* so that an output value never written shows up */
{
    for (int i = 0; i < n; i++) x[i] = NAN;
}

/* ---------- lesson 08: GQA in one scan, and split-KV ---------- */

enum { G_MAX = 8 };

/* The group's query heads: head 0 is the case's q, head g a copy shrunk by 1 - 0.1 g with its sign
 * flipped for odd g, so the heads' softmaxes differ (flatter) while a zero Q block stays zero, keys
 * aligned with q stay aligned, and no score grows past the case's own (|s| <= 80 for large scores:
 * beyond that, float rounding of s is amplified by exp past the tolerance, in any kernel). */
static void group_queries(const float *q, int hd, int G, float *qs)
{
    for (int g = 0; g < G; g++)
        for (int i = 0; i < hd; i++) qs[g * hd + i] = q[i] * (g % 2 ? -1.0f : 1.0f) * (1.0f - 0.1f * g);
}

/* The merge of two partial states (Flash-Decoding), in double: the test's own reference, written
 * from the formula, not from lessonkit. An empty state has S == 0 and is skipped. */
static void merge_state(double *M, double *S, double *acc, float m2, float s2, const float *acc2, int hd)
{
    if (s2 == 0.0f) return;
    if (*S == 0.0) {
        *M = m2;
        *S = s2;
        for (int i = 0; i < hd; i++) acc[i] = acc2[i];
        return;
    }
    double M_new = *M > m2 ? *M : m2, w1 = exp(*M - M_new), w2 = exp(m2 - M_new);
    *S = *S * w1 + s2 * w2;
    for (int i = 0; i < hd; i++) acc[i] = acc[i] * w1 + acc2[i] * w2;
    *M = M_new;
}

/* flash_attn_partial_q8_neon over the chunks between cuts (cut[0] = 0 ... cut[n] = seq_len; a chunk
 * may be empty), the states merged in order, then one division: the output of the whole range. */
static void split_attention(float *out, const float *q, const Cache *cache, const Case *c, int kh, float scale,
    const int *cut, int n)
{
    const int hd = c->hd, nkv = c->nkv;
    float *vkq = xmalloc((size_t)hd * sizeof *vkq);
    double *acc = xmalloc((size_t)hd * sizeof *acc), M = 0.0, S = 0.0;
    for (int j = 0; j < n; j++) {
        float m = NAN, s = NAN;
        fill_nan(vkq, hd);
        flash_attn_partial_q8_neon(vkq, &m, &s, q, cache->k, cache->v, cache->kscale + kh, cache->vscale + kh,
            cut[j], cut[j + 1], nkv * hd, c->kv_bs, nkv, kh * hd, hd, scale);
        merge_state(&M, &S, acc, m, s, vkq, hd);
    }
    for (int i = 0; i < hd; i++) out[i] = S > 0.0 ? (float)(acc[i] / S) : 0.0f;
    free(vkq);
    free(acc);
}

/* Split points that fall inside blocks, around a chunk of one token, with an empty chunk when
 * seq_len is small; returns the number of chunks. */
static int make_cuts(int seq_len, int kv_bs, int *cut)
{
    int n = 0, a = seq_len / 3, b = a + 1 < seq_len ? a + 1 : seq_len, d = kv_bs + kv_bs / 2;
    cut[n++] = 0;
    cut[n++] = a;                                       /* a chunk of seq_len / 3 tokens */
    cut[n++] = b;                                       /* then one of (at most) one token */
    cut[n++] = b + d < seq_len ? b + d : seq_len;       /* then 1.5 blocks: ends inside a block */
    cut[n++] = seq_len;
    return n - 1;
}

static Result run_heads(const Case *c, const Cache *cache, const float *q, float scale)
{
    const int hd = c->hd, nkv = c->nkv;
    float *neon = xmalloc((size_t)hd * sizeof *neon), *scalar = xmalloc((size_t)hd * sizeof *scalar);
    Result r = {0, 0.0f, {{0, 0, 0, 0.0f, 0.0f}}};
    for (int kh = 0; kh < nkv; kh++) {
        const float vmax = v_max(cache, c->seq_len, nkv, kh);
        fill_nan(scalar, hd);
        flash_attn_single_q_q8_scalar(scalar, q, cache->k, cache->v, cache->kscale + kh, cache->vscale + kh,
            c->seq_len, nkv * hd, c->kv_bs, nkv, kh * hd, hd, scale);
        for (int k = 0; k < N_KERNELS; k++) {
            if (KERNELS[k] == flash_attn_single_q_q8_scalar) continue; /* the reference itself */
            fill_nan(neon, hd);
            KERNELS[k](neon, q, cache->k, cache->v, cache->kscale + kh, cache->vscale + kh,
                c->seq_len, nkv * hd, c->kv_bs, nkv, kh * hd, hd, scale);
            if (KERNELS[k] == flash_attn_q8_v14_lowp) /* within the derived bound, not REL_TOL alone */
                compare_tol(&r, k, kh, neon, scalar, hd, c->seq_len == 0, vmax > 0.0f ? vmax : 1e-30f);
            else compare(&r, k, kh, neon, scalar, hd, c->seq_len == 0);
        }

        /* lesson 08, split-KV: chunk states merged == the scalar single pass */
        int cut[5], nchunks = make_cuts(c->seq_len, c->kv_bs, cut);
        fill_nan(neon, hd);
        split_attention(neon, q, cache, c, kh, scale, cut, nchunks);
        compare(&r, K_SPLIT, kh, neon, scalar, hd, c->seq_len == 0);

        /* lesson 08, GQA: G query heads in one call == the scalar kernel per query head.
         * G cycles through 1, 2, 3, 4, 8 with the case and the kv head. */
        static const int GS[] = {1, 2, 3, 4, 8};
        const int G = GS[(c->seq_len + c->kv_bs + kh) % 5];
        float *qs = xmalloc((size_t)G_MAX * hd * sizeof *qs), *outs = xmalloc((size_t)G_MAX * hd * sizeof *outs);
        group_queries(q, hd, G, qs);
        fill_nan(outs, G * hd);
        flash_attn_group_q8_neon(outs, qs, cache->k, cache->v, cache->kscale + kh, cache->vscale + kh,
            c->seq_len, nkv * hd, c->kv_bs, nkv, kh * hd, hd, scale, G);
        for (int g = 0; g < G; g++) {
            fill_nan(scalar, hd);
            flash_attn_single_q_q8_scalar(scalar, qs + g * hd, cache->k, cache->v, cache->kscale + kh,
                cache->vscale + kh, c->seq_len, nkv * hd, c->kv_bs, nkv, kh * hd, hd, scale);
            compare(&r, K_GROUP, kh, outs + g * hd, scalar, hd, c->seq_len == 0);
        }
        /* the grouped kernel with lowp's accumulation: each head within the bound */
        fill_nan(outs, G * hd);
        flash_attn_group_q8_lowp(outs, qs, cache->k, cache->v, cache->kscale + kh, cache->vscale + kh,
            c->seq_len, nkv * hd, c->kv_bs, nkv, kh * hd, hd, scale, G);
        for (int g = 0; g < G; g++) {
            fill_nan(scalar, hd);
            flash_attn_single_q_q8_scalar(scalar, qs + g * hd, cache->k, cache->v, cache->kscale + kh,
                cache->vscale + kh, c->seq_len, nkv * hd, c->kv_bs, nkv, kh * hd, hd, scale);
            compare_tol(&r, K_GROUP_LOWP, kh, outs + g * hd, scalar, hd, c->seq_len == 0, vmax > 0.0f ? vmax : 1e-30f);
        }
        free(qs);
        free(outs);
    }
    free(neon);
    free(scalar);
    return r;
}

static void report(const Case *c, const Result *r, int verbose)
{
    if (r->count == 0 && !verbose) return;
    printf("%s hd=%3d kv_bs=%2d seq_len=%4d nkv=%d %-18s worst rel diff %.2e",
        r->count ? "FAIL" : "ok  ", c->hd, c->kv_bs, c->seq_len, c->nkv, KIND_NAME[c->kind], (double)r->worst);
    if (r->count) printf(", %d values off", r->count);
    printf("\n");
    for (int j = 0; j < r->count && j < MAX_SHOWN; j++)
        printf("    %s kh=%d i=%3d got=%.9g scalar=%.9g\n", KERNEL_NAME[r->shown[j].kernel], r->shown[j].kh, r->shown[j].i,
            (double)r->shown[j].neon, (double)r->shown[j].scalar);
}

static float g_worst = 0.0f; /* over all attention cases, for the closing lines */

static int run_case(const Case *c, int verbose)
{
    const int kv_dim = c->nkv * c->hd;
    const size_t ntok = (size_t)((c->seq_len + c->kv_bs - 1) / c->kv_bs) * c->kv_bs;
    Lcg g = {0x9E3779B97F4A7C15ULL ^ ((uint64_t)c->hd << 40 ^ (uint64_t)c->kv_bs << 28
                                      ^ (uint64_t)c->seq_len << 8 ^ (uint64_t)c->nkv << 4 ^ c->kind)};
    float *q = xmalloc((size_t)c->hd * sizeof *q);
    float *kf = xmalloc(ntok * kv_dim * sizeof *kf), *vf = xmalloc(ntok * kv_dim * sizeof *vf);
    float scale = make_inputs(c, &g, q, kf, vf, ntok);
    Cache cache = build_cache(kf, vf, c->seq_len, c->kv_bs, c->nkv, c->hd);
    Result r = run_heads(c, &cache, q, scale);
    report(c, &r, verbose);
    if (r.worst > g_worst) g_worst = r.worst;
    free_cache(&cache);
    free(q);
    free(kf);
    free(vf);
    return r.count == 0;
}

/* ---------- kvq8_quantize_rows ---------- */

/* Quantizes n_rows rows of hd values (contiguous in x) through padded strides, then checks each
 * row: scale == max|x|, codes in [-127, 127], |code * max / 127 - x| <= max / 254 (+1e-6 of it),
 * zero rows give scale 0 and codes 0, and nothing is read from or written to the padding. */
static int check_quantizer(const char *name, const float *x, int n_rows, int hd, int verbose)
{
    const int xs = hd + 3, cs = hd + 5, ss = 2; /* strides with gaps */
    float *xin = xmalloc((size_t)n_rows * xs * sizeof *xin), *sc = xmalloc((size_t)n_rows * ss * sizeof *sc);
    int8_t *codes = xmalloc((size_t)n_rows * cs);
    for (int j = 0; j < n_rows * xs; j++) xin[j] = 1e30f; /* would change a scale if read */
    for (int r = 0; r < n_rows; r++) memcpy(xin + r * xs, x + r * hd, (size_t)hd * sizeof *xin);
    for (int j = 0; j < n_rows * ss; j++) sc[j] = -1.0f;
    memset(codes, 0x55, (size_t)n_rows * cs);
    kvq8_quantize_rows(xin, n_rows, hd, xs, codes, cs, sc, ss);

    int errors = 0;
    for (int r = 0; r < n_rows && errors < MAX_SHOWN; r++) {
        const float *xr = x + r * hd;
        const int8_t *cr = codes + r * cs;
        float amax = 0.0f;
        for (int i = 0; i < hd; i++)
            if (fabsf(xr[i]) > amax) amax = fabsf(xr[i]);
        const char *what = NULL;
        int at = -1;
        if (sc[r * ss] != amax) what = "scale != max|x|";
        else if (sc[r * ss + 1] != -1.0f) what = "wrote into the scale stride gap";
        for (int i = 0; i < cs && !what; i++) {
            double back = (double)cr[i] * amax / 127.0;
            if (i >= hd) what = cr[i] != 0x55 ? "wrote into the code stride gap" : NULL;
            else if (cr[i] < -127) what = "code -128";
            else if (amax == 0.0f && cr[i] != 0) what = "zero row, nonzero code";
            else if (!(fabs(back - xr[i]) <= amax / 254.0 * (1.0 + 1e-6))) what = "code off by more than half a step";
            at = i;
        }
        if (!what) continue;
        if (errors++ == 0) printf("FAIL quantizer %s\n", name);
        printf("    row %d i=%d: %s (x=%.9g max=%.9g scale=%.9g code=%d)\n", r, at, what,
            at >= 0 && at < hd ? (double)xr[at] : 0.0, (double)amax, (double)sc[r * ss], at >= 0 ? cr[at] : 0);
    }
    if (!errors && verbose) printf("ok   quantizer %s\n", name);
    free(xin);
    free(sc);
    free(codes);
    return errors == 0;
}

static int quantizer_random(int verbose)
{
    enum { ROWS = 16, HD = 64 };
    float x[ROWS * HD];
    Lcg g = {12345};
    for (int r = 0; r < ROWS; r++) {
        float m = lcg_range(&g, 0.01f, 10.0f);
        for (int i = 0; i < HD; i++) x[r * HD + i] = m * lcg_range(&g, -1.0f, 1.0f);
    }
    return check_quantizer("random rows", x, ROWS, HD, verbose);
}

static int quantizer_extremes(int verbose)
{
    enum { HD = 32 };
    static const float mags[] = {3.0e38f, 1e30f, 1e-30f, 1e-40f /* subnormal */, 1.0f};
    enum { ROWS = sizeof mags / sizeof mags[0] };
    float x[ROWS * HD];
    Lcg g = {777};
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < HD; i++) x[r * HD + i] = mags[r] * lcg_range(&g, -1.0f, 1.0f);
    for (int i = 1; i < HD; i++) x[(ROWS - 1) * HD + i] = 0.0f; /* last row: one nonzero value */
    return check_quantizer("extreme magnitudes", x, ROWS, HD, verbose);
}

/* max 127, values k + 0.5: every code sits exactly half a step away */
static int quantizer_half_steps(int verbose)
{
    enum { HD = 256 };
    float x[2 * HD];
    for (int i = 0; i < 254; i++) x[i] = (float)(i - 127) + 0.5f;
    x[254] = 127.0f;
    x[255] = -127.0f;
    for (int i = 0; i < HD; i++) x[HD + i] = -x[i] * 0.37f;
    return check_quantizer("half steps", x, 2, HD, verbose);
}

static int quantizer_zero_rows(int verbose)
{
    enum { HD = 32 };
    float x[3 * HD];
    for (int i = 0; i < HD; i++) {
        x[i] = 0.0f;
        x[HD + i] = -0.0f;
        x[2 * HD + i] = (float)(i - 16) / 16.0f; /* an ordinary row after the zero rows */
    }
    return check_quantizer("zero rows", x, 3, HD, verbose);
}

/* ---------- the case list ---------- */

enum { MAX_CASES = 160 };

static int add(Case *list, int n, int hd, int kv_bs, int seq_len, int nkv, enum Kind kind)
{
    if (n >= MAX_CASES) {
        fprintf(stderr, "test_kernel: more than %d cases, raise MAX_CASES\n", MAX_CASES);
        exit(2);
    }
    list[n] = (Case){hd, kv_bs, seq_len, nkv, kind};
    return n + 1;
}

static int make_cases(Case *list)
{
    static const int hds[] = {32, 64, 96, 128, 256}, bss[] = {1, 7, 16, 64}, seqs[] = {1, 2, 31, 33, 1000};
    static const int nkvs[] = {1, 2, 8};
    int n = 0;
    /* every hd x kv_bs x seq_len; nkv cycles with the case index, every kv head is checked */
    for (int h = 0; h < 5; h++)
        for (int b = 0; b < 4; b++)
            for (int s = 0; s < 5; s++) n = add(list, n, hds[h], bss[b], seqs[s], nkvs[n % 3], RANDOM);
    for (int h = 0; h < 5; h += 2) n = add(list, n, hds[h], 7, 33, 2, ZERO_QBLOCK);
    n = add(list, n, 128, 16, 1000, 8, ZERO_QBLOCK);
    static const int large_hds[] = {32, 128, 256}, large_bss[] = {1, 16}, large_seqs[] = {2, 33, 1000};
    for (int h = 0; h < 3; h++)
        for (int b = 0; b < 2; b++)
            for (int s = 0; s < 3; s++)
                n = add(list, n, large_hds[h], large_bss[b], large_seqs[s], nkvs[n % 3], LARGE_SCORES);
    for (int h = 0; h < 5; h += 4)
        for (int k = 0; k < 3; k += 2) n = add(list, n, hds[h], 16, 0, nkvs[k], RANDOM); /* seq_len 0 */
    for (int h = 1; h < 4; h += 2)
        for (int b = 1; b < 4; b += 2)
            for (int s = 0; s < 5; s += 2) n = add(list, n, hds[h], bss[b], seqs[s], 2, ZERO_ROWS);
    return n;
}

/* ---------- the SIMD helpers of q8_simd.h ---------- */

/* i8x16_dot_s32 must give sdot's lanes exactly, on every path, for every int8 value (-128 too). */
static int check_dot_lanes(int verbose)
{
    Lcg g = {12345};
    int bad = 0;
    for (int trial = 0; trial < 2000 && !bad; trial++) {
        int8_t a[16], b[16];
        int32_t want[4], init[4], got[4];
        for (int i = 0; i < 16; i++) {
            a[i] = (int8_t)(trial < 2 ? (trial ? 127 : -128) : (int)(lcg_next(&g) & 0xff) - 128);
            b[i] = (int8_t)(trial < 2 ? -128 : (int)(lcg_next(&g) & 0xff) - 128);
        }
        for (int j = 0; j < 4; j++) {
            init[j] = (int32_t)(lcg_next(&g) % 2001) - 1000;
            want[j] = init[j];
            for (int i = 4 * j; i < 4 * j + 4; i++) want[j] += (int32_t)a[i] * b[i];
        }
        vst1q_s32(got, i8x16_dot_s32(vld1q_s32(init), vld1q_s8(a), vld1q_s8(b)));
        for (int j = 0; j < 4; j++) bad |= got[j] != want[j];
        if (bad) printf("FAIL i8x16_dot_s32 trial %d: lanes %d %d %d %d, want %d %d %d %d\n", trial,
            got[0], got[1], got[2], got[3], want[0], want[1], want[2], want[3]);
    }
    if (verbose && !bad) printf("ok   i8x16_dot_s32 lanes equal sdot's on 2000 random vectors\n");
    return !bad;
}

/* The kernels' expf (on x86 the inline q8_expf) within 2 ulp of libm's over the range they use. */
static int check_expf(int verbose)
{
    float worst = 0.0f, worst_x = 0.0f;
    for (int i = 0; i <= 200000; i++) {
        float x = -90.0f * (float)i / 200000.0f;
        float got = expf(x), want = (expf)(x); /* (expf) is libm's, past any macro */
        float ulp = want > 0.0f ? nextafterf(want, INFINITY) - want : 0.0f;
        float err = ulp > 0.0f ? fabsf(got - want) / ulp : (got == 0.0f ? 0.0f : INFINITY);
        if (x < -87.0f && got == 0.0f) err = 0.0f; /* flushed: below FLT_MIN by design */
        if (err > worst) { worst = err; worst_x = x; }
    }
    int ok = worst <= 2.0f;
    if (!ok || verbose) printf("%s expf: worst %.2f ulp (at x = %g) over [-90, 0]\n", ok ? "ok  " : "FAIL",
        (double)worst, (double)worst_x);
    return ok;
}

/* The tiled variants' 4-lane exp (fa_expq_f32) within 2 ulp of libm's over the range they use,
 * and 0 below -87 (the same contract as the scalar expf above). */
static int check_vexp(int verbose)
{
    float worst = 0.0f, worst_x = 0.0f;
    for (int i = 0; i <= 200000; i += 4) {
        float x[4], got[4];
        for (int u = 0; u < 4; u++) x[u] = -90.0f * (float)(i + u) / 200000.0f;
        vst1q_f32(got, fa_expq_f32(vld1q_f32(x)));
        for (int u = 0; u < 4; u++) {
            float want = (expf)(x[u]);
            float ulp = want > 0.0f ? nextafterf(want, INFINITY) - want : 0.0f;
            float err = ulp > 0.0f ? fabsf(got[u] - want) / ulp : (got[u] == 0.0f ? 0.0f : INFINITY);
            if (x[u] < -87.0f) err = got[u] == 0.0f ? 0.0f : INFINITY; /* flushed to 0 by design */
            if (err > worst) { worst = err; worst_x = x[u]; }
        }
    }
    int ok = worst <= 2.0f;
    if (!ok || verbose) printf("%s fa_expq_f32: worst %.2f ulp (at x = %g) over [-90, 0]\n", ok ? "ok  " : "FAIL",
        (double)worst, (double)worst_x);
    return ok;
}

/* i8x32_dot4_s32: four 32-value int8 dots, each equal to the plain integer sum, on random and
 * extreme (-128, 127) values; and the magic-number conversion exact for all 256 int8 values. */
static int check_dot4_magic(int verbose)
{
    Lcg g = {11};
    int bad = 0;
    int8_t q[32], k[4][32];
    for (int trial = 0; trial < 2000 && !bad; trial++) {
        for (int i = 0; i < 32; i++) {
            q[i] = trial < 2 ? (int8_t)(trial ? 127 : -128) : (int8_t)(lcg_next(&g) >> 24);
            for (int r = 0; r < 4; r++) k[r][i] = trial < 2 ? (int8_t)-128 : (int8_t)(lcg_next(&g) >> 24);
        }
        int32_t got[4];
        vst1q_s32(got, i8x32_dot4_s32(q, k[0], k[1], k[2], k[3]));
        for (int r = 0; r < 4; r++) {
            int32_t want = 0;
            for (int i = 0; i < 32; i++) want += (int32_t)q[i] * k[r][i];
            if (got[r] != want) {
                printf("FAIL i8x32_dot4_s32 trial %d row %d: %d, want %d\n", trial, r, got[r], want);
                bad = 1;
            }
        }
    }
    int8_t all[256];
    for (int i = 0; i < 256; i++) all[i] = (int8_t)(i - 128);
    for (int i = 0; i < 256 && !bad; i += 16) {
        float32x4_t f[4];
        float got[16];
        v_i8x16_to_f32_magic(all + i, f);
        for (int u = 0; u < 4; u++) vst1q_f32(got + 4 * u, f[u]);
        for (int j = 0; j < 16; j++)
            if (got[j] != (float)all[i + j]) {
                printf("FAIL magic-number conversion of %d gave %g\n", all[i + j], (double)got[j]);
                bad = 1;
            }
    }
    if (verbose && !bad) printf("ok   i8x32_dot4_s32 equals the integer dots; magic conversion exact for all int8\n");
    return !bad;
}

int main(int argc, char **argv)
{
    int verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    Case cases[MAX_CASES];
    int ncases = make_cases(cases), passed = 0, failed = 0;
    printf("backend: %s\n", fa_backend());

    for (int j = 0; j < ncases; j++) {
        if (run_case(&cases[j], verbose)) passed++;
        else failed++;
    }
    int (*const quantizer_checks[])(int) = {quantizer_random, quantizer_extremes, quantizer_half_steps,
        quantizer_zero_rows, check_dot_lanes, check_expf, check_vexp, check_dot4_magic};
    for (size_t j = 0; j < sizeof quantizer_checks / sizeof quantizer_checks[0]; j++) {
        if (quantizer_checks[j](verbose)) passed++;
        else failed++;
    }

    printf("worst |kernel - scalar| / max(1, max|scalar|) over every registry variant but lowp, group and partial+merge: %.3g (tolerance %.0e)\n", (double)g_worst,
        (double)REL_TOL);
    printf("lowp and group lowp: worst |kernel - scalar| is %.3g of the derived bound 0.51 max|V| / 1016 (must be <= 1)\n",
        (double)g_lowp_worst);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
