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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <map>
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
const char *kernel_name;              /* its name, for reports; NULL between launches */
std::vector<char> dynamic_shared;
std::vector<std::pair<void *, size_t>> static_shared;  /* every __shared__ array seen so far */
long passes;                          /* scheduling passes so far: odd ones run the fibers backwards */
float lanes[MAX_THREADS / 32][32];    /* one value per lane, for the shuffles */
cudaError_t last_error = cudaSuccess;

/* Device memory: every live cudaMalloc block by its start address, so a
 * call can tell a device pointer from a host one and see a range that runs
 * past the end of its block. Each block has pages of its own:
 *  - a guard page, never readable, right after its last byte (or, with
 *    CUDA_EMU_GUARD=before, right before its first): a kernel that steps
 *    just out of its block faults at once;
 *  - the block's pages are readable only while something that may touch
 *    them runs (a kernel given a pointer into the block, or a copy, memset
 *    or product on it): host code that reads device memory faults, as on a
 *    GPU, and so does a kernel that reaches a block it was not given.
 * report_fault says which of these happened. */
struct DeviceBlock {
    size_t size;
    char *mapping;  /* (mapped) the block's pages and its guard page */
    size_t mapped;
    char *pages;    /* (pages_size bytes) the pages that hold the block */
    size_t pages_size;
};
std::map<const char *, DeviceBlock> device_blocks;
std::vector<const DeviceBlock *> open_blocks;  /* readable until close_blocks() */
bool guard_before;                             /* CUDA_EMU_GUARD=before */

void protect(char *pages, size_t n, int prot) {
    if (mprotect(pages, n, prot) == 0) return;
    perror("cuda_emu: mprotect");
    abort();
}

/* The block holding [p, p + bytes) (bytes 0: p in [start, end]), or NULL. */
const DeviceBlock *block_of(const void *p, size_t bytes) {
    auto next = device_blocks.upper_bound((const char *)p);
    if (next == device_blocks.begin()) return NULL;
    auto block = std::prev(next);
    return (const char *)p + bytes <= block->first + block->second.size ? &block->second : NULL;
}

bool on_device(const void *p, size_t bytes) { return block_of(p, bytes) != NULL; }

/* Makes p's block readable and writable, if p is device memory. */
void open_block(const void *p) {
    const DeviceBlock *block = block_of(p, 0);
    if (!block) return;
    protect(block->pages, block->pages_size, PROT_READ | PROT_WRITE);
    open_blocks.push_back(block);
}

void close_blocks() {
    for (const DeviceBlock *block : open_blocks) protect(block->pages, block->pages_size, PROT_NONE);
    open_blocks.clear();
}

[[noreturn]] void fail(const char *call, const char *what, const void *p, size_t bytes) {
    fprintf(stderr, "cuda_emu: %s: %s (%p, %zu bytes)\n", call, what, p, bytes);
    abort();
}

void require_device(const char *call, const char *what, const void *p, size_t bytes) {
    if (bytes && !on_device(p, bytes)) fail(call, what, p, bytes);
}

/* A copy's kind must say where its pointers are; a device range must lie in
 * its block. (Real CUDA leaves a mismatch undefined.) Opens the blocks. */
void check_and_open_copy(const char *call, const void *dst, size_t dst_bytes, const void *src, size_t src_bytes,
                         cudaMemcpyKind kind) {
    if (dst_bytes == 0) return;
    if (kind != cudaMemcpyDefault) {  /* Default: wherever the pointers are */
        bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
        bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
        if (dst_device) require_device(call, "the destination is not device memory, or runs past its block", dst,
                                       dst_bytes);
        else if (on_device(dst, 0)) fail(call, "the destination is device memory, but the copy's kind says host", dst,
                                         dst_bytes);
        if (src_device) require_device(call, "the source is not device memory, or runs past its block", src,
                                       src_bytes);
        else if (on_device(src, 0)) fail(call, "the source is device memory, but the copy's kind says host", src,
                                         src_bytes);
    }
    open_block(dst);
    open_block(src);
}

/* A column-major matrix of `rows` x `cols` with leading dimension ld spans this many floats. */
size_t matrix_extent(int rows, int cols, int ld) {
    return rows > 0 && cols > 0 ? (size_t)(cols - 1) * ld + rows : 0;
}

/* SIGSEGV in a block's pages: a kernel or host code that stepped out of a
 * block, or reached one it may not touch (see DeviceBlock). Any other fault
 * is left as it is. */
void report_fault(int, siginfo_t *info, void *) {
    const char *at = (const char *)info->si_addr, *who = kernel_name ? kernel_name : "host code";
    for (auto &entry : device_blocks) {
        const char *start = entry.first;
        const DeviceBlock &block = entry.second;
        if (at < block.mapping || at >= block.mapping + block.mapped) continue;
        char report[256];
        int len = at >= start && at < start + block.size
            ? snprintf(report, sizeof(report), "cuda_emu: %s: access to %s (a cudaMalloc block of %zu bytes)\n",
                       who, kernel_name ? "a block that no argument of the kernel points into" : "device memory",
                       block.size)
            : snprintf(report, sizeof(report), "cuda_emu: %s: access at byte %ld of a cudaMalloc block of %zu bytes, "
                       "outside it\n", who, (long)(at - start), block.size);
        if (write(2, report, (size_t)len) < 0) {}
        abort();
    }
    signal(SIGSEGV, SIG_DFL);  /* not device memory: fault again, as without the emulator */
}

/* Once, at the first cudaMalloc: where guard pages go (CUDA_EMU_GUARD=before
 * or after, after by default), and report_fault in place. */
void setup_device_memory() {
    static bool done;
    if (done) return;
    done = true;
    const char *where = getenv("CUDA_EMU_GUARD");
    if (where && strcmp(where, "before") != 0 && strcmp(where, "after") != 0) {
        fprintf(stderr, "cuda_emu: CUDA_EMU_GUARD must be 'before' or 'after', not '%s'\n", where);
        exit(1);
    }
    guard_before = where && strcmp(where, "before") == 0;
    struct sigaction on_fault;
    memset(&on_fault, 0, sizeof(on_fault));
    on_fault.sa_sigaction = report_fault;
    on_fault.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &on_fault, NULL);
}

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

void emu_check_kernel_pointer(const char *kernel, int arg, const void *p) {
    if (p && !on_device(p, 0)) {
        fprintf(stderr, "cuda_emu: %s: argument %d (%p) is not device memory\n", kernel, arg + 1, p);
        abort();
    }
    open_block(p);  /* until the launch ends */
}

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

void emu_run(const char *name, const std::function<void()> &body, dim3 grid, dim3 block, size_t smem) {
    int n = (int)(block.x * block.y * block.z);
    if (!grid.x || !grid.y || !grid.z || n <= 0 || n > MAX_THREADS || grid.y > 65535 || grid.z > 65535 ||
        smem > STATIC_SHARED_LIMIT) {
        fprintf(stderr, "cuda_emu: %s: invalid launch: grid (%u, %u, %u), block (%u, %u, %u), %zu bytes of shared "
                "memory\n", name, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
        last_error = cudaErrorInvalidConfiguration;
        close_blocks();
        return;
    }
    kernel = &body;
    kernel_name = name;
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
    kernel_name = NULL;
    close_blocks();
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
/* A block of n bytes with its guard page (see DeviceBlock), NaN and closed.
 * Placed against a guard after it, the block starts at a page end minus n,
 * which keeps floats, doubles and longs aligned (n is a multiple of their
 * size). */
cudaError_t cudaMalloc(void **p, size_t n) {
    setup_device_memory();
    size_t page = (size_t)sysconf(_SC_PAGESIZE), pages_size = n > page ? (n + page - 1) / page * page : page;
    char *mapping = (char *)mmap(NULL, pages_size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED) return cudaErrorMemoryAllocation;
    char *pages = guard_before ? mapping + page : mapping, *guard = guard_before ? mapping : mapping + pages_size;
    char *start = guard_before ? pages : pages + pages_size - n;
    memset(start, 0xff, n);  /* garbage, as cudaMalloc gives: NaN as floats */
    if (mprotect(guard, page, PROT_NONE) != 0 || mprotect(pages, pages_size, PROT_NONE) != 0) {
        munmap(mapping, pages_size + page);
        return cudaErrorMemoryAllocation;
    }
    device_blocks[start] = DeviceBlock{n, mapping, pages_size + page, pages, pages_size};
    *p = start;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    auto block = device_blocks.find((const char *)p);
    if (block == device_blocks.end()) fail("cudaFree", "not the start of a cudaMalloc block", p, 0);
    munmap(block->second.mapping, block->second.mapped);
    device_blocks.erase(block);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int value, size_t n) {
    require_device("cudaMemset", "not device memory, or runs past its block", p, n);
    open_block(p);
    if (n) memset(p, value, n);
    close_blocks();
    return cudaSuccess;
}
/* A pitched range of `height` rows of `width` bytes spans this many bytes. */
static size_t pitched_extent(size_t pitch, size_t width, size_t height) {
    return height && width ? (height - 1) * pitch + width : 0;
}
cudaError_t cudaMemset2D(void *p, size_t pitch, int value, size_t width, size_t height) {
    if (width > pitch) return cudaErrorInvalidValue;
    size_t extent = pitched_extent(pitch, width, height);
    require_device("cudaMemset2D", "not device memory, or runs past its block", p, extent);
    open_block(p);
    for (size_t r = 0; r < height; r++) memset((char *)p + r * pitch, value, width);
    close_blocks();
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    check_and_open_copy("cudaMemcpy", dst, n, src, n, kind);
    if (n) memmove(dst, src, n);
    close_blocks();
    return cudaSuccess;
}
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind) {
    if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
    check_and_open_copy("cudaMemcpy2D", dst, pitched_extent(dpitch, width, height), src, pitched_extent(spitch, width, height),
               kind);
    for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    close_blocks();
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
    int cols_A = ta == CUBLAS_OP_N ? k : m, cols_B = tb == CUBLAS_OP_N ? n : k;
    require_device("cublasSgemm", "A is not device memory, or runs past its block", A,
                   matrix_extent(rows_A, cols_A, lda) * sizeof(float));
    require_device("cublasSgemm", "B is not device memory, or runs past its block", B,
                   matrix_extent(rows_B, cols_B, ldb) * sizeof(float));
    require_device("cublasSgemm", "C is not device memory, or runs past its block", C,
                   matrix_extent(m, n, ldc) * sizeof(float));
    open_block(A);
    open_block(B);
    open_block(C);
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
    close_blocks();
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
