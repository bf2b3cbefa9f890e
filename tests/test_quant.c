/* test_quant: ggml block formats against the shared models and random data.
 *
 * (a) every 2-D tensor of the f16/bf16/q8_0/q6_k/q4_k_m/q4_0 files, dequantized,
 *     against the same tensor of the f32 file (relative L2 bounds per type), and
 *     the reference quantizers reproduce llama-quantize's bytes;
 * (b) quant_matvec against dequantize + a double dot product (bounds that
 *     allow for the 8-bit activations of the quantized types), quant_dot and
 *     the scalar quant_matvec_ref giving the same bits, and the edge cases of
 *     quantizing x (zeros, vanishing values, inf and nan, long rows);
 * (c) quantize -> dequantize round trips on random data;
 * (d) fp16 / bf16 conversions on edge values and exhaustively. */
#include "gguf.h"
#include "quant.h"
#include "skv.h"
#include "testhelp.h"

#include <stdint.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

/* The types under test and their relative L2 bounds: dequantized file vs the
 * f32 file (a), a round trip of Gaussian data (c), and quant_matvec against
 * the exact product of the stored weights (b), where the quantized types lose
 * what quantizing x to 8 bits per block of 32 costs (more when a few
 * elements dwarf the rest, and noisily so on the few-row shapes). Measured
 * figures are printed; the bounds leave headroom of about 1.5-2x. */
typedef struct {
    enum ggml_type t;
    double file_bound, trip_bound;
    double matvec_bound[2]; /* uniform x, x with outliers */
} type_case;
static const type_case cases[] = {
    {GGML_F32, 0, 0, {1e-5, 1e-5}},
    {GGML_F16, 1e-3, 1e-3, {1e-5, 1e-5}},
    {GGML_BF16, 5e-3, 5e-3, {1e-5, 1e-5}},
    {GGML_Q8_0, 1e-2, 1e-2, {1e-2, 4e-2}},
    {GGML_Q6_K, 2e-2, 2.5e-2, {1.2e-2, 4e-2}}, /* our q6_K quantizer is plain round-to-nearest */
    {GGML_Q5_0, 5e-2, 5e-2, {1.5e-2, 4e-2}},
    {GGML_Q4_K, 1.2e-1, 1.2e-1, {1.2e-2, 4e-2}},
    {GGML_Q4_0, 1.2e-1, 1.2e-1, {1.5e-2, 4e-2}},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static int case_of(enum ggml_type t) {
    for (size_t i = 0; i < N_CASES; i++)
        if (cases[i].t == t) return (int)i;
    return -1;
}

/* Deterministic uniform [0,1) and roughly Gaussian numbers. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1p-53;
}
static float grand(void) {
    double s = 0;
    for (int i = 0; i < 12; i++) s += urand();
    return (float)(s - 6);
}

/* Dequantized copy of a whole tensor, (rows, ne[0]) fp32; caller frees. */
static float *dequant_tensor(const gguf_tensor *t, size_t *rows_out) {
    size_t rows = (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
    float *out = malloc(rows * t->ne[0] * sizeof(float));
    if (out) quant_dequant_rows(t->type, t->data, t->ne[0], 0, rows, out);
    *rows_out = rows;
    return out;
}

/* One tensor of each type, kept for the matvec test: (rows, n) of type t. */
typedef struct { gguf_file *file; const gguf_tensor *t; } sample;
static sample samples[N_CASES];

static double file_err[N_CASES];
static int seen[N_CASES];

/* (a) Compares every 2-D tensor of file rel with the f32 reference. */
static void check_file(const gguf_file *ref, const char *rel) {
    const char *path = test_shared(rel);
    char msg[256];
    if (!path) {
        snprintf(msg, sizeof msg, "test_quant: %s missing", rel);
        test_skip(msg);
        return;
    }
    gguf_file *f;
    int rc = gguf_open(path, &f);
    snprintf(msg, sizeof msg, "%s opens", rel);
    test_cond(msg, rc == 0);
    if (rc) { printf("  %s\n", skv_last_error()); return; }
    int n2d = 0, bad = 0, kept = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (t->n_dims != 2) continue;
        n2d++;
        int c = case_of(t->type);
        const gguf_tensor *r = gguf_find_tensor(ref, t->name);
        if (c < 0 || !r || r->type != GGML_F32 || r->ne[0] != t->ne[0] || r->ne[1] != t->ne[1]) {
            printf("  %s: %s (%s) has no f32 twin or an unexpected type\n", rel, t->name, ggml_type_name(t->type));
            bad++;
            continue;
        }
        size_t rows, rrows;
        float *a = dequant_tensor(t, &rows), *b = dequant_tensor(r, &rrows);
        if (!a || !b) { free(a); free(b); bad++; continue; }
        double e = test_rel_l2(a, b, rows * t->ne[0]);
        if (e > file_err[c]) file_err[c] = e;
        if (e > cases[c].file_bound) {
            printf("  %s: %s (%s) relative L2 %.3g over the bound %.3g\n", rel, t->name,
                   ggml_type_name(t->type), e, cases[c].file_bound);
            bad++;
        }
        seen[c] = 1;
        if (!samples[c].t) { samples[c].t = t; samples[c].file = f; kept = 1; }
        free(a);
        free(b);
    }
    snprintf(msg, sizeof msg, "%s: %d 2-D tensors dequantize close to f32", rel, n2d);
    test_cond(msg, n2d > 0 && bad == 0);
    if (!kept) gguf_close(f);
}

/* 1 if byte k of a q8_0 row differs from ours only because the file rounded an
 * exact half to even (gguf-py's numpy quantizer) where ggml rounds it away
 * from zero. */
static int q8_0_tie(const float *x, const uint8_t *mine, const uint8_t *file, size_t k) {
    size_t blk = k / 34, j = k % 34;
    if (j < 2 || memcmp(mine + blk * 34, file + blk * 34, 2)) return 0;
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[blk * 32 + i]));
    float v = x[blk * 32 + j - 2] * (1.0f / (amax / 127));
    int a = (int8_t)mine[k], b = (int8_t)file[k];
    return v - truncf(v) == (v < 0 ? -0.5f : 0.5f) && abs(a - b) == 1 && fabsf((float)b - v) == 0.5f;
}

/* Bytes of tensor name in file rel that differ from quantizing its f32 twin
 * with quant_quantize_row (q8_0 rounding ties counted apart in *ties); -1 when
 * the file is absent. */
static long requant_mismatch(const gguf_file *ref, const char *rel, const char *name, enum ggml_type *type,
                             long *ties) {
    const char *path = test_shared(rel);
    gguf_file *f;
    if (!path || gguf_open(path, &f)) return -1;
    const gguf_tensor *t = gguf_find_tensor(f, name), *r = gguf_find_tensor(ref, name);
    long diff = -1;
    if (t && r && t->ne[0] == r->ne[0] && t->ne[1] == r->ne[1]) {
        *type = t->type;
        size_t n = t->ne[0], rows = (size_t)t->ne[1], rs = ggml_row_size(t->type, n);
        uint8_t *q = malloc(rs);
        float *x = malloc(n * sizeof(float));
        diff = 0;
        for (size_t row = 0; q && x && row < rows; row++) {
            quant_dequant_row(GGML_F32, (const uint8_t *)r->data + row * n * 4, x, n);
            if (quant_quantize_row(t->type, x, q, n)) { diff = -2; break; }
            const uint8_t *p = (const uint8_t *)t->data + row * rs;
            for (size_t k = 0; k < rs; k++)
                if (q[k] != p[k]) {
                    if (t->type == GGML_Q8_0 && q8_0_tie(x, q, p, k)) (*ties)++;
                    else diff++;
                }
        }
        free(q);
        free(x);
    }
    gguf_close(f);
    return diff;
}

/* (b) quant_matvec on a (rows, n) matrix W of type t and activations x,
 * against a double dot product of the dequantized rows: the relative L2 error
 * over y, and whether quant_dot gives y's bits row by row and the scalar
 * quant_matvec_ref gives them too (quantized types) or lands within 1e-5 of
 * y (fp types, whose SIMD sums in another order). */
typedef struct { double err; int same_dot, same_ref; } mv_check;
static mv_check matvec_check(enum ggml_type t, const void *W, size_t rows, size_t n, const float *x) {
    float *y = malloc(rows * sizeof(float)), *yr = malloc(rows * sizeof(float));
    float *wr = malloc(n * sizeof(float));
    mv_check c = {1, 0, 0};
    if (y && yr && wr) {
        quant_matvec(t, W, rows, n, x, y);
        quant_matvec_ref(t, W, rows, n, x, yr);
        double num = 0, den = 0;
        size_t rs = ggml_row_size(t, n);
        c.same_dot = 1;
        for (size_t r = 0; r < rows; r++) {
            quant_dequant_row(t, (const uint8_t *)W + r * rs, wr, n);
            double s = 0;
            for (size_t j = 0; j < n; j++) s += (double)wr[j] * x[j];
            num += (y[r] - s) * (y[r] - s);
            den += s * s;
            float yd = quant_dot(t, (const uint8_t *)W + r * rs, x, n);
            c.same_dot &= memcmp(&yd, &y[r], sizeof yd) == 0;
        }
        c.err = den > 0 ? sqrt(num / den) : sqrt(num);
        c.same_ref = ggml_blck_size(t) == 1 ? test_rel_l2(yr, y, rows) <= 1e-5
                                            : memcmp(y, yr, rows * sizeof(float)) == 0;
    }
    free(y); free(yr); free(wr);
    return c;
}

/* Activations: uniform in [-1, 1), or (outliers) Gaussian with one element
 * in 64 scaled by 20, as in the residual stream of a transformer. */
static void random_x(float *x, size_t n, int outliers) {
    for (size_t j = 0; j < n; j++)
        x[j] = outliers ? grand() * (urand() < 1.0 / 64 ? 20 : 1) : (float)(2 * urand() - 1);
}

/* Random (rows, n) matrix quantized to t with quant_quantize_row; caller frees. */
static void *random_matrix(enum ggml_type t, size_t rows, size_t n) {
    size_t rs = ggml_row_size(t, n);
    uint8_t *W = malloc(rows * rs);
    float *x = malloc(n * sizeof(float));
    if (W && x)
        for (size_t r = 0; r < rows; r++) {
            for (size_t j = 0; j < n; j++) x[j] = grand();
            quant_quantize_row(t, x, W + r * rs, n);
        }
    free(x);
    return W;
}

/* Runs matvec_check and reports it as one line; outliers picks the bound. */
static void check_matvec(size_t c, const void *W, size_t rows, size_t n, const float *x, int outliers,
                         const char *what, double *worst) {
    enum ggml_type t = cases[c].t;
    char msg[320];
    mv_check k = W ? matvec_check(t, W, rows, n, x) : (mv_check){1, 0, 0};
    if (k.err > worst[outliers]) worst[outliers] = k.err;
    double bound = cases[c].matvec_bound[outliers];
    snprintf(msg, sizeof msg, "matvec %s on %s %zu x %zu: rel err %.2g < %.2g, quant_dot same, ref %s",
             ggml_type_name(t), what, rows, n, k.err, bound,
             ggml_blck_size(t) == 1 ? "within 1e-5" : "bit-identical");
    test_cond(msg, k.err < bound && k.same_dot && k.same_ref);
}

static void test_matvec(void) {
    const size_t nmax = 16640;  /* past quant.c's 8192-element stack buffer for x */
    float *x = malloc(nmax * sizeof(float));
    if (!x) { test_cond("matvec buffers", 0); return; }
    double worst[N_CASES][2] = {{0}};
    for (size_t c = 0; c < N_CASES; c++) {
        enum ggml_type t = cases[c].t;
        if (samples[c].t) {
            const gguf_tensor *s = samples[c].t;
            for (int o = 0; o < 2; o++) {
                random_x(x, (size_t)s->ne[0], o);
                check_matvec(c, s->data, (size_t)s->ne[1], (size_t)s->ne[0], x, o,
                             o ? "outlier x, model tensor" : "model tensor", worst[c]);
            }
        }
        /* Synthetic shapes: odd block counts, ragged fp tails, long rows (one
         * of an odd number of 32-blocks past the stack buffer). Their inputs
         * come from a generator reseeded per type, so they are the same
         * whether or not ../shared supplied model tensors above. */
        rng_state = 0x9e3779b97f4a7c15ull ^ (0x100000001b3ull * (c + 1));
        size_t blck = ggml_blck_size(t);
        size_t shapes[6][2] = {{7, blck == 1 ? 37 : blck * 3}, {33, blck == 1 ? 8 : blck}, {300, blck * 8},
                               {65, blck * (blck == 1 ? 1000 : 1024 / blck + 3)}, {24, nmax},
                               {24, blck == 1 ? 8201 : blck == 32 ? 8224 : 8448}};
        for (int k = 0; k < 6; k++)
            for (int o = 0; o < 2; o++) {
                void *W = random_matrix(t, shapes[k][0], shapes[k][1]);
                random_x(x, shapes[k][1], o);
                check_matvec(c, W, shapes[k][0], shapes[k][1], x, o, o ? "outlier x, random" : "random", worst[c]);
                free(W);
            }
    }
    printf("  measured matvec relative L2 error (worst case, uniform / outlier x):");
    for (size_t c = 0; c < N_CASES; c++) printf(" %s %.2g/%.2g", ggml_type_name(cases[c].t), worst[c][0], worst[c][1]);
    printf("\n");

    /* Edge cases of the 8-bit activations, per quantized type. */
    for (size_t c = 0; c < N_CASES; c++) {
        enum ggml_type t = cases[c].t;
        if (ggml_blck_size(t) == 1) continue;
        const size_t rows = 5, n = 512;
        void *W = random_matrix(t, rows, n);
        float y[5], yr[5];
        int zero = 1, tiny = 1, inf = 1, nan = 1;
        memset(x, 0, n * sizeof(float));
        quant_matvec(t, W, rows, n, x, y);
        for (size_t r = 0; r < rows; r++) zero &= y[r] == 0;
        for (size_t j = 0; j < n; j++) x[j] = (j % 3 ? 1e-39f : -2e-45f) * (j < 256 ? 1 : 1e-6f);
        quant_matvec(t, W, rows, n, x, y);
        quant_matvec_ref(t, W, rows, n, x, yr);
        for (size_t r = 0; r < rows; r++) tiny &= isfinite(y[r]) && fabsf(y[r]) < 1e-30f && y[r] == yr[r];
        random_x(x, n, 0);
        x[300] = INFINITY;
        quant_matvec(t, W, rows, n, x, y);
        quant_matvec_ref(t, W, rows, n, x, yr);
        for (size_t r = 0; r < rows; r++) inf &= isnan(y[r]) && isnan(yr[r]);
        x[300] = 0;
        x[7] = NAN;
        quant_matvec(t, W, rows, n, x, y);
        for (size_t r = 0; r < rows; r++) nan &= isnan(y[r]);
        char msg[256];
        snprintf(msg, sizeof msg, "matvec %s: zero x gives 0, subnormal x stays finite and tiny, "
                 "an inf or nan in x gives nan", ggml_type_name(t));
        test_cond(msg, W && zero && tiny && inf && nan);
        free(W);
    }
    free(x);
}

/* (c) */
/* quant_matvec_rows: m vectors against one matrix at once, each row of the
 * result bit for bit quant_matvec of its vector (a batched decode step reads
 * the weights once and must decode as each sequence alone).
 *
 * Where the build has the two-row AVX2 kernel (q8_0, q4_0, q5_0 without the
 * AVX-512 VNNI kernels) that comparison sets two kernels against each other.
 * Where it is compiled out, quant_matvec_rows runs quant_matvec's own kernel
 * and the comparison checks only the rows' layout; so every type is also
 * checked against references that share no code with the kernels under test:
 * the scalar quant_matvec_ref (bit for bit for the quantized types, whose
 * kernels all sum in one order; within 1e-5 relative for the fp types, whose
 * SIMD sums in another order), and a plain double-precision dot product of
 * the dequantized row, within rows_bound(). */

/* The most |y[r] - sum_j w[j] x[j]| may be for one row w (n, dequantized)
 * and x, from what the kernels do on purpose plus fp32 rounding:
 *  - the quantized types (quant) quantize x to int8 codes per block of 32,
 *    q = round(x * 127/amax), with the scale dx = amax/127 stored rounded to
 *    fp16: |x - q dx| <= dx/2 for the rounding to a code, plus |q| <= 127
 *    times the fp16 rounding of dx (<= dx 2^-11), i.e. at most
 *    (0.5 + 127 * 2^-11) dx = 0.562 dx, taken as 0.57 dx, times sum |w| of
 *    the block's 32 weights;
 *  - fp32 arithmetic: each term rounded a few times and summed over at most
 *    n terms in some order, |error| <= gamma_(n+8) sum |terms| with
 *    gamma_k ~ k 2^-24 (the textbook bound for a sum of k rounded terms),
 *    taken 4x over for the quantized types, where the kernel scales a block
 *    by (weight scale * dx) while the dequantized weight rounds
 *    (scale * code) on its own, and q4_K subtracts its min term separately;
 *    |terms| <= |w| (|x| + dx).
 * A kernel that mixes up a block, a scale or a row misses by whole terms,
 * far outside this. */
static double rows_bound(const float *w, const float *x, size_t n, int quant) {
    double b = 0, terms = 0;
    for (size_t j0 = 0; j0 < n; j0 += 32) {
        size_t j1 = j0 + 32 < n ? j0 + 32 : n;
        double amax = 0, sw = 0;
        for (size_t j = j0; j < j1; j++) {
            amax = fmax(amax, fabs(x[j]));
            sw += fabs(w[j]);
        }
        double dx = quant ? amax / 127 : 0;
        b += 0.57 * dx * sw;
        for (size_t j = j0; j < j1; j++) terms += fabs(w[j]) * (fabs(x[j]) + dx);
    }
    return b + (quant ? 4 : 1) * (double)(n + 8) * 0x1p-24 * terms;
}

static void test_matvec_rows(void) {
    int same = 1, same_ref = 1, in_bound = 1;
    double worst = 0; /* the largest |y - exact| / bound seen */
    static float y[QUANT_ROWS_MAX * 97];
    char info[512];
    int ni = snprintf(info, sizeof info, "INFO quant_matvec_rows' kernels:"), paired = 0;
    for (size_t c = 0; c < N_CASES && ni > 0 && (size_t)ni < sizeof info; c++) {
        const char *k = quant_rows_kernel(cases[c].t);
        paired |= !strcmp(k, "two-row AVX2");
        ni += snprintf(info + ni, sizeof info - (size_t)ni, "%s %s %s", c ? "," : "", ggml_type_name(cases[c].t), k);
    }
    printf("%s; %s\n", info, paired ? "the two-row kernel compared with the one-row one, bit for bit"
                                    : "no two-row kernel in this build: each compared with scalar references");
    /* 5 and 64 vectors (odd and even: the 32-block types take two at a
     * time), rows of 20 and of 19 blocks (the kernels' tail of 4) */
    for (int pass = 0; pass < 2; pass++)
        for (size_t c = 0; c < N_CASES; c++) {
            enum ggml_type t = cases[c].t;
            size_t blck = ggml_blck_size(t), rows = 97;
            size_t n = blck == 1 ? 600 : blck * (blck == 32 ? (pass ? 19 : 20) : 3);
            size_t rs = ggml_row_size(t, n);
            int M = pass ? QUANT_ROWS_MAX : 5, quant = blck > 1;
            uint8_t *W = random_matrix(t, rows, n);
            float *x = malloc(sizeof(float) * (size_t)M * n), *wr = malloc(sizeof(float) * n), one[97], ref[97];
            if (!W || !x || !wr) { same = 0; free(W); free(x); free(wr); continue; }
            for (int j = 0; j < M; j++) random_x(x + (size_t)j * n, n, j & 1);
            quant_matvec_rows(t, W, rows, n, x, M, y);
            for (int j = 0; j < M; j++) {
                const float *xj = x + (size_t)j * n, *yj = y + (size_t)j * rows;
                quant_matvec(t, W, rows, n, xj, one);
                same &= !memcmp(one, yj, sizeof one);
                quant_matvec_ref(t, W, rows, n, xj, ref);
                same_ref &= quant ? !memcmp(ref, yj, sizeof ref) : test_rel_l2(yj, ref, rows) <= 1e-5;
                for (size_t r = 0; r < rows; r++) {
                    quant_dequant_row(t, W + r * rs, wr, n);
                    double exact = 0;
                    for (size_t i = 0; i < n; i++) exact += (double)wr[i] * xj[i];
                    double e = fabs(yj[r] - exact), b = rows_bound(wr, xj, n, quant);
                    in_bound &= e <= b;
                    if (b > 0 && e / b > worst) worst = e / b;
                }
            }
            free(x);
            free(wr);
            free(W);
        }
    test_cond("quant_matvec_rows of 5 and of 64 vectors equals quant_matvec of each, bit for bit, every type", same);
    test_cond("... and the scalar quant_matvec_ref of each (bit for bit for the quantized types, 1e-5 for fp)", same_ref);
    printf("INFO quant_matvec_rows against a double dot of the dequantized rows: worst error %.3g of its bound\n", worst);
    test_cond("... and a double-precision dot of the dequantized rows, every row within its error bound", in_bound);
}

static void test_roundtrip(void) {
    const size_t n = 8192;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    uint8_t *q = malloc(n * 4);
    char msg[256];
    if (!x || !y || !q) { free(x); free(y); free(q); test_cond("round trip buffers", 0); return; }
    for (size_t i = 0; i < n; i++) x[i] = grand() * (i % 512 < 256 ? 1.0f : 0.01f);
    for (size_t c = 0; c < N_CASES; c++) {
        enum ggml_type t = cases[c].t;
        int rc = quant_quantize_row(t, x, q, n);
        quant_dequant_row(t, q, y, n);
        double e = test_rel_l2(y, x, n);
        snprintf(msg, sizeof msg, "round trip %s: rel L2 %.3g <= %.3g", ggml_type_name(t), e, cases[c].trip_bound);
        test_cond(msg, rc == 0 && e <= cases[c].trip_bound);
    }
    /* A block of zeros, and one with a single non-zero, stay exact. */
    for (size_t c = 0; c < N_CASES; c++) {
        enum ggml_type t = cases[c].t;
        memset(x, 0, 256 * sizeof(float));
        x[5] = -3.0f;
        int rc = quant_quantize_row(t, x, q, 256);
        quant_dequant_row(t, q, y, 256);
        int ok = rc == 0;
        for (int i = 0; i < 256; i++) ok &= fabsf(y[i] - x[i]) <= 3e-3f;
        snprintf(msg, sizeof msg, "round trip %s of a lone -3 among zeros", ggml_type_name(t));
        test_cond(msg, ok);
    }
    test_cond("q4_1 has no quantizer", quant_quantize_row(GGML_Q4_1, x, q, 32) == SKV_EUNSUPPORTED);
    test_cond("q2_K has no quantizer", quant_quantize_row(GGML_Q2_K, x, q, 256) == SKV_EUNSUPPORTED);
    test_cond("q8_0 rejects a partial block", quant_quantize_row(GGML_Q8_0, x, q, 33) == SKV_EINVAL);
    int sup = 1;
    for (size_t c = 0; c < N_CASES; c++) sup &= quant_supported(cases[c].t);
    test_cond("quant_supported: the 8 types", sup);
    test_cond("quant_supported: not q4_1, q5_K, i32", !quant_supported(GGML_Q4_1) && !quant_supported(GGML_Q5_K) &&
                                                          !quant_supported(GGML_I32));
    free(x); free(y); free(q);
}

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* (d) */
static void test_conversions(void) {
    /* fp32 -> fp16, rounding to nearest even. */
    test_cond("fp16: 0", f32_to_fp16(0.0f) == 0x0000);
    test_cond("fp16: -0", f32_to_fp16(-0.0f) == 0x8000);
    test_cond("fp16: 1, -2", f32_to_fp16(1.0f) == 0x3c00 && f32_to_fp16(-2.0f) == 0xc000);
    test_cond("fp16: +-inf", f32_to_fp16(INFINITY) == 0x7c00 && f32_to_fp16(-INFINITY) == 0xfc00);
    uint16_t hn = f32_to_fp16(NAN);
    test_cond("fp16: nan stays nan", (hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
    test_cond("fp16: 65504 is the largest finite", f32_to_fp16(65504.0f) == 0x7bff);
    test_cond("fp16: 65519 rounds down, 65520 to inf", f32_to_fp16(65519.0f) == 0x7bff &&
                                                          f32_to_fp16(65520.0f) == 0x7c00);
    test_cond("fp16: 1e10 and -1e10 overflow", f32_to_fp16(1e10f) == 0x7c00 && f32_to_fp16(-1e10f) == 0xfc00);
    test_cond("fp16: 2^-14 is the smallest normal", f32_to_fp16(0x1p-14f) == 0x0400);
    test_cond("fp16: 2^-24 is the smallest subnormal", f32_to_fp16(0x1p-24f) == 0x0001);
    test_cond("fp16: 1023*2^-24 is the largest subnormal", f32_to_fp16(1023 * 0x1p-24f) == 0x03ff);
    test_cond("fp16: 2^-25 ties to even (0)", f32_to_fp16(0x1p-25f) == 0x0000 && f32_to_fp16(-0x1p-25f) == 0x8000);
    test_cond("fp16: just over 2^-25 rounds up", f32_to_fp16(bitsf(fbits(0x1p-25f) + 1)) == 0x0001);
    test_cond("fp16: 3*2^-25 ties to even (2)", f32_to_fp16(3 * 0x1p-25f) == 0x0002);
    test_cond("fp16: 5*2^-25 ties to even (2)", f32_to_fp16(5 * 0x1p-25f) == 0x0002);
    test_cond("fp16: 1+2^-11 ties to even (1)", f32_to_fp16(1 + 0x1p-11f) == 0x3c00);
    test_cond("fp16: 1+3*2^-11 ties to even", f32_to_fp16(1 + 3 * 0x1p-11f) == 0x3c02);
    test_cond("fp16: 1+2^-11+tiny rounds up", f32_to_fp16(bitsf(fbits(1 + 0x1p-11f) + 1)) == 0x3c01);
    test_cond("fp16: 1023.5*2^-24 ties up into the normals", f32_to_fp16(1023.5f * 0x1p-24f) == 0x0400);
    test_cond("fp16: fp32 subnormals round to signed 0", f32_to_fp16(1e-40f) == 0 && f32_to_fp16(-1e-40f) == 0x8000);

    /* fp16 -> fp32. */
    test_cond("fp16->f32: 1, -2, 65504", fp16_to_f32(0x3c00) == 1.0f && fp16_to_f32(0xc000) == -2.0f &&
                                             fp16_to_f32(0x7bff) == 65504.0f);
    test_cond("fp16->f32: -0 keeps its sign", fp16_to_f32(0x8000) == 0 && signbit(fp16_to_f32(0x8000)));
    test_cond("fp16->f32: subnormals", fp16_to_f32(0x0001) == 0x1p-24f && fp16_to_f32(0x03ff) == 1023 * 0x1p-24f &&
                                           fp16_to_f32(0x8001) == -0x1p-24f);
    test_cond("fp16->f32: inf, nan", isinf(fp16_to_f32(0x7c00)) && fp16_to_f32(0xfc00) < 0 &&
                                         isnan(fp16_to_f32(0x7e00)) && isnan(fp16_to_f32(0x7c01)));
    int ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_f32((uint16_t)h);
        uint16_t back = f32_to_fp16(f);
        if (isnan(f)) ok &= (back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0 && (back & 0x8000) == (h & 0x8000);
        else ok &= back == h;
    }
    test_cond("fp16: all 65536 values round-trip through fp32", ok);
#if defined(__F16C__)
    ok = 1;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)(urand() * 4294967296.0);
        if (i & 1) u = (u & 0x8fffffffu) | 0x30000000u; /* dense around fp16's range */
        float f = bitsf(u);
        uint16_t hw = (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
        if (isnan(f)) continue;
        ok &= f32_to_fp16(f) == hw;
        ok &= fbits(fp16_to_f32(hw)) == fbits(_cvtsh_ss(hw));
    }
    test_cond("fp16: 2M random floats agree with F16C", ok);
#endif

    /* bf16. */
    test_cond("bf16: 0, -0, 1", f32_to_bf16(0.0f) == 0 && f32_to_bf16(-0.0f) == 0x8000 && f32_to_bf16(1.0f) == 0x3f80);
    test_cond("bf16: +-inf", f32_to_bf16(INFINITY) == 0x7f80 && f32_to_bf16(-INFINITY) == 0xff80);
    uint16_t bn = f32_to_bf16(NAN), bn2 = f32_to_bf16(bitsf(0x7f800001u));
    test_cond("bf16: nan stays nan (even a low-payload one)", (bn & 0x7f80) == 0x7f80 && (bn & 0x7f) &&
                                                                   (bn2 & 0x7f80) == 0x7f80 && (bn2 & 0x7f));
    test_cond("bf16: ties to even", f32_to_bf16(bitsf(0x3f808000u)) == 0x3f80 &&
                                        f32_to_bf16(bitsf(0x3f818000u)) == 0x3f82);
    test_cond("bf16: above a tie rounds up", f32_to_bf16(bitsf(0x3f808001u)) == 0x3f81);
    test_cond("bf16: FLT_MAX rounds to inf", f32_to_bf16(bitsf(0x7f7fffffu)) == 0x7f80);
    test_cond("bf16: subnormals round to even", f32_to_bf16(bitsf(0x00008000u)) == 0 &&
                                                    f32_to_bf16(bitsf(0x00018000u)) == 2 &&
                                                    f32_to_bf16(bitsf(0x00010000u)) == 1);
    test_cond("bf16->f32: -0, 1, subnormal", signbit(bf16_to_f32(0x8000)) && bf16_to_f32(0x3f80) == 1.0f &&
                                                 bf16_to_f32(0x0001) == bitsf(0x00010000u));
    ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_f32((uint16_t)h);
        ok &= isnan(f) ? isnan(bf16_to_f32(f32_to_bf16(f))) : f32_to_bf16(f) == h;
    }
    test_cond("bf16: all 65536 values round-trip through fp32", ok);
}

int main(void) {
    test_conversions();
    test_roundtrip();

    const char *rp = test_shared("models/mini-smollm-f32.gguf");
    gguf_file *ref = NULL;
    if (!rp) {
        test_skip("test_quant: ../shared/models/mini-smollm-f32.gguf missing, file checks skipped");
    } else if (gguf_open(rp, &ref)) {
        test_cond("mini-smollm-f32.gguf opens", 0);
        printf("  %s\n", skv_last_error());
        ref = NULL;
    }
    if (ref) {
        /* The f32 file against itself, to keep a sample f32 matrix. */
        for (uint64_t i = 0; i < ref->n_tensors; i++)
            if (ref->tensors[i].n_dims == 2 && ref->tensors[i].type == GGML_F32) {
                samples[case_of(GGML_F32)].t = &ref->tensors[i];
                seen[case_of(GGML_F32)] = 1;
                break;
            }
        static const char *files[] = {
            "models/mini-smollm-f16.gguf", "models/mini-smollm-bf16.gguf", "models/mini-smollm-q8_0.gguf",
            "models/mini-smollm-q6_k.gguf", "models/mini-smollm-q4_k_m.gguf", "models/mini-smollm-q4_0.gguf",
        };
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) check_file(ref, files[i]);
        printf("  measured relative L2 error vs f32 (worst tensor):");
        for (size_t c = 0; c < N_CASES; c++) printf(" %s %.3g", ggml_type_name(cases[c].t), file_err[c]);
        printf("\n");
        char msg[256];
        for (size_t c = 0; c < N_CASES; c++) {
            snprintf(msg, sizeof msg, "type %s seen in the model files", ggml_type_name(cases[c].t));
            test_cond(msg, seen[c]);
        }

        /* Conversions and reference quantizers against the converter's bytes. */
        static const struct { const char *file, *tensor; } rq[] = {
            {"models/mini-smollm-f16.gguf", "blk.0.attn_q.weight"},
            {"models/mini-smollm-bf16.gguf", "blk.0.attn_q.weight"},
            {"models/mini-smollm-q4_0.gguf", "blk.0.attn_q.weight"},
            {"models/mini-smollm-q4_k_m.gguf", "blk.0.attn_q.weight"},
            {"models/mini-smollm-q4_0.gguf", "token_embd.weight"},  /* q8_0 from llama-quantize */
            {"models/mini-smollm-q8_0.gguf", "token_embd.weight"},  /* q8_0 from gguf-py */
        };
        for (size_t i = 0; i < sizeof rq / sizeof rq[0]; i++) {
            enum ggml_type t = GGML_F32;
            long ties = 0, d = requant_mismatch(ref, rq[i].file, rq[i].tensor, &t, &ties);
            if (d == -1) continue;
            snprintf(msg, sizeof msg, "quantizing %s of %s to %s matches the file "
                     "(%ld bytes differ; %ld exact .5 ties the writer rounded to even)",
                     rq[i].tensor, rq[i].file, ggml_type_name(t), d, ties);
            test_cond(msg, d == 0);
        }
    }

    test_matvec();
    test_matvec_rows();

    for (size_t c = 0; c < N_CASES; c++)
        if (samples[c].file && samples[c].file != ref) {
            gguf_file *f = samples[c].file;
            for (size_t k = c; k < N_CASES; k++)
                if (samples[k].file == f) samples[k].file = NULL;
            gguf_close(f);
        }
    if (ref) gguf_close(ref);
    return test_report("test_quant");
}
