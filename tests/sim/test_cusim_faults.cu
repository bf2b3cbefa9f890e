/* test_cusim_faults.cu: proof that the CUDA simulator (tests/cusim) catches
 * what a GPU would: eight faults planted in copies of skv's kernel shapes
 * and call sites, each run in a child process and required to fail with a
 * message that names it; beside each, the same code without the fault,
 * which must run clean and right. Also the counters and a graph's replay.
 * Built by the simulator's rules only (compiled by clang++ with the
 * coverage hooks, like kernels/cuda/). */
#include "cuda_util.h"

#include <signal.h>
#include <sys/wait.h>

#include <string>

extern "C" {
#include "testhelp.h"
}

/* ---- kernels: the right form and the planted fault ---- */

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

/* Runs fn in a child process; returns what it wrote on stderr, and its
 * status in *st (the exit code, or 128 + the signal). */
static std::string in_child(int (*fn)(void), int *st) {
    int p[2];
    if (pipe(p)) return "pipe failed";
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        dup2(p[1], 2);
        alarm(60);
        _exit(fn());
    }
    close(p[1]);
    std::string out;
    char buf[512];
    ssize_t k;
    while ((k = read(p[0], buf, sizeof buf)) > 0) out.append(buf, (size_t)k);
    close(p[0]);
    int ws = 0;
    waitpid(pid, &ws, 0);
    *st = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    return out;
}

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
        cusim_counters c;
        cusim_counters_get(&c);
        int held = cusim_pointer_kind(h) == 2;
        uint64_t syncs = c.host_syncs;
        cu_sync();
        float *e = (float *)cu_alloc(16); /* finds both streams idle: the held block goes */
        int gone = cusim_pointer_kind(h) == 0;
        cusim_counters_get(&c);
        char msg[300];
        snprintf(msg, sizeof msg, "cu_free and cu_host_free while a gather reads the buffers: %llu host syncs, the "
                 "pinned block held (%d) and freed at the next alloc after a sync (%d), no fault (%llu)",
                 (unsigned long long)syncs, held, gone, (unsigned long long)c.faults);
        test_cond(msg, syncs == 0 && held && gone && c.faults == 0 && c.frees >= 1);
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
    return test_report("test_cusim_faults");
}
