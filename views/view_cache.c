/* view_cache.c: how often the chunk cache already held what was selected.
 *
 * ShadowKV keeps each step's selected chunks on the GPU, so the next step
 * fetches (and rebuilds) only the chunks that changed. This view plots the
 * hit rate (hits / k, averaged over the KV heads) of every layer over the
 * decode steps, with the mean over layers drawn bold on top and the current
 * step marked. The cursor's layer is drawn a little wider than the others.
 * Up to eight layers get categorical colours and a legend entry each; more
 * layers are shaded along a ramp (dark = first layer, light = last).
 *
 * Keys: ←/→ previous/next decode step (→ past the last follows the latest);
 * ↑/↓ previous/next layer. A click picks the step under it and, when the
 * click is near a layer's line, that layer. */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CACHE_CAT_LAYERS 8  /* layers with their own categorical colour */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }



/* Colour of a layer's line: categorical for few layers, a ramp for many.
 * On a terminal (dark background) dark colours are lightened, keeping
 * their hue, so thin braille lines stay visible. */
static canvas_color layer_color(int l, int nl, int cells) {
    canvas_color col = nl <= CACHE_CAT_LAYERS ? palette_cat(l) : palette_viridis(0.1 + 0.8 * l / (nl > 1 ? nl - 1 : 1));
    if (!cells || palette_lightness(col) >= 55) return col;
    int r = (col >> 16) & 255, gr = (col >> 8) & 255, b = col & 255;
    return CANVAS_RGB(r + (255 - r) * 45 / 100, gr + (255 - gr) * 45 / 100, b + (255 - b) * 45 / 100);
}

static int cache_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    const canvas_theme *th = canvas_get_theme(c);
    int nl = probe_store_n_layers(st), n = probe_store_n_steps(st);
    int layer = clampi(cur->layer, 0, nl > 0 ? nl - 1 : 0);
    double *ys = nl > 0 && n > 0 ? calloc((size_t)(nl + 1) * n, sizeof *ys) : NULL;
    double *xs = n > 0 ? malloc((size_t)n * sizeof *xs) : NULL;
    paint_series *ser = calloc((size_t)nl + 2, sizeof *ser);
    char (*names)[32] = calloc((size_t)nl + 2, sizeof *names);
    int rc = SKV_OK, any = 0;
    if (nl > 0 && n > 0 && (!ys || !xs || !ser || !names)) {
        rc = skv_error(SKV_ENOMEM, "cache view: out of memory");
        goto done;
    }
    double *mean = ys ? ys + (size_t)nl * n : NULL;
    for (int s = 0; ys && s < n; s++) {
        xs[s] = s;
        double sum = 0;
        int cnt = 0;
        for (int l = 0; l < nl; l++) {
            float h = probe_store_hit_rate(st, s, l);
            ys[(size_t)l * n + s] = isfinite(h) ? 100.0 * h : NAN;
            if (isfinite(h)) { sum += 100.0 * h; cnt++; any = 1; }
        }
        mean[s] = cnt ? sum / cnt : NAN;
    }
    if (!any) {
        char msg[200];
        const probe_ev_run *run = probe_store_run(st);
        if (probe_store_count(st, PROBE_DECODE_HEAD) > 0) /* selections, none a hit or a miss */
            snprintf(msg, sizeof msg, "no cache hit rate: %s keeps no cache of its selection (it reads every %s it "
                     "selects each step)", run && run->kv_policy && run->kv_policy[0] ? run->kv_policy : "the policy",
                     probe_store_block_name(st));
        else
            view_no_data(st, PROBE_DECODE_HEAD, "cache data", msg, sizeof msg);
        rc = view_message(c, r, "Cache hit rate", msg, res);
        goto done;
    }

    /* the layers in order; with a cursor its layer last (on top), wider, named so */
    int step = view_step(st, cur), ns = 0;
    for (int l = 0; l < nl; l++) {
        if (l == layer && !cur->clean) continue;
        snprintf(names[l], sizeof names[l], "layer %d", l);
        int named = nl <= CACHE_CAT_LAYERS || l == 0 || l == nl - 1;
        ser[ns++] = (paint_series){ .name = named ? names[l] : NULL, .x = xs, .y = ys + (size_t)l * n, .n = n,
                                    .color = layer_color(l, nl, g->cells), .width = g->line_w };
    }
    if (!cur->clean) {
        snprintf(names[layer], sizeof names[layer], "layer %d (cursor)", layer);
        ser[ns++] = (paint_series){ .name = names[layer], .x = xs, .y = ys + (size_t)layer * n, .n = n,
                                    .color = layer_color(layer, nl, g->cells), .width = g->line_w * 1.6 };
    }
    ser[ns++] = (paint_series){ .name = "mean over layers", .x = xs, .y = mean, .n = n,
                                .color = g->cells ? th->highlight : CANVAS_RGB(0x1a, 0x1a, 0x1a), .width = g->line_w * 2.6 };

    char title[200], mlabel[48];
    double m = step >= 0 ? mean[step] : NAN, lv = step >= 0 ? ys[(size_t)layer * n + step] : NAN;
    const char *unit = probe_store_block_name(st);
    if (g->cells)
        snprintf(title, sizeof title, "Cache hit rate, step %d: mean %.0f%%, layer %d %.0f%%", step, m, layer, lv);
    else
        snprintf(title, sizeof title, "%c%s cache hit rate per layer (hits / k, mean over KV heads); step %d: mean %.1f%%",
                 unit[0] - 'a' + 'A', unit + 1, step, m);
    view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    snprintf(mlabel, sizeof mlabel, "step %d", step);
    paint_marker mk = { .x = step, .label = mlabel, .color = PAINT_AUTO };
    paint_plot p = {
        .title = title,
        .x = { .label = "decode step", .min = 0, .max = n > 1 ? n - 1 : 1, .integer = 1 },
        .y = { .label = "hit rate", .unit = "%", .min = 0, .max = 100 },
        .series = ser, .n_series = ns,
        .markers = &mk, .n_markers = step >= 0 ? 1 : 0,
    };
    rc = paint_draw_plot(c, r, &p, res);
done:
    free(ys);
    free(xs);
    free(ser);
    free(names);
    return rc;
}

static int cache_click(view_cursor *cur, const probe_store *st, const paint_result *res, double x, double y) {
    const canvas_rect *a = &res->area;
    int n = probe_store_n_steps(st);
    if (n <= 0 || a->w <= 0 || a->h <= 0 || x < a->x || x > a->x + a->w || y < a->y || y > a->y + a->h) return 0;
    int s = clampi((int)lround(res->x0 + (x - a->x) / a->w * (res->x1 - res->x0)), 0, n - 1);
    int best = -1;
    double best_d = a->h / 20 + 0.5;
    for (int l = 0; l < probe_store_n_layers(st); l++) {
        float h = probe_store_hit_rate(st, s, l);
        double py = isfinite(h) ? paint_map_y(res, 100.0 * h) : NAN;
        if (isfinite(py) && fabs(py - y) < best_d) { best_d = fabs(py - y); best = l; }
    }
    int changed = s != cur->step || (best >= 0 && best != cur->layer);
    cur->step = s;
    if (best >= 0) cur->layer = best;
    return VIEW_HANDLED | (changed ? VIEW_REDRAW : 0);
}

const view_class view_cache = {
    .name = "cache",
    .title = "Cache",
    .help = "chunk (or page, token) cache hit rate per layer over the decode steps, with the mean over layers (hits / k "
            "per step, mean over KV heads; the status line's \"step hit\" is that mean at the shown step); a policy "
            "without a cache (Quest) has none",
    .draw = cache_draw,
    .move = view_move_layer_step,
    .click = cache_click,
    .needs = PROBE_STEP,
};
