/* fa_driver: runs one kernel once on a cache it builds itself, for valgrind's cache simulation
 * (lessonkit.traffic). Only the kernel call inside measured_call() (measured_softmax(),
 * measured_group()) is counted, so building the cache is not.
 *
 * How the call is bracketed: with callgrind's client requests. CALLGRIND_TOGGLE_COLLECT, from
 * <valgrind/callgrind.h> (Debian ships it in the valgrind package), switches event collection on
 * right before the kernel call and off right after it; valgrind runs with --collect-atstart=no, so
 * nothing else is counted. The cache simulation keeps running while collection is off, so the cold
 * eviction and the warm-up call still leave the simulated caches as they would. Outside valgrind a
 * client request is a few instructions that do nothing. Where the header is missing, the driver
 * is built without them (FA_CLIENT_REQUESTS 0) and lessonkit.traffic falls back to
 * --toggle-collect=measured_call, which collects everything from the function's entry until
 * callgrind sees it return; on arm64 it can miss that return and charge the code after the call
 * to it, which is why the client requests are the default. `fa_driver method` prints which one
 * this build uses.
 *
 *   fa_driver VARIANT SEQ_LEN HD NKV KV_BS [warm|cold [EVICT_BYTES]]
 *   fa_driver method                                   (prints client-requests or toggle-collect)
 *   VARIANT: single (= neon) or any name of native/fa_variants.h  (attention, kv head NKV - 1)
 *            group<G> | per_head<G>, G = 1..8  (lesson 08: G query heads on kv head NKV - 1, in one
 *                                                call of flash_attn_group_q8_neon, or in G calls of
 *                                                the single-pass kernel; measured_group)
 *            softmax_naive | softmax_safe | softmax_online             (SEQ_LEN floats; HD... ignored)
 * warm: one unmeasured call first, so whatever fits in the caches is there; cold (the default):
 * a buffer of EVICT_BYTES (default 64 MiB; give at least twice the simulated last level) is
 * written first, evicting the cache data from every simulated level. The first block's codes
 * come from the quantizer, the others are copies of it with a different sign pattern: cheap under
 * valgrind, and the access pattern, which is all the simulation sees, is the engine's.
 * Rows are 64-byte aligned, as a real engine's blocks are, so a 128-byte row is two cache lines.
 *
 * lessonkit.traffic builds it without AVX-512 on x86 and with -march=armv8-a (no sdot) on arm64:
 * valgrind 3.19 cannot decode either and stops the program with SIGILL, and the kernel loads and
 * stores the same bytes on every SIMD path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_variants.h"

#ifndef FA_CLIENT_REQUESTS /* -DFA_CLIENT_REQUESTS=0 forces the --toggle-collect build */
#  if defined(__has_include)
#    if __has_include(<valgrind/callgrind.h>)
#      define FA_CLIENT_REQUESTS 1
#    endif
#  endif
#endif
#if defined(FA_CLIENT_REQUESTS) && FA_CLIENT_REQUESTS
#  include <valgrind/callgrind.h>
#  define COLLECT_ON_OFF() CALLGRIND_TOGGLE_COLLECT
#else
#  undef FA_CLIENT_REQUESTS
#  define FA_CLIENT_REQUESTS 0
#  define COLLECT_ON_OFF() ((void)0)
#endif

typedef void (*Kernel)(float *restrict, const float *restrict, int8_t *const *, int8_t *const *,
    const float *restrict, const float *restrict, int, int, int, int, int, int, float);

static uint64_t lcg = 0x243F6A8885A308D3ULL;
static float rnd(void) /* uniform in [-1, 1) */
{
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)(lcg >> 40) / (float)(1 << 23) - 1.0f;
}

static void *aligned(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

static size_t evict_bytes = 64u << 20;

static void evict_caches(void)
{
    size_t n = evict_bytes;
    volatile char *junk = aligned(n);
    for (size_t i = 0; i < n; i += 64) junk[i] = (char)i;
    free((void *)junk);
}

/* The measured calls: kept out of line and named, for the --toggle-collect fallback; each one
 * switches collection on and off around its kernel call alone (client requests). */
__attribute__((noinline)) void measured_call(Kernel k, float *out, const float *q, int8_t **kc,
    int8_t **vc, const float *ks, const float *vs, int T, int kv_dim, int bs, int nkv, int kh_off, int hd)
{
    COLLECT_ON_OFF();
    k(out, q, kc, vc, ks, vs, T, kv_dim, bs, nkv, kh_off, hd, 0.0883883f);
    COLLECT_ON_OFF();
}

__attribute__((noinline)) void measured_softmax(void (*f)(const float *, float *, int),
    const float *x, float *y, int n)
{
    COLLECT_ON_OFF();
    f(x, y, n);
    COLLECT_ON_OFF();
}

/* G query heads of one kv head: one grouped call, or G calls of the single-pass kernel, one per head */
static void run_group(int per_head, int G, float *out, const float *q, int8_t **kc, int8_t **vc,
    const float *ks, const float *vs, int T, int kv_dim, int bs, int nkv, int kh_off, int hd)
{
    if (!per_head) {
        flash_attn_group_q8_neon(out, q, kc, vc, ks, vs, T, kv_dim, bs, nkv, kh_off, hd, 0.0883883f, G);
        return;
    }
    for (int g = 0; g < G; g++)
        flash_attn_single_q_q8_neon(out + g * hd, q + g * hd, kc, vc, ks, vs, T, kv_dim, bs, nkv, kh_off, hd,
                                    0.0883883f);
}

__attribute__((noinline)) void measured_group(int per_head, int G, float *out, const float *q, int8_t **kc,
    int8_t **vc, const float *ks, const float *vs, int T, int kv_dim, int bs, int nkv, int kh_off, int hd)
{
    COLLECT_ON_OFF();
    run_group(per_head, G, out, q, kc, vc, ks, vs, T, kv_dim, bs, nkv, kh_off, hd);
    COLLECT_ON_OFF();
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "method") == 0) {
        puts(FA_CLIENT_REQUESTS ? "client-requests" : "toggle-collect");
        return 0;
    }
    if (argc < 6) { fprintf(stderr, "usage: fa_driver VARIANT SEQ_LEN HD NKV KV_BS [warm|cold [EVICT_BYTES]]\n"
                                 "       fa_driver method\n"); return 2; }
    const char *variant = argv[1];
    int T = atoi(argv[2]), hd = atoi(argv[3]), nkv = atoi(argv[4]), bs = atoi(argv[5]);
    int warm = argc > 6 && strcmp(argv[6], "warm") == 0;
    if (argc > 7) evict_bytes = (size_t)atoll(argv[7]);
    double check = 0.0;

    static const struct { const char *name; void (*f)(const float *, float *, int); } softmaxes[] = {
        {"softmax_naive", softmax_naive}, {"softmax_safe", softmax_safe}, {"softmax_online", softmax_online}};
    for (size_t i = 0; i < sizeof softmaxes / sizeof softmaxes[0]; i++) {
        if (strcmp(variant, softmaxes[i].name) != 0) continue;
        float *x = aligned((size_t)T * 4), *y = aligned((size_t)T * 4);
        for (int j = 0; j < T; j++) x[j] = 8.0f * rnd();
        if (warm) softmaxes[i].f(x, y, T);
        else evict_caches();
        measured_softmax(softmaxes[i].f, x, y, T);
        for (int j = 0; j < T; j++) check += y[j];
        printf("sum %.6f\n", check);
        return 0;
    }

    /* every registry name (fa_variants.h), and "single" (lessonkit.traffic's name for "neon") */
#define DRIVER_ROW(version, name, fn, adds) {name, fn},
    static const struct { const char *name; Kernel k; } kernels[] = {
        {"single", flash_attn_single_q_q8_neon}, FA_VARIANTS(DRIVER_ROW)};
#undef DRIVER_ROW
    Kernel k = NULL;
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        if (strcmp(variant, kernels[i].name) == 0) k = kernels[i].k;
    int G = 0, per_head = 0; /* lesson 08's variants: group<G>, per_head<G> */
    if (strncmp(variant, "group", 5) == 0) G = atoi(variant + 5);
    if (strncmp(variant, "per_head", 8) == 0) G = atoi(variant + 8), per_head = 1;
    if (G != 0 && (G < 1 || G > 8)) G = 0;
    if ((!k && !G) || T < 1 || hd < 32 || hd > 256 || hd % 32 || nkv < 1 || bs < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    int kv_dim = nkv * hd, nblocks = (T + bs - 1) / bs;
    int8_t **kc = malloc(sizeof *kc * nblocks), **vc = malloc(sizeof *vc * nblocks);
    float *ks = aligned((size_t)nblocks * bs * nkv * 4), *vs = aligned((size_t)nblocks * bs * nkv * 4);
    size_t block_bytes = (size_t)bs * kv_dim;
    float *row = malloc(block_bytes * 4);
    for (int b = 0; b < nblocks; b++) {
        kc[b] = aligned(block_bytes);
        vc[b] = aligned(block_bytes);
        if (b == 0) {
            for (size_t j = 0; j < block_bytes; j++) row[j] = rnd();
            kvq8_quantize_rows(row, bs * nkv, hd, hd, kc[0], hd, ks, 1);
            for (size_t j = 0; j < block_bytes; j++) row[j] = rnd();
            kvq8_quantize_rows(row, bs * nkv, hd, hd, vc[0], hd, vs, 1);
        } else {
            memcpy(kc[b], kc[0], block_bytes);
            memcpy(vc[b], vc[0], block_bytes);
            kc[b][b % block_bytes] = (int8_t)-kc[b][b % block_bytes]; /* not all blocks alike */
        }
    }
    for (size_t j = (size_t)bs * nkv; j < (size_t)nblocks * bs * nkv; j++) {
        ks[j] = 1.0f + 0.5f * rnd();
        vs[j] = 1.0f + 0.5f * rnd();
    }
    float q[256], out[256];
    for (int i = 0; i < hd; i++) q[i] = rnd();
    int kh = nkv - 1;
    if (G) { /* G query heads: q and out [G][hd] on the heap, head 0 the q above */
        float *qg = aligned((size_t)G * hd * 4), *outg = aligned((size_t)G * hd * 4);
        for (int i = 0; i < G * hd; i++) qg[i] = i < hd ? q[i] : rnd();
        if (warm) run_group(per_head, G, outg, qg, kc, vc, ks + kh, vs + kh, T, kv_dim, bs, nkv, kh * hd, hd);
        else evict_caches();
        measured_group(per_head, G, outg, qg, kc, vc, ks + kh, vs + kh, T, kv_dim, bs, nkv, kh * hd, hd);
        for (int i = 0; i < G * hd; i++) check += outg[i];
        printf("sum %.6f\n", check);
        return 0;
    }
    if (warm) k(out, q, kc, vc, ks + kh, vs + kh, T, kv_dim, bs, nkv, kh * hd, hd, 0.0883883f);
    else evict_caches();
    measured_call(k, out, q, kc, vc, ks + kh, vs + kh, T, kv_dim, bs, nkv, kh * hd, hd);
    for (int i = 0; i < hd; i++) check += out[i];
    printf("sum %.6f\n", check);
    return 0;
}
