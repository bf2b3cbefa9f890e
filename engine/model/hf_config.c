/* hf_config.c: config.json (transformers' LlamaConfig, MistralConfig,
 * Qwen2Config) to model_config.
 *
 * Every field is read through one of a few typed getters that tell "absent or
 * null" (take the default, or fail if required) from "present with the wrong
 * JSON type" (always SKV_EFORMAT naming the field). Defaults are the ones
 * transformers uses for the model type, so a config that omits a field means
 * here what it means there. cJSON stays inside this file. */
#include "hf_config.h"
#include "skv.h"

#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HF_MAX_CONFIG (16u << 20)

typedef struct {
    const char *path;  /* the config.json file, for messages */
    const cJSON *obj;  /* the object fields are read from */
    const char *pre;   /* field-name prefix for nested objects ("rope_scaling.") */
} hf_ctx;

static const char *json_kind(const cJSON *j) {
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "an unknown value";
}

/* The field, or NULL when it is absent or null. */
static const cJSON *field(const hf_ctx *c, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->obj, key);
    return cJSON_IsNull(j) ? NULL : j;
}

static int want_int(const hf_ctx *c, const char *key, const cJSON *j, int *out) {
    double v = j->valuedouble;
    if (!cJSON_IsNumber(j) || !isfinite(v) || v != floor(v) || v < INT_MIN || v > INT_MAX)
        return skv_error(SKV_EFORMAT, "%s: field '%s%s': expected an integer, got %s", c->path, c->pre, key,
                         cJSON_IsNumber(j) ? "a non-integer or out-of-range number" : json_kind(j));
    *out = (int)v;
    return 0;
}

/* Reads an integer field >= min; absent or null gives def, or an error when required. */
static int get_int(const hf_ctx *c, const char *key, int required, int def, int min, int *out) {
    const cJSON *j = field(c, key);
    if (!j) {
        if (required)
            return skv_error(SKV_EFORMAT, "%s: field '%s%s' is missing (expected an integer)", c->path, c->pre, key);
        *out = def;
        return 0;
    }
    int rc = want_int(c, key, j, out);
    if (!rc && *out < min)
        return skv_error(SKV_EFORMAT, "%s: field '%s%s' is %d, expected at least %d", c->path, c->pre, key, *out,
                         min);
    return rc;
}

/* Reads a finite number field > 0; absent or null gives def, or an error when required. */
static int get_pos(const hf_ctx *c, const char *key, int required, double def, float *out) {
    const cJSON *j = field(c, key);
    if (!j) {
        if (required)
            return skv_error(SKV_EFORMAT, "%s: field '%s%s' is missing (expected a number)", c->path, c->pre, key);
        *out = (float)def;
        return 0;
    }
    if (!cJSON_IsNumber(j))
        return skv_error(SKV_EFORMAT, "%s: field '%s%s': expected a number, got %s", c->path, c->pre, key,
                         json_kind(j));
    if (!isfinite(j->valuedouble) || j->valuedouble <= 0)
        return skv_error(SKV_EFORMAT, "%s: field '%s%s' is %g, expected a positive number", c->path, c->pre, key,
                         j->valuedouble);
    *out = (float)j->valuedouble;
    return 0;
}

static int get_bool(const hf_ctx *c, const char *key, int def, int *out) {
    const cJSON *j = field(c, key);
    if (!j) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(j))
        return skv_error(SKV_EFORMAT, "%s: field '%s%s': expected true or false, got %s", c->path, c->pre, key,
                         json_kind(j));
    *out = cJSON_IsTrue(j);
    return 0;
}

/* A string field, NULL when absent or null; *rc set on a wrong type. */
static const char *get_str(const hf_ctx *c, const char *key, int *rc) {
    const cJSON *j = field(c, key);
    if (!j) return NULL;
    if (!cJSON_IsString(j)) {
        *rc = skv_error(SKV_EFORMAT, "%s: field '%s%s': expected a string, got %s", c->path, c->pre, key,
                        json_kind(j));
        return NULL;
    }
    return j->valuestring;
}

/* Copies src into dst[cap], cutting it short if needed. */
static void copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* The supported model_type for a transformers class name, or NULL. */
static const char *type_of_class(const char *cls) {
    if (!strcmp(cls, "LlamaForCausalLM")) return "llama";
    if (!strcmp(cls, "MistralForCausalLM")) return "mistral";
    if (!strcmp(cls, "Qwen2ForCausalLM")) return "qwen2";
    return NULL;
}

/* Picks model_type, or the type of architectures[0] when model_type is absent. */
static int read_arch(const hf_ctx *c, model_config *cfg) {
    int rc = 0;
    const char *mt = get_str(c, "model_type", &rc);
    if (rc) return rc;
    if (!mt) {
        const cJSON *a = field(c, "architectures");
        if (!a)
            return skv_error(SKV_EFORMAT, "%s: field 'model_type' is missing (and no 'architectures')", c->path);
        if (!cJSON_IsArray(a) || !cJSON_IsString(a->child))
            return skv_error(SKV_EFORMAT, "%s: field 'architectures': expected an array of strings", c->path);
        mt = type_of_class(a->child->valuestring);
        if (!mt)
            return skv_error(SKV_EUNSUPPORTED, "%s: field 'architectures': '%s' is not supported (expected "
                             "LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM)", c->path,
                             a->child->valuestring);
    }
    if (strcmp(mt, "llama") && strcmp(mt, "mistral") && strcmp(mt, "qwen2"))
        return skv_error(SKV_EUNSUPPORTED, "%s: field 'model_type': '%s' is not supported (expected llama, mistral "
                         "or qwen2)", c->path, mt);
    copy_str(cfg->arch, sizeof cfg->arch, mt);
    return 0;
}

/* rope_scaling: null, {"rope_type"|"type": "default"} or the llama3 scheme. */
static int read_rope_scaling(const hf_ctx *c, model_config *cfg) {
    const cJSON *rs = field(c, "rope_scaling");
    cfg->rope_factor = 1.0f;
    if (!rs) return 0;
    if (!cJSON_IsObject(rs))
        return skv_error(SKV_EFORMAT, "%s: field 'rope_scaling': expected null or an object, got %s", c->path,
                         json_kind(rs));
    hf_ctx sub = {c->path, rs, "rope_scaling."};
    int rc = 0;
    const char *type = get_str(&sub, "rope_type", &rc);
    if (!rc && !type) type = get_str(&sub, "type", &rc);
    if (rc) return rc;
    if (!type) return skv_error(SKV_EFORMAT, "%s: field 'rope_scaling.rope_type' is missing", c->path);
    if (!strcmp(type, "default")) return 0;
    if (strcmp(type, "llama3"))
        return skv_error(SKV_EUNSUPPORTED, "%s: field 'rope_scaling': type '%s' is not supported (expected null "
                         "or llama3)", c->path, type);
    cfg->rope_llama3 = 1;
    if ((rc = get_pos(&sub, "factor", 1, 0, &cfg->rope_factor)) ||
        (rc = get_pos(&sub, "low_freq_factor", 1, 0, &cfg->rope_low_freq)) ||
        (rc = get_pos(&sub, "high_freq_factor", 1, 0, &cfg->rope_high_freq)) ||
        (rc = get_int(&sub, "original_max_position_embeddings", 1, 0, 1, &cfg->rope_orig_ctx)))
        return rc;
    if (cfg->rope_high_freq <= cfg->rope_low_freq)
        return skv_error(SKV_EFORMAT, "%s: field 'rope_scaling.high_freq_factor' (%g) must exceed low_freq_factor "
                         "(%g)", c->path, cfg->rope_high_freq, cfg->rope_low_freq);
    return 0;
}

/* bos/eos ids: an integer, null, or (eos) a list of integers. */
static int read_tokens(const hf_ctx *c, model_config *cfg, hf_extra *x) {
    int rc = get_int(c, "bos_token_id", 0, -1, 0, &cfg->bos);
    if (rc) return rc;
    cfg->eos = -1;
    const cJSON *e = field(c, "eos_token_id");
    if (!e) return 0;
    if (!cJSON_IsArray(e)) {
        if ((rc = get_int(c, "eos_token_id", 1, -1, 0, &cfg->eos))) return rc;
        x->eos[x->n_eos++] = cfg->eos;
        return 0;
    }
    int i = 0;
    for (const cJSON *v = e->child; v; v = v->next, i++) {
        int id;
        if (!cJSON_IsNumber(v) || want_int(c, "eos_token_id", v, &id) || id < 0)
            return skv_error(SKV_EFORMAT, "%s: field 'eos_token_id[%d]': expected a non-negative integer, got %s",
                             c->path, i, json_kind(v));
        if (x->n_eos < HF_MAX_EOS) x->eos[x->n_eos++] = id;
    }
    if (x->n_eos) cfg->eos = x->eos[0];
    return 0;
}

/* Refuses configs whose math skv's forward pass does not implement. */
static int check_supported(const hf_ctx *c, const model_config *cfg) {
    int rc = 0, flag = 0;
    const char *act = get_str(c, "hidden_act", &rc);
    if (rc) return rc;
    if (act && strcmp(act, "silu"))
        return skv_error(SKV_EUNSUPPORTED, "%s: field 'hidden_act': '%s' is not supported (expected silu)", c->path,
                         act);
    if ((rc = get_bool(c, "mlp_bias", 0, &flag))) return rc;
    if (flag) return skv_error(SKV_EUNSUPPORTED, "%s: field 'mlp_bias': true is not supported", c->path);
    if (strcmp(cfg->arch, "qwen2")) {
        /* llama/mistral attention_bias also puts a bias on o_proj, which skv has no slot for */
        if ((rc = get_bool(c, "attention_bias", 0, &flag))) return rc;
        if (flag)
            return skv_error(SKV_EUNSUPPORTED, "%s: field 'attention_bias': true is not supported for %s (o_proj "
                             "bias)", c->path, cfg->arch);
    }
    const cJSON *prf = field(c, "partial_rotary_factor");
    if (prf && (!cJSON_IsNumber(prf) || prf->valuedouble != 1.0))
        return skv_error(SKV_EUNSUPPORTED, "%s: field 'partial_rotary_factor': only 1.0 is supported", c->path);
    return 0;
}

/* Caps ctx_train at a sliding window: skv attends to all positions, which
 * matches the model only while the context fits in the window. */
static int read_window(const hf_ctx *c, model_config *cfg) {
    int on = 1, win = 0, rc;
    if (!strcmp(cfg->arch, "llama")) return 0;
    if (!strcmp(cfg->arch, "qwen2") && (rc = get_bool(c, "use_sliding_window", 0, &on))) return rc;
    if ((rc = get_int(c, "sliding_window", 0, 0, 1, &win))) return rc;
    if (on && win && win < cfg->ctx_train) cfg->ctx_train = win;
    return 0;
}

/* The fallback model name: the directory of a config.json, else the file stem. */
static void name_from_path(const char *file, char *out, size_t cap) {
    const char *slash = strrchr(file, '/');
    const char *base = slash ? slash + 1 : file;
    if (strcmp(base, "config.json")) {
        size_t n = strlen(base);
        if (n > 12 && !strcmp(base + n - 12, ".config.json")) n -= 12;
        else if (n > 5 && !strcmp(base + n - 5, ".json")) n -= 5;
        snprintf(out, cap, "%.*s", (int)n, base);
        return;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - file) : 1, slash ? file : ".");
    if (!dir[0]) copy_str(dir, sizeof dir, "/");
    char *real = realpath(dir, NULL);
    const char *d = real ? real : dir;
    const char *s = strrchr(d, '/');
    copy_str(out, cap, s && s[1] ? s + 1 : d);
    free(real);
}

/* Fills cfg and x from the parsed root object. */
static int read_config(const hf_ctx *c, model_config *cfg, hf_extra *x) {
    int rc;
    if ((rc = read_arch(c, cfg))) return rc;
    int qwen = !strcmp(cfg->arch, "qwen2");
    int ctx_def = qwen ? 32768 : !strcmp(cfg->arch, "mistral") ? 4096 * 32 : 2048;
    if ((rc = get_int(c, "hidden_size", 1, 0, 1, &cfg->dim)) ||
        (rc = get_int(c, "intermediate_size", 1, 0, 1, &cfg->ffn_dim)) ||
        (rc = get_int(c, "num_hidden_layers", 1, 0, 1, &cfg->n_layers)) ||
        (rc = get_int(c, "num_attention_heads", 1, 0, 1, &cfg->n_heads)) ||
        (rc = get_int(c, "num_key_value_heads", 0, cfg->n_heads, 1, &cfg->n_kv_heads)) ||
        (rc = get_int(c, "head_dim", 0, 0, 1, &cfg->head_dim)) ||
        (rc = get_int(c, "vocab_size", 1, 0, 1, &cfg->vocab)) ||
        (rc = get_int(c, "max_position_embeddings", 0, ctx_def, 1, &cfg->ctx_train)) ||
        (rc = get_pos(c, "rms_norm_eps", 0, 1e-6, &cfg->norm_eps)) ||
        (rc = get_pos(c, "rope_theta", 0, 10000.0, &cfg->rope_theta)) ||
        (rc = get_bool(c, "tie_word_embeddings", 0, &cfg->tied_embd)) ||
        (rc = read_rope_scaling(c, cfg)) || (rc = read_tokens(c, cfg, x)) || (rc = check_supported(c, cfg)) ||
        (rc = read_window(c, cfg)))
        return rc;
    if (!cfg->head_dim) {
        if (cfg->dim % cfg->n_heads)
            return skv_error(SKV_EFORMAT, "%s: field 'hidden_size' (%d) is not a multiple of num_attention_heads "
                             "(%d) and head_dim is absent", c->path, cfg->dim, cfg->n_heads);
        cfg->head_dim = cfg->dim / cfg->n_heads;
    }
    if (cfg->n_heads % cfg->n_kv_heads)
        return skv_error(SKV_EFORMAT, "%s: field 'num_key_value_heads' (%d) does not divide num_attention_heads "
                         "(%d)", c->path, cfg->n_kv_heads, cfg->n_heads);
    cfg->rope_mode = ROPE_NEOX;
    cfg->rope_dim = cfg->head_dim;
    cfg->qkv_bias = qwen;

    const char *s = get_str(c, "_name_or_path", &rc);
    if (rc) return rc;
    if (s && s[0]) copy_str(cfg->name, sizeof cfg->name, s);
    else name_from_path(c->path, cfg->name, sizeof cfg->name);
    const char *dt = get_str(c, "torch_dtype", &rc);
    if (!rc && !dt) dt = get_str(c, "dtype", &rc);
    if (rc) return rc;
    if (dt) copy_str(x->torch_dtype, sizeof x->torch_dtype, dt);
    return 0;
}

int hf_load_config_ex(const char *path, model_config *cfg, hf_extra *extra) {
    hf_extra scratch = {0};
    hf_extra *x = extra ? extra : &scratch;
    memset(cfg, 0, sizeof *cfg);
    memset(x, 0, sizeof *x);

    struct stat st;
    if (stat(path, &st) != 0)
        return skv_error(errno == ENOENT ? SKV_EMISSING : SKV_EIO, "%s: %s", path, strerror(errno));
    char file[4096];
    if (strlen(path) + sizeof "/config.json" > sizeof file)
        return skv_error(SKV_EINVAL, "%.200s...: path too long", path);
    if (S_ISDIR(st.st_mode)) {
        size_t n = strlen(path);
        snprintf(file, sizeof file, "%s%sconfig.json", path, n && path[n - 1] == '/' ? "" : "/");
    } else {
        copy_str(file, sizeof file, path);
    }

    char *text;
    size_t len;
    int rc = skv_read_file(file, HF_MAX_CONFIG, &text, &len);
    if (rc) return rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    long at = end ? (long)(end - text) : -1;
    while (root && at >= 0 && (size_t)at < len && strchr(" \t\r\n", text[at])) at++;
    int trailing = root && at >= 0 && (size_t)at < len;
    free(text);
    if (!root) return skv_error(SKV_EFORMAT, "%s: not valid JSON (error near byte %ld)", file, at);
    if (trailing) {
        cJSON_Delete(root);
        return skv_error(SKV_EFORMAT, "%s: text after the JSON object (at byte %ld)", file, at);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return skv_error(SKV_EFORMAT, "%s: expected a JSON object at the top level", file);
    }
    hf_ctx c = {file, root, ""};
    rc = read_config(&c, cfg, x);
    cJSON_Delete(root);
    if (rc) {
        memset(cfg, 0, sizeof *cfg);
        memset(x, 0, sizeof *x);
    }
    return rc;
}

int hf_load_config(const char *path, model_config *cfg) { return hf_load_config_ex(path, cfg, NULL); }
