/* backend_cpu.c: the CPU backend, the reference of the backend table.
 *
 * Batched matmuls are GEMMs over blocks of 256 weight rows spread over the
 * OpenMP threads: each thread dequantizes a block into its own scratch and
 * multiplies it with a single-threaded GEMM (sgemm_rm: oneDNN or OpenBLAS;
 * so two thread pools never compete). Single tokens go through quant_matvec, the integer-dot matvec
 * straight from the stored blocks. Batched causal attention is two GEMMs
 * per (KV head, block of 64 queries) over the group's query heads packed
 * together, so K and V are read once per group; single-query attention over a row
 * set is a vector loop. The sparse-policy stages are kernels/cpu/shadowkv_ops.c. */
#include "backend.h"
#include "quant.h"
#include "qgemm.h"
#include "kivi.h"
#include "page_ops.h"
#include "shadowkv_ops.h"
#include "skv.h"
#include "vec.h"

#include <cblas.h>
#ifdef SKV_HAVE_DNNL
#include <dnnl.h>
#endif
#include <math.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* C (m, n) = alpha A (m, k) B + beta C, row-major, B (k, n) or, with
 * trans_b, B (n, k). oneDNN's sgemm when built with it: it picks its kernels
 * by the CPU's instruction sets at run time (its own JIT), so the speed does
 * not hang on a library recognising the CPU's model name or on
 * OPENBLAS_CORETYPE (docs/PERFORMANCE.md has the measurement); else
 * OpenBLAS. Called from inside the engine's OpenMP loops, where both run on
 * the calling thread alone. */
static inline void sgemm_rm(int trans_b, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
                            int ldb, float beta, float *C, int ldc) {
#ifdef SKV_HAVE_DNNL
    dnnl_sgemm('N', trans_b ? 'T' : 'N', m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda, B, ldb,
                beta, C, ldc);
#endif
}

static int cpu_available(char *why, size_t n) {
    (void)why;
    (void)n;
    return 1;
}

static void *cpu_alloc(size_t bytes) { return skv_aligned_alloc(bytes); }
static void cpu_free(void *p) { free(p); }
static void *cpu_alloc_raw(size_t bytes) {
    size_t rounded = (bytes + 63) & ~(size_t)63;
    return rounded < bytes ? NULL : aligned_alloc(64, rounded ? rounded : 64);
}
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

static void cpu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height) {
    for (size_t i = 0; i < height; i++) memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
}

/* The CPU computes on the model's stored blocks where they are. */
static int cpu_weight_load(enum ggml_type t, const void *host, int rows, int cols, skv_weight *w) {
    (void)rows;
    (void)cols;
    w->type = t;
    w->data = host;
    w->owned = NULL;
    return 0;
}

static void cpu_weight_free(skv_weight *w) { memset(w, 0, sizeof *w); }

static void cpu_kv_store(float *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src) {
    size_t row = (size_t)n_kv * d;
    for (int t = 0; t < n; t++)
        for (int kh = 0; kh < n_kv; kh++)
            memcpy(cache + (size_t)kh * head_stride + (size_t)(pos + t) * d, src + t * row + (size_t)kh * d,
                   sizeof(float) * d);
}

/* Up to this many rows of x, quantized weights go through quant_matvec_rows. */
#define ROWS_DOTS_MAX 32
_Static_assert(ROWS_DOTS_MAX <= QUANT_ROWS_MAX, "quant_matvec_rows takes at most QUANT_ROWS_MAX rows");

/* Rows of W per GEMM task. */
#define WBLOCK_ROWS 256

static void cpu_matmul(enum ggml_type t, const void *W, int rows, int cols, const float *x, int n, float *y,
                       skv_workspace *ws) {
    if (n == 1) {
        quant_matvec(t, W, rows, cols, x, y);
        return;
    }
    if (t != GGML_F32 && n <= ROWS_DOTS_MAX) {
        /* a batched decode step, a prefill's tail: the matvec's own dots,
         * each weight row read once for all of them. On an AVX2 EPYC
         * (SmolLM2 shape, q8_0, 2 threads, skv bench --parallel B) a step of
         * 16 took 73 ms this way against 105 through the int8 GEMM, which
         * packs the weights each call; at 32 the two were even (125-147 ms
         * against 131-137), and at 64 the GEMM won (245 against 289). */
        quant_matvec_rows(t, W, (size_t)rows, (size_t)cols, x, n, y);
        return;
    }
    if (qgemm_supported(t, n)) {
        qgemm(t, W, rows, cols, x, n, y, ws);
        return;
    }
    if (t == GGML_F32) {
        /* one GEMM over the whole matrix, threaded by the library (called
         * outside any parallel region): 256-row blocks left a thread idle
         * on the 192-row K and V projections */
        sgemm_rm(1, n, rows, cols, 1.0f, x, cols, W, cols, 0.0f, y, rows);
        return;
    }
    int nt = skv_threads();
    size_t need = (size_t)nt * WBLOCK_ROWS * cols;
    if (t != GGML_F32 && ws->len < need) {
        free(ws->buf);
        ws->buf = skv_aligned_alloc(sizeof(float) * need);
        SKV_ASSERT(ws->buf);
        ws->len = need;
    }
    size_t row_bytes = ggml_row_size(t, cols);
    int nblk = (rows + WBLOCK_ROWS - 1) / WBLOCK_ROWS;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int b = 0; b < nblk; b++) {
        int r0 = b * WBLOCK_ROWS, r1 = r0 + WBLOCK_ROWS < rows ? r0 + WBLOCK_ROWS : rows;
        const float *w;
        if (t == GGML_F32) {
            w = (const float *)W + (size_t)r0 * cols;
        } else {
            float *buf = ws->buf + (size_t)omp_get_thread_num() * WBLOCK_ROWS * cols;
            quant_dequant_row(t, (const uint8_t *)W + row_bytes * r0, buf, (size_t)(r1 - r0) * cols);
            w = buf;
        }
        sgemm_rm(1, n, r1 - r0, cols, 1.0f, x, cols, w, cols, 0.0f, y + r0, rows);
    }
}

static void cpu_matmul_k(int k, const enum ggml_type *t, const void *const *W, const int *rows, int cols,
                         const float *x, int n, float *const *y, skv_workspace *ws) {
    if (n == 1) {
        size_t r[4];
        SKV_ASSERT(k >= 1 && k <= 4);
        for (int i = 0; i < k; i++) r[i] = (size_t)rows[i];
        quant_matvec_k(k, t, W, r, (size_t)cols, x, y);
        return;
    }
    for (int i = 0; i < k; i++) cpu_matmul(t[i], W[i], rows[i], cols, x, n, y[i], ws);
}

static void cpu_embed(enum ggml_type t, const void *table, int dim, const int32_t *ids, int n, float *x) {
    size_t row = ggml_row_size(t, dim);
    for (int i = 0; i < n; i++)
        quant_dequant_row(t, (const uint8_t *)table + row * ids[i], x + (size_t)i * dim, dim);
}

/* Elementwise ops run on the calling thread below this many elements (a
 * decode step's vectors) and split over the threads above it (a prefill
 * batch: single-threaded, SwiGLU's exp alone took a fifth of a 512-token
 * prefill). */
#define PAR_MIN 32768

static void cpu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps) {
    #pragma omp parallel for schedule(static) if ((size_t)n * dim >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *oi = out + (size_t)i * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float s = (float)(1.0 / sqrt(ss / dim + eps));
        for (int j = 0; j < dim; j++) oi[j] = xi[j] * s * w[j];
    }
}

static void cpu_rope(const rope_ctx *r, float *x, int n, int n_heads, int pos0) {
    #pragma omp parallel for schedule(static) if ((size_t)n * n_heads * r->head_dim >= PAR_MIN)
    for (int i = 0; i < n; i++) rope_apply(r, x + (size_t)i * n_heads * r->head_dim, n_heads, pos0 + i);
}

static void cpu_add_bias(float *y, const float *b, int n, int width) {
    #pragma omp parallel for schedule(static) if ((size_t)n * width >= PAR_MIN)
    for (int i = 0; i < n; i++) vec_axpy(y + (size_t)i * width, 1.0f, b, width);
}

static void cpu_add(float *y, const float *x, size_t len) {
    long long n = (long long)len;
    #pragma omp parallel for schedule(static) if (len >= PAR_MIN)
    for (long long i = 0; i < n; i++) y[i] += x[i];
}

/* gate = silu(gate) * up over n values, silu(g) = g / (1 + e^-g) computed
 * from t = e^-|g| (an argument <= 0, the softmax's vector exp): g / (1 + t)
 * for g >= 0, g t / (1 + t) below. */
static void swiglu_run(float *g, const float *u, int n) {
    float t[256];
    for (int j0 = 0; j0 < n; j0 += 256) {
        int m = n - j0 < 256 ? n - j0 : 256;
        for (int j = 0; j < m; j++) t[j] = -fabsf(g[j0 + j]);
        vec_exp_nonpos(t, m);
        for (int j = 0; j < m; j++) {
            float x = g[j0 + j];
            g[j0 + j] = (x >= 0 ? x : x * t[j]) / (1.0f + t[j]) * u[j0 + j];
        }
    }
}

static void cpu_swiglu(float *gate, const float *up, size_t len) {
    /* 4096-value pieces over the threads */
    long long pieces = (long long)((len + 4095) / 4096);
    #pragma omp parallel for schedule(static) if (len >= PAR_MIN)
    for (long long p = 0; p < pieces; p++) {
        size_t j0 = (size_t)p * 4096, m = len - j0 < 4096 ? len - j0 : 4096;
        swiglu_run(gate + j0, up + j0, (int)m);
    }
}

/* The fused forms: the same arithmetic as the calls they stand for (add
 * then rmsnorm row by row; one set of angles a row for q and k), so the
 * results are those calls' bit for bit, in one pass over each row. */
static void cpu_add_rmsnorm(float *x, const float *y, float *out, const float *w, int n, int dim, float eps) {
    #pragma omp parallel for schedule(static) if ((size_t)n * dim >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        float *xi = x + (size_t)i * dim, *oi = out + (size_t)i * dim;
        const float *yi = y + (size_t)i * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) {
            xi[j] += yi[j];
            ss += (double)xi[j] * xi[j];
        }
        float s = (float)(1.0 / sqrt(ss / dim + eps));
        for (int j = 0; j < dim; j++) oi[j] = xi[j] * s * w[j];
    }
}

static void cpu_rope_qk(const rope_ctx *r, float *q, int n_heads, float *k, int n_kv, float *k_pre, int n, int pos0,
                        const int *pos) {
    size_t qd = (size_t)n_heads * r->head_dim, kd = (size_t)n_kv * r->head_dim;
    SKV_ASSERT(r->rope_dim / 2 <= 512);
    #pragma omp parallel for schedule(static) if ((size_t)n * (qd + kd) >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        float cs[512], sn[512];
        if (k_pre) memcpy(k_pre + i * kd, k + i * kd, sizeof(float) * kd);
        rope_angles(r, pos ? pos[i] : pos0 + i, cs, sn);
        rope_rotate(r, q + i * qd, n_heads, cs, sn);
        rope_rotate(r, k + i * kd, n_kv, cs, sn);
    }
}

static void cpu_matmul_swiglu(enum ggml_type tg, const void *Wg, enum ggml_type tu, const void *Wu, int rows, int cols,
                              const float *x, int n, float *gate, float *up, skv_workspace *ws) {
    enum ggml_type t[2] = {tg, tu};
    const void *W[2] = {Wg, Wu};
    int r[2] = {rows, rows};
    float *y[2] = {gate, up};
    cpu_matmul_k(2, t, W, r, cols, x, n, y, ws);
    cpu_swiglu(gate, up, (size_t)n * rows);
}

static void cpu_attend_rows(const float *q, const float *K, const float *V, int n, int hd, int stride, float scale,
                            float *out) {
    /* Scores live on the stack up to 4096 rows; longer sets pay one
     * allocation, small next to the attention over them. */
    float stack[4096];
    float *s = n <= 4096 ? stack : malloc(sizeof(float) * n);
    SKV_ASSERT(s);
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        s[j] = vec_dot(q, K + (size_t)j * stride, hd) * scale;
        if (s[j] > mx) mx = s[j];
    }
    double sum = 0;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    memset(out, 0, sizeof(float) * hd);
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < n; j++) vec_axpy(out, s[j] * inv, V + (size_t)j * stride, hd);
    if (s != stack) free(s);
}

/* Queries per GEMM task of the batched attention (per query head). */
#define QBLOCK 64

/* Softmax of row[0..len) in place (float sums: len <= the context), zeros
 * in [len, L): the causal mask of one query. */
static void softmax_causal(float *row, int len, int L) {
    float mx = vec_max(row, len);
    for (int j = 0; j < len; j++) row[j] -= mx;
    vec_exp_nonpos(row, len);
    float inv = 1.0f / vec_sum(row, len);
    for (int j = 0; j < len; j++) row[j] *= inv;
    if (L > len) memset(row + len, 0, sizeof(float) * (size_t)(L - len));
}

/* The group's scores (g, n) live on the stack up to 8192 floats. K and V
 * rows are each read once and used for every query head of the group while
 * in L1; the exp is the vectorized one of the prefill softmax. */
#define GROUP_MAX 64

/* d values of a 16-bit row (elt: SKV_ELT_F16 or SKV_ELT_BF16) widened to f32 (exactly). */
static inline __attribute__((always_inline)) void widen_row(float *y, const uint16_t *x, int elt, int d) {
    if (elt == SKV_ELT_F16) vec_from_f16(y, x, d);
    else shadowkv_from_bf16(y, x, (size_t)d);
}

/* Rows j..j+3 of X (rows stride apart) as f32: pointers into X, or, for
 * 16-bit rows (elt), into w4 where they are widened. */
static inline __attribute__((always_inline)) void rows4(const void *X, int elt, int j, int stride, int d,
                                                        float w4[4][256], const float *out[4]) {
    for (int r = 0; r < 4; r++) {
        out[r] = (const float *)X + (size_t)(j + r) * stride;
        if (elt != SKV_ELT_F32) {
            widen_row(w4[r], (const uint16_t *)X + (size_t)(j + r) * stride, elt, d);
            out[r] = w4[r];
        }
    }
}
#if defined(__AVX512F__)
/* 16 values of a row at element off: f32, or f16 or bf16 widened (exactly). */
static inline __attribute__((always_inline)) __m512 row16(const void *X, int elt, size_t off) {
    if (elt == SKV_ELT_F32) return _mm512_loadu_ps((const float *)X + off);
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)X + off));
    if (elt == SKV_ELT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* out (G, d) = Σ_j p[a][j]·V[j] for the G heads' weights p (G rows n
 * apart), V rows stride apart, d a multiple of 64. Every element is summed
 * over j in order with a fused multiply-add from zero, as the four-row loop
 * and vec_axpy do, so the same bits; but 64 columns of every head stay in
 * registers over all the rows (G a constant at each call: 4*G accumulators)
 * instead of each head's output being loaded and stored every four rows, and
 * each V row is read once for the group. */
static inline __attribute__((always_inline)) void pv_regs(int G, const float *p, int n, const void *V, int elt,
                                                           int stride, int d, float *out) {
    for (int e0 = 0; e0 < d; e0 += 64) {
        __m512 acc[4][4];
#pragma GCC unroll 4
        for (int a = 0; a < G; a++) acc[a][0] = acc[a][1] = acc[a][2] = acc[a][3] = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            size_t off = (size_t)j * stride + e0;
            __m512 v0 = row16(V, elt, off), v1 = row16(V, elt, off + 16), v2 = row16(V, elt, off + 32),
                   v3 = row16(V, elt, off + 48);
#pragma GCC unroll 4
            for (int a = 0; a < G; a++) {
                __m512 w = _mm512_set1_ps(p[(size_t)a * n + j]);
                acc[a][0] = _mm512_fmadd_ps(w, v0, acc[a][0]);
                acc[a][1] = _mm512_fmadd_ps(w, v1, acc[a][1]);
                acc[a][2] = _mm512_fmadd_ps(w, v2, acc[a][2]);
                acc[a][3] = _mm512_fmadd_ps(w, v3, acc[a][3]);
            }
        }
#pragma GCC unroll 4
        for (int a = 0; a < G; a++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(out + (size_t)a * d + e0 + 16 * c, acc[a][c]);
    }
}
#endif

/* K and V are rows of type elt: f32, half precision (the f16 dense cache)
 * or bf16 (ShadowKV's rows): the same sums in the same order on the widened
 * values, so all give the same bits on data each can represent. Inlined
 * with a constant elt, the branches fold away. */
static inline __attribute__((always_inline)) void attend_group_t(const float *q, int g, const void *K,
                                                                 const void *V, int elt, int n, int d, int stride,
                                                                 float scale, float *out, float *m, float *l) {
    SKV_ASSERT(g >= 1 && g <= GROUP_MAX && n >= 0);
    SKV_ASSERT(elt != SKV_ELT_BF16 || d <= 256);
    int half = elt != SKV_ELT_F32; /* 16-bit rows */
    float stack[8192], mx[GROUP_MAX], sum[GROUP_MAX];
    size_t need = (size_t)g * (n > 0 ? n : 1);
    float *s = need <= 8192 ? stack : malloc(sizeof(float) * need);
    SKV_ASSERT(s);
    for (int a = 0; a < g; a++) mx[a] = -INFINITY;
    /* a half row is widened once for the whole group (row), up to 256 values */
    float row[256];
    int widen = half && d <= 256, j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    /* four rows at a time: each head's four dot products summed across
     * lanes in one go (a quarter of the horizontal adds of vec_dot) */
    if (d % 8 == 0 && d <= 256) {
        float w4[4][256] __attribute__((aligned(32)));
        for (; j + 4 <= n; j += 4) {
            const float *kr[4];
            rows4(K, elt, j, stride, d, w4, kr);
            for (int a = 0; a < g; a++) {
                const float *qa = q + (size_t)a * d;
                __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
                for (int e = 0; e < d; e += 8) {
                    __m256 qv = _mm256_loadu_ps(qa + e);
                    c0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[0] + e), c0);
                    c1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[1] + e), c1);
                    c2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[2] + e), c2);
                    c3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[3] + e), c3);
                }
                float *sa = s + (size_t)a * n + j;
                _mm_storeu_ps(sa, _mm_mul_ps(vec_hsum4x8(c0, c1, c2, c3), _mm_set1_ps(scale)));
                for (int r = 0; r < 4; r++) mx[a] = sa[r] > mx[a] ? sa[r] : mx[a];
            }
        }
    }
#endif
    for (; j < n; j++) {
        const float *k = (const float *)K + (size_t)j * stride;
        const uint16_t *kh = (const uint16_t *)K + (size_t)j * stride;
        if (widen) {
            widen_row(row, kh, elt, d);
            k = row;
        }
        for (int a = 0; a < g; a++) {
            float v = (half && !widen ? vec_dot_h(q + (size_t)a * d, kh, d) : vec_dot(q + (size_t)a * d, k, d)) * scale;
            s[(size_t)a * n + j] = v;
            mx[a] = v > mx[a] ? v : mx[a];
        }
    }
    for (int a = 0; a < g; a++) {
        float *sa = s + (size_t)a * n, acc = 0;
        if (mx[a] != -INFINITY) /* a NaN max leaves NaN, as attend_rows would */
            for (int j = 0; j < n; j++) sa[j] -= mx[a];
        vec_exp_nonpos(sa, n);
        for (int j = 0; j < n; j++) acc += sa[j];
        sum[a] = acc;
    }
    memset(out, 0, sizeof(float) * (size_t)g * d);
    j = 0;
#if defined(__AVX512F__)
    /* groups of up to 4 heads, 64 columns at a time: the outputs held in
     * registers over all the rows */
    if (d % 64 == 0 && d <= 256 && g <= 4) {
        switch (g) {
        case 1: pv_regs(1, s, n, V, elt, stride, d, out); break;
        case 2: pv_regs(2, s, n, V, elt, stride, d, out); break;
        case 3: pv_regs(3, s, n, V, elt, stride, d, out); break;
        default: pv_regs(4, s, n, V, elt, stride, d, out); break;
        }
        j = n;
    }
#endif
#if defined(__AVX2__) && defined(__FMA__)
    /* four rows at a time: each head's output loaded and stored once per four */
    if (j < n && d % 8 == 0 && d <= 256) {
        float w4[4][256] __attribute__((aligned(32)));
        for (; j + 4 <= n; j += 4) {
            const float *vr[4];
            rows4(V, elt, j, stride, d, w4, vr);
            for (int a = 0; a < g; a++) {
                const float *sa = s + (size_t)a * n + j;
                __m256 p0 = _mm256_set1_ps(sa[0]), p1 = _mm256_set1_ps(sa[1]), p2 = _mm256_set1_ps(sa[2]),
                       p3 = _mm256_set1_ps(sa[3]);
                float *oa = out + (size_t)a * d;
                for (int e = 0; e < d; e += 8) {
                    __m256 o = _mm256_fmadd_ps(p0, _mm256_loadu_ps(vr[0] + e), _mm256_loadu_ps(oa + e));
                    o = _mm256_fmadd_ps(p1, _mm256_loadu_ps(vr[1] + e), o);
                    o = _mm256_fmadd_ps(p2, _mm256_loadu_ps(vr[2] + e), o);
                    _mm256_storeu_ps(oa + e, _mm256_fmadd_ps(p3, _mm256_loadu_ps(vr[3] + e), o));
                }
            }
        }
    }
#endif
    for (; j < n; j++) {
        if (widen) {
            widen_row(row, (const uint16_t *)V + (size_t)j * stride, elt, d);
            for (int a = 0; a < g; a++) vec_axpy(out + (size_t)a * d, s[(size_t)a * n + j], row, d);
        } else if (half) {
            const uint16_t *v = (const uint16_t *)V + (size_t)j * stride;
            for (int a = 0; a < g; a++) vec_axpy_h(out + (size_t)a * d, s[(size_t)a * n + j], v, d);
        } else {
            const float *v = (const float *)V + (size_t)j * stride;
            for (int a = 0; a < g; a++) vec_axpy(out + (size_t)a * d, s[(size_t)a * n + j], v, d);
        }
    }
    if (m) {
        for (int a = 0; a < g; a++) { m[a] = mx[a]; l[a] = sum[a]; }
    } else {
        for (int a = 0; a < g; a++) {
            float inv = sum[a] > 0 ? 1.0f / sum[a] : 0.0f;
            for (int e = 0; e < d; e++) out[(size_t)a * d + e] *= inv;
        }
    }
    if (s != stack) free(s);
}

static void attend_group_f(const float *q, int g, const float *K, const float *V, int n, int d, int stride,
                           float scale, float *out, float *m, float *l) {
    attend_group_t(q, g, K, V, SKV_ELT_F32, n, d, stride, scale, out, m, l);
}

static void attend_group_h(const float *q, int g, const uint16_t *K, const uint16_t *V, int n, int d, int stride,
                           float scale, float *out, float *m, float *l) {
    attend_group_t(q, g, K, V, SKV_ELT_F16, n, d, stride, scale, out, m, l);
}

static void cpu_attend_group(const float *q, int g, const void *K, const void *V, int elt, int n, int d, int stride,
                             float scale, float *out, float *m, float *l) {
    if (elt == SKV_ELT_BF16) attend_group_t(q, g, K, V, SKV_ELT_BF16, n, d, stride, scale, out, m, l);
    else if (elt == SKV_ELT_F16) attend_group_h(q, g, K, V, n, d, stride, scale, out, m, l);
    else attend_group_f(q, g, K, V, n, d, stride, scale, out, m, l);
}

static void cpu_attend_merge(int parts, int g, int d, const float *o, const float *m, const float *l, float *out) {
    for (int a = 0; a < g; a++) {
        float mx = -INFINITY;
        for (int p = 0; p < parts; p++) mx = m[(size_t)p * g + a] > mx ? m[(size_t)p * g + a] : mx;
        float *y = out + (size_t)a * d, den = 0;
        memset(y, 0, sizeof(float) * d);
        for (int p = 0; p < parts; p++) {
            float mp = m[(size_t)p * g + a];
            if (!(mp > -INFINITY)) continue; /* an empty part */
            float w = expf(mp - mx);
            den += w * l[(size_t)p * g + a];
            vec_axpy(y, w, o + ((size_t)p * g + a) * d, d);
        }
        float inv = den > 0 ? 1.0f / den : 0.0f;
        for (int e = 0; e < d; e++) y[e] *= inv;
    }
}

/* Flash-decoding on the CPU: each KV head's rows split so every thread gets
 * about two tasks; a task attends its whole GQA group with attend_group,
 * the parts merged by attend_merge. */
static int attend_decode_t(const float *q, int n_heads, int nkv, int hd, const void *K, const void *V, int half,
                           int rows, int stride, size_t head_stride, float *out) {
    int grp = n_heads / nkv;
    float scale = 1.0f / sqrtf((float)hd);
    int parts = (2 * skv_threads() + nkv - 1) / nkv;
    if (parts > rows / 256) parts = rows / 256;
    if (parts < 1) parts = 1;
    int tasks = nkv * parts;
    /* partial results (tasks, grp, hd) and (tasks, grp) x 2: small, per call */
    float *po = NULL;
    if (parts > 1 && !(po = malloc(sizeof(float) * (size_t)tasks * grp * (hd + 2))))
        return skv_error(SKV_ENOMEM, "attention: out of memory for %d partial results", tasks);
    float *pm = po ? po + (size_t)tasks * grp * hd : NULL, *pl = pm ? pm + (size_t)tasks * grp : NULL;
    #pragma omp parallel for schedule(dynamic, 1) if (tasks > 1)
    for (int t = 0; t < tasks; t++) {
        int kh = t / parts, p = t % parts;
        int r0 = (int)((long long)rows * p / parts), r1 = (int)((long long)rows * (p + 1) / parts);
        size_t off = kh * head_stride + (size_t)r0 * stride;
        const float *qg = q + (size_t)kh * grp * hd;
        float *o = parts == 1 ? out + (size_t)kh * grp * hd : po + (size_t)t * grp * hd;
        float *m = parts == 1 ? NULL : pm + (size_t)t * grp, *l = parts == 1 ? NULL : pl + (size_t)t * grp;
        if (half)
            attend_group_h(qg, grp, (const uint16_t *)K + off, (const uint16_t *)V + off, r1 - r0, hd, stride, scale,
                           o, m, l);
        else
            attend_group_f(qg, grp, (const float *)K + off, (const float *)V + off, r1 - r0, hd, stride, scale, o, m,
                           l);
    }
    if (parts > 1)
        for (int kh = 0; kh < nkv; kh++)
            cpu_attend_merge(parts, grp, hd, po + (size_t)kh * parts * grp * hd, pm + (size_t)kh * parts * grp,
                             pl + (size_t)kh * parts * grp, out + (size_t)kh * grp * hd);
    free(po);
    return 0;
}

static int cpu_attend_decode(const float *q, int n_heads, int nkv, int hd, const float *K, const float *V, int rows,
                             int stride, size_t head_stride, float *out) {
    return attend_decode_t(q, n_heads, nkv, hd, K, V, 0, rows, stride, head_stride, out);
}

static int cpu_attend_decode_h(const float *q, int n_heads, int nkv, int hd, const uint16_t *K, const uint16_t *V,
                               int rows, int stride, size_t head_stride, float *out) {
    return attend_decode_t(q, n_heads, nkv, hd, K, V, 1, rows, stride, head_stride, out);
}

/* Batched causal attention, one task per (KV head, block of queries): the
 * block's queries of every query head of the group are packed into one
 * matrix, so the head's keys and values are read once per block for the
 * whole group (two GEMMs), not once per query head. Half-precision K and V
 * (half) are widened into the task's own f32 copy of the rows it reads first
 * (L·d per matrix, 1/(group·64) of the GEMM's work). */
static void attend_causal_t(const float *q, int n, int pos, int nh, int n_kv, int hd, const void *K, const void *V,
                            int half, int stride, size_t head_stride, float *out) {
    int grp = nh / n_kv;
    int qs = nh * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int nqb = (n + QBLOCK - 1) / QBLOCK;
    #pragma omp parallel
    {
        size_t rows = (size_t)QBLOCK * grp;
        float *S = malloc(sizeof(float) * rows * (size_t)(pos + n));
        float *Qp = malloc(sizeof(float) * rows * hd), *Op = malloc(sizeof(float) * rows * hd);
        float *Kw = half ? malloc(sizeof(float) * (size_t)(pos + n) * hd * 2) : NULL;
        SKV_ASSERT(S && Qp && Op && (!half || Kw));
        #pragma omp for schedule(dynamic, 1) collapse(2)
        for (int kh = 0; kh < n_kv; kh++)
            for (int b = 0; b < nqb; b++) {
                int i0 = b * QBLOCK, nb = n - i0 < QBLOCK ? n - i0 : QBLOCK;
                int L = pos + i0 + nb;  /* keys the block's last query sees */
                const float *Kh, *Vh;
                int ld = stride;
                if (half) {
                    const uint16_t *k16 = (const uint16_t *)K + (size_t)kh * head_stride,
                                   *v16 = (const uint16_t *)V + (size_t)kh * head_stride;
                    float *Vw = Kw + (size_t)L * hd;
                    for (int j = 0; j < L; j++) {
                        vec_from_f16(Kw + (size_t)j * hd, k16 + (size_t)j * stride, hd);
                        vec_from_f16(Vw + (size_t)j * hd, v16 + (size_t)j * stride, hd);
                    }
                    Kh = Kw;
                    Vh = Vw;
                    ld = hd;
                } else {
                    Kh = (const float *)K + (size_t)kh * head_stride;
                    Vh = (const float *)V + (size_t)kh * head_stride;
                }
                /* row g * nb + i: query i0 + i of query head kh * grp + g */
                for (int g = 0; g < grp; g++)
                    for (int i = 0; i < nb; i++)
                        memcpy(Qp + ((size_t)g * nb + i) * hd, q + (size_t)(i0 + i) * qs + (size_t)(kh * grp + g) * hd,
                               sizeof(float) * hd);
                sgemm_rm(1, grp * nb, L, hd, scale, Qp, hd, Kh, ld, 0.0f, S, L);
                for (int g = 0; g < grp; g++)
                    for (int i = 0; i < nb; i++)
                        softmax_causal(S + ((size_t)g * nb + i) * L, pos + i0 + i + 1, L);
                sgemm_rm(0, grp * nb, hd, L, 1.0f, S, L, Vh, ld, 0.0f, Op, hd);
                for (int g = 0; g < grp; g++)
                    for (int i = 0; i < nb; i++)
                        memcpy(out + (size_t)(i0 + i) * qs + (size_t)(kh * grp + g) * hd, Op + ((size_t)g * nb + i) * hd,
                               sizeof(float) * hd);
            }
        free(S);
        free(Qp);
        free(Op);
        free(Kw);
    }
}

static void cpu_attend_causal(const float *q, int n, int pos, int nh, int n_kv, int hd, const float *K,
                              const float *V, int stride, size_t head_stride, float *out) {
    attend_causal_t(q, n, pos, nh, n_kv, hd, K, V, 0, stride, head_stride, out);
}

static void cpu_attend_causal_h(const float *q, int n, int pos, int nh, int n_kv, int hd, const uint16_t *K,
                                const uint16_t *V, int stride, size_t head_stride, float *out) {
    attend_causal_t(q, n, pos, nh, n_kv, hd, K, V, 1, stride, head_stride, out);
}

static void cpu_kv_store_h(uint16_t *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src) {
    size_t row = (size_t)n_kv * d;
    for (int t = 0; t < n; t++)
        for (int kh = 0; kh < n_kv; kh++)
            vec_to_f16(cache + (size_t)kh * head_stride + (size_t)(pos + t) * d, src + t * row + (size_t)kh * d, d);
}

/* A batch's decode step: the per-sequence ops in turn, so the results are
 * theirs bit for bit (each attend_decode already spreads its KV heads and
 * parts over the threads). */
static void cpu_kv_store_batch(const skv_kv_seq *seq, int n, int n_kv, int d, const float *k, const float *v) {
    size_t row = (size_t)n_kv * d;
    for (int i = 0; i < n; i++) {
        cpu_kv_store(seq[i].k, seq[i].head_stride, n_kv, d, seq[i].pos, 1, k + i * row);
        cpu_kv_store(seq[i].v, seq[i].head_stride, n_kv, d, seq[i].pos, 1, v + i * row);
    }
}

static void cpu_kv_store_batch_h(const skv_kv_seq *seq, int n, int n_kv, int d, const float *k, const float *v) {
    size_t row = (size_t)n_kv * d;
    for (int i = 0; i < n; i++) {
        cpu_kv_store_h(seq[i].k, seq[i].head_stride, n_kv, d, seq[i].pos, 1, k + i * row);
        cpu_kv_store_h(seq[i].v, seq[i].head_stride, n_kv, d, seq[i].pos, 1, v + i * row);
    }
}

static int attend_decode_batch_t(const skv_kv_seq *seq, int n, int n_heads, int n_kv, int d, int half,
                                 const float *q, float *out) {
    size_t row = (size_t)n_heads * d;
    for (int i = 0; i < n; i++) {
        int rc = attend_decode_t(q + i * row, n_heads, n_kv, d, seq[i].k, seq[i].v, half, seq[i].pos + 1, d,
                                 seq[i].head_stride, out + i * row);
        if (rc) return rc;
    }
    return 0;
}

static int cpu_attend_decode_batch(const skv_kv_seq *seq, int n, int n_heads, int n_kv, int d, const float *q,
                                   float *out) {
    return attend_decode_batch_t(seq, n, n_heads, n_kv, d, 0, q, out);
}

static int cpu_attend_decode_batch_h(const skv_kv_seq *seq, int n, int n_heads, int n_kv, int d, const float *q,
                                     float *out) {
    return attend_decode_batch_t(seq, n, n_heads, n_kv, d, 1, q, out);
}

static void cpu_gather(const uint16_t *src, int rows, int cols, const int *src_idx, int n, void *dst, int dst_elt,
                       const size_t *dst_off, int dst_stride) {
    shadowkv_gather_blocks(src, 2, rows, cols, src_idx, n, dst, dst_elt, dst_off, dst_stride);
}

/* The process's resident bytes from /proc/self/status: field "VmRSS:" or
 * "VmHWM:" (its peak), in kB there; 0 where it cannot be read. */
static size_t proc_status_bytes(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0, n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n)) {
            kb = (size_t)strtoull(line + n, NULL, 10);
            break;
        }
    fclose(f);
    return kb * 1024;
}

/* mem_peak on the CPU: its memory is the process's, so the peak is the
 * kernel's high-water mark of resident memory, which writing "5" to
 * /proc/self/clear_refs sets back to the resident bytes now. Where either
 * cannot be done it returns 0 for both, and a fit counts no peak. */
static _Atomic int g_peak_reset; /* the last reset took */

static size_t cpu_mem_peak(int reset) {
    if (!reset) return g_peak_reset ? proc_status_bytes("VmHWM:") : 0;
    FILE *f = fopen("/proc/self/clear_refs", "w");
    int ok = f && fputs("5", f) >= 0;
    if (f) ok &= fclose(f) == 0;
    size_t now = ok ? proc_status_bytes("VmRSS:") : 0;
    g_peak_reset = now > 0;
    return now;
}

const skv_backend skv_backend_cpu = {
    .name = "cpu",
    .summary = "the reference: "
#ifdef SKV_HAVE_DNNL
               "oneDNN GEMMs, "
#else
               "OpenBLAS GEMMs, "
#endif
               "integer-dot quantized matvec (AVX-512/VNNI, AVX2 or scalar), "
               "LAPACK SVD, OpenMP threads",
    .available = cpu_available,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .copy2d = cpu_copy2d,
    .host_alloc = cpu_alloc,
    .host_alloc_raw = cpu_alloc_raw,
    .host_free = cpu_free,
    .mem_peak = cpu_mem_peak,
    .weight_load = cpu_weight_load,
    .weight_free = cpu_weight_free,
    .kv_store = cpu_kv_store,
    .attend_decode = cpu_attend_decode,
    .kv_store_h = cpu_kv_store_h,
    .attend_decode_h = cpu_attend_decode_h,
    .attend_causal_h = cpu_attend_causal_h,
    .kv_store_batch = cpu_kv_store_batch,
    .attend_decode_batch = cpu_attend_decode_batch,
    .kv_store_batch_h = cpu_kv_store_batch_h,
    .attend_decode_batch_h = cpu_attend_decode_batch_h,
    .matmul = cpu_matmul,
    .matmul_k = cpu_matmul_k,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .swiglu = cpu_swiglu,
    .add_rmsnorm = cpu_add_rmsnorm,
    .rope_qk = cpu_rope_qk,
    .matmul_swiglu = cpu_matmul_swiglu,
    .attend_rows = cpu_attend_rows,
    .attend_group = cpu_attend_group,
    .attend_merge = cpu_attend_merge,
    .attend_causal = cpu_attend_causal,
    .svd = shadowkv_svd_gram,
    .landmarks = shadowkv_landmarks,
    .cos_min = shadowkv_cos_min,
    .score = shadowkv_score_h,
    .topk = shadowkv_topk,
    .gather = cpu_gather,
    .pack_h = shadowkv_pack,
    .sk_gather_chunks = shadowkv_gather_chunks,
    .rebuild = shadowkv_rebuild_to,
    .sk_books = shadowkv_books,
    .sk_gather_misses = shadowkv_gather_misses,
    .sk_rebuild_misses = shadowkv_rebuild_misses,
    .project = shadowkv_project,
    .page_bounds = page_bounds,
    .page_score = page_score,
    .kivi = kivi_group,
};
