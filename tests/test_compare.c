/* test_compare.c: compare mode.
 *  - the list parser: names, repeats, trailing commas, too many;
 *  - lockstep: on the demo model (samples/), every lane gets the same prompt
 *    and generated tokens, the teacher is dense when listed, and a lane that
 *    is dense itself always agrees with the teacher;
 *  - the event stream: lane events route each lane's events to its own store,
 *    live and through a trace; a single-store reader takes lane 0;
 *  - replay without the model: the compare view and a stacked view draw from
 *    the trace alone and name every policy. */
#include "canvas.h"
#include "compare.h"
#include "lanes.h"
#include "model.h"
#include "skv.h"
#include "testhelp.h"
#include "tok.h"
#include "trace.h"
#include "view.h"

#include <unistd.h>

static void test_parse(void) {
    char names[COMPARE_MAX][32];
    test_cond("a list parses in order", compare_parse("dense,quest,shadowkv", names, COMPARE_MAX) == 3 &&
                                            !strcmp(names[1], "quest") && !strcmp(names[2], "shadowkv"));
    test_cond("an unknown policy is refused", compare_parse("dense,bogus", names, COMPARE_MAX) < 0 &&
                                                  strstr(skv_last_error(), "bogus"));
    test_cond("a repeated policy is refused", compare_parse("quest,quest", names, COMPARE_MAX) < 0 &&
                                                  strstr(skv_last_error(), "twice"));
    test_cond("a trailing comma is refused", compare_parse("quest,", names, COMPARE_MAX) < 0);
    test_cond("an empty item is refused", compare_parse("quest,,dense", names, COMPARE_MAX) < 0);
    test_cond("more than the maximum is refused", compare_parse("dense,quest", names, 1) < 0 &&
                                                      strstr(skv_last_error(), "at most"));
}

static void test_lanes_router(void) {
    probe_lanes *L = NULL;
    test_cond("lanes start with one store", probe_lanes_new(&L) == 0 && probe_lanes_count(L) == 1);
    if (!L) return;
    probe_event bad = {.kind = PROBE_LANE,
                       .lane = {.lane = PROBE_MAX_LANES, .n_lanes = PROBE_MAX_LANES + 1, .policy = "x"}};
    test_cond("a lane past the maximum is refused", probe_lanes_add(L, &bad) == SKV_ERANGE);
    probe_event l1 = {.kind = PROBE_LANE, .lane = {.lane = 1, .n_lanes = 2, .policy = "quest", .teacher = "dense"}};
    probe_event run = {.kind = PROBE_RUN, .run = {.model = "m", .n_layers = 2, .n_kv_heads = 1, .max_ctx = 64,
                                                  .kv_policy = "quest"}};
    int rc = probe_lanes_add(L, &l1);
    if (!rc) rc = probe_lanes_add(L, &run);
    test_cond("a lane event routes what follows to its store", rc == 0 && probe_lanes_count(L) == 2 &&
                                                                   probe_store_run(probe_lanes_store(L, 1)) &&
                                                                   !probe_store_run(probe_lanes_store(L, 0)) &&
                                                                   !strcmp(probe_lanes_policy(L, 1), "quest") &&
                                                                   !strcmp(probe_lanes_teacher(L), "dense"));
    probe_lanes_free(L);
}

typedef struct {
    int ids[COMPARE_MAX][64];
    int n[COMPARE_MAX];
    int lane;
} tok_log;

static void on_event(const probe_event *ev, void *user) {
    tok_log *t = user;
    if (ev->kind == PROBE_LANE) t->lane = ev->lane.lane;
    else if (ev->kind == PROBE_TOKEN && ev->token.step >= 0 && t->n[t->lane] < 64)
        t->ids[t->lane][t->n[t->lane]++] = ev->token.id;
}

static void test_lockstep(const char *dir) {
    const char *path = "samples/model/skv-demo.gguf";
    if (access(path, R_OK)) {
        test_skip("samples/model/skv-demo.gguf is missing (run from the project root)");
        return;
    }
    skv_model *m = NULL;
    if (model_load(path, &m)) {
        test_cond("the demo model loads", 0);
        return;
    }
    char trace[600];
    snprintf(trace, sizeof trace, "%s/compare.skvt", dir);
    probe_bus *bus = NULL;
    probe_sub *sub = NULL;
    trace_writer *tw = NULL;
    tok_log log = {0};
    int rc = probe_bus_new(&bus);
    if (!rc) rc = probe_subscribe_callback(bus, PROBE_MASK(PROBE_LANE) | PROBE_MASK(PROBE_TOKEN), on_event, &log, &sub);
    if (!rc) rc = trace_writer_open(trace, bus, &tw);
    session_opts so;
    session_opts_default(&so);
    so.ctx = 512;
    so.bus = bus;
    so.kv.budget = 32;
    so.kv.oracle = 1;
    char names[COMPARE_MAX][32];
    int n = compare_parse("quest,shadowkv,dense", names, COMPARE_MAX);
    compare_run *c = NULL;
    if (!rc) rc = compare_new(m, &so, names, n, &c);
    test_cond("three policies in lockstep; dense, listed last, is the teacher", rc == 0 && c && c->n == 3 &&
                                                                                   c->teacher == 2);
    int32_t ids[300];
    for (int i = 0; i < 300; i++) ids[i] = 5 + (i * 37) % 200;
    if (!rc) rc = compare_prefill(c, ids, 300, NULL, NULL);
    for (int s = 0; s < 6 && !rc; s++) rc = compare_decode(c, compare_next(c));
    test_cond("it prefills and decodes 6 steps", rc == 0 && c->steps == 6);
    int same = rc == 0 && log.n[0] == 6;
    for (int l = 1; l < 3 && same; l++) same = log.n[l] == 6 && !memcmp(log.ids[l], log.ids[0], sizeof log.ids[0]);
    test_cond("every lane was fed the same tokens", same);
    test_cond("the teacher agrees with itself at every step", rc == 0 && c->agree[2] == 6);
    if (sub) probe_unsubscribe(sub);
    compare_free(c);
    if (tw) rc = trace_writer_close(tw) || rc;
    probe_bus_free(bus);
    model_free(m);
    test_cond("the compare trace is written", rc == 0);
    if (rc) return;

    /* replay without the model */
    probe_lanes *L = NULL;
    rc = probe_lanes_new(&L) || trace_load_lanes(trace, L);
    test_cond("the trace loads into one store per lane", rc == 0 && probe_lanes_count(L) == 3 &&
                                                             !strcmp(probe_lanes_policy(L, 0), "quest") &&
                                                             !strcmp(probe_lanes_policy(L, 2), "dense") &&
                                                             !strcmp(probe_lanes_teacher(L), "dense"));
    int steps = 1, oracle = 1;
    for (int i = 0; rc == 0 && i < 3; i++) {
        steps &= probe_store_n_steps(probe_lanes_store(L, i)) == 6;
        const probe_ev_run *r = probe_store_run(probe_lanes_store(L, i));
        steps &= r && !strcmp(r->kv_policy, probe_lanes_policy(L, i));
    }
    oracle = rc == 0 && probe_store_count(probe_lanes_store(L, 0), PROBE_ORACLE) > 0 &&
             probe_store_count(probe_lanes_store(L, 2), PROBE_ORACLE) == 0;
    test_cond("each lane's store holds its own run, steps and selection events", rc == 0 && steps &&
                                                                                     probe_store_count(probe_lanes_store(L, 0), PROBE_DECODE_HEAD) > 0);
    test_cond("the sparse lanes carry the oracle's events, dense none", oracle);
    probe_store *one = NULL;
    int rc1 = probe_store_new(&one) || trace_load_store(trace, one);
    test_cond("a single-store reader takes lane 0", rc1 == 0 && probe_store_run(one) &&
                                                       !strcmp(probe_store_run(one)->kv_policy, "quest") &&
                                                       probe_store_n_steps(one) == 6);
    probe_store_free(one);
    if (rc == 0) {
        const probe_store *sts[3];
        const char *nm[3];
        for (int i = 0; i < 3; i++) {
            sts[i] = probe_lanes_store(L, i);
            nm[i] = probe_lanes_policy(L, i);
        }
        view_cursor cur;
        view_cursor_init(&cur);
        cur.layer = 2;
        canvas *cv = NULL;
        char *t = NULL;
        int drc = -99;
        if (!canvas_cells_new(&cv, 120, 40, 0)) {
            drc = view_draw_lanes(view_find("compare"), cv, (canvas_rect){0, 0, 120, 40}, sts, nm, 3, &cur, NULL);
            t = canvas_cells_text(cv);
        }
        test_cond("the compare view draws every policy from the trace alone", drc == 0 && t && strstr(t, "quest") &&
                                                                              strstr(t, "shadowkv") && strstr(t, "dense") &&
                                                                              strstr(t, "%"));
        free(t);
        t = NULL;
        canvas_clear(cv);
        drc = view_draw_lanes(view_find("selection"), cv, (canvas_rect){0, 0, 120, 40}, sts, nm, 3, &cur, NULL);
        t = canvas_cells_text(cv);
        test_cond("a view stacks one band per policy, each named", drc == 0 && t && strstr(t, "quest") &&
                                                                   strstr(t, "shadowkv") && strstr(t, "selected"));
        free(t);
        /* one policy's trace: the compare view's own draw, scored by the
         * oracle for a sparse policy; for dense it says there is nothing to
         * score rather than asking for --oracle, which the run had */
        const view_class *vcmp = view_find("compare");
        canvas_clear(cv);
        drc = vcmp->draw(cv, (canvas_rect){0, 0, 120, 40}, sts[0], &cur, NULL);
        t = canvas_cells_text(cv);
        test_cond("the compare view draws one sparse policy alone, with the oracle's means",
                  drc == 0 && t && strstr(t, "quest") && strstr(t, "oracle means") && strstr(t, "%") &&
                      !strstr(t, "run with --oracle"));
        free(t);
        canvas_clear(cv);
        drc = vcmp->draw(cv, (canvas_rect){0, 0, 120, 40}, sts[2], &cur, NULL);
        t = canvas_cells_text(cv);
        test_cond("the compare view of dense alone says dense is exact, not \"run with --oracle\"",
                  drc == 0 && t && strstr(t, "dense is exact") && !strstr(t, "run with --oracle"));
        free(t);
        canvas_free(cv);
    }
    probe_lanes_free(L);
    unlink(trace);
}

int main(void) {
    test_parse();
    test_lanes_router();
    const char *dir = test_tmpdir("compare");
    test_lockstep(dir);
    if (dir) rmdir(dir);
    return test_report("test_compare");
}
