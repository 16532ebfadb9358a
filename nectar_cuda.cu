/* nectar_cuda.cu - the CUDA path of Nectar in C, mirroring nectar.c name for
 * name (suffix _cuda). Read next to nectar.c: checks and memory, the
 * transformer's row-wise ops, attention states and their merge (the split-KV
 * decode is where the merge pays), Nectar modules. Every kernel is version 1:
 * a plain port of the CPU loop, validated by tests/test_cuda.cu. Shapes use
 * the legend at the top of nectar.h; every pointer is device memory.
 */
#include "nectar_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Checks and memory                                                        */

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
    cuda_check(cudaMemset(p, 0, n), "cudaMemset(p, 0, n)", file, line);
    return p;
}

static cublasHandle_t cublas;  /* created by nectar_cuda_init */

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
    cublas = NULL;
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

/* One block per row. o = w * x * r,  r = 1 / sqrt(mean(x^2) + 1e-5) */
__global__ void rmsnorm_kernel(float *o, const float *x, const float *w, int n) {
    __shared__ float buf[32];
    const float *xr = x + (size_t)blockIdx.x * n;  /* (n) this row */
    float *orow = o + (size_t)blockIdx.x * n;      /* (n) */
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, buf);  /* every read of xr is done before any write: o may alias x */
    ss = 1.0f / sqrtf(ss / n + 1e-5f);
    for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = w[i] * (ss * xr[i]);
}

void rmsnorm_cuda(float *o, const float *x, const float *w, int rows, int n) {
    if (rows <= 0) return;
    rmsnorm_kernel<<<rows, THREADS>>>(o, x, w, n);
    CUDA_CHECK(cudaGetLastError());
}

/* One thread per pair (v_i, v_i+1) of row t, rotated by the angle
 * (pos + t) * theta^(-(i mod d) / d), theta = 10000 (llama2.c convention).
 * The frequency is powf rounded once: pow in double, then float, which gives
 * the bits of the CPU's powf for every power-of-two head size (CUDA's powf
 * may be a few ulps off, and at position 4000 one ulp moves the angle by
 * 2e-4). */
__global__ void rope_kernel(float *vec, int rows, int ld, int n, int head_size, int pos, float direction) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x, half = n / 2;
    if (idx >= (size_t)rows * half) return;
    int t = (int)(idx / half), i = 2 * (int)(idx % half);
    float *row = vec + (size_t)t * ld;  /* (n) */
    float freq = 1.0f / (float)pow(10000.0, (double)((i % head_size) / (float)head_size));
    float angle = (pos + t) * freq, fcr = cosf(angle), fci = direction * sinf(angle);
    float v0 = row[i], v1 = row[i + 1];
    row[i] = v0 * fcr - v1 * fci;
    row[i + 1] = v0 * fci + v1 * fcr;
}

void rope_cuda(float *vec, int rows, int ld, int n, int head_size, int pos, float direction) {
    size_t pairs = (size_t)rows * (n / 2);
    if (pairs == 0) return;
    rope_kernel<<<blocks_for(pairs, THREADS), THREADS>>>(vec, rows, ld, n, head_size, pos, direction);
    CUDA_CHECK(cudaGetLastError());
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
    CUDA_CHECK(cudaGetLastError());
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
    if (threadIdx.x < d) {
        float total = 0.0f;
        for (int sl = 0; sl < n_slices; sl++) total += acc[sl * d + threadIdx.x];
        A[threadIdx.x] = total;
    }
}

/* One block per query i; shared memory: q_i (d), acc (blockDim.x). */
__global__ void attention_states_kernel(int nk, int d, const float *q, int ldq,
                                        const float *k, const float *v, int ldkv, int visible,
                                        float *A, int ldA, float *lse, int ldlse, float *scores) {
    extern __shared__ float smem[];
    __shared__ float buf[32];
    float *qs = smem, *acc = smem + d;
    int i = blockIdx.x;
    float *row = scores + (size_t)i * nk;  /* (nk) */
    float *Ai = A + (size_t)i * ldA;       /* (d) */
    long long sees = (long long)visible + i;
    int seen = sees < nk ? (int)sees : nk;
    if (seen <= 0) {  /* empty set: state (0, -inf) */
        for (int j = threadIdx.x; j < nk; j += blockDim.x) row[j] = 0.0f;
        for (int c = threadIdx.x; c < d; c += blockDim.x) Ai[c] = 0.0f;
        if (threadIdx.x == 0) lse[(size_t)i * ldlse] = -INFINITY;
        return;
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) qs[c] = q[(size_t)i * ldq + c];
    for (int j = seen + threadIdx.x; j < nk; j += blockDim.x) row[j] = 0.0f;  /* masked keys: P = 0 */
    __syncthreads();
    attention_state_device(seen, d, qs, k, v, ldkv, row, Ai, lse + (size_t)i * ldlse, acc, buf);
}

static void check_head_size(int d) {
    if (d <= MAX_HEAD) return;
    fprintf(stderr, "error: head size %d exceeds the %d the CUDA attention kernels support\n", d, MAX_HEAD);
    exit(1);
}

void attention_states_cuda(int nq, int nk, int d, const float *q, int ldq,
                           const float *k, const float *v, int ldkv, int visible,
                           float *A, int ldA, float *lse, int ldlse, float *scores) {
    if (nq <= 0) return;
    check_head_size(d);
    size_t smem = (size_t)(d + THREADS) * sizeof(float);
    attention_states_kernel<<<nq, THREADS, smem>>>(nk, d, q, ldq, k, v, ldkv, visible,
                                                   A, ldA, lse, ldlse, scores);
    CUDA_CHECK(cudaGetLastError());
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
        CUDA_CHECK(cudaGetLastError());
    }
    int threads = (d + 31) / 32 * 32;
    attention_decode_merge_kernel<<<n_heads, threads>>>(n_chunks, d, part_A, part_lse, A, lse);
    CUDA_CHECK(cudaGetLastError());
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
    CUDA_CHECK(cudaGetLastError());
}

/* ------------------------------------------------------------------------ */
/* Nectar modules                                                           */
/* The MLP layout is nectar.c's (mlp_layout, exported by nectar.h), applied
 * to a device pointer. */

void modulework_alloc_cuda(ModuleWork *w, const ModuleSet *s, int max_q) {
    modulework_shape(w, s, max_q);
    size_t N = max_q, d = s->head_size, hidden = (size_t)w->n_hidden * N * w->max_width;
    size_t wide = w->max_pairs > w->max_width ? w->max_pairs : w->max_width;
    w->x = (float *)cuda_xmalloc(N * d * sizeof(float));         /* (N, d) */
    w->dx = (float *)cuda_xmalloc(N * d * sizeof(float));        /* (N, d) */
    w->pre = (float *)cuda_xmalloc(hidden * sizeof(float));      /* (n_hidden, N, w) */
    w->hid = (float *)cuda_xmalloc(hidden * sizeof(float));      /* (n_hidden, N, w) */
    w->dhid = (float *)cuda_xmalloc(hidden * sizeof(float));     /* (n_hidden, N, w) */
    w->probs = (float *)cuda_xmalloc(N * w->max_pairs * sizeof(float));  /* (N, p) */
    w->tmp = (float *)cuda_xmalloc(N * wide * sizeof(float));    /* (N, max(p, w)) */
}

void modulework_free_cuda(ModuleWork *w) {
    float *bufs[] = { w->x, w->dx, w->pre, w->hid, w->dhid, w->probs, w->tmp };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) CUDA_CHECK(cudaFree(bufs[i]));
    memset(w, 0, sizeof(*w));
}

float *moduleset_upload_cuda(const ModuleSet *s) {
    float *params = (float *)cuda_xmalloc(s->n_params * sizeof(float));  /* (n_params) */
    CUDA_CHECK(cudaMemcpy(params, s->params, s->n_params * sizeof(float), cudaMemcpyHostToDevice));
    return params;
}

/* y = scale * x, elementwise */
__global__ void scale_kernel(float *y, const float *x, float scale, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = scale * x[i];
}

/* h = SiLU(pre), elementwise */
__global__ void silu_kernel(float *h, const float *pre, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) h[i] = silu(pre[i]);
}

/* Every row of out (N, n_out) = b (n_out). */
__global__ void fill_rows_kernel(float *out, const float *b, int N, int n_out) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < (size_t)N * n_out) out[i] = b[i % n_out];
}

/* out (N, n_out) += in (N, n_in) W^T, W stored (n_out, n_in), all row-major.
 * cuBLAS is column-major: a row-major (r, c) matrix is its transpose there,
 * so this is out^T (n_out, N) += W (n_out, n_in) in^T, with W read
 * transposed from its column-major (n_in, n_out) view. */
static void gemm_rows(int N, int n_in, int n_out, const float *in, const float *W, float *out) {
    const float one = 1.0f;
    CUBLAS_CHECK(cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, N, n_in, &one,
                             W, n_in, in, n_in, &one, out, n_out));
}

/* out (N, n_out) = in (N, n_in) W^T + b: a linear layer, W stored (n_out, n_in). */
static void linear_forward_cuda(int N, int n_in, int n_out, const float *in, const float *W,
                                const float *b, float *out) {
    fill_rows_kernel<<<blocks_for((size_t)N * n_out, THREADS), THREADS>>>(out, b, N, n_out);
    CUDA_CHECK(cudaGetLastError());
    gemm_rows(N, n_in, n_out, in, W, out);
}

void module_forward_cuda(const ModuleSet *s, const Module *mod, const float *params,
                         ModuleWork *w, const float *q, int N, float *a, float *A) {
    int d = s->head_size;
    if (N <= 0) return;
    const float *base = params + (mod->params - s->params);  /* this module's block on the device */
    if (s->arch == ARCH_QUAD) {
        const float *W = base, *Z = base + (size_t)mod->n_pairs * d;  /* (p, d) each */
        attention_states_cuda(N, mod->n_pairs, d, q, d, W, Z, d, mod->n_pairs, A, d, a, 1, w->probs);
        return;
    }
    int Db = s->depth_backbone, Ds = s->depth_score, Dt = s->depth_target, width = mod->width;
    MlpParams p;  /* views into device memory */
    mlp_layout(d, width, Db, Ds, Dt, (float *)base, &p);
    size_t layer_size = (size_t)N * width;
    scale_kernel<<<blocks_for((size_t)N * d, THREADS), THREADS>>>(w->x, q, mod->input_scale, (size_t)N * d);
    CUDA_CHECK(cudaGetLastError());  /* x = input_scale q */
    for (int i = 0; i < Db + Ds + Dt; i++) {
        float *pre = w->pre + i * layer_size, *hid = w->hid + i * layer_size;  /* (N, w) each */
        int prev = mlp_prev(i, Db, Ds);
        linear_forward_cuda(N, d, width, w->x, p.Vq[i], p.b[i], pre);         /* Vq x + b */
        if (prev >= 0) gemm_rows(N, width, width, w->hid + prev * layer_size, p.U[i], pre);  /* + U h_prev */
        silu_kernel<<<blocks_for(layer_size, THREADS), THREADS>>>(hid, pre, layer_size);  /* h = SiLU(pre) */
        CUDA_CHECK(cudaGetLastError());
    }
    int hs = mlp_head_input(0, Db, Ds, Dt), ht = mlp_head_input(1, Db, Ds, Dt);
    const float *in_s = hs >= 0 ? w->hid + hs * layer_size : w->x;  /* (N, w) or (N, d) */
    const float *in_t = ht >= 0 ? w->hid + ht * layer_size : w->x;
    linear_forward_cuda(N, hs >= 0 ? width : d, 1, in_s, p.ws, p.bs, a);  /* a = ws . h + bs */
    linear_forward_cuda(N, ht >= 0 ? width : d, d, in_t, p.Wt, p.bt, A);  /* A = Wt h + bt */
}
