/* canvas_svg.c: the SVG back end of the canvas, for figures that stay sharp
 * at any size.
 *
 * One unit is one pixel of the SVG's viewBox. Drawing appends elements to a
 * text buffer: fills and rules are <rect>s (crisp edges), polylines are
 * <polyline>s with round joins, text is <text> in the DejaVu family. Text is
 * measured with FreeType through a 1x1 PNG canvas made with the same fonts
 * and sizes, so layouts match the PNG of the same figure. Elements that
 * would cross the clip rectangle get a clip-path. Output is deterministic
 * and is saved through the same temporary-file-and-rename path as PNG. */
#include "canvas_impl.h"
#include "skv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct svg_canvas {
    canvas base;
    canvas *m;              /* 1x1 PNG canvas that measures text with the same fonts */
    double size[CANVAS_FONT_COUNT]; /* font size by role, px */
    char *buf;              /* the SVG body */
    size_t len, cap;
    int oom;                /* an append failed: saving reports it */
    int clip_id;            /* clipPath id defining clip_def, 0 when none */
    canvas_rect clip_def;
    int next_id;
} svg_canvas;

static svg_canvas *sc_of(canvas *c) { return (svg_canvas *)c; }

static void put(svg_canvas *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(svg_canvas *s, const char *fmt, ...) {
    if (s->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(s->buf + s->len, s->cap - s->len, fmt, ap);
        va_end(ap);
        if (n < 0) { s->oom = 1; return; }
        if ((size_t)n < s->cap - s->len) { s->len += (size_t)n; return; }
        size_t cap = s->cap * 2 + (size_t)n + 1;
        char *b = realloc(s->buf, cap);
        if (!b) { s->oom = 1; return; }
        s->buf = b;
        s->cap = cap;
    }
}

/* A coordinate with at most two decimals and no trailing zeros. */
static const char *num(char *b, double v) {
    if (fabs(v) < 0.005) v = 0;
    snprintf(b, 32, "%.2f", v);
    char *e = b + strlen(b) - 1;
    while (*e == '0') *e-- = 0;
    if (*e == '.') *e = 0;
    return b;
}

/* "#rrggbb" for a colour; CANVAS_DEFAULT is the theme's fg or bg. */
static const char *hex(const svg_canvas *s, canvas_color col, int fill, char *b) {
    if (col == CANVAS_DEFAULT) col = fill ? s->base.theme.bg : s->base.theme.fg;
    if (col & 0xFF000000u) col = fill ? 0xFFFFFF : 0;
    snprintf(b, 8, "#%06x", col & 0xFFFFFFu);
    return b;
}

/* The clip-path attribute for an element with this bounding box: empty when
 * the box is inside the clip, else a reference to a clipPath for the clip. */
static const char *clip_attr(svg_canvas *s, double x0, double y0, double x1, double y1, char *b, size_t n) {
    canvas_rect r = s->base.clip;
    b[0] = 0;
    if (x0 >= r.x && y0 >= r.y && x1 <= r.x + r.w && y1 <= r.y + r.h) return b;
    if (!s->clip_id || memcmp(&s->clip_def, &r, sizeof r) != 0) {
        char a[32], c[32], d[32], e[32];
        s->clip_id = ++s->next_id;
        s->clip_def = r;
        put(s, "<clipPath id=\"c%d\"><rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\"/></clipPath>\n", s->clip_id,
            num(a, r.x), num(c, r.y), num(d, r.w), num(e, r.h));
    }
    snprintf(b, n, " clip-path=\"url(#c%d)\"", s->clip_id);
    return b;
}

static void svg_clear(canvas *c, canvas_color bg) {
    svg_canvas *s = sc_of(c);
    char col[8], w[32], h[32];
    s->len = 0;
    if (s->buf) s->buf[0] = 0;
    s->clip_id = 0;
    put(s, "<rect x=\"0\" y=\"0\" width=\"%s\" height=\"%s\" fill=\"%s\"/>\n", num(w, c->geom.w), num(h, c->geom.h),
        hex(s, bg, 1, col));
}

static void rect_el(svg_canvas *s, double x, double y, double w, double h, canvas_color col) {
    char a[32], b[32], cc[32], d[32], e[8];
    put(s, "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"%s\"/>\n", num(a, x), num(b, y), num(cc, w),
        num(d, h), hex(s, col, 1, e));
}

static void svg_fill_rect(canvas *c, double x, double y, double w, double h, canvas_color col) {
    rect_el(sc_of(c), x, y, w, h, col);
}

/* Rules as rectangles, with square ends and dashes like the PNG back end, cut to the clip. */
static void svg_rule(canvas *c, double x0, double y0, double x1, double y1, canvas_color col, int flags) {
    svg_canvas *s = sc_of(c);
    double t = c->geom.hair, h2 = t / 2;
    int horizontal = (y0 == y1);
    double a = (horizontal ? x0 : y0) - h2, b = (horizontal ? x1 : y1) + h2;
    double dash = (flags & CANVAS_RULE_DASHED) ? 4 * t : b - a, gap = (flags & CANVAS_RULE_DASHED) ? 3 * t : 0;
    canvas_color ink = col == CANVAS_DEFAULT ? c->theme.fg : col;
    canvas_rect r = c->clip;
    for (double u = a; u < b; u += dash + gap) {
        double v = fmin(b, u + dash);
        double rx = horizontal ? u : x0 - h2, ry = horizontal ? y0 - h2 : u;
        double rw = horizontal ? v - u : t, rh = horizontal ? t : v - u;
        double cx0 = fmax(rx, r.x), cy0 = fmax(ry, r.y), cx1 = fmin(rx + rw, r.x + r.w), cy1 = fmin(ry + rh, r.y + r.h);
        if (cx1 > cx0 && cy1 > cy0) rect_el(s, cx0, cy0, cx1 - cx0, cy1 - cy0, ink);
    }
}

static void svg_polyline(canvas *c, const double *xy, int n, double width, canvas_color col) {
    svg_canvas *s = sc_of(c);
    double x0 = INFINITY, y0 = INFINITY, x1 = -INFINITY, y1 = -INFINITY;
    for (int i = 0; i < n; i++) {
        x0 = fmin(x0, xy[2 * i]); x1 = fmax(x1, xy[2 * i]);
        y0 = fmin(y0, xy[2 * i + 1]); y1 = fmax(y1, xy[2 * i + 1]);
    }
    canvas_rect r = c->clip;
    double pad = width / 2 + 1;
    if (x1 + pad < r.x || y1 + pad < r.y || x0 - pad > r.x + r.w || y0 - pad > r.y + r.h) return;
    char clip[64], w[32], ink[8], a[32], b[32];
    clip_attr(s, x0 - pad, y0 - pad, x1 + pad, y1 + pad, clip, sizeof clip);
    put(s, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\" stroke-linejoin=\"round\" stroke-linecap=\"round\"%s points=\"",
        hex(s, col, 0, ink), num(w, width), clip);
    for (int i = 0; i < n; i++) {
        /* a zero-length line still shows as a dot, as on PNG */
        double x = xy[2 * i] + (n == 2 && i == 1 && xy[0] == xy[2] && xy[1] == xy[3] ? 0.01 : 0);
        put(s, "%s%s,%s", i ? " " : "", num(a, fmax(-1e6, fmin(1e6, x))), num(b, fmax(-1e6, fmin(1e6, xy[2 * i + 1]))));
    }
    put(s, "\"/>\n");
}

static void put_escaped(svg_canvas *s, const char *t) {
    for (; *t; t++) {
        unsigned char ch = (unsigned char)*t;
        if (ch == '&') put(s, "&amp;");
        else if (ch == '<') put(s, "&lt;");
        else if (ch == '>') put(s, "&gt;");
        else if (ch < 32) put(s, " ");
        else put(s, "%c", ch);
    }
}

static double svg_text_width(canvas *c, const char *t, int font) { return canvas_text_width(sc_of(c)->m, t, font); }

static void svg_font_metrics(canvas *c, int font, double *ascent, double *descent) {
    canvas_font_metrics(sc_of(c)->m, font, ascent, descent);
}

static void svg_text(canvas *c, double x, double y, const char *t, int font, int vertical, canvas_color col) {
    svg_canvas *s = sc_of(c);
    double asc, desc, w = svg_text_width(c, t, font);
    svg_font_metrics(c, font, &asc, &desc);
    double bw = vertical ? asc + desc : w, bh = vertical ? w : asc + desc;
    canvas_rect r = c->clip;
    if (x + bw < r.x || y + bh < r.y || x > r.x + r.w || y > r.y + r.h) return;
    char clip[64], a[32], b[32], sz[32], ink[8];
    clip_attr(s, x, y, x + bw, y + bh, clip, sizeof clip);
    /* the baseline's start: upright at the top-left plus the ascent; turned, at the bottom */
    double bx = vertical ? x + asc : x, by = vertical ? y + w : y + asc;
    put(s, "<text x=\"%s\" y=\"%s\" font-family=\"%s, sans-serif\" font-size=\"%s\"%s fill=\"%s\"%s", num(a, bx),
        num(b, by), canvas_png_family(s->m, font >= CANVAS_FONT_BOLD), num(sz, s->size[font]),
        font >= CANVAS_FONT_BOLD ? " font-weight=\"bold\"" : "", hex(s, col, 0, ink), clip);
    if (vertical) put(s, " transform=\"rotate(-90 %s %s)\"", a, b);
    put(s, ">");
    put_escaped(s, t);
    put(s, "</text>\n");
}

static int svg_writer(FILE *f, void *ctx, const char *path) {
    svg_canvas *s = ctx;
    if (s->oom) return skv_error(SKV_ENOMEM, "%s: out of memory building the SVG", path);
    char w[32], h[32];
    num(w, s->base.geom.w);
    num(h, s->base.geom.h);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%s\" height=\"%s\" viewBox=\"0 0 %s %s\">\n"
               "<style>rect{shape-rendering:crispEdges}text{white-space:pre}</style>\n", w, h, w, h);
    if (s->len) fwrite(s->buf, 1, s->len, f);
    fputs("</svg>\n", f);
    return ferror(f) ? skv_error(SKV_EIO, "%s: cannot write", path) : SKV_OK;
}

static int svg_save(canvas *c, const char *path, int force) {
    return skv_save_atomic(path, force, svg_writer, sc_of(c));
}

static void svg_free(canvas *c) {
    svg_canvas *s = sc_of(c);
    canvas_free(s->m);
    free(s->buf);
    free(s);
}

static const canvas_ops svg_ops = {
    .name = "svg",
    .clear = svg_clear,
    .fill_rect = svg_fill_rect,
    .polyline = svg_polyline,
    .rule = svg_rule,
    .text = svg_text,
    .text_width = svg_text_width,
    .font_metrics = svg_font_metrics,
    .save = svg_save,
    .free = svg_free,
};

int canvas_svg_new(canvas **out, int width, int height, const canvas_png_opts *opts) {
    *out = NULL;
    if (width < 1 || height < 1 || width > 100000 || height > 100000)
        return skv_error(SKV_ERANGE, "canvas: a %d x %d SVG figure; expected 1..100000 each way", width, height);
    double em = opts && opts->font_px > 0 ? opts->font_px : canvas_figure_em(width, height);
    canvas *m = NULL;
    int rc = canvas_png_new(&m, 1, 1, &(canvas_png_opts){ .scale = 1, .font_px = em, .font_path = opts ? opts->font_path : NULL });
    if (rc) return rc;
    svg_canvas *s = calloc(1, sizeof *s);
    if (!s) { canvas_free(m); return skv_error(SKV_ENOMEM, "canvas: out of memory"); }
    s->m = m;
    s->cap = 1 << 16;
    s->buf = malloc(s->cap);
    if (!s->buf) { canvas_free(m); free(s); return skv_error(SKV_ENOMEM, "canvas: out of memory"); }
    for (int f = 0; f < CANVAS_FONT_COUNT; f++) s->size[f] = canvas_figure_font_px(em, f);
    canvas_figure_geom(&s->base.geom, width, height, em, 1);
    canvas_init_base(&s->base, &svg_ops, &canvas_figure_theme);
    svg_clear(&s->base, canvas_figure_theme.bg);
    *out = &s->base;
    return SKV_OK;
}

int canvas_svg_save(canvas *c, const char *path, int force) {
    if (!c || c->ops != &svg_ops) return skv_error(SKV_EINVAL, "canvas_svg_save: not an SVG canvas");
    return canvas_save(c, path, force);
}
