/* test_devpath: the device paths of the engine, run on the CPU.
 *
 * A device backend keeps the weights, activations and KV data in memory of
 * its own, and the forward pass, the dense policy and ShadowKV then take
 * their device paths: weights through weight_load, copies through copy and
 * copy2d, what the host needs downloaded, ShadowKV's offloaded values in
 * host_alloc's memory, and its decode stages queued in order from one
 * thread (decode_layer_dev). Here a copy of the CPU backend's table, at
 * another address, plays the device: every op is the CPU's, so each path
 * must give the CPU path's logits and ShadowKV's books (hits, misses,
 * bytes fetched) exactly. This checks the device paths' logic on any
 * machine; tests/gpu/ checks the CUDA kernels under them. */
#include "backend.h"
#include "forward.h"
#include "kv.h"
#include "kv_shadowkv.h"
#include "model.h"
#include "skv.h"
#include "testhelp.h"

#include <stdint.h>

static skv_backend devsim, devsim_host_books;

/* The fused books, counted: the device path with them must call them. */
static int n_fused_books;
static void books_counted(int h, int k, int n_cand, const int *sel, int *slot_id, int *where, unsigned *stamp,
                          unsigned *epoch, int *slot_of, int *miss, int *n_miss) {
    n_fused_books++;
    skv_backend_cpu.sk_books(h, k, n_cand, sel, slot_id, where, stamp, epoch, slot_of, miss, n_miss);
}

typedef struct {
    double worst_prefill, worst_decode;
    uint64_t hits, misses, fetch_bytes;
    int rc;
} run_out;

/* Prefill n random tokens then steps greedy tokens on backend be; logits
 * after each into lg (steps + 1, vocab). */
static void run(skv_model *m, const skv_backend *be, const char *policy, const int32_t *ids, int n, int steps,
                float *lg, run_out *o) {
    memset(o, 0, sizeof *o);
    forward_state f;
    kv_cache *kv = NULL;
    int V = m->cfg.vocab;
    if ((o->rc = forward_init(&f, m, be, 256))) return;
    kv_opts ko;
    kv_opts_default(&ko);
    snprintf(ko.policy, sizeof ko.policy, "%s", policy);
    ko.budget = 64;
    kv_opts_set_num(&ko, "rank", 16);
    kv_opts_set_num(&ko, "chunk", 8);
    kv_opts_set_num(&ko, "outliers", 3);
    kv_shape sh = {.n_layers = m->cfg.n_layers, .n_heads = m->cfg.n_heads, .n_kv_heads = m->cfg.n_kv_heads,
                   .head_dim = m->cfg.head_dim, .max_ctx = n + steps + 4, .rope = &f.rope, .be = be};
    if ((o->rc = kv_new(&ko, &sh, &kv))) { forward_free(&f); return; }
    for (int i = 0; i < n && !o->rc; i += 256)
        o->rc = forward_batch(&f, kv, ids + i, n - i < 256 ? n - i : 256, i);
    if (!o->rc) o->rc = kv->cls->end_prefill(kv);
    memcpy(lg, f.logits, sizeof(float) * V);
    for (int s = 0; s < steps && !o->rc; s++) {
        int best = 0;
        for (int i = 1; i < V; i++) if (f.logits[i] > f.logits[best]) best = i;
        kv->step = s;
        f.step = s;
        o->rc = forward_batch(&f, kv, &best, 1, n + s);
        memcpy(lg + (size_t)(s + 1) * V, f.logits, sizeof(float) * V);
    }
    kv_shadowkv_stats st;
    if (!strcmp(policy, "shadowkv") && !kv_shadowkv_stats_get(kv, &st)) {
        o->hits = st.hits;
        o->misses = st.misses;
        o->fetch_bytes = st.fetch_bytes;
    }
    kv_free(kv);
    forward_free(&f);
}

int main(void) {
    devsim = skv_backend_cpu;
    devsim.name = "devsim";
    devsim.sk_books = books_counted;
    /* the device path that keeps the books on the host (a backend without the fused ops) */
    devsim_host_books = skv_backend_cpu;
    devsim_host_books.name = "devsim-host-books";
    devsim_host_books.sk_books = NULL;
    devsim_host_books.sk_gather_misses = NULL;
    devsim_host_books.sk_rebuild_misses = NULL;
    const char *path = "build/default-model.gguf";
    skv_model *m;
    if (model_load(path, &m)) {
        char msg[512];
        snprintf(msg, sizeof msg, "device paths: %s not loadable (%s); make builds it", path, skv_last_error());
        test_skip(msg);
        return test_report("test_devpath");
    }
    int n = 700, steps = 12, V = m->cfg.vocab;
    int32_t *ids = malloc(sizeof(int32_t) * n);
    uint64_t x = 0x853c49e6748fea9bull;
    for (int i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)V);
    }
    float *a = malloc(sizeof(float) * (steps + 1) * V), *b = malloc(sizeof(float) * (steps + 1) * V);
    const char *pol[] = {"dense", "shadowkv"};
    for (int p = 0; p < 2; p++) {
        run_out oc, od;
        run(m, &skv_backend_cpu, pol[p], ids, n, steps, a, &oc);
        run(m, &devsim, pol[p], ids, n, steps, b, &od);
        char msg[256];
        snprintf(msg, sizeof msg, "%s: a session on a device-memory backend runs (rc %d, %s)", pol[p], od.rc,
                 od.rc ? skv_last_error() : "ok");
        test_cond(msg, oc.rc == 0 && od.rc == 0);
        snprintf(msg, sizeof msg, "%s: the device path's logits after the prompt and %d decode steps equal the CPU "
                 "path's bit for bit", pol[p], steps);
        test_cond(msg, !memcmp(a, b, sizeof(float) * (steps + 1) * V));
        if (p == 1) {
            snprintf(msg, sizeof msg, "shadowkv: the same books on both paths (hits %llu/%llu, misses %llu/%llu, "
                     "fetched %llu/%llu B)", (unsigned long long)oc.hits, (unsigned long long)od.hits,
                     (unsigned long long)oc.misses, (unsigned long long)od.misses,
                     (unsigned long long)oc.fetch_bytes, (unsigned long long)od.fetch_bytes);
            test_cond(msg, oc.misses > 0 && oc.hits == od.hits && oc.misses == od.misses &&
                      oc.fetch_bytes == od.fetch_bytes);
            snprintf(msg, sizeof msg, "shadowkv: the device path kept its books in the device's memory (fused books "
                     "called %d times: once a layer a step)", n_fused_books);
            test_cond(msg, n_fused_books == steps * m->cfg.n_layers);
            run_out oh;
            run(m, &devsim_host_books, pol[p], ids, n, steps, b, &oh);
            snprintf(msg, sizeof msg, "shadowkv: without the fused ops the device path keeps the books on the host, "
                     "with the same logits and books (hits %llu, misses %llu)", (unsigned long long)oh.hits,
                     (unsigned long long)oh.misses);
            test_cond(msg, oh.rc == 0 && !memcmp(a, b, sizeof(float) * (steps + 1) * V) && oh.hits == oc.hits &&
                      oh.misses == oc.misses && oh.fetch_bytes == oc.fetch_bytes);
        }
    }
    /* a batch on the device path: 3 ShadowKV sequences (their own caches,
     * prompts of different lengths) decoded together by forward_rows, one
     * pass of the weights a step, give the CPU path's batch bit for bit (the
     * same rows through the same ops), and each sequence's decode alone
     * within rounding (a GEMM of 3 rows sums in another order than 1) */
    {
        enum { B = 3 };
        int lens[B] = {300, 420, 520}, st = 6, same = 1, rc = 0;
        double worst = 0;
        forward_state fd, fc;
        kv_cache *kd[B] = {0}, *kcb[B] = {0}, *kc = NULL;
        float *alone = malloc(sizeof(float) * (size_t)B * st * V), *rows = malloc(sizeof(float) * (size_t)B * V);
        float *rows_c = malloc(sizeof(float) * (size_t)B * V);
        int32_t tok[B][8];
        rc = forward_init(&fd, m, &devsim, 600);
        if (!rc) rc = forward_init(&fc, m, &skv_backend_cpu, 600);
        kv_opts ko;
        kv_opts_default(&ko);
        snprintf(ko.policy, sizeof ko.policy, "shadowkv");
        ko.budget = 64;
        kv_opts_set_num(&ko, "rank", 16);
        kv_opts_set_num(&ko, "outliers", 3);
        for (int b = 0; b < B && !rc; b++) {
            kv_shape sh = {.n_layers = m->cfg.n_layers, .n_heads = m->cfg.n_heads, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .max_ctx = 600, .rope = &fc.rope, .be = &skv_backend_cpu};
            /* alone, on the CPU path: greedy tokens and their logits */
            if ((rc = kv_new(&ko, &sh, &kc))) break;
            rc = forward_batch(&fc, kc, ids + b * 50, lens[b], 0);
            if (!rc) rc = kc->cls->end_prefill(kc);
            for (int s = 0; s < st && !rc; s++) {
                int best = 0;
                for (int i = 1; i < V; i++) if (fc.logits[i] > fc.logits[best]) best = i;
                tok[b][s] = best;
                kc->step = s;
                fc.step = s;
                rc = forward_batch(&fc, kc, &tok[b][s], 1, lens[b] + s);
                memcpy(alone + ((size_t)s * B + b) * V, fc.logits, sizeof(float) * V);
            }
            kv_free(kc);
            kc = NULL;
            /* its caches for the two batches, prefilled alone */
            if (!rc) rc = kv_new(&ko, &sh, &kcb[b]);
            if (!rc) rc = forward_batch(&fc, kcb[b], ids + b * 50, lens[b], 0);
            if (!rc) rc = kcb[b]->cls->end_prefill(kcb[b]);
            sh.rope = &fd.rope;
            sh.be = &devsim;
            if (!rc) rc = kv_new(&ko, &sh, &kd[b]);
            if (!rc) rc = forward_batch(&fd, kd[b], ids + b * 50, lens[b], 0);
            if (!rc) rc = kd[b]->cls->end_prefill(kd[b]);
        }
        for (int s = 0; s < st && !rc; s++) {
            int32_t t[B];
            int pos[B];
            for (int b = 0; b < B; b++) {
                t[b] = tok[b][s];
                pos[b] = lens[b] + s;
                kd[b]->step = kcb[b]->step = s;
            }
            fd.step = fc.step = s;
            rc = forward_rows(&fd, kd, t, pos, B, rows);
            if (!rc) rc = forward_rows(&fc, kcb, t, pos, B, rows_c);
            same &= !rc && !memcmp(rows, rows_c, sizeof(float) * (size_t)B * V);
            for (int b = 0; b < B && !rc; b++) {
                double e = test_rel_l2(rows + (size_t)b * V, alone + ((size_t)s * B + b) * V, V);
                worst = e > worst ? e : worst;
            }
        }
        char msg[256];
        snprintf(msg, sizeof msg, "a batch of %d ShadowKV sequences on the device path (forward_rows, %d steps): the CPU "
                 "path's batch bit for bit (rc %d)", B, st, rc);
        test_cond(msg, rc == 0 && same);
        snprintf(msg, sizeof msg, "... and each sequence's decode alone within rel L2 %.1e (bound 1e-4)", worst);
        test_cond(msg, rc == 0 && worst <= 1e-4);
        for (int b = 0; b < B; b++) {
            kv_free(kd[b]);
            kv_free(kcb[b]);
        }
        forward_free(&fd);
        forward_free(&fc);
        free(alone);
        free(rows);
        free(rows_c);
    }
    /* the policies that read host memory are refused there, in one line */
    {
        forward_state f;
        forward_init(&f, m, &devsim, 16);
        kv_opts ko;
        kv_opts_default(&ko);
        snprintf(ko.policy, sizeof ko.policy, "quest");
        kv_shape sh = {.n_layers = m->cfg.n_layers, .n_heads = m->cfg.n_heads, .n_kv_heads = m->cfg.n_kv_heads,
                       .head_dim = m->cfg.head_dim, .max_ctx = 64, .rope = &f.rope, .be = &devsim};
        kv_cache *kv = NULL;
        int rc = kv_new(&ko, &sh, &kv);
        test_cond("a policy without a device path is refused on a device backend, naming --backend cpu",
                  rc == SKV_EUNSUPPORTED && strstr(skv_last_error(), "--backend cpu") && !kv);
        forward_free(&f);
    }
    free(a); free(b); free(ids);
    model_free(m);
    return test_report("test_devpath");
}
