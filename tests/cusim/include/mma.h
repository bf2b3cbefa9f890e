/* mma.h for the CUDA simulator: WMMA fragments of the 16x16x16 shape with
 * bf16 or half inputs and f32 accumulators. Each lane holds the whole tile
 * (the fragment's mapping to lanes is opaque in CUDA, so no correct kernel
 * can tell); every *_sync call first meets the warp's other lanes, as the
 * hardware's warp-wide instruction does; the warp's first lane loads,
 * multiplies and stores, and the others take its fragments. Products are exact in f32 and summed in f32. */
#ifndef SKV_CUSIM_MMA_H
#define SKV_CUSIM_MMA_H
#include "../cusim.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the simulator has the 16x16x16 WMMA shape");
    static const int num_elements = 256;
    float v[256]; /* row-major: A (M, K), B (K, N), C (M, N) */
};

static inline float wmma_f(float x) { return x; }
static inline float wmma_f(__nv_bfloat16 x) { return __bfloat162float(x); }
static inline float wmma_f(__half x) { return __half2float(x); }

static inline void wmma_meet(const char *what) { cusim::warp_op(0, 0xffffffffu, 0, 0, 32, what); }

template <typename Use, typename T, typename L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm) {
    wmma_meet("wmma::load_matrix_sync");
    if (cusim::lane_id() != 0) {
        cusim::warp_fetch(f.v, sizeof f.v);
        return;
    }
    int col = std::is_same<L, col_major>::value;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) f.v[i * 16 + j] = wmma_f(col ? p[(size_t)j * ldm + i] : p[(size_t)i * ldm + j]);
    cusim::warp_publish(f.v, sizeof f.v);
}
template <typename T>
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, T> &f, const T *p, unsigned ldm, layout_t l) {
    wmma_meet("wmma::load_matrix_sync");
    if (cusim::lane_id() != 0) {
        cusim::warp_fetch(f.v, sizeof f.v);
        return;
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            f.v[i * 16 + j] = wmma_f(l == mem_col_major ? p[(size_t)j * ldm + i] : p[(size_t)i * ldm + j]);
    cusim::warp_publish(f.v, sizeof f.v);
}
template <typename T>
static inline void store_matrix_sync(T *p, const fragment<accumulator, 16, 16, 16, T> &f, unsigned ldm, layout_t l) {
    wmma_meet("wmma::store_matrix_sync");
    if (cusim::lane_id() != 0) return;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            T *q = l == mem_col_major ? p + (size_t)j * ldm + i : p + (size_t)i * ldm + j;
            *q = (T)f.v[i * 16 + j];
        }
}
template <typename Use, typename T, typename L>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, T v) {
    for (int i = 0; i < 256; i++) f.v[i] = wmma_f(v);
}
template <typename T>
static inline void fill_fragment(fragment<accumulator, 16, 16, 16, T> &f, T v) {
    for (int i = 0; i < 256; i++) f.v[i] = wmma_f(v);
}
template <typename TA, typename LA, typename LB, typename TC>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, TC> &d, const fragment<matrix_a, 16, 16, 16, TA, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, TA, LB> &b,
                            const fragment<accumulator, 16, 16, 16, TC> &c) {
    wmma_meet("wmma::mma_sync");
    if (cusim::lane_id() != 0) {
        cusim::warp_fetch(d.v, sizeof d.v);
        return;
    }
    float out[256];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = c.v[i * 16 + j];
            for (int k = 0; k < 16; k++) s = fmaf(a.v[i * 16 + k], b.v[k * 16 + j], s);
            out[i * 16 + j] = s;
        }
    memcpy(d.v, out, sizeof out);
    cusim::warp_publish(d.v, sizeof d.v);
}
} /* namespace wmma */
} /* namespace nvcuda */
#endif
