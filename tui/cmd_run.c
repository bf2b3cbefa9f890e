/* cmd_run.c: `skv run` streams generated text; `skv logits` prints tokens,
 * last-position logits and greedy continuation as JSON for machine checks. */
#include "cli.h"
#include "kv_shadowkv.h"
#include "model.h"
#include "probe.h"
#include "skv.h"
#include "tok.h"
#include "trace.h"

#include <stdlib.h>
#include <string.h>

/* Loads the model, tokenizes the prompt and prefills a session (recording a
 * trace when --trace was given). */
static int setup(cli_gen *g, const char *cmd, skv_model **m, skv_session **s, int32_t **ids, int *n) {
    *m = NULL; *s = NULL; *ids = NULL;
    if (g->trace) {
        if (probe_bus_new(&g->bus) || trace_writer_open(g->trace, g->bus, &g->tw)) return cli_fail();
        g->s.bus = g->bus;
    }
    if (!g->model) return cli_usage_error(cmd, "no model: give -m MODEL");
    const char *text = cli_prompt_text(g);
    if (!text) return 2;
    if (g->threads) skv_set_threads(g->threads);
    if (model_load(g->model, m)) return cli_fail();
    int add_bos = tok_add_bos((*m)->tok) && !g->no_bos;
    if (tok_encode((*m)->tok, text, strlen(text), add_bos, 1, ids, n)) return cli_fail();
    if (*n == 0) { fprintf(stderr, "skv: the prompt is empty after tokenization\n"); return 1; }
    if (session_new(*m, &g->s, s)) return cli_fail();
    if (session_prefill(*s, *ids, *n, NULL, NULL)) return cli_fail();
    if ((*s)->notice[0]) fprintf(stderr, "skv: %s\n", (*s)->notice);
    if ((*s)->kv->notice[0]) fprintf(stderr, "skv: %s\n", (*s)->kv->notice);
    return 0;
}

/* Closes the trace (atomically: all or nothing), then frees everything. */
static int teardown(skv_model *m, skv_session *s, int32_t *ids, cli_gen *g, int rc) {
    if (g->tw) {
        if (rc) trace_writer_abort(g->tw);
        else if (trace_writer_close(g->tw)) rc = cli_fail();
        else fprintf(stderr, "skv: trace written to %s\n", g->trace);
    }
    probe_bus_free(g->bus);
    session_free(s);
    model_free(m);
    free(ids);
    cli_gen_free(g);
    return rc;
}

/* Memory and bandwidth of a ShadowKV run against dense, with the paper's
 * formulas (DESIGN.md) evaluated at the measured hit rate. */
static void print_shadowkv_accounting(const skv_session *s) {
    kv_shadowkv_stats st;
    if (kv_shadowkv_stats_get(kv_tap_inner(s->kv), &st)) { skv_clear_error(); return; }
    const model_config *c = &s->m->cfg;
    double M = (double)c->n_kv_heads * c->head_dim; /* elements per K or V vector */
    double S = st.prompt_len, C = st.chunk, K = st.k, O = st.outliers, r = st.rank;
    double dense = 2.0 * c->n_layers * (double)s->n_past * M * sizeof(float);
    double alpha = st.hits + st.misses ? (double)st.hits / (st.hits + st.misses) : 0;
    const double hbm_over_pcie = 2.0e12 / 32e9; /* A100-class HBM vs PCIe 4.0 x16, as in the paper */
    double eq_bw = 2 * S / (S / C + 2 * (K + O) * C + (1 - alpha) * K * C * hbm_over_pcie);
    double saving = 2 * S * M / (S * M / C + 2 * (K + O) * C * M + S * r + r * M);
    fprintf(stderr, "skv: shadowkv KV bytes: resident %.2f MiB + offloaded %.2f MiB vs dense %.2f MiB "
                    "(resident %.1f%% of dense)\n",
            st.resident / 1048576.0, st.offloaded / 1048576.0, dense / 1048576.0, 100.0 * st.resident / dense);
    fprintf(stderr, "skv: shadowkv rank %d, k %d chunks of %d, outliers %d, hit rate %.1f%%, fetched %llu chunks "
                    "(%.2f MiB), key SVD rel. error mean %.2e max %.2e\n",
            st.rank, st.k, st.chunk, st.outliers, 100 * alpha, (unsigned long long)st.fetches,
            st.fetch_bytes / 1048576.0, st.rel_err_mean, st.rel_err_max);
    fprintf(stderr, "skv: paper formulas at this hit rate: equivalent bandwidth %.2fx HBM "
                    "(HBM/PCIe = %.1f), memory saving %.2fx\n", eq_bw, hbm_over_pcie, saving);
    if (st.oracle_recall_sel >= 0)
        fprintf(stderr, "skv: oracle: selected chunks capture %.1f%% of exact attention, the sparse set %.1f%%; "
                        "top-1 agrees with dense on %d of %d steps\n",
                100 * st.oracle_recall_sel, 100 * st.oracle_recall_sparse, s->n_agree, s->n_compared);
}

static void run_help(FILE *o) {
    fprintf(o, "usage: skv run -m MODEL (-p TEXT | -f FILE) [options]\n\n"
               "Generates text after the prompt, streaming it to stdout; speed goes to stderr.\n\n");
    cli_gen_help(o, 1);
}

int cmd_run(int argc, char **argv) {
    cli_gen g;
    cli_gen_default(&g);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { run_help(stdout); return 0; }
        int r = cli_gen_option(&g, argc, argv, &i);
        if (r < 0) return 2;
        if (r == CLI_DONE) return 0;
        if (r == 0) return cli_usage_error("run", "unknown option '%s'", argv[i]);
    }
    skv_model *m; skv_session *s; int32_t *ids; int n;
    int rc = setup(&g, "run", &m, &s, &ids, &n);
    if (rc) return teardown(m, s, ids, &g, rc);
    int prev = ids[n - 1];
    char buf[256];
    int generated = 0;
    for (int i = 0; i < g.n_predict; i++) {
        int tok = session_sample(s);
        if (tok_is_eog(m->tok, tok)) break;
        int len = tok_piece(m->tok, prev, tok, 0, buf, sizeof buf);
        if (len > 0) fwrite(buf, 1, len < (int)sizeof buf ? len : (int)sizeof buf, stdout);
        fflush(stdout);
        prev = tok;
        generated++;
        if (i + 1 < g.n_predict && session_decode(s, tok)) { printf("\n"); rc = cli_fail(); break; }
    }
    printf("\n");
    fprintf(stderr, "skv: prompt %d tokens, %.1f tok/s prefill; generated %d tokens, %.1f tok/s decode\n", n,
            n / (s->t_prefill > 0 ? s->t_prefill : 1e-9), generated,
            s->step ? s->step / (s->t_decode > 0 ? s->t_decode : 1e-9) : 0.0);
    print_shadowkv_accounting(s);
    return teardown(m, s, ids, &g, rc);
}

static void logits_help(FILE *o) {
    fprintf(o, "usage: skv logits -m MODEL -p TEXT [--no-bos] [-n 24] --json\n\n"
               "Prints {\"tokens\":[...],\"last_logits\":[...],\"greedy\":[...]}: the prompt's token ids,\n"
               "all logits at its last position and N greedy tokens after it.\n\n");
    cli_gen_help(o, 0);
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
    skv_model *m; skv_session *s; int32_t *ids; int n;
    int rc = setup(&g, "logits", &m, &s, &ids, &n);
    if (rc) return teardown(m, s, ids, &g, rc);
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
    return teardown(m, s, ids, &g, rc);
}
