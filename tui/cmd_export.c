/* cmd_export.c: `skv export` draws one view of a recorded trace into a
 * figure file, with the same drawing code the inspector uses in a terminal.
 *
 *   skv export --trace T --view NAME [--layer L --head H --step S --chunk C]
 *              -o FIG.png [--scale 2] [--size WxH] [--force]
 *
 * The trace is replayed into a probe store, the view draws on a PNG canvas
 * (an SVG one when FIG ends in .svg), and the file is saved atomically; an
 * existing file is replaced only with --force. Every failure is one line on
 * stderr and a non-zero exit: 2 for a bad command line, 1 for bad input.
 *
 *   skv export TRACE --format csv DIR                 every record as CSV tables (probes/trace_csv.c)
 *   skv export TRACE --format chrome|perfetto OUT.json the whole run as a Perfetto / chrome://tracing
 *                                                     timeline (probes/trace_chrome.c) */
#include "cli.h"
#include "skv.h"
#include "store.h"
#include "trace.h"
#include "trace_chrome.h"
#include "view.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define EXPORT_MAX_SIDE 8192    /* logical pixels per side */
#define EXPORT_MIN_W 320        /* below this a figure's title, ticks and legend cannot be drawn whole */
#define EXPORT_MIN_H 200
#define EXPORT_MAX_SCALE 4

static void export_help(FILE *o) {
    fprintf(o, "usage: skv export TRACE --view NAME -o FIG.png [options]   (or --trace TRACE)\n"
               "       skv export TRACE --format csv DIR [--partial] [--force]\n"
               "       skv export TRACE --format chrome OUT.json [--partial] [--force]\n\n"
               "The second form writes the trace as tidy CSV tables into DIR: KIND.csv per record kind\n"
               "(a row per record), KIND__FIELD.csv per array field (a row per element, keyed by record,\n"
               "step, layer, head and index) and meta.json; docs/TRACE.md lists the columns.\n"
               "The third (--format perfetto is the same) writes every step of the run as a timeline for\n"
               "ui.perfetto.dev or chrome://tracing (Trace Event Format JSON): a process per policy or\n"
               "sequence, a thread per stream, every span with its layer and step (and bytes and GB/s for\n"
               "a fetch), each step's start, and per-step counters (hit rate, bytes fetched, mass recall,\n"
               "output error, needle rank). A trace cut short is refused by both unless --partial (then\n"
               "what is intact is written).\n\n"
               "Draws one view of a recorded trace (skv run --trace FILE) into a PNG figure,\n"
               "or an SVG one when FIG ends in .svg, and prints the path written.\n\n"
               "  -t, --trace FILE      the trace to replay (or TRACE, the first argument)\n"
               "  -v, --view NAME       the view to draw (below)\n"
               "  -o, --output FIG      the figure to write; an existing file is kept unless --force\n"
               "      --policy NAME     of a compare trace, the one policy's lane (default: every lane, stacked)\n"
               "      --seq N           of a batched trace (skv run --parallel B), sequence N's lane (default:\n"
               "                        every sequence, stacked, when there are at most 4; else sequence 0)\n"
               "      --layer L         model layer (default 0)\n"
               "      --head H          KV head (default 0)\n"
               "      --step S          decode step (default: the last one)\n"
               "      --chunk C         chunk to mark in chunkmap and selection (default: none)\n"
               "      --size WxH        figure size in logical pixels (default 1200x700)\n"
               "      --scale N         pixel density 1..%d (default 1; 2 = a crisp 2x image)\n"
               "      --annotate        draw the cursor (step row, chunk, layer) as the inspector does;\n"
               "                        without it the figure is clean\n"
               "      --force           replace FIG if it exists\n\nviews:\n",
            EXPORT_MAX_SCALE);
    for (int i = 0; view_classes[i]; i++) {
        const view_class *v = view_classes[i];
        fprintf(o, "  %-10s %s%s\n", v->name, view_available(v) ? "" : "(not available yet) ", v->help ? v->help : "");
    }
}

/* Parses a whole decimal integer in [lo, hi]; prints the error itself. */
static int parse_int_opt(const char *flag, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < lo || x > hi) {
        cli_usage_error("export", "%s expects an integer in [%ld, %ld], got '%s'", flag, lo, hi, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* Parses "WxH" (an ASCII x or X between the sides). */
static int parse_size(const char *v, int *w, int *h) {
    char *end;
    errno = 0;
    long a = strtol(v, &end, 10);
    if (end == v || (*end != 'x' && *end != 'X') || errno) return -1;
    const char *p = end + 1;
    long b = strtol(p, &end, 10);
    if (end == p || *end || errno) return -1;
    if (a < EXPORT_MIN_W || b < EXPORT_MIN_H || a > EXPORT_MAX_SIDE || b > EXPORT_MAX_SIDE) return -1;
    *w = (int)a;
    *h = (int)b;
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcasecmp(s + n - m, suffix);
}

/* Checks the cursor against the store's shape; one line and 1 when out of range. */
static int check_cursor(const char *trace, const probe_store *st, const view_cursor *cur) {
    int nl = probe_store_n_layers(st), nh = probe_store_n_kv_heads(st), ns = probe_store_n_steps(st);
    if (cur->layer >= (nl > 0 ? nl : 1)) {
        fprintf(stderr, "skv export: --layer %d is out of range: %s has %d layer%s (0..%d)\n", cur->layer, trace, nl,
                nl == 1 ? "" : "s", nl - 1);
        return 1;
    }
    if (cur->head >= (nh > 0 ? nh : 1)) {
        fprintf(stderr, "skv export: --head %d is out of range: %s has %d KV head%s (0..%d)\n", cur->head, trace, nh,
                nh == 1 ? "" : "s", nh - 1);
        return 1;
    }
    if (cur->step >= 0 && cur->step >= ns) {
        if (ns == 0) fprintf(stderr, "skv export: --step %d is out of range: %s has no decode steps\n", cur->step, trace);
        else
            fprintf(stderr, "skv export: --step %d is out of range: %s has %d decode steps (0..%d)\n", cur->step, trace,
                    ns, ns - 1);
        return 1;
    }
    return 0;
}

/* skv export TRACE --format chrome OUT.json */
static int export_chrome(const char *trace, const char *out, int force, int partial) {
    if (cli_check_output("export", out, force)) return 1;
    trace_chrome_stats cs;
    if (trace_export_chrome(trace, out, force, partial, &cs)) return cli_fail();
    if (*trace_last_notice()) cli_msg("warning: %s\n", trace_last_notice());
    fprintf(stderr, "skv export: wrote %" PRIu64 " spans of %d decode steps, %d process%s and %d thread%s (%" PRIu64
            " events) into %s", cs.spans, cs.steps, cs.processes, cs.processes == 1 ? "" : "es", cs.threads,
            cs.threads == 1 ? "" : "s", cs.events, out);
    if (cs.overflow)
        fprintf(stderr, "; %d span%s overlapped another on its stream without nesting and went on an overlap track",
                cs.overflow, cs.overflow == 1 ? "" : "s");
    fprintf(stderr, "\n");
    printf("%s\n", out);
    return 0;
}

/* skv export TRACE --format csv DIR */
static int export_csv(const char *trace, const char *dir, int force, int partial) {
    int n = 0;
    if (trace_export_csv(trace, dir, force, partial, &n)) return cli_fail();
    if (*trace_last_notice()) cli_msg("warning: %s\n", trace_last_notice());
    fprintf(stderr, "skv export: wrote %d tables and meta.json into %s\n", n, dir);
    printf("%s\n", dir);
    return 0;
}

int cmd_export(int argc, char **argv) {
    const char *trace = NULL, *view_name = NULL, *out = NULL, *format = NULL, *pos[2] = { NULL, NULL }, *policy = NULL;
    int layer = 0, head = 0, step = -1, chunk = -1, scale = 1, width = 1200, height = 700, force = 0, annotate = 0;
    int partial = 0, n_pos = 0, seq = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { export_help(stdout); return 0; }
        if (!strcmp(a, "--force")) { force = 1; continue; }
        if (!strcmp(a, "--annotate")) { annotate = 1; continue; }
        if (!strcmp(a, "--partial")) { partial = 1; continue; }
        if (a[0] != '-' || !a[1]) {
            if (n_pos == 2) return cli_usage_error("export", "unexpected argument '%s'", a);
            pos[n_pos++] = a;
            continue;
        }
        if (!strcmp(a, "--format")) {
            if (!v) return cli_usage_error("export", "--format needs a value (csv, chrome)");
            if (strcmp(v, "csv") && strcmp(v, "chrome") && strcmp(v, "perfetto"))
                return cli_usage_error("export", "--format: '%s' is not a format (csv, chrome or perfetto; figures take "
                                       "-o FIG.png)", v);
            format = !strcmp(v, "csv") ? "csv" : "chrome";
            i++;
            continue;
        }
        int known = !strcmp(a, "--trace") || !strcmp(a, "-t") || !strcmp(a, "--view") || !strcmp(a, "-v") ||
                    !strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--layer") || !strcmp(a, "--head") ||
                    !strcmp(a, "--step") || !strcmp(a, "--chunk") || !strcmp(a, "--scale") || !strcmp(a, "--size") ||
                    !strcmp(a, "--policy") || !strcmp(a, "--seq");
        if (!known) return cli_usage_error("export", "unknown option '%s'", a);
        if (!v) return cli_usage_error("export", "%s needs a value", a);
        i++;
        if (!strcmp(a, "--trace") || !strcmp(a, "-t")) trace = v;
        else if (!strcmp(a, "--view") || !strcmp(a, "-v")) view_name = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--policy")) policy = v;
        else if (!strcmp(a, "--seq")) { if (parse_int_opt(a, v, 0, PROBE_MAX_LANES - 1, &seq)) return 2; }
        else if (!strcmp(a, "--layer")) { if (parse_int_opt(a, v, 0, 1 << 20, &layer)) return 2; }
        else if (!strcmp(a, "--head")) { if (parse_int_opt(a, v, 0, 1 << 20, &head)) return 2; }
        else if (!strcmp(a, "--step")) { if (parse_int_opt(a, v, -1, 1 << 30, &step)) return 2; }
        else if (!strcmp(a, "--chunk")) { if (parse_int_opt(a, v, -1, 1 << 30, &chunk)) return 2; }
        else if (!strcmp(a, "--scale")) { if (parse_int_opt(a, v, 1, EXPORT_MAX_SCALE, &scale)) return 2; }
        else if (parse_size(v, &width, &height))
            return cli_usage_error("export", "--size expects WxH from %dx%d to %dx%d, got '%s'", EXPORT_MIN_W, EXPORT_MIN_H,
                                   EXPORT_MAX_SIDE, EXPORT_MAX_SIDE, v);
    }
    if (format) {
        int csv = !strcmp(format, "csv");
        const char *usage = csv ? "skv export TRACE --format csv DIR" : "skv export TRACE --format chrome OUT.json";
        if (view_name) return cli_usage_error("export", "--format %s writes every record; it takes no --view", format);
        if (policy || seq >= 0)
            return cli_usage_error("export", "--format %s writes every lane; it takes no --%s", format,
                                   policy ? "policy" : "seq");
        const char *dir = out;
        int at = 0;
        if (!trace && at < n_pos) trace = pos[at++];
        if (!dir && at < n_pos) dir = pos[at++];
        if (at < n_pos) return cli_usage_error("export", "unexpected argument '%s'", pos[at]);
        if (!trace) return cli_usage_error("export", "no trace: %s", usage);
        if (!dir) return cli_usage_error("export", "%s: %s", csv ? "no folder" : "no output file", usage);
        return csv ? export_csv(trace, dir, force, partial) : export_chrome(trace, dir, force, partial);
    }
    int at = 0;
    if (!trace && n_pos) trace = pos[at++]; /* skv export TRACE --view NAME -o FIG, as the other forms */
    if (at < n_pos)
        return cli_usage_error("export", "unexpected argument '%s' (a figure takes TRACE --view NAME -o FIG)", pos[at]);
    if (partial) return cli_usage_error("export", "--partial goes with --format csv or chrome");
    if (!trace) return cli_usage_error("export", "no trace: give --trace FILE");
    if (!view_name) return cli_usage_error("export", "no view: give --view NAME");
    if (!out) return cli_usage_error("export", "no output: give -o FIG.png");
    const view_class *vc = view_find(view_name);
    if (!vc) {
        char names_all[600];
        view_names(names_all, sizeof names_all);
        return cli_usage_error("export", "unknown view '%s' (views: %s)", view_name, names_all);
    }
    if (!view_available(vc)) {
        fprintf(stderr, "skv export: view '%s' is not available yet\n", view_name);
        return 1;
    }
    int svg = ends_with(out, ".svg");
    if (!svg && !ends_with(out, ".png"))
        return cli_usage_error("export", "%s: the figure's name must end in .png or .svg", out);
    if (cli_check_output("export", out, force)) return 1;

    probe_lanes *lanes = NULL;
    canvas *c = NULL;
    int rc = 1;
    if (probe_lanes_new(&lanes) || trace_load_lanes(trace, lanes)) { rc = cli_fail(); goto done; }
    if (*trace_last_notice()) cli_msg("warning: %s\n", trace_last_notice());
    /* a compare trace has one store per policy, a batched one one per
     * sequence; the figure stacks them */
    int n_lanes = probe_lanes_count(lanes), batched = probe_lanes_batched(lanes);
    const probe_store *sts[PROBE_MAX_LANES];
    const char *names[PROBE_MAX_LANES];
    for (int i = 0; i < n_lanes; i++) {
        sts[i] = probe_lanes_store(lanes, i);
        names[i] = probe_lanes_label(lanes, i);
    }
    if (seq >= 0 && cli_check_seq("export", lanes, trace, seq)) goto done;
    if (batched && !policy && (seq >= 0 || n_lanes > VIEW_BATCH_STACK_MAX)) { /* one sequence */
        int k = seq >= 0 ? seq : 0;
        sts[0] = sts[k];
        names[0] = names[k];
        n_lanes = 1;
    }
    if (policy) { /* one lane of a compare trace */
        int k = -1;
        char all[300] = "";
        for (int i = 0, len = 0; i < n_lanes; i++) {
            const char *p = probe_lanes_policy(lanes, i);
            if (k < 0 && !strcmp(p, policy)) k = i; /* a batch: its first sequence */
            if (len < (int)sizeof all) len += snprintf(all + len, sizeof all - (size_t)len, "%s%s", i ? ", " : "", p);
        }
        if (k < 0) {
            fprintf(stderr, "skv export: --policy %s: %s has no such lane (its policies: %s)\n", policy, trace, all);
            goto done;
        }
        sts[0] = sts[k];
        names[0] = names[k];
        n_lanes = 1;
    }
    probe_store *st = (probe_store *)sts[0];
    view_cursor cur;
    view_cursor_init(&cur);
    cur.layer = layer;
    cur.head = head;
    cur.step = step;
    cur.chunk = chunk;
    cur.clean = !annotate;
    cur.batch = batched;
    if (check_cursor(trace, st, &cur)) goto done;
    canvas_png_opts po = { .scale = scale };
    if (svg ? canvas_svg_new(&c, width, height, &po) : canvas_png_new(&c, width, height, &po)) {
        rc = cli_fail();
        goto done;
    }
    canvas_clear(c);
    int drc = view_draw_lanes(vc, c, (canvas_rect){ 0, 0, width, height }, sts, names, n_lanes, &cur, NULL);
    if (drc == SKV_EMISSING) {
        fprintf(stderr, "skv export: %s has no data for view '%s': %s\n", trace, view_name, skv_last_error());
        goto done;
    }
    if (drc) { rc = cli_fail(); goto done; }
    if (canvas_save(c, out, force)) { rc = cli_fail(); goto done; }
    printf("%s\n", out);
    rc = 0;
done:
    canvas_free(c);
    probe_lanes_free(lanes);
    return rc;
}
