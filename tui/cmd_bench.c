/* cmd_bench.c: `skv bench`: prefill and decode speed on a synthetic prompt
 * of random token ids, for one model and KV policy per run. Side-by-side
 * comparisons (dense vs shadowkv, probes on vs off) are made by
 * tests/bench.sh, which runs this in one go and prints ratios. */
#include "batch.h"
#include "cli.h"
#include "model.h"
#include "skv.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

static void help(FILE *o) {
    fprintf(o, "usage: skv bench -m MODEL [--prompt-tokens N] [-n N] [--repeat R] [options]\n\n"
               "Times a prefill of N random tokens (default 512) and N decode steps after it\n"
               "(default 64); prints one line: prefill tok/s, decode tok/s, decode ms/step, and\n"
               "the KV bytes moved per decode step (fetched from slow memory; read from resident\n"
               "memory where the policy counts it); for a policy that measures them, the\n"
               "achieved fetch bandwidth and the equivalent bandwidth of its decode attention\n"
               "(K and V bytes exact attention would read / the time it took), beside the host\n"
               "memory's copy bandwidth measured in the same run (0: not measured). Then the\n"
               "decode roofline: the weight bytes a step reads, a dense cache's K and V bytes\n"
               "(f32; f16 with --kv dense --f16-kv) at the mean decode context, the memory's\n"
               "read bandwidth with these threads (measured here) and the tok/s that bandwidth\n"
               "allows a dense decode. The first decode step warms up (on a GPU it captures\n"
               "the step's graph): decode tok/s, ms/step and the stages below are over the\n"
               "steps after it, and it is said apart (warmup_ms).\n"
               "ShadowKV on the CPU adds a second line, \"stages:\": the decode attention's wall\n"
               "time per step by stage (select: landmark scores, softmax, top-k; rebuild: the\n"
               "misses' value fetch and key rebuild; attend: the sparse attention), the rest of\n"
               "the step (weights, norms, sampling), and the chunk cache's hit rate.\n"
               "The best of R repeats (default 1) is reported.\n"
               "A long run says on stderr how far it is (the prefill, the forks, the steps). Ctrl-C stops after\n"
               "the decode step (or prefill chunk) in flight and prints what it measured: a run cut short says\n"
               "decode=<steps made> and partial=1 (exit status 130); a second Ctrl-C quits at once.\n\n");
    cli_gen_help(o, 0);
    fprintf(o, "  -n N                  decode steps (default 64)\n"
               "      --prompt-tokens N prompt length (default 512)\n"
               "      --repeat R        repeats; the best is reported (default 1)\n"
               "  -np, --parallel B     decode B sequences together: the prompt prefilled once and forked\n"
               "                        (a shared prefix, as llama-batched-bench -pps; each fork holds its own\n"
               "                        copy), one pass of the weights a step; prints parallel=B, decode_tok_s =\n"
               "                        B x steps / time and decode_ms a step past the first (warmup_ms: on a\n"
               "                        GPU it captures the step's graph), prefill_tok_s without the recording\n"
               "                        for the forks (prefill_record_s), and the KV bytes resident for all B\n"
               "                        and per sequence. A list (1,8,max) runs each from the one prefill (a size\n"
               "                        over --mem said and skipped; fit: the largest that fits, said, not run),\n"
               "                        and --kv a,b forks the first policy's prefill into each policy (one line a\n"
               "                        policy and B; a \"note:\" line says a later policy's figures are approximate:\n"
               "                        its cache holds keys and values made through the first's prefill attention)\n"
               "      --max-parallel    the largest B that fits under --mem (one sequence's KV bytes measured on a\n"
               "                        fork, its activations estimated, beside the weights and the prompt's\n"
               "                        source; with --offload-file, each fork's values in a file of their own\n"
               "                        there, within four fifths of the free disk), then the bench at it;\n"
               "                        with --backend cuda, within nine tenths of the device's free memory\n"
               "                        (resident KV, activations) and --mem of the host's (offloaded values);\n"
               "                        at most 4096: bound= says what set it (memory, disk, device, host, or cap,\n"
               "                        the 4096 limit, said on stderr with what the tightest pool would hold)\n"
               "      --mem GIB         the memory a batch may take (default: the machine's available memory\n"
               "                        less a tenth); a --parallel B over it is refused, naming what it needs\n");
}

/* Host memory bandwidth, measured here: the best of 5 copies of 64 MiB
 * (bytes read + bytes written per second, as a device-to-device copy is
 * counted), the yardstick of the equivalent bandwidth (paper §4.2). */
static double copy_gbs(void) {
    size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (a && b) {
        memset(a, 1, n);
        memset(b, 2, n);
        for (int r = 0; r < 5; r++) {
            double t = skv_now();
            memcpy(b, a, n);
            t = skv_now() - t;
            if (t > 0 && 2.0 * n / t > best) best = 2.0 * n / t;
            a[r] = b[n - 1 - r]; /* keep the copies observable */
        }
    }
    free(a);
    free(b);
    return best / 1e9;
}

/* The machine's read bandwidth with the bench's threads, GB/s: the best of
 * 3 passes summing 256 MiB (beyond any cache). Decode of a dense model reads
 * every weight once per token, so this bounds its tok/s from above. */
static double read_gbs(void) {
    size_t n = ((size_t)256 << 20) / sizeof(float);
    float *a = skv_aligned_alloc(n * sizeof(float));
    if (!a) return 0;
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    double best = 0, keep = 0;
    for (int r = 0; r < 3; r++) {
        double t = skv_now(), sum = 0;
        long long nn = (long long)n;
        #pragma omp parallel for reduction(+ : sum) schedule(static)
        for (long long i = 0; i < nn; i += 16) {
            float s8 = 0;
            for (int k = 0; k < 16; k++) s8 += a[i + k];
            sum += s8;
        }
        t = skv_now() - t;
        keep += sum;
        if (t > 0 && n * sizeof(float) / t > best) best = n * sizeof(float) / t;
    }
    free(a);
    return keep < 0 ? 0 : best / 1e9;
}

/* Bytes a decode step reads of the weights: all of them (model_weight_bytes)
 * but the embedding table, of which it reads one row, unless the output head
 * is that table (tied embeddings). */
static double weight_bytes(const skv_model *m) {
    double b = (double)model_weight_bytes(m);
    if (m->output.data != m->tok_embd.data)
        b -= (double)ggml_row_size(m->tok_embd.type, m->tok_embd.cols) * m->tok_embd.rows;
    return b;
}

/* What one more sequence costs in memory: the KV bytes it keeps (resident,
 * and offloaded unless the file tier holds them) and its session's
 * activations and logits. *file gets what the file tier holds (0 without). */
/* A session's activations and logits (estimated from the shape). */
static double seq_act(const skv_session *one) {
    const model_config *c = &one->m->cfg;
    return 4.0 * ((double)c->vocab + 4.0 * c->dim + 2.0 * c->ffn_dim) * (one->o.batch > 0 ? one->o.batch : 1);
}

static double seq_bytes(const skv_session *one, int file_tier, double *file) {
    size_t r0, o0;
    one->kv->cls->bytes(one->kv, &r0, &o0);
    if (file) *file = file_tier ? (double)o0 : 0;
    return (double)r0 + (file_tier ? 0 : (double)o0) + seq_act(one);
}

/* Free bytes on the file system that holds path (its folder); 0 unknown. */
static double disk_free(const char *path) {
    char dir[PATH_MAX];
    cli_dir_of(path, dir, sizeof dir);
    struct statvfs v;
    return statvfs(dir, &v) ? 0 : (double)v.f_bavail * v.f_frsize;
}

/* The batch sizes of --parallel: up to 16, each a count, "max" (the
 * largest that fits, then its bench) or "fit" (that size said, not run).
 * NP_CAP is the most any of them may be: "max" stops there when memory
 * (and disk) would take more, and says so (bound=cap). */
#define NP_MAX_LIST 16
#define NP_MAX (-1)
#define NP_FIT (-2)
#define NP_CAP 4096

/* What set the largest batch: the cap when both pools would take more than
 * it (batch_fit stops at NP_CAP), else the pool that bounds it. n_a, n_b:
 * how many sequences each pool holds (a negative count: no limit). */
static const char *bound_name(int fit, double n_a, double n_b, int pool, const char *a, const char *b) {
    if (fit >= NP_CAP && (n_a < 0 || n_a > NP_CAP) && (n_b < 0 || n_b > NP_CAP)) return "cap";
    return pool ? b : a;
}

/* Progress on stderr while a long part runs (a prefill, the forks of a big
 * batch, its steps): nothing in a part's first 2 s, then a line every 5 s at
 * most, so a short bench stays silent and a long one is never mute. */
typedef struct { double t0, last; } tick_clock;
static void tick_start(tick_clock *c) {
    c->t0 = skv_now();
    c->last = 0;
}
static int tick_due(tick_clock *c) {
    double now = skv_now();
    if (now - c->t0 < 2 || (c->last > 0 && now - c->last < 5)) return 0;
    c->last = now;
    return 1;
}

/* The decode seconds and steps that count, of t_all over *steps: past the
 * first step (t_first), which warms up (on a device it captures the step's
 * graph and makes the first allocations), when more steps followed it. */
static double past_warmup(double t_all, double t_first, int *steps) {
    if (*steps <= 1) return t_all;
    (*steps)--;
    return t_all - t_first;
}

/* session_prefill's progress: a line now and then, and Ctrl-C cancels. */
static int prefill_tick(void *user, int done, int total) {
    tick_clock *c = user;
    if (done < total && tick_due(c)) {
        double t = skv_now() - c->t0;
        cli_msg("prefill: %d of %d tokens in %.0f s, about %.0f s left\n", done, total, t,
                done > 0 ? t * (total - done) / done : 0.0);
    }
    return cli_stop_requested();
}

/* A prefill with progress lines; Ctrl-C during it is said and returns
 * CLI_STOPPED (nothing measured yet), another failure its message and 1.
 * The policy's notice (a budget under its floor, a rank cut) goes to stderr
 * once, not at every repeat: a timing of a policy that selects nothing
 * should say so. */
static int bench_prefill(skv_session *s, const int32_t *ids, int np) {
    static char said[sizeof s->kv->notice];
    tick_clock c;
    tick_start(&c);
    if (!session_prefill(s, ids, np, prefill_tick, &c)) {
        if (s->kv->notice[0] && strcmp(said, s->kv->notice)) {
            cli_msg("%s\n", s->kv->notice);
            memcpy(said, s->kv->notice, sizeof said);
        }
        return 0;
    }
    if (cli_stop_requested()) {
        cli_msg("interrupted during the prefill: nothing was measured\n");
        return CLI_STOPPED;
    }
    return cli_fail();
}

/* skv bench --parallel B[,B...] / --max-parallel / --mem, for one policy or
 * a --kv list: one prefill of the prompt (through the first policy's
 * source, recorded), forked into each policy. For each: a fork decoded n
 * steps alone gives what a sequence costs in memory, hence the largest B
 * under avail bytes ("max") or the refusal of a B over it; then for each B,
 * B forks decode n steps together, timed (the best of R repeats, each from
 * fresh forks; the first step apart, as warmup_ms, when more follow: on a
 * device it captures the batch's step graph). One line a (policy, B). Its
 * prefill_tok_s is the source's prefill without the recording's copies
 * (session.h's t_prefill), which prefill_record_s gives: on a device,
 * downloads of every layer's rows and queries (at 122K tokens of an 8B
 * layer 1.5 GB, and 2 GB more for a policy whose prefill attends keep
 * state, through pageable memory), which would otherwise count in its
 * prefill and ShadowKV's prefill overhead.
 *
 * A fork into another policy than the first replays the first's recorded
 * prefill: its keys and values past layer 0 were computed through the
 * first policy's prefill attention (dense --f16-kv: over a half-precision
 * cache), not its own, so they differ slightly from its own prefill's (rel
 * L2 2.4e-4 for shadowkv from dense --f16-kv). Its figures are then said to
 * be approximate (a "note:" line); a policy benched alone forks its own
 * prefill, bit-exact (tests/bench.sh runs Table 3 so).
 *
 * Ctrl-C stops after the decode step in flight: the batch in flight gets
 * its line for the steps it made (partial=1), and nothing more runs. */
static int bench_parallel(cli_gen *g, skv_model *m, const int32_t *ids, int np, const int *bs, int n_bs, double avail,
                          int mem_given, int repeat) {
    double pp = 0, fixed = weight_bytes(m); /* the memory taken anyway */
    int rc = 0, out = 0, file = g->s.kv.offload_file[0] != 0, n_pol = g->n_kv > 1 ? g->n_kv : 1;
    int stopped = 0, runs = 0, src_half = 0;
    session_opts so = g->s;
    so.record_prefill = 1;
    skv_session *src = NULL, *one = NULL;
    int32_t *tok = NULL;
    if ((rc = session_new(m, &so, &src))) goto done;
    if ((out = bench_prefill(src, ids, np))) goto done;
    pp = np / (src->t_prefill > 0 ? src->t_prefill : 1e-9);
    src_half = !strcmp(src->o.kv.policy, "dense") && kv_opt(&src->o.kv, &kv_policy_dense, "f16") != 0;
    fixed += seq_bytes(src, file, NULL) + (double)kv_rec_held(src->rec); /* the source and its recording stay */
    /* On a device the batch fits two pools: its memory (each sequence's
     * resident KV and activations; read now, the weights and the source
     * already in it) and the host's (the offloaded values, pinned, beside
     * the source's and its recording). */
    const skv_backend *be = src->be;
    double dev_avail = 0, host_avail = 0;
    if (be->mem_info) {
        size_t fr = 0, tot = 0;
        if ((rc = be->mem_info(&fr, &tot))) goto done;
        size_t r0, o0;
        src->kv->cls->bytes(src->kv, &r0, &o0);
        dev_avail = 0.9 * (double)fr;
        host_avail = avail - (double)o0 - (double)kv_rec_held(src->rec);
    }
    for (int p = 0; p < n_pol && !rc && !stopped; p++) {
        kv_opts ko = g->s.kv;
        if (g->n_kv > 1) snprintf(ko.policy, sizeof ko.policy, "%s", g->kv_list[p]);
        /* the pinned blocks the last policy's forks left for reuse go back
         * to the host: the fit below counts the host's memory free as it
         * was before the first policy, without them */
        if (p > 0 && be->host_trim) be->host_trim();
        for (int j = 0; j < ko.n_set; j++) ko.set[j].strict = 0; /* each policy takes the options it has */
        if (strcmp(ko.policy, src->o.kv.policy)) {
            printf("note: kv=%s forks %s's recorded prefill%s: its keys and values past layer 0 were computed through "
                   "%s's prefill attention, not its own, so its figures below are approximate (not bit-exact with "
                   "its own prefill; shadowkv from dense --f16-kv: rel L2 2.4e-4); bench --kv %s alone for exact "
                   "ones\n", ko.policy, src->o.kv.policy, src_half ? " (with an f16 cache)" : "", src->o.kv.policy,
                   ko.policy);
            fflush(stdout);
        }
        /* the most the fork holds while it is made (its replayed prefill
         * before it compresses; on the CPU, the rise of the process's
         * resident bytes): beyond what it keeps, counted once in the fit
         * (sequences are made one at a time) */
        size_t live0 = be->mem_peak ? be->mem_peak(1) : 0;
        if ((rc = session_fork(src, &ko, &one))) break;
        size_t peak1 = be->mem_peak ? be->mem_peak(0) : 0;
        double made_peak = peak1 > live0 ? (double)(peak1 - live0) : 0;
        tick_clock c1;
        tick_start(&c1);
        for (int t = 0; t < g->n_predict && !rc && !cli_stop_requested(); t++) {
            rc = session_decode(one, ids[t % np]);
            if (!rc && t + 1 < g->n_predict && tick_due(&c1))
                cli_msg("kv=%s: one sequence alone (what a sequence takes in memory): step %d of %d, about %.0f s "
                        "left\n", ko.policy, t + 1, g->n_predict, one->t_decode / one->step * (g->n_predict - t - 1));
        }
        if (rc) break;
        if (cli_stop_requested()) { stopped = 1; break; }
        double off_seq; /* what each fork writes to its own offload file */
        double per = seq_bytes(one, file, &off_seq), per_dev = 0, per_host = 0;
        if (be->mem_info) {
            size_t r0, o0;
            one->kv->cls->bytes(one->kv, &r0, &o0);
            per_dev = (double)r0 + seq_act(one);
            per_host = (double)o0;
        }
        session_free(one);
        one = NULL;
        /* The largest batch that fits, and what bounds it: on a device its
         * memory (resident KV, activations) and the host's (the offloaded
         * values); on the CPU the memory beside the weights and the source,
         * and with the file tier the disk (each fork's values in a file of
         * their own beside --offload-file's path); or the cap of NP_CAP when
         * they would take more. */
        int pool = 0, fit = NP_CAP;
        double n_a = -1, n_b = -1; /* sequences each pool holds (-1: no limit) */
        double extra = 0;          /* the last fork's peak beyond what it keeps */
        const char *bound;
        if (be->mem_info) {
            extra = made_peak > per_dev ? made_peak - per_dev : 0;
            fit = batch_fit(extra, per_dev, dev_avail, per_host, host_avail, &pool); /* read with the weights in */
            if (per_dev > 0) n_a = floor((dev_avail - extra) / per_dev);
            if (per_host > 0) n_b = floor(host_avail / per_host);
            bound = bound_name(fit, n_a, n_b, pool, "device", "host");
        } else {
            double disk = off_seq > 0 ? disk_free(g->s.kv.offload_file) * 0.8 : 0;
            /* the resident bytes' rise over the fork, beyond what it keeps
             * (with the file tier, resident counts its mapped file's pages
             * too: off_seq of them at most, which the disk holds) */
            extra = made_peak > per + off_seq ? made_peak - per - off_seq : 0;
            if (avail > 0) {
                fit = batch_fit(fixed + extra, per, avail, off_seq, disk, &pool);
                if (per > 0) n_a = floor((avail - fixed - extra) / per);
                if (off_seq > 0) n_b = floor(disk / off_seq);
            }
            bound = bound_name(fit, n_a, n_b, pool, "memory", "disk");
        }
        for (int k = 0; k < n_bs && !rc && !stopped; k++) {
            int B = bs[k];
            if (B == NP_MAX || B == NP_FIT) {
                B = fit;
                if (B < 1 && be->mem_info) {
                    rc = skv_error(SKV_ENOMEM, "%s: not even one sequence of %d + %d tokens fits on %s: it needs %.2f "
                                   "GiB of device memory (%.2f GiB free) and %.2f GiB of host memory (%.2f GiB)",
                                   ko.policy, np, g->n_predict, be->name, per_dev / 1073741824.0,
                                   dev_avail / 1073741824.0, per_host / 1073741824.0, host_avail / 1073741824.0);
                    break;
                }
                if (B < 1) {
                    rc = skv_error(SKV_ENOMEM, "%s: not even one sequence of %d + %d tokens fits: it needs %.2f GiB "
                                   "beside %.2f GiB of weights and the prompt's source, over %.2f GiB", ko.policy, np,
                                   g->n_predict, per / 1073741824.0, fixed / 1073741824.0, avail / 1073741824.0);
                    break;
                }
                if (be->mem_info)
                    printf("kv=%s max_parallel=%d per_seq_bytes=%.0f mem_bytes=%.0f file_bytes_seq=0 bound=%s "
                           "device_bytes_seq=%.0f device_free_bytes=%.0f host_bytes_seq=%.0f host_free_bytes=%.0f "
                           "fork_peak_bytes=%.0f\n",
                           ko.policy, B, per_dev + per_host, dev_avail + host_avail, bound, per_dev, dev_avail,
                           per_host, host_avail, extra);
                else
                    printf("kv=%s max_parallel=%d per_seq_bytes=%.0f mem_bytes=%.0f file_bytes_seq=%.0f bound=%s "
                           "fork_peak_bytes=%.0f\n", ko.policy, B, per, avail, off_seq, bound, extra);
                fflush(stdout);
                if (!strcmp(bound, "cap")) {
                    /* the pool that holds the fewest: on the CPU the memory (a) or the
                     * disk of --offload-file (b), on a device its memory (a) or the
                     * host's for the offloaded values (b, what --mem sets there) */
                    char held[64] = "more";
                    int by_b = n_a < 0 || (n_b >= 0 && n_b < n_a);
                    double n = by_b ? n_b : n_a;
                    if (n > 0) snprintf(held, sizeof held, "%.0f", n);
                    const char *who = be->mem_info ? (by_b ? (mem_given ? "--mem" : "the host's free memory")
                                                           : "the device's free memory")
                                      : by_b && n_b >= 0 ? "the free disk (four fifths of it)"
                                      : mem_given ? "--mem" : avail > 0 ? "the memory available"
                                                            : "the memory (not known here)";
                    cli_msg("kv=%s: %s would hold %s sequences; %s stops at the cap of %d (give --parallel N or --mem "
                            "GIB for fewer)\n", ko.policy, who, held, bs[k] == NP_FIT ? "fit" : "max", NP_CAP);
                }
                if (bs[k] == NP_FIT) continue;
            } else if (B > fit) {
                double need = be->mem_info ? (per_dev + per_host) * B + extra : fixed + extra + per * B;
                double have = be->mem_info ? dev_avail + host_avail : avail;
                if (n_bs > 1) { /* one size of a list: said, skipped */
                    printf("kv=%s parallel=%d over_memory=1 need_bytes=%.0f mem_bytes=%.0f bound=%s\n", ko.policy, B,
                           need, have, bound);
                    fflush(stdout);
                    continue;
                }
                if (be->mem_info)
                    rc = skv_error(SKV_ENOMEM, "%s: %d sequences of %d + %d tokens do not fit on %s: %.3f GiB of "
                                   "device memory each (%.2f GiB free) and %.3f GiB of host memory each (%.2f GiB); "
                                   "at most %d", ko.policy, B, np, g->n_predict, be->name, per_dev / 1073741824.0,
                                   dev_avail / 1073741824.0, per_host / 1073741824.0, host_avail / 1073741824.0, fit);
                else if (pool)
                    rc = skv_error(SKV_ENOMEM, "%s: %d sequences of %d + %d tokens need %.2f GiB of disk for their "
                                   "values (%.3f GiB each), over four fifths of the free disk; at most %d", ko.policy,
                                   B, np, g->n_predict, off_seq * B / 1073741824.0, off_seq / 1073741824.0, fit);
                else
                    rc = skv_error(SKV_ENOMEM, "%s: %d sequences of %d + %d tokens need %.2f GiB (%.3f GiB each beside "
                                   "%.2f GiB of weights and the prompt's source), over the %.2f GiB %s", ko.policy, B,
                                   np, g->n_predict, need / 1073741824.0, per / 1073741824.0, fixed / 1073741824.0,
                                   avail / 1073741824.0, mem_given ? "of --mem" : "available");
                break;
            }
            free(tok);
            if (!(tok = malloc(sizeof *tok * (size_t)B))) { rc = skv_error(SKV_ENOMEM, "out of memory"); break; }
            double best_tg = 0, best_ms = 0, best_warm = 0;
            int best_steps = 0;
            size_t res_all = 0, off_all = 0;
            for (int r = 0; r < repeat && !rc && !stopped; r++) {
                skv_session **seqs = calloc((size_t)B, sizeof *seqs);
                skv_batch *b = NULL;
                tick_clock c;
                tick_start(&c);
                if (!seqs) rc = skv_error(SKV_ENOMEM, "out of memory");
                for (int i = 0; i < B && !rc && !stopped; i++) {
                    rc = session_fork(src, &ko, &seqs[i]);
                    if (cli_stop_requested()) stopped = 1;
                    else if (i + 1 < B && tick_due(&c))
                        cli_msg("kv=%s parallel=%d: %d of %d sequences forked in %.0f s\n", ko.policy, B, i + 1, B,
                                skv_now() - c.t0);
                }
                if (!rc && !stopped && (rc = batch_new(seqs, B, &b)) == 0) memset(seqs, 0, sizeof *seqs * (size_t)B);
                if (rc == SKV_ENOMEM)
                    rc = skv_error(SKV_ENOMEM, "%d sequences of %d + %d tokens do not fit in memory (%.1f MiB of "
                                   "weights; lower --parallel)", B, np, g->n_predict, weight_bytes(m) / 1048576.0);
                tick_start(&c);
                double t_first = 0;
                for (int t = 0; t < g->n_predict && !rc && !stopped; t++) {
                    for (int i = 0; i < B; i++) tok[i] = ids[(t + i) % np];
                    rc = batch_decode(b, tok);
                    if (!rc && t == 0) t_first = batch_t_decode(b);
                    if (!rc && cli_stop_requested()) stopped = 1;
                    else if (!rc && t + 1 < g->n_predict && tick_due(&c)) {
                        double ts = batch_steps(b) ? batch_t_decode(b) / batch_steps(b) : 0;
                        cli_msg("kv=%s parallel=%d: step %d of %d, %.1f s a step, about %.0f s left\n", ko.policy, B,
                                t + 1, g->n_predict, ts, ts * (g->n_predict - t - 1));
                    }
                }
                if (!rc && b && batch_steps(b) > 0) { /* a run cut short by Ctrl-C keeps the steps it made */
                    int ns = batch_steps(b);
                    double t = past_warmup(batch_t_decode(b), t_first, &ns);
                    double tg = t > 0 ? (double)B * ns / t : 0;
                    if (tg > best_tg && (!stopped || !best_steps)) {
                        best_tg = tg;
                        best_steps = batch_steps(b);
                        best_ms = 1000 * t / ns;
                        best_warm = 1000 * t_first;
                        res_all = off_all = 0;
                        for (int i = 0; i < B; i++) {
                            size_t r0, o0;
                            skv_session *s = batch_seq(b, i);
                            s->kv->cls->bytes(s->kv, &r0, &o0);
                            res_all += r0;
                            off_all += o0;
                        }
                    }
                }
                for (int i = 0; seqs && i < B; i++) session_free(seqs[i]);
                free(seqs);
                batch_free(b);
            }
            if (rc || (stopped && !best_steps)) break;
            int cut = stopped && best_steps < g->n_predict; /* the line is of a run cut short */
            const model_config *c = &m->cfg;
            printf("model=%s kv=%s threads=%d prompt=%d decode=%d parallel=%d prefill_tok_s=%.1f decode_tok_s=%.2f "
                   "decode_ms=%.3f resident_bytes=%zu resident_bytes_seq=%.0f offloaded_bytes=%zu tier=%s "
                   "weight_bytes=%.0f seq_bytes=%.0f prefill_record_s=%.3f warmup_ms=%.3f%s\n",
                   c->name[0] ? c->name : g->model, ko.policy, skv_threads(), np, best_steps, B, pp, best_tg, best_ms,
                   res_all, (double)res_all / B, off_all, file ? "file" : "memory", weight_bytes(m), per,
                   kv_rec_seconds(src->rec), best_warm, cut ? " partial=1" : "");
            fflush(stdout);
            runs++;
            if (cut)
                cli_msg("kv=%s parallel=%d: interrupted after %d of %d steps; its line above says decode=%d and "
                        "partial=1\n", ko.policy, B, best_steps, g->n_predict, best_steps);
        }
    }
    if (!rc && (stopped || cli_stop_requested())) {
        cli_msg("interrupted: %d batch run%s measured (the lines above); nothing more was run\n", runs,
                runs == 1 ? "" : "s");
        out = CLI_STOPPED;
    }
done:
    free(tok);
    session_free(one);
    session_free(src);
    if (rc) return cli_stop_requested() ? (cli_fail(), CLI_STOPPED) : cli_fail();
    return out;
}

/* --parallel's value: counts in [1, 4096] and "max", comma-separated. */
static int parse_parallel(const char *flag, const char *v, int *bs, int *n) {
    *n = 0;
    for (const char *p = v; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char item[16];
        if (!len || len >= sizeof item || *n == NP_MAX_LIST) *n = -1;
        else {
            memcpy(item, p, len);
            item[len] = 0;
            char *end;
            long b = strtol(item, &end, 10);
            if (!strcmp(item, "max")) bs[(*n)++] = NP_MAX;
            else if (!strcmp(item, "fit")) bs[(*n)++] = NP_FIT;
            else if (*end || b < 1 || b > 4096) *n = -1;
            else bs[(*n)++] = (int)b;
        }
        if (*n < 0 || !e) break;
        p = e + 1;
        if (!*p) *n = -1;
    }
    if (*n > 0) return 0;
    return cli_usage_error("bench", "%s expects numbers of sequences in [1, 4096], max or fit, comma-separated (at "
                           "most %d), got '%s'", flag, NP_MAX_LIST, v);
}

int cmd_bench(int argc, char **argv) {
    cli_gen g;
    cli_gen_default(&g);
    int np = 512, repeat = 1, parallel = 0, max_parallel = 0, bs[NP_MAX_LIST + 1], n_bs = 0;
    double mem_gib = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { help(stdout); return 0; }
        if (!strcmp(argv[i], "--max-parallel")) { max_parallel = 1; continue; }
        if (!strcmp(argv[i], "--mem")) {
            char *end;
            double v = i + 1 < argc ? strtod(argv[i + 1], &end) : 0;
            if (i + 1 >= argc || *end || !(v > 0 && v <= 1 << 20))
                return cli_usage_error("bench", "--mem expects GiB of memory, a positive number");
            mem_gib = v;
            i++;
            continue;
        }
        if (!strcmp(argv[i], "-np") || !strcmp(argv[i], "--parallel")) {
            if (i + 1 >= argc) return cli_usage_error("bench", "%s needs a number of sequences", argv[i]);
            if (parse_parallel(argv[i], argv[i + 1], bs, &n_bs)) return 2;
            parallel = 1;
            i++;
            continue;
        }
        if ((!strcmp(argv[i], "--prompt-tokens") || !strcmp(argv[i], "--repeat")) && i + 1 < argc) {
            char *end;
            long v = strtol(argv[i + 1], &end, 10);
            if (*end || v < 1 || v > (1 << 24)) return cli_usage_error("bench", "%s expects a positive integer", argv[i]);
            if (!strcmp(argv[i], "--repeat")) repeat = (int)v; else np = (int)v;
            i++;
            continue;
        }
        int r = cli_gen_option(&g, argc, argv, &i);
        if (r < 0) return 2;
        if (r == CLI_DONE) return 0;
        if (r == 0) return cli_usage_error("bench", "unknown option '%s'", argv[i]);
    }
    if (g.n_kv > 1 && !parallel && !max_parallel)
        return cli_usage_error("bench", "a --kv list goes with --parallel or --max-parallel (each policy forked from one "
                               "prefill); a single bench takes one policy");
    if (cli_check_policy_flags(&g, "bench", NULL, 0)) return 2;
    /* the forks replay the first policy's recorded prefill: its attention too only when that one keeps state */
    for (int i = 1; i < g.n_kv; i++)
        if (kv_policy_find(g.kv_list[0])->prefill_pure && !kv_policy_find(g.kv_list[i])->prefill_pure)
            return cli_usage_error("bench", "--kv %s: its fork replays the prefill's attention, which %s's recording "
                                   "leaves out: put %s first", g.kv_list[i], g.kv_list[0], g.kv_list[i]);
    if (cli_no_trace(&g, "bench")) return 2;
    if (!g.model) return cli_usage_error("bench", "no model: give -m MODEL");
    if (g.threads) skv_set_threads(g.threads);
    skv_model *m;
    if (model_load(g.model, &m)) return cli_fail();
    if (g.s.ctx <= 0) g.s.ctx = np + g.n_predict + 1;
    if (np + g.n_predict > g.s.ctx) {
        model_free(m);
        cli_msg("%d prompt + %d decode tokens exceed the context of %d\n", np, g.n_predict, g.s.ctx);
        return 1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * np);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < np; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)m->cfg.vocab);
    }
    if (parallel || max_parallel || mem_gib > 0) {
        /* the memory a batch may take: --mem, or what the machine has free less a margin of a tenth */
        double avail = mem_gib > 0 ? mem_gib * 1073741824.0 : 0.9 * skv_mem_available();
        if (!n_bs) bs[n_bs++] = 1;
        if (max_parallel) bs[n_bs++] = NP_MAX;
        cli_stop_catch("decode step (or prefill chunk)");
        int rc = bench_parallel(&g, m, ids, np, bs, n_bs, avail, mem_gib > 0, repeat);
        cli_stop_release();
        free(ids);
        model_free(m);
        cli_gen_free(&g);
        return rc;
    }
    double best_pp = 0, best_tg = 0, compress_pct = 0, fetch_step = NAN, read_step = NAN;
    double fetch_gbs = NAN, equiv_gbs = NAN, stage_ms[3] = {NAN, NAN, NAN}, hit_pct = NAN, best_warm = 0;
    static const char *const stage_key[3] = {"select_ms", "rebuild_ms", "attend_ms"};
    int rc = 0, steps = g.n_predict, stopped = 0;
    /* The runs are timed with no probe bus: every probe is off. A policy's
     * setup (ShadowKV's SVD, landmarks, cos-min, outliers, offload) is the
     * session's end_prefill time. The first decode step warms up (on a
     * device it captures the step's graph): timed apart (warmup_ms) when
     * steps follow it, and left out of decode_tok_s, decode_ms and the
     * stage clocks. Ctrl-C stops after the step in flight: the line then
     * says the steps made (decode=) and partial=1. */
    cli_stop_catch("decode step (or prefill chunk)");
    for (int r = 0; r < repeat && !rc && !stopped; r++) {
        skv_session *s;
        if (session_new(m, &g.s, &s)) { rc = cli_fail(); break; }
        if ((rc = bench_prefill(s, ids, np))) { session_free(s); break; }
        tick_clock tc;
        tick_start(&tc);
        double t_first = 0, st_first[3] = {0, 0, 0}; /* the first step's seconds, its stage clocks' ms */
        for (int i = 0; i < g.n_predict && !rc; i++) {
            if (session_decode(s, ids[i % np])) { rc = cli_fail(); break; }
            if (i == 0) {
                t_first = s->t_decode;
                for (int k = 0; k < 3; k++) st_first[k] = kv_stat(s->kv, stage_key[k]) * kv_stat(s->kv, "steps");
            }
            if (cli_stop_requested()) { stopped = 1; break; }
            if (i + 1 < g.n_predict && tick_due(&tc))
                cli_msg("step %d of %d, %.0f ms a step, about %.0f s left\n", i + 1, g.n_predict,
                        1000 * s->t_decode / s->step, s->t_decode / s->step * (g.n_predict - i - 1));
        }
        if (rc) { session_free(s); break; }
        if (stopped && (best_tg > 0 || !s->step)) { session_free(s); break; } /* a finished repeat stands */
        int ns = s->step;
        double td = past_warmup(s->t_decode, t_first, &ns);
        int warm = ns < s->step;
        double pp = np / s->t_prefill, tg = ns && td > 0 ? ns / td : 0;
        if (stopped) steps = s->step;
        /* the policy's setup: end_prefill's wall time (its layers may run in
         * parallel, so the probe's per-layer times would add past it) */
        if (pp > best_pp) best_pp = pp, compress_pct = 100 * s->t_end_prefill / s->t_prefill;
        if (tg > best_tg) {
            best_tg = tg;
            fetch_gbs = kv_stat(s->kv, "fetch_gbs");
            equiv_gbs = kv_stat(s->kv, "equiv_gbs");
            best_warm = 1000 * t_first;
            double n_st = kv_stat(s->kv, "steps"); /* the policy's stage clocks: ms a step over its steps */
            for (int k = 0; k < 3; k++)
                stage_ms[k] = warm && n_st > 1 ? (kv_stat(s->kv, stage_key[k]) * n_st - st_first[k]) / (n_st - 1)
                                               : kv_stat(s->kv, stage_key[k]);
            hit_pct = kv_stat(s->kv, "hit_rate");
        }
        /* bytes moved per decode step: fetched from slow memory, and read
         * from resident memory where the policy counts that (Quest) */
        if (s->step) {
            fetch_step = kv_stat(s->kv, "fetch_bytes") / s->step;
            read_step = kv_stat(s->kv, "read_bytes") / s->step;
        }
        session_free(s);
    }
    cli_stop_release();
    if (!rc && stopped && best_tg <= 0) {
        cli_msg("interrupted before a decode step finished: nothing was measured\n");
        rc = CLI_STOPPED;
    }
    if (!rc) {
        /* what a dense decode step must read: the weights, and the K and V of
         * every layer at the run's mean decode context (f32, or f16 for a
         * dense run with --f16-kv) */
        const model_config *c = &m->cfg;
        double wb = weight_bytes(m);
        int half = !strcmp(g.s.kv.policy, "dense") && kv_opt(&g.s.kv, &kv_policy_dense, "f16") != 0;
        double kvb = 2.0 * c->n_layers * c->n_kv_heads * c->head_dim * (half ? 2.0 : 4.0) * (np + g.n_predict / 2.0);
        double rg = g.n_predict > 0 ? read_gbs() : 0;
        printf("model=%s kv=%s threads=%d prompt=%d decode=%d prefill_tok_s=%.1f decode_tok_s=%.2f decode_ms=%.3f "
               "compress_pct=%.2f fetch_bytes_step=%.0f read_bytes_step=%.0f fetch_gbs=%.2f equiv_gbs=%.2f copy_gbs=%.2f "
               "weight_bytes=%.0f dense_kv_bytes_step=%.0f read_gbs=%.2f dense_roof_tok_s=%.2f warmup_ms=%.3f%s\n",
               c->name[0] ? c->name : g.model, g.s.kv.policy, skv_threads(), np, steps, best_pp, best_tg,
               best_tg > 0 ? 1000.0 / best_tg : 0.0, compress_pct, isnan(fetch_step) ? 0 : fetch_step,
               isnan(read_step) ? 0 : read_step, isnan(fetch_gbs) ? 0 : fetch_gbs, isnan(equiv_gbs) ? 0 : equiv_gbs,
               copy_gbs(), wb, kvb, rg, rg > 0 ? rg * 1e9 / (wb + kvb) : 0.0, best_warm,
               steps < g.n_predict ? " partial=1" : "");
        /* where a policy with stage clocks (ShadowKV on the CPU) spends its
         * decode attention, per step, and its chunk cache's hit rate: a
         * second line, so the first keeps its fields for every policy */
        if (!isnan(stage_ms[0]))
            printf("stages: select_ms=%.3f rebuild_ms=%.3f attend_ms=%.3f rest_ms=%.3f hit_pct=%.1f\n", stage_ms[0],
                   stage_ms[1], stage_ms[2], 1000.0 / best_tg - stage_ms[0] - stage_ms[1] - stage_ms[2],
                   isnan(hit_pct) ? 0 : hit_pct);
        if (stopped) {
            if (steps < g.n_predict)
                cli_msg("interrupted after %d of %d decode steps: the line above says decode=%d and partial=1\n",
                        steps, g.n_predict, steps);
            else
                cli_msg("interrupted: the line above is the best of the repeats that finished\n");
            rc = CLI_STOPPED;
        }
    }
    free(ids);
    model_free(m);
    cli_gen_free(&g);
    return rc;
}
