/* test_probe: the event schema, event copies and the probe bus: ask
 * semantics, ring copy semantics, lossless ordered delivery across threads,
 * unsubscribing under a blocked producer, and the cost of a disabled probe. */
#include "probe.h"
#include "skv.h"
#include "testhelp.h"

#include <pthread.h>
#include <time.h>

/* Every count index points at an earlier int field; offsets fit the event. */
static int schema_ok(void) {
    for (int k = PROBE_RUN; k < PROBE_KIND_COUNT; k++) {
        int nf;
        const probe_field *fs = probe_schema((probe_kind)k, &nf);
        if (!fs || nf <= 0) return 0;
        for (int i = 0; i < nf; i++) {
            if (fs[i].off < offsetof(probe_event, run) || fs[i].off >= sizeof(probe_event)) return 0;
            int arr = fs[i].type == PROBE_F_BYTES || fs[i].type == PROBE_F_I32S || fs[i].type == PROBE_F_F32S;
            if (arr != (fs[i].count >= 0)) return 0;
            if (arr && (fs[i].count >= i || fs[fs[i].count].type != PROBE_F_I32)) return 0;
            for (int j = 0; j < i; j++)
                if (!strcmp(fs[i].name, fs[j].name) || fs[i].off == fs[j].off) return 0;
        }
    }
    return probe_schema(PROBE_NONE, NULL) == NULL && probe_schema(PROBE_KIND_COUNT, NULL) == NULL;
}

static void test_schema_and_copies(void) {
    test_cond("schema: counts precede their arrays, fields distinct", schema_ok());
    test_cond("kind names", !strcmp(probe_kind_name(PROBE_DECODE_HEAD), "decode_head") &&
                                !strcmp(probe_kind_name((probe_kind)99), "unknown"));
    test_cond("stream names", !strcmp(probe_stream_name(PROBE_STREAM_FETCH), "fetch"));

    int sel[3] = { 4, 9, 2 }, re[5] = { 0, 1, 2, 3, 4 }, rl[5] = { 4, 3, 2, 1, 0 };
    float sc[3] = { 0.5f, 0.25f, -1.0f };
    probe_event ev = { .kind = PROBE_DECODE_HEAD,
                       .decode_head = { .step = 3, .layer = 1, .head = 0, .n_sel = 3, .hits = 2, .misses = 1,
                                        .has_oracle = 1, .recall = 0.9f, .n_chunks = 5, .sel = sel, .score = sc,
                                        .rank_exact = re, .rank_landmark = rl } };
    probe_event *d = probe_event_dup(&ev);
    test_cond("dup equals the original", d && probe_event_equal(d, &ev));
    test_cond("dup owns its arrays", d && d->decode_head.sel != sel && d->decode_head.rank_landmark != rl);
    sc[1] = 0.3f;
    test_cond("a changed score makes them differ", d && !probe_event_equal(d, &ev));
    free(d);

    probe_event r1 = { .kind = PROBE_RUN, .run = { .model = NULL, .kv_policy = "dense" } };
    probe_event r2 = { .kind = PROBE_RUN, .run = { .model = "", .kv_policy = "dense" } };
    test_cond("NULL string equals \"\"", probe_event_equal(&r1, &r2));
    r2.run.kv_policy = "shadowkv";
    test_cond("different strings differ", !probe_event_equal(&r1, &r2));

    probe_event bad = { .kind = PROBE_PREFILL_HEAD, .prefill_head = { .n_chunks = 4, .cos_min = NULL } };
    test_cond("check: counted array NULL is rejected", probe_event_check(&bad) == SKV_EINVAL);
    bad.prefill_head.n_chunks = -1;
    test_cond("check: negative count is rejected", probe_event_check(&bad) == SKV_EINVAL);
    bad.prefill_head.n_chunks = 0;
    test_cond("check: empty arrays pass", probe_event_check(&bad) == 0);
    probe_event unk = { .kind = (probe_kind)77 };
    test_cond("check: unknown kind is rejected", probe_event_check(&unk) == SKV_EINVAL);
}

typedef struct {
    int n;
    pthread_t thread;
    probe_event *last;
} cb_state;

static void count_cb(const probe_event *ev, void *user) {
    cb_state *s = user;
    s->n++;
    s->thread = pthread_self();
    free(s->last);
    s->last = probe_event_dup(ev);
}

static void test_ask(void) {
    test_cond("NULL bus wants nothing", !probe_wants(NULL, PROBE_SPAN));
    probe_bus *b;
    test_cond("bus created", probe_bus_new(&b) == 0);
    int none = 1;
    for (int k = 0; k < PROBE_KIND_COUNT + 3; k++) none &= !probe_wants(b, (probe_kind)k);
    test_cond("a bus without subscribers wants nothing", none);
    probe_event span = { .kind = PROBE_SPAN, .span = { .op = "svd" } };
    test_cond("emit with nobody listening is a no-op", probe_emit(b, &span) == 0);

    probe_sub *ring, *cb;
    test_cond("ring subscribes", probe_subscribe_ring(b, PROBE_MASK(PROBE_SPAN), 4, &ring) == 0);
    test_cond("span wanted after a span subscriber", probe_wants(b, PROBE_SPAN));
    test_cond("token not wanted", !probe_wants(b, PROBE_TOKEN));
    cb_state st = { 0 };
    test_cond("callback subscribes",
              probe_subscribe_callback(b, PROBE_MASK(PROBE_TOKEN) | PROBE_MASK(PROBE_STEP), count_cb, &st, &cb) == 0);
    test_cond("token and step wanted, run not",
              probe_wants(b, PROBE_TOKEN) && probe_wants(b, PROBE_STEP) && !probe_wants(b, PROBE_RUN));

    probe_event tok = { .kind = PROBE_TOKEN, .token = { .pos = 7, .id = 42, .step = -1, .n_text = 2, .text = "hi" } };
    probe_emit(b, &tok);
    test_cond("callback runs on the emitting thread", st.n == 1 && pthread_equal(st.thread, pthread_self()));
    test_cond("callback sees the event", st.last && probe_event_equal(st.last, &tok));
    test_cond("the ring does not get kinds it did not ask for", probe_ring_pending(ring) == 0);
    probe_emit(b, &span);
    test_cond("the ring gets its kind", probe_ring_pending(ring) == 1 && st.n == 1);

    probe_unsubscribe(ring);
    test_cond("span no longer wanted after unsubscribe", !probe_wants(b, PROBE_SPAN) && probe_wants(b, PROBE_TOKEN));
    probe_unsubscribe(cb);
    test_cond("nothing wanted after the last unsubscribe", !probe_wants(b, PROBE_TOKEN) && !probe_wants(b, PROBE_STEP));
    probe_emit(b, &tok);
    test_cond("an unsubscribed callback is not called", st.n == 1);
    free(st.last);

    double t0 = probe_time(b);
    struct timespec ts = { 0, 2000000 };
    nanosleep(&ts, NULL);
    double t1 = probe_time(b);
    test_cond("probe_time is monotonic seconds since creation", t0 >= 0 && t1 - t0 >= 0.0015 && t1 < 60);
    test_cond("probe_time(NULL) is 0", probe_time(NULL) == 0.0);

    /* Subscriptions still attached when the bus is freed are freed with it. */
    probe_sub *left;
    probe_subscribe_ring(b, PROBE_ALL, 2, &left);
    probe_emit(b, &span);
    probe_bus_free(b);
}

static void test_ring_copy(void) {
    probe_bus *b;
    probe_bus_new(&b);
    probe_sub *ring;
    probe_subscribe_ring(b, PROBE_ALL, 3, &ring);
    test_cond("empty ring: peek NULL", probe_ring_peek(ring) == NULL);
    test_cond("empty ring: wait times out", probe_ring_wait(ring, 0.01) == NULL);

    float cos_min[6] = { 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f };
    int outl[2] = { 1, 4 };
    probe_event ph = { .kind = PROBE_PREFILL_HEAD,
                       .prefill_head = { .layer = 2, .head = 1, .chunk = 8, .n_chunks = 6, .n_outliers = 2,
                                         .n_landmarks = 4, .local_start = 5, .cos_min = cos_min, .outliers = outl } };
    probe_event *orig = probe_event_dup(&ph);
    probe_emit(b, &ph);
    char text[4] = { 'a', 0, (char)0xff, 'z' };
    probe_event tok = { .kind = PROBE_TOKEN, .token = { .pos = 1, .id = 5, .step = 0, .n_text = 4, .text = text } };
    probe_event *orig_tok = probe_event_dup(&tok);
    probe_emit(b, &tok);
    /* The producer reuses its buffers right away. */
    for (int i = 0; i < 6; i++) cos_min[i] = -9;
    outl[0] = 99;
    text[0] = 'X';
    text[3] = 0;

    const probe_event *e = probe_ring_peek(ring);
    test_cond("ring keeps order", e && e->kind == PROBE_PREFILL_HEAD);
    test_cond("ring copy unaffected by producer mutation", e && probe_event_equal(e, orig));
    test_cond("ring copy does not point at producer memory",
              e && e->prefill_head.cos_min != cos_min && e->prefill_head.outliers != outl);
    probe_ring_pop(ring);
    e = probe_ring_wait(ring, 1.0);
    test_cond("token bytes (NUL, 0xff) copied", e && e->kind == PROBE_TOKEN && probe_event_equal(e, orig_tok));
    test_cond("token copy NUL-terminated after n_text", e && e->token.text[4] == 0 && e->token.text[1] == 0);
    probe_ring_pop(ring);
    test_cond("ring empty after pops", probe_ring_pending(ring) == 0 && probe_ring_peek(ring) == NULL);
    probe_ring_pop(ring);   /* popping an empty ring is harmless */

    /* A slot whose previous event was larger keeps working for smaller ones and vice versa. */
    int big[1000];
    for (int i = 0; i < 1000; i++) big[i] = i;
    int ok = 1;
    for (int round = 0; round < 10; round++) {
        int n = round % 2 ? 1000 : round;
        probe_event nd = { .kind = PROBE_NEEDLE, .needle = { .id = round, .n_chunks = n, .chunks = big, .rank = big, .selected = big } };
        probe_emit(b, &nd);
        e = probe_ring_peek(ring);
        ok &= e && probe_event_equal(e, &nd);
        probe_ring_pop(ring);
    }
    test_cond("slots reused across event sizes", ok);
    free(orig);
    free(orig_tok);
    probe_unsubscribe(ring);
    probe_bus_free(b);
}

/* ---- threads ------------------------------------------------------------- */

#define N_EVENTS 100000

typedef struct {
    probe_bus *bus;
    int producer, n;
} prod_arg;

/* Emits n decode_head events whose arrays encode (producer, sequence). */
static void *producer(void *p) {
    prod_arg *a = p;
    int sel[64];
    float sc[64];
    for (int i = 0; i < a->n; i++) {
        int n = i % 61;
        for (int j = 0; j < n; j++) {
            sel[j] = i + j;
            sc[j] = (float)(i - j);
        }
        probe_event ev = { .kind = PROBE_DECODE_HEAD,
                           .decode_head = { .step = i, .head = a->producer, .n_sel = n, .sel = sel, .score = sc } };
        if (probe_wants(a->bus, PROBE_DECODE_HEAD)) probe_emit(a->bus, &ev);
        for (int j = 0; j < n; j++) sel[j] = -1;   /* scribble: the ring must have copied */
    }
    return NULL;
}

typedef struct {
    probe_sub *ring;
    int n_producers, total;
    int received, bad_order, bad_content;
} cons_arg;

static void *consumer(void *p) {
    cons_arg *a = p;
    int next[8] = { 0 };
    while (a->received < a->total) {
        const probe_event *e = probe_ring_wait(a->ring, 5.0);
        if (!e) break;
        const probe_ev_decode_head *d = &e->decode_head;
        int pr = d->head;
        if (pr < 0 || pr >= a->n_producers || d->step != next[pr]) a->bad_order++;
        else next[pr]++;
        if (d->n_sel != d->step % 61) a->bad_content++;
        for (int j = 0; j < d->n_sel; j++)
            if (d->sel[j] != d->step + j || d->score[j] != (float)(d->step - j)) {
                a->bad_content++;
                break;
            }
        probe_ring_pop(a->ring);
        a->received++;
    }
    return NULL;
}

static void test_threads(void) {
    probe_bus *b;
    probe_bus_new(&b);
    probe_sub *ring;
    probe_subscribe_ring(b, PROBE_MASK(PROBE_DECODE_HEAD), 8, &ring);
    prod_arg pa = { b, 0, N_EVENTS };
    cons_arg ca = { ring, 1, N_EVENTS, 0, 0, 0 };
    pthread_t tp, tc;
    double t = skv_now();
    pthread_create(&tc, NULL, consumer, &ca);
    pthread_create(&tp, NULL, producer, &pa);
    pthread_join(tp, NULL);
    pthread_join(tc, NULL);
    t = skv_now() - t;
    test_cond("100k events through an 8-slot ring: none lost", ca.received == N_EVENTS);
    test_cond("100k events: order kept", ca.bad_order == 0);
    test_cond("100k events: contents intact", ca.bad_content == 0);
    printf("  100k events in %.3f s (%.0f ns/event), producer stalled %llu times\n", t, t / N_EVENTS * 1e9,
           (unsigned long long)probe_ring_stalls(ring));

    /* Four producers into one small ring: per-producer order, nothing lost. */
    enum { NP = 4, PER = 20000 };
    prod_arg pas[NP];
    pthread_t tps[NP];
    cons_arg cm = { ring, NP, NP * PER, 0, 0, 0 };
    pthread_create(&tc, NULL, consumer, &cm);
    for (int i = 0; i < NP; i++) {
        pas[i] = (prod_arg){ b, i, PER };
        pthread_create(&tps[i], NULL, producer, &pas[i]);
    }
    for (int i = 0; i < NP; i++) pthread_join(tps[i], NULL);
    pthread_join(tc, NULL);
    test_cond("4 producers: none lost, each in order, intact",
              cm.received == NP * PER && cm.bad_order == 0 && cm.bad_content == 0);
    probe_unsubscribe(ring);
    probe_bus_free(b);
}

typedef struct {
    probe_bus *bus;
    volatile int done;
} blocked_arg;

static void *emit_three(void *p) {
    blocked_arg *a = p;
    probe_event ev = { .kind = PROBE_STEP, .step = { .step = 1 } };
    for (int i = 0; i < 3; i++) probe_emit(a->bus, &ev);
    __atomic_store_n(&a->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void test_unsubscribe_blocked(void) {
    probe_bus *b;
    probe_bus_new(&b);
    probe_sub *ring;
    probe_subscribe_ring(b, PROBE_ALL, 1, &ring);
    blocked_arg a = { b, 0 };
    pthread_t t;
    pthread_create(&t, NULL, emit_three, &a);
    struct timespec ts = { 0, 50000000 };
    nanosleep(&ts, NULL);
    test_cond("producer blocks on a full ring", !__atomic_load_n(&a.done, __ATOMIC_SEQ_CST) && probe_ring_pending(ring) == 1);
    probe_unsubscribe(ring);
    pthread_join(t, NULL);
    test_cond("unsubscribe releases a blocked producer", __atomic_load_n(&a.done, __ATOMIC_SEQ_CST));
    probe_bus_free(b);
}

static void test_cost(void) {
    probe_bus *b;
    probe_bus_new(&b);
    probe_sub *ring;
    probe_subscribe_ring(b, PROBE_MASK(PROBE_RUN), 1, &ring);   /* subscribed, but not to spans */
    const long N = 200000000L;
    volatile long sink = 0;
    probe_bus *volatile vb = b;
    probe_bus *bus = vb;
    double t = skv_now();
    for (long i = 0; i < N; i++)
        if (probe_wants(bus, PROBE_SPAN)) sink++;
    double t_off = skv_now() - t;
    probe_bus *volatile vnull = NULL;
    probe_bus *nb = vnull;
    t = skv_now();
    for (long i = 0; i < N; i++)
        if (probe_wants(nb, PROBE_SPAN)) sink++;
    double t_null = skv_now() - t;
    printf("  probe_wants, kind not subscribed: %.2f ns/call; NULL bus: %.2f ns/call (%ld calls each)\n",
           t_off / N * 1e9, t_null / N * 1e9, N);
    test_cond("disabled probes never fire", sink == 0);
    probe_unsubscribe(ring);
    probe_bus_free(b);
}

int main(void) {
    test_schema_and_copies();
    test_ask();
    test_ring_copy();
    test_threads();
    test_unsubscribe_blocked();
    test_cost();
    return test_report("test_probe");
}
