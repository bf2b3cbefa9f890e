/* mma_util.h: the tensor cores' warp-wide matrix multiply-accumulate for the
 * kernels, PTX's mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
 * (sm_80 and later): D (16x8, f32) = A (16x16) · B (16x8) + C, the operands in
 * registers spread over the warp's 32 lanes.
 *
 * The fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
 * floating point type"), with g = lane >> 2 and t = lane & 3:
 *   A: 4 registers of 2 elements (the first in the low half): a[0] row g,
 *      columns 2t and 2t+1; a[1] row g+8, the same columns; a[2] row g,
 *      columns 2t+8 and 2t+9; a[3] row g+8, those columns;
 *   B: 2 registers: b[0] rows 2t and 2t+1 of column g; b[1] rows 2t+8 and
 *      2t+9 of column g;
 *   C, D: 4 floats: c[0], c[1] row g, columns 2t and 2t+1; c[2], c[3] row
 *      g+8, the same columns.
 * So the C fragments of two neighbouring 8-column tiles are, rounded and
 * packed pairwise, the A fragment of the 16 columns they span (flash
 * attention's P stays in registers).
 *
 * Under nvcc the helpers are inline PTX; compiled for the CUDA simulator
 * (tests/cusim/) they call its emulation of the same instruction
 * (tests/cusim/include/cusim_mma.h), which gathers the warp's fragments by
 * that layout. */
#ifndef SKV_MMA_UTIL_H
#define SKV_MMA_UTIL_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#ifndef __CUDACC__
#include <cusim_mma.h>
#endif

/* Two values rounded (to nearest even) to the operand type, packed as one
 * register: lo in the low 16 bits. */
template <typename OpT>
__device__ __forceinline__ uint32_t mma_pack(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t mma_pack<__nv_bfloat16>(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}
template <>
__device__ __forceinline__ uint32_t mma_pack<__half>(float lo, float hi) {
    return (uint32_t)__half_as_ushort(__float2half_rn(lo)) | (uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16;
}

/* c = A·B + c for the warp (every lane calls it, converged). */
template <typename OpT>
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef __CUDACC__
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    cusim::mma_m16n8k16(c, a, b, c, 0);
#endif
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef __CUDACC__
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    cusim::mma_m16n8k16(c, a, b, c, 1);
#endif
}

/* ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16: the warp loads four 8x8
 * matrices of 16-bit elements from shared memory. Lane 8m + i passes row i
 * of matrix m (16 bytes, 16-byte aligned); register m of lane (g, t) then
 * holds row g, columns 2t and 2t+1 of matrix m (with trans: rows 2t and
 * 2t+1 of column g), the first in the low half: an mma B fragment's
 * register read from keys-major rows (K, without trans) or from rows along
 * the reduction (V, with it): ldsm_x4<false> and ldsm_x4<true>. Every lane
 * calls it, converged. */
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const uint16_t *row) {
#ifdef __CUDACC__
    uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#else
    cusim::ldmatrix_x4(r, row, TRANS);
#endif
}

#endif
