/* model.h: a Llama-family model in memory: config, weights, tokenizer.
 *
 * model_load reads a GGUF file or an HF directory (config.json, *.safetensors,
 * tokenizer.json). Weights keep their file type (f32, f16, bf16, q8_0, q4_0,
 * q5_0, q4_K, q6_K) and point into the mapping where they can; the forward
 * pass dequantizes on the fly (quant.h). */
#ifndef SKV_MODEL_H
#define SKV_MODEL_H

#include "gguf.h"
#include "rope.h"
#include <stddef.h>
#include <stdint.h>


typedef struct {
    char arch[32];         /* "llama", "mistral", "qwen2" */
    char name[128];
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab;
    int ctx_train;         /* trained context length */
    float norm_eps;
    float rope_theta;
    int rope_dim;          /* rotated dims per head (<= head_dim) */
    rope_mode rope_mode;
    int rope_llama3;       /* Llama-3 rope_scaling of type "llama3" */
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_ctx;
    int qkv_bias;          /* qwen2 */
    int tied_embd;         /* output = token embedding */
    int bos, eos;
} model_config;

/* A weight matrix (rows, cols), row-major: rows = output features,
 * cols = input features (ggml's ne[1], ne[0]). 1-D tensors have rows = 1. */
typedef struct {
    enum ggml_type type;
    int rows, cols;
    const void *data;
} skv_tensor;

typedef struct {
    skv_tensor attn_norm;          /* (dim) */
    skv_tensor wq, wk, wv, wo;     /* (n_heads*hd, dim), (n_kv*hd, dim) x2, (dim, n_heads*hd) */
    skv_tensor bq, bk, bv;         /* biases (qwen2) or data == NULL */
    skv_tensor ffn_norm;           /* (dim) */
    skv_tensor w_gate, w_up;       /* (ffn, dim) */
    skv_tensor w_down;             /* (dim, ffn) */
} model_layer;

typedef struct tok_vocab tok_vocab;

typedef struct skv_model skv_model;
struct skv_model {
    model_config cfg;
    char *path;
    char format[16];               /* "gguf" or "hf" */
    int random_weights;            /* made by skv synth: not a trained model */
    skv_tensor tok_embd;           /* (vocab, dim) */
    skv_tensor out_norm;           /* (dim) */
    skv_tensor output;             /* (vocab, dim); == tok_embd when tied */
    model_layer *layers;           /* (n_layers) */
    tok_vocab *tok;
    /* owned backing stores */
    gguf_file *gguf;
    void **owned; int n_owned;     /* buffers made by the loader (converted/copied tensors) */
    void *st;                      /* safetensors set, when loaded from HF */
};

/* Loads a GGUF file or HF directory. Returns 0 or a negative SKV_E* code with
 * skv_last_error() naming the file and the problem. */
int model_load(const char *path, skv_model **out);
void model_free(skv_model *m);

/* Bytes of all weights as stored. */
size_t model_weight_bytes(const skv_model *m);

/* Fills cfg fields derived from others (head_dim, rope_dim) and checks the
 * config for consistency; returns 0 or SKV_EFORMAT with a message naming src. */
int model_config_check(model_config *cfg, const char *src);

/* The RoPE parameters of cfg. */
static inline rope_params model_rope_params(const model_config *c) {
    rope_params p = {.mode = c->rope_mode, .head_dim = c->head_dim, .rope_dim = c->rope_dim,
                     .theta = c->rope_theta, .llama3 = c->rope_llama3, .factor = c->rope_factor,
                     .low_freq = c->rope_low_freq, .high_freq = c->rope_high_freq, .orig_ctx = c->rope_orig_ctx};
    return p;
}

/* Checks a tensor's type and shape; on mismatch sets a message naming src. */
int model_check_tensor(const skv_tensor *t, const char *name, int rows, int cols, const char *src);

#endif
