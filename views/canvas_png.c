/* canvas_png.c: the PNG back end of the canvas, an RGBA pixel buffer.
 *
 * One unit is one logical pixel; the buffer is scale times larger each way,
 * and every size (text, line widths, rules) is multiplied by scale, so a
 * figure at scale 2 is the same figure drawn twice as fine. Fills and rules
 * snap to whole pixels (crisp axes, no seams between heatmap cells); lines
 * are anti-aliased by coverage (distance from each pixel centre to the
 * segment); text is rendered by FreeType from DejaVu Sans. Saving goes
 * through libpng into a temporary file that is renamed into place, and
 * writes no time stamp, so identical drawing gives identical bytes. */
#include "canvas_impl.h"
#include "skv.h"

#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <ft2build.h>
#include FT_FREETYPE_H

#define FONT_DIR "/usr/share/fonts/truetype/dejavu/"

typedef struct png_canvas {
    canvas base;
    int scale;
    int pw, ph;             /* physical size: width*scale, height*scale */
    uint8_t *px;            /* (ph, pw, 4) RGBA */
    FT_Library ft;
    FT_Face face[2];        /* regular, bold (face[1] may equal face[0]) */
    double size[CANVAS_FONT_COUNT]; /* physical pixels per em, by role */
    int active;             /* role whose size is set on its face, -1 none */
    float adv[CANVAS_FONT_COUNT][128]; /* advance of ASCII glyphs, physical px; <0 unknown */
} png_canvas;

static png_canvas *pc_of(canvas *c) { return (png_canvas *)c; }

/* Resolves the special colours: CANVAS_DEFAULT is the theme's fg for ink, bg for fills. */
static canvas_color ink(const png_canvas *p, canvas_color col, int fill) {
    if (col == CANVAS_DEFAULT) col = fill ? p->base.theme.bg : p->base.theme.fg;
    if (col & 0xFF000000u) col = fill ? 0xFFFFFF : 0x000000;
    return col;
}

/* Blends col over pixel (x, y) with coverage a in 0..255. */
static inline void blend(png_canvas *p, long x, long y, canvas_color col, unsigned a) {
    if (a == 0) return;
    uint8_t *d = p->px + ((size_t)y * p->pw + x) * 4;
    unsigned r = (col >> 16) & 255, g = (col >> 8) & 255, b = col & 255;
    if (a >= 255) { d[0] = (uint8_t)r; d[1] = (uint8_t)g; d[2] = (uint8_t)b; d[3] = 255; return; }
    d[0] = (uint8_t)((r * a + d[0] * (255 - a) + 127) / 255);
    d[1] = (uint8_t)((g * a + d[1] * (255 - a) + 127) / 255);
    d[2] = (uint8_t)((b * a + d[2] * (255 - a) + 127) / 255);
    d[3] = 255;
}

/* The clip rectangle in physical pixels, as [x0, x1) x [y0, y1). */
static void clip_px(const png_canvas *p, long *x0, long *y0, long *x1, long *y1) {
    const canvas_rect *r = &p->base.clip;
    double s = p->scale;
    *x0 = lround(r->x * s); *y0 = lround(r->y * s);
    *x1 = lround((r->x + r->w) * s); *y1 = lround((r->y + r->h) * s);
    if (*x0 < 0) *x0 = 0;
    if (*y0 < 0) *y0 = 0;
    if (*x1 > p->pw) *x1 = p->pw;
    if (*y1 > p->ph) *y1 = p->ph;
}

static void pix_clear(canvas *c, canvas_color bg) {
    png_canvas *p = pc_of(c);
    canvas_color col = ink(p, bg, 1);
    for (size_t i = 0; i < (size_t)p->pw * p->ph; i++) {
        p->px[4 * i] = (uint8_t)(col >> 16);
        p->px[4 * i + 1] = (uint8_t)(col >> 8);
        p->px[4 * i + 2] = (uint8_t)col;
        p->px[4 * i + 3] = 255;
    }
}

/* Fills the physical pixels whose centres lie in the logical rectangle. */
static void fill_px(png_canvas *p, double x, double y, double w, double h, canvas_color col, int clip) {
    long i0, i1, j0, j1, cx0 = 0, cy0 = 0, cx1 = p->pw, cy1 = p->ph;
    double s = p->scale;
    canvas_span_slots(x * s, (x + w) * s, 1.0, &i0, &i1);
    canvas_span_slots(y * s, (y + h) * s, 1.0, &j0, &j1);
    if (clip) clip_px(p, &cx0, &cy0, &cx1, &cy1);
    if (i0 < cx0) i0 = cx0;
    if (j0 < cy0) j0 = cy0;
    if (i1 > cx1) i1 = cx1;
    if (j1 > cy1) j1 = cy1;
    for (long j = j0; j < j1; j++)
        for (long i = i0; i < i1; i++) blend(p, i, j, col, 255);
}

static void pix_fill_rect(canvas *c, double x, double y, double w, double h, canvas_color col) {
    png_canvas *p = pc_of(c);
    /* The rectangle is already inside the clip; snapping may reach one pixel
     * past it only when the rectangle is thinner than a pixel. */
    fill_px(p, x, y, w, h, ink(p, col, 1), 0);
}

static void pix_rule(canvas *c, double x0, double y0, double x1, double y1, canvas_color col, int flags) {
    png_canvas *p = pc_of(c);
    double t = c->geom.hair, h2 = t / 2;
    int horizontal = (y0 == y1);
    double a = (horizontal ? x0 : y0) - h2, b = (horizontal ? x1 : y1) + h2;
    double dash = (flags & CANVAS_RULE_DASHED) ? 4 * t : b - a, gap = (flags & CANVAS_RULE_DASHED) ? 3 * t : 0;
    col = ink(p, col, 0);
    for (double u = a; u < b; u += dash + gap) {
        double v = fmin(b, u + dash);
        if (horizontal) fill_px(p, u, y0 - h2, v - u, t, col, 1);
        else fill_px(p, x0 - h2, u, t, v - u, col, 1);
    }
}

/* Coverage of a pixel centre at distance d from a line of half-width r. */
static inline float coverage(double d, double r) {
    if (r < 0.5) { double c = 1 - d; return c <= 0 ? 0 : (float)(c * 2 * r); }
    double c = r + 0.5 - d;
    return c <= 0 ? 0 : c >= 1 ? 1 : (float)c;
}

/* Anti-aliased polyline: each segment raises a coverage mask to the
 * largest coverage seen, so joints are not painted twice, then the mask is
 * blended once. Rows are scanned only where the segment can reach. */
static void pix_polyline(canvas *c, const double *xy, int n, double width, canvas_color col) {
    png_canvas *p = pc_of(c);
    double s = p->scale, r = width * s / 2, reach = fmax(r, 0.5) + 1;
    long cx0, cy0, cx1, cy1;
    clip_px(p, &cx0, &cy0, &cx1, &cy1);
    double mnx = INFINITY, mny = INFINITY, mxx = -INFINITY, mxy = -INFINITY;
    for (int i = 0; i < n; i++) {
        mnx = fmin(mnx, xy[2 * i] * s); mxx = fmax(mxx, xy[2 * i] * s);
        mny = fmin(mny, xy[2 * i + 1] * s); mxy = fmax(mxy, xy[2 * i + 1] * s);
    }
    long bx0 = (long)fmax(cx0, floor(mnx - reach)), bx1 = (long)fmin(cx1, ceil(mxx + reach));
    long by0 = (long)fmax(cy0, floor(mny - reach)), by1 = (long)fmin(cy1, ceil(mxy + reach));
    if (bx1 <= bx0 || by1 <= by0) return;
    long bw = bx1 - bx0, bh = by1 - by0;
    float *mask = calloc((size_t)bw * bh, sizeof *mask);
    if (!mask) return;
    for (int i = 0; i + 1 < n; i++) {
        double ax = xy[2 * i] * s, ay = xy[2 * i + 1] * s, qx = xy[2 * i + 2] * s, qy = xy[2 * i + 3] * s;
        double dx = qx - ax, dy = qy - ay, len2 = dx * dx + dy * dy;
        long ya = (long)fmax(by0, floor(fmin(ay, qy) - reach)), yb = (long)fmin(by1, ceil(fmax(ay, qy) + reach));
        for (long y = ya; y < yb; y++) {
            double pyc = y + 0.5;
            /* x range of the segment within reach of this row */
            double lo, hi;
            if (fabs(dy) < 1e-12) { lo = fmin(ax, qx); hi = fmax(ax, qx); }
            else {
                double t0 = (pyc - reach - ay) / dy, t1 = (pyc + reach - ay) / dy;
                if (t0 > t1) { double tt = t0; t0 = t1; t1 = tt; }
                t0 = fmax(0, t0); t1 = fmin(1, t1);
                if (t0 > t1) { t0 = t1 = (pyc < fmin(ay, qy)) == (ay < qy) ? 0 : 1; }
                lo = fmin(ax + t0 * dx, ax + t1 * dx); hi = fmax(ax + t0 * dx, ax + t1 * dx);
            }
            long xa = (long)fmax(bx0, floor(lo - reach)), xb = (long)fmin(bx1, ceil(hi + reach));
            for (long x = xa; x < xb; x++) {
                double pxc = x + 0.5, t = len2 > 0 ? ((pxc - ax) * dx + (pyc - ay) * dy) / len2 : 0;
                t = t < 0 ? 0 : t > 1 ? 1 : t;
                double ex = pxc - (ax + t * dx), ey = pyc - (ay + t * dy);
                float cv = coverage(sqrt(ex * ex + ey * ey), r);
                float *m = &mask[(y - by0) * bw + (x - bx0)];
                if (cv > *m) *m = cv;
            }
        }
    }
    col = ink(p, col, 0);
    for (long y = 0; y < bh; y++)
        for (long x = 0; x < bw; x++) {
            float m = mask[y * bw + x];
            if (m > 0) blend(p, bx0 + x, by0 + y, col, (unsigned)lrintf(m * 255));
        }
    free(mask);
}

static FT_Face face_for(png_canvas *p, int font) {
    FT_Face f = p->face[font >= CANVAS_FONT_BOLD ? 1 : 0];
    if (p->active != font) {
        FT_Set_Char_Size(f, 0, (FT_F26Dot6)lround(p->size[font] * 64), 72, 72);
        p->active = font;
    }
    return f;
}

/* Advance of one code point in physical pixels (unhinted, so text measures
 * the same at every scale up to the scale factor). */
static double advance(png_canvas *p, int font, uint32_t cp) {
    if (cp < 128 && p->adv[font][cp] >= 0) return p->adv[font][cp];
    FT_Face f = face_for(p, font);
    double a = 0;
    if (FT_Load_Char(f, cp, FT_LOAD_NO_HINTING | FT_LOAD_NO_BITMAP) == 0) a = f->glyph->linearHoriAdvance / 65536.0;
    if (cp < 128) p->adv[font][cp] = (float)a;
    return a;
}

static double pix_text_width(canvas *c, const char *s, int font) {
    png_canvas *p = pc_of(c);
    double w = 0;
    while (*s) w += advance(p, font, canvas_utf8_next(&s));
    return w / p->scale;
}

static void pix_font_metrics(canvas *c, int font, double *ascent, double *descent) {
    png_canvas *p = pc_of(c);
    FT_Face f = p->face[font >= CANVAS_FONT_BOLD ? 1 : 0];
    double em = p->size[font] / p->scale, upm = f->units_per_EM;
    *ascent = em * f->ascender / upm;
    *descent = em * -f->descender / upm;
}

/* Renders the text into a coverage mask, then blends it upright or turned
 * 90 degrees counter-clockwise, clipped to the clip rectangle. */
static void pix_text(canvas *c, double x, double y, const char *s, int font, int vertical, canvas_color col) {
    png_canvas *p = pc_of(c);
    double sc = p->scale, asc, desc;
    pix_font_metrics(c, font, &asc, &desc);
    double tw = pix_text_width(c, s, font) * sc;
    long margin = (long)ceil(p->size[font] / 2) + 1;
    long mw = (long)ceil(tw) + 2 * margin, mh = (long)ceil((asc + desc) * sc) + 2 * margin;
    if (mw > 1 << 15 || mh > 1 << 15) return;
    uint8_t *mask = calloc((size_t)mw * mh, 1);
    if (!mask) return;
    long base = margin + lround(asc * sc);
    double pen = margin;
    FT_Face f = face_for(p, font);
    for (const char *q = s; *q;) {
        uint32_t cp = canvas_utf8_next(&q);
        double a = advance(p, font, cp);
        f = face_for(p, font);
        if (FT_Load_Char(f, cp, FT_LOAD_RENDER | FT_LOAD_TARGET_LIGHT) == 0 &&
            f->glyph->bitmap.pixel_mode == FT_PIXEL_MODE_GRAY) {
            FT_Bitmap *bm = &f->glyph->bitmap;
            long ox = lround(pen) + f->glyph->bitmap_left, oy = base - f->glyph->bitmap_top;
            for (long j = 0; j < (long)bm->rows; j++)
                for (long i = 0; i < (long)bm->width; i++) {
                    long mx = ox + i, my = oy + j;
                    if (mx < 0 || my < 0 || mx >= mw || my >= mh) continue;
                    unsigned v = bm->buffer[j * bm->pitch + i];
                    uint8_t *m = &mask[my * mw + mx];
                    unsigned sum = *m + v;
                    *m = (uint8_t)(sum > 255 ? 255 : sum);
                }
        }
        pen += a;
    }
    long cx0, cy0, cx1, cy1;
    clip_px(p, &cx0, &cy0, &cx1, &cy1);
    long X = lround(x * sc), Y = lround(y * sc), W = lround(tw);
    col = ink(p, col, 0);
    for (long j = 0; j < mh; j++)
        for (long i = 0; i < mw; i++) {
            unsigned v = mask[j * mw + i];
            if (!v) continue;
            long u = i - margin, w = j - margin; /* along the text, down from the box top */
            long sx = vertical ? X + w : X + u, sy = vertical ? Y + W - u : Y + w;
            if (sx < cx0 || sy < cy0 || sx >= cx1 || sy >= cy1) continue;
            blend(p, sx, sy, col, v);
        }
    free(mask);
}

static void pix_free(canvas *c) {
    png_canvas *p = pc_of(c);
    if (p->face[1] && p->face[1] != p->face[0]) FT_Done_Face(p->face[1]);
    if (p->face[0]) FT_Done_Face(p->face[0]);
    if (p->ft) FT_Done_FreeType(p->ft);
    free(p->px);
    free(p);
}

static int pix_save(canvas *c, const char *path, int force);

static const canvas_ops pix_ops = {
    .name = "png",
    .clear = pix_clear,
    .fill_rect = pix_fill_rect,
    .polyline = pix_polyline,
    .rule = pix_rule,
    .text = pix_text,
    .text_width = pix_text_width,
    .font_metrics = pix_font_metrics,
    .save = pix_save,
    .free = pix_free,
};

double canvas_figure_em(int width, int height) {
    return fmin(32, fmax(11, round(sqrt((double)width * height) / 48)));
}

double canvas_figure_font_px(double em, int font) {
    switch (font) {
    case CANVAS_FONT_SMALL: return round(em * 0.86 * 4) / 4;
    case CANVAS_FONT_TITLE: return round(em * 1.2 * 4) / 4;
    default: return em;
    }
}

void canvas_figure_geom(canvas_geom *g, int width, int height, double em, int scale) {
    *g = (canvas_geom){
        .w = width, .h = height, .em = em,
        .hair = fmax(1, round(em / 14)), .tick = round(em * 0.35), .pad = round(em * 0.3),
        .line_w = fmax(1.5, round(em / 9 * 4) / 4),
        .dot_w = 1.0 / scale, .dot_h = 1.0 / scale, .fill_w = 1.0 / scale, .fill_h = 1.0 / scale,
        .cells = 0, .ascii = 0, .rotate_text = 1,
    };
}

const char *canvas_png_family(const canvas *c, int bold) {
    if (!c || c->ops != &pix_ops) return NULL;
    const png_canvas *p = (const png_canvas *)c;
    const char *f = p->face[bold ? 1 : 0]->family_name;
    return f ? f : "sans-serif";
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Opens the regular face (opts, else DejaVu Sans, else DejaVu Sans Mono)
 * and a bold one (DejaVu Sans Bold, else the regular face). */
static int open_fonts(png_canvas *p, const char *font_path) {
    if (FT_Init_FreeType(&p->ft)) { p->ft = NULL; return skv_error(SKV_ENOMEM, "canvas: cannot start FreeType"); }
    const char *regular = font_path, *bold = NULL;
    if (!regular) {
        regular = FONT_DIR "DejaVuSans.ttf";
        bold = FONT_DIR "DejaVuSans-Bold.ttf";
        if (!file_exists(regular)) {
            regular = FONT_DIR "DejaVuSansMono.ttf";
            bold = FONT_DIR "DejaVuSansMono-Bold.ttf";
        }
        if (!file_exists(regular))
            return skv_error(SKV_EMISSING, "canvas: no font: %s not found (install fonts-dejavu-core)",
                             FONT_DIR "DejaVuSans.ttf");
    } else if (!file_exists(regular)) {
        return skv_error(SKV_EMISSING, "canvas: no font: %s not found", regular);
    }
    if (FT_New_Face(p->ft, regular, 0, &p->face[0])) {
        p->face[0] = NULL;
        return skv_error(SKV_EFORMAT, "canvas: %s: not a font FreeType can read", regular);
    }
    p->face[1] = p->face[0];
    if (bold && file_exists(bold) && FT_New_Face(p->ft, bold, 0, &p->face[1])) p->face[1] = p->face[0];
    if (!FT_IS_SCALABLE(p->face[0]))
        return skv_error(SKV_EFORMAT, "canvas: %s: not a scalable font", regular);
    return SKV_OK;
}

int canvas_png_new(canvas **out, int width, int height, const canvas_png_opts *opts) {
    *out = NULL;
    int scale = opts && opts->scale > 0 ? opts->scale : 1;
    if (width < 1 || height < 1 || scale > 16 || (long)width * scale > 20000 || (long)height * scale > 20000)
        return skv_error(SKV_ERANGE, "canvas: a %d x %d figure at scale %d; expected 1..20000 pixels each way",
                         width, height, scale);
    png_canvas *p = calloc(1, sizeof *p);
    if (!p) return skv_error(SKV_ENOMEM, "canvas: out of memory");
    p->scale = scale;
    p->pw = width * scale;
    p->ph = height * scale;
    p->active = -1;
    for (int f = 0; f < CANVAS_FONT_COUNT; f++)
        for (int i = 0; i < 128; i++) p->adv[f][i] = -1;
    p->px = malloc((size_t)p->pw * p->ph * 4);
    canvas_init_base(&p->base, &pix_ops, &canvas_figure_theme); /* so pix_free works on failure */
    if (!p->px) { pix_free(&p->base); return skv_error(SKV_ENOMEM, "canvas: out of memory for a %d x %d image", p->pw, p->ph); }
    int rc = open_fonts(p, opts ? opts->font_path : NULL);
    if (rc) { pix_free(&p->base); return rc; }
    double em = opts && opts->font_px > 0 ? opts->font_px : canvas_figure_em(width, height);
    for (int f = 0; f < CANVAS_FONT_COUNT; f++) p->size[f] = canvas_figure_font_px(em, f) * scale;
    canvas_figure_geom(&p->base.geom, width, height, em, scale);
    canvas_init_base(&p->base, &pix_ops, &canvas_figure_theme);
    pix_clear(&p->base, canvas_figure_theme.bg);
    *out = &p->base;
    return SKV_OK;
}

const uint8_t *canvas_png_pixels(const canvas *c, int *width, int *height) {
    if (!c || c->ops != &pix_ops) return NULL;
    const png_canvas *p = (const png_canvas *)c;
    if (width) *width = p->pw;
    if (height) *height = p->ph;
    return p->px;
}

typedef struct png_err { jmp_buf jb; char msg[200]; } png_err;

static void on_png_error(png_structp png, png_const_charp msg) {
    png_err *e = png_get_error_ptr(png);
    snprintf(e->msg, sizeof e->msg, "%s", msg);
    longjmp(e->jb, 1);
}

static void on_png_warning(png_structp png, png_const_charp msg) { (void)png; (void)msg; }

/* Encodes the pixels as 8-bit RGB (the opaque alpha is stripped) with a
 * pHYs of 96 dpi times scale, so scale 2 prints at the same size. */
static int write_png(png_canvas *p, FILE *f, const char *path) {
    png_err err = { .msg = "" };
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &err, on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    png_bytep *rows = calloc((size_t)p->ph, sizeof *rows);
    if (!png || !info || !rows) {
        png_destroy_write_struct(&png, &info);
        free(rows);
        return skv_error(SKV_ENOMEM, "%s: out of memory encoding PNG", path);
    }
    for (int y = 0; y < p->ph; y++) rows[y] = p->px + (size_t)y * p->pw * 4;
    if (setjmp(err.jb)) {
        png_destroy_write_struct(&png, &info);
        free(rows);
        return skv_error(SKV_EIO, "%s: cannot write PNG: %s", path, err.msg);
    }
    png_init_io(png, f);
    png_set_compression_level(png, 9);
    png_set_IHDR(png, info, (png_uint_32)p->pw, (png_uint_32)p->ph, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_uint_32 ppm = (png_uint_32)lround(96.0 * p->scale / 0.0254);
    png_set_pHYs(png, info, ppm, ppm, PNG_RESOLUTION_METER);
    png_set_sRGB(png, info, PNG_sRGB_INTENT_PERCEPTUAL);
    png_write_info(png, info);
    png_set_filler(png, 0, PNG_FILLER_AFTER);
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    return SKV_OK;
}

static int png_writer(FILE *f, void *ctx, const char *path) { return write_png(ctx, f, path); }

static int pix_save(canvas *c, const char *path, int force) {
    return skv_save_atomic(path, force, png_writer, pc_of(c));
}

int canvas_png_save(canvas *c, const char *path, int force) {
    if (!c || c->ops != &pix_ops) return skv_error(SKV_EINVAL, "canvas_png_save: not a PNG canvas");
    return canvas_save(c, path, force);
}
