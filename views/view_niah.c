/* view_niah.c: the needle-in-a-haystack heatmap, in the style of Figure 6
 * of the ShadowKV paper: one panel per method of the sweep (dense first,
 * then each KV policy, side by side on one colour scale), one cell per
 * (context length, needle depth) coloured by the share of runs whose answer
 * held the needle's value (0-100%), lengths across, depths down (0% = the
 * needle at the start of the haystack, at the top).
 *
 * It reads the PROBE_NIAH events (skv needle --trace FILE writes them after
 * the probe events of the one case it records in detail) and the
 * "sweep_planned" metric (the cases the sweep set out to run): a sweep cut
 * short by Ctrl-C titles every panel "cut short: N of M cases"; the
 * "under_floor" metric (method, length pairs whose budget is under the
 * method's floor) marks those lengths "*" on that method's panel; every panel
 * outlines that case's cell, so they keep the same layout. res describes the
 * first panel (area, axes, colour bar), except res->legend, which holds the
 * second panel's data area (panels are equally wide, so it gives the pitch).
 *
 * Keys: ←/→ and ↑/↓ move a cell cursor over the grid (lengths and depths);
 * the line under the panels reports that cell for every method. A click on a
 * cell of any panel moves the cursor there. A figure with more than three
 * methods puts its panels on two rows. The cell cursor lives in the
 * view cursor's scroll field (length index * 1000 + depth index). */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NIAH_MAX_AXIS 256   /* distinct lengths or depths shown */
#define NIAH_MAX_METHODS 8  /* panels: method indices 0..7 */


/* The grid: sorted distinct lengths and depths, and per method and cell the
 * mean hit rate in percent (NaN: no case). */
typedef struct {
    int nx, ny;
    int len[NIAH_MAX_AXIS];
    float dep[NIAH_MAX_AXIS];
    int nm;                 /* methods: 1 + the largest method index seen */
    char name[NIAH_MAX_METHODS][32]; /* the method's policy name */
    float *v[NIAH_MAX_METHODS];      /* (ny, nx) per method */
    int *runs[NIAH_MAX_METHODS];     /* (ny, nx) cases per cell */
    int hits[NIAH_MAX_METHODS], total[NIAH_MAX_METHODS];
    int mark_x, mark_y;     /* the explained case's cell, -1 */
} niah_grid;

static void grid_free(niah_grid *g) {
    for (int m = 0; m < NIAH_MAX_METHODS; m++) { free(g->v[m]); free(g->runs[m]); }
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
        if (e->method < 0 || e->method >= NIAH_MAX_METHODS) continue;
        if (find_len(g, e->length) < 0 && g->nx < NIAH_MAX_AXIS) g->len[g->nx++] = e->length;
        if (find_dep(g, e->depth) < 0 && g->ny < NIAH_MAX_AXIS) g->dep[g->ny++] = e->depth;
        if (e->method >= g->nm) g->nm = e->method + 1;
        if (!g->name[e->method][0] && e->policy && e->policy[0])
            snprintf(g->name[e->method], sizeof g->name[0], "%s", e->policy);
    }
    for (int m = 0; m < g->nm; m++)
        if (!g->name[m][0]) snprintf(g->name[m], sizeof g->name[0], m ? "method %d" : "dense", m);
    if (!g->nx || !g->ny) return SKV_EMISSING;
    qsort(g->len, (size_t)g->nx, sizeof g->len[0], cmp_int);
    qsort(g->dep, (size_t)g->ny, sizeof g->dep[0], cmp_float);
    size_t cells = (size_t)g->nx * g->ny;
    for (int m = 0; m < g->nm; m++) {
        g->v[m] = calloc(cells, sizeof(float));
        g->runs[m] = calloc(cells, sizeof(int));
        if (!g->v[m] || !g->runs[m]) return skv_error(SKV_ENOMEM, "niah view: out of memory");
    }
    for (int i = 0; i < n; i++) {
        const probe_ev_niah *e = probe_store_niah(st, i);
        int x = find_len(g, e->length), y = find_dep(g, e->depth), m = e->method;
        if (x < 0 || y < 0 || m < 0 || m >= g->nm) continue;
        size_t at = (size_t)y * g->nx + x;
        g->v[m][at] += e->hit ? 100.0f : 0.0f;
        g->runs[m][at]++;
        g->hits[m] += e->hit != 0;
        g->total[m]++;
        if (e->detail && m > 0) { g->mark_x = x; g->mark_y = y; }
    }
    for (int m = 0; m < g->nm; m++)
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
    char title[NIAH_MAX_METHODS][160];
    /* the cases the sweep set out to run (skv needle's "sweep_planned"): an
     * interrupted sweep's figure says it was cut short, whatever cells it reached */
    const probe_ev_metric *pm = probe_store_metric(st, "sweep_planned", -1, 0, -1);
    int planned_cases = pm && pm->value >= 1 && pm->value < 1e9 ? (int)pm->value : 0;
    /* the lengths at which a method's budget was under its floor (skv
     * needle's "under_floor": method, length pairs): it selected nothing
     * beyond what it always keeps, so those columns are marked "*" */
    unsigned char under[NIAH_MAX_METHODS][NIAH_MAX_AXIS] = {{0}};
    int any_under[NIAH_MAX_METHODS] = {0};
    const probe_ev_metric *uf = probe_store_metric(st, "under_floor", -1, 0, -1);
    for (int k = 0; uf && uf->vals && k + 1 < uf->n; k += 2) {
        float mv = uf->vals[k], lv = uf->vals[k + 1]; /* from a trace: checked before any cast */
        if (!(mv >= 0 && mv < g.nm) || !(lv >= 1 && lv <= 1 << 24)) continue;
        int m = (int)mv;
        for (int i = 0; i < g.nx; i++)
            if (g.len[i] == (int)lv) under[m][i] = any_under[m] = 1;
    }
    for (int m = 0; m < g.nm; m++) {
        double pct = g.total[m] ? 100.0 * g.hits[m] / g.total[m] : 0;
        /* The budget may differ per length (--budget P%), so titles name the policy alone. */
        int n = snprintf(title[m], sizeof title[m], "%s: %.0f%% retrieved", m == 0 && !g.name[0][0] ? "dense" : g.name[m],
                         pct);
        /* An interrupted sweep leaves cells with fewer runs than the fullest one. */
        int most = 0;
        for (int i = 0; i < g.nx * g.ny; i++) most = g.runs[m][i] > most ? g.runs[m][i] : most;
        int planned = most * g.nx * g.ny;
        if (planned_cases && g.total[0] < planned_cases && n > 0 && (size_t)n < sizeof title[m])
            n += snprintf(title[m] + n, sizeof title[m] - (size_t)n, ", cut short: %d of %d cases", g.total[0],
                          planned_cases);
        else if (g.total[m] < planned && n > 0 && (size_t)n < sizeof title[m])
            n += snprintf(title[m] + n, sizeof title[m] - (size_t)n, ", partial (%d of %d)", g.total[m], planned);
        if (any_under[m] && n > 0 && (size_t)n < sizeof title[m])
            snprintf(title[m] + n, sizeof title[m] - (size_t)n, ", *: under its floor");
    }
    /* One text line under the panels for the cursor's cell. */
    double line_h = geo->cells ? 1 : canvas_line_height(c, CANVAS_FONT_BODY) + geo->pad;
    double ph = r.h - (r.h > 4 * line_h && !cur->clean ? line_h : 0); /* a clean export: no cursor line */
    /* A figure (PNG, SVG) with more than three panels puts them on two rows;
     * the terminal keeps one row (clicks map along it). */
    int cols = geo->cells || g.nm <= 3 ? g.nm : (g.nm + 1) / 2, rows = (g.nm + cols - 1) / cols;
    /* A figure draws one colour bar, beside the last panel of each row (the
     * scale is the same 0..100 for all): the others get its width back. */
    int shared = !geo->cells && g.nm > 1;
    double extra = shared ? paint_colorbar_room(c) : 0;
    double pw = geo->cells ? floor(r.w / cols) : (r.w - extra) / cols, rh = ph / rows;
    int cx, cy;
    cell_of(cur, &g, &cx, &cy);
    paint_cellmark mk = { g.mark_x, g.mark_y };
    paint_result lres, rres = {0};
    int short_titles = 0;
    for (int m = 0; m < g.nm; m++) short_titles |= canvas_text_width(c, title[m], CANVAS_FONT_TITLE) > pw;
    for (int m = 0; m < g.nm && !rc; m++) {
        char uxl[NIAH_MAX_AXIS][20];
        const char *uxt[NIAH_MAX_AXIS];
        for (int i = 0; i < g.nx; i++) {
            snprintf(uxl[i], sizeof uxl[i], "%s%s", xl[i], under[m][i] ? "*" : "");
            uxt[i] = uxl[i];
        }
        paint_heatmap h = {
            .title = title[m], .v = g.v[m], .nx = g.nx, .ny = g.ny,
            .x = { .label = "context length", .unit = "tokens" }, .y = { .label = "needle depth" },
            .xticks = any_under[m] ? uxt : xt, .yticks = yt,
            .value = { .label = "retrieved", .unit = "%", .min = 0, .max = 100 },
            .marks = g.mark_x >= 0 ? &mk : NULL, .n_marks = g.mark_x >= 0 ? 1 : 0,
            .mark_label = geo->cells ? "traced" : "case recorded in detail", .annotate = "%.0f",
        };
        int col = m % cols, row = m / cols, last = col == cols - 1 || m == g.nm - 1;
        h.no_colorbar = shared && !last;
        canvas_rect pr = { r.x + col * pw, r.y + row * rh,
                           col == cols - 1 && geo->cells ? r.w - col * pw : pw + (shared && last ? extra : 0), rh };
        if (geo->cells && col < cols - 1) pr.w -= 2; /* a gap, so one panel's header does not run into the next's */
        if (geo->cells && cols > 1) h.y.label = "depth";
        paint_result tmp;
        if (short_titles) { /* narrow panels: every title in the short form */
            char shorter[160];
            snprintf(shorter, sizeof shorter, "%s: %.0f%%", m == 0 && !g.name[0][0] ? "dense" : g.name[m],
                     g.total[m] ? 100.0 * g.hits[m] / g.total[m] : 0);
            const char *part = strstr(title[m], ", partial");
            if (!part) part = strstr(title[m], ", cut short");
            char *fl = strstr(title[m], ", *: under its floor");
            if (fl) fl[0] = 0; /* the short form: ", *: floor" */
            if (part && part != fl) snprintf(shorter + strlen(shorter), sizeof shorter - strlen(shorter), "%s", part);
            if (fl) snprintf(shorter + strlen(shorter), sizeof shorter - strlen(shorter), ", *: floor");
            snprintf(title[m], sizeof title[m], "%s", shorter);
        }
        if (!geo->cells && canvas_text_width(c, "context length (tokens)", CANVAS_FONT_BODY) > 0.6 * pw)
            h.x.label = "length";
        view_fit_text(c, CANVAS_FONT_TITLE, pr.w, title[m]);
        rc = paint_draw_heatmap(c, pr, &h, m == 0 ? &lres : m == 1 ? &rres : &tmp);
    }
    if (!rc && ph < r.h) {
        size_t at = (size_t)cy * g.nx + cx;
        char line[512], ln[16];
        len_label(g.len[cx], ln, sizeof ln);
        int len = snprintf(line, sizeof line, "length %s, depth %g%%:", ln, g.dep[cy]);
        for (int m = 0; m < g.nm && len < (int)sizeof line; m++)
            len += snprintf(line + len, sizeof line - len, "%s %s %.0f%%%s", m ? "," : "", g.name[m], g.v[m][at],
                            under[m][cx] ? " (under its floor)" : "");
        if (len < (int)sizeof line)
            snprintf(line + len, sizeof line - len, " of %d run%s", g.runs[0][at], g.runs[0][at] == 1 ? "" : "s");
        view_fit_text(c, CANVAS_FONT_BODY, r.w - (geo->cells ? 0 : 2 * geo->pad), line);
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
    int rc = grid_build(st, &g), nx = g.nx, ny = g.ny, nm = g.nm;
    grid_free(&g);
    if (rc) return 0;
    double pitch = nm > 1 ? res->legend.x - res->area.x : 0;
    for (int m = 0; m < nm; m++) {
        canvas_rect pa = res->area;
        pa.x += m * pitch;
        const canvas_rect *a = &pa;
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
    .help = "needle-in-a-haystack heatmap, context length x needle depth, one panel per method (skv needle --trace)",
    .draw = niah_draw,
    .move = niah_move,
    .click = niah_click,
    .needs = PROBE_NIAH,
};
