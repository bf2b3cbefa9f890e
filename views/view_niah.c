/* view_niah.c: the needle-in-a-haystack heatmap, in the style of Figure 6
 * of the ShadowKV paper: for dense attention (left) and ShadowKV (right),
 * one cell per (context length, needle depth) coloured by the share of runs
 * whose answer held the needle's value (0-100%), lengths across, depths
 * down (0% = the needle at the start of the haystack, at the top).
 *
 * It reads only PROBE_NIAH events (skv needle --trace FILE writes them after
 * the probe events of the one case it records in detail); both panels
 * outline that case's cell, so they keep the same layout. res describes the dense panel (area, axes, colour bar),
 * except res->legend, which holds the ShadowKV panel's data area.
 *
 * Keys: ←/→ and ↑/↓ move a cell cursor over the grid (lengths and depths);
 * the line under the panels reports that cell for both methods. A click on a
 * cell of either panel moves the cursor there. The cell cursor lives in the
 * view cursor's scroll field (length index * 1000 + depth index). */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NIAH_MAX_AXIS 256   /* distinct lengths or depths shown */


/* The grid: sorted distinct lengths and depths, and per method and cell the
 * mean hit rate in percent (NaN: no case). */
typedef struct {
    int nx, ny;
    int len[NIAH_MAX_AXIS];
    float dep[NIAH_MAX_AXIS];
    float *v[2];            /* (ny, nx) per method */
    int *runs[2];           /* (ny, nx) cases per cell */
    int hits[2], total[2];
    int mark_x, mark_y;     /* the explained case's cell, -1 */
} niah_grid;

static void grid_free(niah_grid *g) {
    for (int m = 0; m < 2; m++) { free(g->v[m]); free(g->runs[m]); }
}

static int find_len(const niah_grid *g, int v) {
    for (int i = 0; i < g->nx; i++) if (g->len[i] == v) return i;
    return -1;
}

static int find_dep(const niah_grid *g, float v) {
    for (int i = 0; i < g->ny; i++) if (g->dep[i] == v) return i;
    return -1;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Fills g from the store's NIAH events; 0, SKV_EMISSING or SKV_ENOMEM. */
static int grid_build(const probe_store *st, niah_grid *g) {
    memset(g, 0, sizeof *g);
    g->mark_x = g->mark_y = -1;
    int n = probe_store_n_niah(st);
    for (int i = 0; i < n; i++) {
        const probe_ev_niah *e = probe_store_niah(st, i);
        if (find_len(g, e->length) < 0 && g->nx < NIAH_MAX_AXIS) g->len[g->nx++] = e->length;
        if (find_dep(g, e->depth) < 0 && g->ny < NIAH_MAX_AXIS) g->dep[g->ny++] = e->depth;
    }
    if (!g->nx || !g->ny) return SKV_EMISSING;
    qsort(g->len, (size_t)g->nx, sizeof g->len[0], cmp_int);
    qsort(g->dep, (size_t)g->ny, sizeof g->dep[0], cmp_float);
    size_t cells = (size_t)g->nx * g->ny;
    for (int m = 0; m < 2; m++) {
        g->v[m] = calloc(cells, sizeof(float));
        g->runs[m] = calloc(cells, sizeof(int));
        if (!g->v[m] || !g->runs[m]) return skv_error(SKV_ENOMEM, "niah view: out of memory");
    }
    for (int i = 0; i < n; i++) {
        const probe_ev_niah *e = probe_store_niah(st, i);
        int x = find_len(g, e->length), y = find_dep(g, e->depth), m = e->method;
        if (x < 0 || y < 0 || m < 0 || m > 1) continue;
        size_t at = (size_t)y * g->nx + x;
        g->v[m][at] += e->hit ? 100.0f : 0.0f;
        g->runs[m][at]++;
        g->hits[m] += e->hit != 0;
        g->total[m]++;
        if (e->detail && m == 1) { g->mark_x = x; g->mark_y = y; }
    }
    for (int m = 0; m < 2; m++)
        for (size_t i = 0; i < cells; i++) g->v[m][i] = g->runs[m][i] ? g->v[m][i] / g->runs[m][i] : NAN;
    return 0;
}

/* "4k" for multiples of 1024, else the number. */
static void len_label(int v, char *buf, size_t n) {
    if (v >= 1024 && v % 1024 == 0) snprintf(buf, n, "%dk", v / 1024);
    else snprintf(buf, n, "%d", v);
}

/* The cell cursor (clamped to the grid) from the view cursor. */
static void cell_of(const view_cursor *cur, const niah_grid *g, int *x, int *y) {
    int c = cur->scroll < 0 ? 0 : cur->scroll;
    *x = c / 1000;
    *y = c % 1000;
    if (*x >= g->nx) *x = g->nx - 1;
    if (*y >= g->ny) *y = g->ny - 1;
}

static int niah_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    niah_grid g;
    int rc = grid_build(st, &g);
    if (rc == SKV_EMISSING) {
        grid_free(&g);
        return view_message(c, r, "Needle in a haystack",
                            "no NIAH results: run skv needle --trace FILE, then open or export that trace", res);
    }
    if (rc) { grid_free(&g); return rc; }
    const canvas_geom *geo = canvas_geometry(c);
    const canvas_theme *th = canvas_get_theme(c);
    char xl[NIAH_MAX_AXIS][16], yl[NIAH_MAX_AXIS][16];
    const char *xt[NIAH_MAX_AXIS], *yt[NIAH_MAX_AXIS];
    for (int i = 0; i < g.nx; i++) { len_label(g.len[i], xl[i], sizeof xl[i]); xt[i] = xl[i]; }
    for (int i = 0; i < g.ny; i++) { snprintf(yl[i], sizeof yl[i], "%g%%", g.dep[i]); yt[i] = yl[i]; }
    const probe_ev_run *run = probe_store_run(st);
    char title[2][160];
    for (int m = 0; m < 2; m++) {
        double pct = g.total[m] ? 100.0 * g.hits[m] / g.total[m] : 0;
        if (m == 0) snprintf(title[m], sizeof title[m], "Dense attention: %.0f%% retrieved", pct);
        else if (run && run->kv_policy && !strcmp(run->kv_policy, "shadowkv") && !geo->cells)
            snprintf(title[m], sizeof title[m], "ShadowKV (budget %d, rank %d): %.0f%% retrieved", run->budget, run->rank, pct);
        else snprintf(title[m], sizeof title[m], "ShadowKV: %.0f%% retrieved", pct);
    }
    /* One text line under the panels for the cursor's cell. */
    double line_h = geo->cells ? 1 : canvas_line_height(c, CANVAS_FONT_BODY) + geo->pad;
    double ph = r.h - (r.h > 4 * line_h ? line_h : 0);
    double half = geo->cells ? floor(r.w / 2) : r.w / 2;
    canvas_rect left = { r.x, r.y, half, ph }, right = { r.x + half, r.y, r.w - half, ph };
    if (!geo->cells) right.w = half;
    int cx, cy;
    cell_of(cur, &g, &cx, &cy);
    paint_cellmark mk = { g.mark_x, g.mark_y };
    paint_result lres, rres;
    for (int m = 0; m < 2 && !rc; m++) {
        paint_heatmap h = {
            .title = title[m], .v = g.v[m], .nx = g.nx, .ny = g.ny,
            .x = { .label = "context length", .unit = "tokens" }, .y = { .label = "needle depth" },
            .xticks = xt, .yticks = yt,
            .value = { .label = "retrieved", .unit = "%", .min = 0, .max = 100 },
            .marks = g.mark_x >= 0 ? &mk : NULL, .n_marks = g.mark_x >= 0 ? 1 : 0,
            .mark_label = geo->cells ? "traced" : "case recorded in detail", .annotate = "%.0f",
        };
        rc = paint_draw_heatmap(c, m ? right : left, &h, m ? &rres : &lres);
    }
    if (!rc && ph < r.h) {
        size_t at = (size_t)cy * g.nx + cx;
        char line[256], ln[16];
        len_label(g.len[cx], ln, sizeof ln);
        snprintf(line, sizeof line, "length %s, depth %g%%: dense %.0f%%, shadowkv %.0f%% of %d run%s", ln, g.dep[cy],
                 g.v[0][at], g.v[1][at], g.runs[1][at], g.runs[1][at] == 1 ? "" : "s");
        canvas_rect old = canvas_clip(c, r);
        canvas_text(c, r.x + (geo->cells ? 0 : geo->pad), r.y + r.h - line_h / 2, line, CANVAS_FONT_BODY,
                    CANVAS_LEFT | CANVAS_MIDDLE, th->fg);
        canvas_clip(c, old);
    }
    if (res && !rc) {
        *res = lres;
        res->legend = rres.area;
    }
    grid_free(&g);
    return rc;
}

static int niah_move(view_cursor *cur, const probe_store *st, int dx, int dy) {
    niah_grid g;
    int rc = grid_build(st, &g);
    if (rc) { grid_free(&g); return 0; }
    int x, y;
    cell_of(cur, &g, &x, &y);
    x += dx;
    y += dy;
    x = x < 0 ? 0 : x >= g.nx ? g.nx - 1 : x;
    y = y < 0 ? 0 : y >= g.ny ? g.ny - 1 : y;
    grid_free(&g);
    int v = x * 1000 + y;
    if (v == cur->scroll) return VIEW_HANDLED;
    cur->scroll = v;
    return VIEW_HANDLED | VIEW_REDRAW;
}

static int niah_click(view_cursor *cur, const probe_store *st, const paint_result *res, double x, double y) {
    niah_grid g;
    int rc = grid_build(st, &g), nx = g.nx, ny = g.ny;
    grid_free(&g);
    if (rc) return 0;
    for (int m = 0; m < 2; m++) {
        const canvas_rect *a = m ? &res->legend : &res->area;
        if (a->w <= 0 || a->h <= 0 || x < a->x || x >= a->x + a->w || y < a->y || y >= a->y + a->h) continue;
        int v = (int)floor((x - a->x) / a->w * nx) * 1000 + (int)floor((y - a->y) / a->h * ny);
        int changed = v != cur->scroll;
        cur->scroll = v;
        return VIEW_HANDLED | (changed ? VIEW_REDRAW : 0);
    }
    return 0;
}

const view_class view_niah = {
    .name = "niah",
    .title = "NIAH",
    .help = "needle-in-a-haystack heatmap, context length x needle depth, dense beside shadowkv (skv needle --trace)",
    .draw = niah_draw,
    .move = niah_move,
    .click = niah_click,
};
