/* cuda_emu.cpp - the CPU emulator's runtime: kernel launches run block by
 * block, each CUDA thread a fiber; memory calls are host memory; cuBLAS is
 * OpenBLAS. See cuda_runtime.h for the scheduling rule. */
/* Fibers switch by _longjmp to another stack, which _FORTIFY_SOURCE's
 * checked longjmp (on by default in some distributions' compilers) would
 * take for stack corruption. */
#undef _FORTIFY_SOURCE
#include "cuda_runtime.h"
#include "cublas_v2.h"

#include <cblas.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <vector>

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {
enum State { RUNNABLE, AT_SYNCTHREADS, AT_SHUFFLE, DONE };
struct Fiber {
    ucontext_t start;  /* the first entry, through makecontext */
    jmp_buf resume;    /* later entries: _setjmp/_longjmp skip the signal-mask system call */
    bool started;
    State state;
    dim3 tid;
    int linear;        /* threadIdx as one number: lane = linear % 32, warp = linear / 32 */
    char *stack;
};
enum { STACK_BYTES = 128 * 1024, MAX_THREADS = 1024, STATIC_SHARED_LIMIT = 48 * 1024 };
std::vector<Fiber> fibers;
int current;                          /* the running fiber */
jmp_buf scheduler;
ucontext_t scheduler_context;
const std::function<void()> *kernel;  /* the launch's body */
std::vector<char> dynamic_shared;
std::vector<std::pair<void *, size_t>> static_shared;  /* every __shared__ array seen so far */
long passes;                          /* scheduling passes so far: odd ones run the fibers backwards */
float lanes[MAX_THREADS / 32][32];    /* one value per lane, for the shuffles */
cudaError_t last_error = cudaSuccess;

void fiber_main() {
    (*kernel)();
    Fiber &f = fibers[current];
    f.state = DONE;
    lanes[f.linear / 32][f.linear % 32] = NAN;  /* a shuffle reading an exited lane gets NaN */
    _longjmp(scheduler, 1);
}

void wait_at(State s) {
    fibers[current].state = s;
    if (!_setjmp(fibers[current].resume)) _longjmp(scheduler, 1);
}

/* Runs fiber i up to its next scheduling point (or its end). */
void run_fiber(int i) {
    current = i;
    threadIdx = fibers[i].tid;
    if (_setjmp(scheduler)) return;
    if (fibers[i].started) _longjmp(fibers[i].resume, 1);
    fibers[i].started = true;
    swapcontext(&scheduler_context, &fibers[i].start);
}

/* Runs the n fibers of one block to the end. */
void run_block(int n) {
    for (int i = 0; i < n; i++) {
        Fiber &f = fibers[i];
        f.linear = i;
        f.tid = dim3(i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y));
        f.state = RUNNABLE;
        f.started = false;
        getcontext(&f.start);
        f.start.uc_stack.ss_sp = f.stack;
        f.start.uc_stack.ss_size = STACK_BYTES;
        f.start.uc_link = NULL;
        makecontext(&f.start, fiber_main, 0);
    }
    for (;;) {
        int reverse = passes++ % 2;  /* alternate the order, so a missing barrier cannot hide behind one */
        for (int k = 0; k < n; k++) {  /* every runnable fiber up to its next scheduling point */
            int i = reverse ? n - 1 - k : k;
            if (fibers[i].state == RUNNABLE) run_fiber(i);
        }
        int alive = 0, at_sync = 0, released = 0;
        for (int i = 0; i < n; i++) {
            alive += fibers[i].state != DONE;
            at_sync += fibers[i].state == AT_SYNCTHREADS;
        }
        if (alive == 0) return;
        for (int w = 0; w * 32 < n; w++) {  /* a warp whose live lanes all wait at a shuffle goes on */
            int end = w * 32 + 32 < n ? w * 32 + 32 : n, lanes_alive = 0, lanes_waiting = 0;
            for (int i = w * 32; i < end; i++) {
                lanes_alive += fibers[i].state != DONE;
                lanes_waiting += fibers[i].state == AT_SHUFFLE;
            }
            if (lanes_alive > 0 && lanes_waiting == lanes_alive) {
                for (int i = w * 32; i < end; i++) if (fibers[i].state == AT_SHUFFLE) fibers[i].state = RUNNABLE;
                released = 1;
            }
        }
        if (released) continue;
        if (at_sync == alive && alive < n) {
            fprintf(stderr, "cuda_emu: __syncthreads in block (%u, %u, %u) reached by %d threads; the other %d "
                    "returned before it\n", blockIdx.x, blockIdx.y, blockIdx.z, alive, n - alive);
            abort();
        }
        if (at_sync == alive) {  /* every thread at __syncthreads */
            for (int i = 0; i < n; i++) if (fibers[i].state == AT_SYNCTHREADS) fibers[i].state = RUNNABLE;
            continue;
        }
        fprintf(stderr, "cuda_emu: deadlock in block (%u, %u, %u): of %d live threads, %d wait at __syncthreads, "
                "the others at a warp shuffle\n", blockIdx.x, blockIdx.y, blockIdx.z, alive, at_sync);
        abort();
    }
}
}  // namespace

void *emu_dynamic_shared(void) { return dynamic_shared.data(); }

EmuShared::EmuShared(void *p, size_t bytes) {
    static_shared.push_back({p, bytes});
    memset(p, 0xff, bytes);  /* NaN until written, in this block and (see emu_run) every later one */
}

void __syncthreads(void) { wait_at(AT_SYNCTHREADS); }

/* Every lane writes its value, waits for the warp, reads its source lane's,
 * and waits again before the slots can be reused. */
float emu_shuffle(float v, int mode, int arg) {
    int lane = fibers[current].linear % 32, warp = fibers[current].linear / 32;
    lanes[warp][lane] = v;
    wait_at(AT_SHUFFLE);
    int src = mode == 0 ? lane ^ arg : mode == 1 ? lane + arg : arg;
    float got = src >= 0 && src < 32 ? lanes[warp][src] : v;
    wait_at(AT_SHUFFLE);
    return got;
}

void emu_run(const std::function<void()> &body, dim3 grid, dim3 block, size_t smem) {
    int n = (int)(block.x * block.y * block.z);
    if (!grid.x || !grid.y || !grid.z || n <= 0 || n > MAX_THREADS || grid.y > 65535 || grid.z > 65535 ||
        smem > STATIC_SHARED_LIMIT) {
        fprintf(stderr, "cuda_emu: invalid launch: grid (%u, %u, %u), block (%u, %u, %u), %zu bytes of shared memory\n",
                grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    kernel = &body;
    gridDim = grid;
    blockDim = block;
    while ((int)fibers.size() < n) {
        fibers.push_back(Fiber());
        fibers.back().stack = (char *)malloc(STACK_BYTES);
    }
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                dynamic_shared.assign(smem + 16, (char)0xff);  /* NaN until written */
                for (auto &array : static_shared) memset(array.first, 0xff, array.second);
                for (int w = 0; w < MAX_THREADS / 32; w++)
                    for (int l = 0; l < 32; l++) lanes[w][l] = NAN;
                run_block(n);
            }
}

/* ------------------------------------------------------------------------ */
/* Runtime API: one device, host memory                                     */

const char *cudaGetErrorString(cudaError_t err) {
    return err == cudaSuccess ? "no error" : err == cudaErrorInvalidConfiguration ? "invalid launch configuration"
         : err == cudaErrorMemoryAllocation ? "out of memory" : "invalid value";
}
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int) {
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "CPU emulator of CUDA (tests/cuda_emu), not a GPU");
    prop->major = 9;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = malloc(n ? n : 1);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xff, n);  /* garbage, as cudaMalloc gives: NaN as floats */
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemset(void *p, int value, size_t n) { if (n) memset(p, value, n); return cudaSuccess; }
cudaError_t cudaMemset2D(void *p, size_t pitch, int value, size_t width, size_t height) {
    if (width > pitch) return cudaErrorInvalidValue;
    for (size_t r = 0; r < height; r++) memset((char *)p + r * pitch, value, width);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind) {
    if (n) memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind) {
    if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
    for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { cudaError_t err = last_error; last_error = cudaSuccess; return err; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

/* ------------------------------------------------------------------------ */
/* cuBLAS through OpenBLAS                                                  */

struct EmuCublas { int unused; };
cublasStatus_t cublasCreate(cublasHandle_t *handle) { *handle = new EmuCublas(); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy(cublasHandle_t handle) { delete handle; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char *cublasGetStatusString(cublasStatus_t status) {
    return status == CUBLAS_STATUS_SUCCESS ? "success" : "invalid value";
}

/* C = alpha op(A) op(B) + beta C, column-major; cuBLAS's checks of the
 * leading dimensions; beta 0 never reads C (it may hold NaN). cuBLAS adds
 * the k terms of each entry in an order of its own (splitting k among
 * threads or blocks); here too the order is not the CPU's: the first k / 2
 * terms and the rest are two OpenBLAS products added into C, so products
 * differ from the CPU's by rounding, as on a GPU, and the tests' tolerances
 * are exercised. */
cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc) {
    int rows_A = ta == CUBLAS_OP_N ? m : k, rows_B = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (rows_A > 1 ? rows_A : 1) || ldb < (rows_B > 1 ? rows_B : 1) ||
        ldc < (m > 1 ? m : 1)) {
        fprintf(stderr, "cuda_emu: cublasSgemm: invalid m %d, n %d, k %d, lda %d, ldb %d, ldc %d\n", m, n, k, lda, ldb, ldc);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) C[(size_t)j * ldc + i] = *beta == 0.0f ? 0.0f : *beta * C[(size_t)j * ldc + i];
    int half = k / 2;  /* op(A) columns and op(B) rows [0, half), then [half, k) */
    const float *A_rest = ta == CUBLAS_OP_N ? A + (size_t)half * lda : A + half;
    const float *B_rest = tb == CUBLAS_OP_N ? B + half : B + (size_t)half * ldb;
    CBLAS_TRANSPOSE op_A = ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    CBLAS_TRANSPOSE op_B = tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    if (half > 0) cblas_sgemm(CblasColMajor, op_A, op_B, m, n, half, *alpha, A, lda, B, ldb, 1.0f, C, ldc);
    if (k - half > 0)
        cblas_sgemm(CblasColMajor, op_A, op_B, m, n, k - half, *alpha, A_rest, lda, B_rest, ldb, 1.0f, C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                                         int m, int n, int k, const float *alpha,
                                         const float *A, int lda, long long stride_A,
                                         const float *B, int ldb, long long stride_B, const float *beta,
                                         float *C, int ldc, long long stride_C, int batch) {
    for (int i = 0; i < batch; i++) {
        cublasStatus_t status = cublasSgemm(handle, ta, tb, m, n, k, alpha, A + i * stride_A, lda,
                                            B + i * stride_B, ldb, beta, C + i * stride_C, ldc);
        if (status != CUBLAS_STATUS_SUCCESS) return status;
    }
    return CUBLAS_STATUS_SUCCESS;
}
