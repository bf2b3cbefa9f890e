/* paint.c: shared painters (plot, heatmap, raster, strip, gantt, table) and
 * the palette, drawn through the canvas interface only.
 *
 * Every painter works the same way: a frame layout decides, from the
 * canvas's font metrics and sizes, where the title, legend, axis labels,
 * tick labels and the data area go (dropping the least important parts
 * when the rectangle is small), then the data is drawn clipped to the data
 * area, then the furniture around it. Layout positions are whole units
 * (pixels or cells), so rules stay crisp and text lands on cell rows.
 * Colours for data come from the palette at the end of this file. */
#include "paint.h"
#include "skv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TICKS 24
#define MAX_MINOR 96

/* The canvas and the sizes every layout step needs. */
typedef struct lay {
    canvas *c;
    const canvas_geom *g;
    const canvas_theme *th;
    double lh_s, lh_b, lh_t;    /* line heights: small, body, title */
    double gap;                 /* gap between legend items, table columns */
} lay;

static void lay_init(lay *L, canvas *c) {
    L->c = c;
    L->g = canvas_geometry(c);
    L->th = canvas_get_theme(c);
    L->lh_s = canvas_line_height(c, CANVAS_FONT_SMALL);
    L->lh_b = canvas_line_height(c, CANVAS_FONT_BODY);
    L->lh_t = canvas_line_height(c, CANVAS_FONT_TITLE);
    L->gap = L->g->cells ? 2 : round(L->g->em * 1.2);
}

static canvas_color pick(canvas_color c, canvas_color dflt) { return c == PAINT_AUTO ? dflt : c; }

/* Mixes a toward b by t in [0, 1] (special colours are returned as they are). */
static canvas_color mix(canvas_color a, canvas_color b, double t) {
    if ((a | b) & 0xFF000000u) return a;
    int r = (int)lround(((a >> 16) & 255) * (1 - t) + ((b >> 16) & 255) * t);
    int g = (int)lround(((a >> 8) & 255) * (1 - t) + ((b >> 8) & 255) * t);
    int bl = (int)lround((a & 255) * (1 - t) + (b & 255) * t);
    return CANVAS_RGB(r, g, bl);
}

/* The painter's rectangle shrunk to whole units and to the canvas. */
static canvas_rect snap_rect(const canvas_geom *g, canvas_rect r) {
    if (!isfinite(r.x) || !isfinite(r.y) || !isfinite(r.w) || !isfinite(r.h)) return (canvas_rect){ 0, 0, 0, 0 };
    double x0 = fmax(0, ceil(r.x - 1e-9)), y0 = fmax(0, ceil(r.y - 1e-9));
    double x1 = fmin(g->w, floor(r.x + r.w + 1e-9)), y1 = fmin(g->h, floor(r.y + r.h + 1e-9));
    return (canvas_rect){ x0, y0, fmax(0, x1 - x0), fmax(0, y1 - y0) };
}

static canvas_rect rect_meet(canvas_rect a, canvas_rect b) {
    double x0 = fmax(a.x, b.x), y0 = fmax(a.y, b.y);
    double x1 = fmin(a.x + a.w, b.x + b.w), y1 = fmin(a.y + a.h, b.y + b.h);
    return (canvas_rect){ x0, y0, fmax(0, x1 - x0), fmax(0, y1 - y0) };
}

static void result_init(paint_result *res, canvas_rect r) {
    memset(res, 0, sizeof *res);
    res->area = (canvas_rect){ r.x, r.y, 0, 0 };
    res->axis_x = res->axis_y = NAN;
    res->x0 = res->y0 = 0;
    res->x1 = res->y1 = 1;
    for (int i = 0; i < PAINT_MAX_MARKERS; i++) res->marker_x[i] = NAN;
}

/* Where v falls between lo and hi, 0..1, on a linear or log10 scale (NaN when it cannot be placed). */
static double frac(double v, double lo, double hi, int lg) {
    if (lg) {
        if (!(v > 0) || !(lo > 0) || !(hi > 0)) return NAN;
        return (log10(v) - log10(lo)) / (log10(hi) - log10(lo));
    }
    return (v - lo) / (hi - lo);
}

double paint_map_x(const paint_result *r, double v) {
    double f = frac(v, r->x0, r->x1, r->xlog);
    return isfinite(f) ? r->area.x + f * r->area.w : NAN;
}

double paint_map_y(const paint_result *r, double v) {
    double f = frac(v, r->y0, r->y1, r->ylog);
    if (!isfinite(f)) return NAN;
    return r->ydown ? r->area.y + f * r->area.h : r->area.y + r->area.h - f * r->area.h;
}

/* "label (unit)", or just one of them. */
static const char *axis_text(const paint_axis *a, char *buf, size_t n) {
    const char *l = a->label && *a->label ? a->label : NULL, *u = a->unit && *a->unit ? a->unit : NULL;
    if (l && u) snprintf(buf, n, "%s (%s)", l, u);
    else if (l) snprintf(buf, n, "%s", l);
    else if (u) snprintf(buf, n, "%s", u);
    else return NULL;
    return buf;
}

/* Copies s into buf, cut with an ellipsis so that it is at most maxw wide. */
static const char *fit_text(lay *L, const char *s, int font, double maxw, char *buf, size_t n) {
    snprintf(buf, n, "%s", s ? s : "");
    if (canvas_text_width(L->c, buf, font) <= maxw) return buf;
    const char *ell = L->g->ascii ? "~" : "\xe2\x80\xa6";
    size_t len = strlen(buf);
    while (len > 0) {
        do len--; while (len > 0 && ((unsigned char)buf[len] & 0xC0) == 0x80);
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%.*s%s", (int)len, buf, ell);
        if (canvas_text_width(L->c, tmp, font) <= maxw) { snprintf(buf, n, "%s", tmp); return buf; }
    }
    buf[0] = 0;
    return buf;
}

/* ---------------------------------------------------------------- ticks */

typedef struct ticks {
    int n;
    double v[MAX_TICKS];
    char s[MAX_TICKS][40];
    double maxw;            /* widest label */
    int nminor;
    double minor[MAX_MINOR];
} ticks;

/* The smallest of 1, 2, 5 times a power of ten that is >= x. */
static double nice_step(double x) {
    double e = pow(10, floor(log10(x))), f = x / e;
    return (f <= 1 + 1e-9 ? 1 : f <= 2 + 1e-9 ? 2 : f <= 5 + 1e-9 ? 5 : 10) * e;
}

/* Writes n as UTF-8 superscript digits (with a superscript minus). */
static void superscript(int n, char *buf, size_t cap) {
    static const char *digit[10] = { "\xe2\x81\xb0", "\xc2\xb9", "\xc2\xb2", "\xc2\xb3", "\xe2\x81\xb4",
                                     "\xe2\x81\xb5", "\xe2\x81\xb6", "\xe2\x81\xb7", "\xe2\x81\xb8", "\xe2\x81\xb9" };
    char d[16];
    snprintf(d, sizeof d, "%d", n < 0 ? -n : n);
    size_t k = 0;
    buf[0] = 0;
    if (n < 0) k += (size_t)snprintf(buf + k, cap - k, "\xe2\x81\xbb");
    for (char *p = d; *p && k < cap; p++) k += (size_t)snprintf(buf + k, cap - k, "%s", digit[*p - '0']);
}

/* Replaces a leading '-' by a typographic minus (U+2212) unless ascii. */
static void minus_sign(char *buf, size_t cap, int ascii) {
    if (ascii || buf[0] != '-') return;
    size_t len = strlen(buf);
    if (len + 3 >= cap) return;
    memmove(buf + 3, buf + 1, len);
    memcpy(buf, "\xe2\x88\x92", 3);
}

/* Formats v on an axis whose ticks are step apart; big is the largest
 * |value| on the axis, which picks a k/M/G suffix for all its labels. */
static void fmt_linear(double v, double step, double big, int ascii, char *buf, size_t cap) {
    const char *suffix = "";
    double div = 1;
    if (big >= 1e4 && step >= 1e9 - 1e-3 && fmod(step, 1e9) == 0) { div = 1e9; suffix = "G"; }
    else if (big >= 1e4 && step >= 1e6 && fmod(step, 1e6) == 0) { div = 1e6; suffix = "M"; }
    else if (big >= 1e4 && step >= 1e3 && fmod(step, 1e3) == 0) { div = 1e3; suffix = "k"; }
    v /= div;
    step /= div;
    if (fabs(v) < step * 1e-6) v = 0;
    int dec = 0;
    while (dec < 8 && fabs(step * pow(10, dec) - round(step * pow(10, dec))) > 1e-6 * step * pow(10, dec)) dec++;
    snprintf(buf, cap, "%.*f%s", dec, v, suffix);
    minus_sign(buf, cap, ascii);
}

/* 10^d as a label: plain digits near 1, else 10 with a superscript (1e-5 in ascii). */
static void fmt_pow10(int d, int plain, int ascii, char *buf, size_t cap) {
    if (plain) {
        if (d >= 0) snprintf(buf, cap, "%.0f", pow(10, d));
        else snprintf(buf, cap, "%.*f", -d, pow(10, d));
    } else if (ascii) {
        snprintf(buf, cap, "1e%d", d);
    } else {
        memcpy(buf, "10", 3);
        if (cap > 2) superscript(d, buf + 2, cap - 2);
    }
}

/* True when labels at these positions (canvas units along the axis) do not
 * collide: horizontally by their widths, vertically by the line height. */
static int ticks_fit(lay *L, const ticks *t, double lo, double hi, int lg, double length, int horizontal) {
    double prev_end = -INFINITY;
    /* on a terminal, row labels need only their own rows (no blank row between) */
    double need = horizontal ? (L->g->cells ? 2 : L->g->em) : (L->g->cells ? 0 : L->lh_s * 0.6);
    for (int i = 0; i < t->n; i++) {
        double p = frac(t->v[i], lo, hi, lg) * length;
        double half = horizontal ? canvas_text_width(L->c, t->s[i], CANVAS_FONT_SMALL) / 2 : L->lh_s / 2;
        if (p - half < prev_end + need) return 0;
        prev_end = p + half;
    }
    return 1;
}

static void ticks_measure(lay *L, ticks *t) {
    t->maxw = 0;
    for (int i = 0; i < t->n; i++) t->maxw = fmax(t->maxw, canvas_text_width(L->c, t->s[i], CANVAS_FONT_SMALL));
}

/* Linear ticks at 1-2-5 steps: the most that fit without their labels colliding. */
static void ticks_linear(lay *L, ticks *t, double lo, double hi, double length, int horizontal, int lg,
                         int integer) {
    double big = fmax(fabs(lo), fabs(hi));
    double unit = horizontal ? (L->g->cells ? 6 : L->g->em * 3.5) : (L->g->cells ? 2 : L->lh_s * 1.6);
    int kmax = (int)fmin(10, fmax(1, floor(length / unit)));
    for (int k = kmax; k >= 1; k--) {
        double step = nice_step((hi - lo) / k);
        if (integer && step < 1) step = 1;   /* whole numbers only */
        if (!(step > 0) || !isfinite(step)) break;
        t->n = 0;
        for (double v = ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9 && t->n < MAX_TICKS; v += step) {
            if (lg && v <= 0) continue;
            t->v[t->n] = fabs(v) < step * 1e-9 ? 0 : v;
            fmt_linear(t->v[t->n], step, big, L->g->ascii, t->s[t->n], sizeof t->s[0]);
            t->n++;
        }
        if (ticks_fit(L, t, lo, hi, lg, length, horizontal)) return;
    }
    t->n = 0; /* not even one label fits */
}

/* Log ticks: decades (every k-th when crowded) with minor ticks at 2..9 on
 * PNG; within less than two decades, 1-2-5 mantissas; else linear. */
static void ticks_log(lay *L, ticks *t, double lo, double hi, double length, int horizontal) {
    double llo = log10(lo), lhi = log10(hi);
    int d0 = (int)ceil(llo - 1e-9), d1 = (int)floor(lhi + 1e-9);
    int plain = d0 >= -3 && d1 <= 4;
    if (d1 - d0 >= 1) {
        static const int ksteps[] = { 1, 2, 3, 5, 10, 20, 50, 100 };
        for (size_t ki = 0; ki < sizeof ksteps / sizeof ksteps[0]; ki++) {
            int k = ksteps[ki];
            t->n = 0;
            for (int d = (int)ceil(d0 / (double)k) * k; d <= d1 && t->n < MAX_TICKS; d += k) {
                t->v[t->n] = pow(10, d);
                fmt_pow10(d, plain, L->g->ascii, t->s[t->n], sizeof t->s[0]);
                t->n++;
            }
            if (t->n >= 1 && ticks_fit(L, t, lo, hi, 1, length, horizontal)) {
                double per_decade = length / (lhi - llo);
                if (k == 1 && !L->g->cells && per_decade >= 6 * L->g->tick)
                    for (int d = d0 - 1; d <= d1 && t->nminor < MAX_MINOR; d++)
                        for (int m = 2; m <= 9 && t->nminor < MAX_MINOR; m++) {
                            double v = m * pow(10, d);
                            if (v >= lo && v <= hi) t->minor[t->nminor++] = v;
                        }
                return;
            }
        }
    }
    static const int mant[] = { 1, 2, 5 };
    t->n = 0;
    for (int d = d0 - 1; d <= d1 && t->n < MAX_TICKS; d++)
        for (int m = 0; m < 3 && t->n < MAX_TICKS; m++) {
            double v = mant[m] * pow(10, d);
            if (v < lo * (1 - 1e-9) || v > hi * (1 + 1e-9)) continue;
            t->v[t->n] = v;
            fmt_linear(v, pow(10, d), hi, L->g->ascii, t->s[t->n], sizeof t->s[0]);
            t->n++;
        }
    if (t->n >= 2 && ticks_fit(L, t, lo, hi, 1, length, horizontal)) return;
    ticks_linear(L, t, lo, hi, length, horizontal, 1, 0);
}

/* Ticks and their labels for an axis of the given length (canvas units). */
/* lg: bit 0 a log axis, bit 1 whole-number ticks (paint_axis.integer). */
static void make_ticks(lay *L, ticks *t, double lo, double hi, int lg, double length, int horizontal) {
    int integer = lg >> 1;
    lg &= 1;
    memset(t, 0, sizeof *t);
    if (!(length > 0) || !(hi > lo)) return;
    if (lg) ticks_log(L, t, lo, hi, length, horizontal);
    else ticks_linear(L, t, lo, hi, length, horizontal, 0, integer);
    ticks_measure(L, t);
}

/* Ticks at the values a->at (those inside [lo, hi]), labelled %g, when they
 * fit without colliding; 0 (t untouched) otherwise. */
static int ticks_at(lay *L, ticks *t, const paint_axis *a, double lo, double hi, double length, int horizontal) {
    if (!a->at || a->n_at <= 0 || !(hi > lo)) return 0;
    ticks u;
    memset(&u, 0, sizeof u);
    for (int i = 0; i < a->n_at && u.n < MAX_TICKS; i++) {
        double v = a->at[i];
        if (!(v >= lo && v <= hi) || (a->log && v <= 0)) continue;
        u.v[u.n] = v;
        snprintf(u.s[u.n], sizeof u.s[0], "%g", v);
        u.n++;
    }
    if (!u.n || !ticks_fit(L, &u, lo, hi, a->log, length, horizontal)) return 0;
    ticks_measure(L, &u);
    *t = u;
    return 1;
}

/* Ticks at cell centres from per-cell labels, every k-th so they do not collide. */
static void make_label_ticks(lay *L, ticks *t, const char *const *labels, int n, double length, int horizontal) {
    memset(t, 0, sizeof *t);
    if (n <= 0 || !(length > 0)) return;
    for (int k = 1; k <= n; k++) {
        if ((n + k - 1) / k > MAX_TICKS) continue;
        t->n = 0;
        for (int i = 0; i < n; i += k) {
            t->v[t->n] = i + 0.5;
            snprintf(t->s[t->n], sizeof t->s[0], "%s", labels[i] ? labels[i] : "");
            t->n++;
        }
        if (ticks_fit(L, t, 0, n, 0, length, horizontal)) { ticks_measure(L, t); return; }
    }
    t->n = 0;
}

/* --------------------------------------------------------------- legend */

enum { SW_LINE, SW_BOX, SW_MARK };

typedef struct legend_item {
    int kind;               /* SW_* */
    canvas_color color;
    double width;           /* line width for SW_LINE */
    const char *text;
    const char *glyph;      /* SW_BOX on a colourless terminal: the category's glyph, or NULL */
} legend_item;

const char *paint_cat_glyph(int i) {
    static const char *const g[] = { "#", "o", "x", "+", "=", "*", "%", "@" };
    return g[((i % 8) + 8) % 8];
}

static double swatch_w(lay *L, int kind) {
    if (L->g->cells) return kind == SW_LINE ? 2 : 1;
    return kind == SW_LINE ? round(L->g->em * 1.8) : kind == SW_MARK ? round(L->lh_s * 0.9) : round(L->lh_s * 0.7);
}

static double item_w(lay *L, const legend_item *it) {
    double pad = L->g->cells ? 1 : L->g->pad;
    return swatch_w(L, it->kind) + pad + canvas_text_width(L->c, it->text, CANVAS_FONT_SMALL);
}

/* A frame of thickness t just inside b, from filled rectangles. */
static void draw_frame(lay *L, canvas_rect b, double t, canvas_color col) {
    if (b.w <= 0 || b.h <= 0) return;
    if (b.w <= 2 * t || b.h <= 2 * t) { canvas_fill_rect(L->c, b.x, b.y, b.w, b.h, col); return; }
    canvas_fill_rect(L->c, b.x, b.y, b.w, t, col);
    canvas_fill_rect(L->c, b.x, b.y + b.h - t, b.w, t, col);
    canvas_fill_rect(L->c, b.x, b.y + t, t, b.h - 2 * t, col);
    canvas_fill_rect(L->c, b.x + b.w - t, b.y + t, t, b.h - 2 * t, col);
}

/* An outlined cell marker: a dark frame with a light one inside, visible
 * on any colour; on cells a diamond glyph. */
static void draw_mark(lay *L, canvas_rect b) {
    if (L->g->cells) {
        canvas_text(L->c, b.x + b.w / 2, b.y + b.h / 2, L->g->ascii ? "*" : "\xe2\x97\x86", CANVAS_FONT_BOLD,
                    CANVAS_CENTER | CANVAS_MIDDLE, CANVAS_RGB(0xff, 0xff, 0xff));
        return;
    }
    double t = L->g->hair, w = fmax(2, 2 * t);
    canvas_color dark = CANVAS_RGB(0, 0, 0), light = CANVAS_RGB(0xff, 0xff, 0xff);
    draw_frame(L, b, w, dark);
    draw_frame(L, (canvas_rect){ b.x + w, b.y + w, b.w - 2 * w, b.h - 2 * w }, t, light);
}

static void draw_swatch(lay *L, const legend_item *it, double x, double ymid) {
    double w = swatch_w(L, it->kind);
    if (it->kind == SW_LINE) {
        if (L->g->cells) canvas_rule(L->c, x, ymid, x + w, ymid, it->color, 0);
        else canvas_line(L->c, x, ymid, x + w, ymid, it->width, it->color);
    } else if (it->kind == SW_BOX && it->color == CANVAS_NONE) { /* a background category: a hollow box */
        if (L->g->cells)
            canvas_text(L->c, x, floor(ymid), L->g->ascii ? "o" : "\xe2\x96\xa1", CANVAS_FONT_SMALL, CANVAS_LEFT | CANVAS_TOP, L->th->fg);
        else
            draw_frame(L, (canvas_rect){ x, round(ymid - w / 2), w, w }, L->g->hair, L->th->axis);
    } else if (it->kind == SW_BOX && L->g->mono && it->glyph) {
        canvas_text(L->c, x, floor(ymid), it->glyph, CANVAS_FONT_BOLD, CANVAS_LEFT | CANVAS_TOP, L->th->fg);
    } else if (it->kind == SW_BOX) {
        double h = L->g->cells ? 1 : w;
        canvas_fill_rect(L->c, x, L->g->cells ? floor(ymid) : round(ymid - h / 2), w, h, it->color);
    } else {
        double h = L->g->cells ? 1 : round(L->lh_s * 0.9);
        canvas_rect b = { x, L->g->cells ? floor(ymid) : round(ymid - h / 2), L->g->cells ? 1 : h, h };
        draw_mark(L, b); /* the outline alone: marked cells keep their own colours, so the swatch has none */
    }
}

/* Flows legend items into centred rows of width w starting at (x, y);
 * draws them when draw; returns the height used (0 when n == 0). */
static double legend_flow(lay *L, const legend_item *it, int n, double x, double y, double w, int draw,
                          canvas_rect *box) {
    if (n <= 0 || !(w > 0)) return 0;
    double rowh = L->g->cells ? 1 : round(L->lh_s * 1.25), h = 0;
    double bx0 = INFINITY, bx1 = -INFINITY;
    int i = 0;
    while (i < n) {
        int j = i;
        double rw = item_w(L, &it[i]);
        while (j + 1 < n && rw + L->gap + item_w(L, &it[j + 1]) <= w) rw += L->gap + item_w(L, &it[++j]);
        double cx = x + fmax(0, floor((w - rw) / 2));
        bx0 = fmin(bx0, cx);
        bx1 = fmax(bx1, cx + rw);
        if (draw) {
            double ymid = y + h + rowh / 2, pad = L->g->cells ? 1 : L->g->pad;
            for (int k = i; k <= j; k++) {
                draw_swatch(L, &it[k], cx, ymid);
                double tx = cx + swatch_w(L, it[k].kind) + pad;
                canvas_text(L->c, tx, ymid, it[k].text, CANVAS_FONT_SMALL, CANVAS_LEFT | CANVAS_MIDDLE, L->th->fg);
                cx += item_w(L, &it[k]) + L->gap;
            }
        }
        h += rowh;
        i = j + 1;
    }
    if (box) *box = (canvas_rect){ bx0, y, bx1 - bx0, h };
    return h;
}

/* ---------------------------------------------------------------- frame */

/* The layout around a data area: which parts are shown and where. */
typedef struct frame {
    /* in */
    const char *title;
    const legend_item *leg; int nleg;
    const char *xlabel, *ylabel, *rlabel; /* rlabel: colour bar label */
    int xticks;             /* a row of x tick labels under the area */
    int axis;               /* axis lines along the bottom and left of the area */
    double right_w;         /* width right of the area (colour bar), 0 for none */
    double max_h;           /* the area's preferred largest height, 0 for any */
    double right_pad;       /* room right of the area for the last x label */
    int want_caption;       /* cells: keep a row above the area even without labels */
    /* out */
    canvas_rect r, area;
    double y_title, y_legend, y_caption, y_xticks, y_xlabel, legend_h;
    int show_title, show_legend, show_caption, show_xticks, show_xlabel, show_ylabel, show_rlabel, show_right;
    int complete;
} frame;

/* Decides the vertical layout: rows above and below the area. Parts are
 * dropped, least important first, until the area is at least min_h. */
static void frame_vertical(lay *L, frame *f) {
    const canvas_geom *g = L->g;
    int cells = g->cells;
    double pad = g->pad, min_h = cells ? 2 : fmax(2 * L->lh_s, 3 * g->em);
    f->show_title = f->title && *f->title;
    f->show_legend = f->nleg > 0;
    f->show_xticks = f->xticks;
    f->show_xlabel = f->xlabel != NULL;
    f->show_ylabel = f->ylabel != NULL;
    f->show_rlabel = f->rlabel != NULL;
    f->legend_h = legend_flow(L, f->leg, f->nleg, f->r.x, 0, f->r.w - (cells ? 0 : 2 * pad), 0, NULL);
    f->complete = 1;
    for (int pass = 0; pass < 6; pass++) {
        f->show_caption = cells && (f->show_ylabel || f->show_rlabel || f->want_caption);
        double top = cells ? 0 : pad, bot = cells ? 0 : pad;
        if (f->show_title) top += L->lh_t + (cells ? 0 : pad);
        if (f->show_legend) top += f->legend_h + (cells ? 0 : pad);
        if (f->show_caption) top += 1;
        if (!cells) top += L->lh_s / 2; /* the top y tick label sticks out above the area */
        if (f->axis) bot += g->hair;
        if (f->show_xticks) bot += cells ? 1 : g->tick + pad + L->lh_s;
        if (f->show_xlabel) bot += cells ? 1 : pad + L->lh_b;
        top = ceil(top);
        bot = ceil(bot);
        double avail = f->r.h - top - bot;
        if (avail >= min_h || pass == 5) {
            double h = avail;
            if (f->max_h > 0 && h > f->max_h) h = f->max_h;
            f->area.y = f->r.y + top;
            f->area.h = fmax(0, floor(h));
            double y = f->r.y + (cells ? 0 : pad);
            if (f->show_title) { f->y_title = y; y += L->lh_t + (cells ? 0 : pad); }
            if (f->show_legend) { f->y_legend = y; y += f->legend_h + (cells ? 0 : pad); }
            f->y_caption = y;
            double b = f->area.y + f->area.h + (f->axis ? g->hair : 0);
            if (f->show_xticks) { f->y_xticks = cells ? b : b + g->tick + pad; b = f->y_xticks + L->lh_s; }
            f->y_xlabel = cells ? b : b + pad;
            return;
        }
        f->complete = 0;
        if (f->show_xlabel) f->show_xlabel = 0;
        else if (f->show_legend) f->show_legend = 0;
        else if (f->show_caption) f->show_ylabel = f->show_rlabel = f->want_caption = 0;
        else if (f->show_title) f->show_title = 0;
        else if (f->show_xticks) f->show_xticks = 0;
    }
}

/* Decides the horizontal layout, given the width of the y tick labels. */
static void frame_horizontal(lay *L, frame *f, double ytick_w) {
    const canvas_geom *g = L->g;
    int cells = g->cells;
    double pad = g->pad, min_w = cells ? 6 : 4 * g->em;
    int show_yticks = ytick_w > 0;
    f->show_right = f->right_w > 0;
    int show_ylabel = f->show_ylabel && !cells;
    for (int pass = 0; pass < 4; pass++) {
        double left = cells ? 0 : pad, right = cells ? 0 : pad;
        if (show_ylabel) left += L->lh_b + pad;
        if (show_yticks) left += ytick_w + (cells ? 1 : pad + g->tick);
        else if (!cells && f->axis) left += g->tick;
        if (f->axis) left += g->hair;
        if (f->show_right) right += f->right_w;
        right = fmax(right, f->right_pad);
        left = ceil(left);
        right = ceil(right);
        if (f->r.w - left - right >= min_w || pass == 3) {
            f->area.x = f->r.x + left;
            f->area.w = fmax(0, floor(f->r.w - left - right));
            if (!cells) f->show_ylabel = show_ylabel;
            if (!show_yticks && ytick_w > 0) f->complete = 0;
            return;
        }
        f->complete = 0;
        if (show_ylabel) show_ylabel = 0;
        else if (f->show_right) f->show_right = 0;
        else show_yticks = 0;
    }
}

static void draw_title(lay *L, frame *f, paint_result *res) {
    if (!f->show_title) return;
    double cx = f->area.w > 0 ? f->area.x + f->area.w / 2 : f->r.x + f->r.w / 2;
    double w = canvas_text_width(L->c, f->title, CANVAS_FONT_TITLE);
    if (cx - w / 2 < f->r.x) cx = f->r.x + w / 2;
    if (cx + w / 2 > f->r.x + f->r.w) cx = fmax(f->r.x + w / 2, f->r.x + f->r.w - w / 2);
    if (L->g->cells) cx = f->r.x + floor((f->r.w - w) / 2) + w / 2;
    canvas_text(L->c, cx, f->y_title, f->title, CANVAS_FONT_TITLE, CANVAS_CENTER | CANVAS_TOP, L->th->fg);
    res->title = (canvas_rect){ cx - w / 2, f->y_title, w, L->lh_t };
}

static void draw_legend(lay *L, frame *f, paint_result *res) {
    if (!f->show_legend) return;
    double pad = L->g->cells ? 0 : L->g->pad;
    legend_flow(L, f->leg, f->nleg, f->r.x + pad, f->y_legend, f->r.w - 2 * pad, 1, &res->legend);
}

/* Axis labels: x centred under the area; y rotated at the left on PNG, and
 * on cells written in the caption row above the area with rlabel at the right. */
static void draw_axis_labels(lay *L, frame *f) {
    if (f->show_xlabel && f->xlabel)
        canvas_text(L->c, f->area.x + f->area.w / 2, f->y_xlabel, f->xlabel, CANVAS_FONT_BODY,
                    CANVAS_CENTER | CANVAS_TOP, L->th->fg);
    if (L->g->cells) {
        if (f->show_caption && f->show_ylabel && f->ylabel)
            canvas_text(L->c, f->r.x, f->y_caption, f->ylabel, CANVAS_FONT_BODY, CANVAS_LEFT | CANVAS_TOP, L->th->fg);
        if (f->show_caption && f->show_rlabel && f->rlabel && f->show_right)
            canvas_text(L->c, f->r.x + f->r.w, f->y_caption, f->rlabel, CANVAS_FONT_BODY, CANVAS_RIGHT | CANVAS_TOP,
                        L->th->fg);
    } else if (f->show_ylabel && f->ylabel) {
        canvas_text(L->c, f->r.x + L->g->pad, f->area.y + f->area.h / 2, f->ylabel, CANVAS_FONT_BODY,
                    CANVAS_VERTICAL | CANVAS_LEFT, L->th->fg);
    }
}

/* Tick marks and labels along the bottom of the area; pos maps a tick value
 * to a fraction of the width. With an axis line the ticks start on it. */
static void draw_xticks(lay *L, frame *f, const ticks *t, double lo, double hi, int lg, int marks) {
    const canvas_geom *g = L->g;
    double base = f->area.y + f->area.h + (f->axis ? g->hair / 2 : 0);
    for (int i = 0; i < t->n; i++) {
        double x = f->area.x + frac(t->v[i], lo, hi, lg) * f->area.w;
        if (g->cells) x = fmin(floor(x), f->area.x + f->area.w - 1) + 0.5; /* the cell column holding x */
        if (marks && (f->axis || !g->cells)) canvas_rule(L->c, x, base, x, base + g->tick, L->th->axis, 0);
        if (f->show_xticks)
            canvas_text(L->c, x, f->y_xticks, t->s[i], CANVAS_FONT_SMALL, CANVAS_CENTER | CANVAS_TOP, L->th->muted);
    }
    if (marks && !g->cells)
        for (int i = 0; i < t->nminor; i++) {
            double x = f->area.x + frac(t->minor[i], lo, hi, lg) * f->area.w;
            canvas_rule(L->c, x, base, x, base + g->tick * 0.55, L->th->axis, 0);
        }
}

/* Tick marks and labels along the left of the area (ydown: top to bottom). */
static void draw_yticks(lay *L, frame *f, const ticks *t, double lo, double hi, int lg, int ydown, int marks) {
    const canvas_geom *g = L->g;
    double base = f->area.x - (f->axis ? g->hair / 2 : 0);
    for (int i = 0; i < t->n; i++) {
        double fr = frac(t->v[i], lo, hi, lg);
        double y = ydown ? f->area.y + fr * f->area.h : f->area.y + f->area.h - fr * f->area.h;
        if (g->cells) y = fmin(floor(y), f->area.y + f->area.h - 1) + 0.5; /* the cell row holding y */
        if (marks && (f->axis || !g->cells)) canvas_rule(L->c, base - g->tick, y, base, y, L->th->axis, 0);
        double tx = g->cells ? f->area.x - 1 : base - g->tick - g->pad;
        canvas_text(L->c, tx, y, t->s[i], CANVAS_FONT_SMALL, CANVAS_RIGHT | CANVAS_MIDDLE, L->th->muted);
    }
    if (marks && !g->cells)
        for (int i = 0; i < t->nminor; i++) {
            double fr = frac(t->minor[i], lo, hi, lg);
            double y = ydown ? f->area.y + fr * f->area.h : f->area.y + f->area.h - fr * f->area.h;
            canvas_rule(L->c, base - g->tick * 0.55, y, base, y, L->th->axis, 0);
        }
}

/* The L-shaped axis: left and bottom lines just outside the area, meeting
 * at the corner (a rule ending at the other's centre line). */
static void draw_axis_lines(lay *L, frame *f, paint_result *res) {
    double h2 = L->g->hair / 2, ax = f->area.x - h2, ay = f->area.y + f->area.h + h2;
    canvas_rule(L->c, ax, f->area.y, ax, ay, L->th->axis, 0);
    canvas_rule(L->c, ax, ay, f->area.x + f->area.w, ay, L->th->axis, 0);
    res->axis_x = ax;
    res->axis_y = ay;
}

/* ----------------------------------------------------------- colour bar */

typedef struct cbar {
    double lo, hi;
    int lg;
    ticks t;
    double bar_w, gap;
} cbar;

static double cbar_width(lay *L, cbar *cb, const char *label) {
    const canvas_geom *g = L->g;
    cb->bar_w = g->cells ? 2 : round(g->em);
    cb->gap = g->cells ? 1 : round(g->em);
    double w = cb->gap + cb->bar_w + (g->cells ? 1 : g->tick + g->pad) + cb->t.maxw;
    if (label && !g->cells) w += g->pad + L->lh_b;
    return w;
}

/* A vertical ramp (low at the bottom) with ticks and labels at its right. */
static void draw_cbar(lay *L, frame *f, cbar *cb, const char *label, paint_result *res) {
    const canvas_geom *g = L->g;
    canvas_rect bar = { f->area.x + f->area.w + cb->gap, f->area.y, cb->bar_w, f->area.h };
    if (bar.h <= 0) return;
    long n = (long)fmax(1, floor(bar.h / g->fill_h));
    if (n > 4096) n = 4096;
    for (long i = 0; i < n; i++) {
        double y0 = bar.y + bar.h - (i + 1) * bar.h / n;
        canvas_fill_rect(L->c, bar.x, y0, bar.w, bar.h / n, palette_viridis((i + 0.5) / n));
    }
    res->colorbar = bar;
    for (int i = 0; i < cb->t.n; i++) {
        double y = bar.y + bar.h - frac(cb->t.v[i], cb->lo, cb->hi, cb->lg) * bar.h;
        double x = bar.x + bar.w;
        if (!g->cells) canvas_rule(L->c, x, y, x + g->tick, y, L->th->axis, 0);
        double ty = g->cells ? fmin(floor(y), bar.y + bar.h - 1) + 0.5 : y;
        canvas_text(L->c, x + (g->cells ? 1 : g->tick + g->pad), ty, cb->t.s[i], CANVAS_FONT_SMALL,
                    CANVAS_LEFT | CANVAS_MIDDLE, L->th->muted);
    }
    if (label && !g->cells)
        canvas_text(L->c, bar.x + bar.w + g->tick + g->pad + cb->t.maxw + g->pad, bar.y + bar.h / 2, label,
                    CANVAS_FONT_BODY, CANVAS_VERTICAL | CANVAS_LEFT, L->th->fg);
}

/* Colour-bar range and ticks: from the axis if set, else from the data. */
static void cbar_setup(lay *L, cbar *cb, const paint_axis *a, const float *v, long n, double length) {
    double lo = INFINITY, hi = -INFINITY;
    for (long i = 0; i < n; i++)
        if (isfinite(v[i]) && (!a->log || v[i] > 0)) { lo = fmin(lo, v[i]); hi = fmax(hi, v[i]); }
    if (a->min < a->max && (!a->log || a->min > 0)) { lo = a->min; hi = a->max; }
    if (!(lo <= hi)) { lo = a->log ? 1 : 0; hi = a->log ? 10 : 1; }
    if (lo == hi) { if (a->log) { lo /= 2; hi *= 2; } else { lo -= 0.5; hi += 0.5; } }
    cb->lo = lo;
    cb->hi = hi;
    cb->lg = a->log;
    make_ticks(L, &cb->t, lo, hi, a->log | a->integer << 1, length, 0);
    /* too short for nice ticks, or (a terminal) room for two at most: label
     * the ends, so the range shown is the range coloured */
    if ((cb->t.n < 2 || (L->g->cells && cb->t.n < 3)) && length >= 2 * (L->g->cells ? 1 : L->lh_s)) {
        cb->t.n = 2;
        cb->t.v[0] = lo;
        cb->t.v[1] = hi;
        for (int i = 0; i < 2; i++) {
            snprintf(cb->t.s[i], sizeof cb->t.s[0], "%.3g", cb->t.v[i]);
            minus_sign(cb->t.s[i], sizeof cb->t.s[0], L->g->ascii);
        }
        ticks_measure(L, &cb->t);
    }
}

static canvas_color cbar_color(const cbar *cb, double v) {
    if (!isfinite(v)) return CANVAS_NONE;
    double t = frac(v, cb->lo, cb->hi, cb->lg);
    return isfinite(t) ? palette_viridis(t) : CANVAS_NONE;
}

/* -------------------------------------------------------------- binning */

/* Maps n data cells onto a length of at most m slots: bins[k] covers cells
 * [first[k], first[k+1]) and canvas [pos[k], pos[k+1]). One bin per cell
 * when they fit, else one per slot (several cells aggregated). */
typedef struct bins {
    long n;
    long *first;            /* (n+1) */
    double *pos;            /* (n+1) */
} bins;

static int bins_make(bins *b, long cells, double start, double length, double res) {
    long slots = (long)floor(length / res + 1e-9);
    if (slots < 1) slots = 1;
    b->n = cells <= slots ? cells : slots;
    b->first = malloc((size_t)(b->n + 1) * sizeof *b->first);
    b->pos = malloc((size_t)(b->n + 1) * sizeof *b->pos);
    if (!b->first || !b->pos) { free(b->first); free(b->pos); b->first = NULL; b->pos = NULL; return SKV_ENOMEM; }
    for (long k = 0; k <= b->n; k++) {
        b->first[k] = b->n == cells ? k : (long)((double)k * cells / b->n);
        b->pos[k] = start + length * (double)b->first[k] / cells;
    }
    return SKV_OK;
}

static void bins_free(bins *b) {
    free(b->first);
    free(b->pos);
}

/* ----------------------------------------------------------------- plot */

/* Data range of one axis: the axis's own when set, else the data's,
 * widened to nice values (y) or left exact (x). */
static void data_range(const paint_axis *a, double lo, double hi, int nice, double *out_lo, double *out_hi) {
    if (a->min < a->max && (!a->log || a->min > 0)) { *out_lo = a->min; *out_hi = a->max; return; }
    if (!(lo <= hi)) { lo = a->log ? 1 : 0; hi = a->log ? 10 : 1; }
    if (lo == hi) {
        if (a->log) { lo /= 2; hi *= 2; }
        else if (lo == 0) { lo = -1; hi = 1; }
        else { double d = fabs(lo) * 0.1; lo -= d; hi += d; }
    }
    if (nice) {
        if (a->log) {
            double llo = log10(lo), lhi = log10(hi);
            if (lhi - llo >= 1) { lo = pow(10, floor(llo + 1e-9)); hi = pow(10, ceil(lhi - 1e-9)); }
            else { double m = (lhi - llo) * 0.05; lo = pow(10, llo - m); hi = pow(10, lhi + m); }
        } else {
            double step = nice_step((hi - lo) / 5);
            lo = floor(lo / step + 1e-9) * step;
            hi = ceil(hi / step - 1e-9) * step;
        }
    }
    *out_lo = lo;
    *out_hi = hi;
}

/* The prologue of every painter: the layout state L, the rect r snapped to
 * the canvas grid, res (the caller's or a local one) reset to r, and the
 * geometry g; a missing spec is an error, an empty rect draws nothing. */
#define PAINT_BEGIN(spec, missing)                                        \
    paint_result local, *res = res_out ? res_out : &local;                \
    lay L;                                                                \
    lay_init(&L, c);                                                      \
    canvas_rect r = snap_rect(L.g, rr);                                   \
    result_init(res, r);                                                  \
    if (!(spec)) return skv_error(SKV_EINVAL, "%s", missing);             \
    if (r.w <= 0 || r.h <= 0) return SKV_OK;                              \
    const canvas_geom *g = L.g

int paint_draw_plot(canvas *c, canvas_rect rr, const paint_plot *p, paint_result *res_out) {
    PAINT_BEGIN(p, "paint_draw_plot: no plot given");

    /* data ranges */
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    for (int s = 0; s < p->n_series && p->series; s++) {
        const paint_series *ser = &p->series[s];
        for (int i = 0; i < ser->n && ser->y; i++) {
            double xv = ser->x ? ser->x[i] : i, yv = ser->y[i];
            if (!isfinite(xv) || (p->x.log && xv <= 0)) continue;
            xlo = fmin(xlo, xv); xhi = fmax(xhi, xv);
            if (!isfinite(yv) || (p->y.log && yv <= 0)) continue;
            if (p->x.min < p->x.max && (xv < p->x.min || xv > p->x.max)) continue;
            ylo = fmin(ylo, yv); yhi = fmax(yhi, yv);
        }
    }
    data_range(&p->x, xlo, xhi, 0, &res->x0, &res->x1);
    data_range(&p->y, ylo, yhi, 1, &res->y0, &res->y1);
    res->xlog = p->x.log;
    res->ylog = p->y.log;

    /* legend: named series, then labelled bands */
    int nleg = 0, cap = p->n_series + p->n_bands;
    legend_item *leg = calloc((size_t)(cap > 0 ? cap : 1), sizeof *leg);
    if (!leg) return skv_error(SKV_ENOMEM, "paint_draw_plot: out of memory");
    for (int s = 0; s < p->n_series && p->series && !p->no_legend; s++)
        if (p->series[s].name)
            leg[nleg++] = (legend_item){ SW_LINE, pick(p->series[s].color, palette_cat(s)),
                                         p->series[s].width > 0 ? p->series[s].width : g->line_w, p->series[s].name, NULL };
    for (int b = 0; b < p->n_bands && p->bands && !p->no_legend; b++)
        if (p->bands[b].label) leg[nleg++] = (legend_item){ SW_BOX, pick(p->bands[b].color, L.th->band), 0, p->bands[b].label, NULL };

    char xl[256], yl[256];
    frame f = { .title = p->title, .leg = leg, .nleg = nleg, .xlabel = axis_text(&p->x, xl, sizeof xl),
                .ylabel = axis_text(&p->y, yl, sizeof yl), .xticks = 1, .axis = 1, .r = r };
    frame_vertical(&L, &f);
    ticks yt, xt;
    make_ticks(&L, &yt, res->y0, res->y1, p->y.log | p->y.integer << 1, f.area.h, 0);
    {
        char s1[40], s2[40];
        double big = fmax(fabs(res->x0), fabs(res->x1));
        fmt_linear(res->x1, nice_step((res->x1 - res->x0) / 5), big, g->ascii, s1, sizeof s1);
        fmt_linear(res->x0, nice_step((res->x1 - res->x0) / 5), big, g->ascii, s2, sizeof s2);
        f.right_pad = g->cells ? ceil(canvas_text_width(c, s1, CANVAS_FONT_SMALL) / 2)
                               : round(fmax(g->em, canvas_text_width(c, s1, CANVAS_FONT_SMALL) / 2 + g->pad));
    }
    frame_horizontal(&L, &f, yt.maxw);
    make_ticks(&L, &xt, res->x0, res->x1, p->x.log | p->x.integer << 1, f.area.w, 1);
    ticks_at(&L, &xt, &p->x, res->x0, res->x1, f.area.w, 1);
    res->area = f.area;
    res->complete = f.complete;
    canvas_rect old = canvas_clip(c, r);
    if (f.area.w < 1 || f.area.h < 1) {
        res->complete = 0;
        draw_title(&L, &f, res);
        canvas_clip(c, old);
        free(leg);
        return SKV_OK;
    }

    /* data, clipped to the area (on PNG, widened by the line width so a
     * line along the edge keeps its full width; the axis is drawn over it) */
    double lw = g->cells ? 0 : ceil(g->line_w * 2);
    canvas_clip(c, rect_meet((canvas_rect){ f.area.x - lw, f.area.y - lw, f.area.w + 2 * lw, f.area.h + lw }, r));
    for (int b = 0; b < p->n_bands && p->bands; b++) {
        double x0 = paint_map_x(res, fmax(p->bands[b].x0, res->x0)), x1 = paint_map_x(res, fmin(p->bands[b].x1, res->x1));
        if (x1 > x0) canvas_fill_rect(c, x0, f.area.y, x1 - x0, f.area.h, pick(p->bands[b].color, L.th->band));
    }
    if (!p->no_grid && L.th->grid != CANVAS_NONE && !g->cells) {
        for (int i = 0; i < yt.n; i++) {
            double y = paint_map_y(res, yt.v[i]);
            if (y > f.area.y + 1 && y < f.area.y + f.area.h - 1)
                canvas_rule(c, f.area.x, y, f.area.x + f.area.w, y, L.th->grid, 0);
        }
        for (int i = 0; i < xt.n; i++) {
            double x = paint_map_x(res, xt.v[i]);
            if (x > f.area.x + 1 && x < f.area.x + f.area.w - 1)
                canvas_rule(c, x, f.area.y, x, f.area.y + f.area.h, L.th->grid, 0);
        }
    }
    double *xy = NULL;
    int xy_cap = 0;
    for (int s = 0; s < p->n_series && p->series; s++) {
        const paint_series *ser = &p->series[s];
        if (!ser->y || ser->n <= 0) continue;
        if (ser->n > xy_cap) {
            free(xy);
            xy_cap = ser->n;
            xy = malloc((size_t)xy_cap * 2 * sizeof *xy);
            if (!xy) { canvas_clip(c, old); free(leg); return skv_error(SKV_ENOMEM, "paint_draw_plot: out of memory"); }
        }
        for (int i = 0; i < ser->n; i++) {
            double X = paint_map_x(res, ser->x ? ser->x[i] : i), Y = paint_map_y(res, ser->y[i]);
            if (g->cells) { /* the far edges belong to the next cell: pull them in */
                if (X >= f.area.x + f.area.w) X = f.area.x + f.area.w - 1e-6;
                if (Y >= f.area.y + f.area.h) Y = f.area.y + f.area.h - 1e-6;
            }
            xy[2 * i] = X;
            xy[2 * i + 1] = Y;
        }
        canvas_polyline(c, xy, ser->n, ser->width, pick(ser->color, palette_cat(s)));
        if (ser->markers && !g->cells) {
            double m = ceil(g->line_w * 2 + 1);
            for (int i = 0; i < ser->n; i++)
                if (isfinite(xy[2 * i]) && isfinite(xy[2 * i + 1])) {
                    canvas_fill_rect(c, xy[2 * i] - m, xy[2 * i + 1] - m, 2 * m, 2 * m, pick(ser->color, palette_cat(s)));
                    if (ser->hollow && ser->hollow[i]) /* the border only: the inside in the background */
                        canvas_fill_rect(c, xy[2 * i] - m + 2, xy[2 * i + 1] - m + 2, 2 * m - 4, 2 * m - 4,
                                         canvas_get_theme(c)->bg);
                }
        }
    }
    free(xy);

    /* markers: dashed lines with labels staggered so they never overlap */
    canvas_clip(c, r);
    canvas_rect placed[PAINT_MAX_MARKERS];
    int nplaced = 0;
    for (int m = 0; m < p->n_markers && p->markers; m++) {
        const paint_marker *mk = &p->markers[m];
        double x = paint_map_x(res, mk->x);
        int inside = isfinite(x) && x >= f.area.x - 1e-9 && x <= f.area.x + f.area.w + 1e-9;
        if (inside && g->cells) x = fmin(floor(x), f.area.x + f.area.w - 1) + 0.5; /* the column holding x */
        if (m < PAINT_MAX_MARKERS) res->marker_x[m] = inside ? x : NAN;
        if (!inside) continue;
        canvas_color col = pick(mk->color, L.th->fg);
        canvas_rule(c, x, f.area.y, x, f.area.y + f.area.h + g->hair / 2, col, CANVAS_RULE_DASHED);
        if (!mk->label || !*mk->label) continue;
        double tw = canvas_text_width(c, mk->label, CANVAS_FONT_SMALL), th = L.lh_s, gap = g->cells ? 0.5 : g->pad;
        double lx = x + gap, align = CANVAS_LEFT;
        if (lx + tw > f.area.x + f.area.w) { lx = x - gap; align = CANVAS_RIGHT; }
        if (align == CANVAS_RIGHT && lx - tw < f.area.x) continue; /* fits on neither side */
        double bx = align == CANVAS_LEFT ? lx : lx - tw, by = f.area.y + (g->cells ? 0 : g->pad);
        for (int k = 0; k < nplaced; k++)
            if (bx < placed[k].x + placed[k].w && placed[k].x < bx + tw && by < placed[k].y + placed[k].h &&
                placed[k].y < by + th) { by = placed[k].y + placed[k].h; k = -1; }
        if (by + th > f.area.y + f.area.h) continue;
        if (!g->cells) canvas_fill_rect(c, bx - 2, by, tw + 4, th, L.th->bg);
        canvas_text(c, g->cells ? (align == CANVAS_LEFT ? floor(x) + 1 : floor(x)) : lx, by, mk->label,
                    CANVAS_FONT_SMALL, (int)align | CANVAS_TOP, col);
        if (nplaced < PAINT_MAX_MARKERS) placed[nplaced++] = (canvas_rect){ bx, by, tw, th };
    }
    res->n_markers = p->n_markers < PAINT_MAX_MARKERS ? p->n_markers : PAINT_MAX_MARKERS;

    /* furniture */
    draw_axis_lines(&L, &f, res);
    draw_xticks(&L, &f, &xt, res->x0, res->x1, p->x.log, 1);
    draw_yticks(&L, &f, &yt, res->y0, res->y1, p->y.log, 0, 1);
    draw_axis_labels(&L, &f);
    draw_title(&L, &f, res);
    draw_legend(&L, &f, res);
    canvas_clip(c, old);
    free(leg);
    return SKV_OK;
}

/* -------------------------------------------------------------- heatmap */

/* Ticks for a cell axis: per-cell labels if given, else numbers over [min, max]. */
static void cell_axis_ticks(lay *L, ticks *t, const paint_axis *a, const char *const *labels, int n, double length,
                            int horizontal, double *lo, double *hi) {
    *lo = a->min < a->max ? a->min : 0;
    *hi = a->min < a->max ? a->max : n;
    if (labels) {
        make_label_ticks(L, t, labels, n, length, horizontal);
        for (int i = 0; i < t->n; i++) t->v[i] = *lo + (*hi - *lo) * t->v[i] / n;
    } else {
        make_ticks(L, t, *lo, *hi, a->integer << 1, length, horizontal);
    }
}

/* Lays out a cell grid (heatmap or raster): axes without lines, ticks
 * outside, optional colour bar or legend. */
static void grid_layout(lay *L, frame *f, ticks *xt, ticks *yt, const paint_axis *xa, const paint_axis *ya,
                        const char *const *xl, const char *const *yl, int nx, int ny, double *xlo, double *xhi,
                        double *ylo, double *yhi) {
    frame_vertical(L, f);
    cell_axis_ticks(L, yt, ya, yl, ny, f->area.h, 0, ylo, yhi);
    f->right_pad = L->g->cells ? 1 : L->g->em;
    frame_horizontal(L, f, yt->maxw);
    cell_axis_ticks(L, xt, xa, xl, nx, f->area.w, 1, xlo, xhi);
}

double paint_colorbar_room(canvas *c) {
    return canvas_text_width(c, "100", CANVAS_FONT_SMALL) + 2 * canvas_line_height(c, CANVAS_FONT_BODY) +
           3 * canvas_geometry(c)->em;
}

int paint_draw_heatmap(canvas *c, canvas_rect rr, const paint_heatmap *h, paint_result *res_out) {
    PAINT_BEGIN(h, "paint_draw_heatmap: no heatmap given");
    int nx = h->v ? h->nx : 0, ny = h->v ? h->ny : 0;
    if (nx < 0 || ny < 0) nx = ny = 0;

    legend_item mark = { SW_MARK, 0, 0, h->mark_label, NULL };
    char xl[256], yl[256], vl[256];
    frame f = { .title = h->title, .leg = &mark, .nleg = h->n_marks > 0 && h->mark_label ? 1 : 0,
                .xlabel = axis_text(&h->x, xl, sizeof xl), .ylabel = axis_text(&h->y, yl, sizeof yl),
                .rlabel = axis_text(&h->value, vl, sizeof vl), .xticks = 1, .r = r };
    cbar cb;
    frame_vertical(&L, &f);
    cbar_setup(&L, &cb, &h->value, h->v, (long)nx * ny, f.area.h);
    f.right_w = h->no_colorbar ? 0 : cbar_width(&L, &cb, f.show_rlabel ? f.rlabel : NULL);
    if (h->no_colorbar) f.rlabel = NULL;
    ticks xt, yt;
    double xlo, xhi, ylo, yhi;
    grid_layout(&L, &f, &xt, &yt, &h->x, &h->y, h->xticks, h->yticks, nx, ny, &xlo, &xhi, &ylo, &yhi);
    if (h->no_colorbar) f.show_right = 0;
    if (!f.show_right) f.show_rlabel = 0;
    res->area = f.area;
    res->x0 = xlo; res->x1 = xhi; res->y0 = ylo; res->y1 = yhi; res->ydown = 1;
    res->complete = f.complete;
    canvas_rect old = canvas_clip(c, r);
    if (f.area.w < 1 || f.area.h < 1 || nx == 0 || ny == 0) {
        res->complete = f.area.w >= 1 && f.area.h >= 1 ? f.complete : 0;
        draw_title(&L, &f, res);
        canvas_clip(c, old);
        return SKV_OK;
    }

    bins bx, by;
    if (bins_make(&bx, nx, f.area.x, f.area.w, g->fill_w) || bins_make(&by, ny, f.area.y, f.area.h, g->fill_h)) {
        bins_free(&bx);
        canvas_clip(c, old);
        return skv_error(SKV_ENOMEM, "paint_draw_heatmap: out of memory");
    }
    canvas_clip(c, rect_meet(f.area, r));
    for (long j = 0; j < by.n; j++)
        for (long i = 0; i < bx.n; i++) {
            double sum = 0;
            long cnt = 0;
            for (long yy = by.first[j]; yy < by.first[j + 1]; yy++)
                for (long xx = bx.first[i]; xx < bx.first[i + 1]; xx++) {
                    float v = h->v[yy * nx + xx];
                    if (isfinite(v)) { sum += v; cnt++; }
                }
            if (cnt == 0) continue;
            canvas_fill_rect(c, bx.pos[i], by.pos[j], bx.pos[i + 1] - bx.pos[i], by.pos[j + 1] - by.pos[j],
                             cbar_color(&cb, sum / cnt));
        }
    /* values printed in cells that are big enough (cells only drawn one per bin) */
    if (h->annotate && bx.n == nx && by.n == ny) {
        double cw = f.area.w / nx, chh = f.area.h / ny;
        for (int j = 0; j < ny && chh >= L.lh_s; j++)
            for (int i = 0; i < nx; i++) {
                float v = h->v[j * nx + i];
                if (!isfinite(v)) continue;
                char buf[64];
                snprintf(buf, sizeof buf, h->annotate, v);
                if (canvas_text_width(c, buf, CANVAS_FONT_SMALL) + (g->cells ? 0 : 2 * g->pad) > cw) continue;
                canvas_color cc = cbar_color(&cb, v);
                canvas_color ink = canvas_luma(cc) > 0.3 ? CANVAS_RGB(0, 0, 0) : CANVAS_RGB(0xff, 0xff, 0xff);
                double cx = bx.pos[i] + cw / 2, cy = by.pos[j] + chh / 2;
                if (g->cells) { cx = floor(cx - canvas_text_width(c, buf, CANVAS_FONT_SMALL) / 2); cy = floor(cy); }
                canvas_text(c, cx, cy + (g->cells ? 0.5 : 0), buf, CANVAS_FONT_SMALL,
                            (g->cells ? CANVAS_LEFT : CANVAS_CENTER) | CANVAS_MIDDLE, ink);
            }
    }
    for (int m = 0; m < h->n_marks && h->marks; m++) {
        const paint_cellmark *mk = &h->marks[m];
        if (mk->col < 0 || mk->col >= nx || mk->row < 0 || mk->row >= ny) continue;
        double x0 = f.area.x + f.area.w * mk->col / nx, x1 = f.area.x + f.area.w * (mk->col + 1) / nx;
        double y0 = f.area.y + f.area.h * mk->row / ny, y1 = f.area.y + f.area.h * (mk->row + 1) / ny;
        if (g->cells) { /* a glyph in the cell's first column, on its middle row */
            double cy = floor((y0 + y1) / 2);
            x0 = fmin(ceil(x0 - 1e-9), fmax(floor(x0), ceil(x1) - 1));
            x1 = x0 + 1; y0 = cy; y1 = cy + 1;
        }
        else { x0 = round(x0); y0 = round(y0); x1 = fmax(round(x1), x0 + 4 * g->hair); y1 = fmax(round(y1), y0 + 4 * g->hair); }
        if (m < PAINT_MAX_MARKERS) res->marker_x[m] = (x0 + x1) / 2;
        draw_mark(&L, (canvas_rect){ x0, y0, x1 - x0, y1 - y0 });
    }
    res->n_markers = h->n_marks < PAINT_MAX_MARKERS ? h->n_marks : PAINT_MAX_MARKERS;
    bins_free(&bx);
    bins_free(&by);

    canvas_clip(c, r);
    draw_xticks(&L, &f, &xt, xlo, xhi, 0, 1);
    draw_yticks(&L, &f, &yt, ylo, yhi, 0, 1, 1);
    if (f.show_right) draw_cbar(&L, &f, &cb, f.show_rlabel ? f.rlabel : NULL, res);
    draw_axis_labels(&L, &f);
    draw_title(&L, &f, res);
    draw_legend(&L, &f, res);
    canvas_clip(c, old);
    return SKV_OK;
}

/* --------------------------------------------------------------- raster */

/* Colour of category k: its own, palette_cat(k) for PAINT_AUTO, none when out of range. */
static canvas_color cat_color(const paint_category *cats, int n, int k) {
    if (k < 0 || k >= n) return CANVAS_NONE;
    return pick(cats[k].color, palette_cat(k));
}

static const char *cat_glyph(const paint_category *cats, int n, int k) {
    if (k < 0 || k >= n) return " ";
    return cats[k].glyph && cats[k].glyph[0] ? cats[k].glyph : paint_cat_glyph(k);
}

/* Legend items for named categories; returns how many. */
static int cat_legend(const paint_category *cats, int n, legend_item *out) {
    int k = 0;
    for (int i = 0; i < n && cats; i++)
        if (cats[i].name) out[k++] = (legend_item){ SW_BOX, cat_color(cats, n, i), 0, cats[i].name, cat_glyph(cats, n, i) };
    return k;
}

/* Outlines a column or row of the area (PNG), or points at it from outside
 * with a triangle (cells). */
static void draw_highlight(lay *L, frame *f, int vertical, double a, double b) {
    const canvas_geom *g = L->g;
    if (g->cells) {
        if (vertical && !f->show_caption) return; /* no free row above the area */
        if (vertical) {
            double x = floor((a + b) / 2);
            canvas_text(L->c, x, f->area.y - 1, g->ascii ? "v" : "\xe2\x96\xbc", CANVAS_FONT_BOLD, CANVAS_LEFT | CANVAS_TOP,
                        L->th->highlight);
        } else {
            double y = floor((a + b) / 2);
            canvas_text(L->c, f->area.x + f->area.w, y, g->ascii ? "<" : "\xe2\x97\x80", CANVAS_FONT_BOLD,
                        CANVAS_LEFT | CANVAS_TOP, L->th->highlight);
        }
        return;
    }
    double t = g->hair * 2, h2 = t / 2;
    a = round(a); b = round(b);
    if (b - a < 2 * t) { double m = (a + b) / 2; a = m - t; b = m + t; }
    canvas_color col = L->th->highlight;
    if (vertical) {
        double y0 = f->area.y - h2, y1 = f->area.y + f->area.h + h2;
        canvas_rule(L->c, a + h2, y0, a + h2, y1, col, 0);
        canvas_rule(L->c, b - h2, y0, b - h2, y1, col, 0);
        canvas_rule(L->c, a + h2, y0, b - h2, y0, col, 0);
        canvas_rule(L->c, a + h2, y1, b - h2, y1, col, 0);
    } else {
        double x0 = f->area.x - h2, x1 = f->area.x + f->area.w + h2;
        canvas_rule(L->c, x0, a + h2, x1, a + h2, col, 0);
        canvas_rule(L->c, x0, b - h2, x1, b - h2, col, 0);
        canvas_rule(L->c, x0, a + h2, x0, b - h2, col, 0);
        canvas_rule(L->c, x1, a + h2, x1, b - h2, col, 0);
    }
}

int paint_draw_raster(canvas *c, canvas_rect rr, const paint_raster *gr, paint_result *res_out) {
    PAINT_BEGIN(gr, "paint_draw_raster: no raster given");
    int nx = gr->cat ? gr->nx : 0, ny = gr->cat ? gr->ny : 0;
    if (nx < 0 || ny < 0) nx = ny = 0;
    int ncat = gr->cats ? gr->n_cats : 0;

    legend_item *leg = calloc((size_t)(ncat > 0 ? ncat : 1), sizeof *leg);
    if (!leg) return skv_error(SKV_ENOMEM, "paint_draw_raster: out of memory");
    char xl[256], yl[256];
    frame f = { .title = gr->title, .leg = leg, .nleg = cat_legend(gr->cats, ncat, leg),
                .xlabel = axis_text(&gr->x, xl, sizeof xl), .ylabel = axis_text(&gr->y, yl, sizeof yl),
                .xticks = 1, .r = r };
    f.want_caption = (gr->highlight & PAINT_HI_COL) != 0; /* the row the cells pointer goes in */
    ticks xt, yt;
    double xlo, xhi, ylo, yhi;
    grid_layout(&L, &f, &xt, &yt, &gr->x, &gr->y, NULL, NULL, nx, ny, &xlo, &xhi, &ylo, &yhi);
    if (g->cells && (gr->highlight & PAINT_HI_ROW) && f.area.w > 1) f.area.w -= 1;
    res->area = f.area;
    res->x0 = xlo; res->x1 = xhi; res->y0 = ylo; res->y1 = yhi; res->ydown = 1;
    res->complete = f.complete;
    canvas_rect old = canvas_clip(c, r);
    if (f.area.w < 1 || f.area.h < 1 || nx == 0 || ny == 0) {
        res->complete = 0;
        draw_title(&L, &f, res);
        canvas_clip(c, old);
        free(leg);
        return SKV_OK;
    }
    bins bx, by;
    if (bins_make(&bx, nx, f.area.x, f.area.w, g->fill_w) || bins_make(&by, ny, f.area.y, f.area.h, g->fill_h)) {
        bins_free(&bx);
        canvas_clip(c, old);
        free(leg);
        return skv_error(SKV_ENOMEM, "paint_draw_raster: out of memory");
    }
    canvas_clip(c, rect_meet(f.area, r));
    for (long j = 0; j < by.n; j++)
        for (long i = 0; i < bx.n; i++) {
            int best = -1;
            for (long yy = by.first[j]; yy < by.first[j + 1]; yy++)
                for (long xx = bx.first[i]; xx < bx.first[i + 1]; xx++) {
                    int k = gr->cat[yy * nx + xx];
                    if (k < ncat && k > best) best = k;
                }
            canvas_color col = cat_color(gr->cats, ncat, best);
            if (col != CANVAS_NONE && g->mono) /* no colour: the category's glyph (fills are whole cells here) */
                canvas_text(c, floor(bx.pos[i]), floor(by.pos[j]), cat_glyph(gr->cats, ncat, best), CANVAS_FONT_SMALL,
                            CANVAS_LEFT | CANVAS_TOP, L.th->fg);
            else if (col != CANVAS_NONE)
                canvas_fill_rect(c, bx.pos[i], by.pos[j], bx.pos[i + 1] - bx.pos[i], by.pos[j + 1] - by.pos[j], col);
        }
    bins_free(&bx);
    bins_free(&by);
    canvas_clip(c, r);
    if (!g->cells) /* a thin frame, since background cells would otherwise merge with the page */
        draw_frame(&L, (canvas_rect){ f.area.x - g->hair, f.area.y - g->hair, f.area.w + 2 * g->hair, f.area.h + 2 * g->hair },
                   g->hair, L.th->axis);
    if ((gr->highlight & PAINT_HI_COL) && gr->hi_col >= 0 && gr->hi_col < nx) {
        double a = f.area.x + f.area.w * gr->hi_col / nx, b = f.area.x + f.area.w * (gr->hi_col + 1) / nx;
        draw_highlight(&L, &f, 1, a, b);
        res->marker_x[0] = (a + b) / 2;
        res->n_markers = 1;
    }
    if ((gr->highlight & PAINT_HI_ROW) && gr->hi_row >= 0 && gr->hi_row < ny)
        draw_highlight(&L, &f, 0, f.area.y + f.area.h * gr->hi_row / ny, f.area.y + f.area.h * (gr->hi_row + 1) / ny);
    draw_xticks(&L, &f, &xt, xlo, xhi, 0, 1);
    draw_yticks(&L, &f, &yt, ylo, yhi, 0, 1, 1);
    draw_axis_labels(&L, &f);
    draw_title(&L, &f, res);
    draw_legend(&L, &f, res);
    canvas_clip(c, old);
    free(leg);
    return SKV_OK;
}

/* ---------------------------------------------------------------- strip */

int paint_draw_strip(canvas *c, canvas_rect rr, const paint_strip *s, paint_result *res_out) {
    PAINT_BEGIN(s, "paint_draw_strip: no strip given");
    int n = s->v ? s->n : 0, ncat = s->cats ? s->n_cats : 0;
    if (n < 0) n = 0;

    double lane_h = g->cells ? 1 : round(L.lh_s * 1.15), lane_gap = g->cells ? 0 : round(g->pad / 2);
    double strip_max = g->cells ? 3 : 1e9; /* PNG: the strip takes the height it is given */
    double lanes_h = ncat * (lane_h + lane_gap);
    char xl[256], vl[256];
    frame f = { .title = s->title, .xlabel = axis_text(&s->x, xl, sizeof xl), .rlabel = axis_text(&s->value, vl, sizeof vl),
                .xticks = 1, .r = r, .max_h = lanes_h + strip_max };
    frame_vertical(&L, &f);
    cbar cb;
    cbar_setup(&L, &cb, &s->value, s->v, n, f.area.h);
    f.right_w = cbar_width(&L, &cb, f.show_rlabel ? f.rlabel : NULL);
    double lab_w = 0;
    for (int k = 0; k < ncat; k++)
        if (s->cats[k].name) lab_w = fmax(lab_w, canvas_text_width(c, s->cats[k].name, CANVAS_FONT_SMALL));
    f.right_pad = g->cells ? 1 : g->em;
    frame_horizontal(&L, &f, lab_w);
    double xlo = s->x.min < s->x.max ? s->x.min : 0, xhi = s->x.min < s->x.max ? s->x.max : n;
    ticks xt;
    make_ticks(&L, &xt, xlo, xhi, s->x.integer << 1, f.area.w, 1);

    /* lanes take what they need, the strip the rest (at least one unit) */
    int lanes_shown = ncat;
    while (lanes_shown > 0 && f.area.h - lanes_shown * (lane_h + lane_gap) < (g->cells ? 1 : g->em)) lanes_shown--;
    if (lanes_shown < ncat) f.complete = 0;
    double strip_y = f.area.y + lanes_shown * (lane_h + lane_gap);
    canvas_rect strip = { f.area.x, strip_y, f.area.w, f.area.y + f.area.h - strip_y };
    res->area = strip;
    res->x0 = xlo; res->x1 = xhi; res->y0 = 0; res->y1 = 1; res->ydown = 1;
    res->legend = (canvas_rect){ f.r.x, f.area.y, f.area.x + f.area.w - f.r.x, strip_y - f.area.y };
    res->complete = f.complete;
    canvas_rect old = canvas_clip(c, r);
    if (strip.w < 1 || strip.h < g->fill_h) {
        res->complete = 0;
        draw_title(&L, &f, res);
        canvas_clip(c, old);
        return SKV_OK;
    }
    for (int k = 0; k < lanes_shown; k++) {
        double y = f.area.y + k * (lane_h + lane_gap);
        canvas_clip(c, r);
        if (s->cats[k].name)
            canvas_text(c, g->cells ? f.area.x - 1 : f.area.x - g->tick - g->pad, y + lane_h / 2, s->cats[k].name,
                        CANVAS_FONT_SMALL, CANVAS_RIGHT | CANVAS_MIDDLE, L.th->fg);
        canvas_clip(c, rect_meet((canvas_rect){ f.area.x, y, f.area.w, lane_h }, r));
        if (L.th->grid != CANVAS_NONE) canvas_fill_rect(c, f.area.x, y, f.area.w, lane_h, mix(L.th->bg, L.th->grid, 0.6));
        canvas_color col = cat_color(s->cats, ncat, k);
        for (int i = 0; i < s->n_spans && s->spans; i++) {
            if (s->spans[i].cat != k) continue;
            double x0 = paint_map_x(res, fmax(s->spans[i].x0, xlo)), x1 = paint_map_x(res, fmin(s->spans[i].x1, xhi));
            if (x1 < x0 || !isfinite(x0) || !isfinite(x1)) continue;
            if (g->mono) { /* no colour: the lane's glyph in every cell of the span */
                for (double x = floor(x0); x < fmax(x1, x0 + 1); x += 1)
                    canvas_text(c, x, y, cat_glyph(s->cats, ncat, k), CANVAS_FONT_SMALL, CANVAS_LEFT | CANVAS_TOP, L.th->fg);
                continue;
            }
            canvas_fill_rect(c, x0, y + (g->cells ? 0 : 1), fmax(x1 - x0, g->cells ? g->fill_w : g->hair),
                             lane_h - (g->cells ? 0 : 2), col);
        }
    }
    bins bx;
    if (bins_make(&bx, n > 0 ? n : 1, strip.x, strip.w, g->fill_w)) {
        canvas_clip(c, old);
        return skv_error(SKV_ENOMEM, "paint_draw_strip: out of memory");
    }
    canvas_clip(c, rect_meet(strip, r));
    for (long i = 0; i < bx.n && n > 0; i++) {
        double sum = 0;
        long cnt = 0;
        for (long k = bx.first[i]; k < bx.first[i + 1]; k++)
            if (isfinite(s->v[k])) { sum += s->v[k]; cnt++; }
        if (cnt) canvas_fill_rect(c, bx.pos[i], strip.y, bx.pos[i + 1] - bx.pos[i], strip.h, cbar_color(&cb, sum / cnt));
    }
    bins_free(&bx);
    canvas_clip(c, r);
    draw_xticks(&L, &f, &xt, xlo, xhi, 0, 1);
    if (f.show_right) draw_cbar(&L, &f, &cb, f.show_rlabel ? f.rlabel : NULL, res);
    draw_axis_labels(&L, &f);
    draw_title(&L, &f, res);
    canvas_clip(c, old);
    return SKV_OK;
}

/* ---------------------------------------------------------------- gantt */

int paint_draw_gantt(canvas *c, canvas_rect rr, const paint_gantt *gt, paint_result *res_out) {
    PAINT_BEGIN(gt, "paint_draw_gantt: no timeline given");
    int nrows = gt->rows ? gt->n_rows : 0, nops = gt->ops ? gt->n_ops : 0;
    if (nrows < 0) nrows = 0;

    double tlo = INFINITY, thi = -INFINITY;
    for (int i = 0; i < gt->n_bars && gt->bars; i++)
        if (isfinite(gt->bars[i].t0) && isfinite(gt->bars[i].t1)) {
            tlo = fmin(tlo, fmin(gt->bars[i].t0, gt->bars[i].t1));
            thi = fmax(thi, fmax(gt->bars[i].t0, gt->bars[i].t1));
        }
    paint_axis ta = gt->t;
    ta.log = 0;
    data_range(&ta, tlo, thi, 0, &res->x0, &res->x1);
    if (!(ta.min < ta.max) && tlo <= thi && tlo >= 0 && tlo < (thi - tlo) * 0.25) res->x0 = 0;

    legend_item *leg = calloc((size_t)(nops > 0 ? nops : 1), sizeof *leg);
    if (!leg) return skv_error(SKV_ENOMEM, "paint_draw_gantt: out of memory");
    char xl[256];
    double row_max = g->cells ? 2 : round(L.lh_b * 3);
    frame f = { .title = gt->title, .leg = leg, .nleg = cat_legend(gt->ops, nops, leg),
                .xlabel = axis_text(&ta, xl, sizeof xl), .xticks = 1, .axis = 1, .r = r,
                .max_h = nrows * row_max };
    frame_vertical(&L, &f);
    double lab_w = 0;
    for (int k = 0; k < nrows; k++)
        if (gt->rows[k]) lab_w = fmax(lab_w, canvas_text_width(c, gt->rows[k], CANVAS_FONT_BODY));
    {
        char s1[40];
        fmt_linear(res->x1, nice_step((res->x1 - res->x0) / 5), fabs(res->x1), g->ascii, s1, sizeof s1);
        f.right_pad = g->cells ? ceil(canvas_text_width(c, s1, CANVAS_FONT_SMALL) / 2)
                               : round(fmax(g->em, canvas_text_width(c, s1, CANVAS_FONT_SMALL) / 2 + g->pad));
    }
    frame_horizontal(&L, &f, lab_w);
    ticks xt;
    make_ticks(&L, &xt, res->x0, res->x1, 0, f.area.w, 1);

    double row_h = nrows > 0 ? f.area.h / nrows : 0;
    int shown = nrows;
    if (g->cells) {
        row_h = floor(fmin(row_h, row_max));
        if (row_h < 1) { row_h = 1; shown = (int)f.area.h; }
    } else {
        row_h = floor(fmin(row_h, row_max));
        double min_row = fmax(3, L.lh_s * 0.5);
        if (row_h < min_row) { row_h = min_row; shown = (int)floor(f.area.h / min_row); }
    }
    if (shown > nrows) shown = nrows;
    if (shown < nrows) f.complete = 0;
    /* the area ends right under the last row, the axis under it */
    double excess = f.area.h - shown * row_h;
    f.area.h -= excess;
    f.y_xticks -= excess;
    f.y_xlabel -= excess;
    res->area = f.area;
    res->y0 = 0; res->y1 = shown; res->ydown = 1;
    res->shown = shown;
    res->complete = f.complete;
    canvas_rect old = canvas_clip(c, r);
    if (f.area.w < 1 || f.area.h < g->fill_h || shown <= 0) {
        res->complete = 0;
        draw_title(&L, &f, res);
        canvas_clip(c, old);
        free(leg);
        return SKV_OK;
    }
    canvas_clip(c, rect_meet(f.area, r));
    if (L.th->grid != CANVAS_NONE && !g->cells)
        for (int i = 0; i < xt.n; i++) {
            double x = paint_map_x(res, xt.v[i]);
            if (x > f.area.x + 1) canvas_rule(c, x, f.area.y, x, f.area.y + f.area.h, L.th->grid, 0);
        }
    double inset = g->cells ? 0 : round(row_h * 0.16);
    for (int i = 0; i < gt->n_bars && gt->bars; i++) {
        const paint_bar *b = &gt->bars[i];
        if (b->row < 0 || b->row >= shown || !isfinite(b->t0) || !isfinite(b->t1)) continue;
        double x0 = paint_map_x(res, fmin(b->t0, b->t1)), x1 = paint_map_x(res, fmax(b->t0, b->t1));
        double y = f.area.y + b->row * row_h;
        /* a hairline gap at the start of wide bars shows where one op ends and the next begins */
        double sep = !g->cells && x1 - x0 > 4 * g->hair ? g->hair : 0;
        canvas_color col = b->op >= 0 && b->op < nops ? cat_color(gt->ops, nops, b->op) : L.th->muted;
        /* a terminal leaves the bottom half of a row's last line empty: bars
         * end in half blocks (a whole-cell fill is only a background colour,
         * blank in a copy or a screen capture), with a gap between rows */
        canvas_fill_rect(c, x0 + sep, y + inset, fmax(x1 - x0 - sep, g->fill_w), g->cells ? row_h - 0.5 : row_h - 2 * inset, col);
    }
    canvas_clip(c, r);
    for (int k = 0; k < shown; k++) {
        if (!gt->rows[k]) continue;
        double y = f.area.y + k * row_h + row_h / 2;
        if (g->cells) y = f.area.y + k * row_h + 0.5;
        canvas_text(c, g->cells ? f.area.x - 1 : f.area.x - g->hair - g->tick - g->pad, y, gt->rows[k],
                    CANVAS_FONT_BODY, CANVAS_RIGHT | CANVAS_MIDDLE, L.th->fg);
        if (!g->cells) canvas_rule(c, f.area.x - g->hair / 2 - g->tick, y, f.area.x - g->hair / 2, y, L.th->axis, 0);
    }
    draw_axis_lines(&L, &f, res);
    draw_xticks(&L, &f, &xt, res->x0, res->x1, 0, 1);
    draw_axis_labels(&L, &f);
    draw_title(&L, &f, res);
    draw_legend(&L, &f, res);
    canvas_clip(c, old);
    free(leg);
    return SKV_OK;
}

/* ---------------------------------------------------------------- table */

int paint_draw_table(canvas *c, canvas_rect rr, const paint_table *t, paint_result *res_out) {
    PAINT_BEGIN(t, "paint_draw_table: no table given");
    int nc = t->cols ? t->n_cols : 0, nr = t->cells ? t->n_rows : 0;
    if (nc <= 0) return SKV_OK;
    if (nr < 0) nr = 0;
    double *w = calloc(2 * (size_t)nc, sizeof *w), *nat = w + nc; /* widths drawn, natural widths */
    if (!w) return skv_error(SKV_ENOMEM, "paint_draw_table: out of memory");

    frame f = { .title = t->title, .r = r };
    frame_vertical(&L, &f);
    double cpad = g->cells ? 1 : round(g->em * 0.6);
    double row_h = g->cells ? 1 : round(L.lh_b * 1.45);
    double x0 = r.x + (g->cells ? 0 : g->pad), avail = r.w - (g->cells ? 0 : 2 * g->pad);
    double total = 0;
    for (int j = 0; j < nc; j++) {
        w[j] = canvas_text_width(c, t->cols[j].header, CANVAS_FONT_BOLD);
        for (int i = 0; i < nr; i++) w[j] = fmax(w[j], canvas_text_width(c, t->cells[(long)i * nc + j], CANVAS_FONT_BODY));
        nat[j] = w[j] = ceil(w[j]) + 2 * cpad;
        total += w[j];
    }
    /* too wide: take from the widest column until it fits */
    double min_w = 2 * cpad + (g->cells ? 3 : 2 * g->em);
    while (total > avail) {
        int wj = 0;
        for (int j = 1; j < nc; j++) if (w[j] > w[wj]) wj = j;
        if (w[wj] <= min_w) break;
        double cut = fmin(total - avail, w[wj] - min_w);
        if (cut <= 0) break;
        w[wj] -= ceil(cut);
        total -= ceil(cut);
        f.complete = 0;
    }
    /* the squeeze cut more than one column (every cell cut to an ellipsis, "p…"): the leading columns that
     * fit whole instead, at least two of them */
    int ns = nc, cut = 0;
    for (int j = 0; j < nc; j++) cut += w[j] < nat[j];
    if (cut > 1) {
        double sum = 0;
        int m = 0;
        while (m < nc && sum + nat[m] <= avail) sum += nat[m++];
        if (m >= 2) {
            ns = m;
            f.complete = 0;
            for (int j = 0; j < m; j++) w[j] = nat[j];
            total = sum;
        }
    }
    double y = f.area.y;
    int rows_fit = (int)floor((f.area.h - row_h - (g->cells ? 1 : g->hair)) / row_h);
    if (rows_fit < 0) rows_fit = 0;
    int shown = nr < rows_fit ? nr : rows_fit;
    if (shown < nr) f.complete = 0;
    canvas_rect old = canvas_clip(c, r);
    double tw = fmin(total, avail);
    f.area.x = x0;
    f.area.w = tw;
    draw_title(&L, &f, res);
    res->area = (canvas_rect){ x0, y + row_h + (g->cells ? 1 : g->hair), tw, shown * row_h };
    res->x0 = 0; res->x1 = ns; res->y0 = 0; res->y1 = shown; res->ydown = 1;
    res->shown = shown;
    if (f.area.h < row_h) {
        res->complete = 0;
        canvas_clip(c, old);
        free(w);
        return SKV_OK;
    }
    char buf[512];
    for (int i = -1; i < shown; i++) {
        double ry = i < 0 ? y : res->area.y + i * row_h;
        if (i >= 0 && t->highlight && i == t->hi_row)
            canvas_fill_rect(c, x0, ry, tw, row_h, g->cells ? L.th->band : mix(L.th->bg, palette_cat(0), 0.18));
        else if (i >= 0 && (i & 1) && L.th->grid != CANVAS_NONE)
            canvas_fill_rect(c, x0, ry, tw, row_h, mix(L.th->bg, L.th->grid, 0.45));
        double x = x0;
        for (int j = 0; j < ns; j++) {
            const char *s = i < 0 ? t->cols[j].header : t->cells[(long)i * nc + j];
            int font = i < 0 ? CANVAS_FONT_BOLD : CANVAS_FONT_BODY;
            double inner = w[j] - 2 * cpad;
            if (x >= x0 + tw) break;
            inner = fmin(inner, x0 + tw - x - 2 * cpad);
            if (s && inner > 0) {
                fit_text(&L, s, font, inner, buf, sizeof buf);
                int al = t->cols[j].align;
                double tx = al == PAINT_ALIGN_RIGHT ? x + cpad + inner : al == PAINT_ALIGN_CENTER ? x + cpad + inner / 2 : x + cpad;
                if (g->cells && al == PAINT_ALIGN_CENTER) tx = x + cpad + floor((inner - canvas_text_width(c, buf, font)) / 2);
                int a = g->cells && al == PAINT_ALIGN_CENTER ? CANVAS_LEFT
                      : al == PAINT_ALIGN_RIGHT ? CANVAS_RIGHT : al == PAINT_ALIGN_CENTER ? CANVAS_CENTER : CANVAS_LEFT;
                canvas_text(c, tx, ry + row_h / 2, buf, font, a | CANVAS_MIDDLE, L.th->fg);
            }
            x += w[j];
        }
        if (i < 0 && ns < nc) { /* the columns left out, counted where the next would start */
            char more[24];
            snprintf(more, sizeof more, "+%d", nc - ns);
            if (x + cpad + canvas_text_width(c, more, CANVAS_FONT_BOLD) <= r.x + r.w)
                canvas_text(c, x + cpad, ry + row_h / 2, more, CANVAS_FONT_BOLD, CANVAS_LEFT | CANVAS_MIDDLE, L.th->fg);
        }
        if (i < 0) {
            double ly = y + row_h + (g->cells ? 0.5 : g->hair / 2);
            canvas_rule(c, x0, ly, x0 + tw, ly, L.th->axis, 0);
        }
    }
    res->complete = f.complete;
    canvas_clip(c, old);
    free(w);
    return SKV_OK;
}

/* -------------------------------------------------------------- palette */

/* palette_viridis maps [0, 1] to a viridis-like ramp (dark violet through
 * teal to yellow) whose luminance rises monotonically, so a heatmap still
 * reads when printed in grey. palette_cat gives categorical colours with the
 * hues of Okabe and Ito's colour-blind-safe set, re-ordered and with two
 * lightnesses adjusted so that every pair differs in CIE L* as well as hue:
 * the categories stay apart in greyscale too. */

/* Ten stops of the viridis ramp at t = 0, 1/9, ..., 1; interpolated linearly. */
static const uint8_t viridis_stops[10][3] = {
    { 0x44, 0x01, 0x54 }, { 0x48, 0x28, 0x78 }, { 0x3e, 0x4a, 0x89 }, { 0x31, 0x68, 0x8e }, { 0x26, 0x82, 0x8e },
    { 0x1f, 0x9e, 0x89 }, { 0x35, 0xb7, 0x79 }, { 0x6d, 0xcd, 0x59 }, { 0xb4, 0xde, 0x2c }, { 0xfd, 0xe7, 0x25 },
};

canvas_color palette_viridis(double t) {
    if (isnan(t)) return CANVAS_NONE;
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    double u = t * 9;
    int k = (int)u;
    if (k > 8) k = 8;
    double f = u - k;
    int c[3];
    for (int i = 0; i < 3; i++) c[i] = (int)lround(viridis_stops[k][i] + (viridis_stops[k + 1][i] - viridis_stops[k][i]) * f);
    return CANVAS_RGB(c[0], c[1], c[2]);
}

/* Okabe-Ito hues; L* in the comment. Bluish green is darkened (57.7 -> 35.8)
 * and sky blue lightened (69.8 -> 80.3) so no two are closer than ~7 L*. */
static const canvas_color cat_colors[PALETTE_CAT_N] = {
    CANVAS_RGB(0x00, 0x72, 0xB2), /* blue, 46 */
    CANVAS_RGB(0xE6, 0x9F, 0x00), /* orange, 71 */
    CANVAS_RGB(0x00, 0x60, 0x4C), /* bluish green (dark), 36 */
    CANVAS_RGB(0xD5, 0x5E, 0x00), /* vermillion, 54 */
    CANVAS_RGB(0x95, 0xCF, 0xEF), /* sky blue (light), 80 */
    CANVAS_RGB(0xCC, 0x79, 0xA7), /* reddish purple, 61 */
    CANVAS_RGB(0x33, 0x33, 0x33), /* near black, 21 */
    CANVAS_RGB(0xF0, 0xE4, 0x42), /* yellow, 89 */
};

canvas_color palette_cat(int i) {
    if (i < 0) i = -i;
    return cat_colors[i % PALETTE_CAT_N];
}

double palette_lightness(canvas_color c) {
    double y = canvas_luma(c);
    return y > 216.0 / 24389 ? 116 * cbrt(y) - 16 : y * 24389.0 / 27;
}
