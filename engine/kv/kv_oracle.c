/* kv_oracle.c: the exact-attention oracle beside any KV policy.
 *
 * A wrapper that passes every call to the policy it wraps and keeps its own
 * copy of each layer's post-RoPE keys and values. After each decode attend
 * it asks the policy what it read in full precision (kv_class.kept) and
 * scores that, per query head, against exact softmax attention over the
 * copy:
 *  - mass recall: exact mass on the attended tokens / exact mass of the
 *    exact top-B tokens, B = the number attended;
 *  - overlap: the share of that exact top-B the policy attended;
 *  - output error: |o - o_exact| / |o_exact|, o being the policy's output;
 *  - the needle (kv_opts watch span): its best exact rank, its mass, and how
 *    many of its tokens every query head of the group attended.
 * One PROBE_ORACLE event per (step, layer, KV head) carries them, so every
 * view and the diagnosis read the same measures whatever the policy. The
 * policy never sees the copy and behaves exactly as it would alone. */
#include "kv.h"
#include "kv_rows.h"
#include "probe.h"
#include "skv.h"
#include "vec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *p;          /* (max_ctx) exact probabilities of one query head */
    float *tmp;        /* (max_ctx) selection scratch */
    float *pm;         /* (max_ctx) group-mean probabilities */
    int *pos;          /* (max_ctx) positions the policy attended */
    int *mark;         /* (max_ctx) query heads of the group that attended each position */
    float *o;          /* (head_dim) exact output */
    /* per query head of the group, for the event */
    int *q_kept, *q_gen;     /* tokens attended by each query head, of them generated */
    float *q_recall, *q_overlap, *q_err;
    /* the event's scalars */
    int n_kept, n_gen, needle_kept, needle_rank;
    float needle_mass, mass_kept;
    float more[2 * KV_WATCH_MORE]; /* per extra watched span: share of its tokens kept, exact mass */
} or_head;

typedef struct {
    float *k, *v;              /* (cap, kvd) the copy of the layer's keys and values (kv_rows) */
} or_layer;

typedef struct {
    kv_cache base;
    kv_cache *inner;           /* owned */
    int kvd, group;
    or_layer *L;               /* (n_layers) */
    kv_rows rows;              /* rows.n: positions appended to layer 0 */
    int prompt;                /* prompt length (0 until end_prefill) */
    int wb, we;                /* the needle span, clipped to the prompt at end_prefill */
    int n_more;                /* extra watched spans (kv_opts watch_more), clipped likewise */
    int more[KV_WATCH_MORE][2];
    or_head *hd;               /* (n_kv_heads), allocated at the first decode attend */
    kv_oracle_summary sum;     /* over every layer */
    kv_oracle_summary *lsum;   /* (n_layers) */
} kv_or;

static const kv_rows_array or_arrays[] = {
    {offsetof(or_layer, k), KV_ROWS_KEYS},
    {offsetof(or_layer, v), KV_ROWS_VALUES},
};

static int or_append(kv_cache *b, int layer, int pos, int n, const float *k_pre, const float *k, const float *v) {
    kv_or *c = (kv_or *)b;
    c->inner->step = b->step;
    int rc = c->inner->cls->append(c->inner, layer, pos, n, k_pre, k, v);
    return rc ? rc : kv_rows_append(&c->rows, layer, pos, n, k, v);
}

/* The sum of the B largest of x (n values, B <= n) and the B-th largest
 * value, by quickselect on tmp (a copy of x). */
static double top_mass(const float *x, int n, int B, float *tmp, float *kth) {
    memcpy(tmp, x, sizeof(float) * (size_t)n);
    int lo = 0, hi = n - 1, want = B - 1; /* index of the B-th largest in descending order */
    while (lo < hi) {
        float piv = tmp[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (tmp[i] > piv) i++;
            while (tmp[j] < piv) j--;
            if (i <= j) {
                float t = tmp[i];
                tmp[i++] = tmp[j];
                tmp[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    *kth = tmp[want];
    double s = 0;
    for (int i = 0; i < want; i++) s += tmp[i];
    return s + tmp[want];
}

static int alloc_heads(kv_or *c) {
    int h = c->base.shape.n_kv_heads, T = c->base.shape.max_ctx, g = c->group;
    if (!(c->hd = skv_calloc((size_t)h, sizeof *c->hd))) return skv_error(SKV_ENOMEM, "oracle: out of memory");
    for (int kh = 0; kh < h; kh++) {
        or_head *H = &c->hd[kh];
        H->p = skv_malloc(sizeof(float) * T);
        H->tmp = skv_malloc(sizeof(float) * T);
        H->pm = skv_malloc(sizeof(float) * T);
        H->pos = skv_malloc(sizeof(int) * T);
        H->mark = skv_calloc((size_t)T, sizeof(int));
        H->o = skv_malloc(sizeof(float) * c->base.shape.head_dim);
        H->q_kept = skv_malloc(sizeof(int) * g);
        H->q_gen = skv_malloc(sizeof(int) * g);
        H->q_recall = skv_malloc(sizeof(float) * g);
        H->q_overlap = skv_malloc(sizeof(float) * g);
        H->q_err = skv_malloc(sizeof(float) * g);
        if (!H->p || !H->tmp || !H->pm || !H->pos || !H->mark || !H->o || !H->q_kept || !H->q_gen || !H->q_recall ||
            !H->q_overlap || !H->q_err)
            return skv_error(SKV_ENOMEM, "oracle: out of memory for a context of %d", T);
    }
    return 0;
}

/* Scores KV head kh of layer at context T (positions 0..T-1). */
static void score_head(kv_or *c, int layer, int kh, int T, const float *q, const float *out, int *unit) {
    or_head *H = &c->hd[kh];
    const kv_shape *sh = &c->base.shape;
    int d = sh->head_dim, g = c->group;
    float scale = 1.0f / sqrtf((float)d);
    const float *K = c->L[layer].k + (size_t)kh * d, *V = c->L[layer].v + (size_t)kh * d;
    for (int t = 0; t < T; t++) H->pm[t] = 0, H->mark[t] = 0;
    H->mass_kept = 0;
    for (int j = 0; j < g; j++) {
        int hq = kh * g + j;
        const float *qh = q + (size_t)hq * d, *oh = out + (size_t)hq * d;
        float mx = -INFINITY;
        for (int t = 0; t < T; t++) {
            H->p[t] = vec_dot(qh, K + (size_t)t * c->kvd, d) * scale;
            if (H->p[t] > mx) mx = H->p[t];
        }
        double z = 0;
        for (int t = 0; t < T; t++) z += H->p[t] = expf(H->p[t] - mx);
        for (int t = 0; t < T; t++) H->p[t] = (float)(H->p[t] / z), H->pm[t] += H->p[t] / g;
        for (int i = 0; i < d; i++) H->o[i] = 0;
        for (int t = 0; t < T; t++) vec_axpy(H->o, H->p[t], V + (size_t)t * c->kvd, d);
        double num = 0, den = 0;
        for (int i = 0; i < d; i++) {
            num += ((double)oh[i] - H->o[i]) * ((double)oh[i] - H->o[i]);
            den += (double)H->o[i] * H->o[i];
        }
        H->q_err[j] = (float)(den > 0 ? sqrt(num / den) : sqrt(num));
        int n = T;
        if (c->inner->cls->kept) n = c->inner->cls->kept(c->inner, layer, hq, H->pos, unit);
        else
            for (int t = 0; t < T; t++) H->pos[t] = t;
        double kept = 0;
        int gen = 0;
        for (int i = 0; i < n; i++) {
            int t = H->pos[i];
            SKV_ASSERT(t >= 0 && t < T);
            kept += H->p[t];
            H->mark[t]++;
            gen += t >= c->prompt;
        }
        H->q_kept[j] = n;
        H->q_gen[j] = gen;
        H->mass_kept += (float)(kept / g);
        if (n <= 0) {
            H->q_recall[j] = H->q_overlap[j] = 0;
            continue;
        }
        float kth;
        double top = top_mass(H->p, T, n < T ? n : T, H->tmp, &kth);
        int above = 0, tie = 0, n_above = 0;
        for (int t = 0; t < T; t++) n_above += H->p[t] > kth;
        for (int i = 0; i < n; i++) {
            float x = H->p[H->pos[i]];
            above += x > kth;
            tie += x == kth;
        }
        int room = n - n_above; /* top-B places left for tokens at the threshold */
        int hit = above + (tie < room ? tie : room);
        H->q_recall[j] = top > 0 ? (float)(kept / top) : 1.0f;
        if (H->q_recall[j] > 1) H->q_recall[j] = 1; /* rounding: the top-B mass bounds the kept mass */
        H->q_overlap[j] = (float)hit / n;
    }
    H->n_kept = H->n_gen = 0;
    for (int t = 0; t < T; t++)
        if (H->mark[t]) {
            H->n_kept++;
            H->n_gen += t >= c->prompt;
        }
    H->needle_kept = 0;
    H->needle_rank = -1;
    H->needle_mass = 0;
    if (c->we > c->wb) {
        float best = -1;
        for (int t = c->wb; t < c->we; t++) {
            H->needle_mass += H->pm[t];
            H->needle_kept += H->mark[t] == g;
            if (H->pm[t] > best) best = H->pm[t];
        }
        int r = 0;
        for (int t = 0; t < T; t++) r += H->pm[t] > best;
        H->needle_rank = r;
    }
    for (int i = 0; i < c->n_more; i++) {
        int kept = 0, len = c->more[i][1] - c->more[i][0];
        float mass = 0;
        for (int t = c->more[i][0]; t < c->more[i][1]; t++) {
            mass += H->pm[t];
            kept += H->mark[t] == g;
        }
        H->more[2 * i] = len > 0 ? (float)kept / len : 0.0f;
        H->more[2 * i + 1] = mass;
    }
}

static float mean(const float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return n ? (float)(s / n) : 0.0f;
}

/* Adds one (step, layer, query head) to the running means of s. */
static void add(kv_oracle_summary *s, float recall, float overlap, float err, int kept, int gen, int ctx) {
    if (!s->n || recall < s->recall_min) s->recall_min = recall;
    if (!s->n || err > s->out_err_max) s->out_err_max = err;
    s->n++;
    double w = 1.0 / s->n;
    s->recall += (recall - s->recall) * w;
    s->overlap += (overlap - s->overlap) * w;
    s->out_err += (err - s->out_err) * w;
    s->kept += (kept - s->kept) * w;
    s->gen += (gen - s->gen) * w;
    s->ctx += (ctx - s->ctx) * w;
}

static int or_attend(kv_cache *b, int layer, int pos, int n, const float *q, float *out) {
    kv_or *c = (kv_or *)b;
    c->inner->step = b->step;
    int rc = c->inner->cls->attend(c->inner, layer, pos, n, q, out);
    if (rc || !c->prompt || n != 1) return rc;
    if (!c->hd && (rc = alloc_heads(c))) return rc;
    double t0 = skv_now();
    int h = b->shape.n_kv_heads, T = pos + 1, unit = 1;
    #pragma omp parallel for schedule(dynamic, 1) if (h > 1)
    for (int kh = 0; kh < h; kh++) {
        int u = 1;
        score_head(c, layer, kh, T, q, out, &u);
        if (kh == 0) unit = u;
    }
    for (int kh = 0; kh < h; kh++) {
        or_head *H = &c->hd[kh];
        for (int j = 0; j < c->group; j++) {
            add(&c->sum, H->q_recall[j], H->q_overlap[j], H->q_err[j], H->q_kept[j], H->q_gen[j], T);
            add(&c->lsum[layer], H->q_recall[j], H->q_overlap[j], H->q_err[j], H->q_kept[j], H->q_gen[j], T);
        }
    }
    c->sum.seconds += skv_now() - t0;
    if (!probe_wants(b->bus, PROBE_ORACLE)) return 0;
    for (int kh = 0; kh < h; kh++) {
        or_head *H = &c->hd[kh];
        probe_event ev = {.kind = PROBE_ORACLE, .oracle = {
            .step = b->step, .layer = layer, .head = kh, .n_q = c->group, .unit = unit > 0 ? unit : 1, .ctx = T,
            .n_kept = H->n_kept, .n_gen = H->n_gen, .recall = mean(H->q_recall, c->group),
            .overlap = mean(H->q_overlap, c->group), .out_err = mean(H->q_err, c->group), .mass_kept = H->mass_kept,
            .needle_len = c->we > c->wb ? c->we - c->wb : 0, .needle_kept = H->needle_kept,
            .needle_rank = H->needle_rank, .needle_mass = H->needle_mass, .q_kept = H->q_kept,
            .q_recall = H->q_recall, .q_overlap = H->q_overlap, .q_out_err = H->q_err}};
        probe_emit(b->bus, &ev);
        if (c->n_more && probe_wants(b->bus, PROBE_METRIC))
            probe_emit_metric(b->bus, "distractors", b->step, layer, kh, (float)c->n_more, 2 * c->n_more, H->more);
    }
    return 0;
}

static int or_end_prefill(kv_cache *b) {
    kv_or *c = (kv_or *)b;
    int rc = c->inner->cls->end_prefill(c->inner);
    memcpy(b->notice, c->inner->notice, sizeof b->notice);
    if (rc) return rc;
    /* The prompt is what layer 0 holds (the policy has checked the appends). */
    c->prompt = c->rows.n;
    if (c->wb < 0) c->wb = 0;
    if (c->we > c->prompt) c->we = c->prompt;
    for (int i = 0; i < c->n_more; i++) {
        if (c->more[i][0] < 0) c->more[i][0] = 0;
        if (c->more[i][1] > c->prompt) c->more[i][1] = c->prompt;
        if (c->more[i][1] < c->more[i][0]) c->more[i][1] = c->more[i][0];
    }
    return 0;
}

static void or_bytes(const kv_cache *b, size_t *res, size_t *off) {
    const kv_or *c = (const kv_or *)b;
    c->inner->cls->bytes(c->inner, res, off);
}

static void or_stats(const kv_cache *b, double *val) {
    const kv_or *c = (const kv_or *)b;
    if (c->inner->policy->n_stats) c->inner->cls->stats(c->inner, val);
}

static void or_free(kv_cache *b) {
    kv_or *c = (kv_or *)b;
    kv_free(c->inner);
    kv_rows_free(&c->rows);
    free(c->L);
    for (int kh = 0; c->hd && kh < b->shape.n_kv_heads; kh++) {
        or_head *H = &c->hd[kh];
        free(H->p); free(H->tmp); free(H->pm); free(H->pos); free(H->mark); free(H->o);
        free(H->q_kept); free(H->q_gen); free(H->q_recall); free(H->q_overlap); free(H->q_err);
    }
    free(c->hd);
    free(c->lsum);
    free(c);
}

static const kv_class kv_oracle_class = {
    .name = "oracle",
    .append = or_append,
    .attend = or_attend,
    .end_prefill = or_end_prefill,
    .bytes = or_bytes,
    .stats = or_stats,
    .free = or_free,
};

int kv_oracle_new(kv_cache *inner, const kv_opts *o, kv_cache **out) {
    *out = NULL;
    const kv_shape *sh = &inner->shape;
    if (sh->n_kv_heads < 1 || sh->n_heads % sh->n_kv_heads)
        return skv_error(SKV_EINVAL, "oracle: %d query heads do not split into %d KV heads", sh->n_heads,
                         sh->n_kv_heads);
    kv_or *c = skv_calloc(1, sizeof *c);
    if (!c) return skv_error(SKV_ENOMEM, "out of memory");
    c->base.cls = &kv_oracle_class;
    c->base.policy = inner->policy;
    c->base.shape = inner->shape;
    c->base.bus = inner->bus;
    c->base.step = -1;
    c->kvd = sh->n_kv_heads * sh->head_dim;
    c->group = sh->n_heads / sh->n_kv_heads;
    c->wb = o->watch_begin;
    c->we = o->watch_end;
    c->n_more = o->n_watch_more < 0 ? 0 : o->n_watch_more > KV_WATCH_MORE ? KV_WATCH_MORE : o->n_watch_more;
    memcpy(c->more, o->watch_more, sizeof c->more);
    c->L = skv_calloc((size_t)sh->n_layers, sizeof *c->L);
    c->lsum = skv_calloc((size_t)sh->n_layers, sizeof *c->lsum);
    if (!c->L || !c->lsum) {
        free(c->L);
        free(c->lsum);
        free(c);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    kv_rows_init(&c->rows, "oracle", &c->base.shape, c->L, sizeof *c->L, or_arrays, sizeof or_arrays / sizeof or_arrays[0], 0);
    c->inner = c->base.wrapped = inner;
    *out = &c->base;
    return 0;
}

int kv_oracle_get(const kv_cache *c, int layer, kv_oracle_summary *out) {
    memset(out, 0, sizeof *out);
    if (!c || c->cls != &kv_oracle_class || layer < -1 || layer >= c->shape.n_layers) return 0;
    *out = layer < 0 ? ((const kv_or *)c)->sum : ((const kv_or *)c)->lsum[layer];
    return 1;
}
