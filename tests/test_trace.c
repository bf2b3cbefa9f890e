/* test_trace: trace record and replay. A synthetic run with every event kind
 * (random sizes, arbitrary token bytes, odd float bit patterns) is recorded
 * through the bus; the replay must give back every event field by field and
 * array by array, and the store built from it must equal the one built live.
 * Then every kind of damage must give a one-line error naming the file, an
 * aborted writer must leave no file, and unknown kinds must be skipped. */
#include "probe.h"
#include "skv.h"
#include "store.h"
#include "testhelp.h"
#include "trace.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <errno.h>

/* ---- random synthetic run ------------------------------------------------ */

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static int rnd_int(int lo, int hi) { return lo + (int)(rnd() % (uint32_t)(hi - lo + 1)); }

/* Mostly ordinary floats, sometimes NaN with a payload, infinities, -0. */
static float rnd_float(void) {
    uint32_t bits;
    switch (rnd() % 16) {
    case 0: bits = 0x7fc00000u | (rnd() & 0x3fffff); break;
    case 1: bits = 0xff800000u; break;
    case 2: bits = 0x80000000u; break;
    default: {
        float f = (float)rnd() / 4294967296.0f * 10.0f - 5.0f;
        memcpy(&bits, &f, 4);
    }
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static double rnd_double(void) { return (double)rnd() / 1e6 + (double)rnd() * 1e-15; }

static const char *ops[] = { "svd", "landmarks", "cos_min", "fetch_v", "rebuild_k", "attend", "" };

typedef struct {
    int n_layers, n_heads, n_steps, n_chunks;
} run_shape;

/* Emits a whole synthetic ShadowKV run with every kind on bus. */
static void synth_run(probe_bus *bus, run_shape sh, int big) {
    int max_chunks = sh.n_chunks;
    probe_event run = { .kind = PROBE_RUN,
                        .run = { .model = "synthetic \"model\" ü", .arch = "llama", .format = "gguf", .random_weights = 1,
                                 .n_layers = sh.n_layers, .n_heads = sh.n_heads * 2, .n_kv_heads = sh.n_heads,
                                 .head_dim = 64, .max_ctx = 8 * max_chunks, .prompt_len = 8 * max_chunks - 40,
                                 .kv_policy = "shadowkv", .budget = 2048, .oracle = 1, .backend = "cpu",
                                 .kv_opts = "budget=2048 rank=160 chunk=8 outliers=48 local=4 plus=0" } };
    probe_emit(bus, &(probe_event){ .kind = PROBE_LANE, .lane = { .lane = 0, .n_lanes = 1, .policy = "shadowkv",
                                                                 .teacher = "shadowkv" } });
    probe_emit(bus, &run);
    int ag[2] = {1, 0};
    float ld[2] = {0.01f, 0.5f};
    probe_emit(bus, &(probe_event){ .kind = PROBE_NIAH, .niah = { .index = 0, .length = 1024, .depth = 50,
        .method = 1, .hit = 0, .prompt_len = 1024, .tok_begin = 100, .tok_end = 120, .detail = 1, .n_steps = 2,
        .policy = "shadowkv", .value = "4821735", .answer = " 4821", .top1_agree = ag, .logit_dist = ld } });
    char text[16];
    int prompt = big ? 16 : 30;
    for (int i = 0; i < prompt; i++) {
        int n = rnd_int(0, 12);
        for (int j = 0; j < n; j++) text[j] = (char)(j % 3 == 0 ? 0 : j % 3 == 1 ? 0xff : rnd());
        if (n >= 3) { text[1] = (char)0xc3; text[2] = (char)0x28; }   /* invalid UTF-8 */
        probe_emit(bus, &(probe_event){ .kind = PROBE_TOKEN, .token = { .pos = i, .id = rnd_int(0, 32000), .step = -1, .n_text = n, .text = text } });
    }
    float *fa = malloc(4096 * sizeof *fa);
    int *ia = malloc(4096 * sizeof *ia), *ib = malloc(4096 * sizeof *ib), *ic = malloc(4096 * sizeof *ic);
    for (int l = 0; l < sh.n_layers; l++) {
        int n_sv = big ? 1024 : rnd_int(0, 300);
        for (int i = 0; i < n_sv; i++) fa[i] = rnd_float();
        probe_emit(bus, &(probe_event){ .kind = PROBE_PREFILL_LAYER,
                                        .prefill_layer = { .layer = l, .seq_len = 8 * max_chunks, .rank = rnd_int(1, 200), .n_sv = n_sv,
                                                           .rel_err = rnd_float(), .t_svd = rnd_double(), .t_landmarks = rnd_double(),
                                                           .t_cosmin = rnd_double(), .t_outliers = rnd_double(), .t_offload = rnd_double(),
                                                           .sv = fa } });
        probe_emit_span(bus, PROBE_STREAM_COMPUTE, ops[rnd() % 7], l, -1, rnd_double(), rnd_double());
        for (int h = 0; h < sh.n_heads; h++) {
            int nc = rnd_int(0, max_chunks), no = rnd_int(0, 10);
            for (int i = 0; i < nc; i++) fa[i] = rnd_float();
            for (int i = 0; i < no; i++) ia[i] = rnd_int(0, max_chunks - 1);
            probe_emit(bus, &(probe_event){ .kind = PROBE_PREFILL_HEAD,
                                            .prefill_head = { .layer = l, .head = h, .chunk = 8, .n_chunks = nc, .n_outliers = no,
                                                              .n_landmarks = rnd_int(0, nc), .local_start = nc - 4, .cos_min = fa,
                                                              .outliers = ia } });
        }
    }
    for (int s = 0; s < sh.n_steps; s++) {
        for (int l = 0; l < sh.n_layers; l++)
            for (int h = 0; h < sh.n_heads; h++) {
                int k = big ? 256 : rnd_int(0, 40), oracle = big || rnd() % 2, nch = oracle ? (big ? 512 : rnd_int(0, max_chunks)) : 0;
                for (int i = 0; i < k; i++) {
                    ia[i] = rnd_int(0, max_chunks - 1);
                    fa[i] = rnd_float();
                }
                for (int i = 0; i < nch; i++) {
                    ib[i] = rnd_int(0, max_chunks - 1);
                    ic[i] = rnd_int(-1, max_chunks - 1);
                }
                int hits = k ? rnd_int(0, k) : 0;
                probe_emit(bus, &(probe_event){ .kind = PROBE_DECODE_HEAD,
                                                .decode_head = { .step = s, .layer = l, .head = h, .block = 8,
                                                                 .fetch_bytes = (uint64_t)rnd() * 3, .n_sel = k, .hits = hits,
                                                                 .misses = k - hits, .has_oracle = oracle, .recall = rnd_float(),
                                                                 .n_chunks = nch, .sel = ia, .score = fa, .rank_exact = ib,
                                                                 .rank_landmark = ic } });
                if (oracle) {
                    int ctx = 8 * max_chunks - 40 + s + 1, kept = rnd_int(0, ctx), qk[2] = {rnd_int(0, ctx), kept};
                    float qr[2] = {rnd_float(), rnd_float()}, qo[2] = {rnd_float(), rnd_float()};
                    float qe[2] = {rnd_float(), rnd_float()};
                    probe_emit(bus, &(probe_event){ .kind = PROBE_ORACLE,
                                                    .oracle = { .step = s, .layer = l, .head = h, .n_q = 2, .unit = 8,
                                                                .ctx = ctx, .n_kept = kept, .n_gen = rnd_int(0, kept),
                                                                .recall = rnd_float(), .overlap = rnd_float(),
                                                                .out_err = rnd_float(), .mass_kept = rnd_float(),
                                                                .needle_len = 20, .needle_kept = rnd_int(0, 20),
                                                                .needle_rank = rnd_int(-1, ctx - 1),
                                                                .needle_mass = rnd_float(), .q_kept = qk,
                                                                .q_recall = qr, .q_overlap = qo, .q_out_err = qe } });
                }
                if (oracle && h == 0) { /* a policy's own measure, with and without an array */
                    float mv[3] = {rnd_float(), rnd_float(), rnd_float()};
                    probe_emit(bus, &(probe_event){ .kind = PROBE_METRIC,
                                                    .metric = { .step = s, .layer = l, .head = s % 2 ? -1 : h,
                                                                .name = s % 2 ? "corrected" : "page_bound",
                                                                .value = rnd_float(), .n = s % 2 ? 0 : 3,
                                                                .vals = s % 2 ? NULL : mv } });
                }
                if (s % 3 == 1 && l == 0) {
                    int nn = rnd_int(0, 5);
                    for (int i = 0; i < nn; i++) {
                        ia[i] = rnd_int(0, max_chunks - 1);
                        ib[i] = rnd_int(-1, max_chunks - 1);
                        ic[i] = rnd() % 2;
                    }
                    probe_emit(bus, &(probe_event){ .kind = PROBE_NEEDLE,
                                                    .needle = { .id = rnd_int(0, 2), .tok_begin = 100, .tok_end = 120, .n_chunks = nn,
                                                                .step = s - 1, .layer = l, .head = h, .mass_exact = rnd_float(),
                                                                .mass_sparse = rnd_float(), .chunks = ia, .rank = ib, .selected = ic } });
                }
                probe_emit_span(bus, (int)(rnd() % 3), ops[rnd() % 7], l, s, rnd_double(), rnd_double());
            }
        int n = rnd_int(0, 8);
        for (int j = 0; j < n; j++) text[j] = (char)rnd();
        probe_emit(bus, &(probe_event){ .kind = PROBE_TOKEN, .token = { .pos = prompt + s, .id = rnd_int(0, 32000), .step = s, .n_text = n, .text = text } });
        probe_emit(bus, &(probe_event){ .kind = PROBE_STEP,
                                        .step = { .step = s, .token = rnd_int(0, 32000), .seconds = rnd_double(), .kv_resident = (uint64_t)rnd() << 20,
                                                  .kv_offloaded = ((uint64_t)rnd() << 32) | rnd(), .hit_rate = rnd_float(), .has_oracle = 1,
                                                  .top1_agree = (int)(rnd() % 2), .n_fetch = rnd_int(0, 100), .fetch_bytes = (uint64_t)rnd() * 77,
                                                  .kv_stats = "hits=3 misses=1 hit_rate=75" } });
    }
    free(fa);
    free(ia);
    free(ib);
    free(ic);
}

/* ---- an independent, hand-written comparison ------------------------------ */

#define EQ(f) ok &= memcmp(&a->f, &b->f, sizeof a->f) == 0
#define EQS(f) ok &= strcmp(a->f ? a->f : "", b->f ? b->f : "") == 0
#define EQA(f, n) ok &= (n) == 0 || memcmp(a->f, b->f, (size_t)(n) * sizeof *a->f) == 0

/* Field by field and array by array, written out rather than from the schema,
 * so a field missing from the schema would show up here. */
static int same_event(const probe_event *x, const probe_event *y) {
    if (x->kind != y->kind) return 0;
    int ok = 1;
    switch (x->kind) {
    case PROBE_RUN: {
        const probe_ev_run *a = &x->run, *b = &y->run;
        EQS(model); EQS(arch); EQS(format); EQ(random_weights); EQ(n_layers); EQ(n_heads); EQ(n_kv_heads);
        EQ(head_dim); EQ(max_ctx); EQ(prompt_len); EQS(kv_policy); EQ(budget); EQ(oracle); EQS(backend);
        EQS(kv_opts);
        break;
    }
    case PROBE_TOKEN: {
        const probe_ev_token *a = &x->token, *b = &y->token;
        EQ(pos); EQ(id); EQ(step); EQ(n_text);
        if (ok) EQA(text, a->n_text);
        break;
    }
    case PROBE_PREFILL_LAYER: {
        const probe_ev_prefill_layer *a = &x->prefill_layer, *b = &y->prefill_layer;
        EQ(layer); EQ(seq_len); EQ(rank); EQ(n_sv); EQ(rel_err); EQ(t_svd); EQ(t_landmarks); EQ(t_cosmin);
        EQ(t_outliers); EQ(t_offload);
        if (ok) EQA(sv, a->n_sv);
        break;
    }
    case PROBE_PREFILL_HEAD: {
        const probe_ev_prefill_head *a = &x->prefill_head, *b = &y->prefill_head;
        EQ(layer); EQ(head); EQ(chunk); EQ(n_chunks); EQ(n_outliers); EQ(n_landmarks); EQ(local_start);
        if (ok) { EQA(cos_min, a->n_chunks); EQA(outliers, a->n_outliers); }
        break;
    }
    case PROBE_DECODE_HEAD: {
        const probe_ev_decode_head *a = &x->decode_head, *b = &y->decode_head;
        EQ(step); EQ(layer); EQ(head); EQ(block); EQ(fetch_bytes); EQ(n_sel); EQ(hits); EQ(misses); EQ(has_oracle);
        EQ(recall); EQ(n_chunks);
        if (ok) { EQA(sel, a->n_sel); EQA(score, a->n_sel); EQA(rank_exact, a->n_chunks); EQA(rank_landmark, a->n_chunks); }
        break;
    }
    case PROBE_STEP: {
        const probe_ev_step *a = &x->step, *b = &y->step;
        EQ(step); EQ(token); EQ(seconds); EQ(kv_resident); EQ(kv_offloaded); EQ(hit_rate); EQ(has_oracle);
        EQ(top1_agree); EQ(n_fetch); EQ(fetch_bytes); EQS(kv_stats);
        break;
    }
    case PROBE_SPAN: {
        const probe_ev_span *a = &x->span, *b = &y->span;
        EQ(stream); EQ(layer); EQ(step); EQ(t0); EQ(t1); EQS(op);
        break;
    }
    case PROBE_NEEDLE: {
        const probe_ev_needle *a = &x->needle, *b = &y->needle;
        EQ(id); EQ(tok_begin); EQ(tok_end); EQ(n_chunks); EQ(step); EQ(layer); EQ(head); EQ(mass_exact); EQ(mass_sparse);
        if (ok) { EQA(chunks, a->n_chunks); EQA(rank, a->n_chunks); EQA(selected, a->n_chunks); }
        break;
    }
    case PROBE_NIAH: {
        const probe_ev_niah *a = &x->niah, *b = &y->niah;
        EQ(index); EQ(length); EQ(depth); EQ(run); EQ(method); EQ(hit); EQ(prompt_len); EQ(tok_begin); EQ(tok_end);
        EQ(detail); EQ(n_steps); EQS(policy); EQS(value); EQS(answer);
        if (ok) { EQA(top1_agree, a->n_steps); EQA(logit_dist, a->n_steps); }
        break;
    }
    case PROBE_LANE: {
        const probe_ev_lane *a = &x->lane, *b = &y->lane;
        EQ(lane); EQ(n_lanes); EQS(policy); EQS(teacher);
        break;
    }
    case PROBE_ORACLE: {
        const probe_ev_oracle *a = &x->oracle, *b = &y->oracle;
        EQ(step); EQ(layer); EQ(head); EQ(n_q); EQ(unit); EQ(ctx); EQ(n_kept); EQ(n_gen); EQ(recall); EQ(overlap);
        EQ(out_err); EQ(mass_kept); EQ(needle_len); EQ(needle_kept); EQ(needle_rank); EQ(needle_mass);
        if (ok) { EQA(q_kept, a->n_q); EQA(q_recall, a->n_q); EQA(q_overlap, a->n_q); EQA(q_out_err, a->n_q); }
        break;
    }
    case PROBE_METRIC: {
        const probe_ev_metric *a = &x->metric, *b = &y->metric;
        EQ(step); EQ(layer); EQ(head); EQ(value); EQ(n); EQS(name);
        if (ok) EQA(vals, a->n);
        break;
    }
    default:
        return 0;
    }
    return ok;
}

/* ---- capture: every emitted event, and a live store ------------------------ */

typedef struct {
    probe_event **ev;
    int n, cap;
} capture;

static void capture_cb(const probe_event *ev, void *user) {
    capture *c = user;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 256;
        c->ev = realloc(c->ev, (size_t)c->cap * sizeof *c->ev);
    }
    c->ev[c->n++] = probe_event_dup(ev);
}

static void capture_free(capture *c) {
    for (int i = 0; i < c->n; i++) free(c->ev[i]);
    free(c->ev);
}

static int store_errors;
static void store_cb(const probe_event *ev, void *user) {
    if (probe_store_add(user, ev)) {
        printf("  live store: %s\n", skv_last_error());
        store_errors++;
    }
}

/* Wraps a query result back into an event for comparison. */
#define WRAP(k, m, p) (&(probe_event){ .kind = (k), .m = *(p) })

static int same_or_null(const probe_event *a, const probe_event *b, const void *pa, const void *pb) {
    if (!pa || !pb) return !pa && !pb;
    return same_event(a, b);
}

/* Every query of the store API gives the same answer on a and b. */
static int stores_equal(const probe_store *a, const probe_store *b) {
    int ok = probe_store_n_steps(a) == probe_store_n_steps(b) && probe_store_n_layers(a) == probe_store_n_layers(b) &&
             probe_store_n_kv_heads(a) == probe_store_n_kv_heads(b) && probe_store_n_tokens(a) == probe_store_n_tokens(b) &&
             probe_store_n_prompt(a) == probe_store_n_prompt(b) && probe_store_n_needles(a) == probe_store_n_needles(b);
    for (int k = 0; k < PROBE_KIND_COUNT; k++) ok &= probe_store_count(a, (probe_kind)k) == probe_store_count(b, (probe_kind)k);
    if (!ok) return 0;
    ok &= probe_store_run(a) && probe_store_run(b) && same_event(WRAP(PROBE_RUN, run, probe_store_run(a)), WRAP(PROBE_RUN, run, probe_store_run(b)));
    for (int i = 0; i < probe_store_n_tokens(a); i++)
        ok &= same_event(WRAP(PROBE_TOKEN, token, probe_store_token(a, i)), WRAP(PROBE_TOKEN, token, probe_store_token(b, i)));
    int L = probe_store_n_layers(a), H = probe_store_n_kv_heads(a), S = probe_store_n_steps(a);
    for (int l = 0; l < L; l++) {
        const probe_ev_prefill_layer *pa = probe_store_prefill_layer(a, l), *pb = probe_store_prefill_layer(b, l);
        ok &= pa && pb && same_event(WRAP(PROBE_PREFILL_LAYER, prefill_layer, pa), WRAP(PROBE_PREFILL_LAYER, prefill_layer, pb));
        for (int h = 0; h < H; h++) {
            const probe_ev_prefill_head *ha = probe_store_prefill_head(a, l, h), *hb = probe_store_prefill_head(b, l, h);
            ok &= ha && hb && same_event(WRAP(PROBE_PREFILL_HEAD, prefill_head, ha), WRAP(PROBE_PREFILL_HEAD, prefill_head, hb));
        }
    }
    for (int s = -1; s <= S; s++) {
        for (int l = 0; l < L; l++) {
            float ra = probe_store_hit_rate(a, s, l), rb = probe_store_hit_rate(b, s, l);
            ok &= memcmp(&ra, &rb, sizeof ra) == 0;
            for (int h = 0; h < H; h++) {
                const probe_ev_decode_head *da = probe_store_decode(a, s, l, h), *db = probe_store_decode(b, s, l, h);
                ok &= same_or_null(da ? WRAP(PROBE_DECODE_HEAD, decode_head, da) : NULL,
                                   db ? WRAP(PROBE_DECODE_HEAD, decode_head, db) : NULL, da, db);
                for (int id = 0; id < probe_store_n_needles(a); id++) {
                    const probe_ev_needle *na = probe_store_needle(a, id, s, l, h), *nb = probe_store_needle(b, id, s, l, h);
                    ok &= same_or_null(na ? WRAP(PROBE_NEEDLE, needle, na) : NULL, nb ? WRAP(PROBE_NEEDLE, needle, nb) : NULL, na, nb);
                }
            }
        }
        const probe_ev_step *sa = probe_store_step(a, s), *sb = probe_store_step(b, s);
        ok &= same_or_null(sa ? WRAP(PROBE_STEP, step, sa) : NULL, sb ? WRAP(PROBE_STEP, step, sb) : NULL, sa, sb);
        const probe_ev_token *ta = probe_store_step_token(a, s), *tb = probe_store_step_token(b, s);
        ok &= same_or_null(ta ? WRAP(PROBE_TOKEN, token, ta) : NULL, tb ? WRAP(PROBE_TOKEN, token, tb) : NULL, ta, tb);
        int na, nb;
        const probe_ev_span *spa = probe_store_spans(a, s, &na), *spb = probe_store_spans(b, s, &nb);
        ok &= na == nb;
        for (int i = 0; ok && i < na; i++) ok &= same_event(WRAP(PROBE_SPAN, span, &spa[i]), WRAP(PROBE_SPAN, span, &spb[i]));
    }
    for (int id = 0; id < probe_store_n_needles(a); id++) {
        const probe_ev_needle *na = probe_store_needle_info(a, id), *nb = probe_store_needle_info(b, id);
        ok &= same_or_null(na ? WRAP(PROBE_NEEDLE, needle, na) : NULL, nb ? WRAP(PROBE_NEEDLE, needle, nb) : NULL, na, nb);
    }
    return ok;
}

/* ---- file helpers ----------------------------------------------------------- */

static unsigned char *slurp(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc(*n ? *n : 1);
    if (fread(p, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return p;
}

static void spit(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

static uint32_t rd32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void wr32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }

/* Recomputes the footer checksum so that a deliberate change gets past it. */
static void fix_crc(unsigned char *p, size_t n) { wr32(p + n - 4, trace_crc32(0, p, n - 4)); }

/* Recomputes the CRC of the record at pos (format 3), then the footer's. */
static void fix_rec(unsigned char *p, size_t n, size_t pos) {
    uint32_t len = rd32(p + pos + 4);
    wr32(p + pos + 8 + len, trace_crc32(0, p + pos, 8 + (size_t)len));
    fix_crc(p, n);
}

#define META_KIND 0x7FFFFFFFu

/* Offset of the first record of kind, or 0 (format 3: head, payload, crc). */
static size_t find_record(const unsigned char *p, size_t n, uint32_t kind) {
    size_t pos = 16;
    while (pos + 12 <= n) {
        if (rd32(p + pos) == kind) return pos;
        if (rd32(p + pos) == META_KIND) return 0;
        pos += 12 + rd32(p + pos + 4);
    }
    return 0;
}

/* 1 + the step of the last step record that ends at or before cut, or 0. */
static int steps_before(const unsigned char *p, size_t n, size_t cut) {
    size_t pos = 16;
    int steps = 0;
    while (pos + 12 <= n && rd32(p + pos) != META_KIND) {
        size_t end = pos + 12 + rd32(p + pos + 4);
        if (end > cut) break;
        if (rd32(p + pos) == PROBE_STEP) steps = (int)rd32(p + pos + 8) + 1;
        pos = end;
    }
    return steps;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

/* The damaged bytes at path must fail to load with an error naming path. */
static void expect_damage(const char *what, const char *path, const void *p, size_t n, int code) {
    spit(path, p, n);
    probe_store *st;
    probe_store_new(&st);
    skv_clear_error();
    int rc = trace_load_store(path, st);
    const char *msg = skv_last_error();
    int ok = rc < 0 && (code == 0 || rc == code) && strstr(msg, path) == msg && !strchr(msg, '\n');
    char buf[256];
    snprintf(buf, sizeof buf, "damage: %s", what);
    test_cond(buf, ok);
    printf("  -> %s\n", msg);
    probe_store_free(st);
}

/* ---- tests ----------------------------------------------------------------- */

static void test_crc(void) {
    test_cond("crc32(\"123456789\") = cbf43926", trace_crc32(0, "123456789", 9) == 0xCBF43926u);
    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 7 + 3);
    uint32_t whole = trace_crc32(0, buf, 1000), parts = trace_crc32(trace_crc32(trace_crc32(0, buf, 3), buf + 3, 500), buf + 503, 497);
    test_cond("crc32 in pieces = crc32 at once", whole == parts);
}

static void test_round_trip(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/run.skvtrace", dir);
    probe_bus *bus;
    probe_bus_new(&bus);
    capture cap = { 0 };
    probe_store *live;
    probe_store_new(&live);
    probe_sub *s_cap, *s_store;
    probe_subscribe_callback(bus, PROBE_ALL, capture_cb, &cap, &s_cap);
    probe_subscribe_callback(bus, PROBE_ALL, store_cb, live, &s_store);
    trace_writer *w;
    test_cond("writer opens", trace_writer_open(path, bus, &w) == 0);
    test_cond("the bus wants every kind while recording", probe_wants(bus, PROBE_RUN) && probe_wants(bus, PROBE_NEEDLE));
    synth_run(bus, (run_shape){ 3, 2, 9, 64 }, 0);
    struct stat sb;
    probe_store *mid;
    probe_store_new(&mid);
    test_cond("while recording, the trace is at its path and loads up to the last complete step, cut short",
              stat(path, &sb) == 0 && count_files(dir) == 1 && trace_load_store(path, mid) == 0 &&
                  probe_store_n_steps(mid) == 9 && strstr(trace_last_notice(), "cut short"));
    probe_store_free(mid);
    int rc = trace_writer_close(w);
    if (rc) printf("  %s\n", skv_last_error());
    test_cond("writer closes", rc == 0);
    test_cond("exactly the trace file in the directory", stat(path, &sb) == 0 && count_files(dir) == 1);
    test_cond("live store took every event", store_errors == 0);
    int kinds[PROBE_KIND_COUNT] = { 0 };
    for (int i = 0; i < cap.n; i++) kinds[cap.ev[i]->kind]++;
    int every = 1;
    for (int k = PROBE_RUN; k < PROBE_KIND_COUNT; k++) every &= kinds[k] > 0;
    test_cond("the synthetic run has every kind", every);
    printf("  %d events, %lld bytes\n", cap.n, (long long)sb.st_size);

    trace_reader *r;
    rc = trace_open(path, &r);
    test_cond("trace opens", rc == 0);
    if (!rc) {
        const probe_event *ev;
        int i = 0, same = 1, same_schema = 1;
        while ((rc = trace_next(r, &ev)) > 0) {
            if (i < cap.n) {
                same &= same_event(ev, cap.ev[i]);
                same_schema &= probe_event_equal(ev, cap.ev[i]);
            }
            i++;
        }
        test_cond("replay ends cleanly", rc == 0);
        test_cond("replay yields as many events as were emitted", i == cap.n && trace_n_records(r) == (uint64_t)cap.n);
        test_cond("every replayed event identical, field by field, array by array", same);
        test_cond("probe_event_equal agrees", same_schema);
        test_cond("trace_next after the end stays at the end", trace_next(r, &ev) == 0 && ev == NULL);
        const char *json = trace_meta_json(r);
        test_cond("metadata JSON has version, run and counts",
                  json && strstr(json, "\"format_version\":3") && strstr(json, "\"synthetic \\\"model\\\" ü\"") &&
                      strstr(json, "\"decode_head\":54") && strstr(json, "\"skv_version\""));
        trace_close(r);
    }

    probe_store *replay;
    probe_store_new(&replay);
    rc = trace_load_store(path, replay);
    if (rc) printf("  %s\n", skv_last_error());
    test_cond("trace loads into a store", rc == 0);
    test_cond("store from replay == store built live", stores_equal(live, replay));
    test_cond("and the comparison notices a difference", probe_store_count(replay, PROBE_STEP) > 0 &&
                                                           (probe_store_add(replay, cap.ev[cap.n - 1]), !stores_equal(live, replay)));

    char *info = NULL;
    size_t info_n = 0;
    FILE *mf = open_memstream(&info, &info_n);
    rc = trace_info(path, mf);
    fclose(mf);
    printf("%s", info);
    test_cond("trace info summarizes", rc == 0 && strstr(info, "format 3") && strstr(info, "synthetic") &&
                                           strstr(info, "shadowkv") && strstr(info, "decode_head") &&
                                           strstr(info, "steps      9") && strstr(info, "layers     3") && strstr(info, "bytes"));
    free(info);

    probe_store_free(replay);
    probe_store_free(live);
    probe_unsubscribe(s_cap);
    probe_unsubscribe(s_store);
    capture_free(&cap);
    probe_bus_free(bus);
}

static void test_damage(const char *dir) {
    char path[600], bad[600];
    snprintf(path, sizeof path, "%s/ok.skvtrace", dir);
    snprintf(bad, sizeof bad, "%s/bad.skvtrace", dir);
    probe_bus *bus;
    probe_bus_new(&bus);
    trace_writer *w;
    trace_writer_open(path, bus, &w);
    synth_run(bus, (run_shape){ 2, 2, 4, 32 }, 0);
    trace_writer_close(w);
    probe_bus_free(bus);

    size_t n = 0;
    unsigned char *orig = slurp(path, &n), *p = malloc(n + 64);
    size_t rec0 = 16;
    probe_store *st;
    probe_store_new(&st);
    test_cond("the undamaged file loads, with no notice", trace_load_store(path, st) == 0 && !*trace_last_notice());
    int full_steps = probe_store_n_steps(st);
    probe_store_free(st);

    /* Cut anywhere past the header (a run killed, a full disk): it loads up
     * to its last complete step and says it was cut short. */
    int all = 1, tried = 0;
    for (size_t c = rec0; c < n; c += n / 233 + 1) {
        spit(bad, orig, c);
        probe_store_new(&st);
        int rc = trace_load_store(bad, st), want = steps_before(orig, n, c);
        int ok = rc == 0 && strstr(trace_last_notice(), "cut short") && strstr(trace_last_notice(), bad);
        if (want > 0) ok &= probe_store_n_steps(st) == want && probe_store_count(st, PROBE_STEP) == (uint64_t)want;
        if (!ok) printf("  cut at %zu: rc %d, steps %d (want %d): %s %s\n", c, rc, probe_store_n_steps(st), want,
                        skv_last_error(), trace_last_notice());
        all &= ok;
        tried++;
        probe_store_free(st);
    }
    test_cond("cut short at every tried offset: loads to the last complete step, and says so", all && tried > 100);
    spit(bad, orig, n / 2);
    char *info = NULL;
    size_t info_n = 0;
    FILE *mf = open_memstream(&info, &info_n);
    int irc = trace_info(bad, mf);
    fclose(mf);
    test_cond("trace info on a trace cut short names the run and says it was cut short",
              irc == 0 && info && strstr(info, "cut short") && strstr(info, "shadowkv"));
    free(info);
    /* Cut inside the header: refused. */
    size_t cuts[] = { 1, 5, 8, 12, 15 };
    all = 1;
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        spit(bad, orig, cuts[i]);
        probe_store_new(&st);
        all &= trace_load_store(bad, st) < 0 && strstr(skv_last_error(), bad) == skv_last_error();
        probe_store_free(st);
    }
    test_cond("damage: cut inside the header is refused", all);

    /* 1-11 stray bytes between the header and the metadata record, with a
     * footer that is whole: too short to be a record, so the file is not a
     * whole run (it once passed as one and reading it ran past the map). */
    {
        uint64_t mo = 0;
        for (int i = 0; i < 8; i++) mo |= (uint64_t)orig[n - 28 + 16 + i] << (8 * i);
        size_t meta_n = n - 28 - (size_t)mo;
        unsigned char *q = malloc(16 + 11 + meta_n + 28);
        int stray_ok = q != NULL;
        for (size_t k = 1; q && k <= 11; k++) {
            size_t at = 0;
            memcpy(q, orig, 16);
            at = 16;
            memset(q + at, 0xA5, k);
            at += k;
            memcpy(q + at, orig + mo, meta_n);
            at += meta_n;
            memcpy(q + at, orig + n - 28, 28);
            for (int i = 0; i < 8; i++) q[at + 8 + i] = 0;                                   /* 0 records */
            for (int i = 0; i < 8; i++) q[at + 16 + i] = (unsigned char)((16 + k) >> (8 * i)); /* metadata offset */
            at += 28;
            fix_crc(q, at);
            spit(bad, q, at);
            probe_store_new(&st);
            int rc = trace_load_store(bad, st);
            stray_ok &= rc < 0 || (rc == 0 && strstr(trace_last_notice(), "cut short") && probe_store_count(st, PROBE_STEP) == 0);
            probe_store_free(st);
            char *inf = NULL;
            size_t inf_n = 0;
            FILE *f2 = open_memstream(&inf, &inf_n);
            int irc2 = trace_info(bad, f2);
            fclose(f2);
            stray_ok &= irc2 < 0 || (inf && strstr(inf, "cut short"));
            free(inf);
        }
        free(q);
        test_cond("stray bytes before the metadata record: not a whole run (cut short or refused), never read past "
                  "the file", stray_ok);
    }
    expect_damage("empty file", bad, orig, 0, SKV_EFORMAT);

    memcpy(p, orig, n);
    p[0] = 'X';
    expect_damage("bad magic", bad, p, n, SKV_EFORMAT);
    expect_damage("not a trace at all", bad, "hello, world\n", 13, SKV_EFORMAT);

    memcpy(p, orig, n);
    wr32(p + 8, TRACE_VERSION + 1);
    expect_damage("unknown (newer) version", bad, p, n, SKV_EUNSUPPORTED);
    memcpy(p, orig, n);
    wr32(p + 8, 1);
    expect_damage("version 1 (before the policy registry)", bad, p, n, SKV_EUNSUPPORTED);
    test_cond("a version 1 trace is refused with what to do", strstr(skv_last_error(), "version 1") &&
                                                                  strstr(skv_last_error(), "record the run again"));
    wr32(p + 8, 0);
    expect_damage("version 0", bad, p, n, SKV_EUNSUPPORTED);

    /* Bit flips anywhere past the header: what is intact before the damage
     * loads (up to its last complete step) with a notice, or the file is
     * refused with one line; never a crash. */
    all = 1;
    tried = 0;
    for (size_t i = rec0; i < n; i += n / 157 + 1) {
        memcpy(p, orig, n);
        p[i] ^= (unsigned char)(1u << (i % 8));
        spit(bad, p, n);
        probe_store_new(&st);
        skv_clear_error();
        int rc = trace_load_store(bad, st);
        int ok = rc == 0 ? *trace_last_notice() != 0 && probe_store_n_steps(st) <= full_steps
                         : strstr(skv_last_error(), bad) == skv_last_error() && !strchr(skv_last_error(), '\n');
        if (!ok) printf("  flip at %zu: rc %d: %s / %s\n", i, rc, skv_last_error(), trace_last_notice());
        all &= ok;
        tried++;
        probe_store_free(st);
    }
    test_cond("a flipped bit anywhere: the intact part loads with a notice, or a one-line refusal", all && tried > 100);
    size_t st0 = find_record(orig, n, PROBE_STEP);
    memcpy(p, orig, n);
    p[st0 + 9] ^= 0x10;
    spit(bad, p, n);
    probe_store_new(&st);
    test_cond("a damaged record is named in the notice", trace_load_store(bad, st) == 0 &&
                                                            strstr(trace_last_notice(), "damaged (checksum mismatch)"));
    probe_store_free(st);
    memcpy(p, orig, n);
    p[n - 3] ^= 1;
    spit(bad, p, n);
    probe_store_new(&st);
    test_cond("a damaged footer checksum: every step still loads, with a notice",
              trace_load_store(bad, st) == 0 && probe_store_n_steps(st) == full_steps &&
                  strstr(trace_last_notice(), "checksum"));
    probe_store_free(st);

    /* Changes that pass every checksum are checked for what they say. */
    size_t meta = find_record(orig, n, META_KIND);
    test_cond("found the metadata record", meta != 0);
    size_t mpos = 16;
    while (rd32(orig + mpos) != META_KIND) mpos += 12 + rd32(orig + mpos + 4);
    memcpy(p, orig, n);
    p[mpos + 8] = 'x';
    fix_rec(p, n, mpos);
    expect_damage("bad JSON", bad, p, n, SKV_EFORMAT);
    memcpy(p, orig, n);
    p[mpos + 8] = '[';
    p[mpos + 8 + rd32(orig + mpos + 4) - 1] = ']';
    fix_rec(p, n, mpos);
    expect_damage("JSON that is not an object", bad, p, n, SKV_EFORMAT);

    size_t dh = find_record(orig, n, PROBE_DECODE_HEAD);
    test_cond("found a decode_head record", dh != 0);
    size_t nsel = dh + 8 + 24;   /* step, layer, head, block, u64 fetch_bytes, then n_sel */
    uint32_t k = rd32(orig + nsel);
    memcpy(p, orig, n);
    wr32(p + nsel, k + 1);
    fix_rec(p, n, dh);
    expect_damage("array count one too large", bad, p, n, SKV_EFORMAT);
    memcpy(p, orig, n);
    wr32(p + nsel, 100000);
    fix_rec(p, n, dh);
    expect_damage("array count far past the record", bad, p, n, SKV_EFORMAT);
    memcpy(p, orig, n);
    wr32(p + nsel, (uint32_t)-5);
    fix_rec(p, n, dh);
    expect_damage("negative array count", bad, p, n, SKV_EFORMAT);
    if (k > 0) {
        memcpy(p, orig, n);
        wr32(p + nsel, k - 1);
        fix_rec(p, n, dh);
        expect_damage("array count one too small (bytes left over)", bad, p, n, SKV_EFORMAT);
    }
    size_t tok = find_record(orig, n, PROBE_TOKEN);
    memcpy(p, orig, n);
    wr32(p + tok + 8 + 12, 0x80000000u);
    fix_rec(p, n, tok);
    expect_damage("token text length huge", bad, p, n, SKV_EFORMAT);
    size_t run = find_record(orig, n, PROBE_RUN);
    memcpy(p, orig, n);
    wr32(p + run + 8 + 9 * 4, 0xffffff00u);   /* the model string's length, after 9 ints */
    fix_rec(p, n, run);
    expect_damage("string length past the record", bad, p, n, SKV_EFORMAT);

    /* The footer's record count disagrees with the file. */
    memcpy(p, orig, n);
    p[n - 20]++;
    fix_crc(p, n);
    expect_damage("footer record count wrong", bad, p, n, SKV_EFORMAT);
    memcpy(p, orig, n);
    memcpy(p + n, "garbage", 7);
    spit(bad, p, n + 7);
    probe_store_new(&st);
    test_cond("bytes after the footer: every step loads, with a notice",
              trace_load_store(bad, st) == 0 && probe_store_n_steps(st) == full_steps && *trace_last_notice());
    probe_store_free(st);

    /* Index fields the store cannot hold: a layer past the run's layers. */
    memcpy(p, orig, n);
    wr32(p + dh + 8 + 4, 1000);
    fix_rec(p, n, dh);
    expect_damage("layer index out of range", bad, p, n, SKV_ERANGE);

    char missing[600];
    snprintf(missing, sizeof missing, "%s/no-such.skvtrace", dir);
    probe_store_new(&st);
    test_cond("missing file: SKV_EIO naming it", trace_load_store(missing, st) == SKV_EIO && strstr(skv_last_error(), missing));
    test_cond("a directory: error naming it", trace_load_store(dir, st) < 0 && strstr(skv_last_error(), dir));
    memcpy(p, orig, n);
    p[mpos + 8] = 'x';
    fix_rec(p, n, mpos);
    test_cond("trace_info reports damage as an error", (spit(bad, p, n), trace_info(bad, stdout) == SKV_EFORMAT));
    probe_store_free(st);

    /* A newer writer's unknown kind is skipped by its length. */
    size_t ins = find_record(orig, n, PROBE_STEP);
    unsigned char unk[8 + 13 + 4] = { 0 };
    wr32(unk, 200);
    wr32(unk + 4, 13);
    memset(unk + 8, 0xAB, 13);
    wr32(unk + 21, trace_crc32(0, unk, 21));
    memcpy(p, orig, ins);
    memcpy(p + ins, unk, sizeof unk);
    memcpy(p + ins + sizeof unk, orig + ins, n - ins);
    size_t n2 = n + sizeof unk;
    p[n2 - 20]++;   /* one more record */
    wr32(p + n2 - 12, rd32(p + n2 - 12) + (uint32_t)sizeof unk);   /* the metadata record moved */
    fix_crc(p, n2);
    spit(bad, p, n2);
    probe_store *a, *b;
    probe_store_new(&a);
    probe_store_new(&b);
    int ra = trace_load_store(bad, a), rb = trace_load_store(path, b);
    test_cond("unknown kind skipped", ra == 0 && rb == 0 && stores_equal(a, b));
    trace_reader *r;
    if (trace_open(bad, &r) == 0) {
        const probe_event *ev;
        int cnt = 0;
        while (trace_next(r, &ev) > 0) cnt++;
        test_cond("reader yields only known kinds", (uint64_t)cnt + 1 == trace_n_records(r));
        trace_close(r);
    }
    info = NULL;
    info_n = 0;
    mf = open_memstream(&info, &info_n);
    trace_info(bad, mf);
    fclose(mf);
    test_cond("trace info counts unknown kinds", info && strstr(info, "unknown kinds"));
    free(info);
    probe_store_free(a);
    probe_store_free(b);
    free(orig);
    free(p);
    unlink(bad);
    unlink(path);
}

static void test_writer_edges(const char *dir) {
    char sub[600], path[700];
    snprintf(sub, sizeof sub, "%s/abort", dir);
    mkdir(sub, 0700);
    snprintf(path, sizeof path, "%s/aborted.skvtrace", sub);
    probe_bus *bus;
    probe_bus_new(&bus);
    trace_writer *w;
    test_cond("writer opens for the abort test", trace_writer_open(path, bus, &w) == 0);
    synth_run(bus, (run_shape){ 2, 1, 3, 16 }, 0);
    trace_writer_abort(w);
    struct stat sb;
    test_cond("aborted writer leaves no file (and no temporaries)", stat(path, &sb) != 0 && count_files(sub) == 0);
    test_cond("the bus is quiet again after the abort", !probe_wants(bus, PROBE_RUN));

    /* A writer fed by hand, with no events at all. */
    snprintf(path, sizeof path, "%s/empty.skvtrace", sub);
    trace_writer_open(path, NULL, &w);
    test_cond("empty trace closes", trace_writer_close(w) == 0);
    trace_reader *r;
    const probe_event *ev;
    test_cond("empty trace opens and ends at once", trace_open(path, &r) == 0 && trace_next(r, &ev) == 0 && trace_n_records(r) == 0);
    trace_close(r);
    probe_store *st;
    probe_store_new(&st);
    test_cond("empty trace loads into an empty store", trace_load_store(path, st) == 0 && probe_store_n_steps(st) == 0 && !probe_store_run(st));
    probe_store_free(st);
    unlink(path);

    /* Direct writes; a malformed event is an error that spoils the file. */
    snprintf(path, sizeof path, "%s/direct.skvtrace", sub);
    trace_writer_open(path, NULL, &w);
    int rc1 = trace_writer_write(w, &(probe_event){ .kind = PROBE_STEP, .step = { .step = 0 } });
    int rc2 = trace_writer_write(w, &(probe_event){ .kind = PROBE_PREFILL_LAYER, .prefill_layer = { .n_sv = 3, .sv = NULL } });
    int rc3 = trace_writer_close(w);
    test_cond("bad event: write fails, close reports it, no file", rc1 == 0 && rc2 == SKV_EINVAL && rc3 == SKV_EINVAL &&
                                                                     strstr(skv_last_error(), path) && stat(path, &sb) != 0 && count_files(sub) == 0);

    snprintf(path, sizeof path, "%s/no/such/dir/x.skvtrace", dir);
    test_cond("writer in a missing directory: SKV_EIO naming the path",
              trace_writer_open(path, bus, &w) == SKV_EIO && strstr(skv_last_error(), path) && !probe_wants(bus, PROBE_RUN));
    probe_bus_free(bus);
    rmdir(sub);
}

/* A ShadowKV-sized run (k = 256, oracle over 512 chunks) to see the costs. */
static void test_big(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/big.skvtrace", dir);
    probe_bus *bus;
    probe_bus_new(&bus);
    trace_writer *w;
    trace_writer_open(path, bus, &w);
    double t = skv_now();
    synth_run(bus, (run_shape){ 32, 8, 8, 512 }, 1);
    double t_rec = skv_now() - t;
    t = skv_now();
    int rc = trace_writer_close(w);
    double t_close = skv_now() - t;
    probe_bus_free(bus);
    struct stat sb;
    stat(path, &sb);
    probe_store *st;
    probe_store_new(&st);
    t = skv_now();
    rc |= trace_load_store(path, st);
    double t_load = skv_now() - t;
    test_cond("a 32-layer, 8-head, 8-step run records and loads", rc == 0 && probe_store_n_steps(st) == 8 && probe_store_decode(st, 7, 31, 7));
    printf("  big run: %.1f MiB, record %.3f s, close %.3f s, load into a store %.3f s\n", sb.st_size / 1048576.0, t_rec, t_close, t_load);
    probe_store_free(st);
    unlink(path);
}

/* A recording killed with SIGKILL at a random moment: the file at its path
 * loads up to the last step the writer finished, and says it was cut short. */
static void test_killed(const char *dir) {
    char path[600];
    int all = 1, steps_seen = 0;
    srand(12345);
    for (int trial = 0; trial < 6; trial++) {
        snprintf(path, sizeof path, "%s/killed-%d.skvtrace", dir, trial);
        unlink(path);
        pid_t pid = fork();
        if (pid == 0) {
            trace_writer *w;
            if (trace_writer_open(path, NULL, &w)) _exit(3);
            probe_event run = {.kind = PROBE_RUN, .run = {.model = "m", .arch = "llama", .format = "gguf", .n_layers = 2,
                                                          .n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .max_ctx = 1 << 20,
                                                          .kv_policy = "quest", .backend = "cpu", .kv_opts = ""}};
            trace_writer_write(w, &run);
            int sel[4] = {0, 1, 2, 3};
            float sc[4] = {1, 2, 3, 4};
            for (int s = 0;; s++) {
                for (int l = 0; l < 2; l++) {
                    probe_event d = {.kind = PROBE_DECODE_HEAD, .decode_head = {.step = s, .layer = l, .head = 0,
                                                                                .block = 16, .n_sel = 4, .sel = sel,
                                                                                .score = sc}};
                    trace_writer_write(w, &d);
                }
                probe_event st = {.kind = PROBE_STEP, .step = {.step = s, .token = s % 100, .kv_stats = "hits=1"}};
                trace_writer_write(w, &st);
                if (s % 64 == 63) usleep(1000);
            }
        }
        usleep(20000 + (useconds_t)(rand() % 150000));
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        probe_store *st;
        probe_store_new(&st);
        int rc = trace_load_store(path, st);
        int ok = WIFSIGNALED(status) && rc == 0 && strstr(trace_last_notice(), "cut short") &&
                 probe_store_count(st, PROBE_STEP) == (uint64_t)probe_store_n_steps(st) &&
                 probe_store_count(st, PROBE_DECODE_HEAD) == 2 * (uint64_t)probe_store_n_steps(st);
        if (!ok) printf("  trial %d: rc %d: %s %s\n", trial, rc, skv_last_error(), trace_last_notice());
        steps_seen += probe_store_n_steps(st) > 0;
        all &= ok;
        probe_store_free(st);
        unlink(path);
    }
    test_cond("a recording killed at random moments loads to its last complete step, every step whole", all);
    test_cond("and the killed recordings had steps in them", steps_seen >= 4);
}

/* A full disk (a file size limit here): the writer's error is reported at
 * close, and the trace stays, loading up to its last complete step. */
static void test_disk_full(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/full.skvtrace", dir);
    unlink(path);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {200000, 200000};
        setrlimit(RLIMIT_FSIZE, &rl);
        trace_writer *w;
        if (trace_writer_open(path, NULL, &w)) _exit(3);
        probe_event run = {.kind = PROBE_RUN, .run = {.model = "m", .arch = "llama", .format = "gguf", .n_layers = 2,
                                                      .n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .max_ctx = 1 << 20,
                                                      .kv_policy = "quest", .backend = "cpu", .kv_opts = ""}};
        trace_writer_write(w, &run);
        int sel[4] = {0, 1, 2, 3};
        float sc[4] = {1, 2, 3, 4};
        for (int s = 0; s < 100000; s++) {
            probe_event d = {.kind = PROBE_DECODE_HEAD, .decode_head = {.step = s, .layer = 0, .head = 0, .block = 16,
                                                                        .n_sel = 4, .sel = sel, .score = sc}};
            probe_event st = {.kind = PROBE_STEP, .step = {.step = s, .token = 1, .kv_stats = ""}};
            if (trace_writer_write(w, &d) || trace_writer_write(w, &st)) break;
        }
        int rc = trace_writer_close(w);
        _exit(rc == SKV_EIO && strstr(skv_last_error(), "kept") ? 0 : 4);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    probe_store *st;
    probe_store_new(&st);
    int rc = trace_load_store(path, st);
    test_cond("a full disk: close reports it, and the trace is kept, cut short at its last complete step",
              WIFEXITED(status) && WEXITSTATUS(status) == 0 && rc == 0 && strstr(trace_last_notice(), "cut short") &&
                  probe_store_n_steps(st) > 10 && probe_store_count(st, PROBE_STEP) == (uint64_t)probe_store_n_steps(st));
    probe_store_free(st);
    unlink(path);
}

/* A version 2 trace (metadata first, records without their own CRC) loads. */
static void test_v2(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/v2.skvtrace", dir);
    static const char json[] = "{\"format\":\"skv-trace\",\"format_version\":2}";
    unsigned char buf[512];
    size_t n = 0, jn = sizeof json - 1;
    memcpy(buf, "SKVTRACE", 8);
    wr32(buf + 8, 2);
    wr32(buf + 12, 0);
    wr32(buf + 16, (uint32_t)jn);
    wr32(buf + 20, 0);
    memcpy(buf + 24, json, jn);
    n = 24 + jn;
    /* one step record: i32 step, i32 token, f64 seconds, u64 x2, f32, i32 x3, u64, str */
    unsigned char rec[8 + 4 + 4 + 8 + 8 + 8 + 4 + 4 + 4 + 4 + 8 + 4] = {0};
    wr32(rec, PROBE_STEP);
    wr32(rec + 4, sizeof rec - 8);
    wr32(rec + 8, 0);
    wr32(rec + 12, 42);
    memcpy(buf + n, rec, sizeof rec);
    n += sizeof rec;
    memcpy(buf + n, "SKVTEND", 8);
    wr32(buf + n + 8, 1);
    wr32(buf + n + 12, 0);
    n += 16;
    wr32(buf + n, trace_crc32(0, buf, n));
    n += 4;
    spit(path, buf, n);
    probe_store *st;
    probe_store_new(&st);
    int rc = trace_load_store(path, st);
    test_cond("a version 2 trace still loads", rc == 0 && probe_store_n_steps(st) == 1 && probe_store_step(st, 0) &&
                                                   probe_store_step(st, 0)->token == 42);
    if (rc) printf("  %s\n", skv_last_error());
    probe_store_free(st);
    unlink(path);
}

int main(void) {
    const char *dir = test_tmpdir("trace");
    test_killed(dir);
    test_disk_full(dir);
    test_v2(dir);
    test_crc();
    test_round_trip(dir);
    test_damage(dir);
    test_writer_edges(dir);
    test_big(dir);
    char path[600];
    snprintf(path, sizeof path, "%s/run.skvtrace", dir);
    unlink(path);
    rmdir(dir);
    return test_report("test_trace");
}
