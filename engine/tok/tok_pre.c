/* tok_pre.c: the regex pre-tokenizer of byte-level BPE, and UTF-8 checks.
 *
 * A pre-tokenizer is an ordered list of PCRE2 regexes (UTF + UCP, so \p{L},
 * \p{N}, \p{P} and \s are Unicode categories). The first regex cuts the text
 * into pieces: every match is a piece and so is the text between two matches.
 * Each further regex cuts each piece again, matching inside that piece only,
 * so a look-ahead such as (?!\S) sees the end of the piece as the end of the
 * text. Regexes are compiled (and JIT-compiled where PCRE2 can) once. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok_impl.h"
#include "skv.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_PRE_MAX 8

struct tok_pre {
    char name[32];
    int n;
    pcre2_code *re[TOK_PRE_MAX];
    char *pat[TOK_PRE_MAX];      /* the source text of each regex, for tok_pre_gguf_name */
    uint8_t literal[TOK_PRE_MAX];
};

/* The expressions of TOKENIZERS.md. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3_A "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_B "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 RE_LLAMA3_A "\\p{N}{1,3}" RE_LLAMA3_B
#define RE_QWEN2 RE_LLAMA3_A "\\p{N}" RE_LLAMA3_B

static const struct {
    const char *name;
    const char *re[3];
} pre_table[] = {
    {"smollm", {"\\p{N}", RE_GPT2, NULL}},
    {"gpt2", {RE_GPT2, NULL, NULL}},
    {"gpt-2", {RE_GPT2, NULL, NULL}},
    {"llama-bpe", {RE_LLAMA3, NULL, NULL}},
    {"llama3", {RE_LLAMA3, NULL, NULL}},
    {"llama-v3", {RE_LLAMA3, NULL, NULL}},
    {"qwen2", {RE_QWEN2, NULL, NULL}},
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+"}},
};

int tok_pre_new(const char *name, tok_pre **out) {
    *out = NULL;
    tok_pre *p = calloc(1, sizeof *p);
    if (!p) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
    snprintf(p->name, sizeof p->name, "%s", name);
    *out = p;
    return 0;
}

int tok_pre_add(tok_pre *p, const char *pattern, int literal, const char *what) {
    if (p->n == TOK_PRE_MAX)
        return skv_error(SKV_EUNSUPPORTED, "%s: more than %d pre-tokenizer regexes", what, TOK_PRE_MAX);
    int err;
    PCRE2_SIZE at;
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* LITERAL refuses UCP */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opt, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return skv_error(SKV_EUNSUPPORTED, "%s: regex does not compile at offset %zu: %s", what, (size_t)at,
                         (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter runs it when JIT is absent */
    char *copy = strdup(pattern);
    if (!copy) {
        pcre2_code_free(re);
        return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
    }
    p->pat[p->n] = copy;
    p->literal[p->n] = literal != 0;
    p->re[p->n++] = re;
    return 0;
}

int tok_pre_from_name(const char *name, const char *src, tok_pre **out) {
    *out = NULL;
    for (size_t i = 0; i < sizeof pre_table / sizeof pre_table[0]; i++) {
        if (strcmp(pre_table[i].name, name) != 0) continue;
        tok_pre *p;
        int rc = tok_pre_new(name, &p);
        if (rc) return rc;
        for (int j = 0; j < 3 && pre_table[i].re[j]; j++)
            if ((rc = tok_pre_add(p, pre_table[i].re[j], 0, "built-in pre-tokenizer"))) {
                tok_pre_free(p);
                return rc;
            }
        *out = p;
        return 0;
    }
    return skv_error(SKV_EUNSUPPORTED,
                     "%s: tokenizer.ggml.pre '%s' is not supported (expected smollm, gpt2, llama-bpe, qwen2 "
                     "or default)", src, name);
}

/* Exact text comparison: two spellings of one regex (say "(?i:'s)" and
 * "'[sS]") are different names, since they can split some texts differently. */
const char *tok_pre_gguf_name(const tok_pre *p) {
    for (size_t i = 0; i < sizeof pre_table / sizeof pre_table[0]; i++) {
        int n = 0;
        while (n < 3 && pre_table[i].re[n]) n++;
        if (n != p->n) continue;
        int same = 1;
        for (int j = 0; j < n && same; j++) same = !p->literal[j] && strcmp(p->pat[j], pre_table[i].re[j]) == 0;
        if (same) return pre_table[i].name;
    }
    return NULL;
}

void tok_pre_free(tok_pre *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        pcre2_code_free(p->re[i]);
        free(p->pat[i]);
    }
    free(p);
}

int tok_utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

size_t tok_utf8_valid(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        int n;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) n = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            n = 3;
            if (c == 0xE0) lo = 0xA0;      /* overlong */
            if (c == 0xED) hi = 0x9F;      /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 4;
            if (c == 0xF0) lo = 0x90;      /* overlong */
            if (c == 0xF4) hi = 0x8F;      /* above U+10FFFF */
        } else return i;
        if (i + n > len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (int k = 2; k < n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += n;
    }
    return len;
}

typedef struct { tok_span *s; int n, cap; } span_list;

static int span_push(span_list *l, uint32_t off, uint32_t len) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        tok_span *s = realloc(l->s, (size_t)cap * sizeof *s);
        if (!s) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
        l->s = s;
        l->cap = cap;
    }
    l->s[l->n++] = (tok_span){off, len};
    return 0;
}

/* Runs one regex over the piece [off, off+len) of text and appends the
 * pieces it makes. A JIT stack overflow is retried with the interpreter. */
static int split_piece(const pcre2_code *re, pcre2_match_data *md, const char *text, uint32_t off,
                       uint32_t len, span_list *out) {
    PCRE2_SPTR subj = (PCRE2_SPTR)(text + off);
    size_t pos = 0, last = 0;
    while (pos < len) {
        int rc = pcre2_match(re, subj, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, subj, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return skv_error(SKV_ERANGE, "tokenizer: pre-tokenizer regex failed on a %u-byte piece: %s", len,
                             (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        if (e <= s) { /* an empty match cuts nothing: step over one character */
            pos = s + (size_t)tok_utf8_len(subj[s]);
            continue;
        }
        int r;
        if (s > last && (r = span_push(out, off + (uint32_t)last, (uint32_t)(s - last)))) return r;
        if ((r = span_push(out, off + (uint32_t)s, (uint32_t)(e - s)))) return r;
        last = pos = e;
    }
    if (last < len) return span_push(out, off + (uint32_t)last, (uint32_t)(len - last));
    return 0;
}

int tok_pre_split(const tok_pre *p, const char *text, size_t len, tok_span **spans, int *n) {
    *spans = NULL;
    *n = 0;
    if (len > UINT32_MAX / 2) return skv_error(SKV_ERANGE, "tokenizer: text of %zu bytes is too long", len);
    span_list cur = {0}, next = {0};
    int rc = 0;
    if (len && (rc = span_push(&cur, 0, (uint32_t)len))) return rc;
    pcre2_match_data *md = NULL;
    for (int i = 0; i < p->n && cur.n; i++) {
        if (!md) md = pcre2_match_data_create(16, NULL);
        if (!md) { rc = skv_error(SKV_ENOMEM, "tokenizer: out of memory"); break; }
        next.n = 0;
        for (int j = 0; j < cur.n && !rc; j++) rc = split_piece(p->re[i], md, text, cur.s[j].off, cur.s[j].len, &next);
        if (rc) break;
        span_list t = cur;
        cur = next;
        next = t;
    }
    pcre2_match_data_free(md);
    free(next.s);
    if (rc) {
        free(cur.s);
        return rc;
    }
    if (!cur.s && !(cur.s = malloc(sizeof *cur.s))) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
    *spans = cur.s;
    *n = cur.n;
    return 0;
}
