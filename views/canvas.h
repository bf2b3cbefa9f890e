/* canvas.h: one small drawing interface with two back ends, so that a view
 * draws the same figure into a terminal and into a PNG file.
 *
 * A canvas has a size in its own units and a handful of primitives: filled
 * rectangles, anti-aliased lines and polylines, axis-aligned rules (axes,
 * ticks, marker lines), and text with font metrics. Painters (paint.h) lay
 * out in those units, asking the canvas for text widths and the sizes in
 * canvas_geom, so the same painter gives a sensible layout in an 80x24
 * terminal and in a 1200x700 figure.
 *
 * Back ends:
 *   cells  a grid of terminal cells (code point, fg/bg RGB, attributes) that
 *          the TUI blits to curses; 1 unit = 1 cell, lines are braille dots
 *          (2x4 per cell), fills are half blocks (2 rows per cell), rules are
 *          box-drawing characters. An ASCII mode avoids everything above 127.
 *   png    an RGBA buffer saved with libpng; 1 unit = 1 logical pixel, and a
 *          scale factor multiplies every size (scale 2 = a crisp 2x figure).
 *          Text comes from FreeType and the DejaVu fonts.
 *   svg    the same figure as vector elements, text measured with the same
 *          fonts, so its layout matches the PNG.
 *
 * Coordinates: x to the right, y down, (0,0) the top-left corner. Fills cover
 * the pixels (or half cells) whose centres lie inside the rectangle, and at
 * least one when the rectangle is non-empty, so thin bars never vanish.
 * Every primitive is clipped to the current clip rectangle, which never
 * extends beyond the canvas: nothing is ever written outside it. */
#ifndef SKV_CANVAS_H
#define SKV_CANVAS_H

#include <stddef.h>
#include <stdint.h>

typedef struct canvas canvas;

/* 0x00RRGGBB, or one of the two special values below. */
typedef uint32_t canvas_color;
#define CANVAS_RGB(r, g, b) ((canvas_color)(((uint32_t)(r) << 16) | ((uint32_t)(g) << 8) | (uint32_t)(b)))
#define CANVAS_NONE    ((canvas_color)0xFF000000u) /* draw nothing (transparent) */
#define CANVAS_DEFAULT ((canvas_color)0xFE000000u) /* terminal default colour; PNG: theme fg or bg */

typedef struct canvas_rect { double x, y, w, h; } canvas_rect;

/* Text roles; each back end maps them to a size and weight. */
enum canvas_font {
    CANVAS_FONT_SMALL = 0,  /* tick labels, legends */
    CANVAS_FONT_BODY = 1,   /* axis labels, table cells */
    CANVAS_FONT_BOLD = 2,   /* body size, bold (table headers) */
    CANVAS_FONT_TITLE = 3,  /* figure titles, bold */
    CANVAS_FONT_COUNT
};

/* Text anchor: one horizontal and one vertical flag. CANVAS_VERTICAL turns
 * the text 90 degrees counter-clockwise (reading upwards); its box is then
 * centred on y, and the horizontal flag places the box's left edge, centre or
 * right edge at x. */
enum {
    CANVAS_LEFT = 0, CANVAS_CENTER = 1, CANVAS_RIGHT = 2,
    CANVAS_TOP = 0, CANVAS_MIDDLE = 4, CANVAS_BASELINE = 8, CANVAS_BOTTOM = 12,
    CANVAS_VERTICAL = 16,
};
#define CANVAS_HALIGN(a) ((a) & 3)
#define CANVAS_VALIGN(a) ((a) & 12)

/* Rule flags. */
enum { CANVAS_RULE_DASHED = 1 };

/* Sizes a painter lays out with, in canvas units. */
typedef struct canvas_geom {
    double w, h;            /* canvas size */
    double em;              /* body text size (PNG: px; cells: 1) */
    double hair;            /* thickness of a rule (axis line); an integer */
    double tick;            /* length of a tick mark */
    double pad;             /* small gap between a label and what it labels */
    double line_w;          /* default width of a data line */
    double dot_w, dot_h;    /* resolution of lines (PNG: 1/scale; cells: braille dot) */
    double fill_w, fill_h;  /* resolution of fills (PNG: 1/scale; cells: 1 x 1/2) */
    int cells;              /* 1 for the terminal grid: coarse, no rotated text */
    int ascii;              /* only ASCII glyphs may be used */
    int mono;               /* no colour: categories must differ by glyph (painters draw paint_category glyphs) */
    int rotate_text;        /* CANVAS_VERTICAL text is supported */
} canvas_geom;

/* Colours a painter uses for the furniture of a figure. */
typedef struct canvas_theme {
    canvas_color bg;        /* background */
    canvas_color fg;        /* text, titles */
    canvas_color muted;     /* tick labels, secondary text */
    canvas_color axis;      /* axis lines and ticks */
    canvas_color grid;      /* grid lines; CANVAS_NONE for none */
    canvas_color band;      /* shaded x-range bands */
    canvas_color highlight; /* current step / selected row */
} canvas_theme;

/* ---- shared primitives (canvas.c) ---- */

const canvas_geom *canvas_geometry(const canvas *c);
const canvas_theme *canvas_get_theme(const canvas *c);

/* Fills the whole canvas with the theme background and resets the clip. */
void canvas_clear(canvas *c);

/* Sets the clip rectangle (intersected with the canvas) and returns the
 * previous one, so a painter can restore it: old = canvas_clip(c, r); ...
 * canvas_clip(c, old). */
canvas_rect canvas_clip(canvas *c, canvas_rect r);
canvas_rect canvas_get_clip(const canvas *c);

void canvas_fill_rect(canvas *c, double x, double y, double w, double h, canvas_color col);

/* An anti-aliased line of the given width (0 = geom line_w). */
void canvas_line(canvas *c, double x0, double y0, double x1, double y1, double width, canvas_color col);

/* xy holds n points (x0,y0,x1,y1,...); a NaN coordinate breaks the line. */
void canvas_polyline(canvas *c, const double *xy, int n, double width, canvas_color col);

/* A horizontal (y0 == y1) or vertical (x0 == x1) rule of thickness hair,
 * centred on the segment, with square ends reaching hair/2 past the end
 * points on PNG; on cells, rules that meet join into box-drawing corners and
 * tees, and a rule ending at a cell's centre draws only half of it. */
void canvas_rule(canvas *c, double x0, double y0, double x1, double y1, canvas_color col, int flags);

/* Draws UTF-8 text anchored at (x, y) and returns its advance width. */
double canvas_text(canvas *c, double x, double y, const char *utf8, int font, int align, canvas_color col);
double canvas_text_width(canvas *c, const char *utf8, int font);

/* Ascent and descent above and below the baseline; their sum is the line height. */
void canvas_font_metrics(canvas *c, int font, double *ascent, double *descent);
double canvas_line_height(canvas *c, int font);

/* Writes a PNG or SVG canvas to path (see canvas_png_save); cells have no file form. */
int canvas_save(canvas *c, const char *path, int force);

void canvas_free(canvas *c);

/* Relative luminance (0 black .. 1 white) of an RGB colour; 0.5 for the special values. */
double canvas_luma(canvas_color col);

/* Decodes one UTF-8 code point at *s, advancing *s; invalid bytes give U+FFFD. */
uint32_t canvas_utf8_next(const char **s);

/* ---- cells back end (canvas_cells.c) ---- */

enum {
    CANVAS_CELLS_ASCII = 1, /* only ASCII: braille -> .:'|, blocks -> shade letters, rules -> -|+ */
    CANVAS_CELLS_MONO = 2,  /* fills drawn as shade glyphs by luminance, for terminals without colour */
};
enum { CANVAS_ATTR_BOLD = 1, CANVAS_ATTR_UNDERLINE = 2 };

typedef struct canvas_cell {
    uint32_t ch;            /* Unicode code point; ' ' when blank */
    canvas_color fg, bg;    /* RGB or CANVAS_DEFAULT */
    uint8_t attr;           /* CANVAS_ATTR_* */
} canvas_cell;

/* A cols x rows grid cleared to the default colours. */
int canvas_cells_new(canvas **out, int cols, int rows, unsigned flags);

/* The composed grid, (rows, cols) row-major; valid until the next drawing
 * call or canvas_free. */
const canvas_cell *canvas_cells_grid(canvas *c, int *cols, int *rows);

/* The grid as UTF-8 text, one line per row ending in '\n' (colours dropped);
 * the caller frees it. NULL if c is not a cells canvas or memory runs out. */
char *canvas_cells_text(canvas *c);

/* ---- PNG back end (canvas_png.c) ---- */

typedef struct canvas_png_opts {
    int scale;              /* every size times this; 0 means 1 */
    double font_px;         /* body text size in logical px; 0 picks one from the canvas size */
    const char *font_path;  /* a TrueType font; NULL means DejaVu Sans (then DejaVu Sans Mono) */
} canvas_png_opts;

/* A width x height figure in logical pixels (the image is scale times
 * larger), cleared to white. Fails with a one-line error when no font is found. */
int canvas_png_new(canvas **out, int width, int height, const canvas_png_opts *opts);

/* The RGBA pixels, (height*scale, width*scale, 4), and their size. */
const uint8_t *canvas_png_pixels(const canvas *c, int *width, int *height);

/* Writes the image to path: refuses to replace an existing file unless
 * force, writes a temporary file in the same directory and renames it, so a
 * failed save never leaves a partial file. Identical drawing gives identical
 * bytes (no time stamp). */
int canvas_png_save(canvas *c, const char *path, int force);

/* ---- SVG back end (canvas_svg.c) ---- */

/* A width x height vector figure with the same fonts, sizes and layout as a
 * PNG of that size (opts: font_px and font_path as for PNG; scale unused). */
int canvas_svg_new(canvas **out, int width, int height, const canvas_png_opts *opts);

/* Writes the SVG to path, with the same rules as canvas_png_save. */
int canvas_svg_save(canvas *c, const char *path, int force);

#endif
