/* tui_blit.c: puts a cells canvas on the curses screen. The views draw into
 * an in-memory grid of cells (code point, RGB fg/bg, attributes); this layer
 * maps RGB to the terminal's palette (the xterm 256-colour cube and grey ramp,
 * or the 8 basic colours, or none), allocates colour pairs on demand from a
 * small cache, and writes each cell as a wide character, or as ASCII when the
 * locale is not UTF-8. Nothing here knows about views or the engine. */
#define NCURSES_WIDECHAR 1
#include "app.h"

#include <curses.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

/* Pair cache: (fg index + 1, bg index + 1) -> curses pair, open addressing. */
#define PAIR_SLOTS 4096
static struct { int key; short pair; } pair_cache[PAIR_SLOTS];
static int n_colors;      /* 256, 8 or 0 */
static int default_ok;    /* use_default_colors() worked: -1 is the terminal's own colour */
static int next_pair = 1, max_pair;

/* The 8 ANSI colours as xterm draws them, for nearest-colour search. */
static const unsigned char ansi8[8][3] = {
    {0, 0, 0}, {205, 0, 0}, {0, 205, 0}, {205, 205, 0}, {0, 0, 238}, {205, 0, 205}, {0, 205, 205}, {229, 229, 229},
};
static const int cube_level[6] = {0, 95, 135, 175, 215, 255};

int tui_blit_init(void) {
    memset(pair_cache, 0, sizeof pair_cache);
    next_pair = 1;
    n_colors = 0;
    if (!has_colors() || start_color() == ERR) return 0;
    default_ok = use_default_colors() == OK;
    n_colors = COLORS >= 256 ? 256 : COLORS >= 8 ? 8 : 0;
    max_pair = COLOR_PAIRS - 1;
    if (max_pair > 32767) max_pair = 32767;
    if (max_pair < 1) n_colors = 0;
    return n_colors;
}

static int sq(int a) { return a * a; }

static int nearest_cube(int v) {
    int best = 0;
    for (int i = 1; i < 6; i++)
        if (abs(cube_level[i] - v) < abs(cube_level[best] - v)) best = i;
    return best;
}

/* Terminal colour index for an RGB colour; -1 for the default. */
static int color_index(canvas_color c, int is_bg) {
    if (c == CANVAS_DEFAULT || c == CANVAS_NONE || (c >> 24)) {
        if (default_ok) return -1;
        return is_bg ? COLOR_BLACK : COLOR_WHITE;
    }
    int r = (c >> 16) & 255, g = (c >> 8) & 255, b = c & 255;
    if (n_colors == 256) {
        int ri = nearest_cube(r), gi = nearest_cube(g), bi = nearest_cube(b);
        int cube_d = sq(cube_level[ri] - r) + sq(cube_level[gi] - g) + sq(cube_level[bi] - b);
        int grey = (r + g + b) / 3, gi24 = (grey - 3) / 10;
        if (gi24 < 0) gi24 = 0;
        if (gi24 > 23) gi24 = 23;
        int gv = 8 + 10 * gi24;
        int grey_d = sq(gv - r) + sq(gv - g) + sq(gv - b);
        return grey_d < cube_d ? 232 + gi24 : 16 + 36 * ri + 6 * gi + bi;
    }
    int best = 0, best_d = 1 << 30;
    for (int i = 0; i < 8; i++) {
        int d = sq(ansi8[i][0] - r) + sq(ansi8[i][1] - g) + sq(ansi8[i][2] - b);
        if (d < best_d) { best_d = d; best = i; }
    }
    return best;
}

int tui_blit_pair(canvas_color fg, canvas_color bg) {
    if (!n_colors) return 0;
    int f = color_index(fg, 0), b = color_index(bg, 1);
    if (f == -1 && b == -1) return 0;
    int key = (f + 1) * 512 + (b + 1) + 1;
    unsigned h = (unsigned)key * 2654435761u % PAIR_SLOTS;
    for (int probe = 0; probe < PAIR_SLOTS; probe++, h = (h + 1) % PAIR_SLOTS) {
        if (pair_cache[h].key == key) return pair_cache[h].pair;
        if (pair_cache[h].key == 0) {
            if (next_pair > max_pair) return 0; /* out of pairs: default colours */
            short p = (short)next_pair++;
            if (init_pair(p, (short)f, (short)b) == ERR) return 0;
            pair_cache[h].key = key;
            pair_cache[h].pair = p;
            return p;
        }
    }
    return 0;
}

/* A code point the terminal can show in one cell, or a stand-in. */
static wchar_t glyph(uint32_t ch, int utf8) {
    if (ch < 32 || ch == 127) return L' ';
    if (ch < 127) return (wchar_t)ch;
    if (!utf8 || ch > 0x10FFFF) return L'?';
    if (wcwidth((wchar_t)ch) != 1) return L'?';
    return (wchar_t)ch;
}

static void put_cell(int y, int x, wchar_t wc, attr_t attr, int pair) {
    wchar_t s[2] = {wc, 0};
    cchar_t cc;
    setcchar(&cc, s, attr, (short)pair, NULL);
    mvadd_wch(y, x, &cc);
}

void tui_blit(canvas *c, int y, int x, int utf8) {
    int cols, rows;
    const canvas_cell *g = canvas_cells_grid(c, &cols, &rows);
    if (!g) return;
    int sh = LINES, sw = COLS;
    for (int r = 0; r < rows; r++) {
        int yy = y + r;
        if (yy < 0 || yy >= sh) continue;
        for (int k = 0; k < cols; k++) {
            int xx = x + k;
            if (xx < 0 || xx >= sw) continue;
            if (yy == sh - 1 && xx == sw - 1) continue; /* writing there would scroll */
            const canvas_cell *cell = &g[(long)r * cols + k];
            attr_t a = A_NORMAL;
            if (cell->attr & CANVAS_ATTR_BOLD) a |= A_BOLD;
            if (cell->attr & CANVAS_ATTR_UNDERLINE) a |= A_UNDERLINE;
            put_cell(yy, xx, glyph(cell->ch, utf8), a, tui_blit_pair(cell->fg, cell->bg));
        }
    }
}

void tui_blit_text(int y, int x, int w, const char *s, int attr, int pair, int utf8_ok) {
    if (y < 0 || y >= LINES) return;
    for (int i = 0; *s && i < w; i++) {
        if (x + i >= COLS || (y == LINES - 1 && x + i == COLS - 1)) break;
        uint32_t cp = canvas_utf8_next(&s);
        if (x + i >= 0) put_cell(y, x + i, glyph(cp, utf8_ok), (attr_t)attr, pair);
    }
}
