/* view_bounds.c: Quest's bound gap (docs/PEERS.md).
 *
 * Quest scores each page by an upper bound U = sum over channels of
 * max(q_c min_c, q_c max_c) of q·k over the page's keys, and attends the
 * pages with the largest U. The bound is loose by how far U sits above the
 * true max q·k of the page; when it is loose unevenly, the page holding the
 * best key can rank low. For the cursor's step, layer and KV head (its
 * group's first query head) this view plots both over the pages (the
 * current page, never scored, is left out), marks the page whose true max is
 * highest and says where U ranks it.
 *
 * It reads the PROBE_METRIC events page_bound (value: that rank) and
 * page_max (value: that page).
 *
 * Keys: ←/→ previous/next decode step; ↑/↓ layer; the head is the cursor's. */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int bounds_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    int nl = probe_store_n_layers(st), nh = probe_store_n_kv_heads(st);
    int step = view_step(st, cur);
    int layer = cur->layer < 0 ? 0 : nl > 0 && cur->layer >= nl ? nl - 1 : cur->layer;
    int head = cur->head < 0 ? 0 : nh > 0 && cur->head >= nh ? nh - 1 : cur->head;
    char msg[200];
    const probe_ev_metric *ub = probe_store_metric(st, "page_bound", step, layer, head);
    const probe_ev_metric *mx = probe_store_metric(st, "page_max", step, layer, head);
    if (!ub || !mx || ub->n != mx->n || ub->n <= 0) {
        if (probe_store_has_metric(st, "page_bound") && step >= 0)
            snprintf(msg, sizeof msg, "layer %d is attended densely at step %d (no pages scored): move to another "
                     "layer (%s)", layer, step, canvas_geometry(c)->cells ? "up/down" : "--layer L");
        else
            view_no_metric(st, "page_bound", 1, "page bounds", "Quest (--kv quest)", msg, sizeof msg);
        return view_message(c, r, "Quest bound gap", msg, res);
    }
    int n = ub->n, best = (int)mx->value;
    double *x = malloc(sizeof(double) * (size_t)n), *yu = malloc(sizeof(double) * (size_t)n),
           *ym = malloc(sizeof(double) * (size_t)n);
    int rc = 0;
    if (!x || !yu || !ym) {
        rc = skv_error(SKV_ENOMEM, "bounds view: out of memory");
        goto done;
    }
    for (int j = 0; j < n; j++) {
        x[j] = j;
        yu[j] = ub->vals[j];
        ym[j] = mx->vals[j];
    }
    const char *dot = g->ascii ? "." : "\xc2\xb7";
    char title[240], ml[48], sname[48];
    snprintf(sname, sizeof sname, "true max q%sk of the page", dot);
    snprintf(title, sizeof title, "Quest bounds, step %d, layer %d, KV head %d: the best page (%d) ranks %d under U",
             step, layer, head, best, (int)ub->value);
    view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    snprintf(ml, sizeof ml, "best page %d", best);
    paint_series ser[2] = {
        { .name = "bound U (what Quest ranks)", .x = x, .y = yu, .n = n, .color = PAINT_AUTO },
        { .name = sname, .x = x, .y = ym, .n = n, .color = PAINT_AUTO },
    };
    paint_marker mk = { .x = best, .label = ml, .color = PAINT_AUTO };
    paint_plot p = {
        .title = title,
        .x = { .label = "page", .min = 0, .max = n > 1 ? n - 1 : 1, .integer = 1 },
        .y = { .label = "score" },
        .series = ser, .n_series = 2, .markers = &mk, .n_markers = best >= 0 && best < n,
    };
    rc = paint_draw_plot(c, r, &p, res);
done:
    free(x);
    free(yu);
    free(ym);
    return rc;
}

/* ↑/↓ layer, ←/→ step; the KV head follows the cursor (other views set it). */
const view_class view_bounds = {
    .name = "bounds",
    .title = "Bounds",
    .help = "Quest: each page's bound U beside its true max q.k at one step, layer and KV head; where the best "
            "page ranks",
    .draw = bounds_draw,
    .move = view_move_layer_step,
    .metric = "page_bound",
};
