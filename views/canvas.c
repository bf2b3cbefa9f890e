/* canvas.c: the part of the canvas that every back end shares.
 *
 * It validates arguments (NaN and infinities never reach a back end),
 * keeps the clip rectangle inside the canvas, splits polylines at NaN, turns
 * a text anchor into the top-left corner of the text's box, and dispatches to
 * the back end's const ops table. Helpers for back ends live here too. */
#include "canvas_impl.h"

#include "skv.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static canvas_rect rect_intersect(canvas_rect a, canvas_rect b) {
    double x0 = fmax(a.x, b.x), y0 = fmax(a.y, b.y);
    double x1 = fmin(a.x + a.w, b.x + b.w), y1 = fmin(a.y + a.h, b.y + b.h);
    canvas_rect r = { x0, y0, fmax(0, x1 - x0), fmax(0, y1 - y0) };
    return r;
}

void canvas_init_base(canvas *c, const canvas_ops *ops, const canvas_theme *theme) {
    c->ops = ops;
    c->theme = *theme;
    c->clip = (canvas_rect){ 0, 0, c->geom.w, c->geom.h };
}

const canvas_geom *canvas_geometry(const canvas *c) { return &c->geom; }
const canvas_theme *canvas_get_theme(const canvas *c) { return &c->theme; }

void canvas_clear(canvas *c) {
    c->clip = (canvas_rect){ 0, 0, c->geom.w, c->geom.h };
    c->ops->clear(c, c->theme.bg);
}

canvas_rect canvas_clip(canvas *c, canvas_rect r) {
    canvas_rect old = c->clip;
    canvas_rect all = { 0, 0, c->geom.w, c->geom.h };
    if (!isfinite(r.x) || !isfinite(r.y) || !isfinite(r.w) || !isfinite(r.h)) r = (canvas_rect){ 0, 0, 0, 0 };
    c->clip = rect_intersect(r, all);
    return old;
}

canvas_rect canvas_get_clip(const canvas *c) { return c->clip; }

void canvas_fill_rect(canvas *c, double x, double y, double w, double h, canvas_color col) {
    if (col == CANVAS_NONE || !(w > 0) || !(h > 0) || !isfinite(x) || !isfinite(y)) return;
    canvas_rect r = rect_intersect((canvas_rect){ x, y, fmin(w, 1e9), fmin(h, 1e9) }, c->clip);
    if (r.w > 0 && r.h > 0) c->ops->fill_rect(c, r.x, r.y, r.w, r.h, col);
}

void canvas_line(canvas *c, double x0, double y0, double x1, double y1, double width, canvas_color col) {
    double xy[4] = { x0, y0, x1, y1 };
    canvas_polyline(c, xy, 2, width, col);
}

void canvas_polyline(canvas *c, const double *xy, int n, double width, canvas_color col) {
    if (col == CANVAS_NONE || !xy || n < 2) return;
    if (!(width > 0) || !isfinite(width)) width = c->geom.line_w;
    int i = 0;
    while (i < n) {
        while (i < n && !(isfinite(xy[2 * i]) && isfinite(xy[2 * i + 1]))) i++;
        int j = i;
        while (j < n && isfinite(xy[2 * j]) && isfinite(xy[2 * j + 1])) j++;
        if (j - i >= 2) c->ops->polyline(c, xy + 2 * i, j - i, width, col);
        else if (j - i == 1) c->ops->polyline(c, (const double[4]){ xy[2 * i], xy[2 * i + 1], xy[2 * i], xy[2 * i + 1] }, 2, width, col);
        i = j;
    }
}

void canvas_rule(canvas *c, double x0, double y0, double x1, double y1, canvas_color col, int flags) {
    if (col == CANVAS_NONE || !isfinite(x0) || !isfinite(y0) || !isfinite(x1) || !isfinite(y1)) return;
    if (x0 != x1 && y0 != y1) return; /* rules are axis-aligned; use canvas_line otherwise */
    if (x0 > x1) { double t = x0; x0 = x1; x1 = t; }
    if (y0 > y1) { double t = y0; y0 = y1; y1 = t; }
    c->ops->rule(c, x0, y0, x1, y1, col, flags);
}

double canvas_text_width(canvas *c, const char *utf8, int font) {
    if (!utf8 || !*utf8) return 0;
    if (font < 0 || font >= CANVAS_FONT_COUNT) font = CANVAS_FONT_BODY;
    return c->ops->text_width(c, utf8, font);
}

void canvas_font_metrics(canvas *c, int font, double *ascent, double *descent) {
    if (font < 0 || font >= CANVAS_FONT_COUNT) font = CANVAS_FONT_BODY;
    double a = 0, d = 0;
    c->ops->font_metrics(c, font, &a, &d);
    if (ascent) *ascent = a;
    if (descent) *descent = d;
}

double canvas_line_height(canvas *c, int font) {
    double a, d;
    canvas_font_metrics(c, font, &a, &d);
    return a + d;
}

double canvas_text(canvas *c, double x, double y, const char *utf8, int font, int align, canvas_color col) {
    if (!utf8 || !*utf8 || !isfinite(x) || !isfinite(y)) return 0;
    if (font < 0 || font >= CANVAS_FONT_COUNT) font = CANVAS_FONT_BODY;
    double w = c->ops->text_width(c, utf8, font), asc, desc;
    c->ops->font_metrics(c, font, &asc, &desc);
    if (col == CANVAS_NONE) return w;
    int h = CANVAS_HALIGN(align), v = CANVAS_VALIGN(align);
    if (align & CANVAS_VERTICAL) {
        double bw = asc + desc; /* the box on screen: bw wide, w tall */
        double left = h == CANVAS_CENTER ? x - bw / 2 : h == CANVAS_RIGHT ? x - bw : x;
        c->ops->text(c, left, y - w / 2, utf8, font, 1, col);
        return w;
    }
    double left = h == CANVAS_CENTER ? x - w / 2 : h == CANVAS_RIGHT ? x - w : x;
    double top = v == CANVAS_MIDDLE ? y - (asc + desc) / 2 : v == CANVAS_BASELINE ? y - asc
               : v == CANVAS_BOTTOM ? y - asc - desc : y;
    c->ops->text(c, left, top, utf8, font, 0, col);
    return w;
}

int canvas_save(canvas *c, const char *path, int force) {
    if (!c || !c->ops->save) return skv_error(SKV_EINVAL, "canvas_save: a %s canvas has no file form", c ? c->ops->name : "NULL");
    if (!path || !*path) return skv_error(SKV_EINVAL, "canvas_save: empty file name");
    return c->ops->save(c, path, force);
}

void canvas_free(canvas *c) {
    if (c) c->ops->free(c);
}

uint32_t canvas_utf8_next(const char **s) {
    const unsigned char *p = (const unsigned char *)*s;
    uint32_t cp;
    int n;
    if (p[0] < 0x80) { *s += 1; return p[0]; }
    if ((p[0] & 0xE0) == 0xC0) { cp = p[0] & 0x1F; n = 1; }
    else if ((p[0] & 0xF0) == 0xE0) { cp = p[0] & 0x0F; n = 2; }
    else if ((p[0] & 0xF8) == 0xF0) { cp = p[0] & 0x07; n = 3; }
    else { *s += 1; return 0xFFFD; }
    for (int i = 1; i <= n; i++) {
        if ((p[i] & 0xC0) != 0x80) { *s += i; return 0xFFFD; }
        cp = cp << 6 | (p[i] & 0x3F);
    }
    *s += n + 1;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return 0xFFFD;
    return cp;
}

int canvas_clip_segment(canvas_rect r, double *x0, double *y0, double *x1, double *y1) {
    double t0 = 0, t1 = 1, dx = *x1 - *x0, dy = *y1 - *y0;
    double p[4] = { -dx, dx, -dy, dy };
    double q[4] = { *x0 - r.x, r.x + r.w - *x0, *y0 - r.y, r.y + r.h - *y0 };
    for (int i = 0; i < 4; i++) {
        if (p[i] == 0) {
            if (q[i] < 0) return 0;
        } else {
            double t = q[i] / p[i];
            if (p[i] < 0) { if (t > t1) return 0; if (t > t0) t0 = t; }
            else { if (t < t0) return 0; if (t < t1) t1 = t; }
        }
    }
    double ax = *x0, ay = *y0;
    *x0 = ax + t0 * dx; *y0 = ay + t0 * dy;
    *x1 = ax + t1 * dx; *y1 = ay + t1 * dy;
    return 1;
}

void canvas_span_slots(double a, double b, double step, long *i0, long *i1) {
    double lo = ceil(a / step - 0.5), hi = ceil(b / step - 0.5);
    if (lo < -1e9) lo = -1e9;
    if (hi > 1e9) hi = 1e9;
    if (hi <= lo && b > a) { lo = floor((a + b) / 2 / step); hi = lo + 1; }
    *i0 = (long)lo;
    *i1 = (long)hi;
}

static double srgb_to_linear(double v) {
    return v <= 0.04045 ? v / 12.92 : pow((v + 0.055) / 1.055, 2.4);
}

double canvas_luma(canvas_color col) {
    if (col & 0xFF000000u) return 0.5;
    double r = ((col >> 16) & 255) / 255.0, g = ((col >> 8) & 255) / 255.0, b = (col & 255) / 255.0;
    return 0.2126 * srgb_to_linear(r) + 0.7152 * srgb_to_linear(g) + 0.0722 * srgb_to_linear(b);
}

/* The theme of exported figures (PNG and SVG): dark ink on white. */
const canvas_theme canvas_figure_theme = {
    .bg = CANVAS_RGB(0xff, 0xff, 0xff),
    .fg = CANVAS_RGB(0x1a, 0x1a, 0x1a),
    .muted = CANVAS_RGB(0x44, 0x44, 0x44),
    .axis = CANVAS_RGB(0x33, 0x33, 0x33),
    .grid = CANVAS_RGB(0xe4, 0xe4, 0xe4),
    .band = CANVAS_RGB(0xe9, 0xe9, 0xe9),
    .highlight = CANVAS_RGB(0x00, 0x00, 0x00),
};
