/* fa_variants.h: the one list of the kernel's variants. Every consumer expands FA_VARIANTS with its
 * own X: the timing table (fa_timing.c: fa_time_calls(index, ...), fa_variant_name(index), ...), the
 * C test program (native/tests/test_kernel.c), and Python (lessonkit/variants.py reads this file).
 *
 * X(version, name, function, adds): version is the index fa_time_calls takes, name what
 * lessonkit.timing.time_kernel(backend=...) takes, function a kernel with the article's signature,
 * adds the one idea it adds to the version it builds on. 0-3 are the article's kernels (sections
 * 2 and 3) and the scalar reference; 4-10 are the steps of flash_attn_q8_steps.c, each on the one
 * before it (4 on 0); 11 is the one the other kernels build on, under its own name; 12-13 are the two-pass
 * alternatives built from the fast steps, so that they compare like with like against 11; 14 departs
 * from the article's fp32 weights (lowp: V accumulated by int8 dot products, within a derived bound).
 * Keep one X per line: lessonkit/variants.py parses the lines. */
#ifndef FA_VARIANTS_H
#define FA_VARIANTS_H
#include "flash_attn_q8.h"

#define FA_VARIANTS(X) \
    X(0, "neon", flash_attn_single_q_q8_neon, "the article's kernel as printed in article 9-2: one token loop (score, online update, accumulate)") \
    X(1, "scalar", flash_attn_single_q_q8_scalar, "the scalar C reference every variant is checked against") \
    X(2, "two_pass_scores", flash_attn_two_pass_scores_q8, "article section 3: all scores stored first, then exp and sum, then V") \
    X(3, "two_pass_recompute", flash_attn_two_pass_recompute_q8, "article section 3: K read twice (max and sum first, then scores again with V)") \
    X(4, "tile", flash_attn_q8_v4_tile, "on v0: scores a tile of FA_TILE tokens before folding them in token by token") \
    X(5, "score4", flash_attn_q8_v5_score4, "on v4: four K rows scored together, their int32 block sums reduced in one step") \
    X(6, "tile_rescale", flash_attn_q8_v6_tile_rescale, "on v5: one max and one rescale of S and VKQ per tile instead of per new max") \
    X(7, "vexp", flash_attn_q8_v7_vexp, "on v6: the tile's weights by a 4-lane NEON exp instead of one expf per token") \
    X(8, "vkq_regs", flash_attn_q8_v8_vkq_regs, "on v7: VKQ held in registers, 32 columns at a time, over the tile's V rows") \
    X(9, "magic", flash_attn_q8_v9_magic, "on v8: V's int8 -> fp32 by adding to the bits of 1.5 * 2^23 and subtracting it (no scvtf)") \
    X(10, "prefetch", flash_attn_q8_v10_prefetch, "on v9: software prefetch of the K and V rows FA_PREFETCH tokens ahead") \
    X(11, "fast", flash_attn_single_q_q8_fast, "the single-head version the grouped and split-KV kernels build on: v8's steps on x86, v9's (with the magic add) on aarch64") \
    X(12, "two_pass_scores_fast", flash_attn_two_pass_scores_q8_fast, "v2's three passes built from the fast steps (scores four at a time, vector exp, VKQ in registers)") \
    X(13, "two_pass_recompute_fast", flash_attn_two_pass_recompute_q8_fast, "v3's two passes over K built from the fast steps") \
    X(14, "lowp", flash_attn_q8_v14_lowp, "on v10: V times the weights by int8 dot products (sdot; on x86 VNNI, or AVX2 without it), each 16 tokens' weights as 14-bit codes with one fp32 step; M and S stay fp32")

/* every variant's declaration (the article's signature) */
#define FA_DECLARE(version, name, fn, adds)                                                          \
    void fn(float *restrict attn_out, const float *restrict q, int8_t *const *k_cache_q8,            \
        int8_t *const *v_cache_q8, const float *restrict kscale, const float *restrict vscale,       \
        int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale);
FA_VARIANTS(FA_DECLARE)
#undef FA_DECLARE

#endif
