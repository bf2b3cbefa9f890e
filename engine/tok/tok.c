/* tok.c: the vocabulary, GGUF loading, special-token splitting, encoding
 * front end and decoding, shared by both tokenizer kinds.
 *
 * Encoding first cuts the text at special tokens written in it (control,
 * user-defined and unknown tokens, longest text first, as llama.cpp does;
 * control and unknown ones only with parse_special, user-defined ones always),
 * then hands each stretch of plain text to tok_spm_fragment (SentencePiece
 * style, tok_spm.c) or tok_bpe_fragment (byte-level BPE, tok_bpe.c).
 * Decoding maps each token back to bytes (tok_piece).
 *
 * Choices made here where the formats leave room:
 * - tokenizer.ggml.pre absent: "default"; a name not in tok_pre.c: an error
 *   naming it (silently using another regex would give wrong ids).
 * - BOS/EOS keys absent: SPM uses 1 and 2 (as llama.cpp), BPE has none (-1).
 * - SPM prepends U+2581 to the text and after every special token whether or
 *   not BOS is added (tokenizer.ggml.add_space_prefix, default on), as llama.cpp.
 * - A BPE vocabulary character that is not a GPT-2 stand-in decodes to itself. */
#include "tok_impl.h"
#include "skv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---- */

struct tok_arena_chunk {
    struct tok_arena_chunk *next;
    size_t used, cap;
    char data[];
};

static char *arena_alloc(tok_vocab *v, size_t n) {
    struct tok_arena_chunk *c = v->arena;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = v->arena;
        c->used = 0;
        c->cap = cap;
        v->arena = c;
    }
    char *p = c->data + c->used;
    c->used += n;
    return p;
}

/* ---- string -> id map ---- */

static uint32_t str_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static int map_alloc(tok_map *m, uint32_t cap) {
    m->id = malloc((size_t)cap * sizeof *m->id);
    m->hash = malloc((size_t)cap * sizeof *m->hash);
    if (!m->id || !m->hash) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
    for (uint32_t i = 0; i < cap; i++) m->id[i] = -1;
    m->mask = cap - 1;
    m->n = 0;
    return 0;
}

/* Inserts string id; an equal string already there is replaced (last wins). */
static void map_put(tok_vocab *v, int32_t id, uint32_t h) {
    tok_map *m = &v->map;
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        int32_t o = m->id[i];
        if (o < 0) {
            m->id[i] = id;
            m->hash[i] = h;
            m->n++;
            return;
        }
        if (m->hash[i] == h && v->len[o] == v->len[id] && memcmp(v->text[o], v->text[id], v->len[id]) == 0) {
            m->id[i] = id;
            return;
        }
    }
}

static int map_grow(tok_vocab *v) {
    tok_map old = v->map;
    int rc = map_alloc(&v->map, (old.mask + 1) * 2);
    if (rc) {
        free(v->map.id);
        free(v->map.hash);
        v->map = old;
        return rc;
    }
    for (uint32_t i = 0; i <= old.mask; i++)
        if (old.id[i] >= 0) map_put(v, old.id[i], old.hash[i]);
    free(old.id);
    free(old.hash);
    return 0;
}

int tok_find(const tok_vocab *v, const char *s, size_t len) {
    const tok_map *m = &v->map;
    if (!m->id) return -1;
    uint32_t h = str_hash(s, len);
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        int32_t o = m->id[i];
        if (o < 0) return -1;
        if (m->hash[i] == h && v->len[o] == len && memcmp(v->text[o], s, len) == 0) return o;
    }
}

int tok_index(tok_vocab *v) {
    uint32_t cap = 1024;
    while (cap < 2u * (uint32_t)v->n_vocab + 2) cap *= 2;
    int rc = map_alloc(&v->map, cap);
    if (rc) return rc;
    for (int i = 0; i < v->n_vocab; i++)
        if (v->len[i]) map_put(v, i, str_hash(v->text[i], v->len[i]));
    return 0;
}

/* Id of s, adding it as a merge-only extra string when it is unknown. */
static int intern(tok_vocab *v, const char *s, size_t len) {
    int id = tok_find(v, s, len);
    if (id >= 0) return id;
    if (v->n_str == v->cap_str) {
        int cap = v->cap_str * 2;
        char **t = realloc(v->text, (size_t)cap * sizeof *t);
        if (!t) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
        v->text = t;
        uint32_t *l = realloc(v->len, (size_t)cap * sizeof *l);
        if (!l) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
        v->len = l;
        v->cap_str = cap;
    }
    if (2 * (v->map.n + 1) > v->map.mask + 1) {
        int rc = map_grow(v);
        if (rc) return rc;
    }
    char *p = arena_alloc(v, len + 1);
    if (!p) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
    memcpy(p, s, len);
    p[len] = 0;
    id = v->n_str++;
    v->text[id] = p;
    v->len[id] = (uint32_t)len;
    map_put(v, id, str_hash(s, len));
    return id;
}

/* ---- merge pair -> rank map ---- */

static uint32_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (uint32_t)k;
}

static int pairs_alloc(tok_pairs *p, uint32_t cap) {
    p->key = malloc((size_t)cap * sizeof *p->key);
    p->rank = malloc((size_t)cap * sizeof *p->rank);
    p->res = malloc((size_t)cap * sizeof *p->res);
    if (!p->key || !p->rank || !p->res) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
    for (uint32_t i = 0; i < cap; i++) p->key[i] = UINT64_MAX;
    p->mask = cap - 1;
    p->n = 0;
    return 0;
}

static void pairs_free(tok_pairs *p) {
    free(p->key);
    free(p->rank);
    free(p->res);
    memset(p, 0, sizeof *p);
}

static void pairs_put(tok_pairs *p, uint64_t k, int32_t rank, int32_t res) {
    for (uint32_t i = pair_hash(k) & p->mask;; i = (i + 1) & p->mask) {
        if (p->key[i] == k) return; /* first rank wins */
        if (p->key[i] == UINT64_MAX) {
            p->key[i] = k;
            p->rank[i] = rank;
            p->res[i] = res;
            p->n++;
            return;
        }
    }
}

int tok_merge_find(const tok_vocab *v, int32_t l, int32_t r, int32_t *res) {
    const tok_pairs *p = &v->merges;
    if (!p->key) return -1;
    uint64_t k = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    for (uint32_t i = pair_hash(k) & p->mask;; i = (i + 1) & p->mask) {
        if (p->key[i] == UINT64_MAX) return -1;
        if (p->key[i] == k) {
            *res = p->res[i];
            return p->rank[i];
        }
    }
}

int tok_add_merge(tok_vocab *v, const char *l, size_t ll, const char *r, size_t rl, int rank) {
    tok_pairs *p = &v->merges;
    if (!p->key || 2 * (p->n + 1) > p->mask + 1) {
        tok_pairs old = *p;
        int rc = pairs_alloc(p, old.key ? (old.mask + 1) * 2 : 4096);
        if (rc) {
            pairs_free(p);
            *p = old;
            return rc;
        }
        if (old.key)
            for (uint32_t i = 0; i <= old.mask; i++)
                if (old.key[i] != UINT64_MAX) pairs_put(p, old.key[i], old.rank[i], old.res[i]);
        pairs_free(&old);
    }
    int li = intern(v, l, ll);
    if (li < 0) return li;
    int ri = intern(v, r, rl);
    if (ri < 0) return ri;
    char small[256];
    char *cat = ll + rl <= sizeof small ? small : malloc(ll + rl);
    if (!cat) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
    memcpy(cat, l, ll);
    memcpy(cat + ll, r, rl);
    int res = intern(v, cat, ll + rl);
    if (cat != small) free(cat);
    if (res < 0) return res;
    pairs_put(p, (uint64_t)(uint32_t)li << 32 | (uint32_t)ri, rank, res);
    return 0;
}

/* ---- vocabulary ---- */

int tok_vocab_new(enum tok_kind kind, int n_vocab, const char *src, tok_vocab **out) {
    *out = NULL;
    tok_vocab *v = calloc(1, sizeof *v);
    if (!v) return skv_error(SKV_ENOMEM, "%s: out of memory", src);
    v->kind = kind;
    snprintf(v->src, sizeof v->src, "%s", src);
    v->n_vocab = v->n_str = n_vocab;
    v->cap_str = n_vocab + 64;
    v->text = calloc((size_t)v->cap_str, sizeof *v->text);
    v->len = calloc((size_t)v->cap_str, sizeof *v->len);
    v->score = calloc((size_t)n_vocab + 1, sizeof *v->score);
    v->type = malloc((size_t)n_vocab + 1);
    v->flags = calloc((size_t)n_vocab + 1, 1);
    v->bos = v->eos = v->eot = v->eom = v->unk = -1;
    v->add_space_prefix = kind == TOK_SPM;
    if (!v->text || !v->len || !v->score || !v->type || !v->flags) {
        tok_free(v);
        return skv_error(SKV_ENOMEM, "%s: out of memory", src);
    }
    memset(v->type, TOK_T_NORMAL, (size_t)n_vocab + 1);
    for (int i = 0; i < n_vocab; i++) v->text[i] = "";
    *out = v;
    return 0;
}

int tok_set_text(tok_vocab *v, int id, const char *s, size_t len) {
    char *p = arena_alloc(v, len + 1);
    if (!p) return skv_error(SKV_ENOMEM, "%s: out of memory", v->src);
    memcpy(p, s, len);
    p[len] = 0;
    v->text[id] = p;
    v->len[id] = (uint32_t)len;
    return 0;
}

void tok_free(tok_vocab *v) {
    if (!v) return;
    while (v->arena) {
        struct tok_arena_chunk *n = v->arena->next;
        free(v->arena);
        v->arena = n;
    }
    free(v->text);
    free(v->len);
    free(v->score);
    free(v->type);
    free(v->flags);
    free(v->map.id);
    free(v->map.hash);
    pairs_free(&v->merges);
    free(v->special);
    tok_pre_free(v->pre);
    free(v);
}

/* Writes code point cp as UTF-8; returns its length. */
static int put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 63)); o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 63));
    o[2] = (char)(0x80 | (cp >> 6 & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* Decodes one UTF-8 character at s (n bytes left); a stray byte reads as
 * itself with length 1. */
static uint32_t get_utf8(const unsigned char *s, size_t n, int *len) {
    int l = tok_utf8_len(s[0]);
    if ((size_t)l > n || tok_utf8_valid((const char *)s, (size_t)l) != (size_t)l) { *len = 1; return s[0]; }
    *len = l;
    if (l == 1) return s[0];
    uint32_t cp = s[0] & (0x7F >> l);
    for (int i = 1; i < l; i++) cp = cp << 6 | (s[i] & 63);
    return cp;
}

/* Tokens that end a turn in common chat templates (besides EOS and the ids
 * given by tokenizer.ggml.eot/eom_token_id). */
static const char *const eog_names[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "<|end_of_text|>", "<end_of_utterance>",
};

typedef struct { uint32_t len; int32_t id; } len_id;

static int by_len_desc(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int tok_finish(tok_vocab *v) {
    /* GPT-2 byte table: printable Latin-1 bytes stand for themselves, the
     * other 68 take U+0100 upward in byte order. */
    int k = 0;
    for (int i = 0; i < 512; i++) v->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        v->byte_cp[b] = (uint16_t)(printable ? b : 256 + k++);
        v->cp_byte[v->byte_cp[b]] = (int16_t)b;
        char u[4];
        int n = put_utf8(u, v->byte_cp[b]);
        v->byte_sym[b] = tok_find(v, u, (size_t)n);
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int id = tok_find(v, hex, 6);
        if (id < 0 || id >= v->n_vocab) {
            char c = (char)b;
            id = tok_find(v, &c, 1);
        }
        v->byte_tok[b] = id >= 0 && id < v->n_vocab ? id : -1;
    }

    for (size_t i = 0; i < sizeof eog_names / sizeof eog_names[0]; i++) {
        int id = tok_find(v, eog_names[i], strlen(eog_names[i]));
        if (id < 0 || id >= v->n_vocab) continue;
        v->flags[id] |= TOK_F_EOG;
        if (v->type[id] != TOK_T_CONTROL) v->type[id] = TOK_T_CONTROL; /* as llama.cpp: render only on request */
    }
    int ends[3] = {v->eos, v->eot, v->eom};
    for (int i = 0; i < 3; i++)
        if (ends[i] >= 0) v->flags[ends[i]] |= TOK_F_EOG;

    len_id *s = malloc(((size_t)v->n_vocab + 1) * sizeof *s);
    if (!s) return skv_error(SKV_ENOMEM, "%s: out of memory", v->src);
    int n = 0;
    for (int i = 0; i < v->n_vocab; i++) {
        int t = v->type[i];
        if ((t == TOK_T_CONTROL || t == TOK_T_USER || t == TOK_T_UNKNOWN) && v->len[i]) s[n++] = (len_id){v->len[i], i};
    }
    qsort(s, (size_t)n, sizeof *s, by_len_desc);
    v->special = malloc(((size_t)n + 1) * sizeof *v->special);
    if (!v->special) {
        free(s);
        return skv_error(SKV_ENOMEM, "%s: out of memory", v->src);
    }
    for (int i = 0; i < n; i++) v->special[i] = s[i].id;
    v->n_special = n;
    free(s);
    return 0;
}

/* ---- GGUF ---- */

static const gguf_kv *find_array(const gguf_file *f, const char *key, int strings, uint64_t n, int *rc) {
    *rc = 0;
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return NULL;
    if (kv->type != GGUF_ARRAY || (strings ? kv->arr_type != GGUF_STRING
                                           : (kv->arr_type == GGUF_STRING || kv->arr_type == GGUF_ARRAY ||
                                              kv->arr_type == GGUF_BOOL))) {
        *rc = skv_error(SKV_EFORMAT, "%s: %s is not an array of %s", f->path, key, strings ? "strings" : "numbers");
        return NULL;
    }
    if (n && kv->n != n) {
        *rc = skv_error(SKV_EFORMAT, "%s: %s has %llu entries, expected %llu (one per token)", f->path, key,
                        (unsigned long long)kv->n, (unsigned long long)n);
        return NULL;
    }
    return kv;
}

/* Reads a token id key into *out (left alone when absent). A negative
 * integer means "none". */
static int get_id(const gguf_file *f, const char *key, int n_vocab, int *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return 0;
    int64_t x;
    if (kv->type == GGUF_U8 || kv->type == GGUF_U16 || kv->type == GGUF_U32 || kv->type == GGUF_U64)
        x = kv->v.u > (uint64_t)INT32_MAX ? INT32_MAX : (int64_t)kv->v.u;
    else if (kv->type == GGUF_I8 || kv->type == GGUF_I16 || kv->type == GGUF_I32 || kv->type == GGUF_I64)
        x = kv->v.i;
    else
        return skv_error(SKV_EFORMAT, "%s: %s is a %s, expected an integer token id", f->path, key,
                         gguf_vtype_name(kv->type));
    if (x < 0) { *out = -1; return 0; }
    if (x >= n_vocab)
        return skv_error(SKV_EFORMAT, "%s: %s = %lld is outside the vocabulary of %d tokens", f->path, key,
                         (long long)x, n_vocab);
    *out = (int)x;
    return 0;
}

static int get_flag(const gguf_file *f, const char *key, int *out) {
    int b, rc = gguf_get_bool(f, key, &b);
    if (rc == SKV_EMISSING) return 0;
    if (rc) return skv_error(SKV_EFORMAT, "%s: %s is not a bool", f->path, key);
    *out = b;
    return 0;
}

int tok_pre_ignores_merges(const char *pre) {
    return !strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "llama-v3");
}

static int load_gguf(const gguf_file *f, tok_vocab **out) {
    const char *src = f->path ? f->path : "gguf";
    const char *model = gguf_get_str(f, "tokenizer.ggml.model");
    if (!model) return skv_error(SKV_EMISSING, "%s: tokenizer.ggml.model is missing (expected \"llama\" or \"gpt2\")", src);
    enum tok_kind kind;
    if (strcmp(model, "llama") == 0) kind = TOK_SPM;
    else if (strcmp(model, "gpt2") == 0) kind = TOK_BPE;
    else
        return skv_error(SKV_EUNSUPPORTED, "%s: tokenizer.ggml.model '%s' is not supported (expected \"llama\" or \"gpt2\")",
                         src, model);
    int rc;
    const gguf_kv *toks = find_array(f, "tokenizer.ggml.tokens", 1, 0, &rc);
    if (rc) return rc;
    if (!toks) return skv_error(SKV_EMISSING, "%s: tokenizer.ggml.tokens is missing", src);
    if (toks->n == 0 || toks->n > (1u << 30))
        return skv_error(SKV_EFORMAT, "%s: tokenizer.ggml.tokens has %llu entries", src, (unsigned long long)toks->n);
    int n = (int)toks->n;
    const gguf_kv *scores = find_array(f, "tokenizer.ggml.scores", 0, toks->n, &rc);
    if (rc) return rc;
    const gguf_kv *types = find_array(f, "tokenizer.ggml.token_type", 0, toks->n, &rc);
    if (rc) return rc;
    const gguf_kv *merges = find_array(f, "tokenizer.ggml.merges", 1, 0, &rc);
    if (rc) return rc;
    if (kind == TOK_BPE && !merges) return skv_error(SKV_EMISSING, "%s: tokenizer.ggml.merges is missing (gpt2 BPE)", src);

    tok_vocab *v;
    if ((rc = tok_vocab_new(kind, n, src, &v))) return rc;
    for (int i = 0; i < n && !rc; i++) {
        rc = tok_set_text(v, i, toks->arr_str[i], toks->arr_len[i]);
        if (scores) v->score[i] = (float)gguf_arr_num(scores, (uint64_t)i);
        if (types) {
            double t = gguf_arr_num(types, (uint64_t)i);
            if (!(t >= 0 && t <= 6))
                rc = skv_error(SKV_EFORMAT, "%s: tokenizer.ggml.token_type[%d] = %g, expected 0..6", src, i, t);
            v->type[i] = t >= 1 && t <= 6 ? (uint8_t)t : TOK_T_NORMAL;
        }
    }
    if (!rc) rc = tok_index(v);
    for (uint64_t i = 0; merges && i < merges->n && !rc; i++) {
        const char *m = merges->arr_str[i];
        uint32_t ml = merges->arr_len[i];
        const char *sp = ml > 1 ? memchr(m + 1, ' ', ml - 1) : NULL;
        if (!sp)
            rc = skv_error(SKV_EFORMAT, "%s: tokenizer.ggml.merges[%llu] = '%s' is not two strings separated by a space",
                           src, (unsigned long long)i, m);
        else
            rc = tok_add_merge(v, m, (size_t)(sp - m), sp + 1, ml - (size_t)(sp - m) - 1, (int)i);
    }
    if (rc) { tok_free(v); return rc; }

    if (kind == TOK_SPM) {
        v->bos = n > 1 ? 1 : -1;
        v->eos = n > 2 ? 2 : -1;
        v->unk = 0;
        v->add_bos = 1;
        snprintf(v->pre_name, sizeof v->pre_name, "none");
    } else {
        const char *pre = gguf_get_str(f, "tokenizer.ggml.pre");
        if (!pre || !*pre) pre = "default";
        if ((rc = tok_pre_from_name(pre, src, &v->pre))) { tok_free(v); return rc; }
        snprintf(v->pre_name, sizeof v->pre_name, "%s", pre);
        int llama3 = tok_pre_ignores_merges(pre);
        v->ignore_merges = llama3;
        v->add_bos = llama3;
    }
    if ((rc = get_id(f, "tokenizer.ggml.bos_token_id", n, &v->bos)) ||
        (rc = get_id(f, "tokenizer.ggml.eos_token_id", n, &v->eos)) ||
        (rc = get_id(f, "tokenizer.ggml.unknown_token_id", n, &v->unk)) ||
        (rc = get_id(f, "tokenizer.ggml.eot_token_id", n, &v->eot)) ||
        (rc = get_id(f, "tokenizer.ggml.eom_token_id", n, &v->eom)) ||
        (rc = get_flag(f, "tokenizer.ggml.add_bos_token", &v->add_bos)) ||
        (rc = get_flag(f, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix)) ||
        (rc = tok_finish(v))) {
        tok_free(v);
        return rc;
    }
    if (kind == TOK_BPE) v->add_space_prefix = 0;
    *out = v;
    return 0;
}

int tok_load_gguf(const gguf_file *f, tok_vocab **out) {
    if (!f || !out) return skv_error(SKV_EINVAL, "tok_load_gguf: NULL argument");
    *out = NULL;
    return load_gguf(f, out);
}

/* ---- accessors ---- */

enum tok_kind tok_kind(const tok_vocab *v) { return v->kind; }
int tok_n_vocab(const tok_vocab *v) { return v->n_vocab; }
int tok_bos(const tok_vocab *v) { return v->bos; }
int tok_eos(const tok_vocab *v) { return v->eos; }
int tok_add_bos(const tok_vocab *v) { return v->add_bos && v->bos >= 0; }
int tok_is_eog(const tok_vocab *v, int id) { return id >= 0 && id < v->n_vocab && (v->flags[id] & TOK_F_EOG); }
const char *tok_pre_name(const tok_vocab *v) { return v->pre_name; }
const char *tok_text(const tok_vocab *v, int id) { return id >= 0 && id < v->n_vocab ? v->text[id] : NULL; }

/* ---- encoding ---- */

int tok_out_push(tok_out *o, int32_t id) {
    if (o->n == o->cap) {
        int cap = o->cap ? o->cap * 2 : 256;
        int32_t *p = realloc(o->ids, (size_t)cap * sizeof *p);
        if (!p) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
        o->ids = p;
        o->cap = cap;
    }
    o->ids[o->n++] = id;
    return 0;
}

/* A stretch of the text: plain text (id < 0) or one special token. */
typedef struct { int32_t id; uint32_t off, len; } frag;
typedef struct { frag *f; int n, cap; } frag_list;

static int frag_push(frag_list *l, int32_t id, uint32_t off, uint32_t len) {
    if (id < 0 && len == 0) return 0;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        frag *p = realloc(l->f, (size_t)cap * sizeof *p);
        if (!p) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
        l->f = p;
        l->cap = cap;
    }
    l->f[l->n++] = (frag){id, off, len};
    return 0;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

/* Cuts every plain-text fragment of *cur at each occurrence of special
 * token id (left to right), into *next; then swaps the lists. */
static int cut_at(const tok_vocab *v, const char *text, int id, frag_list *cur, frag_list *next) {
    const char *tt = v->text[id];
    size_t tl = v->len[id];
    int found = 0;
    for (int i = 0; i < cur->n && !found; i++)
        if (cur->f[i].id < 0 && cur->f[i].len >= tl && memmem(text + cur->f[i].off, cur->f[i].len, tt, tl)) found = 1;
    if (!found) return 0;
    next->n = 0;
    int rc = 0;
    for (int i = 0; i < cur->n && !rc; i++) {
        frag f = cur->f[i];
        if (f.id >= 0 || f.len < tl) { rc = frag_push(next, f.id, f.off, f.len); continue; }
        uint32_t pos = f.off, end = f.off + f.len;
        while (!rc) {
            const char *hit = end - pos >= tl ? memmem(text + pos, end - pos, tt, tl) : NULL;
            if (!hit) break;
            uint32_t h = (uint32_t)(hit - text), left = h;
            if (v->flags[id] & TOK_F_LSTRIP)
                while (left > pos && is_space(text[left - 1])) left--;
            rc = frag_push(next, -1, pos, left - pos);
            if (!rc) rc = frag_push(next, id, h, (uint32_t)tl);
            pos = h + (uint32_t)tl;
            if (v->flags[id] & TOK_F_RSTRIP)
                while (pos < end && is_space(text[pos])) pos++;
        }
        if (!rc) rc = frag_push(next, -1, pos, end - pos);
    }
    frag_list t = *cur;
    *cur = *next;
    *next = t;
    return rc;
}

int tok_encode(const tok_vocab *v, const char *text, size_t len, int add_bos, int parse_special, int32_t **ids,
               int *n_ids) {
    if (!v || !ids || !n_ids || (!text && len)) return skv_error(SKV_EINVAL, "tok_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (len > (size_t)INT32_MAX / 4) return skv_error(SKV_ERANGE, "tok_encode: text of %zu bytes is too long", len);
    if (add_bos && v->bos < 0) return skv_error(SKV_EINVAL, "%s: BOS requested but the tokenizer has no BOS token", v->src);
    tok_out out = {0};
    frag_list cur = {0}, next = {0};
    int rc = 0;
    if (add_bos) rc = tok_out_push(&out, v->bos);
    if (!rc) rc = frag_push(&cur, -1, 0, (uint32_t)len);
    for (int i = 0; i < v->n_special && !rc && cur.n; i++) {
        int id = v->special[i];
        if (!parse_special && v->type[id] != TOK_T_USER) continue;
        rc = cut_at(v, text, id, &cur, &next);
    }
    int prev_special = 1;
    for (int i = 0; i < cur.n && !rc; i++) {
        frag f = cur.f[i];
        if (f.id >= 0) {
            rc = tok_out_push(&out, f.id);
            prev_special = 1;
        } else if (v->kind == TOK_SPM) {
            rc = tok_spm_fragment(v, text + f.off, f.len, v->add_space_prefix && prev_special, &out);
            prev_special = 0;
        } else {
            rc = tok_bpe_fragment(v, text + f.off, f.len, &out);
        }
    }
    free(cur.f);
    free(next.f);
    if (!rc && !out.ids && !(out.ids = malloc(sizeof *out.ids))) rc = skv_error(SKV_ENOMEM, "tokenizer: out of memory");
    if (rc) {
        free(out.ids);
        return rc;
    }
    *ids = out.ids;
    *n_ids = out.n;
    return 0;
}

/* ---- decoding ---- */

typedef struct { char *buf; int cap, n; } writer;

static void w_bytes(writer *w, const char *s, int n) {
    for (int i = 0; i < n; i++, w->n++)
        if (w->n < w->cap) w->buf[w->n] = s[i];
}

/* Byte value of a "<0xNN>" text, or -1. */
static int hex_byte(const char *s, uint32_t len) {
    if (len != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int x = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        x = x * 16 + d;
    }
    return x;
}

int tok_piece(const tok_vocab *v, int prev, int id, int show_special, char *buf, int cap) {
    if (!v || id < 0 || id >= v->n_vocab) return 0;
    writer w = {buf, buf ? cap : 0, 0};
    const char *s = v->text[id];
    uint32_t n = v->len[id];
    switch (v->type[id]) {
    case TOK_T_CONTROL:
    case TOK_T_UNKNOWN:
        if (show_special) w_bytes(&w, s, (int)n);
        break;
    case TOK_T_USER:
        w_bytes(&w, s, (int)n);
        break;
    case TOK_T_UNUSED:
        break;
    case TOK_T_BYTE: {
        int b = hex_byte(s, n);
        if (b >= 0) {
            char c = (char)b;
            w_bytes(&w, &c, 1);
        } else
            w_bytes(&w, s, (int)n);
        break;
    }
    default:
        if (v->kind == TOK_SPM) {
            int strip = v->add_space_prefix && (prev < 0 || prev == v->bos);
            for (uint32_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                    if (!strip) w_bytes(&w, " ", 1);
                    i += 3;
                } else {
                    w_bytes(&w, s + i, 1);
                    i++;
                }
                strip = 0;
            }
        } else {
            for (uint32_t i = 0; i < n;) {
                int l;
                uint32_t cp = get_utf8((const unsigned char *)s + i, n - i, &l);
                if (cp < 512 && v->cp_byte[cp] >= 0) {
                    char c = (char)v->cp_byte[cp];
                    w_bytes(&w, &c, 1);
                } else
                    w_bytes(&w, s + i, l);
                i += (uint32_t)l;
            }
        }
    }
    return w.n;
}

char *tok_decode(const tok_vocab *v, const int32_t *ids, int n, int show_special) {
    size_t cap = 64, len = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        int prev = i ? ids[i - 1] : -1;
        int avail = (int)(cap - len - 1 > INT32_MAX ? INT32_MAX : cap - len - 1);
        int k = tok_piece(v, prev, ids[i], show_special, out + len, avail);
        if (k > avail) {
            while (cap - len - 1 < (size_t)k) cap *= 2;
            char *p = realloc(out, cap);
            if (!p) { free(out); return NULL; }
            out = p;
            k = tok_piece(v, prev, ids[i], show_special, out + len, k);
        }
        len += (size_t)k;
    }
    out[len] = 0;
    return out;
}
