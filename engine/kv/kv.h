/* kv.h: the KV-cache interface. A policy owns the cached keys and values of
 * every layer and computes attention over them, so a policy that compresses
 * or selects (ShadowKV) plugs in behind the same calls as the dense one.
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

typedef struct probe_bus probe_bus;

typedef struct {
    int n_layers, n_heads, n_kv_heads, head_dim;
    int max_ctx;              /* positions the cache must hold */
    const rope_ctx *rope;     /* for policies that rebuild keys */
    const skv_backend *be;    /* where the policy's math runs (NULL: the CPU reference) */
} kv_shape;

typedef struct kv_cache kv_cache;

typedef struct {
    const char *name;
    /* Stores n tokens at positions pos..pos+n-1 of layer. k_pre: pre-RoPE keys,
     * k: post-RoPE keys, v: values, each (n, n_kv_heads*head_dim). */
    int (*append)(kv_cache *c, int layer, int pos, int n, const float *k_pre, const float *k, const float *v);
    /* out (n, n_heads*head_dim) = causal attention of q (n, n_heads*head_dim),
     * queries at positions pos..pos+n-1, over the cache of layer. */
    int (*attend)(kv_cache *c, int layer, int pos, int n, const float *q, float *out);
    /* The prompt is complete in every layer. */
    int (*end_prefill)(kv_cache *c);
    /* Bytes held resident (fast memory) and offloaded (slow memory). */
    void (*bytes)(const kv_cache *c, size_t *resident, size_t *offloaded);
    void (*free)(kv_cache *c);
} kv_class;

struct kv_cache {
    const kv_class *cls;
    kv_shape shape;
    probe_bus *bus;           /* may be NULL */
    int step;                 /* decode step (-1 during prefill), for probes */
    char notice[256];         /* a message for the user (budget shrunk, fallback), or "" */
};

/* KV options shared by every command that generates. Budget is in tokens,
 * local in chunks, as in the ShadowKV reference code. */
typedef struct {
    char policy[16];          /* "dense" or "shadowkv" */
    int rank, chunk, budget, outliers, local;
    float budget_pct;         /* > 0: the budget is this percent of the prompt (--budget 3%), budget unused */
    int plus;                 /* ShadowKV+: project generated keys onto the prefill basis */
    int oracle;               /* exact attention beside the sparse one, for diagnostics */
    /* Needle watch: prompt token positions [watch_begin, watch_end) whose
     * chunks the ShadowKV policy reports in PROBE_NEEDLE events, at the end
     * of prefill and at every decode step (engine/needle.h). None when
     * watch_end <= watch_begin (kv_opts_default leaves both 0). */
    int watch_begin, watch_end;
} kv_opts;

/* The sparse budget in tokens for a prompt of prompt_len tokens: budget, or
 * budget_pct of the prompt rounded to the nearest token (at least 1). */
int kv_budget_tokens(const kv_opts *o, int prompt_len);

void kv_opts_default(kv_opts *o);

/* Creates the policy o->policy names. */
int kv_new(const kv_opts *o, const kv_shape *shape, kv_cache **out);

/* The ShadowKV policy (engine/kv_shadowkv.c). */
int kv_shadowkv_new(const kv_opts *o, const kv_shape *shape, kv_cache **out);

/* The dense policy: full keys and values, exact attention. */
int kv_dense_new(const kv_shape *shape, kv_cache **out);

/* A wrapper that records one layer's keys, values and last query while
 * delegating everything to inner (which it owns). */
typedef struct {
    int n;                    /* positions recorded */
    float *k_pre, *k, *v;     /* (n, n_kv_heads*head_dim) */
    float *q_last;            /* (n_heads*head_dim): the last query seen */
} kv_tap_data;
int kv_tap_new(kv_cache *inner, int layer, kv_cache **out);
const kv_tap_data *kv_tap_get(const kv_cache *c);   /* NULL if c is not a tap */
kv_cache *kv_tap_inner(kv_cache *c);                /* the wrapped policy (c itself if not a tap) */

static inline void kv_free(kv_cache *c) { if (c) c->cls->free(c); }

#endif
