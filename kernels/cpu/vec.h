/* vec.h: small vector kernels (dot, axpy, scale) for the attention and
 * norm loops, with AVX2/FMA paths and portable fallbacks. */
#ifndef SKV_VEC_H
#define SKV_VEC_H

#include <stddef.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

static inline float vec_dot(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc0 = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    s = _mm_cvtss_f32(h);
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y += a * x */
static inline void vec_axpy(float *y, float a, const float *x, int n) {
    int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * x[i];
}

static inline void vec_scale(float *y, float a, int n) {
    for (int i = 0; i < n; i++) y[i] *= a;
}

#endif
