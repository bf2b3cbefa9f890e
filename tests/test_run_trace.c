/* test_run_trace: a trace recorded from a real ShadowKV run replays into
 * exactly the events the run emitted, in order, field by field; and a probe
 * bus with no subscriber changes nothing about the run's logits. */
#include "model.h"
#include "probe.h"
#include "session.h"
#include "skv.h"
#include "tok.h"
#include "trace.h"
#include "testhelp.h"

typedef struct { probe_event **ev; int n, cap; } event_log;

static void collect(const probe_event *ev, void *user) {
    event_log *l = user;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->ev = realloc(l->ev, sizeof *l->ev * l->cap);
    }
    l->ev[l->n++] = probe_event_dup(ev);
}

/* Runs prompt + 12 greedy steps; returns the final logits (malloc'd). */
static float *run(skv_model *m, probe_bus *bus, const int32_t *ids, int n) {
    session_opts o;
    session_opts_default(&o);
    snprintf(o.kv.policy, sizeof o.kv.policy, "shadowkv");
    kv_opts_set_num(&o.kv, "rank", 8); o.kv.budget = 16; kv_opts_set_num(&o.kv, "outliers", 1); kv_opts_set_num(&o.kv, "local", 1); o.kv.oracle = 1;
    o.bus = bus;
    skv_session *s;
    if (session_new(m, &o, &s) || session_prefill(s, ids, n, NULL, NULL)) return NULL;
    for (int i = 0; i < 12; i++)
        if (session_decode(s, session_sample(s))) break;
    float *l = malloc(sizeof(float) * m->cfg.vocab);
    memcpy(l, session_logits(s), sizeof(float) * m->cfg.vocab);
    session_free(s);
    return l;
}

int main(void) {
    const char *path = test_shared("models/stories260k.gguf");
    if (!path) { test_skip("test_run_trace: ../shared/models missing"); return test_report("test_run_trace"); }
    skv_model *m;
    test_cond("model loads", model_load(path, &m) == 0);
    const char *text = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
                       "with her friends. One day she found a big red ball";
    int32_t *ids;
    int n;
    tok_encode(m->tok, text, strlen(text), 1, 1, &ids, &n);

    char tpath[1024];
    snprintf(tpath, sizeof tpath, "%s/run.skvtrace", test_tmpdir("run_trace"));
    probe_bus *bus;
    probe_bus_new(&bus);
    event_log live = {0};
    probe_sub *sub;
    trace_writer *w;
    probe_subscribe_callback(bus, PROBE_ALL, collect, &live, &sub);
    test_cond("trace writer opens", trace_writer_open(tpath, bus, &w) == 0);
    float *with = run(m, bus, ids, n);
    test_cond("traced run completes", with != NULL);
    test_cond("trace closes", trace_writer_close(w) == 0);
    probe_unsubscribe(sub);
    probe_bus_free(bus);

    int kinds[PROBE_KIND_COUNT] = {0};
    for (int i = 0; i < live.n; i++) kinds[live.ev[i]->kind]++;
    test_cond("the run emitted run, token, prefill, decode, step and span events",
              kinds[PROBE_RUN] == 1 && kinds[PROBE_TOKEN] > 0 && kinds[PROBE_PREFILL_LAYER] == 5 &&
                  kinds[PROBE_PREFILL_HEAD] == 20 && kinds[PROBE_DECODE_HEAD] == 12 * 5 * 4 &&
                  kinds[PROBE_STEP] == 12 && kinds[PROBE_SPAN] > 0);

    trace_reader *r;
    test_cond("trace opens", trace_open(tpath, &r) == 0);
    int i = 0, same = 1, rc;
    const probe_event *ev;
    while ((rc = trace_next(r, &ev)) == 1) {
        if (i >= live.n || !probe_event_equal(ev, live.ev[i])) same = 0;
        i++;
    }
    trace_close(r);
    char msg[200];
    snprintf(msg, sizeof msg, "replay yields the %d live events, identical and in order", live.n);
    test_cond(msg, rc == 0 && same && i == live.n);

    float *without = run(m, NULL, ids, n);
    test_cond("the same run without probes gives bitwise the same logits",
              without && !memcmp(with, without, sizeof(float) * m->cfg.vocab));
    for (int j = 0; j < live.n; j++) free(live.ev[j]);
    free(live.ev);
    free(with);
    free(without);
    free(ids);
    model_free(m);
    unlink(tpath);
    return test_report("test_run_trace");
}
