/* selftest.cu - the emulator's own checks, each shown to fire: a kernel that
 * reads another thread's write without a barrier sees NaN; a barrier some
 * threads skip, a host pointer given to a kernel, a copy whose kind does not
 * match its pointers, a copy or a cuBLAS matrix past the end of its block,
 * a cudaFree of something cudaMalloc never gave, host code reading device
 * memory, and a kernel reading outside the blocks its arguments point into
 * all abort with a sentence; a bad launch shape and bad leading dimensions are errors, as on
 * a GPU. Each misuse runs in a child process, whose stderr must hold the
 * emulator's sentence. Built for the emulator only (make test-cuda-emu). */
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 64 };  /* threads of the test kernels: two warps */

static int n_passed, n_failed;

static void check(const char *what, int ok) {
    printf("  %-64s %s\n", what, ok ? "ok" : "FAIL");
    if (ok) n_passed++; else n_failed++;
}

/* out[i] = in[i] + in[(i + 1) % N], through shared memory, with or without
 * the barrier between the writes and the reads. */
__global__ void neighbour_sum_kernel(float *out, const float *in, int with_barrier) {
    __shared__ float tile[N];
    int i = threadIdx.x;
    tile[i] = in[i];
    if (with_barrier) __syncthreads();
    out[i] = tile[i] + tile[(i + 1) % N];
}

/* Thread 0 returns before the barrier the others wait at. */
__global__ void skipped_barrier_kernel(float *out) {
    if (threadIdx.x == 0) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

__global__ void fill_kernel(float *out, float value) { out[threadIdx.x] = value; }

/* out[i] = in[i + shift]: out of `in`'s block for shift != 0. */
__global__ void shifted_copy_kernel(float *out, const float *in, long shift) {
    out[threadIdx.x] = in[(long)threadIdx.x + shift];
}

static float *device_floats(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); exit(1); }
    return (float *)p;
}

/* Runs misuse() in a child, its stderr caught into `said`; the wait status. */
static int in_child(int (*misuse)(void), char *said, size_t cap) {
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) { perror("pipe"); exit(1); }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipe_fds[1], 2);
        _exit(misuse() ? 0 : 1);
    }
    close(pipe_fds[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < cap && (r = read(pipe_fds[0], said + got, cap - 1 - got)) > 0) got += (size_t)r;
    said[got] = '\0';
    close(pipe_fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

/* The emulator must say `expect` and then abort (must_abort = 1) or return
 * the error (must_abort = 0; misuse() then returns whether it did). */
static void check_misuse(const char *what, int (*misuse)(void), int must_abort, const char *expect) {
    char said[512];
    int status = in_child(misuse, said, sizeof(said));
    int ended_right = must_abort ? WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT
                                 : WIFEXITED(status) && WEXITSTATUS(status) == 0;
    check(what, ended_right && strncmp(said, "cuda_emu: ", 10) == 0 && strstr(said, expect));
    said[strcspn(said, "\n")] = '\0';
    printf("    %s\n", said);
}

static int launch_too_many_threads(void) {
    float *out = device_floats(N);
    fill_kernel<<<1, 1025>>>(out, 1.0f);
    return cudaGetLastError() == cudaErrorInvalidConfiguration;
}

/* C = A A for an 8 x 8 A, with the given lda and C's block of c_floats floats. */
static cublasStatus_t gemm_8x8(int lda, size_t c_floats) {
    cublasHandle_t handle;
    cublasCreate(&handle);
    float *A = device_floats(8 * 8), *C = device_floats(c_floats), one = 1.0f, zero = 0.0f;
    return cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, A, lda, A, 8, &zero, C, 8);
}

static int gemm_with_short_lda(void) { return gemm_8x8(4, 8 * 8) == CUBLAS_STATUS_INVALID_VALUE; }

static int launch_skipped_barrier(void) {
    float *out = device_floats(N);
    skipped_barrier_kernel<<<1, N>>>(out);
    return 0;
}

static int launch_with_host_pointer(void) {
    static float host[N];
    fill_kernel<<<1, N>>>(host, 1.0f);
    return 0;
}

static int copy_to_host_pointer_as_device(void) {
    static float host[N], dst[N];
    cudaMemcpy(dst, host, sizeof(host), cudaMemcpyHostToDevice);
    return 0;
}

static int copy_device_pointer_as_host(void) {
    static float host[N];
    float *dev = device_floats(N);
    cudaMemcpy(dev, host, sizeof(host), cudaMemcpyHostToHost);
    return 0;
}

static int copy_past_the_block(void) {
    static float host[N + 1];
    float *dev = device_floats(N);
    cudaMemcpy(host, dev, sizeof(host), cudaMemcpyDeviceToHost);
    return 0;
}

static int memset_past_the_block(void) {
    float *dev = device_floats(N);
    cudaMemset(dev + 1, 0, N * sizeof(float));
    return 0;
}

static int gemm_past_the_block(void) {
    gemm_8x8(8, 8 * 8 - 1);
    return 0;
}

static int shifted_copy(long shift) {
    float *in = device_floats(N), *out = device_floats(N);
    shifted_copy_kernel<<<1, N>>>(out, in, shift);
    return 0;
}
static int read_after_the_end(void) { return shifted_copy(1); }
static int read_before_the_start(void) { return shifted_copy(-1); }

/* A kernel given a pointer into one block that reads another. */
static int read_another_block(void) {
    float *in = device_floats(N), *other = device_floats(N), *out = device_floats(N);
    shifted_copy_kernel<<<1, N>>>(out, in, (long)(other - in));
    return 0;
}

static int host_reads_device_memory(void) {
    volatile float *dev = device_floats(N);
    return dev[0] == 0.0f;
}

static int free_inside_a_block(void) {
    float *dev = device_floats(N);
    cudaFree(dev + 1);
    return 0;
}

int main(void) {
    printf("the emulator's checks\n");
    float host_in[N], host_out[N];
    for (int i = 0; i < N; i++) host_in[i] = (float)i;
    float *in = device_floats(N), *out = device_floats(N);
    cudaMemcpy(in, host_in, sizeof(host_in), cudaMemcpyHostToDevice);

    for (int with_barrier = 1; with_barrier >= 0; with_barrier--) {
        neighbour_sum_kernel<<<1, N>>>(out, in, with_barrier);
        cudaMemcpy(host_out, out, sizeof(host_out), cudaMemcpyDeviceToHost);
        int exact = 1, any_nan = 0;
        for (int i = 0; i < N; i++) {
            exact &= host_out[i] == host_in[i] + host_in[(i + 1) % N];
            any_nan |= isnan(host_out[i]);
        }
        check(with_barrier ? "shared memory read after __syncthreads: exact sums"
                           : "shared memory read without __syncthreads: NaN seen", with_barrier ? exact : any_nan);
    }

    cudaMemcpy(out, in, sizeof(host_in), cudaMemcpyDefault);  /* device to device, found from the pointers */
    cudaMemcpy(host_out, out, sizeof(host_out), cudaMemcpyDefault);
    check("cudaMemcpyDefault device to device, then to host", memcmp(host_out, host_in, sizeof(host_in)) == 0);

    check_misuse("a launch of 1025 threads: invalid configuration", launch_too_many_threads, 0, "invalid launch");
    check_misuse("cublasSgemm with lda < m: invalid value", gemm_with_short_lda, 0, "lda 4");
    check_misuse("__syncthreads skipped by a returning thread: abort", launch_skipped_barrier, 1,
                 "returned before it");
    check_misuse("a kernel given a host pointer: abort", launch_with_host_pointer, 1, "argument 1");
    check_misuse("cudaMemcpyHostToDevice into host memory: abort", copy_to_host_pointer_as_device, 1,
                 "destination is not device");
    check_misuse("cudaMemcpyHostToHost into device memory: abort", copy_device_pointer_as_host, 1, "kind says host");
    check_misuse("cudaMemcpy reading one float past the block: abort", copy_past_the_block, 1, "runs past its block");
    check_misuse("cudaMemset one float past the block: abort", memset_past_the_block, 1, "runs past its block");
    check_misuse("cublasSgemm whose C runs past its block: abort", gemm_past_the_block, 1, "C is not device");
    check_misuse("cudaFree inside a block: abort", free_inside_a_block, 1, "not the start");
    check_misuse("host code reading device memory: abort", host_reads_device_memory, 1, "host code: access to device memory");
    check_misuse("a kernel reading a block none of its arguments is in: abort", read_another_block, 1,
                 "a block that no argument of the kernel points into");
    const char *guard = getenv("CUDA_EMU_GUARD");  /* one side of each block is guarded in a run */
    if (guard && strcmp(guard, "before") == 0)
        check_misuse("a kernel reading in[-1]: abort", read_before_the_start, 1, "byte -4 of a cudaMalloc block of 256 bytes");
    else
        check_misuse("a kernel reading in[n]: abort", read_after_the_end, 1, "byte 256 of a cudaMalloc block of 256 bytes");

    cudaFree(in);
    cudaFree(out);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
