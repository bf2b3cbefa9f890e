/* kv.h: the KV-cache interface and the registry of KV policies, the other
 * axis of skv. A policy owns the cached keys and values of every layer and
 * computes attention over them, so a policy that compresses or selects
 * (ShadowKV) plugs in behind the same calls as the dense one. Each policy is
 * one file with one const kv_class: its name, summary, options (parsed
 * generically), stats (named numbers) and calls; kv.c lists them.
 *
 * Per layer the forward pass calls append() with the new tokens' keys and
 * values, then attend() with their queries. After the whole prompt has gone
 * through every layer the session calls end_prefill() once; from then on
 * each decode step appends and attends one token per layer. */
#ifndef SKV_KV_H
#define SKV_KV_H

#include "backend.h"
#include "rope.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct probe_bus probe_bus;

typedef struct {
    int n_layers, n_heads, n_kv_heads, head_dim;
    int max_ctx;              /* positions the cache must hold */
    const rope_ctx *rope;     /* for policies that rebuild keys */
    const skv_backend *be;    /* where the policy's math runs (NULL: the CPU reference) */
} kv_shape;

typedef struct kv_cache kv_cache;
typedef struct kv_opts kv_opts;

/* ---- the registry: one const kv_class per policy -------------------------- */

typedef enum {
    KV_OPT_INT,               /* an integer in [lo, hi] */
    KV_OPT_FLOAT,             /* a number in [lo, hi] */
    KV_OPT_FLAG,              /* 0 or 1; its flag takes no value */
} kv_opt_type;

/* One option of a policy: parsed generically from --kv-opt key=value and
 * from the policy's own flag. */
typedef struct {
    const char *key;          /* "rank" */
    const char *flag;         /* "--rank", or NULL */
    kv_opt_type type;
    double def, lo, hi;
    const char *help;         /* one line */
} kv_opt_def;

/* One named numeric statistic a policy reports (kv_class.stats fills them
 * in this order). Keys other code may look up by name, when the policy has
 * them: hits, misses, hit_rate (cumulative chunk/page cache), step_hits,
 * step_misses, step_fetches, step_fetch_bytes (the last decode step, summed
 * over layers and KV heads), fetch_bytes (cumulative), rank, chunk. */
typedef struct {
    const char *key;          /* "hit_rate" */
    const char *unit;         /* "%", "B", "chunks", "x", "" */
    const char *help;
} kv_stat_def;

#define KV_MAX_STATS 32

typedef struct kv_class {
    const char *name;         /* what --kv takes: "dense", "shadowkv" */
    const char *summary;      /* one line for --kv help */
    const kv_opt_def *opts;   /* (n_opts) */
    int n_opts;
    int budgeted;             /* 1: honours the shared --budget (tokens attended per KV head) */
    int device;               /* 1: keeps its data in the backend's memory and reaches it only through
                                 the backend's ops, so it runs on any backend; 0: the CPU backend only */
    int prefill_pure;         /* 1: attend before end_prefill only computes its output (no state, no
                                 calibration): a fork (kv_rec_replay) replays the appends alone */
    const kv_stat_def *stat_defs; /* (n_stats <= KV_MAX_STATS) */
    int n_stats;
    /* Creates a cache of this policy; its options are read with kv_opt(). */
    int (*create)(const kv_opts *o, const kv_shape *shape, kv_cache **out);

    /* ---- the instance's calls ---- */
    /* Stores n tokens at positions pos..pos+n-1 of layer. k_pre: pre-RoPE keys,
     * k: post-RoPE keys, v: values, each (n, n_kv_heads*head_dim). */
    int (*append)(kv_cache *c, int layer, int pos, int n, const float *k_pre, const float *k, const float *v);
    /* out (n, n_heads*head_dim) = causal attention of q (n, n_heads*head_dim),
     * queries at positions pos..pos+n-1, over the cache of layer. */
    int (*attend)(kv_cache *c, int layer, int pos, int n, const float *q, float *out);
    /* The prompt is complete in every layer. */
    int (*end_prefill)(kv_cache *c);
    /* The prompt's length n, before its first append: a policy may start
     * what it will need at end_prefill (ShadowKV on a device starts pinning
     * its offload store, to overlap the prefill). A hint: end_prefill must
     * work without it, or with another length. NULL: nothing to start. */
    void (*begin_prefill)(kv_cache *c, int n);
    /* Bytes held resident (fast memory) and offloaded (slow memory). */
    void (*bytes)(const kv_cache *c, size_t *resident, size_t *offloaded);
    /* val (n_stats) in the order of stat_defs; NaN for one not known yet. May be NULL with n_stats 0. */
    void (*stats)(const kv_cache *c, double *val);
    /* What the last decode attend of layer read in full precision for query
     * head hq: the distinct positions (any order) into pos (room for max_ctx),
     * their count returned; *unit gets the policy's block in tokens (page,
     * chunk; 1 for single tokens). The oracle (kv_oracle.c) scores this set
     * against exact attention. NULL: the policy attends every position. */
    int (*kept)(const kv_cache *c, int layer, int hq, int *pos, int *unit);
    void (*free)(kv_cache *c);
    /* The smallest --budget (tokens per KV head) at which the policy selects
     * anything beyond what it always keeps, for the options o, and why in
     * why (one phrase naming the units: "2 pages of 16 tokens: the last page
     * is always kept"). NULL: no floor (dense). */
    int (*floor)(const kv_opts *o, char *why, size_t n);
    /* After a decode step's forward pass, before its step event: a policy
     * that queued the step's work on a device without waiting for it reads
     * back what its books and events need (one wait a step). NULL: nothing
     * pending. The session calls it (kv_end_step); a policy also settles
     * before its next step and when its stats are read. */
    int (*end_step)(kv_cache *c);
    /* One decode step of layer for n caches of this class at once (a
     * batch's step, or n == 1): row i is cache c[i]'s token at position
     * pos[i]; k_pre, k, v (n, n_kv_heads*head_dim) and q, out (n,
     * n_heads*head_dim) are the backend's memory, rows side by side. The
     * same result as append then attend per cache, in order, with a launch
     * count on a device that does not grow with n or the heads. The forward
     * calls it when every cache of the step has this class and it is not
     * NULL (a wrapper, the tap or the oracle, leaves it NULL: the per-cache
     * calls then run). */
    int (*step_batch)(kv_cache *const *c, int n, int layer, const int *pos, const float *k_pre, const float *k,
                      const float *v, const float *q, float *out);
    /* 1: step_batch applies RoPE itself. The forward then skips rope_qk for
     * the step: q and k arrive un-rotated and k_pre not yet written (the
     * forward's buffers, which the step may write: it rotates them as
     * rope_qk would at pos[i], on its device in its own launches or, where
     * it runs the per-cache calls, by calling rope_qk with the forward's
     * arguments first, so the same bits either way). */
    int step_ropes;
} kv_class;

struct kv_cache {
    const kv_class *cls;      /* the calls */
    const kv_class *policy;   /* the registered policy whose options and stats describe this cache
                                 (cls itself, or the wrapped policy's for a wrapper such as the tap) */
    kv_shape shape;
    probe_bus *bus;           /* may be NULL */
    struct kv_cache *wrapped; /* a wrapper (tap, oracle): the cache it wraps; NULL for a policy */
    int step;                 /* decode step (-1 during prefill), for probes */
    char notice[256];         /* a message for the user (budget shrunk, fallback), or "" */
};

/* Registered policies, in the order --kv help lists them (dense first). */
int kv_policy_count(void);
const kv_class *kv_policy_at(int i);
/* The policy called name; NULL with a message listing the names. */
const kv_class *kv_policy_find(const char *name);
/* The definition of key in policy p, or NULL. */
const kv_opt_def *kv_policy_opt(const kv_class *p, const char *key);

/* ---- options ------------------------------------------------------------------- */

#define KV_MAX_SET 24
#define KV_WATCH_MORE 7

/* The KV options of every command that generates. Shared by all policies:
 * the budget (tokens attended per KV head, or a share of the prompt), the
 * oracle and the needle watch. Each policy's own options are key/value pairs
 * set by name, read with kv_opt() (the policy's default when unset). */
struct kv_opts {
    char policy[64];          /* a registered name */
    int budget;               /* tokens attended per KV head (policies with budgeted = 1) */
    float budget_pct;         /* > 0: the budget is this percent of the prompt (--budget 3%), budget unused */
    int oracle;               /* exact attention beside the policy, for diagnostics */
    /* Needle watch: prompt token positions [watch_begin, watch_end) that a
     * policy reports in PROBE_NEEDLE events, at the end of prefill and at
     * every decode step (engine/needle.h). None when watch_end <= watch_begin
     * (kv_opts_default leaves both 0). */
    int watch_begin, watch_end;
    /* More watched spans (a needle task's distractor facts): the oracle
     * reports, per decode step, layer and KV head, how much of each it kept
     * (the "distractors" metric, docs/TRACE.md). */
    int n_watch_more;
    int watch_more[KV_WATCH_MORE][2];
    /* Non-empty: the offload store lives in a new file at this path, not in
     * host memory (--offload-file; policies with an offload store). */
    char offload_file[512];
    int n_set;
    struct {
        char key[24];
        double val;
        int strict;           /* 1: set by --kv-opt, so the policy in force must have it */
    } set[KV_MAX_SET];
};

/* The sparse budget in tokens for a prompt of prompt_len tokens: budget, or
 * budget_pct of the prompt rounded to the nearest token (at least 1). */
int kv_budget_tokens(const kv_opts *o, int prompt_len);

/* p's floor in tokens (kv_class.floor) when o's budget at a prompt of
 * prompt_len tokens is under it, with its reason in why; 0 when the budget
 * reaches it or p has none. Under its floor a policy selects nothing beyond
 * what it always keeps. */
int kv_under_floor(const kv_opts *o, const kv_class *p, int prompt_len, char *why, size_t n);

void kv_opts_default(kv_opts *o);

/* Sets policy option key from text. The key must be an option of some
 * registered policy, and the value valid for it (a flag takes "", 0 or 1);
 * strict marks a --kv-opt, which the policy in force must have. 0, or
 * SKV_EINVAL with a one-line message. */
int kv_opts_set(kv_opts *o, const char *key, const char *value, int strict);

/* kv_opts_set with a number (programs and tests), not strict. */
int kv_opts_set_num(kv_opts *o, const char *key, double v);

/* Parses "key=value" (a --kv-opt argument) with kv_opts_set(strict = 1). */
int kv_opts_set_pair(kv_opts *o, const char *pair);

/* The value of key for policy p: the value set, else p's default. key must
 * be one of p's options (asserted). */
double kv_opt(const kv_opts *o, const kv_class *p, const char *key);
static inline int kv_opt_int(const kv_opts *o, const kv_class *p, const char *key) { return (int)kv_opt(o, p, key); }

/* The options in force for p as "budget=64 rank=16 ..." (the budget in tokens
 * for a prompt of prompt_len; only for budgeted policies; a budget in percent
 * stays "budget=3%" when prompt_len is 0, as for a sweep of lengths), into buf. */
void kv_opts_describe(const kv_opts *o, const kv_class *p, int prompt_len, char *buf, size_t n);

/* Prints the registered policies and their options (skv run --kv help). */
void kv_policies_help(FILE *out);

/* Creates the policy o->policy names; SKV_EINVAL when a strict option is not
 * one of its own. */
int kv_new(const kv_opts *o, const kv_shape *shape, kv_cache **out);

/* The statistic key of c (by the policy's stats table), or NaN when the
 * policy has no such statistic. */
double kv_stat(const kv_cache *c, const char *key);

/* The end of a decode step for c, or for the policy a wrapper wraps
 * (kv_class.end_step); 0 when nothing is pending. */
int kv_end_step(kv_cache *c);
/* The prompt's length, before its first append, to c or the policy a
 * wrapper wraps (kv_class.begin_prefill). */
void kv_begin_prefill(kv_cache *c, int n);

/* What kv_opts_describe says of o, with the values c put in force where a
 * statistic of the same name differs from the option asked ("rank=64
 * (asked 160)": clamped to what the prompt allows). After end_prefill. */
void kv_describe_in_force(const kv_cache *c, const kv_opts *o, int prompt_len, char *buf, size_t n);

/* The stats of c as "key=value ..." (values as %g), into buf. */
void kv_stats_describe(const kv_cache *c, char *buf, size_t n);

extern const kv_class kv_policy_dense, kv_policy_shadowkv, kv_policy_quest, kv_policy_freekv, kv_policy_specache,
    kv_policy_tailorkv;

/* Exact attention of one decode query q (n_heads*head_dim) over rows
 * 0..rows-1 of K and V (KV head kh's rows at K + kh*head_stride, rows stride
 * floats apart), the way the dense policy does it: the backend's
 * attend_decode (flash-decoding: each KV head's rows read once for its GQA
 * group, split over the threads, the parts merged). Every policy attending
 * all its rows calls this, so that at a full budget it gives dense's outputs
 * bit for bit. out (n_heads*head_dim). 0 or SKV_ENOMEM. */
int kv_attend_all(const kv_shape *sh, const float *q, const float *K, const float *V, int rows, int stride,
                  size_t head_stride, float *out);

/* The capacity, in positions, a growing store that holds have takes to hold
 * need > have: have doubled (256 from empty) until it holds need, at most
 * max_ctx, into *cap. 0, or SKV_ERANGE (a message naming who) when need is
 * past max_ctx. */
int kv_grow_cap(const char *who, int have, int need, int max_ctx, int *cap);

/* The start of a peer policy's create: checks that shape's query heads split
 * into its KV heads and that o's budget is not negative, then allocates the
 * policy's struct (size bytes, zeroed, its kv_cache first) into *cache, with
 * the base set for class p on shape (the CPU backend when shape has none,
 * step -1), and shape->n_layers zeroed layer structs of layer_size bytes
 * into *layers. 0, or SKV_EINVAL or SKV_ENOMEM with nothing allocated. */
int kv_policy_alloc(const kv_class *p, const kv_shape *shape, const kv_opts *o, size_t size, size_t layer_size,
                    void **cache, void **layers);

/* A dense cache (the oracle's exact twin, tests). */
int kv_dense_new(const kv_shape *shape, kv_cache **out);

/* A wrapper that records one layer's keys, values and last query while
 * delegating everything to inner (which it owns). */
typedef struct {
    int n;                    /* positions recorded */
    float *k_pre, *k, *v;     /* (n, n_kv_heads*head_dim) */
    float *q_last;            /* (n_heads*head_dim): the last query seen */
} kv_tap_data;
/* The prefill recorder (kv_rec.c): wraps inner (owned) and keeps, until
 * end_prefill, every append's rows and every attend's queries in call
 * order. kv_rec_replay feeds them to dst, a new cache of the same policy
 * (other options), and ends its prefill: dst then holds what a prefill of
 * the same prompt would have given it, without the model. The recording is
 * host memory, read from the rows' backend (inner's shape.be) with its
 * download; a replay onto a device backend stages each call's rows in its
 * memory with upload, so neither side reads device memory on the host. */
int kv_rec_new(kv_cache *inner, kv_cache **out);
int kv_rec_replay(const kv_cache *rec, kv_cache *dst);
/* Bytes the recording itself holds (beside the cache it wraps). */
size_t kv_rec_held(const kv_cache *rec);
/* Seconds the recording took: its copies (a device's downloads, each after
 * a sync of the work queued before it, so that work is not counted) and its
 * growth; a prefill's time less this is the prefill's own. 0 for a cache
 * that is not a recorder. */
double kv_rec_seconds(const kv_cache *rec);

int kv_tap_new(kv_cache *inner, int layer, kv_cache **out);
const kv_tap_data *kv_tap_get(const kv_cache *c);   /* NULL if c is not a tap */

/* The oracle: a wrapper that keeps a copy of every key and value inner is
 * given and, after each decode attend, scores what inner attended (its
 * kept() set and its output) against exact attention over that copy: mass
 * recall, token overlap, output error and the needle's rank, per step, layer
 * and KV head, as PROBE_ORACLE events and running means. It owns inner;
 * the wrapped policy behaves exactly as it would alone. o gives the needle
 * span (watch_begin/end). */
int kv_oracle_new(kv_cache *inner, const kv_opts *o, kv_cache **out);
typedef struct {
    uint64_t n;               /* (step, layer, query head) triples scored */
    double recall, overlap, out_err;       /* means */
    double recall_min, out_err_max;
    double kept;              /* mean tokens attended per query head (in full precision) */
    double gen;               /* of them generated tokens (counted apart) */
    double ctx;               /* mean context (positions) at those attends */
    double seconds;           /* the oracle's own time, summed (layer -1 only): what a run's decode time
                                 less this is the policy's alone */
} kv_oracle_summary;
/* The running means of an oracle cache over every layer (layer -1) or one
 * layer; 0 when c is not an oracle cache or the layer is out of range. */
int kv_oracle_get(const kv_cache *c, int layer, kv_oracle_summary *out);

/* The policy's own cache under any wrappers (tap, oracle). */
static inline kv_cache *kv_unwrap(kv_cache *c) {
    while (c && c->wrapped) c = c->wrapped;
    return c;
}

static inline void kv_free(kv_cache *c) { if (c) c->cls->free(c); }

/* Appends the key and value rows [t0, t1) of KV head kh (rows of kvd floats,
 * heads of d) to the gathered rows K, V at row *n, advancing *n: the copy
 * the block policies make of what a head attends. */
static inline void kv_gather_rows(const float *k, const float *v, int kvd, int kh, int d, int t0, int t1, float *K,
                                  float *V, int *n) {
    for (int t = t0; t < t1; t++, (*n)++) {
        memcpy(K + (size_t)*n * d, k + (size_t)t * kvd + (size_t)kh * d, sizeof(float) * (size_t)d);
        memcpy(V + (size_t)*n * d, v + (size_t)t * kvd + (size_t)kh * d, sizeof(float) * (size_t)d);
    }
}

#endif
