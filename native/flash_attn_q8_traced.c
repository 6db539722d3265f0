/* flash_attn_single_q_q8_neon_traced: the kernel of flash_attn_q8_neon.c compiled a second time,
 * with its trace hooks filled in, so that lessons can watch the real kernel work: Q's codes and
 * block scales, every int32 block dot, the address of every K and V row it read, and after each
 * token s, M, S, the rescale factor and the accumulator VKQ. The untraced kernel's hooks are
 * empty, so tracing costs it nothing. Call fa_trace_set(&trace) on the same thread first; NULL
 * fields are skipped. */
#include <string.h>

#include "flash_attn_q8.h"

static _Thread_local fa_trace *trace;

void fa_trace_set(fa_trace *t) { trace = t; }

#define TRACE_Q(qi, qsc, nblk)                                                   \
    do {                                                                         \
        if (trace) trace->n_q_quantized++;                                       \
        if (trace && trace->q_codes) memcpy(trace->q_codes, qi, (size_t)(nblk) * 32); \
        if (trace && trace->q_scales) memcpy(trace->q_scales, qsc, (size_t)(nblk) * sizeof(float)); \
    } while (0)
#define TRACE_DOT(t, b, dot32)                                                   \
    do { if (trace && trace->dots) trace->dots[(size_t)(t) * nblk + (b)] = (dot32); } while (0)
#define TRACE_RESCALE(t, ms)                                                     \
    do { if (trace && trace->ms) trace->ms[t] = (ms); } while (0)
#define TRACE_K_ROW(t, kt)                                                       \
    do { if (trace && trace->k_rows) trace->k_rows[t] = (uint64_t)(uintptr_t)(kt); } while (0)
#define TRACE_TOKEN(t, vt, s, M, S, VKQ, hd)                                     \
    do {                                                                         \
        if (trace) {                                                             \
            if (trace->v_rows) trace->v_rows[t] = (uint64_t)(uintptr_t)(vt);     \
            if (trace->s) trace->s[t] = (s);                                     \
            if (trace->M) trace->M[t] = (M);                                     \
            if (trace->S) trace->S[t] = (S);                                     \
            if (trace->vkq) memcpy(trace->vkq + (size_t)(t) * (hd), VKQ, (size_t)(hd) * sizeof(float)); \
        }                                                                        \
    } while (0)

/* the same source, under another name */
#define flash_attn_single_q_q8_neon flash_attn_single_q_q8_neon_traced
#include "flash_attn_q8_neon.c"
