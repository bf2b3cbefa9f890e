/* cusim_libs.cpp: the cuBLAS, cuSOLVER and CUB calls of the CUDA backend
 * for the simulator, each queued on its handle's stream and computed with
 * OpenBLAS, LAPACKE and a stable sort. Every operand is checked to be
 * device memory of the size the call reads or writes. */
#include "cusim_internal.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <vector>

#include "cub/cub.cuh"
#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cusolverDn.h"

struct cusim_blas {
    cudaStream_t s = 0;
    int device_pointers = 0;
};
struct cusim_solver {
    cudaStream_t s = 0;
};

using namespace cusim;

static size_t extent(int rows, int cols, int ld) { return rows && cols ? (size_t)(cols - 1) * ld + rows : 0; }

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = new cusim_blas;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    h->s = s;
    return CUBLAS_STATUS_SUCCESS;
}
/* The GEMMs here need no workspace: it is only checked to be device memory. */
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *workspace, size_t bytes) {
    api_lock l;
    (void)h;
    if (bytes && !device_range(workspace, bytes, "cublasSetWorkspace", "workspace")) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
    (void)h;
    (void)m;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t m) {
    h->device_pointers = m == CUBLAS_POINTER_MODE_DEVICE;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

/* The operands of a GEMM: (rows, cols) as stored, column-major. */
static int gemm_check(const char *call, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      const void *A, int lda, size_t asz, const void *B, int ldb, size_t bsz, void *C, int ldc,
                      size_t csz) {
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1)) {
        fprintf(stderr, "cusim: %s: bad sizes (m %d, n %d, k %d, lda %d, ldb %d, ldc %d)\n", call, m, n, k, lda, ldb,
                ldc);
        return 0;
    }
    return device_range(A, extent(ar, ac, lda) * asz, call, "A") &&
           device_range(B, extent(br, bc, ldb) * bsz, call, "B") &&
           device_range(C, extent(m, n, ldc) * csz, call, "C");
}

static CBLAS_TRANSPOSE tr(cublasOperation_t t) { return t == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
    api_lock l;
    if (sticky()) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (h->device_pointers) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!gemm_check("cublasSgemm", ta, tb, m, n, k, A, lda, 4, B, ldb, 4, C, ldc, 4))
        return CUBLAS_STATUS_INVALID_VALUE;
    float al = *alpha, be = *beta;
    enqueue_lib(h->s, "cublasSgemm", [=]() {
        if (!gemm_check("cublasSgemm (when it ran)", ta, tb, m, n, k, A, lda, 4, B, ldb, 4, C, ldc, 4)) return;
        if (m && n) cblas_sgemm(CblasColMajor, tr(ta), tr(tb), m, n, k, al, A, lda, B, ldb, be, C, ldc);
    });
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const double *alpha, const double *A, int lda, const double *B, int ldb,
                           const double *beta, double *C, int ldc) {
    api_lock l;
    if (sticky()) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (h->device_pointers) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!gemm_check("cublasDgemm", ta, tb, m, n, k, A, lda, 8, B, ldb, 8, C, ldc, 8))
        return CUBLAS_STATUS_INVALID_VALUE;
    double al = *alpha, be = *beta;
    enqueue_lib(h->s, "cublasDgemm", [=]() {
        if (!gemm_check("cublasDgemm (when it ran)", ta, tb, m, n, k, A, lda, 8, B, ldb, 8, C, ldc, 8)) return;
        if (m && n) cblas_dgemm(CblasColMajor, tr(ta), tr(tb), m, n, k, al, A, lda, B, ldb, be, C, ldc);
    });
    return CUBLAS_STATUS_SUCCESS;
}

static size_t type_size(cudaDataType t) {
    return t == CUDA_R_32F ? 4 : t == CUDA_R_64F ? 8 : t == CUDA_R_16F || t == CUDA_R_16BF ? 2 : 0;
}

/* A stored operand widened to f32 (bf16 and half exactly). */
static std::vector<float> widen(const void *p, cudaDataType t, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        if (t == CUDA_R_32F) v[i] = ((const float *)p)[i];
        else if (t == CUDA_R_16BF) v[i] = __bfloat162float(((const __nv_bfloat16 *)p)[i]);
        else v[i] = __half2float(((const __half *)p)[i]);
    }
    return v;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    api_lock l;
    (void)algo;
    if (sticky()) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (h->device_pointers || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F || at == CUDA_R_64F ||
        bt == CUDA_R_64F || !type_size(at) || !type_size(bt))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!gemm_check("cublasGemmEx", ta, tb, m, n, k, A, lda, type_size(at), B, ldb, type_size(bt), C, ldc, 4))
        return CUBLAS_STATUS_INVALID_VALUE;
    float al = *(const float *)alpha, be = *(const float *)beta;
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    enqueue_lib(h->s, "cublasGemmEx", [=]() {
        if (!gemm_check("cublasGemmEx (when it ran)", ta, tb, m, n, k, A, lda, type_size(at), B, ldb, type_size(bt),
                        C, ldc, 4))
            return;
        if (!m || !n) return;
        std::vector<float> a = widen(A, at, extent(ar, ac, lda)), b = widen(B, bt, extent(br, bc, ldb));
        cblas_sgemm(CblasColMajor, tr(ta), tr(tb), m, n, k, al, a.data(), lda, b.data(), ldb, be, (float *)C, ldc);
    });
    return CUBLAS_STATUS_SUCCESS;
}

/* cublas{S,D}nrm2: in host pointer mode the call returns when the result is
 * there (the host waits); in device pointer mode it lands in device memory in
 * stream order and the call does not wait. */
template <typename T>
static cublasStatus_t nrm2(cublasHandle_t h, int n, const T *x, int incx, T *result, const char *name) {
    api_lock l;
    if (sticky()) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (n > 0 && (incx < 1 || !device_range(x, ((size_t)(n - 1) * incx + 1) * sizeof(T), name, "x")))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (h->device_pointers && !device_range(result, sizeof(T), name, "result")) return CUBLAS_STATUS_INVALID_VALUE;
    T *out = result;
    enqueue_lib(h->s, name, [=]() {
        if (n <= 0) *out = 0;
        else if constexpr (sizeof(T) == 8) *out = cblas_dnrm2(n, (const double *)x, incx);
        else *out = cblas_snrm2(n, (const float *)x, incx);
    });
    if (h->device_pointers) return CUBLAS_STATUS_SUCCESS;
    host_wait(h->s);
    return sticky() ? CUBLAS_STATUS_EXECUTION_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDnrm2(cublasHandle_t h, int n, const double *x, int incx, double *result) {
    return nrm2(h, n, x, incx, result, "cublasDnrm2");
}

cublasStatus_t cublasSnrm2(cublasHandle_t h, int n, const float *x, int incx, float *result) {
    return nrm2(h, n, x, incx, result, "cublasSnrm2");
}

cusolverStatus_t cusolverDnCreate(cusolverDnHandle_t *h) {
    *h = new cusim_solver;
    return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnDestroy(cusolverDnHandle_t h) {
    delete h;
    return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnSetStream(cusolverDnHandle_t h, cudaStream_t s) {
    h->s = s;
    return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnDsyevd_bufferSize(cusolverDnHandle_t h, cusolverEigMode_t jobz, cublasFillMode_t uplo,
                                             int n, const double *A, int lda, const double *W, int *lwork) {
    (void)h;
    (void)jobz;
    (void)uplo;
    (void)A;
    (void)W;
    if (n < 0 || lda < (n > 1 ? n : 1)) return CUSOLVER_STATUS_INVALID_VALUE;
    *lwork = 2 * n + 1;
    return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnDsyevd(cusolverDnHandle_t h, cusolverEigMode_t jobz, cublasFillMode_t uplo, int n,
                                  double *A, int lda, double *W, double *work, int lwork, int *info) {
    api_lock l;
    if (sticky()) return CUSOLVER_STATUS_EXECUTION_FAILED;
    if (n < 0 || lda < (n > 1 ? n : 1) || lwork < 2 * n + 1) return CUSOLVER_STATUS_INVALID_VALUE;
    if (!device_range(A, extent(n, n, lda) * 8, "cusolverDnDsyevd", "A") ||
        !device_range(W, (size_t)n * 8, "cusolverDnDsyevd", "W") ||
        !device_range(work, (size_t)lwork * 8, "cusolverDnDsyevd", "work") ||
        !device_range(info, sizeof(int), "cusolverDnDsyevd", "info"))
        return CUSOLVER_STATUS_INVALID_VALUE;
    char jz = jobz == CUSOLVER_EIG_MODE_VECTOR ? 'V' : 'N', ul = uplo == CUBLAS_FILL_MODE_LOWER ? 'L' : 'U';
    enqueue_lib(h->s, "cusolverDnDsyevd", [=]() {
        *info = n ? (int)LAPACKE_dsyevd(LAPACK_COL_MAJOR, jz, ul, n, A, lda, W) : 0;
    });
    return CUSOLVER_STATUS_SUCCESS;
}

namespace cusim {
template <typename K>
static cudaError_t radix_sort(void *tmp, size_t &tmp_bytes, const K *in, K *out, int n, int b0, int b1,
                              cudaStream_t s) {
    api_lock l;
    if (sticky()) return sticky();
    if (!tmp) {
        tmp_bytes = sizeof(K) * (size_t)(n > 0 ? n : 1) + 256;
        return cudaSuccess;
    }
    if (n < 0 || b0 < 0 || b1 > (int)(8 * sizeof(K)) || b0 >= b1) return set_error(cudaErrorInvalidValue);
    if (!device_range(tmp, tmp_bytes, "cub::DeviceRadixSort::SortKeys", "the temporary storage") ||
        !device_range(in, sizeof(K) * (size_t)n, "cub::DeviceRadixSort::SortKeys", "the keys in") ||
        !device_range(out, sizeof(K) * (size_t)n, "cub::DeviceRadixSort::SortKeys", "the keys out"))
        return sticky();
    return enqueue_lib(s, "cub::DeviceRadixSort::SortKeys", [=]() {
        K mask = b1 - b0 >= (int)(8 * sizeof(K)) ? (K)~(K)0 : (K)((((K)1 << (b1 - b0)) - 1) << b0);
        std::vector<K> v(in, in + n);
        std::stable_sort(v.begin(), v.end(), [mask](K a, K b) { return (a & mask) < (b & mask); });
        std::copy(v.begin(), v.end(), out);
    });
}
cudaError_t radix_sort_u64(void *tmp, size_t &tmp_bytes, const unsigned long long *in, unsigned long long *out, int n,
                           int begin_bit, int end_bit, cudaStream_t s) {
    return radix_sort(tmp, tmp_bytes, in, out, n, begin_bit, end_bit, s);
}
cudaError_t radix_sort_u32(void *tmp, size_t &tmp_bytes, const unsigned *in, unsigned *out, int n, int begin_bit,
                           int end_bit, cudaStream_t s) {
    return radix_sort(tmp, tmp_bytes, in, out, n, begin_bit, end_bit, s);
}
} /* namespace cusim */
