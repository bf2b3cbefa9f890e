/* view_selection.c: which chunks one KV head selected at every decode step.
 *
 * A raster with the prompt's chunks across and the decode steps down, for
 * the cursor's (layer, KV head). Each cell says what happened to the chunk
 * at that step: selected and found in the cache (a hit), selected and
 * fetched (a miss), not selected, or never a candidate because it stays
 * dense (an outlier, or part of the local window). The cache holds exactly
 * the previous step's selection (k slots for k chunks), so a selected chunk
 * is a hit when the same head also selected it one step earlier (a step
 * with no misses is all hits; a policy with no cache, as Quest, has
 * neither: its chunks are only "selected"). The
 * current step's row and the cursor's chunk column are outlined; the last
 * line gives the counts of the current step (or the cursor chunk's story).
 *
 * Chunk c and step s are the cells centred on data x = c and y = s, so
 * the tick labels sit on the cells they name.
 *
 * When more chunks than columns fit (a terminal, or a very long prompt) the
 * raster shows a window of chunks starting at cursor.scroll, moved so that
 * the cursor's chunk stays inside; when more steps than rows fit it shows
 * the steps up to the current one. A terminal gives every step the same
 * whole number of rows, the last one drawn in half blocks over a gap, so
 * that each step reads as its own line even without colour.
 *
 * Keys: ←/→ move the cursor's chunk (the window follows); ↑/↓ go to the
 * previous/next decode step. A click selects the chunk and step under it. */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }



/* Cell categories; where cells share a pixel the highest wins. */
enum { CAT_NONE, CAT_LOCAL, CAT_OUTLIER, CAT_SEL, CAT_HIT, CAT_MISS, CAT_N, CAT_EMPTY = 255 };

/* 1 when the policy keeps a cache of selected chunks (ShadowKV): some step
 * of (layer, head) counted hits or misses. Quest, say, selects without one:
 * its selections are neither. */
static int has_cache(const probe_store *st, int layer, int head) {
    for (int s = 0; s < probe_store_n_steps(st); s++) {
        const probe_ev_decode_head *d = probe_store_decode(st, s, layer, head);
        if (d && d->hits + d->misses > 0) return 1;
    }
    return 0;
}

/* Chunks of the prompt for (layer, head): from the prefill event, else the
 * largest selected id + 1 over all steps. */
static int chunk_count(const probe_store *st, int layer, int head) {
    const probe_ev_prefill_head *ph = probe_store_prefill_head(st, layer, head);
    if (ph && ph->n_chunks > 0) return ph->n_chunks;
    int n = 0;
    for (int s = 0; s < probe_store_n_steps(st); s++) {
        const probe_ev_decode_head *d = probe_store_decode(st, s, layer, head);
        for (int i = 0; d && i < d->n_sel; i++)
            if (d->sel[i] + 1 > n) n = d->sel[i] + 1;
    }
    return n;
}

/* The category of every chunk at one step: (n) into out. Without a cache
 * (cached 0) a selected chunk is just selected; with one, a step that
 * fetched nothing (0 misses) has only hits, one that kept nothing only
 * misses. */
static void classify_step(const probe_store *st, int step, int layer, int head, const probe_ev_prefill_head *ph,
                          int n, int cached, uint8_t *out) {
    const probe_ev_decode_head *d = probe_store_decode(st, step, layer, head);
    if (!d) { memset(out, CAT_EMPTY, (size_t)n); return; }
    memset(out, CAT_NONE, (size_t)n);
    if (ph) {
        for (int c = ph->local_start; c < n; c++) out[c] = CAT_LOCAL;
        for (int i = 0; i < ph->n_outliers; i++)
            if (ph->outliers[i] >= 0 && ph->outliers[i] < n) out[ph->outliers[i]] = CAT_OUTLIER;
    }
    const probe_ev_decode_head *prev = step > 0 ? probe_store_decode(st, step - 1, layer, head) : NULL;
    for (int i = 0; i < d->n_sel; i++) {
        int c = d->sel[i];
        if (c < 0 || c >= n) continue;
        if (!cached) { out[c] = CAT_SEL; continue; }
        int hit = 0;
        if (d->hits >= d->n_sel || d->misses == 0) hit = 1;
        else if (d->hits > 0 && prev)
            for (int j = 0; j < prev->n_sel && !hit; j++) hit = prev->sel[j] == c;
        out[c] = hit ? CAT_HIT : CAT_MISS;
    }
}

/* The window of steps [*s0, *s0 + *ns) for rows that fit, ending at the
 * current step when not all fit. */
static void step_window(int n_steps, int step, int rows, int *s0, int *ns) {
    if (rows < 1) rows = 1;
    if (n_steps <= rows) { *s0 = 0; *ns = n_steps; return; }
    *ns = rows;
    *s0 = clampi(step - rows + 1, 0, n_steps - rows);
}

/* The window of chunks: starts at scroll, moved to hold the cursor's chunk. */
static void chunk_window(int n, int cols, int scroll, int chunk, int *c0, int *nc) {
    if (cols < 1) cols = 1;
    if (n <= cols) { *c0 = 0; *nc = n; return; }
    int s = clampi(scroll, 0, n - cols);
    if (chunk >= 0 && chunk < s) s = chunk;
    if (chunk >= s + cols) s = chunk - cols + 1;
    *c0 = clampi(s, 0, n - cols);
    *nc = cols;
}

static void describe(char *buf, size_t n, const probe_store *st, int step, int layer, int head, int chunk,
                     const uint8_t *cats_now, int n_chunks, int cells, int cached) {
    const probe_ev_decode_head *d = probe_store_decode(st, step, layer, head);
    const char *unit = probe_store_block_name(st);
    int lm = !strcmp(unit, "chunk"); /* ShadowKV scores its chunks by landmark */
    size_t k = 0;
#define ADD(...) do { if (k < n) k += (size_t)snprintf(buf + k, n - k, __VA_ARGS__); } while (0)
    if (!d) { ADD("step %d: no selection recorded for layer %d, KV head %d", step, layer, head); return; }
    if (chunk >= 0 && chunk < n_chunks) {
        static const char *what[CAT_N] = { "not selected", "local window (dense)", "outlier (dense)", "selected",
                                           "selected, cache hit", "selected, fetched (miss)" };
        int cat = cats_now[chunk];
        ADD("%s %d at step %d: %s", unit, chunk, step, cat < CAT_N ? what[cat] : "no data");
        for (int i = 0; i < d->n_sel; i++)
            if (d->sel[i] == chunk) ADD(cells || !lm ? ", score %.3g" : ", landmark score %.3g", d->score[i]);
        if (d->has_oracle && chunk < d->n_chunks && d->rank_landmark && d->rank_exact)
            ADD(cells ? (lm ? "; rank %d lm / %d exact" : "; rank %d score / %d exact")
                      : (lm ? "; rank %d by landmark, %d by exact attention" : "; rank %d by its score, %d by exact attention"),
                d->rank_landmark[chunk], d->rank_exact[chunk]);
        return;
    }
    if (cached)
        ADD("step %d: %d selected, %d hits, %d misses (this step's hit rate %.0f%%)", step, d->n_sel, d->hits,
            d->misses, d->n_sel ? 100.0 * d->hits / d->n_sel : 0.0);
    else ADD(cells ? "step %d: %d selected (no cache)" : "step %d: %d selected (the policy keeps no cache of its selection)",
             step, d->n_sel);
    if (d->has_oracle && cells) ADD("; sel. mass %.1f%%", 100 * d->recall);
    else if (d->has_oracle) ADD("; the selected %ss hold %.1f%% of the exact attention mass", unit, 100 * d->recall);
#undef ADD
}

static int selection_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    const canvas_theme *th = canvas_get_theme(c);
    int nl = probe_store_n_layers(st), nh = probe_store_n_kv_heads(st), n_steps = probe_store_n_steps(st);
    int layer = clampi(cur->layer, 0, nl > 0 ? nl - 1 : 0), head = clampi(cur->head, 0, nh > 0 ? nh - 1 : 0);
    int n = chunk_count(st, layer, head), any = 0;
    for (int s = 0; s < n_steps && !any; s++) any = probe_store_decode(st, s, layer, head) != NULL;
    if (!any || n <= 0) {
        char msg[160];
        view_no_data(st, PROBE_DECODE_HEAD, "chunk selections", msg, sizeof msg);
        return view_message(c, r, "Chunk selection", msg, res);
    }
    int step = view_step(st, cur);
    const probe_ev_prefill_head *ph = probe_store_prefill_head(st, layer, head);
    int chunk = cur->chunk >= 0 && cur->chunk < n ? cur->chunk : -1;

    uint8_t *now = malloc((size_t)n), *cat = NULL;
    if (!now) return skv_error(SKV_ENOMEM, "selection view: out of memory");
    int cached = has_cache(st, layer, head);
    classify_step(st, step, layer, head, ph, n, cached, now);

    /* k: the blocks selected a step; a policy that selects per query head (Quest) gives the KV head
     * their union, which varies: then the most */
    int k = 0, k_lo = -1, hits = 0, sel = 0;
    for (int s = 0; s < n_steps; s++) {
        const probe_ev_decode_head *d = probe_store_decode(st, s, layer, head);
        if (!d) continue;
        k = d->n_sel > k ? d->n_sel : k;
        k_lo = k_lo < 0 || d->n_sel < k_lo ? d->n_sel : k_lo;
        hits += d->hits;
        sel += d->n_sel;
    }
    const char *unit = probe_store_block_name(st);
    char title[200], info[300], kk[32], Unit[16], xl[64];
    snprintf(kk, sizeof kk, k_lo == k ? (g->cells ? "k=%d" : "k = %d") : "up to %d", k);
    snprintf(Unit, sizeof Unit, "%c%s", unit[0] - 'a' + 'A', unit + 1);
    if (!strcmp(unit, "token")) snprintf(xl, sizeof xl, "token (prompt position)");
    else snprintf(xl, sizeof xl, "%s (prompt position / %s size)", unit, unit);
    if (!cached) { /* no cache: no hit rate to give */
        if (g->cells)
            snprintf(title, sizeof title, "Selection L%d H%d: %s of %d %ss (no cache)", layer, head, kk, n, unit);
        else
            snprintf(title, sizeof title, "%ss selected by layer %d, KV head %d: %s of %d %ss (the policy keeps no cache "
                     "of its selection)", Unit, layer, head, kk, n, unit);
        if (!g->cells && canvas_text_width(c, title, CANVAS_FONT_TITLE) > r.w) /* the shorter wording */
            snprintf(title, sizeof title, "Layer %d, KV head %d: %s of %d %ss selected (no cache)", layer, head, kk, n,
                     unit);
    } else if (g->cells)
        snprintf(title, sizeof title, "Selection L%d H%d: %s of %d %ss, hits %.0f%% all steps", layer, head, kk, n, unit,
                 sel ? 100.0 * hits / sel : 0.0);
    else {
        snprintf(title, sizeof title, "%ss selected by layer %d, KV head %d: %s of %d %ss, cache hit rate %.1f%% over "
                 "all steps", Unit, layer, head, kk, n, unit, sel ? 100.0 * hits / sel : 0.0);
        if (canvas_text_width(c, title, CANVAS_FONT_TITLE) > r.w) /* a shorter wording before any cut */
            snprintf(title, sizeof title, "Layer %d, KV head %d: %s of %d %ss selected, hit rate %.1f%% (all steps)",
                     layer, head, kk, n, unit, sel ? 100.0 * hits / sel : 0.0);
    }
    describe(info, sizeof info, st, step, layer, head, chunk, now, n, g->cells, cached);
    view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    /* the line under the raster: a terminal cuts it, a figure wraps it (two lines at most) */
    char info_l[2][VIEW_LINE_MAX];
    int n_info = view_note_lines(c, g->cells, r.w, g->pad, info, info_l, 2);

    static const char *names[CAT_N] = { "not selected", "local window (dense)", "outlier (dense)", "selected",
                                        "selected, cache hit", "selected, fetched (miss)" };
    static const char *short_names[CAT_N] = { "not sel.", "local", "outlier", "selected", "hit", "miss" };
    paint_category cats[CAT_N] = {
        /* glyphs for a terminal without colour: one per category */
        [CAT_NONE] = { g->cells ? short_names[CAT_NONE] : names[CAT_NONE], CANVAS_NONE, " " },
        [CAT_LOCAL] = { g->cells ? short_names[CAT_LOCAL] : names[CAT_LOCAL],
                        g->cells ? CANVAS_RGB(0x5a, 0x5a, 0x5a) : CANVAS_RGB(0xd0, 0xd0, 0xd0), "-" },
        [CAT_OUTLIER] = { g->cells ? short_names[CAT_OUTLIER] : names[CAT_OUTLIER], palette_cat(5), "o" },
        [CAT_SEL] = { g->cells ? short_names[CAT_SEL] : names[CAT_SEL], g->cells ? palette_cat(4) : palette_cat(0), "*" },
        [CAT_HIT] = { g->cells ? short_names[CAT_HIT] : names[CAT_HIT], g->cells ? palette_cat(4) : palette_cat(0), "#" },
        [CAT_MISS] = { g->cells ? short_names[CAT_MISS] : names[CAT_MISS], palette_cat(1), "x" },
    };
    if (!ph) cats[CAT_LOCAL].name = cats[CAT_OUTLIER].name = NULL;
    if (cached) cats[CAT_SEL].name = NULL; /* the legend names what the figure can hold */
    else cats[CAT_HIT].name = cats[CAT_MISS].name = NULL;

    double lh = canvas_line_height(c, CANVAS_FONT_BODY), info_h = g->cells ? 1 : ceil(n_info * lh + 2 * g->pad);
    canvas_rect body = { r.x, r.y, r.w, fmax(0, r.h - info_h) };
    /* A terminal gives every step the same whole number of rows, with the
     * bottom half of its last row left empty: steps stretched over a row and
     * a half would fall on row boundaries, and a step that fills whole cells
     * shows only as a background colour, blank in a copy or a screen
     * capture; this way every step ends in a row of half blocks, a gap
     * below. The raster then has per = 2 x rows rows per step (half rows),
     * the last one empty. */
    int per = g->cells ? 2 : 1;
    /* first pass with everything, to learn how many columns and rows fit */
    int c0 = 0, nc = n, s0 = 0, nsw = n_steps, rc = SKV_OK;
    paint_result local, *pr = res ? res : &local;
    for (int pass = 0; pass < 2; pass++) {
        free(cat);
        cat = malloc((size_t)nc * (nsw > 0 ? nsw : 1) * per);
        if (!cat) { rc = skv_error(SKV_ENOMEM, "selection view: out of memory"); goto done; }
        uint8_t *row = malloc((size_t)n);
        if (!row) { rc = skv_error(SKV_ENOMEM, "selection view: out of memory"); goto done; }
        memset(cat, CAT_EMPTY, (size_t)nc * (nsw > 0 ? nsw : 1) * per);
        for (int j = 0; j < nsw; j++) {
            classify_step(st, s0 + j, layer, head, ph, n, cached, row);
            for (int q = 0; q < (per > 1 ? per - 1 : 1); q++)
                memcpy(cat + ((size_t)j * per + q) * nc, row + c0, (size_t)nc);
        }
        free(row);
        paint_raster ras = {
            .title = title, .cat = cat, .nx = nc, .ny = nsw * per, .cats = cats, .n_cats = CAT_N,
            .x = { .label = g->cells ? unit : xl,
                   .min = c0 - 0.5, .max = c0 + nc - 0.5, .integer = 1 },
            .y = { .label = "decode step", .min = s0 - 0.5, .max = s0 + nsw - 0.5, .integer = 1 },
            .highlight = cur->clean ? 0 : PAINT_HI_ROW | (chunk >= c0 && chunk < c0 + nc ? PAINT_HI_COL : 0),
            .hi_row = (step - s0) * per, .hi_col = chunk - c0,
        };
        if (pass == 1) canvas_fill_rect(c, r.x, r.y, r.w, r.h, th->bg);
        rc = paint_draw_raster(c, body, &ras, pr);
        if (rc) goto done;
        if (pass == 1) break;
        int cols = (int)floor(pr->area.w / g->fill_w + 1e-9);
        int rows = (int)floor(pr->area.h / (g->cells ? 1 : g->fill_h) + 1e-9);
        int nc2, c02, ns2, s02;
        chunk_window(n, cols, cur->scroll, chunk, &c02, &nc2);
        step_window(n_steps, step, rows, &s02, &ns2);
        /* a terminal: the area only as tall as the steps' rows, the rest of
         * the body left blank below the info line */
        int per2 = g->cells ? 2 * (ns2 > 0 && rows > ns2 ? rows / ns2 : 1) : 1;
        double spare = g->cells && rows > ns2 * per2 / 2 ? rows - ns2 * per2 / 2 : 0;
        if (nc2 == nc && ns2 == nsw && per2 == per && spare == 0) break;
        body.h -= spare;
        c0 = c02; nc = nc2; s0 = s02; nsw = ns2; per = per2;
        if (nc < n) { /* only part of the chunks fit: say which, and that it scrolls */
            const char *arrows = g->ascii ? "<- ->" : "\xe2\x86\x90/\xe2\x86\x92";
            if (g->cells)
                snprintf(title, sizeof title, "Selection L%d H%d: %s, %ss %d-%d of %d (%s scroll)", layer, head, kk, unit,
                         c0, c0 + nc - 1, n, arrows);
            else
                snprintf(title, sizeof title, "%ss selected by layer %d, KV head %d: %s; %ss %d-%d of %d shown", Unit,
                         layer, head, kk, unit, c0, c0 + nc - 1, n);
            view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
        }
    }
    canvas_rect old = canvas_clip(c, r);
    for (int i = 0; i < n_info; i++)
        canvas_text(c, r.x + (g->cells ? 0 : g->pad),
                    g->cells ? body.y + body.h : r.y + r.h - info_h / 2 + (i - (n_info - 1) / 2.0) * lh, info_l[i],
                    CANVAS_FONT_BODY, CANVAS_LEFT | (g->cells ? CANVAS_TOP : CANVAS_MIDDLE), th->fg);
    canvas_clip(c, old);
done:
    free(cat);
    free(now);
    return rc;
}

static int selection_move(view_cursor *cur, const probe_store *st, int dx, int dy) {
    if (dy) return view_move_step(cur, st, dy);
    if (!dx) return 0;
    int n = chunk_count(st, cur->layer, cur->head);
    if (n <= 0) return 0;
    int c = cur->chunk < 0 ? clampi(cur->scroll, 0, n - 1) : clampi(cur->chunk + dx, 0, n - 1);
    if (c == cur->chunk) return VIEW_HANDLED;
    cur->chunk = c;
    return VIEW_HANDLED | VIEW_REDRAW;
}

static int selection_click(view_cursor *cur, const probe_store *st, const paint_result *res, double x, double y) {
    const canvas_rect *a = &res->area;
    if (a->w <= 0 || a->h <= 0 || x < a->x || x >= a->x + a->w || y < a->y || y >= a->y + a->h) return 0;
    int c = (int)floor(res->x0 + (x - a->x) / a->w * (res->x1 - res->x0) + 0.5);
    int s = (int)floor(res->y0 + (y - a->y) / a->h * (res->y1 - res->y0) + 0.5);
    if (c < 0 || c >= chunk_count(st, cur->layer, cur->head) || s < 0 || s >= probe_store_n_steps(st)) return 0;
    if (c == cur->chunk && s == cur->step) return VIEW_HANDLED;
    cur->chunk = c;
    cur->step = s;
    return VIEW_HANDLED | VIEW_REDRAW;
}

const view_class view_selection = {
    .name = "selection",
    .title = "Selection",
    .help = "chunks x decode steps for one layer and KV head: selected (cache hit or fetched; a policy without a "
            "chunk cache, as Quest, only selected), dense, not selected. "
            "Hit rate in the title: over every step; in the line below: this step. \"rank N lm / M exact\": the chunk's "
            "rank by landmark score (what ShadowKV selects on) and by exact attention (the oracle's); \"sel. mass\": the "
            "share of the exact attention mass in the selected chunks (not the outliers or the local window; the "
            "Compare view's \"mass recall\" is another measure: the mass of all the attended tokens against the "
            "most that as many tokens could hold)",
    .draw = selection_draw,
    .move = selection_move,
    .click = selection_click,
    .needs = PROBE_DECODE_HEAD,
};
