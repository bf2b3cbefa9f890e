/* view_chunkmap.c: the prompt as ShadowKV sees it, one cell per chunk.
 *
 * For the cursor's (layer, KV head) it draws a strip over the whole prompt,
 * each chunk coloured by its cosine minimum (the lowest cosine between the
 * chunk's landmark and any of its keys: low means the landmark summarises
 * the chunk badly). Lanes above the strip mark the outlier chunks (kept
 * dense), the dense local window, the chunks selected at the current step,
 * the needle's chunks when the run tracked one, and the cursor's chunk.
 * When the rectangle is tall enough a second panel plots the same cos-min
 * values as a line, with the x axis aligned to the strip. The last line
 * describes the cursor's chunk (tokens, cos-min, outlier, selected with its
 * score and, with --oracle, its landmark and exact-attention ranks).
 *
 * Chunk c is the cell centred on data x = c, so tick labels name cells.
 *
 * Keys: ←/→ move the cursor's chunk; ↑/↓ go to the previous/next decode
 * step (down from the last step follows the latest). A click anywhere in a
 * chunk's column selects that chunk. */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }



/* Lanes of the strip, in drawing order (top to bottom). */
enum { LANE_OUTLIER, LANE_LOCAL, LANE_SELECTED, LANE_NEEDLE, LANE_CURSOR, LANE_N };

static int is_outlier(const probe_ev_prefill_head *ph, int chunk) {
    for (int i = 0; i < ph->n_outliers; i++)
        if (ph->outliers[i] == chunk) return 1;
    return 0;
}

/* The one-line description under the figure: the cursor's chunk, or a
 * summary of the strip when no chunk is selected. */
static void describe(char *buf, size_t n, const probe_ev_prefill_head *ph, const probe_ev_decode_head *d, int step,
                     int chunk, int ascii) {
    const char *dash = ascii ? "-" : "\xe2\x80\x93";
    size_t k = 0;
#define ADD(...) do { if (k < n) k += (size_t)snprintf(buf + k, n - k, __VA_ARGS__); } while (0)
    if (chunk >= 0 && chunk < ph->n_chunks) {
        ADD("chunk %d: tokens %d%s%d, cos-min %.3f", chunk, chunk * ph->chunk, dash, (chunk + 1) * ph->chunk - 1,
            ph->cos_min[chunk]);
        if (is_outlier(ph, chunk)) ADD("; outlier (dense)");
        else if (chunk >= ph->local_start) ADD("; local window (dense)");
        else if (d) {
            int at = -1;
            for (int i = 0; i < d->n_sel; i++)
                if (d->sel[i] == chunk) at = i;
            if (at >= 0) ADD("; selected at step %d, score %.3g", step, d->score[at]);
            else ADD("; not selected at step %d", step);
        }
        if (d && d->has_oracle && chunk < d->n_chunks && d->rank_landmark && d->rank_exact)
            ADD("; rank %d by landmark, %d by exact attention", d->rank_landmark[chunk], d->rank_exact[chunk]);
    } else {
        double lo = INFINITY, hi = -INFINITY, sum = 0;
        int cnt = 0;
        for (int i = 0; i < ph->n_chunks; i++)
            if (isfinite(ph->cos_min[i])) {
                lo = fmin(lo, ph->cos_min[i]);
                hi = fmax(hi, ph->cos_min[i]);
                sum += ph->cos_min[i];
                cnt++;
            }
        ADD("%d chunks of %d tokens, %d outlier%s, local window from chunk %d", ph->n_chunks, ph->chunk, ph->n_outliers,
            ph->n_outliers == 1 ? "" : "s", ph->local_start);
        if (cnt) ADD("; cos-min %.2f%s%.2f, mean %.2f", lo, dash, hi, sum / cnt);
        if (d) ADD("; step %d: %d selected, %d cache hits", step, d->n_sel, d->hits);
    }
#undef ADD
}

/* Redraws two panels drawn one above the other so that their data areas
 * share the same left and right edges: each panel's margins do not depend
 * on its width, so moving its rectangle's edges by the difference lines
 * the areas up. draw_a/draw_b paint into a rectangle and report the area. */
typedef int (*panel_fn)(canvas *c, canvas_rect r, const void *data, paint_result *res);

static int draw_aligned(canvas *c, canvas_rect ra, canvas_rect rb, panel_fn fa, const void *da, panel_fn fb,
                        const void *db, paint_result *res_a, paint_result *res_b) {
    int rc = fa(c, ra, da, res_a);
    if (!rc) rc = fb(c, rb, db, res_b);
    if (rc || res_a->area.w <= 0 || res_b->area.w <= 0) return rc;
    double l = fmax(res_a->area.x, res_b->area.x), rr = fmin(res_a->area.x + res_a->area.w, res_b->area.x + res_b->area.w);
    if (rr - l < 1) return rc;
    canvas_color bg = canvas_get_theme(c)->bg;
    canvas_fill_rect(c, ra.x, ra.y, ra.w, ra.h, bg);
    canvas_fill_rect(c, rb.x, rb.y, rb.w, rb.h, bg);
    canvas_rect na = ra, nb = rb;
    na.x += l - res_a->area.x;
    na.w -= (l - res_a->area.x) + (res_a->area.x + res_a->area.w - rr);
    nb.x += l - res_b->area.x;
    nb.w -= (l - res_b->area.x) + (res_b->area.x + res_b->area.w - rr);
    rc = fa(c, na, da, res_a);
    if (!rc) rc = fb(c, nb, db, res_b);
    return rc;
}

static int strip_panel(canvas *c, canvas_rect r, const void *data, paint_result *res) {
    return paint_draw_strip(c, r, data, res);
}

static int plot_panel(canvas *c, canvas_rect r, const void *data, paint_result *res) {
    return paint_draw_plot(c, r, data, res);
}

static int chunkmap_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    const canvas_theme *th = canvas_get_theme(c);
    int nl = probe_store_n_layers(st), nh = probe_store_n_kv_heads(st);
    int layer = clampi(cur->layer, 0, nl > 0 ? nl - 1 : 0), head = clampi(cur->head, 0, nh > 0 ? nh - 1 : 0);
    const probe_ev_prefill_head *ph = probe_store_prefill_head(st, layer, head);
    if (!ph || ph->n_chunks <= 0 || !ph->cos_min) {
        char msg[160];
        view_no_data(st, PROBE_PREFILL_HEAD, "chunk data", msg, sizeof msg);
        return view_message(c, r, "Chunk map", msg, res);
    }
    int n = ph->n_chunks, step = view_step(st, cur);
    const probe_ev_decode_head *d = step >= 0 ? probe_store_decode(st, step, layer, head) : NULL;
    int chunk = cur->chunk >= 0 && cur->chunk < n ? cur->chunk : -1;

    /* lanes: only those that have something to say */
    paint_category cats[LANE_N];
    int lane_of[LANE_N], nc = 0, n_needles = probe_store_n_needles(st);
    char sel_name[48];
    snprintf(sel_name, sizeof sel_name, g->cells ? "sel@%d" : "selected at step %d", step);
    /* glyphs for a terminal without colour: each lane its own */
    const struct { const char *name; canvas_color col; int on; const char *glyph; } lanes[LANE_N] = {
        [LANE_OUTLIER] = { "outlier", palette_cat(3), 1, "o" },
        [LANE_LOCAL] = { g->cells ? "local" : "local window", CANVAS_RGB(0x8c, 0x8c, 0x8c), 1, "-" },
        [LANE_SELECTED] = { sel_name, g->cells ? palette_cat(4) : palette_cat(0), d != NULL, "#" },
        [LANE_NEEDLE] = { "needle", palette_cat(1), n_needles > 0, "N" },
        [LANE_CURSOR] = { "cursor", g->cells ? th->highlight : palette_cat(6), chunk >= 0 && !cur->clean, "^" },
    };
    for (int k = 0; k < LANE_N; k++) {
        lane_of[k] = lanes[k].on ? nc : -1;
        if (lanes[k].on) cats[nc++] = (paint_category){ lanes[k].name, lanes[k].col, lanes[k].glyph };
    }
    int cap = ph->n_outliers + 1 + (d ? d->n_sel : 0) + 1;
    for (int id = 0; id < n_needles; id++) {
        const probe_ev_needle *nd = probe_store_needle_info(st, id);
        if (nd) cap += nd->n_chunks;
    }
    paint_span *spans = malloc((size_t)cap * sizeof *spans);
    float *v = malloc((size_t)n * sizeof *v);
    double *px = malloc((size_t)n * sizeof *px), *py = malloc((size_t)n * sizeof *py);
    paint_band *bands = malloc((size_t)(ph->n_outliers + 1) * sizeof *bands);
    int rc = SKV_OK;
    if (!spans || !v || !px || !py || !bands) { rc = skv_error(SKV_ENOMEM, "chunkmap view: out of memory"); goto done; }
    int ns = 0;
    for (int i = 0; i < ph->n_outliers; i++)
        spans[ns++] = (paint_span){ ph->outliers[i] - 0.5, ph->outliers[i] + 0.5, lane_of[LANE_OUTLIER] };
    if (ph->local_start < n) spans[ns++] = (paint_span){ ph->local_start - 0.5, n - 0.5, lane_of[LANE_LOCAL] };
    for (int i = 0; d && i < d->n_sel; i++)
        spans[ns++] = (paint_span){ d->sel[i] - 0.5, d->sel[i] + 0.5, lane_of[LANE_SELECTED] };
    for (int id = 0; id < n_needles; id++) {
        const probe_ev_needle *nd = probe_store_needle_info(st, id);
        for (int i = 0; nd && i < nd->n_chunks; i++)
            spans[ns++] = (paint_span){ nd->chunks[i] - 0.5, nd->chunks[i] + 0.5, lane_of[LANE_NEEDLE] };
    }
    if (chunk >= 0) spans[ns++] = (paint_span){ chunk - 0.5, chunk + 0.5, lane_of[LANE_CURSOR] };
    for (int i = 0; i < n; i++) {
        v[i] = ph->cos_min[i];
        px[i] = i;
        py[i] = ph->cos_min[i];
    }

    char title[200], xlabel[64], info[400], when[32] = "prefill";
    if (step >= 0) snprintf(when, sizeof when, "step %d", step);
    if (g->cells)
        snprintf(title, sizeof title, "Chunk map L%d H%d %s: %d chunks, %d outlier%s", layer, head, when, n,
                 ph->n_outliers, ph->n_outliers == 1 ? "" : "s");
    else if (step >= 0)
        snprintf(title, sizeof title, "Chunk map: layer %d, KV head %d, step %d (%d chunks, %d outlier%s, %d selected)",
                 layer, head, step, n, ph->n_outliers, ph->n_outliers == 1 ? "" : "s", d ? d->n_sel : 0);
    else
        snprintf(title, sizeof title, "Chunk map: layer %d, KV head %d (%d chunks, %d outlier%s)", layer, head, n,
                 ph->n_outliers, ph->n_outliers == 1 ? "" : "s");
    snprintf(xlabel, sizeof xlabel, "chunk (%d tokens each)", ph->chunk);
    describe(info, sizeof info, ph, d, step, chunk, g->ascii);
    view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    /* the line under the figure: a terminal cuts it, a figure wraps it (up to three lines) */
    char info_l[3][VIEW_LINE_MAX];
    int n_info = view_note_lines(c, g->cells, r.w, g->pad, info, info_l, 3);
    paint_strip sp = {
        .title = title, .v = v, .n = n,
        .x = { .label = xlabel, .min = -0.5, .max = n - 0.5 },
        .value = { .label = "cos-min" },
        .cats = cats, .n_cats = nc, .spans = spans, .n_spans = ns,
    };

    /* layout: strip panel, optional plot panel, one info line at the bottom */
    double lh = canvas_line_height(c, CANVAS_FONT_BODY), info_h = g->cells ? 1 : ceil(n_info * lh + 2 * g->pad);
    canvas_rect body = { r.x, r.y, r.w, fmax(0, r.h - info_h) };
    double strip_h = g->cells ? nc + 7 : round(body.h * 0.5);
    int two = g->cells ? body.h - strip_h >= 8 : body.h - strip_h >= 12 * g->em;
    paint_result local_a, local_b, *ra = res ? res : &local_a;
    if (two) {
        int nb = 0;
        for (int i = 0; i < ph->n_outliers; i++)
            bands[nb++] = (paint_band){ ph->outliers[i] - 0.5, ph->outliers[i] + 0.5, i ? NULL : "outlier",
                                        g->cells ? CANVAS_RGB(0x6a, 0x2a, 0x10) : CANVAS_RGB(0xf6, 0xcf, 0xb3) };
        if (ph->local_start < n) bands[nb++] = (paint_band){ ph->local_start - 0.5, n - 0.5, "local window", PAINT_AUTO };
        paint_series ser = { .name = NULL, .x = px, .y = py, .n = n, .color = g->cells ? palette_cat(4) : palette_cat(0) };
        char mlabel[32];
        snprintf(mlabel, sizeof mlabel, "chunk %d", chunk);
        paint_marker mk = { .x = chunk, .label = mlabel, .color = PAINT_AUTO };
        paint_plot pp = {
            .title = g->cells ? NULL : "Cos-min per chunk (landmark vs. its keys)",
            .x = { .label = xlabel, .min = -0.5, .max = n - 0.5 },
            .y = { .label = "cos-min" },
            .series = &ser, .n_series = 1,
            .markers = &mk, .n_markers = chunk >= 0 ? 1 : 0,
            .bands = bands, .n_bands = nb,
        };
        canvas_rect rs = { body.x, body.y, body.w, strip_h };
        canvas_rect rp = { body.x, body.y + strip_h, body.w, body.h - strip_h };
        rc = draw_aligned(c, rs, rp, strip_panel, &sp, plot_panel, &pp, ra, &local_b);
    } else {
        rc = paint_draw_strip(c, body, &sp, ra);
    }
    if (rc) goto done;
    canvas_rect old = canvas_clip(c, r);
    for (int i = 0; i < n_info; i++)
        canvas_text(c, r.x + (g->cells ? 0 : g->pad), g->cells ? r.y + r.h - 1 : r.y + r.h - info_h + g->pad + i * lh,
                    info_l[i], CANVAS_FONT_BODY, CANVAS_LEFT | CANVAS_TOP, th->fg);
    canvas_clip(c, old);
done:
    free(spans);
    free(v);
    free(px);
    free(py);
    free(bands);
    return rc;
}

static int chunkmap_move(view_cursor *cur, const probe_store *st, int dx, int dy) {
    if (dy) return view_move_step(cur, st, dy);
    if (!dx) return 0;
    const probe_ev_prefill_head *ph = probe_store_prefill_head(st, cur->layer, cur->head);
    if (!ph || ph->n_chunks <= 0) return 0;
    int c = cur->chunk < 0 ? (dx > 0 ? 0 : ph->n_chunks - 1) : clampi(cur->chunk + dx, 0, ph->n_chunks - 1);
    if (c == cur->chunk) return VIEW_HANDLED;
    cur->chunk = c;
    return VIEW_HANDLED | VIEW_REDRAW;
}

static int chunkmap_click(view_cursor *cur, const probe_store *st, const paint_result *res, double x, double y) {
    (void)y;
    const canvas_rect *a = &res->area;
    const probe_ev_prefill_head *ph = probe_store_prefill_head(st, cur->layer, cur->head);
    if (!ph || a->w <= 0 || x < a->x || x >= a->x + a->w) return 0;
    int c = (int)floor(res->x0 + (x - a->x) / a->w * (res->x1 - res->x0) + 0.5);
    if (c < 0 || c >= ph->n_chunks) return 0;
    if (c == cur->chunk) return VIEW_HANDLED;
    cur->chunk = c;
    return VIEW_HANDLED | VIEW_REDRAW;
}

const view_class view_chunkmap = {
    .name = "chunkmap",
    .title = "Chunks",
    .help = "cos-min strip over the prompt for one layer and KV head: outliers, local window, selected chunks, needle",
    .draw = chunkmap_draw,
    .move = chunkmap_move,
    .click = chunkmap_click,
    .needs = PROBE_PREFILL_HEAD,
    .prefill = 2,
};
