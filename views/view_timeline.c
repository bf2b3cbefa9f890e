/* view_timeline.c: where the time of one step went, per stream.
 *
 * A Gantt chart of the timing spans of the current decode step (the
 * prefill when the run has no decode steps yet): one row per stream
 * (compute, fetch, rebuild: the two CUDA streams of ShadowKV plus
 * compute), one bar per span coloured by its operation, x in milliseconds
 * from the step's first span. Spans nest (a layer's "attention" encloses
 * its select / sparse_attn), so bars are drawn longest first and the inner
 * ones stay visible on top. Bars wide enough carry their layer ("L3"); the
 * cursor's layer is outlined.
 *
 * Known operations keep one colour in every step; others take the palette
 * colours left over, in order of appearance.
 *
 * Keys: ←/→ previous/next decode step (→ past the last follows the latest);
 * ↑/↓ previous/next layer. A click on a bar selects that bar's layer. */
#include "skv.h"
#include "lanes.h"
#include "view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TL_MAX_OPS 32       /* distinct operation names shown in one step */




/* Fixed colours (palette_cat index, or -1 for grey) of the operations the
 * engine emits, so that a colour means the same thing in every step. */
static const struct { const char *op; int cat; } known_ops[] = {
    { "sparse_attn", 0 }, { "select", 1 }, { "rebuild_k", 2 }, { "fetch_v", 3 }, { "attention", 4 },
    { "qkv", 5 }, { "logits", 6 }, { "mlp", 7 },
    /* prefill: none of the decode-only ones above appear there */
    { "svd", 0 }, { "landmarks", 1 }, { "cosmin", 2 }, { "outliers", 3 }, { "offload", -1 },
};

typedef struct tl_ops {
    int n;
    const char *name[TL_MAX_OPS];
    canvas_color color[TL_MAX_OPS];
} tl_ops;

/* The index of op in ops, adding it (with its colour) when new; -1 when full. */
static int op_index(tl_ops *ops, const char *op) {
    for (int i = 0; i < ops->n; i++)
        if (!strcmp(ops->name[i], op)) return i;
    if (ops->n >= TL_MAX_OPS) return -1;
    int k = ops->n++;
    ops->name[k] = op;
    ops->color[k] = CANVAS_NONE;
    for (size_t i = 0; i < sizeof known_ops / sizeof known_ops[0]; i++)
        if (!strcmp(known_ops[i].op, op))
            ops->color[k] = known_ops[i].cat < 0 ? CANVAS_RGB(0x99, 0x99, 0x99) : palette_cat(known_ops[i].cat);
    return k;
}

/* Unknown operations get the palette colours no operation of this step uses. */
static void fill_colors(tl_ops *ops) {
    for (int k = 0; k < ops->n; k++) {
        if (ops->color[k] != CANVAS_NONE) continue;
        canvas_color pick = CANVAS_RGB(0x77, 0x77, 0x77);
        for (int p = 0; p < PALETTE_CAT_N; p++) {
            int used = 0;
            for (int j = 0; j < ops->n; j++) used |= ops->color[j] == palette_cat(p);
            if (!used) { pick = palette_cat(p); break; }
        }
        ops->color[k] = pick;
    }
}

/* Sorts bars longest first, so that nested spans are painted over their parents. */
static int bar_cmp(const void *a, const void *b) {
    const paint_bar *x = a, *y = b;
    double dx = x->t1 - x->t0, dy = y->t1 - y->t0;
    if (dx != dy) return dx > dy ? -1 : 1;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

/* A time in ms with three significant digits, and no exponent: "16.3", "1205". */
static void ms_text(double ms, char *buf, size_t n) {
    snprintf(buf, n, "%.*f", ms >= 100 ? 0 : ms >= 10 ? 1 : ms >= 1 ? 2 : 3, ms);
}

/* The step shown: the cursor's, or the prefill (-1) when no decode step has spans. */
static int shown_step(const probe_store *st, const view_cursor *cur) {
    int s = view_step(st, cur), n;
    if (s >= 0 && probe_store_spans(st, s, &n) && n > 0) return s;
    return -1;
}

/* Totals of one operation on one stream over the step: ms is the spans'
 * whole time, self_ms the part not inside a span nested in them. */
typedef struct tl_total { int op, stream, count; double ms, self_ms; } tl_total;

static int iv_cmp(const void *a, const void *b) {
    const double *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* The length of the union of n intervals (t0, t1) pairs in iv (sorted here). */
static double union_len(double (*iv)[2], int n) {
    qsort(iv, (size_t)n, sizeof *iv, iv_cmp);
    double len = 0, a = 0, b = -INFINITY;
    for (int k = 0; k < n; k++) {
        if (iv[k][0] > b) {
            if (b > a) len += b - a;
            a = iv[k][0];
            b = iv[k][1];
        } else if (iv[k][1] > b) b = iv[k][1];
    }
    if (b > a) len += b - a;
    return len;
}

/* Span i's own time, in seconds: its length less the time covered by the
 * spans of its stream nested in it (an attention's select and sparse_attn),
 * so that a stream's own times add up to the time it was busy. scratch
 * holds n intervals. */
static double span_self(const probe_ev_span *sp, int n, int i, double (*scratch)[2]) {
    int m = 0;
    double d = sp[i].t1 - sp[i].t0;
    for (int j = 0; j < n; j++) {
        if (j == i || sp[j].stream != sp[i].stream || sp[j].t0 < sp[i].t0 || sp[j].t1 > sp[i].t1) continue;
        double dj = sp[j].t1 - sp[j].t0;
        if (dj < d || (dj == d && j > i)) { scratch[m][0] = sp[j].t0; scratch[m][1] = sp[j].t1; m++; }
    }
    return d - union_len(scratch, m);
}

/* The share of the step (seconds) each stream was busy: the union of its spans. */
static void stream_busy(const probe_ev_span *sp, int n, double (*scratch)[2], double busy[PROBE_STREAM_COUNT]) {
    for (int s = 0; s < PROBE_STREAM_COUNT; s++) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (sp[i].stream == s) { scratch[m][0] = sp[i].t0; scratch[m][1] = sp[i].t1; m++; }
        busy[s] = union_len(scratch, m);
    }
}

static int total_cmp(const void *a, const void *b) {
    const tl_total *x = a, *y = b;
    if (x->ms != y->ms) return x->ms > y->ms ? -1 : 1;
    return x->op != y->op ? x->op - y->op : x->stream - y->stream;
}

/* A table of the time per operation and stream under the chart: the
 * question after "what overlaps" is "what costs the most". Its "self %"
 * column leaves out nested spans, so a stream's rows add up to the share of
 * the step it was busy; a line under the table gives those shares, which
 * together pass 100 % when the streams run side by side. */
static int draw_totals(canvas *c, canvas_rect r, const tl_ops *ops, const probe_ev_span *sp, int n, double step_ms) {
    const canvas_geom *g = canvas_geometry(c);
    tl_total *t = calloc((size_t)n, sizeof *t);
    char (*txt)[6][32] = calloc((size_t)n, sizeof *txt);
    const char **cells = calloc((size_t)n * 6, sizeof *cells);
    double (*scratch)[2] = calloc((size_t)n, sizeof *scratch);
    int rc = SKV_OK, nt = 0;
    if (!t || !txt || !cells || !scratch) { rc = skv_error(SKV_ENOMEM, "timeline view: out of memory"); goto done; }
    for (int i = 0; i < n; i++) {
        if (sp[i].stream < 0 || sp[i].stream >= PROBE_STREAM_COUNT) continue;
        int op = -1;
        for (int k = 0; k < ops->n; k++)
            if (!strcmp(ops->name[k], sp[i].op ? sp[i].op : "")) op = k;
        int j = 0;
        while (j < nt && (t[j].op != op || t[j].stream != sp[i].stream)) j++;
        if (j == nt) t[nt++] = (tl_total){ op, sp[i].stream, 0, 0, 0 };
        t[j].count++;
        t[j].ms += (sp[i].t1 - sp[i].t0) * 1e3;
        t[j].self_ms += span_self(sp, n, i, scratch) * 1e3;
    }
    double busy[PROBE_STREAM_COUNT];
    stream_busy(sp, n, scratch, busy);
    qsort(t, (size_t)nt, sizeof *t, total_cmp);
    for (int j = 0; j < nt; j++) {
        snprintf(txt[j][0], 32, "%s", t[j].op >= 0 ? ops->name[t[j].op] : "?");
        snprintf(txt[j][1], 32, "%s", probe_stream_name(t[j].stream));
        snprintf(txt[j][2], 32, "%d", t[j].count);
        snprintf(txt[j][3], 32, "%.4g", t[j].ms);
        snprintf(txt[j][4], 32, "%.1f", step_ms > 0 ? 100 * t[j].self_ms / step_ms : 0.0);
        snprintf(txt[j][5], 32, "%.3g", t[j].ms / t[j].count);
        for (int k = 0; k < 6; k++) cells[j * 6 + k] = txt[j][k];
    }
    static const paint_column cols[6] = {
        { "operation", PAINT_ALIGN_LEFT }, { "stream", PAINT_ALIGN_LEFT }, { "spans", PAINT_ALIGN_RIGHT },
        { "total ms", PAINT_ALIGN_RIGHT }, { "self %", PAINT_ALIGN_RIGHT }, { "ms per span", PAINT_ALIGN_RIGHT },
    };
    /* the line under the table: each stream's busy share of the step */
    char note[320] = "";
    int streams = 0;
    for (int k = 0; k < PROBE_STREAM_COUNT; k++) streams += busy[k] > 0;
    if (streams > 1 && step_ms > 0) {
        char shares[160] = "";
        for (int k = 0, len = 0; k < PROBE_STREAM_COUNT; k++)
            if (busy[k] > 0 && len < (int)sizeof shares)
                len += snprintf(shares + len, sizeof shares - (size_t)len, "%s%s %.1f%%", len ? ", " : "",
                                probe_stream_name(k), 100 * busy[k] * 1e3 / step_ms);
        const char *forms[3] = {
            ("self %%: the time not inside a nested span. Each stream's rows add up to its busy share of the step "
             "(%s); the streams overlap, fetch and rebuild running beside compute"),
            "self %% leaves out nested spans; busy: %s (the streams overlap)",
            "streams overlap, busy: %s" };
        for (int f = 0; f < 3; f++) {
            snprintf(note, sizeof note, forms[f], shares);
            if (canvas_text_width(c, note, CANVAS_FONT_SMALL) <= r.w) break;
        }
        view_fit_text(c, CANVAS_FONT_SMALL, r.w, note);
    }
    double note_h = note[0] ? (g->cells ? 1 : canvas_line_height(c, CANVAS_FONT_SMALL) + g->pad) : 0;
    if (note_h) r.h -= note_h;
    paint_table tab = { .cols = cols, .n_cols = 6, .cells = cells, .n_rows = nt };
    paint_result pr;
    rc = paint_draw_table(c, r, &tab, &pr);
    char more[96];
    if (!rc && pr.shown < nt) { /* rows cut for height: say so above the table */
        canvas_fill_rect(c, r.x, r.y, r.w, r.h, canvas_get_theme(c)->bg);
        tab.title = more;
        for (int pass = 0; pass < 2 && !rc; pass++) {
            snprintf(more, sizeof more, "%d of %d operations shown (longest first); a taller window shows the rest",
                     pass ? pr.shown : nt - 1, nt);
            canvas_fill_rect(c, r.x, r.y, r.w, r.h, canvas_get_theme(c)->bg);
            rc = paint_draw_table(c, r, &tab, &pr);
        }
    }
    double dx = floor((r.x + r.w - (pr.area.x + pr.area.w)) / 2);
    if (tab.title) /* the "N of M shown" line, wider than the table, stays whole */
        dx = fmin(dx, floor(r.w - canvas_text_width(c, tab.title, CANVAS_FONT_TITLE)));
    if (!rc && dx >= 1) { /* centre it: the table's width is known only once drawn */
        canvas_fill_rect(c, r.x, r.y, r.w, r.h, canvas_get_theme(c)->bg);
        rc = paint_draw_table(c, (canvas_rect){ r.x + dx, r.y, r.w - dx, r.h }, &tab, &pr);
    }
    if (!rc && note[0] && pr.shown > 0) {
        double tw = canvas_text_width(c, note, CANVAS_FONT_SMALL);
        canvas_text(c, g->cells ? r.x + floor((r.w - tw) / 2) : r.x + r.w / 2,
                    pr.area.y + pr.area.h + (g->cells ? 0 : g->pad), note, CANVAS_FONT_SMALL,
                    (g->cells ? CANVAS_LEFT : CANVAS_CENTER) | CANVAS_TOP, canvas_get_theme(c)->muted);
    }
done:
    free(t);
    free(txt);
    free(cells);
    free(scratch);
    return rc;
}

/* The value fetches of a decode step: bytes moved (from the policy's
 * decode-head events), time on the fetch stream, and the part of that time
 * a key rebuild of the same layer ran beside it. */
typedef struct tl_fetch { double bytes, seconds, beside; } tl_fetch;

/* The value bytes layer fetched at step (every KV head's decode-head events). */
static double layer_fetch_bytes(const probe_store *st, int step, int layer) {
    double bytes = 0;
    for (int h = 0; step >= 0 && h < probe_store_n_kv_heads(st); h++) {
        const probe_ev_decode_head *d = probe_store_decode(st, step, layer, h);
        if (d) bytes += (double)d->fetch_bytes;
    }
    return bytes;
}

static tl_fetch fetch_summary(const probe_store *st, int step, const probe_ev_span *sp, int n) {
    tl_fetch f = { 0, 0, 0 };
    if (step < 0) return f;
    for (int l = 0; l < probe_store_n_layers(st); l++) f.bytes += layer_fetch_bytes(st, step, l);
    for (int i = 0; i < n; i++) {
        if (sp[i].stream != PROBE_STREAM_FETCH || !sp[i].op || strcmp(sp[i].op, "fetch_v")) continue;
        f.seconds += sp[i].t1 - sp[i].t0;
        for (int j = 0; j < n; j++) {
            if (sp[j].stream != PROBE_STREAM_REBUILD || sp[j].layer != sp[i].layer) continue;
            double a = fmax(sp[i].t0, sp[j].t0), b = fmin(sp[i].t1, sp[j].t1);
            if (b > a) f.beside += b - a;
        }
    }
    return f;
}

/* The host-to-device limits a fetch on a GPU is held against, measured on
 * the lent H100 (../shared/GPU.md): a copy from pinned memory, and the
 * zero-copy gather (a warp per chunk) ShadowKV's fetch is. */
#define GPU_H2D_PINNED_GBS 53.6
#define GPU_GATHER_GBS 48.0

/* 1 when the oracle's exact attention ran inside the step's timed spans
 * (its dense twin's step, or its scores, recorded for the step). */
static int timed_with_oracle(const probe_store *st, int step) {
    const probe_ev_step *se = probe_store_step(st, step >= 0 ? step : 0);
    return (se && se->has_oracle) || probe_store_oracle(st, step >= 0 ? step : 0, 0, 0) != NULL;
}

/* A bar's layer is kept beside it (paint_bar has no room for it). */
typedef struct tl_bar { paint_bar b; int layer; } tl_bar;

/* The rate of a value-fetch bar: its layer's bytes fetched at the step
 * over the bar's time; 0 unknown. */
static double fetch_gbs(const probe_store *st, int step, const tl_bar *b) {
    double bytes = layer_fetch_bytes(st, step, b->layer), secs = (b->b.t1 - b->b.t0) * 1e-3;
    return bytes > 0 && secs > 0 ? bytes / secs / 1e9 : 0;
}

static int tl_bar_cmp(const void *a, const void *b) { return bar_cmp(&((const tl_bar *)a)->b, &((const tl_bar *)b)->b); }

static int timeline_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const canvas_geom *g = canvas_geometry(c);
    const canvas_theme *th = canvas_get_theme(c);
    int step = shown_step(st, cur), n;
    const probe_ev_span *sp = probe_store_spans(st, step, &n);
    if (!sp || n <= 0)
        return view_message(c, r, "Timeline", "no timing spans: record the run with --trace (or inspect it live)", res);
    double t0 = INFINITY, t1 = -INFINITY;
    for (int i = 0; i < n; i++) { t0 = fmin(t0, sp[i].t0); t1 = fmax(t1, sp[i].t1); }

    tl_ops ops = { 0 };
    tl_bar *tb = malloc((size_t)n * sizeof *tb);
    paint_bar *bars = malloc((size_t)n * sizeof *bars);
    int rc = SKV_OK, nb = 0;
    if (!tb || !bars) { rc = skv_error(SKV_ENOMEM, "timeline view: out of memory"); goto done; }
    for (int i = 0; i < n; i++) {
        if (sp[i].stream < 0 || sp[i].stream >= PROBE_STREAM_COUNT) continue;
        int k = op_index(&ops, sp[i].op ? sp[i].op : "");
        tb[nb++] = (tl_bar){ { sp[i].stream, k, (sp[i].t0 - t0) * 1e3, (sp[i].t1 - t0) * 1e3 }, sp[i].layer };
    }
    fill_colors(&ops);
    qsort(tb, (size_t)nb, sizeof *tb, tl_bar_cmp);
    for (int i = 0; i < nb; i++) bars[i] = tb[i].b;
    paint_category cats[TL_MAX_OPS];
    for (int k = 0; k < ops.n; k++) cats[k] = (paint_category){ ops.name[k], ops.color[k], NULL };
    const char *rows[PROBE_STREAM_COUNT];
    for (int s = 0; s < PROBE_STREAM_COUNT; s++) rows[s] = probe_stream_name(s);

    char title[200];
    int layer = cur->layer;
    double total = (t1 - t0) * 1e3;
    char tms[32];
    ms_text(total, tms, sizeof tms);
    if (step < 0)
        snprintf(title, sizeof title,
                 g->cells ? "Timeline, prefill: %s ms" : "Stream timeline of the prefill: %s ms, %d spans", tms, n);
    else
        snprintf(title, sizeof title,
                 g->cells ? "Timeline, step %d: %s ms" : "Stream timeline of decode step %d: %s ms, %d spans", step,
                 tms, n);
    if (timed_with_oracle(st, step)) {
        size_t tl = strlen(title);
        snprintf(title + tl, sizeof title - tl, ", times include the oracle");
    }
    view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    paint_gantt gt = {
        .title = title, .rows = rows, .n_rows = PROBE_STREAM_COUNT, .ops = cats, .n_ops = ops.n,
        .bars = bars, .n_bars = nb,
        .t = { .label = g->cells ? "time" : "time from the step's first span", .unit = "ms",
},
    };
    paint_result local, *pr = res ? res : &local;
    /* the chart leaves room under it for the totals table, one row per
     * (operation, stream), and the fetch line: the table is what answers
     * "what costs the most", so the chart gives way down to about a third
     * of the view (half on a terminal) */
    int pairs = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = sp[j].stream == sp[i].stream && !strcmp(sp[j].op ? sp[j].op : "", sp[i].op ? sp[i].op : "");
        pairs += !seen;
    }
    double lhb = canvas_line_height(c, CANVAS_FONT_BODY);
    double reserve = g->cells ? pairs + 7 : (pairs + 3) * 1.7 * lhb + 5 * lhb + 3 * g->em;
    canvas_rect rg = r;
    double floor_h = g->cells ? floor(r.h / 2) : 0.36 * r.h; /* the chart keeps at least this */
    rg.h = r.h - reserve > floor_h ? r.h - reserve : floor_h;
    if (rg.h < (g->cells ? 8 : 8 * lhb)) rg.h = r.h; /* too small for both: the chart alone */
    rc = paint_draw_gantt(c, rg, &gt, pr);
    if (rc || pr->shown <= 0 || pr->area.w <= 0) goto done;

    /* layer labels in the bars that have room and enclose no other bar; the cursor's layer outlined */
    canvas_rect old = canvas_clip(c, pr->area);
    double row_h = pr->area.h / pr->shown;
    for (int i = 0; i < nb; i++) {
        const tl_bar *b = &tb[i];
        if (b->b.row >= pr->shown) continue;
        double x0 = paint_map_x(pr, b->b.t0), x1 = paint_map_x(pr, b->b.t1), y = pr->area.y + b->b.row * row_h;
        if (!isfinite(x0) || !isfinite(x1)) continue;
        if (b->layer == layer && b->layer >= 0 && !g->cells && x1 - x0 >= 3 * g->hair) {
            double inset = round(row_h * 0.16);
            canvas_color oc = th->fg;
            canvas_rule(c, x0, y + inset, x1, y + inset, oc, 0);
            canvas_rule(c, x0, y + row_h - inset, x1, y + row_h - inset, oc, 0);
            canvas_rule(c, x0, y + inset, x0, y + row_h - inset, oc, 0);
            canvas_rule(c, x1, y + inset, x1, y + row_h - inset, oc, 0);
        }
        if (b->layer < 0) continue;
        int encloses = 0;
        for (int j = 0; j < nb && !encloses; j++)
            encloses = j != i && tb[j].b.row == b->b.row && tb[j].b.t0 >= b->b.t0 && tb[j].b.t1 <= b->b.t1 &&
                       tb[j].b.t1 - tb[j].b.t0 < b->b.t1 - b->b.t0;
        if (encloses) continue;
        char lab[40];
        snprintf(lab, sizeof lab, "L%d", b->layer);
        /* a value fetch: the rate it achieved (the layer's fetched bytes of the step over the bar's time) */
        double gbs = b->b.op >= 0 && !strcmp(ops.name[b->b.op], "fetch_v") ? fetch_gbs(st, step, b) : 0;
        double tw = canvas_text_width(c, lab, CANVAS_FONT_SMALL);
        if (gbs > 0) {
            char wide[40];
            snprintf(wide, sizeof wide, "L%d %.3g GB/s", b->layer, gbs);
            double ww = canvas_text_width(c, wide, CANVAS_FONT_SMALL);
            if (ww + (g->cells ? 0 : 2 * g->pad) <= x1 - x0) {
                snprintf(lab, sizeof lab, "%s", wide);
                tw = ww;
            }
        }
        if (tw + (g->cells ? 0 : 2 * g->pad) > x1 - x0) continue;
        canvas_color bc = b->b.op >= 0 ? ops.color[b->b.op] : th->muted;
        canvas_color ink = canvas_luma(bc) > 0.3 ? CANVAS_RGB(0, 0, 0) : CANVAS_RGB(0xff, 0xff, 0xff);
        double cx = g->cells ? floor((x0 + x1 - tw) / 2) : (x0 + x1) / 2;
        canvas_text(c, cx, g->cells ? y : y + row_h / 2, lab, CANVAS_FONT_SMALL,
                    (g->cells ? CANVAS_LEFT | CANVAS_TOP : CANVAS_CENTER | CANVAS_MIDDLE), ink);
    }
    canvas_clip(c, old);

    /* what is left under the chart (x tick labels and axis label) holds the totals */
    double lh_s = canvas_line_height(c, CANVAS_FONT_SMALL), lh_b = canvas_line_height(c, CANVAS_FONT_BODY);
    double used = pr->area.y + pr->area.h +
                  (g->cells ? 3 : g->hair + g->tick + 3 * g->pad + lh_s + lh_b + g->em);
    double left = r.y + r.h - used;
    tl_fetch fx = fetch_summary(st, step, sp, n);
    if (fx.bytes > 0 && fx.seconds > 0 && left >= (g->cells ? 6 : 9 * lh_b)) {
        char line[320];
        const probe_ev_run *run = probe_store_run(st);
        char lim[120] = "";
        if (run && run->backend && !strcmp(run->backend, "cuda"))
            snprintf(lim, sizeof lim, " (H100: %.3g GB/s pinned H2D, %.3g gathered)", GPU_H2D_PINNED_GBS,
                     GPU_GATHER_GBS);
        for (int form = 0; form < 2; form++) { /* the shorter wording when the long one does not fit */
            snprintf(line, sizeof line,
                     form ? "Fetched %.3g %s in %.3g ms (%.3g GB/s%s); key rebuild beside %.0f%% of it"
                          : "Fetched %.3g %s of values in %.3g ms (%.3g GB/s%s); a key rebuild ran beside %.0f%% of it",
                     fx.bytes >= 1048576 ? fx.bytes / 1048576 : fx.bytes / 1024, fx.bytes >= 1048576 ? "MiB" : "KiB",
                     fx.seconds * 1e3, fx.bytes / fx.seconds / 1e9, lim, 100 * fx.beside / fx.seconds);
            if (canvas_text_width(c, line, CANVAS_FONT_BODY) <= r.w) break;
        }
        view_fit_text(c, CANVAS_FONT_BODY, r.w, line);
        double tw = canvas_text_width(c, line, CANVAS_FONT_BODY);
        canvas_text(c, g->cells ? r.x + floor((r.w - tw) / 2) : r.x + r.w / 2, used, line, CANVAS_FONT_BODY,
                    (g->cells ? CANVAS_LEFT : CANVAS_CENTER) | CANVAS_TOP, th->fg);
        used += g->cells ? 2 : lh_b + g->em;
        left = r.y + r.h - used;
    }
    if (left >= (g->cells ? 5 : 8 * lh_b)) {
        rc = draw_totals(c, (canvas_rect){ r.x, used, r.w, left }, &ops, sp, n, total);
    }
done:
    free(tb);
    free(bars);
    return rc;
}

/* The innermost (shortest) span under the click on its stream's row gives the layer. */
static int timeline_click(view_cursor *cur, const probe_store *st, const paint_result *res, double x, double y) {
    const canvas_rect *a = &res->area;
    if (res->shown <= 0 || a->w <= 0 || a->h <= 0 || x < a->x || x > a->x + a->w || y < a->y || y >= a->y + a->h)
        return 0;
    int step = shown_step(st, cur), n;
    const probe_ev_span *sp = probe_store_spans(st, step, &n);
    if (!sp || n <= 0) return 0;
    double t0 = INFINITY;
    for (int i = 0; i < n; i++) t0 = fmin(t0, sp[i].t0);
    int row = (int)floor((y - a->y) / (a->h / res->shown));
    double t = (res->x0 + (x - a->x) / a->w * (res->x1 - res->x0)) / 1e3 + t0;
    double slack = (res->x1 - res->x0) / a->w / 1e3; /* one canvas unit, in seconds */
    int best = -1;
    for (int i = 0; i < n; i++)
        if (sp[i].stream == row && sp[i].layer >= 0 && t >= sp[i].t0 - slack && t <= sp[i].t1 + slack &&
            (best < 0 || sp[i].t1 - sp[i].t0 < sp[best].t1 - sp[best].t0))
            best = i;
    if (best < 0) return 0;
    if (sp[best].layer == cur->layer) return VIEW_HANDLED;
    cur->layer = sp[best].layer;
    return VIEW_HANDLED | VIEW_REDRAW;
}

/* 1 when no lane but first has an operation op at batch step bs: in a
 * batch, work done once for every sequence. */
static int batch_shared(const probe_store *const *st, int n, int first, int bs, const char *op) {
    for (int i = 0; i < n; i++) {
        int cnt;
        const probe_ev_span *sp = i == first ? NULL : probe_store_spans(st[i], bs, &cnt);
        for (int k = 0; sp && k < cnt; k++)
            if (!strcmp(sp[k].op ? sp[k].op : "", op ? op : "")) return 0;
    }
    return 1;
}

/* Compare mode: one chart, a row per (policy, stream) that has spans, on
 * one time axis with one legend, so that the policies' steps line up. A
 * batch's lanes ran one step together: their spans keep the one clock they
 * share (from the step's first span in any lane), so the chart is the
 * batched step: the shared matmuls on the "all seqs" row, between each
 * sequence's attention on its own rows. */
static int timeline_lanes(canvas *c, canvas_rect r, const probe_store *const *st, const char *const *names, int n,
                          const view_cursor *cur, paint_result *res) {
    /* one prefill, which every sequence of a batch shares */
    if (n <= 1 || (cur->batch && shown_step(st[0], cur) < 0)) return timeline_draw(c, r, st[0], cur, res);
    enum { MAX_ROWS = PROBE_MAX_LANES * PROBE_STREAM_COUNT };
    char row_name[MAX_ROWS][64];
    const char *rows[MAX_ROWS];
    int n_rows = 0, nb = 0, cap = 0, step = -1, shown = 0;
    double longest = 0, b0 = INFINITY, b1 = -INFINITY;
    tl_ops ops = { 0 };
    paint_bar *bars = NULL;
    int rc = SKV_OK;
    /* A batch's step: the latest any sequence shows. A sequence that has
     * ended (end of text) has no spans there and no rows. */
    int bs = -1, first = -1;
    for (int i = 0; cur->batch && i < n; i++) {
        int s = shown_step(st[i], cur);
        if (s > bs) bs = s;
    }
    for (int i = 0; cur->batch && i < n; i++) { /* the batched step's start and end */
        int cnt;
        const probe_ev_span *sp = probe_store_spans(st[i], bs, &cnt);
        if (sp && cnt > 0 && first < 0) first = i;
        for (int k = 0; sp && k < cnt; k++) { b0 = fmin(b0, sp[k].t0); b1 = fmax(b1, sp[k].t1); }
    }
    /* A batch's shared work (the matmuls of every sequence at once: qkv,
     * mlp, logits) is recorded in the first live sequence's lane (sequence
     * 0's until it ends); an operation no other sequence has is drawn on
     * rows of its own, "all seqs", above them. */
    int shared_rows = cur->batch && n > 1 && first >= 0;
    for (int pass = shared_rows ? 0 : 1; pass < 2 && rc == SKV_OK; pass++)
    for (int i = 0; i < n && rc == SKV_OK; i++) {
        if (pass == 0 && i != first) continue;
        int cnt, s = cur->batch ? bs : shown_step(st[i], cur);
        const probe_ev_span *sp = probe_store_spans(st[i], s, &cnt);
        if (!sp || cnt <= 0) continue;
        step = s;
        if (pass == 1) shown++;
        double t0 = INFINITY, t1 = -INFINITY;
        for (int k = 0; k < cnt; k++) { t0 = fmin(t0, sp[k].t0); t1 = fmax(t1, sp[k].t1); }
        if (cur->batch) { t0 = b0; t1 = b1; }
        longest = fmax(longest, (t1 - t0) * 1e3);
        for (int stream = 0; stream < PROBE_STREAM_COUNT && n_rows < MAX_ROWS; stream++) {
            int any = 0;
            for (int k = 0; k < cnt; k++) {
                if (sp[k].stream != stream) continue;
                if (shared_rows && i == first && batch_shared(st, n, first, bs, sp[k].op) != (pass == 0)) continue;
                if (nb == cap) {
                    cap = cap ? 2 * cap : 256;
                    paint_bar *nbars = realloc(bars, sizeof *bars * (size_t)cap);
                    if (!nbars) { rc = skv_error(SKV_ENOMEM, "timeline view: out of memory"); break; }
                    bars = nbars;
                }
                bars[nb++] = (paint_bar){ n_rows, op_index(&ops, sp[k].op ? sp[k].op : ""), (sp[k].t0 - t0) * 1e3,
                                          (sp[k].t1 - t0) * 1e3 };
                any = 1;
            }
            if (!any) continue;
            snprintf(row_name[n_rows], sizeof row_name[0], "%s %s",
                     pass == 0 ? "all seqs" : names && names[i] ? names[i] : "?", probe_stream_name(stream));
            rows[n_rows] = row_name[n_rows];
            n_rows++;
        }
    }
    if (rc == SKV_OK && !nb) {
        free(bars);
        return view_message(c, r, "Timeline", "no timing spans: record the run with --trace (or inspect it live)", res);
    }
    if (rc == SKV_OK) {
        fill_colors(&ops);
        qsort(bars, (size_t)nb, sizeof *bars, bar_cmp);
        paint_category cats[TL_MAX_OPS];
        for (int k = 0; k < ops.n; k++) cats[k] = (paint_category){ ops.name[k], ops.color[k], NULL };
        const canvas_geom *g = canvas_geometry(c);
        char title[200];
        const char *what = cur->batch ? "sequences" : "policies";
        char tms[32];
        ms_text(longest, tms, sizeof tms);
        int ended = 0; /* sequences that ended (end of text) before this step: no row */
        for (int i = 0; cur->batch && i < n; i++) ended += probe_store_n_steps(st[i]) <= bs;
        char ended_txt[32] = "";
        if (ended) snprintf(ended_txt, sizeof ended_txt, " (%d ended)", ended);
        if (cur->batch && !g->cells)
            snprintf(title, sizeof title, "Stream timelines of batched decode step %d, %d sequences in one step%s: %s ms",
                     step, shown, ended_txt, tms);
        else if (step < 0)
            snprintf(title, sizeof title, "Timelines of the prefill, %d %s: the longest %s ms", shown, what, tms);
        else if (g->cells && cur->batch)
            snprintf(title, sizeof title, "Timelines, batched step %d%s: %s ms", step, ended_txt, tms);
        else if (g->cells)
            snprintf(title, sizeof title, "Timelines, step %d: longest %s ms", step, tms);
        else
            snprintf(title, sizeof title, "Stream timelines of decode step %d, %d policies on one time axis: the "
                     "longest %s ms", step, shown, tms);
        int oracle = 0;
        for (int i = 0; i < n; i++) oracle |= timed_with_oracle(st[i], step);
        if (oracle) {
            size_t tl = strlen(title);
            snprintf(title + tl, sizeof title - tl, ", times include the oracle");
        }
        if (canvas_text_width(c, title, CANVAS_FONT_TITLE) > r.w && step >= 0) /* the shorter wording */
            snprintf(title, sizeof title, "Timelines of step %d, %d %s%s: %s %s ms%s", step, shown, what, ended_txt,
                     cur->batch ? "batched," : "longest", tms, oracle ? " (with the oracle)" : "");
        view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
        paint_gantt gt = {
            .title = title, .rows = rows, .n_rows = n_rows, .ops = cats, .n_ops = ops.n, .bars = bars, .n_bars = nb,
            .t = { .label = g->cells ? "time" : cur->batch ? "time from the batched step's first span"
                                                            : "time from each step's first span", .unit = "ms" },
        };
        paint_result local;
        rc = paint_draw_gantt(c, r, &gt, res ? res : &local);
    }
    free(bars);
    return rc;
}

const view_class view_timeline = {
    .name = "timeline",
    .title = "Timeline",
    .help = "Gantt chart of one step's timed spans per stream (compute, fetch, rebuild), in ms. Spans nest (attention "
            "holds select and sparse_attn): the table's \"total ms\" counts a span whole, \"self %\" only its time "
            "outside the spans nested in it, so a stream's rows add up to its busy share of the step, given under "
            "the table; the streams overlap (fetch and rebuild run beside compute), so together they can pass 100 %. "
            "A line under the chart gives the bytes the step fetched, their bandwidth, and how much of the fetch "
            "time a key rebuild ran beside it",
    .draw = timeline_draw,
    .draw_lanes = timeline_lanes,
    .move = view_move_layer_step,
    .click = timeline_click,
    .needs = PROBE_SPAN,
};
