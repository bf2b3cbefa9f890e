/* cusim_mma.h for the CUDA simulator: the warp-wide matrix instruction
 * mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, which
 * kernels reach through kernels/cuda/mma_util.h (inline PTX under nvcc).
 *
 * The fragments are the PTX ISA's ("Matrix Fragments for mma.m16n8k16 with
 * floating point type"): with g = lane >> 2 and t = lane & 3,
 *   A (16x16, row): a0..a7 in 4 registers of 2 (low half first): row g for
 *      a0,a1,a4,a5 and g+8 for a2,a3,a6,a7; column 2t + (i & 1), plus 8 for
 *      i >= 4;
 *   B (16x8, col):  b0..b3 in 2 registers: row 2t + (i & 1), plus 8 for
 *      i >= 2; column g;
 *   C, D (16x8):    c0..c3 f32: row g for c0,c1 and g+8 for c2,c3; column
 *      2t + (i & 1).
 * Every lane gives its A and B registers at a meeting of the whole warp
 * (cusim::warp_exchange, which like the instruction orders no memory), then
 * computes its own four D elements from the gathered fragments: f32 products
 * of the widened inputs, summed with fmaf in k order onto C (the tensor
 * core's order differs: equal within f32 rounding, not bit for bit). */
#ifndef SKV_CUSIM_MMA_PTX_H
#define SKV_CUSIM_MMA_PTX_H
#include "../cusim.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace cusim {
static inline float mma_in(uint32_t reg, int hi, int f16) {
    uint16_t x = (uint16_t)(hi ? reg >> 16 : reg & 0xffffu);
    if (f16) {
        __half h;
        h.x = x;
        return __half2float(h);
    }
    __nv_bfloat16 b;
    b.x = x;
    return __bfloat162float(b);
}

/* d = A·B + c for the warp's fragments (f16: .f16 inputs, else .bf16). */
static inline void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], int f16) {
    struct frag {
        uint32_t a[4], b[2];
    } mine = {{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, all[32];
    warp_exchange(&mine, sizeof mine, all, f16 ? "mma.sync.m16n8k16.f16" : "mma.sync.m16n8k16.bf16");
    int lane = lane_id(), g = lane >> 2, t = lane & 3;
    float out[4];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float s = c[i];
        for (int k = 0; k < 16; k++) {
            /* A(row, k): lane (row % 8, (k % 8) / 2), register (row >= 8) + 2 (k >= 8), half k & 1 */
            const frag &fa = all[(row % 8) * 4 + (k % 8) / 2];
            float av = mma_in(fa.a[(row >= 8) + 2 * (k >= 8)], k & 1, f16);
            /* B(k, col): lane (col, (k % 8) / 2), register k >= 8, half k & 1 */
            const frag &fb = all[col * 4 + (k % 8) / 2];
            float bv = mma_in(fb.b[k >= 8], k & 1, f16);
            s = fmaf(av, bv, s);
        }
        out[i] = s;
    }
    for (int i = 0; i < 4; i++) d[i] = out[i];
}

/* ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16: four 8x8 matrices of
 * 16-bit elements from shared memory, lane 8m + i giving the address of
 * row i of matrix m (16 bytes, 16-byte aligned). Register m of lane l holds
 * two elements of matrix m, the first in the low half: row l / 4, columns
 * 2(l % 4) and 2(l % 4) + 1; with trans, rows 2(l % 4) and 2(l % 4) + 1 of
 * column l / 4. The warp meets to exchange the addresses (the instruction
 * orders no memory), then each lane reads its elements. */
static inline void ldmatrix_x4(uint32_t r[4], const void *row, int trans) {
    const char *mine = (const char *)row, *all[32];
    const char *what = trans ? "ldmatrix.m8n8.x4.trans" : "ldmatrix.m8n8.x4";
    shared_check(mine, 16, what);
    warp_exchange(&mine, sizeof mine, all, what);
    int lane = lane_id(), q = lane / 4, t = lane % 4;
    for (int m = 0; m < 4; m++) {
        uint16_t e0, e1;
        if (!trans) {
            const uint16_t *rw = (const uint16_t *)all[8 * m + q];
            e0 = rw[2 * t];
            e1 = rw[2 * t + 1];
        } else {
            e0 = ((const uint16_t *)all[8 * m + 2 * t])[q];
            e1 = ((const uint16_t *)all[8 * m + 2 * t + 1])[q];
        }
        r[m] = (uint32_t)e0 | (uint32_t)e1 << 16;
    }
}
} /* namespace cusim */
#endif
