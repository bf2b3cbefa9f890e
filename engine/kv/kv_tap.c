/* kv_tap.c: a KV policy that wraps another and keeps copies of what one
 * layer sees: the appended pre-RoPE keys, post-RoPE keys and values of every
 * position, and the last query. `skv dump` uses it to write a layer's
 * tensors; the wrapped policy behaves exactly as it would alone. */
#include "kv.h"
#include "skv.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    kv_cache base;
    kv_cache *inner;     /* owned */
    int layer;
    kv_tap_data d;
    int cap;             /* positions allocated in d.k_pre, d.k, d.v */
} kv_tap;

static int tap_append(kv_cache *b, int layer, int pos, int n, const float *k_pre, const float *k, const float *v) {
    kv_tap *t = (kv_tap *)b;
    t->inner->step = b->step;
    int rc = t->inner->cls->append(t->inner, layer, pos, n, k_pre, k, v);
    if (rc || layer != t->layer) return rc;
    size_t row = (size_t)b->shape.n_kv_heads * b->shape.head_dim;
    if (pos + n > t->cap) {
        int cap = t->cap ? t->cap : 256;
        while (cap < pos + n) cap *= 2;
        float *a = realloc(t->d.k_pre, sizeof(float) * row * cap);
        if (a) t->d.k_pre = a;
        float *c = realloc(t->d.k, sizeof(float) * row * cap);
        if (c) t->d.k = c;
        float *e = realloc(t->d.v, sizeof(float) * row * cap);
        if (e) t->d.v = e;
        if (!a || !c || !e) return skv_error(SKV_ENOMEM, "kv tap: out of memory");
        t->cap = cap;
    }
    memcpy(t->d.k_pre + (size_t)pos * row, k_pre, sizeof(float) * row * n);
    memcpy(t->d.k + (size_t)pos * row, k, sizeof(float) * row * n);
    memcpy(t->d.v + (size_t)pos * row, v, sizeof(float) * row * n);
    if (pos + n > t->d.n) t->d.n = pos + n;
    return 0;
}

static int tap_attend(kv_cache *b, int layer, int pos, int n, const float *q, float *out) {
    kv_tap *t = (kv_tap *)b;
    t->inner->step = b->step;
    if (layer == t->layer) {
        size_t qd = (size_t)b->shape.n_heads * b->shape.head_dim;
        memcpy(t->d.q_last, q + (n - 1) * qd, sizeof(float) * qd);
    }
    return t->inner->cls->attend(t->inner, layer, pos, n, q, out);
}

static int tap_end_prefill(kv_cache *b) {
    kv_tap *t = (kv_tap *)b;
    int rc = t->inner->cls->end_prefill(t->inner);
    memcpy(b->notice, t->inner->notice, sizeof b->notice);
    return rc;
}

static void tap_bytes(const kv_cache *b, size_t *res, size_t *off) {
    const kv_tap *t = (const kv_tap *)b;
    t->inner->cls->bytes(t->inner, res, off);
}

static void tap_free(kv_cache *b) {
    kv_tap *t = (kv_tap *)b;
    kv_free(t->inner);
    free(t->d.k_pre);
    free(t->d.k);
    free(t->d.v);
    free(t->d.q_last);
    free(t);
}

static void tap_stats(const kv_cache *b, double *val) {
    const kv_tap *t = (const kv_tap *)b;
    if (t->inner->policy->n_stats) t->inner->cls->stats(t->inner, val);
}

static const kv_class kv_tap_class = {
    .name = "tap",
    .stats = tap_stats,
    .append = tap_append,
    .attend = tap_attend,
    .end_prefill = tap_end_prefill,
    .bytes = tap_bytes,
    .free = tap_free,
};

int kv_tap_new(kv_cache *inner, int layer, kv_cache **out) {
    kv_tap *t = calloc(1, sizeof *t);
    if (!t) return skv_error(SKV_ENOMEM, "out of memory");
    t->base.cls = &kv_tap_class;
    t->base.policy = inner->policy; /* options and stats are the wrapped policy's */
    t->base.shape = inner->shape;
    t->base.bus = inner->bus;
    t->base.step = -1;
    t->layer = layer;
    t->d.q_last = calloc((size_t)inner->shape.n_heads * inner->shape.head_dim, sizeof(float));
    if (!t->d.q_last) { free(t); return skv_error(SKV_ENOMEM, "out of memory"); }
    t->inner = t->base.wrapped = inner;
    *out = &t->base;
    return 0;
}

const kv_tap_data *kv_tap_get(const kv_cache *c) {
    return c && c->cls == &kv_tap_class ? &((const kv_tap *)c)->d : NULL;
}
