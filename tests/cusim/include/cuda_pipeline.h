/* cuda_pipeline.h for the CUDA simulator: the cp.async primitives. A copy
 * is checked when issued and lands when its thread waits for its commit
 * group (cusim.cpp's pipeline_copy): a read of the destination before the
 * wait finds the old bytes, or unwritten shared memory, which is a fault. */
#ifndef SKV_CUSIM_CUDA_PIPELINE_H
#define SKV_CUSIM_CUDA_PIPELINE_H
#include "../cusim.h"

static inline void __pipeline_memcpy_async(void *dst_shared, const void *src_global, size_t size_and_align,
                                           size_t zfill = 0) {
    cusim::pipeline_copy(dst_shared, src_global, size_and_align, zfill);
}
static inline void __pipeline_commit(void) { cusim::pipeline_commit(); }
static inline void __pipeline_wait_prior(size_t prior) { cusim::pipeline_wait_prior(prior); }
#endif
