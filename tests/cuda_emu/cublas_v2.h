/* cublas_v2.h of the CPU emulator: the two cuBLAS calls nectar_cuda.cu
 * makes, through OpenBLAS (column-major, as cuBLAS). */
#ifndef CUDA_EMU_CUBLAS_H
#define CUDA_EMU_CUBLAS_H

#include "cuda_runtime.h"

typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;
typedef struct EmuCublas *cublasHandle_t;

#ifdef __cplusplus
extern "C" {
#endif
cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
const char *cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                                         int m, int n, int k, const float *alpha,
                                         const float *A, int lda, long long stride_A,
                                         const float *B, int ldb, long long stride_B, const float *beta,
                                         float *C, int ldc, long long stride_C, int batch);
#ifdef __cplusplus
}
#endif

#endif
