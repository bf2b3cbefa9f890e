/* view_tailor.c: TailorKV's layer modes and channel raster (docs/PEERS.md).
 *
 * TailorKV quantizes a layer whose attention is spread (P, the mass outside
 * the top 5% of keys, above qtau) and serves every other layer sparsely: it
 * scores the prompt's keys on the few channels where |mean q| x max|K| is
 * largest and fetches the top tokens. The upper panel plots P per layer with
 * the qtau line and shades the quantized layers (a map set by --kv-opt
 * qlayers has no P: only the shading). The lower panel is the channel raster
 * of the cursor's layer and KV head: one row per channel of the head, one
 * column per decode step, filled where the channel was fetched to score.
 *
 * It reads the PROBE_METRIC events attn_spread and quantized (prefill, per
 * layer) and channels (per step, layer and KV head; vals: channel ids).
 *
 * Keys: ←/→ previous/next decode step (the highlighted column); ↑/↓ layer. */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upper panel: P per layer, qtau, quantized layers shaded. */
static int draw_modes(canvas *c, canvas_rect r, const probe_store *st, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    int nl = probe_store_n_layers(st);
    double *x = malloc(sizeof(double) * (size_t)nl), *p = malloc(sizeof(double) * (size_t)nl),
           *t = malloc(sizeof(double) * (size_t)nl);
    paint_band *bands = malloc(sizeof *bands * (size_t)nl);
    int rc = 0, nb = 0, nq = 0, has_p = 0;
    if (!x || !p || !t || !bands) {
        rc = skv_error(SKV_ENOMEM, "tailorkv view: out of memory");
        goto done;
    }
    const probe_ev_run *run = probe_store_run(st);
    double tau = run ? probe_pairs_get(run->kv_opts, "qtau", NAN) : NAN;
    char qmap[160] = "";
    size_t ql = 0;
    for (int l = 0; l < nl; l++) {
        const probe_ev_metric *P = probe_store_metric(st, "attn_spread", -1, l, -1);
        const probe_ev_metric *q = probe_store_metric(st, "quantized", -1, l, -1);
        x[l] = l;
        p[l] = P ? P->value : NAN;
        t[l] = tau;
        has_p |= P != NULL;
        if (q && q->value > 0.5f) {
            bands[nb] = (paint_band){ l - 0.5, l + 0.5, nb == 0 ? "quantized layer" : NULL, PAINT_AUTO };
            nb++;
            nq++;
            if (ql < sizeof qmap) ql += (size_t)snprintf(qmap + ql, sizeof qmap - ql, "%s%d", ql ? "," : "", l);
        }
    }
    char title[240];
    snprintf(title, sizeof title,
             g->cells ? "TailorKV modes: quantized {%s}, %d sparse%s"
                      : "TailorKV layers: quantized {%s}, %d sparse (P: mass outside the top 5%% of keys)%s",
             qmap, nl - nq, has_p ? "" : " (map set by qlayers)");
    view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    paint_series ser[2] = {
        { .name = "P (calibration)", .x = x, .y = p, .n = nl, .color = PAINT_AUTO, .width = g->line_w * 1.6 },
        { .name = "qtau", .x = x, .y = t, .n = nl, .color = PAINT_AUTO },
    };
    paint_plot pl = {
        .title = title,
        .x = { .label = "layer", .min = -0.5, .max = nl - 0.5, .integer = 1 },
        .y = { .label = "P", .min = 0, .max = 1 },
        .series = ser, .n_series = isfinite(tau) && has_p ? 2 : has_p ? 1 : 0,
        .bands = bands, .n_bands = nb,
    };
    rc = paint_draw_plot(c, r, &pl, res);
done:
    free(x);
    free(p);
    free(t);
    free(bands);
    return rc;
}

/* Lower panel: channels fetched per step at (layer, head). */
static int draw_channels(canvas *c, canvas_rect r, const probe_store *st, int layer, int head, int step,
                         int clean, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    const probe_ev_run *run = probe_store_run(st);
    int n = probe_store_n_steps(st), d = run && run->head_dim > 0 ? run->head_dim : 0;
    for (int s = 0; s < n && d == 0; s++) {
        const probe_ev_metric *m = probe_store_metric(st, "channels", s, layer, head);
        for (int i = 0; m && i < m->n; i++)
            if (m->vals[i] + 1 > d) d = (int)m->vals[i] + 1;
    }
    int any = 0;
    for (int s = 0; s < n && !any; s++) any = probe_store_metric(st, "channels", s, layer, head) != NULL;
    char msg[200];
    if (!any || d <= 0) {
        if (probe_store_has_metric(st, "channels"))
            snprintf(msg, sizeof msg, "layer %d is not sparse (or attends densely): no channels scored; move to a "
                     "sparse layer (%s)", layer, canvas_geometry(c)->cells ? "up/down" : "--layer L");
        else
            view_no_metric(st, "channels", 1, "channel measures", "TailorKV (--kv tailorkv)", msg, sizeof msg);
        return view_message(c, r, "TailorKV channels", msg, res);
    }
    uint8_t *cat = malloc((size_t)d * n);
    if (!cat) return skv_error(SKV_ENOMEM, "tailorkv view: out of memory");
    memset(cat, 255, (size_t)d * n);
    int cnt = 0;
    for (int s = 0; s < n; s++) {
        const probe_ev_metric *m = probe_store_metric(st, "channels", s, layer, head);
        for (int i = 0; m && i < m->n; i++) {
            int ch = (int)m->vals[i];
            if (ch >= 0 && ch < d) cat[(size_t)ch * n + s] = 0;
        }
        if (m) cnt = m->n;
    }
    paint_category cats[1] = { { "channel fetched to score the prompt", PAINT_AUTO, "#" } };
    char title[200];
    snprintf(title, sizeof title,
             g->cells ? "Channels, layer %d head %d: %d of %d per step" : "Channels fetched to score the prompt's keys, "
             "layer %d, KV head %d: %d of %d per step",
             layer, head, cnt, d);
    view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    paint_raster pr = {
        .title = title, .cat = cat, .nx = n, .ny = d, .cats = cats, .n_cats = 1,
        .x = { .label = "decode step", .min = -0.5, .max = n - 0.5, .integer = 1 },
        .y = { .label = "channel", .min = -0.5, .max = d - 0.5, .integer = 1 },
        .highlight = step >= 0 && !clean ? PAINT_HI_COL : 0, .hi_col = step,
    };
    int rc = paint_draw_raster(c, r, &pr, res);
    free(cat);
    return rc;
}

static int tailor_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    int nl = probe_store_n_layers(st), nh = probe_store_n_kv_heads(st);
    char msg[200];
    if (!probe_store_has_metric(st, "quantized") || nl <= 0)
        return view_message(c, r, "TailorKV layer modes",
                            view_no_metric(st, "quantized", 0, "layer modes", "TailorKV (--kv tailorkv)", msg,
                                           sizeof msg), res);
    int layer = cur->layer < 0 ? 0 : cur->layer >= nl ? nl - 1 : cur->layer;
    int head = cur->head < 0 ? 0 : nh > 0 && cur->head >= nh ? nh - 1 : cur->head;
    double top = g->cells ? floor(r.h * 0.42) : r.h * 0.42;
    canvas_rect a = { r.x, r.y, r.w, top }, b = { r.x, r.y + top, r.w, r.h - top };
    paint_result pr;
    int rc = draw_modes(c, a, st, &pr);
    if (rc && rc != SKV_EMISSING) return rc;
    int rc2 = draw_channels(c, b, st, layer, head, view_step(st, cur), cur->clean, res);
    return rc2 == SKV_EMISSING ? 0 : rc2;
}

const view_class view_tailor = {
    .name = "tailor",
    .title = "TailorKV",
    .help = "TailorKV: P per layer with qtau and the quantized layers, and the channels each sparse layer fetched per step",
    .draw = tailor_draw,
    .move = view_move_layer_step,
    .metric = "quantized",
};
