/* ops_forward.cu: the forward pass's ops on the GPU: weights in BF16,
 * projections (a decode step's through one launch for all the matrices of
 * one input, SwiGLU fused for gate and up: a warp-per-rows matvec up to 8
 * rows, tensor-core tiles up to 64; prefill chunks through cuBLAS: BF16
 * inputs, fp32 accumulation and output),
 * embedding, RMSNorm (and residual add fused with it), RoPE (q and k in one
 * launch), bias, residual add, SwiGLU, and the head-major KV store.
 * Per-element math from kernels/kmath.h; the CPU twins are the ops of
 * kernels/cpu/backend_cpu.c (tests/gpu/test_cuda_ops.c compares). */
#include "cuda_util.h"
#include "mma_util.h"

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

/* ---- projections ----
 *
 * Up to MV_MAX_N activation rows (a decode step, a small batch) go through
 * k_matvec: the BF16 weights times the fp32 activations as they are (no
 * conversion launch, x not rounded), each weight row read once for all the
 * rows, in 16-byte loads. Per 16 bytes of weights a lane reads 32 bytes of
 * each activation row (from L1/L2), so the warp takes R weight rows at a
 * time to keep those reads near 4x the weight bytes at any n; past 8 rows
 * the FMAs per weight byte reach the order of an H100's fp32 rate over its
 * memory bandwidth, and the tensor cores win (k_matmma below). Several matrices of
 * one x (Q, K, V; gate and up) run in one launch: a warp's task names its
 * matrix. Each output is one lane-strided sum and a fixed shuffle tree, so
 * a row's result does not depend on n or on the other matrices. */

#define MV_MAX_N 8  /* rows through k_matvec; more through k_matmma */
#define MV_WARPS 4  /* warps a block */

struct mv_args {
    const uint16_t *W[4]; /* (rows[i], cols) BF16 */
    float *y[4];          /* (n, rows[i]) */
    int rows[4];
    int task_end[4];      /* the running total of each matrix's warp tasks */
    int k;
};

struct alignas(16) mv_u4 { uint32_t a[4]; };  /* 8 BF16 weights */
struct alignas(16) mv_f4 { float a[4]; };

/* The two BF16 halves of a word as floats. */
__device__ __forceinline__ float mv_lo(uint32_t w) { return km_bits_f32(w << 16); }
__device__ __forceinline__ float mv_hi(uint32_t w) { return km_bits_f32(w & 0xffff0000u); }

/* A task's matrix (a task is a warp's in k_matvec, a block's in k_matmma)
 * and the number of its matrix's first task; false past the last task. The
 * matrix is chosen by constant indices only (a dynamic index into the
 * parameters would copy them to local memory). */
struct mv_task {
    const uint16_t *W;
    float *y;
    int rows, first;
};
__device__ __forceinline__ bool mv_find(const mv_args &a, int task, mv_task *o) {
    o->W = a.W[0];
    o->y = a.y[0];
    o->rows = a.rows[0];
    o->first = 0;
    int end = a.task_end[0];
#pragma unroll
    for (int m = 1; m < 4; m++) {
        if (m >= a.k) break;
        if (task >= end) {
            o->W = a.W[m];
            o->y = a.y[m];
            o->rows = a.rows[m];
            o->first = end;
        }
        end = a.task_end[m] > end ? a.task_end[m] : end;
    }
    return task < end;
}

/* Weight rows a warp for n activation rows (the reads of x per weight byte
 * at most 4, see above): 1 up to 2 rows, 2 up to 4, 4 up to 8; at least 2
 * with SWIGLU (a gate row and its up row). */
__host__ __device__ constexpr int mv_r(int n, bool swiglu) {
    return (n <= 2 ? 1 : n <= 4 ? 2 : 4) < 2 && swiglu ? 2 : (n <= 2 ? 1 : n <= 4 ? 2 : 4);
}

/* N activation rows, R = mv_r weight rows a warp. SWIGLU: matrices 0 and 1
 * are gate and up of the same rows; a task is R/2 rows of both, and y[0]
 * gets silu(gate) * up. vec: cols % 8 == 0 and every row 16-byte aligned. */
template <int N, bool SWIGLU>
__device__ __forceinline__ void mv_body(const mv_args &a, const float *__restrict__ x, int cols, int vec) {
    const int R = mv_r(N, SWIGLU);
    int lane = threadIdx.x & 31;
    int task = blockIdx.x * MV_WARPS + (int)(threadIdx.x >> 5);
    mv_task mt;
    if (!mv_find(a, task, &mt)) return; /* the whole warp: a task is a warp's */
    const uint16_t *W = mt.W;
    float *y = mt.y;
    int nrows = mt.rows, start = mt.first;
    const int RT = SWIGLU ? R / 2 : R; /* output rows a task */
    int r0 = (task - start) * RT;
    const uint16_t *wr[R];
#pragma unroll
    for (int rr = 0; rr < R; rr++) {
        int row = r0 + (SWIGLU ? rr % RT : rr);
        wr[rr] = (SWIGLU && rr >= RT ? a.W[1] : W) + (size_t)(row < nrows ? row : nrows - 1) * cols;
    }
    float acc[R][N];
#pragma unroll
    for (int rr = 0; rr < R; rr++)
#pragma unroll
        for (int j = 0; j < N; j++) acc[rr][j] = 0.0f;
    if (vec) {
        for (int c = lane * 8; c < cols; c += 256) {
            mv_u4 w[R];
#pragma unroll
            for (int rr = 0; rr < R; rr++) w[rr] = vec_ld(reinterpret_cast<const mv_u4 *>(wr[rr] + c));
#pragma unroll
            for (int j = 0; j < N; j++) {
                mv_f4 x0 = vec_ld(reinterpret_cast<const mv_f4 *>(x + (size_t)j * cols + c));
                mv_f4 x1 = vec_ld(reinterpret_cast<const mv_f4 *>(x + (size_t)j * cols + c + 4));
#pragma unroll
                for (int rr = 0; rr < R; rr++) {
                    float s = acc[rr][j];
                    s += mv_lo(w[rr].a[0]) * x0.a[0];
                    s += mv_hi(w[rr].a[0]) * x0.a[1];
                    s += mv_lo(w[rr].a[1]) * x0.a[2];
                    s += mv_hi(w[rr].a[1]) * x0.a[3];
                    s += mv_lo(w[rr].a[2]) * x1.a[0];
                    s += mv_hi(w[rr].a[2]) * x1.a[1];
                    s += mv_lo(w[rr].a[3]) * x1.a[2];
                    s += mv_hi(w[rr].a[3]) * x1.a[3];
                    acc[rr][j] = s;
                }
            }
        }
    } else {
        for (int c = lane; c < cols; c += 32) {
            float w[R];
#pragma unroll
            for (int rr = 0; rr < R; rr++) w[rr] = km_bf16_to_f32(wr[rr][c]);
#pragma unroll
            for (int j = 0; j < N; j++) {
                float xv = x[(size_t)j * cols + c];
#pragma unroll
                for (int rr = 0; rr < R; rr++) acc[rr][j] += w[rr] * xv;
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < R; rr++)
#pragma unroll
        for (int j = 0; j < N; j++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[rr][j] += __shfl_xor_sync(0xffffffffu, acc[rr][j], o);
    /* every lane holds the sums: output t is written by lane t % 32 */
#pragma unroll
    for (int rr = 0; rr < RT; rr++) {
        int row = r0 + rr;
#pragma unroll
        for (int j = 0; j < N; j++) {
            if (lane != (rr * N + j) % 32 || row >= nrows) continue;
            if (SWIGLU) y[(size_t)j * nrows + row] = km_silu_mul(acc[rr][j], acc[rr + RT][j]);
            else y[(size_t)j * nrows + row] = acc[rr][j];
        }
    }
}

template <int N>
__global__ void __launch_bounds__(MV_WARPS * 32) k_matvec(mv_args a, const float *__restrict__ x, int cols, int vec) {
    mv_body<N, false>(a, x, cols, vec);
}

template <int N>
__global__ void __launch_bounds__(MV_WARPS * 32)
    k_matvec_swiglu(mv_args a, const float *__restrict__ x, int cols, int vec) {
    mv_body<N, true>(a, x, cols, vec);
}

/* The task list of a launch whose task is per output rows of a matrix:
 * each matrix's running end (task_end, which mv_find reads) and the total. */
static int mv_tasks(mv_args *a, int per) {
    int tasks = 0;
    for (int i = 0; i < a->k; i++) {
        tasks += (a->rows[i] + per - 1) / per;
        a->task_end[i] = tasks;
    }
    return tasks;
}

template <int N, bool SWIGLU>
static void matvec_n(mv_args *a, const float *x, int cols, int vec, cudaStream_t st) {
    int tasks = mv_tasks(a, SWIGLU ? mv_r(N, true) / 2 : mv_r(N, false));
    if (!tasks) return;
    int blocks = cuda_blocks((size_t)tasks, MV_WARPS);
    if (SWIGLU) SKV_LAUNCH(k_matvec_swiglu<N>, blocks, MV_WARPS * 32, 0, st)(*a, x, cols, vec);
    else SKV_LAUNCH(k_matvec<N>, blocks, MV_WARPS * 32, 0, st)(*a, x, cols, vec);
    CKL();
}

/* y_i = x · W_iᵀ (SWIGLU: gate = silu(x · W_0ᵀ) * (x · W_1ᵀ)) for n <=
 * MV_MAX_N rows of x, every matrix in one launch. */
static void matvec(mv_args *a, const float *x, int cols, int n, bool swiglu, int vec, cudaStream_t st) {
#define MV_CASE(NN)                                                        \
    case NN:                                                              \
        if (swiglu) matvec_n<NN, true>(a, x, cols, vec, st);              \
        else matvec_n<NN, false>(a, x, cols, vec, st);                    \
        break;
    switch (n) {
        MV_CASE(1) MV_CASE(2) MV_CASE(3) MV_CASE(4) MV_CASE(5) MV_CASE(6) MV_CASE(7) MV_CASE(8)
    default: SKV_ASSERT(!"matvec: more rows than MV_MAX_N");
    }
#undef MV_CASE
}

/* ---- k_matmma: 9 to MM_MAX_N activation rows on the tensor cores ----
 *
 * Past MV_MAX_N rows the FMAs per weight byte outgrow the fp32 units, and
 * up to MM_MAX_N (a decode batch) one launch of mma.sync m16n8k16 tiles
 * takes every matrix of one x, as k_matvec does: Q, K and V, or gate and up
 * with SwiGLU fused (cuBLAS would take a conversion launch and a call a
 * matrix, and SwiGLU one more). Past it (a prefill chunk) cuBLAS runs.
 *
 * The weights are the A operand, 16 rows a tile; x is B, 8 rows a tile, so
 * 9 rows waste 7 of 16 columns, not 7 of 16 rows. x stays fp32 in memory
 * and goes in as two BF16 parts, hi = bf16(x) and lo = bf16(x - hi): two
 * MMAs a tile keep about 16 of x's 24 bits (x's error at most 2^-18 of it,
 * against 2^-9 for x rounded once), so a sequence's projections barely
 * move when a batch grows past 8.
 *
 * A block is MM_KS warps on MM_MT weight tiles. Warp w takes the 32-column
 * chunks w, w + MM_KS, ... (a block reads 512 contiguous bytes of each
 * weight row a round); the warps' sums meet in shared memory in a fixed
 * tree, so an output does not depend on timing. Inside a chunk lane
 * (g, t) loads columns 8t..8t+7 of its rows with one 16-byte load; the
 * order of the reduction's 16 columns in each MMA is a permutation of the
 * physical ones, the same for A and B: MMA s of the chunk takes physical
 * pairs 4t + 2s (as the fragment's columns 2t, 2t+1) and 4t + 2s + 1 (as
 * 2t + 8, 2t + 9). With SWIGLU a tile's rows g are gate rows and rows
 * g + 8 the same rows of up, so a lane holds both halves of its outputs. */

#define MM_MAX_N 64 /* rows through k_matmma; more through cuBLAS */
#define MM_KS 8     /* warps a block, each a slice of the columns */
#define MM_MT 2     /* 16-row weight tiles a block */

/* 8 BF16 weights of a row from column c (cols % 8 == 0 with vec, so a
 * load is all in or all out), packed in pairs; zero past cols. */
__device__ __forceinline__ void mm_wload(uint32_t w[4], const uint16_t *row, int c, int cols, int vec) {
    if (vec) {
        mv_u4 v = {};
        if (c < cols) v = vec_ld(reinterpret_cast<const mv_u4 *>(row + c));
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = v.a[i];
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = c + 2 * i < cols ? row[c + 2 * i] : 0, hi = c + 2 * i + 1 < cols ? row[c + 2 * i + 1] : 0;
        w[i] = lo | hi << 16;
    }
}

/* 8 floats of an activation row from column c as BF16 pairs, hi and lo
 * parts; zero past cols or for a row past n (in = 0). */
__device__ __forceinline__ void mm_xload(uint32_t h[4], uint32_t l[4], const float *row, int c, int cols, int vec,
                                         bool in) {
    float v[8];
    if (vec) {
        mv_f4 v0 = {}, v1 = {};
        if (in && c < cols) {
            v0 = vec_ld(reinterpret_cast<const mv_f4 *>(row + c));
            v1 = vec_ld(reinterpret_cast<const mv_f4 *>(row + c + 4));
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = v0.a[i];
            v[4 + i] = v1.a[i];
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = in && c + i < cols ? row[c + i] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t h0 = km_f32_to_bf16(v[2 * i]), h1 = km_f32_to_bf16(v[2 * i + 1]);
        uint32_t l0 = km_f32_to_bf16(v[2 * i] - km_bf16_to_f32((uint16_t)h0));
        uint32_t l1 = km_f32_to_bf16(v[2 * i + 1] - km_bf16_to_f32((uint16_t)h1));
        h[i] = h0 | h1 << 16;
        l[i] = l0 | l1 << 16;
    }
}

/* NT tiles of 8 activation rows (n <= 8 NT). A task is a block: MM_MT
 * tiles of 16 weight rows (SWIGLU: 8 gate rows and the same 8 of up each),
 * numbered across the matrices by task_end as in k_matvec. A warp loads the
 * weights of PF of its chunks (1 or 2) before their MMAs: PF = 2 keeps
 * twice the bytes in flight (4 KiB a warp), for the o and down projections'
 * one block an SM; the MMAs run in the same order, so the sums are the same
 * bits either way (SKV_CUDA_MM_PREFETCH, mm_prefetch). */
template <int NT, int PF, bool SWIGLU>
__device__ __forceinline__ void mm_body(const mv_args &a, const float *__restrict__ x, int n, int cols, int vec) {
    __shared__ float red[MM_KS / 2][MM_MT * NT * 4][32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int task = blockIdx.x;
    mv_task mt;
    if (!mv_find(a, task, &mt)) return; /* the whole block */
    const uint16_t *W = mt.W;
    float *y = mt.y;
    int nrows = mt.rows, start = mt.first;
    const int OT = SWIGLU ? 8 : 16; /* output rows a tile */
    int r0 = (task - start) * MM_MT * OT;
    const uint16_t *wr[MM_MT][2]; /* rows g and g + 8 of each tile */
#pragma unroll
    for (int m = 0; m < MM_MT; m++) {
        int ra = r0 + m * OT + g, rb = SWIGLU ? ra : ra + 8;
        wr[m][0] = W + (size_t)(ra < nrows ? ra : nrows - 1) * cols;
        wr[m][1] = (SWIGLU ? a.W[1] : W) + (size_t)(rb < nrows ? rb : nrows - 1) * cols;
    }
    float acc[MM_MT][NT][4];
#pragma unroll
    for (int m = 0; m < MM_MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[m][j][e] = 0.0f;
    for (int c0 = warp * 32; c0 < cols; c0 += PF * MM_KS * 32) { /* warp-uniform */
        uint32_t w[PF][MM_MT][2][4];
#pragma unroll
        for (int p = 0; p < PF; p++) /* zeros past cols */
#pragma unroll
            for (int m = 0; m < MM_MT; m++) {
                int c = c0 + p * MM_KS * 32 + 8 * t;
                mm_wload(w[p][m][0], wr[m][0], c, cols, vec);
                mm_wload(w[p][m][1], wr[m][1], c, cols, vec);
            }
#pragma unroll
        for (int p = 0; p < PF; p++) {
            int cp = c0 + p * MM_KS * 32, c = cp + 8 * t;
            if (p && cp >= cols) break; /* warp-uniform */
#pragma unroll
            for (int j = 0; j < NT; j++) {
                int act = 8 * j + g;
                uint32_t xh[4], xl[4];
                mm_xload(xh, xl, x + (size_t)(act < n ? act : 0) * cols, c, cols, vec, act < n);
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    uint32_t bh[2] = {xh[2 * s], xh[2 * s + 1]}, bl[2] = {xl[2 * s], xl[2 * s + 1]};
#pragma unroll
                    for (int m = 0; m < MM_MT; m++) {
                        uint32_t af[4] = {w[p][m][0][2 * s], w[p][m][1][2 * s], w[p][m][0][2 * s + 1],
                                          w[p][m][1][2 * s + 1]};
                        mma_16816<__nv_bfloat16>(acc[m][j], af, bh);
                        mma_16816<__nv_bfloat16>(acc[m][j], af, bl);
                    }
                }
            }
        }
    }
    /* the warps' sums, halved in a fixed tree onto warp 0 */
#pragma unroll
    for (int h = MM_KS / 2; h >= 1; h >>= 1) {
        if (warp >= h && warp < 2 * h)
#pragma unroll
            for (int m = 0; m < MM_MT; m++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) red[warp - h][(m * NT + j) * 4 + e][lane] = acc[m][j][e];
        __syncthreads();
        if (warp < h)
#pragma unroll
            for (int m = 0; m < MM_MT; m++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[m][j][e] += red[warp][(m * NT + j) * 4 + e][lane];
        __syncthreads();
    }
    if (warp) return;
    /* lane (g, t) holds rows g and g + 8 of each tile for activations
     * 8j + 2t and 8j + 2t + 1 */
#pragma unroll
    for (int m = 0; m < MM_MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int act = 8 * j + 2 * t + e;
                if (act >= n) continue;
                if (SWIGLU) {
                    int row = r0 + m * 8 + g;
                    if (row < nrows) y[(size_t)act * nrows + row] = km_silu_mul(acc[m][j][e], acc[m][j][2 + e]);
                } else {
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        int row = r0 + m * 16 + 8 * hf + g;
                        if (row < nrows) y[(size_t)act * nrows + row] = acc[m][j][2 * hf + e];
                    }
                }
            }
}

template <int NT>
__global__ void __launch_bounds__(MM_KS * 32) k_matmma(mv_args a, const float *__restrict__ x, int n, int cols, int vec) {
    mm_body<NT, 1, false>(a, x, n, cols, vec);
}

template <int NT>
__global__ void __launch_bounds__(MM_KS * 32)
    k_matmma_swiglu(mv_args a, const float *__restrict__ x, int n, int cols, int vec) {
    mm_body<NT, 1, true>(a, x, n, cols, vec);
}

/* The same, two chunks loaded ahead (SKV_CUDA_MM_PREFETCH=2). */
template <int NT>
__global__ void __launch_bounds__(MM_KS * 32)
    k_matmma_pf2(mv_args a, const float *__restrict__ x, int n, int cols, int vec) {
    mm_body<NT, 2, false>(a, x, n, cols, vec);
}

template <int NT>
__global__ void __launch_bounds__(MM_KS * 32)
    k_matmma_swiglu_pf2(mv_args a, const float *__restrict__ x, int n, int cols, int vec) {
    mm_body<NT, 2, true>(a, x, n, cols, vec);
}

/* Chunks a warp of k_matmma loads ahead (mm_body's PF): 1, or 2 with
 * SKV_CUDA_MM_PREFETCH=2, for tests/gpu/bench_proj's side by side of the
 * two on a device. Read at each call (a test switches it); a step's graph
 * keeps the kernel it captured. */
static int mm_prefetch(void) {
    const char *v = getenv("SKV_CUDA_MM_PREFETCH");
    return v && !strcmp(v, "2") ? 2 : 1;
}

template <int NT, bool SWIGLU>
static void matmma_n(mv_args *a, const float *x, int n, int cols, int vec, cudaStream_t st) {
    int tasks = mv_tasks(a, MM_MT * (SWIGLU ? 8 : 16));
    if (!tasks) return;
    if (mm_prefetch() == 2) {
        if (SWIGLU) SKV_LAUNCH(k_matmma_swiglu_pf2<NT>, tasks, MM_KS * 32, 0, st)(*a, x, n, cols, vec);
        else SKV_LAUNCH(k_matmma_pf2<NT>, tasks, MM_KS * 32, 0, st)(*a, x, n, cols, vec);
    } else {
        if (SWIGLU) SKV_LAUNCH(k_matmma_swiglu<NT>, tasks, MM_KS * 32, 0, st)(*a, x, n, cols, vec);
        else SKV_LAUNCH(k_matmma<NT>, tasks, MM_KS * 32, 0, st)(*a, x, n, cols, vec);
    }
    CKL();
}

/* The same for 9 <= n <= MM_MAX_N rows. */
static void matmma(mv_args *a, const float *x, int cols, int n, bool swiglu, int vec, cudaStream_t st) {
#define MM_CASE(NT)                                                        \
    case NT:                                                              \
        if (swiglu) matmma_n<NT, true>(a, x, n, cols, vec, st);           \
        else matmma_n<NT, false>(a, x, n, cols, vec, st);                 \
        break;
    switch ((n + 7) / 8) {
        MM_CASE(2) MM_CASE(3) MM_CASE(4) MM_CASE(5) MM_CASE(6) MM_CASE(7) MM_CASE(8)
    default: SKV_ASSERT(!"matmma: rows outside 9..MM_MAX_N");
    }
#undef MM_CASE
}

/* Rows through the backend's own projection kernels: MM_MAX_N, or R from
 * SKV_CUDA_GEMM_ROWS=R (0 to MM_MAX_N) to send batches past R to cuBLAS,
 * for tests/gpu/bench_proj's side by side of the two on a device. */
static int own_rows(void) {
    static int rows = -1;
    if (rows < 0) {
        const char *v = getenv("SKV_CUDA_GEMM_ROWS");
        char *e = NULL;
        long r = v && *v ? strtol(v, &e, 10) : MM_MAX_N;
        rows = e && *e ? MM_MAX_N : r < 0 ? 0 : r > MM_MAX_N ? MM_MAX_N : (int)r;
    }
    return rows;
}

/* y_i = x · W_iᵀ for the k matrices of a (SWIGLU: y_0 = silu(x · W_0ᵀ) *
 * (x · W_1ᵀ)), n <= MM_MAX_N rows of x: one launch, k_matvec up to
 * MV_MAX_N rows, k_matmma past them. */
static void project(mv_args *a, const float *x, int cols, int n, bool swiglu, cudaStream_t st) {
    int vec = cols % 8 == 0 && ((uintptr_t)x & 15) == 0;
    for (int i = 0; i < (swiglu ? 2 : a->k); i++) vec &= ((uintptr_t)a->W[i] & 15) == 0;
    if (n <= MV_MAX_N) matvec(a, x, cols, n, swiglu, vec, st);
    else matmma(a, x, cols, n, swiglu, vec, st);
}


__global__ void k_to_bf16(const float *x, __nv_bfloat16 *y, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) {
        uint16_t b = km_f32_to_bf16(x[i]);
        y[i] = *reinterpret_cast<__nv_bfloat16 *>(&b);
    }
}

/* x (n, cols) rounded to BF16 in scratch, for the cuBLAS GEMMs. */
static __nv_bfloat16 *to_bf16(const float *x, size_t nx, cudaStream_t st) {
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(sizeof(__nv_bfloat16) * nx);
    SKV_LAUNCH(k_to_bf16, cuda_blocks(nx, 256), 256, 0, st)(x, xb, nx);
    CKL();
    return xb;
}

/* y (n, rows) = xb (n, cols) · Wᵀ through cuBLAS. In its column-major terms
 * the row-major W (rows, cols) is Wᵀ (cols, rows), so y (rows, n)
 * column-major = op_T(W) · x. */
static void gemm_bf16(const void *W, int rows, int cols, const __nv_bfloat16 *xb, int n, float *y) {
    const float one = 1.0f, zero = 0.0f;
    CKB(cublasGemmEx(cuda_get()->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, W, CUDA_R_16BF, cols, xb,
                     CUDA_R_16BF, cols, &zero, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* y (n, rows) = x (n, cols) · Wᵀ. BF16 weights: n <= MM_MAX_N (own_rows)
 * in one launch (project); more through cuBLAS, x rounded to BF16. fp32
 * ones (vectors loaded as weights never reach here) run an fp32 GEMM. */
void cu_matmul(enum ggml_type t, const void *W, int rows, int cols, const float *x, int n, float *y,
               skv_workspace *ws) {
    (void)ws;
    cuda_ctx *c = cuda_get();
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    if (t == GGML_BF16 && n <= own_rows()) {
        mv_args a = {};
        a.W[0] = (const uint16_t *)W;
        a.y[0] = y;
        a.rows[0] = rows;
        a.k = 1;
        project(&a, x, cols, n, false, st);
    } else if (t == GGML_BF16) {
        __nv_bfloat16 *xb = to_bf16(x, (size_t)n * cols, st);
        gemm_bf16(W, rows, cols, xb, n, y);
        cuda_scratch_free(xb);
    } else {
        SKV_ASSERT(t == GGML_F32);
        const float one = 1.0f, zero = 0.0f;
        CKB(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, (const float *)W, cols, x, cols,
                        &zero, y, rows));
    }
    cuda_span_end(sp, 0, "matmul");
}

/* Every matrix BF16 (as cu_weight_load stores them): one launch for a
 * decode step (project), or x rounded once for the k GEMMs. */
void cu_matmul_k(int k, const enum ggml_type *t, const void *const *W, const int *rows, int cols, const float *x,
                 int n, float *const *y, skv_workspace *ws) {
    SKV_ASSERT(k >= 1 && k <= 4);
    int bf16 = 1;
    for (int i = 0; i < k; i++) bf16 &= t[i] == GGML_BF16;
    if (!bf16) {
        for (int i = 0; i < k; i++) cu_matmul(t[i], W[i], rows[i], cols, x, n, y[i], ws);
        return;
    }
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    if (n <= own_rows()) {
        mv_args a = {};
        for (int i = 0; i < k; i++) {
            a.W[i] = (const uint16_t *)W[i];
            a.y[i] = y[i];
            a.rows[i] = rows[i];
        }
        a.k = k;
        project(&a, x, cols, n, false, st);
    } else {
        __nv_bfloat16 *xb = to_bf16(x, (size_t)n * cols, st);
        for (int i = 0; i < k; i++) gemm_bf16(W[i], rows[i], cols, xb, n, y[i]);
        cuda_scratch_free(xb);
    }
    cuda_span_end(sp, 0, "matmul");
}

/* gate = silu(x · Wgᵀ) * (x · Wuᵀ): for a decode step one launch
 * (project) that writes gate alone; otherwise the two GEMMs and swiglu. */
void cu_matmul_swiglu(enum ggml_type tg, const void *Wg, enum ggml_type tu, const void *Wu, int rows, int cols,
                      const float *x, int n, float *gate, float *up, skv_workspace *ws) {
    if (tg == GGML_BF16 && tu == GGML_BF16 && n <= own_rows()) {
        cudaStream_t st = cuda_after_fetch();
        cuda_span_mark sp = cuda_span_begin(0);
        mv_args a = {};
        a.W[0] = (const uint16_t *)Wg;
        a.W[1] = (const uint16_t *)Wu;
        a.y[0] = gate;
        a.rows[0] = rows;
        a.k = 1; /* one task list: the gate rows, each with its up row */
        project(&a, x, cols, n, true, st);
        cuda_span_end(sp, 0, "matmul");
        return;
    }
    enum ggml_type t[2] = {tg, tu};
    const void *W[2] = {Wg, Wu};
    int r[2] = {rows, rows};
    float *y[2] = {gate, up};
    cu_matmul_k(2, t, W, r, cols, x, n, y, ws);
    cu_swiglu(gate, up, (size_t)n * rows);
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

/* The ids go up from pinned staging on the compute stream: the host does
 * not wait (a copy from pageable memory may make it). */
void cu_embed(enum ggml_type t, const void *table, int dim, const int32_t *ids, int n, float *x) {
    cudaStream_t st = cuda_after_fetch();
    int32_t *d_ids = (int32_t *)cuda_scratch(sizeof(int32_t) * n);
    const void *staged = cuda_stage(ids, sizeof(int32_t) * n);
    CK(cudaMemcpyAsync(d_ids, staged, sizeof(int32_t) * n, cudaMemcpyHostToDevice, st));
    size_t total = (size_t)n * dim;
    if (t == GGML_BF16)
        SKV_LAUNCH(k_embed, cuda_blocks(total, 256), 256, 0, st)((const uint16_t *)table, dim, d_ids, n, x);
    else
        SKV_LAUNCH(k_embed_f32, cuda_blocks(total, 256), 256, 0, st)((const float *)table, dim, d_ids, n, x);
    CKL();
    cuda_scratch_free(d_ids);
}

/* ---- RMSNorm: one block per row, the sum of squares in double ---- */

/* The RMS scale of a row from each thread's partial sum of squares s (a
 * block of up to 256 threads, a power of two), summed as a tree. */
static __device__ float block_rms_scale(double s, int dim, float eps) {
    __shared__ double part[256];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    return km_rms_scale(part[0], dim, eps);
}

__global__ void k_rmsnorm(float *out, const float *x, const float *w, int dim, float eps) {
    const float *xi = x + (size_t)blockIdx.x * dim;
    float *oi = out + (size_t)blockIdx.x * dim;
    double s = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) s += (double)xi[j] * xi[j];
    float sc = block_rms_scale(s, dim, eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) oi[j] = xi[j] * sc * w[j];
}

void cu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps) {
    cuda_span_mark sp = cuda_span_begin(0);
    SKV_LAUNCH(k_rmsnorm, n, 256, 0, cuda_after_fetch())(out, x, w, dim, eps);
    CKL();
    cuda_span_end(sp, 0, "rmsnorm");
}

/* x += y, then out = rmsnorm(x) * w: one block a row, as k_rmsnorm. Each
 * thread reads y[j] and writes out[j] for its own j, so out may be y (or x). */
__global__ void k_add_rmsnorm(float *x, const float *y, float *out, const float *w, int dim, float eps) {
    float *xi = x + (size_t)blockIdx.x * dim, *oi = out + (size_t)blockIdx.x * dim;
    const float *yi = y + (size_t)blockIdx.x * dim;
    double s = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = xi[j] + yi[j];
        xi[j] = v;
        s += (double)v * v;
    }
    float sc = block_rms_scale(s, dim, eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) oi[j] = xi[j] * sc * w[j];
}

void cu_add_rmsnorm(float *x, const float *y, float *out, const float *w, int n, int dim, float eps) {
    if (n < 1) return;
    cuda_span_mark sp = cuda_span_begin(0);
    SKV_LAUNCH(k_add_rmsnorm, n, 256, 0, cuda_after_fetch())(x, y, out, w, dim, eps);
    CKL();
    cuda_span_end(sp, 0, "add_rmsnorm");
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

/* q and k in one launch: one thread per (row, head of q then of k, pair of
 * head_dim/2). A thread of a K head with k_pre copies its two elements
 * there first; the pairs past rope_dim/2 only copy (the unrotated tail,
 * elements rope_dim..head_dim-1, two a thread). Row t's position: pos0 + t,
 * or rp.pos[t] with per_row (the batch's positions, passed by value: no
 * upload, no device copy to keep). */
#define ROPE_ROWS_MAX 256 /* rows a launch with per-row positions (1 KiB of parameters) */
struct rope_pos { int pos[ROPE_ROWS_MAX]; };

__global__ void k_rope_qk(float *q, int n_heads, float *k, int n_kv, float *k_pre, int n, int head_dim, int rope_dim,
                          int mode, const float *inv_freq, int pos0, int per_row, rope_pos rp) {
    int hp = head_dim / 2, nh = n_heads + n_kv;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * nh * hp) return;
    int p = (int)(i % hp);
    size_t rh = i / hp;
    int h = (int)(rh % nh), t = (int)(rh / nh);
    int is_k = h >= n_heads;
    float *v = is_k ? k + ((size_t)t * n_kv + (h - n_heads)) * head_dim : q + ((size_t)t * n_heads + h) * head_dim;
    float *pre = is_k && k_pre ? k_pre + ((size_t)t * n_kv + (h - n_heads)) * head_dim : NULL;
    int a, b;
    if (p < rope_dim / 2) {
        km_rope_pair_index(mode, p, rope_dim, &a, &b);
    } else {
        a = rope_dim + 2 * (p - rope_dim / 2);
        b = a + 1;
    }
    if (pre) {
        pre[a] = v[a];
        pre[b] = v[b];
    }
    if (p >= rope_dim / 2) return;
    float cs, sn;
    km_rope_cs(inv_freq[p], per_row ? rp.pos[t] : pos0 + t, &cs, &sn);
    km_rotate(&v[a], &v[b], cs, sn);
}

void cu_rope_qk(const rope_ctx *r, float *q, int n_heads, float *k, int n_kv, float *k_pre, int n, int pos0,
                const int *pos) {
    if (n < 1) return;
    int half = r->rope_dim / 2;
    cudaStream_t st = cuda_after_fetch();
    if (!half) { /* nothing rotates: k_pre is k */
        if (k_pre) CK(cudaMemcpyAsync(k_pre, k, sizeof(float) * n * n_kv * r->head_dim, cudaMemcpyDeviceToDevice, st));
        return;
    }
    const float *inv = cuda_const_upload(r->inv_freq, (size_t)half);
    cuda_span_mark sp = cuda_span_begin(0);
    size_t qd = (size_t)n_heads * r->head_dim, kd = (size_t)n_kv * r->head_dim;
    rope_pos rp = {};
    for (int t0 = 0; t0 < n; t0 += pos ? ROPE_ROWS_MAX : n) {
        int m = pos && n - t0 > ROPE_ROWS_MAX ? ROPE_ROWS_MAX : n - t0;
        if (pos) memcpy(rp.pos, pos + t0, sizeof(int) * m);
        size_t total = (size_t)m * (n_heads + n_kv) * (r->head_dim / 2);
        SKV_LAUNCH(k_rope_qk, cuda_blocks(total, 256), 256, 0, st)(q + t0 * qd, n_heads, k + t0 * kd,
                                                                   n_kv, k_pre ? k_pre + t0 * kd : NULL, m,
                                                                   r->head_dim, r->rope_dim, (int)r->mode, inv,
                                                                   pos0 + t0, pos != NULL, rp);
        CKL();
    }
    cuda_span_end(sp, 0, "rope");
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
