/* test_kmath: the per-element math of the CUDA kernels (kernels/kmath.h),
 * checked on the CPU on every machine. Each check runs a kernel's loop the
 * way the kernel runs it, built from the kmath functions, and compares with
 * the CPU backend's op (bit for bit where the two compute in the same order,
 * within fp32 rounding where the order differs): BF16 conversions, RMSNorm,
 * RoPE (both pairings, partial rotation, Llama-3 scaled frequencies),
 * SwiGLU, attention by tiles with the online softmax and the flash-decoding
 * merge, the top-k order keys, landmarks, cosine minima, page bounds and
 * KIVI. What only a device can check (launch shapes, shared memory,
 * streams) is tests/gpu/. */
#include "backend.h"
#include "kivi.h"
#include "kmath.h"
#include "page_ops.h"
#include "quant.h"
#include "shadowkv_ops.h"
#include "skv.h"
#include "testhelp.h"

#include <stdint.h>

static uint64_t rs = 0xbb67ae8584caa73bull;
static uint64_t next(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static float frand(void) { return (float)((next() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }
static float *rnd(size_t n) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = frand();
    return x;
}

static int same(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, 4) && !(isnan(a[i]) && isnan(b[i]))) return 0;
    return 1;
}

static void t_bf16(void) {
    int ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = km_bf16_to_f32((uint16_t)h), b = bf16_to_f32((uint16_t)h);
        ok &= !memcmp(&a, &b, 4);
    }
    test_cond("km_bf16_to_f32 equals the CPU's bf16_to_f32 on all 65536 values", ok);
    ok = 1;
    uint32_t special[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0x3f808000u,
                          0x3f818000u, 0x7f7fffffu, 0x00000001u, 0x3f80ffffu};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        float f;
        memcpy(&f, &special[i], 4);
        uint16_t a = km_f32_to_bf16(f), b = f32_to_bf16(f);
        ok &= a == b || (isnan(f) && (a & 0x7f80) == 0x7f80 && (a & 0x7f));
    }
    for (int i = 0; i < 1 << 20; i++) {
        uint32_t u = (uint32_t)next();
        float f;
        memcpy(&f, &u, 4);
        uint16_t a = km_f32_to_bf16(f), b = f32_to_bf16(f);
        ok &= a == b || (isnan(f) && (a & 0x7f80) == 0x7f80 && (a & 0x7f));
    }
    test_cond("km_f32_to_bf16 equals the CPU's rounding (nearest even) on specials and 2^20 random patterns", ok);
}

/* k_rmsnorm per row, sequentially (the CPU's order). */
static void t_rmsnorm(void) {
    int n = 4, dim = 576;
    float *x = rnd((size_t)n * dim), *w = rnd(dim), *y = malloc(sizeof(float) * n * dim),
          *z = malloc(sizeof(float) * n * dim);
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int j = 0; j < dim; j++) s += (double)x[i * dim + j] * x[i * dim + j];
        float sc = km_rms_scale(s, dim, 1e-5f);
        for (int j = 0; j < dim; j++) y[i * dim + j] = x[i * dim + j] * sc * w[j];
    }
    skv_backend_cpu.rmsnorm(z, x, w, n, dim, 1e-5f);
    test_cond("rmsnorm from km_rms_scale equals the CPU op bit for bit", same(y, z, (size_t)n * dim));
    free(x); free(w); free(y); free(z);
}

/* k_rope: a thread per (row, head, pair). */
static void t_rope(void) {
    for (int mode = 0; mode < 2; mode++)
        for (int variant = 0; variant < 2; variant++) {
            int n = 6, nh = 4, hd = 64, rd = variant ? 48 : 64, pos0 = 4093;
            rope_params p = {.mode = mode ? ROPE_NEOX : ROPE_ADJACENT, .head_dim = hd, .rope_dim = rd,
                             .theta = 500000, .llama3 = variant, .factor = 8, .low_freq = 1, .high_freq = 4,
                             .orig_ctx = 8192};
            rope_ctx rc;
            rope_init(&rc, &p, NULL);
            size_t l = (size_t)n * nh * hd;
            float *x = rnd(l), *y = malloc(sizeof(float) * l);
            memcpy(y, x, sizeof(float) * l);
            for (int t = 0; t < n; t++)
                for (int h = 0; h < nh; h++)
                    for (int i = 0; i < rd / 2; i++) {
                        float c, s;
                        km_rope_cs(rc.inv_freq[i], pos0 + t, &c, &s);
                        int a, b;
                        km_rope_pair_index(mode, i, rd, &a, &b);
                        float *v = y + ((size_t)t * nh + h) * hd;
                        km_rotate(&v[a], &v[b], c, s);
                    }
            skv_backend_cpu.rope(&rc, x, n, nh, pos0);
            char msg[160];
            snprintf(msg, sizeof msg, "rope from km_rope_cs/km_rotate equals the CPU op bit for bit (%s, rope_dim %d%s)",
                     mode ? "rotate-half" : "adjacent", rd, variant ? ", Llama-3 scaling" : "");
            test_cond(msg, same(x, y, l));
            rope_free(&rc);
            free(x); free(y);
        }
}

static void t_swiglu(void) {
    size_t n = 5000;
    float *g = rnd(n), *u = rnd(n), *y = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) g[i] *= 12; /* both tails of silu */
    for (size_t i = 0; i < n; i++) y[i] = km_silu_mul(g[i], u[i]);
    skv_backend_cpu.swiglu(g, u, n);
    double e = test_rel_l2(y, g, n);
    char msg[128];
    snprintf(msg, sizeof msg, "km_silu_mul within %.1e of the CPU op (its exp is a polynomial; bound 1e-5)", e);
    test_cond(msg, e <= 1e-5);
    free(g); free(u); free(y);
}

/* attend_block over rows [r0, r1): tiles of 64, per head the tile's max,
 * weights and sum as the kernel's head thread computes them, then every
 * dimension's accumulator rescaled and summed. Writes out (G, d) normalized
 * (norm) or not, and m, l. */
static void emu_attend(const float *q, int G, const float *K, const float *V, int r0, int r1, int stride, int d,
                       float scale, float *out, float *m, float *l, int norm) {
    enum { T = 64 };
    km_osm st[8];
    float acc[8][256], s[8][T];
    for (int g = 0; g < G; g++) {
        st[g] = km_osm_init();
        for (int e = 0; e < d; e++) acc[g][e] = 0;
    }
    for (int t0 = r0; t0 < r1; t0 += T) {
        int nt = r1 - t0 < T ? r1 - t0 : T;
        for (int g = 0; g < G; g++) {
            for (int j = 0; j < nt; j++) {
                float dot = 0;
                for (int e = 0; e < d; e++) dot += q[g * d + e] * K[(size_t)(t0 + j) * stride + e];
                s[g][j] = dot * scale;
            }
            float mx = st[g].m;
            for (int j = 0; j < nt; j++) mx = s[g][j] > mx ? s[g][j] : mx;
            float f = st[g].m == -INFINITY ? 0.0f : expf(st[g].m - mx), sum = st[g].l * f;
            for (int j = 0; j < nt; j++) {
                s[g][j] = mx == -INFINITY ? 0.0f : expf(s[g][j] - mx);
                sum += s[g][j];
            }
            st[g].m = mx;
            st[g].l = sum;
            for (int e = 0; e < d; e++) {
                acc[g][e] *= f;
                for (int j = 0; j < nt; j++) acc[g][e] += s[g][j] * V[(size_t)(t0 + j) * stride + e];
            }
        }
    }
    for (int g = 0; g < G; g++) {
        for (int e = 0; e < d; e++) out[g * d + e] = norm ? (st[g].l > 0 ? acc[g][e] / st[g].l : 0) : acc[g][e];
        if (m) { m[g] = st[g].m; l[g] = st[g].l; }
    }
}

static void t_attention(void) {
    int G = 4, d = 64, n = 1000, stride = 2 * d;
    float *q = rnd((size_t)G * d), *K = rnd((size_t)n * stride), *V = rnd((size_t)n * stride);
    float out[4 * 64], ref[4 * 64];
    emu_attend(q, G, K, V, 0, n, stride, d, 0.125f, out, NULL, NULL, 1);
    skv_backend_cpu.attend_group(q, G, K, V, SKV_ELT_F32, n, d, stride, 0.125f, ref, NULL, NULL);
    double e = test_rel_l2(out, ref, (size_t)G * d);
    char msg[160];
    snprintf(msg, sizeof msg, "attention by 64-row tiles and km_osm within %.1e of the CPU attend_group (bound 1e-5)", e);
    test_cond(msg, e <= 1e-5);
    /* flash-decoding: parts, then km_osm_merge per dimension as k_flash_decode's last block does */
    int parts = 3;
    float po[3][4 * 64], pm[3][4], pl[3][4], mg[4 * 64];
    for (int p = 0; p < parts; p++)
        emu_attend(q, G, K, V, n * p / parts, n * (p + 1) / parts, stride, d, 0.125f, po[p], pm[p], pl[p], 0);
    for (int a = 0; a < G; a++)
        for (int x = 0; x < d; x++) {
            km_osm acc = km_osm_init();
            float y = 0;
            for (int p = 0; p < parts; p++) {
                km_osm b = {pm[p][a], pl[p][a]};
                float fa, fb;
                km_osm_merge(&acc, b, &fa, &fb);
                y = y * fa + fb * po[p][a * d + x];
            }
            mg[a * d + x] = acc.l > 0 ? y / acc.l : 0;
        }
    e = test_rel_l2(mg, ref, (size_t)G * d);
    snprintf(msg, sizeof msg, "3 parts merged with km_osm_merge within %.1e of the CPU (bound 1e-5)", e);
    test_cond(msg, e <= 1e-5);
    /* an empty part (m = -inf) contributes nothing */
    km_osm a = {1.5f, 2.0f}, b = km_osm_init();
    float fa, fb;
    km_osm_merge(&a, b, &fa, &fb);
    test_cond("km_osm_merge: an empty part weighs 0 and leaves the state", fa == 1.0f && fb == 0.0f && a.m == 1.5f &&
              a.l == 2.0f);
    /* km_osm_push, one row at a time, gives the same weights as a two-pass softmax */
    km_osm o = km_osm_init();
    float sc[5] = {0.3f, -2.0f, 4.0f, 4.0f, -INFINITY}, y = 0, v[5] = {1, 2, 3, 4, 5};
    for (int j = 0; j < 5; j++) {
        float w, f = km_osm_push(&o, sc[j], &w);
        y = y * f + w * v[j];
    }
    double num = 0, den = 0, mx = 4.0;
    for (int j = 0; j < 5; j++) { num += exp(sc[j] - mx) * v[j]; den += exp(sc[j] - mx); }
    test_cond("km_osm_push: row by row equals the two-pass softmax (a -inf score weighs 0)",
              fabs(y / o.l - num / den) < 1e-6);
    free(q); free(K); free(V);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void t_topk(void) {
    int n = 3000, k = 300;
    float *s = rnd(n);
    for (int i = 0; i < n; i += 7) s[i] = s[i / 2]; /* ties */
    s[10] = NAN; s[11] = INFINITY; s[12] = -INFINITY; s[13] = 0.0f; s[14] = -0.0f; s[15] = NAN; s[16] = 0.0f;
    uint64_t *key = malloc(sizeof(uint64_t) * n);
    for (int i = 0; i < n; i++) key[i] = km_topk_key(s[i], (uint32_t)i);
    qsort(key, n, sizeof *key, cmp_u64);
    int *a = malloc(sizeof(int) * n), *b = malloc(sizeof(int) * n), ok = 1;
    int got = shadowkv_topk(s, n, n, b);
    for (int i = 0; i < n; i++) a[i] = (int)(key[i] & 0xffffffffu);
    ok = got == n && !memcmp(a, b, sizeof(int) * n);
    test_cond("sorting km_topk_key gives shadowkv_topk's full order (ties, -0 and +0, inf, NaN last)", ok);
    got = shadowkv_topk(s, n, k, b);
    test_cond("... and its top 300", got == k && !memcmp(a, b, sizeof(int) * k));
    free(s); free(key); free(a); free(b);
}

static void t_chunks(void) {
    int s = 512, d = 128, c = 8, nch = s / c, stride = 3 * d;
    float *K = rnd((size_t)s * stride), *lm = malloc(sizeof(float) * nch * d), *lr = malloc(sizeof(float) * nch * d);
    float inv = 1.0f / (float)c;
    for (int j = 0; j < nch; j++)
        for (int e = 0; e < d; e++) {
            float a = 0;
            for (int t = 0; t < c; t++) a += K[(size_t)(j * c + t) * stride + d + e];
            lm[j * d + e] = a * inv;
        }
    shadowkv_landmarks(K + d, stride, d, c, nch, lr);
    test_cond("landmarks as k_landmarks sums them equal the CPU op bit for bit", same(lm, lr, (size_t)nch * d));
    float *cm = malloc(sizeof(float) * nch), *cr = malloc(sizeof(float) * nch);
    for (int j = 0; j < nch; j++) {
        float ll = 0, mn = INFINITY;
        for (int e = 0; e < d; e++) ll += lm[j * d + e] * lm[j * d + e];
        for (int t = 0; t < c; t++) {
            const float *k = K + (size_t)(j * c + t) * stride + d;
            float dot = 0, kk = 0;
            for (int e = 0; e < d; e++) { dot += lm[j * d + e] * k[e]; kk += k[e] * k[e]; }
            float v = km_cosine(dot, ll, kk);
            mn = v < mn ? v : mn;
        }
        cm[j] = mn;
    }
    shadowkv_cos_min(K + d, stride, d, c, nch, lr, cr);
    double e = test_rel_l2(cm, cr, nch);
    char msg[128];
    snprintf(msg, sizeof msg, "cos_min from km_cosine within %.1e of the CPU op (bound 1e-6)", e);
    test_cond(msg, e <= 1e-6);
    float zero[8] = {0};
    shadowkv_cos_min(zero, 8, 8, 1, 1, zero, cr);
    test_cond("km_cosine of a zero vector is 0, as the CPU's cos_min", km_cosine(0, 0, 1) == 0 && cr[0] == 0);
    /* page bounds' score: the same sum in the same order */
    int np = 16, dd = 64;
    float *q = rnd(dd), *mn = rnd((size_t)np * dd), *mx = rnd((size_t)np * dd), U[16], Ur[16];
    for (int i = 0; i < np * dd; i++)
        if (mn[i] > mx[i]) { float t = mn[i]; mn[i] = mx[i]; mx[i] = t; }
    for (int j = 0; j < np; j++) {
        float a = 0;
        for (int ch = 0; ch < dd; ch++) a += km_page_bound(q[ch], mn[j * dd + ch], mx[j * dd + ch]);
        U[j] = a;
    }
    page_score(q, dd, mn, mx, dd, np, Ur);
    test_cond("page scores from km_page_bound equal the CPU op bit for bit", same(U, Ur, np));
    free(K); free(lm); free(lr); free(cm); free(cr); free(q); free(mn); free(mx);
}

static void t_kivi(void) {
    int ok = 1;
    for (int bits = 1; bits <= 8; bits++)
        for (int mid = 0; mid <= (bits == 1); mid++) {
            int n = 200;
            float *x = rnd(n), *y = malloc(sizeof(float) * n), *z = malloc(sizeof(float) * n);
            if (bits == 3) for (int i = 0; i < n; i++) x[i] = 0.25f; /* a flat group */
            float lo = INFINITY, hi = -INFINITY, s, zz, sr, zr;
            for (int i = 0; i < n; i++) { lo = x[i] < lo ? x[i] : lo; hi = x[i] > hi ? x[i] : hi; }
            km_kivi_params(lo, hi, bits, mid, &s, &zz);
            for (int i = 0; i < n; i++) y[i] = km_kivi_decode(km_kivi_code(x[i], s, zz, bits), s, zz, lo, hi);
            kivi_group(x, n, 1, bits, mid, z, NULL, &sr, &zr);
            ok &= same(y, z, n) && s == sr && zz == zr;
            free(x); free(y); free(z);
        }
    test_cond("KIVI from km_kivi_params/code/decode equals kivi_group bit for bit (1-8 bits, the 1-bit midpoint "
              "rule, a flat group)", ok);
}

int main(void) {
    t_bf16();
    t_rmsnorm();
    t_rope();
    t_swiglu();
    t_attention();
    t_topk();
    t_chunks();
    t_kivi();
    return test_report("test_kmath");
}
