/* cuda_ops.h: the CUDA backend's ops, with C linkage, as the table in
 * backend_cuda.c lists them. Each is defined in a .cu file of this folder
 * (backend_cuda.cu: buffers and the timeline; ops_forward.cu; ops_attention.cu;
 * ops_sparse.cu) and follows the contract of the table's field of the same
 * name in kernels/backend.h, on device memory. */
#ifndef SKV_CUDA_OPS_H
#define SKV_CUDA_OPS_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* backend_cuda.cu */
int cu_available(char *why, size_t n);
void *cu_alloc(size_t bytes);
int cu_mem_info(size_t *free_bytes, size_t *total_bytes);
size_t cu_mem_peak(int reset);
void cu_free(void *p);
void cu_upload(void *dst, const void *host_src, size_t bytes);
void cu_download(void *host_dst, const void *src, size_t bytes);
void cu_copy(void *dst, const void *src, size_t bytes);
void cu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height);
void *cu_host_alloc(size_t bytes);
void *cu_host_alloc_raw(size_t bytes);
void cu_host_reserve(size_t bytes);
void cu_host_trim(void);
void cu_host_free(void *p);
void cu_sync(void);
void cu_span_tag(int layer, int step);
void cu_span_enable(int on);
int cu_span_drain(skv_span *out, int max);
void cu_step_begin(void);
void cu_step_end(void);
/* The decode step's graphs (backend_cuda.cu): on (default; SKV_CUDA_GRAPH=0
 * in the environment turns them off) or off from the next step; returns the
 * setting before (-1: not read yet). For tests and comparisons. */
int cu_graph_set(int on);
/* What the step graphs did since the process began: steps launched as one
 * graph, of them the ones whose graph was updated in place or instantiated
 * anew, and the steps a call that cannot be captured broke. */
typedef struct {
    unsigned long long steps, updates, instantiations, breaks;
} cu_graph_stats;
void cu_graph_stats_get(cu_graph_stats *out);
/* ops_forward.cu */
void cu_matmul(enum ggml_type t, const void *W, int rows, int cols, const float *x, int n, float *y,
               skv_workspace *ws);
void cu_matmul_k(int k, const enum ggml_type *t, const void *const *W, const int *rows, int cols, const float *x,
                 int n, float *const *y, skv_workspace *ws);
void cu_embed(enum ggml_type t, const void *table, int dim, const int32_t *ids, int n, float *x);
void cu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps);
void cu_rope(const rope_ctx *r, float *x, int n, int n_heads, int pos0);
void cu_add_bias(float *y, const float *b, int n, int width);
void cu_add(float *y, const float *x, size_t len);
void cu_swiglu(float *gate, const float *up, size_t len);
void cu_add_rmsnorm(float *x, const float *y, float *out, const float *w, int n, int dim, float eps);
void cu_rope_qk(const rope_ctx *r, float *q, int n_heads, float *k, int n_kv, float *k_pre, int n, int pos0,
                const int *pos);
void cu_matmul_swiglu(enum ggml_type tg, const void *Wg, enum ggml_type tu, const void *Wu, int rows, int cols,
                      const float *x, int n, float *gate, float *up, skv_workspace *ws);
void cu_kv_store(float *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src);
void cu_kv_store_h(uint16_t *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src);
int cu_attend_decode_h(const float *q, int n_heads, int n_kv, int d, const uint16_t *K, const uint16_t *V, int rows,
                       int stride, size_t head_stride, float *out);
void cu_attend_causal_h(const float *q, int nq, int pos, int n_heads, int n_kv_heads, int d, const uint16_t *K,
                        const uint16_t *V, int stride, size_t head_stride, float *out);
int cu_weight_load(enum ggml_type t, const void *host, int rows, int cols, skv_weight *w);
void cu_weight_free(skv_weight *w);
/* ops_attention.cu */
void cu_attend_rows(const float *q, const float *K, const float *V, int n, int d, int stride, float scale,
                    float *out);
void cu_attend_group(const float *q, int g, const void *K, const void *V, int elt, int n, int d, int stride,
                     float scale, float *out, float *m, float *l);
void cu_attend_merge(int parts, int g, int d, const float *o, const float *m, const float *l, float *out);
int cu_attend_decode(const float *q, int n_heads, int n_kv, int d, const float *K, const float *V, int rows,
                     int stride, size_t head_stride, float *out);
void cu_attend_causal(const float *q, int nq, int pos, int n_heads, int n_kv_heads, int d, const float *K,
                      const float *V, int stride, size_t head_stride, float *out);
void cu_kv_store_batch(const skv_kv_seq *seq, int n, int n_kv, int d, const float *k, const float *v);
void cu_kv_store_batch_h(const skv_kv_seq *seq, int n, int n_kv, int d, const float *k, const float *v);
int cu_attend_decode_batch(const skv_kv_seq *seq, int n, int n_heads, int n_kv, int d, const float *q, float *out);
int cu_attend_decode_batch_h(const skv_kv_seq *seq, int n, int n_heads, int n_kv, int d, const float *q,
                             float *out);
/* ops_sparse.cu */
int cu_svd(const float *K, int s, int n, int r, float *U, float *SVt, float *Vt, float *sv, float *rel_err);
void cu_landmarks(const float *K, int stride, int d, int c, int n_chunks, float *lm);
void cu_cos_min(const float *K, int stride, int d, int c, int n_chunks, const float *lm, float *cos_min);
void cu_score(const float *q, int nq, size_t q_stride, int group, int d, const uint16_t *lm, int n_lm, float scale,
              float *tmp, float *score);
int cu_topk(const float *score, int n, int k, int *idx);
void cu_gather(const uint16_t *src, int rows, int cols, const int *src_idx, int n, void *dst, int dst_elt,
               const size_t *dst_off, int dst_stride);
void cu_pack_h(const float *x, size_t n, uint16_t *y, int elt);
void cu_sk_gather_chunks(const float *src, size_t src_row, size_t src_head, const int *cand, int h, int n_cand,
                         int rows, int d, void *dst, size_t dst_head, int dst_elt);
void cu_rebuild(const uint16_t *U, int r, const float *svt, int d, int t0, int n, const rope_ctx *rope, const float *cs,
                const float *sn, void *out, int out_elt);
void cu_sk_books(int h, int k, int n_cand, const int *sel, int *slot_id, int *where, unsigned *stamp, unsigned *epoch,
                 int *slot_of, int *miss, int *n_miss);
void cu_sk_gather_misses(const uint16_t *store, int c, int d, int h, int k, int n_cand, size_t blk0, const int *sel,
                         const int *slot_of, const int *miss, const int *n_miss, uint16_t *const *V, int row_slot);
void cu_sk_rebuild_misses(const uint16_t *U, int r, const float *SVt, int d, int c, int h, int k, int n_cand,
                          const int *cand, const int *sel, const int *slot_of, const int *miss, const int *n_miss,
                          const rope_ctx *rope, const float *cs, const float *sn, uint16_t *const *K,
                          int row_slot);
void cu_project(const float *Vt, int r, int n, const float *x, float *y, float *coef);
/* ops_sk_step.cu */
void cu_sk_step_append(const sk_step *st, float *q, const float *k, const float *v);
void cu_sk_step_logits(const sk_step *st, const float *q);
void cu_sk_step_select(const sk_step *st);
void cu_sk_step_fetch(const sk_step *st);
void cu_sk_step_rebuild(const sk_step *st);
void cu_sk_step_attend(const sk_step *st, const float *q, float *out);
void cu_page_bounds(const float *K, int stride, int d, int p, int t0, int n, float *mn, float *mx, int bstride);
void cu_page_score(const float *q, int d, const float *mn, const float *mx, int bstride, int n_pages, float *U);
void cu_kivi(const float *x, int n, int stride, int bits, int midpoint, float *y, uint8_t *codes, float *scale,
             float *zero);


#ifdef __cplusplus
}
#endif

#endif
