/* cli.c: the generation options every generating command takes (model,
 * prompt, context, sampling, KV policy), parsed the same way everywhere. */
#include "cli.h"
#include "lanes.h"
#include "compare.h"
#include "backend.h"
#include "skv.h"

#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cli_gen_default(cli_gen *g) {
    memset(g, 0, sizeof *g);
    g->n_predict = 64;
    session_opts_default(&g->s);
}

void cli_gen_free(cli_gen *g) { free(g->prompt_buf); g->prompt_buf = NULL; }

const char *cli_command = NULL;

void cli_msg(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (cli_command) fprintf(stderr, "skv %s: ", cli_command);
    else fputs("skv: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

void cli_warn_lines(const char *text) {
    for (const char *p = text; *p;) {
        size_t k = strcspn(p, "\n");
        cli_msg("warning: %.*s\n", (int)k, p);
        p += k + (p[k] == '\n');
    }
}

int cli_fail(void) {
    cli_msg("%s\n", skv_last_error());
    return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "skv %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see skv %s --help)\n", cmd);
    return 2;
}

static int parse_int(const char *flag, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < lo || x > hi) {
        cli_msg("%s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_float(const char *flag, const char *v, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || errno || !(x >= lo && x <= hi)) {
        char a[40], b[40];
        cli_msg("%s expects a number in [%s, %s], got '%s'\n", flag, skv_num(a, sizeof a, lo, 6),
                skv_num(b, sizeof b, hi, 6), v ? v : "");
        return -1;
    }
    *out = (float)x;
    return 0;
}

int cli_single_policy(const cli_gen *g, const char *cmd) {
    if (g->n_kv <= 1) return 0;
    return cli_usage_error(cmd, "--kv takes one policy here (a list of policies is compared by skv run and skv inspect)");
}

int cli_gen_option(cli_gen *g, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
#define TAKES_VALUE() do { if (!v) { cli_msg("%s needs a value\n", a); return -1; } (*i)++; } while (0)
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) { TAKES_VALUE(); g->model = v; return 1; }
    if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { TAKES_VALUE(); g->prompt = v; return 1; }
    if (!strcmp(a, "-f") || !strcmp(a, "--file")) { TAKES_VALUE(); g->prompt_file = v; return 1; }
    if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { TAKES_VALUE(); return parse_int(a, v, 0, 1 << 24, &g->n_predict) ? -1 : 1; }
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) { TAKES_VALUE(); return parse_int(a, v, 1, 1 << 24, &g->s.ctx) ? -1 : 1; }
    if (!strcmp(a, "-b") || !strcmp(a, "--batch")) { TAKES_VALUE(); return parse_int(a, v, 1, 1 << 16, &g->s.batch) ? -1 : 1; }
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { TAKES_VALUE(); return parse_int(a, v, 1, 1024, &g->threads) ? -1 : 1; }
    if (!strcmp(a, "--temp")) { TAKES_VALUE(); return parse_float(a, v, 0, 100, &g->s.sample.temp) ? -1 : 1; }
    if (!strcmp(a, "--top-k")) { TAKES_VALUE(); return parse_int(a, v, 0, 1 << 24, &g->s.sample.top_k) ? -1 : 1; }
    if (!strcmp(a, "--top-p")) { TAKES_VALUE(); return parse_float(a, v, 0, 1, &g->s.sample.top_p) ? -1 : 1; }
    if (!strcmp(a, "--seed")) {
        TAKES_VALUE();
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 10);
        if (!*v || *end || errno || *v == '-') { cli_msg("--seed expects a non-negative integer, got '%s'\n", v); return -1; }
        g->s.sample.seed = s;
        return 1;
    }
    if (!strcmp(a, "--no-bos")) { g->no_bos = 1; return 1; }
    if (!strcmp(a, "--backend")) {
        TAKES_VALUE();
        if (!skv_backend_find(v)) { cli_msg("%s\n", skv_last_error()); return -1; }
        snprintf(g->s.backend, sizeof g->s.backend, "%s", v);
        return 1;
    }
    if (!strcmp(a, "--kv")) {
        TAKES_VALUE();
        if (!strcmp(v, "help")) { kv_policies_help(stdout); return CLI_DONE; }
        int n = compare_parse(v, g->kv_list, 8);
        if (n < 0) { cli_msg("%s\n", skv_last_error()); return -1; }
        g->n_kv = n;
        snprintf(g->s.kv.policy, sizeof g->s.kv.policy, "%s", g->kv_list[0]);
        return 1;
    }
    if (!strcmp(a, "--kv-opt")) {
        TAKES_VALUE();
        if (kv_opts_set_pair(&g->s.kv, v)) { cli_msg("%s\n", skv_last_error()); return -1; }
        return 1;
    }
    if (!strcmp(a, "--budget")) {
        TAKES_VALUE();
        size_t n = strlen(v);
        if (n > 1 && v[n - 1] == '%') { /* a share of the prompt */
            char num[32];
            if (n - 1 >= sizeof num) { cli_msg("--budget '%s' is not a number or a percentage\n", v); return -1; }
            memcpy(num, v, n - 1);
            num[n - 1] = 0;
            if (parse_float(a, num, 1e-3, 100, &g->s.kv.budget_pct)) return -1;
            return 1;
        }
        g->s.kv.budget_pct = 0;
        return parse_int(a, v, 1, 1 << 24, &g->s.kv.budget) ? -1 : 1;
    }
    if (!strcmp(a, "--trace")) { TAKES_VALUE(); g->trace = v; return 1; }
    if (!strcmp(a, "--force")) { g->force = 1; return 1; }
    if (!strcmp(a, "--oracle")) { g->s.kv.oracle = 1; return 1; }
    if (!strcmp(a, "--offload-file")) {
        TAKES_VALUE();
        if (!*v || strlen(v) >= sizeof g->s.kv.offload_file) {
            cli_msg("--offload-file: the path must have 1 to %zu bytes\n", sizeof g->s.kv.offload_file - 1);
            return -1;
        }
        snprintf(g->s.kv.offload_file, sizeof g->s.kv.offload_file, "%s", v);
        return 1;
    }
    /* A policy's own flag (--rank 16 is rank=16): applies to the policies
     * that have the option; the others ignore it. */
    for (int p = 0; p < kv_policy_count(); p++) {
        const kv_class *pc = kv_policy_at(p);
        for (int j = 0; j < pc->n_opts; j++) {
            const kv_opt_def *d = &pc->opts[j];
            if (!d->flag || strcmp(a, d->flag)) continue;
            const char *val = "1";
            if (d->type != KV_OPT_FLAG) { TAKES_VALUE(); val = v; }
            if (kv_opts_set(&g->s.kv, d->key, val, 0)) {
                cli_msg("%s: %s\n", a, skv_last_error());
                return -1;
            }
            int seen = 0;
            for (int k = 0; k < g->n_flags_given; k++) seen |= !strcmp(g->flags_given[k], d->flag);
            if (!seen && g->n_flags_given < (int)(sizeof g->flags_given / sizeof g->flags_given[0]))
                g->flags_given[g->n_flags_given++] = d->flag;
            return 1;
        }
    }
#undef TAKES_VALUE
    return 0;
}

void cli_gen_forget_flags(cli_gen *g) { g->n_flags_given = 0; }

int cli_check_policy_flags(const cli_gen *g, const char *cmd, const char *const *policies, int n) {
    const char *own[8];
    if (!policies) {
        n = g->n_kv > 1 ? g->n_kv : 1;
        for (int i = 0; i < n; i++) own[i] = g->n_kv > 1 ? g->kv_list[i] : g->s.kv.policy;
        policies = own;
    }
    for (int f = 0; f < g->n_flags_given; f++) {
        int applies = 0;
        for (int i = 0; i < n && !applies; i++) {
            const kv_class *pc = kv_policy_find(policies[i]);
            for (int j = 0; pc && j < pc->n_opts && !applies; j++)
                applies = pc->opts[j].flag && !strcmp(pc->opts[j].flag, g->flags_given[f]);
        }
        if (applies) continue;
        char who[200] = "", in[200] = "";
        size_t wl = 0, il = 0;
        for (int p = 0; p < kv_policy_count(); p++) {
            const kv_class *pc = kv_policy_at(p);
            for (int j = 0; j < pc->n_opts; j++)
                if (pc->opts[j].flag && !strcmp(pc->opts[j].flag, g->flags_given[f]) && wl < sizeof who)
                    wl += (size_t)snprintf(who + wl, sizeof who - wl, "%s%s", wl ? ", " : "", pc->name);
        }
        for (int i = 0; i < n && il < sizeof in; i++)
            il += (size_t)snprintf(in + il, sizeof in - il, "%s%s", i ? ", " : "", policies[i]);
        return cli_usage_error(cmd, "%s does not apply to %s: it is an option of %s", g->flags_given[f], in, who);
    }
    /* --oracle scores sparse policies against exact attention (session_new
     * gives dense none): with dense alone it does nothing, so say so */
    int sparse = 0;
    for (int i = 0; i < n; i++) sparse |= kv_policy_find(policies[i]) != &kv_policy_dense;
    if (g->s.kv.oracle && !sparse)
        cli_msg("oracle: dense attends every token exactly, so there is nothing to score (--oracle scores a sparse "
                "policy against dense)\n");
    return 0;
}

int cli_no_trace(const cli_gen *g, const char *cmd) {
    if (!g->trace) return 0;
    return cli_usage_error(cmd, "--trace: skv %s records no trace (skv run --trace records one)", cmd);
}

void cli_gen_help(FILE *o, int flags) {
    fprintf(o,
            "  -m, --model PATH      GGUF file or HF directory (config.json, *.safetensors, tokenizer.json)\n"
            "  -p, --prompt TEXT     prompt text (special tokens such as <|im_start|> are parsed)\n"
            "  -f, --file FILE       read the prompt from FILE (- : standard input, also read when piped)\n"
            "  -c, --ctx N           context positions (default: the model's trained context)\n"
            "  -b, --batch N         prefill batch size (default 512)\n"
            "  -t, --threads N       worker threads (default: one per physical core, as llama.cpp)\n"
            "      --no-bos          do not add the BOS token\n"
            "      --backend NAME    where the math runs (default cpu; skv info --backends lists them)\n"
#ifdef SKV_HAVE_CUDA
            "                        cuda: dense and shadowkv on an NVIDIA GPU (built, not yet verified on\n"
            "                        hardware); without a device it runs on cpu and says so\n"
#endif
            );
    if (flags & CLI_HELP_TRACE)
        fprintf(o,
                "      --trace FILE      record every probe event of the run to FILE (skv trace info FILE)\n"
                "      --force           replace an existing --trace file (without it, an existing file is refused)\n");
    fprintf(o,
            "      --kv POLICY       KV cache policy (default dense); --kv help lists the policies and options;\n"
            "                        a list A,B,... runs them in lockstep on the same tokens (run, inspect)\n"
            "      --kv-opt KEY=VAL  set an option of the policy (checked: the policy must have it)\n"
            "      --budget B        tokens attended per KV head, or B%% of the prompt (default 2048)\n"
            "      --oracle          exact attention beside the policy (recall, error; diagnostics)\n"
            "      --offload-file PATH  shadowkv: keep the offloaded values in a new file at PATH instead of RAM,\n"
            "                        for contexts larger than memory (an existing PATH is refused; the file is\n"
            "                        unlinked once mapped, so nothing is left behind)\n");
    /* The policies' own flags, from their option tables; a flag several
     * policies share is listed once with each one's default. */
    for (int p = 0; p < kv_policy_count(); p++) {
        const kv_class *pc = kv_policy_at(p);
        for (int j = 0; j < pc->n_opts; j++) {
            const kv_opt_def *d = &pc->opts[j];
            if (!d->flag) continue;
            int seen = 0;
            for (int q = 0; q < p && !seen; q++)
                for (int i = 0; i < kv_policy_at(q)->n_opts && !seen; i++)
                    seen = kv_policy_at(q)->opts[i].flag && !strcmp(kv_policy_at(q)->opts[i].flag, d->flag);
            if (seen) continue;
            char left[48], who[256] = "";
            size_t wl = 0;
            int shared = 0;
            for (int q = p; q < kv_policy_count(); q++) {
                const kv_opt_def *e = kv_policy_opt(kv_policy_at(q), d->key);
                if (!e || !e->flag || strcmp(e->flag, d->flag)) continue;
                shared += q > p;
                if (d->type == KV_OPT_FLAG) wl += (size_t)snprintf(who + wl, sizeof who - wl, "%s%s", wl ? ", " : "",
                                                                   kv_policy_at(q)->name);
                else {
                    char num[40];
                    wl += (size_t)snprintf(who + wl, sizeof who - wl, "%s%s %s", wl ? ", " : "", kv_policy_at(q)->name,
                                           skv_num(num, sizeof num, e->def, 6));
                }
                if (wl >= sizeof who) break;
            }
            snprintf(left, sizeof left, "%s%s", d->flag, d->type == KV_OPT_FLAG ? "" : " N");
            if (d->type == KV_OPT_FLAG) fprintf(o, "      %-18s%s: %s\n", left, pc->name, d->help);
            else if (!shared) {
                char num[40];
                fprintf(o, "      %-18s%s: %s (default %s)\n", left, pc->name, d->help, skv_num(num, sizeof num, d->def, 6));
            }
            else fprintf(o, "      %-18s%s (default %s)\n", left, d->help, who);
        }
    }
    if (flags & CLI_HELP_SAMPLING)
        fprintf(o,
                "  -n, --n-predict N     tokens to generate (default 64)\n"
                "      --temp T          temperature; 0 = greedy (default 0)\n"
                "      --top-k K         keep the K most likely tokens (0 = all)\n"
                "      --top-p P         nucleus sampling threshold (default 1)\n"
                "      --seed S          random seed (default 0)\n");
}

/* Standard input to its end (at most max bytes) as a NUL-terminated string. */
static int read_stdin(size_t max, char **out) {
    size_t n = 0, cap = 1 << 16;
    char *b = malloc(cap + 1);
    if (!b) return skv_error(SKV_ENOMEM, "stdin: out of memory");
    size_t got;
    while ((got = fread(b + n, 1, cap - n, stdin)) > 0) {
        n += got;
        if (n == cap) {
            if (cap >= max) {
                free(b);
                return skv_error(SKV_EFORMAT, "stdin: more than the %zu bytes a prompt may have", max);
            }
            cap *= 2;
            char *nb = realloc(b, cap + 1);
            if (!nb) {
                free(b);
                return skv_error(SKV_ENOMEM, "stdin: out of memory");
            }
            b = nb;
        }
    }
    if (ferror(stdin)) {
        free(b);
        return skv_error(SKV_EIO, "stdin: cannot read: %s", strerror(errno));
    }
    b[n] = 0;
    *out = b;
    return 0;
}

const char *cli_prompt_text(cli_gen *g) {
    if (g->prompt && g->prompt_file) {
        cli_msg("give either -p or -f, not both\n");
        return NULL;
    }
    if (g->prompt) {
        if (!*g->prompt) cli_msg("the prompt is empty: -p needs text\n");
        return *g->prompt ? g->prompt : NULL;
    }
    int from_stdin = g->prompt_file && (!strcmp(g->prompt_file, "-") || !strcmp(g->prompt_file, "/dev/stdin"));
    int implicit = !g->prompt_file && !isatty(STDIN_FILENO); /* a prompt piped in */
    from_stdin |= implicit;
    if (!g->prompt_file && !from_stdin) {
        cli_msg("no prompt: give -p TEXT, -f FILE, or pipe it in (-f - reads standard input)\n");
        return NULL;
    }
    char *b;
    size_t n;
    if (from_stdin) {
        if (read_stdin((size_t)1 << 30, &b)) {
            cli_msg("%s\n", skv_last_error());
            return NULL;
        }
        if (!*b) {
            free(b);
            cli_msg("no prompt: give -p TEXT or -f FILE (standard input was empty)\n");
            return NULL;
        }
        g->prompt_buf = b;
        return b;
    }
    if (skv_read_file(g->prompt_file, (size_t)1 << 30, &b, &n)) {
        cli_msg("%s\n", skv_last_error());
        return NULL;
    }
    if (!n) {
        free(b);
        cli_msg("no prompt: %s is empty\n", g->prompt_file);
        return NULL;
    }
    g->prompt_buf = b;
    return b;
}

int cli_check_output(const char *cmd, const char *path, int force) {
    if (!path) return 0;
    struct stat sb;
    if (!*path) {
        fprintf(stderr, "skv %s: an output file name is empty\n", cmd);
        return 1;
    }
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "skv %s: %s is a directory; give a file name for the output\n", cmd, path);
        return 1;
    }
    if (!force && lstat(path, &sb) == 0) {
        fprintf(stderr, "skv %s: %s exists; use --force to replace it\n", cmd, path);
        return 1;
    }
    /* Its folder must exist and take a new file (the temp file, then the rename). */
    char dir[PATH_MAX];
    cli_dir_of(path, dir, sizeof dir);
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "skv %s: %s: the folder %s does not exist\n", cmd, path, dir);
        return 1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        fprintf(stderr, "skv %s: %s: the folder %s is not writable\n", cmd, path, dir);
        return 1;
    }
    return 0;
}

void cli_dir_of(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, cap, ".");
    else if (slash == path) snprintf(dir, cap, "/");
    else snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

int cli_check_seq(const char *cmd, const probe_lanes *lanes, const char *path, int seq) {
    int n = probe_lanes_count(lanes);
    if (probe_lanes_batched(lanes) && seq < n) return 0;
    if (probe_lanes_batched(lanes)) fprintf(stderr, "skv %s: --seq %d: %s holds sequences 0 to %d\n", cmd, seq, path, n - 1);
    else fprintf(stderr, "skv %s: --seq %d: %s is not a batched run (skv run --parallel B --trace FILE records one)\n",
                 cmd, seq, path);
    return 1;
}

void cli_ctx_warning(const cli_gen *g, const skv_model *m) {
    if (g->s.ctx > 0 && m->cfg.ctx_train > 0 && g->s.ctx > m->cfg.ctx_train)
        cli_msg("warning: -c %d is past the %d positions the model was trained on; positions beyond "
                "them are untrained and its output there is not to be trusted\n", g->s.ctx, m->cfg.ctx_train);
}

int cli_check_lengths(const char *cmd, const skv_model *m, const int *lengths, int n, int force) {
    int mx = 0;
    for (int i = 0; i < n; i++) mx = lengths[i] > mx ? lengths[i] : mx;
    if (force || m->cfg.ctx_train <= 0 || mx <= 2 * m->cfg.ctx_train) return 0;
    fprintf(stderr, "skv %s: --lengths: %d tokens is more than twice the model's trained context of %d; such a case "
            "cannot be expected to retrieve and takes long (add --force to run it anyway)\n", cmd, mx,
            m->cfg.ctx_train);
    return 2;
}

/* The quit signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT) are taken by one
 * thread of their own, which only waits for them: every other thread (the
 * main one, the OpenMP, oneDNN and engine threads, which inherit main's mask)
 * blocks them. A handler's frame pushed onto a thread in the middle of a
 * JIT-compiled GEMM corrupted the heap now and then (Ctrl-C in skv needle:
 * "corrupted size vs. prev_size" in oneDNN's free, several runs in 30); the
 * handlers (here and in app.c) only set flags and write a pipe, so the
 * thread they run on does not matter. With no handler installed the default
 * action still ends the whole process. */
static void *signal_thread(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

void cli_signals_own_thread(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    pthread_attr_t at;
    pthread_t th;
    if (pthread_attr_init(&at)) return;
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    /* the new thread keeps the signals open; then this one (and every thread
     * it starts from now on) closes them */
    if (!pthread_create(&th, &at, signal_thread, NULL)) pthread_sigmask(SIG_BLOCK, &set, NULL);
    pthread_attr_destroy(&at);
}

static volatile sig_atomic_t stop_flag;
static struct sigaction stop_old_int, stop_old_term;
static char stop_line[200];
static size_t stop_len;

static void on_stop(int sig) {
    (void)sig;
    if (stop_flag) _exit(CLI_STOPPED); /* a second Ctrl-C: leave now (a trace stays readable, cut short) */
    stop_flag = 1;
    if (stop_len) { ssize_t w = write(STDERR_FILENO, stop_line, stop_len); (void)w; } /* async-signal-safe */
}

void cli_stop_catch(const char *unit) {
    snprintf(stop_line, sizeof stop_line, "\nskv%s%s: stopping after the %s in flight (Ctrl-C again to quit now)\n",
             cli_command ? " " : "", cli_command ? cli_command : "", unit);
    stop_len = strlen(stop_line);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    stop_flag = 0;
    sigaction(SIGINT, &sa, &stop_old_int);
    sigaction(SIGTERM, &sa, &stop_old_term);
}

int cli_stop_requested(void) { return stop_flag != 0; }

void cli_stop_release(void) {
    sigaction(SIGINT, &stop_old_int, NULL);
    sigaction(SIGTERM, &stop_old_term, NULL);
}

/* ---- defaults next to the executable ---------------------------------------- */

int cli_demo_model(const char *cmd, char *out, size_t cap) {
    static const char *const rel[] = { "samples/model/skv-demo.gguf", "../samples/model/skv-demo.gguf" };
    if (!cli_find_near_exe(rel, 2, out, cap)) return 0;
    fprintf(stderr, "skv %s: no -m MODEL given and the default model %s is missing\n", cmd, out);
    return 1;
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The first of rels that exists relative to the executable's directory, then
 * the current directory, into out; -1 (with the first path tried) if none. */
int cli_find_near_exe(const char *const *rels, int n, char *out, size_t cap) {
    char dir[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", dir, sizeof dir - 1);
    int have = 0;
    if (len > 0) {
        dir[len] = 0;
        char *s = strrchr(dir, '/');
        if (s) { *s = 0; have = 1; }
    }
    for (int pass = have ? 0 : 1; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            if (pass == 0) snprintf(out, cap, "%s/%s", dir, rels[i]);
            else snprintf(out, cap, "%s", rels[i]);
            if (file_exists(out)) return 0;
        }
    if (have) snprintf(out, cap, "%s/%s", dir, rels[0]);
    else snprintf(out, cap, "%s", rels[0]);
    return -1;
}

void cli_context_full_text(char *buf, size_t n, int ctx) {
    snprintf(buf, n, "the context of %d positions is full: generation stops here (raise it with -c)", ctx);
}

void cli_len_label(int v, char *buf, size_t n) {
    if (v >= 1024 && v % 1024 == 0) snprintf(buf, n, "%dk", v / 1024);
    else snprintf(buf, n, "%d", v);
}

void cli_bytes(char *buf, size_t cap, double n) {
    if (n < 1024) snprintf(buf, cap, "%.0f B", n);
    else if (n < 1048576) snprintf(buf, cap, "%.1f KiB", n / 1024);
    else if (n < 1073741824.0) snprintf(buf, cap, "%.2f MiB", n / 1048576);
    else snprintf(buf, cap, "%.2f GiB", n / 1073741824.0);
}
