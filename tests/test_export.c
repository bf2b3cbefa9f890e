/* test_export: `skv export` end to end, and trace replay against a live run.
 *
 * A sample trace is recorded by running the skv binary ($SKV_BIN, default
 * ./build/skv) with --kv shadowkv --oracle --trace on stories260k (from
 * ../shared) or, without it, on build/default-model.gguf. Every available
 * view is exported to PNG and read back with libpng: it decodes, has the
 * requested size times the scale, and its pixels equal the same view drawn
 * in-process from the replayed trace (so the spectrum's axis line and
 * rank-cut marker sit exactly where paint_result says). Exports are
 * byte-identical when repeated; an existing file is kept without --force
 * and replaced with it; bad views, layers, steps, sizes and damaged or
 * missing traces give one line on stderr and a non-zero exit.
 *
 * Last, a session runs in-process with a bus feeding both a store and a
 * trace writer: every view drawn from the live store and from the replayed
 * trace must give the same PNG bytes. */
#include "model.h"
#include "probe.h"
#include "session.h"
#include "skv.h"
#include "store.h"
#include "testhelp.h"
#include "tok.h"
#include "trace.h"
#include "view.h"

#include <fcntl.h>
#include <png.h>
#include <stdint.h>
#include <sys/wait.h>

/* The views this test covers (needle and niah need a needle run). */
static const char *const my_views[] = { "spectrum", "chunkmap", "selection", "cache", "timeline", "tokens", NULL };

/* Runs argv with stdout and stderr into files; returns the exit status, or -1. */
static int run(const char *out, const char *err, char *const argv[]) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(127);
        dup2(fo, 1);
        dup2(fe, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The whole file as a NUL-terminated string (the caller frees it), or NULL. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

/* True when the file holds exactly one non-empty line. */
static int one_line(const char *path) {
    char *s = slurp(path, NULL);
    int ok = s && strlen(s) > 1 && strchr(s, '\n') == s + strlen(s) - 1;
    free(s);
    return ok;
}

static int files_equal(const char *a, const char *b) {
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    int eq = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return eq;
}

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

/* Runs `skv export` with the given arguments (NULL-terminated); status returned, outputs in dir. */
static int export(const char *dir, const char *const *args) {
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)test_skv_bin();
    argv[n++] = "export";
    for (int i = 0; args[i] && n < 31; i++) argv[n++] = (char *)args[i];
    argv[n] = NULL;
    char out[600], err[600];
    snprintf(out, sizeof out, "%s/out.txt", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    return run(out, err, argv);
}

/* The view drawn in-process on a PNG canvas of w x h at scale. */
static canvas *draw_png(const view_class *v, const probe_store *st, const view_cursor *cur, int w, int h, int scale,
                        paint_result *res) {
    canvas *c;
    canvas_png_opts o = { .scale = scale };
    if (canvas_png_new(&c, w, h, &o)) return NULL;
    canvas_clear(c);
    if (v->draw(c, (canvas_rect){ 0, 0, w, h }, st, cur, res)) { canvas_free(c); return NULL; }
    return c;
}

/* True when the decoded RGBA image equals the canvas's pixels (RGB; the file has no alpha). */
static int same_pixels(const uint8_t *file, int w, int h, canvas *c) {
    int cw, ch;
    const uint8_t *px = canvas_png_pixels(c, &cw, &ch);
    if (!px || cw != w || ch != h) return 0;
    for (size_t i = 0; i < (size_t)w * h; i++)
        if (memcmp(file + 4 * i, px + 4 * i, 3)) return 0;
    return 1;
}

static canvas_color file_pixel(const uint8_t *px, int w, int h, double x, double y) {
    int X = (int)floor(x), Y = (int)floor(y);
    if (X < 0 || Y < 0 || X >= w || Y >= h) return CANVAS_NONE;
    const uint8_t *p = px + ((size_t)Y * w + X) * 4;
    return CANVAS_RGB(p[0], p[1], p[2]);
}

static void test_exports(const char *dir, const char *trace) {
    probe_store *st;
    probe_store_new(&st);
    test_cond("export: the sample trace replays in-process", trace_load_store(trace, st) == 0);
    view_cursor cur;
    view_cursor_init(&cur);
    cur.layer = 1;
    cur.head = probe_store_n_kv_heads(st) > 1 ? 1 : 0;
    cur.clean = 1; /* skv export draws clean figures unless --annotate */
    char head[16], out[600], msg[200];
    snprintf(head, sizeof head, "%d", cur.head);

    for (int i = 0; my_views[i]; i++) {
        const view_class *v = view_find(my_views[i]);
        snprintf(out, sizeof out, "%s/%s.png", dir, v->name);
        const char *args[] = { "--trace", trace, "--view", v->name, "--layer", "1", "--head", head, "-o", out, NULL };
        int rc = export(dir, args);
        char path[700];
        snprintf(path, sizeof path, "%s/out.txt", dir);
        char *printed = slurp(path, NULL);
        snprintf(msg, sizeof msg, "export %s: exit 0 and the path printed", v->name);
        test_cond(msg, rc == 0 && printed && !strncmp(printed, out, strlen(out)));
        free(printed);
        int w = 0, h = 0;
        uint8_t *px = read_png(out, &w, &h);
        snprintf(msg, sizeof msg, "export %s: the PNG decodes at 1200x700", v->name);
        test_cond(msg, px && w == 1200 && h == 700);
        paint_result res;
        canvas *c = px ? draw_png(v, st, &cur, 1200, 700, 1, &res) : NULL;
        snprintf(msg, sizeof msg, "export %s: pixels equal the view drawn in-process from the trace", v->name);
        test_cond(msg, c && same_pixels(px, w, h, c));
        if (c && (!strcmp(v->name, "cache") || !strcmp(v->name, "selection"))) {
            /* --annotate draws the cursor as the inspector does; the clean figure does not */
            char ann[600];
            snprintf(ann, sizeof ann, "%s/%s-annotated.png", dir, v->name);
            const char *a2[] = { "--trace", trace, "--view", v->name, "--layer", "1", "--head", head, "-o", ann,
                                 "--annotate", NULL };
            int rc2 = export(dir, a2);
            int w2 = 0, h2 = 0;
            uint8_t *px2 = rc2 == 0 ? read_png(ann, &w2, &h2) : NULL;
            view_cursor c2 = cur;
            c2.clean = 0;
            paint_result r2;
            canvas *cv2 = px2 ? draw_png(v, st, &c2, 1200, 700, 1, &r2) : NULL;
            snprintf(msg, sizeof msg, "export %s --annotate: the cursor is drawn, and only then", v->name);
            test_cond(msg, cv2 && same_pixels(px2, w2, h2, cv2) && !same_pixels(px, w, h, cv2));
            canvas_free(cv2);
            free(px2);
            unlink(ann);
        }
        if (c && !strcmp(v->name, "spectrum")) {
            int marked = 0;
            for (double y = res.area.y; y < res.area.y + res.area.h; y++)
                marked += file_pixel(px, w, h, res.marker_x[0], y) == palette_cat(3);
            test_cond("export spectrum: the rank-cut marker is in the file at the painter's x for r",
                      res.n_markers == 1 && marked > res.area.h * 0.25 &&
                          fabs(res.marker_x[0] - paint_map_x(&res, probe_store_prefill_layer(st, 1)->rank)) < 1e-9);
            canvas_color ax = file_pixel(px, w, h, res.area.x + res.area.w / 2, res.axis_y);
            test_cond("export spectrum: the x axis line is in the file", ax != CANVAS_NONE && canvas_luma(ax) < 0.2);
        }
        canvas_free(c);
        free(px);
    }

    /* scale and size */
    snprintf(out, sizeof out, "%s/spectrum-2x.png", dir);
    const char *a2[] = { "--trace", trace, "--view", "spectrum", "--scale", "2", "--size", "640x360", "-o", out, NULL };
    int w = 0, h = 0;
    uint8_t *px = export(dir, a2) == 0 ? read_png(out, &w, &h) : NULL;
    test_cond("export: --size 640x360 --scale 2 gives 1280x720 pixels", px && w == 1280 && h == 720);
    view_cursor c0;
    view_cursor_init(&c0);
    canvas *c = px ? draw_png(view_find("spectrum"), st, &c0, 640, 360, 2, NULL) : NULL;
    test_cond("export: the 2x file equals the in-process 2x drawing", c && same_pixels(px, w, h, c));
    canvas_free(c);
    free(px);

    /* determinism, overwrite protection */
    char again[600];
    snprintf(out, sizeof out, "%s/sel-a.png", dir);
    snprintf(again, sizeof again, "%s/sel-b.png", dir);
    const char *e1[] = { "--trace", trace, "--view", "selection", "-o", out, NULL };
    const char *e2[] = { "--trace", trace, "--view", "selection", "-o", again, NULL };
    test_cond("export: twice gives byte-identical files", export(dir, e1) == 0 && export(dir, e2) == 0 && files_equal(out, again));
    char err[600];
    snprintf(err, sizeof err, "%s/err.txt", dir);
    const char *e3[] = { "--trace", trace, "--view", "cache", "-o", out, NULL };
    int rc = export(dir, e3);
    char *es = slurp(err, NULL);
    test_cond("export: an existing file is kept without --force (one line, non-zero)",
              rc != 0 && one_line(err) && es && strstr(es, "exists") && files_equal(out, again));
    free(es);
    const char *e4[] = { "--trace", trace, "--view", "cache", "-o", out, "--force", NULL };
    test_cond("export: --force replaces it", export(dir, e4) == 0 && !files_equal(out, again));

    /* errors: one line each, non-zero, no file left */
    struct { const char *what, *needle; const char *args[12]; } bad[] = {
        { "an unknown view", "unknown view", { "--trace", trace, "--view", "nosuch", "-o", "X", NULL } },
        { "a layer out of range", "out of range", { "--trace", trace, "--view", "spectrum", "--layer", "999", "-o", "X", NULL } },
        { "a head out of range", "out of range", { "--trace", trace, "--view", "chunkmap", "--head", "64", "-o", "X", NULL } },
        { "a step out of range", "out of range", { "--trace", trace, "--view", "selection", "--step", "100000", "-o", "X", NULL } },
        { "a negative layer", "--layer", { "--trace", trace, "--view", "spectrum", "--layer", "-1", "-o", "X", NULL } },
        { "a bad size", "--size", { "--trace", trace, "--view", "spectrum", "--size", "12x", "-o", "X", NULL } },
        { "a bad scale", "--scale", { "--trace", trace, "--view", "spectrum", "--scale", "9", "-o", "X", NULL } },
        { "a missing trace", "", { "--trace", "/nonexistent/t.skvtrace", "--view", "spectrum", "-o", "X", NULL } },
        { "no output", "-o", { "--trace", trace, "--view", "spectrum", NULL } },
        { "an unknown option", "unknown option", { "--trace", trace, "--view", "spectrum", "--bogus", "-o", "X", NULL } },
    };
    char xpath[600];
    snprintf(xpath, sizeof xpath, "%s/bad.png", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int k = 0; bad[i].args[k]; k++)
            if (!strcmp(bad[i].args[k], "X")) bad[i].args[k] = xpath;
        rc = export(dir, bad[i].args);
        es = slurp(err, NULL);
        struct stat sb;
        snprintf(msg, sizeof msg, "export: %s gives one line and a non-zero exit", bad[i].what);
        test_cond(msg, rc != 0 && one_line(err) && es && strstr(es, bad[i].needle) && stat(xpath, &sb) != 0);
        free(es);
    }

    /* a damaged trace: one byte flipped in the middle */
    char damaged[600];
    snprintf(damaged, sizeof damaged, "%s/damaged.skvtrace", dir);
    size_t n;
    char *bytes = slurp(trace, &n);
    FILE *f = bytes ? fopen(damaged, "wb") : NULL;
    if (f) {
        bytes[n / 2] ^= 0x5a;
        fwrite(bytes, 1, n, f);
        fclose(f);
    }
    free(bytes);
    const char *e5[] = { "--trace", damaged, "--view", "spectrum", "-o", xpath, NULL };
    rc = export(dir, e5);
    struct stat sb;
    /* Format 3 keeps a CRC per record: the intact part before the damage
     * exports, with a one-line warning saying the trace was cut short. */
    size_t en = 0;
    char *etext = slurp(err, &en);
    test_cond("export: a damaged trace exports what is intact, with a one-line warning (or is refused in one line)",
              f && etext && ((rc == 0 && one_line(err) && strstr(etext, "cut short") && stat(xpath, &sb) == 0) ||
                             (rc != 0 && one_line(err) && stat(xpath, &sb) != 0)));
    free(etext);
    unlink(xpath);

    /* a reserved view whose draw is not built yet, if the table still has one */
    const char *reserved = NULL;
    for (int i = 0; view_classes[i]; i++)
        if (!view_available(view_classes[i])) reserved = view_classes[i]->name;
    if (reserved) {
        const char *e7[] = { "--trace", trace, "--view", reserved, "-o", xpath, NULL };
        rc = export(dir, e7);
        es = slurp(err, NULL);
        test_cond("export: a view not built yet gives one line and a non-zero exit",
                  rc != 0 && one_line(err) && es && strstr(es, "not available yet") && stat(xpath, &sb) != 0);
        free(es);
    } else {
        test_skip("every view is built: no reserved view to refuse");
    }

    const char *e6[] = { "--help", NULL };
    char outp[600];
    snprintf(outp, sizeof outp, "%s/out.txt", dir);
    rc = export(dir, e6);
    char *help = slurp(outp, NULL);
    int listed = rc == 0 && help != NULL;
    for (int i = 0; listed && view_classes[i]; i++) listed = strstr(help, view_classes[i]->name) != NULL;
    test_cond("export --help lists every view (marking those not built yet)",
              listed && (!reserved || strstr(help, "not available yet")));
    free(help);
    probe_store_free(st);
}

static void add_to_store(const probe_event *ev, void *user) { probe_store_add(user, ev); }

/* A session in-process: the live store and the replayed trace give the same figures. */
static void test_live_vs_replay(const char *dir, const char *model, const char *prompt, int n_predict) {
    skv_model *m = NULL;
    if (model_load(model, &m)) { test_cond("live: model loads", 0); return; }
    probe_bus *bus;
    probe_store *live, *replay;
    probe_sub *sub;
    trace_writer *tw;
    char trace[600];
    snprintf(trace, sizeof trace, "%s/live.skvtrace", dir);
    probe_bus_new(&bus);
    probe_store_new(&live);
    probe_store_new(&replay);
    int ok = probe_subscribe_callback(bus, PROBE_ALL, add_to_store, live, &sub) == 0 &&
             trace_writer_open(trace, bus, &tw) == 0;
    session_opts o;
    session_opts_default(&o);
    snprintf(o.kv.policy, sizeof o.kv.policy, "shadowkv");
    kv_opts_set_num(&o.kv, "rank", 8);
    kv_opts_set_num(&o.kv, "chunk", 8);
    o.kv.budget = 16;
    kv_opts_set_num(&o.kv, "outliers", 1);
    kv_opts_set_num(&o.kv, "local", 1);
    o.kv.oracle = 1;
    o.bus = bus;
    skv_session *s = NULL;
    int32_t *ids = NULL;
    int n = 0;
    ok = ok && tok_encode(m->tok, prompt, strlen(prompt), tok_add_bos(m->tok), 1, &ids, &n) == 0 &&
         session_new(m, &o, &s) == 0 && session_prefill(s, ids, n, NULL, NULL) == 0;
    for (int i = 0; ok && i < n_predict; i++) ok = session_decode(s, session_sample(s)) == 0;
    ok = ok && trace_writer_close(tw) == 0;
    probe_unsubscribe(sub);
    test_cond("live: a shadowkv session ran with a store and a trace on its bus", ok);
    test_cond("live: the trace replays", ok && trace_load_store(trace, replay) == 0 &&
                                             probe_store_n_steps(replay) == probe_store_n_steps(live) &&
                                             probe_store_n_steps(live) == n_predict);
    view_cursor cur;
    view_cursor_init(&cur);
    cur.layer = 1;
    cur.step = n_predict / 2;
    cur.chunk = 2;
    for (int i = 0; ok && my_views[i]; i++) {
        const view_class *v = view_find(my_views[i]);
        char a[700], b[700], what[128];
        snprintf(a, sizeof a, "%s/live-%s.png", dir, v->name);
        snprintf(b, sizeof b, "%s/replay-%s.png", dir, v->name);
        canvas *ca = draw_png(v, live, &cur, 900, 500, 1, NULL), *cb = draw_png(v, replay, &cur, 900, 500, 1, NULL);
        int saved = ca && cb && canvas_png_save(ca, a, 1) == 0 && canvas_png_save(cb, b, 1) == 0;
        snprintf(what, sizeof what, "live: %s from the live store and from the replayed trace: same PNG bytes", v->name);
        test_cond(what, saved && files_equal(a, b));
        canvas_free(ca);
        canvas_free(cb);
    }
    free(ids);
    session_free(s);
    probe_store_free(live);
    probe_store_free(replay);
    probe_bus_free(bus);
    model_free(m);
}

int main(void) {
    const char *dir = test_tmpdir("export");
    const char *model = test_shared("models/stories260k.gguf");
    const char *prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
                         "with her friends. One day, she saw a big red ball under a tree.";
    int n_predict = 12;
    struct stat sb;
    if (!model) {
        test_skip("stories260k not found under ../shared: using build/default-model.gguf");
        model = stat("build/default-model.gguf", &sb) == 0 ? "build/default-model.gguf" : NULL;
        n_predict = 6;
    }
    if (!model) { test_skip("no model: neither ../shared/models/stories260k.gguf nor build/default-model.gguf"); return test_report("test_export"); }
    if (stat(test_skv_bin(), &sb) != 0) { test_skip("no skv binary (set SKV_BIN or run make)"); return test_report("test_export"); }

    char trace[600], nbuf[16];
    snprintf(trace, sizeof trace, "%s/run.skvtrace", dir);
    snprintf(nbuf, sizeof nbuf, "%d", n_predict);
    char out[600], err[600];
    snprintf(out, sizeof out, "%s/run-out.txt", dir);
    snprintf(err, sizeof err, "%s/run-err.txt", dir);
    char *argv[] = { (char *)test_skv_bin(), "run", "-m", (char *)model, "-p", (char *)prompt, "-n", nbuf, "--kv", "shadowkv",
                     "--rank", "8", "--budget", "16", "--outliers", "1", "--local", "1", "--oracle", "--trace", trace, NULL };
    int rc = run(out, err, argv);
    test_cond("a sample trace is recorded with skv run --kv shadowkv --oracle --trace", rc == 0 && stat(trace, &sb) == 0);
    const char *help[] = { "--help", NULL };
    int has_export = export(dir, help) == 0;
    test_cond("skv export is a command (cmd_export in tui/main.c's table)", has_export);
    if (rc == 0 && has_export) test_exports(dir, trace);
    test_live_vs_replay(dir, model, prompt, n_predict);
    return test_report("test_export");
}
