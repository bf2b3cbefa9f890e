/* forward.h: the forward pass of a Llama-family model over a KV policy.
 *
 * forward_batch runs n tokens at positions pos..pos+n-1 through every layer
 * on a backend (batched GEMMs for n > 1, weight-streaming matvecs for n == 1)
 * and writes the logits of the last token. */
#ifndef SKV_FORWARD_H
#define SKV_FORWARD_H

#include "backend.h"
#include "kv.h"
#include "model.h"
#include "rope.h"

typedef struct probe_bus probe_bus;

/* One layer's weights as the backend holds them (weight_load). */
typedef struct {
    skv_weight attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, w_gate, w_up, w_down;
} forward_layer;

/* A model's weights as one backend holds them (the CPU's are the model's
 * own blocks; a device backend's are copies in its memory): loaded once per
 * (model, backend) in the process and shared by every forward state on that
 * pair, a session's, a fork's, a batch's, the oracle's twin.
 *
 * Ownership: the process's registry (forward.c) holds each entry while it
 * has references; forward_init takes one (the first one loads the weights),
 * forward_free gives it back, and whoever gives back the last one frees the
 * copies (weight_free). Nobody else frees them. The model must outlive every
 * forward state made on it (as before). Thread-safe (one lock). */
typedef struct forward_weights {
    const skv_model *m;
    const skv_backend *be;
    forward_layer *lw;      /* (n_layers) */
    skv_weight tok_embd, out_norm, output;
    size_t bytes;           /* the model's weight bytes handed to weight_load (once, however many borrow them) */
    int refs;               /* forward states holding it (under the registry's lock) */
    struct forward_weights *next; /* the registry's list */
} forward_weights;

/* The weights of m on be, loaded on the first call (be NULL: the CPU) with
 * one reference taken; forward_weights_put gives it back. 0 or SKV_E*. */
int forward_weights_get(const skv_model *m, const skv_backend *be, forward_weights **out);
void forward_weights_put(forward_weights *w);

typedef struct {
    const skv_model *m;
    const skv_backend *be;  /* where the math runs */
    rope_ctx rope;
    int max_batch;
    /* the weights in the backend's memory: borrowed (one reference), shared
     * with every other forward state of the same model and backend */
    forward_weights *w;
    /* activations in the backend's memory, (max_batch, width) */
    float *x, *xn, *q, *k, *k_pre, *v, *att, *gate, *up;
    skv_workspace ws;   /* the backend's matmul scratch */
    float *logits_be;   /* (vocab) the last token's logits in the backend's memory */
    float *logits;      /* (vocab) the same in host memory (== logits_be on the CPU; host_alloc's on a device) */
    float *logits_rows; /* (rows_cap, vocab) forward_rows' logits in the backend's memory, made on demand */
    float *logits_host; /* (rows_cap, vocab) their copy in host_alloc's memory (a device backend's; else NULL) */
    int rows_cap;
    probe_bus *bus;     /* may be NULL: timeline spans of the forward ops */
    int step;           /* for spans; -1 during prefill */
    int lanes;          /* forward_rows in a traced batch: row i's attention events follow a
                           PROBE_LANE for lane i (and the shared ops' spans one for lane 0) */
    const int *lane_of; /* with lanes: row i is lane lane_of[i] of n_lanes (NULL: lane i of the rows) */
    int n_lanes;
} forward_state;

/* be: the backend (NULL: the CPU reference). The weights are borrowed from
 * the process's shared copy (forward_weights_get): only the first state of a
 * model on a backend loads them. The activations, (max_batch) rows of each
 * buffer, are the state's own: forward_act_bytes. */
int forward_init(forward_state *f, const skv_model *m, const skv_backend *be, int max_batch);
/* Frees the activations and gives the weights back (the last one frees them). */
void forward_free(forward_state *f);

/* Bytes of the backend's memory forward_init allocates for activations of
 * rows rows (the weights not included: they are shared); forward_rows adds
 * (rows, vocab) floats of logits for a batch of rows. */
size_t forward_act_bytes(const model_config *c, int rows);

/* Runs tokens[0..n) at positions pos.. through the model; n <= max_batch.
 * Returns 0 and leaves the last token's logits in f->logits. */
int forward_batch(forward_state *f, kv_cache *kv, const int32_t *tokens, int n, int pos);

/* One decode step of n sequences together (n <= max_batch): row i is
 * tokens[i] at position pos[i] of the sequence whose cache is kv[i]. The
 * weights' matmuls run once over the n rows (GEMMs; q8_0 and q4_0 through
 * the int8 GEMM); RoPE and attention per sequence, through its policy.
 * Every row's logits go to logits (n, vocab), host memory. */
int forward_rows(forward_state *f, kv_cache *const *kv, const int32_t *tokens, const int *pos, int n, float *logits);

#endif
