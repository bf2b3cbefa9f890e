/* kv_lowbit.h: the low-bit KV cache SpeCache and TailorKV's quantized layers
 * share (PEERS.md, "Shared quantizer"): keys per channel in groups of g
 * tokens, quantized in blocks of R tokens, so at cache length L the newest
 * L mod R keys stay in full precision; values per token in groups of g
 * channels within a head, the newest min(L, R) in full precision. The arrays
 * hold what attention reads: decoded values where quantized, the exact ones
 * elsewhere. */
#ifndef SKV_KV_LOWBIT_H
#define SKV_KV_LOWBIT_H

#include "backend.h"

#include <stddef.h>

typedef struct {
    int bits, group, residual, midpoint; /* b, g, R; midpoint: SpeCache's 1-bit rule */
} lowbit_cfg;

/* Quantizes what cache length L requires of K and V (rows of h*d floats):
 * key blocks of R up to L - L mod R, values up to L - min(L, R); *nq_k and
 * *nq_v count the positions already quantized and are advanced. */
void lowbit_flush(const skv_backend *be, const lowbit_cfg *q, int h, int d, float *K, float *V, int L, int *nq_k,
                  int *nq_v);

/* Bytes one layer holds at cache length L: codes packed at b bits, a scale
 * and a zero (fp32) per group, the full-precision rows (fp32). */
size_t lowbit_bytes(const lowbit_cfg *q, int h, int d, int L, int nq_k, int nq_v);

#endif
