/* model.c: builds an skv_model from a GGUF file (llama, mistral, qwen2
 * architectures) or an HF directory, checks every tensor's type and shape
 * against the config, and owns whatever the loaders had to convert. */
#include "model.h"
#include "hf_config.h"
#include "quant.h"
#include "safetensors.h"
#include "skv.h"
#include "tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int model_config_check(model_config *c, const char *src) {
    if (c->n_layers <= 0 || c->n_layers > 1024) return skv_error(SKV_EFORMAT, "%s: layer count %d is absurd", src, c->n_layers);
    if (c->dim <= 0 || c->dim > 65536) return skv_error(SKV_EFORMAT, "%s: hidden size %d is absurd", src, c->dim);
    if (c->n_heads <= 0 || c->n_heads > 1024) return skv_error(SKV_EFORMAT, "%s: head count %d is absurd", src, c->n_heads);
    if (c->n_kv_heads <= 0) c->n_kv_heads = c->n_heads;
    if (c->n_heads % c->n_kv_heads)
        return skv_error(SKV_EFORMAT, "%s: %d query heads is not a multiple of %d KV heads", src, c->n_heads, c->n_kv_heads);
    if (c->head_dim <= 0) {
        if (c->dim % c->n_heads) return skv_error(SKV_EFORMAT, "%s: hidden size %d not divisible by %d heads", src, c->dim, c->n_heads);
        c->head_dim = c->dim / c->n_heads;
    }
    if (c->head_dim > 1024 || c->head_dim % 2) return skv_error(SKV_EFORMAT, "%s: head dim %d is not supported", src, c->head_dim);
    if (c->rope_dim <= 0) c->rope_dim = c->head_dim;
    if (c->rope_dim > c->head_dim || c->rope_dim % 2)
        return skv_error(SKV_EFORMAT, "%s: rope dimension %d does not fit head dim %d", src, c->rope_dim, c->head_dim);
    if (c->ffn_dim <= 0 || c->ffn_dim > 1 << 20) return skv_error(SKV_EFORMAT, "%s: feed-forward size %d is absurd", src, c->ffn_dim);
    if (c->vocab <= 0 || c->vocab > 1 << 24) return skv_error(SKV_EFORMAT, "%s: vocabulary size %d is absurd", src, c->vocab);
    if (c->ctx_train <= 0) c->ctx_train = 2048;
    if (!(c->norm_eps > 0 && c->norm_eps < 1)) c->norm_eps = 1e-5f;
    if (!(c->rope_theta > 0)) c->rope_theta = 10000.0f;
    if (c->rope_llama3 && !(c->rope_factor > 0 && c->rope_low_freq > 0 && c->rope_high_freq > c->rope_low_freq &&
                            c->rope_orig_ctx > 0))
        return skv_error(SKV_EFORMAT, "%s: llama3 rope scaling parameters are inconsistent", src);
    return 0;
}

int model_check_tensor(const skv_tensor *t, const char *name, int rows, int cols, const char *src) {
    if (!t->data) return skv_error(SKV_EMISSING, "%s: tensor '%s' is missing", src, name);
    if (!quant_supported(t->type))
        return skv_error(SKV_EUNSUPPORTED, "%s: tensor '%s' has type %s, which skv cannot compute with", src, name,
                         ggml_type_name(t->type));
    if (t->rows != rows || t->cols != cols)
        return skv_error(SKV_EFORMAT, "%s: tensor '%s' has shape [%d, %d], expected [%d, %d]", src, name, t->rows,
                         t->cols, rows, cols);
    return 0;
}

static int own(skv_model *m, void *p) {
    void **n = realloc(m->owned, sizeof(void *) * (m->n_owned + 1));
    if (!n) { free(p); return skv_error(SKV_ENOMEM, "out of memory"); }
    m->owned = n;
    m->owned[m->n_owned++] = p;
    return 0;
}

/* Converts a 1-D tensor (norm or bias) to an owned f32 copy. */
static int to_f32(skv_model *m, skv_tensor *t) {
    if (!t->data || t->type == GGML_F32) return 0;
    size_t n = (size_t)t->rows * t->cols;
    float *d = skv_aligned_alloc(sizeof(float) * n);
    if (!d) return skv_error(SKV_ENOMEM, "out of memory");
    quant_dequant_row(t->type, t->data, d, n);
    int rc = own(m, d);
    if (rc) return rc;
    t->data = d;
    t->type = GGML_F32;
    return 0;
}

void model_free(skv_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    if (m->tok) tok_free(m->tok);
    if (m->gguf) gguf_close(m->gguf);
    if (m->st) st_close(m->st);
    free(m->path);
    free(m);
}

size_t model_weight_bytes(const skv_model *m) {
    const skv_tensor *all[3] = {&m->tok_embd, &m->out_norm, &m->output};
    size_t b = 0;
    for (int i = 0; i < 3; i++)
        if (i < 2 || m->output.data != m->tok_embd.data)
            b += ggml_row_size(all[i]->type, all[i]->cols) * all[i]->rows;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const skv_tensor *t = &m->layers[l].attn_norm;
        for (int j = 0; j < (int)(sizeof(model_layer) / sizeof(skv_tensor)); j++)
            if (t[j].data) b += ggml_row_size(t[j].type, t[j].cols) * t[j].rows;
    }
    return b;
}

/* ---- GGUF ---- */

static int gguf_tensor_get(const gguf_file *g, const char *name, skv_tensor *t, int required) {
    const gguf_tensor *gt = gguf_find_tensor(g, name);
    memset(t, 0, sizeof *t);
    if (!gt) return required ? skv_error(SKV_EMISSING, "%s: tensor '%s' is missing", g->path, name) : 0;
    if (gt->n_dims > 2 || gt->ne[0] > INT32_MAX || gt->ne[1] > INT32_MAX)
        return skv_error(SKV_EFORMAT, "%s: tensor '%s' has %u dims, expected 1 or 2", g->path, name, gt->n_dims);
    t->type = gt->type;
    t->cols = (int)gt->ne[0];
    t->rows = (int)gt->ne[1];
    t->data = gt->data;
    return 0;
}

static int get_u32_key(const gguf_file *g, const char *arch, const char *suffix, int *out, int required) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    int rc = gguf_get_u32(g, key, &v);
    if (rc == SKV_EMISSING)
        return required ? skv_error(SKV_EMISSING, "%s: metadata key '%s' is missing", g->path, key) : 0;
    if (rc) return rc;
    if (v > INT32_MAX) return skv_error(SKV_EFORMAT, "%s: metadata '%s' = %u is out of range", g->path, key, v);
    *out = (int)v;
    return 0;
}

static int get_f32_key(const gguf_file *g, const char *arch, const char *suffix, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(g, key, out);
    return rc == SKV_EMISSING ? 0 : rc;
}

static int load_gguf(const char *path, skv_model *m) {
    int rc = gguf_open(path, &m->gguf);
    if (rc) return rc;
    const gguf_file *g = m->gguf;
    model_config *c = &m->cfg;
    const char *arch = gguf_get_str(g, "general.architecture");
    if (!arch) return skv_error(SKV_EFORMAT, "%s: metadata 'general.architecture' is missing", path);
    if (strcmp(arch, "llama") && strcmp(arch, "mistral") && strcmp(arch, "qwen2"))
        return skv_error(SKV_EUNSUPPORTED, "%s: architecture '%s' is not supported (llama, mistral, qwen2)", path, arch);
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    const char *name = gguf_get_str(g, "general.name");
    snprintf(c->name, sizeof c->name, "%s", name ? name : "");
    strcpy(m->format, "gguf");
    int rw = 0;
    if (gguf_get_bool(g, "skv.synth.random_weights", &rw) == 0) m->random_weights = rw;
    if ((rc = get_u32_key(g, arch, "block_count", &c->n_layers, 1)) ||
        (rc = get_u32_key(g, arch, "embedding_length", &c->dim, 1)) ||
        (rc = get_u32_key(g, arch, "feed_forward_length", &c->ffn_dim, 1)) ||
        (rc = get_u32_key(g, arch, "attention.head_count", &c->n_heads, 1)) ||
        (rc = get_u32_key(g, arch, "attention.head_count_kv", &c->n_kv_heads, 0)) ||
        (rc = get_u32_key(g, arch, "attention.key_length", &c->head_dim, 0)) ||
        (rc = get_u32_key(g, arch, "rope.dimension_count", &c->rope_dim, 0)) ||
        (rc = get_u32_key(g, arch, "context_length", &c->ctx_train, 0)) ||
        (rc = get_f32_key(g, arch, "attention.layer_norm_rms_epsilon", &c->norm_eps)) ||
        (rc = get_f32_key(g, arch, "rope.freq_base", &c->rope_theta)))
        return rc;
    c->rope_mode = strcmp(arch, "qwen2") == 0 ? ROPE_NEOX : ROPE_ADJACENT;
    c->qkv_bias = strcmp(arch, "qwen2") == 0;

    skv_tensor t;
    if ((rc = gguf_tensor_get(g, "token_embd.weight", &m->tok_embd, 1))) return rc;
    c->vocab = m->tok_embd.rows;
    if ((rc = model_config_check(c, path))) return rc;
    if ((rc = gguf_tensor_get(g, "output_norm.weight", &m->out_norm, 1))) return rc;
    if ((rc = gguf_tensor_get(g, "output.weight", &t, 0))) return rc;
    c->tied_embd = t.data == NULL;
    m->output = t.data ? t : m->tok_embd;

    m->layers = calloc(c->n_layers, sizeof *m->layers);
    if (!m->layers) return skv_error(SKV_ENOMEM, "out of memory");
    static const struct { const char *suffix; size_t off; int required; } names[] = {
        {"attn_norm.weight", offsetof(model_layer, attn_norm), 1},
        {"attn_q.weight", offsetof(model_layer, wq), 1},
        {"attn_k.weight", offsetof(model_layer, wk), 1},
        {"attn_v.weight", offsetof(model_layer, wv), 1},
        {"attn_output.weight", offsetof(model_layer, wo), 1},
        {"attn_q.bias", offsetof(model_layer, bq), 0},
        {"attn_k.bias", offsetof(model_layer, bk), 0},
        {"attn_v.bias", offsetof(model_layer, bv), 0},
        {"ffn_norm.weight", offsetof(model_layer, ffn_norm), 1},
        {"ffn_gate.weight", offsetof(model_layer, w_gate), 1},
        {"ffn_up.weight", offsetof(model_layer, w_up), 1},
        {"ffn_down.weight", offsetof(model_layer, w_down), 1},
    };
    for (int l = 0; l < c->n_layers; l++)
        for (size_t j = 0; j < sizeof names / sizeof names[0]; j++) {
            char nm[96];
            snprintf(nm, sizeof nm, "blk.%d.%s", l, names[j].suffix);
            if ((rc = gguf_tensor_get(g, nm, (skv_tensor *)((char *)&m->layers[l] + names[j].off), names[j].required)))
                return rc;
        }
    return tok_load_gguf(g, &m->tok);
}

/* ---- HF directory ---- */

static int hf_tensor(skv_model *m, const char *name, skv_tensor *t, int required, const char *dir) {
    const st_tensor *s = st_find(m->st, name);
    memset(t, 0, sizeof *t);
    if (!s) return required ? skv_error(SKV_EMISSING, "%s: tensor '%s' is missing", dir, name) : 0;
    if (s->n_dims < 1 || s->n_dims > 2)
        return skv_error(SKV_EFORMAT, "%s: tensor '%s' has %d dims, expected 1 or 2", s->file, name, s->n_dims);
    t->type = s->type;
    t->rows = s->n_dims == 2 ? (int)s->shape[0] : 1;
    t->cols = (int)s->shape[s->n_dims - 1];
    t->data = s->data;
    return 0;
}

static int load_hf(const char *dir, skv_model *m) {
    model_config *c = &m->cfg;
    int rc = hf_load_config(dir, c);
    if (rc) return rc;
    strcpy(m->format, "hf");
    if ((rc = model_config_check(c, dir))) return rc;
    if ((rc = st_open_dir(dir, (st_set **)&m->st))) return rc;
    if ((rc = hf_tensor(m, "model.embed_tokens.weight", &m->tok_embd, 1, dir)) ||
        (rc = hf_tensor(m, "model.norm.weight", &m->out_norm, 1, dir)))
        return rc;
    skv_tensor t;
    if ((rc = hf_tensor(m, "lm_head.weight", &t, 0, dir))) return rc;
    if (!t.data && !c->tied_embd)
        return skv_error(SKV_EMISSING, "%s: tensor 'lm_head.weight' is missing and embeddings are not tied", dir);
    m->output = t.data ? t : m->tok_embd;
    m->layers = calloc(c->n_layers, sizeof *m->layers);
    if (!m->layers) return skv_error(SKV_ENOMEM, "out of memory");
    static const struct { const char *suffix; size_t off; int required; } names[] = {
        {"input_layernorm.weight", offsetof(model_layer, attn_norm), 1},
        {"self_attn.q_proj.weight", offsetof(model_layer, wq), 1},
        {"self_attn.k_proj.weight", offsetof(model_layer, wk), 1},
        {"self_attn.v_proj.weight", offsetof(model_layer, wv), 1},
        {"self_attn.o_proj.weight", offsetof(model_layer, wo), 1},
        {"self_attn.q_proj.bias", offsetof(model_layer, bq), 0},
        {"self_attn.k_proj.bias", offsetof(model_layer, bk), 0},
        {"self_attn.v_proj.bias", offsetof(model_layer, bv), 0},
        {"post_attention_layernorm.weight", offsetof(model_layer, ffn_norm), 1},
        {"mlp.gate_proj.weight", offsetof(model_layer, w_gate), 1},
        {"mlp.up_proj.weight", offsetof(model_layer, w_up), 1},
        {"mlp.down_proj.weight", offsetof(model_layer, w_down), 1},
    };
    for (int l = 0; l < c->n_layers; l++)
        for (size_t j = 0; j < sizeof names / sizeof names[0]; j++) {
            char nm[128];
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, names[j].suffix);
            if ((rc = hf_tensor(m, nm, (skv_tensor *)((char *)&m->layers[l] + names[j].off), names[j].required, dir)))
                return rc;
        }
    char tp[4096];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", dir);
    return tok_load_hf(tp, &m->tok);
}

/* Checks shapes of every tensor against the config and converts norms and
 * biases to f32. */
static int check_all(skv_model *m) {
    const model_config *c = &m->cfg;
    const char *src = m->path;
    int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    int rc;
    if ((rc = model_check_tensor(&m->tok_embd, "token embedding", c->vocab, c->dim, src)) ||
        (rc = model_check_tensor(&m->out_norm, "output norm", 1, c->dim, src)) ||
        (rc = model_check_tensor(&m->output, "output", c->vocab, c->dim, src)) ||
        (rc = to_f32(m, &m->out_norm)))
        return rc;
    for (int l = 0; l < c->n_layers; l++) {
        model_layer *L = &m->layers[l];
        char nm[64];
#define CHK(field, r, cl) \
        snprintf(nm, sizeof nm, "layer %d " #field, l); \
        if ((rc = model_check_tensor(&L->field, nm, r, cl, src))) return rc;
        CHK(attn_norm, 1, c->dim) CHK(ffn_norm, 1, c->dim)
        CHK(wq, qd, c->dim) CHK(wk, kvd, c->dim) CHK(wv, kvd, c->dim) CHK(wo, c->dim, qd)
        CHK(w_gate, c->ffn_dim, c->dim) CHK(w_up, c->ffn_dim, c->dim) CHK(w_down, c->dim, c->ffn_dim)
        if (L->bq.data || L->bk.data || L->bv.data) {
            CHK(bq, 1, qd) CHK(bk, 1, kvd) CHK(bv, 1, kvd)
        } else if (c->qkv_bias) {
            return skv_error(SKV_EMISSING, "%s: layer %d: %s needs q/k/v biases, none found", src, l, c->arch);
        }
#undef CHK
        if ((rc = to_f32(m, &L->attn_norm)) || (rc = to_f32(m, &L->ffn_norm)) || (rc = to_f32(m, &L->bq)) ||
            (rc = to_f32(m, &L->bk)) || (rc = to_f32(m, &L->bv)))
            return rc;
    }
    if (tok_n_vocab(m->tok) > c->vocab)
        return skv_error(SKV_EFORMAT, "%s: tokenizer has %d tokens but the embedding only %d rows", src,
                         tok_n_vocab(m->tok), c->vocab);
    c = &m->cfg;
    m->cfg.bos = tok_bos(m->tok);
    m->cfg.eos = tok_eos(m->tok);
    return 0;
}

int model_load(const char *path, skv_model **out) {
    *out = NULL;
    skv_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) { free(m); return skv_error(SKV_ENOMEM, "out of memory"); }
    struct stat st;
    int rc;
    if (stat(path, &st) != 0) rc = skv_error(SKV_EIO, "%s: no such file or directory", path);
    else if (S_ISDIR(st.st_mode)) rc = load_hf(path, m);
    else rc = load_gguf(path, m);
    if (!rc) rc = check_all(m);
    if (rc) { model_free(m); return rc; }
    *out = m;
    return 0;
}
