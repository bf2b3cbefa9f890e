/* cuda_bf16.h for the CUDA simulator: bfloat16 with the hardware's
 * conversion (round to nearest even; a NaN becomes the canonical 0x7fff). */
#ifndef SKV_CUSIM_CUDA_BF16_H
#define SKV_CUSIM_CUDA_BF16_H
#include "../cusim.h"

struct __nv_bfloat16 {
    uint16_t x;
};
typedef __nv_bfloat16 nv_bfloat16;

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.x = 0x7fffu;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        r.x = (uint16_t)(u >> 16);
    }
    return r;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 v) {
    uint32_t u = (uint32_t)v.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) {
    __nv_bfloat16 h;
    h.x = x;
    return h;
}
#endif
