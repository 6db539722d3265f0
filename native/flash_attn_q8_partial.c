/* flash_attn_partial_q8_neon: the article's single pass over a range of tokens [t_begin, t_end)
 * of one query head, stopped before the division: it returns the unnormalized online-softmax
 * state instead of the output. Beyond the article: lesson 08 (split-KV, Flash-Decoding 2023).
 *
 * The state of a run of tokens is (M, S, VKQ): M the largest score, S = sum exp(s - M) and
 * VKQ[hd] = sum exp(s - M) * v over the run. States of disjoint runs merge exactly:
 *     M = max(M1, M2),  S = S1 e^(M1 - M) + S2 e^(M2 - M),  VKQ = VKQ1 e^(M1 - M) + VKQ2 e^(M2 - M),
 * and the output is VKQ / S. So one long sequence can be cut into chunks scanned in parallel
 * (lessonkit.attend_split runs them on threads and merges with lessonkit.streaming.merge).
 * The original engine has no such split (docs/references.md).
 *
 * Arguments: those of flash_attn_single_q_q8_neon, except
 *   vkq_out [hd], m_out, s_out   the state written (no attn_out);
 *   t_begin, t_end               the token range, 0 <= t_begin <= t_end, in place of seq_len;
 *                                token t is read where the kernel reads it (kscale[t * nkv], ...).
 * An empty range gives the state of no token: M = -1e9 (the kernel's start), S = 0, VKQ = 0.
 * The token loop is the fast variant's (fa_fast_state, flash_attn_q8_steps.c), run over the chunk:
 * a chunk's state is flash_attn_single_q_q8_fast's M, S, VKQ after the chunk, had it started at
 * t_begin (its tiles start at t_begin).
 */
#include "flash_attn_q8.h"
#include "fa_online.h"

void flash_attn_partial_q8_neon(float *restrict vkq_out, float *restrict m_out, float *restrict s_out,
    const float *restrict q, int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int t_begin, int t_end, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (!fa_hd_ok(hd)) return;
    const int nblk = hd / QBLK;

    /* segment 1: Q to int8, once per call */
    float qsc[HD_MAX / QBLK];
    int8_t qi[HD_MAX];
    fa_quantize_q(q, nblk, qi, qsc);

    float M = -1e9f, S = 0.0f; /* the state of no token */
    for (int i = 0; i < hd; i++) vkq_out[i] = 0.0f; /* VKQ accumulated in place */
    fa_fast_state(qi, qsc, nblk, k_cache_q8, v_cache_q8, kscale, vscale, t_begin, t_end, kv_dim, kv_bs, nkv,
                  kh_off, hd, scale, &M, &S, vkq_out);

    /* no segment 4: the caller merges states and divides once, at the very end */
    *m_out = M;
    *s_out = S;
}
