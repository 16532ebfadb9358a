/* kernels.h - the fast primitives the method runs on, part of the core:
 * exp_fast, inline so that the softmax and SiLU loops that call it
 * vectorise (a loop of expf does not), and the matrix products on the
 * thread pool (kernels.c), each with the measurement that chose it.
 */
#ifndef NECTAR_KERNELS_H
#define NECTAR_KERNELS_H

#include <cblas.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* The exponential of the softmax and SiLU loops                            */


static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }
static inline float float_of(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }

/* exp(x) = 2^n e^r, n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2]:
 *   - n by the 1.5 * 2^23 trick: x log2(e) + 1.5 * 2^23 has n in its low
 *     mantissa bits (round to nearest), and minus 1.5 * 2^23 is n as a float;
 *   - r with ln 2 in two parts (Cody and Waite): n * LN2_HI is exact (LN2_HI
 *     has 10 significant bits, |n| <= 150), LN2_LO = ln 2 - LN2_HI;
 *   - e^r by its Taylor series to r^7 / 7! (truncation below 5.2e-9 relative);
 *   - 2^n as 2^(n - n/2) 2^(n/2), each a float built from its exponent bits,
 *     so that results below FLT_MIN (denormals) and up to FLT_MAX come out.
 * No branch and no library call, so a loop of it vectorises (expf does not).
 * Measured against double exp on every float of [-104, 89] (the test in
 * tests/test_core.c takes every 64th): relative error at most 1.004e-7
 * (1.7 ulp; expf: 0.5 ulp) where the result is normal, absolute error below
 * 2^-149 where it is denormal; 0 below -104 (and at -inf), +inf above
 * ln(FLT_MAX), NaN for NaN. */
static inline float exp_fast(float x) {
    const float LOG2E = 1.44269504f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f, ROUND = 12582912.0f;
    float xc = x < -104.0f ? -104.0f : x;  /* the range where 2^n is built below; NaN stays NaN */
    xc = xc > 89.0f ? 89.0f : xc;
    float t = xc * LOG2E + ROUND;
    int32_t n = (int32_t)(bits_of(t) - bits_of(ROUND));
    float nf = t - ROUND;
    float r = (xc - nf * LN2_HI) - nf * LN2_LO;
    float er = 1.0f + r * (1.0f + r * (1.0f / 2 + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120
             + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    int32_t half = n / 2;
    float y = er * float_of((uint32_t)(n - half + 127) << 23) * float_of((uint32_t)(half + 127) << 23);
    return x < -104.0f ? 0.0f : y;
}

/* ------------------------------------------------------------------------ */
/* Matrix products, on the pool's threads                                   */

/* C (M, N) = alpha op(A) op(B) + beta C, row-major, as cblas_sgemm. */
typedef struct {
    CBLAS_TRANSPOSE trans_a, trans_b;
    int M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int cols;  /* columns of C per task */
} Gemm;

/* Products run in one parallel loop: task t is a chunk of columns of
 * product i, first_task[i] <= t < first_task[i + 1]. */
enum { MAX_PRODUCTS = 3 };
typedef struct {
    int count;
    Gemm g[MAX_PRODUCTS];
    int first_task[MAX_PRODUCTS + 1];
} GemmBatch;

/* Runs the batch's products in one parallel loop (kernels.c says how it
 * splits them). */
void gemm_batch(GemmBatch *b);
/* One product, as cblas_sgemm (row-major), on the pool's threads. */
void gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K, float alpha,
          const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

#endif
