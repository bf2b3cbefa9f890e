/* vec.h: small vector kernels (dot, axpy, scale) for the attention and
 * norm loops, with AVX2/FMA paths and portable fallbacks, and the IEEE
 * half-precision conversions of the f16 KV cache (F16C, or exact portable
 * code). */
#ifndef SKV_VEC_H
#define SKV_VEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"
#if (defined(__AVX2__) && defined(__FMA__)) || defined(__F16C__)
#include <immintrin.h>
#endif

/* ---- IEEE binary16 <-> binary32: F16C, or quant.h's exact portable
 * conversions (fp16_to_f32, f32_to_fp16: round to nearest even, the same
 * bits as F16C's vcvtps2ph) ---- */

/* n values of x into half precision y. */
static inline void vec_to_f16(uint16_t *y, const float *x, int n) {
    int i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) y[i] = f32_to_fp16(x[i]);
}

/* n half-precision values of x into y. */
static inline void vec_from_f16(float *y, const uint16_t *x, int n) {
    int i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#endif
    for (; i < n; i++) y[i] = fp16_to_f32(x[i]);
}

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

/* vec_dot with b in half precision: the same sums in the same order as
 * vec_dot over b's values widened to f32, so the same bits. */
static inline float vec_dot_h(const float *a, const uint16_t *b, int n) {
    int i = 0;
    float s = 0;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SKV_LOADH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), SKV_LOADH(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), SKV_LOADH(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), SKV_LOADH(b + i), acc0);
    acc0 = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    s = _mm_cvtss_f32(h);
    for (; i < n; i++) s += a[i] * fp16_to_f32(b[i]);
#else
    /* no F16C: widen and take vec_dot's path (the same bits) */
    float w[256];
    if (n <= 256) {
        vec_from_f16(w, b, n);
        return vec_dot(a, w, n);
    }
    for (; i < n; i++) s += a[i] * fp16_to_f32(b[i]);
#endif
    return s;
}

#if defined(__AVX2__) && defined(__FMA__)
/* The four sums of a, b, c and e's eight lanes, in that order. */
static inline __m128 vec_hsum4x8(__m256 a, __m256 b, __m256 c, __m256 e) {
    __m256 ab = _mm256_hadd_ps(a, b), ce = _mm256_hadd_ps(c, e);
    __m256 s = _mm256_hadd_ps(ab, ce);
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}
#endif

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

/* vec_axpy with x in half precision. */
static inline void vec_axpy_h(float *y, float a, const uint16_t *x, int n) {
    int i = 0;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, SKV_LOADH(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * fp16_to_f32(x[i]);
}

static inline void vec_scale(float *y, float a, int n) {
    for (int i = 0; i < n; i++) y[i] *= a;
}

#endif
