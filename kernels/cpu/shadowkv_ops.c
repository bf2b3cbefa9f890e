/* shadowkv_ops.c: the CPU reference of the ShadowKV stages declared in
 * shadowkv_ops.h. The policy (kv_shadowkv.c) strings them together; the
 * tests check each one against a brute force; a CUDA backend checks its
 * kernels against these. */
#include "shadowkv_ops.h"

#include "backend.h"

#include "kmath.h"
#include "skv.h"
#include "vec.h"

#include <errno.h>
#include <fcntl.h>
#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- SVD -------------------------------------------------------------- */

/* LAPACK is column-major, so the row-major K (s, n) is read as the
 * column-major Kᵀ (n, s) = V·Σ·Uᵀ without a transpose: gesdd's left factor
 * (n, m) column-major is Vᵀ (m, n) row-major, and its right factor (m, s)
 * column-major is U (s, m) row-major, with m = min(s, n). */
int shadowkv_svd(const float *K, int s, int n, int r, float *U, float *SVt, float *Vt, float *sv, float *rel_err) {
    if (s < 1 || n < 1 || r < 1 || r > (s < n ? s : n))
        return skv_error(SKV_EINVAL, "svd: rank %d is outside 1..min(%d, %d)", r, s, n);
    int m = s < n ? s : n;
    float *a = malloc(sizeof(float) * (size_t)s * n);
    float *vt = malloc(sizeof(float) * (size_t)n * m);   /* (m, n) row-major */
    float *u = malloc(sizeof(float) * (size_t)s * m);    /* (s, m) row-major */
    if (!a || !vt || !u) {
        free(a); free(vt); free(u);
        return skv_error(SKV_ENOMEM, "svd: out of memory for a (%d, %d) key matrix", s, n);
    }
    memcpy(a, K, sizeof(float) * (size_t)s * n);
    lapack_int info = LAPACKE_sgesdd(LAPACK_COL_MAJOR, 'S', n, s, a, n, sv, vt, n, u, m);
    free(a);
    if (info != 0) {
        free(vt); free(u);
        return skv_error(info < 0 ? SKV_EINVAL : SKV_EUNSUPPORTED,
                         "svd: LAPACKE_sgesdd failed on a (%d, %d) key matrix (info %d%s)", s, n, (int)info,
                         info < 0 ? ": bad argument or NaN in the keys" : ": did not converge");
    }
    for (int t = 0; t < s; t++) memcpy(U + (size_t)t * r, u + (size_t)t * m, sizeof(float) * r);
    for (int i = 0; i < r; i++) {
        const float *row = vt + (size_t)i * n;
        for (int j = 0; j < n; j++) SVt[(size_t)i * n + j] = sv[i] * row[j];
        if (Vt) memcpy(Vt + (size_t)i * n, row, sizeof(float) * n);
    }
    double fro = 0, tail = 0;
    for (size_t i = 0; i < (size_t)s * n; i++) fro += (double)K[i] * K[i];
    for (int i = r; i < m; i++) tail += (double)sv[i] * sv[i];
    *rel_err = fro > 0 ? (float)sqrt(tail / fro) : 0.0f;
    free(vt);
    free(u);
    return 0;
}

/* The Gram route: the top-r right singular vectors of K are the top
 * eigenvectors of G = KᵀK (n, n), and U·Σ = K·V_r. In double: G by one
 * SYRK, its eigen decomposition by SYEVD, K·V_r by one GEMM; then the
 * residual K − K·V_r·V_rᵀ gives the error directly, not from the
 * eigenvalues (their tail is rounding noise once it falls below ε‖K‖²).
 * Cost O(s·n² + n³) against gesdd's larger constant on the tall K, whose
 * full U it then throws away. A singular value under 1e-6·σ₁ gets a zero
 * column of U (its part of K is below float resolution). */
int shadowkv_svd_gram(const float *K, int s, int n, int r, float *U, float *SVt, float *Vt, float *sv, float *rel_err) {
    if (s < 1 || n < 1 || r < 1 || r > (s < n ? s : n))
        return skv_error(SKV_EINVAL, "svd: rank %d is outside 1..min(%d, %d)", r, s, n);
    int m = s < n ? s : n;
    double *kd = malloc(sizeof(double) * (size_t)s * n);
    double *g = malloc(sizeof(double) * (size_t)n * n);
    double *w = malloc(sizeof(double) * (size_t)n);
    double *vr = malloc(sizeof(double) * (size_t)n * r);   /* (n, r): V_r */
    double *us = malloc(sizeof(double) * (size_t)s * r);   /* (s, r): K·V_r = U·Σ */
    int rc = 0;
    if (!kd || !g || !w || !vr || !us) {
        rc = skv_error(SKV_ENOMEM, "svd: out of memory for a (%d, %d) key matrix", s, n);
        goto done;
    }
    double fro = 0;
    for (size_t i = 0; i < (size_t)s * n; i++) {
        kd[i] = K[i];
        fro += kd[i] * kd[i];
    }
    if (!isfinite(fro)) {
        rc = skv_error(SKV_EINVAL, "svd: NaN or infinity in a (%d, %d) key matrix", s, n);
        goto done;
    }
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, n, s, 1.0, kd, n, 0.0, g, n);
    lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', n, g, n, w);
    if (info != 0) {
        rc = skv_error(info < 0 ? SKV_EINVAL : SKV_EUNSUPPORTED,
                       "svd: LAPACKE_dsyevd failed on the (%d, %d) Gram matrix (info %d)", n, n, (int)info);
        goto done;
    }
    /* eigenvalues ascend: singular value i is √λ_{n-1-i} */
    for (int i = 0; i < m; i++) sv[i] = (float)sqrt(w[n - 1 - i] > 0 ? w[n - 1 - i] : 0);
    for (int e = 0; e < n; e++)
        for (int j = 0; j < r; j++) vr[(size_t)e * r + j] = g[(size_t)e * n + (n - 1 - j)];
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, r, n, 1.0, kd, n, vr, r, 0.0, us, r);
    /* residual K − (K·V_r)·V_rᵀ, in place of kd */
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, n, r, -1.0, us, r, vr, r, 1.0, kd, n);
    double res = 0;
    for (size_t i = 0; i < (size_t)s * n; i++) res += kd[i] * kd[i];
    *rel_err = fro > 0 ? (float)sqrt(res / fro) : 0.0f;
    double s1 = sqrt(w[n - 1] > 0 ? w[n - 1] : 0);
    for (int j = 0; j < r; j++) {
        double sj = sqrt(w[n - 1 - j] > 0 ? w[n - 1 - j] : 0);
        double inv = sj > 1e-6 * s1 && sj > 0 ? 1.0 / sj : 0.0;
        for (int t = 0; t < s; t++) U[(size_t)t * r + j] = (float)(us[(size_t)t * r + j] * inv);
        for (int e = 0; e < n; e++) {
            double v = vr[(size_t)e * r + j];
            SVt[(size_t)j * n + e] = (float)(sj * v);
            if (Vt) Vt[(size_t)j * n + e] = (float)v;
        }
    }
done:
    free(kd); free(g); free(w); free(vr); free(us);
    return rc;
}

/* ---- landmarks, cosine minima, outliers -------------------------------- */

void shadowkv_landmarks(const float *K, int stride, int d, int c, int n_chunks, float *lm) {
    float inv = 1.0f / (float)c;
    for (int j = 0; j < n_chunks; j++) {
        float *l = lm + (size_t)j * d;
        memset(l, 0, sizeof(float) * d);
        for (int t = 0; t < c; t++) vec_axpy(l, 1.0f, K + (size_t)(j * c + t) * stride, d);
        vec_scale(l, inv, d);
    }
}

void shadowkv_cos_min(const float *K, int stride, int d, int c, int n_chunks, const float *lm, float *cos_min) {
    for (int j = 0; j < n_chunks; j++) {
        const float *l = lm + (size_t)j * d;
        float ln = sqrtf(vec_dot(l, l, d));
        float mn = INFINITY;
        for (int t = 0; t < c; t++) {
            const float *k = K + (size_t)(j * c + t) * stride;
            float den = ln * sqrtf(vec_dot(k, k, d));
            float cs = den > 0 ? vec_dot(l, k, d) / den : 0.0f;
            if (cs < mn) mn = cs;
        }
        cos_min[j] = mn;
    }
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int shadowkv_outliers(const float *cos_min, int n, int o, int *out, float *scratch) {
    for (int i = 0; i < n; i++) scratch[i] = -cos_min[i];
    int got = shadowkv_topk(scratch, n, o, out);
    qsort(out, got, sizeof(int), cmp_int);
    return got;
}

/* ---- scoring, top-k, ranks --------------------------------------------- */

/* logit (group rows ld apart, n_lm each) = q_g · lm_j * scale for the
 * group's query heads (head g at q + g*d): four landmark rows at a time,
 * each row loaded once for every head of the group, eight dimensions per
 * instruction. A landmark's logit does not depend on where its block of four
 * starts, so ranges that start at multiples of 4 give the bits of one call
 * over them all. */
#if defined(__AVX2__) && defined(__FMA__)
/* Landmarks [0, n_lm) in fours for a group of G query heads, G a constant at
 * each call so the 4*G accumulators stay in registers (indexed by a run-time
 * group they went to the stack, a load and a store around every FMA). Each
 * logit is the same sequence of multiply-adds either way. Returns where it
 * stopped. */
static inline __attribute__((always_inline)) int score_fours(const float *q, int G, int d, const void *lmv, int half,
                                                             int n_lm, float scale, float *logit, size_t ld) {
    /* half (a constant at each call): landmarks in half precision, widened
     * exactly as they load, so the same sums of the same values */
#if defined(__F16C__)
#define LM_LOAD(j, e) (half ? SKV_LOADH((const uint16_t *)lmv + (size_t)(j) * d + (e)) \
                            : _mm256_loadu_ps((const float *)lmv + (size_t)(j) * d + (e)))
#else
#define LM_LOAD(j, e) _mm256_loadu_ps((const float *)lmv + (size_t)(j) * d + (e))
#endif
    int j = 0;
    for (; j + 4 <= n_lm; j += 4) {
        __m256 acc[4][4];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = _mm256_setzero_ps();
        for (int e = 0; e < d; e += 8) {
            __m256 a = LM_LOAD(j, e), b = LM_LOAD(j + 1, e), c = LM_LOAD(j + 2, e), f = LM_LOAD(j + 3, e);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                __m256 qv = _mm256_loadu_ps(q + (size_t)g * d + e);
                acc[g][0] = _mm256_fmadd_ps(qv, a, acc[g][0]);
                acc[g][1] = _mm256_fmadd_ps(qv, b, acc[g][1]);
                acc[g][2] = _mm256_fmadd_ps(qv, c, acc[g][2]);
                acc[g][3] = _mm256_fmadd_ps(qv, f, acc[g][3]);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            _mm_storeu_ps(logit + (size_t)g * ld + j,
                          _mm_mul_ps(vec_hsum4x8(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), _mm_set1_ps(scale)));
    }
#undef LM_LOAD
    return j;
}
#endif

/* The vector kernel's landmarks for a group it takes (1 to 4 heads, d a
 * multiple of 8); returns where the caller's scalar loop starts. Inlined
 * into each caller, so half stays a constant in score_fours. */
static inline __attribute__((always_inline)) int score_vec(const float *q, int group, int d, const void *lm, int half,
                                                           int n_lm, float scale, float *logit, size_t ld) {
#if defined(__AVX2__) && defined(__FMA__)
#if !defined(__F16C__)
    if (half) return 0;
#endif
    if (d % 8 == 0) switch (group) {
        case 1: return score_fours(q, 1, d, lm, half, n_lm, scale, logit, ld);
        case 2: return score_fours(q, 2, d, lm, half, n_lm, scale, logit, ld);
        case 3: return score_fours(q, 3, d, lm, half, n_lm, scale, logit, ld);
        case 4: return score_fours(q, 4, d, lm, half, n_lm, scale, logit, ld);
        default: break;
        }
#else
    (void)q; (void)group; (void)d; (void)lm; (void)half; (void)n_lm; (void)scale; (void)logit; (void)ld;
#endif
    return 0;
}

void shadowkv_score_logits(const float *q, int group, int d, const float *lm, int n_lm, float scale, float *logit,
                           size_t ld) {
    for (int j = score_vec(q, group, d, lm, 0, n_lm, scale, logit, ld); j < n_lm; j++)
        for (int g = 0; g < group; g++)
            logit[(size_t)g * ld + j] = vec_dot(q + (size_t)g * d, lm + (size_t)j * d, d) * scale;
}

void shadowkv_score_logits_h(const float *q, int group, int d, const uint16_t *lm, int n_lm, float scale,
                             float *logit, size_t ld) {
    for (int j = score_vec(q, group, d, lm, 1, n_lm, scale, logit, ld); j < n_lm; j++)
        for (int g = 0; g < group; g++)
            logit[(size_t)g * ld + j] = vec_dot_h(q + (size_t)g * d, lm + (size_t)j * d, d) * scale;
}

void shadowkv_round_f16(float *x, size_t n) {
    uint16_t h[256];
    for (size_t i = 0; i < n; i += 256) {
        int m = n - i < 256 ? (int)(n - i) : 256;
        vec_to_f16(h, x + i, m);
        vec_from_f16(x + i, h, m);
    }
}

void shadowkv_from_bf16(float *y, const uint16_t *x, size_t n) {
    size_t i = 0;
#if defined(__AVX2__)
    for (; i + 8 <= n; i += 8) /* the 16 bits to the top of each f32 */
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i))), 16)));
#endif
    for (; i < n; i++) y[i] = km_bf16_to_f32(x[i]);
}

void shadowkv_pack(const float *x, size_t n, uint16_t *y, int elt) {
    if (elt == SKV_ELT_F16) {
        for (size_t i = 0; i < n; i += 1 << 20)
            vec_to_f16(y + i, x + i, (int)(n - i < (1u << 20) ? n - i : 1u << 20));
        return;
    }
    SKV_ASSERT(elt == SKV_ELT_BF16);
    size_t i = 0;
#if defined(__AVX2__)
    /* km_f32_to_bf16 eight at a time: u + 0x7fff + (bit 16 of u), the top
     * half; a NaN lane keeps its top half with the quiet bit set */
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), q = _mm256_set1_epi32(0x40);
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(
                                                               _mm256_srli_epi32(u, 16), one))), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), q), nan);
        /* the eight 32-bit results (each under 2^16) to 16 bits, in order */
        __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
        _mm_storeu_si128((__m128i *)(y + i), _mm_packus_epi32(lo, hi));
    }
#endif
    for (; i < n; i++) y[i] = km_f32_to_bf16(x[i]);
}

void shadowkv_gather_chunks(const float *src, size_t src_row, size_t src_head, const int *cand, int h, int n_cand,
                            int rows, int d, void *dst, size_t dst_head, int dst_elt) {
    for (int kh = 0; kh < h; kh++)
        for (int i = 0; i < n_cand; i++) {
            const float *s = src + (size_t)kh * src_head + (size_t)cand[(size_t)kh * n_cand + i] * rows * src_row;
            size_t o = (size_t)kh * dst_head + (size_t)i * rows * d;
            for (int t = 0; t < rows; t++) {
                if (dst_elt == SKV_ELT_F32)
                    memcpy((float *)dst + o + (size_t)t * d, s + (size_t)t * src_row, sizeof(float) * d);
                else
                    shadowkv_pack(s + (size_t)t * src_row, (size_t)d, (uint16_t *)dst + o + (size_t)t * d, dst_elt);
            }
        }
}

void shadowkv_softmax_add(float *lg, int n, float *acc) {
    float mx = vec_max(lg, n);
    for (int j = 0; j < n; j++) lg[j] -= mx;
    vec_exp_nonpos(lg, n);
    float inv = 1.0f / vec_sum(lg, n);
    for (int j = 0; j < n; j++) acc[j] += lg[j] * inv;
}

void shadowkv_score_h(const float *q, int nq, size_t q_stride, int group, int d, const uint16_t *lm, int n_lm,
                      float scale, float *tmp, float *score) {
    float *logit = tmp, *acc = tmp + (size_t)group * n_lm; /* (group, n_lm) each */
    memset(acc, 0, sizeof(float) * (size_t)group * n_lm);
    for (int i = 0; i < nq; i++) {
        shadowkv_score_logits_h(q + (size_t)i * q_stride, group, d, lm, n_lm, scale, logit, (size_t)n_lm);
        for (int g = 0; g < group; g++) shadowkv_softmax_add(logit + (size_t)g * n_lm, n_lm, acc + (size_t)g * n_lm);
    }
    shadowkv_group_max(acc, group, n_lm, score);
}

void shadowkv_group_max(const float *gs, int group, int n, float *score) {
    for (int j = 0; j < n; j++) score[j] = -INFINITY;
    for (int g = 0; g < group; g++)
        for (int j = 0; j < n; j++)
            if (gs[(size_t)g * n + j] > score[j]) score[j] = gs[(size_t)g * n + j];
}

/* The top-k order as one 64-bit key, greater = better: the score's bits made
 * to order as unsigned (NaN lowest, -0 as +0, so equal floats get equal high
 * halves) over the complement of the index (equal scores: the lower index
 * wins). Keys are distinct, and the heap compares them directly instead of
 * looking the scores up through their indices. */
static inline uint64_t topk_key(float x, int i) {
    uint32_t u = 0;
    if (!isnan(x)) {
        if (x == 0) x = 0.0f;
        memcpy(&u, &x, sizeof u);
        u = u & 0x80000000u ? ~u : u | 0x80000000u; /* -inf gives 0x007fffff, above NaN's 0 */
    }
    return (uint64_t)u << 32 | (uint32_t)~(uint32_t)i;
}

/* The index a key was made from. */
static inline int topk_index(uint64_t key) { return (int)~(uint32_t)key; }

/* Min-heap of keys: the root is the worst kept. */
static void sift_down(uint64_t *h, int n, int i) {
    uint64_t v = h[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

int shadowkv_topk(const float *score, int n, int k, int *idx) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    uint64_t stack[256], *h = k <= 256 ? stack : malloc(sizeof(uint64_t) * (size_t)k);
    SKV_ASSERT(h);
    for (int i = 0; i < k; i++) h[i] = topk_key(score[i], i);
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
    /* Every index from k on is past all the heap's, so it beats the root
     * (the worst kept) only by a greater score, or by being a number when
     * the root is NaN: one float compare a candidate on the usual path. */
    float worst = score[topk_index(h[0])];
    for (int i = k; i < n; i++) {
        float x = score[i];
        if (x > worst || (isnan(worst) && !isnan(x))) {
            h[0] = topk_key(x, i);
            sift_down(h, k, 0);
            worst = score[topk_index(h[0])];
        }
    }
    /* Pop the worst to the back: the array ends best first. */
    for (int m = k - 1; m > 0; m--) {
        uint64_t t = h[0]; h[0] = h[m]; h[m] = t;
        sift_down(h, m, 0);
    }
    for (int i = 0; i < k; i++) idx[i] = topk_index(h[i]);
    if (h != stack) free(h);
    return k;
}

void shadowkv_rank(const float *score, int n, int *rank, int *order) {
    int got = shadowkv_topk(score, n, n, order);
    for (int i = 0; i < got; i++) rank[order[i]] = i;
}

/* ---- RoPE tables and key rebuild ---------------------------------------- */

void shadowkv_rope_table(const rope_ctx *rope, int n_pos, float *cs, float *sn) {
    size_t half = rope->rope_dim / 2;
    for (int p = 0; p < n_pos; p++) rope_angles(rope, p, cs + p * half, sn + p * half);
}

void shadowkv_rope_rows(const rope_ctx *rope, const float *cs, const float *sn, float *x, int n, int pos0) {
    size_t half = rope->rope_dim / 2;
    for (int t = 0; t < n; t++)
        rope_rotate(rope, x + (size_t)t * rope->head_dim, 1, cs + (size_t)(pos0 + t) * half,
                    sn + (size_t)(pos0 + t) * half);
}

/* Value i of U, whose values are ub bytes wide (2: bf16, 4: f32), as f32
 * (exact). The rebuilds below are inlined into shadowkv_rebuild_w with a
 * constant ub, so each width gets its own loop and no branch in it. */
static inline float u_at(const void *U, int ub, size_t i) {
    return ub == 4 ? ((const float *)U)[i] : km_bf16_to_f32(((const uint16_t *)U)[i]);
}

/* o (d) = u (r) · svt (r, d), every element summed over j in order with a
 * fused multiply-add (as vec_axpy into zeros would), but held in registers
 * 64 columns at a time instead of reloaded from o for every j; the columns
 * past the last multiple of 8 without fusing, as vec_axpy's tail. */
static inline __attribute__((always_inline)) void rebuild_row(const void *u, int ub, int r, const float *svt, int d,
                                                              float *o) {
    int e = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; e + 64 <= d; e += 64) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int j = 0; j < r; j++) {
            __m256 b = _mm256_set1_ps(u_at(u, ub, j));
            const float *s = svt + (size_t)j * d + e;
            a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(s), a0);
            a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(s + 8), a1);
            a2 = _mm256_fmadd_ps(b, _mm256_loadu_ps(s + 16), a2);
            a3 = _mm256_fmadd_ps(b, _mm256_loadu_ps(s + 24), a3);
            a4 = _mm256_fmadd_ps(b, _mm256_loadu_ps(s + 32), a4);
            a5 = _mm256_fmadd_ps(b, _mm256_loadu_ps(s + 40), a5);
            a6 = _mm256_fmadd_ps(b, _mm256_loadu_ps(s + 48), a6);
            a7 = _mm256_fmadd_ps(b, _mm256_loadu_ps(s + 56), a7);
        }
        _mm256_storeu_ps(o + e, a0); _mm256_storeu_ps(o + e + 8, a1);
        _mm256_storeu_ps(o + e + 16, a2); _mm256_storeu_ps(o + e + 24, a3);
        _mm256_storeu_ps(o + e + 32, a4); _mm256_storeu_ps(o + e + 40, a5);
        _mm256_storeu_ps(o + e + 48, a6); _mm256_storeu_ps(o + e + 56, a7);
    }
    for (; e + 8 <= d; e += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int j = 0; j < r; j++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(u_at(u, ub, j)), _mm256_loadu_ps(svt + (size_t)j * d + e), a);
        _mm256_storeu_ps(o + e, a);
    }
#endif
    for (; e < d; e++) {
        float a = 0;
        for (int j = 0; j < r; j++) a += u_at(u, ub, j) * svt[(size_t)j * d + e];
        o[e] = a;
    }
}

#if defined(__AVX512F__)
/* RoPE of one 64-wide row held in four registers (x[0..3], columns 16c..),
 * from its position's table rows cs and sn (32 each): each product rounded,
 * then added or subtracted, the bits of rope_rotate. */
static inline void rope_regs_64(__m512 x[4], const float *cs, const float *sn, rope_mode mode) {
    if (mode == ROPE_ADJACENT) {
        const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        for (int c = 0; c < 4; c++) {
            __m512 cd = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(cs + 8 * c)));
            __m512 sd = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(sn + 8 * c)));
            __m512 p = _mm512_mul_ps(x[c], cd), q = _mm512_mul_ps(_mm512_permute_ps(x[c], 0xB1), sd);
            /* even lanes a*cos - b*sin, odd lanes b*cos + a*sin */
            x[c] = _mm512_mask_add_ps(_mm512_sub_ps(p, q), (__mmask16)0xAAAA, p, q);
        }
    } else {
        for (int c = 0; c < 2; c++) {
            __m512 co = _mm512_loadu_ps(cs + 16 * c), si = _mm512_loadu_ps(sn + 16 * c);
            __m512 a = x[c], b = x[c + 2];
            x[c] = _mm512_sub_ps(_mm512_mul_ps(a, co), _mm512_mul_ps(b, si));
            x[c + 2] = _mm512_add_ps(_mm512_mul_ps(a, si), _mm512_mul_ps(b, co));
        }
    }
}

/* Four rows of d = 64 at once in 512-bit registers: each svt row loaded once
 * for the four; every element still summed over j in order with a fused
 * multiply-add, so the bits of rebuild_row. With tables (cs, sn: the first
 * row's, 32 a row) the rows are rotated in the registers before the store,
 * with the bits of rope_rotate on the stored rows. */
static inline __attribute__((always_inline)) void rebuild_4x64(const void *U, int ub, int r, const float *svt,
                                                               float *o, const float *cs, const float *sn,
                                                               rope_mode mode) {
    /* the loops over the four rows unrolled, so the 16 accumulators stay in
     * registers (rolled, GCC kept them on the stack) */
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = _mm512_setzero_ps();
    for (int j = 0; j < r; j++) {
        const float *s = svt + (size_t)j * 64;
        __m512 s0 = _mm512_loadu_ps(s), s1 = _mm512_loadu_ps(s + 16), s2 = _mm512_loadu_ps(s + 32),
               s3 = _mm512_loadu_ps(s + 48);
        /* held in registers for the four rows: left to itself, GCC folds
         * the loads into the FMAs, four loads of each where one will do, and
         * the loads, not the FMAs, set the pace */
        __asm__("" : "+v"(s0), "+v"(s1), "+v"(s2), "+v"(s3));
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512 b = _mm512_set1_ps(u_at(U, ub, (size_t)i * r + j));
            acc[i][0] = _mm512_fmadd_ps(b, s0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(b, s1, acc[i][1]);
            acc[i][2] = _mm512_fmadd_ps(b, s2, acc[i][2]);
            acc[i][3] = _mm512_fmadd_ps(b, s3, acc[i][3]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        if (cs) rope_regs_64(acc[i], cs + (size_t)i * 32, sn + (size_t)i * 32, mode);
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + (size_t)i * 64 + c * 16, acc[i][c]);
    }
}
#endif

/* The rows [t0, t0+n) of shadowkv_rebuild_w before RoPE, or rotated by
 * the AVX-512 path; returns how many (the first) are rotated. */
static inline __attribute__((always_inline)) int rebuild_rows(const void *U, int ub, int r, const float *svt, int d,
                                                              int t0, int n, const rope_ctx *rope, const float *cs,
                                                              const float *sn, float *out) {
    int i = 0, rot = 0; /* rows [0, rot) are already rotated */
#if defined(__AVX512F__)
    if (d == 64) {
        /* RoPE in the registers when the tables cover the whole row */
        int fused = cs && rope->rope_dim == 64 && rope->head_dim == 64;
        for (; i + 4 <= n; i += 4)
            rebuild_4x64((const char *)U + (size_t)(t0 + i) * r * ub, ub, r, svt, out + (size_t)i * d,
                         fused ? cs + (size_t)(t0 + i) * 32 : NULL, fused ? sn + (size_t)(t0 + i) * 32 : NULL,
                         rope->mode);
        if (fused) rot = i;
    }
#else
    (void)rope, (void)cs, (void)sn;
#endif
    for (; i < n; i++) rebuild_row((const char *)U + (size_t)(t0 + i) * r * ub, ub, r, svt, d, out + (size_t)i * d);
    return rot;
}

void shadowkv_rebuild(const uint16_t *U, int r, const float *svt, int d, int t0, int n, const rope_ctx *rope,
                      const float *cs, const float *sn, float *out) {
    shadowkv_rebuild_w(U, 2, r, svt, d, t0, n, rope, cs, sn, out);
}

void shadowkv_rebuild_w(const void *U, int u_bytes, int r, const float *svt, int d, int t0, int n,
                        const rope_ctx *rope, const float *cs, const float *sn, float *out) {
    SKV_ASSERT(u_bytes == 2 || u_bytes == 4);
    int rot = u_bytes == 4 ? rebuild_rows(U, 4, r, svt, d, t0, n, rope, cs, sn, out)
                           : rebuild_rows(U, 2, r, svt, d, t0, n, rope, cs, sn, out);
    if (cs) shadowkv_rope_rows(rope, cs, sn, out + (size_t)rot * d, n - rot, t0 + rot);
    else
        for (int i = 0; i < n; i++) rope_apply(rope, out + (size_t)i * d, 1, t0 + i);
}

void shadowkv_rebuild_to(const uint16_t *U, int r, const float *svt, int d, int t0, int n, const rope_ctx *rope,
                         const float *cs, const float *sn, void *out, int out_elt) {
    if (out_elt == SKV_ELT_F32) {
        shadowkv_rebuild(U, r, svt, d, t0, n, rope, cs, sn, out);
        return;
    }
    SKV_ASSERT(out_elt == SKV_ELT_BF16 && d <= 256);
    /* four rows at a time in f32 (the AVX-512 path's block), then rounded */
    float tmp[4 * 256];
    for (int i = 0; i < n; i += 4) {
        int m = n - i < 4 ? n - i : 4;
        shadowkv_rebuild(U, r, svt, d, t0 + i, m, rope, cs, sn, tmp);
        shadowkv_pack(tmp, (size_t)m * d, (uint16_t *)out + (size_t)i * d, SKV_ELT_BF16);
    }
}

void shadowkv_rebuild_prefetch(const void *U, int u_bytes, int r, int t0, int n, const rope_ctx *rope,
                               const float *cs, const float *sn) {
    vec_prefetch((const char *)U + (size_t)t0 * r * u_bytes, (size_t)u_bytes * n * r);
    if (!cs) return;
    size_t half = rope->rope_dim / 2;
    vec_prefetch(cs + (size_t)t0 * half, sizeof(float) * (size_t)n * half);
    vec_prefetch(sn + (size_t)t0 * half, sizeof(float) * (size_t)n * half);
}

void shadowkv_project(const float *Vt, int r, int n, const float *x, float *y, float *coef) {
    for (int i = 0; i < r; i++) coef[i] = vec_dot(Vt + (size_t)i * n, x, n);
    memset(y, 0, sizeof(float) * n);
    for (int i = 0; i < r; i++) vec_axpy(y, coef[i], Vt + (size_t)i * n, n);
}

/* ---- chunk cache -------------------------------------------------------- */

int shadowkv_cache_init(shadowkv_cache *c, int n_slots, int n_ids) {
    memset(c, 0, sizeof *c);
    c->n_slots = n_slots;
    c->n_ids = n_ids;
    c->slot_id = skv_malloc(sizeof(int) * (size_t)n_slots);
    c->where = skv_malloc(sizeof(int) * (size_t)n_ids);
    c->stamp = skv_calloc((size_t)n_slots, sizeof(unsigned));
    if (!c->slot_id || !c->where || !c->stamp) {
        shadowkv_cache_free(c);
        return skv_error(SKV_ENOMEM, "chunk cache: out of memory for %d slots", n_slots);
    }
    for (int i = 0; i < n_slots; i++) c->slot_id[i] = -1;
    for (int i = 0; i < n_ids; i++) c->where[i] = -1;
    return 0;
}

void shadowkv_cache_free(shadowkv_cache *c) {
    free(c->slot_id);
    free(c->where);
    free(c->stamp);
    memset(c, 0, sizeof *c);
}

int shadowkv_cache_update(shadowkv_cache *c, const int *sel, int k, int *slot_of, int *miss) {
    SKV_ASSERT(k <= c->n_slots);
    for (int i = 0; i < k; i++) SKV_ASSERT(sel[i] >= 0 && sel[i] < c->n_ids);
    int n_miss = km_cache_update(c->n_slots, c->slot_id, c->where, c->stamp, &c->epoch, sel, k, slot_of, miss);
    c->hits += (uint64_t)(k - n_miss);
    c->misses += (uint64_t)n_miss;
    return n_miss;
}

/* ---- a layer's decode books, misses and rebuild for all KV heads at once -- */

void shadowkv_books(int h, int k, int n_cand, const int *sel, int *slot_id, int *where, unsigned *stamp,
                    unsigned *epoch, int *slot_of, int *miss, int *n_miss) {
    for (int kh = 0; kh < h; kh++)
        n_miss[kh] = km_cache_update(k, slot_id + (size_t)kh * k, where + (size_t)kh * n_cand, stamp + (size_t)kh * k,
                                     epoch + kh, sel + (size_t)kh * k, k, slot_of + (size_t)kh * k,
                                     miss + (size_t)kh * k);
}


void shadowkv_gather_misses(const uint16_t *store, int c, int d, int h, int k, int n_cand, size_t blk0,
                            const int *sel, const int *slot_of, const int *miss, const int *n_miss,
                            uint16_t *const *V, int row_slot) {
    size_t blk = (size_t)c * d;
    for (int kh = 0; kh < h; kh++)
        for (int m = 0; m < n_miss[kh]; m++) {
            int i = miss[(size_t)kh * k + m];
            const uint16_t *src = store + (blk0 + (size_t)kh * n_cand + sel[(size_t)kh * k + i]) * blk;
            memcpy(V[kh] + (size_t)(row_slot + slot_of[(size_t)kh * k + i] * c) * d, src, sizeof(uint16_t) * blk);
        }
}

void shadowkv_rebuild_misses(const uint16_t *U, int r, const float *SVt, int d, int c, int h, int k, int n_cand,
                             const int *cand, const int *sel, const int *slot_of, const int *miss, const int *n_miss,
                             const rope_ctx *rope, const float *cs, const float *sn, uint16_t *const *K,
                             int row_slot) {
    for (int kh = 0; kh < h; kh++)
        for (int m = 0; m < n_miss[kh]; m++) {
            int i = miss[(size_t)kh * k + m];
            int chunk = cand[(size_t)kh * n_cand + sel[(size_t)kh * k + i]];
            shadowkv_rebuild_to(U, r, SVt + (size_t)kh * r * d, d, chunk * c, c, rope, cs, sn,
                                K[kh] + (size_t)(row_slot + slot_of[(size_t)kh * k + i] * c) * d, SKV_ELT_BF16);
        }
}

/* ---- a batched decode step (the CPU twins of the sk_step_* ops) --------- */

void shadowkv_step_append(const sk_step *st, float *q, const float *k, const float *v) {
    int d = st->d;
    SKV_ASSERT(!st->rope_new || st->rope->rope_dim / 2 <= 512);
    for (int j = 0; j < st->n_jobs; j++) {
        const sk_job *J = &st->jobs[j];
        const int *sq = st->seq + 2 * J->gi;
        size_t off = (size_t)sq[0] * st->kvd + (size_t)J->kh * d, row = (size_t)(J->row_gen + sq[1]) * d;
        float key[SK_STEP_D_MAX];
        SKV_ASSERT(d <= SK_STEP_D_MAX);
        memcpy(key, J->key ? J->key : k + off, sizeof(float) * d);
        if (st->rope_new) { /* rope_qk's angles and rotation, at the row's position */
            float cs[512], sn[512];
            rope_angles(st->rope, J->s + sq[1], cs, sn);
            rope_rotate(st->rope, q + (size_t)sq[0] * st->qd + (size_t)J->kh * st->group * d, st->group, cs, sn);
            if (!J->key) rope_rotate(st->rope, key, 1, cs, sn);
        }
        shadowkv_pack(key, (size_t)d, J->K + row, SKV_ELT_BF16);
        shadowkv_pack(v + off, (size_t)d, J->V + row, SKV_ELT_BF16);
    }
}

void shadowkv_step_logits(const sk_step *st, const float *q) {
    for (int j = 0; j < st->n_jobs; j++) {
        const sk_job *J = &st->jobs[j];
        const float *qj = q + (size_t)st->seq[2 * J->gi] * st->qd + (size_t)J->kh * st->group * st->d;
        shadowkv_score_logits_h(qj, st->group, st->d, J->lm, J->n_cand, 1.0f / sqrtf((float)st->d),
                                st->lg + J->lg, (size_t)J->n_cand);
    }
}

void shadowkv_step_stats(const sk_step *st) {
    for (int j = 0; j < st->n_jobs; j++) {
        const sk_job *J = &st->jobs[j];
        size_t n = (size_t)J->n_cand;
        float *logit = st->lg + J->lg, *acc = logit + (size_t)st->group * n; /* shadowkv_score_h's tmp */
        memset(acc, 0, sizeof(float) * st->group * n);
        for (int g = 0; g < st->group; g++) shadowkv_softmax_add(logit + g * n, (int)n, acc + g * n);
        shadowkv_group_max(acc, st->group, (int)n, J->score);
    }
}

void shadowkv_step_topk(const sk_step *st) {
    for (int j = 0; j < st->n_jobs; j++) shadowkv_topk(st->jobs[j].score, st->jobs[j].n_cand, st->jobs[j].k, st->jobs[j].sel);
}

void shadowkv_step_books(const sk_step *st) {
    for (int j = 0; j < st->n_jobs; j++) {
        const sk_job *J = &st->jobs[j];
        SKV_ASSERT(J->k <= J->n_cand);
        *J->n_miss = km_cache_update(J->k, J->slot_id, J->where, J->stamp, J->epoch, J->sel, J->k, J->slot_of, J->miss);
    }
}

void shadowkv_step_select(const sk_step *st) {
    if (!st->scored) shadowkv_step_stats(st);
    shadowkv_step_topk(st);
    shadowkv_step_books(st);
}

void shadowkv_step_fetch(const sk_step *st) {
    for (int j = 0; j < st->n_jobs; j++) {
        const sk_job *J = &st->jobs[j];
        size_t blk = (size_t)J->c * st->d;
        for (int m = 0; m < *J->n_miss; m++) {
            int i = J->miss[m];
            memcpy(J->V + (size_t)(J->row_slot + J->slot_of[i] * J->c) * st->d, J->store + (size_t)J->sel[i] * blk,
                   sizeof(uint16_t) * blk);
        }
    }
}

void shadowkv_step_rebuild(const sk_step *st) {
    for (int j = 0; j < st->n_jobs; j++) {
        const sk_job *J = &st->jobs[j];
        for (int m = 0; m < *J->n_miss; m++) {
            int i = J->miss[m];
            shadowkv_rebuild_to(J->U, J->r, J->svt, st->d, J->cand[J->sel[i]] * J->c, J->c, st->rope, J->cs, J->sn,
                                J->K + (size_t)(J->row_slot + J->slot_of[i] * J->c) * st->d, SKV_ELT_BF16);
        }
    }
}

void shadowkv_step_attend(const sk_step *st, const float *q, float *out) {
    int d = st->d;
    float scale = 1.0f / sqrtf((float)d);
    for (int j = 0; j < st->n_jobs; j++) {
        const sk_job *J = &st->jobs[j];
        const int *sq = st->seq + 2 * J->gi;
        int rows = J->row_gen + sq[1] + 1;
        float kr[SK_STEP_D_MAX], vr[SK_STEP_D_MAX];
        SKV_ASSERT(d <= SK_STEP_D_MAX);
        for (int g = 0; g < st->group; g++) {
            size_t off = (size_t)sq[0] * st->qd + (size_t)(J->kh * st->group + g) * d;
            const float *qg = q + off;
            float *o = out + off, mx = -INFINITY;
            for (int t = 0; t < rows; t++) {
                shadowkv_from_bf16(kr, J->K + (size_t)t * d, (size_t)d);
                float s = vec_dot(qg, kr, d) * scale;
                if (s > mx) mx = s;
            }
            double l = 0;
            memset(o, 0, sizeof(float) * d);
            for (int t = 0; t < rows; t++) {
                shadowkv_from_bf16(kr, J->K + (size_t)t * d, (size_t)d);
                shadowkv_from_bf16(vr, J->V + (size_t)t * d, (size_t)d);
                float w = expf(vec_dot(qg, kr, d) * scale - mx);
                l += w;
                vec_axpy(o, w, vr, d);
            }
            for (int e = 0; e < d; e++) o[e] = l > 0 ? (float)(o[e] / l) : 0.0f;
        }
    }
}

/* ---- offload store ------------------------------------------------------ */

/* The file tier: a new file of bytes at path, mapped shared, unlinked. */
static int store_map_file(shadowkv_store *st, const char *path, size_t bytes) {
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            return skv_error(SKV_EINVAL, "offload file %s exists; skv makes its own and will not overwrite it", path);
        return skv_error(SKV_EIO, "offload file %s: %s", path, strerror(errno));
    }
    int rc = 0;
    size_t len = bytes ? bytes : 1;
    /* posix_fallocate reserves the blocks now, so a full disk is an error
     * here and not a SIGBUS at the first write. */
    int err = posix_fallocate(fd, 0, (off_t)len);
    if (err == EINVAL || err == EOPNOTSUPP) err = ftruncate(fd, (off_t)len) ? errno : 0;
    if (err) {
        rc = skv_error(SKV_EIO, "offload file %s: cannot make it %.1f MiB: %s", path,
                       len / 1048576.0, strerror(err));
    } else {
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            rc = skv_error(SKV_EIO, "offload file %s: cannot map %.1f MiB: %s", path, len / 1048576.0,
                           strerror(errno));
        } else {
            st->data = p;
            st->mapped = 1;
            /* fetches pick scattered chunks: no read-ahead */
            madvise(p, len, MADV_RANDOM);
        }
    }
    unlink(path);
    close(fd);
    return rc;
}

int shadowkv_store_init(shadowkv_store *st, int n_blocks, int rows, int cols, int elt_bytes, const char *path) {
    SKV_ASSERT(elt_bytes == 2 || elt_bytes == 4);
    memset(st, 0, sizeof *st);
    st->n_blocks = n_blocks;
    st->rows = rows;
    st->cols = cols;
    st->elt_bytes = elt_bytes;
    size_t bytes = shadowkv_store_bytes(st);
    if (path && *path) return store_map_file(st, path, bytes);
    st->data = skv_malloc(bytes);
    if (!st->data)
        return skv_error(SKV_ENOMEM, "offload store: out of memory for %d blocks of (%d, %d)", n_blocks, rows, cols);
    return 0;
}

void shadowkv_store_adopt(shadowkv_store *st, int n_blocks, int rows, int cols, uint16_t *data,
                          void (*release)(void *)) {
    memset(st, 0, sizeof *st);
    st->n_blocks = n_blocks;
    st->rows = rows;
    st->cols = cols;
    st->elt_bytes = 2;
    st->data = data;
    st->release = release;
}

void shadowkv_store_free(shadowkv_store *st) {
    if (st->release) {
        if (st->data) st->release(st->data);
    } else if (st->mapped) {
        size_t bytes = shadowkv_store_bytes(st);
        munmap(st->data, bytes ? bytes : 1);
    } else {
        free(st->data);
    }
    memset(st, 0, sizeof *st);
}

size_t shadowkv_store_bytes(const shadowkv_store *st) {
    return (size_t)st->elt_bytes * st->n_blocks * st->rows * st->cols;
}

void shadowkv_store_put(shadowkv_store *st, int b, const float *src, int src_stride) {
    SKV_ASSERT(b >= 0 && b < st->n_blocks);
    size_t blk = (size_t)st->rows * st->cols;
    for (int i = 0; i < st->rows; i++) {
        const float *s = src + (size_t)i * src_stride;
        if (st->elt_bytes == 4)
            memcpy((float *)st->data + b * blk + (size_t)i * st->cols, s, sizeof(float) * st->cols);
        else
            shadowkv_pack(s, (size_t)st->cols, (uint16_t *)st->data + b * blk + (size_t)i * st->cols, SKV_ELT_BF16);
    }
}

void shadowkv_store_count(shadowkv_store *st, int n) {
    __atomic_fetch_add(&st->n_fetch, (uint64_t)n, __ATOMIC_RELAXED);
    __atomic_fetch_add(&st->fetch_bytes, (uint64_t)st->elt_bytes * n * st->rows * st->cols, __ATOMIC_RELAXED);
}

void shadowkv_store_fetch(shadowkv_store *st, int b, float *dst, int dst_stride) {
    SKV_ASSERT(b >= 0 && b < st->n_blocks);
    size_t off = 0;
    shadowkv_gather_blocks(st->data, st->elt_bytes, st->rows, st->cols, &b, 1, dst, SKV_ELT_F32, &off, dst_stride);
    __atomic_fetch_add(&st->n_fetch, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&st->fetch_bytes, (uint64_t)st->elt_bytes * st->rows * st->cols, __ATOMIC_RELAXED);
}

/* One row of n values, eb bytes wide, to dst_elt: f32 copied or bf16
 * widened to f32, or bf16 copied. */
static void row_to(void *y, int dst_elt, const void *x, int eb, size_t n) {
    if (dst_elt == SKV_ELT_BF16) memcpy(y, x, sizeof(uint16_t) * n);
    else if (eb == 4) memcpy(y, x, sizeof(float) * n);
    else shadowkv_from_bf16(y, x, n);
}

void shadowkv_gather_blocks(const void *src, int elt_bytes, int rows, int cols, const int *src_idx, int n,
                            void *dst, int dst_elt, const size_t *dst_off, int dst_stride) {
    SKV_ASSERT(elt_bytes == 2 || elt_bytes == 4);
    SKV_ASSERT(dst_elt == SKV_ELT_F32 || (dst_elt == SKV_ELT_BF16 && elt_bytes == 2));
    size_t db = dst_elt == SKV_ELT_BF16 ? 2 : 4;
    size_t blk = (size_t)rows * cols, bb = blk * elt_bytes;
    const char *base = src;
    /* blocks sit at random places: each asked for two blocks ahead of its
     * copy, so the copies do not wait for memory one after the other */
    for (int i = 0; i < n && i < 2; i++) vec_prefetch(base + (size_t)src_idx[i] * bb, bb);
    for (int i = 0; i < n; i++) {
        if (i + 2 < n) vec_prefetch(base + (size_t)src_idx[i + 2] * bb, bb);
        const char *s = base + (size_t)src_idx[i] * bb;
        char *d = (char *)dst + dst_off[i] * db;
        if (dst_stride == cols) {
            row_to(d, dst_elt, s, elt_bytes, blk);
        } else {
            for (int r = 0; r < rows; r++)
                row_to(d + (size_t)r * dst_stride * db, dst_elt, s + (size_t)r * cols * elt_bytes, elt_bytes,
                       (size_t)cols);
        }
    }
}
