/* test_shadowkv_ops.c: each ShadowKV stage (engine/shadowkv_ops.c) against a
 * double-precision brute force on random and real-shaped data: SVD error
 * bookkeeping, low-rank recovery, landmarks and cosine minima, outliers,
 * landmark scoring with the GQA max, top-k with ties, RoPE on rebuilt keys,
 * the chunk cache's hits and misses, and the offload store's counters. */
#include "shadowkv_ops.h"
#include "backend.h"
#include "kmath.h"
#include "skv.h"
#include "testhelp.h"
#include "vec.h"

#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *rnd(size_t n) {
    float *x = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = frand();
    return x;
}

/* K (s, n) = A (s, rk) · B (rk, n) plus noise of the given amplitude. */
static float *low_rank(int s, int n, int rk, float noise) {
    float *A = rnd((size_t)s * rk), *B = rnd((size_t)rk * n), *K = malloc(sizeof(float) * s * n);
    for (int i = 0; i < s; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int t = 0; t < rk; t++) acc += (double)A[i * rk + t] * B[t * n + j];
            K[i * n + j] = (float)acc + noise * frand();
        }
    free(A);
    free(B);
    return K;
}

/* ‖K − U·SVt‖_F / ‖K‖_F in double. */
static double direct_err(const float *K, const float *U, const float *SVt, int s, int n, int r) {
    double num = 0, den = 0;
    for (int i = 0; i < s; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int t = 0; t < r; t++) acc += (double)U[i * r + t] * SVt[t * n + j];
            double e = K[i * n + j] - acc;
            num += e * e;
            den += (double)K[i * n + j] * K[i * n + j];
        }
    return sqrt(num / den);
}

/* Runs the SVD at rank r; returns the reported error and checks it against
 * the spectrum and the direct reconstruction. */
static float svd_check(const char *what, const float *K, int s, int n, int r, double tol) {
    int m = s < n ? s : n;
    float *U = malloc(sizeof(float) * s * r), *SVt = malloc(sizeof(float) * r * n), *Vt = malloc(sizeof(float) * r * n);
    float *sv = malloc(sizeof(float) * m), err = -1;
    char msg[256];
    int rc = shadowkv_svd(K, s, n, r, U, SVt, Vt, sv, &err);
    snprintf(msg, sizeof msg, "svd %s (%dx%d, rank %d) succeeds", what, s, n, r);
    test_cond(msg, rc == 0);
    if (rc) goto done;
    double fro = 0, tail = 0;
    for (int i = 0; i < s * n; i++) fro += (double)K[i] * K[i];
    for (int i = r; i < m; i++) tail += (double)sv[i] * sv[i];
    int desc = 1;
    for (int i = 1; i < m; i++) desc &= sv[i] <= sv[i - 1] && sv[i] >= 0;
    double de = direct_err(K, U, SVt, s, n, r);
    snprintf(msg, sizeof msg, "svd %s: spectrum descending, error %.3g = sqrt(sum of discarded sv^2)/||K||", what,
             err);
    test_cond(msg, desc && fabs(err - sqrt(tail / fro)) <= 1e-6 * (1 + err));
    snprintf(msg, sizeof msg, "svd %s: reported error %.4g matches ||K-U*SVt||/||K|| = %.4g", what, err, de);
    test_cond(msg, fabs(err - de) <= tol);
    double orth = 0, scaled = 0;
    for (int a = 0; a < r; a++)
        for (int b = 0; b < r; b++) {
            double acc = 0;
            for (int i = 0; i < s; i++) acc += (double)U[i * r + a] * U[i * r + b];
            orth = fmax(orth, fabs(acc - (a == b)));
        }
    for (int a = 0; a < r; a++)
        for (int j = 0; j < n; j++) scaled = fmax(scaled, fabs(SVt[a * n + j] - sv[a] * Vt[a * n + j]));
    snprintf(msg, sizeof msg, "svd %s: U orthonormal (%.1e), SVt = diag(sv)*Vt", what, orth);
    test_cond(msg, orth < 1e-4 && scaled <= 1e-6 * sv[0]);
done:
    free(U); free(SVt); free(Vt); free(sv);
    return err;
}

/* The Gram route against the full SVD on the same K at rank r: the error
 * it reports is its own residual, within 1e-4 + 1% of the full SVD's
 * optimum; the top r singular values agree; U is orthonormal where σ_j is
 * above 1e-3·σ₁; SVt = diag(sv)·Vt. */
static void gram_check(const char *what, const float *K, int s, int n, int r) {
    int m = s < n ? s : n;
    float *U = malloc(sizeof(float) * s * r), *SVt = malloc(sizeof(float) * r * n), *Vt = malloc(sizeof(float) * r * n);
    float *U2 = malloc(sizeof(float) * s * r), *SVt2 = malloc(sizeof(float) * r * n);
    float *sv = malloc(sizeof(float) * m), *sv2 = malloc(sizeof(float) * m), err = -1, err2 = -1;
    char msg[256];
    int rc = shadowkv_svd_gram(K, s, n, r, U, SVt, Vt, sv, &err);
    int rc2 = shadowkv_svd(K, s, n, r, U2, SVt2, NULL, sv2, &err2);
    snprintf(msg, sizeof msg, "gram svd %s (%dx%d, rank %d) succeeds", what, s, n, r);
    test_cond(msg, rc == 0 && rc2 == 0);
    if (rc || rc2) goto done;
    double de = direct_err(K, U, SVt, s, n, r), svd_diff = 0, orth = 0, scaled = 0;
    for (int i = 0; i < r; i++) svd_diff = fmax(svd_diff, fabs(sv[i] - sv2[i]));
    for (int a = 0; a < r; a++)
        for (int b = 0; b < r; b++) {
            if (sv[a] < 1e-3 * sv[0] || sv[b] < 1e-3 * sv[0]) continue;
            double acc = 0;
            for (int i = 0; i < s; i++) acc += (double)U[i * r + a] * U[i * r + b];
            orth = fmax(orth, fabs(acc - (a == b)));
        }
    for (int a = 0; a < r; a++)
        for (int j = 0; j < n; j++) scaled = fmax(scaled, fabs(SVt[a * n + j] - sv[a] * Vt[a * n + j]));
    snprintf(msg, sizeof msg, "gram svd %s: error %.4g is its residual %.4g; full svd %.4g", what, err, de, err2);
    test_cond(msg, fabs(err - de) <= 1e-5 + 1e-3 * de && err <= err2 * 1.01 + 1e-4);
    snprintf(msg, sizeof msg, "gram svd %s: top %d singular values within %.1e of the full svd's (sigma1 %.3g)", what, r,
             svd_diff, sv2[0]);
    test_cond(msg, svd_diff <= 1e-4 * sv2[0] + 1e-6);
    snprintf(msg, sizeof msg, "gram svd %s: U orthonormal (%.1e), SVt = diag(sv)*Vt", what, orth);
    test_cond(msg, orth < 1e-4 && scaled <= 1e-6 * sv[0]);
done:
    free(U); free(SVt); free(Vt); free(U2); free(SVt2); free(sv); free(sv2);
}

static void test_svd(void) {
    float *K = rnd(200 * 48);
    svd_check("random", K, 200, 48, 10, 1e-5);
    svd_check("random full rank", K, 200, 48, 48, 1e-5);
    free(K);
    K = rnd(20 * 64);
    svd_check("wide", K, 20, 64, 20, 1e-5);
    svd_check("wide", K, 20, 64, 7, 1e-5);
    free(K);
    /* SmolLM2-135M layer shape: 3 KV heads of 64, rank 48. */
    K = low_rank(1024, 192, 40, 0.3f);
    svd_check("smollm2-shaped", K, 1024, 192, 48, 1e-4);
    free(K);
    K = low_rank(512, 64, 12, 0);
    float e4 = svd_check("planted rank 12", K, 512, 64, 4, 1e-4);
    float e12 = svd_check("planted rank 12", K, 512, 64, 12, 1e-4);
    float e16 = svd_check("planted rank 12", K, 512, 64, 16, 1e-4);
    char msg[160];
    snprintf(msg, sizeof msg, "planted rank 12: error %.2e at rank 12, %.2e at 16 (< 1e-2), %.3f at rank 4 (> 0.3)",
             e12, e16, e4);
    test_cond(msg, e12 < 1e-2 && e16 < 1e-2 && e4 > 0.3);
    printf("     rank-12 matrix 512x64: rel. error rank 4 %.4f, rank 12 %.2e, rank 16 %.2e\n", e4, e12, e16);
    free(K);
    float z[4 * 3] = {0}, U[4], SVt[3], sv[3], err = -1;
    test_cond("svd of a zero matrix reports error 0", shadowkv_svd(z, 4, 3, 1, U, SVt, NULL, sv, &err) == 0 && err == 0);
    test_cond("svd rejects rank > min(s, n)", shadowkv_svd(z, 4, 3, 4, U, SVt, NULL, sv, &err) == SKV_EINVAL);

    /* the Gram route on the same shapes, and the cases its division could break */
    K = rnd(200 * 48);
    gram_check("random", K, 200, 48, 10);
    gram_check("random full rank", K, 200, 48, 48);
    free(K);
    K = rnd(20 * 64);
    gram_check("wide", K, 20, 64, 20);
    gram_check("wide", K, 20, 64, 7);
    free(K);
    K = low_rank(1024, 192, 40, 0.3f);
    gram_check("smollm2-shaped", K, 1024, 192, 48);
    free(K);
    K = low_rank(4096, 192, 48, 0);
    gram_check("planted rank 48, 4K tokens", K, 4096, 192, 48);
    gram_check("planted rank 48 at rank 64 (zero singular values)", K, 4096, 192, 64);
    free(K);
    err = -1;
    test_cond("gram svd of a zero matrix reports error 0 and zero factors",
              shadowkv_svd_gram(z, 4, 3, 1, U, SVt, NULL, sv, &err) == 0 && err == 0 && U[0] == 0 && SVt[0] == 0);
    test_cond("gram svd rejects rank > min(s, n)", shadowkv_svd_gram(z, 4, 3, 4, U, SVt, NULL, sv, &err) == SKV_EINVAL);
    z[5] = NAN;
    test_cond("gram svd refuses NaN keys", shadowkv_svd_gram(z, 4, 3, 1, U, SVt, NULL, sv, &err) == SKV_EINVAL);
}

/* ---- landmarks, cos-min, outliers --------------------------------------- */

static void test_landmarks(void) {
    int h = 3, d = 64, c = 8, nch = 37, stride = h * d;
    float *K = rnd((size_t)nch * c * stride);
    /* A chunk with a zero key and one whose keys are all equal. */
    memset(K + (size_t)(5 * c + 2) * stride + d, 0, sizeof(float) * d);
    for (int t = 0; t < c; t++) memcpy(K + (size_t)(9 * c + t) * stride + d, K + (size_t)(9 * c) * stride + d, sizeof(float) * d);
    float *lm = malloc(sizeof(float) * nch * d), *cm = malloc(sizeof(float) * nch);
    double lm_err = 0, cm_err = 0;
    for (int head = 0; head < h; head++) {
        const float *Kh = K + head * d;
        shadowkv_landmarks(Kh, stride, d, c, nch, lm);
        shadowkv_cos_min(Kh, stride, d, c, nch, lm, cm);
        for (int j = 0; j < nch; j++) {
            double L[64] = {0}, ln = 0, mn = 2;
            for (int t = 0; t < c; t++)
                for (int i = 0; i < d; i++) L[i] += Kh[(size_t)(j * c + t) * stride + i] / (double)c;
            for (int i = 0; i < d; i++) {
                lm_err = fmax(lm_err, fabs(L[i] - lm[j * d + i]));
                ln += L[i] * L[i];
            }
            for (int t = 0; t < c; t++) {
                double dot = 0, kn = 0;
                for (int i = 0; i < d; i++) {
                    double k = Kh[(size_t)(j * c + t) * stride + i];
                    dot += L[i] * k;
                    kn += k * k;
                }
                double cs = ln * kn > 0 ? dot / sqrt(ln * kn) : 0;
                if (cs < mn) mn = cs;
            }
            cm_err = fmax(cm_err, fabs(mn - cm[j]));
        }
        if (head == 1) {
            test_cond("cos-min: a chunk with a zero key has minimum 0", cm[5] == 0.0f);
            test_cond("cos-min: a chunk of equal keys has minimum 1", fabsf(cm[9] - 1) < 1e-5);
        }
    }
    char msg[160];
    snprintf(msg, sizeof msg, "landmarks = chunk means (max err %.1e), cos-min vs double (max err %.1e)", lm_err, cm_err);
    test_cond(msg, lm_err < 1e-5 && cm_err < 1e-5);

    /* Outliers: the o lowest cos-min, ties to the lower id, ascending ids. */
    float cmv[12] = {0.9f, 0.2f, 0.5f, 0.2f, 0.95f, 0.1f, 0.5f, 0.5f, 0.99f, 0.3f, 0.2f, 0.7f}, scr[12];
    int out[12];
    int got = shadowkv_outliers(cmv, 12, 5, out, scr);
    int want[5] = {1, 3, 5, 9, 10}; /* 0.1 (5), 0.2 (1, 3, 10), 0.3 (9) */
    test_cond("outliers: the 5 lowest cos-min, ascending ids", got == 5 && !memcmp(out, want, sizeof want));
    got = shadowkv_outliers(cmv, 12, 4, out, scr);
    int want4[4] = {1, 3, 5, 10};
    test_cond("outliers: ties at the cut go to the lower id", got == 4 && !memcmp(out, want4, sizeof want4));
    got = shadowkv_outliers(cmv, 12, 7, out, scr);
    int want7[7] = {1, 2, 3, 5, 6, 9, 10};
    test_cond("outliers: tie among 0.5s at the cut takes chunk 2 then 6", got == 7 && !memcmp(out, want7, sizeof want7));
    test_cond("outliers: o > n takes all, o = 0 none",
              shadowkv_outliers(cmv, 12, 40, out, scr) == 12 && shadowkv_outliers(cmv, 12, 0, out, scr) == 0);
    free(K); free(lm); free(cm);
}

/* ---- scoring, top-k ------------------------------------------------------ */

static void test_score(void) {
    int d = 64, group = 3, n_kv = 2, n_lm = 129;
    float scale = 1.0f / sqrtf((float)d);
    for (int nq = 1; nq <= 2; nq++) {
        size_t q_stride = (size_t)n_kv * group * d;
        float *q = rnd(nq * q_stride), *lm = rnd((size_t)n_lm * d);
        uint16_t *lm_h = malloc(sizeof(uint16_t) * n_lm * d);
        vec_to_f16(lm_h, lm, n_lm * d);
        vec_from_f16(lm, lm_h, n_lm * d); /* the reference reads the half values widened */
        for (int i = 0; i < nq * (int)q_stride; i++) q[i] *= 4; /* peaky softmax */
        float *tmp = malloc(sizeof(float) * 2 * group * n_lm), *score = malloc(sizeof(float) * n_lm);
        double err = 0;
        for (int kh = 0; kh < n_kv; kh++) {
            shadowkv_score_h(q + (size_t)kh * group * d, nq, q_stride, group, d, lm_h, n_lm, scale, tmp, score);
            for (int j = 0; j < n_lm; j++) {
                double best = -1;
                for (int g = 0; g < group; g++) {
                    double acc = 0;
                    for (int i = 0; i < nq; i++) {
                        const float *qq = q + i * q_stride + (size_t)(kh * group + g) * d;
                        double lg[256], mx = -1e300, sum = 0;
                        for (int t = 0; t < n_lm; t++) {
                            double dot = 0;
                            for (int e = 0; e < d; e++) dot += (double)qq[e] * lm[t * d + e];
                            lg[t] = dot * scale;
                            if (lg[t] > mx) mx = lg[t];
                        }
                        for (int t = 0; t < n_lm; t++) sum += exp(lg[t] - mx);
                        acc += exp(lg[j] - mx) / sum;
                    }
                    if (acc > best) best = acc;
                }
                err = fmax(err, fabs(best - score[j]));
            }
        }
        char msg[160];
        snprintf(msg, sizeof msg, "landmark scores (softmax, sum over %d query pos., GQA max of 3) vs double: %.1e", nq,
                 err);
        test_cond(msg, err < 1e-5);
        free(q); free(lm); free(lm_h); free(tmp); free(score);
    }
}

/* shadowkv_score_logits for groups of 1 to 5 query heads and several
 * widths: near a double-precision dot, the same bits whether the landmarks
 * come in one call or in blocks starting at multiples of 4 (as the decode's
 * (KV head, block) tasks call it), and, for the vector kernel's groups (up
 * to 4), the same bits for a head whatever group it is scored in. */
static void test_score_logits(void) {
    const int n_lm = 13, ds[] = {64, 24, 20};
    for (int di = 0; di < 3; di++)
        for (int G = 1; G <= 5; G++) {
            int d = ds[di];
            float scale = 1.0f / sqrtf((float)d), *q = rnd((size_t)G * d), *lm = rnd((size_t)n_lm * d);
            float whole[5 * 13], blocks[5 * 13], one[13];
            shadowkv_score_logits(q, G, d, lm, n_lm, scale, whole, n_lm);
            shadowkv_score_logits(q, G, d, lm, 4, scale, blocks, n_lm);
            shadowkv_score_logits(q, G, d, lm + 4 * d, n_lm - 4, scale, blocks + 4, n_lm);
            double err = 0;
            int same_blocks = !memcmp(whole, blocks, sizeof(float) * G * n_lm), same_head = 1;
            for (int g = 0; g < G; g++) {
                for (int j = 0; j < n_lm; j++) {
                    double dot = 0;
                    for (int e = 0; e < d; e++) dot += (double)q[g * d + e] * lm[j * d + e];
                    err = fmax(err, fabs(dot * scale - whole[g * n_lm + j]));
                }
                shadowkv_score_logits(q + (size_t)g * d, 1, d, lm, n_lm, scale, one, n_lm);
                if (G <= 4 && memcmp(one, whole + g * n_lm, sizeof one)) same_head = 0;
            }
            char msg[160];
            snprintf(msg, sizeof msg, "score logits, group %d, d %d: %.1e from double; blocks and single heads bitwise",
                     G, d, err);
            test_cond(msg, err < 1e-5 && same_blocks && same_head);
            free(q);
            free(lm);
        }
}

/* Landmarks kept in half precision: shadowkv_round_f16 rounds to the
 * nearest half (ties to even), and shadowkv_score_logits_h gives the bits
 * of shadowkv_score_logits over the rounded values, in one call or in
 * blocks starting at multiples of 4, for groups of 1 to 5 and widths the
 * vector kernel takes (64, 24) or leaves to the scalar loop (20). */
static void test_score_logits_h(void) {
    float x[6] = {1.0f + 0x1p-11f, 1.0f + 0x1p-10f + 0x1p-11f, 2049.0f, -0.1f, 65504.0f, 25.25f * 0x1p-24f};
    const float want[6] = {1.0f, 1.0f + 0x1p-9f, 2048.0f, -0.0999755859375f, 65504.0f, 25.0f * 0x1p-24f};
    shadowkv_round_f16(x, 6);
    test_cond("round_f16: nearest half, ties to even, subnormals kept", !memcmp(x, want, sizeof x));
    const int n_lm = 13, ds[] = {64, 24, 20};
    for (int di = 0; di < 3; di++)
        for (int G = 1; G <= 5; G++) {
            int d = ds[di];
            float scale = 1.0f / sqrtf((float)d), *q = rnd((size_t)G * d), *lm = rnd((size_t)n_lm * d);
            for (int i = 0; i < n_lm * d; i++) lm[i] *= 7;
            uint16_t *h = malloc(sizeof(uint16_t) * n_lm * d);
            vec_to_f16(h, lm, n_lm * d);
            float *w = malloc(sizeof(float) * n_lm * d);
            memcpy(w, lm, sizeof(float) * n_lm * d);
            shadowkv_round_f16(w, (size_t)n_lm * d);
            double rel = 0;
            for (int i = 0; i < n_lm * d; i++) rel = fmax(rel, fabs(w[i] - lm[i]) / fmax(fabs(lm[i]), 0x1p-14));
            float ref[5 * 13], whole[5 * 13], blocks[5 * 13];
            shadowkv_score_logits(q, G, d, w, n_lm, scale, ref, n_lm);
            shadowkv_score_logits_h(q, G, d, h, n_lm, scale, whole, n_lm);
            shadowkv_score_logits_h(q, G, d, h, 4, scale, blocks, n_lm);
            shadowkv_score_logits_h(q, G, d, h + 4 * d, n_lm - 4, scale, blocks + 4, n_lm);
            char msg[200];
            snprintf(msg, sizeof msg, "score logits over half landmarks, group %d, d %d: the bits of f32 scoring of "
                     "the rounded values, in one call and in blocks (rounding %.1e rel.)", G, d, rel);
            test_cond(msg, !memcmp(ref, whole, sizeof(float) * G * n_lm) &&
                               !memcmp(ref, blocks, sizeof(float) * G * n_lm) && rel <= 0x1p-11 && rel > 0);
            free(q); free(lm); free(h); free(w);
        }
}

static const float *sort_key;
static int cmp_better(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    float u = sort_key[x], v = sort_key[y];
    int nu = isnan(u), nv = isnan(v);
    if (nu != nv) return nu - nv;
    if (!nu && u != v) return u > v ? -1 : 1;
    return x - y;
}

/* shadowkv_pack to bf16 (vectorized eight at a time) against km_f32_to_bf16
 * one at a time: ties both ways, the largest finite value (to infinity),
 * infinities, both zeros, subnormals and NaNs (quiet and signalling, both
 * signs), at every position of a vector and in the scalar tail. */
static void test_pack_bf16(void) {
    static const uint32_t special[] = {
        0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
        0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7fc00000u, 0x7f800001u, 0xffc00123u, 0xff800001u,
        0x3f7f7fffu, 0x477fe000u, 0x00008000u, 0x00018000u,
    };
    int ns = (int)(sizeof special / sizeof special[0]), ok = 1, n = 8 * 9 + 5;
    float x[8 * 9 + 5];
    uint16_t y[8 * 9 + 5];
    for (int shift = 0; shift < 8; shift++) {
        for (int i = 0; i < n; i++) {
            uint32_t u = (i + shift) % 3 ? special[(i + shift) % ns] : (uint32_t)rand() * 2654435761u;
            memcpy(&x[i], &u, 4);
        }
        shadowkv_pack(x, (size_t)n, y, SKV_ELT_BF16);
        for (int i = 0; i < n; i++) ok &= y[i] == km_f32_to_bf16(x[i]);
    }
    test_cond("pack to bf16: each value's bits as km_f32_to_bf16 gives them (ties to even, NaN quiet, overflow to inf)",
              ok);
}

static void test_topk(void) {
    int ok = 1;
    /* the special values: signed zeros (equal as floats), infinities and
     * NaNs of both signs */
    const float special[6] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN};
    for (int trial = 0; trial < 260 && ok; trial++) {
        /* trials 200 on: up to 1200 entries and k past the 256 keys the heap
         * keeps on the stack */
        int n = 1 + (int)((frand() + 1) * (trial < 200 ? 150 : 600)), k = (int)((frand() + 1) * 0.6 * n);
        float *s = malloc(sizeof(float) * n);
        int levels = trial % 3 == 0 ? 4 : 1000000; /* many ties every third trial */
        for (int i = 0; i < n; i++) s[i] = (float)(int)((frand() + 1) * levels / 2) - (trial % 2 ? levels / 4 : 0);
        if (trial % 5 == 0) s[n / 2] = NAN;
        if (trial % 4 == 1)
            for (int i = 0; i < n; i += 3) s[i] = special[(i / 3 + trial) % 6];
        int *all = malloc(sizeof(int) * n), *idx = malloc(sizeof(int) * (n + 1));
        for (int i = 0; i < n; i++) all[i] = i;
        sort_key = s;
        qsort(all, n, sizeof(int), cmp_better);
        int got = shadowkv_topk(s, n, k, idx);
        ok = got == (k < n ? k : n) && !memcmp(idx, all, sizeof(int) * got);
        free(s); free(all); free(idx);
    }
    test_cond("top-k = first k of a full sort (ties to lower id, -0 = +0, NaN last) on 260 random cases", ok);
    float t[6] = {1, 3, 3, 2, 3, 1};
    int idx[6], want[4] = {1, 2, 4, 3};
    test_cond("top-k hand case: 3,3,3 tie then 2", shadowkv_topk(t, 6, 4, idx) == 4 && !memcmp(idx, want, sizeof want));
    test_cond("top-k: k > n returns n, k = 0 returns 0", shadowkv_topk(t, 6, 9, idx) == 6 && shadowkv_topk(t, 6, 0, idx) == 0);
    int rank[6], order[6], wr[6] = {4, 0, 1, 3, 2, 5};
    shadowkv_rank(t, 6, rank, order);
    test_cond("rank: place of each entry in the top-k order", !memcmp(rank, wr, sizeof wr));
}

/* ---- RoPE, rebuild, projection ------------------------------------------ */

static void make_rope(rope_ctx *r, rope_mode mode, int hd, int rope_dim) {
    r->mode = mode;
    r->head_dim = hd;
    r->rope_dim = rope_dim;
    r->inv_freq = malloc(sizeof(float) * rope_dim / 2);
    for (int i = 0; i < rope_dim / 2; i++) r->inv_freq[i] = (float)pow(10000.0, -2.0 * i / rope_dim);
}

static void test_rebuild(void) {
    /* head_dim 64: rows in blocks of four (the 512-bit path where built)
     * give the bits of one row at a time */
    {
        int r = 48, d = 64, n = 11;
        float *Uf = rnd((size_t)(n + 5) * r), *svt = rnd((size_t)r * d);
        float *a = malloc(sizeof(float) * n * d), *b = malloc(sizeof(float) * n * d);
        uint16_t *U = malloc(sizeof(uint16_t) * (n + 5) * r); /* kept in bf16, as the policy keeps it */
        shadowkv_pack(Uf, (size_t)(n + 5) * r, U, SKV_ELT_BF16);
        rope_ctx rope;
        make_rope(&rope, ROPE_ADJACENT, d, d);
        shadowkv_rebuild(U, r, svt, d, 5, n, &rope, NULL, NULL, a);
        for (int i = 0; i < n; i++) shadowkv_rebuild(U, r, svt, d, 5 + i, 1, &rope, NULL, NULL, b + (size_t)i * d);
        test_cond("rebuild, head_dim 64: 11 rows at once == one row at a time, bitwise", !memcmp(a, b, sizeof(float) * n * d));
        rope_free(&rope);
        /* with RoPE tables the blocks of four rotate in registers: the bits
         * of one row at a time (rebuild, then the tables' rotation) and of
         * rope_apply, in both pair layouts */
        const rope_mode modes[2] = {ROPE_ADJACENT, ROPE_NEOX};
        for (int mi = 0; mi < 2; mi++) {
            make_rope(&rope, modes[mi], d, d);
            float *cs = malloc(sizeof(float) * (n + 5) * d / 2), *sn = malloc(sizeof(float) * (n + 5) * d / 2);
            float *e = malloc(sizeof(float) * n * d);
            shadowkv_rope_table(&rope, n + 5, cs, sn);
            shadowkv_rebuild(U, r, svt, d, 5, n, &rope, cs, sn, a);
            for (int i = 0; i < n; i++) shadowkv_rebuild(U, r, svt, d, 5 + i, 1, &rope, cs, sn, b + (size_t)i * d);
            shadowkv_rebuild(U, r, svt, d, 5, n, &rope, NULL, NULL, e);
            char msg[160];
            snprintf(msg, sizeof msg, "rebuild, head_dim 64, %s RoPE tables: 11 rows at once == one row at a time == rope_apply, bitwise",
                     mi ? "neox" : "adjacent");
            test_cond(msg, !memcmp(a, b, sizeof(float) * n * d) && !memcmp(a, e, sizeof(float) * n * d));
            free(cs); free(sn); free(e);
            rope_free(&rope);
        }
        /* U in f32 (the f32_state option): values that are bf16 already give
         * the bf16 rebuild's bits (the 4-byte rows are read at their own
         * stride), and f32 values a rebuild within f32 rounding of a double
         * reference, where the bf16 one is ~1e-3 off */
        {
            make_rope(&rope, ROPE_NEOX, d, d);
            float *cs = malloc(sizeof(float) * (n + 5) * d / 2), *sn = malloc(sizeof(float) * (n + 5) * d / 2);
            float *Uw = malloc(sizeof(float) * (n + 5) * r), *e = malloc(sizeof(float) * n * d);
            shadowkv_rope_table(&rope, n + 5, cs, sn);
            for (int i = 0; i < (n + 5) * r; i++) Uw[i] = km_bf16_to_f32(U[i]);
            int same = 1;
            for (int t = 0; t < 2; t++) {
                shadowkv_rebuild(U, r, svt, d, 5, n, &rope, t ? cs : NULL, t ? sn : NULL, a);
                shadowkv_rebuild_w(Uw, 4, r, svt, d, 5, n, &rope, t ? cs : NULL, t ? sn : NULL, b);
                same &= !memcmp(a, b, sizeof(float) * n * d);
            }
            shadowkv_rebuild_w(Uf, 4, r, svt, d, 5, n, &rope, cs, sn, a);
            for (int i = 0; i < n; i++) shadowkv_rebuild_w(Uf, 4, r, svt, d, 5 + i, 1, &rope, cs, sn, b + (size_t)i * d);
            same &= !memcmp(a, b, sizeof(float) * n * d);
            shadowkv_rebuild(U, r, svt, d, 5, n, &rope, cs, sn, b);
            for (int i = 0; i < n; i++) {
                for (int x = 0; x < d; x++) {
                    double acc = 0;
                    for (int j = 0; j < r; j++) acc += (double)Uf[(size_t)(5 + i) * r + j] * svt[(size_t)j * d + x];
                    e[(size_t)i * d + x] = (float)acc;
                }
                rope_apply(&rope, e + (size_t)i * d, 1, 5 + i);
            }
            double e32 = test_rel_l2(a, e, (size_t)n * d), e16 = test_rel_l2(b, e, (size_t)n * d);
            char msg[200];
            snprintf(msg, sizeof msg, "rebuild, head_dim 64, U in f32: bf16-exact values give the bf16 bits, rows at "
                     "once == one at a time; rel L2 vs double %.1e (<= 1e-6), bf16 U %.1e (>= 1e-4)", e32, e16);
            test_cond(msg, same && e32 <= 1e-6 && e16 >= 1e-4);
            free(cs); free(sn); free(Uw); free(e);
            rope_free(&rope);
        }
        free(U); free(Uf); free(svt); free(a); free(b);
    }
    int s = 96, h = 2, d = 32, n = h * d, r = 16, c = 8;
    float *K = low_rank(s, n, 20, 0.01f);
    float *U = malloc(sizeof(float) * s * r), *SVt = malloc(sizeof(float) * r * n), *sv = malloc(sizeof(float) * n);
    float err;
    shadowkv_svd(K, s, n, r, U, SVt, NULL, sv, &err);
    /* U in bf16 as the policy keeps it; the reference below reads its values */
    uint16_t *Ub = malloc(sizeof(uint16_t) * s * r);
    shadowkv_pack(U, (size_t)s * r, Ub, SKV_ELT_BF16);
    for (int i = 0; i < s * r; i++) U[i] = km_bf16_to_f32(Ub[i]);
    /* Per-head slices of ΣVᵀ, as the policy stores them: (h, r, d). */
    float *svt_h = malloc(sizeof(float) * h * r * d);
    for (int kh = 0; kh < h; kh++)
        for (int j = 0; j < r; j++) memcpy(svt_h + ((size_t)kh * r + j) * d, SVt + (size_t)j * n + kh * d, sizeof(float) * d);
    const rope_mode modes[2] = {ROPE_ADJACENT, ROPE_NEOX};
    const int rdims[2] = {d, d / 2};
    for (int mi = 0; mi < 2; mi++)
        for (int ri = 0; ri < 2; ri++) {
            rope_ctx rope;
            make_rope(&rope, modes[mi], d, rdims[ri]);
            float *cs = malloc(sizeof(float) * s * rdims[ri] / 2), *sn = malloc(sizeof(float) * s * rdims[ri] / 2);
            shadowkv_rope_table(&rope, s, cs, sn);
            /* Tables give bitwise the same rotation as rope_apply. */
            float *x = rnd((size_t)c * d), *y = malloc(sizeof(float) * c * d);
            memcpy(y, x, sizeof(float) * c * d);
            shadowkv_rope_rows(&rope, cs, sn, x, c, 40);
            for (int t = 0; t < c; t++) rope_apply(&rope, y + t * d, 1, 40 + t);
            int same = !memcmp(x, y, sizeof(float) * c * d);
            double worst = 0, worst_nt = 0;
            float out[8 * 32], out_nt[8 * 32];
            for (int kh = 0; kh < h; kh++)
                for (int ch = 0; ch < s / c; ch++) {
                    shadowkv_rebuild(Ub, r, svt_h + (size_t)kh * r * d, d, ch * c, c, &rope, cs, sn, out);
                    shadowkv_rebuild(Ub, r, svt_h + (size_t)kh * r * d, d, ch * c, c, &rope, NULL, NULL, out_nt);
                    for (int t = 0; t < c; t++) {
                        int tok = ch * c + t;
                        float ref[32];
                        for (int e = 0; e < d; e++) {
                            double acc = 0;
                            for (int j = 0; j < r; j++) acc += (double)U[tok * r + j] * SVt[j * n + kh * d + e];
                            ref[e] = (float)acc;
                        }
                        rope_apply(&rope, ref, 1, tok);
                        for (int e = 0; e < d; e++) {
                            worst = fmax(worst, fabs(ref[e] - out[t * d + e]));
                            worst_nt = fmax(worst_nt, fabs(out_nt[t * d + e] - out[t * d + e]));
                        }
                    }
                }
            char msg[200];
            snprintf(msg, sizeof msg,
                     "rebuild %s rope_dim %d: table RoPE == rope_apply bitwise; RoPE(U*SVt_h) vs rank-r reconstruction %.1e",
                     mi ? "neox" : "adjacent", rdims[ri], worst);
            test_cond(msg, same && worst < 1e-5 && worst_nt == 0);
            free(x); free(y); free(cs); free(sn);
            rope_free(&rope);
        }
    /* ShadowKV+ projection: identity on the span, zero on its complement. */
    float *Vt = malloc(sizeof(float) * r * n);
    shadowkv_svd(K, s, n, r, U, SVt, Vt, sv, &err);
    float *in = malloc(sizeof(float) * n), *pr = malloc(sizeof(float) * n), coef[16];
    for (int j = 0; j < n; j++) in[j] = 0.7f * Vt[3 * n + j] - 1.5f * Vt[9 * n + j];
    shadowkv_project(Vt, r, n, in, pr, coef);
    double e_in = 0;
    for (int j = 0; j < n; j++) e_in = fmax(e_in, fabs(pr[j] - in[j]));
    float *z = rnd(n);
    shadowkv_project(Vt, r, n, z, pr, coef);
    for (int j = 0; j < n; j++) z[j] -= pr[j]; /* z is now orthogonal to the span */
    shadowkv_project(Vt, r, n, z, pr, coef);
    double e_out = 0;
    for (int j = 0; j < n; j++) e_out = fmax(e_out, fabs(pr[j]));
    test_cond("ShadowKV+ projection: identity on span(V_r), zero on its complement", e_in < 1e-5 && e_out < 1e-5);
    free(in); free(pr); free(z); free(Vt);
    free(K); free(U); free(Ub); free(SVt); free(sv); free(svt_h);
}

/* ---- chunk cache, offload store ----------------------------------------- */

static void test_cache(void) {
    shadowkv_cache c;
    test_cond("cache init", shadowkv_cache_init(&c, 3, 10) == 0);
    int slot[3], miss[3];
    int s1[3] = {0, 1, 2}, s2[3] = {1, 2, 3}, s3[3] = {3, 2, 1}, s4[3] = {4, 5, 6}, s5[3] = {6, 0, 5};
    int m = shadowkv_cache_update(&c, s1, 3, slot, miss);
    test_cond("cache: first selection is all misses", m == 3 && c.hits == 0 && c.misses == 3);
    int slot_of0 = slot[0], slot_of1 = slot[1], slot_of2 = slot[2];
    m = shadowkv_cache_update(&c, s2, 3, slot, miss);
    test_cond("cache: {0,1,2} -> {1,2,3}: 2 hits keep their slots, 3 takes 0's slot",
              m == 1 && miss[0] == 2 && slot[0] == slot_of1 && slot[1] == slot_of2 && slot[2] == slot_of0 &&
                  c.where[0] == -1 && c.hits == 2 && c.misses == 4);
    m = shadowkv_cache_update(&c, s3, 3, slot, miss);
    test_cond("cache: reordered selection is all hits", m == 0 && c.hits == 5);
    m = shadowkv_cache_update(&c, s4, 3, slot, miss);
    test_cond("cache: disjoint selection is all misses", m == 3 && c.misses == 7);
    m = shadowkv_cache_update(&c, s5, 3, slot, miss);
    test_cond("cache: {4,5,6} -> {6,0,5}: 2 hits, 1 miss", m == 1 && miss[0] == 1 && c.hits == 7 && c.misses == 8);
    int s6[2] = {9, 6};
    m = shadowkv_cache_update(&c, s6, 2, slot, miss);
    test_cond("cache: a shorter selection (k < slots) works", m == 1 && c.hits == 8 && c.misses == 9);
    shadowkv_cache_free(&c);

    /* Random sequences against set semantics, with slot consistency. */
    int ok = 1, n_ids = 40, k = 12;
    shadowkv_cache_init(&c, k, n_ids);
    int prev[40] = {0}, holder[12];
    uint64_t hits = 0, misses = 0;
    for (int step = 0; step < 500 && ok; step++) {
        int sel[12], used[40] = {0}, cnt = 0;
        while (cnt < k) {
            int id = (int)((frand() + 1) * 0.5 * (step % 2 ? 15 : n_ids)) % n_ids;
            if (!used[id]) { used[id] = 1; sel[cnt++] = id; }
        }
        int sl[12], ms[12], want = 0;
        for (int i = 0; i < k; i++) want += !prev[sel[i]];
        m = shadowkv_cache_update(&c, sel, k, sl, ms);
        hits += k - want;
        misses += want;
        for (int i = 0; i < 12; i++) holder[i] = -1;
        for (int i = 0; i < k; i++) {
            ok &= sl[i] >= 0 && sl[i] < k && holder[sl[i]] == -1 && c.slot_id[sl[i]] == sel[i] && c.where[sel[i]] == sl[i];
            holder[sl[i]] = sel[i];
        }
        ok &= m == want;
        memcpy(prev, used, sizeof prev);
    }
    test_cond("cache: 500 random steps match set semantics, slots stay consistent",
              ok && c.hits == hits && c.misses == misses);
    shadowkv_cache_free(&c);
}

/* One tier of the store: path NULL is host memory, else the file tier;
 * eb bytes a value (2: bf16, 4: f32, the f32_state option). */
static void test_store_tier(const char *path, const char *tier0, int eb) {
    shadowkv_store st;
    int rows = 8, cols = 16, stride = 48;
    char what[200], tier[64];
    snprintf(tier, sizeof tier, "%s, %s", tier0, eb == 4 ? "f32" : "bf16");
    snprintf(what, sizeof what, "store (%s): init", tier);
    test_cond(what, shadowkv_store_init(&st, 5, rows, cols, eb, path) == 0);
    if (!st.data) return;
    snprintf(what, sizeof what, "store (%s): bytes, %d a value", tier, eb);
    test_cond(what, shadowkv_store_bytes(&st) == (size_t)5 * 8 * 16 * eb);
    float *src = rnd((size_t)5 * rows * stride);
    for (int b = 0; b < 5; b++) shadowkv_store_put(&st, b, src + (size_t)b * rows * stride + 16, stride);
    /* what a fetch gives back: each value rounded to bf16, nearest even; in f32, as put */
    for (size_t i = 0; i < (size_t)5 * rows * stride && eb == 2; i++) src[i] = km_bf16_to_f32(km_f32_to_bf16(src[i]));
    snprintf(what, sizeof what, "store (%s): puts are not fetches", tier);
    test_cond(what, st.n_fetch == 0 && st.fetch_bytes == 0);
    float dst[8 * 16], dst2[8 * 32];
    shadowkv_store_fetch(&st, 3, dst, cols);
    int ok = 1;
    for (int i = 0; i < rows; i++) ok &= !memcmp(dst + i * cols, src + (size_t)(3 * rows + i) * stride + 16, sizeof(float) * cols);
    shadowkv_store_fetch(&st, 1, dst2, 32);
    for (int i = 0; i < rows; i++) ok &= !memcmp(dst2 + i * 32, src + (size_t)(1 * rows + i) * stride + 16, sizeof(float) * cols);
    shadowkv_store_fetch(&st, 3, dst, cols);
    /* the gather reads the same blocks at the store's width */
    float g[2 * 8 * 32];
    int gi[2] = {4, 0};
    size_t go[2] = {0, 8 * 32 + 16};
    shadowkv_gather_blocks(st.data, eb, rows, cols, gi, 2, g, SKV_ELT_F32, go, 32);
    for (int i = 0; i < rows; i++)
        ok &= !memcmp(g + i * 32, src + (size_t)(4 * rows + i) * stride + 16, sizeof(float) * cols) &&
              !memcmp(g + go[1] + i * 32, src + (size_t)i * stride + 16, sizeof(float) * cols);
    snprintf(what, sizeof what, "store (%s): fetched and gathered blocks equal what was put%s (packed and strided)",
             tier, eb == 2 ? " rounded to bf16" : "");
    test_cond(what, ok);
    snprintf(what, sizeof what, "store (%s): 3 fetches counted, 3 x %d bytes", tier, 128 * eb);
    test_cond(what, st.n_fetch == 3 && st.fetch_bytes == (uint64_t)3 * 128 * eb);
    shadowkv_store_free(&st);
    free(src);
}

static void test_store(void) {
    test_store_tier(NULL, "host memory", 2);
    test_store_tier(NULL, "host memory", 4);
    char dir[] = "/tmp/skv-store-XXXXXX";
    if (!mkdtemp(dir)) { test_cond("store: a temp folder", 0); return; }
    char path[64];
    snprintf(path, sizeof path, "%s/values.bin", dir);
    test_store_tier(path, "file", 2);
    test_store_tier(path, "file", 4);
    test_cond("store (file): the file is unlinked once mapped", access(path, F_OK) != 0);
    /* an existing file is the user's: refused, left as it was */
    FILE *f = fopen(path, "w");
    if (f) { fputs("keep me", f); fclose(f); }
    shadowkv_store st;
    int rc = shadowkv_store_init(&st, 2, 4, 4, 2, path);
    char buf[16] = "";
    f = fopen(path, "r");
    if (f) { if (!fgets(buf, sizeof buf, f)) buf[0] = 0; fclose(f); }
    test_cond("store (file): an existing file is refused and kept",
              rc == SKV_EINVAL && strstr(skv_last_error(), "exists") && !strcmp(buf, "keep me"));
    unlink(path);
    snprintf(path, sizeof path, "%s/no/such/dir/v.bin", dir);
    test_cond("store (file): an unwritable path is a one-line error", shadowkv_store_init(&st, 2, 4, 4, 2, path) == SKV_EIO &&
                                                                        !strchr(skv_last_error(), '\n'));
    rmdir(dir);
}

int main(void) {
    test_svd();
    test_landmarks();
    test_score();
    test_score_logits();
    test_score_logits_h();
    test_pack_bf16();
    test_topk();
    test_rebuild();
    test_cache();
    test_store();
    return test_report("test_shadowkv_ops");
}
