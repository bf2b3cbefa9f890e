/* ggml_type.h: the ggml tensor types (numbering as in the GGUF spec) and
 * their block geometry: the one table of block sizes and bytes per block
 * that the loaders, the writer and the quantized kernels all read. */
#ifndef SKV_GGML_TYPE_H
#define SKV_GGML_TYPE_H

#include <stddef.h>
#include <stdint.h>

/* ggml tensor types (numbering as in the GGUF spec). */
enum ggml_type {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7,
    GGML_Q8_0 = 8, GGML_Q8_1 = 9, GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12,
    GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_Q8_K = 15, GGML_I8 = 24, GGML_I16 = 25,
    GGML_I32 = 26, GGML_I64 = 27, GGML_F64 = 28, GGML_BF16 = 30, GGML_TYPE_COUNT = 40,
};

/* Bytes per block of the types the kernels compute with (the table in
 * ggml_type.c is built from these, and kernels/cpu/quant.c walks blocks by them). */
#define GGML_QK 32              /* elements per q8_0 / q4_0 / q5_0 block */
#define GGML_QK_K 256           /* elements per k-quant super-block */
#define GGML_Q8_0_BYTES 34
#define GGML_Q4_0_BYTES 18
#define GGML_Q5_0_BYTES 22
#define GGML_Q4_K_BYTES 144
#define GGML_Q6_K_BYTES 210

const char *ggml_type_name(enum ggml_type t);
int ggml_type_known(enum ggml_type t);    /* has a size entry (may still be unsupported) */
uint32_t ggml_blck_size(enum ggml_type t); /* elements per block */
uint32_t ggml_type_size(enum ggml_type t); /* bytes per block */
/* Bytes of a row of n elements, or 0 if n is not a multiple of the block size. */
size_t ggml_row_size(enum ggml_type t, uint64_t n);


#endif
