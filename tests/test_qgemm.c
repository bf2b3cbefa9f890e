/* test_qgemm: the int8 prefill matmul (kernels/cpu/qgemm.c).
 *
 * For q8_0, q4_0, q5_0, q4_K and q6_K weights on random data (rows that are not a
 * multiple of the 4-row tile, token counts around the 16-token tile, blocks
 * of zeros, outliers, an inf and a NaN in x): every kernel level the CPU has
 * (AVX2, AVX-512 VNNI) gives qgemm_ref's bits; the product is within the
 * 8-bit-activation bound of the exact product of the stored weights; each
 * token's row agrees with the decode matvec (the same codes, summed in
 * another order); and the CPU backend's matmul takes this path for batches. */
#include "backend.h"
#include "qgemm.h"
#include "quant.h"
#include "skv.h"
#include "testhelp.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rs = 0x243f6a8885a308d3ull;
static double urand(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * 0x1p-53;
}
static float grand(void) {
    double s = 0;
    for (int i = 0; i < 6; i++) s += urand();
    return (float)(s - 3.0);
}

/* Relative L2 distance of a from b over n values. */
static double rel_l2(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int same_bits(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) return 0;
    return 1;
}

static void one_case(enum ggml_type t, int rows, int cols, int n, int outliers) {
    size_t rsz = ggml_row_size(t, cols);
    float *wf = malloc(sizeof(float) * (size_t)rows * cols), *wd = malloc(sizeof(float) * (size_t)rows * cols);
    uint8_t *W = malloc(rsz * rows);
    float *x = malloc(sizeof(float) * (size_t)n * cols);
    float *y = malloc(sizeof(float) * (size_t)n * rows), *yr = malloc(sizeof(float) * (size_t)n * rows);
    float *ym = malloc(sizeof(float) * rows);
    double *ye = malloc(sizeof(double) * (size_t)n * rows);
    SKV_ASSERT(wf && wd && W && x && y && yr && ym && ye);
    for (size_t i = 0; i < (size_t)rows * cols; i++) wf[i] = grand() * 0.05f;
    for (int r = 0; r < rows; r++) quant_quantize_row(t, wf + (size_t)r * cols, W + rsz * r, (size_t)cols);
    quant_dequant_row(t, W, wd, (size_t)rows * cols);
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = grand();
    /* a zero block in the first token, outliers in others */
    memset(x, 0, sizeof(float) * 32);
    if (outliers)
        for (int i = 1; i < n; i += 3) x[(size_t)i * cols + (i * 7) % cols] = 40.0f * (i & 1 ? 1 : -1);
    for (int i = 0; i < n; i++)
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int k = 0; k < cols; k++) s += (double)wd[(size_t)r * cols + k] * x[(size_t)i * cols + k];
            ye[(size_t)i * rows + r] = s;
        }
    qgemm_ref(t, W, rows, cols, x, n, yr);
    char what[96];
    snprintf(what, sizeof what, "%s %dx%d, %d tokens%s", ggml_type_name(t), rows, cols, n, outliers ? ", outliers" : "");
    for (int level = 2; level >= 1; level--) {
        qgemm_force_level(level);
        if (qgemm_kernel_level() != level) continue;
        skv_workspace ws = {0};
        for (size_t i = 0; i < (size_t)n * rows; i++) y[i] = NAN;
        qgemm(t, W, rows, cols, x, n, y, &ws);
        char msg[400];
        snprintf(msg, sizeof msg, "%s: the %s kernel gives qgemm_ref's bits", what, level == 2 ? "AVX-512 VNNI" : "AVX2");
        test_cond(msg, same_bits(y, yr, (size_t)n * rows));
        skv_workspace_free(&ws);
    }
    qgemm_force_level(-1);
    double e = rel_l2(yr, ye, (size_t)n * rows);
    char msg[400];
    snprintf(msg, sizeof msg, "%s: rel L2 %.2e from the exact product of the stored weights (<= %g)", what, e,
             outliers ? 4e-2 : 1.5e-2);
    test_cond(msg, e <= (outliers ? 4e-2 : 1.5e-2));
    /* each token against the decode matvec: the same codes and scales */
    double worst = 0;
    for (int i = 0; i < n; i++) {
        quant_matvec(t, W, (size_t)rows, (size_t)cols, x + (size_t)i * cols, ym);
        for (int r = 0; r < rows; r++) {
            double a = ym[r], b = yr[(size_t)i * rows + r], sc = 0;
            for (int k = 0; k < cols; k++) sc += fabs(wd[(size_t)r * cols + k] * x[(size_t)i * cols + k]);
            double d = fabs(a - b) / (sc > 0 ? sc : 1);
            if (d > worst) worst = d;
        }
    }
    snprintf(msg, sizeof msg, "%s: every token within %.1e of the decode matvec (relative to sum |w x|, <= 1e-5)", what,
             worst);
    test_cond(msg, worst <= 1e-5);
    free(wf); free(wd); free(W); free(x); free(y); free(yr); free(ym); free(ye);
}

/* Non-finite x: an inf or NaN in a block makes that token's products NaN,
 * as the matvec gives. */
static void nonfinite_case(void) {
    int rows = 6, cols = 64, n = 20;
    size_t rsz = ggml_row_size(GGML_Q8_0, cols);
    float wf[6 * 64], x[20 * 64], y[20 * 6], yr[20 * 6];
    uint8_t W[6 * 68];
    SKV_ASSERT(rsz * rows <= sizeof W);
    for (int i = 0; i < rows * cols; i++) wf[i] = grand() * 0.05f;
    for (int r = 0; r < rows; r++) quant_quantize_row(GGML_Q8_0, wf + r * cols, W + rsz * r, (size_t)cols);
    for (int i = 0; i < n * cols; i++) x[i] = grand();
    x[3 * cols + 5] = INFINITY;
    x[7 * cols + 40] = NAN;
    qgemm_ref(GGML_Q8_0, W, rows, cols, x, n, yr);
    skv_workspace ws = {0};
    qgemm(GGML_Q8_0, W, rows, cols, x, n, y, &ws);
    skv_workspace_free(&ws);
    int ok = same_bits(y, yr, (size_t)n * rows);
    for (int r = 0; r < rows; r++) ok &= isnan(y[3 * rows + r]) && isnan(y[7 * rows + r]) && isfinite(y[4 * rows + r]);
    test_cond("an inf or NaN in a token's x makes that token's outputs NaN, the others finite", ok);
}

int main(void) {
    if (!qgemm_supported(GGML_Q8_0, 64)) {
        test_skip("qgemm: this CPU has neither AVX2 nor AVX-512 VNNI (the dequantize-and-GEMM path runs)");
        test_report("test_qgemm");
        return 0;
    }
    enum ggml_type types[] = {GGML_Q8_0, GGML_Q4_0, GGML_Q5_0};
    for (int ti = 0; ti < 3; ti++) {
        one_case(types[ti], 37, 96, 16, 0);
        one_case(types[ti], 8, 256, 33, 1);
        one_case(types[ti], 13, 64, 70, 0);
    }
    /* q4_K and q6_K: rows of whole 256-weight super-blocks */
    enum ggml_type ktypes[] = {GGML_Q4_K, GGML_Q6_K};
    for (int ti = 0; ti < 2; ti++) {
        one_case(ktypes[ti], 37, 256, 16, 0);
        one_case(ktypes[ti], 8, 512, 33, 1);
        one_case(ktypes[ti], 13, 768, 70, 0);
    }
    one_case(GGML_Q8_0, 130, 512, 100, 1);
    nonfinite_case();
    test_cond("q4_K and q6_K are taken; f32, f16 and bf16 are not", qgemm_supported(GGML_Q4_K, 64) &&
              qgemm_supported(GGML_Q6_K, 64) && !qgemm_supported(GGML_F32, 64) && !qgemm_supported(GGML_F16, 64) &&
              !qgemm_supported(GGML_BF16, 64));
    test_cond("a batch below one tile of 16 tokens is not taken", !qgemm_supported(GGML_Q8_0, 15));

    /* the backend's matmul runs qgemm for a batch of quantized tokens */
    int rows = 40, cols = 128, n = 48;
    size_t rsz = ggml_row_size(GGML_Q8_0, cols);
    float *wf = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * n * cols);
    float *y = malloc(sizeof(float) * n * rows), *yr = malloc(sizeof(float) * n * rows);
    uint8_t *W = malloc(rsz * rows);
    for (int i = 0; i < rows * cols; i++) wf[i] = grand() * 0.05f;
    for (int r = 0; r < rows; r++) quant_quantize_row(GGML_Q8_0, wf + (size_t)r * cols, W + rsz * r, (size_t)cols);
    for (int i = 0; i < n * cols; i++) x[i] = grand();
    skv_workspace ws = {0};
    skv_backend_cpu.matmul(GGML_Q8_0, W, rows, cols, x, n, y, &ws);
    qgemm_ref(GGML_Q8_0, W, rows, cols, x, n, yr);
    test_cond("the CPU backend's batched q8_0 matmul is qgemm's product", same_bits(y, yr, (size_t)n * rows));
    skv_workspace_free(&ws);
    free(wf); free(x); free(y); free(yr); free(W);
    return test_report("test_qgemm");
}
