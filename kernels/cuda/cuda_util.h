/* cuda_util.h: what the CUDA backend's files share (CUDA C++ only): the
 * context (device, the compute and fetch streams, cuBLAS and cuSOLVER
 * handles), error checks, stream-ordered scratch, the timeline's span
 * recorder, and the declarations of the ops each .cu file defines for the
 * table in backend_cuda.cu.
 *
 * Every op takes pointers of device memory (from the table's alloc) unless
 * its contract in kernels/backend.h says host: the ids of embed, the index
 * lists of gather (and its source: host_alloc's pinned, mapped memory), the
 * rope_ctx. Ops queue work on the compute stream and return; gather queues
 * on the fetch stream, and the ops that read what it wrote (the attention
 * ops, copy, download, sync) wait for it first. */
#ifndef SKV_CUDA_UTIL_H
#define SKV_CUDA_UTIL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

extern "C" {
#include "backend.h"
#include "kmath.h"
#include "skv.h"
}
#include "cuda_ops.h"

/* What a call costs the host, for the counts of SKV_CUDA_COUNT=1
 * (cuda_count.cu), from the call's text at compile time: CUDA_CALL_SYNC, a
 * call the host waits in for the device (the *Synchronize calls, cudaFree,
 * cudaFreeHost, cudaMemcpy, cudaMemcpy2D); CUDA_CALL_GRAPH, a graph launch;
 * CUDA_CALL_LIB, a cuBLAS, cuSOLVER or CUB call that queues work (not a
 * handle's setup, a workspace query or a status read); else 0. */
enum { CUDA_CALL_SYNC = 1, CUDA_CALL_GRAPH = 2, CUDA_CALL_LIB = 3 };
static constexpr int cuda_call_is(const char *s, const char *name, int whole) {
    int i = 0;
    for (; name[i]; i++)
        if (s[i] != name[i]) return 0;
    return !whole || s[i] == '(' || s[i] == ' ';
}
static constexpr int cuda_call_has(const char *s, const char *part) {
    for (; *s && *s != '('; s++)
        if (cuda_call_is(s, part, 0)) return 1;
    return 0;
}
static constexpr int cuda_call_kind(const char *s) {
    return cuda_call_has(s, "Synchronize") || cuda_call_is(s, "cudaFree", 1) || cuda_call_is(s, "cudaFreeHost", 1) ||
                   cuda_call_is(s, "cudaMemcpy", 1) || cuda_call_is(s, "cudaMemcpy2D", 1)
               ? CUDA_CALL_SYNC
           : cuda_call_is(s, "cudaGraphLaunch", 1) ? CUDA_CALL_GRAPH
           : (cuda_call_is(s, "cublas", 0) || cuda_call_is(s, "cusolver", 0) || cuda_call_is(s, "cub::", 0)) &&
                   !cuda_call_has(s, "Create") && !cuda_call_has(s, "Destroy") && !cuda_call_has(s, "Set") &&
                   !cuda_call_has(s, "Get") && !cuda_call_has(s, "bufferSize")
               ? CUDA_CALL_LIB
               : 0;
}
/* Counts a call of that kind (nothing unless SKV_CUDA_COUNT=1), and a kernel
 * launch (SKV_LAUNCH). */
extern int cuda_count_on;
void cuda_count_call(int kind);
void cuda_count_launch(void);
/* The engine's tag of the ops queued from now (span_tag): a decode step is
 * step >= 0, the prefill -1. */
void cuda_count_tag(int layer, int step);
#define CUDA_COUNT(call) do { constexpr int k_ = cuda_call_kind(#call); if (k_ && cuda_count_on) cuda_count_call(k_); } while (0)

/* A call that cannot be part of a captured decode step (backend_cuda.cu's
 * step graphs), from its text: one the host waits in (CUDA_CALL_SYNC), an
 * allocation or free outside stream order or a stream-ordered one (graph
 * memory nodes are not used), a stream or event query, and the library
 * calls that return a result to the host (cuSOLVER's, the norms). */
static constexpr int cuda_call_breaks(const char *s) {
    return cuda_call_kind(s) == CUDA_CALL_SYNC || cuda_call_is(s, "cudaMalloc", 0) ||
           cuda_call_is(s, "cudaFreeAsync", 1) || cuda_call_is(s, "cudaHostAlloc", 1) ||
           cuda_call_is(s, "cudaStreamQuery", 1) || cuda_call_is(s, "cudaEventQuery", 1) ||
           cuda_call_is(s, "cudaEventElapsedTime", 1) || cuda_call_is(s, "cusolver", 0) || cuda_call_has(s, "nrm2");
}
/* While a decode step is being captured (cuda_graph_capturing), such a call
 * first ends the capture and launches what it recorded
 * (cuda_graph_break); the rest of the step runs eagerly. */
extern int cuda_graph_capturing;
void cuda_graph_break(void);
#define CUDA_GRAPH_GUARD(call) do { constexpr int b_ = cuda_call_breaks(#call); if (b_ && cuda_graph_capturing) cuda_graph_break(); } while (0)

/* Aborts with the file and line when a CUDA, cuBLAS or cuSOLVER call fails:
 * a device fault mid-run is a broken invariant (allocation failures are
 * reported by the ops that can return them). */
void cuda_fail(const char *what, const char *msg, const char *file, int line) __attribute__((noreturn));
#define CK(call) do { CUDA_COUNT(call); CUDA_GRAPH_GUARD(call); cudaError_t e_ = (call); if (e_ != cudaSuccess) cuda_fail(#call, cudaGetErrorString(e_), __FILE__, __LINE__); } while (0)
#define CKB(call) do { CUDA_COUNT(call); CUDA_GRAPH_GUARD(call); cublasStatus_t e_ = (call); if (e_ != CUBLAS_STATUS_SUCCESS) cuda_fail(#call, cublasGetStatusString(e_), __FILE__, __LINE__); } while (0)
#define CKS(call) do { CUDA_COUNT(call); CUDA_GRAPH_GUARD(call); cusolverStatus_t e_ = (call); if (e_ != CUSOLVER_STATUS_SUCCESS) cuda_fail(#call, "cuSOLVER error", __FILE__, __LINE__); } while (0)
/* After a launch: its configuration error, if any; with SKV_CUDA_SYNC=1 in
 * the environment also a device sync, so that a fault inside the kernel is
 * reported here, naming it (the last SKV_LAUNCH), not at a later op. */
void cuda_note_launch(const char *kernel);
void cuda_check_launch(const char *file, int line);
#define CKL() cuda_check_launch(__FILE__, __LINE__)

typedef struct {
    int ready;
    cudaStream_t compute, fetch;
    cudaEvent_t fetched;          /* recorded after each gather on the fetch stream */
    cudaEvent_t compute_done;     /* recorded on the compute stream when a gather is forked (cuda_fetch_begin) */
    int fetch_pending;            /* a gather was queued since the compute stream last waited */
    cublasHandle_t blas;
    void *blas_ws;                /* blas's workspace (cudaMalloc, kept for the process) */
    size_t blas_ws_bytes;
    cusolverDnHandle_t solver;
} cuda_ctx;

/* The context (made on first use; the caller has checked that a device
 * exists, which the table's `available` does). */
cuda_ctx *cuda_get(void);

/* The compute stream, after making it wait for a queued gather. */
cudaStream_t cuda_after_fetch(void);

/* A gather's fork and join: the fetch stream after what the compute stream
 * has queued (the selection it reads, the attention still reading the rows
 * it overwrites), returned; then the event the attention ops wait for
 * (cuda_after_fetch). */
cudaStream_t cuda_fetch_begin(void);
void cuda_fetch_end(void);

/* Stream-ordered scratch on the compute stream: freed with cuda_scratch_free
 * once the work that uses it is queued. */
void *cuda_scratch(size_t bytes);
void cuda_scratch_free(void *p);

/* A copy of host's bytes in pinned staging memory, for an op to queue its
 * upload on the compute stream without the host waiting (embed's ids). It
 * stays valid until the compute stream next drains (cu_sync, cu_upload,
 * cu_download), which the forward's sync at the end of a step does. */
const void *cuda_stage(const void *host, size_t bytes);
/* bytes of that pinned staging memory, uncopied: for a download queued on
 * the compute stream that the host then waits for (the copy itself does not
 * block, as one into pageable memory would) */
void *cuda_stage_space(size_t bytes);

/* The device copy of a host array (a rope_ctx's inverse frequencies):
 * uploaded once per host pointer and kept for the process. */
const float *cuda_const_upload(const float *host, size_t n);

/* ---- timeline: one span per op while enabled ---- */
typedef struct {
    cudaEvent_t a, b;
    int on;
} cuda_span_mark;
/* Records the start of op on stream (0 compute, 1 fetch); pass the result
 * to cuda_span_end after queueing the op. */
cuda_span_mark cuda_span_begin(int stream);
void cuda_span_end(cuda_span_mark m, int stream, const char *op);

/* A kernel launch, `SKV_LAUNCH(kernel, grid, block, smem, stream)(args...)`:
 * nvcc's <<<>>> under nvcc, and the CUDA simulator's launch when the file is
 * compiled by the host compiler for the tests (tests/cusim/, docs/TESTING.md).
 * SKV_DYN_SHARED declares a kernel's dynamic shared memory the same way. */
#ifdef __CUDACC__
#define SKV_LAUNCH(kernel, grid, block, smem, stream) \
    cuda_note_launch(#kernel), cuda_count_on ? cuda_count_launch() : (void)0, \
        kernel<<<(grid), (block), (smem), (stream)>>>
#define SKV_DYN_SHARED(type, name) extern __shared__ __align__(32) type name[]
#else
#define SKV_LAUNCH(kernel, grid, block, smem, stream) \
    cuda_note_launch(#kernel), cuda_count_on ? cuda_count_launch() : (void)0, \
        cusim::launcher(#kernel, kernel, (grid), (block), (smem), (stream))
#define SKV_DYN_SHARED(type, name) type *name = (type *)cusim::dyn_smem()
#endif

/* Threads per block and a grid that covers n items. */
static inline int cuda_blocks(size_t n, int threads) { return (int)((n + threads - 1) / threads); }

/* Block reduction of one float (max or sum) over the block's threads, the
 * same sums in the same order in every kernel that uses it (ops_sparse.cu's
 * scores and ops_sk_step.cu's, so both give the same scores). */
static __device__ __attribute__((unused)) float block_reduce(float v, int is_max) {
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? (u > v ? u : v) : v + u;
    }
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) / 32;
    float r = is_max ? -INFINITY : 0.0f;
    for (int w = 0; w < nw; w++) r = is_max ? (part[w] > r ? part[w] : r) : r + part[w];
    return r;
}

/* The softmax statistics of x (n) over the block, every thread calling it:
 * *mx = max x, *sum = Σ exp(x - max) (the score kernels' per-row stats). */
static __device__ __attribute__((unused)) void block_softmax_stats(const float *x, int n, float *mx, float *sum) {
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = x[j] > m ? x[j] : m;
    m = block_reduce(m, 1);
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += expf(x[j] - m);
    *mx = m;
    *sum = block_reduce(s, 0);
}

/* A vector access (8 or 16 bytes: LDG/STG/LDS/STS.64 and .128) as one
 * instruction. p must be aligned to the type's size, or a GPU faults
 * (misaligned address); the simulator checks that here, because its host
 * compiler splits the access and its load and store hooks never see the
 * width. Every such access in the kernels goes through these two. */
template <typename V>
__device__ __forceinline__ V vec_ld(const V *p) {
#ifndef __CUDACC__
    cusim::vec_aligned(p, sizeof(V), "a vector load");
#endif
    return *p;
}
template <typename V>
__device__ __forceinline__ void vec_st(V *p, const V &v) {
#ifndef __CUDACC__
    cusim::vec_aligned(p, sizeof(V), "a vector store");
#endif
    *p = v;
}

/* Eight bf16 values moved as one 16-byte access. */
struct __align__(16) bf16x8 {
    unsigned w[4];
};

/* The warp copies n bf16 values from src to dst as they are: 16 bytes a
 * lane access and four of them in flight (src may be mapped host memory,
 * each read crossing the bus: the offloaded values) when both ends are
 * 16-byte aligned and n a multiple of 8, else a value a lane access. */
static __device__ __attribute__((unused)) void copy_bf16_warp(const uint16_t *src, uint16_t *dst, size_t n, int lane) {
    if (n % 8 == 0 && (((uintptr_t)src | (uintptr_t)dst) & 15) == 0) {
        const bf16x8 *s8 = (const bf16x8 *)src;
        bf16x8 *d8 = (bf16x8 *)dst;
        size_t n8 = n / 8;
        for (size_t e = lane; e < n8; e += 128) {
            bf16x8 a[4];
            for (int u = 0; u < 4; u++)
                if (e + 32 * u < n8) a[u] = vec_ld(s8 + e + 32 * u);
            for (int u = 0; u < 4; u++)
                if (e + 32 * u < n8) vec_st(d8 + e + 32 * u, a[u]);
        }
    } else {
        for (size_t e = lane; e < n; e += 32) dst[e] = src[e];
    }
}

#endif
