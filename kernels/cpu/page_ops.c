/* page_ops.c: page bounds and their q·k upper bound (page_ops.h). */
#include "page_ops.h"

void page_bounds(const float *K, int stride, int d, int p, int t0, int n, float *mn, float *mx, int bstride) {
    for (int t = t0; t < t0 + n; t++) {
        const float *k = K + (long)t * stride;
        float *lo = mn + (long)(t / p) * bstride, *hi = mx + (long)(t / p) * bstride;
        if (t % p == 0)
            for (int c = 0; c < d; c++) lo[c] = hi[c] = k[c];
        else
            for (int c = 0; c < d; c++) {
                if (k[c] < lo[c]) lo[c] = k[c];
                if (k[c] > hi[c]) hi[c] = k[c];
            }
    }
}

void page_score(const float *q, int d, const float *mn, const float *mx, int bstride, int n_pages, float *U) {
    for (int j = 0; j < n_pages; j++) {
        const float *lo = mn + (long)j * bstride, *hi = mx + (long)j * bstride;
        float s = 0;
        for (int c = 0; c < d; c++) {
            float a = q[c] * lo[c], b = q[c] * hi[c];
            s += a > b ? a : b;
        }
        U[j] = s;
    }
}
