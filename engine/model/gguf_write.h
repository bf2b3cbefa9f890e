/* gguf_write.h: a GGUF v3 writer that streams tensor data.
 *
 * Build a description (metadata entries and tensor infos), then call
 * gguf_writer_write, which lays out the file (header, metadata, tensor
 * infos, data aligned to general.alignment or 32) and asks a callback for
 * each tensor's bytes in row-aligned slices, so a model far larger than
 * memory can be converted or quantized through one bounded buffer.
 *
 * The file is written to a temporary file next to path, fsynced and renamed
 * over path; on any error the temporary file is removed and whatever was at
 * path before is left untouched. The new file gets mode 0644. Whether an
 * existing file may be replaced is the caller's decision.
 *
 * Files written from a reader's metadata (gguf_writer_set_kv) and tensors in
 * the same order come out byte-identical to llama.cpp's own files.
 *
 * Every function returns 0 or a negative SKV_E* code with skv_last_error()
 * set. Setting a key that is already present replaces its value and keeps
 * its position; keys are written in the order first set. */
#ifndef SKV_GGUF_WRITE_H
#define SKV_GGUF_WRITE_H

#include "gguf.h"
#include <stddef.h>
#include <stdint.h>

typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void); /* NULL when out of memory */
void gguf_writer_free(gguf_writer *w);

/* Scalar metadata. */
int gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v);
int gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v);
int gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v);
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_set_f64(gguf_writer *w, const char *key, double v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, int v);
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *s);
/* A string of len bytes that may hold NULs. */
int gguf_writer_set_strn(gguf_writer *w, const char *key, const char *s, size_t len);

/* Arrays (copied). elem is any numeric or bool type; v holds n elements of its
 * native width (bool: one byte each). */
int gguf_writer_set_arr(gguf_writer *w, const char *key, enum gguf_vtype elem, const void *v, size_t n);
int gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, size_t n);
int gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, size_t n);
/* n strings; lens may be NULL (NUL-terminated strings) or give each length. */
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *s, const size_t *lens, size_t n);

/* Copies one metadata entry of an opened file (e.g. to carry a model's
 * metadata into a quantized copy). */
int gguf_writer_set_kv(gguf_writer *w, const gguf_kv *kv);

/* Removes key if present; 0 either way. */
int gguf_writer_remove(gguf_writer *w, const char *key);

/* Declares a tensor (description only): ne[0] is the row length and must be a
 * multiple of the type's block size; 1 <= n_dims <= 4; names are unique.
 * Tensors are written in the order added; idx in the fill callback is this
 * order, from 0. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, enum ggml_type type, int n_dims, const uint64_t *ne);

size_t gguf_writer_n_tensors(const gguf_writer *w);

/* Produces bytes [offset, offset + nbytes) of tensor idx into dst. Slices of
 * one tensor come in order, cover it exactly, and always hold whole rows
 * (offset and nbytes are multiples of the row size ggml_row_size(type, ne[0])).
 * Returns 0, or a negative SKV_E* code (with skv_error set) to abort. */
typedef int (*gguf_fill_fn)(void *user, int idx, uint64_t offset, void *dst, size_t nbytes);

/* Bound on the bytes per fill call (default 64 MiB); a slice is never less
 * than one row, whatever this says. */
void gguf_writer_set_slice_bytes(gguf_writer *w, size_t slice_bytes);

/* Writes the file as described above; fill may be NULL when there are no
 * tensors. The writer can be changed and written again afterwards. */
int gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *user);

#endif
