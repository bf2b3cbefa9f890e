/* kv_rows.h: the host store of keys and values that the CPU peer policies
 * (Quest, FreeKV, SpeCache, TailorKV) and the oracle keep. Per layer it holds
 * a few arrays of rows; a row is one position's n_kv_heads*head_dim floats.
 * All the arrays grow together, doubling up to the context, as tokens are
 * appended.
 *
 * The arrays are float * members of the policy's own layer struct, named by
 * their offsets, so the policy reads them as L->k. The store allocates, grows,
 * fills and frees them. An array holds the appended keys, the appended values,
 * or a page summary (Quest and FreeKV): one row a page of `page` positions
 * from position 0, the min or the max of the page's keys by channel for each
 * KV head (the backend's page_bounds), updated with every append. */
#ifndef SKV_KV_ROWS_H
#define SKV_KV_ROWS_H

#include "kv.h"

#include <stddef.h>

typedef enum {
    KV_ROWS_KEYS,     /* the appended post-RoPE keys, a row a position */
    KV_ROWS_VALUES,   /* the appended values, a row a position */
    KV_ROWS_PAGE_MIN, /* a row a page: the min of its keys by channel */
    KV_ROWS_PAGE_MAX, /* a row a page: the max */
} kv_rows_kind;

typedef struct {
    size_t member;     /* offsetof(the policy's layer struct, a float * member) */
    kv_rows_kind kind;
} kv_rows_array;

#define KV_ROWS_ARRAYS 4

typedef struct {
    const char *who;          /* the policy's name, for messages */
    const kv_shape *shape;    /* the policy's: layers, heads, context; page_bounds runs on its backend
                                 (the CPU's when it has none) */
    int page;
    char *layers;             /* the policy's layer structs */
    size_t stride;            /* bytes from one to the next */
    int n_arr;
    kv_rows_array arr[KV_ROWS_ARRAYS];
    int cap;                  /* positions allocated in each array */
    int n;                    /* positions appended to layer 0 (the layers fill in turn) */
} kv_rows;

/* Sets up an empty store for shape (which must outlive it: the policy's
 * own): arrays arr[0..n_arr-1] (n_arr <= KV_ROWS_ARRAYS) in each of
 * shape->n_layers layer structs of stride bytes from layers. The page size
 * matters only for the page kinds (> 0 then). */
void kv_rows_init(kv_rows *s, const char *who, const kv_shape *shape, void *layers, size_t stride,
                  const kv_rows_array *arr, int n_arr, int page);

/* Stores the keys k and values v (n, kvd) at positions pos..pos+n-1 of layer
 * and updates its page summaries. 0, SKV_ERANGE past the context, or
 * SKV_ENOMEM (nothing stored). */
int kv_rows_append(kv_rows *s, int layer, int pos, int n, const float *k, const float *v);

/* The check that opens an attend of queries at pos..pos+n-1 in layer: 0, or
 * SKV_EINVAL with a message when they reach past what layer 0 holds. */
int kv_rows_check(const kv_rows *s, int layer, int pos, int n);

/* Frees the arrays (the layer structs must still be there). */
void kv_rows_free(kv_rows *s);

#endif
