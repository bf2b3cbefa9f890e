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
 * - attend_causal: a block per (query, head) over the causal prefix.
 * The CPU twins are kernels/cpu/backend_cpu.c's ops of the same names. */
#include "cuda_util.h"

#define TILE 64
#define G_MAX 8
#define THREADS 256
#define D_MAX 256

/* Attends q (G heads, rows q_stride floats apart) over rows [r0, r1) of K
 * and V (rows `stride` apart). Writes, per head, the accumulated output
 * (normalized when norm, else unnormalized) to out + g*d, and the state to
 * m_out[g], l_out[g] when given. */
__device__ void attend_block(const float *q, int G, size_t q_stride, const float *K, const float *V, int r0, int r1,
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
                const float *k = K + (size_t)(t0 + j) * stride;
                float dot = 0.0f;
                for (int e = 0; e < d; e++) dot += qs[g * d + e] * k[e];
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
                float v = V[(size_t)(t0 + j) * stride + tid];
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
    k_attend_group<<<1, THREADS, 0, st>>>(q, 1, K, V, n, d, stride, scale, out, NULL, NULL);
    CKL();
    cuda_span_end(sp, 0, "attend");
}

void cu_attend_group(const float *q, int g, const float *K, const float *V, int n, int d, int stride, float scale,
                     float *out, float *m, float *l) {
    SKV_ASSERT(g >= 1 && g <= G_MAX && d <= D_MAX);
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    k_attend_group<<<1, THREADS, 0, st>>>(q, g, K, V, n, d, stride, scale, out, m, l);
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
    k_attend_merge<<<g, d <= 32 ? 32 : (d + 31) / 32 * 32, 0, cuda_after_fetch()>>>(parts, g, d, o, m, l, out);
    CKL();
}

/* Flash-decoding: block (kh, p) attends KV head kh's group over part p of
 * the rows into the partial buffers (or out, with one part). */
__global__ void k_attend_decode(const float *q, int G, const float *K, const float *V, int rows, int parts, int stride,
                                size_t head_stride, int d, float scale, float *po, float *pm, float *pl, float *out) {
    int kh = blockIdx.x, p = blockIdx.y;
    int r0 = (int)((long long)rows * p / parts), r1 = (int)((long long)rows * (p + 1) / parts);
    const float *qg = q + (size_t)kh * G * d;
    const float *Kh = K + kh * head_stride, *Vh = V + kh * head_stride;
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

int cu_attend_decode(const float *q, int n_heads, int n_kv, int d, const float *K, const float *V, int rows,
                     int stride, size_t head_stride, float *out) {
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
    k_attend_decode<<<dim3(n_kv, parts), THREADS, 0, st>>>(q, G, K, V, rows, parts, stride, head_stride, d, scale, po,
                                                           pm, pl, out);
    CKL();
    if (parts > 1) {
        k_decode_merge<<<dim3(n_kv, G), (d + 31) / 32 * 32, 0, st>>>(parts, G, d, po, pm, pl, out);
        CKL();
        cuda_scratch_free(po);
    }
    cuda_span_end(sp, 0, "attention");
    return 0;
}

/* Causal attention: block (i, h) for query i (position pos+i) of head h. */
__global__ void k_attend_causal(const float *q, int pos, int n_heads, int grp, int d, const float *K, const float *V,
                                int stride, size_t head_stride, float scale, float *out) {
    int i = blockIdx.x, h = blockIdx.y, kh = h / grp;
    size_t qo = (size_t)i * n_heads * d + (size_t)h * d;
    attend_block(q + qo, 1, (size_t)d, K + kh * head_stride, V + kh * head_stride, 0, pos + i + 1, stride, d, scale,
                 out + qo, NULL, NULL, 1);
}

void cu_attend_causal(const float *q, int nq, int pos, int n_heads, int n_kv_heads, int d, const float *K,
                      const float *V, int stride, size_t head_stride, float *out) {
    SKV_ASSERT(d <= D_MAX);
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    k_attend_causal<<<dim3(nq, n_heads), THREADS, 0, st>>>(
        q, pos, n_heads, n_heads / n_kv_heads, d, K, V, stride, head_stride, 1.0f / sqrtf((float)d), out);
    CKL();
    cuda_span_end(sp, 0, "attention");
}
