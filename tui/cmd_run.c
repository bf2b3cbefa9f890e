/* cmd_run.c: `skv run` streams generated text; `skv logits` prints tokens,
 * last-position logits and greedy continuation as JSON for machine checks. */
#include "batch.h"
#include "cli.h"
#include "compare.h"
#include "model.h"
#include "probe.h"
#include "skv.h"
#include "tok.h"
#include "trace.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int demo_model; /* skv run without -m: the demo model, said once the prompt is read */

/* With --trace: checks the output, opens the writer on a new bus and
 * gives the sessions that bus. 0, or the exit status after a message. */
static int trace_begin(cli_gen *g, const char *cmd) {
    if (!g->trace) return 0;
    if (cli_check_output(cmd, g->trace, g->force)) return 1;
    if (probe_bus_new(&g->bus) || trace_writer_open(g->trace, g->bus, &g->tw)) return cli_fail();
    g->s.bus = g->bus;
    return 0;
}

/* Closes the trace, all or nothing: a run that failed leaves none, an
 * interrupted one (130) keeps every step so far and says in its metadata
 * ("interrupted": "at step done of planned", which skv trace info shows)
 * that it was cut short; says where it went, with hint.
 * done < 0: no steps to count. Returns rc, or the failure to close. */
static int trace_end(cli_gen *g, int rc, const char *hint, int done, int planned) {
    if (!g->tw) return rc;
    if ((!rc || rc == CLI_STOPPED) && cli_stop_requested() && done >= 0) {
        char note[96];
        snprintf(note, sizeof note, "at step %d of %d", done, planned);
        if (trace_writer_note(g->tw, "interrupted", note)) rc = cli_fail();
    }
    if (rc && rc != CLI_STOPPED) trace_writer_abort(g->tw);
    else if (trace_writer_close(g->tw)) rc = cli_fail();
    else cli_msg("trace written to %s%s\n", g->trace, hint);
    g->tw = NULL;
    return rc;
}

/* Loads the model, tokenizes the prompt and prefills a session (recording a
 * trace when --trace was given). */
static int setup(cli_gen *g, const char *cmd, skv_model **m, skv_session **s, int32_t **ids, int *n) {
    *m = NULL; *s = NULL; *ids = NULL;
    int rc = trace_begin(g, cmd);
    if (rc) return rc;
    if (!g->model) return cli_usage_error(cmd, "no model: give -m MODEL");
    const char *text = cli_prompt_text(g);
    if (!text) return 2;
    if (demo_model) cli_msg("no -m: the demo model %s\n", g->model);
    if (g->threads) skv_set_threads(g->threads);
    if (model_load(g->model, m)) return cli_fail();
    cli_ctx_warning(g, *m);
    int add_bos = tok_add_bos((*m)->tok) && !g->no_bos;
    if (tok_encode((*m)->tok, text, strlen(text), add_bos, 1, ids, n)) return cli_fail();
    if (*n == 0) { cli_msg("the prompt is empty after tokenization\n"); return 1; }
    if (session_new(*m, &g->s, s)) return cli_fail();
    if (session_prefill(*s, *ids, *n, NULL, NULL)) return cli_fail();
    if ((*s)->notice[0]) cli_msg("%s\n", (*s)->notice);
    if ((*s)->kv->notice[0]) cli_msg("%s\n", (*s)->kv->notice);
    return 0;
}

/* Closes the trace (atomically: all or nothing), then frees everything. */
static int teardown(skv_model *m, skv_session *s, int32_t *ids, cli_gen *g, int rc, int done, int planned) {
    rc = trace_end(g, rc, "", done, planned);
    probe_bus_free(g->bus);
    session_free(s);
    model_free(m);
    free(ids);
    cli_gen_free(g);
    return rc;
}

/* What the KV policy holds against dense, and its own stats by name (the
 * registry's table gives their units), for any policy. */
static void print_kv_accounting(const skv_session *s) {
    const model_config *c = &s->m->cfg;
    const kv_class *p = s->kv->policy;
    size_t res, off;
    s->kv->cls->bytes(s->kv, &res, &off);
    double dense = 2.0 * c->n_layers * (double)s->n_past * c->n_kv_heads * c->head_dim * sizeof(float);
    cli_msg("%s KV bytes: resident %.2f MiB + offloaded %.2f MiB vs dense %.2f MiB "
                    "(resident %.1f%% of dense)\n",
            p->name, res / 1048576.0, off / 1048576.0, dense / 1048576.0, dense > 0 ? 100.0 * res / dense : 0.0);
    if (!p->n_stats) return;
    double val[KV_MAX_STATS];
    s->kv->cls->stats(s->kv, val);
    char line[2048];
    int len = snprintf(line, sizeof line, "%s stats:", p->name);
    for (int i = 0; i < p->n_stats && len < (int)sizeof line; i++) {
        if (isnan(val[i])) continue;
        const char *u = p->stat_defs[i].unit;
        if (!strcmp(u, "B") && val[i] >= 1048576)
            len += snprintf(line + len, sizeof line - len, " %s %.2f MiB", p->stat_defs[i].key, val[i] / 1048576.0);
        else if (!strcmp(u, "B") && val[i] >= 1024)
            len += snprintf(line + len, sizeof line - len, " %s %.1f KiB", p->stat_defs[i].key, val[i] / 1024.0);
        else {
            char num[40];
            len += snprintf(line + len, sizeof line - len, " %s %s%s%s", p->stat_defs[i].key,
                            skv_num(num, sizeof num, val[i], 4),
                            !strcmp(u, "%") || !strcmp(u, "x") ? "" : u[0] ? " " : "", !strcmp(u, "B") ? "B" : u);
        }
    }
    cli_msg("%s\n", line);
    if (s->n_compared)
        cli_msg("oracle: top-1 agrees with dense on %d of %d steps\n", s->n_agree, s->n_compared);
    kv_oracle_summary os;
    if (kv_oracle_get(s->oracle, -1, &os) && os.n) {
        cli_msg("oracle: mass recall %.2f%% (min %.2f%%), overlap with the exact top-B %.2f%%, "
                        "output error %.3f%% (max %.3f%%); over %llu (step, layer, query head)\n",
                100 * os.recall, 100 * os.recall_min, 100 * os.overlap, 100 * os.out_err, 100 * os.out_err_max,
                (unsigned long long)os.n);
        size_t res, off;
        s->kv->cls->bytes(s->kv, &res, &off);
        cli_msg("budget in three units: %.1f tokens attended in full precision per query head "
                        "(%.1f prompt + %.1f generated), %.2f%% of the context; %.2f MiB resident\n",
                os.kept, os.kept - os.gen, os.gen, os.ctx > 0 ? 100 * os.kept / os.ctx : 0.0, res / 1048576.0);
        char rl[1024], el[1024];
        int nr = 0, ne = 0;
        for (int l = 0; kv_oracle_get(s->oracle, l, &os); l++) {
            nr += snprintf(rl + nr, sizeof rl - (size_t)nr, "%s%.1f", l ? " " : "", 100 * os.recall);
            ne += snprintf(el + ne, sizeof el - (size_t)ne, "%s%.2f", l ? " " : "", 100 * os.out_err);
            if (nr >= (int)sizeof rl - 16 || ne >= (int)sizeof el - 16) break;
        }
        cli_msg("oracle per layer: mass recall %% %s; output error %% %s\n", rl, el);
    }
}

/* A full context ends a run as end of text does: the token sampled last
 * is kept (its trace event), and this line says why the text stops (after
 * a newline when the text streamed on the same terminal). */
static void context_full(int ctx, int streamed) {
    fflush(stdout);
    if (streamed) fputc('\n', stderr);
    char why[160];
    cli_context_full_text(why, sizeof why, ctx);
    cli_msg("%s\n", why);
}

/* skv run --kv a,b,...: the policies in lockstep on the teacher's tokens;
 * the teacher's text on stdout, one line per policy on stderr. */
static int run_compare(cli_gen *g) {
    int trc = trace_begin(g, "run");
    if (trc) return trc;
    skv_model *m = NULL;
    compare_run *c = NULL;
    int32_t *ids = NULL;
    int n = 0, rc = 0, generated = 0;
    const char *text = cli_prompt_text(g);
    if (!g->model) rc = cli_usage_error("run", "no model: give -m MODEL");
    else if (!text) rc = 2;
    else if (demo_model) cli_msg("no -m: the demo model %s\n", g->model);
    if (!rc && g->threads) skv_set_threads(g->threads);
    if (!rc && model_load(g->model, &m)) rc = cli_fail();
    if (!rc) cli_ctx_warning(g, m);
    if (!rc && tok_encode(m->tok, text, strlen(text), tok_add_bos(m->tok) && !g->no_bos, 1, &ids, &n)) rc = cli_fail();
    if (!rc && n == 0) { cli_msg("the prompt is empty after tokenization\n"); rc = 1; }
    if (!rc && compare_new(m, &g->s, g->kv_list, g->n_kv, &c)) rc = cli_fail();
    cli_stop_catch("step"); /* Ctrl-C: stop after the step in flight, then the table and the trace */
    if (!rc && compare_prefill(c, ids, n, NULL, NULL)) rc = cli_fail();
    if (!rc) {
        for (int i = 0; i < c->n; i++)
            if (c->s[i]->kv->notice[0]) cli_msg("%s\n", c->s[i]->kv->notice);
        cli_msg("compare: %d policies in lockstep, each fed %s's tokens (the text below)\n", c->n,
                c->policy[c->teacher]);
        int prev = ids[n - 1];
        char buf[256];
        for (int i = 0; i < g->n_predict && !cli_stop_requested(); i++, generated++) {
            int tok = compare_next(c);
            if (tok_is_eog(m->tok, tok)) break;
            int len = tok_piece(m->tok, prev, tok, 0, buf, sizeof buf);
            if (len > 0) fwrite(buf, 1, len < (int)sizeof buf ? len : (int)sizeof buf, stdout);
            fflush(stdout);
            prev = tok;
            const skv_session *s0 = c->s[0];
            if (i + 1 == g->n_predict || s0->n_past + 1 > s0->o.ctx) { /* no step feeds it: the trace has it all the same */
                compare_emit_last(c, tok);
                if (i + 1 < g->n_predict) context_full(s0->o.ctx, 1);
                generated++;
                break;
            }
            if (compare_decode(c, tok)) { printf("\n"); rc = cli_fail(); break; }
        }
        printf("\n");
        fflush(stdout);
        if (cli_stop_requested())
            cli_msg("stopped after %d generated tokens (interrupted)%s\n", generated,
                    g->trace ? "; the trace holds every step so far" : "");
        cli_msg("%-9s %7s %9s %11s %13s %8s %8s %9s\n", "policy", "top-1", "decode", "resident",
                "fetched/step", "recall", "overlap", "out err");
        for (int i = 0; i < c->n && !rc; i++) {
            skv_session *s = c->s[i];
            size_t res, off;
            s->kv->cls->bytes(s->kv, &res, &off);
            double fb = kv_stat(s->kv, "fetch_bytes");
            kv_oracle_summary os;
            int has = kv_oracle_get(s->oracle, -1, &os) && os.n;
            char agree[16], tps[24], fetch[24], rec[16], ov[16], err[16];
            snprintf(agree, sizeof agree, "%d/%d", c->agree[i], c->steps);
            snprintf(tps, sizeof tps, "%.1f t/s", s->step ? s->step / (s->t_decode > 0 ? s->t_decode : 1e-9) : 0.0);
            if (isnan(fb) || !s->step) snprintf(fetch, sizeof fetch, "-");
            else snprintf(fetch, sizeof fetch, "%.1f KiB", fb / s->step / 1024.0);
            if (has) {
                snprintf(rec, sizeof rec, "%.2f%%", 100 * os.recall);
                snprintf(ov, sizeof ov, "%.2f%%", 100 * os.overlap);
                snprintf(err, sizeof err, "%.3f%%", 100 * os.out_err);
            } else {
                snprintf(rec, sizeof rec, "-");
                snprintf(ov, sizeof ov, "-");
                snprintf(err, sizeof err, "-");
            }
            cli_msg("%-9s %7s %9s %7.2f MiB %13s %8s %8s %9s%s\n", c->policy[i], agree, tps,
                    res / 1048576.0, fetch, rec, ov, err, i == c->teacher ? "  (teacher)" : "");
        }
        if (!g->s.kv.oracle) cli_msg("(--oracle adds each policy's recall, overlap and output error)\n");
    }
    cli_stop_release();
    rc = trace_end(g, rc, " (skv inspect --trace shows every policy)", generated, g->n_predict);
    if (!rc && cli_stop_requested()) rc = CLI_STOPPED;
    probe_bus_free(g->bus);
    compare_free(c);
    model_free(m);
    free(ids);
    cli_gen_free(g);
    return rc;
}

/* skv run --parallel B: the prompt prefilled once and forked into B
 * sequences (a shared prefix), decoded together, one step for all
 * (engine/batch.c); sequence i samples with seed + i, so with --temp they
 * part. Each sequence's text is printed when the run ends. */
static int run_parallel(cli_gen *g, int B) {
    if (g->s.kv.oracle) return cli_usage_error("run", "--oracle scores one sequence: it does not go with --parallel");
    if (g->trace && B > PROBE_MAX_LANES)
        return cli_usage_error("run", "--trace records at most %d sequences of a batch (--parallel %d)",
                               PROBE_MAX_LANES, B);
    const char *text = cli_prompt_text(g);
    if (!text) { cli_gen_free(g); return 2; }
    int trc = trace_begin(g, "run"); /* one lane a sequence (docs/TRACE.md) */
    if (trc) { probe_bus_free(g->bus); cli_gen_free(g); return trc; }
    if (demo_model) cli_msg("no -m: the demo model %s\n", g->model);
    if (g->threads) skv_set_threads(g->threads);
    skv_model *m = NULL;
    int32_t *ids = NULL;
    int n = 0, rc = 0, steps = 0;
    skv_session *src = NULL, **seqs = calloc((size_t)B, sizeof *seqs);
    skv_batch *b = NULL;
    char **out = calloc((size_t)B, sizeof *out);
    size_t *len = calloc((size_t)B, sizeof *len);
    int *done = calloc((size_t)B, sizeof *done), *prev = calloc((size_t)B, sizeof *prev);
    int32_t *tok = calloc((size_t)B, sizeof *tok);
    unsigned char *live = calloc((size_t)B, 1);
    if (!seqs || !out || !len || !done || !prev || !tok || !live) {
        rc = skv_error(SKV_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = model_load(g->model, &m))) goto fail;
    cli_ctx_warning(g, m);
    if ((rc = tok_encode(m->tok, text, strlen(text), tok_add_bos(m->tok) && !g->no_bos, 1, &ids, &n))) goto fail;
    if (n == 0) { rc = skv_error(SKV_EINVAL, "the prompt is empty after tokenization"); goto fail; }
    session_opts so = g->s;
    so.record_prefill = 1;
    if ((rc = session_new(m, &so, &src)) || (rc = session_prefill(src, ids, n, NULL, NULL))) goto fail;
    if (src->notice[0]) cli_msg("%s\n", src->notice);
    if (src->kv->notice[0]) cli_msg("%s\n", src->kv->notice);
    for (int i = 0; i < B && !rc; i++) {
        if ((rc = session_fork(src, &g->s.kv, &seqs[i]))) break;
        session_set_bus(seqs[i], g->bus);
        sampler_opts sp = g->s.sample;
        sp.seed += (uint64_t)i; /* each sequence its own draws */
        sampler_free(&seqs[i]->smp);
        rc = sampler_init(&seqs[i]->smp, &sp, m->cfg.vocab);
    }
    if (rc) goto fail;
    if ((rc = batch_new(seqs, B, &b))) goto fail;
    for (int i = 0; i < B; i++) { seqs[i] = NULL; prev[i] = ids[n - 1]; }
    cli_stop_catch("step");
    for (int t = 0; t < g->n_predict && !rc && !cli_stop_requested(); t++) {
        int n_live = 0, first = -1;
        for (int i = 0; i < B; i++) {
            live[i] = 0;
            if (done[i]) continue; /* ended: fed nothing more, so its trace ends with its text */
            int id = session_sample(batch_seq(b, i));
            if (tok_is_eog(m->tok, id)) { done[i] = 1; continue; }
            char piece[256];
            int k = tok_piece(m->tok, prev[i], id, 0, piece, sizeof piece);
            if (k > (int)sizeof piece) k = sizeof piece;
            char *grown = k > 0 ? realloc(out[i], len[i] + (size_t)k + 1) : out[i];
            if (k > 0 && !grown) { rc = skv_error(SKV_ENOMEM, "out of memory"); break; }
            if (k > 0) { out[i] = grown; memcpy(out[i] + len[i], piece, (size_t)k); out[i][len[i] += (size_t)k] = 0; }
            prev[i] = tok[i] = id;
            live[i] = 1;
            if (first < 0) first = i;
            n_live++;
        }
        if (rc || !n_live) break;
        /* the live sequences share their position: a full context ends the run, as end of text does */
        const skv_session *s0 = batch_seq(b, first);
        int full = s0->n_past + 1 > s0->o.ctx;
        if (t + 1 == g->n_predict || full) { /* no step feeds them: the trace has them all the same */
            for (int i = 0; i < B; i++)
                if (live[i]) batch_emit_last(b, i, tok[i]);
            if (full && t + 1 < g->n_predict) context_full(s0->o.ctx, 0);
            break;
        }
        rc = batch_decode_live(b, tok, live);
        steps++;
    }
    cli_stop_release();
    for (int i = 0; i < B && !rc; i++) printf("--- sequence %d ---\n%s\n", i, out[i] ? out[i] : "");
    fflush(stdout);
    if (!rc) {
        size_t res_all = 0;
        for (int i = 0; i < B; i++) {
            size_t r0, o0;
            skv_session *s = batch_seq(b, i);
            s->kv->cls->bytes(s->kv, &r0, &o0);
            res_all += r0;
        }
        double t = batch_t_decode(b);
        const char *seqs = B == 1 ? "sequence" : "sequences";
        long fed = batch_rows_fed(b);
        char ended[80] = "";
        if (fed < (long)B * steps) snprintf(ended, sizeof ended, " (%ld tokens: an ended sequence is fed none)", fed);
        cli_msg("prompt %d tokens, %.1f tok/s prefill (once, shared by %d %s); %d step%s of %d %s%s, "
                "%.1f tok/s decode (%.2f ms a step); KV resident %.2f MiB in all\n", n,
                n / (src->t_prefill > 0 ? src->t_prefill : 1e-9), B, seqs, steps, steps == 1 ? "" : "s", B, seqs,
                ended, t > 0 ? fed / t : 0.0, steps ? 1000 * t / steps : 0.0, res_all / 1048576.0);
    }
    if (!rc && cli_stop_requested()) rc = CLI_STOPPED;
fail:
    if (rc && rc != CLI_STOPPED) rc = cli_fail();
    rc = trace_end(g, rc, " (skv inspect --trace: p steps through the sequences)", steps, g->n_predict);
    for (int i = 0; seqs && i < B; i++) session_free(seqs[i]);
    batch_free(b);
    session_free(src);
    probe_bus_free(g->bus);
    for (int i = 0; out && i < B; i++) free(out[i]);
    free(out); free(len); free(done); free(prev); free(tok); free(live); free(seqs);
    free(ids);
    model_free(m);
    cli_gen_free(g);
    return rc;
}

static void run_help(FILE *o) {
    fprintf(o, "usage: skv run [-m MODEL] (-p TEXT | -f FILE) [options]\n\n"
               "Generates text after the prompt, streaming it to stdout; speed goes to stderr.\n"
               "Without -m: the demo model, samples/model/skv-demo.gguf.\n"
               "-np, --parallel B decodes B sequences of the prompt together (one prefill, forked; one pass\n"
               "of the weights a step; sequence i samples with seed + i) and prints each one's text; its\n"
               "--trace holds one lane a sequence (up to 64).\n\n");
    cli_gen_help(o, CLI_HELP_SAMPLING | CLI_HELP_TRACE);
}

int cmd_run(int argc, char **argv) {
    cli_gen g;
    cli_gen_default(&g);
    int parallel = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { run_help(stdout); return 0; }
        if (!strcmp(argv[i], "-np") || !strcmp(argv[i], "--parallel")) {
            char *end;
            long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (i + 1 >= argc || *end || v < 1 || v > 4096)
                return cli_usage_error("run", "%s expects a number of sequences in [1, 4096]", argv[i]);
            parallel = (int)v;
            i++;
            continue;
        }
        int r = cli_gen_option(&g, argc, argv, &i);
        if (r < 0) return 2;
        if (r == CLI_DONE) return 0;
        if (r == 0) return cli_usage_error("run", "unknown option '%s'", argv[i]);
    }
    if (cli_check_policy_flags(&g, "run", NULL, 0)) { cli_gen_free(&g); return 2; }
    /* No -m: the demo model, as skv inspect and skv needle, said once. */
    static char model_buf[PATH_MAX + 64];
    if (!g.model) {
        if (cli_demo_model("run", model_buf, sizeof model_buf)) {
            cli_gen_free(&g);
            return 1;
        }
        g.model = model_buf;
        demo_model = 1; /* said once the prompt is read, so that an error stays one line */
    }
    if (parallel && g.n_kv > 1) return cli_usage_error("run", "--parallel decodes one policy; a --kv list compares policies");
    if (parallel) return run_parallel(&g, parallel);
    if (g.n_kv > 1) return run_compare(&g);
    skv_model *m; skv_session *s; int32_t *ids; int n;
    /* Ctrl-C from here on (the prefill too): stop after the step in flight,
     * then the summary and the trace */
    cli_stop_catch("step");
    int rc = setup(&g, "run", &m, &s, &ids, &n);
    if (rc) { cli_stop_release(); return teardown(m, s, ids, &g, rc, 0, g.n_predict); }
    int prev = ids[n - 1];
    char buf[256];
    int generated = 0;
    for (int i = 0; i < g.n_predict && !cli_stop_requested(); i++) {
        int tok = session_sample(s);
        if (tok_is_eog(m->tok, tok)) break;
        int len = tok_piece(m->tok, prev, tok, 0, buf, sizeof buf);
        if (len > 0) fwrite(buf, 1, len < (int)sizeof buf ? len : (int)sizeof buf, stdout);
        fflush(stdout);
        prev = tok;
        generated++;
        if (i + 1 == g.n_predict || s->n_past + 1 > s->o.ctx) { /* no step feeds it: the trace has it all the same */
            session_emit_last(s, tok);
            if (i + 1 < g.n_predict) context_full(s->o.ctx, 1);
            break;
        }
        if (session_decode(s, tok)) { printf("\n"); rc = cli_fail(); break; }
    }
    printf("\n");
    fflush(stdout);
    cli_stop_release();
    if (cli_stop_requested()) cli_msg("stopped after %d generated tokens (interrupted)%s\n", generated,
                          g.trace ? "; the trace holds every step so far" : "");
    /* With --oracle its exact attention runs inside each decode step (and a
     * dense twin beside it): say so, and give the rate without its scoring. */
    kv_oracle_summary osum;
    double t_or = s->oracle && kv_oracle_get(s->oracle, -1, &osum) && osum.n ? osum.seconds : 0;
    char own[160] = "";
    if (s->oracle && s->step && s->t_decode > t_or)
        snprintf(own, sizeof own, " including the oracle's scoring (%.1f tok/s without it; timings under --oracle are "
                 "not speed figures)", s->step / (s->t_decode - t_or));
    cli_msg("prompt %d tokens, %.1f tok/s prefill; generated %d tokens, %.1f tok/s decode%s\n", n,
            n / (s->t_prefill > 0 ? s->t_prefill : 1e-9), generated,
            s->step ? s->step / (s->t_decode > 0 ? s->t_decode : 1e-9) : 0.0, own);
    print_kv_accounting(s);
    if (!rc && cli_stop_requested()) rc = CLI_STOPPED; /* interrupted: after the summary and the trace */
    return teardown(m, s, ids, &g, rc, generated, g.n_predict);
}

static void logits_help(FILE *o) {
    fprintf(o, "usage: skv logits -m MODEL -p TEXT [--no-bos] [-n 24] --json\n\n"
               "Prints {\"tokens\":[...],\"last_logits\":[...],\"greedy\":[...]}: the prompt's token ids,\n"
               "all logits at its last position and N greedy tokens after it.\n\n");
    cli_gen_help(o, CLI_HELP_TRACE);
    fprintf(o, "  -n N                  greedy tokens (default 24)\n"
               "      --json            JSON output (the only format)\n");
}

int cmd_logits(int argc, char **argv) {
    cli_gen g;
    cli_gen_default(&g);
    g.n_predict = 24;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { logits_help(stdout); return 0; }
        if (!strcmp(argv[i], "--json")) { g.json = 1; continue; }
        int r = cli_gen_option(&g, argc, argv, &i);
        if (r < 0) return 2;
        if (r == CLI_DONE) return 0;
        if (r == 0) return cli_usage_error("logits", "unknown option '%s'", argv[i]);
    }
    g.s.sample.temp = 0;
    if (cli_single_policy(&g, "logits")) return 2;
    skv_model *m; skv_session *s; int32_t *ids; int n;
    int rc = setup(&g, "logits", &m, &s, &ids, &n);
    if (rc) return teardown(m, s, ids, &g, rc, -1, 0);
    printf("{\"tokens\":[");
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("],\"last_logits\":[");
    const float *l = session_logits(s);
    for (int i = 0; i < m->cfg.vocab; i++) printf("%s%.9g", i ? "," : "", l[i]);
    printf("],\"greedy\":[");
    for (int i = 0; i < g.n_predict; i++) {
        int tok = sampler_argmax(session_logits(s), m->cfg.vocab);
        printf("%s%d", i ? "," : "", tok);
        if (tok_is_eog(m->tok, tok)) break;
        if (i + 1 < g.n_predict && session_decode(s, tok)) { rc = cli_fail(); break; }
    }
    printf("]}\n");
    return teardown(m, s, ids, &g, rc, -1, 0);
}
