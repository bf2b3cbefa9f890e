/* kv_specache.c: the SpeCache KV policy (Jie et al., ICML 2025) on the CPU,
 * in the synchronous variant of the paper's Table 4.
 *
 * After the prompt every layer's keys and values are quantized with the
 * shared KIVI quantizer (kv_lowbit.h; SpeCache's quartile-midpoint rule at
 * 1 bit); the exact fp copies go to the offload store (here the policy's
 * own arrays, every read a counted fetch). Resident: the codes, their
 * scales, the full-precision residual (the newest keys and values) and a
 * buffer of fetched rows. Each decode step, per layer and KV head: attention
 * probabilities over the low-bit cache (the current token exact), averaged
 * over the group, pick the top-k positions (all but the current one); rows
 * not already in the buffer or the residual are fetched, and attention runs
 * again over every position with those rows in full precision. New tokens
 * are quantized after attention, as the cache grows.
 *
 * Not built: the speculative variant, which runs a second, speculative next
 * token through the whole forward pass to pick the rows one step ahead.
 * It needs an extra row in the forward pass and the session, not only here. */
#include "kv.h"
#include "kv_rows.h"
#include "kv_lowbit.h"
#include "probe.h"
#include "skv.h"
#include "vec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *kx, *vx;    /* (cap, kvd) exact keys and values: the offload store (kv_rows) */
    float *kd, *vd;    /* (cap, kvd) what the low-bit cache decodes to, exact where not yet quantized (kv_rows) */
    int nq_k, nq_v;    /* positions quantized */
    int **buf;         /* (n_kv_heads) -> (k) positions fetched at the previous step, in the buffer */
    int *n_buf;
} sc_layer;

typedef struct {
    float *p, *pm;     /* (max_ctx) probabilities of one query head, group mean */
    float *K, *V;      /* (max_ctx, d) the rows attention reads */
    int *sel;          /* (k) */
    int *esel;         /* (k) the exact top-k, for the metrics */
    float *sel_score;
    int n_sel, misses;
    char *in_sel;      /* (max_ctx) */
} sc_head;

typedef struct {
    kv_cache base;
    kv_opts o;
    lowbit_cfg q;
    int h, d, kvd, group, nh;
    int prompt, budget, k;
    kv_rows rows;              /* the layers' exact and decoded rows; rows.n: positions in layer 0 */
    sc_layer *L;
    sc_head *hd;
    uint64_t steps, hits, misses, fetch_bytes, step_hits, step_misses, step_fetch_bytes;
} kv_sc;

static const kv_rows_array sc_arrays[] = {
    {offsetof(sc_layer, kx), KV_ROWS_KEYS},
    {offsetof(sc_layer, vx), KV_ROWS_VALUES},
    {offsetof(sc_layer, kd), KV_ROWS_KEYS},
    {offsetof(sc_layer, vd), KV_ROWS_VALUES},
};

static int sc_append(kv_cache *base, int layer, int pos, int n, const float *k_pre, const float *k, const float *v) {
    (void)k_pre;
    return kv_rows_append(&((kv_sc *)base)->rows, layer, pos, n, k, v);
}

/* Softmax probabilities (1/sqrt(d)) of KV head kh's query heads over the T
 * keys of K (rows of kvd), averaged over the group, into pm; p is scratch
 * of T floats. */
static void group_probs(const kv_sc *c, const float *K, int kh, int T, const float *q, float *p, float *pm) {
    int d = c->d;
    float scale = 1.0f / sqrtf((float)d);
    for (int t = 0; t < T; t++) pm[t] = 0;
    for (int g = 0; g < c->group; g++) {
        const float *qh = q + (size_t)(kh * c->group + g) * d;
        float mx = -INFINITY;
        for (int t = 0; t < T; t++) {
            p[t] = vec_dot(qh, K + (size_t)t * c->kvd + (size_t)kh * d, d) * scale;
            mx = p[t] > mx ? p[t] : mx;
        }
        double z = 0;
        for (int t = 0; t < T; t++) z += p[t] = expf(p[t] - mx);
        for (int t = 0; t < T; t++) pm[t] += (float)(p[t] / z / c->group);
    }
}

/* The selection against exact attention, for the views: the group-mean
 * probabilities over the exact keys, their top-k (as many as selected), and
 * lowbit_overlap = the share of those the low-bit top-k found, lowbit_recall
 * = exact mass on the low-bit top-k / exact mass of the exact top-k. Runs
 * after attention, so H->p and H->K are free scratch. */
static void exact_vs_lowbit(kv_sc *c, sc_layer *L, int kh, int T, const float *q) {
    sc_head *H = &c->hd[kh];
    int layer = (int)(L - c->L);
    int n = T - 1, k = H->n_sel;
    if (k <= 0 || n <= 0) return;
    float *pe = H->p;
    group_probs(c, L->kx, kh, T, q, H->K, pe);
    int ne = c->base.shape.be->topk(pe, n, k, H->esel);
    double m_low = 0, m_ex = 0;
    int common = 0;
    for (int i = 0; i < k; i++) {
        m_low += pe[H->sel[i]];
        H->in_sel[H->sel[i]] = 1;
    }
    for (int i = 0; i < ne; i++) {
        m_ex += pe[H->esel[i]];
        common += H->in_sel[H->esel[i]];
    }
    for (int i = 0; i < k; i++) H->in_sel[H->sel[i]] = 0;
    probe_emit_metric(c->base.bus, "lowbit_overlap", c->base.step, layer, kh, ne ? (float)common / ne : 1.0f, 0, NULL);
    probe_emit_metric(c->base.bus, "lowbit_recall", c->base.step, layer, kh, m_ex > 0 ? (float)(m_low / m_ex) : 1.0f,
                      0, NULL);
}

/* KV head kh at context T: low-bit probabilities, the top-k, the buffer,
 * then attention with the chosen rows exact. */
static void decode_head(kv_sc *c, sc_layer *L, int kh, int T, const float *q, float *out) {
    sc_head *H = &c->hd[kh];
    const skv_backend *be = c->base.shape.be;
    int d = c->d, kvd = c->kvd;
    float scale = 1.0f / sqrtf((float)d);
    group_probs(c, L->kd, kh, T, q, H->p, H->pm);
    H->n_sel = be->topk(H->pm, T - 1, c->k, H->sel); /* every position but the current one */
    int fp_from = L->nq_k > L->nq_v ? L->nq_k : L->nq_v; /* rows at and past this are exact already */
    H->misses = 0;
    for (int i = 0; i < H->n_sel; i++) {
        int t = H->sel[i], hit = t >= fp_from;
        for (int j = 0; j < L->n_buf[kh] && !hit; j++) hit = L->buf[kh][j] == t;
        H->misses += !hit;
        H->in_sel[t] = 1;
        H->sel_score[i] = H->pm[t];
    }
    memcpy(L->buf[kh], H->sel, sizeof(int) * (size_t)H->n_sel);
    L->n_buf[kh] = H->n_sel;
    for (int t = 0; t < T; t++) {
        const float *ks = (H->in_sel[t] ? L->kx : L->kd) + (size_t)t * kvd + (size_t)kh * d;
        const float *vs = (H->in_sel[t] ? L->vx : L->vd) + (size_t)t * kvd + (size_t)kh * d;
        memcpy(H->K + (size_t)t * d, ks, sizeof(float) * d);
        memcpy(H->V + (size_t)t * d, vs, sizeof(float) * d);
    }
    for (int i = 0; i < H->n_sel; i++) H->in_sel[H->sel[i]] = 0;
    for (int g = 0; g < c->group; g++) {
        int hq = kh * c->group + g;
        be->attend_rows(q + (size_t)hq * d, H->K, H->V, T, d, d, scale, out + (size_t)hq * d);
    }
    if (probe_wants(c->base.bus, PROBE_METRIC)) exact_vs_lowbit(c, L, kh, T, q);
}

static int sc_attend(kv_cache *base, int layer, int pos, int n, const float *q, float *out) {
    kv_sc *c = (kv_sc *)base;
    const kv_shape *sh = &base->shape;
    sc_layer *L = &c->L[layer];
    int rc = kv_rows_check(&c->rows, layer, pos, n);
    if (rc) return rc;
    if (!c->prompt || n > 1) {
        sh->be->attend_causal(q, n, pos, sh->n_heads, sh->n_kv_heads, sh->head_dim, L->kx, L->vx, c->kvd,
                              (size_t)sh->head_dim, out);
        return 0;
    }
    int T = pos + 1;
    if (layer == 0) {
        c->steps++;
        c->step_hits = c->step_misses = c->step_fetch_bytes = 0;
    }
    #pragma omp parallel for schedule(dynamic, 1) if (c->h > 1)
    for (int kh = 0; kh < c->h; kh++) decode_head(c, L, kh, T, q, out);
    for (int kh = 0; kh < c->h; kh++) {
        const sc_head *H = &c->hd[kh];
        uint64_t b = (uint64_t)H->misses * 2 * c->d * sizeof(float);
        c->step_hits += (uint64_t)(H->n_sel - H->misses);
        c->step_misses += (uint64_t)H->misses;
        c->step_fetch_bytes += b;
        c->hits += (uint64_t)(H->n_sel - H->misses);
        c->misses += (uint64_t)H->misses;
        c->fetch_bytes += b;
    }
    if (probe_wants(base->bus, PROBE_DECODE_HEAD))
        for (int kh = 0; kh < c->h; kh++) {
            const sc_head *H = &c->hd[kh];
            probe_event ev = {.kind = PROBE_DECODE_HEAD, .decode_head = {
                .step = base->step, .layer = layer, .head = kh, .block = 1,
                .fetch_bytes = (uint64_t)H->misses * 2 * c->d * sizeof(float), .n_sel = H->n_sel,
                .hits = H->n_sel - H->misses, .misses = H->misses, .sel = H->sel, .score = H->sel_score}};
            probe_emit(base->bus, &ev);
        }
    /* flushes happen after attention */
    lowbit_flush(sh->be, &c->q, c->h, c->d, L->kd, L->vd, T, &L->nq_k, &L->nq_v);
    return 0;
}

static int sc_end_prefill(kv_cache *base) {
    kv_sc *c = (kv_sc *)base;
    const kv_shape *sh = &base->shape;
    c->prompt = c->rows.n;
    c->budget = kv_budget_tokens(&c->o, c->prompt);
    c->k = c->budget - c->q.residual > 0 ? c->budget - c->q.residual : 0;
    if (c->k == 0)
        snprintf(base->notice, sizeof base->notice,
                 "specache: a budget of %d tokens is all residual (%d exact tokens): no row is selected or fetched; "
                 "it attends the low-bit cache and the residual only (raise --budget past %d)", c->budget,
                 c->q.residual, c->q.residual);
    int mc = sh->max_ctx, kk = c->k > 0 ? c->k : 1;
    /* every layer reads the tokens it keeps no exact copy of from its low-bit cache (the needle's
     * comparison of two policies tells that from dropping them) */
    for (int l = 0; l < sh->n_layers && probe_wants(base->bus, PROBE_METRIC); l++)
        probe_emit_metric(base->bus, "lowbit", -1, l, -1, 1.0f, 0, NULL);
    for (int l = 0; l < sh->n_layers; l++) {
        sc_layer *L = &c->L[l];
        lowbit_flush(sh->be, &c->q, c->h, c->d, L->kd, L->vd, c->prompt, &L->nq_k, &L->nq_v);
        L->buf = skv_calloc((size_t)c->h, sizeof(int *));
        L->n_buf = skv_calloc((size_t)c->h, sizeof(int));
        if (!L->buf || !L->n_buf) return skv_error(SKV_ENOMEM, "out of memory");
        for (int kh = 0; kh < c->h; kh++)
            if (!(L->buf[kh] = skv_malloc(sizeof(int) * (size_t)kk))) return skv_error(SKV_ENOMEM, "out of memory");
    }
    if (!(c->hd = skv_calloc((size_t)c->h, sizeof *c->hd))) return skv_error(SKV_ENOMEM, "out of memory");
    for (int kh = 0; kh < c->h; kh++) {
        sc_head *H = &c->hd[kh];
        H->p = skv_malloc(sizeof(float) * (size_t)mc);
        H->pm = skv_malloc(sizeof(float) * (size_t)mc);
        H->K = skv_malloc(sizeof(float) * (size_t)mc * c->d);
        H->V = skv_malloc(sizeof(float) * (size_t)mc * c->d);
        H->sel = skv_malloc(sizeof(int) * (size_t)kk);
        H->sel_score = skv_malloc(sizeof(float) * (size_t)kk);
        H->in_sel = skv_calloc((size_t)mc, 1);
        H->esel = skv_malloc(sizeof(int) * (size_t)kk);
        if (!H->p || !H->pm || !H->K || !H->V || !H->sel || !H->sel_score || !H->in_sel || !H->esel)
            return skv_error(SKV_ENOMEM, "specache: out of memory for a context of %d", mc);
    }
    return 0;
}

static void sc_bytes(const kv_cache *base, size_t *resident, size_t *offloaded) {
    const kv_sc *c = (const kv_sc *)base;
    size_t f = sizeof(float), nl = (size_t)base->shape.n_layers, kvd = (size_t)c->kvd;
    if (!c->prompt) {
        *resident = nl * 2 * (size_t)c->rows.n * kvd * f;
        *offloaded = 0;
        return;
    }
    /* the row buffer holds k rows, or every quantized position when there
     * are fewer (the residual's rows are exact already) */
    size_t r = 0;
    for (int l = 0; l < base->shape.n_layers; l++) {
        size_t buf = (size_t)(c->k < c->L[l].nq_k ? c->k : c->L[l].nq_k);
        r += lowbit_bytes(&c->q, c->h, c->d, c->rows.n, c->L[l].nq_k, c->L[l].nq_v) + 2 * buf * kvd * f;
    }
    *resident = r;
    *offloaded = nl * 2 * (size_t)c->rows.n * kvd * f;
}

static int sc_kept(const kv_cache *base, int layer, int hq, int *pos, int *unit) {
    const kv_sc *c = (const kv_sc *)base;
    (void)layer;
    int T = c->rows.n, n = 0;
    *unit = 1;
    if (!c->hd) {
        for (int t = 0; t < T; t++) pos[n++] = t;
        return n;
    }
    /* At the attend the cache was flushed for T - 1 positions: rows from
     * there on were exact; L's counters have moved on since. */
    int R = c->q.residual, L1 = T - 1;
    int nk = L1 - L1 % R, nv = L1 > R ? L1 - R : 0, fp_from = nk > nv ? nk : nv;
    const sc_head *H = &c->hd[hq / c->group];
    for (int i = 0; i < H->n_sel; i++)
        if (H->sel[i] < fp_from) pos[n++] = H->sel[i];
    for (int t = fp_from; t < T; t++) pos[n++] = t;
    return n;
}

static const kv_stat_def sc_stat_defs[] = {
    {"prompt_len", "tokens", "tokens in the prompt"},
    {"bits", "", "bits per quantized key and value element"},
    {"k", "rows", "rows chosen in full precision per KV head and step (budget - residual, at most the positions "
                  "before the current one)"},
    {"steps", "", "decode steps attended"},
    {"hits", "rows", "chosen rows already exact (buffer or residual)"},
    {"misses", "rows", "chosen rows fetched"},
    {"hit_rate", "%", "hits / (hits + misses)"},
    {"fetch_bytes", "B", "key and value bytes fetched from the offload store"},
    {"step_hits", "rows", "hits of the last decode step"},
    {"step_misses", "rows", "misses of the last decode step"},
    {"step_fetches", "rows", "rows fetched in the last decode step"},
    {"step_fetch_bytes", "B", "bytes fetched in the last decode step"},
    {"resident", "B", "bytes resident: codes (packed), scales, the exact residual and the row buffer"},
    {"offloaded", "B", "bytes in the offload store (exact keys and values)"},
};

static void sc_stats(const kv_cache *base, double *v) {
    const kv_sc *c = (const kv_sc *)base;
    size_t res, off;
    sc_bytes(base, &res, &off);
    double hm = (double)c->hits + c->misses;
    /* k as chosen: no more than the positions before the current one (a short prompt has fewer) */
    int k = c->rows.n - 1 < c->k ? (c->rows.n > 1 ? c->rows.n - 1 : 0) : c->k;
    double out[] = {
        c->prompt ? c->prompt : c->rows.n, c->q.bits, c->prompt ? k : NAN, (double)c->steps, (double)c->hits,
        (double)c->misses, hm > 0 ? 100 * c->hits / hm : NAN, (double)c->fetch_bytes, (double)c->step_hits,
        (double)c->step_misses, (double)c->step_misses, (double)c->step_fetch_bytes, (double)res, (double)off,
    };
    _Static_assert(sizeof out / sizeof out[0] == sizeof sc_stat_defs / sizeof sc_stat_defs[0], "one value per stat");
    memcpy(v, out, sizeof out);
}

static void sc_free(kv_cache *base) {
    kv_sc *c = (kv_sc *)base;
    for (int l = 0; c->L && l < base->shape.n_layers; l++) {
        sc_layer *L = &c->L[l];
        for (int kh = 0; L->buf && kh < c->h; kh++) free(L->buf[kh]);
        free(L->buf); free(L->n_buf);
    }
    kv_rows_free(&c->rows);
    free(c->L);
    for (int kh = 0; c->hd && kh < c->h; kh++) {
        sc_head *H = &c->hd[kh];
        free(H->p); free(H->pm); free(H->K); free(H->V); free(H->sel); free(H->sel_score); free(H->in_sel); free(H->esel);
    }
    free(c->hd);
    free(c);
}

/* Options and defaults of the paper (PEERS.md). */
static int sc_floor(const kv_opts *o, char *why, size_t n) {
    int r = kv_opt_int(o, &kv_policy_specache, "residual");
    snprintf(why, n, "the residual (%d exact tokens) + 1 row (%d tokens): a smaller budget fetches no row", r, r + 1);
    return r + 1;
}

static const kv_opt_def sc_opt_defs[] = {
    {"bits", "--bits", KV_OPT_INT, 2, 1, 8, "bits per quantized element (the paper: 1 or 2)"},
    {"group", NULL, KV_OPT_INT, 64, 1, 4096, "quantization group g (tokens for keys, channels for values)"},
    {"residual", NULL, KV_OPT_INT, 64, 1, 1 << 16, "R: newest tokens kept exact; a multiple of the group"},
    {"midpoint", NULL, KV_OPT_FLAG, 1, 0, 1, "at 1 bit, decode to the quartile midpoints (SpeCache's rule)"},
};

static int sc_create(const kv_opts *o, const kv_shape *shape, kv_cache **out);

const kv_class kv_policy_specache = {
    .name = "specache",
    .summary = "low-bit KIVI cache resident, exact rows offloaded; the top-k rows by low-bit attention fetched "
               "and attended exact (synchronous variant; Jie et al., ICML 2025)",
    .opts = sc_opt_defs,
    .n_opts = sizeof sc_opt_defs / sizeof sc_opt_defs[0],
    .budgeted = 1,
    .stat_defs = sc_stat_defs,
    .n_stats = sizeof sc_stat_defs / sizeof sc_stat_defs[0],
    .create = sc_create,
    .append = sc_append,
    .attend = sc_attend,
    .end_prefill = sc_end_prefill,
    .bytes = sc_bytes,
    .stats = sc_stats,
    .kept = sc_kept,
    .free = sc_free,
    .floor = sc_floor,
};

static int sc_create(const kv_opts *o, const kv_shape *shape, kv_cache **out) {
    *out = NULL;
    const kv_class *p = &kv_policy_specache;
    lowbit_cfg q = {.bits = kv_opt_int(o, p, "bits"), .group = kv_opt_int(o, p, "group"),
                    .residual = kv_opt_int(o, p, "residual"), .midpoint = kv_opt_int(o, p, "midpoint")};
    if (q.residual % q.group)
        return skv_error(SKV_EINVAL, "specache: the residual (%d) must be a multiple of the group (%d)", q.residual,
                         q.group);
    void *cv, *lv;
    int rc = kv_policy_alloc(p, shape, o, sizeof(kv_sc), sizeof(sc_layer), &cv, &lv);
    if (rc) return rc;
    kv_sc *c = cv;
    c->L = lv;
    c->o = *o;
    c->q = q;
    c->h = shape->n_kv_heads;
    c->d = shape->head_dim;
    c->kvd = c->h * c->d;
    c->nh = shape->n_heads;
    c->group = c->nh / c->h;
    kv_rows_init(&c->rows, p->name, &c->base.shape, c->L, sizeof *c->L, sc_arrays, sizeof sc_arrays / sizeof sc_arrays[0],
                 0);
    *out = &c->base;
    return 0;
}
