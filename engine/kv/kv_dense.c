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
    /* Head-major, so that a decode step streams each KV head's rows as one
     * contiguous run (row-interleaved heads read at a stride ran at a third
     * of the memory bandwidth): (n_layers) -> (n_kv, cap, hd). */
    float **k;     /* post-RoPE keys */
    float **v;
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
    size_t hd = (size_t)c->base.shape.head_dim, nkv = (size_t)c->base.shape.n_kv_heads;
    const skv_backend *be = c->base.shape.be;
    /* head-major: a bigger capacity moves every head's rows to its new start */
    for (int l = 0; l < c->base.shape.n_layers; l++) {
        float *nk = be->alloc(sizeof(float) * nkv * cap * hd), *nv = be->alloc(sizeof(float) * nkv * cap * hd);
        if (!nk || !nv) {
            if (nk) be->free(nk);
            if (nv) be->free(nv);
            return skv_error(SKV_ENOMEM, "KV cache: out of memory for %d positions", cap);
        }
        for (size_t kh = 0; c->k[l] && kh < nkv; kh++) {
            be->copy(nk + kh * cap * hd, c->k[l] + kh * c->cap * hd, sizeof(float) * c->cap * hd);
            be->copy(nv + kh * cap * hd, c->v[l] + kh * c->cap * hd, sizeof(float) * c->cap * hd);
        }
        if (c->k[l]) be->free(c->k[l]);
        if (c->v[l]) be->free(c->v[l]);
        c->k[l] = nk;
        c->v[l] = nv;
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
    const kv_shape *sh = &base->shape;
    size_t head = (size_t)c->cap * sh->head_dim;
    sh->be->kv_store(c->k[layer], head, sh->n_kv_heads, sh->head_dim, pos, n, k);
    sh->be->kv_store(c->v[layer], head, sh->n_kv_heads, sh->head_dim, pos, n, v);
    if (layer == 0 && pos + n > c->n) c->n = pos + n;
    return 0;
}

static int dense_attend(kv_cache *base, int layer, int pos, int n, const float *q, float *out) {
    kv_dense *c = (kv_dense *)base;
    const kv_shape *sh = &base->shape;
    int hd = sh->head_dim, nh = sh->n_heads;
    size_t head = (size_t)c->cap * hd;  /* floats from one KV head's rows to the next's */
    const skv_backend *be = sh->be;
    if (n > 1) {
        be->attend_causal(q, n, pos, nh, sh->n_kv_heads, hd, c->k[layer], c->v[layer], hd, head, out);
        return 0;
    }
    /* One query (decode): flash-decoding over the head-major rows. */
    return kv_attend_all(sh, q, c->k[layer], c->v[layer], pos + 1, hd, head, out);
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
    const skv_backend *be = base->shape.be;
    for (int l = 0; c->k && l < base->shape.n_layers; l++) {
        if (c->k[l]) be->free(c->k[l]);
        if (c->v[l]) be->free(c->v[l]);
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
    .device = 1,
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
