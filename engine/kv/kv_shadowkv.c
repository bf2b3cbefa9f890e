/* kv_shadowkv.c: the ShadowKV KV policy (Sun et al., ICML 2025) on the CPU.
 *
 * During the prompt it keeps dense keys and values and attends exactly.
 * At end_prefill, per layer: a truncated SVD of the pre-RoPE keys of all KV
 * heads side by side (U shared, Σ·Vᵀ split per head); post-RoPE chunk
 * landmarks and cosine minima; per KV head the chunks with the lowest
 * minimum stay dense as outliers, the last `local` chunks and the s mod c
 * tail stay dense as the local window, and the values of every other chunk
 * move to an offload store in bf16 (slow memory; each read is a counted
 * fetch). U is kept in bf16 and the landmarks in IEEE half, on every
 * backend: half the bytes of f32, widened as they are read. The f32_state
 * option (CPU only) keeps U and the store in f32 instead, for checks that
 * need the keep-everything configuration to equal dense.
 * Each decode step, per layer and KV head: landmark scores (softmax per
 * query head, max over the GQA group), top-k chunks, a chunk cache that keeps
 * last step's selection (misses fetch V and rebuild K = RoPE(U·ΣVᵀ)), and
 * exact attention over [outliers | selected chunks | local | generated].
 *
 * The rows attention reads live in one buffer per (layer, KV head) in that
 * order, and the cache's slots are rows of it, so a hit moves nothing and a
 * step allocates nothing; decode work is O(budget) plus O(s/c) scoring.
 * The stages are the pure functions of shadowkv_ops.c.
 *
 * Needle watch (kv_opts watch_begin/end): for a span of prompt tokens it
 * emits PROBE_NEEDLE events, at the end of prefill (each chunk's part and
 * cos-min, the rank-r error of the span's keys) and per decode step, layer
 * and KV head (landmark rank, selection, and with the oracle the exact,
 * sparse and ideal attention mass on the span and the output error). It
 * reads the same buffers attention used and changes nothing.
 *
 * On a device backend with the batched step ops (sk_step_*), a decode step
 * of a layer runs for every sequence of a batch at once (step_batch): a job
 * table of every (sequence, KV head) in the device's memory, and six
 * launches a layer whatever the batch, the heads or the budgets (append
 * with the RoPE of q and k, which the forward leaves to it: step_ropes;
 * logits; select: softmax statistics and group max, top-k and books; the
 * fetch on the fetch stream; the rebuild; attention with its merge); the
 * books come back in each cache's pack at the step's end, as with one
 * sequence. */
#include "kv_shadowkv.h"
#include "kmath.h"
#include "kv.h"
#include "probe.h"
#include "shadowkv_ops.h"
#include "skv.h"
#include "vec.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void *K, *V;           /* (cap, d) attention rows: [outliers | cache slots | local | generated], of
                              type kv_sk.row_elt: bf16 (rounded to nearest even as written), or f32 */
    int cap;               /* rows allocated */
    int *cand;             /* (n_cand) prompt chunk id of each candidate, ascending */
    /* (n_cand, d) landmarks of the candidates in IEEE half, on every backend
     * (a device's in its memory, for its score op): half the bytes the
     * decode reads to score them, a rounding far below a landmark's own
     * error as a stand-in for its chunk's keys. */
    uint16_t *lm_h;
    int *outl;             /* (n_out) outlier chunk ids, ascending */
    shadowkv_cache cache;  /* candidate held by each of the k slots */
} sk_head;

typedef struct {
    float *kpre;           /* (cap, kvd) prompt pre-RoPE keys; freed at end_prefill */
    float *k, *v;          /* (cap, kvd) prompt post-RoPE keys and values; after end_prefill
                              kept, and extended with generated tokens, only in oracle mode */
    int cap, n;            /* rows allocated, rows filled */
    void *U;               /* (s, r) left singular vectors, shared by the KV heads: bf16, or f32
                              with so.f32_state (sk_u_bytes) */
    float *SVt;            /* (h, r, d) Σ·Vᵀ split per KV head */
    float *Vt;             /* (r, kvd) right singular vectors (ShadowKV+ only) */
    float rel_err;         /* ‖K − U·ΣVᵀ‖/‖K‖ of the pre-RoPE keys */
    int n_gen;             /* generated tokens appended */
    sk_head *head;         /* (h) */
    /* a device backend with the fused books (be->sk_books): in its memory,
     * every head's candidates (h, n_cand) and chunk cache (cache_d: slot_id
     * (h, k), where (h, n_cand), stamp (h, k), epoch (h), as ints) */
    int *cand_d, *cache_d;
    unsigned ver;          /* bumped when the heads' K and V rows move (grow_heads): a batch's job table
                              rereads them */
} sk_layer;

/* Per KV head decode scratch, reused by every layer (layers run in turn). */
typedef struct {
    float *score;          /* (n_cand) landmark scores */
    float *tmp;            /* (group, 2 * n_cand) the scoring scratch of each query head */
    float *gscore;         /* (group, n_cand) landmark scores of each query head of the group (CPU) */
    float *score_d;        /* (n_cand) and (k): the scores and the selection in a device backend's */
    int *sel_d;            /* memory (NULL on the CPU, where score and sel are computed in place) */
    int *sel;              /* (k) selected candidates, best first */
    int *sel_id;           /* (k) their prompt chunk ids */
    float *sel_score;      /* (k) their scores */
    int *slot_of, *miss;   /* (k) cache slot of each sel[i]; indices i that missed */
    int *g_idx;            /* (k) store blocks of the misses, for the backend's gather */
    size_t *g_off;         /* (k) their destination offsets in the head's V rows */
    int n_miss;
    /* oracle mode only */
    float *p;              /* (max_ctx) exact attention probabilities of one query head */
    float *mass;           /* (n_chunks) max over the group of each chunk's exact mass */
    float *cand_key;       /* (n_cand) */
    int *order, *rank_tmp; /* (n_cand) */
    int *rank_exact, *rank_lm; /* (n_chunks) rank among candidates, -1: not a candidate */
    float recall_sel, recall_sparse;
} sk_scratch;

/* The policy's own options (kv_opt_defs below), read once at creation. */
typedef struct {
    int rank, chunk, outliers, local, plus, overlap;
    int f32_state;         /* 1: U and the offload store in f32 (CPU only), as they were before bf16 */
} sk_opts;

/* The fetch stream: a thread of its own that copies the missed chunks'
 * values out of the offload store (RAM, or a file with --offload-file)
 * while the compute threads rebuild the missed keys, as ShadowKV's copy
 * stream overlaps its compute stream on a GPU. One job at a time: a layer. */
typedef struct {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, quit;
    int pending;           /* layer to fetch, -1: idle */
    double pt0, pt1;       /* probe times of the last job (span) */
    double seconds;        /* wall time spent fetching, all jobs */
} sk_fetcher;

typedef struct {
    kv_cache base;
    kv_opts o;             /* the shared options (budget, oracle, needle watch) */
    sk_opts so;
    int h, d, kvd, group;  /* KV heads, head dim, h*d, query heads per KV head */
    int prefilled;
    int s, c, n_chunks;    /* prompt tokens, tokens per chunk, full chunks */
    int local_start;       /* first chunk of the local window */
    int n_local;           /* local window tokens: s - local_start*c */
    int n_out, n_cand, k, r;
    int row_slot, row_local, row_gen; /* first row of each part in sk_head K/V */
    int row_elt;           /* the type of sk_head K/V: SKV_ELT_BF16, or SKV_ELT_F32 with so.f32_state or
                              without candidates (dense) */
    float *rope_cs, *rope_sn; /* (s, rope_dim/2) RoPE tables for rebuilt keys */
    /* Every layer's U (s, r) in bf16 and every KV head's candidate
     * landmarks (lm_rows, d) in IEEE half, in two allocations (sk_layer.U
     * and sk_head.lm_h point into them), on the CPU in huge pages
     * (skv_malloc_huge): the decode reads U a chunk at a random place and
     * scans the landmarks a layer at a time, and with 4 KiB pages both
     * waited on page walks. */
    void *u_arena;         /* sk_u_bytes a value */
    uint16_t *lm_arena;
    shadowkv_store store;  /* V of the candidates in bf16 (f32 with so.f32_state): block
                              (layer*h + kh)*n_cand + i is (c, d) */
    sk_layer *L;           /* (n_layers) */
    sk_scratch *scr;       /* (h) */
    float *proj, *coef;    /* (kvd), (r): ShadowKV+ scratch */
    sk_fetcher fx;         /* the fetch stream (so.overlap) */
    int *rb_kh, *rb_m;     /* (h*k) the misses of a layer as (KV head, miss) pairs, for the rebuild */
    /* the fused device books (be->sk_books): one buffer in the device's
     * memory, read back once a layer into pack_h: scores (h, n_cand) as
     * floats, then sel, slot_of, miss (h, k) and n_miss (h) as ints; and
     * the heads' K and V row pointers handed to the fused ops */
    float *pack_d;         /* (n_layers) packs, one a layer */
    void *pack_h;          /* the same in host_alloc's (pinned) memory, copied without a wait */
    size_t pack_bytes;     /* one layer's */
    int pend_first, pend_n; /* layers of the step whose books are queued, not yet read (sk_settle) */
    int pend_step;         /* that step's number, for its events */
    uint64_t pend_sync;    /* sk_syncs when the last of them was queued: a sync since has done them */
    uint64_t id;           /* distinct for every cache of the process (a batch's table names its caches) */
    struct sk_group *grp;  /* the device job table of the last batch step this cache led (step_batch) */
    uint16_t **kp, **vp;   /* (h) the heads' K and V rows for the fused ops (bf16: a device refuses f32_state) */
    int att_parts;         /* the most parts a KV head's attention rows split into (about two tasks a thread) */
    float *att_po;         /* (h*att_parts, group, d) partial results of the attention tasks, */
    float *att_pm, *att_pl; /* (h*att_parts, group) and their maxima and sums (attend_group's partials) */
    double fetch_seconds;  /* time spent fetching values (either stream) */
    double attn_seconds;   /* time in decode attention (select, fetch, rebuild, attend), all layers */
    double stage_seconds[3]; /* its wall time by stage: select, fetch and rebuild, sparse attention */
    double dense_bytes;    /* K and V bytes exact attention would have read in those steps */
    int steps;             /* decode steps (layer-0 attends) */
    uint64_t hits, misses;
    uint64_t step_hits, step_misses, step_fetches, step_fetch_bytes;
    double recall_sel_sum, recall_sparse_sum;
    uint64_t recall_n;
    /* needle watch (nw == 0: off) */
    int wb, we, nw;        /* prompt token span [wb, we), chunks it touches */
    int *wchunk;           /* (nw) chunk ids, ascending; the last may be the partial tail chunk */
    float *w_err;          /* (n_layers, h) rank-r relative error of the span's pre-RoPE keys */
    float *w_cm;           /* (n_layers, h, nw) cos-min of the span's chunks; NaN past the full chunks */
    int *w_part, *w_rank, *w_sel, *w_rexact; /* (nw) emission scratch */
    float *w_mass;         /* (nw) */
    int *w_rowbase;        /* (n_chunks + 1) first attention row of each prompt chunk, -1: not kept */
    float *w_p;            /* (max_ctx) probabilities of one query head */
    float *w_o;            /* (head_dim) exact attention output of one query head */
} kv_sk;


/* Appends "; msg" (or msg) to the user-visible notice. */
static void notice_add(kv_sk *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void notice_add(kv_sk *c, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    size_t len = strlen(c->base.notice);
    snprintf(c->base.notice + len, sizeof c->base.notice - len, "%s%s", len ? "; " : "", buf);
}

/* Caches made (their ids). */
static uint64_t sk_ids;

/* The full syncs sk_settle made of each device backend: a cache whose books
 * were queued before the last of them needs no sync of its own (a batch's
 * caches settle with one). */
#define SK_SYNC_BACKENDS 4
static struct {
    const skv_backend *be;
    uint64_t n;
} sk_syncs[SK_SYNC_BACKENDS];
static pthread_mutex_t sk_syncs_mu = PTHREAD_MUTEX_INITIALIZER;

/* be's sync counter (NULL when the table is full: every settle syncs). */
static uint64_t *sync_count(const skv_backend *be) {
    uint64_t *n = NULL;
    pthread_mutex_lock(&sk_syncs_mu);
    for (int i = 0; i < SK_SYNC_BACKENDS && !n; i++) {
        if (!sk_syncs[i].be) sk_syncs[i].be = be;
        if (sk_syncs[i].be == be) n = &sk_syncs[i].n;
    }
    pthread_mutex_unlock(&sk_syncs_mu);
    return n;
}

static uint64_t syncs_now(const skv_backend *be) {
    uint64_t *n = sync_count(be);
    return n ? __atomic_load_n(n, __ATOMIC_ACQUIRE) : 0;
}

static void group_free(kv_sk *c);

/* ---- memory: the backend's (a device's, or host memory on the CPU) ---------- */

/* 1 when the backend computes on memory of its own (a GPU): buffers come
 * from its alloc, copies go through its copy ops, what the host must read
 * (scores, the selection, cosine minima) is downloaded, and the decode
 * stages are queued in order instead of spread over OpenMP threads. */
static inline int sk_dev(const kv_sk *c) { return c->base.shape.be != &skv_backend_cpu; }
/* Bytes a value of U (and of the offload store): 2 (bf16), 4 with f32_state. */
static inline int sk_u_bytes(const kv_sk *c) { return c->so.f32_state ? 4 : 2; }
/* Bytes a value of the heads' attention rows (row_elt). */
static inline size_t sk_row_bytes(const kv_sk *c) { return c->row_elt == SKV_ELT_F32 ? 4 : 2; }
/* Row i of a head's K or V rows. */
static inline void *sk_row(const kv_sk *c, void *rows, size_t i) {
    return (char *)rows + i * c->d * sk_row_bytes(c);
}
/* The decode books stay in a device backend's memory (its fused ops). */
static inline int sk_fused(const kv_sk *c) {
    const skv_backend *be = c->base.shape.be;
    return sk_dev(c) && be->sk_books && be->sk_gather_misses && be->sk_rebuild_misses && c->n_cand > 0 && c->k > 0;
}

/* The end of prefill on a device backend keeps everything in its memory:
 * U packed to bf16 there (pack_h), the landmarks, outliers and offloaded
 * values gathered in a few launches a layer (sk_gather_chunks, rounding as
 * it stores). A device backend without them cannot run the policy. */
static inline int sk_dev_ops(const kv_sk *c) {
    const skv_backend *be = c->base.shape.be;
    return sk_dev(c) && be->pack_h && be->sk_gather_chunks;
}

static void *sk_alloc(kv_sk *c, size_t bytes) {
    return sk_dev(c) ? c->base.shape.be->alloc(bytes) : skv_malloc(bytes);
}

/* sk_alloc for a large buffer read in scattered pieces: huge pages on the CPU. */
static void *sk_alloc_big(kv_sk *c, size_t bytes) {
    return sk_dev(c) ? c->base.shape.be->alloc(bytes) : skv_malloc_huge(bytes);
}

/* Landmark rows a KV head keeps: its candidates (at least 1). */
static size_t lm_rows(const kv_sk *c) { return c->n_cand ? (size_t)c->n_cand : 1; }

static void sk_release(kv_sk *c, void *p) {
    if (!p) return;
    if (sk_dev(c)) c->base.shape.be->free(p);
    else free(p);
}

/* p grown from old to want bytes, its content kept; NULL when out of
 * memory (p is then left as it was). */
static void *sk_grow(kv_sk *c, void *p, size_t old, size_t want) {
    if (!sk_dev(c)) return realloc(p, want);
    void *q = c->base.shape.be->alloc(want);
    if (!q) return NULL;
    if (p && old) c->base.shape.be->copy(q, p, old);
    sk_release(c, p);
    return q;
}

/* n rows of d floats (src, contiguous) to a head's rows from row i,
 * rounded to bf16 when row_elt is. */
static void sk_put_rows(kv_sk *c, void *rows, size_t i, const float *src, int n) {
    const skv_backend *be = c->base.shape.be;
    size_t len = (size_t)n * c->d;
    if (c->row_elt == SKV_ELT_F32) be->copy(sk_row(c, rows, i), src, sizeof(float) * len);
    else be->pack_h(src, len, sk_row(c, rows, i), SKV_ELT_BF16);
}

/* rows rows of n floats, src rows sstride floats apart, dst rows dstride apart. */
static void sk_copy_rows(kv_sk *c, float *dst, size_t dstride, const float *src, size_t sstride, int n, int rows) {
    if (rows <= 0) return;
    c->base.shape.be->copy2d(dst, dstride * sizeof(float), src, sstride * sizeof(float), (size_t)n * sizeof(float),
                             (size_t)rows);
}

/* ---- prefill: dense ------------------------------------------------------ */

/* Grows the dense rows of layer L to hold need positions (the prompt; in
 * oracle mode also the generated tokens, without pre-RoPE keys). */
static int grow_dense(kv_sk *c, sk_layer *L, int need) {
    if (need <= L->cap) return 0;
    int cap, rc = kv_grow_cap("shadowkv", L->cap, need, c->base.shape.max_ctx, &cap);
    if (rc) return rc;
    size_t row = (size_t)c->kvd * sizeof(float), old = row * L->cap, want = row * cap;
    float *p;
    if (!c->prefilled) {
        if (!(p = sk_grow(c, L->kpre, old, want))) goto oom;
        L->kpre = p;
    }
    if (!(p = sk_grow(c, L->k, old, want))) goto oom;
    L->k = p;
    if (!(p = sk_grow(c, L->v, old, want))) goto oom;
    L->v = p;
    L->cap = cap;
    return 0;
oom: /* the buffers grown so far keep their new size, within the old cap */
    return skv_error(SKV_ENOMEM, "shadowkv: out of memory for %d positions", cap);
}

/* Exact causal attention over the dense prompt rows (before end_prefill):
 * the same batched kernel the dense policy uses. */
static void attend_dense(kv_sk *c, sk_layer *L, int pos, int n, const float *q, float *out) {
    const kv_shape *sh = &c->base.shape;
    sh->be->attend_causal(q, n, pos, sh->n_heads, sh->n_kv_heads, sh->head_dim, L->k, L->v, c->kvd,
                          (size_t)sh->head_dim, out);
}

/* ---- decode: appends ------------------------------------------------------ */

/* Makes room for one more generated row in every head of layer L. */
static int grow_heads(kv_sk *c, sk_layer *L) {
    int need = c->row_gen + L->n_gen + 1;
    for (int kh = 0; kh < c->h; kh++) {
        sk_head *H = &L->head[kh];
        if (need <= H->cap) continue;
        int cap = H->cap * 2 > need ? H->cap * 2 : need + 32;
        size_t old = sk_row_bytes(c) * H->cap * c->d, want = sk_row_bytes(c) * cap * c->d;
        void *K = sk_grow(c, H->K, old, want);
        if (K) H->K = K;
        void *V = K ? sk_grow(c, H->V, old, want) : NULL;
        if (!V) return skv_error(SKV_ENOMEM, "shadowkv: out of memory for %d generated tokens", L->n_gen + 1);
        H->V = V;
        H->cap = cap;
        L->ver++;
    }
    return 0;
}

static int sk_append(kv_cache *base, int layer, int pos, int n, const float *k_pre, const float *k, const float *v) {
    kv_sk *c = (kv_sk *)base;
    sk_layer *L = &c->L[layer];
    size_t row = (size_t)c->kvd;
    int rc;
    if (!c->prefilled) {
        if (pos != L->n)
            return skv_error(SKV_EINVAL, "shadowkv: layer %d appends at position %d, expected %d", layer, pos, L->n);
        if ((rc = grow_dense(c, L, pos + n))) return rc;
        const skv_backend *be = base->shape.be;
        be->copy(L->kpre + pos * row, k_pre, sizeof(float) * row * n);
        be->copy(L->k + pos * row, k, sizeof(float) * row * n);
        be->copy(L->v + pos * row, v, sizeof(float) * row * n);
        L->n += n;
        return 0;
    }
    if (n != 1)
        return skv_error(SKV_EUNSUPPORTED,
                         "shadowkv: %d tokens appended after the prompt; decoding takes one token at a time "
                         "(a second prompt segment needs a new session)", n);
    if (pos != c->s + L->n_gen)
        return skv_error(SKV_EINVAL, "shadowkv: layer %d appends at position %d, expected %d", layer, pos,
                         c->s + L->n_gen);
    if ((rc = grow_heads(c, L))) return rc;
    if (c->o.oracle) {
        if ((rc = grow_dense(c, L, pos + 1))) return rc;
        base->shape.be->copy(L->k + pos * row, k, sizeof(float) * row);
        base->shape.be->copy(L->v + pos * row, v, sizeof(float) * row);
        L->n = pos + 1;
    }
    const float *key = k;
    if (c->so.plus) { /* ShadowKV+: project the pre-RoPE key onto the prefill basis, then rotate */
        base->shape.be->project(L->Vt, c->r, c->kvd, k_pre, c->proj, c->coef);
        base->shape.be->rope(base->shape.rope, c->proj, 1, c->h, pos);
        key = c->proj;
    }
    int r = c->row_gen + L->n_gen;
    for (int kh = 0; kh < c->h; kh++) {
        sk_put_rows(c, L->head[kh].K, (size_t)r, key + (size_t)kh * c->d, 1);
        sk_put_rows(c, L->head[kh].V, (size_t)r, v + (size_t)kh * c->d, 1);
    }
    L->n_gen++;
    return 0;
}

/* ---- decode: selection, fetch, rebuild, attention -------------------------- */

/* Landmark logits of block b (of nb) of KV head kh's candidates, for its
 * whole query group: each landmark row read once for the group, and the
 * (KV head, block) tasks spread over the threads (3 KV heads on 2 threads
 * would leave one idle a third of the time). Blocks start at multiples of 4,
 * so the logits have the bits of the backend's score over all of them. */
static void score_block(kv_sk *c, sk_layer *L, int kh, int b, int nb, const float *q) {
    sk_scratch *S = &c->scr[kh];
    int n = c->n_cand;
    int j0 = (int)((long long)n * b / nb) & ~3, j1 = b + 1 == nb ? n : (int)((long long)n * (b + 1) / nb) & ~3;
    shadowkv_score_logits_h(q + (size_t)kh * c->group * c->d, c->group, c->d, L->head[kh].lm_h + (size_t)j0 * c->d,
                          j1 - j0, 1.0f / sqrtf((float)c->d), S->tmp + j0, (size_t)n);
}

/* The books of KV head kh's selection (S->sel and S->score, best first):
 * the chosen chunks' ids and scores, and the cache's hits and misses. */
static void select_books(kv_sk *c, sk_layer *L, int kh) {
    sk_head *H = &L->head[kh];
    sk_scratch *S = &c->scr[kh];
    for (int i = 0; i < c->k; i++) {
        S->sel_id[i] = H->cand[S->sel[i]];
        S->sel_score[i] = S->score[S->sel[i]];
    }
    S->n_miss = shadowkv_cache_update(&H->cache, S->sel, c->k, S->slot_of, S->miss);
}

/* The softmax of query head g of KV head kh's group over its logits
 * (score_block): a task of its own, as the backend's score computes it. */
static void softmax_head(kv_sk *c, int kh, int g) {
    sk_scratch *S = &c->scr[kh];
    size_t n = (size_t)c->n_cand;
    memset(S->gscore + g * n, 0, sizeof(float) * n);
    shadowkv_softmax_add(S->tmp + g * n, (int)n, S->gscore + g * n);
}

/* The group's score (the max of its heads' softmaxes, as the backend's score
 * gives it), top-k and cache bookkeeping of KV head kh. */
static void select_head(kv_sk *c, sk_layer *L, int kh) {
    sk_scratch *S = &c->scr[kh];
    shadowkv_group_max(S->gscore, c->group, c->n_cand, S->score);
    int k = c->base.shape.be->topk(S->score, c->n_cand, c->k, S->sel);
    SKV_ASSERT(k == c->k);
    select_books(c, L, kh);
}

/* Exact attention mass captured by the selection and by the whole sparse set
 * (mean over the group's query heads), and the rank of every candidate under
 * exact chunk mass (max over the group, the reduction the landmark scores
 * use) and under the landmark scores. */
static void oracle_head(kv_sk *c, sk_layer *L, int kh, const float *q) {
    sk_head *H = &L->head[kh];
    sk_scratch *S = &c->scr[kh];
    int d = c->d, T = c->s + L->n_gen, cc = c->c;
    float scale = 1.0f / sqrtf((float)d);
    for (int j = 0; j < c->n_chunks; j++) S->mass[j] = 0;
    double sel_sum = 0, sparse_sum = 0;
    for (int g = 0; g < c->group; g++) {
        const float *qh = q + (size_t)(kh * c->group + g) * d;
        float mx = -INFINITY;
        for (int t = 0; t < T; t++) {
            S->p[t] = vec_dot(qh, L->k + (size_t)t * c->kvd + (size_t)kh * d, d) * scale;
            if (S->p[t] > mx) mx = S->p[t];
        }
        double sum = 0;
        for (int t = 0; t < T; t++) sum += S->p[t] = expf(S->p[t] - mx);
        for (int t = 0; t < T; t++) S->p[t] = (float)(S->p[t] / sum);
        double sel = 0, sparse = 0;
        for (int j = 0; j < c->n_chunks; j++) {
            double m = 0;
            for (int t = j * cc; t < (j + 1) * cc; t++) m += S->p[t];
            if (m > S->mass[j]) S->mass[j] = (float)m;
        }
        for (int i = 0; i < c->k; i++)
            for (int t = S->sel_id[i] * cc; t < (S->sel_id[i] + 1) * cc; t++) sel += S->p[t];
        for (int i = 0; i < c->n_out; i++)
            for (int t = H->outl[i] * cc; t < (H->outl[i] + 1) * cc; t++) sparse += S->p[t];
        for (int t = c->local_start * cc; t < T; t++) sparse += S->p[t];
        sel_sum += sel;
        sparse_sum += sel + sparse;
    }
    S->recall_sel = (float)(sel_sum / c->group);
    S->recall_sparse = (float)(sparse_sum / c->group);
    for (int j = 0; j < c->n_chunks; j++) S->rank_exact[j] = S->rank_lm[j] = -1;
    for (int i = 0; i < c->n_cand; i++) S->cand_key[i] = S->mass[H->cand[i]];
    shadowkv_rank(S->cand_key, c->n_cand, S->rank_tmp, S->order);
    for (int i = 0; i < c->n_cand; i++) S->rank_exact[H->cand[i]] = S->rank_tmp[i];
    shadowkv_rank(S->score, c->n_cand, S->rank_tmp, S->order);
    for (int i = 0; i < c->n_cand; i++) S->rank_lm[H->cand[i]] = S->rank_tmp[i];
}

static void span(kv_sk *c, int stream, const char *op, int layer, double t0) {
    probe_emit_span(c->base.bus, stream, op, layer, c->base.step, t0, probe_time(c->base.bus));
}

/* Misses of KV head kh: fetch V from the offload store into their slots. */
static void fetch_head(kv_sk *c, int layer, int kh) {
    sk_scratch *S = &c->scr[kh];
    sk_head *H = &c->L[layer].head[kh];
    for (int m = 0; m < S->n_miss; m++) {
        int i = S->miss[m];
        S->g_idx[m] = (layer * c->h + kh) * c->n_cand + S->sel[i];
        S->g_off[m] = (size_t)(c->row_slot + S->slot_of[i] * c->c) * c->d;
    }
    if (c->so.f32_state) /* the CPU's gather at f32 (the backend's op reads bf16) */
        shadowkv_gather_blocks(c->store.data, 4, c->store.rows, c->store.cols, S->g_idx, S->n_miss, H->V,
                               SKV_ELT_F32, S->g_off, c->d);
    else
        c->base.shape.be->gather(c->store.data, c->store.rows, c->store.cols, S->g_idx, S->n_miss, H->V, c->row_elt,
                                 S->g_off, c->d);
    shadowkv_store_count(&c->store, S->n_miss);
}

/* Parts KV head's rows split into for attention at this length: at most
 * att_parts, each at least 128 rows. */
static int attend_parts(const kv_sk *c, const sk_layer *L) {
    int rows = c->row_gen + L->n_gen, p = c->att_parts < rows / 128 ? c->att_parts : rows / 128;
    return p < 1 ? 1 : p;
}

/* Sparse attention of task t of a layer: part t % parts of KV head t / parts's
 * rows, for the head's whole query group (each row read once for it); one
 * part writes out, several write partial results for attend_merge. */
static void attend_task(kv_sk *c, sk_layer *L, int t, int parts, const float *q, float *out) {
    int kh = t / parts, p = t % parts, g = c->group, d = c->d;
    sk_head *H = &L->head[kh];
    int rows = c->row_gen + L->n_gen;
    int r0 = (int)((long long)rows * p / parts), r1 = (int)((long long)rows * (p + 1) / parts);
    size_t off = (size_t)kh * g * d;
    if (parts == 1) {
        c->base.shape.be->attend_group(q + off, g, H->K, H->V, c->row_elt, rows, d, d, 1.0f / sqrtf((float)d),
                                       out + off, NULL, NULL);
        return;
    }
    c->base.shape.be->attend_group(q + off, g, sk_row(c, H->K, (size_t)r0), sk_row(c, H->V, (size_t)r0), c->row_elt,
                                   r1 - r0, d, d, 1.0f / sqrtf((float)d), c->att_po + (size_t)t * g * d,
                                   c->att_pm + (size_t)t * g, c->att_pl + (size_t)t * g);
}

/* Merges KV head kh's parts (tasks kh*parts.., contiguous) into out. */
static void attend_merge_head(kv_sk *c, int kh, int parts, float *out) {
    int g = c->group, d = c->d;
    size_t t0 = (size_t)kh * parts;
    c->base.shape.be->attend_merge(parts, g, d, c->att_po + t0 * g * d, c->att_pm + t0 * g, c->att_pl + t0 * g,
                                   out + (size_t)kh * g * d);
}

/* ---- needle watch ------------------------------------------------------------- */

/* Where chunk j lives in KV head H: 2 local window, 1 outlier, 0 candidate. */
static int watch_part(const kv_sk *c, const sk_head *H, int j) {
    if (j >= c->local_start) return 2;
    int lo = 0, hi = c->n_out - 1;
    while (lo <= hi) {
        int m = (lo + hi) / 2;
        if (H->outl[m] == j) return 1;
        if (H->outl[m] < j) lo = m + 1;
        else hi = m - 1;
    }
    return 0;
}

/* Index of chunk j among H's candidates (ascending ids), or -1. */
static int watch_cand(const kv_sk *c, const sk_head *H, int j) {
    int lo = 0, hi = c->n_cand - 1;
    while (lo <= hi) {
        int m = (lo + hi) / 2;
        if (H->cand[m] == j) return m;
        if (H->cand[m] < j) lo = m + 1;
        else hi = m - 1;
    }
    return -1;
}

/* Place of candidate i in the landmark order shadowkv_topk uses (higher
 * score first, ties to the lower index, NaN last): 0 = best. */
static int watch_rank(const float *score, int n, int i) {
    float v = score[i];
    int r = 0;
    for (int j = 0; j < n; j++) {
        if (j == i) continue;
        float u = score[j];
        int better = isnan(v) ? (!isnan(u) || j < i) : (!isnan(u) && (u > v || (u == v && j < i)));
        r += better;
    }
    return r;
}

/* Rank-r relative error of the span's pre-RoPE keys per KV head of layer
 * L (before its pre-RoPE keys are freed). */
static void watch_key_err(kv_sk *c, sk_layer *L, int layer) {
    int d = c->d, r = c->r;
    for (int kh = 0; kh < c->h; kh++) {
        double num = 0, den = 0;
        const float *svt = L->SVt + (size_t)kh * r * d;
        for (int t = c->wb; t < c->we; t++) {
            size_t u0 = (size_t)t * r;
            const float *k = L->kpre + (size_t)t * c->kvd + (size_t)kh * d;
            for (int e = 0; e < d; e++) {
                double rec = 0;
                for (int j = 0; j < r; j++) {
                    float u = c->so.f32_state ? ((const float *)L->U)[u0 + j]
                                              : km_bf16_to_f32(((const uint16_t *)L->U)[u0 + j]);
                    rec += (double)u * svt[(size_t)j * d + e];
                }
                num += (k[e] - rec) * (k[e] - rec);
                den += (double)k[e] * k[e];
            }
        }
        c->w_err[layer * c->h + kh] = den > 0 ? (float)sqrt(num / den) : 0.0f;
    }
}

/* Fills c->w_part for KV head H and returns a needle event with the parts,
 * cos-minima and prefill figures; the caller fills the step's fields. */
static probe_event watch_event(kv_sk *c, const sk_head *H, int layer, int kh) {
    for (int i = 0; i < c->nw; i++) {
        c->w_part[i] = watch_part(c, H, c->wchunk[i]);
        c->w_sel[i] = 0;
        c->w_rank[i] = c->w_rexact[i] = -1;
        c->w_mass[i] = -1;
    }
    probe_event ev = {
        .kind = PROBE_NEEDLE,
        .needle = {
            .id = 0, .tok_begin = c->wb, .tok_end = c->we, .n_chunks = c->nw, .step = c->base.step,
            .layer = layer, .head = kh, .mass_exact = -1, .mass_sparse = -1, .chunks = c->wchunk,
            .rank = c->w_rank, .selected = c->w_sel, .k = c->n_cand > 0 ? c->k : 0,
            .key_err = c->w_err[layer * c->h + kh], .mass_ideal = -1, .out_err = -1, .n_info = c->nw,
            .part = c->w_part, .rank_exact = c->w_rexact, .cos_min = c->w_cm + ((size_t)layer * c->h + kh) * c->nw,
            .mass_chunk = c->w_mass,
        },
    };
    return ev;
}

/* Softmax of q·K[t]·scale over n rows (stride values apart, f32 or, with
 * elt SKV_ELT_BF16, bf16 widened) into p. */
static void watch_softmax(const float *q, const void *K, int elt, int n, int d, size_t stride, float scale, float *p) {
    float mx = -INFINITY, row[256];
    SKV_ASSERT(elt == SKV_ELT_F32 || d <= 256);
    for (int t = 0; t < n; t++) {
        const float *k = (const float *)K + (size_t)t * stride;
        if (elt == SKV_ELT_BF16) {
            shadowkv_from_bf16(row, (const uint16_t *)K + (size_t)t * stride, (size_t)d);
            k = row;
        }
        p[t] = vec_dot(q, k, d) * scale;
        if (p[t] > mx) mx = p[t];
    }
    double sum = 0;
    for (int t = 0; t < n; t++) sum += p[t] = expf(p[t] - mx);
    for (int t = 0; t < n; t++) p[t] = (float)(p[t] / sum);
}

/* The needle event of one decode step, layer and KV head: ranks and
 * selection from this step's scores, the attention mass on the span in the
 * sparse attention just computed (out), and with the oracle the exact mass,
 * the ideal mass and the output error. */
static void watch_decode(kv_sk *c, int layer, int kh, const float *q, const float *out) {
    sk_layer *L = &c->L[layer];
    sk_head *H = &L->head[kh];
    sk_scratch *S = &c->scr[kh];
    int d = c->d, cc = c->c, sel = c->n_cand > 0, T = c->s + L->n_gen, rows = c->row_gen + L->n_gen;
    float scale = 1.0f / sqrtf((float)d);
    probe_event ev = watch_event(c, H, layer, kh);
    /* First attention row of every prompt chunk that attention read. */
    for (int j = 0; j <= c->n_chunks; j++) c->w_rowbase[j] = -1;
    for (int i = 0; i < c->n_out; i++) c->w_rowbase[H->outl[i]] = i * cc;
    for (int i = 0; sel && i < c->k; i++) c->w_rowbase[S->sel_id[i]] = c->row_slot + S->slot_of[i] * cc;
    for (int i = 0; i < c->nw; i++) {
        int j = c->wchunk[i];
        if (c->w_part[i] != 0 || !sel) continue;
        int ci = watch_cand(c, H, j);
        if (ci >= 0) c->w_rank[i] = watch_rank(S->score, c->n_cand, ci);
        c->w_sel[i] = c->w_rowbase[j] >= 0;
        if (c->o.oracle) c->w_rexact[i] = S->rank_exact[j];
    }
    int lstart = c->local_start * cc;
    double m_sparse = 0, m_exact = 0, m_ideal = 0, e_num = 0, e_den = 0;
    for (int i = 0; i < c->nw && c->o.oracle; i++) c->w_mass[i] = 0;
    for (int g = 0; g < c->group; g++) {
        int hq = kh * c->group + g;
        const float *qh = q + (size_t)hq * d;
        watch_softmax(qh, H->K, c->row_elt, rows, d, (size_t)d, scale, c->w_p);
        for (int t = c->wb; t < c->we; t++) {
            int j = t / cc;
            if (t >= lstart) m_sparse += c->w_p[c->row_local + t - lstart];
            else if (c->w_rowbase[j] >= 0) m_sparse += c->w_p[c->w_rowbase[j] + t - j * cc];
        }
        if (!c->o.oracle) continue;
        watch_softmax(qh, L->k + (size_t)kh * d, SKV_ELT_F32, T, d, (size_t)c->kvd, scale, c->w_p);
        double kept = 0, kept_needle = 0;
        for (int t = 0; t < T; t++)
            if (t >= lstart || c->w_rowbase[t / cc] >= 0) kept += c->w_p[t];
        for (int t = c->wb; t < c->we; t++) {
            int j = t / cc;
            m_exact += c->w_p[t];
            c->w_mass[j - c->wchunk[0]] += c->w_p[t] / c->group;
            if (t >= lstart || c->w_rowbase[j] >= 0) kept_needle += c->w_p[t];
        }
        if (kept > 0) m_ideal += kept_needle / kept;
        for (int e = 0; e < d; e++) c->w_o[e] = 0;
        for (int t = 0; t < T; t++) vec_axpy(c->w_o, c->w_p[t], L->v + (size_t)t * c->kvd + (size_t)kh * d, d);
        const float *os = out + (size_t)hq * d;
        for (int e = 0; e < d; e++) {
            e_num += ((double)os[e] - c->w_o[e]) * ((double)os[e] - c->w_o[e]);
            e_den += (double)c->w_o[e] * c->w_o[e];
        }
    }
    ev.needle.mass_sparse = (float)(m_sparse / c->group);
    if (c->o.oracle) {
        ev.needle.mass_exact = (float)(m_exact / c->group);
        ev.needle.mass_ideal = (float)(m_ideal / c->group);
        ev.needle.out_err = e_den > 0 ? (float)sqrt(e_num / e_den) : 0.0f;
    }
    probe_emit(c->base.bus, &ev);
}

/* Fetch-stream thread: runs one layer's fetches per job. */
static void *fetch_main(void *arg) {
    kv_sk *c = arg;
    sk_fetcher *f = &c->fx;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (f->pending < 0 && !f->quit) pthread_cond_wait(&f->cv, &f->mu);
        if (f->quit) break;
        int layer = f->pending;
        pthread_mutex_unlock(&f->mu);
        double pt0 = probe_time(c->base.bus), w0 = skv_now();
        for (int kh = 0; kh < c->h; kh++) fetch_head(c, layer, kh);
        double w1 = skv_now(), pt1 = probe_time(c->base.bus);
        pthread_mutex_lock(&f->mu);
        f->pt0 = pt0;
        f->pt1 = pt1;
        f->seconds += w1 - w0;
        f->pending = -1;
        pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static int fetcher_start(kv_sk *c) {
    sk_fetcher *f = &c->fx;
    f->pending = -1;
    if (pthread_mutex_init(&f->mu, NULL)) return skv_error(SKV_ENOMEM, "shadowkv: cannot make the fetch stream's lock");
    if (pthread_cond_init(&f->cv, NULL)) {
        pthread_mutex_destroy(&f->mu);
        return skv_error(SKV_ENOMEM, "shadowkv: cannot make the fetch stream's condition");
    }
    if (pthread_create(&f->th, NULL, fetch_main, c)) {
        pthread_cond_destroy(&f->cv);
        pthread_mutex_destroy(&f->mu);
        return skv_error(SKV_ENOMEM, "shadowkv: cannot start the fetch stream's thread");
    }
    f->started = 1;
    return 0;
}

static void fetcher_stop(kv_sk *c) {
    sk_fetcher *f = &c->fx;
    if (!f->started) return;
    pthread_mutex_lock(&f->mu);
    f->quit = 1;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->th, NULL);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    f->started = 0;
}

static void fetcher_post(kv_sk *c, int layer) {
    sk_fetcher *f = &c->fx;
    pthread_mutex_lock(&f->mu);
    f->pending = layer;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static void fetcher_wait(kv_sk *c) {
    sk_fetcher *f = &c->fx;
    pthread_mutex_lock(&f->mu);
    while (f->pending >= 0) pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
}

static int decode_tally(kv_sk *c, int layer, const float *q, float *out);

/* Rebuilds the key rows of miss m of KV head kh. */
static void rebuild_one(kv_sk *c, sk_layer *L, int kh, int m) {
    sk_scratch *S = &c->scr[kh];
    sk_head *H = &L->head[kh];
    int d = c->d, cc = c->c, i = S->miss[m];
    void *out = sk_row(c, H->K, (size_t)(c->row_slot + S->slot_of[i] * cc));
    if (c->so.f32_state) /* the CPU's rebuild at f32 (the backend's op reads bf16) */
        shadowkv_rebuild_w(L->U, 4, c->r, L->SVt + (size_t)kh * c->r * d, d, S->sel_id[i] * cc, cc,
                           c->base.shape.rope, c->rope_cs, c->rope_sn, out);
    else
        c->base.shape.be->rebuild(L->U, c->r, L->SVt + (size_t)kh * c->r * d, d, S->sel_id[i] * cc, cc,
                                  c->base.shape.rope, c->rope_cs, c->rope_sn, out, c->row_elt);
}

/* Asks the caches for what rebuild_one(kh, m) will read. */
static void rebuild_prefetch(kv_sk *c, sk_layer *L, int kh, int m) {
    sk_scratch *S = &c->scr[kh];
    shadowkv_rebuild_prefetch(L->U, sk_u_bytes(c), c->r, S->sel_id[S->miss[m]] * c->c, c->c, c->base.shape.rope,
                              c->rope_cs, c->rope_sn);
}

/* Misses rebuilt a block at a time (decode_layer). */
#define RB_BLOCK 8

/* One layer of a decode step, in one parallel region: select per KV head;
 * then the missed values are fetched while the missed keys are rebuilt,
 * blocks of RB_BLOCK (KV head, chunk) pairs spread over the threads. With so.overlap the fetch
 * runs on the fetch stream's own thread, at the same time as the rebuild;
 * without it, before the rebuild on the compute threads. Then exact
 * attention per query head. Span probes time each stage on its stream. */
static int decode_layer(kv_sk *c, int layer, const float *q, float *out) {
    sk_layer *L = &c->L[layer];
    int h = c->h, nh = c->base.shape.n_heads, sel = c->n_cand > 0;
    int spans = probe_wants(c->base.bus, PROBE_SPAN), overlap = sel && c->fx.started;
    if (layer == 0) {
        c->steps++;
        c->step_hits = c->step_misses = c->step_fetches = c->step_fetch_bytes = 0;
    }
    /* probe times: start, select done, fetch done (without overlap), rebuild
     * done; wall clock: start, select done (f0), fetch and rebuild done */
    double w0 = skv_now(), t0 = probe_time(c->base.bus), ts = t0, tf = t0, tr = t0, f0 = w0, wr = w0;
    int nrb = 0;
    /* landmark blocks per KV head: h*nb tasks, a multiple of the threads */
    int nb = c->n_cand >= 64 * 2 * skv_threads() ? 2 * skv_threads() : 1;
    #pragma omp parallel if (nh > 1)
    {
        if (sel) {
            #pragma omp for schedule(static)
            for (int t = 0; t < h * nb; t++) score_block(c, L, t / nb, t % nb, nb, q);
            #pragma omp for schedule(static)
            for (int t = 0; t < h * c->group; t++) softmax_head(c, t / c->group, t % c->group);
            #pragma omp for schedule(static)
            for (int kh = 0; kh < h; kh++) select_head(c, L, kh);
            #pragma omp single
            {
                if (overlap) fetcher_post(c, layer);
                for (int kh = 0; kh < h; kh++)
                    for (int m = 0; m < c->scr[kh].n_miss; m++) {
                        c->rb_kh[nrb] = kh;
                        c->rb_m[nrb++] = m;
                    }
                tf = ts = probe_time(c->base.bus);
                f0 = skv_now();
            }
            if (!overlap && c->so.overlap == 1) {
                /* one thread of the team is the fetch stream; the others
                 * start the rebuild, and it joins them when done */
                #pragma omp single nowait
                {
                    c->fx.pt0 = probe_time(c->base.bus);
                    double w = skv_now();
                    for (int kh = 0; kh < h; kh++) fetch_head(c, layer, kh);
                    c->fetch_seconds += skv_now() - w;
                    c->fx.pt1 = probe_time(c->base.bus);
                }
            } else if (!overlap) {
                #pragma omp for schedule(static)
                for (int kh = 0; kh < h; kh++) fetch_head(c, layer, kh);
                #pragma omp single
                {
                    c->fetch_seconds += skv_now() - f0;
                    tf = probe_time(c->base.bus);
                }
            }
            /* blocks of RB_BLOCK misses: a block's memory asked for at once,
             * then rebuilt, so one wait for memory a block, not a miss */
            #pragma omp for schedule(dynamic, 1)
            for (int b = 0; b < nrb; b += RB_BLOCK) {
                int e = b + RB_BLOCK < nrb ? b + RB_BLOCK : nrb;
                for (int i = b; i < e; i++) rebuild_prefetch(c, L, c->rb_kh[i], c->rb_m[i]);
                for (int i = b; i < e; i++) rebuild_one(c, L, c->rb_kh[i], c->rb_m[i]);
            }
            #pragma omp single
            {
                tr = probe_time(c->base.bus);
                if (overlap) {
                    fetcher_wait(c);
                    c->fetch_seconds = c->fx.seconds;
                }
                wr = skv_now();
                if (spans) {
                    probe_emit_span(c->base.bus, PROBE_STREAM_COMPUTE, "select", layer, c->base.step, t0, ts);
                    int own = overlap || c->so.overlap == 1;
                    probe_emit_span(c->base.bus, PROBE_STREAM_FETCH, "fetch_v", layer, c->base.step,
                                    own ? c->fx.pt0 : ts, own ? c->fx.pt1 : tf);
                    probe_emit_span(c->base.bus, PROBE_STREAM_REBUILD, "rebuild_k", layer, c->base.step, tf, tr);
                }
                tr = probe_time(c->base.bus);
            }
        }
        /* (KV head, part) tasks, so 3 KV heads keep 2 threads busy */
        int parts = attend_parts(c, L);
        #pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < h * parts; t++) attend_task(c, L, t, parts, q, out);
        if (parts > 1) {
            #pragma omp for schedule(static)
            for (int kh = 0; kh < h; kh++) attend_merge_head(c, kh, parts, out);
        }
    }
    if (spans) span(c, PROBE_STREAM_COMPUTE, "sparse_attn", layer, tr);
    double we = skv_now();
    c->attn_seconds += we - w0;
    c->stage_seconds[0] += f0 - w0;
    c->stage_seconds[1] += wr - f0;
    c->stage_seconds[2] += we - wr;
    return decode_tally(c, layer, q, out);
}

/* A layer's selection, books, value fetch and key rebuild queued on a
 * device with its fused ops: per KV head the landmark scores and top-k into
 * the pack buffer, then every head's chunk cache, the missed values (the
 * device's fetch stream) and the missed keys, one call each. Nothing comes
 * back to the host here: fused_books reads the pack once the layer's
 * attention is queued. */
static void fused_select(kv_sk *c, int layer, const float *q) {
    sk_layer *L = &c->L[layer];
    const skv_backend *be = c->base.shape.be;
    int h = c->h, nh = c->base.shape.n_heads, k = c->k, nc = c->n_cand;
    float *scores = (float *)((char *)c->pack_d + c->pack_bytes * (size_t)layer);
    int *sel = (int *)(scores + (size_t)h * nc), *slot_of = sel + (size_t)h * k, *miss = slot_of + (size_t)h * k;
    int *n_miss = miss + (size_t)h * k, *cache = L->cache_d;
    for (int kh = 0; kh < h; kh++) {
        be->score(q + (size_t)kh * c->group * c->d, 1, (size_t)nh * c->d, c->group, c->d, L->head[kh].lm_h, nc,
                  1.0f / sqrtf((float)c->d), c->scr[kh].tmp, scores + (size_t)kh * nc);
        int got = be->topk(scores + (size_t)kh * nc, nc, k, sel + (size_t)kh * k);
        SKV_ASSERT(got == k);
    }
    int *slot_id = cache, *where = slot_id + (size_t)h * k;
    unsigned *stamp = (unsigned *)(where + (size_t)h * nc), *epoch = stamp + (size_t)h * k;
    be->sk_books(h, k, nc, sel, slot_id, where, stamp, epoch, slot_of, miss, n_miss);
    SKV_ASSERT(c->row_elt == SKV_ELT_BF16);
    for (int kh = 0; kh < h; kh++) {
        c->kp[kh] = L->head[kh].K;
        c->vp[kh] = L->head[kh].V;
    }
    be->sk_gather_misses(c->store.data, c->c, c->d, h, k, nc, (size_t)layer * h * nc, sel, slot_of, miss, n_miss,
                         c->vp, c->row_slot);
    be->sk_rebuild_misses(L->U, c->r, L->SVt, c->d, c->c, h, k, nc, L->cand_d, sel, slot_of, miss, n_miss,
                          c->base.shape.rope, c->rope_cs, c->rope_sn, c->kp, c->row_slot);
}

/* A layer's books from its pack (copied to the host's pinned memory after
 * its attention was queued, read once the step is done): each head's
 * scores, selection, slots and misses, as select_books and fetch_head leave
 * them. */
static void fused_books(kv_sk *c, int layer) {
    sk_layer *L = &c->L[layer];
    int h = c->h, k = c->k, nc = c->n_cand, total = 0;
    const float *scores = (const float *)((const char *)c->pack_h + c->pack_bytes * (size_t)layer);
    const int *sel = (const int *)(scores + (size_t)h * nc), *slot_of = sel + (size_t)h * k;
    const int *miss = slot_of + (size_t)h * k, *n_miss = miss + (size_t)h * k;
    for (int kh = 0; kh < h; kh++) {
        sk_scratch *S = &c->scr[kh];
        memcpy(S->score, scores + (size_t)kh * nc, sizeof(float) * (size_t)nc);
        memcpy(S->sel, sel + (size_t)kh * k, sizeof(int) * (size_t)k);
        memcpy(S->slot_of, slot_of + (size_t)kh * k, sizeof(int) * (size_t)k);
        memcpy(S->miss, miss + (size_t)kh * k, sizeof(int) * (size_t)k);
        S->n_miss = n_miss[kh];
        SKV_ASSERT(S->n_miss >= 0 && S->n_miss <= k);
        for (int i = 0; i < k; i++) {
            SKV_ASSERT(S->sel[i] >= 0 && S->sel[i] < nc);
            S->sel_id[i] = L->head[kh].cand[S->sel[i]];
            S->sel_score[i] = S->score[S->sel[i]];
        }
        total += S->n_miss;
    }
    shadowkv_store_count(&c->store, total);
}


/* Reads back the books of the layers queued with the fused ops (one wait
 * for the device) and tallies them in layer order: stats and the probe
 * events. At the end of a step (kv_end_step), before the next step's first
 * layer, and before stats are read. q and out are not needed: the oracle
 * and the needle watch, which read them, are refused on a device. */
static int sk_settle(kv_sk *c) {
    if (!c->pend_n) return 0;
    const skv_backend *be = c->base.shape.be;
    uint64_t *ns = sync_count(be);
    if (be->sync && (!ns || c->pend_sync == __atomic_load_n(ns, __ATOMIC_ACQUIRE))) {
        be->sync();
        if (ns) __atomic_add_fetch(ns, 1, __ATOMIC_ACQ_REL);
    }
    int rc = 0, first = c->pend_first, n = c->pend_n, step = c->base.step;
    c->pend_n = 0;
    c->base.step = c->pend_step; /* settled late (the next step began): the events keep their own step */
    for (int l = first; l < first + n && !rc; l++) {
        fused_books(c, l);
        rc = decode_tally(c, l, NULL, NULL);
    }
    c->base.step = step;
    return rc;
}

static int sk_end_step(kv_cache *base) { return sk_settle((kv_sk *)base); }

/* Queues layer's books pack to the host's pinned memory behind the work
 * queued so far (no wait) and marks it pending, read at the step's end
 * (sk_settle); sync: the backend's sync count when queued. */
static void queue_pack(kv_sk *c, int layer, uint64_t sync) {
    char *ph = (char *)c->pack_h + c->pack_bytes * (size_t)layer;
    c->base.shape.be->copy2d(ph, c->pack_bytes, (char *)c->pack_d + c->pack_bytes * (size_t)layer, c->pack_bytes,
                             c->pack_bytes, 1);
    if (!c->pend_n) {
        c->pend_first = layer;
        c->pend_step = c->base.step;
    }
    SKV_ASSERT(c->pend_first + c->pend_n == layer);
    c->pend_n++;
    c->pend_sync = sync;
}

/* A decode step's layer on a device backend: the same stages queued in
 * order from this thread (the device runs them; the gathers of missed values
 * on its fetch stream beside the key rebuild on its compute stream). The
 * host waits once per layer, for the selection it keeps the books of. */
static int decode_layer_dev(kv_sk *c, int layer, const float *q, float *out) {
    sk_layer *L = &c->L[layer];
    const skv_backend *be = c->base.shape.be;
    int h = c->h, nh = c->base.shape.n_heads, rc;
    if (layer == 0) {
        if ((rc = sk_settle(c))) return rc; /* the last step's, if its end was not called */
        c->steps++;
        c->step_hits = c->step_misses = c->step_fetches = c->step_fetch_bytes = 0;
    }
    double w0 = skv_now();
    if (sk_fused(c)) {
        fused_select(c, layer, q);
    } else if (c->n_cand > 0) {
        for (int kh = 0; kh < h; kh++) {
            sk_scratch *S = &c->scr[kh];
            be->score(q + (size_t)kh * c->group * c->d, 1, (size_t)nh * c->d, c->group, c->d, L->head[kh].lm_h,
                      c->n_cand, 1.0f / sqrtf((float)c->d), S->tmp, S->score_d);
            int k = be->topk(S->score_d, c->n_cand, c->k, S->sel_d);
            SKV_ASSERT(k == c->k);
        }
        for (int kh = 0; kh < h; kh++) {
            sk_scratch *S = &c->scr[kh];
            be->download(S->sel, S->sel_d, sizeof(int) * (size_t)c->k);
            be->download(S->score, S->score_d, sizeof(float) * (size_t)c->n_cand);
            select_books(c, L, kh);
        }
        double f0 = skv_now();
        for (int kh = 0; kh < h; kh++) fetch_head(c, layer, kh);
        c->fetch_seconds += skv_now() - f0;
        for (int kh = 0; kh < h; kh++)
            for (int m = 0; m < c->scr[kh].n_miss; m++) rebuild_one(c, L, kh, m);
    }
    int parts = attend_parts(c, L);
    for (int t = 0; t < h * parts; t++) attend_task(c, L, t, parts, q, out);
    if (parts > 1)
        for (int kh = 0; kh < h; kh++) attend_merge_head(c, kh, parts, out);
    c->attn_seconds += skv_now() - w0;
    if (sk_fused(c)) {
        /* the layer's books to the host's pinned memory, queued behind its
         * attention; read at the step's end (sk_settle): no wait here */
        queue_pack(c, layer, syncs_now(be));
        return 0;
    }
    return decode_tally(c, layer, q, out);
}

/* The books of a decode step's layer: bytes, hits and misses, the oracle's
 * measures, and the probe events. */
static int decode_tally(kv_sk *c, int layer, const float *q, float *out) {
    sk_layer *L = &c->L[layer];
    int h = c->h, sel = c->n_cand > 0;
    c->dense_bytes += 2.0 * (c->s + L->n_gen) * c->kvd * sizeof(float);
    if (sel)
        for (int kh = 0; kh < h; kh++) {
            uint64_t nm = (uint64_t)c->scr[kh].n_miss, hit = (uint64_t)c->k - nm;
            c->step_hits += hit;
            c->step_misses += nm;
            c->step_fetches += nm;
            c->step_fetch_bytes += (uint64_t)nm * c->c * c->d * c->store.elt_bytes;
            c->hits += hit;
            c->misses += nm;
        }
    if (c->o.oracle) {
        #pragma omp parallel for schedule(static) if (h > 1)
        for (int kh = 0; kh < h; kh++) oracle_head(c, L, kh, q);
        for (int kh = 0; kh < h; kh++) {
            c->recall_sel_sum += c->scr[kh].recall_sel;
            c->recall_sparse_sum += c->scr[kh].recall_sparse;
            c->recall_n++;
        }
    }
    if (probe_wants(c->base.bus, PROBE_DECODE_HEAD)) {
        for (int kh = 0; kh < h; kh++) {
            sk_scratch *S = &c->scr[kh];
            int k = sel ? c->k : 0, nm = sel ? S->n_miss : 0;
            probe_event ev = {
                .kind = PROBE_DECODE_HEAD,
                .decode_head = {
                    .step = c->base.step, .layer = layer, .head = kh, .block = c->c,
                    .fetch_bytes = (uint64_t)nm * c->c * c->d * c->store.elt_bytes,
                    .n_sel = k, .hits = k - nm, .misses = nm,
                    .has_oracle = c->o.oracle,
                    .recall = c->o.oracle ? S->recall_sel : 0,
                    .n_chunks = c->o.oracle ? c->n_chunks : 0,
                    .sel = S->sel_id, .score = S->sel_score,
                    .rank_exact = c->o.oracle ? S->rank_exact : NULL,
                    .rank_landmark = c->o.oracle ? S->rank_lm : NULL,
                },
            };
            probe_emit(c->base.bus, &ev);
        }
    }
    if (c->nw && probe_wants(c->base.bus, PROBE_NEEDLE))
        for (int kh = 0; kh < h; kh++) watch_decode(c, layer, kh, q, out);
    return 0;
}

static int sk_attend(kv_cache *base, int layer, int pos, int n, const float *q, float *out) {
    kv_sk *c = (kv_sk *)base;
    sk_layer *L = &c->L[layer];
    if (!c->prefilled) {
        if (pos + n > L->n)
            return skv_error(SKV_EINVAL, "shadowkv: layer %d attends up to position %d, only %d stored", layer,
                             pos + n - 1, L->n);
        attend_dense(c, L, pos, n, q, out);
        return 0;
    }
    if (n != 1)
        return skv_error(SKV_EUNSUPPORTED, "shadowkv: %d queries after the prompt; decoding takes one at a time", n);
    if (pos != c->s + L->n_gen - 1)
        return skv_error(SKV_EINVAL, "shadowkv: layer %d attends at position %d, the last stored is %d", layer, pos,
                         c->s + L->n_gen - 1);
    return sk_dev(c) ? decode_layer_dev(c, layer, q, out) : decode_layer(c, layer, q, out);
}

/* ---- decode: a batch's step on a device, a few launches a layer ------------- */

/* The job table of a batch's step (kernels/cpu/shadowkv_ops.h: sk_job,
 * sk_step) for a set of caches: every (layer, sequence, KV head)'s buffers,
 * in the device's memory, written from a pinned copy with the backend's
 * copy2d (queued, no wait), and the step's scratch. Built at the first step
 * of a set of caches and kept by the first of them (a later step of the
 * same caches in the same order finds it); a layer's jobs of a sequence are
 * rewritten when its heads' rows move (sk_layer.ver). The pinned copies
 * are rewritten only after the device has read them: between two steps
 * the books are settled, which waits for the device once. */
typedef struct sk_group {
    int n, n_layers, h;    /* sequences, layers, KV heads a sequence */
    uint64_t *id;          /* (n) the caches' ids, in batch order */
    unsigned *ver;         /* (n_layers, n) the sk_layer.ver each sequence's jobs were written at */
    sk_job *jobs_h, *jobs_d; /* (n_layers, n, h): the pinned copy and the device's table */
    int *seq_h, *seq_d;    /* (n_layers, n, 2): each sequence's row and generated rows, pinned and device */
    float *lg, *part;      /* scratch: logits, attention partials (sk_step) */
    unsigned *done;        /* (n*h) zero between steps */
    int max_cand, max_k, max_c;
} sk_group;

#define SK_GROUP_MAX 64    /* sequences a table; a larger batch runs as several */

static void group_free(kv_sk *c) {
    sk_group *g = c->grp;
    if (!g) return;
    const skv_backend *be = c->base.shape.be;
    if (g->jobs_h) be->host_free(g->jobs_h);
    if (g->seq_h) be->host_free(g->seq_h);
    sk_release(c, g->jobs_d); sk_release(c, g->seq_d); sk_release(c, g->lg); sk_release(c, g->part);
    sk_release(c, g->done);
    free(g->id); free(g->ver);
    free(g);
    c->grp = NULL;
}

/* Whether c's decode step can run in a batch's fused launches on its
 * device (the other caches then run append and attend alone, as before):
 * prefilled, with the fused books, no oracle or needle watch, and within
 * the fused kernels' limits. */
static int sk_batchable(const kv_sk *c) {
    const skv_backend *be = c->base.shape.be;
    return sk_dev(c) && c->prefilled && sk_fused(c) && !c->o.oracle && !c->nw && be->sk_step_append &&
           be->sk_step_logits && be->sk_step_select && be->sk_step_fetch && be->sk_step_rebuild && be->sk_step_attend && c->k <= SK_STEP_K_MAX && c->group <= SK_STEP_G_MAX && c->d <= SK_STEP_D_MAX;
}

/* Job (layer, gi, kh) of the table from cache c: its head's buffers, its
 * chunk cache, its part of the layer's pack. */
static sk_job job_of(const kv_sk *c, int layer, int gi, int kh, size_t lg) {
    const sk_layer *L = &c->L[layer];
    const sk_head *H = &L->head[kh];
    size_t h = (size_t)c->h, nc = (size_t)c->n_cand, k = (size_t)c->k, d = (size_t)c->d;
    float *scores = (float *)((char *)c->pack_d + c->pack_bytes * (size_t)layer);
    int *sel = (int *)(scores + h * nc), *slot_of = sel + h * k, *miss = slot_of + h * k, *n_miss = miss + h * k;
    int *slot_id = L->cache_d, *where = slot_id + h * k;
    unsigned *stamp = (unsigned *)(where + h * nc), *epoch = stamp + h * k;
    sk_job J = {
        .K = H->K, .V = H->V, .lm = H->lm_h, .U = L->U, .svt = L->SVt + (size_t)kh * c->r * d,
        .cs = c->rope_cs, .sn = c->rope_sn, .cand = L->cand_d + (size_t)kh * nc,
        .store = (const uint16_t *)c->store.data + ((size_t)layer * h + kh) * nc * c->c * d,
        .key = c->so.plus ? c->proj + (size_t)kh * d : NULL,
        .slot_id = slot_id + kh * k, .where = where + kh * nc, .stamp = stamp + kh * k, .epoch = epoch + kh,
        .score = scores + kh * nc, .sel = sel + kh * k, .slot_of = slot_of + kh * k, .miss = miss + kh * k,
        .n_miss = n_miss + kh, .gi = gi, .kh = kh, .n_cand = c->n_cand, .k = c->k, .r = c->r, .c = c->c,
        .row_slot = c->row_slot, .row_gen = c->row_gen, .s = c->s, .lg = lg,
    };
    return J;
}

/* Writes sequence gi's jobs of layer into the pinned copy; lg: where its
 * first head's logits start. */
static void group_fill(sk_group *g, kv_sk *c, int layer, int gi, size_t lg) {
    size_t per = 2 * (size_t)c->group * c->n_cand;
    for (int kh = 0; kh < g->h; kh++)
        g->jobs_h[((size_t)layer * g->n + gi) * g->h + kh] = job_of(c, layer, gi, kh, lg + kh * per);
    g->ver[(size_t)layer * g->n + gi] = c->L[layer].ver;
}

/* Where sequence gi's logits start in the scratch. */
static size_t group_lg(kv_sk *const *cs, int gi) {
    size_t o = 0;
    for (int i = 0; i < gi; i++) o += 2 * (size_t)cs[i]->h * cs[i]->group * cs[i]->n_cand;
    return o;
}

/* The table of the caches cs (n, batch order), cs[0]'s: the one it has when
 * it names the same caches, else a new one (device memory: at the first
 * step of a set of caches). */
static int group_get(kv_sk *const *cs, int n, sk_group **out) {
    kv_sk *c0 = cs[0];
    sk_group *g = c0->grp;
    int same = g && g->n == n;
    for (int i = 0; same && i < n; i++) same = g->id[i] == cs[i]->id;
    if (same) {
        *out = g;
        return 0;
    }
    for (int i = 0; i < n; i++) group_free(cs[i]); /* a sequence leads one table at a time */
    const skv_backend *be = c0->base.shape.be;
    int nl = c0->base.shape.n_layers, h = c0->h;
    size_t nj = (size_t)nl * n * h, lg = group_lg(cs, n), jobs = (size_t)n * h;
    g = skv_calloc(1, sizeof *g);
    if (!g) return skv_error(SKV_ENOMEM, "out of memory");
    c0->grp = g;
    g->n = n;
    g->n_layers = nl;
    g->h = h;
    g->id = skv_malloc(sizeof(uint64_t) * n);
    g->ver = skv_malloc(sizeof(unsigned) * (size_t)nl * n);
    g->jobs_h = be->host_alloc(sizeof(sk_job) * nj);
    g->seq_h = be->host_alloc(sizeof(int) * 2 * (size_t)nl * n);
    g->jobs_d = sk_alloc(c0, sizeof(sk_job) * nj);
    g->seq_d = sk_alloc(c0, sizeof(int) * 2 * (size_t)nl * n);
    g->lg = sk_alloc(c0, sizeof(float) * (lg ? lg : 1));
    g->part = sk_alloc(c0, sizeof(float) * jobs * SK_STEP_PARTS * c0->group * (c0->d + 2));
    g->done = sk_alloc(c0, sizeof(unsigned) * jobs);
    if (!g->id || !g->ver || !g->jobs_h || !g->seq_h || !g->jobs_d || !g->seq_d || !g->lg || !g->part || !g->done) {
        group_free(c0);
        return skv_error(SKV_ENOMEM, "shadowkv: out of device memory for a batch of %d sequences' step", n);
    }
    for (int i = 0; i < n; i++) {
        kv_sk *c = cs[i];
        g->id[i] = c->id;
        g->max_cand = c->n_cand > g->max_cand ? c->n_cand : g->max_cand;
        g->max_k = c->k > g->max_k ? c->k : g->max_k;
        g->max_c = c->c > g->max_c ? c->c : g->max_c;
        for (int l = 0; l < nl; l++) group_fill(g, c, l, i, group_lg(cs, i));
    }
    be->copy2d(g->jobs_d, sizeof(sk_job) * nj, g->jobs_h, sizeof(sk_job) * nj, sizeof(sk_job) * nj, 1);
    *out = g;
    return 0;
}

/* One layer's decode step of the caches cs (n, all batchable and alike),
 * the rows of the batch row[i]: the whole batch in a fixed number of
 * launches, every book queued in the packs and read at the step's end
 * (sk_settle), as decode_layer_dev leaves them. rope: q and k arrive
 * un-rotated (k is the pre-RoPE key) and the append rotates them (q in
 * place); 0: rope_qk has run. */
static int group_step(kv_sk *const *cs, const int *row, int n, int layer, const int *pos, const float *k_pre,
                      const float *k, const float *v, float *q, float *out, int rope) {
    kv_sk *c0 = cs[0];
    const kv_shape *sh = &c0->base.shape;
    const skv_backend *be = sh->be;
    size_t kvd = (size_t)c0->kvd;
    int rc, max_rows = 0;
    double w0 = skv_now();
    for (int i = 0; i < n; i++) {
        kv_sk *c = cs[i];
        sk_layer *L = &c->L[layer];
        int p = pos[row[i]];
        if (p != c->s + L->n_gen)
            return skv_error(SKV_EINVAL, "shadowkv: layer %d appends at position %d, expected %d", layer, p,
                             c->s + L->n_gen);
        if ((rc = grow_heads(c, L))) return rc;
        if (layer == 0) {
            if ((rc = sk_settle(c))) return rc; /* the last step's, if its end was not called */
            c->steps++;
            c->step_hits = c->step_misses = c->step_fetches = c->step_fetch_bytes = 0;
        }
        if (c->so.plus) { /* ShadowKV+: the key projected onto the prefill basis, then rotated */
            be->project(L->Vt, c->r, c->kvd, (rope ? k : k_pre) + (size_t)row[i] * kvd, c->proj, c->coef);
            be->rope(sh->rope, c->proj, 1, c->h, p);
        }
        int rows = c->row_gen + L->n_gen + 1;
        max_rows = rows > max_rows ? rows : max_rows;
    }
    sk_group *g = NULL;
    if ((rc = group_get(cs, n, &g))) return rc;
    size_t lay = (size_t)layer * n;
    int dirty = 0;
    for (int i = 0; i < n; i++)
        if (g->ver[lay + i] != cs[i]->L[layer].ver) {
            group_fill(g, cs[i], layer, i, group_lg(cs, i));
            dirty = 1;
        }
    if (dirty) {
        size_t b = sizeof(sk_job) * n * g->h;
        be->copy2d(g->jobs_d + lay * g->h, b, g->jobs_h + lay * g->h, b, b, 1);
    }
    for (int i = 0; i < n; i++) {
        g->seq_h[2 * (lay + i)] = row[i];
        g->seq_h[2 * (lay + i) + 1] = cs[i]->L[layer].n_gen;
    }
    be->copy2d(g->seq_d + 2 * lay, sizeof(int) * 2 * n, g->seq_h + 2 * lay, sizeof(int) * 2 * n, sizeof(int) * 2 * n,
               1);
    sk_step st = {
        .jobs = g->jobs_d + lay * g->h, .seq = g->seq_d + 2 * lay, .n_jobs = n * g->h, .group = c0->group,
        .d = c0->d, .kvd = c0->kvd, .qd = sh->n_heads * sh->head_dim, .max_cand = g->max_cand, .max_k = g->max_k,
        .max_c = g->max_c, .max_rows = max_rows, .rope = sh->rope, .rope_new = rope, .lg = g->lg, .part = g->part,
        .done = g->done,
    };
    be->sk_step_append(&st, q, k, v);
    be->sk_step_logits(&st, q);
    be->sk_step_select(&st);
    be->sk_step_fetch(&st);
    be->sk_step_rebuild(&st);
    be->sk_step_attend(&st, q, out);
    double dt = (skv_now() - w0) / n;
    uint64_t sync_now = syncs_now(be);
    for (int i = 0; i < n; i++) {
        kv_sk *c = cs[i];
        c->L[layer].n_gen++;
        c->attn_seconds += dt;
        /* the layer's books to the host's pinned memory, read at the step's end (sk_settle) */
        queue_pack(c, layer, sync_now);
    }
    return 0;
}

/* Whether c can share a step's launches with a (both batchable): the same
 * backend, KV heads, head dim, group, layers and RoPE layout. */
static int sk_alike(const kv_sk *a, const kv_sk *c) {
    return c->base.shape.be == a->base.shape.be && c->h == a->h && c->d == a->d && c->group == a->group &&
           c->base.shape.n_layers == a->base.shape.n_layers &&
           c->base.shape.rope->rope_dim == a->base.shape.rope->rope_dim &&
           c->base.shape.rope->mode == a->base.shape.rope->mode;
}

/* kv_class.step_batch: the caches that can run in the fused launches do,
 * up to SK_GROUP_MAX a table, alike (KV heads, head dim, group, backend) to
 * the first of them; any other runs append then attend alone, as the
 * per-cache calls would (the CPU backend always: its results stay bit for
 * bit). RoPE (step_ropes): when every cache runs fused, in the append
 * launch; else rope_qk first for the whole batch, as the forward calls it. */
static int sk_step_batch(kv_cache *const *cv, int n, int layer, const int *pos, const float *k_pre, const float *k,
                         const float *v, const float *q, float *out) {
    const kv_shape *sh = &cv[0]->shape;
    size_t kvd = (size_t)sh->n_kv_heads * sh->head_dim, qd = (size_t)sh->n_heads * sh->head_dim;
    kv_sk *cs[SK_GROUP_MAX];
    int row[SK_GROUP_MAX], m = 0, rc, all = 1;
    /* the forward's buffers (kv.h: step_ropes), rotated here */
    float *qw = (float *)q, *kw = (float *)k, *kpw = (float *)k_pre;
    const kv_sk *first = NULL;
    for (int i = 0; i < n && all; i++) {
        const kv_sk *c = (const kv_sk *)cv[i];
        int fit = sk_batchable(c);
        if (fit && first) fit = sk_alike(first, c);
        if (fit && !first) first = c;
        all = fit;
    }
    if (!all) sh->be->rope_qk(sh->rope, qw, sh->n_heads, kw, sh->n_kv_heads, kpw, n, pos[0], n > 1 ? pos : NULL);
    for (int i = 0; i < n; i++) {
        kv_sk *c = (kv_sk *)cv[i];
        int fit = sk_batchable(c);
        if (fit && m) fit = sk_alike(cs[0], c);
        if (!fit) {
            SKV_ASSERT(!all); /* alike is an equivalence: the first pass saw it */
            size_t ok = (size_t)i * kvd, oq = (size_t)i * qd;
            if ((rc = sk_append(cv[i], layer, pos[i], 1, k_pre + ok, k + ok, v + ok))) return rc;
            if ((rc = sk_attend(cv[i], layer, pos[i], 1, q + oq, out + oq))) return rc;
            continue;
        }
        cs[m] = c;
        row[m++] = i;
        if (m == SK_GROUP_MAX) {
            if ((rc = group_step(cs, row, m, layer, pos, k_pre, k, v, qw, out, all))) return rc;
            m = 0;
        }
    }
    return m ? group_step(cs, row, m, layer, pos, k_pre, k, v, qw, out, all) : 0;
}

/* ---- end of prefill: compress ------------------------------------------------ */

/* Prefill-time work buffers shared by the layers. */
typedef struct {
    float *lm;             /* (h, n_chunks, d) landmarks of every full chunk */
    float *cm;             /* (h, n_chunks) cosine minima */
    float *cm_h;           /* the same in host memory (cm itself on the CPU) */
    float *tmp;            /* (n_chunks) */
    int *outl;             /* (n_chunks) */
    int *idx_d;            /* a layer's (h, n_cand) candidates, (h, n_out) outliers, a 0 (the local window's
                            * index), then with the fused books its empty chunk caches: one upload a layer,
                            * in the device's memory */
} sk_build;

static int alloc_head(kv_sk *c, int layer, int kh, sk_head *H) {
    int d = c->d;
    H->cap = c->row_gen + 32;
    H->K = sk_alloc(c, sk_row_bytes(c) * H->cap * d);
    H->V = sk_alloc(c, sk_row_bytes(c) * H->cap * d);
    H->cand = skv_malloc(sizeof(int) * (size_t)c->n_cand);
    H->lm_h = c->lm_arena + ((size_t)layer * c->h + kh) * lm_rows(c) * d;
    H->outl = skv_malloc(sizeof(int) * (size_t)c->n_out);
    if (!H->K || !H->V || !H->cand || !H->outl)
        return skv_error(SKV_ENOMEM, "shadowkv: out of memory for a KV head of %d rows", H->cap);
    /* Slots are filled before they are first read; zero them for the
     * sanitizers (a device backend's alloc zeroes). */
    if (!sk_dev(c)) {
        memset(H->K, 0, sk_row_bytes(c) * H->cap * d);
        memset(H->V, 0, sk_row_bytes(c) * H->cap * d);
    }
    return shadowkv_cache_init(&H->cache, c->k, c->n_cand);
}

/* SVD, landmarks, cosine minima, outliers and offload of one layer. */
/* The SVD of one layer's pre-RoPE keys (U, Σ·Vᵀ split per KV head), the
 * watched span's key error, then the pre-RoPE keys freed. sv (min(s, kvd))
 * gets the spectrum, t (2) the probe times around it. Layers are
 * independent: sk_end_prefill runs them in parallel. */
static int svd_layer(kv_sk *c, int layer, float *sv, double *t) {
    sk_layer *L = &c->L[layer];
    int s = c->s, h = c->h, d = c->d, kvd = c->kvd, r = c->r;
    t[0] = probe_time(c->base.bus);
    L->U = (char *)c->u_arena + (size_t)layer * s * r * sk_u_bytes(c);
    L->SVt = sk_alloc(c, sizeof(float) * (size_t)r * kvd);
    float *svt = sk_alloc(c, sizeof(float) * (size_t)r * kvd);
    /* the SVD's f32 U, kept in bf16 (with f32_state, L->U itself) */
    float *u = c->so.f32_state ? L->U : sk_alloc(c, sizeof(float) * (size_t)s * r);
    if (c->so.plus) L->Vt = sk_alloc(c, sizeof(float) * (size_t)r * kvd);
    if (!L->SVt || !svt || !u || (c->so.plus && !L->Vt)) {
        sk_release(c, svt);
        if (u != L->U) sk_release(c, u);
        return skv_error(SKV_ENOMEM, "shadowkv: out of memory for the rank-%d factors of layer %d", r, layer);
    }
    int rc = c->base.shape.be->svd(L->kpre, s, kvd, r, u, svt, L->Vt, sv, &L->rel_err);
    if (u != L->U) {
        if (!rc) c->base.shape.be->pack_h(u, (size_t)s * r, L->U, SKV_ELT_BF16);
        sk_release(c, u);
    }
    if (rc) {
        sk_release(c, svt);
        return skv_error(rc, "shadowkv: layer %d: %s", layer, skv_last_error());
    }
    /* Σ·Vᵀ split per KV head: head kh's (r, d) block */
    for (int kh = 0; kh < h; kh++)
        sk_copy_rows(c, L->SVt + (size_t)kh * r * d, (size_t)d, svt + (size_t)kh * d, (size_t)kvd, d, r);
    sk_release(c, svt);
    if (c->nw) watch_key_err(c, L, layer);
    sk_release(c, L->kpre);
    L->kpre = NULL;
    t[1] = probe_time(c->base.bus);
    return 0;
}

/* The ints of a layer's chunk caches for the fused books (sk_fused): per KV
 * head slot_id (k) and where (n_cand), -1 when empty, then stamp (k) and
 * epoch (1), 0. */
static size_t fused_cache_ints(const kv_sk *c) {
    size_t h = (size_t)c->h, nc = (size_t)c->n_cand, k = (size_t)c->k;
    return 2 * h * k + h * nc + h;
}

/* A layer's candidates and chunk caches in the device's memory, for the
 * fused books; build_layer fills them from its one upload. */
static int fused_init(kv_sk *c, sk_layer *L) {
    L->cand_d = sk_alloc(c, sizeof(int) * (size_t)c->h * c->n_cand);
    L->cache_d = sk_alloc(c, sizeof(int) * fused_cache_ints(c));
    if (!L->cand_d || !L->cache_d) return skv_error(SKV_ENOMEM, "shadowkv: out of device memory for the chunk caches");
    return 0;
}

/* Landmarks, cosine minima, outliers and offload of one layer, after its
 * SVD (sv its spectrum, t_svd its probe times and wall seconds). */
static int build_layer(kv_sk *c, int layer, sk_build *B, const float *sv, const double *t_svd, double svd_seconds) {
    sk_layer *L = &c->L[layer];
    probe_bus *bus = c->base.bus;
    int s = c->s, h = c->h, d = c->d, kvd = c->kvd, r = c->r, cc = c->c, nch = c->n_chunks;
    int spans = probe_wants(bus, PROBE_SPAN), rc = 0;
    const skv_backend *be = c->base.shape.be;
    double t[6];
    t[1] = skv_now();
    t[0] = t[1] - svd_seconds;
    if (spans) probe_emit_span(bus, PROBE_STREAM_COMPUTE, "svd", layer, c->base.step, t_svd[0], t_svd[1]);
    double p0 = spans ? probe_time(bus) : 0;

    for (int kh = 0; kh < h; kh++)
        be->landmarks(L->k + (size_t)kh * d, kvd, d, cc, nch, B->lm + (size_t)kh * nch * d);
    t[2] = skv_now();
    if (spans) span(c, PROBE_STREAM_COMPUTE, "landmarks", layer, p0), p0 = probe_time(bus);

    for (int kh = 0; kh < h; kh++)
        be->cos_min(L->k + (size_t)kh * d, kvd, d, cc, nch, B->lm + (size_t)kh * nch * d, B->cm + (size_t)kh * nch);
    if (B->cm_h != B->cm) be->download(B->cm_h, B->cm, sizeof(float) * (size_t)h * nch);
    t[3] = skv_now();
    if (spans) span(c, PROBE_STREAM_COMPUTE, "cosmin", layer, p0), p0 = probe_time(bus);
    for (int kh = 0; kh < h && c->nw; kh++)
        for (int i = 0; i < c->nw; i++)
            c->w_cm[((size_t)layer * h + kh) * c->nw + i] =
                c->wchunk[i] < nch ? B->cm_h[(size_t)kh * nch + c->wchunk[i]] : NAN;

    /* A device keeps the landmarks there and copies every head's
     * candidates in one launch a layer, rounded to half as they are stored
     * (sk_dev_ops); the CPU rounds them as it stores them. */
    int dev_ops = sk_dev(c);
    for (int kh = 0; kh < h; kh++) {
        sk_head *H = &L->head[kh];
        if ((rc = alloc_head(c, layer, kh, H))) return rc;
        int got = shadowkv_outliers(B->cm_h + (size_t)kh * nch, c->local_start, c->n_out, H->outl, B->tmp);
        SKV_ASSERT(got == c->n_out);
        int n = 0, o = 0;
        for (int j = 0; j < c->local_start; j++) {
            if (o < c->n_out && H->outl[o] == j) { o++; continue; }
            H->cand[n++] = j;
        }
        SKV_ASSERT(n == c->n_cand);
        /* the candidates' landmarks, one copy per run of consecutive chunks */
        for (int i = 0; i < n && !dev_ops;) {
            int e = i + 1;
            while (e < n && H->cand[e] == H->cand[e - 1] + 1) e++;
            vec_to_f16(H->lm_h + (size_t)i * d, B->lm + ((size_t)kh * nch + H->cand[i]) * d, (e - i) * d);
            i = e;
        }
    }
    if (sk_fused(c) && (rc = fused_init(c, L))) return rc;
    /* every head's candidates and outliers, the window's 0 and the fused
     * books' empty chunk caches in the device's memory: one upload a layer
     * (the host waits once), the books' parts then copied into the layer's
     * own buffers on the device */
    const int *cand_d = NULL, *outl_d = NULL;
    if (dev_ops) {
        size_t nc = (size_t)c->n_cand, no = (size_t)c->n_out, hn = (size_t)h * (nc + no) + 1;
        size_t nk = L->cache_d ? fused_cache_ints(c) : 0, hk = (size_t)h * (size_t)c->k;
        int *host = skv_malloc(sizeof(int) * (hn + nk));
        if (!host) return skv_error(SKV_ENOMEM, "out of memory");
        for (int kh = 0; kh < h; kh++) {
            memcpy(host + kh * nc, L->head[kh].cand, sizeof(int) * nc);
            memcpy(host + h * nc + kh * no, L->head[kh].outl, sizeof(int) * no);
        }
        host[hn - 1] = 0;
        for (size_t i = 0; i < nk; i++) host[hn + i] = i < hk + h * nc ? -1 : 0; /* slot_id, where; stamp, epoch */
        be->upload(B->idx_d, host, sizeof(int) * (hn + nk));
        free(host);
        if (L->cand_d) {
            be->copy(L->cand_d, B->idx_d, sizeof(int) * h * nc);
            be->copy(L->cache_d, B->idx_d + hn, sizeof(int) * nk);
        }
        cand_d = nc ? B->idx_d : NULL;
        outl_d = no ? B->idx_d + h * nc : NULL;
        if (cand_d)
            be->sk_gather_chunks(B->lm, (size_t)d, (size_t)nch * d, cand_d, h, c->n_cand, 1, d, L->head[0].lm_h,
                                 lm_rows(c) * d, SKV_ELT_F16);
    }
    t[4] = skv_now();
    if (spans) span(c, PROBE_STREAM_COMPUTE, "outliers", layer, p0), p0 = probe_time(bus);

    /* Dense rows (outliers, local window) into the head buffers, as row_elt
     * (rounded to bf16 as they are stored); candidate V to the store. The
     * local window is one "chunk" of n_local rows at index 0 of its start:
     * zero, an index that is 0 in the backend's memory (on a device, the
     * int of idx_d after the outliers). */
    static const int zero_host = 0;
    const int *zero = dev_ops ? B->idx_d + (size_t)h * (c->n_cand + c->n_out) : &zero_host;
    for (int kh = 0; kh < h; kh++) {
        sk_head *H = &L->head[kh];
        /* the head's outlier chunks, keys and values, a call each */
        const int *o = outl_d ? outl_d + (size_t)kh * c->n_out : H->outl;
        if (c->n_out > 0) {
            be->sk_gather_chunks(L->k + (size_t)kh * d, (size_t)kvd, 0, o, 1, c->n_out, cc, d, H->K, 0, c->row_elt);
            be->sk_gather_chunks(L->v + (size_t)kh * d, (size_t)kvd, 0, o, 1, c->n_out, cc, d, H->V, 0, c->row_elt);
        }
        size_t src = (size_t)c->local_start * cc * kvd + (size_t)kh * d;
        if (c->n_local > 0) {
            be->sk_gather_chunks(L->k + src, (size_t)kvd, 0, zero, 1, 1, c->n_local, d,
                                 sk_row(c, H->K, (size_t)c->row_local), 0, c->row_elt);
            be->sk_gather_chunks(L->v + src, (size_t)kvd, 0, zero, 1, 1, c->n_local, d,
                                 sk_row(c, H->V, (size_t)c->row_local), 0, c->row_elt);
        }
        /* the candidates' values to the store, rounded to bf16 */
        for (int i = 0; i < c->n_cand && !cand_d; i++)
            shadowkv_store_put(&c->store, (layer * h + kh) * c->n_cand + i,
                               L->v + (size_t)H->cand[i] * cc * kvd + (size_t)kh * d, kvd);
    }
    if (cand_d) /* every head's candidate values to the store in one launch, rounded to bf16 */
        be->sk_gather_chunks(L->v, (size_t)kvd, (size_t)d, cand_d, h, c->n_cand, cc, d,
                             (uint16_t *)c->store.data + (size_t)layer * h * c->n_cand * cc * d,
                             (size_t)c->n_cand * cc * d,
                             SKV_ELT_BF16);
    if (!c->o.oracle) {
        sk_release(c, L->k);
        sk_release(c, L->v);
        L->k = L->v = NULL;
        L->cap = 0;
    }
    t[5] = skv_now();
    if (spans) span(c, PROBE_STREAM_COMPUTE, "offload", layer, p0);

    if (probe_wants(bus, PROBE_PREFILL_LAYER)) {
        probe_event ev = {
            .kind = PROBE_PREFILL_LAYER,
            .prefill_layer = {
                .layer = layer, .seq_len = s, .rank = r, .n_sv = s < kvd ? s : kvd, .rel_err = L->rel_err,
                .t_svd = t[1] - t[0], .t_landmarks = t[2] - t[1], .t_cosmin = t[3] - t[2],
                .t_outliers = t[4] - t[3], .t_offload = t[5] - t[4], .sv = sv,
            },
        };
        probe_emit(bus, &ev);
    }
    if (probe_wants(bus, PROBE_PREFILL_HEAD))
        for (int kh = 0; kh < h; kh++) {
            probe_event ev = {
                .kind = PROBE_PREFILL_HEAD,
                .prefill_head = {
                    .layer = layer, .head = kh, .chunk = cc, .n_chunks = nch, .n_outliers = c->n_out,
                    .n_landmarks = c->n_cand, .local_start = c->local_start, .cos_min = B->cm_h + (size_t)kh * nch,
                    .outliers = L->head[kh].outl,
                },
            };
            probe_emit(bus, &ev);
        }
    return 0;
}

static int alloc_scratch(kv_sk *c) {
    c->scr = skv_calloc((size_t)c->h, sizeof(sk_scratch));
    size_t nc = (size_t)c->n_cand, k = (size_t)c->k, nch = (size_t)c->n_chunks;
    c->att_parts = (2 * skv_threads() + c->h - 1) / c->h;
    if (c->att_parts > 16) c->att_parts = 16;
    size_t tasks = (size_t)c->h * c->att_parts;
    c->att_po = sk_alloc(c, sizeof(float) * tasks * c->group * c->d);
    c->att_pm = sk_alloc(c, sizeof(float) * tasks * c->group);
    c->att_pl = sk_alloc(c, sizeof(float) * tasks * c->group);
    if (!c->att_po || !c->att_pm || !c->att_pl) return skv_error(SKV_ENOMEM, "out of memory");
    if (sk_fused(c)) {
        c->pack_bytes = sizeof(float) * ((size_t)c->h * nc + 3 * (size_t)c->h * k + (size_t)c->h);
        size_t nl = (size_t)c->base.shape.n_layers;
        c->pack_d = sk_alloc(c, c->pack_bytes * nl);
        c->pack_h = c->base.shape.be->host_alloc(c->pack_bytes * nl);
        c->kp = skv_malloc(sizeof(uint16_t *) * (size_t)c->h);
        c->vp = skv_malloc(sizeof(uint16_t *) * (size_t)c->h);
        if (!c->pack_d || !c->pack_h || !c->kp || !c->vp)
            return skv_error(SKV_ENOMEM, "shadowkv: out of memory for the device books");
    }
    c->rb_kh = skv_malloc(sizeof(int) * (size_t)c->h * (k ? k : 1));
    c->rb_m = skv_malloc(sizeof(int) * (size_t)c->h * (k ? k : 1));
    if (!c->scr || !c->rb_kh || !c->rb_m) return skv_error(SKV_ENOMEM, "out of memory");
    for (int kh = 0; kh < c->h; kh++) {
        sk_scratch *S = &c->scr[kh];
        S->score = skv_malloc(sizeof(float) * nc);
        S->tmp = sk_alloc(c, sizeof(float) * 2 * (size_t)c->group * (nc ? nc : 1));
        S->gscore = sk_dev(c) ? NULL : skv_malloc(sizeof(float) * (size_t)c->group * nc);
        if (sk_dev(c)) {
            S->score_d = sk_alloc(c, sizeof(float) * (nc ? nc : 1));
            S->sel_d = sk_alloc(c, sizeof(int) * (k ? k : 1));
            if (!S->score_d || !S->sel_d) return skv_error(SKV_ENOMEM, "out of memory");
        }
        S->sel = skv_malloc(sizeof(int) * k);
        S->sel_id = skv_malloc(sizeof(int) * k);
        S->sel_score = skv_malloc(sizeof(float) * k);
        S->slot_of = skv_malloc(sizeof(int) * k);
        S->miss = skv_malloc(sizeof(int) * k);
        S->g_idx = skv_malloc(sizeof(int) * k);
        S->g_off = skv_malloc(sizeof(size_t) * k);
        if (!S->score || !S->tmp || (!S->gscore && !sk_dev(c)) || !S->sel || !S->sel_id || !S->sel_score || !S->slot_of || !S->miss || !S->g_idx ||
            !S->g_off)
            return skv_error(SKV_ENOMEM, "out of memory");
        if (c->o.oracle) {
            S->p = skv_malloc(sizeof(float) * (size_t)c->base.shape.max_ctx);
            S->mass = skv_malloc(sizeof(float) * nch);
            S->cand_key = skv_malloc(sizeof(float) * nc);
            S->order = skv_malloc(sizeof(int) * nc);
            S->rank_tmp = skv_malloc(sizeof(int) * nc);
            S->rank_exact = skv_malloc(sizeof(int) * nch);
            S->rank_lm = skv_malloc(sizeof(int) * nch);
            if (!S->p || !S->mass || !S->cand_key || !S->order || !S->rank_tmp || !S->rank_exact || !S->rank_lm)
                return skv_error(SKV_ENOMEM, "out of memory");
        }
    }
    return 0;
}

/* Clips the watched span to the prompt and allocates the watch buffers. */
static int watch_init(kv_sk *c) {
    c->wb = c->o.watch_begin > 0 ? c->o.watch_begin : 0;
    c->we = c->o.watch_end < c->s ? c->o.watch_end : c->s;
    c->nw = 0;
    if (c->we <= c->wb) return 0;
    int j0 = c->wb / c->c, nw = (c->we - 1) / c->c - j0 + 1, nl = c->base.shape.n_layers;
    size_t lh = (size_t)nl * c->h;
    c->wchunk = skv_malloc(sizeof(int) * nw);
    c->w_err = skv_calloc(lh, sizeof(float));
    c->w_cm = skv_malloc(sizeof(float) * lh * nw);
    c->w_part = skv_malloc(sizeof(int) * nw);
    c->w_rank = skv_malloc(sizeof(int) * nw);
    c->w_sel = skv_malloc(sizeof(int) * nw);
    c->w_rexact = skv_malloc(sizeof(int) * nw);
    c->w_mass = skv_malloc(sizeof(float) * nw);
    c->w_rowbase = skv_malloc(sizeof(int) * ((size_t)c->n_chunks + 1));
    c->w_p = skv_malloc(sizeof(float) * (size_t)c->base.shape.max_ctx);
    c->w_o = skv_malloc(sizeof(float) * (size_t)c->d);
    if (!c->wchunk || !c->w_err || !c->w_cm || !c->w_part || !c->w_rank || !c->w_sel || !c->w_rexact || !c->w_mass ||
        !c->w_rowbase || !c->w_p || !c->w_o)
        return skv_error(SKV_ENOMEM, "shadowkv: out of memory for the needle watch");
    for (int i = 0; i < nw; i++) c->wchunk[i] = j0 + i;
    for (size_t i = 0; i < lh * nw; i++) c->w_cm[i] = NAN;
    c->nw = nw;
    return 0;
}

/* A prompt of s tokens in chunks of so.chunk: its chunks, the first of
 * the local window, the outlier chunks; returns the candidates (the chunks
 * before the window, less the outliers). */
static int sk_chunks(const kv_sk *c, int s, int *n_chunks, int *local_start, int *n_out) {
    *n_chunks = s / c->so.chunk;
    *local_start = *n_chunks > c->so.local ? *n_chunks - c->so.local : 0;
    *n_out = c->so.outliers < *local_start ? c->so.outliers : *local_start;
    return *local_start - *n_out;
}

/* The bytes of the offload store on a device (bf16 values of every
 * candidate chunk) for a prompt of s tokens. */
static size_t sk_dev_store_bytes(const kv_sk *c, int s) {
    int nch, ls, no, nc = sk_chunks(c, s, &nch, &ls, &no);
    return sizeof(uint16_t) * (size_t)c->base.shape.n_layers * c->h * nc * c->so.chunk * c->d;
}

/* On a device the offload store is pinned host memory, which pins at
 * about 1 GB/s: started in the background at the prompt's start, it is
 * ready (or nearly) when end_prefill fills it. */
static void sk_begin_prefill(kv_cache *base, int n) {
    kv_sk *c = (kv_sk *)base;
    const skv_backend *be = base->shape.be;
    if (!sk_dev(c) || !be->host_reserve || c->prefilled || n < 1) return;
    size_t bytes = sk_dev_store_bytes(c, n);
    if (bytes) be->host_reserve(bytes);
}

static int sk_end_prefill(kv_cache *base) {
    kv_sk *c = (kv_sk *)base;
    const kv_shape *sh = &base->shape;
    if (c->prefilled) return skv_error(SKV_EINVAL, "shadowkv: end_prefill called twice");
    int s = c->L[0].n;
    for (int l = 1; l < sh->n_layers; l++)
        if (c->L[l].n != s)
            return skv_error(SKV_EINVAL, "shadowkv: layer %d holds %d prompt tokens, layer 0 holds %d", l, c->L[l].n, s);
    if (s < 1) return skv_error(SKV_EINVAL, "shadowkv: end_prefill with an empty prompt");
    if (sk_dev(c) && c->o.offload_file[0])
        return skv_error(SKV_EUNSUPPORTED, "shadowkv: --offload-file is a tier of the cpu backend; on %s the values "
                         "live in pinned host memory", sh->be->name);
    if (sk_dev(c) && (c->o.oracle || c->o.watch_end > c->o.watch_begin))
        return skv_error(SKV_EUNSUPPORTED, "shadowkv: the oracle and the needle watch read host memory: use --backend cpu");
    if (sk_dev(c) && !sk_dev_ops(c))
        return skv_error(SKV_EUNSUPPORTED, "shadowkv: backend %s lacks the pack_h and sk_gather_chunks ops the "
                         "compression needs: use --backend cpu", sh->be->name);
    base->notice[0] = 0;
    c->s = s;
    c->c = c->so.chunk;
    c->n_cand = sk_chunks(c, s, &c->n_chunks, &c->local_start, &c->n_out);
    c->n_local = s - c->local_start * c->c;
    int budget = kv_budget_tokens(&c->o, s);
    int want_k = budget / c->c;
    c->k = want_k < c->n_cand ? want_k : c->n_cand;
    int max_r = s < c->kvd ? s : c->kvd;
    c->r = c->so.rank < max_r ? c->so.rank : max_r;
    if (c->so.rank > max_r)
        notice_add(c, "shadowkv: rank %d > min(%d tokens, %d = kv_heads*head_dim); using %d", c->so.rank, s, c->kvd,
                   c->r);
    if (c->n_cand == 0)
        notice_add(c,
                   "shadowkv: a %d-token prompt leaves no chunk to select outside the %d-token local window and %d "
                   "outlier chunk%s; attention is dense", s, c->n_local, c->n_out, c->n_out == 1 ? "" : "s");
    else if (want_k > c->n_cand)
        notice_add(c, "shadowkv: budget %d tokens > %d candidate tokens in a %d-token prompt; using all %d chunks",
                   budget, c->n_cand * c->c, s, c->n_cand);
    else if (c->k == 0)
        notice_add(c, "shadowkv: budget %d tokens is less than one chunk of %d; no chunk is selected", budget,
                   c->c);
    c->row_slot = c->n_out * c->c;
    /* the rows in bf16, but in f32 with f32_state and when they are the
     * whole prompt (no candidate: attention is dense, and stays exact) */
    c->row_elt = c->so.f32_state || c->n_cand == 0 ? SKV_ELT_F32 : SKV_ELT_BF16;
    c->row_local = c->row_slot + c->k * c->c;
    c->row_gen = c->row_local + c->n_local;

    int half = sh->rope->rope_dim / 2, rc = 0;
    /* the cosine and sine tables in one block (sn at a 256-byte boundary
     * after cs): on a device, one upload */
    size_t tab = sizeof(float) * (size_t)s * (half ? half : 1), off = (tab + 255) & ~(size_t)255;
    float *cs = skv_malloc_huge(off + tab); /* host memory; the backend's is rope_cs */
    c->proj = sk_alloc(c, sizeof(float) * (size_t)c->kvd);
    c->coef = sk_alloc(c, sizeof(float) * (size_t)c->r);
    if (!cs || !c->proj || !c->coef) {
        free(cs);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    memset((char *)cs + tab, 0, off - tab);
    shadowkv_rope_table(sh->rope, s, cs, (float *)((char *)cs + off));
    if (sk_dev(c)) { /* the tables the rebuild reads, in the device's memory */
        float *d = sh->be->alloc(off + tab);
        if (d) sh->be->upload(d, cs, off + tab);
        free(cs);
        if (!d) return skv_error(SKV_ENOMEM, "shadowkv: out of device memory for RoPE tables");
        cs = d;
    }
    c->rope_cs = cs;
    c->rope_sn = (float *)((char *)cs + off);
    int n_blocks = sh->n_layers * c->h * c->n_cand;
    void *(*pin)(size_t) = sh->be->host_alloc_raw ? sh->be->host_alloc_raw : sh->be->host_alloc;
    if (sk_dev(c)) {
        /* the offloaded values in pinned, mapped host memory: the device's gather reads them over the bus
         * (the block sk_begin_prefill reserved, when the prompt is as long as it said) */
        size_t bytes = sk_dev_store_bytes(c, s);
        uint16_t *data = pin(bytes ? bytes : sizeof(float)); /* written whole by the offload: not zeroed */
        if (!data) return skv_error(SKV_ENOMEM, "shadowkv: cannot pin %.1f MiB of host memory for the offloaded values",
                                    bytes / 1048576.0);
        shadowkv_store_adopt(&c->store, n_blocks, c->c, c->d, data, sh->be->host_free);
    } else if ((rc = shadowkv_store_init(&c->store, n_blocks, c->c, c->d, sk_u_bytes(c), c->o.offload_file))) {
        return rc;
    }
    c->u_arena = sk_alloc_big(c, (size_t)sk_u_bytes(c) * sh->n_layers * s * c->r);
    c->lm_arena = sk_alloc_big(c, sizeof(uint16_t) * (size_t)sh->n_layers * c->h * lm_rows(c) * c->d);
    if (!c->u_arena || !c->lm_arena)
        return skv_error(SKV_ENOMEM, "shadowkv: out of memory for the rank-%d factors and landmarks", c->r);
    if ((rc = alloc_scratch(c))) return rc;
    if ((rc = watch_init(c))) return rc;
    if (!sk_dev(c) && c->so.overlap == 2 && c->n_cand > 0 && c->k > 0 && (rc = fetcher_start(c))) return rc;

    sk_build B = {0};
    int nch = c->n_chunks ? c->n_chunks : 1, nl = sh->n_layers;
    float *sv = skv_malloc(sizeof(float) * (size_t)nl * max_r);
    double *t_svd = skv_malloc(sizeof(double) * 3 * (size_t)nl);
    int *rcs = skv_calloc((size_t)nl, sizeof(int));
    B.lm = sk_alloc(c, sizeof(float) * (size_t)c->h * nch * c->d);
    B.cm = sk_alloc(c, sizeof(float) * (size_t)c->h * nch);
    /* the minima the host reads (outliers, probes) come down into pinned
     * memory: a copy the one stream sync waits for, not a second blocking
     * copy through pageable memory */
    B.cm_h = sk_dev(c) ? pin(sizeof(float) * (size_t)c->h * nch) : B.cm;
    B.tmp = skv_malloc(sizeof(float) * (size_t)nch);
    B.outl = skv_malloc(sizeof(int) * (size_t)nch);
    B.idx_d = sk_dev(c) ? sk_alloc(c, sizeof(int) * ((size_t)c->h * (c->n_cand + c->n_out) + 1 +
                                                    (sk_fused(c) ? fused_cache_ints(c) : 0)))
                        : NULL;
    if (!sv || !t_svd || !rcs || !B.lm || !B.cm || !B.cm_h || !B.tmp || !B.outl || (sk_dev(c) && !B.idx_d))
        rc = skv_error(SKV_ENOMEM, "out of memory");
    /* The SVDs first, one layer per thread (each single-threaded BLAS);
     * errors are thread-local, so each layer keeps its message, and the
     * first failing layer's is reported. */
    char (*msg)[256] = rc ? NULL : skv_calloc((size_t)nl, sizeof *msg);
    if (!rc && !msg) rc = skv_error(SKV_ENOMEM, "out of memory");
    if (!rc) {
        /* a device backend's ops are queued from one thread */
        #pragma omp parallel for schedule(dynamic, 1) if (!sk_dev(c))
        for (int l = 0; l < nl; l++) {
            double w = skv_now();
            rcs[l] = svd_layer(c, l, sv + (size_t)l * max_r, t_svd + 3 * (size_t)l);
            t_svd[3 * (size_t)l + 2] = skv_now() - w;
            if (rcs[l]) snprintf(msg[l], sizeof msg[l], "%s", skv_last_error());
        }
        for (int l = 0; l < nl && !rc; l++)
            if (rcs[l]) rc = skv_error(rcs[l], "%s", msg[l]);
    }
    free(msg);
    for (int l = 0; !rc && l < nl; l++)
        rc = build_layer(c, l, &B, sv + (size_t)l * max_r, t_svd + 3 * (size_t)l, t_svd[3 * (size_t)l + 2]);
    if (B.cm_h && B.cm_h != B.cm) sh->be->host_free(B.cm_h);
    sk_release(c, B.lm);
    sk_release(c, B.cm);
    sk_release(c, B.idx_d);
    free(sv); free(t_svd); free(rcs); free(B.tmp); free(B.outl);
    if (rc) return rc;
    c->prefilled = 1;
    if (c->nw && probe_wants(base->bus, PROBE_NEEDLE))
        for (int l = 0; l < sh->n_layers; l++)
            for (int kh = 0; kh < c->h; kh++) {
                probe_event ev = watch_event(c, &c->L[l].head[kh], l, kh);
                probe_emit(base->bus, &ev);
            }
    return 0;
}

/* ---- bytes, stats, free --------------------------------------------------------- */

static void parts(const kv_sk *c, kv_shadowkv_stats *st) {
    const kv_shape *sh = &c->base.shape;
    size_t f = sizeof(float), d = c->d, h = c->h, cc = c->c;
    for (int l = 0; l < sh->n_layers; l++) {
        const sk_layer *L = &c->L[l];
        if (!c->prefilled) {
            st->b_prefill += 3 * (size_t)L->n * c->kvd * f;
            continue;
        }
        st->b_U += (size_t)c->s * c->r * sk_u_bytes(c);
        st->b_SVt += (size_t)c->r * c->kvd * f * (c->so.plus ? 2 : 1);
        st->b_landmarks += h * c->n_cand * d * sizeof(uint16_t);
        size_t rb = sk_row_bytes(c); /* the heads' rows */
        st->b_outliers += 2 * h * c->n_out * cc * d * rb;
        st->b_local += 2 * h * c->n_local * d * rb;
        st->b_generated += 2 * h * L->n_gen * d * rb;
        st->b_cache += 2 * h * c->k * cc * d * rb;
        if (c->o.oracle) st->b_oracle += 2 * (size_t)L->n * c->kvd * f;
    }
    st->resident = st->b_U + st->b_SVt + st->b_landmarks + st->b_outliers + st->b_local + st->b_generated +
                   st->b_cache + st->b_prefill;
    st->offloaded = shadowkv_store_bytes(&c->store);
}

static void sk_bytes(const kv_cache *base, size_t *resident, size_t *offloaded) {
    kv_shadowkv_stats st = {0};
    parts((const kv_sk *)base, &st);
    *resident = st.resident;
    *offloaded = st.offloaded;
}

int kv_shadowkv_stats_get(const kv_cache *base, kv_shadowkv_stats *st) {
    while (base && base->wrapped) base = base->wrapped;
    if (!base || base->cls != &kv_policy_shadowkv)
        return skv_error(SKV_EINVAL, "KV stats: the cache is not a shadowkv cache");
    /* books still on the device are read first (the cache is the caller's
     * to change: stats are read between steps) */
    sk_settle((kv_sk *)(uintptr_t)base);
    const kv_sk *c = (const kv_sk *)base;
    memset(st, 0, sizeof *st);
    st->prefilled = c->prefilled;
    st->chunk = c->so.chunk;
    st->oracle_recall_sel = st->oracle_recall_sparse = -1;
    parts(c, st);
    if (!c->prefilled) {
        st->prompt_len = c->L[0].n;
        return 0;
    }
    st->prompt_len = c->s;
    st->rank = c->r;
    st->n_chunks = c->n_chunks;
    st->local_start = c->local_start;
    st->local_tokens = c->n_local;
    st->outliers = c->n_out;
    st->candidates = c->n_cand;
    st->k = c->k;
    st->dense = c->n_cand == 0;
    st->generated = c->L[0].n_gen;
    st->steps = c->steps;
    st->hits = c->hits;
    st->misses = c->misses;
    st->fetches = c->store.n_fetch;
    st->fetch_bytes = c->store.fetch_bytes;
    st->step_hits = c->step_hits;
    st->step_misses = c->step_misses;
    st->step_fetches = c->step_fetches;
    st->step_fetch_bytes = c->step_fetch_bytes;
    st->fetch_seconds = c->fetch_seconds;
    st->attn_seconds = c->attn_seconds;
    memcpy(st->stage_seconds, c->stage_seconds, sizeof st->stage_seconds);
    st->dense_bytes = c->dense_bytes;
    st->file_tier = c->store.mapped;
    st->overlap = c->fx.started;
    double sum = 0;
    for (int l = 0; l < base->shape.n_layers; l++) {
        sum += c->L[l].rel_err;
        if (c->L[l].rel_err > st->rel_err_max) st->rel_err_max = c->L[l].rel_err;
    }
    st->rel_err_mean = (float)(sum / base->shape.n_layers);
    if (c->o.oracle && c->recall_n) {
        st->oracle_recall_sel = c->recall_sel_sum / c->recall_n;
        st->oracle_recall_sparse = c->recall_sparse_sum / c->recall_n;
    }
    return 0;
}

float kv_shadowkv_rel_err(const kv_cache *base, int layer) {
    while (base && base->wrapped) base = base->wrapped;
    if (!base || base->cls != &kv_policy_shadowkv) return -1;
    const kv_sk *c = (const kv_sk *)base;
    if (!c->prefilled || layer < 0 || layer >= base->shape.n_layers) return -1;
    return c->L[layer].rel_err;
}

static void sk_free(kv_cache *base) {
    kv_sk *c = (kv_sk *)base;
    fetcher_stop(c);
    group_free(c);
    free(c->rb_kh); free(c->rb_m);
    sk_release(c, c->pack_d);
    if (c->pack_h) c->base.shape.be->host_free(c->pack_h);
    free(c->kp); free(c->vp);
    sk_release(c, c->att_po); sk_release(c, c->att_pm); sk_release(c, c->att_pl);
    for (int l = 0; c->L && l < base->shape.n_layers; l++) {
        sk_layer *L = &c->L[l];
        sk_release(c, L->kpre); sk_release(c, L->k); sk_release(c, L->v);
        sk_release(c, L->SVt); sk_release(c, L->Vt);
        sk_release(c, L->cand_d); sk_release(c, L->cache_d);
        for (int kh = 0; L->head && kh < c->h; kh++) {
            sk_head *H = &L->head[kh];
            sk_release(c, H->K); sk_release(c, H->V);
            free(H->cand); free(H->outl);
            shadowkv_cache_free(&H->cache);
        }
        free(L->head);
    }
    free(c->L);
    sk_release(c, c->u_arena); sk_release(c, c->lm_arena);
    for (int kh = 0; c->scr && kh < c->h; kh++) {
        sk_scratch *S = &c->scr[kh];
        sk_release(c, S->tmp); sk_release(c, S->score_d); sk_release(c, S->sel_d);
        free(S->score); free(S->gscore); free(S->sel); free(S->sel_id); free(S->sel_score);
        free(S->slot_of); free(S->miss); free(S->g_idx); free(S->g_off);
        free(S->p); free(S->mass); free(S->cand_key); free(S->order); free(S->rank_tmp);
        free(S->rank_exact); free(S->rank_lm);
    }
    free(c->scr);
    sk_release(c, c->rope_cs); /* rope_sn with it */
    sk_release(c, c->proj); sk_release(c, c->coef);
    free(c->wchunk); free(c->w_err); free(c->w_cm); free(c->w_part); free(c->w_rank); free(c->w_sel);
    free(c->w_rexact); free(c->w_mass); free(c->w_rowbase); free(c->w_p); free(c->w_o);
    shadowkv_store_free(&c->store);
    free(c);
}

/* What the last decode attend of layer read for query head hq: outliers,
 * the selected chunks, the local window and the generated tokens. Valid
 * right after that attend (the selection scratch is shared by the layers). */
static int sk_kept(const kv_cache *base, int layer, int hq, int *pos, int *unit) {
    const kv_sk *c = (const kv_sk *)base;
    const sk_layer *L = &c->L[layer];
    int kh = hq / c->group, cc = c->c, n = 0;
    *unit = cc;
    if (!c->prefilled || c->n_cand == 0) {
        for (int t = 0; t < c->s + L->n_gen; t++) pos[n++] = t;
        return n;
    }
    const sk_head *H = &L->head[kh];
    for (int i = 0; i < c->n_out; i++)
        for (int t = H->outl[i] * cc; t < (H->outl[i] + 1) * cc; t++) pos[n++] = t;
    for (int i = 0; i < c->k; i++)
        for (int t = c->scr[kh].sel_id[i] * cc; t < (c->scr[kh].sel_id[i] + 1) * cc; t++) pos[n++] = t;
    for (int t = c->local_start * cc; t < c->s + L->n_gen; t++) pos[n++] = t;
    return n;
}

/* The policy's stats, in the order sk_stats fills them. */
static const kv_stat_def sk_stat_defs[] = {
    {"prompt_len", "tokens", "tokens in the prompt"},
    {"rank", "", "SVD rank r of the pre-RoPE keys actually used"},
    {"chunk", "tokens", "tokens per chunk"},
    {"n_chunks", "chunks", "full chunks in the prompt"},
    {"local_tokens", "tokens", "dense local window (local chunks + the s mod c tail)"},
    {"outliers", "chunks", "outlier chunks kept dense per KV head"},
    {"candidates", "chunks", "chunks per KV head that can be selected"},
    {"k", "chunks", "chunks selected per KV head and step"},
    {"generated", "tokens", "tokens appended after the prompt"},
    {"steps", "", "decode steps attended"},
    {"hits", "chunks", "chunk cache hits, all layers, heads and steps"},
    {"misses", "chunks", "chunk cache misses"},
    {"hit_rate", "%", "hits / (hits + misses)"},
    {"fetch_bytes", "B", "value bytes fetched from the offload store"},
    {"step_hits", "chunks", "cache hits of the last decode step"},
    {"step_misses", "chunks", "cache misses of the last decode step"},
    {"step_fetches", "chunks", "chunks fetched in the last decode step"},
    {"step_fetch_bytes", "B", "bytes fetched in the last decode step"},
    {"resident", "B", "bytes resident (U, SVt, landmarks, outliers, local, generated, cache slots)"},
    {"offloaded", "B", "bytes in the offload store (the candidates' values)"},
    {"svd_err_mean", "", "relative SVD error of the pre-RoPE keys, mean over layers"},
    {"svd_err_max", "", "relative SVD error, max over layers"},
    {"recall_sel", "%", "oracle: exact attention mass on the selected chunks (mean)"},
    {"recall_sparse", "%", "oracle: exact attention mass on the whole sparse set (mean)"},
    {"equiv_bw_x", "x", "paper's equivalent bandwidth at the measured hit rate, in units of HBM (HBM/PCIe = 62.5)"},
    {"mem_saving_x", "x", "paper's memory saving over dense"},
    {"fetch_gbs", "GB/s", "measured: value bytes fetched / wall time of the fetches"},
    {"equiv_gbs", "GB/s", "measured equivalent bandwidth: K and V bytes exact attention would read / wall time of "
                          "the sparse decode attention"},
    {"tier", "", "where the offloaded values live: 0 host memory, 1 a file (--offload-file)"},
    {"select_ms", "ms", "measured, per decode step (all layers): landmark scores, softmax, top-k and cache books"},
    {"rebuild_ms", "ms", "measured, per decode step: value fetch and key rebuild of the misses (overlapped)"},
    {"attend_ms", "ms", "measured, per decode step: exact attention over the selected, outlier and local rows"},
};

_Static_assert(sizeof sk_stat_defs / sizeof sk_stat_defs[0] <= KV_MAX_STATS, "the stats fit kv_stat's buffer");

static void sk_stats(const kv_cache *base, double *v) {
    kv_shadowkv_stats st;
    kv_shadowkv_stats_get(base, &st);
    double hm = (double)st.hits + st.misses, alpha = hm > 0 ? st.hits / hm : 0;
    /* the stage clocks run on the CPU backend (a device's stages are queued) */
    int staged = st.steps > 0 && !sk_dev((const kv_sk *)base);
    /* The paper's formulas (DESIGN.md), with M floats per K or V vector and the
     * paper's A100-class HBM/PCIe ratio. */
    double M = (double)base->shape.n_kv_heads * base->shape.head_dim;
    double S = st.prompt_len, C = st.chunk, K = st.k, O = st.outliers, r = st.rank;
    const double hbm_over_pcie = 2.0e12 / 32e9;
    double eq_bw = 2 * S / (S / C + 2 * (K + O) * C + (1 - alpha) * K * C * hbm_over_pcie);
    double saving = 2 * S * M / (S * M / C + 2 * (K + O) * C * M + S * r + r * M);
    double out[] = {
        st.prompt_len, st.rank, st.chunk, st.n_chunks, st.local_tokens, st.outliers, st.candidates, st.k,
        st.generated, st.steps, (double)st.hits, (double)st.misses, hm > 0 ? 100 * alpha : NAN,
        (double)st.fetch_bytes, (double)st.step_hits, (double)st.step_misses, (double)st.step_fetches,
        (double)st.step_fetch_bytes, (double)st.resident, (double)st.offloaded, st.rel_err_mean, st.rel_err_max,
        st.oracle_recall_sel >= 0 ? 100 * st.oracle_recall_sel : NAN,
        st.oracle_recall_sparse >= 0 ? 100 * st.oracle_recall_sparse : NAN,
        st.prefilled ? eq_bw : NAN, st.prefilled ? saving : NAN,
        st.fetch_seconds > 0 ? st.fetch_bytes / st.fetch_seconds / 1e9 : NAN,
        st.attn_seconds > 0 ? st.dense_bytes / st.attn_seconds / 1e9 : NAN, st.file_tier,
        staged ? 1e3 * st.stage_seconds[0] / st.steps : NAN,
        staged ? 1e3 * st.stage_seconds[1] / st.steps : NAN,
        staged ? 1e3 * st.stage_seconds[2] / st.steps : NAN,
    };
    _Static_assert(sizeof out / sizeof out[0] == sizeof sk_stat_defs / sizeof sk_stat_defs[0], "one value per stat");
    memcpy(v, out, sizeof out);
}

/* Options and defaults of the ShadowKV reference code. */
static int sk_floor(const kv_opts *o, char *why, size_t n) {
    int c = kv_opt_int(o, &kv_policy_shadowkv, "chunk");
    snprintf(why, n, "1 chunk of %d tokens: k = budget / chunk chunks are selected beside the outliers and the "
             "local window", c);
    return c;
}

static const kv_opt_def sk_opt_defs[] = {
    {"rank", "--rank", KV_OPT_INT, 160, 1, 1 << 16, "SVD rank of the pre-RoPE keys"},
    {"chunk", "--chunk", KV_OPT_INT, 8, 1, 4096, "tokens per chunk"},
    {"outliers", "--outliers", KV_OPT_INT, 48, 0, 1 << 24, "outlier chunks kept dense per KV head"},
    {"local", "--local", KV_OPT_INT, 4, 0, 1 << 24, "chunks of the dense local window"},
    {"plus", "--shadowkv-plus", KV_OPT_FLAG, 0, 0, 1, "ShadowKV+: project generated keys onto the prefill basis"},
    {"overlap", NULL, KV_OPT_INT, 1, 0, 2,
     "1: a fetch thread copies missed values while the compute threads rebuild keys; 0: one after the other"},
    {"f32_state", NULL, KV_OPT_FLAG, 0, 0, 1,
     "U and offloaded values in f32, not bf16 (cpu backend only; twice their bytes)"},
};

static int sk_create(const kv_opts *o, const kv_shape *shape, kv_cache **out) {
    return kv_shadowkv_new(o, shape, out);
}

const kv_class kv_policy_shadowkv = {
    .name = "shadowkv",
    .summary = "low-rank pre-RoPE keys, offloaded values, top-k chunks by landmark score (Sun et al., ICML 2025)",
    .opts = sk_opt_defs,
    .n_opts = sizeof sk_opt_defs / sizeof sk_opt_defs[0],
    .budgeted = 1,
    .prefill_pure = 1,
    .device = 1,
    .stat_defs = sk_stat_defs,
    .n_stats = sizeof sk_stat_defs / sizeof sk_stat_defs[0],
    .create = sk_create,
    .append = sk_append,
    .attend = sk_attend,
    .end_prefill = sk_end_prefill,
    .begin_prefill = sk_begin_prefill,
    .bytes = sk_bytes,
    .stats = sk_stats,
    .kept = sk_kept,
    .free = sk_free,
    .end_step = sk_end_step,
    .step_batch = sk_step_batch,
    .step_ropes = 1,
    .floor = sk_floor,
};

int kv_shadowkv_new(const kv_opts *o, const kv_shape *shape, kv_cache **out) {
    *out = NULL;
    const kv_class *p = &kv_policy_shadowkv;
    sk_opts so = {.rank = kv_opt_int(o, p, "rank"), .chunk = kv_opt_int(o, p, "chunk"),
                  .outliers = kv_opt_int(o, p, "outliers"), .local = kv_opt_int(o, p, "local"),
                  .plus = kv_opt_int(o, p, "plus"), .overlap = kv_opt_int(o, p, "overlap"),
                  .f32_state = kv_opt_int(o, p, "f32_state")};
    if (so.chunk < 1 || so.rank < 1 || o->budget < 0 || so.outliers < 0 || so.local < 0)
        return skv_error(SKV_EINVAL,
                         "shadowkv: options need chunk >= 1 and rank >= 1, budget, outliers and local >= 0 "
                         "(got chunk %d, rank %d, budget %d, outliers %d, local %d)",
                         so.chunk, so.rank, o->budget, so.outliers, so.local);
    if (shape->n_kv_heads < 1 || shape->n_heads % shape->n_kv_heads || !shape->rope || shape->head_dim < 1)
        return skv_error(SKV_EINVAL, "shadowkv: %d query heads do not split into %d KV heads, or no RoPE context",
                         shape->n_heads, shape->n_kv_heads);
    if (so.f32_state && shape->be && shape->be != &skv_backend_cpu)
        return skv_error(SKV_EUNSUPPORTED, "shadowkv: f32_state is a cpu backend option; on %s U and the offloaded "
                         "values are bf16: use --backend cpu", shape->be->name);
    kv_sk *c = calloc(1, sizeof *c);
    if (!c) return skv_error(SKV_ENOMEM, "out of memory");
    c->base.cls = c->base.policy = &kv_policy_shadowkv;
    c->base.shape = *shape;
    c->id = __atomic_add_fetch(&sk_ids, 1, __ATOMIC_RELAXED);
    if (!c->base.shape.be) c->base.shape.be = &skv_backend_cpu;
    c->base.step = -1;
    c->o = *o;
    c->so = so;
    c->h = shape->n_kv_heads;
    c->d = shape->head_dim;
    c->kvd = c->h * c->d;
    c->group = shape->n_heads / shape->n_kv_heads;
    c->L = calloc((size_t)shape->n_layers, sizeof(sk_layer));
    if (!c->L) {
        sk_free(&c->base);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    for (int l = 0; l < shape->n_layers; l++)
        if (!(c->L[l].head = calloc((size_t)c->h, sizeof(sk_head)))) {
            sk_free(&c->base);
            return skv_error(SKV_ENOMEM, "out of memory");
        }
    *out = &c->base;
    return 0;
}
