/* test_peer_views.c: the peers' own measures and the views made for them.
 *  - PROBE_METRIC in the store: indexed by name, step, layer and head,
 *    range-checked like every other event;
 *  - on the demo model (samples/), Quest, FreeKV, SpeCache and TailorKV run
 *    in lockstep into a trace, and each lane carries its own measures, which
 *    are checked for what they claim: Quest's bounds bound the true max q·k
 *    of every page and the reported rank is the best page's rank under them;
 *    FreeKV's corrected flag is its cosine below tau; SpeCache's overlap and
 *    recall are shares; TailorKV's P is a share, its map has every layer and
 *    its channels are distinct channel ids;
 *  - the four peer views draw from the trace alone for their own policy,
 *    into the terminal and into a PNG, and say whose measures they need for
 *    another policy;
 *  - needle_diverge: where two policies' kept sets parted on the needle. */
#include "canvas.h"
#include "compare.h"
#include "lanes.h"
#include "model.h"
#include "needle_diag.h"
#include "skv.h"
#include "testhelp.h"
#include "trace.h"
#include "view.h"

#include <unistd.h>

static void test_store_metric(void) {
    probe_store *st = NULL;
    if (probe_store_new(&st)) return;
    probe_event run = {.kind = PROBE_RUN, .run = {.model = "m", .n_layers = 2, .n_kv_heads = 2, .max_ctx = 64,
                                                  .kv_policy = "quest"}};
    float vals[3] = {1, 2, 3};
    probe_event a = {.kind = PROBE_METRIC, .metric = {.step = 3, .layer = 1, .head = 0, .name = "x", .value = 0.5f,
                                                      .n = 3, .vals = vals}};
    probe_event b = {.kind = PROBE_METRIC, .metric = {.step = -1, .layer = 0, .head = -1, .name = "y", .value = 2}};
    int rc = probe_store_add(st, &run) || probe_store_add(st, &a) || probe_store_add(st, &b);
    const probe_ev_metric *m = probe_store_metric(st, "x", 3, 1, 0);
    test_cond("a metric is found by name, step, layer and head", rc == 0 && m && m->value == 0.5f && m->n == 3 &&
                                                                    m->vals[2] == 3);
    test_cond("a whole-layer prefill metric is found at step -1, head -1",
              probe_store_metric(st, "y", -1, 0, -1) && probe_store_metric(st, "y", -1, 0, -1)->value == 2);
    test_cond("another name or place finds nothing", !probe_store_metric(st, "x", 3, 1, 1) &&
                                                        !probe_store_metric(st, "z", 3, 1, 0) &&
                                                        probe_store_has_metric(st, "y") &&
                                                        !probe_store_has_metric(st, "z"));
    test_cond("the metric's step counts as a decode step", probe_store_n_steps(st) == 4);
    probe_event bad = a;
    bad.metric.head = 2;
    test_cond("a head past the run's KV heads is refused", probe_store_add(st, &bad) == SKV_ERANGE);
    bad = a;
    bad.metric.name = "";
    test_cond("an empty name is refused", probe_store_add(st, &bad) != 0);
    bad = a;
    bad.metric.layer = 2;
    test_cond("a layer past the run's layers is refused", probe_store_add(st, &bad) == SKV_ERANGE);
    probe_store_free(st);
}

/* Draws view name for lane i of n into a cells canvas; returns the text (free it) and the draw's code. */
static char *draw_text(const char *name, const probe_store *st, int layer, int *rc) {
    canvas *cv = NULL;
    char *t = NULL;
    *rc = -99;
    view_cursor cur;
    view_cursor_init(&cur);
    cur.layer = layer;
    if (!canvas_cells_new(&cv, 120, 40, 0)) {
        *rc = view_find(name)->draw(cv, (canvas_rect){0, 0, 120, 40}, st, &cur, NULL);
        t = canvas_cells_text(cv);
    }
    canvas_free(cv);
    return t;
}

static int draw_png(const char *name, const probe_store *st, int layer, const char *path) {
    canvas *cv = NULL;
    view_cursor cur;
    view_cursor_init(&cur);
    cur.layer = layer;
    int rc = canvas_png_new(&cv, 900, 560, NULL);
    if (!rc) rc = view_find(name)->draw(cv, (canvas_rect){0, 0, 900, 560}, st, &cur, NULL);
    if (!rc) rc = canvas_save(cv, path, 1);
    canvas_free(cv);
    return rc;
}

static void check_quest(const probe_store *st) {
    int n = 0, bound = 1, rank_ok = 1;
    for (int s = 0; s < probe_store_n_steps(st); s++)
        for (int l = 0; l < probe_store_n_layers(st); l++)
            for (int h = 0; h < probe_store_n_kv_heads(st); h++) {
                const probe_ev_metric *u = probe_store_metric(st, "page_bound", s, l, h);
                const probe_ev_metric *m = probe_store_metric(st, "page_max", s, l, h);
                if (!u || !m) continue;
                n++;
                if (u->n != m->n || u->n <= 0) { bound = 0; continue; }
                int best = 0;
                for (int j = 0; j < u->n; j++) {
                    if (u->vals[j] < m->vals[j] - 1e-4f * (1 + fabsf(m->vals[j]))) bound = 0;
                    if (m->vals[j] > m->vals[best]) best = j;
                }
                int rank = 0;
                for (int j = 0; j < u->n; j++) rank += u->vals[j] > u->vals[best];
                rank_ok &= (int)m->value == best && (int)u->value == rank;
            }
    /* Quest's default attends no layer densely (docs/PEERS.md), so layer 0 has bounds too */
    test_cond("quest records page bounds for its sparse layers (every layer by default)",
              n > 0 && probe_store_metric(st, "page_bound", 0, 0, 0));
    test_cond("every page's bound U is at least its true max q.k", n > 0 && bound);
    test_cond("the reported best page and its rank under U are right", n > 0 && rank_ok);
}

static void check_freekv(const probe_store *st) {
    const probe_ev_run *run = probe_store_run(st);
    double tau = run ? probe_pairs_get(run->kv_opts, "tau", NAN) : NAN;
    int n = 0, ok = 1;
    for (int s = 0; s < probe_store_n_steps(st); s++)
        for (int l = 0; l < probe_store_n_layers(st); l++)
            for (int h = 0; h < probe_store_n_kv_heads(st); h++) {
                const probe_ev_metric *c = probe_store_metric(st, "query_cos", s, l, h);
                const probe_ev_metric *k = probe_store_metric(st, "corrected", s, l, h);
                if (!c && !k) continue;
                n++;
                ok &= c && k && c->value >= -1.001f && c->value <= 1.001f && (k->value > 0.5f) == (c->value < tau);
            }
    test_cond("freekv records its query cosine from the second step on", n > 0 &&
                                                                        !probe_store_metric(st, "query_cos", 0, 1, 0));
    test_cond("freekv's corrected flag is its cosine below tau", n > 0 && ok && isfinite(tau));
}

static void check_specache(const probe_store *st) {
    int n = 0, ok = 1;
    for (int s = 0; s < probe_store_n_steps(st); s++)
        for (int l = 0; l < probe_store_n_layers(st); l++)
            for (int h = 0; h < probe_store_n_kv_heads(st); h++) {
                const probe_ev_metric *o = probe_store_metric(st, "lowbit_overlap", s, l, h);
                const probe_ev_metric *r = probe_store_metric(st, "lowbit_recall", s, l, h);
                if (!o && !r) continue;
                n++;
                ok &= o && r && o->value >= 0 && o->value <= 1 && r->value >= 0 && r->value <= 1.0001f;
            }
    test_cond("specache's low-bit overlap and mass recall are shares, at every step, layer and head",
              n == probe_store_n_steps(st) * probe_store_n_layers(st) * probe_store_n_kv_heads(st) && n > 0 && ok);
}

static void check_tailorkv(const probe_store *st, int head_dim, int channels) {
    int nl = probe_store_n_layers(st), map = 1, ch_ok = 1, n_ch = 0;
    const probe_ev_run *run = probe_store_run(st);
    double qtau = run ? probe_pairs_get(run->kv_opts, "qtau", NAN) : NAN;
    map = isfinite(qtau);
    for (int l = 0; l < nl; l++) {
        const probe_ev_metric *q = probe_store_metric(st, "quantized", -1, l, -1);
        const probe_ev_metric *p = probe_store_metric(st, "attn_spread", -1, l, -1);
        map &= q && p && p->value >= 0 && p->value <= 1 && (q->value > 0.5f) == (p->value > qtau);
    }
    for (int s = 0; s < probe_store_n_steps(st); s++)
        for (int l = 0; l < nl; l++)
            for (int h = 0; h < probe_store_n_kv_heads(st); h++) {
                const probe_ev_metric *m = probe_store_metric(st, "channels", s, l, h);
                if (!m) continue;
                n_ch++;
                ch_ok &= m->n == channels;
                for (int i = 0; i < m->n; i++) {
                    ch_ok &= m->vals[i] >= 0 && m->vals[i] < head_dim && m->vals[i] == (int)m->vals[i];
                    for (int j = 0; j < i; j++) ch_ok &= m->vals[j] != m->vals[i];
                }
            }
    test_cond("tailorkv's map covers every layer, with P a share and the mode P > qtau", nl > 0 && map);
    test_cond("tailorkv's channels are distinct channel ids, as many as asked", n_ch > 0 && ch_ok);
}

static void test_peers_live(const char *dir) {
    const char *path = "samples/model/skv-demo.gguf";
    if (access(path, R_OK)) {
        test_skip("samples/model/skv-demo.gguf is missing (run from the project root)");
        return;
    }
    skv_model *m = NULL;
    if (model_load(path, &m)) {
        test_cond("the demo model loads", 0);
        return;
    }
    int head_dim = m->cfg.head_dim;
    char trace[600];
    snprintf(trace, sizeof trace, "%s/peers.skvt", dir);
    probe_bus *bus = NULL;
    trace_writer *tw = NULL;
    int rc = probe_bus_new(&bus);
    if (!rc) rc = trace_writer_open(trace, bus, &tw);
    session_opts so;
    session_opts_default(&so);
    so.ctx = 512;
    so.bus = bus;
    so.kv.budget = 96;
    const char *keys[] = {"page", "sink", "window", "start", "recent", "qtau", "channels"};
    double vals[] = {16, 16, 16, 16, 16, 1, 6};
    for (int i = 0; i < 7 && !rc; i++) rc = kv_opts_set_num(&so.kv, keys[i], vals[i]);
    char names[COMPARE_MAX][32];
    int n = compare_parse("quest,freekv,specache,tailorkv", names, COMPARE_MAX);
    compare_run *c = NULL;
    if (!rc) rc = compare_new(m, &so, names, n, &c);
    int32_t ids[400];
    for (int i = 0; i < 400; i++) ids[i] = 5 + (i * 37) % 200;
    if (!rc) rc = compare_prefill(c, ids, 400, NULL, NULL);
    for (int s = 0; s < 5 && !rc; s++) rc = compare_decode(c, compare_next(c));
    compare_free(c);
    if (tw) rc = trace_writer_close(tw) || rc;
    probe_bus_free(bus);
    model_free(m);
    test_cond("four peers run 5 steps in lockstep into a trace", rc == 0);
    if (rc) return;
    probe_lanes *L = NULL;
    rc = probe_lanes_new(&L) || trace_load_lanes(trace, L);
    test_cond("the trace loads into four lanes", rc == 0 && probe_lanes_count(L) == 4);
    if (rc || probe_lanes_count(L) != 4) {
        probe_lanes_free(L);
        return;
    }
    check_quest(probe_lanes_store(L, 0));
    check_freekv(probe_lanes_store(L, 1));
    check_specache(probe_lanes_store(L, 2));
    check_tailorkv(probe_lanes_store(L, 3), head_dim, 6);

    const char *views[] = {"bounds", "corrections", "speculation", "tailor"};
    const char *owner[] = {"Quest", "FreeKV", "SpeCache", "TailorKV"};
    for (int v = 0; v < 4; v++) {
        int drc;
        char *t = draw_text(views[v], probe_lanes_store(L, v), 2, &drc);
        char what[160];
        snprintf(what, sizeof what, "the %s view draws %s's measures from the trace alone", views[v], owner[v]);
        test_cond(what, drc == 0 && t && strstr(t, owner[v]));
        free(t);
        int other = (v + 1) % 4;
        t = draw_text(views[v], probe_lanes_store(L, other), 2, &drc);
        snprintf(what, sizeof what, "the %s view on a %s run says whose measures it needs", views[v],
                 probe_lanes_policy(L, other));
        test_cond(what, drc == SKV_EMISSING && t && strstr(t, owner[v]) && strstr(t, probe_lanes_policy(L, other)));
        free(t);
        char png[700];
        snprintf(png, sizeof png, "%s/%s.png", dir, views[v]);
        struct stat sb;
        snprintf(what, sizeof what, "the %s view exports to PNG", views[v]);
        test_cond(what, draw_png(views[v], probe_lanes_store(L, v), 2, png) == 0 && stat(png, &sb) == 0 &&
                            sb.st_size > 2000);
        unlink(png);
    }
    probe_lanes_free(L);
    unlink(trace);
}

/* Adds an oracle event with the needle watched at (s, l, h). */
static int add_orc(probe_store *st, int s, int l, int h, int kept, float mass) {
    int qk[1] = {8};
    float one[1] = {1};
    probe_event ev = {.kind = PROBE_ORACLE, .oracle = {.step = s, .layer = l, .head = h, .n_q = 1, .unit = 1,
                                                       .ctx = 100, .n_kept = 8, .needle_len = 4, .needle_kept = kept,
                                                       .needle_rank = 2, .needle_mass = mass, .q_kept = qk,
                                                       .q_recall = one, .q_overlap = one, .q_out_err = one}};
    return probe_store_add(st, &ev);
}

static void test_diverge(void) {
    probe_store *a = NULL, *b = NULL;
    if (probe_store_new(&a) || probe_store_new(&b)) return;
    probe_event run = {.kind = PROBE_RUN, .run = {.model = "m", .n_layers = 3, .n_kv_heads = 2, .max_ctx = 128}};
    int rc = probe_store_add(a, &run) || probe_store_add(b, &run);
    for (int s = 0; s < 3 && !rc; s++)
        for (int l = 0; l < 3 && !rc; l++)
            for (int h = 0; h < 2 && !rc; h++) {
                float mass = l == 2 && h == 1 ? 0.3f : 0.1f;
                int ka = 4, kb = 4;
                if (s >= 1 && l == 1 && h == 0) kb = 2;       /* a small split */
                if (s >= 1 && l == 2 && h == 1) kb = 0;       /* the largest split at the same step */
                if (s == 2 && l == 0) kb = 0;                 /* a later one does not count */
                rc = add_orc(a, s, l, h, ka, mass) || add_orc(b, s, l, h, kb, mass);
            }
    needle_split sp;
    int drc = rc ? -1 : needle_diverge(a, "quest", b, "shadowkv", &sp);
    test_cond("the first step where the kept sets differ is found, at the largest split", drc == 0 && sp.step == 1 &&
                                                                                      sp.layer == 2 && sp.head == 1 &&
                                                                                      sp.kept_a == 4 && sp.kept_b == 0);
    test_cond("the verdict names both policies, the step, layer and head", drc == 0 && strstr(sp.text, "quest") &&
                                                                             strstr(sp.text, "shadowkv") &&
                                                                             strstr(sp.text, "step 1, layer 2, KV head 1"));
    probe_event qm = {.kind = PROBE_METRIC, .metric = {.step = -1, .layer = 2, .head = -1, .name = "quantized",
                                                       .value = 1}};
    if (!probe_store_add(b, &qm)) {
        drc = needle_diverge(a, "quest", b, "tailorkv", &sp);
        test_cond("a layer the missing policy quantizes is named as read at low precision",
                  drc == 0 && strstr(sp.text, "tailorkv reads layer 2 at low precision"));
    }
    drc = needle_diverge(b, "tailorkv", a, "quest", &sp);
    test_cond("when the missing policy kept as much of the needle everywhere, the verdict says the miss came "
              "from elsewhere", drc == 0 && strstr(sp.text, "quest attended as much of the needle as tailorkv") &&
                                   strstr(sp.text, "not from dropping the needle"));
    probe_store *c2 = NULL;
    if (!probe_store_new(&c2)) { /* the finder quantizes the layer where the misser dropped part of the needle */
        int rc2 = probe_store_add(c2, &run) || probe_store_add(c2, &qm);
        for (int l = 0; l < 3 && !rc2; l++)
            for (int h = 0; h < 2 && !rc2; h++) rc2 = add_orc(c2, 0, l, h, l == 2 ? 0 : 4, l == 2 ? 0.4f : 0.1f);
        probe_store *d2 = NULL;
        if (!rc2 && !probe_store_new(&d2)) {
            rc2 = probe_store_add(d2, &run);
            for (int l = 0; l < 3 && !rc2; l++)
                for (int h = 0; h < 2 && !rc2; h++) rc2 = add_orc(d2, 0, l, h, l == 2 ? 2 : 4, l == 2 ? 0.4f : 0.1f);
            drc = rc2 ? -1 : needle_diverge(c2, "tailorkv", d2, "shadowkv", &sp);
            test_cond("a finder that quantizes the layer is said to have read the needle at low precision there",
                      drc == 0 && sp.layer == 2 &&
                          strstr(sp.text, "tailorkv reads that layer at low precision where it keeps no exact copy and "
                                          "read all 4") && strstr(sp.text, "shadowkv attended 2 of them exactly"));
            probe_store_free(d2);
        }
        probe_store_free(c2);
    }
    /* the same exact share everywhere, but the finder read the needle at low precision (SpeCache's
     * "lowbit" layers) where the misser dropped it: that is where they parted, not after the attention */
    probe_store *c3 = NULL, *d3 = NULL;
    if (!probe_store_new(&c3) && !probe_store_new(&d3)) {
        probe_event lb = {.kind = PROBE_METRIC, .metric = {.step = -1, .layer = 2, .head = -1, .name = "lowbit",
                                                           .value = 1}};
        int rc3 = probe_store_add(c3, &run) || probe_store_add(c3, &lb) || probe_store_add(d3, &run);
        for (int l = 0; l < 3 && !rc3; l++)
            for (int h = 0; h < 2 && !rc3; h++)
                rc3 = add_orc(c3, 0, l, h, l == 2 ? 0 : 4, l == 2 ? 0.4f : 0.1f) ||
                      add_orc(d3, 0, l, h, l == 2 ? 0 : 4, l == 2 ? 0.4f : 0.1f);
        drc = rc3 ? -1 : needle_diverge(c3, "specache", d3, "quest", &sp);
        test_cond("equal exact shares, but one read the needle at low precision where the other dropped it: they "
                  "diverged there", drc == 0 && sp.layer == 2 && strstr(sp.text, "specache reads that layer at low "
                  "precision") && strstr(sp.text, "quest attended 0 of them exactly") && !strstr(sp.text, "after"));
    }
    probe_store_free(c3);
    probe_store_free(d3);
    drc = needle_diverge(a, "quest", a, "quest", &sp);
    test_cond("identical kept sets have no split, and say so", drc == SKV_EMISSING && strstr(sp.text, "same share"));
    probe_store *e = NULL;
    if (!probe_store_new(&e)) {
        drc = needle_diverge(a, "quest", e, "freekv", &sp);
        test_cond("a store without needle measures is named as the cause", drc == SKV_EMISSING &&
                                                                             (strstr(sp.text, "different") ||
                                                                              strstr(sp.text, "no needle measures")));
        probe_store_free(e);
    }
    probe_store_free(a);
    probe_store_free(b);
}

int main(void) {
    test_store_metric();
    const char *dir = test_tmpdir("peer-views");
    test_peers_live(dir);
    test_diverge();
    if (dir) rmdir(dir);
    return test_report("test_peer_views");
}
