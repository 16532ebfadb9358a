/* nectar.c - the method, on the CPU with OpenBLAS: the reference that
 * everything faster is checked against. Read top to bottom, in the order the
 * method is built:
 *   1. attention states (A, lse) and their exact merge by log-sum-exp, and
 *      the gate form of the same merge;
 *   2. the modules that stand in for a document's state (MLP with query
 *      re-injection, quadrature), each forward next to its backward;
 *   3. the losses (regression, KL) and the fitting step (clipping, AdamW);
 *   4. the transformer's forward pass, with the exact and the Nectar
 *      attention side by side: they differ in one line, where the
 *      document's state comes from;
 *   5. its backward pass into the modules, and the document's KV cache;
 *   8. generation after a document: the sampler, and a forward a token
 *      (sections 6 and 7 are src/compile.c's and src/modfile.c's).
 * Shapes use the legend at the top of nectar.h; each backward quotes the
 * forward line it differentiates. */
#include "nectar.h"
#include "src/kernels.h"
#include "src/parallel.h"
#include "src/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* 1. Attention states and their merge                                      */

/* For queries q_i and keys/values (k_j, v_j), the scores, the log attention
 * mass and the retrieved content:
 *   s_ij = q_i . k_j / sqrt(d),  lse_i = log sum_j exp(s_ij),
 *   A_i  = sum_j softmax(s_i)_j v_j,
 * where query i sees only keys j < visible + i. The empty set's state is
 * (0, -inf). */
void attention_states(int nq, int nk, int d, const float *q, int ldq,
                      const float *k, const float *v, int ldkv, int visible,
                      float *A, int ldA, float *lse, int ldlse, float *scores) {
    if (nk > 0)  /* scores (nq, nk) = Q K^T / sqrt(d) */
        gemm(CblasNoTrans, CblasTrans, nq, nk, d, 1.0f / sqrtf((float)d), q, ldq, k, ldkv, 0.0f, scores, nk);
    for (int i = 0; i < nq; i++) {
        float *row = scores + (size_t)i * nk;
        int seen = visible + i < nk ? visible + i : nk;
        if (seen <= 0) {  /* empty set: state (0, -inf) */
            memset(row, 0, (size_t)nk * sizeof(float));
            lse[(size_t)i * ldlse] = -INFINITY;
            continue;
        }
        float max = row[0], sum = 0.0f;
        #pragma omp simd reduction(max:max)
        for (int j = 1; j < seen; j++) max = row[j] > max ? row[j] : max;
        #pragma omp simd reduction(+:sum)
        for (int j = 0; j < seen; j++) { row[j] = exp_fast(row[j] - max); sum += row[j]; }
        /* lse = log sum_j exp(s_j) = max + log sum_j exp(s_j - max) */
        lse[(size_t)i * ldlse] = max + logf(sum);
        float inv = 1.0f / sum;
        #pragma omp simd
        for (int j = 0; j < seen; j++) row[j] *= inv;
        memset(row + seen, 0, (size_t)(nk - seen) * sizeof(float));
    }
    if (nk > 0)  /* A (nq, d) = P V */
        gemm(CblasNoTrans, CblasNoTrans, nq, d, nk, 1.0f, scores, nk, v, ldkv, 0.0f, A, ldA);
    else
        for (int i = 0; i < nq; i++) memset(A + (size_t)i * ldA, 0, (size_t)d * sizeof(float));
}

/* Backward of A_i = sum_j P_ij v_j, lse_i = log sum_j exp(s_ij), P = softmax(s):
 *   dv_j  += sum_i P_ij dA_i
 *   ds_ij  = P_ij (dlse_i + dA_i . v_j - dA_i . A_i)
 *   dq_i  += sum_j ds_ij k_j / sqrt(d),   dk_j += sum_i ds_ij q_i / sqrt(d)
 * Masked keys have P_ij = 0 and get nothing. */
void attention_states_backward(int nq, int nk, int d, const float *q, int ldq,
                               const float *k, const float *v, int ldkv,
                               const float *A, const float *dA, int ldA, const float *dlse, int ldlse,
                               const float *scores, float *dq, float *dk, float *dv, float *tmp) {
    if (nk == 0) return;
    float scale = 1.0f / sqrtf((float)d);
    if (dv) gemm(CblasTrans, CblasNoTrans, nk, d, nq, 1.0f, scores, nk, dA, ldA, 1.0f, dv, ldkv);
    /* tmp (nq, nk) = dA V^T, then ds in place */
    gemm(CblasNoTrans, CblasTrans, nq, nk, d, 1.0f, dA, ldA, v, ldkv, 0.0f, tmp, nk);
    for (int i = 0; i < nq; i++) {
        float dA_dot_A = 0.0f;
        for (int c = 0; c < d; c++) dA_dot_A += dA[(size_t)i * ldA + c] * A[(size_t)i * ldA + c];
        float g = dlse ? dlse[(size_t)i * ldlse] : 0.0f;
        for (int j = 0; j < nk; j++) {
            size_t ij = (size_t)i * nk + j;
            tmp[ij] = scores[ij] * (g + tmp[ij] - dA_dot_A);
        }
    }
    if (dq) gemm(CblasNoTrans, CblasNoTrans, nq, d, nk, scale, tmp, nk, k, ldkv, 1.0f, dq, ldq);
    if (dk) gemm(CblasTrans, CblasNoTrans, nk, d, nq, scale, tmp, nk, q, ldq, 1.0f, dk, ldkv);
}

/* m = max(lse1, lse2), w_i = exp(lse_i - m):
 *   A = (w1 A1 + w2 A2) / (w1 + w2),  lse = m + log(w1 + w2).
 * Two empty states give (0, -inf). A may alias A1 or A2. */
void merge_states(int d, const float *A1, float lse1, const float *A2, float lse2,
                  float *A, float *lse) {
    float m = lse1 > lse2 ? lse1 : lse2;
    if (m == -INFINITY) {
        for (int c = 0; c < d; c++) A[c] = 0.0f;
        *lse = -INFINITY;
        return;
    }
    float w1 = expf(lse1 - m), w2 = expf(lse2 - m);  /* exp(-inf) = 0: an empty side drops out */
    float inv = 1.0f / (w1 + w2);
    for (int c = 0; c < d; c++) A[c] = (w1 * A1[c] + w2 * A2[c]) * inv;
    *lse = m + logf(w1 + w2);
}

/* Backward of the merge's A (its lse is not used downstream). With
 * g = w1 / (w1 + w2) = sigmoid(lse1 - lse2), A = g A1 + (1 - g) A2:
 *   dA1 = g dA,  dA2 = (1 - g) dA,  dlse1 = -dlse2 = g (1 - g) dA . (A1 - A2).
 * An empty first side (lse1 -inf, g 0) gets no gradient; when both are
 * empty the second takes dA (the merged A is 0 either way). */
void merge_states_backward(int d, const float *A1, float lse1, const float *A2, float lse2,
                           const float *dA, float *dA1, float *dlse1, float *dA2, float *dlse2) {
    float m = lse1 > lse2 ? lse1 : lse2;
    float g = m == -INFINITY ? 0.0f : expf(lse1 - m) / (expf(lse1 - m) + expf(lse2 - m));
    float dot = 0.0f;
    for (int c = 0; c < d; c++) {
        dA1[c] = g * dA[c];
        dA2[c] = (1.0f - g) * dA[c];
        dot += dA[c] * (A1[c] - A2[c]);
    }
    *dlse1 = g * (1.0f - g) * dot;
    *dlse2 = -*dlse1;
}

/* g = sigmoid(a_doc - lse_loc); out = g A_doc + (1 - g) A_loc */
void gate_merge(int d, const float *A_doc, float a_doc, const float *A_loc, float lse_loc, float *out) {
    float g = 1.0f / (1.0f + expf(lse_loc - a_doc));
    for (int c = 0; c < d; c++) out[c] = g * A_doc[c] + (1.0f - g) * A_loc[c];
}


/* ------------------------------------------------------------------------ */
/* Linear layers (the modules and the transformer both use them)            */

static inline float silu(float z) { return z / (1.0f + exp_fast(-z)); }

/* Y (N, n_out) = X (N, n_in) W^T + beta Y: W stored (n_out, n_in), as every
 * weight matrix here (beta 1 adds into Y, as the residual stream does). */
static void matmul(int N, int n_in, int n_out, const float *X, const float *W, float beta, float *Y) {
    gemm(CblasNoTrans, CblasTrans, N, n_out, n_in, 1.0f, X, n_in, W, n_in, beta, Y, n_out);
}

/* Y_i = X W_i^T for up to MAX_PRODUCTS weights that share the input X
 * (N, n_in), in one parallel loop (a decode step waits for its threads once
 * instead of once a product). */
typedef struct { const float *W; int n_out; float *Y; } Product;

static void matmuls(int N, int n_in, const float *X, int count, const Product *p) {
    GemmBatch b = {count, {{0}}, {0}};
    for (int i = 0; i < count; i++)
        b.g[i] = (Gemm){CblasNoTrans, CblasTrans, N, p[i].n_out, n_in, n_in, n_in, p[i].n_out, 1.0f, 0.0f, X, p[i].W,
                        p[i].Y, p[i].n_out};
    gemm_batch(&b);
}

/* dW += dY^T X for a linear layer Y = X W^T (W stored (n_out, n_in)), if dW. */
static void weight_grad(int ntok, int n_in, int n_out, const float *dY, const float *X, float *dW) {
    if (dW) gemm(CblasTrans, CblasNoTrans, n_out, n_in, ntok, 1.0f, dY, n_out, X, n_in, 1.0f, dW, n_in);
}

/* dX (+)= dY W for Y = X W^T; beta 0 overwrites, 1 adds. */
static void input_grad(int ntok, int n_in, int n_out, const float *dY, const float *W, float beta, float *dX) {
    gemm(CblasNoTrans, CblasNoTrans, ntok, n_in, n_out, 1.0f, dY, n_out, W, n_in, beta, dX, n_in);
}

/* out (N, n_out) = in (N, n_in) W^T + b: a linear layer, W stored (n_out, n_in). */
static void linear_forward(int N, int n_in, int n_out, const float *in, const float *W,
                           const float *b, float *out) {
    for (int r = 0; r < N; r++) memcpy(out + (size_t)r * n_out, b, n_out * sizeof(float));
    matmul(N, n_in, n_out, in, W, 1.0f, out);
}

/* Backward of out = in W^T + b: dW += dout^T in, db += sum_r dout_r,
 * din += dout W (din may be NULL). */
static void linear_backward(int N, int n_in, int n_out, const float *in, const float *W,
                            const float *dout, float *dW, float *db, float *din) {
    weight_grad(N, n_in, n_out, dout, in, dW);
    if (db) for (int r = 0; r < N; r++) for (int c = 0; c < n_out; c++) db[c] += dout[(size_t)r * n_out + c];
    if (din) input_grad(N, n_in, n_out, dout, W, 1.0f, din);
}

/* ------------------------------------------------------------------------ */
/* 2. Nectar modules                                                        */
/*
 * MLP, width w, input x = input_scale * q (N, d). Hidden layers are numbered
 * backbone [0, Db), score head [Db, Db+Ds), target head [Db+Ds, Db+Ds+Dt):
 *   first layer of a chain:  h = SiLU(Vq x + b)
 *   later layers:            h = SiLU(Vq x + U h_prev + b)   (query re-injected)
 * Both heads continue from the last backbone layer (or from x when Db = 0):
 *   a = ws . h_score + bs     (scalar)      A = Wt h_target + bt   (d)
 * Parameters of hidden layer i: Vq (w, d), U (w, w) when it has a previous
 * layer, b (w); then ws (in_s), bs (1), Wt (d, in_t), bt (d).
 *
 * Quadrature: W, Z (p, d); A = softmax(W q / sqrt d)^T Z and the score is
 * analytic, a = log sum_j exp(w_j . q / sqrt d): attention over p learned pairs.
 */

/* The hidden layer feeding layer i, or -1 when it starts from x. */
int mlp_prev(int i, int Db, int Ds) {
    if (i == 0) return -1;
    if (i == Db || i == Db + Ds) return Db > 0 ? Db - 1 : -1;  /* a head's first layer */
    return i - 1;
}

/* The hidden layer feeding the score (head 0) or target (head 1) output, or -1 for x. */
int mlp_head_input(int head, int Db, int Ds, int Dt) {
    int depth = head == 0 ? Ds : Dt;
    if (depth > 0) return head == 0 ? Db + Ds - 1 : Db + Ds + Dt - 1;
    return Db > 0 ? Db - 1 : -1;
}

/* Points views at a module's parameter (or gradient) block. */
size_t mlp_layout(int d, int w, int Db, int Ds, int Dt, float *base, MlpParams *p) {
    size_t off = 0;
    for (int i = 0; i < Db + Ds + Dt; i++) {
        p->Vq[i] = base + off; off += (size_t)w * d;
        p->U[i] = mlp_prev(i, Db, Ds) >= 0 ? base + off : NULL;
        if (p->U[i]) off += (size_t)w * w;
        p->b[i] = base + off; off += w;
    }
    int in_s = mlp_head_input(0, Db, Ds, Dt) >= 0 ? w : d;
    int in_t = mlp_head_input(1, Db, Ds, Dt) >= 0 ? w : d;
    p->ws = base + off; off += in_s;
    p->bs = base + off; off += 1;
    p->Wt = base + off; off += (size_t)d * in_t;
    p->bt = base + off; off += d;
    return off;
}

size_t mlp_param_count(int d, int w, int Db, int Ds, int Dt) {
    MlpParams p;
    return mlp_layout(d, w, Db, Ds, Dt, NULL, &p);
}

int mlp_width_for_budget(int d, long budget, int Db, int Ds, int Dt) {
    int w = 0;
    while ((long)mlp_param_count(d, w + 1, Db, Ds, Dt) <= budget) w++;
    return w;
}

/* floor(x) for a budget given in decimal, where x may fall just below the
 * integer meant: 0.53 is stored as 0.52999997, and 0.53 x 200 must give 106 */
static long budget_floor(double x) {
    double nearest = round(x);
    return (long)(fabs(x - nearest) <= 1e-6 * x ? nearest : floor(x));
}

int module_size_for_budget(ModuleArch arch, int d, double rho_n, int Db, int Ds, int Dt) {
    if (arch == ARCH_MLP) return mlp_width_for_budget(d, budget_floor(rho_n * 2.0 * d), Db, Ds, Dt);
    return (int)budget_floor(rho_n);
}

size_t module_param_count(const ModuleSet *s, int size) {
    if (s->arch == ARCH_MLP)
        return mlp_param_count(s->head_size, size, s->depth_backbone, s->depth_score, s->depth_target);
    return 2 * (size_t)size * s->head_size;  /* W, Z */
}

int depths_valid(int Db, int Ds, int Dt) {
    /* each one bounded before the sum, which could overflow */
    return Db >= 0 && Ds >= 0 && Dt >= 0 && Db <= MAX_HIDDEN && Ds <= MAX_HIDDEN && Dt <= MAX_HIDDEN &&
           Db + Ds + Dt <= MAX_HIDDEN;
}

int moduleset_alloc(ModuleSet *s, ModuleArch arch, int L, int G, int d,
                    int Db, int Ds, int Dt, const int *size_per_layer, int with_grads) {
    memset(s, 0, sizeof(*s));
    if (arch == ARCH_MLP && !depths_valid(Db, Ds, Dt)) {
        fprintf(stderr, "error: MLP depths (%d, %d, %d) must be >= 0 and sum to at most %d\n",
                Db, Ds, Dt, MAX_HIDDEN);
        return -1;
    }
    s->arch = arch;
    s->n_layers = L; s->n_kv_heads = G; s->head_size = d;
    s->depth_backbone = Db; s->depth_score = Ds; s->depth_target = Dt;
    s->modules = xmalloc((size_t)L * G * sizeof(Module));
    for (int l = 0; l < L; l++) {
        if (size_per_layer[l] < 1) {
            fprintf(stderr, "error: layer %d gets a module of size %d; the budget is too small "
                    "for even one %s\n", l, size_per_layer[l], arch == ARCH_MLP ? "hidden unit" : "pair");
            moduleset_free(s);
            return -1;
        }
        for (int g = 0; g < G; g++) {
            Module *mod = &s->modules[l * G + g];
            mod->width = arch == ARCH_MLP ? size_per_layer[l] : 0;
            mod->n_pairs = arch == ARCH_QUAD ? size_per_layer[l] : 0;
            mod->input_scale = 1.0f;
            mod->n_params = module_param_count(s, size_per_layer[l]);
            s->n_params += mod->n_params;
        }
    }
    s->params = xmalloc(s->n_params * sizeof(float));
    if (with_grads) s->grads = xmalloc(s->n_params * sizeof(float));
    size_t off = 0;
    for (int i = 0; i < L * G; i++) {
        s->modules[i].params = s->params + off;
        s->modules[i].grads = with_grads ? s->grads + off : NULL;
        off += s->modules[i].n_params;
    }
    return 0;
}

void moduleset_free(ModuleSet *s) {
    free(s->modules); free(s->params); free(s->grads);
    promptset_free(&s->heldout);
    memset(s, 0, sizeof(*s));
}

int promptset_max_len(const PromptSet *p) {
    int max_len = 1;
    for (int i = 0; i < p->n_prompts; i++)
        if (p->offsets[i + 1] - p->offsets[i] > max_len) max_len = p->offsets[i + 1] - p->offsets[i];
    return max_len;
}

void promptset_free(PromptSet *p) {
    free(p->offsets); free(p->tokens); free(p->split); free(p->question_len); free(p->nodoc_prefix);
    memset(p, 0, sizeof(*p));
}


void modulework_shape(ModuleWork *w, const ModuleSet *s, int max_q) {
    memset(w, 0, sizeof(*w));
    w->max_q = max_q;
    w->n_hidden = s->arch == ARCH_MLP ? s->depth_backbone + s->depth_score + s->depth_target : 0;
    for (int i = 0; i < s->n_layers * s->n_kv_heads; i++) {
        if (s->modules[i].width > w->max_width) w->max_width = s->modules[i].width;
        if (s->modules[i].n_pairs > w->max_pairs) w->max_pairs = s->modules[i].n_pairs;
    }
}

/* The buffers of a shaped w, for queries of head size d. */
static void modulework_alloc_shaped(ModuleWork *w, int d_head) {
    size_t N = w->max_q, d = d_head, hidden = (size_t)w->n_hidden * N * w->max_width;
    w->x = xmalloc(N * d * sizeof(float));
    w->dx = xmalloc(N * d * sizeof(float));
    w->pre = xmalloc(hidden * sizeof(float));
    w->hid = xmalloc(hidden * sizeof(float));
    w->dhid = xmalloc(hidden * sizeof(float));
    w->probs = xmalloc(N * w->max_pairs * sizeof(float));
    w->tmp = xmalloc(N * w->max_pairs * sizeof(float));
}

void modulework_alloc(ModuleWork *w, const ModuleSet *s, int max_q) {
    modulework_shape(w, s, max_q);
    modulework_alloc_shaped(w, s->head_size);
}

/* Scratch for the modules of every Nectar document of a composition: the
 * largest of each count. */
static void modulework_alloc_documents(ModuleWork *w, const Document *doc, int max_q) {
    ModuleWork one;
    int d = 0;
    memset(w, 0, sizeof(*w));
    w->max_q = max_q;
    for (; doc; doc = doc->next) {
        if (doc->mode != DOC_NECTAR) continue;
        modulework_shape(&one, doc->modules, max_q);
        if (one.max_width > w->max_width) w->max_width = one.max_width;
        if (one.max_pairs > w->max_pairs) w->max_pairs = one.max_pairs;
        if (one.n_hidden > w->n_hidden) w->n_hidden = one.n_hidden;
        d = doc->modules->head_size;
    }
    modulework_alloc_shaped(w, d);
}

void modulework_free(ModuleWork *w) {
    free(w->x); free(w->dx); free(w->pre); free(w->hid); free(w->dhid); free(w->probs); free(w->tmp);
    memset(w, 0, sizeof(*w));
}

void mlp_init(ModuleSet *s, uint64_t seed, const float *mean_a, const float *mean_A) {
    int d = s->head_size, Db = s->depth_backbone, Ds = s->depth_score, Dt = s->depth_target;
    uint64_t rng = seed ? seed : 1;
    for (int i = 0; i < s->n_layers * s->n_kv_heads; i++) {
        Module *mod = &s->modules[i];
        int w = mod->width;
        memset(mod->params, 0, mod->n_params * sizeof(float));
        MlpParams p;
        mlp_layout(d, w, Db, Ds, Dt, mod->params, &p);
        for (int k = 0; k < Db + Ds + Dt; k++) {
            /* Vq x + U h: fan-in d (+ w); N(0, 1/fan_in) keeps pre-activations O(1) */
            float std = 1.0f / sqrtf((float)(d + (p.U[k] ? w : 0)));
            for (size_t j = 0; j < (size_t)w * d; j++) p.Vq[k][j] = std * rng_normal(&rng);
            if (p.U[k]) for (size_t j = 0; j < (size_t)w * w; j++) p.U[k][j] = std * rng_normal(&rng);
        }
        /* output layers start at zero, biases at the training means: the
         * untrained module predicts the mean state */
        p.bs[0] = mean_a ? mean_a[i] : 0.0f;
        for (int c = 0; c < d; c++) p.bt[c] = mean_A ? mean_A[(size_t)i * d + c] : 0.0f;
    }
}

void quad_init_from_cache(ModuleSet *s, const DocCache *doc) {
    int d = s->head_size, G = s->n_kv_heads;
    for (int l = 0; l < s->n_layers; l++)
        for (int g = 0; g < G; g++) {
            Module *mod = &s->modules[l * G + g];
            float *W = mod->params, *Z = mod->params + (size_t)mod->n_pairs * d;
            for (int j = 0; j < mod->n_pairs; j++) {
                size_t src = (((size_t)l * G + g) * doc->n + j) * d;  /* (L, G, n, d) */
                memcpy(W + (size_t)j * d, doc->key + src, d * sizeof(float));
                memcpy(Z + (size_t)j * d, doc->value + src, d * sizeof(float));
            }
        }
}

void module_forward(const ModuleSet *s, const Module *mod, ModuleWork *w,
                    const float *q, int N, float *a, float *A) {
    int d = s->head_size;
    if (s->arch == ARCH_QUAD) {
        const float *W = mod->params, *Z = mod->params + (size_t)mod->n_pairs * d;
        attention_states(N, mod->n_pairs, d, q, d, W, Z, d, mod->n_pairs, A, d, a, 1, w->probs);
        return;
    }
    int Db = s->depth_backbone, Ds = s->depth_score, Dt = s->depth_target, width = mod->width;
    MlpParams p;
    mlp_layout(d, width, Db, Ds, Dt, mod->params, &p);
    size_t layer_size = (size_t)N * width;
    for (size_t j = 0; j < (size_t)N * d; j++) w->x[j] = mod->input_scale * q[j];
    for (int i = 0; i < Db + Ds + Dt; i++) {
        float *pre = w->pre + i * layer_size, *hid = w->hid + i * layer_size;
        int prev = mlp_prev(i, Db, Ds);
        linear_forward(N, d, width, w->x, p.Vq[i], p.b[i], pre);       /* Vq x + b */
        if (prev >= 0) matmul(N, width, width, w->hid + prev * layer_size, p.U[i], 1.0f, pre);  /* + U h_prev */
        #pragma omp simd
        for (size_t j = 0; j < layer_size; j++) hid[j] = silu(pre[j]);  /* h = SiLU(pre) */
    }
    int hs = mlp_head_input(0, Db, Ds, Dt), ht = mlp_head_input(1, Db, Ds, Dt);
    const float *in_s = hs >= 0 ? w->hid + hs * layer_size : w->x;
    const float *in_t = ht >= 0 ? w->hid + ht * layer_size : w->x;
    linear_forward(N, hs >= 0 ? width : d, 1, in_s, p.ws, p.bs, a);   /* a = ws . h + bs */
    linear_forward(N, ht >= 0 ? width : d, d, in_t, p.Wt, p.bt, A);   /* A = Wt h + bt */
}

void module_backward(const ModuleSet *s, const Module *mod, ModuleWork *w,
                     const float *q, int N, const float *A, const float *da, const float *dA, float *dq) {
    int d = s->head_size;
    if (s->arch == ARCH_QUAD) {
        const float *W = mod->params, *Z = mod->params + (size_t)mod->n_pairs * d;
        float *dW = mod->grads, *dZ = mod->grads + (size_t)mod->n_pairs * d;
        if (dq) memset(dq, 0, (size_t)N * d * sizeof(float));
        attention_states_backward(N, mod->n_pairs, d, q, d, W, Z, d, A, dA, d, da, 1, w->probs,
                                  dq, dW, dZ, w->tmp);
        return;
    }
    int Db = s->depth_backbone, Ds = s->depth_score, Dt = s->depth_target, width = mod->width;
    MlpParams p, g;
    mlp_layout(d, width, Db, Ds, Dt, mod->params, &p);
    mlp_layout(d, width, Db, Ds, Dt, mod->grads, &g);
    size_t layer_size = (size_t)N * width;
    int n_hidden = Db + Ds + Dt;
    memset(w->dhid, 0, n_hidden * layer_size * sizeof(float));
    memset(w->dx, 0, (size_t)N * d * sizeof(float));
    /* outputs: a = ws . h_s + bs and A = Wt h_t + bt */
    int hs = mlp_head_input(0, Db, Ds, Dt), ht = mlp_head_input(1, Db, Ds, Dt);
    linear_backward(N, hs >= 0 ? width : d, 1, hs >= 0 ? w->hid + hs * layer_size : w->x, p.ws,
                    da, g.ws, g.bs, hs >= 0 ? w->dhid + hs * layer_size : w->dx);
    linear_backward(N, ht >= 0 ? width : d, d, ht >= 0 ? w->hid + ht * layer_size : w->x, p.Wt,
                    dA, g.Wt, g.bt, ht >= 0 ? w->dhid + ht * layer_size : w->dx);
    /* hidden layers, last first (a layer's input always has a smaller index):
     * h = SiLU(pre), pre = Vq x + U h_prev + b */
    for (int i = n_hidden - 1; i >= 0; i--) {
        float *pre = w->pre + i * layer_size, *dpre = w->dhid + i * layer_size;
        #pragma omp simd
        for (size_t j = 0; j < layer_size; j++) {  /* SiLU'(z) = s(z) (1 + z (1 - s(z))) */
            float sg = 1.0f / (1.0f + exp_fast(-pre[j]));
            dpre[j] *= sg * (1.0f + pre[j] * (1.0f - sg));
        }
        linear_backward(N, d, width, w->x, p.Vq[i], dpre, g.Vq[i], g.b[i], w->dx);
        int prev = mlp_prev(i, Db, Ds);
        if (prev >= 0)
            linear_backward(N, width, width, w->hid + prev * layer_size, p.U[i], dpre, g.U[i], NULL,
                            w->dhid + prev * layer_size);
    }
    if (dq)  /* x = input_scale q */
        for (size_t j = 0; j < (size_t)N * d; j++) dq[j] = mod->input_scale * w->dx[j];
}


/* ------------------------------------------------------------------------ */
/* 3. Losses and the fitting step                                           */

/* Round to nearest, ties to even: add 0x7FFF plus the lowest bit kept,
 * then drop the low 16 bits (a carry into the exponent is the right
 * rounding too, up to infinity). A NaN stays a (quiet) NaN. */
uint16_t bf16_from_float(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

float float_from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

void fitbatch_alloc(FitBatch *b, const ModuleSet *s, int n_heads, int B) {
    size_t G = s->n_kv_heads, N = (size_t)B * (n_heads / s->n_kv_heads), d = s->head_size;
    memset(b, 0, sizeof(*b));
    b->B = B;
    b->N = (int)N;
    b->pos = xmalloc(B * sizeof(long));
    float **rows[] = {&b->a, &b->alpha_t, &b->da}, **vecs[] = {&b->q, &b->A, &b->A_t, &b->dA};
    for (int i = 0; i < 3; i++) *rows[i] = xmalloc(G * N * sizeof(float));      /* (G, N) */
    for (int i = 0; i < 4; i++) *vecs[i] = xmalloc(G * N * d * sizeof(float));  /* (G, N, d) */
}

void fitbatch_free(FitBatch *b) {
    free(b->pos); free(b->q); free(b->a); free(b->A); free(b->alpha_t); free(b->A_t); free(b->da); free(b->dA);
    memset(b, 0, sizeof(*b));
}

double regression_grads(ModuleSet *s, ModuleWork *w, FitBatch *b, const FitTargets *t, int n_heads,
                        float lambda_alpha, float lambda_A) {
    int L = s->n_layers, G = s->n_kv_heads, d = s->head_size, H = n_heads, D = H * d, group = H / G, N = b->N;
    double loss = 0;
    for (int l = 0; l < L; l++) {
        /* gather: row (g, bi group + j) is head g group + j at position pos[bi] */
        for (int g = 0; g < G; g++)
            for (int bi = 0; bi < b->B; bi++)
                for (int j = 0; j < group; j++) {
                    size_t row = (size_t)g * N + bi * group + j, at = (size_t)l * t->P + b->pos[bi];
                    int h = g * group + j;
                    for (int k = 0; k < d; k++) {
                        b->q[row * d + k] = float_from_bf16(t->q[at * D + (size_t)h * d + k]);
                        b->A_t[row * d + k] = float_from_bf16(t->A[at * D + (size_t)h * d + k]);
                    }
                    b->alpha_t[row] = t->alpha[at * H + h];
                }
        for (int g = 0; g < G; g++) {
            Module *mod = &s->modules[l * G + g];
            size_t first = (size_t)g * N;
            module_forward(s, mod, w, b->q + first * d, N, b->a + first, b->A + first * d);
            /* L = lambda_alpha mean (a - alpha)^2 + lambda_A mean ||A_theta - A||^2 */
            for (size_t row = first; row < first + N; row++) {
                float ea = b->a[row] - b->alpha_t[row];
                loss += lambda_alpha * ea * ea / N;
                b->da[row] = 2.0f * lambda_alpha * ea / N;
                for (int k = 0; k < d; k++) {
                    float e = b->A[row * d + k] - b->A_t[row * d + k];
                    loss += lambda_A * e * e / N;
                    b->dA[row * d + k] = 2.0f * lambda_A * e / N;
                }
            }
            module_backward(s, mod, w, b->q + first * d, N, b->A + first * d, b->da + first, b->dA + first * d, NULL);
        }
    }
    return loss;
}

void log_softmax(const float *x, int n, double *out) {
    double max = x[argmax(x, n)], sum = 0;
    for (int i = 0; i < n; i++) sum += exp(x[i] - max);
    double lse = max + log(sum);
    for (int i = 0; i < n; i++) out[i] = x[i] - lse;
}

double kl_divergence(const double *logp, const double *logq, int n) {
    double kl = 0;
    for (int i = 0; i < n; i++) kl += exp(logp[i]) * (logp[i] - logq[i]);
    return kl;
}

double kl_loss(const float *teacher_logits, const float *student_logits, int ntok, int V, float *dlogits) {
    double *lp = xmalloc(V * sizeof(double)), *lq = xmalloc(V * sizeof(double)), total = 0;
    for (int t = 0; t < ntok; t++) {
        log_softmax(teacher_logits + (size_t)t * V, V, lp);
        log_softmax(student_logits + (size_t)t * V, V, lq);
        total += kl_divergence(lp, lq, V);
        /* d KL(p || softmax(z)) / dz = softmax(z) - p, averaged over positions */
        if (dlogits)
            for (int i = 0; i < V; i++) dlogits[(size_t)t * V + i] = (float)((exp(lq[i]) - exp(lp[i])) / ntok);
    }
    free(lp); free(lq);
    return total / ntok;
}

/* 1 if token i ranks below token j: a smaller log-probability, or the
 * same and a larger id. */
static int ranks_below(const double *lp, int i, int j) { return lp[i] < lp[j] || (lp[i] == lp[j] && i > j); }

/* Restores the min-heap (the lowest-ranked token at the root) of n ids
 * below position at. */
static void sift_down(const double *lp, int *heap, int n, int at) {
    for (int child; (child = 2 * at + 1) < n; at = child) {
        if (child + 1 < n && ranks_below(lp, heap[child + 1], heap[child])) child++;
        if (!ranks_below(lp, heap[child], heap[at])) return;
        int t = heap[at]; heap[at] = heap[child]; heap[child] = t;
    }
}

void top_k_logprobs(const float *logits, int V, int k, int *ids, float *logp, float *log_rest) {
    double *lp = xmalloc(V * sizeof(double));
    log_softmax(logits, V, lp);
    /* the k highest-ranked tokens in a min-heap (O(V log k)), then taken out lowest first */
    for (int i = 0; i < k; i++) ids[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(lp, ids, k, i);
    for (int j = k; j < V; j++)
        if (ranks_below(lp, ids[0], j)) { ids[0] = j; sift_down(lp, ids, k, 0); }
    for (int n = k; n > 1; n--) {
        int t = ids[0]; ids[0] = ids[n - 1]; ids[n - 1] = t;
        sift_down(lp, ids, n - 1, 0);
    }
    /* log sum_{j not kept} p_j, from its largest term: the kept ones set to log 0 first */
    for (int r = 0; r < k; r++) { logp[r] = (float)lp[ids[r]]; lp[ids[r]] = -INFINITY; }
    double rest = 0, largest = -INFINITY;
    for (int j = 0; j < V; j++) if (lp[j] > largest) largest = lp[j];
    for (int j = 0; j < V && k < V; j++) rest += exp(lp[j] - largest);
    *log_rest = k < V ? (float)(largest + log(rest)) : -INFINITY;
    free(lp);
}

double kl_loss_top_k(const int *ids, const float *logp, const float *log_rest, int k, const float *student_logits,
                     int ntok, int V, float *dlogits) {
    double *lq = xmalloc(V * sizeof(double)), total = 0;
    unsigned char *kept = xmalloc(V);
    for (int t = 0; t < ntok; t++) {
        const int *id = ids + (size_t)t * k;
        const float *lp = logp + (size_t)t * k;
        log_softmax(student_logits + (size_t)t * V, V, lq);
        memset(kept, 0, V);
        for (int r = 0; r < k; r++) kept[id[r]] = 1;
        /* the rest's mass for the student, q_rest = sum_{j not kept} q_j, summed directly (no 1 - sum) */
        double q_rest = 0, p_rest = exp((double)log_rest[t]);
        for (int j = 0; j < V; j++) if (!kept[j]) q_rest += exp(lq[j]);
        /* KL = sum_{i kept} p_i (log p_i - log q_i) + p_rest (log p_rest - log q_rest) */
        for (int r = 0; r < k; r++) total += exp(lp[r]) * (lp[r] - lq[id[r]]);
        if (p_rest > 0) total += p_rest * (log_rest[t] - log(q_rest));
        /* d KL / dz_j = q_j - p_j (j kept), q_j - p_rest q_j / q_rest (j in the rest): averaged over positions */
        if (!dlogits) continue;
        float *g = dlogits + (size_t)t * V;
        double rest_scale = p_rest > 0 ? 1 - p_rest / q_rest : 1;
        for (int j = 0; j < V; j++) g[j] = (float)(exp(lq[j]) * (kept[j] ? 1 : rest_scale) / ntok);
        for (int r = 0; r < k; r++) g[id[r]] -= (float)(exp(lp[r]) / ntok);
    }
    free(lq); free(kept);
    return total / ntok;
}

double clip_grad_norm(float *grads, size_t n, double max_norm) {
    double norm = 0;
    for (size_t i = 0; i < n; i++) norm += (double)grads[i] * grads[i];
    norm = sqrt(norm);
    if (norm > max_norm) for (size_t i = 0; i < n; i++) grads[i] *= (float)(max_norm / norm);
    return norm;
}

void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, int step, float lr, float wd,
                  float beta2) {
    const float b1 = ADAM_BETA1, b2 = beta2, eps = ADAM_EPS;
    float c1 = 1.0f - powf(b1, step), c2 = 1.0f - powf(b2, step);
    for (size_t i = 0; i < n; i++) {
        float g = grads[i];
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        params[i] -= lr * ((m[i] / c1) / (sqrtf(v[i] / c2) + eps) + wd * params[i]);
    }
}


/* ------------------------------------------------------------------------ */
/* 4. The transformer: forward pass                                         */

/* The model's weights in one block, in llama2.c's file order without the
 * RoPE tables its checkpoints carry (forward computes the angles): each
 * tensor's count of floats, and views into the block. */
enum { N_TENSORS = 12 };
static void tensor_counts(const Config *c, int shared, size_t count[N_TENSORS]) {
    size_t D = c->dim, F = c->hidden_dim, L = c->n_layers, V = c->vocab_size;
    size_t KVD = D / c->n_heads * c->n_kv_heads;
    size_t list[N_TENSORS] = {V * D, L * D, L * D * D, L * KVD * D, L * KVD * D, L * D * D,
                              L * D, L * F * D, L * D * F, L * F * D, D, shared ? 0 : V * D};
    memcpy(count, list, sizeof list);
}

size_t model_param_count(const Config *c, int shared) {
    size_t count[N_TENSORS], n = 0;
    tensor_counts(c, shared, count);
    for (int i = 0; i < N_TENSORS; i++) n += count[i];
    return n;
}

void weights_view(const Config *c, int shared, float *base, Weights *w) {
    size_t count[N_TENSORS];
    tensor_counts(c, shared, count);
    float **views[N_TENSORS] = {&w->token_embedding, &w->rms_att, &w->wq, &w->wk, &w->wv, &w->wo,
                                &w->rms_ffn, &w->w1, &w->w2, &w->w3, &w->rms_final, &w->wcls};
    float *p = base;
    for (int i = 0; i < N_TENSORS; i++) { *views[i] = p; p += count[i]; }
    if (shared) w->wcls = w->token_embedding;
}

int config_check(const Config *c, const char *what) {
    const int limit = 1 << 24;
    int dims[7] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads,
                             c->n_kv_heads, c->vocab_size, c->seq_len};
    static const char *names[7] = {"dim", "hidden_dim", "n_layers", "n_heads",
                                            "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++)
        if (dims[i] <= 0 || dims[i] > limit) {
            fprintf(stderr, "error: %s: %s = %d is out of range (1..%d)\n", what, names[i], dims[i], limit);
            return -1;
        }
    double D = c->dim, F = c->hidden_dim, L = c->n_layers, V = c->vocab_size, T = c->seq_len;
    double floats = V * D * 2 + L * (4 * D * D + 3 * D * F + 2 * D) + T * D + D;
    if (floats > 1e11) {  /* also keeps every size_t product below well within range */
        fprintf(stderr, "error: %s: a model of these dimensions (about %.3g floats) is beyond what this code loads\n",
                what, floats);
        return -1;
    }
    if (c->dim % c->n_heads != 0) {
        fprintf(stderr, "error: %s: dim %d is not a multiple of n_heads %d\n", what, c->dim, c->n_heads);
        return -1;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        fprintf(stderr, "error: %s: n_heads %d is not a multiple of n_kv_heads %d\n", what, c->n_heads, c->n_kv_heads);
        return -1;
    }
    if ((c->dim / c->n_heads) % 2 != 0) {
        fprintf(stderr, "error: %s: head size %d is odd; RoPE needs it even\n", what, c->dim / c->n_heads);
        return -1;
    }
    if (!(c->rope_theta > 1.0f && isfinite(c->rope_theta)) || !(c->norm_eps > 0.0f && c->norm_eps < 1.0f)) {
        fprintf(stderr, "error: %s: RoPE base %g or RMSNorm epsilon %g is out of range (base > 1, 0 < eps < 1)\n",
                what, c->rope_theta, c->norm_eps);
        return -1;
    }
    return 0;
}

void model_refresh(Model *m) {
    weights_view(&m->config, m->shared_classifier, m->params, &m->w);
    uint64_t h = fnv1a(FNV_OFFSET, &m->config, sizeof(Config));
    h = fnv1a(h, &m->shared_classifier, sizeof(int));
    m->fingerprint = fnv1a(h, m->params, m->n_params * sizeof(float));
}

int model_init_random(Model *m, Config c, int shared, uint64_t seed, float std) {
    memset(m, 0, sizeof(*m));
    if (config_check(&c, "random model") != 0) return -1;
    m->config = c;
    m->shared_classifier = shared;
    m->n_params = model_param_count(&c, shared);
    m->params = xmalloc(m->n_params * sizeof(float));
    model_refresh(m);
    uint64_t rng = seed ? seed : 1;
    for (size_t i = 0; i < m->n_params; i++) m->params[i] = std * rng_normal(&rng);
    size_t LD = (size_t)c.n_layers * c.dim;
    for (size_t i = 0; i < LD; i++) m->w.rms_att[i] = m->w.rms_ffn[i] = 1.0f;
    for (int i = 0; i < c.dim; i++) m->w.rms_final[i] = 1.0f;
    model_refresh(m);
    return 0;
}

void model_free(Model *m) {
    free(m->params);
    memset(m, 0, sizeof(*m));
}

int check_tokens(const Model *m, const int *tokens, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->config.vocab_size) {
            fprintf(stderr, "error: %s: token id %d at position %d is outside the vocabulary [0, %d)\n",
                    what, tokens[i], i, m->config.vocab_size);
            return -1;
        }
    return 0;
}

const Document NO_DOCUMENT = {DOC_EXACT, 0, NULL, NULL, NULL};

int document_length(const Document *doc) {
    int n = 0;
    for (; doc; doc = doc->next) n += doc->n;
    return n;
}

int document_count(const Document *doc) {
    int count = 0;
    for (; doc; doc = doc->next) count++;
    return count;
}

/* The table of every buffer: shapes as in nectar.h. */
static int forward_buffers(RunState *s, const Config *c, RunBuffer *t) {
    size_t B = s->max_block, D = c->dim, F = c->hidden_dim, H = c->n_heads, L = c->n_layers;
    size_t KVD = (size_t)c->dim / c->n_heads * c->n_kv_heads, C = s->capacity, S = s->n_seqs;
    size_t group = c->n_heads / c->n_kv_heads, doc_keys = group * s->max_doc;
    size_t keys = doc_keys > C ? doc_keys : C;  /* a KV group's B * group queries over n keys, or a head's local keys */
    size_t M = s->with_modules || s->max_doc > 0, chunks = (s->max_doc + DOC_CHUNK_KEYS - 1) / DOC_CHUNK_KEYS;
    RunBuffer list[] = {
        {&s->x, B * D}, {&s->xb, B * D}, {&s->q, B * D}, {&s->k, B * KVD}, {&s->v, B * KVD},
        {&s->att, B * D}, {&s->doc_A, B * D}, {&s->doc_lse, B * H}, {&s->loc_A, B * D}, {&s->loc_lse, B * H},
        {&s->tile_A, B * D}, {&s->tile_lse, B * H},
        {&s->rope, B * (D / H)}, {&s->rope_doc, D / H}, {&s->x_mid, B * D}, {&s->xb2, B * D}, {&s->hb, B * F}, {&s->hb2, B * F}, {&s->hgate, B * F},
        {&s->scores, B * keys}, {&s->logits, B * c->vocab_size},
        {&s->key_cache, L * S * C * KVD}, {&s->value_cache, L * S * C * KVD},
        {&s->mq, M * B * D}, {&s->ma, M * B * H}, {&s->mA, M * B * D},
        {&s->chunk_A, chunks * B * D}, {&s->chunk_lse, chunks * B * H},
    };
    memcpy(t, list, sizeof list);
    return (int)(sizeof list / sizeof list[0]);
}

static int tap_buffers(RunState *s, const Config *c, RunBuffer *t) {
    size_t rows = (size_t)c->n_layers * s->max_block;
    RunBuffer list[] = {{&s->taps.q, rows * c->dim}, {&s->taps.doc_A, rows * c->dim},
                        {&s->taps.doc_lse, rows * c->n_heads}};
    memcpy(t, list, sizeof list);
    return (int)(sizeof list / sizeof list[0]);
}

static int backward_buffers(RunState *s, const Config *c, RunBuffer *t) {
    BackwardBuffers *b = &s->back;
    size_t B = s->max_block, D = c->dim, F = c->hidden_dim, H = c->n_heads, L = c->n_layers;
    size_t KVD = (size_t)c->dim / c->n_heads * c->n_kv_heads;
    size_t keys = s->max_doc > s->capacity ? s->max_doc : s->capacity;
    RunBuffer list[] = {
        {&b->saved_x, (L + 1) * B * D},
        {&b->dx, B * D}, {&b->dx_mid, B * D}, {&b->dxb, B * D}, {&b->dq, B * D}, {&b->datt, B * D},
        {&b->dk, B * KVD}, {&b->dv, B * KVD}, {&b->dhb, B * F}, {&b->dhb2, B * F}, {&b->dhgate, B * F},
        {&b->ddoc_A, B * D}, {&b->dloc_A, B * D}, {&b->ddoc_lse, B * H}, {&b->dloc_lse, B * H},
        {&b->dmq, B * D}, {&b->dmA, B * D}, {&b->dma, B * H}, {&b->tmp, B * keys},
    };
    memcpy(t, list, sizeof list);
    return (int)(sizeof list / sizeof list[0]);
}

int runstate_buffers(RunState *s, const Config *c, BufferGroup group, RunBuffer table[MAX_RUN_BUFFERS]) {
    if (group == BUFFERS_FORWARD) return forward_buffers(s, c, table);
    if (group == BUFFERS_TAPS) return tap_buffers(s, c, table);
    return backward_buffers(s, c, table);
}

static void alloc_buffers(RunState *s, const Config *c, BufferGroup group) {
    RunBuffer table[MAX_RUN_BUFFERS];
    int n = runstate_buffers(s, c, group, table);
    for (int i = 0; i < n; i++) *table[i].buf = table[i].floats ? xmalloc(table[i].floats * sizeof(float)) : NULL;
}

void runstate_alloc(RunState *s, const Model *m, const Document *doc, int max_block, int capacity) {
    runstate_alloc_seqs(s, m, doc, max_block, capacity, 1);
}

void runstate_alloc_seqs(RunState *s, const Model *m, const Document *doc, int max_block, int capacity, int n_seqs) {
    memset(s, 0, sizeof(*s));
    const Config *c = &m->config;
    s->max_block = max_block;
    s->capacity = capacity;
    s->n_seqs = n_seqs;
    for (const Document *part = doc; part; part = part->next) {  /* the longest cache, and any modules */
        if (part->mode == DOC_EXACT && part->cache && part->cache->n > s->max_doc) s->max_doc = part->cache->n;
        if (part->mode == DOC_NECTAR) s->with_modules = 1;
    }
    alloc_buffers(s, c, BUFFERS_FORWARD);
    if (s->with_modules) modulework_alloc_documents(&s->work, doc, max_block * (c->n_heads / c->n_kv_heads));
}

void runstate_enable_taps(RunState *s, const Model *m) { alloc_buffers(s, &m->config, BUFFERS_TAPS); }

void runstate_enable_backward(RunState *s, const Model *m) { alloc_buffers(s, &m->config, BUFFERS_BACKWARD); }

/* The buffer table's pointers do not depend on the model's sizes. */
void runstate_free(RunState *s) {
    static const Config any = {1, 1, 1, 1, 1, 1, 1, 1.0f, 1.0f};
    RunBuffer table[MAX_RUN_BUFFERS];
    for (BufferGroup g = BUFFERS_FORWARD; g <= BUFFERS_BACKWARD; g++) {
        int n = runstate_buffers(s, &any, g, table);
        for (int i = 0; i < n; i++) free(*table[i].buf);
    }
    modulework_free(&s->work);
    memset(s, 0, sizeof(*s));
}

/* o = w * x * r,  r = 1 / sqrt(mean(x^2) + eps) */
static void rmsnorm(float *o, const float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    ss = 1.0f / sqrtf(ss / n + eps);
    for (int i = 0; i < n; i++) o[i] = w[i] * (ss * x[i]);
}

/* Backward of o = w * x * r:
 *   dx_j += r w_j do_j - (r^3 / n) x_j sum_i w_i do_i x_i,   dw_i += do_i x_i r */
static void rmsnorm_backward(float *dx, float *dw, const float *x, const float *w, const float *dout, int n,
                             float eps) {
    float ss = 0.0f, dot = 0.0f;
    for (int i = 0; i < n; i++) { ss += x[i] * x[i]; dot += w[i] * dout[i] * x[i]; }
    float r = 1.0f / sqrtf(ss / n + eps), c = r * r * r / n * dot;
    for (int i = 0; i < n; i++) {
        dx[i] += r * w[i] * dout[i] - c * x[i];
        if (dw) dw[i] += dout[i] * x[i] * r;
    }
}

/* RoPE, llama2.c convention: each adjacent pair (v_i, v_i+1) of a head is
 * rotated by the angle pos * theta^(-(i mod d) / d) (theta: 10000 in llama2.c,
 * the file's rope.freq_base in a GGUF). The angles of a block's rows are
 * the same in every layer: rope_angles computes their cosines and sines
 * once a forward, cs (ntok, d) holding (cos, sin) of pair i at 2 (i / 2). */
static void rope_angles(float *cs, int ntok, int first_position, int head_size, float theta) {
    for (int t = 0; t < ntok; t++)
        for (int i = 0; i < head_size; i += 2) {  /* one angle per pair index, shared by every head */
            float freq = 1.0f / powf(theta, i / (float)head_size), angle = (first_position + t) * freq;
            cs[(size_t)t * head_size + i] = cosf(angle);
            cs[(size_t)t * head_size + i + 1] = sinf(angle);
        }
}

/* Rotates every pair of vec (n, a multiple of the head size) by its angle
 * (cs: one row of rope_angles); direction -1 rotates back: the backward of
 * the rotation. */
static void rope(float *vec, int n, int head_size, const float *cs, float direction) {
    for (int i = 0; i < head_size; i += 2) {
        float fcr = cs[i], fci = direction * cs[i + 1];
        for (int j = i; j < n; j += head_size) {
            float v0 = vec[j], v1 = vec[j + 1];
            vec[j] = v0 * fcr - v1 * fci;
            vec[j + 1] = v0 * fci + v1 * fcr;
        }
    }
}

/* A block's queries in chunks of LOCAL_ROWS rows, one chunk a task; its
 * keys in tiles of LOCAL_KEYS, whose states merge: a tile's scores (64 x
 * 512 floats, 128 KB) stay in L2 while OpenBLAS zeroes and fills them and
 * the softmax and P V read them (with the 8K keys of a long prefill's last
 * blocks at once they did not). */
enum { LOCAL_ROWS = 64, LOCAL_KEYS = 512 };

/* One head's local attention over one chunk of the block's rows. */
typedef struct {
    const float *q, *key, *value;  /* the head's queries (stride D), its KV head's keys and values (stride ldkv) */
    float *A, *lse;                /* its state (strides D and H) */
    float *tile_A, *tile_lse;      /* one tile's state, the same shape */
    float *scores;                 /* the block's scores (ntok, pos + ntok) */
    int ntok, pos, d, D, H, ldkv;
} LocalRows;

/* Rows [r0, r0 + nr) see keys j < pos + 1 + r: the keys from pos + r0 + nr
 * on are masked for all of them and are left out; in a tile from key k0,
 * row r0 + i sees its keys below pos + 1 + r0 - k0 + i (none: the empty
 * state, which the merge leaves out). */
static void local_rows_task(void *ctx, int chunk) {
    const LocalRows *j = ctx;
    int D = j->D, H = j->H, r0 = chunk * LOCAL_ROWS, nr = j->ntok - r0 < LOCAL_ROWS ? j->ntok - r0 : LOCAL_ROWS;
    int keys = j->pos + r0 + nr;
    const float *q = j->q + (size_t)r0 * D;
    float *A = j->A + (size_t)r0 * D, *lse = j->lse + (size_t)r0 * H, *scores = j->scores + (size_t)r0 * (j->pos + j->ntok);
    for (int k0 = 0; k0 < keys; k0 += LOCAL_KEYS) {
        int nk = keys - k0 < LOCAL_KEYS ? keys - k0 : LOCAL_KEYS;
        float *tile_A = k0 == 0 ? A : j->tile_A + (size_t)r0 * D, *tile_lse = k0 == 0 ? lse : j->tile_lse + (size_t)r0 * H;
        attention_states(nr, nk, j->d, q, D, j->key + (size_t)k0 * j->ldkv, j->value + (size_t)k0 * j->ldkv, j->ldkv,
                         j->pos + 1 + r0 - k0, tile_A, D, tile_lse, H, scores);
        if (k0 > 0)
            for (int i = 0; i < nr; i++)
                merge_states(j->d, A + (size_t)i * D, lse[(size_t)i * H], tile_A + (size_t)i * D, tile_lse[(size_t)i * H],
                             A + (size_t)i * D, &lse[(size_t)i * H]);
    }
}

/* Where KV head g of sequence seq keeps its local keys (or values) of
 * layer l in the local cache, (L, S, G, capacity, d). */
static size_t local_cache_at(const RunState *s, const Config *c, int l, int seq, int g) {
    return (((size_t)l * s->n_seqs + seq) * c->n_kv_heads + g) * s->capacity * (c->dim / c->n_heads);
}

/* The local tokens' state: causal attention of each segment's queries over
 * its own sequence's local keys cached so far, including their own; a head
 * at a time, its rows in chunks on the pool's threads. */
static void local_states(const Model *m, RunState *s, int l, const Segment *seg, int n_segs) {
    const Config *c = &m->config;
    int D = c->dim, H = c->n_heads, d = D / H, group = H / c->n_kv_heads;
    for (int k = 0, r = 0; k < n_segs; r += seg[k].ntok, k++)
        for (int h = 0; h < H; h++) {
            size_t kv = local_cache_at(s, c, l, seg[k].seq, h / group), q = (size_t)r * D + h * d;
            LocalRows job = {s->q + q, s->key_cache + kv, s->value_cache + kv, s->loc_A + q,
                             s->loc_lse + (size_t)r * H + h, s->tile_A + q, s->tile_lse + (size_t)r * H + h,
                             s->scores, seg[k].ntok, seg[k].pos, d, D, H, d};
            parallel_for((seg[k].ntok + LOCAL_ROWS - 1) / LOCAL_ROWS, local_rows_task, &job);
        }
}

/* One chunk of an exact document's keys, for the queries of every KV group. */
typedef struct {
    const float *q;                /* (G, rows, d) each KV group's queries */
    const float *key, *value;      /* the layer's document keys and values (G, n, d) */
    float *chunk_A, *chunk_lse;    /* (chunks, G, rows, d), (chunks, G, rows): each chunk's states */
    float *scores;                 /* (rows, n): chunk c's block (rows, its keys) at rows * (its first key) */
    int G, rows, d, n, chunk;      /* n keys in chunks of `chunk` */
} DocChunks;

/* The chunk's state for each KV group in turn. */
static void doc_chunk_task(void *ctx, int c) {
    const DocChunks *j = ctx;
    int k0 = c * j->chunk, nk = j->n - k0 < j->chunk ? j->n - k0 : j->chunk;
    for (int g = 0; g < j->G; g++) {
        size_t kv = ((size_t)g * j->n + k0) * j->d, state = ((size_t)c * j->G + g) * j->rows;
        attention_states(j->rows, nk, j->d, j->q + (size_t)g * j->rows * j->d, j->d, j->key + kv, j->value + kv,
                         j->d, nk, j->chunk_A + state * j->d, j->d, j->chunk_lse + state, 1,
                         j->scores + (size_t)k0 * j->rows);
    }
}

/* The state of all n keys for the G groups: the chunks' states merged in
 * order, into A (G, rows, d) and lse (G, rows). */
static void merge_chunks(const DocChunks *j, int chunks, float *A, float *lse) {
    int d = j->d, states = j->G * j->rows;  /* (group, row) pairs */
    for (int r = 0; r < states; r++) {
        memcpy(A + (size_t)r * d, j->chunk_A + (size_t)r * d, d * sizeof(float));
        lse[r] = j->chunk_lse[r];
        for (int c = 1; c < chunks; c++)
            merge_states(d, A + (size_t)r * d, lse[r], j->chunk_A + ((size_t)c * states + r) * d,
                         j->chunk_lse[(size_t)c * states + r], A + (size_t)r * d, &lse[r]);
    }
}

/* The queries of KV group g's heads (ntok rows x group heads, (ntok group,
 * d)) into q, for a document at offset P: rotated back by P positions. The
 * heads of group g are adjacent: row t holds group * d floats at
 * s->q + t D + g group d. */
static void gather_queries(const Model *m, RunState *s, int g, int offset, int ntok, float *q) {
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, group = c->n_heads / c->n_kv_heads;
    copy_rows(q, group * d, s->q + g * group * d, c->dim, ntok, group * d);
    if (offset > 0) {
        rope_angles(s->rope_doc, 1, offset, d, c->rope_theta);
        rope(q, ntok * group * d, d, s->rope_doc, -1.0f);
    }
}

/* Exact: the document's state from its KV cache (no cache: the empty
 * state), into A (B, H, d) and lse (B, H). As the Nectar path below, the
 * queries of each KV head's group in one batch, so its keys and values are
 * read once; the keys in chunks on the pool's threads, whose states merge
 * exactly. */
static void document_states_exact(const Model *m, RunState *s, const DocCache *cache, int offset, int l, int ntok,
                                  float *A, float *lse) {
    const Config *c = &m->config;
    int D = c->dim, H = c->n_heads, G = c->n_kv_heads, d = D / H, group = H / G;
    int n = cache ? cache->n : 0, rows = ntok * group;
    if (n == 0) {
        memset(A, 0, (size_t)ntok * D * sizeof(float));
        for (int i = 0; i < ntok * H; i++) lse[i] = -INFINITY;
        return;
    }
    for (int g = 0; g < G; g++) gather_queries(m, s, g, offset, ntok, s->mq + (size_t)g * rows * d);
    int chunk = DOC_CHUNK_KEYS, chunks = (n + chunk - 1) / chunk;
    size_t layer = (size_t)l * G * n * d;
    DocChunks job = {s->mq, cache->key + layer, cache->value + layer, s->chunk_A, s->chunk_lse, s->scores,
                     G, rows, d, n, chunk};
    parallel_for(chunks, doc_chunk_task, &job);
    merge_chunks(&job, chunks, s->mA, s->ma);
    for (int g = 0; g < G; g++) {
        copy_rows(A + g * group * d, D, s->mA + (size_t)g * rows * d, group * d, ntok, group * d);
        copy_rows(lse + g * group, H, s->ma + (size_t)g * rows, group, ntok, group);
    }
}

/* Nectar: the document's state from the module of each KV head, all the
 * queries of its heads (ntok rows x group heads) in one batch, into A
 * (B, H, d) and lse (B, H). */
static void document_states_nectar(const Model *m, RunState *s, const ModuleSet *ms, int offset, int l, int ntok,
                                   float *A, float *lse) {
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, group = c->n_heads / c->n_kv_heads;
    for (int g = 0; g < c->n_kv_heads; g++) {
        gather_queries(m, s, g, offset, ntok, s->mq);
        module_forward(ms, &ms->modules[l * c->n_kv_heads + g], &s->work, s->mq, ntok * group, s->ma, s->mA);
        copy_rows(A + g * group * d, c->dim, s->mA, group * d, ntok, group * d);
        copy_rows(lse + g * group, c->n_heads, s->ma, group, ntok, group);
    }
}

/* state (A, lse) = merge(state 1, state 2) for every (row, head) of a
 * block of ntok rows: A (B, H, d), lse (B, H); A may alias A1 or A2. */
static void merge_rows_into(const Model *m, int ntok, const float *A1, const float *lse1, const float *A2,
                            const float *lse2, float *A, float *lse) {
    const Config *c = &m->config;
    int d = c->dim / c->n_heads;
    for (int t = 0; t < ntok; t++)
        for (int h = 0; h < c->n_heads; h++) {
            size_t row = (size_t)t * c->dim + h * d, head = (size_t)t * c->n_heads + h;
            merge_states(d, A1 + row, lse1[head], A2 + row, lse2[head], A + row, &lse[head]);
        }
}

/* Merges document and local state of every (row, head) into s->att; the
 * merged lse is not needed downstream (only A feeds the output projection:
 * it lands in tile_lse, free by then). */
static void merge_rows(const Model *m, RunState *s, int ntok) {
    merge_rows_into(m, ntok, s->doc_A, s->doc_lse, s->loc_A, s->loc_lse, s->att, s->tile_lse);
}

/* A composition's later documents (doc->next on), each read from its own
 * KV cache or modules at its offset, merged one by one into the first
 * document's state s->doc_A, s->doc_lse (tile_A, tile_lse hold each one's
 * state: the local state's scratch, free until local_states). */
static void compose_documents(const Model *m, RunState *s, const Document *doc, int l, int ntok) {
    for (int offset = doc->n; (doc = doc->next) != NULL; offset += doc->n) {
        if (doc->mode == DOC_NECTAR)
            document_states_nectar(m, s, doc->modules, offset, l, ntok, s->tile_A, s->tile_lse);
        else document_states_exact(m, s, doc->cache, offset, l, ntok, s->tile_A, s->tile_lse);
        merge_rows_into(m, ntok, s->doc_A, s->doc_lse, s->tile_A, s->tile_lse, s->doc_A, s->doc_lse);
    }
}

/* The two attention paths, side by side: they differ in one line only,
 * where the (first) document's state (A, lse) comes from. Their backward
 * twins below differ in the same line. */
static void attention_exact(const Model *m, RunState *s, const Document *doc, int l, const Segment *seg,
                            int n_segs, int ntok) {
    document_states_exact(m, s, doc->cache, 0, l, ntok, s->doc_A, s->doc_lse);     /* the document's KV cache */
    compose_documents(m, s, doc, l, ntok);
    local_states(m, s, l, seg, n_segs);
    merge_rows(m, s, ntok);
}

static void attention_nectar(const Model *m, RunState *s, const Document *doc, int l, const Segment *seg,
                             int n_segs, int ntok) {
    document_states_nectar(m, s, doc->modules, 0, l, ntok, s->doc_A, s->doc_lse);  /* the document's modules */
    compose_documents(m, s, doc, l, ntok);
    local_states(m, s, l, seg, n_segs);
    merge_rows(m, s, ntok);
}

/* The block's queries and keys rotated at their positions (s->rope, from
 * run_layers), and each segment's keys and values into its sequence's
 * local cache, each KV head's keys contiguous. */
static void rotate_and_cache(const Model *m, RunState *s, int l, const Segment *seg, int n_segs, int ntok) {
    const Config *c = &m->config;
    int D = c->dim, d = D / c->n_heads, KVD = d * c->n_kv_heads;
    for (int t = 0; t < ntok; t++) {
        rope(s->q + (size_t)t * D, D, d, s->rope + (size_t)t * d, 1.0f);
        rope(s->k + (size_t)t * KVD, KVD, d, s->rope + (size_t)t * d, 1.0f);
    }
    for (int k = 0, r = 0; k < n_segs; r += seg[k].ntok, k++)
        for (int g = 0; g < c->n_kv_heads; g++) {
            size_t cache_row = local_cache_at(s, c, l, seg[k].seq, g) + (size_t)seg[k].pos * d, row = (size_t)r * KVD;
            copy_rows(s->key_cache + cache_row, d, s->k + row + g * d, KVD, seg[k].ntok, d);
            copy_rows(s->value_cache + cache_row, d, s->v + row + g * d, KVD, seg[k].ntok, d);
        }
}

/* One transformer layer over the block's ntok rows (the segments' tokens
 * one after another): s->x (ntok, D) in, s->x out. */
static void layer_forward(const Model *m, RunState *s, const Document *doc, int l, const Segment *seg, int n_segs,
                          int ntok) {
    const Config *c = &m->config;
    const Weights *w = &m->w;
    int D = c->dim, F = c->hidden_dim, d = D / c->n_heads, KVD = d * c->n_kv_heads;
    for (int t = 0; t < ntok; t++)
        rmsnorm(s->xb + (size_t)t * D, s->x + (size_t)t * D, w->rms_att + (size_t)l * D, D, c->norm_eps);
    /* q, k, v (B, D / KVD) = xb Wq^T, xb Wk^T, xb Wv^T */
    Product qkv[3] = {{w->wq + (size_t)l * D * D, D, s->q}, {w->wk + (size_t)l * KVD * D, KVD, s->k},
                      {w->wv + (size_t)l * KVD * D, KVD, s->v}};
    matmuls(ntok, D, s->xb, 3, qkv);
    rotate_and_cache(m, s, l, seg, n_segs, ntok);

    if (doc->mode == DOC_NECTAR) attention_nectar(m, s, doc, l, seg, n_segs, ntok);
    else attention_exact(m, s, doc, l, seg, n_segs, ntok);
    if (s->taps.q) {
        size_t row = (size_t)l * s->max_block;
        memcpy(s->taps.q + row * D, s->q, (size_t)ntok * D * sizeof(float));
        memcpy(s->taps.doc_A + row * D, s->doc_A, (size_t)ntok * D * sizeof(float));
        memcpy(s->taps.doc_lse + row * c->n_heads, s->doc_lse, (size_t)ntok * c->n_heads * sizeof(float));
    }

    /* x_mid = x + att Wo^T */
    memcpy(s->x_mid, s->x, (size_t)ntok * D * sizeof(float));
    matmul(ntok, D, D, s->att, w->wo + (size_t)l * D * D, 1.0f, s->x_mid);
    /* x = x_mid + W2 (SiLU(W1 xb2) * W3 xb2), xb2 = rmsnorm(x_mid) */
    for (int t = 0; t < ntok; t++)
        rmsnorm(s->xb2 + (size_t)t * D, s->x_mid + (size_t)t * D, w->rms_ffn + (size_t)l * D, D, c->norm_eps);
    Product w13[2] = {{w->w1 + (size_t)l * F * D, F, s->hb}, {w->w3 + (size_t)l * F * D, F, s->hb2}};
    matmuls(ntok, D, s->xb2, 2, w13);  /* hb, hb2 = xb2 W1^T, xb2 W3^T */
    #pragma omp simd
    for (size_t i = 0; i < (size_t)ntok * F; i++) s->hgate[i] = silu(s->hb[i]) * s->hb2[i];
    memcpy(s->x, s->x_mid, (size_t)ntok * D * sizeof(float));
    matmul(ntok, F, D, s->hgate, w->w2 + (size_t)l * D * F, 1.0f, s->x);
}

/* One document of document_check. */
static int one_document_check(const RunState *s, const Document *doc) {
    if (doc->mode == DOC_NECTAR && !s->with_modules) {
        fprintf(stderr, "error: the run state was sized for no modules, but a document is read by its modules\n");
        return -1;
    }
    if (doc->mode == DOC_NECTAR) {
        ModuleWork need;
        modulework_shape(&need, doc->modules, s->work.max_q);
        if (need.max_width > s->work.max_width || need.max_pairs > s->work.max_pairs ||
            need.n_hidden > s->work.n_hidden) {
            fprintf(stderr, "error: the run state was sized for smaller modules than a document's\n");
            return -1;
        }
    }
    int doc_n = doc->mode == DOC_NECTAR ? doc->modules->n_doc : doc->cache ? doc->cache->n : 0;
    if (doc->n != doc_n) {
        fprintf(stderr, "error: the document is %d tokens, but its %s stands for %d\n", doc->n,
                doc->mode == DOC_NECTAR ? "module set" : "cache", doc_n);
        return -1;
    }
    if (doc->mode == DOC_EXACT && doc->cache && doc->cache->n > s->max_doc) {
        fprintf(stderr, "error: the run state was sized for a document of %d tokens, not %d\n",
                s->max_doc, doc->cache->n);
        return -1;
    }
    return 0;
}

/* The document's checks of forward_check: each document's length is its
 * cache's or modules', and the run state was sized for it. */
static int document_check(const RunState *s, const Document *doc) {
    if (document_count(doc) > MAX_DOCUMENTS) {
        fprintf(stderr, "error: a composition of more than %d documents\n", MAX_DOCUMENTS);
        return -1;
    }
    for (; doc; doc = doc->next)
        if (one_document_check(s, doc) != 0) return -1;
    return 0;
}

/* A segment fits its sequence's local cache, and its ids the vocabulary. */
static int segment_check(const Model *m, const RunState *s, const Segment *seg) {
    if (seg->ntok < 1 || seg->seq < 0 || seg->seq >= s->n_seqs || seg->pos < 0 || seg->pos + seg->ntok > s->capacity) {
        fprintf(stderr, "error: %d tokens at local position %d of sequence %d do not fit the run state "
                "(block %d, capacity %d, %d sequences)\n", seg->ntok, seg->pos, seg->seq, s->max_block, s->capacity,
                s->n_seqs);
        return -1;
    }
    return check_tokens(m, seg->tokens, seg->ntok, "forward");
}

int forward_check(const Model *m, const RunState *s, const Document *doc, const int *tokens, int ntok, int pos) {
    Segment one = {tokens, ntok, 0, pos};
    if (ntok > s->max_block) {
        fprintf(stderr, "error: %d tokens at local position %d do not fit the run state "
                "(block %d, capacity %d)\n", ntok, pos, s->max_block, s->capacity);
        return -1;
    }
    if (s->taps.q && doc->next) {  /* the taps keep one document's state */
        fprintf(stderr, "error: the teacher's taps record one document's state, not a composition's\n");
        return -1;
    }
    return segment_check(m, s, &one) != 0 ? -1 : document_check(s, doc);
}

/* logits (rows, V) = rmsnorm(x) Wcls^T for the block's rows at[0..n) (NULL:
 * rows out .. out + n - 1), into the n rows of s->logits from row `out` on. */
static void block_logits(const Model *m, RunState *s, const int *at, int n, int out) {
    const Config *c = &m->config;
    int D = c->dim;
    for (int k = 0; k < n; k++)
        rmsnorm(s->xb + (size_t)(out + k) * D, s->x + (size_t)(at ? at[k] : out + k) * D, m->w.rms_final, D,
                c->norm_eps);
    matmul(n, D, c->vocab_size, s->xb + (size_t)out * D, m->w.wcls, 0.0f, s->logits + (size_t)out * c->vocab_size);
}

/* The layers over the block's rows (the segments' tokens one after
 * another), keeping each layer's input when backward is enabled. */
static void run_layers(const Model *m, RunState *s, const Document *doc, const Segment *seg, int n_segs, int ntok) {
    const Config *c = &m->config;
    int D = c->dim, d = D / c->n_heads;
    for (int k = 0, r = 0; k < n_segs; r += seg[k].ntok, k++) {
        for (int t = 0; t < seg[k].ntok; t++)
            memcpy(s->x + (size_t)(r + t) * D, m->w.token_embedding + (size_t)seg[k].tokens[t] * D, D * sizeof(float));
        /* local tokens follow the documents: positions n + pos + t, n their lengths added up */
        rope_angles(s->rope + (size_t)r * d, seg[k].ntok, document_length(doc) + seg[k].pos, d, c->rope_theta);
    }
    for (int l = 0; l < c->n_layers; l++) {
        float *saved = s->back.saved_x;  /* kept for backward: layer l's input */
        if (saved) memcpy(saved + (size_t)l * s->max_block * D, s->x, (size_t)ntok * D * sizeof(float));
        layer_forward(m, s, doc, l, seg, n_segs, ntok);
    }
    if (s->back.saved_x)
        memcpy(s->back.saved_x + (size_t)c->n_layers * s->max_block * D, s->x, (size_t)ntok * D * sizeof(float));
}

int forward(const Model *m, RunState *s, const Document *doc, const int *tokens, int ntok, int pos,
            int logits) {
    if (forward_check(m, s, doc, tokens, ntok, pos) != 0) return -1;
    Segment one = {tokens, ntok, 0, pos};
    s->block_pos = pos;
    s->block_ntok = ntok;
    run_layers(m, s, doc, &one, 1, ntok);
    int last = ntok - 1;
    if (logits == LOGITS_ALL) block_logits(m, s, NULL, ntok, 0);
    if (logits == LOGITS_LAST) block_logits(m, s, &last, 1, 0);  /* into row 0, as forward_segments' */
    return 0;
}

int forward_segments(const Model *m, RunState *s, const Document *doc, const Segment *seg, int n_segs, int logits) {
    int rows = 0;
    for (int k = 0; k < n_segs; k++) {
        if (segment_check(m, s, &seg[k]) != 0) return -1;
        rows += seg[k].ntok;
    }
    if (n_segs < 1 || rows > s->max_block) {
        fprintf(stderr, "error: %d segments of %d tokens in all do not fit a block of %d\n", n_segs, rows,
                s->max_block);
        return -1;
    }
    if (document_check(s, doc) != 0) return -1;
    s->block_pos = n_segs == 1 ? seg[0].pos : -1;  /* backward takes one segment from position 0 */
    s->block_ntok = rows;
    run_layers(m, s, doc, seg, n_segs, rows);
    if (logits == LOGITS_NONE) return 0;
    int *at = xmalloc((logits == LOGITS_ALL ? rows : n_segs) * sizeof(int)), n = 0;
    for (int k = 0, r = 0; k < n_segs; r += seg[k].ntok, k++)
        for (int t = logits == LOGITS_ALL ? 0 : seg[k].ntok - 1; t < seg[k].ntok; t++) at[n++] = r + t;
    block_logits(m, s, at, n, 0);
    free(at);
    return 0;
}

/* The document's KV cache: a prefill of the document with no document
 * before it, in blocks; its local cache becomes the cache. */
int doccache_build(DocCache *dc, const Model *m, const int *tokens, int n, int block) {
    memset(dc, 0, sizeof(*dc));
    if (n < 1) {
        fprintf(stderr, "error: the document is empty\n");
        return -1;
    }
    if (check_tokens(m, tokens, n, "document") != 0) return -1;
    if (block > n) block = n;
    RunState s;
    runstate_alloc(&s, m, &NO_DOCUMENT, block, n);
    for (int pos = 0; pos < n; pos += block) {
        int len = n - pos < block ? n - pos : block;
        forward(m, &s, &NO_DOCUMENT, tokens + pos, len, pos, LOGITS_NONE);
    }
    /* the document's local cache becomes its KV cache */
    dc->n = n;
    dc->n_layers = m->config.n_layers;
    dc->kv_dim = m->config.dim / m->config.n_heads * m->config.n_kv_heads;
    dc->key = s.key_cache; s.key_cache = NULL;
    dc->value = s.value_cache; s.value_cache = NULL;
    dc->fingerprint = document_fingerprint(tokens, n);
    runstate_free(&s);
    return 0;
}

uint64_t document_fingerprint(const int *tokens, int n) {
    return fnv1a(FNV_OFFSET, tokens, (size_t)n * sizeof(int));
}

void doccache_free(DocCache *dc) {
    free(dc->key); free(dc->value);
    memset(dc, 0, sizeof(*dc));
}

/* ------------------------------------------------------------------------ */
/* 5. The transformer: backward pass (each step quotes its forward line)    */

/* Backward of local_states for a block from local position 0: causal
 * attention over the block's own keys, recomputed head by head; writes dq
 * and the block's dk, dv (GQA heads add into their KV head). */
static void local_states_backward(const Model *m, RunState *s, int l, int ntok) {
    const Config *c = &m->config;
    BackwardBuffers *b = &s->back;
    int D = c->dim, H = c->n_heads, d = D / H, KVD = d * c->n_kv_heads, group = H / c->n_kv_heads;
    memset(b->dq, 0, (size_t)ntok * D * sizeof(float));
    memset(b->dk, 0, (size_t)ntok * KVD * sizeof(float));
    memset(b->dv, 0, (size_t)ntok * KVD * sizeof(float));
    for (int h = 0; h < H; h++) {  /* the block's own keys and values, as cached: s->k, s->v, stride KVD as dk, dv */
        size_t kv = (size_t)(h / group) * d;
        attention_states(ntok, ntok, d, s->q + h * d, D, s->k + kv, s->v + kv, KVD, 1,
                         s->loc_A + h * d, D, s->loc_lse + h, H, s->scores);
        attention_states_backward(ntok, ntok, d, s->q + h * d, D, s->k + kv, s->v + kv, KVD,
                                  s->loc_A + h * d, b->dloc_A + h * d, D, b->dloc_lse + h, H, s->scores,
                                  b->dq + h * d, b->dk + kv, b->dv + kv, b->tmp);
    }
}

/* Exact: backward through the document's state into the queries (the cache
 * itself is frozen). P is recomputed head by head. */
static void document_states_exact_backward(const Model *m, RunState *s, const DocCache *cache, int l, int ntok) {
    const Config *c = &m->config;
    BackwardBuffers *b = &s->back;
    int d = c->dim / c->n_heads, group = c->n_heads / c->n_kv_heads;
    int n = cache ? cache->n : 0;
    if (n == 0) return;
    for (int h = 0; h < c->n_heads; h++) {
        size_t kv = ((size_t)l * c->n_kv_heads + h / group) * n * d;  /* its KV head's keys, (n, d) */
        attention_states(ntok, n, d, s->q + h * d, c->dim, cache->key + kv, cache->value + kv, d, n,
                         s->doc_A + h * d, c->dim, s->doc_lse + h, c->n_heads, s->scores);
        attention_states_backward(ntok, n, d, s->q + h * d, c->dim, cache->key + kv, cache->value + kv, d,
                                  s->doc_A + h * d, b->ddoc_A + h * d, c->dim, b->ddoc_lse + h, c->n_heads,
                                  s->scores, b->dq + h * d, NULL, NULL, b->tmp);
    }
}

/* Nectar: backward through each module (recomputed on the same queries),
 * into its parameters and the queries. */
static void document_states_nectar_backward(const Model *m, RunState *s, const ModuleSet *ms, int l, int ntok) {
    const Config *c = &m->config;
    BackwardBuffers *b = &s->back;
    int d = c->dim / c->n_heads, group = c->n_heads / c->n_kv_heads;
    size_t row = (size_t)group * d;
    for (int g = 0; g < c->n_kv_heads; g++) {
        const Module *mod = &ms->modules[l * c->n_kv_heads + g];
        copy_rows(s->mq, row, s->q + g * row, c->dim, ntok, row);
        copy_rows(b->dmA, row, b->ddoc_A + g * row, c->dim, ntok, row);
        copy_rows(b->dma, group, b->ddoc_lse + g * group, c->n_heads, ntok, group);
        module_forward(ms, mod, &s->work, s->mq, ntok * group, s->ma, s->mA);
        module_backward(ms, mod, &s->work, s->mq, ntok * group, s->mA, b->dma, b->dmA, b->dmq);
        for (int t = 0; t < ntok; t++)
            for (size_t j = 0; j < row; j++) b->dq[(size_t)t * c->dim + g * row + j] += b->dmq[t * row + j];
    }
}

/* Backward of merge_rows: att = merge(document state, local state), per
 * (row, head), into the gradients of both states. */
static void merge_rows_backward(const Model *m, RunState *s, int ntok) {
    const Config *c = &m->config;
    BackwardBuffers *b = &s->back;
    int D = c->dim, H = c->n_heads, d = D / H;
    for (int t = 0; t < ntok; t++)
        for (int h = 0; h < H; h++) {
            size_t row = (size_t)t * D + h * d, head = (size_t)t * H + h;
            merge_states_backward(d, s->doc_A + row, s->doc_lse[head], s->loc_A + row, s->loc_lse[head],
                                  b->datt + row, b->ddoc_A + row, &b->ddoc_lse[head], b->dloc_A + row,
                                  &b->dloc_lse[head]);
        }
}

/* The twins of attention_exact and attention_nectar: back.datt in, back.dq,
 * dk, dv out; they differ in the same one line. */
static void attention_exact_backward(const Model *m, RunState *s, const Document *doc, int l, int ntok) {
    merge_rows_backward(m, s, ntok);
    local_states_backward(m, s, l, ntok);
    document_states_exact_backward(m, s, doc->cache, l, ntok);     /* the document's KV cache */
}

static void attention_nectar_backward(const Model *m, RunState *s, const Document *doc, int l, int ntok) {
    merge_rows_backward(m, s, ntok);
    local_states_backward(m, s, l, ntok);
    document_states_nectar_backward(m, s, doc->modules, l, ntok);  /* the document's modules */
}

/* layer l's slice of a per-layer gradient tensor; NULL when not asked for */
#define LAYER(ptr, l, size) ((ptr) ? (ptr) + (size_t)(l) * (size) : NULL)

/* Backward of the FFN half of layer_forward: back.dx holds dL/d(output x);
 * on return back.dx_mid holds dL/d(x_mid). */
static void ffn_backward(const Model *m, RunState *s, int l, int ntok, Weights *dw) {
    const Config *c = &m->config;
    const Weights *w = &m->w;
    BackwardBuffers *b = &s->back;
    int D = c->dim, F = c->hidden_dim;
    /* x = x_mid + hgate W2^T */
    input_grad(ntok, F, D, b->dx, w->w2 + (size_t)l * D * F, 0.0f, b->dhgate);
    weight_grad(ntok, F, D, b->dx, s->hgate, LAYER(dw->w2, l, (size_t)D * F));
    /* hgate = SiLU(hb) * hb2 */
    #pragma omp simd
    for (size_t i = 0; i < (size_t)ntok * F; i++) {
        float sg = 1.0f / (1.0f + exp_fast(-s->hb[i]));
        b->dhb2[i] = b->dhgate[i] * s->hb[i] * sg;
        b->dhb[i] = b->dhgate[i] * s->hb2[i] * sg * (1.0f + s->hb[i] * (1.0f - sg));
    }
    /* hb = xb2 W1^T, hb2 = xb2 W3^T */
    input_grad(ntok, D, F, b->dhb, w->w1 + (size_t)l * F * D, 0.0f, b->dxb);
    input_grad(ntok, D, F, b->dhb2, w->w3 + (size_t)l * F * D, 1.0f, b->dxb);
    weight_grad(ntok, D, F, b->dhb, s->xb2, LAYER(dw->w1, l, (size_t)F * D));
    weight_grad(ntok, D, F, b->dhb2, s->xb2, LAYER(dw->w3, l, (size_t)F * D));
    /* xb2 = rmsnorm(x_mid); x_mid also flows straight to x */
    memcpy(b->dx_mid, b->dx, (size_t)ntok * D * sizeof(float));
    for (int t = 0; t < ntok; t++)
        rmsnorm_backward(b->dx_mid + (size_t)t * D, LAYER(dw->rms_ffn, l, D), s->x_mid + (size_t)t * D,
                         w->rms_ffn + (size_t)l * D, b->dxb + (size_t)t * D, D, c->norm_eps);
}

/* Backward of layer_forward: back.dx holds dL/d(output x); on return it
 * holds dL/d(input x). The layer's forward is recomputed first. */
static void layer_backward(const Model *m, RunState *s, const Document *doc, int l, int ntok, Weights *dw) {
    const Config *c = &m->config;
    const Weights *w = &m->w;
    BackwardBuffers *b = &s->back;
    int D = c->dim, H = c->n_heads, d = D / H, KVD = d * c->n_kv_heads;
    const float *x_in = b->saved_x + (size_t)l * s->max_block * D;
    memcpy(s->x, x_in, (size_t)ntok * D * sizeof(float));
    Segment block = {NULL, ntok, 0, 0};  /* the forward's one block, recomputed (its tokens are not needed) */
    layer_forward(m, s, doc, l, &block, 1, ntok);
    ffn_backward(m, s, l, ntok, dw);
    /* x_mid = x + att Wo^T */
    input_grad(ntok, D, D, b->dx_mid, w->wo + (size_t)l * D * D, 0.0f, b->datt);
    weight_grad(ntok, D, D, b->dx_mid, s->att, LAYER(dw->wo, l, (size_t)D * D));
    /* exact or Nectar: the same one line as in layer_forward */
    if (doc->mode == DOC_NECTAR) attention_nectar_backward(m, s, doc, l, ntok);
    else attention_exact_backward(m, s, doc, l, ntok);
    /* q, k rotated at their positions: rotate the gradients back */
    for (int t = 0; t < ntok; t++) {
        rope(b->dq + (size_t)t * D, D, d, s->rope + (size_t)t * d, -1.0f);  /* the forward's angles */
        rope(b->dk + (size_t)t * KVD, KVD, d, s->rope + (size_t)t * d, -1.0f);
    }
    /* q, k, v = xb Wq^T, xb Wk^T, xb Wv^T */
    input_grad(ntok, D, D, b->dq, w->wq + (size_t)l * D * D, 0.0f, b->dxb);
    input_grad(ntok, D, KVD, b->dk, w->wk + (size_t)l * KVD * D, 1.0f, b->dxb);
    input_grad(ntok, D, KVD, b->dv, w->wv + (size_t)l * KVD * D, 1.0f, b->dxb);
    weight_grad(ntok, D, D, b->dq, s->xb, LAYER(dw->wq, l, (size_t)D * D));
    weight_grad(ntok, D, KVD, b->dk, s->xb, LAYER(dw->wk, l, (size_t)KVD * D));
    weight_grad(ntok, D, KVD, b->dv, s->xb, LAYER(dw->wv, l, (size_t)KVD * D));
    /* xb = rmsnorm(x); x also flows straight to x_mid */
    memcpy(b->dx, b->dx_mid, (size_t)ntok * D * sizeof(float));
    for (int t = 0; t < ntok; t++)
        rmsnorm_backward(b->dx + (size_t)t * D, LAYER(dw->rms_att, l, D), x_in + (size_t)t * D,
                         w->rms_att + (size_t)l * D, b->dxb + (size_t)t * D, D, c->norm_eps);
}

int backward(const Model *m, RunState *s, const Document *doc, const int *tokens, int ntok,
             const float *dlogits, Weights *dw) {
    const Config *c = &m->config;
    BackwardBuffers *b = &s->back;
    int D = c->dim, V = c->vocab_size, L = c->n_layers;
    if (doc->next) {
        fprintf(stderr, "error: backward takes one document, not a composition\n");
        return -1;
    }
    if (!b->saved_x || ntok != s->block_ntok || s->block_pos != 0) {
        fprintf(stderr, "error: backward needs a run state with backward enabled and the block just run from position 0\n");
        return -1;
    }
    Weights no_weight_grads = {0};  /* every tensor NULL: the model's gradients are skipped */
    if (!dw) dw = &no_weight_grads;
    /* logits = rmsnorm(x_L) Wcls^T */
    const float *x_final = b->saved_x + (size_t)L * s->max_block * D;
    for (int t = 0; t < ntok; t++) rmsnorm(s->xb + (size_t)t * D, x_final + (size_t)t * D, m->w.rms_final, D, c->norm_eps);
    input_grad(ntok, D, V, dlogits, m->w.wcls, 0.0f, b->dxb);
    weight_grad(ntok, D, V, dlogits, s->xb, dw->wcls);
    memset(b->dx, 0, (size_t)ntok * D * sizeof(float));
    for (int t = 0; t < ntok; t++)
        rmsnorm_backward(b->dx + (size_t)t * D, dw->rms_final, x_final + (size_t)t * D,
                         m->w.rms_final, b->dxb + (size_t)t * D, D, c->norm_eps);
    for (int l = L - 1; l >= 0; l--) layer_backward(m, s, doc, l, ntok, dw);
    /* x_0 = token_embedding[token] */
    if (dw->token_embedding)
        for (int t = 0; t < ntok; t++)
            for (int i = 0; i < D; i++) dw->token_embedding[(size_t)tokens[t] * D + i] += b->dx[(size_t)t * D + i];
    return 0;
}

/* ------------------------------------------------------------------------ */
/* 8. Generation                                                            */

void sampler_init(Sampler *s, int vocab_size, float temperature, float topp, uint64_t seed) {
    s->temperature = temperature;
    s->topp = topp;
    s->rng = seed ? seed : 1;
    s->cand = xmalloc(vocab_size * sizeof(Candidate));
}

void sampler_free(Sampler *s) { free(s->cand); }

static int compare_candidates(const void *a, const void *b) {
    float pa = ((const Candidate *)a)->prob, pb = ((const Candidate *)b)->prob;
    return (pa < pb) - (pa > pb);  /* descending */
}

int sample(Sampler *s, const float *logits, int n) {
    if (s->temperature == 0.0f) return argmax(logits, n);
    /* p = softmax(logits / temperature) */
    float max = logits[argmax(logits, n)], sum = 0.0f;
    for (int i = 0; i < n; i++) {
        s->cand[i].prob = expf((logits[i] - max) / s->temperature);
        s->cand[i].index = i;
        sum += s->cand[i].prob;
    }
    for (int i = 0; i < n; i++) s->cand[i].prob /= sum;
    float r = rng_uniform(&s->rng);
    int count = n;
    if (s->topp > 0.0f && s->topp < 1.0f) {
        /* top-p: the smallest set of most likely tokens with mass >= topp */
        qsort(s->cand, n, sizeof(Candidate), compare_candidates);
        float mass = 0.0f;
        for (count = 0; count < n && mass < s->topp; count++) mass += s->cand[count].prob;
        r *= mass;
    }
    float cdf = 0.0f;
    for (int i = 0; i < count; i++) {
        cdf += s->cand[i].prob;
        if (r < cdf) return s->cand[i].index;
    }
    return s->cand[count - 1].index;
}

/* generate's checks before it allocates: the prompt, max_new and the
 * context (forward checks the ids). 0, or -1 with a sentence. */
static int generate_check(const Model *m, const Document *doc, int n_prompt, int max_new) {
    int n_doc = document_length(doc);
    if (n_prompt < 1 || max_new < 0) {
        fprintf(stderr, "error: generation needs a prompt of at least one token and max_new >= 0, not %d and %d\n",
                n_prompt, max_new);
        return -1;
    }
    if ((long)n_doc + n_prompt + max_new - 1 > m->config.seq_len) {  /* the positions fed: not the last new token's */
        fprintf(stderr, "error: the document (%d tokens), the prompt (%d) and %d new tokens exceed the model's "
                "context of %d\n", n_doc, n_prompt, max_new, m->config.seq_len);
        return -1;
    }
    return 0;
}

int generate(const Model *m, const Document *doc, const int *prompt, int n_prompt, int max_new, const int stop[2],
             Sampler *sampler, int *out) {
    if (generate_check(m, doc, n_prompt, max_new) != 0) return -1;
    RunState s;
    runstate_alloc(&s, m, doc, n_prompt, n_prompt + max_new);
    int n = 0, rc = forward(m, &s, doc, prompt, n_prompt, 0, LOGITS_LAST);  /* the last row's logits: s.logits (V) */
    while (rc == 0 && n < max_new) {
        int next = out[n++] = sample(sampler, s.logits, m->config.vocab_size);
        if (next == stop[0] || next == stop[1] || n == max_new) break;
        rc = forward(m, &s, doc, &next, 1, n_prompt + n - 1, LOGITS_LAST);
    }
    runstate_free(&s);
    return rc == 0 ? n : -1;
}
