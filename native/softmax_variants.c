/* The three softmaxes of Milakov and Gimelshein, "Online normalizer calculation for softmax"
 * (2018), over a plain float array, so that lesson 05 can count their memory accesses per element
 * with the same model and simulation as the attention kernels:
 *   naive:  d = sum exp(x); y = exp(x) / d                   -> 2 loads + 1 store per element
 *   safe:   m = max x; d = sum exp(x - m); y = exp(x - m) / d -> 3 loads + 1 store
 *   online: m and d in one pass, rescaling d on a new max;
 *           y = exp(x - m) / d                                -> 2 loads + 1 store */
#include <math.h>

#include "flash_attn_q8.h"

void softmax_naive(const float *x, float *y, int n)
{
    float d = 0.0f;
    for (int i = 0; i < n; i++) d += expf(x[i]);
    for (int i = 0; i < n; i++) y[i] = expf(x[i]) / d;
}

void softmax_safe(const float *x, float *y, int n)
{
    float m = -INFINITY, d = 0.0f;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++) d += expf(x[i] - m);
    for (int i = 0; i < n; i++) y[i] = expf(x[i] - m) / d;
}

void softmax_online(const float *x, float *y, int n)
{
    float m = -INFINITY, d = 0.0f;
    for (int i = 0; i < n; i++) {
        float m_new = x[i] > m ? x[i] : m;
        d = d * expf(m - m_new) + expf(x[i] - m_new);
        m = m_new;
    }
    for (int i = 0; i < n; i++) y[i] = expf(x[i] - m) / d;
}
