/* tok_hf.c: an HF tokenizer.json (model.type "BPE", byte-level) as a tok_vocab.
 *
 * Reads model.vocab, model.merges ("a b" strings or ["a", "b"] pairs),
 * added_tokens (special ones become control tokens, parsed from text only
 * with parse_special; the others user-defined, always parsed, as llama.cpp's
 * converter marks them), and maps pre_tokenizer (ByteLevel, Digits, Split,
 * Punctuation, alone or in a Sequence) onto tok_pre regexes. BOS, EOS and
 * add_bos come from tokenizer_config.json, config.json and
 * generation_config.json next to the file when present, else from a
 * TemplateProcessing post_processor that starts with a special token.
 * Anything else that would change the ids is refused with a message naming
 * the file and JSON field. The NFC normalizer is accepted and not applied
 * (llama.cpp ignores it too; it changes only text that is not in NFC already).
 * cJSON stays inside this file. */
#include "tok_impl.h"
#include "skv.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_HF_MAX_VOCAB (1 << 22) /* ids past this are refused */

/* Reads a whole file; NULL with *rc set when it cannot (SKV_EMISSING when
 * absent and missing_ok). */
static char *read_file(const char *path, size_t *len, int missing_ok, int *rc) {
    char *buf;
    *rc = skv_read_file(path, (size_t)1 << 30, &buf, len);
    if (*rc == SKV_EMISSING && !missing_ok) *rc = skv_error(SKV_EIO, "%s: cannot open", path);
    return *rc ? NULL : buf;
}

static cJSON *parse_json(const char *path, int missing_ok, int *rc) {
    size_t len;
    char *buf = read_file(path, &len, missing_ok, rc);
    if (!buf) return NULL;
    cJSON *j = cJSON_ParseWithLength(buf, len);
    if (!j) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= buf && at <= buf + len ? (long)(at - buf) : -1;
        *rc = skv_error(SKV_EFORMAT, "%s: not valid JSON (near byte %ld)", path, off);
    }
    free(buf);
    return j;
}

/* A non-negative integer id below 2^30 from a JSON number, or -1. */
static int json_id(const cJSON *x) {
    if (!cJSON_IsNumber(x)) return -1;
    double d = x->valuedouble;
    if (!(d >= 0 && d < (double)(1 << 30)) || d != (double)(int)d) return -1;
    return (int)d;
}

static int is_null(const cJSON *x) { return !x || cJSON_IsNull(x); }

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* Boolean field: 1, 0, or def when absent or null; -1 when another type. */
static int json_bool(const cJSON *o, const char *key, int def) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (is_null(x)) return def;
    if (!cJSON_IsBool(x)) return -1;
    return cJSON_IsTrue(x);
}

/* Checks model fields that would change the ids if set. */
static int check_model(const char *path, const cJSON *m) {
    const char *type = json_str(m, "type");
    if (type && strcmp(type, "BPE") != 0)
        return skv_error(SKV_EUNSUPPORTED, "%s: model.type '%s' is not supported (expected \"BPE\")", path, type);
    if (!type && !cJSON_GetObjectItemCaseSensitive(m, "merges"))
        return skv_error(SKV_EUNSUPPORTED, "%s: model.type is missing and there are no model.merges (expected BPE)", path);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (!is_null(d) && !(cJSON_IsNumber(d) && d->valuedouble == 0))
        return skv_error(SKV_EUNSUPPORTED, "%s: model.dropout is set (expected null)", path);
    static const char *const empty_keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(m, empty_keys[i]);
        if (!is_null(x) && !(cJSON_IsString(x) && !x->valuestring[0]))
            return skv_error(SKV_EUNSUPPORTED, "%s: model.%s is set (expected null)", path, empty_keys[i]);
    }
    if (json_bool(m, "byte_fallback", 0) != 0)
        return skv_error(SKV_EUNSUPPORTED, "%s: model.byte_fallback is not false (expected a byte-level BPE)", path);
    return 0;
}

/* Adds one pre-tokenizer step; i is its index in the Sequence (-1 alone). */
static int add_pre_step(tok_vocab *v, const char *path, const cJSON *p, int i, int last, int *byte_level, char *name,
                        size_t cap) {
    char field[96];
    if (i >= 0) snprintf(field, sizeof field, "%s: pre_tokenizer.pretokenizers[%d]", path, i);
    else snprintf(field, sizeof field, "%s: pre_tokenizer", path);
    const char *type = json_str(p, "type");
    if (!type) return skv_error(SKV_EFORMAT, "%s.type is missing", field);
    if (strcmp(type, "ByteLevel") != 0 && *byte_level)
        return skv_error(SKV_EUNSUPPORTED, "%s: '%s' after ByteLevel is not supported", field, type);
    size_t nl = strlen(name);
    snprintf(name + nl, cap - nl, "%s%s", nl ? "," : "", type);
    int rc = 0;
    if (strcmp(type, "ByteLevel") == 0) {
        int aps = json_bool(p, "add_prefix_space", 1), re = json_bool(p, "use_regex", 1);
        if (aps < 0 || re < 0) return skv_error(SKV_EFORMAT, "%s.add_prefix_space/use_regex is not a bool", field);
        if (!last) return skv_error(SKV_EUNSUPPORTED, "%s: ByteLevel must come last in the Sequence", field);
        if (aps && i > 0)
            return skv_error(SKV_EUNSUPPORTED, "%s.add_prefix_space after another pre-tokenizer is not supported", field);
        v->prefix_space = aps;
        if (re)
            rc = tok_pre_add(v->pre, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", 0,
                             field);
        *byte_level = 1;
    } else if (strcmp(type, "Digits") == 0) {
        int ind = json_bool(p, "individual_digits", 0);
        if (ind < 0) return skv_error(SKV_EFORMAT, "%s.individual_digits is not a bool", field);
        rc = tok_pre_add(v->pre, ind ? "\\p{N}" : "\\p{N}+", 0, field);
    } else if (strcmp(type, "Split") == 0 || strcmp(type, "Punctuation") == 0) {
        const char *beh = json_str(p, "behavior");
        int contiguous = beh && strcmp(beh, "Contiguous") == 0 && type[0] == 'P';
        if (!beh || (strcmp(beh, "Isolated") != 0 && !contiguous))
            return skv_error(SKV_EUNSUPPORTED, "%s.behavior '%s' is not supported (expected \"Isolated\")", field,
                             beh ? beh : "(missing)");
        if (type[0] == 'P') {
            rc = tok_pre_add(v->pre, contiguous ? "[\\p{P}!-\\/:-@\\[-`{-~]+" : "[\\p{P}!-\\/:-@\\[-`{-~]", 0, field);
        } else {
            if (json_bool(p, "invert", 0) != 0)
                return skv_error(SKV_EUNSUPPORTED, "%s.invert is not false", field);
            const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
            const char *re = json_str(pat, "Regex"), *lit = json_str(pat, "String");
            if (!re && !lit) return skv_error(SKV_EFORMAT, "%s.pattern has neither Regex nor String", field);
            char what[128];
            snprintf(what, sizeof what, "%s.pattern", field);
            rc = tok_pre_add(v->pre, re ? re : lit, !re, what);
        }
    } else {
        return skv_error(SKV_EUNSUPPORTED,
                         "%s.type '%s' is not supported (expected ByteLevel, Digits, Split or Punctuation)", field, type);
    }
    return rc;
}

static int load_pre(tok_vocab *v, const char *path, const cJSON *root) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (is_null(p)) return skv_error(SKV_EUNSUPPORTED, "%s: pre_tokenizer is null (expected a byte-level one)", path);
    int rc = tok_pre_new("hf", &v->pre);
    if (rc) return rc;
    char *name = v->pre_name;
    size_t name_cap = sizeof v->pre_name;
    name[0] = 0;
    int byte_level = 0;
    const char *type = json_str(p, "type");
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list)) return skv_error(SKV_EFORMAT, "%s: pre_tokenizer.pretokenizers is not an array", path);
        int n = cJSON_GetArraySize(list), i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, list) {
            if ((rc = add_pre_step(v, path, x, i, i == n - 1, &byte_level, name, name_cap))) return rc;
            i++;
        }
    } else if ((rc = add_pre_step(v, path, p, -1, 1, &byte_level, name, name_cap))) {
        return rc;
    }
    if (!byte_level)
        return skv_error(SKV_EUNSUPPORTED, "%s: pre_tokenizer has no ByteLevel step (expected a byte-level BPE)", path);
    return 0;
}

/* Id of a token named by a string or by {"content": string}, or -1. */
static int token_ref(const tok_vocab *v, const cJSON *x) {
    if (cJSON_IsObject(x)) x = cJSON_GetObjectItemCaseSensitive(x, "content");
    if (!cJSON_IsString(x)) return -1;
    int id = tok_find(v, x->valuestring, strlen(x->valuestring));
    return id < v->n_vocab ? id : -1;
}

/* BOS, EOS, add_bos and further end-of-generation ids from the files next
 * to tokenizer.json (each optional) and from the post_processor. */
static int load_specials(tok_vocab *v, const char *path, const cJSON *root) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = 0;
    else dir[0] = 0;
    v->add_bos = -1;

    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    const char *ppt = json_str(pp, "type");
    if (ppt && strcmp(ppt, "Sequence") == 0) {
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(pp, "processors")) {
            const char *t = json_str(x, "type");
            if (t && strcmp(t, "TemplateProcessing") == 0) { pp = x; ppt = t; }
        }
    }
    if (ppt && strcmp(ppt, "TemplateProcessing") == 0) {
        const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pp, "single"), 0);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
        int id = st ? token_ref(v, cJSON_GetObjectItemCaseSensitive(st, "id")) : -1;
        if (id >= 0) { v->bos = id; v->add_bos = 1; }
    }

    static const char *const files[] = {"tokenizer_config.json", "config.json", "generation_config.json"};
    for (int f = 0; f < 3; f++) {
        char p[1024];
        snprintf(p, sizeof p, "%s%s", dir, files[f]);
        int rc;
        cJSON *j = parse_json(p, 1, &rc);
        if (rc == SKV_EMISSING) continue;
        if (!j) return rc;
        if (f == 0) {
            int id = token_ref(v, cJSON_GetObjectItemCaseSensitive(j, "bos_token"));
            if (id >= 0) v->bos = id;
            if ((id = token_ref(v, cJSON_GetObjectItemCaseSensitive(j, "eos_token"))) >= 0) v->eos = id;
            int ab = json_bool(j, "add_bos_token", -2);
            if (ab == -1) { cJSON_Delete(j); return skv_error(SKV_EFORMAT, "%s: add_bos_token is not a bool", p); }
            if (ab >= 0) v->add_bos = ab;
        } else {
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "bos_token_id");
            if (f == 1 && json_id(b) >= 0 && json_id(b) < v->n_vocab) v->bos = json_id(b);
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
            const cJSON *x;
            if (cJSON_IsArray(e)) {
                int k = 0;
                cJSON_ArrayForEach(x, e) {
                    int id = json_id(x);
                    if (id < 0 || id >= v->n_vocab) continue;
                    v->flags[id] |= TOK_F_EOG;
                    if (k++ == 0 && f == 1) v->eos = id;
                }
            } else if (json_id(e) >= 0 && json_id(e) < v->n_vocab) {
                if (f == 1) v->eos = json_id(e);
                v->flags[json_id(e)] |= TOK_F_EOG;
            }
        }
        cJSON_Delete(j);
    }
    if (v->add_bos < 0) v->add_bos = 0;
    return 0;
}

static int load_vocab(tok_vocab **out, const char *path, const cJSON *root) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return skv_error(SKV_EFORMAT, "%s: model is missing or not an object", path);
    int rc = check_model(path, model);
    if (rc) return rc;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return skv_error(SKV_EFORMAT, "%s: model.vocab is missing or not an object", path);
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!is_null(added) && !cJSON_IsArray(added)) return skv_error(SKV_EFORMAT, "%s: added_tokens is not an array", path);
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges)) return skv_error(SKV_EFORMAT, "%s: model.merges is missing or not an array", path);

    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, vocab) {
        int id = json_id(x);
        if (id < 0) return skv_error(SKV_EFORMAT, "%s: model.vocab[\"%s\"] is not a token id", path, x->string);
        if (id >= n) n = id + 1;
    }
    cJSON_ArrayForEach(x, added) {
        int id = json_id(cJSON_GetObjectItemCaseSensitive(x, "id"));
        if (id < 0 || !json_str(x, "content"))
            return skv_error(SKV_EFORMAT, "%s: added_tokens has an entry without an integer id and a content string", path);
        if (id >= n) n = id + 1;
    }
    if (n == 0) return skv_error(SKV_EFORMAT, "%s: model.vocab is empty", path);
    /* The vocabulary is sized by its largest id: ids must be dense enough that
     * a few entries cannot ask for gigabytes (real vocabularies are at most a
     * few hundred thousand, with few holes). */
    int entries = cJSON_GetArraySize(vocab) + (cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0);
    if (n > TOK_HF_MAX_VOCAB || n > 2 * entries + 1024)
        return skv_error(SKV_EFORMAT, "%s: token id %d is past the %d tokens the file defines (ids must be dense, at most "
                         "%d)", path, n - 1, entries, TOK_HF_MAX_VOCAB);

    tok_vocab *v;
    if ((rc = tok_vocab_new(TOK_BPE, n, path, &v))) return rc;
    memset(v->type, TOK_T_UNUSED, (size_t)n);
    cJSON_ArrayForEach(x, vocab) {
        int id = json_id(x);
        if (v->type[id] != TOK_T_UNUSED) {
            rc = skv_error(SKV_EFORMAT, "%s: model.vocab gives id %d to two tokens", path, id);
            break;
        }
        v->type[id] = TOK_T_NORMAL;
        if ((rc = tok_set_text(v, id, x->string, strlen(x->string)))) break;
    }
    cJSON_ArrayForEach(x, added) {
        if (rc) break;
        int id = json_id(cJSON_GetObjectItemCaseSensitive(x, "id"));
        const char *c = json_str(x, "content");
        int sp = json_bool(x, "special", 0), ls = json_bool(x, "lstrip", 0), rs = json_bool(x, "rstrip", 0);
        if (sp < 0 || ls < 0 || rs < 0) {
            rc = skv_error(SKV_EFORMAT, "%s: added_tokens entry %d: special/lstrip/rstrip is not a bool", path, id);
            break;
        }
        if (json_bool(x, "single_word", 0) != 0) {
            rc = skv_error(SKV_EUNSUPPORTED, "%s: added_tokens entry %d ('%s'): single_word is not supported", path, id, c);
            break;
        }
        if (!*c) {
            rc = skv_error(SKV_EFORMAT, "%s: added_tokens entry %d has an empty content", path, id);
            break;
        }
        v->type[id] = sp ? TOK_T_CONTROL : TOK_T_USER;
        v->flags[id] |= (ls ? TOK_F_LSTRIP : 0) | (rs ? TOK_F_RSTRIP : 0);
        rc = tok_set_text(v, id, c, strlen(c));
    }
    if (!rc) rc = tok_index(v);
    int rank = 0;
    cJSON_ArrayForEach(x, merges) {
        if (rc) break;
        const char *l = NULL, *r = NULL;
        size_t ll = 0, rl = 0;
        if (cJSON_IsString(x)) {
            const char *s = x->valuestring, *sp = s[0] ? strchr(s + 1, ' ') : NULL;
            if (sp) { l = s; ll = (size_t)(sp - s); r = sp + 1; rl = strlen(r); }
        } else if (cJSON_IsArray(x) && cJSON_GetArraySize(x) == 2 && cJSON_IsString(x->child) &&
                   cJSON_IsString(x->child->next)) {
            l = x->child->valuestring;
            r = x->child->next->valuestring;
            ll = strlen(l);
            rl = strlen(r);
        }
        if (!l) {
            rc = skv_error(SKV_EFORMAT, "%s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", path, rank);
            break;
        }
        rc = tok_add_merge(v, l, ll, r, rl, rank++);
    }
    if (rc) { tok_free(v); return rc; }
    int im = json_bool(model, "ignore_merges", 0);
    if (im < 0) { tok_free(v); return skv_error(SKV_EFORMAT, "%s: model.ignore_merges is not a bool", path); }
    v->ignore_merges = im;
    *out = v;
    return 0;
}

static int check_norm_dec(const char *path, const cJSON *root) {
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const char *t = json_str(nm, "type");
    if (!is_null(nm) && !(t && strcmp(t, "NFC") == 0))
        return skv_error(SKV_EUNSUPPORTED, "%s: normalizer '%s' is not supported (expected null or NFC)", path,
                         t ? t : "?");
    const cJSON *de = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    t = json_str(de, "type");
    if (!is_null(de) && !(t && strcmp(t, "ByteLevel") == 0))
        return skv_error(SKV_EUNSUPPORTED, "%s: decoder '%s' is not supported (expected ByteLevel)", path, t ? t : "?");
    return 0;
}

int tok_load_hf(const char *path, tok_vocab **out) {
    if (!path || !out) return skv_error(SKV_EINVAL, "tok_load_hf: NULL argument");
    *out = NULL;
    int rc;
    cJSON *root = parse_json(path, 0, &rc);
    if (!root) return rc;
    tok_vocab *v = NULL;
    if (!cJSON_IsObject(root)) rc = skv_error(SKV_EFORMAT, "%s: top level is not a JSON object", path);
    if (!rc) rc = check_norm_dec(path, root);
    if (!rc) rc = load_vocab(&v, path, root);
    if (!rc) rc = load_pre(v, path, root);
    if (!rc) rc = load_specials(v, path, root);
    if (!rc) rc = tok_finish(v);
    cJSON_Delete(root);
    if (rc) {
        tok_free(v);
        return rc;
    }
    *out = v;
    return 0;
}
