/* rope.h: rotary position embedding, both pairings, with Llama-3 scaling.
 * The per-pair inverse frequencies are computed once from the config (and
 * divided by GGUF rope_freqs factors when the file has them). */
#ifndef SKV_ROPE_H
#define SKV_ROPE_H

typedef enum {
    ROPE_ADJACENT = 0, /* pairs (2i, 2i+1): GGUF llama (Meta layout) */
    ROPE_NEOX = 1,     /* pairs (i, i+d/2), "rotate half": HF checkpoints, qwen2 */
} rope_mode;

/* What RoPE needs of a model's config (model_rope_params fills it). */
typedef struct {
    rope_mode mode;
    int head_dim, rope_dim;  /* rope_dim: rotated dims per head (<= head_dim) */
    float theta;
    int llama3;              /* Llama-3 rope_scaling of type "llama3" */
    float factor, low_freq, high_freq;
    int orig_ctx;
} rope_params;

/* Llama-3 scaling of pair i: the divisor of its base frequency (1 for short
 * wavelengths, factor for long ones, a blend between), as Meta's reference
 * computes it and llama.cpp's converter stores it in rope_freqs.weight. */
double rope_llama3_divisor(const rope_params *p, int i);

typedef struct {
    rope_mode mode;
    int head_dim, rope_dim;
    float *inv_freq; /* (rope_dim/2) radians per position, owned */
} rope_ctx;

/* freq_factors: optional (rope_dim/2) divisors (GGUF rope_freqs.weight), or NULL. */
int rope_init(rope_ctx *r, const rope_params *p, const float *freq_factors);
void rope_free(rope_ctx *r);

/* cos and sin of every pair's angle at position pos: cs, sn (rope_dim/2). */
void rope_angles(const rope_ctx *r, int pos, float *cs, float *sn);

/* Rotates x (n_heads, head_dim) in place by the angles rope_angles gave. */
void rope_rotate(const rope_ctx *r, float *x, int n_heads, const float *cs, const float *sn);

/* Rotates x (n_heads, head_dim) in place for position pos. */
void rope_apply(const rope_ctx *r, float *x, int n_heads, int pos);

#endif
