/* kv_dense.c: the dense KV policy: every key and value kept, exact causal
 * attention through the backend. It is the reference every other policy is
 * checked against. With --f16-kv the rows are stored in half precision
 * (llama.cpp's default cache type): half the bytes a decode step reads, the
 * attention math still in f32. A decode step of a batch (or of one
 * sequence) stores and attends every sequence's token in one call each of
 * the backend's batched ops (dense_step_batch): on a device, two launches a
 * layer whatever the batch and the heads. */
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
    void **k;      /* post-RoPE keys: float, or uint16_t (IEEE half) when half */
    void **v;
    int n;         /* positions stored in layer 0 */
    int half;      /* --f16-kv */
} kv_dense;

static int grow(kv_dense *c, int need) {
    if (need <= c->cap) return 0;
    int cap, rc = kv_grow_cap("KV cache", c->cap, need, c->base.shape.max_ctx, &cap);
    if (rc) return rc;
    size_t hd = (size_t)c->base.shape.head_dim, nkv = (size_t)c->base.shape.n_kv_heads;
    const skv_backend *be = c->base.shape.be;
    size_t el = c->half ? sizeof(uint16_t) : sizeof(float);
    /* head-major: a bigger capacity moves every head's rows to its new start */
    for (int l = 0; l < c->base.shape.n_layers; l++) {
        char *nk = be->alloc(el * nkv * cap * hd), *nv = be->alloc(el * nkv * cap * hd);
        if (!nk || !nv) {
            if (nk) be->free(nk);
            if (nv) be->free(nv);
            return skv_error(SKV_ENOMEM, "KV cache: out of memory for %d positions", cap);
        }
        for (size_t kh = 0; c->k[l] && kh < nkv; kh++) {
            be->copy(nk + el * kh * cap * hd, (char *)c->k[l] + el * kh * c->cap * hd, el * c->cap * hd);
            be->copy(nv + el * kh * cap * hd, (char *)c->v[l] + el * kh * c->cap * hd, el * c->cap * hd);
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
    if (c->half) {
        sh->be->kv_store_h(c->k[layer], head, sh->n_kv_heads, sh->head_dim, pos, n, k);
        sh->be->kv_store_h(c->v[layer], head, sh->n_kv_heads, sh->head_dim, pos, n, v);
    } else {
        sh->be->kv_store(c->k[layer], head, sh->n_kv_heads, sh->head_dim, pos, n, k);
        sh->be->kv_store(c->v[layer], head, sh->n_kv_heads, sh->head_dim, pos, n, v);
    }
    if (layer == 0 && pos + n > c->n) c->n = pos + n;
    return 0;
}

static int dense_attend(kv_cache *base, int layer, int pos, int n, const float *q, float *out) {
    kv_dense *c = (kv_dense *)base;
    const kv_shape *sh = &base->shape;
    int hd = sh->head_dim, nh = sh->n_heads;
    size_t head = (size_t)c->cap * hd;  /* floats from one KV head's rows to the next's */
    const skv_backend *be = sh->be;
    if (c->half) {
        if (n > 1) {
            be->attend_causal_h(q, n, pos, nh, sh->n_kv_heads, hd, c->k[layer], c->v[layer], hd, head, out);
            return 0;
        }
        return be->attend_decode_h(q, nh, sh->n_kv_heads, hd, c->k[layer], c->v[layer], pos + 1, hd, head, out);
    }
    if (n > 1) {
        be->attend_causal(q, n, pos, nh, sh->n_kv_heads, hd, c->k[layer], c->v[layer], hd, head, out);
        return 0;
    }
    /* One query (decode): flash-decoding over the head-major rows. */
    return kv_attend_all(sh, q, c->k[layer], c->v[layer], pos + 1, hd, head, out);
}

/* The batch's step through the backend's batched ops: one store and one
 * attention for every sequence of the step (on a device, one launch each,
 * whatever the batch and the heads). The same rows and the same attention
 * as append then attend per cache: a one-token attend is attend_decode in
 * prefill as in decode, so a one-token prefill chunk takes this path too. */
static int dense_step_batch(kv_cache *const *cs, int n, int layer, const int *pos, const float *k_pre,
                            const float *k, const float *v, const float *q, float *out) {
    const kv_dense *c0 = (const kv_dense *)cs[0];
    const kv_shape *sh = &cs[0]->shape;
    const skv_backend *be = sh->be;
    size_t kvd = (size_t)sh->n_kv_heads * sh->head_dim, qd = (size_t)sh->n_heads * sh->head_dim;
    /* The CPU's batched ops are the per-cache calls in turn, so those run
     * (a stand-in device built on the CPU's table wraps only those); so do
     * caches that do not share a layout. */
    int batched = c0->half ? be->kv_store_batch_h && be->attend_decode_batch_h &&
                                 be->attend_decode_batch_h != skv_backend_cpu.attend_decode_batch_h
                           : be->kv_store_batch && be->attend_decode_batch &&
                                 be->attend_decode_batch != skv_backend_cpu.attend_decode_batch;
    for (int i = 1; i < n && batched; i++) {
        const kv_dense *ci = (const kv_dense *)cs[i];
        const kv_shape *si = &cs[i]->shape;
        batched = si->be == be && ci->half == c0->half && si->n_heads == sh->n_heads &&
                  si->n_kv_heads == sh->n_kv_heads && si->head_dim == sh->head_dim;
    }
    if (!batched) {
        for (int i = 0; i < n; i++) {
            int rc = dense_append(cs[i], layer, pos[i], 1, k_pre + i * kvd, k + i * kvd, v + i * kvd);
            if (!rc) rc = dense_attend(cs[i], layer, pos[i], 1, q + i * qd, out + i * qd);
            if (rc) return rc;
        }
        return 0;
    }
    skv_kv_seq local[16], *seq = n <= 16 ? local : malloc(sizeof *seq * (size_t)n);
    if (!seq) return skv_error(SKV_ENOMEM, "dense: out of memory for a batch of %d", n);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        kv_dense *ci = (kv_dense *)cs[i];
        if ((rc = grow(ci, pos[i] + 1))) break;
        if (layer == 0 && pos[i] + 1 > ci->n) ci->n = pos[i] + 1;
        seq[i] = (skv_kv_seq){.k = ci->k[layer], .v = ci->v[layer],
                              .head_stride = (size_t)ci->cap * sh->head_dim, .pos = pos[i]};
    }
    if (!rc) {
        if (c0->half) {
            be->kv_store_batch_h(seq, n, sh->n_kv_heads, sh->head_dim, k, v);
            rc = be->attend_decode_batch_h(seq, n, sh->n_heads, sh->n_kv_heads, sh->head_dim, q, out);
        } else {
            be->kv_store_batch(seq, n, sh->n_kv_heads, sh->head_dim, k, v);
            rc = be->attend_decode_batch(seq, n, sh->n_heads, sh->n_kv_heads, sh->head_dim, q, out);
        }
    }
    if (seq != local) free(seq);
    return rc;
}

static int dense_end_prefill(kv_cache *base) {
    (void)base;
    return 0;
}

static void dense_bytes(const kv_cache *base, size_t *resident, size_t *offloaded) {
    const kv_dense *c = (const kv_dense *)base;
    const kv_shape *sh = &base->shape;
    *resident = (size_t)2 * sh->n_layers * c->n * sh->n_kv_heads * sh->head_dim *
                (c->half ? sizeof(uint16_t) : sizeof(float));
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

static const kv_opt_def dense_opt_defs[] = {
    {"f16", "--f16-kv", KV_OPT_FLAG, 0, 0, 1,
     "keys and values stored in half precision (llama.cpp's default cache type): half the bytes, f32 math"},
};

static int dense_create(const kv_opts *o, const kv_shape *shape, kv_cache **out) {
    int half = kv_opt_int(o, &kv_policy_dense, "f16");
    const skv_backend *be = shape->be ? shape->be : &skv_backend_cpu;
    if (half && (!be->kv_store_h || !be->attend_decode_h || !be->attend_causal_h))
        return skv_error(SKV_EUNSUPPORTED, "dense: --f16-kv needs half-precision cache ops, which the %s backend lacks",
                         be->name);
    int rc = kv_dense_new(shape, out);
    if (!rc) ((kv_dense *)*out)->half = half;
    return rc;
}

const kv_class kv_policy_dense = {
    .name = "dense",
    .summary = "every key and value kept, exact attention (the reference)",
    .opts = dense_opt_defs,
    .n_opts = sizeof dense_opt_defs / sizeof dense_opt_defs[0],
    .device = 1,
    .prefill_pure = 1,
    .create = dense_create,
    .append = dense_append,
    .attend = dense_attend,
    .end_prefill = dense_end_prefill,
    .bytes = dense_bytes,
    .free = dense_free,
    .step_batch = dense_step_batch,
};

int kv_dense_new(const kv_shape *shape, kv_cache **out) {
    kv_dense *c = calloc(1, sizeof *c);
    if (!c) return skv_error(SKV_ENOMEM, "out of memory");
    c->base.cls = c->base.policy = &kv_policy_dense;
    c->base.shape = *shape;
    if (!c->base.shape.be) c->base.shape.be = &skv_backend_cpu;
    c->base.step = -1;
    c->k = calloc(shape->n_layers, sizeof(void *));
    c->v = calloc(shape->n_layers, sizeof(void *));
    if (!c->k || !c->v) {
        dense_free(&c->base);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    *out = &c->base;
    return 0;
}
