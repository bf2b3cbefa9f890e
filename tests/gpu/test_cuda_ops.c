/* test_cuda_ops.c: every op of the CUDA backend against its CPU twin (the
 * op of the same name in the CPU backend), on fresh random inputs: the
 * inputs are uploaded, the CUDA op runs on device memory, its output comes
 * back and is compared with the CPU op's (relative L2 within fp32 bounds,
 * or BF16 bounds for the BF16 GEMM). Also the timeline: a span per op on
 * the right stream, in order. Without a device (or in a build without
 * CUDA) it skips with one line. tests/gpu/run.sh runs it on a device. */
#include "backend.h"
#include "quant.h"
#include "shadowkv_ops.h"
#include "skv.h"
#include "testhelp.h"

#include <stdint.h>

/* On the CUDA simulator (tests/cusim, SKV_CUSIM) the shapes shrink to what
 * still takes every branch (split decode, tails, partial tiles, GQA groups
 * of 1, 4 and 7, head dims 32 to 128): a simulated thread is a fiber. */
#ifdef SKV_CUSIM
#define SIM(gpu, sim) (sim)
#else
#define SIM(gpu, sim) (gpu)
#endif

static const skv_backend *cu;
static const skv_backend *cpu = &skv_backend_cpu;

static uint64_t rs = 0x6a09e667f3bcc909ull;
static float frand(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static float *rnd(size_t n) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = frand();
    return x;
}

/* Device copies of host arrays, and back. */
static void *dev(const void *h, size_t bytes) {
    void *d = cu->alloc(bytes);
    SKV_ASSERT(d);
    if (h) cu->upload(d, h, bytes);
    return d;
}
static float *back(const void *d, size_t n) {
    float *h = malloc(sizeof(float) * (n ? n : 1));
    cu->download(h, d, sizeof(float) * n);
    return h;
}

static void cmp(const char *op, const float *gpu, const float *ref, size_t n, double tol) {
    double e = test_rel_l2(gpu, ref, n);
    char msg[200];
    snprintf(msg, sizeof msg, "cuda %s: rel L2 %.2e from the CPU twin (bound %.0e)", op, e, tol);
    test_cond(msg, e <= tol);
}

static void t_matmul(void) {
    int rows = 300, cols = 512;
    skv_workspace ws = {0};
    enum ggml_type types[] = {GGML_F32, GGML_Q8_0, GGML_Q4_K};
    for (int ti = 0; ti < 3; ti++) {
        enum ggml_type t = types[ti];
        float *w = rnd((size_t)rows * cols);
        size_t rb = ggml_row_size(t, cols);
        uint8_t *W = malloc(rb * rows);
        for (int r = 0; r < rows; r++) quant_quantize_row(t, w + (size_t)r * cols, W + rb * r, cols);
        /* the CPU twin multiplies the BF16 weights the device holds */
        float *wd = malloc(sizeof(float) * rows * cols);
        quant_dequant_row(t, W, wd, (size_t)rows * cols);
        uint16_t *wb = malloc(sizeof(uint16_t) * rows * cols);
        for (size_t i = 0; i < (size_t)rows * cols; i++) wb[i] = f32_to_bf16(wd[i]);
        skv_weight gw;
        test_cond("cuda weight_load takes the tensor", cu->weight_load(t, W, rows, cols, &gw) == 0 &&
                  gw.type == GGML_BF16);
        for (int n = 1; n <= 37; n += 36) {
            float *x = rnd((size_t)n * cols), *yc = malloc(sizeof(float) * n * rows);
            cpu->matmul(GGML_BF16, wb, rows, cols, x, n, yc, &ws);
            float *dx = dev(x, sizeof(float) * n * cols), *dy = dev(NULL, sizeof(float) * n * rows);
            cu->matmul(gw.type, gw.data, rows, cols, dx, n, dy, &ws);
            float *yg = back(dy, (size_t)n * rows);
            char op[64];
            snprintf(op, sizeof op, "matmul %s->bf16 n=%d", ggml_type_name(t), n);
            cmp(op, yg, yc, (size_t)n * rows, 1e-2); /* x rounded to BF16 on the device */
            cu->free(dx); cu->free(dy);
            free(x); free(yc); free(yg);
        }
        cu->weight_free(&gw);
        free(w); free(W); free(wd); free(wb);
    }
    skv_workspace_free(&ws);
}

static void t_elementwise(void) {
    int n = 5, dim = 320;
    size_t len = (size_t)n * dim;
    /* embed from a BF16 table */
    {
        int vocab = 50;
        float *tab = rnd((size_t)vocab * dim);
        uint16_t *tb = malloc(sizeof(uint16_t) * vocab * dim);
        for (size_t i = 0; i < (size_t)vocab * dim; i++) tb[i] = f32_to_bf16(tab[i]);
        skv_weight gw;
        cu->weight_load(GGML_BF16, tb, vocab, dim, &gw);
        int32_t ids[5] = {3, 49, 0, 3, 17};
        float *xc = malloc(sizeof(float) * len), *dx = dev(NULL, sizeof(float) * len);
        cpu->embed(GGML_BF16, tb, dim, ids, n, xc);
        cu->embed(gw.type, gw.data, dim, ids, n, dx);
        float *xg = back(dx, len);
        cmp("embed", xg, xc, len, 0);
        cu->weight_free(&gw);
        cu->free(dx);
        free(tab); free(tb); free(xc); free(xg);
    }
    /* rmsnorm, add_bias, add, swiglu */
    {
        float *x = rnd(len), *w = rnd(dim), *yc = malloc(sizeof(float) * len);
        float *dx = dev(x, sizeof(float) * len), *dw = dev(w, sizeof(float) * dim), *dy = dev(NULL, sizeof(float) * len);
        cpu->rmsnorm(yc, x, w, n, dim, 1e-5f);
        cu->rmsnorm(dy, dx, dw, n, dim, 1e-5f);
        float *yg = back(dy, len);
        cmp("rmsnorm", yg, yc, len, 1e-6);
        free(yg);
        cpu->add_bias(x, w, n, dim);
        cu->add_bias(dx, dw, n, dim);
        yg = back(dx, len);
        cmp("add_bias", yg, x, len, 0);
        free(yg);
        float *u = rnd(len), *du = dev(u, sizeof(float) * len);
        cpu->add(x, u, len);
        cu->add(dx, du, len);
        yg = back(dx, len);
        cmp("add", yg, x, len, 0);
        free(yg);
        cpu->swiglu(x, u, len);
        cu->swiglu(dx, du, len);
        yg = back(dx, len);
        cmp("swiglu", yg, x, len, 1e-5);
        free(yg);
        cu->free(dx); cu->free(dw); cu->free(dy); cu->free(du);
        free(x); free(w); free(yc); free(u);
    }
    /* rope, both pairings, partial rotation (rope_dim < head_dim) */
    for (int mode = 0; mode < 2; mode++) {
        int nh = 3, hd = 64, pos0 = 1000;
        rope_params p = {.mode = mode ? ROPE_NEOX : ROPE_ADJACENT, .head_dim = hd, .rope_dim = 48, .theta = 500000};
        rope_ctx rc;
        rope_init(&rc, &p, NULL);
        size_t l = (size_t)n * nh * hd;
        float *x = rnd(l), *dx = dev(x, sizeof(float) * l);
        cpu->rope(&rc, x, n, nh, pos0);
        cu->rope(&rc, dx, n, nh, pos0);
        float *xg = back(dx, l);
        cmp(mode ? "rope rotate-half" : "rope adjacent", xg, x, l, 1e-6);
        cu->free(dx);
        rope_free(&rc);
        free(x); free(xg);
    }
    /* The device frequencies follow the values, not the host pointer: the
     * same rope_ctx rewritten in place for another theta (as a freed ctx's
     * address reused by the next one would be) must rotate by the new ones. */
    {
        int nh = 2, hd = 32;
        rope_params p1 = {.mode = ROPE_NEOX, .head_dim = hd, .rope_dim = hd, .theta = 10000};
        rope_params p2 = p1;
        p2.theta = 500000;
        rope_ctx r1, r2;
        rope_init(&r1, &p1, NULL);
        rope_init(&r2, &p2, NULL);
        size_t l = (size_t)n * nh * hd;
        float *x = rnd(l), *dx = dev(x, sizeof(float) * l);
        cu->rope(&r1, dx, n, nh, 900);
        cu->free(dx);
        memcpy(r1.inv_freq, r2.inv_freq, sizeof(float) * (size_t)(hd / 2));
        dx = dev(x, sizeof(float) * l);
        cpu->rope(&r2, x, n, nh, 900);
        cu->rope(&r1, dx, n, nh, 900);
        float *xg = back(dx, l);
        cmp("rope after its frequencies changed at the same address", xg, x, l, 1e-6);
        cu->free(dx);
        rope_free(&r1);
        rope_free(&r2);
        free(x); free(xg);
    }
    /* A buffer written right after alloc keeps what was written: alloc's
     * zero fill is ordered before the compute stream's work (a fill on the
     * legacy stream could land after the write). Many small rounds, so a
     * race has chances to show. */
    {
        int nkv = 2, d = 64, cap = 64, nt = 64, bad = 0;
        size_t sl = (size_t)nt * nkv * d;
        float *src = rnd(sl), *ds = dev(src, sizeof(float) * sl);
        for (int round = 0; round < 200 && !bad; round++) {
            float *dc = cu->alloc(sizeof(float) * (size_t)nkv * cap * d);
            SKV_ASSERT(dc);
            cu->kv_store(dc, (size_t)cap * d, nkv, d, 0, nt, ds);
            float *got = back(dc, (size_t)nkv * cap * d);
            for (int t = 0; t < nt && !bad; t++)
                for (int h = 0; h < nkv && !bad; h++)
                    bad = memcmp(got + ((size_t)h * cap + t) * d, src + ((size_t)t * nkv + h) * d, sizeof(float) * d) != 0;
            free(got);
            cu->free(dc);
        }
        test_cond("cuda alloc: rows written right after alloc are not zeroed afterwards (200 rounds)", !bad);
        cu->free(ds);
        free(src);
    }
    /* kv_store into a head-major cache */
    {
        int nkv = 2, d = 16, cap = 40, pos = 7, nt = 6;
        size_t cl = (size_t)nkv * cap * d, sl = (size_t)nt * nkv * d;
        float *cache = calloc(cl, sizeof(float)), *src = rnd(sl);
        float *dc = dev(cache, sizeof(float) * cl), *ds = dev(src, sizeof(float) * sl);
        cpu->kv_store(cache, (size_t)cap * d, nkv, d, pos, nt, src);
        cu->kv_store(dc, (size_t)cap * d, nkv, d, pos, nt, ds);
        float *cg = back(dc, cl);
        cmp("kv_store", cg, cache, cl, 0);
        cu->free(dc); cu->free(ds);
        free(cache); free(src); free(cg);
    }
}

static void t_attention(void) {
    int d = 128;
    /* attend_rows and attend_group over strided rows, and the partial results + merge */
    {
        int n = 777, g = 4, stride = 2 * d;
        float *q = rnd((size_t)g * d), *K = rnd((size_t)n * stride), *V = rnd((size_t)n * stride);
        float *dq = dev(q, sizeof(float) * g * d), *dK = dev(K, sizeof(float) * n * stride),
              *dV = dev(V, sizeof(float) * n * stride), *dout = dev(NULL, sizeof(float) * g * d);
        float oc[4 * 128];
        cpu->attend_rows(q, K + d, V + d, n, d, stride, 0.09f, oc);
        cu->attend_rows(dq, dK + d, dV + d, n, d, stride, 0.09f, dout);
        float *og = back(dout, d);
        cmp("attend_rows", og, oc, d, 1e-5);
        free(og);
        cpu->attend_group(q, g, K + d, V + d, n, d, stride, 0.09f, oc, NULL, NULL);
        cu->attend_group(dq, g, dK + d, dV + d, n, d, stride, 0.09f, dout, NULL, NULL);
        og = back(dout, (size_t)g * d);
        cmp("attend_group", og, oc, (size_t)g * d, 1e-5);
        free(og);
        float *dpo = dev(NULL, sizeof(float) * 2 * g * d), *dpm = dev(NULL, sizeof(float) * 2 * g),
              *dpl = dev(NULL, sizeof(float) * 2 * g);
        cu->attend_group(dq, g, dK + d, dV + d, 300, d, stride, 0.09f, dpo, dpm, dpl);
        cu->attend_group(dq, g, dK + d + 300 * stride, dV + d + 300 * stride, n - 300, d, stride, 0.09f, dpo + g * d,
                         dpm + g, dpl + g);
        cu->attend_merge(2, g, d, dpo, dpm, dpl, dout);
        og = back(dout, (size_t)g * d);
        cmp("attend_group in 2 parts + attend_merge", og, oc, (size_t)g * d, 1e-5);
        free(og);
        cu->free(dq); cu->free(dK); cu->free(dV); cu->free(dout); cu->free(dpo); cu->free(dpm); cu->free(dpl);
        free(q); free(K); free(V);
    }
    /* attend_decode (flash-decoding) over a head-major cache, long enough to split */
    {
        int nh = 32, nkv = 8, rows = SIM(5000, 1100), cap = SIM(5200, 1200);
        size_t kl = (size_t)nkv * cap * d;
        float *q = rnd((size_t)nh * d), *K = rnd(kl), *V = rnd(kl), *oc = malloc(sizeof(float) * nh * d);
        float *dq = dev(q, sizeof(float) * nh * d), *dK = dev(K, sizeof(float) * kl), *dV = dev(V, sizeof(float) * kl),
              *dout = dev(NULL, sizeof(float) * nh * d);
        cpu->attend_decode(q, nh, nkv, d, K, V, rows, d, (size_t)cap * d, oc);
        test_cond("cuda attend_decode returns 0", cu->attend_decode(dq, nh, nkv, d, dK, dV, rows, d, (size_t)cap * d,
                                                                    dout) == 0);
        float *og = back(dout, (size_t)nh * d);
        char name[80];
        snprintf(name, sizeof name, "attend_decode (%d rows, GQA 4:1)", rows);
        cmp(name, og, oc, (size_t)nh * d, 1e-5);
        cu->free(dq); cu->free(dK); cu->free(dV); cu->free(dout);
        free(q); free(K); free(V); free(oc); free(og);
    }
    /* the half-precision cache (--f16-kv): the stored bits equal the CPU's,
     * decode attention within f32 bounds of the CPU's over the same widened
     * values, a prefill on tensor cores within bf16 bounds */
    {
        int nh = 8, nkv = 2, dd = 64, cap = 512, T = 400;
        size_t hs = (size_t)cap * dd, cl = (size_t)nkv * hs, sl = (size_t)T * nkv * dd;
        float *src = rnd(sl);
        uint16_t *hc = calloc(cl, 2), *hv = calloc(cl, 2), *gk = malloc(cl * 2);
        uint16_t *dk = dev(NULL, cl * 2), *dv = dev(NULL, cl * 2);
        float *ds = dev(src, sizeof(float) * sl);
        cpu->kv_store_h(hc, hs, nkv, dd, 0, T, src);
        cu->kv_store_h(dk, hs, nkv, dd, 0, T, ds);
        cu->download(gk, dk, cl * 2);
        test_cond("cuda kv_store_h: the half-precision rows are the CPU's bit for bit", !memcmp(gk, hc, cl * 2));
        float *vsrc = rnd(sl), *dvs = dev(vsrc, sizeof(float) * sl);
        cpu->kv_store_h(hv, hs, nkv, dd, 0, T, vsrc);
        cu->kv_store_h(dv, hs, nkv, dd, 0, T, dvs);
        float *q = rnd((size_t)nh * dd), *oc = malloc(sizeof(float) * nh * dd);
        float *dq = dev(q, sizeof(float) * nh * dd), *dout = dev(NULL, sizeof(float) * nh * dd);
        cpu->attend_decode_h(q, nh, nkv, dd, hc, hv, T, dd, hs, oc);
        SKV_ASSERT(cu->attend_decode_h(dq, nh, nkv, dd, dk, dv, T, dd, hs, dout) == 0);
        float *og = back(dout, (size_t)nh * dd);
        cmp("attend_decode_h (400 rows, 4:1 heads)", og, oc, (size_t)nh * dd, 1e-5);
        free(og);
        for (int nq = 8; nq <= SIM(200, 40); nq += SIM(192, 32)) {
            int pos = T - nq;
            size_t ql = (size_t)nq * nh * dd;
            float *qq = rnd(ql), *occ = malloc(sizeof(float) * ql), *dqq = dev(qq, sizeof(float) * ql),
                  *dcc = dev(NULL, sizeof(float) * ql);
            cpu->attend_causal_h(qq, nq, pos, nh, nkv, dd, hc, hv, dd, hs, occ);
            cu->attend_causal_h(dqq, nq, pos, nh, nkv, dd, dk, dv, dd, hs, dcc);
            float *ogg = back(dcc, ql);
            char name[80];
            snprintf(name, sizeof name, "attend_causal_h (%d queries, %s)", nq, nq < 16 ? "f32" : "tensor cores");
            cmp(name, ogg, occ, ql, nq < 16 ? 1e-5 : 2e-2);
            cu->free(dqq); cu->free(dcc);
            free(qq); free(occ); free(ogg);
        }
        cu->free(dk); cu->free(dv); cu->free(ds); cu->free(dvs); cu->free(dq); cu->free(dout);
        free(src); free(vsrc); free(hc); free(hv); free(gk); free(q); free(oc);
    }
    /* attend_causal: a few queries in f32 (token-major rows, GQA 3:1), and
     * prefills on tensor cores (bf16 inputs, f32 sums): token-major and
     * head-major rows, head dims 64 and 128, a start past 0 and a query
     * count that is not a whole tile */
    {
        struct { int nh, nkv, d, pos, nq, head_major; double tol; } cs[] = {
#ifdef SKV_CUSIM
            {6, 2, 64, 100, 8, 0, 1e-5},  {6, 2, 64, 30, 90, 0, 2e-2}, {8, 2, 128, 0, 70, 1, 2e-2},
            {4, 4, 32, 37, 33, 0, 2e-2},  {7, 1, 128, 5, 20, 1, 2e-2},
#else
            {6, 2, 64, 100, 8, 0, 1e-5},  {6, 2, 64, 100, 90, 0, 2e-2}, {8, 2, 128, 0, 300, 1, 2e-2},
            {4, 4, 32, 37, 129, 0, 2e-2}, {32, 8, 128, 0, 1024, 1, 2e-2},
#endif
        };
        for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
            int nh = cs[c].nh, nkv = cs[c].nkv, dd = cs[c].d, pos = cs[c].pos, nq = cs[c].nq, T = pos + nq;
            int stride = cs[c].head_major ? dd : nkv * dd;
            size_t hs = cs[c].head_major ? (size_t)T * dd : (size_t)dd, ql = (size_t)nq * nh * dd, kl = (size_t)T * nkv * dd;
            float *q = rnd(ql), *K = rnd(kl), *V = rnd(kl), *oc = malloc(sizeof(float) * ql);
            float *dq = dev(q, sizeof(float) * ql), *dK = dev(K, sizeof(float) * kl), *dV = dev(V, sizeof(float) * kl),
                  *dout = dev(NULL, sizeof(float) * ql);
            cpu->attend_causal(q, nq, pos, nh, nkv, dd, K, V, stride, hs, oc);
            cu->attend_causal(dq, nq, pos, nh, nkv, dd, dK, dV, stride, hs, dout);
            float *og = back(dout, ql);
            char name[128];
            snprintf(name, sizeof name, "attend_causal (%d queries from %d, %d:%d heads, dim %d, %s rows%s)", nq, pos,
                     nh, nkv, dd, cs[c].head_major ? "head-major" : "token-major", nq >= 16 ? ", tensor cores" : "");
            cmp(name, og, oc, ql, cs[c].tol);
            cu->free(dq); cu->free(dK); cu->free(dV); cu->free(dout);
            free(q); free(K); free(V); free(oc); free(og);
        }
    }
}

static void t_sparse(void) {
    /* svd: compare what is sign-free: the singular values, the error, U·SVt */
    {
        int s = 2048, n = 256, r = 48;
        float *K = rnd((size_t)s * n);
        for (int t = 0; t < s; t++) /* a planted low-rank part, so the spectrum falls */
            for (int e = 0; e < n; e++) K[(size_t)t * n + e] += 3.0f * sinf(0.01f * t * (1 + e % 7)) * cosf(0.1f * e);
        float *U = malloc(sizeof(float) * s * r), *SVt = malloc(sizeof(float) * r * n), svc[256], errc;
        float svg[256], errg;
        cpu->svd(K, s, n, r, U, SVt, NULL, svc, &errc);
        float *dK = dev(K, sizeof(float) * s * n), *dU = dev(NULL, sizeof(float) * s * r),
              *dS = dev(NULL, sizeof(float) * r * n);
        test_cond("cuda svd returns 0", cu->svd(dK, s, n, r, dU, dS, NULL, svg, &errg) == 0);
        float *Ug = back(dU, (size_t)s * r), *Sg = back(dS, (size_t)r * n);
        cmp("svd singular values (top r)", svg, svc, r, 1e-5);
        char msg[160];
        snprintf(msg, sizeof msg, "cuda svd: reported error %.6f, CPU %.6f", errg, errc);
        test_cond(msg, fabs(errg - errc) <= 1e-4 * (errc > 1 ? errc : 1));
        float *Rc = malloc(sizeof(float) * s * n), *Rg = malloc(sizeof(float) * s * n);
        for (int t = 0; t < s; t++)
            for (int e = 0; e < n; e++) {
                double a = 0, b = 0;
                for (int j = 0; j < r; j++) {
                    a += (double)U[(size_t)t * r + j] * SVt[(size_t)j * n + e];
                    b += (double)Ug[(size_t)t * r + j] * Sg[(size_t)j * n + e];
                }
                Rc[(size_t)t * n + e] = (float)a;
                Rg[(size_t)t * n + e] = (float)b;
            }
        cmp("svd rank-r reconstruction U·SVt", Rg, Rc, (size_t)s * n, 1e-4);
        cu->free(dK); cu->free(dU); cu->free(dS);
        free(K); free(U); free(SVt); free(Ug); free(Sg); free(Rc); free(Rg);
    }
    /* landmarks, cos_min, score, topk over chunks of one head's rows */
    {
        int s = 4096, d = 128, c = 8, nch = s / c, stride = 2 * d, group = 4;
        float *K = rnd((size_t)s * stride), *lm = malloc(sizeof(float) * nch * d), *cm = malloc(sizeof(float) * nch);
        float *dK = dev(K, sizeof(float) * s * stride), *dlm = dev(NULL, sizeof(float) * nch * d),
              *dcm = dev(NULL, sizeof(float) * nch);
        cpu->landmarks(K + d, stride, d, c, nch, lm);
        cu->landmarks(dK + d, stride, d, c, nch, dlm);
        float *g = back(dlm, (size_t)nch * d);
        cmp("landmarks", g, lm, (size_t)nch * d, 1e-6);
        free(g);
        cpu->cos_min(K + d, stride, d, c, nch, lm, cm);
        cu->cos_min(dK + d, stride, d, c, nch, dlm, dcm);
        g = back(dcm, nch);
        cmp("cos_min", g, cm, nch, 1e-5);
        free(g);
        float *q = rnd((size_t)group * d), *sc = malloc(sizeof(float) * nch), *tmp = malloc(sizeof(float) * 2 * group * nch);
        float *dq = dev(q, sizeof(float) * group * d), *dsc = dev(NULL, sizeof(float) * nch),
              *dtmp = dev(NULL, sizeof(float) * 2 * group * nch);
        cpu->score(q, 1, (size_t)group * d, group, d, lm, nch, 0.0884f, tmp, sc);
        cu->score(dq, 1, (size_t)group * d, group, d, dlm, nch, 0.0884f, dtmp, dsc);
        g = back(dsc, nch);
        cmp("score (softmax per head, GQA max)", g, sc, nch, 1e-5);
        free(g);
        { /* three positions summed (the q rows a stride apart), a group of 7 */
            int nq = 3, G7 = 7;
            size_t qs = (size_t)G7 * d + 16;
            float *q3 = rnd(qs * nq), *sc3 = malloc(sizeof(float) * nch), *t3 = malloc(sizeof(float) * 2 * G7 * nch);
            float *dq3 = dev(q3, sizeof(float) * qs * nq), *ds3 = dev(NULL, sizeof(float) * nch);
            cpu->score(q3, nq, qs, G7, d, lm, nch, 0.0884f, t3, sc3);
            cu->score(dq3, nq, qs, G7, d, dlm, nch, 0.0884f, NULL, ds3);
            float *g3 = back(ds3, nch);
            cmp("score (3 positions, a group of 7)", g3, sc3, nch, 1e-5);
            cu->free(dq3); cu->free(ds3);
            free(q3); free(sc3); free(t3); free(g3);
        }
        g = back(dsc, nch);
        /* topk on the CPU's scores (so the order is the same input), with ties and a NaN */
        sc[5] = sc[9] = sc[100];
        sc[200] = NAN;
        cu->upload(dsc, sc, sizeof(float) * nch);
        int k = 64, ic[64], ig[64], *dix = dev(NULL, sizeof(int) * k);
        int nc = cpu->topk(sc, nch, k, ic), ng = cu->topk(dsc, nch, k, dix);
        cu->download(ig, dix, sizeof(int) * k);
        test_cond("cuda topk: the same indices in the same order as the CPU (ties to the lower index, NaN last)",
                  nc == ng && !memcmp(ic, ig, sizeof(int) * k));
        cu->free(dK); cu->free(dlm); cu->free(dcm); cu->free(dq); cu->free(dsc); cu->free(dtmp); cu->free(dix);
        free(K); free(lm); free(cm); free(q); free(sc); free(tmp); free(g);
    }
    /* gather from pinned host memory into strided device rows, on the fetch stream */
    {
        int rows = 8, cols = 128, nb = 300, dst_stride = 128, n = 40;
        size_t sl = (size_t)nb * rows * cols, dl = (size_t)n * rows * dst_stride;
        float *src = cu->host_alloc(sizeof(float) * sl), *hs = rnd(sl);
        memcpy(src, hs, sizeof(float) * sl);
        int idx[40];
        size_t off[40];
        for (int i = 0; i < n; i++) {
            idx[i] = (i * 37) % nb;
            off[i] = (size_t)(n - 1 - i) * rows * dst_stride;
        }
        float *dc = calloc(dl, sizeof(float)), *dd = dev(NULL, sizeof(float) * dl);
        cpu->gather(hs, rows, cols, idx, n, dc, off, dst_stride);
        cu->gather(src, rows, cols, idx, n, dd, off, dst_stride);
        float *g = back(dd, dl); /* download waits for the fetch stream */
        cmp("gather (zero-copy from pinned memory)", g, dc, dl, 0);
        cu->host_free(src);
        cu->free(dd);
        free(hs); free(dc); free(g);
    }
    /* rebuild fused with RoPE, with tables and without; project */
    {
        int s = 600, r = 160, d = 128, t0 = 333, n = 64;
        rope_params p = {.mode = ROPE_ADJACENT, .head_dim = d, .rope_dim = d, .theta = 500000};
        rope_ctx rc;
        rope_init(&rc, &p, NULL);
        float *U = rnd((size_t)s * r), *svt = rnd((size_t)r * d), *oc = malloc(sizeof(float) * n * d);
        float *dU = dev(U, sizeof(float) * s * r), *dsvt = dev(svt, sizeof(float) * r * d),
              *dout = dev(NULL, sizeof(float) * n * d);
        cpu->rebuild(U, r, svt, d, t0, n, &rc, NULL, NULL, oc);
        cu->rebuild(dU, r, dsvt, d, t0, n, &rc, NULL, NULL, dout);
        float *g = back(dout, (size_t)n * d);
        cmp("rebuild + RoPE", g, oc, (size_t)n * d, 1e-5);
        free(g);
        float *cs = malloc(sizeof(float) * s * d / 2), *sn = malloc(sizeof(float) * s * d / 2);
        shadowkv_rope_table(&rc, s, cs, sn);
        float *dcs = dev(cs, sizeof(float) * s * d / 2), *dsn = dev(sn, sizeof(float) * s * d / 2);
        cu->rebuild(dU, r, dsvt, d, t0, n, &rc, dcs, dsn, dout);
        g = back(dout, (size_t)n * d);
        cmp("rebuild + RoPE from tables", g, oc, (size_t)n * d, 1e-5);
        free(g);
        int nn = 1024, rr = 96;
        float *Vt = rnd((size_t)rr * nn), *x = rnd(nn), *y = malloc(sizeof(float) * nn), *coef = malloc(sizeof(float) * rr);
        float *dVt = dev(Vt, sizeof(float) * rr * nn), *dx = dev(x, sizeof(float) * nn), *dy = dev(NULL, sizeof(float) * nn),
              *dcoef = dev(NULL, sizeof(float) * rr);
        cpu->project(Vt, rr, nn, x, y, coef);
        cu->project(dVt, rr, nn, dx, dy, dcoef);
        g = back(dy, nn);
        cmp("project", g, y, nn, 1e-5);
        free(g);
        rope_free(&rc);
        cu->free(dU); cu->free(dsvt); cu->free(dout); cu->free(dcs); cu->free(dsn); cu->free(dVt); cu->free(dx);
        cu->free(dy); cu->free(dcoef);
        free(U); free(svt); free(oc); free(cs); free(sn); free(Vt); free(x); free(y); free(coef);
    }
    /* page bounds and scores; KIVI groups */
    {
        int d = 64, pg = 16, T = 200, stride = 2 * d, np = (T + pg - 1) / pg;
        float *K = rnd((size_t)T * stride), *mn = calloc((size_t)np * d, sizeof(float)), *mx = calloc((size_t)np * d, sizeof(float));
        float *dK = dev(K, sizeof(float) * T * stride), *dmn = dev(NULL, sizeof(float) * np * d),
              *dmx = dev(NULL, sizeof(float) * np * d);
        cpu->page_bounds(K, stride, d, pg, 0, 150, mn, mx, d);
        cpu->page_bounds(K, stride, d, pg, 150, T - 150, mn, mx, d);
        cu->page_bounds(dK, stride, d, pg, 0, 150, dmn, dmx, d);
        cu->page_bounds(dK, stride, d, pg, 150, T - 150, dmn, dmx, d);
        float *g = back(dmn, (size_t)np * d), *h = back(dmx, (size_t)np * d);
        cmp("page_bounds (min)", g, mn, (size_t)np * d, 0);
        cmp("page_bounds (max)", h, mx, (size_t)np * d, 0);
        free(g); free(h);
        float *q = rnd(d), U[13], *dq = dev(q, sizeof(float) * d), *dU = dev(NULL, sizeof(float) * np);
        cpu->page_score(q, d, mn, mx, d, np, U);
        cu->page_score(dq, d, dmn, dmx, d, np, dU);
        g = back(dU, np);
        cmp("page_score", g, U, np, 1e-6);
        free(g);
        for (int bits = 1; bits <= 4; bits++) {
            int n = 128, st = 3;
            float *x = rnd((size_t)n * st), *y = malloc(sizeof(float) * n * st), scl, zr;
            memcpy(y, x, sizeof(float) * n * st);
            float *dx = dev(x, sizeof(float) * n * st), *dsz = dev(NULL, sizeof(float) * 2);
            cpu->kivi(x, n, st, bits, bits == 1, y, NULL, &scl, &zr);
            cu->kivi(dx, n, st, bits, bits == 1, dx, NULL, dsz, dsz + 1);
            g = back(dx, (size_t)n * st);
            char op[48];
            snprintf(op, sizeof op, "kivi %d-bit group", bits);
            cmp(op, g, y, (size_t)n * st, 0);
            free(g);
            cu->free(dx); cu->free(dsz);
            free(x); free(y);
        }
        cu->free(dK); cu->free(dmn); cu->free(dmx); cu->free(dq); cu->free(dU);
        free(K); free(mn); free(mx); free(q);
    }
}

/* The timeline: with spans on, each op gives one span on its stream, in
 * order, with the tag set, on the host clock. */
/* The fused books, fetch and rebuild of a layer (every KV head at once)
 * against their CPU twins over three steps of a chunk cache: the slots,
 * misses and cache state, the fetched value rows and the rebuilt keys. */
static void t_fused(void) {
    int h = 3, k = 6, nc = 40, c = 8, d = 64, r = 16, s = nc * c, row_slot = 16, rows = row_slot + k * c;
    size_t n_cache = 2 * (size_t)h * k + (size_t)h * nc + h;
    int *cache_c = malloc(sizeof(int) * n_cache), *cand = malloc(sizeof(int) * h * nc);
    for (size_t i = 0; i < n_cache; i++) cache_c[i] = i < (size_t)h * k + (size_t)h * nc ? -1 : 0;
    for (int kh = 0; kh < h; kh++)
        for (int j = 0; j < nc; j++) cand[kh * nc + j] = j + (j >= 20 ? 2 : 0); /* two outlier chunks skipped */
    int *cache_d = dev(cache_c, sizeof(int) * n_cache), *cand_d = dev(cand, sizeof(int) * h * nc);
    float *store = cu->host_alloc(sizeof(float) * (size_t)h * nc * c * d), *st_h = rnd((size_t)h * nc * c * d);
    memcpy(store, st_h, sizeof(float) * (size_t)h * nc * c * d);
    float *U = rnd((size_t)(s + 3 * c) * r), *SVt = rnd((size_t)h * r * d);
    float *dU = dev(U, sizeof(float) * (size_t)(s + 3 * c) * r), *dSVt = dev(SVt, sizeof(float) * (size_t)h * r * d);
    rope_params p = {.mode = ROPE_ADJACENT, .head_dim = d, .rope_dim = d, .theta = 500000};
    rope_ctx rc;
    rope_init(&rc, &p, NULL);
    float *Kc[3], *Vc[3], *Kd[3], *Vd[3];
    for (int kh = 0; kh < h; kh++) {
        Kc[kh] = calloc((size_t)rows * d, sizeof(float));
        Vc[kh] = calloc((size_t)rows * d, sizeof(float));
        Kd[kh] = dev(NULL, sizeof(float) * rows * d);
        Vd[kh] = dev(NULL, sizeof(float) * rows * d);
    }
    int *sel = malloc(sizeof(int) * h * k), *out_c = malloc(sizeof(int) * (3 * h * k + h));
    int *out_d = dev(NULL, sizeof(int) * (3 * h * k + h)), *sel_d = dev(NULL, sizeof(int) * h * k);
    int *got = malloc(sizeof(int) * (3 * h * k + h)), *cache_g = malloc(sizeof(int) * n_cache), ok = 1;
    double worst_k = 0, worst_v = 0;
    for (int step = 0; step < 3; step++) {
        for (int kh = 0; kh < h; kh++)
            for (int i = 0; i < k; i++) sel[kh * k + i] = (7 * i + 3 * step + kh) % nc; /* distinct: 7 and 40 coprime */
        cu->upload(sel_d, sel, sizeof(int) * h * k);
        int *so = out_c, *mi = so + h * k, *nm = mi + h * k;
        int *sod = out_d, *mid = sod + h * k, *nmd = mid + h * k;
        int *sid = cache_c, *wh = sid + h * k;
        unsigned *stp = (unsigned *)(wh + h * nc), *ep = stp + h * k;
        int *sidd = cache_d, *whd = sidd + h * k;
        unsigned *stpd = (unsigned *)(whd + h * nc), *epd = stpd + h * k;
        cpu->sk_books(h, k, nc, sel, sid, wh, stp, ep, so, mi, nm);
        cu->sk_books(h, k, nc, sel_d, sidd, whd, stpd, epd, sod, mid, nmd);
        cu->download(got, out_d, sizeof(int) * (3 * h * k + h));
        cu->download(cache_g, cache_d, sizeof(int) * n_cache);
        /* misses past a head's count are not defined: compare the defined part */
        for (int kh = 0; kh < h; kh++) {
            ok &= got[2 * h * k + kh] == nm[kh];
            for (int i = 0; i < k; i++) ok &= got[kh * k + i] == so[kh * k + i];
            for (int m = 0; m < nm[kh] && m < k; m++) ok &= got[h * k + kh * k + m] == mi[kh * k + m];
        }
        ok &= !memcmp(cache_g, cache_c, sizeof(int) * n_cache);
        cpu->sk_gather_misses(st_h, c, d, h, k, nc, 0, sel, so, mi, nm, Vc, row_slot);
        cu->sk_gather_misses(store, c, d, h, k, nc, 0, sel_d, sod, mid, nmd, Vd, row_slot);
        cpu->sk_rebuild_misses(U, r, SVt, d, c, h, k, nc, cand, sel, so, mi, nm, &rc, NULL, NULL, Kc, row_slot);
        cu->sk_rebuild_misses(dU, r, dSVt, d, c, h, k, nc, cand_d, sel_d, sod, mid, nmd, &rc, NULL, NULL, Kd, row_slot);
        for (int kh = 0; kh < h; kh++) {
            float *kg = back(Kd[kh], (size_t)rows * d), *vg = back(Vd[kh], (size_t)rows * d);
            double ek = test_rel_l2(kg + (size_t)row_slot * d, Kc[kh] + (size_t)row_slot * d, (size_t)k * c * d);
            double ev = test_rel_l2(vg + (size_t)row_slot * d, Vc[kh] + (size_t)row_slot * d, (size_t)k * c * d);
            worst_k = ek > worst_k ? ek : worst_k;
            worst_v = ev > worst_v ? ev : worst_v;
            free(kg);
            free(vg);
        }
    }
    test_cond("cuda sk_books: slots, misses and the caches' state equal the CPU twin's over 3 steps", ok);
    char msg[200];
    snprintf(msg, sizeof msg, "cuda sk_gather_misses and sk_rebuild_misses: value rows rel L2 %.1e (bound 0), keys "
             "%.1e (bound 1e-5) from the CPU twins", worst_v, worst_k);
    test_cond(msg, worst_v == 0 && worst_k <= 1e-5);
    for (int kh = 0; kh < h; kh++) {
        free(Kc[kh]); free(Vc[kh]); cu->free(Kd[kh]); cu->free(Vd[kh]);
    }
    rope_free(&rc);
    cu->host_free(store);
    cu->free(cache_d); cu->free(cand_d); cu->free(dU); cu->free(dSVt); cu->free(out_d); cu->free(sel_d);
    free(cache_c); free(cand); free(st_h); free(U); free(SVt); free(sel); free(out_c); free(got); free(cache_g);
}

static void t_timeline(void) {
    if (!cu->span_enable) return;
    int n = 64, d = 128, s = 1024, r = 32;
    float *q = dev(NULL, sizeof(float) * 4 * d), *K = dev(NULL, sizeof(float) * s * d), *V = dev(NULL, sizeof(float) * s * d);
    float *U = dev(NULL, sizeof(float) * s * r), *svt = dev(NULL, sizeof(float) * r * d), *out = dev(NULL, sizeof(float) * 4 * d);
    float *src = cu->host_alloc(sizeof(float) * 8 * d * n);
    int idx[64];
    size_t off[64];
    for (int i = 0; i < n; i++) { idx[i] = i; off[i] = (size_t)i * 8 * d; }
    rope_params p = {.mode = ROPE_ADJACENT, .head_dim = d, .rope_dim = d, .theta = 10000};
    rope_ctx rc;
    rope_init(&rc, &p, NULL);
    double t0 = skv_now();
    cu->span_enable(1);
    cu->span_tag(3, 7);
    cu->gather(src, 8, d, idx, n, V, off, d);
    cu->rebuild(U, r, svt, d, 0, s, &rc, NULL, NULL, K);
    cu->attend_group(q, 4, K, V, s, d, d, 0.088f, out, NULL, NULL);
    cu->sync();
    skv_span sp[16];
    int ns = cu->span_drain(sp, 16);
    double t1 = skv_now();
    cu->span_enable(0);
    int ok = ns == 3 && sp[0].stream == 1 && !strcmp(sp[0].op, "fetch_v") && sp[1].stream == 0 &&
             !strcmp(sp[1].op, "rebuild_k") && !strcmp(sp[2].op, "attend") && sp[2].t0 >= sp[0].t1 - 1e-6;
    for (int i = 0; i < ns; i++) ok &= sp[i].layer == 3 && sp[i].step == 7 && sp[i].t0 >= t0 && sp[i].t1 <= t1 && sp[i].t0 <= sp[i].t1;
    char msg[256];
    snprintf(msg, sizeof msg, "cuda timeline: fetch on the fetch stream, rebuild and attention on compute, attention "
             "after the fetch (%d spans; fetch %.1f us, rebuild %.1f us, overlap %s)", ns,
             ns > 0 ? (sp[0].t1 - sp[0].t0) * 1e6 : 0, ns > 1 ? (sp[1].t1 - sp[1].t0) * 1e6 : 0,
             ns > 1 && sp[1].t0 < sp[0].t1 && sp[0].t0 < sp[1].t1 ? "yes" : "no");
    test_cond(msg, ok);
    rope_free(&rc);
    cu->host_free(src);
    cu->free(q); cu->free(K); cu->free(V); cu->free(U); cu->free(svt); cu->free(out);
}

int main(void) {
    cu = skv_backend_find("cuda");
    skv_clear_error();
    char why[256] = "";
    if (!cu) {
        test_skip("cuda ops: this build has no CUDA backend (nvcc was not found)");
        return test_report("test_cuda_ops");
    }
    if (!cu->available(why, sizeof why)) {
        char msg[320];
        snprintf(msg, sizeof msg, "cuda ops: %s (tests/gpu/run.sh runs them on a device)", why);
        test_skip(msg);
        return test_report("test_cuda_ops");
    }
    t_matmul();
    t_elementwise();
    t_attention();
    t_sparse();
    t_fused();
    t_timeline();
    return test_report("test_cuda_ops");
}
