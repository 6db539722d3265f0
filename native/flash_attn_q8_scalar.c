/* flash_attn_single_q_q8_scalar: the kernel's math in plain C, one statement per step of
 * the article's section 2 (and docs/references.md), no intrinsics. It is the reference the NEON kernel is checked against,
 * so it is written for clarity, not speed: integer dots in int32, everything else in float,
 * in the same order of operations as the NEON kernel. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "flash_attn_q8.h"

enum { QB = 32, MAX_HD = 256 };
static const float INV127 = 1.0f / 127.0f;

static int8_t round_half_away_clamped(float v)
{
    int r = (int)(v >= 0.0f ? v + 0.5f : v - 0.5f);
    if (r > 127) r = 127;
    if (r < -128) r = -128;
    return (int8_t)r;
}

void flash_attn_single_q_q8_scalar(float *restrict attn_out, const float *restrict q,
    int8_t *const *k_cache_q8, int8_t *const *v_cache_q8,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    if (hd <= 0 || hd > MAX_HD || hd % QB != 0) return;
    int8_t qcode[MAX_HD];
    float qblock_scale[MAX_HD / QB];
    for (int b = 0; b * QB < hd; b++) {
        float amax = 0.0f;
        for (int i = b * QB; i < (b + 1) * QB; i++)
            if (fabsf(q[i]) > amax) amax = fabsf(q[i]);
        if (amax < 1e-6f) amax = 1.0f;
        qblock_scale[b] = amax * INV127;
        float to_code = 127.0f / amax;
        for (int i = b * QB; i < (b + 1) * QB; i++) qcode[i] = round_half_away_clamped(q[i] * to_code);
    }

    float running_max = -1e9f, running_sum = 0.0f;
    float acc[MAX_HD] = {0};
    for (int t = 0; t < seq_len; t++) {
        size_t row = (size_t)(t % kv_bs) * kv_dim + kh_off;
        const int8_t *k = k_cache_q8[t / kv_bs] + row;
        const int8_t *v = v_cache_q8[t / kv_bs] + row;

        float score = 0.0f;
        for (int b = 0; b * QB < hd; b++) {
            int32_t dot = 0;
            for (int i = b * QB; i < (b + 1) * QB; i++) dot += (int32_t)qcode[i] * (int32_t)k[i];
            score += (float)dot * qblock_scale[b];
        }
        score = score * (kscale[(size_t)t * nkv] * INV127) * scale;

        float weight;
        if (score > running_max) {
            float shrink = expf(running_max - score);
            running_max = score;
            running_sum *= shrink;
            for (int i = 0; i < hd; i++) acc[i] *= shrink;
            weight = 1.0f;
        } else {
            weight = expf(score - running_max);
        }
        running_sum += weight;
        float vw = weight * (vscale[(size_t)t * nkv] * INV127);
        for (int i = 0; i < hd; i++) acc[i] += (float)v[i] * vw;
    }

    float inv = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
    for (int i = 0; i < hd; i++) attn_out[i] = acc[i] * inv;
}
