/* view_compare.c: the compare summary: the policies of a compare run side
 * by side (skv run/inspect --kv a,b,...; one lane each).
 *
 * Per policy, from its lane's events: the oracle's mass recall, overlap
 * with the exact top-B and output error (means over every step, layer and
 * KV head; --oracle), KV bytes fetched per decode step, bytes resident at
 * the last step, decode time per step, and top-1 agreement with dense where
 * the run had the oracle. Per layer: which policy kept the most exact
 * attention mass and which had the smallest output error, among the
 * policies that selected there; a policy that attended the layer whole at
 * every step (Quest's and FreeKV's dense_layers, a budget covering the
 * context) is listed as dense, never crowned. A single run shows its one
 * policy. No keys. */
#include "skv.h"
#include "view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMP_MAX 8

typedef struct {
    double recall, overlap, err, mass;   /* means over the oracle events */
    int n_or;
    int n_dense;                         /* oracle events that attended every position (nothing selected) */
    double fetch, seconds;               /* per step */
    int n_steps, agree, compared;
    double resident;
} lane_sum;

static void summarise(const probe_store *st, int layer, lane_sum *o) {
    memset(o, 0, sizeof *o);
    int ns = probe_store_n_steps(st), nl = probe_store_n_layers(st), nh = probe_store_n_kv_heads(st);
    for (int s = 0; s < ns; s++) {
        for (int l = layer < 0 ? 0 : layer; l < (layer < 0 ? nl : layer + 1); l++)
            for (int h = 0; h < nh; h++) {
                const probe_ev_oracle *e = probe_store_oracle(st, s, l, h);
                if (!e) continue;
                o->recall += e->recall;
                o->overlap += e->overlap;
                o->err += e->out_err;
                o->mass += e->mass_kept;
                o->n_or++;
                o->n_dense += e->ctx > 0 && e->n_kept >= e->ctx;
            }
        const probe_ev_step *e = probe_store_step(st, s);
        if (!e) continue;
        o->n_steps++;
        o->fetch += (double)e->fetch_bytes;
        o->seconds += e->seconds;
        o->resident = (double)e->kv_resident;
        if (e->has_oracle) {
            o->compared++;
            o->agree += e->top1_agree != 0;
        }
    }
    if (o->n_or) {
        o->recall /= o->n_or;
        o->overlap /= o->n_or;
        o->err /= o->n_or;
        o->mass /= o->n_or;
    }
    if (o->n_steps) {
        o->fetch /= o->n_steps;
        o->seconds /= o->n_steps;
    }
}

/* Mass recall per decode step (the mean over layers and KV heads) of each
 * policy that the oracle scored, one line each. */
static int recall_plot(canvas *c, canvas_rect r, const probe_store *const *st, const char *const *names, int n) {
    paint_series s[CMP_MAX];
    double *buf[CMP_MAX] = {0};
    int ns = 0, rc = SKV_OK;
    for (int i = 0; i < n && rc == SKV_OK; i++) {
        int steps = probe_store_n_steps(st[i]), nl = probe_store_n_layers(st[i]), nh = probe_store_n_kv_heads(st[i]);
        if (steps <= 0) continue;
        double *y = malloc(sizeof *y * (size_t)steps);
        if (!y) { rc = skv_error(SKV_ENOMEM, "compare view: out of memory"); break; }
        int any = 0;
        for (int t = 0; t < steps; t++) {
            double sum = 0;
            int cnt = 0;
            for (int l = 0; l < nl; l++)
                for (int h = 0; h < nh; h++) {
                    const probe_ev_oracle *o = probe_store_oracle(st[i], t, l, h);
                    if (o && isfinite(o->recall)) { sum += o->recall; cnt++; }
                }
            y[t] = cnt ? 100 * sum / cnt : NAN;
            any |= cnt > 0;
        }
        if (!any) { free(y); continue; }
        buf[ns] = y;
        s[ns] = (paint_series){ .name = names && names[i] ? names[i] : "?", .y = y, .n = steps, .color = PAINT_AUTO };
        ns++;
    }
    if (rc == SKV_OK && ns) {
        paint_plot p = { .title = "Mass recall per decode step (mean over layers and heads)",
                         .x = { .label = "decode step", .integer = 1 }, .y = { .label = "mass recall", .unit = "%" },
                         .series = s, .n_series = ns };
        char t[96];
        snprintf(t, sizeof t, "%s", p.title);
        if (canvas_text_width(c, t, CANVAS_FONT_TITLE) > r.w) snprintf(t, sizeof t, "Mass recall per step");
        view_fit_text(c, CANVAS_FONT_TITLE, r.w, t);
        p.title = t;
        paint_result pr;
        rc = paint_draw_plot(c, r, &p, &pr);
    }
    for (int i = 0; i < ns; i++) free(buf[i]);
    return rc;
}

static int compare_lanes(canvas *c, canvas_rect r, const probe_store *const *st, const char *const *names, int n,
                         const view_cursor *cur, paint_result *res) {
    (void)cur;
    if (n < 1 || !probe_store_run(st[0])) {
        char why[160];
        return view_message(c, r, "Compare", view_no_data(st[0], PROBE_STEP, "steps", why, sizeof why), res);
    }
    if (n > CMP_MAX) n = CMP_MAX;
    const canvas_geom *g = canvas_geometry(c);
    lane_sum sum[CMP_MAX];
    int any_oracle = 0, nl = 0;
    for (int i = 0; i < n; i++) {
        summarise(st[i], -1, &sum[i]);
        any_oracle |= sum[i].n_or > 0;
        int l = probe_store_n_layers(st[i]);
        nl = l > nl ? l : nl;
    }
    /* per policy */
    static const paint_column pcols[] = {
        {"policy", PAINT_ALIGN_LEFT}, {"mass recall", PAINT_ALIGN_RIGHT}, {"overlap", PAINT_ALIGN_RIGHT},
        {"out err", PAINT_ALIGN_RIGHT}, {"fetch/step", PAINT_ALIGN_RIGHT}, {"resident", PAINT_ALIGN_RIGHT},
        {"ms/step", PAINT_ALIGN_RIGHT}, {"top-1", PAINT_ALIGN_RIGHT},
    };
    enum { PC = sizeof pcols / sizeof pcols[0] };
    char txt[CMP_MAX][PC][32];
    const char *cells[CMP_MAX * PC];
    for (int i = 0; i < n; i++) {
        const lane_sum *s = &sum[i];
        snprintf(txt[i][0], 32, "%s", names && names[i] && names[i][0] ? names[i] : "?");
        if (s->n_or) {
            snprintf(txt[i][1], 32, "%.1f%%", 100 * s->recall);
            snprintf(txt[i][2], 32, "%.1f%%", 100 * s->overlap);
            snprintf(txt[i][3], 32, "%.2f%%", 100 * s->err);
        } else {
            for (int j = 1; j <= 3; j++) snprintf(txt[i][j], 32, "-");
        }
        if (s->n_steps) {
            snprintf(txt[i][4], 32, "%.1f KiB", s->fetch / 1024);
            snprintf(txt[i][5], 32, "%.2f MiB", s->resident / 1048576);
            snprintf(txt[i][6], 32, "%.2f", 1000 * s->seconds);
        } else {
            for (int j = 4; j <= 6; j++) snprintf(txt[i][j], 32, "-");
        }
        if (s->compared) snprintf(txt[i][7], 32, "%d/%d", s->agree, s->compared);
        else snprintf(txt[i][7], 32, "-");
        for (int j = 0; j < PC; j++) cells[i * PC + j] = txt[i][j];
    }
    /* dense alone has nothing for the oracle to score: say that, not "run with --oracle" */
    int only_dense = 1;
    for (int i = 0; i < n; i++) only_dense &= names && names[i] && !strcmp(names[i], "dense");
    char title[160];
    snprintf(title, sizeof title, "Compare: %d polic%s%s", n, n == 1 ? "y" : "ies",
             any_oracle   ? " (mass recall, overlap, output error: oracle means; top-1: agreement with dense)"
             : only_dense ? " (dense is exact attention: the oracle scores sparse policies against it)"
                          : " (run with --oracle for mass recall and error)");
    if (canvas_text_width(c, title, CANVAS_FONT_TITLE) > r.w) /* the shorter wording before any cut */
        snprintf(title, sizeof title, "Compare: %d polic%s%s", n, n == 1 ? "y" : "ies",
                 any_oracle   ? " (oracle means; top-1 agrees with dense)"
                 : only_dense ? " (dense is exact: nothing to score)"
                              : " (--oracle adds mass recall, error)");
    view_fit_text(c, CANVAS_FONT_TITLE, r.w, title);
    paint_table t1 = {.title = title, .cols = pcols, .n_cols = PC, .cells = cells, .n_rows = n};
    /* per layer: the policy keeping the most exact mass, and the one with the least error */
    static const paint_column lcols[] = {
        {"layer", PAINT_ALIGN_RIGHT}, {"most mass", PAINT_ALIGN_LEFT}, {"mass", PAINT_ALIGN_RIGHT},
        {"least error", PAINT_ALIGN_LEFT}, {"error", PAINT_ALIGN_RIGHT}, {"dense", PAINT_ALIGN_LEFT},
    };
    enum { LC = sizeof lcols / sizeof lcols[0] };
    char (*lt)[LC][40] = nl > 0 ? calloc((size_t)nl, sizeof *lt) : NULL;
    const char **lcells = nl > 0 ? calloc((size_t)nl * LC, sizeof *lcells) : NULL;
    if (nl > 0 && (!lt || !lcells)) {
        free(lt);
        free(lcells);
        return skv_error(SKV_ENOMEM, "compare view: out of memory");
    }
    int rows = 0, any_dense = 0;
    for (int l = 0; any_oracle && l < nl; l++) {
        int bm = -1, be = -1, any = 0;
        lane_sum ls[CMP_MAX];
        lt[rows][5][0] = 0;
        for (int i = 0; i < n; i++) {
            summarise(st[i], l, &ls[i]);
            if (!ls[i].n_or) continue;
            any = 1;
            if (ls[i].n_dense == ls[i].n_or) { /* attended whole: not its selection, never crowned */
                size_t at = strlen(lt[rows][5]);
                snprintf(lt[rows][5] + at, 40 - at, "%s%s", at ? ", " : "", txt[i][0]);
                continue;
            }
            if (bm < 0 || ls[i].mass > ls[bm].mass) bm = i;
            if (be < 0 || ls[i].err < ls[be].err) be = i;
        }
        if (!any) continue;
        any_dense |= lt[rows][5][0] != 0;
        if (!lt[rows][5][0]) snprintf(lt[rows][5], 40, "-");
        snprintf(lt[rows][0], 40, "%d", l);
        snprintf(lt[rows][1], 40, "%s", bm >= 0 ? txt[bm][0] : "(all dense)");
        if (bm >= 0) snprintf(lt[rows][2], 40, "%.1f%%", 100 * ls[bm].mass);
        else snprintf(lt[rows][2], 40, "-");
        snprintf(lt[rows][3], 40, "%s", be >= 0 ? txt[be][0] : "(all dense)");
        if (be >= 0) snprintf(lt[rows][4], 40, "%.2f%%", 100 * ls[be].err);
        else snprintf(lt[rows][4], 40, "-");
        for (int j = 0; j < LC; j++) lcells[rows * LC + j] = lt[rows][j];
        rows++;
    }
    double lh = g->cells ? 1 : canvas_line_height(c, CANVAS_FONT_BODY) * 1.4;
    double top_h = (n + 3) * lh + (g->cells ? 0 : 2 * g->pad);
    if (!rows || top_h > r.h) top_h = r.h;
    int rc = paint_draw_table(c, (canvas_rect){r.x, r.y, r.w, top_h}, &t1, res);
    /* a figure: the per-layer table and, beside it, mass recall step by step */
    int plot = !g->cells && any_oracle && r.w >= 900;
    double tw = plot ? (any_dense ? 0.6 : 0.5) * r.w : r.w;
    if (!rc && rows && r.h - top_h >= 3 * lh) {
        char t2title[120] = "Per layer (exact attention mass on the tokens each policy attended)";
        if (any_dense) snprintf(t2title, sizeof t2title, "Per layer (dense: attended whole, not ranked)");
        if (canvas_text_width(c, t2title, CANVAS_FONT_TITLE) > tw) snprintf(t2title, sizeof t2title, "Per layer");
        view_fit_text(c, CANVAS_FONT_TITLE, tw, t2title);
        /* the dense column only when some policy attended a layer whole */
        if (!any_dense)
            for (int i = 0; i < rows; i++)
                for (int j = 0; j < LC - 1; j++) lcells[i * (LC - 1) + j] = lt[i][j];
        paint_table t2 = {.title = t2title,
                          .cols = lcols, .n_cols = any_dense ? LC : LC - 1, .cells = lcells, .n_rows = rows};
        rc = paint_draw_table(c, (canvas_rect){r.x, r.y + top_h, tw, r.h - top_h}, &t2, NULL);
    }
    if (!rc && plot && r.h - top_h >= 8 * lh) rc = recall_plot(c, (canvas_rect){r.x + tw, r.y + top_h, r.w - tw, r.h - top_h},
                                                              st, names, n);
    free(lt);
    free(lcells);
    return rc;
}

static int compare_draw(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res) {
    const probe_ev_run *run = probe_store_run(st);
    const char *name = run && run->kv_policy ? run->kv_policy : "";
    return compare_lanes(c, r, &st, &name, 1, cur, res);
}

const view_class view_compare = {
    .name = "compare",
    .title = "Compare",
    .help = "the policies of a compare run side by side: mass recall (the exact attention mass on the tokens "
            "attended, against the most that as many tokens could hold), overlap, output error, bytes and time per step; "
            "per layer, the policy that keeps the most mass (skv run/inspect --kv a,b,...)",
    .draw = compare_draw,
    .draw_lanes = compare_lanes,
    .needs = PROBE_ORACLE,
};
