/* fa_perf.c: the developers' timing of every registry variant, the grouped kernel and split-KV
 * on threads, in C alone (no Python between calls), for optimisation work on a shared machine:
 * contenders interleaved round by round, the MINIMUM over rounds reported (the least disturbed
 * run; the machine's other load only ever adds time). Not a lesson figure: lessonkit.bench is.
 *
 *   cc -O3 -Inative $(python -m lessonkit cflags --arch-only) native/tools/fa_perf.c native/[a-z]*.c \
 *      -lm -lpthread -o fa_perf
 *   ./fa_perf T rounds [variant names...]    # T tokens, hd 128, one kv head, blocks of 64
 * Prints ns/token (min and median of rounds) per contender, and read GB/s: one thread over one
 * stream (fa_read_gbps), one thread over two streams as the kernel reads K and V, and two threads. */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>

#include "fa_variants.h"

#define HD 128
#define BS 64
#define G 4

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int8_t **K, **V;
static float *ks, *vs, q[G * HD], out[G * HD];
static int T;

typedef struct { int t0, t1; float vkq[HD], m, s; } chunk;
static void *run_chunk(void *p)
{
    chunk *c = p;
    flash_attn_partial_q8_neon(c->vkq, &c->m, &c->s, q, K, V, ks, vs, c->t0, c->t1, HD, BS, 1, 0, HD, 0.088f);
    return NULL;
}
/* split-KV: two chunks, on 1 or 2 threads, and the merge of their states */
static void split(int threads)
{
    chunk c[2] = {{0, T / 2, {0}, 0, 0}, {T / 2, T, {0}, 0, 0}};
    if (threads == 2) {
        pthread_t th;
        pthread_create(&th, NULL, run_chunk, &c[1]);
        run_chunk(&c[0]);
        pthread_join(th, NULL);
    } else {
        run_chunk(&c[0]);
        run_chunk(&c[1]);
    }
    float m = c[0].m > c[1].m ? c[0].m : c[1].m, a = expf(c[0].m - m), b = expf(c[1].m - m);
    float s = c[0].s * a + c[1].s * b;
    for (int i = 0; i < HD; i++) out[i] = (c[0].vkq[i] * a + c[1].vkq[i] * b) / s;
}

/* Read bandwidth of two streams at once, the way the kernel reads K and V: a 128-byte row of
 * each per step (two 64-byte lines of a, then two of b), eight independent sums. GB/s, best of reps. */
static double read2_gbps(const uint64_t *a, const uint64_t *b, size_t bytes_each, int reps)
{
    size_t n = bytes_each / sizeof(uint64_t);
    double best = 0.0;
    volatile uint64_t sink;
    for (int r = 0; r < reps; r++) {
        uint64_t s[8] = {0};
        double t0 = now_ns();
        for (size_t i = 0; i + 16 <= n; i += 16)
            for (int u = 0; u < 8; u++) s[u] += a[i + u] + a[i + 8 + u] + b[i + u] + b[i + 8 + u];
        double gbps = 2.0 * (double)bytes_each / (now_ns() - t0);
        sink = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
        if (gbps > best) best = gbps;
    }
    (void)sink;
    return best;
}

/* two threads, each reading its half with fa_read_gbps; the figure is all bytes over the span from
 * the first start to the last end (started together at a barrier), best of reps */
typedef struct { const unsigned char *p; size_t bytes; double t0, t1; pthread_barrier_t *bar; } reader;
static void *read_half(void *arg)
{
    reader *r = arg;
    pthread_barrier_wait(r->bar);
    r->t0 = now_ns();
    fa_read_gbps(r->p, r->bytes, 1);
    r->t1 = now_ns();
    return NULL;
}
static double read_2t_gbps(const unsigned char *buf, size_t bytes, int reps)
{
    double best = 0.0;
    for (int k = 0; k < reps; k++) {
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, 2);
        reader r[2] = {{buf, bytes / 2, 0, 0, &bar}, {buf + bytes / 2, bytes / 2, 0, 0, &bar}};
        pthread_t th;
        pthread_create(&th, NULL, read_half, &r[1]);
        read_half(&r[0]);
        pthread_join(th, NULL);
        pthread_barrier_destroy(&bar);
        double t0 = r[0].t0 < r[1].t0 ? r[0].t0 : r[1].t0, t1 = r[0].t1 > r[1].t1 ? r[0].t1 : r[1].t1;
        double gbps = (double)bytes / (t1 - t0);
        if (gbps > best) best = gbps;
    }
    return best;
}

/* A 2 MiB-aligned buffer of at least `bytes`, marked for transparent huge pages: numpy asks the
 * same for its large arrays (the workbook's cache slabs and its bandwidth probe's buffer), so the
 * C figures are taken under the workbook's paging, not under 4 KiB pages and their TLB misses. */
static void *huge_alloc(size_t bytes)
{
    size_t sz = (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    void *p = aligned_alloc(2u << 20, sz);
    if (p) madvise(p, sz, MADV_HUGEPAGE);
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    T = atoi(argv[1]);
    int rounds = atoi(argv[2]);
    int nb = (T + BS - 1) / BS;
    K = malloc(sizeof *K * nb);
    V = malloc(sizeof *V * nb);
    srand(1);
    /* FA_PERF_CONTIG=1: all K blocks in one arena and all V blocks in another (as an engine's
     * pool allocates them, and as lessonkit.cache's slabs are laid out), with huge pages as numpy
     * gets them, instead of one allocation per block, K and V alternating */
    int contig = getenv("FA_PERF_CONTIG") && atoi(getenv("FA_PERF_CONTIG"));
    int8_t *ka = contig ? huge_alloc((size_t)nb * BS * HD) : NULL;
    int8_t *va = contig ? huge_alloc((size_t)nb * BS * HD) : NULL;
    for (int b = 0; b < nb; b++) {
        K[b] = contig ? ka + (size_t)b * BS * HD : aligned_alloc(64, BS * HD);
        V[b] = contig ? va + (size_t)b * BS * HD : aligned_alloc(64, BS * HD);
        for (int i = 0; i < BS * HD; i++) { K[b][i] = (int8_t)(rand() % 255 - 127); V[b][i] = (int8_t)(rand() % 255 - 127); }
    }
    ks = malloc(sizeof *ks * T);
    vs = malloc(sizeof *vs * T);
    for (int t = 0; t < T; t++) { ks[t] = 2.0f + (float)(rand() % 100) / 100.0f; vs[t] = 2.5f; }
    for (int i = 0; i < G * HD; i++) q[i] = (float)(rand() % 2001 - 1000) / 1000.0f;

    /* contenders: registry entries named on the command line (all if none), group4, fast4, split */
    const char *names[64];
    int n = 0;
    for (int i = 3; i < argc; i++) names[n++] = argv[i];
    if (n == 0)
        for (int i = 0; i < fa_variant_count(); i++)
            if (strcmp(fa_variant_name(i), "scalar") && strncmp(fa_variant_name(i), "two_pass", 8)) names[n++] = fa_variant_name(i);
    double best[64], all[64][256];
    for (int c = 0; c < n; c++) best[c] = 1e30;
    int number = T >= 65536 ? 1 : 65536 * 4 / T;
    if (rounds > 256) rounds = 256;
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < n; k++) {
            int c = (k + r) % n; /* rotate the order every round */
            const char *nm = names[c];
            double t0 = now_ns(), ns = -1;
            if (!strcmp(nm, "group4")) {
                for (int i = 0; i < number; i++)
                    flash_attn_group_q8_neon(out, q, K, V, ks, vs, T, HD, BS, 1, 0, HD, 0.088f, G);
                ns = (now_ns() - t0) / number;
            } else if (!strcmp(nm, "fast4")) {
                for (int i = 0; i < number; i++)
                    for (int g = 0; g < G; g++)
                        flash_attn_single_q_q8_fast(out + g * HD, q + g * HD, K, V, ks, vs, T, HD, BS, 1, 0, HD, 0.088f);
                ns = (now_ns() - t0) / number;
            } else if (!strcmp(nm, "split1") || !strcmp(nm, "split2")) {
                for (int i = 0; i < number; i++) split(nm[5] - '0');
                ns = (now_ns() - t0) / number;
            } else {
                for (int v = 0; v < fa_variant_count(); v++)
                    if (!strcmp(fa_variant_name(v), nm))
                        ns = fa_time_calls(v, number, out, q, K, V, ks, vs, T, HD, BS, 1, 0, HD, 0.088f);
            }
            if (ns < 0) { fprintf(stderr, "unknown contender %s\n", nm); return 3; }
            all[c][r] = ns;
            if (ns < best[c]) best[c] = ns;
        }
    printf("T=%d rounds=%d calls/sample=%d\n", T, rounds, number);
    for (int c = 0; c < n; c++) {
        double *a = all[c];
        for (int i = 1; i < rounds; i++) /* insertion sort for the median */
            for (int j = i; j > 0 && a[j] < a[j - 1]; j--) { double x = a[j]; a[j] = a[j - 1]; a[j - 1] = x; }
        printf("%-24s min %7.2f  median %7.2f ns/token  (%.2f GB/s at min)\n", names[c], best[c] / T,
               a[rounds / 2] / T, (double)T * (2 * HD + 8) / best[c]);
    }
    size_t bytes = 256u << 20;
    void *buf = huge_alloc(bytes);
    memset(buf, 1, bytes);
    printf("read bandwidth 1 thread: %.2f GB/s (best of 5)\n", fa_read_gbps(buf, bytes, 5));
    printf("read bandwidth 1 thread, two streams (K and V): %.2f GB/s (best of 5)\n",
           read2_gbps(buf, (const uint64_t *)((unsigned char *)buf + bytes / 2), bytes / 2, 5));
    printf("read bandwidth 2 threads: %.2f GB/s (best of 5)\n", read_2t_gbps(buf, bytes, 5));
    return 0;
}
