/* cmd_eval.c: `skv eval`, the suite runner. It runs needle tasks x lengths
 * x depths x seeds under every policy of --kv at one budget, then a budget
 * sweep at one length, and writes into one folder:
 *   eval.json       the settings (a rerun with other settings is refused)
 *   cases.jsonl     one line per finished case, appended and flushed as it
 *                   finishes: a rerun skips those cases (resumable)
 *   leaderboard.md  policies x task@length, accuracy and its spread over
 *                   seeds, mass recall, output error, bytes, tok/s
 *   cases.csv       one row per case and policy
 *   heatmap.png/svg one panel per policy, tasks x lengths
 *   budget.png/svg  accuracy against budget, one line per policy
 * docs/EVAL.md explains the suite and reads the demo's results. */
#include "cli.h"
#include "model.h"
#include "needle.h"
#include "needle_out.h"
#include "paint.h"
#include "skv.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EVAL_MAX_BUDGETS 16
#define EVAL_MAX_TASKS 16

static void eval_help(FILE *o) {
    fprintf(o,
            "usage: skv eval --out DIR [--suite demo] [-m MODEL] [--task LIST | --task-file FILE] [options]\n\n"
            "Runs needle tasks x lengths x depths x seeds under every policy of --kv (dense first, on the\n"
            "same prompts) at one budget, then a budget sweep at one length, and writes into DIR:\n"
            "leaderboard.md, cases.csv (a row per case and policy), heatmap.png/.svg (a panel per policy,\n"
            "tasks x lengths) and budget.png/.svg (accuracy against budget, error bars over seeds).\n"
            "Every finished case is appended to DIR/cases.jsonl at once: the same command run again\n"
            "skips the finished cases, so Ctrl-C or a kill loses at most the case in flight.\n\n"
            "  --out DIR           the output folder (made if missing)\n"
            "  --suite demo        the preset: the demo model, all six policies, tasks single, passkey and\n"
            "                      multikey, lengths 1k,2k,4000, depths 10:90:10, 3 seeds, budget 256,\n"
            "                      sweep 64,128,256,512 at 4000, and the policies scaled to a 4-layer model\n"
            "                      (--rank 16 --outliers 4 --local 4; dense_layers=0, sink, window, start\n"
            "                      and recent 32); flags given override it\n"
            "  -m, --model PATH    GGUF file or HF directory (default: the demo model)\n"
            "  --task LIST         tasks, comma-separated: single, passkey, multikey, multikey-alt\n"
            "                      (default single), or names from --task-file\n"
            "  --task-file FILE    tasks as JSON Lines (docs/EVAL.md); all of them without --task\n"
            "  --lengths LIST      prompt lengths in tokens, k = 1024 (default 1k,2k,4k)\n"
            "  --depths LIST       depths in percent, START:STOP:STEP or a list (default 10:90:20)\n"
            "  --seeds N           repetitions per cell, each with new values (default 3)\n"
            "  --kv LIST           policies, comma-separated; dense always runs first (default dense,shadowkv)\n"
            "  --budget B          the grid's budget: tokens per KV head, or B%% of the prompt (default 256)\n"
            "  --budgets LIST      the sweep's budgets, e.g. 64,128,256,512 (default: none)\n"
            "  --sweep-length N    the sweep's length (default: the largest of --lengths)\n"
            "  --haystack FILE     filler text (default samples/haystack.txt)\n"
            "  --no-oracle         skip the oracle (no mass recall or output error; faster)\n"
            "  --force             start over: the old cases.jsonl is kept as cases.jsonl.prev\n"
            "Policy settings as for skv run (--kv-opt KEY=VALUE and each policy's flags; skv run --kv help);\n"
            "  -t, --threads N     worker threads (default: one per physical core, as llama.cpp)\n\n"
            "Exit status: 0 when the suite finished, 130 when interrupted (outputs hold the finished\n"
            "cases, marked partial), 1 on a failure, 2 on a bad command line.\n");
}

/* ---- settings ---------------------------------------------------------------------- */

typedef struct {
    char label[24];        /* "256" or "3%" */
    int tokens;            /* > 0: tokens per KV head */
    float pct;             /* > 0: percent of the prompt */
} eval_budget;

static int parse_budget(const char *s, eval_budget *b) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    memset(b, 0, sizeof *b);
    if (end == s || errno || !(x > 0)) return -1;
    if (*end == '%' && !end[1] && x <= 100) {
        b->pct = (float)x;
        snprintf(b->label, sizeof b->label, "%g%%", x);
        return 0;
    }
    if (*end || x != floor(x) || x > 1e7) return -1;
    b->tokens = (int)x;
    snprintf(b->label, sizeof b->label, "%d", b->tokens);
    return 0;
}

typedef struct {
    needle_opts o;              /* the sweep's options (task and budget set per run) */
    needle_task *tasks;
    int n_tasks;
    eval_budget main_budget;
    eval_budget sweep[EVAL_MAX_BUDGETS];
    int n_sweep;
    int sweep_len;
    const char *dir;
    const char *model_path, *hay_path;
    /* state */
    FILE *jl;                   /* cases.jsonl, appended */
    char jl_path[PATH_MAX];
    cJSON **rec;                /* finished cases (loaded and new), parsed */
    int n_rec, cap_rec;
    int planned, done_before, done_now;
    double t0, t_last;          /* start of this sitting; end of the last case */
    const eval_budget *cur;     /* the budget of the run in flight */
    int cur_sweep;              /* 1: the run in flight is a sweep run (length = sweep_len only) */
} eval_state;

static void case_key(char *buf, size_t n, const char *task, int length, double depth, int run, const char *budget) {
    snprintf(buf, n, "%s|%d|%g|%d|%s", task, length, depth, run, budget);
}

static const char *rec_str(const cJSON *r, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double rec_num(const cJSON *r, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static int have_key(const eval_state *e, const char *key) {
    for (int i = 0; i < e->n_rec; i++)
        if (!strcmp(rec_str(e->rec[i], "case_key"), key)) return 1;
    return 0;
}

static int add_rec(eval_state *e, cJSON *r) {
    if (e->n_rec == e->cap_rec) {
        int cap = e->cap_rec ? e->cap_rec * 2 : 256;
        cJSON **p = realloc(e->rec, sizeof *p * (size_t)cap);
        if (!p) return skv_error(SKV_ENOMEM, "out of memory");
        e->rec = p;
        e->cap_rec = cap;
    }
    e->rec[e->n_rec++] = r;
    return 0;
}

/* Replaces the path in o's field key by its canonical form (realpath),
 * when the file is there: ./skv and build/skv find the same default model
 * through different relative paths. */
static void canon_path(cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    char real[PATH_MAX];
    if (!cJSON_IsString(v) || !realpath(v->valuestring, real)) return;
    cJSON_ReplaceItemInObjectCaseSensitive(o, key, cJSON_CreateString(real));
}

/* The settings as JSON: what makes two runs the same suite. */
static cJSON *settings_json(const eval_state *e) {
    cJSON *s = cJSON_CreateObject();
    if (!s) return NULL;
    cJSON_AddStringToObject(s, "format", "skv-eval");
    cJSON_AddNumberToObject(s, "format_version", 1);
    cJSON_AddStringToObject(s, "model", e->model_path);
    cJSON_AddStringToObject(s, "haystack", e->hay_path);
    canon_path(s, "model");
    canon_path(s, "haystack");
    cJSON *t = cJSON_AddArrayToObject(s, "tasks");
    for (int i = 0; t && i < e->n_tasks; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddStringToObject(o, "name", e->tasks[i].name);
        cJSON_AddStringToObject(o, "fact", e->tasks[i].fact);
        cJSON_AddStringToObject(o, "question", e->tasks[i].question);
        cJSON_AddStringToObject(o, "answer", e->tasks[i].answer);
        cJSON_AddNumberToObject(o, "facts_min", e->tasks[i].facts_min);
        cJSON_AddNumberToObject(o, "facts_max", e->tasks[i].facts_max);
        if (e->tasks[i].haystack_path) cJSON_AddStringToObject(o, "haystack", e->tasks[i].haystack_path);
        cJSON_AddItemToArray(t, o);
    }
    cJSON *a = cJSON_AddArrayToObject(s, "lengths");
    for (int i = 0; a && i < e->o.n_lengths; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(e->o.lengths[i]));
    a = cJSON_AddArrayToObject(s, "depths");
    for (int i = 0; a && i < e->o.n_depths; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(e->o.depths[i]));
    cJSON_AddNumberToObject(s, "seeds", e->o.runs);
    a = cJSON_AddArrayToObject(s, "policies");
    for (int i = 0; a && i < e->o.n_methods; i++) cJSON_AddItemToArray(a, cJSON_CreateString(e->o.methods[i]));
    cJSON_AddStringToObject(s, "budget", e->main_budget.label);
    a = cJSON_AddArrayToObject(s, "sweep_budgets");
    for (int i = 0; a && i < e->n_sweep; i++) cJSON_AddItemToArray(a, cJSON_CreateString(e->sweep[i].label));
    cJSON_AddNumberToObject(s, "sweep_length", e->sweep_len);
    cJSON_AddBoolToObject(s, "oracle", e->o.oracle);
    cJSON *po = cJSON_AddObjectToObject(s, "policy_options");
    for (int k = 0; po && k < e->o.n_methods; k++) {
        const kv_class *p = kv_policy_find(e->o.methods[k]);
        cJSON *pp = cJSON_AddObjectToObject(po, e->o.methods[k]);
        for (int j = 0; pp && p && j < p->n_opts; j++)
            if (strcmp(p->opts[j].key, "budget")) cJSON_AddNumberToObject(pp, p->opts[j].key, kv_opt(&e->o.kv, p, p->opts[j].key));
    }
    return s;
}

/* DIR/eval.json: written on a fresh start; on a rerun it must match. */
static int check_settings(eval_state *e, const skv_model *m, int force) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/eval.json", e->dir);
    (void)m;
    cJSON *now = settings_json(e);
    if (!now) return skv_error(SKV_ENOMEM, "out of memory");
    char *text = NULL;
    size_t len;
    int rc = skv_read_file(path, (size_t)1 << 20, &text, &len);
    int fresh = rc == SKV_EMISSING;
    if (rc && !fresh) { cJSON_Delete(now); return rc; }
    rc = 0;
    if (fresh && !force) {
        /* A folder without eval.json: skv eval wrote none of its files, so
         * it replaces none of them. */
        static const char *const ours[] = { "cases.jsonl", "cases.csv", "leaderboard.md", "heatmap.png",
                                            "heatmap.svg", "budget.png", "budget.svg" };
        for (size_t i = 0; i < sizeof ours / sizeof ours[0] && !rc; i++) {
            char p2[PATH_MAX];
            struct stat sb;
            snprintf(p2, sizeof p2, "%s/%s", e->dir, ours[i]);
            if (lstat(p2, &sb) == 0)
                rc = skv_error(SKV_EINVAL, "%s holds %s but no eval.json: skv eval did not write it and will not "
                               "replace it; use another --out, or --force", e->dir, ours[i]);
        }
    }
    if (!fresh && !force) {
        cJSON *old = cJSON_Parse(text);
        if (old) { canon_path(old, "model"); canon_path(old, "haystack"); }
        if (!old) rc = skv_error(SKV_EFORMAT, "%s: not JSON; remove it or use --force to start over", path);
        else if (!cJSON_Compare(old, now, 1)) {
            /* name the first setting that differs */
            char what[300] = "";
            const cJSON *it;
            cJSON_ArrayForEach(it, now) {
                const cJSON *was = cJSON_GetObjectItemCaseSensitive(old, it->string);
                if (was && cJSON_Compare(was, it, 1)) continue;
                char *a = was ? cJSON_PrintUnformatted(was) : NULL, *b = cJSON_PrintUnformatted(it);
                snprintf(what, sizeof what, "%s was %.100s, now %.100s", it->string, a ? a : "absent", b ? b : "?");
                free(a);
                free(b);
                break;
            }
            if (!what[0])
                cJSON_ArrayForEach(it, old) if (!cJSON_GetObjectItemCaseSensitive(now, it->string)) {
                    snprintf(what, sizeof what, "%s is no longer set", it->string);
                    break;
                }
            rc = skv_error(SKV_EINVAL, "%s holds a suite with other settings (%s); use another --out, or --force to "
                           "start over (the old cases are kept as cases.jsonl.prev)", e->dir, what);
        }
        cJSON_Delete(old);
    }
    free(text);
    if (!rc && (fresh || force)) {
        char *s = cJSON_Print(now);
        rc = s ? skv_save_atomic(path, 1, skv_put_text, s) : skv_error(SKV_ENOMEM, "out of memory");
        free(s);
    }
    cJSON_Delete(now);
    return rc;
}

/* "" when record r is a case of this suite (its fields whole and its key
 * the one they make), else what is wrong with it. */
static const char *foreign_case(const eval_state *e, const cJSON *r, char *why, size_t n) {
    const char *task = rec_str(r, "task"), *budget = rec_str(r, "budget");
    double length = rec_num(r, "length"), depth = rec_num(r, "depth"), seed = rec_num(r, "seed");
    if (!isfinite(seed) || seed != floor(seed) || seed < 0 || seed >= e->o.runs)
        snprintf(why, n, "field 'seed' is missing or not a seed of this suite (0..%d)", e->o.runs - 1);
    else if (!isfinite(length) || length != floor(length) || length < 1 || length > (1 << 24) || !isfinite(depth) ||
             depth < 0 || depth > 100)
        snprintf(why, n, "field 'length' or 'depth' is missing or out of range (1..16777216 tokens, 0..100 %%)");
    else {
        int ok_task = 0, ok_budget = !strcmp(budget, e->main_budget.label), sweep = 0, ok_len = 0, ok_dep = 0;
        for (int i = 0; i < e->n_tasks; i++) ok_task |= !strcmp(task, e->tasks[i].name);
        for (int i = 0; i < e->n_sweep && !ok_budget; i++) sweep = ok_budget = !strcmp(budget, e->sweep[i].label);
        for (int i = 0; i < e->o.n_lengths; i++) ok_len |= e->o.lengths[i] == (int)length;
        if (sweep) ok_len = (int)length == e->sweep_len;
        char a[32], b[32];
        snprintf(a, sizeof a, "%g", depth);
        for (int i = 0; i < e->o.n_depths; i++) {
            snprintf(b, sizeof b, "%g", e->o.depths[i]);
            ok_dep |= !strcmp(a, b);
        }
        char key[160];
        case_key(key, sizeof key, task, (int)length, depth, (int)seed, budget);
        if (!ok_task || !ok_budget || !ok_len || !ok_dep)
            snprintf(why, n, "task %s, length %.0f, depth %g, budget %s is not a case of this suite", task, length,
                     depth, budget);
        else if (strcmp(key, rec_str(r, "case_key")))
            snprintf(why, n, "its case_key is not the one its fields make (%.120s)", key);
        else why[0] = 0;
    }
    return why;
}

/* Reads DIR/cases.jsonl: every whole line is a finished case. A last line
 * cut by a kill (no newline, or not JSON) is dropped from the file. */
static int load_cases(eval_state *e, int force) {
    snprintf(e->jl_path, sizeof e->jl_path, "%s/cases.jsonl", e->dir);
    if (force) {
        char prev[PATH_MAX + 8];
        snprintf(prev, sizeof prev, "%s.prev", e->jl_path);
        if (rename(e->jl_path, prev) && errno != ENOENT)
            return skv_error(SKV_EIO, "%s: cannot move it to %s: %s", e->jl_path, prev, strerror(errno));
    }
    char *text = NULL;
    size_t len = 0;
    int rc = skv_read_file(e->jl_path, (size_t)1 << 30, &text, &len);
    if (rc == SKV_EMISSING) rc = 0;
    else if (rc) return rc;
    size_t keep = 0;
    int line = 0;
    for (size_t at = 0; text && at < len && !rc;) {
        char *nl = memchr(text + at, '\n', len - at);
        line++;
        if (!nl) break; /* cut short by a kill: dropped below */
        *nl = 0;
        cJSON *r = cJSON_Parse(text + at);
        if (!r || !*rec_str(r, "case_key")) {
            cJSON_Delete(r);
            rc = skv_error(SKV_EFORMAT, "%s:%d: not a case record; fix or remove the line, or use --force to start over",
                           e->jl_path, line);
            break;
        }
        char why[200];
        if (*foreign_case(e, r, why, sizeof why)) {
            cJSON_Delete(r);
            rc = skv_error(SKV_EFORMAT, "%s:%d: %s; fix or remove the line, or use --force to start over", e->jl_path,
                           line, why);
            break;
        }
        if (have_key(e, rec_str(r, "case_key"))) cJSON_Delete(r); /* written twice: the first one counts */
        else rc = add_rec(e, r);
        at = (size_t)(nl - text) + 1;
        keep = at;
    }
    if (!rc && text && keep < len) {
        fprintf(stderr, "skv eval: %s: dropped a last line cut short (the case in flight when the run stopped)\n",
                e->jl_path);
        if (truncate(e->jl_path, (off_t)keep)) rc = skv_error(SKV_EIO, "%s: cannot truncate it: %s", e->jl_path, strerror(errno));
    }
    free(text);
    if (rc) return rc;
    if (!(e->jl = fopen(e->jl_path, "a"))) return skv_error(SKV_EIO, "%s: cannot open it: %s", e->jl_path, strerror(errno));
    return 0;
}

/* ---- running ------------------------------------------------------------------------ */

static int skip_case(const needle_case *c, void *user) {
    eval_state *e = user;
    if (e->cur_sweep && c->length != e->sweep_len) return 1;
    char key[160];
    case_key(key, sizeof key, c->task, c->length, c->depth, c->run, e->cur->label);
    return have_key(e, key);
}

/* Running accuracy per policy over every finished case. */
static void progress(const eval_state *e) {
    char line[1024];
    int done = e->done_before + e->done_now, len;
    double el = skv_now() - e->t0;
    double eta = e->done_now ? el / e->done_now * (e->planned - done) : NAN;
    len = snprintf(line, sizeof line, "%d/%d cases", done, e->planned);
    if (isfinite(eta)) len += snprintf(line + len, sizeof line - len, ", %.0f s, ETA %.0f s", el, eta);
    len += snprintf(line + len, sizeof line - len, "; accuracy so far:");
    for (int k = 0; k < e->o.n_methods && len < (int)sizeof line; k++) {
        int n = 0, h = 0;
        for (int i = 0; i < e->n_rec; i++) {
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(e->rec[i], e->o.methods[k]);
            if (!m) continue;
            n++;
            h += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "hit"));
        }
        len += snprintf(line + len, sizeof line - len, " %s %.0f%%", e->o.methods[k], n ? 100.0 * h / n : 0.0);
    }
    if (isatty(2)) fprintf(stderr, "\r\033[Kskv eval: %s", line);
    else fprintf(stderr, "skv eval: %s\n", line);
}

static int on_case(const needle_case *c, void *user) {
    eval_state *e = user;
    cJSON *r = needle_case_json(&e->o, c);
    if (!r) return skv_error(SKV_ENOMEM, "out of memory");
    char key[160];
    case_key(key, sizeof key, c->task, c->length, c->depth, c->run, e->cur->label);
    cJSON_AddStringToObject(r, "case_key", key);
    cJSON_AddStringToObject(r, "budget", e->cur->label);
    cJSON_AddNumberToObject(r, "seed", c->run);
    double now = skv_now();
    cJSON_AddNumberToObject(r, "wall_seconds", now - e->t_last); /* the case under every policy, oracle included */
    e->t_last = now;
    char *text = cJSON_PrintUnformatted(r);
    if (!text) { cJSON_Delete(r); return skv_error(SKV_ENOMEM, "out of memory"); }
    int bad = fputs(text, e->jl) < 0 || fputc('\n', e->jl) == EOF || fflush(e->jl) || fdatasync(fileno(e->jl));
    free(text);
    if (bad) { cJSON_Delete(r); return skv_error(SKV_EIO, "%s: cannot append to it: %s", e->jl_path, strerror(errno)); }
    int rc = add_rec(e, r);
    if (rc) { cJSON_Delete(r); return rc; }
    e->done_now++;
    progress(e);
    return cli_stop_requested() ? CLI_STOPPED : 0;
}

static void set_budget(kv_opts *kv, const eval_budget *b) {
    kv->budget = b->tokens > 0 ? b->tokens : kv->budget;
    kv->budget_pct = b->pct;
}

/* needle_floor_notice for the grid's budget over its lengths and each sweep
 * budget at the sweep's length, a line per (budget, policy) under its floor,
 * into buf; 1 when any. */
static int floor_notes(const eval_state *e, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (int pass = 0; pass <= e->n_sweep && len < n; pass++) {
        const eval_budget *b = pass == 0 ? &e->main_budget : &e->sweep[pass - 1];
        if (pass > 0 && !strcmp(b->label, e->main_budget.label)) continue; /* the grid's line has it */
        needle_opts o = e->o;
        set_budget(&o.kv, b);
        if (pass > 0) {
            o.lengths = &e->sweep_len;
            o.n_lengths = 1;
        }
        char one[2048];
        if (needle_floor_notice(&o, one, sizeof one)) len += snprintf(buf + len, n - len, "%s%s", len ? "\n" : "", one);
    }
    return len > 0;
}

static int run_suite(eval_state *e, skv_model *m) {
    int rc = 0;
    for (int pass = 0; pass <= e->n_sweep && !rc; pass++) {
        const eval_budget *b = pass == 0 ? &e->main_budget : &e->sweep[pass - 1];
        if (pass > 0 && !strcmp(b->label, e->main_budget.label)) continue; /* the grid has those cases */
        e->cur = b;
        e->cur_sweep = pass > 0;
        for (int t = 0; t < e->n_tasks && !rc; t++) {
            needle_opts o = e->o;
            o.task = &e->tasks[t];
            set_budget(&o.kv, b);
            needle_result res;
            rc = needle_run_skip(m, &o, skip_case, on_case, e, &res);
            needle_result_free(&res);
        }
    }
    return rc;
}

/* ---- aggregates ---------------------------------------------------------------------- */

typedef struct {
    int n, hits;
    double acc_seed[64];       /* per seed accuracy in percent (NaN: no case) */
    int n_seed[64], hit_seed[64];
} cell_acc;

/* Accuracy of policy `pol` over records matching task (NULL: any), length (0:
 * any), budget label; per seed too. */
static void cell(const eval_state *e, const char *pol, const char *task, int length, const char *budget, cell_acc *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < e->n_rec; i++) {
        const cJSON *r = e->rec[i];
        if (task && strcmp(rec_str(r, "task"), task)) continue;
        if (length && rec_num(r, "length") != length) continue;
        if (strcmp(rec_str(r, "budget"), budget)) continue;
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(r, pol);
        if (!m) continue;
        int hit = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "hit"));
        int s = (int)rec_num(r, "seed");
        c->n++;
        c->hits += hit;
        if (s >= 0 && s < 64) { c->n_seed[s]++; c->hit_seed[s] += hit; }
    }
}

/* Mean and standard deviation over seeds of the per-seed accuracy. */
static void seed_stats(const cell_acc *c, int seeds, double *mean, double *sd) {
    double sum = 0, sq = 0;
    int n = 0;
    for (int s = 0; s < seeds && s < 64; s++) {
        if (!c->n_seed[s]) continue;
        double a = 100.0 * c->hit_seed[s] / c->n_seed[s];
        sum += a;
        sq += a * a;
        n++;
    }
    *mean = n ? sum / n : NAN;
    *sd = n > 1 ? sqrt(fmax(0, (sq - sum * sum / n) / (n - 1))) : n ? 0 : NAN;
}

/* tps: the median case rate; tps_lo, tps_hi: the slowest and fastest case. */
typedef struct { double recall, err, fetch_per_step, resident, tps, tps_lo, tps_hi; int n_recall; } pol_cost;

/* A rate whose cases span more than this factor is marked noisy. */
#define TPS_NOISY 2.0

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Means over the policy's cases at the grid's budget; tok/s is the median of
 * the cases' decode rates (one slow case on a busy machine would otherwise
 * weigh as much as all the others). */
static void policy_cost(const eval_state *e, const char *pol, pol_cost *pc) {
    double rs = 0, es = 0, fb = 0, steps = 0, res = 0;
    int nr = 0, nf = 0, n = 0, nt = 0;
    double *tps = malloc(sizeof(double) * (size_t)(e->n_rec > 0 ? e->n_rec : 1));
    for (int i = 0; i < e->n_rec; i++) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(e->rec[i], pol);
        if (!m || strcmp(rec_str(e->rec[i], "budget"), e->main_budget.label)) continue;
        double r = rec_num(m, "mass_recall"), er = rec_num(m, "output_error"), f = rec_num(m, "fetch_bytes");
        double st = rec_num(m, "decode_steps"), td = rec_num(m, "t_decode");
        if (isfinite(r) && isfinite(er)) { rs += r; es += er; nr++; }
        if (isfinite(f) && isfinite(st)) { fb += f; steps += st; nf++; }
        if (tps && isfinite(st) && td > 0) tps[nt++] = st / td;
        res += rec_num(m, "resident_bytes");
        n++;
    }
    pc->n_recall = nr;
    pc->recall = nr ? rs / nr : NAN;
    pc->err = nr ? es / nr : NAN;
    pc->fetch_per_step = nf && steps > 0 ? fb / steps : NAN;
    pc->resident = n ? res / n : NAN;
    if (nt) qsort(tps, (size_t)nt, sizeof *tps, cmp_double);
    pc->tps = nt ? (nt % 2 ? tps[nt / 2] : (tps[nt / 2 - 1] + tps[nt / 2]) / 2) : NAN;
    pc->tps_lo = nt ? tps[0] : NAN;
    pc->tps_hi = nt ? tps[nt - 1] : NAN;
    free(tps);
}

/* ---- leaderboard.md ------------------------------------------------------------------ */

typedef struct { char *s; size_t n, cap; int oom; } sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) { b->oom = 1; return; }
        if (b->s && b->n + (size_t)k < b->cap) { b->n += (size_t)k; return; }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) { b->oom = 1; return; }
        b->s = p;
        b->cap = cap;
    }
}

static char *leaderboard(const eval_state *e, const skv_model *m, int partial, double wall) {
    sbuf b = {0};
    int seeds = e->o.runs;
    sb_printf(&b, "# skv eval leaderboard%s\n\n", partial ? " (partial: the suite was interrupted)" : "");
    sb_printf(&b, "Model `%s` (%s). Budget %s %s. Depths", e->model_path, m->cfg.name, e->main_budget.label,
              e->main_budget.pct > 0 ? "of the prompt" : "tokens per KV head");
    for (int i = 0; i < e->o.n_depths; i++) sb_printf(&b, "%s %g", i ? "," : "", e->o.depths[i]);
    sb_printf(&b, " %%; %d seed%s. %d of %d cases done", seeds, seeds == 1 ? "" : "s", e->n_rec, e->planned);
    double total = 0;
    int timed = 0;
    for (int i = 0; i < e->n_rec; i++) {
        double w = rec_num(e->rec[i], "wall_seconds");
        if (isfinite(w)) { total += w; timed++; }
    }
    if (timed == e->n_rec && timed) sb_printf(&b, "; wall time of the cases %.0f s", total);
    else if (wall > 0.5) sb_printf(&b, ", this sitting %.0f s", wall);
    sb_printf(&b, ".\n\nEach cell: retrieval accuracy in %% (mean over seeds ± standard deviation over seeds). "
              "Mass recall and output error are means over every decode step, layer and query head of every case "
              "at the grid's budget, scored by the oracle against exact attention; fetched is bytes moved from "
              "offloaded memory per decode step; resident is the KV bytes the policy holds, mean over cases; tok/s "
              "is the median over cases of decode steps per second of the policy's own time (the oracle's scoring "
              "excluded) on this machine, with the slowest and fastest case; the oracle and the dense twin share "
              "the process and its caches, and a case decodes only a few steps, so a rate whose cases span more "
              "than a factor of %.0f is marked noisy. skv bench measures speed.\n\n", TPS_NOISY);
    sb_printf(&b, "| policy |");
    for (int t = 0; t < e->n_tasks; t++)
        for (int l = 0; l < e->o.n_lengths; l++) {
            char ll[16];
            cli_len_label(e->o.lengths[l], ll, sizeof ll);
            sb_printf(&b, " %s@%s |", e->tasks[t].name, ll);
        }
    sb_printf(&b, " all | mass recall %% | output error %% | fetched KiB/step | resident KiB | tok/s |\n|---|");
    for (int i = 0; i < e->n_tasks * e->o.n_lengths; i++) sb_printf(&b, "---|");
    sb_printf(&b, "---|---|---|---|---|---|\n");
    for (int k = 0; k < e->o.n_methods; k++) {
        const char *pol = e->o.methods[k];
        sb_printf(&b, "| %s |", pol);
        cell_acc c;
        double mean, sd;
        for (int t = 0; t < e->n_tasks; t++)
            for (int l = 0; l < e->o.n_lengths; l++) {
                cell(e, pol, e->tasks[t].name, e->o.lengths[l], e->main_budget.label, &c);
                seed_stats(&c, seeds, &mean, &sd);
                if (isfinite(mean)) sb_printf(&b, " %.0f ± %.0f |", mean, sd);
                else sb_printf(&b, " – |");
            }
        cell(e, pol, NULL, 0, e->main_budget.label, &c);
        seed_stats(&c, seeds, &mean, &sd);
        if (isfinite(mean)) sb_printf(&b, " **%.1f** ± %.1f |", mean, sd);
        else sb_printf(&b, " – |");
        pol_cost pc;
        policy_cost(e, pol, &pc);
        if (isfinite(pc.recall)) sb_printf(&b, " %.1f | %.1f |", 100 * pc.recall, 100 * pc.err);
        else sb_printf(&b, " – | – |");
        if (isfinite(pc.fetch_per_step)) sb_printf(&b, " %.1f |", pc.fetch_per_step / 1024);
        else sb_printf(&b, " – |");
        if (isfinite(pc.resident)) sb_printf(&b, " %.0f |", pc.resident / 1024);
        else sb_printf(&b, " – |");
        if (isfinite(pc.tps) && pc.tps_hi > TPS_NOISY * pc.tps_lo)
            sb_printf(&b, " %.0f (%.0f–%.0f, noisy) |\n", pc.tps, pc.tps_lo, pc.tps_hi);
        else if (isfinite(pc.tps)) sb_printf(&b, " %.0f (%.0f–%.0f) |\n", pc.tps, pc.tps_lo, pc.tps_hi);
        else sb_printf(&b, " – |\n");
    }
    if (e->n_sweep) {
        char ll[16];
        cli_len_label(e->sweep_len, ll, sizeof ll);
        sb_printf(&b, "\n## Accuracy against budget at %s tokens (all tasks)\n\n| policy |", ll);
        for (int i = 0; i < e->n_sweep; i++) sb_printf(&b, " %s |", e->sweep[i].label);
        sb_printf(&b, "\n|---|");
        for (int i = 0; i < e->n_sweep; i++) sb_printf(&b, "---|");
        sb_printf(&b, "\n");
        for (int k = 0; k < e->o.n_methods; k++) {
            sb_printf(&b, "| %s |", e->o.methods[k]);
            for (int i = 0; i < e->n_sweep; i++) {
                cell_acc c;
                double mean, sd;
                cell(e, e->o.methods[k], NULL, e->sweep_len, e->sweep[i].label, &c);
                seed_stats(&c, seeds, &mean, &sd);
                if (isfinite(mean)) sb_printf(&b, " %.0f ± %.0f |", mean, sd);
                else sb_printf(&b, " – |");
            }
            sb_printf(&b, "\n");
        }
    }
    char floors[8192];
    if (floor_notes(e, floors, sizeof floors)) {
        sb_printf(&b, "\n## Budgets under a policy's floor\n\nThere the policy selects nothing (each line says what it "
                  "does instead), so its cells do not measure its selection:\n\n");
        for (const char *p = floors; *p;) {
            size_t k = strcspn(p, "\n");
            sb_printf(&b, "- %.*s\n", (int)k, p);
            p += k + (p[k] == '\n');
        }
    }
    /* distractor answers: a miss that gave another key's value */
    int any = 0;
    for (int k = 0; k < e->o.n_methods; k++) {
        int n = 0, d = 0;
        for (int i = 0; i < e->n_rec; i++) {
            const cJSON *mm = cJSON_GetObjectItemCaseSensitive(e->rec[i], e->o.methods[k]);
            if (!mm || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(mm, "hit"))) continue;
            n++;
            d += cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(mm, "distractor"));
        }
        if (!d) continue;
        if (!any++) sb_printf(&b, "\n## Misses that answered a distractor's value\n\n| policy | misses | of them a distractor's value |\n|---|---|---|\n");
        sb_printf(&b, "| %s | %d | %d |\n", e->o.methods[k], n, d);
    }
    if (b.oom) { free(b.s); return NULL; }
    return b.s;
}

/* ---- cases.csv ------------------------------------------------------------------------- */

static void csv_field(sbuf *b, const char *s, int last) {
    int quote = strpbrk(s, ",\"\n\r") != NULL;
    if (!quote) sb_printf(b, "%s", s);
    else {
        sb_printf(b, "\"");
        for (const char *p = s; *p; p++) sb_printf(b, *p == '"' ? "\"\"" : "%c", *p);
        sb_printf(b, "\"");
    }
    sb_printf(b, last ? "\n" : ",");
}

static void csv_num(sbuf *b, double v, int last) {
    if (isfinite(v)) sb_printf(b, "%.9g", v);
    sb_printf(b, last ? "\n" : ",");
}

static char *cases_csv(const eval_state *e) {
    sbuf b = {0};
    sb_printf(&b, "case_key,task,length,depth,seed,budget,policy,value,asked_key,n_facts,facts,prompt_len,tok_begin,tok_end,"
              "inserted_depth,answer,hit,distractor_key,distractor_value,mass_recall,output_error,fetch_bytes,"
              "resident_bytes,t_prefill,t_decode,decode_steps,tok_per_s\n");
    for (int i = 0; i < e->n_rec; i++) {
        const cJSON *r = e->rec[i];
        const cJSON *fa = cJSON_GetObjectItemCaseSensitive(r, "facts");
        const cJSON *nd = cJSON_GetObjectItemCaseSensitive(r, "needle");
        char facts[1024] = "";
        int fl = 0;
        for (const cJSON *f = fa ? fa->child : NULL; f && fl < (int)sizeof facts; f = f->next)
            fl += snprintf(facts + fl, sizeof facts - fl, "%s%s=%s@%g-%g", fl ? ";" : "", rec_str(f, "key"),
                           rec_str(f, "value"), rec_num(f, "tok_begin"), rec_num(f, "tok_end"));
        for (int k = 0; k < e->o.n_methods; k++) {
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(r, e->o.methods[k]);
            if (!m) continue;
            csv_field(&b, rec_str(r, "case_key"), 0);
            csv_field(&b, rec_str(r, "task"), 0);
            csv_num(&b, rec_num(r, "length"), 0);
            csv_num(&b, rec_num(r, "depth"), 0);
            csv_num(&b, rec_num(r, "seed"), 0);
            csv_field(&b, rec_str(r, "budget"), 0);
            csv_field(&b, e->o.methods[k], 0);
            csv_field(&b, rec_str(r, "value"), 0);
            csv_field(&b, rec_str(r, "asked_key"), 0);
            csv_num(&b, fa ? cJSON_GetArraySize(fa) : NAN, 0);
            csv_field(&b, facts, 0);
            csv_num(&b, rec_num(r, "prompt_len"), 0);
            csv_num(&b, rec_num(nd, "tok_begin"), 0);
            csv_num(&b, rec_num(nd, "tok_end"), 0);
            csv_num(&b, rec_num(nd, "inserted_depth"), 0);
            csv_field(&b, rec_str(m, "answer"), 0);
            csv_num(&b, cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "hit")), 0);
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(m, "distractor");
            csv_field(&b, cJSON_IsObject(d) ? rec_str(d, "key") : "", 0);
            csv_field(&b, cJSON_IsObject(d) ? rec_str(d, "value") : "", 0);
            csv_num(&b, rec_num(m, "mass_recall"), 0);
            csv_num(&b, rec_num(m, "output_error"), 0);
            csv_num(&b, rec_num(m, "fetch_bytes"), 0);
            csv_num(&b, rec_num(m, "resident_bytes"), 0);
            csv_num(&b, rec_num(m, "t_prefill"), 0);
            csv_num(&b, rec_num(m, "t_decode"), 0);
            csv_num(&b, rec_num(m, "decode_steps"), 0);
            double td = rec_num(m, "t_decode"), st = rec_num(m, "decode_steps");
            csv_num(&b, td > 0 ? st / td : NAN, 1);
        }
    }
    if (b.oom) { free(b.s); return NULL; }
    return b.s;
}

/* ---- figures -------------------------------------------------------------------------- */

#define FIG_PANEL_W 460
#define FIG_PANEL_H 330

/* "model M; budget B; depths 10-90 %; 3 seeds; oracle on": what a figure of
 * the suite was made with, for its caption. */
static void fig_settings(const eval_state *e, const eval_budget *b, char *buf, size_t n) {
    double dlo = 100, dhi = 0;
    for (int i = 0; i < e->o.n_depths; i++) { dlo = fmin(dlo, e->o.depths[i]); dhi = fmax(dhi, e->o.depths[i]); }
    const char *model = e->model_path ? strrchr(e->model_path, '/') : NULL;
    model = model ? model + 1 : e->model_path ? e->model_path : "?";
    int len = snprintf(buf, n, "%s; ", model);
    if (b && len > 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, "budget %s %s; ", b->label,
                        b->pct > 0 ? "of the prompt" : "tokens per KV head");
    if (len > 0 && (size_t)len < n && e->o.n_depths == 1)
        len += snprintf(buf + len, n - (size_t)len, "depth %g %%; ", dlo);
    else if (len > 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, "%d depths %g-%g %%; ", e->o.n_depths, dlo, dhi);
    if (len > 0 && (size_t)len < n)
        snprintf(buf + len, n - (size_t)len, "%d seed%s%s", e->o.runs, e->o.runs == 1 ? "" : "s",
                 e->o.oracle ? "" : "; no oracle");
}

static int draw_heatmap(const eval_state *e, canvas *c, int W, int H) {
    int np = e->o.n_methods, cols = np < 3 ? np : 3;
    int rows = (np + cols - 1) / cols;
    int nx = e->o.n_lengths, ny = e->n_tasks, rc = 0;
    float *v = malloc(sizeof(float) * (size_t)(nx * ny));
    char (*xl)[16] = malloc(sizeof *xl * (size_t)nx);
    const char **xt = malloc(sizeof *xt * (size_t)nx), **yt = malloc(sizeof *yt * (size_t)ny);
    if (!v || !xl || !xt || !yt) { rc = skv_error(SKV_ENOMEM, "out of memory"); goto out; }
    for (int t = 0; t < ny; t++) yt[t] = e->tasks[t].name;
    canvas_clear(c);
    /* the settings on a line of their own over the panels */
    char settings[256];
    fig_settings(e, &e->main_budget, settings, sizeof settings);
    const canvas_geom *geo = canvas_geometry(c);
    double top = canvas_line_height(c, CANVAS_FONT_BODY) + 2 * geo->pad;
    canvas_text(c, W / 2.0, geo->pad, settings, CANVAS_FONT_BODY, CANVAS_CENTER | CANVAS_TOP, canvas_get_theme(c)->fg);
    /* one colour bar per row, beside its last panel (the scale is 0..100 for all) */
    double extra = np > 1 ? paint_colorbar_room(c) : 0;
    double pw = (W - extra) / cols, rh = (H - top) / rows;
    kv_opts kv = e->o.kv;
    set_budget(&kv, &e->main_budget);
    for (int k = 0; k < np && !rc; k++) {
        /* a length where the budget is under the policy's floor (it selects nothing there): "*" */
        int any_under = 0;
        for (int l = 0; l < nx; l++) {
            cli_len_label(e->o.lengths[l], xl[l], sizeof xl[l] - 1);
            int under = kv_under_floor(&kv, kv_policy_find(e->o.methods[k]), e->o.lengths[l], NULL, 0) > 0;
            if (under) strcat(xl[l], "*");
            any_under |= under;
            xt[l] = xl[l];
        }
        char title[80];
        snprintf(title, sizeof title, "%s%s", e->o.methods[k], any_under ? ", *: under its floor" : "");
        for (int t = 0; t < ny; t++)
            for (int l = 0; l < nx; l++) {
                cell_acc a;
                double mean, sd;
                cell(e, e->o.methods[k], e->tasks[t].name, e->o.lengths[l], e->main_budget.label, &a);
                seed_stats(&a, e->o.runs, &mean, &sd);
                v[t * nx + l] = (float)mean;
            }
        paint_heatmap h = {
            .title = title, .v = v, .nx = nx, .ny = ny,
            .x = { .label = "context length (tokens)" }, .y = { .label = "task" },
            .xticks = xt, .yticks = yt,
            .value = { .label = "accuracy", .unit = "%", .min = 0, .max = 100 },
            .annotate = "%.0f",
        };
        int col = k % cols, last = col == cols - 1 || k == np - 1;
        h.no_colorbar = np > 1 && !last;
        canvas_rect r = { col * pw, top + (double)(k / cols) * rh, pw + (np > 1 && last ? extra : 0), rh };
        rc = paint_draw_heatmap(c, r, &h, NULL);
    }
out:
    free(v);
    free(xl);
    free(xt);
    free(yt);
    return rc;
}

static double budget_x(const eval_budget *b) { return b->tokens > 0 ? b->tokens : b->pct; }

/* The budget sweep: accuracy against budget, a line per policy. Each
 * policy's points are dodged a little sideways about their budget (the ticks
 * stay on it), so policies at the same accuracy (all at 100 %, say) show side
 * by side rather than the last drawn hiding the others. */
static int draw_budget(const eval_state *e, canvas *c, int W, int H) {
    int np = e->o.n_methods, nb = e->n_sweep, rc = 0;
    double *x = malloc(sizeof(double) * (size_t)nb), *y = malloc(sizeof(double) * (size_t)(np * nb));
    double *xd = malloc(sizeof(double) * (size_t)(np * nb));
    double *ex = malloc(sizeof(double) * (size_t)(np * nb * 3)), *ey = malloc(sizeof(double) * (size_t)(np * nb * 3));
    paint_series *s = malloc(sizeof *s * (size_t)(2 * np));
    unsigned char *under = calloc((size_t)(np * nb), 1); /* a budget under the policy's floor: a hollow square */
    if (!x || !y || !xd || !ex || !ey || !s || !under) { rc = skv_error(SKV_ENOMEM, "out of memory"); goto out; }
    int any_under = 0;
    int pct = 0;
    double xlo = INFINITY, xhi = 0, ytop = 100, ybot = 0;
    for (int i = 0; i < nb; i++) {
        x[i] = budget_x(&e->sweep[i]);
        pct |= e->sweep[i].pct > 0;
        xlo = fmin(xlo, x[i]);
        xhi = fmax(xhi, x[i]);
    }
    /* the dodge: a share of the log axis's span (xlo / 1.3 to xhi * 1.3), the policies spread
     * over at most 0.3 of the narrowest gap between budgets */
    double span = log(xhi * 1.3) - log(xlo / 1.3), gap = span;
    for (int i = 1; i < nb; i++) gap = fmin(gap, fabs(log(x[i]) - log(x[i - 1])));
    double step = np > 1 ? fmin(0.02 * span, 0.3 * gap / (np - 1)) : 0;
    for (int k = 0; k < np; k++) {
        for (int i = 0; i < nb; i++) {
            cell_acc a;
            double mean, sd;
            cell(e, e->o.methods[k], NULL, e->sweep_len, e->sweep[i].label, &a);
            seed_stats(&a, e->o.runs, &mean, &sd);
            y[k * nb + i] = mean;
            xd[k * nb + i] = x[i] * exp(step * (k - (np - 1) / 2.0));
            double *px = ex + (size_t)(k * nb + i) * 3, *py = ey + (size_t)(k * nb + i) * 3;
            px[0] = px[1] = xd[k * nb + i]; /* each bar at its policy's point */
            px[2] = NAN;
            py[0] = isfinite(sd) ? mean - sd : NAN; /* the whole ± sd, even past 0 or 100 */
            py[1] = isfinite(sd) ? mean + sd : NAN;
            py[2] = NAN;
            if (isfinite(sd)) { ytop = fmax(ytop, mean + sd); ybot = fmin(ybot, mean - sd); }
            kv_opts kv = e->o.kv;
            char why[200];
            set_budget(&kv, &e->sweep[i]);
            any_under |= under[k * nb + i] = kv_under_floor(&kv, kv_policy_find(e->o.methods[k]), e->sweep_len, why,
                                                            sizeof why) > 0;
        }
        s[k] = (paint_series){ .name = e->o.methods[k], .x = xd + k * nb, .y = y + k * nb, .n = nb, .color = palette_cat(k),
                               .width = 2, .markers = 1, .hollow = under + k * nb };
        s[np + k] = (paint_series){ .name = NULL, .x = ex + (size_t)k * nb * 3, .y = ey + (size_t)k * nb * 3,
                                    .n = nb * 3, .color = palette_cat(k), .width = 1 };
    }
    char title[400], ll[16], settings[256];
    cli_len_label(e->sweep_len, ll, sizeof ll);
    fig_settings(e, NULL, settings, sizeof settings);
    const char *hol = any_under ? "; hollow: under the policy's floor" : "";
    snprintf(title, sizeof title, "accuracy against budget at %s tokens (bars: ± sd over seeds%s); %s", ll, hol, settings);
    if (canvas_text_width(c, title, CANVAS_FONT_TITLE) > W)
        snprintf(title, sizeof title, "accuracy against budget at %s tokens (± sd%s); %s", ll, hol, settings);
    canvas_clear(c);
    double top = 0; /* still too wide: the settings on a line of their own over the plot, as the heatmap's */
    if (canvas_text_width(c, title, CANVAS_FONT_TITLE) > W) {
        const canvas_geom *geo = canvas_geometry(c);
        snprintf(title, sizeof title, "accuracy against budget at %s tokens (bars: ± sd over seeds%s)", ll, hol);
        if (canvas_text_width(c, title, CANVAS_FONT_TITLE) > W)
            snprintf(title, sizeof title, "accuracy against budget at %s tokens (± sd%s)", ll,
                     any_under ? "; hollow: under the floor" : "");
        canvas_text(c, W / 2.0, geo->pad, settings, CANVAS_FONT_BODY, CANVAS_CENTER | CANVAS_TOP,
                    canvas_get_theme(c)->fg);
        top = canvas_line_height(c, CANVAS_FONT_BODY) + 2 * geo->pad;
    }
    paint_plot p = {
        .title = title,
        .x = { .label = "budget", .unit = pct ? "% of the prompt" : "tokens per KV head", .log = 1,
               .min = xlo / 1.3, .max = xhi * 1.3, .at = x, .n_at = nb },
        .y = { .label = "accuracy", .unit = "%", .min = ybot < 0 ? ybot : 0, .max = ytop > 100 ? ytop : 100 },
        .series = s, .n_series = 2 * np,
    };
    rc = paint_draw_plot(c, (canvas_rect){ 0, top, W, H - top }, &p, NULL);
out:
    free(x);
    free(xd);
    free(y);
    free(ex);
    free(ey);
    free(s);
    free(under);
    return rc;
}

static int save_figure(const eval_state *e, const char *name, int W, int H,
                       int (*draw)(const eval_state *, canvas *, int, int)) {
    canvas_png_opts po = { .scale = 1 };
    for (int svg = 0; svg < 2; svg++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s.%s", e->dir, name, svg ? "svg" : "png");
        canvas *c = NULL;
        int rc = svg ? canvas_svg_new(&c, W, H, &po) : canvas_png_new(&c, W, H, &po);
        if (!rc) rc = draw(e, c, W, H);
        if (!rc) rc = canvas_save(c, path, 1);
        canvas_free(c);
        if (rc) return rc;
    }
    return 0;
}

static int write_outputs(const eval_state *e, const skv_model *m, int partial, double wall) {
    char path[PATH_MAX];
    char *md = leaderboard(e, m, partial, wall);
    if (!md) return skv_error(SKV_ENOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/leaderboard.md", e->dir);
    int rc = skv_save_atomic(path, 1, skv_put_text, md);
    free(md);
    if (rc) return rc;
    char *csv = cases_csv(e);
    if (!csv) return skv_error(SKV_ENOMEM, "out of memory");
    size_t n = strlen(csv);
    if (n && csv[n - 1] == '\n') csv[n - 1] = 0; /* put_text ends it */
    snprintf(path, sizeof path, "%s/cases.csv", e->dir);
    rc = skv_save_atomic(path, 1, skv_put_text, csv);
    free(csv);
    if (rc) return rc;
    int np = e->o.n_methods, cols = np < 3 ? np : 3, rows = (np + cols - 1) / cols;
    if ((rc = save_figure(e, "heatmap", FIG_PANEL_W * cols, FIG_PANEL_H * rows, draw_heatmap))) return rc;
    if (e->n_sweep && (rc = save_figure(e, "budget", 900, 560, draw_budget))) return rc;
    return 0;
}

/* ---- the command ------------------------------------------------------------------------ */

int cmd_eval(int argc, char **argv) {
    cli_gen g;
    cli_gen_default(&g);
    eval_state e;
    memset(&e, 0, sizeof e);
    needle_opts_default(&e.o);
    const char *lengths_s = "1k,2k,4k", *depths_s = "10:90:20", *task_s = NULL, *task_file = NULL, *budget_s = "256";
    const char *budgets_s = NULL, *hay_path = NULL, *out_dir = NULL, *suite = NULL;
    int seeds = 3, sweep_len = 0, sweep_given = 0, force = 0, no_oracle = 0, task_given = 0;
    int have_model = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--suite") && i + 1 < argc) suite = argv[i + 1];
        have_model |= !strcmp(argv[i], "-m") || !strcmp(argv[i], "--model");
    }
    if (suite) {
        if (strcmp(suite, "demo")) return cli_usage_error("eval", "--suite: no suite '%s' (demo)", suite);
        lengths_s = "1k,2k,4000";
        depths_s = "10:90:10";
        task_s = "single,passkey,multikey";
        budgets_s = "64,128,256,512";
        sweep_len = 4000;
        if (needle_set_methods(&e.o, "dense,shadowkv,quest,freekv,specache,tailorkv"))
            return cli_usage_error("eval", "%s", skv_last_error());
    }
    if (suite || !have_model) {
        /* the demo model's ShadowKV preset (skv needle's): rank 16, 4 outliers, local 4 */
        static const char *const demo_flags[] = { "--rank", "16", "--outliers", "4", "--local", "4" };
        int na = (int)(sizeof demo_flags / sizeof demo_flags[0]);
        for (int i = 0; i < na; i++)
            if (cli_gen_option(&g, na, (char **)demo_flags, &i) != 1) return 2;
        cli_gen_forget_flags(&g); /* the preset's flags need not apply to every policy of --kv */
        /* The peers' windows and dense layers scaled to a 4-layer model at a 256-token budget as ShadowKV's
         * are (docs/EVAL.md): every layer under the budget, sinks and windows of 32 tokens. Not strict: a
         * --kv list without the policy that has one is fine. */
        static const char *const demo_opts[][2] = { { "dense_layers", "0" }, { "sink", "32" }, { "window", "32" },
                                                     { "start", "32" }, { "recent", "32" } };
        for (size_t i = 0; i < sizeof demo_opts / sizeof demo_opts[0]; i++)
            if (kv_opts_set(&g.s.kv, demo_opts[i][0], demo_opts[i][1], 0)) return cli_usage_error("eval", "%s", skv_last_error());
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { eval_help(stdout); cli_gen_free(&g); return 0; }
        if (!strcmp(a, "--force")) { force = 1; continue; }
        if (!strcmp(a, "--no-oracle")) { no_oracle = 1; continue; }
        static const char *const valued[] = { "--out", "--suite", "--task", "--task-file", "--lengths", "--depths",
                                              "--seeds", "--budgets", "--sweep-length", "--haystack", "--budget" };
        int k = -1;
        for (int j = 0; j < (int)(sizeof valued / sizeof valued[0]); j++) if (!strcmp(a, valued[j])) k = j;
        if (k >= 0) {
            if (!v) { cli_gen_free(&g); return cli_usage_error("eval", "%s needs a value", a); }
            i++;
            char *end;
            long x;
            switch (k) {
            case 0: out_dir = v; break;
            case 1: break;
            case 2: task_s = v; task_given = 1; break;
            case 3: task_file = v; break;
            case 4: lengths_s = v; break;
            case 5: depths_s = v; break;
            case 6: case 8:
                x = strtol(v, &end, 10);
                if (!*v || *end || x < 1 || x > (k == 6 ? 64 : 1 << 24)) {
                    cli_gen_free(&g);
                    return cli_usage_error("eval", "%s expects an integer in [1, %d], got '%s'", a, k == 6 ? 64 : 1 << 24, v);
                }
                if (k == 6) seeds = (int)x;
                else { sweep_len = (int)x; sweep_given = 1; }
                break;
            case 7: budgets_s = v; break;
            case 9: hay_path = v; break;
            default: budget_s = v; break;
            }
            continue;
        }
        if (!strcmp(a, "--kv") && v && strcmp(v, "help")) {
            if (needle_set_methods(&e.o, v)) { cli_gen_free(&g); return cli_usage_error("eval", "%s", skv_last_error()); }
            i++;
            continue;
        }
        static const char *const not_here[] = { "-p", "--prompt", "-f", "--file", "-n", "--n-predict", "--temp",
                                                "--top-k", "--top-p", "--trace", "--oracle" };
        for (int j = 0; j < (int)(sizeof not_here / sizeof not_here[0]); j++)
            if (!strcmp(a, not_here[j])) {
                cli_gen_free(&g);
                return cli_usage_error("eval", "%s does not apply: skv eval builds its own prompts, answers greedily "
                                       "and runs the oracle unless --no-oracle", a);
            }
        int r = cli_gen_option(&g, argc, argv, &i);
        if (r < 0) { cli_gen_free(&g); return 2; }
        if (r == CLI_DONE) { cli_gen_free(&g); return 0; }
        if (r == 0) { cli_gen_free(&g); return cli_usage_error("eval", "unknown option '%s'", a); }
    }
    int rc = 2;
    int *lengths = NULL;
    float *depths = NULL;
    skv_model *m = NULL;
    char *hay = NULL;
    if (!out_dir) { rc = cli_usage_error("eval", "--out DIR is required (where the leaderboard, CSV and figures go)"); goto out; }
    if (needle_parse_lengths(lengths_s, &lengths, &e.o.n_lengths) ||
        needle_parse_depths(depths_s, &depths, &e.o.n_depths)) {
        rc = cli_usage_error("eval", "%s", skv_last_error());
        goto out;
    }
    e.o.lengths = lengths;
    e.o.depths = depths;
    if (parse_budget(budget_s, &e.main_budget)) {
        rc = cli_usage_error("eval", "--budget expects tokens (256) or a percent (3%%), got '%s'", budget_s);
        goto out;
    }
    if (budgets_s) {
        for (const char *p = budgets_s; *p;) {
            const char *c = strchr(p, ',');
            char item[32];
            size_t len = c ? (size_t)(c - p) : strlen(p);
            if (e.n_sweep == EVAL_MAX_BUDGETS || len >= sizeof item) {
                rc = cli_usage_error("eval", "--budgets: at most %d items of tokens or percents", EVAL_MAX_BUDGETS);
                goto out;
            }
            memcpy(item, p, len);
            item[len] = 0;
            if (parse_budget(item, &e.sweep[e.n_sweep])) {
                rc = cli_usage_error("eval", "--budgets: bad item '%s' in '%s' (tokens such as 256, or 3%%)", item, budgets_s);
                goto out;
            }
            for (int j = 0; j < e.n_sweep; j++)
                if (!strcmp(e.sweep[j].label, item)) {
                    rc = cli_usage_error("eval", "--budgets: %s is listed twice", item);
                    goto out;
                }
            e.n_sweep++;
            p = c ? c + 1 : p + len;
        }
    }
    int found = 0;
    for (int i = 0; i < e.o.n_lengths; i++) found |= e.o.lengths[i] == sweep_len;
    if (!sweep_given && !found) sweep_len = 0; /* the suite's 4000 without it in --lengths: the largest */
    if (!sweep_len) for (int i = 0; i < e.o.n_lengths; i++) sweep_len = e.o.lengths[i] > sweep_len ? e.o.lengths[i] : sweep_len;
    found = 0;
    for (int i = 0; i < e.o.n_lengths; i++) found |= e.o.lengths[i] == sweep_len;
    if (e.n_sweep && !found) {
        rc = cli_usage_error("eval", "--sweep-length %d is not one of --lengths", sweep_len);
        goto out;
    }
    e.sweep_len = sweep_len;
    if (task_file && !task_given) task_s = NULL; /* the file's tasks, not the suite's built-in ones */
    if (needle_tasks_choose("eval", task_s, task_file, &e.tasks, &e.n_tasks)) goto out;
    if (e.n_tasks > EVAL_MAX_TASKS) { rc = cli_usage_error("eval", "at most %d tasks", EVAL_MAX_TASKS); goto out; }
    e.o.kv = g.s.kv;
    if (needle_check_flags(&g, "eval", &e.o)) { rc = 2; goto out; }
    if (needle_check_kv_opts(&e.o)) { rc = cli_usage_error("eval", "%s", skv_last_error()); goto out; }
    rc = 1;
    char model_buf[PATH_MAX + 64], hay_buf[PATH_MAX + 64];
    static const char *const hay_rel[] = { "samples/haystack.txt", "../samples/haystack.txt" };
    if (!g.model) {
        if (cli_demo_model("eval", model_buf, sizeof model_buf)) goto out;
        g.model = model_buf;
    }
    if (!hay_path) {
        if (cli_find_near_exe(hay_rel, 2, hay_buf, sizeof hay_buf)) {
            fprintf(stderr, "skv eval: no --haystack FILE given and the default %s is missing\n", hay_buf);
            goto out;
        }
        hay_path = hay_buf;
    }
    size_t hay_n;
    if (skv_read_file(hay_path, (size_t)64 << 20, &hay, &hay_n)) { rc = cli_fail(); goto out; }
    if (g.threads) skv_set_threads(g.threads);
    if (model_load(g.model, &m)) { rc = cli_fail(); goto out; }
    if (cli_check_lengths("eval", m, e.o.lengths, e.o.n_lengths, force)) { rc = 2; goto out; }
    e.model_path = g.model;
    e.hay_path = hay_path;
    e.dir = out_dir;
    e.o.haystack = hay;
    e.o.runs = seeds;
    e.o.ctx = g.s.ctx;
    e.o.batch = g.s.batch;
    e.o.no_bos = g.no_bos;
    e.o.oracle = !no_oracle;
    snprintf(e.o.backend, sizeof e.o.backend, "%s", g.s.backend);
    if (skv_make_dir(out_dir) || check_settings(&e, m, force) || load_cases(&e, force)) { rc = cli_fail(); goto out; }
    int per_grid = e.o.n_depths * seeds * e.n_tasks, extra = 0;
    for (int i = 0; i < e.n_sweep; i++) extra += strcmp(e.sweep[i].label, e.main_budget.label) != 0;
    e.planned = per_grid * e.o.n_lengths + per_grid * extra;
    e.done_before = e.n_rec;
    char note[256];
    if (needle_context_notice(m, &e.o, note, sizeof note)) fprintf(stderr, "skv eval: warning: %s\n", note);
    char floors[8192];
    if (floor_notes(&e, floors, sizeof floors)) cli_warn_lines(floors);
    if (!suite && !have_model) /* said once the suite starts, so that an error stays one line */
        cli_msg("no -m: the demo model, with its ShadowKV preset (--rank 16 --outliers 4 --local 4) and the peers' "
                "windows scaled to it as in --suite demo; flags given override them\n");
    fprintf(stderr, "skv eval: %s, %d task%s x %d length%s x %d depth%s x %d seed%s, %d polic%s, budget %s%s: "
            "%d cases, %d done before\n", g.model, e.n_tasks, e.n_tasks == 1 ? "" : "s", e.o.n_lengths,
            e.o.n_lengths == 1 ? "" : "s", e.o.n_depths, e.o.n_depths == 1 ? "" : "s", seeds, seeds == 1 ? "" : "s",
            e.o.n_methods, e.o.n_methods == 1 ? "y" : "ies", e.main_budget.label,
            e.n_sweep ? " and a budget sweep" : "", e.planned, e.done_before);
    e.t0 = e.t_last = skv_now();
    cli_stop_catch("case");
    rc = run_suite(&e, m);
    cli_stop_release();
    if (isatty(2) && e.done_now) fputc('\n', stderr);
    int partial = rc == CLI_STOPPED;
    if (rc && !partial) { rc = cli_fail(); goto out; }
    partial |= e.n_rec < e.planned;
    if (write_outputs(&e, m, partial, skv_now() - e.t0)) { rc = cli_fail(); goto out; }
    fprintf(stderr, "skv eval: %s %d of %d cases in %.0f s (%d this sitting); wrote %s/leaderboard.md, cases.csv, "
            "heatmap.png/.svg%s\n", partial ? "interrupted after" : "finished", e.n_rec, e.planned, skv_now() - e.t0,
            e.done_now, out_dir, e.n_sweep ? ", budget.png/.svg" : "");
    rc = rc == CLI_STOPPED ? CLI_STOPPED : 0;
out:
    if (e.jl) fclose(e.jl);
    for (int i = 0; i < e.n_rec; i++) cJSON_Delete(e.rec[i]);
    free(e.rec);
    needle_tasks_free(e.tasks, e.n_tasks);
    model_free(m);
    free(hay);
    free(lengths);
    free(depths);
    cli_gen_free(&g);
    return rc;
}

/* ---- the resume reader, for tests/fuzz/fuzz_eval.c --------------------------------- */

int eval_resume_check(const char *dir) {
    eval_state e;
    memset(&e, 0, sizeof e);
    needle_opts_default(&e.o);
    static int lengths[] = { 1024, 2048 };
    static float depths[] = { 10, 50, 90 };
    e.o.lengths = lengths;
    e.o.n_lengths = 2;
    e.o.depths = depths;
    e.o.n_depths = 3;
    e.o.runs = 2;
    int rc = needle_set_methods(&e.o, "dense,shadowkv,quest");
    if (!rc) rc = parse_budget("256", &e.main_budget) || parse_budget("64", &e.sweep[0]) ? SKV_EINVAL : 0;
    e.n_sweep = 1;
    e.sweep_len = 2048;
    e.dir = dir;
    e.model_path = "model.gguf";
    e.hay_path = "haystack.txt";
    if (!rc && (rc = needle_tasks_choose("eval", "single,multikey", NULL, &e.tasks, &e.n_tasks))) rc = SKV_EINVAL;
    if (!rc) rc = load_cases(&e, 0);
    if (!rc) {
        /* what the leaderboard, the CSV and the figures make of the records */
        skv_model m;
        memset(&m, 0, sizeof m);
        snprintf(m.cfg.name, sizeof m.cfg.name, "fuzz");
        e.planned = 2 * 3 * 2 * 2 + 3 * 2 * 2;
        char *md = leaderboard(&e, &m, 1, 0), *csv = cases_csv(&e);
        free(md);
        free(csv);
        canvas *c = NULL;
        if (canvas_svg_new(&c, 900, 560, NULL) == 0) {
            draw_heatmap(&e, c, 900, 560);
            canvas_clear(c);
            draw_budget(&e, c, 900, 560);
            canvas_free(c);
        }
    }
    if (e.jl) fclose(e.jl);
    for (int i = 0; i < e.n_rec; i++) cJSON_Delete(e.rec[i]);
    free(e.rec);
    needle_tasks_free(e.tasks, e.n_tasks);
    return rc;
}
