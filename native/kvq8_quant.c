/* Writing K and V into the q8 cache, as the engine does (article 9-1): one raw max|x| per
 * (token, kv head) row, codes floor(x * 127 / max + 0.5). The division is done in double so
 * that no finite float input, however large or tiny, overflows or leaves the int8 range;
 * for ordinary inputs the codes are those of the float formula. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "flash_attn_q8.h"

void kvq8_quantize_rows(const float *x, int n_rows, int hd, int x_stride,
    int8_t *codes, int code_stride, float *scales, int scale_stride)
{
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * x_stride;
        int8_t *cr = codes + (size_t)r * code_stride;
        float amax = 0.0f;
        for (int i = 0; i < hd; i++) amax = fmaxf(amax, fabsf(xr[i]));
        scales[(size_t)r * scale_stride] = amax;
        for (int i = 0; i < hd; i++)
            cr[i] = amax > 0.0f ? (int8_t)floor((double)xr[i] * 127.0 / (double)amax + 0.5) : 0;
    }
}
