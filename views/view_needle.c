/* view_needle.c: why a needle was missed, for the step the cursor shows.
 *
 * Top: a heatmap of the needle chunks' landmark ranks at the cursor's step,
 * one row per layer and one column per (KV head, needle chunk); rank 0 is
 * the best, the colour scale runs from 0 to twice the budget k so that k
 * sits in its middle, cells ranked at or past k (dropped) are outlined, and
 * cells left blank were kept dense (outlier or local window). Below: the
 * verdict of needle_diagnose (engine/needle.h), most decisive cause first;
 * the cursor's (layer, KV head) in numbers (each needle chunk's part,
 * landmark and exact rank, cos-min; the key error; the attention mass on the
 * needle exact, sparse and ideal; the output error); the first divergence
 * from dense; and what ShadowKV kept: the report `skv needle --explain`
 * prints, from probe data only. Text that does not fit ends in a line that
 * says how many lines are left and where to read them; a clean export (a
 * figure) keeps only the first cause under the heatmap.
 *
 * res holds the heatmap's layout, except legend (the verdict block) and
 * marker_x[i] (the top y of the line of cause i, n_markers of them).
 *
 * Keys: ←/→ previous/next decode step, ↑/↓ previous/next layer. A click on a
 * heatmap cell selects its layer, KV head and chunk; a click on a verdict
 * item jumps to the step, layer and head it names. */
#include "needle_diag.h"
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }


/* Lines text would take when wrapped at width w (at most max_lines); when
 * draw is set, draws them from y on. Words longer than a line are cut. */
static int wrap_text(canvas *c, const char *text, double x, double y, double w, double lh, int max_lines, int draw,
                     canvas_color col) {
    char line[512];
    int lines = 0;
    const char *p = text;
    while (*p && lines < max_lines) {
        while (*p == ' ') p++;
        size_t best = 0, n = 0;
        const char *q = p;
        while (q[n]) {
            size_t m = n;
            while (q[m] == ' ') m++;
            while (q[m] && q[m] != ' ') m++;
            if (m >= sizeof line) break;
            memcpy(line, q, m);
            line[m] = 0;
            if (canvas_text_width(c, line, CANVAS_FONT_BODY) > w) break;
            n = best = m;
        }
        if (!best) { /* one long word: take what fits */
            size_t m = 0;
            while (q[m] && m + 1 < sizeof line) {
                memcpy(line, q, m + 1);
                line[m + 1] = 0;
                if (canvas_text_width(c, line, CANVAS_FONT_BODY) > w) break;
                m++;
            }
            while (m > 0 && ((unsigned char)q[m] & 0xC0) == 0x80) m--;
            best = m ? m : 1;
        }
        memcpy(line, q, best);
        line[best] = 0;
        if (draw) canvas_text(c, x, y + lines * lh, line, CANVAS_FONT_BODY, CANVAS_LEFT | CANVAS_TOP, col);
        lines++;
        p = q + best;
    }
    return lines;
}

/* Takes the command-line hints out of a verdict line, for a figure: a
 * parenthesis that starts "(unchecked: " (how to check it) keeps only
 * "(unchecked)". */
static void strip_hints(char *s) {
    char *p;
    while ((p = strstr(s, "(unchecked: ")) != NULL) {
        char *q = strchr(p, ')');
        if (!q) { strcpy(p, "(unchecked)"); return; }
        memmove(p + strlen("(unchecked)"), q + 1, strlen(q + 1) + 1);
        memcpy(p, "(unchecked)", strlen("(unchecked)"));
    }
}

/* The cursor's (layer, head) at step s in one line. */
static void describe(char *buf, size_t n, const probe_store *st, const needle_report *rep, int s, int l, int h) {
    if (rep->generic) {
        const probe_ev_oracle *o = probe_store_oracle(st, s, l, h);
        if (!o) snprintf(buf, n, "layer %d head %d, step %d: no oracle data", l, h, s);
        else
            snprintf(buf, n, "layer %d head %d, step %d: %d of %d needle tokens attended by every query head; "
                     "exact rank %d; needle mass %.4f; %d tokens attended (mass recall %.1f%%, overlap %.1f%%); "
                     "output error %.3f", l, h, s, o->needle_kept, o->needle_len, o->needle_rank, o->needle_mass,
                     o->n_kept, 100 * o->recall, 100 * o->overlap, o->out_err);
        return;
    }
    const probe_ev_needle *e = probe_store_needle(st, rep->id, s, l, h), *pre = probe_store_needle(st, rep->id, -1, l, h);
    size_t k = 0;
#define ADD(...) do { if (k < n) k += (size_t)snprintf(buf + k, n - k, __VA_ARGS__); } while (0)
    ADD("layer %d head %d, step %d:", l, h, s);
    if (!e) {
        ADD(" no needle data");
        return;
    }
    for (int i = 0; i < e->n_chunks; i++) {
        int part = e->n_info ? e->part[i] : 0;
        ADD(" chunk %d", e->chunks[i]);
        if (part == 1) ADD(" outlier (dense)");
        else if (part == 2) ADD(" local window (dense)");
        else {
            ADD(" rank %d %s k=%d %s", e->rank[i], e->rank[i] < e->k ? "<" : ">=", e->k,
                e->selected[i] ? "selected" : "dropped");
            if (e->n_info && e->rank_exact[i] >= 0) ADD(", exact rank %d", e->rank_exact[i]);
        }
        if (pre && pre->n_info && i < pre->n_chunks && !isnan(pre->cos_min[i])) ADD(", cos-min %.3f", pre->cos_min[i]);
        ADD(";");
    }
    if (pre && pre->key_err >= 0) ADD(" key err %.3f;", pre->key_err);
    if (e->mass_exact >= 0)
        ADD(" needle mass exact %.4f sparse %.4f ideal %.4f; output error %.3f", e->mass_exact, e->mass_sparse,
            e->mass_ideal, e->out_err);
    else ADD(" sparse mass on the needle %.4f", e->mass_sparse);
#undef ADD
}

static int needle_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    needle_report *rep = malloc(sizeof *rep);
    if (!rep) return skv_error(SKV_ENOMEM, "needle view: out of memory");
    int rc = needle_diagnose(st, 0, rep);
    if (rc == SKV_EMISSING) {
        skv_clear_error();
        free(rep);
        return view_message(c, r, "Needle report",
                            "no needle data: record a run with skv needle --trace FILE and open that trace", res);
    }
    if (rc) { free(rep); return rc; }
    const canvas_geom *g = canvas_geometry(c);
    const canvas_theme *th = canvas_get_theme(c);
    const probe_ev_run *run = probe_store_run(st);
    int nl = rep->n_layers, nh = rep->n_heads, nw = rep->generic ? 1 : rep->n_chunks, nx = nh * nw;
    /* following the latest step (an export without --step): the step where the
     * answer diverged from dense, when it did */
    int step = cur->step < 0 && rep->diverge_step >= 0 && rep->diverge_step < probe_store_n_steps(st)
                   ? rep->diverge_step : view_step(st, cur);
    int layer = clampi(cur->layer, 0, nl > 0 ? nl - 1 : 0);
    int head = clampi(cur->head, 0, nh > 0 ? nh - 1 : 0);
    int run_chunk = run ? probe_pairs_int(run->kv_opts, "chunk", 0, 0, 1 << 20) : 0;
    int k = rep->k > 0 ? rep->k : run_chunk > 0 ? run->budget / run_chunk : 0;
    float *v = nl > 0 && nx > 0 ? malloc(sizeof(float) * (size_t)nl * nx) : NULL;
    paint_cellmark *marks = nl > 0 && nx > 0 ? malloc(sizeof *marks * (size_t)nl * nx) : NULL;
    char (*xl)[24] = nx > 0 ? malloc(sizeof *xl * (size_t)nx) : NULL;
    const char **xt = nx > 0 ? malloc(sizeof *xt * (size_t)nx) : NULL;
    char (*yl)[16] = nl > 0 ? malloc(sizeof *yl * (size_t)nl) : NULL;
    const char **yt = nl > 0 ? malloc(sizeof *yt * (size_t)nl) : NULL;
    if (nl > 0 && nx > 0 && (!v || !marks || !xl || !xt || !yl || !yt)) {
        rc = skv_error(SKV_ENOMEM, "needle view: out of memory");
        goto done;
    }
    int n_marks = 0;
    for (int x = 0; x < nx; x++) {
        if (rep->generic) snprintf(xl[x], sizeof xl[x], "h%d", x);
        else snprintf(xl[x], sizeof xl[x], nw > 1 ? "h%d c%d" : "h%d", x / nw, rep->first_chunk + x % nw);
        xt[x] = xl[x];
    }
    for (int l = 0; l < nl; l++) {
        snprintf(yl[l], sizeof yl[l], "%d", l);
        yt[l] = yl[l];
        for (int x = 0; x < nx && rep->generic; x++) {
            const probe_ev_oracle *o = probe_store_oracle(st, step, l, x);
            v[(size_t)l * nx + x] = o && o->needle_len > 0 ? (float)o->needle_rank : NAN;
            if (o && o->needle_len > 0 && o->needle_kept < o->needle_len && n_marks < nl * nx)
                marks[n_marks++] = (paint_cellmark){x, l};
        }
        for (int x = 0; x < nx && !rep->generic; x++) {
            const probe_ev_needle *e = probe_store_needle(st, rep->id, step, l, x / nw);
            int i = x % nw;
            float val = NAN;
            if (e && i < e->n_chunks && !(e->n_info && e->part[i] != 0) && e->rank[i] >= 0) {
                val = (float)e->rank[i];
                if ((e->n_info ? !e->selected[i] : e->rank[i] >= k) && n_marks < nl * nx) marks[n_marks++] = (paint_cellmark){ x, l };
            }
            v[(size_t)l * nx + x] = val;
        }
    }

    /* Text under the heatmap: cursor line, divergence, verdict, kept. */
    double lh = g->cells ? 1 : canvas_line_height(c, CANVAS_FONT_BODY);
    double tx = r.x + (g->cells ? 0 : g->pad), tw = r.w - (g->cells ? 0 : 2 * g->pad);
    char cur_line[1024], verdict[NEEDLE_N_CAUSES + 1][720];
    describe(cur_line, sizeof cur_line, st, rep, step, layer, head);
    int nv = rep->n_causes;
    /* no answer yet (step 0 of a live run, an answer half written) or none
     * known: what the policy did with the needle so far, and no fix for a
     * miss that has not happened */
    int open = cur->unfinished && rep->sparse_hit == 0 && probe_store_n_niah(st) == 0 && rep->value[0];
    int no_answer = rep->pending || rep->sparse_hit < 0 || open, off = 0;
    if (no_answer) {
        snprintf(verdict[0], sizeof verdict[0], rep->pending || open
                     ? "No verdict until the answer is written (step further); the needle so far:"
                     : "No verdict: whether it retrieved the needle is unknown; the needle so far:");
        off = 1;
        if (nv > NEEDLE_N_CAUSES) nv = NEEDLE_N_CAUSES;
    }
    for (int i = 0; i < nv; i++) {
        if (no_answer)
            snprintf(verdict[off + i], sizeof verdict[0], "- %s: %s", needle_cause_name(rep->causes[i].kind),
                     rep->causes[i].evidence);
        else if (rep->sparse_hit > 0) /* a hit: margins, what would break first, not failures */
            snprintf(verdict[i], sizeof verdict[i], "margin %d. %s: %s", i + 1, needle_cause_name(rep->causes[i].kind),
                     rep->causes[i].evidence);
        else {
            char line[1200];
            needle_cause_text(rep, &rep->causes[i], line, sizeof line);
            snprintf(verdict[i], sizeof verdict[i], "%d. %.700s", i + 1, line);
        }
    }
    nv += off;
    if (nv == off)
        snprintf(verdict[nv++], sizeof verdict[0], no_answer ? "- nothing near a threshold yet"
                 : rep->sparse_hit > 0 ? "no margin near its threshold"
                                       : "no cause passed its threshold (see the divergence)");
    /* A figure (a clean export) is mostly the heatmap with every verdict under it; the terminal
     * gives the text up to half the view; what does not fit ends in a "more" line, never cut silently. */
    int figure = !g->cells && cur->clean;
    if (figure) /* a figure holds findings, not the command lines to check them */
        for (int i = 0; i < nv; i++) strip_hints(verdict[i]);
    char title[600], headline[400], head_text[400] = "";
    if (open) /* not a miss yet: the run goes on */
        snprintf(headline, sizeof headline, "%s has answered \"%s\" so far, the value is %s (step further)",
                 rep->policy, rep->sparse_answer, rep->value);
    else needle_headline(rep, headline, sizeof headline);
    char *agree = strstr(headline, " (top-1 agreement");
    if (agree && (g->cells || canvas_text_width(c, headline, CANVAS_FONT_TITLE) > 0.6 * r.w)) *agree = 0; /* room */
    if (rep->generic && g->cells)
        snprintf(title, sizeof title, "Needle, step %d: %s (outlined: not attended)", step, headline);
    else if (rep->generic)
        snprintf(title, sizeof title, "Needle's exact-attention rank at step %d: %s", step, headline);
    else if (g->cells)
        snprintf(title, sizeof title, "Needle, step %d (k = %d): %s", step, k, headline);
    else
        snprintf(title, sizeof title, "Needle ranks at step %d (k = %d): %s", step, k, headline);
    if (g->cells) view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    else if (canvas_text_width(c, title, CANVAS_FONT_TITLE) > r.w) {
        /* too wide for one line: the title names the chart, the outcome opens the text under it */
        if (rep->generic) snprintf(title, sizeof title, "Needle's exact-attention rank at step %d", step);
        else snprintf(title, sizeof title, "Needle ranks at step %d (k = %d)", step, k);
        snprintf(head_text, sizeof head_text, "%s", headline);
    }
    int max_text = (int)floor((r.h * (g->cells ? 0.5 : figure ? 0.4 : 0.45)) / lh);
    int want = 0, big = 1000;
    if (tw > 0) {
        if (head_text[0]) want += wrap_text(c, head_text, tx, 0, tw, lh, big, 0, th->fg);
        for (int i = 0; i < nv; i++) want += wrap_text(c, verdict[i], tx, 0, tw, lh, big, 0, th->fg);
        if (!figure) {
            want += wrap_text(c, cur_line, tx, 0, tw, lh, big, 0, th->fg);
            want += wrap_text(c, rep->divergence, tx, 0, tw, lh, big, 0, th->fg);
            want += wrap_text(c, rep->kept, tx, 0, tw, lh, big, 0, th->fg);
        }
    }
    int text_lines = want < max_text ? want : max_text;
    if (text_lines < 0) text_lines = 0;
    int more = want > text_lines && text_lines > 0 ? want - (text_lines - 1) : 0; /* lines the "more" line stands for */
    canvas_rect hr = { r.x, r.y, r.w, r.h - text_lines * lh - (text_lines && !g->cells ? g->pad : 0) };
    /* the scale stops at 2k so that k sits in its middle: its top colour is every rank from 2k on */
    char vlabel[64];
    if (k > 0) snprintf(vlabel, sizeof vlabel, g->cells ? "rank (top: >=%d)" : "landmark rank (top colour: %d or more)", 2 * k);
    else snprintf(vlabel, sizeof vlabel, "landmark rank");
    paint_heatmap hm = {
        .title = title, .v = v, .nx = nx, .ny = nl,
        .x = { .label = g->cells ? NULL : rep->generic ? "KV head" : "KV head, needle chunk" }, .y = { .label = "layer" },
        .xticks = xt, .yticks = yt,
        .value = { .label = rep->generic ? "exact rank of the needle" : vlabel, .min = 0,
                   .max = rep->generic ? 0 : k > 0 ? 2.0 * k : 0, .integer = 1 },
        .marks = marks, .n_marks = n_marks,
        .mark_label = g->cells ? "dropped" : rep->generic ? "needle not fully attended"
                                                          : "dropped (rank >= k); blank: kept dense",
        .annotate = "%.0f",
    };
    paint_result hres;
    rc = paint_draw_heatmap(c, hr, &hm, &hres);
    if (rc) goto done;
    hres.n_markers = 0;
    for (int i = 0; i < PAINT_MAX_MARKERS; i++) hres.marker_x[i] = NAN;
    hres.legend = (canvas_rect){ tx, r.y + r.h, tw > 0 ? tw : 0, 0 };
    if (text_lines > 0 && tw > 0) {
        canvas_rect old = canvas_clip(c, r);
        double y = r.y + r.h - text_lines * lh;
        int left = text_lines - (more ? 1 : 0), used;
        if (head_text[0] && left > 0) { /* the outcome, when the title had no room for it */
            used = wrap_text(c, head_text, tx, y, tw, lh, left, 1, th->fg);
            y += used * lh; left -= used;
        }
        hres.legend = (canvas_rect){ tx, y, tw, 0 };
        for (int i = 0; i < nv && left > 0; i++) {
            if (i >= off && i - off < PAINT_MAX_MARKERS) { hres.marker_x[i - off] = y; hres.n_markers = i - off + 1; }
            used = wrap_text(c, verdict[i], tx, y, tw, lh, left, 1, th->fg);
            y += used * lh; left -= used;
        }
        hres.legend.h = y - hres.legend.y;
        if (!figure) {
            used = wrap_text(c, cur_line, tx, y, tw, lh, left, 1, th->fg);
            y += used * lh; left -= used;
            used = wrap_text(c, rep->divergence, tx, y, tw, lh, left, 1, th->muted);
            y += used * lh; left -= used;
            used = wrap_text(c, rep->kept, tx, y, tw, lh, left, 1, th->muted);
            y += used * lh;
        }
        if (more) { /* the rest is one command away */
            char m[160];
            snprintf(m, sizeof m, figure ? "%s %d more line%s of the diagnosis not shown"
                                         : "%s %d more line%s (a taller window; or skv needle --diagnose TRACE)",
                     g->ascii ? "v" : "\xe2\x96\xbc", more, more == 1 ? "" : "s");
            y = r.y + r.h - lh;
            wrap_text(c, m, tx, y, tw, lh, 1, 1, th->highlight);
        }
        canvas_clip(c, old);
    }
    if (res) *res = hres;
done:
    free(v); free(marks); free(xl); free(xt); free(yl); free(yt);
    free(rep);
    return rc;
}

static int needle_click(view_cursor *cur, const probe_store *st, const paint_result *res, double x, double y) {
    const probe_ev_needle *info = probe_store_needle_info(st, 0);
    if (!info || info->n_chunks < 1) return 0; /* generic reports: keys move the cursor */
    const canvas_rect *a = &res->area, *vb = &res->legend;
    view_cursor old = *cur;
    if (a->w > 0 && a->h > 0 && x >= a->x && x < a->x + a->w && y >= a->y && y < a->y + a->h) {
        int nl = probe_store_n_layers(st), nx = probe_store_n_kv_heads(st) * info->n_chunks;
        int col = clampi((int)floor((x - a->x) / a->w * nx), 0, nx - 1);
        cur->layer = clampi((int)floor((y - a->y) / a->h * nl), 0, nl - 1);
        cur->head = col / info->n_chunks;
        cur->chunk = info->chunks[col % info->n_chunks];
    } else if (vb->w > 0 && vb->h > 0 && x >= vb->x && x < vb->x + vb->w && y >= vb->y && y < vb->y + vb->h) {
        int item = -1;
        for (int i = 0; i < res->n_markers && i < PAINT_MAX_MARKERS; i++)
            if (y >= res->marker_x[i]) item = i;
        needle_report *rep = item >= 0 ? malloc(sizeof *rep) : NULL;
        if (!rep || needle_diagnose(st, 0, rep) || item >= rep->n_causes) {
            free(rep);
            return 0;
        }
        const needle_cause *cs = &rep->causes[item];
        if (cs->step >= 0) cur->step = cs->step;
        if (cs->layer >= 0) cur->layer = cs->layer;
        if (cs->head >= 0) cur->head = cs->head;
        if (cs->chunk >= 0) cur->chunk = cs->chunk;
        free(rep);
    } else {
        return 0;
    }
    int changed = memcmp(&old, cur, sizeof old) != 0;
    return VIEW_HANDLED | (changed ? VIEW_REDRAW : 0);
}

const view_class view_needle = {
    .name = "needle",
    .title = "Needle",
    .help = "why a needle was missed: needle chunk ranks per layer and KV head vs the budget, and the verdict "
            "(skv needle --trace)",
    .draw = needle_draw,
    .move = view_move_layer_step,
    .click = needle_click,
    .needs = PROBE_NEEDLE,
};
