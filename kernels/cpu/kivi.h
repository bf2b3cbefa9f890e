/* kivi.h: the KIVI min-max quantizer shared by SpeCache and TailorKV
 * (PEERS.md, "Shared quantizer"), on one group of values at a time.
 *
 * scale = (max - min) / (2^b - 1); code = clamp(rint((x - min) / scale),
 * 0, 2^b - 1), rounding half to even as torch does; x' = min + code·scale.
 * A group with max == min stores code 0 and decodes exactly. SpeCache's
 * 1-bit rule (midpoint = 1, b = 1): zero = (3·min + max) / 4 and
 * scale = (max - min) / 2, so the two codes decode to the quartile
 * midpoints. */
#ifndef SKV_KIVI_H
#define SKV_KIVI_H

#include <stdint.h>

/* Quantizes the n values x[i·stride] as one group and writes what they
 * decode to into y[i·stride] (y may be x). codes (n, may be NULL) gets the
 * codes; *scale and *zero (may be NULL) the group's parameters. */
void kivi_group(const float *x, int n, int stride, int bits, int midpoint, float *y, uint8_t *codes, float *scale,
                float *zero);

#endif
