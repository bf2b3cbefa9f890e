/* quant.h: ggml block formats (f32, f16, bf16, q8_0, q4_0, q5_0, q4_K, q6_K):
 * dequantization, dot products and matrix-vector products straight from the
 * stored blocks, and quantization (for the GGUF writer). */
#ifndef SKV_QUANT_H
#define SKV_QUANT_H

#include "ggml_type.h"
#include <stddef.h>
#include <stdint.h>

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);     /* round to nearest even */
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);     /* round to nearest even */

/* 1 if the engine can compute with tensors of this type. */
int quant_supported(enum ggml_type t);

/* Dequantizes n elements (a multiple of the block size) starting at src. */
void quant_dequant_row(enum ggml_type t, const void *src, float *dst, size_t n);

/* Dequantizes rows [r0, r1) of a (rows, n) matrix into dst (r1-r0, n),
 * split over the engine's threads when large. */
void quant_dequant_rows(enum ggml_type t, const void *W, size_t n, size_t r0, size_t r1, float *dst);

/* sum_j w[j] * x[j] over one stored row w of n elements of type t, computed
 * as quant_matvec computes it (x quantized to 8 bits for quantized t). */
float quant_dot(enum ggml_type t, const void *row, const float *x, size_t n);

/* y[r] = sum_j W[r][j] * x[j] for r < rows; W is (rows, n) of type t, read
 * once, split over the engine's threads (OpenMP, rows in static chunks);
 * blocks need no alignment. f32/f16/bf16 rows meet x in fp32. For q8_0,
 * q4_0, q5_0, q4_K and q6_K, x is first quantized to blocks of 32 int8 codes
 * with an fp32 scale (amax/127), as llama.cpp does, and rows are multiplied in
 * integers: a few tenths of a percent of relative error against the exact
 * product of the stored weights (a few percent when a few elements of x
 * dwarf the rest). y[r] equals quant_dot on row r. */
void quant_matvec(enum ggml_type t, const void *W, size_t rows, size_t n, const float *x, float *y);

/* quant_matvec of m (<= QUANT_ROWS_MAX) vectors x (m, n) against W at once:
 * y (m, rows), row j of y equal to quant_matvec of x row j bit for bit, but
 * each row of W read from memory once for all m (a batched decode step;
 * q8_0, q4_0 and q5_0 take two x a pass over each weight block). */
#define QUANT_ROWS_MAX 64
void quant_matvec_rows(enum ggml_type t, const void *W, size_t rows, size_t n, const float *x, int m, float *y);

/* The kernel quant_matvec_rows runs for type t in this build, for tests and
 * logs: "two-row AVX2" (q8_0, q4_0, q5_0 where AVX2 is compiled without the
 * AVX-512 VNNI kernels), else the one-row kernel of quant_matvec:
 * "one-row AVX-512", "one-row AVX2" or "one-row scalar". */
const char *quant_rows_kernel(enum ggml_type t);

/* One block of 32 activations as quant_matvec quantizes it: codes q
 * (round(x * 127/amax), nearest even), scale *d (amax/127, rounded to fp16
 * when it fits; 0 for a zero block, NaN for one holding inf or NaN) and the
 * codes' sum *s. */
void quant_xq_block(const float *x, int8_t *q, float *d, int32_t *s);

/* Sub-block j (0..7, 32 weights) of the q4_K or q6_K super-block sb as codes
 * q (32) with weight = d[part] * q - *mn: q4_K codes 0..15, one scale d[0]
 * and a minimum; q6_K codes -32..31, two 16-weight parts with scales d[0],
 * d[1] and *mn = 0. The decode matvec's reference kernels and qgemm read the
 * k-quants through it. */
void quant_kblock(enum ggml_type t, const uint8_t *sb, int j, int8_t *q, float *d, float *mn);

/* quant_matvec of k (<= 4) matrices W[i] (rows[i], n) of types t[i] against
 * the same x into y[i], in one parallel pass over all their rows (the Q, K
 * and V projections; gate and up). Each y[i] equals quant_matvec's. */
void quant_matvec_k(int k, const enum ggml_type *t, const void *const *W, const size_t *rows, size_t n, const float *x,
                    float *const *y);

/* quant_matvec through the portable scalar kernels on one thread, whatever
 * the build's SIMD. For the quantized types its y is bit for bit
 * quant_matvec's (the vector kernels keep the scalar order of every integer
 * and float operation); for f32/f16/bf16 it differs by summation order. */
void quant_matvec_ref(enum ggml_type t, const void *W, size_t rows, size_t n, const float *x, float *y);

/* Quantizes n elements of src into dst (ggml_row_size(t, n) bytes), for every
 * type quant_supported accepts. f16/bf16 round to nearest even; q8_0, q4_0 and
 * q5_0 reproduce ggml's reference quantizers byte for byte; q4_K and q6_K use
 * a plain round-to-nearest scale choice (valid ggml data, slightly larger
 * error than llama-quantize's search). Returns 0, SKV_EINVAL when n is not a
 * multiple of the block size, or SKV_EUNSUPPORTED for other types. */
int quant_quantize_row(enum ggml_type t, const float *src, void *dst, size_t n);

#endif
