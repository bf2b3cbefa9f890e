/* kv_shadowkv.h: counters of the ShadowKV policy for the CLI and benches
 * (memory, fetches, cache hits, the effective budget), read out of a
 * kv_cache that kv_shadowkv_new made. The policy itself is reached through
 * kv.h; this header adds only the read-out. */
#ifndef SKV_KV_SHADOWKV_H
#define SKV_KV_SHADOWKV_H

#include "kv.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int prefilled;             /* 1 once end_prefill has run */
    int prompt_len;            /* s */
    int rank;                  /* r actually used (after clamping to min(s, kv_heads*head_dim)) */
    int chunk;                 /* c, tokens per chunk */
    int n_chunks;              /* full chunks in the prompt, s / c */
    int local_start;           /* first chunk of the dense local window */
    int local_tokens;          /* tokens of the local window (local chunks + s mod c tail) */
    int outliers;              /* outlier chunks per KV head actually kept */
    int candidates;            /* chunks per KV head that can be selected (landmarks kept) */
    int k;                     /* chunks selected per KV head and step (budget / c, clamped) */
    int dense;                 /* 1: no candidate chunk, attention is exact over everything */
    int generated;             /* tokens appended after the prompt */
    int steps;                 /* decode steps attended (layer 0) */
    /* Cumulative over every layer, KV head and step. */
    uint64_t hits, misses;     /* chunk cache; hit rate = hits / (hits + misses) */
    uint64_t fetches;          /* chunks fetched from the offload store (= misses) */
    uint64_t fetch_bytes;
    /* The last decode step alone, summed over layers and KV heads. */
    uint64_t step_hits, step_misses, step_fetches, step_fetch_bytes;
    /* Measured, over every decode step: wall time the value fetches took (on
     * the fetch stream's thread with overlap), wall time of the decode
     * attention (select, fetch, rebuild, attend; all layers), and the K and
     * V bytes exact attention over the same positions would have read. */
    double fetch_seconds, attn_seconds, dense_bytes;
    /* attn_seconds by stage (CPU backend; 0 on a device backend): select
     * (landmark scores, softmax, top-k, cache books), fetch and rebuild of
     * the misses, and the sparse attention itself. */
    double stage_seconds[3];
    int file_tier;             /* 1: the offload store is a file (--offload-file) */
    int overlap;               /* 1: fetches run on their own thread beside the rebuild */
    /* Bytes resident, by part, and offloaded: U and the offloaded values
     * 2 a value (bf16; 4 with the f32_state option), landmarks 2 (half),
     * the rest 4 (f32). */
    size_t b_U, b_SVt, b_landmarks, b_outliers, b_local, b_generated, b_cache, b_prefill;
                               /* b_SVt includes Vᵀ under ShadowKV+; b_prefill: dense
                                  prompt K, pre-RoPE K and V before end_prefill; RoPE
                                  tables, index arrays and scratch are not counted */
    size_t resident, offloaded;
    size_t b_oracle;           /* exact K/V kept for oracle mode (not in resident) */
    float rel_err_mean, rel_err_max; /* SVD relative error of pre-RoPE K over layers */
    /* Oracle mode: means over layers, KV heads and steps of the exact
     * attention mass (mean over a group's query heads) that the selected
     * chunks, and the whole sparse set, capture. -1 without oracle. */
    double oracle_recall_sel, oracle_recall_sparse;
} kv_shadowkv_stats;

/* Creates a ShadowKV cache (kv_new does it for --kv shadowkv). */
int kv_shadowkv_new(const kv_opts *o, const kv_shape *shape, kv_cache **out);

/* Fills st from c; SKV_EINVAL if c is not a ShadowKV cache. */
int kv_shadowkv_stats_get(const kv_cache *c, kv_shadowkv_stats *st);

/* Relative SVD error ‖K − U·ΣVᵀ‖/‖K‖ of layer's pre-RoPE keys; -1 before
 * end_prefill or for a bad layer. */
float kv_shadowkv_rel_err(const kv_cache *c, int layer);

#endif
