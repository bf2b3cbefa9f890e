/* ops_attention.cu: exact attention on the GPU.
 *
 * One block attends the G query heads of a GQA group over a range of rows
 * with an online softmax (kmath.h's km_osm): per tile of 64 rows it scores
 * every (head, row) pair, updates each head's running max and sum, and each
 * thread, owning one dimension, adds the tile's weighted value rows to its G
 * accumulators, so every K and V row is read once for the whole group.
 * - attend_rows / attend_group: one block (a row set, ShadowKV's sparse set:
 *   its rows f32 or bf16, widened as read);
 * - attend_decode and attend_decode_batch: split-K flash-decoding, one
 *   launch over (part of the rows, KV head, sequence) with 16-byte loads and
 *   the parts merged by the last to finish (below); kv_store_batch stores a
 *   batch's rows in one launch;
 * - attend_causal: a prefill on tensor cores (flash attention on mma.sync
 *   m16n8k16, a block per (tile of (query, head) rows, KV head), below);
 *   a few queries (a block per (query, head) over the causal prefix) in f32.
 * The CPU twins are kernels/cpu/backend_cpu.c's ops of the same names. */
#include "cuda_util.h"
#include "flash_decode.h"

#define TILE 64
#define G_MAX 8
#define THREADS 256
#define D_MAX 256

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

/* Attends q (G heads, rows q_stride floats apart) over rows [r0, r1) of K
 * and V (rows `stride` elements apart, f32, half or bf16). Writes, per
 * head, the accumulated output (normalized when norm, else unnormalized) to
 * out + g*d, and the state to m_out[g], l_out[g] when given. */
template <typename T>
__device__ void attend_block(const float *q, int G, size_t q_stride, const T *K, const T *V, int r0, int r1,
                             int stride, int d, float scale, float *out, float *m_out, float *l_out, int norm) {
    __shared__ float qs[G_MAX * D_MAX];
    __shared__ float s[G_MAX][TILE];
    __shared__ km_osm st[G_MAX];
    __shared__ float fac[G_MAX];
    int tid = threadIdx.x;
    for (int i = tid; i < G * d; i += blockDim.x) qs[i] = q[(size_t)(i / d) * q_stride + i % d];
    if (tid < G) st[tid] = km_osm_init();
    float acc[G_MAX];
    for (int g = 0; g < G_MAX; g++) acc[g] = 0.0f;
    __syncthreads();
    for (int t0 = r0; t0 < r1; t0 += TILE) {
        int nt = r1 - t0 < TILE ? r1 - t0 : TILE;
        for (int idx = tid; idx < G * TILE; idx += blockDim.x) {
            int g = idx / TILE, j = idx % TILE;
            float v = -INFINITY;
            if (j < nt) {
                const T *k = K + (size_t)(t0 + j) * stride;
                float dot = 0.0f;
                for (int e = 0; e < d; e++) dot += qs[g * d + e] * ld(k + e);
                v = dot * scale;
            }
            s[g][j] = v;
        }
        __syncthreads();
        if (tid < G) {
            /* the tile's weights, head tid: rescale once for the tile's max */
            km_osm o = st[tid];
            float mx = o.m;
            for (int j = 0; j < nt; j++) mx = s[tid][j] > mx ? s[tid][j] : mx;
            float f = o.m == -INFINITY ? 0.0f : expf(o.m - mx);
            float l = o.l * f;
            for (int j = 0; j < nt; j++) {
                float w = mx == -INFINITY ? 0.0f : expf(s[tid][j] - mx);
                s[tid][j] = w;
                l += w;
            }
            o.m = mx;
            o.l = l;
            st[tid] = o;
            fac[tid] = f;
        }
        __syncthreads();
        if (tid < d) {
            for (int g = 0; g < G; g++) acc[g] *= fac[g];
            for (int j = 0; j < nt; j++) {
                float v = ld(V + (size_t)(t0 + j) * stride + tid);
                for (int g = 0; g < G; g++) acc[g] += s[g][j] * v;
            }
        }
        __syncthreads();
    }
    if (tid < d)
        for (int g = 0; g < G; g++) {
            float l = st[g].l;
            out[(size_t)g * d + tid] = norm ? (l > 0 ? acc[g] / l : 0.0f) : acc[g];
        }
    if (m_out && tid < G) {
        m_out[tid] = st[tid].m;
        l_out[tid] = st[tid].l;
    }
}

/* K and V rows of type T: float, or bf16r (attend_group's SKV_ELT_BF16). */
template <typename T>
__global__ void k_attend_group(const float *q, int G, const T *K, const T *V, int n, int d, int stride, float scale,
                               float *out, float *m, float *l) {
    attend_block(q, G, (size_t)d, K, V, 0, n, stride, d, scale, out, m, l, m == NULL);
}

void cu_attend_rows(const float *q, const float *K, const float *V, int n, int d, int stride, float scale,
                    float *out) {
    SKV_ASSERT(d <= D_MAX);
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    SKV_LAUNCH(k_attend_group<float>, 1, THREADS, 0, st)(q, 1, K, V, n, d, stride, scale, out, NULL, NULL);
    CKL();
    cuda_span_end(sp, 0, "attend");
}

void cu_attend_group(const float *q, int g, const void *K, const void *V, int elt, int n, int d, int stride,
                     float scale, float *out, float *m, float *l) {
    SKV_ASSERT(g >= 1 && g <= G_MAX && d <= D_MAX && (elt == SKV_ELT_F32 || elt == SKV_ELT_BF16));
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    if (elt == SKV_ELT_BF16)
        SKV_LAUNCH(k_attend_group<bf16r>, 1, THREADS, 0, st)(q, g, (const bf16r *)K, (const bf16r *)V, n, d, stride,
                                                             scale, out, m, l);
    else
        SKV_LAUNCH(k_attend_group<float>, 1, THREADS, 0, st)(q, g, (const float *)K, (const float *)V, n, d, stride,
                                                             scale, out, m, l);
    CKL();
    cuda_span_end(sp, 0, "attend");
}

/* Dimension e of head a merged from `parts` partial results, part p's at
 * o + p*pstride (outputs, rows of d) and m, l + p*mstride: attend_merge's
 * rule (km_osm_merge; an empty part weighs nothing). */
__device__ float merge_dim(int parts, int a, int e, int d, const float *o, size_t pstride, const float *m,
                           const float *l, size_t mstride) {
    km_osm acc = km_osm_init();
    float y = 0.0f;
    for (int p = 0; p < parts; p++) {
        km_osm b;
        b.m = m[p * mstride + a];
        b.l = l[p * mstride + a];
        float fa, fb;
        km_osm_merge(&acc, b, &fa, &fb);
        y = y * fa + fb * o[p * pstride + (size_t)a * d + e];
    }
    return acc.l > 0 ? y / acc.l : 0.0f;
}

/* out (g, d) from `parts` partial results: block a (head), thread e (dim). */
__global__ void k_attend_merge(int parts, int g, int d, const float *o, const float *m, const float *l, float *out) {
    int a = blockIdx.x, e = threadIdx.x;
    if (e < d) out[(size_t)a * d + e] = merge_dim(parts, a, e, d, o, (size_t)g * d, m, l, (size_t)g);
}

void cu_attend_merge(int parts, int g, int d, const float *o, const float *m, const float *l, float *out) {
    SKV_LAUNCH(k_attend_merge, g, d <= 32 ? 32 : (d + 31) / 32 * 32, 0, cuda_after_fetch())(parts, g, d, o, m, l, out);
    CKL();
}

/* ---- decode: split-K flash-decoding over a batch of sequences ---------------
 *
 * One launch attends every sequence's decode query over its whole cache:
 * block (p, kh, s) takes part p of sequence s's rows of KV head kh for the
 * G query heads of its group, so each K and V row is read once for the
 * group; flash_decode.h's fd_attend is the block's work (shared with
 * ShadowKV's k_sk_step_attend), its partial results merged by the last
 * part to finish (a counter per (sequence, KV head)), so the merge costs
 * no launch. The sequences' caches and row
 * counts travel in the kernel's parameters (FD_SEQ_MAX a launch): no host
 * table, no copy, no sync. */
#define FD_SEQ_MAX 64       /* sequences a launch (2 KiB of parameters) */
#define FD_MIN_ROWS 256     /* rows a part at least */
#define FD_SPLIT_MAX 256

struct fd_seq {
    void *k, *v;            /* the cache of one layer: float or __half, KV head kh's rows at + kh*head_stride */
    long long head_stride;  /* elements */
    int rows;               /* rows attended; the store writes row rows - 1 */
    int pad_;
};
struct fd_batch {
    fd_seq s[FD_SEQ_MAX];
};

/* q and out (n, n_kv*G*d); part p of sequence s's rows of KV head kh.
 * po (tasks, G, d) and pml (tasks, G, 2) the partial results, task
 * (s*n_kv + kh)*splits + p; cnt (n*n_kv) the parts done, 0 between launches.
 * Four blocks fit a multiprocessor (FD_MIN_BLOCKS: two for groups over 4,
 * three for groups of 3-4 over unaligned rows), which fd_split_cap counts
 * on. */
template <typename C>
__global__ void __launch_bounds__(FD_WARPS * 32, FD_MIN_BLOCKS(C))
k_flash_decode(fd_batch b, const float *q, int n_kv, int G, int d, int stride, int tpr, float qscale, float *po,
               float *pml, unsigned *cnt, float *out) {
    typedef typename C::T T;
    SKV_DYN_SHARED(float, sh); /* (FD_WARPS, G, d) outputs, then (FD_WARPS, G, 2) max and sum */
    __shared__ int last;
    int p = blockIdx.x, kh = blockIdx.y, s = blockIdx.z, splits = gridDim.x;
    int rows = b.s[s].rows;
    int parts = rows / FD_MIN_ROWS < splits ? rows / FD_MIN_ROWS : splits;
    if (parts < 1) parts = 1;
    if (p >= parts) return;
    int r0 = (int)((long long)rows * p / parts), r1 = (int)((long long)rows * (p + 1) / parts);
    const T *K = (const T *)b.s[s].k + kh * b.s[s].head_stride, *V = (const T *)b.s[s].v + kh * b.s[s].head_stride;
    size_t g0 = (size_t)s * n_kv + kh, qoff = g0 * G * d;
    fd_attend<C>(K, V, stride, r0, r1, q + qoff, qscale, G, d, tpr, p, parts, po, pml, g0 * splits, cnt, (int)g0,
                 out, qoff, sh, &last);
}

/* Stores row rows-1 of every sequence's cache, KV head kh's at + kh*head_stride
 * (rows d apart): element i of k and v (n, n_kv*d). */
__device__ __forceinline__ void fd_put(float *p, float x) { *p = x; }
__device__ __forceinline__ void fd_put(__half *p, float x) { *p = __float2half_rn(x); }
template <typename T>
__global__ void k_kv_store_batch(fd_batch b, int n, int n_kv, int d, const float *k, const float *v) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, per = (size_t)n_kv * d;
    if (i >= (size_t)n * per) return;
    int s = (int)(i / per), kh = (int)(i % per / d), e = (int)(i % d);
    size_t at = (size_t)kh * b.s[s].head_stride + (size_t)(b.s[s].rows - 1) * d + e;
    fd_put((T *)b.s[s].k + at, k[i]);
    fd_put((T *)b.s[s].v + at, v[i]);
}

static int fd_sm_count(void) {
    static int n_sm = 0;
    if (!n_sm) CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    return n_sm;
}

/* Parts of the rows a sequence's (KV head) may take in a launch of n
 * sequences: at most four blocks a multiprocessor in all, rounded down, so
 * that the blocks (which read equal shares) fit one wave where four fit a
 * multiprocessor (groups up to 4) or two whole waves (8), not one wave and
 * a few blocks. */
static int fd_split_cap(int n, int n_kv) {
    int c = 4 * fd_sm_count() / (n * n_kv);
    return c < 1 ? 1 : c > FD_SPLIT_MAX ? FD_SPLIT_MAX : c;
}

/* The counters of the fused merge: zeroed once, kept for the process (each
 * launch leaves them 0), grown (stream-ordered) when a launch needs more. */
static unsigned *fd_counters(size_t n, cudaStream_t st) {
    static unsigned *cnt = NULL;
    static size_t have = 0;
    if (n > have) {
        size_t want = n < 4096 ? 4096 : n;
        if (cnt) CK(cudaFreeAsync(cnt, st));
        CK(cudaMallocAsync(&cnt, sizeof(unsigned) * want, st));
        CK(cudaMemsetAsync(cnt, 0, sizeof(unsigned) * want, st));
        have = want;
    }
    return cnt;
}

template <typename C>
static void fd_launch(dim3 grid, size_t smem, cudaStream_t st, const fd_batch &b, const float *q, int n_kv, int G,
                      int d, int stride, int tpr, float qscale, float *po, float *pml, unsigned *cnt, float *out) {
    SKV_LAUNCH(k_flash_decode<C>, grid, FD_WARPS * 32, smem, st)(b, q, n_kv, G, d, stride, tpr, qscale, po, pml, cnt,
                                                                 out);
}

/* The configuration for a group of G: the smallest register group that holds it. */
template <typename T, int VEC, int NV>
static void fd_launch_g(int G, dim3 grid, size_t smem, cudaStream_t st, const fd_batch &b, const float *q, int n_kv,
                        int d, int stride, int tpr, float qscale, float *po, float *pml, unsigned *cnt, float *out) {
    if (G <= 1)
        fd_launch<fd_cfg<T, VEC, NV, 1>>(grid, smem, st, b, q, n_kv, G, d, stride, tpr, qscale, po, pml, cnt, out);
    else if (G <= 2)
        fd_launch<fd_cfg<T, VEC, NV, 2>>(grid, smem, st, b, q, n_kv, G, d, stride, tpr, qscale, po, pml, cnt, out);
    else if (G <= 4)
        fd_launch<fd_cfg<T, VEC, NV, 4>>(grid, smem, st, b, q, n_kv, G, d, stride, tpr, qscale, po, pml, cnt, out);
    else
        fd_launch<fd_cfg<T, VEC, NV, 8>>(grid, smem, st, b, q, n_kv, G, d, stride, tpr, qscale, po, pml, cnt, out);
}

/* Decode attention of n sequences (seq[i]: its cache and rows), queries
 * and outputs (n, n_heads*d), rows stride elements apart: one launch for
 * up to FD_SEQ_MAX sequences. */
template <typename T>
static int fd_run(const fd_seq *seq, int n, int n_heads, int n_kv, int d, int stride, const float *q, float *out) {
    SKV_ASSERT(n >= 1 && n_kv >= 1 && n_heads % n_kv == 0);
    int G = n_heads / n_kv;
    if (G > G_MAX || d > D_MAX)
        return skv_error(SKV_EUNSUPPORTED, "cuda: attention of %d query heads per KV head of dim %d (at most %d and %d)",
                         G, d, G_MAX, D_MAX);
    float qscale = 1.4426950408889634f / sqrtf((float)d); /* 1/sqrt(d), in base 2 */
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    for (int i0 = 0; i0 < n; i0 += FD_SEQ_MAX) {
        int nb = n - i0 < FD_SEQ_MAX ? n - i0 : FD_SEQ_MAX, max_rows = 0;
        fd_batch b;
        memset(&b, 0, sizeof b);
        /* 16-byte loads where every row of every cache starts on 16 bytes */
        int vec = (size_t)d * sizeof(T) % 16 == 0 && (size_t)stride * sizeof(T) % 16 == 0;
        for (int i = 0; i < nb; i++) {
            b.s[i] = seq[i0 + i];
            max_rows = b.s[i].rows > max_rows ? b.s[i].rows : max_rows;
            vec &= (uintptr_t)b.s[i].k % 16 == 0 && (uintptr_t)b.s[i].v % 16 == 0 &&
                   (size_t)b.s[i].head_stride * sizeof(T) % 16 == 0;
        }
        int splits = fd_split_cap(nb, n_kv), cap = splits;
        if (splits > max_rows / FD_MIN_ROWS) splits = max_rows / FD_MIN_ROWS;
        if (splits < 1) splits = 1;
        /* the partial results, sized for the most parts this batch can take
         * and taken whether it splits or not: a step allocates nothing once
         * the first has filled the pool, however long the caches grow */
        size_t tasks = (size_t)nb * n_kv * cap;
        float *po = (float *)cuda_scratch(sizeof(float) * tasks * G * (d + 2)), *pml = po + tasks * G * d;
        unsigned *cnt = fd_counters((size_t)nb * n_kv, st);
        dim3 grid(splits, n_kv, nb);
        size_t smem = sizeof(float) * FD_WARPS * G * (d + 2);
        size_t qo = (size_t)i0 * n_heads * d;
        const float *qb = q + qo;
        float *ob = out + qo;
        /* lanes a row (tpr): enough 16-byte slices to cover it, at most a warp */
        if (!vec)
            fd_launch_g<T, 1, 8>(G, grid, smem, st, b, qb, n_kv, d, stride, d < 32 ? fd_pow2(d) : 32, qscale, po, pml,
                                 cnt, ob);
        else if constexpr (sizeof(T) == 4) {
            if (d <= 128)
                fd_launch_g<T, 4, 1>(G, grid, smem, st, b, qb, n_kv, d, stride, fd_pow2(d / 4), qscale, po, pml, cnt,
                                     ob);
            else
                fd_launch_g<T, 4, 2>(G, grid, smem, st, b, qb, n_kv, d, stride, 32, qscale, po, pml, cnt, ob);
        } else {
            fd_launch_g<T, 8, 1>(G, grid, smem, st, b, qb, n_kv, d, stride, fd_pow2(d / 8), qscale, po, pml, cnt, ob);
        }
        CKL();
        cuda_scratch_free(po);
    }
    cuda_span_end(sp, 0, "attention");
    return 0;
}

int cu_attend_decode(const float *q, int n_heads, int n_kv, int d, const float *K, const float *V, int rows,
                     int stride, size_t head_stride, float *out) {
    fd_seq s = {(void *)K, (void *)V, (long long)head_stride, rows, 0};
    return fd_run<float>(&s, 1, n_heads, n_kv, d, stride, q, out);
}

int cu_attend_decode_h(const float *q, int n_heads, int n_kv, int d, const uint16_t *K, const uint16_t *V, int rows,
                       int stride, size_t head_stride, float *out) {
    fd_seq s = {(void *)K, (void *)V, (long long)head_stride, rows, 0};
    return fd_run<__half>(&s, 1, n_heads, n_kv, d, stride, q, out);
}

/* The backend's sequences as the kernels' (rows: pos + 1). */
static void fd_seqs(const skv_kv_seq *seq, int n, fd_seq *out) {
    for (int i = 0; i < n; i++) out[i] = fd_seq{seq[i].k, seq[i].v, (long long)seq[i].head_stride, seq[i].pos + 1, 0};
}

template <typename T>
static int fd_batch_run(const skv_kv_seq *seq, int n, int n_heads, int n_kv, int d, const float *q, float *out) {
    fd_seq local[FD_SEQ_MAX];
    for (int i0 = 0; i0 < n; i0 += FD_SEQ_MAX) {
        int nb = n - i0 < FD_SEQ_MAX ? n - i0 : FD_SEQ_MAX;
        fd_seqs(seq + i0, nb, local);
        size_t qo = (size_t)i0 * n_heads * d;
        int rc = fd_run<T>(local, nb, n_heads, n_kv, d, d, q + qo, out + qo);
        if (rc) return rc;
    }
    return 0;
}

int cu_attend_decode_batch(const skv_kv_seq *seq, int n, int n_heads, int n_kv, int d, const float *q, float *out) {
    return fd_batch_run<float>(seq, n, n_heads, n_kv, d, q, out);
}

int cu_attend_decode_batch_h(const skv_kv_seq *seq, int n, int n_heads, int n_kv, int d, const float *q,
                             float *out) {
    return fd_batch_run<__half>(seq, n, n_heads, n_kv, d, q, out);
}

template <typename T>
static void kv_store_batch_t(const skv_kv_seq *seq, int n, int n_kv, int d, const float *k, const float *v) {
    cudaStream_t st = cuda_after_fetch();
    for (int i0 = 0; i0 < n; i0 += FD_SEQ_MAX) {
        int nb = n - i0 < FD_SEQ_MAX ? n - i0 : FD_SEQ_MAX;
        fd_batch b;
        memset(&b, 0, sizeof b);
        fd_seqs(seq + i0, nb, b.s);
        size_t total = (size_t)nb * n_kv * d, off = (size_t)i0 * n_kv * d;
        SKV_LAUNCH(k_kv_store_batch<T>, cuda_blocks(total, 256), 256, 0, st)(b, nb, n_kv, d, k + off, v + off);
        CKL();
    }
}

void cu_kv_store_batch(const skv_kv_seq *seq, int n, int n_kv, int d, const float *k, const float *v) {
    kv_store_batch_t<float>(seq, n, n_kv, d, k, v);
}

void cu_kv_store_batch_h(const skv_kv_seq *seq, int n, int n_kv, int d, const float *k, const float *v) {
    kv_store_batch_t<__half>(seq, n, n_kv, d, k, v);
}

/* Causal attention: block (i, h) for query i (position pos+i) of head h. */
template <typename T>
__global__ void k_attend_causal(const float *q, int pos, int n_heads, int grp, int d, const T *K, const T *V,
                                int stride, size_t head_stride, float scale, float *out) {
    int i = blockIdx.x, h = blockIdx.y, kh = h / grp;
    size_t qo = (size_t)i * n_heads * d + (size_t)h * d;
    attend_block(q + qo, 1, (size_t)d, K + kh * head_stride, V + kh * head_stride, 0, pos + i + 1, stride, d, scale,
                 out + qo, NULL, NULL, 1);
}

/* ---- prefill on tensor cores: flash attention ------------------------------
 *
 * Block (row tile, KV head): the rows of a tile are (query, head of the GQA
 * group) pairs, row R = query R / grp of query head kh·grp + R % grp, FA_ROWS
 * of them (so one staging of a key tile serves the whole group; a group that
 * does not divide the tile just splits a query's heads over two blocks), each
 * masked causally by its own position pos + R / grp. Key tiles of FA_BN rows
 * up to the tile's last position, K and V staged once per tile for the
 * group in shared memory in rows padded by FA_PAD elements (the fragment
 * loads below are then free of bank conflicts), double-buffered: a half
 * cache (--f16-kv) is copied with cp.async (the next tile's copies in flight
 * while this one is computed); an f32 cache too, as it is into a tile of
 * floats, each thread rounding the chunks it copied to bf16 into the other
 * buffer once this tile's compute is done.
 *
 * Each of the FA_WARPS warps owns 16 rows. Its Q fragments (scaled by the
 * softmax scale, rounded to the operand type) and its O accumulator (16 x
 * D, f32) stay in registers for the whole launch, in mma_util.h's m16n8k16
 * fragment layout: lane (g, t) holds rows g and g+8. Per key tile: S = Q Kᵀ
 * (FA_BN/8 accumulator tiles), the causal mask, the online softmax in the
 * log2 domain (the row max over the 4 lanes of a row by two shuffles; each
 * lane rescales its own rows of O and keeps a partial row sum, summed over
 * the 4 lanes at the end), then O += P V with P's fragments taken straight
 * from S's accumulators (mma_util.h). The B fragments of K and V come from
 * shared memory by ldmatrix (mma_util.h's ldsm_x4: four 8x8 matrices a
 * warp instruction, the B registers of two mma; V's transposed by the
 * load), not element by element.
 *
 * Row tiles of 128 (8 warps): each row tile reads the K and V rows up to
 * its last position once, so the rows a block holds set the traffic; at a
 * long prompt that traffic bounds the kernel (at 122,880 tokens of the 8B
 * shape, an f32 cache, 64-row tiles read about 3.9 TB a layer from L2 and
 * memory, 128-row tiles half that). With about 200 registers a thread
 * (ptxas, D = 128) a block of 256 threads fills an SM's registers alone:
 * the same 8 warps an SM as two blocks of 4 had (at D = 64, 142 registers:
 * 8 warps where three blocks of 4 made 12; at D = 32, 16 either way).
 *
 * Shared memory: 2 x 2 x FA_BN x (D + FA_PAD) x 2 bytes: 20 KiB at D = 32,
 * 36 KiB at 64, 68 KiB at 128 (past 48 KiB: the launch sets the attribute);
 * an f32 cache adds 2 x FA_BN x D x 4: 132 KiB in all at D = 128 (an
 * H100 allows 227 KiB a block, an A100 163).
 * Bank conflicts: a row is (D + 8) / 2 words, 4 mod 32 (or 20 at D = 32), so
 * the 8 rows of 16 bytes an ldmatrix phase reads (8 consecutive rows, K's
 * or V's) start 4 (or 20) banks apart and cover the 32 banks once.
 *
 * Rounding, which the CPU twin's test bounds assume (tests/gpu/test_cuda_ops.c,
 * t_flash_prefill): an f32 cache: Q·scale, K, V and P rounded to bf16 (rel L2
 * 2e-2); a half cache: K and V exact, Q·scale and P rounded to f16 (2e-3);
 * products and sums in f32, the row sum of the unrounded P. */
#include <cuda_pipeline.h>
#include "mma_util.h"

#define FA_ROWS 128 /* (query, head) rows a block: 16 a warp */
#define FA_BN 64    /* keys a tile */
#define FA_WARPS 8
#define FA_PAD 8    /* elements after each shared row: 16 bytes, rows stay 16-byte aligned */

/* The tiles' shared memory: K and V, two buffers each, FA_BN rows of d +
 * FA_PAD 2-byte elements; with an f32 cache (elt 4) also one tile of K and
 * V as they are, FA_BN rows of d floats each, which cp.async fills. */
static size_t flash_smem(int d, size_t elt) {
    return sizeof(uint16_t) * 2 * 2 * FA_BN * (size_t)(d + FA_PAD) +
           (elt == 4 ? sizeof(float) * 2 * FA_BN * (size_t)d : 0);
}

/* Aligned pairs and quads: 8- and 16-byte loads and stores (vector types
 * of CUDA's own that the simulator does not have). */
struct __align__(8) fa_f2 {
    float x, y;
};
struct __align__(16) fa_f4 {
    float x, y, z, w;
};
struct __align__(8) fa_u2 {
    uint32_t x, y;
};

/* The mma operand type for a cache element type: bf16 for f32, f16 for half. */
template <typename T>
struct fa_op {
    typedef __nv_bfloat16 type;
};
template <>
struct fa_op<__half> {
    typedef __half type;
};

/* Copies keys [t0, t0 + nk) of K and V by cp.async, 16 bytes a copy,
 * zeros past nk (zfill: nothing read), landing at the caller's wait: a half
 * cache straight into the tiles Kd, Vd ((FA_BN, D + FA_PAD) each); an f32
 * cache as it is into Kf, Vf ((FA_BN, D) floats each), which fa_round then
 * rounds into the tiles. Thread tid copies chunks tid, tid + FA_WARPS·32,
 * ...: the chunks fa_round gives it, so after its own wait it reads only
 * what it copied (no barrier between). */
template <typename T, int D>
__device__ __forceinline__ void fa_fetch(uint16_t *Kd, uint16_t *Vd, float *Kf, float *Vf, const T *Kh, const T *Vh,
                                         int t0, int nk, int stride, int tid) {
    constexpr int E = 16 / sizeof(T), C = D / E; /* elements a copy, copies a row */
    for (int x = tid; x < FA_BN * C; x += FA_WARPS * 32) {
        int r = x / C, c = (x % C) * E;
        void *kd, *vd;
        if constexpr (sizeof(T) == 2) {
            kd = Kd + r * (D + FA_PAD) + c;
            vd = Vd + r * (D + FA_PAD) + c;
        } else {
            kd = Kf + r * D + c;
            vd = Vf + r * D + c;
        }
        if (r < nk) {
            size_t off = (size_t)(t0 + r) * stride + c;
            __pipeline_memcpy_async(kd, Kh + off, 16);
            __pipeline_memcpy_async(vd, Vh + off, 16);
        } else {
            __pipeline_memcpy_async(kd, Kh, 16, 16);
            __pipeline_memcpy_async(vd, Vh, 16, 16);
        }
    }
}

/* An f32 cache's tile, as fa_fetch copied it (this thread's chunks),
 * rounded to bf16 into Kd, Vd. */
template <int D>
__device__ __forceinline__ void fa_round(uint16_t *Kd, uint16_t *Vd, const float *Kf, const float *Vf, int tid) {
    constexpr int C = D / 4;
    for (int x = tid; x < FA_BN * C; x += FA_WARPS * 32) {
        int r = x / C, c = (x % C) * 4;
        fa_f4 k4 = vec_ld((const fa_f4 *)(Kf + r * D + c)), v4 = vec_ld((const fa_f4 *)(Vf + r * D + c));
        vec_st((fa_u2 *)(Kd + r * (D + FA_PAD) + c),
               fa_u2{mma_pack<__nv_bfloat16>(k4.x, k4.y), mma_pack<__nv_bfloat16>(k4.z, k4.w)});
        vec_st((fa_u2 *)(Vd + r * (D + FA_PAD) + c),
               fa_u2{mma_pack<__nv_bfloat16>(v4.x, v4.y), mma_pack<__nv_bfloat16>(v4.z, v4.w)});
    }
}

/* The kernel's configuration, one template parameter (SKV_LAUNCH is a macro). */
template <typename T_, int D_>
struct fa_cfg {
    typedef T_ T;
    static constexpr int D = D_;
};

template <typename C>
__global__ void __launch_bounds__(FA_WARPS * 32)
k_flash_gqa(const float *q, int nq, int pos, int n_heads, int grp, const typename C::T *K, const typename C::T *V,
            int stride, size_t head_stride, float scale, float *out) {
    typedef typename C::T T;
    constexpr int D = C::D;
    typedef typename fa_op<T>::type OpT;
    constexpr int LD = D + FA_PAD, KS = D / 16, NT = FA_BN / 8, DT = D / 8;
    static_assert(DT % 2 == 0 && NT % 2 == 0, "ldmatrix x4 loads the B fragments of two tiles at once");
    constexpr float LOG2E = 1.4426950408889634f;
    SKV_DYN_SHARED(uint16_t, smem);
    uint16_t *Ks = smem;                      /* (2, FA_BN, LD) */
    uint16_t *Vs = smem + 2 * FA_BN * LD;     /* (2, FA_BN, LD) */
    float *Kf = (float *)(smem + 4 * FA_BN * LD); /* an f32 cache's tile as copied: (FA_BN, D) */
    float *Vf = Kf + FA_BN * D;
    int kh = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
    int nrows = nq * grp, r0 = (int)blockIdx.x * FA_ROWS;
    const T *Kh = K + (size_t)kh * head_stride, *Vh = V + (size_t)kh * head_stride;

    /* this lane's rows g and g+8 of the warp's 16: position, or -1 past the end */
    int Ra = r0 + warp * 16 + g, Rb = Ra + 8;
    int pa = Ra < nrows ? pos + Ra / grp : -1, pb = Rb < nrows ? pos + Rb / grp : -1;
    size_t oa = Ra < nrows ? ((size_t)(Ra / grp) * n_heads + (size_t)kh * grp + Ra % grp) * D : 0;
    size_t ob = Rb < nrows ? ((size_t)(Rb / grp) * n_heads + (size_t)kh * grp + Rb % grp) * D : 0;
    int wlast = r0 + warp * 16 + 15 < nrows ? r0 + warp * 16 + 15 : nrows - 1;
    int wmax = r0 + warp * 16 < nrows ? pos + wlast / grp : -1; /* the warp's last position */
    int blast = r0 + FA_ROWS < nrows ? r0 + FA_ROWS - 1 : nrows - 1;
    int nkeys = pos + blast / grp + 1; /* keys some row of the block sees */

    uint32_t qf[KS][4];
    for (int ks = 0; ks < KS; ks++) {
        int c = ks * 16 + 2 * t4;
        fa_f2 a0 = pa >= 0 ? vec_ld((const fa_f2 *)(q + oa + c)) : fa_f2{0, 0};
        fa_f2 a1 = pa >= 0 ? vec_ld((const fa_f2 *)(q + oa + c + 8)) : fa_f2{0, 0};
        fa_f2 b0 = pb >= 0 ? vec_ld((const fa_f2 *)(q + ob + c)) : fa_f2{0, 0};
        fa_f2 b1 = pb >= 0 ? vec_ld((const fa_f2 *)(q + ob + c + 8)) : fa_f2{0, 0};
        qf[ks][0] = mma_pack<OpT>(a0.x * scale, a0.y * scale);
        qf[ks][1] = mma_pack<OpT>(b0.x * scale, b0.y * scale);
        qf[ks][2] = mma_pack<OpT>(a1.x * scale, a1.y * scale);
        qf[ks][3] = mma_pack<OpT>(b1.x * scale, b1.y * scale);
    }
    float o[DT][4];
    for (int j = 0; j < DT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;

    /* The pipeline: tile it+1's copies are in flight while tile it is
     * computed. A half cache lands in the other tile buffer; an f32 cache in
     * Kf, Vf, rounded into the other buffer after the compute (that buffer
     * was last read by tile it-1's compute, before this tile's barrier). */
    int ntiles = (nkeys + FA_BN - 1) / FA_BN;
    fa_fetch<T, D>(Ks, Vs, Kf, Vf, Kh, Vh, 0, nkeys < FA_BN ? nkeys : FA_BN, stride, tid);
    __pipeline_commit();
    if constexpr (sizeof(T) == 4) {
        __pipeline_wait_prior(0);
        fa_round<D>(Ks, Vs, Kf, Vf, tid);
        /* the reads of Kf, Vf done before the loop refills them (cp.async
         * writes are not ordered after earlier loads) */
        __syncthreads();
    }
    for (int it = 0; it < ntiles; it++) {
        int cur = it & 1, t0 = it * FA_BN;
        if (it + 1 < ntiles) {
            int t1 = t0 + FA_BN, n1 = nkeys - t1 < FA_BN ? nkeys - t1 : FA_BN;
            fa_fetch<T, D>(Ks + (cur ^ 1) * FA_BN * LD, Vs + (cur ^ 1) * FA_BN * LD, Kf, Vf, Kh, Vh, t1, n1, stride,
                           tid);
            __pipeline_commit();
            /* a half cache: this tile's copies landed, the next one's in flight */
            if constexpr (sizeof(T) == 2) __pipeline_wait_prior(1);
        } else if constexpr (sizeof(T) == 2) {
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        if (t0 <= wmax) { /* a warp whose rows all precede the tile skips it (warp-uniform) */
            const uint16_t *Kt = Ks + cur * FA_BN * LD, *Vt = Vs + cur * FA_BN * LD;
            float s[NT][4];
            for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            for (int ks = 0; ks < KS; ks++)
                for (int j = 0; j < NT; j += 2) {
                    /* B (dims × keys) of key tiles j and j+1, one ldmatrix: lane 8m + i gives the row
                     * of key (j + m/2)·8 + i at dims ks·16 + (m%2)·8; register m then holds dims
                     * 2t, 2t+1 (+8 for odd m) of key g of its tile */
                    uint32_t b[4];
                    ldsm_x4<false>(b, Kt + ((j + (lane >> 4)) * 8 + (lane & 7)) * LD + ks * 16 + ((lane >> 3) & 1) * 8);
                    mma_16816<OpT>(s[j], qf[ks], b);
                    mma_16816<OpT>(s[j + 1], qf[ks], b + 2);
                }
            /* mask, row max (log2 domain) over the quad's 4 lanes */
            float xa = -INFINITY, xb = -INFINITY;
            for (int j = 0; j < NT; j++)
                for (int e = 0; e < 4; e++) {
                    int key = t0 + j * 8 + 2 * t4 + (e & 1), p = e < 2 ? pa : pb;
                    float v = key <= p ? s[j][e] * LOG2E : -INFINITY;
                    s[j][e] = v;
                    if (e < 2) xa = fmaxf(xa, v);
                    else xb = fmaxf(xb, v);
                }
            for (int m = 1; m <= 2; m <<= 1) {
                xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, m));
                xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, m));
            }
            float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
            float fa = ma == -INFINITY ? 0.0f : exp2f(ma - na), fb = mb == -INFINITY ? 0.0f : exp2f(mb - nb);
            ma = na;
            mb = nb;
            la *= fa;
            lb *= fb;
            for (int j = 0; j < DT; j++) {
                o[j][0] *= fa;
                o[j][1] *= fa;
                o[j][2] *= fb;
                o[j][3] *= fb;
            }
            for (int j = 0; j < NT; j++)
                for (int e = 0; e < 4; e++) {
                    float m = e < 2 ? na : nb;
                    float p = m == -INFINITY ? 0.0f : exp2f(s[j][e] - m);
                    s[j][e] = p;
                    if (e < 2) la += p;
                    else lb += p;
                }
            /* O += P V: P's A fragment for keys [16kk, 16kk+16) is S tiles 2kk and 2kk+1 */
            for (int kk = 0; kk < FA_BN / 16; kk++) {
                uint32_t a[4] = {mma_pack<OpT>(s[2 * kk][0], s[2 * kk][1]), mma_pack<OpT>(s[2 * kk][2], s[2 * kk][3]),
                                 mma_pack<OpT>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                 mma_pack<OpT>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
                /* lane 8m + i's row: key kk·16 + (m%2)·8 + i, from dim (j + m/2)·8 */
                const uint16_t *v0 = Vt + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8;
                for (int j = 0; j < DT; j += 2) {
                    /* B (keys × dims) of dim tiles j and j+1, one transposing ldmatrix: register m
                     * holds keys 2t, 2t+1 (+8 for odd m) of dim g of its tile */
                    uint32_t b[4];
                    ldsm_x4<true>(b, v0 + j * 8);
                    mma_16816<OpT>(o[j], a, b);
                    mma_16816<OpT>(o[j + 1], a, b + 2);
                }
            }
        }
        if constexpr (sizeof(T) == 4)
            if (it + 1 < ntiles) { /* the next tile, copied while this one was computed, rounded */
                __pipeline_wait_prior(0);
                fa_round<D>(Ks + (cur ^ 1) * FA_BN * LD, Vs + (cur ^ 1) * FA_BN * LD, Kf, Vf, tid);
            }
        __syncthreads(); /* the buffer is free for the tile after next */
    }
    for (int m = 1; m <= 2; m <<= 1) {
        la += __shfl_xor_sync(0xffffffffu, la, m);
        lb += __shfl_xor_sync(0xffffffffu, lb, m);
    }
    float ia = la > 0.0f ? 1.0f / la : 0.0f, ib = lb > 0.0f ? 1.0f / lb : 0.0f;
    for (int j = 0; j < DT; j++) {
        int c = j * 8 + 2 * t4;
        if (pa >= 0) vec_st((fa_f2 *)(out + oa + c), fa_f2{o[j][0] * ia, o[j][1] * ia});
        if (pb >= 0) vec_st((fa_f2 *)(out + ob + c), fa_f2{o[j][2] * ib, o[j][3] * ib});
    }
}

/* Whether attend_causal takes the tensor-core path: a prefill of at least
 * a fragment's queries, a head dim of 32, 64, 96 or 128 (the instantiated
 * kernels; the demo models have 32, Llama 3 128; 256 would take about 300
 * registers a thread for its O and Q fragments, past the 255 a thread may
 * have), rows whose 16-byte chunks
 * are aligned (cp.async, vector loads; q and out 8-byte aligned), and a
 * device whose shared memory holds the tiles. Other shapes take
 * k_attend_causal. */
static int flash_ok(int nq, int d, const float *q, const float *out, const void *K, const void *V, int stride,
                    size_t head_stride, size_t elt) {
    static int max_smem = -1;
    if (max_smem < 0) CK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    return nq >= 16 && (d == 32 || d == 64 || d == 96 || d == 128) && (uintptr_t)q % 8 == 0 &&
           (uintptr_t)out % 8 == 0 &&
           (uintptr_t)K % 16 == 0 && (uintptr_t)V % 16 == 0 && (stride * elt) % 16 == 0 &&
           (head_stride * elt) % 16 == 0 && flash_smem(d, elt) <= (size_t)max_smem;
}

template <typename T, int D>
static void flash_launch(const float *q, int nq, int pos, int n_heads, int n_kv_heads, const T *K, const T *V,
                         int stride, size_t head_stride, float scale, float *out, cudaStream_t st) {
    size_t sm = flash_smem(D, sizeof(T));
    int grp = n_heads / n_kv_heads;
    typedef fa_cfg<T, D> C;
    CK(cudaFuncSetAttribute(k_flash_gqa<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    SKV_LAUNCH(k_flash_gqa<C>, dim3(cuda_blocks((size_t)nq * grp, FA_ROWS), n_kv_heads), FA_WARPS * 32, sm, st)(
        q, nq, pos, n_heads, grp, K, V, stride, head_stride, scale, out);
}

template <typename T>
static void attend_causal_t(const float *q, int nq, int pos, int n_heads, int n_kv_heads, int d, const T *K,
                            const T *V, int stride, size_t head_stride, float *out) {
    SKV_ASSERT(d <= D_MAX);
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    float scale = 1.0f / sqrtf((float)d);
    if (flash_ok(nq, d, q, out, K, V, stride, head_stride, sizeof(T))) {
        if (d == 32) flash_launch<T, 32>(q, nq, pos, n_heads, n_kv_heads, K, V, stride, head_stride, scale, out, st);
        else if (d == 64) flash_launch<T, 64>(q, nq, pos, n_heads, n_kv_heads, K, V, stride, head_stride, scale, out, st);
        else if (d == 96) flash_launch<T, 96>(q, nq, pos, n_heads, n_kv_heads, K, V, stride, head_stride, scale, out, st);
        else flash_launch<T, 128>(q, nq, pos, n_heads, n_kv_heads, K, V, stride, head_stride, scale, out, st);
    } else {
        SKV_LAUNCH(k_attend_causal<T>, dim3(nq, n_heads), THREADS, 0, st)(q, pos, n_heads, n_heads / n_kv_heads, d, K, V,
                                                                  stride, head_stride, scale, out);
    }
    CKL();
    cuda_span_end(sp, 0, "attention");
}

void cu_attend_causal(const float *q, int nq, int pos, int n_heads, int n_kv_heads, int d, const float *K,
                      const float *V, int stride, size_t head_stride, float *out) {
    attend_causal_t(q, nq, pos, n_heads, n_kv_heads, d, K, V, stride, head_stride, out);
}

void cu_attend_causal_h(const float *q, int nq, int pos, int n_heads, int n_kv_heads, int d, const uint16_t *K,
                        const uint16_t *V, int stride, size_t head_stride, float *out) {
    attend_causal_t(q, nq, pos, n_heads, n_kv_heads, d, (const __half *)K, (const __half *)V, stride, head_stride,
                    out);
}
