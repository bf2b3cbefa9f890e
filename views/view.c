/* view.c: the table of views in tab order, lookup by name, and cursor
 * helpers shared by the views. */
#include "view.h"

#include "lanes.h"
#include "skv.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

extern const view_class view_spectrum, view_chunkmap, view_selection, view_cache, view_timeline, view_tokens;
extern const view_class view_needle, view_niah, view_compare;
extern const view_class view_bounds, view_corrections, view_speculation, view_tailor;

/* The peer views (bounds: Quest, corrections: FreeKV, speculation: SpeCache,
 * tailor: TailorKV) come last: they read policy-specific PROBE_METRIC events. */
const view_class *const view_classes[] = {
    &view_spectrum, &view_chunkmap, &view_selection, &view_cache, &view_timeline, &view_tokens,
    &view_needle, &view_niah, &view_compare, &view_bounds, &view_corrections, &view_speculation, &view_tailor, NULL,
};

const view_class *view_find(const char *name) {
    for (int i = 0; view_classes[i]; i++)
        if (!strcmp(view_classes[i]->name, name)) return view_classes[i];
    /* the tab's title names it too: "chunks" is chunkmap, "specache" speculation */
    for (int i = 0; view_classes[i]; i++)
        if (!strcasecmp(view_classes[i]->title, name)) return view_classes[i];
    return NULL;
}

void view_names(char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; view_classes[i] && len < n; i++) {
        const view_class *v = view_classes[i];
        if (strcasecmp(v->name, v->title))
            len += (size_t)snprintf(buf + len, n - len, "%s%s (tab %s)", i ? ", " : "", v->name, v->title);
        else
            len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", v->name);
    }
}

void view_cursor_init(view_cursor *cur) {
    memset(cur, 0, sizeof *cur);
    cur->step = -1;
    cur->chunk = -1;
    cur->token = -1;
}

int view_step(const probe_store *st, const view_cursor *cur) {
    int n = probe_store_n_steps(st);
    if (n <= 0) return -1;
    if (cur->step < 0 || cur->step >= n) return n - 1;
    return cur->step;
}

/* Cuts buf (in place) with an ellipsis so that it is at most w wide in font. */
void view_fit_text(canvas *c, int font, double w, char *buf) {
    if (canvas_text_width(c, buf, font) <= w) return;
    const char *ell = canvas_geometry(c)->ascii ? "~" : "\xe2\x80\xa6";
    size_t len = strlen(buf), el = strlen(ell);
    while (len > 0) {
        do len--; while (len > 0 && ((unsigned char)buf[len] & 0xC0) == 0x80);
        memcpy(buf + len, ell, el + 1);
        if (canvas_text_width(c, buf, font) <= w) return;
    }
    buf[0] = 0;
}

int view_note_lines(canvas *c, int cells, double w, double pad, const char *note, char (*lines)[VIEW_LINE_MAX],
                    int max) {
    if (!cells) return view_wrap(c, CANVAS_FONT_BODY, w - 2 * pad, note, lines, max);
    snprintf(lines[0], VIEW_LINE_MAX, "%s", note);
    view_fit_text(c, CANVAS_FONT_BODY, w, lines[0]);
    return 1;
}

int view_wrap(canvas *c, int font, double w, const char *text, char (*lines)[VIEW_LINE_MAX], int max) {
    int n = 0;
    const char *p = text;
    while (*p == ' ') p++;
    while (*p && n < max) {
        size_t len = strlen(p), best = 0;
        if (len >= VIEW_LINE_MAX) len = VIEW_LINE_MAX - 1;
        if (n == max - 1 || canvas_text_width(c, p, font) <= w) { /* the last line: the rest, cut when too long */
            memcpy(lines[n], p, len);
            lines[n][len] = 0;
            view_fit_text(c, font, w, lines[n]);
            return n + 1;
        }
        size_t clause = 0;
        for (size_t i = 1; i < len; i++) { /* the longest prefix ending before a space that fits */
            if (p[i] != ' ') continue;
            memcpy(lines[n], p, i);
            lines[n][i] = 0;
            if (canvas_text_width(c, lines[n], font) > w) break;
            best = i;
            if (p[i - 1] == ';') clause = i;
        }
        if (clause * 2 >= best) best = clause; /* break after a clause when that keeps half the line or more */
        if (!best) { /* one word wider than the line: cut it */
            memcpy(lines[n], p, len);
            lines[n][len] = 0;
            view_fit_text(c, font, w, lines[n]);
            return n + 1;
        }
        memcpy(lines[n], p, best);
        lines[n][best] = 0;
        n++;
        p += best;
        while (*p == ' ') p++;
    }
    return n;
}

/* Why there is nothing to draw: no run yet, no decode steps yet (per_step),
 * nothing of this kind from the run's policy (who: NULL, or who records it),
 * or nothing at the cursor. */
static const char *no_data(const probe_store *st, int present, int per_step, const char *what, const char *who,
                           char *buf, size_t n) {
    const probe_ev_run *run = probe_store_run(st);
    const char *pol = run && run->kv_policy && run->kv_policy[0] ? run->kv_policy : "?";
    if (!run && !present)
        snprintf(buf, n, "no %s: no run recorded yet", what);
    else if (per_step && probe_store_n_steps(st) == 0)
        snprintf(buf, n, "no %s yet: generate tokens (-n N) and step (n or r)", what);
    else if (!present && who) {
        char own[48];
        snprintf(own, sizeof own, "--kv %s)", pol);
        if (strstr(who, own)) /* the owner ran but recorded none: it fell back to dense attention */
            snprintf(buf, n, "no %s: %s recorded none in this run; at this budget it attends densely or selects "
                     "nothing (its notice at the start of the run says which)", what, pol);
        else
            snprintf(buf, n, "no %s: %s records them; this run's policy is %s", what, who, pol);
    }
    else if (!present)
        snprintf(buf, n, "no %s: policy %s records none (skv run --kv help lists the policies)", what, pol);
    else
        snprintf(buf, n, "no %s here: move to another layer, head or step", what);
    return buf;
}

const char *view_no_data(const probe_store *st, probe_kind kind, const char *what, char *buf, size_t n) {
    int per_step = kind == PROBE_DECODE_HEAD || kind == PROBE_STEP || kind == PROBE_NEEDLE;
    return no_data(st, probe_store_count(st, kind) > 0, per_step, what, NULL, buf, n);
}

const char *view_no_metric(const probe_store *st, const char *metric, int per_step, const char *what,
                           const char *owner, char *buf, size_t n) {
    return no_data(st, probe_store_has_metric(st, metric), per_step, what, owner, buf, n);
}

/* Clears res, draws the title and a centred message (wrapped), records the
 * message as the last error and returns SKV_EMISSING. */
int view_message(canvas *c, canvas_rect r, const char *title, const char *msg, paint_result *res) {
    if (res) {
        memset(res, 0, sizeof *res);
        res->area = (canvas_rect){ r.x, r.y, 0, 0 };
        res->axis_x = res->axis_y = NAN;
        for (int i = 0; i < PAINT_MAX_MARKERS; i++) res->marker_x[i] = NAN;
    }
    const canvas_geom *g = canvas_geometry(c);
    const canvas_theme *th = canvas_get_theme(c);
    canvas_rect old = canvas_clip(c, r);
    double cx = g->cells ? r.x + floor(r.w / 2) : r.x + r.w / 2;
    canvas_text(c, cx, r.y + g->pad, title, CANVAS_FONT_TITLE, CANVAS_CENTER | CANVAS_TOP, th->fg);
    /* the message, wrapped at spaces to the width, centred */
    char lines[8][512];
    int nl = 0;
    double maxw = r.w - 2 * (g->cells ? 1 : g->pad);
    const char *p = msg;
    while (*p && nl < 8) {
        size_t len = strlen(p), cut = len;
        if (len >= sizeof lines[0]) cut = len = sizeof lines[0] - 1;
        memcpy(lines[nl], p, cut);
        lines[nl][cut] = 0;
        while (canvas_text_width(c, lines[nl], CANVAS_FONT_BODY) > maxw) {
            char *sp = strrchr(lines[nl], ' ');
            if (!sp || sp == lines[nl]) break;
            *sp = 0;
        }
        cut = strlen(lines[nl]);
        if (nl == 7 && p[cut]) view_fit_text(c, CANVAS_FONT_BODY, maxw, lines[nl]);
        else if (canvas_text_width(c, lines[nl], CANVAS_FONT_BODY) > maxw) view_fit_text(c, CANVAS_FONT_BODY, maxw, lines[nl]);
        p += cut;
        while (*p == ' ') p++;
        nl++;
    }
    double lh = g->cells ? 1 : canvas_line_height(c, CANVAS_FONT_BODY);
    double y0 = (g->cells ? r.y + floor(r.h / 2) : r.y + r.h / 2) - floor(nl / 2) * lh;
    for (int i = 0; i < nl; i++)
        canvas_text(c, cx, y0 + i * lh, lines[i], CANVAS_FONT_BODY, CANVAS_CENTER | (g->cells ? CANVAS_TOP : CANVAS_MIDDLE),
                    th->fg);
    canvas_clip(c, old);
    return skv_error(SKV_EMISSING, "%s", msg);
}

int view_next_step(const probe_store *st, const view_cursor *cur, int d, int *ns) {
    int n = probe_store_n_steps(st);
    if (n <= 0) return 0;
    int s = cur->step < 0 || cur->step >= n ? n - 1 : cur->step;
    if (d < 0) *ns = s > 0 ? s - 1 : 0;
    else *ns = s + 1 < n ? s + 1 : -1;
    if (cur->step < 0 && d > 0) *ns = -1;
    return 1;
}

int view_move_step(view_cursor *cur, const probe_store *st, int d) {
    int ns;
    if (!view_next_step(st, cur, d, &ns)) return 0;
    if (ns == cur->step) return VIEW_HANDLED;
    cur->step = ns;
    return VIEW_HANDLED | VIEW_REDRAW;
}

int view_move_layer_step(view_cursor *cur, const probe_store *st, int dx, int dy) {
    if (dy) {
        int nl = probe_store_n_layers(st);
        if (nl <= 0) return 0;
        int l = cur->layer + dy < 0 ? 0 : cur->layer + dy > nl - 1 ? nl - 1 : cur->layer + dy;
        if (l == cur->layer) return VIEW_HANDLED;
        cur->layer = l;
        return VIEW_HANDLED | VIEW_REDRAW;
    }
    return dx ? view_move_step(cur, st, dx) : 0;
}

int view_draw_lanes(const view_class *vc, canvas *c, canvas_rect r, const probe_store *const *st,
                    const char *const *names, int n, const view_cursor *cur, paint_result *res) {
    if (vc->draw_lanes) return vc->draw_lanes(c, r, st, names, n, cur, res);
    return view_draw_lanes_each(vc, c, r, st, names, n, cur, res);
}

/* A batch's prefill view: one pane, under a line naming what it shows. */
static int draw_shared_prefill(const view_class *vc, canvas *c, canvas_rect r, const probe_store *st, int n,
                               const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    double lh = g->cells ? 1 : canvas_line_height(c, CANVAS_FONT_BOLD);
    char label[160];
    for (int form = 0; form < 2; form++) { /* the shorter wording when the long one does not fit */
        if (form == 0)
            snprintf(label, sizeof label, "the prefill, shared by all %d sequences%s", n,
                     vc->prefill == 2 ? "; the selection shown is sequence 0's (p: each sequence)" : "");
        else
            snprintf(label, sizeof label, "prefill shared by %d sequences%s", n,
                     vc->prefill == 2 ? "; selection: seq 0 (p: each)" : "");
        if (canvas_text_width(c, label, CANVAS_FONT_BOLD) <= r.w - (g->cells ? 0 : 2 * g->pad)) break;
    }
    view_fit_text(c, CANVAS_FONT_BOLD, r.w - (g->cells ? 0 : 2 * g->pad), label);
    canvas_text(c, r.x + (g->cells ? 0 : g->pad), r.y, label, CANVAS_FONT_BOLD, CANVAS_LEFT | CANVAS_TOP,
                canvas_get_theme(c)->fg);
    canvas_rect br = { r.x, r.y + lh, r.w, r.h - lh };
    if (br.h < 1) return vc->draw(c, r, st, cur, res);
    canvas_rect old = canvas_clip(c, br);
    int rc = vc->draw(c, br, st, cur, res);
    canvas_clip(c, old);
    return rc;
}

int view_draw_lanes_each(const view_class *vc, canvas *c, canvas_rect r, const probe_store *const *st,
                         const char *const *names, int n, const view_cursor *cur, paint_result *res) {
    if (cur->batch && vc->prefill && n > 1) return draw_shared_prefill(vc, c, r, st[0], n, cur, res);
    const probe_store *keep_st[PROBE_MAX_LANES];
    const char *keep_nm[PROBE_MAX_LANES];
    char gone[200] = ""; /* the lanes with nothing for a view of every policy, named under the panes (a
                          * policy's own view, vc->metric, leaves the others out unnamed) */
    size_t gl = 0;
    if (vc->metric && n > 1) {
        int k = 0;
        for (int i = 0; i < n && k < PROBE_MAX_LANES; i++)
            if (probe_store_has_metric(st[i], vc->metric)) {
                keep_st[k] = st[i];
                keep_nm[k++] = names ? names[i] : NULL;
            }
        if (k == 0) return vc->draw(c, r, st[0], cur, res);
        st = keep_st;
        names = names ? keep_nm : NULL;
        n = k;
    }
    /* Panes with nothing to show are left out (a policy that does not record
     * what the view shows): each lane is tried on a scratch canvas first. */
    if (n > 1) {
        canvas *probe = NULL;
        if (canvas_cells_new(&probe, 80, 24, 0) == 0) {
            int k = 0;
            for (int i = 0; i < n && k < PROBE_MAX_LANES; i++) {
                paint_result pr;
                canvas_clear(probe);
                if (vc->draw(probe, (canvas_rect){0, 0, 80, 24}, st[i], cur, &pr) == SKV_EMISSING) {
                    if (names && names[i] && gl < sizeof gone)
                        gl += (size_t)snprintf(gone + gl, sizeof gone - gl, "%s%s", gl ? ", " : "", names[i]);
                    continue;
                }
                keep_st[k] = st[i];
                keep_nm[k++] = names ? names[i] : NULL;
            }
            canvas_free(probe);
            skv_clear_error();
            if (k == 0) return vc->draw(c, r, st[0], cur, res); /* the first lane's reason */
            if (k < n) {
                st = keep_st;
                names = names ? keep_nm : NULL;
                n = k;
            }
        }
    }
    if (n <= 1 && !gone[0]) return vc->draw(c, r, st[0], cur, res);
    const canvas_geom *g = canvas_geometry(c);
    const canvas_theme *th = canvas_get_theme(c);
    double lh = g->cells ? 1 : canvas_line_height(c, CANVAS_FONT_BOLD);
    if (gone[0]) { /* a line under the panes names the policies with nothing to show here */
        char line[VIEW_LINE_MAX];
        double bh = g->cells ? 1 : canvas_line_height(c, CANVAS_FONT_BODY) + g->pad;
        snprintf(line, sizeof line, "not shown (nothing recorded for this view): %s", gone);
        view_fit_text(c, CANVAS_FONT_BODY, r.w - (g->cells ? 0 : 2 * g->pad), line);
        r.h -= bh;
        canvas_text(c, r.x + (g->cells ? 0 : g->pad), r.y + r.h + (g->cells ? 0 : g->pad / 2), line, CANVAS_FONT_BODY,
                    CANVAS_LEFT | CANVAS_TOP, th->fg);
    }
    double band = r.h / n;
    int rc_all = SKV_EMISSING;
    for (int i = 0; i < n; i++) {
        double y = r.y + i * band, h = (i + 1 == n ? r.y + r.h : r.y + (i + 1) * band) - y;
        if (g->cells) {
            y = floor(y);
            h = floor(r.y + (i + 1 == n ? r.h : (i + 1) * band)) - y;
        }
        char label[64];
        snprintf(label, sizeof label, "%s", names && names[i] && names[i][0] ? names[i] : "?");
        canvas_text(c, r.x + (g->cells ? 0 : g->pad), y, label, CANVAS_FONT_BOLD, CANVAS_LEFT | CANVAS_TOP, th->fg);
        canvas_rect br = {r.x, y + lh, r.w, h - lh};
        if (br.h < 1) continue;
        canvas_rect old = canvas_clip(c, br);
        paint_result pr;
        int rc = vc->draw(c, br, st[i], cur, i == 0 ? res : &pr);
        canvas_clip(c, old);
        if (rc == 0 || (rc < 0 && rc != SKV_EMISSING && rc_all == SKV_EMISSING)) rc_all = rc;
    }
    if (rc_all == SKV_EMISSING) skv_error(SKV_EMISSING, "no policy has data for the %s view yet", vc->name);
    return rc_all;
}
