/* canvas_impl.h: what the canvas back ends share and painters never see.
 *
 * A back end embeds `struct canvas` as its first member and fills in one
 * const canvas_ops table. canvas.c checks arguments, applies the clip
 * rectangle to fills, splits polylines at NaN, resolves text anchors, and
 * then calls the table; back ends get clean, already-normalised input. */
#ifndef SKV_CANVAS_IMPL_H
#define SKV_CANVAS_IMPL_H

#include "canvas.h"

#include <stdio.h>

typedef struct canvas_ops {
    const char *name;
    /* Fills everything (ignoring the clip) with bg. */
    void (*clear)(canvas *c, canvas_color bg);
    /* A rectangle already intersected with the clip, w > 0 and h > 0. */
    void (*fill_rect)(canvas *c, double x, double y, double w, double h, canvas_color col);
    /* n >= 2 finite points; the back end clips. */
    void (*polyline)(canvas *c, const double *xy, int n, double width, canvas_color col);
    /* x0 <= x1, y0 <= y1, and x0 == x1 or y0 == y1; the back end clips. */
    void (*rule)(canvas *c, double x0, double y0, double x1, double y1, canvas_color col, int flags);
    /* Text whose on-screen box has its top-left corner at (x, y); the back end clips. */
    void (*text)(canvas *c, double x, double y, const char *utf8, int font, int vertical, canvas_color col);
    double (*text_width)(canvas *c, const char *utf8, int font);
    void (*font_metrics)(canvas *c, int font, double *ascent, double *descent);
    /* Writes the canvas to a file (NULL where the back end has no file form). */
    int (*save)(canvas *c, const char *path, int force);
    void (*free)(canvas *c);
} canvas_ops;

struct canvas {
    const canvas_ops *ops;
    canvas_geom geom;
    canvas_theme theme;
    canvas_rect clip;       /* always inside (0, 0, geom.w, geom.h) */
};

/* Sets up the shared part; the back end fills geom before or after. */
void canvas_init_base(canvas *c, const canvas_ops *ops, const canvas_theme *theme);

/* Figure sizes shared by the PNG and SVG back ends (canvas_png.c): the
 * default body size for a figure, the size of each font role, and the
 * geometry painters lay out with. */
double canvas_figure_em(int width, int height);
double canvas_figure_font_px(double em, int font);
void canvas_figure_geom(canvas_geom *g, int width, int height, double em, int scale);

/* The family name of a PNG canvas's regular or bold face. */
const char *canvas_png_family(const canvas *c, int bold);

/* Writes a file the safe way: refuses an existing path unless force, has
 * write() fill a temporary file beside it, syncs it, then renames (or, without
 * force, links) it into place, so a failure never leaves a partial file. */
/* Back ends save with skv_save_atomic (kernels/skv.h): a temporary file
 * beside the target, never overwriting unless forced. */

/* Cuts the segment to the rectangle (Liang-Barsky); 0 when nothing is left. */
int canvas_clip_segment(canvas_rect r, double *x0, double *y0, double *x1, double *y1);

/* Index range [*i0, *i1) of the slots of size step whose centres lie in
 * [a, b); when none does but b > a, the one slot holding the midpoint. */
void canvas_span_slots(double a, double b, double step, long *i0, long *i1);

/* The theme of exported figures (PNG and SVG): dark ink on white. */
extern const canvas_theme canvas_figure_theme;

#endif
