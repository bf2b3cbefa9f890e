/* kv_lowbit.c: flushes and byte counts of the shared low-bit KV cache. */
#include "kv_lowbit.h"

void lowbit_flush(const skv_backend *be, const lowbit_cfg *q, int h, int d, float *K, float *V, int L, int *nq_k,
                  int *nq_v) {
    int kvd = h * d, R = q->residual, g = q->group, gv = g < d ? g : d;
    for (; *nq_k + R <= L; *nq_k += R)
        for (int c = 0; c < kvd; c++)
            for (int t = *nq_k; t < *nq_k + R; t += g)
                be->kivi(K + (size_t)t * kvd + c, g, kvd, q->bits, q->midpoint, K + (size_t)t * kvd + c, NULL, NULL,
                         NULL);
    int vq = L > R ? L - R : 0;
    for (; *nq_v < vq; (*nq_v)++)
        for (int kh = 0; kh < h; kh++)
            for (int j = 0; j < d; j += gv) {
                float *x = V + (size_t)*nq_v * kvd + (size_t)kh * d + j;
                be->kivi(x, j + gv <= d ? gv : d - j, 1, q->bits, q->midpoint, x, NULL, NULL, NULL);
            }
}

size_t lowbit_bytes(const lowbit_cfg *q, int h, int d, int L, int nq_k, int nq_v) {
    size_t kvd = (size_t)h * d, gv = (size_t)(q->group < d ? q->group : d), f = sizeof(float);
    size_t vgroups = (size_t)h * ((size_t)d + gv - 1) / gv;
    size_t codes = ((size_t)nq_k * kvd * q->bits + 7) / 8 + ((size_t)nq_v * kvd * q->bits + 7) / 8;
    size_t params = 2 * f * ((size_t)nq_k / q->group * kvd + (size_t)nq_v * vgroups);
    size_t fp = f * ((size_t)(L - nq_k) * kvd + (size_t)(L - nq_v) * kvd);
    return codes + params + fp;
}
