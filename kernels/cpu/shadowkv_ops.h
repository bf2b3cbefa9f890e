/* shadowkv_ops.h: the stages of the ShadowKV method as pure functions on
 * plain arrays, so that each one can be tested against a brute force and
 * given a CUDA twin: truncated SVD of the pre-RoPE keys, chunk landmarks,
 * cosine minima, outlier choice, landmark scoring with the GQA max, top-k,
 * key rebuild with RoPE, the chunk cache's hit/miss bookkeeping and the
 * offload store whose every read is a counted fetch.
 *
 * Shapes: s tokens, n = kv_heads*head_dim columns of K, r the kept rank,
 * d the head dim, c tokens per chunk. Every buffer is caller-owned unless a
 * function says otherwise; nothing here allocates except the *_init calls. */
#ifndef SKV_SHADOWKV_OPS_H
#define SKV_SHADOWKV_OPS_H

#include "rope.h"

#include <stddef.h>
#include <stdint.h>

/* Truncated SVD of K (s, n) row-major (not modified; LAPACK works on a copy):
 * K ≈ U·SVt with U (s, r) orthonormal columns and SVt = Σ_r·V_rᵀ (r, n).
 * Vt (r, n), the right singular vectors themselves, may be NULL. sv receives
 * all min(s, n) singular values, descending. rel_err = √(Σ_{i≥r} σ_i²)/‖K‖_F
 * (0 for a zero K). Requires 1 <= r <= min(s, n). 0 or SKV_E* with a message. */
int shadowkv_svd(const float *K, int s, int n, int r, float *U, float *SVt, float *Vt, float *sv, float *rel_err);

/* The same by the Gram route (eigenvectors of KᵀK in double): the backend's
 * svd, several times faster on the tall key matrices of a prompt
 * (docs/PERFORMANCE.md). sv is exact to rounding for the large singular
 * values and rounding noise below about 1e-8·σ₁; rel_err is measured from
 * the residual. U's columns are orthonormal where σ_j > 1e-6·σ₁ and zero
 * below. Same arguments and errors as shadowkv_svd. */
int shadowkv_svd_gram(const float *K, int s, int n, int r, float *U, float *SVt, float *Vt, float *sv, float *rel_err);

/* Landmarks: lm (n_chunks, d) row j = mean of the c key rows j*c..j*c+c-1 of
 * K, whose rows are `stride` floats apart (pass K offset to the head). */
void shadowkv_landmarks(const float *K, int stride, int d, int c, int n_chunks, float *lm);

/* cos_min (n_chunks): per chunk, the minimum over its c keys of
 * cos(landmark, key); a zero vector counts as cosine 0. */
void shadowkv_cos_min(const float *K, int stride, int d, int c, int n_chunks, const float *lm, float *cos_min);

/* The min(o, n) chunks with the lowest cos_min (ties: lower id first) into
 * out, ascending by id. scratch: (n) floats. Returns the count chosen. */
int shadowkv_outliers(const float *cos_min, int n, int o, int *out, float *scratch);

/* Landmark scores for one KV head (the backend's score), over landmarks
 * kept in IEEE half, widened as read: for each query head g of the group,
 * p_g = Σ_i softmax(q_{i,g}·lmᵀ·scale) over the nq query positions; then
 * score[j] = max_g p_g[j]. Query head g of position i starts at
 * q + i*q_stride + g*d. tmp: (2*group*n_lm) floats. */
void shadowkv_score_h(const float *q, int nq, size_t q_stride, int group, int d, const uint16_t *lm, int n_lm,
                      float scale, float *tmp, float *score);

/* shadowkv_score_h's two stages, for callers that split the landmarks over
 * threads: logit (group rows ld apart) = q_g·lm_jᵀ·scale for n_lm landmarks
 * (ranges starting at multiples of 4 give one call's bits); then, per query
 * head, acc (n) += softmax(lg (n)), lg overwritten. */
void shadowkv_score_logits(const float *q, int group, int d, const float *lm, int n_lm, float scale, float *logit,
                           size_t ld);
void shadowkv_softmax_add(float *lg, int n, float *acc);

/* shadowkv_score_logits over landmarks kept in half precision: the bits of
 * shadowkv_score_logits over the same values widened to f32. */
void shadowkv_score_logits_h(const float *q, int group, int d, const uint16_t *lm, int n_lm, float scale,
                             float *logit, size_t ld);

/* Rounds x (n) to the nearest half-precision values, kept in f32. */
void shadowkv_round_f16(float *x, size_t n);
/* y (n) = x (n) rounded to nearest even into 16 bits of type elt
 * (SKV_ELT_BF16: km_f32_to_bf16; SKV_ELT_F16: IEEE half, vec_to_f16):
 * skv_backend's pack_h. */
void shadowkv_pack(const float *x, size_t n, uint16_t *y, int elt);
/* y (n) = the bf16 values x (n) widened to f32 (exact). */
void shadowkv_from_bf16(float *y, const uint16_t *x, size_t n);
/* The candidate chunks of a layer's KV heads gathered into dst of type
 * dst_elt (skv_backend's sk_gather_chunks; the device's end of prefill, and
 * its CPU twin). */
void shadowkv_gather_chunks(const float *src, size_t src_row, size_t src_head, const int *cand, int h, int n_cand,
                            int rows, int d, void *dst, size_t dst_head, int dst_elt);

/* score (n) = the max over the group's query heads of gs (group, n): the
 * group score shadowkv_score_h ends with. */
void shadowkv_group_max(const float *gs, int group, int n, float *score);

/* The min(k, n) best indices of score into idx, best first; higher score is
 * better, equal scores go to the lower index, NaN ranks below everything.
 * O(n log k). Returns the count. */
int shadowkv_topk(const float *score, int n, int k, int *idx);

/* rank[i] = place of i (0 = best) in the order shadowkv_topk gives over all
 * n entries. order: (n) ints of scratch. */
void shadowkv_rank(const float *score, int n, int *rank, int *order);

/* RoPE tables for positions 0..n_pos-1 as rope_apply computes them:
 * cs, sn (n_pos, rope_dim/2). */
void shadowkv_rope_table(const rope_ctx *rope, int n_pos, float *cs, float *sn);

/* Rotates n rows of one head, x (n, head_dim), at positions pos0..pos0+n-1,
 * reading the tables of shadowkv_rope_table (bitwise equal to rope_apply). */
void shadowkv_rope_rows(const rope_ctx *rope, const float *cs, const float *sn, float *x, int n, int pos0);

/* Rebuilds n post-RoPE keys of one head: out (n, d) row i =
 * RoPE(U[t0+i]·svt, position t0+i), with U (s, r) in bf16 (each value
 * widened exactly, the sums in f32) and svt (r, d) that head's slice of
 * ΣVᵀ. cs/sn: tables covering t0+n positions, or NULL to use rope_apply. */
void shadowkv_rebuild(const uint16_t *U, int r, const float *svt, int d, int t0, int n, const rope_ctx *rope,
                      const float *cs, const float *sn, float *out);
/* The same with U's values u_bytes wide: 2 (bf16, shadowkv_rebuild) or 4
 * (f32: ShadowKV's f32_state option, on the CPU only). */
void shadowkv_rebuild_w(const void *U, int u_bytes, int r, const float *svt, int d, int t0, int n,
                        const rope_ctx *rope, const float *cs, const float *sn, float *out);

/* shadowkv_rebuild stored as out_elt: SKV_ELT_F32, or SKV_ELT_BF16 (each
 * f32 result rounded to nearest even, km_f32_to_bf16): the CPU backend's
 * rebuild, and the rounding every backend's rebuild of ShadowKV's bf16 key
 * rows follows. */
void shadowkv_rebuild_to(const uint16_t *U, int r, const float *svt, int d, int t0, int n, const rope_ctx *rope,
                         const float *cs, const float *sn, void *out, int out_elt);

/* Asks the caches for what shadowkv_rebuild of rows [t0, t0+n) will read
 * from memory (the U rows and the RoPE table rows; cs may be NULL): a
 * chunk's rows sit at a random place, so without it every chunk's rebuild
 * starts with a wait for memory. Changes no value. */
void shadowkv_rebuild_prefetch(const void *U, int u_bytes, int r, int t0, int n, const rope_ctx *rope,
                               const float *cs, const float *sn);

/* ShadowKV+: y (n) = V_r·(V_rᵀ·x), the projection of x (n) onto the span of
 * the r right singular vectors in Vt (r, n). coef: (r) floats. y may be x. */
void shadowkv_project(const float *Vt, int r, int n, const float *x, float *y, float *coef);

/* ---- chunk cache ------------------------------------------------------ */

/* Which chunk each of n_slots cache slots holds, for one (layer, KV head).
 * Ids are 0..n_ids-1 (candidate indices). */
typedef struct {
    int n_slots, n_ids;
    int *slot_id;        /* (n_slots) id held by each slot, -1: empty */
    int *where;          /* (n_ids) slot holding each id, -1: not cached */
    unsigned *stamp;     /* (n_slots) epoch in which the slot was last claimed */
    unsigned epoch;
    uint64_t hits, misses;
} shadowkv_cache;

int shadowkv_cache_init(shadowkv_cache *c, int n_slots, int n_ids);
void shadowkv_cache_free(shadowkv_cache *c);

/* Takes the new selection sel (k distinct ids, k <= n_slots): ids already
 * cached are hits and keep their slot; the others are misses and get slots
 * that no selected id uses (evicting what those held). slot_of (k) receives
 * each sel[i]'s slot and miss the indices i of the misses, in order. Adds to
 * hits and misses; returns the number of misses. O(k + n_slots). */
int shadowkv_cache_update(shadowkv_cache *c, const int *sel, int k, int *slot_of, int *miss);

/* ---- a layer's decode books, misses and rebuild, every KV head at once ---
 * (the backend ops sk_books, sk_gather_misses, sk_rebuild_misses: on a
 * device these run in its memory with no host in between; these are their
 * CPU twins.) Head kh's part of an (h, k) array is at kh*k, of an (h,
 * n_cand) array at kh*n_cand. */

/* Each head's chunk cache (slot_id, stamp (h, k); where (h, n_cand); epoch
 * (h)) takes its selection sel (h, k) by km_cache_update's rule: slot_of
 * (h, k), miss (h, k) and n_miss (h) as shadowkv_cache_update gives them. */
void shadowkv_books(int h, int k, int n_cand, const int *sel, int *slot_id, int *where, unsigned *stamp,
                    unsigned *epoch, int *slot_of, int *miss, int *n_miss);
/* The misses' values: head kh's miss m (i = miss[kh][m]) copies block
 * blk0 + kh*n_cand + sel[kh][i] of the store ((c, d) bf16 values each,
 * blocks back to back), as they are, to the bf16 rows row_slot +
 * slot_of[kh][i]*c.. of V[kh]. */
void shadowkv_gather_misses(const uint16_t *store, int c, int d, int h, int k, int n_cand, size_t blk0, const int *sel,
                            const int *slot_of, const int *miss, const int *n_miss, uint16_t *const *V, int row_slot);
/* The misses' keys: the c positions of chunk cand[kh][sel[kh][i]] rebuilt
 * (shadowkv_rebuild_to with SVt + kh*r*d, rounded to bf16) into the rows
 * row_slot + slot_of[kh][i]*c.. of K[kh]. */
void shadowkv_rebuild_misses(const uint16_t *U, int r, const float *SVt, int d, int c, int h, int k, int n_cand,
                             const int *cand, const int *sel, const int *slot_of, const int *miss, const int *n_miss,
                             const rope_ctx *rope, const float *cs, const float *sn, uint16_t *const *K,
                             int row_slot);

/* ---- a batched decode step: every sequence and KV head of a layer at once --
 * (the backend ops sk_step_*: on a device one launch each, whatever the
 * batch, the heads or their budgets; these are their CPU twins.) The step
 * of a layer is: append each sequence's new key and value rows (RoPE of
 * the query and the key first, when the step does it), the landmarks'
 * logits, select (softmax statistics and the group max, top-k, the chunk
 * caches' books), fetch the missed values, rebuild the missed keys,
 * attend. Each (sequence, KV head) is one job of a
 * table in the backend's memory; sequences may differ in budget (k), in
 * candidates, rank, chunk and rows. */

#define SK_STEP_G_MAX 8       /* query heads a KV head (the fused step's registers) */
#define SK_STEP_D_MAX 256     /* head dim */
#define SK_STEP_K_MAX 4096    /* chunks selected a head (top-k sorts them in shared memory) */
#define SK_STEP_PARTS 32      /* attention parts a head, at most (split-K) */
#define SK_STEP_PART_ROWS 128 /* rows a part, at least */

/* Parts a job's attention over rows rows is split into (its partial results
 * merged by the last part done). */
static inline int sk_step_parts(int rows) {
    int p = (rows + SK_STEP_PART_ROWS - 1) / SK_STEP_PART_ROWS;
    return p < 1 ? 1 : p > SK_STEP_PARTS ? SK_STEP_PARTS : p;
}

/* One (sequence, KV head) of the step. Every pointer is the backend's
 * memory but store (host_alloc's, read by the fetch). */
typedef struct sk_job {
    uint16_t *K, *V;         /* (cap, d) the head's attention rows in bf16: [outliers | slots | local | generated] */
    const uint16_t *lm;      /* (n_cand, d) the candidates' landmarks, IEEE half */
    const uint16_t *U;       /* (s, r) the layer's left singular vectors, bf16 */
    const float *svt;        /* (r, d) the head's block of Σ·Vᵀ */
    const float *cs, *sn;    /* (s, rope_dim/2) RoPE tables of the prompt's positions */
    const int *cand;         /* (n_cand) each candidate's chunk id */
    const uint16_t *store;   /* (n_cand, c, d) the candidates' values, bf16 */
    const float *key;        /* (d) the new key row, or NULL: the step's k row (ShadowKV+ projects it) */
    int *slot_id, *where;    /* (k), (n_cand): the head's chunk cache (km_cache_update) */
    unsigned *stamp, *epoch; /* (k), (1) */
    float *score;            /* (n_cand) landmark scores */
    int *sel, *slot_of, *miss, *n_miss; /* (k) each, (1): the selection, best first, and its books */
    int gi, kh;              /* the sequence (its entry in sk_step.seq) and the KV head */
    int n_cand, k, r, c;     /* candidates, chunks selected, rank, tokens a chunk */
    int row_slot, row_gen;   /* first row of the cache slots, of the generated tokens */
    int s;                   /* the prompt's tokens: the new row's position is s + gen (RoPE in append) */
    size_t lg;               /* the job's scratch at sk_step.lg + lg: (2, group, n_cand) floats */
} sk_job;

/* The step of one layer: the job table and what every job shares. */
typedef struct sk_step {
    const sk_job *jobs;      /* (n_jobs) the backend's memory */
    const int *seq;          /* (n_seq, 2) the backend's memory: each sequence's row in k, v, q and out, and its
                                generated rows before this step's (its new row goes at row_gen + that) */
    int n_jobs, group, d;    /* query heads a KV head, head dim */
    int kvd, qd;             /* floats a row of k and v, of q and out */
    int max_cand, max_k, max_c; /* the largest over the jobs (launch shapes) */
    int max_rows;            /* the most rows a job attends, its new row included */
    const rope_ctx *rope;    /* host memory: rope_dim, mode and inv_freq (the tables are the jobs') */
    int rope_new;            /* 1: append first rotates each job's query heads (in place) and its new key
                                (unless the job has key) at its position (kv_class.step_ropes) */
    int scored;              /* 1: select takes the jobs' scores as they are and skips the statistics
                                (tests of the order: ties, NaN and -0, which the statistics never give) */
    float *lg;               /* scratch: the jobs' logits */
    float *part;             /* scratch: n_jobs * SK_STEP_PARTS * group * (d + 2) floats, the attention
                                partials (the device's: outputs (n_jobs * SK_STEP_PARTS, group, d),
                                then max and sum (..., group, 2)) */
    unsigned *done;          /* (n_jobs) zero between steps: attention parts finished (the last merges) */
} sk_step;

/* Each job's new rows: key (job's key, else k's row) and v's row of its
 * sequence to row row_gen + gen of K and V, rounded to bf16. With
 * rope_new, first q's query heads kh*group.. of the row rotated in place
 * and k's head rotated on its way (k itself is not written), as rope_qk at
 * position s + gen, then rounded. */
void shadowkv_step_append(const sk_step *st, float *q, const float *k, const float *v);
/* Each job's landmark logits into its scratch lg (group, n_cand): the
 * group's q·lm_j/√d (shadowkv_score_logits_h). */
void shadowkv_step_logits(const sk_step *st, const float *q);
/* Each job's landmark scores from its logits: the softmax of each query
 * head, the max over the group (shadowkv_score_h's bits; the logits are
 * overwritten). */
void shadowkv_step_stats(const sk_step *st);
/* Each job's min(k, n_cand) best candidates by score into sel, best first
 * (shadowkv_topk's order: ties to the lower index, NaN last). */
void shadowkv_step_topk(const sk_step *st);
/* Each job's chunk cache takes its selection (k <= n_cand): slot_of, miss,
 * n_miss as km_cache_update gives them. */
void shadowkv_step_books(const sk_step *st);
/* The three above in order (stats skipped when st->scored): the twin of
 * the one select launch. */
void shadowkv_step_select(const sk_step *st);
/* Each job's misses' values: store block sel[i], bf16 as it is, to rows
 * row_slot + slot_of[i]*c.. of V. */
void shadowkv_step_fetch(const sk_step *st);
/* Each job's misses' keys: chunk cand[sel[i]]'s c rows rebuilt
 * (shadowkv_rebuild_to with the job's svt and tables, rounded to bf16)
 * into rows row_slot + slot_of[i]*c.. of K. */
void shadowkv_step_rebuild(const sk_step *st);
/* Each job's attention: its query group over rows 0..row_gen+gen of K and
 * V (the new row included; bf16 widened), scale 1/√d, into out's row,
 * heads kh*group... */
void shadowkv_step_attend(const sk_step *st, const float *q, float *out);

/* ---- offload store ---------------------------------------------------- */

/* Slow memory (host RAM behind PCIe on a GPU build): n_blocks blocks of
 * (rows, cols) values in bf16 (rounded to nearest even as they are put,
 * km_f32_to_bf16; widened exactly as they are fetched), half the bytes of
 * f32; or, with elt_bytes 4 (ShadowKV's f32_state option, CPU only), in
 * f32 as they were put. Writes are free; every read is a fetch, counted in chunks and bytes
 * (atomically, so threads may fetch concurrently).
 *
 * Two tiers: host memory, or a file (for contexts whose values do not fit
 * in RAM), mapped shared so the kernel writes cold pages back to it and
 * reads them in again on a fetch. */
typedef struct {
    void *data;          /* (n_blocks, rows, cols) bf16, or f32 when elt_bytes is 4 */
    int n_blocks, rows, cols;
    int elt_bytes;       /* bytes a value: 2 (bf16) or 4 (f32) */
    int mapped;          /* 1: data is a shared mapping of a file (the file tier) */
    void (*release)(void *); /* frees data when the store adopted it (shadowkv_store_adopt) */
    uint64_t n_fetch;    /* blocks fetched */
    uint64_t fetch_bytes;
} shadowkv_store;

/* path NULL or "": host memory. Otherwise the store lives in a new file at
 * path: an existing file is refused (never overwritten), and the file is
 * unlinked as soon as it is mapped, so nothing is left behind when the
 * process ends, whatever way it ends. 0 or SKV_E* with a message. */
int shadowkv_store_init(shadowkv_store *st, int n_blocks, int rows, int cols, int elt_bytes, const char *path);
/* The host tier in memory the caller allocated (a device backend's pinned,
 * mapped host_alloc), which the store owns from now on and gives back with
 * release; bf16. */
void shadowkv_store_adopt(shadowkv_store *st, int n_blocks, int rows, int cols, uint16_t *data,
                          void (*release)(void *));
void shadowkv_store_free(shadowkv_store *st);
size_t shadowkv_store_bytes(const shadowkv_store *st);

/* Writes block b from src, whose rows are src_stride floats apart, rounded
 * to bf16 (copied as they are in an f32 store). */
void shadowkv_store_put(shadowkv_store *st, int b, const float *src, int src_stride);

/* Counts n blocks fetched by a backend's gather straight from st->data. */
void shadowkv_store_count(shadowkv_store *st, int n);

/* Copies block b, widened, to dst (rows dst_stride floats apart) and counts it. */
void shadowkv_store_fetch(shadowkv_store *st, int b, float *dst, int dst_stride);

/* Copies n blocks of (rows, cols) values, each elt_bytes wide (2: bf16;
 * 4: f32), block src_idx[i] of src (blocks back to back) to dst +
 * dst_off[i] values of type dst_elt, rows dst_stride values apart: bf16
 * widened to SKV_ELT_F32 or copied to SKV_ELT_BF16; f32 to SKV_ELT_F32
 * only. The CPU backend's gather (at 2), and the f32 store's (at 4).
 * Counts nothing. */
void shadowkv_gather_blocks(const void *src, int elt_bytes, int rows, int cols, const int *src_idx, int n,
                            void *dst, int dst_elt, const size_t *dst_off, int dst_stride);

#endif
