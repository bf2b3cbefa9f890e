/* test_paint.c: the painters, drawn into PNG (scale 1 and 2) and into cells.
 *
 * Each painter draws a small realistic figure; the PNG is saved, read back
 * with libpng and checked at places the painter reports through
 * paint_result: the axis line, the rank-cut marker at its data x, a
 * heatmap cell in exactly the palette colour for its value, raster and
 * strip categories, a gantt bar. Rendering twice must give identical
 * bytes. In cells, the plot must use braille and the heatmap half blocks,
 * the ASCII mode only ASCII, and every painter must survive rectangles
 * from empty to tiny to partly off the canvas without drawing outside them.
 * The SVG of each figure must be laid out exactly as its PNG.
 * The palette is checked for monotonic luminance and greyscale-distinct
 * categories. SKV_TEST_KEEP=1 keeps the figures in the scratch directory. */
#include "canvas.h"
#include "paint.h"
#include "skv.h"
#include "testhelp.h"

#include <dirent.h>
#include <png.h>
#include <stdint.h>

static uint8_t *read_png(const char *path, int *w, int *h) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) return NULL;
    img.format = PNG_FORMAT_RGBA;
    uint8_t *buf = malloc(PNG_IMAGE_SIZE(img));
    if (!buf || !png_image_finish_read(&img, NULL, buf, 0, NULL)) { free(buf); png_image_free(&img); return NULL; }
    *w = (int)img.width;
    *h = (int)img.height;
    return buf;
}

/* A read-back image and its scale, sampled in logical coordinates. */
typedef struct img { uint8_t *px; int w, h, scale; } img;

static canvas_color at(const img *m, double x, double y) {
    int X = (int)floor(x * m->scale), Y = (int)floor(y * m->scale);
    if (X < 0 || Y < 0 || X >= m->w || Y >= m->h) return CANVAS_NONE;
    const uint8_t *p = m->px + ((size_t)Y * m->w + X) * 4;
    return CANVAS_RGB(p[0], p[1], p[2]);
}

static int files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) same = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* ---- figures: each draws into any canvas and rectangle ---- */

enum { FIG_PLOT, FIG_HEATMAP, FIG_RASTER, FIG_STRIP, FIG_GANTT, FIG_TABLE, FIG_N };
static const char *fig_name[FIG_N] = { "spectrum", "niah", "raster", "chunkmap", "timeline", "table" };

#define NSV 512
static double sv[3][NSV];
static float niah[6 * 5];
static uint8_t sel[48 * 20];
static float cosmin[1024];

static void make_data(void) {
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < NSV; i++) sv[k][i] = 400.0 * pow(i + 1, -1.0 - 0.2 * k);
    for (int j = 0; j < 5; j++)
        for (int i = 0; i < 6; i++) niah[j * 6 + i] = (float)(1.0 - 0.15 * i * (j == 2) - 0.02 * j);
    niah[2 * 6 + 5] = NAN; /* a cell without data */
    for (int y = 0; y < 20; y++)
        for (int x = 0; x < 48; x++) sel[y * 48 + x] = (uint8_t)((x * 7 + y * 3) % 5 == 0 ? 2 : (x + y) % 3 == 0 ? 1 : 0);
    for (int i = 0; i < 1024; i++) cosmin[i] = (float)(0.6 + 0.3 * sin(i * 0.02));
}

static const paint_marker rank_cut[1] = { { .x = 160, .label = "r=160", .color = PAINT_AUTO } };

static int draw_fig(canvas *c, canvas_rect r, int fig, paint_result *res) {
    switch (fig) {
    case FIG_PLOT: {
        paint_series s[3] = {
            { .name = "layer 0", .y = sv[0], .n = NSV, .color = PAINT_AUTO },
            { .name = "layer 15", .y = sv[1], .n = NSV, .color = PAINT_AUTO },
            { .name = "layer 31", .y = sv[2], .n = NSV, .color = PAINT_AUTO },
        };
        paint_band b = { .x0 = 480, .x1 = 512, .label = "local window", .color = PAINT_AUTO };
        paint_plot p = { .title = "Singular values of pre-RoPE keys", .x = { .label = "index" },
                         .y = { .label = "singular value", .log = 1 }, .series = s, .n_series = 3,
                         .markers = rank_cut, .n_markers = 1, .bands = &b, .n_bands = 1 };
        return paint_draw_plot(c, r, &p, res);
    }
    case FIG_HEATMAP: {
        static const char *xl[6] = { "4k", "8k", "16k", "32k", "64k", "128k" };
        static const char *yl[5] = { "0%", "25%", "50%", "75%", "100%" };
        paint_cellmark mk = { 4, 2 };
        paint_heatmap h = { .title = "Needle retrieval accuracy", .v = niah, .nx = 6, .ny = 5,
                            .x = { .label = "context length", .unit = "tokens" }, .y = { .label = "needle depth" },
                            .xticks = xl, .yticks = yl, .value = { .label = "accuracy", .min = 0, .max = 1 },
                            .marks = &mk, .n_marks = 1, .mark_label = "missed needle", .annotate = "%.2f" };
        return paint_draw_heatmap(c, r, &h, res);
    }
    case FIG_RASTER: {
        paint_category cats[3] = { { "not selected", CANVAS_NONE, NULL }, { "hit", PAINT_AUTO, NULL }, { "miss", PAINT_AUTO, NULL } };
        paint_raster g = { .title = "Selected chunks, layer 3 head 1", .cat = sel, .nx = 48, .ny = 20, .cats = cats,
                           .n_cats = 3, .x = { .label = "decode step" }, .y = { .label = "chunk" },
                           .highlight = PAINT_HI_COL, .hi_col = 30 };
        return paint_draw_raster(c, r, &g, res);
    }
    case FIG_STRIP: {
        paint_category cats[3] = { { "outlier", PAINT_AUTO, NULL }, { "local", PAINT_AUTO, NULL }, { "needle", PAINT_AUTO, NULL } };
        paint_span sp[4] = { { 100, 101, 0 }, { 700, 702, 0 }, { 1020, 1024, 1 }, { 500, 503, 2 } };
        paint_strip s = { .title = "Chunk map", .v = cosmin, .n = 1024, .x = { .label = "chunk" },
                          .value = { .label = "cos-min", .min = 0, .max = 1 }, .cats = cats, .n_cats = 3,
                          .spans = sp, .n_spans = 4 };
        return paint_draw_strip(c, r, &s, res);
    }
    case FIG_GANTT: {
        static const char *rows[3] = { "compute", "fetch", "rebuild" };
        paint_category ops[3] = { { "attention", PAINT_AUTO, NULL }, { "copy V", PAINT_AUTO, NULL }, { "rebuild K", PAINT_AUTO, NULL } };
        paint_bar bars[6] = { { 0, 0, 0.0, 1.0 }, { 1, 1, 0.2, 2.5 }, { 2, 2, 0.3, 1.8 },
                              { 0, 0, 2.6, 4.0 }, { 1, 1, 2.7, 3.9 }, { 2, 2, 2.8, 3.5 } };
        paint_gantt g = { .title = "Stream timeline", .rows = rows, .n_rows = 3, .ops = ops, .n_ops = 3,
                          .bars = bars, .n_bars = 6, .t = { .label = "time", .unit = "ms" } };
        return paint_draw_gantt(c, r, &g, res);
    }
    default: {
        paint_column cols[3] = { { "layer", PAINT_ALIGN_RIGHT }, { "hit rate", PAINT_ALIGN_RIGHT }, { "note", PAINT_ALIGN_LEFT } };
        static const char *cells[] = { "0", "0.61", "", "1", "0.58", "needle chunk ranked 301 of 256", "2", "0.64", "ok" };
        paint_table t = { .title = "Cache hit rate", .cols = cols, .n_cols = 3, .cells = cells, .n_rows = 3,
                          .highlight = 1, .hi_row = 1 };
        return paint_draw_table(c, r, &t, res);
    }
    }
}

/* Draws figure fig into a w x h PNG at scale, saves it, reads it back. */
static int render_png(const char *dir, int fig, int w, int h, int scale, const char *tag, img *out, paint_result *res,
                      char *path, size_t cap) {
    canvas *c = NULL;
    memset(out, 0, sizeof *out);
    if (canvas_png_new(&c, w, h, &(canvas_png_opts){ .scale = scale })) return -1;
    int rc = draw_fig(c, (canvas_rect){ 0, 0, w, h }, fig, res);
    snprintf(path, cap, "%s/%s_s%d%s.png", dir, fig_name[fig], scale, tag);
    if (rc == 0) rc = canvas_png_save(c, path, 1);
    canvas_free(c);
    if (rc) return rc;
    out->px = read_png(path, &out->w, &out->h);
    out->scale = scale;
    return out->px ? 0 : -1;
}

static void test_png_figures(const char *dir) {
    for (int scale = 1; scale <= 2; scale++) {
        for (int fig = 0; fig < FIG_N; fig++) {
            img m;
            paint_result res;
            char path[600], again[600];
            int W = 900, H = 520;
            int rc = render_png(dir, fig, W, H, scale, "", &m, &res, path, sizeof path);
            char what[200];
            snprintf(what, sizeof what, "%s at scale %d: renders, saves and reads back at %dx%d", fig_name[fig], scale,
                     W * scale, H * scale);
            test_cond(what, rc == 0 && m.w == W * scale && m.h == H * scale);
            if (rc) { printf("  %s\n", skv_last_error()); free(m.px); continue; }
            snprintf(what, sizeof what, "%s at scale %d: fitted completely with a title", fig_name[fig], scale);
            test_cond(what, res.complete && res.title.w > 0 && res.area.w > W / 3 && res.area.h > 0);

            if (fig == FIG_PLOT) {
                double want = res.area.x + (160 - res.x0) / (res.x1 - res.x0) * res.area.w;
                test_cond("plot: rank-cut marker reported at its data x",
                          res.n_markers == 1 && fabs(res.marker_x[0] - want) < 1e-9 &&
                          fabs(paint_map_x(&res, 160) - want) < 1e-9);
                int dashes = 0;
                for (double y = res.area.y + 40; y < res.area.y + res.area.h; y += 1.0 / scale)
                    if (at(&m, res.marker_x[0], y) == CANVAS_RGB(0x1a, 0x1a, 0x1a)) dashes++;
                test_cond("plot: the marker's dashes are at that x", dashes > 0.3 * (res.area.h - 40) * scale);
                canvas_color axis = CANVAS_RGB(0x33, 0x33, 0x33);
                test_cond("plot: y axis line pixels are set", at(&m, res.axis_x, res.area.y + res.area.h / 2) == axis &&
                          at(&m, res.axis_x, res.area.y + 3) == axis);
                test_cond("plot: x axis line pixels are set", at(&m, res.area.x + res.area.w / 2, res.axis_y) == axis &&
                          at(&m, res.area.x + res.area.w - 2, res.axis_y) == axis);
                test_cond("plot: log y axis spans decades", res.ylog && res.y0 > 0 && res.y1 / res.y0 >= 100);
                double x = paint_map_x(&res, 300), y = paint_map_y(&res, sv[0][300]);
                int on_line = 0; /* a fully covered pixel next to the point */
                for (int dy = -1; dy <= 1; dy++)
                    for (int dx = -1; dx <= 1; dx++)
                        if (at(&m, x + dx / (double)scale, y + dy / (double)scale) == palette_cat(0)) on_line = 1;
                test_cond("plot: the first series passes through its point", on_line);
                test_cond("plot: the band is shaded",
                          at(&m, paint_map_x(&res, 490), res.area.y + 5) == CANVAS_RGB(0xe9, 0xe9, 0xe9));
                test_cond("plot: legend sits above the area", res.legend.w > 0 && res.legend.y + res.legend.h <= res.area.y);
            } else if (fig == FIG_HEATMAP) {
                int exact = 1;
                for (int j = 0; j < 5; j++)
                    for (int i = 0; i < 6; i++) {
                        if (j == 2 && i == 4) continue; /* the marked cell */
                        /* a quarter into the cell, clear of the printed value */
                        double x = paint_map_x(&res, i + 0.15), y = paint_map_y(&res, j + 0.15);
                        float v = niah[j * 6 + i];
                        canvas_color want = isnan(v) ? CANVAS_RGB(255, 255, 255) : palette_viridis(v);
                        if (at(&m, x, y) != want) exact = 0;
                    }
                test_cond("heatmap: every cell is the palette colour of its value", exact);
                double n = floor(res.colorbar.h * scale); /* one slice per physical row */
                test_cond("heatmap: colour bar runs from low at the bottom to high at the top",
                          res.colorbar.w > 0 &&
                          at(&m, res.colorbar.x + res.colorbar.w / 2, res.colorbar.y) == palette_viridis((n - 0.5) / n) &&
                          at(&m, res.colorbar.x + res.colorbar.w / 2, res.colorbar.y + res.colorbar.h - 0.5) ==
                              palette_viridis(0.5 / n));
                double mx = paint_map_x(&res, 4), my = paint_map_y(&res, 2.5);
                test_cond("heatmap: the marked cell has a dark outline", at(&m, mx + 0.5, my) == CANVAS_RGB(0, 0, 0));
            } else if (fig == FIG_RASTER) {
                int ok = 1;
                for (int y = 0; y < 20; y++)
                    for (int x = 0; x < 48; x++) {
                        if (x == 30) continue;
                        int k = sel[y * 48 + x];
                        canvas_color want = k == 0 ? CANVAS_RGB(255, 255, 255) : palette_cat(k);
                        if (at(&m, paint_map_x(&res, x + 0.5), paint_map_y(&res, y + 0.5)) != want) ok = 0;
                    }
                test_cond("raster: every cell has its category's colour", ok);
                test_cond("raster: the current step is outlined",
                          at(&m, paint_map_x(&res, 30) + 0.5, res.area.y + res.area.h / 2) == CANVAS_RGB(0, 0, 0) &&
                          res.n_markers == 1);
            } else if (fig == FIG_STRIP) {
                /* at scale 1 two chunks may share a pixel (their mean is drawn): allow a small difference */
                canvas_color got = at(&m, paint_map_x(&res, 300.5), res.area.y + res.area.h / 2), want = palette_viridis(cosmin[300]);
                test_cond("strip: the heat strip shows the palette colour of its values",
                          fabs(palette_lightness(got) - palette_lightness(want)) < 1.5 &&
                          (scale == 1 || got == want));
                double lane_y = res.legend.y + res.legend.h * (2.5 / 3); /* the third lane: needle */
                test_cond("strip: the needle span is marked in its lane",
                          at(&m, paint_map_x(&res, 501.5), lane_y) == palette_cat(2) &&
                          at(&m, paint_map_x(&res, 520), lane_y) != palette_cat(2));
            } else if (fig == FIG_GANTT) {
                test_cond("gantt: time axis starts at zero and covers every bar", res.x0 == 0 && res.x1 >= 4.0);
                test_cond("gantt: a fetch bar is drawn at its time and row",
                          at(&m, paint_map_x(&res, 1.3), paint_map_y(&res, 1.5)) == palette_cat(1));
                test_cond("gantt: nothing between two compute bars",
                          at(&m, paint_map_x(&res, 1.8), paint_map_y(&res, 0.5)) != palette_cat(0));
                test_cond("gantt: three rows shown", res.shown == 3);
            } else if (fig == FIG_TABLE) {
                test_cond("table: all rows shown", res.shown == 3);
                double ry = paint_map_y(&res, 1.5);
                canvas_color hl = at(&m, res.area.x + 2, ry);
                test_cond("table: the highlighted row is tinted", hl != CANVAS_RGB(255, 255, 255) && canvas_luma(hl) > 0.5);
            }

            /* the same drawing again gives the same file */
            img m2;
            paint_result res2;
            rc = render_png(dir, fig, W, H, scale, "_again", &m2, &res2, again, sizeof again);
            snprintf(what, sizeof what, "%s at scale %d: rendering twice gives identical bytes", fig_name[fig], scale);
            test_cond(what, rc == 0 && files_equal(path, again));
            free(m2.px);
            free(m.px);
        }
    }
}

/* Every figure as SVG: saved, titled, deterministic, laid out as the PNG. */
static void test_svg_figures(const char *dir) {
    static const char *titles[FIG_N] = { ">Singular values of pre-RoPE keys</text>", ">Needle retrieval accuracy</text>",
                                         ">Selected chunks, layer 3 head 1</text>", ">Chunk map</text>",
                                         ">Stream timeline</text>", ">Cache hit rate</text>" };
    for (int fig = 0; fig < FIG_N; fig++) {
        char path[600], again[600], what[200];
        paint_result rs, rp;
        canvas *c = NULL;
        int rc = -1;
        for (int k = 0; k < 2; k++) {
            if (canvas_svg_new(&c, 900, 520, NULL)) break;
            rc = draw_fig(c, (canvas_rect){ 0, 0, 900, 520 }, fig, &rs);
            snprintf(k ? again : path, sizeof path, "%s/%s%s.svg", dir, fig_name[fig], k ? "_again" : "");
            if (rc == 0) rc = canvas_save(c, k ? again : path, 1);
            canvas_free(c);
        }
        if (canvas_png_new(&c, 900, 520, NULL) == 0) {
            draw_fig(c, (canvas_rect){ 0, 0, 900, 520 }, fig, &rp);
            canvas_free(c);
        }
        FILE *f = fopen(path, "rb");
        static char buf[1 << 20];
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = 0;
        snprintf(what, sizeof what, "%s as SVG: saved with its title, identical twice", fig_name[fig]);
        test_cond(what, rc == 0 && strstr(buf, titles[fig]) && files_equal(path, again));
        snprintf(what, sizeof what, "%s as SVG: same layout as the PNG", fig_name[fig]);
        test_cond(what, memcmp(&rs.area, &rp.area, sizeof rs.area) == 0 && rs.complete == rp.complete);
    }
}

/* ---- cells ---- */

static int grid_has(canvas *c, uint32_t lo, uint32_t hi) {
    int cols, rows, n = 0;
    const canvas_cell *g = canvas_cells_grid(c, &cols, &rows);
    for (int i = 0; i < cols * rows; i++) if (g[i].ch >= lo && g[i].ch <= hi) n++;
    return n;
}

static int grid_text_has(canvas *c, const char *s) {
    char *t = canvas_cells_text(c);
    int ok = t && strstr(t, s) != NULL;
    free(t);
    return ok;
}

static void test_cells_figures(void) {
    for (int fig = 0; fig < FIG_N; fig++) {
        canvas *c = NULL;
        if (canvas_cells_new(&c, 80, 24, 0)) { test_cond("cells canvas", 0); return; }
        paint_result res;
        int rc = draw_fig(c, (canvas_rect){ 0, 0, 80, 24 }, fig, &res);
        char what[200];
        snprintf(what, sizeof what, "%s in 80x24 cells: drawn with a data area", fig_name[fig]);
        test_cond(what, rc == 0 && res.area.w >= 40 && res.area.h >= 3);
        if (fig == FIG_PLOT) {
            test_cond("cells plot: lines are braille", grid_has(c, 0x2801, 0x28FF) > 40);
            test_cond("cells plot: axes are box-drawing with a corner", grid_has(c, 0x2514, 0x2514) == 1 &&
                      grid_has(c, 0x252C, 0x252C) >= 3);
            test_cond("cells plot: log ticks and the marker label are written",
                      grid_text_has(c, "100") && grid_text_has(c, "10") && grid_text_has(c, "r=160"));
            test_cond("cells plot: marker x is on a cell centre", fmod(res.marker_x[0], 1.0) == 0.5);
        } else if (fig == FIG_HEATMAP) {
            test_cond("cells heatmap: cells are half blocks or backgrounds",
                      grid_has(c, 0x2580, 0x2580) + grid_has(c, 0x2584, 0x2584) > 0);
            int cols, rows;
            const canvas_cell *g = canvas_cells_grid(c, &cols, &rows);
            int x = (int)floor(paint_map_x(&res, 0.5)), y = (int)floor(paint_map_y(&res, 0.1));
            test_cond("cells heatmap: a cell carries the palette colour",
                      g[y * cols + x].bg == palette_viridis(niah[0]) || g[y * cols + x].fg == palette_viridis(niah[0]));
            x = (int)ceil(paint_map_x(&res, 4.0) - 1e-9); /* the first column wholly in the cell */
            y = (int)floor(paint_map_y(&res, 2.5));
            test_cond("cells heatmap: the needle mark is in its cell and the legend",
                      grid_has(c, 0x25C6, 0x25C6) == 2 && g[y * cols + x].ch == 0x25C6);
        } else if (fig == FIG_RASTER) {
            test_cond("cells raster: the current step is pointed at", grid_has(c, 0x25BC, 0x25BC) == 1);
        } else if (fig == FIG_TABLE) {
            test_cond("cells table: header and cells are written", grid_text_has(c, "hit rate") && grid_text_has(c, "0.58"));
        }
        canvas_free(c);

        if (canvas_cells_new(&c, 80, 24, CANVAS_CELLS_ASCII)) { test_cond("ascii cells canvas", 0); return; }
        draw_fig(c, (canvas_rect){ 0, 0, 80, 24 }, fig, &res);
        int cols, rows, ascii = 1, ink = 0;
        const canvas_cell *g = canvas_cells_grid(c, &cols, &rows);
        for (int i = 0; i < cols * rows; i++) {
            if (g[i].ch < 32 || g[i].ch > 126) ascii = 0;
            if (g[i].ch != ' ') ink++;
        }
        snprintf(what, sizeof what, "%s in ascii cells: only printable ASCII, and something drawn", fig_name[fig]);
        test_cond(what, ascii && ink > 20);
        canvas_free(c);
    }
}

/* Every painter, every small size, several positions (some off the canvas):
 * nothing outside the rectangle changes, on cells and on PNG. */
static void test_tiny(void) {
    canvas *c = NULL;
    int bad_cells = 0, bad_png = 0, errors = 0, runs = 0;
    static const double pos[][2] = { { 0, 0 }, { 5, 3 }, { -3, -2 }, { 38, 10 }, { 45, 14 } };
    for (int fig = 0; fig < FIG_N; fig++)
        for (int w = 0; w <= 14; w += (w < 4 ? 1 : 5))
            for (int h = 0; h <= 9; h += (h < 4 ? 1 : 3))
                for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
                    if (canvas_cells_new(&c, 40, 16, 0)) return;
                    canvas_rect r = { pos[p][0], pos[p][1], w, h };
                    paint_result res;
                    if (draw_fig(c, r, fig, &res)) errors++;
                    runs++;
                    int cols, rows;
                    const canvas_cell *g = canvas_cells_grid(c, &cols, &rows);
                    for (int y = 0; y < rows; y++)
                        for (int x = 0; x < cols; x++) {
                            int inside = x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + r.h;
                            const canvas_cell *q = &g[y * cols + x];
                            if (!inside && (q->ch != ' ' || q->bg != CANVAS_DEFAULT)) bad_cells++;
                        }
                    canvas_free(c);
                }
    test_cond("painters in tiny cell rectangles: no errors", errors == 0 && runs > 100);
    test_cond("painters in tiny cell rectangles: nothing drawn outside", bad_cells == 0);
    static const double sizes[][2] = { { 0, 0 }, { 1, 1 }, { 7, 5 }, { 30, 12 }, { 90, 40 }, { 160, 60 }, { 400, 30 } };
    for (int fig = 0; fig < FIG_N; fig++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            if (canvas_png_new(&c, 240, 120, &(canvas_png_opts){ .scale = 2 })) return;
            canvas_rect r = { 20, 30, sizes[s][0], sizes[s][1] };
            paint_result res;
            if (draw_fig(c, r, fig, &res)) errors++;
            int pw, ph;
            const uint8_t *px = canvas_png_pixels(c, &pw, &ph);
            for (int y = 0; y < ph; y++)
                for (int x = 0; x < pw; x++) {
                    double lx = x / 2.0, ly = y / 2.0;
                    int inside = lx >= r.x && lx < r.x + r.w && ly >= r.y && ly < r.y + r.h;
                    const uint8_t *q = px + ((size_t)y * pw + x) * 4;
                    if (!inside && (q[0] != 255 || q[1] != 255 || q[2] != 255)) bad_png++;
                }
            canvas_free(c);
        }
    test_cond("painters in small PNG rectangles: no errors", errors == 0);
    test_cond("painters in small PNG rectangles: nothing drawn outside", bad_png == 0);
}

/* Degenerate data: empty series, NaNs, constant values, non-positive values on log axes. */
static void test_degenerate(void) {
    canvas *c = NULL;
    if (canvas_png_new(&c, 300, 200, NULL)) { test_cond("png canvas", 0); return; }
    double ys[4] = { NAN, -1, 0, NAN }, flat[3] = { 5, 5, 5 };
    paint_series s[3] = { { .y = ys, .n = 4, .color = PAINT_AUTO }, { .y = flat, .n = 3, .color = PAINT_AUTO },
                          { .y = NULL, .n = 10, .color = PAINT_AUTO } };
    paint_plot p = { .title = "degenerate", .y = { .log = 1 }, .series = s, .n_series = 3 };
    paint_result res;
    int rc = paint_draw_plot(c, (canvas_rect){ 0, 0, 300, 200 }, &p, &res);
    test_cond("plot survives NaN, non-positive log values, constants and NULL arrays",
              rc == 0 && res.y0 > 0 && res.y1 > res.y0 && res.x1 > res.x0);
    paint_plot empty = { 0 };
    rc = paint_draw_plot(c, (canvas_rect){ 0, 0, 300, 200 }, &empty, &res);
    test_cond("plot with nothing to draw still lays out axes", rc == 0 && res.area.w > 0);
    paint_heatmap h = { .v = NULL, .nx = 3, .ny = 3 };
    test_cond("heatmap without data is not an error", paint_draw_heatmap(c, (canvas_rect){ 0, 0, 300, 200 }, &h, &res) == 0);
    float big[3000];
    for (int i = 0; i < 3000; i++) big[i] = (float)i;
    paint_heatmap hb = { .title = "aggregated", .v = big, .nx = 1500, .ny = 2 };
    rc = paint_draw_heatmap(c, (canvas_rect){ 0, 0, 300, 200 }, &hb, &res);
    test_cond("heatmap with more columns than pixels aggregates", rc == 0 && res.complete);
    paint_bar bars[2] = { { 7, 0, 1, 2 }, { 0, 9, NAN, 3 } };
    static const char *rows[1] = { "only" };
    paint_gantt g = { .rows = rows, .n_rows = 1, .bars = bars, .n_bars = 2 };
    test_cond("gantt ignores bars on unknown rows and ops", paint_draw_gantt(c, (canvas_rect){ 0, 0, 300, 200 }, &g, &res) == 0);
    test_cond("painters reject a NULL figure with an error",
              paint_draw_plot(c, (canvas_rect){ 0, 0, 10, 10 }, NULL, NULL) == SKV_EINVAL);
    canvas_free(c);
}

static void test_palette(void) {
    int mono = 1;
    double prev = -1;
    for (int i = 0; i <= 64; i++) {
        double l = canvas_luma(palette_viridis(i / 64.0));
        if (l <= prev) mono = 0;
        prev = l;
    }
    test_cond("viridis rises in luminance (prints in grey)", mono);
    test_cond("viridis clamps and maps NaN to none", palette_viridis(-1) == palette_viridis(0) &&
              palette_viridis(2) == palette_viridis(1) && palette_viridis(NAN) == CANVAS_NONE);
    test_cond("viridis runs dark violet to yellow", palette_viridis(0) == CANVAS_RGB(0x44, 0x01, 0x54) &&
              palette_viridis(1) == CANVAS_RGB(0xfd, 0xe7, 0x25));
    double mind = 1e9;
    for (int i = 0; i < PALETTE_CAT_N; i++)
        for (int j = i + 1; j < PALETTE_CAT_N; j++)
            mind = fmin(mind, fabs(palette_lightness(palette_cat(i)) - palette_lightness(palette_cat(j))));
    test_cond("categorical colours differ in lightness (distinct in greyscale)", mind >= 6);
    test_cond("categorical palette wraps", palette_cat(PALETTE_CAT_N) == palette_cat(0) && palette_cat(-1) == palette_cat(1));
    test_cond("first category is Okabe-Ito blue", palette_cat(0) == CANVAS_RGB(0x00, 0x72, 0xB2));
}

/* Removes the scratch directory's files and the directory, unless
 * SKV_TEST_KEEP is set (then it says where they are). */
static void cleanup_dir(const char *dir) {
    const char *keep = getenv("SKV_TEST_KEEP");
    if (keep && *keep) { printf("figures kept in %s\n", dir); return; }
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[1200];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* Without colour (mono cells), categories differ by glyph: a raster of
 * two categories with the same colour lightness shows two glyphs, in the
 * cells and in the legend; so do a strip's lanes. */
static void test_mono_glyphs(void) {
    canvas *c = NULL;
    if (canvas_cells_new(&c, 60, 16, CANVAS_CELLS_MONO)) { test_cond("mono cells canvas", 0); return; }
    uint8_t cat[4 * 8];
    for (int i = 0; i < 32; i++) cat[i] = (uint8_t)(i % 3);
    paint_category cats[3] = { { "none", CANVAS_NONE, " " }, { "outlier", CANVAS_RGB(200, 0, 0), "o" },
                               { "miss", CANVAS_RGB(0, 200, 0), "x" } };
    paint_raster g = { .title = "mono", .cat = cat, .nx = 8, .ny = 4, .cats = cats, .n_cats = 3 };
    canvas_clear(c);
    int rc = paint_draw_raster(c, (canvas_rect){ 0, 0, 60, 16 }, &g, NULL);
    char *text = canvas_cells_text(c);
    int no = 0, nx = 0;
    for (const char *p = text; p && *p; p++) { no += *p == 'o'; nx += *p == 'x'; }
    test_cond("mono raster: outlier and miss drawn with their own glyphs (o, x), each in cells and legend",
              rc == 0 && text && no >= 3 && nx >= 3 && strstr(text, "o outlier") && strstr(text, "x miss"));
    free(text);
    paint_span sp[2] = { { 2, 4, 0 }, { 6, 8, 1 } };
    float v[10] = { 0, .1f, .2f, .3f, .4f, .5f, .6f, .7f, .8f, .9f };
    paint_category lanes[2] = { { "outlier", CANVAS_RGB(90, 90, 90), "o" }, { "local", CANVAS_RGB(90, 90, 90), "-" } };
    paint_strip st = { .title = "strip", .v = v, .n = 10, .cats = lanes, .n_cats = 2, .spans = sp, .n_spans = 2 };
    canvas_clear(c);
    rc = paint_draw_strip(c, (canvas_rect){ 0, 0, 60, 16 }, &st, NULL);
    text = canvas_cells_text(c);
    test_cond("mono strip: two lanes of one colour still differ (o and -)", rc == 0 && text && strstr(text, "oo") &&
                                                                               strstr(text, "--"));
    free(text);
    canvas_free(c);
    test_cond("default glyphs of eight categories are distinct", strcmp(paint_cat_glyph(0), paint_cat_glyph(1)) &&
                                                                     strcmp(paint_cat_glyph(1), paint_cat_glyph(7)));
}

/* A table far wider than its room: the leading columns that fit, whole, and
 * "+N" for the rest, rather than every cell cut to an ellipsis; one long column
 * alone still shrinks (the note above, FIG_TABLE). */
static void test_table_columns(void) {
    canvas *c = NULL;
    if (canvas_cells_new(&c, 40, 8, 0)) { test_cond("cells canvas", 0); return; }
    paint_column cols[6] = { { "policy", PAINT_ALIGN_LEFT }, { "recall", PAINT_ALIGN_RIGHT },
                             { "overlap", PAINT_ALIGN_RIGHT }, { "fetched", PAINT_ALIGN_RIGHT },
                             { "resident", PAINT_ALIGN_RIGHT }, { "ms/step", PAINT_ALIGN_RIGHT } };
    static const char *cells[] = { "shadowkv", "85.1%", "47.2%", "33.1 KiB", "0.56 MiB", "1.30" };
    paint_table t = { .title = "t", .cols = cols, .n_cols = 6, .cells = cells, .n_rows = 1 };
    paint_result res;
    int rc = paint_draw_table(c, (canvas_rect){ 0, 0, 40, 8 }, &t, &res);
    char *txt = canvas_cells_text(c);
    test_cond("a table too wide draws its leading columns whole and '+N' for the others, not every cell cut short",
              rc == 0 && txt && strstr(txt, "shadowkv") && strstr(txt, "85.1%") && strstr(txt, "+") &&
                  !strstr(txt, "\xe2\x80\xa6") && res.x1 < 6 && !res.complete);
    free(txt);
    canvas_free(c);
}

int main(void) {
    test_mono_glyphs();
    test_table_columns();
    const char *dir = test_tmpdir("paint");
    make_data();
    test_palette();
    test_png_figures(dir);
    test_svg_figures(dir);
    test_cells_figures();
    test_tiny();
    test_degenerate();
    cleanup_dir(dir);
    return test_report("test_paint");
}
