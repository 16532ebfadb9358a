/* test_cuda_ref.c - the CPU reference for tests/test_cuda.cu: nectar.c
 * itself (compiled here with the C compiler, as plain C11 on OpenBLAS), plus
 * entry points to the static row-wise ops the CUDA kernels mirror. */
#include "../nectar.c"

void ref_rmsnorm(float *o, const float *x, const float *w, int n, float eps) { rmsnorm(o, x, w, n, eps); }

void ref_rope(float *vec, int n, int head_size, int pos, float theta, float direction) {
    float *cs = xmalloc(head_size * sizeof(float));  /* (d) this position's cos and sin */
    rope_angles(cs, 1, pos, head_size, theta);
    rope(vec, n, head_size, cs, direction);
    free(cs);
}

/* The SwiGLU line of layer_forward: hgate = SiLU(hb) * hb2 */
void ref_swiglu(float *hgate, const float *hb, const float *hb2, size_t n) {
    for (size_t i = 0; i < n; i++) hgate[i] = silu(hb[i]) * hb2[i];
}
