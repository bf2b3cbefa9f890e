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
               "allows a dense decode.\n"
               "ShadowKV on the CPU adds a second line, \"stages:\": the decode attention's wall\n"
               "time per step by stage (select: landmark scores, softmax, top-k; rebuild: the\n"
               "misses' value fetch and key rebuild; attend: the sparse attention), the rest of\n"
               "the step (weights, norms, sampling), and the chunk cache's hit rate.\n"
               "The best of R repeats (default 1) is reported.\n\n");
    cli_gen_help(o, 0);
    fprintf(o, "  -n N                  decode steps (default 64)\n"
               "      --prompt-tokens N prompt length (default 512)\n"
               "      --repeat R        repeats; the best is reported (default 1)\n"
               "  -np, --parallel B     decode B sequences together: the prompt prefilled once and forked\n"
               "                        (a shared prefix, as llama-batched-bench -pps; each fork holds its own\n"
               "                        copy), one pass of the weights a step; prints parallel=B, decode_tok_s =\n"
               "                        B x steps / time, decode_ms a step, and the KV bytes resident for all B\n"
               "                        and per sequence. A list (1,8,max) runs each from the one prefill (a size\n"
               "                        over --mem said and skipped; fit: the largest that fits, said, not run),\n"
               "                        and --kv a,b forks the prefill into each policy (one line a policy and B)\n"
               "      --max-parallel    the largest B that fits under --mem (one sequence's KV bytes measured on a\n"
               "                        fork, its activations estimated, beside the weights and the prompt's\n"
               "                        source; with --offload-file, each fork's values in a file of their own\n"
               "                        there, within four fifths of the free disk), then the bench at it;\n"
               "                        with --backend cuda, within nine tenths of the device's free memory\n"
               "                        (resident KV, activations) and --mem of the host's (offloaded values)\n"
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
 * largest that fits, then its bench) or "fit" (that size said, not run). */
#define NP_MAX_LIST 16
#define NP_MAX (-1)
#define NP_FIT (-2)

/* skv bench --parallel B[,B...] / --max-parallel / --mem, for one policy or
 * a --kv list: one prefill of the prompt (through the first policy's
 * source, recorded), forked into each policy. For each: a fork decoded n
 * steps alone gives what a sequence costs in memory, hence the largest B
 * under avail bytes ("max") or the refusal of a B over it; then for each B,
 * B forks decode n steps together, timed (the best of R repeats, each from
 * fresh forks). One line a (policy, B). */
static int bench_parallel(cli_gen *g, skv_model *m, const int32_t *ids, int np, const int *bs, int n_bs, double avail,
                          int mem_given, int repeat) {
    double pp = 0, fixed = weight_bytes(m); /* the memory taken anyway */
    int rc = 0, file = g->s.kv.offload_file[0] != 0, n_pol = g->n_kv > 1 ? g->n_kv : 1;
    session_opts so = g->s;
    so.record_prefill = 1;
    skv_session *src = NULL, *one = NULL;
    int32_t *tok = NULL;
    if ((rc = session_new(m, &so, &src)) || (rc = session_prefill(src, ids, np, NULL, NULL))) goto done;
    pp = np / (src->t_prefill > 0 ? src->t_prefill : 1e-9);
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
    for (int p = 0; p < n_pol && !rc; p++) {
        kv_opts ko = g->s.kv;
        if (g->n_kv > 1) snprintf(ko.policy, sizeof ko.policy, "%s", g->kv_list[p]);
        for (int j = 0; j < ko.n_set; j++) ko.set[j].strict = 0; /* each policy takes the options it has */
        if ((rc = session_fork(src, &ko, &one))) break;
        for (int t = 0; t < g->n_predict && !rc; t++) rc = session_decode(one, ids[t % np]);
        if (rc) break;
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
        /* The largest batch that fits, and the pool that bounds it: on a
         * device its memory (resident KV, activations) and the host's (the
         * offloaded values); on the CPU the memory beside the weights and
         * the source, and with the file tier the disk (each fork's values
         * in a file of their own beside --offload-file's path). */
        int pool = 0, fit = 4096;
        const char *bound;
        if (be->mem_info) {
            fit = batch_fit(per_dev, dev_avail, per_host, host_avail, &pool);
            bound = pool ? "host" : "device";
        } else {
            if (avail > 0)
                fit = batch_fit(per, avail - fixed, off_seq, off_seq > 0 ? disk_free(g->s.kv.offload_file) * 0.8 : 0,
                                &pool);
            bound = pool ? "disk" : "memory";
        }
        for (int k = 0; k < n_bs && !rc; k++) {
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
                           "device_bytes_seq=%.0f device_free_bytes=%.0f host_bytes_seq=%.0f host_free_bytes=%.0f\n",
                           ko.policy, B, per_dev + per_host, dev_avail + host_avail, bound, per_dev, dev_avail,
                           per_host, host_avail);
                else
                    printf("kv=%s max_parallel=%d per_seq_bytes=%.0f mem_bytes=%.0f file_bytes_seq=%.0f bound=%s\n",
                           ko.policy, B, per, avail, off_seq, bound);
                fflush(stdout);
                if (bs[k] == NP_FIT) continue;
            } else if (B > fit) {
                double need = be->mem_info ? (per_dev + per_host) * B : fixed + per * B;
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
            double best_tg = 0, best_ms = 0;
            size_t res_all = 0, off_all = 0;
            for (int r = 0; r < repeat && !rc; r++) {
                skv_session **seqs = calloc((size_t)B, sizeof *seqs);
                skv_batch *b = NULL;
                if (!seqs) rc = skv_error(SKV_ENOMEM, "out of memory");
                for (int i = 0; i < B && !rc; i++) rc = session_fork(src, &ko, &seqs[i]);
                if (!rc && (rc = batch_new(seqs, B, &b)) == 0) memset(seqs, 0, sizeof *seqs * (size_t)B);
                if (rc == SKV_ENOMEM)
                    rc = skv_error(SKV_ENOMEM, "%d sequences of %d + %d tokens do not fit in memory (%.1f MiB of "
                                   "weights; lower --parallel)", B, np, g->n_predict, weight_bytes(m) / 1048576.0);
                for (int t = 0; t < g->n_predict && !rc; t++) {
                    for (int i = 0; i < B; i++) tok[i] = ids[(t + i) % np];
                    rc = batch_decode(b, tok);
                }
                if (!rc) {
                    double t = batch_t_decode(b), tg = t > 0 ? (double)B * batch_steps(b) / t : 0;
                    if (tg > best_tg) {
                        best_tg = tg;
                        best_ms = batch_steps(b) ? 1000 * t / batch_steps(b) : 0;
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
            if (rc) break;
            const model_config *c = &m->cfg;
            printf("model=%s kv=%s threads=%d prompt=%d decode=%d parallel=%d prefill_tok_s=%.1f decode_tok_s=%.2f "
                   "decode_ms=%.3f resident_bytes=%zu resident_bytes_seq=%.0f offloaded_bytes=%zu tier=%s "
                   "weight_bytes=%.0f seq_bytes=%.0f\n",
                   c->name[0] ? c->name : g->model, ko.policy, skv_threads(), np, g->n_predict, B, pp, best_tg, best_ms,
                   res_all, (double)res_all / B, off_all, file ? "file" : "memory", weight_bytes(m), per);
            fflush(stdout);
        }
    }
done:
    free(tok);
    session_free(one);
    session_free(src);
    return rc ? cli_fail() : 0;
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
        int rc = bench_parallel(&g, m, ids, np, bs, n_bs, avail, mem_gib > 0, repeat);
        free(ids);
        model_free(m);
        cli_gen_free(&g);
        return rc;
    }
    double best_pp = 0, best_tg = 0, compress_pct = 0, fetch_step = NAN, read_step = NAN;
    double fetch_gbs = NAN, equiv_gbs = NAN, stage_ms[3] = {NAN, NAN, NAN}, hit_pct = NAN;
    static const char *const stage_key[3] = {"select_ms", "rebuild_ms", "attend_ms"};
    int rc = 0;
    /* The runs are timed with no probe bus: every probe is off. A policy's
     * setup (ShadowKV's SVD, landmarks, cos-min, outliers, offload) is the
     * session's end_prefill time. */
    for (int r = 0; r < repeat && !rc; r++) {
        skv_session *s;
        if (session_new(m, &g.s, &s)) { rc = cli_fail(); break; }
        if (session_prefill(s, ids, np, NULL, NULL)) { rc = cli_fail(); session_free(s); break; }
        for (int i = 0; i < g.n_predict; i++)
            if (session_decode(s, ids[i % np])) { rc = cli_fail(); break; }
        double pp = np / s->t_prefill, tg = s->step ? s->step / s->t_decode : 0;
        /* the policy's setup: end_prefill's wall time (its layers may run in
         * parallel, so the probe's per-layer times would add past it) */
        if (pp > best_pp) best_pp = pp, compress_pct = 100 * s->t_end_prefill / s->t_prefill;
        if (tg > best_tg) {
            best_tg = tg;
            fetch_gbs = kv_stat(s->kv, "fetch_gbs");
            equiv_gbs = kv_stat(s->kv, "equiv_gbs");
            for (int k = 0; k < 3; k++) stage_ms[k] = kv_stat(s->kv, stage_key[k]);
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
               "weight_bytes=%.0f dense_kv_bytes_step=%.0f read_gbs=%.2f dense_roof_tok_s=%.2f\n",
               c->name[0] ? c->name : g.model, g.s.kv.policy, skv_threads(), np, g.n_predict, best_pp, best_tg,
               best_tg > 0 ? 1000.0 / best_tg : 0.0, compress_pct, isnan(fetch_step) ? 0 : fetch_step,
               isnan(read_step) ? 0 : read_step, isnan(fetch_gbs) ? 0 : fetch_gbs, isnan(equiv_gbs) ? 0 : equiv_gbs,
               copy_gbs(), wb, kvb, rg, rg > 0 ? rg * 1e9 / (wb + kvb) : 0.0);
        /* where a policy with stage clocks (ShadowKV on the CPU) spends its
         * decode attention, per step, and its chunk cache's hit rate: a
         * second line, so the first keeps its fields for every policy */
        if (!isnan(stage_ms[0]))
            printf("stages: select_ms=%.3f rebuild_ms=%.3f attend_ms=%.3f rest_ms=%.3f hit_pct=%.1f\n", stage_ms[0],
                   stage_ms[1], stage_ms[2], 1000.0 / best_tg - stage_ms[0] - stage_ms[1] - stage_ms[2],
                   isnan(hit_pct) ? 0 : hit_pct);
    }
    free(ids);
    model_free(m);
    cli_gen_free(&g);
    return rc;
}
