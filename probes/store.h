/* store.h: everything a run's probes said, indexed for the views.
 *
 * A probe_store ingests events one at a time, from a ring drained in the UI
 * thread (probe_store_drain) or from a replayed trace (trace_load_store),
 * and keeps its own copies. Views ask it questions by (step, layer, head);
 * it grows as decode steps arrive. A PROBE_RUN event starts a new run: if
 * the store already holds data it is emptied first. Not thread-safe: one
 * thread ingests and queries.
 *
 * Pointers returned by queries stay valid until the same item is replaced
 * by a later event, the store is reset by a new PROBE_RUN, or it is freed;
 * span arrays until the next span of that step arrives. */
#ifndef SKV_STORE_H
#define SKV_STORE_H

#include "probe.h"

typedef struct probe_store probe_store;

int probe_store_new(probe_store **out);
void probe_store_free(probe_store *st);

/* Copies ev into the store. Index fields (layer, head, step, needle id,
 * chunk ids) are checked against the run's shape when a PROBE_RUN came first
 * and against generous limits otherwise: SKV_ERANGE or SKV_EINVAL with a
 * message naming the kind and field; the store is unchanged then. */
int probe_store_add(probe_store *st, const probe_event *ev);

/* Moves up to max events (max < 0: all pending) from a ring into the store
 * without waiting. Returns the number moved, or the first error (the bad
 * event is dropped from the ring). */
int probe_store_drain(probe_store *st, probe_sub *ring, int max);

/* Steps seen (max decode step + 1), layers and KV heads (from the PROBE_RUN
 * event, or the largest index seen + 1 without one). */
int probe_store_n_steps(const probe_store *st);
int probe_store_n_layers(const probe_store *st);
int probe_store_n_kv_heads(const probe_store *st);
/* Events ingested of kind k. */
uint64_t probe_store_count(const probe_store *st, probe_kind k);

/* The run's metadata, or NULL before the PROBE_RUN event. */
const probe_ev_run *probe_store_run(const probe_store *st);
/* What the policy's blocks are called, from the options the run recorded:
 * "page" (Quest, FreeKV), "chunk" (ShadowKV); else "token" when its
 * selections are of single tokens (SpeCache, TailorKV), else "block". */
const char *probe_store_block_name(const probe_store *st);

/* Tokens in arrival order (prompt first, then one per step); text is
 * followed by a NUL. */
int probe_store_n_tokens(const probe_store *st);
int probe_store_n_prompt(const probe_store *st);
const probe_ev_token *probe_store_token(const probe_store *st, int i);
/* The token generated at decode step `step`, or NULL. */
const probe_ev_token *probe_store_step_token(const probe_store *st, int step);

/* Prefill per layer (spectrum, rank, error, timings), or NULL. */
const probe_ev_prefill_layer *probe_store_prefill_layer(const probe_store *st, int layer);
/* Prefill per layer and KV head (cos-min, outliers, local window), or NULL. */
const probe_ev_prefill_head *probe_store_prefill_head(const probe_store *st, int layer, int head);
/* Decode selection of one step, layer and KV head, or NULL. */
const probe_ev_decode_head *probe_store_decode(const probe_store *st, int step, int layer, int head);
/* The oracle's measures (mass recall, overlap, output error, needle rank) of
 * one step, layer and KV head, or NULL (a run without --oracle). */
const probe_ev_oracle *probe_store_oracle(const probe_store *st, int step, int layer, int head);
/* 1 if chunk was selected at (step, layer, head) (its score in *score when
 * score is not NULL), 0 if not, -1 when that step, layer and head has no data.
 * A linear scan of the selection: views drawing many cells should walk
 * probe_store_decode()->sel instead. */
int probe_store_selected(const probe_store *st, int step, int layer, int head, int chunk, float *score);
/* Per-step statistics, or NULL. */
const probe_ev_step *probe_store_step(const probe_store *st, int step);

/* Spans of a step (-1: prefill) in arrival order; *n gets their count. */
const probe_ev_span *probe_store_spans(const probe_store *st, int step, int *n);

/* Hit rate of a layer at a step: hits / k averaged over the KV heads with a
 * non-empty selection; NAN when there is none. */
float probe_store_hit_rate(const probe_store *st, int step, int layer);
/* The same for steps 0..n-1 into out (n); returns n_steps. */
int probe_store_hit_rate_series(const probe_store *st, int layer, float *out, int n);

/* Needles: ids 0..n_needles-1. info: the first event seen for the needle
 * (its token span and chunks), or NULL for an id never seen. */
int probe_store_n_needles(const probe_store *st);
const probe_ev_needle *probe_store_needle_info(const probe_store *st, int id);
/* A needle at (step, layer, head), step -1 for prefill, or NULL. */
const probe_ev_needle *probe_store_needle(const probe_store *st, int id, int step, int layer, int head);

/* Needle-in-a-haystack cases (PROBE_NIAH, from skv needle), i = 0.. in
 * arrival order; NULL out of range. A later PROBE_RUN empties them with the
 * rest of the store, so a trace puts them after the run they belong with. */
/* A policy's own measure `name` at (step, layer, head) (step -1: prefill;
 * head -1: the whole layer), or NULL; probe_store_has_metric: 1 when any
 * event of that name was stored. */
const probe_ev_metric *probe_store_metric(const probe_store *st, const char *name, int step, int layer, int head);
int probe_store_has_metric(const probe_store *st, const char *name);

int probe_store_n_niah(const probe_store *st);
const probe_ev_niah *probe_store_niah(const probe_store *st, int i);

#endif
