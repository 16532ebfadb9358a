/* test_cuda.cu - every kernel of nectar_cuda.cu against the CPU reference
 * (nectar.c, linked through tests/test_cuda_ref.c), on odd sizes (37
 * queries, 17 keys), on realistic ones (128 queries x 4096 keys, 40000-key
 * decode), for GQA ratios 1 and above 1, with empty (nk = 0) and one-key
 * documents and causal rows that see nothing, and scores past expf's range;
 * then the module backward, gradient clipping, the fitting loop
 * (GPU-trained against CPU-trained modules), the whole forward pass (GPU
 * logits against CPU logits, and the operations a decode step queues:
 * Nectar's at most the exact path's) and the backward pass (module gradients
 * through the whole model). Gradients that accumulate start at random
 * values on both sides, so a kernel that overwrites them fails.
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
void ref_rmsnorm(float *o, const float *x, const float *w, int n, float eps);
void ref_rope(float *vec, int n, int head_size, int pos, float theta, float direction);
void ref_swiglu(float *hgate, const float *hb, const float *hb2, size_t n);
}

#include "../examples/check.h"

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

/* x_std 1e-3 makes mean(x^2) small next to the eps under the root. */
static void test_rmsnorm_matches_cpu(int rows, int n, float x_std, float eps) {
    char what[128];
    uint64_t rng = 11 + rows + n;
    float *x = host_floats((size_t)rows * n), *w = host_floats(n), *ref = host_floats((size_t)rows * n);
    fill_normal(x, (size_t)rows * n, x_std, &rng);
    fill_normal(w, n, 1.0f, &rng);
    for (int r = 0; r < rows; r++) ref_rmsnorm(ref + (size_t)r * n, x + (size_t)r * n, w, n, eps);
    float *x_d = upload(x, (size_t)rows * n), *w_d = upload(w, n), *o_d = device_nan((size_t)rows * n);
    rmsnorm_cuda(o_d, x_d, w_d, rows, n, eps);
    float *got = download(o_d, (size_t)rows * n);
    snprintf(what, sizeof(what), "rmsnorm %d rows x %d, x std %g, eps %g", rows, n, x_std, eps);
    check_close_f(what, got, ref, (size_t)rows * n, 1e-5, 1e-4);
    free(got);
    rmsnorm_cuda(x_d, x_d, w_d, rows, n, eps);  /* in place, as o may alias x */
    got = download(x_d, (size_t)rows * n);
    snprintf(what, sizeof(what), "rmsnorm %d rows x %d, in place", rows, n);
    check_close_f(what, got, ref, (size_t)rows * n, 1e-5, 1e-4);
    free(got); free(x); free(w); free(ref);
    CUDA_CHECK(cudaFree(x_d)); CUDA_CHECK(cudaFree(w_d)); CUDA_CHECK(cudaFree(o_d));
}

/* rows of n = n_heads * head_size floats, stride n + pad (the pad must stay untouched). */
static void test_rope_matches_cpu(int rows, int n_heads, int head_size, int pad, int pos, float theta,
                                  float direction) {
    char what[128];
    int n = n_heads * head_size, ld = n + pad;
    size_t size = (size_t)rows * ld;
    uint64_t rng = 23 + rows + n + pos;
    float *x = host_floats(size), *ref = host_floats(size);
    fill_normal(x, size, 1.0f, &rng);
    memcpy(ref, x, size * sizeof(float));
    for (int t = 0; t < rows; t++) ref_rope(ref + (size_t)t * ld, n, head_size, pos + t, theta, direction);
    float *x_d = upload(x, size);
    rope_cuda(x_d, rows, ld, n, head_size, pos, theta, direction);
    float *got = download(x_d, size);
    snprintf(what, sizeof(what), "rope %d rows x %d heads of %d, stride %d, pos %d, theta %g, dir %+g",
             rows, n_heads, head_size, ld, pos, theta, direction);
    check_close_f(what, got, ref, size, 1e-5, 1e-4);
    rope_cuda(x_d, rows, ld, n, head_size, pos, theta, -direction);  /* and back */
    free(got);
    got = download(x_d, size);
    snprintf(what, sizeof(what), "rope then rope back == input (%d rows, pos %d)", rows, pos);
    check_close_f(what, got, x, size, 1e-5, 1e-5);
    free(got); free(x); free(ref);
    CUDA_CHECK(cudaFree(x_d));
}

static void test_swiglu_matches_cpu(size_t n) {
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

/* Both versions of attention_states_cuda (same interface). */
typedef void AttentionStatesFn(int nq, int nk, int d, const float *q, int ldq, const float *k, const float *v,
                               int ldkv, int visible, float *A, int ldA, float *lse, int ldlse, float *scores);

/* nq queries of H heads (nq, H d) against nk keys of G heads (nk, G d),
 * every head read in place with its stride, as local_states and
 * document_states_exact call it; each kernel version in turn. Scores have
 * std q_std: 60 puts them past 88, where expf overflows unless the row's
 * maximum is taken out first. */
static void test_attention_matches_cpu(int nq, int nk, int d, int H, int G, int visible, float q_std) {
    char what[160], tag[96];
    int D = H * d, KVD = G * d, group = H / G;
    size_t nS = (size_t)nq * nk;  /* one head's scores */
    uint64_t rng = 41 + nq * 7 + nk + d + H;
    float *q = host_floats((size_t)nq * D), *k = host_floats((size_t)nk * KVD), *v = host_floats((size_t)nk * KVD);
    fill_normal(q, (size_t)nq * D, q_std, &rng);
    fill_normal(k, (size_t)nk * KVD, 1.0f, &rng);
    fill_normal(v, (size_t)nk * KVD, 1.0f, &rng);
    float *A = host_floats((size_t)nq * D), *lse = host_floats((size_t)nq * H), *scores = host_floats(H * nS);
    for (int h = 0; h < H; h++) {
        size_t kv = (size_t)(h / group) * d;
        attention_states(nq, nk, d, q + h * d, D, nk ? k + kv : NULL, nk ? v + kv : NULL, KVD, visible,
                         A + h * d, D, lse + h, H, scores + h * nS);
    }
    float *q_d = upload(q, (size_t)nq * D), *k_d = upload(k, (size_t)nk * KVD), *v_d = upload(v, (size_t)nk * KVD);
    AttentionStatesFn *versions[2] = { attention_states_cuda, attention_states_v2_cuda };
    for (int ver = 0; ver < 2; ver++) {
        float *A_d = device_nan((size_t)nq * D), *lse_d = device_nan((size_t)nq * H), *scores_d = device_nan(H * nS);
        for (int h = 0; h < H; h++) {
            size_t kv = (size_t)(h / group) * d;
            versions[ver](nq, nk, d, q_d + h * d, D, nk ? k_d + kv : NULL, nk ? v_d + kv : NULL, KVD,
                          visible, A_d + h * d, D, lse_d + h, H, scores_d + h * nS);
        }
        float *gA = download(A_d, (size_t)nq * D), *glse = download(lse_d, (size_t)nq * H);
        float *gS = download(scores_d, H * nS);
        snprintf(tag, sizeof(tag), "v%d %dq x %dk d%d H%d G%d visible %d%s", ver + 1, nq, nk, d, H, G, visible,
                 q_std > 10 ? ", large scores" : "");
        snprintf(what, sizeof(what), "attention %s: A", tag);
        check_close_f(what, gA, A, (size_t)nq * D, 1e-5, 1e-4);
        snprintf(what, sizeof(what), "attention %s: lse", tag);
        check_close_f(what, glse, lse, (size_t)nq * H, 1e-5, 1e-5);
        snprintf(what, sizeof(what), "attention %s: probabilities", tag);
        check_close_f(what, gS, scores, H * nS, 1e-6, 1e-4);
        free(gA); free(glse); free(gS);
        CUDA_CHECK(cudaFree(A_d)); CUDA_CHECK(cudaFree(lse_d)); CUDA_CHECK(cudaFree(scores_d));
    }
    free(q); free(k); free(v); free(A); free(lse); free(scores);
    CUDA_CHECK(cudaFree(q_d)); CUDA_CHECK(cudaFree(k_d)); CUDA_CHECK(cudaFree(v_d));
}

/* One query per head (H, d) over nk keys (nk, G d): the split-KV decode
 * against the CPU's single softmax over all keys (q_std as in test_attention). */
static void test_decode_matches_cpu(int H, int G, int nk, int d, float q_std) {
    char what[160], tag[96];
    int KVD = G * d, group = H / G, chunks = attention_decode_chunks_cuda(nk);
    uint64_t rng = 53 + H + nk + d;
    float *q = host_floats((size_t)H * d), *k = host_floats((size_t)nk * KVD), *v = host_floats((size_t)nk * KVD);
    fill_normal(q, (size_t)H * d, q_std, &rng);
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
    snprintf(tag, sizeof(tag), "H%d G%d, %d keys (%d chunks), d%d%s", H, G, nk, chunks, d,
             q_std > 10 ? ", large scores" : "");
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
static void test_merge_matches_cpu(int n, int d) {
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

/* nq queries against nk keys, one head: the gradients of a random loss
 * through attention_states, CPU against GPU (rows 0.. of a causal case see
 * nothing, and must get no gradient). dq, dk, dv accumulate: both sides
 * start them at the same random values. */
static void test_attention_backward_matches_cpu(int nq, int nk, int d, int visible, int with_dlse) {
    char what[160], tag[96];
    uint64_t rng = 83 + nq + nk + d;
    size_t nqd = (size_t)nq * d, nkd = (size_t)nk * d, nS = (size_t)nq * nk;
    float *q = host_floats(nqd), *k = host_floats(nkd), *v = host_floats(nkd), *dA = host_floats(nqd);
    float *dlse = host_floats(nq);
    fill_normal(q, nqd, 2.0f, &rng); fill_normal(k, nkd, 1.0f, &rng); fill_normal(v, nkd, 1.0f, &rng);
    fill_normal(dA, nqd, 1.0f, &rng); fill_normal(dlse, nq, 1.0f, &rng);
    float *A = host_floats(nqd), *lse = host_floats(nq), *scores = host_floats(nS), *tmp = host_floats(nS);
    float *dq = host_floats(nqd), *dk = host_floats(nkd), *dv = host_floats(nkd);
    fill_normal(dq, nqd, 1.0f, &rng); fill_normal(dk, nkd, 1.0f, &rng); fill_normal(dv, nkd, 1.0f, &rng);
    float *dq_d = upload(dq, nqd), *dk_d = upload(dk, nkd), *dv_d = upload(dv, nkd);
    attention_states(nq, nk, d, q, d, k, v, d, visible, A, d, lse, 1, scores);
    attention_states_backward(nq, nk, d, q, d, k, v, d, A, dA, d, with_dlse ? dlse : NULL, 1, scores, dq, dk, dv, tmp);
    float *q_d = upload(q, nqd), *k_d = upload(k, nkd), *v_d = upload(v, nkd), *dA_d = upload(dA, nqd);
    float *dlse_d = upload(dlse, nq), *A_d = device_nan(nqd), *lse_d = device_nan(nq), *scores_d = device_nan(nS);
    float *tmp_d = device_nan(nS);
    attention_states_cuda(nq, nk, d, q_d, d, k_d, v_d, d, visible, A_d, d, lse_d, 1, scores_d);
    attention_states_backward_cuda(nq, nk, d, q_d, d, k_d, v_d, d, A_d, dA_d, d, with_dlse ? dlse_d : NULL, 1,
                                   scores_d, dq_d, dk_d, dv_d, tmp_d);
    float *g_dq = download(dq_d, nqd), *g_dk = download(dk_d, nkd), *g_dv = download(dv_d, nkd);
    snprintf(tag, sizeof(tag), "%dq x %dk d%d visible %d%s", nq, nk, d, visible, with_dlse ? ", dlse" : "");
    snprintf(what, sizeof(what), "attention backward %s: dq", tag);
    check_close_f(what, g_dq, dq, nqd, 1e-5, 1e-4);
    snprintf(what, sizeof(what), "attention backward %s: dk", tag);
    check_close_f(what, g_dk, dk, nkd, 1e-5, 1e-4);
    snprintf(what, sizeof(what), "attention backward %s: dv", tag);
    check_close_f(what, g_dv, dv, nkd, 1e-5, 1e-4);
    float *host[] = {q, k, v, dA, dlse, A, lse, scores, tmp, dq, dk, dv, g_dq, g_dk, g_dv};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++) free(host[i]);
    float *dev[] = {q_d, k_d, v_d, dA_d, dlse_d, A_d, lse_d, scores_d, tmp_d, dq_d, dk_d, dv_d};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) CUDA_CHECK(cudaFree(dev[i]));
}

/* ------------------------------------------------------------------------ */
/* Nectar modules                                                           */

/* A set of 2 layers x 2 KV heads (layer 1 modules one size larger), every
 * parameter random. Module 0 alone, then layer 1's two modules in one batch,
 * run N queries each forward and backward on the CPU and on the GPU: the
 * outputs, every parameter gradient and dq must agree. Parameter gradients
 * accumulate: both sides start them at the same random values. size: w
 * (MLP) or p (quadrature). Version 2 of the forward, the decode's, runs too
 * where N is a decode's few queries (emulated on more, it is slow). */
enum { DECODE_QUERIES = 64 };
static void test_module_matches_cpu(ModuleArch arch, int d, int size, int Db, int Ds, int Dt, int N, float input_scale) {
    char what[200], tag[128];
    ModuleSet s, s_d;
    int sizes[2] = { size, size + 3 };
    if (moduleset_alloc(&s, arch, 2, 2, d, Db, Ds, Dt, sizes, 1) != 0) {
        check("moduleset_alloc for the CUDA module test", 0);
        return;
    }
    uint64_t rng = 71 + d + size + N;
    float sigma = arch == ARCH_MLP ? 1.0f / sqrtf((float)(d + size)) : 1.0f;  /* keeps pre-activations O(1) */
    fill_normal(s.params, s.n_params, sigma, &rng);
    for (int i = 0; i < 4; i++) s.modules[i].input_scale = input_scale * (1.0f + 0.25f * i);
    size_t nd = (size_t)N * d;
    float *q = host_floats(2 * nd), *da = host_floats(2 * N), *dA = host_floats(2 * nd);
    float *a = host_floats(2 * N), *A = host_floats(2 * nd), *dq = host_floats(2 * nd);
    fill_normal(q, 2 * nd, arch == ARCH_MLP ? 1.0f : 2.0f, &rng);
    fill_normal(da, 2 * N, 1.0f, &rng);
    fill_normal(dA, 2 * nd, 1.0f, &rng);
    ModuleWork work, work_d;
    modulework_alloc(&work, &s, N);
    fill_normal(s.grads, s.n_params, 1.0f, &rng);
    moduleset_upload_cuda(&s_d, &s, 1);
    CUDA_CHECK(cudaMemcpy(s_d.grads, s.grads, s.n_params * sizeof(float), cudaMemcpyHostToDevice));
    modulework_alloc_cuda(&work_d, &s, 2 * N);
    float *q_d = upload(q, 2 * nd), *da_d = upload(da, 2 * N), *dA_d = upload(dA, 2 * nd);
    float *a_d = device_nan(2 * N), *A_d = device_nan(2 * nd), *dq_d = device_nan(2 * nd);
    if (arch == ARCH_MLP)
        snprintf(tag, sizeof(tag), "MLP d%d w%d (Db %d, Ds %d, Dt %d) scale %g, N %d", d, size, Db, Ds, Dt, input_scale, N);
    else
        snprintf(tag, sizeof(tag), "quadrature d%d p%d, N %d", d, size, N);
    struct { int first, count; } batches[2] = { {0, 1}, {2, 2} };
    for (int bi = 0; bi < 2; bi++) {
        int first = batches[bi].first, count = batches[bi].count;
        for (int g = 0; g < count; g++) {  /* the CPU, a module at a time */
            const Module *mod = &s.modules[first + g];
            module_forward(&s, mod, &work, q + g * nd, N, a + (size_t)g * N, A + g * nd);
            module_backward(&s, mod, &work, q + g * nd, N, A + g * nd, da + (size_t)g * N, dA + g * nd, dq + g * nd);
        }
        char which[48];
        snprintf(which, sizeof(which), count == 1 ? "module %d" : "modules %d-%d", first, first + count - 1);
        int versions = N <= DECODE_QUERIES ? 2 : 1;
        for (int v = 1; v <= versions; v++) {  /* the backward follows the last: it reads what that one left in w */
            CUDA_CHECK(cudaMemset(a_d, 0xff, count * N * sizeof(float)));
            CUDA_CHECK(cudaMemset(A_d, 0xff, count * nd * sizeof(float)));
            if (v == 1) modules_forward_cuda(&s_d, first, count, &work_d, q_d, N, a_d, A_d);
            else modules_forward_v2_cuda(&s_d, first, count, &work_d, q_d, N, a_d, A_d);
            float *ga = download(a_d, count * N), *gA = download(A_d, count * nd);
            snprintf(what, sizeof(what), "%s %s: a (forward v%d)", which, tag, v);
            check_close_f(what, ga, a, count * N, 1e-4, 1e-4);
            snprintf(what, sizeof(what), "%s %s: A (forward v%d)", which, tag, v);
            check_close_f(what, gA, A, count * nd, 1e-4, 1e-4);
            free(ga); free(gA);
        }
        modules_backward_cuda(&s_d, first, count, &work_d, q_d, N, A_d, da_d, dA_d, dq_d);
        float *gdq = download(dq_d, count * nd);
        snprintf(what, sizeof(what), "%s %s: dq (after forward v%d)", which, tag, versions);
        check_close_f(what, gdq, dq, count * nd, 1e-4, 1e-3);
        free(gdq);
    }
    /* every gradient: modules 0, 2, 3 added theirs, module 1 none (its start on both) */
    float *gg = download(s_d.grads, s.n_params);
    snprintf(what, sizeof(what), "gradients %s", tag);
    check_close_f(what, gg, s.grads, s.n_params, 1e-4, 1e-3);
    free(gg);
    modulework_free(&work);
    modulework_free_cuda(&work_d);
    moduleset_free_cuda(&s_d);
    moduleset_free(&s);
    float *host[] = {q, da, dA, a, A, dq};
    for (int i = 0; i < 6; i++) free(host[i]);
    float *dev[] = {q_d, da_d, dA_d, a_d, A_d, dq_d};
    for (int i = 0; i < 6; i++) CUDA_CHECK(cudaFree(dev[i]));
}

/* ------------------------------------------------------------------------ */
/* Fitting                                                                  */

/* `steps` steps of the fitting loop (regression gradients weighted by
 * lambda_A, clipping at 1, AdamW with beta2) on a tiny set of L = 2 layers
 * x G = 2 modules, H = 4 heads, over random targets, on the CPU and the GPU
 * from the same start: the losses and norms of every step and the final
 * parameters must agree. */
static void test_fit_matches_cpu(ModuleArch arch, int d, int size, int B, int steps, float lambda_A, float beta2) {
    char what[160], tag[96];
    const int L = 2, G = 2, H = 4, P = 61, D = H * d;
    int sizes[2] = { size, size + 2 };
    ModuleSet s, s_d;
    if (moduleset_alloc(&s, arch, L, G, d, 1, 1, 1, sizes, 1) != 0) { check("moduleset_alloc for test_fit", 0); return; }
    uint64_t rng = 97 + d + size;
    fill_normal(s.params, s.n_params, arch == ARCH_MLP ? 0.2f : 1.0f, &rng);
    FitTargets t = {P, (uint16_t *)xmalloc((size_t)L * P * D * sizeof(uint16_t)),
                    (uint16_t *)xmalloc((size_t)L * P * D * sizeof(uint16_t)), host_floats((size_t)L * P * H)}, t_d;
    fill_normal_bf16(t.q, (size_t)L * P * D, 1.0f, &rng);
    fill_normal_bf16(t.A, (size_t)L * P * D, 0.5f, &rng);
    fill_normal(t.alpha, (size_t)L * P * H, 2.0f, &rng);
    moduleset_upload_cuda(&s_d, &s, 1);
    fittargets_upload_cuda(&t_d, &t, L, D, H);
    ModuleWork work, work_d;
    FitBatch b, b_d;
    modulework_alloc(&work, &s, B * (H / G));
    modulework_alloc_cuda(&work_d, &s, G * B * (H / G));
    fitbatch_alloc(&b, &s, H, B);
    fitbatch_alloc_cuda(&b_d, &s, H, B);
    float *m = host_floats(s.n_params), *v = host_floats(s.n_params);
    float *m_d = (float *)cuda_xmalloc(s.n_params * sizeof(float)), *v_d = (float *)cuda_xmalloc(s.n_params * sizeof(float));
    float lambda_alpha = arch == ARCH_MLP ? 0.1f : 0.0f, lr = 1e-2f, wd = 0.01f;
    double max_loss_rel = 0, max_norm_rel = 0;
    for (int step = 1; step <= steps; step++) {
        for (int i = 0; i < B; i++) b.pos[i] = b_d.pos[i] = (long)(rng_u32(&rng) % P);
        memset(s.grads, 0, s.n_params * sizeof(float));
        CUDA_CHECK(cudaMemset(s_d.grads, 0, s.n_params * sizeof(float)));
        double loss = regression_grads(&s, &work, &b, &t, H, lambda_alpha, lambda_A);
        double loss_d = regression_grads_cuda(&s_d, &work_d, &b_d, &t_d, H, lambda_alpha, lambda_A);
        double norm = clip_grad_norm(s.grads, s.n_params, 1.0), norm_d = clip_grad_norm_cuda(s_d.grads, s.n_params, 1.0);
        adamw_update(s.params, s.grads, m, v, s.n_params, step, lr, wd, beta2);
        adamw_update_cuda(s_d.params, s_d.grads, m_d, v_d, s.n_params, step, lr, wd, beta2);
        max_loss_rel = fmax(max_loss_rel, fabs(loss_d - loss) / fabs(loss));
        max_norm_rel = fmax(max_norm_rel, fabs(norm_d - norm) / norm);
    }
    snprintf(tag, sizeof(tag), "%s d%d size %d, batch %d, %d steps, lambda_A %g, beta2 %g",
             arch == ARCH_MLP ? "MLP" : "quadrature", d, size, B, steps, lambda_A, beta2);
    printf("  fit %s: losses within %.1e, gradient norms within %.1e (relative)\n", tag, max_loss_rel, max_norm_rel);
    snprintf(what, sizeof(what), "fit %s: loss and norm every step", tag);
    check(what, max_loss_rel < 1e-4 && max_norm_rel < 1e-4);
    float *params = download(s_d.params, s.n_params);
    snprintf(what, sizeof(what), "fit %s: parameters", tag);
    check_close_f(what, params, s.params, s.n_params, 1e-4, 1e-3);
    free(params); free(m); free(v); free(t.q); free(t.A); free(t.alpha);
    CUDA_CHECK(cudaFree(m_d)); CUDA_CHECK(cudaFree(v_d));
    fitbatch_free(&b); fitbatch_free_cuda(&b_d);
    modulework_free(&work); modulework_free_cuda(&work_d);
    fittargets_free_cuda(&t_d);
    moduleset_free_cuda(&s_d);
    moduleset_free(&s);
}

/* clip_grad_norm_cuda against clip_grad_norm on n random gradients scaled
 * to the given norm, clipped at 1: the norm it returns, and the gradients
 * after (below the limit, untouched bit for bit). */
static void test_clip_matches_cpu(size_t n, double norm) {
    char what[160];
    uint64_t rng = 151 + n;
    float *g = host_floats(n);
    fill_normal(g, n, 1.0f, &rng);
    double sum_sq = 0;
    for (size_t i = 0; i < n; i++) sum_sq += (double)g[i] * g[i];
    for (size_t i = 0; i < n; i++) g[i] *= (float)(norm / sqrt(sum_sq));
    float *g_d = upload(g, n), *before = host_floats(n);
    memcpy(before, g, n * sizeof(float));
    double norm_cpu = clip_grad_norm(g, n, 1.0), norm_gpu = clip_grad_norm_cuda(g_d, n, 1.0);
    float *got = download(g_d, n);
    snprintf(what, sizeof(what), "clip_grad_norm %zu gradients of norm %g: the norm (CPU %.9g, GPU %.9g)", n, norm,
             norm_cpu, norm_gpu);
    check(what, fabs(norm_gpu - norm_cpu) <= 1e-6 * norm_cpu);
    snprintf(what, sizeof(what), "clip_grad_norm %zu gradients of norm %g: the gradients", n, norm);
    if (norm_cpu <= 1.0) check(what, memcmp(got, before, n * sizeof(float)) == 0);
    else check_close_f(what, got, g, n, 1e-7, 1e-5);
    free(g); free(before); free(got);
    CUDA_CHECK(cudaFree(g_d));
}

/* kl_term_cuda against kl_term (src/compile.c, in double) on len random
 * positions of a vocabulary of V: the teacher's whole distribution (k = 0)
 * or its top k (top_k_logprobs); the KL and its gradient, times the
 * weight. The logits' spread (std) makes the distributions peaked. */
static void test_kl_term_matches_cpu(int len, int V, int k, float std) {
    char what[160];
    uint64_t rng = 171 + len + V + k;
    size_t n = (size_t)len * V;
    float *z = host_floats(n), *y = host_floats(n), *ref = host_floats(n), weight = 0.7f;
    fill_normal(z, n, std, &rng);
    fill_normal(y, n, std, &rng);
    int *ids = (int *)xmalloc((size_t)len * (k ? k : 1) * sizeof(int));
    float *logp = host_floats((size_t)len * (k ? k : 1)), *rest = host_floats(len);
    for (int t = 0; t < len && k; t++)
        top_k_logprobs(y + (size_t)t * V, V, k, ids + (size_t)t * k, logp + (size_t)t * k, rest + t);
    TeacherRows host = {k ? NULL : y, k, k ? ids : NULL, k ? logp : NULL, k ? rest : NULL};
    double kl_cpu = kl_term(&host, z, len, V, weight, ref);
    float *z_d = upload(z, n), *y_d = upload(y, n), *logp_d = upload(logp, (size_t)len * k), *rest_d = upload(rest, len);
    float *g_d = device_nan(n), *row_kl_d = device_nan(len);
    int *ids_d = (int *)cuda_xmalloc((size_t)len * (k ? k : 1) * sizeof(int));
    CUDA_CHECK(cudaMemcpy(ids_d, ids, (size_t)len * k * sizeof(int), cudaMemcpyHostToDevice));
    TeacherRows dev = {k ? NULL : y_d, k, k ? ids_d : NULL, k ? logp_d : NULL, k ? rest_d : NULL};
    double kl_gpu = kl_term_cuda(&dev, z_d, len, V, weight, g_d, row_kl_d);
    float *got = download(g_d, n);
    snprintf(what, sizeof(what), "KL term %d x %d, %s, std %g: KL (CPU %.7g, GPU %.7g)", len, V,
             k ? "top k" : "whole vocabulary", std, kl_cpu, kl_gpu);
    check(what, fabs(kl_gpu - kl_cpu) <= 1e-5 * kl_cpu + 1e-6);
    snprintf(what, sizeof(what), "KL term %d x %d, %s (k %d): its gradient", len, V, k ? "top k" : "whole vocabulary", k);
    check_close_f(what, got, ref, n, 1e-6 * weight / len, 1e-3);
    free(z); free(y); free(ref); free(ids); free(logp); free(rest); free(got);
    float *dev_bufs[] = {z_d, y_d, logp_d, rest_d, g_d, row_kl_d};
    for (int i = 0; i < 6; i++) CUDA_CHECK(cudaFree(dev_bufs[i]));
    CUDA_CHECK(cudaFree(ids_d));
}

/* ------------------------------------------------------------------------ */
/* The forward pass                                                         */

/* A random model and document, and every state of that document on both
 * sides: the KV cache (the CPU's prefill; the GPU's own), random MLP and
 * quadrature modules (the modules of a layer share a shape, the layers
 * differ) and their device copies; docs[]: exact, Nectar MLP, Nectar
 * quadrature, no document. */
typedef struct {
    Model m, m_d;
    int *doc_ids;
    DocCache cache, cache_d;
    ModuleSet mlp, quad, mlp_d, quad_d;
    struct { const char *name; Document cpu, gpu; ModuleSet *ms, *ms_d; } docs[4];
} Fixture;

static int fixture_init(Fixture *f, Config c, int n_doc, int block, int with_grads, uint64_t seed) {
    if (model_init_random(&f->m, c, 1, seed, 0.08f) != 0) { check("model_init_random", 0); return -1; }
    model_upload_cuda(&f->m_d, &f->m);
    uint64_t rng = seed * 31 + 1;
    f->doc_ids = (int *)xmalloc(n_doc * sizeof(int));
    for (int i = 0; i < n_doc; i++) f->doc_ids[i] = 1 + rng_u32(&rng) % (c.vocab_size - 1);
    doccache_build(&f->cache, &f->m, f->doc_ids, n_doc, block);
    doccache_build_cuda(&f->cache_d, &f->m_d, f->doc_ids, n_doc, block);
    int d = c.dim / c.n_heads, widths[8], pairs[8];
    for (int l = 0; l < c.n_layers; l++) { widths[l] = 24 + 8 * (l % 2); pairs[l] = 17 + l; }
    moduleset_alloc(&f->mlp, ARCH_MLP, c.n_layers, c.n_kv_heads, d, 1, 1, 1, widths, with_grads);
    moduleset_alloc(&f->quad, ARCH_QUAD, c.n_layers, c.n_kv_heads, d, 0, 0, 0, pairs, with_grads);
    fill_normal(f->mlp.params, f->mlp.n_params, 0.15f, &rng);
    fill_normal(f->quad.params, f->quad.n_params, 0.5f, &rng);
    f->mlp.n_doc = f->quad.n_doc = n_doc;
    moduleset_upload_cuda(&f->mlp_d, &f->mlp, with_grads);
    moduleset_upload_cuda(&f->quad_d, &f->quad, with_grads);
    f->docs[0] = {"exact", {DOC_EXACT, n_doc, &f->cache, NULL}, {DOC_EXACT, n_doc, &f->cache_d, NULL}, NULL, NULL};
    f->docs[1] = {"Nectar MLP", {DOC_NECTAR, n_doc, NULL, &f->mlp}, {DOC_NECTAR, n_doc, NULL, &f->mlp_d},
                  &f->mlp, &f->mlp_d};
    f->docs[2] = {"Nectar quadrature", {DOC_NECTAR, n_doc, NULL, &f->quad}, {DOC_NECTAR, n_doc, NULL, &f->quad_d},
                  &f->quad, &f->quad_d};
    f->docs[3] = {"no document", NO_DOCUMENT, NO_DOCUMENT, NULL, NULL};
    return 0;
}

static void fixture_free(Fixture *f) {
    moduleset_free_cuda(&f->mlp_d); moduleset_free_cuda(&f->quad_d);
    moduleset_free(&f->mlp); moduleset_free(&f->quad);
    doccache_free(&f->cache); doccache_free_cuda(&f->cache_d);
    model_free_cuda(&f->m_d); model_free(&f->m);
    free(f->doc_ids);
}

/* A cache laid out (L, n, KVD) as the GPU keeps it, in the CPU's layout
 * (L, G, n, d); malloc'd. */
static float *heads_together(const float *x, int L, int n, int G, int d) {
    float *y = (float *)xmalloc((size_t)L * n * G * d * sizeof(float));
    for (int l = 0; l < L; l++)
        for (int g = 0; g < G; g++)
            copy_rows(y + ((size_t)l * G + g) * n * d, d, x + (size_t)l * n * G * d + (size_t)g * d, G * d, n, d);
    return y;
}

/* The GPU's document cache (its own prefill) against the CPU's, then a
 * prompt and `decode` greedy steps with each state of the document: the
 * GPU's logits against the CPU's at every step. And the operations a decode
 * step queues (nectar_cuda_ops, as benchmark --gpu prints them): a step is
 * bound by their count, and Nectar's must be at most the exact path's. */
static void test_forward_matches_cpu(Config c, int n_doc, int block, int n_prompt, int decode) {
    char what[200], tag[128];
    Fixture f;
    if (fixture_init(&f, c, n_doc, block, 0, 5 + c.dim + n_doc) != 0) return;
    int V = c.vocab_size;
    uint64_t rng = 101 + n_doc;
    int *prompt = (int *)xmalloc(n_prompt * sizeof(int));
    for (int i = 0; i < n_prompt; i++) prompt[i] = 1 + rng_u32(&rng) % (V - 1);
    snprintf(tag, sizeof(tag), "D%d L%d H%d G%d V%d, document %d (block %d)", c.dim, c.n_layers, c.n_heads,
             c.n_kv_heads, V, n_doc, block);
    size_t kv = (size_t)c.n_layers * n_doc * f.cache.kv_dim;
    int d = c.dim / c.n_heads;
    float *gk_rows = download(f.cache_d.key, kv), *gv_rows = download(f.cache_d.value, kv);
    float *gk = heads_together(gk_rows, c.n_layers, n_doc, c.n_kv_heads, d);
    float *gv = heads_together(gv_rows, c.n_layers, n_doc, c.n_kv_heads, d);
    snprintf(what, sizeof(what), "prefill %s: keys", tag);
    check_close_f(what, gk, f.cache.key, kv, 1e-4, 1e-3);
    snprintf(what, sizeof(what), "prefill %s: values", tag);
    check_close_f(what, gv, f.cache.value, kv, 1e-4, 1e-3);
    free(gk); free(gv); free(gk_rows); free(gv_rows);
    long ops[4];  /* per decoded token, docs[r] */
    for (int r = 0; r < 4; r++) {
        const Document *doc = &f.docs[r].cpu, *doc_d = &f.docs[r].gpu;
        RunState s;
        RunStateCuda s_d;
        runstate_alloc(&s, &f.m, doc, n_prompt, n_prompt + decode);
        runstate_alloc_cuda(&s_d, &f.m_d, doc_d, n_prompt, n_prompt + decode);
        forward(&f.m, &s, doc, prompt, n_prompt, 0, LOGITS_ALL);
        forward_cuda(&f.m_d, &s_d, doc_d, prompt, n_prompt, 0, LOGITS_ALL);
        snprintf(what, sizeof(what), "forward %s, %s: prompt of %d, every row", tag, f.docs[r].name, n_prompt);
        check_close_f(what, s_d.logits, s.logits, (size_t)n_prompt * V, 1e-4, 1e-3);
        double max_err = 0;
        int same_tokens = 1, token = argmax(s.logits + (size_t)(n_prompt - 1) * V, V);
        for (int i = 0; i < decode; i++) {  /* greedy decode, both fed the CPU's token */
            forward(&f.m, &s, doc, &token, 1, n_prompt + i, LOGITS_LAST);
            nectar_cuda_ops_reset();
            forward_cuda(&f.m_d, &s_d, doc_d, &token, 1, n_prompt + i, LOGITS_LAST);
            ops[r] = nectar_cuda_ops();
            for (int j = 0; j < V; j++) max_err = fmax(max_err, fabs(s_d.logits[j] - s.logits[j]));
            same_tokens &= argmax(s_d.logits, V) == argmax(s.logits, V);
            token = argmax(s.logits, V);
        }
        printf("  forward %s, %s: %d decode steps, logits within %.2e\n", tag, f.docs[r].name, decode, max_err);
        snprintf(what, sizeof(what), "decode %s, %s: logits within 1e-3, same argmax", tag, f.docs[r].name);
        check(what, max_err <= 1e-3 && same_tokens);
        runstate_free(&s);
        runstate_free_cuda(&s_d);
    }
    printf("  operations per decoded token, %s: exact %ld, Nectar MLP %ld, Nectar quadrature %ld, no document %ld\n",
           tag, ops[0], ops[1], ops[2], ops[3]);
    snprintf(what, sizeof(what), "decode %s: Nectar's operations per token at most the exact path's", tag);
    check(what, ops[1] <= ops[0] && ops[2] <= ops[0]);
    fixture_free(&f);
    free(prompt);
}

/* The largest |x_i| of n floats. */
static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* The backward pass behind train --gpu's KL term: a prompt after the
 * document (exact, Nectar MLP, Nectar quadrature, none), random dlogits; the GPU's
 * module gradients and dL/d(layer 0's input) against the CPU's. These
 * gradients are sums with cancellation: entries 1000 times smaller than the
 * largest carry the rounding of terms as large as it (on the CPU alone,
 * dlogits moved by 1e-6 of themselves move dL/dx by 1.3e-6 of its largest
 * entry, D256 case). So the absolute tolerance is 2e-5 of the largest entry,
 * with 1e-3 relative. */
static void test_backward_matches_cpu(Config c, int n_doc, int ntok) {
    char what[200], tag[128];
    Fixture f;
    if (fixture_init(&f, c, n_doc, 64, 1, 7 + c.dim + n_doc) != 0) return;
    int V = c.vocab_size, D = c.dim;
    uint64_t rng = 131 + n_doc;
    int *tokens = (int *)xmalloc(ntok * sizeof(int));
    for (int i = 0; i < ntok; i++) tokens[i] = 1 + rng_u32(&rng) % (V - 1);
    float *dlogits = host_floats((size_t)ntok * V);
    fill_normal(dlogits, (size_t)ntok * V, 0.1f, &rng);
    snprintf(tag, sizeof(tag), "D%d L%d H%d G%d, document %d, prompt %d", c.dim, c.n_layers, c.n_heads,
             c.n_kv_heads, n_doc, ntok);
    for (int r = 0; r < 4; r++) {
        const Document *doc = &f.docs[r].cpu, *doc_d = &f.docs[r].gpu;
        RunState s;
        RunStateCuda s_d;
        runstate_alloc(&s, &f.m, doc, ntok, ntok);
        runstate_enable_backward(&s, &f.m);
        runstate_alloc_cuda(&s_d, &f.m_d, doc_d, ntok, ntok);
        runstate_enable_backward_cuda(&s_d, &f.m_d);
        forward(&f.m, &s, doc, tokens, ntok, 0, LOGITS_ALL);
        backward(&f.m, &s, doc, tokens, ntok, dlogits, NULL);
        forward_cuda(&f.m_d, &s_d, doc_d, tokens, ntok, 0, LOGITS_ALL);
        backward_cuda(&f.m_d, &s_d, doc_d, ntok, dlogits);
        float *gdx = download(s_d.s.back.dx, (size_t)ntok * D);
        snprintf(what, sizeof(what), "backward %s, %s: dL/dx at layer 0", tag, f.docs[r].name);
        check_close_f(what, gdx, s.back.dx, (size_t)ntok * D, 2e-5 * max_abs(s.back.dx, (size_t)ntok * D), 1e-3);
        free(gdx);
        if (f.docs[r].ms) {
            const ModuleSet *ms = f.docs[r].ms;
            float *gg = download(f.docs[r].ms_d->grads, ms->n_params);
            snprintf(what, sizeof(what), "backward %s, %s: module gradients", tag, f.docs[r].name);
            check_close_f(what, gg, ms->grads, ms->n_params, 2e-5 * max_abs(ms->grads, ms->n_params), 1e-3);
            free(gg);
        }
        runstate_free(&s);
        runstate_free_cuda(&s_d);
    }
    fixture_free(&f);
    free(tokens); free(dlogits);
}

/* ------------------------------------------------------------------------ */

/* No device: SKIP and pass, unless NECTAR_REQUIRE_GPU is set (a run meant
 * for a GPU, where a driver or runtime fault must not read as a pass). */
int main(void) {
    int n_devices = 0;
    cudaError_t err = cudaGetDeviceCount(&n_devices);
    if (err != cudaSuccess || n_devices == 0) {
        fprintf(stderr, "test_cuda: %s\n", err != cudaSuccess ? cudaGetErrorString(err) : "no device found");
        if (getenv("NECTAR_REQUIRE_GPU")) {
            fprintf(stderr, "error: NECTAR_REQUIRE_GPU is set and there is no usable CUDA device\n");
            return 1;
        }
        printf("SKIP: no CUDA device\n");
        printf("0 passed, 0 failed, 1 skipped\n");
        return 0;
    }
    if (nectar_cuda_init() != 0) return 1;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);

    printf("rmsnorm, rope, swiglu\n");
    test_rmsnorm_matches_cpu(37, 37, 2.0f, 1e-5f);
    test_rmsnorm_matches_cpu(37, 288, 2.0f, 1e-5f);
    test_rmsnorm_matches_cpu(37, 288, 1e-3f, 1e-5f);  /* the eps matters */
    test_rmsnorm_matches_cpu(37, 288, 1e-3f, 1e-6f);
    test_rmsnorm_matches_cpu(128, 4096, 2.0f, 1e-5f);
    test_rope_matches_cpu(37, 3, 16, 0, 0, 10000.0f, 1.0f);
    test_rope_matches_cpu(37, 5, 32, 7, 4000, 10000.0f, 1.0f);     /* strided rows, a far position */
    test_rope_matches_cpu(128, 8, 64, 0, 1000, 10000.0f, -1.0f);   /* rotating back */
    test_rope_matches_cpu(128, 2, 128, 0, 4096, 10000.0f, 1.0f);   /* a KV row */
    test_rope_matches_cpu(37, 9, 64, 0, 7600, 100000.0f, 1.0f);    /* SmolLM2's heads and base, a far position */
    test_swiglu_matches_cpu(37 * 113);
    test_swiglu_matches_cpu((size_t)128 * 11008);

    printf("attention states (strided heads, causal rule)\n");
    test_attention_matches_cpu(37, 17, 16, 1, 1, 17, 2.0f);          /* odd sizes, GQA 1 */
    test_attention_matches_cpu(37, 17, 32, 4, 2, -5, 2.0f);          /* GQA 2; rows 0..5 see nothing */
    test_attention_matches_cpu(37, 17, 16, 3, 3, 100, 2.0f);         /* visible past nk */
    test_attention_matches_cpu(37, 17, 48, 2, 1, 17, 2.0f);          /* head size not dividing the block */
    test_attention_matches_cpu(9, 33, 256, 2, 2, 33, 2.0f);          /* the largest head size v1 takes */
    test_attention_matches_cpu(5, 0, 16, 2, 1, 0, 2.0f);             /* empty document: (0, -inf) */
    test_attention_matches_cpu(7, 1, 32, 2, 2, 1, 2.0f);             /* one-key document */
    test_attention_matches_cpu(7, 1, 16, 4, 1, -2, 2.0f);            /* one key, first rows empty */
    test_attention_matches_cpu(37, 513, 128, 2, 1, 513, 2.0f);
    test_attention_matches_cpu(128, 4096, 64, 4, 1, 4096, 2.0f);     /* realistic document, GQA 4 */
    test_attention_matches_cpu(128, 4096 + 128, 64, 4, 2, 4097, 2.0f); /* local state of a block at pos 4096 */
    test_attention_matches_cpu(37, 17, 32, 4, 2, 17, 60.0f);         /* scores past expf's range */

    printf("split-KV decode (chunk states merged by log-sum-exp)\n");
    test_decode_matches_cpu(4, 4, 0, 16, 2.0f);          /* empty document */
    test_decode_matches_cpu(4, 2, 1, 32, 2.0f);          /* one key */
    test_decode_matches_cpu(3, 1, 17, 16, 2.0f);
    test_decode_matches_cpu(8, 2, 256, 64, 2.0f);        /* exactly one chunk */
    test_decode_matches_cpu(8, 2, 257, 64, 2.0f);        /* one key into the second chunk */
    test_decode_matches_cpu(8, 8, 4096, 64, 2.0f);
    test_decode_matches_cpu(32, 8, 40000, 128, 2.0f);    /* long document, GQA 4 */
    test_decode_matches_cpu(4, 2, 300, 256, 2.0f);       /* the largest head size, two chunks */
    test_decode_matches_cpu(8, 2, 600, 64, 60.0f);       /* scores past expf's range, three chunks */

    printf("merge_states\n");
    test_merge_matches_cpu(37 * 3, 16);
    test_merge_matches_cpu(37, 48);
    test_merge_matches_cpu(128 * 32, 64);

    printf("attention backward\n");
    test_attention_backward_matches_cpu(37, 17, 16, 17, 1);
    test_attention_backward_matches_cpu(37, 17, 32, -5, 1);   /* rows 0..5 see nothing */
    test_attention_backward_matches_cpu(7, 1, 16, 1, 0);      /* one key, no dlse */
    test_attention_backward_matches_cpu(128, 409, 64, 409, 1);

    printf("modules forward and backward (one, then a layer's two in a batch)\n");
    test_module_matches_cpu(ARCH_MLP, 16, 37, 1, 1, 1, 37, 1.0f);
    test_module_matches_cpu(ARCH_MLP, 32, 17, 2, 0, 1, 37, 0.5f);
    test_module_matches_cpu(ARCH_MLP, 16, 5, 0, 1, 2, 37, 1.0f);
    test_module_matches_cpu(ARCH_MLP, 16, 9, 0, 0, 0, 11, 2.0f);   /* no hidden layer: both heads read x */
    test_module_matches_cpu(ARCH_MLP, 64, 512, 1, 1, 1, 512, 1.0f);
    test_module_matches_cpu(ARCH_MLP, 64, 256, 2, 2, 2, 1024, 1.0f);   /* deep: 1024 queries for each module of the batch */
    test_module_matches_cpu(ARCH_QUAD, 16, 17, 0, 0, 0, 37, 1.0f);
    test_module_matches_cpu(ARCH_QUAD, 32, 1, 0, 0, 0, 7, 1.0f);   /* one pair */
    test_module_matches_cpu(ARCH_QUAD, 64, 409, 0, 0, 0, 512, 1.0f);
    test_module_matches_cpu(ARCH_MLP, 64, 512, 1, 1, 1, 3, 1.0f);   /* a decode step: H / G = 3 queries a module */
    test_module_matches_cpu(ARCH_MLP, 64, 256, 2, 2, 2, 4, 1.0f);
    test_module_matches_cpu(ARCH_QUAD, 64, 409, 0, 0, 0, 3, 1.0f);

    printf("fitting: clipping alone, then regression gradients, clipping, AdamW\n");
    test_clip_matches_cpu(37, 0.5);
    test_clip_matches_cpu(37, 3.0);
    test_clip_matches_cpu(300000, 0.5);  /* more than the 256 blocks x 256 threads of the sum */
    test_clip_matches_cpu(300000, 3.0);
    test_fit_matches_cpu(ARCH_MLP, 16, 37, 17, 12, 0.5f, ADAM_BETA2);
    test_fit_matches_cpu(ARCH_QUAD, 16, 13, 9, 12, 2.0f, 0.95f);  /* pretraining's beta2 */

    printf("the KL term (the teacher's whole distribution, or its top k and the rest)\n");
    test_kl_term_matches_cpu(7, 67, 0, 2.0f);
    test_kl_term_matches_cpu(7, 67, 5, 2.0f);
    test_kl_term_matches_cpu(37, 300, 16, 3.0f);
    test_kl_term_matches_cpu(5, 49152, 32, 3.0f);   /* SmolLM2's vocabulary and the chat recipe's k */
    test_kl_term_matches_cpu(5, 49152, 0, 3.0f);
    test_kl_term_matches_cpu(3, 300, 300, 2.0f);    /* k = V: no rest */

    printf("forward pass: prefill, exact / Nectar / no-document decode\n");
    Config small = {64, 96, 2, 4, 2, 67, 256, LLAMA2C_ROPE_THETA, LLAMA2C_NORM_EPS};    /* GQA 2, odd vocabulary */
    Config mha = {48, 80, 3, 3, 3, 37, 256, LLAMA2C_ROPE_THETA, LLAMA2C_NORM_EPS};      /* GQA 1, head size 16 */
    Config wide = {256, 512, 4, 8, 2, 512, 2048, 100000.0f, 1e-6f}; /* GQA 4, head size 32, SmolLM2's theta */
    test_forward_matches_cpu(small, 37, 16, 5, 6);
    test_forward_matches_cpu(mha, 17, 17, 3, 4);
    test_forward_matches_cpu(wide, 1100, 256, 33, 16);

    printf("backward pass (the KL term of train --gpu)\n");
    test_backward_matches_cpu(small, 37, 9);
    test_backward_matches_cpu(mha, 17, 5);
    test_backward_matches_cpu(wide, 300, 24);

    nectar_cuda_free();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed != 0;
}
