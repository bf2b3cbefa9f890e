/* ops_sk_step.cu: ShadowKV's decode step of one layer for a whole batch on
 * the GPU, one launch a stage whatever the batch size, the KV heads or the
 * sequences' budgets. Each (sequence, KV head) is a job of a table in device
 * memory (kernels/cpu/shadowkv_ops.h: sk_job, sk_step); the jobs of a stage
 * run in one grid, the job along grid.y or grid.x, and a job with less work
 * than the grid's shape (fewer candidates, a smaller k, fewer misses or
 * rows) skips the rest on the device. Nothing is read back: the selection
 * and the books stay in the jobs' buffers (the policy's packs).
 * - append: a block a job stores its new key and value rows rounded to
 *   bf16, RoPE of its query heads and its key (in f32) first when the step
 *   does it (rope_new);
 * - logits: a warp a landmark (IEEE half) for the job's whole query group;
 * - select: a block a job, three phases between barriers: each head's
 *   softmax statistics and the group max; a radix select of the k-th key
 *   (4 passes of 8 bits over kmath.h's top-k order), the keys before it
 *   gathered, ties taken by the lowest index in a block-wide scan, then a
 *   bitonic sort; the books: hits by lookup, misses ranked by ballot and
 *   prefix sum, free slots likewise, the m-th miss to the m-th free slot
 *   (km_cache_update's rule, in parallel);
 * - fetch: the missed values (bf16) from pinned, mapped host memory on the
 *   fetch stream, copied as they are into the bf16 rows, 16-byte accesses,
 *   four in flight a lane, 16 blocks;
 * - rebuild: a block a miss, the keys U·ΣVᵀ with RoPE (U in bf16), rounded
 *   to bf16;
 * - attend: a block a (job, part of the rows), flash_decode.h's split-K
 *   flash-decoding body (dense's k_flash_decode's): row groups of lanes,
 *   16-byte loads of the bf16 rows, the last part done merges.
 * CPU twins: kernels/cpu/shadowkv_ops.c's shadowkv_step_*. */
#include "cuda_util.h"
#include "flash_decode.h"

#include <cuda_fp16.h>

extern "C" {
#include "shadowkv_ops.h"
}

#define SK_THREADS 256

/* The place of this thread's pred among the block's threads that have it,
 * in thread order, and their count (*total); every thread calls it. */
static __device__ int sk_rank(int pred, int *total) {
    __shared__ int wsum[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = (blockDim.x + 31) / 32;
    unsigned b = __ballot_sync(0xffffffffu, pred);
    __syncthreads();
    if (lane == 0) wsum[warp] = __popc(b);
    __syncthreads();
    int before = 0, all = 0;
    for (int w = 0; w < nw; w++) {
        before += w < warp ? wsum[w] : 0;
        all += wsum[w];
    }
    *total = all;
    return before + __popc(b & ((1u << lane) - 1u));
}

/* The order key's high half: smaller is better (kmath.h's km_topk_key). */
static __device__ __forceinline__ unsigned sk_desc(float s) { return (unsigned)(km_topk_key(s, 0) >> 32); }

/* ---- append ---- */

/* A block a job: the new key (the job's own, or k's head) and value rows,
 * rounded to bf16 (km_f32_to_bf16); with inv (rope_new), first the job's
 * query heads rotated in place and the key rotated in f32 in shared memory
 * (then rounded), pair by pair as k_rope_qk does (the same angles and
 * rotation, so the same bits). */
__global__ void k_sk_step_append(sk_step st, float *q, const float *k, const float *v, const float *inv, int rope_dim,
                                 int mode) {
    SKV_DYN_SHARED(float, kr); /* (d) the key in f32 */
    const sk_job *J = &st.jobs[blockIdx.x];
    int row = st.seq[2 * J->gi], gen = st.seq[2 * J->gi + 1], d = st.d, half = rope_dim / 2;
    size_t off = (size_t)row * st.kvd + (size_t)J->kh * d, dst = (size_t)(J->row_gen + gen) * d;
    const float *key = J->key ? J->key : k + off;
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        kr[e] = key[e];
        J->V[dst + e] = km_f32_to_bf16(v[off + e]);
    }
    if (inv) {
        int pos = J->s + gen, G = st.group;
        float *qh = q + (size_t)row * st.qd + (size_t)J->kh * G * d;
        __syncthreads();
        for (int x = threadIdx.x; x < (G + 1) * half; x += blockDim.x) {
            int g = x / half, p = x % half, a, b;
            if (g == G && J->key) break; /* the job's own key is rotated already */
            float *h = g < G ? qh + (size_t)g * d : kr;
            float cs, sn;
            km_rope_pair_index(mode, p, rope_dim, &a, &b);
            km_rope_cs(inv[p], pos, &cs, &sn);
            km_rotate(&h[a], &h[b], cs, sn);
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < d; e += blockDim.x) J->K[dst + e] = km_f32_to_bf16(kr[e]);
}

void cu_sk_step_append(const sk_step *st, float *q, const float *k, const float *v) {
    if (st->n_jobs <= 0) return;
    int half = st->rope_new ? st->rope->rope_dim / 2 : 0;
    /* the table forward's rope_qk uploaded at the prefill (no copy here) */
    const float *inv = half ? cuda_const_upload(st->rope->inv_freq, (size_t)half) : NULL;
    cuda_span_mark sp = cuda_span_begin(0);
    SKV_LAUNCH(k_sk_step_append, st->n_jobs, 128, sizeof(float) * st->d, cuda_after_fetch())(
        *st, q, k, v, inv, 2 * half, half ? (int)st->rope->mode : 0);
    CKL();
    cuda_span_end(sp, 0, "append");
}

/* ---- landmark logits ---- */
/* Block (x, job): warps over the job's landmarks, lanes along the head dim;
 * the group's logits q_g·lm_j·scale, 8 query heads at a time. */
__global__ void k_sk_step_logits(sk_step st, const float *q, float scale) {
    const sk_job *J = &st.jobs[blockIdx.y];
    int lane = threadIdx.x % 32, d = st.d, G = st.group, n = J->n_cand;
    int j = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (j >= n) return;
    const float *qj = q + (size_t)st.seq[2 * J->gi] * st.qd + (size_t)J->kh * G * d;
    const __half *l = (const __half *)J->lm + (size_t)j * d;
    float *L = st.lg + J->lg;
    float acc[SK_STEP_G_MAX];
#pragma unroll
    for (int g = 0; g < SK_STEP_G_MAX; g++) acc[g] = 0.0f;
    for (int e = lane; e < d; e += 32) {
        float x = __half2float(l[e]);
#pragma unroll
        for (int g = 0; g < SK_STEP_G_MAX; g++)
            if (g < G) acc[g] += qj[(size_t)g * d + e] * x;
    }
#pragma unroll
    for (int g = 0; g < SK_STEP_G_MAX; g++)
        if (g < G) {
            float x = acc[g];
            for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
            if (lane == 0) L[(size_t)g * n + j] = x * scale;
        }
}

void cu_sk_step_logits(const sk_step *st, const float *q) {
    if (st->n_jobs <= 0 || st->max_cand <= 0) return;
    SKV_ASSERT(st->group >= 1 && st->group <= SK_STEP_G_MAX && st->n_jobs <= 65535);
    cuda_span_mark sp = cuda_span_begin(0);
    dim3 grid((unsigned)cuda_blocks((size_t)st->max_cand * 32, SK_THREADS), (unsigned)st->n_jobs);
    SKV_LAUNCH(k_sk_step_logits, grid, SK_THREADS, 0, cuda_after_fetch())(*st, q, 1.0f / sqrtf((float)st->d));
    CKL();
    cuda_span_end(sp, 0, "logits");
}

/* ---- select: statistics, top-k, books; a block a job ---- */

/* Phase 1: each query head's max and Σ exp over the landmarks, then
 * score_j = max over the group of its softmax (ops_sparse.cu's order). */
static __device__ void sk_stats(const sk_step &st, const sk_job *J) {
    __shared__ float m[SK_STEP_G_MAX], s[SK_STEP_G_MAX];
    int n = J->n_cand, G = st.group;
    const float *L = st.lg + J->lg;
    for (int g = 0; g < G; g++) {
        float mx, sum;
        block_softmax_stats(L + (size_t)g * n, n, &mx, &sum);
        if (threadIdx.x == 0) {
            m[g] = mx;
            s[g] = sum;
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float best = -INFINITY;
        for (int g = 0; g < G; g++) {
            float p = expf(L[(size_t)g * n + j] - m[g]) * (1.0f / s[g]);
            best = p > best ? p : best;
        }
        J->score[j] = best;
    }
}

/* Phase 2: the min(k, n) best scores' indices into sel, best first: a
 * radix select of the k-th key, the keys before it and the first ties,
 * then a bitonic sort in keys (shared, the next power of two of k). */
static __device__ void sk_topk(const sk_job *J, unsigned long long *keys) {
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix, s_kk, s_n;
    int n = J->n_cand, k = J->k < n ? J->k : n, tid = threadIdx.x, nt = blockDim.x;
    const float *score = J->score;
    if (k <= 0) return; /* the same for the whole block */
    if (tid == 0) s_n = 0;
    __syncthreads();
    if (k == n) { /* every candidate, sorted */
        for (int i = tid; i < n; i += nt) keys[i] = km_topk_key(score[i], (uint32_t)i);
    } else {
        /* the k-th smallest high half T, 8 bits a pass from the top; kk: how
         * many keys equal to T the selection takes */
        unsigned prefix = 0, kk = (unsigned)k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            unsigned hi = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
            for (int b = tid; b < 256; b += nt) hist[b] = 0;
            __syncthreads();
            for (int i = tid; i < n; i += nt) {
                unsigned u = sk_desc(score[i]);
                if ((u & hi) == (prefix & hi)) atomicAdd(&hist[(u >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                unsigned cum = 0;
                for (int b = 0; b < 256; b++) {
                    if (cum + hist[b] >= kk) {
                        s_prefix = prefix | ((unsigned)b << shift);
                        s_kk = kk - cum;
                        break;
                    }
                    cum += hist[b];
                }
            }
            __syncthreads();
            prefix = s_prefix;
            kk = s_kk;
            __syncthreads();
        }
        /* the keys before T in any order; of those equal to T, the kk with
         * the lowest indices (a scan in index order) */
        int taken = 0;
        for (int i0 = 0; i0 < n; i0 += nt) {
            int i = i0 + tid, tie = 0;
            if (i < n) {
                unsigned u = sk_desc(score[i]);
                if (u < prefix) keys[atomicAdd(&s_n, 1u)] = km_topk_key(score[i], (uint32_t)i);
                tie = u == prefix;
            }
            int total = 0, r = sk_rank(tie, &total);
            if (tie && (unsigned)(taken + r) < kk) keys[atomicAdd(&s_n, 1u)] = km_topk_key(score[i], (uint32_t)i);
            taken += total;
        }
    }
    /* bitonic sort of the k keys, padded to a power of two (distinct keys;
     * the padding sorts last) */
    int P = 1;
    while (P < k) P <<= 1;
    __syncthreads();
    for (int i = k + tid; i < P; i += nt) keys[i] = ~0ull;
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            for (int t = tid; t < P / 2; t += nt) {
                int lo = 2 * stride * (t / stride) + t % stride, hi = lo + stride;
                unsigned long long a = keys[lo], b = keys[hi];
                if ((a > b) == ((lo & size) == 0)) {
                    keys[lo] = b;
                    keys[hi] = a;
                }
            }
            __syncthreads();
        }
    for (int i = tid; i < k; i += nt) J->sel[i] = (int)(keys[i] & 0xffffffffull);
}

/* Phase 3, km_cache_update's rule: the epoch advances; a selected id
 * already cached keeps its slot (a hit, its stamp set); the misses, in
 * order, take the slots no hit claimed, in slot order. Ids and slots are
 * distinct, so the threads touch distinct entries. */
static __device__ void sk_books(const sk_job *J) {
    __shared__ unsigned s_ep;
    __shared__ int s_wrap;
    int k = J->k, tid = threadIdx.x, nt = blockDim.x;
    if (tid == 0) {
        unsigned e = *J->epoch + 1;
        s_wrap = e == 0;
        if (e == 0) e = 1;
        *J->epoch = e;
        s_ep = e;
    }
    __syncthreads();
    unsigned ep = s_ep;
    if (s_wrap)
        for (int s = tid; s < k; s += nt) J->stamp[s] = 0;
    __syncthreads();
    int n_miss = 0;
    for (int i0 = 0; i0 < k; i0 += nt) {
        int i = i0 + tid, miss = 0;
        if (i < k) {
            int s = J->where[J->sel[i]];
            if (s >= 0) {
                J->slot_of[i] = s;
                J->stamp[s] = ep;
            } else {
                miss = 1;
            }
        }
        int total = 0, r = sk_rank(miss, &total);
        if (miss) J->miss[n_miss + r] = i;
        n_miss += total;
    }
    __syncthreads();
    if (tid == 0) *J->n_miss = n_miss;
    int taken = 0;
    for (int s0 = 0; s0 < k && taken < n_miss; s0 += nt) {
        int s = s0 + tid, free = s < k && J->stamp[s] != ep;
        int total = 0, r = sk_rank(free, &total);
        if (free && taken + r < n_miss) {
            int i = J->miss[taken + r], id = J->sel[i], old = J->slot_id[s];
            if (old >= 0) J->where[old] = -1;
            J->slot_id[s] = id;
            J->where[id] = s;
            J->stamp[s] = ep;
            J->slot_of[i] = s;
        }
        taken += total;
    }
}

/* A block a job: the three phases, a barrier between them (each reads
 * what the last wrote to the job's memory: scores, then sel). */
__global__ void k_sk_step_select(sk_step st) {
    SKV_DYN_SHARED(unsigned long long, keys);
    const sk_job *J = &st.jobs[blockIdx.x];
    if (!st.scored) sk_stats(st, J);
    __syncthreads();
    sk_topk(J, keys);
    __syncthreads();
    sk_books(J);
}

void cu_sk_step_select(const sk_step *st) {
    if (st->n_jobs <= 0) return;
    SKV_ASSERT(st->max_k <= SK_STEP_K_MAX && st->group >= 1 && st->group <= SK_STEP_G_MAX);
    int P = 1;
    while (P < st->max_k) P <<= 1;
    cuda_span_mark sp = cuda_span_begin(0);
    SKV_LAUNCH(k_sk_step_select, st->n_jobs, SK_THREADS, sizeof(unsigned long long) * P, cuda_after_fetch())(*st);
    CKL();
    cuda_span_end(sp, 0, "select");
}

/* ---- the misses' values, on the fetch stream ---- */

/* Warps over (job, miss) pairs, max_k a job; a warp copies one chunk of
 * bf16 values as they are, 16 bytes (eight values) a lane access and four
 * reads in flight, when both ends allow it. */
__global__ void k_sk_step_fetch(sk_step st) {
    int lane = threadIdx.x % 32, warps = gridDim.x * blockDim.x / 32, d = st.d;
    for (int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32; w < st.n_jobs * st.max_k; w += warps) {
        const sk_job *J = &st.jobs[w / st.max_k];
        int m = w % st.max_k;
        if (m >= *J->n_miss) continue;
        int i = J->miss[m];
        size_t blk = (size_t)J->c * d;
        const uint16_t *src = J->store + (size_t)J->sel[i] * blk;
        uint16_t *dst = J->V + (size_t)(J->row_slot + J->slot_of[i] * J->c) * d;
        copy_bf16_warp(src, dst, blk, lane);
    }
}

/* The stores are pinned, mapped host memory, which the device reaches at
 * the same address (unified addressing, every 64-bit platform CUDA runs
 * on). The fetch waits for what the compute stream queued (the books, the
 * last attention over these rows); the attention waits for it. */
void cu_sk_step_fetch(const sk_step *st) {
    if (st->n_jobs <= 0 || st->max_k <= 0) return;
    cudaStream_t fs = cuda_fetch_begin();
    cuda_span_mark sp = cuda_span_begin(1);
    SKV_LAUNCH(k_sk_step_fetch, 16, SK_THREADS, 0, fs)(*st);
    CKL();
    cuda_fetch_end();
    cuda_span_end(sp, 1, "fetch_v");
}

/* ---- the misses' keys, with RoPE ---- */

/* Block (miss, job): the chunk's c rows, one after the other: U[t]·svt
 * into the shared row, RoPE at t from the tables, written out rounded to
 * bf16. */
__global__ void k_sk_step_rebuild(sk_step st, int rope_dim, int mode) {
    SKV_DYN_SHARED(float, row);
    const sk_job *J = &st.jobs[blockIdx.y];
    int m = blockIdx.x, d = st.d, half = rope_dim / 2;
    if (m >= *J->n_miss) return;
    int i = J->miss[m], r = J->r, t0 = J->cand[J->sel[i]] * J->c;
    uint16_t *out = J->K + (size_t)(J->row_slot + J->slot_of[i] * J->c) * d;
    for (int tt = 0; tt < J->c; tt++) {
        int t = t0 + tt;
        const uint16_t *u = J->U + (size_t)t * r;
        for (int e = threadIdx.x; e < d; e += blockDim.x) {
            float s = 0.0f;
            for (int j = 0; j < r; j++) s += km_bf16_to_f32(u[j]) * J->svt[(size_t)j * d + e];
            row[e] = s;
        }
        __syncthreads();
        for (int p = threadIdx.x; p < half; p += blockDim.x) {
            int a, b;
            km_rope_pair_index(mode, p, rope_dim, &a, &b);
            km_rotate(&row[a], &row[b], J->cs[(size_t)t * half + p], J->sn[(size_t)t * half + p]);
        }
        __syncthreads();
        for (int e = threadIdx.x; e < d; e += blockDim.x) out[(size_t)tt * d + e] = km_f32_to_bf16(row[e]);
        __syncthreads();
    }
}

void cu_sk_step_rebuild(const sk_step *st) {
    if (st->n_jobs <= 0 || st->max_k <= 0) return;
    SKV_ASSERT(st->n_jobs <= 65535);
    cuda_span_mark sp = cuda_span_begin(0);
    /* on the compute stream beside the fetch: the rebuild reads no value rows */
    SKV_LAUNCH(k_sk_step_rebuild, dim3((unsigned)st->max_k, (unsigned)st->n_jobs), 128, sizeof(float) * st->d,
               cuda_get()->compute)(*st, st->rope->rope_dim, (int)st->rope->mode);
    CKL();
    cuda_span_end(sp, 0, "rebuild_k");
}

/* ---- sparse attention, split-K with the merge fused ---- */

/* shadowkv_ops.h's sk_step_parts, in device code. */
static __device__ __forceinline__ int sk_parts_dev(int rows) {
    int p = (rows + SK_STEP_PART_ROWS - 1) / SK_STEP_PART_ROWS;
    return p < 1 ? 1 : p > SK_STEP_PARTS ? SK_STEP_PARTS : p;
}

/* Block (part, job): rows [r0, r1) of the job's attention rows (bf16, d
 * apart), flash_decode.h's fd_attend for the job's query group, its
 * partials in st.part (tasks job*SK_STEP_PARTS + part of (n_jobs *
 * SK_STEP_PARTS, G, d), then of (..., G, 2)) and its counter st.done[job]:
 * the same body as dense's k_flash_decode. */
template <typename C>
__global__ void __launch_bounds__(FD_WARPS * 32, FD_MIN_BLOCKS(C))
k_sk_step_attend(sk_step st, const float *q, float *out, int tpr, float qscale) {
    SKV_DYN_SHARED(float, sh); /* (FD_WARPS, G, d) outputs, then (FD_WARPS, G, 2) max and sum */
    __shared__ int last;
    int j = blockIdx.y, G = st.group, d = st.d;
    const sk_job *J = &st.jobs[j];
    int row = st.seq[2 * J->gi], rows = J->row_gen + st.seq[2 * J->gi + 1] + 1;
    int parts = sk_parts_dev(rows), p = blockIdx.x;
    if (p >= parts) return;
    int r0 = (int)((long long)rows * p / parts), r1 = (int)((long long)rows * (p + 1) / parts);
    size_t qoff = (size_t)row * st.qd + (size_t)J->kh * G * d;
    float *pml = st.part + (size_t)st.n_jobs * SK_STEP_PARTS * G * d;
    fd_attend<C>((const bf16r *)J->K, (const bf16r *)J->V, d, r0, r1, q + qoff, qscale, G, d, tpr, p, parts, st.part,
                 pml, (size_t)j * SK_STEP_PARTS, st.done, j, out, qoff, sh, &last);
}

template <typename C>
static void sk_attend_launch(const sk_step *st, dim3 grid, size_t smem, cudaStream_t cs, const float *q, float *out,
                             int tpr, float qscale) {
    SKV_LAUNCH(k_sk_step_attend<C>, grid, FD_WARPS * 32, smem, cs)(*st, q, out, tpr, qscale);
}

/* The configuration for a group of G (the smallest register group that
 * holds it) and the rows' loads: 8 bf16 a load where d is a multiple of 8
 * (every job's rows then start on 16 bytes: each head's buffer is an
 * allocation of its own, rows d apart), else one element. */
template <int VEC, int NV>
static void sk_attend_g(const sk_step *st, dim3 grid, size_t smem, cudaStream_t cs, const float *q, float *out,
                        int tpr, float qscale) {
    int G = st->group;
    if (G <= 1) sk_attend_launch<fd_cfg<bf16r, VEC, NV, 1>>(st, grid, smem, cs, q, out, tpr, qscale);
    else if (G <= 2) sk_attend_launch<fd_cfg<bf16r, VEC, NV, 2>>(st, grid, smem, cs, q, out, tpr, qscale);
    else if (G <= 4) sk_attend_launch<fd_cfg<bf16r, VEC, NV, 4>>(st, grid, smem, cs, q, out, tpr, qscale);
    else sk_attend_launch<fd_cfg<bf16r, VEC, NV, 8>>(st, grid, smem, cs, q, out, tpr, qscale);
}

void cu_sk_step_attend(const sk_step *st, const float *q, float *out) {
    if (st->n_jobs <= 0) return;
    SKV_ASSERT(st->group >= 1 && st->group <= SK_STEP_G_MAX && SK_STEP_G_MAX <= 8 && st->d <= SK_STEP_D_MAX &&
               SK_STEP_D_MAX <= 256 && st->n_jobs <= 65535);
    cudaStream_t cs = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    int d = st->d;
    size_t smem = sizeof(float) * FD_WARPS * st->group * ((size_t)d + 2);
    dim3 grid((unsigned)sk_step_parts(st->max_rows), (unsigned)st->n_jobs);
    float qscale = 1.4426950408889634f / sqrtf((float)d); /* 1/sqrt(d), in base 2 */
    if (d % 8 == 0) sk_attend_g<8, 1>(st, grid, smem, cs, q, out, fd_pow2(d / 8), qscale);
    else sk_attend_g<1, 8>(st, grid, smem, cs, q, out, d < 32 ? fd_pow2(d) : 32, qscale);
    CKL();
    cuda_span_end(sp, 0, "attend");
}
