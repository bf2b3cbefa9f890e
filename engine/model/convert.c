/* convert.c: a loaded skv_model written back out as a llama.cpp GGUF
 * (`skv convert`); see convert.h for what is written and what is refused.
 *
 * Tensors are streamed through gguf_writer's fill callback one row at a
 * time: each output row is found in the source (through the RoPE row
 * permutation when there is one), dequantized to f32 and stored in the
 * output type, so memory stays at one row of scratch whatever the model's
 * size. The tokenizer is written from the tok_vocab's internals
 * (tok_impl.h), the mirror of what tok.c's GGUF loader reads. */
#include "convert.h"
#include "gguf_write.h"
#include "quant.h"
#include "skv.h"
#include "tok_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char name[64];
    skv_tensor src;        /* rows, cols, type and data of the source */
    enum ggml_type type;   /* output type */
    int perm_hd;           /* > 0: permute rows (2-D) or elements (1-D) within heads of this size */
} conv_tensor;

typedef struct {
    conv_tensor *t;        /* (n) in file order */
    int n, cap;
    float *row, *tmp;      /* (max cols) scratch */
    float *rope_freqs;     /* (rope_dim/2) computed llama3 divisors, or NULL */
    const char *path;      /* output, for messages */
    int fill_rc;           /* the fill callback's error, reported as is (not wrapped by the writer) */
    char fill_msg[512];
} conv_ctx;

static int is_matrix_type_ok(enum ggml_type t) { return t == GGML_F32 || t == GGML_F16; }

enum ggml_type convert_default_type(const skv_model *m) {
    const skv_tensor *all[2] = {&m->tok_embd, &m->output};
    for (int i = 0; i < 2; i++)
        if (all[i]->type != GGML_F16) return GGML_F32;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const model_layer *L = &m->layers[l];
        const skv_tensor *mats[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int j = 0; j < 7; j++)
            if (mats[j]->type != GGML_F16) return GGML_F32;
    }
    return GGML_F16;
}

/* Source index of row (or element) r of a head-permuted tensor: adjacent
 * pair (2i, 2i+1) of a head takes rotate-half rows i and d/2 + i. */
static int perm_src(int r, int hd) {
    int h = r / hd, j = r % hd;
    return h * hd + (j & 1 ? hd / 2 + j / 2 : j / 2);
}

/* Checks that f16 can hold every value of x (infinities and NaNs stay what they are). */
static int check_f16_range(const conv_ctx *c, const conv_tensor *t, int r, const float *x, int n) {
    for (int i = 0; i < n; i++)
        if (isfinite(x[i]) && fabsf(x[i]) >= 65520.0f)
            return skv_error(SKV_ERANGE, "%s: tensor '%s' row %d holds %g, beyond f16's range (write f32 instead)",
                             c->path, t->name, r, (double)x[i]);
    return 0;
}

static int fill(void *user, int idx, uint64_t offset, void *dst, size_t nbytes) {
    conv_ctx *c = user;
    const conv_tensor *t = &c->t[idx];
    const skv_tensor *s = &t->src;
    size_t orb = ggml_row_size(t->type, (uint64_t)s->cols), srb = ggml_row_size(s->type, (uint64_t)s->cols);
    SKV_ASSERT(orb && srb && offset % orb == 0 && nbytes % orb == 0);
    int r0 = (int)(offset / orb), r1 = (int)((offset + nbytes) / orb);
    for (int r = r0; r < r1; r++) {
        uint8_t *out = (uint8_t *)dst + (size_t)(r - r0) * orb;
        int sr = t->perm_hd && s->rows > 1 ? perm_src(r, t->perm_hd) : r;
        const uint8_t *in = (const uint8_t *)s->data + (size_t)sr * srb;
        if (s->type == t->type && !(t->perm_hd && s->rows == 1)) {
            memcpy(out, in, orb);
            continue;
        }
        quant_dequant_row(s->type, in, c->row, (size_t)s->cols);
        const float *x = c->row;
        if (t->perm_hd && s->rows == 1) { /* a 1-D bias: permute its elements */
            for (int j = 0; j < s->cols; j++) c->tmp[j] = c->row[perm_src(j, t->perm_hd)];
            x = c->tmp;
        }
        int rc = t->type == GGML_F16 ? check_f16_range(c, t, r, x, s->cols) : 0;
        if (!rc) rc = quant_quantize_row(t->type, x, out, (size_t)s->cols);
        if (rc) {
            c->fill_rc = rc;
            snprintf(c->fill_msg, sizeof c->fill_msg, "%s", skv_last_error());
            return rc;
        }
    }
    return 0;
}

static int add(conv_ctx *c, const char *name, const skv_tensor *src, enum ggml_type type, int perm_hd) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        conv_tensor *n = realloc(c->t, (size_t)cap * sizeof *n);
        if (!n) return skv_error(SKV_ENOMEM, "out of memory");
        c->t = n;
        c->cap = cap;
    }
    conv_tensor *t = &c->t[c->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->src = *src;
    t->type = src->rows == 1 ? GGML_F32 : type; /* 1-D tensors stay f32, as llama.cpp keeps them */
    t->perm_hd = perm_hd;
    return 0;
}

/* The tensor list, in the order llama.cpp's converter writes a llama model. */
static int plan_tensors(conv_ctx *c, const skv_model *m, enum ggml_type type, int perm) {
    const model_config *cfg = &m->cfg;
    int rc = add(c, "token_embd.weight", &m->tok_embd, type, 0);
    if (rc) return rc;
    const gguf_tensor *rf = m->gguf ? gguf_find_tensor(m->gguf, "rope_freqs.weight") : NULL;
    if (rf) {
        if (rf->n_dims != 1 || rf->ne[0] != (uint64_t)cfg->rope_dim / 2 || !quant_supported(rf->type))
            return skv_error(SKV_EFORMAT, "%s: tensor 'rope_freqs.weight' is not %d %s values", m->path,
                             cfg->rope_dim / 2, "float");
        skv_tensor t = {rf->type, 1, (int)rf->ne[0], rf->data};
        if ((rc = add(c, "rope_freqs.weight", &t, GGML_F32, 0))) return rc;
    } else if (cfg->rope_llama3) {
        int half = cfg->rope_dim / 2;
        if (!(c->rope_freqs = malloc(sizeof(float) * half))) return skv_error(SKV_ENOMEM, "out of memory");
        rope_params rp = model_rope_params(cfg);
        for (int i = 0; i < half; i++) c->rope_freqs[i] = (float)rope_llama3_divisor(&rp, i);
        skv_tensor t = {GGML_F32, 1, half, c->rope_freqs};
        if ((rc = add(c, "rope_freqs.weight", &t, GGML_F32, 0))) return rc;
    }
    int hd = perm ? cfg->head_dim : 0;
    for (int l = 0; l < cfg->n_layers && !rc; l++) {
        const model_layer *L = &m->layers[l];
        static const struct { const char *name; size_t off; int perm; } names[] = {
            {"attn_norm.weight", offsetof(model_layer, attn_norm), 0},
            {"attn_q.weight", offsetof(model_layer, wq), 1},
            {"attn_q.bias", offsetof(model_layer, bq), 1},
            {"attn_k.weight", offsetof(model_layer, wk), 1},
            {"attn_k.bias", offsetof(model_layer, bk), 1},
            {"attn_v.weight", offsetof(model_layer, wv), 0},
            {"attn_v.bias", offsetof(model_layer, bv), 0},
            {"attn_output.weight", offsetof(model_layer, wo), 0},
            {"ffn_norm.weight", offsetof(model_layer, ffn_norm), 0},
            {"ffn_gate.weight", offsetof(model_layer, w_gate), 0},
            {"ffn_up.weight", offsetof(model_layer, w_up), 0},
            {"ffn_down.weight", offsetof(model_layer, w_down), 0},
        };
        for (size_t j = 0; j < sizeof names / sizeof names[0] && !rc; j++) {
            const skv_tensor *t = (const skv_tensor *)((const char *)L + names[j].off);
            if (!t->data) continue; /* only the optional biases */
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s", l, names[j].name);
            rc = add(c, nm, t, type, names[j].perm ? hd : 0);
        }
    }
    if (!rc) rc = add(c, "output_norm.weight", &m->out_norm, type, 0);
    if (!rc && m->output.data != m->tok_embd.data) rc = add(c, "output.weight", &m->output, type, 0);
    return rc;
}

/* ---- tokenizer ---- */

typedef struct { int32_t rank; uint64_t key; } merge_ent;

static int by_rank(const void *a, const void *b) {
    const merge_ent *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The merges of v as "left right" strings in rank order; *out and its
 * strings are malloc'd (free with free_strs). */
static int merge_strings(const tok_vocab *v, char ***out, size_t **lens, size_t *n) {
    const tok_pairs *p = &v->merges;
    size_t cap = p->key ? (size_t)p->mask + 1 : 0, k = 0;
    merge_ent *e = malloc((p->n + 1) * sizeof *e);
    *out = calloc(p->n + 1, sizeof **out);
    *lens = calloc(p->n + 1, sizeof **lens);
    *n = 0;
    if (!e || !*out || !*lens) { free(e); return skv_error(SKV_ENOMEM, "out of memory"); }
    for (size_t i = 0; i < cap; i++)
        if (p->key[i] != UINT64_MAX && k < p->n) e[k++] = (merge_ent){p->rank[i], p->key[i]};
    qsort(e, k, sizeof *e, by_rank);
    int rc = 0;
    for (size_t i = 0; i < k && !rc; i++) {
        int32_t l = (int32_t)(e[i].key >> 32), r = (int32_t)(uint32_t)e[i].key;
        uint32_t ll = v->len[l], rl = v->len[r];
        /* the reader splits at the first space after the first byte */
        if (ll == 0 || (ll > 1 && memchr(v->text[l] + 1, ' ', ll - 1)))
            rc = skv_error(SKV_EUNSUPPORTED, "%s: merge '%s' + '%s' has a space inside its left half, which GGUF's "
                           "\"left right\" form cannot hold", v->src, v->text[l], v->text[r]);
        else if (!((*out)[i] = malloc((size_t)ll + rl + 2)))
            rc = skv_error(SKV_ENOMEM, "out of memory");
        else {
            memcpy((*out)[i], v->text[l], ll);
            (*out)[i][ll] = ' ';
            memcpy((*out)[i] + ll + 1, v->text[r], rl);
            (*out)[i][ll + rl + 1] = 0;
            (*lens)[i] = (size_t)ll + rl + 1;
            *n = i + 1;
        }
    }
    free(e);
    return rc;
}

static void free_strs(char **s, size_t n) {
    for (size_t i = 0; s && i < n; i++) free(s[i]);
    free(s);
}

static int set_id(gguf_writer *w, const char *key, int id) {
    return id >= 0 ? gguf_writer_set_u32(w, key, (uint32_t)id) : 0;
}

/* A byte-level BPE vocabulary (from tokenizer.json) as tokenizer.ggml.*
 * metadata with n_out tokens, refusing what the GGUF loader would read
 * differently. */
static int write_tok_bpe(gguf_writer *w, const tok_vocab *v, int n_out) {
    if (v->kind != TOK_BPE || !v->pre)
        return skv_error(SKV_EUNSUPPORTED, "%s: only a byte-level BPE tokenizer can be converted from this source",
                         v->src);
    const char *pre = tok_pre_gguf_name(v->pre);
    if (!pre)
        return skv_error(SKV_EUNSUPPORTED, "%s: pre-tokenizer %s matches no llama.cpp tokenizer.ggml.pre name "
                         "(smollm, gpt2, llama-bpe, qwen2, default), so no GGUF would split text the same way",
                         v->src, v->pre_name);
    if (v->prefix_space)
        return skv_error(SKV_EUNSUPPORTED, "%s: pre_tokenizer ByteLevel add_prefix_space=true has no GGUF "
                         "equivalent", v->src);
    if (v->ignore_merges != tok_pre_ignores_merges(pre))
        return skv_error(SKV_EUNSUPPORTED, "%s: model.ignore_merges=%s, but GGUF readers take %s for "
                         "tokenizer.ggml.pre '%s'", v->src, v->ignore_merges ? "true" : "false",
                         v->ignore_merges ? "false" : "true", pre);
    for (int i = 0; i < v->n_vocab; i++)
        if (v->flags[i] & (TOK_F_LSTRIP | TOK_F_RSTRIP))
            return skv_error(SKV_EUNSUPPORTED, "%s: added token %d ('%s') has lstrip/rstrip, which GGUF cannot "
                             "record", v->src, i, v->text[i]);
    char **toks = calloc((size_t)n_out, sizeof *toks);
    size_t *lens = calloc((size_t)n_out, sizeof *lens);
    int32_t *types = calloc((size_t)n_out, sizeof *types);
    char *pads = malloc((size_t)n_out * 16);
    char **merges = NULL;
    size_t *mlens = NULL, n_merges = 0;
    int rc = toks && lens && types && pads ? 0 : skv_error(SKV_ENOMEM, "out of memory");
    for (int i = 0; i < n_out && !rc; i++) {
        if (i < v->n_vocab && (v->len[i] || v->type[i] != TOK_T_UNUSED)) {
            toks[i] = v->text[i];
            lens[i] = v->len[i];
            types[i] = v->type[i];
        } else { /* a gap in the ids, or embedding rows past the vocabulary */
            char *p = pads + (size_t)i * 16;
            lens[i] = (size_t)snprintf(p, 16, "[PAD%d]", i);
            toks[i] = p;
            types[i] = TOK_T_UNUSED;
        }
    }
    if (!rc) rc = merge_strings(v, &merges, &mlens, &n_merges);
    if (!rc) rc = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (!rc) rc = gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    if (!rc) rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, lens, (size_t)n_out);
    if (!rc) rc = gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (size_t)n_out);
    if (!rc) rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, mlens, n_merges);
    if (!rc) rc = set_id(w, "tokenizer.ggml.bos_token_id", v->bos);
    if (!rc) rc = set_id(w, "tokenizer.ggml.eos_token_id", v->eos);
    if (!rc) rc = set_id(w, "tokenizer.ggml.unknown_token_id", v->unk);
    if (!rc) rc = set_id(w, "tokenizer.ggml.eot_token_id", v->eot);
    if (!rc) rc = set_id(w, "tokenizer.ggml.eom_token_id", v->eom);
    if (!rc) rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos > 0);
    free_strs(merges, n_merges);
    free(mlens);
    free(toks);
    free(lens);
    free(types);
    free(pads);
    return rc;
}

/* ---- metadata ---- */

static int write_meta(gguf_writer *w, const skv_model *m, const char *arch, enum ggml_type type, const char *given) {
    const model_config *c = &m->cfg;
    char key[128];
    const char *name = given && given[0] ? given : c->name;
    if (!name[0]) {
        const char *s = strrchr(m->path, '/');
        name = s && s[1] ? s + 1 : m->path;
    }
    int rc = gguf_writer_set_str(w, "general.architecture", arch);
    if (!rc) rc = gguf_writer_set_str(w, "general.name", name);
#define KEY(sfx) (snprintf(key, sizeof key, "%s." sfx, arch), key)
    if (!rc) rc = gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)c->ctx_train);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)c->dim);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)c->n_layers);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)c->ffn_dim);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)c->rope_dim);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)c->n_heads);
    if (!rc) rc = gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_kv_heads);
    if (!rc) rc = gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->norm_eps);
    if (!rc) rc = gguf_writer_set_f32(w, KEY("rope.freq_base"), c->rope_theta);
    if (!rc && c->head_dim * c->n_heads != c->dim) { /* only when it is not dim / heads, as llama.cpp */
        rc = gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim);
        if (!rc) rc = gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim);
    }
    if (!rc) rc = gguf_writer_set_u32(w, "general.file_type", type == GGML_F16 ? 1 : 0); /* ALL_F32, MOSTLY_F16 */
    if (!rc) rc = gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)c->vocab);
#undef KEY
    if (!rc && m->random_weights) rc = gguf_writer_set_bool(w, "skv.synth.random_weights", 1);
    if (rc) return rc;
    if (m->gguf) { /* the source's own tokenizer metadata, as is */
        for (uint64_t i = 0; i < m->gguf->n_kv && !rc; i++)
            if (!strncmp(m->gguf->kv[i].key, "tokenizer.", 10)) rc = gguf_writer_set_kv(w, &m->gguf->kv[i]);
        return rc;
    }
    return write_tok_bpe(w, m->tok, c->vocab);
}

/* ---- placing the file ---- */

int convert_write_gguf(const skv_model *m, const char *path, const convert_opts *o, convert_info *info) {
    if (info) memset(info, 0, sizeof *info);
    if (!m || !path || !*path || !o) return skv_error(SKV_EINVAL, "convert: no model or output path");
    if (!is_matrix_type_ok(o->type))
        return skv_error(SKV_EINVAL, "convert: output type %s is not offered (f32, f16)", ggml_type_name(o->type));
    struct stat st;
    if (!o->force && lstat(path, &st) == 0)
        return skv_error(SKV_EIO, "%s: file exists; not overwriting it (force to replace)", path);
    const model_config *c = &m->cfg;
    const char *arch;
    if (!strcmp(c->arch, "llama") || !strcmp(c->arch, "mistral")) arch = "llama";
    else if (!strcmp(c->arch, "qwen2")) arch = "qwen2";
    else return skv_error(SKV_EUNSUPPORTED, "%s: architecture '%s' cannot be converted", m->path, c->arch);
    int perm = !strcmp(arch, "llama") && c->rope_mode == ROPE_NEOX;
    if (perm && c->rope_dim != c->head_dim)
        return skv_error(SKV_EUNSUPPORTED, "%s: partial rotate-half RoPE (%d of %d dims) has no adjacent-pair "
                         "llama layout", m->path, c->rope_dim, c->head_dim);
    if (!strcmp(arch, "qwen2") && c->rope_mode != ROPE_NEOX)
        return skv_error(SKV_EUNSUPPORTED, "%s: qwen2 with adjacent-pair RoPE cannot be written (GGUF qwen2 is "
                         "rotate-half)", m->path);
    if (!strcmp(arch, "qwen2") && c->rope_llama3)
        return skv_error(SKV_EUNSUPPORTED, "%s: llama3 rope scaling is written only for llama (rope_freqs), not "
                         "qwen2", m->path);

    conv_ctx cx = {.path = path};
    gguf_writer *w = gguf_writer_new();
    int rc = w ? 0 : skv_error(SKV_ENOMEM, "out of memory");
    if (!rc) rc = plan_tensors(&cx, m, o->type, perm);
    int maxc = 1;
    for (int i = 0; i < cx.n; i++)
        if (cx.t[i].src.cols > maxc) maxc = cx.t[i].src.cols;
    if (!rc && (!(cx.row = malloc(sizeof(float) * maxc)) || !(cx.tmp = malloc(sizeof(float) * maxc))))
        rc = skv_error(SKV_ENOMEM, "out of memory");
    for (int i = 0; i < cx.n && !rc; i++) {
        const skv_tensor *s = &cx.t[i].src;
        uint64_t ne[2] = {(uint64_t)s->cols, (uint64_t)s->rows};
        rc = gguf_writer_add_tensor(w, cx.t[i].name, cx.t[i].type, s->rows == 1 ? 1 : 2, ne);
    }
    if (!rc) rc = write_meta(w, m, arch, o->type, o->name);

    char *tmp = NULL;
    if (!rc) {
        int fd = skv_temp_beside(path, ".convert-", &tmp);
        if (fd < 0) rc = fd;
        else close(fd);
    }
    if (!rc) {
        rc = gguf_writer_write(w, tmp, fill, &cx); /* its own temp file, renamed over ours */
        if (rc && cx.fill_rc) rc = skv_error(cx.fill_rc, "%s", cx.fill_msg);
        if (rc) unlink(tmp);
        else rc = skv_place(tmp, path, o->force);
    }
    if (!rc && info) {
        snprintf(info->arch, sizeof info->arch, "%s", arch);
        info->n_tensors = cx.n;
        info->permuted = perm;
        if (stat(path, &st) == 0) info->bytes = (uint64_t)st.st_size;
    }
    free(tmp);
    gguf_writer_free(w);
    free(cx.t);
    free(cx.row);
    free(cx.tmp);
    free(cx.rope_freqs);
    return rc;
}
