/* backend_cuda.cu: the CUDA backend's table entry (kernels/backend.h) and
 * what every op shares: the device context (two streams: compute, and fetch
 * for the gathers of offloaded values, so a gather overlaps the key
 * rebuild), buffers, stream-ordered scratch, the decode step as a CUDA
 * graph (step_begin/step_end), and the timeline (CUDA events around each op
 * while spans are on, read back after a sync).
 *
 * Built only when nvcc is found (SKV_HAVE_CUDA). A binary built with it
 * runs where no GPU is: `available` says why, and skv_backend_pick falls
 * back to the CPU with one notice. The kernels are tested against the CPU
 * backend op by op in tests/gpu/ (run on a device by tests/gpu/run.sh);
 * their per-element math is kernels/kmath.h, which tests/test_kmath.c
 * checks on any machine. */
#include "cuda_util.h"

#include <atomic>
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <thread>
#include <unordered_map>
#include <vector>

void cuda_fail(const char *what, const char *msg, const char *file, int line) {
    fprintf(stderr, "skv: CUDA call failed at %s:%d: %s: %s\n", file, line, what, msg);
    abort();
}

static const char *g_last_kernel = "(none)";
static int g_sync_each = -1; /* SKV_CUDA_SYNC=1: sync after every launch */
static int g_spans_on;       /* the timeline records spans (cu_span_enable) */

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
        /* A workspace of its own, after the stream (setting a stream puts
         * the handle back on cuBLAS's pool): a GEMM captured into a step's
         * graph (a batch over MM_MAX_N) then takes no allocation there, so
         * the graph stays updatable in place. 32 MiB on sm_90, 4 MiB
         * before, as cuBLAS's guide suggests; kept for the process. */
        int dev = 0, major = 0;
        CK(cudaGetDevice(&dev));
        CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        g_ctx.blas_ws_bytes = (size_t)(major >= 9 ? 32 : 4) << 20;
        CK(cudaMalloc(&g_ctx.blas_ws, g_ctx.blas_ws_bytes));
        CKB(cublasSetWorkspace(g_ctx.blas, g_ctx.blas_ws, g_ctx.blas_ws_bytes));
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

/* ---- the decode step as a CUDA graph ----
 * The forward brackets a decode step with step_begin and step_end. Between
 * them the compute stream is captured (the fetch stream joins the capture
 * through the fork and join events of cuda_fetch_begin/end), so the step's
 * launches and copies are recorded, not run; step_end turns the recording
 * into the executable graph and launches it: one launch a step. The graph
 * is recorded again each step (positions, row counts and grids are the
 * kernels' by-value arguments, and they change) and applied to the graph
 * of the step before with cudaGraphExecUpdate, which keeps the
 * instantiation when the topology is the same; when it is not (another
 * batch size, a fallback path, other split counts) the graph is
 * instantiated anew (the llama.cpp way).
 *
 * What cannot be captured (a host wait, an allocation or free, a copy
 * with pageable memory, a stream query: cuda_call_breaks, and the ops that
 * do those: cu_alloc, cu_free, host_alloc, cu_host_free, cu_upload,
 * cu_download, cu_sync, cu_span_enable) breaks the capture: what was
 * recorded so far is launched as a graph of its own and the rest of the
 * step runs eagerly, in the same order, so a step is never wrong, only
 * slower (the first step of a sequence, whose buffers and scratch are
 * made then, usually breaks). No capture while spans are on (their events
 * are read by the host) or under SKV_CUDA_SYNC=1, and none with
 * SKV_CUDA_GRAPH=0 in the environment (or cu_graph_set(0)). */
int cuda_graph_capturing;
static struct {
    int on;                 /* -1: SKV_CUDA_GRAPH not read yet */
    cudaGraphExec_t exec;   /* the last whole step's graph, updated in place */
    cu_graph_stats st;
} g_graph = {-1, NULL, {0, 0, 0, 0}};

int cu_graph_set(int on) {
    int was = g_graph.on;
    g_graph.on = on;
    return was;
}

void cu_graph_stats_get(cu_graph_stats *out) { *out = g_graph.st; }

/* Ends the capture on the compute stream, after joining the fetch stream's
 * last gather into it (a forked stream must join before the end). */
static cudaGraph_t capture_end(void) {
    cuda_ctx *c = cuda_get();
    cuda_graph_capturing = 0;
    cuda_after_fetch();
    cudaGraph_t g = NULL;
    CK(cudaStreamEndCapture(c->compute, &g));
    return g;
}

void cuda_graph_break(void) {
    if (!cuda_graph_capturing) return;
    cudaGraph_t g = capture_end();
    cudaGraphExec_t x;
    CK(cudaGraphInstantiate(&x, g, 0));
    CK(cudaGraphLaunch(x, cuda_get()->compute));
    CK(cudaGraphExecDestroy(x)); /* (freed once the launch is done) */
    CK(cudaGraphDestroy(g));
    g_graph.st.breaks++;
}

void cu_step_begin(void) {
    if (g_graph.on < 0) {
        const char *v = getenv("SKV_CUDA_GRAPH");
        g_graph.on = !(v && v[0] == '0');
    }
    if (g_sync_each < 0) {
        const char *v = getenv("SKV_CUDA_SYNC");
        g_sync_each = v && *v == '1';
    }
    if (!g_graph.on || g_sync_each || g_spans_on || cuda_graph_capturing) return;
    cuda_ctx *c = cuda_get();
    cuda_after_fetch(); /* a gather queued before the step: joined outside the capture */
    /* relaxed: a call the capture cannot take breaks it first, whatever the mode */
    CK(cudaStreamBeginCapture(c->compute, cudaStreamCaptureModeRelaxed));
    cuda_graph_capturing = 1;
}

void cu_step_end(void) {
    if (!cuda_graph_capturing) return; /* eager, or broken */
    cuda_ctx *c = cuda_get();
    cudaGraph_t g = capture_end();
    if (g_graph.exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(g_graph.exec, g, &info) == cudaSuccess) {
            g_graph.st.updates++;
        } else { /* the topology changed: a new instantiation */
            cudaGetLastError();
            CK(cudaGraphExecDestroy(g_graph.exec));
            g_graph.exec = NULL;
        }
    }
    if (!g_graph.exec) {
        CK(cudaGraphInstantiate(&g_graph.exec, g, 0));
        g_graph.st.instantiations++;
    }
    CK(cudaGraphLaunch(g_graph.exec, c->compute));
    CK(cudaGraphDestroy(g));
    g_graph.st.steps++;
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

/* Pinned staging: one arena, handed out front to back and reused from the
 * front once the compute stream (where every staged copy is queued) has
 * drained; full before that, it waits for the stream (or grows, when a
 * request is larger than all of it). A step stages a few ids and drains at
 * its end, so the arena never fills in a step after the first. */
static std::mutex g_stage_mu;
static struct {
    char *buf;
    size_t cap, used;
} g_stage;

void *cuda_stage_space(size_t bytes) {
    cuda_ctx *c = cuda_get();
    size_t need = (bytes + 255) & ~(size_t)255;
    std::lock_guard<std::mutex> lock(g_stage_mu);
    if (g_stage.used + need > g_stage.cap) {
        if (g_stage.used) CK(cudaStreamSynchronize(c->compute)); /* the copies that read it */
        g_stage.used = 0;
        if (need > g_stage.cap) {
            if (g_stage.buf) CK(cudaFreeHost(g_stage.buf));
            size_t cap = need > ((size_t)64 << 10) ? need : ((size_t)64 << 10);
            g_stage.buf = NULL;
            g_stage.cap = 0;
            CK(cudaHostAlloc((void **)&g_stage.buf, cap, cudaHostAllocDefault));
            g_stage.cap = cap;
        }
    }
    char *p = g_stage.buf + g_stage.used;
    g_stage.used += need;
    return p;
}

const void *cuda_stage(const void *host, size_t bytes) {
    void *p = cuda_stage_space(bytes);
    memcpy(p, host, bytes);
    return p;
}

/* The compute stream has drained: the staging arena is free again. */
static void stage_drained(void) {
    std::lock_guard<std::mutex> lock(g_stage_mu);
    g_stage.used = 0;
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

/* ---- freeing without a sync ----
 * Device buffers come from the stream-ordered allocator on the compute
 * stream (cudaMallocAsync) and go back to it there (cudaFreeAsync), after
 * what either stream has queued: no host wait. Pinned host memory has no
 * stream-ordered free, and cudaFreeHost waits for the whole device: a block
 * freed while work is queued is held back, and freed by the next alloc or
 * free that finds both streams idle (then that wait costs nothing), or
 * after a wait when more than HOST_HELD_MAX blocks are held. */
#define HOST_HELD_MAX 8
static std::mutex g_held_mu;
static std::vector<void *> g_host_held;

/* Pinning is slow (cudaHostAlloc maps page by page: about 1 GB/s, seconds
 * for the store of a long sequence) and cudaFreeHost waits for the device,
 * so a pinned block that host_release would free goes, once nothing queued
 * reads it, to a pool, and is handed to the next allocation it fits (the
 * smallest pooled block of n to n + n/4 bytes): a bench that frees and makes
 * sequences pins its stores once. The pool is bounded by the most pinned
 * bytes the process held at once: before pinning a new block, the oldest
 * pooled ones are freed until the live and pooled blocks and the new one
 * come to no more than that peak (the new block counted in it), so pooling
 * never pins more than the allocations themselves asked for together. The
 * pool is given back when an allocation fails, by cu_host_trim and at exit.
 * All under g_held_mu. */
static std::vector<void *> g_host_pool; /* oldest first */
static std::unordered_map<void *, size_t> g_host_size; /* each pinned block's size, live or pooled */
static size_t g_pin_live, g_pin_peak, g_pool_bytes; /* bytes handed out (held included), their peak, pooled */
static int g_pool_hooked;

static void pool_free_one(void *p) {
    g_host_size.erase(p);
    CK(cudaFreeHost(p));
}

static void pool_put(void *p) {
    size_t n = g_host_size[p];
    g_pin_live -= n;
    g_pool_bytes += n;
    g_host_pool.push_back(p);
}

/* A block of b bytes serves an allocation of n: n to n + n/4. */
static int pool_fits(size_t b, size_t n) { return b >= n && b - n <= n / 4; }

/* A pooled block for n bytes, or NULL. */
static void *pool_take(size_t n) {
    std::lock_guard<std::mutex> lock(g_held_mu);
    long best = -1;
    for (size_t i = 0; i < g_host_pool.size(); i++) {
        size_t b = g_host_size[g_host_pool[i]];
        if (pool_fits(b, n) && (best < 0 || b < g_host_size[g_host_pool[(size_t)best]])) best = (long)i;
    }
    if (best < 0) return NULL;
    void *p = g_host_pool[(size_t)best];
    g_host_pool.erase(g_host_pool.begin() + best);
    g_pool_bytes -= g_host_size[p];
    g_pin_live += g_host_size[p];
    if (g_pin_live > g_pin_peak) g_pin_peak = g_pin_live;
    return p;
}

/* Reservations (cu_host_reserve): a block pinned by a thread of its own
 * while the caller goes on queueing work. The first host_alloc it fits
 * joins it (waiting if it is still pinning) and takes it from the pool;
 * any host_alloc after it is done joins it into the pool, where it counts
 * as pinned memory asked for (the peak), and the exit joins what is left.
 * The list is under g_held_mu; a job's thread touches only its job. */
struct pin_job {
    size_t n;
    void *p;
    std::atomic<int> done;
    std::thread th;
};
static std::vector<pin_job *> g_pin_jobs;

static void pool_hook(void);
static void host_release(int wait);

void cu_host_reserve(size_t bytes) {
    if (!bytes) return;
    cuda_get();
    host_release(0); /* blocks freed since, if nothing queued reads them */
    {
        std::lock_guard<std::mutex> lock(g_held_mu);
        for (void *p : g_host_pool) /* pinned already: nothing to start */
            if (pool_fits(g_host_size[p], bytes)) return;
    }
    int dev = 0;
    CK(cudaGetDevice(&dev));
    pin_job *j = new pin_job();
    j->n = bytes;
    j->p = NULL;
    j->done = 0;
    j->th = std::thread([j, dev]() {
        void *p = NULL;
        if (cudaSetDevice(dev) != cudaSuccess ||
            cudaHostAlloc(&p, j->n, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
            cudaGetLastError(); /* out of pinned memory: the allocation it was for pins (or fails) itself */
            p = NULL;
        }
        j->p = p;
        j->done = 1;
    });
    std::lock_guard<std::mutex> lock(g_held_mu);
    g_pin_jobs.push_back(j);
    pool_hook();
}

/* Joins the reservations that are done and (n > 0) those that fit n bytes,
 * their blocks into the pool. */
static void pin_jobs_join(size_t n) {
    std::vector<pin_job *> mine;
    {
        std::lock_guard<std::mutex> lock(g_held_mu);
        for (size_t i = 0; i < g_pin_jobs.size();) {
            pin_job *j = g_pin_jobs[i];
            if (j->done || (n && pool_fits(j->n, n))) {
                mine.push_back(j);
                g_pin_jobs.erase(g_pin_jobs.begin() + (long)i);
            } else {
                i++;
            }
        }
    }
    for (pin_job *j : mine) {
        j->th.join();
        if (j->p) {
            std::lock_guard<std::mutex> lock(g_held_mu);
            g_host_size[j->p] = j->n;
            g_pool_bytes += j->n;
            g_host_pool.push_back(j->p);
            if (g_pin_live + g_pool_bytes > g_pin_peak) g_pin_peak = g_pin_live + g_pool_bytes;
        }
        delete j;
    }
}

/* Frees pooled blocks, oldest first, until pinning n more bytes keeps the
 * live and pooled bytes within the peak (n counted in it). */
static void pool_trim_for(size_t n) {
    std::lock_guard<std::mutex> lock(g_held_mu);
    size_t peak = g_pin_live + n > g_pin_peak ? g_pin_live + n : g_pin_peak;
    while (!g_host_pool.empty() && g_pin_live + n + g_pool_bytes > peak) {
        void *p = g_host_pool.front();
        g_pool_bytes -= g_host_size[p];
        g_host_pool.erase(g_host_pool.begin());
        pool_free_one(p);
    }
}

static void pool_drain(void) {
    std::lock_guard<std::mutex> lock(g_held_mu);
    for (void *p : g_host_pool) pool_free_one(p);
    g_host_pool.clear();
    g_pool_bytes = 0;
}

/* At exit (hooked after the runtime started, so before its own teardown):
 * errors ignored, a fault's sticky error included. */
static void pool_at_exit(void) {
    std::lock_guard<std::mutex> lock(g_held_mu);
    for (pin_job *j : g_pin_jobs) {
        j->th.join();
        if (j->p) cudaFreeHost(j->p);
        delete j;
    }
    g_pin_jobs.clear();
    for (void *p : g_host_pool) cudaFreeHost(p);
    g_host_pool.clear();
    for (void *p : g_host_held) cudaFreeHost(p); /* (cudaFreeHost waits for the device) */
    g_host_held.clear();
}

/* Hooks pool_at_exit once (under g_held_mu, after the runtime started, so
 * before its own teardown). */
static void pool_hook(void) {
    if (!g_pool_hooked) {
        g_pool_hooked = 1;
        atexit(pool_at_exit);
    }
}

/* 1 when stream s has work queued that has not finished (a query, not a
 * wait: the simulator does not count it as a host sync). */
static int stream_busy(cudaStream_t s) {
    cuda_graph_break(); /* a capturing stream cannot be queried */
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaErrorNotReady) {
        cudaGetLastError(); /* not an error: clear it */
        return 1;
    }
    CK(e);
    return 0;
}

/* 1 when the compute and fetch streams have nothing queued. */
static int streams_idle(void) {
    cuda_ctx *c = cuda_get();
    return !stream_busy(c->compute) && !stream_busy(c->fetch);
}

/* Frees the held pinned blocks if nothing queued can still read them: when
 * both streams are idle, or (wait) after waiting for them. */
static void host_release(int wait) {
    std::lock_guard<std::mutex> lock(g_held_mu);
    if (g_host_held.empty()) return;
    if (!streams_idle()) {
        if (!wait) return;
        cuda_ctx *c = cuda_get();
        cuda_after_fetch(); /* the compute stream after the last gather: its end is both streams' */
        CK(cudaStreamSynchronize(c->compute));
    }
    for (void *p : g_host_held) pool_put(p);
    g_host_held.clear();
}

/* The bytes of cu_alloc's buffers live now and at most since the last
 * reset (cu_mem_peak), each buffer's size kept until its free. */
static std::mutex g_dev_mu;
static std::unordered_map<void *, size_t> g_dev_size;
static size_t g_dev_live, g_dev_peak;

size_t cu_mem_peak(int reset) {
    std::lock_guard<std::mutex> lock(g_dev_mu);
    if (reset) g_dev_peak = g_dev_live;
    return reset ? g_dev_live : g_dev_peak;
}

static void dev_count(void *p, size_t n) {
    std::lock_guard<std::mutex> lock(g_dev_mu);
    if (n) {
        g_dev_size[p] = n;
        g_dev_live += n;
        if (g_dev_live > g_dev_peak) g_dev_peak = g_dev_live;
        return;
    }
    auto it = g_dev_size.find(p);
    if (it == g_dev_size.end()) return;
    g_dev_live -= it->second;
    g_dev_size.erase(it);
}

void *cu_alloc(size_t bytes) {
    cuda_graph_break();
    host_release(0);
    size_t n = bytes ? bytes : 16;
    cudaStream_t st = cuda_after_fetch();
    void *p = NULL;
    if (cudaMallocAsync(&p, n, st) != cudaSuccess) {
        cudaGetLastError();
        /* frees still queued hold memory until their stream reaches them:
         * out of memory, wait for them once and try again */
        CK(cudaStreamSynchronize(st));
        if (cudaMallocAsync(&p, n, st) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
    }
    /* Zeroed on the compute stream, in its order: every op that uses the
     * buffer is queued after this, there or on the fetch stream (forked from
     * it by an event); cudaMemset would queue on the legacy default stream,
     * which the two non-blocking streams are not ordered with. */
    CK(cudaMemsetAsync(p, 0, n, st));
    dev_count(p, n);
    return p;
}

void cu_free(void *p) {
    cuda_graph_break();
    host_release(0);
    if (!p) return;
    dev_count(p, 0);
    /* after the work queued on both streams: the compute stream first waits
     * for the last gather on the fetch stream (an event) */
    CK(cudaFreeAsync(p, cuda_after_fetch()));
}

/* Synchronous by contract: the host's buffer is free (upload) or filled
 * (download) on return. */
void cu_upload(void *dst, const void *host_src, size_t bytes) {
    cuda_graph_break(); /* (host_src may be pageable) */
    CK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cuda_after_fetch()));
    CK(cudaStreamSynchronize(cuda_get()->compute));
    stage_drained();
}

void cu_download(void *host_dst, const void *src, size_t bytes) {
    cuda_graph_break();
    CK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cuda_after_fetch()));
    CK(cudaStreamSynchronize(cuda_get()->compute));
    stage_drained();
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

static void *host_alloc(size_t bytes, int zero) {
    cuda_graph_break();
    size_t n = bytes ? bytes : 16;
    cuda_get();
    host_release(0); /* pinned blocks held back by frees, if nothing queued reads them now */
    pin_jobs_join(n); /* a reservation for this allocation (waited for), and those done */
    void *p = pool_take(n);
    if (!p) {
        pool_trim_for(n);
        if (cudaHostAlloc(&p, n, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
            cudaGetLastError();
            /* out of pinned memory: wait for the queued work, take a block
             * the frees held if one fits, else give the pool back and try
             * once more */
            host_release(1);
            if (!(p = pool_take(n))) {
                pool_drain();
                if (cudaHostAlloc(&p, n, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
                    cudaGetLastError();
                    return NULL;
                }
            }
        }
        std::lock_guard<std::mutex> lock(g_held_mu);
        if (!g_host_size.count(p)) { /* pinned now (not a pooled block taken after a failure) */
            g_host_size[p] = n;
            g_pin_live += n;
            if (g_pin_live > g_pin_peak) g_pin_peak = g_pin_live;
        }
        pool_hook();
    }
    if (zero) memset(p, 0, n);
    return p;
}

void *cu_host_alloc(size_t bytes) { return host_alloc(bytes, 1); }

/* Not zeroed: for memory written whole before it is read (the offload store). */
void *cu_host_alloc_raw(size_t bytes) { return host_alloc(bytes, 0); }

/* The pool given back: the held blocks once the queued work that may read
 * them is done, and the reservations that are done, freed with it; the
 * peak starts again from the live blocks, so pooling after this is bounded
 * by what is pinned from now on. A reservation still pinning stays. */
void cu_host_trim(void) {
    cuda_graph_break();
    cuda_get();
    host_release(1);
    pin_jobs_join(0);
    pool_drain();
    std::lock_guard<std::mutex> lock(g_held_mu);
    g_pin_peak = g_pin_live;
}

void cu_host_free(void *p) {
    if (!p) return;
    cuda_graph_break();
    size_t held;
    {
        std::lock_guard<std::mutex> lock(g_held_mu);
        g_host_held.push_back(p);
        held = g_host_held.size();
    }
    host_release(held > HOST_HELD_MAX);
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
    cuda_count_tag(layer, step); /* SKV_CUDA_COUNT=1's steps (cuda_count.cu) */
    g_tl.layer = layer;
    g_tl.step = step;
}

void cu_span_enable(int on) {
    if (on && !g_tl.on) {
        cuda_graph_break();
        cuda_ctx *c = cuda_get();
        if (!g_tl.base) CK(cudaEventCreate(&g_tl.base));
        CK(cudaStreamSynchronize(c->compute));
        CK(cudaEventRecord(g_tl.base, c->compute));
        CK(cudaEventSynchronize(g_tl.base));
        g_tl.base_host = skv_now();
    }
    g_tl.on = on;
    g_spans_on = on;
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

/* One wait: the compute stream joins the last gather on the fetch stream
 * (an event, cuda_after_fetch), so waiting for compute waits for the
 * gathers too (their work is bracketed by cuda_fetch_begin/end). The fetch
 * stream is waited for as well only when something is still queued there
 * after its last join (a timeline span's closing event, while spans are
 * on). No wait at all when both are idle already: a query is not a sync. */
void cu_sync(void) {
    cuda_graph_break();
    cuda_ctx *c = cuda_get();
    cudaStream_t st = cuda_after_fetch();
    /* spans on: the fetch stream first, so that its spans' closing events
     * are not left for span_drain's waits (the simulator times an event when
     * it runs) */
    if (g_tl.on && stream_busy(c->fetch)) CK(cudaStreamSynchronize(c->fetch));
    if (stream_busy(st)) CK(cudaStreamSynchronize(st));
    if (stream_busy(c->fetch)) CK(cudaStreamSynchronize(c->fetch));
    stage_drained();
}
