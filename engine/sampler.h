/* sampler.h: picks the next token from logits: greedy (temp <= 0), or
 * temperature with top-k and top-p (nucleus) filtering and a seeded RNG. */
#ifndef SKV_SAMPLER_H
#define SKV_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temp;      /* <= 0: greedy */
    int top_k;       /* <= 0: no limit */
    float top_p;     /* >= 1: no limit */
    uint64_t seed;
} sampler_opts;

/* A token and its probability, sorted as a pair so that the comparator
 * needs no state outside its arguments (any number of samplers may sort at
 * once, on any threads). */
typedef struct {
    float p;
    int id;
} sampler_cand;

typedef struct {
    sampler_opts o;
    uint64_t rng;
    int vocab;
    sampler_cand *cand; /* (vocab) scratch */
} sampler;

int sampler_init(sampler *s, const sampler_opts *o, int vocab);
void sampler_free(sampler *s);
int sampler_sample(sampler *s, const float *logits);
int sampler_argmax(const float *logits, int n);

#endif
