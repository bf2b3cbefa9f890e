/* quant.h: ggml block formats (f32, f16, bf16, q8_0, q4_0, q5_0, q4_K, q6_K):
 * dequantization, dot products and matrix-vector products straight from the
 * stored blocks, and quantization (for the GGUF writer). */
#ifndef SKV_QUANT_H
#define SKV_QUANT_H

#include "gguf.h"
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

/* Dequantizes rows [r0, r1) of a (rows, n) matrix into dst (r1-r0, n). */
void quant_dequant_rows(enum ggml_type t, const void *W, size_t n, size_t r0, size_t r1, float *dst);

/* y[r] = sum_j W[r][j] * x[j] for r < rows; W is (rows, n) of type t, read
 * once, split over the engine's threads. */
void quant_matvec(enum ggml_type t, const void *W, size_t rows, size_t n, const float *x, float *y);

/* Quantizes n elements of src into dst (ggml_row_size(t, n) bytes).
 * Returns 0, or SKV_EUNSUPPORTED for a type without a quantizer. */
int quant_quantize_row(enum ggml_type t, const float *src, void *dst, size_t n);

#endif
