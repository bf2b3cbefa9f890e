/* test_backend.c: every op of the CPU backend, the reference, against a
 * plain scalar loop in double precision, on fresh random inputs; then the
 * registry itself (lookup, unknown names, the CPU default, a built backend
 * that cannot run here falling back to the CPU with a notice). Device
 * backends take device memory: tests/gpu/ compares them with the CPU op by
 * op. */
#include "backend.h"
#include "kmath.h"
#include "quant.h"
#include "vec.h"
#include "skv.h"
#include "testhelp.h"

#include <stdint.h>

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *rnd(size_t n) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = frand();
    return x;
}

static double rel(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check(const skv_backend *be, const char *op, double err, double tol) {
    char msg[160];
    snprintf(msg, sizeof msg, "%s %s: rel. error %.2e against the scalar loop (bound %.0e)", be->name, op, err, tol);
    test_cond(msg, err <= tol);
}

/* Scalar softmax attention of one query over n rows. */
static void ref_attend(const float *q, const float *K, const float *V, int n, int d, int stride, double scale,
                       double *out) {
    double *p = malloc(sizeof(double) * n), mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) {
        double s = 0;
        for (int t = 0; t < d; t++) s += (double)q[t] * K[(size_t)j * stride + t];
        p[j] = s * scale;
        if (p[j] > mx) mx = p[j];
    }
    for (int j = 0; j < n; j++) sum += p[j] = exp(p[j] - mx);
    for (int t = 0; t < d; t++) {
        double acc = 0;
        for (int j = 0; j < n; j++) acc += p[j] / sum * V[(size_t)j * stride + t];
        out[t] = acc;
    }
    free(p);
}

static void test_matmul(const skv_backend *be) {
    static const enum ggml_type types[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_K, GGML_Q6_K};
    int rows = 40, cols = 256;
    skv_workspace ws = {0};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        enum ggml_type t = types[ti];
        float *w = rnd((size_t)rows * cols);
        size_t rb = ggml_row_size(t, cols);
        uint8_t *W = malloc(rb * rows);
        for (int r = 0; r < rows; r++) quant_quantize_row(t, w + (size_t)r * cols, W + rb * r, cols);
        float *wd = malloc(sizeof(float) * rows * cols); /* the stored weights, dequantized */
        quant_dequant_row(t, W, wd, (size_t)rows * cols);
        for (int n = 1; n <= 5; n += 4) {
            float *x = rnd((size_t)n * cols), *y = malloc(sizeof(float) * n * rows);
            double *yr = malloc(sizeof(double) * n * rows);
            for (int i = 0; i < n; i++)
                for (int r = 0; r < rows; r++) {
                    double acc = 0;
                    for (int j = 0; j < cols; j++) acc += (double)x[(size_t)i * cols + j] * wd[(size_t)r * cols + j];
                    yr[(size_t)i * rows + r] = acc;
                }
            be->matmul(t, W, rows, cols, x, n, y, &ws);
            char op[64];
            snprintf(op, sizeof op, "matmul %s n=%d", ggml_type_name(t), n);
            /* a decode step (n == 1) and a batched one (n <= QUANT_ROWS_MAX: quant_matvec_rows, each
             * row as the matvec computes it) quantize the activations to 8 bits for the quantized types */
            int q = t != GGML_F32 && t != GGML_F16 && t != GGML_BF16;
            check(be, op, rel(y, yr, (size_t)n * rows), n <= QUANT_ROWS_MAX && q ? 2e-2 : 1e-5);
            free(x); free(y); free(yr);
        }
        free(w); free(W); free(wd);
    }
    skv_workspace_free(&ws);
}

/* matmul_k: three matrices against one x give what three matmul calls
 * give, bit for bit (decode and batch); types of one kind share the
 * quantized x, mixed ones do not. */
static void test_matmul_k_types(const skv_backend *be, const enum ggml_type types[3], const char *label) {
    int rows[3] = {70, 33, 48}, cols = 256;
    uint8_t *W[3];
    skv_workspace ws = {0};
    for (int i = 0; i < 3; i++) {
        float *w = rnd((size_t)rows[i] * cols);
        size_t rb = ggml_row_size(types[i], cols);
        W[i] = malloc(rb * rows[i]);
        for (int r = 0; r < rows[i]; r++) quant_quantize_row(types[i], w + (size_t)r * cols, W[i] + rb * r, cols);
        free(w);
    }
    for (int n = 1; n <= 20; n += 19) {
        float *x = rnd((size_t)n * cols), *ya[3], *yb[3];
        for (int i = 0; i < 3; i++) {
            ya[i] = malloc(sizeof(float) * n * rows[i]);
            yb[i] = malloc(sizeof(float) * n * rows[i]);
            be->matmul(types[i], W[i], rows[i], cols, x, n, ya[i], &ws);
        }
        const void *wp[3] = {W[0], W[1], W[2]};
        be->matmul_k(3, types, wp, rows, cols, x, n, yb, &ws);
        int same = 1;
        for (int i = 0; i < 3; i++) same &= !memcmp(ya[i], yb[i], sizeof(float) * n * rows[i]);
        char msg[128];
        snprintf(msg, sizeof msg, "%s matmul_k (%s against one x, n=%d) equals three matmul calls bit for bit",
                 be->name, label, n);
        test_cond(msg, same);
        for (int i = 0; i < 3; i++) { free(ya[i]); free(yb[i]); }
        free(x);
    }
    for (int i = 0; i < 3; i++) free(W[i]);
    skv_workspace_free(&ws);
}

static void test_matmul_k(const skv_backend *be) {
    const enum ggml_type mixed[3] = {GGML_Q8_0, GGML_F32, GGML_Q4_K}, same[3] = {GGML_Q8_0, GGML_Q8_0, GGML_Q8_0};
    test_matmul_k_types(be, mixed, "q8_0, f32, q4_K");
    test_matmul_k_types(be, same, "q8_0 x3");
}

static void test_elementwise(const skv_backend *be) {
    int n = 3, dim = 96;
    /* embed: rows of a q8_0 table */
    {
        int vocab = 10;
        float *tab = rnd((size_t)vocab * dim);
        size_t rb = ggml_row_size(GGML_Q8_0, dim);
        uint8_t *T = malloc(rb * vocab);
        for (int r = 0; r < vocab; r++) quant_quantize_row(GGML_Q8_0, tab + (size_t)r * dim, T + rb * r, dim);
        int32_t ids[3] = {7, 0, 9};
        float *x = malloc(sizeof(float) * n * dim), *row = malloc(sizeof(float) * dim);
        double *xr = malloc(sizeof(double) * n * dim);
        for (int i = 0; i < n; i++) {
            quant_dequant_row(GGML_Q8_0, T + rb * ids[i], row, dim);
            for (int j = 0; j < dim; j++) xr[(size_t)i * dim + j] = row[j];
        }
        be->embed(GGML_Q8_0, T, dim, ids, n, x);
        check(be, "embed q8_0", rel(x, xr, (size_t)n * dim), 0);
        free(tab); free(T); free(x); free(row); free(xr);
    }
    /* rmsnorm */
    {
        float *x = rnd((size_t)n * dim), *w = rnd(dim), *y = malloc(sizeof(float) * n * dim);
        double *yr = malloc(sizeof(double) * n * dim);
        for (int i = 0; i < n; i++) {
            double ss = 0;
            for (int j = 0; j < dim; j++) ss += (double)x[i * dim + j] * x[i * dim + j];
            double s = 1 / sqrt(ss / dim + 1e-5);
            for (int j = 0; j < dim; j++) yr[i * dim + j] = x[i * dim + j] * s * w[j];
        }
        be->rmsnorm(y, x, w, n, dim, 1e-5f);
        check(be, "rmsnorm", rel(y, yr, (size_t)n * dim), 1e-6);
        free(x); free(w); free(y); free(yr);
    }
    /* add_bias, add, swiglu */
    {
        size_t len = (size_t)n * dim;
        float *y = rnd(len), *b = rnd(dim), *x = rnd(len), *g = rnd(len), *u = rnd(len);
        double *r = malloc(sizeof(double) * len);
        for (size_t i = 0; i < len; i++) r[i] = (double)y[i] + b[i % dim];
        be->add_bias(y, b, n, dim);
        check(be, "add_bias", rel(y, r, len), 1e-7);
        for (size_t i = 0; i < len; i++) r[i] = (double)y[i] + x[i];
        be->add(y, x, len);
        check(be, "add", rel(y, r, len), 1e-7);
        for (size_t i = 0; i < len; i++) r[i] = g[i] / (1 + exp(-(double)g[i])) * u[i];
        be->swiglu(g, u, len);
        check(be, "swiglu", rel(g, r, len), 1e-6);
        free(y); free(b); free(x); free(g); free(u); free(r);
    }
    /* rope, both pairings, rows at consecutive positions */
    for (int mode = 0; mode < 2; mode++) {
        int nh = 2, hd = 16, pos0 = 37;
        rope_params p = {.mode = mode ? ROPE_NEOX : ROPE_ADJACENT, .head_dim = hd, .rope_dim = hd, .theta = 10000};
        rope_ctx rc;
        rope_init(&rc, &p, NULL);
        size_t len = (size_t)n * nh * hd;
        float *x = rnd(len);
        double *r = malloc(sizeof(double) * len);
        for (int i = 0; i < n; i++)
            for (int h = 0; h < nh; h++)
                for (int k = 0; k < hd / 2; k++) {
                    double th = (double)(pos0 + i) * pow(10000.0, -2.0 * k / hd);
                    size_t base = ((size_t)i * nh + h) * hd;
                    size_t a = mode ? base + k : base + 2 * k, b = mode ? base + k + hd / 2 : base + 2 * k + 1;
                    r[a] = x[a] * cos(th) - x[b] * sin(th);
                    r[b] = x[a] * sin(th) + x[b] * cos(th);
                }
        be->rope(&rc, x, n, nh, pos0);
        check(be, mode ? "rope rotate-half" : "rope adjacent", rel(x, r, len), 1e-5);
        rope_free(&rc);
        free(x); free(r);
    }
}

/* The fused ops the forward pass runs give what the calls they stand for
 * give, bit for bit (the CPU twin defines the device's results), and the
 * norm its scalar loop. */
static void test_fused(const skv_backend *be) {
    char msg[200];
    /* add_rmsnorm: x += y, out = rmsnorm(x) * w; out apart, and out == y */
    for (int alias = 0; alias < 2; alias++) {
        int n = 5, dim = 96;
        size_t len = (size_t)n * dim;
        float *x = rnd(len), *y = rnd(len), *w = rnd(dim), *x2 = malloc(sizeof(float) * len);
        float *o = malloc(sizeof(float) * len), *o2 = malloc(sizeof(float) * len);
        double *r = malloc(sizeof(double) * len);
        memcpy(x2, x, sizeof(float) * len);
        for (int i = 0; i < n; i++) {
            double ss = 0;
            for (int j = 0; j < dim; j++) {
                double v = (double)(x[i * dim + j] + y[i * dim + j]);
                ss += v * v;
            }
            double s = 1 / sqrt(ss / dim + 1e-5);
            for (int j = 0; j < dim; j++) r[i * dim + j] = (double)(x[i * dim + j] + y[i * dim + j]) * s * w[j];
        }
        be->add(x2, y, len);
        be->rmsnorm(o2, x2, w, n, dim, 1e-5f);
        float *out = alias ? y : o;
        be->add_rmsnorm(x, y, out, w, n, dim, 1e-5f);
        snprintf(msg, sizeof msg, "%s add_rmsnorm (out %s): x and out equal add then rmsnorm bit for bit", be->name,
                 alias ? "== y" : "apart");
        test_cond(msg, !memcmp(x, x2, sizeof(float) * len) && !memcmp(out, o2, sizeof(float) * len));
        check(be, "add_rmsnorm", rel(out, r, len), 1e-6);
        free(x); free(y); free(w); free(x2); free(o); free(o2); free(r);
    }
    /* rope_qk: k_pre, then q and k rotated, at pos0 + i or at pos[i]; rope_dim < head_dim */
    for (int mode = 0; mode < 2; mode++)
        for (int per_row = 0; per_row < 2; per_row++) {
            int n = 4, nh = 4, nkv = 2, hd = 16, pos0 = 37, pos[4] = {5, 900, 0, 37};
            rope_params p = {.mode = mode ? ROPE_NEOX : ROPE_ADJACENT, .head_dim = hd, .rope_dim = 12, .theta = 10000};
            rope_ctx rc;
            rope_init(&rc, &p, NULL);
            size_t ql = (size_t)n * nh * hd, kl = (size_t)n * nkv * hd;
            float *q = rnd(ql), *k = rnd(kl), *q2 = malloc(sizeof(float) * ql), *k2 = malloc(sizeof(float) * kl);
            float *kp = malloc(sizeof(float) * kl), *kp2 = malloc(sizeof(float) * kl);
            memcpy(q2, q, sizeof(float) * ql);
            memcpy(k2, k, sizeof(float) * kl);
            memcpy(kp2, k, sizeof(float) * kl);
            for (int i = 0; i < n; i++) {
                int at = per_row ? pos[i] : pos0 + i;
                be->rope(&rc, q2 + (size_t)i * nh * hd, 1, nh, at);
                be->rope(&rc, k2 + (size_t)i * nkv * hd, 1, nkv, at);
            }
            be->rope_qk(&rc, q, nh, k, nkv, kp, n, pos0, per_row ? pos : NULL);
            snprintf(msg, sizeof msg, "%s rope_qk (%s, %s): k_pre, q and k equal a copy and two rope calls bit for bit",
                     be->name, mode ? "rotate-half" : "adjacent", per_row ? "a position a row" : "pos0 + i");
            test_cond(msg, !memcmp(q, q2, sizeof(float) * ql) && !memcmp(k, k2, sizeof(float) * kl) &&
                           !memcmp(kp, kp2, sizeof(float) * kl));
            rope_free(&rc);
            free(q); free(k); free(q2); free(k2); free(kp); free(kp2);
        }
    /* matmul_swiglu: matmul_k of gate and up, then swiglu */
    {
        int rows = 70, cols = 256;
        skv_workspace ws = {0};
        enum ggml_type t[2] = {GGML_Q8_0, GGML_BF16};
        uint8_t *W[2];
        for (int i = 0; i < 2; i++) {
            float *w = rnd((size_t)rows * cols);
            size_t rb = ggml_row_size(t[i], cols);
            W[i] = malloc(rb * rows);
            for (int r = 0; r < rows; r++) quant_quantize_row(t[i], w + (size_t)r * cols, W[i] + rb * r, cols);
            free(w);
        }
        for (int n = 1; n <= 20; n += 19) {
            size_t len = (size_t)n * rows;
            float *x = rnd((size_t)n * cols), *g = malloc(sizeof(float) * len), *u = malloc(sizeof(float) * len);
            float *g2 = malloc(sizeof(float) * len), *u2 = malloc(sizeof(float) * len);
            const void *wp[2] = {W[0], W[1]};
            int rr[2] = {rows, rows};
            float *y[2] = {g2, u2};
            be->matmul_k(2, t, wp, rr, cols, x, n, y, &ws);
            be->swiglu(g2, u2, len);
            be->matmul_swiglu(t[0], W[0], t[1], W[1], rows, cols, x, n, g, u, &ws);
            snprintf(msg, sizeof msg, "%s matmul_swiglu (n=%d) equals matmul_k then swiglu bit for bit", be->name, n);
            test_cond(msg, !memcmp(g, g2, sizeof(float) * len));
            free(x); free(g); free(u); free(g2); free(u2);
        }
        for (int i = 0; i < 2; i++) free(W[i]);
        skv_workspace_free(&ws);
    }
}

static void test_attention(const skv_backend *be) {
    /* attend_rows: one query over a strided row set */
    {
        int n = 45, d = 32, stride = 3 * d;
        float *q = rnd(d), *K = rnd((size_t)n * stride), *V = rnd((size_t)n * stride), out[32];
        double r[32];
        ref_attend(q, K + d, V + d, n, d, stride, 0.3, r);
        be->attend_rows(q, K + d, V + d, n, d, stride, 0.3f, out);
        check(be, "attend_rows", rel(out, r, d), 1e-5);
        free(q); free(K); free(V);
    }
    /* attend_group: a GQA group of 4 query heads over one KV head's rows
     * (more rows than its stack scratch holds, too); then the same rows split
     * in 3 partial results and merged, one of them empty */
    for (int n = 45; n <= 3000; n += 2955) {
        int g = 4, d = 32, stride = 3 * d;
        float *q = rnd((size_t)g * d), *K = rnd((size_t)n * stride), *V = rnd((size_t)n * stride);
        float *out = malloc(sizeof(float) * g * d), *po = malloc(sizeof(float) * 3 * g * d);
        float pm[12], pl[12];
        double *r = malloc(sizeof(double) * g * d);
        for (int a = 0; a < g; a++) ref_attend(q + (size_t)a * d, K + d, V + d, n, d, stride, 0.3, r + (size_t)a * d);
        be->attend_group(q, g, K + d, V + d, SKV_ELT_F32, n, d, stride, 0.3f, out, NULL, NULL);
        check(be, n > 1000 ? "attend_group (3000 rows)" : "attend_group", rel(out, r, (size_t)g * d), 1e-5);
        int cut[4] = { 0, n / 3, n / 3, n };
        for (int p = 0; p < 3; p++)
            be->attend_group(q, g, K + d + (size_t)cut[p] * stride, V + d + (size_t)cut[p] * stride, SKV_ELT_F32,
                             cut[p + 1] - cut[p], d, stride, 0.3f, po + (size_t)p * g * d, pm + p * g, pl + p * g);
        be->attend_merge(3, g, d, po, pm, pl, out);
        check(be, n > 1000 ? "attend_group in 3 parts + attend_merge (3000 rows)" : "attend_group in 3 parts + attend_merge",
              rel(out, r, (size_t)g * d), 1e-5);
        free(q); free(K); free(V); free(out); free(po); free(r);
    }
    /* attend_group on the CPU, head_dim 64 and 128 (the widths the
     * register-held output path takes, groups up to 4) and groups of 1 to 6
     * (5 and 6 take the four-row loop): near the double reference, and each
     * head's output, whole or as a part's (out, m, l), the same bits as that
     * head attended alone, so the two loops sum in the same order */
    if (be == &skv_backend_cpu)
        for (int d = 64; d <= 128; d += 64)
            for (int n = 1; n <= 130; n += 129)
                for (int g = 1; g <= 6; g++) {
                    int stride = 3 * d;
                    float *q = rnd((size_t)g * d), *K = rnd((size_t)n * stride), *V = rnd((size_t)n * stride);
                    float *out = malloc(sizeof(float) * g * d), *po = malloc(sizeof(float) * g * d), one[128];
                    float pm[6], pl[6], m1, l1;
                    double *r = malloc(sizeof(double) * g * d);
                    for (int a = 0; a < g; a++)
                        ref_attend(q + (size_t)a * d, K + d, V + d, n, d, stride, 0.3, r + (size_t)a * d);
                    be->attend_group(q, g, K + d, V + d, SKV_ELT_F32, n, d, stride, 0.3f, out, NULL, NULL);
                    be->attend_group(q, g, K + d, V + d, SKV_ELT_F32, n, d, stride, 0.3f, po, pm, pl);
                    int same = 1;
                    for (int a = 0; a < g; a++) {
                        be->attend_group(q + (size_t)a * d, 1, K + d, V + d, SKV_ELT_F32, n, d, stride, 0.3f, one, NULL,
                                         NULL);
                        same &= !memcmp(one, out + (size_t)a * d, sizeof(float) * d);
                        be->attend_group(q + (size_t)a * d, 1, K + d, V + d, SKV_ELT_F32, n, d, stride, 0.3f, one, &m1,
                                         &l1);
                        same &= !memcmp(one, po + (size_t)a * d, sizeof(float) * d) && m1 == pm[a] && l1 == pl[a];
                    }
                    char msg[256];
                    snprintf(msg, sizeof msg, "attend_group, head_dim %d, %d rows, group %d: each head as alone, bitwise",
                             d, n, g);
                    test_cond(msg, same && rel(out, r, (size_t)g * d) < 1e-5);
                    /* bf16 rows (ShadowKV's): the bits of f32 rows holding the
                     * same values, whole and as a part; and different from
                     * the unrounded rows' (the rows are read as bf16) */
                    size_t nv = (size_t)n * stride;
                    uint16_t *Kb = malloc(sizeof(uint16_t) * nv), *Vb = malloc(sizeof(uint16_t) * nv);
                    float *Kr = malloc(sizeof(float) * nv), *Vr = malloc(sizeof(float) * nv);
                    float *ob = malloc(sizeof(float) * g * d), *pb = malloc(sizeof(float) * g * d), pmb[6], plb[6];
                    for (size_t i = 0; i < nv; i++) {
                        Kb[i] = km_f32_to_bf16(K[i]), Vb[i] = km_f32_to_bf16(V[i]);
                        Kr[i] = km_bf16_to_f32(Kb[i]), Vr[i] = km_bf16_to_f32(Vb[i]);
                    }
                    be->attend_group(q, g, Kr + d, Vr + d, SKV_ELT_F32, n, d, stride, 0.3f, out, NULL, NULL);
                    be->attend_group(q, g, Kr + d, Vr + d, SKV_ELT_F32, n, d, stride, 0.3f, po, pm, pl);
                    be->attend_group(q, g, Kb + d, Vb + d, SKV_ELT_BF16, n, d, stride, 0.3f, ob, NULL, NULL);
                    be->attend_group(q, g, Kb + d, Vb + d, SKV_ELT_BF16, n, d, stride, 0.3f, pb, pmb, plb);
                    same = !memcmp(out, ob, sizeof(float) * g * d) && !memcmp(po, pb, sizeof(float) * g * d) &&
                           !memcmp(pm, pmb, sizeof(float) * g) && !memcmp(pl, plb, sizeof(float) * g);
                    double moved = rel(ob, r, (size_t)g * d);
                    snprintf(msg, sizeof msg,
                             "attend_group on bf16 rows, head_dim %d, %d rows, group %d: the bits of their f32 values "
                             "(%.1e from the unrounded rows' reference, under 2^-6)", d, n, g, moved);
                    test_cond(msg, same && moved > 1e-6 && moved < 1.0 / 64);
                    free(Kb); free(Vb); free(Kr); free(Vr); free(ob); free(pb);
                    free(q); free(K); free(V); free(out); free(po); free(r);
                }
    /* attend_causal: GQA 3:1, a block of queries after a prefix */
    {
        int nh = 6, nkv = 2, d = 16, pos = 70, nq = 70, stride = nkv * d, T = pos + nq;
        float *q = rnd((size_t)nq * nh * d), *K = rnd((size_t)T * stride), *V = rnd((size_t)T * stride);
        float *out = malloc(sizeof(float) * nq * nh * d);
        double *r = malloc(sizeof(double) * nq * nh * d);
        for (int i = 0; i < nq; i++)
            for (int h = 0; h < nh; h++)
                ref_attend(q + ((size_t)i * nh + h) * d, K + (size_t)(h / 3) * d, V + (size_t)(h / 3) * d, pos + i + 1,
                           d, stride, 1 / sqrt(d), r + ((size_t)i * nh + h) * d);
        be->attend_causal(q, nq, pos, nh, nkv, d, K, V, stride, (size_t)d, out);
        check(be, "attend_causal", rel(out, r, (size_t)nq * nh * d), 1e-5);
        /* the same keys and values head-major: head kh at kh*T*d, rows d apart */
        float *Kh = malloc(sizeof(float) * (size_t)T * stride), *Vh = malloc(sizeof(float) * (size_t)T * stride);
        for (int t = 0; t < T; t++)
            for (int kh = 0; kh < nkv; kh++) {
                memcpy(Kh + ((size_t)kh * T + t) * d, K + (size_t)t * stride + (size_t)kh * d, sizeof(float) * d);
                memcpy(Vh + ((size_t)kh * T + t) * d, V + (size_t)t * stride + (size_t)kh * d, sizeof(float) * d);
            }
        be->attend_causal(q, nq, pos, nh, nkv, d, Kh, Vh, d, (size_t)T * d, out);
        check(be, "attend_causal, head-major keys and values", rel(out, r, (size_t)nq * nh * d), 1e-5);
        free(Kh); free(Vh);
        free(q); free(K); free(V); free(out); free(r);
    }
}

/* The half-precision cache: conversions (F16C where built in, against the
 * portable code), then kv_store_h, attend_decode_h and attend_causal_h
 * against the f32 ops on the same values widened: the same bits. */
static void test_f16_cache(const skv_backend *be) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h += 8) {
        uint16_t in[8];
        float out[8];
        for (int i = 0; i < 8; i++) in[i] = (uint16_t)(h + i);
        vec_from_f16(out, in, 8);
        for (int i = 0; i < 8; i++) {
            float sw = fp16_to_f32(in[i]);
            uint32_t a, b;
            memcpy(&a, &out[i], 4);
            memcpy(&b, &sw, 4);
            int nan = ((in[i] >> 10) & 0x1f) == 0x1f && (in[i] & 0x3ff);
            if (a != b && !(nan && isnan(out[i]) && isnan(sw))) bad++;
            /* every finite half survives f16 -> f32 -> f16 */
            if (!nan && f32_to_fp16(sw) != in[i]) bad++;
        }
    }
    test_cond("f16 -> f32: vectorized and portable agree on all 65536 halves, and round-trip", bad == 0);
    /* f32 -> f16 rounding: random floats over the half range and its edges, ties, overflow, subnormals */
    static const float edge[] = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e9f, 6.1035156e-5f,
                                 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
                                 3.0e-6f, -7.5e-7f, INFINITY, -INFINITY, 1e-30f};
    int ne = sizeof edge / sizeof edge[0], n = 4096 + ne;
    float *x = malloc(sizeof(float) * n);
    for (int i = 0; i < 4096; i++) x[i] = frand() * ldexpf(1.0f, (int)(frand() * 20));
    memcpy(x + 4096, edge, sizeof edge);
    uint16_t *y = malloc(sizeof(uint16_t) * n);
    vec_to_f16(y, x, n);
    bad = 0;
    for (int i = 0; i < n; i++) {
        if (y[i] != f32_to_fp16(x[i])) bad++;
        /* nearest: no half lies closer to x than the one chosen */
        if (isfinite(x[i]) && fabsf(x[i]) < 65504.0f) {
            double e = fabs((double)fp16_to_f32(y[i]) - x[i]);
            uint16_t up = (uint16_t)(y[i] + 1), dn = (uint16_t)(y[i] - 1);
            if (((up >> 10) & 0x1f) != 0x1f && fabs((double)fp16_to_f32(up) - x[i]) < e) bad++;
            if ((y[i] & 0x7fff) && fabs((double)fp16_to_f32(dn) - x[i]) < e) bad++;
        }
    }
    test_cond("f32 -> f16: vectorized and portable agree, round to nearest (ties, overflow, subnormals)", bad == 0);
    test_cond("f32 -> f16: 65520 overflows to inf, 65519.99 stays 65504, 2^-25 ties to 0",
              f32_to_fp16(65520.0f) == 0x7c00 && f32_to_fp16(65519.99f) == 0x7bff &&
                  f32_to_fp16(2.9802322e-8f) == 0 && f32_to_fp16(2.9802326e-8f) == 1);
    free(x);
    free(y);
    if (!be->kv_store_h || !be->attend_decode_h || !be->attend_causal_h) return;

    /* head_dim 64, and 272: past the 256 values a widened row may hold,
     * where the loops read the half rows directly */
    for (int di = 0; di < 2; di++) {
        int nh = 9, nkv = 3, d = di ? 272 : 64, pos = 300, nq = 70, T = pos + nq, stride = nkv * d;
        size_t hs = (size_t)T * d; /* head-major, as the dense cache keeps them */
        float *q = rnd((size_t)nq * nh * d), *K = rnd((size_t)T * stride), *V = rnd((size_t)T * stride);
        uint16_t *K16 = calloc(nkv * hs, 2), *V16 = calloc(nkv * hs, 2);
        float *Kw = malloc(sizeof(float) * nkv * hs), *Vw = malloc(sizeof(float) * nkv * hs);
        be->kv_store_h(K16, hs, nkv, d, 0, T, K);
        be->kv_store_h(V16, hs, nkv, d, 0, T, V);
        bad = 0;
        for (int t = 0; t < T; t++)
            for (int kh = 0; kh < nkv; kh++)
                for (int e = 0; e < d; e++) {
                    size_t at = (size_t)kh * hs + (size_t)t * d + e;
                    bad += K16[at] != f32_to_fp16(K[(size_t)t * stride + kh * d + e]);
                    bad += V16[at] != f32_to_fp16(V[(size_t)t * stride + kh * d + e]);
                    Kw[at] = fp16_to_f32(K16[at]);
                    Vw[at] = fp16_to_f32(V16[at]);
                }
        char msg[160];
        snprintf(msg, sizeof msg, "kv_store_h, head_dim %d: head-major rows, each value rounded to nearest f16", d);
        test_cond(msg, bad == 0);
        float *a = malloc(sizeof(float) * nq * nh * d), *b = malloc(sizeof(float) * nq * nh * d);
        for (int rows = 1; rows <= T; rows += T - 1) {
            be->attend_decode(q, nh, nkv, d, Kw, Vw, rows, d, hs, a);
            be->attend_decode_h(q, nh, nkv, d, K16, V16, rows, d, hs, b);
            snprintf(msg, sizeof msg, "attend_decode_h, head_dim %d, over %d rows: the f32 op's bits on the widened cache",
                     d, rows);
            test_cond(msg, !memcmp(a, b, sizeof(float) * nh * d));
        }
        be->attend_causal(q, nq, pos, nh, nkv, d, Kw, Vw, d, hs, a);
        be->attend_causal_h(q, nq, pos, nh, nkv, d, K16, V16, d, hs, b);
        snprintf(msg, sizeof msg, "attend_causal_h, head_dim %d: the f32 op's bits on the widened cache", d);
        test_cond(msg, !memcmp(a, b, sizeof(float) * nq * nh * d));
        free(q); free(K); free(V); free(K16); free(V16); free(Kw); free(Vw); free(a); free(b);
    }
}

/* A batch's decode step (kv_store_batch, attend_decode_batch and their
 * half-precision forms): n sequences of different lengths, each its own
 * head-major cache, against kv_store and attend_decode per sequence: the
 * same stored bits and the same outputs bit for bit, GQA groups 1, 4 and 7. */
static void test_decode_batch(const skv_backend *be) {
    if (!be->kv_store_batch || !be->attend_decode_batch) return;
    static const int grp[3] = {1, 4, 7}, rows[3] = {1, 300, 1100};
    int nkv = 2, d = 64, n = 3;
    for (int half = 0; half < 2; half++) {
        if (half && (!be->kv_store_batch_h || !be->attend_decode_batch_h)) continue;
        for (int gi = 0; gi < 3; gi++) {
            int nh = grp[gi] * nkv;
            size_t el = half ? 2 : 4, kvd = (size_t)nkv * d, qd = (size_t)nh * d;
            skv_kv_seq a[3], b[3];
            size_t cl[3];
            for (int i = 0; i < n; i++) {
                int cap = rows[i] + 5, pos = rows[i] - 1;
                cl[i] = (size_t)nkv * cap * d * el;
                float *src = rnd((size_t)rows[i] * kvd);
                a[i] = (skv_kv_seq){.k = calloc(cl[i], 1), .v = calloc(cl[i], 1), .head_stride = (size_t)cap * d,
                                    .pos = pos};
                if (half) {
                    be->kv_store_h(a[i].k, a[i].head_stride, nkv, d, 0, pos, src);
                    be->kv_store_h(a[i].v, a[i].head_stride, nkv, d, 0, pos, src);
                } else {
                    be->kv_store(a[i].k, a[i].head_stride, nkv, d, 0, pos, src);
                    be->kv_store(a[i].v, a[i].head_stride, nkv, d, 0, pos, src);
                }
                b[i] = a[i];
                b[i].k = malloc(cl[i]);
                b[i].v = malloc(cl[i]);
                memcpy(b[i].k, a[i].k, cl[i]);
                memcpy(b[i].v, a[i].v, cl[i]);
                free(src);
            }
            float *k = rnd(n * kvd), *v = rnd(n * kvd), *q = rnd(n * qd);
            float *oa = malloc(sizeof(float) * n * qd), *ob = malloc(sizeof(float) * n * qd);
            int rc = 0;
            for (int i = 0; i < n; i++) {
                if (half) {
                    be->kv_store_h(a[i].k, a[i].head_stride, nkv, d, a[i].pos, 1, k + i * kvd);
                    be->kv_store_h(a[i].v, a[i].head_stride, nkv, d, a[i].pos, 1, v + i * kvd);
                    rc |= be->attend_decode_h(q + i * qd, nh, nkv, d, a[i].k, a[i].v, a[i].pos + 1, d,
                                              a[i].head_stride, oa + i * qd);
                } else {
                    be->kv_store(a[i].k, a[i].head_stride, nkv, d, a[i].pos, 1, k + i * kvd);
                    be->kv_store(a[i].v, a[i].head_stride, nkv, d, a[i].pos, 1, v + i * kvd);
                    rc |= be->attend_decode(q + i * qd, nh, nkv, d, a[i].k, a[i].v, a[i].pos + 1, d,
                                            a[i].head_stride, oa + i * qd);
                }
            }
            (half ? be->kv_store_batch_h : be->kv_store_batch)(b, n, nkv, d, k, v);
            rc |= (half ? be->attend_decode_batch_h : be->attend_decode_batch)(b, n, nh, nkv, d, q, ob);
            int same = 1;
            for (int i = 0; i < n; i++) same &= !memcmp(a[i].k, b[i].k, cl[i]) && !memcmp(a[i].v, b[i].v, cl[i]);
            char msg[200];
            snprintf(msg, sizeof msg, "kv_store_batch%s and attend_decode_batch%s, 3 sequences of %d, %d and %d rows, "
                     "GQA %d:1: the per-sequence ops' rows and outputs bit for bit", half ? "_h" : "",
                     half ? "_h" : "", rows[0], rows[1], rows[2], grp[gi]);
            test_cond(msg, rc == 0 && same && !memcmp(oa, ob, sizeof(float) * n * qd));
            for (int i = 0; i < n; i++) {
                free(a[i].k); free(a[i].v); free(b[i].k); free(b[i].v);
            }
            free(k); free(v); free(q); free(oa); free(ob);
        }
    }
}

/* Not inlined into main: there, under ASan's detect_stack_use_after_return,
 * GCC's 64-byte-aligned AVX-512 stores into its arrays (acc[16]) met a fake
 * stack frame that was not realigned, and faulted once main's frame grew. */
static __attribute__((noinline)) void test_sparse_stages(const skv_backend *be) {
    int s = 64, n = 24, r = 5, d = 8, c = 4, nch = s / c;
    float *K = rnd((size_t)s * n);
    /* svd: U·SVt is the best rank-r approximation; check orthonormal U and the error it reports */
    {
        float *U = malloc(sizeof(float) * s * r), *SVt = malloc(sizeof(float) * r * n), sv[24], err;
        int rc = be->svd(K, s, n, r, U, SVt, NULL, sv, &err);
        test_cond("svd returns 0", rc == 0);
        double num = 0, den = 0, orth = 0;
        for (int i = 0; i < s; i++)
            for (int j = 0; j < n; j++) {
                double a = 0;
                for (int t = 0; t < r; t++) a += (double)U[i * r + t] * SVt[t * n + j];
                num += (a - K[i * n + j]) * (a - K[i * n + j]);
                den += (double)K[i * n + j] * K[i * n + j];
            }
        for (int a = 0; a < r; a++)
            for (int b = 0; b < r; b++) {
                double dot = 0;
                for (int i = 0; i < s; i++) dot += (double)U[i * r + a] * U[i * r + b];
                orth = fmax(orth, fabs(dot - (a == b)));
            }
        double tail = 0;
        for (int i = r; i < n; i++) tail += (double)sv[i] * sv[i];
        char msg[160];
        snprintf(msg, sizeof msg, "%s svd: ||K-U·SVt||/||K|| %.4f = reported %.4f = sqrt(tail sv^2)/||K|| %.4f; "
                 "U orthonormal within %.1e", be->name, sqrt(num / den), err, sqrt(tail / den), orth);
        test_cond(msg, fabs(sqrt(num / den) - err) < 1e-4 && fabs(sqrt(tail / den) - err) < 1e-4 && orth < 1e-5);
        free(U); free(SVt);
    }
    /* landmarks and cos_min of head 1 (rows n floats apart) */
    float *lm = malloc(sizeof(float) * nch * d), *cm = malloc(sizeof(float) * nch);
    {
        double *lr = malloc(sizeof(double) * nch * d), *cr = malloc(sizeof(double) * nch);
        const float *Kh = K + d;
        for (int j = 0; j < nch; j++)
            for (int t = 0; t < d; t++) {
                double acc = 0;
                for (int i = 0; i < c; i++) acc += Kh[(size_t)(j * c + i) * n + t];
                lr[j * d + t] = acc / c;
            }
        be->landmarks(Kh, n, d, c, nch, lm);
        check(be, "landmarks", rel(lm, lr, (size_t)nch * d), 1e-6);
        for (int j = 0; j < nch; j++) {
            double mn = INFINITY;
            for (int i = 0; i < c; i++) {
                double dot = 0, a = 0, b = 0;
                for (int t = 0; t < d; t++) {
                    double k = Kh[(size_t)(j * c + i) * n + t], l = lm[j * d + t];
                    dot += k * l, a += k * k, b += l * l;
                }
                mn = fmin(mn, a > 0 && b > 0 ? dot / sqrt(a * b) : 0);
            }
            cr[j] = mn;
        }
        be->cos_min(Kh, n, d, c, nch, lm, cm);
        check(be, "cos_min", rel(cm, cr, nch), 1e-5);
        free(lr); free(cr);
    }
    /* score: softmax per query head over landmarks, summed over positions, max over the group */
    {
        int group = 2, nq = 3;
        size_t qs = (size_t)group * d;
        float *q = rnd(nq * qs), score[16], tmp[64], lmw[16 * 8];
        uint16_t lm_h[16 * 8]; /* the landmarks in IEEE half, as the op takes them; the reference on their values */
        SKV_ASSERT(nch * d <= 16 * 8);
        vec_to_f16(lm_h, lm, nch * d);
        vec_from_f16(lmw, lm_h, nch * d);
        double ref[16];
        for (int j = 0; j < nch; j++) ref[j] = -INFINITY;
        for (int g = 0; g < group; g++) {
            double acc[16] = {0};
            for (int i = 0; i < nq; i++) {
                double l[16], mx = -INFINITY, sum = 0;
                for (int j = 0; j < nch; j++) {
                    double dot = 0;
                    for (int t = 0; t < d; t++) dot += (double)q[i * qs + g * d + t] * lmw[j * d + t];
                    l[j] = dot * 0.25;
                    mx = fmax(mx, l[j]);
                }
                for (int j = 0; j < nch; j++) sum += l[j] = exp(l[j] - mx);
                for (int j = 0; j < nch; j++) acc[j] += l[j] / sum;
            }
            for (int j = 0; j < nch; j++) ref[j] = fmax(ref[j], acc[j]);
        }
        be->score(q, nq, qs, group, d, lm_h, nch, 0.25f, tmp, score);
        check(be, "score", rel(score, ref, nch), 1e-5);
        /* topk: the k best by a full scan, ties to the lower index */
        int k = 5, idx[16], got = be->topk(score, nch, k, idx), ok = got == k;
        int used[16] = {0};
        for (int i = 0; i < k && ok; i++) {
            int best = -1;
            for (int j = 0; j < nch; j++)
                if (!used[j] && (best < 0 || score[j] > score[best])) best = j;
            used[best] = 1;
            ok = idx[i] == best;
        }
        char msg[96];
        snprintf(msg, sizeof msg, "%s topk: the %d best indices, best first, as a full scan finds them", be->name, k);
        test_cond(msg, ok);
        free(q);
    }
    /* gather: bf16 blocks widened into strided destinations */
    {
        int rows = 4, cols = 8, nb = 6, stride = 12;
        float *srcf = rnd((size_t)nb * rows * cols), *dst = calloc((size_t)3 * rows * stride, sizeof(float));
        uint16_t *src = malloc(sizeof(uint16_t) * (size_t)nb * rows * cols);
        for (int i = 0; i < nb * rows * cols; i++) src[i] = km_f32_to_bf16(srcf[i]);
        int sidx[3] = {5, 0, 3};
        size_t off[3] = {2, (size_t)rows * stride + 4, (size_t)2 * rows * stride};
        double *ref = calloc((size_t)3 * rows * stride, sizeof(double));
        for (int i = 0; i < 3; i++)
            for (int rr = 0; rr < rows; rr++)
                for (int t = 0; t < cols; t++)
                    ref[off[i] + (size_t)rr * stride + t] = km_bf16_to_f32(src[((size_t)sidx[i] * rows + rr) * cols + t]);
        be->gather(src, rows, cols, sidx, 3, dst, SKV_ELT_F32, off, stride);
        check(be, "gather", rel(dst, ref, (size_t)3 * rows * stride), 0);
        /* into bf16 rows: the stored bits as they are, nothing else written */
        uint16_t *db = malloc(sizeof(uint16_t) * 3 * rows * stride);
        for (int i = 0; i < 3 * rows * stride; i++) db[i] = 0xdead;
        be->gather(src, rows, cols, sidx, 3, db, SKV_ELT_BF16, off, stride);
        int same = 1;
        for (int i = 0; i < 3 * rows * stride; i++)
            same &= ref[i] != 0 ? db[i] == km_f32_to_bf16((float)ref[i]) : db[i] == 0xdead || db[i] == 0;
        test_cond("gather into bf16 rows: each block's bits at its offset, the rest untouched", same);
        free(db);
        free(src); free(srcf); free(dst); free(ref);
    }
    /* rebuild: RoPE(U[t0+i]·svt) at position t0+i; project: V_r·V_rᵀ·x */
    {
        int rr = 3, t0 = 9, nr = 4;
        rope_params p = {.mode = ROPE_ADJACENT, .head_dim = d, .rope_dim = d, .theta = 10000};
        rope_ctx rc;
        rope_init(&rc, &p, NULL);
        float *Uf = rnd((size_t)(t0 + nr) * rr), *svt = rnd((size_t)rr * d), *out = malloc(sizeof(float) * nr * d);
        uint16_t U[(8 + 9) * 3]; /* U in bf16, as the op takes it; the reference on its values */
        SKV_ASSERT((t0 + nr) * rr <= (int)(sizeof U / sizeof U[0]));
        for (int i = 0; i < (t0 + nr) * rr; i++) U[i] = km_f32_to_bf16(Uf[i]);
        double *ref = malloc(sizeof(double) * nr * d);
        for (int i = 0; i < nr; i++) {
            double row[8];
            for (int t = 0; t < d; t++) {
                row[t] = 0;
                for (int j = 0; j < rr; j++) row[t] += (double)km_bf16_to_f32(U[(t0 + i) * rr + j]) * svt[j * d + t];
            }
            for (int k = 0; k < d / 2; k++) {
                double th = (double)(t0 + i) * pow(10000.0, -2.0 * k / d);
                ref[i * d + 2 * k] = row[2 * k] * cos(th) - row[2 * k + 1] * sin(th);
                ref[i * d + 2 * k + 1] = row[2 * k] * sin(th) + row[2 * k + 1] * cos(th);
            }
        }
        be->rebuild(U, rr, svt, d, t0, nr, &rc, NULL, NULL, out, SKV_ELT_F32);
        check(be, "rebuild", rel(out, ref, (size_t)nr * d), 1e-5);
        /* to bf16 rows: each f32 result rounded to nearest even */
        uint16_t ob[4 * 8];
        SKV_ASSERT(nr * d <= 32);
        be->rebuild(U, rr, svt, d, t0, nr, &rc, NULL, NULL, ob, SKV_ELT_BF16);
        int same = 1;
        for (int i = 0; i < nr * d; i++) same &= ob[i] == km_f32_to_bf16(out[i]);
        test_cond("rebuild into bf16 rows: the f32 rebuild rounded to nearest even", same);
        float *Vt = rnd((size_t)rr * n), *x = rnd(n), y[24], coef[3];
        double yr[24];
        for (int j = 0; j < n; j++) {
            yr[j] = 0;
            for (int a = 0; a < rr; a++) {
                double dot = 0;
                for (int t = 0; t < n; t++) dot += (double)Vt[a * n + t] * x[t];
                yr[j] += dot * Vt[a * n + j];
            }
        }
        be->project(Vt, rr, n, x, y, coef);
        check(be, "project", rel(y, yr, n), 1e-5);
        rope_free(&rc);
        free(Uf); free(svt); free(out); free(ref); free(Vt); free(x);
    }
    /* buffers: a round trip through the backend's memory */
    {
        float *h = rnd(100), back[100];
        void *dev = be->alloc(sizeof back);
        test_cond("alloc gives memory", dev != NULL);
        be->upload(dev, h, sizeof back);
        be->download(back, dev, sizeof back);
        be->free(dev);
        test_cond("upload then download returns the same bytes", !memcmp(h, back, sizeof back));
        free(h);
    }
    free(lm); free(cm); free(K);
}

int main(void) {
    test_cond("the registry has at least the CPU backend, first", skv_backend_count() >= 1 &&
              !strcmp(skv_backend_at(0)->name, "cpu"));
    test_cond("find(\"cpu\") is the CPU backend", skv_backend_find("cpu") == &skv_backend_cpu);
    test_cond("find(NULL) is the default", skv_backend_find(NULL) == skv_backend_at(0));
    test_cond("an unknown backend is refused, naming it and the known ones",
              !skv_backend_find("tpu") && strstr(skv_last_error(), "'tpu'") && strstr(skv_last_error(), "cpu"));
    char notice[256];
    test_cond("pick(cpu) runs on cpu with no notice",
              skv_backend_pick("cpu", notice, sizeof notice) == &skv_backend_cpu && !notice[0]);
    for (int i = 1; i < skv_backend_count(); i++) {
        const skv_backend *be = skv_backend_at(i);
        char why[160] = "", msg[512];
        if (!be->available || be->available(why, sizeof why)) continue;
        const skv_backend *got = skv_backend_pick(be->name, notice, sizeof notice);
        snprintf(msg, sizeof msg, "backend %s, built but not runnable here, falls back to cpu with one notice: %s",
                 be->name, notice);
        test_cond(msg, got == &skv_backend_cpu && strstr(notice, be->name) && strstr(notice, "running on cpu") &&
                       !strchr(notice, '\n'));
    }
    const skv_backend *be = &skv_backend_cpu;
    test_matmul(be);
    test_matmul_k(be);
    test_elementwise(be);
    test_fused(be);
    test_attention(be);
    test_f16_cache(be);
    test_decode_batch(be);
    test_sparse_stages(be);
    return test_report("test_backend");
}
