/* test_fixes.c: the fixes from a newcomer's afternoon (issue 35), each
 * checked where a user meets it, on the committed demo model (no ../shared
 * needed):
 *  - integers print as integers (skv_num; skv run's stats line, help);
 *  - an output that is a directory, or in a missing folder, is refused
 *    before any work; skv dump keeps existing .npy files without --force;
 *    the CSV export checks meta.json before writing a table; outputs 0644;
 *  - an empty prompt is an error; skv run and skv eval default to the demo
 *    model and say so; --oracle timings say they include the oracle, and
 *    --oracle on dense says there is nothing to score;
 *  - lengths far past the trained context are refused without --force;
 *  - the needle table marks unrun cells, trace info on a cut or compare
 *    trace names every policy and counts the finished steps;
 *  - skv eval: a folder it did not write is kept, a changed grid names the
 *    setting, a foreign case line is refused, ./skv and build/skv resume the
 *    same suite, and its tok/s gives the spread. */
#include "kv.h"
#include "model.h"
#include "session.h"
#include "skv.h"
#include "testhelp.h"

#include <math.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define DEMO "samples/model/skv-demo.gguf"

static int file_mode(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (int)(sb.st_mode & 0777) : -1;
}

static void test_numbers(void) {
    char b[40];
    test_cond("skv_num: 1957888 in full, 16777216 in full, 0.5 and 1e-3 as %g, -0 as 0",
              !strcmp(skv_num(b, sizeof b, 1957888, 6), "1957888") &&
                  !strcmp(skv_num(b, sizeof b, 16777216, 6), "16777216") && !strcmp(skv_num(b, sizeof b, 0.5, 6), "0.5") &&
                  !strcmp(skv_num(b, sizeof b, 1e-3, 6), "0.001") && !strcmp(skv_num(b, sizeof b, -0.0, 6), "0"));
    static char out[1 << 16];
    test_sh(out, sizeof out, "%s run --kv help", test_skv_bin());
    test_cond("skv run --kv help: no range or default in exponent form", !strstr(out, "e+0") && strstr(out, "16777216"));
    /* At budget 1024 (128 chunks) the 39 steps count over 10^4 hits: where
     * %.4g, as the stats line once printed them, switches to 3.437e+04. */
    int rc = test_sh(out, sizeof out, "%s run -m " DEMO " -f samples/prompts/needle.txt --kv shadowkv --budget 1024 -n 40",
                test_skv_bin());
    const char *st = strstr(out, "stats:"), *h = st ? strstr(st, " hits ") : NULL;
    char digits[32] = "";
    if (h) sscanf(h + 6, "%31[0-9]", digits);
    size_t nd = strlen(digits);
    test_cond("skv run's stats line: a count of 10^4 or more (hits) in full, no exponent anywhere on the line",
              rc == 0 && st && !strstr(st, "e+0") && nd >= 5 && (h[6 + nd] == ' ' || h[6 + nd] == '\n'));
}

static void test_outputs(const char *dir) {
    static char out[1 << 16];
    char path[1000];
    double t0 = skv_now();
    int rc = test_sh(out, sizeof out, "%s needle --lengths 1k --depths 0:100:10 --json %s --force", test_skv_bin(), dir);
    test_cond("skv needle --json DIR --force: refused at once as a directory, before any case runs",
              rc == 1 && strstr(out, "is a directory") && !strstr(out, "case 0") && skv_now() - t0 < 20);
    rc = test_sh(out, sizeof out, "%s run -m " DEMO " -p hi -n 2 --trace %s --force", test_skv_bin(), dir);
    test_cond("skv run --trace DIR --force: refused as a directory", rc == 1 && strstr(out, "is a directory"));
    rc = test_sh(out, sizeof out, "%s run -m " DEMO " -p hi -n 2 --trace %s/no/such/t.skvtrace", test_skv_bin(), dir);
    test_cond("skv run --trace in a folder that does not exist: refused, naming the folder",
              rc == 1 && strstr(out, "does not exist"));

    /* skv dump keeps what is there */
    char dd[700];
    snprintf(dd, sizeof dd, "%s/dump", dir);
    rc = test_sh(out, sizeof out, "%s dump -m " DEMO " -p 'hello there' --layer 0 -o %s", test_skv_bin(), dd);
    snprintf(path, sizeof path, "%s/k_pre.npy", dd);
    int first = rc == 0 && file_mode(path) == 0644;
    FILE *f = fopen(path, "w");
    if (f) { fputs("mine", f); fclose(f); }
    rc = test_sh(out, sizeof out, "%s dump -m " DEMO " -p 'hello there' --layer 0 -o %s", test_skv_bin(), dd);
    char *b = NULL;
    size_t n = 0;
    skv_read_file(path, 1 << 20, &b, &n);
    test_cond("skv dump writes 0644 files, and keeps an existing .npy without --force",
              first && rc == 1 && strstr(out, "--force") && b && !strcmp(b, "mine"));
    free(b);
    rc = test_sh(out, sizeof out, "%s dump -m " DEMO " -p 'hello there' --layer 0 -o %s --force", test_skv_bin(), dd);
    b = NULL;
    skv_read_file(path, 1 << 20, &b, &n);
    test_cond("skv dump --force replaces it", rc == 0 && b && n > 8 && !memcmp(b, "\x93NUMPY", 6));
    free(b);

    /* the CSV export: meta.json checked before any table */
    char tr[700], csv[700];
    snprintf(tr, sizeof tr, "%s/c.skvtrace", dir);
    snprintf(csv, sizeof csv, "%s/csv", dir);
    rc = test_sh(out, sizeof out, "%s run -m " DEMO " -p 'Once upon a time' -n 6 --kv dense,shadowkv,quest --trace %s --force",
            test_skv_bin(), tr);
    int fresh = rc == 0 && file_mode(tr) == 0644;
    /* the file exists now: --force replaces it through a temp file, which
     * must not keep mkstemp's 0600 */
    rc = test_sh(out, sizeof out, "%s run -m " DEMO " -p 'Once upon a time' -n 6 --kv dense,shadowkv,quest --trace %s --force",
            test_skv_bin(), tr);
    test_cond("a compare trace is written 0644, and replacing an existing one with --force leaves it 0644",
              fresh && rc == 0 && file_mode(tr) == 0644);
    mkdir(csv, 0755);
    snprintf(path, sizeof path, "%s/meta.json", csv);
    f = fopen(path, "w");
    if (f) { fputs("{}", f); fclose(f); }
    rc = test_sh(out, sizeof out, "%s export %s --format csv %s", test_skv_bin(), tr, csv);
    snprintf(path, sizeof path, "%s/step.csv", csv);
    struct stat sb;
    test_cond("skv export --format csv into a folder with meta.json: refused before any table is written",
              rc != 0 && strstr(out, "meta.json") && stat(path, &sb) != 0);
    rc = test_sh(out, sizeof out, "%s export %s --format csv %s --force", test_skv_bin(), tr, csv);
    test_cond("with --force the tables are written 0644", rc == 0 && file_mode(path) == 0644);

    /* trace info on the compare trace and a cut copy */
    rc = test_sh(out, sizeof out, "%s trace info %s", test_skv_bin(), tr);
    test_cond("trace info on a compare trace names all three policies",
              rc == 0 && strstr(out, "dense") && strstr(out, "shadowkv:") && strstr(out, "quest:"));
    b = NULL;
    if (skv_read_file(tr, 1 << 24, &b, &n) == 0 && n > 4000) {
        snprintf(path, sizeof path, "%s/cut.skvtrace", dir);
        f = fopen(path, "wb");
        if (f) { fwrite(b, 1, n * 2 / 3, f); fclose(f); }
        rc = test_sh(out, sizeof out, "%s trace info %s", test_skv_bin(), path);
        test_cond("trace info on a cut trace: no '?' or -1, its policies and the finished steps from its records",
                  rc == 0 && !strstr(out, "skv ?") && !strstr(out, "     -1") && strstr(out, "no metadata record") &&
                      strstr(out, "quest:") && strstr(out, "finished"));
    }
    free(b);
}

static void test_prompts_and_defaults(const char *dir) {
    static char out[1 << 16];
    char path[1000];
    snprintf(path, sizeof path, "%s/empty.txt", dir);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    int a = test_sh(out, sizeof out, "%s run -m " DEMO " -f - -n 2 </dev/null", test_skv_bin());
    int b = test_sh(out, sizeof out, "%s run -m " DEMO " -f %s -n 2", test_skv_bin(), path);
    int c = test_sh(out, sizeof out, "%s run -m " DEMO " -p '' -n 2", test_skv_bin());
    test_cond("an empty prompt (-f - on an empty pipe, an empty file, -p '') is an error", a == 2 && b == 2 && c == 2);
    int rc = test_sh(out, sizeof out, "%s run -p 'Once upon a time' -n 3", test_skv_bin());
    test_cond("skv run without -m runs the demo model, and says so", rc == 0 && strstr(out, "no -m: the demo model"));
    rc = test_sh(out, sizeof out, "%s run -m " DEMO " -f samples/prompts/needle.txt --kv shadowkv --oracle -n 6", test_skv_bin());
    test_cond("skv run --oracle says its decode rate includes the oracle, and gives the rate without it",
              rc == 0 && strstr(out, "including the oracle's scoring") && strstr(out, "without it"));
    rc = test_sh(out, sizeof out, "%s run -m " DEMO " -p 'Once upon a time' --oracle -n 2", test_skv_bin());
    test_cond("skv run --kv dense --oracle says there is nothing to score, not silence",
              rc == 0 && strstr(out, "dense attends every token exactly") && !strstr(out, "including the oracle"));
    double t0 = skv_now();
    rc = test_sh(out, sizeof out, "timeout -k 5 60 %s needle --lengths 100k --depths 50", test_skv_bin());
    test_cond("skv needle --lengths 100k on a 4096-position model: refused at once without --force",
              rc == 2 && strstr(out, "--force") && strstr(out, "4096") && skv_now() - t0 < 30);
}

static void test_flags(void) {
    static char out[1 << 16];
    int a = test_sh(out, sizeof out, "%s run -m " DEMO " --kv shadowkv --page 4 -p hi -n 1", test_skv_bin());
    int ok_a = a == 2 && strstr(out, "--page does not apply to shadowkv") && strstr(out, "quest");
    int b = test_sh(out, sizeof out, "%s run -m " DEMO " --rank 16 -p hi -n 1", test_skv_bin());
    int ok_b = b == 2 && strstr(out, "--rank does not apply to dense");
    int c = test_sh(out, sizeof out, "%s run -m " DEMO " --kv dense,quest --page 4 -p hi -n 1", test_skv_bin());
    test_cond("a policy flag that applies to no policy in force is refused (--page with shadowkv, --rank with "
              "dense); one that applies to a compared policy is taken", ok_a && ok_b && c == 0);
    /* the settings in force, as the inspector shows them after the prefill */
    skv_model *m = NULL;
    skv_session *s = NULL;
    session_opts so;
    session_opts_default(&so);
    snprintf(so.kv.policy, sizeof so.kv.policy, "shadowkv");
    kv_opts_set(&so.kv, "rank", "160", 1);
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = 100 + i;
    char d[400] = "";
    if (model_load(DEMO, &m) == 0 && session_new(m, &so, &s) == 0 && session_prefill(s, ids, 64, NULL, NULL) == 0)
        kv_describe_in_force(kv_unwrap(s->kv), &s->o.kv, s->n_prompt, d, sizeof d);
    test_cond("the settings in force name a clamped option with what was asked (rank=64 (asked 160))",
              strstr(d, "rank=64 (asked 160)") != NULL);
    session_free(s);
    model_free(m);
}

/* An SVG figure's text elements: 1 when one of them is exactly (or, with
 * part, contains) s. */
static int svg_has(const char *svg, const char *s, int part) {
    for (const char *p = svg; (p = strstr(p, "<text")); p++) {
        const char *b = strchr(p, '>'), *e = b ? strstr(b, "</text>") : NULL;
        if (!e) break;
        size_t n = (size_t)(e - b - 1);
        if (part ? memmem(b + 1, n, s, strlen(s)) != NULL : n == strlen(s) && !memcmp(b + 1, s, n)) return 1;
    }
    return 0;
}

/* How many text elements of the SVG are exactly s. */
static int svg_count(const char *svg, const char *s) {
    int k = 0;
    for (const char *p = svg; (p = strstr(p, "<text")); p++) {
        const char *b = strchr(p, '>'), *e = b ? strstr(b, "</text>") : NULL;
        if (!e) break;
        k += (size_t)(e - b - 1) == strlen(s) && !memcmp(b + 1, s, strlen(s));
    }
    return k;
}

/* 1 when no text of the SVG was cut with an ellipsis. */
static int svg_uncut(const char *svg) { return !svg_has(svg, "\xe2\x80\xa6", 1); }

static char *export_svg(const char *trace, const char *view, const char *extra, const char *dir, const char *name) {
    static char out[1 << 14];
    char path[1000];
    snprintf(path, sizeof path, "%s/%s.svg", dir, name);
    if (test_sh(out, sizeof out, "%s export --trace %s --view %s %s -o %s --force", test_skv_bin(), trace, view, extra, path))
        return NULL;
    char *b = NULL;
    size_t n = 0;
    return skv_read_file(path, 1 << 24, &b, &n) ? NULL : b;
}

static void test_figures(const char *dir) {
    static char out[1 << 16];
    char cmp[800], one[800], nd[800];
    snprintf(cmp, sizeof cmp, "%s/six.skvtrace", dir);
    snprintf(one, sizeof one, "%s/one.skvtrace", dir);
    snprintf(nd, sizeof nd, "%s/needle.skvtrace", dir);
    int rc = test_sh(out, sizeof out, "%s run -m " DEMO " -f samples/prompts/needle.txt -n 8 --kv "
                "dense,shadowkv,quest,freekv,specache,tailorkv --budget 64 --rank 16 --oracle --trace %s --force",
                test_skv_bin(), cmp);
    rc |= test_sh(out, sizeof out, "%s run -m " DEMO " -f samples/prompts/needle.txt -n 8 --kv shadowkv --budget 64 "
             "--rank 16 --outliers 4 --local 4 --oracle --trace %s --force", test_skv_bin(), one);
    rc |= test_sh(out, sizeof out, "%s needle --kv dense,shadowkv,quest,freekv,specache,tailorkv --lengths 1024,2048,4000 "
             "--depths 0,100 --budget 256 --trace %s --force", test_skv_bin(), nd);
    if (rc) { test_cond("the traces for the figure checks are recorded", 0); return; }
    char fig[1000];
    snprintf(fig, sizeof fig, "%s/small.png", dir);
    rc = test_sh(out, sizeof out, "%s export --trace %s --view spectrum --size 100x50 -o %s", test_skv_bin(), one, fig);
    test_cond("skv export --size 100x50 is refused (too small to draw a figure whole)", rc == 2 && strstr(out, "320x200"));
    rc = test_sh(out, sizeof out, "%s run -m " DEMO " -f samples/prompts/needle.txt --kv specache --budget 64 -n 2", test_skv_bin());
    test_cond("SpeCache at a budget that is all residual says it selects nothing", rc == 0 && strstr(out, "all residual"));
    char *s = export_svg(one, "selection", "--layer 3 --head 1", dir, "sel");
    test_cond("the selection figure's title is whole (not cut) and names the hit rate",
              s && svg_uncut(s) && svg_has(s, "hit rate", 1));
    free(s);
    /* At 640x400 the totals table once lost its last row (fetch_v, the
     * shortest) without a word: the chart's row label alone remained. */
    s = export_svg(one, "timeline", "--size 640x400", dir, "tl");
    test_cond("the single-policy timeline at 640x400: fetch_v both as a row of the chart and of the totals table",
              s && svg_has(s, "rebuild_k", 0) && svg_count(s, "fetch_v") >= 2);
    free(s);
    s = export_svg(one, "timeline", "--size 480x320", dir, "tl-small");
    test_cond("the timeline at 480x320: the table that cannot hold fetch_v's row says 'N of 8 operations shown'",
              s && (svg_count(s, "fetch_v") >= 2 || svg_has(s, "of 8 operations shown", 1)));
    free(s);
    s = export_svg(cmp, "timeline", "", dir, "tl6");
    test_cond("a compare timeline is one chart on one time axis: a row per policy and stream, axis numbers, unit, "
              "legend", s && svg_has(s, "shadowkv fetch", 0) && svg_has(s, "tailorkv compute", 0) &&
              svg_has(s, "(ms)", 1) && (svg_has(s, "0", 0) || svg_has(s, "0.0", 0)) && svg_has(s, "sparse_attn", 0) &&
              svg_uncut(s));
    free(s);
    s = export_svg(cmp, "spectrum", "", dir, "sp6");
    test_cond("a compare spectrum leaves out the policies that record none", s && !svg_has(s, "records none", 1) &&
              svg_has(s, "Singular values", 1));
    free(s);
    s = export_svg(cmp, "selection", "--policy shadowkv", dir, "sel6");
    test_cond("skv export --policy NAME draws that lane alone", s && svg_has(s, "decode step", 0));
    free(s);
    s = export_svg(one, "chunks", "", dir, "alias");
    test_cond("a view is found by its tab's title too (--view chunks is chunkmap)", s && svg_has(s, "Chunk map", 1));
    free(s);
    rc = test_sh(out, sizeof out, "%s export --trace %s --view nosuch -o %s/x.png", test_skv_bin(), one, dir);
    test_cond("an unknown view lists the views, with their tab titles", rc == 2 && strstr(out, "chunkmap (tab Chunks)") &&
              strstr(out, "speculation (tab SpeCache)"));
    s = export_svg(cmp, "compare", "", dir, "cmp6");
    test_cond("the compare figure's title is whole, and it plots mass recall per step",
              s && svg_uncut(s) && svg_has(s, "Compare: 6 policies", 1) && svg_has(s, "Mass recall", 1));
    free(s);
    s = export_svg(nd, "niah", "", dir, "niah6");
    /* (FreeKV's ticks are "1k*": its floor is 288 tokens, over the budget of 256) */
#define TICKS(t) (svg_count(s, t) + svg_count(s, t "*"))
    int ticks = s && TICKS("1k") >= 6 && TICKS("2k") >= 6 && TICKS("4000") >= 6;
    test_cond("the six-panel NIAH figure: every panel keeps every length tick (1k, 2k, 4000) and no title is cut",
              ticks && svg_uncut(s));
    test_cond("a clean NIAH export has no cursor line", s && !svg_has(s, "length 1k, depth", 1));
    free(s);
    /* At 600x400 a colour bar beside each panel once left the panels too
     * narrow for the 2k tick, in all six. */
    s = export_svg(nd, "niah", "--size 600x400", dir, "niah6s");
    ticks = s && TICKS("1k") >= 6 && TICKS("2k") >= 6 && TICKS("4000") >= 6;
#undef TICKS
    test_cond("the six-panel NIAH figure at 600x400: every panel keeps every length tick (1k, 2k, 4000)", ticks);
    free(s);
}

/* The leaderboard's rows (the lines "| NAME |" of its first table, after
 * the header): 1 when there are n and each one's last cell, tok/s, reads
 * "M (LO–HI)" or "M (LO–HI, noisy)" with LO <= M <= HI, and says noisy
 * exactly when HI > 2 LO (the printed figures are rounded to whole numbers,
 * so a ratio within half a unit of 2 may go either way). */
static int tps_cells_ok(const char *md, int n) {
    const char *p = strstr(md, "|---|");
    int rows = 0;
    for (p = p ? strchr(p, '\n') : NULL; p && p[1] == '|'; p = strchr(p + 1, '\n')) {
        const char *eol = strchr(p + 1, '\n');
        if (!eol) return 0;
        const char *last = eol - 1; /* the line's closing '|' */
        while (last > p && *last != '|') last--;
        const char *cell = last - 1;
        while (cell > p && *cell != '|') cell--;
        char c[80];
        size_t len = (size_t)(last - cell - 1);
        if (len >= sizeof c) return 0;
        memcpy(c, cell + 1, len);
        c[len] = 0;
        double m, lo, hi;
        char tail[16] = "";
        if (sscanf(c, " %lf (%lf\xe2\x80\x93%lf%15[^)]", &m, &lo, &hi, tail) < 3) return 0;
        int noisy = !strcmp(tail, ", noisy");
        if (tail[0] && !noisy) return 0;
        if (!(lo <= m && m <= hi)) return 0;
        if (hi - 0.5 > 2 * (lo + 0.5) && !noisy) return 0;
        if (hi + 0.5 < 2 * (lo - 0.5) && noisy) return 0;
        rows++;
    }
    return rows == n;
}

static void test_eval(const char *dir) {
    static char out[1 << 16];
    char ev[700], path[1000];
    snprintf(ev, sizeof ev, "%s/ev", dir);
    mkdir(ev, 0755);
    snprintf(path, sizeof path, "%s/leaderboard.md", ev);
    FILE *f = fopen(path, "w");
    if (f) { fputs("my notes", f); fclose(f); }
    const char *grid = "--lengths 1k --depths 30,60 --seeds 1 --kv dense,shadowkv --task single";
    int rc = test_sh(out, sizeof out, "%s eval --out %s %s", test_skv_bin(), ev, grid);
    char *b = NULL;
    size_t n = 0;
    skv_read_file(path, 1 << 20, &b, &n);
    test_cond("skv eval --out DIR without eval.json keeps a leaderboard.md it did not write",
              rc != 0 && strstr(out, "leaderboard.md") && b && !strcmp(b, "my notes"));
    free(b);
    unlink(path);
    rc = test_sh(out, sizeof out, "%s eval --out %s %s", test_skv_bin(), ev, grid);
    test_cond("skv eval without -m uses the demo model's preset and says so",
              rc == 0 && strstr(out, "no -m: the demo model, with its ShadowKV preset"));
    b = NULL;
    skv_read_file(path, 1 << 20, &b, &n);
    test_cond("its leaderboard gives each policy's tok/s as 'median (slowest–fastest)', marked noisy exactly when "
              "the fastest case is over 2x the slowest", b && tps_cells_ok(b, 2));
    free(b);
    rc = test_sh(out, sizeof out, "%s eval --out %s --lengths 1k --depths 30,70 --seeds 1 --kv dense,shadowkv --task single",
            test_skv_bin(), ev);
    test_cond("a changed grid is refused, naming the setting", rc != 0 && strstr(out, "depths was"));
    /* the same suite through ./skv, whose default model path differs from build/skv's */
    struct stat sb;
    if (stat("skv", &sb) == 0) {
        rc = test_sh(out, sizeof out, "./skv eval --out %s %s", ev, grid);
        test_cond("resuming through ./skv what build/skv began (the default model by another path): the same suite",
                  rc == 0 && strstr(out, "2 done before"));
    } else {
        test_skip("no ./skv beside build/skv: the resume-by-another-path check");
    }
    /* the eval figures: budgets labelled where measured, settings stated */
    char evb[800];
    snprintf(evb, sizeof evb, "%s/evb", dir);
    rc = test_sh(out, sizeof out, "%s eval --out %s --lengths 1k --depths 50 --seeds 1 --kv dense,shadowkv --task single "
            "--budgets 32,64,128 --sweep-length 1024", test_skv_bin(), evb);
    char *hm = NULL, *bp = NULL;
    size_t hn = 0, bn = 0;
    snprintf(path, sizeof path, "%s/heatmap.svg", evb);
    skv_read_file(path, 1 << 24, &hm, &hn);
    snprintf(path, sizeof path, "%s/budget.svg", evb);
    skv_read_file(path, 1 << 24, &bp, &bn);
    test_cond("the eval budget plot labels the budgets measured (32, 64, 128) and states its settings, uncut",
              rc == 0 && bp && svg_has(bp, "32", 0) && svg_has(bp, "64", 0) && svg_has(bp, "128", 0) &&
                  svg_has(bp, "seed", 1) && svg_uncut(bp));
    test_cond("the eval heatmap states its budget and settings", hm && svg_has(hm, "budget 256 tokens per KV head", 1));
    free(hm);
    free(bp);
    rc = test_sh(out, sizeof out, "%s eval --out %s --depths 50,50 --lengths 1k --seeds 1", test_skv_bin(), ev);
    test_cond("skv eval --depths 50,50 is refused up front", rc == 2 && strstr(out, "twice"));
    snprintf(path, sizeof path, "%s/cases.jsonl", ev);
    f = fopen(path, "a");
    if (f) {
        fputs("{\"case_key\":\"single|1024|30|0|256\",\"task\":\"single\",\"length\":1024,\"depth\":30,\"budget\":\"256\"}\n", f);
        fclose(f);
    }
    rc = test_sh(out, sizeof out, "%s eval --out %s %s", test_skv_bin(), ev, grid);
    test_cond("a case line without a seed is refused with its line and field, not counted as done",
              rc != 0 && strstr(out, "cases.jsonl:3") && strstr(out, "'seed'"));
}

int main(void) {
    struct stat sb;
    if (stat(test_skv_bin(), &sb) != 0) test_skip("no skv binary (set SKV_BIN or run make)");
    else if (stat(DEMO, &sb) != 0) test_skip(DEMO " is missing: run the tests from the project root");
    else {
        const char *dir = test_tmpdir("fixes");
        test_numbers();
        test_outputs(dir);
        test_prompts_and_defaults(dir);
        test_flags();
        test_figures(dir);
        test_eval(dir);
    }
    return test_report("test_fixes");
}
