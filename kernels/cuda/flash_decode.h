/* flash_decode.h: split-K flash-decoding of one GQA group over a range of
 * rows, the body that both decode attentions run: dense's k_flash_decode
 * (ops_attention.cu: a block a (part, KV head, sequence) of the caches) and
 * ShadowKV's k_sk_step_attend (ops_sk_step.cu: a block a (part, job) of its
 * bf16 attention rows).
 *
 * A row group of `tpr` lanes owns a row at a time: each lane loads its
 * 16-byte slices of the row's key and value (4 floats, 8 halves or 8 bf16;
 * one element where the rows are not aligned for that), the group's dot
 * products are summed over the row group by shuffles, and each row group
 * keeps its own online softmax (scores in base 2, log2(e) folded into the
 * query's scale). The row groups of a warp merge by shuffles, the warps
 * through shared memory. Of several parts, each writes a partial result
 * (unnormalized output, max, sum) and the part that finishes last (a
 * counter the caller names) merges them and resets the counter, so the
 * merge costs no launch. */
#ifndef SKV_FLASH_DECODE_H
#define SKV_FLASH_DECODE_H

#include "cuda_util.h"

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#define FD_WARPS 4

/* A bf16 value (ShadowKV's attention rows, SKV_ELT_BF16): its 16 bits, a
 * type of its own so that the overloads below tell it from IEEE half. */
struct bf16r {
    uint16_t u;
};

/* A cache element as f32: the f32 cache's own, a half-precision (--f16-kv)
 * element or a bf16 one widened exactly. */
__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ float ld(const bf16r *p) { return km_bf16_to_f32(p->u); }

/* 16 bytes of a row, loaded at once (LDG.128 under nvcc). */
#ifdef __CUDACC__
typedef uint4 fd_raw;
__device__ __forceinline__ float fd_as_float(unsigned w) { return __uint_as_float(w); }
__device__ __forceinline__ float fd_half(unsigned short b) { return __half2float(__ushort_as_half(b)); }
#else
struct __align__(16) fd_raw {
    unsigned x, y, z, w;
};
static inline float fd_as_float(unsigned w) {
    float f;
    memcpy(&f, &w, 4);
    return f;
}
static inline float fd_half(unsigned short b) {
    __half h;
    h.x = b;
    return __half2float(h);
}
#endif
/* A cache row is read once a step: a streaming load (evict first), so it
 * does not push out what the step reads again. */
__device__ __forceinline__ fd_raw fd_stream(const void *p) {
#ifdef __CUDACC__
    return __ldcs((const uint4 *)p);
#else
    return vec_ld((const fd_raw *)p);
#endif
}
__device__ __forceinline__ unsigned fd_word(const fd_raw &r, int c) {
    return c == 0 ? r.x : c == 1 ? r.y : c == 2 ? r.z : r.w;
}

/* A lane's slice of a row: VEC elements of T, element c as f32. */
template <typename T, int VEC>
struct fd_frag;
template <>
struct fd_frag<float, 4> {
    fd_raw r;
    __device__ __forceinline__ void load(const float *p) { r = fd_stream(p); }
    __device__ __forceinline__ void zero() { r.x = r.y = r.z = r.w = 0u; }
    __device__ __forceinline__ float get(int c) const { return fd_as_float(fd_word(r, c)); }
};
/* A 16-bit element's bits as f32: IEEE half, or bf16 (exact: a shift). */
__device__ __forceinline__ float fd_widen(const __half *, unsigned short b) { return fd_half(b); }
__device__ __forceinline__ float fd_widen(const bf16r *, unsigned short b) { return fd_as_float((unsigned)b << 16); }
template <typename T>
struct fd_frag<T, 8> { /* T: __half or bf16r */
    fd_raw r;
    __device__ __forceinline__ void load(const T *p) { r = fd_stream(p); }
    __device__ __forceinline__ void zero() { r.x = r.y = r.z = r.w = 0u; }
    __device__ __forceinline__ float get(int c) const {
        return fd_widen((const T *)0, (unsigned short)(fd_word(r, c >> 1) >> ((c & 1) * 16)));
    }
};
template <typename T>
struct fd_frag<T, 1> {
    float x;
    __device__ __forceinline__ void load(const T *p) { x = ld(p); }
    __device__ __forceinline__ void zero() { x = 0.0f; }
    __device__ __forceinline__ float get(int) const { return x; }
};

/* One kernel configuration: the cache's element type, elements a load
 * (VEC), loads a lane covers of a row (NV), and the largest group size
 * (GM >= G) its registers hold. */
template <typename T_, int VEC_, int NV_, int GM_>
struct fd_cfg {
    typedef T_ T;
    /* E: elements a lane holds of a row; U: rows a row group loads ahead (fewer where a row's slice, or the
     * group's accumulators, take many registers) */
    enum { VEC = VEC_, NV = NV_, GM = GM_, E = VEC_ * NV_, U = GM_ >= 8 || NV_ * (VEC_ == 1 ? 1 : 4) >= 8 ? 2 : 4 };
};

/* Blocks a multiprocessor holds (launch bounds, so registers a thread):
 * four, two for groups over 4 (their accumulators), three for groups of 3-4
 * over unaligned rows (one element a load: 8 loads a row and their
 * indices; in 128 registers those spill). */
#define FD_MIN_BLOCKS(C) ((C::GM) >= 8 ? 2 : (C::VEC) == 1 && (C::GM) >= 4 ? 3 : 4)

/* 1, 2, 4, ...: the least power of two >= x (lanes a row). */
static inline int fd_pow2(int x) {
    int p = 1;
    while (p < x) p <<= 1;
    return p;
}

/* Part p of `parts` of one group's attention: q (G, d) times qscale (1/sqrt(d)
 * in base 2) over rows [r0, r1) of K and V (rows `stride` elements apart),
 * row groups of tpr lanes. parts == 1: out (G, d) written. Otherwise part p
 * is task t0 + p of po (tasks, G, d) and pml (tasks, G, 2: max, sum a
 * head), and the last part to finish (counter cnt[ci], 0 before and reset
 * by it)
 * merges every part into out. sh:
 * FD_WARPS*G*(d+2) floats of dynamic shared memory; last: a shared int.
 * Every thread of the block calls it. */
template <typename C>
__device__ __forceinline__ void fd_attend(const typename C::T *K, const typename C::T *V, int stride, int r0, int r1,
                                          const float *q, float qscale, int G, int d, int tpr, int p, int parts,
                                          float *po, float *pml, size_t t0, unsigned *cnt, int ci, float *out,
                                          size_t qoff, float *sh, int *last) {
    typedef typename C::T T;
    enum { VEC = C::VEC, NV = C::NV, GM = C::GM, E = C::E, U = C::U };
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int rpw = 32 / tpr, nrg = FD_WARPS * rpw, rg = warp * rpw + lane / tpr, sub = lane % tpr;
    int nvec = (d + VEC - 1) / VEC;
    float qr[GM][E], acc[GM][E], m[GM], l[GM];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < NV; j++)
#pragma unroll
            for (int c = 0; c < VEC; c++) {
                int e = (sub + j * tpr) * VEC + c;
                qr[g][j * VEC + c] = g < G && e < d ? q[(size_t)g * d + e] * qscale : 0.0f;
                acc[g][j * VEC + c] = 0.0f;
            }
    }
    /* rows base + u*nrg + rg; the loop's count is the block's, so every lane reaches the shuffles */
    for (int base = r0; base < r1; base += nrg * U) {
        fd_frag<T, VEC> kf[U][NV], vf[U][NV];
        float sc[U][GM];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int row = base + u * nrg + rg;
#pragma unroll
            for (int j = 0; j < NV; j++) {
                int vi = sub + j * tpr;
                if (row < r1 && vi < nvec) {
                    kf[u][j].load(K + (size_t)row * stride + vi * VEC);
                    vf[u][j].load(V + (size_t)row * stride + vi * VEC);
                } else {
                    kf[u][j].zero();
                    vf[u][j].zero();
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int g = 0; g < GM; g++) {
                float dot = 0.0f;
#pragma unroll
                for (int j = 0; j < NV; j++)
#pragma unroll
                    for (int c = 0; c < VEC; c++) dot += qr[g][j * VEC + c] * kf[u][j].get(c);
                sc[u][g] = dot;
            }
        for (int o = tpr / 2; o; o >>= 1)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int g = 0; g < GM; g++)
                    if (g < G) sc[u][g] += __shfl_xor_sync(0xffffffffu, sc[u][g], o);
        /* the online softmax of the row group's U rows: one rescale for them */
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g >= G) continue;
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (base + u * nrg + rg >= r1) sc[u][g] = -INFINITY;
                mx = fmaxf(mx, sc[u][g]);
            }
            float f = mx == -INFINITY ? 1.0f : exp2f(m[g] - mx), sum = 0.0f;
#pragma unroll
            for (int u = 0; u < U; u++) {
                sc[u][g] = mx == -INFINITY ? 0.0f : exp2f(sc[u][g] - mx);
                sum += sc[u][g];
            }
            l[g] = l[g] * f + sum;
            m[g] = mx;
#pragma unroll
            for (int e = 0; e < E; e++) acc[g][e] *= f;
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < NV; j++)
#pragma unroll
                for (int c = 0; c < VEC; c++) {
                    float v = vf[u][j].get(c);
#pragma unroll
                    for (int g = 0; g < GM; g++) acc[g][j * VEC + c] += sc[u][g] * v;
                }
    }
    /* the warp's row groups merged (lanes tpr apart hold the same elements) */
    for (int o = tpr; o < 32; o <<= 1)
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g >= G) continue;
            float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo = __shfl_xor_sync(0xffffffffu, l[g], o);
            float mn = fmaxf(m[g], mo);
            float fa = m[g] == -INFINITY ? 0.0f : exp2f(m[g] - mn), fb = mo == -INFINITY ? 0.0f : exp2f(mo - mn);
            l[g] = l[g] * fa + lo * fb;
            m[g] = mn;
#pragma unroll
            for (int e = 0; e < E; e++) {
                float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
                acc[g][e] = acc[g][e] * fa + ao * fb;
            }
        }
    float *sml = sh + (size_t)FD_WARPS * G * d;
    if (lane < tpr)
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g >= G) continue;
#pragma unroll
            for (int j = 0; j < NV; j++)
#pragma unroll
                for (int c = 0; c < VEC; c++) {
                    int e = (sub + j * tpr) * VEC + c;
                    if (e < d) sh[((size_t)warp * G + g) * d + e] = acc[g][j * VEC + c];
                }
            if (lane == 0) {
                sml[(warp * G + g) * 2] = m[g];
                sml[(warp * G + g) * 2 + 1] = l[g];
            }
        }
    __syncthreads();
    /* the warps merged: output element x = g*d + e of the group */
    for (int x = tid; x < G * d; x += blockDim.x) {
        int g = x / d;
        float M = -INFINITY;
        for (int w = 0; w < FD_WARPS; w++) M = fmaxf(M, sml[(w * G + g) * 2]);
        float L = 0.0f, O = 0.0f;
        for (int w = 0; w < FD_WARPS; w++) {
            float mw = sml[(w * G + g) * 2];
            float fw = mw == -INFINITY ? 0.0f : exp2f(mw - M);
            L += sml[(w * G + g) * 2 + 1] * fw;
            O += sh[(size_t)w * G * d + x] * fw;
        }
        if (parts == 1) {
            out[qoff + x] = L > 0 ? O / L : 0.0f;
        } else {
            po[(t0 + p) * G * d + x] = O;
            if (x % d == 0) {
                pml[((t0 + p) * G + g) * 2] = M;
                pml[((t0 + p) * G + g) * 2 + 1] = L;
            }
        }
    }
    if (parts == 1) return;
    /* the last part to finish merges every part's result */
    __threadfence();
    __syncthreads();
    if (tid == 0) *last = atomicAdd(&cnt[ci], 1u) == (unsigned)parts - 1;
    __syncthreads();
    if (!*last) return;
    __threadfence();
    const volatile float *vpo = po, *vpml = pml;
    for (int x = tid; x < G * d; x += blockDim.x) {
        int g = x / d;
        float M = -INFINITY;
        for (int pp = 0; pp < parts; pp++) M = fmaxf(M, vpml[((t0 + pp) * G + g) * 2]);
        float L = 0.0f, O = 0.0f;
        for (int pp = 0; pp < parts; pp++) {
            float mp = vpml[((t0 + pp) * G + g) * 2];
            float fp = mp == -INFINITY ? 0.0f : exp2f(mp - M);
            L += vpml[((t0 + pp) * G + g) * 2 + 1] * fp;
            O += vpo[(t0 + pp) * G * d + x] * fp;
        }
        out[qoff + x] = L > 0 ? O / L : 0.0f;
    }
    if (tid == 0) cnt[ci] = 0u;
}

#endif
