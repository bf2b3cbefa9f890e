/* test_cusim_mma.cu: the CUDA simulator's stand-ins for three instructions the
 * prefill kernel (ops_attention.cu's k_flash_gqa) uses, held to their
 * definitions: mma.sync m16n8k16 (kernels/cuda/mma_util.h, emulated by
 * tests/cusim/include/cusim_mma.h) against a plain matrix product on the
 * host, the fragments loaded by the PTX ISA's layout, bf16 and f16, several
 * warps and chained calls; ldmatrix x4, plain and .trans, against the ISA's
 * fragment layout (a misaligned row a fault); and cp.async (tests/cusim/include/cuda_pipeline.h):
 * a copy lands at its wait, so a read before the wait is a fault, and the
 * exchange of an mma orders no shared memory (a read it does not order is a
 * race). Built by the simulator's rules only. */
#include "cuda_util.h"
#include "mma_util.h"

#include <cuda_pipeline.h>

#include <string>

#include "sim/sim_child.h"

extern "C" {
#include "testhelp.h"
}

/* Warp w: D = C + sum over r of A_w · B_wr, the fragments loaded from
 * global memory by the layout (g = lane >> 2, t = lane & 3):
 * A (W, 16, 16) row-major, B (W, R, 16, 8) as B[k][n], C and D (W, 16, 8). */
template <typename OpT>
__global__ void k_mma(const uint16_t *A, const uint16_t *B, const float *C, int reps, float *D) {
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const uint16_t *a = A + (size_t)w * 256;
    float *d = D + (size_t)w * 128;
    const float *c = C + (size_t)w * 128;
    uint32_t af[4];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1); /* a[0]: (g, 2t) a[1]: (g+8, 2t) a[2]: (g, 2t+8) */
        af[i] = (uint32_t)a[row * 16 + col] | (uint32_t)a[row * 16 + col + 1] << 16;
    }
    float acc[4];
    for (int i = 0; i < 4; i++) acc[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
    for (int r = 0; r < reps; r++) {
        const uint16_t *b = B + ((size_t)w * reps + r) * 128;
        uint32_t bf[2];
        for (int i = 0; i < 2; i++) {
            int k = 2 * t + 8 * i; /* b[0]: rows 2t, 2t+1 of column g; b[1]: rows 2t+8, 2t+9 */
            bf[i] = (uint32_t)b[k * 8 + g] | (uint32_t)b[(k + 1) * 8 + g] << 16;
        }
        mma_16816<OpT>(acc, af, bf);
    }
    for (int i = 0; i < 4; i++) d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = acc[i];
}

/* Lane 0 writes shared memory, the warp meets only at an mma, lane 1 reads
 * it (the race), or after a __syncwarp as well (no race). */
__global__ void k_mma_order(int sync, float *out) {
    __shared__ float cell[32];
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float c[4] = {0, 0, 0, 0};
    if (threadIdx.x == 0) cell[0] = 1.0f;
    mma_16816<__nv_bfloat16>(c, a, b);
    if (sync) __syncwarp();
    if (threadIdx.x == 1) out[0] = cell[0] + c[0];
}

/* Each thread copies 16 bytes of x into shared memory with cp.async (two
 * groups: the first half of the rows, then the second), waits for all but
 * the newest `keep` groups, and reads a neighbour's chunk of the half
 * `half` (0 or 1). */
__global__ void k_cp(const float *x, int keep, int half, float *out) {
    SKV_DYN_SHARED(float, buf); /* (2, 128 threads, 4) */
    int i = threadIdx.x;
    __pipeline_memcpy_async(buf + 4 * i, x + 4 * i, 16);
    __pipeline_commit();
    __pipeline_memcpy_async(buf + 512 + 4 * i, x + 512 + 4 * i, 16);
    __pipeline_commit();
    if (keep == 0) __pipeline_wait_prior(0);
    else if (keep == 1) __pipeline_wait_prior(1);
    __syncthreads();
    int j = (i + 1) % 128;
    for (int e = 0; e < 4; e++) out[4 * i + e] = buf[512 * half + 4 * j + e];
}

/* ldmatrix x4: shared memory holds four 8x8 matrices of 16-bit elements,
 * matrix m's row i at row 9m + i of a (36, 8 + pad) array (rows of 16 bytes
 * padded to 16 + 2·pad, so rows are not consecutive); element (m, i, j) =
 * 256m + 16i + j. Lane 8m + i gives that row (misalign: one element past
 * it, which is not 16-byte aligned); out[lane][r] the register r it got,
 * without and with .trans. */
__global__ void k_ldsm(int pad, int misalign, uint32_t *out) {
    __shared__ uint16_t sm[36 * 16];
    int lane = threadIdx.x, ld = 8 + pad;
    for (int m = 0; m < 4; m++)
        for (int i = lane; i < 64; i += 32) sm[(9 * m + i / 8) * ld + i % 8] = (uint16_t)(256 * m + 16 * (i / 8) + i % 8);
    __syncwarp();
    const uint16_t *row = sm + (9 * (lane >> 3) + (lane & 7)) * ld + misalign;
    uint32_t r[4], rt[4];
    ldsm_x4<false>(r, row);
    ldsm_x4<true>(rt, row);
    for (int m = 0; m < 4; m++) {
        out[lane * 8 + m] = r[m];
        out[lane * 8 + 4 + m] = rt[m];
    }
}

/* ---- host side ---- */

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float frand(void) { return test_frand(&rs); }

static uint16_t to16(float x, int f16) {
    return f16 ? __half_as_ushort(__float2half_rn(x)) : __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
static float from16(uint16_t x, int f16) {
    return f16 ? __half2float(__ushort_as_half(x)) : __bfloat162float(__ushort_as_bfloat16(x));
}

/* W warps, R chained products: the largest difference from the host's
 * product in double. */
static double mma_case(int f16, int W, int R) {
    size_t na = (size_t)W * 256, nb = (size_t)W * R * 128, nc = (size_t)W * 128;
    uint16_t *A = (uint16_t *)malloc(2 * na), *B = (uint16_t *)malloc(2 * nb);
    float *C = (float *)malloc(4 * nc), *D = (float *)malloc(4 * nc);
    for (size_t i = 0; i < na; i++) A[i] = to16(frand() * 4, f16);
    for (size_t i = 0; i < nb; i++) B[i] = to16(frand() * 4, f16);
    for (size_t i = 0; i < nc; i++) C[i] = frand();
    uint16_t *dA, *dB;
    float *dC, *dD;
    CK(cudaMalloc(&dA, 2 * na));
    CK(cudaMalloc(&dB, 2 * nb));
    CK(cudaMalloc(&dC, 4 * nc));
    CK(cudaMalloc(&dD, 4 * nc));
    CK(cudaMemcpy(dA, A, 2 * na, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B, 2 * nb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dC, C, 4 * nc, cudaMemcpyHostToDevice));
    if (f16) SKV_LAUNCH(k_mma<__half>, 1, 32 * W, 0, 0)(dA, dB, dC, R, dD);
    else SKV_LAUNCH(k_mma<__nv_bfloat16>, 1, 32 * W, 0, 0)(dA, dB, dC, R, dD);
    CK(cudaMemcpy(D, dD, 4 * nc, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int w = 0; w < W; w++)
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 8; n++) {
                double s = C[(size_t)w * 128 + m * 8 + n];
                for (int r = 0; r < R; r++)
                    for (int k = 0; k < 16; k++)
                        s += (double)from16(A[(size_t)w * 256 + m * 16 + k], f16) *
                             from16(B[((size_t)w * R + r) * 128 + k * 8 + n], f16);
                double e = fabs(s - D[(size_t)w * 128 + m * 8 + n]);
                if (e > worst) worst = e;
            }
    cudaFree(dA); cudaFree(dB); cudaFree(dC); cudaFree(dD);
    free(A); free(B); free(C); free(D);
    return worst;
}

/* cp.async: 0 when the neighbours' chunks read back right and no fault. */
static int cp_run(int keep, int half) {
    float h[1024], got[512], *dx, *dout;
    for (int i = 0; i < 1024; i++) h[i] = (float)i;
    CK(cudaMalloc(&dx, sizeof h));
    CK(cudaMalloc(&dout, sizeof got));
    CK(cudaMemcpy(dx, h, sizeof h, cudaMemcpyHostToDevice));
    SKV_LAUNCH(k_cp, 1, 128, 4096, 0)(dx, keep, half, dout);
    if (cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    for (int i = 0; i < 128; i++)
        for (int e = 0; e < 4; e++)
            if (got[4 * i + e] != h[512 * half + 4 * ((i + 1) % 128) + e]) return 2;
    return 0;
}
/* ldmatrix: 0 when every lane's registers hold the PTX ISA's elements: in
 * register m of lane l = 4q + t, matrix m's (row q, columns 2t and 2t + 1),
 * with .trans its (rows 2t and 2t + 1, column q), the first in the low half. */
static int ldsm_run(int pad, int misalign) {
    uint32_t got[256], *d;
    CK(cudaMalloc(&d, sizeof got));
    SKV_LAUNCH(k_ldsm, 1, 32, 0, 0)(pad, misalign, d);
    if (cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    cudaFree(d);
    for (int l = 0; l < 32; l++)
        for (int m = 0; m < 4; m++) {
            int q = l / 4, t = l % 4;
            uint32_t e = (uint32_t)(256 * m + 16 * q + 2 * t) | (uint32_t)(256 * m + 16 * q + 2 * t + 1) << 16;
            uint32_t et = (uint32_t)(256 * m + 16 * (2 * t) + q) | (uint32_t)(256 * m + 16 * (2 * t + 1) + q) << 16;
            if (got[l * 8 + m] != e || got[l * 8 + 4 + m] != et) return 2;
        }
    return 0;
}
static int order_run(int sync) {
    float *d;
    CK(cudaMalloc(&d, 4));
    SKV_LAUNCH(k_mma_order, 1, 32, 0, 0)(sync, d);
    return cudaDeviceSynchronize() != cudaSuccess;
}

static void expect(const char *what, int (*fn)(void), int fault, const char *needle) {
    int st = 0;
    std::string err = in_child(fn, &st);
    std::string first = err.substr(0, err.find('\n'));
    char msg[900];
    snprintf(msg, sizeof msg, "%s: status %d \"%.500s\"", what, st, first.c_str());
    test_cond(msg, fault ? st != 0 && err.find(needle) != std::string::npos
                         : st == 0 && err.find("cusim") == std::string::npos);
}

int main(void) {
    for (int f16 = 0; f16 < 2; f16++) {
        double e1 = mma_case(f16, 1, 1), e2 = mma_case(f16, 4, 3);
        char msg[200];
        snprintf(msg, sizeof msg,
                 "mma.sync m16n8k16 %s (1 warp, 1 product; 4 warps, 3 chained): the host's product within %.1e, %.1e",
                 f16 ? "f16" : "bf16", e1, e2);
        test_cond(msg, e1 < 1e-4 && e2 < 1e-4);
    }
    expect("cp.async waited for (wait_prior(0)): right, no fault", []() { return cp_run(0, 1); }, 0, NULL);
    expect("cp.async, wait_prior(1): the older group landed", []() { return cp_run(1, 0); }, 0, NULL);
    expect("cp.async, wait_prior(1): a read of the newest group is a fault", []() { return cp_run(1, 1); }, 1,
           "which no thread of the block has written");
    expect("cp.async never waited for: a read is a fault", []() { return cp_run(2, 0); }, 1,
           "which no thread of the block has written");
    expect("ldmatrix.m8n8.x4 and .trans: every lane's 4 registers hold the ISA's elements (rows of 16 bytes "
           "apart)", []() { return ldsm_run(0, 0); }, 0, NULL);
    expect("... rows padded to 32 bytes, not consecutive: the same", []() { return ldsm_run(8, 0); }, 0, NULL);
    expect("... a row not 16-byte aligned: a fault", []() { return ldsm_run(8, 1); }, 1, "not 16-byte aligned");
    expect("lane 1 reads lane 0's shared store after an mma only: a race", []() { return order_run(0); }, 1,
           "shared-memory race");
    expect("... and after a __syncwarp: no race", []() { return order_run(1); }, 0, NULL);
    return test_report("test_cusim_mma");
}
