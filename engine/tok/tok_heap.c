/* tok_heap.c: the binary heap of candidate merges that SentencePiece-style
 * and byte-level BPE share (tok_impl.h). */
#include "skv.h"
#include "tok_impl.h"

#include <stdlib.h>

static int before(const tok_cand *a, const tok_cand *b) {
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

int tok_heap_push(tok_heap *q, tok_cand c) {
    if (q->n == q->cap) {
        int cap = q->cap ? q->cap * 2 : 256;
        tok_cand *h = realloc(q->h, (size_t)cap * sizeof *h);
        if (!h) return skv_error(SKV_ENOMEM, "tokenizer: out of memory");
        q->h = h;
        q->cap = cap;
    }
    int i = q->n++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!before(&c, &q->h[p])) break;
        q->h[i] = q->h[p];
        i = p;
    }
    q->h[i] = c;
    return 0;
}

tok_cand tok_heap_pop(tok_heap *q) {
    tok_cand top = q->h[0], last = q->h[--q->n];
    int i = 0, n = q->n;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && before(&q->h[c + 1], &q->h[c])) c++;
        if (!before(&q->h[c], &last)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (n) q->h[i] = last;
    return top;
}

void tok_heap_free(tok_heap *q) {
    free(q->h);
    q->h = NULL;
    q->n = q->cap = 0;
}
