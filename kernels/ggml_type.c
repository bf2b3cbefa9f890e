/* ggml_type.c: the block geometry table of the ggml tensor types. */
#include "ggml_type.h"

typedef struct { uint32_t blck, size; const char *name; } type_info;

static const type_info types[GGML_TYPE_COUNT] = {
    [GGML_F32] = {1, 4, "f32"},       [GGML_F16] = {1, 2, "f16"},
    [GGML_Q4_0] = {GGML_QK, GGML_Q4_0_BYTES, "q4_0"},   [GGML_Q4_1] = {32, 20, "q4_1"},
    [GGML_Q5_0] = {GGML_QK, GGML_Q5_0_BYTES, "q5_0"},   [GGML_Q5_1] = {32, 24, "q5_1"},
    [GGML_Q8_0] = {GGML_QK, GGML_Q8_0_BYTES, "q8_0"},   [GGML_Q8_1] = {32, 36, "q8_1"},
    [GGML_Q2_K] = {256, 84, "q2_K"},  [GGML_Q3_K] = {256, 110, "q3_K"},
    [GGML_Q4_K] = {GGML_QK_K, GGML_Q4_K_BYTES, "q4_K"}, [GGML_Q5_K] = {256, 176, "q5_K"},
    [GGML_Q6_K] = {GGML_QK_K, GGML_Q6_K_BYTES, "q6_K"}, [GGML_Q8_K] = {256, 292, "q8_K"},
    [GGML_I8] = {1, 1, "i8"},         [GGML_I16] = {1, 2, "i16"},
    [GGML_I32] = {1, 4, "i32"},       [GGML_I64] = {1, 8, "i64"},
    [GGML_F64] = {1, 8, "f64"},       [GGML_BF16] = {1, 2, "bf16"},
};

int ggml_type_known(enum ggml_type t) { return (unsigned)t < GGML_TYPE_COUNT && types[t].blck; }
const char *ggml_type_name(enum ggml_type t) { return ggml_type_known(t) ? types[t].name : "unknown"; }
uint32_t ggml_blck_size(enum ggml_type t) { return ggml_type_known(t) ? types[t].blck : 0; }
uint32_t ggml_type_size(enum ggml_type t) { return ggml_type_known(t) ? types[t].size : 0; }

size_t ggml_row_size(enum ggml_type t, uint64_t n) {
    if (!ggml_type_known(t) || n % types[t].blck) return 0;
    return (size_t)(n / types[t].blck) * types[t].size;
}
