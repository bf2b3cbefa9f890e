/* vec.h: small vector kernels (dot, axpy, scale) for the attention and
 * norm loops, with AVX2/FMA paths and portable fallbacks, and the IEEE
 * half-precision conversions of the f16 KV cache (F16C, or exact portable
 * code). */
#ifndef SKV_VEC_H
#define SKV_VEC_H

#include <stddef.h>
#include <stdint.h>
#include <math.h>
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

/* Asks the caches for the bytes [p, p+bytes), a line at a time, for data
 * about to be read at a random place (a hint: no value changes, and an
 * address past the data is harmless). */
static inline void vec_prefetch(const void *p, size_t bytes) {
    const char *a = (const char *)((uintptr_t)p & ~(uintptr_t)63), *e = (const char *)p + bytes;
    for (; a < e; a += 64) __builtin_prefetch(a, 0, 2);
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

/* vec_axpy with x in half precision. */
static inline void vec_axpy_h(float *y, float a, const uint16_t *x, int n) {
    int i = 0;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, SKV_LOADH(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * fp16_to_f32(x[i]);
}

/* exp(x) for x <= 0 (a softmax's x - max), into x, n values: 2^(x log2 e)
 * split into 2^k (built in the exponent bits) times 2^f, f in [-1/2, 1/2],
 * by a degree-6 polynomial; relative error about 2e-7, like expf's. Below
 * x = -87 the result is 0 (expf gives a denormal there; softmax weights that
 * small change nothing); a NaN stays NaN. Eight lanes at a time with AVX2, the same math
 * scalar otherwise: expf calls were a fifth of a 4K-token prefill. */
static inline float vec_exp2_poly(float f) {
    float p = 1.5353362e-4f;
    p = p * f + 1.3398874e-3f;
    p = p * f + 9.6181294e-3f;
    p = p * f + 5.5504109e-2f;
    p = p * f + 2.4022652e-1f;
    p = p * f + 6.9314718e-1f;
    return p * f + 1.0f;
}

static inline void vec_exp_nonpos(float *x, int n) {
    int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 log2e = _mm256_set1_ps(1.44269504f), lo = _mm256_set1_ps(-126.0f);
    const __m256 c6 = _mm256_set1_ps(1.5353362e-4f), c5 = _mm256_set1_ps(1.3398874e-3f), c4 = _mm256_set1_ps(9.6181294e-3f),
                 c3 = _mm256_set1_ps(5.5504109e-2f), c2 = _mm256_set1_ps(2.4022652e-1f), c1 = _mm256_set1_ps(6.9314718e-1f),
                 one = _mm256_set1_ps(1.0f);
    for (; j + 8 <= n; j += 8) {
        __m256 t = _mm256_mul_ps(_mm256_loadu_ps(x + j), log2e);
        __m256 under = _mm256_cmp_ps(t, lo, _CMP_LT_OQ);
        t = _mm256_max_ps(lo, t); /* lo first: a NaN score stays NaN, as expf would leave it */
        __m256 k = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 f = _mm256_sub_ps(t, k);
        __m256 p = _mm256_fmadd_ps(c6, f, c5);
        p = _mm256_fmadd_ps(p, f, c4);
        p = _mm256_fmadd_ps(p, f, c3);
        p = _mm256_fmadd_ps(p, f, c2);
        p = _mm256_fmadd_ps(p, f, c1);
        p = _mm256_fmadd_ps(p, f, one);
        __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
        __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
        _mm256_storeu_ps(x + j, _mm256_andnot_ps(under, r));
    }
#endif
    for (; j < n; j++) {
        float t = x[j] * 1.44269504f;
        if (!(t >= -126.0f)) { x[j] = t < -126.0f ? 0.0f : t; continue; } /* underflow to 0; NaN stays NaN */
        float k = rintf(t);
        int32_t bits = ((int32_t)k + 127) << 23;
        float scale;
        memcpy(&scale, &bits, sizeof scale);
        x[j] = vec_exp2_poly(t - k) * scale;
    }
}

/* The largest of x[0..n) (-inf for none; NaNs are passed over), eight
 * running maxima the compiler keeps in one vector register. */
static inline float vec_max(const float *x, int n) {
    float m8[8], mx = -INFINITY;
    for (int u = 0; u < 8; u++) m8[u] = -INFINITY;
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) m8[u] = x[j + u] > m8[u] ? x[j + u] : m8[u];
    for (int u = 0; u < 8; u++) mx = m8[u] > mx ? m8[u] : mx;
    for (; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* The sum of x[0..n) in eight running sums (independent chains), added
 * lane by lane, then the tail. */
static inline float vec_sum(const float *x, int n) {
    float s8[8] = {0}, sum = 0;
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) s8[u] += x[j + u];
    for (int u = 0; u < 8; u++) sum += s8[u];
    for (; j < n; j++) sum += x[j];
    return sum;
}

static inline void vec_scale(float *y, float a, int n) {
    for (int i = 0; i < n; i++) y[i] *= a;
}

#endif
