/* qgemm.c: the prefill matmul of q8_0, q4_0, q5_0, q4_K and q6_K weights in
 * int8 (qgemm.h).
 *
 * x is quantized per token to blocks of 32 codes with one scale
 * (quant_xq_block, as the decode matvec quantizes it) and repacked so that
 * one 64-byte vector holds four consecutive codes of 16 tokens:
 *   xp[tile][block][group g of 4 codes][token j of 16][4 bytes]
 *   dx[tile][block][token j]                          (the x scales)
 * A weight row's four codes of a group are broadcast to all 16 lanes, so one
 * dot-product instruction advances 16 tokens by four weights; the kernel
 * takes 4 weight rows x 32 tokens (16 int32 + 16 fp32 accumulators live in
 * registers). At the end of each block the int32 sums are converted and
 * added with the product of the two scales (one fused multiply-add):
 *   y[t][r] = sum_b fma(float(sum_k w[r][32b+k] q[t][32b+k]), dw[r][b] * dx[t][b], .)
 * in block order, which qgemm_ref spells out and the vector kernels give bit
 * for bit (the integer sums are exact, the float steps the same). q4_K's
 * sub-blocks of 32 are such blocks too: codes 0..15, scale d·sc, and a
 * minimum dmin·m subtracted from every weight, which takes one more fused
 * step per block with the x block's scaled code sum (mx = dx · Σq):
 *   acc = fma(-mw[r][b], mx[t][b], acc)
 * after the block's product (so Σ_k w x = d·sc·dx·Σ q·xq − dmin·m·dx·Σ xq,
 * as the decode matvec takes it). q6_K's sub-blocks are 16 weights with an
 * int8 scale each: a block of 32 runs as two halves (units), each with its
 * own integer sum, code-sum offset and scale, in order.
 *
 * AVX-512 VNNI (vpdpbusd: unsigned x signed bytes): x is stored as q + 128
 * and each block's int32 sum starts at -128 * (sum of the row's block codes),
 * which cancels the offset exactly. AVX2 (no VNNI): vpmaddubsw on |w| and
 * sign(w) * q, then vpmaddwd with ones; x stays signed. The kernels are
 * compiled for their instruction sets with target attributes and chosen by
 * the CPU's features at run time. */
#include "qgemm.h"
#include "quant.h"
#include "skv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QGEMM_X86 1
#endif

#define QB 32        /* weights per block */
#define TT 16        /* tokens per packed tile */
#define RT 4         /* weight rows per kernel call */

static inline uint16_t ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* 0: no kernel; 1: AVX2 + FMA; 2: AVX-512 VNNI (with BW, VL, DQ). */
static int qgemm_level_cache = -1;
static int qgemm_level(void) {
    int level = qgemm_level_cache;
    if (level < 0) {
        int l = 0;
#ifdef QGEMM_X86
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) l = 1;
        if (l && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vnni"))
            l = 2;
#endif
        qgemm_level_cache = level = l;
    }
    return level;
}

void qgemm_force_level(int level) {
    int detected = (qgemm_level_cache = -1, qgemm_level());
    qgemm_level_cache = level >= 0 && level < detected ? level : detected;
}

static int block32_type(enum ggml_type t) {
    return t == GGML_Q8_0 || t == GGML_Q4_0 || t == GGML_Q5_0 || t == GGML_Q4_K || t == GGML_Q6_K;
}

/* Scales per block of 32: q6_K's sub-blocks are 16 weights, two to a block. */
static int units(enum ggml_type t) { return t == GGML_Q6_K ? 2 : 1; }

int qgemm_kernel_level(void) { return qgemm_level(); }

int qgemm_supported(enum ggml_type t, int n) { return block32_type(t) && n >= TT && qgemm_level() > 0; }

/* Columns a row of type t comes in multiples of. */
static int row_unit(enum ggml_type t) { return t == GGML_Q4_K || t == GGML_Q6_K ? 256 : QB; }

/* Block b of a stored row as 32 signed codes, the scale and code sum of each
 * of its units(t) parts (d[u], sum[u]) and the minimum subtracted from each
 * weight (q4_K; 0 for the others). */
static void decode_block(enum ggml_type t, const uint8_t *row, int b, int8_t *q, float *d, int32_t *sum, float *mn) {
    *mn = 0;
    if (t == GGML_Q4_K || t == GGML_Q6_K) {
        size_t sb_bytes = t == GGML_Q4_K ? GGML_Q4_K_BYTES : GGML_Q6_K_BYTES;
        quant_kblock(t, row + (size_t)(b / 8) * sb_bytes, b % 8, q, d, mn);
    } else if (t == GGML_Q8_0) {
        const uint8_t *blk = row + (size_t)b * GGML_Q8_0_BYTES;
        *d = fp16_to_f32(ld16(blk));
        memcpy(q, blk + 2, QB);
    } else if (t == GGML_Q4_0) {
        const uint8_t *blk = row + (size_t)b * GGML_Q4_0_BYTES;
        *d = fp16_to_f32(ld16(blk));
        for (int j = 0; j < QB / 2; j++) {
            q[j] = (int8_t)((blk[2 + j] & 0xf) - 8);
            q[j + QB / 2] = (int8_t)((blk[2 + j] >> 4) - 8);
        }
    } else { /* GGML_Q5_0 */
        const uint8_t *blk = row + (size_t)b * GGML_Q5_0_BYTES;
        *d = fp16_to_f32(ld16(blk));
        uint32_t qh = ld32(blk + 2);
        for (int j = 0; j < QB / 2; j++) {
            int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
            q[j] = (int8_t)(((blk[6 + j] & 0xf) | h0) - 16);
            q[j + QB / 2] = (int8_t)(((blk[6 + j] >> 4) | h1) - 16);
        }
    }
    int nu = units(t), len = QB / nu;
    for (int u = 0; u < nu; u++) {
        int acc = 0;
        for (int j = 0; j < len; j++) acc += q[u * len + j];
        sum[u] = acc;
    }
}

void qgemm_ref(enum ggml_type t, const void *W, int rows, int cols, const float *x, int n, float *y) {
    SKV_ASSERT(block32_type(t) && cols % row_unit(t) == 0);
    int nb = cols / QB;
    size_t rs = ggml_row_size(t, cols);
    int8_t xq[QB], wq[QB];
    float *dx = malloc(sizeof(float) * (size_t)nb), *mx = malloc(sizeof(float) * (size_t)nb);
    int8_t *xc = malloc((size_t)cols);
    SKV_ASSERT(dx && mx && xc);
    for (int i = 0; i < n; i++) {
        for (int b = 0; b < nb; b++) {
            int32_t s;
            quant_xq_block(x + (size_t)i * cols + (size_t)b * QB, xq, &dx[b], &s);
            mx[b] = dx[b] * (float)s;
            memcpy(xc + (size_t)b * QB, xq, QB);
        }
        for (int r = 0; r < rows; r++) {
            const uint8_t *row = (const uint8_t *)W + rs * r;
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                float dw[2], mw;
                int32_t ws[2];
                decode_block(t, row, b, wq, dw, ws, &mw);
                int nu = units(t), len = QB / nu;
                for (int u = 0; u < nu; u++) {
                    int32_t dot = 0;
                    for (int k = u * len; k < (u + 1) * len; k++) dot += (int32_t)wq[k] * xc[(size_t)b * QB + k];
                    acc = fmaf((float)dot, dw[u] * dx[b], acc);
                }
                if (t == GGML_Q4_K) acc = fmaf(-mw, mx[b], acc);
            }
            y[(size_t)i * rows + r] = acc;
        }
    }
    free(dx);
    free(mx);
    free(xc);
}

#ifdef QGEMM_X86

/* The packed activations: n_tiles tiles of TT tokens (the last padded with
 * zero codes and zero scales). off: 128 for the VNNI kernel (unsigned
 * codes), 0 for AVX2. mx (laid out as dx): each block's scale times its
 * code sum, for q4_K's minimums. */
static void pack_x(const float *x, int n, int cols, int off, int n_tiles, uint8_t *xp, float *dx, float *mx) {
    int nb = cols / QB;
    int total = n_tiles * TT;
    #pragma omp parallel for schedule(static) if ((size_t)n * cols >= 65536)
    for (int t = 0; t < total; t++) {
        int tile = t / TT, j = t % TT;
        int8_t q[QB];
        for (int b = 0; b < nb; b++) {
            float d = 0;
            int32_t s = 0;
            if (t < n) quant_xq_block(x + (size_t)t * cols + (size_t)b * QB, q, &d, &s);
            else memset(q, 0, QB);
            size_t base = (size_t)tile * nb + b;
            dx[base * TT + j] = d;
            mx[base * TT + j] = d * (float)s;
            uint8_t *dst = xp + base * (QB * TT) + (size_t)j * 4;
            for (int g = 0; g < QB / 4; g++)
                for (int e = 0; e < 4; e++) dst[(size_t)g * 4 * TT + e] = (uint8_t)(q[g * 4 + e] + off);
        }
    }
}

/* A row tile of RT rows decoded for the kernels: codes (RT, cols), scales
 * and code sums (RT, nb); rows past `valid` are zero. */
typedef struct {
    int8_t *q;
    float *d;
    int32_t *s;
    float *m;                /* (RT, nb) minimums (q4_K), or NULL */
    int nu;                  /* scales per block (d and s are (RT, nb*nu)) */
} wtile;

static void decode_tile(enum ggml_type t, const void *W, size_t rs, int r0, int valid, int cols, wtile *w) {
    int nb = cols / QB;
    for (int r = 0; r < RT; r++) {
        if (r >= valid) {
            memset(w->q + (size_t)r * cols, 0, (size_t)cols);
            memset(w->d + (size_t)r * nb * w->nu, 0, sizeof(float) * nb * w->nu);
            memset(w->s + (size_t)r * nb * w->nu, 0, sizeof(int32_t) * nb * w->nu);
            if (w->m) memset(w->m + (size_t)r * nb, 0, sizeof(float) * nb);
            continue;
        }
        const uint8_t *row = (const uint8_t *)W + rs * (size_t)(r0 + r);
        for (int b = 0; b < nb; b++) {
            float mn;
            size_t at = ((size_t)r * nb + b) * w->nu;
            decode_block(t, row, b, w->q + (size_t)r * cols + (size_t)b * QB, &w->d[at], &w->s[at], &mn);
            if (w->m) w->m[(size_t)r * nb + b] = mn;
        }
    }
}

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))
#define T256 __attribute__((target("avx2,fma")))

/* 4 rows x 32 tokens (tiles xp0, xp1 with scales dx0, dx1) into out[r][j]. */
T512 static void kernel512(const wtile *w, int nb, int cols, const uint8_t *xp0, const uint8_t *xp1,
                           const float *dx0, const float *dx1, const float *mx0, const float *mx1,
                           float out[RT][2 * TT]) {
    __m512 f0a = _mm512_setzero_ps(), f0b = f0a, f1a = f0a, f1b = f0a, f2a = f0a, f2b = f0a, f3a = f0a, f3b = f0a;
    const int8_t *q0 = w->q, *q1 = q0 + cols, *q2 = q1 + cols, *q3 = q2 + cols;
    int nu = w->nu, nbu = nb * nu, gu = QB / 4 / nu;
    for (int b = 0; b < nb; b++) {
        const uint8_t *p0 = xp0 + (size_t)b * (QB * TT), *p1 = xp1 + (size_t)b * (QB * TT);
        const int8_t *c0 = q0 + (size_t)b * QB, *c1 = q1 + (size_t)b * QB, *c2 = q2 + (size_t)b * QB,
                     *c3 = q3 + (size_t)b * QB;
        __m512 da = _mm512_load_ps(dx0 + (size_t)b * TT), db = _mm512_load_ps(dx1 + (size_t)b * TT);
        /* one pass per scale unit: the whole block, or q6_K's two halves */
        for (int u = 0; u < nu; u++) {
            int bu = b * nu + u;
            __m512i a0a = _mm512_set1_epi32(-128 * w->s[bu]), a0b = a0a;
            __m512i a1a = _mm512_set1_epi32(-128 * w->s[nbu + bu]), a1b = a1a;
            __m512i a2a = _mm512_set1_epi32(-128 * w->s[2 * nbu + bu]), a2b = a2a;
            __m512i a3a = _mm512_set1_epi32(-128 * w->s[3 * nbu + bu]), a3b = a3a;
            for (int g = u * gu; g < (u + 1) * gu; g++) {
                __m512i xa = _mm512_load_si512((const void *)(p0 + g * 64)),
                        xb = _mm512_load_si512((const void *)(p1 + g * 64));
                __m512i v = _mm512_set1_epi32((int)ld32((const uint8_t *)c0 + 4 * g));
                a0a = _mm512_dpbusd_epi32(a0a, xa, v);
                a0b = _mm512_dpbusd_epi32(a0b, xb, v);
                v = _mm512_set1_epi32((int)ld32((const uint8_t *)c1 + 4 * g));
                a1a = _mm512_dpbusd_epi32(a1a, xa, v);
                a1b = _mm512_dpbusd_epi32(a1b, xb, v);
                v = _mm512_set1_epi32((int)ld32((const uint8_t *)c2 + 4 * g));
                a2a = _mm512_dpbusd_epi32(a2a, xa, v);
                a2b = _mm512_dpbusd_epi32(a2b, xb, v);
                v = _mm512_set1_epi32((int)ld32((const uint8_t *)c3 + 4 * g));
                a3a = _mm512_dpbusd_epi32(a3a, xa, v);
                a3b = _mm512_dpbusd_epi32(a3b, xb, v);
            }
            __m512 s = _mm512_set1_ps(w->d[bu]);
            f0a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0a), _mm512_mul_ps(s, da), f0a);
            f0b = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0b), _mm512_mul_ps(s, db), f0b);
            s = _mm512_set1_ps(w->d[nbu + bu]);
            f1a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1a), _mm512_mul_ps(s, da), f1a);
            f1b = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1b), _mm512_mul_ps(s, db), f1b);
            s = _mm512_set1_ps(w->d[2 * nbu + bu]);
            f2a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a2a), _mm512_mul_ps(s, da), f2a);
            f2b = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a2b), _mm512_mul_ps(s, db), f2b);
            s = _mm512_set1_ps(w->d[3 * nbu + bu]);
            f3a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a3a), _mm512_mul_ps(s, da), f3a);
            f3b = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a3b), _mm512_mul_ps(s, db), f3b);
        }
        if (w->m) { /* q4_K: each row's block minimum against the tokens' scaled code sums */
            __m512 ma = _mm512_load_ps(mx0 + (size_t)b * TT), mb = _mm512_load_ps(mx1 + (size_t)b * TT);
            __m512 m = _mm512_set1_ps(w->m[b]);
            f0a = _mm512_fnmadd_ps(m, ma, f0a);
            f0b = _mm512_fnmadd_ps(m, mb, f0b);
            m = _mm512_set1_ps(w->m[nb + b]);
            f1a = _mm512_fnmadd_ps(m, ma, f1a);
            f1b = _mm512_fnmadd_ps(m, mb, f1b);
            m = _mm512_set1_ps(w->m[2 * nb + b]);
            f2a = _mm512_fnmadd_ps(m, ma, f2a);
            f2b = _mm512_fnmadd_ps(m, mb, f2b);
            m = _mm512_set1_ps(w->m[3 * nb + b]);
            f3a = _mm512_fnmadd_ps(m, ma, f3a);
            f3b = _mm512_fnmadd_ps(m, mb, f3b);
        }
    }
    _mm512_storeu_ps(out[0], f0a); _mm512_storeu_ps(out[0] + TT, f0b);
    _mm512_storeu_ps(out[1], f1a); _mm512_storeu_ps(out[1] + TT, f1b);
    _mm512_storeu_ps(out[2], f2a); _mm512_storeu_ps(out[2] + TT, f2b);
    _mm512_storeu_ps(out[3], f3a); _mm512_storeu_ps(out[3] + TT, f3b);
}

/* The 8 lanes sum_{k<4} w[k] x[4l+k] of signed codes: |w| against sign(w)*x
 * (no pair can saturate: |w| <= 128, |x| <= 127). */
T256 static inline __m256i dot4_256(__m256i wb, __m256i x) {
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wb, wb), _mm256_sign_epi8(x, wb));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* 4 rows x 16 tokens (one tile xp0, scales dx0) into out[r][j], j < 16. */
T256 static void kernel256(const wtile *w, int nb, int cols, const uint8_t *xp0, const float *dx0, const float *mx0,
                           float out[RT][2 * TT]) {
    __m256 f[RT][2];
    for (int r = 0; r < RT; r++) f[r][0] = f[r][1] = _mm256_setzero_ps();
    int nu = w->nu, nbu = nb * nu, gu = QB / 4 / nu;
    for (int b = 0; b < nb; b++) {
        const uint8_t *p0 = xp0 + (size_t)b * (QB * TT);
        __m256 da = _mm256_load_ps(dx0 + (size_t)b * TT), db = _mm256_load_ps(dx0 + (size_t)b * TT + 8);
        for (int u = 0; u < nu; u++) {
            int bu = b * nu + u;
            __m256i a[RT][2];
            for (int r = 0; r < RT; r++) a[r][0] = a[r][1] = _mm256_setzero_si256();
            for (int g = u * gu; g < (u + 1) * gu; g++) {
                __m256i xa = _mm256_load_si256((const __m256i *)(const void *)(p0 + g * 64));
                __m256i xb = _mm256_load_si256((const __m256i *)(const void *)(p0 + g * 64 + 32));
                for (int r = 0; r < RT; r++) {
                    __m256i v =
                        _mm256_set1_epi32((int)ld32((const uint8_t *)w->q + (size_t)r * cols + (size_t)b * QB + 4 * g));
                    a[r][0] = _mm256_add_epi32(a[r][0], dot4_256(v, xa));
                    a[r][1] = _mm256_add_epi32(a[r][1], dot4_256(v, xb));
                }
            }
            for (int r = 0; r < RT; r++) {
                __m256 s = _mm256_set1_ps(w->d[(size_t)r * nbu + bu]);
                f[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r][0]), _mm256_mul_ps(s, da), f[r][0]);
                f[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r][1]), _mm256_mul_ps(s, db), f[r][1]);
            }
        }
        if (w->m) { /* q4_K's block minimums */
            __m256 ma = _mm256_load_ps(mx0 + (size_t)b * TT), mb = _mm256_load_ps(mx0 + (size_t)b * TT + 8);
            for (int r = 0; r < RT; r++) {
                __m256 m = _mm256_set1_ps(w->m[(size_t)r * nb + b]);
                f[r][0] = _mm256_fnmadd_ps(m, ma, f[r][0]);
                f[r][1] = _mm256_fnmadd_ps(m, mb, f[r][1]);
            }
        }
    }
    for (int r = 0; r < RT; r++) {
        _mm256_storeu_ps(out[r], f[r][0]);
        _mm256_storeu_ps(out[r] + 8, f[r][1]);
    }
}

void qgemm(enum ggml_type t, const void *W, int rows, int cols, const float *x, int n, float *y, skv_workspace *ws) {
    int level = qgemm_level();
    SKV_ASSERT(block32_type(t) && cols % row_unit(t) == 0 && n >= 1 && level > 0);
    int nb = cols / QB;
    /* VNNI takes two tiles per call: pad to an even count */
    int n_tiles = (n + TT - 1) / TT;
    if (level == 2) n_tiles += n_tiles & 1;
    size_t xp_bytes = (size_t)n_tiles * TT * cols, dx_bytes = sizeof(float) * (size_t)n_tiles * TT * nb;
    size_t need = xp_bytes + 2 * dx_bytes + 64;
    if (ws->qlen < need) {
        free(ws->qbuf);
        ws->qbuf = skv_aligned_alloc(need);
        SKV_ASSERT(ws->qbuf);
        ws->qlen = need;
    }
    uint8_t *xp = ws->qbuf;
    float *dx = (float *)(void *)(ws->qbuf + xp_bytes), *mx = (float *)(void *)(ws->qbuf + xp_bytes + dx_bytes);
    pack_x(x, n, cols, level == 2 ? 128 : 0, n_tiles, xp, dx, mx);
    size_t rs = ggml_row_size(t, cols);
    int n_rt = (rows + RT - 1) / RT;
    size_t tile_x = (size_t)nb * QB * TT, tile_d = (size_t)nb * TT;
    #pragma omp parallel
    {
        wtile w;
        w.q = skv_aligned_alloc((size_t)RT * cols);
        w.nu = units(t);
        w.d = malloc(sizeof(float) * RT * (size_t)nb * w.nu);
        w.s = malloc(sizeof(int32_t) * RT * (size_t)nb * w.nu);
        w.m = t == GGML_Q4_K ? malloc(sizeof(float) * RT * (size_t)nb) : NULL;
        SKV_ASSERT(w.q && w.d && w.s && (t != GGML_Q4_K || w.m));
        float out[RT][2 * TT];
        #pragma omp for schedule(dynamic, 2)
        for (int rt = 0; rt < n_rt; rt++) {
            int r0 = rt * RT, valid = rows - r0 < RT ? rows - r0 : RT;
            decode_tile(t, W, rs, r0, valid, cols, &w);
            int step = level == 2 ? 2 : 1;
            for (int tile = 0; tile < n_tiles; tile += step) {
                if (level == 2)
                    kernel512(&w, nb, cols, xp + tile * tile_x, xp + (tile + 1) * tile_x, dx + tile * tile_d,
                              dx + (tile + 1) * tile_d, mx + tile * tile_d, mx + (tile + 1) * tile_d, out);
                else
                    kernel256(&w, nb, cols, xp + tile * tile_x, dx + tile * tile_d, mx + tile * tile_d, out);
                int t0 = tile * TT, nt = step * TT;
                if (t0 + nt > n) nt = n - t0;
                for (int j = 0; j < nt; j++)
                    for (int r = 0; r < valid; r++) y[(size_t)(t0 + j) * rows + r0 + r] = out[r][j];
            }
        }
        free(w.q);
        free(w.d);
        free(w.s);
        free(w.m);
    }
}

#else

void qgemm(enum ggml_type t, const void *W, int rows, int cols, const float *x, int n, float *y, skv_workspace *ws) {
    (void)ws;
    qgemm_ref(t, W, rows, cols, x, n, y);
}

#endif
