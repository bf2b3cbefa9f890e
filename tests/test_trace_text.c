/* test_trace_text: a trace holds the text the run printed, token for token.
 *  - skv run -n N --trace: the N generated tokens are all in the trace (the
 *    last one, sampled after the last step, was missing), their text is the
 *    text on stdout, and the trace counts N - 1 steps (a token counts none);
 *    the same when a full context stops the run, in a compare run (every
 *    lane; a full context ends it as a single run, not with an error) and
 *    in a batch (every sequence; one that ended is fed nothing more);
 *  - skv trace info (and an inspector replay) says the options a policy put
 *    in force at other values than asked (rank 7 of a 7-token prompt);
 *  - a replay of a batch whose sequence ended follows the longest one and
 *    counts the tokens fed (tmux);
 *  - the Tokens view marks as disagreeing the token sampled from the logits
 *    whose sparse top-1 differed from dense (the step before the one that fed
 *    it), not the token fed at that step; the last token, fed to no step,
 *    is named so and a click on it selects it.
 * Runs on the committed demo model (no ../shared needed). */
#include "batch.h"
#include "canvas.h"
#include "lanes.h"
#include "model.h"
#include "paint.h"
#include "probe.h"
#include "sampler.h"
#include "session.h"
#include "skv.h"
#include "store.h"
#include "testhelp.h"
#include "trace.h"
#include "view.h"

#include <stdarg.h>
#include <sys/wait.h>

#define DEMO "samples/model/skv-demo.gguf"

static const char *dir;

/* The generated text of lane i of a trace (its tokens after the prompt),
 * into buf; the number of generated tokens, -1 when it does not load. */
static int lane_text(const char *path, int lane, char *buf, size_t n, int *n_steps, int *n_lanes) {
    probe_lanes *L = NULL;
    buf[0] = 0;
    if (probe_lanes_new(&L) || trace_load_lanes(path, L)) { probe_lanes_free(L); return -1; }
    *n_lanes = probe_lanes_count(L);
    probe_store *st = probe_lanes_store(L, lane);
    int gen = -1;
    if (st) {
        gen = 0;
        size_t len = 0;
        for (int i = 0; i < probe_store_n_tokens(st); i++) {
            const probe_ev_token *t = probe_store_token(st, i);
            if (t->step < 0) continue;
            gen++;
            if (len + (size_t)t->n_text < n) {
                memcpy(buf + len, t->text, (size_t)t->n_text);
                len += (size_t)t->n_text;
            }
        }
        buf[len] = 0;
        *n_steps = probe_store_n_steps(st);
    }
    probe_lanes_free(L);
    return gen;
}

/* The line of out after the line holding mark (the text skv printed), into buf. */
static void line_after(const char *out, const char *mark, char *buf, size_t n) {
    buf[0] = 0;
    const char *p = mark ? strstr(out, mark) : out;
    if (!p) return;
    if (mark && !(p = strchr(p, '\n'))) return;
    if (mark) p++;
    const char *e = strchr(p, '\n');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len >= n) len = n - 1;
    memcpy(buf, p, len);
    buf[len] = 0;
}

static void test_run_traces(void) {
    static char out[1 << 16];
    char path[1100], text[4096], want[4096];
    int steps = -1, lanes = 0;
    const char *bin = test_skv_bin();

    snprintf(path, sizeof path, "%s/run.trace", dir);
    int rc = test_popen(out, sizeof out,
                        "%s run -m " DEMO " -p 'Once upon a time' -n 5 --kv shadowkv --trace %s 2>/dev/null", bin, path);
    line_after(out, NULL, want, sizeof want);
    int gen = lane_text(path, 0, text, sizeof text, &steps, &lanes);
    test_cond("skv run -n 5 --trace: 5 generated tokens in the trace, their text the text printed, 4 steps",
              rc == 0 && gen == 5 && steps == 4 && !strcmp(text, want));
    rc = test_popen(out, sizeof out, "%s trace info %s 2>&1", bin, path);
    test_cond("skv trace info counts the 4 steps (not the last token's) and the 12 tokens",
              rc == 0 && strstr(out, "steps      4\n") && strstr(out, "token          12\n"));
    test_cond("skv trace info says the options in force where the policy clamped them (rank 7 of a 7-token prompt)",
              rc == 0 && strstr(out, "kv policy  shadowkv: budget=2048 rank=160 ") &&
                  strstr(out, "\n  in force   rank=7 (asked 160) outliers=0 (asked 48)\n"));

    char svg[1200];
    snprintf(svg, sizeof svg, "%s/tokens.svg", dir);
    rc = test_popen(out, sizeof out, "%s export %s --view tokens -o %s --force 2>&1", bin, path, svg);
    char *fig = NULL;
    size_t fn = 0;
    int got = rc == 0 && !skv_read_file(svg, 1 << 22, &fig, &fn);
    test_cond("skv export TRACE --view tokens -o FIG (the trace as the first argument, as the csv and chrome forms "
              "take it): the Tokens view counts the 5 generated tokens", got && strstr(fig, "7 prompt + 5 generated"));
    free(fig);
    rc = test_popen(out, sizeof out, "%s export %s extra --view tokens -o %s --force 2>&1", bin, path, svg);
    test_cond("skv export TRACE EXTRA --view ...: status 2, one line naming the extra argument",
              rc == 2 && strstr(out, "unexpected argument 'extra'") && strchr(out, '\n') == out + strlen(out) - 1);

    snprintf(path, sizeof path, "%s/full.trace", dir);
    rc = test_popen(out, sizeof out, "%s run -m " DEMO " -p 'Once upon a time' -n 10 -c 10 --trace %s 2>/dev/null",
                    bin, path);
    line_after(out, NULL, want, sizeof want);
    gen = lane_text(path, 0, text, sizeof text, &steps, &lanes);
    test_cond("a full context (-c 10, 7 prompt tokens): the 4th token, which no position was left to feed, is in the "
              "trace too; 3 steps",
              rc == 0 && gen == 4 && steps == 3 && !strcmp(text, want));

    snprintf(path, sizeof path, "%s/compare-full.trace", dir);
    rc = test_popen(out, sizeof out, "%s run -m " DEMO " -p 'Once upon a time' -n 10 -c 10 --kv dense,shadowkv --trace %s "
                    "2>&1", bin, path);
    gen = lane_text(path, 1, text, sizeof text, &steps, &lanes);
    test_cond("a compare run that fills its context stops as a single run does (no error, the table, 4 tokens over "
              "3 steps in each lane)",
              rc == 0 && strstr(out, "the context of 10 positions is full: generation stops here") &&
                  strstr(out, "shadowkv      3/3") && gen == 4 && steps == 3);

    snprintf(path, sizeof path, "%s/compare.trace", dir);
    rc = test_popen(out, sizeof out,
                    "%s run -m " DEMO " -p 'Once upon a time' -n 5 --kv dense,shadowkv --trace %s 2>/dev/null", bin, path);
    line_after(out, NULL, want, sizeof want);
    int ok = rc == 0;
    for (int i = 0; i < 2; i++) {
        gen = lane_text(path, i, text, sizeof text, &steps, &lanes);
        ok &= lanes == 2 && gen == 5 && steps == 4 && !strcmp(text, want);
    }
    test_cond("a compare run: each lane's trace holds the 5 tokens printed, over 4 steps", ok);
    rc = test_popen(out, sizeof out, "%s trace info %s 2>&1", bin, path);
    test_cond("skv trace info of a compare run: the clamped policy named on its in-force line, none for dense",
              rc == 0 && strstr(out, "\n  in force   shadowkv: rank=7 (asked 160)") && !strstr(out, "in force   dense"));

    snprintf(path, sizeof path, "%s/batch.trace", dir);
    rc = test_popen(out, sizeof out,
                    "%s run -m " DEMO " -p 'Once upon a time' -n 5 -np 2 --temp 1 --trace %s 2>/dev/null", bin, path);
    ok = rc == 0;
    for (int i = 0; i < 2; i++) {
        char mark[40];
        snprintf(mark, sizeof mark, "--- sequence %d ---", i);
        line_after(out, mark, want, sizeof want);
        gen = lane_text(path, i, text, sizeof text, &steps, &lanes);
        ok &= lanes == 2 && gen == 5 && steps == 4 && *want && !strcmp(text, want);
    }
    test_cond("a batch (-np 2): each sequence's trace holds the 5 tokens it printed, over 4 steps", ok);

    /* 8 sampled sequences of up to 60 tokens: on the demo model some end
     * (end of text) early; each lane's text is what its sequence printed */
    rc = test_popen(out, sizeof out, "%s run -m " DEMO " -p 'Once upon a time' -n 60 -np 8 --temp 1.2 --trace %s "
                    "--force 2>/dev/null", bin, path);
    ok = rc == 0;
    int ended = 0;
    for (int i = 0; i < 8 && ok; i++) {
        char mark[40], next[40];
        snprintf(mark, sizeof mark, "--- sequence %d ---\n", i);
        snprintf(next, sizeof next, "\n--- sequence %d ---", i + 1);
        const char *a = strstr(out, mark), *e = a && i < 7 ? strstr(a, next) : NULL;
        if (!a) { ok = 0; break; }
        a += strlen(mark);
        if (!e) e = a + strlen(a) - (a[0] && a[strlen(a) - 1] == '\n'); /* the last: to the end, less its newline */
        snprintf(want, sizeof want, "%.*s", (int)(e - a), a);
        gen = lane_text(path, i, text, sizeof text, &steps, &lanes);
        ok &= lanes == 8 && !strcmp(text, want) && steps == (gen < 60 ? gen : 59);
        ended += gen < 60;
    }
    printf("  (%d of 8 sequences ended before 60 tokens)\n", ended);
    test_cond("a batch of 8 sampled sequences: each lane's text is the text its sequence printed, and one that "
              "ended (end of text) has no steps past its end", ok);
}

/* The inspector replaying the batch of test_live_batch (in a tmux of its
 * own): it follows the sequences that ran longest (all 6 steps, though
 * sequence 0 ended after 2), and its rate counts the tokens fed, 14 over 6
 * steps, not 3 a step. */
static void replay_status(const char *trace) {
    char out[8192], sock[1200], cmd[3000];
    if (test_popen(out, sizeof out, "command -v tmux >/dev/null 2>&1")) { test_skip("no tmux: the replay's status line"); return; }
    snprintf(sock, sizeof sock, "%s/tmux.sock", dir);
    snprintf(cmd, sizeof cmd, "tmux -S %s -f /dev/null new-session -d -s r -x 150 -y 30 'TERM=xterm-256color %s inspect "
             "--replay %s; sleep 60' 2>&1", sock, test_skv_bin(), trace);
    int ok = test_popen(out, sizeof out, "%s", cmd) == 0, found = 0;
    for (int i = 0; ok && i < 50 && !found; i++) {
        test_popen(out, sizeof out, "sleep 0.2; tmux -S %s capture-pane -p -t r 2>&1", sock);
        found = strstr(out, "| steps 6") && strstr(out, "2.3 seqs a step");
    }
    test_popen(cmd, sizeof cmd, "tmux -S %s kill-server >/dev/null 2>&1", sock);
    test_cond("the replay of a batch whose sequence 0 ended: 6 steps (the longest sequence's), 2.3 sequences a step",
              found);
    if (!found) printf("  got: %s\n", out);
}

/* A traced batch of 3 forks in which sequence 0 ends after 2 of 6 steps
 * (batch_decode_live): it is fed nothing more, so its lane holds 2 steps and
 * 2 generated tokens, the others 6; the live ones decode as they would
 * alone; the shared matmuls' spans then go to the first live lane (seq 1);
 * the Timeline of the batch at step 5 draws them on its "all seqs" rows and
 * has no row for the ended sequence. */
static void test_live_batch(void) {
    enum { B = 3, T = 6, END = 2 };
    skv_model *m = NULL;
    probe_bus *bus = NULL;
    trace_writer *tw = NULL;
    char tpath[1100];
    snprintf(tpath, sizeof tpath, "%s/live.trace", dir);
    int rc = model_load(DEMO, &m);
    if (!rc) rc = probe_bus_new(&bus);
    if (!rc) rc = trace_writer_open(tpath, bus, &tw);
    session_opts so;
    session_opts_default(&so);
    snprintf(so.kv.policy, sizeof so.kv.policy, "shadowkv");
    so.kv.budget = 64;
    so.record_prefill = 1;
    so.bus = bus;
    skv_session *src = NULL, *seqs[B] = {0};
    int32_t ids[200], fed[B][T], alone[T];
    for (int i = 0; i < 200; i++) ids[i] = 1 + (i * 37) % (m ? m->cfg.vocab - 1 : 1);
    if (!rc) rc = session_new(m, &so, &src);
    if (!rc) rc = session_prefill(src, ids, 200, NULL, NULL);
    for (int i = 0; i < B && !rc; i++) {
        rc = session_fork(src, &so.kv, &seqs[i]);
        if (!rc) session_set_bus(seqs[i], bus);
    }
    /* what the sequence gives alone (no bus) */
    skv_session *one = NULL;
    if (!rc) rc = session_fork(src, &so.kv, &one);
    for (int t = 0; !rc && t < T; t++) rc = session_decode(one, alone[t] = sampler_argmax(session_logits(one),
                                                                                          m->cfg.vocab));
    session_free(one);
    skv_batch *b = NULL;
    if (!rc) rc = batch_new(seqs, B, &b);
    if (rc) for (int i = 0; i < B; i++) session_free(seqs[i]);
    for (int t = 0; !rc && t < T; t++) {
        int32_t tok[B];
        unsigned char live[B];
        for (int i = 0; i < B; i++) {
            fed[i][t] = tok[i] = sampler_argmax(session_logits(batch_seq(b, i)), m->cfg.vocab);
            live[i] = i != 0 || t < END;
        }
        rc = batch_decode_live(b, tok, live);
    }
    long rows = b ? batch_rows_fed(b) : -1;
    int s0 = b ? batch_seq(b, 0)->step : -1;
    batch_free(b);
    session_free(src);
    if (tw && rc) trace_writer_abort(tw);
    else if (tw) rc = trace_writer_close(tw);
    probe_bus_free(bus);
    int same = 1;
    for (int t = 0; t < T; t++)
        same &= fed[1][t] == alone[t] && fed[2][t] == alone[t] && (t >= END || fed[0][t] == alone[t]);
    test_cond("batch_decode_live: an ended sequence is fed nothing (2 steps, 14 rows in all); the live ones decode "
              "as alone", rc == 0 && rows == B * END + (B - 1) * (T - END) &&
                  s0 == END && same);
    probe_lanes *L = NULL;
    if (!rc) rc = probe_lanes_new(&L) || trace_load_lanes(tpath, L);
    int ok = rc == 0 && probe_lanes_count(L) == B, qkv_late = 0;
    for (int i = 0; ok && i < B; i++) {
        const probe_store *st = probe_lanes_store(L, i);
        int want = i == 0 ? END : T;
        ok &= probe_store_n_steps(st) == want && probe_store_n_tokens(st) - probe_store_n_prompt(st) == want;
    }
    for (int t = END; ok && t < T; t++) { /* the shared spans: the first live lane's */
        int n = 0;
        const probe_ev_span *sp = probe_store_spans(probe_lanes_store(L, 1), t, &n);
        for (int k = 0; sp && k < n; k++) qkv_late += !strcmp(sp[k].op, "qkv");
    }
    test_cond("its trace: the ended sequence's lane holds its 2 steps and tokens, the others 6; the shared matmuls "
              "go to the first live lane", ok && qkv_late == (T - END) * (m ? m->cfg.n_layers : 0));
    char *text = NULL;
    canvas *c = NULL;
    if (ok && !canvas_cells_new(&c, 120, 40, 0)) {
        const probe_store *st[B];
        const char *names[B] = {"seq 0", "seq 1", "seq 2"};
        for (int i = 0; i < B; i++) st[i] = probe_lanes_store(L, i);
        view_cursor cur;
        view_cursor_init(&cur);
        cur.batch = 1;
        cur.step = T - 1;
        if (!view_draw_lanes(view_find("timeline"), c, (canvas_rect){0, 0, 120, 40}, st, names, B, &cur, NULL))
            text = canvas_cells_text(c);
    }
    canvas_free(c);
    test_cond("the batch's Timeline at step 5: rows for seq 1 and 2 and the shared work, none for the ended seq 0, "
              "and its title says one ended",
              text && strstr(text, "all seqs") && strstr(text, "seq 1") && strstr(text, "seq 2") &&
                  !strstr(text, "seq 0") && strstr(text, "batched step 5 (1 ended)"));
    free(text);
    replay_status(tpath);
    probe_lanes_free(L);
    model_free(m);
}

static int add(probe_store *st, probe_event ev) { return probe_store_add(st, &ev); }

/* The fill of the SVG <text> element whose text is word ("" when none). */
static void fill_of(const char *svg, const char *word, char fill[8]) {
    char pat[64];
    snprintf(pat, sizeof pat, ">%s</text>", word);
    fill[0] = 0;
    const char *e = strstr(svg, pat);
    if (!e) return;
    const char *p = e;
    while (p > svg && strncmp(p, "<text", 5)) p--;
    const char *f = strstr(p, "fill=\"");
    if (f && f < e) snprintf(fill, 8, "%.7s", f + 6);
}

static void test_tokens_view(void) {
    /* 2 prompt tokens, steps 0..2 fed tokens a0 a1 a2 and the last, a3, fed to
     * none. Step 1's logits disagreed with dense: the token sampled from them
     * is a2 (fed at step 2). */
    probe_store *st = NULL;
    int bad = probe_store_new(&st);
    bad += add(st, (probe_event){.kind = PROBE_RUN, .run = {.model = "m", .n_layers = 1, .n_heads = 1, .n_kv_heads = 1,
                                                            .head_dim = 8, .max_ctx = 64, .prompt_len = 2,
                                                            .kv_policy = "shadowkv", .oracle = 1}});
    const char *words[] = {"p0", "p1", "a0", "a1", "a2", "a3"};
    for (int i = 0; i < 6; i++)
        bad += add(st, (probe_event){.kind = PROBE_TOKEN, .token = {.pos = i, .id = 10 + i, .step = i < 2 ? -1 : i - 2,
                                                                    .n_text = 2, .text = words[i]}});
    for (int s = 0; s < 3; s++)
        bad += add(st, (probe_event){.kind = PROBE_STEP, .step = {.step = s, .token = 12 + s, .seconds = 0.01,
                                                                  .has_oracle = 1, .top1_agree = s != 1}});
    char path[1100], f1[8], f2[8], f3[8], want[8], desc[8192] = "";
    snprintf(path, sizeof path, "%s/tokens.svg", dir);
    snprintf(want, sizeof want, "#%06x", palette_cat(3) & 0xFFFFFFu);
    canvas *c = NULL;
    view_cursor cur;
    view_cursor_init(&cur);
    char *svg = NULL;
    size_t n = 0;
    cur.step = 0; /* a0 highlighted: a1..a3 in their own colours */
    if (!bad && !canvas_svg_new(&c, 1000, 300, NULL) &&
        !view_find("tokens")->draw(c, (canvas_rect){0, 0, 1000, 300}, st, &cur, NULL) && !canvas_svg_save(c, path, 1))
        skv_read_file(path, 1 << 22, &svg, &n);
    canvas_free(c);
    c = NULL;
    f1[0] = f2[0] = f3[0] = 0;
    if (svg) { fill_of(svg, "a1", f1); fill_of(svg, "a2", f2); fill_of(svg, "a3", f3); }
    test_cond("Tokens view: the token sampled from step 1's disagreeing logits (a2, fed at step 2) is marked, not "
              "the one step 1 fed (a1); the run counts 4 generated tokens",
              svg && !strcmp(f2, want) && *f1 && strcmp(f1, want) && *f3 && strcmp(f3, want) &&
                  strstr(svg, "2 prompt + 4 generated") && strstr(svg, "agrees with dense on 2 of 3 steps"));
    free(svg);

    /* a click on a3 selects it (cursor token), and the header names it */
    view_cursor_init(&cur);
    paint_result res;
    int rc = 1;
    char *grid = NULL;
    if (!canvas_cells_new(&c, 80, 12, 0)) {
        rc = view_find("tokens")->draw(c, (canvas_rect){0, 0, 80, 12}, st, &cur, &res);
        grid = canvas_cells_text(c);
    }
    int x = -1, y = -1;
    for (int row = 0; grid && row < 12 && x < 0; row++) {
        const char *line = grid;
        for (int k = 0; k < row && line; k++) if ((line = strchr(line, '\n'))) line++;
        const char *hit = line ? strstr(line, "a3") : NULL;
        const char *eol = line ? strchr(line, '\n') : NULL;
        if (hit && (!eol || hit < eol)) { x = (int)(hit - line); y = row; }
    }
    free(grid);
    int r2 = x >= 0 && rc == 0 ? view_find("tokens")->click(&cur, st, &res, x + 0.5, y + 0.5) : 0;
    canvas_free(c);
    c = NULL;
    if (!canvas_cells_new(&c, 80, 12, 0)) {
        view_find("tokens")->draw(c, (canvas_rect){0, 0, 80, 12}, st, &cur, NULL);
        char *t = canvas_cells_text(c);
        if (t) snprintf(desc, sizeof desc, "%s", t);
        free(t);
    }
    canvas_free(c);
    test_cond("a click on the last token (fed to no step) selects it, and the header says it was fed to no step",
              rc == 0 && (r2 & VIEW_REDRAW) && cur.token == 5 && strstr(desc, "fed to no step"));
    probe_store_free(st);
}

static void test_in_force_pairs(void) {
    char b[200];
    int n = probe_pairs_in_force("budget=64 rank=160 chunk=8 name=x", "prompt_len=7 rank=7 chunk=8 k=0 name=y", b,
                                 sizeof b);
    test_cond("probe_pairs_in_force: the option whose statistic differs, with the value asked; equal, absent and "
              "non-numeric ones left out",
              n == 1 && !strcmp(b, "rank=7 (asked 160)"));
    n = probe_pairs_in_force("rank=16", "", b, sizeof b);
    test_cond("probe_pairs_in_force: no statistics, nothing differs", n == 0 && !b[0]);
    const char *odd = "rank=nan bits=1e300 chunk=-inf local=7";
    test_cond("probe_pairs_int: a value a trace may hold (nan, 1e300, -inf) is the default, not a cast out of range",
              probe_pairs_int(odd, "rank", -1, 0, 1 << 20) == -1 && probe_pairs_int(odd, "bits", 0, 1, 64) == 0 &&
                  probe_pairs_int(odd, "chunk", 0, 0, 1 << 20) == 0 && probe_pairs_int(odd, "local", -1, 0, 99) == 7);
}

int main(void) {
    dir = test_tmpdir("trace_text");
    test_in_force_pairs();
    FILE *f = fopen(DEMO, "rb");
    if (!f) test_skip("test_trace_text: the runs need " DEMO " (run from the repository root)");
    else {
        fclose(f);
        test_run_traces();
        test_live_batch();
    }
    test_tokens_view();
    return test_report("test_trace_text");
}
