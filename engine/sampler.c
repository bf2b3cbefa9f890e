/* sampler.c: greedy and temperature/top-k/top-p sampling with a
 * deterministic RNG (splitmix64 seeding an xorshift64*). */
#include "sampler.h"
#include "skv.h"

#include <math.h>
#include <stdlib.h>

int sampler_init(sampler *s, const sampler_opts *o, int vocab) {
    s->o = *o;
    s->vocab = vocab;
    uint64_t z = o->seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    s->rng = (z ^ (z >> 31)) | 1;
    s->cand = malloc(sizeof(sampler_cand) * vocab);
    if (!s->cand) {
        sampler_free(s);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    return 0;
}

void sampler_free(sampler *s) {
    free(s->cand);
    s->cand = NULL;
}

int sampler_argmax(const float *l, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

static double uniform(sampler *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return ((s->rng * 0x2545f4914f6cdd1dull) >> 11) * (1.0 / 9007199254740992.0);
}

/* Higher probability first; equal probabilities by lower token id. */
static int by_prob_desc(const void *a, const void *b) {
    const sampler_cand *x = a, *y = b;
    return x->p < y->p ? 1 : x->p > y->p ? -1 : (x->id > y->id) - (x->id < y->id);
}

int sampler_sample(sampler *s, const float *logits) {
    int n = s->vocab;
    if (s->o.temp <= 0) return sampler_argmax(logits, n);
    sampler_cand *cd = s->cand;
    float mx = logits[sampler_argmax(logits, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        cd[i].p = expf((logits[i] - mx) / s->o.temp);
        cd[i].id = i;
        sum += cd[i].p;
    }
    for (int i = 0; i < n; i++) cd[i].p /= (float)sum;
    int k = n;
    if (s->o.top_k > 0 && s->o.top_k < n) k = s->o.top_k;
    if (k < n || s->o.top_p < 1) {
        qsort(cd, n, sizeof *cd, by_prob_desc);
        if (s->o.top_p < 1) {
            double c = 0;
            for (int i = 0; i < k; i++) {
                c += cd[i].p;
                if (c >= s->o.top_p) { k = i + 1; break; }
            }
        }
    }
    double tot = 0;
    for (int i = 0; i < k; i++) tot += cd[i].p;
    double r = uniform(s) * tot, c = 0;
    for (int i = 0; i < k; i++) {
        c += cd[i].p;
        if (r < c) return cd[i].id;
    }
    return cd[k - 1].id;
}
