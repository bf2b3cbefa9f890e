/* test_canvas.c: the canvas interface and its two back ends.
 *
 * PNG: sizes times scale, crisp fills and rules at the pixels asked for,
 * anti-aliased lines, FreeType text (upright and turned), clipping, saving
 * (read back with libpng, byte-identical twice, no overwrite without
 * force, no temporary files left), and a missing font reported by path.
 * SVG: the same drawing as elements, escaped text, clip paths, same saving.
 * Cells: braille for lines, half blocks for fills, box-drawing joins for
 * rules, ASCII and MONO modes, and nothing written outside the grid or the
 * clip whatever coordinates a caller passes. */
#include "canvas.h"
#include "skv.h"
#include "testhelp.h"

#include <dirent.h>
#include <png.h>
#include <stdint.h>

/* Reads a PNG back as 8-bit RGBA; the caller frees. */
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

static canvas_color px_at(const uint8_t *px, int w, int x, int y) {
    const uint8_t *p = px + ((size_t)y * w + x) * 4;
    return CANVAS_RGB(p[0], p[1], p[2]);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
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

/* Files in dir whose names contain ".tmp-". */
static int temp_files_in(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp-")) n++;
    if (d) closedir(d);
    return n;
}

static int dark(canvas_color c) { return canvas_luma(c) < 0.2; }

/* A small drawing used for the size, determinism and save checks. */
static void draw_sample(canvas *c) {
    canvas_fill_rect(c, 10, 10, 30, 20, CANVAS_RGB(0, 0x72, 0xB2));
    canvas_rule(c, 5.5, 50, 5.5, 90, CANVAS_RGB(0x33, 0x33, 0x33), 0);
    canvas_rule(c, 5.5, 90.5, 150, 90.5, CANVAS_RGB(0x33, 0x33, 0x33), 0);
    canvas_line(c, 20, 80, 140, 40, 2, CANVAS_RGB(0xE6, 0x9F, 0x00));
    canvas_text(c, 60, 20, "Spectrum 10\xe2\x81\xbb\xc2\xb2", CANVAS_FONT_TITLE, CANVAS_LEFT | CANVAS_TOP, CANVAS_DEFAULT);
    canvas_text(c, 170, 60, "singular value", CANVAS_FONT_BODY, CANVAS_VERTICAL | CANVAS_LEFT, CANVAS_DEFAULT);
}

static void test_png_basics(const char *dir) {
    for (int scale = 1; scale <= 2; scale++) {
        canvas *c = NULL;
        int rc = canvas_png_new(&c, 200, 120, &(canvas_png_opts){ .scale = scale });
        test_cond("png canvas created", rc == 0 && c);
        if (!c) { printf("  %s\n", skv_last_error()); continue; }
        const canvas_geom *g = canvas_geometry(c);
        test_cond("png geometry is in logical pixels", g->w == 200 && g->h == 120 && !g->cells && g->rotate_text);
        test_cond("png resolution is one physical pixel", g->fill_w == 1.0 / scale && g->dot_w == 1.0 / scale);
        int pw, ph;
        const uint8_t *px = canvas_png_pixels(c, &pw, &ph);
        test_cond("png buffer is scale times larger", px && pw == 200 * scale && ph == 120 * scale);
        test_cond("png starts white", px_at(px, pw, 0, 0) == CANVAS_RGB(255, 255, 255));

        draw_sample(c);
        canvas_color blue = CANVAS_RGB(0, 0x72, 0xB2);
        test_cond("fill covers its pixels exactly",
                  px_at(px, pw, 10 * scale, 10 * scale) == blue && px_at(px, pw, 40 * scale - 1, 30 * scale - 1) == blue &&
                  px_at(px, pw, 10 * scale - 1, 10 * scale) != blue && px_at(px, pw, 40 * scale, 20 * scale) != blue &&
                  px_at(px, pw, 20 * scale, 30 * scale) != blue);
        canvas_color axis = CANVAS_RGB(0x33, 0x33, 0x33);
        test_cond("vertical rule is crisp at its column", px_at(px, pw, 5 * scale, 70 * scale) == axis &&
                  px_at(px, pw, 6 * scale, 70 * scale) != axis && px_at(px, pw, 5 * scale - 1, 70 * scale) != axis);
        test_cond("rules meet in a closed corner", px_at(px, pw, 5 * scale, 90 * scale) == axis &&
                  px_at(px, pw, 5 * scale, 91 * scale - 1) == axis);
        /* the line passes through (80, 60): a solid pixel there, partial coverage at its edge */
        canvas_color orange = CANVAS_RGB(0xE6, 0x9F, 0x00);
        int solid = 0, partial = 0;
        for (int dy = -4 * scale; dy <= 4 * scale; dy++) {
            canvas_color q = px_at(px, pw, 80 * scale, 60 * scale + dy);
            if (q == orange) solid++;
            else if (q != CANVAS_RGB(255, 255, 255)) partial++;
        }
        test_cond("anti-aliased line has a solid centre", solid >= 1);
        test_cond("anti-aliased line has partly covered edge pixels", partial >= 2);
        int ink = 0, outside = 0;
        for (int y = 0; y < ph; y++)
            for (int x = 0; x < pw; x++) {
                canvas_color q = px_at(px, pw, x, y);
                if (!dark(q)) continue;
                if (x >= 60 * scale && x < 200 * scale && y >= 20 * scale && y < 45 * scale) ink++;
                if (x >= 165 * scale && y >= 20 * scale && y < 100 * scale) outside++;
            }
        test_cond("title text is rendered", ink > 40 * scale * scale);
        test_cond("vertical text is rendered in its column", outside > 20 * scale * scale);
        double w1 = canvas_text_width(c, "rank cut", CANVAS_FONT_BODY);
        test_cond("text width is positive and grows with text",
                  w1 > 0 && canvas_text_width(c, "rank cut r=160", CANVAS_FONT_BODY) > w1);
        test_cond("title is larger than small text",
                  canvas_line_height(c, CANVAS_FONT_TITLE) > canvas_line_height(c, CANVAS_FONT_SMALL));

        char path[600];
        snprintf(path, sizeof path, "%s/basic_s%d.png", dir, scale);
        rc = canvas_png_save(c, path, 0);
        test_cond("png saves", rc == 0);
        int rw = 0, rh = 0;
        uint8_t *back = read_png(path, &rw, &rh);
        test_cond("saved png reads back with its size", back && rw == 200 * scale && rh == 120 * scale);
        test_cond("saved png has the drawn pixels", back && memcmp(back, px, (size_t)pw * ph * 4) == 0);
        free(back);
        canvas_free(c);
    }
}

static void test_png_clip(void) {
    canvas *c = NULL;
    if (canvas_png_new(&c, 100, 100, NULL)) { test_cond("png canvas for clipping", 0); return; }
    canvas_rect old = canvas_clip(c, (canvas_rect){ 20, 20, 30, 30 });
    test_cond("clip returns the previous clip (whole canvas)", old.x == 0 && old.w == 100 && old.h == 100);
    canvas_fill_rect(c, 0, 0, 100, 100, CANVAS_RGB(255, 0, 0));
    canvas_line(c, -1e9, 0, 1e9, 100, 5, CANVAS_RGB(0, 255, 0));
    canvas_text(c, 0, 30, "clipped clipped clipped", CANVAS_FONT_TITLE, CANVAS_LEFT | CANVAS_TOP, CANVAS_RGB(0, 0, 255));
    canvas_rule(c, 0, 35, 100, 35, CANVAS_RGB(0, 0, 0), CANVAS_RULE_DASHED);
    canvas_line(c, NAN, 3, 50, INFINITY, 2, CANVAS_RGB(0, 0, 0));
    canvas_fill_rect(c, NAN, 0, 10, 10, CANVAS_RGB(0, 0, 0));
    int pw, ph, bad = 0, in = 0;
    const uint8_t *px = canvas_png_pixels(c, &pw, &ph);
    for (int y = 0; y < ph; y++)
        for (int x = 0; x < pw; x++) {
            int inside = x >= 20 && x < 50 && y >= 20 && y < 50;
            canvas_color q = px_at(px, pw, x, y);
            if (!inside && q != CANVAS_RGB(255, 255, 255)) bad++;
            if (inside && q != CANVAS_RGB(255, 255, 255)) in++;
        }
    test_cond("nothing is drawn outside the clip", bad == 0);
    test_cond("everything inside the clip is drawn", in == 30 * 30);
    canvas_clip(c, (canvas_rect){ -50, -50, 1000, 1000 });
    canvas_rect r = canvas_get_clip(c);
    test_cond("clip never extends past the canvas", r.x == 0 && r.y == 0 && r.w == 100 && r.h == 100);
    canvas_free(c);
}

static void test_png_save(const char *dir) {
    char a[600], b[600], exists[600], nodir[600];
    snprintf(a, sizeof a, "%s/same_a.png", dir);
    snprintf(b, sizeof b, "%s/same_b.png", dir);
    snprintf(exists, sizeof exists, "%s/exists.png", dir);
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.png", dir);
    for (int k = 0; k < 2; k++) {
        canvas *c = NULL;
        if (canvas_png_new(&c, 160, 100, &(canvas_png_opts){ .scale = 2 })) { test_cond("png canvas", 0); return; }
        draw_sample(c);
        canvas_png_save(c, k ? b : a, 1);
        canvas_free(c);
    }
    test_cond("identical drawing gives identical bytes", files_equal(a, b) && file_size(a) > 100);
    FILE *f = fopen(a, "rb");
    char sig[8] = { 0 }, body[4096];
    size_t n = f ? fread(body, 1, sizeof body, f) : 0;
    if (f) fclose(f);
    memcpy(sig, body, 8);
    int has_time = 0;
    for (size_t i = 0; i + 4 <= n; i++) if (memcmp(body + i, "tIME", 4) == 0) has_time = 1;
    test_cond("png has the PNG signature and no tIME chunk", memcmp(sig, "\x89PNG\r\n\x1a\n", 8) == 0 && !has_time);

    f = fopen(exists, "w");
    if (f) { fputs("keep me", f); fclose(f); }
    canvas *c = NULL;
    if (canvas_png_new(&c, 50, 40, NULL)) { test_cond("png canvas", 0); return; }
    draw_sample(c);
    skv_clear_error();
    int rc = canvas_png_save(c, exists, 0);
    test_cond("save refuses to overwrite without force", rc < 0 && file_size(exists) == 7);
    test_cond("refusal names the file", strstr(skv_last_error(), exists) != NULL);
    rc = canvas_png_save(c, exists, 1);
    int w = 0, h = 0;
    uint8_t *back = read_png(exists, &w, &h);
    test_cond("save with force replaces the file", rc == 0 && back && w == 50 && h == 40);
    free(back);
    rc = canvas_png_save(c, nodir, 1);
    test_cond("save into a missing directory fails naming the file", rc < 0 && strstr(skv_last_error(), nodir));
    test_cond("no temporary files are left behind", temp_files_in(dir) == 0);
    canvas_free(c);
}

static void test_png_font(void) {
    canvas *c = (canvas *)1;
    skv_clear_error();
    int rc = canvas_png_new(&c, 10, 10, &(canvas_png_opts){ .font_path = "/nonexistent/NoSuchFont.ttf" });
    test_cond("a missing font fails canvas creation", rc == SKV_EMISSING && c == NULL);
    test_cond("the error names the font path", strstr(skv_last_error(), "/nonexistent/NoSuchFont.ttf") != NULL &&
              !strchr(skv_last_error(), '\n'));
    rc = canvas_png_new(&c, 0, 10, NULL);
    test_cond("a zero-sized figure is refused", rc < 0 && c == NULL);
    rc = canvas_png_new(&c, 1000, 1000, &(canvas_png_opts){ .scale = 100 });
    test_cond("an absurd scale is refused", rc < 0 && c == NULL);
    rc = canvas_png_new(&c, 64, 64, &(canvas_png_opts){
        .font_path = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf" });
    test_cond("an explicit font path is used", rc == 0 && c);
    if (c) {
        test_cond("monospace font gives equal widths", canvas_text_width(c, "iiii", CANVAS_FONT_BODY) ==
                  canvas_text_width(c, "WWWW", CANVAS_FONT_BODY));
        canvas_free(c);
    }
}

/* ---- cells ---- */

static const canvas_cell *cell(canvas *c, int col, int row) {
    int cols, rows;
    const canvas_cell *g = canvas_cells_grid(c, &cols, &rows);
    return &g[row * cols + col];
}

static void test_cells_basics(void) {
    canvas *c = NULL;
    int rc = canvas_cells_new(&c, 20, 8, 0);
    test_cond("cells canvas created", rc == 0 && c);
    if (!c) return;
    const canvas_geom *g = canvas_geometry(c);
    test_cond("cells geometry is in cells with sub-cell resolution",
              g->w == 20 && g->h == 8 && g->cells && g->dot_w == 0.5 && g->dot_h == 0.25 && g->fill_h == 0.5);
    test_cond("a fresh grid is blank with default colours",
              cell(c, 3, 3)->ch == ' ' && cell(c, 3, 3)->fg == CANVAS_DEFAULT && cell(c, 3, 3)->bg == CANVAS_DEFAULT);
    test_cond("the grid API refuses a PNG canvas", canvas_png_pixels(c, NULL, NULL) == NULL);

    canvas_line(c, 0, 0.1, 6, 3.9, 0, CANVAS_RGB(0xff, 0, 0));
    int braille = 0;
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 6; x++)
            if (cell(c, x, y)->ch >= 0x2801 && cell(c, x, y)->ch <= 0x28FF && cell(c, x, y)->fg == CANVAS_RGB(0xff, 0, 0)) braille++;
    test_cond("a line is drawn in braille in its colour", braille >= 6);
    test_cond("a line's first dot is the top-left braille dot", ((cell(c, 0, 0)->ch - 0x2800) & 0x01) != 0);

    canvas_fill_rect(c, 10, 0, 2, 0.5, CANVAS_RGB(0, 0, 0xff));     /* top half of row 0 */
    canvas_fill_rect(c, 10, 1.5, 1, 0.5, CANVAS_RGB(0, 0xff, 0));   /* bottom half of row 1 */
    canvas_fill_rect(c, 12, 2, 2, 1, CANVAS_RGB(0x80, 0x80, 0x80)); /* whole cells */
    canvas_fill_rect(c, 14, 3, 1, 0.5, CANVAS_RGB(1, 2, 3));
    canvas_fill_rect(c, 14, 3.5, 1, 0.5, CANVAS_RGB(4, 5, 6));
    test_cond("a top-half fill is an upper half block", cell(c, 10, 0)->ch == 0x2580 && cell(c, 10, 0)->fg == CANVAS_RGB(0, 0, 0xff));
    test_cond("a bottom-half fill is a lower half block", cell(c, 10, 1)->ch == 0x2584 && cell(c, 10, 1)->fg == CANVAS_RGB(0, 0xff, 0));
    test_cond("a whole-cell fill is a background colour", cell(c, 12, 2)->ch == ' ' && cell(c, 13, 2)->bg == CANVAS_RGB(0x80, 0x80, 0x80));
    test_cond("two halves give fg over bg", cell(c, 14, 3)->ch == 0x2580 && cell(c, 14, 3)->fg == CANVAS_RGB(1, 2, 3) &&
              cell(c, 14, 3)->bg == CANVAS_RGB(4, 5, 6));
    canvas_fill_rect(c, 16.4, 5.2, 0.1, 0.05, CANVAS_RGB(9, 9, 9));
    test_cond("a sliver of a fill still shows", cell(c, 16, 5)->ch == 0x2580 && cell(c, 16, 5)->fg == CANVAS_RGB(9, 9, 9));

    canvas_text(c, 1, 6, "ab\xc3\x97", CANVAS_FONT_TITLE, CANVAS_LEFT | CANVAS_TOP, CANVAS_RGB(1, 1, 1));
    test_cond("text is one code point per cell", cell(c, 1, 6)->ch == 'a' && cell(c, 2, 6)->ch == 'b' && cell(c, 3, 6)->ch == 0xD7);
    test_cond("titles are bold", cell(c, 1, 6)->attr & CANVAS_ATTR_BOLD);
    test_cond("text width counts code points", canvas_text_width(c, "ab\xc3\x97", CANVAS_FONT_BODY) == 3);
    canvas_text(c, 19, 7, "right", CANVAS_FONT_BODY, CANVAS_RIGHT | CANVAS_BOTTOM, CANVAS_DEFAULT);
    test_cond("right/bottom anchors end at the anchor", cell(c, 18, 6)->ch == 't' && cell(c, 14, 6)->ch == 'r');
    char *txt = canvas_cells_text(c);
    test_cond("the grid converts to UTF-8 text", txt && strstr(txt, "ab\xc3\x97") && strchr(txt, '\n'));
    free(txt);
    canvas_free(c);
}

static void test_cells_rules(void) {
    canvas *c = NULL;
    if (canvas_cells_new(&c, 12, 6, 0)) { test_cond("cells canvas", 0); return; }
    /* an L-shaped axis through cell centres with one tick each way */
    canvas_rule(c, 2.5, 0, 2.5, 4.5, CANVAS_DEFAULT, 0);
    canvas_rule(c, 2.5, 4.5, 11, 4.5, CANVAS_DEFAULT, 0);
    canvas_rule(c, 6.5, 4.5, 6.5, 5, CANVAS_DEFAULT, 0);   /* x tick, down */
    canvas_rule(c, 2, 2.5, 2.5, 2.5, CANVAS_DEFAULT, 0);   /* y tick, left */
    canvas_rule(c, 9.5, 0, 9.5, 4.5, CANVAS_DEFAULT, CANVAS_RULE_DASHED);
    test_cond("axes meet in a corner", cell(c, 2, 4)->ch == 0x2514);
    test_cond("an x tick is a down tee", cell(c, 6, 4)->ch == 0x252C);
    test_cond("a y tick is a left tee", cell(c, 2, 2)->ch == 0x2524);
    test_cond("plain rules are lines", cell(c, 2, 1)->ch == 0x2502 && cell(c, 4, 4)->ch == 0x2500);
    test_cond("a line ending on an axis is an up tee", cell(c, 9, 4)->ch == 0x2534);
    test_cond("dashed rules use dashed glyphs", cell(c, 9, 2)->ch == 0x2506);
    canvas_free(c);

    if (canvas_cells_new(&c, 12, 6, CANVAS_CELLS_ASCII)) { test_cond("ascii cells canvas", 0); return; }
    canvas_rule(c, 2.5, 0, 2.5, 4.5, CANVAS_DEFAULT, 0);
    canvas_rule(c, 2.5, 4.5, 11, 4.5, CANVAS_DEFAULT, 0);
    canvas_line(c, 3, 0, 11, 4, 0, CANVAS_DEFAULT);
    canvas_fill_rect(c, 5, 0, 2, 0.5, CANVAS_RGB(0, 0, 0xff));
    canvas_text(c, 0, 5, "\xe2\x88\x92" "1\xe2\x80\xa6", CANVAS_FONT_BODY, 0, CANVAS_DEFAULT);
    const canvas_geom *g = canvas_geometry(c);
    test_cond("ascii mode says so and fills whole cells", g->ascii && g->fill_h == 1);
    int cols, rows, ascii = 1;
    const canvas_cell *grid = canvas_cells_grid(c, &cols, &rows);
    for (int i = 0; i < cols * rows; i++) if (grid[i].ch > 127 || grid[i].ch < 32) ascii = 0;
    test_cond("ascii mode uses only printable ASCII", ascii);
    test_cond("ascii axes are - | +", cell(c, 2, 4)->ch == '+' && cell(c, 2, 1)->ch == '|' && cell(c, 5, 4)->ch == '-');
    test_cond("ascii text maps the minus sign", cell(c, 0, 5)->ch == '-' && cell(c, 1, 5)->ch == '1');
    canvas_free(c);

    if (canvas_cells_new(&c, 8, 2, CANVAS_CELLS_MONO)) { test_cond("mono cells canvas", 0); return; }
    canvas_fill_rect(c, 0, 0, 1, 1, CANVAS_RGB(0xff, 0xff, 0xff));
    canvas_fill_rect(c, 1, 0, 1, 1, CANVAS_RGB(0x30, 0x30, 0x30));
    test_cond("mono mode shades fills by luminance", cell(c, 0, 0)->ch == 0x2588 && cell(c, 1, 0)->ch != 0x2588 &&
              cell(c, 1, 0)->ch != ' ');
    canvas_free(c);
}

/* Hammers a small grid with coordinates inside, outside and absurd, with
 * a clip, and checks that nothing lands outside the clip (ASan checks the
 * memory side). */
static void test_cells_bounds(void) {
    canvas *c = NULL;
    if (canvas_cells_new(&c, 10, 5, 0)) { test_cond("cells canvas", 0); return; }
    canvas_clip(c, (canvas_rect){ 3, 1, 4, 3 });
    const double v[] = { -1e300, -1000, -3.7, -0.5, 0, 0.25, 2.5, 4.99, 5, 9.75, 10, 11, 1e6, 1e300 };
    int nv = (int)(sizeof v / sizeof v[0]);
    for (int i = 0; i < nv; i++)
        for (int j = 0; j < nv; j++) {
            canvas_line(c, v[i], v[j], v[(i + 3) % nv], v[(j + 5) % nv], 1, CANVAS_RGB(1, 0, 0));
            canvas_fill_rect(c, v[i], v[j], 1.5, 0.7, CANVAS_RGB(0, 1, 0));
            canvas_rule(c, v[i], v[j], v[i], v[(j + 2) % nv], CANVAS_RGB(0, 0, 1), 0);
            canvas_rule(c, v[i], v[j], v[(i + 2) % nv], v[j], CANVAS_RGB(0, 0, 1), 0);
            canvas_text(c, v[i], v[j], "overflowing text", CANVAS_FONT_BODY, CANVAS_CENTER | CANVAS_MIDDLE, CANVAS_RGB(2, 2, 2));
            canvas_text(c, v[i], v[j], "down", CANVAS_FONT_BODY, CANVAS_VERTICAL, CANVAS_RGB(2, 2, 2));
        }
    int cols, rows, bad = 0, in = 0;
    const canvas_cell *g = canvas_cells_grid(c, &cols, &rows);
    for (int y = 0; y < rows; y++)
        for (int x = 0; x < cols; x++) {
            const canvas_cell *q = &g[y * cols + x];
            int blank = q->ch == ' ' && q->bg == CANVAS_DEFAULT;
            int inside = x >= 3 && x < 7 && y >= 1 && y < 4;
            if (!inside && !blank) bad++;
            if (inside && !blank) in++;
        }
    test_cond("cells outside the clip stay blank", bad == 0);
    test_cond("cells inside the clip were drawn", in > 0);
    canvas_free(c);

    int rc = canvas_cells_new(&c, 0, 5, 0);
    test_cond("an empty grid is refused", rc < 0 && c == NULL);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static void test_svg(const char *dir) {
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/s_a.svg", dir);
    snprintf(b, sizeof b, "%s/s_b.svg", dir);
    for (int k = 0; k < 2; k++) {
        canvas *c = NULL;
        int rc = canvas_svg_new(&c, 200, 120, NULL);
        if (k == 0) test_cond("svg canvas created", rc == 0 && c);
        if (!c) return;
        const canvas_geom *g = canvas_geometry(c);
        if (k == 0) test_cond("svg geometry is in pixels with rotated text", g->w == 200 && !g->cells && g->rotate_text);
        draw_sample(c);
        canvas_clip(c, (canvas_rect){ 0, 0, 100, 100 });
        canvas_text(c, 90, 0, "a<b & c>d", CANVAS_FONT_BODY, CANVAS_LEFT | CANVAS_TOP, CANVAS_DEFAULT);
        rc = canvas_svg_save(c, k ? b : a, 0);
        if (k == 0) test_cond("svg saves", rc == 0);
        canvas_free(c);
    }
    test_cond("identical drawing gives identical SVG bytes", files_equal(a, b));
    char *t = slurp(a);
    test_cond("svg has a root element with the figure size", t && strstr(t, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"200\" height=\"120\"") &&
              strstr(t, "</svg>\n"));
    test_cond("svg draws fills, lines and text", t && strstr(t, "<rect x=\"10\" y=\"10\" width=\"30\" height=\"20\" fill=\"#0072b2\"/>") &&
              strstr(t, "<polyline") && strstr(t, ">singular value</text>") && strstr(t, "rotate(-90"));
    test_cond("svg escapes text and clips what crosses the clip",
              t && strstr(t, ">a&lt;b &amp; c&gt;d</text>") && strstr(t, "clip-path=\"url(#c1)\"") && strstr(t, "<clipPath id=\"c1\">"));
    free(t);
    canvas *c = NULL;
    canvas_svg_new(&c, 10, 10, NULL);
    skv_clear_error();
    test_cond("svg refuses to overwrite without force", c && canvas_svg_save(c, a, 0) < 0 && strstr(skv_last_error(), a));
    test_cond("the generic save writes svg with force", c && canvas_save(c, a, 1) == 0);
    test_cond("svg save refuses a PNG call", c && canvas_png_save(c, a, 1) == SKV_EINVAL);
    canvas_free(c);
    canvas_cells_new(&c, 4, 4, 0);
    test_cond("cells have no file form", c && canvas_save(c, a, 1) == SKV_EINVAL);
    canvas_free(c);
    test_cond("no temporary files are left behind after SVG saves", temp_files_in(dir) == 0);
}

static void test_utf8(void) {
    const char *s = "a\xc3\x97\xe2\x94\x80\xf0\x9f\x98\x80\xff" "b";
    uint32_t want[] = { 'a', 0xD7, 0x2500, 0x1F600, 0xFFFD, 'b' };
    int ok = 1;
    for (int i = 0; i < 6; i++) if (canvas_utf8_next(&s) != want[i]) ok = 0;
    test_cond("utf8 decoding, with bad bytes as U+FFFD", ok && *s == 0);
    const char *t = "\xe2\x94";
    test_cond("a truncated sequence stops at the end", canvas_utf8_next(&t) == 0xFFFD && *t == 0);
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

int main(void) {
    const char *dir = test_tmpdir("canvas");
    test_png_basics(dir);
    test_png_clip();
    test_png_save(dir);
    test_png_font();
    test_cells_basics();
    test_cells_rules();
    test_cells_bounds();
    test_svg(dir);
    test_utf8();
    cleanup_dir(dir);
    return test_report("test_canvas");
}
