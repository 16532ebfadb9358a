/* test_cuda.cu - every kernel of nectar_cuda.cu against the CPU reference
 * (nectar.c, linked through tests/test_cuda_ref.c), on odd sizes (37
 * queries, 17 keys), on realistic ones (128 queries x 4096 keys, 40000-key
 * decode), for GQA ratios 1 and above 1, with empty (nk = 0) and one-key
 * documents and causal rows that see nothing.
 *
 * Device outputs start as NaN, so an element a kernel forgets fails. Every
 * check prints its max abs and max rel error; the last line is "N passed,
 * M failed" and the exit status is non-zero on any failure. Without a CUDA
 * device it prints "SKIP: no CUDA device" and exits 0.
 */
#include "../nectar_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {  /* tests/test_cuda_ref.c: nectar.c's static row-wise ops */
void ref_rmsnorm(float *o, const float *x, const float *w, int n);
void ref_rope(float *vec, int n, int head_size, int pos, float direction);
void ref_swiglu(float *hgate, const float *hb, const float *hb2, size_t n);
}

#include "check.h"

static float *host_floats(size_t n) { return (float *)xmalloc(n * sizeof(float)); }


/* A device copy of host (n); NULL when n = 0. */
static float *upload(const float *host, size_t n) {
    float *dev = (float *)cuda_xmalloc(n * sizeof(float));
    if (n) CUDA_CHECK(cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice));
    return dev;
}

/* n device floats, every one NaN (all bits set). */
static float *device_nan(size_t n) {
    float *dev = (float *)cuda_xmalloc(n * sizeof(float));
    if (n) CUDA_CHECK(cudaMemset(dev, 0xff, n * sizeof(float)));
    return dev;
}

/* A host copy of dev (n); waits for the queued kernels. */
static float *download(const float *dev, size_t n) {
    float *host = host_floats(n);
    if (n) CUDA_CHECK(cudaMemcpy(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

/* ------------------------------------------------------------------------ */
/* Row-wise and elementwise ops                                             */

static void test_rmsnorm(int rows, int n) {
    char what[128];
    uint64_t rng = 11 + rows + n;
    float *x = host_floats((size_t)rows * n), *w = host_floats(n), *ref = host_floats((size_t)rows * n);
    fill_normal(x, (size_t)rows * n, 2.0f, &rng);
    fill_normal(w, n, 1.0f, &rng);
    for (int r = 0; r < rows; r++) ref_rmsnorm(ref + (size_t)r * n, x + (size_t)r * n, w, n);
    float *x_d = upload(x, (size_t)rows * n), *w_d = upload(w, n), *o_d = device_nan((size_t)rows * n);
    rmsnorm_cuda(o_d, x_d, w_d, rows, n);
    float *got = download(o_d, (size_t)rows * n);
    snprintf(what, sizeof(what), "rmsnorm %d rows x %d", rows, n);
    check_close_f(what, got, ref, (size_t)rows * n, 1e-5, 1e-4);
    free(got);
    rmsnorm_cuda(x_d, x_d, w_d, rows, n);  /* in place, as o may alias x */
    got = download(x_d, (size_t)rows * n);
    snprintf(what, sizeof(what), "rmsnorm %d rows x %d, in place", rows, n);
    check_close_f(what, got, ref, (size_t)rows * n, 1e-5, 1e-4);
    free(got); free(x); free(w); free(ref);
    CUDA_CHECK(cudaFree(x_d)); CUDA_CHECK(cudaFree(w_d)); CUDA_CHECK(cudaFree(o_d));
}

/* rows of n = n_heads * head_size floats, stride n + pad (the pad must stay untouched). */
static void test_rope(int rows, int n_heads, int head_size, int pad, int pos, float direction) {
    char what[128];
    int n = n_heads * head_size, ld = n + pad;
    size_t size = (size_t)rows * ld;
    uint64_t rng = 23 + rows + n + pos;
    float *x = host_floats(size), *ref = host_floats(size);
    fill_normal(x, size, 1.0f, &rng);
    memcpy(ref, x, size * sizeof(float));
    for (int t = 0; t < rows; t++) ref_rope(ref + (size_t)t * ld, n, head_size, pos + t, direction);
    float *x_d = upload(x, size);
    rope_cuda(x_d, rows, ld, n, head_size, pos, direction);
    float *got = download(x_d, size);
    snprintf(what, sizeof(what), "rope %d rows x %d heads of %d, stride %d, pos %d, dir %+g",
             rows, n_heads, head_size, ld, pos, direction);
    check_close_f(what, got, ref, size, 1e-5, 1e-4);
    rope_cuda(x_d, rows, ld, n, head_size, pos, -direction);  /* and back */
    free(got);
    got = download(x_d, size);
    snprintf(what, sizeof(what), "rope then rope back == input (%d rows, pos %d)", rows, pos);
    check_close_f(what, got, x, size, 1e-5, 1e-5);
    free(got); free(x); free(ref);
    CUDA_CHECK(cudaFree(x_d));
}

static void test_swiglu(size_t n) {
    char what[128];
    uint64_t rng = 31 + n;
    float *hb = host_floats(n), *hb2 = host_floats(n), *ref = host_floats(n);
    fill_normal(hb, n, 3.0f, &rng);
    fill_normal(hb2, n, 1.0f, &rng);
    float extremes[] = { -100.0f, 100.0f, -88.0f, 90.0f, 0.0f };  /* exp overflow, zero */
    for (size_t i = 0; i < 5 && i < n; i++) hb[i] = extremes[i];
    ref_swiglu(ref, hb, hb2, n);
    float *hb_d = upload(hb, n), *hb2_d = upload(hb2, n), *out_d = device_nan(n);
    swiglu_cuda(out_d, hb_d, hb2_d, n);
    float *got = download(out_d, n);
    snprintf(what, sizeof(what), "swiglu %zu elements", n);
    check_close_f(what, got, ref, n, 1e-5, 1e-5);
    free(got); free(hb); free(hb2); free(ref);
    CUDA_CHECK(cudaFree(hb_d)); CUDA_CHECK(cudaFree(hb2_d)); CUDA_CHECK(cudaFree(out_d));
}

/* ------------------------------------------------------------------------ */
/* Attention states and their merge                                         */

/* nq queries of H heads (nq, H d) against nk keys of G heads (nk, G d),
 * every head read in place with its stride, as local_states and
 * document_states_exact call it. */
static void test_attention(int nq, int nk, int d, int H, int G, int visible) {
    char what[160], tag[96];
    int D = H * d, KVD = G * d, group = H / G;
    size_t nS = (size_t)nq * nk;  /* one head's scores */
    uint64_t rng = 41 + nq * 7 + nk + d + H;
    float *q = host_floats((size_t)nq * D), *k = host_floats((size_t)nk * KVD), *v = host_floats((size_t)nk * KVD);
    fill_normal(q, (size_t)nq * D, 2.0f, &rng);
    fill_normal(k, (size_t)nk * KVD, 1.0f, &rng);
    fill_normal(v, (size_t)nk * KVD, 1.0f, &rng);
    float *A = host_floats((size_t)nq * D), *lse = host_floats((size_t)nq * H), *scores = host_floats(H * nS);
    for (int h = 0; h < H; h++) {
        size_t kv = (size_t)(h / group) * d;
        attention_states(nq, nk, d, q + h * d, D, nk ? k + kv : NULL, nk ? v + kv : NULL, KVD, visible,
                         A + h * d, D, lse + h, H, scores + h * nS);
    }
    float *q_d = upload(q, (size_t)nq * D), *k_d = upload(k, (size_t)nk * KVD), *v_d = upload(v, (size_t)nk * KVD);
    float *A_d = device_nan((size_t)nq * D), *lse_d = device_nan((size_t)nq * H), *scores_d = device_nan(H * nS);
    for (int h = 0; h < H; h++) {
        size_t kv = (size_t)(h / group) * d;
        attention_states_cuda(nq, nk, d, q_d + h * d, D, nk ? k_d + kv : NULL, nk ? v_d + kv : NULL, KVD,
                              visible, A_d + h * d, D, lse_d + h, H, scores_d + h * nS);
    }
    float *gA = download(A_d, (size_t)nq * D), *glse = download(lse_d, (size_t)nq * H);
    float *gS = download(scores_d, H * nS);
    snprintf(tag, sizeof(tag), "%dq x %dk d%d H%d G%d visible %d", nq, nk, d, H, G, visible);
    snprintf(what, sizeof(what), "attention %s: A", tag);
    check_close_f(what, gA, A, (size_t)nq * D, 1e-5, 1e-4);
    snprintf(what, sizeof(what), "attention %s: lse", tag);
    check_close_f(what, glse, lse, (size_t)nq * H, 1e-5, 1e-5);
    snprintf(what, sizeof(what), "attention %s: probabilities", tag);
    check_close_f(what, gS, scores, H * nS, 1e-6, 1e-4);
    free(q); free(k); free(v); free(A); free(lse); free(scores); free(gA); free(glse); free(gS);
    float *bufs[] = { q_d, k_d, v_d, A_d, lse_d, scores_d };
    for (int i = 0; i < 6; i++) CUDA_CHECK(cudaFree(bufs[i]));
}

/* One query per head (H, d) over nk keys (nk, G d): the split-KV decode
 * against the CPU's single softmax over all keys. */
static void test_decode(int H, int G, int nk, int d) {
    char what[160], tag[96];
    int KVD = G * d, group = H / G, chunks = attention_decode_chunks_cuda(nk);
    uint64_t rng = 53 + H + nk + d;
    float *q = host_floats((size_t)H * d), *k = host_floats((size_t)nk * KVD), *v = host_floats((size_t)nk * KVD);
    fill_normal(q, (size_t)H * d, 2.0f, &rng);
    fill_normal(k, (size_t)nk * KVD, 1.0f, &rng);
    fill_normal(v, (size_t)nk * KVD, 1.0f, &rng);
    float *A = host_floats((size_t)H * d), *lse = host_floats(H), *scores = host_floats(nk);
    for (int h = 0; h < H; h++) {
        size_t kv = (size_t)(h / group) * d;
        attention_states(1, nk, d, q + h * d, d, nk ? k + kv : NULL, nk ? v + kv : NULL, KVD, nk,
                         A + h * d, d, lse + h, 1, scores);
    }
    float *q_d = upload(q, (size_t)H * d), *k_d = upload(k, (size_t)nk * KVD), *v_d = upload(v, (size_t)nk * KVD);
    float *A_d = device_nan((size_t)H * d), *lse_d = device_nan(H);
    float *part_A = device_nan((size_t)H * chunks * d), *part_lse = device_nan((size_t)H * chunks);
    attention_states_decode_cuda(H, G, nk, d, q_d, k_d, v_d, KVD, A_d, lse_d, part_A, part_lse);
    float *gA = download(A_d, (size_t)H * d), *glse = download(lse_d, H);
    snprintf(tag, sizeof(tag), "H%d G%d, %d keys (%d chunks), d%d", H, G, nk, chunks, d);
    snprintf(what, sizeof(what), "decode %s: A", tag);
    check_close_f(what, gA, A, (size_t)H * d, 1e-5, 1e-4);
    snprintf(what, sizeof(what), "decode %s: lse", tag);
    check_close_f(what, glse, lse, H, 1e-5, 1e-5);
    free(q); free(k); free(v); free(A); free(lse); free(scores); free(gA); free(glse);
    float *bufs[] = { q_d, k_d, v_d, A_d, lse_d, part_A, part_lse };
    for (int i = 0; i < 7; i++) CUDA_CHECK(cudaFree(bufs[i]));
}

/* n pairs of states; rows 0..4 are the edge cases: an empty side, both
 * empty, lse 160 apart, equal lse. */
static void test_merge(int n, int d) {
    char what[128];
    uint64_t rng = 61 + n + d;
    float *A1 = host_floats((size_t)n * d), *A2 = host_floats((size_t)n * d), *l1 = host_floats(n), *l2 = host_floats(n);
    fill_normal(A1, (size_t)n * d, 1.0f, &rng);
    fill_normal(A2, (size_t)n * d, 1.0f, &rng);
    fill_normal(l1, n, 5.0f, &rng);
    fill_normal(l2, n, 5.0f, &rng);
    float edge1[] = { -INFINITY, 3.0f, -INFINITY, 80.0f, 2.5f }, edge2[] = { 1.5f, -INFINITY, -INFINITY, -80.0f, 2.5f };
    for (int r = 0; r < 5 && r < n; r++) { l1[r] = edge1[r]; l2[r] = edge2[r]; }
    if (n > 2) for (int c = 0; c < d; c++) A1[2 * d + c] = A2[2 * d + c] = 0.0f;  /* empty states are (0, -inf) */
    float *A = host_floats((size_t)n * d), *lse = host_floats(n);
    for (int r = 0; r < n; r++)
        merge_states(d, A1 + (size_t)r * d, l1[r], A2 + (size_t)r * d, l2[r], A + (size_t)r * d, &lse[r]);
    float *A1_d = upload(A1, (size_t)n * d), *A2_d = upload(A2, (size_t)n * d), *l1_d = upload(l1, n), *l2_d = upload(l2, n);
    float *A_d = device_nan((size_t)n * d), *lse_d = device_nan(n);
    merge_states_cuda(n, d, A1_d, l1_d, A2_d, l2_d, A_d, lse_d);
    float *gA = download(A_d, (size_t)n * d), *glse = download(lse_d, n);
    snprintf(what, sizeof(what), "merge_states %d pairs, d%d: A", n, d);
    check_close_f(what, gA, A, (size_t)n * d, 1e-5, 1e-5);
    snprintf(what, sizeof(what), "merge_states %d pairs, d%d: lse", n, d);
    check_close_f(what, glse, lse, n, 1e-5, 1e-5);
    if (n >= 3) {
        int exact = 1;
        for (int c = 0; c < d; c++)
            exact &= gA[c] == A2[c] && gA[d + c] == A1[d + c] && gA[2 * d + c] == 0.0f;
        exact &= glse[0] == l2[0] && glse[1] == l1[1] && glse[2] == -INFINITY;
        snprintf(what, sizeof(what), "merge_states d%d: (empty, x) and (x, empty) give x bit for bit", d);
        check(what, exact);
    }
    free(gA);
    merge_states_cuda(n, d, A1_d, l1_d, A2_d, l2_d, A1_d, NULL);  /* in place into A1, no lse */
    gA = download(A1_d, (size_t)n * d);
    snprintf(what, sizeof(what), "merge_states %d pairs, d%d: A in place, lse NULL", n, d);
    check_close_f(what, gA, A, (size_t)n * d, 1e-5, 1e-5);
    free(A1); free(A2); free(l1); free(l2); free(A); free(lse); free(gA); free(glse);
    float *bufs[] = { A1_d, A2_d, l1_d, l2_d, A_d, lse_d };
    for (int i = 0; i < 6; i++) CUDA_CHECK(cudaFree(bufs[i]));
}

/* ------------------------------------------------------------------------ */
/* Nectar modules                                                           */

/* A set of 2 layers x 2 KV heads (layer 1 modules one size larger), every
 * parameter random; modules 0 and 3 (the last, at a nonzero offset) run N
 * queries on the CPU and on the GPU. size: w (MLP) or p (quadrature). */
static void test_module(ModuleArch arch, int d, int size, int Db, int Ds, int Dt, int N, float input_scale) {
    char what[160], tag[128];
    ModuleSet s;
    int sizes[2] = { size, size + 3 };
    if (moduleset_alloc(&s, arch, 2, 2, d, Db, Ds, Dt, sizes, 0) != 0) {
        check("moduleset_alloc for the CUDA module test", 0);
        return;
    }
    uint64_t rng = 71 + d + size + N;
    float sigma = arch == ARCH_MLP ? 1.0f / sqrtf((float)(d + size)) : 1.0f;  /* keeps pre-activations O(1) */
    fill_normal(s.params, s.n_params, sigma, &rng);
    for (int i = 0; i < 4; i++) s.modules[i].input_scale = input_scale;
    float *q = host_floats((size_t)N * d), *a = host_floats(N), *A = host_floats((size_t)N * d);
    fill_normal(q, (size_t)N * d, arch == ARCH_MLP ? 1.0f : 2.0f, &rng);
    ModuleWork work, work_d;
    modulework_alloc(&work, &s, N);
    modulework_alloc_cuda(&work_d, &s, N);
    float *params_d = moduleset_upload_cuda(&s), *q_d = upload(q, (size_t)N * d);
    float *a_d = device_nan(N), *A_d = device_nan((size_t)N * d);
    if (arch == ARCH_MLP)
        snprintf(tag, sizeof(tag), "MLP d%d w%d (Db %d, Ds %d, Dt %d) scale %g, N %d", d, size, Db, Ds, Dt, input_scale, N);
    else
        snprintf(tag, sizeof(tag), "quadrature d%d p%d, N %d", d, size, N);
    int which[2] = { 0, 3 };
    for (int m = 0; m < 2; m++) {
        const Module *mod = &s.modules[which[m]];
        module_forward(&s, mod, &work, q, N, a, A);
        module_forward_cuda(&s, mod, params_d, &work_d, q_d, N, a_d, A_d);
        float *ga = download(a_d, N), *gA = download(A_d, (size_t)N * d);
        snprintf(what, sizeof(what), "module %d %s: a", which[m], tag);
        check_close_f(what, ga, a, N, 1e-4, 1e-4);
        snprintf(what, sizeof(what), "module %d %s: A", which[m], tag);
        check_close_f(what, gA, A, (size_t)N * d, 1e-4, 1e-4);
        free(ga); free(gA);
    }
    modulework_free(&work);
    modulework_free_cuda(&work_d);
    moduleset_free(&s);
    free(q); free(a); free(A);
    float *bufs[] = { params_d, q_d, a_d, A_d };
    for (int i = 0; i < 4; i++) CUDA_CHECK(cudaFree(bufs[i]));
}

/* ------------------------------------------------------------------------ */

int main(void) {
    int n_devices = 0;
    cudaError_t err = cudaGetDeviceCount(&n_devices);
    if (err != cudaSuccess || n_devices == 0) {
        fprintf(stderr, "test_cuda: %s\n", err != cudaSuccess ? cudaGetErrorString(err) : "no device found");
        printf("SKIP: no CUDA device\n");
        printf("0 passed, 0 failed, 1 skipped\n");
        return 0;
    }
    if (nectar_cuda_init() != 0) return 1;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);

    printf("rmsnorm, rope, swiglu\n");
    test_rmsnorm(37, 37);
    test_rmsnorm(37, 288);
    test_rmsnorm(128, 4096);
    test_rope(37, 3, 16, 0, 0, 1.0f);
    test_rope(37, 5, 32, 7, 4000, 1.0f);     /* strided rows, a far position */
    test_rope(128, 8, 64, 0, 1000, -1.0f);   /* rotating back */
    test_rope(128, 2, 128, 0, 4096, 1.0f);   /* a KV row */
    test_swiglu(37 * 113);
    test_swiglu((size_t)128 * 11008);

    printf("attention states (strided heads, causal rule)\n");
    test_attention(37, 17, 16, 1, 1, 17);     /* odd sizes, GQA 1 */
    test_attention(37, 17, 32, 4, 2, -5);     /* GQA 2; rows 0..5 see nothing */
    test_attention(37, 17, 16, 3, 3, 100);    /* visible past nk */
    test_attention(37, 17, 48, 2, 1, 17);     /* head size not dividing the block */
    test_attention(5, 0, 16, 2, 1, 0);        /* empty document: (0, -inf) */
    test_attention(7, 1, 32, 2, 2, 1);        /* one-key document */
    test_attention(7, 1, 16, 4, 1, -2);       /* one key, first rows empty */
    test_attention(37, 513, 128, 2, 1, 513);
    test_attention(128, 4096, 64, 4, 1, 4096);       /* realistic document, GQA 4 */
    test_attention(128, 4096 + 128, 64, 4, 2, 4097); /* local state of a block at pos 4096 */

    printf("split-KV decode (chunk states merged by log-sum-exp)\n");
    test_decode(4, 4, 0, 16);        /* empty document */
    test_decode(4, 2, 1, 32);        /* one key */
    test_decode(3, 1, 17, 16);
    test_decode(8, 2, 256, 64);      /* exactly one chunk */
    test_decode(8, 2, 257, 64);      /* one key into the second chunk */
    test_decode(8, 8, 4096, 64);
    test_decode(32, 8, 40000, 128);  /* long document, GQA 4 */

    printf("merge_states\n");
    test_merge(37 * 3, 16);
    test_merge(37, 48);
    test_merge(128 * 32, 64);

    printf("module_forward\n");
    test_module(ARCH_MLP, 16, 37, 1, 1, 1, 37, 1.0f);
    test_module(ARCH_MLP, 32, 17, 2, 0, 1, 37, 0.5f);
    test_module(ARCH_MLP, 16, 5, 0, 1, 2, 37, 1.0f);
    test_module(ARCH_MLP, 16, 9, 0, 0, 0, 11, 2.0f);   /* no hidden layer: both heads read x */
    test_module(ARCH_MLP, 64, 512, 1, 1, 1, 512, 1.0f);
    test_module(ARCH_MLP, 64, 256, 2, 2, 2, 4096, 1.0f);
    test_module(ARCH_QUAD, 16, 17, 0, 0, 0, 37, 1.0f);
    test_module(ARCH_QUAD, 32, 1, 0, 0, 0, 7, 1.0f);   /* one pair */
    test_module(ARCH_QUAD, 64, 409, 0, 0, 0, 512, 1.0f);

    nectar_cuda_free();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed != 0;
}
