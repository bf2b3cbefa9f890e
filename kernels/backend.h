/* backend.h: the backend table, one axis of skv: where the math runs.
 *
 * A backend is one `const skv_backend` of function pointers. The engine (the
 * forward pass) and the KV policies reach the math only through it: the
 * quantized matmul, RMSNorm, RoPE, SwiGLU, attention over a set of rows, the
 * SVD and the chunk stages of the sparse policies. The CPU backend
 * (kernels/cpu/backend_cpu.c) is the reference every other backend is tested
 * against, op by op; a CUDA backend is one more folder (kernels/cuda/) and one
 * more line in the registry (kernels/backend.c).
 *
 * Buffers: `alloc`/`free` give memory the backend computes on (host memory
 * for the CPU), `upload`/`download` copy between it and the host. Every op
 * takes pointers of the backend's own memory. The CPU backend's are plain
 * host pointers, so today's callers pass host arrays.
 *
 * Index bookkeeping that runs on the host whatever the backend (the chunk
 * cache's hit/miss table, ranking for probes, the offload store's counters)
 * is not in the table: it lives in kernels/cpu/shadowkv_ops.h and is shared. */
#ifndef SKV_BACKEND_H
#define SKV_BACKEND_H

#include "ggml_type.h"
#include "rope.h"

#include <stddef.h>
#include <stdint.h>

/* Scratch an op may grow and reuse between calls (dequantized weight
 * blocks for the batched matmul). Owned by the caller; free with
 * skv_workspace_free. */
typedef struct {
    float *buf;
    size_t len;              /* floats allocated */
    uint8_t *qbuf;           /* the int8 matmul's packed activations */
    size_t qlen;             /* bytes allocated */
} skv_workspace;

void skv_workspace_free(skv_workspace *ws);

/* A weight prepared by weight_load for matmul, embed and the vector ops:
 * the CPU uses the model's own stored blocks (no copy); a device backend
 * holds a copy in its memory (CUDA: matrices in BF16, vectors in fp32). */
typedef struct {
    enum ggml_type type;     /* the type the ops see */
    const void *data;        /* in the backend's memory */
    void *owned;             /* what weight_free releases (NULL: nothing) */
} skv_weight;

/* One span of a device backend's timeline: an op that ran on one of its
 * streams, timed by the device (CUDA events), in seconds on the host clock
 * (skv_now). */
typedef struct {
    int stream;              /* 0 compute, 1 fetch (the copy stream) */
    const char *op;          /* a static string */
    int layer, step;         /* the tag set when the op was queued */
    double t0, t1;
} skv_span;

/* One sequence of a batched decode step (kv_store_batch,
 * attend_decode_batch): its cache of one layer, head-major as kv_store
 * fills it (KV head kh's row p at k + kh*head_stride + p*d), and the step's
 * token's position. */
typedef struct {
    void *k, *v;             /* float for the f32 ops, uint16_t (IEEE half) for the _h ones; the backend's memory */
    size_t head_stride;      /* elements from one KV head's rows to the next's */
    int pos;                 /* the token's row: the store writes it, attention reads rows 0..pos */
} skv_kv_seq;

typedef struct sk_step sk_step; /* a batched ShadowKV step (kernels/cpu/shadowkv_ops.h) */

/* The element type of a buffer ShadowKV's ops write (sk_gather_chunks,
 * pack_h): f32, or 16 bits rounded to nearest even (km_f32_to_bf16, IEEE
 * half). ShadowKV keeps U and the offloaded values in bf16, the landmarks
 * in IEEE half. */
enum { SKV_ELT_F32 = 0, SKV_ELT_BF16 = 1, SKV_ELT_F16 = 2 };

typedef struct skv_backend {
    const char *name;        /* "cpu", "cuda": what --backend takes */
    const char *summary;     /* one line for skv info --backends */
    /* 1 when the backend can run on this machine; otherwise 0 and a reason
     * (no device, driver missing) in why. */
    int (*available)(char *why, size_t n);

    /* ---- buffers ------------------------------------------------------- */
    void *(*alloc)(size_t bytes);        /* zeroed; NULL when out of memory */
    void (*free)(void *p);
    void (*upload)(void *dst, const void *host_src, size_t bytes);
    void (*download)(void *host_dst, const void *src, size_t bytes);

    /* Copies bytes within the backend's memory. */
    void (*copy)(void *dst, const void *src, size_t bytes);
    /* Copies height rows of width bytes, rows dpitch and spitch bytes apart;
     * either side may be the backend's memory or host_alloc's. */
    void (*copy2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height);
    /* Host memory the backend's gather can read directly (ShadowKV's offload
     * store): plain memory on the CPU, pinned and mapped for CUDA. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    /* host_alloc without the zeroing (contents undefined; host_free frees
     * it): for memory written whole before it is read. NULL: host_alloc. */
    void *(*host_alloc_raw)(size_t bytes);
    /* Starts pinning about bytes in the background for a host_alloc(_raw)
     * to come, which takes the block (waiting for it if need be) when it
     * fits: n to n + n/4 bytes. Pinning runs near 1 GB/s, so a policy that
     * knows its store's size early (ShadowKV, at the prompt's start)
     * overlaps it with the prefill. NULL: allocation is cheap (the CPU). */
    void (*host_reserve)(size_t bytes);
    /* Gives back the pinned memory host_free kept for reuse (the next
     * host_alloc pins anew): for a caller done with one kind of sequence
     * before another takes the host's memory (a bench moving to its next
     * policy). Waits for the queued work. NULL: nothing is kept (the CPU). */
    void (*host_trim)(void);
    /* Waits until the queued work is done (NULL: every op is synchronous). */
    void (*sync)(void);

    /* ---- weights ---------------------------------------------------------- */
    /* Makes the (rows, cols) tensor stored as type t at host usable by the
     * ops; rows == 1 is a vector (a norm or a bias), kept in fp32. 0, or
     * SKV_ENOMEM / SKV_EUNSUPPORTED with a message. */
    int (*weight_load)(enum ggml_type t, const void *host, int rows, int cols, skv_weight *w);
    void (*weight_free)(skv_weight *w);

    /* ---- the forward pass ---------------------------------------------- */
    /* y (n, rows) = x (n, cols) · Wᵀ, W (rows, cols) stored as type t (any
     * type quant_supported accepts). n == 1 is the decode matvec. */
    void (*matmul)(enum ggml_type t, const void *W, int rows, int cols, const float *x, int n, float *y,
                   skv_workspace *ws);
    /* y_i (n, rows[i]) = x (n, cols) · W_iᵀ for k <= 4 matrices that read the
     * same x (the Q, K and V projections; gate and up): each y_i as matmul
     * gives it, the decode matvecs in one pass of the threads over all rows. */
    void (*matmul_k)(int k, const enum ggml_type *t, const void *const *W, const int *rows, int cols, const float *x,
                     int n, float *const *y, skv_workspace *ws);
    /* x (n, dim): rows ids[i] of the embedding table (vocab, dim) of type t. */
    void (*embed)(enum ggml_type t, const void *table, int dim, const int32_t *ids, int n, float *x);
    /* out (n, dim) = x / rms(x) * w per row. out may be x. */
    void (*rmsnorm)(float *out, const float *x, const float *w, int n, int dim, float eps);
    /* Rotates x (n, n_heads*head_dim), row i at position pos0 + i. */
    void (*rope)(const rope_ctx *r, float *x, int n, int n_heads, int pos0);
    /* y (n, width) += b (width) per row. */
    void (*add_bias)(float *y, const float *b, int n, int width);
    /* y (len) += x (len): the residual stream. */
    void (*add)(float *y, const float *x, size_t len);
    /* gate (len) = silu(gate) * up. */
    void (*swiglu)(float *gate, const float *up, size_t len);
    /* The fused forms the forward pass runs (each gives what the calls it
     * replaces give; a device runs each as one launch where it can):
     * x (n, dim) += y (n, dim), then out (n, dim) = x / rms(x) * w per row:
     * add then rmsnorm. out may be x or y. */
    void (*add_rmsnorm)(float *x, const float *y, float *out, const float *w, int n, int dim, float eps);
    /* Rotates q (n, n_heads*head_dim) and k (n, n_kv*head_dim), row i at
     * position pos[i] (pos: a host array of n) or, pos NULL, pos0 + i; k_pre
     * (n, n_kv*head_dim), when not NULL, first gets k's rows unrotated: a
     * copy of k, then rope on q and on k. */
    void (*rope_qk)(const rope_ctx *r, float *q, int n_heads, float *k, int n_kv, float *k_pre, int n, int pos0,
                    const int *pos);
    /* gate (n, rows) = silu(x · Wgᵀ) * (x · Wuᵀ), Wg and Wu (rows, cols)
     * stored as tg and tu: matmul_k of the two, then swiglu. up (n, rows) is
     * scratch: what it holds after is not defined. */
    void (*matmul_swiglu)(enum ggml_type tg, const void *Wg, enum ggml_type tu, const void *Wu, int rows, int cols,
                          const float *x, int n, float *gate, float *up, skv_workspace *ws);

    /* ---- attention ------------------------------------------------------- */
    /* Exact attention of one query head over a set of n rows:
     * out (d) = softmax(q·Kᵀ·scale) V, K and V rows stride floats apart. */
    void (*attend_rows)(const float *q, const float *K, const float *V, int n, int d, int stride, float scale,
                        float *out);
    /* Exact attention of the g query heads q (g, d) that share one KV head,
     * over its n rows (K and V rows stride values apart, of type elt:
     * SKV_ELT_F32, or SKV_ELT_BF16, widened exactly as read; ShadowKV's
     * rows): each row is read once for the whole group. With m and l NULL,
     * out (g, d) is the normalized attention output. Otherwise a partial
     * result for attend_merge (flash-decoding: the rows split over threads):
     * out gets Σ_j e^(s_j−m) V_j unnormalized, m (g) the max score, l (g)
     * Σ_j e^(s_j−m). */
    void (*attend_group)(const float *q, int g, const void *K, const void *V, int elt, int n, int d, int stride,
                         float scale, float *out, float *m, float *l);
    /* out (g, d): the attention over all rows from `parts` partial results of
     * attend_group, part p at o + p*g*d, m + p*g, l + p*g. */
    void (*attend_merge)(int parts, int g, int d, const float *o, const float *m, const float *l, float *out);
    /* Exact causal attention of nq queries q (nq, n_heads*d) at positions
     * pos.. over rows 0..pos+nq-1 of K and V: KV head kh's rows start at
     * K + kh*head_stride, rows stride floats apart (head_stride d and stride
     * n_kv_heads*d: the heads side by side in a row; head_stride cap*d and
     * stride d: head-major); out (nq, n_heads*d). */
    void (*attend_causal)(const float *q, int nq, int pos, int n_heads, int n_kv_heads, int d, const float *K,
                          const float *V, int stride, size_t head_stride, float *out);

    /* Stores n rows of src (n, n_kv*d), positions pos.., into a head-major
     * cache: KV head kh's row p at cache + kh*head_stride + p*d. */
    void (*kv_store)(float *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src);
    /* Decode attention: one query per head q (n_heads, d) over rows
     * 0..rows-1 of every KV head (K and V as in attend_causal), each KV head's
     * rows read once for its GQA group and split over the threads (or thread
     * blocks) with partial results merged (flash-decoding). out (n_heads, d).
     * 0 or SKV_ENOMEM. */
    int (*attend_decode)(const float *q, int n_heads, int n_kv, int d, const float *K, const float *V, int rows,
                         int stride, size_t head_stride, float *out);

    /* The same three over a half-precision (IEEE binary16) cache, the dense
     * policy's --f16-kv: rows stored rounded to nearest even, the math in
     * f32 on the widened values (the same bits as the f32 ops give on
     * them). NULL on a backend without them. */
    void (*kv_store_h)(uint16_t *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src);
    int (*attend_decode_h)(const float *q, int n_heads, int n_kv, int d, const uint16_t *K, const uint16_t *V,
                           int rows, int stride, size_t head_stride, float *out);
    void (*attend_causal_h)(const float *q, int nq, int pos, int n_heads, int n_kv_heads, int d, const uint16_t *K,
                            const uint16_t *V, int stride, size_t head_stride, float *out);

    /* A decode step of n sequences at once (the dense policy's batch; n may
     * be 1): seq is a host array of the sequences' caches (pointers into the
     * backend's memory). kv_store_batch stores row i of k and v (n, n_kv*d)
     * at row seq[i].pos of sequence i's cache, as kv_store would;
     * attend_decode_batch gives out (n, n_heads*d), row i attend_decode's
     * result for query row i of q (n, n_heads*d) over rows 0..seq[i].pos
     * of sequence i's cache (rows d apart), 0 or SKV_E*. A device runs
     * each as one launch for the whole batch, whatever the heads (CUDA: up
     * to 64 sequences a launch); the CPU runs the per-sequence ops in turn,
     * so it gives their bits. The _h forms take a half-precision cache
     * (kv_store_h, attend_decode_h). NULL on a backend without them. */
    void (*kv_store_batch)(const skv_kv_seq *seq, int n, int n_kv, int d, const float *k, const float *v);
    int (*attend_decode_batch)(const skv_kv_seq *seq, int n, int n_heads, int n_kv, int d, const float *q, float *out);
    void (*kv_store_batch_h)(const skv_kv_seq *seq, int n, int n_kv, int d, const float *k, const float *v);
    int (*attend_decode_batch_h)(const skv_kv_seq *seq, int n, int n_heads, int n_kv, int d, const float *q,
                                 float *out);

    /* ---- sparse-policy stages (shapes as in kernels/cpu/shadowkv_ops.h) -- */
    /* Truncated SVD K (s, n) ≈ U (s, r) · SVt (r, n); Vt may be NULL; sv gets
     * all min(s, n) singular values. 0 or SKV_E* with a message. */
    int (*svd)(const float *K, int s, int n, int r, float *U, float *SVt, float *Vt, float *sv, float *rel_err);
    /* lm (n_chunks, d): mean of each chunk's c key rows (rows stride apart). */
    void (*landmarks)(const float *K, int stride, int d, int c, int n_chunks, float *lm);
    /* cos_min (n_chunks): min over a chunk's keys of cos(landmark, key). */
    void (*cos_min)(const float *K, int stride, int d, int c, int n_chunks, const float *lm, float *cos_min);
    /* score (n_lm): per query head softmax over landmarks, summed over the nq
     * positions, max over the group. lm (n_lm, d) in IEEE half, widened as
     * read. tmp: (2*group*n_lm). */
    void (*score)(const float *q, int nq, size_t q_stride, int group, int d, const uint16_t *lm, int n_lm,
                  float scale, float *tmp, float *score);
    /* The min(k, n) best indices of score, best first; returns the count. */
    int (*topk)(const float *score, int n, int k, int *idx);
    /* Copies n blocks of `rows` rows of `cols` bf16 values: block
     * src_idx[i] of src (blocks back to back; ShadowKV's offload store) to
     * dst + dst_off[i] values of type dst_elt (SKV_ELT_F32: widened;
     * SKV_ELT_BF16: as they are), rows dst_stride values apart. */
    void (*gather)(const uint16_t *src, int rows, int cols, const int *src_idx, int n, void *dst, int dst_elt,
                   const size_t *dst_off, int dst_stride);
    /* y (n) = each float of x rounded to nearest even into 16 bits of type
     * elt (SKV_ELT_BF16, or SKV_ELT_F16: IEEE half, past its range ±inf,
     * subnormals kept): ShadowKV's U (shadowkv_pack on the CPU). */
    void (*pack_h)(const float *x, size_t n, uint16_t *y, int elt);
    /* ShadowKV's candidate chunks of a layer, every KV head in one call: for
     * kh < h, i < n_cand, t < rows, j < d,
     *   dst[kh*dst_head + (i*rows + t)*d + j] =
     *     src[kh*src_head + (cand[kh*n_cand + i]*rows + t)*src_row + j]
     * stored as dst_elt (SKV_ELT_*: f32, or rounded to bf16 or half; the
     * landmarks: half, rows 1; the offloaded values: bf16, rows a chunk; the
     * outliers and the local window: ShadowKV's row type). src and cand in
     * the backend's memory; dst there or in
     * host_alloc's; dst_head in elements. */
    void (*sk_gather_chunks)(const float *src, size_t src_row, size_t src_head, const int *cand, int h, int n_cand,
                             int rows, int d, void *dst, size_t dst_head, int dst_elt);
    /* out (n, d): RoPE(U[t0+i] · svt) at position t0+i, U (s, r) in bf16
     * (widened, the sums in f32), with RoPE tables cs/sn (or NULL for
     * rope_apply); stored as out_elt (SKV_ELT_F32, or SKV_ELT_BF16 rounded
     * to nearest even from the f32 result). */
    void (*rebuild)(const uint16_t *U, int r, const float *svt, int d, int t0, int n, const rope_ctx *rope,
                    const float *cs, const float *sn, void *out, int out_elt);
    /* ShadowKV's decode of a layer with its books in the backend's memory
     * (kernels/cpu/shadowkv_ops.h has the shapes and the CPU twins): the
     * chunk caches of every KV head take their selections (sk_books); the
     * misses' values come from the offload store (host_alloc's memory; on
     * a device, its fetch stream) and their keys are rebuilt, every head's
     * in one call each; the store and U in bf16, widened as read. V and K
     * are host arrays of h pointers to the heads' rows, bf16 (the values
     * copied as stored, the keys rounded from f32). NULL on a backend
     * without them (the engine then keeps the books on the host). */
    void (*sk_books)(int h, int k, int n_cand, const int *sel, int *slot_id, int *where, unsigned *stamp,
                     unsigned *epoch, int *slot_of, int *miss, int *n_miss);
    void (*sk_gather_misses)(const uint16_t *store, int c, int d, int h, int k, int n_cand, size_t blk0,
                             const int *sel, const int *slot_of, const int *miss, const int *n_miss,
                             uint16_t *const *V, int row_slot);
    void (*sk_rebuild_misses)(const uint16_t *U, int r, const float *SVt, int d, int c, int h, int k, int n_cand,
                              const int *cand, const int *sel, const int *slot_of, const int *miss, const int *n_miss,
                              const rope_ctx *rope, const float *cs, const float *sn, uint16_t *const *K,
                              int row_slot);
    /* ShadowKV's decode step of a layer for a whole batch (kernels/cpu/
     * shadowkv_ops.h: sk_step, its job table of every (sequence, KV head),
     * and the CPU twins shadowkv_step_*): on a device one launch each,
     * whatever the batch or the heads; fetch on the fetch stream, the others
     * on the compute stream. NULL on a backend without them, the CPU's too
     * (the engine then runs each sequence's layer alone; the twins are for
     * the tests, and a backend that copies the CPU's table does not take
     * them by accident). append rotates q in place when st->rope_new;
     * select is the statistics, top-k and books in one launch. */
    void (*sk_step_append)(const sk_step *st, float *q, const float *k, const float *v);
    void (*sk_step_logits)(const sk_step *st, const float *q);
    void (*sk_step_select)(const sk_step *st);
    void (*sk_step_fetch)(const sk_step *st);
    void (*sk_step_rebuild)(const sk_step *st);
    void (*sk_step_attend)(const sk_step *st, const float *q, float *out);
    /* y (n) = V_r·(V_rᵀ·x) for Vt (r, n); coef (r) scratch; y may be x. */
    void (*project)(const float *Vt, int r, int n, const float *x, float *y, float *coef);
    /* Page bounds (Quest, FreeKV): min/max of the keys t0..t0+n-1 into rows
     * t/p of mn, mx (kernels/cpu/page_ops.h), and the bound of q·k per page. */
    void (*page_bounds)(const float *K, int stride, int d, int p, int t0, int n, float *mn, float *mx, int bstride);
    void (*page_score)(const float *q, int d, const float *mn, const float *mx, int bstride, int n_pages, float *U);
    /* One KIVI group (SpeCache, TailorKV): n values x[i*stride] quantized to
     * `bits` and decoded into y (kernels/cpu/kivi.h). */
    void (*kivi)(const float *x, int n, int stride, int bits, int midpoint, float *y, uint8_t *codes, float *scale,
                 float *zero);

    /* Free and total bytes of the backend's own memory (a device's); NULL on
     * the CPU, whose memory is the host's (skv bench --max-parallel then
     * fits a batch in two pools). 0 or SKV_E*. */
    int (*mem_info)(size_t *free_bytes, size_t *total_bytes);
    /* The most bytes of alloc's buffers live at once since the last reset;
     * reset: start again from the bytes live now (returned). What making
     * a sequence holds at its peak (a fork replays a prefill dense before
     * it compresses), beside what it keeps. On the CPU, whose memory is the
     * process's, the resident bytes and their high-water mark (Linux's
     * VmRSS and VmHWM; 0 where /proc cannot tell). */
    size_t (*mem_peak)(int reset);

    /* ---- timeline (device backends; NULL on the CPU, whose ops the engine
     * times with the host clock) ---- */
    /* Tags the ops queued from now on with a layer and decode step. */
    void (*span_tag)(int layer, int step);
    /* on: record a span per op from now on (off: none, no cost). */
    void (*span_enable)(int on);
    /* The spans finished since the last call, at most max, oldest first;
     * returns their count (call after sync). */
    int (*span_drain)(skv_span *out, int max);

    /* ---- a decode step as one unit (device backends; NULL on the CPU) ----
     * The forward calls step_begin before it queues a decode step's ops and
     * step_end after the last of them (the logits' copy), before the step's
     * sync, on an error path too. A device may record the ops between them
     * and run them at step_end as one unit (CUDA: a graph, one launch a
     * step). An op between them that needs the host (an allocation, a free,
     * a wait) still works: the device then runs what it recorded and the
     * rest of the step op by op. */
    void (*step_begin)(void);
    void (*step_end)(void);
} skv_backend;

/* ---- registry ------------------------------------------------------------ */

extern const skv_backend skv_backend_cpu;

/* Backends built into this binary, in registry order; the first is the CPU
 * reference, the default. */
int skv_backend_count(void);
const skv_backend *skv_backend_at(int i);

/* The backend called name; NULL with a message listing the known names. */
const skv_backend *skv_backend_find(const char *name);

/* The backend to run on for name (NULL: the default). A backend that is
 * built but cannot run here (no device) falls back to the CPU with a
 * one-line notice in notice (empty otherwise). NULL with a message for an
 * unknown name. */
const skv_backend *skv_backend_pick(const char *name, char *notice, size_t n);

#endif
