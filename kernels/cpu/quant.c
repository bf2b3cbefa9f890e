/* quant.c: ggml's tensor block formats on the CPU.
 *
 * Each supported type gets a block dequantizer (the reference for everything
 * else, and what prefill feeds to its GEMMs), a matrix-vector product (the
 * decode hot path) and, where cheap, a round-to-nearest quantizer used by the
 * GGUF writer. The matvec keeps x in fp32 for f32/f16/bf16 rows; for the
 * quantized types it first quantizes x to 8-bit blocks, as llama.cpp does,
 * and multiplies codes in integers (AVX2 maddubs or AVX-VNNI/AVX512-VNNI
 * dpbusd), with scalar kernels that give the same bits on any machine.
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

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QUANT_AVX2 1
#endif

#define QK GGML_QK
#define QK_K GGML_QK_K
#define Q8_0_BYTES GGML_Q8_0_BYTES
#define Q4_0_BYTES GGML_Q4_0_BYTES
#define Q5_0_BYTES GGML_Q5_0_BYTES
#define Q4_K_BYTES GGML_Q4_K_BYTES
#define Q6_K_BYTES GGML_Q6_K_BYTES

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

void quant_kblock(enum ggml_type t, const uint8_t *sb, int j, int8_t *q, float *d, float *mn) {
    if (t == GGML_Q4_K) {
        int sc, m;
        k4_scale_min(j, sb + 4, &sc, &m);
        const uint8_t *qs = sb + 16 + 32 * (j / 2);
        for (int l = 0; l < QK; l++) q[l] = (int8_t)(j & 1 ? qs[l] >> 4 : qs[l] & 0xf);
        d[0] = h2f(sb) * (float)sc;
        *mn = h2f(sb + 2) * (float)m;
        return;
    }
    SKV_ASSERT(t == GGML_Q6_K);
    /* run k of half h holds sub-blocks 8h+2k and 8h+2k+1 of 16 */
    int h = j / 4, k = j % 4;
    const uint8_t *ql = sb + 64 * h, *qh = sb + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(sb + 192);
    for (int l = 0; l < QK; l++) {
        int lo = k & 1 ? ql[l + 32] : ql[l];
        lo = k & 2 ? lo >> 4 : lo & 0xf;
        q[l] = (int8_t)((lo | (((qh[l] >> (2 * k)) & 3) << 4)) - 32);
    }
    float dd = h2f(sb + 208);
    d[0] = dd * (float)sc[8 * h + 2 * k];
    d[1] = dd * (float)sc[8 * h + 2 * k + 1];
    *mn = 0;
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

/* ---- fp rows: sum_j w[j] * x[j] with x in fp32 ---- */

typedef float (*dot_fn)(const uint8_t *w, const float *x, size_t n);

/* The scalar versions: the portable path and quant_matvec_ref's. */
static float ref_dot_f32(const uint8_t *w, const float *x, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) { float v; memcpy(&v, w + 4 * i, 4); s += v * x[i]; }
    return s;
}

static float ref_dot_f16(const uint8_t *w, const float *x, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += fp16_to_f32(ld16(w + 2 * i)) * x[i];
    return s;
}

static float ref_dot_bf16(const uint8_t *w, const float *x, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += bf16_to_f32(ld16(w + 2 * i)) * x[i];
    return s;
}

#ifdef QUANT_AVX2

static inline float hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
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

#endif

static dot_fn dot_for(enum ggml_type t, int ref) {
#ifdef QUANT_AVX2
    if (!ref) switch (t) {
        case GGML_F32: return dot_f32;
        case GGML_F16: return dot_f16;
        case GGML_BF16: return dot_bf16;
        default: return NULL;
        }
#endif
    (void)ref;
    switch (t) {
    case GGML_F32: return ref_dot_f32;
    case GGML_F16: return ref_dot_f16;
    case GGML_BF16: return ref_dot_bf16;
    default: return NULL;
    }
}

/* ---- quantized rows against 8-bit activations ----
 *
 * For q8_0, q4_0, q5_0, q4_K and q6_K, x is first quantized to blocks of 32
 * int8 codes q = round(x * 127/amax) with a scale dx = amax/127 (rounded to
 * fp16 when it fits, as llama.cpp stores it); each
 * 32-element run of a weight row then meets one x block in integer
 * arithmetic. Every kernel gives the same bits, in this order: lane l (0..7)
 * of x block b is the exact integer sum_{k<4} w[4l+k] * q[4l+k] (w the signed
 * weight code), converted to float and fused-multiply-added with its scale
 * (weight scale * dx) into accumulator set b % 4; the result is the lane-wise
 * sum (set0 + set2) + (set1 + set3) summed across lanes as
 * ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)). q4_K subtracts its min term,
 * kept per sub-block j in lane j (fma of the x block's code sum with
 * (dmin*m)*dx) and summed across lanes the same way.
 *
 * The ref_ kernels spell this out one element at a time. The AVX2 kernels
 * form lanes with maddubs + madd (VNNI: dpbusd) on |w| and sign(w)*q; the
 * AVX-512 ones take two x blocks per instruction, with unsigned codes
 * u = w + off (q8_0 flips the sign bit) against q, starting dpbusd from
 * -off * (sum of the lane's four q), which x's quantization stores. */

/* A quantized activation vector of n elements (n a multiple of 32). */
typedef struct {
    int8_t *q;    /* (n) codes in [-127, 127], 64-byte aligned */
    float *d;     /* (n/32) block scales dx */
    int32_t *s;   /* (n/32) block sums of q (q4_K's mins) */
    int32_t *lo;  /* (n/4) -off * sum of each lane's 4 codes, 64-byte aligned (AVX-512 kernels) */
} xq8;

/* Activations up to this many elements are quantized into a stack buffer. */
#define XQ_STACK 8192

/* Scale of an x block from its largest magnitude: sets *d and returns the
 * inverse 127/amax, or returns 0 (codes all zero) with *d = 0 for a zero or
 * vanishing block and *d = nan for one holding an inf or nan, so that the
 * products come out nan as an fp32 dot product would. */
static inline float xq_scale(float amax, int nonfinite, float *d) {
    float id = 127.0f / amax;
    if (nonfinite || !(id <= FLT_MAX)) {
        *d = nonfinite ? NAN : 0.0f;
        return 0;
    }
    /* The block scale is stored rounded to fp16, as llama.cpp keeps it, when
     * it fits; the codes still come from the exact inverse. */
    float dd = amax / 127.0f;
    *d = dd <= 65504.0f ? fp16_to_f32(f32_to_fp16(dd)) : dd;
    return id;
}

/* Quantizes the 32 values of one x block: codes q, scale *d, code sum *s. */
static void ref_xq_block(const float *x, int8_t *q, float *d, int32_t *s) {
    float amax = 0;
    int bad = 0;
    for (int j = 0; j < QK; j++) {
        float a = fabsf(x[j]);
        bad |= !(a <= FLT_MAX);
        if (a > amax) amax = a;
    }
    float id = xq_scale(amax, bad, d);
    int sum = 0;
    for (int j = 0; j < QK; j++) {
        int v = id != 0 ? (int)lrintf(x[j] * id) : 0;  /* nearest even, as cvtps2dq */
        q[j] = (int8_t)v;
        sum += v;
    }
    *s = sum;
}

/* The lanes of one x block: acc[l] += float(sum_{k<4} w[4l+k] * q[4l+k]) * s,
 * fused, with s = s0 for lanes 0-3 and s1 for lanes 4-7. */
static void ref_lanes(float acc[8], const int8_t *w, const int8_t *q, float s0, float s1) {
    for (int l = 0; l < 8; l++) {
        int32_t L = 0;
        for (int k = 0; k < 4; k++) L += w[4 * l + k] * q[4 * l + k];
        acc[l] = fmaf((float)L, l < 4 ? s0 : s1, acc[l]);
    }
}

/* Eight lanes summed in the order of hsum8. */
static float ref_hsum8(const float v[8]) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

/* The four accumulator sets summed in the order of the vector kernels. */
static float ref_lanes_sum(float acc[4][8]) {
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    return ref_hsum8(v);
}

static float ref_qdot_q8_0(const uint8_t *w, const xq8 *x, size_t n) {
    float acc[4][8] = {{0}};
    for (size_t i = 0; i < n / QK; i++, w += Q8_0_BYTES) {
        float s = h2f(w) * x->d[i];
        ref_lanes(acc[i & 3], (const int8_t *)(w + 2), x->q + QK * i, s, s);
    }
    return ref_lanes_sum(acc);
}

static float ref_qdot_q4_0(const uint8_t *w, const xq8 *x, size_t n) {
    float acc[4][8] = {{0}};
    for (size_t i = 0; i < n / QK; i++, w += Q4_0_BYTES) {
        int8_t v[QK];
        for (int j = 0; j < QK / 2; j++) {
            v[j] = (int8_t)((w[2 + j] & 0xf) - 8);
            v[j + QK / 2] = (int8_t)((w[2 + j] >> 4) - 8);
        }
        float s = h2f(w) * x->d[i];
        ref_lanes(acc[i & 3], v, x->q + QK * i, s, s);
    }
    return ref_lanes_sum(acc);
}

static float ref_qdot_q5_0(const uint8_t *w, const xq8 *x, size_t n) {
    float acc[4][8] = {{0}};
    for (size_t i = 0; i < n / QK; i++, w += Q5_0_BYTES) {
        uint32_t qh = ld32(w + 2);
        int8_t v[QK];
        for (int j = 0; j < QK / 2; j++) {
            v[j] = (int8_t)(((w[6 + j] & 0xf) | (((qh >> j) & 1) << 4)) - 16);
            v[j + QK / 2] = (int8_t)(((w[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
        }
        float s = h2f(w) * x->d[i];
        ref_lanes(acc[i & 3], v, x->q + QK * i, s, s);
    }
    return ref_lanes_sum(acc);
}

/* Sub-block j of 32 (x block 8i+j): scale (d*sc)*dx on the nibbles; the min
 * term (dmin*m)*dx times the x block's code sum goes to lane j of accm. */
static float ref_qdot_q4_K(const uint8_t *w, const xq8 *x, size_t n) {
    float acc[4][8] = {{0}}, accm[8] = {0};
    for (size_t i = 0; i < n / QK_K; i++, w += Q4_K_BYTES) {
        for (int j = 0; j < 8; j++) {
            size_t b = 8 * i + (size_t)j;
            int8_t v[QK];
            float dq, mn;
            quant_kblock(GGML_Q4_K, w, j, v, &dq, &mn);
            float s = dq * x->d[b];
            ref_lanes(acc[j & 3], v, x->q + QK * b, s, s);
            accm[j] = fmaf((float)x->s[b], mn * x->d[b], accm[j]);
        }
    }
    return ref_lanes_sum(acc) - ref_hsum8(accm);
}

/* Run k of half h (x block 8i+4h+k) holds sub-blocks 8h+2k and 8h+2k+1 of
 * 16, so lanes 0-3 and 4-7 take different scales. */
static float ref_qdot_q6_K(const uint8_t *w, const xq8 *x, size_t n) {
    float acc[4][8] = {{0}};
    for (size_t i = 0; i < n / QK_K; i++, w += Q6_K_BYTES) {
        for (int j = 0; j < 8; j++) {
            size_t b = 8 * i + (size_t)j;
            int8_t v[QK];
            float dq[2], mn;
            quant_kblock(GGML_Q6_K, w, j, v, dq, &mn);
            ref_lanes(acc[j % 4], v, x->q + QK * b, dq[0] * x->d[b], dq[1] * x->d[b]);
        }
    }
    return ref_lanes_sum(acc);
}

#ifdef QUANT_AVX2

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define QUANT_VNNI 1
static inline __m256i dpbusd8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#elif defined(__AVXVNNI__)
#define QUANT_VNNI 1
static inline __m256i dpbusd8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#define QUANT_AVX512 1
#endif

/* ref_xq_block's codes, and for the AVX-512 kernels the lane offsets
 * lo[l] = -(sum of lane l's codes) << sh (sh < 0: none). */
static void xq_block(const float *x, int8_t *q, float *d, int32_t *s, int32_t *lo, int sh) {
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    __m256 v[4], m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        __m256 a = _mm256_andnot_ps(sign, v[k]);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));
        m = _mm256_max_ps(m, a);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float id = xq_scale(_mm_cvtss_f32(h), _mm256_movemask_ps(bad) != 0, d);
    __m256i p = _mm256_setzero_si256();
    *s = 0;
    if (id != 0) {
        __m256 iv = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], iv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], iv));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], iv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], iv));
        __m256i t = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
        t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4e));
        t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1));
        *s = _mm_cvtsi128_si32(t4);
        /* The packs interleave 4-byte groups across the 128-bit halves; put them back. */
        p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    }
    _mm256_store_si256((__m256i *)(void *)q, p);
    if (sh >= 0) {
        __m256i l4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
        l4 = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_sll_epi32(l4, _mm_cvtsi32_si128(sh)));
        _mm256_store_si256((__m256i *)(void *)lo, l4);
    }
}

/* The 8 lanes sum_{k<4} u[4l+k] * s[4l+k] for unsigned u (at most 128) and
 * signed s, exact: neither pair sum can saturate maddubs' int16. */
static inline __m256i lanes_us(__m256i u, __m256i s) {
#ifdef QUANT_VNNI
    return dpbusd8(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* The same for signed w: |w| (128 for -128, read unsigned) times sign(w)*q. */
static inline __m256i lanes_ss(__m256i w, __m256i q) {
    return lanes_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w));
}

/* acc + float(lanes) * s, fused. */
static inline __m256 lanes_fma(__m256 acc, __m256i lanes, __m256 s) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), s, acc);
}

static inline __m256i ld256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline __m128i ld128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }
static inline __m256i xq256(const int8_t *q) { return _mm256_load_si256((const __m256i *)(const void *)q); }

/* ((v0+v2) + (v1+v3)) then across lanes: the result of the four sets. */
static inline float sets_sum(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    return hsum8(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)));
}

/* 8 unsigned bytes (a little-endian u64) as 8 floats. */
static inline __m256 u8x8_ps(uint64_t v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v)));
}

/* q4_K's 8 scales and 8 mins (6 bits each, see k4_scale_min) as the bytes
 * of two u64, unpacked four at a time from the 12 packed bytes. */
static inline void k4_unpack(const uint8_t *p, uint64_t *sc, uint64_t *mn) {
    uint32_t u0 = ld32(p), u1 = ld32(p + 4), u2 = ld32(p + 8);
    *sc = (u0 & 0x3f3f3f3fu) | (uint64_t)((u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u)) << 32;
    *mn = (u1 & 0x3f3f3f3fu) | (uint64_t)(((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u)) << 32;
}

/* 32 signed weights of a q8_0, q4_0 or q5_0 block in element order. */
static inline __m256i w_q8_0(const uint8_t *b) { return ld256(b + 2); }

static inline __m256i w_q4_0(const uint8_t *b) {
    __m128i raw = ld128(b + 2);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_sub_epi8(_mm256_and_si256(v, _mm256_set1_epi8(0xf)), _mm256_set1_epi8(8));
}

static inline __m256i w_q5_0(const uint8_t *b) {
    /* byte j gets byte j/8 of qh, then 0x10 where bit j%8 of it is set */
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x(0x8040201008040201ll);
    __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)ld32(b + 2)), spread);
    hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, sel), sel), _mm256_set1_epi8(0x10));
    __m128i raw = ld128(b + 6);
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0xf));
    return _mm256_sub_epi8(_mm256_or_si256(v, hb), _mm256_set1_epi8(16));
}

#ifdef QUANT_AVX512

static inline __m512i ld512(const void *p) { return _mm512_loadu_si512(p); }
static inline __m512i xq512(const void *p) { return _mm512_load_si512(p); }

/* acc + float(lanes) * s over two x blocks, fused. */
static inline __m512 lanes_fma2(__m512 acc, __m512i lanes, __m512 s) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), s, acc);
}

/* Lanes 0-7 take element j of v, lanes 8-15 element j+1. */
static inline __m512i pair_index(int j) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(j)), _mm256_set1_epi32(j + 1), 1);
}

/* The low nibbles of 32 bytes at q in the lower half, their high nibbles in
 * the upper half (q4_K's two sub-blocks of a 32-byte run). */
static inline __m512i nib_pair(const uint8_t *q) {
    __m512i r = _mm512_broadcast_i64x4(ld256(q));
    return _mm512_and_si512(_mm512_mask_srli_epi16(r, 0xffff0000u, r, 4), _mm512_set1_epi8(0xf));
}

/* Unsigned codes u = w + off of two consecutive blocks. */
static inline __m512i u2_q8_0(const uint8_t *b) {
    __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(ld256(b + 2)), ld256(b + 2 + Q8_0_BYTES), 1);
    return _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
}

/* [qs0, qs0 >> 4, qs1, qs1 >> 4] by 128-bit lane, masked to nibbles. */
static inline __m512i nib2(const uint8_t *qs0, const uint8_t *qs1) {
    __m512i r = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(ld128(qs0))),
                                   _mm256_broadcastsi128_si256(ld128(qs1)), 1);
    r = _mm512_mask_srli_epi16(r, 0xff00ff00u, r, 4);
    return _mm512_and_si512(r, _mm512_set1_epi8(0xf));
}

static inline __m512i u2_q4_0(const uint8_t *b) { return nib2(b + 2, b + 2 + Q4_0_BYTES); }

static inline __m512i u2_q5_0(const uint8_t *b) {
    __m512i u = nib2(b + 6, b + 6 + Q5_0_BYTES);
    __mmask64 hb = (__mmask64)ld32(b + 2) | (__mmask64)ld32(b + 2 + Q5_0_BYTES) << 32;
    return _mm512_mask_add_epi8(u, hb, u, _mm512_set1_epi8(16));
}

/* Where the fp16 scales of 8 consecutive blocks of b bytes lie, for one or
 * two vpermi2b: bytes 0-127 of the group (mask bits clear) or the 128-byte
 * window starting at SC_BASE2 (mask bits set), which stays inside the group. */
#define SC_BASE2(b) (8 * (b) - 128 < 128 ? 8 * (b) - 128 : 128)
#define SC_OFF(b, k, e) ((k) * (b) + 1 < 128 ? (k) * (b) + (e) : (k) * (b) + (e) - SC_BASE2(b))
#define SC_IDX(b, k) (char)SC_OFF(b, k, 0), (char)SC_OFF(b, k, 1)
#define SC_TABLE(b) {SC_IDX(b, 0), SC_IDX(b, 1), SC_IDX(b, 2), SC_IDX(b, 3), \
                     SC_IDX(b, 4), SC_IDX(b, 5), SC_IDX(b, 6), SC_IDX(b, 7)}
#define SC_HI(b, k) ((k) * (b) + 1 < 128 ? 0ull : 3ull << (2 * (k)))
#define SC_MASK(b) (SC_HI(b, 0) | SC_HI(b, 1) | SC_HI(b, 2) | SC_HI(b, 3) | \
                    SC_HI(b, 4) | SC_HI(b, 5) | SC_HI(b, 6) | SC_HI(b, 7))

_Alignas(64) static const char sc_q8_0[64] = SC_TABLE(Q8_0_BYTES);
_Alignas(64) static const char sc_q4_0[64] = SC_TABLE(Q4_0_BYTES);
_Alignas(64) static const char sc_q5_0[64] = SC_TABLE(Q5_0_BYTES);

/* The 8 fp16 block scales at offset 0 of 8 blocks of `bytes` from w, as floats. */
static inline __attribute__((always_inline)) __m256 scales8(const uint8_t *w, size_t bytes, const char *tab,
                                                            uint64_t hi) {
#ifdef __AVX512VBMI__
    __m512i t = _mm512_load_si512((const void *)tab);
    __m512i r = _mm512_maskz_permutex2var_epi8(~hi, ld512(w), t, ld512(w + 64));
    if (hi) {
        const uint8_t *b2 = w + SC_BASE2(bytes);
        r = _mm512_or_si512(r, _mm512_maskz_permutex2var_epi8(hi, ld512(b2), t, ld512(b2 + 64)));
    }
    return _mm256_cvtph_ps(_mm512_castsi512_si128(r));
#else
    (void)tab;
    (void)hi;
    return _mm256_cvtph_ps(_mm_setr_epi16((short)ld16(w), (short)ld16(w + bytes), (short)ld16(w + 2 * bytes),
                                          (short)ld16(w + 3 * bytes), (short)ld16(w + 4 * bytes),
                                          (short)ld16(w + 5 * bytes), (short)ld16(w + 6 * bytes),
                                          (short)ld16(w + 7 * bytes)));
#endif
}

typedef __m512i (*wload2_fn)(const uint8_t *);
#else
typedef const void *wload2_fn;
#endif

/* Kernel shared by the 32-element block types: loaders wl (one block of
 * signed codes) and u2 (two blocks of unsigned ones, AVX-512), block size
 * bytes, fp16 scale first, scale table tab/hi. Inlined into each caller so the
 * loaders are direct calls. With AVX-512 whole groups of 8 blocks go two at a
 * time into zmm accumulators holding sets (0,1) and (2,3); the rest one at a
 * time through ymm. */
static inline __attribute__((always_inline)) float qdot_blocks32(const uint8_t *w, const xq8 *x, size_t n,
                                                                 size_t bytes, __m256i (*wl)(const uint8_t *),
                                                                 wload2_fn u2, const char *tab, uint64_t hi) {
    size_t nb = n / QK, i = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#ifdef QUANT_AVX512
    __m512 A = _mm512_setzero_ps(), B = A;
    const __m512i p0 = pair_index(0), p1 = pair_index(2), p2 = pair_index(4), p3 = pair_index(6);
    for (; i + 8 <= nb; i += 8, w += 8 * bytes) {
        __m512 s = _mm512_castps256_ps512(_mm256_mul_ps(scales8(w, bytes, tab, hi), _mm256_loadu_ps(x->d + i)));
#define QPAIR(acc, k, idx) \
    acc = lanes_fma2(acc, _mm512_dpbusd_epi32(xq512(x->lo + 8 * (i + 2 * (k))), u2(w + 2 * (k) * bytes), \
                                              xq512(x->q + QK * (i + 2 * (k)))), \
                     _mm512_permutexvar_ps(idx, s))
        QPAIR(A, 0, p0);
        QPAIR(B, 1, p1);
        QPAIR(A, 2, p2);
        QPAIR(B, 3, p3);
#undef QPAIR
    }
    a0 = _mm512_castps512_ps256(A);
    a1 = _mm512_extractf32x8_ps(A, 1);
    a2 = _mm512_castps512_ps256(B);
    a3 = _mm512_extractf32x8_ps(B, 1);
#else
    (void)u2;
    (void)tab;
    (void)hi;
#endif
#define QBLOCK(acc, k) \
    acc = lanes_fma(acc, lanes_ss(wl(w + (k) * bytes), xq256(x->q + QK * (i + (k)))), \
                    _mm256_set1_ps(h2f(w + (k) * bytes) * x->d[i + (k)]))
    for (; i + 4 <= nb; i += 4, w += 4 * bytes) {
        QBLOCK(a0, 0);
        QBLOCK(a1, 1);
        QBLOCK(a2, 2);
        QBLOCK(a3, 3);
    }
    if (i < nb) QBLOCK(a0, 0);
    if (i + 1 < nb) QBLOCK(a1, 1);
    if (i + 2 < nb) QBLOCK(a2, 2);
#undef QBLOCK
    return sets_sum(a0, a1, a2, a3);
}

#ifdef QUANT_AVX512
#define QDOT32(T, B) qdot_blocks32(w, x, n, B, w_##T, u2_##T, sc_##T, SC_MASK(B))
#else
#define QDOT32(T, B) qdot_blocks32(w, x, n, B, w_##T, NULL, NULL, 0)
#endif
static float qdot_q8_0(const uint8_t *w, const xq8 *x, size_t n) { return QDOT32(q8_0, Q8_0_BYTES); }
static float qdot_q4_0(const uint8_t *w, const xq8 *x, size_t n) { return QDOT32(q4_0, Q4_0_BYTES); }
static float qdot_q5_0(const uint8_t *w, const xq8 *x, size_t n) { return QDOT32(q5_0, Q5_0_BYTES); }
#undef QDOT32

#ifndef QUANT_AVX512
/* Two activation vectors against one weight row (quant_matvec_rows): each
 * block's codes, their magnitudes and its scale are loaded once for both,
 * and each dot keeps qdot_blocks32's four sets in its order, so *y0 and *y1
 * are bit for bit what two calls would give. (The AVX-512 kernel orders its
 * sums otherwise; there the rows go one at a time.) */
static inline __attribute__((always_inline)) void qdot2_blocks32(const uint8_t *w, const xq8 *x0, const xq8 *x1,
                                                                 size_t n, size_t bytes,
                                                                 __m256i (*wl)(const uint8_t *), float *y0,
                                                                 float *y1) {
    size_t nb = n / QK, i = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
#define QBLOCK2(acc, bcc, k)                                                                                     \
    do {                                                                                                         \
        __m256i wv = wl(w + (k) * bytes), aw = _mm256_sign_epi8(wv, wv);                                         \
        float wd = h2f(w + (k) * bytes);                                                                         \
        acc = lanes_fma(acc, lanes_us(aw, _mm256_sign_epi8(xq256(x0->q + QK * (i + (k))), wv)),                  \
                        _mm256_set1_ps(wd * x0->d[i + (k)]));                                                    \
        bcc = lanes_fma(bcc, lanes_us(aw, _mm256_sign_epi8(xq256(x1->q + QK * (i + (k))), wv)),                  \
                        _mm256_set1_ps(wd * x1->d[i + (k)]));                                                    \
    } while (0)
    for (; i + 4 <= nb; i += 4, w += 4 * bytes) {
        QBLOCK2(a0, b0, 0);
        QBLOCK2(a1, b1, 1);
        QBLOCK2(a2, b2, 2);
        QBLOCK2(a3, b3, 3);
    }
    if (i < nb) QBLOCK2(a0, b0, 0);
    if (i + 1 < nb) QBLOCK2(a1, b1, 1);
    if (i + 2 < nb) QBLOCK2(a2, b2, 2);
#undef QBLOCK2
    *y0 = sets_sum(a0, a1, a2, a3);
    *y1 = sets_sum(b0, b1, b2, b3);
}

typedef void (*qdot2_fn)(const uint8_t *w, const xq8 *x0, const xq8 *x1, size_t n, float *y0, float *y1);
static void qdot2_q8_0(const uint8_t *w, const xq8 *x0, const xq8 *x1, size_t n, float *y0, float *y1) {
    qdot2_blocks32(w, x0, x1, n, Q8_0_BYTES, w_q8_0, y0, y1);
}
static void qdot2_q4_0(const uint8_t *w, const xq8 *x0, const xq8 *x1, size_t n, float *y0, float *y1) {
    qdot2_blocks32(w, x0, x1, n, Q4_0_BYTES, w_q4_0, y0, y1);
}
static void qdot2_q5_0(const uint8_t *w, const xq8 *x0, const xq8 *x1, size_t n, float *y0, float *y1) {
    qdot2_blocks32(w, x0, x1, n, Q5_0_BYTES, w_q5_0, y0, y1);
}
#define HAVE_QDOT2 1
#endif

static float qdot_q4_K(const uint8_t *w, const xq8 *x, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, am = a0;
    const int8_t *xq = x->q;
    const float *xd = x->d;
    const int32_t *xs = x->s;
#ifdef QUANT_AVX512
    __m512 A = _mm512_setzero_ps(), B = A;
    const __m512i p0 = pair_index(0), p1 = pair_index(2), p2 = pair_index(4), p3 = pair_index(6);
#else
    const __m256i m4 = _mm256_set1_epi8(0xf);
#endif
    for (size_t i = 0; i < n / QK_K; i++, w += Q4_K_BYTES, xq += QK_K, xd += 8, xs += 8) {
        uint64_t sc, mn;
        k4_unpack(w + 4, &sc, &mn);
        __m256 dx = _mm256_loadu_ps(xd);
        __m256 s = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(h2f(w)), u8x8_ps(sc)), dx);
        __m256 m = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(h2f(w + 2)), u8x8_ps(mn)), dx);
        am = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(const void *)xs)), m, am);
        const uint8_t *q = w + 16;
#ifdef QUANT_AVX512
        __m512 s2 = _mm512_castps256_ps512(s);
#define K4PAIR(acc, c, idx) \
    acc = lanes_fma2(acc, _mm512_dpbusd_epi32(_mm512_setzero_si512(), nib_pair(q + 32 * (c)), xq512(xq + 64 * (c))), \
                     _mm512_permutexvar_ps(idx, s2))
        K4PAIR(A, 0, p0);
        K4PAIR(B, 1, p1);
        K4PAIR(A, 2, p2);
        K4PAIR(B, 3, p3);
#undef K4PAIR
#else
        float sv[8];
        _mm256_storeu_ps(sv, s);
        for (int c = 0; c < 4; c += 2) {
            __m256i r0 = ld256(q + 32 * c), r1 = ld256(q + 32 * c + 32);
            a0 = lanes_fma(a0, lanes_us(_mm256_and_si256(r0, m4), xq256(xq + 64 * c)), _mm256_set1_ps(sv[2 * c]));
            a1 = lanes_fma(a1, lanes_us(_mm256_and_si256(_mm256_srli_epi16(r0, 4), m4), xq256(xq + 64 * c + 32)),
                           _mm256_set1_ps(sv[2 * c + 1]));
            a2 = lanes_fma(a2, lanes_us(_mm256_and_si256(r1, m4), xq256(xq + 64 * c + 64)),
                           _mm256_set1_ps(sv[2 * c + 2]));
            a3 = lanes_fma(a3, lanes_us(_mm256_and_si256(_mm256_srli_epi16(r1, 4), m4), xq256(xq + 64 * c + 96)),
                           _mm256_set1_ps(sv[2 * c + 3]));
        }
#endif
    }
#ifdef QUANT_AVX512
    a0 = _mm512_castps512_ps256(A);
    a1 = _mm512_extractf32x8_ps(A, 1);
    a2 = _mm512_castps512_ps256(B);
    a3 = _mm512_extractf32x8_ps(B, 1);
#endif
    return sets_sum(a0, a1, a2, a3) - hsum8(am);
}

static float qdot_q6_K(const uint8_t *w, const xq8 *x, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const int8_t *xq = x->q;
    const float *xd = x->d;
#ifdef QUANT_AVX512
    const int32_t *lo = x->lo;
    __m512 A = _mm512_setzero_ps(), B = A;
    const __m512i m4 = _mm512_set1_epi8(0xf), m30 = _mm512_set1_epi8(0x30);
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    /* run pair (k, k+1) of a half takes scales 2k..2k+3, four lanes each */
    const __m512i r01 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i r23 = _mm512_add_epi32(r01, _mm512_set1_epi32(4)), r45 = _mm512_add_epi32(r01, _mm512_set1_epi32(8));
    const __m512i r67 = _mm512_add_epi32(r01, _mm512_set1_epi32(12));
    for (size_t i = 0; i < n / QK_K; i++, w += Q6_K_BYTES, xq += QK_K, xd += 8, lo += 64) {
        __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ld128(w + 192)));
        __m512 dx = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(xd)));
        __m512 s = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(h2f(w + 208)), sc), dx);
        for (int h = 0; h < 2; h++) {
            __m512i l = ld512(w + 64 * h);
            __m512i qh = _mm512_broadcast_i64x4(ld256(w + 128 + 32 * h));
            qh = _mm512_mask_srli_epi16(qh, 0xffff0000u, qh, 2);  /* [qh | qh >> 2] */
            /* 6-bit codes of runs (0, 1) and (2, 3): nibble | two high bits << 4 */
            __m512i u01 = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30));
            __m512i u23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), _mm512_and_si512(qh, m30));
            const int32_t *lh = lo + 32 * h;
            const int8_t *xh = xq + 128 * h;
            A = lanes_fma2(A, _mm512_dpbusd_epi32(xq512(lh), u01, xq512(xh)), _mm512_permutexvar_ps(h ? r45 : r01, s));
            B = lanes_fma2(B, _mm512_dpbusd_epi32(xq512(lh + 16), u23, xq512(xh + 64)),
                           _mm512_permutexvar_ps(h ? r67 : r23, s));
        }
    }
    a0 = _mm512_castps512_ps256(A);
    a1 = _mm512_extractf32x8_ps(A, 1);
    a2 = _mm512_castps512_ps256(B);
    a3 = _mm512_extractf32x8_ps(B, 1);
#else
    const __m256i m4 = _mm256_set1_epi8(0xf), m3 = _mm256_set1_epi8(3), m30 = _mm256_set1_epi8(0x30);
    const __m256i k32 = _mm256_set1_epi8(32);
    for (size_t i = 0; i < n / QK_K; i++, w += Q6_K_BYTES) {
        const int8_t *sc = (const int8_t *)(w + 192);
        float d = h2f(w + 208);
        for (int h = 0; h < 2; h++, xq += 128, xd += 4) {
            const uint8_t *ql = w + 64 * h;
            __m256i l0 = ld256(ql), l1 = ld256(ql + 32), qh = ld256(w + 128 + 32 * h);
            __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
            __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            const int8_t *s = sc + 8 * h;
#define Q6RUN(acc, k, qk) \
    acc = lanes_fma(acc, lanes_ss(_mm256_sub_epi8(qk, k32), xq256(xq + 32 * (k))), \
                    _mm256_set_m128(_mm_set1_ps((d * (float)s[2 * (k) + 1]) * xd[k]), \
                                    _mm_set1_ps((d * (float)s[2 * (k)]) * xd[k])))
            Q6RUN(a0, 0, q0);
            Q6RUN(a1, 1, q1);
            Q6RUN(a2, 2, q2);
            Q6RUN(a3, 3, q3);
#undef Q6RUN
        }
    }
#endif
    return sets_sum(a0, a1, a2, a3);
}

#endif

typedef float (*qdot_fn)(const uint8_t *w, const xq8 *x, size_t n);

/* The integer kernel for t (NULL for the fp types); ref picks the scalar
 * one. *sh: the AVX-512 kernel's code offset as a shift (off = 1 << sh), or -1. */
static qdot_fn qdot_for(enum ggml_type t, int ref, int *sh) {
    *sh = -1;
#ifdef QUANT_AVX2
    if (!ref) switch (t) {
        case GGML_Q8_0: *sh = 7; return qdot_q8_0;
        case GGML_Q4_0: *sh = 3; return qdot_q4_0;
        case GGML_Q5_0: *sh = 4; return qdot_q5_0;
        case GGML_Q4_K: return qdot_q4_K;
        case GGML_Q6_K: *sh = 5; return qdot_q6_K;
        default: return NULL;
        }
#endif
    (void)ref;
    switch (t) {
    case GGML_Q8_0: return ref_qdot_q8_0;
    case GGML_Q4_0: return ref_qdot_q4_0;
    case GGML_Q5_0: return ref_qdot_q5_0;
    case GGML_Q4_K: return ref_qdot_q4_K;
    case GGML_Q6_K: return ref_qdot_q6_K;
    default: return NULL;
    }
}

/* x (n) quantized into xq for the integer-dot kernels. Its buffers are the
 * caller's when n <= XQ_STACK and xq already points at them; otherwise one
 * heap block, returned for the caller to free (NULL when none). sh is the
 * AVX-512 kernels' code offset (qdot_for); ref quantizes with the scalar
 * reference. */
static uint8_t *xq_quantize(const float *x, size_t n, int sh, int ref, xq8 *xq) {
    uint8_t *heap = NULL;
    if (n > XQ_STACK || !xq->q) {
        size_t n64 = (n + 63) & ~(size_t)63;  /* keeps lo 64-byte aligned */
        heap = skv_aligned_alloc(2 * n64 + n / QK * (sizeof(float) + sizeof(int32_t)));
        SKV_ASSERT(heap);
        xq->q = (int8_t *)heap;
        xq->lo = (int32_t *)(void *)(heap + n64);
        xq->d = (float *)(void *)(heap + 2 * n64);
        xq->s = (int32_t *)(void *)(heap + 2 * n64 + n / QK * sizeof(float));
    }
#ifndef QUANT_AVX512
    sh = -1;  /* only the AVX-512 kernels read lo */
#endif
    for (size_t b = 0; b < n / QK; b++) {
#ifdef QUANT_AVX2
        if (!ref) {
            xq_block(x + QK * b, xq->q + QK * b, xq->d + b, xq->s + b, xq->lo + 8 * b, sh);
            continue;
        }
#endif
        ref_xq_block(x + QK * b, xq->q + QK * b, xq->d + b, xq->s + b);
    }
    (void)sh;
    (void)ref; /* read only where the AVX2 kernels are compiled */
    return heap;
}

/* y[r] = row r of W . x for r < rows, the integer kernels for quantized t;
 * ref: scalar kernels on one thread. The rows are handed out guided, not
 * static: long runs first (each thread streams its rows for the hardware
 * prefetcher), then shorter ones so a thread slowed by the host does not hold
 * the other at the barrier (docs/PERFORMANCE.md part 6). Each row is one dot
 * product, so the split never changes a bit. */
static void matvec(enum ggml_type t, const void *W, size_t rows, size_t n, const float *x, float *y, int ref) {
    size_t rs = ggml_row_size(t, n);
    SKV_ASSERT(quant_supported(t) && (rs != 0 || n == 0));
    const uint8_t *w = W;
    long long nr = (long long)rows;
    /* Small products are not worth waking the team for (nor entering OpenMP at all). */
    int team = !ref && rows * n >= 32768;
    int sh;
    qdot_fn qf = qdot_for(t, ref, &sh);
    if (!qf) {
        dot_fn f = dot_for(t, ref);
        if (!team) {
            for (size_t r = 0; r < rows; r++) y[r] = f(w + r * rs, x, n);
            return;
        }
#pragma omp parallel for schedule(guided, 8)
        for (long long r = 0; r < nr; r++) y[r] = f(w + (size_t)r * rs, x, n);
        return;
    }
    _Alignas(64) int8_t qbuf[XQ_STACK];
    _Alignas(64) int32_t lbuf[XQ_STACK / 4];
    float dbuf[XQ_STACK / QK];
    int32_t sbuf[XQ_STACK / QK];
    xq8 xq = {qbuf, dbuf, sbuf, lbuf};
    uint8_t *heap = xq_quantize(x, n, sh, ref, &xq);
    if (!team) {
        for (size_t r = 0; r < rows; r++) y[r] = qf(w + r * rs, &xq, n);
    } else {
#pragma omp parallel for schedule(guided, 8)
        for (long long r = 0; r < nr; r++) y[r] = qf(w + (size_t)r * rs, &xq, n);
    }
    free(heap);
}

void quant_xq_block(const float *x, int8_t *q, float *d, int32_t *s) {
#ifdef QUANT_AVX2
    _Alignas(32) int8_t buf[QK];
    xq_block(x, buf, d, s, NULL, -1);
    memcpy(q, buf, QK);
#else
    ref_xq_block(x, q, d, s);
#endif
}

/* k matrices against the same x in one parallel pass over all their rows
 * (quant_matvec_k): x quantized once per AVX-512 code offset (it depends on
 * the type), and row g of the concatenation is row g - off[i] of matrix i. */
void quant_matvec_k(int k, const enum ggml_type *t, const void *const *W, const size_t *rows, size_t n, const float *x,
                    float *const *y) {
    SKV_ASSERT(k >= 1 && k <= 4);
    size_t off[5] = {0}, rs[4];
    qdot_fn qf[4];
    dot_fn df[4];
    int sh[4];
    xq8 xq[4] = {{0}};
    const xq8 *px[4] = {NULL};
    uint8_t *heap[4] = {NULL};
    for (int i = 0; i < k; i++) {
        SKV_ASSERT(quant_supported(t[i]));
        rs[i] = ggml_row_size(t[i], n);
        off[i + 1] = off[i] + rows[i];
        qf[i] = qdot_for(t[i], 0, &sh[i]);
        df[i] = qf[i] ? NULL : dot_for(t[i], 0);
        if (!qf[i]) continue;
        /* x is quantized once per code offset: matrices of types that share
         * one (Q, K and V of one type) read the same copy */
        for (int j = 0; j < i && !px[i]; j++)
            if (qf[j] && sh[j] == sh[i]) px[i] = px[j];
        if (!px[i]) {
            heap[i] = xq_quantize(x, n, sh[i], 0, &xq[i]);
            px[i] = &xq[i];
        }
    }
    long long total = (long long)off[k];
#pragma omp parallel for schedule(guided, 8) if (off[k] * n >= 32768)
    for (long long gr = 0; gr < total; gr++) {
        int i = 0;
        while ((size_t)gr >= off[i + 1]) i++;
        size_t r = (size_t)gr - off[i];
        const uint8_t *w = (const uint8_t *)W[i] + r * rs[i];
        y[i][r] = qf[i] ? qf[i](w, px[i], n) : df[i](w, x, n);
    }
    for (int i = 0; i < k; i++) free(heap[i]);
}

void quant_matvec_rows(enum ggml_type t, const void *W, size_t rows, size_t n, const float *x, int m, float *y) {
    SKV_ASSERT(quant_supported(t) && m >= 1 && m <= QUANT_ROWS_MAX);
    size_t rs = ggml_row_size(t, n);
    int sh;
    qdot_fn qf = qdot_for(t, 0, &sh);
    dot_fn df = qf ? NULL : dot_for(t, 0);
    xq8 xq[QUANT_ROWS_MAX] = {{0}};
    uint8_t *heap[QUANT_ROWS_MAX] = {NULL};
    for (int j = 0; qf && j < m; j++) heap[j] = xq_quantize(x + (size_t)j * n, n, sh, 0, &xq[j]);
    long long nr = (long long)rows;
#ifdef HAVE_QDOT2 /* two x a pass over each weight block, where the type has the kernel */
    qdot2_fn q2 = t == GGML_Q8_0 ? qdot2_q8_0 : t == GGML_Q4_0 ? qdot2_q4_0 : t == GGML_Q5_0 ? qdot2_q5_0 : NULL;
#else
    void (*q2)(const uint8_t *, const xq8 *, const xq8 *, size_t, float *, float *) = NULL;
#endif
    /* a weight row is read once and dotted with every x while it is in cache */
#pragma omp parallel for schedule(static) if (rows * n >= 32768)
    for (long long r = 0; r < nr; r++) {
        const uint8_t *w = (const uint8_t *)W + (size_t)r * rs;
        int j = 0;
        for (; q2 && j + 2 <= m; j += 2)
            q2(w, &xq[j], &xq[j + 1], n, &y[(size_t)j * rows + (size_t)r], &y[(size_t)(j + 1) * rows + (size_t)r]);
        for (; j < m; j++)
            y[(size_t)j * rows + (size_t)r] = qf ? qf(w, &xq[j], n) : df(w, x + (size_t)j * n, n);
    }
    for (int j = 0; j < m; j++) free(heap[j]);
}

const char *quant_rows_kernel(enum ggml_type t) {
#ifdef HAVE_QDOT2
    if (t == GGML_Q8_0 || t == GGML_Q4_0 || t == GGML_Q5_0) return "two-row AVX2";
#endif
#if defined(QUANT_AVX512)
    int sh;
    return qdot_for(t, 0, &sh) ? "one-row AVX-512" : "one-row AVX2"; /* the fp types' dots are AVX2 */
#elif defined(QUANT_AVX2)
    (void)t;
    return "one-row AVX2";
#else
    (void)t;
    return "one-row scalar";
#endif
}

float quant_dot(enum ggml_type t, const void *row, const float *x, size_t n) {
    float y;
    matvec(t, row, 1, n, x, &y, 0);
    return y;
}

void quant_matvec(enum ggml_type t, const void *W, size_t rows, size_t n, const float *x, float *y) {
    matvec(t, W, rows, n, x, y, 0);
}

void quant_matvec_ref(enum ggml_type t, const void *W, size_t rows, size_t n, const float *x, float *y) {
    matvec(t, W, rows, n, x, y, 1);
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
