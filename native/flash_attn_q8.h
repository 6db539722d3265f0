/* Declarations shared by the kernel, its scalar reference, the KV quantizer and the C tests.
 * lessonkit.native hands the lines of this file that do not start with '#' to cffi's cdef,
 * so keep them plain C declarations: no macros, no inline code. */
#ifndef FLASH_ATTN_Q8_H
#define FLASH_ATTN_Q8_H
#include <stddef.h>
#include <stdint.h>

/* The kernels' fixed sizes, defined here once: the C files use them, and lessonkit.header reads
 * these three lines (NAME and a whole number) instead of repeating the numbers in Python. */
#define QBLK 32    /* Q is quantized in blocks of 32 values, like llama.cpp's q8_0 */
#define HD_MAX 256 /* the kernels' fixed Q buffers hold at most 256 values of Q */
#define GQA_MAX 8  /* query heads per grouped call (flash_attn_group_q8_neon's fixed buffers) */

/* Article 9-2, section 2: decode attention for one query over the q8 KV cache, one pass.
 * The NEON build on aarch64, SIMDe's emulation of the same intrinsics elsewhere. */
void flash_attn_single_q_q8_neon(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);

/* The same signature and the same math in plain C: the reference the NEON code is checked against. */
void flash_attn_single_q_q8_scalar(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);

/* Article 9-2 section 3's alternatives (flash_attn_q8_two_pass.c): store all scores first, or
 * read K twice. Same arguments and output as the single-pass kernel. */
void flash_attn_two_pass_scores_q8(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);
void flash_attn_two_pass_recompute_q8(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);

/* Beyond the article (lesson 08, flash_attn_q8_group.c): GQA in one scan. The G query heads that
 * share one kv head, q [G][hd] -> attn_out [G][hd], with each K and V row read once for all G;
 * 1 <= G <= 8. Otherwise the kernel's arguments; equal to G calls of flash_attn_single_q_q8_neon. */
void flash_attn_group_q8_neon(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale, int G);

/* Beyond the article (lesson 08, flash_attn_q8_partial.c): split-KV. The single pass over tokens
 * [t_begin, t_end) of one query head, without the division: writes the unnormalized state
 * M (*m_out), S (*s_out) and VKQ (vkq_out [hd]). States of disjoint ranges merge (Flash-Decoding). */
void flash_attn_partial_q8_neon(float *restrict vkq_out, float *restrict m_out, float *restrict s_out,
    const float *restrict q, int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int t_begin, int t_end, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);

/* The naive, safe and online softmax of Milakov and Gimelshein (2018) over n floats
 * (softmax_variants.c): lesson 05 counts their memory accesses per element. */
void softmax_naive(const float *x, float *y, int n);
void softmax_safe(const float *x, float *y, int n);
void softmax_online(const float *x, float *y, int n);

/* What the traced build records (flash_attn_q8_traced.c); each pointer may be NULL.
 * n_q_quantized counts executions of segment 1; q_codes [hd], q_scales [hd/32],
 * dots [seq_len][hd/32]; k_rows[t], v_rows[t]: the addresses of the K and V rows read for token t;
 * after token t: s[t], M[t], S[t], vkq[t][hd]; ms[t] is written only when token t raised M
 * (the rescale factor exp(M_old - s)). */
typedef struct fa_trace {
    int32_t n_q_quantized;
    int8_t *q_codes;
    float *q_scales;
    int32_t *dots;
    uint64_t *k_rows, *v_rows;
    float *s, *M, *S, *ms;
    float *vkq;
} fa_trace;

/* The kernel compiled once more with its trace hooks on; same arguments, same result. */
void flash_attn_single_q_q8_neon_traced(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);

/* Where the traced kernel writes, for calls on this thread; NULL turns recording off. */
void fa_trace_set(fa_trace *trace);

/* Quantize n_rows rows of hd floats, the way the engine writes K and V into its cache:
 * scales[r] = max|x_r| (raw, not divided by 127), codes = floor(x * 127 / max + 0.5);
 * a row of zeros gets scale 0 and codes 0. Row r is read from x + r * x_stride and written
 * to codes + r * code_stride, its scale to scales[r * scale_stride]. */
void kvq8_quantize_rows(const float *x, int n_rows, int hd, int x_stride,
    int8_t *codes, int code_stride, float *scales, int scale_stride);

/* The single-head version the grouped and split-KV kernels build on (flash_attn_q8_steps.c; native/fa_variants.h says which steps it
 * takes): the article's arguments and result, its loop tiled and vectorized. */
void flash_attn_single_q_q8_fast(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);

/* Lesson 09's version lowp (flash_attn_q8_steps.c): v10 (prefetch) with V accumulated by int8 dot products,
 * the weights of each 16 tokens as 14-bit codes with one fp32 step (M and S fp32). Not the article's
 * arithmetic: within a bound derived from the codes' step (native/tests/test_kernel.c), not 1e-5. */
void flash_attn_q8_v14_lowp(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);

/* The grouped kernel (flash_attn_group_q8_neon's arguments) with lowp's accumulation
 * (flash_attn_q8_group_lowp.c): equal to G calls of flash_attn_q8_v14_lowp. */
void flash_attn_group_q8_lowp(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale, int G);

/* The registry of native/fa_variants.h as the library holds it: entries 0 .. fa_variant_count()-1,
 * each with its version number, name (lessonkit.timing's backend=) and the idea it adds;
 * NULL or -1 outside that range. */
int fa_variant_count(void);
int fa_variant_version(int i);
const char *fa_variant_name(int i);
const char *fa_variant_adds(int i);

/* Call registry entry `variant` `number` times and return the mean ns per call (-1 for a bad
 * variant or number). */
double fa_time_calls(int variant, int number, float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);

/* Time GQA over one kv head, G query heads q [G][hd] -> attn_out [G][hd]: variant 0 one call of
 * flash_attn_group_q8_neon, variant 1 G calls of flash_attn_single_q_q8_neon, variant 2 G calls of flash_attn_single_q_q8_fast (one per query head,
 * as the engine runs them), variant 3 one call of flash_attn_group_q8_lowp. Returns the mean ns per group of G heads (-1 for a bad variant,
 * number or G). */
double fa_time_group_calls(int variant, int number, float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale, int G);

/* One call with cold caches: first write one byte per 64-byte line of `flush` (make it several
 * times the last-level cache), then time the call alone. Returns ns (-1 for a bad variant). */
double fa_time_call_cold(int variant, unsigned char *flush, size_t flush_bytes,
    float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);

/* Single-thread read bandwidth: sum `bytes` of buf (a multiple of 64) `reps` times; returns
 * the best GB/s of the repeats. The benchmark's yardstick for the kernel's GB/s. */
double fa_read_gbps(const void *buf, size_t bytes, int reps);

/* The same sum over the bytes the kernel reads, in its order: the K and V rows of one kv head through
 * the block tables, and their scales (the kernel's arguments; hd a multiple of 64). GB/s of
 * seq_len * (2 * hd + 8) bytes, best of reps; -1 for bad arguments. The cache's own roof. */
double fa_read_cache_gbps(int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *kscale, const float *vscale, int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd,
    int reps);

/* Which compiled path this library took: "neon+dotprod", "neon" or "simde-<arch>". */
const char *fa_backend(void);

/* Which branch of each helper in q8_simd.h was compiled: "dot=... dot4=... vkq=... exp=... addv=...". */
const char *fa_simd_paths(void);

/* Lesson 05b (flash_attn_q8_two_pass_parts.c): the passes of the kernel and of its two-pass
 * alternatives over a token range, so that each can fold in a chunk of KV as it arrives.
 * The kernel's arguments; t0, t1 (0 <= t0 <= t1) replace seq_len for a pass over [t0, t1).
 * fold: the article's token loop continuing the state (*m_io, *s_io, vkq [hd]) in place (start
 * from M = -1e9, S = 0, VKQ = 0; divide VKQ by S at the end). scores_pass1: scores[t] for t in
 * [t0, t1), *m_io raised to their max; scores_rest: passes 2 and 3 over scores[0 .. seq_len)
 * (overwritten by the weights). recompute_pass1: M and S online over [t0, t1); recompute_pass2:
 * K again and V over [0, seq_len) with the final M and S. */
void flash_attn_single_pass_fold_q8(float *restrict vkq, float *restrict m_io, float *restrict s_io,
    const float *restrict q, int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int t0, int t1, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);
void flash_attn_two_pass_scores_pass1_q8(float *restrict scores, float *restrict m_io, const float *restrict q,
    int8_t *const *k_cache_q8, const float *restrict kscale,
    int t0, int t1, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);
void flash_attn_two_pass_scores_rest_q8(float *restrict attn_out, float *restrict scores, float M,
    int8_t *const *v_cache_q8, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd);
void flash_attn_two_pass_recompute_pass1_q8(float *restrict m_io, float *restrict s_io, const float *restrict q,
    int8_t *const *k_cache_q8, const float *restrict kscale,
    int t0, int t1, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);
void flash_attn_two_pass_recompute_pass2_q8(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale, float M, float S,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);

#endif
