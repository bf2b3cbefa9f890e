/* backend_cuda.cu: the CUDA backend's table entry (kernels/backend.h) and
 * what every op shares: the device context (two streams: compute, and fetch
 * for the gathers of offloaded values, so a gather overlaps the key
 * rebuild), buffers, stream-ordered scratch, and the timeline (CUDA events
 * around each op while spans are on, read back after a sync).
 *
 * Built only when nvcc is found (SKV_HAVE_CUDA). A binary built with it
 * runs where no GPU is: `available` says why, and skv_backend_pick falls
 * back to the CPU with one notice. The kernels are tested against the CPU
 * backend op by op in tests/gpu/ (run on a device by tests/gpu/run.sh);
 * their per-element math is kernels/kmath.h, which tests/test_kmath.c
 * checks on any machine. */
#include "cuda_util.h"

#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <unordered_map>
#include <vector>

void cuda_fail(const char *what, const char *msg, const char *file, int line) {
    fprintf(stderr, "skv: CUDA call failed at %s:%d: %s: %s\n", file, line, what, msg);
    abort();
}

static const char *g_last_kernel = "(none)";
static int g_sync_each = -1; /* SKV_CUDA_SYNC=1: sync after every launch */

void cuda_note_launch(const char *kernel) { g_last_kernel = kernel; }

void cuda_check_launch(const char *file, int line) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        if (g_sync_each < 0) {
            const char *v = getenv("SKV_CUDA_SYNC");
            g_sync_each = v && *v == '1';
        }
        if (!g_sync_each) return;
        e = cudaDeviceSynchronize();
        if (e == cudaSuccess) return;
    }
    char what[160];
    snprintf(what, sizeof what, "kernel %s%s", g_last_kernel, g_sync_each > 0 ? " (SKV_CUDA_SYNC=1: synced after it)" : "");
    cuda_fail(what, cudaGetErrorString(e), file, line);
}

static cuda_ctx g_ctx;
static std::mutex g_mu;

cuda_ctx *cuda_get(void) {
    if (g_ctx.ready) return &g_ctx;
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_ctx.ready) {
        CK(cudaSetDevice(0));
        CK(cudaStreamCreateWithFlags(&g_ctx.compute, cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&g_ctx.fetch, cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&g_ctx.fetched, cudaEventDisableTiming));
        CKB(cublasCreate(&g_ctx.blas));
        CKB(cublasSetStream(g_ctx.blas, g_ctx.compute));
        /* fp32 GEMMs stay fp32 (no TF32): they are the CPU's twins */
        CKB(cublasSetMathMode(g_ctx.blas, CUBLAS_DEFAULT_MATH));
        CKS(cusolverDnCreate(&g_ctx.solver));
        CKS(cusolverDnSetStream(g_ctx.solver, g_ctx.compute));
        g_ctx.ready = 1;
    }
    return &g_ctx;
}

cudaStream_t cuda_after_fetch(void) {
    cuda_ctx *c = cuda_get();
    if (c->fetch_pending) {
        CK(cudaStreamWaitEvent(c->compute, c->fetched, 0));
        c->fetch_pending = 0;
    }
    return c->compute;
}

cudaStream_t cuda_fetch_begin(void) {
    cuda_ctx *c = cuda_get();
    if (!c->compute_done) CK(cudaEventCreateWithFlags(&c->compute_done, cudaEventDisableTiming));
    CK(cudaEventRecord(c->compute_done, c->compute));
    CK(cudaStreamWaitEvent(c->fetch, c->compute_done, 0));
    return c->fetch;
}

void cuda_fetch_end(void) {
    cuda_ctx *c = cuda_get();
    CK(cudaEventRecord(c->fetched, c->fetch));
    c->fetch_pending = 1;
}

/* Scratch is kept for the process: a block given back goes to a pool by
 * size class (a power of two from 256 bytes) and the next request of its
 * class takes it. Every scratch user is on the compute stream, so a block
 * taken again is used after the work that used it before, in stream order.
 * Once the pool holds what a step needs, a step allocates and frees
 * nothing. Blocks over SCRATCH_KEEP go back to the driver. */
#define SCRATCH_KEEP ((size_t)64 << 20)
static std::mutex g_scratch_mu;
static std::unordered_map<void *, size_t> g_scratch_size; /* block -> its class's bytes */
static std::unordered_map<size_t, std::vector<void *>> g_scratch_pool;

void *cuda_scratch(size_t bytes) {
    size_t sz = 256;
    while (sz < bytes) sz <<= 1;
    cuda_ctx *c = cuda_get();
    std::lock_guard<std::mutex> lock(g_scratch_mu);
    std::vector<void *> &pool = g_scratch_pool[sz];
    if (!pool.empty()) {
        void *p = pool.back();
        pool.pop_back();
        return p;
    }
    void *p = NULL;
    CK(cudaMallocAsync(&p, sz, c->compute));
    g_scratch_size[p] = sz;
    return p;
}

void cuda_scratch_free(void *p) {
    if (!p) return;
    cuda_ctx *c = cuda_get();
    std::lock_guard<std::mutex> lock(g_scratch_mu);
    auto it = g_scratch_size.find(p);
    SKV_ASSERT(it != g_scratch_size.end());
    if (it->second > SCRATCH_KEEP) {
        g_scratch_size.erase(it);
        CK(cudaFreeAsync(p, c->compute));
        return;
    }
    g_scratch_pool[it->second].push_back(p);
}

/* Keyed by the values, not by the host pointer: a rope_ctx freed and another
 * made at the same address (or the same array rewritten) must not get the
 * first one's frequencies, nor a device array of the wrong length. The copy
 * is queued on the compute stream and waited for, so the ops queued after it
 * there (and on the fetch stream, which starts after a sync) see it whole;
 * a plain cudaMemcpy would run on the legacy stream, which the two
 * non-blocking streams are not ordered with. */
struct const_entry {
    std::vector<float> host;
    float *dev;
};

const float *cuda_const_upload(const float *host, size_t n) {
    static std::vector<const_entry> uploaded;
    cuda_ctx *c = cuda_get();
    std::lock_guard<std::mutex> lock(g_mu);
    for (const const_entry &e : uploaded)
        if (e.host.size() == n && (n == 0 || memcmp(e.host.data(), host, sizeof(float) * n) == 0)) return e.dev;
    float *d = NULL;
    CK(cudaMalloc(&d, sizeof(float) * (n ? n : 1)));
    if (n) {
        CK(cudaMemcpyAsync(d, host, sizeof(float) * n, cudaMemcpyHostToDevice, c->compute));
        CK(cudaStreamSynchronize(c->compute));
    }
    const_entry e;
    e.host.assign(host, host + n);
    e.dev = d;
    uploaded.push_back(e);
    return d;
}

/* ---- availability and buffers ---- */

int cu_available(char *why, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        /* The runtime says "driver version is insufficient" when there is no
         * driver at all: no GPU here, not an old driver to upgrade. */
        int driver = access("/proc/driver/nvidia/version", F_OK) == 0;
        if (n && (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0) ||
                  (e == cudaErrorInsufficientDriver && !driver)))
            snprintf(why, n, driver ? "no NVIDIA GPU found (the driver sees none)" : "no NVIDIA GPU or driver found");
        else if (n)
            snprintf(why, n, "no CUDA device: %s", cudaGetErrorString(e));
        cudaGetLastError(); /* clear the sticky status of a failed query */
        return 0;
    }
    return 1;
}

int cu_mem_info(size_t *free_bytes, size_t *total_bytes) {
    cuda_get();
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
        cudaGetLastError();
        return skv_error(SKV_EIO, "cuda: cannot read the device's free memory");
    }
    return 0;
}

void *cu_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    /* Zeroed on the compute stream and waited for: cudaMemset would queue on
     * the legacy default stream, which the two non-blocking streams are not
     * ordered with, so a row an op writes right after could be zeroed after. */
    cudaStream_t st = cuda_after_fetch();
    CK(cudaMemsetAsync(p, 0, bytes ? bytes : 16, st));
    CK(cudaStreamSynchronize(st));
    return p;
}

void cu_free(void *p) {
    if (!p) return;
    CK(cudaDeviceSynchronize()); /* queued work may still read it */
    CK(cudaFree(p));
}

void cu_upload(void *dst, const void *host_src, size_t bytes) {
    CK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cuda_after_fetch()));
    CK(cudaStreamSynchronize(cuda_get()->compute));
}

void cu_download(void *host_dst, const void *src, size_t bytes) {
    CK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cuda_after_fetch()));
    CK(cudaStreamSynchronize(cuda_get()->compute));
}

void cu_copy(void *dst, const void *src, size_t bytes) {
    cudaStream_t st = cuda_after_fetch();
    cuda_span_mark sp = cuda_span_begin(0);
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
    cuda_span_end(sp, 0, "copy");
}

void cu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height) {
    if (!height || !width) return;
    cudaStream_t st = cuda_after_fetch();
    /* cudaMemcpyDefault: unified addressing tells device from pinned host memory */
    CK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, st));
}

void *cu_host_alloc(size_t bytes) {
    void *p = NULL;
    cuda_get();
    if (cudaHostAlloc(&p, bytes ? bytes : 16, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    memset(p, 0, bytes ? bytes : 16);
    return p;
}

void cu_host_free(void *p) {
    if (!p) return;
    CK(cudaDeviceSynchronize());
    CK(cudaFreeHost(p));
}

void cu_sync(void) {
    cuda_ctx *c = cuda_get();
    cuda_after_fetch();
    CK(cudaStreamSynchronize(c->fetch));
    CK(cudaStreamSynchronize(c->compute));
}

/* ---- timeline ---- */

typedef struct {
    cudaEvent_t a, b;
    int stream, layer, step;
    const char *op;
} pending_span;

static struct {
    int on;
    int layer, step;
    cudaEvent_t base;     /* recorded at enable, with its host time */
    double base_host;
    std::vector<pending_span> pend;
    std::vector<cudaEvent_t> pool;
} g_tl;

static cudaEvent_t tl_event(void) {
    if (!g_tl.pool.empty()) {
        cudaEvent_t e = g_tl.pool.back();
        g_tl.pool.pop_back();
        return e;
    }
    cudaEvent_t e;
    CK(cudaEventCreate(&e));
    return e;
}

cuda_span_mark cuda_span_begin(int stream) {
    cuda_span_mark m = {NULL, NULL, 0};
    if (!g_tl.on) return m;
    cuda_ctx *c = cuda_get();
    m.a = tl_event();
    m.b = tl_event();
    m.on = 1;
    CK(cudaEventRecord(m.a, stream ? c->fetch : c->compute));
    return m;
}

void cuda_span_end(cuda_span_mark m, int stream, const char *op) {
    if (!m.on) return;
    cuda_ctx *c = cuda_get();
    CK(cudaEventRecord(m.b, stream ? c->fetch : c->compute));
    pending_span p = {m.a, m.b, stream, g_tl.layer, g_tl.step, op};
    g_tl.pend.push_back(p);
}

void cu_span_tag(int layer, int step) {
    g_tl.layer = layer;
    g_tl.step = step;
}

void cu_span_enable(int on) {
    if (on && !g_tl.on) {
        cuda_ctx *c = cuda_get();
        if (!g_tl.base) CK(cudaEventCreate(&g_tl.base));
        CK(cudaStreamSynchronize(c->compute));
        CK(cudaEventRecord(g_tl.base, c->compute));
        CK(cudaEventSynchronize(g_tl.base));
        g_tl.base_host = skv_now();
    }
    g_tl.on = on;
}

int cu_span_drain(skv_span *out, int max) {
    int n = 0;
    size_t i = 0;
    for (; i < g_tl.pend.size() && n < max; i++) {
        pending_span &p = g_tl.pend[i];
        CK(cudaEventSynchronize(p.b));
        float ta = 0, tb = 0;
        CK(cudaEventElapsedTime(&ta, g_tl.base, p.a));
        CK(cudaEventElapsedTime(&tb, g_tl.base, p.b));
        out[n].stream = p.stream;
        out[n].op = p.op;
        out[n].layer = p.layer;
        out[n].step = p.step;
        out[n].t0 = g_tl.base_host + ta / 1000.0;
        out[n].t1 = g_tl.base_host + tb / 1000.0;
        n++;
        g_tl.pool.push_back(p.a);
        g_tl.pool.push_back(p.b);
    }
    g_tl.pend.erase(g_tl.pend.begin(), g_tl.pend.begin() + (long)i);
    return n;
}

