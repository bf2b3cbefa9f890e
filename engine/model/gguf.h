/* gguf.h: GGUF v2/v3 reader (mmap); the tensor types are kernels/ggml_type.h.
 *
 * gguf_open maps the file, parses and validates every metadata entry and
 * tensor description (counts, string lengths, dims, offsets and sizes are all
 * checked against the file size), and copies the metadata into owned memory.
 * Tensor data stays in the mapping: gguf_tensor.data points into it. */
#ifndef SKV_GGUF_H
#define SKV_GGUF_H

#include "ggml_type.h"

#include <stddef.h>
#include <stdint.h>

/* Metadata value types. */
enum gguf_vtype {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
    GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10,
    GGUF_I64 = 11, GGUF_F64 = 12, GGUF_VTYPE_COUNT = 13,
};

typedef struct {
    char *key;
    enum gguf_vtype type;
    enum gguf_vtype arr_type;  /* element type when type == GGUF_ARRAY */
    uint64_t n;                /* element count for arrays, 1 otherwise */
    union {
        uint64_t u; int64_t i; double f; /* scalars, widened */
        struct { char *s; uint64_t len; } str;
    } v;
    void *arr;          /* numeric array elements, native width, owned (aligned copy) */
    char **arr_str;     /* string array elements, NUL-terminated, owned */
    uint32_t *arr_len;  /* their byte lengths (strings may hold NUL) */
} gguf_kv;

typedef struct {
    char *name;
    uint32_t n_dims;
    uint64_t ne[4];       /* ne[0] is the contiguous (row) dimension */
    enum ggml_type type;
    uint64_t offset;      /* from the start of the data section */
    uint64_t nbytes;
    const void *data;     /* into the mapping */
} gguf_tensor;

typedef struct gguf_file gguf_file;
struct gguf_file {
    char *path;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint32_t alignment;
    const uint8_t *map;
    size_t map_size;
    uint64_t data_offset;
};

/* Opens and validates path. On error returns a negative SKV_E* code and sets
 * skv_last_error() to a one-line message naming the file and what is wrong. */
int gguf_open(const char *path, gguf_file **out);
void gguf_close(gguf_file *f);

const gguf_kv *gguf_find(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed look-ups: 0 on success, SKV_EMISSING when absent, SKV_EFORMAT on a
 * type that cannot convert (integers convert between widths when in range). */
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
int gguf_get_f32(const gguf_file *f, const char *key, float *out);
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
const char *gguf_get_str(const gguf_file *f, const char *key); /* NULL if absent/not a string */

/* Element i of a numeric array as double (any numeric element type). */
double gguf_arr_num(const gguf_kv *kv, uint64_t i);

const char *gguf_vtype_name(enum gguf_vtype t);

#endif
