/* batchhelp.h: the engine tests' check of a batch against each sequence
 * alone (test_devpath on the CPU's device path, tests/sim/test_cuda_paths on
 * the simulator). */
#ifndef SKV_TEST_BATCHHELP_H
#define SKV_TEST_BATCHHELP_H

#include "batch.h"
#include "sampler.h"
#include "session.h"
#include "testhelp.h"

#include <stdint.h>

/* Step t of a batch of n read against each sequence's logits alone, ref +
 * (i*steps + t)*V for sequence i: returns the worst rel L2 of the n; each
 * sequence's greedy token goes to tok[i] (the step's input) and
 * tokens[i*steps + t]. */
static inline double test_batch_step(skv_batch *b, int n, int V, const float *ref, int steps, int t, int32_t *tok,
                                     int32_t *tokens) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const float *l = session_logits(batch_seq(b, i));
        double e = test_rel_l2(l, ref + ((size_t)i * steps + t) * V, (size_t)V);
        worst = e > worst ? e : worst;
        tokens[(size_t)i * steps + t] = tok[i] = sampler_argmax(l, V);
    }
    return worst;
}

#endif
