/* test_needle: the needle-in-a-haystack harness and the diagnosis of a miss.
 *
 * Unit level: option lists, value matching, and the verdict on hand-built
 * probe stores where each cause is planted (outlier handling, budget, local
 * window, rank, dense failure), with the needle and niah views drawn from
 * them (the niah cells' colours read back from the PNG pixels).
 * Model level (../shared models; skipped with one line when absent): on
 * mini-smollm and stories260k, which cannot retrieve, each cause is forced
 * through the ShadowKV settings and the verdict must name it: a budget of one
 * chunk, rank 1, needle chunks pinned as outliers vs. not, a needle just
 * before a one-chunk local window, and the dense failure that must not hide
 * the others; and the watch leaves the logits bitwise unchanged. CLI level (skipped when the skv binary has no needle command):
 * the table, the JSON and the PNG heatmap say the same, the PNG read back
 * with libpng, outputs are never overwritten without --force, and the trace
 * replays into the niah view. */
#include "needle.h"
#include "paint.h"
#include "sampler.h"
#include "session.h"
#include "skv.h"
#include "store.h"
#include "testhelp.h"
#include "tok.h"
#include "trace.h"
#include "view.h"

#include <cjson/cJSON.h>
#include <png.h>
#include <sys/wait.h>

/* ---- option lists and matching ------------------------------------------- */

static void test_lists(void) {
    int *l = NULL, n = 0;
    test_cond("lengths: 1k,2k,4k", needle_parse_lengths("1k,2k,4k", &l, &n) == 0 && n == 3 && l[0] == 1024 &&
                                       l[2] == 4096);
    free(l);
    test_cond("lengths: plain numbers", needle_parse_lengths("300,2K", &l, &n) == 0 && n == 2 && l[0] == 300 &&
                                            l[1] == 2048);
    free(l);
    test_cond("lengths: bad items are refused", needle_parse_lengths("1x", &l, &n) == SKV_EINVAL &&
                                                    needle_parse_lengths("1k,", &l, &n) == SKV_EINVAL &&
                                                    needle_parse_lengths("0", &l, &n) == SKV_EINVAL && !l);
    float *d = NULL;
    test_cond("depths: 0:100:10 gives 11, stop included",
              needle_parse_depths("0:100:10", &d, &n) == 0 && n == 11 && d[0] == 0 && d[10] == 100);
    free(d);
    test_cond("depths: a list", needle_parse_depths("0,12.5,100", &d, &n) == 0 && n == 3 && d[1] == 12.5f);
    free(d);
    test_cond("depths: out of range and bad steps refused",
              needle_parse_depths("0:200:10", &d, &n) == SKV_EINVAL && needle_parse_depths("0:100:0", &d, &n) == SKV_EINVAL &&
                  needle_parse_depths("101", &d, &n) == SKV_EINVAL && !d);
    test_cond("lengths and depths listed twice are refused (1k,1024; 50,50; 50,50.0000001)",
              needle_parse_lengths("1k,1024", &l, &n) == SKV_EINVAL && strstr(skv_last_error(), "twice") &&
                  needle_parse_depths("50,50", &d, &n) == SKV_EINVAL &&
                  needle_parse_depths("50,50.0000001", &d, &n) == SKV_EINVAL && !l && !d);
    test_cond("value found as a whole number only",
              needle_contains_value(" 4821735.", "4821735") && needle_contains_value("is 4821735", "4821735") &&
                  !needle_contains_value("14821735", "4821735") && !needle_contains_value("48217356", "4821735") &&
                  !needle_contains_value("482 1735", "4821735") && needle_contains_value("x14821735 4821735", "4821735"));
}

/* ---- hand-built stores ----------------------------------------------------- */

enum { SL = 2, SH = 2, SCH = 8, SNCH = 80, SLOCAL = 4, SK = 4, SSTEPS = 2 };

typedef struct {
    int first;              /* first needle chunk (two chunks) */
    int part;               /* 0 candidate, 1 outlier, 2 local */
    int rank, rank_exact;   /* landmark and exact rank (candidates) */
    int selected;
    float key_err;
    int dense_hit;
} plant;

static int add(probe_store *st, probe_event ev) { return probe_store_add(st, &ev); }

/* A ShadowKV run of SL layers and SH KV heads over an 80-chunk prompt with
 * one needle of two chunks in the state p describes at every step. */
static probe_store *planted(const plant *p) {
    probe_store *st;
    if (probe_store_new(&st)) return NULL;
    int bad = add(st, (probe_event){ .kind = PROBE_RUN, .run = { .model = "planted", .n_layers = SL, .n_heads = 4,
                                                                 .n_kv_heads = SH, .head_dim = 16, .max_ctx = 1024,
                                                                 .prompt_len = SNCH * SCH, .kv_policy = "shadowkv",
                                                                 .budget = SK * SCH, .kv_opts = "rank=4 chunk=8 outliers=2 local=4" /* SCH, SLOCAL */, .oracle = 1 } });
    int outl[2] = { 3, 9 };
    float sv[16], cm[SNCH];
    for (int i = 0; i < 16; i++) sv[i] = 16.0f - i;
    for (int c = 0; c < SNCH; c++) cm[c] = 0.5f + 0.4f * (float)(c % 7) / 7;
    cm[3] = 0.05f;
    cm[9] = 0.06f;
    cm[p->first] = 0.2f;
    cm[p->first + 1] = 0.25f;
    for (int l = 0; l < SL; l++) {
        bad |= add(st, (probe_event){ .kind = PROBE_PREFILL_LAYER,
                                      .prefill_layer = { .layer = l, .seq_len = SNCH * SCH, .rank = 4, .n_sv = 16, .sv = sv } });
        for (int h = 0; h < SH; h++)
            bad |= add(st, (probe_event){ .kind = PROBE_PREFILL_HEAD,
                                          .prefill_head = { .layer = l, .head = h, .chunk = SCH, .n_chunks = SNCH,
                                                            .n_outliers = 2, .n_landmarks = SNCH - SLOCAL - 2,
                                                            .local_start = SNCH - SLOCAL, .cos_min = cm, .outliers = outl } });
    }
    int chunks[2] = { p->first, p->first + 1 }, part[2] = { p->part, p->part };
    int rank[2] = { p->part ? -1 : p->rank, p->part ? -1 : p->rank + 1 };
    int rex[2] = { p->part ? -1 : p->rank_exact, p->part ? -1 : p->rank_exact + 1 };
    int sel[2] = { p->part ? 0 : p->selected, p->part ? 0 : p->selected };
    float cms[2] = { cm[p->first], cm[p->first + 1] }, mass[2] = { 0.05f, 0.04f }, none[2] = { -1, -1 };
    int none_i[2] = { -1, -1 }, zero[2] = { 0, 0 };
    for (int s = -1; s < SSTEPS; s++)
        for (int l = 0; l < SL; l++)
            for (int h = 0; h < SH; h++) {
                int pre = s < 0;
                probe_event ev = { .kind = PROBE_NEEDLE, .needle = {
                    .id = 0, .tok_begin = p->first * SCH + 2, .tok_end = p->first * SCH + 14, .n_chunks = 2, .step = s,
                    .layer = l, .head = h, .mass_exact = pre ? -1 : 0.09f, .mass_sparse = pre ? -1 : 0.02f,
                    .chunks = chunks, .rank = pre ? none_i : rank, .selected = pre ? zero : sel, .k = SK,
                    .key_err = p->key_err, .mass_ideal = pre ? -1 : 0.1f, .out_err = pre ? -1 : 0.3f + 0.1f * l,
                    .n_info = 2, .part = part, .rank_exact = pre ? none_i : rex, .cos_min = cms,
                    .mass_chunk = pre ? none : mass } };
                bad |= probe_store_add(st, &ev);
            }
    for (int s = 0; s < SSTEPS; s++)
        bad |= add(st, (probe_event){ .kind = PROBE_STEP, .step = { .step = s, .has_oracle = 1, .top1_agree = s != 1 } });
    int agree[SSTEPS] = { 1, 0 };
    float dist[SSTEPS] = { 0.01f, 0.4f };
    for (int m = 0; m < 2; m++)
        bad |= add(st, (probe_event){ .kind = PROBE_NIAH, .niah = {
            .index = 0, .length = SNCH * SCH, .depth = 50, .method = m, .hit = m ? 0 : p->dense_hit,
            .prompt_len = SNCH * SCH, .tok_begin = p->first * SCH + 2, .tok_end = p->first * SCH + 14, .detail = 1,
            .n_steps = m ? SSTEPS : 0, .value = "4821735", .answer = m ? " 4821" : (p->dense_hit ? " 4821735." : " blue"),
            .top1_agree = m ? agree : NULL, .logit_dist = m ? dist : NULL } });
    if (bad) { probe_store_free(st); return NULL; }
    return st;
}

static int has_cause(const needle_report *r, int kind) {
    for (int i = 0; i < r->n_causes; i++) if (r->causes[i].kind == kind) return 1;
    return 0;
}

/* Draws the needle view of st into 120x40 cells and returns its text. */
static char *needle_cells(const probe_store *st, int *rc) {
    canvas *c = NULL;
    char *t = NULL;
    view_cursor cur;
    view_cursor_init(&cur);
    *rc = -99;
    if (canvas_cells_new(&c, 120, 40, 0) == 0) {
        *rc = view_find("needle")->draw(c, (canvas_rect){ 0, 0, 120, 40 }, st, &cur, NULL);
        t = canvas_cells_text(c);
    }
    canvas_free(c);
    return t;
}

/* A click on a cause of the verdict (the needle view drawn as a figure's
 * PNG): the cursor goes to the step, layer, KV head and chunk where that
 * cause was found. */
static void check_cause_click(const probe_store *st, const needle_report *rep) {
    const view_class *v = view_find("needle");
    canvas *c = NULL;
    canvas_png_opts o = { .scale = 1 };
    view_cursor cur;
    view_cursor_init(&cur);
    paint_result res;
    int rc = canvas_png_new(&c, 1200, 800, &o);
    if (!rc) {
        canvas_clear(c);
        rc = v->draw(c, (canvas_rect){ 0, 0, 1200, 800 }, st, &cur, &res);
    }
    int ok = rc == 0 && rep->n_causes >= 1 && res.n_markers >= 1;
    for (int i = 0; ok && i < rep->n_causes && i < res.n_markers; i++) {
        const needle_cause *cs = &rep->causes[i];
        view_cursor_init(&cur);
        cur.step = 99; /* nowhere a cause points */
        int bits = v->click(&cur, st, &res, res.legend.x + 2, res.marker_x[i] + 1);
        ok = (bits & VIEW_HANDLED) && cur.step == (cs->step >= 0 ? cs->step : 99) &&
             (cs->layer < 0 || cur.layer == cs->layer) && (cs->head < 0 || cur.head == cs->head) &&
             (cs->chunk < 0 || cur.chunk == cs->chunk);
        if (!ok) printf("  cause %d: step %d layer %d head %d chunk %d; cursor %d %d %d %d\n", i, cs->step, cs->layer,
                        cs->head, cs->chunk, cur.step, cur.layer, cur.head, cur.chunk);
    }
    test_cond("needle view: a click on each cause of the verdict moves the cursor to where it was found", ok);
    canvas_free(c);
}

static void test_planted(void) {
    needle_report rep;
    plant p = { .first = 50, .part = 0, .rank = 10, .rank_exact = 0, .selected = 0, .key_err = 0.01f, .dense_hit = 1 };
    probe_store *st = planted(&p);
    test_cond("planted store accepted", st != NULL);
    if (!st) return;
    int rc = needle_diagnose(st, 0, &rep);
    test_cond("misranked needle chunk: never selected (misranked, not an outlier) first, budget too",
              rc == 0 && rep.n_causes == 2 && rep.causes[0].kind == NEEDLE_CAUSE_OUTLIER &&
                  rep.causes[1].kind == NEEDLE_CAUSE_BUDGET && strstr(rep.causes[0].fix, "--outliers"));
    test_cond("the outlier cause names the chunk, its cos-min order and where to look",
              strstr(rep.causes[0].evidence, "needle chunk 5") && strstr(rep.causes[0].evidence, "not an outlier") &&
                  strstr(rep.causes[0].fix, "--outliers to 4") && rep.causes[0].step == 0 && rep.causes[0].layer >= 0 &&
                  rep.causes[0].head >= 0);
    test_cond("first divergence at the step whose top-1 differs, layers by output error",
              rep.diverge_step == 1 && rep.last_step == 1 && rep.n_div == 2 && rep.div_layer[0] == 1 &&
                  fabsf(rep.diverge_logit - 0.4f) < 1e-6);
    test_cond("dense hit: no dense cause", !has_cause(&rep, NEEDLE_CAUSE_DENSE) && rep.dense_hit == 1 && rep.sparse_hit == 0);
    check_cause_click(st, &rep);
    int vrc;
    char *t = needle_cells(st, &vrc);
    test_cond("needle view draws the verdict", vrc == 0 && t && strstr(t, "never selected") && strstr(t, "budget"));
    free(t);
    probe_store_free(st);

    p.rank_exact = 7;
    st = planted(&p);
    rc = st ? needle_diagnose(st, 0, &rep) : -1;
    test_cond("ranked past the budget, also by exact attention: budget alone, raise to the rank + 1",
              rc == 0 && rep.n_causes == 1 && rep.causes[0].kind == NEEDLE_CAUSE_BUDGET &&
                  strstr(rep.causes[0].fix, "--budget to 96") && strstr(rep.causes[0].evidence, "ranked 10 >= budget k = 4"));
    probe_store_free(st);

    p.first = 74;
    st = planted(&p);
    rc = st ? needle_diagnose(st, 0, &rep) : -1;
    test_cond("dropped just before the local window: local window first, then budget",
              rc == 0 && rep.n_causes == 2 && rep.causes[0].kind == NEEDLE_CAUSE_LOCAL &&
                  rep.causes[1].kind == NEEDLE_CAUSE_BUDGET && strstr(rep.causes[0].fix, "--local to 6"));
    probe_store_free(st);

    plant q = { .first = 50, .part = 0, .rank = 1, .rank_exact = 1, .selected = 1, .key_err = 0.6f, .dense_hit = 1 };
    st = planted(&q);
    rc = st ? needle_diagnose(st, 0, &rep) : -1;
    test_cond("selected with blurred keys: rank, with a rank from the spectrum",
              rc == 0 && rep.n_causes == 1 && rep.causes[0].kind == NEEDLE_CAUSE_RANK &&
                  strstr(rep.causes[0].fix, "--rank to ") && fabs(rep.key_err_selected - 0.6) < 1e-6);
    probe_store_free(st);

    q.key_err = 0.05f;
    q.dense_hit = 0;
    st = planted(&q);
    rc = st ? needle_diagnose(st, 0, &rep) : -1;
    test_cond("kept with good keys, dense misses too: only the dense cause, saying the policy kept the needle",
              rc == 0 && rep.n_causes == 1 && rep.causes[0].kind == NEEDLE_CAUSE_DENSE &&
                  strstr(rep.causes[0].evidence, "the model misses it with dense attention too") &&
                  strstr(rep.causes[0].evidence, "shadowkv kept the needle's chunks"));
    probe_store_free(st);

    plant o = { .first = 50, .part = 1, .dense_hit = 0 };
    st = planted(&o);
    rc = st ? needle_diagnose(st, 0, &rep) : -1;
    test_cond("needle chunks pinned as outliers: kept dense, no budget or outlier cause",
              rc == 0 && rep.n_causes == 1 && rep.causes[0].kind == NEEDLE_CAUSE_DENSE &&
                  fabs(rep.share_outlier - 1) < 1e-9 && strstr(rep.kept, "100% as outliers"));
    probe_store_free(st);

    probe_store *empty;
    probe_store_new(&empty);
    test_cond("no needle data: SKV_EMISSING", needle_diagnose(empty, 0, &rep) == SKV_EMISSING);
    probe_store_free(empty);
}

/* A run of any policy with only the oracle's events: the needle (16 tokens)
 * has exact rank `rank` and is attended by no query head; each query head
 * attended `attended` tokens. */
static probe_store *planted_oracle(int rank, int attended, int dense_hit) {
    probe_store *st;
    if (probe_store_new(&st)) return NULL;
    int bad = add(st, (probe_event){ .kind = PROBE_RUN, .run = { .model = "planted", .n_layers = SL, .n_heads = 4,
                                                                 .n_kv_heads = SH, .head_dim = 16, .max_ctx = 1024,
                                                                 .prompt_len = 640, .kv_policy = "quest", .budget = 48,
                                                                 .kv_opts = "budget=48 page=16", .oracle = 1 } });
    int qk[2] = { attended, attended };
    float qr[2] = { 0.5f, 0.6f }, qo[2] = { 0.4f, 0.5f }, qe[2] = { 0.2f, 0.3f };
    for (int s = 0; s < SSTEPS; s++)
        for (int l = 0; l < SL; l++)
            for (int h = 0; h < SH; h++)
                bad |= add(st, (probe_event){ .kind = PROBE_ORACLE, .oracle = {
                    .step = s, .layer = l, .head = h, .n_q = 2, .unit = 16, .ctx = 641 + s, .n_kept = attended,
                    .n_gen = 1, .recall = 0.55f, .overlap = 0.45f, .out_err = 0.25f + 0.1f * l, .mass_kept = 0.5f,
                    .needle_len = 16, .needle_kept = 0, .needle_rank = rank, .needle_mass = 0.1f, .q_kept = qk,
                    .q_recall = qr, .q_overlap = qo, .q_out_err = qe } });
    int agree[SSTEPS] = { 1, 0 };
    float dist[SSTEPS] = { 0.01f, 0.4f };
    for (int m = 0; m < 2; m++)
        bad |= add(st, (probe_event){ .kind = PROBE_NIAH, .niah = {
            .index = 0, .length = 640, .depth = 50, .method = m, .hit = m ? 0 : dense_hit, .prompt_len = 640,
            .tok_begin = 300, .tok_end = 316, .detail = 1, .n_steps = m ? SSTEPS : 0, .policy = m ? "quest" : "dense",
            .value = "4821735", .answer = m ? " 4821" : " 4821735.", .top1_agree = m ? agree : NULL,
            .logit_dist = m ? dist : NULL } });
    if (bad) { probe_store_free(st); return NULL; }
    return st;
}

static void test_planted_oracle(void) {
    needle_report rep;
    probe_store *st = planted_oracle(3, 48, 1);
    int rc = st ? needle_diagnose(st, 0, &rep) : -1;
    test_cond("any policy, oracle events only: a needle ranked inside what was attended but left out is 'never selected'",
              rc == 0 && rep.generic && rep.n_causes == 1 && rep.causes[0].kind == NEEDLE_CAUSE_OUTLIER &&
                  strstr(rep.causes[0].evidence, "quest") && rep.tok_begin == 300 && rep.tok_end == 316 &&
                  rep.diverge_step == 1 && rep.n_div == 2 && rep.div_layer[0] == 1);
    int vrc;
    char *t = st ? needle_cells(st, &vrc) : NULL;
    test_cond("the needle view draws a policy's generic report", t && vrc == 0 && strstr(t, "never selected"));
    free(t);
    probe_store_free(st);
    st = planted_oracle(500, 48, 1);
    rc = st ? needle_diagnose(st, 0, &rep) : -1;
    test_cond("a needle ranked past what was attended is 'budget', with the budget that would reach it (in pages)",
              rc == 0 && rep.n_causes == 1 && rep.causes[0].kind == NEEDLE_CAUSE_BUDGET &&
                  strstr(rep.causes[0].fix, "--budget to 512 tokens (32 pages of 16 tokens") &&
                  strstr(rep.kept, "dropped 100%"));
    probe_store_free(st);
    st = planted_oracle(500, 48, 0);
    rc = st ? needle_diagnose(st, 0, &rep) : -1;
    test_cond("dense misses too: the model cause comes first", rc == 0 && rep.n_causes == 2 &&
                                                                   rep.causes[0].kind == NEEDLE_CAUSE_DENSE);
    probe_store_free(st);
}

/* ---- the niah view on planted results ------------------------------------- */

static canvas_color pixel_at(const uint8_t *px, int w, int h, double x, double y) {
    int X = (int)floor(x), Y = (int)floor(y);
    if (!px || X < 0 || Y < 0 || X >= w || Y >= h) return CANVAS_NONE;
    const uint8_t *p = px + ((size_t)Y * w + X) * 4;
    return CANVAS_RGB(p[0], p[1], p[2]);
}

/* Colour inside cell (col, row) of a heatmap area (away from its text and outline). */
static canvas_color cell_color(const uint8_t *px, int w, int h, canvas_rect a, int nx, int ny, int col, int row) {
    double cw = a.w / nx, ch = a.h / ny;
    return pixel_at(px, w, h, a.x + cw * col + cw * 0.2, a.y + ch * row + ch * 0.2);
}

static void test_niah_view(void) {
    probe_store *st;
    probe_store_new(&st);
    int lens[2] = { 1024, 2048 };
    float deps[3] = { 0, 50, 100 };
    int bad = 0, idx = 0;
    for (int li = 0; li < 2; li++)
        for (int di = 0; di < 3; di++)
            for (int run = 0; run < 2; run++, idx++)
                for (int m = 0; m < 2; m++) {
                    /* dense hits everything; shadowkv misses the 2k column and one run at depth 50 */
                    int hit = m == 0 || (li == 0 && !(di == 1 && run == 1));
                    bad |= add(st, (probe_event){ .kind = PROBE_NIAH, .niah = {
                        .index = idx, .length = lens[li], .depth = deps[di], .run = run, .method = m, .hit = hit,
                        .prompt_len = lens[li], .value = "1234567", .answer = hit ? "1234567" : "no" } });
                }
    test_cond("niah events accepted", !bad && probe_store_n_niah(st) == 24);
    canvas *c = NULL;
    canvas_png_opts po = { .scale = 1 };
    paint_result res;
    view_cursor cur;
    view_cursor_init(&cur);
    int rc = canvas_png_new(&c, 1200, 500, &po);
    if (!rc) {
        canvas_clear(c);
        rc = view_find("niah")->draw(c, (canvas_rect){ 0, 0, 1200, 500 }, st, &cur, &res);
    }
    test_cond("niah view draws on PNG", rc == 0);
    if (!rc) {
        int w, h;
        const uint8_t *px = canvas_png_pixels(c, &w, &h);
        int ok = res.legend.w > 0 && res.legend.x > res.area.x + res.area.w;
        for (int li = 0; li < 2; li++)
            for (int di = 0; di < 3; di++) {
                double sk = li == 0 ? (di == 1 ? 50 : 100) : 0;
                ok &= cell_color(px, w, h, res.area, 2, 3, li, di) == palette_viridis(1.0);
                ok &= cell_color(px, w, h, res.legend, 2, 3, li, di) == palette_viridis(sk / 100);
            }
        test_cond("niah cells: dense 100% everywhere, shadowkv 100/50/0% where planted", ok);
        view_cursor k = cur;
        int r = view_find("niah")->click(&k, st, &res, res.legend.x + res.legend.w * 0.75, res.legend.y + res.legend.h * 0.5);
        test_cond("niah click on the shadowkv panel selects that cell", (r & VIEW_HANDLED) && k.scroll == 1 * 1000 + 1);
    }
    canvas_free(c);
    probe_store_free(st);
}

/* ---- model level ------------------------------------------------------------ */

typedef struct {
    const char *what;
    int budget, rank, outliers, local;
    float depth;
    int want;               /* the cause the verdict must name */
} forced;

static char *haystack_text(void) {
    char *t = NULL;
    size_t n;
    return skv_read_file("samples/haystack.txt", 1 << 24, &t, &n) == 0 ? t : NULL;
}

/* Runs one case with probes; keeps a copy of its report and the parts seen. */
typedef struct {
    needle_report rep;
    int have;
    int n_parts[3];         /* needle chunk events per part at decode steps */
    int hit[2];
} case_out;

static int keep_case(const needle_case *c, void *user) {
    case_out *o = user;
    o->hit[0] = c->hit[0];
    o->hit[1] = c->hit[1];
    if (c->report[1]) { o->rep = *c->report[1]; o->have = 1; }
    for (int s = 0; s < probe_store_n_steps(c->store[1]); s++)
        for (int l = 0; l < probe_store_n_layers(c->store[1]); l++)
            for (int h = 0; h < probe_store_n_kv_heads(c->store[1]); h++) {
                const probe_ev_needle *e = probe_store_needle(c->store[1], 0, s, l, h);
                for (int i = 0; e && i < e->n_info; i++)
                    if (e->part[i] >= 0 && e->part[i] < 3) o->n_parts[e->part[i]]++;
            }
    return 0;
}

static void test_model(const char *rel, int length) {
    const char *path = test_shared(rel);
    char msg[256];
    if (!path) {
        snprintf(msg, sizeof msg, "%s not found under ../shared: constructed misses on it skipped", rel);
        test_skip(msg);
        return;
    }
    char *hay = haystack_text();
    skv_model *m = NULL;
    if (!hay || model_load(path, &m)) {
        test_cond("model and haystack load", 0);
        free(hay);
        return;
    }
    const forced cases[] = {
        { "a budget of one chunk", 8, 160, 0, 4, 50, NEEDLE_CAUSE_BUDGET },
        { "rank 1", 1 << 20, 1, 0, 4, 50, NEEDLE_CAUSE_RANK },
        { "needle chunks pinned as outliers", 8, 160, 1 << 20, 4, 50, -1 },
        { "needle chunks not outliers", 8, 160, 0, 4, 50, NEEDLE_CAUSE_BUDGET },
        { "a needle just before a one-chunk local window", 8, 160, 0, 1, 100, NEEDLE_CAUSE_LOCAL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const forced *f = &cases[i];
        needle_opts o;
        needle_opts_default(&o);
        int len = length;
        o.haystack = hay;
        o.lengths = &len;
        o.n_lengths = 1;
        o.depths = &f->depth;
        o.n_depths = 1;
        o.answer_tokens = 4;
        o.probes = 1;
        o.kv.budget = f->budget;
        kv_opts_set_num(&o.kv, "rank", f->rank);
        kv_opts_set_num(&o.kv, "outliers", f->outliers);
        kv_opts_set_num(&o.kv, "local", f->local);
        case_out out;
        memset(&out, 0, sizeof out);
        needle_result res;
        int rc = needle_run(m, &o, keep_case, &out, &res);
        const needle_report *r = &out.rep;
        snprintf(msg, sizeof msg, "%s, %s: the sweep ran and ShadowKV missed (the model cannot retrieve)", rel, f->what);
        test_cond(msg, rc == 0 && res.n_cases == 1 && out.have && !out.hit[1]);
        if (rc || !out.have) {
            if (rc) printf("  %s\n", skv_last_error());
            needle_result_free(&res);
            continue;
        }
        snprintf(msg, sizeof msg, "%s, %s: dense misses too and the verdict says so first", rel, f->what);
        test_cond(msg, !out.hit[0] && r->n_causes >= 1 && r->causes[0].kind == NEEDLE_CAUSE_DENSE &&
                           strstr(r->causes[0].evidence, "the model misses it with dense attention too"));
        if (f->want >= 0) {
            snprintf(msg, sizeof msg, "%s, %s: the verdict also names %s", rel, f->what, needle_cause_name(f->want));
            test_cond(msg, has_cause(r, f->want));
            for (int k = 0; k < r->n_causes && !has_cause(r, f->want); k++)
                printf("  got %s: %s\n", needle_cause_name(r->causes[k].kind), r->causes[k].evidence);
        }
        if (f->outliers > 100) {
            snprintf(msg, sizeof msg, "%s, %s: every needle chunk kept dense, no budget, outlier or rank cause", rel, f->what);
            test_cond(msg, out.n_parts[0] == 0 && out.n_parts[1] > 0 && r->share_dropped == 0 &&
                               !has_cause(r, NEEDLE_CAUSE_BUDGET) && !has_cause(r, NEEDLE_CAUSE_OUTLIER) &&
                               !has_cause(r, NEEDLE_CAUSE_RANK) && strstr(r->kept, "dropped 0%"));
        } else if (f->outliers == 0) {
            snprintf(msg, sizeof msg, "%s, %s: no needle chunk is an outlier; outlier handling named iff misranked", rel,
                     f->what);
            test_cond(msg, out.n_parts[1] == 0 && r->share_outlier == 0 &&
                               has_cause(r, NEEDLE_CAUSE_OUTLIER) == (r->share_misranked >= NEEDLE_MIN_SHARE));
        }
        if (f->want == NEEDLE_CAUSE_RANK) {
            snprintf(msg, sizeof msg, "%s, rank 1: nothing dropped, the needle's keys badly rebuilt", rel);
            test_cond(msg, r->share_dropped == 0 && r->key_err_selected >= NEEDLE_RANK_ERR);
        }
        snprintf(msg, sizeof msg, "%s, %s: the kept case's events hold the needle watch", rel, f->what);
        int watch = 0;
        for (int e = 0; e < res.n_ev; e++) watch += res.ev[e]->kind == PROBE_NEEDLE && res.ev[e]->needle.n_info > 0;
        test_cond(msg, res.detail == 0 && watch > 0);
        needle_result_free(&res);
    }
    model_free(m);
    free(hay);
}

/* ---- the needle watch changes nothing ---------------------------------------- */

static void count_needle(const probe_event *ev, void *user) {
    int *n = user;
    if (ev->kind == PROBE_NEEDLE && ev->needle.n_info == ev->needle.n_chunks) (*n)++;
}

/* Logits after the prompt and 3 greedy steps, into out (4 * vocab). */
static int watched_run(skv_model *m, const int32_t *ids, int n, int watch, int oracle, probe_bus *bus, float *out) {
    session_opts o;
    session_opts_default(&o);
    snprintf(o.kv.policy, sizeof o.kv.policy, "shadowkv");
    o.kv.budget = 32;
    kv_opts_set_num(&o.kv, "outliers", 2);
    kv_opts_set_num(&o.kv, "rank", 8);
    o.kv.oracle = oracle;
    o.kv.watch_begin = watch ? 100 : 0;
    o.kv.watch_end = watch ? 121 : 0;
    o.bus = bus;
    skv_session *s = NULL;
    int V = m->cfg.vocab, rc = session_new(m, &o, &s);
    if (!rc) rc = session_prefill(s, ids, n, NULL, NULL);
    for (int i = 0; !rc && i < 4; i++) {
        memcpy(out + (size_t)i * V, session_logits(s), sizeof(float) * V);
        if (i < 3) rc = session_decode(s, sampler_argmax(session_logits(s), V));
    }
    session_free(s);
    return rc;
}

static void test_watch_is_passive(void) {
    const char *path = test_shared("models/stories260k.gguf");
    if (!path) { test_skip("stories260k not found under ../shared: watch checks skipped"); return; }
    skv_model *m = NULL;
    char *hay = haystack_text();
    int32_t *ids = NULL;
    int n = 0;
    if (!hay || model_load(path, &m) || tok_encode(m->tok, hay, 900, 1, 0, &ids, &n) || n < 200) {
        test_cond("model, haystack and prompt", 0);
        free(hay); free(ids); model_free(m);
        return;
    }
    if (n > 300) n = 300;
    int V = m->cfg.vocab;
    float *a = malloc(sizeof(float) * 4 * V), *b = malloc(sizeof(float) * 4 * V);
    probe_bus *bus = NULL;
    probe_sub *sub = NULL;
    int events = 0;
    probe_bus_new(&bus);
    probe_subscribe_callback(bus, PROBE_MASK(PROBE_NEEDLE), count_needle, &events, &sub);
    for (int oracle = 0; oracle < 2; oracle++) {
        events = 0;
        int ok = a && b && watched_run(m, ids, n, 0, oracle, NULL, a) == 0 && watched_run(m, ids, n, 1, oracle, bus, b) == 0;
        char msg[160];
        snprintf(msg, sizeof msg, "the needle watch%s leaves the logits bitwise unchanged", oracle ? " with the oracle" : "");
        test_cond(msg, ok && !memcmp(a, b, sizeof(float) * 4 * V));
        /* prefill plus 3 steps, per layer and KV head */
        snprintf(msg, sizeof msg, "the watch%s emits one full needle event per step, layer and KV head",
                 oracle ? " with the oracle" : "");
        test_cond(msg, events == 4 * m->cfg.n_layers * m->cfg.n_kv_heads);
    }
    probe_unsubscribe(sub);
    probe_bus_free(bus);
    free(a); free(b); free(ids); free(hay);
    model_free(m);
}

/* ---- a hit is a hit: the inspector's default run ------------------------------- */

static void store_event(const probe_event *ev, void *user) { probe_store_add(user, ev); }

/* The inspector's default session, without the inspector: the demo model on
 * samples/prompts/needle.txt under its preset, the needle watched, the
 * oracle on, 16 greedy steps. It records no needle results, yet the report
 * must open with the hit, with the value, and list margins, not failures;
 * the Needle view's title says the same. */
static void test_hit_is_hit(void) {
    struct stat sb;
    if (stat("samples/model/skv-demo.gguf", &sb) != 0) { test_skip("the demo model is missing: the hit checks"); return; }
    skv_model *m = NULL;
    char *text = NULL;
    size_t tn = 0;
    int32_t *ids = NULL;
    int n = 0;
    if (model_load("samples/model/skv-demo.gguf", &m) || skv_read_file("samples/prompts/needle.txt", 1 << 24, &text, &tn) ||
        tok_encode(m->tok, text, tn, tok_add_bos(m->tok), 1, &ids, &n)) {
        test_cond("the demo model and its needle prompt", 0);
        free(text); free(ids); model_free(m);
        return;
    }
    /* the needle's span: the fewest tokens whose text holds it */
    int b0 = -1, e0 = -1;
    for (int b = 0; b < n; b++) {
        char acc[1024] = "";
        size_t al = 0;
        for (int e = b; e < n && e < b + 24; e++) {
            char piece[64];
            int k = tok_piece(m->tok, e ? ids[e - 1] : -1, ids[e], 1, piece, sizeof piece);
            if (k > 0 && al + (size_t)k < sizeof acc) { memcpy(acc + al, piece, (size_t)k); acc[al += (size_t)k] = 0; }
            if (strstr(acc, "magic number is 4817093")) {
                if (b0 < 0 || e + 1 - b < e0 - b0) { b0 = b; e0 = e + 1; }
                break;
            }
        }
    }
    probe_store *st = NULL;
    probe_bus *bus = NULL;
    probe_sub *sub = NULL;
    session_opts so;
    session_opts_default(&so);
    snprintf(so.kv.policy, sizeof so.kv.policy, "shadowkv");
    so.kv.budget = 64;
    kv_opts_set(&so.kv, "rank", "16", 0);
    kv_opts_set(&so.kv, "outliers", "4", 0);
    kv_opts_set(&so.kv, "local", "4", 0);
    so.kv.oracle = 1;
    so.kv.watch_begin = b0;
    so.kv.watch_end = e0;
    skv_session *s = NULL;
    int rc = b0 < 0 ? -1 : probe_store_new(&st);
    if (!rc) rc = probe_bus_new(&bus);
    if (!rc) rc = probe_subscribe_callback(bus, PROBE_ALL, store_event, st, &sub);
    so.bus = bus;
    if (!rc) rc = session_new(m, &so, &s);
    if (!rc) rc = session_prefill(s, ids, n, NULL, NULL);
    for (int t = 0; !rc && t < 16; t++) rc = session_decode(s, sampler_argmax(session_logits(s), m->cfg.vocab));
    session_free(s);
    probe_unsubscribe(sub);
    needle_report rep;
    char head[400] = "";
    int drc = rc ? rc : needle_diagnose(st, 0, &rep);
    if (!drc) needle_headline(&rep, head, sizeof head);
    test_cond("the inspector's default run: the report opens 'shadowkv retrieved 4817093, as dense did'",
              drc == 0 && strstr(head, "shadowkv retrieved 4817093, as dense did") && rep.sparse_hit == 1);
    char *printed = NULL;
    size_t pn = 0;
    FILE *f = open_memstream(&printed, &pn);
    if (f && !drc) { needle_report_print(f, st, &rep, 0); fclose(f); } else if (f) fclose(f);
    test_cond("its causes read as margins, with no fix advice", printed && strstr(printed, "margins (the needle was "
              "retrieved") && !strstr(printed, "verdict:") && !strstr(printed, "raise --"));
    free(printed);
    int vrc;
    char *cells = drc ? NULL : needle_cells(st, &vrc);
    test_cond("the Needle view's title carries the outcome and the value", cells && strstr(cells, "retrieved 4817093") &&
              !strstr(cells, "value ?"));
    free(cells);
    probe_bus_free(bus);
    probe_store_free(st);
    free(text);
    free(ids);
    model_free(m);
}

/* ---- CLI level --------------------------------------------------------------- */

/* Runs skv with args, stdout into out (cap bytes) and stderr into err; the exit status. */
static int run_skv(const char *args, char *out, size_t cap, const char *err_path) {
    return test_popen(out, cap, "%s %s 2>%s", test_skv_bin(), args, err_path);
}

/* Drops what only a live --explain says: each fix's check (" -> retrieved
 * (checked...", " (unchecked...") to the end of its line, and the replay line. */
static void strip_checks(char *s) {
    char *w = s;
    for (char *r = s; *r;) {
        char *eol = strchr(r, '\n');
        size_t len = eol ? (size_t)(eol - r) : strlen(r);
        if (!strncmp(r, "  replay: ", 10)) { r += len + (eol ? 1 : 0); continue; }
        char line[4096];
        if (len >= sizeof line) len = sizeof line - 1;
        memcpy(line, r, len);
        line[len] = 0;
        char *cut = strstr(line, " -> retrieved (checked");
        if (!cut) cut = strstr(line, " -> still missed (checked");
        if (!cut) cut = strstr(line, " (unchecked");
        if (!cut) cut = strstr(line, " (not checked)");
        if (cut) *cut = 0;
        size_t ll = strlen(line);
        memmove(w, line, ll);
        w += ll;
        r += len;
        if (*r == '\n') { *w++ = '\n'; r++; }
    }
    *w = 0;
}

static char *slurp(const char *path) {
    char *t = NULL;
    size_t n;
    return skv_read_file(path, 1 << 26, &t, &n) == 0 ? t : NULL;
}

static uint8_t *read_png(const char *path, int *w, int *h) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) return NULL;
    img.format = PNG_FORMAT_RGBA;
    uint8_t *buf = malloc(PNG_IMAGE_SIZE(img));
    if (!buf || !png_image_finish_read(&img, NULL, buf, 0, NULL)) {
        free(buf);
        png_image_free(&img);
        return NULL;
    }
    *w = (int)img.width;
    *h = (int)img.height;
    return buf;
}

/* The table row of depth d: the dense and shadowkv rates per length. */
static int table_row(const char *out, float d, double *dense, double *sk, int n) {
    char key[32];
    snprintf(key, sizeof key, "\n%6g%%", d);
    const char *p = strstr(out, key);
    if (!p) return 0;
    p += strlen(key);
    for (int i = 0; i < n; i++) {
        char *end;
        dense[i] = strtod(p, &end);
        if (end == p) return 0;
        p = strchr(end, '|');
        if (!p) return 0;
        sk[i] = strtod(p + 1, &end);
        p = end;
    }
    return 1;
}

static void test_cli(void) {
    const char *model = test_shared("models/stories260k.gguf");
    if (!model) { test_skip("stories260k not found under ../shared: skv needle CLI checks skipped"); return; }
    static char out[1 << 20];
    const char *dir = test_tmpdir("needle");
    char err[600], args[3000], json[600], png[600], trace[600];
    snprintf(err, sizeof err, "%s/err.txt", dir);
    if (run_skv("needle --help", out, sizeof out, err) != 0 || !strstr(out, "--lengths")) {
        test_skip("this skv has no needle command yet (tui/main.c): CLI checks skipped");
        return;
    }
    snprintf(json, sizeof json, "%s/n.json", dir);
    snprintf(png, sizeof png, "%s/n.png", dir);
    snprintf(trace, sizeof trace, "%s/n.skvtrace", dir);
    unlink(json); unlink(png); unlink(trace);
    snprintf(args, sizeof args,
             "needle -m %s --lengths 192,256 --depths 0,50,100 --budget 16 --outliers 1 --answer-tokens 3 --explain "
             "--json %s --png %s --trace %s", model, json, png, trace);
    int rc = run_skv(args, out, sizeof out, err);
    test_cond("skv needle runs, with --explain, --json, --png and --trace", rc == 0);
    if (rc) { char *e = slurp(err); printf("  %s\n", e ? e : ""); free(e); return; }
    test_cond("--explain prints a verdict per ShadowKV miss", strstr(out, "verdict:") && strstr(out, "model:"));

    char *text = slurp(json);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *cases = cJSON_GetObjectItem(root, "cases");
    test_cond("the JSON parses and holds all 6 cases", cJSON_GetArraySize(cases) == 6);
    /* The case's task name once pointed into the sweep's stack frame. */
    int named = !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "settings"), "task")) ?
                        cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "settings"), "task")) : "",
                        "single");
    for (int i = 0; i < cJSON_GetArraySize(cases); i++) {
        const char *tn = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cases, i), "task"));
        named &= tn && !strcmp(tn, "single");
    }
    test_cond("a sweep without --task names its task 'single' in the settings and in every case", named);
    int ok = 1, nd = 0;
    double rate[2][3][2] = { { { 0 } } };  /* [length][depth][method] */
    int cnt[2][3] = { { 0 } };
    static const float deps[3] = { 0, 50, 100 };
    for (int i = 0; i < cJSON_GetArraySize(cases); i++) {
        cJSON *c = cJSON_GetArrayItem(cases, i), *nd_ = cJSON_GetObjectItem(c, "needle");
        int len = cJSON_GetObjectItem(c, "length")->valueint;
        double dep = cJSON_GetObjectItem(c, "depth")->valuedouble;
        int li = len == 192 ? 0 : 1, di = dep == 0 ? 0 : dep == 50 ? 1 : 2;
        int hd = cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "dense"), "hit"));
        int hs = cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "shadowkv"), "hit"));
        const char *val = cJSON_GetStringValue(cJSON_GetObjectItem(c, "value"));
        const char *ans = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "shadowkv"), "answer"));
        ok &= val && strlen(val) == 7 && ans && hs == needle_contains_value(ans, val);
        ok &= nd_ && cJSON_GetObjectItem(nd_, "tok_end")->valueint > cJSON_GetObjectItem(nd_, "tok_begin")->valueint &&
              cJSON_GetObjectItem(c, "prompt_len")->valueint == len;
        rate[li][di][0] += 100.0 * hd;
        rate[li][di][1] += 100.0 * hs;
        cnt[li][di]++;
        if (!hs) nd += cJSON_GetObjectItem(cJSON_GetObjectItem(c, "shadowkv"), "diagnosis") != NULL;
    }
    test_cond("every case has a 7-digit value, the needle span, and hit flags that match its answer", ok);
    int misses = 0;
    for (int l = 0; l < 2; l++)
        for (int d = 0; d < 3; d++) misses += rate[l][d][1] == 0;
    test_cond("every ShadowKV miss carries its diagnosis in the JSON", nd == misses);
    ok = 1;
    for (int d = 0; d < 3; d++) {
        double de[2], sk[2];
        ok &= table_row(out, deps[d], de, sk, 2);
        for (int l = 0; l < 2; l++)
            ok &= cnt[l][d] == 1 && fabs(de[l] - rate[l][d][0]) < 0.5 && fabs(sk[l] - rate[l][d][1]) < 0.5;
    }
    test_cond("the printed table says what the JSON says", ok);

    int w = 0, h = 0;
    uint8_t *px = read_png(png, &w, &h);
    test_cond("the PNG reads back with libpng", px && w > 100 && h > 100);
    probe_store *st = NULL;
    probe_store_new(&st);
    rc = trace_load_store(trace, st);
    test_cond("the trace replays: the detailed case's needle events and every case's niah events",
              rc == 0 && probe_store_n_niah(st) == 12 && probe_store_n_needles(st) == 1);
    canvas *c = NULL;
    canvas_png_opts po = { .scale = 1 };
    paint_result res;
    view_cursor cur;
    view_cursor_init(&cur);
    cur.clean = 1; /* as skv needle --png draws it */
    if (px && rc == 0 && canvas_png_new(&c, w, h, &po) == 0) {
        canvas_clear(c);
        rc = view_find("niah")->draw(c, (canvas_rect){ 0, 0, w, h }, st, &cur, &res);
        int cw, ch;
        const uint8_t *mine = canvas_png_pixels(c, &cw, &ch);
        test_cond("the niah view of the replayed trace draws the same pixels as the PNG written",
                  rc == 0 && cw == w && ch == h && !memcmp(mine, px, (size_t)w * h * 4));
        ok = rc == 0;
        for (int l = 0; l < 2 && ok; l++)
            for (int d = 0; d < 3; d++) {
                ok &= cell_color(px, w, h, res.area, 2, 3, l, d) == palette_viridis(rate[l][d][0] / 100);
                ok &= cell_color(px, w, h, res.legend, 2, 3, l, d) == palette_viridis(rate[l][d][1] / 100);
            }
        test_cond("each heatmap cell in the PNG has the colour of its JSON result (dense | shadowkv)", ok);
    }
    canvas_free(c);
    free(px);
    probe_store_free(st);

    /* The diagnosis from the trace alone equals the live one of the traced case. */
    int traced = cJSON_GetObjectItem(root, "traced_case") ? cJSON_GetObjectItem(root, "traced_case")->valueint : -1;
    char head[64], *live = NULL;
    snprintf(head, sizeof head, "case %d: ", traced);
    for (char *p = out; (p = strstr(p, head)); p++)
        if (p == out || p[-1] == '\n') { live = strchr(p, '\n'); break; }
    char *live_end = live ? strstr(live + 1, "\n\n") : NULL;
    static char diag[1 << 18];
    snprintf(args, sizeof args, "needle --diagnose %s", trace);
    rc = run_skv(args, diag, sizeof diag, err);
    char *from_trace = strchr(diag, '\n');
    /* the live block also says what each fix's check gave and how to replay the case; a trace
     * diagnosed alone cannot rerun the model, so its fixes read "unchecked": compare the rest */
    static char a_live[1 << 18], a_trace[1 << 18];
    if (live && live_end) { size_t n = (size_t)(live_end - live); memcpy(a_live, live, n); a_live[n] = 0; }
    snprintf(a_trace, sizeof a_trace, "%s", from_trace ? from_trace : "");
    strip_checks(a_live);
    strip_checks(a_trace);
    size_t n_live = strlen(a_live);
    test_cond("skv needle --diagnose TRACE gives the traced case's report, verdict included, as --explain gave it live",
              rc == 0 && traced >= 0 && n_live > 0 && from_trace && strstr(a_trace, "verdict:") &&
                  !strcmp(a_trace, a_live));
    test_cond("the live --explain block prints the command that replays its case", live && live_end &&
              strstr(live, "replay: skv needle") && strstr(live, "--case"));
    cJSON_Delete(root);

    /* outputs are kept without --force; bad lists are one line and exit 2 */
    struct stat sb0, sb1;
    stat(json, &sb0);
    snprintf(args, sizeof args, "needle -m %s --lengths 192 --depths 0 --json %s", model, json);
    rc = run_skv(args, out, sizeof out, err);
    stat(json, &sb1);
    char *e = slurp(err);
    test_cond("an existing --json file is kept without --force (exit 1, one line)",
              rc == 1 && e && strstr(e, "--force") && strchr(e, '\n') == e + strlen(e) - 1 && sb0.st_size == sb1.st_size &&
                  sb0.st_mtime == sb1.st_mtime);
    free(e);
    snprintf(args, sizeof args, "needle -m %s --depths 0:200:10", model);
    rc = run_skv(args, out, sizeof out, err);
    e = slurp(err);
    test_cond("--depths 0:200:10 is refused with one line and exit 2",
              rc == 2 && e && strstr(e, "--depths") && strchr(e, '\n') == e + strlen(e) - 1);
    free(e);
    snprintf(args, sizeof args, "needle -m %s -p hello", model);
    test_cond("-p is refused (skv needle builds its prompts)", run_skv(args, out, sizeof out, err) == 2);

    /* skv export draws both views from the trace, when this skv has export */
    if (run_skv("export --help", out, sizeof out, err) == 0) {
        char fig[700];
        snprintf(fig, sizeof fig, "%s/niah.png", dir);
        unlink(fig);
        snprintf(args, sizeof args, "export --trace %s --view niah -o %s", trace, fig);
        int r1 = run_skv(args, out, sizeof out, err);
        snprintf(fig, sizeof fig, "%s/needle.png", dir);
        unlink(fig);
        snprintf(args, sizeof args, "export --trace %s --view needle -o %s", trace, fig);
        int r2 = run_skv(args, out, sizeof out, err);
        test_cond("skv export --view niah and --view needle work from the needle trace", r1 == 0 && r2 == 0);
    } else {
        test_skip("this skv has no export command yet: export of the needle trace skipped");
    }
}

/* ---- tasks: the facts are train.py's sentences, tokenized apart ------------ */

typedef struct { const needle_task *task; int cases, keyed_ok, spans_ok, distinct, text_ok; char first[160]; } task_check;

static int check_task_case(const needle_case *c, void *user) {
    task_check *t = user;
    t->cases++;
    const char *tmpl = !strcmp(c->task, "multikey") ? "The special magic number for %s is %s."
                       : !strcmp(c->task, "multikey-alt") ? "One of the magic numbers for %s is: %s."
                       : !strcmp(c->task, "passkey") ? "The pass key is %s. Remember it. %s is the pass key."
                       : "The special magic number is %s.";
    int keyed = !strcmp(c->task, "multikey") || !strcmp(c->task, "multikey-alt");
    t->keyed_ok += keyed ? c->n_facts >= 2 && c->n_facts <= 4 : c->n_facts == 1;
    int spans = 1;
    for (int i = 0; i < c->n_facts; i++) {
        char want[200];
        if (keyed) snprintf(want, sizeof want, tmpl, c->keys[i], c->values[i]);
        else snprintf(want, sizeof want, tmpl, c->values[i], c->values[i]);
        for (int j = 0; j < i; j++) t->distinct &= strcmp(c->values[i], c->values[j]) && (strcmp(c->keys[i], c->keys[j]) || !keyed);
        char *got = needle_fill(t->task->fact, c->keys[i], c->values[i]);
        t->text_ok &= got && !strcmp(got, want); /* train.py's sentence, word for word */
        free(got);
        spans &= c->fact_end[i] > c->fact_begin[i] && c->fact_begin[i] >= 1 && c->fact_end[i] <= c->prompt_len;
    }
    t->spans_ok += spans && c->tok_begin == c->fact_begin[0] && !strcmp(c->value, c->values[0]);
    if (!t->first[0]) snprintf(t->first, sizeof t->first, "%s", c->keys[0]);
    return 0;
}

/* Prompts of every built-in task on the demo model: the facts decode to the
 * sentences train.py plants (with the leading space of a separate piece),
 * multikey has 2-4 facts with distinct keys and values, and at a budget
 * covering the prompt every policy answers as dense. */
static void test_tasks(void) {
    char *hay = haystack_text();
    skv_model *m = NULL;
    if (!hay || model_load("samples/model/skv-demo.gguf", &m)) {
        test_cond("the demo model and haystack load", 0);
        free(hay);
        return;
    }
    for (int k = 0; needle_task_names[k]; k++) {
        needle_task task;
        char msg[256];
        int rc = needle_task_builtin(needle_task_names[k], &task);
        needle_opts o;
        needle_opts_default(&o);
        int lens[2] = { 400, 700 };
        float deps[3] = { 10, 50, 90 };
        o.haystack = hay;
        o.task = &task;
        o.lengths = lens;
        o.n_lengths = 2;
        o.depths = deps;
        o.n_depths = 3;
        o.runs = 2;
        needle_set_methods(&o, "dense");
        task_check tc = { .task = &task, .distinct = 1, .text_ok = 1 };
        needle_result res;
        if (!rc) rc = needle_run(m, &o, check_task_case, &tc, &res);
        snprintf(msg, sizeof msg, "task %s: 12 cases with the right number of facts, spans inside the prompt, the "
                 "asked fact first", needle_task_names[k]);
        test_cond(msg, rc == 0 && tc.cases == 12 && tc.keyed_ok == 12 && tc.spans_ok == 12 && tc.distinct);
        snprintf(msg, sizeof msg, "task %s: the facts are samples/train/train.py's sentences", needle_task_names[k]);
        test_cond(msg, tc.text_ok);
        /* every fact's tokens are the sentence encoded on its own with a leading space */
        int exact = rc == 0 && res.n_cases > 0;
        for (int i = 0; exact && i < res.n_cases; i++) {
            const needle_case *c = &res.cases[i];
            for (int f = 0; f < c->n_facts && exact; f++) {
                char *text = needle_fill(task.fact, c->keys[f], c->values[f]);
                char buf[256];
                snprintf(buf, sizeof buf, " %s", text);
                free(text);
                int32_t *ids = NULL;
                int n = 0;
                exact = !tok_encode(m->tok, buf, strlen(buf), 0, 0, &ids, &n) && n == c->fact_end[f] - c->fact_begin[f];
                free(ids);
            }
        }
        snprintf(msg, sizeof msg, "task %s: each fact takes exactly the tokens of its sentence encoded apart",
                 needle_task_names[k]);
        test_cond(msg, exact);
        if (!strcmp(needle_task_names[k], "single")) {
            /* the single task is the old default needle: same prompts and values */
            needle_opts o2 = o;
            o2.task = NULL;
            needle_result r2;
            int rc2 = needle_run(m, &o2, NULL, NULL, &r2);
            int same = rc2 == 0 && r2.n_cases == res.n_cases;
            for (int i = 0; same && i < r2.n_cases; i++)
                same = !strcmp(r2.cases[i].value, res.cases[i].value) && r2.cases[i].tok_begin == res.cases[i].tok_begin &&
                       !strcmp(r2.cases[i].answer[0], res.cases[i].answer[0]);
            test_cond("task single builds the same prompts, values and answers as --needle/--question", same);
            needle_result_free(&r2);
        }
        needle_result_free(&res);
        needle_task_free(&task);
    }
    needle_task bad;
    test_cond("an unknown task is refused with the names", needle_task_builtin("multi", &bad) == SKV_EINVAL &&
                                                              strstr(skv_last_error(), "multikey-alt"));
    model_free(m);
    free(hay);
}

/* ---- checked fixes on the demo model ----------------------------------------- */

static char needle_stdout[1 << 18]; /* the last needle_json's stdout */

/* The JSON of `skv needle ARGS --json F` (parsed), or NULL. */
static cJSON *needle_json(const char *args, const char *dir, const char *name) {
    char *out = needle_stdout;
    char path[600], cmd[3000], err[600];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    snprintf(err, sizeof err, "%s/%s.err", dir, name);
    snprintf(cmd, sizeof cmd, "needle %s --json %s --force", args, path); /* no -m: the demo model and its preset */
    if (run_skv(cmd, out, sizeof needle_stdout, err) != 0) return NULL;
    char *t = slurp(path);
    cJSON *j = t ? cJSON_Parse(t) : NULL;
    free(t);
    return j;
}

/* Case 0 of a JSON's cases, method name's object. */
static cJSON *case_method(cJSON *j, const char *name) {
    return cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "cases"), 0), name);
}

/* Runs the sweep args under --explain; wants a verdict of cause `want`
 * whose check retrieved the needle; replays every fix of every case checked
 * as retrieved (args --case N plus the change) and wants the needle then;
 * no budget advice at or below the budget that missed. */
static void checked_case(const char *what, const char *args, const char *method, const char *want, const char *dir) {
    char a2[2000], name[64], msg[400];
    snprintf(a2, sizeof a2, "%s --explain", args);
    snprintf(name, sizeof name, "chk-%s", want);
    for (char *q = name; *q; q++) if (*q == ' ') *q = '_';
    cJSON *j = needle_json(a2, dir, name), *cases = cJSON_GetObjectItem(j, "cases");
    int found = 0, replayed = 0, replay_ok = 1, units_ok = 1, misses = 0;
    double budget = NAN;
    for (int k = 0; k < cJSON_GetArraySize(cases); k++) {
        cJSON *cs = cJSON_GetArrayItem(cases, k), *m = cJSON_GetObjectItem(cs, method);
        cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(m, "diagnosis"), "verdict");
        int index = cJSON_GetObjectItem(cs, "index") ? cJSON_GetObjectItem(cs, "index")->valueint : -1;
        budget = cJSON_GetNumberValue(cJSON_GetObjectItem(cs, "budget_tokens"));
        misses += !cJSON_IsTrue(cJSON_GetObjectItem(m, "hit"));
        for (int i = 0; i < cJSON_GetArraySize(v); i++) {
            cJSON *c = cJSON_GetArrayItem(v, i), *ch = cJSON_GetObjectItem(c, "change");
            const char *cause = cJSON_GetStringValue(cJSON_GetObjectItem(c, "cause"));
            const char *check = cJSON_GetStringValue(cJSON_GetObjectItem(c, "check"));
            const char *opt = cJSON_GetStringValue(cJSON_GetObjectItem(ch, "option"));
            double val = cJSON_GetNumberValue(cJSON_GetObjectItem(ch, "value"));
            if (opt && !strcmp(opt, "budget") && isfinite(budget) && val <= budget) units_ok = 0;
            int retrieved = check && !strcmp(check, "retrieved");
            found |= retrieved && cause && !strcmp(cause, want);
            if (!retrieved || !opt) continue;
            char a3[2200], n3[80];
            snprintf(a3, sizeof a3, "%s%s --%s %.0f", args, strstr(args, "--case") ? "" : " --case", opt, val);
            if (!strstr(args, "--case")) snprintf(a3, sizeof a3, "%s --case %d --%s %.0f", args, index, opt, val);
            snprintf(n3, sizeof n3, "rep-%d-%d", index, i);
            cJSON *r = needle_json(a3, dir, n3);
            replay_ok &= cJSON_IsTrue(cJSON_GetObjectItem(case_method(r, method), "hit"));
            replayed++;
            cJSON_Delete(r);
        }
    }
    snprintf(msg, sizeof msg, "%s: %s misses (%d case%s), and a '%s' fix is checked to retrieve the needle", what,
             method, misses, misses == 1 ? "" : "s", want);
    test_cond(msg, j && misses > 0 && found);
    snprintf(msg, sizeof msg, "%s: each of the %d fixes checked as retrieved, replayed with its change, retrieves it",
             what, replayed);
    test_cond(msg, replayed > 0 && replay_ok);
    snprintf(msg, sizeof msg, "%s: no budget advice at or below the budget that missed", what);
    test_cond(msg, units_ok);
    cJSON_Delete(j);
}

static void test_checked(void) {
    struct stat sb;
    if (stat("samples/model/skv-demo.gguf", &sb) != 0 || stat(test_skv_bin(), &sb) != 0) {
        test_skip("the demo model or the skv binary is missing: the checked-fix cases");
        return;
    }
    const char *dir = test_tmpdir("needle-checked");
    const char *grid = "--lengths 1k,2k,4000 --depths 0:100:10";
    /* the demo preset sweep: every fix checked as retrieved holds on replay (never selected and
     * compressed among them) */
    checked_case("the demo preset sweep", grid, "shadowkv", "never selected", dir);
    char a[400];
    snprintf(a, sizeof a, "%s --case 12", grid);
    checked_case("demo preset case 12 (2k, 10%)", a, "shadowkv", "compressed", dir);
    checked_case("--local 1, the needle near the end", "--lengths 1k --depths 90 --local 1", "shadowkv", "window", dir);
    checked_case("--budget 16, case 8", "--lengths 1k,2k --depths 0:100:25 --budget 16 --case 8", "shadowkv", "budget",
                 dir);
    checked_case("quest under its floor (budget 31)", "--kv dense,quest --lengths 1k --depths 50", "quest", "floor", dir);
    /* under its floor a policy selects nothing: no score left the needle out, and a budget raise
     * that stays under the floor is no fix (SpeCache at 31 tokens: floor 65, the residual + 1) */
    char fl_trace[600], fl_args[900];
    snprintf(fl_trace, sizeof fl_trace, "%s/floor.skvt", dir);
    unlink(fl_trace);
    snprintf(fl_args, sizeof fl_args, "--kv dense,specache --lengths 1k --depths 0,50,100 --case 2 --explain --trace %s",
             fl_trace);
    cJSON *fl = needle_json(fl_args, dir, "floor-only");
    cJSON *fv = cJSON_GetObjectItem(cJSON_GetObjectItem(case_method(fl, "specache"), "diagnosis"), "verdict");
    int has_floor = 0, stray = 0;
    for (int i = 0; i < cJSON_GetArraySize(fv); i++) {
        cJSON *c = cJSON_GetArrayItem(fv, i), *ch = cJSON_GetObjectItem(c, "change");
        const char *cause = cJSON_GetStringValue(cJSON_GetObjectItem(c, "cause"));
        const char *opt = cJSON_GetStringValue(cJSON_GetObjectItem(ch, "option"));
        has_floor |= cause && !strcmp(cause, "floor");
        stray |= cause && !strcmp(cause, "never selected");
        stray |= cause && !strcmp(cause, "budget") && opt && !strcmp(opt, "budget") &&
                 cJSON_GetNumberValue(cJSON_GetObjectItem(ch, "value")) <= 65;
    }
    test_cond("under its floor: the floor, no 'never selected', no budget raise at or under the floor",
              fl && has_floor && !stray);
    cJSON_Delete(fl);
    /* the same verdict from the trace alone (--diagnose; the Needle view reads it the same way) */
    char dg[8192];
    int drc = test_popen(dg, sizeof dg, "%s needle --diagnose %s 2>&1", test_skv_bin(), fl_trace);
    test_cond("--diagnose of that trace: the floor first, no 'never selected'",
              drc == 0 && strstr(dg, "1. floor: at --budget 31 specache selects nothing") && !strstr(dg, "never selected"));
    /* the model's own miss: said first, nothing to check */
    cJSON *j = needle_json("--kv dense,specache --lengths 4000 --depths 0 --budget 32 --explain", dir, "model");
    cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(case_method(j, "specache"), "diagnosis"), "verdict");
    const char *first = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(v, 0), "cause"));
    test_cond("a miss dense shares is the model's: said first, no fix checked", first && !strcmp(first, "model") &&
              !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(v, 0), "check")), "unchecked"));
    cJSON_Delete(j);
    /* --case N is case N of the full sweep: the same value and outcome */
    cJSON *full = needle_json("--lengths 1k,2k --depths 0:100:50", dir, "full");
    /* the preset's budget of 3% is 31 tokens at 1k and 61 at 2k: the table says both, and
     * no policy line names one length's (it once said budget=31 over both) */
    test_cond("a sweep of two lengths at --budget 3% gives the budget's range and the percentage per policy",
              strstr(needle_stdout, "(budget 3% of the prompt: 31 to 61 tokens)") &&
              strstr(needle_stdout, "\n  shadowkv: budget=3% rank=16 ") && !strstr(needle_stdout, "budget=31"));
    cJSON *one = needle_json("--lengths 1k,2k --depths 0:100:50 --case 4", dir, "one");
    /* --verbose prints the tables behind a verdict: each needle chunk's part and cos-min per
     * layer and KV head, then its ranks per decode step */
    cJSON *vb = needle_json("--lengths 1k,2k --depths 0:100:25 --case 8 --explain --verbose", dir, "verbose");
    const char *pre = strstr(needle_stdout, "prefill, per layer and KV head"), *dec = strstr(needle_stdout, "decode steps (r:");
    test_cond("--explain --verbose prints the prefill table (a row per layer and head, each needle chunk's part) "
              "and the decode steps' ranks",
              vb && pre && dec && pre < dec && strstr(pre, "    layer  3 head 1  key err") &&
              (strstr(pre, " cand    cos-min ") || strstr(pre, " outlier cos-min ")) && strstr(dec, "    step  0 layer  0 head 0 |"));
    cJSON_Delete(vb);
    cJSON *cf = cJSON_GetArrayItem(cJSON_GetObjectItem(full, "cases"), 4), *co = cJSON_GetArrayItem(cJSON_GetObjectItem(one, "cases"), 0);
    const char *vf = cJSON_GetStringValue(cJSON_GetObjectItem(cf, "value")), *vo = cJSON_GetStringValue(cJSON_GetObjectItem(co, "value"));
    const char *af = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(cf, "shadowkv"), "answer"));
    const char *ao = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(co, "shadowkv"), "answer"));
    test_cond("skv needle --case 4 replays case 4 of the sweep: same index, value and answer", vf && vo && af && ao &&
              !strcmp(vf, vo) && !strcmp(af, ao) && cJSON_GetObjectItem(co, "index")->valueint == 4);
    cJSON_Delete(full);
    cJSON_Delete(one);
}

int main(void) {
    test_hit_is_hit();
    test_checked();
    test_tasks();
    test_lists();
    test_planted();
    test_planted_oracle();
    test_niah_view();
    test_watch_is_passive();
    test_model("models/mini-smollm-f32.gguf", 320);
    test_model("models/stories260k.gguf", 320);
    test_cli();
    return test_report("test_needle");
}
