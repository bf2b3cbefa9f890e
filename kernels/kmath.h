/* kmath.h: the per-element math of the device kernels, in functions that
 * compile both as CUDA __host__ __device__ code and as plain C, so that the
 * CPU tests (tests/test_kmath.c) check on the CPU exactly what each CUDA
 * kernel computes per element, against the CPU backend's ops. Only launch
 * shapes, shared memory and streams are left for the device tests
 * (tests/gpu/).
 *
 * Conventions follow the CPU reference: RoPE angles pos * inv_freq in
 * double, then cos/sin in double rounded to float (rope_angles); RMSNorm's
 * sum of squares in double; the top-k order of shadowkv_topk (higher score
 * first, equal scores to the lower index, NaN last, -0 equal to +0); the
 * KIVI quantizer of kernels/cpu/kivi.c. */
#ifndef SKV_KMATH_H
#define SKV_KMATH_H

#ifdef __CUDACC__
#define KM_HD __host__ __device__ __forceinline__
#else
#define KM_HD static inline
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- number formats ---- */

KM_HD uint32_t km_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return (uint32_t)__float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

KM_HD float km_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* bf16 (the top half of an fp32) to float. */
KM_HD float km_bf16_to_f32(uint16_t h) { return km_bits_f32((uint32_t)h << 16); }

/* float to bf16, round to nearest even; a NaN stays a (quiet) NaN. */
KM_HD uint16_t km_f32_to_bf16(float f) {
    uint32_t u = km_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* ---- the forward pass ---- */

/* 1 / rms of a row from its sum of squares (in double, as the CPU sums). */
KM_HD float km_rms_scale(double sumsq, int n, float eps) { return (float)(1.0 / sqrt(sumsq / n + eps)); }

/* silu(g) * u with silu(g) = g / (1 + e^-g). */
KM_HD float km_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* The two elements RoPE pair i rotates: adjacent (2i, 2i+1) for mode 0
 * (GGUF llama), rotate-half (i, i + rope_dim/2) for mode 1. */
KM_HD void km_rope_pair_index(int mode, int i, int rope_dim, int *a, int *b) {
    if (mode == 0) {
        *a = 2 * i;
        *b = 2 * i + 1;
    } else {
        *a = i;
        *b = i + rope_dim / 2;
    }
}

/* cos and sin of pair i's angle at position pos, as rope_angles computes them. */
KM_HD void km_rope_cs(float inv_freq, int pos, float *cs, float *sn) {
    double th = (double)pos * inv_freq;
    *cs = (float)cos(th);
    *sn = (float)sin(th);
}

/* Rotates the pair (a, b) by the angle whose cos and sin are c and s. */
KM_HD void km_rotate(float *a, float *b, float c, float s) {
    float x = *a, y = *b;
    *a = x * c - y * s;
    *b = x * s + y * c;
}

/* ---- attention: online softmax ---- */

/* The running state of a softmax-weighted sum: max m, sum l of e^(s-m). */
typedef struct {
    float m, l;
} km_osm;

KM_HD km_osm km_osm_init(void) {
    km_osm o;
    o.m = -INFINITY;
    o.l = 0.0f;
    return o;
}

/* Takes score s: returns the factor the accumulated output must be scaled
 * by (e^(m_old - m_new)) and sets *w to the weight of s's row (e^(s - m_new)). */
KM_HD float km_osm_push(km_osm *o, float s, float *w) {
    float m = s > o->m ? s : o->m;
    float f = o->m == -INFINITY ? 0.0f : expf(o->m - m);
    *w = m == -INFINITY ? 0.0f : expf(s - m);
    o->l = o->l * f + *w;
    o->m = m;
    return f;
}

/* Merges state b into a: returns the factors for a's and b's accumulated
 * outputs in *fa and *fb (attend_merge's rule: an empty part, m = -inf,
 * contributes nothing). */
KM_HD void km_osm_merge(km_osm *a, km_osm b, float *fa, float *fb) {
    float m = b.m > a->m ? b.m : a->m;
    *fa = a->m == -INFINITY ? 0.0f : expf(a->m - m);
    *fb = b.m == -INFINITY ? 0.0f : expf(b.m - m);
    a->l = a->l * *fa + b.l * *fb;
    a->m = m;
}

/* ---- sparse-policy stages ---- */

/* A 64-bit key that sorts ascending in shadowkv_topk's order: higher score
 * first, equal scores (with -0 == +0) to the lower index, NaN last. */
KM_HD uint64_t km_topk_key(float score, uint32_t index) {
    uint32_t desc;
    if (score != score) {
        desc = 0xffffffffu;
    } else {
        if (score == 0.0f) score = 0.0f; /* -0 as +0 */
        uint32_t u = km_f32_bits(score);
        uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending with the value */
        desc = ~asc;
        if (desc == 0xffffffffu) desc = 0xfffffffeu; /* keep the NaN slot for NaN */
    }
    return ((uint64_t)desc << 32) | index;
}

/* Cosine of two vectors from their dot product and squared norms; a zero
 * vector gives 0 (shadowkv_cos_min's rule). */
KM_HD float km_cosine(float dot, float nn_a, float nn_b) {
    float den = sqrtf(nn_a) * sqrtf(nn_b);
    return den > 0 ? dot / den : 0.0f;
}

/* Quest's bound of q_c * k_c over a page whose channel c lies in [mn, mx]. */
KM_HD float km_page_bound(float q, float mn, float mx) {
    float a = q * mn, b = q * mx;
    return a > b ? a : b;
}

/* KIVI: the scale and zero of a group from its min and max (kivi.c's rule,
 * with SpeCache's 1-bit midpoint variant). */
KM_HD void km_kivi_params(float lo, float hi, int bits, int midpoint, float *scale, float *zero) {
    int top = (1 << bits) - 1;
    if (midpoint && bits == 1) {
        *zero = (3 * lo + hi) / 4;
        *scale = (hi - lo) / 2;
    } else {
        *zero = lo;
        *scale = (hi - lo) / top;
    }
}

/* The code of v (round half to even, clamped) and what it decodes to. */
KM_HD int km_kivi_code(float v, float scale, float zero, int bits) {
    int top = (1 << bits) - 1;
    if (!(scale > 0)) return 0;
    float r = nearbyintf((v - zero) / scale);
    return r < 0 ? 0 : r > top ? top : (int)r;
}

KM_HD float km_kivi_decode(int code, float scale, float zero, float lo, float hi) {
    return hi == lo ? lo : zero + (float)code * scale;
}

/* ---- ShadowKV's chunk cache ---- */

/* One (layer, KV head)'s cache of n_slots slots takes a new selection sel
 * (k distinct candidate ids): an id already cached is a hit and keeps its
 * slot; each miss (in order) takes the first slot no selected id claimed in
 * this epoch, evicting what it held. slot_id (n_slots): the id each slot
 * holds (-1 empty); where (ids): each id's slot (-1 none); stamp (n_slots):
 * the epoch a slot was last claimed in; *epoch advances by one (restarting
 * the stamps when it wraps). slot_of (k) gets each sel[i]'s slot, miss the
 * indices i that missed; returns their count. The one rule of
 * shadowkv_cache_update (CPU) and the device books (sk_books). */
KM_HD int km_cache_update(int n_slots, int *slot_id, int *where, unsigned *stamp, unsigned *epoch, const int *sel,
                          int k, int *slot_of, int *miss) {
    if (++*epoch == 0) {
        for (int s = 0; s < n_slots; s++) stamp[s] = 0;
        *epoch = 1;
    }
    unsigned ep = *epoch;
    int n_miss = 0;
    for (int i = 0; i < k; i++) {
        int s = where[sel[i]];
        if (s >= 0) {
            slot_of[i] = s;
            stamp[s] = ep;
        } else {
            miss[n_miss++] = i;
        }
    }
    int free_slot = 0;
    for (int m = 0; m < n_miss; m++) {
        while (stamp[free_slot] == ep) free_slot++;
        int i = miss[m], s = free_slot++;
        if (slot_id[s] >= 0) where[slot_id[s]] = -1;
        slot_id[s] = sel[i];
        where[sel[i]] = s;
        stamp[s] = ep;
        slot_of[i] = s;
    }
    return n_miss;
}

#endif
