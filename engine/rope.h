/* rope.h: rotary position embedding, both pairings, with Llama-3 scaling.
 * The per-pair inverse frequencies are computed once from the config (and
 * divided by GGUF rope_freqs factors when the file has them). */
#ifndef SKV_ROPE_H
#define SKV_ROPE_H

#include "model.h"

typedef struct {
    rope_mode mode;
    int head_dim, rope_dim;
    float *inv_freq; /* (rope_dim/2) radians per position, owned */
} rope_ctx;

/* freq_factors: optional (rope_dim/2) divisors (GGUF rope_freqs.weight), or NULL. */
int rope_init(rope_ctx *r, const model_config *cfg, const float *freq_factors);
void rope_free(rope_ctx *r);

/* cos and sin of every pair's angle at position pos: cs, sn (rope_dim/2). */
void rope_angles(const rope_ctx *r, int pos, float *cs, float *sn);

/* Rotates x (n_heads, head_dim) in place by the angles rope_angles gave. */
void rope_rotate(const rope_ctx *r, float *x, int n_heads, const float *cs, const float *sn);

/* Rotates x (n_heads, head_dim) in place for position pos. */
void rope_apply(const rope_ctx *r, float *x, int n_heads, int pos);

#endif
