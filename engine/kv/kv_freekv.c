/* kv_freekv.c: the FreeKV KV policy (Liu et al. 2025) on the CPU, after its
 * accuracy code (PEERS.md says where the system code differs).
 *
 * The first `sink` tokens and a window that ends at the current token stay
 * resident; everything else lives in pages of `page` tokens in the offload
 * store (here the policy's own arrays, every read of which is a counted
 * fetch), each page summarised by the min and max of its post-RoPE keys per
 * KV head. Generated tokens join pages once they leave the window, exactly
 * like prompt tokens. The window holds whole pages plus the partial tail,
 * one page fewer when the tail is over half full.
 *
 * Each decode step, in layers past the first `dense_layers` and once the
 * context exceeds the budget B: every query head of a KV head scores each
 * candidate page (full pages after the sink, before the window) with
 * U = Σ_c max(q_c·min_c, q_c·max_c); a softmax over the candidates per head
 * and the mean over the group (avgSM; `avg_raw` averages raw U instead, as
 * the CUDA path does) give one score per page, and the top (B - sink -
 * window) / page pages are attended with the sink and the window.
 * Speculation: the pages are picked with the previous step's query of the
 * layer; a KV head whose group-mean cosine between this query and the
 * previous one falls below tau is corrected: it re-picks with this query.
 * The first decode step picks with its own query. A page cache per KV head
 * holds the last step's pages; only pages not in it are fetched. */
#include "kv.h"
#include "kv_rows.h"
#include "probe.h"
#include "skv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *k, *v;      /* (cap, kvd) post-RoPE keys and values (the offload store and the resident rows; kv_rows) */
    float *mn, *mx;    /* (cap_pages, kvd) page bounds on the absolute page grid (kv_rows) */
    float *q_prev;     /* (n_heads * d) the layer's query at the previous decode step */
    int has_prev;
    int dense;         /* last decode attend read every position */
    int **cache;       /* (n_kv_heads) -> (k) pages held from the previous step, -1: empty */
    int *n_cache;      /* (n_kv_heads) */
} fk_layer;

/* Per KV head scratch (shared by the layers, which run in turn). */
typedef struct {
    float *U, *acc, *tmp; /* (max_pages) */
    int *sel;             /* (k) selected absolute page ids, best first */
    float *sel_score;     /* (k) */
    int n_sel, misses, corrected;
    float cos;            /* group-mean cosine of this query with the previous one, NAN at the first step */
    float *K, *V;         /* (rows, d) sink + selected pages + window */
    int rows;
} fk_head;

typedef struct {
    kv_cache base;
    kv_opts o;
    int page, sink, window, dense_layers, avg_raw;
    float tau;
    int h, d, kvd, group, nh;
    int max_pages, prompt, budget, k;
    kv_rows rows;              /* the layers' keys, values and page bounds; rows.n: positions in layer 0 */
    int ws;                    /* window start of the last decode step */
    fk_layer *L;
    fk_head *hd;               /* (n_kv_heads) */
    uint64_t steps, hits, misses, fetch_bytes, corrections, decisions;
    uint64_t step_hits, step_misses, step_fetch_bytes, step_corrections;
    int *mark;                 /* (max_pages) */
} kv_fk;

static const kv_rows_array fk_arrays[] = {
    {offsetof(fk_layer, k), KV_ROWS_KEYS},
    {offsetof(fk_layer, v), KV_ROWS_VALUES},
    {offsetof(fk_layer, mn), KV_ROWS_PAGE_MIN},
    {offsetof(fk_layer, mx), KV_ROWS_PAGE_MAX},
};

static int fk_append(kv_cache *base, int layer, int pos, int n, const float *k_pre, const float *k, const float *v) {
    (void)k_pre;
    return kv_rows_append(&((kv_fk *)base)->rows, layer, pos, n, k, v);
}

static float cosine(const float *a, const float *b, int d) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < d; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return aa > 0 && bb > 0 ? (float)(ab / sqrt(aa * bb)) : 0.0f;
}

/* Scores the n_cand candidate pages (absolute ids p0..p0+n_cand-1) of KV head
 * kh with the group's queries q and picks the top k into H->sel. */
static void pick(kv_fk *c, const fk_layer *L, int kh, const float *q, int p0, int n_cand) {
    fk_head *H = &c->hd[kh];
    const skv_backend *be = c->base.shape.be;
    int d = c->d;
    for (int j = 0; j < n_cand; j++) H->acc[j] = 0;
    for (int g = 0; g < c->group; g++) {
        be->page_score(q + (size_t)(kh * c->group + g) * d, d, L->mn + (size_t)p0 * c->kvd + (size_t)kh * d,
                       L->mx + (size_t)p0 * c->kvd + (size_t)kh * d, c->kvd, n_cand, H->U);
        if (c->avg_raw) {
            for (int j = 0; j < n_cand; j++) H->acc[j] += H->U[j] / c->group;
            continue;
        }
        float mx = -INFINITY;
        for (int j = 0; j < n_cand; j++) mx = H->U[j] > mx ? H->U[j] : mx;
        double z = 0;
        for (int j = 0; j < n_cand; j++) z += H->tmp[j] = expf(H->U[j] - mx);
        for (int j = 0; j < n_cand; j++) H->acc[j] += (float)(H->tmp[j] / z / c->group);
    }
    int k = be->topk(H->acc, n_cand, c->k, H->sel);
    for (int i = 0; i < k; i++) {
        H->sel_score[i] = H->acc[H->sel[i]];
        H->sel[i] += p0;
    }
    H->n_sel = k;
}

/* Gathers sink, the selected pages and the window [ws, T) of KV head kh. */
static void gather(const kv_fk *c, const fk_layer *L, int kh, fk_head *H, int ws, int T) {
    int n = 0;
    kv_gather_rows(L->k, L->v, c->kvd, kh, c->d, 0, c->sink < T ? c->sink : T, H->K, H->V, &n);
    for (int i = 0; i < H->n_sel; i++)
        kv_gather_rows(L->k, L->v, c->kvd, kh, c->d, H->sel[i] * c->page, (H->sel[i] + 1) * c->page, H->K, H->V, &n);
    kv_gather_rows(L->k, L->v, c->kvd, kh, c->d, ws, T, H->K, H->V, &n);
    H->rows = n;
}

/* Page-cache bookkeeping of KV head kh: misses are selected pages that the
 * previous step did not hold; the cache then holds this selection. */
static void cache_update(kv_fk *c, fk_layer *L, int kh) {
    fk_head *H = &c->hd[kh];
    int *cache = L->cache[kh];
    H->misses = 0;
    for (int i = 0; i < H->n_sel; i++) {
        int hit = 0;
        for (int j = 0; j < L->n_cache[kh] && !hit; j++) hit = cache[j] == H->sel[i];
        H->misses += !hit;
    }
    memcpy(cache, H->sel, sizeof(int) * (size_t)H->n_sel);
    L->n_cache[kh] = H->n_sel;
}

static int decode(kv_fk *c, int layer, int pos, const float *q, float *out) {
    fk_layer *L = &c->L[layer];
    const skv_backend *be = c->base.shape.be;
    int T = pos + 1, d = c->d, p = c->page;
    float scale = 1.0f / sqrtf((float)d);
    if (layer == 0) {
        c->steps++;
        c->step_hits = c->step_misses = c->step_fetch_bytes = c->step_corrections = 0;
    }
    L->dense = layer < c->dense_layers || T <= c->budget;
    if (L->dense) {
        int rc = kv_attend_all(&c->base.shape, q, L->k, L->v, T, c->kvd, (size_t)d, out);
        if (rc) return rc;
    } else {
        int sp = c->sink / p, nfull = (T - c->sink) / p, tail = (T - c->sink) % p, wp = c->window / p;
        int win_full = tail > p / 2 ? wp - 1 : wp;
        if (win_full < 0) win_full = 0;
        if (win_full > nfull) win_full = nfull;
        int n_cand = nfull - win_full, ws = c->sink + n_cand * p;
        /* a correction re-picks: none, and no decision toward the rate, where
         * nothing can be picked (a budget of the sink and window alone, or no
         * candidate page yet) */
        int picks = c->k > 0 && n_cand > 0;
        c->ws = ws;
        #pragma omp parallel for schedule(dynamic, 1) if (c->h > 1)
        for (int kh = 0; kh < c->h; kh++) {
            fk_head *H = &c->hd[kh];
            const float *qs = q;
            H->corrected = 0;
            H->cos = NAN;
            if (L->has_prev) {
                double cs = 0;
                for (int g = 0; g < c->group; g++)
                    cs += cosine(q + (size_t)(kh * c->group + g) * d, L->q_prev + (size_t)(kh * c->group + g) * d, d);
                H->cos = (float)(cs / c->group);
                H->corrected = picks && H->cos < c->tau;
                if (!H->corrected) qs = L->q_prev;
            }
            pick(c, L, kh, qs, sp, n_cand);
            cache_update(c, L, kh);
            gather(c, L, kh, H, ws, T);
            for (int g = 0; g < c->group; g++) {
                int hq = kh * c->group + g;
                be->attend_rows(q + (size_t)hq * d, H->K, H->V, H->rows, d, d, scale, out + (size_t)hq * d);
            }
        }
        for (int kh = 0; kh < c->h; kh++) {
            const fk_head *H = &c->hd[kh];
            uint64_t b = (uint64_t)H->misses * p * d * 2 * sizeof(float);
            c->step_hits += (uint64_t)(H->n_sel - H->misses);
            c->step_misses += (uint64_t)H->misses;
            c->step_fetch_bytes += b;
            c->hits += (uint64_t)(H->n_sel - H->misses);
            c->misses += (uint64_t)H->misses;
            c->fetch_bytes += b;
            if (L->has_prev && picks) {
                c->decisions++;
                c->corrections += (uint64_t)H->corrected;
                c->step_corrections += (uint64_t)H->corrected;
            }
        }
        if (probe_wants(c->base.bus, PROBE_DECODE_HEAD))
            for (int kh = 0; kh < c->h; kh++) {
                const fk_head *H = &c->hd[kh];
                probe_event ev = {.kind = PROBE_DECODE_HEAD, .decode_head = {
                    .step = c->base.step, .layer = layer, .head = kh, .block = p,
                    .fetch_bytes = (uint64_t)H->misses * p * d * 2 * sizeof(float), .n_sel = H->n_sel,
                    .hits = H->n_sel - H->misses, .misses = H->misses, .sel = H->sel, .score = H->sel_score}};
                probe_emit(c->base.bus, &ev);
            }
        /* The corrections map: the group's query cosine with the previous
         * step and whether it fell below tau (the correction ran). */
        if (L->has_prev && probe_wants(c->base.bus, PROBE_METRIC))
            for (int kh = 0; kh < c->h; kh++) {
                const fk_head *H = &c->hd[kh];
                probe_emit_metric(c->base.bus, "query_cos", c->base.step, layer, kh, H->cos, 0, NULL);
                probe_emit_metric(c->base.bus, "corrected", c->base.step, layer, kh, (float)H->corrected, 0, NULL);
            }
    }
    memcpy(L->q_prev, q, sizeof(float) * (size_t)c->nh * d);
    L->has_prev = 1;
    return 0;
}

static int fk_attend(kv_cache *base, int layer, int pos, int n, const float *q, float *out) {
    kv_fk *c = (kv_fk *)base;
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

static int fk_end_prefill(kv_cache *base) {
    kv_fk *c = (kv_fk *)base;
    c->prompt = c->rows.n;
    c->budget = kv_budget_tokens(&c->o, c->prompt);
    int sel = c->budget - c->sink - c->window;
    c->k = sel > 0 ? sel / c->page : 0;
    if (sel < c->page && c->budget < c->prompt)
        snprintf(base->notice, sizeof base->notice,
                 "freekv: a budget of %d tokens leaves no page to select after the sink (%d) and window (%d); "
                 "attending those only", c->budget, c->sink, c->window);
    int mp = c->max_pages, kk = c->k > 0 ? c->k : 1;
    size_t rows = (size_t)c->sink + (size_t)c->k * c->page + (size_t)c->window + 2 * (size_t)c->page;
    if (!(c->hd = skv_calloc((size_t)c->h, sizeof *c->hd)) || !(c->mark = skv_calloc((size_t)mp, sizeof(int))))
        return skv_error(SKV_ENOMEM, "out of memory");
    for (int kh = 0; kh < c->h; kh++) {
        fk_head *H = &c->hd[kh];
        H->U = skv_malloc(sizeof(float) * (size_t)mp);
        H->acc = skv_malloc(sizeof(float) * (size_t)mp);
        H->tmp = skv_malloc(sizeof(float) * (size_t)mp);
        H->sel = skv_malloc(sizeof(int) * (size_t)kk);
        H->sel_score = skv_malloc(sizeof(float) * (size_t)kk);
        H->K = skv_malloc(sizeof(float) * rows * c->d);
        H->V = skv_malloc(sizeof(float) * rows * c->d);
        if (!H->U || !H->acc || !H->tmp || !H->sel || !H->sel_score || !H->K || !H->V)
            return skv_error(SKV_ENOMEM, "freekv: out of memory for the scratch");
    }
    for (int l = 0; l < base->shape.n_layers; l++) {
        fk_layer *L = &c->L[l];
        L->q_prev = skv_malloc(sizeof(float) * (size_t)c->nh * c->d);
        L->cache = skv_calloc((size_t)c->h, sizeof(int *));
        L->n_cache = skv_calloc((size_t)c->h, sizeof(int));
        if (!L->q_prev || !L->cache || !L->n_cache) return skv_error(SKV_ENOMEM, "out of memory");
        for (int kh = 0; kh < c->h; kh++)
            if (!(L->cache[kh] = skv_malloc(sizeof(int) * (size_t)kk))) return skv_error(SKV_ENOMEM, "out of memory");
    }
    return 0;
}

static void fk_bytes(const kv_cache *base, size_t *resident, size_t *offloaded) {
    const kv_fk *c = (const kv_fk *)base;
    size_t f = sizeof(float), kvd = (size_t)c->kvd, n = (size_t)c->rows.n, pages = (n + c->page - 1) / c->page;
    size_t nl = (size_t)base->shape.n_layers;
    if (!c->prompt || n <= (size_t)c->budget) { /* dense while the context fits the budget */
        *resident = nl * 2 * n * kvd * f;
        *offloaded = 0;
        return;
    }
    size_t keep = (size_t)c->sink + (size_t)c->window + (size_t)c->k * c->page; /* sink, window, page cache */
    if (keep > n) keep = n;
    *resident = nl * (2 * keep * kvd * f + 2 * pages * kvd * f);
    *offloaded = nl * 2 * (n > (size_t)c->sink ? n - (size_t)c->sink : 0) * kvd * f;
}

static int fk_kept(const kv_cache *base, int layer, int hq, int *pos, int *unit) {
    const kv_fk *c = (const kv_fk *)base;
    const fk_layer *L = &c->L[layer];
    int T = c->rows.n, n = 0;
    *unit = c->page;
    if (L->dense || !c->hd) {
        for (int t = 0; t < T; t++) pos[n++] = t;
        return n;
    }
    const fk_head *H = &c->hd[hq / c->group];
    for (int t = 0; t < c->sink && t < T; t++) pos[n++] = t;
    for (int i = 0; i < H->n_sel; i++)
        for (int t = H->sel[i] * c->page; t < (H->sel[i] + 1) * c->page; t++) pos[n++] = t;
    for (int t = c->ws; t < T; t++) pos[n++] = t;
    return n;
}

static const kv_stat_def fk_stat_defs[] = {
    {"prompt_len", "tokens", "tokens in the prompt"},
    {"page", "tokens", "tokens per page"},
    {"k", "pages", "pages selected per KV head and step (0 while the context fits the budget: attended whole)"},
    {"dense_layers", "", "leading layers attended densely"},
    {"steps", "", "decode steps attended"},
    {"corrections", "", "(step, layer, KV head) picks redone with the current query (cosine < tau)"},
    {"correction_rate", "%", "corrections / speculative picks"},
    {"step_corrections", "", "corrections in the last decode step"},
    {"hits", "pages", "page cache hits, all layers, heads and steps"},
    {"misses", "pages", "page cache misses (pages fetched)"},
    {"hit_rate", "%", "hits / (hits + misses)"},
    {"fetch_bytes", "B", "key and value bytes fetched from the offload store"},
    {"step_hits", "pages", "cache hits of the last decode step"},
    {"step_misses", "pages", "cache misses of the last decode step"},
    {"step_fetches", "pages", "pages fetched in the last decode step"},
    {"step_fetch_bytes", "B", "bytes fetched in the last decode step"},
    {"resident", "B", "bytes resident: sink, window, page cache and page bounds"},
    {"offloaded", "B", "bytes in the offload store (every token after the sink)"},
};

static void fk_stats(const kv_cache *base, double *v) {
    const kv_fk *c = (const kv_fk *)base;
    size_t res, off;
    fk_bytes(base, &res, &off);
    double hm = (double)c->hits + c->misses;
    /* k as selected: no more than the candidate pages between the sink and the window at the last step (none
     * while the context fits the budget and is attended whole) */
    int cand = c->steps > 0 ? (c->ws - c->sink) / c->page : c->k, k = cand < c->k ? cand : c->k;
    k = k > 0 ? k : 0;
    double out[] = {
        c->prompt ? c->prompt : c->rows.n, c->page, c->prompt ? k : NAN, c->dense_layers, (double)c->steps,
        (double)c->corrections, c->decisions ? 100.0 * c->corrections / c->decisions : NAN,
        (double)c->step_corrections, (double)c->hits, (double)c->misses, hm > 0 ? 100 * c->hits / hm : NAN,
        (double)c->fetch_bytes, (double)c->step_hits, (double)c->step_misses, (double)c->step_misses,
        (double)c->step_fetch_bytes, (double)res, (double)off,
    };
    _Static_assert(sizeof out / sizeof out[0] == sizeof fk_stat_defs / sizeof fk_stat_defs[0], "one value per stat");
    memcpy(v, out, sizeof out);
}

static void fk_free(kv_cache *base) {
    kv_fk *c = (kv_fk *)base;
    for (int l = 0; c->L && l < base->shape.n_layers; l++) {
        fk_layer *L = &c->L[l];
        free(L->q_prev);
        for (int kh = 0; L->cache && kh < c->h; kh++) free(L->cache[kh]);
        free(L->cache); free(L->n_cache);
    }
    kv_rows_free(&c->rows);
    free(c->L);
    for (int kh = 0; c->hd && kh < c->h; kh++) {
        fk_head *H = &c->hd[kh];
        free(H->U); free(H->acc); free(H->tmp); free(H->sel); free(H->sel_score); free(H->K); free(H->V);
    }
    free(c->hd);
    free(c->mark);
    free(c);
}

/* Options and defaults of the FreeKV README's long-input commands (PEERS.md). */
static int fk_floor(const kv_opts *o, char *why, size_t n) {
    int p = kv_opt_int(o, &kv_policy_freekv, "page"), s = kv_opt_int(o, &kv_policy_freekv, "sink"),
        w = kv_opt_int(o, &kv_policy_freekv, "window");
    snprintf(why, n, "the sink (%d) + the window (%d) + 1 page of %d tokens (%d tokens): a smaller budget selects no "
             "page", s, w, p, s + w + p);
    return s + w + p;
}

static const kv_opt_def fk_opt_defs[] = {
    {"page", "--page", KV_OPT_INT, 32, 1, 4096, "tokens per page"},
    {"sink", NULL, KV_OPT_INT, 128, 0, 1 << 20, "first tokens always attended (a multiple of the page)"},
    {"window", NULL, KV_OPT_INT, 128, 0, 1 << 20, "recent tokens always attended (a multiple of the page)"},
    {"tau", NULL, KV_OPT_FLOAT, 0.8, -1, 1, "correct a KV head when its query cosine with the last step's is below this"},
    {"dense_layers", NULL, KV_OPT_INT, 0, 0, 1 << 16, "leading layers attended densely (the paper: 1; 0 so every layer is compared, docs/PEERS.md)"},
    {"avg_raw", NULL, KV_OPT_FLAG, 0, 0, 1, "average raw page scores over the group (avgS) instead of softmaxes (avgSM)"},
};

static int fk_create(const kv_opts *o, const kv_shape *shape, kv_cache **out);

const kv_class kv_policy_freekv = {
    .name = "freekv",
    .summary = "page bounds picked with the last step's query, corrected when the query turns, pages offloaded "
               "behind a page cache (Liu et al. 2025)",
    .opts = fk_opt_defs,
    .n_opts = sizeof fk_opt_defs / sizeof fk_opt_defs[0],
    .budgeted = 1,
    .stat_defs = fk_stat_defs,
    .n_stats = sizeof fk_stat_defs / sizeof fk_stat_defs[0],
    .create = fk_create,
    .append = fk_append,
    .attend = fk_attend,
    .end_prefill = fk_end_prefill,
    .bytes = fk_bytes,
    .stats = fk_stats,
    .kept = fk_kept,
    .free = fk_free,
    .floor = fk_floor,
};

static int fk_create(const kv_opts *o, const kv_shape *shape, kv_cache **out) {
    *out = NULL;
    const kv_class *p = &kv_policy_freekv;
    int page = kv_opt_int(o, p, "page"), sink = kv_opt_int(o, p, "sink"), window = kv_opt_int(o, p, "window");
    if (sink % page || window % page)
        return skv_error(SKV_EINVAL, "freekv: sink (%d) and window (%d) must be multiples of the page (%d)", sink,
                         window, page);
    void *cv, *lv;
    int rc = kv_policy_alloc(p, shape, o, sizeof(kv_fk), sizeof(fk_layer), &cv, &lv);
    if (rc) return rc;
    kv_fk *c = cv;
    c->L = lv;
    c->o = *o;
    c->page = page;
    c->sink = sink;
    c->window = window;
    c->tau = (float)kv_opt(o, p, "tau");
    c->dense_layers = kv_opt_int(o, p, "dense_layers");
    c->avg_raw = kv_opt_int(o, p, "avg_raw");
    c->h = shape->n_kv_heads;
    c->d = shape->head_dim;
    c->kvd = c->h * c->d;
    c->nh = shape->n_heads;
    c->group = c->nh / c->h;
    c->max_pages = (shape->max_ctx + page - 1) / page;
    kv_rows_init(&c->rows, p->name, &c->base.shape, c->L, sizeof *c->L, fk_arrays, sizeof fk_arrays / sizeof fk_arrays[0],
                 page);
    *out = &c->base;
    return 0;
}
