/* cusolverDn.h for the CUDA simulator: the symmetric eigensolver skv uses,
 * computed with LAPACKE on the handle's stream (cusim_libs.cpp). */
#ifndef SKV_CUSIM_CUSOLVERDN_H
#define SKV_CUSIM_CUSOLVERDN_H
#include "cublas_v2.h"

typedef enum {
    CUSOLVER_STATUS_SUCCESS = 0,
    CUSOLVER_STATUS_NOT_INITIALIZED = 1,
    CUSOLVER_STATUS_INVALID_VALUE = 3,
    CUSOLVER_STATUS_EXECUTION_FAILED = 6,
} cusolverStatus_t;
typedef enum { CUSOLVER_EIG_MODE_NOVECTOR = 0, CUSOLVER_EIG_MODE_VECTOR = 1 } cusolverEigMode_t;
typedef struct cusim_solver *cusolverDnHandle_t;

cusolverStatus_t cusolverDnCreate(cusolverDnHandle_t *h);
cusolverStatus_t cusolverDnDestroy(cusolverDnHandle_t h);
cusolverStatus_t cusolverDnSetStream(cusolverDnHandle_t h, cudaStream_t s);
cusolverStatus_t cusolverDnDsyevd_bufferSize(cusolverDnHandle_t h, cusolverEigMode_t jobz, cublasFillMode_t uplo,
                                             int n, const double *A, int lda, const double *W, int *lwork);
cusolverStatus_t cusolverDnDsyevd(cusolverDnHandle_t h, cusolverEigMode_t jobz, cublasFillMode_t uplo, int n,
                                  double *A, int lda, double *W, double *work, int lwork, int *info);
#endif
