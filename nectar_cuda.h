/* nectar_cuda.h - the CUDA path of Nectar in C: functions that mirror the
 * CPU reference (nectar.c) name for name, with the suffix _cuda, and the
 * same structs (Model, ModuleSet, DocCache, Document, RunState) holding
 * device pointers.
 *
 * Every float pointer an _cuda function takes is device memory unless its
 * comment says host; shapes use the legend at the top of nectar.h. Work is
 * queued on the default stream: functions return before the GPU is done,
 * and a cudaMemcpy back to the host waits for it. fp32 throughout, as on the
 * CPU (cuBLAS runs without TF32). Checked against the CPU by
 * tests/test_cuda.cu (every kernel, the fitting step, the forward and
 * backward passes) and tests/test_gpu_programs.sh (the programs' --gpu).
 *
 * A kernel's first version is a plain port of its CPU loop; a faster one
 * gets a number (_v2, ...) and stands next to the one it replaces, passing
 * the same test.
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

/* The operations queued on the device since the last reset: kernel
 * launches, copies and memsets (cudaMemcpy*, cudaMemset*), cuBLAS calls.
 * A decode step is bound by their count (each costs a launch's latency),
 * so benchmark --gpu prints it per decoded token. */
long nectar_cuda_ops(void);
void nectar_cuda_ops_reset(void);

/* ------------------------------------------------------------------------ */
/* Row-wise and elementwise ops of the transformer                          */

/* rmsnorm of `rows` rows of n floats: o_r = w * x_r / sqrt(mean(x_r^2) + eps).
 * o, x: (rows, n), may alias; w: (n). */
void rmsnorm_cuda(float *o, const float *x, const float *w, int rows, int n, float eps);
/* RoPE (base theta) in place on `rows` rows (stride ld) of n floats, row t at
 * position pos + t; direction 1 rotates, -1 rotates back. vec: (rows, ld). */
void rope_cuda(float *vec, int rows, int ld, int n, int head_size, int pos, float theta, float direction);
/* hgate = SiLU(hb) * hb2, elementwise; each (n). */
void swiglu_cuda(float *hgate, const float *hb, const float *hb2, size_t n);
/* y (rows, n_out) = beta y + x (rows, n_in) W^T, W stored (n_out, n_in):
 * the matmul of nectar.c, through cuBLAS. */
void matmul_cuda(int rows, int n_in, int n_out, const float *x, const float *W, float beta, float *y);

/* ------------------------------------------------------------------------ */
/* Attention states                                                         */

/* attention_states on the GPU, the same interface and `visible` rule: query
 * i sees keys j < visible + i; an empty set gives (0, -inf). scores: (nq, nk)
 * scratch, left holding the softmax probabilities as on the CPU. Head size
 * d <= 256. Version 1: one block per query does it all (its keys re-read
 * for every query). */
void attention_states_cuda(int nq, int nk, int d,
                           const float *q, int ldq,
                           const float *k, const float *v, int ldkv, int visible,
                           float *A, int ldA, float *lse, int ldlse, float *scores);
/* Version 2, the same interface and results: nectar.c's structure, scores
 * and A = P V through cuBLAS, a softmax kernel between (any head size).
 * The forward pass and the quadrature modules use this one. */
void attention_states_v2_cuda(int nq, int nk, int d, const float *q, int ldq,
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

/* Backward of attention_states, as on the CPU: adds into dq, dk, dv (any
 * may be NULL) from dA and dlse (NULL = 0), the forward's A and the
 * probabilities it left in scores. tmp: (nq, nk) scratch. */
void attention_states_backward_cuda(int nq, int nk, int d, const float *q, int ldq,
                                    const float *k, const float *v, int ldkv,
                                    const float *A, const float *dA, int ldA, const float *dlse, int ldlse,
                                    const float *scores, float *dq, float *dk, float *dv, float *tmp);

/* ------------------------------------------------------------------------ */
/* Nectar modules, batched over the KV heads of a layer                     */

/* A device copy of a module set: the same host struct, with params (and
 * grads, zeroed, when with_grads) and every module's views in device
 * memory; params holds n_params floats, then every module's input_scale
 * (L G, read by the MLP kernels). Returns 0. Free with moduleset_free_cuda. */
int  moduleset_upload_cuda(ModuleSet *dev, const ModuleSet *host, int with_grads);
/* The device parameters back into host->params. */
void moduleset_download_cuda(ModuleSet *host, const ModuleSet *dev);
void moduleset_free_cuda(ModuleSet *dev);
/* The ModuleWork of nectar.h with every buffer in device memory, same
 * shapes; max_q counts the queries of all the modules run in one batch. */
void modulework_alloc_cuda(ModuleWork *w, const ModuleSet *s, int max_q);
void modulework_free_cuda(ModuleWork *w);
/* module_forward for `count` modules first, first + 1, ... of one layer
 * (one shape) in one batch, N queries each: q (count, N, d) -> a (count, N),
 * A (count, N, d). s: a device module set. MLP: strided-batched cuBLAS for
 * the linear layers, a kernel after each for its bias and SiLU (the heads
 * share one); quadrature: attention_states_v2_cuda over the p pairs. */
void modules_forward_cuda(const ModuleSet *s, int first, int count, ModuleWork *w,
                          const float *q, int N, float *a, float *A);
/* Version 2, the same interface and results (w left as the backward needs
 * it), in one launch: for a decode step's few queries, where version 1's
 * products and kernels each cost a launch. MLP: a block per query runs all
 * its module's layers (each row of weights read by a warp); quadrature:
 * attention_states_cuda's kernel, a set of queries per module. */
void modules_forward_v2_cuda(const ModuleSet *s, int first, int count, ModuleWork *w,
                             const float *q, int N, float *a, float *A);
/* module_backward of the last modules_forward_cuda on w: adds parameter
 * gradients into the modules' grads, writes dq (count, N, d) if not NULL. */
void modules_backward_cuda(const ModuleSet *s, int first, int count, ModuleWork *w, const float *q, int N,
                           const float *A, const float *da, const float *dA, float *dq);

/* ------------------------------------------------------------------------ */
/* Fitting                                                                  */

/* The targets on the device (same shapes); free with fittargets_free_cuda. */
void fittargets_upload_cuda(FitTargets *dev, const FitTargets *host, int n_layers, int dim, int n_heads);
void fittargets_free_cuda(FitTargets *t);
/* A FitBatch in device memory (pos stays on the host; pos_device and
 * row_loss are set). */
void fitbatch_alloc_cuda(FitBatch *b, const ModuleSet *s, int n_heads, int B);
void fitbatch_free_cuda(FitBatch *b);
/* regression_grads on the GPU: each layer's G modules in one batch. s, w,
 * t: device; b from fitbatch_alloc_cuda with b->pos set on the host. */
double regression_grads_cuda(ModuleSet *s, ModuleWork *w, FitBatch *b, const FitTargets *t, int n_heads,
                             float lambda_alpha, float lambda_A);
double clip_grad_norm_cuda(float *grads, size_t n, double max_norm);
void   adamw_update_cuda(float *params, const float *grads, float *m, float *v, size_t n, int step,
                         float lr, float wd, float beta2);

/* ------------------------------------------------------------------------ */
/* Forward and backward passes                                              */

/* A device copy of the model: the same struct, params and views on the GPU. */
int  model_upload_cuda(Model *dev, const Model *host);
void model_free_cuda(Model *dev);
/* The document's KV cache built by a GPU prefill (forward_cuda over the
 * document in blocks); returns when the GPU is done. */
int  doccache_build_cuda(DocCache *dev, const Model *m, const int *tokens, int n, int block);
void doccache_free_cuda(DocCache *dev);

/* The RunState of nectar.h in device memory (the buffers forward uses), the
 * split-KV scratch of the decode, and a host copy of the logits. */
typedef struct {
    RunState s;
    float *part_A, *part_lse;  /* (H, chunks, d), (H, chunks) */
    int *tokens;               /* (B) the block's ids */
    float *logits;             /* (B, V) host: what forward_cuda computed */
    float *dlogits;            /* (B, V) backward_cuda's input, on the device */
} RunStateCuda;

/* doc: as on the CPU, with its cache or modules on the device. */
void runstate_alloc_cuda(RunStateCuda *s, const Model *m, const Document *doc, int max_block, int capacity);
void runstate_free_cuda(RunStateCuda *s);
/* forward on the GPU: the same arguments and checks (m, doc on the device);
 * the logits asked for land in s->logits on the host. A single token
 * (decode) attends with the split-KV kernel. */
int forward_cuda(const Model *m, RunStateCuda *s, const Document *doc,
                 const int *tokens, int ntok, int pos, int logits);

/* What backward_cuda needs (the buffers of runstate_enable_backward, on the
 * device; freed with the run state). */
void runstate_enable_backward_cuda(RunStateCuda *s, const Model *m);
/* backward on the GPU, for the KL term of train --gpu: given dlogits
 * (ntok, V) on the host, adds the modules' parameter gradients (DOC_NECTAR,
 * into their grads) and leaves dL/d(layer 0's input) in s->s.dx. The
 * model's own gradients are not computed on the GPU. */
int backward_cuda(const Model *m, RunStateCuda *s, const Document *doc, int ntok, const float *dlogits);
/* kl_term (src/compile.c) on the device in fp32, for train --gpu's KL
 * term: the student's logits z (len, V) and the teacher's rows (its
 * logits, or its top k) on the device; the gradient times weight into
 * dlogits (len, V) and each position's KL into row_kl (len), both on the
 * device. Returns the KL averaged over the positions. */
double kl_term_cuda(const TeacherRows *teacher, const float *z, int len, int V, float weight, float *dlogits,
                    float *row_kl);

/* ------------------------------------------------------------------------ */
/* The fit on the GPU                                                       */

/* fit_begin's backend for the GPU (after nectar_cuda_init): the same loop
 * as on the CPU, its steps' regression, KL term, clipping and AdamW on the
 * device. */
const FitBackend *fit_backend_cuda(void);

#ifdef __cplusplus
}
#endif

#endif
