/* kernels.c - the matrix products of the core on the thread pool: a
 * matrix-vector loop for decode steps (a weight matrix streamed once,
 * four streams at a time) and OpenBLAS's single-threaded sgemm on chunks
 * of columns for everything else. Every figure below was measured on the
 * project's 2-core machine with OpenBLAS 0.3.21 ("here"); they are why the
 * code is shaped so.
 */
#include "kernels.h"
#include "parallel.h"

/* c_j = alpha b_j . a + beta c_j for the n rows b_j of B (stored (n, K),
 * stride ldb): a matrix-vector product as a decode step runs it, a weight
 * matrix read once from memory. Four rows a quarter of the block apart at a
 * time, so that the memory system sees four streams (one stream read 20-23
 * GB/s here, four 28, as fast as a plain streaming read). Each dot product
 * may be summed in any order (SIMD lanes). */
static void matvec_rows(int n, int K, float alpha, const float *B, int ldb, const float *a, float beta, float *c) {
    int quarter = n / 4, first[4];
    float dot[4];
    for (int j = 0; j < quarter; j++) {
        for (int s = 0; s < 4; s++) first[s] = j + s * quarter;
        const float *b0 = B + (size_t)first[0] * ldb, *b1 = B + (size_t)first[1] * ldb;
        const float *b2 = B + (size_t)first[2] * ldb, *b3 = B + (size_t)first[3] * ldb;
        float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
        #pragma omp simd reduction(+:d0, d1, d2, d3)
        for (int k = 0; k < K; k++) { d0 += b0[k] * a[k]; d1 += b1[k] * a[k]; d2 += b2[k] * a[k]; d3 += b3[k] * a[k]; }
        dot[0] = d0; dot[1] = d1; dot[2] = d2; dot[3] = d3;
        for (int s = 0; s < 4; s++)
            c[first[s]] = beta == 0.0f ? alpha * dot[s] : alpha * dot[s] + beta * c[first[s]];
    }
    for (int j = 4 * quarter; j < n; j++) {  /* the last n mod 4 rows, one at a time */
        const float *b = B + (size_t)j * ldb;
        float d = 0.0f;
        #pragma omp simd reduction(+:d)
        for (int k = 0; k < K; k++) d += b[k] * a[k];
        c[j] = beta == 0.0f ? alpha * d : alpha * d + beta * c[j];
    }
}

/* Columns [c0, c0 + n) of C: a single-threaded OpenBLAS product, or, for
 * one row of A and B stored (N, K) (a weight matrix), matvec_rows: sgemm
 * would first copy B into its packed layout, and OpenBLAS's sgemv streams
 * it slower than this loop does (12-13 GB/s on one core here, against 20-28). */
static void gemm_columns(const Gemm *g, int c0, int n) {
    const float *B = g->trans_b == CblasTrans ? g->B + (size_t)c0 * g->ldb : g->B + c0;
    float *C = g->C + c0;
    if (g->M == 1 && g->trans_a == CblasNoTrans && g->trans_b == CblasTrans)
        matvec_rows(n, g->K, g->alpha, B, g->ldb, g->A, g->beta, C);
    else
        cblas_sgemm(CblasRowMajor, g->trans_a, g->trans_b, g->M, n, g->K, g->alpha, g->A, g->lda, B, g->ldb,
                    g->beta, C, g->ldc);
}

/* Task t of a batch (kernels.h): its chunk of columns of its product. */
static void gemm_batch_task(void *ctx, int task) {
    const GemmBatch *b = ctx;
    int i = 0;
    while (task >= b->first_task[i + 1]) i++;
    const Gemm *g = &b->g[i];
    int c0 = (task - b->first_task[i]) * g->cols;
    gemm_columns(g, c0, g->N - c0 < g->cols ? g->N - c0 : g->cols);
}

/* The columns of C in tasks of a multiple of 16 columns (a cache line of
 * floats): about two per thread over the batch, each product's share in
 * proportion to its columns (few, since each task packs all of A, or starts
 * its streams through a weight matrix anew: a decode step took 13.7 ms at
 * best with two a thread, 14.5 with four, 15 with eight; two, so that a
 * thread that finishes early can take over); a small product (under 2^16
 * multiply-adds) in one task. One thread: each product in one piece, in
 * order. */
void gemm_batch(GemmBatch *b) {
    int threads = parallel_threads(), columns = 0;
    for (int i = 0; i < b->count; i++) columns += b->g[i].N;
    int tasks = 2 * threads;
    b->first_task[0] = 0;
    for (int i = 0; i < b->count; i++) {
        Gemm *g = &b->g[i];
        int share = (int)((double)tasks * g->N / columns + 0.5);
        if (share < 1 || threads == 1 || (double)g->M * g->N * g->K < 65536.0) share = 1;
        g->cols = ((g->N + share - 1) / share + 15) / 16 * 16;
        b->first_task[i + 1] = b->first_task[i] + (g->N + g->cols - 1) / g->cols;
    }
    parallel_for(b->first_task[b->count], gemm_batch_task, b);
}

void gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K, float alpha,
          const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    GemmBatch b = {1, {{trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, N}}, {0}};
    gemm_batch(&b);
}
