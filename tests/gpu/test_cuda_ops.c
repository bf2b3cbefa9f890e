/* test_cuda_ops.c: every op of the CUDA backend against its CPU twin (the
 * op of the same name in the CPU backend), on fresh random inputs: the
 * inputs are uploaded, the CUDA op runs on device memory, its output comes
 * back and is compared with the CPU op's (relative L2 within fp32 bounds,
 * or BF16 bounds for the BF16 GEMM; ShadowKV's bf16 rows bit for bit, or
 * as cmp_bf16 says). Also the timeline: a span per op on the right stream,
 * in order. Without a device (or in a build without CUDA) it skips with one
 * line. tests/gpu/run.sh runs it on a device. */
#include "backend.h"
#include "kmath.h"
#include "quant.h"
#include "shadowkv_ops.h"
#include "skv.h"
#include "testhelp.h"
#include "vec.h"

#include <stdint.h>
#ifdef SKV_CUSIM
#include "cusim_api.h"
#endif
#ifdef SKV_CUSIM
#include "cusim_api.h"
#endif

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
static float frand(void) { return test_frand(&rs); }
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

/* ---- ShadowKV's bf16 attention rows ---- */

/* x (n) rounded to bf16 (km_f32_to_bf16); n bf16 values downloaded. */
static uint16_t *bf16_of(const float *x, size_t n) {
    uint16_t *y = malloc(sizeof(uint16_t) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) y[i] = km_f32_to_bf16(x[i]);
    return y;
}
static uint16_t *back16(const void *d, size_t n) {
    uint16_t *h = malloc(sizeof(uint16_t) * (n ? n : 1));
    cu->download(h, d, sizeof(uint16_t) * n);
    return h;
}

/* bf16 rows of a kernel (g) against its CPU twin's (c), both rounded from
 * f32 results. Where each side's f32 before rounding is known (g32, c32;
 * NULL when not): each side is its own f32 rounded (km_f32_to_bf16) bit for
 * bit, and g equals c wherever g32 and c32 are the same bits. Elsewhere the
 * two f32 results differ in their last bits (sums in another order), and
 * their roundings may land a bf16 ulp apart where a halfway point lies
 * between them: apart by at most one ulp, 2^-7 of the value (bf16 keeps 8
 * significant bits: an ulp is 2^-8 to 2^-7 of a value, rounding moves it
 * by half that), or of the rows' rms for values near zero (a sum that
 * cancels, where the f32 results' absolute difference counts); and that on
 * at most 1% of the values (f32 results within about 1e-6 relative of each
 * other straddle a halfway point for about 1e-6/2^-8 of them; a rounding
 * that truncates moves about half). */
static void cmp_bf16(const char *op, const uint16_t *g, const uint16_t *c, const float *g32, const float *c32, size_t n) {
    size_t same32 = 0, own = 0, apart = 0, far = 0;
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)km_bf16_to_f32(c[i]) * km_bf16_to_f32(c[i]);
    double rms = n ? sqrt(ss / (double)n) : 0;
    for (size_t i = 0; i < n; i++) {
        int eq32 = g32 && c32 && !memcmp(&g32[i], &c32[i], sizeof(float));
        same32 += eq32;
        own += (g32 && g[i] != km_f32_to_bf16(g32[i])) + (c32 && c[i] != km_f32_to_bf16(c32[i]));
        if (g[i] != c[i]) {
            double wg = km_bf16_to_f32(g[i]), wc = km_bf16_to_f32(c[i]);
            apart++;
            far += eq32 || fabs(wg - wc) > 0x1p-7 * (fabs(wc) > rms ? fabs(wc) : rms);
        }
    }
    char msg[400];
    snprintf(msg, sizeof msg, "cuda %s: bf16 rows from the CPU twin: %zu of %zu values a rounding apart (bound 1%%), "
             "%zu further or apart on the same f32 (bound 0; %zu values of the same f32 bits%s), %zu not their own "
             "f32 rounded (bound 0)", op, apart - far, n, far, same32, g32 && c32 ? "" : ": f32 not known", own);
    test_cond(msg, far == 0 && own == 0 && (apart - far) * 100 <= n);
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

/* The device's embedding of ids from a type table of vocab rows against the
 * CPU's, exact; dev_type >= 0: the type the device must keep the table in. */
static void check_embed(const char *name, enum ggml_type type, const void *tab, int vocab, int dim, const int32_t *ids, int n,
                        int dev_type) {
    size_t len = (size_t)n * dim;
    skv_weight gw;
    cu->weight_load(type, tab, vocab, dim, &gw);
    float *xc = malloc(sizeof(float) * len), *dx = dev(NULL, sizeof(float) * len);
    cpu->embed(type, tab, dim, ids, n, xc);
    cu->embed(gw.type, gw.data, dim, ids, n, dx);
    float *xg = back(dx, len);
    if (dev_type >= 0)
        test_cond("cuda embed: the table kept in the type it must have on the device", (int)gw.type == dev_type);
    cmp(name, xg, xc, len, 0);
    cu->weight_free(&gw);
    cu->free(dx);
    free(xc); free(xg);
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
        int32_t ids[5] = {3, 49, 0, 3, 17};
        check_embed("embed", GGML_BF16, tb, vocab, dim, ids, n, -1);
        free(tab); free(tb);
    }
    /* a one-row table stays f32 on the device (weight_load): k_embed_f32 */
    {
        float *tab = rnd((size_t)dim);
        int32_t ids[3] = {0, 0, 0};
        check_embed("embed (f32 table)", GGML_F32, tab, 1, dim, ids, 3, GGML_F32);
        free(tab);
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
        float *dpo = dev(NULL, sizeof(float) * 2 * g * d), *dpm = dev(NULL, sizeof(float) * 2 * g),
              *dpl = dev(NULL, sizeof(float) * 2 * g);
        /* f32 rows, then the same rows in bf16 (ShadowKV's), widened as read on both sides */
        uint16_t *Kb = bf16_of(K, (size_t)n * stride), *Vb = bf16_of(V, (size_t)n * stride);
        uint16_t *dKb = dev(Kb, sizeof(uint16_t) * n * stride), *dVb = dev(Vb, sizeof(uint16_t) * n * stride);
        for (int elt = SKV_ELT_F32; elt <= SKV_ELT_BF16; elt++) {
            int bf = elt == SKV_ELT_BF16;
            size_t es = bf ? sizeof(uint16_t) : sizeof(float);
            const char *hK = bf ? (const char *)Kb : (const char *)K, *hV = bf ? (const char *)Vb : (const char *)V;
            const char *gK = bf ? (const char *)dKb : (const char *)dK, *gV = bf ? (const char *)dVb : (const char *)dV;
            char name[96];
            cpu->attend_group(q, g, hK + es * d, hV + es * d, elt, n, d, stride, 0.09f, oc, NULL, NULL);
            cu->attend_group(dq, g, gK + es * d, gV + es * d, elt, n, d, stride, 0.09f, dout, NULL, NULL);
            og = back(dout, (size_t)g * d);
            snprintf(name, sizeof name, "attend_group (%s rows)", bf ? "bf16" : "f32");
            cmp(name, og, oc, (size_t)g * d, 1e-5);
            free(og);
            size_t o2 = es * (d + (size_t)300 * stride);
            cu->attend_group(dq, g, gK + es * d, gV + es * d, elt, 300, d, stride, 0.09f, dpo, dpm, dpl);
            cu->attend_group(dq, g, gK + o2, gV + o2, elt, n - 300, d, stride, 0.09f, dpo + g * d, dpm + g, dpl + g);
            cu->attend_merge(2, g, d, dpo, dpm, dpl, dout);
            og = back(dout, (size_t)g * d);
            snprintf(name, sizeof name, "attend_group (%s rows) in 2 parts + attend_merge", bf ? "bf16" : "f32");
            cmp(name, og, oc, (size_t)g * d, 1e-5);
            free(og);
        }
        cu->free(dq); cu->free(dK); cu->free(dV); cu->free(dout); cu->free(dpo); cu->free(dpm); cu->free(dpl);
        cu->free(dKb); cu->free(dVb);
        free(q); free(K); free(V); free(Kb); free(Vb);
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
                     nh, nkv, dd, cs[c].head_major ? "head-major" : "token-major",
                     nq >= 16 && dd % 32 == 0 && dd != 96 ? ", tensor cores" : "");
            cmp(name, og, oc, ql, cs[c].tol);
            cu->free(dq); cu->free(dK); cu->free(dV); cu->free(dout);
            free(q); free(K); free(V); free(oc); free(og);
        }
    }
}

/* The prefill's flash kernel (ops_attention.cu's k_flash_gqa: (query, head)
 * rows of a GQA group packed into tiles; head dims 32, 64 and 128) against
 * the CPU twin, from an f32 cache (Q, K, V, P rounded to bf16: bound 2e-2)
 * and a half cache (K, V exact, Q and P rounded to f16: bound 2e-3): groups
 * of 1, 4 and 7 (7 does not divide the 64-row tile), query counts that are
 * not whole tiles, chunked prefills (pos > 0: the cache already holds
 * earlier rows), and a head dim the kernel does not take (the fallback). */
static void t_flash_prefill(void) {
    struct { int nh, nkv, d, pos, nq, half; } cs[] = {
        {2, 2, 64, 0, 17, 0},  {8, 2, 128, 37, 17, 1}, {7, 1, 64, 70, SIM(1000, 100), 1},
        {4, 1, 128, 0, SIM(300, 100), 0}, {7, 1, 128, 9, 17, 0}, {4, 2, 32, 3, 40, 1}, {2, 1, 80, 5, 20, 1},
        {2, 1, 96, 5, 20, 1}, {3, 1, 96, 70, 30, 0},
        /* an f32 cache over 4 and 3 key tiles: each copied while the one before is computed */
        {4, 1, 128, 200, 40, 0}, {6, 2, 64, 130, 24, 0},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        int nh = cs[c].nh, nkv = cs[c].nkv, dd = cs[c].d, pos = cs[c].pos, nq = cs[c].nq, T = pos + nq;
        int cap = T + 3; /* head-major rows, a few spare */
        size_t hs = (size_t)cap * dd, cl = (size_t)nkv * hs, ql = (size_t)nq * nh * dd;
        int flash = dd == 32 || dd == 64 || dd == 96 || dd == 128;
        float *q = rnd(ql), *oc = malloc(sizeof(float) * ql);
        float *dq = dev(q, sizeof(float) * ql), *dout = dev(NULL, sizeof(float) * ql);
        float *kr = rnd((size_t)T * nkv * dd), *vr = rnd((size_t)T * nkv * dd);
        void *dk, *dv;
#ifdef SKV_CUSIM
        uint64_t nf = cusim_launches_of("k_flash_gqa"), na = cusim_launches_of("k_attend_causal");
#endif
        if (cs[c].half) {
            uint16_t *hk = calloc(cl, 2), *hv = calloc(cl, 2);
            cpu->kv_store_h(hk, hs, nkv, dd, 0, T, kr);
            cpu->kv_store_h(hv, hs, nkv, dd, 0, T, vr);
            dk = dev(hk, cl * 2);
            dv = dev(hv, cl * 2);
            cpu->attend_causal_h(q, nq, pos, nh, nkv, dd, hk, hv, dd, hs, oc);
            cu->attend_causal_h(dq, nq, pos, nh, nkv, dd, dk, dv, dd, hs, dout);
            free(hk); free(hv);
        } else {
            float *fk = calloc(cl, 4), *fv = calloc(cl, 4);
            cpu->kv_store(fk, hs, nkv, dd, 0, T, kr);
            cpu->kv_store(fv, hs, nkv, dd, 0, T, vr);
            dk = dev(fk, cl * 4);
            dv = dev(fv, cl * 4);
            cpu->attend_causal(q, nq, pos, nh, nkv, dd, fk, fv, dd, hs, oc);
            cu->attend_causal(dq, nq, pos, nh, nkv, dd, dk, dv, dd, hs, dout);
            free(fk); free(fv);
        }
        float *og = back(dout, ql);
        char name[200];
        snprintf(name, sizeof name, "attend_causal%s flash prefill (%d queries from %d, %d:%d heads, dim %d, %s)",
                 cs[c].half ? "_h" : "", nq, pos, nh, nkv, dd, flash ? "k_flash_gqa" : "the fallback kernel");
        cmp(name, og, oc, ql, cs[c].half ? 2e-3 : 2e-2);
#ifdef SKV_CUSIM
        snprintf(name, sizeof name, "... one launch of %s", flash ? "k_flash_gqa" : "k_attend_causal");
        nf = cusim_launches_of("k_flash_gqa") - nf;
        na = cusim_launches_of("k_attend_causal") - na;
        test_cond(name, flash ? nf == 1 && na == 0 : nf == 0 && na == 1);
#endif
        cu->free(dq); cu->free(dout); cu->free(dk); cu->free(dv);
        free(q); free(oc); free(og); free(kr); free(vr);
    }
}

/* x (n) rounded into 16 bits of type elt by the CPU twin (a new array). */
static uint16_t *packed(const float *x, size_t n, int elt) {
    uint16_t *y = malloc(sizeof(uint16_t) * (n ? n : 1));
    cpu->pack_h(x, n, y, elt);
    return y;
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
#ifdef SKV_CUSIM
        cusim_counters_reset();
#endif
        test_cond("cuda svd returns 0", cu->svd(dK, s, n, r, dU, dS, NULL, svg, &errg) == 0);
#ifdef SKV_CUSIM
        {
            /* the norms, cuSOLVER's info and the eigenvalues come down in one copy: the host
             * waits once (it waited four times: two norms, the info, the eigenvalues) */
            cusim_counters sc;
            cusim_counters_get(&sc);
            char m2[160];
            snprintf(m2, sizeof m2, "cuda svd: one host sync (%llu)", (unsigned long long)sc.host_syncs);
            test_cond(m2, sc.host_syncs == 1);
        }
#endif
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
        /* a NaN in the keys: refused in one line, on the device as on the CPU */
        K[(size_t)(s / 2) * n + 3] = NAN;
        float *dN = dev(K, sizeof(float) * s * n);
        int rn = cu->svd(dN, s, n, r, dU, dS, NULL, svg, &errg);
        test_cond("cuda svd refuses a NaN in the key matrix, as the CPU does",
                  rn == SKV_EINVAL && strstr(skv_last_error(), "NaN or infinity") &&
                      cpu->svd(K, s, n, r, U, SVt, NULL, svc, &errc) == SKV_EINVAL);
        cu->free(dN);
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
        /* the landmarks as the policy keeps them, in IEEE half */
        uint16_t *lm_h = packed(lm, (size_t)nch * d, SKV_ELT_F16), *dlm_h = dev(lm_h, sizeof(uint16_t) * nch * d);
        cpu->score(q, 1, (size_t)group * d, group, d, lm_h, nch, 0.0884f, tmp, sc);
        cu->score(dq, 1, (size_t)group * d, group, d, dlm_h, nch, 0.0884f, dtmp, dsc);
        g = back(dsc, nch);
        cmp("score (softmax per head, GQA max)", g, sc, nch, 1e-5);
        free(g);
        { /* three positions summed (the q rows a stride apart), a group of 7 */
            int nq = 3, G7 = 7;
            size_t qs = (size_t)G7 * d + 16;
            float *q3 = rnd(qs * nq), *sc3 = malloc(sizeof(float) * nch), *t3 = malloc(sizeof(float) * 2 * G7 * nch);
            float *dq3 = dev(q3, sizeof(float) * qs * nq), *ds3 = dev(NULL, sizeof(float) * nch);
            cpu->score(q3, nq, qs, G7, d, lm_h, nch, 0.0884f, t3, sc3);
            cu->score(dq3, nq, qs, G7, d, dlm_h, nch, 0.0884f, NULL, ds3);
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
        cu->free(dlm_h);
        free(K); free(lm); free(cm); free(q); free(sc); free(tmp); free(g); free(lm_h);
    }
    /* gather of bf16 blocks from pinned host memory into strided device rows, on the fetch stream: f32
     * (widened) and bf16 (copied as they are) */
    {
        int rows = 8, cols = 128, nb = 300, dst_stride = 136, n = 40; /* gaps between the rows */
        size_t sl = (size_t)nb * rows * cols, dl = (size_t)n * rows * dst_stride;
        float *hf = rnd(sl);
        uint16_t *src = cu->host_alloc(sizeof(uint16_t) * sl), *hs = packed(hf, sl, SKV_ELT_BF16);
        memcpy(src, hs, sizeof(uint16_t) * sl);
        free(hf);
        int idx[40];
        size_t off[40];
        for (int i = 0; i < n; i++) {
            idx[i] = (i * 37) % nb;
            off[i] = (size_t)(n - 1 - i) * rows * dst_stride;
        }
        float *dc = calloc(dl, sizeof(float)), *dd = dev(NULL, sizeof(float) * dl);
        cpu->gather(hs, rows, cols, idx, n, dc, SKV_ELT_F32, off, dst_stride);
        cu->gather(src, rows, cols, idx, n, dd, SKV_ELT_F32, off, dst_stride);
        float *g = back(dd, dl); /* download waits for the fetch stream */
        cmp("gather (zero-copy from pinned memory, bf16 widened)", g, dc, dl, 0);
        uint16_t *bc = malloc(sizeof(uint16_t) * dl), *bd = dev(NULL, sizeof(uint16_t) * dl);
        memset(bc, 0x5a, sizeof(uint16_t) * dl); /* what the gaps keep */
        cu->upload(bd, bc, sizeof(uint16_t) * dl);
        cpu->gather(hs, rows, cols, idx, n, bc, SKV_ELT_BF16, off, dst_stride);
        cu->gather(src, rows, cols, idx, n, bd, SKV_ELT_BF16, off, dst_stride);
        uint16_t *bg = back16(bd, dl);
        test_cond("cuda gather into bf16 rows (zero-copy from pinned memory): the CPU twin's bits", !memcmp(bg, bc,
                  sizeof(uint16_t) * dl));
        cu->host_free(src);
        cu->free(dd); cu->free(bd);
        free(hs); free(dc); free(g); free(bc); free(bg);
    }
    /* rebuild fused with RoPE, with tables and without; project */
    {
        int s = 600, r = 160, d = 128, t0 = 333, n = 64;
        rope_params p = {.mode = ROPE_ADJACENT, .head_dim = d, .rope_dim = d, .theta = 500000};
        rope_ctx rc;
        rope_init(&rc, &p, NULL);
        float *Uf = rnd((size_t)s * r), *svt = rnd((size_t)r * d), *oc = malloc(sizeof(float) * n * d);
        uint16_t *U = packed(Uf, (size_t)s * r, SKV_ELT_BF16), *dU = dev(U, sizeof(uint16_t) * s * r); /* U in bf16 */
        float *dsvt = dev(svt, sizeof(float) * r * d), *dout = dev(NULL, sizeof(float) * n * d);
        free(Uf);
        cpu->rebuild(U, r, svt, d, t0, n, &rc, NULL, NULL, oc, SKV_ELT_F32);
        cu->rebuild(dU, r, dsvt, d, t0, n, &rc, NULL, NULL, dout, SKV_ELT_F32);
        float *g = back(dout, (size_t)n * d);
        cmp("rebuild + RoPE (U in bf16)", g, oc, (size_t)n * d, 1e-5);
        free(g);
        float *cs = malloc(sizeof(float) * s * d / 2), *sn = malloc(sizeof(float) * s * d / 2);
        shadowkv_rope_table(&rc, s, cs, sn);
        float *dcs = dev(cs, sizeof(float) * s * d / 2), *dsn = dev(sn, sizeof(float) * s * d / 2);
        cu->rebuild(dU, r, dsvt, d, t0, n, &rc, dcs, dsn, dout, SKV_ELT_F32);
        g = back(dout, (size_t)n * d);
        cmp("rebuild + RoPE from tables", g, oc, (size_t)n * d, 1e-5);
        free(g);
        /* stored as bf16 (ShadowKV's key rows), without tables and with: each side's f32 result rounded */
        uint16_t *oc16 = malloc(sizeof(uint16_t) * n * d), *dout16 = dev(NULL, sizeof(uint16_t) * n * d);
        for (int tab = 0; tab < 2; tab++) {
            const float *hcs = tab ? cs : NULL, *hsn = tab ? sn : NULL, *gcs = tab ? dcs : NULL, *gsn = tab ? dsn : NULL;
            cpu->rebuild(U, r, svt, d, t0, n, &rc, hcs, hsn, oc, SKV_ELT_F32);
            cpu->rebuild(U, r, svt, d, t0, n, &rc, hcs, hsn, oc16, SKV_ELT_BF16);
            cu->rebuild(dU, r, dsvt, d, t0, n, &rc, gcs, gsn, dout, SKV_ELT_F32);
            cu->rebuild(dU, r, dsvt, d, t0, n, &rc, gcs, gsn, dout16, SKV_ELT_BF16);
            g = back(dout, (size_t)n * d);
            uint16_t *g16 = back16(dout16, (size_t)n * d);
            cmp_bf16(tab ? "rebuild + RoPE from tables into bf16" : "rebuild + RoPE into bf16", g16, oc16, g, oc,
                     (size_t)n * d);
            free(g);
            free(g16);
        }
        cu->free(dout16);
        free(oc16);
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
 * misses and cache state, the fetched value rows and the rebuilt keys
 * (bf16 rows: the values copied as stored, the keys rounded). */
static void t_fused(void) {
    int h = 3, k = 6, nc = 40, c = 8, d = 64, r = 16, s = nc * c, row_slot = 16, rows = row_slot + k * c;
    size_t n_cache = 2 * (size_t)h * k + (size_t)h * nc + h;
    int *cache_c = malloc(sizeof(int) * n_cache), *cand = malloc(sizeof(int) * h * nc);
    for (size_t i = 0; i < n_cache; i++) cache_c[i] = i < (size_t)h * k + (size_t)h * nc ? -1 : 0;
    for (int kh = 0; kh < h; kh++)
        for (int j = 0; j < nc; j++) cand[kh * nc + j] = j + (j >= 20 ? 2 : 0); /* two outlier chunks skipped */
    int *cache_d = dev(cache_c, sizeof(int) * n_cache), *cand_d = dev(cand, sizeof(int) * h * nc);
    /* the store and U in bf16, as the policy keeps them */
    size_t sn_ = (size_t)h * nc * c * d, un = (size_t)(s + 3 * c) * r;
    float *stf = rnd(sn_), *Uf = rnd(un);
    uint16_t *store = cu->host_alloc(sizeof(uint16_t) * sn_), *st_h = packed(stf, sn_, SKV_ELT_BF16);
    memcpy(store, st_h, sizeof(uint16_t) * sn_);
    uint16_t *U = packed(Uf, un, SKV_ELT_BF16), *dU = dev(U, sizeof(uint16_t) * un);
    free(stf); free(Uf);
    float *SVt = rnd((size_t)h * r * d), *dSVt = dev(SVt, sizeof(float) * (size_t)h * r * d);
    rope_params p = {.mode = ROPE_ADJACENT, .head_dim = d, .rope_dim = d, .theta = 500000};
    rope_ctx rc;
    rope_init(&rc, &p, NULL);
    uint16_t *Kc[3], *Vc[3], *Kd[3], *Vd[3];
    /* every position's key in f32 before rounding, each side's (the device's from rebuild, whose row code
     * the fused kernel shares) */
    int nt = (int)(un / r);
    float *k32c[3], *k32g[3], *dk32 = dev(NULL, sizeof(float) * nt * d);
    for (int kh = 0; kh < h; kh++) {
        Kc[kh] = calloc((size_t)rows * d, sizeof(uint16_t));
        Vc[kh] = calloc((size_t)rows * d, sizeof(uint16_t));
        Kd[kh] = dev(NULL, sizeof(uint16_t) * rows * d);
        Vd[kh] = dev(NULL, sizeof(uint16_t) * rows * d);
        k32c[kh] = malloc(sizeof(float) * nt * d);
        shadowkv_rebuild(U, r, SVt + (size_t)kh * r * d, d, 0, nt, &rc, NULL, NULL, k32c[kh]);
        cu->rebuild(dU, r, dSVt + (size_t)kh * r * d, d, 0, nt, &rc, NULL, NULL, dk32, SKV_ELT_F32);
        k32g[kh] = back(dk32, (size_t)nt * d);
    }
    size_t nk = (size_t)h * k * c * d; /* the keys of every head's slots, gathered for cmp_bf16 */
    uint16_t *ks_g = malloc(sizeof(uint16_t) * nk), *ks_c = malloc(sizeof(uint16_t) * nk);
    float *ks_g32 = malloc(sizeof(float) * nk), *ks_c32 = malloc(sizeof(float) * nk);
    int *sel = malloc(sizeof(int) * h * k), *out_c = malloc(sizeof(int) * (3 * h * k + h));
    int *out_d = dev(NULL, sizeof(int) * (3 * h * k + h)), *sel_d = dev(NULL, sizeof(int) * h * k);
    int *got = malloc(sizeof(int) * (3 * h * k + h)), *cache_g = malloc(sizeof(int) * n_cache), ok = 1;
    int v_same = 1, k_ok = 1;
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
        size_t nks = 0;
        for (int kh = 0; kh < h; kh++) {
            uint16_t *kg = back16(Kd[kh], (size_t)rows * d), *vg = back16(Vd[kh], (size_t)rows * d);
            v_same &= !memcmp(vg, Vc[kh], sizeof(uint16_t) * rows * d);
            for (int sl = 0; sl < k; sl++) { /* a slot holds candidate id: chunk cand[id]'s keys */
                int id = sid[kh * k + sl];
                if (id < 0) continue;
                size_t o = (size_t)(row_slot + sl * c) * d, t = (size_t)cand[kh * nc + id] * c * d, m = (size_t)c * d;
                memcpy(ks_g + nks, kg + o, sizeof(uint16_t) * m);
                memcpy(ks_c + nks, Kc[kh] + o, sizeof(uint16_t) * m);
                memcpy(ks_g32 + nks, k32g[kh] + t, sizeof(float) * m);
                memcpy(ks_c32 + nks, k32c[kh] + t, sizeof(float) * m);
                nks += m;
            }
            free(kg);
            free(vg);
        }
        k_ok &= nks == nk; /* every slot filled from the first step on (k misses) */
        char name[80];
        snprintf(name, sizeof name, "sk_rebuild_misses (every head's slots, step %d)", step);
        cmp_bf16(name, ks_g, ks_c, ks_g32, ks_c32, nks);
    }
    test_cond("cuda sk_books: slots, misses and the caches' state equal the CPU twin's over 3 steps", ok);
    test_cond("cuda sk_gather_misses: the bf16 value rows are the CPU twin's bit for bit over 3 steps (the store's "
              "values copied as they are)", v_same);
    test_cond("cuda sk_rebuild_misses: every head's k slots hold a chunk after the first step", k_ok);
    for (int kh = 0; kh < h; kh++) {
        free(Kc[kh]); free(Vc[kh]); cu->free(Kd[kh]); cu->free(Vd[kh]); free(k32c[kh]); free(k32g[kh]);
    }
    cu->free(dk32);
    free(ks_g); free(ks_c); free(ks_g32); free(ks_c32);
    rope_free(&rc);
    cu->host_free(store);
    cu->free(cache_d); cu->free(cand_d); cu->free(dU); cu->free(dSVt); cu->free(out_d); cu->free(sel_d);
    free(cache_c); free(cand); free(st_h); free(U); free(SVt); free(sel); free(out_c); free(got); free(cache_g);
}

/* sk_gather_misses where the 16-byte copy cannot be used (copy_bf16_warp's
 * element-wise path): rows that start one value past 16-byte alignment, and
 * a chunk of c*d values that is not a multiple of 8. The rows must equal the
 * CPU twin's bit for bit, and nothing outside the missed slots may change. */
static void t_gather_unaligned(void) {
    static const struct { int c, d, shift; const char *what; } cs[] = {
        {8, 64, 1, "rows one value past 16-byte alignment"},
        {3, 6, 0, "chunks of 3 x 6 = 18 values (not a multiple of 8)"},
        {5, 12, 3, "chunks of 60 values, rows three values off"},
    };
    int h = 2, k = 3, nc = 10, row_slot = 2;
    for (size_t t = 0; t < sizeof cs / sizeof cs[0]; t++) {
        int c = cs[t].c, d = cs[t].d, sh = cs[t].shift;
        size_t rows = (size_t)row_slot + (size_t)k * c, nv = rows * d + (size_t)sh, sn_ = (size_t)h * nc * c * d;
        float *stf = rnd(sn_);
        uint16_t *st_h = packed(stf, sn_, SKV_ELT_BF16), *store = cu->host_alloc(sizeof(uint16_t) * sn_);
        memcpy(store, st_h, sizeof(uint16_t) * sn_);
        free(stf);
        /* each head: slots 0..k-1 hold selections sel[i]; misses are every
         * other selection (the hits keep the rows' old contents) */
        int sel[2 * 3], so[2 * 3], mi[2 * 3], nm[2];
        for (int kh = 0; kh < h; kh++) {
            nm[kh] = 0;
            for (int i = 0; i < k; i++) {
                sel[kh * k + i] = (3 * i + 2 * kh + 1) % nc;
                so[kh * k + i] = (i + kh) % k;
                if ((i + kh) % 2 == 0) mi[kh * k + nm[kh]++] = i;
            }
            for (int m = nm[kh]; m < k; m++) mi[kh * k + m] = 0;
        }
        int *dsel = dev(sel, sizeof sel), *dso = dev(so, sizeof so), *dmi = dev(mi, sizeof mi), *dnm = dev(nm, sizeof nm);
        uint16_t *base_c[2], *base_d[2], *Vc[2], *Vd[2];
        float *fill = rnd(nv);
        uint16_t *fill16 = packed(fill, nv, SKV_ELT_BF16);
        free(fill);
        for (int kh = 0; kh < h; kh++) {
            base_c[kh] = malloc(sizeof(uint16_t) * nv);
            memcpy(base_c[kh], fill16, sizeof(uint16_t) * nv);
            base_d[kh] = dev(fill16, sizeof(uint16_t) * nv);
            Vc[kh] = base_c[kh] + sh;
            Vd[kh] = base_d[kh] + sh;
        }
        cpu->sk_gather_misses(st_h, c, d, h, k, nc, 0, sel, so, mi, nm, Vc, row_slot);
        cu->sk_gather_misses(store, c, d, h, k, nc, 0, dsel, dso, dmi, dnm, Vd, row_slot);
        int same = 1, changed = 0;
        for (int kh = 0; kh < h; kh++) {
            uint16_t *g = back16(base_d[kh], nv);
            same &= !memcmp(g, base_c[kh], sizeof(uint16_t) * nv);
            changed += memcmp(base_c[kh], fill16, sizeof(uint16_t) * nv) != 0;
            free(g);
        }
        char msg[200];
        snprintf(msg, sizeof msg, "cuda sk_gather_misses, %s: the rows equal the CPU twin's bit for bit, the rest "
                 "untouched (%d of %d heads written)", cs[t].what, changed, h);
        test_cond(msg, same && changed == h);
        for (int kh = 0; kh < h; kh++) {
            free(base_c[kh]);
            cu->free(base_d[kh]);
        }
        free(fill16);
        free(st_h);
        cu->host_free(store);
        cu->free(dsel); cu->free(dso); cu->free(dmi); cu->free(dnm);
    }
}

/* The batched decode step (the dense policy's): kv_store_batch and
 * attend_decode_batch over n sequences of different lengths, each its own
 * head-major cache (capacity not a multiple of anything), f32 and f16,
 * GQA groups 1 to 8, head dims 32 to 256 (and ones whose rows are not
 * 16-byte aligned: the element-wise loads), batches of 1 and 4: the stored
 * rows equal the CPU twin's bit for bit, the attention within f32 bounds,
 * and on the simulator one launch each for the whole batch. */
static void t_decode_batch(void) {
    static const struct { int g, d, half, n; } cs[] = {
        {1, 32, 0, 4}, {4, 128, 1, 4}, {7, 64, 0, 1}, {7, 96, 1, 4}, {4, 128, 0, 1}, {1, 64, 1, 1},
        {2, 256, 0, 4}, {8, 64, 1, 4}, {4, 34, 0, 4}, {7, 36, 1, 1},
    };
    /* rows a sequence attends: one row, under a part, and lengths that split into parts of unequal rows */
    static const int rows4[4] = {1, 300, SIM(5000, 700), SIM(9001, 1033)}, rows1[1] = {SIM(9001, 1033)};
    int nkv = 2;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        int g = cs[ci].g, d = cs[ci].d, half = cs[ci].half, n = cs[ci].n, nh = g * nkv;
        size_t el = half ? 2 : 4, kvd = (size_t)nkv * d, qd = (size_t)nh * d;
        const int *rows = n == 4 ? rows4 : rows1;
        skv_kv_seq hs[4], ds[4];
        size_t cl[4];
        for (int i = 0; i < n; i++) {
            int cap = rows[i] + 7, pos = rows[i] - 1;
            cl[i] = (size_t)nkv * cap * d;
            void *hk = calloc(cl[i], el), *hv = calloc(cl[i], el);
            float *src = rnd((size_t)(pos ? pos : 1) * kvd), *vsrc = rnd((size_t)(pos ? pos : 1) * kvd);
            if (half) {
                cpu->kv_store_h(hk, (size_t)cap * d, nkv, d, 0, pos, src);
                cpu->kv_store_h(hv, (size_t)cap * d, nkv, d, 0, pos, vsrc);
            } else {
                cpu->kv_store(hk, (size_t)cap * d, nkv, d, 0, pos, src);
                cpu->kv_store(hv, (size_t)cap * d, nkv, d, 0, pos, vsrc);
            }
            hs[i] = (skv_kv_seq){.k = hk, .v = hv, .head_stride = (size_t)cap * d, .pos = pos};
            ds[i] = hs[i];
            ds[i].k = dev(hk, cl[i] * el);
            ds[i].v = dev(hv, cl[i] * el);
            free(src); free(vsrc);
        }
        float *k = rnd(n * kvd), *v = rnd(n * kvd), *q = rnd(n * qd), *oc = malloc(sizeof(float) * n * qd);
        float *dk = dev(k, sizeof(float) * n * kvd), *dv = dev(v, sizeof(float) * n * kvd);
        float *dq = dev(q, sizeof(float) * n * qd), *dout = dev(NULL, sizeof(float) * n * qd);
#ifdef SKV_CUSIM
        cusim_counters_reset();
#endif
        (half ? cu->kv_store_batch_h : cu->kv_store_batch)(ds, n, nkv, d, dk, dv);
        int rc = (half ? cu->attend_decode_batch_h : cu->attend_decode_batch)(ds, n, nh, nkv, d, dq, dout);
        int launches = -1;
#ifdef SKV_CUSIM
        launches = (int)(cusim_launches_of("k_kv_store_batch") + cusim_launches_of("k_flash_decode"));
        cusim_counters c;
        cusim_counters_get(&c);
        launches = c.launches == (uint64_t)launches ? launches : -1;
#endif
        (half ? cpu->kv_store_batch_h : cpu->kv_store_batch)(hs, n, nkv, d, k, v);
        (half ? cpu->attend_decode_batch_h : cpu->attend_decode_batch)(hs, n, nh, nkv, d, q, oc);
        int same = 1;
        for (int i = 0; i < n; i++) {
            char *gk = malloc(cl[i] * el), *gv = malloc(cl[i] * el);
            cu->download(gk, ds[i].k, cl[i] * el);
            cu->download(gv, ds[i].v, cl[i] * el);
            same &= !memcmp(gk, hs[i].k, cl[i] * el) && !memcmp(gv, hs[i].v, cl[i] * el);
            free(gk); free(gv);
        }
        char name[200];
        snprintf(name, sizeof name, "cuda kv_store_batch%s (batch %d, head dim %d): every cache's rows the CPU twin's "
                 "bit for bit", half ? "_h" : "", n, d);
        test_cond(name, same);
        float *og = back(dout, n * qd);
        snprintf(name, sizeof name, "attend_decode_batch%s (batch %d, GQA %d:1, head dim %d, rows %d..%d)",
                 half ? "_h" : "", n, g, d, rows[0], rows[n - 1]);
        test_cond("cuda attend_decode_batch returns 0", rc == 0);
        cmp(name, og, oc, n * qd, 1e-5);
#ifdef SKV_CUSIM
        snprintf(name, sizeof name, "cuda decode step of a batch of %d: 2 launches, one store and one attention "
                 "(got %d)", n, launches);
        test_cond(name, launches == 2);
#else
        (void)launches;
#endif
        for (int i = 0; i < n; i++) {
            free(hs[i].k); free(hs[i].v);
            cu->free(ds[i].k); cu->free(ds[i].v);
        }
        cu->free(dk); cu->free(dv); cu->free(dq); cu->free(dout);
        free(k); free(v); free(q); free(oc); free(og);
    }
    /* attend_decode over token-major rows (the heads side by side in a row) */
    {
        int nh = 12, d = 64, rows = SIM(3000, 900), stride = 3 * d;
        size_t kl = (size_t)rows * stride;
        float *q = rnd((size_t)nh * d), *K = rnd(kl), *V = rnd(kl), *oc = malloc(sizeof(float) * nh * d);
        float *dq = dev(q, sizeof(float) * nh * d), *dK = dev(K, sizeof(float) * kl), *dV = dev(V, sizeof(float) * kl),
              *dout = dev(NULL, sizeof(float) * nh * d);
        cpu->attend_decode(q, nh, 3, d, K, V, rows, stride, d, oc);
        SKV_ASSERT(cu->attend_decode(dq, nh, 3, d, dK, dV, rows, stride, d, dout) == 0);
        float *og = back(dout, (size_t)nh * d);
        cmp("attend_decode (token-major rows, GQA 4:1)", og, oc, (size_t)nh * d, 1e-5);
        cu->free(dq); cu->free(dK); cu->free(dV); cu->free(dout);
        free(q); free(K); free(V); free(oc); free(og);
    }
}

/* ---- the batched ShadowKV step (sk_step_*) against its CPU twins ---- */

/* One job's buffers on both sides: [0] the CPU's, [1] the device's. */
typedef struct {
    float *svt[2], *cs[2], *sn[2], *score[2];
    uint16_t *K[2], *V[2], *lm[2], *U[2], *store[2]; /* bf16, bf16, IEEE half, bf16, bf16: as the policy keeps them */
    int *cand[2], *cache[2], *pack[2];
    int cap;
} sk_tjob;

/* A batch of B sequences of h KV heads (group G, head dim d), sequence i
 * with nc[i] candidates, k[i] selected, c tokens a chunk, rank r, over
 * three steps: every stage of both sides compared. Steps 0 and 2 append
 * with RoPE (rope_new: q rotated in place, the key on its way), step 1
 * without. The select launch's scores are compared with the CPU's, and its
 * top-k and books with the CPU twin's on the device's own scores (so they
 * must agree exactly); in the last step both take given scores with ties,
 * -0, +0 and a NaN (scored: the statistics never give them). */
static void t_sk_step_case(int B, int h, int G, int d, const int *nc, const int *kk, int c, int r) {
    int nj = B * h, qd = h * G * d, kvd = h * d, s = 64 * c, half = d / 2;
    rope_params rp = {.mode = ROPE_ADJACENT, .head_dim = d, .rope_dim = d, .theta = 10000};
    rope_ctx rc;
    rope_init(&rc, &rp, NULL);
    float *cs = malloc(sizeof(float) * s * half), *sn = malloc(sizeof(float) * s * half);
    shadowkv_rope_table(&rc, s, cs, sn);
    sk_tjob *T = calloc(nj, sizeof *T);
    sk_job *jobs[2] = {calloc(nj, sizeof(sk_job)), calloc(nj, sizeof(sk_job))};
    size_t lg = 0;
    int seq_h[2 * 3], max_cand = 0, max_k = 0;
    for (int j = 0; j < nj; j++) {
        int i = j / h, n = nc[i], k = kk[i], row_slot = 2 * c, row_gen = row_slot + k * c + 3;
        sk_tjob *t = &T[j];
        t->cap = row_gen + 8;
        float *Kf = rnd((size_t)t->cap * d), *Vf = rnd((size_t)t->cap * d), *lmf = rnd((size_t)n * d);
        float *Uf = rnd((size_t)s * r), *svt = rnd((size_t)r * d), *stf = rnd((size_t)n * c * d);
        uint16_t *lm = packed(lmf, (size_t)n * d, SKV_ELT_F16), *U = packed(Uf, (size_t)s * r, SKV_ELT_BF16);
        uint16_t *st = packed(stf, (size_t)n * c * d, SKV_ELT_BF16);
        uint16_t *K = bf16_of(Kf, (size_t)t->cap * d), *V = bf16_of(Vf, (size_t)t->cap * d);
        free(lmf); free(Uf); free(stf); free(Kf); free(Vf);
        int *cand = malloc(sizeof(int) * n), *cache = malloc(sizeof(int) * (2 * k + n + 1));
        for (int x = 0; x < n; x++) cand[x] = x + (x >= n / 2 ? 3 : 0); /* chunks 0..63, a gap */
        for (int x = 0; x < 2 * k + n + 1; x++) cache[x] = x < k + n ? -1 : 0; /* slot_id, where; stamp, epoch */
        t->K[0] = K; t->V[0] = V; t->lm[0] = lm; t->U[0] = U; t->svt[0] = svt; t->cs[0] = cs; t->sn[0] = sn;
        t->store[0] = st; t->cand[0] = cand; t->cache[0] = cache;
        t->score[0] = calloc(n, sizeof(float));
        t->pack[0] = calloc(3 * k + 1, sizeof(int));
        t->K[1] = dev(K, sizeof(uint16_t) * t->cap * d); t->V[1] = dev(V, sizeof(uint16_t) * t->cap * d);
        t->lm[1] = dev(lm, sizeof(uint16_t) * n * d); t->U[1] = dev(U, sizeof(uint16_t) * s * r);
        t->svt[1] = dev(svt, sizeof(float) * r * d); t->cs[1] = dev(cs, sizeof(float) * s * half);
        t->sn[1] = dev(sn, sizeof(float) * s * half);
        t->store[1] = cu->host_alloc(sizeof(uint16_t) * n * c * d);
        memcpy(t->store[1], st, sizeof(uint16_t) * n * c * d);
        t->cand[1] = dev(cand, sizeof(int) * n); t->cache[1] = dev(cache, sizeof(int) * (2 * k + n + 1));
        t->score[1] = dev(NULL, sizeof(float) * n); t->pack[1] = dev(NULL, sizeof(int) * (3 * k + 1));
        for (int w = 0; w < 2; w++) {
            int *cc = t->cache[w], *pk = t->pack[w];
            jobs[w][j] = (sk_job){
                .K = t->K[w], .V = t->V[w], .lm = t->lm[w], .U = t->U[w], .svt = t->svt[w], .cs = t->cs[w],
                .sn = t->sn[w], .cand = t->cand[w], .store = t->store[w], .key = NULL, .slot_id = cc,
                .where = cc + k, .stamp = (unsigned *)(cc + k + n), .epoch = (unsigned *)(cc + 2 * k + n),
                .score = t->score[w], .sel = pk, .slot_of = pk + k, .miss = pk + 2 * k, .n_miss = pk + 3 * k,
                .gi = i, .kh = j % h, .n_cand = n, .k = k, .r = r, .c = c, .row_slot = row_slot,
                .row_gen = row_gen, .s = s + 5 * i, .lg = lg,
            };
        }
        lg += 2 * (size_t)G * n;
        max_cand = n > max_cand ? n : max_cand;
        max_k = k > max_k ? k : max_k;
    }
    sk_step st[2];
    int max_rows = 0;
    for (int w = 0; w < 2; w++)
        st[w] = (sk_step){.n_jobs = nj, .group = G, .d = d, .kvd = kvd, .qd = qd, .max_cand = max_cand,
                          .max_k = max_k, .max_c = c, .rope = &rc};
    st[0].jobs = jobs[0];
    st[1].jobs = dev(jobs[1], sizeof(sk_job) * nj);
    st[0].lg = malloc(sizeof(float) * lg);
    st[1].lg = dev(NULL, sizeof(float) * lg);
    st[1].part = dev(NULL, sizeof(float) * nj * SK_STEP_PARTS * G * (d + 2));
    st[1].done = dev(NULL, sizeof(unsigned) * nj);
    int *seq_d = dev(NULL, sizeof(seq_h));
    float *qd_ = dev(NULL, sizeof(float) * B * qd), *kd = dev(NULL, sizeof(float) * B * kvd);
    float *vd = dev(NULL, sizeof(float) * B * kvd), *od = dev(NULL, sizeof(float) * B * qd);
    float *oc = malloc(sizeof(float) * B * qd);
    double e_score = 0, e_out = 0, e_q = 0;
    int ok_sel = 1, ok_books = 1, ok_v = 1, parts = 0;
    size_t k_n = 0, k_all = 0;
    for (int j = 0; j < nj; j++) k_all += 3 * (size_t)T[j].cap * d;
    uint16_t *kall[2] = {malloc(sizeof(uint16_t) * k_all), malloc(sizeof(uint16_t) * k_all)}; /* CPU's, device's */
    for (int step = 0; step < 3; step++) {
        float *q = rnd((size_t)B * qd), *k = rnd((size_t)B * kvd), *v = rnd((size_t)B * kvd);
        cu->upload(qd_, q, sizeof(float) * B * qd);
        cu->upload(kd, k, sizeof(float) * B * kvd);
        cu->upload(vd, v, sizeof(float) * B * kvd);
        for (int i = 0; i < B; i++) {
            seq_h[2 * i] = B - 1 - i; /* the rows in another order than the sequences */
            seq_h[2 * i + 1] = step + i;
            int rows = jobs[0][i * h].row_gen + step + i + 1;
            max_rows = rows > max_rows ? rows : max_rows;
            parts = sk_step_parts(rows) > parts ? sk_step_parts(rows) : parts;
        }
        cu->upload(seq_d, seq_h, sizeof(seq_h));
        st[0].seq = seq_h;
        st[1].seq = seq_d;
        st[0].max_rows = st[1].max_rows = max_rows;
        st[0].rope_new = st[1].rope_new = step != 1;
        shadowkv_step_append(&st[0], q, k, v);
        cu->sk_step_append(&st[1], qd_, kd, vd);
        {
            float *qg = back(qd_, (size_t)B * qd);
            double e = test_rel_l2(qg, q, (size_t)B * qd);
            e_q = e > e_q ? e : e_q;
            free(qg);
        }
        shadowkv_step_logits(&st[0], q);
        cu->sk_step_logits(&st[1], qd_);
        st[0].scored = st[1].scored = step == 2;
        if (step == 2) { /* ties: scores on a grid of 4 values, a NaN, -0 and +0 */
            for (int j = 0; j < nj; j++) {
                int n = jobs[0][j].n_cand;
                for (int x = 0; x < n; x++)
                    T[j].score[0][x] = x == 1 ? NAN : x == 2 ? -0.0f : x == 3 ? 0.0f : floorf(frand() * 2) / 2;
                cu->upload(T[j].score[1], T[j].score[0], sizeof(float) * n);
            }
        } else {
            shadowkv_step_stats(&st[0]);
        }
        cu->sk_step_select(&st[1]);
        if (step != 2) /* the device's scores against the CPU's, then the CPU's order on the device's scores */
            for (int j = 0; j < nj; j++) {
                int n = jobs[0][j].n_cand;
                float *g = back(T[j].score[1], n);
                double e = test_rel_l2(g, T[j].score[0], n);
                e_score = e > e_score ? e : e_score;
                memcpy(T[j].score[0], g, sizeof(float) * n);
                free(g);
            }
        st[0].scored = 1;
        shadowkv_step_select(&st[0]);
        shadowkv_step_fetch(&st[0]);
        cu->sk_step_fetch(&st[1]);
        shadowkv_step_rebuild(&st[0]);
        cu->sk_step_rebuild(&st[1]);
        shadowkv_step_attend(&st[0], q, oc);
        cu->sk_step_attend(&st[1], qd_, od);
        for (int j = 0; j < nj; j++) {
            const sk_job *J = &jobs[0][j];
            int n = J->n_cand, kq = J->k, *pk = malloc(sizeof(int) * (3 * kq + 1));
            int *cg = malloc(sizeof(int) * (2 * kq + n + 1));
            cu->download(pk, T[j].pack[1], sizeof(int) * (3 * kq + 1));
            cu->download(cg, T[j].cache[1], sizeof(int) * (2 * kq + n + 1));
            ok_sel &= !memcmp(pk, T[j].pack[0], sizeof(int) * kq);
            int nm = T[j].pack[0][3 * kq];
            ok_books &= pk[3 * kq] == nm && !memcmp(pk + kq, T[j].pack[0] + kq, sizeof(int) * (kq + nm)) &&
                        !memcmp(cg, T[j].cache[0], sizeof(int) * (2 * kq + n + 1));
            size_t nv = (size_t)T[j].cap * d;
            uint16_t *kg = back16(T[j].K[1], nv), *vg = back16(T[j].V[1], nv);
            ok_v &= !memcmp(vg, T[j].V[0], sizeof(uint16_t) * nv);
            /* the keys (f32 results rounded on each side), gathered for cmp_bf16 */
            memcpy(kall[0] + k_n, T[j].K[0], sizeof(uint16_t) * nv);
            memcpy(kall[1] + k_n, kg, sizeof(uint16_t) * nv);
            k_n += nv;
            free(pk); free(cg); free(kg); free(vg);
        }
        float *og = back(od, (size_t)B * qd);
        double eo = test_rel_l2(og, oc, (size_t)B * qd);
        e_out = eo > e_out ? eo : e_out;
        free(og); free(q); free(k); free(v);
    }
    char msg[640];
    snprintf(msg, sizeof msg, "cuda sk_step (batch %d, %d KV heads, group %d, head dim %d, k %d..%d of %d..%d "
             "candidates, 3 steps): queries rotated by append rel L2 %.1e (bound 1e-6); select's scores rel L2 "
             "%.1e (bound 1e-5); its top-k equal on the same scores, ties, NaN and +-0 included (%s); books, slots "
             "and caches equal (%s); bf16 value rows (appended, rounded; fetched, copied) equal bit for bit (%s); "
             "attention over %d parts %.1e (bound 1e-5)", B, h, G, d, kk[0], kk[B - 1], nc[0], nc[B - 1], e_q,
             e_score, ok_sel ? "yes" : "no", ok_books ? "yes" : "no", ok_v ? "yes" : "no", parts, e_out);
    test_cond(msg, e_q <= 1e-6 && e_score <= 1e-5 && ok_sel && ok_books && ok_v && e_out <= 1e-5);
    snprintf(msg, sizeof msg, "sk_step key rows (batch %d, group %d, head dim %d: appended with RoPE or not, "
             "rebuilt; 3 steps)", B, G, d);
    cmp_bf16(msg, kall[1], kall[0], NULL, NULL, k_n);
    free(kall[0]);
    free(kall[1]);
    for (int j = 0; j < nj; j++) {
        sk_tjob *t = &T[j];
        free(t->K[0]); free(t->V[0]); free(t->lm[0]); free(t->U[0]); free(t->svt[0]); free(t->store[0]);
        free(t->cand[0]); free(t->cache[0]); free(t->score[0]); free(t->pack[0]);
        cu->free(t->K[1]); cu->free(t->V[1]); cu->free(t->lm[1]); cu->free(t->U[1]); cu->free(t->svt[1]);
        cu->free(t->cs[1]); cu->free(t->sn[1]); cu->host_free(t->store[1]); cu->free(t->cand[1]);
        cu->free(t->cache[1]); cu->free(t->score[1]); cu->free(t->pack[1]);
    }
    cu->free((void *)st[1].jobs); cu->free(st[1].lg); cu->free(st[1].part); cu->free(st[1].done);
    cu->free(seq_d); cu->free(qd_); cu->free(kd); cu->free(vd); cu->free(od);
    free(st[0].lg); free(oc); free(T); free(jobs[0]); free(jobs[1]); free(cs); free(sn);
    rope_free(&rc);
}

/* The select launch on given scores (scored) with k equal to the
 * candidates (every candidate, sorted) beside k of 50 with ties, a NaN, -0
 * and +0: the selection and the books equal the CPU twin's, twice (the
 * second select finds hits). */
static void t_sk_step_select_edges(void) {
    enum { NJ = 3 };
    int n[NJ] = {7, 50, 9}, k[NJ] = {7, 3, 9}, ok = 1;
    sk_job jc[NJ], jd[NJ];
    float *sc[NJ], *sd[NJ];
    int *ic[NJ], *id[NJ], *cc[NJ], *cd[NJ];
    for (int j = 0; j < NJ; j++) {
        sc[j] = rnd(n[j]);
        for (int x = 0; x < n[j]; x += 3) sc[j][x] = 0.25f; /* ties */
        if (j == 1) {
            sc[j][4] = NAN;
            sc[j][5] = -0.0f;
            sc[j][7] = 0.0f;
        }
        sd[j] = dev(sc[j], sizeof(float) * n[j]);
        int nb = 2 * k[j] + n[j] + 1; /* slot_id, where; stamp, epoch */
        cc[j] = malloc(sizeof(int) * nb);
        for (int x = 0; x < nb; x++) cc[j][x] = x < k[j] + n[j] ? -1 : 0;
        cd[j] = dev(cc[j], sizeof(int) * nb);
        ic[j] = calloc(3 * k[j] + 1, sizeof(int)); /* sel, slot_of, miss, n_miss */
        id[j] = dev(NULL, sizeof(int) * (3 * k[j] + 1));
        for (int w = 0; w < 2; w++) {
            int *c = w ? cd[j] : cc[j], *pk = w ? id[j] : ic[j];
            (w ? jd : jc)[j] = (sk_job){.score = w ? sd[j] : sc[j], .slot_id = c, .where = c + k[j],
                                        .stamp = (unsigned *)(c + k[j] + n[j]),
                                        .epoch = (unsigned *)(c + 2 * k[j] + n[j]), .sel = pk, .slot_of = pk + k[j],
                                        .miss = pk + 2 * k[j], .n_miss = pk + 3 * k[j], .n_cand = n[j], .k = k[j]};
        }
    }
    sk_step a = {.jobs = jc, .n_jobs = NJ, .group = 1, .max_cand = 50, .max_k = 9, .scored = 1};
    sk_step b = a;
    b.jobs = dev(jd, sizeof jd);
    for (int round = 0; round < 2; round++) {
        if (round) /* one score of each job moves to the top */
            for (int j = 0; j < NJ; j++) {
                sc[j][n[j] - 1] = 2.0f;
                cu->upload(sd[j], sc[j], sizeof(float) * n[j]);
            }
        shadowkv_step_select(&a);
        cu->sk_step_select(&b);
        for (int j = 0; j < NJ; j++) {
            int nb = 2 * k[j] + n[j] + 1, *g = malloc(sizeof(int) * (3 * k[j] + 1)), *gc = malloc(sizeof(int) * nb);
            cu->download(g, id[j], sizeof(int) * (3 * k[j] + 1));
            cu->download(gc, cd[j], sizeof(int) * nb);
            int nm = ic[j][3 * k[j]];
            ok &= !memcmp(g, ic[j], sizeof(int) * 2 * k[j]) && g[3 * k[j]] == nm &&
                  !memcmp(g + 2 * k[j], ic[j] + 2 * k[j], sizeof(int) * nm) && !memcmp(gc, cc[j], sizeof(int) * nb);
            free(g);
            free(gc);
        }
    }
    for (int j = 0; j < NJ; j++) {
        free(sc[j]); free(ic[j]); free(cc[j]); cu->free(sd[j]); cu->free(id[j]); cu->free(cd[j]);
    }
    cu->free((void *)b.jobs);
    test_cond("cuda sk_step_select on given scores: k equal to the candidates (all, sorted) and k of 50 with ties, "
              "a NaN, -0 and +0: selection and books equal the CPU twin's, over two rounds", ok);
}

static void t_sk_step(void) {
    int nc1[1] = {SIM(300, 40)}, k1[1] = {SIM(20, 5)};
    t_sk_step_case(1, 2, 1, 32, nc1, k1, 4, 8);
    int nc3[3] = {40, 40, 33}, k3[3] = {3, 40, 6}; /* budgets apart; one selects every candidate */
    t_sk_step_case(3, 2, 4, 64, nc3, k3, 4, 16);
    int nc7[3] = {24, 20, 24}, k7[3] = {2, 5, 4};
    t_sk_step_case(3, 1, 7, 128, nc7, k7, 8, 12);
    /* head dim 36: rows 72 bytes apart, so attention loads one element at a time */
    int nc2[2] = {30, 26}, k2[2] = {4, 3};
    t_sk_step_case(2, 2, 3, 36, nc2, k2, 4, 8);
    t_sk_step_select_edges();
}

static void t_timeline(void) {
    if (!cu->span_enable) return;
    int n = 64, d = 128, s = 1024, r = 32;
    float *q = dev(NULL, sizeof(float) * 4 * d);
    uint16_t *K = dev(NULL, sizeof(uint16_t) * s * d), *V = dev(NULL, sizeof(uint16_t) * s * d); /* bf16 rows */
    uint16_t *U = dev(NULL, sizeof(uint16_t) * s * r);
    float *svt = dev(NULL, sizeof(float) * r * d), *out = dev(NULL, sizeof(float) * 4 * d);
    uint16_t *src = cu->host_alloc(sizeof(uint16_t) * 8 * d * n);
    int idx[64];
    size_t off[64];
    for (int i = 0; i < n; i++) { idx[i] = i; off[i] = (size_t)i * 8 * d; }
    rope_params p = {.mode = ROPE_ADJACENT, .head_dim = d, .rope_dim = d, .theta = 10000};
    rope_ctx rc;
    rope_init(&rc, &p, NULL);
    double t0 = skv_now();
    cu->span_enable(1);
    cu->span_tag(3, 7);
    cu->gather(src, 8, d, idx, n, V, SKV_ELT_BF16, off, d);
    cu->rebuild(U, r, svt, d, 0, s, &rc, NULL, NULL, K, SKV_ELT_BF16);
    cu->attend_group(q, 4, K, V, SKV_ELT_BF16, s, d, d, 0.088f, out, NULL, NULL);
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

/* BF16 weights of random values, the device's copy and the host's (the
 * CPU twin multiplies the BF16 weights the device holds). */
static uint16_t *bf16_weights(int rows, int cols, skv_weight *gw) {
    float *w = rnd((size_t)rows * cols);
    uint16_t *wb = malloc(sizeof(uint16_t) * (size_t)rows * cols);
    for (size_t i = 0; i < (size_t)rows * cols; i++) wb[i] = f32_to_bf16(w[i]);
    free(w);
    SKV_ASSERT(cu->weight_load(GGML_BF16, wb, rows, cols, gw) == 0 && gw->type == GGML_BF16);
    return wb;
}

/* The forward pass's decode ops: the matvec kernel (n <= 8 rows, x not
 * rounded: every n, the vector and the scalar paths, k matrices in one
 * launch), the tensor-core kernel past it (9 to 64 rows, x in two BF16
 * parts), cuBLAS past that, the fused gate/up with SwiGLU, add_rmsnorm and
 * rope_qk; on the simulator, their launch counts and a step's one sync. */
static void t_forward_fused(void) {
    skv_workspace ws = {0};
    char op[200];
    /* matmul: cols 512 (16-byte loads), 100 (not a multiple of 8: the
     * scalar path), 200 (16-byte loads, but k_matmma's last 32-column chunk
     * a quarter full), and x one float off 16-byte alignment (scalar too) */
    {
        int rows = 75, cols_of[3] = {512, 100, 200};
        for (int ci = 0; ci < 3; ci++) {
            int cols = cols_of[ci];
            skv_weight gw;
            uint16_t *wb = bf16_weights(rows, cols, &gw);
            double worst = 0, worst_mma = 0;
            static const int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 40, 64, 65};
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (int off = 0; off < (ci ? 1 : 2); off++) {
                    int n = ns[ni];
                    float *x = rnd((size_t)n * cols + 1), *yc = malloc(sizeof(float) * n * rows);
                    cpu->matmul(GGML_BF16, wb, rows, cols, x + off, n, yc, &ws);
                    float *dx = dev(x, sizeof(float) * (n * cols + 1)), *dy = dev(NULL, sizeof(float) * n * rows);
#ifdef SKV_CUSIM
                    cusim_counters_reset();
#endif
                    cu->matmul(gw.type, gw.data, rows, cols, dx + off, n, dy, &ws);
#ifdef SKV_CUSIM
                    cusim_counters c;
                    cusim_counters_get(&c);
                    snprintf(op, sizeof op, "cuda matmul n=%d: %s (%llu launches, %llu library calls)", n,
                             n <= 8    ? "one k_matvec launch, no cuBLAS"
                             : n <= 64 ? "one k_matmma launch, no cuBLAS"
                                       : "cuBLAS",
                             (unsigned long long)c.launches, (unsigned long long)c.lib_calls);
                    if (n <= 64)
                        test_cond(op, c.launches == 1 && c.lib_calls == 0 &&
                                          cusim_launches_of(n <= 8 ? "k_matvec" : "k_matmma") == 1);
                    else test_cond(op, c.lib_calls == 1 && cusim_launches_of("k_mat") == 0);
#endif
                    float *yg = back(dy, (size_t)n * rows);
                    double e = test_rel_l2(yg, yc, (size_t)n * rows);
                    if (n <= 8) worst = e > worst ? e : worst;
                    else if (n <= 64) worst_mma = e > worst_mma ? e : worst_mma;
                    snprintf(op, sizeof op, "matmul bf16 n=%d cols=%d%s", n, cols, off ? " (x unaligned)" : "");
                    cmp(op, yg, yc, (size_t)n * rows, n <= 64 ? 1e-5 : 1e-2); /* cuBLAS rounds x to BF16 */
                    cu->free(dx); cu->free(dy);
                    free(x); free(yc); free(yg);
                }
            snprintf(op, sizeof op, "cuda matvec (n <= 8, cols %d): worst rel L2 %.1e from the CPU twin", cols, worst);
            test_cond(op, worst <= 1e-5);
            /* x in two BF16 parts keeps about 16 bits: near 2^-18 a value,
             * against 2^-9 for x rounded once (cuBLAS's 1e-3 or so) */
            snprintf(op, sizeof op, "cuda matmma (9 <= n <= 64, cols %d): worst rel L2 %.1e from the CPU twin (bound 1e-5)",
                     cols, worst_mma);
            test_cond(op, worst_mma > 0 && worst_mma <= 1e-5);
            /* a row's outputs do not depend on how many rows run beside it */
            {
                float *x = rnd((size_t)64 * cols), *dx = dev(x, sizeof(float) * 64 * cols);
                float *d9 = dev(NULL, sizeof(float) * 9 * rows), *d64 = dev(NULL, sizeof(float) * 64 * rows);
                cu->matmul(gw.type, gw.data, rows, cols, dx, 9, d9, &ws);
                cu->matmul(gw.type, gw.data, rows, cols, dx, 64, d64, &ws);
                float *y9 = back(d9, (size_t)9 * rows), *y64 = back(d64, (size_t)64 * rows);
                snprintf(op, sizeof op, "cuda matmma (cols %d): the first 9 rows of a batch of 64 are a batch of 9's, "
                         "bit for bit", cols);
                test_cond(op, !memcmp(y9, y64, sizeof(float) * 9 * rows));
                cu->free(dx); cu->free(d9); cu->free(d64);
                free(x); free(y9); free(y64);
            }
            cu->weight_free(&gw);
            free(wb);
        }
    }
    /* k_matmma with two chunks' weights loaded ahead (SKV_CUDA_MM_PREFETCH=2):
     * the same MMAs in the same order, so the same bits as one chunk ahead;
     * cols 768 (three chunks a warp: a pair, then one alone), 1000 (not a
     * multiple of 8: the scalar path, the last chunk part full), 512 with x
     * off alignment, and 200 (one chunk a warp or none) */
    {
        int rows = 75, cols_of[4] = {768, 1000, 512, 200};
        for (int ci = 0; ci < 4; ci++) {
            int cols = cols_of[ci], off = ci == 2;
            skv_weight gw, gg;
            uint16_t *wb = bf16_weights(rows, cols, &gw), *wg = bf16_weights(rows, cols, &gg);
            static const int ns[] = {9, 40, 64};
            int same = 1, ran = 1;
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int n = ns[ni];
                size_t len = (size_t)n * rows;
                float *x = rnd((size_t)n * cols + 1), *dx = dev(x, sizeof(float) * (n * cols + 1));
                float *y[2][3];
                for (int pf = 0; pf < 2; pf++) {
                    if (pf) setenv("SKV_CUDA_MM_PREFETCH", "2", 1);
                    float *d[3];
                    for (int i = 0; i < 3; i++) d[i] = dev(NULL, sizeof(float) * len);
#ifdef SKV_CUSIM
                    cusim_counters_reset();
#endif
                    cu->matmul(gw.type, gw.data, rows, cols, dx + off, n, d[0], &ws);
                    cu->matmul_swiglu(gw.type, gw.data, gg.type, gg.data, rows, cols, dx + off, n, d[1], d[2], &ws);
#ifdef SKV_CUSIM
                    ran &= cusim_launches_of(pf ? "k_matmma_pf2<" : "k_matmma<") == 1 &&
                           cusim_launches_of(pf ? "k_matmma_swiglu_pf2<" : "k_matmma_swiglu<") == 1;
#endif
                    unsetenv("SKV_CUDA_MM_PREFETCH");
                    for (int i = 0; i < 3; i++) {
                        y[pf][i] = back(d[i], len);
                        cu->free(d[i]);
                    }
                }
                for (int i = 0; i < 2; i++) same &= !memcmp(y[0][i], y[1][i], sizeof(float) * len);
                for (int pf = 0; pf < 2; pf++)
                    for (int i = 0; i < 3; i++) free(y[pf][i]);
                cu->free(dx);
                free(x);
            }
            snprintf(op, sizeof op, "cuda matmma, two chunks loaded ahead (cols %d%s): matmul and matmul_swiglu "
                     "bit for bit one chunk ahead's, n = 9, 40, 64", cols, off ? ", x unaligned" : "");
            test_cond(op, same && ran);
            cu->weight_free(&gw); cu->weight_free(&gg);
            free(wb); free(wg);
        }
    }
    /* matmul_k: Q, K, V shapes in one launch (n <= 64), one BF16 rounding for all (n > 64) */
    {
        int rows[3] = {96, 33, 48}, cols = 128;
        skv_weight gw[3];
        uint16_t *wb[3];
        for (int i = 0; i < 3; i++) wb[i] = bf16_weights(rows[i], cols, &gw[i]);
        int ns[6] = {1, 3, 8, 12, 64, 65};
        for (int ni = 0; ni < 6; ni++) {
            int n = ns[ni];
            float *x = rnd((size_t)n * cols), *dx = dev(x, sizeof(float) * n * cols), *dy[3], *yc[3];
            for (int i = 0; i < 3; i++) {
                yc[i] = malloc(sizeof(float) * n * rows[i]);
                cpu->matmul(GGML_BF16, wb[i], rows[i], cols, x, n, yc[i], &ws);
                dy[i] = dev(NULL, sizeof(float) * n * rows[i]);
            }
            enum ggml_type t[3] = {GGML_BF16, GGML_BF16, GGML_BF16};
            const void *W[3] = {gw[0].data, gw[1].data, gw[2].data};
#ifdef SKV_CUSIM
            cusim_counters_reset();
#endif
            cu->matmul_k(3, t, W, rows, cols, dx, n, dy, &ws);
#ifdef SKV_CUSIM
            cusim_counters c;
            cusim_counters_get(&c);
            snprintf(op, sizeof op, "cuda matmul_k of 3, n=%d: %llu launches, %llu library calls (%s)", n,
                     (unsigned long long)c.launches, (unsigned long long)c.lib_calls,
                     n <= 8 ? "1 k_matvec and 0" : n <= 64 ? "1 k_matmma and 0" : "1 conversion, 3 GEMMs");
            test_cond(op, n <= 64 ? c.launches == 1 && c.lib_calls == 0 &&
                                        cusim_launches_of(n <= 8 ? "k_matvec" : "k_matmma") == 1
                                  : c.launches == 1 && c.lib_calls == 3);
#endif
            for (int i = 0; i < 3; i++) {
                float *yg = back(dy[i], (size_t)n * rows[i]);
                snprintf(op, sizeof op, "matmul_k bf16 n=%d matrix %d", n, i);
                cmp(op, yg, yc[i], (size_t)n * rows[i], n <= 64 ? 1e-5 : 1e-2);
                free(yg); free(yc[i]);
                cu->free(dy[i]);
            }
            cu->free(dx);
            free(x);
        }
        for (int i = 0; i < 3; i++) { cu->weight_free(&gw[i]); free(wb[i]); }
    }
    /* matmul_swiglu: gate and up rows in one warp task, silu(gate) * up */
    {
        int rows = 70, cols = 128;
        skv_weight gg, gu;
        uint16_t *wg = bf16_weights(rows, cols, &gg), *wu = bf16_weights(rows, cols, &gu);
        int ns[6] = {1, 4, 7, 10, 33, 65};
        for (int ni = 0; ni < 6; ni++) {
            int n = ns[ni];
            size_t len = (size_t)n * rows;
            float *x = rnd((size_t)n * cols), *gc = malloc(sizeof(float) * len), *uc = malloc(sizeof(float) * len);
            cpu->matmul_swiglu(GGML_BF16, wg, GGML_BF16, wu, rows, cols, x, n, gc, uc, &ws);
            float *dx = dev(x, sizeof(float) * n * cols), *dg = dev(NULL, sizeof(float) * len);
            float *du = dev(NULL, sizeof(float) * len);
#ifdef SKV_CUSIM
            cusim_counters_reset();
#endif
            cu->matmul_swiglu(gg.type, gg.data, gu.type, gu.data, rows, cols, dx, n, dg, du, &ws);
#ifdef SKV_CUSIM
            cusim_counters c;
            cusim_counters_get(&c);
            snprintf(op, sizeof op, "cuda matmul_swiglu n=%d: %llu launches (%s)", n, (unsigned long long)c.launches,
                     n <= 8 ? "one k_matvec_swiglu" : n <= 64 ? "one k_matmma_swiglu" : "conversion, GEMMs, swiglu");
            test_cond(op, n <= 64 ? c.launches == 1 && c.lib_calls == 0 &&
                                        cusim_launches_of(n <= 8 ? "k_matvec_swiglu" : "k_matmma_swiglu") == 1
                                  : c.launches == 2 && c.lib_calls == 2);
#endif
            float *yg = back(dg, len);
            snprintf(op, sizeof op, "matmul_swiglu bf16 n=%d", n);
            cmp(op, yg, gc, len, n <= 64 ? 1e-5 : 1e-2);
            cu->free(dx); cu->free(dg); cu->free(du);
            free(x); free(gc); free(uc); free(yg);
        }
        cu->weight_free(&gg); cu->weight_free(&gu);
        free(wg); free(wu);
    }
    /* add_rmsnorm, out apart and out == y */
    for (int alias = 0; alias < 2; alias++) {
        int n = 3, dim = 320;
        size_t len = (size_t)n * dim;
        float *x = rnd(len), *y = rnd(len), *w = rnd(dim), *oc = malloc(sizeof(float) * len);
        float *dx = dev(x, sizeof(float) * len), *dy = dev(y, sizeof(float) * len), *dw = dev(w, sizeof(float) * dim);
        float *dout = alias ? dy : dev(NULL, sizeof(float) * len);
        cpu->add_rmsnorm(x, y, oc, w, n, dim, 1e-5f);
        cu->add_rmsnorm(dx, dy, dout, dw, n, dim, 1e-5f);
        float *xg = back(dx, len), *og = back(dout, len);
        cmp(alias ? "add_rmsnorm x (out == y)" : "add_rmsnorm x", xg, x, len, 0);
        cmp(alias ? "add_rmsnorm out (out == y)" : "add_rmsnorm out", og, oc, len, 1e-6);
        cu->free(dx); cu->free(dy); cu->free(dw);
        if (!alias) cu->free(dout);
        free(x); free(y); free(w); free(oc); free(xg); free(og);
    }
    /* rope_qk: both pairings, partial rotation, k_pre, pos0 + i and a
     * position a row (more rows than one launch's positions: 2 launches) */
    for (int mode = 0; mode < 2; mode++)
        for (int per_row = 0; per_row < 2; per_row++) {
            int n = per_row ? 260 : 5, nh = 2, nkv = 1, hd = 16, pos0 = 1000;
            rope_params p = {.mode = mode ? ROPE_NEOX : ROPE_ADJACENT, .head_dim = hd, .rope_dim = 12, .theta = 500000};
            rope_ctx rc;
            rope_init(&rc, &p, NULL);
            int *pos = malloc(sizeof(int) * n);
            for (int i = 0; i < n; i++) pos[i] = (i * 7919) % 4000;
            size_t ql = (size_t)n * nh * hd, kl = (size_t)n * nkv * hd;
            float *q = rnd(ql), *k = rnd(kl), *kp = malloc(sizeof(float) * kl);
            float *dq = dev(q, sizeof(float) * ql), *dk = dev(k, sizeof(float) * kl), *dkp = dev(NULL, sizeof(float) * kl);
            cpu->rope_qk(&rc, q, nh, k, nkv, kp, n, pos0, per_row ? pos : NULL);
#ifdef SKV_CUSIM
            cusim_counters_reset();
#endif
            cu->rope_qk(&rc, dq, nh, dk, nkv, dkp, n, pos0, per_row ? pos : NULL);
#ifdef SKV_CUSIM
            snprintf(op, sizeof op, "cuda rope_qk of %d rows: %llu launches (%d)", n,
                     (unsigned long long)cusim_launches_of("k_rope_qk"), per_row ? 2 : 1);
            test_cond(op, cusim_launches_of("k_rope_qk") == (uint64_t)(per_row ? 2 : 1));
#endif
            float *qg = back(dq, ql), *kg = back(dk, kl), *kpg = back(dkp, kl);
            snprintf(op, sizeof op, "rope_qk %s %s q", mode ? "rotate-half" : "adjacent", per_row ? "pos[i]" : "pos0+i");
            cmp(op, qg, q, ql, 1e-6);
            snprintf(op, sizeof op, "rope_qk %s %s k", mode ? "rotate-half" : "adjacent", per_row ? "pos[i]" : "pos0+i");
            cmp(op, kg, k, kl, 1e-6);
            snprintf(op, sizeof op, "rope_qk %s %s k_pre", mode ? "rotate-half" : "adjacent", per_row ? "pos[i]" : "pos0+i");
            cmp(op, kpg, kp, kl, 0);
            cu->free(dq); cu->free(dk); cu->free(dkp);
            rope_free(&rc);
            free(pos); free(q); free(k); free(kp); free(qg); free(kg); free(kpg);
        }
#ifdef SKV_CUSIM
    /* A step's shape: ids up, ops queued, the result copied into host_alloc's
     * memory, one sync: one host wait in all; a sync with nothing queued
     * waits for nothing. */
    {
        int vocab = 40, dim = 64, n = 3;
        skv_weight gw;
        uint16_t *tb = bf16_weights(vocab, dim, &gw);
        int32_t ids[3] = {5, 39, 0};
        float *dx = dev(NULL, sizeof(float) * n * dim), *dl = dev(NULL, sizeof(float) * n * vocab);
        float *hl = cu->host_alloc(sizeof(float) * n * vocab), *xc = malloc(sizeof(float) * n * dim);
        float *lc = malloc(sizeof(float) * n * vocab);
        cu->sync();
        cusim_counters_reset();
        cu->embed(gw.type, gw.data, dim, ids, n, dx);
        cu->matmul(gw.type, gw.data, vocab, dim, dx, n, dl, &ws);
        cu->copy2d(hl, sizeof(float) * n * vocab, dl, sizeof(float) * n * vocab, sizeof(float) * n * vocab, 1);
        cu->sync();
        cusim_counters c1, c2;
        cusim_counters_get(&c1);
        cusim_counters_reset();
        cu->sync();
        cusim_counters_get(&c2);
        cpu->embed(GGML_BF16, tb, dim, ids, n, xc);
        cpu->matmul(GGML_BF16, tb, vocab, dim, xc, n, lc, &ws);
        snprintf(op, sizeof op, "cuda: embed, matmul, copy into pinned memory and sync wait once (%llu host syncs, "
                 "%llu blocking copies), a sync of idle streams not at all (%llu)", (unsigned long long)c1.host_syncs,
                 (unsigned long long)c1.blocking_copies, (unsigned long long)c2.host_syncs);
        test_cond(op, c1.host_syncs == 1 && c1.stream_syncs == 1 && c2.host_syncs == 0);
        cmp("logits of the step, from pinned memory after the one sync", hl, lc, (size_t)n * vocab, 1e-5);
        cu->weight_free(&gw);
        cu->free(dx); cu->free(dl);
        cu->host_free(hl);
        free(tb); free(xc); free(lc);
    }
#endif
    skv_workspace_free(&ws);
}

/* ShadowKV's end of prefill on the device: U packed to bf16 (pack_h), and
 * every KV head's candidate chunks gathered in one launch, rounded as they
 * are stored (landmarks into device rows in IEEE half, values into pinned
 * host memory in bf16, outliers in f32). */
static void t_prefill_end(void) {
    {
        static const float special[] = {
            0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, -65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e10f, -3e38f,
            INFINITY, -INFINITY, NAN, -NAN,
            0x1p-24f, -0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1.8p-24f, 0x1.4p-24f, 0x1p-26f, 0x1p-149f, -0x1p-149f,
            0x1.ff8p-15f, 0x1.ffcp-15f, 0x1p-14f, 0x1.ffep-15f,          /* around the smallest normal half */
            0x1.002p0f, 0x1.006p0f, 0x1.0021p0f, -0x1.002p0f, 0x1.ffdp15f, 0x1.ffep15f, /* ties to even, overflow edge */
        };
        size_t ns = sizeof special / sizeof special[0], n = ns + 5000;
        float *x = malloc(sizeof(float) * n);
        memcpy(x, special, sizeof special);
        for (size_t i = ns; i < n; i++) x[i] = ldexpf(frand(), (int)(i % 60) - 40); /* 2^-40 .. 2^19 */
        float *dx = dev(x, sizeof(float) * n);
        uint16_t *hc = malloc(sizeof(uint16_t) * n), *hg = malloc(sizeof(uint16_t) * n);
        uint16_t *dy = dev(NULL, sizeof(uint16_t) * n);
        for (int elt = SKV_ELT_BF16; elt <= SKV_ELT_F16; elt++) {
            int f16 = elt == SKV_ELT_F16;
            cpu->pack_h(x, n, hc, elt);
            cu->pack_h(dx, n, dy, elt);
            cu->download(hg, dy, sizeof(uint16_t) * n);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                float a = f16 ? 0 : km_bf16_to_f32(hg[i]), b = f16 ? 0 : km_bf16_to_f32(hc[i]);
                if (f16) {
                    vec_from_f16(&a, &hg[i], 1);
                    vec_from_f16(&b, &hc[i], 1);
                }
                /* NaN: a NaN (a device may give its canonical NaN's bits) */
                if (isnan(x[i]) ? !isnan(a) || !isnan(b) : hg[i] != hc[i]) bad++;
            }
            char msg[200];
            snprintf(msg, sizeof msg, "cuda pack_h %s: %zu of %zu values differ from the CPU's rounding bit for bit "
                     "(ties to even, subnormals, overflow to inf, ±0; NaN stays NaN)", f16 ? "f16" : "bf16", bad, n);
            test_cond(msg, bad == 0);
            float w[30];
            for (int i = 0; i < 30; i++) {
                if (f16) vec_from_f16(&w[i], &hc[i], 1);
                else w[i] = km_bf16_to_f32(hc[i]);
            }
            if (f16)
                test_cond("cuda pack_h: the CPU twin rounds as IEEE half (65520 to inf, 2^-25 to +0, 1+2^-11 to 1)",
                          isinf(w[7]) && w[17] == 0.0f && !signbit(w[17]) && w[28] == 1.0f && w[29] == 0x1.008p0f);
            else
                test_cond("cuda pack_h: the CPU twin rounds as bf16 (1+2^-11 and 1+3·2^-11 to 1, 65504 to 65536, 2^-149 "
                          "to 0, -3e38 finite, NaN quiet)",
                          w[28] == 1.0f && w[29] == 1.0f && w[4] == 65536.0f && w[22] == 0.0f && !isinf(w[10]) &&
                              hc[13] == 0x7fc0);
        }
        cu->free(dx); cu->free(dy);
        free(x); free(hc); free(hg);
    }
    /* landmarks (rows 1) into device rows in half, values (rows a chunk,
     * strided by the KV width) into pinned host memory in bf16, outliers
     * (the same rows) into device rows in f32 and in bf16 (ShadowKV's
     * attention rows), d not a multiple of 32 */
    for (int p3 = 0; p3 < 4; p3++) {
        static const int elts[4] = {SKV_ELT_F16, SKV_ELT_BF16, SKV_ELT_F32, SKV_ELT_BF16};
        int pass = p3 > 0, elt = elts[p3];
        size_t es = elt == SKV_ELT_F32 ? sizeof(float) : sizeof(uint16_t);
        int h = 3, nch = 57, nc = 41, d = pass ? 128 : 40, rows = pass ? 8 : 1, kvd = h * d;
        size_t src_row = pass ? (size_t)kvd : (size_t)d, src_head = pass ? (size_t)d : (size_t)nch * d;
        size_t dst_head = (size_t)(nc + 2) * rows * d; /* gaps between the heads' blocks stay untouched */
        size_t sl = pass ? (size_t)nch * rows * kvd : (size_t)h * nch * d, dl = (size_t)h * dst_head;
        float *src = rnd(sl);
        int *cand = malloc(sizeof(int) * h * nc);
        for (int kh = 0; kh < h; kh++) { /* increasing, runs of consecutive chunks, chunks left out */
            int j = 0;
            for (int i = 0; i < nc; i++) {
                j += (i * 7 + kh) % 5 == 0 ? 2 : 1;
                cand[kh * nc + i] = (j - 1) % nch;
            }
        }
        float *dsrc = dev(src, sizeof(float) * sl);
        int *dcand = dev(cand, sizeof(int) * h * nc);
        char *ref = malloc(es * dl), *out = malloc(es * dl), *init = malloc(es * dl);
        memset(init, 0xa5, es * dl); /* what the gaps keep */
        memcpy(ref, init, es * dl);
        cpu->sk_gather_chunks(src, src_row, src_head, cand, h, nc, rows, d, ref, dst_head, elt);
        void *dd = NULL, *hd = NULL;
        if (p3 == 1) {
            hd = cu->host_alloc(es * dl);
            memcpy(hd, init, es * dl);
            cu->sk_gather_chunks(dsrc, src_row, src_head, dcand, h, nc, rows, d, hd, dst_head, elt);
            cu->sync();
            memcpy(out, hd, es * dl);
        } else {
            dd = dev(init, es * dl);
            cu->sk_gather_chunks(dsrc, src_row, src_head, dcand, h, nc, rows, d, dd, dst_head, elt);
            cu->download(out, dd, es * dl);
        }
        free(init);
        test_cond(p3 == 3 ? "cuda sk_gather_chunks: a head's outlier rows (chunks of 8) into device rows in bf16, "
                            "bit for bit"
                  : elt == SKV_ELT_BF16 ? "cuda sk_gather_chunks: a layer's candidate values into pinned memory in bf16, "
                                          "bit for bit"
                  : elt == SKV_ELT_F16 ? "cuda sk_gather_chunks: a layer's candidate landmarks into device rows in "
                                         "half, bit for bit"
                                       : "cuda sk_gather_chunks: a head's outlier rows into device rows in f32, bit "
                                         "for bit",
                  !memcmp(out, ref, es * dl));
        if (hd) cu->host_free(hd);
        cu->free(dd); cu->free(dsrc); cu->free(dcand);
        free(src); free(cand); free(ref); free(out);
    }
}

/* Pinned blocks: a freed block (of a MiB or more: an offload store) is
 * reused by the next allocation of its size (pinned once), but not while
 * queued work still reads it. */
static void t_pinned_pool(void) {
    size_t n = (size_t)1 << 19, nv = 2 * n; /* n floats' bytes: nv bf16 values */
    uint16_t *a = cu->host_alloc_raw(sizeof(float) * n);
    SKV_ASSERT(a);
    for (size_t i = 0; i < nv; i++) a[i] = km_f32_to_bf16((float)(i % 128) + 0.5f); /* exact in bf16 */
    float *dd = dev(NULL, sizeof(float) * nv);
    int idx = 0;
    size_t off = 0;
    cu->gather(a, 64, (int)nv / 64, &idx, 1, dd, SKV_ELT_F32, &off, (int)nv / 64); /* reads a on the fetch stream */
    cu->host_free(a);
    float *b = cu->host_alloc(sizeof(float) * n); /* zeroed: a only once the gather is done */
    float *g = back(dd, nv);
    size_t bad = 0;
    for (size_t i = 0; i < nv; i++) bad += g[i] != (float)(i % 128) + 0.5f;
    test_cond("cuda host_free: a pinned block queued work reads is not handed out (and zeroed) before it ran",
              bad == 0);
    size_t nz = 0;
    for (size_t i = 0; i < n; i++) nz += b[i] != 0.0f;
    cu->host_free(b);
    cu->sync();
    float *c = cu->host_alloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) nz += c[i] != 0.0f;
    char msg[200];
    snprintf(msg, sizeof msg, "cuda host_alloc: a freed block of the same size is reused (pinned once: %s), zeroed "
             "(%zu nonzero)", (void *)c == (void *)a || c == b ? "yes" : "no", nz);
    test_cond(msg, ((void *)c == (void *)a || c == b) && nz == 0);
    cu->host_free(c);
    cu->free(dd);
    free(g);
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
    t_flash_prefill();
    t_decode_batch();
    t_sparse();
    t_prefill_end();
    t_pinned_pool();
    t_fused();
    t_gather_unaligned();
    t_sk_step();
    t_forward_fused();
    t_timeline();
    return test_report("test_cuda_ops");
}
