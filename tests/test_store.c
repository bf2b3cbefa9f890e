/* test_store: the probe store after a small synthetic ShadowKV run: shape
 * and counts, tokens, prefill lookups, selection lookups, hit rate per
 * layer, spans per step, needles, range checks, replacement, reset on a new
 * run, and draining from a ring. */
#include "probe.h"
#include "skv.h"
#include "store.h"
#include "testhelp.h"

#define L 3
#define H 2
#define STEPS 6
#define K 4
#define CHUNKS 20

/* The synthetic run: the selection of (step, layer, head) is chunks
 * (step + layer + head + j) % CHUNKS for j < K, hits are (step + layer + head) % (K + 1). */
static int hits_of(int s, int l, int h) { return s == 0 ? 0 : (s + l + h) % (K + 1); }

static void emit_run(probe_store *st) {
    probe_event run = { .kind = PROBE_RUN,
                        .run = { .model = "synthetic", .arch = "llama", .format = "gguf", .random_weights = 1,
                                 .n_layers = L, .n_heads = 4, .n_kv_heads = H, .head_dim = 16, .max_ctx = 8 * CHUNKS,
                                 .prompt_len = 100, .kv_policy = "shadowkv", .budget = 8 * K, .kv_opts = "rank=8 chunk=8 outliers=2 local=2", .backend = "cpu" } };
    test_cond("run event accepted", probe_store_add(st, &run) == 0);
    for (int i = 0; i < 5; i++) {
        char t[2] = { (char)('a' + i), 0 };
        probe_event tok = { .kind = PROBE_TOKEN, .token = { .pos = i, .id = 10 + i, .step = -1, .n_text = 1, .text = t } };
        probe_store_add(st, &tok);
    }
    for (int l = 0; l < L; l++) {
        float sv[12];
        for (int i = 0; i < 12; i++) sv[i] = 100.0f / (float)(i + 1) + (float)l;
        probe_event pl = { .kind = PROBE_PREFILL_LAYER,
                           .prefill_layer = { .layer = l, .seq_len = 100, .rank = 8, .n_sv = 12, .rel_err = 0.01f * (float)l,
                                              .t_svd = 0.5, .sv = sv } };
        probe_store_add(st, &pl);
        probe_store_add(st, &(probe_event){ .kind = PROBE_SPAN, .span = { .stream = 0, .layer = l, .step = -1, .t0 = l, .t1 = l + 0.5, .op = "svd" } });
        for (int h = 0; h < H; h++) {
            float cm[13];
            for (int c = 0; c < 13; c++) cm[c] = (float)(c + l + h) / 20.0f;
            int outl[2] = { l, 5 + h };
            probe_event ph = { .kind = PROBE_PREFILL_HEAD,
                               .prefill_head = { .layer = l, .head = h, .chunk = 8, .n_chunks = 13, .n_outliers = 2,
                                                 .n_landmarks = 9, .local_start = 11, .cos_min = cm, .outliers = outl } };
            probe_store_add(st, &ph);
        }
    }
}

static void emit_step(probe_store *st, int s) {
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            int sel[K];
            float sc[K];
            for (int j = 0; j < K; j++) {
                sel[j] = (s + l + h + j) % CHUNKS;
                sc[j] = 1.0f - 0.1f * (float)j;
            }
            int hits = hits_of(s, l, h);
            probe_event d = { .kind = PROBE_DECODE_HEAD,
                              .decode_head = { .step = s, .layer = l, .head = h, .n_sel = K, .hits = hits, .misses = K - hits,
                                               .sel = sel, .score = sc } };
            probe_store_add(st, &d);
            probe_store_add(st, &(probe_event){ .kind = PROBE_SPAN,
                                                .span = { .stream = h ? PROBE_STREAM_FETCH : PROBE_STREAM_REBUILD, .layer = l,
                                                          .step = s, .t0 = s + 0.1 * l, .t1 = s + 0.1 * l + 0.05,
                                                          .op = h ? "fetch_v" : "rebuild_k" } });
        }
    char t[3] = { 'x', (char)('0' + s), 0 };
    probe_store_add(st, &(probe_event){ .kind = PROBE_TOKEN, .token = { .pos = 5 + s, .id = 50 + s, .step = s, .n_text = 2, .text = t } });
    probe_store_add(st, &(probe_event){ .kind = PROBE_STEP, .step = { .step = s, .token = 50 + s, .seconds = 0.01, .kv_resident = 1000,
                                                                      .kv_offloaded = 5000, .hit_rate = 0.5f } });
}

static void test_synthetic(void) {
    probe_store *st;
    test_cond("store created", probe_store_new(&st) == 0);
    test_cond("empty store: no run, no steps", !probe_store_run(st) && probe_store_n_steps(st) == 0 &&
                                                   probe_store_n_tokens(st) == 0 && !probe_store_decode(st, 0, 0, 0));
    emit_run(st);
    for (int s = 0; s < STEPS; s++) {
        emit_step(st, s);
        test_cond("store grows one step at a time", probe_store_n_steps(st) == s + 1);
    }
    test_cond("shape from the run event", probe_store_n_layers(st) == L && probe_store_n_kv_heads(st) == H);
    test_cond("run meta kept", probe_store_run(st) && !strcmp(probe_store_run(st)->model, "synthetic") &&
                                   probe_pairs_get(probe_store_run(st)->kv_opts, "chunk", 0) == 8);
    test_cond("counts per kind", probe_store_count(st, PROBE_DECODE_HEAD) == STEPS * L * H &&
                                     probe_store_count(st, PROBE_TOKEN) == 5 + STEPS &&
                                     probe_store_count(st, PROBE_PREFILL_HEAD) == L * H);

    test_cond("tokens: prompt and generated", probe_store_n_tokens(st) == 5 + STEPS && probe_store_n_prompt(st) == 5);
    const probe_ev_token *t = probe_store_token(st, 2);
    test_cond("prompt token by index", t && t->id == 12 && t->step == -1 && !strcmp(t->text, "c"));
    t = probe_store_step_token(st, 3);
    test_cond("generated token by step", t && t->id == 53 && t->n_text == 2 && !strcmp(t->text, "x3"));
    test_cond("no token for a missing step", !probe_store_step_token(st, STEPS) && !probe_store_step_token(st, -1));

    const probe_ev_prefill_layer *pl = probe_store_prefill_layer(st, 2);
    test_cond("prefill layer: spectrum", pl && pl->n_sv == 12 && pl->sv[0] == 102.0f && pl->rank == 8);
    test_cond("prefill layer out of range: NULL", !probe_store_prefill_layer(st, L) && !probe_store_prefill_layer(st, -1));
    const probe_ev_prefill_head *ph = probe_store_prefill_head(st, 1, 1);
    test_cond("prefill head: cos-min, outliers, local start",
              ph && ph->n_chunks == 13 && ph->cos_min[3] == 5.0f / 20.0f && ph->outliers[1] == 6 && ph->local_start == 11);

    const probe_ev_decode_head *d = probe_store_decode(st, 4, 2, 1);
    test_cond("decode lookup", d && d->step == 4 && d->layer == 2 && d->head == 1 && d->sel[0] == 7 && d->n_sel == K);
    float score = 0;
    test_cond("selected chunk with its score", probe_store_selected(st, 4, 2, 1, 9, &score) == 1 && fabsf(score - 0.8f) < 1e-6f);
    test_cond("unselected chunk", probe_store_selected(st, 4, 2, 1, 0, NULL) == 0);
    test_cond("selection of a missing step: -1", probe_store_selected(st, STEPS, 0, 0, 0, NULL) == -1 &&
                                                     probe_store_selected(st, 0, L + 5, 0, 0, NULL) == -1);

    int ok = 1;
    float series[STEPS + 2];
    for (int l = 0; l < L; l++) {
        int n = probe_store_hit_rate_series(st, l, series, STEPS + 2);
        ok &= n == STEPS;
        for (int s = 0; s < STEPS; s++) {
            double want = 0;
            for (int h = 0; h < H; h++) want += (double)hits_of(s, l, h) / K;
            want /= H;
            ok &= fabs(probe_store_hit_rate(st, s, l) - want) < 1e-6 && fabs(series[s] - want) < 1e-6;
        }
        ok &= isnan(series[STEPS]) && isnan(series[STEPS + 1]);
    }
    test_cond("hit rate per layer over steps = mean over heads of hits/k", ok);
    test_cond("hit rate without data is NAN", isnan(probe_store_hit_rate(st, 99, 0)));

    int n;
    const probe_ev_span *sp = probe_store_spans(st, 3, &n);
    ok = sp && n == L * H;
    for (int i = 0; ok && i < n; i++) ok &= sp[i].step == 3 && sp[i].layer == i / H;
    test_cond("spans of a step, in arrival order", ok);
    test_cond("span op names kept", sp && !strcmp(sp[0].op, "rebuild_k") && !strcmp(sp[1].op, "fetch_v") &&
                                        sp[1].stream == PROBE_STREAM_FETCH);
    sp = probe_store_spans(st, -1, &n);
    test_cond("prefill spans at step -1", sp && n == L && !strcmp(sp[2].op, "svd") && sp[2].t1 == 2.5);
    test_cond("no spans for a missing step", !probe_store_spans(st, 77, &n) && n == 0);
    test_cond("step stats", probe_store_step(st, 5) && probe_store_step(st, 5)->kv_offloaded == 5000 && !probe_store_step(st, 6));

    /* Needles. */
    int chunks[2] = { 3, 4 }, rank[2] = { 1, 150 }, selv[2] = { 1, 0 };
    probe_event nd = { .kind = PROBE_NEEDLE, .needle = { .id = 1, .tok_begin = 24, .tok_end = 40, .n_chunks = 2, .step = 2, .layer = 1,
                                                         .head = 0, .mass_exact = 0.7f, .mass_sparse = 0.4f,
                                                         .chunks = chunks, .rank = rank, .selected = selv } };
    rank[1] = 2130706432;   /* a corrupt trace: the diagnosis would compute budgets from it */
    test_cond("a needle rank past the context is refused", probe_store_add(st, &nd) == SKV_ERANGE &&
                                                                strstr(skv_last_error(), "rank[1]"));
    rank[1] = 150;
    test_cond("needle accepted", probe_store_add(st, &nd) == 0);
    nd.needle.step = -1;
    nd.needle.mass_exact = 0.9f;
    probe_store_add(st, &nd);
    test_cond("needle ids", probe_store_n_needles(st) == 2 && !probe_store_needle_info(st, 0) && probe_store_needle_info(st, 1) &&
                                probe_store_needle_info(st, 1)->tok_begin == 24);
    const probe_ev_needle *ne = probe_store_needle(st, 1, 2, 1, 0);
    test_cond("needle lookup by step, layer, head", ne && ne->rank[1] == 150 && ne->selected[0] == 1 && ne->mass_sparse == 0.4f);
    ne = probe_store_needle(st, 1, -1, 1, 0);
    test_cond("needle at prefill (step -1)", ne && ne->mass_exact == 0.9f);
    test_cond("needle misses: NULL", !probe_store_needle(st, 1, 3, 1, 0) && !probe_store_needle(st, 5, 2, 1, 0));

    /* Range checks leave the store unchanged. */
    uint64_t before = probe_store_count(st, PROBE_DECODE_HEAD);
    int sel1[1] = { 0 };
    float sc1[1] = { 0 };
    probe_event bad = { .kind = PROBE_DECODE_HEAD, .decode_head = { .step = 1, .layer = L, .head = 0, .n_sel = 1, .sel = sel1, .score = sc1 } };
    test_cond("layer past the run's layers rejected", probe_store_add(st, &bad) == SKV_ERANGE &&
                                                           strstr(skv_last_error(), "layer") != NULL);
    bad.decode_head.layer = 0;
    bad.decode_head.head = -1;
    test_cond("negative head rejected", probe_store_add(st, &bad) == SKV_ERANGE);
    bad.decode_head.head = 0;
    sel1[0] = 8 * CHUNKS;   /* a block holds at least one position: ids 0..max_ctx-1 */
    test_cond("chunk id past the context rejected", probe_store_add(st, &bad) == SKV_ERANGE &&
                                                        strstr(skv_last_error(), "sel[0]") != NULL);
    bad.decode_head.step = -1;
    sel1[0] = 0;
    test_cond("decode step -1 rejected", probe_store_add(st, &bad) == SKV_ERANGE);
    test_cond("rejected events change nothing", probe_store_count(st, PROBE_DECODE_HEAD) == before &&
                                                    probe_store_decode(st, 1, 0, 0)->n_sel == K);

    /* A second event for the same (step, layer, head) replaces the first. */
    bad.decode_head.step = 1;
    bad.decode_head.hits = 1;
    test_cond("replacement accepted", probe_store_add(st, &bad) == 0);
    d = probe_store_decode(st, 1, 0, 0);
    test_cond("replacement visible", d && d->n_sel == 1 && d->hits == 1);

    /* A new run starts over. */
    emit_run(st);
    test_cond("a new run event resets the store", probe_store_n_steps(st) == 0 && !probe_store_decode(st, 0, 0, 0) &&
                                                      probe_store_n_tokens(st) == 5 && probe_store_n_needles(st) == 0 &&
                                                      probe_store_count(st, PROBE_RUN) == 1);
    probe_store_free(st);
}

/* Without a run event the shape follows the largest indexes seen. */
static void test_no_run(void) {
    probe_store *st;
    probe_store_new(&st);
    int sel[2] = { 100, 200 };
    float sc[2] = { 1, 2 };
    probe_event d = { .kind = PROBE_DECODE_HEAD, .decode_head = { .step = 0, .layer = 1, .head = 0, .n_sel = 2, .hits = 1, .sel = sel, .score = sc } };
    probe_store_add(st, &d);
    d.decode_head.layer = 0;
    d.decode_head.head = 3;
    d.decode_head.step = 40;
    probe_store_add(st, &d);
    d.decode_head.layer = 5;
    d.decode_head.head = 1;
    d.decode_head.step = 2;
    probe_store_add(st, &d);
    test_cond("grid grows in layers, heads and steps",
              probe_store_n_layers(st) == 6 && probe_store_n_kv_heads(st) == 4 && probe_store_n_steps(st) == 41);
    test_cond("earlier cells survive the growth", probe_store_decode(st, 0, 1, 0) && probe_store_decode(st, 40, 0, 3) &&
                                                     probe_store_decode(st, 2, 5, 1) && !probe_store_decode(st, 2, 5, 0));
    test_cond("hit rate over the heads that have data", probe_store_hit_rate(st, 40, 0) == 0.5f);
    d.decode_head.step = 1 << 21;
    test_cond("absurd step rejected", probe_store_add(st, &d) == SKV_ERANGE);
    probe_store_free(st);
}

static void test_drain(void) {
    probe_bus *b;
    probe_bus_new(&b);
    probe_sub *ring;
    probe_subscribe_ring(b, PROBE_ALL, 64, &ring);
    probe_store *st;
    probe_store_new(&st);
    for (int s = 0; s < 10; s++)
        probe_emit(b, &(probe_event){ .kind = PROBE_STEP, .step = { .step = s, .token = s * 3 } });
    test_cond("drain a bounded number", probe_store_drain(st, ring, 4) == 4 && probe_store_n_steps(st) == 4);
    test_cond("drain the rest", probe_store_drain(st, ring, -1) == 6 && probe_store_n_steps(st) == 10 &&
                                    probe_store_step(st, 9)->token == 27 && probe_ring_pending(ring) == 0);
    probe_emit(b, &(probe_event){ .kind = PROBE_STEP, .step = { .step = -3 } });
    probe_emit(b, &(probe_event){ .kind = PROBE_STEP, .step = { .step = 10 } });
    test_cond("a bad event is reported and dropped", probe_store_drain(st, ring, -1) == SKV_ERANGE && probe_ring_pending(ring) == 1);
    test_cond("draining goes on after it", probe_store_drain(st, ring, -1) == 1 && probe_store_n_steps(st) == 11);
    probe_store_free(st);
    probe_unsubscribe(ring);
    probe_bus_free(b);
}

int main(void) {
    test_synthetic();
    test_no_run();
    test_drain();
    return test_report("test_store");
}
