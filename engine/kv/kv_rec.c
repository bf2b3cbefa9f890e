/* kv_rec.c: a KV policy that wraps another and records its prefill: every
 * append (pre-RoPE keys, post-RoPE keys, values) and every attend's queries,
 * in call order, until end_prefill. kv_rec_replay feeds the same calls to a
 * new cache of the same policy with other options, so that a changed setting
 * (budget, rank, outliers, window) can be tried without running the prompt
 * through the model again: the needle harness checks each proposed fix this
 * way (engine/needle.c), and a batch's sequences start from one prefill
 * (session_fork). The wrapped policy behaves exactly as it would alone.
 *
 * The rows the forward pass hands a policy are in the backend's memory (on
 * a device, its activation buffers): the recording is kept in host memory
 * and read from them with the backend's download, and a replay onto a device
 * hands the new cache rows staged in the device's memory by its upload. On
 * the CPU both are plain copies, and a replay onto the CPU passes the
 * recording itself. */
#include "kv.h"
#include "skv.h"

#include <stdlib.h>
#include <string.h>

typedef struct { int kind, layer, pos, n; } rec_call;   /* kind 0 append, 1 attend */

typedef struct {
    kv_cache base;
    kv_cache *inner;     /* owned */
    int done;            /* end_prefill seen: nothing more is recorded */
    int pure;            /* the policy's prefill attends keep no state (prefill_pure): they and
                            their queries are not recorded, and a replay is the appends alone */
    int err;             /* a recording failed (out of memory): no replay */
    rec_call *calls;     /* (n_calls) in call order */
    int n_calls, cap_calls;
    float **k_pre, **k, **v, **q; /* per layer: (cap, kvd) x 3 and (cap, qd) */
    int cap;             /* positions allocated per layer */
    size_t max_bytes;    /* rec_max_bytes() at the start */
    double t_copy;       /* seconds the recording took (kv_rec_seconds) */
} kv_rec;

/* The most a recording may hold: past it the prefill is not recorded (the
 * fixes it would check, the forks of a batch, fail) rather than the run
 * running out of memory on a long prompt of a big model: 2 GiB, or a quarter
 * of the memory available when the recorder starts if that is more. */
static size_t rec_max_bytes(void) {
    size_t least = (size_t)2 << 30, q = (size_t)(skv_mem_available() / 4);
    return q > least ? q : least;
}

static int grow(kv_rec *r, int need) {
    if (need <= r->cap) return 0;
    int cap = r->cap ? r->cap : 256;
    while (cap < need) cap *= 2;
    const kv_shape *sh = &r->base.shape;
    size_t kvd = (size_t)sh->n_kv_heads * sh->head_dim, qd = r->pure ? 0 : (size_t)sh->n_heads * sh->head_dim;
    if ((size_t)need * sh->n_layers * (3 * kvd + qd) * sizeof(float) > r->max_bytes)
        return skv_error(SKV_ENOMEM, "kv recorder: a prefill of %d positions is over the %.1f GiB it may record",
                         need, r->max_bytes / 1073741824.0);
    for (int l = 0; l < sh->n_layers; l++) {
        float **arr[4] = { &r->k_pre[l], &r->k[l], &r->v[l], &r->q[l] };
        for (int i = 0; i < (r->pure ? 3 : 4); i++) {
            float *p = realloc(*arr[i], sizeof(float) * (i == 3 ? qd : kvd) * (size_t)cap);
            if (!p) return skv_error(SKV_ENOMEM, "kv recorder: out of memory for %d positions", cap);
            *arr[i] = p;
        }
    }
    r->cap = cap;
    return 0;
}

static int log_call(kv_rec *r, int kind, int layer, int pos, int n) {
    if (r->n_calls == r->cap_calls) {
        int cap = r->cap_calls ? 2 * r->cap_calls : 64;
        rec_call *c = realloc(r->calls, sizeof *c * (size_t)cap);
        if (!c) return skv_error(SKV_ENOMEM, "kv recorder: out of memory");
        r->calls = c;
        r->cap_calls = cap;
    }
    r->calls[r->n_calls++] = (rec_call){ kind, layer, pos, n };
    return 0;
}

/* The backend whose memory the cache's rows are in. */
static const skv_backend *be_of(const kv_cache *c) { return c->shape.be ? c->shape.be : &skv_backend_cpu; }

/* The start of the recording's own time: once the backend has done what
 * was queued before it (a device's download would wait for that anyway),
 * what follows until the next op is the recording's alone. */
static double rec_clock(const kv_cache *b) {
    const skv_backend *be = be_of(b);
    if (be->sync) be->sync();
    return skv_now();
}

static int rec_append(kv_cache *b, int layer, int pos, int n, const float *k_pre, const float *k, const float *v) {
    kv_rec *r = (kv_rec *)b;
    r->inner->step = b->step;
    int rc = r->inner->cls->append(r->inner, layer, pos, n, k_pre, k, v);
    if (rc || r->done || r->err) return rc;
    double t0 = rec_clock(b);
    if (grow(r, pos + n) || log_call(r, 0, layer, pos, n)) { r->err = 1; skv_clear_error(); return 0; }
    size_t kvd = (size_t)b->shape.n_kv_heads * b->shape.head_dim, at = (size_t)pos * kvd, len = sizeof(float) * kvd * n;
    const skv_backend *be = be_of(b); /* the rows are the backend's: downloaded (the CPU's: copied) */
    be->download(r->k_pre[layer] + at, k_pre, len);
    be->download(r->k[layer] + at, k, len);
    be->download(r->v[layer] + at, v, len);
    r->t_copy += skv_now() - t0;
    return 0;
}

static int rec_attend(kv_cache *b, int layer, int pos, int n, const float *q, float *out) {
    kv_rec *r = (kv_rec *)b;
    r->inner->step = b->step;
    if (!r->done && !r->err && !r->pure) {
        double t0 = rec_clock(b);
        if (grow(r, pos + n) || log_call(r, 1, layer, pos, n)) { r->err = 1; skv_clear_error(); }
        else {
            size_t qd = (size_t)b->shape.n_heads * b->shape.head_dim;
            be_of(b)->download(r->q[layer] + (size_t)pos * qd, q, sizeof(float) * qd * n);
        }
        r->t_copy += skv_now() - t0;
    }
    return r->inner->cls->attend(r->inner, layer, pos, n, q, out);
}

static int rec_end_prefill(kv_cache *b) {
    kv_rec *r = (kv_rec *)b;
    r->done = 1;
    int rc = r->inner->cls->end_prefill(r->inner);
    memcpy(b->notice, r->inner->notice, sizeof b->notice);
    return rc;
}

static void rec_bytes(const kv_cache *b, size_t *res, size_t *off) {
    const kv_rec *r = (const kv_rec *)b;
    r->inner->cls->bytes(r->inner, res, off);
}

static void rec_stats(const kv_cache *b, double *val) {
    const kv_rec *r = (const kv_rec *)b;
    if (r->inner->policy->n_stats) r->inner->cls->stats(r->inner, val);
}

static void rec_free(kv_cache *b) {
    kv_rec *r = (kv_rec *)b;
    kv_free(r->inner);
    for (int l = 0; r->k && l < b->shape.n_layers; l++) {
        free(r->k_pre[l]);
        free(r->k[l]);
        free(r->v[l]);
        free(r->q[l]);
    }
    free(r->k_pre);
    free(r->k);
    free(r->v);
    free(r->q);
    free(r->calls);
    free(r);
}

static const kv_class kv_rec_class = {
    .name = "rec",
    .stats = rec_stats,
    .append = rec_append,
    .attend = rec_attend,
    .end_prefill = rec_end_prefill,
    .bytes = rec_bytes,
    .free = rec_free,
};

int kv_rec_new(kv_cache *inner, kv_cache **out) {
    *out = NULL;
    kv_rec *r = calloc(1, sizeof *r);
    if (!r) return skv_error(SKV_ENOMEM, "out of memory");
    r->base.cls = &kv_rec_class;
    r->base.policy = inner->policy;
    r->base.shape = inner->shape;
    r->base.bus = inner->bus;
    r->base.step = -1;
    r->pure = inner->policy->prefill_pure;
    r->max_bytes = rec_max_bytes();
    int nl = inner->shape.n_layers;
    r->k_pre = calloc((size_t)nl, sizeof *r->k_pre);
    r->k = calloc((size_t)nl, sizeof *r->k);
    r->v = calloc((size_t)nl, sizeof *r->v);
    r->q = calloc((size_t)nl, sizeof *r->q);
    r->inner = r->base.wrapped = inner;
    if (!r->k_pre || !r->k || !r->v || !r->q) {
        r->inner = NULL;
        rec_free(&r->base);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    *out = &r->base;
    return 0;
}

int kv_rec_replay(const kv_cache *c, kv_cache *dst) {
    if (!c || c->cls != &kv_rec_class) return skv_error(SKV_EINVAL, "kv_rec_replay: not a prefill recorder");
    const kv_rec *r = (const kv_rec *)c;
    if (r->err || !r->done) return skv_error(SKV_EINVAL, "kv_rec_replay: the prefill was not recorded whole");
    if (r->pure && !dst->policy->prefill_pure)
        return skv_error(SKV_EINVAL, "kv_rec_replay: %s's prefill was recorded without its queries, which %s needs",
                         r->inner->policy->name, dst->policy->name);
    const kv_shape *sh = &c->shape;
    size_t kvd = (size_t)sh->n_kv_heads * sh->head_dim, qd = (size_t)sh->n_heads * sh->head_dim;
    int most = 0;
    for (int i = 0; i < r->n_calls; i++) most = r->calls[i].n > most ? r->calls[i].n : most;
    size_t rows = (size_t)(most > 0 ? most : 1);
    /* On the CPU dst reads the recording where it is; a device backend gets
     * each call's rows uploaded into staging buffers of its own memory
     * (k_pre, k, v, q and the attend's output: one call's rows each). */
    const skv_backend *be = be_of(dst);
    int staged = be != &skv_backend_cpu;
    float *out = NULL, *st[4] = {NULL, NULL, NULL, NULL};
    if (!staged) out = skv_malloc(sizeof(float) * qd * rows);
    else {
        out = be->alloc(sizeof(float) * qd * rows);
        for (int i = 0; i < 4; i++) st[i] = be->alloc(sizeof(float) * (i == 3 ? qd : kvd) * rows);
    }
    int rc = !out || (staged && (!st[0] || !st[1] || !st[2] || !st[3]))
                 ? skv_error(SKV_ENOMEM, "kv_rec_replay: out of memory for %zu rows on %s", rows, be->name)
                 : 0;
    dst->step = -1;
    int len = 0; /* the recorded prompt's length, the most layer 0 held */
    for (int i = 0; i < r->n_calls; i++)
        if (r->calls[i].kind == 0 && r->calls[i].layer == 0 && r->calls[i].pos + r->calls[i].n > len)
            len = r->calls[i].pos + r->calls[i].n;
    if (!rc && len > 0) kv_begin_prefill(dst, len);
    for (int i = 0; i < r->n_calls && !rc; i++) {
        const rec_call *k = &r->calls[i];
        size_t at_kv = (size_t)k->pos * kvd, at_q = (size_t)k->pos * qd;
        if (k->kind == 0 && !staged)
            rc = dst->cls->append(dst, k->layer, k->pos, k->n, r->k_pre[k->layer] + at_kv, r->k[k->layer] + at_kv,
                                  r->v[k->layer] + at_kv);
        else if (k->kind == 0) {
            size_t len = sizeof(float) * kvd * (size_t)k->n;
            be->upload(st[0], r->k_pre[k->layer] + at_kv, len);
            be->upload(st[1], r->k[k->layer] + at_kv, len);
            be->upload(st[2], r->v[k->layer] + at_kv, len);
            rc = dst->cls->append(dst, k->layer, k->pos, k->n, st[0], st[1], st[2]);
        } else if (!staged)
            rc = dst->cls->attend(dst, k->layer, k->pos, k->n, r->q[k->layer] + at_q, out);
        else {
            be->upload(st[3], r->q[k->layer] + at_q, sizeof(float) * qd * (size_t)k->n);
            rc = dst->cls->attend(dst, k->layer, k->pos, k->n, st[3], out);
        }
    }
    if (!staged) free(out);
    else {
        if (be->sync) be->sync(); /* the queued appends may still read the staging buffers */
        if (out) be->free(out);
        for (int i = 0; i < 4; i++)
            if (st[i]) be->free(st[i]);
    }
    if (!rc) rc = dst->cls->end_prefill(dst);
    return rc;
}

double kv_rec_seconds(const kv_cache *c) {
    return c && c->cls == &kv_rec_class ? ((const kv_rec *)c)->t_copy : 0;
}

size_t kv_rec_held(const kv_cache *c) {
    if (!c || c->cls != &kv_rec_class) return 0;
    const kv_rec *r = (const kv_rec *)c;
    const kv_shape *sh = &c->shape;
    size_t kvd = (size_t)sh->n_kv_heads * sh->head_dim, qd = r->pure ? 0 : (size_t)sh->n_heads * sh->head_dim;
    return (size_t)r->cap * sh->n_layers * (3 * kvd + qd) * sizeof(float) + sizeof(rec_call) * (size_t)r->cap_calls;
}
