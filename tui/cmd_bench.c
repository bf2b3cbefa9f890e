/* cmd_bench.c: `skv bench`: prefill and decode speed on a synthetic prompt
 * of random token ids, for one model and KV policy per run. Side-by-side
 * comparisons (dense vs shadowkv, probes on vs off) are made by
 * tests/bench.sh, which runs this in one go and prints ratios. */
#include "cli.h"
#include "model.h"
#include "probe.h"
#include "skv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *o) {
    fprintf(o, "usage: skv bench -m MODEL [--prompt-tokens N] [-n N] [--repeat R] [options]\n\n"
               "Times a prefill of N random tokens (default 512) and N decode steps after it\n"
               "(default 64); prints one line: prefill tok/s, decode tok/s, decode ms/step, and\n"
               "the KV bytes moved per decode step (fetched from slow memory; read from resident\n"
               "memory where the policy counts it).\n"
               "The best of R repeats (default 1) is reported.\n\n");
    cli_gen_help(o, 0);
    fprintf(o, "  -n N                  decode steps (default 64)\n"
               "      --prompt-tokens N prompt length (default 512)\n"
               "      --repeat R        repeats; the best is reported (default 1)\n");
}

static void sum_compress(const probe_event *ev, void *user) {
    const probe_ev_prefill_layer *p = &ev->prefill_layer;
    *(double *)user += p->t_svd + p->t_landmarks + p->t_cosmin + p->t_outliers + p->t_offload;
}

int cmd_bench(int argc, char **argv) {
    cli_gen g;
    cli_gen_default(&g);
    int np = 512, repeat = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { help(stdout); return 0; }
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
    if (cli_single_policy(&g, "bench")) return 2;
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
    double best_pp = 0, best_tg = 0, compress = 0, compress_pct = 0, fetch_step = NAN, read_step = NAN;
    int rc = 0;
    /* A policy's prefill work (SVD, landmarks, cos-min, outliers, offload) is
     * timed by its prefill-layer probe, if it emits one; only that kind is
     * subscribed, so the decode steps run with every probe off. */
    probe_bus *bus = NULL;
    probe_sub *sub = NULL;
    if (probe_bus_new(&bus) ||
        probe_subscribe_callback(bus, PROBE_MASK(PROBE_PREFILL_LAYER), sum_compress, &compress, &sub)) {
        rc = cli_fail();
    }
    g.s.bus = bus;
    for (int r = 0; r < repeat && !rc; r++) {
        skv_session *s;
        compress = 0;
        if (session_new(m, &g.s, &s)) { rc = cli_fail(); break; }
        if (session_prefill(s, ids, np, NULL, NULL)) { rc = cli_fail(); session_free(s); break; }
        for (int i = 0; i < g.n_predict; i++)
            if (session_decode(s, ids[i % np])) { rc = cli_fail(); break; }
        double pp = np / s->t_prefill, tg = s->step ? s->step / s->t_decode : 0;
        if (pp > best_pp) best_pp = pp, compress_pct = 100 * compress / s->t_prefill;
        if (tg > best_tg) best_tg = tg;
        /* bytes moved per decode step: fetched from slow memory, and read
         * from resident memory where the policy counts that (Quest) */
        if (s->step) {
            fetch_step = kv_stat(s->kv, "fetch_bytes") / s->step;
            read_step = kv_stat(s->kv, "read_bytes") / s->step;
        }
        session_free(s);
    }
    if (!rc)
        printf("model=%s kv=%s threads=%d prompt=%d decode=%d prefill_tok_s=%.1f decode_tok_s=%.2f decode_ms=%.3f "
               "compress_pct=%.2f fetch_bytes_step=%.0f read_bytes_step=%.0f\n",
               m->cfg.name[0] ? m->cfg.name : g.model, g.s.kv.policy, skv_threads(), np, g.n_predict, best_pp, best_tg,
               best_tg > 0 ? 1000.0 / best_tg : 0.0, compress_pct, isnan(fetch_step) ? 0 : fetch_step,
               isnan(read_step) ? 0 : read_step);
    if (sub) probe_unsubscribe(sub);
    probe_bus_free(bus);
    free(ids);
    model_free(m);
    cli_gen_free(&g);
    return rc;
}
