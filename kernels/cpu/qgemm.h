/* qgemm.h: the batched (prefill) matmul of quantized weights in int8.
 *
 * y (n, rows) = x (n, cols) · Wᵀ for W in q8_0, q4_0 or q5_0 (blocks of 32
 * weights with one scale), q4_K (sub-blocks of 32 with a scale and a
 * minimum, 8 to a super-block of 256) or q6_K (sub-blocks of 16 with a
 * scale, 16 to a super-block): x is quantized to the same blocks (int8 codes,
 * scale amax/127, as quant_matvec does for a single token), and each block
 * of a weight row meets each token's block in integer arithmetic (AVX-512
 * VNNI: 16 tokens per instruction against four broadcast weights), the
 * block's int32 sum then scaled by both scales into an fp32 accumulator.
 * No f32 copy of the weights is made. The kernel is chosen at run time by
 * the CPU's features; qgemm_supported says whether it runs here. */
#ifndef SKV_QGEMM_H
#define SKV_QGEMM_H

#include "backend.h"
#include "ggml_type.h"

/* 1 when qgemm can multiply weights of type t with a batch of n tokens on
 * this CPU (and is worth it there); 0: use the dequantize-and-GEMM path. */
int qgemm_supported(enum ggml_type t, int n);

/* y (n, rows) = x (n, cols) · Wᵀ; W (rows, cols) of type t stored in
 * blocks of 32 along cols. Scratch (the quantized, repacked x) lives in
 * ws->qbuf. Splits the rows over the OpenMP threads. Call only when
 * qgemm_supported(t, n). */
void qgemm(enum ggml_type t, const void *W, int rows, int cols, const float *x, int n, float *y, skv_workspace *ws);

/* The same product through plain scalar code on one thread: the reference
 * the test compares qgemm with. Each (token, row) is the sum over blocks of
 * float(int32 block dot) * (weight scale * x scale), in block order (q6_K:
 * the two halves of a block one after the other, each with its scale; q4_K:
 * each block then less its minimum times the x block's scaled code sum, one
 * fused step). */
void qgemm_ref(enum ggml_type t, const void *W, int rows, int cols, const float *x, int n, float *y);

/* Tests: run the kernel of `level` (1 AVX2, 2 AVX-512 VNNI; 0 none) when
 * the CPU has it, else the best it has; -1 restores the best. */
void qgemm_force_level(int level);
int qgemm_kernel_level(void);  /* the level qgemm runs at now */

#endif
