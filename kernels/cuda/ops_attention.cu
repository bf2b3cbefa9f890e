/* ops_attention.cu: exact attention on the GPU.
 *
 * One block attends the G query heads of a GQA group over a range of rows
 * with an online softmax (kmath.h's km_osm): per tile of 64 rows it scores
 * every (head, row) pair, updates each head's running max and sum, and each
 * thread, owning one dimension, adds the tile's weighted value rows to its G
 * accumulators, so every K and V row is read once for the whole group.
 * - attend_rows / attend_group: one block (a row set, ShadowKV's sparse set);
 * - attend_decode and attend_decode_batch: split-K flash-decoding, one
 *   launch over (part of the rows, KV head, sequence) with 16-byte loads and
 *   the parts merged by the last to finish (below); kv_store_batch stores a
 *   batch's rows in one launch;
 * - attend_causal: a prefill on tensor cores (flash attention, WMMA bf16, below);
 *   a few queries (a block per (query, head) over the causal prefix) in f32.
 * The CPU twins are kernels/cpu/backend_cpu.c's ops of the same names. */
#include "cuda_util.h"

#define TILE 64
#define G_MAX 8
#define THREADS 256
#define D_MAX 256

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

/* A cache element as f32: the f32 cache's own, or a half-precision
 * (--f16-kv) element widened exactly. */
__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }

/* Attends q (G heads, rows q_stride floats apart) over rows [r0, r1) of K
 * and V (rows `stride` elements apart, f32 or half). Writes, per head, the accumulated output
 * (normalized when norm, else unnormalized) to out + g*d, and the state to
 * m_out[g], l_out[g] when given. */
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

__global__ void k_attend_group(const float *q, int G, const float *K, const float *V, int n, int d, int stride,
                               float scale, float *out, float *m, float *l) {
    attend_block(q, G, (size_t)d, K, V, 0, n, stride, d, scale, out, m, l, m == NULL);
}

void cu_attend_rows(const float *q, const float *K, const float *V, int n, int d, int stride, float scale,
                    float *out) {
    SKV_ASSERT(d <= D_MAX);
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    SKV_LAUNCH(k_attend_group, 1, THREADS, 0, st)(q, 1, K, V, n, d, stride, scale, out, NULL, NULL);
    CKL();
    cuda_span_end(sp, 0, "attend");
}

void cu_attend_group(const float *q, int g, const float *K, const float *V, int n, int d, int stride, float scale,
                     float *out, float *m, float *l) {
    SKV_ASSERT(g >= 1 && g <= G_MAX && d <= D_MAX);
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    SKV_LAUNCH(k_attend_group, 1, THREADS, 0, st)(q, g, K, V, n, d, stride, scale, out, m, l);
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
 * group. Inside a block a row group of `tpr` lanes owns a row at a time:
 * each lane loads its 16-byte slices of the row's key and value (4 floats
 * or 8 halves; one element where the rows are not aligned for that), the
 * group's dot products are summed over the row group by shuffles, and each
 * row group keeps its own online softmax (scores in base 2, log2(e) folded
 * into the query's scale). The row groups of a warp merge by shuffles, the
 * warps through shared memory. A sequence of several parts writes a
 * partial result (unnormalized output, max, sum); the part that finishes
 * last (a counter per (sequence, KV head)) merges them and resets the
 * counter, so the merge costs no launch. The sequences' caches and row
 * counts travel in the kernel's parameters (FD_SEQ_MAX a launch): no host
 * table, no copy, no sync. */
#define FD_WARPS 4
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

/* 16 bytes of a row, loaded at once (LDG.128 under nvcc). */
#ifdef __CUDACC__
typedef uint4 fd_raw;
__device__ __forceinline__ float fd_as_float(unsigned w) { return __uint_as_float(w); }
__device__ __forceinline__ float fd_half(unsigned short b) { return __half2float(__ushort_as_half(b)); }
#else
struct __align__(16) fd_raw {
    unsigned x, y, z, w;
};
static inline float fd_as_float(unsigned w) {
    float f;
    memcpy(&f, &w, 4);
    return f;
}
static inline float fd_half(unsigned short b) {
    __half h;
    h.x = b;
    return __half2float(h);
}
#endif
/* A cache row is read once a step: a streaming load (evict first), so it
 * does not push out what the step reads again. */
__device__ __forceinline__ fd_raw fd_stream(const void *p) {
#ifdef __CUDACC__
    return __ldcs((const uint4 *)p);
#else
    return *(const fd_raw *)p;
#endif
}
__device__ __forceinline__ unsigned fd_word(const fd_raw &r, int c) {
    return c == 0 ? r.x : c == 1 ? r.y : c == 2 ? r.z : r.w;
}

/* A lane's slice of a row: VEC elements of T, element c as f32. */
template <typename T, int VEC>
struct fd_frag;
template <>
struct fd_frag<float, 4> {
    fd_raw r;
    __device__ __forceinline__ void load(const float *p) { r = fd_stream(p); }
    __device__ __forceinline__ void zero() { r.x = r.y = r.z = r.w = 0u; }
    __device__ __forceinline__ float get(int c) const { return fd_as_float(fd_word(r, c)); }
};
template <>
struct fd_frag<__half, 8> {
    fd_raw r;
    __device__ __forceinline__ void load(const __half *p) { r = fd_stream(p); }
    __device__ __forceinline__ void zero() { r.x = r.y = r.z = r.w = 0u; }
    __device__ __forceinline__ float get(int c) const {
        return fd_half((unsigned short)(fd_word(r, c >> 1) >> ((c & 1) * 16)));
    }
};
template <typename T>
struct fd_frag<T, 1> {
    float x;
    __device__ __forceinline__ void load(const T *p) { x = ld(p); }
    __device__ __forceinline__ void zero() { x = 0.0f; }
    __device__ __forceinline__ float get(int) const { return x; }
};

/* One kernel configuration: the cache's element type, elements a load
 * (VEC), loads a lane covers of a row (NV), and the largest group size
 * (GM >= G) its registers hold. */
template <typename T_, int VEC_, int NV_, int GM_>
struct fd_cfg {
    typedef T_ T;
    /* E: elements a lane holds of a row; U: rows a row group loads ahead (fewer where a row's slice, or the
     * group's accumulators, take many registers) */
    enum { VEC = VEC_, NV = NV_, GM = GM_, E = VEC_ * NV_, U = GM_ >= 8 || NV_ * (VEC_ == 1 ? 1 : 4) >= 8 ? 2 : 4 };
};

/* q and out (n, n_kv*G*d); part p of sequence s's rows of KV head kh.
 * po (tasks, G, d) and pml (tasks, G, 2) the partial results, task
 * (s*n_kv + kh)*splits + p; cnt (n*n_kv) the parts done, 0 between launches.
 * Four blocks fit a multiprocessor (two for groups over 4: their registers),
 * which fd_split_cap counts on. */
template <typename C>
__global__ void __launch_bounds__(FD_WARPS * 32, C::GM >= 8 ? 2 : 4)
k_flash_decode(fd_batch b, const float *q, int n_kv, int G, int d, int stride, int tpr, float qscale, float *po,
               float *pml, unsigned *cnt, float *out) {
    typedef typename C::T T;
    enum { VEC = C::VEC, NV = C::NV, GM = C::GM, E = C::E, U = C::U };
    SKV_DYN_SHARED(float, sh); /* (FD_WARPS, G, d) outputs, then (FD_WARPS, G, 2) max and sum */
    __shared__ int last;
    int p = blockIdx.x, kh = blockIdx.y, s = blockIdx.z, splits = gridDim.x;
    int rows = b.s[s].rows;
    int parts = rows / FD_MIN_ROWS < splits ? rows / FD_MIN_ROWS : splits;
    if (parts < 1) parts = 1;
    if (p >= parts) return;
    int r0 = (int)((long long)rows * p / parts), r1 = (int)((long long)rows * (p + 1) / parts);
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int rpw = 32 / tpr, nrg = FD_WARPS * rpw, rg = warp * rpw + lane / tpr, sub = lane % tpr;
    int nvec = (d + VEC - 1) / VEC;
    const T *K = (const T *)b.s[s].k + kh * b.s[s].head_stride, *V = (const T *)b.s[s].v + kh * b.s[s].head_stride;
    size_t qoff = ((size_t)s * n_kv + kh) * G * d;
    float qr[GM][E], acc[GM][E], m[GM], l[GM];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < NV; j++)
#pragma unroll
            for (int c = 0; c < VEC; c++) {
                int e = (sub + j * tpr) * VEC + c;
                qr[g][j * VEC + c] = g < G && e < d ? q[qoff + (size_t)g * d + e] * qscale : 0.0f;
                acc[g][j * VEC + c] = 0.0f;
            }
    }
    /* rows base + u*nrg + rg; the loop's count is the block's, so every lane reaches the shuffles */
    for (int base = r0; base < r1; base += nrg * U) {
        fd_frag<T, VEC> kf[U][NV], vf[U][NV];
        float sc[U][GM];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int row = base + u * nrg + rg;
#pragma unroll
            for (int j = 0; j < NV; j++) {
                int vi = sub + j * tpr;
                if (row < r1 && vi < nvec) {
                    kf[u][j].load(K + (size_t)row * stride + vi * VEC);
                    vf[u][j].load(V + (size_t)row * stride + vi * VEC);
                } else {
                    kf[u][j].zero();
                    vf[u][j].zero();
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int g = 0; g < GM; g++) {
                float dot = 0.0f;
#pragma unroll
                for (int j = 0; j < NV; j++)
#pragma unroll
                    for (int c = 0; c < VEC; c++) dot += qr[g][j * VEC + c] * kf[u][j].get(c);
                sc[u][g] = dot;
            }
        for (int o = tpr / 2; o; o >>= 1)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int g = 0; g < GM; g++)
                    if (g < G) sc[u][g] += __shfl_xor_sync(0xffffffffu, sc[u][g], o);
        /* the online softmax of the row group's U rows: one rescale for them */
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g >= G) continue;
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (base + u * nrg + rg >= r1) sc[u][g] = -INFINITY;
                mx = fmaxf(mx, sc[u][g]);
            }
            float f = mx == -INFINITY ? 1.0f : exp2f(m[g] - mx), sum = 0.0f;
#pragma unroll
            for (int u = 0; u < U; u++) {
                sc[u][g] = mx == -INFINITY ? 0.0f : exp2f(sc[u][g] - mx);
                sum += sc[u][g];
            }
            l[g] = l[g] * f + sum;
            m[g] = mx;
#pragma unroll
            for (int e = 0; e < E; e++) acc[g][e] *= f;
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < NV; j++)
#pragma unroll
                for (int c = 0; c < VEC; c++) {
                    float v = vf[u][j].get(c);
#pragma unroll
                    for (int g = 0; g < GM; g++) acc[g][j * VEC + c] += sc[u][g] * v;
                }
    }
    /* the warp's row groups merged (lanes tpr apart hold the same elements) */
    for (int o = tpr; o < 32; o <<= 1)
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g >= G) continue;
            float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo = __shfl_xor_sync(0xffffffffu, l[g], o);
            float mn = fmaxf(m[g], mo);
            float fa = m[g] == -INFINITY ? 0.0f : exp2f(m[g] - mn), fb = mo == -INFINITY ? 0.0f : exp2f(mo - mn);
            l[g] = l[g] * fa + lo * fb;
            m[g] = mn;
#pragma unroll
            for (int e = 0; e < E; e++) {
                float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
                acc[g][e] = acc[g][e] * fa + ao * fb;
            }
        }
    float *sml = sh + (size_t)FD_WARPS * G * d;
    if (lane < tpr)
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g >= G) continue;
#pragma unroll
            for (int j = 0; j < NV; j++)
#pragma unroll
                for (int c = 0; c < VEC; c++) {
                    int e = (sub + j * tpr) * VEC + c;
                    if (e < d) sh[((size_t)warp * G + g) * d + e] = acc[g][j * VEC + c];
                }
            if (lane == 0) {
                sml[(warp * G + g) * 2] = m[g];
                sml[(warp * G + g) * 2 + 1] = l[g];
            }
        }
    __syncthreads();
    /* the warps merged: output element x = g*d + e of the group */
    size_t t = ((size_t)s * n_kv + kh) * splits + p;
    for (int x = tid; x < G * d; x += blockDim.x) {
        int g = x / d;
        float M = -INFINITY;
        for (int w = 0; w < FD_WARPS; w++) M = fmaxf(M, sml[(w * G + g) * 2]);
        float L = 0.0f, O = 0.0f;
        for (int w = 0; w < FD_WARPS; w++) {
            float mw = sml[(w * G + g) * 2];
            float fw = mw == -INFINITY ? 0.0f : exp2f(mw - M);
            L += sml[(w * G + g) * 2 + 1] * fw;
            O += sh[(size_t)w * G * d + x] * fw;
        }
        if (parts == 1) {
            out[qoff + x] = L > 0 ? O / L : 0.0f;
        } else {
            po[t * G * d + x] = O;
            if (x % d == 0) {
                pml[(t * G + g) * 2] = M;
                pml[(t * G + g) * 2 + 1] = L;
            }
        }
    }
    if (parts == 1) return;
    /* the last part of (s, kh) to finish merges every part's result */
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&cnt[(size_t)s * n_kv + kh], 1u) == (unsigned)parts - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    size_t t0 = ((size_t)s * n_kv + kh) * splits;
    const volatile float *vpo = po, *vpml = pml;
    for (int x = tid; x < G * d; x += blockDim.x) {
        int g = x / d;
        float M = -INFINITY;
        for (int pp = 0; pp < parts; pp++) M = fmaxf(M, vpml[((t0 + pp) * G + g) * 2]);
        float L = 0.0f, O = 0.0f;
        for (int pp = 0; pp < parts; pp++) {
            float mp = vpml[((t0 + pp) * G + g) * 2];
            float fp = mp == -INFINITY ? 0.0f : exp2f(mp - M);
            L += vpml[((t0 + pp) * G + g) * 2 + 1] * fp;
            O += vpo[(t0 + pp) * G * d + x] * fp;
        }
        out[qoff + x] = L > 0 ? O / L : 0.0f;
    }
    if (tid == 0) cnt[(size_t)s * n_kv + kh] = 0u;
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

static int fd_pow2(int x) {
    int p = 1;
    while (p < x) p <<= 1;
    return p;
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
 * Block (query tile, head): FL_BM queries of one head against key tiles of
 * FL_BN rows up to the tile's last position (causal), on WMMA bf16 16x16x16
 * fragments with f32 accumulation. Per key tile: S = Q Kᵀ (each of the 4
 * warps owns 16 query rows), the online softmax per row in f32 (a warp a
 * row at a time: running max m, sum l, and the factor the output rows are
 * rescaled by), then O = O·f + P V with O kept in shared memory as f32 (the
 * accumulator fragments are loaded from and stored back to it, so the
 * per-row rescale is a plain multiply). GQA: head h reads KV head h / grp's
 * rows in place (no repeated K/V). Q, K and V are rounded to bf16 as they
 * are staged, P is rounded to bf16 for the P V product: the CPU twin's
 * result within bf16 bounds (tests/gpu/test_cuda_ops.c). */
#include <mma.h>
#include <cuda_bf16.h>

#define FL_BM 64
#define FL_BN 64
#define FL_WARPS 4
#define FL_DMAX 128

static size_t flash_smem(int d) {
    return sizeof(__nv_bfloat16) * ((size_t)FL_BM * d + 2 * (size_t)FL_BN * d + (size_t)FL_BM * FL_BN) +
           sizeof(float) * ((size_t)FL_BM * FL_BN + (size_t)FL_BM * d + 3 * FL_BM);
}

template <typename T>
__global__ void __launch_bounds__(FL_WARPS * 32)
k_flash_causal(const float *q, int nq, int pos, int n_heads, int grp, int d, const T *K, const T *V,
               int stride, size_t head_stride, float scale, float *out) {
    using namespace nvcuda;
    SKV_DYN_SHARED(unsigned char, smem);
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem;           /* (BM, d) */
    __nv_bfloat16 *Ks = Qs + (size_t)FL_BM * d;          /* (BN, d) */
    __nv_bfloat16 *Vs = Ks + (size_t)FL_BN * d;          /* (BN, d) */
    __nv_bfloat16 *Ps = Vs + (size_t)FL_BN * d;          /* (BM, BN) */
    float *Ss = (float *)(Ps + (size_t)FL_BM * FL_BN);   /* (BM, BN) */
    float *Os = Ss + (size_t)FL_BM * FL_BN;              /* (BM, d) */
    float *Ms = Os + (size_t)FL_BM * d, *Ls = Ms + FL_BM, *Fs = Ls + FL_BM;
    int i0 = blockIdx.x * FL_BM, h = blockIdx.y, kh = h / grp;
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, nt = FL_WARPS * 32;
    int rows_q = nq - i0 < FL_BM ? nq - i0 : FL_BM;
    const T *Kh = K + (size_t)kh * head_stride, *Vh = V + (size_t)kh * head_stride;
    for (int x = tid; x < FL_BM * d; x += nt) {
        int r = x / d, e = x % d;
        Qs[x] = __float2bfloat16(r < rows_q ? q[((size_t)(i0 + r) * n_heads + h) * d + e] : 0.0f);
        Os[x] = 0.0f;
    }
    for (int r = tid; r < FL_BM; r += nt) {
        Ms[r] = -INFINITY;
        Ls[r] = 0.0f;
    }
    int last = pos + i0 + rows_q; /* rows [0, last) are seen by some query of the tile */
    for (int t0 = 0; t0 < last; t0 += FL_BN) {
        int nk = last - t0 < FL_BN ? last - t0 : FL_BN;
        __syncthreads();
        for (int x = tid; x < FL_BN * d; x += nt) {
            int r = x / d, e = x % d;
            size_t off = (size_t)(t0 + r) * stride + e;
            Ks[x] = __float2bfloat16(r < nk ? ld(Kh + off) : 0.0f);
            Vs[x] = __float2bfloat16(r < nk ? ld(Vh + off) : 0.0f);
        }
        __syncthreads();
        /* S = Q Kᵀ: warp w, query rows [16w, 16w+16) against the BN keys */
        for (int c = 0; c < FL_BN / 16; c++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int k = 0; k < d; k += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
                wmma::load_matrix_sync(a, Qs + (size_t)warp * 16 * d + k, d);
                wmma::load_matrix_sync(b, Ks + (size_t)c * 16 * d + k, d);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(Ss + (size_t)warp * 16 * FL_BN + c * 16, acc, FL_BN, wmma::mem_row_major);
        }
        __syncwarp();
        /* the online softmax of the warp's 16 rows, a row at a time over its 32 lanes */
        for (int rr = 0; rr < 16; rr++) {
            int r = warp * 16 + rr, qpos = pos + i0 + r;
            float v[FL_BN / 32], mx = -INFINITY;
            for (int u = 0; u < FL_BN / 32; u++) {
                int j = lane + 32 * u;
                float x = (r < rows_q && j < nk && t0 + j <= qpos) ? Ss[(size_t)r * FL_BN + j] * scale : -INFINITY;
                v[u] = x;
                mx = fmaxf(mx, x);
            }
            for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float m_old = Ms[r], m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int u = 0; u < FL_BN / 32; u++) {
                float p = m_new == -INFINITY ? 0.0f : __expf(v[u] - m_new);
                Ps[(size_t)r * FL_BN + lane + 32 * u] = __float2bfloat16(p);
                sum += p;
            }
            for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) {
                float f = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
                Fs[r] = f;
                Ls[r] = Ls[r] * f + sum;
                Ms[r] = m_new;
            }
        }
        __syncwarp();
        /* O = O f + P V for the warp's rows */
        for (int x = lane; x < 16 * d; x += 32) {
            int r = warp * 16 + x / d;
            Os[(size_t)r * d + x % d] *= Fs[r];
        }
        __syncwarp();
        for (int c = 0; c < d / 16; c++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, Os + (size_t)warp * 16 * d + c * 16, d, wmma::mem_row_major);
            for (int k = 0; k < FL_BN; k += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
                wmma::load_matrix_sync(a, Ps + (size_t)warp * 16 * FL_BN + k, FL_BN);
                wmma::load_matrix_sync(b, Vs + (size_t)k * d + c * 16, d);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(Os + (size_t)warp * 16 * d + c * 16, acc, d, wmma::mem_row_major);
        }
    }
    __syncthreads();
    for (int x = tid; x < rows_q * d; x += nt) {
        int r = x / d;
        float l = Ls[r];
        out[((size_t)(i0 + r) * n_heads + h) * d + x % d] = l > 0 ? Os[x] / l : 0.0f;
    }
}

/* Whether attend_causal takes the tensor-core path: a prefill of at least
 * a fragment's rows, a head dim in whole fragments up to FL_DMAX, and a
 * device whose shared memory holds the tiles. */
static int flash_ok(int nq, int d) {
    static int max_smem = -1;
    if (max_smem < 0) CK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    return nq >= 16 && d % 16 == 0 && d <= FL_DMAX && flash_smem(d) <= (size_t)max_smem;
}

template <typename T>
static void attend_causal_t(const float *q, int nq, int pos, int n_heads, int n_kv_heads, int d, const T *K,
                            const T *V, int stride, size_t head_stride, float *out) {
    SKV_ASSERT(d <= D_MAX);
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    float scale = 1.0f / sqrtf((float)d);
    if (flash_ok(nq, d)) {
        size_t sm = flash_smem(d);
        CK(cudaFuncSetAttribute(k_flash_causal<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        SKV_LAUNCH(k_flash_causal<T>, dim3((nq + FL_BM - 1) / FL_BM, n_heads), FL_WARPS * 32, sm, st)(
            q, nq, pos, n_heads, n_heads / n_kv_heads, d, K, V, stride, head_stride, scale, out);
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
