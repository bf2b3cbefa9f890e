/* view_tokens.c: the text of the run, token by token.
 *
 * The prompt and the generated tokens, wrapped to the rectangle at token
 * boundaries (newlines in a token break the line), with the current step's
 * token highlighted. Prompt tokens are drawn muted, generated ones in
 * colour; when the run had --oracle, a generated token sampled from logits
 * whose sparse top-1 disagreed with the dense twin's (the step before the
 * one that fed it) is drawn in a warning colour (and underlined on PNG). The
 * run's last token was sampled and fed to no step. A header gives the counts, the current token and how often the
 * sparse and dense argmax agreed. The text follows the current token: the
 * lines shown end a little below it, cursor.scroll lines further back.
 *
 * Keys: ←/→ previous/next decode step (→ past the last follows the latest);
 * ↑/↓ scroll the text back/forward by a line. A click on a generated token
 * makes its step current; on a prompt token, or the last one, it selects
 * that token. Click
 * mapping re-wraps the text with terminal metrics (one cell per code point),
 * which is what the inspector draws with. */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }



/* ---- layout ------------------------------------------------------------ */

/* One run of a token's text placed on one line. */
typedef struct piece {
    int tok;                /* index in the store's tokens */
    int line;
    double x, w;            /* from the left of the text area */
    int off, len;           /* bytes in the layout's text buffer */
} piece;

typedef struct layout {
    piece *p; int n, cap;
    char *text; int tlen, tcap;
    int lines;              /* lines used */
} layout;

/* Measures text in canvas units; NULL measures one unit per code point (the terminal). */
static double measure(canvas *c, const char *s) {
    if (c) return canvas_text_width(c, s, CANVAS_FONT_BODY);
    double n = 0;
    while (*s) { canvas_utf8_next(&s); n += 1; }
    return n;
}

static int put_utf8(uint32_t cp, char *b) {
    if (cp < 0x80) { b[0] = (char)cp; return 1; }
    if (cp < 0x800) { b[0] = (char)(0xC0 | (cp >> 6)); b[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        b[0] = (char)(0xE0 | (cp >> 12)); b[1] = (char)(0x80 | ((cp >> 6) & 63)); b[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    b[0] = (char)(0xF0 | (cp >> 18)); b[1] = (char)(0x80 | ((cp >> 12) & 63));
    b[2] = (char)(0x80 | ((cp >> 6) & 63)); b[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* Appends len bytes (and a NUL) to the text buffer; their offset, or -1 when out of memory. */
static int add_text(layout *L, const char *s, int len) {
    if (L->tlen + len + 1 > L->tcap) {
        int cap = L->tcap ? 2 * L->tcap : 4096;
        while (cap < L->tlen + len + 1) cap *= 2;
        char *t = realloc(L->text, (size_t)cap);
        if (!t) return -1;
        L->text = t;
        L->tcap = cap;
    }
    int off = L->tlen;
    memcpy(L->text + off, s, (size_t)len);
    L->text[off + len] = 0;
    L->tlen += len + 1;
    return off;
}

/* Appends a placed piece whose text is at off; -1 when out of memory. */
static int add_piece(layout *L, int tok, int line, double x, double w, int off, int len) {
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 256;
        piece *p = realloc(L->p, (size_t)cap * sizeof *p);
        if (!p) return -1;
        L->p = p;
        L->cap = cap;
    }
    L->p[L->n++] = (piece){ tok, line, x, w, off, len };
    return 0;
}

/* A token's text up to and including a newline, before it is placed. */
typedef struct seg {
    int tok, off, len;
    double w;
    int brk;                /* a line may break before it */
    int nl;                 /* ends with a newline: the line breaks after it */
} seg;

/* Cuts the token texts into segments (a newline shows as a return arrow
 * and ends its segment; tabs become spaces, other control bytes a middle
 * dot, invalid UTF-8 U+FFFD). A break is allowed before a segment that
 * starts with a space or follows one ending in a space or a newline, so
 * words made of several tokens stay on one line. */
/* Bytes a UTF-8 sequence starting with b has in all (1 for anything else). */
static int utf8_len(unsigned char b) { return (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1; }

static int make_segments(layout *L, canvas *c, const probe_store *st, int ascii, seg **out, int *n_out) {
    seg *sg = NULL;
    int n = 0, cap = 0, nt = probe_store_n_tokens(st);
    char buf[1024];
    /* Byte-level tokens may split a character: the bytes of a sequence cut
     * by a token's end are carried into the next token, and the character
     * is shown with the token that completes it. */
    char carry[4];
    int nc = 0;
    char *mb = NULL;
    for (int i = 0; i < nt; i++) {
        const probe_ev_token *t = probe_store_token(st, i);
        if (!t || !t->text) continue;
        char *nb = realloc(mb, (size_t)nc + (size_t)t->n_text + 8);
        if (!nb) { free(mb); free(sg); return -1; }
        mb = nb;
        memcpy(mb, carry, (size_t)nc);
        memcpy(mb + nc, t->text, (size_t)t->n_text);
        int len = nc + t->n_text;
        memset(mb + len, 0, 8);
        nc = 0;
        if (i + 1 < nt)
            for (int k = len - 1; k >= 0 && k >= len - 3; k--) {
                unsigned char b = (unsigned char)mb[k];
                if ((b & 0xC0) == 0x80) continue;       /* a continuation byte: look further back */
                if (utf8_len(b) > len - k) {            /* a sequence the next token completes */
                    nc = len - k;
                    memcpy(carry, mb + k, (size_t)nc);
                    len = k;
                }
                break;
            }
        const char *s = mb, *end = mb + len;
        while (s < end) {
            int bl = 0, nl = 0;
            while (s < end && bl < (int)sizeof buf - 8) {
                if (*s == '\r') { s++; continue; }
                if (*s == '\n') {
                    s++;
                    nl = 1;
                    if (ascii) { memcpy(buf + bl, "\\n", 2); bl += 2; }
                    else bl += put_utf8(0x21B5, buf + bl);
                    break;
                }
                uint32_t cp = canvas_utf8_next(&s);
                if (s > end) s = end; /* a sequence cut by the token's end */
                if (cp == '\t') cp = ' ';
                else if (cp < 32 || cp == 127) cp = ascii ? '.' : 0xB7;
                bl += put_utf8(cp, buf + bl);
            }
            if (bl == 0) continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                seg *ns = realloc(sg, (size_t)cap * sizeof *ns);
                if (!ns) { free(sg); free(mb); return -1; }
                sg = ns;
            }
            int off = add_text(L, buf, bl);
            if (off < 0) { free(sg); free(mb); return -1; }
            int brk = n == 0 || buf[0] == ' ' || sg[n - 1].nl || L->text[sg[n - 1].off + sg[n - 1].len - 1] == ' ';
            sg[n++] = (seg){ i, off, bl, measure(c, L->text + off), brk, nl };
        }
    }
    free(mb);
    *out = sg;
    *n_out = n;
    return 0;
}

/* Places one segment at (line, x), cutting it between code points when it
 * is wider than a line. */
static int place_segment(layout *L, canvas *c, const seg *sg, double w, int *line, double *x) {
    if (*x > 0 && *x + sg->w > w) { (*line)++; *x = 0; }
    if (sg->w <= w) {
        if (add_piece(L, sg->tok, *line, *x, sg->w, sg->off, sg->len)) return -1;
        *x += sg->w;
        return 0;
    }
    int pos = 0;
    while (pos < sg->len) {
        char part[1024];
        int pl = 0;
        while (pos + pl < sg->len) {
            const char *q = L->text + sg->off + pos + pl, *nq = q;
            canvas_utf8_next(&nq);
            int cl = (int)(nq - q);
            memcpy(part, L->text + sg->off + pos, (size_t)(pl + cl));
            part[pl + cl] = 0;
            if (pl > 0 && measure(c, part) > w - *x) break;
            pl += cl;
        }
        memcpy(part, L->text + sg->off + pos, (size_t)pl);
        part[pl] = 0;
        double pw = measure(c, part);
        if (add_piece(L, sg->tok, *line, *x, pw, sg->off + pos, pl)) return -1;
        pos += pl;
        if (pos < sg->len) { (*line)++; *x = 0; }
        else *x += pw;
    }
    return 0;
}

/* Wraps the tokens into lines of width w (canvas units; c NULL: terminal
 * cells), keeping words whole when they fit on a line. */
static int layout_tokens(layout *L, canvas *c, const probe_store *st, double w, int ascii) {
    memset(L, 0, sizeof *L);
    seg *sg;
    int n;
    if (make_segments(L, c, st, ascii, &sg, &n)) return -1;
    int line = 0, i = 0;
    double x = 0;
    while (i < n) {
        int j = i + 1;
        double ww = sg[i].w;
        while (j < n && !sg[j].brk && !sg[j - 1].nl) ww += sg[j++].w;
        if (x > 0 && x + ww > w && ww <= w) { line++; x = 0; }
        for (int k = i; k < j; k++) {
            if (place_segment(L, c, &sg[k], w, &line, &x)) { free(sg); return -1; }
            if (sg[k].nl) { line++; x = 0; }
        }
        i = j;
    }
    free(sg);
    L->lines = line + 1;
    return 0;
}

static void layout_free(layout *L) {
    free(L->p);
    free(L->text);
}

/* The store index of the highlighted token: the cursor's token position if
 * set, else the current step's generated token; -1 for none. */
static int current_token(const probe_store *st, const view_cursor *cur, int step) {
    for (int i = 0; i < probe_store_n_tokens(st); i++) {
        const probe_ev_token *t = probe_store_token(st, i);
        if (cur->token >= 0 ? t->pos == cur->token : (step >= 0 && t->step == step)) return i;
    }
    return -1;
}

/* The first line shown: the current token's line about three quarters
 * down, cursor.scroll lines back, within the text. */
static int first_line(const layout *L, int cur_tok, int visible, int scroll) {
    if (L->lines <= visible) return 0;
    int line = L->lines - 1;
    for (int i = 0; i < L->n; i++)
        if (L->p[i].tok == cur_tok) { line = L->p[i].line; break; }
    int first = line - (visible * 3) / 4;
    first -= scroll > 0 ? scroll : 0;
    return clampi(first, 0, L->lines - visible);
}

/* A swatch and its text; returns the x after them. */
static double legend_entry(canvas *c, double x, double y, double h, canvas_color sw, canvas_color ink, int underline,
                           const char *text) {
    const canvas_geom *g = canvas_geometry(c);
    if (sw != CANVAS_NONE) {
        double bw = g->cells ? 1 : round(h * 0.7);
        canvas_fill_rect(c, x, g->cells ? y : y + round((h - bw) / 2), bw, g->cells ? 1 : bw, sw);
        x += bw + (g->cells ? 1 : g->pad);
    }
    double tw = canvas_text(c, x, g->cells ? y : y + h / 2, text, CANVAS_FONT_SMALL,
                            CANVAS_LEFT | (g->cells ? CANVAS_TOP : CANVAS_MIDDLE), ink);
    if (underline && !g->cells) canvas_fill_rect(c, x, y + h - g->hair * 2, tw, g->hair * 2, ink);
    return x + tw + (g->cells ? 2 : round(1.2 * g->em));
}

static int tokens_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    const canvas_theme *th = canvas_get_theme(c);
    int nt = probe_store_n_tokens(st);
    if (nt <= 0) return view_message(c, r, "Tokens", "no tokens yet: the run has not started", res);
    int np = probe_store_n_prompt(st), ngen = nt - np, step = view_step(st, cur);
    int ctok = current_token(st, cur, step), agree = 0, compared = 0;
    for (int s = 0; s < probe_store_n_steps(st); s++) {
        const probe_ev_step *e = probe_store_step(st, s);
        if (e && e->has_oracle) { compared++; agree += e->top1_agree != 0; }
    }

    canvas_color c_prompt = th->muted, c_gen = g->cells ? palette_cat(4) : palette_cat(0), c_bad = palette_cat(3);
    canvas_color c_hi = g->cells ? th->highlight : palette_cat(7);
    canvas_color c_hi_ink = canvas_luma(c_hi) > 0.4 ? CANVAS_RGB(0, 0, 0) : CANVAS_RGB(0xff, 0xff, 0xff);

    /* header: title, then a legend line */
    double pad = g->cells ? 0 : g->pad * 2, lh_t = canvas_line_height(c, CANVAS_FONT_TITLE);
    double lh_s = canvas_line_height(c, CANVAS_FONT_SMALL), lh = canvas_line_height(c, CANVAS_FONT_BODY);
    double row_h = g->cells ? 1 : round(lh * 1.3);
    canvas_rect old = canvas_clip(c, r);
    char title[300], cur_txt[64] = "", cur_desc[200] = "no current token";
    if (ctok >= 0) {
        const probe_ev_token *t = probe_store_token(st, ctok);
        int k = 0;
        for (const char *s = t->text ? t->text : ""; *s && k < 40; ) {
            uint32_t cp = canvas_utf8_next(&s);
            if (cp == '\n') cp = g->ascii ? '|' : 0x21B5;
            else if (cp < 32 || cp == 127) cp = g->ascii ? '.' : 0xB7;
            k += put_utf8(cp, cur_txt + k);
        }
        cur_txt[k] = 0;
        if (t->step >= probe_store_n_steps(st))
            snprintf(cur_desc, sizeof cur_desc,
                     g->cells ? "last: \"%s\" (id %d, fed to no step)"
                              : "the last token \"%s\" (id %d, position %d), sampled and fed to no step", cur_txt,
                     t->id, t->pos);
        else if (t->step >= 0)
            snprintf(cur_desc, sizeof cur_desc,
                     g->cells ? "step %d: \"%s\" (id %d)" : "step %d: \"%s\" (id %d, position %d)", t->step, cur_txt,
                     t->id, t->pos);
        else
            snprintf(cur_desc, sizeof cur_desc,
                     g->cells ? "prompt: \"%s\" (id %d)" : "prompt token \"%s\" (id %d, position %d)", cur_txt, t->id,
                     t->pos);
    }
    if (compared)
        snprintf(title, sizeof title,
                 g->cells ? "Tokens: %d prompt + %d generated, top-1 = dense %d/%d"
                          : "Tokens: %d prompt + %d generated; sparse top-1 agrees with dense on %d of %d steps",
                 np, ngen, agree, compared);
    else
        snprintf(title, sizeof title, "Tokens: %d prompt + %d generated", np, ngen);
    view_fit_text(c, CANVAS_FONT_TITLE, r.w - 2 * pad, title);
    double y = r.y + pad;
    canvas_text(c, g->cells ? r.x : r.x + pad, y, title, CANVAS_FONT_TITLE, CANVAS_LEFT | CANVAS_TOP, th->fg);
    y += lh_t + (g->cells ? 0 : g->pad);
    double lx = g->cells ? r.x : r.x + pad, lrow = g->cells ? 1 : round(lh_s * 1.3);
    lx = legend_entry(c, lx, y, lrow, CANVAS_NONE, c_prompt, 0, "prompt");
    lx = legend_entry(c, lx, y, lrow, CANVAS_NONE, c_gen, 0,
                      compared && !g->cells ? "generated, same top-1 as dense" : "generated");
    if (compared)
        lx = legend_entry(c, lx, y, lrow, CANVAS_NONE, c_bad, 1,
                          g->cells ? "top-1 differs" : "generated, top-1 differs from dense");
    legend_entry(c, lx, y, lrow, c_hi, th->fg, 0, cur_desc);
    y += lrow + (g->cells ? 0 : g->pad * 2);

    /* the text */
    canvas_rect area = { r.x + pad, y, fmax(0, r.w - 2 * pad), fmax(0, r.y + r.h - pad - y) };
    layout L;
    if (area.w < 1 || area.h < row_h) { /* no room for text */
        canvas_clip(c, old);
        if (res) {
            memset(res, 0, sizeof *res);
            res->area = (canvas_rect){ area.x, area.y, 0, 0 };
            res->axis_x = res->axis_y = NAN;
            for (int i = 0; i < PAINT_MAX_MARKERS; i++) res->marker_x[i] = NAN;
        }
        return SKV_OK;
    }
    if (layout_tokens(&L, c, st, area.w, g->ascii)) {
        layout_free(&L);
        canvas_clip(c, old);
        return skv_error(SKV_ENOMEM, "tokens view: out of memory");
    }
    int visible = (int)floor(area.h / row_h);
    int first = first_line(&L, ctok, visible > 0 ? visible : 1, cur->scroll);
    canvas_clip(c, (canvas_rect){ area.x, area.y, area.w, visible * row_h });
    for (int i = 0; i < L.n; i++) {
        const piece *p = &L.p[i];
        if (p->line < first || p->line >= first + visible) continue;
        const probe_ev_token *t = probe_store_token(st, p->tok);
        double px = area.x + p->x, py = area.y + (p->line - first) * row_h;
        canvas_color ink = c_prompt;
        int bad = 0;
        if (t->step >= 0) { /* sampled from the logits of the step before the one that fed it */
            const probe_ev_step *e = t->step > 0 ? probe_store_step(st, t->step - 1) : NULL;
            bad = e && e->has_oracle && !e->top1_agree;
            ink = bad ? c_bad : c_gen;
        }
        if (p->tok == ctok) {
            canvas_fill_rect(c, px, py, fmax(p->w, g->cells ? 1 : g->em * 0.4), row_h, c_hi);
            ink = c_hi_ink;
        }
        canvas_text(c, px, g->cells ? py : py + row_h / 2, L.text + p->off, CANVAS_FONT_BODY,
                    CANVAS_LEFT | (g->cells ? CANVAS_TOP : CANVAS_MIDDLE), ink);
        if (bad && !g->cells) canvas_fill_rect(c, px, py + row_h - 2 * g->hair, p->w, 2 * g->hair, c_bad);
    }
    canvas_clip(c, old);
    if (res) {
        /* the text area, with y mapping line numbers (ydown) and x in canvas units */
        memset(res, 0, sizeof *res);
        res->area = (canvas_rect){ area.x, area.y, area.w, visible * row_h };
        res->x0 = 0; res->x1 = area.w;
        res->y0 = first; res->y1 = first + visible; res->ydown = 1;
        res->axis_x = res->axis_y = NAN;
        for (int i = 0; i < PAINT_MAX_MARKERS; i++) res->marker_x[i] = NAN;
        res->shown = visible;
        res->complete = L.lines <= visible;
    }
    layout_free(&L);
    return SKV_OK;
}

static int tokens_move(view_cursor *cur, const probe_store *st, int dx, int dy) {
    if (dy) {
        int s = cur->scroll - dy; /* up (dy < 0) goes back in the text */
        if (s < 0) s = 0;
        if (s > probe_store_n_tokens(st)) s = probe_store_n_tokens(st);
        if (s == cur->scroll) return VIEW_HANDLED;
        cur->scroll = s;
        return VIEW_HANDLED | VIEW_REDRAW;
    }
    int ns;
    if (!dx || !view_next_step(st, cur, dx, &ns)) return 0;
    if (ns == cur->step && cur->token < 0) return VIEW_HANDLED;
    cur->step = ns;
    cur->token = -1;
    cur->scroll = 0;
    return VIEW_HANDLED | VIEW_REDRAW;
}

static int tokens_click(view_cursor *cur, const probe_store *st, const paint_result *res, double x, double y) {
    const canvas_rect *a = &res->area;
    if (a->w <= 0 || a->h <= 0 || res->shown <= 0 || x < a->x || x >= a->x + a->w || y < a->y || y >= a->y + a->h)
        return 0;
    int line = (int)floor(res->y0 + (y - a->y) / a->h * (res->y1 - res->y0));
    layout L;
    if (layout_tokens(&L, NULL, st, a->w, 0)) { layout_free(&L); return 0; }
    int tok = -1;
    for (int i = 0; i < L.n; i++)
        if (L.p[i].line == line && x - a->x >= L.p[i].x && x - a->x < L.p[i].x + fmax(L.p[i].w, 1)) tok = L.p[i].tok;
    layout_free(&L);
    if (tok < 0) return 0;
    const probe_ev_token *t = probe_store_token(st, tok);
    if (t->step >= 0 && t->step < probe_store_n_steps(st)) {
        if (cur->step == t->step && cur->token < 0) return VIEW_HANDLED;
        cur->step = t->step;
        cur->token = -1;
    } else {
        if (cur->token == t->pos) return VIEW_HANDLED;
        cur->token = t->pos;
    }
    return VIEW_HANDLED | VIEW_REDRAW;
}

const view_class view_tokens = {
    .name = "tokens",
    .title = "Tokens",
    .help = "the prompt and generated text with the current step's token and top-1 agreement with the oracle",
    .draw = tokens_draw,
    .move = tokens_move,
    .click = tokens_click,
    .needs = PROBE_TOKEN,
};
