/* convert.h: writes any model skv can load (GGUF file or HF directory) as a
 * standard llama.cpp GGUF: the layout, metadata keys and tensor names
 * llama.cpp's convert_hf_to_gguf.py produces, read back by model_load.
 *
 * - Architecture: llama and mistral are written as "llama", qwen2 as "qwen2".
 * - RoPE: a rotate-half (HF) source written as llama gets the rows of attn_q
 *   and attn_k permuted within each head (HF row i < d/2 -> 2i, d/2 + i ->
 *   2i + 1), so the adjacent-pair GGUF computes the same function; qwen2
 *   keeps rotate-half and its rows. Llama-3 rope scaling becomes the
 *   rope_freqs.weight tensor of per-pair divisors, as llama.cpp writes it
 *   (a GGUF source's rope_freqs is copied).
 * - Weights: matrices in the chosen type (f32 or f16) from any stored type
 *   (f32, f16, bf16, and the quantized types, which are dequantized); norms,
 *   biases and rope_freqs always f32. f16 output refuses values beyond f16's
 *   range rather than writing infinities.
 * - Tokenizer: a GGUF source's tokenizer.* metadata is copied as is. An HF
 *   tokenizer.json (byte-level BPE) becomes tokenizer.ggml.model "gpt2" with
 *   the llama.cpp pre-tokenizer name whose regexes are exactly the ones the
 *   HF file describes (tok_pre_gguf_name); a tokenizer that no GGUF name
 *   reproduces (no such name, add_prefix_space, ignore_merges unlike the
 *   name's, lstrip/rstrip tokens) is refused, since the GGUF would split text
 *   differently. Vocabulary gaps and the rows of the embedding beyond the
 *   vocabulary get "[PADn]" tokens of type unused, as llama.cpp's converter.
 *   Not carried: the chat template and end-of-generation ids from
 *   generation_config.json beyond EOS (the GGUF loader finds the usual
 *   end-of-turn tokens by name).
 * The file goes to a temporary file beside path and is renamed into place;
 * an existing path is replaced only with force. */
#ifndef SKV_CONVERT_H
#define SKV_CONVERT_H

#include "model.h"
#include <stdint.h>

typedef struct {
    enum ggml_type type;   /* GGML_F32 or GGML_F16: the matrices' type */
    int force;             /* replace an existing file at path */
    const char *name;      /* general.name to write; NULL: the model's own (else its file or folder name) */
} convert_opts;

typedef struct {
    char arch[32];         /* architecture written ("llama", "qwen2") */
    int n_tensors;
    uint64_t bytes;        /* size of the file written */
    int permuted;          /* attn_q/attn_k rows went from rotate-half to adjacent pairs */
} convert_info;

/* The lossless default output type for m: f16 when every matrix is stored
 * as f16, else f32. */
enum ggml_type convert_default_type(const skv_model *m);

/* Writes m to path as described above; info may be NULL. Returns 0 or a
 * negative SKV_E* code with skv_last_error() naming the file and the
 * problem; on error nothing is left at path that was not there before. */
int convert_write_gguf(const skv_model *m, const char *path, const convert_opts *o, convert_info *info);

#endif
