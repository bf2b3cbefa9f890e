/* test_cusim_faults.cu: proof that the CUDA simulator (tests/cusim) catches
 * what a GPU would: faults planted in copies of skv's kernel shapes
 * and call sites, each run in a child process and required to fail with a
 * message that names it; beside each, the same code without the fault,
 * which must run clean and right. Also the counters, a graph's replay, and
 * stream capture's rules (graph_rules): a fork and join across streams by
 * events, the calls that invalidate a capture with CUDA's error codes, and
 * cudaGraphExecUpdate's topology and parameter rules.
 * Built by the simulator's rules only (compiled by clang++ with the
 * coverage hooks, like kernels/cuda/). */
#include "cuda_util.h"


#include <string>

#include "sim/sim_child.h"

extern "C" {
#include "testhelp.h"
}

/* ---- kernels: the right form and the planted fault ---- */

__global__ void k_scale(float *y, int n, float v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= v;
}

/* A shared-memory sum over the block (block_reduce's shape), with or
 * without the barrier between the stores and the reads. */
__global__ void k_sum(const float *x, int n, int sync, float *out) {
    __shared__ float part[256];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[i];
    part[threadIdx.x] = v;
    if (sync) __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
        if (sync) __syncthreads();
    }
    if (threadIdx.x == 0) *out = part[0];
}

/* Each thread writes its neighbour's slot of a shared row: the last thread
 * one past the end unless the row has a spare slot. */
__global__ void k_shift(float *out, int spare) {
    __shared__ float row[64];
    int i = threadIdx.x;
    int at = spare ? i : i + 1;
    if (at < 64 || !spare) row[at] = (float)i;
    __syncthreads();
    out[i] = row[i < 63 ? i : 63];
}

/* Dynamic shared memory, staged and summed. */
__global__ void k_dyn(const float *x, int n, float *out) {
    SKV_DYN_SHARED(float, buf);
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < n; i++) s += buf[i];
        *out = s;
    }
}

/* One value per block of a (1, y) grid. */
__global__ void k_grid_y(float *out) {
    if (threadIdx.x == 0) out[blockIdx.y] = (float)blockIdx.y;
}

/* A warp's butterfly sum with a given mask. */
__global__ void k_warp_sum(const float *x, unsigned mask, float *out) {
    float v = x[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
    if (threadIdx.x == 0) *out = v;
}

/* A stream's producer and another's consumer. */
__global__ void k_fill(float *y, int n, float v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = v + (float)i;
}
__global__ void k_copy(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}

/* Four floats a thread as one 16-byte load from x + off (vec_ld, as the
 * kernels' vector loads are; off a multiple of 4 keeps it aligned), summed
 * into out. */
struct alignas(16) f4 { float x, y, z, w; };
__global__ void k_vec4(const float *x, int off, float *out) {
    f4 v = vec_ld(reinterpret_cast<const f4 *>(x + off) + threadIdx.x);
    out[threadIdx.x] = v.x + v.y + v.z + v.w;
}

/* Scalar accesses at a byte offset: a float read at b + off + 4i, a half
 * (2 bytes) written at o + off2 + 2i. A GPU faults on either off its size's
 * alignment. */
__global__ void k_scalar_at(const unsigned char *b, int off, unsigned char *o, int off2) {
    float v = *reinterpret_cast<const float *>(b + off + 4 * threadIdx.x);
    *reinterpret_cast<unsigned short *>(o + off2 + 2 * threadIdx.x) = (unsigned short)v;
}

/* An 8-byte scalar (a double) read at byte off + 8t of b, and an 8-byte
 * integer written at byte off2 + 8t of o: a GPU wants both 8-byte aligned. */
__global__ void k_wide_at(const unsigned char *b, int off, unsigned char *o, int off2) {
    double v = *reinterpret_cast<const double *>(b + off + 8 * threadIdx.x);
    *reinterpret_cast<unsigned long long *>(o + off2 + 8 * threadIdx.x) = (unsigned long long)v;
}

/* A barrier that half of a warp skips (it returns instead). */
__global__ void k_half_barrier(float *out) {
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1.0f;
}

/* ---- helpers ---- */

static float *dev_alloc(size_t n) {
    float *p = NULL;
    if (cudaMalloc(&p, sizeof(float) * n) != cudaSuccess) return NULL;
    return p;
}
static void up(float *d, const float *h, size_t n) { cudaMemcpy(d, h, sizeof(float) * n, cudaMemcpyHostToDevice); }
static void down(float *h, const float *d, size_t n) { cudaMemcpy(h, d, sizeof(float) * n, cudaMemcpyDeviceToHost); }

/* A fault case: the child returns 0 when the simulator reported no fault. */
static void expect_fault(const char *what, int (*fn)(void), const char *needle1, const char *needle2) {
    int st = 0;
    std::string err = in_child(fn, &st);
    int named = err.find(needle1) != std::string::npos && (!needle2 || err.find(needle2) != std::string::npos);
    char msg[900];
    std::string first = err.substr(0, err.find('\n'));
    snprintf(msg, sizeof msg, "%s: fails (status %d), naming it: \"%.600s\"", what, st, first.c_str());
    test_cond(msg, st != 0 && named);
}

static float ramp_sum(int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += (float)(i % 7);
    return s;
}
static float *ramp_dev(int n) {
    float *h = (float *)malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) h[i] = (float)(i % 7);
    float *d = dev_alloc((size_t)n);
    up(d, h, (size_t)n);
    free(h);
    return d;
}
static int fails(void) { return cudaDeviceSynchronize() != cudaSuccess || cudaGetLastError() != cudaSuccess; }

/* ---- the eight faults (each a child's body: non-zero when caught) ---- */

static int f_nosync(void) {
    float *x = ramp_dev(1000), *o = dev_alloc(1), h = 0;
    SKV_LAUNCH(k_sum, 1, 256, 0, 0)(x, 1000, 0, o);
    down(&h, o, 1);
    return fails();
}
static int f_oob(void) {
    float *o = dev_alloc(64);
    SKV_LAUNCH(k_shift, 1, 64, 0, 0)(o, 0);
    return fails();
}
static int f_smem(void) {
    float *x = ramp_dev(16384), *o = dev_alloc(1);
    SKV_LAUNCH(k_dyn, 1, 256, 65536, 0)(x, 16384, o);
    return cudaGetLastError() != cudaSuccess || fails();
}
static int f_grid(void) {
    float *o = dev_alloc(70000);
    SKV_LAUNCH(k_grid_y, dim3(1, 70000), 32, 0, 0)(o);
    return cudaGetLastError() != cudaSuccess || fails();
}
static int f_host_memcpy(void) {
    float *d = ramp_dev(64), *h = (float *)malloc(sizeof(float) * 64);
    memcpy(h, d, sizeof(float) * 64); /* a host copy from a device pointer: faults */
    int r = h[3] == 3.0f ? 0 : 4;
    free(h);
    return r;
}
static int f_oom(void) {
    cusim_set_device_bytes((size_t)64 << 20);
    float *a = dev_alloc((size_t)8 << 20);  /* 32 MiB: fits */
    float *b = dev_alloc((size_t)10 << 20); /* 40 MiB more: past the device's 64 MiB */
    return a && !b ? 3 : 0;
}
static int f_mask(void) {
    float *x = ramp_dev(32), *o = dev_alloc(1);
    SKV_LAUNCH(k_warp_sum, 1, 32, 0, 0)(x, 0x7fffffffu, o);
    return fails();
}
static int f_misaligned(void) {
    float *x = ramp_dev(68), *o = dev_alloc(16);
    SKV_LAUNCH(k_vec4, 1, 16, 0, 0)(x, 1, o); /* 16-byte loads at 4 bytes past alignment */
    return fails();
}
static int f_scalar_load(void) {
    unsigned char *b = (unsigned char *)dev_alloc(32), *o = (unsigned char *)dev_alloc(32);
    SKV_LAUNCH(k_scalar_at, 1, 16, 0, 0)(b, 2, o, 0); /* 4-byte loads at 2 bytes past alignment */
    return fails();
}
static int f_scalar_store(void) {
    unsigned char *b = (unsigned char *)dev_alloc(32), *o = (unsigned char *)dev_alloc(32);
    SKV_LAUNCH(k_scalar_at, 1, 16, 0, 0)(b, 0, o, 1); /* 2-byte stores at odd addresses */
    return fails();
}
static int f_wide_load(void) {
    unsigned char *b = (unsigned char *)dev_alloc(64), *o = (unsigned char *)dev_alloc(64);
    SKV_LAUNCH(k_wide_at, 1, 16, 0, 0)(b, 4, o, 0); /* doubles at 4 bytes past 8-byte alignment */
    return fails();
}
static int f_wide_store(void) {
    unsigned char *b = (unsigned char *)dev_alloc(64), *o = (unsigned char *)dev_alloc(64);
    SKV_LAUNCH(k_wide_at, 1, 16, 0, 0)(b, 0, o, 4); /* 8-byte stores 4 bytes past it */
    return fails();
}
/* SKV_CUDA_SYNC=1: the backend's launch check syncs and names the kernel. */
static int f_sync_each(void) {
    setenv("SKV_CUDA_SYNC", "1", 1);
    float *o = dev_alloc(64);
    SKV_LAUNCH(k_shift, 1, 64, 0, 0)(o, 0);
    CKL(); /* aborts, naming k_shift */
    return 0;
}
static int f_deadlock(void) {
    float *o = dev_alloc(64);
    SKV_LAUNCH(k_half_barrier, 1, 64, 0, 0)(o);
    return fails();
}

/* Stream-ordered frees (cudaFreeAsync): a kernel queued on the free's
 * stream before it runs first, whenever the stream runs (no fault); one
 * queued after it, or one queued before it on another stream without an
 * event between them, runs on freed memory (a fault naming the kernel). */
static int free_async_case(int which) {
    cudaStream_t s, o;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&o, cudaStreamNonBlocking);
    float *a = dev_alloc(1024);
    cudaStreamSynchronize(s);
    if (which == 0) { /* the right form: queued before the free, on its stream */
        SKV_LAUNCH(k_fill, 4, 256, 0, s)(a, 1024, 1.0f);
        cudaFreeAsync(a, s);
    } else if (which == 1) { /* queued after the free */
        SKV_LAUNCH(k_copy, 4, 256, 0, s)(a, a, 1024); /* keeps the stream busy: the free waits its turn */
        cudaFreeAsync(a, s);
        SKV_LAUNCH(k_fill, 4, 256, 0, s)(a, 1024, 2.0f);
    } else { /* queued before the free, on another stream, not joined */
        SKV_LAUNCH(k_fill, 4, 256, 0, o)(a, 1024, 3.0f);
        cudaFreeAsync(a, s);
    }
    cudaStreamSynchronize(s);
    cudaStreamSynchronize(o);
    return fails();
}
static int f_free_after(void) { return free_async_case(1); }
static int f_free_unjoined(void) { return free_async_case(2); }
static int f_free_twice(void) {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *a = dev_alloc(64);
    SKV_LAUNCH(k_fill, 1, 64, 0, s)(a, 64, 1.0f);
    cudaFreeAsync(a, s);
    cudaFreeAsync(a, s);
    return fails();
}

/* The fetch/compute join: a producer on the fetch stream, the consumer on
 * the compute stream, with or without the event between them. Returns the
 * number of wrong rows the consumer copied. */
static int stream_join(int with_wait) {
    int n = 4096;
    cudaStream_t compute, fetch;
    cudaEvent_t fetched;
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&fetch, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&fetched, cudaEventDisableTiming);
    float *a = dev_alloc((size_t)n), *b = dev_alloc((size_t)n);
    cudaMemsetAsync(a, 0, sizeof(float) * n, compute);
    cudaStreamSynchronize(compute);
    SKV_LAUNCH(k_fill, cuda_blocks((size_t)n, 256), 256, 0, fetch)(a, n, 1.0f);
    if (with_wait) {
        cudaEventRecord(fetched, fetch);
        cudaStreamWaitEvent(compute, fetched, 0);
    }
    SKV_LAUNCH(k_copy, cuda_blocks((size_t)n, 256), 256, 0, compute)(a, b, n);
    float *h = (float *)malloc(sizeof(float) * n);
    cudaMemcpyAsync(h, b, sizeof(float) * n, cudaMemcpyDeviceToHost, compute);
    cudaStreamSynchronize(compute);
    int wrong = 0;
    for (int i = 0; i < n; i++) wrong += h[i] != 1.0f + (float)i;
    free(h);
    cudaStreamSynchronize(fetch);
    cudaFree(a);
    cudaFree(b);
    cudaEventDestroy(fetched);
    cudaStreamDestroy(compute);
    cudaStreamDestroy(fetch);
    return wrong;
}

/* ---- stream capture and graph update (CUDA's rules as cusim models them) ---- */

/* Captures on s: k_fill(a, v) then, unless extra < 0, extra more k_scale
 * launches; the graph. */
static cudaGraph_t capture_fill(cudaStream_t s, float *a, int n, float v, int extra) {
    cudaGraph_t g = NULL;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    SKV_LAUNCH(k_fill, cuda_blocks((size_t)n, 256), 256, 0, s)(a, n, v);
    for (int i = 0; i < extra; i++) SKV_LAUNCH(k_scale, cuda_blocks((size_t)n, 256), 256, 0, s)(a, n, 2.0f);
    cudaStreamEndCapture(s, &g);
    return g;
}

/* Begins a capture on s, runs what(s) (an illegal call, whose error is
 * returned in *err), queues one more kernel (its error in *after) and ends
 * the capture: its error, and the graph in *g. */
static cudaError_t capture_with(cudaStream_t s, cudaStreamCaptureMode mode, cudaError_t (*what)(cudaStream_t),
                                cudaError_t *err, cudaError_t *after, cudaGraph_t *g, float *a) {
    cudaGetLastError();
    cudaStreamBeginCapture(s, mode);
    *err = what(s);
    cudaGetLastError();
    SKV_LAUNCH(k_fill, 1, 64, 0, s)(a, 64, 1.0f);
    *after = cudaGetLastError();
    cudaError_t e = cudaStreamEndCapture(s, g);
    cudaGetLastError();
    return e;
}
static cudaError_t ill_sync(cudaStream_t s) { return cudaStreamSynchronize(s); }
static cudaError_t ill_query(cudaStream_t s) { return cudaStreamQuery(s); }
static cudaError_t ill_device_sync(cudaStream_t s) { (void)s; return cudaDeviceSynchronize(); }
static float g_pageable[64];
static float *g_dev64;
static cudaError_t ill_pageable(cudaStream_t s) {
    return cudaMemcpyAsync(g_dev64, g_pageable, sizeof g_pageable, cudaMemcpyHostToDevice, s);
}
static void *g_malloced;
static cudaError_t ill_malloc(cudaStream_t s) {
    (void)s;
    return cudaMalloc(&g_malloced, 256);
}
static cudaError_t ill_malloc_async(cudaStream_t s) {
    void *p = NULL;
    return cudaMallocAsync(&p, 256, s);
}
static cudaEvent_t g_outside;
static cudaError_t ill_wait_outside(cudaStream_t s) { return cudaStreamWaitEvent(s, g_outside, 0); }
static cudaError_t ill_event_query(cudaStream_t s) {
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaEventRecord(e, s);
    cudaError_t r = cudaEventQuery(e);
    cudaEventDestroy(e);
    return r;
}

static void graph_rules(void) {
    int n = 1024;
    cusim_set_order(CUSIM_ORDER_ADVERSARIAL, 1);
    cudaStream_t s1, s2;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaEvent_t fork, join, early;
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&early, cudaEventDisableTiming);
    float *a = dev_alloc((size_t)n), *b = dev_alloc((size_t)n), *h = (float *)malloc(sizeof(float) * n);
    g_dev64 = dev_alloc(64);
    char msg[400];

    /* a fork and join: s2 joins the capture by waiting on an event recorded
     * in it, fills a; s1 waits on s2's last event and copies a to b. Run in
     * the adversarial order (a forked branch as late as the joins allow):
     * b is right. Without the join, the capture does not end. */
    for (int joined = 1; joined >= 0; joined--) {
        cudaGraph_t g = NULL;
        cudaMemset(b, 0, sizeof(float) * n);
        cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal);
        cudaEventRecord(fork, s1);
        cudaStreamWaitEvent(s2, fork, 0);
        cudaStreamCaptureStatus st2 = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(s2, &st2);
        SKV_LAUNCH(k_fill, cuda_blocks((size_t)n, 256), 256, 0, s2)(a, n, 3.0f);
        if (joined) {
            cudaEventRecord(join, s2);
            cudaStreamWaitEvent(s1, join, 0);
        }
        SKV_LAUNCH(k_copy, cuda_blocks((size_t)n, 256), 256, 0, s1)(a, b, n);
        cudaError_t e = cudaStreamEndCapture(s1, &g);
        cudaGetLastError();
        cudaStreamCaptureStatus st1 = cudaStreamCaptureStatusActive;
        cudaStreamIsCapturing(s2, &st1);
        if (joined) {
            cudaGraphExec_t x = NULL;
            cudaGraphInstantiate(&x, g, 0);
            cudaGraphDestroy(g); /* the executable graph keeps its own nodes */
            cusim_counters_reset();
            cudaGraphLaunch(x, s1);
            cudaStreamSynchronize(s1);
            down(h, b, (size_t)n);
            cusim_counters c;
            cusim_counters_get(&c);
            snprintf(msg, sizeof msg, "capture: a stream waiting on a captured event joins it (status %d), its work "
                     "joins back by an event; the graph (2 kernels) runs right in the adversarial order (b[5] = %g; "
                     "end %s)", (int)st2, h[5], cudaGetErrorName(e));
            test_cond(msg, e == cudaSuccess && st2 == cudaStreamCaptureStatusActive && h[5] == 8.0f &&
                           h[n - 1] == 3.0f + (float)(n - 1) && c.graph_kernels == 2 && c.launches == 0);
            cudaGraphExecDestroy(x);
        } else {
            snprintf(msg, sizeof msg, "capture: a forked stream's work not joined back: cudaStreamEndCapture fails "
                     "with cudaErrorStreamCaptureUnjoined (%s), no graph, both streams out of capture (%d)",
                     cudaGetErrorName(e), (int)st1);
            test_cond(msg, e == cudaErrorStreamCaptureUnjoined && g == NULL && st1 == cudaStreamCaptureStatusNone);
        }
    }

    /* a join that comes too early (the event recorded before the fill): the
     * graph ends (the fork joins later), but the copy has no edge to the
     * fill and the adversarial order runs it first: b is stale */
    {
        cudaGraph_t g = NULL;
        cudaMemset(a, 0, sizeof(float) * n);
        cudaMemset(b, 0, sizeof(float) * n);
        cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal);
        cudaEventRecord(fork, s1);
        cudaStreamWaitEvent(s2, fork, 0);
        cudaEventRecord(early, s2);
        SKV_LAUNCH(k_fill, cuda_blocks((size_t)n, 256), 256, 0, s2)(a, n, 3.0f);
        cudaEventRecord(join, s2);
        cudaStreamWaitEvent(s1, early, 0);
        SKV_LAUNCH(k_copy, cuda_blocks((size_t)n, 256), 256, 0, s1)(a, b, n);
        cudaStreamWaitEvent(s1, join, 0);
        cudaError_t e = cudaStreamEndCapture(s1, &g);
        cudaGraphExec_t x = NULL;
        cudaGraphInstantiate(&x, g, 0);
        cudaGraphLaunch(x, s1);
        cudaStreamSynchronize(s1);
        down(h, b, (size_t)n);
        snprintf(msg, sizeof msg, "capture: a copy whose join misses the fill it reads runs before it in the "
                 "adversarial order (b[5] = %g, not 8: the race shows; end %s)", h[5], cudaGetErrorName(e));
        test_cond(msg, e == cudaSuccess && h[5] == 0.0f);
        cudaGraphExecDestroy(x);
        cudaGraphDestroy(g);
    }

    /* calls a capture cannot take: each fails with CUDA's error, the capture
     * is invalidated (later work on it: cudaErrorStreamCaptureInvalidated),
     * and ending it gives cudaErrorStreamCaptureInvalidated and no graph */
    {
        float *dummy = dev_alloc(64);
        SKV_LAUNCH(k_fill, 1, 64, 0, s2)(dummy, 64, 1.0f);
        cudaEventRecord(g_outside, s2); /* recorded outside any capture */
        static const struct {
            const char *what;
            cudaError_t (*fn)(cudaStream_t);
            cudaStreamCaptureMode mode;
            cudaError_t want;
        } ill[] = {
            {"cudaStreamSynchronize on the capturing stream", ill_sync, cudaStreamCaptureModeRelaxed,
             cudaErrorStreamCaptureUnsupported},
            {"cudaStreamQuery on the capturing stream", ill_query, cudaStreamCaptureModeRelaxed,
             cudaErrorStreamCaptureUnsupported},
            {"cudaDeviceSynchronize", ill_device_sync, cudaStreamCaptureModeRelaxed, cudaErrorStreamCaptureUnsupported},
            {"a copy from pageable memory", ill_pageable, cudaStreamCaptureModeRelaxed,
             cudaErrorStreamCaptureUnsupported},
            {"cudaMalloc in a global-mode capture", ill_malloc, cudaStreamCaptureModeGlobal,
             cudaErrorStreamCaptureUnsupported},
            {"cudaMallocAsync on the capturing stream (graph memory nodes: not modelled)", ill_malloc_async,
             cudaStreamCaptureModeRelaxed, cudaErrorStreamCaptureUnsupported},
            {"a wait on an event recorded outside the capture", ill_wait_outside, cudaStreamCaptureModeRelaxed,
             cudaErrorStreamCaptureIsolation},
            {"cudaEventQuery on an event recorded in the capture", ill_event_query, cudaStreamCaptureModeRelaxed,
             cudaErrorCapturedEvent},
        };
        for (size_t i = 0; i < sizeof ill / sizeof ill[0]; i++) {
            cudaError_t err, after;
            cudaGraph_t g = (cudaGraph_t)&err;
            cudaError_t e = capture_with(s1, ill[i].mode, ill[i].fn, &err, &after, &g, dummy);
            cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
            cudaStreamIsCapturing(s1, &st);
            snprintf(msg, sizeof msg, "capture: %s fails with %s (want %s), the next launch %s, the end %s, no graph, "
                     "the stream out of capture", ill[i].what, cudaGetErrorName(err), cudaGetErrorName(ill[i].want),
                     cudaGetErrorName(after), cudaGetErrorName(e));
            test_cond(msg, err == ill[i].want && after == cudaErrorStreamCaptureInvalidated &&
                           e == cudaErrorStreamCaptureInvalidated && g == NULL && st == cudaStreamCaptureStatusNone);
        }
        /* relaxed mode: cudaMalloc is allowed (and not captured); its
         * cudaFree is not (a device-wide sync) */
        cudaError_t err, after;
        cudaGraph_t g = NULL;
        cudaError_t e = capture_with(s1, cudaStreamCaptureModeRelaxed, ill_malloc, &err, &after, &g, dummy);
        cudaStreamBeginCapture(s1, cudaStreamCaptureModeRelaxed);
        cudaError_t ef = cudaFree(g_malloced);
        cudaGraph_t g2 = NULL;
        cudaStreamEndCapture(s1, &g2);
        cudaGetLastError();
        cudaError_t ef2 = cudaFree(g_malloced);
        snprintf(msg, sizeof msg, "capture: cudaMalloc in a relaxed-mode capture is allowed (%s; end %s, a graph of "
                 "the kernel after it); cudaFree in one is not (%s), after it is (%s)", cudaGetErrorName(err),
                 cudaGetErrorName(e), cudaGetErrorName(ef), cudaGetErrorName(ef2));
        cudaGraphExec_t gx = NULL;
        cusim_counters_reset();
        if (g && cudaGraphInstantiate(&gx, g, 0) == cudaSuccess) cudaGraphLaunch(gx, s1);
        cudaStreamSynchronize(s1);
        cusim_counters c;
        cusim_counters_get(&c);
        test_cond(msg, err == cudaSuccess && e == cudaSuccess && g != NULL && c.graph_kernels == 1 &&
                       ef == cudaErrorStreamCaptureUnsupported && g2 == NULL && ef2 == cudaSuccess);
        if (gx) cudaGraphExecDestroy(gx);
        cudaGraphDestroy(g);
        /* the streams still work eagerly */
        cudaGraph_t ok = capture_fill(s1, a, n, 1.0f, 0);
        SKV_LAUNCH(k_fill, cuda_blocks((size_t)n, 256), 256, 0, s1)(b, n, 4.0f);
        cudaStreamSynchronize(s1);
        down(h, b, (size_t)n);
        snprintf(msg, sizeof msg, "capture: after the invalidated captures the stream captures and runs again "
                 "(b[2] = %g)", h[2]);
        test_cond(msg, ok != NULL && h[2] == 6.0f);
        cudaGraphDestroy(ok);
        cudaFree(dummy);
    }

    /* cudaGraphExecUpdate: a graph of the same topology updates the
     * executable one in place (a kernel's arguments and its function may
     * change); another node count (topology), another node type or a copy
     * whose end changes from device to host memory is refused with
     * cudaErrorGraphExecUpdateFailure, its reason in the result, and the
     * executable graph runs as before */
    {
        cudaGraph_t g0 = capture_fill(s1, a, n, 1.0f, 1);
        cudaGraphExec_t x = NULL;
        cudaGraphInstantiate(&x, g0, 0);
        cudaGraphExecUpdateResultInfo info;
        /* the same topology, another value */
        cudaGraph_t g1 = capture_fill(s1, a, n, 5.0f, 1);
        cudaError_t e1 = cudaGraphExecUpdate(x, g1, &info);
        cudaGraphExecUpdateResult r1 = info.result;
        cudaGraphLaunch(x, s1);
        cudaStreamSynchronize(s1);
        down(h, a, (size_t)n);
        float v1 = h[1];
        /* another kernel function at a node: k_copy(b -> a) for the fill */
        cudaGraph_t g2 = NULL;
        cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal);
        SKV_LAUNCH(k_copy, cuda_blocks((size_t)n, 256), 256, 0, s1)(b, a, n);
        SKV_LAUNCH(k_scale, cuda_blocks((size_t)n, 256), 256, 0, s1)(a, n, 2.0f);
        cudaStreamEndCapture(s1, &g2);
        cudaError_t e2 = cudaGraphExecUpdate(x, g2, &info);
        cudaGraphExecUpdateResult r2 = info.result;
        /* one more node: the topology changed */
        cudaGraph_t g3 = capture_fill(s1, a, n, 7.0f, 2);
        cudaError_t e3 = cudaGraphExecUpdate(x, g3, &info);
        cudaGraphExecUpdateResult r3 = info.result;
        cudaGetLastError();
        /* a memset where a kernel was */
        cudaGraph_t g4 = NULL;
        cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal);
        cudaMemsetAsync(a, 0, sizeof(float) * n, s1);
        SKV_LAUNCH(k_scale, cuda_blocks((size_t)n, 256), 256, 0, s1)(a, n, 2.0f);
        cudaStreamEndCapture(s1, &g4);
        cudaError_t e4 = cudaGraphExecUpdate(x, g4, &info);
        cudaGraphExecUpdateResult r4 = info.result;
        cudaGetLastError();
        /* the same edges, other dependencies: the scale forked onto s2 */
        cudaGraph_t g5 = NULL;
        cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal);
        cudaEventRecord(fork, s1);
        cudaStreamWaitEvent(s2, fork, 0);
        SKV_LAUNCH(k_fill, cuda_blocks((size_t)n, 256), 256, 0, s1)(a, n, 1.0f);
        SKV_LAUNCH(k_scale, cuda_blocks((size_t)n, 256), 256, 0, s2)(b, n, 2.0f);
        cudaEventRecord(join, s2);
        cudaStreamWaitEvent(s1, join, 0);
        cudaStreamEndCapture(s1, &g5);
        cudaError_t e5 = cudaGraphExecUpdate(x, g5, &info);
        cudaGraphExecUpdateResult r5 = info.result;
        cudaGetLastError();
        /* copies: device to device, then device to pinned host memory */
        float *pin = NULL;
        cudaHostAlloc((void **)&pin, sizeof(float) * n, cudaHostAllocMapped);
        cudaGraph_t gc[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal);
            cudaMemcpyAsync(k ? pin : b, a, sizeof(float) * n, cudaMemcpyDefault, s1);
            cudaStreamEndCapture(s1, &gc[k]);
        }
        cudaGraphExec_t xc = NULL;
        cudaGraphInstantiate(&xc, gc[0], 0);
        cudaError_t e6 = cudaGraphExecUpdate(xc, gc[1], &info);
        cudaGraphExecUpdateResult r6 = info.result;
        cudaGetLastError();
        /* the refused updates left the graph of g2 */
        cudaMemset(b, 0, sizeof(float) * n);
        SKV_LAUNCH(k_fill, cuda_blocks((size_t)n, 256), 256, 0, s1)(b, n, 10.0f);
        cudaGraphLaunch(x, s1);
        cudaStreamSynchronize(s1);
        down(h, a, (size_t)n);
        snprintf(msg, sizeof msg, "cudaGraphExecUpdate: same topology, other arguments: updated (%s, result %d; a[1] "
                 "= %g, want 12); another kernel at a node: updated (%s, %d); one node more: %s, TopologyChanged (%d); "
                 "a memset for a kernel: %s, NodeTypeChanged (%d); other dependencies: %s, TopologyChanged (%d); a copy "
                 "to host memory for one to device memory: %s, ParametersChanged (%d); the refused ones leave the "
                 "graph as it was (a[1] = %g, want 22)", cudaGetErrorName(e1), (int)r1, v1, cudaGetErrorName(e2),
                 (int)r2, cudaGetErrorName(e3), (int)r3, cudaGetErrorName(e4), (int)r4, cudaGetErrorName(e5), (int)r5,
                 cudaGetErrorName(e6), (int)r6, h[1]);
        test_cond(msg, e1 == cudaSuccess && r1 == cudaGraphExecUpdateSuccess && v1 == 12.0f && e2 == cudaSuccess &&
                       r2 == cudaGraphExecUpdateSuccess && e3 == cudaErrorGraphExecUpdateFailure &&
                       r3 == cudaGraphExecUpdateErrorTopologyChanged && e4 == cudaErrorGraphExecUpdateFailure &&
                       r4 == cudaGraphExecUpdateErrorNodeTypeChanged && e5 == cudaErrorGraphExecUpdateFailure &&
                       r5 == cudaGraphExecUpdateErrorTopologyChanged && e6 == cudaErrorGraphExecUpdateFailure &&
                       r6 == cudaGraphExecUpdateErrorParametersChanged && h[1] == 22.0f);
        cudaGraph_t gs[] = {g0, g1, g2, g3, g4, g5, gc[0], gc[1]};
        for (cudaGraph_t g : gs) cudaGraphDestroy(g);
        cudaGraphExecDestroy(x);
        cudaGraphExecDestroy(xc);
        cudaFreeHost(pin);
    }
    cudaFree(a);
    cudaFree(b);
    cudaFree(g_dev64);
    free(h);
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaEventDestroy(early);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
}

int main(void) {
    /* the eight planted faults (first: the right forms below set a kernel attribute) */
    expect_fault("a missing __syncthreads in a shared-memory reduction", f_nosync, "__syncthreads",
                 "k_sum(float const*, int, int, float*)::part");
    expect_fault("a shared index one past the end", f_oob, "out of bounds", "k_shift(float*, int)::row");
    expect_fault("64 KiB of dynamic shared memory without the attribute", f_smem, "without cudaFuncSetAttribute",
                 "k_dyn");
    expect_fault("a grid y of 70,000", f_grid, "grid of (1,70000,1)", "k_grid_y");
    expect_fault("a host memcpy from a device pointer", f_host_memcpy, "host code read device memory",
                 "device allocation #");
    expect_fault("a device allocation past the device's size", f_oom, "cudaMalloc of 41943040 bytes refused",
                 "cudaErrorMemoryAllocation");
    expect_fault("a shuffle mask that leaves out an active lane", f_mask, "leaves out lane 31", "k_warp_sum");
    expect_fault("a 16-byte load one float past its alignment", f_misaligned, "not 16-byte aligned", "k_vec4");
    expect_fault("a float read 2 bytes past its alignment", f_scalar_load, "reads 4 bytes", "not 4-byte aligned");
    expect_fault("a 2-byte store at an odd address", f_scalar_store, "writes 2 bytes", "not 2-byte aligned");
    expect_fault("a double read 4 bytes past its alignment", f_wide_load, "reads 8 bytes", "not 8-byte aligned");
    expect_fault("an 8-byte integer stored 4 bytes past its alignment", f_wide_store, "writes 8 bytes",
                 "not 8-byte aligned");
    {
        int bad = stream_join(0);
        char msg[240];
        snprintf(msg, sizeof msg,
                 "a missing event wait between the fetch and compute streams: the consumer reads stale rows "
                 "(%d of 4096 wrong), not a lucky result",
                 bad);
        test_cond(msg, bad > 0);
    }
    expect_fault("a __syncthreads half a warp skips", f_deadlock, "k_half_barrier", "__syncthreads");
    expect_fault("a kernel queued after a cudaFreeAsync of its buffer, on the same stream", f_free_after, "k_fill",
                 "not allocated (freed");
    expect_fault("a kernel queued before a cudaFreeAsync of its buffer, on another stream without an event wait",
                 f_free_unjoined, "k_fill", "not allocated (freed");
    expect_fault("a buffer given to cudaFreeAsync twice", f_free_twice, "cudaFreeAsync", "freed twice");
    {
        int st = 0;
        std::string err = in_child(f_sync_each, &st);
        size_t at = err.find("skv: CUDA call failed");
        std::string line = at == std::string::npos ? "" : err.substr(at, err.find('\n', at) - at);
        char msg[700];
        snprintf(msg, sizeof msg, "SKV_CUDA_SYNC=1: the fault is reported at its launch, naming the kernel: \"%.500s\"",
                 line.c_str());
        test_cond(msg, st != 0 && line.find("kernel k_shift (SKV_CUDA_SYNC=1") != std::string::npos &&
                           line.find("test_cusim_faults.cu") != std::string::npos);
    }

    /* the right forms run clean and right */
    {
        float *x = ramp_dev(1000), *o = dev_alloc(1), h = 0;
        SKV_LAUNCH(k_sum, 1, 256, 0, 0)(x, 1000, 1, o);
        down(&h, o, 1);
        test_cond("a shared-memory sum with its barriers: right, no fault", h == ramp_sum(1000) && !fails());
        float *r = dev_alloc(64), hr[64];
        SKV_LAUNCH(k_shift, 1, 64, 0, 0)(r, 1);
        down(hr, r, 64);
        test_cond("a shared row written in bounds: no fault", hr[5] == 5.0f && !fails());
        float *y = ramp_dev(16384);
        CK(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
        SKV_LAUNCH(k_dyn, 1, 256, 65536, 0)(y, 16384, o);
        down(&h, o, 1);
        test_cond("64 KiB of dynamic shared memory after cudaFuncSetAttribute: runs, right sum",
                  cudaGetLastError() == cudaSuccess && h == ramp_sum(16384));
        float *g = dev_alloc(65535), hg = 0;
        SKV_LAUNCH(k_grid_y, dim3(1, 65535), 32, 0, 0)(g);
        down(&hg, g + 65534, 1);
        test_cond("a grid y of 65,535 runs", cudaGetLastError() == cudaSuccess && hg == 65534.0f);
        float *w = ramp_dev(32);
        SKV_LAUNCH(k_warp_sum, 1, 32, 0, 0)(w, 0xffffffffu, o);
        down(&h, o, 1);
        test_cond("a warp sum with the full mask: right, no fault", h == ramp_sum(32) && !fails());
        float *v4 = ramp_dev(68), *o4 = dev_alloc(16), h4[16];
        SKV_LAUNCH(k_vec4, 1, 16, 0, 0)(v4, 4, o4);
        down(h4, o4, 16);
        test_cond("16-byte loads at 16-byte alignment: right, no fault",
                  !fails() && h4[0] == (float)(4 % 7 + 5 % 7 + 6 % 7 + 7 % 7) &&
                      h4[15] == (float)(64 % 7 + 65 % 7 + 66 % 7 + 67 % 7));
        cudaFree(v4); cudaFree(o4);
        unsigned char *sb = (unsigned char *)ramp_dev(20), *so = (unsigned char *)dev_alloc(16);
        unsigned short hs[16];
        SKV_LAUNCH(k_scalar_at, 1, 16, 0, 0)(sb, 4, so, 2);
        cudaMemcpy(hs, so, sizeof hs, cudaMemcpyDeviceToHost);
        test_cond("a float read and a 2-byte store each at its size's alignment: right, no fault",
                  !fails() && hs[1] == 1 && hs[2] == 2 && hs[8] == 1);
        cudaFree(sb); cudaFree(so);
        double hd[16];
        for (int i = 0; i < 16; i++) hd[i] = 3.0 * i;
        unsigned char *db = (unsigned char *)dev_alloc(34), *dq = (unsigned char *)dev_alloc(34);
        unsigned long long hq[17];
        cudaMemcpy(db + 8, hd, sizeof hd, cudaMemcpyHostToDevice);
        SKV_LAUNCH(k_wide_at, 1, 16, 0, 0)(db, 8, dq, 8);
        cudaMemcpy(hq, dq, sizeof hq, cudaMemcpyDeviceToHost);
        test_cond("a double read and an 8-byte store at 8-byte alignment: right, no fault",
                  !fails() && hq[1] == 0 && hq[2] == 3 && hq[16] == 45);
        cudaFree(db); cudaFree(dq);
        int bad = stream_join(1);
        char msg[200];
        snprintf(msg, sizeof msg, "the compute stream waits for the fetch stream's event: %d wrong rows", bad);
        test_cond(msg, bad == 0);
        cudaFree(x); cudaFree(o); cudaFree(r); cudaFree(y); cudaFree(g); cudaFree(w);
    }

    /* stream-ordered frees: in stream order, no fault; the backend's free
     * and alloc wait for nothing, its pinned free neither while work is
     * queued (the block is held until both streams are idle) */
    {
        int st = 0;
        std::string err = in_child([]() { return free_async_case(0); }, &st);
        test_cond("a kernel queued before a cudaFreeAsync of its buffer on the same stream, run after the call: "
                  "no fault", st == 0 && err.find("cusim") == std::string::npos);
        cusim_counters_reset();
        float *d = (float *)cu_alloc(sizeof(float) * 4096);
        float *h = (float *)cu_host_alloc(sizeof(float) * 4096);
        cudaStream_t fs = cuda_fetch_begin();
        SKV_LAUNCH(k_copy, 16, 256, 0, fs)(h, d, 4096); /* the fetch stream reads the pinned block, writes d */
        cuda_fetch_end();
        cu_free(d);
        cu_host_free(h);
        /* held while the gather may read it: an allocation of its size now
         * gets another block */
        float *h1 = (float *)cu_host_alloc(sizeof(float) * 4096);
        cusim_counters c;
        cusim_counters_get(&c);
        int held = cusim_pointer_kind(h) == 2 && h1 != h;
        uint64_t syncs = c.host_syncs;
        cu_sync();
        float *e = (float *)cu_alloc(16); /* finds both streams idle: the held block goes to the pool */
        cusim_counters_get(&c);
        uint64_t pins = c.pinned_allocs;
        /* the next pinned allocation of its size is that block, not a new pin */
        float *h2 = (float *)cu_host_alloc(sizeof(float) * 4096);
        cusim_counters_get(&c);
        int reused = h2 == h && c.pinned_allocs == pins;
        char msg[300];
        snprintf(msg, sizeof msg, "cu_free and cu_host_free while a gather reads the buffers: %llu host syncs, the "
                 "pinned block held (%d: another block for an allocation of its size then), released after a sync and handed to the next allocation of its size (%d), "
                 "no fault (%llu)", (unsigned long long)syncs, held, reused, (unsigned long long)c.faults);
        test_cond(msg, syncs == 0 && held && reused && c.faults == 0 && c.frees >= 1);
        cu_host_free(h2);
        cu_host_free(h1);
        cu_free(e);
        cu_sync();
    }

    /* counters: what the host asked for */
    {
        cusim_counters_reset();
        float *a = dev_alloc(1024), h[1024];
        for (int i = 0; i < 1024; i++) h[i] = (float)i;
        up(a, h, 1024);
        SKV_LAUNCH(k_fill, 4, 256, 0, 0)(a, 1024, 2.0f);
        SKV_LAUNCH(k_fill, 4, 256, 0, 0)(a, 1024, 3.0f);
        down(h, a, 1024);
        cudaFree(a);
        cusim_counters c;
        cusim_counters_get(&c);
        char msg[300];
        snprintf(msg, sizeof msg,
                 "counters: %llu launches (2 of k_fill), %llu host syncs (2 blocking copies, 1 free), %llu bytes "
                 "up and %llu down, peak %llu bytes",
                 (unsigned long long)c.launches, (unsigned long long)c.host_syncs, (unsigned long long)c.bytes_h2d,
                 (unsigned long long)c.bytes_d2h, (unsigned long long)c.device_peak);
        test_cond(msg, c.launches == 2 && cusim_launches_of("k_fill") == 2 && c.blocking_copies == 2 &&
                           c.device_syncs == 1 && c.host_syncs == 3 && c.bytes_h2d == 4096 && c.bytes_d2h == 4096 &&
                           c.device_peak >= 4096 && h[5] == 8.0f);
    }

    /* a graph: captured launches replay in order, one graph launch */
    {
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        float *a = dev_alloc(256), *b = dev_alloc(256), h[256];
        cudaGraph_t g;
        cudaGraphExec_t x;
        cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        SKV_LAUNCH(k_fill, 1, 256, 0, s)(a, 256, 5.0f);
        SKV_LAUNCH(k_copy, 1, 256, 0, s)(a, b, 256);
        cudaStreamEndCapture(s, &g);
        cudaGraphInstantiate(&x, g, 0);
        cusim_counters_reset();
        cudaGraphLaunch(x, s);
        cudaMemcpyAsync(h, b, sizeof h, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        cusim_counters c;
        cusim_counters_get(&c);
        test_cond("a captured graph replays its two kernels in order as one graph launch",
                  h[3] == 8.0f && c.graph_launches == 1 && c.graph_kernels == 2 && c.launches == 0);
        cudaGraphExecDestroy(x);
        cudaGraphDestroy(g);
        cudaStreamDestroy(s);
    }
    cudaEventCreateWithFlags(&g_outside, cudaEventDisableTiming);
    graph_rules();
    return test_report("test_cusim_faults");
}
