/* cmd_inspect.c: `skv inspect`, the interactive inspector. It parses the
 * command line and does everything that can fail on bad input (flags, the
 * model, the prompt, the trace) before the terminal is touched, so such
 * errors are one line on stderr and a non-zero exit. Then it wires the
 * pieces of app.h together: a probe bus with a ring for the UI (and the
 * trace writer when --trace records), the engine worker thread, and the
 * curses loop; and it takes them apart again in the safe order (stop
 * listening, join the worker, close the trace, free).
 *
 * Three ways in:
 *   skv inspect                        the built-in default: a random-weight
 *                                      model and prompt, ShadowKV settings that fit
 *   skv inspect -m MODEL -p/-f ...     a live run of any model
 *   skv inspect --trace FILE           replay a recorded trace (no model) */
#include "app.h"
#include "cli.h"
#include "model.h"
#include "skv.h"
#include "tok.h"
#include "trace.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Ring slots between the worker and the UI: enough for a decode step of a
 * large model; a long prefill simply waits for the UI to drain. */
enum { RING_EVENTS = 8192 };

/* ShadowKV settings for the demo model and its needle prompt (about 2000
 * tokens): a budget of 64 tokens is 3% of the context, as in the paper. */
static const char *const default_flags[] = {
    "--kv", "shadowkv", "--rank", "16", "--budget", "64", "--outliers", "4", "--local", "4", "--oracle",
};

static void inspect_help(FILE *o) {
    fprintf(o,
            "usage: skv inspect [-m MODEL (-p TEXT | -f FILE)] [--record FILE] [options]\n"
            "       skv inspect --replay FILE         replay a recorded trace (no model needed)\n\n"
            "Steps through decoding one token at a time and shows what ShadowKV does in\n"
            "the terminal: spectra, chunk maps, selections, cache hits, timelines, tokens.\n"
            "Without -m it runs the built-in default: the trained demo model\n"
            "samples/model/skv-demo.gguf on samples/prompts/needle.txt (a value planted in\n"
            "a 2000-token haystack, asked for at the end) with --kv shadowkv --rank 16\n"
            "--budget 64 --outliers 4 --local 4 --oracle (flags given override). With -m and\n"
            "no --kv it runs ShadowKV at --budget 3%% of the prompt with --oracle (--kv dense\n"
            "for exact attention). The bottom line shows the prefill's progress, then the\n"
            "settings in force.\n"
            "--needle TEXT watches the needle TEXT of the prompt (the Needle view, the chunk\n"
            "map's needle lane, the oracle's needle rank); a file X.json beside a prompt X.txt\n"
            "with {\"needle\": TEXT} does the same (samples/prompts/needle.json, by default).\n"
            "--record FILE records the run into FILE while you inspect it (an existing FILE needs\n"
            "--force); --replay FILE shows a recorded run. --trace FILE guesses: it replays FILE\n"
            "when it exists and no -m, -p or -f is given, and records into it otherwise.\n\n"
            "keys:\n"
            "  space, n      step one token (replay: the next recorded step)\n"
            "  r             run / pause: keep stepping up to -n tokens or end of generation\n"
            "  tab, S-tab    next / previous view\n"
            "  [ ]           previous / next layer\n"
            "  { }           previous / next KV head\n"
            "  arrows, hjkl  move inside the view (left/right: step where the view does not)\n"
            "  g G           first / last step (G follows the newest step)\n"
            "  e             export the view to skv-VIEW-L#-H#-S#.png in the export folder\n"
            "                (--export-dir DIR; default skv-exports/ under the current directory,\n"
            "                made at the first export)\n"
            "  p             compare run (--kv a,b,...): one policy alone, the next, then all again\n"
            "                (--policy NAME starts on that one); batched run (skv run --parallel B\n"
            "                --trace): the next sequence (--seq N starts on sequence N)\n"
            "  ?             help overlay\n"
            "  q             quit (also Ctrl-C)\n"
            "  mouse         click selects a chunk, layer or step; click a tab to switch views\n\n"
            "The terminal must be at least 60x15; colours and Unicode are used when available.\n\n"
            "options:\n");
    cli_gen_help(o, CLI_HELP_SAMPLING | CLI_HELP_TRACE);
}

/* Parses argv into g; returns 0, or the exit status after a message. *n_gen
 * counts options other than --trace. */
/* --record FILE and --replay FILE say which one is meant; --trace FILE
 * guesses (replay an existing file, else record into it). */
static int record_flag, replay_flag;
static const char *policy_flag; /* --policy NAME: the lane shown at start in a compare run */
static int seq_flag = -1;       /* --seq N: the sequence shown at start in a batched trace */
static const char *needle_flag; /* --needle TEXT */
static const char *export_dir = "skv-exports"; /* --export-dir DIR: where e writes figures */

static int parse(cli_gen *g, int argc, char **argv, int *n_gen, int *help) {
    *n_gen = 0;
    *help = 0;
    record_flag = replay_flag = 0;
    seq_flag = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { *help = 1; return 0; }
        if (!strcmp(argv[i], "--needle")) {
            if (i + 1 >= argc || !argv[i + 1][0]) return cli_usage_error("inspect", "--needle needs the needle's text");
            needle_flag = argv[++i];
            (*n_gen)++;
            continue;
        }
        if (!strcmp(argv[i], "--policy")) {
            if (i + 1 >= argc || !argv[i + 1][0]) return cli_usage_error("inspect", "--policy needs a policy name");
            policy_flag = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--seq")) {
            char *end;
            long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
            if (i + 1 >= argc || *end || v < 0 || v >= PROBE_MAX_LANES)
                return cli_usage_error("inspect", "--seq expects a sequence number in [0, %d)", PROBE_MAX_LANES);
            seq_flag = (int)v;
            i++;
            continue;
        }
        if (!strcmp(argv[i], "--export-dir")) {
            if (i + 1 >= argc || !argv[i + 1][0]) return cli_usage_error("inspect", "--export-dir needs a folder");
            export_dir = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--record") || !strcmp(argv[i], "--replay")) {
            if (i + 1 >= argc) return cli_usage_error("inspect", "%s needs a trace file", argv[i]);
            if (record_flag || replay_flag || g->trace)
                return cli_usage_error("inspect", "give one of --record, --replay and --trace");
            *(argv[i][4] == 'c' ? &record_flag : &replay_flag) = 1;
            g->trace = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--trace") && (record_flag || replay_flag))
            return cli_usage_error("inspect", "give one of --record, --replay and --trace");
        int is_trace = !strcmp(argv[i], "--trace");
        int r = cli_gen_option(g, argc, argv, &i);
        if (r < 0) return 2;
        if (r == CLI_DONE) return 0;
        if (r == 0) return cli_usage_error("inspect", "unknown option '%s'", argv[i]);
        if (!is_trace) (*n_gen)++;
    }
    return 0;
}

/* The directory of the running executable into dir; 0 or -1. */
static int exe_dir(char *dir, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", dir, cap - 1);
    if (n <= 0) return -1;
    dir[n] = 0;
    char *s = strrchr(dir, '/');
    if (!s) return -1;
    *s = 0;
    return 0;
}

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Finds the first existing file among dir/rel for the candidate dirs
 * (relative to the executable's directory, then the current directory). */
static int find_default(const char *const *rels, int n, char *out, size_t cap, char *tried, size_t tcap) {
    char dir[PATH_MAX];
    int have = exe_dir(dir, sizeof dir) == 0;
    tried[0] = 0;
    for (int i = 0; i < n; i++) {
        if (have) snprintf(out, cap, "%s/%s", dir, rels[i]);
        else snprintf(out, cap, "%s", rels[i]);
        if (exists(out)) return 0;
        if (!tried[0]) snprintf(tried, tcap, "%s", out);
    }
    return -1;
}

/* Sets g up for the built-in default model and prompt, then re-applies the
 * user's flags over it so that any of them overrides the preset. */
static int use_default(cli_gen *g, int argc, char **argv, char *model, char *prompt, size_t cap) {
    static const char *const model_rel[] = {"samples/model/skv-demo.gguf", "../samples/model/skv-demo.gguf"};
    static const char *const prompt_rel[] = {"samples/prompts/needle.txt", "../samples/prompts/needle.txt"};
    char tried[PATH_MAX + 64];
    if (find_default(model_rel, 2, model, cap, tried, sizeof tried)) {
        fprintf(stderr, "skv inspect: no -m MODEL given and the default model %s is missing\n", tried);
        return 1;
    }
    int have_prompt = g->prompt || g->prompt_file;
    if (!have_prompt && find_default(prompt_rel, 2, prompt, cap, tried, sizeof tried)) {
        if (exists("samples/prompts/needle.txt")) snprintf(prompt, cap, "samples/prompts/needle.txt");
        else {
            fprintf(stderr, "skv inspect: no prompt given and the default prompt %s is missing\n", tried);
            return 1;
        }
    }
    cli_gen_free(g);
    cli_gen_default(g);
    char **args = (char **)default_flags;
    int na = (int)(sizeof default_flags / sizeof default_flags[0]);
    for (int i = 0; i < na; i++)
        if (cli_gen_option(g, na, args, &i) != 1) return 2;
    cli_gen_forget_flags(g); /* the preset's flags need not apply to a --kv the user gives */
    int n_gen, help;
    int rc = parse(g, argc, argv, &n_gen, &help);
    if (rc) return rc;
    g->model = model;
    if (!have_prompt) g->prompt_file = prompt;
    return 0;
}

/* The inspector is a ShadowKV inspector: with -m but no --kv it runs
 * ShadowKV at a budget of 3% of the prompt with the oracle (its other
 * options at their defaults); the user's flags apply over that. */
static const char *const model_flags[] = {"--kv", "shadowkv", "--budget", "3%", "--oracle"};

static int use_model_preset(cli_gen *g, int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--kv")) return 0;
    cli_gen_free(g);
    cli_gen_default(g);
    char **args = (char **)model_flags;
    int na = (int)(sizeof model_flags / sizeof model_flags[0]);
    for (int i = 0; i < na; i++)
        if (cli_gen_option(g, na, args, &i) != 1) return 2;
    int n_gen, help;
    return parse(g, argc, argv, &n_gen, &help);
}

static int need_tty(void) {
    if (isatty(STDOUT_FILENO) && isatty(STDIN_FILENO)) return 0;
    fprintf(stderr, "skv inspect: %s is not a terminal; the inspector needs one (try skv run, or skv trace info)\n",
            isatty(STDOUT_FILENO) ? "stdin" : "stdout");
    return 1;
}

/* A trace from another writer (probes/python/skvtrace, say) may hold only
 * some kinds of events: the views that draw from a kind none of its lanes
 * holds get no tab. Returns their bits (view_classes order) and appends one
 * line to notice: who wrote the trace (who), and which views are left out
 * for want of which events (also printed before the inspector starts). A
 * trace skv wrote keeps every tab (its views say what they miss). */
static unsigned foreign_views(const char *who, const probe_lanes *lanes, char *notice, size_t n) {
    char line[900];
    unsigned hidden = 0;
    size_t at = (size_t)snprintf(line, sizeof line, "trace written by %s", who);
    int nh = 0;
    for (int i = 0; view_classes[i] && i < 32; i++) {
        const view_class *vc = view_classes[i];
        if (!view_available(vc) || !vc->needs) continue;
        uint64_t have = 0;
        for (int l = 0; l < probe_lanes_count(lanes); l++) have += probe_store_count(probe_lanes_store(lanes, l), vc->needs);
        if (have) continue;
        hidden |= 1u << i;
        if (at < sizeof line)
            at += (size_t)snprintf(line + at, sizeof line - at, "%s%s (no %s events)", nh++ ? ", " : "; no tab for ",
                                   vc->title, probe_kind_name(vc->needs));
    }
    cli_msg("%s\n", line);
    size_t k = strlen(notice);
    if (k + 4 < n) snprintf(notice + k, n - k, "%s%s", k ? " | " : "", line);
    return hidden;
}

/* --policy NAME against the policies a replayed trace holds: 0 when one of
 * its lanes ran it, else one line listing them (a policy once) and 2. */
static int check_policy_lane(const probe_lanes *lanes, const char *path) {
    if (!policy_flag) return 0;
    char all[400] = "";
    size_t len = 0;
    for (int i = 0; i < probe_lanes_count(lanes); i++) {
        const char *p = probe_lanes_policy(lanes, i);
        if (!strcmp(p, policy_flag)) return 0;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(probe_lanes_policy(lanes, j), p);
        if (!seen && len < sizeof all)
            len += (size_t)snprintf(all + len, sizeof all - len, "%s%s", len ? ", " : "", p[0] ? p : "?");
    }
    fprintf(stderr, "skv inspect: --policy %s: %s has no such policy (it has: %s)\n", policy_flag, path, all);
    return 2;
}

/* Appends to notice what each policy of the trace put in force at other
 * values than asked (its first step's statistics: a short prompt clamps
 * the rank), as the live inspector says it after the prefill. */
static void in_force_notice(const probe_lanes *lanes, char *notice, size_t n) {
    int nl = probe_lanes_batched(lanes) ? 1 : probe_lanes_count(lanes); /* a batch's sequences share one policy */
    for (int i = 0; i < nl; i++) {
        const probe_store *st = probe_lanes_store(lanes, i);
        const probe_ev_run *run = probe_store_run(st);
        const probe_ev_step *e = probe_store_step(st, 0);
        char d[300];
        if (!run || !e || !probe_pairs_in_force(run->kv_opts, e->kv_stats, d, sizeof d)) continue;
        size_t k = strlen(notice);
        if (k + 4 < n)
            snprintf(notice + k, n - k, "%sin force: %s: %s", k ? " | " : "", run->kv_policy ? run->kv_policy : "?", d);
    }
}

static int replay(const char *path) {
    probe_lanes *lanes = NULL;
    if (probe_lanes_new(&lanes)) return cli_fail();
    char who[300];
    int foreign = 0;
    if (trace_load_lanes_writer(path, lanes, who, sizeof who, &foreign)) {
        probe_lanes_free(lanes);
        return cli_fail();
    }
    if ((seq_flag >= 0 && cli_check_seq("inspect", lanes, path, seq_flag)) || check_policy_lane(lanes, path)) {
        probe_lanes_free(lanes);
        return 2;
    }
    char notice[1400] = "";
    if (*trace_last_notice()) {
        snprintf(notice, sizeof notice, "%s", trace_last_notice());
        cli_msg("warning: %s\n", notice);
    }
    unsigned hidden = foreign ? foreign_views(who, lanes, notice, sizeof notice) : 0;
    in_force_notice(lanes, notice, sizeof notice);
    if (need_tty() || app_open()) { probe_lanes_free(lanes); return 1; }
    app_opts o = {.lanes = lanes, .wake_fd = -1, .replay_path = path, .notice = notice, .export_dir = export_dir,
                  .policy = policy_flag, .has_seq = seq_flag >= 0, .seq = seq_flag, .hidden = hidden};
    int rc = app_run(&o);
    probe_lanes_free(lanes);
    return rc;
}

/* The needle of the prompt: --needle TEXT, else "needle" of the sidecar
 * X.json beside a prompt file X.txt (samples/prompts/needle.json for the
 * default session). Copies it into buf; 0 when there is none. */
static int needle_text(const cli_gen *g, char *buf, size_t cap) {
    if (needle_flag) {
        snprintf(buf, cap, "%s", needle_flag);
        return 1;
    }
    const char *pf = g->prompt_file;
    size_t n = pf ? strlen(pf) : 0;
    if (n < 5 || strcmp(pf + n - 4, ".txt") || n + 2 > PATH_MAX) return 0;
    char side[PATH_MAX + 8];
    snprintf(side, sizeof side, "%.*s.json", (int)(n - 4), pf);
    char *js = NULL;
    size_t jn = 0;
    if (skv_read_file(side, 1 << 20, &js, &jn)) return 0;
    cJSON *o = cJSON_ParseWithLength(js, jn);
    free(js);
    const cJSON *nd = cJSON_GetObjectItemCaseSensitive(o, "needle");
    int ok = cJSON_IsString(nd) && nd->valuestring[0];
    if (ok) snprintf(buf, cap, "%s", nd->valuestring);
    else if (o) fprintf(stderr, "skv inspect: warning: %s has no \"needle\" text; no needle is watched\n", side);
    cJSON_Delete(o);
    return ok;
}

/* The needle's token span [*b, *e) in the prompt (tokens of the text before
 * it, and through it); 0 when the text is not in the prompt. */
static int needle_span(const skv_model *m, const char *text, int add_bos, const char *needle, int *b, int *e) {
    const char *at = strstr(text, needle);
    if (!at) return 0;
    int32_t *ids = NULL;
    int n0 = 0, n1 = 0;
    size_t off = (size_t)(at - text), len = strlen(needle);
    if (tok_encode(m->tok, text, off, add_bos, 1, &ids, &n0)) return 0;
    free(ids);
    ids = NULL;
    if (tok_encode(m->tok, text, off + len, add_bos, 1, &ids, &n1)) return 0;
    free(ids);
    if (n1 <= n0) return 0;
    *b = n0;
    *e = n1;
    return 1;
}

/* A live run: everything that can fail on input happens before app_run. */
static int live(cli_gen *g) {
    int engine_failed = 0; /* the worker stopped on an error: said after the inspector closes, status 1 */
    const char *text = cli_prompt_text(g);
    if (!text) return 2;
    if (g->threads) skv_set_threads(g->threads);
    skv_model *m = NULL;
    if (model_load(g->model, &m)) return cli_fail();
    cli_ctx_warning(g, m);
    int32_t *ids = NULL;
    int n = 0, rc = 0;
    int add_bos = tok_add_bos(m->tok) && !g->no_bos;
    probe_bus *bus = NULL;
    probe_lanes *lanes = NULL;
    probe_sub *ring = NULL;
    trace_writer *tw = NULL;
    compare_run *c = NULL;
    tui_worker *w = NULL;
    int wake[2] = {-1, -1};
    if (tok_encode(m->tok, text, strlen(text), add_bos, 1, &ids, &n)) { rc = cli_fail(); goto out; }
    if (n == 0) { cli_msg("the prompt is empty after tokenization\n"); rc = 1; goto out; }
    if (probe_bus_new(&bus) || probe_lanes_new(&lanes) || probe_subscribe_ring(bus, PROBE_ALL, RING_EVENTS, &ring)) {
        rc = cli_fail();
        goto out;
    }
    g->s.bus = bus;
    char needle[512];
    int nb = 0, ne = 0;
    if (needle_text(g, needle, sizeof needle)) {
        if (needle_span(m, text, add_bos, needle, &nb, &ne)) {
            g->s.kv.watch_begin = nb;
            g->s.kv.watch_end = ne;
        } else {
            fprintf(stderr, "skv inspect: the needle \"%s\" is not in the prompt; no needle is watched\n", needle);
        }
    }
    if (g->n_kv <= 1) {
        g->n_kv = 1;
        snprintf(g->kv_list[0], sizeof g->kv_list[0], "%.31s", g->s.kv.policy);
    }
    if (compare_new(m, &g->s, g->kv_list, g->n_kv, &c)) { rc = cli_fail(); goto out; }
    if (n > c->s[0]->o.ctx) {
        cli_msg("the prompt has %d tokens, more than the context of %d (raise it with -c)\n", n,
                c->s[0]->o.ctx);
        rc = 1;
        goto out;
    }
    if ((rc = need_tty())) goto out;
    if (g->trace && (rc = cli_check_output("inspect", g->trace, g->force))) goto out;
    if (g->trace && trace_writer_open(g->trace, bus, &tw)) { rc = cli_fail(); goto out; }
    if (pipe(wake)) {
        fprintf(stderr, "skv inspect: cannot create a pipe: %s\n", strerror(errno));
        rc = 1;
        goto out;
    }
    for (int i = 0; i < 2; i++) {
        fcntl(wake[i], F_SETFL, fcntl(wake[i], F_GETFL) | O_NONBLOCK);
        fcntl(wake[i], F_SETFD, FD_CLOEXEC);
    }
    /* the settings in force, on screen at the start */
    char settings[600] = "";
    for (int i = 0, len = 0; i < c->n && len < (int)sizeof settings; i++) {
        const kv_class *p = kv_policy_find(c->policy[i]);
        char opts[300] = "";
        if (p) kv_opts_describe(&g->s.kv, p, n, opts, sizeof opts);
        len += snprintf(settings + len, sizeof settings - len, "%s%s%s%s", i ? "; " : "", c->policy[i],
                        opts[0] ? ": " : "", opts);
    }
    if ((rc = app_open())) goto out;
    if (tui_worker_start(c, ids, n, g->n_predict, wake[1], &w)) {
        app_close();
        rc = cli_fail();
        goto out;
    }
    c = NULL; /* the worker owns them now */
    ids = NULL;
    char label[160];
    snprintf(label, sizeof label, "%s", m->cfg.name[0] ? m->cfg.name : m->path);
    app_opts o = {.lanes = lanes, .ring = ring, .worker = w, .wake_fd = wake[0], .model_label = label, .export_dir = export_dir,
                  .random_weights = m->random_weights, .trace_path = g->trace, .notice = settings,
                  .policy = policy_flag};
    rc = app_run(&o);
    /* Stop listening first: the worker may be blocked on a full ring. */
    probe_unsubscribe(ring);
    ring = NULL;
    tui_worker_status ws;
    tui_worker_status_get(w, &ws);
    if (ws.state == TUI_W_PREFILL)
        fprintf(stderr, "skv inspect: waiting for the prefill to finish (%d/%d tokens) before exiting\n",
                ws.prefill_done, ws.prefill_total);
    tui_worker_free(w);
    w = NULL;
    if (ws.state == TUI_W_FAILED) {
        fprintf(stderr, "skv inspect: the engine stopped: %s\n", ws.error);
        engine_failed = 1;
    }
out:
    if (ring) probe_unsubscribe(ring);
    tui_worker_free(w);
    if (tw) { /* kept after q or a quit signal (a clean stop); dropped after an error */
        if (rc && rc < 128) trace_writer_abort(tw);
        else if (trace_writer_close(tw)) rc = cli_fail();
        else cli_msg("trace written to %s\n", g->trace);
    }
    compare_free(c);
    probe_bus_free(bus);
    probe_lanes_free(lanes);
    for (int i = 0; i < 2; i++)
        if (wake[i] >= 0) close(wake[i]);
    free(ids);
    model_free(m);
    return rc ? rc : engine_failed; /* the trace of what ran before a failure is kept, the status says it */
}

int cmd_inspect(int argc, char **argv) {
    setlocale(LC_ALL, "");
    setlocale(LC_NUMERIC, "C"); /* numbers in files and on screen keep their '.' */
    cli_gen g;
    cli_gen_default(&g);
    int n_gen, help;
    int rc = parse(&g, argc, argv, &n_gen, &help);
    if (help) { inspect_help(stdout); return 0; }
    if (rc) return rc;
    /* --trace FILE alone replays FILE. With run options but no model or
     * prompt it records the default run into FILE, but never over an
     * existing file: that one was more likely meant to be replayed. */
    struct stat sb;
    int replaying = replay_flag || (!record_flag && g.trace && !g.model && !g.prompt && !g.prompt_file &&
                                    stat(g.trace, &sb) == 0);
    if (replay_flag && (n_gen || g.model)) {
        cli_gen_free(&g);
        return cli_usage_error("inspect", "--replay FILE shows a recorded run: it takes no model or run options");
    }
    if (replaying) {
        if (n_gen) {
            cli_gen_free(&g);
            return cli_usage_error("inspect", "%s exists: with --trace FILE alone inspect replays it; to record a new "
                                   "run give another FILE", g.trace);
        }
        rc = replay(g.trace);
        cli_gen_free(&g);
        return rc;
    }
    char model[PATH_MAX + 64], prompt[PATH_MAX + 64];
    int user_model = g.model != NULL;
    if (!g.model && (rc = use_default(&g, argc, argv, model, prompt, sizeof model))) {
        cli_gen_free(&g);
        return rc;
    }
    if (user_model && (rc = use_model_preset(&g, argc, argv))) {
        cli_gen_free(&g);
        return rc;
    }
    if ((rc = cli_check_policy_flags(&g, "inspect", NULL, 0))) {
        cli_gen_free(&g);
        return rc;
    }
    if (seq_flag >= 0) {
        cli_gen_free(&g);
        return cli_usage_error("inspect", "--seq picks a sequence of a batched trace: give it with --replay FILE");
    }
    if (policy_flag) { /* the lane shown first: one of the run's policies */
        int found = g.n_kv <= 1 ? !strcmp(g.s.kv.policy, policy_flag) : 0;
        char all[300] = "";
        size_t len = 0;
        for (int i = 0; i < g.n_kv && !found; i++) found = !strcmp(g.kv_list[i], policy_flag);
        for (int i = 0; i < (g.n_kv > 1 ? g.n_kv : 1) && !found && len < sizeof all; i++)
            len += (size_t)snprintf(all + len, sizeof all - len, "%s%s", i ? ", " : "",
                                    g.n_kv > 1 ? g.kv_list[i] : g.s.kv.policy);
        if (!found) {
            cli_gen_free(&g);
            return cli_usage_error("inspect", "--policy %s: this run's policies are %s (--kv a,b,... sets them)",
                                   policy_flag, all);
        }
    }
    rc = live(&g);
    cli_gen_free(&g);
    return rc;
}
