/* cusim.h: the CUDA language and runtime for the simulator (tests/cusim/),
 * for .cu files compiled by the host C++ compiler (clang++ -x c++, with
 * -fsanitize-coverage=trace-loads,trace-stores so that every load and store
 * of a kernel reaches cusim.cpp's checks). Included by the stand-in headers
 * of include/ (cuda_runtime.h and the rest), never by product code.
 *
 * The language: __global__/__device__ functions are plain functions, a
 * launch (SKV_LAUNCH in kernels/cuda/cuda_util.h) runs every block's
 * threads as cooperative fibers on the calling thread, threadIdx and the
 * other built-ins read the running fiber's state, and __shared__ variables
 * are static storage in one section (cusim_shared) that the block's
 * threads share and the race checker watches. docs/TESTING.md says what is
 * modelled and what is not. */
#ifndef SKV_CUSIM_H
#define SKV_CUSIM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cusim_api.h"

/* ---- types ---- */

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchTimeout = 702,
    cudaErrorMisalignedAddress = 716,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureMerge = 902,
    cudaErrorStreamCaptureUnmatched = 903,
    cudaErrorStreamCaptureUnjoined = 904,
    cudaErrorStreamCaptureIsolation = 905,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorCapturedEvent = 907,
    cudaErrorGraphExecUpdateFailure = 910,
    cudaErrorNoDevice = 100,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
};

#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaEventDefault 0x0
#define cudaEventBlockingSync 0x1
#define cudaEventDisableTiming 0x2
#define cudaHostAllocDefault 0x0
#define cudaHostAllocPortable 0x1
#define cudaHostAllocMapped 0x2
#define cudaHostAllocWriteCombined 0x4

typedef struct cusim_stream *cudaStream_t;
typedef struct cusim_event *cudaEvent_t;
typedef struct cusim_graph *cudaGraph_t;
typedef struct cusim_graph_exec *cudaGraphExec_t;
typedef struct cusim_graph_node *cudaGraphNode_t; /* (opaque; the simulator names no node) */
/* cudaGraphExecUpdate's answer (CUDA 12's form) */
enum cudaGraphExecUpdateResult {
    cudaGraphExecUpdateSuccess = 0,
    cudaGraphExecUpdateError = 1,
    cudaGraphExecUpdateErrorTopologyChanged = 2,
    cudaGraphExecUpdateErrorNodeTypeChanged = 3,
    cudaGraphExecUpdateErrorFunctionChanged = 4,
    cudaGraphExecUpdateErrorParametersChanged = 5,
    cudaGraphExecUpdateErrorNotSupported = 6,
    cudaGraphExecUpdateErrorUnsupportedFunctionChange = 7,
    cudaGraphExecUpdateErrorAttributesChanged = 8,
};
struct cudaGraphExecUpdateResultInfo {
    cudaGraphExecUpdateResult result;
    cudaGraphNode_t errorNode;
    cudaGraphNode_t errorFromNode;
};
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

/* ---- the runtime (cusim.cpp) ---- */

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags);

cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s = 0);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s = 0);
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind k);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, cudaMemcpyKind k, cudaStream_t s = 0);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *st);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t x, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x);
cudaError_t cudaGraphDestroy(cudaGraph_t g);

/* CUDA's typed forms of the allocation calls */
template <typename T>
cudaError_t cudaMalloc(T **p, size_t bytes) {
    return cudaMalloc((void **)p, bytes);
}
template <typename T>
cudaError_t cudaMallocAsync(T **p, size_t bytes, cudaStream_t s) {
    return cudaMallocAsync((void **)p, bytes, s);
}
template <typename T>
cudaError_t cudaHostAlloc(T **p, size_t bytes, unsigned flags) {
    return cudaHostAlloc((void **)p, bytes, flags);
}
template <typename T>
cudaError_t cudaMallocHost(T **p, size_t bytes) {
    return cudaMallocHost((void **)p, bytes);
}

namespace cusim {
cudaError_t func_set_attribute(const void *fn, const char *name, cudaFuncAttribute a, int v);
}
template <typename F>
cudaError_t cudaFuncSetAttribute(F *fn, cudaFuncAttribute a, int v) {
    return cusim::func_set_attribute((const void *)fn, NULL, a, v);
}

/* ---- the language ---- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__ static
/* Static shared memory: storage in the section cusim_shared, each variable
 * after a guard of its own (a __shared__ index one past the end lands in a
 * guard, which the checker reports with the variable's name). */
#define CUSIM_CAT2(a, b) a##b
#define CUSIM_CAT(a, b) CUSIM_CAT2(a, b)
#define __shared__                                                                                          \
    static __attribute__((used, section("cusim_shared"), aligned(64))) char CUSIM_CAT(cusim_guard_,       \
                                                                                     __COUNTER__)[64];    \
    static __attribute__((section("cusim_shared"), aligned(64)))

#define warpSize 32

namespace cusim {

/* One simulated thread (a fiber). */
struct thread_state {
    uint3 tid;
    int linear, warp, lane;
};
extern thread_local thread_state *g_cur;
extern thread_local uint3 g_block_idx;
extern thread_local dim3 g_block_dim, g_grid_dim;
/* The built-ins, read by calls into the runtime (whose loads are not a
 * kernel's). */
uint3 thread_idx(void);
uint3 block_idx(void);
dim3 block_dim(void);
dim3 grid_dim(void);
int lane_id(void);

/* The block's dynamic shared memory (SKV_DYN_SHARED). */
void *dyn_smem(void);

/* Block barrier, warp barrier and the warp's collective exchange: each
 * lane gives 8 bytes, the op's kind and argument; it gets what CUDA's
 * operation returns once every lane of the mask has arrived. */
void syncthreads(void);
int syncthreads_count(int pred);
void syncwarp(unsigned mask);
enum warp_kind { W_SHFL = 1, W_SHFL_UP, W_SHFL_DOWN, W_SHFL_XOR, W_BALLOT, W_ANY, W_ALL, W_XCHG };
uint64_t warp_op(int kind, unsigned mask, uint64_t value, int arg, int width, const char *what);
void threadfence(void);
/* A warp's shared scratch for the WMMA stand-ins: the first lane publishes
 * a fragment it loaded or computed, the others fetch it (one computation a
 * warp instead of one a lane). Right after a warp meeting, lane 0 runs
 * first. */
void warp_publish(const void *p, size_t n);
void warp_fetch(void *p, size_t n);
/* The warp's all-gather for a warp-wide instruction's stand-in (mma.sync,
 * include/cusim_mma.h): each lane gives n <= 64 bytes and gets the 32
 * lanes' (lane i's at i*n) once every lane has arrived; a meeting of the
 * full warp that, as mma.sync, orders no shared-memory access. */
void warp_exchange(const void *mine, size_t n, void *all, const char *what);
/* A fault unless p is an n-byte, n-aligned range of the block's shared
 * memory (what names the instruction). */
void shared_check(const void *p, size_t n, const char *what);
/* A fault (cudaErrorMisalignedAddress) unless p is n-byte aligned: the
 * kernels' 8- and 16-byte vector loads and stores call it (vec_ld and
 * vec_st, kernels/cuda/cuda_util.h). A GPU faults on a misaligned one; the
 * host compiler splits them, so the access hooks never see their width. */
void vec_aligned(const void *p, size_t n, const char *what);
/* cp.async (include/cuda_pipeline.h): a copy of n (4, 8 or 16) bytes into
 * shared memory, its last zfill bytes zeros, checked when issued and landing
 * when the issuing thread waits for its commit group. */
void pipeline_copy(void *dst, const void *src, size_t n, size_t zfill);
void pipeline_commit(void);
void pipeline_wait_prior(size_t k);

/* Atomics: the fibers of a launch run on one host thread, so a
 * read-modify-write is atomic; these also tell the race checker the access
 * is an atomic one. */
void atomic_note(const void *p, size_t n);

/* ---- launches ---- */

typedef void (*entry_fn)(void *closure);
void launch(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t st, entry_fn entry,
            std::shared_ptr<void> closure, size_t closure_size);

template <typename... P>
struct launch_closure {
    void (*fn)(P...);
    std::tuple<typename std::decay<P>::type...> args;
};

template <typename... P>
__attribute__((noinline, no_sanitize("coverage"))) void launch_entry(void *c) {
    launch_closure<P...> *k = (launch_closure<P...> *)c;
    void (*volatile fn)(P...) = k->fn; /* an indirect call: the kernel is not inlined here */
    std::apply(fn, k->args);
}

template <typename... P>
struct launcher_t {
    const char *name;
    void (*fn)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t st;
    __attribute__((no_sanitize("coverage"))) void operator()(P... args) const {
        std::shared_ptr<launch_closure<P...>> c(new launch_closure<P...>{fn, std::make_tuple(args...)});
        launch(name, (const void *)fn, grid, block, smem, st, &launch_entry<P...>, c, sizeof(launch_closure<P...>));
    }
};

template <typename... P>
launcher_t<P...> launcher(const char *name, void (*fn)(P...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t st) {
    return launcher_t<P...>{name, fn, grid, block, smem, st};
}

} /* namespace cusim */

#define threadIdx (cusim::thread_idx())
#define blockIdx (cusim::block_idx())
#define blockDim (cusim::block_dim())
#define gridDim (cusim::grid_dim())

static inline void __syncthreads(void) { cusim::syncthreads(); }
static inline int __syncthreads_count(int p) { return cusim::syncthreads_count(p); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { cusim::syncwarp(mask); }
static inline void __threadfence(void) { cusim::threadfence(); }
static inline void __threadfence_block(void) { cusim::threadfence(); }

template <typename T>
static inline uint64_t cusim_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a shuffle of up to 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <typename T>
static inline T cusim_from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return cusim_from_bits<T>(cusim::warp_op(cusim::W_SHFL, mask, cusim_bits(v), src, width, "__shfl_sync"));
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return cusim_from_bits<T>(cusim::warp_op(cusim::W_SHFL_UP, mask, cusim_bits(v), (int)d, width, "__shfl_up_sync"));
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return cusim_from_bits<T>(
        cusim::warp_op(cusim::W_SHFL_DOWN, mask, cusim_bits(v), (int)d, width, "__shfl_down_sync"));
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lm, int width = 32) {
    return cusim_from_bits<T>(cusim::warp_op(cusim::W_SHFL_XOR, mask, cusim_bits(v), lm, width, "__shfl_xor_sync"));
}
static inline unsigned __ballot_sync(unsigned mask, int p) {
    return (unsigned)cusim::warp_op(cusim::W_BALLOT, mask, p != 0, 0, 32, "__ballot_sync");
}
static inline int __any_sync(unsigned mask, int p) {
    return (int)cusim::warp_op(cusim::W_ANY, mask, p != 0, 0, 32, "__any_sync");
}
static inline int __all_sync(unsigned mask, int p) {
    return (int)cusim::warp_op(cusim::W_ALL, mask, p != 0, 0, 32, "__all_sync");
}
static inline unsigned __activemask(void) {
    return (unsigned)cusim::warp_op(cusim::W_BALLOT, 0xffffffffu, 1, 0, 32, "__activemask");
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}

/* Atomics, CUDA's signatures (the old value returned). */
template <typename T>
__attribute__((noinline, no_sanitize("coverage"))) inline T cusim_atomic_rmw(T *p, T v, int op) {
    cusim::atomic_note(p, sizeof(T));
    T old = *p;
    switch (op) {
    case 0: *p = old + v; break;
    case 1: *p = v < old ? v : old; break;
    case 2: *p = v > old ? v : old; break;
    case 3: *p = v; break;
    case 4: *p = old - v; break;
    }
    return old;
}
template <typename T>
static inline T atomicAdd(T *p, T v) { return cusim_atomic_rmw(p, v, 0); }
template <typename T>
static inline T atomicSub(T *p, T v) { return cusim_atomic_rmw(p, v, 4); }
template <typename T>
static inline T atomicMin(T *p, T v) { return cusim_atomic_rmw(p, v, 1); }
template <typename T>
static inline T atomicMax(T *p, T v) { return cusim_atomic_rmw(p, v, 2); }
template <typename T>
static inline T atomicExch(T *p, T v) { return cusim_atomic_rmw(p, v, 3); }
template <typename T>
__attribute__((noinline, no_sanitize("coverage"))) inline T atomicCAS(T *p, T cmp, T v) {
    cusim::atomic_note(p, sizeof(T));
    T old = *p;
    if (old == cmp) *p = v;
    return old;
}
__attribute__((noinline, no_sanitize("coverage"))) inline unsigned atomicOr(unsigned *p, unsigned v) {
    cusim::atomic_note(p, sizeof *p);
    unsigned o = *p;
    *p = o | v;
    return o;
}
__attribute__((noinline, no_sanitize("coverage"))) inline unsigned atomicAnd(unsigned *p, unsigned v) {
    cusim::atomic_note(p, sizeof *p);
    unsigned o = *p;
    *p = o & v;
    return o;
}

/* Device math: the fast intrinsics as their accurate forms (the hardware's
 * approximations are within the tests' tolerances of these). */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __powf(x, y) powf(x, y)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __saturatef(float x) { return x < 0 ? 0 : x > 1 ? 1 : x; }
template <typename T>
static inline T __ldg(const T *p) { return *p; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline size_t min(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t max(size_t a, size_t b) { return a > b ? a : b; }

#endif
