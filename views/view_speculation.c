/* view_speculation.c: SpeCache's low-bit selection against exact attention
 * (docs/PEERS.md).
 *
 * SpeCache keeps a low-bit (KIVI) copy of the keys resident, ranks the
 * positions by attention over that copy, and fetches the top k rows in full
 * precision. How good is that ranking? For every decode step this view
 * plots, for the cursor's layer (mean over its KV heads) and for the mean
 * over layers, the overlap of the low-bit top-k with the exact top-k and the
 * exact attention mass the low-bit top-k holds as a share of the exact
 * top-k's. skv builds SpeCache's synchronous variant (the current query
 * picks on low-bit scores), so this is the low-bit-vs-exact overlap of the
 * current step, not a speculative next-token one.
 *
 * It reads the PROBE_METRIC events lowbit_overlap and lowbit_recall.
 *
 * Keys: ←/→ previous/next decode step; ↑/↓ layer. */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Mean of metric name at (step, layer) over KV heads; NaN when none. */
static double head_mean(const probe_store *st, const char *name, int step, int layer) {
    double sum = 0;
    int n = 0;
    for (int h = 0; h < probe_store_n_kv_heads(st); h++) {
        const probe_ev_metric *m = probe_store_metric(st, name, step, layer, h);
        if (m && isfinite(m->value)) {
            sum += m->value;
            n++;
        }
    }
    return n ? sum / n : NAN;
}

static int spec_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    int nl = probe_store_n_layers(st), n = probe_store_n_steps(st);
    char msg[200];
    if (!probe_store_has_metric(st, "lowbit_overlap") || n <= 0 || nl <= 0)
        return view_message(c, r, "SpeCache low-bit vs exact",
                            view_no_metric(st, "lowbit_overlap", 1, "low-bit selection measures",
                                           "SpeCache (--kv specache)", msg, sizeof msg), res);
    int layer = cur->layer < 0 ? 0 : cur->layer >= nl ? nl - 1 : cur->layer, step = view_step(st, cur);
    double *buf = malloc(sizeof(double) * (size_t)n * 5);
    if (!buf) return skv_error(SKV_ENOMEM, "speculation view: out of memory");
    double *x = buf, *ov = buf + n, *rc_l = buf + 2 * (size_t)n, *ov_all = buf + 3 * (size_t)n,
           *rc_all = buf + 4 * (size_t)n;
    for (int s = 0; s < n; s++) {
        x[s] = s;
        ov[s] = 100 * head_mean(st, "lowbit_overlap", s, layer);
        rc_l[s] = 100 * head_mean(st, "lowbit_recall", s, layer);
        double so = 0, sr = 0;
        int k = 0;
        for (int l = 0; l < nl; l++) {
            double o = head_mean(st, "lowbit_overlap", s, l), q = head_mean(st, "lowbit_recall", s, l);
            if (isfinite(o) && isfinite(q)) {
                so += o;
                sr += q;
                k++;
            }
        }
        ov_all[s] = k ? 100 * so / k : NAN;
        rc_all[s] = k ? 100 * sr / k : NAN;
    }
    char title[240], n1[48], n2[48], ml[32];
    double o = step >= 0 ? ov[step] : NAN, q = step >= 0 ? rc_l[step] : NAN;
    snprintf(title, sizeof title,
             g->cells ? "SpeCache low-bit top-k, step %d layer %d: overlap %.0f%%, mass %.0f%%"
                      : "SpeCache low-bit top-k vs exact, step %d, layer %d: overlap %.1f%%, mass recall %.1f%%",
             step, layer, o, q);
    view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    snprintf(n1, sizeof n1, "overlap, layer %d", layer);
    snprintf(n2, sizeof n2, "mass recall, layer %d", layer);
    snprintf(ml, sizeof ml, "step %d", step);
    paint_series ser[4] = {
        { .name = n1, .x = x, .y = ov, .n = n, .color = palette_cat(0), .width = g->line_w * 1.6 },
        { .name = n2, .x = x, .y = rc_l, .n = n, .color = palette_cat(1), .width = g->line_w * 1.6 },
        { .name = "overlap, mean over layers", .x = x, .y = ov_all, .n = n, .color = palette_cat(2) },
        { .name = "mass recall, mean over layers", .x = x, .y = rc_all, .n = n, .color = palette_cat(3) },
    };
    paint_marker mk = { .x = step, .label = ml, .color = PAINT_AUTO };
    paint_plot p = {
        .title = title,
        .x = { .label = "decode step", .min = 0, .max = n > 1 ? n - 1 : 1, .integer = 1 },
        .y = { .label = "share", .unit = "%", .min = 0, .max = 100 },
        .series = ser, .n_series = 4, .markers = &mk, .n_markers = step >= 0,
    };
    int rc = paint_draw_plot(c, r, &p, res);
    free(buf);
    return rc;
}

const view_class view_speculation = {
    .name = "speculation",
    .title = "SpeCache",
    .help = "SpeCache: overlap and mass recall of the low-bit top-k against the exact top-k, per layer over steps",
    .draw = spec_draw,
    .move = view_move_layer_step,
    .metric = "lowbit_overlap",
};
