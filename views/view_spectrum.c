/* view_spectrum.c: the singular values of one layer's pre-RoPE keys.
 *
 * ShadowKV keeps the keys of the prompt as a rank-r factorisation, so the
 * question this view answers is "how much did rank r throw away?". It plots
 * σ_i of the cursor's layer on a log scale against the index i (1-based),
 * marks the rank cut with a dashed line "r=…", and states the energy kept
 * (Σ_{i≤r} σ_i² / Σ σ_i²) and the measured relative reconstruction error.
 * On PNG the other layers are drawn as faint lines behind it.
 *
 * Keys: ←/→ and ↑/↓ go to the previous/next layer. A click on a line picks
 * the layer whose spectrum passes nearest to the click. */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }



/* Share of Σσ² held by the first r values, in [0, 1]. */
static double energy_kept(const float *sv, int n, int r) {
    double kept = 0, all = 0;
    for (int i = 0; i < n; i++) {
        double e = (double)sv[i] * sv[i];
        all += e;
        if (i < r) kept += e;
    }
    return all > 0 ? kept / all : 1;
}

/* The energy kept as "99.85%" (rounded down, so a loss never reads as
 * 100%), or as "all but 1.2e-13" when less than 0.01% is lost. */
static void fmt_energy(double f, char *buf, size_t n) {
    if (f >= 1) snprintf(buf, n, "100%%");
    else if (f > 0.9999) snprintf(buf, n, "all but %.1e", 1 - f);
    else snprintf(buf, n, "%.2f%%", floor(f * 1e4) / 100);
}

static int spectrum_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    int nl = probe_store_n_layers(st);
    int layer = clampi(cur->layer, 0, nl > 0 ? nl - 1 : 0);
    const probe_ev_prefill_layer *pl = probe_store_prefill_layer(st, layer);
    if (!pl || pl->n_sv <= 0 || !pl->sv) {
        char msg[160];
        view_no_data(st, PROBE_PREFILL_LAYER, "key spectrum", msg, sizeof msg);
        return view_message(c, r, "Key spectrum", msg, res);
    }

    int n = pl->n_sv, rank = pl->rank < n ? pl->rank : n, maxn = n;
    for (int l = 0; l < nl; l++) {
        const probe_ev_prefill_layer *o = probe_store_prefill_layer(st, l);
        if (o && o->n_sv > maxn) maxn = o->n_sv;
    }
    double *x = malloc((size_t)maxn * sizeof *x);
    double *y = malloc((size_t)n * sizeof *y);
    paint_series *ser = calloc((size_t)(nl > 0 ? nl : 1), sizeof *ser);
    double **ys = calloc((size_t)(nl > 0 ? nl : 1), sizeof *ys);
    int rc = SKV_OK;
    if (!x || !y || !ser || !ys) { rc = skv_error(SKV_ENOMEM, "spectrum view: out of memory"); goto done; }
    for (int i = 0; i < maxn; i++) x[i] = i + 1;
    for (int i = 0; i < n; i++) y[i] = pl->sv[i];

    /* the other layers first, faint (PNG only: in a terminal they would blur the one that matters) */
    int ns = 0, named_others = 0;
    if (!g->cells) {
        for (int l = 0; l < nl; l++) {
            const probe_ev_prefill_layer *o = probe_store_prefill_layer(st, l);
            if (l == layer || !o || o->n_sv <= 0) continue;
            int m = o->n_sv;
            ys[l] = malloc((size_t)m * sizeof **ys);
            if (!ys[l]) { rc = skv_error(SKV_ENOMEM, "spectrum view: out of memory"); goto done; }
            for (int i = 0; i < m; i++) ys[l][i] = o->sv[i];
            ser[ns++] = (paint_series){ .name = named_others++ ? NULL : "other layers", .x = x,
                                        .y = ys[l], .n = m, .color = CANVAS_RGB(0xc4, 0xc4, 0xc4),
                                        .width = g->line_w * 0.75 };
        }
    }
    char kept[32], name[160], title[160], mlabel[32];
    fmt_energy(energy_kept(pl->sv, n, rank), kept, sizeof kept);
    if (g->cells)
        snprintf(name, sizeof name, "layer %d: r=%d keeps %s energy, rel.err %.1e", layer, rank, kept, pl->rel_err);
    else
        snprintf(name, sizeof name, "layer %d: rank %d keeps %s of the energy, rel. error %.2e", layer, rank, kept,
                 pl->rel_err);
    ser[ns++] = (paint_series){ .name = name, .x = x, .y = y, .n = n, .color = g->cells ? palette_cat(4) : palette_cat(0),
                                .width = g->cells ? 0 : g->line_w * 1.5 };
    if (g->cells)
        snprintf(title, sizeof title, "Key spectrum, layer %d/%d", layer, nl);
    else
        snprintf(title, sizeof title, "Singular values of the pre-RoPE keys, layer %d of %d (%d tokens)", layer, nl,
                 pl->seq_len);
    view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    snprintf(mlabel, sizeof mlabel, "r=%d", rank);
    paint_marker mk = { .x = rank, .label = mlabel, .color = palette_cat(3) };
    paint_band dropped = { .x0 = rank, .x1 = n, .label = g->cells ? NULL : "dropped by the rank cut", .color = PAINT_AUTO };
    paint_plot p = {
        .title = title,
        .x = { .label = g->cells ? "index i" : "singular value index i", .min = 1, .max = n > 1 ? n : 2 },
        .y = { .label = g->ascii ? "sigma_i" : "\xcf\x83\xe1\xb5\xa2", .log = 1 },
        .series = ser, .n_series = ns,
        .markers = &mk, .n_markers = rank > 0 ? 1 : 0,
        .bands = &dropped, .n_bands = rank > 0 && rank < n ? 1 : 0,
    };
    rc = paint_draw_plot(c, r, &p, res);
done:
    for (int l = 0; l < nl && ys; l++) free(ys[l]);
    free(ys);
    free(ser);
    free(x);
    free(y);
    return rc;
}

static int spectrum_move(view_cursor *cur, const probe_store *st, int dx, int dy) {
    int nl = probe_store_n_layers(st), d = dx ? dx : dy;
    if (nl <= 0 || !d) return 0;
    int l = clampi(cur->layer + d, 0, nl - 1);
    if (l == cur->layer) return VIEW_HANDLED;
    cur->layer = l;
    return VIEW_HANDLED | VIEW_REDRAW;
}

/* Picks the layer whose σ at the clicked index lies nearest the click (in
 * canvas units), if within a tenth of the plot's height. */
static int spectrum_click(view_cursor *cur, const probe_store *st, const paint_result *res, double x, double y) {
    const canvas_rect *a = &res->area;
    if (a->w <= 0 || a->h <= 0 || x < a->x || x > a->x + a->w || y < a->y || y > a->y + a->h) return 0;
    int idx = (int)lround(res->x0 + (x - a->x) / a->w * (res->x1 - res->x0)); /* 1-based */
    int best = -1;
    double best_d = a->h / 10 + 1;
    for (int l = 0; l < probe_store_n_layers(st); l++) {
        const probe_ev_prefill_layer *pl = probe_store_prefill_layer(st, l);
        if (!pl || idx < 1 || idx > pl->n_sv) continue;
        double py = paint_map_y(res, pl->sv[idx - 1]);
        if (isfinite(py) && fabs(py - y) < best_d) { best_d = fabs(py - y); best = l; }
    }
    if (best < 0) return 0;
    if (best == cur->layer) return VIEW_HANDLED;
    cur->layer = best;
    return VIEW_HANDLED | VIEW_REDRAW;
}

const view_class view_spectrum = {
    .name = "spectrum",
    .title = "Spectrum",
    .help = "singular values of one layer's pre-RoPE keys (log scale), the rank cut, energy kept and error",
    .draw = spectrum_draw,
    .move = spectrum_move,
    .click = spectrum_click,
    .needs = PROBE_PREFILL_LAYER,
    .prefill = 1,
};
