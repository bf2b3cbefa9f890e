/* kivi.c: one group of the KIVI min-max quantizer (kivi.h). */
#include "kivi.h"

#include <math.h>

void kivi_group(const float *x, int n, int stride, int bits, int midpoint, float *y, uint8_t *codes, float *scale,
                float *zero) {
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++) {
        float v = x[(long)i * stride];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    int top = (1 << bits) - 1;
    float s, z;
    if (midpoint && bits == 1) {
        z = (3 * lo + hi) / 4;
        s = (hi - lo) / 2;
    } else {
        z = lo;
        s = (hi - lo) / top;
    }
    for (int i = 0; i < n; i++) {
        float v = x[(long)i * stride];
        int q = 0;
        if (s > 0) {
            float r = nearbyintf((v - z) / s);
            q = r < 0 ? 0 : r > top ? top : (int)r;
        }
        if (codes) codes[i] = (uint8_t)q;
        y[(long)i * stride] = hi == lo ? lo : z + (float)q * s;
    }
    if (scale) *scale = s;
    if (zero) *zero = z;
}
