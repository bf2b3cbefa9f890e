/* cmd_needle.c: `skv needle`, the needle-in-a-haystack command. It parses
 * the command line, checks every input and output path before any work,
 * runs the sweep of engine/needle.h (dense and ShadowKV on the same
 * prompts), prints the length x depth table, and writes what was asked:
 * --explain prints the diagnosis of every ShadowKV miss, --json every case
 * (with the diagnoses), --png the side-by-side NIAH heatmap drawn by the
 * niah view, and --trace the probe events of one explained case followed by
 * every case's PROBE_NIAH event, so that `skv inspect --trace` and
 * `skv export --view needle|niah` show the same thing later. Existing
 * outputs are kept unless --force. */
#include "cli.h"
#include "model.h"
#include "needle.h"
#include "needle_out.h"
#include "skv.h"
#include "store.h"
#include "trace.h"
#include "view.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define NEEDLE_PNG_W 1400
#define NEEDLE_PNG_H 600

static void needle_help(FILE *o) {
    fprintf(o,
            "usage: skv needle [-m MODEL] [--lengths 1k,2k,4k] [--depths 0:100:10] [options]\n\n"
            "Needle in a haystack: places a needle sentence with a random seven-digit value at\n"
            "each depth of a haystack trimmed to each length (in tokens), asks for the value at\n"
            "the end, and scores exact retrieval in the greedy answer under dense attention and\n"
            "under each KV policy of --kv on the same prompts. Prints a table of length x depth;\n"
            "with --explain, the diagnosis of every miss of a sparse policy (docs/NEEDLE.md).\n"
            "Without -m it uses the trained demo model samples/model/skv-demo.gguf (4096\n"
            "positions) with the preset --lengths 1k,2k,3k,4000 --rank 16 --budget 3%%\n"
            "--outliers 4 --local 4; flags given override it.\n\n"
            "  -m, --model PATH      GGUF file or HF directory\n"
            "      --lengths LIST    prompt lengths in tokens, k = 1024 (default 1k,2k,4k with -m; the\n"
            "                        demo preset above without it)\n"
            "      --depths LIST     needle depths in percent: START:STOP:STEP or a list (default 0:100:10)\n"
            "      --haystack FILE   plain text to fill the prompt (default samples/haystack.txt)\n"
            "      --task NAME       what to plant and ask: single (the default needle), passkey (a pass key\n"
            "                        stated twice), multikey (2-4 keyed facts, one asked, the others\n"
            "                        distractors), multikey-alt (their second phrasing); the demo model\n"
            "                        was trained on all four. A distractor's value is named as such.\n"
            "      --task-file FILE  tasks as JSON Lines (docs/EVAL.md); --task NAME picks one\n"
            "      --needle TEXT     the needle, with {value} (default \"%s\")\n"
            "      --question TEXT   asked after the haystack (default \"%s\")\n"
            "      --answer-prefix T text after the question that the answer continues\n"
            "                        (default: the needle's text before {value}; \"\" for none)\n"
            "      --answer-tokens N tokens generated per answer (default: the value's tokens + 4)\n"
            "      --runs N          repetitions per cell, each with a new value (default 1)\n"
            "      --seed S          seed of the values (default 0)\n"
            "      --kv LIST         the policies to sweep, comma-separated; dense always runs first\n"
            "                        (default dense,shadowkv; skv run --kv help lists them)\n"
            "      --explain         diagnose every miss of a sparse policy (runs the oracle beside it)\n"
            "      --verbose         with --explain or --diagnose: the tables behind each verdict\n"
            "      --oracle          run the oracle without printing the diagnoses (JSON gets them)\n"
            "      --json FILE       write every case (and the diagnoses) as JSON\n"
            "      --png FILE        write the NIAH heatmap, one panel per policy\n"
            "      --diagnose FILE   explain the miss recorded in a trace (from --trace), without the model\n"
            "      --trace FILE      record the explained case's probes and all results (for skv inspect\n"
            "                        --trace and skv export --view needle|niah)\n"
            "      --no-check        with --explain: do not rerun each miss with its proposed fixes (the\n"
            "                        verdict then says they are unchecked; faster for big sweeps)\n"
            "      --case N          run case N of the sweep alone, as the full sweep runs it (same value,\n"
            "                        depth, length and seed): the command --explain prints replays a case\n"
            "      --trace-case N    the case whose probes --trace keeps (the case numbers of --explain;\n"
            "                        default: the first miss of a sparse policy)\n"
            "      --force           replace existing output files\n"
            "Policy settings, as for skv run: --budget B (tokens per KV head, or B%% of the prompt),\n"
            "--kv-opt KEY=VALUE, and each policy's own flags (skv run --kv help)\n"
            "  -c, --ctx N           context positions (default: each prompt plus its answer)\n"
            "  -b, --batch N         prefill batch size (default 512)\n"
            "  -t, --threads N       worker threads (default: one per physical core, as llama.cpp)\n"
            "      --no-bos          do not add the BOS token\n\n"
            "Exit status: 0 when the sweep ran (misses included), 1 on a failure, 2 on a bad command line.\n",
            NEEDLE_DEFAULT_NEEDLE, NEEDLE_DEFAULT_QUESTION);
}

/* ---- results ----------------------------------------------------------------- */

typedef struct {
    int explain;
    int verbose;            /* --verbose: the tables behind each verdict */
    double t0;              /* when the sweep started (skv_now) */
    int partial;            /* the sweep was interrupted: outputs hold the finished cases */
    int n_total;            /* cases in the sweep */
    const needle_opts *o;
    cJSON **diag;           /* (n_total, NEEDLE_MAX_METHODS) diagnosis per case and method, or NULL */
    int only_case;          /* --case N: the one case run, -1 for all */
    char replay[1024];      /* the sweep's command line without its outputs: + "--case N" replays case N */
} run_state;

/* The sweep's command line, without what writes files or picks cases
 * (--json, --png, --trace, --trace-case, --case, --force, --explain,
 * --verbose), each word quoted when it needs it, into buf. */
static void replay_base(int argc, char **argv, char *buf, size_t n) {
    static const char *const drop_v[] = { "--json", "--png", "--trace", "--trace-case", "--case" };
    static const char *const drop[] = { "--force", "--explain", "--verbose", "--no-check" };
    size_t len = (size_t)snprintf(buf, n, "skv needle");
    for (int i = 1; i < argc && len < n; i++) {
        int skip = 0;
        for (size_t k = 0; k < sizeof drop_v / sizeof drop_v[0]; k++)
            if (!strcmp(argv[i], drop_v[k])) skip = 2;
        for (size_t k = 0; k < sizeof drop / sizeof drop[0]; k++)
            if (!strcmp(argv[i], drop[k])) skip = 1;
        if (skip) { i += skip - 1; continue; }
        const char *a = argv[i];
        int plain = *a != 0;
        for (const char *q = a; *q; q++)
            plain &= (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
                     strchr("-_=.,:/%+", *q) != NULL;
        if (plain) len += (size_t)snprintf(buf + len, n - len, " %s", a);
        else {
            len += (size_t)snprintf(buf + len, n - len, " '");
            for (const char *q = a; *q && len < n; q++)
                len += (size_t)snprintf(buf + len, n - len, *q == '\'' ? "'\\''" : "%c", *q);
            if (len < n) len += (size_t)snprintf(buf + len, n - len, "'");
        }
    }
}

/* The command that replays case c alone, with --explain (into buf). */
static void replay_command(const run_state *rs, int index, char *buf, size_t n) {
    snprintf(buf, n, "%s --case %d --explain", rs->replay, index);
}

/* --case N: every case but N is skipped (its value, depth and seed stay
 * those of the full sweep, which come from the case number). */
static int skip_but(const needle_case *c, void *user) {
    const run_state *rs = user;
    return rs->only_case >= 0 && c->index != rs->only_case;
}

static cJSON *report_json(const needle_report *rep) {
    cJSON *d = cJSON_CreateObject();
    if (!d) return NULL;
    cJSON *v = cJSON_AddArrayToObject(d, "verdict");
    for (int i = 0; v && i < rep->n_causes; i++) {
        const needle_cause *c = &rep->causes[i];
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddStringToObject(o, "cause", needle_cause_name(c->kind));
        cJSON_AddNumberToObject(o, "score", c->score);
        cJSON_AddNumberToObject(o, "step", c->step);
        cJSON_AddNumberToObject(o, "layer", c->layer);
        cJSON_AddNumberToObject(o, "head", c->head);
        cJSON_AddNumberToObject(o, "chunk", c->chunk);
        cJSON_AddStringToObject(o, "evidence", c->evidence);
        cJSON_AddStringToObject(o, "fix", c->fix);
        if (c->opt[0]) {
            cJSON *ch = cJSON_AddObjectToObject(o, "change");
            if (ch) {
                cJSON_AddStringToObject(ch, "option", c->opt);
                cJSON_AddNumberToObject(ch, "value", c->value);
            }
        }
        cJSON_AddBoolToObject(o, "dense_needed", c->dense_needed);
        cJSON_AddBoolToObject(o, "weak_evidence", c->weak);
        cJSON_AddStringToObject(o, "check", c->check == NEEDLE_CHECK_RETRIEVED ? "retrieved"
                                            : c->check == NEEDLE_CHECK_MISSED ? "missed" : "unchecked");
        if (c->check != NEEDLE_CHECK_NONE) cJSON_AddStringToObject(o, "check_answer", c->check_answer);
        if (c->opt[0] && c->value != c->proposed) cJSON_AddNumberToObject(o, "proposed", c->proposed);
        cJSON *tr = c->n_tries ? cJSON_AddArrayToObject(o, "tries") : NULL; /* every rerun, in order */
        for (int t = 0; tr && t < c->n_tries; t++) {
            cJSON *one = cJSON_CreateObject();
            if (!one) break;
            cJSON_AddNumberToObject(one, "value", c->tries[t].value);
            cJSON_AddBoolToObject(one, "retrieved", c->tries[t].hit);
            cJSON_AddStringToObject(one, "answer", c->tries[t].answer);
            cJSON_AddItemToArray(tr, one);
        }
        cJSON_AddItemToArray(v, o);
    }
    cJSON_AddStringToObject(d, "kept", rep->kept);
    cJSON_AddStringToObject(d, "divergence", rep->divergence);
    cJSON_AddNumberToObject(d, "diverge_step", rep->diverge_step);
    cJSON_AddNumberToObject(d, "judged_steps", rep->last_step + 1);
    cJSON *sh = cJSON_AddObjectToObject(d, "needle_mass_share");
    if (sh) {
        cJSON_AddNumberToObject(sh, "dropped", rep->share_dropped);
        cJSON_AddNumberToObject(sh, "low_precision", rep->share_lowbit);
        cJSON_AddNumberToObject(sh, "misranked", rep->share_misranked);
        cJSON_AddNumberToObject(sh, "dropped_near_local", rep->share_near_local);
        cJSON_AddNumberToObject(sh, "selected", rep->share_selected);
        cJSON_AddNumberToObject(sh, "outlier", rep->share_outlier);
        cJSON_AddNumberToObject(sh, "local", rep->share_local);
    }
    cJSON_AddNumberToObject(d, "key_err_selected", rep->key_err_selected);
    return d;
}

/* A sparse method that missed beside one that found the needle: where
 * their kept sets parted on the needle's tokens (needle_diverge), printed
 * with --explain and added to the missed method's JSON diagnosis. */
static int compare_misses(run_state *rs, const needle_case *c) {
    const needle_opts *o = rs->o;
    for (int b = 1; b < o->n_methods; b++) {
        if (c->hit[b] || !c->store[b]) continue;
        for (int a = 1; a < o->n_methods; a++) {
            if (!c->hit[a] || !c->store[a]) continue;
            needle_split sp;
            int rc = needle_diverge(c->store[a], o->methods[a], c->store[b], o->methods[b], &sp);
            if (rs->explain) printf("case %d: %s found the needle, %s missed it. %s\n\n", c->index, o->methods[a],
                                    o->methods[b], sp.text);
            size_t slot = (size_t)c->index * NEEDLE_MAX_METHODS + b;
            cJSON *d = rs->diag && c->index < rs->n_total ? rs->diag[slot] : NULL;
            if (!d) continue;
            cJSON *arr = cJSON_GetObjectItem(d, "diverged_from");
            if (!arr && !(arr = cJSON_AddArrayToObject(d, "diverged_from"))) return skv_error(SKV_ENOMEM, "out of memory");
            cJSON *e = cJSON_CreateObject();
            if (!e) return skv_error(SKV_ENOMEM, "out of memory");
            cJSON_AddStringToObject(e, "policy", o->methods[a]);
            cJSON_AddBoolToObject(e, "found", rc == 0);
            cJSON_AddNumberToObject(e, "step", sp.step);
            cJSON_AddNumberToObject(e, "layer", sp.layer);
            cJSON_AddNumberToObject(e, "head", sp.head);
            cJSON_AddNumberToObject(e, "needle_tokens", sp.needle_len);
            cJSON_AddNumberToObject(e, "kept_by_finder", sp.kept_a);
            cJSON_AddNumberToObject(e, "kept_by_misser", sp.kept_b);
            cJSON_AddStringToObject(e, "text", sp.text);
            cJSON_AddItemToArray(arr, e);
        }
    }
    if (rs->explain) fflush(stdout);
    return 0;
}

/* Ctrl-C (or SIGTERM, cli_stop_catch): the sweep stops after the case in
 * flight and every output is written with the finished cases, marked partial. */

/* After each case: a progress line, and with --explain the diagnosis of
 * every method that missed. */
static int on_case(const needle_case *c, void *user) {
    run_state *rs = user;
    const needle_opts *o = rs->o;
    char line[512];
    /* case numbers are the index of --explain, --trace-case and the JSON (from 0) */
    int len = snprintf(line, sizeof line, "case %d (%d of %d): length %d, depth %g%%, run %d:", c->index, c->index + 1,
                       rs->n_total,
                       c->length, c->depth, c->run);
    for (int m = 0; m < o->n_methods && len < (int)sizeof line; m++) {
        char note[96];
        needle_answer_note(c, m, note, sizeof note);
        len += snprintf(line + len, sizeof line - len, "%s %s %s%s%s%s", m ? "," : "", o->methods[m],
                        c->hit[m] ? "hit" : "miss", *note ? " (" : "", note, *note ? ")" : "");
    }
    if (len >= (int)sizeof line) len = (int)sizeof line - 1;
    int done = rs->only_case >= 0 ? 1 : c->index + 1, todo = rs->only_case >= 0 ? 1 : rs->n_total; /* --case: one */
    double el = skv_now() - rs->t0, eta = el / done * (todo - done);
    if (todo > done) fprintf(stderr, "skv needle: %s (%.0f s elapsed, about %.0f s left)\n", line, el, eta);
    else fprintf(stderr, "skv needle: %s (%.0f s elapsed, done)\n", line, el);
    for (int m = 1; m < o->n_methods; m++) {
        if (!c->report[m]) continue;
        needle_distractor dc;
        int has_dc = c->distractor[m] >= 1 &&
                     !needle_distractor_check(c->store[m], c->distractor[m], c->report[m]->last_step, c->keys[0],
                                              c->keys[c->distractor[m]], &dc);
        if (rs->explain) {
            char note[96];
            needle_answer_note(c, m, note, sizeof note);
            printf("case %d: length %d, depth %g%% (inserted at %d%%), run %d: %s missed value %s%s%s\n", c->index,
                   c->length, c->depth, c->insert_depth, c->run, o->methods[m], c->value, *note ? "; it " : "", note);
            if (has_dc) printf("  distractor: %s\n", dc.text);
            needle_report_print(stdout, c->store[m], c->report[m], rs->verbose);
            char cmd[1200];
            replay_command(rs, c->index, cmd, sizeof cmd);
            printf("  replay: %s\n", cmd);
            printf("\n");
            fflush(stdout);
        }
        size_t slot = (size_t)c->index * NEEDLE_MAX_METHODS + m;
        if (rs->diag && c->index < rs->n_total && !(rs->diag[slot] = report_json(c->report[m])))
            return skv_error(SKV_ENOMEM, "out of memory");
        if (rs->diag && c->index < rs->n_total) {
            char cmd[1200];
            replay_command(rs, c->index, cmd, sizeof cmd);
            cJSON_AddStringToObject(rs->diag[slot], "replay", cmd);
        }
        if (rs->diag && c->index < rs->n_total && has_dc) {
            cJSON *dj = cJSON_AddObjectToObject(rs->diag[slot], "distractor");
            if (dj) {
                cJSON_AddNumberToObject(dj, "target_kept", dc.target_kept);
                cJSON_AddNumberToObject(dj, "distractor_kept", dc.distractor_kept);
                cJSON_AddNumberToObject(dj, "target_mass", dc.target_mass);
                cJSON_AddNumberToObject(dj, "distractor_mass", dc.distractor_mass);
                cJSON_AddStringToObject(dj, "text", dc.text);
            }
        }
    }
    int rc = compare_misses(rs, c);
    return rc ? rc : cli_stop_requested() ? CLI_STOPPED : 0;
}

/* Hit rate in percent of method m over the cases at (length, depth); -1 none. */
static double cell_rate(const needle_result *r, int length, float depth, int m) {
    int n = 0, h = 0;
    for (int i = 0; i < r->n_cases; i++) {
        const needle_case *c = &r->cases[i];
        if (c->length != length || c->depth != depth) continue;
        n++;
        h += c->hit[m];
    }
    return n ? 100.0 * h / n : -1;
}

/* Method m's retrieval in percent over the cases of each run (runs[i] for
 * run i, NaN when none), and their mean, min and max over runs. */
static void run_rates(const needle_result *r, const needle_opts *o, int m, double *runs, double *mean, double *lo,
                      double *hi) {
    double sum = 0;
    int n = 0;
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int k = 0; k < o->runs; k++) {
        int c = 0, h = 0;
        for (int i = 0; i < r->n_cases; i++)
            if (r->cases[i].run == k) { c++; h += r->cases[i].hit[m]; }
        runs[k] = c ? 100.0 * h / c : NAN;
        if (!c) continue;
        sum += runs[k];
        n++;
        *lo = runs[k] < *lo ? runs[k] : *lo;
        *hi = runs[k] > *hi ? runs[k] : *hi;
    }
    *mean = n ? sum / n : NAN;
    if (!n) *lo = *hi = NAN;
}

/* One line per method: retrieval over every case, each run's, and the spread. */
static void print_accuracy(const needle_result *r, const needle_opts *o) {
    double *runs = malloc(sizeof(double) * (size_t)(o->runs > 0 ? o->runs : 1));
    if (!runs) return;
    printf("accuracy per method (mean of the runs; each run's; spread = max - min over runs):\n");
    for (int m = 0; m < o->n_methods; m++) {
        double mean, lo, hi;
        run_rates(r, o, m, runs, &mean, &lo, &hi);
        printf("  %-9s %5.1f%%  runs", o->methods[m], mean);
        for (int k = 0; k < o->runs; k++) printf("%s %.0f", k ? "," : "", runs[k]);
        printf("  spread %.0f\n", hi - lo);
    }
    free(runs);
}

static void print_table(const needle_result *r, const needle_opts *o, int only_case) {
    char budget[96], names[256] = "";
    int lo = INT_MAX, hi = 0; /* the budget in tokens over the lengths */
    for (int i = 0; i < o->n_lengths; i++) {
        int b = kv_budget_tokens(&o->kv, o->lengths[i]);
        lo = b < lo ? b : lo;
        hi = b > hi ? b : hi;
    }
    if (o->kv.budget_pct > 0 && lo < hi)
        snprintf(budget, sizeof budget, "%g%% of the prompt: %d to %d tokens", o->kv.budget_pct, lo, hi);
    else if (o->kv.budget_pct > 0) snprintf(budget, sizeof budget, "%g%% of the prompt: %d tokens", o->kv.budget_pct, lo);
    else snprintf(budget, sizeof budget, "%d tokens", o->kv.budget);
    for (int m = 0, len = 0; m < o->n_methods && len < (int)sizeof names; m++)
        len += snprintf(names + len, sizeof names - len, "%s%s", m ? " | " : "", o->methods[m]);
    printf("retrieval in %% of %d run%s per cell: %s (budget %s)\n", o->runs, o->runs == 1 ? "" : "s", names, budget);
    for (int m = 1; m < o->n_methods; m++) {
        const kv_class *p = kv_policy_find(o->methods[m]);
        char opts[256];
        kv_opts_describe(&o->kv, p, o->n_lengths == 1 ? o->lengths[0] : 0, opts, sizeof opts);
        printf("  %s: %s\n", o->methods[m], opts);
    }
    int w = 6 * o->n_methods - 1; /* "100 | 100" per length */
    printf("%7s", "depth");
    for (int i = 0; i < o->n_lengths; i++) {
        char l[16];
        cli_len_label(o->lengths[i], l, sizeof l);
        printf("   %*s", w, l);
    }
    printf("\n");
    for (int d = 0; d < o->n_depths; d++) {
        printf("%6g%%", o->depths[d]);
        for (int i = 0; i < o->n_lengths; i++) {
            printf("  ");
            for (int m = 0; m < o->n_methods; m++) {
                double v = cell_rate(r, o->lengths[i], o->depths[d], m);
                if (v < 0) printf("%s%4s", m ? " |" : " ", "-"); /* not run: the sweep was interrupted */
                else printf("%s%4.0f", m ? " |" : " ", v);
            }
        }
        printf("\n");
    }
    printf("%7s", "all");
    for (int i = 0; i < o->n_lengths; i++) {
        printf("  ");
        for (int m = 0; m < o->n_methods; m++) {
            int n = 0, h = 0;
            for (int k = 0; k < r->n_cases; k++)
                if (r->cases[k].length == o->lengths[i]) { n++; h += r->cases[k].hit[m]; }
            if (n) printf("%s%4.0f", m ? " |" : " ", 100.0 * h / n);
            else printf("%s%4s", m ? " |" : " ", "-");
        }
    }
    printf("\n");
    int planned = o->n_lengths * o->n_depths * o->runs;
    if (only_case >= 0)
        printf("case %d of the sweep's %d, run alone (--case); '-' marks a cell with none\n", only_case, planned);
    else if (r->n_cases < planned)
        printf("partial: %d of %d cases run; '-' marks a cell with none\n", r->n_cases, planned);
}

/* A run event with the sweep's settings (its first sparse method, at the
 * first length) for stores that have no probe events. Its strings point
 * into *so and opts: the caller keeps both until the event is stored. */
static probe_event settings_event(const skv_model *m, const needle_opts *o, session_opts *so, char *opts, size_t n) {
    session_opts_default(so);
    so->kv = o->kv;
    snprintf(so->kv.policy, sizeof so->kv.policy, "%s", o->methods[o->n_methods > 1 ? 1 : 0]);
    const skv_backend *be = skv_backend_find(o->backend);
    probe_event ev;
    session_run_event(m, so, be ? be->name : "cpu", o->lengths[0], opts, n, &ev);
    ev.run.max_ctx = m->cfg.ctx_train;
    return ev;
}

/* The cases the command set out to run: the sweep's, or 1 with --case. */
static int cases_planned(const run_state *rs) { return rs->only_case >= 0 ? 1 : rs->n_total; }

/* Adds the sweep's events (the kept case's probes, or a settings event,
 * then every NIAH event, then the "sweep_planned" metric: the cases it set
 * out to run, so that a figure or a trace of an interrupted sweep says it
 * was cut short; and the "under_floor" metric when some budget is under a
 * method's floor) to a store or a trace writer. */
static int emit_all(const skv_model *m, const needle_opts *o, const needle_result *r, const run_state *rs,
                    probe_store *st, trace_writer *tw) {
    int rc = 0;
    if (r->n_ev) {
        for (int i = 0; !rc && i < r->n_ev; i++) rc = st ? probe_store_add(st, r->ev[i]) : trace_writer_write(tw, r->ev[i]);
    } else {
        char opts[512];
        session_opts so;
        probe_event ev = settings_event(m, o, &so, opts, sizeof opts);
        rc = st ? probe_store_add(st, &ev) : trace_writer_write(tw, &ev);
    }
    for (int i = 0; !rc && i < r->n_cases; i++)
        for (int k = 0; !rc && k < o->n_methods; k++) {
            int detail = r->cases[i].index == r->detail && (k == NEEDLE_DENSE || k == r->detail_method);
            probe_event ev = needle_niah_event(o, &r->cases[i], k, detail);
            rc = st ? probe_store_add(st, &ev) : trace_writer_write(tw, &ev);
        }
    probe_event pl = { .kind = PROBE_METRIC };
    pl.metric = (probe_ev_metric){ .step = -1, .layer = 0, .head = -1, .name = "sweep_planned",
                                   .value = (float)cases_planned(rs) };
    if (!rc) rc = st ? probe_store_add(st, &pl) : trace_writer_write(tw, &pl);
    /* the cells whose budget is under the method's floor, which the heatmap marks */
    float *vals = rc ? NULL : malloc(sizeof(float) * 2 * NEEDLE_MAX_METHODS * (size_t)(o->n_lengths > 0 ? o->n_lengths : 1));
    probe_event uf;
    if (!rc && !vals) rc = skv_error(SKV_ENOMEM, "out of memory");
    if (!rc && needle_floor_metric(o, vals, &uf)) rc = st ? probe_store_add(st, &uf) : trace_writer_write(tw, &uf);
    free(vals);
    return rc;
}

static int write_png(const char *path, int force, const skv_model *m, const needle_opts *o, const needle_result *r,
                     const run_state *rs) {
    probe_store *st = NULL;
    canvas *c = NULL;
    canvas_png_opts po = { .scale = 1 };
    int rc = probe_store_new(&st);
    if (!rc) rc = emit_all(m, o, r, rs, st, NULL);
    int h = o->n_methods > 3 ? 2 * NEEDLE_PNG_H : NEEDLE_PNG_H; /* the niah view puts 4+ panels on two rows */
    if (!rc) rc = canvas_png_new(&c, NEEDLE_PNG_W, h, &po);
    if (!rc) {
        canvas_clear(c);
        view_cursor cur;
        view_cursor_init(&cur);
        cur.clean = 1; /* a figure: no cursor cell or its line */
        const view_class *v = view_find("niah");
        rc = v && view_available(v) ? v->draw(c, (canvas_rect){ 0, 0, NEEDLE_PNG_W, h }, st, &cur, NULL)
                                    : skv_error(SKV_EUNSUPPORTED, "the niah view is not built into this skv");
    }
    if (!rc) rc = canvas_save(c, path, force);
    canvas_free(c);
    probe_store_free(st);
    return rc;
}

static int write_trace(const char *path, const skv_model *m, const needle_opts *o, const needle_result *r,
                       const run_state *rs) {
    trace_writer *tw = NULL;
    int rc = trace_writer_open(path, NULL, &tw);
    if (rc) return rc;
    if (r->detail >= 0) { /* the command that replays the traced case */
        char cmd[1200];
        replay_command(rs, r->detail, cmd, sizeof cmd);
        if ((rc = trace_writer_note(tw, "replay", cmd))) { trace_writer_abort(tw); return rc; }
    }
    if (rs->partial) { /* Ctrl-C: the trace says so (skv trace info, the inspector, --diagnose) */
        char note[96];
        snprintf(note, sizeof note, "after %d of %d cases", r->n_cases, cases_planned(rs));
        if ((rc = trace_writer_note(tw, "interrupted", note))) { trace_writer_abort(tw); return rc; }
    }
    if ((rc = emit_all(m, o, r, rs, NULL, tw))) {
        trace_writer_abort(tw);
        return rc;
    }
    return trace_writer_close(tw);
}

static cJSON *int_array(const int *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

/* The whole sweep as JSON text (malloc'd), or NULL when out of memory. */
static char *json_text(const skv_model *m, const needle_opts *o, const needle_result *r, const run_state *rs,
                       const char *haystack_path) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "format", "skv-needle");
    cJSON_AddNumberToObject(root, "format_version", 2);
    cJSON *mo = cJSON_AddObjectToObject(root, "model");
    if (mo) {
        cJSON_AddStringToObject(mo, "path", m->path);
        cJSON_AddStringToObject(mo, "name", m->cfg.name);
        cJSON_AddBoolToObject(mo, "random_weights", m->random_weights);
        cJSON_AddNumberToObject(mo, "ctx_train", m->cfg.ctx_train);
    }
    cJSON *se = cJSON_AddObjectToObject(root, "settings");
    if (se) {
        cJSON_AddStringToObject(se, "haystack", o->task && o->task->haystack_path ? o->task->haystack_path : haystack_path);
        if (o->task) {
            cJSON_AddStringToObject(se, "task", o->task->name);
            cJSON_AddStringToObject(se, "fact", o->task->fact);
            cJSON_AddStringToObject(se, "question", o->task->question);
            cJSON_AddStringToObject(se, "answer", o->task->answer);
        } else {
            needle_task own;
            int named = !needle_task_custom(o->needle, o->question, o->answer_prefix, &own);
            cJSON_AddStringToObject(se, "task", named ? own.name : "custom");
            if (named) needle_task_free(&own);
            cJSON_AddStringToObject(se, "needle", o->needle);
            cJSON_AddStringToObject(se, "question", o->question);
            if (o->answer_prefix) cJSON_AddStringToObject(se, "answer_prefix", o->answer_prefix);
        }
        cJSON_AddNumberToObject(se, "answer_tokens", r->answer_tokens);
        cJSON_AddNumberToObject(se, "runs", o->runs);
        cJSON_AddNumberToObject(se, "seed", (double)o->seed);
        if (o->kv.budget_pct > 0) cJSON_AddNumberToObject(se, "budget_percent", o->kv.budget_pct);
        else cJSON_AddNumberToObject(se, "budget", o->kv.budget);
        cJSON *ms = cJSON_AddObjectToObject(se, "methods");
        for (int k = 0; ms && k < o->n_methods; k++) {
            /* every option of the policy in force, by its registered key */
            const kv_class *p = kv_policy_find(o->methods[k]);
            cJSON *po = cJSON_AddObjectToObject(ms, o->methods[k]);
            for (int j = 0; po && p && j < p->n_opts; j++)
                cJSON_AddNumberToObject(po, p->opts[j].key, kv_opt(&o->kv, p, p->opts[j].key));
        }
    }
    cJSON_AddItemToObject(root, "lengths", int_array(o->lengths, o->n_lengths));
    cJSON *dep = cJSON_AddArrayToObject(root, "depths");
    for (int i = 0; dep && i < o->n_depths; i++) cJSON_AddItemToArray(dep, cJSON_CreateNumber(o->depths[i]));
    cJSON *su = cJSON_AddObjectToObject(root, "retrieved_percent");
    for (int k = 0; su && r->n_cases && k < o->n_methods; k++) {
        int h = 0;
        for (int i = 0; i < r->n_cases; i++) h += r->cases[i].hit[k];
        cJSON_AddNumberToObject(su, o->methods[k], 100.0 * h / r->n_cases);
    }
    cJSON *pr = cJSON_AddObjectToObject(root, "retrieved_percent_per_run");
    double *runs = malloc(sizeof(double) * (size_t)(o->runs > 0 ? o->runs : 1));
    for (int k = 0; pr && runs && r->n_cases && k < o->n_methods; k++) {
        double mean, lo, hi;
        run_rates(r, o, k, runs, &mean, &lo, &hi);
        cJSON *mo = cJSON_AddObjectToObject(pr, o->methods[k]);
        cJSON *arr = mo ? cJSON_AddArrayToObject(mo, "runs") : NULL;
        for (int j = 0; arr && j < o->runs; j++)
            cJSON_AddItemToArray(arr, isfinite(runs[j]) ? cJSON_CreateNumber(runs[j]) : cJSON_CreateNull());
        if (mo && isfinite(mean)) {
            cJSON_AddNumberToObject(mo, "mean", mean);
            cJSON_AddNumberToObject(mo, "spread", hi - lo);
        }
    }
    free(runs);
    cJSON_AddBoolToObject(root, "partial", rs->partial);
    cJSON_AddNumberToObject(root, "cases_done", r->n_cases);
    cJSON_AddNumberToObject(root, "cases_planned", rs->n_total);
    cJSON_AddNumberToObject(root, "traced_case", r->detail);
    if (r->detail >= 0) cJSON_AddStringToObject(root, "traced_method", o->methods[r->detail_method]);
    cJSON *cases = cJSON_AddArrayToObject(root, "cases");
    for (int i = 0; cases && i < r->n_cases; i++) {
        const needle_case *c = &r->cases[i];
        cJSON *o2 = needle_case_json(o, c);
        if (!o2) break;
        for (int k = 1; k < o->n_methods; k++) {
            size_t slot = (size_t)c->index * NEEDLE_MAX_METHODS + k;
            cJSON *mm = cJSON_GetObjectItemCaseSensitive(o2, o->methods[k]);
            if (mm && rs->diag && c->index < rs->n_total && rs->diag[slot])
                cJSON_AddItemReferenceToObject(mm, "diagnosis", rs->diag[slot]);
        }
        cJSON_AddItemToArray(cases, o2);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

/* ---- the command ---------------------------------------------------------------- */

/* skv needle --diagnose FILE: the diagnosis of the case a trace holds in
 * detail, from its events alone (no model needed). */
static int diagnose_verbose;

static int diagnose_trace(const char *path) {
    probe_store *st = NULL;
    needle_report *rep = malloc(sizeof *rep);
    int rc = rep ? probe_store_new(&st) : skv_error(SKV_ENOMEM, "out of memory");
    if (!rc) rc = trace_load_store(path, st);
    if (!rc && *trace_last_notice()) cli_msg("warning: %s\n", trace_last_notice());
    /* the needle events of a policy's needle watch, or else the oracle's
     * needle measures (any policy, and traces skv did not record) */
    if (!rc && (rc = needle_diagnose(st, 0, rep)) == SKV_EMISSING)
        rc = skv_error(SKV_EMISSING, "%s: the trace holds no needle events and no oracle events with a needle span "
                       "(record one with skv needle --explain --trace FILE, or the oracle with a needle named)", path);
    if (!rc) {
        needle_fit_options(rep); /* advice names only options the policy has */
        printf("%s: %s, value %s: dense %s, %s %s\n", path, rep->policy, rep->value,
               rep->dense_hit < 0 ? "?" : rep->dense_hit ? "hit" : "missed",
               rep->policy, rep->sparse_hit < 0 ? "?" : rep->sparse_hit ? "hit" : "missed");
        needle_report_print(stdout, st, rep, diagnose_verbose);
        /* the metadata names the command that replays the case (skv needle --trace) */
        trace_reader *tr = NULL;
        if (trace_open(path, &tr) == 0) {
            cJSON *meta = cJSON_Parse(trace_meta_json(tr));
            const char *cmd = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "replay"));
            const char *intr = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "interrupted"));
            if (intr) printf("  the sweep was interrupted %s (Ctrl-C): its results are partial\n", intr);
            if (cmd) printf("  replay: %s\n", cmd);
            cJSON_Delete(meta);
            trace_close(tr);
        }
    }
    probe_store_free(st);
    free(rep);
    return rc ? cli_fail() : 0;
}

int cmd_needle(int argc, char **argv) {
    cli_gen g;
    cli_gen_default(&g);
    const char *lengths_s = "1k,2k,4k", *depths_s = "0:100:10", *hay_path = NULL, *json = NULL, *png = NULL;
    const char *trace = NULL, *task_s = NULL, *task_file = NULL;
    int custom = 0;
    needle_opts o;
    needle_opts_default(&o);
    int explain = 0, verbose = 0, force = 0, seed_given = 0, have_model = 0, only_case = -1, no_check = 0;
    for (int i = 1; i < argc; i++) have_model |= !strcmp(argv[i], "-m") || !strcmp(argv[i], "--model");
    if (!have_model) {
        /* The demo model's preset; the user's flags, parsed next, override it. */
        static const char *const demo_flags[] = { "--rank", "16", "--budget", "3%", "--outliers", "4", "--local", "4" };
        int na = (int)(sizeof demo_flags / sizeof demo_flags[0]);
        for (int i = 0; i < na; i++)
            if (cli_gen_option(&g, na, (char **)demo_flags, &i) != 1) return 2;
        cli_gen_forget_flags(&g); /* the preset's flags need not apply to every method of --kv */
        lengths_s = "1k,2k,3k,4000";
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { needle_help(stdout); return 0; }
        if (!strcmp(a, "--diagnose")) {
            if (!v) return cli_usage_error("needle", "--diagnose needs a trace file");
            int vb = argc == 4 && (!strcmp(argv[3], "--verbose") || !strcmp(argv[1], "--verbose"));
            if (argc != 3 && !vb) return cli_usage_error("needle", "--diagnose FILE takes no other option but --verbose");
            diagnose_verbose = vb;
            return diagnose_trace(v);
        }
        if (!strcmp(a, "--explain")) { explain = 1; continue; }
        if (!strcmp(a, "--no-check")) { no_check = 1; continue; }
        if (!strcmp(a, "--verbose")) { verbose = 1; continue; }
        if (!strcmp(a, "--force")) { force = 1; continue; }
        static const char *const valued[] = { "--lengths", "--depths", "--haystack", "--needle", "--question",
                                              "--answer-prefix", "--answer-tokens", "--runs", "--json", "--png",
                                              "--trace", "--trace-case", "--task", "--task-file", "--case" };
        int k = -1;
        for (int j = 0; j < (int)(sizeof valued / sizeof valued[0]); j++) if (!strcmp(a, valued[j])) k = j;
        if (k >= 0) {
            if (!v) return cli_usage_error("needle", "%s needs a value", a);
            i++;
            char *end;
            long x;
            switch (k) {
            case 0: lengths_s = v; break;
            case 1: depths_s = v; break;
            case 2: hay_path = v; break;
            case 3: o.needle = v; custom = 1; break;
            case 4: o.question = v; custom = 1; break;
            case 5: o.answer_prefix = v; custom = 1; break;
            case 6: case 7:
                x = strtol(v, &end, 10);
                if (!*v || *end || x < 1 || x > (k == 6 ? 4096 : 100000))
                    return cli_usage_error("needle", "%s expects an integer in [1, %d], got '%s'", a, k == 6 ? 4096 : 100000, v);
                if (k == 6) o.answer_tokens = (int)x;
                else o.runs = (int)x;
                break;
            case 8: json = v; break;
            case 9: png = v; break;
            case 10: trace = v; break;
            case 12: task_s = v; break;
            case 13: task_file = v; break;
            case 14:
                x = strtol(v, &end, 10);
                if (!*v || *end || x < 0 || x > 1000000)
                    return cli_usage_error("needle", "--case expects a case number >= 0, got '%s'", v);
                only_case = (int)x;
                break;
            default:
                x = strtol(v, &end, 10);
                if (!*v || *end || x < 0 || x > 1000000)
                    return cli_usage_error("needle", "--trace-case expects a case number >= 0, got '%s'", v);
                o.detail_case = (int)x;
                break;
            }
            continue;
        }
        static const char *const not_here[] = { "-p", "--prompt", "-f", "--file", "-n", "--n-predict", "--temp",
                                                "--top-k", "--top-p" };
        for (int j = 0; j < (int)(sizeof not_here / sizeof not_here[0]); j++)
            if (!strcmp(a, not_here[j]))
                return cli_usage_error("needle", "%s does not apply: skv needle builds its own prompts and answers greedily", a);
        if (!strcmp(a, "--seed")) seed_given = 1;
        if (!strcmp(a, "--kv") && v && strcmp(v, "help")) {
            /* a list of policies: dense runs first whether listed or not */
            if (needle_set_methods(&o, v)) return cli_usage_error("needle", "%s", skv_last_error());
            i++;
            continue;
        }
        int r = cli_gen_option(&g, argc, argv, &i);
        if (r < 0) return 2;
        if (r == CLI_DONE) return 0;
        if (r == 0) return cli_usage_error("needle", "unknown option '%s'", a);
    }

    if (!strstr(o.needle, "{value}"))
        return cli_usage_error("needle", "--needle must contain {value}, got '%s'", o.needle);
    if (custom && (task_s || task_file))
        return cli_usage_error("needle", "--needle, --question and --answer-prefix make a task of their own; they do not "
                               "go with --task or --task-file");
    int *lengths = NULL, n_len = 0;
    float *depths = NULL;
    int n_dep = 0, rc = 1, n_tasks = 0;
    needle_task *tasks = NULL;
    if (needle_parse_lengths(lengths_s, &lengths, &n_len) || needle_parse_depths(depths_s, &depths, &n_dep)) {
        free(lengths);
        return cli_usage_error("needle", "%s", skv_last_error());
    }
    o.kv = g.s.kv;
    if (needle_check_flags(&g, "needle", &o)) {
        free(lengths);
        free(depths);
        cli_gen_free(&g);
        return 2;
    }
    if (needle_check_kv_opts(&o)) {
        free(lengths);
        free(depths);
        return cli_usage_error("needle", "%s", skv_last_error());
    }
    if (only_case >= 0 && (long)only_case >= (long)n_len * n_dep * o.runs) {
        free(lengths);
        free(depths);
        return cli_usage_error("needle", "--case %d: the sweep has cases 0..%ld", only_case, (long)n_len * n_dep * o.runs - 1);
    }
    if (only_case >= 0) {
        if (o.detail_case >= 0 && o.detail_case != only_case) {
            free(lengths);
            free(depths);
            return cli_usage_error("needle", "--trace-case %d: --case %d runs that case alone", o.detail_case, only_case);
        }
        o.detail_case = only_case;
    }
    if (o.detail_case >= 0 && (long)o.detail_case >= (long)n_len * n_dep * o.runs) {
        free(lengths);
        free(depths);
        return cli_usage_error("needle", "--trace-case %d: the sweep has cases 0..%ld", o.detail_case,
                               (long)n_len * n_dep * o.runs - 1);
    }
    const char *outs[3] = { json, png, trace };   /* checked before a sweep that may take minutes */
    for (int i = 0; i < 3; i++)
        if (cli_check_output("needle", outs[i], force)) {
            free(lengths);
            free(depths);
            return 1;
        }
    if (png && (strlen(png) < 4 || strcasecmp(png + strlen(png) - 4, ".png"))) {
        free(lengths);
        free(depths);
        return cli_usage_error("needle", "--png %s: the file's name must end in .png", png);
    }
    if ((task_s || task_file) && needle_tasks_choose("needle", task_s, task_file, &tasks, &n_tasks)) {
        rc = 2;
        goto out;
    }
    if (n_tasks > 1) {
        rc = cli_usage_error("needle", "skv needle runs one task (%s has %d; pick one with --task NAME, or run them "
                               "all with skv eval --task-file)", task_file ? task_file : "--task", n_tasks);
        goto out;
    }
    o.task = n_tasks ? &tasks[0] : NULL;
    char model_buf[PATH_MAX + 64], hay_buf[PATH_MAX + 64];
    static const char *const hay_rel[] = { "samples/haystack.txt", "../samples/haystack.txt" };
    if (!g.model) {
        if (cli_demo_model("needle", model_buf, sizeof model_buf)) goto out;
        g.model = model_buf;
    }
    if (!hay_path) {
        if (cli_find_near_exe(hay_rel, 2, hay_buf, sizeof hay_buf)) {
            fprintf(stderr, "skv needle: no --haystack FILE given and the default %s is missing\n", hay_buf);
            goto out;
        }
        hay_path = hay_buf;
    }
    char *hay = NULL;
    size_t hay_n;
    if (skv_read_file(hay_path, (size_t)64 << 20, &hay, &hay_n)) { rc = cli_fail(); goto out; }
    if (g.threads) skv_set_threads(g.threads);
    skv_model *m = NULL;
    if (model_load(g.model, &m)) { free(hay); rc = cli_fail(); goto out; }
    o.haystack = hay;
    o.lengths = lengths;
    o.n_lengths = n_len;
    o.depths = depths;
    o.n_depths = n_dep;
    o.seed = seed_given ? g.s.sample.seed : 0;
    o.ctx = g.s.ctx;
    o.batch = g.s.batch;
    o.no_bos = g.no_bos;
    o.kv = g.s.kv;
    snprintf(o.backend, sizeof o.backend, "%s", g.s.backend);
    o.probes = explain || trace || g.s.kv.oracle;
    o.check = explain && !no_check;
    run_state rs = { .explain = explain, .verbose = verbose, .n_total = n_len * n_dep * o.runs, .o = &o };
    rs.diag = o.probes ? calloc((size_t)rs.n_total * NEEDLE_MAX_METHODS, sizeof *rs.diag) : NULL;
    if (o.probes && !rs.diag) {
        skv_error(SKV_ENOMEM, "out of memory");
        rc = cli_fail();
        goto fail;
    }
    fprintf(stderr, "skv needle: %s%s, %d length%s x %d depth%s x %d run%s, haystack %s\n", g.model,
            m->random_weights ? " (random weights: retrieval is not expected)" : "", n_len, n_len == 1 ? "" : "s", n_dep,
            n_dep == 1 ? "" : "s", o.runs, o.runs == 1 ? "" : "s", hay_path);
    needle_result res;
    if (cli_check_lengths("needle", m, o.lengths, o.n_lengths, force)) { rc = 2; goto fail; }
    cli_stop_catch("case");
    char ctx_note[256], floor_note[2048];
    if (needle_context_notice(m, &o, ctx_note, sizeof ctx_note)) /* before a sweep that may take minutes, and after */
        fprintf(stderr, "skv needle: warning: %s\n", ctx_note);
    if (needle_floor_notice(&o, floor_note, sizeof floor_note)) cli_warn_lines(floor_note);
    rs.t0 = skv_now();
    rs.only_case = only_case;
    replay_base(argc, argv, rs.replay, sizeof rs.replay);
    rc = needle_run_skip(m, &o, skip_but, on_case, &rs, &res);
    cli_stop_release();
    if (res.notice[0]) fprintf(stderr, "skv needle: %s\n", res.notice);
    int partial = rc == CLI_STOPPED;
    if (partial) {
        fprintf(stderr, "skv needle: interrupted after %d of %d cases; the results below and the files written "
                "hold those cases and are marked partial\n", res.n_cases, rs.n_total);
        rs.partial = 1;
        rc = 0;
    }
    if (rc) { rc = cli_fail(); goto done; }
    print_table(&res, &o, only_case);
    print_accuracy(&res, &o);
    if (json) {
        char *text = json_text(m, &o, &res, &rs, hay_path);
        if (!text) rc = skv_error(SKV_ENOMEM, "out of memory writing %s", json);
        else rc = skv_save_atomic(json, force, skv_put_text, text);
        free(text);
        if (rc) { rc = cli_fail(); goto done; }
        fprintf(stderr, "skv needle: wrote %s\n", json);
    }
    if (png) {
        if (write_png(png, force, m, &o, &res, &rs)) { rc = cli_fail(); goto done; }
        fprintf(stderr, "skv needle: wrote %s\n", png);
    }
    if (trace) {
        if (write_trace(trace, m, &o, &res, &rs)) { rc = cli_fail(); goto done; }
        fprintf(stderr, "skv needle: wrote %s (case %d under %s in detail)\n", trace, res.detail,
                res.detail >= 0 ? o.methods[res.detail_method] : "-");
    }
    rc = partial ? CLI_STOPPED : 0;
done:
    needle_result_free(&res);
fail:
    for (size_t i = 0; rs.diag && i < (size_t)rs.n_total * NEEDLE_MAX_METHODS; i++) cJSON_Delete(rs.diag[i]);
    free(rs.diag);
    model_free(m);
    free(hay);
out:
    free(lengths);
    free(depths);
    needle_tasks_free(tasks, n_tasks);
    cli_gen_free(&g);
    return rc;
}
