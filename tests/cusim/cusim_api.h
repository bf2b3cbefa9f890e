/* cusim_api.h: what a test asks of the CUDA simulator (tests/cusim/), from C
 * or C++: its counters (launches by kernel, host syncs, bytes copied each
 * way, device memory), the device's size, the order held stream work runs
 * in, and the faults it found. Linked into the simulated test binaries
 * only (the sim/ folder of a build); docs/TESTING.md describes the simulator. */
#ifndef SKV_CUSIM_API_H
#define SKV_CUSIM_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t launches;         /* kernel launches the runtime took and queued (not those a capture records) */
    uint64_t graph_launches;   /* cudaGraphLaunch calls */
    uint64_t graph_kernels;    /* kernels run from graphs (counted at the graph's launch) */
    uint64_t captured_kernels; /* kernel launches recorded into a stream capture, to run from a graph */
    uint64_t graph_instantiations; /* cudaGraphInstantiate calls that made an executable graph */
    uint64_t graph_updates;    /* cudaGraphExecUpdate calls that updated one in place */
    uint64_t lib_calls;        /* cuBLAS, cuSOLVER and CUB calls queued */
    uint64_t stream_syncs;     /* cudaStreamSynchronize */
    uint64_t device_syncs;     /* cudaDeviceSynchronize, and the device sync of cudaFree/cudaFreeHost */
    uint64_t event_syncs;      /* cudaEventSynchronize */
    uint64_t blocking_copies;  /* copies the host waits for: cudaMemcpy, device-to-pageable, host results */
    uint64_t host_syncs;       /* the sum of the four above */
    uint64_t event_waits;      /* cudaStreamWaitEvent */
    uint64_t bytes_h2d, bytes_d2h, bytes_d2d; /* bytes copied (host means pageable or pinned) */
    uint64_t bytes_memset;
    uint64_t allocs, frees;    /* device allocations and frees, sync and stream-ordered */
    uint64_t device_bytes;     /* live device bytes now (a block is counted free once its cudaFreeAsync is queued) */
    uint64_t device_peak;      /* the most live device bytes since the last reset */
    uint64_t pinned_bytes;     /* live pinned host bytes */
    uint64_t pinned_allocs;    /* cudaHostAlloc/cudaMallocHost calls that pinned a block */
    uint64_t pinned_allocs_other, pinned_bytes_other; /* those from another thread than the first API call's */
    uint64_t faults;           /* faults reported (the first sets the sticky error) */
    uint64_t copies;           /* copy calls queued: cudaMemcpy, cudaMemcpyAsync, cudaMemcpy2D(Async) */
} cusim_counters;

/* The counters since the last reset (device_bytes is not reset; the peak
 * restarts from it). */
void cusim_counters_get(cusim_counters *c);
void cusim_counters_reset(void);
/* Runs of kernels whose name starts with prefix (NULL: all), since the
 * last reset: direct launches, and a graph's kernels at each of its launches
 * (so a step's table is the same whether it ran eagerly or as a graph). */
uint64_t cusim_launches_of(const char *prefix);
/* Every kernel's launches since the last reset, one "name count" a line. */
void cusim_counters_print(void *file);

/* The device's memory in bytes (default 80 GiB, an H100's; SKV_CUSIM_DEVICE_BYTES
 * in the environment sets it at start). Refused below what is live. */
int cusim_set_device_bytes(size_t bytes);

/* How held stream work runs (default CUSIM_ORDER_ADVERSARIAL, also
 * SKV_CUSIM_ORDER=adversarial|random:SEED|eager in the environment):
 * - eager: every op runs when it is queued (a GPU with one stream);
 * - adversarial: work is held until the host waits for it (or too much is
 *   held); the stream waited on runs first and other streams' work as late as
 *   the events allow, so a consumer that misses its wait reads stale data;
 * - random: held like adversarial, and the next op is a seeded random pick of
 *   the streams that can run. */
enum { CUSIM_ORDER_EAGER = 0, CUSIM_ORDER_ADVERSARIAL = 1, CUSIM_ORDER_RANDOM = 2 };
void cusim_set_order(int mode, unsigned seed);

/* Faults: the message of the first since the last reset (the one that set
 * the sticky error; "" when none), and a count. A fault sets
 * CUDA's sticky error (every later call fails, as on a GPU); cusim_reset
 * clears it, frees every allocation and drops held work, as
 * cudaDeviceReset does (a test that plants a fault runs it in a child
 * process instead when the backend's context must survive). */
const char *cusim_last_fault(void);
void cusim_reset(void);

/* Whether a pointer is live device memory (1), mapped pinned host memory
 * (2) or neither (0). */
int cusim_pointer_kind(const void *p);

#ifdef __cplusplus
}
#endif

#endif
