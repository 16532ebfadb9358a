/* nectar_cuda.h - the CUDA path of Nectar in C: kernels that mirror the CPU
 * reference (nectar.c) name for name, with the suffix _cuda.
 *
 * Every float pointer an _cuda function takes is device memory; shapes use
 * the legend at the top of nectar.h. Work is queued on the default stream:
 * functions return before the GPU is done, and a cudaMemcpy back to the host
 * waits for it. fp32 throughout, as on the CPU (cuBLAS runs without TF32).
 *
 * Version 1: each kernel is a plain port of its CPU loop, checked against the
 * CPU by tests/test_cuda.cu. Faster versions get a number (_v2, ...) and
 * stand next to the one they replace until they pass the same test.
 */
#ifndef NECTAR_CUDA_H
#define NECTAR_CUDA_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "nectar.h"

/* ------------------------------------------------------------------------ */
/* Checks and memory                                                        */

/* A failed CUDA or cuBLAS call prints one sentence naming the call, the file
 * and the line, and exits(1), as check_malloc does. */
void cuda_check(cudaError_t err, const char *call, const char *file, int line);
void cublas_check(cublasStatus_t status, const char *call, const char *file, int line);
#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) cublas_check((call), #call, __FILE__, __LINE__)

/* Zeroed device memory (NULL for 0 bytes), or a sentence and exit(1). */
void *cuda_malloc_check(size_t n, const char *file, int line);
#define cuda_xmalloc(n) cuda_malloc_check((n), __FILE__, __LINE__)

/* Selects device 0 and creates the cuBLAS handle the _cuda functions use.
 * Returns 0, or -1 with a sentence when there is no usable device. */
int  nectar_cuda_init(void);
void nectar_cuda_free(void);

/* ------------------------------------------------------------------------ */
/* Row-wise and elementwise ops of the transformer                          */

/* rmsnorm of `rows` rows of n floats: o_r = w * x_r / sqrt(mean(x_r^2) + 1e-5).
 * o, x: (rows, n), may alias; w: (n). */
void rmsnorm_cuda(float *o, const float *x, const float *w, int rows, int n);
/* RoPE in place on `rows` rows (stride ld) of n floats, row t at position
 * pos + t; direction 1 rotates, -1 rotates back. vec: (rows, ld). */
void rope_cuda(float *vec, int rows, int ld, int n, int head_size, int pos, float direction);
/* hgate = SiLU(hb) * hb2, elementwise; each (n). */
void swiglu_cuda(float *hgate, const float *hb, const float *hb2, size_t n);

/* ------------------------------------------------------------------------ */
/* Attention states                                                         */

/* attention_states on the GPU, the same interface and `visible` rule: query
 * i sees keys j < visible + i; an empty set gives (0, -inf). scores: (nq, nk)
 * scratch, left holding the softmax probabilities as on the CPU. Head size
 * d <= 256. */
void attention_states_cuda(int nq, int nk, int d,
                           const float *q, int ldq,
                           const float *k, const float *v, int ldkv, int visible,
                           float *A, int ldA, float *lse, int ldlse, float *scores);
/* Decode: one query per head over nk keys (all visible), split over the keys.
 * Each block computes the state of one head over one chunk of keys; a second
 * kernel folds the chunk states with the log-sum-exp merge. q: (H, d);
 * k, v: (nk, ldkv), query head h reads KV head h / (H / G) at column
 * (h / (H / G)) d; A: (H, d); lse: (H); part_A: (H, chunks, d) and part_lse:
 * (H, chunks) scratch, chunks = attention_decode_chunks_cuda(nk). */
int  attention_decode_chunks_cuda(int nk);
void attention_states_decode_cuda(int n_heads, int n_kv_heads, int nk, int d,
                                  const float *q, const float *k, const float *v, int ldkv,
                                  float *A, float *lse, float *part_A, float *part_lse);
/* merge_states over n pairs: row r of A (n, d), lse (n) is the merge of row r
 * of (A1, lse1) and of (A2, lse2). lse may be NULL; A may alias A1 or A2. */
void merge_states_cuda(int n, int d, const float *A1, const float *lse1,
                       const float *A2, const float *lse2, float *A, float *lse);

/* ------------------------------------------------------------------------ */
/* Nectar modules                                                           */

/* The ModuleWork of nectar.h with every buffer in device memory, same shapes. */
void modulework_alloc_cuda(ModuleWork *w, const ModuleSet *s, int max_q);
void modulework_free_cuda(ModuleWork *w);
/* A device copy of s->params (n_params); free it with cudaFree. */
float *moduleset_upload_cuda(const ModuleSet *s);
/* module_forward on the GPU: q (N, d) -> a (N), A (N, d). s and mod are the
 * host structs (shapes, and where mod's block sits in s->params); params is
 * moduleset_upload_cuda(s). MLP: cuBLAS for the linear layers; quadrature:
 * attention_states_cuda over the p learned pairs. */
void module_forward_cuda(const ModuleSet *s, const Module *mod, const float *params,
                         ModuleWork *w, const float *q, int N, float *a, float *A);

#ifdef __cplusplus
}
#endif

#endif
