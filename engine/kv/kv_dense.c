/* kv_dense.c: the dense KV policy: every key and value kept, exact causal
 * attention. It is the reference the ShadowKV policy is checked against, and
 * kv_attend_head is the attention kernel both share. */
#include "kv.h"
#include "skv.h"
#include "vec.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    kv_cache base;
    int cap;       /* positions allocated */
    float **k;     /* (n_layers) -> (cap, n_kv*hd) post-RoPE keys */
    float **v;     /* (n_layers) -> (cap, n_kv*hd) */
    int n;         /* positions stored in layer 0 */
} kv_dense;

void kv_attend_head(const float *q, const float *K, const float *V, int n, int hd, int stride, float scale,
                    float *out) {
    /* Scores live on the stack up to 4096 positions; longer contexts pay one
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

/* Queries per GEMM task of the batched attention. */
#define QBLOCK 64

void kv_attend_batch(const kv_shape *sh, const float *q, int n, int pos, const float *K, const float *V,
                     int stride, float *out) {
    int hd = sh->head_dim, nh = sh->n_heads, grp = sh->n_heads / sh->n_kv_heads;
    int qs = nh * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int nqb = (n + QBLOCK - 1) / QBLOCK;
    #pragma omp parallel
    {
        float *S = malloc(sizeof(float) * QBLOCK * (size_t)(pos + n));
        SKV_ASSERT(S);
        #pragma omp for schedule(dynamic, 1) collapse(2)
        for (int h = 0; h < nh; h++)
            for (int b = 0; b < nqb; b++) {
                int i0 = b * QBLOCK, nb = n - i0 < QBLOCK ? n - i0 : QBLOCK;
                int L = pos + i0 + nb;  /* keys the block's last query sees */
                const float *Kh = K + (size_t)(h / grp) * hd, *Vh = V + (size_t)(h / grp) * hd;
                const float *Q = q + (size_t)i0 * qs + (size_t)h * hd;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, L, hd, scale, Q, qs, Kh, stride, 0.0f, S, L);
                for (int i = 0; i < nb; i++) {
                    float *row = S + (size_t)i * L;
                    int len = pos + i0 + i + 1;  /* causal: positions 0..pos+i0+i */
                    float mx = -INFINITY;
                    for (int j = 0; j < len; j++) mx = row[j] > mx ? row[j] : mx;
                    double sum = 0;
                    for (int j = 0; j < len; j++) { row[j] = expf(row[j] - mx); sum += row[j]; }
                    float inv = (float)(1.0 / sum);
                    for (int j = 0; j < len; j++) row[j] *= inv;
                    for (int j = len; j < L; j++) row[j] = 0;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, hd, L, 1.0f, S, L, Vh, stride, 0.0f,
                            out + (size_t)i0 * qs + (size_t)h * hd, qs);
            }
        free(S);
    }
}

static int grow(kv_dense *c, int need) {
    if (need <= c->cap) return 0;
    if (need > c->base.shape.max_ctx)
        return skv_error(SKV_ERANGE, "KV cache: position %d is past the context of %d", need - 1,
                         c->base.shape.max_ctx);
    int cap = c->cap ? c->cap : 256;
    while (cap < need) cap *= 2;
    if (cap > c->base.shape.max_ctx) cap = c->base.shape.max_ctx;
    size_t row = (size_t)c->base.shape.n_kv_heads * c->base.shape.head_dim;
    for (int l = 0; l < c->base.shape.n_layers; l++) {
        float *nk = realloc(c->k[l], sizeof(float) * row * cap);
        if (nk) c->k[l] = nk;
        float *nv = realloc(c->v[l], sizeof(float) * row * cap);
        if (nv) c->v[l] = nv;
        if (!nk || !nv) return skv_error(SKV_ENOMEM, "KV cache: out of memory for %d positions", cap);
    }
    c->cap = cap;
    return 0;
}

static int dense_append(kv_cache *base, int layer, int pos, int n, const float *k_pre, const float *k,
                        const float *v) {
    (void)k_pre;
    kv_dense *c = (kv_dense *)base;
    int rc = grow(c, pos + n);
    if (rc) return rc;
    size_t row = (size_t)base->shape.n_kv_heads * base->shape.head_dim;
    memcpy(c->k[layer] + (size_t)pos * row, k, sizeof(float) * row * n);
    memcpy(c->v[layer] + (size_t)pos * row, v, sizeof(float) * row * n);
    if (layer == 0 && pos + n > c->n) c->n = pos + n;
    return 0;
}

static int dense_attend(kv_cache *base, int layer, int pos, int n, const float *q, float *out) {
    kv_dense *c = (kv_dense *)base;
    const kv_shape *sh = &base->shape;
    int hd = sh->head_dim, nh = sh->n_heads, grp = sh->n_heads / sh->n_kv_heads;
    int stride = sh->n_kv_heads * hd;
    if (n > 1) {
        kv_attend_batch(sh, q, n, pos, c->k[layer], c->v[layer], stride, out);
        return 0;
    }
    float scale = 1.0f / sqrtf((float)hd);
    #pragma omp parallel for schedule(dynamic, 1) collapse(2)
    for (int i = 0; i < n; i++)
        for (int h = 0; h < nh; h++) {
            int kh = h / grp;
            kv_attend_head(q + ((size_t)i * nh + h) * hd, c->k[layer] + (size_t)kh * hd,
                           c->v[layer] + (size_t)kh * hd, pos + i + 1, hd, stride, scale,
                           out + ((size_t)i * nh + h) * hd);
        }
    return 0;
}

static int dense_end_prefill(kv_cache *base) {
    (void)base;
    return 0;
}

static void dense_bytes(const kv_cache *base, size_t *resident, size_t *offloaded) {
    const kv_dense *c = (const kv_dense *)base;
    const kv_shape *sh = &base->shape;
    *resident = (size_t)2 * sh->n_layers * c->n * sh->n_kv_heads * sh->head_dim * sizeof(float);
    *offloaded = 0;
}

static void dense_free(kv_cache *base) {
    kv_dense *c = (kv_dense *)base;
    for (int l = 0; c->k && l < base->shape.n_layers; l++) {
        free(c->k[l]);
        free(c->v[l]);
    }
    free(c->k);
    free(c->v);
    free(c);
}

static const kv_class kv_dense_class = {
    .name = "dense",
    .append = dense_append,
    .attend = dense_attend,
    .end_prefill = dense_end_prefill,
    .bytes = dense_bytes,
    .free = dense_free,
};

int kv_dense_new(const kv_shape *shape, kv_cache **out) {
    kv_dense *c = calloc(1, sizeof *c);
    if (!c) return skv_error(SKV_ENOMEM, "out of memory");
    c->base.cls = &kv_dense_class;
    c->base.shape = *shape;
    c->base.step = -1;
    c->k = calloc(shape->n_layers, sizeof(float *));
    c->v = calloc(shape->n_layers, sizeof(float *));
    if (!c->k || !c->v) {
        dense_free(&c->base);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    *out = &c->base;
    return 0;
}
