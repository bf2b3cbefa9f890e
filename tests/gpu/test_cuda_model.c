/* test_cuda_model.c: the whole model on the GPU against the CPU reference.
 *
 * The same prompt runs through a dense session on the CPU and on CUDA; the
 * last prompt position's logits and then every decode step's (both fed the
 * CPU's greedy tokens) must agree within the BF16 bound (the device keeps
 * weights and GEMM inputs in BF16), and the greedy tokens must agree while
 * the CPU's top two logits are apart by more than that error. The model is
 * SKV_GPU_MODEL, else ../shared's mini-smollm-f32, else build/default-model.gguf
 * (random weights, made by make). Skips with one line without a device. */
#include "kv_shadowkv.h"
#include "model.h"
#include "sampler.h"
#include "session.h"
#include "skv.h"
#include "testhelp.h"

#include <stdint.h>

static const char *pick_model(void) {
    const char *m = getenv("SKV_GPU_MODEL");
    if (m && *m) return m;
    if ((m = test_shared("models/mini-smollm-f32.gguf"))) return m;
    return "build/default-model.gguf";
}

int main(void) {
    const skv_backend *cu = skv_backend_find("cuda");
    skv_clear_error();
    char why[256] = "";
    if (!cu) {
        test_skip("cuda model: this build has no CUDA backend (nvcc was not found)");
        return test_report("test_cuda_model");
    }
    if (!cu->available(why, sizeof why)) {
        char msg[320];
        snprintf(msg, sizeof msg, "cuda model: %s (tests/gpu/run.sh runs it on a device)", why);
        test_skip(msg);
        return test_report("test_cuda_model");
    }
    const char *path = pick_model();
    skv_model *m;
    if (model_load(path, &m)) {
        char msg[512];
        snprintf(msg, sizeof msg, "cuda model: cannot load %s: %s", path, skv_last_error());
        test_skip(msg);
        return test_report("test_cuda_model");
    }
    int V = m->cfg.vocab, np = 300 < m->cfg.ctx_train - 40 ? 300 : m->cfg.ctx_train - 40, steps = 24;
    int32_t *ids = malloc(sizeof(int32_t) * np);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < np; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        ids[i] = (int32_t)(2 + x % (uint64_t)(V - 2));
    }
    session_opts o;
    session_opts_default(&o);
    o.ctx = np + steps + 8;
    o.batch = 128; /* several prefill batches */
    skv_session *sc = NULL, *sg = NULL;
    snprintf(o.backend, sizeof o.backend, "cpu");
    int rc = session_new(m, &o, &sc);
    snprintf(o.backend, sizeof o.backend, "cuda");
    if (!rc) rc = session_new(m, &o, &sg);
    test_cond("a dense session on cpu and on cuda", rc == 0 && sg && sg->be == cu);
    if (rc) { model_free(m); free(ids); return test_report("test_cuda_model"); }
    session_prefill(sc, ids, np, NULL, NULL);
    session_prefill(sg, ids, np, NULL, NULL);
    double worst = test_rel_l2(session_logits(sg), session_logits(sc), V);
    int agree = 0, decided = 0;
    for (int s = 0; s < steps; s++) {
        const float *lc = session_logits(sc), *lg = session_logits(sg);
        int tc = sampler_argmax(lc, V), tg = sampler_argmax(lg, V);
        float first = lc[tc], second = -INFINITY;
        for (int i = 0; i < V; i++) if (i != tc && lc[i] > second) second = lc[i];
        double e = test_rel_l2(lg, lc, V), norm = 0;
        for (int i = 0; i < V; i++) norm += (double)lc[i] * lc[i];
        if (e > worst) worst = e;
        if (first - second > 4 * e * sqrt(norm / V)) { decided++; agree += tc == tg; }
        session_decode(sc, tc);
        session_decode(sg, tc);
    }
    char msg[256];
    snprintf(msg, sizeof msg, "%s: logits of the prompt and %d decode steps within rel L2 %.2e of the CPU (bound 3e-2)",
             path, steps, worst);
    test_cond(msg, worst <= 3e-2);
    snprintf(msg, sizeof msg, "%s: greedy tokens agree on %d of the %d steps the CPU's top two are clearly apart", path,
             agree, decided);
    test_cond(msg, agree == decided);
    session_free(sc);
    session_free(sg);
    /* the dense cache in half precision (--f16-kv) on both */
    kv_opts_set_num(&o.kv, "f16", 1);
    snprintf(o.backend, sizeof o.backend, "cpu");
    sc = sg = NULL;
    rc = session_new(m, &o, &sc);
    snprintf(o.backend, sizeof o.backend, "cuda");
    if (!rc) rc = session_new(m, &o, &sg);
    if (!rc) {
        session_prefill(sc, ids, np, NULL, NULL);
        session_prefill(sg, ids, np, NULL, NULL);
        double w = test_rel_l2(session_logits(sg), session_logits(sc), V);
        for (int s = 0; s < steps; s++) {
            int tc = sampler_argmax(session_logits(sc), V);
            session_decode(sc, tc);
            session_decode(sg, tc);
            double e = test_rel_l2(session_logits(sg), session_logits(sc), V);
            if (e > w) w = e;
        }
        snprintf(msg, sizeof msg, "%s dense --f16-kv: GPU logits within rel L2 %.2e of the CPU's (bound 3e-2)", path, w);
        test_cond(msg, w <= 3e-2);
    } else {
        snprintf(msg, sizeof msg, "dense --f16-kv sessions on cpu and cuda: %s", skv_last_error());
        test_cond(msg, 0);
    }
    session_free(sc);
    session_free(sg);
    kv_opts_set_num(&o.kv, "f16", 0);
    /* ShadowKV on both: the GPU path (decode_layer_dev over the CUDA ops)
     * against the CPU's. The selection may part where BF16 moves a landmark
     * score past its neighbour: a step where a head picks another chunk
     * differs by more (the first run, on the simulator, had 9e-3 at most
     * steps and single steps up to 2.3e-1 that did not carry over). So: the
     * median step within the dense bound, the selections' hits within 2%,
     * and no step past 0.5 (a wrong kernel moves every step, not a few). */
    snprintf(o.kv.policy, sizeof o.kv.policy, "shadowkv");
    o.kv.budget = 64;
    kv_opts_set_num(&o.kv, "rank", 32);
    kv_opts_set_num(&o.kv, "outliers", 4);
    snprintf(o.backend, sizeof o.backend, "cpu");
    sc = sg = NULL;
    rc = session_new(m, &o, &sc);
    snprintf(o.backend, sizeof o.backend, "cuda");
    if (!rc) rc = session_new(m, &o, &sg);
    snprintf(msg, sizeof msg, "shadowkv sessions on cpu and cuda (%s)", rc ? skv_last_error() : "ok");
    test_cond(msg, rc == 0);
    if (!rc) {
        int r1 = session_prefill(sc, ids, np, NULL, NULL), r2 = session_prefill(sg, ids, np, NULL, NULL);
        double w = test_rel_l2(session_logits(sg), session_logits(sc), V);
        double errs[64];
        int ne = 0;
        errs[ne++] = w;
        char per[1024];
        int pl = snprintf(per, sizeof per, "INFO shadowkv rel L2 per step: prefill %.1e", w);
        for (int s = 0; s < steps && !r1 && !r2; s++) {
            int tc = sampler_argmax(session_logits(sc), V);
            r1 = session_decode(sc, tc);
            r2 = session_decode(sg, tc);
            double e = test_rel_l2(session_logits(sg), session_logits(sc), V);
            if (pl > 0 && (size_t)pl < sizeof per) pl += snprintf(per + pl, sizeof per - (size_t)pl, " %.1e", e);
            if (e > w) w = e;
            if (ne < 64) errs[ne++] = e;
        }
        printf("%s\n", per);
        for (int i = 1; i < ne; i++) /* insertion sort for the median */
            for (int j = i; j > 0 && errs[j] < errs[j - 1]; j--) {
                double t = errs[j];
                errs[j] = errs[j - 1];
                errs[j - 1] = t;
            }
        double med = ne ? errs[ne / 2] : 0;
        kv_shadowkv_stats a, b;
        kv_shadowkv_stats_get(sc->kv, &a);
        kv_shadowkv_stats_get(sg->kv, &b);
        unsigned long long sel = a.hits + a.misses, dh = a.hits > b.hits ? a.hits - b.hits : b.hits - a.hits;
        snprintf(msg, sizeof msg, "%s shadowkv: GPU logits' median step rel L2 %.2e of the CPU's (bound 3e-2), worst "
                 "%.2e (bound 0.5) over the prompt and %d steps; hits %llu vs %llu of %llu selected (within 2%%)",
                 path, med, w, steps, (unsigned long long)b.hits, (unsigned long long)a.hits, sel);
        test_cond(msg, !r1 && !r2 && med <= 3e-2 && w <= 0.5 && dh * 50 <= sel);
    }
    session_free(sc);
    session_free(sg);
    model_free(m);
    free(ids);
    return test_report("test_cuda_model");
}
