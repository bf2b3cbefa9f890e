/* kv_dense.c: the dense KV policy: every key and value kept, exact causal
 * attention through the backend. It is the reference every other policy is
 * checked against. */
#include "kv.h"
#include "skv.h"

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
    const skv_backend *be = sh->be;
    if (n > 1) {
        be->attend_causal(q, n, pos, nh, sh->n_kv_heads, hd, c->k[layer], c->v[layer], stride, out);
        return 0;
    }
    float scale = 1.0f / sqrtf((float)hd);
    #pragma omp parallel for schedule(dynamic, 1) collapse(2)
    for (int i = 0; i < n; i++)
        for (int h = 0; h < nh; h++) {
            int kh = h / grp;
            be->attend_rows(q + ((size_t)i * nh + h) * hd, c->k[layer] + (size_t)kh * hd,
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

static int dense_create(const kv_opts *o, const kv_shape *shape, kv_cache **out) {
    (void)o;
    return kv_dense_new(shape, out);
}

const kv_class kv_policy_dense = {
    .name = "dense",
    .summary = "every key and value kept, exact attention (the reference)",
    .create = dense_create,
    .append = dense_append,
    .attend = dense_attend,
    .end_prefill = dense_end_prefill,
    .bytes = dense_bytes,
    .free = dense_free,
};

int kv_dense_new(const kv_shape *shape, kv_cache **out) {
    kv_dense *c = calloc(1, sizeof *c);
    if (!c) return skv_error(SKV_ENOMEM, "out of memory");
    c->base.cls = c->base.policy = &kv_policy_dense;
    c->base.shape = *shape;
    if (!c->base.shape.be) c->base.shape.be = &skv_backend_cpu;
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
