/* synth.c: random-weight GGUF models of real shapes for benchmarks.
 *
 * Every row of every tensor comes from its own counter-based random stream
 * (seed, tensor, row), so the file is identical for a seed whatever the
 * writer's slice size. Matrices are scaled by 1/sqrt(cols) so activations
 * stay O(1); each layer's key projection is A·B with inner dimension
 * key_rank, so its keys have exactly that rank before RoPE. */
#include "synth.h"
#include "gguf_write.h"
#include "quant.h"
#include "skv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T_EMBD, T_OUT_NORM, T_OUTPUT, T_ROPE_FREQS, T_ATTN_NORM, T_Q, T_K, T_V, T_O, T_BQ, T_BK, T_BV, T_FFN_NORM,
       T_GATE, T_UP, T_DOWN };

typedef struct {
    int what, layer;
    int rows, cols;
    enum ggml_type type;
} tinfo;

typedef struct {
    const model_config *c;
    const synth_opts *o;
    tinfo *t;
    int n;
    float **kb;      /* (n_layers) -> (key_rank, dim) right factor of each key projection */
    float *row;      /* (max cols) scratch */
    float *coef;     /* (key_rank) scratch */
} synth_ctx;

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1) scaled to unit variance, from a (seed, stream, index) counter. */
static void fill_random(float *x, int n, uint64_t seed, uint64_t stream, float scale) {
    uint64_t s = mix(seed ^ mix(stream));
    const float k = 1.7320508f * scale / 2147483648.0f;
    for (int i = 0; i < n; i++) {
        s = mix(s);
        x[i] = (float)(int32_t)(uint32_t)(s >> 32) * k;
    }
}

/* Produces one float row of tensor ti. */
static void make_row(synth_ctx *s, const tinfo *t, int ti, int r, float *row) {
    const model_config *c = s->c;
    uint64_t stream = ((uint64_t)ti << 32) | (uint32_t)r;
    switch (t->what) {
    case T_OUT_NORM: case T_ATTN_NORM: case T_FFN_NORM:
        for (int j = 0; j < t->cols; j++) row[j] = 1.0f;
        break;
    case T_ROPE_FREQS: {
        rope_params rp = model_rope_params(c);
        for (int j = 0; j < t->cols; j++) row[j] = (float)rope_llama3_divisor(&rp, j);
        break;
    }
    case T_BQ: case T_BK: case T_BV:
        fill_random(row, t->cols, s->o->seed, stream, 0.1f);
        break;
    case T_EMBD: case T_OUTPUT:
        fill_random(row, t->cols, s->o->seed, stream, 1.0f);
        break;
    case T_K: {
        int kr = s->o->key_rank;
        fill_random(s->coef, kr, s->o->seed, stream, 1.0f / sqrtf((float)kr));
        memset(row, 0, sizeof(float) * t->cols);
        for (int j = 0; j < kr; j++) {
            const float *b = s->kb[t->layer] + (size_t)j * t->cols;
            for (int i = 0; i < t->cols; i++) row[i] += s->coef[j] * b[i];
        }
        break;
    }
    default:
        fill_random(row, t->cols, s->o->seed, stream, 1.0f / sqrtf((float)t->cols));
    }
}

static int fill(void *user, int idx, uint64_t offset, void *dst, size_t nbytes) {
    synth_ctx *s = user;
    const tinfo *t = &s->t[idx];
    size_t rb = ggml_row_size(t->type, t->cols);
    SKV_ASSERT(rb && offset % rb == 0 && nbytes % rb == 0);
    for (size_t r = offset / rb; r < (offset + nbytes) / rb; r++) {
        make_row(s, t, idx, (int)r, s->row);
        int rc = quant_quantize_row(t->type, s->row, (uint8_t *)dst + (r - offset / rb) * rb, t->cols);
        if (rc) return rc;
    }
    return 0;
}

static void add(synth_ctx *s, int what, int layer, int rows, int cols, enum ggml_type type) {
    s->t[s->n++] = (tinfo){what, layer, rows, cols, type};
}

/* GPT-2's printable stand-in for byte b, as UTF-8 into out (NUL-terminated). */
static void byte_standin(int b, char *out) {
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) cp = b;
    else {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; }
    else { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); out[2] = 0; }
}

static int write_vocab(gguf_writer *w, int vocab) {
    if (vocab < 259) return skv_error(SKV_EINVAL, "synth: vocabulary of %d is too small (need 259)", vocab);
    char **toks = calloc(vocab, sizeof(char *));
    int32_t *types = calloc(vocab, sizeof(int32_t));
    int rc = toks && types ? 0 : skv_error(SKV_ENOMEM, "out of memory");
    for (int i = 0; i < vocab && !rc; i++) {
        char buf[32];
        if (i < 256) { byte_standin(i, buf); types[i] = 1; }
        else if (i == 256) { strcpy(buf, "<|endoftext|>"); types[i] = 3; }
        else if (i == 257) { strcpy(buf, "<|im_start|>"); types[i] = 3; }
        else if (i == 258) { strcpy(buf, "<|im_end|>"); types[i] = 3; }
        else { snprintf(buf, sizeof buf, "[synth-%d]", i); types[i] = 5; }
        if (!(toks[i] = strdup(buf))) rc = skv_error(SKV_ENOMEM, "out of memory");
    }
    if (!rc) rc = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (!rc) rc = gguf_writer_set_str(w, "tokenizer.ggml.pre", "default");
    if (!rc) rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, NULL, vocab);
    if (!rc) rc = gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, vocab);
    if (!rc) rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", NULL, NULL, 0);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256);
    if (!rc) rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 0);
    for (int i = 0; toks && i < vocab; i++) free(toks[i]);
    free(toks);
    free(types);
    return rc;
}

int synth_write(const model_config *c, const synth_opts *o0, const char *path) {
    synth_opts o = *o0;
    int kvd = c->n_kv_heads * c->head_dim, qd = c->n_heads * c->head_dim;
    if (o.key_rank <= 0) o.key_rank = kvd / 4 > 0 ? kvd / 4 : 1;
    if (o.key_rank > kvd) o.key_rank = kvd;
    if (o.dtype != GGML_F32 && o.dtype != GGML_F16 && o.dtype != GGML_BF16 && o.dtype != GGML_Q8_0 &&
        o.dtype != GGML_Q4_0)
        return skv_error(SKV_EINVAL, "synth: dtype %s is not offered (f32, f16, bf16, q8_0, q4_0)", ggml_type_name(o.dtype));
    const char *arch = c->arch[0] ? c->arch : "llama";
    synth_ctx s = {.c = c, .o = &o};
    s.t = calloc(4 + 12 * (size_t)c->n_layers, sizeof(tinfo));
    s.kb = calloc(c->n_layers, sizeof(float *));
    int maxc = c->dim > c->ffn_dim ? c->dim : c->ffn_dim;
    if (qd > maxc) maxc = qd;
    s.row = malloc(sizeof(float) * maxc);
    s.coef = malloc(sizeof(float) * o.key_rank);
    gguf_writer *w = gguf_writer_new();
    int rc = s.t && s.kb && s.row && s.coef && w ? 0 : skv_error(SKV_ENOMEM, "out of memory");
    enum ggml_type mt = o.dtype;
    if (!rc) {
        add(&s, T_EMBD, -1, c->vocab, c->dim, mt);
        add(&s, T_OUT_NORM, -1, 1, c->dim, GGML_F32);
        if (!c->tied_embd) add(&s, T_OUTPUT, -1, c->vocab, c->dim, mt);
        if (c->rope_llama3) add(&s, T_ROPE_FREQS, -1, 1, c->rope_dim / 2, GGML_F32);
        for (int l = 0; l < c->n_layers; l++) {
            add(&s, T_ATTN_NORM, l, 1, c->dim, GGML_F32);
            add(&s, T_Q, l, qd, c->dim, mt);
            add(&s, T_K, l, kvd, c->dim, mt);
            add(&s, T_V, l, kvd, c->dim, mt);
            add(&s, T_O, l, c->dim, qd, mt);
            if (c->qkv_bias) {
                add(&s, T_BQ, l, 1, qd, GGML_F32);
                add(&s, T_BK, l, 1, kvd, GGML_F32);
                add(&s, T_BV, l, 1, kvd, GGML_F32);
            }
            add(&s, T_FFN_NORM, l, 1, c->dim, GGML_F32);
            add(&s, T_GATE, l, c->ffn_dim, c->dim, mt);
            add(&s, T_UP, l, c->ffn_dim, c->dim, mt);
            add(&s, T_DOWN, l, c->dim, c->ffn_dim, mt);
        }
        for (int l = 0; l < c->n_layers && !rc; l++) {
            s.kb[l] = malloc(sizeof(float) * o.key_rank * c->dim);
            if (!s.kb[l]) { rc = skv_error(SKV_ENOMEM, "out of memory"); break; }
            for (int j = 0; j < o.key_rank; j++)
                fill_random(s.kb[l] + (size_t)j * c->dim, c->dim, o.seed, 0xb0000000ull + ((uint64_t)l << 16) + j,
                            1.0f / sqrtf((float)c->dim));
        }
    }
    static const char *names[] = {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight",
                                  "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                  "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
                                  "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
    for (int i = 0; i < s.n && !rc; i++) {
        char nm[96];
        if (s.t[i].layer < 0) snprintf(nm, sizeof nm, "%s", names[s.t[i].what]);
        else snprintf(nm, sizeof nm, "blk.%d.%s", s.t[i].layer, names[s.t[i].what]);
        uint64_t ne[2] = {(uint64_t)s.t[i].cols, (uint64_t)s.t[i].rows};
        rc = gguf_writer_add_tensor(w, nm, s.t[i].type, s.t[i].rows == 1 ? 1 : 2, ne);
    }
    char key[128];
#define KEY(sfx) (snprintf(key, sizeof key, "%s." sfx, arch), key)
    if (!rc) rc = gguf_writer_set_str(w, "general.architecture", arch);
    if (!rc) rc = gguf_writer_set_str(w, "general.name", c->name[0] ? c->name : "synth");
    if (!rc) rc = gguf_writer_set_u32(w, KEY("context_length"), c->ctx_train);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("embedding_length"), c->dim);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("block_count"), c->n_layers);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("feed_forward_length"), c->ffn_dim);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("attention.head_count"), c->n_heads);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("attention.head_count_kv"), c->n_kv_heads);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("attention.key_length"), c->head_dim);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("attention.value_length"), c->head_dim);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("rope.dimension_count"), c->rope_dim);
    if (!rc) rc = gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->norm_eps);
    if (!rc) rc = gguf_writer_set_f32(w, KEY("rope.freq_base"), c->rope_theta);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("vocab_size"), c->vocab);
#undef KEY
    if (!rc) rc = gguf_writer_set_bool(w, "skv.synth.random_weights", 1);
    if (!rc) rc = gguf_writer_set_u64(w, "skv.synth.seed", o.seed);
    if (!rc) rc = gguf_writer_set_u32(w, "skv.synth.key_rank", o.key_rank);
    if (!rc) rc = write_vocab(w, c->vocab);
    if (!rc) rc = gguf_writer_write(w, path, fill, &s);
    gguf_writer_free(w);
    for (int l = 0; s.kb && l < c->n_layers; l++) free(s.kb[l]);
    free(s.kb);
    free(s.t);
    free(s.row);
    free(s.coef);
    return rc;
}
