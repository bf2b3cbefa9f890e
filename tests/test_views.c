/* test_views: every view drawn from a synthetic ShadowKV run.
 *
 * The store is filled event by event (run, tokens, prefill per layer and
 * head, decode selections with oracle ranks over a few steps, spans, step
 * stats, a needle). Each view is drawn into terminal cells (80x24, 200x60,
 * ASCII, tiny sizes) and into PNG canvases; the checks are the return codes
 * (0 with data, SKV_EMISSING and a message without), layout facts reported
 * through paint_result (the spectrum's rank cut at the painter's mapping of
 * r; selection cells coloured hit / miss / outlier / local / not selected at
 * their data positions), that nothing is drawn outside the rectangle, that
 * drawing is deterministic, and that move and click change the cursor the
 * way each view documents. */
#include "probe.h"
#include "skv.h"
#include "store.h"
#include "testhelp.h"
#include "view.h"

#include <stdint.h>

#define L 3             /* layers */
#define H 2             /* KV heads */
#define STEPS 6
#define K 4             /* chunks selected per step */
#define NCH 120         /* chunks in the prompt */
#define CH 8            /* tokens per chunk */
#define RANK 5
#define XSTR_(x) #x
#define XSTR(x) XSTR_(x)
#define NSV 12
#define LOCAL_START 116

/* The selection of (step, layer, head): a chunk kept by every step (a hit
 * after step 0), a head's chunk that layer 2 moves every step, a chunk that
 * moves every step (always a miss) and one that moves every other step. */
static void selection_of(int s, int l, int h, int sel[K]) {
    sel[0] = 10 + l;
    sel[1] = 20 + h + (l == 2 ? s : 0);
    sel[2] = 30 + s;
    sel[3] = 40 + s / 2;
}

static int hits_of(int s, int l) {
    if (s == 0) return 0;
    return (l == 2 ? 1 : 2) + (s % 2);
}

static int add(probe_store *st, probe_event ev) { return probe_store_add(st, &ev); }

/* Fills st with the synthetic run; returns the number of events refused. */
static int fill_store(probe_store *st) {
    int bad = 0;
    bad += add(st, (probe_event){ .kind = PROBE_RUN,
                                  .run = { .model = "synthetic", .arch = "llama", .format = "gguf", .random_weights = 1,
                                           .n_layers = L, .n_heads = 4, .n_kv_heads = H, .head_dim = 16, .max_ctx = 1024,
                                           .prompt_len = NCH * CH + 3, .kv_policy = "shadowkv",
                                           .kv_opts = "rank=" XSTR(RANK) " chunk=" XSTR(CH) " outliers=2 local=4",
                                           .budget = K * CH, .oracle = 1,
                                           .backend = "cpu" } }) != 0;
    static const char *prompt[] = { "<s>", "Once", " upon", " a", " time", "\n", " ctrl\x01", "bad\xff", " end", "." };
    for (int i = 0; i < 10; i++)
        bad += add(st, (probe_event){ .kind = PROBE_TOKEN, .token = { .pos = i, .id = 100 + i, .step = -1,
                                                                      .n_text = (int)strlen(prompt[i]), .text = prompt[i] } }) != 0;
    for (int l = 0; l < L; l++) {
        float sv[NSV];
        for (int i = 0; i < NSV; i++) sv[i] = (float)(100.0 * pow(i + 1, -(1.0 + l)));
        bad += add(st, (probe_event){ .kind = PROBE_PREFILL_LAYER,
                                      .prefill_layer = { .layer = l, .seq_len = NCH * CH + 3, .rank = RANK, .n_sv = NSV,
                                                         .rel_err = 0.01f * (float)(l + 1), .t_svd = 0.01, .sv = sv } }) != 0;
        bad += add(st, (probe_event){ .kind = PROBE_SPAN, .span = { .stream = PROBE_STREAM_COMPUTE, .layer = l, .step = -1,
                                                                    .t0 = 1 + 0.01 * l, .t1 = 1.008 + 0.01 * l, .op = "svd" } }) != 0;
        for (int h = 0; h < H; h++) {
            float cm[NCH];
            for (int c = 0; c < NCH; c++) cm[c] = (float)(0.2 + 0.7 * sin(0.1 * c + l + h));
            int outl[2] = { 2, 50 };
            bad += add(st, (probe_event){ .kind = PROBE_PREFILL_HEAD,
                                          .prefill_head = { .layer = l, .head = h, .chunk = CH, .n_chunks = NCH, .n_outliers = 2,
                                                            .n_landmarks = NCH - 6, .local_start = LOCAL_START, .cos_min = cm,
                                                            .outliers = outl } }) != 0;
        }
    }
    int nchunks[2] = { 60, 61 }, nrank[2] = { 3, 9 }, nsel[2] = { 1, 0 };
    bad += add(st, (probe_event){ .kind = PROBE_NEEDLE, .needle = { .id = 0, .tok_begin = 480, .tok_end = 496, .n_chunks = 2,
                                                                    .step = 0, .layer = 0, .head = 0, .mass_exact = 0.5f,
                                                                    .mass_sparse = 0.4f, .chunks = nchunks, .rank = nrank,
                                                                    .selected = nsel } }) != 0;
    int rank_exact[NCH], rank_lm[NCH];
    for (int c = 0; c < NCH; c++) { rank_exact[c] = c; rank_lm[c] = NCH - 1 - c; }
    for (int s = 0; s < STEPS; s++) {
        for (int l = 0; l < L; l++) {
            double t = 10 + s + 0.012 * l;
            for (int h = 0; h < H; h++) {
                int sel[K];
                float sc[K] = { 0.9f, 0.7f, 0.5f, 0.3f };
                selection_of(s, l, h, sel);
                bad += add(st, (probe_event){ .kind = PROBE_DECODE_HEAD,
                                              .decode_head = { .step = s, .layer = l, .head = h, .n_sel = K,
                                                               .fetch_bytes = 1000000,
                                                               .hits = hits_of(s, l), .misses = K - hits_of(s, l),
                                                               .has_oracle = 1, .recall = 0.5f, .n_chunks = NCH, .sel = sel,
                                                               .score = sc, .rank_exact = rank_exact,
                                                               .rank_landmark = rank_lm } }) != 0;
            }
            bad += add(st, (probe_event){ .kind = PROBE_SPAN, .span = { PROBE_STREAM_COMPUTE, l, s, t, t + 0.010, "attention" } }) != 0;
            bad += add(st, (probe_event){ .kind = PROBE_SPAN, .span = { PROBE_STREAM_COMPUTE, l, s, t + 0.001, t + 0.003, "select" } }) != 0;
            bad += add(st, (probe_event){ .kind = PROBE_SPAN, .span = { PROBE_STREAM_FETCH, l, s, t + 0.003, t + 0.005, "fetch_v" } }) != 0;
            bad += add(st, (probe_event){ .kind = PROBE_SPAN, .span = { PROBE_STREAM_REBUILD, l, s, t + 0.005, t + 0.007, "rebuild_k" } }) != 0;
            bad += add(st, (probe_event){ .kind = PROBE_SPAN, .span = { PROBE_STREAM_COMPUTE, l, s, t + 0.007, t + 0.009, "sparse_attn" } }) != 0;
        }
        char text[16];
        snprintf(text, sizeof text, " GEN%d", s);
        bad += add(st, (probe_event){ .kind = PROBE_TOKEN, .token = { .pos = NCH * CH + 3 + s, .id = 200 + s, .step = s,
                                                                      .n_text = (int)strlen(text), .text = text } }) != 0;
        bad += add(st, (probe_event){ .kind = PROBE_STEP, .step = { .step = s, .token = 200 + s, .seconds = 0.01,
                                                                    .hit_rate = 0.5f, .has_oracle = 1,
                                                                    .top1_agree = s != 2, .n_fetch = 2 } }) != 0;
    }
    return bad;
}

/* A dense run: tokens, spans and steps, but no ShadowKV events. */
static int fill_dense(probe_store *st) {
    int bad = add(st, (probe_event){ .kind = PROBE_RUN, .run = { .model = "dense", .n_layers = L, .n_heads = 4, .n_kv_heads = H,
                                                                 .head_dim = 16, .max_ctx = 1024, .kv_policy = "dense" } }) != 0;
    bad += add(st, (probe_event){ .kind = PROBE_TOKEN, .token = { .pos = 0, .id = 1, .step = -1, .n_text = 5, .text = "hello" } }) != 0;
    for (int s = 0; s < 2; s++) {
        bad += add(st, (probe_event){ .kind = PROBE_SPAN, .span = { PROBE_STREAM_COMPUTE, 0, s, s, s + 0.001, "attention" } }) != 0;
        bad += add(st, (probe_event){ .kind = PROBE_TOKEN, .token = { .pos = 1 + s, .id = 2, .step = s, .n_text = 2, .text = " x" } }) != 0;
        bad += add(st, (probe_event){ .kind = PROBE_STEP, .step = { .step = s, .token = 2 } }) != 0;
    }
    return bad;
}

/* ---- helpers ---- */

/* The views this test covers (needle and niah have their own). */
static const char *const my_views[] = { "spectrum", "chunkmap", "selection", "cache", "timeline", "tokens", NULL };

static canvas *cells(int w, int h, unsigned flags) {
    canvas *c = NULL;
    if (canvas_cells_new(&c, w, h, flags)) return NULL;
    return c;
}

static canvas *png(int w, int h, int scale) {
    canvas *c = NULL;
    canvas_png_opts o = { .scale = scale };
    if (canvas_png_new(&c, w, h, &o)) return NULL;
    canvas_clear(c);
    return c;
}

static int draw(const view_class *v, canvas *c, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    return v->draw(c, (canvas_rect){ 0, 0, g->w, g->h }, st, cur, res);
}

/* The text of a cells canvas (the caller frees it). */
static char *text_of(canvas *c) { return canvas_cells_text(c); }

static canvas_color pixel(canvas *c, double x, double y) {
    int w, h;
    const uint8_t *px = canvas_png_pixels(c, &w, &h);
    int scale = (int)lround(w / canvas_geometry(c)->w);
    int X = (int)floor(x * scale), Y = (int)floor(y * scale);
    if (!px || X < 0 || Y < 0 || X >= w || Y >= h) return CANVAS_NONE;
    const uint8_t *p = px + ((size_t)Y * w + X) * 4;
    return CANVAS_RGB(p[0], p[1], p[2]);
}

/* Row and column where needle first occurs in a cells canvas at or below
 * row *row; 0 when absent. */
static int find_text(canvas *c, const char *needle, int *row, int *col) {
    int min_row = *row;
    char *t = text_of(c);
    if (!t) return 0;
    int found = 0, r = 0;
    for (char *line = t; *line && !found; r++) {
        char *end = strchr(line, '\n');
        if (!end) break;
        *end = 0;
        char *p = r >= min_row ? strstr(line, needle) : NULL;
        if (p) {
            int k = 0; /* columns are code points */
            for (const char *q = line; q < p; ) { canvas_utf8_next(&q); k++; }
            *row = r;
            *col = k;
            found = 1;
        }
        line = end + 1;
    }
    free(t);
    return found;
}

/* ---- tests ---- */

static void test_table(void) {
    int ok = 1, n = 0;
    for (int i = 0; view_classes[i]; i++) {
        const view_class *v = view_classes[i];
        ok &= view_find(v->name) == v && v->name && v->title && v->help;
    }
    test_cond("views: every view in the table is found by its name", ok);
    ok = 1;
    for (int i = 0; my_views[i]; i++) {
        const view_class *v = view_find(my_views[i]);
        ok &= view_available(v) && v->move != NULL && v->click != NULL;
        n += v != NULL;
    }
    test_cond("views: spectrum, chunkmap, selection, cache, timeline and tokens are built, with move and click", ok && n == 6);
    test_cond("views: needle and niah have their places in the table", view_find("needle") && view_find("niah"));
}

static void test_all_sizes(const probe_store *st) {
    view_cursor cur;
    view_cursor_init(&cur);
    cur.layer = 1;
    cur.head = 1;
    static const int sizes[][2] = { { 80, 24 }, { 200, 60 }, { 10, 4 }, { 1, 1 }, { 40, 12 } };
    for (int i = 0; my_views[i]; i++) {
        const view_class *v = view_find(my_views[i]);
        int ok = 1;
        char what[96];
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            canvas *c = cells(sizes[k][0], sizes[k][1], 0);
            paint_result res;
            int rc = c ? draw(v, c, st, &cur, &res) : -99;
            ok &= rc == 0;
            canvas_free(c);
        }
        snprintf(what, sizeof what, "%s: draws with data into cells of 80x24, 200x60, 40x12, 10x4 and 1x1", v->name);
        test_cond(what, ok);

        canvas *a = cells(80, 24, CANVAS_CELLS_ASCII);
        ok = a && draw(v, a, st, &cur, NULL) == 0;
        char *t = a ? text_of(a) : NULL;
        for (char *p = t; p && *p; p++) ok &= (unsigned char)*p < 128;
        snprintf(what, sizeof what, "%s: ASCII cells hold only ASCII", v->name);
        test_cond(what, ok && t);
        free(t);
        canvas_free(a);

        /* nothing outside the rectangle */
        canvas *c = cells(80, 24, 0);
        canvas_rect r = { 10, 4, 50, 14 };
        ok = c && v->draw(c, r, st, &cur, NULL) == 0;
        int cols, rows;
        const canvas_cell *grid = c ? canvas_cells_grid(c, &cols, &rows) : NULL;
        for (int y = 0; grid && y < rows; y++)
            for (int x = 0; x < cols; x++) {
                if (x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + r.h) continue;
                const canvas_cell *cell = &grid[y * cols + x];
                ok &= cell->ch == ' ' && cell->bg == CANVAS_DEFAULT;
            }
        snprintf(what, sizeof what, "%s: draws nothing outside its rectangle", v->name);
        test_cond(what, ok && grid);
        canvas_free(c);

        /* PNG: 1200x700, 2x, tiny; deterministic */
        canvas *p1 = png(1200, 700, 1), *p2 = png(1200, 700, 1), *p3 = png(600, 350, 2), *p4 = png(16, 16, 1);
        ok = p1 && p2 && p3 && p4;
        if (ok) {
            ok &= draw(v, p1, st, &cur, NULL) == 0 && draw(v, p2, st, &cur, NULL) == 0;
            ok &= draw(v, p3, st, &cur, NULL) == 0 && draw(v, p4, st, &cur, NULL) == 0;
            int w1, h1, w2, h2, w3, h3;
            const uint8_t *x1 = canvas_png_pixels(p1, &w1, &h1), *x2 = canvas_png_pixels(p2, &w2, &h2);
            canvas_png_pixels(p3, &w3, &h3);
            snprintf(what, sizeof what, "%s: PNG drawing is deterministic", v->name);
            test_cond(what, ok && w1 == w2 && h1 == h2 && !memcmp(x1, x2, (size_t)w1 * h1 * 4));
            snprintf(what, sizeof what, "%s: PNG at scale 2 has twice the pixels", v->name);
            test_cond(what, ok && w3 == 1200 && h3 == 700);
        } else {
            test_cond("PNG canvases created (fonts found)", 0);
        }
        canvas_free(p1);
        canvas_free(p2);
        canvas_free(p3);
        canvas_free(p4);
    }
}

static void test_missing(void) {
    probe_store *empty, *dense;
    probe_store_new(&empty);
    probe_store_new(&dense);
    test_cond("dense store filled", fill_dense(dense) == 0);
    view_cursor cur;
    view_cursor_init(&cur);
    for (int i = 0; my_views[i]; i++) {
        const view_class *v = view_find(my_views[i]);
        char what[128];
        canvas *c = cells(80, 24, 0), *p = png(600, 300, 1), *tiny = cells(10, 4, 0);
        paint_result res;
        int rc = draw(v, c, empty, &cur, &res);
        char *t = text_of(c);
        int letters = 0;
        for (char *q = t; q && *q; q++) letters += (*q >= 'a' && *q <= 'z');
        snprintf(what, sizeof what, "%s: an empty store gives SKV_EMISSING and a message", v->name);
        test_cond(what, rc == SKV_EMISSING && letters > 10 && strlen(skv_last_error()) > 10);
        free(t);
        snprintf(what, sizeof what, "%s: the message also fits a PNG and a 10x4 grid", v->name);
        test_cond(what, draw(v, p, empty, &cur, NULL) == SKV_EMISSING && draw(v, tiny, empty, &cur, NULL) == SKV_EMISSING);
        canvas_free(c);
        canvas_free(p);
        canvas_free(tiny);
    }
    /* a dense run: no ShadowKV data for the ShadowKV views; tokens and timeline work */
    static const char *needs_shadowkv[] = { "spectrum", "chunkmap", "selection", "cache" };
    for (size_t i = 0; i < sizeof needs_shadowkv / sizeof needs_shadowkv[0]; i++) {
        canvas *c = cells(100, 24, 0);
        int rc = draw(view_find(needs_shadowkv[i]), c, dense, &cur, NULL);
        char *t = text_of(c), what[128];
        snprintf(what, sizeof what, "%s: a dense run says the policy records none, and where to find policies",
                 needs_shadowkv[i]);
        test_cond(what, rc == SKV_EMISSING && t && strstr(t, "policy dense records none") && strstr(t, "--kv help"));
        free(t);
        canvas_free(c);
    }
    canvas *c = cells(80, 24, 0);
    test_cond("tokens and timeline draw a dense run", draw(view_find("tokens"), c, dense, &cur, NULL) == 0 &&
                                                          draw(view_find("timeline"), c, dense, &cur, NULL) == 0);
    canvas_free(c);
    probe_store_free(empty);
    probe_store_free(dense);
}

static void test_spectrum(const probe_store *st) {
    const view_class *v = view_find("spectrum");
    view_cursor cur;
    view_cursor_init(&cur);
    cur.layer = 1;
    canvas *p = png(1200, 700, 1);
    paint_result res;
    int rc = p ? draw(v, p, st, &cur, &res) : -99;
    test_cond("spectrum: drawn on PNG", rc == 0);
    test_cond("spectrum: log y axis, x over the indices 1..n", res.ylog && res.x0 == 1 && res.x1 == NSV);
    test_cond("spectrum: the rank cut marker is at the painter's mapping of r",
              res.n_markers == 1 && fabs(res.marker_x[0] - paint_map_x(&res, RANK)) < 1e-9);
    int marked = 0;
    for (double y = res.area.y; y < res.area.y + res.area.h; y++)
        marked += pixel(p, res.marker_x[0], y) == palette_cat(3);
    test_cond("spectrum: the rank cut's dashed line is drawn in its colour", marked > res.area.h * 0.25);
    canvas_color ax = pixel(p, res.area.x + res.area.w / 2, res.axis_y);
    test_cond("spectrum: the x axis line is drawn", ax != CANVAS_NONE && canvas_luma(ax) < 0.2);
    double y1 = paint_map_y(&res, 100.0 * pow(2, -2.0));   /* layer 1's σ_2 */
    int on_line = 0;
    for (double dy = -2; dy <= 2; dy++) on_line |= pixel(p, paint_map_x(&res, 2), y1 + dy) != CANVAS_RGB(0xff, 0xff, 0xff);
    test_cond("spectrum: the cursor layer's line passes through its σ_2", on_line);

    canvas *c = cells(80, 24, 0);
    draw(v, c, st, &cur, &res);
    char *t = text_of(c);
    test_cond("spectrum: cells show the layer, the rank cut and the energy kept",
              t && strstr(t, "layer 1") && strstr(t, "r=5") && strstr(t, "energy"));
    free(t);

    /* move and click */
    cur.layer = 0;
    test_cond("spectrum: down goes to the next layer", v->move(&cur, st, 0, 1) == (VIEW_HANDLED | VIEW_REDRAW) && cur.layer == 1);
    test_cond("spectrum: right goes to the next layer", v->move(&cur, st, 1, 0) == (VIEW_HANDLED | VIEW_REDRAW) && cur.layer == 2);
    test_cond("spectrum: past the last layer nothing changes", v->move(&cur, st, 0, 1) == VIEW_HANDLED && cur.layer == 2);
    cur.layer = 0;
    draw(v, p, st, &cur, &res);
    double cx = paint_map_x(&res, 2), cy = paint_map_y(&res, 100.0 * pow(2, -3.0)); /* layer 2's σ_2 */
    test_cond("spectrum: a click on another layer's line selects it",
              v->click(&cur, st, &res, cx, cy) == (VIEW_HANDLED | VIEW_REDRAW) && cur.layer == 2);
    test_cond("spectrum: a click outside the plot does nothing", v->click(&cur, st, &res, 1, 1) == 0 && cur.layer == 2);
    canvas_free(c);
    canvas_free(p);
}

static void test_chunkmap(const probe_store *st) {
    const view_class *v = view_find("chunkmap");
    view_cursor cur;
    view_cursor_init(&cur);
    canvas *c = cells(80, 24, 0);
    paint_result res;
    test_cond("chunkmap: drawn", draw(v, c, st, &cur, &res) == 0);
    char *t = text_of(c);
    test_cond("chunkmap: lanes for outliers, local window, selection and needle",
              t && strstr(t, "outlier") && strstr(t, "local") && strstr(t, "sel@5") && strstr(t, "needle"));
    free(t);
    test_cond("chunkmap: the strip spans the chunks, centred on their ids", res.x0 == -0.5 && res.x1 == NCH - 0.5 && res.area.w > 0);
    test_cond("chunkmap: a click picks the chunk under it",
              v->click(&cur, st, &res, paint_map_x(&res, 7), res.area.y) == (VIEW_HANDLED | VIEW_REDRAW) && cur.chunk == 7);
    test_cond("chunkmap: right moves the chunk", v->move(&cur, st, 1, 0) == (VIEW_HANDLED | VIEW_REDRAW) && cur.chunk == 8);
    test_cond("chunkmap: up goes a step back from the latest",
              v->move(&cur, st, 0, -1) == (VIEW_HANDLED | VIEW_REDRAW) && cur.step == STEPS - 2);
    test_cond("chunkmap: down past the last step follows the latest",
              v->move(&cur, st, 0, 1) && v->move(&cur, st, 0, 1) && cur.step == -1);
    cur.chunk = 11;
    cur.layer = 1;
    cur.step = 3;
    draw(v, c, st, &cur, &res);
    t = text_of(c);
    test_cond("chunkmap: the last line describes the cursor's chunk", t && strstr(t, "chunk 11") && strstr(t, "sel"));
    free(t);
    canvas *p = png(1200, 700, 1);
    test_cond("chunkmap: PNG with the cos-min panel", p && draw(v, p, st, &cur, &res) == 0 && res.colorbar.w > 0);
    canvas_free(p);
    canvas_free(c);
}

static void test_selection(const probe_store *st) {
    const view_class *v = view_find("selection");
    view_cursor cur;
    view_cursor_init(&cur);
    cur.layer = 1;
    cur.head = 1;
    cur.step = 3;
    canvas *p = png(1200, 700, 1);
    paint_result res;
    test_cond("selection: drawn on PNG", p && draw(v, p, st, &cur, &res) == 0);
    test_cond("selection: all chunks and steps fit a 1200 px figure, cells centred on their ids",
              res.x0 == -0.5 && res.x1 == NCH - 0.5 && res.y0 == -0.5 && res.y1 == STEPS - 0.5);
#define AT(chunk, step) pixel(p, paint_map_x(&res, chunk), paint_map_y(&res, step))
    test_cond("selection: a chunk kept from the last step is a hit", AT(11, 3) == palette_cat(0));
    test_cond("selection: a newly selected chunk is a miss", AT(33, 3) == palette_cat(1));
    test_cond("selection: at step 0 everything selected is a miss", AT(11, 0) == palette_cat(1));
    test_cond("selection: a chunk selected again after a step is a hit", AT(41, 3) == palette_cat(0) && AT(41, 2) == palette_cat(1));
    test_cond("selection: outliers have their own colour", AT(2, 3) == palette_cat(5) && AT(50, 0) == palette_cat(5));
    test_cond("selection: the local window is grey", AT(LOCAL_START + 1, 3) == CANVAS_RGB(0xd0, 0xd0, 0xd0));
    test_cond("selection: unselected chunks are background", AT(70, 3) == CANVAS_RGB(0xff, 0xff, 0xff));
#undef AT
    /* a terminal: more chunks than columns, so a window that follows the cursor's chunk */
    canvas *c = cells(80, 24, 0);
    cur.chunk = 100;
    test_cond("selection: drawn in 80x24", draw(v, c, st, &cur, &res) == 0);
    test_cond("selection: a window of chunks holding the cursor's chunk",
              res.x1 - res.x0 < NCH && res.x0 <= 100 && 100 < res.x1 && isfinite(res.marker_x[0]));
    double x = paint_map_x(&res, 95), y = paint_map_y(&res, 1);
    test_cond("selection: a click picks chunk and step", v->click(&cur, st, &res, x, y) == (VIEW_HANDLED | VIEW_REDRAW) &&
                                                            cur.chunk == 95 && cur.step == 1);
    test_cond("selection: left moves the chunk", v->move(&cur, st, -1, 0) == (VIEW_HANDLED | VIEW_REDRAW) && cur.chunk == 94);
    test_cond("selection: down moves the step", v->move(&cur, st, 0, 1) == (VIEW_HANDLED | VIEW_REDRAW) && cur.step == 2);
    cur.chunk = 33;
    cur.step = 3;
    draw(v, c, st, &cur, &res);
    char *t = text_of(c);
    test_cond("selection: the last line tells the cursor chunk's fate", t && strstr(t, "chunk 33 at step 3") && strstr(t, "miss"));
    free(t);
    cur.chunk = -1;
    draw(v, c, st, &cur, &res);
    t = text_of(c);
    test_cond("selection: without a chunk, the step's counts", t && strstr(t, "step 3: 4 selected, 3 hits, 1 misses"));
    free(t);
    canvas_free(c);
    canvas_free(p);
}

static void test_cache(const probe_store *st) {
    const view_class *v = view_find("cache");
    view_cursor cur;
    view_cursor_init(&cur);
    canvas *p = png(1200, 700, 1);
    paint_result res;
    test_cond("cache: drawn", p && draw(v, p, st, &cur, &res) == 0);
    test_cond("cache: y is 0..100 %, x the steps", res.y0 == 0 && res.y1 == 100 && res.x0 == 0 && res.x1 == STEPS - 1);
    test_cond("cache: the current step is marked", res.n_markers == 1 && fabs(res.marker_x[0] - paint_map_x(&res, STEPS - 1)) < 1e-9);
    double x = paint_map_x(&res, 3), y = paint_map_y(&res, 100.0 * hits_of(3, 2) / K);
    test_cond("cache: a click near layer 2's point picks step and layer",
              v->click(&cur, st, &res, x, y) == (VIEW_HANDLED | VIEW_REDRAW) && cur.step == 3 && cur.layer == 2);
    test_cond("cache: left goes a step back", v->move(&cur, st, -1, 0) == (VIEW_HANDLED | VIEW_REDRAW) && cur.step == 2);
    test_cond("cache: up goes a layer back", v->move(&cur, st, 0, -1) == (VIEW_HANDLED | VIEW_REDRAW) && cur.layer == 1);
    canvas *c = cells(80, 24, 0);
    draw(v, c, st, &cur, &res);
    char *t = text_of(c);
    test_cond("cache: the title gives the step's mean and layer", t && strstr(t, "step 2") && strstr(t, "layer 1"));
    free(t);
    canvas_free(c);
    canvas_free(p);
}

static void test_timeline(const probe_store *st) {
    const view_class *v = view_find("timeline");
    view_cursor cur;
    view_cursor_init(&cur);
    cur.step = 2;
    canvas *p = png(1200, 700, 1);
    paint_result res;
    test_cond("timeline: drawn", p && draw(v, p, st, &cur, &res) == 0);
    test_cond("timeline: three stream rows, time from 0 ms", res.shown == 3 && res.x0 == 0 && res.x1 >= 2 * 12 + 10 - 1e-6);
    /* layer 1's fetch starts 12 + 3 ms after the step's first span */
    double x = paint_map_x(&res, 12 + 4), y = res.area.y + 1.5 * res.area.h / res.shown;
    canvas_color col = pixel(p, x, y);
    test_cond("timeline: the fetch bar is drawn in fetch_v's colour", col == palette_cat(3));
    test_cond("timeline: a click on a bar selects its layer", v->click(&cur, st, &res, x, y) == (VIEW_HANDLED | VIEW_REDRAW) && cur.layer == 1);
    /* nested: select (inside attention) stays visible on top of it */
    col = pixel(p, paint_map_x(&res, 2), res.area.y + 0.5 * res.area.h / res.shown);
    test_cond("timeline: nested spans are drawn over their parent", col == palette_cat(1));
    test_cond("timeline: right from step 2 goes to step 3", v->move(&cur, st, 1, 0) == (VIEW_HANDLED | VIEW_REDRAW) && cur.step == 3);
    canvas *c = cells(80, 24, 0);
    draw(v, c, st, &cur, &res);
    char *t = text_of(c);
    test_cond("timeline: rows, legend and the totals table in a terminal",
              t && strstr(t, "compute") && strstr(t, "fetch") && strstr(t, "rebuild") && strstr(t, "sparse_attn") &&
                  strstr(t, "total ms"));
    free(t);
    /* a wide fetch bar says the rate it achieved: H KV heads x 1 MB in 2 ms */
    canvas *w = cells(400, 24, 0);
    draw(v, w, st, &cur, &res);
    t = text_of(w);
    char want[32];
    snprintf(want, sizeof want, "%.3g GB/s", H * 1e6 / 0.002 / 1e9);
    test_cond("timeline: a fetch bar wide enough names its GB/s (layer bytes over its time)", t && strstr(t, want));
    free(t);
    canvas_free(w);
    /* prefill is shown when there are no decode steps */
    probe_store *pre;
    probe_store_new(&pre);
    add(pre, (probe_event){ .kind = PROBE_SPAN, .span = { PROBE_STREAM_COMPUTE, 0, -1, 1, 1.5, "svd" } });
    view_cursor_init(&cur);
    test_cond("timeline: the prefill when there is no decode step", draw(v, c, pre, &cur, &res) == 0 &&
                                                                        (t = text_of(c)) && strstr(t, "prefill"));
    free(t);
    probe_store_free(pre);
    canvas_free(c);
    canvas_free(p);
}

static void test_tokens(const probe_store *st) {
    const view_class *v = view_find("tokens");
    view_cursor cur;
    view_cursor_init(&cur);
    canvas *c = cells(80, 24, 0);
    paint_result res;
    test_cond("tokens: drawn", draw(v, c, st, &cur, &res) == 0);
    char *t = text_of(c);
    test_cond("tokens: prompt and generated text, counts and agreement",
              t && strstr(t, "Once upon a time") && strstr(t, "GEN5") && strstr(t, "10 prompt + 6 generated") &&
                  strstr(t, "5/6"));
    test_cond("tokens: control bytes and bad UTF-8 are shown safely", t && strstr(t, "ctrl\xc2\xb7") && strstr(t, "bad\xef\xbf\xbd"));
    free(t);
    int row = 2, col; /* below the title and legend */
    const canvas_cell *grid;
    int cols, rows;
    if (find_text(c, "GEN5", &row, &col) && (grid = canvas_cells_grid(c, &cols, &rows))) {
        test_cond("tokens: the current step's token is highlighted", grid[row * cols + col].bg != CANVAS_DEFAULT &&
                                                                         grid[row * cols + col - 1].bg != CANVAS_DEFAULT);
    } else {
        test_cond("tokens: GEN5 found", 0);
    }
    row = 2;
    if (find_text(c, "GEN3", &row, &col))
        test_cond("tokens: a click on a generated token makes its step current",
                  v->click(&cur, st, &res, col + 1.5, row + 0.5) == (VIEW_HANDLED | VIEW_REDRAW) && cur.step == 3);
    else
        test_cond("tokens: GEN3 found", 0);
    row = 2;
    if (find_text(c, "upon", &row, &col))
        test_cond("tokens: a click on a prompt token selects it",
                  v->click(&cur, st, &res, col + 0.5, row + 0.5) == (VIEW_HANDLED | VIEW_REDRAW) && cur.token == 2);
    else
        test_cond("tokens: 'upon' found", 0);
    test_cond("tokens: right goes to the next step", v->move(&cur, st, 1, 0) == (VIEW_HANDLED | VIEW_REDRAW) && cur.step == 4 &&
                                                         cur.token == -1);
    test_cond("tokens: up scrolls back", v->move(&cur, st, 0, -1) == (VIEW_HANDLED | VIEW_REDRAW) && cur.scroll == 1);
    test_cond("tokens: down scrolls forward, not past 0",
              v->move(&cur, st, 0, 1) == (VIEW_HANDLED | VIEW_REDRAW) && v->move(&cur, st, 0, 1) == VIEW_HANDLED && cur.scroll == 0);
    canvas_free(c);
}

/* The needle view's click on a cell of the rank grid: it picks the cell's
 * layer, KV head and needle chunk (a click on a cause of the verdict:
 * test_needle, whose planted runs have causes). */
static void test_needle_click(const probe_store *st) {
    const view_class *v = view_find("needle");
    view_cursor cur;
    view_cursor_init(&cur);
    canvas *p = png(1200, 700, 1);
    paint_result res;
    int rc = p ? draw(v, p, st, &cur, &res) : -1;
    test_cond("needle: drawn, with its grid's area", rc == 0 && res.area.w > 0 && res.area.h > 0);
    if (rc) { canvas_free(p); return; }
    const int nx = H * 2; /* KV heads x the needle's 2 chunks (60, 61) */
    double x = res.area.x + (1 * 2 + 1 + 0.5) * res.area.w / nx, y = res.area.y + (2 + 0.5) * res.area.h / L;
    test_cond("needle: a click on a grid cell picks its layer, KV head and needle chunk (layer 2, head 1, chunk 61)",
              v->click(&cur, st, &res, x, y) == (VIEW_HANDLED | VIEW_REDRAW) && cur.layer == 2 && cur.head == 1 &&
                  cur.chunk == 61);
    test_cond("needle: the same cell again changes nothing, and says so",
              v->click(&cur, st, &res, x, y) == VIEW_HANDLED);
    test_cond("needle: a click on neither the grid nor the verdict does nothing",
              v->click(&cur, st, &res, res.area.x + res.area.w + 50, res.area.y - 50) == 0 && cur.layer == 2);
    canvas_free(p);
}

int main(void) {
    test_table();
    probe_store *st;
    test_cond("store created", probe_store_new(&st) == 0);
    test_cond("synthetic run accepted by the store", fill_store(st) == 0);
    test_all_sizes(st);
    test_missing();
    test_spectrum(st);
    test_chunkmap(st);
    test_selection(st);
    test_cache(st);
    test_timeline(st);
    test_tokens(st);
    test_needle_click(st);
    probe_store_free(st);
    return test_report("test_views");
}
