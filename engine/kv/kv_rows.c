/* kv_rows.c: the host row store of the CPU peer policies and the oracle. */
#include "kv_rows.h"
#include "skv.h"

#include <stdlib.h>
#include <string.h>

static float **member(const kv_rows *s, int layer, int i) {
    return (float **)(s->layers + (size_t)layer * s->stride + s->arr[i].member);
}

static size_t row_bytes(const kv_rows *s) {
    return (size_t)s->shape->n_kv_heads * s->shape->head_dim * sizeof(float);
}

static int is_page(const kv_rows *s, int i) {
    return s->arr[i].kind == KV_ROWS_PAGE_MIN || s->arr[i].kind == KV_ROWS_PAGE_MAX;
}

void kv_rows_init(kv_rows *s, const char *who, const kv_shape *shape, void *layers, size_t stride,
                  const kv_rows_array *arr, int n_arr, int page) {
    memset(s, 0, sizeof *s);
    s->who = who;
    s->shape = shape;
    s->page = page > 0 ? page : 1;
    s->layers = layers;
    s->stride = stride;
    s->n_arr = n_arr < KV_ROWS_ARRAYS ? n_arr : KV_ROWS_ARRAYS;
    memcpy(s->arr, arr, sizeof *arr * (size_t)s->n_arr);
}

/* Room for need positions in every array of every layer. A failed realloc
 * leaves that array as it was, so a later call may try again. */
static int grow(kv_rows *s, int need) {
    if (need <= s->cap) return 0;
    int cap, rc = kv_grow_cap(s->who, s->cap, need, s->shape->max_ctx, &cap);
    if (rc) return rc;
    for (int l = 0; l < s->shape->n_layers; l++)
        for (int i = 0; i < s->n_arr; i++) {
            size_t rows = (size_t)(is_page(s, i) ? (cap + s->page - 1) / s->page : cap);
            float **m = member(s, l, i), *p = realloc(*m, row_bytes(s) * rows);
            if (!p) return skv_error(SKV_ENOMEM, "%s: out of memory for %d positions", s->who, cap);
            *m = p;
        }
    s->cap = cap;
    return 0;
}

int kv_rows_append(kv_rows *s, int layer, int pos, int n, const float *k, const float *v) {
    int rc = grow(s, pos + n);
    if (rc) return rc;
    int d = s->shape->head_dim, kvd = s->shape->n_kv_heads * d;
    size_t off = (size_t)pos * kvd, len = row_bytes(s) * (size_t)n;
    float *keys = NULL, *mn = NULL, *mx = NULL;
    for (int i = 0; i < s->n_arr; i++) {
        float *a = *member(s, layer, i);
        switch (s->arr[i].kind) {
        case KV_ROWS_KEYS:
            memcpy(a + off, k, len);
            keys = a;
            break;
        case KV_ROWS_VALUES: memcpy(a + off, v, len); break;
        case KV_ROWS_PAGE_MIN: mn = a; break;
        case KV_ROWS_PAGE_MAX: mx = a; break;
        }
    }
    const skv_backend *be = s->shape->be ? s->shape->be : &skv_backend_cpu;
    if (keys && mn && mx)
        for (int kh = 0; kh < s->shape->n_kv_heads; kh++)
            be->page_bounds(keys + (size_t)kh * d, kvd, d, s->page, pos, n, mn + (size_t)kh * d, mx + (size_t)kh * d,
                            kvd);
    if (layer == 0 && pos + n > s->n) s->n = pos + n;
    return 0;
}

int kv_rows_check(const kv_rows *s, int layer, int pos, int n) {
    if (pos + n > s->n || pos < 0)
        return skv_error(SKV_EINVAL, "%s: layer %d attends up to position %d, only %d stored", s->who, layer,
                         pos + n - 1, s->n);
    return 0;
}

void kv_rows_free(kv_rows *s) {
    for (int l = 0; s->layers && l < s->shape->n_layers; l++)
        for (int i = 0; i < s->n_arr; i++) {
            float **m = member(s, l, i);
            free(*m);
            *m = NULL;
        }
}
