/* ops_attention.cu: exact attention on the GPU.
 *
 * One block attends the G query heads of a GQA group over a range of rows
 * with an online softmax (kmath.h's km_osm): per tile of 64 rows it scores
 * every (head, row) pair, updates each head's running max and sum, and each
 * thread, owning one dimension, adds the tile's weighted value rows to its G
 * accumulators, so every K and V row is read once for the whole group.
 * - attend_rows / attend_group: one block (a row set, ShadowKV's sparse set);
 * - attend_decode: flash-decoding, blocks over (KV head, part of the rows),
 *   then a merge kernel (km_osm_merge, attend_merge's rule);
 * - attend_causal: a prefill on tensor cores (flash attention, WMMA bf16, below);
 *   a few queries (a block per (query, head) over the causal prefix) in f32.
 * The CPU twins are kernels/cpu/backend_cpu.c's ops of the same names. */
#include "cuda_util.h"

#define TILE 64
#define G_MAX 8
#define THREADS 256
#define D_MAX 256

#include <cuda_fp16.h>

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

/* Flash-decoding: block (kh, p) attends KV head kh's group over part p of
 * the rows into the partial buffers (or out, with one part). */
template <typename T>
__global__ void k_attend_decode(const float *q, int G, const T *K, const T *V, int rows, int parts, int stride,
                                size_t head_stride, int d, float scale, float *po, float *pm, float *pl, float *out) {
    int kh = blockIdx.x, p = blockIdx.y;
    int r0 = (int)((long long)rows * p / parts), r1 = (int)((long long)rows * (p + 1) / parts);
    const float *qg = q + (size_t)kh * G * d;
    const T *Kh = K + kh * head_stride, *Vh = V + kh * head_stride;
    if (parts == 1) {
        attend_block(qg, G, (size_t)d, Kh, Vh, r0, r1, stride, d, scale, out + (size_t)kh * G * d, NULL, NULL, 1);
    } else {
        size_t t = (size_t)kh * parts + p;
        attend_block(qg, G, (size_t)d, Kh, Vh, r0, r1, stride, d, scale, po + t * G * d, pm + t * G, pl + t * G, 0);
    }
}

/* Merges KV head kh's parts: block (kh, a). */
__global__ void k_decode_merge(int parts, int G, int d, const float *po, const float *pm, const float *pl, float *out) {
    int kh = blockIdx.x, a = blockIdx.y, e = threadIdx.x;
    size_t t0 = (size_t)kh * parts;
    if (e < d)
        out[((size_t)kh * G + a) * d + e] =
            merge_dim(parts, a, e, d, po + t0 * G * d, (size_t)G * d, pm + t0 * G, pl + t0 * G, (size_t)G);
}

template <typename T>
static int attend_decode_t(const float *q, int n_heads, int n_kv, int d, const T *K, const T *V, int rows, int stride,
                           size_t head_stride, float *out) {
    int G = n_heads / n_kv;
    if (G > G_MAX || d > D_MAX)
        return skv_error(SKV_EUNSUPPORTED, "cuda: attention of %d query heads per KV head of dim %d (at most %d and %d)",
                         G, d, G_MAX, D_MAX);
    static int n_sm = 0;
    if (!n_sm) CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    /* about two blocks per multiprocessor, each part at least 256 rows */
    int parts = (2 * n_sm + n_kv - 1) / n_kv;
    if (parts > rows / 256) parts = rows / 256;
    if (parts < 1) parts = 1;
    float scale = 1.0f / sqrtf((float)d);
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    float *po = NULL, *pm = NULL, *pl = NULL;
    if (parts > 1) {
        size_t tasks = (size_t)n_kv * parts;
        po = (float *)cuda_scratch(sizeof(float) * tasks * G * (d + 2));
        pm = po + tasks * G * d;
        pl = pm + tasks * G;
    }
    SKV_LAUNCH(k_attend_decode<T>, dim3(n_kv, parts), THREADS, 0, st)(q, G, K, V, rows, parts, stride, head_stride, d, scale, po,
                                                           pm, pl, out);
    CKL();
    if (parts > 1) {
        SKV_LAUNCH(k_decode_merge, dim3(n_kv, G), (d + 31) / 32 * 32, 0, st)(parts, G, d, po, pm, pl, out);
        CKL();
        cuda_scratch_free(po);
    }
    cuda_span_end(sp, 0, "attention");
    return 0;
}

int cu_attend_decode(const float *q, int n_heads, int n_kv, int d, const float *K, const float *V, int rows,
                     int stride, size_t head_stride, float *out) {
    return attend_decode_t(q, n_heads, n_kv, d, K, V, rows, stride, head_stride, out);
}

int cu_attend_decode_h(const float *q, int n_heads, int n_kv, int d, const uint16_t *K, const uint16_t *V, int rows,
                       int stride, size_t head_stride, float *out) {
    return attend_decode_t(q, n_heads, n_kv, d, (const __half *)K, (const __half *)V, rows, stride, head_stride, out);
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
