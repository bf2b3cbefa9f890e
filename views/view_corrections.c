/* view_corrections.c: FreeKV's corrections map (docs/PEERS.md).
 *
 * FreeKV picks a step's pages with the previous step's query and corrects
 * (re-picks with the current query) a KV head whose group's query cosine
 * with the previous step falls below tau. This view shows that decision for
 * every layer and KV head over the decode steps: one row per (layer, KV
 * head), one column per step, coloured by the cosine c, with the corrected
 * cells outlined; the title gives the correction rate overall and of the
 * cursor's layer. Layers FreeKV attends densely (layer 0, or while the
 * context fits the budget) have no cells.
 *
 * It reads the PROBE_METRIC events query_cos and corrected.
 *
 * Keys: ←/→ previous/next decode step (the highlighted column); ↑/↓ layer. */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int corr_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    int nl = probe_store_n_layers(st), nh = probe_store_n_kv_heads(st), n = probe_store_n_steps(st);
    char msg[200];
    if (!probe_store_has_metric(st, "query_cos") || n <= 0 || nl <= 0 || nh <= 0)
        return view_message(c, r, "FreeKV corrections",
                            view_no_metric(st, "query_cos", 1, "query-cosine measures", "FreeKV (--kv freekv)", msg,
                                           sizeof msg), res);
    int ny = nl * nh, step = view_step(st, cur);
    int layer = cur->layer < 0 ? 0 : cur->layer >= nl ? nl - 1 : cur->layer;
    float *v = malloc(sizeof(float) * (size_t)ny * n);
    paint_cellmark *mk = malloc(sizeof *mk * (size_t)ny * n);
    char (*yt)[24] = malloc(sizeof *yt * (size_t)ny);
    const char **ytp = malloc(sizeof *ytp * (size_t)ny);
    int rc = 0;
    if (!v || !mk || !yt || !ytp) {
        rc = skv_error(SKV_ENOMEM, "corrections view: out of memory");
        goto done;
    }
    int n_mk = 0, dec = 0, corr = 0, ldec = 0, lcorr = 0;
    float vmin = 1;
    for (int l = 0; l < nl; l++)
        for (int h = 0; h < nh; h++) {
            int row = l * nh + h;
            snprintf(yt[row], sizeof yt[row], g->cells ? "L%d h%d" : "layer %d head %d", l, h);
            ytp[row] = yt[row];
            for (int s = 0; s < n; s++) {
                const probe_ev_metric *cs = probe_store_metric(st, "query_cos", s, l, h);
                const probe_ev_metric *cr = probe_store_metric(st, "corrected", s, l, h);
                v[(size_t)row * n + s] = cs ? cs->value : NAN;
                if (cs && isfinite(cs->value) && cs->value < vmin) vmin = cs->value;
                if (!cr) continue;
                dec++;
                ldec += l == layer;
                if (cr->value > 0.5f) {
                    corr++;
                    lcorr += l == layer;
                    mk[n_mk++] = (paint_cellmark){ s, row };
                }
            }
        }
    const probe_ev_run *run = probe_store_run(st);
    double tau = run ? probe_pairs_get(run->kv_opts, "tau", NAN) : NAN;
    char title[240], tl[32] = "";
    if (isfinite(tau)) snprintf(tl, sizeof tl, ", tau %.2f", tau);
    snprintf(title, sizeof title,
             g->cells ? "FreeKV corrections%s: %.0f%% of decisions (layer %d: %.0f%%), step %d"
                      : "FreeKV query cosine with the last step%s: %.1f%% corrected (layer %d: %.1f%%), step %d",
             tl, dec ? 100.0 * corr / dec : 0.0, layer, ldec ? 100.0 * lcorr / ldec : 0.0, step);
    view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    paint_heatmap hm = {
        .title = title, .v = v, .nx = n, .ny = ny,
        .x = { .label = "decode step", .min = 0, .max = n, .integer = 1 },
        .y = { .label = "layer, KV head" },
        .yticks = ytp,
        .value = { .label = "query cosine c", .min = isfinite(tau) && tau < vmin ? tau : vmin, .max = 1 },
        .marks = mk, .n_marks = n_mk, .mark_label = "corrected (c < tau)",
    };
    rc = paint_draw_heatmap(c, r, &hm, res);
done:
    free(v);
    free(mk);
    free(yt);
    free(ytp);
    return rc;
}

const view_class view_corrections = {
    .name = "corrections",
    .title = "Corrections",
    .help = "FreeKV: query cosine with the previous step per layer and KV head over steps, corrected heads outlined",
    .draw = corr_draw,
    .move = view_move_layer_step,
    .metric = "query_cos",
};
