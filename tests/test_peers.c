/* test_peers.c: the peer policies behind the registry, and the oracle that
 * measures every policy the same way.
 *  - page bounds (Quest, FreeKV): incremental min/max equal a brute force,
 *    and the page score bounds q·k for every key of the page;
 *  - the row store (kv_rows) the peers and the oracle share: rows copied into
 *    the policy's own members as appends grow it, page bounds kept, other
 *    members untouched, past the context and past what is stored refused
 *    with the policy's name; every policy's create refuses bad heads and a
 *    negative budget the same way;
 *  - Quest: the selection path equals a brute force (scores, top-k, the
 *    forced last page, attention over the kept rows); at a budget that
 *    covers the context it attends exactly as dense; bad options refused;
 *  - the oracle: its recall, overlap and output error equal a brute force
 *    over the same keys; around a policy that keeps everything they are 1,
 *    1 and 0; the policy's output is unchanged by the wrapper;
 *  - model level (../shared): Quest's logits equal dense's at a full budget. */
#include "backend.h"
#include "kv.h"
#include "kv_rows.h"
#include "model.h"
#include "kivi.h"
#include "page_ops.h"
#include "probe.h"
#include "sampler.h"
#include "session.h"
#include "skv.h"
#include "testhelp.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void) { return test_frand(&rng); }

static void fill(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] = s * frand();
}

/* ---- page bounds --------------------------------------------------------- */

static void test_page_ops(void) {
    enum { T = 83, H = 2, D = 8, P = 16, NP = (T + P - 1) / P };
    float K[T * H * D], mn[NP * H * D], mx[NP * H * D], q[D], U[NP];
    fill(K, sizeof K / sizeof K[0], 1.5f);
    /* appended in uneven pieces, as prefill batches then decode steps give them */
    int cuts[] = {0, 5, 16, 40, 41, 70, 82, T};
    for (int kh = 0; kh < H; kh++)
        for (int i = 0; i + 1 < (int)(sizeof cuts / sizeof cuts[0]); i++)
            page_bounds(K + kh * D, H * D, D, P, cuts[i], cuts[i + 1] - cuts[i], mn + kh * D, mx + kh * D, H * D);
    int ok = 1;
    for (int kh = 0; kh < H; kh++)
        for (int j = 0; j < NP; j++)
            for (int c = 0; c < D; c++) {
                float lo = INFINITY, hi = -INFINITY;
                for (int t = j * P; t < (j + 1) * P && t < T; t++) {
                    float v = K[(t * H + kh) * D + c];
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
                ok &= mn[(j * H + kh) * D + c] == lo && mx[(j * H + kh) * D + c] == hi;
            }
    test_cond("page bounds appended piecewise equal the min and max of each page", ok);
    int bound = 1, formula = 1;
    for (int trial = 0; trial < 20; trial++) {
        fill(q, D, 2.0f);
        for (int kh = 0; kh < H; kh++) {
            page_score(q, D, mn + kh * D, mx + kh * D, H * D, NP, U);
            for (int j = 0; j < NP; j++) {
                double s = 0;
                for (int c = 0; c < D; c++) {
                    double a = (double)q[c] * mn[(j * H + kh) * D + c], b = (double)q[c] * mx[(j * H + kh) * D + c];
                    s += a > b ? a : b;
                }
                formula &= fabs(s - U[j]) < 1e-5;
                for (int t = j * P; t < (j + 1) * P && t < T; t++) {
                    double dot = 0;
                    for (int c = 0; c < D; c++) dot += (double)q[c] * K[(t * H + kh) * D + c];
                    bound &= U[j] >= dot - 1e-5;
                }
            }
        }
    }
    test_cond("the page score is the sum of max(q·min, q·max) over channels", formula);
    test_cond("the page score bounds q·k for every key of the page", bound);
    test_cond("the CPU backend's page ops are these", skv_backend_cpu.page_bounds == page_bounds &&
                                                           skv_backend_cpu.page_score == page_score);
}

/* ---- a policy fed synthetic keys ------------------------------------------------ */

enum { NL = 1, NH = 4, NKV = 2, HD = 8, KVD = NKV * HD, GROUP = NH / NKV, CTX = 256 };

typedef struct {
    int n;
    float k[CTX * KVD], v[CTX * KVD];
} kv_data;

/* Feeds the prompt (n tokens in two batches) to c, attends it, ends the prefill. */
static int feed_prompt(kv_cache *c, kv_data *kd, int n) {
    float q[CTX * NH * HD], out[CTX * NH * HD];
    fill(kd->k, (size_t)n * KVD, 1.0f);
    fill(kd->v, (size_t)n * KVD, 1.0f);
    fill(q, (size_t)n * NH * HD, 1.0f);
    int half = n / 2, rc;
    for (int b = 0; b < 2; b++) {
        int p0 = b ? half : 0, m = b ? n - half : half;
        if ((rc = c->cls->append(c, 0, p0, m, kd->k + p0 * KVD, kd->k + p0 * KVD, kd->v + p0 * KVD))) return rc;
        if ((rc = c->cls->attend(c, 0, p0, m, q + p0 * NH * HD, out + p0 * NH * HD))) return rc;
    }
    kd->n = n;
    return c->cls->end_prefill(c);
}

/* One decode step: a random token appended at kd->n, a random query attended. */
static int decode_step(kv_cache *c, kv_data *kd, float *q, float *out) {
    fill(kd->k + kd->n * KVD, KVD, 1.0f);
    fill(kd->v + kd->n * KVD, KVD, 1.0f);
    fill(q, NH * HD, 1.0f);
    c->step = c->step < 0 ? 0 : c->step + 1;
    int rc = c->cls->append(c, 0, kd->n, 1, kd->k + kd->n * KVD, kd->k + kd->n * KVD, kd->v + kd->n * KVD);
    if (!rc) rc = c->cls->attend(c, 0, kd->n, 1, q, out);
    kd->n++;
    return rc;
}

/* Exact softmax attention of query head hq over the positions in pos (n). */
static void attend_set(const kv_data *kd, int hq, const float *q, const int *pos, int n, double *o) {
    int kh = hq / GROUP;
    double w[CTX], mx = -INFINITY, z = 0;
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int c = 0; c < HD; c++) s += (double)q[hq * HD + c] * kd->k[pos[i] * KVD + kh * HD + c];
        w[i] = s / sqrt((double)HD);
        mx = w[i] > mx ? w[i] : mx;
    }
    for (int i = 0; i < n; i++) z += w[i] = exp(w[i] - mx);
    for (int c = 0; c < HD; c++) o[c] = 0;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < HD; c++) o[c] += w[i] / z * kd->v[pos[i] * KVD + kh * HD + c];
}

static kv_cache *make(const char *policy, int budget, const char *opt, const char *val) {
    kv_opts o;
    kv_opts_default(&o);
    snprintf(o.policy, sizeof o.policy, "%s", policy);
    o.budget = budget;
    if (opt && kv_opts_set(&o, opt, val, 1)) return NULL;
    kv_shape sh = {.n_layers = NL, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .max_ctx = CTX};
    kv_cache *c = NULL;
    return kv_new(&o, &sh, &c) ? NULL : c;
}

/* ---- Quest ------------------------------------------------------------------ */

/* Quest's choice for query head hq at context T, by brute force: pages
 * 0..last-1 scored by Σ max(q·min, q·max), the best k (ties: lower page),
 * then the last page; the kept positions into pos, their count returned. */
static int quest_brute(const kv_data *kd, int hq, const float *q, int T, int page, int k, int *pos) {
    int kh = hq / GROUP, last = (T + page - 1) / page - 1;
    double U[CTX];
    for (int j = 0; j < last; j++) {
        U[j] = 0;
        for (int c = 0; c < HD; c++) {
            double lo = INFINITY, hi = -INFINITY;
            for (int t = j * page; t < (j + 1) * page; t++) {
                double v = kd->k[t * KVD + kh * HD + c];
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
            double a = q[hq * HD + c] * lo, b = q[hq * HD + c] * hi;
            U[j] += a > b ? a : b;
        }
    }
    int taken[CTX] = {0}, n = 0;
    for (int i = 0; i < k && i < last; i++) {
        int best = -1;
        for (int j = 0; j < last; j++)
            if (!taken[j] && (best < 0 || U[j] > U[best] + 1e-9)) best = j;
        taken[best] = 1;
    }
    taken[last] = 1;
    for (int j = 0; j <= last; j++)
        if (taken[j])
            for (int t = j * page; t < (j + 1) * page && t < T; t++) pos[n++] = t;
    return n;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static void test_quest(void) {
    const int page = 16, budget = 48, k = budget / page - 1;
    kv_data kd;
    kv_cache *c = make("quest", budget, "dense_layers", "0");
    test_cond("quest is registered and made from its options", c && c->policy == &kv_policy_quest);
    if (!c) return;
    int rc = feed_prompt(c, &kd, 100);
    float q[NH * HD], out[NH * HD];
    int ok_out = 1, ok_kept = 1;
    for (int s = 0; s < 6 && !rc; s++) {
        if ((rc = decode_step(c, &kd, q, out))) break;
        for (int hq = 0; hq < NH; hq++) {
            int pos[CTX], got[CTX], unit = 0;
            int n = quest_brute(&kd, hq, q, kd.n, page, k, pos);
            double o[HD];
            attend_set(&kd, hq, q, pos, n, o);
            for (int d = 0; d < HD; d++) ok_out &= fabs(o[d] - out[hq * HD + d]) < 1e-5;
            int m = c->cls->kept(c, 0, hq, got, &unit);
            qsort(got, (size_t)m, sizeof(int), cmp_int);
            ok_kept &= m == n && unit == page && !memcmp(got, pos, sizeof(int) * (size_t)n);
        }
    }
    test_cond("quest decodes (selection path)", rc == 0);
    test_cond("quest's output equals attention over a brute-force choice of pages (bounds, top-k, last page)", ok_out);
    test_cond("quest reports the positions it attended, in pages", ok_kept);
    test_cond("quest reads its bounds and rows, fetches nothing",
              kv_stat(c, "step_read_bytes") > 0 && kv_stat(c, "step_fetch_bytes") == 0 && kv_stat(c, "k") == k);
    size_t res, off;
    c->cls->bytes(c, &res, &off);
    test_cond("quest keeps everything resident", off == 0 && res >= (size_t)2 * kd.n * KVD * sizeof(float));
    test_cond("quest at a budget of 3 pages says nothing", !c->notice[0]);
    kv_free(c);
    /* between one page and two (its floor) quest selects no page: the notice says so */
    int notice_ok = 1;
    for (int b = 8; b <= 32; b += 12) {
        kv_cache *fc = make("quest", b, "dense_layers", "0");
        kv_data kf;
        int frc = fc ? feed_prompt(fc, &kf, 100) : -1;
        notice_ok &= frc == 0 && kv_stat(fc, "k") == (b < 2 * page ? 0 : 1) &&
                     (b < 2 * page) == (strstr(fc->notice, "under 2 pages of 16") != NULL);
        kv_free(fc);
    }
    test_cond("quest under its floor of 2 pages (budgets 8, 20) says it selects no page; at 32 it selects one",
              notice_ok);

    /* group_max: one set per KV head, the same for its query heads */
    kv_opts oo;
    kv_opts_default(&oo);
    snprintf(oo.policy, sizeof oo.policy, "quest");
    oo.budget = budget;
    kv_opts_set(&oo, "group_max", "1", 1);
    kv_opts_set(&oo, "dense_layers", "0", 1);
    kv_shape sh = {.n_layers = NL, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .max_ctx = CTX};
    kv_cache *gm = NULL;
    rc = kv_new(&oo, &sh, &gm);
    if (!rc) rc = feed_prompt(gm, &kd, 100);
    if (!rc) rc = decode_step(gm, &kd, q, out);
    int same = 1;
    for (int kh = 0; kh < NKV && !rc; kh++) {
        int a[CTX], b[CTX], u;
        int na = gm->cls->kept(gm, 0, kh * GROUP, a, &u), nb = gm->cls->kept(gm, 0, kh * GROUP + 1, b, &u);
        /* k full pages plus the current one (101 tokens: 5 of page 6) */
        same &= na == nb && !memcmp(a, b, sizeof(int) * (size_t)na) && na == k * page + kd.n % page;
    }
    test_cond("group_max gives the query heads of a KV head one page set", rc == 0 && same);
    kv_free(gm);

    /* a budget that covers the context: exactly dense */
    kv_data kd2;
    kv_cache *qc = make("quest", 4096, "dense_layers", "0"), *dc = make("dense", 0, NULL, NULL);
    rng = 7;
    rc = qc && dc ? feed_prompt(qc, &kd, 90) : -1;
    rng = 7;
    if (!rc) rc = feed_prompt(dc, &kd2, 90);
    int exact = 1;
    for (int s = 0; s < 4 && !rc; s++) {
        float q2[NH * HD], o2[NH * HD];
        uint64_t save = rng;
        rc = decode_step(qc, &kd, q, out);
        rng = save;
        if (!rc) rc = decode_step(dc, &kd2, q2, o2);
        exact &= !memcmp(out, o2, sizeof out);
    }
    test_cond("quest at a budget covering the context attends bit for bit like dense", rc == 0 && exact);
    int pages = (kd.n + page - 1) / page;
    test_cond("... and its k says the pages it attended besides the current one, not the 255 its budget holds",
              kv_stat(qc, "k") == pages - 1 && kv_stat(qc, "budget_tokens") == pages * page);
    kv_free(qc);
    kv_free(dc);

    kv_opts o;
    kv_opts_default(&o);
    test_cond("a page of 0 is refused with the range", kv_opts_set(&o, "page", "0", 1) == SKV_EINVAL &&
                                                            strstr(skv_last_error(), "'page'"));
    test_cond("group_max takes 0 or 1", kv_opts_set(&o, "group_max", "2", 1) == SKV_EINVAL);
    test_cond("a quest option given to shadowkv is refused", !make("shadowkv", 64, "page", "16") &&
                                                                 strstr(skv_last_error(), "not an option of policy shadowkv"));
}

/* ---- FreeKV ------------------------------------------------------------------ */

/* FreeKV's choice for KV head kh at context T by brute force: the window,
 * the candidates, avgSM over the group of the query qs, the top k. */
static int freekv_brute(const kv_data *kd, int kh, const float *qs, int T, int page, int sink, int window, int k,
                        int *pos, int *pages, int *n_pages) {
    int nfull = (T - sink) / page, tail = (T - sink) % page, wp = window / page;
    int wf = tail > page / 2 ? wp - 1 : wp;
    wf = wf < 0 ? 0 : wf > nfull ? nfull : wf;
    int nc = nfull - wf, ws = sink + nc * page;
    double acc[CTX] = {0};
    for (int g = 0; g < GROUP; g++) {
        const float *q = qs + (kh * GROUP + g) * HD;
        double U[CTX], mx = -INFINITY, z = 0;
        for (int j = 0; j < nc; j++) {
            U[j] = 0;
            for (int c = 0; c < HD; c++) {
                double lo = INFINITY, hi = -INFINITY;
                for (int t = sink + j * page; t < sink + (j + 1) * page; t++) {
                    double v = kd->k[t * KVD + kh * HD + c];
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
                U[j] += fmax(q[c] * lo, q[c] * hi);
            }
            mx = U[j] > mx ? U[j] : mx;
        }
        for (int j = 0; j < nc; j++) z += exp(U[j] - mx);
        for (int j = 0; j < nc; j++) acc[j] += exp(U[j] - mx) / z / GROUP;
    }
    int taken[CTX] = {0}, n = 0;
    for (int i = 0; i < k && i < nc; i++) {
        int b = -1;
        for (int j = 0; j < nc; j++)
            if (!taken[j] && (b < 0 || acc[j] > acc[b] + 1e-9)) b = j;
        taken[b] = 1;
    }
    *n_pages = 0;
    for (int t = 0; t < sink; t++) pos[n++] = t;
    for (int j = 0; j < nc; j++)
        if (taken[j]) {
            pages[(*n_pages)++] = (sink + j * page) / page;
            for (int t = sink + j * page; t < sink + (j + 1) * page; t++) pos[n++] = t;
        }
    for (int t = ws; t < T; t++) pos[n++] = t;
    return n;
}

static kv_cache *make_freekv(int budget, const char *tau) {
    kv_opts o;
    kv_opts_default(&o);
    snprintf(o.policy, sizeof o.policy, "freekv");
    o.budget = budget;
    if (kv_opts_set(&o, "page", "8", 1) || kv_opts_set(&o, "sink", "16", 1) || kv_opts_set(&o, "window", "16", 1) ||
        kv_opts_set(&o, "dense_layers", "0", 1) || kv_opts_set(&o, "tau", tau, 1))
        return NULL;
    kv_shape sh = {.n_layers = NL, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .max_ctx = CTX};
    kv_cache *c = NULL;
    return kv_new(&o, &sh, &c) ? NULL : c;
}

static void test_freekv(void) {
    const int page = 8, sink = 16, window = 16, budget = 64, k = (budget - sink - window) / page;
    {   /* a context of 41 tokens under the budget of 64 is attended whole: no page picked, not k = 4 */
        kv_cache *c = make_freekv(budget, "1");
        kv_data kd;
        float q[NH * HD], out[NH * HD];
        int rc = c ? feed_prompt(c, &kd, 40) : -1;
        if (!rc) rc = decode_step(c, &kd, q, out);
        test_cond("freekv's k says the pages it picked from a context under its budget (0), not the budget's 4",
                  rc == 0 && kv_stat(c, "k") == 0);
        kv_free(c);
    }
    /* tau = -1: never corrected, every pick but the first uses the previous
     * query; tau = 1: always corrected, every pick uses the current one. */
    const char *taus[2] = {"-1", "1"};
    for (int m = 0; m < 2; m++) {
        kv_cache *c = make_freekv(budget, taus[m]);
        kv_data kd;
        int rc = c ? feed_prompt(c, &kd, 100) : -1;
        float q[NH * HD], out[NH * HD], qprev[NH * HD];
        int ok_out = 1, ok_kept = 1, ok_fetch = 1, prev_sel[NKV][CTX], n_prev[NKV] = {0};
        for (int s = 0; s < 5 && !rc; s++) {
            if ((rc = decode_step(c, &kd, q, out))) break;
            double fetched = 0;
            for (int kh = 0; kh < NKV; kh++) {
                int pos[CTX], got[CTX], unit;
                const float *qs = s == 0 || m == 1 ? q : qprev;
                int sel[CTX], ns = 0;
                int n = freekv_brute(&kd, kh, qs, kd.n, page, sink, window, k, pos, sel, &ns);
                for (int g = 0; g < GROUP; g++) {
                    int hq = kh * GROUP + g;
                    double o[HD];
                    attend_set(&kd, hq, q, pos, n, o);
                    for (int d = 0; d < HD; d++) ok_out &= fabs(o[d] - out[hq * HD + d]) < 1e-5;
                    int got_n = c->cls->kept(c, 0, hq, got, &unit);
                    qsort(got, (size_t)got_n, sizeof(int), cmp_int);
                    ok_kept &= got_n == n && unit == page && !memcmp(got, pos, sizeof(int) * (size_t)n);
                }
                int miss = 0;
                for (int i = 0; i < ns; i++) {
                    int hit = 0;
                    for (int j = 0; j < n_prev[kh]; j++) hit |= prev_sel[kh][j] == sel[i];
                    miss += !hit;
                }
                fetched += (double)miss * page * HD * 2 * sizeof(float);
                memcpy(prev_sel[kh], sel, sizeof(int) * (size_t)ns);
                n_prev[kh] = ns;
            }
            ok_fetch &= fabs(kv_stat(c, "step_fetch_bytes") - fetched) < 0.5;
            memcpy(qprev, q, sizeof q);
        }
        char msg[200];
        snprintf(msg, sizeof msg, "freekv (tau %s) decodes", taus[m]);
        test_cond(msg, rc == 0);
        snprintf(msg, sizeof msg, "freekv (tau %s: %s) equals a brute force: window, candidates, avgSM over the group, "
                 "top-k, sink + pages + window", taus[m], m ? "always corrected" : "the previous query picks");
        test_cond(msg, ok_out && ok_kept);
        snprintf(msg, sizeof msg, "freekv (tau %s) counts %s", taus[m], m ? "a correction per KV head and step"
                                                                           : "no correction");
        test_cond(msg, kv_stat(c, "corrections") == (m ? 4.0 * NKV : 0) && kv_stat(c, "k") == k);
        test_cond("freekv fetches exactly the pages its page cache (the last step's pages) lacks",
                  ok_fetch && kv_stat(c, "misses") > 0 && kv_stat(c, "hits") > 0);
        kv_free(c);
    }
    /* a budget of the sink and window alone picks nothing, so it corrects nothing */
    {
        kv_cache *c = make_freekv(sink + window, "1");
        kv_data kd;
        int rc = c ? feed_prompt(c, &kd, 100) : -1;
        float q[NH * HD], out[NH * HD];
        for (int s = 0; s < 4 && !rc; s++) rc = decode_step(c, &kd, q, out);
        test_cond("freekv with no page to pick (budget = sink + window, tau 1) counts no correction and no rate",
                  rc == 0 && kv_stat(c, "k") == 0 && kv_stat(c, "corrections") == 0 &&
                      isnan(kv_stat(c, "correction_rate")));
        kv_free(c);
    }
    /* a budget that covers the context: exactly dense */
    kv_data kd, kd2;
    kv_cache *fc = make_freekv(4096, "0.8"), *dc = make("dense", 0, NULL, NULL);
    rng = 5;
    int rc = fc && dc ? feed_prompt(fc, &kd, 90) : -1;
    rng = 5;
    if (!rc) rc = feed_prompt(dc, &kd2, 90);
    int exact = 1;
    for (int s = 0; s < 4 && !rc; s++) {
        float q[NH * HD], out[NH * HD], q2[NH * HD], o2[NH * HD];
        uint64_t save = rng;
        rc = decode_step(fc, &kd, q, out);
        rng = save;
        if (!rc) rc = decode_step(dc, &kd2, q2, o2);
        exact &= !memcmp(out, o2, sizeof out);
    }
    size_t res, off;
    if (fc) fc->cls->bytes(fc, &res, &off);
    test_cond("freekv at a budget covering the context attends bit for bit like dense, offloading nothing",
              rc == 0 && exact && off == 0);
    kv_free(fc);
    kv_free(dc);
    kv_opts o;
    kv_opts_default(&o);
    snprintf(o.policy, sizeof o.policy, "freekv");
    kv_opts_set(&o, "sink", "20", 1);
    kv_shape sh = {.n_layers = NL, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .max_ctx = CTX};
    kv_cache *c = NULL;
    test_cond("a sink that is not a multiple of the page is refused", kv_new(&o, &sh, &c) == SKV_EINVAL && !c &&
                                                                          strstr(skv_last_error(), "multiples of the page"));
    test_cond("tau outside [-1, 1] is refused", kv_opts_set(&o, "tau", "1.5", 1) == SKV_EINVAL);
}

/* ---- the shared quantizer and SpeCache ------------------------------------------ */

static void test_kivi(void) {
    float x[64], y[64], s, z;
    uint8_t codes[64];
    int ok = 1;
    for (int bits = 1; bits <= 4; bits++)
        for (int trial = 0; trial < 50; trial++) {
            fill(x, 64, 3.0f);
            kivi_group(x, 64, 1, bits, 0, y, codes, &s, &z);
            for (int i = 0; i < 64; i++)
                ok &= codes[i] <= (1 << bits) - 1 && fabsf(y[i] - x[i]) <= s / 2 + 1e-5f && y[i] == z + codes[i] * s;
        }
    test_cond("KIVI round trip: codes in range, every value within half a step", ok);
    float h[4] = {0, 0.5f, 1.5f, 3}, hy[4];
    kivi_group(h, 4, 1, 2, 0, hy, codes, &s, &z);
    test_cond("KIVI rounds half to even (0.5 -> 0, 1.5 -> 2)", codes[1] == 0 && codes[2] == 2 && s == 1 && z == 0);
    float flat[3] = {2.5f, 2.5f, 2.5f}, fy[3];
    kivi_group(flat, 3, 1, 1, 0, fy, codes, &s, &z);
    test_cond("a flat group stores code 0 and decodes exactly", codes[0] == 0 && fy[0] == 2.5f && fy[2] == 2.5f);
    float m[3] = {0, 4, 1}, my[3];
    kivi_group(m, 3, 1, 1, 1, my, codes, &s, &z);
    test_cond("SpeCache's 1-bit rule decodes to the quartile midpoints, codes clamped to 0..1",
              my[0] == 1 && my[1] == 3 && my[2] == 1 && codes[1] == 1);
    float st[8] = {1, 100, 2, 100, 3, 100, 4, 100}, sy[8];
    memcpy(sy, st, sizeof st);
    kivi_group(sy, 4, 2, 2, 0, sy, NULL, NULL, NULL);
    test_cond("a strided group quantizes in place and leaves the other rows alone",
              sy[0] == 1 && sy[6] == 4 && sy[1] == 100 && sy[7] == 100);
}

/* The low-bit copy the shared cache holds at length L, by brute force:
 * keys per channel in groups of g tokens over blocks of R, values per token
 * in groups of g channels, older than the newest R. */
static void lowbit_brute(const kv_data *kd, int L, int bits, int g, int R, float *K, float *V) {
    memcpy(K, kd->k, sizeof(float) * (size_t)L * KVD);
    memcpy(V, kd->v, sizeof(float) * (size_t)L * KVD);
    int gv = g < HD ? g : HD;
    for (int t0 = 0; t0 + R <= L; t0 += R)
        for (int c = 0; c < KVD; c++)
            for (int t = t0; t < t0 + R; t += g) {
                float col[CTX], out[CTX];
                for (int i = 0; i < g; i++) col[i] = K[(t + i) * KVD + c];
                kivi_group(col, g, 1, bits, 1, out, NULL, NULL, NULL);
                for (int i = 0; i < g; i++) K[(t + i) * KVD + c] = out[i];
            }
    for (int t = 0; t < L - R; t++)
        for (int kh = 0; kh < NKV; kh++)
            for (int j = 0; j < HD; j += gv)
                kivi_group(V + t * KVD + kh * HD + j, gv, 1, bits, 1, V + t * KVD + kh * HD + j, NULL, NULL, NULL);
}

static void test_specache(void) {
    const int bits = 2, g = 4, R = 8, budget = 20, k = budget - R, n0 = 50;
    kv_opts o;
    kv_opts_default(&o);
    snprintf(o.policy, sizeof o.policy, "specache");
    o.budget = budget;
    kv_opts_set(&o, "bits", "2", 1);
    kv_opts_set(&o, "group", "4", 1);
    kv_opts_set(&o, "residual", "8", 1);
    kv_shape sh = {.n_layers = NL, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .max_ctx = CTX};
    kv_cache *c = NULL;
    int rc = kv_new(&o, &sh, &c);
    test_cond("specache is registered and made from its options", rc == 0 && c && c->policy == &kv_policy_specache);
    if (rc) return;
    kv_data kd;
    rc = feed_prompt(c, &kd, n0);
    float q[NH * HD], out[NH * HD], Kq[CTX * KVD], Vq[CTX * KVD];
    int ok_out = 1, ok_kept = 1;
    for (int s = 0; s < 5 && !rc; s++) {
        int L = kd.n; /* the cache was flushed at this length before the new token */
        if ((rc = decode_step(c, &kd, q, out))) break;
        int T = kd.n;
        lowbit_brute(&kd, L, bits, g, R, Kq, Vq);
        memcpy(Kq + L * KVD, kd.k + L * KVD, sizeof(float) * KVD); /* the current token is exact */
        memcpy(Vq + L * KVD, kd.v + L * KVD, sizeof(float) * KVD);
        int fp_from = L - L % R > L - R ? L - L % R : L - R;
        for (int kh = 0; kh < NKV; kh++) {
            double pm[CTX] = {0};
            for (int gq = 0; gq < GROUP; gq++) {
                int hq = kh * GROUP + gq;
                double w[CTX], mx = -INFINITY, z = 0;
                for (int t = 0; t < T; t++) {
                    double dot = 0;
                    for (int i = 0; i < HD; i++) dot += (double)q[hq * HD + i] * Kq[t * KVD + kh * HD + i];
                    w[t] = dot / sqrt((double)HD);
                    mx = w[t] > mx ? w[t] : mx;
                }
                for (int t = 0; t < T; t++) z += w[t] = exp(w[t] - mx);
                for (int t = 0; t < T; t++) pm[t] += w[t] / z / GROUP;
            }
            int chosen[CTX] = {0};
            for (int i = 0; i < k && i < T - 1; i++) {
                int b = -1;
                for (int t = 0; t < T - 1; t++)
                    if (!chosen[t] && (b < 0 || pm[t] > pm[b] + 1e-9)) b = t;
                chosen[b] = 1;
            }
            int want[CTX], nw = 0;
            for (int t = 0; t < T; t++)
                if ((chosen[t] && t < fp_from) || t >= fp_from) want[nw++] = t;
            for (int gq = 0; gq < GROUP; gq++) {
                int hq = kh * GROUP + gq;
                double w[CTX], mx = -INFINITY, z = 0, o2[HD] = {0};
                for (int t = 0; t < T; t++) {
                    const float *kr = chosen[t] ? kd.k : Kq;
                    double dot = 0;
                    for (int i = 0; i < HD; i++) dot += (double)q[hq * HD + i] * kr[t * KVD + kh * HD + i];
                    w[t] = dot / sqrt((double)HD);
                    mx = w[t] > mx ? w[t] : mx;
                }
                for (int t = 0; t < T; t++) z += w[t] = exp(w[t] - mx);
                for (int t = 0; t < T; t++) {
                    const float *vr = chosen[t] ? kd.v : Vq;
                    for (int i = 0; i < HD; i++) o2[i] += w[t] / z * vr[t * KVD + kh * HD + i];
                }
                for (int i = 0; i < HD; i++) ok_out &= fabs(o2[i] - out[hq * HD + i]) < 2e-5;
                int got[CTX], unit;
                int ng = c->cls->kept(c, 0, hq, got, &unit);
                qsort(got, (size_t)ng, sizeof(int), cmp_int);
                ok_kept &= ng == nw && unit == 1 && !memcmp(got, want, sizeof(int) * (size_t)nw);
            }
        }
    }
    test_cond("specache decodes", rc == 0);
    test_cond("specache equals a brute force: low-bit cache, group-mean top-k, exact rows swapped in, re-attended",
              ok_out);
    test_cond("specache reports the chosen rows and its exact residual as attended in full precision", ok_kept);
    size_t res, off;
    c->cls->bytes(c, &res, &off);
    test_cond("specache holds less than dense resident and offloads the exact copy",
              res < (size_t)2 * kd.n * KVD * sizeof(float) && off == (size_t)2 * kd.n * KVD * sizeof(float) &&
                  kv_stat(c, "fetch_bytes") > 0);
    kv_free(c);
    /* a budget past the prompt: the row buffer can hold only the quantized
     * positions, not k rows */
    o.budget = 1000;
    c = NULL;
    size_t dense = (size_t)2 * (n0 + 1) * KVD * sizeof(float) * NL;
    rc = kv_new(&o, &sh, &c);
    if (!rc) rc = feed_prompt(c, &kd, n0);
    if (!rc) rc = decode_step(c, &kd, q, out);
    if (!rc) c->cls->bytes(c, &res, &off);
    test_cond("specache with a budget past the prompt counts its row buffer at the positions it can hold",
              rc == 0 && res < 2 * dense && off == dense);
    test_cond("... and its k is the positions before the current one, not budget - residual",
              rc == 0 && kv_stat(c, "k") == n0);
    kv_free(c);
    kv_opts_default(&o);
    snprintf(o.policy, sizeof o.policy, "specache");
    kv_opts_set(&o, "residual", "10", 1);
    c = NULL;
    test_cond("a residual that is not a multiple of the group is refused",
              kv_new(&o, &sh, &c) == SKV_EINVAL && !c && strstr(skv_last_error(), "multiple of the group"));
    test_cond("bits outside 1..8 are refused", kv_opts_set(&o, "bits", "9", 1) == SKV_EINVAL);
}

/* ---- TailorKV ------------------------------------------------------------------ */

static kv_cache *make_tailor(int budget, const char *qlayers, const char *tau) {
    kv_opts o;
    kv_opts_default(&o);
    snprintf(o.policy, sizeof o.policy, "tailorkv");
    o.budget = budget;
    const char *set[][2] = {{"qlayers", qlayers}, {"qtau", tau}, {"start", "4"}, {"recent", "4"}, {"channels", "3"},
                            {"group", "4"}, {"residual", "8"}, {"bits", "2"}};
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
        if (kv_opts_set(&o, set[i][0], set[i][1], 1)) return NULL;
    kv_shape sh = {.n_layers = NL, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .max_ctx = CTX};
    kv_cache *c = NULL;
    return kv_new(&o, &sh, &c) ? NULL : c;
}

/* The calibration figure P, worked by hand. 20 prompt tokens; every key is
 * zero but the last, whose score q.k/sqrt(d) is ln 19 for every query. The
 * official rule (no mask, k = int(0.05 * 20) = 1 for every row): each row
 * sees weights 19 and nineteen 1s, the top key holds 19/38, so P = 0.5.
 * The causal rule: row p < 19 sees p + 1 equal keys and keeps one (k 0
 * taken as 1), 1 - 1/(p + 1); row 19 gives 0.5; the mean over the 20 rows
 * is (19 - H(19) + 0.5) / 20 = 0.797613. */
static float tailor_P[2];
static void on_tailor_metric(const probe_event *ev, void *user) {
    int *which = user;
    if (ev->kind == PROBE_METRIC && !strcmp(ev->metric.name, "attn_spread") && ev->metric.layer == 0)
        tailor_P[*which] = ev->metric.value;
}

static void test_tailor_calibration(void) {
    enum { N = 20 };
    double h19 = 0;
    for (int i = 1; i <= 19; i++) h19 += 1.0 / i;
    const double want[2] = { 0.5, (19 - h19 + 0.5) / N };
    int quant[2] = { -1, -1 }, ok = 1;
    for (int which = 0; which < 2; which++) {
        kv_opts o;
        kv_opts_default(&o);
        snprintf(o.policy, sizeof o.policy, "tailorkv");
        o.budget = 12;
        const char *set[][2] = {{"qlayers", "-1"}, {"qtau", "0.6"}, {"start", "2"}, {"recent", "2"},
                                {"group", "4"}, {"residual", "8"}, {"qcausal", which ? "1" : "0"}};
        for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) ok &= kv_opts_set(&o, set[i][0], set[i][1], 1) == 0;
        kv_shape sh = {.n_layers = 1, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .max_ctx = CTX};
        kv_cache *c = NULL;
        probe_bus *bus = NULL;
        probe_sub *sub = NULL;
        tailor_P[which] = NAN;
        if (!ok || kv_new(&o, &sh, &c) || probe_bus_new(&bus) ||
            probe_subscribe_callback(bus, PROBE_MASK(PROBE_METRIC), on_tailor_metric, &which, &sub)) {
            ok = 0;
        } else {
            static float k[N * KVD], v[N * KVD], qq[N * NH * HD], out[N * NH * HD];
            memset(k, 0, sizeof k);
            for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) v[i] = 1;
            memset(qq, 0, sizeof qq);
            for (int t = 0; t < N; t++)
                for (int hq = 0; hq < NH; hq++) qq[(t * NH + hq) * HD] = 1;
            for (int kh = 0; kh < NKV; kh++) k[(N - 1) * KVD + kh * HD] = (float)(log(19.0) * sqrt((double)HD));
            c->bus = bus;
            ok &= c->cls->append(c, 0, 0, N, k, k, v) == 0 && c->cls->attend(c, 0, 0, N, qq, out) == 0 &&
                  c->cls->end_prefill(c) == 0;
            quant[which] = (int)kv_stat(c, "q_layers");
            probe_unsubscribe(sub);
        }
        kv_free(c);
        probe_bus_free(bus);
    }
    char msg[200];
    snprintf(msg, sizeof msg, "tailorkv calibration, worked by hand: official rule P %.6f (want 0.5), causal rule "
             "P %.6f (want %.6f)", tailor_P[0], tailor_P[1], want[1]);
    test_cond(msg, ok && fabs(tailor_P[0] - want[0]) < 1e-5 && fabs(tailor_P[1] - want[1]) < 1e-5);
    test_cond("tailorkv calibration: qtau 0.6 lies between the two rules' P, so only the causal rule quantizes",
              quant[0] == 0 && quant[1] == 1);
}

static void test_tailorkv(void) {
    const int start = 4, recent = 4, channels = 3, budget = 20, topk = budget - start - recent, n0 = 60;
    /* a sparse layer */
    kv_cache *c = make_tailor(budget, "0", "0.2");
    kv_data kd;
    int rc = c ? feed_prompt(c, &kd, n0) : -1;
    float q[NH * HD], out[NH * HD];
    int ok_out = 1, ok_kept = 1;
    for (int s = 0; s < 3 && !rc; s++) {
        if ((rc = decode_step(c, &kd, q, out))) break;
        int T = kd.n;
        for (int kh = 0; kh < NKV; kh++) {
            double qm[HD], cs[HD];
            for (int i = 0; i < HD; i++) {
                double mx = 0, m = 0;
                for (int g = 0; g < GROUP; g++) m += q[(kh * GROUP + g) * HD + i] / GROUP;
                for (int t = 0; t < n0; t++) mx = fmax(mx, fabs(kd.k[t * KVD + kh * HD + i]));
                qm[i] = m;
                cs[i] = fabs((float)m) * mx;
            }
            int ch[HD], used[HD] = {0};
            for (int j = 0; j < channels; j++) {
                int b = -1;
                for (int i = 0; i < HD; i++)
                    if (!used[i] && (b < 0 || cs[i] > cs[b] + 1e-9)) b = i;
                used[b] = 1;
                ch[j] = b;
            }
            double ap[CTX];
            int taken[CTX] = {0}, pos[CTX], n = 0;
            for (int t = start; t < n0 - recent; t++) {
                ap[t] = 0;
                for (int j = 0; j < channels; j++) ap[t] += qm[ch[j]] * kd.k[t * KVD + kh * HD + ch[j]];
            }
            for (int i = 0; i < topk; i++) {
                int b = -1;
                for (int t = start; t < n0 - recent; t++)
                    if (!taken[t] && (b < 0 || ap[t] > ap[b] + 1e-6)) b = t;
                taken[b] = 1;
            }
            for (int t = 0; t < T; t++)
                if (t < start || taken[t] || t >= n0 - recent) pos[n++] = t;
            for (int g = 0; g < GROUP; g++) {
                int hq = kh * GROUP + g, got[CTX], unit;
                double o[HD];
                attend_set(&kd, hq, q, pos, n, o);
                for (int d = 0; d < HD; d++) ok_out &= fabs(o[d] - out[hq * HD + d]) < 1e-5;
                int ng = c->cls->kept(c, 0, hq, got, &unit);
                qsort(got, (size_t)ng, sizeof(int), cmp_int);
                ok_kept &= ng == n && !memcmp(got, pos, sizeof(int) * (size_t)n);
            }
        }
    }
    test_cond("tailorkv sparse layer decodes", rc == 0 && c && kv_stat(c, "q_layers") == 0);
    test_cond("tailorkv sparse layer equals a brute force: channel scores |mean q| x max|K|, top channels, "
              "approximate scores, top tokens, start + top + recent + generated", ok_out && ok_kept);
    test_cond("tailorkv counts channel and row fetches", c && kv_stat(c, "channel_bytes") > 0 &&
                                                             kv_stat(c, "row_bytes") > 0);
    kv_free(c);

    /* a quantized layer: attention over the low-bit cache */
    c = make_tailor(budget, "1", "0.2");
    rc = c ? feed_prompt(c, &kd, n0) : -1;
    int ok_q = 1;
    float Kq[CTX * KVD], Vq[CTX * KVD];
    for (int s = 0; s < 3 && !rc; s++) {
        int L = kd.n;
        if ((rc = decode_step(c, &kd, q, out))) break;
        lowbit_brute(&kd, L, 2, 4, 8, Kq, Vq);
        for (int hq = 0; hq < NH; hq++) {
            int kh = hq / GROUP;
            double w[CTX], mx = -INFINITY, z = 0, o[HD] = {0};
            for (int t = 0; t < kd.n; t++) {
                const float *kr = t < L ? Kq : kd.k;
                double dot = 0;
                for (int i = 0; i < HD; i++) dot += (double)q[hq * HD + i] * kr[t * KVD + kh * HD + i];
                w[t] = dot / sqrt((double)HD);
                mx = w[t] > mx ? w[t] : mx;
            }
            for (int t = 0; t < kd.n; t++) z += w[t] = exp(w[t] - mx);
            for (int t = 0; t < kd.n; t++)
                for (int i = 0; i < HD; i++) o[i] += w[t] / z * (t < L ? Vq : kd.v)[t * KVD + kh * HD + i];
            for (int i = 0; i < HD; i++) ok_q &= fabs(o[i] - out[hq * HD + i]) < 2e-5;
        }
    }
    test_cond("tailorkv quantized layer attends over the low-bit cache (brute force)",
              rc == 0 && ok_q && c && kv_stat(c, "q_layers") == 1);
    kv_free(c);

    /* auto: P is in [0, 1], so tau 0 quantizes every layer and tau 1 none */
    const char *taus[2] = {"0", "1"};
    for (int i = 0; i < 2; i++) {
        c = make_tailor(budget, "-1", taus[i]);
        rc = c ? feed_prompt(c, &kd, n0) : -1;
        char msg[120];
        snprintf(msg, sizeof msg, "tailorkv auto with qtau %s quantizes %s", taus[i], i ? "no layer" : "every layer");
        test_cond(msg, rc == 0 && kv_stat(c, "q_layers") == (i ? 0 : NL) && strstr(c->notice, "calibrated"));
        kv_free(c);
    }

    /* full budget, no quantized layer: dense */
    kv_data kd2;
    kv_cache *tc = make_tailor(4096, "0", "0.2"), *dc = make("dense", 0, NULL, NULL);
    rng = 9;
    rc = tc && dc ? feed_prompt(tc, &kd, 70) : -1;
    rng = 9;
    if (!rc) rc = feed_prompt(dc, &kd2, 70);
    int exact = 1;
    for (int s = 0; s < 3 && !rc; s++) {
        float q2[NH * HD], o2[NH * HD];
        uint64_t save = rng;
        rc = decode_step(tc, &kd, q, out);
        rng = save;
        if (!rc) rc = decode_step(dc, &kd2, q2, o2);
        exact &= !memcmp(out, o2, sizeof out);
    }
    test_cond("tailorkv at a budget covering the prompt, no quantized layer, attends bit for bit like dense",
              rc == 0 && exact && strstr(tc->notice, "covers the prompt"));
    test_cond("... and reports no topk (its sparse layers select nothing), not budget - start - recent",
              isnan(kv_stat(tc, "topk")));
    kv_free(tc);
    kv_free(dc);

    /* full budget with a quantized layer: that layer still attends its
     * low-bit cache, so it is not reported as exact */
    tc = make_tailor(4096, "1", "0.2");
    rc = tc ? feed_prompt(tc, &kd, 70) : -1;
    if (!rc) rc = decode_step(tc, &kd, q, out);
    int kept_pos[CTX], unit = 0, nk = rc ? -1 : tc->cls->kept(tc, 0, 0, kept_pos, &unit);
    size_t res_b = 0, off_b = 0;
    if (tc) tc->cls->bytes(tc, &res_b, &off_b);
    test_cond("tailorkv at a budget covering the prompt keeps its quantized layer quantized: only the exact residual "
              "rows are reported as kept, resident bytes below dense, and the notice names the layer",
              rc == 0 && nk > 0 && nk < kd.n && res_b < (size_t)2 * kd.n * KVD * sizeof(float) &&
                  strstr(tc->notice, "covers the prompt") && strstr(tc->notice, "quantized layers {0}"));
    kv_free(tc);

    test_tailor_calibration();

    kv_opts o;
    kv_opts_default(&o);
    snprintf(o.policy, sizeof o.policy, "tailorkv");
    kv_opts_set(&o, "residual", "100", 1);
    kv_shape sh = {.n_layers = NL, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .max_ctx = CTX};
    kv_cache *bad = NULL;
    test_cond("a tailorkv residual that is not a multiple of the group is refused",
              kv_new(&o, &sh, &bad) == SKV_EINVAL && !bad && strstr(skv_last_error(), "multiple of the group"));
    test_cond("channels of 0 are refused", kv_opts_set(&o, "channels", "0", 1) == SKV_EINVAL);
    test_cond("qtau above 1 is refused", kv_opts_set(&o, "qtau", "2", 1) == SKV_EINVAL);
}

/* ---- the oracle ------------------------------------------------------------------ */

typedef struct {
    int n;
    probe_ev_oracle last[NKV];
    float q_recall[NKV][GROUP], q_overlap[NKV][GROUP], q_err[NKV][GROUP];
    int q_kept[NKV][GROUP];
} oracle_log;

static void on_oracle(const probe_event *ev, void *user) {
    oracle_log *L = user;
    if (ev->kind != PROBE_ORACLE || ev->oracle.head >= NKV || ev->oracle.n_q != GROUP) return;
    int kh = ev->oracle.head;
    L->last[kh] = ev->oracle;
    for (int g = 0; g < GROUP; g++) {
        L->q_recall[kh][g] = ev->oracle.q_recall[g];
        L->q_overlap[kh][g] = ev->oracle.q_overlap[g];
        L->q_err[kh][g] = ev->oracle.q_out_err[g];
        L->q_kept[kh][g] = ev->oracle.q_kept[g];
    }
    L->n++;
}

/* The oracle's figures for query head hq by brute force. */
static void oracle_brute(const kv_data *kd, int hq, const float *q, const float *out, const int *pos, int n,
                         double *recall, double *overlap, double *err) {
    int kh = hq / GROUP, T = kd->n;
    double p[CTX], mx = -INFINITY, z = 0;
    for (int t = 0; t < T; t++) {
        double s = 0;
        for (int c = 0; c < HD; c++) s += (double)q[hq * HD + c] * kd->k[t * KVD + kh * HD + c];
        p[t] = s / sqrt((double)HD);
        mx = p[t] > mx ? p[t] : mx;
    }
    for (int t = 0; t < T; t++) z += p[t] = exp(p[t] - mx);
    for (int t = 0; t < T; t++) p[t] /= z;
    double kept = 0, top = 0;
    int in_top[CTX] = {0}, hit = 0;
    for (int i = 0; i < n; i++) kept += p[pos[i]];
    for (int i = 0; i < n; i++) { /* the exact top-n by repeated max */
        int b = -1;
        for (int t = 0; t < T; t++)
            if (!in_top[t] && (b < 0 || p[t] > p[b])) b = t;
        in_top[b] = 1;
        top += p[b];
    }
    for (int i = 0; i < n; i++) hit += in_top[pos[i]];
    *recall = kept / top;
    *overlap = (double)hit / n;
    double o[HD], num = 0, den = 0;
    for (int c = 0; c < HD; c++) o[c] = 0;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < HD; c++) o[c] += p[t] * kd->v[t * KVD + kh * HD + c];
    for (int c = 0; c < HD; c++) {
        num += (out[hq * HD + c] - o[c]) * (out[hq * HD + c] - o[c]);
        den += o[c] * o[c];
    }
    *err = sqrt(num / den);
}

/* ---- the shared row store ------------------------------------------------ */

typedef struct {
    int before;
    float *k, *mn, *v, *mx;
    int after;
} rows_layer;

static void test_rows(void) {
    enum { NL = 2, H = 2, D = 4, KVD = H * D, P = 16, CTX = 300 };
    kv_shape sh = {.n_layers = NL, .n_heads = 4, .n_kv_heads = H, .head_dim = D, .max_ctx = CTX};
    rows_layer L[NL] = {{.before = 11, .after = 12}, {.before = 21, .after = 22}};
    static const kv_rows_array arr[] = {
        {offsetof(rows_layer, k), KV_ROWS_KEYS},
        {offsetof(rows_layer, v), KV_ROWS_VALUES},
        {offsetof(rows_layer, mn), KV_ROWS_PAGE_MIN},
        {offsetof(rows_layer, mx), KV_ROWS_PAGE_MAX},
    };
    kv_rows s;
    kv_rows_init(&s, "rowtest", &sh, L, sizeof L[0], arr, 4, P);
    static float K[NL][CTX * KVD], V[NL][CTX * KVD];
    for (int l = 0; l < NL; l++) {
        fill(K[l], CTX * KVD, 2.0f);
        fill(V[l], CTX * KVD, 1.0f);
    }
    /* pieces that cross pages and the first growth (256 rows) */
    int cuts[] = {0, 5, 16, 40, 41, 250, 260, 299}, n_cuts = sizeof cuts / sizeof cuts[0], ok = 1;
    for (int i = 0; i + 1 < n_cuts; i++)
        for (int l = 0; l < NL; l++) {
            int t0 = cuts[i], n = cuts[i + 1] - t0;
            ok &= kv_rows_append(&s, l, t0, n, K[l] + t0 * KVD, V[l] + t0 * KVD) == 0;
        }
    test_cond("row store: every append in pieces accepted, grown past 256 rows", ok && s.cap >= 299 && s.n == 299);
    int T = 299, same = 1, bounds = 1;
    for (int l = 0; l < NL; l++) {
        same &= !memcmp(L[l].k, K[l], sizeof(float) * T * KVD) && !memcmp(L[l].v, V[l], sizeof(float) * T * KVD);
        for (int j = 0; j < (T + P - 1) / P; j++)
            for (int c = 0; c < KVD; c++) {
                float lo = INFINITY, hi = -INFINITY;
                for (int t = j * P; t < (j + 1) * P && t < T; t++) {
                    lo = fminf(lo, K[l][t * KVD + c]);
                    hi = fmaxf(hi, K[l][t * KVD + c]);
                }
                bounds &= L[l].mn[j * KVD + c] == lo && L[l].mx[j * KVD + c] == hi;
            }
    }
    test_cond("row store: keys and values copied into each layer's own members", same);
    test_cond("row store: page min and max of each layer equal a brute force", bounds);
    test_cond("row store: the layer struct's other members untouched",
              L[0].before == 11 && L[0].after == 12 && L[1].before == 21 && L[1].after == 22);
    int rc = kv_rows_append(&s, 0, 299, 2, K[0], V[0]);
    test_cond("row store: an append past the context is refused with the policy's name",
              rc == SKV_ERANGE && strstr(skv_last_error(), "rowtest: position 300 is past the context of 300") &&
                  s.n == 299);
    test_cond("row store: attends within what layer 0 holds pass the check",
              kv_rows_check(&s, 1, 0, 299) == 0 && kv_rows_check(&s, 1, 298, 1) == 0);
    rc = kv_rows_check(&s, 1, 298, 2);
    test_cond("row store: an attend past what is stored is refused",
              rc == SKV_EINVAL && strstr(skv_last_error(), "rowtest: layer 1 attends up to position 299, only 299 stored"));
    test_cond("row store: a negative position is refused", kv_rows_check(&s, 0, -1, 1) == SKV_EINVAL);
    kv_rows_free(&s);
    test_cond("row store: freed members are cleared", !L[0].k && !L[0].v && !L[1].mn && !L[1].mx);

    /* every policy's create: heads that do not split, a negative budget */
    const char *peers[] = {"quest", "freekv", "specache", "tailorkv"};
    for (size_t i = 0; i < sizeof peers / sizeof peers[0]; i++) {
        kv_opts o;
        kv_opts_default(&o);
        snprintf(o.policy, sizeof o.policy, "%s", peers[i]);
        kv_shape bad = sh;
        bad.n_heads = 3;
        kv_cache *c = NULL;
        char want[96];
        snprintf(want, sizeof want, "%s: 3 query heads do not split into 2 KV heads", peers[i]);
        char what[128];
        rc = kv_new(&o, &bad, &c);
        snprintf(what, sizeof what, "%s's create: heads that do not split are refused", peers[i]);
        test_cond(what, rc == SKV_EINVAL && !c && strstr(skv_last_error(), want));
        o.budget = -1;
        snprintf(want, sizeof want, "%s: the budget must be >= 0 (got -1)", peers[i]);
        rc = kv_new(&o, &sh, &c);
        snprintf(what, sizeof what, "%s's create: a negative budget is refused", peers[i]);
        test_cond(what, rc == SKV_EINVAL && !c && strstr(skv_last_error(), want));
        o.budget = 64;
        rc = kv_new(&o, &sh, &c);
        int stored = c && c->cls->append(c, 0, 0, 1, K[0], K[0], V[0]) == 0 &&
                     c->cls->append(c, 0, 299, 2, K[0], K[0], V[0]) == SKV_ERANGE;
        snprintf(want, sizeof want, "%s: position 300 is past the context of 300", peers[i]);
        snprintf(what, sizeof what, "%s's create: a good shape gives a cache that refuses appends past the context",
                 peers[i]);
        test_cond(what, rc == 0 && stored && strstr(skv_last_error(), want));
        kv_free(c);
    }
}

static void test_oracle(void) {
    probe_bus *bus = NULL;
    probe_sub *sub = NULL;
    oracle_log log = {0};
    if (probe_bus_new(&bus) || probe_subscribe_callback(bus, PROBE_MASK(PROBE_ORACLE), on_oracle, &log, &sub)) {
        test_cond("a probe bus for the oracle", 0);
        return;
    }
    kv_opts o;
    kv_opts_default(&o);
    o.watch_begin = 20;
    o.watch_end = 24;
    kv_cache *inner = make("quest", 32, "dense_layers", "0"), *c = NULL, *twin = make("quest", 32, "dense_layers", "0");
    int rc = inner && twin ? kv_oracle_new(inner, &o, &c) : -1;
    if (rc) {
        kv_free(inner);
        test_cond("the oracle wraps a policy", 0);
        probe_bus_free(bus);
        return;
    }
    c->bus = inner->bus = bus;
    kv_data kd, kd2;
    rng = 11;
    rc = feed_prompt(c, &kd, 120);
    rng = 11;
    if (!rc) rc = feed_prompt(twin, &kd2, 120);
    float q[NH * HD], out[NH * HD], q2[NH * HD], out2[NH * HD];
    int ok = 1, unchanged = 1;
    double worst = 0;
    for (int s = 0; s < 3 && !rc; s++) {
        uint64_t save = rng;
        if ((rc = decode_step(c, &kd, q, out))) break;
        rng = save;
        if ((rc = decode_step(twin, &kd2, q2, out2))) break;
        unchanged &= !memcmp(out, out2, sizeof out);
        for (int hq = 0; hq < NH; hq++) {
            int pos[CTX], unit;
            int n = inner->cls->kept(inner, 0, hq, pos, &unit);
            double r, ov, e;
            oracle_brute(&kd, hq, q, out, pos, n, &r, &ov, &e);
            int kh = hq / GROUP, g = hq % GROUP;
            double d = fmax(fabs(r - log.q_recall[kh][g]), fmax(fabs(ov - log.q_overlap[kh][g]), fabs(e - log.q_err[kh][g])));
            worst = d > worst ? d : worst;
            ok &= log.q_kept[kh][g] == n;
        }
    }
    test_cond("the oracle scores every decode step, one event per KV head", rc == 0 && log.n == 3 * NKV);
    char msg[160];
    snprintf(msg, sizeof msg, "the oracle's recall, overlap and output error equal a brute force (worst diff %.2g)", worst);
    test_cond(msg, ok && worst < 2e-5);
    test_cond("the wrapped policy's output is unchanged by the oracle", unchanged);
    test_cond("the oracle's needle fields cover the watched span",
              log.last[0].needle_len == 4 && log.last[0].needle_rank >= 0 && log.last[0].needle_rank < kd.n &&
                  log.last[0].ctx == kd.n && log.last[0].unit == 16);
    kv_oracle_summary sum;
    test_cond("the oracle keeps running means", kv_oracle_get(c, -1, &sum) == 1 && sum.n == (uint64_t)3 * NH &&
                                                    sum.recall > 0 && sum.recall <= 1 && sum.overlap <= 1);
    test_cond("kv_oracle_get refuses a cache that is no oracle", kv_oracle_get(twin, -1, &sum) == 0 && sum.n == 0);
    kv_free(c);
    kv_free(twin);

    /* around a policy that attends everything: recall 1, overlap 1, error 0 */
    log.n = 0;
    inner = make("dense", 0, NULL, NULL);
    rc = inner ? kv_oracle_new(inner, &o, &c) : -1;
    if (!rc) {
        c->bus = inner->bus = bus;
        rc = feed_prompt(c, &kd, 60);
        if (!rc) rc = decode_step(c, &kd, q, out);
    }
    int full = rc == 0 && log.n == NKV;
    for (int kh = 0; kh < NKV && full; kh++)
        full &= log.last[kh].recall == 1 && log.last[kh].overlap == 1 && log.last[kh].out_err < 1e-5 &&
                log.last[kh].n_kept == kd.n && log.last[kh].n_gen == 1;
    test_cond("around dense the oracle reports recall 1, overlap 1, no error, every position kept", full);
    if (!rc) kv_free(c);
    probe_unsubscribe(sub);
    probe_bus_free(bus);
}

/* ---- model level ---------------------------------------------------------------- */

static double logits_vs_dense(skv_model *m, const kv_opts *kvo, int n, int n_dec, int *rc_out) {
    session_opts so;
    skv_session *a = NULL, *b = NULL;
    session_opts_default(&so);
    so.ctx = n + n_dec + 1;
    int rc = session_new(m, &so, &a);
    so.kv = *kvo;
    if (!rc) rc = session_new(m, &so, &b);
    int V = m->cfg.vocab;
    int32_t *ids = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(3 + ((uint64_t)i * 7919u) % (uint64_t)(V - 3));
    double worst = 0;
    if (!rc) rc = session_prefill(a, ids, n, NULL, NULL);
    if (!rc) rc = session_prefill(b, ids, n, NULL, NULL);
    for (int t = 0; t < n_dec && !rc; t++) {
        int tok = sampler_argmax(session_logits(a), V);
        if (!(rc = session_decode(a, tok)) && !(rc = session_decode(b, tok))) {
            double e = test_rel_l2(session_logits(b), session_logits(a), V);
            worst = e > worst ? e : worst;
        }
    }
    free(ids);
    session_free(a);
    session_free(b);
    *rc_out = rc;
    return worst;
}

static void test_model(const char *file) {
    const char *path = test_shared(file);
    char msg[300];
    if (!path) {
        snprintf(msg, sizeof msg, "%s: ../shared/models not found (set SKV_SHARED)", file);
        test_skip(msg);
        return;
    }
    skv_model *m = NULL;
    if (model_load(path, &m)) {
        snprintf(msg, sizeof msg, "%s loads (%s)", file, skv_last_error());
        test_cond(msg, 0);
        return;
    }
    /* tol: 0 where a full budget takes the dense path itself, fp32 noise
     * where every row is attended exact through the policy's own path */
    static const struct { const char *policy, *opts[4][2]; double tol; } cases[] = {
        {"quest", {{"dense_layers", "0"}}, 0},
        {"freekv", {{"dense_layers", "0"}, {"page", "16"}, {"sink", "16"}, {"window", "16"}}, 0},
        {"specache", {{"residual", "64"}}, 1e-5},
        {"tailorkv", {{"qlayers", "0"}, {"start", "16"}, {"recent", "16"}}, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kv_opts o;
        kv_opts_default(&o);
        snprintf(o.policy, sizeof o.policy, "%s", cases[i].policy);
        for (int j = 0; j < 4 && cases[i].opts[j][0]; j++) kv_opts_set(&o, cases[i].opts[j][0], cases[i].opts[j][1], 1);
        o.budget = 4096;
        int rc;
        double e = logits_vs_dense(m, &o, 200, 12, &rc);
        snprintf(msg, sizeof msg, "%s: %s at a full budget gives dense's logits (worst rel L2 %.2g)", file,
                 cases[i].policy, e);
        test_cond(msg, rc == 0 && e <= cases[i].tol);
        o.budget = 64;
        e = logits_vs_dense(m, &o, 200, 12, &rc);
        snprintf(msg, sizeof msg, "%s: %s at a budget of 64 runs and differs from dense (worst rel L2 %.2g)", file,
                 cases[i].policy, e);
        test_cond(msg, rc == 0 && e > 0 && e < 1);
    }
    model_free(m);
}

int main(void) {
    test_page_ops();
    test_quest();
    test_freekv();
    test_kivi();
    test_specache();
    test_tailorkv();
    test_rows();
    test_oracle();
    test_model("models/stories260k.gguf");
    test_model("models/mini-smollm-f32.gguf");
    return test_report("test_peers");
}
