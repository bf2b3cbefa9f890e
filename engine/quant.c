/* quant.c: ggml's tensor block formats on the CPU.
 *
 * Each supported type gets three things: a block dequantizer (the reference
 * for everything else), a row dot product against an fp32 vector (the decode
 * hot path, with AVX2/FMA/F16C kernels and a portable fallback that
 * dequantizes one block into a stack buffer), and, where cheap, a
 * round-to-nearest quantizer used by the GGUF writer.
 *
 * Block layouts, byte for byte as ggml stores them (fp16 = IEEE half, LE):
 *   q8_0  34 B / 32:  d fp16 | qs int8[32]                  w = d*q
 *   q4_0  18 B / 32:  d fp16 | qs u8[16]                    w = d*(nib-8)
 *         element j < 16 is the low nibble of qs[j], element j+16 the high one
 *   q5_0  22 B / 32:  d fp16 | qh u32 (LE) | qs u8[16]      w = d*((nib | hbit<<4)-16)
 *         nibbles as q4_0; bit j of qh is the fifth bit of element j
 *   q4_K 144 B / 256: d fp16 | dmin fp16 | scales u8[12] | qs u8[128]
 *         8 sub-blocks of 32 with 6-bit scale s and min m packed in scales[]:
 *         w = d*s*nib - dmin*m; each 32-byte run of qs holds two sub-blocks
 *         (low nibbles the first, high nibbles the second)
 *   q6_K 210 B / 256: ql u8[128] | qh u8[64] | scales int8[16] | d fp16
 *         16 sub-blocks of 16, w = d*scale*(q6-32); per 128-element half, ql
 *         holds low nibbles and qh the top two bits of four 32-element runs
 * Fields are read through memcpy, so blocks need no alignment. */
#include "quant.h"
#include "skv.h"

#include <math.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QUANT_AVX2 1
#endif

#define QK 32     /* elements per q8_0 / q4_0 / q5_0 block */
#define QK_K 256  /* elements per k-quant super-block */
#define Q8_0_BYTES 34
#define Q4_0_BYTES 18
#define Q5_0_BYTES 22
#define Q4_K_BYTES 144
#define Q6_K_BYTES 210

/* ---- scalar conversions ---- */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {  /* zero or subnormal: man * 2^-24, exact in fp32 */
        float v = (float)man * 0x1p-24f;
        return bits_f32(f32_bits(v) | sign);
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_fp16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u)  /* inf, or nan kept quiet with its top payload bits */
        return sign | 0x7c00 | (x > 0x7f800000u ? (uint16_t)(0x200 | ((x >> 13) & 0x3ff)) : 0);
    if (x >= 0x477ff000u) return sign | 0x7c00;  /* >= 65520 rounds to inf */
    if (x < 0x38800000u) {                         /* below 2^-14: fp16 subnormal or zero */
        if (x <= 0x33000000u) return sign;         /* <= 2^-25 rounds (ties to even) to 0 */
        uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;                  /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = (x >> 13) - (112u << 10), rem = x & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;  /* a carry into the exponent is right */
    return sign | (uint16_t)r;
}

float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);  /* quiet nan */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

static inline uint16_t ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline void st16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* fp16 scale of a block. */
static inline float h2f(const uint8_t *p) {
#ifdef QUANT_AVX2
    return _cvtsh_ss(ld16(p));
#else
    return fp16_to_f32(ld16(p));
#endif
}

int quant_supported(enum ggml_type t) {
    switch (t) {
    case GGML_F32: case GGML_F16: case GGML_BF16: case GGML_Q8_0:
    case GGML_Q4_0: case GGML_Q5_0: case GGML_Q4_K: case GGML_Q6_K: return 1;
    default: return 0;
    }
}

/* ---- block dequantizers (nb blocks from b into y) ---- */

static void dq_q8_0(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += Q8_0_BYTES, y += QK) {
        float d = h2f(b);
        const int8_t *q = (const int8_t *)(b + 2);
        for (int j = 0; j < QK; j++) y[j] = q[j] * d;
    }
}

static void dq_q4_0(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += Q4_0_BYTES, y += QK) {
        float d = h2f(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = ((qs[j] & 0xf) - 8) * d;
            y[j + QK / 2] = ((qs[j] >> 4) - 8) * d;
        }
    }
}

static void dq_q5_0(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += Q5_0_BYTES, y += QK) {
        float d = h2f(b);
        uint32_t qh = ld32(b + 2);
        const uint8_t *qs = b + 6;
        for (int j = 0; j < QK / 2; j++) {
            int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = (((qs[j] & 0xf) | h0) - 16) * d;
            y[j + QK / 2] = (((qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

/* 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes: sub-blocks
 * 0-3 keep theirs in the low 6 bits of bytes 0-3 (scale) and 4-7 (min);
 * sub-blocks 4-7 keep the low 4 bits in bytes 8-11 and the top 2 bits in the
 * spare top bits of bytes 0-7. */
static inline void k4_scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void dq_q4_K(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += Q4_K_BYTES) {
        float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t *sc = b + 4, *q = b + 16;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            int s1, m1, s2, m2;
            k4_scale_min(2 * c, sc, &s1, &m1);
            k4_scale_min(2 * c + 1, sc, &s2, &m2);
            float d1 = d * s1, o1 = dmin * m1, d2 = d * s2, o2 = dmin * m2;
            for (int l = 0; l < 32; l++) y[l] = d1 * (q[l] & 0xf) - o1;
            for (int l = 0; l < 32; l++) y[32 + l] = d2 * (q[l] >> 4) - o2;
        }
    }
}

static void dq_q6_K(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += Q6_K_BYTES) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = h2f(b + 208);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int g = l / 16;
                int q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[g] * q1;
                y[l + 32] = d * sc[g + 2] * q2;
                y[l + 64] = d * sc[g + 4] * q3;
                y[l + 96] = d * sc[g + 6] * q4;
            }
        }
    }
}

void quant_dequant_row(enum ggml_type t, const void *src, float *dst, size_t n) {
    const uint8_t *b = src;
    switch (t) {
    case GGML_F32: memcpy(dst, src, n * sizeof(float)); return;
    case GGML_F16: for (size_t i = 0; i < n; i++) dst[i] = fp16_to_f32(ld16(b + 2 * i)); return;
    case GGML_BF16: for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(ld16(b + 2 * i)); return;
    case GGML_Q8_0: SKV_ASSERT(n % QK == 0); dq_q8_0(b, dst, n / QK); return;
    case GGML_Q4_0: SKV_ASSERT(n % QK == 0); dq_q4_0(b, dst, n / QK); return;
    case GGML_Q5_0: SKV_ASSERT(n % QK == 0); dq_q5_0(b, dst, n / QK); return;
    case GGML_Q4_K: SKV_ASSERT(n % QK_K == 0); dq_q4_K(b, dst, n / QK_K); return;
    case GGML_Q6_K: SKV_ASSERT(n % QK_K == 0); dq_q6_K(b, dst, n / QK_K); return;
    default: SKV_ASSERT(quant_supported(t));
    }
}

void quant_dequant_rows(enum ggml_type t, const void *W, size_t n, size_t r0, size_t r1, float *dst) {
    size_t rs = ggml_row_size(t, n);
    SKV_ASSERT(rs != 0 && r0 <= r1 && quant_supported(t));
    long long nr = (long long)(r1 - r0);
#pragma omp parallel for schedule(static) if ((r1 - r0) * n >= 65536)
    for (long long i = 0; i < nr; i++)
        quant_dequant_row(t, (const uint8_t *)W + (r0 + (size_t)i) * rs, dst + (size_t)i * n, n);
}

/* ---- row dot products: sum_j w[j] * x[j] over one stored row ---- */

typedef float (*dot_fn)(const uint8_t *w, const float *x, size_t n);

#ifdef QUANT_AVX2

static inline float hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Low 8 int8 lanes of v as 8 floats. */
static inline __m256 i8x8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* sum_{j<16} q[j] * x[j] for 16 int8 lanes of q, as a vector of partial sums. */
static inline __m256 dot16(__m128i q, const float *x, __m256 acc) {
    acc = _mm256_fmadd_ps(i8x8_ps(q), _mm256_loadu_ps(x), acc);
    return _mm256_fmadd_ps(i8x8_ps(_mm_srli_si128(q, 8)), _mm256_loadu_ps(x + 8), acc);
}

static float dot_f32(const uint8_t *w8, const float *x, size_t n) {
    const float *w = (const float *)(const void *)w8;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) { float v; memcpy(&v, w8 + 4 * i, 4); s += v * x[i]; }
    return s;
}

static float dot_f16(const uint8_t *w, const float *x, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m128i *p = (const __m128i *)(const void *)(w + 2 * i);
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(p)), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(p + 1)), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(p + 2)), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(p + 3)), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(w + 2 * i))),
                             _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += fp16_to_f32(ld16(w + 2 * i)) * x[i];
    return s;
}

/* 8 bf16 values as 8 floats (a bf16 is the top half of an fp32). */
static inline __m256 bf16x8_ps(const uint8_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static float dot_bf16(const uint8_t *w, const float *x, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(bf16x8_ps(w + 2 * i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(bf16x8_ps(w + 2 * i + 16), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(bf16x8_ps(w + 2 * i + 32), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(bf16x8_ps(w + 2 * i + 48), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(bf16x8_ps(w + 2 * i), _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += bf16_to_f32(ld16(w + 2 * i)) * x[i];
    return s;
}

/* sum over one q8_0 block of q*x, unscaled. */
static inline __m256 q8_0_block(const uint8_t *b, const float *x) {
    __m128i q0 = _mm_loadu_si128((const __m128i *)(const void *)(b + 2));
    __m128i q1 = _mm_loadu_si128((const __m128i *)(const void *)(b + 18));
    return dot16(q1, x + 16, dot16(q0, x, _mm256_setzero_ps()));
}

static float dot_q8_0(const uint8_t *w, const float *x, size_t n) {
    size_t nb = n / QK, i = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (; i + 2 <= nb; i += 2, w += 2 * Q8_0_BYTES, x += 2 * QK) {
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w)), q8_0_block(w, x), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w + Q8_0_BYTES)), q8_0_block(w + Q8_0_BYTES, x + QK), a1);
    }
    if (i < nb) a0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w)), q8_0_block(w, x), a0);
    return hsum8(_mm256_add_ps(a0, a1));
}

/* sum over one q4_0 block of (nib-8)*x, unscaled. */
static inline __m256 q4_0_block(const uint8_t *b, const float *x) {
    const __m128i m4 = _mm_set1_epi8(0xf), k8 = _mm_set1_epi8(8);
    __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)(b + 2));
    __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m4), k8);
    __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), k8);
    return dot16(hi, x + 16, dot16(lo, x, _mm256_setzero_ps()));
}

static float dot_q4_0(const uint8_t *w, const float *x, size_t n) {
    size_t nb = n / QK, i = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (; i + 2 <= nb; i += 2, w += 2 * Q4_0_BYTES, x += 2 * QK) {
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w)), q4_0_block(w, x), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w + Q4_0_BYTES)), q4_0_block(w + Q4_0_BYTES, x + QK), a1);
    }
    if (i < nb) a0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w)), q4_0_block(w, x), a0);
    return hsum8(_mm256_add_ps(a0, a1));
}

/* 0x10 in byte i where bit i of the 16-bit mask is set. */
static inline __m128i bits_to_0x10(uint32_t bits16) {
    const __m128i spread = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m128i sel = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    __m128i v = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)bits16), spread);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, sel), sel), _mm_set1_epi8(0x10));
}

static inline __m256 q5_0_block(const uint8_t *b, const float *x) {
    const __m128i m4 = _mm_set1_epi8(0xf), k16 = _mm_set1_epi8(16);
    uint32_t qh = ld32(b + 2);
    __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)(b + 6));
    __m128i lo = _mm_or_si128(_mm_and_si128(raw, m4), bits_to_0x10(qh & 0xffff));
    __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), bits_to_0x10(qh >> 16));
    lo = _mm_sub_epi8(lo, k16);
    hi = _mm_sub_epi8(hi, k16);
    return dot16(hi, x + 16, dot16(lo, x, _mm256_setzero_ps()));
}

static float dot_q5_0(const uint8_t *w, const float *x, size_t n) {
    size_t nb = n / QK, i = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (; i + 2 <= nb; i += 2, w += 2 * Q5_0_BYTES, x += 2 * QK) {
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w)), q5_0_block(w, x), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w + Q5_0_BYTES)), q5_0_block(w + Q5_0_BYTES, x + QK), a1);
    }
    if (i < nb) a0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w)), q5_0_block(w, x), a0);
    return hsum8(_mm256_add_ps(a0, a1));
}

/* Sum of 32 floats as a vector of partial sums. */
static inline __m256 sum32(const float *x) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                         _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
}

/* Per sub-block of 32: d*s * sum(nib*x) - dmin*m * sum(x). */
static float dot_q4_K(const uint8_t *w, const float *x, size_t n) {
    const __m256i m4 = _mm256_set1_epi8(0xf);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (size_t i = 0; i < n / QK_K; i++, w += Q4_K_BYTES) {
        float d = h2f(w), dmin = h2f(w + 2);
        const uint8_t *sc = w + 4, *q = w + 16;
        for (int c = 0; c < 4; c++, q += 32, x += 64) {
            int s1, m1, s2, m2;
            k4_scale_min(2 * c, sc, &s1, &m1);
            k4_scale_min(2 * c + 1, sc, &s2, &m2);
            __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)q);
            __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            __m256 p1 = dot16(_mm256_castsi256_si128(lo), x, _mm256_setzero_ps());
            p1 = dot16(_mm256_extracti128_si256(lo, 1), x + 16, p1);
            __m256 p2 = dot16(_mm256_castsi256_si128(hi), x + 32, _mm256_setzero_ps());
            p2 = dot16(_mm256_extracti128_si256(hi, 1), x + 48, p2);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * s1), p1, acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * s2), p2, acc);
            accm = _mm256_fmadd_ps(_mm256_set1_ps(dmin * m1), sum32(x), accm);
            accm = _mm256_fmadd_ps(_mm256_set1_ps(dmin * m2), sum32(x + 32), accm);
        }
    }
    return hsum8(_mm256_sub_ps(acc, accm));
}

/* Per sub-block of 16: d*scale * sum((q6-32)*x). */
static float dot_q6_K(const uint8_t *w, const float *x, size_t n) {
    const __m256i m4 = _mm256_set1_epi8(0xf), m3 = _mm256_set1_epi8(3), m30 = _mm256_set1_epi8(0x30);
    const __m256i k32 = _mm256_set1_epi8(32);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (size_t i = 0; i < n / QK_K; i++, w += Q6_K_BYTES) {
        const uint8_t *ql = w, *qhp = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        float d = h2f(w + 208);
        for (int h = 0; h < 2; h++, ql += 64, qhp += 32, sc += 8, x += 128) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)qhp);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int k = 0; k < 4; k++) {
                __m256i v = _mm256_sub_epi8(q[k], k32);
                __m256 p0 = dot16(_mm256_castsi256_si128(v), x + 32 * k, _mm256_setzero_ps());
                __m256 p1 = dot16(_mm256_extracti128_si256(v, 1), x + 32 * k + 16, _mm256_setzero_ps());
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[2 * k]), p0, a0);
                a1 = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[2 * k + 1]), p1, a1);
            }
        }
    }
    return hsum8(_mm256_add_ps(a0, a1));
}

#else /* portable fallback */

static float dot_f32(const uint8_t *w, const float *x, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) { float v; memcpy(&v, w + 4 * i, 4); s += v * x[i]; }
    return s;
}

static float dot_f16(const uint8_t *w, const float *x, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += fp16_to_f32(ld16(w + 2 * i)) * x[i];
    return s;
}

static float dot_bf16(const uint8_t *w, const float *x, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += bf16_to_f32(ld16(w + 2 * i)) * x[i];
    return s;
}

/* Dot product one block at a time through a stack buffer. */
static float dot_blocks(void (*dq)(const uint8_t *, float *, size_t), size_t blck, size_t bytes,
                        const uint8_t *w, const float *x, size_t n) {
    float buf[QK_K]; /* (blck) */
    float s = 0;
    for (size_t i = 0; i < n / blck; i++, w += bytes, x += blck) {
        dq(w, buf, 1);
        float t = 0;
        for (size_t j = 0; j < blck; j++) t += buf[j] * x[j];
        s += t;
    }
    return s;
}

static float dot_q8_0(const uint8_t *w, const float *x, size_t n) { return dot_blocks(dq_q8_0, QK, Q8_0_BYTES, w, x, n); }
static float dot_q4_0(const uint8_t *w, const float *x, size_t n) { return dot_blocks(dq_q4_0, QK, Q4_0_BYTES, w, x, n); }
static float dot_q5_0(const uint8_t *w, const float *x, size_t n) { return dot_blocks(dq_q5_0, QK, Q5_0_BYTES, w, x, n); }
static float dot_q4_K(const uint8_t *w, const float *x, size_t n) { return dot_blocks(dq_q4_K, QK_K, Q4_K_BYTES, w, x, n); }
static float dot_q6_K(const uint8_t *w, const float *x, size_t n) { return dot_blocks(dq_q6_K, QK_K, Q6_K_BYTES, w, x, n); }

#endif

static dot_fn dot_for(enum ggml_type t) {
    switch (t) {
    case GGML_F32: return dot_f32;
    case GGML_F16: return dot_f16;
    case GGML_BF16: return dot_bf16;
    case GGML_Q8_0: return dot_q8_0;
    case GGML_Q4_0: return dot_q4_0;
    case GGML_Q5_0: return dot_q5_0;
    case GGML_Q4_K: return dot_q4_K;
    case GGML_Q6_K: return dot_q6_K;
    default: return NULL;
    }
}

float quant_dot(enum ggml_type t, const void *row, const float *x, size_t n) {
    dot_fn f = dot_for(t);
    SKV_ASSERT(f && ggml_row_size(t, n) != 0);
    return f(row, x, n);
}

void quant_matvec(enum ggml_type t, const void *W, size_t rows, size_t n, const float *x, float *y) {
    dot_fn f = dot_for(t);
    size_t rs = ggml_row_size(t, n);
    SKV_ASSERT(f && (rs != 0 || n == 0));
    const uint8_t *w = W;
    long long nr = (long long)rows;
    /* Small products are not worth waking the team for. */
#pragma omp parallel for schedule(static) if (rows * n >= 32768)
    for (long long r = 0; r < nr; r++) y[r] = f(w + (size_t)r * rs, x, n);
}

/* ---- quantizers (round to nearest, as ggml's reference ones) ---- */

/* v rounded to the nearest integer and clamped to [lo, hi]; nan gives 0 clamped. */
static inline int round_clamp(float v, int lo, int hi) {
    if (!(v == v)) v = 0;
    if (v <= (float)lo) return lo;
    if (v >= (float)hi) return hi;
    return (int)lrintf(v);
}

static void qz_q8_0(const float *x, uint8_t *b, size_t nb) {
    for (size_t i = 0; i < nb; i++, x += QK, b += Q8_0_BYTES) {
        float amax = 0;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        st16(b, f32_to_fp16(d));
        for (int j = 0; j < QK; j++) b[2 + j] = (uint8_t)(int8_t)round_clamp(roundf(x[j] * id), -127, 127);
    }
}

/* ggml's q4_0/q5_0 rule: the element of largest magnitude maps to -2^(bits-1)
 * exactly, the others to trunc(x/d + offset + 0.5) clamped to the top code. */
static inline int trunc_code(float v, int top) {
    if (v >= (float)top) return top;
    return v > 0 ? (int)v : 0;  /* nan lands here as 0 */
}

static float signed_absmax(const float *x, int n) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    return max;
}

static void qz_q4_0(const float *x, uint8_t *b, size_t nb) {
    for (size_t i = 0; i < nb; i++, x += QK, b += Q4_0_BYTES) {
        float d = signed_absmax(x, QK) / -8, id = d ? 1.0f / d : 0.0f;
        st16(b, f32_to_fp16(d));
        for (int j = 0; j < QK / 2; j++) {
            int q0 = trunc_code(x[j] * id + 8.5f, 15), q1 = trunc_code(x[j + QK / 2] * id + 8.5f, 15);
            b[2 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void qz_q5_0(const float *x, uint8_t *b, size_t nb) {
    for (size_t i = 0; i < nb; i++, x += QK, b += Q5_0_BYTES) {
        float d = signed_absmax(x, QK) / -16, id = d ? 1.0f / d : 0.0f;
        st16(b, f32_to_fp16(d));
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            int q0 = trunc_code(x[j] * id + 16.5f, 31), q1 = trunc_code(x[j + QK / 2] * id + 16.5f, 31);
            b[6 + j] = (uint8_t)((q0 & 0xf) | ((q1 & 0xf) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + 16);
        }
        memcpy(b + 2, &qh, 4);
    }
}

/* A plain min/max q4_K quantizer: per sub-block of 32, scale (max-min)/15 and
 * min -min (min clamped to <= 0), both requantized to 6 bits against the
 * super-block's fp16 d and dmin. Valid ggml data, though ggml's own search
 * for the best scales gives a smaller error. */
static void qz_q4_K(const float *x, uint8_t *b, size_t nb) {
    for (size_t i = 0; i < nb; i++, x += QK_K, b += Q4_K_BYTES) {
        float scale[8], minv[8], smax = 0, mmax = 0;
        for (int s = 0; s < 8; s++) {
            float lo = x[32 * s], hi = x[32 * s];
            for (int l = 1; l < 32; l++) { lo = fminf(lo, x[32 * s + l]); hi = fmaxf(hi, x[32 * s + l]); }
            if (lo > 0) lo = 0;
            if (!(hi == hi) || !(lo == lo)) hi = lo = 0;
            scale[s] = (hi - lo) / 15;
            minv[s] = -lo;
            smax = fmaxf(smax, scale[s]);
            mmax = fmaxf(mmax, minv[s]);
        }
        uint16_t dh = f32_to_fp16(smax / 63), mh = f32_to_fp16(mmax / 63);
        float d = fp16_to_f32(dh), dmin = fp16_to_f32(mh);
        int sc[8], mn[8];
        for (int s = 0; s < 8; s++) {
            sc[s] = d > 0 ? round_clamp(scale[s] / d, 0, 63) : 0;
            mn[s] = dmin > 0 ? round_clamp(minv[s] / dmin, 0, 63) : 0;
        }
        st16(b, dh);
        st16(b + 2, mh);
        uint8_t *p = b + 4;
        memset(p, 0, 12);
        for (int j = 0; j < 4; j++) {
            p[j] = (uint8_t)sc[j];
            p[j + 4] = (uint8_t)mn[j];
        }
        for (int j = 4; j < 8; j++) {
            p[j + 4] = (uint8_t)((sc[j] & 0xf) | ((mn[j] & 0xf) << 4));
            p[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            p[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
        uint8_t *q = b + 16;
        for (int c = 0; c < 4; c++, q += 32) {
            for (int half = 0; half < 2; half++) {
                int s = 2 * c + half;
                float ds = d * sc[s], off = dmin * mn[s];
                for (int l = 0; l < 32; l++) {
                    int v = ds > 0 ? round_clamp((x[32 * s + l] + off) / ds, 0, 15) : 0;
                    q[l] = half ? (uint8_t)(q[l] | (v << 4)) : (uint8_t)v;
                }
            }
        }
    }
}

/* A plain q6_K quantizer: per sub-block of 16, scale = signed absmax / -32,
 * scales requantized to int8 against the super-block's fp16 d, then each
 * element rounded to the nearest of the 64 codes. */
static void qz_q6_K(const float *x, uint8_t *b, size_t nb) {
    for (size_t i = 0; i < nb; i++, x += QK_K, b += Q6_K_BYTES) {
        float scale[16], smax = 0, samax = 0;
        for (int s = 0; s < 16; s++) {
            float m = signed_absmax(x + 16 * s, 16);
            scale[s] = m == m ? m / -32 : 0;
            if (fabsf(scale[s]) > samax) { samax = fabsf(scale[s]); smax = scale[s]; }
        }
        uint16_t dh = f32_to_fp16(smax / -128);
        float d = fp16_to_f32(dh);
        int8_t *sc = (int8_t *)(b + 192);
        uint8_t L[QK_K]; /* codes 0..63 */
        for (int s = 0; s < 16; s++) {
            sc[s] = (int8_t)(d != 0 ? round_clamp(scale[s] / d, -128, 127) : 0);
            float ds = d * sc[s];
            for (int l = 0; l < 16; l++)
                L[16 * s + l] = (uint8_t)(ds != 0 ? round_clamp(x[16 * s + l] / ds, -32, 31) + 32 : 32);
        }
        uint8_t *ql = b, *qh = b + 128;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
            const uint8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 0xf) | ((Lh[l + 64] & 0xf) << 4));
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xf) | ((Lh[l + 96] & 0xf) << 4));
                qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                  ((Lh[l + 96] >> 4) << 6));
            }
        }
        st16(b + 208, dh);
    }
}

int quant_quantize_row(enum ggml_type t, const float *src, void *dst, size_t n) {
    uint8_t *b = dst;
    if (quant_supported(t) && ggml_row_size(t, n) == 0 && n != 0)
        return skv_error(SKV_EINVAL, "quantize: %zu elements is not a multiple of the %s block size %u", n,
                         ggml_type_name(t), ggml_blck_size(t));
    switch (t) {
    case GGML_F32: memcpy(dst, src, n * sizeof(float)); return 0;
    case GGML_F16: for (size_t i = 0; i < n; i++) st16(b + 2 * i, f32_to_fp16(src[i])); return 0;
    case GGML_BF16: for (size_t i = 0; i < n; i++) st16(b + 2 * i, f32_to_bf16(src[i])); return 0;
    case GGML_Q8_0: qz_q8_0(src, b, n / QK); return 0;
    case GGML_Q4_0: qz_q4_0(src, b, n / QK); return 0;
    case GGML_Q5_0: qz_q5_0(src, b, n / QK); return 0;
    case GGML_Q4_K: qz_q4_K(src, b, n / QK_K); return 0;
    case GGML_Q6_K: qz_q6_K(src, b, n / QK_K); return 0;
    default:
        return skv_error(SKV_EUNSUPPORTED, "quantize: no quantizer for type %s", ggml_type_name(t));
    }
}
