/* canvas_cells.c: the terminal back end of the canvas, a grid of cells.
 *
 * One unit is one cell. Each cell keeps layers that are composed on demand
 * into a canvas_cell (code point, fg, bg, attributes) for the TUI to blit:
 *   fills  two colours, top and bottom half (drawn as half blocks, so a
 *          heatmap gets two rows per cell);
 *   rules  box-drawing bits (up, down, left, right) that join into corners
 *          and tees where an axis meets a tick or another axis;
 *   dots   a 2x4 braille pattern for lines, as btop draws its graphs;
 *   text   one code point.
 * Text wins over dots, dots over rules, rules over fills. The ASCII mode
 * maps braille to . ' - : |, rules to - | +, and the MONO mode draws fills
 * as shade glyphs by luminance for terminals without colour. This file
 * never includes curses: mapping RGB to the terminal's colours is the TUI's. */
#include "canvas_impl.h"
#include "skv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { RB_U = 1, RB_D = 2, RB_L = 4, RB_R = 8, RB_H = 16, RB_V = 32, RB_DASH = 64 };

typedef struct cell_state {
    canvas_color half[2];   /* top and bottom fill; CANVAS_NONE when unfilled */
    canvas_color dot_fg, rule_fg, text_fg;
    uint32_t text;          /* code point, 0 when none */
    uint8_t dots;           /* braille bit pattern */
    uint8_t rule;           /* RB_* */
    uint8_t attr;
} cell_state;

typedef struct cells_canvas {
    canvas base;
    int cols, rows;
    unsigned flags;
    cell_state *st;         /* (rows, cols) */
    canvas_cell *out;       /* (rows, cols), composed by canvas_cells_grid */
} cells_canvas;

static const canvas_theme cells_theme = {
    .bg = CANVAS_DEFAULT,
    .fg = CANVAS_DEFAULT,
    .muted = CANVAS_RGB(0x9a, 0x9a, 0x9a),
    .axis = CANVAS_RGB(0x8a, 0x8a, 0x8a),
    .grid = CANVAS_NONE,
    .band = CANVAS_RGB(0x3a, 0x3a, 0x3a),
    .highlight = CANVAS_RGB(0xff, 0xff, 0xff),
};

/* Braille dot bits by (column, row) inside a cell, as Unicode numbers them. */
static const uint8_t braille_bit[2][4] = { { 0x01, 0x02, 0x04, 0x40 }, { 0x08, 0x10, 0x20, 0x80 } };

/* Box-drawing characters by RB_U|RB_D|RB_L|RB_R. */
static const uint32_t box_char[16] = {
    [0] = ' ', [RB_U] = 0x2575, [RB_D] = 0x2577, [RB_U | RB_D] = 0x2502,
    [RB_L] = 0x2574, [RB_U | RB_L] = 0x2518, [RB_D | RB_L] = 0x2510, [RB_U | RB_D | RB_L] = 0x2524,
    [RB_R] = 0x2576, [RB_U | RB_R] = 0x2514, [RB_D | RB_R] = 0x250C, [RB_U | RB_D | RB_R] = 0x251C,
    [RB_L | RB_R] = 0x2500, [RB_U | RB_L | RB_R] = 0x2534, [RB_D | RB_L | RB_R] = 0x252C,
    [RB_U | RB_D | RB_L | RB_R] = 0x253C,
};

static const uint32_t shade_unicode[] = { ' ', 0x2591, 0x2592, 0x2593, 0x2588 };
static const char shade_ascii[] = " .:-=+*#%@";

static cells_canvas *cc_of(canvas *c) { return (cells_canvas *)c; }

static void cells_clear(canvas *c, canvas_color bg) {
    cells_canvas *g = cc_of(c);
    canvas_color f = (bg == CANVAS_DEFAULT) ? CANVAS_NONE : bg;
    for (long i = 0; i < (long)g->cols * g->rows; i++) {
        memset(&g->st[i], 0, sizeof g->st[i]);
        g->st[i].half[0] = g->st[i].half[1] = f;
    }
}

/* Clamps a slot range to [0, n). */
static void clamp_range(long *i0, long *i1, long n) {
    if (*i0 < 0) *i0 = 0;
    if (*i1 > n) *i1 = n;
}

static void cells_fill_rect(canvas *c, double x, double y, double w, double h, canvas_color col) {
    cells_canvas *g = cc_of(c);
    long c0, c1, h0, h1;
    canvas_span_slots(x, x + w, 1.0, &c0, &c1);
    canvas_span_slots(y, y + h, 0.5, &h0, &h1);
    clamp_range(&c0, &c1, g->cols);
    clamp_range(&h0, &h1, 2L * g->rows);
    canvas_color f = (col == CANVAS_DEFAULT) ? CANVAS_NONE : col;
    for (long hr = h0; hr < h1; hr++)
        for (long k = c0; k < c1; k++) {
            cell_state *s = &g->st[(hr / 2) * g->cols + k];
            s->half[hr & 1] = f;
            s->dots = 0;
            s->rule = 0;
            s->text = 0;
        }
}

/* True when the centre of cell (col, row) lies inside the clip rectangle. */
static int cell_in_clip(const canvas *c, long col, long row) {
    const canvas_rect *r = &c->clip;
    double cx = col + 0.5, cy = row + 0.5;
    return cx >= r->x && cx < r->x + r->w && cy >= r->y && cy < r->y + r->h;
}

static void set_dot(cells_canvas *g, long dx, long dy, canvas_color col) {
    const canvas_rect *r = &g->base.clip;
    double cx = (dx + 0.5) * 0.5, cy = (dy + 0.5) * 0.25;
    if (dx < 0 || dy < 0 || dx >= 2L * g->cols || dy >= 4L * g->rows) return;
    if (cx < r->x || cx >= r->x + r->w || cy < r->y || cy >= r->y + r->h) return;
    cell_state *s = &g->st[(dy / 4) * g->cols + dx / 2];
    s->dots |= braille_bit[dx & 1][dy & 3];
    s->dot_fg = col;
}

/* Bresenham on the braille dot grid (2 x 4 dots per cell). */
static void cells_segment(cells_canvas *g, double x0, double y0, double x1, double y1, canvas_color col) {
    canvas_rect r = g->base.clip;
    if (!canvas_clip_segment(r, &x0, &y0, &x1, &y1)) return;
    long ax = (long)floor(x0 * 2), ay = (long)floor(y0 * 4);
    long bx = (long)floor(x1 * 2), by = (long)floor(y1 * 4);
    long dx = labs(bx - ax), dy = -labs(by - ay);
    long sx = ax < bx ? 1 : -1, sy = ay < by ? 1 : -1, err = dx + dy;
    for (long guard = 0; guard <= dx - dy + 1; guard++) {
        set_dot(g, ax, ay, col);
        if (ax == bx && ay == by) break;
        long e2 = 2 * err;
        if (e2 >= dy) { err += dy; ax += sx; }
        if (e2 <= dx) { err += dx; ay += sy; }
    }
}

static void cells_polyline(canvas *c, const double *xy, int n, double width, canvas_color col) {
    (void)width;
    for (int i = 0; i + 1 < n; i++)
        cells_segment(cc_of(c), xy[2 * i], xy[2 * i + 1], xy[2 * i + 2], xy[2 * i + 3], col);
}

/* Marks the cells a rule covers along one axis: cell k gets the "before"
 * bit when the rule reaches into its first half, "after" into its second. */
static void rule_cells(double a, double b, long n, long *k0, long *k1) {
    if (b > a) { *k0 = (long)floor(a); *k1 = (long)ceil(b); }
    else { *k0 = (long)floor(a); *k1 = *k0 + 1; }
    if (*k0 < 0) *k0 = 0;
    if (*k1 > n) *k1 = n;
}

static void cells_rule(canvas *c, double x0, double y0, double x1, double y1, canvas_color col, int flags) {
    cells_canvas *g = cc_of(c);
    int horizontal = (y0 == y1);
    long k0, k1;
    if (horizontal) {
        long row = (long)floor(y0);
        if (row < 0 || row >= g->rows) return;
        rule_cells(x0, x1, g->cols, &k0, &k1);
        for (long k = k0; k < k1; k++) {
            if (!cell_in_clip(c, k, row)) continue;
            cell_state *s = &g->st[row * g->cols + k];
            uint8_t bits = RB_H;
            if (x0 < k + 0.5 || x1 == x0) bits |= RB_L;
            if (x1 > k + 0.5 || x1 == x0) bits |= RB_R;
            if (flags & CANVAS_RULE_DASHED) bits |= RB_DASH;
            s->rule |= bits;
            s->rule_fg = col;
        }
    } else {
        long colm = (long)floor(x0);
        if (colm < 0 || colm >= g->cols) return;
        rule_cells(y0, y1, g->rows, &k0, &k1);
        for (long k = k0; k < k1; k++) {
            if (!cell_in_clip(c, colm, k)) continue;
            cell_state *s = &g->st[k * g->cols + colm];
            uint8_t bits = RB_V;
            if (y0 < k + 0.5 || y1 == y0) bits |= RB_U;
            if (y1 > k + 0.5 || y1 == y0) bits |= RB_D;
            if (flags & CANVAS_RULE_DASHED) bits |= RB_DASH;
            s->rule |= bits;
            s->rule_fg = col;
        }
    }
}

static void cells_text(canvas *c, double x, double y, const char *s, int font, int vertical, canvas_color col) {
    cells_canvas *g = cc_of(c);
    long col0 = lround(x), row0 = lround(y);
    for (long i = 0; *s; i++) {
        uint32_t cp = canvas_utf8_next(&s);
        if (cp < 32 || cp == 127) cp = ' ';
        long cx = vertical ? col0 : col0 + i, cy = vertical ? row0 + i : row0;
        if (cx < 0 || cy < 0 || cx >= g->cols || cy >= g->rows || !cell_in_clip(c, cx, cy)) continue;
        cell_state *st = &g->st[cy * g->cols + cx];
        st->text = cp;
        st->text_fg = col;
        st->attr = font >= CANVAS_FONT_BOLD ? CANVAS_ATTR_BOLD : 0;
    }
}

static double cells_text_width(canvas *c, const char *s, int font) {
    (void)c; (void)font;
    double n = 0;
    while (*s) { canvas_utf8_next(&s); n += 1; }
    return n;
}

static void cells_font_metrics(canvas *c, int font, double *ascent, double *descent) {
    (void)c; (void)font;
    *ascent = 1;
    *descent = 0;
}

static void cells_free(canvas *c) {
    cells_canvas *g = cc_of(c);
    free(g->st);
    free(g->out);
    free(g);
}

static const canvas_ops cells_ops = {
    .name = "cells",
    .clear = cells_clear,
    .fill_rect = cells_fill_rect,
    .polyline = cells_polyline,
    .rule = cells_rule,
    .text = cells_text,
    .text_width = cells_text_width,
    .font_metrics = cells_font_metrics,
    .save = NULL,
    .free = cells_free,
};

int canvas_cells_new(canvas **out, int cols, int rows, unsigned flags) {
    *out = NULL;
    if (cols < 1 || rows < 1 || cols > 10000 || rows > 10000)
        return skv_error(SKV_EINVAL, "canvas: a cells grid of %d x %d; expected 1..10000 each way", cols, rows);
    cells_canvas *g = calloc(1, sizeof *g);
    if (!g) return skv_error(SKV_ENOMEM, "canvas: out of memory for a %d x %d grid", cols, rows);
    g->cols = cols;
    g->rows = rows;
    g->flags = flags;
    g->st = calloc((size_t)cols * rows, sizeof *g->st);
    g->out = calloc((size_t)cols * rows, sizeof *g->out);
    if (!g->st || !g->out) {
        free(g->st); free(g->out); free(g);
        return skv_error(SKV_ENOMEM, "canvas: out of memory for a %d x %d grid", cols, rows);
    }
    int coarse = (flags & (CANVAS_CELLS_ASCII | CANVAS_CELLS_MONO)) != 0;
    g->base.geom = (canvas_geom){
        .w = cols, .h = rows, .em = 1, .hair = 1, .tick = 0.5, .pad = 0, .line_w = 1,
        .dot_w = 0.5, .dot_h = 0.25, .fill_w = 1, .fill_h = coarse ? 1 : 0.5,
        .cells = 1, .ascii = (flags & CANVAS_CELLS_ASCII) != 0, .mono = (flags & CANVAS_CELLS_MONO) != 0,
        .rotate_text = 0,
    };
    canvas_init_base(&g->base, &cells_ops, &cells_theme);
    cells_clear(&g->base, cells_theme.bg);
    *out = &g->base;
    return SKV_OK;
}

/* ASCII stand-in for a braille pattern, by which of the four dot rows are set. */
static uint32_t ascii_dots(uint8_t d) {
    int rows = ((d & 0x09) ? 1 : 0) | ((d & 0x12) ? 2 : 0) | ((d & 0x24) ? 4 : 0) | ((d & 0xC0) ? 8 : 0);
    if (rows == 15) return '|';
    if ((rows & 3) && (rows & 12)) return ':';
    if (rows == 2 || rows == 4) return '-';
    return (rows & 3) ? '\'' : '.';
}

/* ASCII stand-in for a non-ASCII code point in text. */
static uint32_t ascii_text(uint32_t cp) {
    if (cp < 128) return cp;
    switch (cp) {
    case 0x2212: case 0x2013: case 0x2014: return '-';
    case 0x00D7: return 'x';
    case 0x2026: return '~';
    case 0x00B7: case 0x2022: return '*';
    case 0x00B5: return 'u';
    default: return '?';
    }
}

static uint32_t rule_char(uint8_t r, int ascii) {
    int h = (r & RB_H) != 0, v = (r & RB_V) != 0, dash = (r & RB_DASH) != 0;
    if (ascii) return h && v ? '+' : h ? '-' : dash ? ':' : '|';
    if (h && !v) return dash ? 0x2504 : 0x2500;
    if (v && !h) return dash ? 0x2506 : 0x2502;
    uint32_t ch = box_char[r & 15];
    return ch == ' ' ? 0x253C : ch;
}

static canvas_color out_color(canvas_color c) { return c == CANVAS_NONE ? CANVAS_DEFAULT : c; }

static void compose_cell(const cells_canvas *g, const cell_state *s, canvas_cell *o) {
    int ascii = (g->flags & CANVAS_CELLS_ASCII) != 0, mono = (g->flags & CANVAS_CELLS_MONO) != 0;
    canvas_color top = s->half[0], bot = s->half[1];
    canvas_color under = out_color(top != CANVAS_NONE ? top : bot);
    o->attr = 0;
    o->bg = mono ? CANVAS_DEFAULT : under;
    if (s->text) {
        o->ch = ascii ? ascii_text(s->text) : s->text;
        o->fg = s->text_fg;
        o->attr = s->attr;
    } else if (s->dots) {
        o->ch = ascii ? ascii_dots(s->dots) : 0x2800u + s->dots;
        o->fg = s->dot_fg;
    } else if (s->rule) {
        o->ch = rule_char(s->rule, ascii);
        o->fg = s->rule_fg;
    } else if (mono) {
        /* Shade by mean luminance; unfilled halves count as dark. */
        double l = ((top == CANVAS_NONE ? 0 : canvas_luma(top)) + (bot == CANVAS_NONE ? 0 : canvas_luma(bot))) / 2;
        double v = sqrt(l); /* perceptual-ish spread; a filled cell never shows blank */
        if (ascii) o->ch = (uint32_t)shade_ascii[1 + (int)fmin(8, floor(v * 9))];
        else o->ch = shade_unicode[1 + (int)fmin(3, floor(v * 4))];
        o->fg = out_color(top != CANVAS_NONE ? top : bot);
        if (top == CANVAS_NONE && bot == CANVAS_NONE) { o->ch = ' '; o->fg = CANVAS_DEFAULT; }
    } else if (top == bot || ascii) {
        o->ch = ' ';
        o->fg = CANVAS_DEFAULT;
    } else if (top == CANVAS_NONE) {
        o->ch = 0x2584; /* lower half block */
        o->fg = bot;
        o->bg = CANVAS_DEFAULT;
    } else {
        o->ch = 0x2580; /* upper half block */
        o->fg = top;
        o->bg = out_color(bot);
    }
    if (o->fg == CANVAS_NONE) o->fg = CANVAS_DEFAULT;
}

const canvas_cell *canvas_cells_grid(canvas *c, int *cols, int *rows) {
    if (!c || c->ops != &cells_ops) return NULL;
    cells_canvas *g = cc_of(c);
    for (long i = 0; i < (long)g->cols * g->rows; i++) compose_cell(g, &g->st[i], &g->out[i]);
    if (cols) *cols = g->cols;
    if (rows) *rows = g->rows;
    return g->out;
}

static int put_utf8(char *p, uint32_t cp) {
    if (cp < 0x80) { p[0] = (char)cp; return 1; }
    if (cp < 0x800) { p[0] = (char)(0xC0 | cp >> 6); p[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        p[0] = (char)(0xE0 | cp >> 12); p[1] = (char)(0x80 | ((cp >> 6) & 63)); p[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    p[0] = (char)(0xF0 | cp >> 18); p[1] = (char)(0x80 | ((cp >> 12) & 63));
    p[2] = (char)(0x80 | ((cp >> 6) & 63)); p[3] = (char)(0x80 | (cp & 63));
    return 4;
}

char *canvas_cells_text(canvas *c) {
    int cols, rows;
    const canvas_cell *grid = canvas_cells_grid(c, &cols, &rows);
    if (!grid) return NULL;
    char *buf = malloc((size_t)rows * (cols * 4 + 1) + 1), *p = buf;
    if (!buf) return NULL;
    for (int r = 0; r < rows; r++) {
        for (int k = 0; k < cols; k++) p += put_utf8(p, grid[(long)r * cols + k].ch);
        *p++ = '\n';
    }
    *p = 0;
    return buf;
}
