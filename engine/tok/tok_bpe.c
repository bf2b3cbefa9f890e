/* tok_bpe.c: byte-level BPE with ranked merges (GGUF "gpt2", HF "BPE").
 *
 * A fragment of plain text is cut into pieces by the pre-tokenizer; each
 * piece starts as one symbol per byte (the byte's GPT-2 stand-in character)
 * and the adjacent pair with the lowest merge rank is merged until no pair
 * is in the merge list (ties: leftmost first). Symbols are string ids and
 * live in a linked list; candidate pairs wait in a binary heap and are
 * checked for staleness when popped, so a piece of n bytes costs
 * O(n log n). A final symbol that is not a token is emitted byte by byte
 * as the one-character tokens of its text that exist, as llama.cpp does. */
#include "tok_impl.h"
#include "skv.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *id, *prev, *next;   /* (n) symbols of the current piece */
    int cap;
    tok_heap q;                   /* key: merge rank; a, b: the pair's ids; c: the merged id */
    char *enc;                    /* (4 * n) the piece in stand-in characters */
} bpe_work;

/* Queues the pair (a, b) when the merge list has it. */
static int add_pair(const tok_vocab *v, bpe_work *w, int a, int b) {
    if (a < 0 || b < 0) return 0;
    int32_t la = w->id[a], lb = w->id[b];
    if (la < 0 || lb < 0) return 0;
    int32_t res = -1, rank = tok_merge_find(v, la, lb, &res);
    return rank < 0 ? 0 : tok_heap_push(&w->q, (tok_cand){rank, a, b, la, lb, res});
}

static int reserve(bpe_work *w, int n) {
    if (n <= w->cap) return 0;
    int cap = n < 64 ? 64 : n;
    free(w->id);
    free(w->prev);
    free(w->next);
    free(w->enc);
    w->id = malloc((size_t)cap * sizeof *w->id);
    w->prev = malloc((size_t)cap * sizeof *w->prev);
    w->next = malloc((size_t)cap * sizeof *w->next);
    w->enc = malloc((size_t)cap * 4);
    w->cap = cap;
    if (!w->id || !w->prev || !w->next || !w->enc) {
        w->cap = 0;
        return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
    }
    return 0;
}

/* Appends the UTF-8 of byte b's stand-in to o; returns its length. */
static int stand_in(const tok_vocab *v, unsigned char b, char *o) {
    uint32_t cp = v->byte_cp[b];
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 63));
    return 2;
}

/* Emits a symbol that is not a token: each byte of its stand-in text that is
 * a one-byte token. */
static int emit_fallback(const tok_vocab *v, const char *s, size_t n, tok_out *out) {
    for (size_t i = 0; i < n; i++) {
        int id = tok_find(v, s + i, 1);
        if (id >= 0 && id < v->n_vocab) {
            int rc = tok_out_push(out, id);
            if (rc) return rc;
        }
    }
    return 0;
}

static int bpe_piece(const tok_vocab *v, bpe_work *w, const unsigned char *s, int n, tok_out *out) {
    int rc = reserve(w, n);
    if (rc) return rc;
    if (v->ignore_merges) {
        size_t el = 0;
        for (int i = 0; i < n; i++) el += (size_t)stand_in(v, s[i], w->enc + el);
        int id = tok_find(v, w->enc, el);
        if (id >= 0 && id < v->n_vocab) return tok_out_push(out, id);
    }
    for (int i = 0; i < n; i++) {
        w->id[i] = v->byte_sym[s[i]];
        w->prev[i] = i - 1;
        w->next[i] = i + 1 < n ? i + 1 : -1;
    }
    w->q.n = 0;
    for (int i = 1; i < n && !rc; i++) rc = add_pair(v, w, i - 1, i);
    while (w->q.n && !rc) {
        tok_cand c = tok_heap_pop(&w->q);
        if (w->id[c.left] != c.a || w->next[c.left] != c.right || w->id[c.right] != c.b) continue;
        w->id[c.left] = c.c;
        w->id[c.right] = -2;
        int nx = w->next[c.right];
        w->next[c.left] = nx;
        if (nx >= 0) w->prev[nx] = c.left;
        rc = add_pair(v, w, w->prev[c.left], c.left);
        if (!rc) rc = add_pair(v, w, c.left, nx);
    }
    for (int i = 0; i >= 0 && !rc; i = w->next[i]) {
        int id = w->id[i];
        if (id >= 0 && id < v->n_vocab) rc = tok_out_push(out, id);
        else if (id >= 0) rc = emit_fallback(v, v->text[id], v->len[id], out);
        else {
            char u[2];
            int k = stand_in(v, s[i], u);
            rc = emit_fallback(v, u, (size_t)k, out);
        }
    }
    return rc;
}

/* Copies text into a new buffer with every byte that does not start valid
 * UTF-8 replaced by U+FFFD (as llama.cpp does), so PCRE2 can skip its checks. */
static char *sanitize(const char *text, size_t len, size_t *out_len) {
    char *o = malloc(len * 3 + 1);
    if (!o) return NULL;
    size_t i = 0, k = 0;
    while (i < len) {
        size_t ok = tok_utf8_valid(text + i, len - i);
        memcpy(o + k, text + i, ok);
        k += ok;
        i += ok;
        if (i < len) {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        }
    }
    *out_len = k;
    return o;
}

int tok_bpe_fragment(const tok_vocab *v, const char *text, size_t len, tok_out *out) {
    char *own = NULL;
    if (v->prefix_space && len && text[0] != ' ') {
        own = malloc(len + 1);
        if (!own) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
        own[0] = ' ';
        memcpy(own + 1, text, len);
        text = own;
        len++;
    }
    if (tok_utf8_valid(text, len) != len) {
        size_t nl;
        char *s = sanitize(text, len, &nl);
        free(own);
        if (!s) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
        own = s;
        text = s;
        len = nl;
    }
    tok_span *sp;
    int n, rc = tok_pre_split(v->pre, text, len, &sp, &n);
    if (rc) {
        free(own);
        return rc;
    }
    bpe_work w = {0};
    for (int i = 0; i < n && !rc; i++)
        rc = bpe_piece(v, &w, (const unsigned char *)text + sp[i].off, (int)sp[i].len, out);
    free(w.id);
    free(w.prev);
    free(w.next);
    free(w.enc);
    tok_heap_free(&w.q);
    free(sp);
    free(own);
    return rc;
}
