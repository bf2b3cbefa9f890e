/* paint.h: painters that draw a whole figure into any canvas.
 *
 * Each painter is a pure function of (canvas, rectangle, data, options): it
 * lays out in the canvas's units with the canvas's font metrics, draws only
 * inside the rectangle, and copes with any size (a rectangle too small for
 * everything loses the axis labels, then the legend, then the title, and at
 * worst draws nothing). Views compute what to show from probe data and hand
 * it to a painter; the TUI and the PNG export then share the drawing code.
 *
 * Every painter can fill a paint_result telling where things landed (the
 * data area, the axis lines, marker positions, the legend), which the TUI
 * uses for mouse hits and the tests use to check pixels.
 *
 * Data arrays are borrowed for the duration of the call; painters keep
 * nothing. All return 0, or a negative SKV_E* with skv_error() set. */
#ifndef SKV_PAINT_H
#define SKV_PAINT_H

#include "canvas.h"

/* ---- palette ---- */

#define PALETTE_CAT_N 8

/* Viridis-like ramp, t in [0, 1] (clamped), monotonic in luminance; NaN gives CANVAS_NONE. */
canvas_color palette_viridis(double t);

/* Colour-blind-safe categorical colour i (modulo PALETTE_CAT_N), entries
 * distinct in lightness as well as hue. */
canvas_color palette_cat(int i);

/* CIE L* (0..100) of a colour. */
double palette_lightness(canvas_color c);

/* A colour field left as PAINT_AUTO gets the painter's default. */
#define PAINT_AUTO ((canvas_color)0xFD000000u)

/* ---- shared pieces ---- */

typedef struct paint_axis {
    const char *label;      /* e.g. "singular value"; NULL for none */
    const char *unit;       /* e.g. "ms", drawn as "label (ms)"; NULL for none */
    int log;                /* log10 scale; values <= 0 are left out */
    double min, max;        /* range; min >= max (say both 0) takes it from the data */
    int integer;            /* 1: ticks at whole numbers only (steps, layers, counts) */
    const double *at;       /* plot: (n_at) tick values to label (e.g. the budgets measured), or NULL for
                               ticks of its own; used when their labels fit */
    int n_at;
} paint_axis;

typedef struct paint_category {
    const char *name;       /* legend entry; NULL leaves it out of the legend */
    canvas_color color;     /* PAINT_AUTO: palette_cat(index); CANVAS_NONE: background */
    const char *glyph;      /* one ASCII character drawn for it on a terminal without colour (canvas_geom.mono);
                               NULL: paint_cat_glyph(index). Glyphs of one figure must differ. */
} paint_category;

/* The default glyph of category i on a colourless terminal: # o x + = * % @ (distinct). */
const char *paint_cat_glyph(int i);

#define PAINT_MAX_MARKERS 16

/* Where a painter put things, in canvas units. */
typedef struct paint_result {
    canvas_rect area;       /* the data area: plot, heatmap/raster cells, strip, gantt rows, table body */
    double x0, x1;          /* data x at the left and right edges of area */
    double y0, y1;          /* data y at the bottom and top edges (ydown: at the top and bottom) */
    int xlog, ylog, ydown;  /* how paint_map_x/y map data to canvas */
    double axis_x;          /* centre line of the y axis (x), NaN when not drawn */
    double axis_y;          /* centre line of the x axis (y), NaN when not drawn */
    int n_markers;
    double marker_x[PAINT_MAX_MARKERS]; /* plot: centre of each marker line (NaN when off the range);
                             * heatmap: centre x of each marked cell; raster: the highlighted column */
    canvas_rect legend;     /* legend box (strip: the marker lanes); w = 0 when none */
    canvas_rect colorbar;   /* colour ramp of the colour bar; w = 0 when none */
    canvas_rect title;      /* title box; w = 0 when none */
    int shown;              /* rows shown (table, gantt) */
    int complete;           /* 1 when everything fitted; 0 when parts were dropped */
} paint_result;

/* Data value to canvas coordinate through a result (NaN when unmappable). */
double paint_map_x(const paint_result *r, double v);
double paint_map_y(const paint_result *r, double v);

/* ---- line / log plot ---- */

typedef struct paint_series {
    const char *name;       /* legend entry; NULL leaves it out */
    const double *x;        /* (n) x values, or NULL for 0, 1, ..., n-1 */
    const double *y;        /* (n) y values; NaN breaks the line */
    int n;
    canvas_color color;     /* PAINT_AUTO: palette_cat(series index) */
    double width;           /* line width; 0: the canvas's default */
    int markers;            /* 1: a square at each point (PNG, SVG), so single points show */
    const unsigned char *hollow; /* (n) with markers: 1 draws point i's square hollow (a point set apart,
                                    as a budget under a policy's floor); NULL: every square filled */
} paint_series;

typedef struct paint_marker {
    double x;               /* data x of a vertical dashed line, e.g. the rank cut */
    const char *label;      /* e.g. "r=160", written beside the top of the line */
    canvas_color color;     /* PAINT_AUTO: the theme's text colour */
} paint_marker;

typedef struct paint_band {
    double x0, x1;          /* data x range to shade, e.g. the local window */
    const char *label;      /* legend entry; NULL for none */
    canvas_color color;     /* PAINT_AUTO: the theme's band colour */
} paint_band;

typedef struct paint_plot {
    const char *title;
    paint_axis x, y;
    const paint_series *series; int n_series;
    const paint_marker *markers; int n_markers;   /* at most PAINT_MAX_MARKERS are reported */
    const paint_band *bands; int n_bands;
    int no_legend;          /* 1: never a legend (else: one when anything is named) */
    int no_grid;            /* 1: no grid lines (the terminal never draws them) */
} paint_plot;

int paint_draw_plot(canvas *c, canvas_rect r, const paint_plot *p, paint_result *res);

/* ---- heatmap with colour bar ---- */

typedef struct paint_cellmark { int col, row; } paint_cellmark;

typedef struct paint_heatmap {
    const char *title;
    const float *v;         /* (ny, nx) row-major, row 0 at the top; NaN: no data */
    int nx, ny;
    paint_axis x, y;        /* labels; min/max: data values at the outer edges (default 0..nx, 0..ny); log ignored */
    const char *const *xticks; /* (nx) a label per column, or NULL for numeric ticks */
    const char *const *yticks; /* (ny) a label per row, or NULL for numeric ticks */
    paint_axis value;       /* colour bar: label, unit, range (default: data), log */
    const paint_cellmark *marks; int n_marks;     /* cells to outline, e.g. the needle */
    const char *mark_label; /* legend entry for the marks, e.g. "needle" */
    const char *annotate;   /* printf format taking one double, printed in each cell ("%.2f"); NULL for none */
    int no_colorbar;        /* 1: no colour bar (panels that share one drawn beside the last) */
} paint_heatmap;

int paint_draw_heatmap(canvas *c, canvas_rect r, const paint_heatmap *h, paint_result *res);

/* The width a heatmap's colour bar takes (ramp, tick labels up to "100",
 * its label) on c: what panels that share one bar (paint_heatmap.no_colorbar)
 * give to the panel that draws it. */
double paint_colorbar_room(canvas *c);

/* ---- categorical raster ---- */

enum { PAINT_HI_COL = 1, PAINT_HI_ROW = 2 };

typedef struct paint_raster {
    const char *title;
    const uint8_t *cat;     /* (ny, nx) category per cell, row 0 at the top; >= n_cats: empty.
                             * Where cells share a pixel the highest category wins: put rare, important ones last. */
    int nx, ny;
    const paint_category *cats; int n_cats;
    paint_axis x, y;        /* labels; min/max: data values at the outer edges (default 0..nx, 0..ny) */
    int highlight;          /* PAINT_HI_COL | PAINT_HI_ROW */
    int hi_col, hi_row;     /* the highlighted column and row (the current step) */
} paint_raster;

int paint_draw_raster(canvas *c, canvas_rect r, const paint_raster *g, paint_result *res);

/* ---- 1-D heat strip with marker lanes ---- */

typedef struct paint_span {
    double x0, x1;          /* data x range, e.g. chunk ids [x0, x1) */
    int cat;                /* index into the strip's cats: which lane */
} paint_span;

typedef struct paint_strip {
    const char *title;
    const float *v; int n;  /* value per element (e.g. cos-minimum per chunk); NaN: no data */
    paint_axis x;           /* label; min/max: data x at the left edge of element 0 and the right edge of n-1 */
    paint_axis value;       /* colour bar */
    const paint_category *cats; int n_cats;   /* marker kinds, one lane each above the strip */
    const paint_span *spans; int n_spans;
} paint_strip;

int paint_draw_strip(canvas *c, canvas_rect r, const paint_strip *s, paint_result *res);

/* ---- gantt timeline ---- */

typedef struct paint_bar {
    int row;                /* stream */
    int op;                 /* index into ops: the bar's colour */
    double t0, t1;          /* start and end, in the time axis's unit */
} paint_bar;

typedef struct paint_gantt {
    const char *title;
    const char *const *rows; int n_rows;      /* stream names: compute, fetch, rebuild */
    const paint_category *ops; int n_ops;     /* op names and colours, for the legend */
    const paint_bar *bars; int n_bars;
    paint_axis t;           /* e.g. label "time", unit "ms"; range default from the bars */
} paint_gantt;

int paint_draw_gantt(canvas *c, canvas_rect r, const paint_gantt *g, paint_result *res);

/* ---- text table ---- */

enum { PAINT_ALIGN_LEFT = 0, PAINT_ALIGN_RIGHT = 1, PAINT_ALIGN_CENTER = 2 };

typedef struct paint_column {
    const char *header;
    int align;              /* PAINT_ALIGN_* */
} paint_column;

typedef struct paint_table {
    const char *title;
    const paint_column *cols; int n_cols;
    const char *const *cells; int n_rows;     /* (n_rows, n_cols) row-major; NULL: empty cell */
    int highlight;          /* 1: highlight row hi_row */
    int hi_row;
} paint_table;

int paint_draw_table(canvas *c, canvas_rect r, const paint_table *t, paint_result *res);

#endif
