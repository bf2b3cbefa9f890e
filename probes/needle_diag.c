/* needle_diag.c: the diagnosis of a needle miss from a probe_store (see
 * needle_diag.h). No engine type is used: a trace is enough. */
#include "needle_diag.h"
#include "probe.h"
#include "skv.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Method 0 of a needle sweep is dense attention, the reference. */
#define METHOD_DENSE 0


const char *needle_cause_name(int kind) {
    switch (kind) {
    case NEEDLE_CAUSE_DENSE: return "model";
    case NEEDLE_CAUSE_BUDGET: return "budget";
    case NEEDLE_CAUSE_OUTLIER: return "never selected";
    case NEEDLE_CAUSE_LOCAL: return "window";
    case NEEDLE_CAUSE_RANK: return "compressed";
    case NEEDLE_CAUSE_FLOOR: return "floor";
    default: return "unknown";
    }
}

/* Appends printf text to a fixed buffer (truncating). */
static void cat(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void cat(char *buf, size_t cap, const char *fmt, ...) {
    size_t n = strlen(buf);
    if (n + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* "1st", "2nd", "3rd", "4th", ... into buf. */
static const char *ordinal(int n, char *buf, size_t cap) {
    const char *suf = "th";
    if (n % 100 < 11 || n % 100 > 13) suf = n % 10 == 1 ? "st" : n % 10 == 2 ? "nd" : n % 10 == 3 ? "rd" : "th";
    snprintf(buf, cap, "%d%s", n, suf);
    return buf;
}

/* Copies an answer for one-line display: trimmed, control characters as
 * spaces, cut to 60 bytes with "...". */
static void clean_copy(char *dst, size_t cap, const char *src) {
    size_t i = 0, lim = cap > 64 ? 60 : cap - 1;
    while (src && (*src == ' ' || *src == '\n' || *src == '\t')) src++;
    for (; src && *src && i < lim; src++) dst[i++] = (unsigned char)*src < 32 ? ' ' : *src;
    while (i && dst[i - 1] == ' ') i--;
    if (src && *src && i + 4 <= cap - 1) {
        while (i && ((unsigned char)dst[i] & 0xC0) == 0x80) i--; /* not inside a UTF-8 character */
        memcpy(dst + i, "...", 3);
        i += 3;
    }
    dst[i] = 0;
}

/* Place of chunk j among chunks 0..n-1 by ascending cos-min (ties: lower id
 * first), as the outlier choice orders them; -1 when unknown. */
static int cosmin_order(const probe_ev_prefill_head *ph, int j, int n) {
    if (!ph || j < 0 || j >= n || n > ph->n_chunks) return -1;
    float v = ph->cos_min[j];
    int r = 0;
    for (int i = 0; i < n; i++)
        if (i != j && (ph->cos_min[i] < v || (ph->cos_min[i] == v && i < j))) r++;
    return r;
}

/* Largest cos-min among a head's outliers (the cut), NaN when it has none. */
static float outlier_cut(const probe_ev_prefill_head *ph) {
    float cut = NAN;
    for (int i = 0; ph && i < ph->n_outliers; i++) {
        int j = ph->outliers[i];
        if (j >= 0 && j < ph->n_chunks && (isnan(cut) || ph->cos_min[j] > cut)) cut = ph->cos_min[j];
    }
    return cut;
}

/* Smallest rank whose predicted key error (tail energy of the spectrum) is
 * at most target in every layer; 0 when no spectrum is known. */
static int rank_for(const probe_store *st, int n_layers, double target) {
    int need = 0;
    for (int l = 0; l < n_layers; l++) {
        const probe_ev_prefill_layer *pl = probe_store_prefill_layer(st, l);
        if (!pl || pl->n_sv < 1) continue;
        double total = 0, tail;
        for (int i = 0; i < pl->n_sv; i++) total += (double)pl->sv[i] * pl->sv[i];
        tail = total;
        int r = 0;
        while (r < pl->n_sv && total > 0 && sqrt(tail / total) > target) {
            tail -= (double)pl->sv[r] * pl->sv[r];
            r++;
        }
        if (r > need) need = r;
    }
    return need;
}

/* A dropped needle chunk: the k that would have kept it, and its weight. */
typedef struct { int k; double w; } need_w;

/* Accumulators of one pass over the judged steps. */
typedef struct {
    double W, drop, mis, near, sel, outl, loc, ke;   /* weights */
    double *drop_step;          /* (n_steps) dropped weight per step */
    int n_ev, n_ev_kept;        /* (step, layer, head) events judged, with every chunk kept */
    need_w *needs;              /* (n_needs) every dropped chunk's rank + 1 and weight */
    int n_needs, cap_needs;
    need_w *outs;               /* (n_outs) every misranked chunk's place by cos-min + 1 and weight */
    int n_outs, cap_outs;
    int near_min;               /* lowest dropped chunk near the local window, -1 */
    double worst_ke; int ke_l, ke_h; /* worst key error among selected */
    double ms_sum, mi_sum; int m_n;  /* mass sparse / ideal where selected */
    int first_sel_step;
} acc;

/* The (layer, head) and chunk with the most weight of one kind at step s. */
typedef struct { double w; int l, h, i, rank, rank_exact; } spot;

static void spot_take(spot *sp, double w, int l, int h, int i, int rank, int rank_exact) {
    if (w > sp->w) *sp = (spot){ w, l, h, i, rank, rank_exact };
}

static int need_cmp(const void *a, const void *b) {
    const need_w *x = a, *y = b;
    return x->k - y->k;
}

/* The smallest k that keeps share q of the dropped weight (needs sorted in place). */
static int need_quantile(need_w *needs, int n, double q) {
    double total = 0, run = 0;
    for (int i = 0; i < n; i++) total += needs[i].w;
    qsort(needs, (size_t)n, sizeof *needs, need_cmp);
    for (int i = 0; i < n; i++) {
        run += needs[i].w;
        if (run >= q * total - 1e-12) return needs[i].k;
    }
    return n ? needs[n - 1].k : 0;
}

static int cause_cmp(const void *a, const void *b) {
    static const int prio[NEEDLE_N_CAUSES] = { [NEEDLE_CAUSE_DENSE] = 0, [NEEDLE_CAUSE_FLOOR] = 1,
                                               [NEEDLE_CAUSE_OUTLIER] = 2, [NEEDLE_CAUSE_LOCAL] = 3,
                                               [NEEDLE_CAUSE_BUDGET] = 4, [NEEDLE_CAUSE_RANK] = 5 };
    static const int check_rank[] = { [NEEDLE_CHECK_RETRIEVED] = 0, [NEEDLE_CHECK_NONE] = 1,
                                      [NEEDLE_CHECK_MISSED] = 2 };
    const needle_cause *x = a, *y = b;
    int fx = x->kind == NEEDLE_CAUSE_DENSE ? 0 : x->kind == NEEDLE_CAUSE_FLOOR ? 1 : 2;
    int fy = y->kind == NEEDLE_CAUSE_DENSE ? 0 : y->kind == NEEDLE_CAUSE_FLOOR ? 1 : 2;
    /* the floor comes first, unless its fix was checked and still missed
     * where another's was checked and retrieved */
    int swap = (x->check == NEEDLE_CHECK_MISSED && y->check == NEEDLE_CHECK_RETRIEVED) ||
               (y->check == NEEDLE_CHECK_MISSED && x->check == NEEDLE_CHECK_RETRIEVED);
    if (fx != fy && (fx == 0 || fy == 0 || !swap)) return fx - fy;
    if (x->check != y->check) return check_rank[x->check] - check_rank[y->check];
    if (x->dense_needed != y->dense_needed) return x->dense_needed - y->dense_needed;
    if (x->opt[0] && !strcmp(x->opt, y->opt) && x->value != y->value) return x->value < y->value ? -1 : 1;
    if (fabs(x->score - y->score) > 1e-9) return x->score > y->score ? -1 : 1;
    return prio[x->kind] - prio[y->kind];
}

void needle_causes_sort(needle_report *rep) {
    qsort(rep->causes, (size_t)rep->n_causes, sizeof rep->causes[0], cause_cmp);
}

/* The change a cause's fix proposes: option and value. */
static void set_change(needle_cause *c, const char *opt, double value) {
    snprintf(c->opt, sizeof c->opt, "%s", opt);
    c->value = c->proposed = value;
}

/* The largest k among needs whose weight is at least NEEDLE_NEGLIGIBLE of
 * their total (a chunk attention barely looks at does not set a fix); the
 * largest of all when none is. */
static int need_max(const need_w *needs, int n) {
    double total = 0;
    int k = 0, all = 0;
    for (int i = 0; i < n; i++) total += needs[i].w;
    for (int i = 0; i < n; i++) {
        if (needs[i].k > all) all = needs[i].k;
        if (needs[i].w >= NEEDLE_NEGLIGIBLE * total && needs[i].k > k) k = needs[i].k;
    }
    return k ? k : all;
}

/* Appends (k, w) to a growing list; SKV_ENOMEM when it cannot grow. */
static int need_push(need_w **v, int *n, int *cap, int k, double w) {
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 256;
        need_w *nn = realloc(*v, sizeof *nn * (size_t)c);
        if (!nn) return skv_error(SKV_ENOMEM, "out of memory");
        *v = nn;
        *cap = c;
    }
    (*v)[(*n)++] = (need_w){ k, w };
    return 0;
}

/* Weight of needle chunk i in event e: its exact mass, or without the
 * oracle the share of the needle's tokens in it. */
static double chunk_weight(const probe_ev_needle *e, int i, int chunk) {
    if (e->mass_chunk && e->mass_chunk[i] >= 0) return e->mass_chunk[i];
    int j = e->chunks[i], a = j * chunk, b = a + chunk;
    if (a < e->tok_begin) a = e->tok_begin;
    if (b > e->tok_end) b = e->tok_end;
    return e->tok_end > e->tok_begin && b > a ? (double)(b - a) / (e->tok_end - e->tok_begin) : 0;
}

/* Fills the answers and the divergence from the NIAH and step events. */
static void diagnose_answers(const probe_store *st, needle_report *rep) {
    const probe_ev_niah *sk = NULL, *dn = NULL;
    for (int i = 0; i < probe_store_n_niah(st); i++) {
        const probe_ev_niah *e = probe_store_niah(st, i);
        if (e->method != METHOD_DENSE && (!sk || (e->detail && !sk->detail))) sk = e;
    }
    for (int i = 0; sk && i < probe_store_n_niah(st); i++) {
        const probe_ev_niah *e = probe_store_niah(st, i);
        if (e->method == METHOD_DENSE && e->index == sk->index) dn = e;
    }
    rep->dense_hit = dn ? dn->hit : -1;
    rep->sparse_hit = sk ? sk->hit : -1;
    const probe_ev_run *run = probe_store_run(st);
    snprintf(rep->policy, sizeof rep->policy, "%s",
             sk && sk->policy && sk->policy[0] ? sk->policy : run && run->kv_policy ? run->kv_policy : "sparse");
    if (sk) {
        snprintf(rep->value, sizeof rep->value, "%s", sk->value ? sk->value : "");
        clean_copy(rep->sparse_answer, sizeof rep->sparse_answer, sk->answer);
    }
    if (dn) clean_copy(rep->dense_answer, sizeof rep->dense_answer, dn->answer);
    rep->diverge_step = -1;
    rep->diverge_logit = -1;
    if (sk && sk->n_steps > 0) {
        for (int s = 0; s < sk->n_steps && rep->diverge_step < 0; s++)
            if (!sk->top1_agree[s]) {
                rep->diverge_step = s;
                rep->diverge_logit = sk->logit_dist[s];
            }
    } else {
        for (int s = 0; s < probe_store_n_steps(st) && rep->diverge_step < 0; s++) {
            const probe_ev_step *e = probe_store_step(st, s);
            if (e && e->has_oracle && !e->top1_agree) rep->diverge_step = s;
        }
    }
}

/* 1 when text holds value as a whole number (not inside a longer one): the
 * rule of engine/needle.c's needle_contains_value, which the probes layer
 * cannot call. */
static int has_number(const char *text, const char *value) {
    size_t n = strlen(value);
    if (!n) return 0;
    for (const char *p = text; (p = strstr(p, value)); p++) {
        int before = p > text && p[-1] >= '0' && p[-1] <= '9', after = p[n] >= '0' && p[n] <= '9';
        if (!before && !after) return 1;
    }
    return 0;
}

/* A run without PROBE_NIAH events (the inspector's, skv run's): the value
 * is the longest number in the watched needle's text, the policy's answer
 * the tokens it generated, and dense answered the same when the oracle's
 * dense twin agreed on the argmax at every step. */
static void answers_from_tokens(const probe_store *st, needle_report *rep) {
    char text[512] = "", ans[512] = "";
    size_t tl = 0, al = 0;
    for (int i = 0; i < probe_store_n_tokens(st); i++) {
        const probe_ev_token *t = probe_store_token(st, i);
        if (!t || !t->text) continue;
        if (t->step < 0 && t->pos >= rep->tok_begin && t->pos < rep->tok_end && tl + (size_t)t->n_text < sizeof text) {
            memcpy(text + tl, t->text, (size_t)t->n_text);
            text[tl += (size_t)t->n_text] = 0;
        } else if (t->step >= 0 && al + (size_t)t->n_text < sizeof ans) {
            memcpy(ans + al, t->text, (size_t)t->n_text);
            ans[al += (size_t)t->n_text] = 0;
        }
    }
    size_t best = 0, at = 0;
    for (size_t i = 0; text[i];) {
        size_t j = i;
        while (text[j] >= '0' && text[j] <= '9') j++;
        if (j - i > best) { best = j - i; at = i; }
        i = j > i ? j : i + 1;
    }
    if (best < 3 || best >= sizeof rep->value) return; /* no number planted: nothing to judge */
    memcpy(rep->value, text + at, best);
    rep->value[best] = 0;
    clean_copy(rep->sparse_answer, sizeof rep->sparse_answer, ans);
    int steps = probe_store_n_steps(st);
    if (steps <= 0) return;
    /* an answer still being written (only the value's first digits so far): no verdict yet */
    const char *a = ans;
    while (*a == ' ' || *a == '\n' || *a == '\t') a++;
    size_t ad = strspn(a, "0123456789");
    if (!a[ad] && ad < strlen(rep->value) && !strncmp(a, rep->value, ad)) {
        rep->pending = 1;
        return;
    }
    rep->sparse_hit = has_number(ans, rep->value);
    int agree = 0, scored = 0;
    for (int s = 0; s < steps; s++) {
        const probe_ev_step *e = probe_store_step(st, s);
        if (!e || !e->has_oracle) continue;
        scored++;
        agree += e->top1_agree != 0;
    }
    rep->agree_steps = agree;
    rep->scored_steps = scored;
    if (scored == steps && agree == steps) { /* greedy: the same argmax at every step is the same text */
        rep->dense_hit = rep->sparse_hit;
        clean_copy(rep->dense_answer, sizeof rep->dense_answer, ans);
    }
}

/* Layer l, with output error e, into the report's four worst layers (kept
 * sorted, worst first). */
static void div_take(needle_report *rep, int l, float e) {
    int at = rep->n_div < 4 ? rep->n_div++ : 3;
    if (at == 3 && rep->n_div == 4 && e <= rep->div_err[3]) return;
    rep->div_layer[at] = l;
    rep->div_err[at] = e;
    for (int i = at; i > 0 && rep->div_err[i] > rep->div_err[i - 1]; i--) {
        float te = rep->div_err[i]; rep->div_err[i] = rep->div_err[i - 1]; rep->div_err[i - 1] = te;
        int tl = rep->div_layer[i]; rep->div_layer[i] = rep->div_layer[i - 1]; rep->div_layer[i - 1] = tl;
    }
}

/* Layers whose sparse attention output differs most from exact at step s. */
static void diagnose_layers(const probe_store *st, needle_report *rep, int s) {
    rep->n_div = 0;
    for (int l = 0; l < rep->n_layers; l++) {
        float e = -1;
        for (int h = 0; h < rep->n_heads; h++) {
            const probe_ev_needle *ev = probe_store_needle(st, rep->id, s, l, h);
            if (ev && ev->out_err > e) e = ev->out_err;
        }
        if (e >= 0) div_take(rep, l, e);
    }
}

static needle_cause *add_cause(needle_report *rep, int kind, double score) {
    needle_cause *c = &rep->causes[rep->n_causes++];
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->score = score;
    c->step = c->layer = c->head = c->chunk = -1;
    return c;
}

/* ", 1 page of 16 tokens" for a budget of b tokens in blocks of u (whole
 * blocks, named pages), "" for single tokens; into buf. */
static const char *units_of(int b, int u, char *buf, size_t n) {
    if (u <= 1 || b < 0) buf[0] = 0;
    else snprintf(buf, n, ": %d page%s of %d tokens", b / u, b / u == 1 ? "" : "s", u);
    return buf;
}

/* ---- the generic diagnosis, from the oracle's events -------------------------- */

/* The option that sets the policy's block size, as the run recorded its
 * options ("page" for Quest and FreeKV, "chunk" for ShadowKV), or NULL when
 * it recorded neither: advice names only an option the policy has. */
static const char *block_option(const probe_store *st) {
    const char *b = probe_store_block_name(st);
    return !strcmp(b, "page") || !strcmp(b, "chunk") ? b : NULL;
}

/* The first oracle event with a needle span, or NULL. */
static const probe_ev_oracle *oracle_needle(const probe_store *st) {
    int L = probe_store_n_layers(st), H = probe_store_n_kv_heads(st);
    for (int s = 0; s < probe_store_n_steps(st); s++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++) {
                const probe_ev_oracle *e = probe_store_oracle(st, s, l, h);
                if (e && e->needle_len > 0) return e;
            }
    return NULL;
}

/* Layers whose attention output differs most from exact at step s (oracle). */
static void generic_layers(const probe_store *st, needle_report *rep, int s) {
    rep->n_div = 0;
    for (int l = 0; l < rep->n_layers; l++) {
        float e = -1;
        for (int h = 0; h < rep->n_heads; h++) {
            const probe_ev_oracle *ev = probe_store_oracle(st, s, l, h);
            if (ev && ev->out_err > e) e = ev->out_err;
        }
        if (e >= 0) div_take(rep, l, e);
    }
}

/* "step 0" or "steps 0-N": the decode steps the report covers. */
static void steps_text(const needle_report *rep, char *buf, size_t n) {
    if (rep->last_step > 0) snprintf(buf, n, "steps 0-%d", rep->last_step);
    else snprintf(buf, n, "step 0");
}

static void set_divergence(needle_report *rep) {
    if (rep->diverge_step >= 0) {
        snprintf(rep->divergence, sizeof rep->divergence, "first divergence at decode step %d (answer token %d): the sparse "
                 "argmax differs from dense", rep->diverge_step, rep->diverge_step + 2);
        if (rep->diverge_logit >= 0) cat(rep->divergence, sizeof rep->divergence, ", logit distance %.3f", rep->diverge_logit);
        if (rep->n_div) {
            cat(rep->divergence, sizeof rep->divergence, "; attention output error by layer:");
            for (int i = 0; i < rep->n_div; i++)
                cat(rep->divergence, sizeof rep->divergence, "%s layer %d %.3f", i ? "," : "", rep->div_layer[i],
                    rep->div_err[i]);
        }
    } else if (rep->has_oracle) {
        snprintf(rep->divergence, sizeof rep->divergence, "no divergence: the sparse argmax equals dense at all %d decode "
                 "steps (the first answer token comes from the exact prefill)", rep->n_steps);
    } else {
        snprintf(rep->divergence, sizeof rep->divergence, "divergence unknown (run without the oracle)");
    }
}

/* Token-level diagnosis of any policy from PROBE_ORACLE events. Each
 * (step, layer, KV head) weighs by the needle's exact mass there; a needle
 * not attended by every query head counts as dropped, in proportion. When
 * exact attention ranks the needle inside the budget the policy attended
 * (rank < tokens attended) the policy's own score missed it ("never
 * selected"); otherwise the budget was too small for it ("budget"). */
static int lowbit_layer(const probe_store *st, int l);

/* 1 when the policy quantizes layer l whole and selects nothing there
 * (TailorKV's quantized layers; SpeCache reads at low bits what it does not
 * select, so its layers select). */
static int quantized_layer(const probe_store *st, int l) {
    const probe_ev_metric *q = probe_store_metric(st, "quantized", -1, l, -1);
    return q && q->value > 0.5f;
}

static int diagnose_generic(const probe_store *st, const probe_ev_oracle *first, needle_report *rep) {
    const probe_ev_run *run = probe_store_run(st);
    rep->generic = 1;
    rep->unit = first->unit;
    rep->chunk = first->unit;
    rep->n_layers = probe_store_n_layers(st);
    rep->n_heads = probe_store_n_kv_heads(st);
    rep->prompt_len = run ? run->prompt_len : probe_store_n_prompt(st);
    rep->budget = run ? run->budget : -1;
    rep->rank = rep->outliers = rep->local = rep->k = rep->n_cand = rep->local_start = -1;
    rep->key_err_selected = -1;
    rep->n_steps = probe_store_n_steps(st);
    rep->has_oracle = 1;
    diagnose_answers(st, rep);
    /* the span: the oracle clips it to the prompt; the NIAH event has it whole */
    rep->tok_end = rep->prompt_len;
    rep->tok_begin = rep->tok_end - first->needle_len;
    for (int i = 0; i < probe_store_n_niah(st); i++) {
        const probe_ev_niah *e = probe_store_niah(st, i);
        if (e->tok_end - e->tok_begin == first->needle_len) {
            rep->tok_begin = e->tok_begin;
            rep->tok_end = e->tok_end;
        }
    }
    if (rep->sparse_hit < 0) answers_from_tokens(st, rep);
    rep->last_step = rep->diverge_step >= 0 ? rep->diverge_step : rep->n_steps - 1;
    if (rep->diverge_step >= 0) generic_layers(st, rep, rep->diverge_step);
    /* drop: not attended exactly; low: of it, read at low precision; sel: of it, in layers that select */
    double W = 0, drop = 0, mis = 0, low = 0, sel = 0;
    int n_ev = 0, n_kept = 0, lay_drop = 0, lh_drop = 0, lh_total = 0;
    need_w *needs = NULL;
    int n_needs = 0, cap = 0;
    spot sd = {0, -1, -1, -1, -1, -1}, sm = sd;
    int ws = -1;
    double ws_w = -1;
    for (int s = 0; s <= rep->last_step; s++) {
        double step_drop = 0;
        for (int l = 0; l < rep->n_layers; l++)
            for (int h = 0; h < rep->n_heads; h++) {
                const probe_ev_oracle *e = probe_store_oracle(st, s, l, h);
                if (!e || e->needle_len <= 0) continue;
                n_ev++;
                double w = e->needle_mass > 0 ? e->needle_mass : 0;
                W += w;
                if (e->needle_kept >= e->needle_len) { n_kept++; continue; }
                double d = w * (1.0 - (double)e->needle_kept / e->needle_len);
                drop += d;
                step_drop += d;
                if (lowbit_layer(st, l)) low += d; /* read, at low precision: not dropped */
                if (quantized_layer(st, l)) continue; /* no selection there: nothing ranked, no budget to blame */
                sel += d;
                /* tokens attended per query head; the exact top-B of that size */
                double B = 0;
                for (int j = 0; j < e->n_q; j++) B += e->q_kept[j];
                B = e->n_q ? B / e->n_q : 0;
                int want = e->needle_rank + 1;
                if (e->needle_rank >= 0 && e->needle_rank < B) {
                    mis += d;
                    spot_take(&sm, d + 1e-12, l, h, 0, e->needle_rank, e->needle_rank);
                } else {
                    spot_take(&sd, d + 1e-12, l, h, 0, e->needle_rank, (int)lround(B));
                }
                if (need_push(&needs, &n_needs, &cap, want, d)) { free(needs); return SKV_ENOMEM; }
            }
        if (step_drop > ws_w) { ws_w = step_drop; ws = s; }
    }
    for (int l = 0; ws >= 0 && l < rep->n_layers; l++) {
        int any = 0;
        for (int h = 0; h < rep->n_heads; h++) {
            const probe_ev_oracle *e = probe_store_oracle(st, ws, l, h);
            if (!e || e->needle_len <= 0) continue;
            lh_total++;
            if (e->needle_kept < e->needle_len) { lh_drop++; any = 1; }
        }
        lay_drop += any;
    }
    double Wn = W > 0 ? W : 1, inexact = drop / Wn;
    rep->share_lowbit = low / Wn;
    rep->share_dropped = inexact - rep->share_lowbit;
    rep->share_misranked = mis / Wn;
    rep->share_selected = 1 - inexact;
    char steps[48];
    steps_text(rep, steps, sizeof steps);
    if (!n_ev)
        snprintf(rep->kept, sizeof rep->kept, "no decode step has needle data, so nothing can be said about what %s kept",
                 rep->policy);
    else if (low > 0) /* TailorKV's quantized layers, SpeCache: what is not attended exactly is read at low bits */
        snprintf(rep->kept, sizeof rep->kept,
                 "%s attended the whole needle exactly in %d of %d (step, layer, KV head) at %s and kept %.0f%% of the "
                 "needle's exact attention mass exactly; it read %.0f%% at low precision (where it keeps no exact copy) "
                 "and dropped %.0f%%", rep->policy, n_kept, n_ev, steps, 100 * rep->share_selected,
                 100 * rep->share_lowbit, 100 * rep->share_dropped);
    else
        snprintf(rep->kept, sizeof rep->kept,
                 "%s attended the whole needle in %d of %d (step, layer, KV head) at %s and kept %.0f%% of the needle's "
                 "exact attention mass; it dropped %.0f%%", rep->policy, n_kept, n_ev, steps, 100 * rep->share_selected,
                 100 * rep->share_dropped);
    set_divergence(rep);
    if (rep->dense_hit == 0) {
        needle_cause *c = add_cause(rep, NEEDLE_CAUSE_DENSE, 2.0);
        c->step = rep->diverge_step >= 0 ? rep->diverge_step : 0;
        snprintf(c->evidence, sizeof c->evidence,
                 "the model misses it with dense attention too: dense answered \"%s\" for value %s; %s kept %.0f%% of "
                 "the needle's attention mass at %s", rep->dense_answer, rep->value, rep->policy,
                 100 * rep->share_selected, steps);
        snprintf(c->fix, sizeof c->fix, "use a model that retrieves at this length with dense attention; "
                 "the %s settings cannot fix this", rep->policy);
    }
    int u = rep->unit > 0 ? rep->unit : 1;
    char ubuf[64];
    double in_sel = sel / Wn; /* not attended exactly in the layers that select: what a budget can restore */
    if (in_sel - rep->share_misranked >= NEEDLE_MIN_SHARE && sd.l >= 0) {
        needle_cause *c = add_cause(rep, NEEDLE_CAUSE_BUDGET, in_sel - rep->share_misranked);
        c->step = ws; c->layer = sd.l; c->head = sd.h;
        snprintf(c->evidence, sizeof c->evidence,
                 "exact attention ranks the needle's best token %d (layer %d, head %d), past the %d token(s) %s "
                 "attended per query head there (budget %d tokens%s); the needle was not fully attended in %d of %d "
                 "layers (%d of %d layer-heads) at step %d; ",
                 sd.rank, sd.l, sd.h, sd.rank_exact, rep->policy, rep->budget, units_of(rep->budget, u, ubuf, sizeof ubuf),
                 lay_drop, rep->n_layers, lh_drop, lh_total, ws);
        cat(c->evidence, sizeof c->evidence, "%.0f%% of its exact attention mass was %s over %s%s, %.0f%% of it ranked "
            "past what was attended", 100 * in_sel, low > 0 ? "not attended exactly" : "dropped", steps,
            low > 0 ? " in the layers it selects in" : "", 100 * (in_sel - rep->share_misranked));
        int need = need_max(needs, n_needs);
        int t = (need + u - 1) / u * u, q90 = (need_quantile(needs, n_needs, 0.9) + u - 1) / u * u;
        if (rep->budget > 0 && t <= rep->budget) t = (rep->budget / u + 1) * u; /* never below what missed */
        set_change(c, "budget", t);
        c->dense_needed = rep->prompt_len > 0 && t >= rep->prompt_len;
        c->limit = rep->prompt_len > u ? (rep->prompt_len - 1) / u * u : 0; /* the ladder stays under the prompt */
        if (c->dense_needed && rep->budget > 0 && 2 * rep->budget < c->limit) c->smaller = (2 * rep->budget + u - 1) / u * u;
        if (c->dense_needed)
            snprintf(c->fix, sizeof c->fix, "dense would be needed: the needle's exact rank asks for %d tokens, the "
                     "whole %d-token prompt", t, rep->prompt_len);
        else if (u > 1)
            snprintf(c->fix, sizeof c->fix, "raise --budget to %d tokens (%d pages of %d tokens; the needle's exact "
                     "rank + 1)", t, t / u, u);
        else
            snprintf(c->fix, sizeof c->fix, "raise --budget to %d tokens (the needle's exact rank + 1)", t);
        if (q90 < t && q90 > rep->budget) {
            if (!c->dense_needed) cat(c->fix, sizeof c->fix, "; %d would keep 90%% of what was dropped", q90);
            c->smaller = q90;
        }
    }
    if (rep->share_misranked >= NEEDLE_MIN_SHARE && sm.l >= 0) {
        needle_cause *c = add_cause(rep, NEEDLE_CAUSE_OUTLIER, rep->share_misranked);
        const probe_ev_oracle *e = probe_store_oracle(st, ws, sm.l, sm.h);
        c->step = ws; c->layer = sm.l; c->head = sm.h;
        snprintf(c->evidence, sizeof c->evidence,
                 "exact attention ranks the needle %d, inside the %d token%s %s attended (layer %d, head %d), yet the "
                 "policy's own score left %d of its %d tokens out; %.0f%% of the needle's mass was %s this way",
                 sm.rank, e ? e->n_kept : -1, e && e->n_kept == 1 ? "" : "s", rep->policy, sm.l, sm.h, e ? e->needle_len - e->needle_kept : -1,
                 e ? e->needle_len : -1, 100 * rep->share_misranked,
                 low > 0 ? "not attended exactly (read at low precision or dropped)" : "lost");
        const char *block = block_option(st);
        if (u > 1 && block) {
            set_change(c, block, u / 2);
            snprintf(c->fix, sizeof c->fix, "the policy's %s score misses the needle: halve the %s to %d tokens "
                     "(--%s %d)", block, block, u / 2, block, u / 2);
        } else {
            int t = rep->budget > 0 ? 2 * rep->budget : need_max(needs, n_needs);
            t = (t + u - 1) / u * u;
            set_change(c, "budget", t);
            c->dense_needed = rep->prompt_len > 0 && t >= rep->prompt_len;
            c->limit = rep->prompt_len > u ? (rep->prompt_len - 1) / u * u : 0;
            snprintf(c->fix, sizeof c->fix, c->dense_needed ? "dense would be needed: its score ranks the needle too "
                     "low for any budget below the prompt (%d tokens)" : "its score ranks the needle too low: raise "
                     "--budget to %d tokens (twice the budget)", c->dense_needed ? rep->prompt_len : t);
        }
    }
    if (rep->share_lowbit >= NEEDLE_MIN_SHARE) { /* read, but at low precision: the bits, not the selection */
        const probe_ev_run *run = probe_store_run(st);
        int bits = run ? probe_pairs_int(run->kv_opts, "bits", 0, 1, 64) : 0;
        char layers[120] = "";
        size_t ll = 0;
        for (int l = 0; l < rep->n_layers && ll < sizeof layers; l++)
            if (lowbit_layer(st, l)) ll += (size_t)snprintf(layers + ll, sizeof layers - ll, "%s%d", ll ? ", " : "", l);
        needle_cause *c = add_cause(rep, NEEDLE_CAUSE_RANK, rep->share_lowbit);
        c->step = ws;
        c->layer = -1;
        char how[24] = "quantized";
        if (bits > 0) snprintf(how, sizeof how, "%d bit%s", bits, bits == 1 ? "" : "s");
        snprintf(c->evidence, sizeof c->evidence,
                 "%.0f%% of the needle's exact attention mass was read at low precision (%s, layer%s %s) where %s "
                 "keeps no exact copy of it, over %s", 100 * rep->share_lowbit, how, strchr(layers, ',') ? "s" : "",
                 layers, rep->policy, steps);
        if (bits > 0 && bits < 8) {
            int to = bits * 2 > 8 ? 8 : bits * 2;
            set_change(c, "bits", to);
            snprintf(c->fix, sizeof c->fix, "raise --bits to %d (the low-precision reads then err less)", to);
        } else {
            snprintf(c->fix, sizeof c->fix, "attend the needle exactly: raise --budget so that %s fetches it exactly",
                     rep->policy);
        }
    }
    qsort(rep->causes, (size_t)rep->n_causes, sizeof rep->causes[0], cause_cmp);
    free(needs);
    return 0;
}

static int diagnose_one(const probe_store *st, int id, needle_report *rep) {
    memset(rep, 0, sizeof *rep);
    rep->id = id;
    const probe_ev_needle *info = probe_store_needle_info(st, id);
    const probe_ev_oracle *orc = id == 0 ? oracle_needle(st) : NULL;
    if ((!info || info->n_chunks < 1) && orc) return diagnose_generic(st, orc, rep);
    if (!info || info->n_chunks < 1)
        return skv_error(SKV_EMISSING, "no needle data (record a needle run with skv needle --trace FILE)");
    const probe_ev_run *run = probe_store_run(st);
    const probe_ev_prefill_head *ph0 = probe_store_prefill_head(st, 0, 0);
    rep->tok_begin = info->tok_begin;
    rep->tok_end = info->tok_end;
    rep->first_chunk = info->chunks[0];
    rep->n_chunks = info->n_chunks;
    rep->n_layers = probe_store_n_layers(st);
    rep->n_heads = probe_store_n_kv_heads(st);
    double run_chunk = run ? probe_pairs_get(run->kv_opts, "chunk", 0) : 0; /* input: range-checked */
    rep->chunk = run_chunk >= 1 && run_chunk <= 1 << 20 ? (int)run_chunk
                 : ph0 && ph0->chunk >= 1 && ph0->chunk <= 1 << 20 ? ph0->chunk : 1;
    rep->prompt_len = run ? run->prompt_len : probe_store_n_prompt(st);
    const probe_ev_prefill_layer *pl0 = probe_store_prefill_layer(st, 0);
    /* the rank used (clamped to the key width) */
    rep->rank = pl0 ? pl0->rank : run ? probe_pairs_int(run->kv_opts, "rank", -1, 0, 1 << 20) : -1;
    rep->budget = run ? run->budget : -1;
    rep->outliers = run ? probe_pairs_int(run->kv_opts, "outliers", -1, 0, 1 << 24) : -1;
    rep->local = run ? probe_pairs_int(run->kv_opts, "local", -1, 0, 1 << 24) : -1;
    rep->prompt_chunks = ph0 ? ph0->n_chunks : rep->prompt_len / rep->chunk;
    rep->local_start = ph0 ? ph0->local_start : -1;
    rep->n_cand = ph0 ? ph0->n_landmarks : -1;
    rep->k = info->k;
    rep->n_steps = probe_store_n_steps(st);
    rep->key_err_selected = -1;
    for (int s = 0; s < rep->n_steps && !rep->has_oracle; s++)
        for (int l = 0; l < rep->n_layers && !rep->has_oracle; l++) {
            const probe_ev_needle *e = probe_store_needle(st, id, s, l, 0);
            if (e && e->mass_exact >= 0) rep->has_oracle = 1;
        }
    diagnose_answers(st, rep);
    if (rep->sparse_hit < 0) answers_from_tokens(st, rep);
    rep->last_step = rep->diverge_step >= 0 ? rep->diverge_step : rep->n_steps - 1;
    if (rep->diverge_step >= 0) diagnose_layers(st, rep, rep->diverge_step);

    acc a = { .near_min = -1, .ke_l = -1, .ke_h = -1, .first_sel_step = -1, .worst_ke = -1 };
    a.drop_step = calloc((size_t)(rep->n_steps > 0 ? rep->n_steps : 1), sizeof(double));
    if (!a.drop_step) return skv_error(SKV_ENOMEM, "out of memory");
    int reach = rep->local > 0 && 4 * rep->local > NEEDLE_LOCAL_REACH ? 4 * rep->local : NEEDLE_LOCAL_REACH;
    for (int s = 0; s <= rep->last_step; s++)
        for (int l = 0; l < rep->n_layers; l++)
            for (int h = 0; h < rep->n_heads; h++) {
                const probe_ev_needle *e = probe_store_needle(st, id, s, l, h);
                if (!e || e->n_info != e->n_chunks) continue;
                const probe_ev_needle *pre = probe_store_needle(st, id, -1, l, h);
                a.n_ev++;
                int all_kept = 1, any_sel = 0;
                for (int i = 0; i < e->n_chunks; i++) {
                    double w = chunk_weight(e, i, rep->chunk);
                    a.W += w;
                    if (e->part[i] == 1) { a.outl += w; continue; }
                    if (e->part[i] == 2) { a.loc += w; continue; }
                    if (e->selected[i]) {
                        a.sel += w;
                        any_sel = 1;
                        float ke = pre ? pre->key_err : e->key_err;
                        if (ke >= 0) {
                            a.ke += w * ke;
                            if (ke > a.worst_ke) { a.worst_ke = ke; a.ke_l = l; a.ke_h = h; }
                        }
                        continue;
                    }
                    all_kept = 0;
                    a.drop += w;
                    a.drop_step[s] += w;
                    if (need_push(&a.needs, &a.n_needs, &a.cap_needs, e->rank[i] + 1, w)) {
                        free(a.needs); free(a.outs); free(a.drop_step);
                        return SKV_ENOMEM;
                    }
                    int j = e->chunks[i];
                    if (e->rank_exact[i] >= 0 && e->rank_exact[i] < e->k) {
                        a.mis += w;
                        int ord = cosmin_order(probe_store_prefill_head(st, l, h), j,
                                               rep->local_start >= 0 ? rep->local_start : rep->prompt_chunks);
                        if (ord >= 0 && need_push(&a.outs, &a.n_outs, &a.cap_outs, ord + 1, w)) {
                            free(a.needs); free(a.outs); free(a.drop_step);
                            return SKV_ENOMEM;
                        }
                    }
                    if (rep->prompt_chunks - j <= reach) {
                        a.near += w;
                        if (a.near_min < 0 || j < a.near_min) a.near_min = j;
                    }
                }
                a.n_ev_kept += all_kept;
                if (any_sel && e->mass_ideal >= 0) {
                    a.ms_sum += e->mass_sparse;
                    a.mi_sum += e->mass_ideal;
                    a.m_n++;
                }
                if (any_sel && a.first_sel_step < 0) a.first_sel_step = s;
            }
    double W = a.W > 0 ? a.W : 1;
    rep->share_dropped = a.drop / W;
    rep->share_misranked = a.mis / W;
    rep->share_near_local = a.near / W;
    rep->share_selected = a.sel / W;
    rep->share_outlier = a.outl / W;
    rep->share_local = a.loc / W;
    if (a.sel > 0) rep->key_err_selected = a.ke / a.sel;

    /* The step with the most dropped mass, and where in it. */
    int ws = 0;
    for (int s = 1; s <= rep->last_step; s++)
        if (a.drop_step[s] > a.drop_step[ws]) ws = s;
    spot sd = { 0, -1, -1, -1, -1, -1 }, sm = sd, sn = sd;
    int lay_drop = 0, lh_drop = 0, lh_mis = 0, lh_nonout = 0, lh_total = 0;
    for (int l = 0; l < rep->n_layers && a.drop > 0; l++) {
        int any = 0;
        for (int h = 0; h < rep->n_heads; h++) {
            const probe_ev_needle *e = probe_store_needle(st, id, ws, l, h);
            if (!e || e->n_info != e->n_chunks) continue;
            lh_total++;
            int d = 0, m = 0, cand = 0;
            for (int i = 0; i < e->n_chunks; i++) {
                if (e->part[i] != 0) continue;
                cand = 1;
                if (e->selected[i]) continue;
                double w = chunk_weight(e, i, rep->chunk);
                d = 1;
                spot_take(&sd, w + 1e-12, l, h, i, e->rank[i], e->rank_exact[i]);
                if (e->rank_exact[i] >= 0 && e->rank_exact[i] < e->k) {
                    m = 1;
                    spot_take(&sm, w + 1e-12, l, h, i, e->rank[i], e->rank_exact[i]);
                }
                if (rep->prompt_chunks - e->chunks[i] <= reach) spot_take(&sn, w + 1e-12, l, h, i, e->rank[i], e->rank_exact[i]);
            }
            lh_drop += d;
            lh_mis += m;
            lh_nonout += cand;
            any |= d;
        }
        lay_drop += any;
    }
    char steps[48];
    steps_text(rep, steps, sizeof steps);

    /* What ShadowKV kept. */
    if (a.n_ev == 0) {
        snprintf(rep->kept, sizeof rep->kept, "no decode step has needle data, so nothing can be said about what %s kept",
                 rep->policy);
    } else {
        snprintf(rep->kept, sizeof rep->kept,
                 "%s kept every needle chunk in %d of %d (step, layer, KV head) at %s and %.0f%% of the needle's %s: "
                 "%.0f%% as outliers, %.0f%% in the local window, %.0f%% selected (keys rebuilt at rank %d); it dropped %.0f%%",
                 rep->policy, a.n_ev_kept, a.n_ev, steps, 100 * (1 - rep->share_dropped),
                 rep->has_oracle ? "exact attention mass" : "chunk-weighted tokens", 100 * rep->share_outlier,
                 100 * rep->share_local, 100 * rep->share_selected, rep->rank, 100 * rep->share_dropped);
    }
    set_divergence(rep);

    /* The causes. */
    if (rep->dense_hit == 0) {
        needle_cause *c = add_cause(rep, NEEDLE_CAUSE_DENSE, 2.0);
        c->step = rep->diverge_step >= 0 ? rep->diverge_step : 0;
        snprintf(c->evidence, sizeof c->evidence,
                 "the model misses it with dense attention too: dense answered \"%s\" for value %s; "
                 "%s %s the needle's chunks (%.0f%% of its %s kept at %s)",
                 rep->dense_answer, rep->value, rep->policy, rep->share_dropped < NEEDLE_MIN_SHARE ? "kept" : "did not keep all of",
                 100 * (1 - rep->share_dropped), rep->has_oracle ? "attention mass" : "tokens", steps);
        snprintf(c->fix, sizeof c->fix, "use a model that retrieves at this length with dense attention; "
                 "the %s settings cannot fix this", rep->policy);
    }
    if (rep->share_dropped >= NEEDLE_MIN_SHARE && sd.i >= 0) {
        needle_cause *c = add_cause(rep, NEEDLE_CAUSE_BUDGET, rep->share_dropped);
        const probe_ev_needle *e = probe_store_needle(st, id, ws, sd.l, sd.h);
        c->step = ws; c->layer = sd.l; c->head = sd.h; c->chunk = e->chunks[sd.i];
        snprintf(c->evidence, sizeof c->evidence,
                 "needle chunk %d ranked %d >= budget k = %d chunks (layer %d, head %d); a needle chunk was dropped in "
                 "%d of %d layers (%d of %d layer-heads) at step %d; the selection dropped %.0f%% of the needle's %s "
                 "over %s",
                 c->chunk, sd.rank, e->k, sd.l, sd.h, lay_drop, rep->n_layers, lh_drop, lh_total, ws,
                 100 * rep->share_dropped, rep->has_oracle ? "exact attention mass" : "tokens", steps);
        int k_need = need_max(a.needs, a.n_needs);
        int kn = k_need > rep->k ? k_need : rep->k + 1; /* never below what missed */
        long long kt = (long long)kn * rep->chunk;
        int k90 = need_quantile(a.needs, a.n_needs, 0.9);
        set_change(c, "budget", (double)kt);
        c->dense_needed = rep->n_cand > 0 && kn >= rep->n_cand;
        if (rep->n_cand > 1) c->limit = (double)(rep->n_cand - 1) * rep->chunk; /* the ladder stays sparse */
        if (c->dense_needed)
            snprintf(c->fix, sizeof c->fix, "dense would be needed for all of it: the needle's chunks rank so low that "
                     "k = %d chunks (--budget %lld) selects every one of the %d candidates", kn, kt, rep->n_cand);
        else
            snprintf(c->fix, sizeof c->fix, "raise --budget to %lld tokens (k = %d chunks of %d tokens)", kt, kn,
                     rep->chunk);
        if (k90 < kn && k90 > rep->k) {
            cat(c->fix, sizeof c->fix, "; %lld (k = %d) would keep 90%% of what was dropped",
                (long long)k90 * rep->chunk, k90);
            c->smaller = (double)k90 * rep->chunk; /* checked first, even when the whole rank asks for dense */
        } else if (c->dense_needed && 2 * rep->k < rep->n_cand - 1) {
            cat(c->fix, sizeof c->fix, "; twice the budget (%lld) is checked first", 2LL * rep->k * rep->chunk);
            c->smaller = 2.0 * rep->k * rep->chunk;
        }
    }
    if (rep->share_misranked >= NEEDLE_MIN_SHARE && sm.i >= 0) {
        needle_cause *c = add_cause(rep, NEEDLE_CAUSE_OUTLIER, rep->share_misranked);
        const probe_ev_needle *e = probe_store_needle(st, id, ws, sm.l, sm.h);
        const probe_ev_needle *pre = probe_store_needle(st, id, -1, sm.l, sm.h);
        const probe_ev_prefill_head *ph = probe_store_prefill_head(st, sm.l, sm.h);
        int j = e->chunks[sm.i], nb = rep->local_start >= 0 ? rep->local_start : rep->prompt_chunks;
        float cm = pre && pre->n_info ? pre->cos_min[sm.i] : NAN, cut = outlier_cut(ph);
        char ord[16], cuts[48];
        if (isnan(cut)) snprintf(cuts, sizeof cuts, "there are no outliers (--outliers %d)", rep->outliers);
        else snprintf(cuts, sizeof cuts, "the outlier cut is %.3f with --outliers %d", cut, rep->outliers);
        c->step = ws; c->layer = sm.l; c->head = sm.h; c->chunk = j;
        snprintf(c->evidence, sizeof c->evidence,
                 "needle chunk %d is not an outlier (cos-min %.3f, the %s lowest of %d chunks; %s); its landmark "
                 "ranked it %d >= k = %d while exact attention ranked it %d < k (layer %d, head %d, step %d; "
                 "misranked in %d of %d layer-heads); %.0f%% of the needle's mass was misranked",
                 j, cm, ordinal(cosmin_order(ph, j, nb) + 1, ord, sizeof ord), nb, cuts, sm.rank, e->k, sm.rank_exact,
                 sm.l, sm.h, ws, lh_mis, lh_nonout, 100 * rep->share_misranked);
        /* the outliers that keep dense every misranked chunk of weight (need_max), and the named chunk's own */
        int k_need = need_max(a.needs, a.n_needs), kn = k_need > rep->k ? k_need : rep->k + 1;
        int out_need = need_max(a.outs, a.n_outs), named = cosmin_order(ph, j, nb) + 1;
        if (named > out_need) out_need = named;
        if (out_need <= nb / 2 && out_need > rep->outliers) {
            set_change(c, "outliers", out_need);
            c->limit = nb / 2;
            if (out_need == named)
                snprintf(c->fix, sizeof c->fix, "raise --outliers to %d chunks (chunk %d is the %s lowest, so %d "
                         "outliers keep it dense)", out_need, j, ord, out_need);
            else
                snprintf(c->fix, sizeof c->fix, "raise --outliers to %d chunks (it keeps dense every misranked needle "
                         "chunk with 1%% or more of the dropped mass; chunk %d alone, the %s lowest, needs %d)",
                         out_need, j, ord, named);
            if (named < out_need && named > rep->outliers) c->smaller = named;
        } else {
            set_change(c, "budget", (double)kn * rep->chunk);
            c->dense_needed = rep->n_cand > 0 && kn >= rep->n_cand;
            if (rep->n_cand > 1) c->limit = (double)(rep->n_cand - 1) * rep->chunk;
            if (c->dense_needed)
                snprintf(c->fix, sizeof c->fix, "dense would be needed for all of it: k = %d chunks (--budget %lld) "
                         "selects every candidate, and keeping the misranked chunks dense would take --outliers %d of "
                         "%d chunks", kn, (long long)kn * rep->chunk, out_need, nb);
            else
                snprintf(c->fix, sizeof c->fix, "raise --budget to %lld tokens (k = %d chunks; their cos-minima are not "
                         "low: keeping the misranked chunks dense would take --outliers %d of %d chunks)",
                         (long long)kn * rep->chunk, kn, out_need, nb);
            if (c->dense_needed && 2 * rep->k < rep->n_cand - 1) c->smaller = 2.0 * rep->k * rep->chunk;
        }
    }
    if (rep->share_near_local >= NEEDLE_MIN_SHARE && sn.i >= 0 && a.near_min >= 0) {
        needle_cause *c = add_cause(rep, NEEDLE_CAUSE_LOCAL, rep->share_near_local);
        const probe_ev_needle *e = probe_store_needle(st, id, ws, sn.l, sn.h);
        c->step = ws; c->layer = sn.l; c->head = sn.h; c->chunk = e->chunks[sn.i];
        snprintf(c->evidence, sizeof c->evidence,
                 "dropped needle chunk %d lies %d chunks before the local window (it starts at chunk %d with --local %d); "
                 "%.0f%% of the needle's mass was dropped within %d chunks of the prompt's end",
                 a.near_min, rep->local_start - a.near_min, rep->local_start, rep->local, 100 * rep->share_near_local, reach);
        set_change(c, "local", rep->prompt_chunks - a.near_min);
        snprintf(c->fix, sizeof c->fix, "raise --local to %d chunks (the window then starts at chunk %d and holds the "
                 "needle)", rep->prompt_chunks - a.near_min, a.near_min);
    }
    if (rep->share_selected >= NEEDLE_MIN_SHARE && rep->key_err_selected >= NEEDLE_RANK_ERR) {
        double score = rep->share_selected * fmin(1.0, rep->key_err_selected / 0.5);
        needle_cause *c = add_cause(rep, NEEDLE_CAUSE_RANK, score);
        c->step = a.first_sel_step; c->layer = a.ke_l; c->head = a.ke_h;
        snprintf(c->evidence, sizeof c->evidence,
                 "the needle's keys are rebuilt at rank %d with %.0f%% relative error (weighted over the layer-heads that "
                 "selected them; worst layer %d head %d: %.0f%%)",
                 rep->rank, 100 * rep->key_err_selected, a.ke_l, a.ke_h, 100 * a.worst_ke);
        if (a.m_n)
            cat(c->evidence, sizeof c->evidence, "; there the sparse attention put %.4f of its mass on the needle where "
                "exact keys would put %.4f", a.ms_sum / a.m_n, a.mi_sum / a.m_n);
        /* weak: the blurred keys put about as much mass on the needle as exact keys would */
        if (a.m_n) {
            double ms = a.ms_sum / a.m_n, mi = a.mi_sum / a.m_n;
            c->weak = ms >= mi * (1 - NEEDLE_WEAK_SHARE);
        }
        int r = rank_for(st, rep->n_layers, NEEDLE_RANK_TARGET);
        if (r > rep->rank) {
            set_change(c, "rank", r);
            snprintf(c->fix, sizeof c->fix, "raise --rank to %d (key error <= %.0f%% in every layer)", r,
                     100 * NEEDLE_RANK_TARGET);
        } else {
            set_change(c, "rank", 2 * rep->rank);
            snprintf(c->fix, sizeof c->fix, "the layers' spectra look fine at rank %d but the needle's keys lie off "
                     "the dominant subspace: raise --rank to %d, or keep its chunks dense with more --outliers",
                     rep->rank, 2 * rep->rank);
        }
    }
    qsort(rep->causes, (size_t)rep->n_causes, sizeof rep->causes[0], cause_cmp);
    free(a.drop_step);
    free(a.needs);
    free(a.outs);
    return 0;
}

/* ---- the printed report --------------------------------------------------------- */

static const char *part_name(int p) { return p == 1 ? "outlier" : p == 2 ? "local" : "cand"; }

/* "--budget 320 tokens (k = 40 chunks)" for a try's value, into buf. */
static const char *try_label(const needle_report *rep, const needle_cause *c, double v, char *buf, size_t n) {
    int u = rep->generic ? rep->unit : rep->chunk;
    if (strcmp(c->opt, "budget")) snprintf(buf, n, "--%s %.0f", c->opt, v);
    else if (u <= 1) snprintf(buf, n, "--budget %.0f tokens", v);
    else if (rep->generic) snprintf(buf, n, "--budget %.0f tokens (%.0f pages of %d)", v, floor(v / u), u);
    else snprintf(buf, n, "--budget %.0f tokens (k = %.0f chunks)", v, floor(v / u));
    return buf;
}

void needle_cause_text(const needle_report *rep, const needle_cause *c, char *buf, size_t n) {
    int len = snprintf(buf, n, "%s%s: %s: %s", c->weak ? "(weak evidence) " : "", needle_cause_name(c->kind),
                       c->evidence, c->fix);
    if (len < 0 || (size_t)len >= n || !c->opt[0]) return;
    if (c->n_tries == 1 && c->tries[0].value == c->proposed) { /* the change the fix names, checked */
        snprintf(buf + len, n - (size_t)len, " -> %s (checked: answered \"%s\")",
                 c->tries[0].hit ? "retrieved" : "still missed", c->tries[0].answer);
        return;
    }
    if (c->n_tries > 0) { /* every rerun in order, the last one the verdict */
        for (int i = 0; i < c->n_tries && (size_t)len < n; i++) {
            char lab[96] = "";
            if (i || c->tries[i].value != c->proposed) { /* the value the fix names goes unnamed */
                try_label(rep, c, c->tries[i].value, lab, sizeof lab);
                strcat(lab, ": ");
            }
            int k = snprintf(buf + len, n - (size_t)len, "%s%s%s (checked: answered \"%s\")", i ? "; then " : " -> ",
                             lab, c->tries[i].hit ? "retrieved" : "still missed", c->tries[i].answer);
            if (k < 0) return;
            len += k;
        }
        return;
    }
    if (rep->dense_hit == 0)
        snprintf(buf + len, n - (size_t)len, " (not checked: dense misses too)");
    else
        snprintf(buf + len, n - (size_t)len, rep->checks ? " (not checked)" : " (unchecked: skv needle --explain "
                 "reruns the case with it, unless --no-check)");
}

static const char *hit_word(int hit) { return hit > 0 ? "hit" : hit == 0 ? "miss" : "unknown"; }

void needle_headline(const needle_report *rep, char *buf, size_t n) {
    if (rep->pending) {
        snprintf(buf, n, "%s has not finished its answer: \"%s\" so far, the value is %s (step further)", rep->policy,
                 rep->sparse_answer, rep->value);
    } else if (rep->sparse_hit < 0 || !rep->value[0]) {
        snprintf(buf, n, "%s: the answer is unknown (no needle result recorded, and no number in the watched needle)",
                 rep->policy);
    } else if (rep->sparse_hit > 0) {
        snprintf(buf, n, "%s retrieved %s%s", rep->policy, rep->value,
                 rep->dense_hit > 0 ? ", as dense did" : rep->dense_hit == 0 ? "; dense missed it" : "");
        if (rep->dense_hit > 0 && rep->scored_steps > 0)
            cat(buf, n, " (top-1 agreement with dense at %d of %d steps)", rep->agree_steps, rep->scored_steps);
    } else {
        snprintf(buf, n, "%s missed %s (answered \"%s\")%s", rep->policy, rep->value, rep->sparse_answer,
                 rep->dense_hit > 0 ? "; dense retrieved it" : rep->dense_hit == 0 ? "; dense missed it too" : "");
    }
}

/* The verdict of a miss: each cause in order, or (none) "<policy> <none>",
 * then what the policy kept. */
static void print_causes(FILE *f, const needle_report *rep, const char *none) {
    fprintf(f, "  verdict:\n");
    if (rep->n_causes == 0) fprintf(f, "    no cause passed its threshold: %s %s\n", rep->policy, none);
    for (int i = 0; i < rep->n_causes; i++) {
        char line[2400];
        needle_cause_text(rep, &rep->causes[i], line, sizeof line);
        fprintf(f, "    %d. %s\n", i + 1, line);
    }
    fprintf(f, "  %s\n", rep->kept);
}

static void print_verdict(FILE *f, const needle_report *rep) {
    fprintf(f, "  %s\n", rep->divergence);
    if (rep->sparse_hit > 0) { /* a hit: what would break first, never a list of failures */
        fprintf(f, "  margins (the needle was retrieved; what would break first):\n");
        if (rep->n_causes == 0) fprintf(f, "    none near its threshold\n");
        for (int i = 0; i < rep->n_causes; i++)
            fprintf(f, "    %d. %s: %s\n", i + 1, needle_cause_name(rep->causes[i].kind), rep->causes[i].evidence);
        fprintf(f, "  %s\n", rep->kept);
        return;
    }
    print_causes(f, rep, "kept the needle; look at the divergence above (what else it kept or dropped changed "
                          "the hidden state)");
}

static void print_generic(FILE *f, const probe_store *st, const needle_report *rep, int verbose) {
    fprintf(f, "  needle: tokens %d..%d (%d tokens); prompt %d tokens; %s attends blocks of %d tokens, budget %d\n",
            rep->tok_begin, rep->tok_end - 1, rep->tok_end - rep->tok_begin, rep->prompt_len, rep->policy, rep->unit,
            rep->budget);
    char head[400];
    needle_headline(rep, head, sizeof head);
    fprintf(f, "  %s\n", head);
    if (rep->sparse_hit >= 0)
        fprintf(f, "  value %s; dense answered \"%s\" (%s); %s answered \"%s\" (%s)\n", rep->value, rep->dense_answer,
                hit_word(rep->dense_hit), rep->policy, rep->sparse_answer, hit_word(rep->sparse_hit));
    if (verbose)
        fprintf(f, "  decode steps (needle tokens attended by every query head / needle tokens; the needle's best rank "
                   "under exact attention; its exact mass; tokens attended; mass recall; output error)\n");
    for (int s = 0; verbose && s < rep->n_steps; s++)
        for (int l = 0; l < rep->n_layers; l++)
            for (int h = 0; h < rep->n_heads; h++) {
                const probe_ev_oracle *e = probe_store_oracle(st, s, l, h);
                if (!e || e->needle_len <= 0) continue;
                fprintf(f, "    step %2d layer %2d head %d | kept %2d/%-2d %-4s rank %5d | mass %.4f | attended %5d | "
                           "recall %5.1f%% | out err %.3f\n",
                        s, l, h, e->needle_kept, e->needle_len, e->needle_kept < e->needle_len ? "DROP" : "",
                        e->needle_rank, e->needle_mass, e->n_kept, 100 * e->recall, e->out_err);
            }
    print_verdict(f, rep);
}

void needle_report_print(FILE *f, const probe_store *st, const needle_report *rep, int verbose) {
    if (rep->generic) {
        print_generic(f, st, rep, verbose);
        return;
    }
    int id = rep->id;
    fprintf(f, "  needle: tokens %d..%d (%d tokens) in chunk%s %d", rep->tok_begin, rep->tok_end - 1,
            rep->tok_end - rep->tok_begin, rep->n_chunks > 1 ? "s" : "", rep->first_chunk);
    if (rep->n_chunks > 1) fprintf(f, "..%d", rep->first_chunk + rep->n_chunks - 1);
    fprintf(f, " of %d tokens; prompt %d tokens, %d full chunks\n", rep->chunk, rep->prompt_len, rep->prompt_chunks);
    fprintf(f, "  settings: rank %d, budget %d tokens (k = %d of %d candidate chunks per KV head), outliers %d, "
               "local window from chunk %d (--local %d)\n",
            rep->rank, rep->budget, rep->k, rep->n_cand, rep->outliers, rep->local_start, rep->local);
    char head[400];
    needle_headline(rep, head, sizeof head);
    fprintf(f, "  %s\n", head);
    if (rep->sparse_hit >= 0)
        fprintf(f, "  value %s; dense answered \"%s\" (%s); %s answered \"%s\" (%s)\n", rep->value,
                rep->dense_answer, hit_word(rep->dense_hit), rep->policy, rep->sparse_answer, hit_word(rep->sparse_hit));
    if (!verbose) { /* the verdict; the tables behind it with --verbose */
        print_verdict(f, rep);
        return;
    }
    fprintf(f, "  prefill, per layer and KV head: the rank-%d error of the needle's keys; each needle chunk's part "
               "(cand = offloaded and selectable) and cos-min\n", rep->rank);
    for (int l = 0; l < rep->n_layers; l++)
        for (int h = 0; h < rep->n_heads; h++) {
            const probe_ev_needle *e = probe_store_needle(st, id, -1, l, h);
            if (!e) continue;
            fprintf(f, "    layer %2d head %d  key err %6.3f |", l, h, e->key_err);
            for (int i = 0; i < e->n_chunks && e->n_info; i++)
                fprintf(f, "  c%d %-7s cos-min %6.3f", e->chunks[i], part_name(e->part[i]), e->cos_min[i]);
            fprintf(f, "\n");
        }
    fprintf(f, "  decode steps (r: landmark rank among candidates, 0 = best, selected when < k = %d; x: rank by exact "
               "attention; mass on the needle: exact / sparse / ideal = exact keys for what was kept)\n", rep->k);
    for (int s = 0; s < rep->n_steps; s++)
        for (int l = 0; l < rep->n_layers; l++)
            for (int h = 0; h < rep->n_heads; h++) {
                const probe_ev_needle *e = probe_store_needle(st, id, s, l, h);
                if (!e) continue;
                fprintf(f, "    step %2d layer %2d head %d |", s, l, h);
                for (int i = 0; i < e->n_chunks; i++) {
                    int p = e->n_info ? e->part[i] : 0;
                    if (p) fprintf(f, "  c%d %-19s", e->chunks[i], part_name(p));
                    else {
                        char x[24] = "";
                        if (e->n_info && e->rank_exact[i] >= 0) snprintf(x, sizeof x, " x%d", e->rank_exact[i]);
                        char cell[48];
                        snprintf(cell, sizeof cell, "r%d%s %s", e->rank[i], x, e->selected[i] ? "sel" : "DROP");
                        fprintf(f, "  c%d %-19s", e->chunks[i], cell);
                    }
                }
                if (e->mass_exact >= 0)
                    fprintf(f, " | mass %.4f / %.4f / %.4f | out err %.3f\n", e->mass_exact, e->mass_sparse,
                            e->mass_ideal, e->out_err);
                else
                    fprintf(f, " | sparse mass %.4f\n", e->mass_sparse);
            }
    fprintf(f, "  %s\n", rep->divergence);
    print_causes(f, rep, "kept the needle with accurate keys; look at the divergence above (other chunks' "
                          "selection changed the hidden state)");
}

static needle_amend_fn g_amend;

void needle_diag_set_amend(needle_amend_fn fn) { g_amend = fn; }

int needle_diagnose(const probe_store *st, int id, needle_report *rep) {
    int rc = diagnose_one(st, id, rep);
    if (!rc && g_amend) g_amend(st, rep);
    return rc;
}

/* ---- two policies on the same needle ---------------------------------------- */

/* 1 when the event's policy attended every position (a dense layer, or a
 * context its budget covers): nothing was selected there. */
static int attended_all(const probe_ev_oracle *e) { return e->ctx > 0 && e->n_kept >= e->ctx; }

/* 1 when the policy reads layer l's tokens that it keeps no exact copy of
 * at low precision: TailorKV's quantized layers ("quantized"), SpeCache's
 * every layer ("lowbit"). */
static int lowbit_layer(const probe_store *st, int l) {
    const probe_ev_metric *b = probe_store_metric(st, "lowbit", -1, l, -1);
    return quantized_layer(st, l) || (b && b->value > 0.5f);
}

/* How many of the needle's tokens a policy read at an event of layer l: all
 * of them when it attended whole (*why 1) or reads the layer's other tokens
 * at low precision (*why 2); else those it kept exactly (0). */
static int needle_read(const probe_store *st, const probe_ev_oracle *e, int l, int *why) {
    *why = attended_all(e) ? 1 : lowbit_layer(st, l) ? 2 : 0;
    return *why ? e->needle_len : e->needle_kept;
}

/* " (layers 0-1, which quest attended densely, are left out)" for the layers
 * flagged in dense (n of them), into buf; "" when none. */
static void dense_note(const unsigned char *dense, int n, const char *name, char *buf, size_t cap) {
    buf[0] = 0;
    int cnt = 0;
    for (int l = 0; l < n; l++) cnt += dense[l];
    if (!cnt) return;
    cat(buf, cap, " (layer%s", cnt > 1 ? "s" : "");
    for (int l = 0, first = 1; l < n; l++) {
        if (!dense[l]) continue;
        int e = l;
        while (e + 1 < n && dense[e + 1]) e++;
        if (e > l) cat(buf, cap, "%s %d-%d", first ? "" : ",", l, e);
        else cat(buf, cap, "%s %d", first ? "" : ",", l);
        first = 0;
        l = e;
    }
    cat(buf, cap, ", which %s attended densely, %s left out: a dense layer selects nothing)", name, cnt > 1 ? "are" : "is");
}

int needle_diverge(const probe_store *a, const char *name_a, const probe_store *b, const char *name_b,
                   needle_split *out) {
    memset(out, 0, sizeof *out);
    out->step = out->layer = out->head = out->rank = -1;
    int ns = probe_store_n_steps(a) < probe_store_n_steps(b) ? probe_store_n_steps(a) : probe_store_n_steps(b);
    int nl = probe_store_n_layers(a), nh = probe_store_n_kv_heads(a);
    if (probe_store_n_layers(b) != nl || probe_store_n_kv_heads(b) != nh) {
        snprintf(out->text, sizeof out->text, "%s and %s ran on different model shapes", name_a, name_b);
        return SKV_EMISSING;
    }
    /* Pass 0: where a kept more of the needle than b, weighed by the exact
     * mass at stake; pass 1 (none such): any difference. A (step, layer,
     * head) that either attended whole is not compared: a dense layer is
     * not a policy's selection, and it is never named as one. */
    int seen = 0;
    unsigned char dense_a[256] = {0}, dense_b[256] = {0};
    /* the first step where one read every needle token (attended whole, or
     * quantized the layer) and the other dropped some, weighed as in pass 0:
     * said when the layers both selected in do not differ */
    needle_split dsp = { .step = -1 };
    double dsp_best = 0;
    int dsp_why = 0, dsp_a = 0;
    for (int pass = 0; pass < 2 && out->step < 0; pass++)
        for (int s = 0; s < ns && out->step < 0; s++) {
            double best = 0;
            for (int l = 0; l < nl; l++)
                for (int h = 0; h < nh; h++) {
                    const probe_ev_oracle *ea = probe_store_oracle(a, s, l, h), *eb = probe_store_oracle(b, s, l, h);
                    if (!ea || !eb || ea->needle_len <= 0 || ea->needle_len != eb->needle_len) continue;
                    seen = 1;
                    int wa, wb, ra = needle_read(a, ea, l, &wa), rb = needle_read(b, eb, l, &wb);
                    double vr = (double)abs(ra - rb) / ea->needle_len * (ea->needle_mass > 0 ? ea->needle_mass : 0);
                    if (pass == 0 && wa != wb && ra != rb && (ra > rb ? wa : wb) && vr >= 1e-3 && vr > dsp_best &&
                        (dsp.step < 0 || dsp.step == s)) { /* the first step where it shows, as pass 0 */
                        dsp_best = vr;
                        dsp = (needle_split){ .step = s, .layer = l, .head = h, .needle_len = ea->needle_len,
                                              .kept_a = ea->needle_kept, .kept_b = eb->needle_kept,
                                              .rank = ea->needle_rank, .mass = ea->needle_mass };
                        dsp_a = ra > rb;
                        dsp_why = ra > rb ? wa : wb;
                    }
                    if (attended_all(ea) || attended_all(eb)) {
                        if (l < 256) {
                            dense_a[l] |= attended_all(ea) && !attended_all(eb);
                            dense_b[l] |= attended_all(eb) && !attended_all(ea);
                        }
                        continue;
                    }
                    if (s + 1 > out->steps_compared) out->steps_compared = s + 1;
                    double m = ea->needle_mass > 0 ? ea->needle_mass : 0, d = ea->needle_kept - eb->needle_kept;
                    double v = pass == 0 ? d / ea->needle_len * m : fabs(d) * (m + 1e-6);
                    if (v > best && d != 0 && (pass == 1 || v >= 1e-3)) {
                        best = v;
                        out->step = s;
                        out->layer = l;
                        out->head = h;
                        out->needle_len = ea->needle_len;
                        out->kept_a = ea->needle_kept;
                        out->kept_b = eb->needle_kept;
                        out->rank = ea->needle_rank;
                        out->mass = ea->needle_mass;
                    }
                }
        }
    if (!seen) {
        snprintf(out->text, sizeof out->text, "%s and %s: no needle measures to compare (run both with the oracle "
                 "watching the needle: skv needle --explain)", name_a, name_b);
        return SKV_EMISSING;
    }
    char dn[200], dn_b[200];
    dense_note(dense_a, nl < 256 ? nl : 256, name_a, dn, sizeof dn);
    dense_note(dense_b, nl < 256 ? nl : 256, name_b, dn_b, sizeof dn_b);
    if (strlen(dn) + strlen(dn_b) < sizeof dn) strcat(dn, dn_b);
    if (out->step < 0 && dsp.step >= 0) { /* they parted where one of them read every needle token */
        int sc = out->steps_compared;
        *out = dsp;
        out->steps_compared = sc;
        const char *all = dsp_a ? name_a : name_b, *other = dsp_a ? name_b : name_a;
        snprintf(out->text, sizeof out->text, "%s and %s diverged on the needle at step %d, layer %d, KV head %d: %s "
                 "%s and read all %d of the needle's tokens there, %s attended %d of them exactly and dropped the "
                 "rest (exact mass on the needle %.1f%%); where both selected they kept the same share", name_a,
                 name_b, out->step, out->layer, out->head, all,
                 dsp_why == 1 ? "attended that layer whole (nothing selected)" : "reads that layer at low precision "
                 "where it keeps no exact copy", out->needle_len, other, dsp_a ? out->kept_b : out->kept_a,
                 100.0 * (out->mass > 0 ? out->mass : 0));
        return 0;
    }
    if (out->step < 0) {
        snprintf(out->text, sizeof out->text, "%s and %s kept the same share of the needle's tokens in every layer "
                 "and KV head both selected in over %d step%s: they parted after the attention, not in what they "
                 "kept%s", name_a, name_b, out->steps_compared, out->steps_compared == 1 ? "" : "s", dn);
        return SKV_EMISSING;
    }
    char rk[64] = "", q[400] = "";
    if (out->rank >= 0) snprintf(rk, sizeof rk, "; exact attention ranks the needle %d there", out->rank);
    /* a layer kept at low precision: its needle tokens were read, not dropped */
    const char *qn = lowbit_layer(b, out->layer) ? name_b : lowbit_layer(a, out->layer) ? name_a : NULL;
    if (qn) snprintf(q, sizeof q, "; %s reads layer %d at low precision where it keeps no exact copy, so it read "
                     "those tokens rather than dropping them", qn, out->layer);
    if (strlen(q) + strlen(dn) < sizeof q) strcat(q, dn);
    if (out->kept_a < out->kept_b && qn == name_a && out->kept_b < out->needle_len)
        snprintf(out->text, sizeof out->text,
                 "%s and %s diverged on the needle at step %d, layer %d, KV head %d: %s reads that layer at low "
                 "precision where it keeps no exact copy and read all %d of its tokens, while %s attended %d of them "
                 "exactly and dropped the rest "
                 "(exact mass on the needle %.1f%%%s)", name_a, name_b, out->step, out->layer, out->head, name_a,
                 out->needle_len, name_b, out->kept_b, 100.0 * (out->mass > 0 ? out->mass : 0), rk);
    else if (out->kept_a > out->kept_b)
        snprintf(out->text, sizeof out->text,
                 "%s and %s diverged on the needle at step %d, layer %d, KV head %d: %s attended %d of its %d tokens, "
                 "%s %d (exact mass on the needle %.1f%%%s)%s", name_a, name_b, out->step, out->layer, out->head, name_a,
                 out->kept_a, out->needle_len, name_b, out->kept_b, 100.0 * (out->mass > 0 ? out->mass : 0), rk, q);
    else if (snprintf(out->text, sizeof out->text,
                 "%s attended as much of the needle as %s or more in every layer and KV head; they differ most at "
                 "step %d, layer %d, KV head %d (%s %d of %d tokens, %s %d; exact mass %.1f%%%s), so %s's miss "
                 "came from the rest of what it kept or its precision, not from dropping the needle%s",
                 name_b, name_a, out->step, out->layer, out->head, name_b, out->kept_b, out->needle_len, name_a,
                 out->kept_a, 100.0 * (out->mass > 0 ? out->mass : 0), rk, name_b, q) >= (int)sizeof out->text)
        memcpy(out->text + sizeof out->text - 4, "...", 4); /* cut: say so */
    return 0;
}

/* ---- distractor answers ---------------------------------------------------- */

int needle_distractor_check(const probe_store *st, int fact, int last_step, const char *target_key,
                            const char *distractor_key, needle_distractor *out) {
    memset(out, 0, sizeof *out);
    int L = probe_store_n_layers(st), H = probe_store_n_kv_heads(st), S = probe_store_n_steps(st);
    if (last_step < 0 || last_step >= S) last_step = S - 1;
    double tk = 0, tm = 0, dk = 0, dm = 0;
    int n = 0, steps = 0;
    for (int s = 0; s <= last_step; s++) {
        int any = 0;
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++) {
                const probe_ev_oracle *o = probe_store_oracle(st, s, l, h);
                const probe_ev_metric *m = probe_store_metric(st, "distractors", s, l, h);
                if (!o || !m || o->needle_len <= 0 || fact < 1 || 2 * fact > m->n || !m->vals) continue;
                double share = (double)o->needle_kept / o->needle_len;
                tk += share * o->needle_mass;
                tm += o->needle_mass;
                dk += m->vals[2 * (fact - 1)] * (double)m->vals[2 * fact - 1];
                dm += m->vals[2 * fact - 1];
                n++;
                any = 1;
            }
        steps += any;
    }
    if (!n) {
        snprintf(out->text, sizeof out->text, "no record of the distractor (run with --oracle)");
        return SKV_EMISSING;
    }
    out->target_kept = tm > 0 ? tk / tm : 0;
    out->distractor_kept = dm > 0 ? dk / dm : 0;
    out->target_mass = tm / n;
    out->distractor_mass = dm / n;
    out->steps = steps;
    const char *what = out->distractor_kept >= 0.5 && out->target_kept < 0.5 ? "kept the distractor and dropped the asked fact"
                       : out->target_kept >= 0.5 && out->distractor_kept >= 0.5 ? "kept both facts (the mix-up is the model's reading, not the selection)"
                       : out->target_kept >= 0.5 ? "kept the asked fact and dropped the distractor, yet answered the distractor"
                       : "dropped both facts";
    snprintf(out->text, sizeof out->text,
             "the policy %s: it kept %.0f%% of %s's fact and %.0f%% of %s's (shares weighted by exact attention, "
             "which put %.3f on %s's and %.3f on %s's per layer and head, over %d step%s)",
             what, 100 * out->target_kept, target_key && *target_key ? target_key : "the asked", 100 * out->distractor_kept,
             distractor_key && *distractor_key ? distractor_key : "the distractor", out->target_mass,
             target_key && *target_key ? target_key : "the asked", out->distractor_mass,
             distractor_key && *distractor_key ? distractor_key : "the distractor", steps, steps == 1 ? "" : "s");
    return 0;
}
