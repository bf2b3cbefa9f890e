/* tok_spm.c: SentencePiece-style BPE by scores (GGUF "llama").
 *
 * Spaces become U+2581 (and one is put in front when asked). The text starts
 * as one symbol per UTF-8 character; the adjacent pair whose concatenation
 * is a token with the highest score is merged (ties: leftmost first) until
 * no concatenation is a token. Symbols are byte ranges of the escaped text in
 * a linked list, candidates wait in a binary heap and are checked for
 * staleness when popped: O(n log n) for n characters. A symbol left that is
 * not a token is emitted as its bytes' <0xNN> tokens (byte fallback). */
#include "tok_impl.h"
#include "skv.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *text;
    uint32_t *start, *n;     /* (symbols) byte range in text; n == 0 once merged away */
    int32_t *prev, *next;
    tok_heap q;              /* key: -score; a: the pair's byte size */
} spm_work;

/* Queues the pair (a, b) when their concatenation is a token. */
static int try_pair(const tok_vocab *v, spm_work *w, int a, int b) {
    if (a < 0 || b < 0) return 0;
    uint32_t size = w->n[a] + w->n[b];
    int id = tok_find(v, w->text + w->start[a], size);
    if (id < 0 || id >= v->n_vocab) return 0;
    return tok_heap_push(&w->q, (tok_cand){-(double)v->score[id], a, b, (int32_t)size, 0, 0});
}

/* Character length from the lead byte's high nibble, as SentencePiece and
 * llama.cpp count it (a stray continuation byte is one character). */
static int char_len(unsigned char c) {
    static const unsigned char t[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return t[c >> 4];
}

int tok_spm_fragment(const tok_vocab *v, const char *text, size_t len, int prefix, tok_out *out) {
    size_t spaces = 0;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    size_t el = len + 2 * spaces + (prefix ? 3 : 0);
    char *e = malloc(el + 1);
    spm_work w = {0};
    w.start = malloc((el + 1) * sizeof *w.start);
    w.n = malloc((el + 1) * sizeof *w.n);
    w.prev = malloc((el + 1) * sizeof *w.prev);
    w.next = malloc((el + 1) * sizeof *w.next);
    int rc = 0;
    if (!e || !w.start || !w.n || !w.prev || !w.next) {
        rc = skv_error(SKV_ENOMEM, "tokenizer: out of memory");
        goto done;
    }
    size_t k = 0;
    if (prefix) { memcpy(e, "\xE2\x96\x81", 3); k = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(e + k, "\xE2\x96\x81", 3); k += 3; }
        else e[k++] = text[i];
    }
    w.text = e;
    int ns = 0;
    for (size_t i = 0; i < el;) {
        size_t l = (size_t)char_len((unsigned char)e[i]);
        if (l > el - i) l = el - i;
        w.start[ns] = (uint32_t)i;
        w.n[ns] = (uint32_t)l;
        w.prev[ns] = ns - 1;
        w.next[ns] = i + l < el ? ns + 1 : -1;
        ns++;
        i += l;
    }
    for (int i = 1; i < ns && !rc; i++) rc = try_pair(v, &w, i - 1, i);
    while (w.q.n && !rc) {
        tok_cand c = tok_heap_pop(&w.q);
        if (w.n[c.left] == 0 || w.n[c.right] == 0 || w.n[c.left] + w.n[c.right] != (uint32_t)c.a) continue;
        w.n[c.left] += w.n[c.right];
        w.n[c.right] = 0;
        int nx = w.next[c.right];
        w.next[c.left] = nx;
        if (nx >= 0) w.prev[nx] = c.left;
        rc = try_pair(v, &w, w.prev[c.left], c.left);
        if (!rc) rc = try_pair(v, &w, c.left, nx);
    }
    for (int i = ns ? 0 : -1; i >= 0 && !rc; i = w.next[i]) {
        int id = tok_find(v, e + w.start[i], w.n[i]);
        if (id >= 0 && id < v->n_vocab) {
            rc = tok_out_push(out, id);
            continue;
        }
        for (uint32_t j = 0; j < w.n[i] && !rc; j++) {
            int b = v->byte_tok[(unsigned char)e[w.start[i] + j]];
            if (b < 0) b = v->unk;
            if (b < 0) rc = skv_error(SKV_EFORMAT, "%s: no <0x%02X> byte token and no unknown token for byte fallback",
                                      v->src, (unsigned char)e[w.start[i] + j]);
            else rc = tok_out_push(out, b);
        }
    }
done:
    free(e);
    free(w.start);
    free(w.n);
    free(w.prev);
    free(w.next);
    tok_heap_free(&w.q);
    return rc;
}
