/* kv_tailorkv.c: the TailorKV KV policy on the CPU (PEERS.md).
 *
 * Each layer is quantized (Q) or sparse (S). The map is either the first
 * `qlayers` layers, or (qlayers = -1, "auto") calibrated on the prompt: for
 * the last 32 prompt queries of a layer, P = 1 - the attention mass on the
 * top floor(0.05 n) of the n prompt keys (1/√d softmax, no causal mask, as
 * TailorKV's search code; qcausal=1: the pos + 1 keys each query sees),
 * averaged over those queries and all query heads; P > qtau makes the layer Q.
 * A k below 1 (prompts under 20 tokens) is taken as 1.
 *  - Q layers keep everything resident as a low-bit KIVI cache (kv_lowbit.h,
 *    plain min-max) plus the newest rows exact, and attend exactly over what
 *    it decodes to.
 *  - S layers offload the prompt's keys, values and transposed keys, keeping
 *    resident the first `start` and last `recent` prompt tokens, the max |K|
 *    of each channel and KV head over the prompt, and every generated token.
 *    Each decode step, per KV head: channel scores |q̄| ⊙ max|K| (q̄ the
 *    group-mean query, signed), the top `channels` channels fetched for every
 *    prompt key, approximate scores q̄[ch]·K[:, ch] over the prompt tokens
 *    between start and recent, and the top (budget - start - recent) tokens
 *    fetched and attended with start, recent and the generated tokens.
 * The query that scores the channels is the layer's own (TailorKV's `self`
 * mode, which it uses for layer 0). Not built: its `hint` mode, which
 * predicts layer l's query from layer l-1's normed input and needs that
 * from the forward pass. */
#include "kv.h"
#include "kv_rows.h"
#include "kv_lowbit.h"
#include "probe.h"
#include "skv.h"
#include "vec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALIB_ROWS 32

typedef struct {
    float *k, *v;      /* (cap, kvd) exact rows (S: the offload store for the prompt; Q: decoded low-bit; kv_rows) */
    int quant;         /* 1: Q layer */
    int nq_k, nq_v;    /* Q: positions quantized */
    float *maxabs;     /* (kvd) S: max |K| per channel over the prompt */
    float *calib_q;    /* (CALIB_ROWS, n_heads * d) the last prompt queries, for auto */
    int *calib_pos;    /* (CALIB_ROWS) their positions, -1 empty */
    float P;           /* the calibration figure, NAN when not computed */
} tk_layer;

typedef struct {
    float *qm, *ch_score, *approx; /* (d), (d), (max_ctx) */
    int *ch, *sel;     /* (channels), (n_topk) */
    float *sel_score;
    int n_ch, n_sel;
    float *K, *V;      /* (rows, d) gathered */
    int rows;
} tk_head;

typedef struct {
    kv_cache base;
    kv_opts o;
    lowbit_cfg q;
    int qlayers, start, recent, channels, qcausal;
    float tau;
    int h, d, kvd, group, nh;
    int prompt, budget, n_topk, dense;
    kv_rows rows;      /* the layers' keys and values; rows.n: positions in layer 0 */
    tk_layer *L;
    tk_head *hd;
    int n_q;           /* Q layers */
    uint64_t steps, fetch_bytes, step_fetch_bytes, ch_bytes, row_bytes;
} kv_tk;

static const kv_rows_array tk_arrays[] = {
    {offsetof(tk_layer, k), KV_ROWS_KEYS},
    {offsetof(tk_layer, v), KV_ROWS_VALUES},
};

static int tk_append(kv_cache *base, int layer, int pos, int n, const float *k_pre, const float *k, const float *v) {
    (void)k_pre;
    return kv_rows_append(&((kv_tk *)base)->rows, layer, pos, n, k, v);
}

/* Keeps the last CALIB_ROWS prompt queries of layer L (a ring by position). */
static void calib_keep(kv_tk *c, tk_layer *L, int pos, int n, const float *q) {
    size_t qd = (size_t)c->nh * c->d;
    for (int i = n > CALIB_ROWS ? n - CALIB_ROWS : 0; i < n; i++) {
        int slot = (pos + i) % CALIB_ROWS;
        memcpy(L->calib_q + slot * qd, q + (size_t)i * qd, sizeof(float) * qd);
        L->calib_pos[slot] = pos + i;
    }
}

/* P of layer L over its kept prompt queries (PEERS.md, TailorKV layer modes). */
static float calib_P(const kv_tk *c, const tk_layer *L, float *p, float *tmp) {
    double sum = 0;
    int cnt = 0;
    float scale = 1.0f / sqrtf((float)c->d);
    for (int r = 0; r < CALIB_ROWS; r++) {
        int pos = L->calib_pos[r];
        if (pos < 0) continue;
        /* The official search code: every row sees all s prompt keys (no
         * mask) and keeps int(0.05 s); qcausal: row pos sees pos + 1. */
        int n = c->qcausal ? pos + 1 : c->rows.n, k = (int)(0.05 * n);
        if (k < 1) k = 1;
        for (int hq = 0; hq < c->nh; hq++) {
            const float *qh = L->calib_q + (size_t)r * c->nh * c->d + (size_t)hq * c->d;
            int kh = hq / c->group;
            float mx = -INFINITY;
            for (int t = 0; t < n; t++) {
                p[t] = vec_dot(qh, L->k + (size_t)t * c->kvd + (size_t)kh * c->d, c->d) * scale;
                mx = p[t] > mx ? p[t] : mx;
            }
            double z = 0;
            for (int t = 0; t < n; t++) z += p[t] = expf(p[t] - mx);
            int *idx = (int *)tmp;
            int got = c->base.shape.be->topk(p, n, k, idx);
            double top = 0;
            for (int i = 0; i < got; i++) top += p[idx[i]];
            sum += 1.0 - top / z;
            cnt++;
        }
    }
    return cnt ? (float)(sum / cnt) : NAN;
}

static void decode_sparse_head(kv_tk *c, tk_layer *L, int kh, int T, const float *q, float *out) {
    tk_head *H = &c->hd[kh];
    const skv_backend *be = c->base.shape.be;
    int d = c->d, kvd = c->kvd, s = c->prompt;
    for (int i = 0; i < d; i++) {
        double m = 0;
        for (int g = 0; g < c->group; g++) m += q[(size_t)(kh * c->group + g) * d + i];
        H->qm[i] = (float)(m / c->group);
        H->ch_score[i] = fabsf(H->qm[i]) * L->maxabs[(size_t)kh * d + i];
    }
    H->n_ch = be->topk(H->ch_score, d, c->channels, H->ch);
    int lo = c->start, hi = s - c->recent, nc = hi - lo;
    for (int t = lo; t < hi; t++) {
        const float *kr = L->k + (size_t)t * kvd + (size_t)kh * d;
        float a = 0;
        for (int i = 0; i < H->n_ch; i++) a += H->qm[H->ch[i]] * kr[H->ch[i]];
        H->approx[t - lo] = a;
    }
    H->n_sel = be->topk(H->approx, nc, c->n_topk, H->sel);
    for (int i = 0; i < H->n_sel; i++) {
        H->sel_score[i] = H->approx[H->sel[i]];
        H->sel[i] += lo;
    }
    int n = 0;
    kv_gather_rows(L->k, L->v, kvd, kh, d, 0, lo, H->K, H->V, &n);
    for (int i = 0; i < H->n_sel; i++) kv_gather_rows(L->k, L->v, kvd, kh, d, H->sel[i], H->sel[i] + 1, H->K, H->V, &n);
    kv_gather_rows(L->k, L->v, kvd, kh, d, hi, T, H->K, H->V, &n);
    H->rows = n;
    float scale = 1.0f / sqrtf((float)d);
    for (int g = 0; g < c->group; g++) {
        int hq = kh * c->group + g;
        be->attend_rows(q + (size_t)hq * d, H->K, H->V, n, d, d, scale, out + (size_t)hq * d);
    }
}

static int tk_attend(kv_cache *base, int layer, int pos, int n, const float *q, float *out) {
    kv_tk *c = (kv_tk *)base;
    const kv_shape *sh = &base->shape;
    tk_layer *L = &c->L[layer];
    int rc = kv_rows_check(&c->rows, layer, pos, n);
    if (rc) return rc;
    if (!c->prompt || n > 1) {
        if (!c->prompt && L->calib_q) calib_keep(c, L, pos, n, q);
        sh->be->attend_causal(q, n, pos, sh->n_heads, sh->n_kv_heads, sh->head_dim, L->k, L->v, c->kvd,
                          (size_t)sh->head_dim, out);
        return 0;
    }
    int T = pos + 1, d = c->d;
    if (layer == 0) {
        c->steps++;
        c->step_fetch_bytes = 0;
    }
    if (L->quant || c->dense) {
        int rc = kv_attend_all(&c->base.shape, q, L->k, L->v, T, c->kvd, (size_t)d, out);
        if (rc) return rc;
        if (L->quant) lowbit_flush(sh->be, &c->q, c->h, c->d, L->k, L->v, T, &L->nq_k, &L->nq_v);
        return 0;
    }
    #pragma omp parallel for schedule(dynamic, 1) if (c->h > 1)
    for (int kh = 0; kh < c->h; kh++) decode_sparse_head(c, L, kh, T, q, out);
    int cand = c->prompt - c->start - c->recent;
    for (int kh = 0; kh < c->h; kh++) {
        uint64_t chb = (uint64_t)c->hd[kh].n_ch * cand * sizeof(float);
        uint64_t rb = (uint64_t)c->hd[kh].n_sel * 2 * d * sizeof(float);
        c->ch_bytes += chb;
        c->row_bytes += rb;
        c->fetch_bytes += chb + rb;
        c->step_fetch_bytes += chb + rb;
    }
    if (probe_wants(base->bus, PROBE_METRIC)) /* the channel raster: which channels scored the prompt */
        for (int kh = 0; kh < c->h; kh++) {
            tk_head *H = &c->hd[kh];
            for (int i = 0; i < H->n_ch; i++) H->ch_score[i] = (float)H->ch[i]; /* scratch: its scores are used */
            probe_emit_metric(base->bus, "channels", base->step, layer, kh, (float)H->n_ch, H->n_ch, H->ch_score);
        }
    if (probe_wants(base->bus, PROBE_DECODE_HEAD))
        for (int kh = 0; kh < c->h; kh++) {
            const tk_head *H = &c->hd[kh];
            probe_event ev = {.kind = PROBE_DECODE_HEAD, .decode_head = {
                .step = base->step, .layer = layer, .head = kh, .block = 1,
                .fetch_bytes = (uint64_t)H->n_ch * cand * sizeof(float) + (uint64_t)H->n_sel * 2 * d * sizeof(float),
                .n_sel = H->n_sel, .misses = H->n_sel, .sel = H->sel, .score = H->sel_score}};
            probe_emit(base->bus, &ev);
        }
    return 0;
}

static int tk_end_prefill(kv_tk *c);

static int tk_end_prefill_base(kv_cache *base) { return tk_end_prefill((kv_tk *)base); }

static int tk_end_prefill(kv_tk *c) {
    const kv_shape *sh = &c->base.shape;
    int s = c->prompt = c->rows.n, d = c->d;
    c->budget = kv_budget_tokens(&c->o, s);
    c->n_topk = c->budget - c->start - c->recent;
    c->dense = c->budget >= s || c->start + c->recent >= s || c->n_topk <= 0;
    if (c->dense)
        snprintf(c->base.notice, sizeof c->base.notice,
                 c->budget >= s ? "tailorkv: the budget (%d) covers the prompt (%d): sparse layers attend densely"
                                : "tailorkv: the budget (%d) leaves no token to select after start and recent in a "
                                  "prompt of %d: sparse layers attend densely",
                 c->budget, s);
    float *p = skv_malloc(sizeof(float) * (size_t)s), *tmp = skv_malloc(sizeof(int) * (size_t)s);
    if (!p || !tmp) {
        free(p);
        free(tmp);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    char map[160] = "";
    size_t ml = 0;
    for (int l = 0; l < sh->n_layers; l++) {
        tk_layer *L = &c->L[l];
        if (c->qlayers >= 0) L->quant = l < c->qlayers;
        else {
            L->P = calib_P(c, L, p, tmp);
            L->quant = L->P > c->tau;
        }
        c->n_q += L->quant;
        if (L->quant && ml < sizeof map) ml += (size_t)snprintf(map + ml, sizeof map - ml, "%s%d", ml ? "," : "", l);
        if (L->quant) lowbit_flush(sh->be, &c->q, c->h, c->d, L->k, L->v, s, &L->nq_k, &L->nq_v);
        else if (!(L->maxabs = skv_calloc((size_t)c->kvd, sizeof(float)))) {
            free(p);
            free(tmp);
            return skv_error(SKV_ENOMEM, "out of memory");
        } else
            for (int t = 0; t < s; t++)
                for (int i = 0; i < c->kvd; i++) {
                    float a = fabsf(L->k[(size_t)t * c->kvd + i]);
                    L->maxabs[i] = a > L->maxabs[i] ? a : L->maxabs[i];
                }
    }
    free(p);
    free(tmp);
    /* The layer-mode map: P of each layer (calibrated maps only) and its mode. */
    if (probe_wants(c->base.bus, PROBE_METRIC))
        for (int l = 0; l < sh->n_layers; l++) {
            if (c->qlayers < 0) probe_emit_metric(c->base.bus, "attn_spread", -1, l, -1, c->L[l].P, 0, NULL);
            probe_emit_metric(c->base.bus, "quantized", -1, l, -1, (float)c->L[l].quant, 0, NULL);
        }
    {   /* quantized layers stay quantized when the sparse ones attend densely */
        size_t len = strlen(c->base.notice);
        snprintf(c->base.notice + len, sizeof c->base.notice - len, "%stailorkv: quantized layers {%s} (%s)",
                 len ? "; " : "", map, c->qlayers >= 0 ? "--kv-opt qlayers" : "calibrated on the prompt");
    }
    if (!(c->hd = skv_calloc((size_t)c->h, sizeof *c->hd))) return skv_error(SKV_ENOMEM, "out of memory");
    int kk = c->n_topk > 0 ? c->n_topk : 1, mc = sh->max_ctx;
    size_t rows = (size_t)mc;
    for (int kh = 0; kh < c->h; kh++) {
        tk_head *H = &c->hd[kh];
        H->qm = skv_malloc(sizeof(float) * (size_t)d);
        H->ch_score = skv_malloc(sizeof(float) * (size_t)d);
        H->approx = skv_malloc(sizeof(float) * (size_t)(s > 0 ? s : 1));
        H->ch = skv_malloc(sizeof(int) * (size_t)d);
        H->sel = skv_malloc(sizeof(int) * (size_t)kk);
        H->sel_score = skv_malloc(sizeof(float) * (size_t)kk);
        H->K = skv_malloc(sizeof(float) * rows * d);
        H->V = skv_malloc(sizeof(float) * rows * d);
        if (!H->qm || !H->ch_score || !H->approx || !H->ch || !H->sel || !H->sel_score || !H->K || !H->V)
            return skv_error(SKV_ENOMEM, "tailorkv: out of memory for the scratch");
    }
    return 0;
}

static void tk_bytes(const kv_cache *base, size_t *resident, size_t *offloaded) {
    const kv_tk *c = (const kv_tk *)base;
    size_t f = sizeof(float), kvd = (size_t)c->kvd, n = (size_t)c->rows.n, s = (size_t)c->prompt;
    *resident = *offloaded = 0;
    for (int l = 0; l < base->shape.n_layers; l++) {
        const tk_layer *L = &c->L[l];
        if (!c->prompt) *resident += 2 * n * kvd * f;
        else if (L->quant) *resident += lowbit_bytes(&c->q, c->h, c->d, c->rows.n, L->nq_k, L->nq_v);
        else if (c->dense) *resident += 2 * n * kvd * f;
        else {
            *resident += 2 * ((size_t)c->start + (size_t)c->recent + (n - s)) * kvd * f + kvd * f;
            *offloaded += 3 * s * kvd * f; /* K, V and Kᵀ of the prompt */
        }
    }
}

static int tk_kept(const kv_cache *base, int layer, int hq, int *pos, int *unit) {
    const kv_tk *c = (const kv_tk *)base;
    const tk_layer *L = &c->L[layer];
    int T = c->rows.n, n = 0;
    *unit = 1;
    /* A quantized layer attends its low-bit cache whether or not the sparse
     * layers fall back to dense: only its unquantized rows are exact. */
    if (c->hd && L->quant) { /* exact rows: those not yet quantized when it attended (flushed for T - 1) */
        int R = c->q.residual, L1 = T - 1, nk = L1 - L1 % R, nv = L1 > R ? L1 - R : 0;
        for (int t = nk > nv ? nk : nv; t < T; t++) pos[n++] = t;
        return n;
    }
    if (!c->hd || c->dense) {
        for (int t = 0; t < T; t++) pos[n++] = t;
        return n;
    }
    const tk_head *H = &c->hd[hq / c->group];
    for (int t = 0; t < c->start; t++) pos[n++] = t;
    for (int i = 0; i < H->n_sel; i++) pos[n++] = H->sel[i];
    for (int t = c->prompt - c->recent; t < T; t++) pos[n++] = t;
    return n;
}

static const kv_stat_def tk_stat_defs[] = {
    {"prompt_len", "tokens", "tokens in the prompt"},
    {"q_layers", "layers", "quantized layers (the rest are sparse)"},
    {"bits", "", "bits per element in quantized layers"},
    {"topk", "tokens", "tokens fetched per KV head and step in sparse layers (budget - start - recent; none when "
                       "they attend densely)"},
    {"channels", "", "channels fetched per KV head to score the prompt"},
    {"steps", "", "decode steps attended"},
    {"fetch_bytes", "B", "bytes fetched: channels of the prompt's keys and the chosen rows"},
    {"channel_bytes", "B", "of which channel columns"},
    {"row_bytes", "B", "of which key and value rows"},
    {"step_fetch_bytes", "B", "bytes fetched in the last decode step"},
    {"resident", "B", "bytes resident: quantized layers' codes and residual, sparse layers' start, recent, "
                      "generated rows and channel maxima"},
    {"offloaded", "B", "bytes offloaded: sparse layers' prompt K, V and Kᵀ"},
};

static void tk_stats(const kv_cache *base, double *v) {
    const kv_tk *c = (const kv_tk *)base;
    size_t res, off;
    tk_bytes(base, &res, &off);
    double out[] = {
        c->prompt ? c->prompt : c->rows.n, c->prompt ? c->n_q : NAN, c->q.bits,
        c->prompt && !c->dense ? c->n_topk : NAN, /* none when the sparse layers attend densely */
        c->channels, (double)c->steps, (double)c->fetch_bytes, (double)c->ch_bytes, (double)c->row_bytes,
        (double)c->step_fetch_bytes, (double)res, (double)off,
    };
    _Static_assert(sizeof out / sizeof out[0] == sizeof tk_stat_defs / sizeof tk_stat_defs[0], "one value per stat");
    memcpy(v, out, sizeof out);
}

static void tk_free(kv_cache *base) {
    kv_tk *c = (kv_tk *)base;
    for (int l = 0; c->L && l < base->shape.n_layers; l++) {
        tk_layer *L = &c->L[l];
        free(L->maxabs); free(L->calib_q); free(L->calib_pos);
    }
    kv_rows_free(&c->rows);
    free(c->L);
    for (int kh = 0; c->hd && kh < c->h; kh++) {
        tk_head *H = &c->hd[kh];
        free(H->qm); free(H->ch_score); free(H->approx); free(H->ch); free(H->sel); free(H->sel_score);
        free(H->K); free(H->V);
    }
    free(c->hd);
    free(c);
}

static int tk_floor(const kv_opts *o, char *why, size_t n) {
    int s = kv_opt_int(o, &kv_policy_tailorkv, "start"), r = kv_opt_int(o, &kv_policy_tailorkv, "recent");
    snprintf(why, n, "start (%d) + recent (%d) + 1 token (%d tokens): a smaller budget selects no token, and the "
             "sparse layers attend densely", s, r, s + r + 1);
    return s + r + 1;
}

/* Options and defaults of TailorKV's RULER setting (PEERS.md). */
static const kv_opt_def tk_opt_defs[] = {
    {"qlayers", NULL, KV_OPT_INT, -1, -1, 1 << 16, "the first N layers quantized; -1: calibrate on the prompt (auto)"},
    {"qtau", NULL, KV_OPT_FLOAT, 0.2, 0, 1, "auto: a layer whose P (mass outside its top 5% keys) exceeds this is quantized"},
    {"qcausal", NULL, KV_OPT_INT, 0, 0, 1, "auto: 0 calibrates as TailorKV's search code does (no mask, the top "
                                           "int(0.05 n) of all n prompt keys for every query); 1 with the causal mask"},
    {"bits", "--bits", KV_OPT_INT, 2, 1, 8, "bits per element in quantized layers"},
    {"group", NULL, KV_OPT_INT, 64, 1, 4096, "quantization group g"},
    {"residual", NULL, KV_OPT_INT, 128, 1, 1 << 16, "newest tokens kept exact in quantized layers; a multiple of the group"},
    {"start", NULL, KV_OPT_INT, 64, 0, 1 << 20, "sparse layers: first prompt tokens always attended"},
    {"recent", NULL, KV_OPT_INT, 64, 0, 1 << 20, "sparse layers: last prompt tokens always attended"},
    {"channels", NULL, KV_OPT_INT, 12, 1, 4096, "sparse layers: channels fetched to score the prompt's keys"},
};

static int tk_create(const kv_opts *o, const kv_shape *shape, kv_cache **out);

const kv_class kv_policy_tailorkv = {
    .name = "tailorkv",
    .summary = "per layer: a low-bit KIVI cache, or offloaded keys scored on a few channels and the top tokens "
               "fetched (TailorKV)",
    .opts = tk_opt_defs,
    .n_opts = sizeof tk_opt_defs / sizeof tk_opt_defs[0],
    .budgeted = 1,
    .stat_defs = tk_stat_defs,
    .n_stats = sizeof tk_stat_defs / sizeof tk_stat_defs[0],
    .create = tk_create,
    .append = tk_append,
    .attend = tk_attend,
    .end_prefill = tk_end_prefill_base,
    .bytes = tk_bytes,
    .stats = tk_stats,
    .kept = tk_kept,
    .free = tk_free,
    .floor = tk_floor,
};

static int tk_create(const kv_opts *o, const kv_shape *shape, kv_cache **out) {
    *out = NULL;
    const kv_class *p = &kv_policy_tailorkv;
    lowbit_cfg q = {.bits = kv_opt_int(o, p, "bits"), .group = kv_opt_int(o, p, "group"),
                    .residual = kv_opt_int(o, p, "residual"), .midpoint = 0};
    if (q.residual % q.group)
        return skv_error(SKV_EINVAL, "tailorkv: the residual (%d) must be a multiple of the group (%d)", q.residual,
                         q.group);
    void *cv, *lv;
    int rc = kv_policy_alloc(p, shape, o, sizeof(kv_tk), sizeof(tk_layer), &cv, &lv);
    if (rc) return rc;
    kv_tk *c = cv;
    c->L = lv;
    c->o = *o;
    c->q = q;
    c->qlayers = kv_opt_int(o, p, "qlayers");
    c->tau = (float)kv_opt(o, p, "qtau");
    c->qcausal = kv_opt_int(o, p, "qcausal");
    c->start = kv_opt_int(o, p, "start");
    c->recent = kv_opt_int(o, p, "recent");
    c->channels = kv_opt_int(o, p, "channels");
    c->h = shape->n_kv_heads;
    c->d = shape->head_dim;
    c->kvd = c->h * c->d;
    c->nh = shape->n_heads;
    c->group = c->nh / c->h;
    if (c->channels > c->d) c->channels = c->d;
    kv_rows_init(&c->rows, p->name, &c->base.shape, c->L, sizeof *c->L, tk_arrays, sizeof tk_arrays / sizeof tk_arrays[0],
                 0);
    if (c->qlayers < 0)
        for (int l = 0; l < shape->n_layers; l++) {
            tk_layer *L = &c->L[l];
            L->calib_q = skv_malloc(sizeof(float) * CALIB_ROWS * (size_t)c->nh * c->d);
            L->calib_pos = skv_malloc(sizeof(int) * CALIB_ROWS);
            if (!L->calib_q || !L->calib_pos) {
                tk_free(&c->base);
                return skv_error(SKV_ENOMEM, "out of memory");
            }
            for (int i = 0; i < CALIB_ROWS; i++) L->calib_pos[i] = -1;
        }
    *out = &c->base;
    return 0;
}
