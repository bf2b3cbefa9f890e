/* cuda_fp16.h for the CUDA simulator: IEEE binary16 with the hardware's
 * conversions (round to nearest even, subnormals, overflow to infinity). */
#ifndef SKV_CUSIM_CUDA_FP16_H
#define SKV_CUSIM_CUDA_FP16_H
#include "../cusim.h"

struct __half {
    uint16_t x;
};
typedef __half half;

static inline __half __float2half_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    uint16_t h;
    if (a >= 0x7f800000u) {
        h = (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u));
    } else if (a >= 0x477ff000u) { /* rounds to 65520 or more: infinity */
        h = (uint16_t)(sign | 0x7c00u);
    } else if (a < 0x38800000u) { /* below the smallest normal half: a subnormal or zero */
        int e = (int)(a >> 23);
        if (e < 102) {
            h = (uint16_t)sign;
        } else {
            uint32_t m = (a & 0x7fffffu) | 0x800000u;
            int shift = 126 - e; /* the half subnormal's unit is 2^-24 */
            uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
            if (rem > halfway || (rem == halfway && (q & 1u))) q++;
            h = (uint16_t)(sign | q);
        }
    } else {
        uint32_t e = (a >> 23) - 112, m = a & 0x7fffffu;
        uint32_t q = (e << 10) | (m >> 13), rem = m & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;
        h = (uint16_t)(sign | q);
    }
    __half r;
    r.x = h;
    return r;
}
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline float __half2float(__half v) {
    uint32_t sign = (uint32_t)(v.x & 0x8000u) << 16, e = (v.x >> 10) & 0x1fu, m = v.x & 0x3ffu, u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        if (!m) {
            u = sign;
        } else {
            float f = (float)m * (1.0f / 16777216.0f);
            memcpy(&u, &f, 4);
            u |= sign;
        }
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
static inline __half __ushort_as_half(unsigned short x) {
    __half h;
    h.x = x;
    return h;
}
#endif
