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

typedef struct {
    const skv_model *m;
    const skv_backend *be;  /* where the math runs */
    rope_ctx rope;
    int max_batch;
    /* weights in the backend's memory (the CPU's are the model's own) */
    forward_layer *lw;      /* (n_layers) */
    skv_weight tok_embd, out_norm, output;
    /* activations in the backend's memory, (max_batch, width) */
    float *x, *xn, *q, *k, *k_pre, *v, *att, *gate, *up;
    skv_workspace ws;   /* the backend's matmul scratch */
    float *logits_be;   /* (vocab) the last token's logits in the backend's memory */
    float *logits;      /* (vocab) the same in host memory (== logits_be on the CPU) */
    float *logits_rows; /* (rows_cap, vocab) forward_rows' logits in the backend's memory, made on demand */
    int rows_cap;
    probe_bus *bus;     /* may be NULL: timeline spans of the forward ops */
    int step;           /* for spans; -1 during prefill */
    int lanes;          /* forward_rows in a traced batch: row i's attention events follow a
                           PROBE_LANE for lane i (and the shared ops' spans one for lane 0) */
} forward_state;

/* be: the backend (NULL: the CPU reference). */
int forward_init(forward_state *f, const skv_model *m, const skv_backend *be, int max_batch);
void forward_free(forward_state *f);

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
