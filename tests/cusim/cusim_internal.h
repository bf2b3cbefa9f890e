/* cusim_internal.h: what the simulator's runtime (cusim.cpp) lends its
 * library stand-ins (cusim_libs.cpp: cuBLAS, cuSOLVER, CUB): queueing work
 * on a stream, checking that a range is memory the device can reach, host
 * waits, and faults. */
#ifndef SKV_CUSIM_INTERNAL_H
#define SKV_CUSIM_INTERNAL_H

#include "cusim.h"

#include <functional>

namespace cusim {

/* The simulator's lock, held by every API call (recursive). */
struct api_lock {
    api_lock();
    ~api_lock();
};

/* The sticky error, if a fault set one (every call returns it). */
cudaError_t sticky(void);
/* Records err as the last error and returns it. */
cudaError_t set_error(cudaError_t err);

/* Queues fn on stream s as one library call named name (counted in
 * lib_calls); cudaSuccess or why not. */
cudaError_t enqueue_lib(cudaStream_t s, const char *name, std::function<void()> fn);
/* Waits, as the host, for everything queued on s (a host result: counted
 * as a blocking copy). */
cudaError_t host_wait(cudaStream_t s);

/* Whether [p, p+n) lies in one live device allocation or mapped pinned
 * memory; when not, reports a fault naming call and what, and returns 0. */
int device_range(const void *p, size_t n, const char *call, const char *what);

/* Reports a fault: prints "cusim: ..." on stderr, keeps it as the last
 * fault, counts it and sets the sticky error err. */
void fault(cudaError_t err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

} /* namespace cusim */

#endif
