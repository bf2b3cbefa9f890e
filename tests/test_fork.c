/* test_fork.c: session_fork, the prefill replay the needle harness checks
 * its fixes with. For every policy, on the demo model: a session that
 * recorded its prefill, forked with other options (a budget, a rank, a
 * window...), decodes bit for bit as a session made from scratch with those
 * options on the same prompt: the same logits at every step. */
#include "kv.h"
#include "model.h"
#include "sampler.h"
#include "session.h"
#include "skv.h"
#include "testhelp.h"
#include "tok.h"

#include <sys/stat.h>

#define DEMO "samples/model/skv-demo.gguf"

typedef struct { const char *policy; const char *set[3][2]; } variant;

static int greedy_logits(skv_session *s, int steps, float *out, int V) {
    for (int t = 0; t < steps; t++) {
        memcpy(out + (size_t)t * V, session_logits(s), sizeof(float) * (size_t)V);
        int id = sampler_argmax(session_logits(s), V);
        if (session_decode(s, id)) return -1;
    }
    return 0;
}

int main(void) {
    struct stat sb;
    if (stat(DEMO, &sb) != 0) {
        test_skip(DEMO " is missing: run the tests from the project root");
        return test_report("test_fork");
    }
    skv_model *m = NULL;
    if (model_load(DEMO, &m)) { test_cond("the demo model loads", 0); return test_report("test_fork"); }
    char *text = NULL;
    size_t tn = 0;
    int32_t *ids = NULL;
    int n = 0;
    if (skv_read_file("samples/prompts/needle.txt", 1 << 24, &text, &tn) ||
        tok_encode(m->tok, text, tn, tok_add_bos(m->tok), 1, &ids, &n)) {
        test_cond("the needle prompt tokenizes", 0);
        model_free(m);
        return test_report("test_fork");
    }
    free(text);
    enum { STEPS = 6 };
    int V = m->cfg.vocab;
    float *a = malloc(sizeof(float) * STEPS * (size_t)V), *b = malloc(sizeof(float) * STEPS * (size_t)V);
    static const variant vs[] = {
        { "shadowkv", { { "budget", "128" }, { "rank", "24" }, { "local", "8" } } },
        { "shadowkv", { { "outliers", "12" }, { NULL, NULL } } },
        { "quest", { { "budget", "96" }, { "page", "8" } } },
        { "freekv", { { "budget", "320" }, { "sink", "32" }, { "window", "32" } } },
        { "specache", { { "budget", "160" } } },
        { "tailorkv", { { "budget", "200" }, { "start", "32" }, { "recent", "32" } } },
        { "dense", { { NULL, NULL } } },
    };
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
        session_opts so;
        session_opts_default(&so);
        snprintf(so.kv.policy, sizeof so.kv.policy, "%s", vs[i].policy);
        so.kv.budget = 64;
        so.kv.oracle = 1; /* the harness records from its probed run: the oracle must not change what is recorded */
        so.record_prefill = 1;
        kv_opts changed = so.kv;
        changed.oracle = 0;
        for (int k = 0; k < 3 && vs[i].set[k][0]; k++) {
            if (!strcmp(vs[i].set[k][0], "budget")) changed.budget = atoi(vs[i].set[k][1]);
            else kv_opts_set(&changed, vs[i].set[k][0], vs[i].set[k][1], 0);
        }
        skv_session *src = NULL, *fork = NULL, *scratch = NULL;
        session_opts sc = so;
        sc.kv = changed;
        sc.record_prefill = 0;
        int rc = session_new(m, &so, &src);
        if (!rc) rc = session_prefill(src, ids, n, NULL, NULL);
        if (!rc) rc = session_decode(src, sampler_argmax(session_logits(src), V)); /* the source decodes on */
        if (!rc) rc = session_fork(src, &changed, &fork);
        if (!rc) rc = greedy_logits(fork, STEPS, a, V);
        if (!rc) rc = session_new(m, &sc, &scratch);
        if (!rc) rc = session_prefill(scratch, ids, n, NULL, NULL);
        if (!rc) rc = greedy_logits(scratch, STEPS, b, V);
        char msg[200];
        snprintf(msg, sizeof msg, "%s forked with %s%s%s: the same logits as a prefill from scratch at %d steps",
                 vs[i].policy, vs[i].set[0][0] ? vs[i].set[0][0] : "its own options",
                 vs[i].set[1][0] ? ", " : "", vs[i].set[1][0] ? vs[i].set[1][0] : "", STEPS);
        test_cond(msg, rc == 0 && !memcmp(a, b, sizeof(float) * STEPS * (size_t)V));
        if (rc) printf("  %s\n", skv_last_error());
        session_free(src);
        session_free(fork);
        session_free(scratch);
    }
    session_opts so;
    session_opts_default(&so);
    skv_session *s = NULL, *f = NULL;
    int rc = session_new(m, &so, &s);
    if (!rc) rc = session_prefill(s, ids, n, NULL, NULL);
    test_cond("a session that did not record its prefill cannot be forked",
              rc == 0 && session_fork(s, &so.kv, &f) == SKV_EINVAL && !f);
    session_free(s);
    free(a);
    free(b);
    free(ids);
    model_free(m);
    return test_report("test_fork");
}
