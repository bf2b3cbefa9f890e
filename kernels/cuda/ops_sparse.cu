/* ops_sparse.cu: the stages of the sparse policies on the GPU: ShadowKV's
 * truncated SVD (the Gram route: KᵀK in double with cuBLAS, its
 * eigenvectors with cuSOLVER's syevd, U = K·V_r/σ, the residual measured),
 * landmarks and cosine minima, landmark scoring (softmax per query head,
 * summed over positions, max over the GQA group), top-k (CUB radix sort of
 * kmath.h's order keys), the gather of offloaded values straight from
 * pinned, mapped host memory (a warp per chunk, on the fetch stream) into
 * f32 or bf16 rows, the key rebuild fused with RoPE (stored f32 or rounded
 * to bf16), ShadowKV+'s projection, Quest's page bounds
 * and scores, and one KIVI group. CPU twins: kernels/cpu/shadowkv_ops.c,
 * page_ops.c, kivi.c. */
#include "cuda_util.h"

#include <cub/cub.cuh>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

/* ---- truncated SVD, Gram route ---- */

__global__ void k_to_double(const float *x, double *y, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}

/* vr (n, r) column-major: column j = eigenvector n-1-j of the column-major G. */
__global__ void k_top_vectors(const double *G, int n, int r, double *vr) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * r) return;
    int j = (int)(i / n), e = (int)(i % n);
    vr[(size_t)j * n + e] = G[(size_t)(n - 1 - j) * n + e];
}

/* U (s, r) row-major = US / σ_j (0 where σ_j is tiny), SVt and Vt (r, n). */
__global__ void k_svd_out(const double *us, const double *vr, const double *w, int s, int n, int r, float *U,
                          float *SVt, float *Vt) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    double s1 = sqrt(w[n - 1] > 0 ? w[n - 1] : 0);
    if (i < (size_t)s * r) {
        int t = (int)(i / r), j = (int)(i % r);
        double sj = sqrt(w[n - 1 - j] > 0 ? w[n - 1 - j] : 0);
        double inv = sj > 1e-6 * s1 && sj > 0 ? 1.0 / sj : 0.0;
        U[i] = (float)(us[(size_t)t * r + j] * inv); /* us is (r, s) column-major = (s, r) row-major */
    }
    if (i < (size_t)r * n) {
        int j = (int)(i / n), e = (int)(i % n);
        double sj = sqrt(w[n - 1 - j] > 0 ? w[n - 1 - j] : 0);
        double v = vr[(size_t)j * n + e];
        SVt[i] = (float)(sj * v);
        if (Vt) Vt[i] = (float)v;
    }
}

/* The host waits once: the two norms (cuBLAS in device pointer mode),
 * cuSOLVER's info and the eigenvalues come down in one copy at the end, and
 * a key matrix with a NaN or an infinity (a norm that is not finite) or a
 * failed eigensolver is refused then, its outputs left unwritten or not
 * meaningful (the caller drops them with the error). */
int cu_svd(const float *K, int s, int n, int r, float *U, float *SVt, float *Vt, float *sv, float *rel_err) {
    if (s < 1 || n < 1 || r < 1 || r > (s < n ? s : n))
        return skv_error(SKV_EINVAL, "svd: rank %d is outside 1..min(%d, %d)", r, s, n);
    cuda_ctx *c = cuda_get();
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    size_t sn = (size_t)s * n;
    double *kd = (double *)cuda_scratch(sizeof(double) * sn);
    double *G = (double *)cuda_scratch(sizeof(double) * (size_t)n * n);
    double *vr = (double *)cuda_scratch(sizeof(double) * (size_t)n * r);
    double *us = (double *)cuda_scratch(sizeof(double) * (size_t)s * r);
    /* what the host reads: the eigenvalues w (n), the norms of K and of the
     * residual, cuSOLVER's info (in the last double's bytes) */
    double *out = (double *)cuda_scratch(sizeof(double) * ((size_t)n + 3));
    double *w = out, *nrm = out + n;
    int *info = (int *)(out + n + 2);
    const double one = 1.0, zero = 0.0, mone = -1.0;
    SKV_LAUNCH(k_to_double, cuda_blocks(sn, 256), 256, 0, st)(K, kd, sn);
    CKL();
    CKB(cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_DEVICE));
    CKB(cublasDnrm2(c->blas, (int)sn, kd, 1, nrm)); /* into device memory: no wait */
    CKB(cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_HOST));
    /* row-major K (s, n) is column-major Kᵀ (n, s): G = Kᵀ·(Kᵀ)ᵀ */
    CKB(cublasDgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, n, n, s, &one, kd, n, kd, n, &zero, G, n));
    int lwork = 0;
    CKS(cusolverDnDsyevd_bufferSize(c->solver, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n, G, n, w, &lwork));
    double *work = (double *)cuda_scratch(sizeof(double) * (size_t)(lwork > 0 ? lwork : 1));
    CKS(cusolverDnDsyevd(c->solver, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n, G, n, w, work, lwork,
                         info));
    cuda_scratch_free(work);
    SKV_LAUNCH(k_top_vectors, cuda_blocks((size_t)n * r, 256), 256, 0, st)(G, n, r, vr);
    CKL();
    /* us (r, s) column-major = V_rᵀ·Kᵀ, i.e. K·V_r row-major (s, r) */
    CKB(cublasDgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, r, s, n, &one, vr, n, kd, n, &zero, us, r));
    /* residual Kᵀ − V_r·us in place of kd */
    CKB(cublasDgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, s, r, &mone, vr, n, us, r, &one, kd, n));
    CKB(cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_DEVICE));
    CKB(cublasDnrm2(c->blas, (int)sn, kd, 1, nrm + 1));
    CKB(cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_HOST));
    size_t big = (size_t)s * r > (size_t)r * n ? (size_t)s * r : (size_t)r * n;
    SKV_LAUNCH(k_svd_out, cuda_blocks(big, 256), 256, 0, st)(us, vr, w, s, n, r, U, SVt, Vt);
    CKL();
    /* into pinned staging memory: the copy queues, and the host waits once */
    double *h = (double *)cuda_stage_space(sizeof(double) * ((size_t)n + 3));
    CK(cudaMemcpyAsync(h, out, sizeof(double) * ((size_t)n + 3), cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st)); /* the one wait */
    double fro = h[(size_t)n] * h[(size_t)n], res = h[(size_t)n + 1];
    int h_info = 0;
    memcpy(&h_info, &h[(size_t)n + 2], sizeof h_info);
    int rc = 0;
    if (!isfinite(fro)) {
        rc = skv_error(SKV_EINVAL, "svd: NaN or infinity in a (%d, %d) key matrix", s, n);
    } else if (h_info != 0) {
        rc = skv_error(SKV_EUNSUPPORTED, "svd: cusolverDnDsyevd failed on the (%d, %d) Gram matrix (info %d)", n, n,
                       h_info);
    } else {
        *rel_err = fro > 0 ? (float)(res / sqrt(fro)) : 0.0f;
        int m = s < n ? s : n;
        for (int i = 0; i < m; i++) sv[i] = (float)sqrt(h[n - 1 - i] > 0 ? h[n - 1 - i] : 0);
    }
    cuda_scratch_free(kd);
    cuda_scratch_free(G);
    cuda_scratch_free(vr);
    cuda_scratch_free(us);
    cuda_scratch_free(out);
    cuda_span_end(sp, 0, "svd");
    return rc;
}

/* ---- landmarks and cosine minima: a block per chunk, a thread per dim ---- */

__global__ void k_landmarks(const float *K, int stride, int d, int c, float *lm) {
    int j = blockIdx.x;
    float inv = 1.0f / (float)c;
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float s = 0.0f;
        for (int t = 0; t < c; t++) s += K[(size_t)(j * c + t) * stride + e];
        lm[(size_t)j * d + e] = s * inv;
    }
}

void cu_landmarks(const float *K, int stride, int d, int c, int n_chunks, float *lm) {
    if (n_chunks <= 0) return;
    SKV_LAUNCH(k_landmarks, n_chunks, 128, 0, cuda_after_fetch())(K, stride, d, c, lm);
    CKL();
}

/* A block per chunk: warp-sum dot products (a chunk has at most 32 keys per
 * pass; one warp per key). */
__global__ void k_cos_min(const float *K, int stride, int d, int c, const float *lm, float *cos_min) {
    __shared__ float cs[32];
    __shared__ float ll;
    int j = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    const float *l = lm + (size_t)j * d;
    if (warp == 0) {
        float a = 0.0f;
        for (int e = lane; e < d; e += 32) a += l[e] * l[e];
        for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0) ll = a;
    }
    __syncthreads();
    float mn = INFINITY;
    for (int t = warp; t < c; t += nw) {
        const float *k = K + (size_t)(j * c + t) * stride;
        float dot = 0.0f, kk = 0.0f;
        for (int e = lane; e < d; e += 32) {
            dot += l[e] * k[e];
            kk += k[e] * k[e];
        }
        for (int o = 16; o > 0; o >>= 1) {
            dot += __shfl_xor_sync(0xffffffffu, dot, o);
            kk += __shfl_xor_sync(0xffffffffu, kk, o);
        }
        float v = km_cosine(dot, ll, kk);
        mn = v < mn ? v : mn;
    }
    if (lane == 0) cs[warp] = mn;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = INFINITY;
        for (int w = 0; w < nw; w++) m = cs[w] < m ? cs[w] : m;
        cos_min[j] = m;
    }
}

void cu_cos_min(const float *K, int stride, int d, int c, int n_chunks, const float *lm, float *cos_min) {
    if (n_chunks <= 0) return;
    SKV_LAUNCH(k_cos_min, n_chunks, 256, 0, cuda_after_fetch())(K, stride, d, c, lm, cos_min);
    CKL();
}

/* ---- landmark scores ---- */


/* Landmark scores with the whole GPU (the old form, a block per query head
 * recomputing every dot product thrice, ran on 4 SMs at the 8B shape):
 * - k_score_logits: a warp per landmark, its lanes along the dimensions, the
 *   G heads' dot products at once: L (G, n_lm) = q_g·lm_j·scale, n_lm/8 blocks;
 * - k_score_stats: a block per head, its max and Σ exp over the landmarks;
 * - k_score_accum: P (G, n_lm) += the softmax, for each of the nq positions;
 * - k_score_max: score_j = max over the group of P. */
__global__ void k_score_logits(const float *q, int G, int d, const __half *lm, int n_lm, float scale, float *L) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= n_lm) return;
    const __half *l = lm + (size_t)warp * d;
    float acc[8];
    for (int g = 0; g < 8; g++) acc[g] = 0.0f;
    for (int e = lane; e < d; e += 32) {
        float v = __half2float(l[e]);
        for (int g = 0; g < G && g < 8; g++) acc[g] += q[(size_t)g * d + e] * v;
    }
    for (int g = 0; g < G && g < 8; g++) {
        float v = acc[g];
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) L[(size_t)g * n_lm + warp] = v * scale;
    }
}

__global__ void k_score_stats(const float *L, int n_lm, float *m, float *s) {
    float mx, sum;
    block_softmax_stats(L + (size_t)blockIdx.x * n_lm, n_lm, &mx, &sum);
    if (threadIdx.x == 0) {
        m[blockIdx.x] = mx;
        s[blockIdx.x] = sum;
    }
}

__global__ void k_score_accum(const float *L, int G, int n_lm, const float *m, const float *s, int first, float *P) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)G * n_lm) return;
    int g = (int)(i / n_lm);
    float p = expf(L[i] - m[g]) * (1.0f / s[g]);
    P[i] = first ? p : P[i] + p;
}

__global__ void k_score_max(const float *P, int group, int n_lm, float *score) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_lm) return;
    float m = -INFINITY;
    for (int g = 0; g < group; g++) m = P[(size_t)g * n_lm + j] > m ? P[(size_t)g * n_lm + j] : m;
    score[j] = m;
}

void cu_score(const float *q, int nq, size_t q_stride, int group, int d, const uint16_t *lm, int n_lm, float scale,
              float *tmp, float *score) {
    (void)tmp;
    if (n_lm <= 0 || nq <= 0) return;
    SKV_ASSERT(group >= 1 && group <= 8);
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    size_t gn = (size_t)group * n_lm;
    float *L = (float *)cuda_scratch(sizeof(float) * (2 * gn + 2 * (size_t)group));
    float *P = L + gn, *m = P + gn, *s = m + group;
    for (int i = 0; i < nq; i++) {
        SKV_LAUNCH(k_score_logits, cuda_blocks((size_t)n_lm * 32, 256), 256, 0, st)(q + (size_t)i * q_stride, group, d,
                                                                           (const __half *)lm, n_lm, scale, L);
        CKL();
        SKV_LAUNCH(k_score_stats, group, 256, 0, st)(L, n_lm, m, s);
        CKL();
        SKV_LAUNCH(k_score_accum, cuda_blocks(gn, 256), 256, 0, st)(L, group, n_lm, m, s, i == 0, P);
        CKL();
    }
    SKV_LAUNCH(k_score_max, cuda_blocks((size_t)n_lm, 256), 256, 0, st)(P, group, n_lm, score);
    CKL();
    cuda_scratch_free(L);
    cuda_span_end(sp, 0, "score");
}

/* ---- top-k: sort keys in shadowkv_topk's order, keep the first k ---- */

__global__ void k_topk_keys(const float *score, int n, unsigned long long *key) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) key[i] = km_topk_key(score[i], (uint32_t)i);
}

__global__ void k_topk_take(const unsigned long long *sorted, int k, int *idx) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k) idx[i] = (int)(sorted[i] & 0xffffffffu);
}

int cu_topk(const float *score, int n, int k, int *idx) {
    int m = k < n ? k : n;
    if (m <= 0) return 0;
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    unsigned long long *keys = (unsigned long long *)cuda_scratch(sizeof(unsigned long long) * 2 * (size_t)n);
    unsigned long long *sorted = keys + n;
    SKV_LAUNCH(k_topk_keys, cuda_blocks((size_t)n, 256), 256, 0, st)(score, n, keys);
    CKL();
    size_t tmp_bytes = 0;
    CK(cub::DeviceRadixSort::SortKeys(NULL, tmp_bytes, keys, sorted, n, 0, 64, st));
    void *tmp = cuda_scratch(tmp_bytes);
    CK(cub::DeviceRadixSort::SortKeys(tmp, tmp_bytes, keys, sorted, n, 0, 64, st));
    SKV_LAUNCH(k_topk_take, cuda_blocks((size_t)m, 256), 256, 0, st)(sorted, m, idx);
    CKL();
    cuda_scratch_free(tmp);
    cuda_scratch_free(keys);
    cuda_span_end(sp, 0, "topk");
    return m;
}

/* ---- gather of offloaded values: a warp per block, from mapped host memory ---- */

/* A bf16 value stored as a row element: widened exactly into an f32 row,
 * copied as it is into a bf16 one. */
__device__ __forceinline__ void put_bf(float *p, uint16_t v) { *p = km_bf16_to_f32(v); }
__device__ __forceinline__ void put_bf(uint16_t *p, uint16_t v) { *p = v; }

/* An f32 result stored as a row element: as it is, or rounded to nearest
 * even into bf16 (km_f32_to_bf16, the CPU's shadowkv_rebuild_to). */
__device__ __forceinline__ void put_f(float *p, float x) { *p = x; }
__device__ __forceinline__ void put_f(uint16_t *p, float x) { *p = km_f32_to_bf16(x); }

/* dst rows of type O: float (SKV_ELT_F32) or uint16_t (SKV_ELT_BF16). */
template <typename O>
__global__ void k_gather(const uint16_t *src, int rows, int cols, const int *src_idx, int n, O *dst,
                         const size_t *dst_off, int dst_stride) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= n) return;
    const uint16_t *s = src + (size_t)src_idx[warp] * rows * cols;
    O *d = dst + dst_off[warp];
    for (int i = lane; i < rows * cols; i += 32) put_bf(d + (size_t)(i / cols) * dst_stride + i % cols, s[i]);
}

/* src is host memory from host_alloc (pinned and mapped): the kernel reads
 * it over the bus itself, on the fetch stream, so the copy overlaps what
 * the compute stream does next (the key rebuild); the attention ops wait
 * for it (cuda_after_fetch). The index lists are host arrays. */
void cu_gather(const uint16_t *src, int rows, int cols, const int *src_idx, int n, void *dst, int dst_elt,
               const size_t *dst_off, int dst_stride) {
    if (n <= 0) return;
    SKV_ASSERT(dst_elt == SKV_ELT_F32 || dst_elt == SKV_ELT_BF16);
    const uint16_t *dsrc = NULL;
    CK(cudaHostGetDevicePointer((void **)&dsrc, (void *)src, 0));
    int *d_idx = NULL;
    size_t *d_off = NULL;
    /* the destination rows may still be read by queued attention */
    cudaStream_t fs = cuda_fetch_begin();
    CK(cudaMallocAsync((void **)&d_idx, sizeof(int) * n, fs));
    CK(cudaMallocAsync((void **)&d_off, sizeof(size_t) * n, fs));
    CK(cudaMemcpyAsync(d_idx, src_idx, sizeof(int) * n, cudaMemcpyHostToDevice, fs));
    CK(cudaMemcpyAsync(d_off, dst_off, sizeof(size_t) * n, cudaMemcpyHostToDevice, fs));
    cuda_span_mark sp = cuda_span_begin(1);
    if (dst_elt == SKV_ELT_BF16)
        SKV_LAUNCH(k_gather<uint16_t>, cuda_blocks((size_t)n * 32, 256), 256, 0, fs)(dsrc, rows, cols, d_idx, n,
                                                                                  (uint16_t *)dst, d_off, dst_stride);
    else
        SKV_LAUNCH(k_gather<float>, cuda_blocks((size_t)n * 32, 256), 256, 0, fs)(dsrc, rows, cols, d_idx, n,
                                                                               (float *)dst, d_off, dst_stride);
    CKL();
    CK(cudaFreeAsync(d_idx, fs));
    CK(cudaFreeAsync(d_off, fs));
    cuda_fetch_end();
    cuda_span_end(sp, 1, "fetch_v");
}

/* ---- end of prefill: U, landmarks and values in 16 bits, candidate chunks gathered ---- */

/* x rounded to nearest even into elt's 16 bits (the host's shadowkv_pack:
 * km_f32_to_bf16, or the IEEE half conversion vec_to_f16 does). */
__device__ __forceinline__ uint16_t sk_pack1(float x, int elt) {
    if (elt == SKV_ELT_BF16) return km_f32_to_bf16(x);
    __half h = __float2half_rn(x);
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

__global__ void k_pack_h(const float *x, size_t n, uint16_t *y, int elt) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = sk_pack1(x[i], elt);
}

/* shadowkv_pack on the device: U never leaves it. */
void cu_pack_h(const float *x, size_t n, uint16_t *y, int elt) {
    if (!n) return;
    size_t blocks = (n + 255) / 256;
    cuda_span_mark sp = cuda_span_begin(0);
    SKV_LAUNCH(k_pack_h, (int)(blocks < 4096 ? blocks : 4096), 256, 0, cuda_after_fetch())(x, n, y, elt);
    CKL();
    cuda_span_end(sp, 0, "pack_h");
}

/* A warp per destination row (h*n_cand*rows of them, grid-stride), its
 * lanes along the row: coalesced reads and writes, each value stored as
 * elt (f32, or rounded to 16 bits by sk_pack1). */
__global__ void k_gather_chunks(const float *src, size_t src_row, size_t src_head, const int *cand, int h,
                                int n_cand, int rows, int d, void *dst, size_t dst_head, int elt) {
    size_t n_rows = (size_t)h * n_cand * rows, warps = (size_t)gridDim.x * blockDim.x / 32;
    int lane = threadIdx.x % 32;
    for (size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < n_rows; w += warps) {
        int t = (int)(w % rows);
        size_t hi = w / rows; /* kh*n_cand + i */
        int kh = (int)(hi / n_cand), i = (int)(hi % n_cand);
        const float *s = src + (size_t)kh * src_head + ((size_t)cand[hi] * rows + t) * src_row;
        size_t o = (size_t)kh * dst_head + ((size_t)i * rows + t) * d;
        if (elt == SKV_ELT_F32)
            for (int j = lane; j < d; j += 32) ((float *)dst)[o + j] = s[j];
        else
            for (int j = lane; j < d; j += 32) ((uint16_t *)dst)[o + j] = sk_pack1(s[j], elt);
    }
}

/* One launch for every KV head's candidates of a layer, on the compute
 * stream (the fetch stream's gathers that later read a pinned dst fork
 * from it). dst may be host_alloc's pinned, mapped memory: with unified
 * addressing (every device this backend supports) its host address is its
 * device address. */
void cu_sk_gather_chunks(const float *src, size_t src_row, size_t src_head, const int *cand, int h, int n_cand,
                         int rows, int d, void *dst, size_t dst_head, int dst_elt) {
    size_t n_rows = (size_t)h * n_cand * rows;
    if (!n_rows || d <= 0) return;
    size_t blocks = (n_rows * 32 + 255) / 256;
    cuda_span_mark sp = cuda_span_begin(0);
    SKV_LAUNCH(k_gather_chunks, (int)(blocks < 65536 ? blocks : 65536), 256, 0, cuda_after_fetch())(
        src, src_row, src_head, cand, h, n_cand, rows, d, dst, dst_head, dst_elt);
    CKL();
    cuda_span_end(sp, 0, "gather_chunks");
}

/* ---- key rebuild fused with RoPE: a block per row ---- */

/* Key row t rebuilt by the block into out (d): U[t]·svt into the shared row,
 * RoPE at t (tables cs/sn, or inv_freq), written out as O (f32, or rounded
 * to bf16 by put_f). The one row of both rebuild kernels. */
template <typename O>
__device__ void rebuild_row_dev(const uint16_t *U, int r, const float *svt, int d, int t, int rope_dim, int mode,
                                const float *inv_freq, const float *cs, const float *sn, float *row, O *out) {
    const uint16_t *u = U + (size_t)t * r;
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float s = 0.0f;
        for (int j = 0; j < r; j++) s += km_bf16_to_f32(u[j]) * svt[(size_t)j * d + e];
        row[e] = s;
    }
    __syncthreads();
    int half = rope_dim / 2;
    for (int p = threadIdx.x; p < half; p += blockDim.x) {
        float c, s;
        if (cs) {
            c = cs[(size_t)t * half + p];
            s = sn[(size_t)t * half + p];
        } else {
            km_rope_cs(inv_freq[p], t, &c, &s);
        }
        int a, b;
        km_rope_pair_index(mode, p, rope_dim, &a, &b);
        km_rotate(&row[a], &row[b], c, s);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < d; e += blockDim.x) put_f(out + e, row[e]);
    __syncthreads();
}

/* out rows of type O: float (SKV_ELT_F32) or uint16_t (SKV_ELT_BF16). */
template <typename O>
__global__ void k_rebuild(const uint16_t *U, int r, const float *svt, int d, int t0, int rope_dim, int mode,
                          const float *inv_freq, const float *cs, const float *sn, O *out) {
    SKV_DYN_SHARED(float, row);
    int i = blockIdx.x;
    rebuild_row_dev(U, r, svt, d, t0 + i, rope_dim, mode, inv_freq, cs, sn, row, out + (size_t)i * d);
}

void cu_rebuild(const uint16_t *U, int r, const float *svt, int d, int t0, int n, const rope_ctx *rope, const float *cs,
                const float *sn, void *out, int out_elt) {
    if (n <= 0) return;
    SKV_ASSERT(out_elt == SKV_ELT_F32 || out_elt == SKV_ELT_BF16);
    cuda_span_mark sp = cuda_span_begin(0);
    const float *inv = cuda_const_upload(rope->inv_freq, (size_t)(rope->rope_dim / 2));
    /* the compute stream does not wait for a queued gather here: the
     * rebuild reads no value rows, so it runs beside the fetch */
    cudaStream_t st = cuda_get()->compute;
    if (out_elt == SKV_ELT_BF16)
        SKV_LAUNCH(k_rebuild<uint16_t>, n, 128, sizeof(float) * d, st)(U, r, svt, d, t0, rope->rope_dim,
                                                                      (int)rope->mode, inv, cs, sn, (uint16_t *)out);
    else
        SKV_LAUNCH(k_rebuild<float>, n, 128, sizeof(float) * d, st)(U, r, svt, d, t0, rope->rope_dim, (int)rope->mode,
                                                                   inv, cs, sn, (float *)out);
    CKL();
    cuda_span_end(sp, 0, "rebuild_k");
}

/* ---- a layer's books, fetch and rebuild for every KV head at once ----
 *
 * The selection never leaves the device: the chunk caches take it in one
 * launch (a thread per KV head runs km_cache_update, the CPU's rule), the
 * missed values come over the bus on the fetch stream with a small grid
 * (16 blocks: a grid that fills every SM with warps waiting on PCIe hides
 * nothing, ../shared/GPU.md), and the missed keys are rebuilt, RoPE
 * included, in one launch on the compute stream beside the fetch. The
 * launches have fixed shapes (h x k misses at most): a miss past a head's
 * count is skipped on the device. The heads' row pointers go by value in
 * the launch's parameters. */

__global__ void k_sk_books(int h, int k, int n_cand, const int *sel, int *slot_id, int *where, unsigned *stamp,
                           unsigned *epoch, int *slot_of, int *miss, int *n_miss) {
    int kh = blockIdx.x * blockDim.x + threadIdx.x;
    if (kh >= h) return;
    n_miss[kh] = km_cache_update(k, slot_id + (size_t)kh * k, where + (size_t)kh * n_cand, stamp + (size_t)kh * k,
                                 epoch + kh, sel + (size_t)kh * k, k, slot_of + (size_t)kh * k, miss + (size_t)kh * k);
}

void cu_sk_books(int h, int k, int n_cand, const int *sel, int *slot_id, int *where, unsigned *stamp, unsigned *epoch,
                 int *slot_of, int *miss, int *n_miss) {
    cuda_span_mark sp = cuda_span_begin(0);
    SKV_LAUNCH(k_sk_books, cuda_blocks((size_t)h, 32), 32, 0, cuda_after_fetch())(h, k, n_cand, sel, slot_id, where, stamp,
                                                                          epoch, slot_of, miss, n_miss);
    CKL();
    cuda_span_end(sp, 0, "books");
}

/* The row pointers of up to SK_PTRS heads, passed by value with the launch
 * (no copy, no staging of pageable memory, no sync); more heads take more
 * launches of SK_PTRS each. */
#define SK_PTRS 64
typedef struct { uint16_t *p[SK_PTRS]; } sk_ptrs;

static sk_ptrs ptrs_from(uint16_t *const *host, int h0, int n) {
    sk_ptrs v;
    memset(&v, 0, sizeof v);
    for (int i = 0; i < n; i++) v.p[i] = host[h0 + i];
    return v;
}

/* Heads h0..h0+n-1 (V.p[j] the bf16 rows of head h0+j): a warp a miss,
 * its chunk of c*d store values copied as they are. */
__global__ void k_gather_misses(const uint16_t *store, int c, int d, int h0, int n, int k, int n_cand, size_t blk0,
                                const int *sel, const int *slot_of, const int *miss, const int *n_miss, sk_ptrs V,
                                int row_slot) {
    int lane = threadIdx.x % 32, warps = gridDim.x * blockDim.x / 32;
    size_t blk = (size_t)c * d;
    for (int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32; w < n * k; w += warps) {
        int j = w / k, kh = h0 + j, m = w % k;
        if (m >= n_miss[kh]) continue;
        int i = miss[(size_t)kh * k + m];
        const uint16_t *src = store + (blk0 + (size_t)kh * n_cand + sel[(size_t)kh * k + i]) * blk;
        uint16_t *dst = V.p[j] + (size_t)(row_slot + slot_of[(size_t)kh * k + i] * c) * d;
        copy_bf16_warp(src, dst, blk, lane);
    }
}

void cu_sk_gather_misses(const uint16_t *store, int c, int d, int h, int k, int n_cand, size_t blk0, const int *sel,
                         const int *slot_of, const int *miss, const int *n_miss, uint16_t *const *V, int row_slot) {
    const uint16_t *dsrc = NULL;
    CK(cudaHostGetDevicePointer((void **)&dsrc, (void *)store, 0));
    cudaStream_t fs = cuda_fetch_begin(); /* after the books, and the attention still reading these rows */
    cuda_span_mark sp = cuda_span_begin(1);
    for (int h0 = 0; h0 < h; h0 += SK_PTRS) {
        int n = h - h0 < SK_PTRS ? h - h0 : SK_PTRS;
        SKV_LAUNCH(k_gather_misses, 16, 256, 0, fs)(dsrc, c, d, h0, n, k, n_cand, blk0, sel, slot_of, miss, n_miss,
                                                    ptrs_from(V, h0, n), row_slot);
        CKL();
    }
    cuda_fetch_end();
    cuda_span_end(sp, 1, "fetch_v");
}

/* Block (m, j): head h0+j's miss m, its c rows one after the other, rounded
 * to bf16 (the misses along grid.x, whose limit is 2^31 - 1, the heads
 * along grid.y, at most SK_PTRS). */
__global__ void k_rebuild_misses(const uint16_t *U, int r, const float *SVt, int d, int c, int h0, int k, int n_cand,
                                 const int *cand, const int *sel, const int *slot_of, const int *miss,
                                 const int *n_miss, int rope_dim, int mode, const float *inv_freq, const float *cs,
                                 const float *sn, sk_ptrs K, int row_slot) {
    SKV_DYN_SHARED(float, row);
    int j = blockIdx.y, kh = h0 + j, m = blockIdx.x;
    if (m >= n_miss[kh]) return;
    int i = miss[(size_t)kh * k + m];
    int t0 = cand[(size_t)kh * n_cand + sel[(size_t)kh * k + i]] * c;
    const float *svt = SVt + (size_t)kh * r * d;
    uint16_t *out = K.p[j] + (size_t)(row_slot + slot_of[(size_t)kh * k + i] * c) * d;
    for (int tt = 0; tt < c; tt++)
        rebuild_row_dev(U, r, svt, d, t0 + tt, rope_dim, mode, inv_freq, cs, sn, row, out + (size_t)tt * d);
}

void cu_sk_rebuild_misses(const uint16_t *U, int r, const float *SVt, int d, int c, int h, int k, int n_cand,
                          const int *cand, const int *sel, const int *slot_of, const int *miss, const int *n_miss,
                          const rope_ctx *rope, const float *cs, const float *sn, uint16_t *const *K,
                          int row_slot) {
    if (h <= 0 || k <= 0) return;
    cudaStream_t st = cuda_get()->compute; /* beside the fetch: the rebuild reads no value rows */
    const float *inv = cuda_const_upload(rope->inv_freq, (size_t)(rope->rope_dim / 2));
    cuda_span_mark sp = cuda_span_begin(0);
    for (int h0 = 0; h0 < h; h0 += SK_PTRS) {
        int n = h - h0 < SK_PTRS ? h - h0 : SK_PTRS;
        SKV_LAUNCH(k_rebuild_misses, dim3(k, n), 128, sizeof(float) * d, st)(U, r, SVt, d, c, h0, k, n_cand, cand, sel,
                                                                     slot_of, miss, n_miss, rope->rope_dim,
                                                                     (int)rope->mode, inv, cs, sn,
                                                                     ptrs_from(K, h0, n), row_slot);
        CKL();
    }
    cuda_span_end(sp, 0, "rebuild_k");
}

/* ---- ShadowKV+: y = V_r·(V_rᵀ·x) ---- */

__global__ void k_project_coef(const float *Vt, int r, int n, const float *x, float *coef) {
    (void)r; /* the grid has r blocks */
    int i = blockIdx.x;
    float s = 0.0f;
    for (int e = threadIdx.x; e < n; e += blockDim.x) s += Vt[(size_t)i * n + e] * x[e];
    s = block_reduce(s, 0);
    if (threadIdx.x == 0) coef[i] = s;
}

__global__ void k_project_out(const float *Vt, int r, int n, const float *coef, float *y) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    float s = 0.0f;
    for (int i = 0; i < r; i++) s += coef[i] * Vt[(size_t)i * n + e];
    y[e] = s;
}

void cu_project(const float *Vt, int r, int n, const float *x, float *y, float *coef) {
    cudaStream_t st = cuda_after_fetch();
    SKV_LAUNCH(k_project_coef, r, 256, 0, st)(Vt, r, n, x, coef);
    CKL();
    SKV_LAUNCH(k_project_out, cuda_blocks((size_t)n, 256), 256, 0, st)(Vt, r, n, coef, y);
    CKL();
}

/* ---- page bounds and scores (Quest, FreeKV) ---- */

/* A thread per channel walks the positions in order (a page's first
 * position resets its bounds). */
__global__ void k_page_bounds(const float *K, int stride, int d, int p, int t0, int n, float *mn, float *mx,
                              int bstride) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= d) return;
    for (int t = t0; t < t0 + n; t++) {
        float k = K[(size_t)t * stride + ch];
        float *lo = mn + (size_t)(t / p) * bstride + ch, *hi = mx + (size_t)(t / p) * bstride + ch;
        if (t % p == 0) {
            *lo = k;
            *hi = k;
        } else {
            if (k < *lo) *lo = k;
            if (k > *hi) *hi = k;
        }
    }
}

void cu_page_bounds(const float *K, int stride, int d, int p, int t0, int n, float *mn, float *mx, int bstride) {
    if (n <= 0) return;
    SKV_LAUNCH(k_page_bounds, cuda_blocks((size_t)d, 128), 128, 0, cuda_after_fetch())(K, stride, d, p, t0, n, mn, mx,
                                                                              bstride);
    CKL();
}

__global__ void k_page_score(const float *q, int d, const float *mn, const float *mx, int bstride, int n_pages,
                             float *U) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_pages) return;
    const float *lo = mn + (size_t)j * bstride, *hi = mx + (size_t)j * bstride;
    float s = 0.0f;
    for (int c = 0; c < d; c++) s += km_page_bound(q[c], lo[c], hi[c]);
    U[j] = s;
}

void cu_page_score(const float *q, int d, const float *mn, const float *mx, int bstride, int n_pages, float *U) {
    if (n_pages <= 0) return;
    SKV_LAUNCH(k_page_score, cuda_blocks((size_t)n_pages, 128), 128, 0, cuda_after_fetch())(q, d, mn, mx, bstride, n_pages,
                                                                                    U);
    CKL();
}

/* ---- one KIVI group: a block ---- */

__global__ void k_kivi(const float *x, int n, int stride, int bits, int midpoint, float *y, uint8_t *codes,
                       float *scale, float *zero) {
    float lo = INFINITY, hi = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[(size_t)i * stride];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    lo = -block_reduce(-lo, 1);
    hi = block_reduce(hi, 1);
    float s, z;
    km_kivi_params(lo, hi, bits, midpoint, &s, &z);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[(size_t)i * stride];
        int q = km_kivi_code(v, s, z, bits);
        if (codes) codes[i] = (uint8_t)q;
        y[(size_t)i * stride] = km_kivi_decode(q, s, z, lo, hi);
    }
    if (threadIdx.x == 0) {
        if (scale) *scale = s;
        if (zero) *zero = z;
    }
}

void cu_kivi(const float *x, int n, int stride, int bits, int midpoint, float *y, uint8_t *codes, float *scale,
             float *zero) {
    SKV_LAUNCH(k_kivi, 1, 256, 0, cuda_after_fetch())(x, n, stride, bits, midpoint, y, codes, scale, zero);
    CKL();
}
