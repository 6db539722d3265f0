/* Timing loop for the lessons and the benchmark: call a kernel `number` times back to back and
 * return the mean nanoseconds per call. The loop runs in C so that Python's own call overhead
 * (about a microsecond per cffi call) is not counted as kernel time. */
#define _POSIX_C_SOURCE 199309L
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "fa_variants.h"

typedef void (*fa_kernel)(float *restrict, const float *restrict, int8_t *const *, int8_t *const *,
    const float *restrict, const float *restrict, int, int, int, int, int, int, float);

/* the registry, one row per X of fa_variants.h, in its order */
static const struct { int version; const char *name; fa_kernel fn; const char *adds; } FA_TABLE[] = {
#define FA_ROW(version, name, fn, adds) {version, name, fn, adds},
    FA_VARIANTS(FA_ROW)
#undef FA_ROW
};

int fa_variant_count(void) { return (int)(sizeof FA_TABLE / sizeof FA_TABLE[0]); }
int fa_variant_version(int i) { return i >= 0 && i < fa_variant_count() ? FA_TABLE[i].version : -1; }
const char *fa_variant_name(int i) { return i >= 0 && i < fa_variant_count() ? FA_TABLE[i].name : NULL; }
const char *fa_variant_adds(int i) { return i >= 0 && i < fa_variant_count() ? FA_TABLE[i].adds : NULL; }

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

double fa_time_calls(int variant, int number, float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (variant < 0 || variant >= fa_variant_count() || number < 1) return -1.0;
    const fa_kernel kernel = FA_TABLE[variant].fn;
    double t0 = now_ns();
    for (int i = 0; i < number; i++)
        kernel(attn_out, q, k_cache_q8, v_cache_q8, kscale, vscale,
                         seq_len, kv_dim, kv_bs, nkv, kh_off, hd, scale);
    return (now_ns() - t0) / number;
}

double fa_time_group_calls(int variant, int number, float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale, int G)
{
    if (variant < 0 || variant > 3 || number < 1 || G < 1 || G > GQA_MAX) return -1.0;
    double t0 = now_ns();
    for (int i = 0; i < number; i++) {
        if (variant == 3) /* one scan, lowp's accumulation */
            flash_attn_group_q8_lowp(attn_out, q, k_cache_q8, v_cache_q8, kscale, vscale,
                                     seq_len, kv_dim, kv_bs, nkv, kh_off, hd, scale, G);
        else if (variant == 0) /* one scan for the whole group */
            flash_attn_group_q8_neon(attn_out, q, k_cache_q8, v_cache_q8, kscale, vscale,
                                     seq_len, kv_dim, kv_bs, nkv, kh_off, hd, scale, G);
        else              /* one call per query head, each reading the kv head's KV again: the
                             article's kernel (1) or the fast single-head version (2) */
            for (int g = 0; g < G; g++)
                (variant == 1 ? flash_attn_single_q_q8_neon : flash_attn_single_q_q8_fast)(attn_out + (size_t)g * hd, q + (size_t)g * hd, k_cache_q8,
                    v_cache_q8, kscale, vscale, seq_len, kv_dim, kv_bs, nkv, kh_off, hd, scale);
    }
    return (now_ns() - t0) / number;
}

double fa_time_call_cold(int variant, unsigned char *flush, size_t flush_bytes,
    float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    for (size_t i = 0; i < flush_bytes; i += 64) flush[i]++; /* evict the cache's data */
    return fa_time_calls(variant, 1, attn_out, q, k_cache_q8, v_cache_q8, kscale, vscale,
                         seq_len, kv_dim, kv_bs, nkv, kh_off, hd, scale);
}

double fa_read_gbps(const void *buf, size_t bytes, int reps)
{
    const uint64_t *p = buf;
    size_t n = bytes / sizeof(uint64_t);
    double best = 0.0;
    volatile uint64_t sink;
    for (int r = 0; r < reps; r++) {
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
        double t0 = now_ns();
        for (size_t i = 0; i + 8 <= n; i += 8) { /* one 64-byte line per step, eight independent sums */
            a0 += p[i]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3];
            a4 += p[i + 4]; a5 += p[i + 5]; a6 += p[i + 6]; a7 += p[i + 7];
        }
        double gbps = (double)bytes / (now_ns() - t0);
        sink = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
        if (gbps > best) best = gbps;
    }
    (void)sink;
    return best;
}

/* The kernel's reads without its arithmetic: for each token of one kv head, its K row and V row
 * (hd bytes each, through the block tables, block and row tracked without a division) and its two
 * scales, summed in eight independent lanes, as fa_read_gbps sums a flat buffer. Beside
 * fa_read_gbps it tells what the cache's layout itself allows (its pages, two streams, block jumps):
 * the roof a kernel over this cache can reach. GB/s of seq_len * (2 * hd + 8) bytes, best of reps;
 * -1 for a bad hd (a multiple of 64 up to HD_MAX) or seq_len. */
double fa_read_cache_gbps(int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *kscale, const float *vscale, int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd,
    int reps)
{
    if (hd <= 0 || hd > HD_MAX || hd % 64 != 0 || seq_len < 0 || kv_bs < 1 || reps < 1) return -1.0;
    double best = 0.0;
    volatile uint64_t sink;
    for (int rep = 0; rep < reps; rep++) {
        uint64_t a[8] = {0};
        float sc = 0.0f;
        double t0 = now_ns();
        for (int t = 0, b = 0, r = 0; t < seq_len; t++) {
            size_t off = (size_t)r * kv_dim + kh_off;
            const uint64_t *k = (const uint64_t *)(k_cache_q8[b] + off), *v = (const uint64_t *)(v_cache_q8[b] + off);
            for (int i = 0; i < hd / 8; i += 8)
                for (int u = 0; u < 8; u++) a[u] += k[i + u] + v[i + u];
            sc += kscale[(size_t)t * nkv] + vscale[(size_t)t * nkv];
            if (++r == kv_bs) {
                r = 0;
                b++;
            }
        }
        double gbps = (double)seq_len * (2 * hd + 8) / (now_ns() - t0);
        sink = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7] + (uint64_t)sc;
        if (gbps > best) best = gbps;
    }
    (void)sink;
    return best;
}
