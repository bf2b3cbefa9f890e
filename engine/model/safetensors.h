/* safetensors.h: reader for Hugging Face safetensors checkpoints (one file or
 * a sharded set described by model.safetensors.index.json).
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
 * {...}}) and the data buffer the offsets point into. st_open_* maps every
 * shard read-only and validates each header strictly (header length, JSON,
 * dtype, shape, offsets against the buffer, size against the shape, overlaps,
 * duplicate names across shards, the index against its shards). Tensor data
 * points into the mapping, except where a tensor's offset is misaligned for
 * its element size: that tensor is copied into an owned, 64-byte aligned
 * buffer, so every data pointer may be read as its element type.
 * Errors return a negative SKV_E* code with skv_last_error() naming the file,
 * the tensor or field and what was expected. */
#ifndef SKV_SAFETENSORS_H
#define SKV_SAFETENSORS_H

#include "gguf.h"
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 4

/* One tensor of a set. shape is in file order, outermost first (row-major):
 * a weight matrix is shape[0] = rows (output features), shape[1] = cols
 * (input features), the reverse of ggml's ne[]. Unused shape entries are 1;
 * n_dims may be 0 for a scalar. Everything here is owned by the set. */
typedef struct {
    char *name;
    enum ggml_type type;        /* GGML_F32, GGML_F16 or GGML_BF16 */
    int n_dims;                 /* 0..ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
    const void *data;           /* aligned for type; into the mapping or an owned copy */
    size_t nbytes;              /* product(shape) * element size */
    const char *file;           /* path of the shard that holds it */
} st_tensor;

typedef struct st_set st_set;   /* one or many mapped shards and their tensors */

/* Opens the safetensors weights of an HF model directory: model.safetensors
 * if present, else model.safetensors.index.json and the shards its
 * "weight_map" names, else the only *.safetensors file in it. A directory with
 * none (or several *.safetensors and no index) is SKV_EMISSING. */
int st_open_dir(const char *dir, st_set **out);

/* Opens one .safetensors file, or an index .json file and its shards (paths in
 * the index are relative to the index's directory). */
int st_open_file(const char *path, st_set **out);

/* Frees the set, its copies and mappings; every st_tensor pointer dies. NULL ok. */
void st_close(st_set *s);

/* The tensor called name, or NULL (binary search over a sorted name table). */
const st_tensor *st_find(const st_set *s, const char *name);

/* Tensors in shard order, then file-header order within a shard; 0 <= i < st_count. */
int st_count(const st_set *s);
const st_tensor *st_get(const st_set *s, int i);

/* Number of mapped shard files, and the total bytes of tensor data. */
int st_n_files(const st_set *s);
size_t st_data_bytes(const st_set *s);

#endif
