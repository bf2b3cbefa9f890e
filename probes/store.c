/* store.c: the indexed copy of a run's events that the views query.
 *
 * Most events are kept whole (probe_event_dup, one allocation each) and
 * indexed by a growable grid of pointers: rows are steps (or one row for
 * prefill), columns are (layer, KV head). Spans are many and small, so they
 * are kept by value per step with their op names interned. */
#include "store.h"

#include "skv.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Limits for index fields when no PROBE_RUN gave the shape. */
#define STORE_MAX_LAYERS 4096
#define STORE_MAX_HEADS 1024
#define STORE_MAX_STEPS (1 << 20)
#define STORE_MAX_NEEDLES 1024
#define STORE_MAX_METHODS 64   /* methods of one needle sweep */
#define STORE_MAX_METRICS 64   /* distinct metric names */
#define STORE_MAX_METRIC_VALS (1 << 24)

/* Pointers to events by (row, layer, head); rows are allocated when first
 * used, so a far step costs one row pointer per step before it, not a row. */
typedef struct {
    probe_event ***row;   /* (cap_rows) each NULL or (n_l, n_h) */
    int cap_rows, n_l, n_h;
} grid;

typedef struct {
    probe_ev_span *v;     /* (n) op points at the store's interned names */
    int n, cap;
} span_list;

typedef struct {
    probe_event *info;    /* first event seen for this needle, or NULL */
    grid g;               /* rows: step + 1 */
} needle_data;

typedef struct {
    char *name;
    grid g;               /* rows: step + 1; columns: layer, head + 1 */
} metric_data;

struct probe_store {
    probe_event *run;
    probe_event **tok;    /* (n_tok) */
    int n_tok, cap_tok, n_prompt;
    int *step_tok;        /* (cap_step_tok) index into tok per step, -1 */
    int cap_step_tok;
    probe_event **layer;  /* (cap_layer) prefill per layer */
    int cap_layer;
    grid pre_head;        /* one row: prefill per (layer, head) */
    grid dec;             /* rows: decode step */
    grid orc;             /* rows: decode step; the oracle's measures */
    probe_event **step;   /* (cap_step) */
    int cap_step;
    span_list *spans;     /* (cap_spans) row = step + 1 */
    int cap_spans;
    char **ops;           /* (n_ops) interned op names */
    int n_ops;
    needle_data *needles; /* (n_needles) */
    int n_needles;
    probe_event **niah;   /* (n_niah) harness cases in arrival order */
    int n_niah, cap_niah;
    metric_data *metrics; /* (n_metrics) by name */
    int n_metrics;
    int n_steps, max_layer, max_head;   /* largest indexes seen + 1 */
    uint64_t count[PROBE_KIND_COUNT];
};

/* ---- growable arrays ----------------------------------------------------- */

/* arr (of *cap elements of size sz) reallocated to hold at least need
 * elements, new ones zeroed; NULL when out of memory (arr is then intact). */
static void *grow(void *arr, int *cap, int need, size_t sz) {
    if (need <= *cap) return arr;
    int nc = *cap ? *cap : 8;
    while (nc < need) nc = nc > INT_MAX / 2 ? need : nc * 2;
    char *p = realloc(arr, (size_t)nc * sz);
    if (!p) return NULL;
    memset(p + (size_t)*cap * sz, 0, (size_t)(nc - *cap) * sz);
    *cap = nc;
    return p;
}

/* Grows arr (a field) to hold need elements or returns SKV_ENOMEM. */
#define GROW(arr, cap, need) do { \
    void *p_ = grow((arr), &(cap), (need), sizeof *(arr)); \
    if (!p_) return skv_error(SKV_ENOMEM, "store: out of memory"); \
    (arr) = p_; \
} while (0)

static probe_event *grid_get(const grid *g, int row, int l, int h) {
    if (row < 0 || row >= g->cap_rows || !g->row[row] || l < 0 || l >= g->n_l || h < 0 || h >= g->n_h) return NULL;
    return g->row[row][(size_t)l * g->n_h + h];
}

/* The cell for (row, l, h), growing the grid to reach it; NULL when out of memory. */
static probe_event **grid_slot(grid *g, int row, int l, int h) {
    if (l >= g->n_l || h >= g->n_h) {
        int nl = l >= g->n_l ? l + 1 : g->n_l, nh = h >= g->n_h ? h + 1 : g->n_h;
        for (int r = 0; r < g->cap_rows; r++) {
            if (!g->row[r]) continue;
            probe_event **c = skv_calloc((size_t)nl * nh, sizeof *c);
            if (!c) return NULL;
            for (int i = 0; i < g->n_l; i++)
                for (int j = 0; j < g->n_h; j++) c[(size_t)i * nh + j] = g->row[r][(size_t)i * g->n_h + j];
            free(g->row[r]);
            g->row[r] = c;
        }
        g->n_l = nl;
        g->n_h = nh;
    }
    probe_event ***rows = grow(g->row, &g->cap_rows, row + 1, sizeof *g->row);
    if (!rows) return NULL;
    g->row = rows;
    if (!g->row[row] && !(g->row[row] = skv_calloc((size_t)g->n_l * g->n_h, sizeof **g->row))) return NULL;
    return &g->row[row][(size_t)l * g->n_h + h];
}

static void grid_free(grid *g) {
    for (int r = 0; r < g->cap_rows; r++) {
        if (!g->row[r]) continue;
        for (size_t i = 0; i < (size_t)g->n_l * g->n_h; i++) free(g->row[r][i]);
        free(g->row[r]);
    }
    free(g->row);
    memset(g, 0, sizeof *g);
}

/* Stores a copy of ev in *slot, replacing what was there. */
static int keep(probe_event **slot, const probe_event *ev) {
    probe_event *d = probe_event_dup(ev);
    if (!d) return skv_error(SKV_ENOMEM, "store: out of memory copying a %s event", probe_kind_name(ev->kind));
    free(*slot);
    *slot = d;
    return 0;
}

/* ---- lifetime ------------------------------------------------------------ */

int probe_store_new(probe_store **out) {
    *out = skv_calloc(1, sizeof **out);
    return *out ? 0 : skv_error(SKV_ENOMEM, "store: out of memory");
}

/* Frees everything the store holds and leaves it empty. */
static void store_clear(probe_store *st) {
    free(st->run);
    for (int i = 0; i < st->n_tok; i++) free(st->tok[i]);
    free(st->tok);
    free(st->step_tok);
    for (int i = 0; i < st->cap_layer; i++) free(st->layer[i]);
    free(st->layer);
    grid_free(&st->pre_head);
    grid_free(&st->dec);
    grid_free(&st->orc);
    for (int i = 0; i < st->cap_step; i++) free(st->step[i]);
    free(st->step);
    for (int i = 0; i < st->cap_spans; i++) free(st->spans[i].v);
    free(st->spans);
    for (int i = 0; i < st->n_ops; i++) free(st->ops[i]);
    free(st->ops);
    for (int i = 0; i < st->n_needles; i++) {
        free(st->needles[i].info);
        grid_free(&st->needles[i].g);
    }
    free(st->needles);
    for (int i = 0; i < st->n_niah; i++) free(st->niah[i]);
    free(st->niah);
    for (int i = 0; i < st->n_metrics; i++) {
        free(st->metrics[i].name);
        grid_free(&st->metrics[i].g);
    }
    free(st->metrics);
    memset(st, 0, sizeof *st);
}

void probe_store_free(probe_store *st) {
    if (!st) return;
    store_clear(st);
    free(st);
}

/* ---- checks -------------------------------------------------------------- */

static int lim_layers(const probe_store *st) {
    return st->run && st->run->run.n_layers > 0 ? st->run->run.n_layers : STORE_MAX_LAYERS;
}

static int lim_heads(const probe_store *st) {
    return st->run && st->run->run.n_kv_heads > 0 ? st->run->run.n_kv_heads : STORE_MAX_HEADS;
}

/* The bound for block (chunk, page) ids: a block holds at least one of the
 * context's positions. */
static int lim_chunks(const probe_store *st) {
    if (!st->run || st->run->run.max_ctx <= 0) return INT_MAX;
    return st->run->run.max_ctx;
}

/* One past the largest position count: max_ctx + 1 with a run event. */
static int lim_ctx(const probe_store *st) {
    if (!st->run || st->run->run.max_ctx <= 0) return INT_MAX;
    return st->run->run.max_ctx < INT_MAX ? st->run->run.max_ctx + 1 : INT_MAX;
}

static int check_range(const probe_event *ev, const char *field, int v, int lo, int hi) {
    if (v >= lo && v < hi) return 0;
    return skv_error(SKV_ERANGE, "store: %s event: %s = %d, expected %d..%d", probe_kind_name(ev->kind), field, v,
                     lo, hi - 1);
}

/* Ranks among at most hi blocks: -1 (not ranked) .. hi - 1. */
static int check_ranks(const probe_event *ev, const char *field, const int *r, int n, int hi) {
    for (int i = 0; r && i < n; i++)
        if (r[i] < -1 || r[i] >= hi)
            return skv_error(SKV_ERANGE, "store: %s event: %s[%d] = %d, expected -1..%d", probe_kind_name(ev->kind),
                             field, i, r[i], hi - 1);
    return 0;
}

static int check_ids(const probe_event *ev, const char *field, const int *ids, int n, int hi) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= hi)
            return skv_error(SKV_ERANGE, "store: %s event: %s[%d] = %d, expected 0..%d", probe_kind_name(ev->kind),
                             field, i, ids[i], hi - 1);
    return 0;
}

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int check_event(const probe_store *st, const probe_event *ev) {
    TRY(probe_event_check(ev));
    int L = lim_layers(st), H = lim_heads(st), C = lim_chunks(st);
    switch (ev->kind) {
    case PROBE_RUN:
        TRY(check_range(ev, "n_layers", ev->run.n_layers, 0, STORE_MAX_LAYERS + 1));
        TRY(check_range(ev, "n_kv_heads", ev->run.n_kv_heads, 0, STORE_MAX_HEADS + 1));
        break;
    case PROBE_TOKEN:
        TRY(check_range(ev, "step", ev->token.step, -1, STORE_MAX_STEPS));
        break;
    case PROBE_PREFILL_LAYER:
        TRY(check_range(ev, "layer", ev->prefill_layer.layer, 0, L));
        break;
    case PROBE_PREFILL_HEAD:
        TRY(check_range(ev, "layer", ev->prefill_head.layer, 0, L));
        TRY(check_range(ev, "head", ev->prefill_head.head, 0, H));
        TRY(check_ids(ev, "outliers", ev->prefill_head.outliers, ev->prefill_head.n_outliers, C));
        break;
    case PROBE_DECODE_HEAD:
        TRY(check_range(ev, "step", ev->decode_head.step, 0, STORE_MAX_STEPS));
        TRY(check_range(ev, "layer", ev->decode_head.layer, 0, L));
        TRY(check_range(ev, "head", ev->decode_head.head, 0, H));
        TRY(check_ids(ev, "sel", ev->decode_head.sel, ev->decode_head.n_sel, C));
        TRY(check_range(ev, "block", ev->decode_head.block, 0, lim_ctx(st)));
        TRY(check_range(ev, "n_sel", ev->decode_head.n_sel, 0, C == INT_MAX ? INT_MAX : C + 1));
        TRY(check_ranks(ev, "rank_exact", ev->decode_head.rank_exact, ev->decode_head.n_chunks, C));
        TRY(check_ranks(ev, "rank_landmark", ev->decode_head.rank_landmark, ev->decode_head.n_chunks, C));
        break;
    case PROBE_STEP:
        TRY(check_range(ev, "step", ev->step.step, 0, STORE_MAX_STEPS));
        break;
    case PROBE_SPAN:
        TRY(check_range(ev, "step", ev->span.step, -1, STORE_MAX_STEPS));
        TRY(check_range(ev, "layer", ev->span.layer, -1, L));
        break;
    case PROBE_NEEDLE:
        TRY(check_range(ev, "id", ev->needle.id, 0, STORE_MAX_NEEDLES));
        TRY(check_range(ev, "step", ev->needle.step, -1, STORE_MAX_STEPS));
        TRY(check_range(ev, "layer", ev->needle.layer, 0, L));
        TRY(check_range(ev, "head", ev->needle.head, 0, H));
        TRY(check_ids(ev, "chunks", ev->needle.chunks, ev->needle.n_chunks, C));
        if (ev->needle.n_info != 0 && ev->needle.n_info != ev->needle.n_chunks)
            return skv_error(SKV_EINVAL, "store: needle event: n_info = %d, expected 0 or n_chunks = %d",
                             ev->needle.n_info, ev->needle.n_chunks);
        /* values the diagnosis computes with (budgets = ranks x chunk) */
        TRY(check_ranks(ev, "rank", ev->needle.rank, ev->needle.n_chunks, C));
        TRY(check_range(ev, "k", ev->needle.k, 0, C == INT_MAX ? INT_MAX : C + 1));
        TRY(check_range(ev, "tok_begin", ev->needle.tok_begin, 0, lim_ctx(st)));
        TRY(check_range(ev, "tok_end", ev->needle.tok_end, ev->needle.tok_begin, lim_ctx(st)));
        if (ev->needle.n_info) {
            TRY(check_ranks(ev, "rank_exact", ev->needle.rank_exact, ev->needle.n_info, C));
            for (int i = 0; i < ev->needle.n_info; i++) TRY(check_range(ev, "part", ev->needle.part[i], 0, 3));
        }
        break;
    case PROBE_NIAH:
        TRY(check_range(ev, "method", ev->niah.method, 0, STORE_MAX_METHODS));
        TRY(check_range(ev, "index", ev->niah.index, 0, INT_MAX));
        TRY(check_range(ev, "length", ev->niah.length, 1, INT_MAX));
        if (!(ev->niah.depth >= 0 && ev->niah.depth <= 100))
            return skv_error(SKV_ERANGE, "store: niah event: depth = %g, expected 0..100", (double)ev->niah.depth);
        break;
    case PROBE_LANE: /* routing is probe_lanes' job; a plain store notes it and moves on */
        TRY(check_range(ev, "n_lanes", ev->lane.n_lanes, 1, 65));
        TRY(check_range(ev, "lane", ev->lane.lane, 0, ev->lane.n_lanes));
        break;
    case PROBE_ORACLE: {
        const probe_ev_oracle *o = &ev->oracle;
        TRY(check_range(ev, "step", o->step, 0, STORE_MAX_STEPS));
        TRY(check_range(ev, "layer", o->layer, 0, L));
        TRY(check_range(ev, "head", o->head, 0, H));
        TRY(check_range(ev, "n_q", o->n_q, 1, 4097));
        TRY(check_range(ev, "unit", o->unit, 1, INT_MAX));
        TRY(check_range(ev, "ctx", o->ctx, 1, lim_ctx(st)));
        TRY(check_range(ev, "n_kept", o->n_kept, 0, o->ctx + 1));
        TRY(check_range(ev, "n_gen", o->n_gen, 0, o->n_kept + 1));
        TRY(check_range(ev, "needle_len", o->needle_len, 0, o->ctx + 1));
        TRY(check_range(ev, "needle_kept", o->needle_kept, 0, o->needle_len + 1));
        TRY(check_range(ev, "needle_rank", o->needle_rank, -1, o->ctx));
        for (int i = 0; i < o->n_q; i++) TRY(check_range(ev, "q_kept", o->q_kept[i], 0, o->ctx + 1));
        break;
    }
    case PROBE_METRIC: {
        const probe_ev_metric *m = &ev->metric;
        TRY(check_range(ev, "step", m->step, -1, STORE_MAX_STEPS));
        TRY(check_range(ev, "layer", m->layer, 0, L));
        TRY(check_range(ev, "head", m->head, -1, H));
        TRY(check_range(ev, "n", m->n, 0, STORE_MAX_METRIC_VALS + 1));
        if (!m->name || !m->name[0] || strlen(m->name) > 63)
            return skv_error(SKV_EINVAL, "store: metric event: the name is empty or longer than 63 bytes");
        break;
    }
    default:
        return skv_error(SKV_EINVAL, "store: event kind %d is not known", (int)ev->kind);
    }
    return 0;
}

/* ---- ingest ---------------------------------------------------------------- */

static const char *intern_op(probe_store *st, const char *op) {
    if (!op) op = "";
    for (int i = 0; i < st->n_ops; i++)
        if (!strcmp(st->ops[i], op)) return st->ops[i];
    char **ops = realloc(st->ops, (size_t)(st->n_ops + 1) * sizeof *ops);
    if (!ops) return NULL;
    st->ops = ops;
    size_t n = strlen(op) + 1;
    char *s = malloc(n);
    if (!s) return NULL;
    memcpy(s, op, n);
    return st->ops[st->n_ops++] = s;
}

static void see_step(probe_store *st, int step) {
    if (step + 1 > st->n_steps) st->n_steps = step + 1;
}

static void see_lh(probe_store *st, int layer, int head) {
    if (layer + 1 > st->max_layer) st->max_layer = layer + 1;
    if (head + 1 > st->max_head) st->max_head = head + 1;
}

static int add_token(probe_store *st, const probe_event *ev) {
    GROW(st->tok, st->cap_tok, st->n_tok + 1);
    int step = ev->token.step;
    if (step >= 0 && step >= st->cap_step_tok) {
        int old = st->cap_step_tok;
        GROW(st->step_tok, st->cap_step_tok, step + 1);
        for (int i = old; i < st->cap_step_tok; i++) st->step_tok[i] = -1;
    }
    probe_event *d = NULL;
    TRY(keep(&d, ev));
    st->tok[st->n_tok] = d;
    if (step >= 0) { /* a token counts no step: the run's last is fed by none */
        st->step_tok[step] = st->n_tok;
    } else {
        st->n_prompt++;
    }
    st->n_tok++;
    return 0;
}

static int add_span(probe_store *st, const probe_event *ev) {
    int row = ev->span.step + 1;
    GROW(st->spans, st->cap_spans, row + 1);
    span_list *sl = &st->spans[row];
    GROW(sl->v, sl->cap, sl->n + 1);
    const char *op = intern_op(st, ev->span.op);
    if (!op) return skv_error(SKV_ENOMEM, "store: out of memory");
    sl->v[sl->n] = ev->span;
    sl->v[sl->n++].op = op;
    if (ev->span.step >= 0) see_step(st, ev->span.step);
    if (ev->span.layer >= 0) see_lh(st, ev->span.layer, 0);
    return 0;
}

static int add_needle(probe_store *st, const probe_event *ev) {
    const probe_ev_needle *n = &ev->needle;
    if (n->id >= st->n_needles) {
        needle_data *nd = realloc(st->needles, (size_t)(n->id + 1) * sizeof *nd);
        if (!nd) return skv_error(SKV_ENOMEM, "store: out of memory");
        memset(nd + st->n_needles, 0, (size_t)(n->id + 1 - st->n_needles) * sizeof *nd);
        st->needles = nd;
        st->n_needles = n->id + 1;
    }
    needle_data *nd = &st->needles[n->id];
    probe_event **slot = grid_slot(&nd->g, n->step + 1, n->layer, n->head);
    if (!slot) return skv_error(SKV_ENOMEM, "store: out of memory");
    if (!nd->info) TRY(keep(&nd->info, ev));
    TRY(keep(slot, ev));
    if (n->step >= 0) see_step(st, n->step);
    see_lh(st, n->layer, n->head);
    return 0;
}

static metric_data *find_metric(const probe_store *st, const char *name) {
    for (int i = 0; i < st->n_metrics; i++)
        if (!strcmp(st->metrics[i].name, name)) return &st->metrics[i];
    return NULL;
}

static int add_metric(probe_store *st, const probe_event *ev) {
    const probe_ev_metric *m = &ev->metric;
    metric_data *md = find_metric(st, m->name);
    if (!md) {
        if (st->n_metrics == STORE_MAX_METRICS)
            return skv_error(SKV_ERANGE, "store: more than %d metric names (at '%s')", STORE_MAX_METRICS, m->name);
        metric_data *nm = realloc(st->metrics, (size_t)(st->n_metrics + 1) * sizeof *nm);
        if (!nm) return skv_error(SKV_ENOMEM, "store: out of memory");
        st->metrics = nm;
        md = &nm[st->n_metrics];
        memset(md, 0, sizeof *md);
        size_t len = strlen(m->name) + 1;
        if (!(md->name = malloc(len))) return skv_error(SKV_ENOMEM, "store: out of memory");
        memcpy(md->name, m->name, len);
        st->n_metrics++;
    }
    probe_event **slot = grid_slot(&md->g, m->step + 1, m->layer, m->head + 1);
    if (!slot) return skv_error(SKV_ENOMEM, "store: out of memory");
    TRY(keep(slot, ev));
    if (m->step >= 0) see_step(st, m->step);
    see_lh(st, m->layer, m->head < 0 ? 0 : m->head);
    return 0;
}

int probe_store_add(probe_store *st, const probe_event *ev) {
    TRY(check_event(st, ev));
    if (ev->kind == PROBE_RUN) {
        int fresh = 1;
        for (int k = 0; k < PROBE_KIND_COUNT; k++) fresh &= st->count[k] == 0;
        probe_event *d = probe_event_dup(ev);
        if (!d) return skv_error(SKV_ENOMEM, "store: out of memory copying a run event");
        if (!fresh) store_clear(st);
        st->run = d;
        st->count[PROBE_RUN]++;
        return 0;
    }
    probe_event **slot;
    switch (ev->kind) {
    case PROBE_TOKEN:
        TRY(add_token(st, ev));
        break;
    case PROBE_PREFILL_LAYER:
        GROW(st->layer, st->cap_layer, ev->prefill_layer.layer + 1);
        TRY(keep(&st->layer[ev->prefill_layer.layer], ev));
        see_lh(st, ev->prefill_layer.layer, 0);
        break;
    case PROBE_PREFILL_HEAD:
        slot = grid_slot(&st->pre_head, 0, ev->prefill_head.layer, ev->prefill_head.head);
        if (!slot) return skv_error(SKV_ENOMEM, "store: out of memory");
        TRY(keep(slot, ev));
        see_lh(st, ev->prefill_head.layer, ev->prefill_head.head);
        break;
    case PROBE_DECODE_HEAD:
        slot = grid_slot(&st->dec, ev->decode_head.step, ev->decode_head.layer, ev->decode_head.head);
        if (!slot) return skv_error(SKV_ENOMEM, "store: out of memory");
        TRY(keep(slot, ev));
        see_step(st, ev->decode_head.step);
        see_lh(st, ev->decode_head.layer, ev->decode_head.head);
        break;
    case PROBE_ORACLE:
        slot = grid_slot(&st->orc, ev->oracle.step, ev->oracle.layer, ev->oracle.head);
        if (!slot) return skv_error(SKV_ENOMEM, "store: out of memory");
        TRY(keep(slot, ev));
        see_step(st, ev->oracle.step);
        see_lh(st, ev->oracle.layer, ev->oracle.head);
        break;
    case PROBE_STEP:
        GROW(st->step, st->cap_step, ev->step.step + 1);
        TRY(keep(&st->step[ev->step.step], ev));
        see_step(st, ev->step.step);
        break;
    case PROBE_SPAN:
        TRY(add_span(st, ev));
        break;
    case PROBE_NEEDLE:
        TRY(add_needle(st, ev));
        break;
    case PROBE_METRIC:
        TRY(add_metric(st, ev));
        break;
    case PROBE_NIAH:
        GROW(st->niah, st->cap_niah, st->n_niah + 1);
        TRY(keep(&st->niah[st->n_niah], ev));
        st->n_niah++;
        break;
    default:
        break;
    }
    st->count[ev->kind]++;
    return 0;
}

int probe_store_drain(probe_store *st, probe_sub *ring, int max) {
    int n = 0;
    const probe_event *ev;
    while ((max < 0 || n < max) && (ev = probe_ring_peek(ring))) {
        int rc = probe_store_add(st, ev);
        probe_ring_pop(ring);
        if (rc) return rc;
        n++;
    }
    return n;
}

/* ---- queries --------------------------------------------------------------- */

int probe_store_n_steps(const probe_store *st) { return st->n_steps; }

int probe_store_n_layers(const probe_store *st) {
    return st->run && st->run->run.n_layers > 0 ? st->run->run.n_layers : st->max_layer;
}

int probe_store_n_kv_heads(const probe_store *st) {
    return st->run && st->run->run.n_kv_heads > 0 ? st->run->run.n_kv_heads : st->max_head;
}

uint64_t probe_store_count(const probe_store *st, probe_kind k) {
    return (int)k >= 0 && (int)k < PROBE_KIND_COUNT ? st->count[k] : 0;
}

const probe_ev_run *probe_store_run(const probe_store *st) { return st->run ? &st->run->run : NULL; }

const char *probe_store_block_name(const probe_store *st) {
    const probe_ev_run *run = probe_store_run(st);
    if (run && run->kv_opts && probe_pairs_get(run->kv_opts, "page", -1) >= 1) return "page";
    if (run && run->kv_opts && probe_pairs_get(run->kv_opts, "chunk", -1) >= 1) return "chunk";
    for (int s = 0; s < probe_store_n_steps(st); s++)
        for (int l = 0; l < probe_store_n_layers(st); l++)
            for (int h = 0; h < probe_store_n_kv_heads(st); h++) {
                const probe_ev_decode_head *d = probe_store_decode(st, s, l, h);
                if (d) return d->block == 1 ? "token" : "block";
            }
    return "block";
}

int probe_store_n_tokens(const probe_store *st) { return st->n_tok; }
int probe_store_n_prompt(const probe_store *st) { return st->n_prompt; }

const probe_ev_token *probe_store_token(const probe_store *st, int i) {
    return i >= 0 && i < st->n_tok ? &st->tok[i]->token : NULL;
}

const probe_ev_token *probe_store_step_token(const probe_store *st, int step) {
    if (step < 0 || step >= st->cap_step_tok || st->step_tok[step] < 0) return NULL;
    return &st->tok[st->step_tok[step]]->token;
}

const probe_ev_prefill_layer *probe_store_prefill_layer(const probe_store *st, int layer) {
    return layer >= 0 && layer < st->cap_layer && st->layer[layer] ? &st->layer[layer]->prefill_layer : NULL;
}

const probe_ev_prefill_head *probe_store_prefill_head(const probe_store *st, int layer, int head) {
    const probe_event *e = grid_get(&st->pre_head, 0, layer, head);
    return e ? &e->prefill_head : NULL;
}

const probe_ev_decode_head *probe_store_decode(const probe_store *st, int step, int layer, int head) {
    const probe_event *e = grid_get(&st->dec, step, layer, head);
    return e ? &e->decode_head : NULL;
}

const probe_ev_oracle *probe_store_oracle(const probe_store *st, int step, int layer, int head) {
    const probe_event *e = grid_get(&st->orc, step, layer, head);
    return e ? &e->oracle : NULL;
}

int probe_store_selected(const probe_store *st, int step, int layer, int head, int chunk, float *score) {
    const probe_ev_decode_head *d = probe_store_decode(st, step, layer, head);
    if (!d) return -1;
    for (int i = 0; i < d->n_sel; i++)
        if (d->sel[i] == chunk) {
            if (score) *score = d->score[i];
            return 1;
        }
    return 0;
}

const probe_ev_step *probe_store_step(const probe_store *st, int step) {
    return step >= 0 && step < st->cap_step && st->step[step] ? &st->step[step]->step : NULL;
}

const probe_ev_span *probe_store_spans(const probe_store *st, int step, int *n) {
    int row = step + 1;
    if (row < 0 || row >= st->cap_spans || !st->spans[row].n) {
        *n = 0;
        return NULL;
    }
    *n = st->spans[row].n;
    return st->spans[row].v;
}

float probe_store_hit_rate(const probe_store *st, int step, int layer) {
    double sum = 0;
    int n = 0;
    for (int h = 0; h < st->dec.n_h; h++) {
        const probe_ev_decode_head *d = probe_store_decode(st, step, layer, h);
        if (!d || d->n_sel <= 0 || d->hits + d->misses <= 0) continue; /* no cache (Quest), or nothing selected */
        sum += (double)d->hits / d->n_sel;
        n++;
    }
    return n ? (float)(sum / n) : NAN;
}

int probe_store_hit_rate_series(const probe_store *st, int layer, float *out, int n) {
    for (int s = 0; s < n; s++) out[s] = probe_store_hit_rate(st, s, layer);
    return st->n_steps;
}

int probe_store_n_needles(const probe_store *st) { return st->n_needles; }

const probe_ev_needle *probe_store_needle_info(const probe_store *st, int id) {
    return id >= 0 && id < st->n_needles && st->needles[id].info ? &st->needles[id].info->needle : NULL;
}

const probe_ev_needle *probe_store_needle(const probe_store *st, int id, int step, int layer, int head) {
    if (id < 0 || id >= st->n_needles) return NULL;
    const probe_event *e = grid_get(&st->needles[id].g, step + 1, layer, head);
    return e ? &e->needle : NULL;
}

int probe_store_n_niah(const probe_store *st) { return st->n_niah; }

const probe_ev_niah *probe_store_niah(const probe_store *st, int i) {
    return i >= 0 && i < st->n_niah ? &st->niah[i]->niah : NULL;
}

const probe_ev_metric *probe_store_metric(const probe_store *st, const char *name, int step, int layer, int head) {
    const metric_data *md = find_metric(st, name);
    if (!md) return NULL;
    const probe_event *e = grid_get(&md->g, step + 1, layer, head + 1);
    return e ? &e->metric : NULL;
}

int probe_store_has_metric(const probe_store *st, const char *name) { return find_metric(st, name) != NULL; }
