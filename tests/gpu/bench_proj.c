/* bench_proj: a decode step's projections of one layer on the CUDA backend,
 * timed at each batch: q/k/v (matmul_k of 3), o, gate and up with SwiGLU
 * (matmul_swiglu), down, on random BF16 weights of the Llama-3.1-8B shape
 * (or --dim, --kv, --ffn). A line a batch:
 *     proj n=N path=P qkv_us= o_us= gate_up_us= down_us= layer_us= weight_GBps=
 * each the median of --reps timed runs: an op alone, then the layer's four
 * back to back (launches overlapping, as in a step), a sync after each run
 * and the L2 emptied before it (a matvec over --flush-mib, default 128 MiB,
 * not timed), so no weight is read from the cache; weight_GBps is the layer's weight bytes
 * over layer_us. The path is the backend's kernel for
 * n rows: k_matvec up to 8, k_matmma up to 64, cuBLAS past; --cublas sets
 * SKV_CUDA_GEMM_ROWS=0, which sends every batch to cuBLAS, so two runs, one
 * with --cublas, set the backend's kernels beside cuBLAS on the same shapes
 * (tests/gpu/run.sh's proj-bench step). --prefetch 2 sets
 * SKV_CUDA_MM_PREFETCH=2: k_matmma loads two chunks of weights ahead
 * (path=k_matmma_pf2), so a third run sets that beside the default. Without a
 * usable CUDA device it says why and exits 0, as the op tests skip. */
#include "backend.h"
#include "quant.h"
#include "skv.h"
#include "testhelp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const skv_backend *cu;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { return test_frand(&rng); }

static int load(int rows, int cols, skv_weight *w) {
    size_t n = (size_t)rows * cols;
    uint16_t *h = malloc(sizeof(uint16_t) * (n ? n : 1));
    if (!h) return -1;
    for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(frand() * 0.03f);
    int rc = cu->weight_load(GGML_BF16, h, rows, cols, w);
    free(h);
    return rc;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* a positive int from s, or -1 */
static int pos_int(const char *s) {
    char *e;
    long v = strtol(s, &e, 10);
    return *s && !*e && v > 0 && v <= 1 << 20 ? (int)v : -1;
}

int main(int argc, char **argv) {
    int dim = 4096, kv = 1024, ffn = 14336, reps = 20, flush_mib = 128;
    int ns[32] = {1, 4, 8, 9, 16, 32, 64}, nn = 7, cublas = 0, pf2 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cublas")) {
            cublas = 1;
            continue;
        }
        if (!strcmp(argv[i], "--prefetch") && i + 1 < argc && !strcmp(argv[i + 1], "2")) {
            pf2 = 1;
            i++;
            continue;
        }
        int *dst = !strcmp(argv[i], "--dim")    ? &dim
                   : !strcmp(argv[i], "--kv")   ? &kv
                   : !strcmp(argv[i], "--ffn")  ? &ffn
                   : !strcmp(argv[i], "--reps") ? &reps
                   : !strcmp(argv[i], "--flush-mib") ? &flush_mib
                                                : NULL;
        if (dst && i + 1 < argc && (*dst = pos_int(argv[i + 1])) > 0) {
            i++;
            continue;
        }
        if (!strcmp(argv[i], "--n") && i + 1 < argc) {
            int ok = 1;
            nn = 0;
            for (char *p = argv[i + 1], *tok; ok && (tok = strtok(p, ",")); p = NULL) {
                int n = pos_int(tok);
                ok = nn < 32 && n > 0 && n <= 4096;
                if (ok) ns[nn++] = n;
            }
            if (ok && nn > 0) {
                i++;
                continue;
            }
        }
        fprintf(stderr, "bench_proj: bad argument '%s' (--dim D --kv K --ffn F --reps R --n N,N,... --flush-mib M --cublas --prefetch 2)\n",
                argv[i]);
        return 2;
    }
    /* read by the backend at its first projection */
    if ((cublas && setenv("SKV_CUDA_GEMM_ROWS", "0", 1)) || (pf2 && setenv("SKV_CUDA_MM_PREFETCH", "2", 1))) {
        printf("bench_proj: setenv failed\n");
        return 1;
    }
    cu = skv_backend_find("cuda");
    char why[256] = "";
    if (!cu || !cu->available(why, sizeof why)) {
        printf("bench_proj: no CUDA device: %s\n", cu ? why : "this build has no CUDA backend");
        return 0;
    }
    skv_weight wq, wk, wv, wo, wg, wu, wd, wf;
    int frows = (int)(((size_t)flush_mib << 20) / 2 / (size_t)dim); /* the L2 flush: BF16 rows */
    if (frows < 1) frows = 1;
    if (load(dim, dim, &wq) || load(kv, dim, &wk) || load(kv, dim, &wv) || load(dim, dim, &wo) ||
        load(ffn, dim, &wg) || load(ffn, dim, &wu) || load(dim, ffn, &wd) || load(frows, dim, &wf)) {
        printf("bench_proj: the weights do not load: %s\n", skv_last_error());
        return 1;
    }
    double wbytes = 2.0 * ((double)dim * dim * 2 + 2.0 * kv * dim + 3.0 * ffn * dim);
    int nmax = 0;
    for (int i = 0; i < nn; i++) nmax = ns[i] > nmax ? ns[i] : nmax;
    size_t xs = (size_t)nmax * (ffn > dim ? ffn : dim);
    float *hx = malloc(sizeof(float) * xs);
    float *x = cu->alloc(sizeof(float) * xs), *q = cu->alloc(sizeof(float) * nmax * dim);
    float *k = cu->alloc(sizeof(float) * nmax * kv), *v = cu->alloc(sizeof(float) * nmax * kv);
    float *o = cu->alloc(sizeof(float) * nmax * dim), *g = cu->alloc(sizeof(float) * nmax * ffn);
    float *u = cu->alloc(sizeof(float) * nmax * ffn), *f = cu->alloc(sizeof(float) * frows);
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!hx || !x || !q || !k || !v || !o || !g || !u || !f || !t) {
        printf("bench_proj: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < xs; i++) hx[i] = frand();
    cu->upload(x, hx, sizeof(float) * xs);
    skv_workspace ws = {0};
    for (int i = 0; i < nn; i++) {
        int n = ns[i];
        double med[5]; /* the four ops, then the layer */
        for (int op = 0; op < 5; op++) {
            for (int r = -3; r < reps; r++) { /* 3 warm-up rounds */
                /* the L2 emptied first (the o weights, 32 MiB, would stay in
                 * a 50 MiB L2 from the call before): one matvec over a
                 * --flush-mib matrix (128 MiB), outside the time */
                cu->matmul(wf.type, wf.data, frows, dim, x, 1, f, &ws);
                cu->sync();
                double t0 = now_us();
                if (op == 0 || op == 4) {
                    enum ggml_type ty[3] = {wq.type, wk.type, wv.type};
                    const void *W[3] = {wq.data, wk.data, wv.data};
                    int rows[3] = {dim, kv, kv};
                    float *y[3] = {q, k, v};
                    cu->matmul_k(3, ty, W, rows, dim, x, n, y, &ws);
                }
                if (op == 1 || op == 4) cu->matmul(wo.type, wo.data, dim, dim, x, n, o, &ws);
                if (op == 2 || op == 4) cu->matmul_swiglu(wg.type, wg.data, wu.type, wu.data, ffn, dim, x, n, g, u, &ws);
                if (op == 3 || op == 4) cu->matmul(wd.type, wd.data, dim, ffn, x, n, o, &ws);
                cu->sync();
                if (r >= 0) t[r] = now_us() - t0;
            }
            qsort(t, (size_t)reps, sizeof *t, cmp_d);
            med[op] = t[reps / 2];
        }
        printf("proj n=%d path=%s qkv_us=%.1f o_us=%.1f gate_up_us=%.1f down_us=%.1f layer_us=%.1f weight_GBps=%.0f\n",
               n, cublas || n > 64 ? "cublas" : n <= 8 ? "k_matvec" : pf2 ? "k_matmma_pf2" : "k_matmma", med[0], med[1],
               med[2], med[3], med[4],
               wbytes / (med[4] * 1e3));
        fflush(stdout);
    }
    skv_workspace_free(&ws);
    cu->free(x); cu->free(q); cu->free(k); cu->free(v); cu->free(o); cu->free(g); cu->free(u); cu->free(f);
    skv_weight *all[8] = {&wq, &wk, &wv, &wo, &wg, &wu, &wd, &wf};
    for (int i = 0; i < 8; i++) cu->weight_free(all[i]);
    free(hx);
    free(t);
    return 0;
}
