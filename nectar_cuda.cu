/* nectar_cuda.cu - the CUDA path of Nectar in C, mirroring nectar.c name for
 * name (suffix _cuda). Read next to nectar.c: checks and memory, the
 * transformer's row-wise ops, attention states and their merge (the split-KV
 * decode is where the merge pays), Nectar modules batched over a layer's KV
 * heads, fitting, the forward pass, the backward pass into the modules.
 * Validated against the CPU by tests/test_cuda.cu. Shapes use the legend at
 * the top of nectar.h; every pointer is device memory unless nectar_cuda.h
 * says host.
 */
#include "nectar_cuda.h"
#include "src/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Checks and memory                                                        */

/* Every operation queued on the device is counted: a decode step costs about
 * a launch's latency per operation, whatever its bytes. */
static long ops_queued;

long nectar_cuda_ops(void) { return ops_queued; }
void nectar_cuda_ops_reset(void) { ops_queued = 0; }

/* A copy or memset, a cuBLAS call, and the check after a kernel launch:
 * each counts one operation, then checks as CUDA_CHECK does. */
#define DEVICE_OP(call) (ops_queued++, CUDA_CHECK(call))
#define CUBLAS_OP(call) (ops_queued++, CUBLAS_CHECK(call))
#define LAUNCH_CHECK() DEVICE_OP(cudaGetLastError())

void cuda_check(cudaError_t err, const char *call, const char *file, int line) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "error: %s failed at %s:%d: %s\n", call, file, line, cudaGetErrorString(err));
    exit(1);
}

void cublas_check(cublasStatus_t status, const char *call, const char *file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "error: %s failed at %s:%d: %s\n", call, file, line, cublasGetStatusString(status));
    exit(1);
}

void *cuda_malloc_check(size_t n, const char *file, int line) {
    if (n == 0) return NULL;
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, n);
    if (err != cudaSuccess) {
        fprintf(stderr, "error: cannot allocate %zu bytes of GPU memory at %s:%d: %s\n",
                n, file, line, cudaGetErrorString(err));
        exit(1);
    }
    ops_queued++;
    cuda_check(cudaMemset(p, 0, n), "cudaMemset(p, 0, n)", file, line);
    return p;
}

static cublasHandle_t cublas;  /* created by nectar_cuda_init */
static double *norm_partial;   /* (NORM_BLOCKS + 1) clip_grad_norm_cuda's scratch, made at first use */

int nectar_cuda_init(void) {
    int n_devices = 0;
    cudaError_t err = cudaGetDeviceCount(&n_devices);
    if (err != cudaSuccess || n_devices == 0) {
        fprintf(stderr, "error: no CUDA device (%s)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "none found");
        return -1;
    }
    CUDA_CHECK(cudaSetDevice(0));
    CUBLAS_CHECK(cublasCreate(&cublas));
    CUBLAS_CHECK(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));  /* fp32: no TF32, no emulation */
    return 0;
}

void nectar_cuda_free(void) {
    if (cublas) CUBLAS_CHECK(cublasDestroy(cublas));
    CUDA_CHECK(cudaFree(norm_partial));
    cublas = NULL;
    norm_partial = NULL;
}

/* Blocks for n threads of `threads` each. */
static unsigned int blocks_for(size_t n, int threads) { return (unsigned int)((n + threads - 1) / threads); }

enum { THREADS = 256 };  /* threads per block of every 1-D kernel; a multiple of 32 */

/* Block-wide sum and max; every thread gets the result. blockDim.x is a
 * multiple of 32; buf: 32 floats of shared memory, reusable between calls. */
__device__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ float block_sum(float x, float *buf) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    x = warp_sum(x);
    __syncthreads();  /* buf may still be read by a previous call */
    if (lane == 0) buf[warp] = x;
    __syncthreads();
    return warp_sum(lane < n_warps ? buf[lane] : 0.0f);
}

__device__ float block_max(float x, float *buf) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) buf[warp] = x;
    __syncthreads();
    return warp_max(lane < n_warps ? buf[lane] : -INFINITY);
}

/* ------------------------------------------------------------------------ */
/* Row-wise and elementwise ops of the transformer                          */

/* One block per row. o = w * x * r,  r = 1 / sqrt(mean(x^2) + eps) */
__global__ void rmsnorm_kernel(float *o, const float *x, const float *w, int n, float eps) {
    __shared__ float buf[32];
    const float *xr = x + (size_t)blockIdx.x * n;  /* (n) this row */
    float *orow = o + (size_t)blockIdx.x * n;      /* (n) */
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, buf);  /* every read of xr is done before any write: o may alias x */
    ss = 1.0f / sqrtf(ss / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = w[i] * (ss * xr[i]);
}

void rmsnorm_cuda(float *o, const float *x, const float *w, int rows, int n, float eps) {
    if (rows <= 0) return;
    rmsnorm_kernel<<<rows, THREADS>>>(o, x, w, n, eps);
    LAUNCH_CHECK();
}

/* One thread per pair (v_i, v_i+1) of row t, rotated by the angle
 * (pos + t) * theta^(-(i mod d) / d) (llama2.c convention).
 * The frequency is powf rounded once: pow in double, then float, which gives
 * the bits of the CPU's powf for every power-of-two head size (CUDA's powf
 * may be a few ulps off, and at position 4000 one ulp moves the angle by
 * 2e-4). */
__global__ void rope_kernel(float *vec, int rows, int ld, int n, int head_size, int pos, float theta,
                            float direction) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x, half = n / 2;
    if (idx >= (size_t)rows * half) return;
    int t = (int)(idx / half), i = 2 * (int)(idx % half);
    float *row = vec + (size_t)t * ld;  /* (n) */
    float freq = 1.0f / (float)pow((double)theta, (double)((i % head_size) / (float)head_size));
    float angle = (pos + t) * freq, fcr = cosf(angle), fci = direction * sinf(angle);
    float v0 = row[i], v1 = row[i + 1];
    row[i] = v0 * fcr - v1 * fci;
    row[i + 1] = v0 * fci + v1 * fcr;
}

void rope_cuda(float *vec, int rows, int ld, int n, int head_size, int pos, float theta, float direction) {
    size_t pairs = (size_t)rows * (n / 2);
    if (pairs == 0) return;
    rope_kernel<<<blocks_for(pairs, THREADS), THREADS>>>(vec, rows, ld, n, head_size, pos, theta, direction);
    LAUNCH_CHECK();
}

__device__ float silu(float z) { return z / (1.0f + expf(-z)); }

/* hgate = SiLU(hb) * hb2 */
__global__ void swiglu_kernel(float *hgate, const float *hb, const float *hb2, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) hgate[i] = silu(hb[i]) * hb2[i];
}

void swiglu_cuda(float *hgate, const float *hb, const float *hb2, size_t n) {
    if (n == 0) return;
    swiglu_kernel<<<blocks_for(n, THREADS), THREADS>>>(hgate, hb, hb2, n);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------ */
/* Attention states and their merge                                         */

enum { MAX_HEAD = THREADS };  /* attention kernels give each component of A a thread */

/* The state of one query over `seen` >= 1 keys, computed by the whole block:
 *   s_j = q . k_j / sqrt(d),  lse = max + log sum_j exp(s_j - max),
 *   P_j = exp(s_j - max) / sum,  A = sum_j P_j v_j.
 * qs: (d) the query in shared memory; row: (seen) scratch, global or shared,
 * left holding P; acc: (blockDim.x) shared; buf: 32 shared floats. A: (d);
 * thread 0 writes *lse. */
__device__ void attention_state_device(int seen, int d, const float *qs, const float *k,
                                       const float *v, int ldkv, float *row, float *A, float *lse,
                                       float *acc, float *buf) {
    float scale = 1.0f / sqrtf((float)d);
    float max = -INFINITY;
    for (int j = threadIdx.x; j < seen; j += blockDim.x) {
        const float *kj = k + (size_t)j * ldkv;  /* (d) */
        float s = 0.0f;
        for (int c = 0; c < d; c++) s += qs[c] * kj[c];
        row[j] = s * scale;
        max = fmaxf(max, row[j]);
    }
    max = block_max(max, buf);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < seen; j += blockDim.x) { row[j] = expf(row[j] - max); sum += row[j]; }
    sum = block_sum(sum, buf);
    if (threadIdx.x == 0) *lse = max + logf(sum);
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < seen; j += blockDim.x) row[j] *= inv;
    __syncthreads();  /* row is read across threads below */
    /* A_c = sum_j P_j v_jc: thread t sums component c = t mod d over the keys
     * j = slice, slice + n_slices, ... (slice = t / d); then one thread per
     * component adds the slices in order. */
    int n_slices = blockDim.x / d, c = threadIdx.x % d, slice = threadIdx.x / d;
    float a = 0.0f;
    if (slice < n_slices)
        for (int j = slice; j < seen; j += n_slices) a += row[j] * v[(size_t)j * ldkv + c];
    acc[threadIdx.x] = a;
    __syncthreads();
    if ((int)threadIdx.x < d) {
        float total = 0.0f;
        for (int sl = 0; sl < n_slices; sl++) total += acc[sl * d + threadIdx.x];
        A[threadIdx.x] = total;
    }
}

/* Grid (nq, sets): block (i, b) is query i of set b, row b nq + i of q, A,
 * lse and scores; set b's keys and values are b kv_stride floats further than
 * set 0's. Shared memory: q_i (d), acc (blockDim.x). */
__global__ void attention_states_kernel(int nk, int d, const float *q, int ldq,
                                        const float *k, const float *v, int ldkv, size_t kv_stride, int visible,
                                        float *A, int ldA, float *lse, int ldlse, float *scores) {
    extern __shared__ float smem[];
    __shared__ float buf[32];
    float *qs = smem, *acc = smem + d;
    int i = blockIdx.x;
    size_t r = (size_t)blockIdx.y * gridDim.x + i;  /* the block's row */
    k += blockIdx.y * kv_stride;
    v += blockIdx.y * kv_stride;
    float *row = scores + r * nk;  /* (nk) */
    float *Ai = A + r * ldA;       /* (d) */
    long long sees = (long long)visible + i;
    int seen = sees < nk ? (int)sees : nk;
    if (seen <= 0) {  /* empty set: state (0, -inf) */
        for (int j = threadIdx.x; j < nk; j += blockDim.x) row[j] = 0.0f;
        for (int c = threadIdx.x; c < d; c += blockDim.x) Ai[c] = 0.0f;
        if (threadIdx.x == 0) lse[r * ldlse] = -INFINITY;
        return;
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) qs[c] = q[r * ldq + c];
    for (int j = seen + threadIdx.x; j < nk; j += blockDim.x) row[j] = 0.0f;  /* masked keys: P = 0 */
    __syncthreads();
    attention_state_device(seen, d, qs, k, v, ldkv, row, Ai, lse + r * ldlse, acc, buf);
}

static void check_head_size(int d) {
    if (d <= MAX_HEAD) return;
    fprintf(stderr, "error: head size %d exceeds the %d the CUDA attention kernels support\n", d, MAX_HEAD);
    exit(1);
}

/* attention_states_cuda over `sets` sets of nq queries in one launch: set
 * b's queries are rows b nq .. b nq + nq - 1 of q, A, lse and scores, its
 * keys and values b kv_stride floats further than set 0's. */
static void attention_states_sets_cuda(int sets, size_t kv_stride, int nq, int nk, int d, const float *q, int ldq,
                                       const float *k, const float *v, int ldkv, int visible,
                                       float *A, int ldA, float *lse, int ldlse, float *scores) {
    if (nq <= 0 || sets <= 0) return;
    check_head_size(d);
    size_t smem = (size_t)(d + THREADS) * sizeof(float);
    attention_states_kernel<<<dim3(nq, sets), THREADS, smem>>>(nk, d, q, ldq, k, v, ldkv, kv_stride, visible,
                                                               A, ldA, lse, ldlse, scores);
    LAUNCH_CHECK();
}

void attention_states_cuda(int nq, int nk, int d, const float *q, int ldq,
                           const float *k, const float *v, int ldkv, int visible,
                           float *A, int ldA, float *lse, int ldlse, float *scores) {
    attention_states_sets_cuda(1, 0, nq, nk, d, q, ldq, k, v, ldkv, visible, A, ldA, lse, ldlse, scores);
}

/* Version 2: nectar.c's own structure on the GPU. s = Q K^T / sqrt(d) and
 * A = P V through cuBLAS; between them one block per row turns s into
 * probabilities under the causal rule:
 *   lse = max + log sum_j exp(s_j - max),  P_j = exp(s_j - max) / sum  (j < seen),
 *   P_j = 0 (j >= seen). */
__global__ void softmax_rows_kernel(int nk, int visible, float *scores, float *lse, int ldlse) {
    __shared__ float buf[32];
    int i = blockIdx.x;
    float *row = scores + (size_t)i * nk;  /* (nk) */
    long long sees = (long long)visible + i;
    int seen = sees < nk ? (int)sees : nk;
    if (seen <= 0) {  /* empty set: state (0, -inf) */
        for (int j = threadIdx.x; j < nk; j += blockDim.x) row[j] = 0.0f;
        if (threadIdx.x == 0) lse[(size_t)i * ldlse] = -INFINITY;
        return;
    }
    float max = -INFINITY;
    for (int j = threadIdx.x; j < seen; j += blockDim.x) max = fmaxf(max, row[j]);
    max = block_max(max, buf);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < seen; j += blockDim.x) sum += expf(row[j] - max);
    sum = block_sum(sum, buf);
    if (threadIdx.x == 0) lse[(size_t)i * ldlse] = max + logf(sum);
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) row[j] = j < seen ? expf(row[j] - max) * inv : 0.0f;
}

void attention_states_v2_cuda(int nq, int nk, int d, const float *q, int ldq,
                              const float *k, const float *v, int ldkv, int visible,
                              float *A, int ldA, float *lse, int ldlse, float *scores) {
    if (nq <= 0) return;
    const float one = 1.0f, zero = 0.0f, scale = 1.0f / sqrtf((float)d);
    if (nk > 0)  /* s^T (nk, nq) = K (nk, d) Q^T (d, nq) / sqrt(d), column-major */
        CUBLAS_OP(cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, nk, nq, d, &scale, k, ldkv, q, ldq,
                                 &zero, scores, nk));
    softmax_rows_kernel<<<nq, THREADS>>>(nk, visible, scores, lse, ldlse);
    LAUNCH_CHECK();
    if (nk > 0)  /* A^T (d, nq) = V^T (d, nk) P^T (nk, nq) */
        CUBLAS_OP(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_N, d, nq, nk, &one, v, ldkv, scores, nk,
                                 &zero, A, ldA));
    else
        DEVICE_OP(cudaMemset2D(A, ldA * sizeof(float), 0, d * sizeof(float), nq));
}

/* m = max(lse1, lse2), w_i = exp(lse_i - m):
 *   A = (w1 A1 + w2 A2) / (w1 + w2),  lse = m + log(w1 + w2).
 * Two empty states give (0, -inf). The calling thread does components
 * c0, c0 + dc, ... of A; every thread computes the same *lse. A may alias
 * A1 or A2 (each component is read before it is written, by one thread). */
__device__ void merge_states_device(int d, const float *A1, float lse1, const float *A2, float lse2,
                                    float *A, float *lse, int c0, int dc) {
    float m = lse1 > lse2 ? lse1 : lse2;
    if (m == -INFINITY) {
        for (int c = c0; c < d; c += dc) A[c] = 0.0f;
        *lse = -INFINITY;
        return;
    }
    float w1 = expf(lse1 - m), w2 = expf(lse2 - m);  /* exp(-inf) = 0: an empty side drops out */
    float inv = 1.0f / (w1 + w2);
    for (int c = c0; c < d; c += dc) A[c] = (w1 * A1[c] + w2 * A2[c]) * inv;
    *lse = m + logf(w1 + w2);
}

enum { DECODE_CHUNK = 256 };  /* keys per block of the split-KV decode */

int attention_decode_chunks_cuda(int nk) { return nk > 0 ? (nk + DECODE_CHUNK - 1) / DECODE_CHUNK : 0; }

/* Grid (chunks, H): block (c, h) is the state of query head h over the keys
 * [c CHUNK, min((c + 1) CHUNK, nk)) of its KV head. Shared memory: q (d),
 * acc (blockDim.x). */
__global__ void attention_decode_partial_kernel(int nk, int d, int group, const float *q,
                                                const float *k, const float *v, int ldkv,
                                                float *part_A, float *part_lse) {
    extern __shared__ float smem[];
    __shared__ float buf[32], row[DECODE_CHUNK];
    float *qs = smem, *acc = smem + d;
    int chunk = blockIdx.x, h = blockIdx.y, n_chunks = gridDim.x;
    int j0 = chunk * DECODE_CHUNK, seen = nk - j0 < DECODE_CHUNK ? nk - j0 : DECODE_CHUNK;
    size_t kv = (size_t)j0 * ldkv + (size_t)(h / group) * d;  /* first key of the chunk, KV head h / group */
    size_t part = (size_t)h * n_chunks + chunk;
    for (int c = threadIdx.x; c < d; c += blockDim.x) qs[c] = q[(size_t)h * d + c];
    __syncthreads();
    attention_state_device(seen, d, qs, k + kv, v + kv, ldkv, row, part_A + part * d,
                           part_lse + part, acc, buf);
}

/* One block per head: state = merge(state, chunk c) for c = 0, 1, ...,
 * starting from the empty state (0, -inf). Each thread owns components
 * threadIdx.x, threadIdx.x + blockDim.x, ... of A. */
__global__ void attention_decode_merge_kernel(int n_chunks, int d, const float *part_A,
                                              const float *part_lse, float *A, float *lse) {
    int h = blockIdx.x;
    float *Ah = A + (size_t)h * d;  /* (d) */
    float lse_h = -INFINITY;
    for (int c = threadIdx.x; c < d; c += blockDim.x) Ah[c] = 0.0f;
    for (int p = 0; p < n_chunks; p++) {
        size_t part = (size_t)h * n_chunks + p;
        merge_states_device(d, Ah, lse_h, part_A + part * d, part_lse[part], Ah, &lse_h,
                            threadIdx.x, blockDim.x);
    }
    if (threadIdx.x == 0) lse[h] = lse_h;
}

void attention_states_decode_cuda(int n_heads, int n_kv_heads, int nk, int d,
                                  const float *q, const float *k, const float *v, int ldkv,
                                  float *A, float *lse, float *part_A, float *part_lse) {
    if (n_heads <= 0) return;
    check_head_size(d);
    int n_chunks = attention_decode_chunks_cuda(nk), group = n_heads / n_kv_heads;
    if (n_chunks > 0) {
        size_t smem = (size_t)(d + THREADS) * sizeof(float);
        attention_decode_partial_kernel<<<dim3(n_chunks, n_heads), THREADS, smem>>>(
            nk, d, group, q, k, v, ldkv, part_A, part_lse);
        LAUNCH_CHECK();
    }
    int threads = (d + 31) / 32 * 32;
    attention_decode_merge_kernel<<<n_heads, threads>>>(n_chunks, d, part_A, part_lse, A, lse);
    LAUNCH_CHECK();
}

enum { MERGE_LANES = 32, MERGE_ROWS = 8 };  /* a block: 8 pairs, 32 threads over each one's d */

__global__ void merge_states_kernel(int n, int d, const float *A1, const float *lse1,
                                    const float *A2, const float *lse2, float *A, float *lse) {
    int r = blockIdx.x * MERGE_ROWS + threadIdx.y;
    if (r >= n) return;
    size_t row = (size_t)r * d;
    float lse_r;
    merge_states_device(d, A1 + row, lse1[r], A2 + row, lse2[r], A + row, &lse_r, threadIdx.x, MERGE_LANES);
    if (lse && threadIdx.x == 0) lse[r] = lse_r;
}

void merge_states_cuda(int n, int d, const float *A1, const float *lse1,
                       const float *A2, const float *lse2, float *A, float *lse) {
    if (n <= 0) return;
    merge_states_kernel<<<blocks_for(n, MERGE_ROWS), dim3(MERGE_LANES, MERGE_ROWS)>>>(
        n, d, A1, lse1, A2, lse2, A, lse);
    LAUNCH_CHECK();
}

/* Backward of attention_states (nectar.c has the derivation):
 *   dv += P^T dA,  ds_ij = P_ij (dlse_i + dA_i . v_j - dA_i . A_i),
 *   dq += ds K / sqrt(d),  dk += ds^T Q / sqrt(d).
 * cuBLAS is column-major: a row-major (r, c) matrix with stride ld is its
 * (c, r) transpose there, so each product below is written transposed. */

/* One block per query row i: tmp_ij (holding dA_i . v_j) becomes ds_ij. */
__global__ void attention_ds_kernel(int nk, int d, const float *A, const float *dA, int ldA,
                                    const float *dlse, int ldlse, const float *scores, float *tmp) {
    __shared__ float buf[32];
    int i = blockIdx.x;
    float dot = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) dot += dA[(size_t)i * ldA + c] * A[(size_t)i * ldA + c];
    dot = block_sum(dot, buf);  /* dA_i . A_i */
    float g = dlse ? dlse[(size_t)i * ldlse] : 0.0f;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        size_t ij = (size_t)i * nk + j;
        tmp[ij] = scores[ij] * (g + tmp[ij] - dot);
    }
}

void attention_states_backward_cuda(int nq, int nk, int d, const float *q, int ldq,
                                    const float *k, const float *v, int ldkv,
                                    const float *A, const float *dA, int ldA, const float *dlse, int ldlse,
                                    const float *scores, float *dq, float *dk, float *dv, float *tmp) {
    if (nk == 0 || nq == 0) return;
    const float one = 1.0f, zero = 0.0f, scale = 1.0f / sqrtf((float)d);
    if (dv)  /* dv^T (d, nk) += dA^T (d, nq) P (nq, nk) */
        CUBLAS_OP(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_T, d, nk, nq, &one, dA, ldA, scores, nk,
                                 &one, dv, ldkv));
    /* tmp^T (nk, nq) = V (nk, d) dA^T (d, nq) */
    CUBLAS_OP(cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, nk, nq, d, &one, v, ldkv, dA, ldA,
                             &zero, tmp, nk));
    attention_ds_kernel<<<nq, THREADS>>>(nk, d, A, dA, ldA, dlse, ldlse, scores, tmp);
    LAUNCH_CHECK();
    if (dq)  /* dq^T (d, nq) += scale K^T (d, nk) ds^T (nk, nq) */
        CUBLAS_OP(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_N, d, nq, nk, &scale, k, ldkv, tmp, nk,
                                 &one, dq, ldq));
    if (dk)  /* dk^T (d, nk) += scale Q^T (d, nq) ds (nq, nk) */
        CUBLAS_OP(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_T, d, nk, nq, &scale, q, ldq, tmp, nk,
                                 &one, dk, ldkv));
}

/* ------------------------------------------------------------------------ */
/* Nectar modules, batched over the KV heads of a layer                     */
/* The MLP layout is nectar.c's (mlp_layout, exported by nectar.h), applied
 * to device pointers. The modules of a layer have one shape and sit one
 * after another in params, so module g's tensor is module 0's plus g times
 * the module's parameter count: a stride for cuBLAS's strided batches. */

int moduleset_upload_cuda(ModuleSet *dev, const ModuleSet *host, int with_grads) {
    *dev = *host;
    size_t count = (size_t)host->n_layers * host->n_kv_heads;
    dev->modules = (Module *)xmalloc(count * sizeof(Module));
    /* (n_params + L G): the parameters, then every module's input_scale (input_scales_cuda) */
    dev->params = (float *)cuda_xmalloc((host->n_params + count) * sizeof(float));
    dev->grads = with_grads ? (float *)cuda_xmalloc(host->n_params * sizeof(float)) : NULL;
    DEVICE_OP(cudaMemcpy(dev->params, host->params, host->n_params * sizeof(float), cudaMemcpyHostToDevice));
    float *scales = (float *)xmalloc(count * sizeof(float));  /* (L G) */
    for (size_t i = 0; i < count; i++) {
        dev->modules[i] = host->modules[i];
        size_t offset = host->modules[i].params - host->params;
        dev->modules[i].params = dev->params + offset;
        dev->modules[i].grads = dev->grads ? dev->grads + offset : NULL;
        scales[i] = host->modules[i].input_scale;
    }
    DEVICE_OP(cudaMemcpy(dev->params + host->n_params, scales, count * sizeof(float), cudaMemcpyHostToDevice));
    free(scales);
    memset(&dev->heldout, 0, sizeof(dev->heldout));  /* prompts stay with the host set */
    return 0;
}

/* Module i's input_scale, on the device: (L G) floats after the parameters. */
static const float *input_scales_cuda(const ModuleSet *dev) { return dev->params + dev->n_params; }

void moduleset_download_cuda(ModuleSet *host, const ModuleSet *dev) {
    DEVICE_OP(cudaMemcpy(host->params, dev->params, host->n_params * sizeof(float), cudaMemcpyDeviceToHost));
}

void moduleset_free_cuda(ModuleSet *dev) {
    CUDA_CHECK(cudaFree(dev->params));
    CUDA_CHECK(cudaFree(dev->grads));
    free(dev->modules);
    memset(dev, 0, sizeof(*dev));
}

void modulework_alloc_cuda(ModuleWork *w, const ModuleSet *s, int max_q) {
    modulework_shape(w, s, max_q);
    size_t N = max_q, d = s->head_size, hidden = (size_t)w->n_hidden * N * w->max_width;
    w->x = (float *)cuda_xmalloc(N * d * sizeof(float));         /* (N, d) */
    w->dx = (float *)cuda_xmalloc(N * d * sizeof(float));        /* (N, d) */
    w->pre = (float *)cuda_xmalloc(hidden * sizeof(float));      /* (n_hidden, N, w) */
    w->hid = (float *)cuda_xmalloc(hidden * sizeof(float));      /* (n_hidden, N, w) */
    w->dhid = (float *)cuda_xmalloc(hidden * sizeof(float));     /* (n_hidden, N, w) */
    w->probs = (float *)cuda_xmalloc(N * w->max_pairs * sizeof(float));  /* (N, p) */
    w->tmp = (float *)cuda_xmalloc(N * w->max_pairs * sizeof(float));    /* (N, p) */
}

void modulework_free_cuda(ModuleWork *w) {
    float *bufs[] = { w->x, w->dx, w->pre, w->hid, w->dhid, w->probs, w->tmp };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) CUDA_CHECK(cudaFree(bufs[i]));
    memset(w, 0, sizeof(*w));
}

/* y = scale * x, elementwise */
__global__ void scale_kernel(float *y, const float *x, float scale, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = scale * x[i];
}

static void scale_cuda(float *y, const float *x, float scale, size_t n) {
    if (n == 0) return;
    scale_kernel<<<blocks_for(n, THREADS), THREADS>>>(y, x, scale, n);
    LAUNCH_CHECK();
}

/* y_i = input_scale_g x_i for the `per_module` floats of each module g:
 * x = input_scale q forward, dq = input_scale dx backward. */
__global__ void input_scale_kernel(float *y, const float *x, const float *input_scale, size_t per_module, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = input_scale[i / per_module] * x[i];
}

static void input_scale_cuda(float *y, const float *x, const float *input_scale, size_t per_module, size_t n) {
    input_scale_kernel<<<blocks_for(n, THREADS), THREADS>>>(y, x, input_scale, per_module, n);
    LAUNCH_CHECK();
}

/* A hidden layer's epilogue: pre += b, h = SiLU(pre), with module g's b
 * (n_out) for its N rows of pre, h (count, N, n_out). */
__global__ void bias_silu_kernel(float *pre, float *h, const float *b, size_t b_stride, int count, int N, int n_out) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, per = (size_t)N * n_out;
    if (i >= count * per) return;
    pre[i] += b[(i / per) * b_stride + i % n_out];
    h[i] = silu(pre[i]);
}

/* The heads' epilogue, one thread per (row r, output c <= d) of module
 * g = r / N: c < d: A_rc += bt_gc; c = d: a_r += bs_g. */
__global__ void head_biases_kernel(float *a, float *A, const float *bs, const float *bt, size_t stride, int rows,
                                   int N, int d) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, r = i / (d + 1), c = i % (d + 1);
    if (r >= (size_t)rows) return;
    size_t g = r / N;
    if (c < (size_t)d) A[r * d + c] += bt[g * stride + c];
    else a[r] += bs[g * stride];
}

/* dpre *= SiLU'(pre) = s (1 + pre (1 - s)), s = sigmoid(pre) */
__global__ void silu_backward_kernel(float *dpre, const float *pre, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float sg = 1.0f / (1.0f + expf(-pre[i]));
    dpre[i] *= sg * (1.0f + pre[i] * (1.0f - sg));
}

/* db_g (n_out, stride db_stride) += sum over the N rows of dout_g (N, n_out),
 * for g < count: one thread per (g, column), adding the rows in order. */
__global__ void bias_grad_kernel(float *db, size_t db_stride, const float *dout, int count, int N, int n_out) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)count * n_out) return;
    size_t g = i / n_out, c = i % n_out;
    const float *col = dout + g * N * n_out + c;
    float sum = 0.0f;
    for (int r = 0; r < N; r++) sum += col[(size_t)r * n_out];
    db[g * db_stride + c] += sum;
}

/* For g < count: out_g (N, n_out) = beta out_g + in_g (N, n_in) W_g^T, with
 * W_g (n_out, n_in); each operand a stride (in floats) from the one before.
 * Column-major: out_g^T (n_out, N) = W_g (n_out, n_in) in_g^T (n_in, N). */
static void matmul_batched(int count, int N, int n_in, int n_out, const float *in, size_t s_in,
                           const float *W, size_t s_W, float beta, float *out, size_t s_out) {
    const float one = 1.0f;
    CUBLAS_OP(cublasSgemmStridedBatched(cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, N, n_in, &one,
                                           W, n_in, (long long)s_W, in, n_in, (long long)s_in,
                                           &beta, out, n_out, (long long)s_out, count));
}

/* dW_g (n_out, n_in) += dout_g^T (n_out, N) in_g (N, n_in).
 * Column-major: dW_g^T (n_in, n_out) += in_g^T (n_in, N) dout_g (N, n_out). */
static void weight_grad_batched(int count, int N, int n_in, int n_out, const float *dout, size_t s_dout,
                                const float *in, size_t s_in, float *dW, size_t s_dW) {
    const float one = 1.0f;
    CUBLAS_OP(cublasSgemmStridedBatched(cublas, CUBLAS_OP_N, CUBLAS_OP_T, n_in, n_out, N, &one,
                                           in, n_in, (long long)s_in, dout, n_out, (long long)s_dout,
                                           &one, dW, n_in, (long long)s_dW, count));
}

/* din_g (N, n_in) = beta din_g + dout_g (N, n_out) W_g (n_out, n_in).
 * Column-major: din_g^T (n_in, N) = beta din_g^T + W_g^T (n_in, n_out) dout_g^T (n_out, N). */
static void input_grad_batched(int count, int N, int n_in, int n_out, const float *dout, size_t s_dout,
                               const float *W, size_t s_W, float beta, float *din, size_t s_din) {
    const float one = 1.0f;
    CUBLAS_OP(cublasSgemmStridedBatched(cublas, CUBLAS_OP_N, CUBLAS_OP_N, n_in, N, n_out, &one,
                                           W, n_in, (long long)s_W, dout, n_out, (long long)s_dout,
                                           &beta, din, n_in, (long long)s_din, count));
}

/* Backward of out_g (N, n_out) = in_g (N, n_in) W_g^T + b_g, a batch of
 * linear layers (dense: N rows per module; weights `stride` apart): dW, db
 * (when not NULL) and din (when not NULL) accumulate. */
static void linear_backward_batched(int count, int N, int n_in, int n_out, const float *in, const float *W,
                                    const float *dout, size_t stride, float *dW, float *db, float *din) {
    weight_grad_batched(count, N, n_in, n_out, dout, (size_t)N * n_out, in, (size_t)N * n_in, dW, stride);
    if (db) {
        bias_grad_kernel<<<blocks_for((size_t)count * n_out, THREADS), THREADS>>>(db, stride, dout, count, N, n_out);
        LAUNCH_CHECK();
    }
    if (din) input_grad_batched(count, N, n_in, n_out, dout, (size_t)N * n_out, W, stride, 1.0f, din, (size_t)N * n_in);
}

/* The modules first .. first + count - 1 must share a shape and lie one
 * after another; returns the stride between them. */
static size_t module_stride(const ModuleSet *s, int first, int count) {
    const Module *m0 = &s->modules[first];
    for (int g = 1; g < count; g++) {
        const Module *mg = &s->modules[first + g];
        if (mg->width != m0->width || mg->n_pairs != m0->n_pairs || mg->params != m0->params + g * m0->n_params) {
            fprintf(stderr, "error: modules %d..%d do not share one shape; batch them one layer at a time\n",
                    first, first + count - 1);
            exit(1);
        }
    }
    return m0->n_params;
}

void modules_forward_cuda(const ModuleSet *s, int first, int count, ModuleWork *w,
                          const float *q, int N, float *a, float *A) {
    int d = s->head_size;
    if (N <= 0 || count <= 0) return;
    size_t stride = module_stride(s, first, count);
    const Module *mod = &s->modules[first];
    size_t nd = (size_t)N * d;
    if (s->arch == ARCH_QUAD) {  /* softmax(W q / sqrt(d)) over the p learned pairs (W, Z) */
        int p = mod->n_pairs;
        for (int g = 0; g < count; g++) {
            const float *W = mod->params + g * stride, *Z = W + (size_t)p * d;  /* (p, d) each */
            attention_states_v2_cuda(N, p, d, q + g * nd, d, W, Z, d, p, A + g * nd, d, a + (size_t)g * N, 1,
                                     w->probs + (size_t)g * N * p);
        }
        return;
    }
    int Db = s->depth_backbone, Ds = s->depth_score, Dt = s->depth_target, width = mod->width;
    MlpParams p;  /* module `first`'s tensors; module g's are g * stride further */
    mlp_layout(d, width, Db, Ds, Dt, mod->params, &p);
    size_t layer_size = (size_t)count * N * width;  /* one hidden layer of every module: (count, N, w) */
    input_scale_cuda(w->x, q, input_scales_cuda(s) + first, nd, count * nd);  /* x = input_scale q */
    for (int i = 0; i < Db + Ds + Dt; i++) {
        float *pre = w->pre + i * layer_size, *hid = w->hid + i * layer_size;  /* (count, N, w) each */
        int prev = mlp_prev(i, Db, Ds);
        matmul_batched(count, N, d, width, w->x, nd, p.Vq[i], stride, 0.0f, pre, (size_t)N * width);  /* Vq x */
        if (prev >= 0)  /* + U h_prev */
            matmul_batched(count, N, width, width, w->hid + prev * layer_size, (size_t)N * width, p.U[i], stride,
                           1.0f, pre, (size_t)N * width);
        bias_silu_kernel<<<blocks_for(layer_size, THREADS), THREADS>>>(pre, hid, p.b[i], stride, count, N, width);
        LAUNCH_CHECK();  /* pre += b, h = SiLU(pre) */
    }
    int hs = mlp_head_input(0, Db, Ds, Dt), ht = mlp_head_input(1, Db, Ds, Dt);
    int n_s = hs >= 0 ? width : d, n_t = ht >= 0 ? width : d;
    const float *in_s = hs >= 0 ? w->hid + hs * layer_size : w->x;  /* (count, N, n_s) */
    const float *in_t = ht >= 0 ? w->hid + ht * layer_size : w->x;  /* (count, N, n_t) */
    matmul_batched(count, N, n_s, 1, in_s, (size_t)N * n_s, p.ws, stride, 0.0f, a, N);   /* a = ws . h_s */
    matmul_batched(count, N, n_t, d, in_t, (size_t)N * n_t, p.Wt, stride, 0.0f, A, nd);  /* A = Wt h_t */
    head_biases_kernel<<<blocks_for((size_t)count * N * (d + 1), THREADS), THREADS>>>(a, A, p.bs, p.bt, stride,
                                                                                    count * N, N, d);
    LAUNCH_CHECK();  /* a += bs, A += bt */
}

/* Version 2, the same interface and results, in one launch: for a decode
 * step's few queries (H / G per module), where modules_forward_cuda's dozen
 * small products and kernels each cost a launch's latency. */

/* An MLP module's layout for a kernel argument: mlp_layout's tensors as
 * offsets from the module's first parameter, and its wiring. */
typedef struct {
    int d, width, n_hidden;
    int prev[MAX_HIDDEN];  /* mlp_prev: the hidden layer feeding layer i, -1: x */
    int head_input[2];     /* mlp_head_input: the layer feeding the score and the target head, -1: x */
    size_t Vq[MAX_HIDDEN], U[MAX_HIDDEN], b[MAX_HIDDEN], ws, bs, Wt, bt;  /* U[i]: 0 when prev[i] < 0 */
} MlpPlan;

static MlpPlan mlp_plan(const ModuleSet *s, const Module *mod) {
    int Db = s->depth_backbone, Ds = s->depth_score, Dt = s->depth_target;
    const float *base = mod->params;
    MlpParams p;
    mlp_layout(s->head_size, mod->width, Db, Ds, Dt, mod->params, &p);
    MlpPlan plan;
    memset(&plan, 0, sizeof(plan));
    plan.d = s->head_size;
    plan.width = mod->width;
    plan.n_hidden = Db + Ds + Dt;
    for (int i = 0; i < plan.n_hidden; i++) {
        plan.prev[i] = mlp_prev(i, Db, Ds);
        plan.Vq[i] = p.Vq[i] - base;
        plan.U[i] = p.U[i] ? p.U[i] - base : 0;
        plan.b[i] = p.b[i] - base;
    }
    for (int head = 0; head < 2; head++) plan.head_input[head] = mlp_head_input(head, Db, Ds, Dt);
    plan.ws = p.ws - base; plan.bs = p.bs - base; plan.Wt = p.Wt - base; plan.bt = p.bt - base;
    return plan;
}

/* w . x over n floats by one warp, lanes along w (coalesced); every lane
 * gets the sum. */
__device__ float warp_dot(const float *w, const float *x, int n) {
    float sum = 0.0f;
    for (int i = threadIdx.x & 31; i < n; i += 32) sum += w[i] * x[i];
    return warp_sum(sum);
}

/* One block per query row r, of module g = r / N, through all its layers:
 *   x = input_scale_g q_r,  pre_i = Vq_i x + U_i h_prev(i) + b_i,  h_i = SiLU(pre_i),
 *   a_r = ws . h_s + bs,  A_r = Wt h_t + bt.
 * Warp k computes outputs k, k + n_warps, ... of a layer. x (rows, d), pre
 * and hid (n_hidden, rows, w) are written where modules_forward_cuda leaves
 * them (the backward reads them); a layer reads the earlier ones back after
 * a barrier, which makes a block's global writes visible to the block. */
__global__ void mlp_forward_kernel(MlpPlan plan, const float *params, size_t stride, const float *input_scale,
                                   const float *q, int N, float *x, float *pre, float *hid, float *a, float *A) {
    int d = plan.d, width = plan.width, g = blockIdx.x / N;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    size_t r = blockIdx.x, layer_size = (size_t)gridDim.x * width;  /* one hidden layer of every row */
    const float *p = params + g * stride;                            /* module g's parameters */
    float *xr = x + r * d;                                           /* (d) */
    for (int c = threadIdx.x; c < d; c += blockDim.x) xr[c] = input_scale[g] * q[r * d + c];
    __syncthreads();
    for (int i = 0; i < plan.n_hidden; i++) {
        float *pre_r = pre + i * layer_size + r * width, *hid_r = hid + i * layer_size + r * width;  /* (w) */
        const float *h_prev = plan.prev[i] >= 0 ? hid + plan.prev[i] * layer_size + r * width : NULL;  /* (w) */
        for (int o = warp; o < width; o += n_warps) {
            float z = warp_dot(p + plan.Vq[i] + (size_t)o * d, xr, d);
            if (h_prev) z += warp_dot(p + plan.U[i] + (size_t)o * width, h_prev, width);
            if (lane == 0) {
                pre_r[o] = z + p[plan.b[i] + o];
                hid_r[o] = silu(pre_r[o]);
            }
        }
        __syncthreads();  /* layer i is read by the layers after it */
    }
    int hs = plan.head_input[0], ht = plan.head_input[1], n_s = hs >= 0 ? width : d, n_t = ht >= 0 ? width : d;
    const float *in_s = hs >= 0 ? hid + hs * layer_size + r * width : xr;  /* (n_s) */
    const float *in_t = ht >= 0 ? hid + ht * layer_size + r * width : xr;  /* (n_t) */
    for (int o = warp; o <= d; o += n_warps) {  /* outputs o < d: A_r; o = d: a_r */
        float z = o < d ? warp_dot(p + plan.Wt + (size_t)o * n_t, in_t, n_t) : warp_dot(p + plan.ws, in_s, n_s);
        if (lane == 0 && o < d) A[r * d + o] = z + p[plan.bt + o];
        if (lane == 0 && o == d) a[r] = z + p[plan.bs];
    }
}

void modules_forward_v2_cuda(const ModuleSet *s, int first, int count, ModuleWork *w,
                             const float *q, int N, float *a, float *A) {
    int d = s->head_size;
    if (N <= 0 || count <= 0) return;
    size_t stride = module_stride(s, first, count);
    const Module *mod = &s->modules[first];
    if (s->arch == ARCH_QUAD) {  /* the p pairs (W, Z) of module g are set g's keys and values */
        int p = mod->n_pairs;
        attention_states_sets_cuda(count, stride, N, p, d, q, d, mod->params, mod->params + (size_t)p * d, d, p,
                                   A, d, a, 1, w->probs);
        return;
    }
    mlp_forward_kernel<<<count * N, THREADS>>>(mlp_plan(s, mod), mod->params, stride, input_scales_cuda(s) + first,
                                               q, N, w->x, w->pre, w->hid, a, A);
    LAUNCH_CHECK();
}

void modules_backward_cuda(const ModuleSet *s, int first, int count, ModuleWork *w, const float *q, int N,
                           const float *A, const float *da, const float *dA, float *dq) {
    int d = s->head_size;
    if (N <= 0 || count <= 0) return;
    size_t stride = module_stride(s, first, count);
    const Module *mod = &s->modules[first];
    size_t nd = (size_t)N * d;
    if (dq) DEVICE_OP(cudaMemset(dq, 0, count * nd * sizeof(float)));
    if (s->arch == ARCH_QUAD) {
        int p = mod->n_pairs;
        for (int g = 0; g < count; g++) {
            const float *W = mod->params + g * stride, *Z = W + (size_t)p * d;
            float *dW = mod->grads + g * stride, *dZ = dW + (size_t)p * d;
            attention_states_backward_cuda(N, p, d, q + g * nd, d, W, Z, d, A + g * nd, dA + g * nd, d,
                                           da + (size_t)g * N, 1, w->probs + (size_t)g * N * p,
                                           dq ? dq + g * nd : NULL, dW, dZ, w->tmp);
        }
        return;
    }
    int Db = s->depth_backbone, Ds = s->depth_score, Dt = s->depth_target, width = mod->width;
    MlpParams p, gr;
    mlp_layout(d, width, Db, Ds, Dt, mod->params, &p);
    mlp_layout(d, width, Db, Ds, Dt, mod->grads, &gr);
    size_t layer_size = (size_t)count * N * width;
    int n_hidden = Db + Ds + Dt;
    if (n_hidden) DEVICE_OP(cudaMemset(w->dhid, 0, n_hidden * layer_size * sizeof(float)));
    DEVICE_OP(cudaMemset(w->dx, 0, count * nd * sizeof(float)));
    /* outputs: a = ws . h_s + bs and A = Wt h_t + bt */
    int hs = mlp_head_input(0, Db, Ds, Dt), ht = mlp_head_input(1, Db, Ds, Dt);
    linear_backward_batched(count, N, hs >= 0 ? width : d, 1, hs >= 0 ? w->hid + hs * layer_size : w->x, p.ws,
                            da, stride, gr.ws, gr.bs, hs >= 0 ? w->dhid + hs * layer_size : w->dx);
    linear_backward_batched(count, N, ht >= 0 ? width : d, d, ht >= 0 ? w->hid + ht * layer_size : w->x, p.Wt,
                            dA, stride, gr.Wt, gr.bt, ht >= 0 ? w->dhid + ht * layer_size : w->dx);
    /* hidden layers, last first: h = SiLU(pre), pre = Vq x + U h_prev + b */
    for (int i = n_hidden - 1; i >= 0; i--) {
        float *pre = w->pre + i * layer_size, *dpre = w->dhid + i * layer_size;
        silu_backward_kernel<<<blocks_for(layer_size, THREADS), THREADS>>>(dpre, pre, layer_size);
        LAUNCH_CHECK();
        linear_backward_batched(count, N, d, width, w->x, p.Vq[i], dpre, stride, gr.Vq[i], gr.b[i], w->dx);
        int prev = mlp_prev(i, Db, Ds);
        if (prev >= 0)
            linear_backward_batched(count, N, width, width, w->hid + prev * layer_size, p.U[i], dpre, stride,
                                    gr.U[i], NULL, w->dhid + prev * layer_size);
    }
    if (dq) input_scale_cuda(dq, w->dx, input_scales_cuda(s) + first, nd, count * nd);  /* x = input_scale q */
}

/* ------------------------------------------------------------------------ */
/* Fitting                                                                  */

static void *upload(const void *host, size_t bytes) {
    void *dev = cuda_xmalloc(bytes);
    if (bytes) DEVICE_OP(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    return dev;
}

static float *upload_floats(const float *host, size_t n) { return (float *)upload(host, n * sizeof(float)); }

void fittargets_upload_cuda(FitTargets *dev, const FitTargets *host, int n_layers, int dim, int n_heads) {
    size_t rows = (size_t)n_layers * host->P;
    dev->P = host->P;
    dev->q = (uint16_t *)upload(host->q, rows * dim * sizeof(uint16_t));  /* (L, P, D) bf16 */
    dev->A = (uint16_t *)upload(host->A, rows * dim * sizeof(uint16_t));  /* (L, P, D) bf16 */
    dev->alpha = upload_floats(host->alpha, rows * n_heads);  /* (L, P, H) */
}

void fittargets_free_cuda(FitTargets *t) {
    CUDA_CHECK(cudaFree(t->q)); CUDA_CHECK(cudaFree(t->A)); CUDA_CHECK(cudaFree(t->alpha));
    memset(t, 0, sizeof(*t));
}

void fitbatch_alloc_cuda(FitBatch *b, const ModuleSet *s, int n_heads, int B) {
    size_t G = s->n_kv_heads, N = (size_t)B * (n_heads / s->n_kv_heads), d = s->head_size;
    b->B = B;
    b->N = (int)N;
    b->pos = (long *)xmalloc(B * sizeof(long));
    b->pos_device = (long *)cuda_xmalloc(B * sizeof(long));
    float **rows[] = {&b->a, &b->alpha_t, &b->da}, **vecs[] = {&b->q, &b->A, &b->A_t, &b->dA};
    for (int i = 0; i < 3; i++) *rows[i] = (float *)cuda_xmalloc(G * N * sizeof(float));      /* (G, N) */
    for (int i = 0; i < 4; i++) *vecs[i] = (float *)cuda_xmalloc(G * N * d * sizeof(float));  /* (G, N, d) */
    b->row_loss = (double *)cuda_xmalloc(((size_t)s->n_layers * G * N + 1) * sizeof(double));
}

void fitbatch_free_cuda(FitBatch *b) {
    free(b->pos);
    void *bufs[] = {b->pos_device, b->q, b->a, b->A, b->alpha_t, b->A_t, b->da, b->dA, b->row_loss};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) CUDA_CHECK(cudaFree(bufs[i]));
    memset(b, 0, sizeof(*b));
}

/* bf16 -> float: the 16 bits are the float's upper half */
__device__ float float_from_bf16_device(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* One thread per (row, component) of layer l's batch: row (g, bi group + j)
 * is head g group + j at position pos[bi]; q and A arrive in bf16. */

__global__ void fit_gather_kernel(float *q, float *A_t, float *alpha_t, const uint16_t *tq, const uint16_t *tA,
                                  const float *talpha, const long *pos, long P, int l, int G, int B,
                                  int group, int d) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, N = (size_t)B * group;
    if (i >= G * N * d) return;
    size_t row = i / d, c = i % d;
    int g = (int)(row / N), bi = (int)(row % N) / group, j = (int)(row % N) % group;
    int h = g * group + j, H = G * group;
    size_t at = (size_t)l * P + pos[bi];
    q[i] = float_from_bf16_device(tq[at * H * d + (size_t)h * d + c]);
    A_t[i] = float_from_bf16_device(tA[at * H * d + (size_t)h * d + c]);
    if (c == 0) alpha_t[row] = talpha[at * H + h];
}

/* One thread per row: L = lambda_alpha mean (a - alpha)^2 + lambda_A mean ||A_theta - A||^2,
 * its gradients da, dA and the row's share of the loss. */
__global__ void fit_loss_kernel(const float *a, const float *A, const float *alpha_t, const float *A_t,
                                float *da, float *dA, double *row_loss, int rows, int N, int d,
                                float lambda_alpha, float lambda_A) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float ea = a[row] - alpha_t[row];
    double loss = lambda_alpha * ea * ea / N;
    da[row] = 2.0f * lambda_alpha * ea / N;
    for (int k = 0; k < d; k++) {
        size_t i = (size_t)row * d + k;
        float e = A[i] - A_t[i];
        loss += lambda_A * e * e / N;
        dA[i] = 2.0f * lambda_A * e / N;
    }
    row_loss[row] = loss;
}

/* x[n] = sum of x[0..n), added in order by one thread */
__global__ void serial_sum_kernel(double *x, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += x[i];
    x[n] = sum;
}

double regression_grads_cuda(ModuleSet *s, ModuleWork *w, FitBatch *b, const FitTargets *t, int n_heads,
                             float lambda_alpha, float lambda_A) {
    int L = s->n_layers, G = s->n_kv_heads, d = s->head_size, group = n_heads / G, N = b->N;
    size_t rows = (size_t)G * N;
    DEVICE_OP(cudaMemcpy(b->pos_device, b->pos, b->B * sizeof(long), cudaMemcpyHostToDevice));
    for (int l = 0; l < L; l++) {
        fit_gather_kernel<<<blocks_for(rows * d, THREADS), THREADS>>>(b->q, b->A_t, b->alpha_t, t->q, t->A, t->alpha,
                                                                      b->pos_device, t->P, l, G, b->B, group, d);
        LAUNCH_CHECK();
        modules_forward_cuda(s, l * G, G, w, b->q, N, b->a, b->A);
        fit_loss_kernel<<<blocks_for(rows, THREADS), THREADS>>>(b->a, b->A, b->alpha_t, b->A_t, b->da, b->dA,
                                                                b->row_loss + l * rows, (int)rows, N, d,
                                                                lambda_alpha, lambda_A);
        LAUNCH_CHECK();
        modules_backward_cuda(s, l * G, G, w, b->q, N, b->A, b->da, b->dA, NULL);
    }
    size_t n = (size_t)L * rows;
    serial_sum_kernel<<<1, 1>>>(b->row_loss, n);
    LAUNCH_CHECK();
    double loss;
    DEVICE_OP(cudaMemcpy(&loss, b->row_loss + n, sizeof(double), cudaMemcpyDeviceToHost));
    return loss;
}

enum { NORM_BLOCKS = 256 };  /* blocks of the sum of squares; their partial sums are added in order */

/* partial[block] = sum of x_i^2 over the block's grid-stride share, in double;
 * the block adds its threads' sums as a tree in shared memory. */
__global__ void sum_squares_kernel(const float *x, size_t n, double *partial) {
    __shared__ double tree[THREADS];
    double sum = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        sum += (double)x[i] * x[i];
    tree[threadIdx.x] = sum;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) tree[threadIdx.x] += tree[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = tree[0];
}

double clip_grad_norm_cuda(float *grads, size_t n, double max_norm) {
    if (!norm_partial) norm_partial = (double *)cuda_xmalloc((NORM_BLOCKS + 1) * sizeof(double));
    sum_squares_kernel<<<NORM_BLOCKS, THREADS>>>(grads, n, norm_partial);
    LAUNCH_CHECK();
    serial_sum_kernel<<<1, 1>>>(norm_partial, NORM_BLOCKS);
    LAUNCH_CHECK();
    double norm;
    DEVICE_OP(cudaMemcpy(&norm, norm_partial + NORM_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost));
    norm = sqrt(norm);
    if (norm > max_norm) scale_cuda(grads, grads, (float)(max_norm / norm), n);
    return norm;
}

/* AdamW, elementwise (c1, c2: the bias corrections 1 - b_i^step, from the host):
 *   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,
 *   theta -= lr ((m / c1) / (sqrt(v / c2) + eps) + wd theta) */
__global__ void adamw_kernel(float *params, const float *grads, float *m, float *v, size_t n,
                             float c1, float c2, float lr, float wd, float b2) {
    const float b1 = ADAM_BETA1, eps = ADAM_EPS;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grads[i];
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    params[i] -= lr * ((m[i] / c1) / (sqrtf(v[i] / c2) + eps) + wd * params[i]);
}

void adamw_update_cuda(float *params, const float *grads, float *m, float *v, size_t n, int step,
                       float lr, float wd, float beta2) {
    if (n == 0) return;
    float c1 = 1.0f - powf(ADAM_BETA1, step), c2 = 1.0f - powf(beta2, step);
    adamw_kernel<<<blocks_for(n, THREADS), THREADS>>>(params, grads, m, v, n, c1, c2, lr, wd, beta2);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------ */
/* Forward pass: layer_forward of nectar.c, kernel for loop                 */

int model_upload_cuda(Model *dev, const Model *host) {
    *dev = *host;
    dev->params = upload_floats(host->params, host->n_params);  /* (n_params) */
    weights_view(&dev->config, dev->shared_classifier, dev->params, &dev->w);
    return 0;
}

void model_free_cuda(Model *dev) {
    CUDA_CHECK(cudaFree(dev->params));
    memset(dev, 0, sizeof(*dev));
}

void doccache_free_cuda(DocCache *dev) {
    CUDA_CHECK(cudaFree(dev->key)); CUDA_CHECK(cudaFree(dev->value));
    memset(dev, 0, sizeof(*dev));
}

/* The buffers of a group from nectar.c's table, in device memory. */
static void alloc_buffers_cuda(RunState *s, const Config *c, BufferGroup group) {
    RunBuffer table[MAX_RUN_BUFFERS];
    int n = runstate_buffers(s, c, group, table);
    for (int i = 0; i < n; i++) *table[i].buf = (float *)cuda_xmalloc(table[i].floats * sizeof(float));
}

void runstate_alloc_cuda(RunStateCuda *rs, const Model *m, const Document *doc, int max_block, int capacity) {
    memset(rs, 0, sizeof(*rs));
    RunState *s = &rs->s;
    const Config *c = &m->config;
    size_t B = max_block, H = c->n_heads, d = c->dim / H;
    s->max_block = max_block;
    s->capacity = capacity;
    s->n_seqs = 1;  /* the GPU forward runs one sequence */
    s->max_doc = doc && doc->mode == DOC_EXACT && doc->cache ? doc->cache->n : 0;
    s->with_modules = doc && doc->mode == DOC_NECTAR;
    alloc_buffers_cuda(s, c, BUFFERS_FORWARD);
    if (s->with_modules) modulework_alloc_cuda(&s->work, doc->modules, (int)(B * H));  /* all G modules of a layer */
    size_t keys = s->max_doc > capacity ? s->max_doc : capacity;
    size_t chunks = attention_decode_chunks_cuda((int)keys);
    rs->part_A = (float *)cuda_xmalloc(H * chunks * d * sizeof(float));  /* (H, chunks, d) */
    rs->part_lse = (float *)cuda_xmalloc(H * chunks * sizeof(float));    /* (H, chunks) */
    rs->tokens = (int *)cuda_xmalloc(B * sizeof(int));                   /* (B) */
    rs->logits = (float *)xmalloc(B * c->vocab_size * sizeof(float));    /* (B, V) host */
}

void runstate_free_cuda(RunStateCuda *rs) {
    static const Config any = {1, 1, 1, 1, 1, 1, 1, 1.0f, 1.0f};  /* the table's pointers do not depend on sizes */
    RunState *s = &rs->s;
    RunBuffer table[MAX_RUN_BUFFERS];
    for (int g = BUFFERS_FORWARD; g <= BUFFERS_BACKWARD; g++) {
        int n = runstate_buffers(s, &any, (BufferGroup)g, table);
        for (int i = 0; i < n; i++) CUDA_CHECK(cudaFree(*table[i].buf));
    }
    if (s->work.x) modulework_free_cuda(&s->work);
    float *bufs[] = {rs->part_A, rs->part_lse, rs->dlogits};
    for (int i = 0; i < 3; i++) CUDA_CHECK(cudaFree(bufs[i]));
    CUDA_CHECK(cudaFree(rs->tokens));
    free(rs->logits);
    memset(rs, 0, sizeof(*rs));
}

void matmul_cuda(int rows, int n_in, int n_out, const float *x, const float *W, float beta, float *y) {
    matmul_batched(1, rows, n_in, n_out, x, 0, W, 0, beta, y, 0);
}

/* copy_rows of nectar.c: rows of `width` floats between strided matrices. */
static void copy_rows_cuda(float *dst, int ld_dst, const float *src, int ld_src, int rows, int width) {
    DEVICE_OP(cudaMemcpy2D(dst, ld_dst * sizeof(float), src, ld_src * sizeof(float), width * sizeof(float),
                            rows, cudaMemcpyDeviceToDevice));
}

/* x row t = token_embedding row tokens[t] */
__global__ void embed_kernel(float *x, const float *embedding, const int *tokens, int ntok, int D) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < (size_t)ntok * D) x[i] = embedding[(size_t)tokens[i / D] * D + i % D];
}

/* The local tokens' state: causal attention over the local keys so far. A
 * single query sees every cached key: the split-KV decode. */
static void local_states_cuda(const Model *m, RunStateCuda *rs, int l, int ntok, int pos) {
    RunState *s = &rs->s;
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, KVD = d * c->n_kv_heads, group = c->n_heads / c->n_kv_heads;
    size_t layer = (size_t)l * s->capacity * KVD;
    if (ntok == 1) {
        attention_states_decode_cuda(c->n_heads, c->n_kv_heads, pos + 1, d, s->q, s->key_cache + layer,
                                     s->value_cache + layer, KVD, s->loc_A, s->loc_lse, rs->part_A, rs->part_lse);
        return;
    }
    for (int h = 0; h < c->n_heads; h++) {
        size_t kv = layer + (size_t)(h / group) * d;
        attention_states_v2_cuda(ntok, pos + ntok, d, s->q + h * d, c->dim, s->key_cache + kv, s->value_cache + kv,
                                 KVD, pos + 1, s->loc_A + h * d, c->dim, s->loc_lse + h, c->n_heads, s->scores);
    }
}

/* Exact: the document's state from its KV cache (none: the empty state). */
static void document_states_exact_cuda(const Model *m, RunStateCuda *rs, const DocCache *cache, int l, int ntok) {
    RunState *s = &rs->s;
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, KVD = d * c->n_kv_heads, group = c->n_heads / c->n_kv_heads;
    int n = cache ? cache->n : 0;
    const float *key = n ? cache->key + (size_t)l * n * KVD : NULL, *value = n ? cache->value + (size_t)l * n * KVD : NULL;
    if (ntok == 1) {
        attention_states_decode_cuda(c->n_heads, c->n_kv_heads, n, d, s->q, key, value, KVD, s->doc_A, s->doc_lse,
                                     rs->part_A, rs->part_lse);
        return;
    }
    for (int h = 0; h < c->n_heads; h++) {
        size_t kv = (size_t)(h / group) * d;
        attention_states_v2_cuda(ntok, n, d, s->q + h * d, c->dim, n ? key + kv : NULL, n ? value + kv : NULL, KVD,
                                 n, s->doc_A + h * d, c->dim, s->doc_lse + h, c->n_heads, s->scores);
    }
}

/* Nectar: the document's state from the layer's G modules in one batch;
 * module g gets the ntok x group queries of its heads, (G, ntok group, d).
 * One token's queries (H, d) are already in that layout, (G, group, d), and
 * so are its states: the decode runs the modules in place, in one launch. */
static void document_states_nectar_cuda(const Model *m, RunStateCuda *rs, const ModuleSet *ms, int l, int ntok) {
    RunState *s = &rs->s;
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, G = c->n_kv_heads, group = c->n_heads / G, N = ntok * group;
    if (ntok == 1) {
        modules_forward_v2_cuda(ms, l * G, G, &s->work, s->q, group, s->doc_lse, s->doc_A);
        return;
    }
    for (int g = 0; g < G; g++)
        copy_rows_cuda(s->mq + (size_t)g * N * d, group * d, s->q + g * group * d, c->dim, ntok, group * d);
    modules_forward_cuda(ms, l * G, G, &s->work, s->mq, N, s->ma, s->mA);
    for (int g = 0; g < G; g++) {
        copy_rows_cuda(s->doc_A + g * group * d, c->dim, s->mA + (size_t)g * N * d, group * d, ntok, group * d);
        copy_rows_cuda(s->doc_lse + g * group, c->n_heads, s->ma + (size_t)g * N, group, ntok, group);
    }
}

/* The two attention paths of nectar.c, side by side: they differ in one
 * line only, where the document's state (A, lse) comes from. */
static void attention_exact_cuda(const Model *m, RunStateCuda *rs, const Document *doc, int l, int ntok, int pos) {
    RunState *s = &rs->s;
    int d = m->config.dim / m->config.n_heads;
    document_states_exact_cuda(m, rs, doc->cache, l, ntok);     /* the document's KV cache */
    local_states_cuda(m, rs, l, ntok, pos);
    merge_states_cuda(ntok * m->config.n_heads, d, s->doc_A, s->doc_lse, s->loc_A, s->loc_lse, s->att, NULL);
}

static void attention_nectar_cuda(const Model *m, RunStateCuda *rs, const Document *doc, int l, int ntok, int pos) {
    RunState *s = &rs->s;
    int d = m->config.dim / m->config.n_heads;
    document_states_nectar_cuda(m, rs, doc->modules, l, ntok);  /* the document's modules */
    local_states_cuda(m, rs, l, ntok, pos);
    merge_states_cuda(ntok * m->config.n_heads, d, s->doc_A, s->doc_lse, s->loc_A, s->loc_lse, s->att, NULL);
}

/* One transformer layer over the block: s->x (ntok, D) in, s->x out. */
static void layer_forward_cuda(const Model *m, RunStateCuda *rs, const Document *doc, int l, int ntok, int pos) {
    RunState *s = &rs->s;
    const Config *c = &m->config;
    const Weights *w = &m->w;
    int D = c->dim, F = c->hidden_dim, d = D / c->n_heads, KVD = d * c->n_kv_heads;
    rmsnorm_cuda(s->xb, s->x, w->rms_att + (size_t)l * D, ntok, D, c->norm_eps);
    /* q, k, v (B, D / KVD) = xb Wq^T, xb Wk^T, xb Wv^T */
    matmul_cuda(ntok, D, D, s->xb, w->wq + (size_t)l * D * D, 0.0f, s->q);
    matmul_cuda(ntok, D, KVD, s->xb, w->wk + (size_t)l * KVD * D, 0.0f, s->k);
    matmul_cuda(ntok, D, KVD, s->xb, w->wv + (size_t)l * KVD * D, 0.0f, s->v);
    rope_cuda(s->q, ntok, D, D, d, doc->n + pos, c->rope_theta, 1.0f);  /* local tokens follow the document */
    rope_cuda(s->k, ntok, KVD, KVD, d, doc->n + pos, c->rope_theta, 1.0f);
    size_t cache_row = ((size_t)l * s->capacity + pos) * KVD;
    DEVICE_OP(cudaMemcpy(s->key_cache + cache_row, s->k, (size_t)ntok * KVD * sizeof(float), cudaMemcpyDeviceToDevice));
    DEVICE_OP(cudaMemcpy(s->value_cache + cache_row, s->v, (size_t)ntok * KVD * sizeof(float), cudaMemcpyDeviceToDevice));

    if (doc->mode == DOC_NECTAR) attention_nectar_cuda(m, rs, doc, l, ntok, pos);
    else attention_exact_cuda(m, rs, doc, l, ntok, pos);

    /* x_mid = x + att Wo^T */
    DEVICE_OP(cudaMemcpy(s->x_mid, s->x, (size_t)ntok * D * sizeof(float), cudaMemcpyDeviceToDevice));
    matmul_cuda(ntok, D, D, s->att, w->wo + (size_t)l * D * D, 1.0f, s->x_mid);
    /* x = x_mid + W2 (SiLU(W1 xb2) * W3 xb2), xb2 = rmsnorm(x_mid) */
    rmsnorm_cuda(s->xb2, s->x_mid, w->rms_ffn + (size_t)l * D, ntok, D, c->norm_eps);
    matmul_cuda(ntok, D, F, s->xb2, w->w1 + (size_t)l * F * D, 0.0f, s->hb);
    matmul_cuda(ntok, D, F, s->xb2, w->w3 + (size_t)l * F * D, 0.0f, s->hb2);
    swiglu_cuda(s->hgate, s->hb, s->hb2, (size_t)ntok * F);
    DEVICE_OP(cudaMemcpy(s->x, s->x_mid, (size_t)ntok * D * sizeof(float), cudaMemcpyDeviceToDevice));
    matmul_cuda(ntok, F, D, s->hgate, w->w2 + (size_t)l * D * F, 1.0f, s->x);
}

/* The logits of the block's rows [first, first + rows) into s->logits (rows, V) on the device:
 * logits = rmsnorm(x) Wcls^T. */
static void logits_on_device(const Model *m, RunState *s, int first, int rows) {
    const Config *c = &m->config;
    rmsnorm_cuda(s->xb, s->x + (size_t)first * c->dim, m->w.rms_final, rows, c->dim, c->norm_eps);
    matmul_cuda(rows, c->dim, c->vocab_size, s->xb, m->w.wcls, 0.0f, s->logits);
}

int forward_cuda(const Model *m, RunStateCuda *rs, const Document *doc, const int *tokens, int ntok, int pos,
                 int logits) {
    RunState *s = &rs->s;
    const Config *c = &m->config;
    int D = c->dim, V = c->vocab_size;
    if (doc->next) {
        fprintf(stderr, "error: the GPU runs one document; a composition of documents runs on the CPU\n");
        return -1;
    }
    if (forward_check(m, s, doc, tokens, ntok, pos) != 0) return -1;
    s->block_pos = pos;
    s->block_ntok = ntok;
    DEVICE_OP(cudaMemcpy(rs->tokens, tokens, ntok * sizeof(int), cudaMemcpyHostToDevice));
    embed_kernel<<<blocks_for((size_t)ntok * D, THREADS), THREADS>>>(s->x, m->w.token_embedding, rs->tokens, ntok, D);
    LAUNCH_CHECK();
    size_t layer_rows = (size_t)s->max_block * D;  /* saved_x: (L + 1, B, D) */
    for (int l = 0; l < c->n_layers; l++) {
        float *saved = s->back.saved_x;  /* kept for backward: layer l's input */
        if (saved) DEVICE_OP(cudaMemcpy(saved + l * layer_rows, s->x, (size_t)ntok * D * sizeof(float),
                                         cudaMemcpyDeviceToDevice));
        layer_forward_cuda(m, rs, doc, l, ntok, pos);
    }
    if (s->back.saved_x) DEVICE_OP(cudaMemcpy(s->back.saved_x + c->n_layers * layer_rows, s->x,
                                               (size_t)ntok * D * sizeof(float), cudaMemcpyDeviceToDevice));
    if (logits == LOGITS_NONE) return 0;
    /* rows [first, ntok); LOGITS_LAST's one row lands in row 0, as on the CPU */
    int first = logits == LOGITS_ALL ? 0 : ntok - 1, rows = ntok - first;
    logits_on_device(m, s, first, rows);
    DEVICE_OP(cudaMemcpy(rs->logits, s->logits, (size_t)rows * V * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Backward pass (module gradients only): layer_backward of nectar.c         */

void runstate_enable_backward_cuda(RunStateCuda *rs, const Model *m) {
    alloc_buffers_cuda(&rs->s, &m->config, BUFFERS_BACKWARD);
    size_t rows = (size_t)rs->s.max_block * m->config.vocab_size;
    rs->dlogits = (float *)cuda_xmalloc(rows * sizeof(float));  /* (B, V) */
}

/* One block per row: dx += r w do - (r^3 / n) x sum_i w_i do_i x_i,
 * r = 1 / sqrt(mean(x^2) + eps) (the backward of rmsnorm; no weight gradient). */
__global__ void rmsnorm_backward_kernel(float *dx, const float *x, const float *w, const float *dout, int n,
                                        float eps) {
    __shared__ float buf[32];
    size_t row = (size_t)blockIdx.x * n;
    float ss = 0.0f, dot = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        ss += x[row + i] * x[row + i];
        dot += w[i] * dout[row + i] * x[row + i];
    }
    ss = block_sum(ss, buf);
    dot = block_sum(dot, buf);
    float r = 1.0f / sqrtf(ss / n + eps), k = r * r * r / n * dot;
    for (int i = threadIdx.x; i < n; i += blockDim.x) dx[row + i] += r * w[i] * dout[row + i] - k * x[row + i];
}

static void rmsnorm_backward_cuda(float *dx, const float *x, const float *w, const float *dout, int rows, int n,
                                  float eps) {
    rmsnorm_backward_kernel<<<rows, THREADS>>>(dx, x, w, dout, n, eps);
    LAUNCH_CHECK();
}

/* hgate = SiLU(hb) hb2, s = sigmoid(hb):
 *   dhb2 = dhgate hb s,  dhb = dhgate hb2 s (1 + hb (1 - s)) */
__global__ void swiglu_backward_kernel(float *dhb, float *dhb2, const float *dhgate, const float *hb,
                                       const float *hb2, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float sg = 1.0f / (1.0f + expf(-hb[i]));
    dhb2[i] = dhgate[i] * hb[i] * sg;
    dhb[i] = dhgate[i] * hb2[i] * sg * (1.0f + hb[i] * (1.0f - sg));
}

/* One thread per pair r (row, head): the backward of the merge's A. With
 * g = sigmoid(lse1 - lse2), A = g A1 + (1 - g) A2:
 *   dA1 = g dA,  dA2 = (1 - g) dA,  dlse1 = -dlse2 = g (1 - g) dA . (A1 - A2);
 * both sides empty: g = 0. */
__global__ void merge_states_backward_kernel(int n, int d, const float *A1, const float *lse1, const float *A2,
                                             const float *lse2, const float *dA, float *dA1, float *dlse1,
                                             float *dA2, float *dlse2) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    size_t row = (size_t)r * d;
    float m = lse1[r] > lse2[r] ? lse1[r] : lse2[r];
    float g = m == -INFINITY ? 0.0f : expf(lse1[r] - m) / (expf(lse1[r] - m) + expf(lse2[r] - m));
    float dot = 0.0f;
    for (int c = 0; c < d; c++) {
        dA1[row + c] = g * dA[row + c];
        dA2[row + c] = (1.0f - g) * dA[row + c];
        dot += dA[row + c] * (A1[row + c] - A2[row + c]);
    }
    dlse1[r] = g * (1.0f - g) * dot;
    dlse2[r] = -dlse1[r];
}

/* dst row t (stride ld_dst) += src row t (stride ld_src), `width` floats each */
__global__ void add_rows_kernel(float *dst, int ld_dst, const float *src, int ld_src, int rows, int width) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * width) return;
    size_t t = i / width, j = i % width;
    dst[t * ld_dst + j] += src[t * ld_src + j];
}

/* dX (rows, n_in) = beta dX + dY (rows, n_out) W, W stored (n_out, n_in): input_grad of nectar.c */
static void input_grad_cuda(int rows, int n_in, int n_out, const float *dY, const float *W, float beta, float *dX) {
    input_grad_batched(1, rows, n_in, n_out, dY, 0, W, 0, beta, dX, 0);
}

/* Backward of local_states for a block from local position 0, recomputed
 * head by head; writes dq and the block's dk, dv. */
static void local_states_backward_cuda(const Model *m, RunStateCuda *rs, int l, int ntok) {
    RunState *s = &rs->s;
    BackwardBuffers *b = &s->back;
    const Config *c = &m->config;
    int D = c->dim, H = c->n_heads, d = D / H, KVD = d * c->n_kv_heads, group = H / c->n_kv_heads;
    DEVICE_OP(cudaMemset(b->dq, 0, (size_t)ntok * D * sizeof(float)));
    DEVICE_OP(cudaMemset(b->dk, 0, (size_t)ntok * KVD * sizeof(float)));
    DEVICE_OP(cudaMemset(b->dv, 0, (size_t)ntok * KVD * sizeof(float)));
    size_t layer = (size_t)l * s->capacity * KVD;
    for (int h = 0; h < H; h++) {
        size_t kv = layer + (size_t)(h / group) * d;
        attention_states_v2_cuda(ntok, ntok, d, s->q + h * d, D, s->key_cache + kv, s->value_cache + kv, KVD, 1,
                                 s->loc_A + h * d, D, s->loc_lse + h, H, s->scores);
        attention_states_backward_cuda(ntok, ntok, d, s->q + h * d, D, s->key_cache + kv, s->value_cache + kv, KVD,
                                       s->loc_A + h * d, b->dloc_A + h * d, D, b->dloc_lse + h, H, s->scores,
                                       b->dq + h * d, b->dk + (h / group) * d, b->dv + (h / group) * d, b->tmp);
    }
}

/* Exact: through the document's state into the queries (the cache is frozen). */
static void document_states_exact_backward_cuda(const Model *m, RunStateCuda *rs, const DocCache *cache, int l,
                                                int ntok) {
    RunState *s = &rs->s;
    BackwardBuffers *b = &s->back;
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, KVD = d * c->n_kv_heads, group = c->n_heads / c->n_kv_heads;
    int n = cache ? cache->n : 0;
    if (n == 0) return;
    for (int h = 0; h < c->n_heads; h++) {
        size_t kv = (size_t)l * n * KVD + (size_t)(h / group) * d;
        attention_states_v2_cuda(ntok, n, d, s->q + h * d, c->dim, cache->key + kv, cache->value + kv, KVD, n,
                                 s->doc_A + h * d, c->dim, s->doc_lse + h, c->n_heads, s->scores);
        attention_states_backward_cuda(ntok, n, d, s->q + h * d, c->dim, cache->key + kv, cache->value + kv, KVD,
                                       s->doc_A + h * d, b->ddoc_A + h * d, c->dim, b->ddoc_lse + h, c->n_heads,
                                       s->scores, b->dq + h * d, NULL, NULL, b->tmp);
    }
}

/* Nectar: through the layer's G modules (recomputed on the same queries, in
 * one batch) into their parameters and the queries. */
static void document_states_nectar_backward_cuda(const Model *m, RunStateCuda *rs, const ModuleSet *ms, int l,
                                                 int ntok) {
    RunState *s = &rs->s;
    BackwardBuffers *b = &s->back;
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, G = c->n_kv_heads, group = c->n_heads / G, N = ntok * group, row = group * d;
    for (int g = 0; g < G; g++) {
        copy_rows_cuda(s->mq + (size_t)g * N * d, row, s->q + g * row, c->dim, ntok, row);
        copy_rows_cuda(b->dmA + (size_t)g * N * d, row, b->ddoc_A + g * row, c->dim, ntok, row);
        copy_rows_cuda(b->dma + (size_t)g * N, group, b->ddoc_lse + g * group, c->n_heads, ntok, group);
    }
    modules_forward_cuda(ms, l * G, G, &s->work, s->mq, N, s->ma, s->mA);
    modules_backward_cuda(ms, l * G, G, &s->work, s->mq, N, s->mA, b->dma, b->dmA, b->dmq);
    for (int g = 0; g < G; g++) {
        add_rows_kernel<<<blocks_for((size_t)ntok * row, THREADS), THREADS>>>(b->dq + g * row, c->dim,
                                                                             b->dmq + (size_t)g * N * d, row, ntok, row);
        LAUNCH_CHECK();
    }
}

/* Backward of the merge: att = merge(document state, local state), per
 * (row, head), into the gradients of both states. */
static void merge_rows_backward_cuda(const Model *m, RunStateCuda *rs, int ntok) {
    RunState *s = &rs->s;
    BackwardBuffers *b = &s->back;
    int H = m->config.n_heads, d = m->config.dim / H;
    merge_states_backward_kernel<<<blocks_for((size_t)ntok * H, THREADS), THREADS>>>(
        ntok * H, d, s->doc_A, s->doc_lse, s->loc_A, s->loc_lse, b->datt, b->ddoc_A, b->ddoc_lse, b->dloc_A,
        b->dloc_lse);
    LAUNCH_CHECK();
}

/* The twins of attention_exact_cuda and attention_nectar_cuda: back.datt
 * in, back.dq, dk, dv out; they differ in the same one line. */
static void attention_exact_backward_cuda(const Model *m, RunStateCuda *rs, const Document *doc, int l, int ntok) {
    merge_rows_backward_cuda(m, rs, ntok);
    local_states_backward_cuda(m, rs, l, ntok);
    document_states_exact_backward_cuda(m, rs, doc->cache, l, ntok);     /* the document's KV cache */
}

static void attention_nectar_backward_cuda(const Model *m, RunStateCuda *rs, const Document *doc, int l, int ntok) {
    merge_rows_backward_cuda(m, rs, ntok);
    local_states_backward_cuda(m, rs, l, ntok);
    document_states_nectar_backward_cuda(m, rs, doc->modules, l, ntok);  /* the document's modules */
}

/* Backward of layer_forward_cuda: b->dx holds dL/d(output x); on return it
 * holds dL/d(input x). The layer's forward is recomputed first. */
static void layer_backward_cuda(const Model *m, RunStateCuda *rs, const Document *doc, int l, int ntok) {
    RunState *s = &rs->s;
    BackwardBuffers *b = &s->back;
    const Config *c = &m->config;
    const Weights *w = &m->w;
    int D = c->dim, F = c->hidden_dim, H = c->n_heads, d = D / H, KVD = d * c->n_kv_heads;
    const float *x_in = b->saved_x + (size_t)l * s->max_block * D;
    DEVICE_OP(cudaMemcpy(s->x, x_in, (size_t)ntok * D * sizeof(float), cudaMemcpyDeviceToDevice));
    layer_forward_cuda(m, rs, doc, l, ntok, 0);
    /* x = x_mid + hgate W2^T */
    input_grad_cuda(ntok, F, D, b->dx, w->w2 + (size_t)l * D * F, 0.0f, b->dhgate);
    /* hgate = SiLU(hb) * hb2 */
    swiglu_backward_kernel<<<blocks_for((size_t)ntok * F, THREADS), THREADS>>>(b->dhb, b->dhb2, b->dhgate, s->hb,
                                                                              s->hb2, (size_t)ntok * F);
    LAUNCH_CHECK();
    /* hb = xb2 W1^T, hb2 = xb2 W3^T */
    input_grad_cuda(ntok, D, F, b->dhb, w->w1 + (size_t)l * F * D, 0.0f, b->dxb);
    input_grad_cuda(ntok, D, F, b->dhb2, w->w3 + (size_t)l * F * D, 1.0f, b->dxb);
    /* xb2 = rmsnorm(x_mid); x_mid also flows straight to x */
    DEVICE_OP(cudaMemcpy(b->dx_mid, b->dx, (size_t)ntok * D * sizeof(float), cudaMemcpyDeviceToDevice));
    rmsnorm_backward_cuda(b->dx_mid, s->x_mid, w->rms_ffn + (size_t)l * D, b->dxb, ntok, D, c->norm_eps);
    /* x_mid = x + att Wo^T */
    input_grad_cuda(ntok, D, D, b->dx_mid, w->wo + (size_t)l * D * D, 0.0f, b->datt);
    /* exact or Nectar: the same one line as in layer_forward_cuda */
    if (doc->mode == DOC_NECTAR) attention_nectar_backward_cuda(m, rs, doc, l, ntok);
    else attention_exact_backward_cuda(m, rs, doc, l, ntok);
    /* q, k rotated at their positions: rotate the gradients back */
    rope_cuda(b->dq, ntok, D, D, d, doc->n, c->rope_theta, -1.0f);
    rope_cuda(b->dk, ntok, KVD, KVD, d, doc->n, c->rope_theta, -1.0f);
    /* q, k, v = xb Wq^T, xb Wk^T, xb Wv^T */
    input_grad_cuda(ntok, D, D, b->dq, w->wq + (size_t)l * D * D, 0.0f, b->dxb);
    input_grad_cuda(ntok, D, KVD, b->dk, w->wk + (size_t)l * KVD * D, 1.0f, b->dxb);
    input_grad_cuda(ntok, D, KVD, b->dv, w->wv + (size_t)l * KVD * D, 1.0f, b->dxb);
    /* xb = rmsnorm(x); x also flows straight to x_mid */
    DEVICE_OP(cudaMemcpy(b->dx, b->dx_mid, (size_t)ntok * D * sizeof(float), cudaMemcpyDeviceToDevice));
    rmsnorm_backward_cuda(b->dx, x_in, w->rms_att + (size_t)l * D, b->dxb, ntok, D, c->norm_eps);
}

/* 0 if rs can take the backward of its last block (ntok tokens), or -1
 * after a sentence. */
static int backward_check_cuda(const RunStateCuda *rs, const Document *doc, int ntok) {
    const RunState *s = &rs->s;
    if (doc->next) {
        fprintf(stderr, "error: backward takes one document, not a composition\n");
        return -1;
    }
    if (!s->back.saved_x || ntok != s->block_ntok || s->block_pos != 0) {
        fprintf(stderr, "error: backward needs a run state with backward enabled and the block just run from position 0\n");
        return -1;
    }
    return 0;
}

/* The backward of the last block (checked) from the logits' gradient in
 * rs->dlogits (ntok, V) on the device, into the modules' gradients. */
static void backward_from_device(const Model *m, RunStateCuda *rs, const Document *doc, int ntok) {
    RunState *s = &rs->s;
    BackwardBuffers *b = &s->back;
    const Config *c = &m->config;
    int D = c->dim, V = c->vocab_size, L = c->n_layers;
    /* logits = rmsnorm(x_L) Wcls^T */
    const float *x_final = b->saved_x + (size_t)L * s->max_block * D;
    input_grad_cuda(ntok, D, V, rs->dlogits, m->w.wcls, 0.0f, b->dxb);
    DEVICE_OP(cudaMemset(b->dx, 0, (size_t)ntok * D * sizeof(float)));
    rmsnorm_backward_cuda(b->dx, x_final, m->w.rms_final, b->dxb, ntok, D, c->norm_eps);
    for (int l = L - 1; l >= 0; l--) layer_backward_cuda(m, rs, doc, l, ntok);
}

int backward_cuda(const Model *m, RunStateCuda *rs, const Document *doc, int ntok, const float *dlogits) {
    if (backward_check_cuda(rs, doc, ntok) != 0) return -1;
    size_t bytes = (size_t)ntok * m->config.vocab_size * sizeof(float);
    DEVICE_OP(cudaMemcpy(rs->dlogits, dlogits, bytes, cudaMemcpyHostToDevice));
    backward_from_device(m, rs, doc, ntok);
    return 0;
}

int doccache_build_cuda(DocCache *dev, const Model *m, const int *tokens, int n, int block) {
    memset(dev, 0, sizeof(*dev));
    if (n < 1) {
        fprintf(stderr, "error: the document is empty\n");
        return -1;
    }
    if (check_tokens(m, tokens, n, "document") != 0) return -1;
    if (block > n) block = n;
    RunStateCuda s;
    runstate_alloc_cuda(&s, m, &NO_DOCUMENT, block, n);
    for (int pos = 0; pos < n; pos += block) {
        int len = n - pos < block ? n - pos : block;
        if (forward_cuda(m, &s, &NO_DOCUMENT, tokens + pos, len, pos, LOGITS_NONE) != 0) {
            runstate_free_cuda(&s);
            return -1;
        }
    }
    CUDA_CHECK(cudaDeviceSynchronize());  /* the prefill is done when this returns (callers time it) */
    /* the document's local cache becomes its KV cache */
    dev->n = n;
    dev->n_layers = m->config.n_layers;
    dev->kv_dim = m->config.dim / m->config.n_heads * m->config.n_kv_heads;
    dev->key = s.s.key_cache; s.s.key_cache = NULL;
    dev->value = s.s.value_cache; s.s.value_cache = NULL;
    dev->fingerprint = document_fingerprint(tokens, n);
    runstate_free_cuda(&s);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The fit on the GPU: compile.c's loop, this device's backend               */

/* Device copies of the modules (with gradients), of their AdamW moments,
 * of the targets and of the model, a batch, and the student of the KL term
 * (the Nectar model on the device modules). */
/* log sum_j exp(x_j) over a row of n, by one block (every thread gets it). */
__device__ float row_logsumexp(const float *x, int n, float *buf) {
    float max = -INFINITY, sum = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) max = fmaxf(max, x[j]);
    max = block_max(max, buf);
    for (int j = threadIdx.x; j < n; j += blockDim.x) sum += expf(x[j] - max);
    return max + logf(block_sum(sum, buf));
}

/* The KL term at one position (a block per row t), kl_loss and
 * kl_loss_top_k of nectar.c in fp32. The student's log-probabilities are
 * lq_j = z_j - logsumexp(z). Against the teacher's whole distribution
 * (k = 0, its logits y, lp_j = y_j - logsumexp(y)):
 *   KL_t = sum_j p_j (lp_j - lq_j),   dKL_t/dz_j = q_j - p_j;
 * against its top k (ids, lp_r) and the rest's mass p_rest (k > 0):
 *   KL_t = sum_r p_r (lp_r - lq_{id_r}) + p_rest (log p_rest - log q_rest),
 *   dKL_t/dz_j = q_j - p_j (j kept),  q_j (1 - p_rest / q_rest) (j in the rest),
 * q_rest summed over the rest itself (no 1 - sum): the kept tokens are
 * marked -1 in g first. The gradient times scale into g = dlogits (row t),
 * KL_t into row_kl[t]. */
__global__ void kl_term_kernel(const float *z, const float *y, const int *ids, const float *logp,
                               const float *log_rest, int k, int V, float scale, float *dlogits, float *row_kl) {
    __shared__ float buf[32];
    int t = blockIdx.x;
    const float *zt = z + (size_t)t * V;  /* (V) */
    float *g = dlogits + (size_t)t * V;   /* (V) */
    float lse_z = row_logsumexp(zt, V, buf), kl = 0.0f;
    if (k == 0) {
        const float *yt = y + (size_t)t * V;
        float lse_y = row_logsumexp(yt, V, buf);
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            float lp = yt[j] - lse_y, lq = zt[j] - lse_z;
            kl += expf(lp) * (lp - lq);
            g[j] = scale * (expf(lq) - expf(lp));
        }
        kl = block_sum(kl, buf);
        if (threadIdx.x == 0) row_kl[t] = kl;
        return;
    }
    ids += (size_t)t * k;
    logp += (size_t)t * k;
    for (int j = threadIdx.x; j < V; j += blockDim.x) g[j] = expf(zt[j] - lse_z);
    __syncthreads();
    for (int r = threadIdx.x; r < k; r += blockDim.x) g[ids[r]] = -1.0f;
    __syncthreads();
    float q_rest = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) q_rest += g[j] >= 0.0f ? g[j] : 0.0f;
    q_rest = block_sum(q_rest, buf);  /* also the barrier before g is rewritten */
    float p_rest = expf(log_rest[t]), rest_scale = p_rest > 0.0f ? 1.0f - p_rest / q_rest : 1.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        g[j] = g[j] >= 0.0f ? scale * g[j] * rest_scale : scale * expf(zt[j] - lse_z);
    __syncthreads();
    for (int r = threadIdx.x; r < k; r += blockDim.x) {
        float p = expf(logp[r]);
        kl += p * (logp[r] - (zt[ids[r]] - lse_z));
        g[ids[r]] -= scale * p;
    }
    kl = block_sum(kl, buf);
    if (threadIdx.x == 0) row_kl[t] = kl + (p_rest > 0.0f ? p_rest * (log_rest[t] - logf(q_rest)) : 0.0f);
}

double kl_term_cuda(const TeacherRows *teacher, const float *z, int len, int V, float weight, float *dlogits,
                    float *row_kl) {
    kl_term_kernel<<<len, THREADS>>>(z, teacher->logits, teacher->ids, teacher->logp, teacher->rest, teacher->k, V,
                                     weight / len, dlogits, row_kl);
    LAUNCH_CHECK();
    float *host = (float *)xmalloc(len * sizeof(float));  /* (len) each position's KL */
    DEVICE_OP(cudaMemcpy(host, row_kl, len * sizeof(float), cudaMemcpyDeviceToHost));
    double total = 0;
    for (int t = 0; t < len; t++) total += host[t];
    free(host);
    return total / len;
}

typedef struct {
    ModuleSet ms;
    float *m, *v;        /* (n_params) */
    FitTargets targets;
    ModuleWork work;
    FitBatch batch;
    Model model;
    Document student_doc;
    RunStateCuda student;
    TeacherRows teacher;  /* one prompt's teacher rows on the device (max_len positions): logits (k = 0) or top k */
    float *row_kl;        /* (max_len) each position's KL */
} GpuFit;

/* Device room for one prompt's teacher rows (len positions): its top k
 * (k > 0) or its logits. */
static void teacher_rows_alloc(TeacherRows *d, int k, int len, int V) {
    *d = (TeacherRows){NULL, k, NULL, NULL, NULL};
    if (k == 0) {
        d->logits = (float *)cuda_xmalloc((size_t)len * V * sizeof(float));  /* (len, V) */
        return;
    }
    d->ids = (int *)cuda_xmalloc((size_t)len * k * sizeof(int));      /* (len, k) */
    d->logp = (float *)cuda_xmalloc((size_t)len * k * sizeof(float));  /* (len, k) */
    d->rest = (float *)cuda_xmalloc(len * sizeof(float));              /* (len) */
}

static void teacher_rows_free(TeacherRows *d) {
    CUDA_CHECK(cudaFree((void *)d->logits)); CUDA_CHECK(cudaFree((void *)d->ids));
    CUDA_CHECK(cudaFree((void *)d->logp)); CUDA_CHECK(cudaFree((void *)d->rest));
}

/* A prompt's teacher rows (host, len positions) into d on the device. */
static void teacher_rows_upload(const TeacherRows *d, const TeacherRows *host, int len, int V) {
    if (d->k == 0) {
        DEVICE_OP(cudaMemcpy((void *)d->logits, host->logits, (size_t)len * V * sizeof(float), cudaMemcpyHostToDevice));
        return;
    }
    size_t rows = (size_t)len * d->k;
    DEVICE_OP(cudaMemcpy((void *)d->ids, host->ids, rows * sizeof(int), cudaMemcpyHostToDevice));
    DEVICE_OP(cudaMemcpy((void *)d->logp, host->logp, rows * sizeof(float), cudaMemcpyHostToDevice));
    DEVICE_OP(cudaMemcpy((void *)d->rest, host->rest, len * sizeof(float), cudaMemcpyHostToDevice));
}

static void gpu_start(Fit *f) {
    GpuFit *g = (GpuFit *)xmalloc(sizeof(GpuFit));
    f->device = g;
    const Config *c = &f->model->config;
    int B = f->o.batch, max_len = promptset_max_len(f->prompts);
    size_t bytes = f->ms->n_params * sizeof(float);
    moduleset_upload_cuda(&g->ms, f->ms, 1);
    g->m = (float *)cuda_xmalloc(bytes);
    g->v = (float *)cuda_xmalloc(bytes);
    DEVICE_OP(cudaMemcpy(g->m, f->adam_m, bytes, cudaMemcpyHostToDevice));
    DEVICE_OP(cudaMemcpy(g->v, f->adam_v, bytes, cudaMemcpyHostToDevice));
    fittargets_upload_cuda(&g->targets, &f->td->fit, c->n_layers, c->dim, c->n_heads);
    modulework_alloc_cuda(&g->work, f->ms, B * c->n_heads);  /* a layer's G modules, B H / G queries each */
    fitbatch_alloc_cuda(&g->batch, f->ms, c->n_heads, B);
    model_upload_cuda(&g->model, f->model);
    Document student = {DOC_NECTAR, f->ms->n_doc, NULL, &g->ms, NULL};
    g->student_doc = student;
    if (fit_uses_kl(&f->o)) {
        runstate_alloc_cuda(&g->student, &g->model, &g->student_doc, max_len, max_len);
        runstate_enable_backward_cuda(&g->student, &g->model);
        teacher_rows_alloc(&g->teacher, f->td->top_k, max_len, c->vocab_size);
        g->row_kl = (float *)cuda_xmalloc(max_len * sizeof(float));
    }
}

static double gpu_regression(Fit *f, const long *pos) {
    GpuFit *g = (GpuFit *)f->device;
    DEVICE_OP(cudaMemset(g->ms.grads, 0, g->ms.n_params * sizeof(float)));
    if (f->stage->weight_alpha + f->stage->weight_A == 0) return 0;
    memcpy(g->batch.pos, pos, g->batch.B * sizeof(long));
    return regression_grads_cuda(&g->ms, &g->work, &g->batch, &g->targets, f->model->config.n_heads,
                                 f->stage->weight_alpha, f->stage->weight_A);
}

/* The KL term on the device: the student's logits never leave it; only
 * the teacher's rows come in and each position's KL goes out. */
static double gpu_kl(Fit *f, const int *tokens, int len, const TeacherRows *teacher, float weight) {
    GpuFit *g = (GpuFit *)f->device;
    int V = g->model.config.vocab_size;
    forward_cuda(&g->model, &g->student, &g->student_doc, tokens, len, 0, LOGITS_NONE);
    logits_on_device(&g->model, &g->student.s, 0, len);
    teacher_rows_upload(&g->teacher, teacher, len, V);
    double kl = kl_term_cuda(&g->teacher, g->student.s.logits, len, V, weight, g->student.dlogits, g->row_kl);
    backward_from_device(&g->model, &g->student, &g->student_doc, len);
    return kl;
}

static double gpu_update(Fit *f, float lr, int t) {
    GpuFit *g = (GpuFit *)f->device;
    double norm = clip_grad_norm_cuda(g->ms.grads, g->ms.n_params, 1.0);
    if (t == 1) {
        DEVICE_OP(cudaMemset(g->m, 0, g->ms.n_params * sizeof(float)));
        DEVICE_OP(cudaMemset(g->v, 0, g->ms.n_params * sizeof(float)));
    }
    adamw_update_cuda(g->ms.params, g->ms.grads, g->m, g->v, g->ms.n_params, t, lr, f->o.weight_decay, ADAM_BETA2);
    return norm;
}

static void gpu_download(Fit *f) {
    GpuFit *g = (GpuFit *)f->device;
    size_t bytes = f->ms->n_params * sizeof(float);
    moduleset_download_cuda(f->ms, &g->ms);
    DEVICE_OP(cudaMemcpy(f->adam_m, g->m, bytes, cudaMemcpyDeviceToHost));
    DEVICE_OP(cudaMemcpy(f->adam_v, g->v, bytes, cudaMemcpyDeviceToHost));
}

static void gpu_finish(Fit *f) {
    GpuFit *g = (GpuFit *)f->device;
    gpu_download(f);
    CUDA_CHECK(cudaFree(g->m)); CUDA_CHECK(cudaFree(g->v));
    if (fit_uses_kl(&f->o)) {
        runstate_free_cuda(&g->student);
        teacher_rows_free(&g->teacher);
        CUDA_CHECK(cudaFree(g->row_kl));
    }
    model_free_cuda(&g->model);
    fitbatch_free_cuda(&g->batch);
    modulework_free_cuda(&g->work);
    fittargets_free_cuda(&g->targets);
    moduleset_free_cuda(&g->ms);
    free(g);
    f->device = NULL;
}

static const FitBackend GPU_FIT = {gpu_start, gpu_regression, gpu_kl, gpu_update, gpu_download, gpu_finish};
const FitBackend *fit_backend_cuda(void) { return &GPU_FIT; }
