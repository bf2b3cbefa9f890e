/* cub/cub.cuh for the CUDA simulator: DeviceRadixSort::SortKeys (unsigned
 * keys, a bit range), computed by a stable sort on the stream. */
#ifndef SKV_CUSIM_CUB_H
#define SKV_CUSIM_CUB_H
#include "../../cusim.h"

namespace cusim {
cudaError_t radix_sort_u64(void *tmp, size_t &tmp_bytes, const unsigned long long *in, unsigned long long *out, int n,
                           int begin_bit, int end_bit, cudaStream_t s);
cudaError_t radix_sort_u32(void *tmp, size_t &tmp_bytes, const unsigned *in, unsigned *out, int n, int begin_bit,
                           int end_bit, cudaStream_t s);
}

namespace cub {
struct DeviceRadixSort {
    static cudaError_t SortKeys(void *tmp, size_t &tmp_bytes, const unsigned long long *in, unsigned long long *out,
                                int n, int begin_bit = 0, int end_bit = 64, cudaStream_t s = 0) {
        return cusim::radix_sort_u64(tmp, tmp_bytes, in, out, n, begin_bit, end_bit, s);
    }
    static cudaError_t SortKeys(void *tmp, size_t &tmp_bytes, const unsigned *in, unsigned *out, int n,
                                int begin_bit = 0, int end_bit = 32, cudaStream_t s = 0) {
        return cusim::radix_sort_u32(tmp, tmp_bytes, in, out, n, begin_bit, end_bit, s);
    }
};
} /* namespace cub */
#endif
