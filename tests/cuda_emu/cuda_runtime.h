/* cuda_runtime.h of the CPU emulator (tests/cuda_emu): the subset of CUDA
 * that nectar_cuda.cu and the programs use, run on the CPU so the CUDA code
 * can be tested where there is no GPU. README.md in this folder says what it
 * checks and what it cannot.
 *
 * Kernels: every CUDA thread of a block is a fiber with its own stack;
 * blocks run one after another. A fiber runs until it reaches __syncthreads
 * or a warp shuffle, the scheduling points: __syncthreads releases when every
 * live thread of the block waits there, a shuffle when every live lane of
 * the warp does. Anything else (a barrier some threads never reach) is
 * reported. Each pass over a block's fibers runs them in the opposite order
 * of the pass before. Device memory is host memory, each cudaMalloc block
 * on pages of its own, readable only while in use (see cuda_emu.cpp). */
#ifndef CUDA_EMU_RUNTIME_H
#define CUDA_EMU_RUNTIME_H

#include <stddef.h>

#ifdef __cplusplus
#include <cmath>
#include <functional>
#include <type_traits>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

/* cu2cpp.py turns kernel<<<grid, block, smem>>>(args) into
 * (emu_check_launch("kernel", args), emu_launch("kernel", [&] { kernel(args); }, grid, block, smem)). */
void emu_run(const char *name, const std::function<void()> &body, dim3 grid, dim3 block, size_t smem);
template <class F, class G, class B>
void emu_launch(const char *name, F body, G grid, B block, size_t smem = 0) {
    emu_run(name, body, dim3(grid), dim3(block), smem);
}
/* Before a launch: every pointer argument must be NULL or point into (or
 * just past) a cudaMalloc block, as a kernel cannot read host memory; those
 * blocks are readable until the launch ends, and no other block is. */
void emu_check_kernel_pointer(const char *kernel, int arg, const void *p);
template <class T> void emu_check_kernel_arg(const char *kernel, int arg, const T &value) {
    if constexpr (std::is_pointer<std::decay_t<T>>::value) emu_check_kernel_pointer(kernel, arg, (const void *)value);
}
template <class... A> void emu_check_launch(const char *kernel, const A &...args) {
    int arg = 0;
    (emu_check_kernel_arg(kernel, arg++, args), ...);
    (void)arg;
}
/* extern __shared__ arrays become this block's dynamic shared memory. */
void *emu_dynamic_shared(void);
/* Other __shared__ arrays become function statics (blocks run one at a
 * time), each registered here so every block starts with them NaN. */
struct EmuShared { EmuShared(void *p, size_t bytes); };
#define EMU_SHARED(array) static EmuShared emu_shared_##array(array, sizeof(array))

void __syncthreads(void);
float emu_shuffle(float v, int mode, int arg);  /* mode 0: xor, 1: down, 2: from lane */
static inline float __shfl_xor_sync(unsigned, float v, int mask, int = 32) { return emu_shuffle(v, 0, mask); }
static inline float __shfl_down_sync(unsigned, float v, int delta, int = 32) { return emu_shuffle(v, 1, delta); }
static inline float __shfl_sync(unsigned, float v, int lane, int = 32) { return emu_shuffle(v, 2, lane); }
#endif /* __cplusplus */

#ifdef __cplusplus
extern "C" {
#endif
typedef enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
               cudaErrorInvalidConfiguration = 9 } cudaError_t;
typedef enum { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
               cudaMemcpyDefault } cudaMemcpyKind;
typedef struct cudaDeviceProp { char name[256]; int major, minor; } cudaDeviceProp;

const char *cudaGetErrorString(cudaError_t err);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemset(void *p, int value, size_t n);
cudaError_t cudaMemset2D(void *p, size_t pitch, int value, size_t width, size_t height);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind);
cudaError_t cudaGetLastError(void);
cudaError_t cudaDeviceSynchronize(void);
#ifdef __cplusplus
}
#endif

#endif
