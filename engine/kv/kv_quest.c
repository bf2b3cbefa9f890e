/* kv_quest.c: the Quest KV policy (Tang et al., ICML 2024) on the CPU.
 *
 * Every key and value stays resident (no offload). Pages of `page` tokens
 * start at position 0; per page and KV head the policy keeps the min and
 * max of the post-RoPE keys, updated on every append, prompt and generated
 * tokens alike. At each decode step, in layers past the first `dense_layers`,
 * each query head scores every page but the last with
 * U = Σ_c max(q_c·min_c, q_c·max_c) (an upper bound of q·k over the page, no
 * 1/√d), takes the top budget/page − 1 pages and attends them plus the last
 * page (the one holding the current token, full or not, never scored). With
 * at most budget/page pages the layer attends everything, as dense does.
 * GQA: each query head picks its own pages (Quest's evaluation code); the
 * option group_max picks one set per KV head by the max over the group.
 * Quest's cost is memory read, not moved: step_read_bytes counts the bounds
 * scored and the rows attended. */
#include "kv.h"
#include "kv_rows.h"
#include "probe.h"
#include "skv.h"
#include "vec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *k, *v;      /* (cap, kvd) post-RoPE keys and values (kv_rows) */
    float *mn, *mx;    /* (cap_pages, kvd) page bounds (kv_rows) */
    int dense;         /* last decode attend read every position */
} qu_layer;

/* Per query head scratch (shared by the layers, which run in turn). */
typedef struct {
    float *U;          /* (max_pages) page bounds */
    int *sel;          /* (k) selected pages, best first */
    int n_sel;
    float *K, *V;      /* ((k + 1) * page, d) gathered rows */
} qu_qhead;

typedef struct {
    kv_cache base;
    kv_opts o;                 /* the shared options (the budget is resolved at end_prefill) */
    int page, dense_layers, group_max, budget;
    int h, d, kvd, group, nh;
    int max_pages;             /* pages the context holds */
    kv_rows rows;              /* the layers' keys, values and page bounds; rows.n: positions in layer 0 */
    int prompt;                /* prompt length (0 until end_prefill) */
    qu_layer *L;
    qu_qhead *qh;              /* (n_heads) */
    float *gmax;               /* (n_kv_heads, max_pages) group-max scores */
    int *mark;                 /* (max_pages) union scratch for the selection event */
    int *ev_sel;               /* (max_pages) */
    float *ev_score;           /* (max_pages) */
    float *ev_max;             /* (max_pages) true max q·k per page, for the bound-gap metric */
    int k;                     /* pages selected per query head (besides the last) */
    uint64_t steps, read_bytes, step_read_bytes;
    int last_pages;            /* pages at the last decode step */
} kv_qu;

static const kv_rows_array qu_arrays[] = {
    {offsetof(qu_layer, k), KV_ROWS_KEYS},
    {offsetof(qu_layer, v), KV_ROWS_VALUES},
    {offsetof(qu_layer, mn), KV_ROWS_PAGE_MIN},
    {offsetof(qu_layer, mx), KV_ROWS_PAGE_MAX},
};

static int qu_append(kv_cache *base, int layer, int pos, int n, const float *k_pre, const float *k, const float *v) {
    (void)k_pre;
    return kv_rows_append(&((kv_qu *)base)->rows, layer, pos, n, k, v);
}

static int alloc_scratch(kv_qu *c) {
    int mp = c->max_pages;
    c->qh = skv_calloc((size_t)c->nh, sizeof *c->qh);
    c->gmax = skv_malloc(sizeof(float) * (size_t)c->h * mp);
    c->mark = skv_calloc((size_t)mp, sizeof(int));
    c->ev_sel = skv_malloc(sizeof(int) * (size_t)mp);
    c->ev_score = skv_malloc(sizeof(float) * (size_t)mp);
    c->ev_max = skv_malloc(sizeof(float) * (size_t)mp);
    if (!c->qh || !c->gmax || !c->mark || !c->ev_sel || !c->ev_score || !c->ev_max)
        return skv_error(SKV_ENOMEM, "out of memory");
    size_t rows = (size_t)(c->k + 1) * c->page;
    for (int i = 0; i < c->nh; i++) {
        qu_qhead *Q = &c->qh[i];
        Q->U = skv_malloc(sizeof(float) * (size_t)mp);
        Q->sel = skv_malloc(sizeof(int) * (size_t)(c->k > 0 ? c->k : 1));
        Q->K = skv_malloc(sizeof(float) * rows * c->d);
        Q->V = skv_malloc(sizeof(float) * rows * c->d);
        if (!Q->U || !Q->sel || !Q->K || !Q->V) return skv_error(SKV_ENOMEM, "quest: out of memory for the scratch");
    }
    return 0;
}

/* Copies the rows of the selected pages and of the last page (positions
 * last*page..T-1) of KV head kh into Q's buffers; returns the row count. */
static int gather(const kv_qu *c, const qu_layer *L, int kh, qu_qhead *Q, int last, int T) {
    int n = 0;
    for (int i = 0; i <= Q->n_sel; i++) {
        int j = i < Q->n_sel ? Q->sel[i] : last;
        int t1 = (j + 1) * c->page < T ? (j + 1) * c->page : T;
        kv_gather_rows(L->k, L->v, c->kvd, kh, c->d, j * c->page, t1, Q->K, Q->V, &n);
    }
    return n;
}

static void emit_selection(kv_qu *c, int layer) {
    for (int kh = 0; kh < c->h; kh++) {
        int n = 0;
        for (int g = 0; g < c->group; g++) {
            const qu_qhead *Q = &c->qh[kh * c->group + g];
            for (int i = 0; i < Q->n_sel; i++) {
                int j = Q->sel[i];
                float u = Q->U[j];
                if (!c->mark[j]) {
                    c->mark[j] = 1;
                    c->ev_sel[n] = j;
                    c->ev_score[n++] = u;
                } else {
                    for (int m = 0; m < n; m++)
                        if (c->ev_sel[m] == j && u > c->ev_score[m]) c->ev_score[m] = u;
                }
            }
        }
        for (int i = 0; i < n; i++) c->mark[c->ev_sel[i]] = 0;
        probe_event ev = {.kind = PROBE_DECODE_HEAD, .decode_head = {
            .step = c->base.step, .layer = layer, .head = kh, .block = c->page, .n_sel = n,
            .sel = c->ev_sel, .score = c->ev_score}};
        probe_emit(c->base.bus, &ev);
    }
}

/* The bound gap, for the first query head of each KV head's group: the
 * page bounds U it scored (page_bound) and the true max q·k of each page
 * (page_max); page_bound's value is the rank under U of the page whose true
 * max is highest (0: Quest ranks the best page first), page_max's value is
 * that page. The current (last) page is never scored and is left out. */
static void emit_bounds(kv_qu *c, const qu_layer *L, int layer, const float *q, int last) {
    int d = c->d;
    for (int kh = 0; kh < c->h && last > 0; kh++) {
        int hq = kh * c->group;
        const float *qh = q + (size_t)hq * d, *U = c->qh[hq].U;
        int best = 0;
        for (int j = 0; j < last; j++) {
            float m = -INFINITY;
            for (int t = j * c->page; t < (j + 1) * c->page; t++) {
                float a = vec_dot(qh, L->k + (size_t)t * c->kvd + (size_t)kh * d, d);
                m = a > m ? a : m;
            }
            c->ev_max[j] = m;
            if (m > c->ev_max[best]) best = j;
        }
        int rank = 0;
        for (int j = 0; j < last; j++) rank += U[j] > U[best];
        probe_emit_metric(c->base.bus, "page_bound", c->base.step, layer, kh, (float)rank, last, U);
        probe_emit_metric(c->base.bus, "page_max", c->base.step, layer, kh, (float)best, last, c->ev_max);
    }
}

static int decode(kv_qu *c, int layer, int pos, const float *q, float *out) {
    qu_layer *L = &c->L[layer];
    const skv_backend *be = c->base.shape.be;
    int T = pos + 1, d = c->d, n_pages = (T + c->page - 1) / c->page, last = n_pages - 1;
    float scale = 1.0f / sqrtf((float)d);
    if (layer == 0) {
        c->steps++;
        c->step_read_bytes = 0;
        c->last_pages = n_pages;
    }
    uint64_t bytes = 0;
    L->dense = layer < c->dense_layers || n_pages <= c->k + 1;
    if (L->dense) {
        int rc = kv_attend_all(&c->base.shape, q, L->k, L->v, T, c->kvd, (size_t)d, out);
        if (rc) return rc;
        bytes = (uint64_t)2 * T * c->kvd * sizeof(float);
    } else {
        if (c->group_max) {
            #pragma omp parallel for schedule(static) if (c->h > 1)
            for (int kh = 0; kh < c->h; kh++) {
                float *gm = c->gmax + (size_t)kh * c->max_pages;
                for (int g = 0; g < c->group; g++) {
                    qu_qhead *Q = &c->qh[kh * c->group + g];
                    be->page_score(q + (size_t)(kh * c->group + g) * d, d, L->mn + (size_t)kh * d,
                                   L->mx + (size_t)kh * d, c->kvd, last, Q->U);
                    for (int j = 0; j < last; j++) gm[j] = g == 0 || Q->U[j] > gm[j] ? Q->U[j] : gm[j];
                }
                qu_qhead *Q0 = &c->qh[kh * c->group];
                Q0->n_sel = be->topk(gm, last, c->k, Q0->sel);
                for (int g = 1; g < c->group; g++) {
                    qu_qhead *Q = &c->qh[kh * c->group + g];
                    Q->n_sel = Q0->n_sel;
                    memcpy(Q->sel, Q0->sel, sizeof(int) * (size_t)Q0->n_sel);
                }
            }
        }
        #pragma omp parallel for schedule(dynamic, 1) if (c->nh > 1)
        for (int hq = 0; hq < c->nh; hq++) {
            int kh = hq / c->group;
            qu_qhead *Q = &c->qh[hq];
            if (!c->group_max) {
                be->page_score(q + (size_t)hq * d, d, L->mn + (size_t)kh * d, L->mx + (size_t)kh * d, c->kvd, last,
                               Q->U);
                Q->n_sel = be->topk(Q->U, last, c->k, Q->sel);
            }
            int rows = gather(c, L, kh, Q, last, T);
            be->attend_rows(q + (size_t)hq * d, Q->K, Q->V, rows, d, d, scale, out + (size_t)hq * d);
        }
        /* Read: the bounds of the scored pages, once per KV head, and the
         * distinct rows the group attended. */
        for (int kh = 0; kh < c->h; kh++) {
            int rows = 0;
            for (int g = 0; g < c->group; g++) {
                const qu_qhead *Q = &c->qh[kh * c->group + g];
                for (int i = 0; i < Q->n_sel; i++)
                    if (!c->mark[Q->sel[i]]++) rows += c->page;
            }
            for (int g = 0; g < c->group; g++) {
                const qu_qhead *Q = &c->qh[kh * c->group + g];
                for (int i = 0; i < Q->n_sel; i++) c->mark[Q->sel[i]] = 0;
            }
            rows += T - last * c->page;
            bytes += (uint64_t)2 * last * d * sizeof(float) + (uint64_t)2 * rows * d * sizeof(float);
        }
        if (probe_wants(c->base.bus, PROBE_DECODE_HEAD)) emit_selection(c, layer);
        if (probe_wants(c->base.bus, PROBE_METRIC)) emit_bounds(c, L, layer, q, last);
    }
    c->step_read_bytes += bytes;
    c->read_bytes += bytes;
    return 0;
}

static int qu_attend(kv_cache *base, int layer, int pos, int n, const float *q, float *out) {
    kv_qu *c = (kv_qu *)base;
    const kv_shape *sh = &base->shape;
    int rc = kv_rows_check(&c->rows, layer, pos, n);
    if (rc) return rc;
    if (!c->prompt || n > 1) {
        sh->be->attend_causal(q, n, pos, sh->n_heads, sh->n_kv_heads, sh->head_dim, c->L[layer].k, c->L[layer].v,
                              c->kvd, (size_t)sh->head_dim, out);
        return 0;
    }
    return decode(c, layer, pos, q, out);
}

static int qu_end_prefill(kv_cache *base) {
    kv_qu *c = (kv_qu *)base;
    c->prompt = c->rows.n;
    c->budget = kv_budget_tokens(&c->o, c->prompt);
    int kb = c->budget / c->page; /* pages the budget holds, the last one included */
    c->k = kb > 1 ? kb - 1 : 0;
    if (c->k == 0) /* under the floor, qu_floor */
        snprintf(base->notice, sizeof base->notice,
                 "quest: a budget of %d tokens is under 2 pages of %d (the current page and one selected); attending "
                 "the current page only", c->budget, c->page);
    return alloc_scratch(c);
}

static void qu_bytes(const kv_cache *base, size_t *resident, size_t *offloaded) {
    const kv_qu *c = (const kv_qu *)base;
    size_t pages = (size_t)(c->rows.n + c->page - 1) / c->page;
    *resident = (size_t)base->shape.n_layers * ((size_t)2 * c->rows.n + 2 * pages) * c->kvd * sizeof(float);
    *offloaded = 0;
}

static int qu_kept(const kv_cache *base, int layer, int hq, int *pos, int *unit) {
    const kv_qu *c = (const kv_qu *)base;
    const qu_layer *L = &c->L[layer];
    int T = c->rows.n, n = 0;
    *unit = c->page;
    /* The layer's last decode attend was at the newest position of layer 0
     * once layer 0 has appended; layers run in turn, so T is that of this step. */
    if (L->dense || !c->qh) {
        for (int t = 0; t < T; t++) pos[n++] = t;
        return n;
    }
    const qu_qhead *Q = &c->qh[hq];
    int last = (T + c->page - 1) / c->page - 1;
    for (int i = 0; i <= Q->n_sel; i++) {
        int j = i < Q->n_sel ? Q->sel[i] : last;
        int t1 = (j + 1) * c->page < T ? (j + 1) * c->page : T;
        for (int t = j * c->page; t < t1; t++) pos[n++] = t;
    }
    return n;
}

static const kv_stat_def qu_stat_defs[] = {
    {"prompt_len", "tokens", "tokens in the prompt"},
    {"page", "tokens", "tokens per page"},
    {"pages", "pages", "pages at the last decode step"},
    {"k", "pages", "pages attended per query head besides the current one"},
    {"budget_tokens", "tokens", "tokens attended per query head: (k + 1) * page"},
    {"dense_layers", "", "leading layers attended densely"},
    {"steps", "", "decode steps attended"},
    {"step_read_bytes", "B", "bytes read in the last decode step: page bounds scored and rows attended"},
    {"read_bytes", "B", "bytes read over all decode steps"},
    {"step_fetch_bytes", "B", "bytes fetched from slow memory in the last step (Quest offloads nothing)"},
    {"resident", "B", "bytes resident: keys, values and page bounds"},
    {"offloaded", "B", "bytes offloaded (none)"},
};

static void qu_stats(const kv_cache *base, double *v) {
    const kv_qu *c = (const kv_qu *)base;
    size_t res, off;
    qu_bytes(base, &res, &off);
    /* k as attended: no more than the pages before the current one (a short prompt has fewer than k) */
    int k = c->last_pages > 0 && c->last_pages - 1 < c->k ? c->last_pages - 1 : c->k;
    double out[] = {
        c->prompt ? c->prompt : c->rows.n, c->page, c->last_pages, c->prompt ? k : NAN,
        c->prompt ? (double)(k + 1) * c->page : NAN, c->dense_layers, (double)c->steps,
        (double)c->step_read_bytes, (double)c->read_bytes, 0, (double)res, (double)off,
    };
    _Static_assert(sizeof out / sizeof out[0] == sizeof qu_stat_defs / sizeof qu_stat_defs[0], "one value per stat");
    memcpy(v, out, sizeof out);
}

static void qu_free(kv_cache *base) {
    kv_qu *c = (kv_qu *)base;
    kv_rows_free(&c->rows);
    free(c->L);
    for (int i = 0; c->qh && i < c->nh; i++) {
        free(c->qh[i].U); free(c->qh[i].sel); free(c->qh[i].K); free(c->qh[i].V);
    }
    free(c->qh);
    free(c->gmax); free(c->mark); free(c->ev_sel); free(c->ev_score); free(c->ev_max);
    free(c);
}

/* Options and defaults of the Quest code (PEERS.md). */
static int qu_floor(const kv_opts *o, char *why, size_t n) {
    int p = kv_opt_int(o, &kv_policy_quest, "page");
    snprintf(why, n, "2 pages of %d tokens (%d tokens): the page holding the current token is always kept, so a "
             "smaller budget selects nothing beyond it", p, 2 * p);
    return 2 * p;
}

static const kv_opt_def qu_opt_defs[] = {
    {"page", "--page", KV_OPT_INT, 16, 1, 4096, "tokens per page"},
    {"dense_layers", NULL, KV_OPT_INT, 0, 0, 1 << 16, "leading layers attended densely (the paper: 2; 0 so every layer is compared, docs/PEERS.md)"},
    {"group_max", NULL, KV_OPT_FLAG, 0, 0, 1, "one page set per KV head by the max over its query heads"},
};

static int qu_create(const kv_opts *o, const kv_shape *shape, kv_cache **out);

const kv_class kv_policy_quest = {
    .name = "quest",
    .summary = "page min/max key bounds, top pages per query head by the q·k bound, nothing offloaded "
               "(Tang et al., ICML 2024)",
    .opts = qu_opt_defs,
    .n_opts = sizeof qu_opt_defs / sizeof qu_opt_defs[0],
    .budgeted = 1,
    .stat_defs = qu_stat_defs,
    .n_stats = sizeof qu_stat_defs / sizeof qu_stat_defs[0],
    .create = qu_create,
    .append = qu_append,
    .attend = qu_attend,
    .end_prefill = qu_end_prefill,
    .bytes = qu_bytes,
    .stats = qu_stats,
    .kept = qu_kept,
    .free = qu_free,
    .floor = qu_floor,
};

static int qu_create(const kv_opts *o, const kv_shape *shape, kv_cache **out) {
    *out = NULL;
    const kv_class *p = &kv_policy_quest;
    void *cv, *lv;
    int rc = kv_policy_alloc(p, shape, o, sizeof(kv_qu), sizeof(qu_layer), &cv, &lv);
    if (rc) return rc;
    kv_qu *c = cv;
    c->L = lv;
    c->page = kv_opt_int(o, p, "page");
    c->dense_layers = kv_opt_int(o, p, "dense_layers");
    c->group_max = kv_opt_int(o, p, "group_max");
    c->o = *o;
    c->h = shape->n_kv_heads;
    c->d = shape->head_dim;
    c->kvd = c->h * c->d;
    c->nh = shape->n_heads;
    c->group = c->nh / c->h;
    c->max_pages = (shape->max_ctx + c->page - 1) / c->page;
    kv_rows_init(&c->rows, p->name, &c->base.shape, c->L, sizeof *c->L, qu_arrays, sizeof qu_arrays / sizeof qu_arrays[0], c->page);
    *out = &c->base;
    return 0;
}
