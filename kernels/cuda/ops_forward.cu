/* ops_forward.cu: the forward pass's ops on the GPU: weights in BF16,
 * projections through cuBLAS (BF16 inputs, fp32 accumulation and output),
 * embedding, RMSNorm, RoPE, bias, residual add, SwiGLU, and the head-major
 * KV store. Per-element math from kernels/kmath.h; the CPU twins are the
 * ops of kernels/cpu/backend_cpu.c (tests/gpu/test_cuda_ops.c compares). */
#include "cuda_util.h"

#include <cuda_fp16.h>

#include <cuda_bf16.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "quant.h"
}

/* ---- weights ---- */

int cu_weight_load(enum ggml_type t, const void *host, int rows, int cols, skv_weight *w) {
    memset(w, 0, sizeof *w);
    cuda_get();
    size_t n = (size_t)rows * cols;
    if (!quant_supported(t))
        return skv_error(SKV_EUNSUPPORTED, "cuda: tensors of type %s cannot be loaded", ggml_type_name(t));
    size_t row_bytes = ggml_row_size(t, cols);
    /* converted a block of rows at a time on the host, then uploaded on the
     * compute stream (cu_upload waits for it; cudaMemcpy would use the legacy
     * stream, which the compute stream is not ordered with) */
    int chunk = (int)(((size_t)1 << 22) / (cols ? cols : 1));
    if (chunk < 1) chunk = 1;
    float *f = (float *)malloc(sizeof(float) * (size_t)chunk * cols);
    uint16_t *h = rows > 1 ? (uint16_t *)malloc(sizeof(uint16_t) * (size_t)chunk * cols) : NULL;
    void *dev = NULL;
    size_t esz = rows > 1 ? sizeof(uint16_t) : sizeof(float);
    if (!f || (rows > 1 && !h) || cudaMalloc(&dev, esz * (n ? n : 1)) != cudaSuccess) {
        cudaGetLastError();
        free(f);
        free(h);
        return skv_error(SKV_ENOMEM, "cuda: out of device memory for a (%d, %d) weight", rows, cols);
    }
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        int nr = rows - r0 < chunk ? rows - r0 : chunk;
        quant_dequant_row(t, (const uint8_t *)host + row_bytes * r0, f, (size_t)nr * cols);
        if (rows > 1) {
            for (size_t i = 0; i < (size_t)nr * cols; i++) h[i] = km_f32_to_bf16(f[i]);
            cu_upload((uint16_t *)dev + (size_t)r0 * cols, h, sizeof(uint16_t) * (size_t)nr * cols);
        } else {
            cu_upload(dev, f, sizeof(float) * (size_t)nr * cols);
        }
    }
    free(f);
    free(h);
    w->type = rows > 1 ? GGML_BF16 : GGML_F32;
    w->data = dev;
    w->owned = dev;
    return 0;
}

void cu_weight_free(skv_weight *w) {
    if (w->owned) {
        CK(cudaDeviceSynchronize());
        CK(cudaFree(w->owned));
    }
    memset(w, 0, sizeof *w);
}

/* ---- projections ---- */

__global__ void k_to_bf16(const float *x, __nv_bfloat16 *y, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) {
        uint16_t b = km_f32_to_bf16(x[i]);
        y[i] = *reinterpret_cast<__nv_bfloat16 *>(&b);
    }
}

/* y (n, rows) = x (n, cols) · Wᵀ. In cuBLAS's column-major terms the
 * row-major W (rows, cols) is Wᵀ (cols, rows), so y (rows, n) column-major
 * = op_T(W) · x. BF16 weights meet x rounded to BF16; fp32 ones (vectors
 * loaded as weights never reach here) run an fp32 GEMM. */
void cu_matmul(enum ggml_type t, const void *W, int rows, int cols, const float *x, int n, float *y,
               skv_workspace *ws) {
    (void)ws;
    cuda_ctx *c = cuda_get();
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    const float one = 1.0f, zero = 0.0f;
    if (t == GGML_BF16) {
        size_t nx = (size_t)n * cols;
        __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(sizeof(__nv_bfloat16) * nx);
        SKV_LAUNCH(k_to_bf16, cuda_blocks(nx, 256), 256, 0, st)(x, xb, nx);
        CKL();
        CKB(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, W, CUDA_R_16BF, cols, xb,
                         CUDA_R_16BF, cols, &zero, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        cuda_scratch_free(xb);
    } else {
        SKV_ASSERT(t == GGML_F32);
        CKB(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, (const float *)W, cols, x, cols,
                        &zero, y, rows));
    }
    cuda_span_end(sp, 0, "matmul");
}

void cu_matmul_k(int k, const enum ggml_type *t, const void *const *W, const int *rows, int cols, const float *x,
                 int n, float *const *y, skv_workspace *ws) {
    for (int i = 0; i < k; i++) cu_matmul(t[i], W[i], rows[i], cols, x, n, y[i], ws);
}

/* ---- embedding ---- */

__global__ void k_embed(const uint16_t *table, int dim, const int32_t *ids, int n, float *x) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * dim) return;
    int t = (int)(i / dim), e = (int)(i % dim);
    x[i] = km_bf16_to_f32(table[(size_t)ids[t] * dim + e]);
}

__global__ void k_embed_f32(const float *table, int dim, const int32_t *ids, int n, float *x) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * dim) return;
    int t = (int)(i / dim), e = (int)(i % dim);
    x[i] = table[(size_t)ids[t] * dim + e];
}

void cu_embed(enum ggml_type t, const void *table, int dim, const int32_t *ids, int n, float *x) {
    cudaStream_t st = cuda_after_fetch();
    int32_t *d_ids = (int32_t *)cuda_scratch(sizeof(int32_t) * n);
    CK(cudaMemcpyAsync(d_ids, ids, sizeof(int32_t) * n, cudaMemcpyHostToDevice, st));
    size_t total = (size_t)n * dim;
    if (t == GGML_BF16)
        SKV_LAUNCH(k_embed, cuda_blocks(total, 256), 256, 0, st)((const uint16_t *)table, dim, d_ids, n, x);
    else
        SKV_LAUNCH(k_embed_f32, cuda_blocks(total, 256), 256, 0, st)((const float *)table, dim, d_ids, n, x);
    CKL();
    cuda_scratch_free(d_ids);
}

/* ---- RMSNorm: one block per row, the sum of squares in double ---- */

__global__ void k_rmsnorm(float *out, const float *x, const float *w, int dim, float eps) {
    __shared__ double part[256];
    const float *xi = x + (size_t)blockIdx.x * dim;
    float *oi = out + (size_t)blockIdx.x * dim;
    double s = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) s += (double)xi[j] * xi[j];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    float sc = km_rms_scale(part[0], dim, eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) oi[j] = xi[j] * sc * w[j];
}

void cu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps) {
    cuda_span_mark sp = cuda_span_begin(0);
    SKV_LAUNCH(k_rmsnorm, n, 256, 0, cuda_after_fetch())(out, x, w, dim, eps);
    CKL();
    cuda_span_end(sp, 0, "rmsnorm");
}

/* ---- RoPE: one thread per (row, head, pair) ---- */

__global__ void k_rope(float *x, int n, int n_heads, int head_dim, int rope_dim, int mode, const float *inv_freq,
                       int pos0) {
    int half = rope_dim / 2;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * n_heads * half) return;
    int p = (int)(i % half);
    size_t rh = i / half;
    int h = (int)(rh % n_heads), t = (int)(rh / n_heads);
    float cs, sn;
    km_rope_cs(inv_freq[p], pos0 + t, &cs, &sn);
    int a, b;
    km_rope_pair_index(mode, p, rope_dim, &a, &b);
    float *v = x + ((size_t)t * n_heads + h) * head_dim;
    km_rotate(&v[a], &v[b], cs, sn);
}

void cu_rope(const rope_ctx *r, float *x, int n, int n_heads, int pos0) {
    int half = r->rope_dim / 2;
    if (!half || !n) return;
    const float *inv = cuda_const_upload(r->inv_freq, (size_t)half);
    size_t total = (size_t)n * n_heads * half;
    SKV_LAUNCH(k_rope, cuda_blocks(total, 256), 256, 0, cuda_after_fetch())(x, n, n_heads, r->head_dim, r->rope_dim,
                                                                    (int)r->mode, inv, pos0);
    CKL();
}

/* ---- elementwise ---- */

__global__ void k_add_bias(float *y, const float *b, size_t total, int width) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < total) y[i] += b[i % width];
}

void cu_add_bias(float *y, const float *b, int n, int width) {
    size_t total = (size_t)n * width;
    SKV_LAUNCH(k_add_bias, cuda_blocks(total, 256), 256, 0, cuda_after_fetch())(y, b, total, width);
    CKL();
}

__global__ void k_add(float *y, const float *x, size_t len) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < len) y[i] += x[i];
}

void cu_add(float *y, const float *x, size_t len) {
    SKV_LAUNCH(k_add, cuda_blocks(len, 256), 256, 0, cuda_after_fetch())(y, x, len);
    CKL();
}

__global__ void k_swiglu(float *g, const float *u, size_t len) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < len) g[i] = km_silu_mul(g[i], u[i]);
}

void cu_swiglu(float *gate, const float *up, size_t len) {
    SKV_LAUNCH(k_swiglu, cuda_blocks(len, 256), 256, 0, cuda_after_fetch())(gate, up, len);
    CKL();
}

/* ---- KV store: token-major rows into the head-major cache ---- */

__global__ void k_kv_store(float *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t row = (size_t)n_kv * d;
    if (i >= (size_t)n * row) return;
    int t = (int)(i / row), kh = (int)(i % row) / d, e = (int)(i % d);
    cache[(size_t)kh * head_stride + (size_t)(pos + t) * d + e] = src[i];
}

/* The same into a half-precision cache (--f16-kv): rounded to nearest even, as the CPU's. */
__global__ void k_kv_store_h(__half *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t row = (size_t)n_kv * d;
    if (i >= (size_t)n * row) return;
    int t = (int)(i / row), kh = (int)(i % row) / d, e = (int)(i % d);
    cache[(size_t)kh * head_stride + (size_t)(pos + t) * d + e] = __float2half_rn(src[i]);
}

void cu_kv_store_h(uint16_t *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src) {
    size_t total = (size_t)n * n_kv * d;
    SKV_LAUNCH(k_kv_store_h, cuda_blocks(total, 256), 256, 0, cuda_after_fetch())((__half *)cache, head_stride, n_kv, d, pos,
                                                                          n, src);
    CKL();
}

void cu_kv_store(float *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src) {
    size_t total = (size_t)n * n_kv * d;
    SKV_LAUNCH(k_kv_store, cuda_blocks(total, 256), 256, 0, cuda_after_fetch())(cache, head_stride, n_kv, d, pos, n, src);
    CKL();
}
