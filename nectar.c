/* nectar.c - the CPU reference of Nectar in C, on OpenBLAS.
 *
 * Read top to bottom: utilities, the model file, attention states and their
 * merge, Nectar modules (forward next to backward), the transformer forward
 * with the exact and the Nectar attention side by side, sampling. The
 * tokenizer comes last. Shapes use the legend at the top of nectar.h.
 */
#include "nectar.h"

#include <cblas.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ------------------------------------------------------------------------ */
/* Utilities                                                                */

void *check_malloc(size_t n, const char *file, int line) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) {
        fprintf(stderr, "error: out of memory allocating %zu bytes at %s:%d\n", n, file, line);
        exit(1);
    }
    return p;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int parse_int_option(const char *option, const char *text, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
        fprintf(stderr, "error: option %s expects an integer, got '%s'\n", option, text);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int parse_float_option(const char *option, const char *text, float *out) {
    char *end;
    float v = strtof(text, &end);
    if (end == text || *end || !isfinite(v)) {
        fprintf(stderr, "error: option %s expects a finite number, got '%s'\n", option, text);
        return -1;
    }
    *out = v;
    return 0;
}

int parse_seed_option(const char *option, const char *text, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || *end || errno == ERANGE || strchr(text, '-')) {
        fprintf(stderr, "error: option %s expects a seed (an integer >= 0), got '%s'\n", option, text);
        return -1;
    }
    *out = v;
    return 0;
}

void report_last_option(const char *option, const char *value_options) {
    char word[64];
    snprintf(word, sizeof word, " %s ", option);
    fprintf(stderr, "error: option %s %s (see --help)\n", option,
            strstr(value_options, word) ? "needs a value" : "is unknown");
}

void copy_rows(float *dst, int ld_dst, const float *src, int ld_src, int rows, int width) {
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * ld_dst, src + (size_t)r * ld_src, (size_t)width * sizeof(float));
}

uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ULL; }
    return h;
}

uint32_t rng_u32(uint64_t *state) {  /* xorshift*, as llama2.c */
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1DULL) >> 32);
}

float rng_uniform(uint64_t *state) { return (rng_u32(state) >> 8) / 16777216.0f; }

float rng_normal(uint64_t *state) {  /* Box-Muller */
    float u1 = rng_uniform(state), u2 = rng_uniform(state);
    return sqrtf(-2.0f * logf(1.0f - u1)) * cosf(6.2831853f * u2);
}

/* Writes the parts to path atomically: a temporary file, then rename. */
int write_file_atomic(const char *path, const void *const *parts,
                             const size_t *sizes, int n_parts) {
    size_t len = strlen(path);
    char *tmp = xmalloc(len + 5);
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fprintf(stderr, "error: cannot write %s: %s\n", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    int ok = 1;
    for (int i = 0; i < n_parts && ok; i++)
        ok = sizes[i] == 0 || fwrite(parts[i], 1, sizes[i], f) == sizes[i];
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "error: writing %s failed: %s\n", path, strerror(errno));
        remove(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

/* Reads a whole file; NULL after a sentence. */
static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "error: %s is not a regular file\n", path);
        fclose(f);
        return NULL;
    }
    long end = (long)st.st_size;
    unsigned char *buf = xmalloc((size_t)end + 1);
    if (fread(buf, 1, (size_t)end, f) != (size_t)end) {
        fprintf(stderr, "error: cannot read %s\n", path);
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[end] = 0;
    *size = (size_t)end;
    return buf;
}

char *read_text_file(const char *path) {
    size_t size;
    char *text = (char *)read_file(path, &size);
    if (!text) return NULL;
    size_t nul = strlen(text);
    if (nul < size) {  /* C strings would end there, silently */
        fprintf(stderr, "error: %s is not a text file (a NUL byte at offset %zu)\n", path, nul);
        free(text);
        return NULL;
    }
    return text;
}

/* ------------------------------------------------------------------------ */
/* Model: llama2.c "v0" checkpoints                                         */

enum { HEADER_INTS = 7 };

/* Number of floats of each tensor, in file order (RoPE tables included). */
enum { T_RMS_FINAL = 10, T_ROPE_REAL = 11, T_ROPE_IMAG = 12, T_CLS = 13, T_COUNT = 14 };
typedef struct { size_t count[T_COUNT]; } TensorSizes;

static TensorSizes tensor_sizes(const Config *c, int shared) {
    size_t D = c->dim, F = c->hidden_dim, L = c->n_layers, V = c->vocab_size;
    size_t d = D / c->n_heads, KVD = d * c->n_kv_heads, T = c->seq_len;
    TensorSizes t = {{V * D, L * D, L * D * D, L * KVD * D, L * KVD * D, L * D * D,
                      L * D, L * F * D, L * D * F, L * F * D, D,
                      T * d / 2, T * d / 2, shared ? 0 : V * D}};
    return t;
}

/* A sentence and -1 unless the shape is one this code can run. */
static int check_config(const Config *c, const char *path) {
    const int limit = 1 << 24;
    int dims[HEADER_INTS] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads,
                             c->n_kv_heads, c->vocab_size, c->seq_len};
    static const char *names[HEADER_INTS] = {"dim", "hidden_dim", "n_layers", "n_heads",
                                            "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < HEADER_INTS; i++)
        if (dims[i] <= 0 || dims[i] > limit) {
            fprintf(stderr, "error: %s: %s = %d is out of range (1..%d)\n", path, names[i], dims[i], limit);
            return -1;
        }
    double D = c->dim, F = c->hidden_dim, L = c->n_layers, V = c->vocab_size, T = c->seq_len;
    double floats = V * D * 2 + L * (4 * D * D + 3 * D * F + 2 * D) + T * D + D;
    if (floats > 1e11) {  /* also keeps every size_t product below well within range */
        fprintf(stderr, "error: %s: a model of these dimensions (about %.3g floats) is beyond what this code loads\n",
                path, floats);
        return -1;
    }
    if (c->dim % c->n_heads != 0) {
        fprintf(stderr, "error: %s: dim %d is not a multiple of n_heads %d\n", path, c->dim, c->n_heads);
        return -1;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        fprintf(stderr, "error: %s: n_heads %d is not a multiple of n_kv_heads %d\n", path, c->n_heads, c->n_kv_heads);
        return -1;
    }
    if ((c->dim / c->n_heads) % 2 != 0) {
        fprintf(stderr, "error: %s: head size %d is odd; RoPE needs it even\n", path, c->dim / c->n_heads);
        return -1;
    }
    return 0;
}

void weights_view(const Config *c, int shared, float *base, Weights *w) {
    TensorSizes t = tensor_sizes(c, shared);
    float **views[] = {&w->token_embedding, &w->rms_att, &w->wq, &w->wk, &w->wv,
                       &w->wo, &w->rms_ffn, &w->w1, &w->w2, &w->w3, &w->rms_final};
    float *p = base;
    for (int i = 0; i <= T_RMS_FINAL; i++) { *views[i] = p; p += t.count[i]; }
    w->wcls = shared ? w->token_embedding : p;
}

void model_refresh(Model *m) {
    weights_view(&m->config, m->shared_classifier, m->params, &m->w);
    uint64_t h = fnv1a(FNV_OFFSET, &m->config, sizeof(Config));
    h = fnv1a(h, &m->shared_classifier, sizeof(int));
    m->fingerprint = fnv1a(h, m->params, m->n_params * sizeof(float));
}

static size_t model_param_count(const Config *c, int shared) {
    TensorSizes t = tensor_sizes(c, shared);
    size_t n = 0;
    for (int i = 0; i < T_COUNT; i++)
        if (i != T_ROPE_REAL && i != T_ROPE_IMAG) n += t.count[i];
    return n;
}

/* Index of the first NaN or infinity in x (n), or n if every value is finite. */
static size_t first_nonfinite(const float *x, size_t n) {
    size_t i = 0;
    while (i < n && isfinite(x[i])) i++;
    return i;
}

int model_load(Model *m, const char *path) {
    memset(m, 0, sizeof(*m));
    size_t size;
    unsigned char *buf = read_file(path, &size);
    if (!buf) return -1;
    if (size < HEADER_INTS * sizeof(int)) {
        fprintf(stderr, "error: %s is %zu bytes, shorter than a checkpoint header (28 bytes)\n", path, size);
        free(buf);
        return -1;
    }
    int h[HEADER_INTS];
    memcpy(h, buf, sizeof(h));
    Config c = {h[0], h[1], h[2], h[3], h[4], h[5] == INT_MIN ? 0 : abs(h[5]), h[6]};
    int shared = h[5] > 0;
    if (check_config(&c, path) != 0) { free(buf); return -1; }
    TensorSizes t = tensor_sizes(&c, shared);
    size_t floats = 0;
    for (int i = 0; i < T_COUNT; i++) floats += t.count[i];
    size_t expected = sizeof(h) + floats * sizeof(float);
    if (size != expected) {
        fprintf(stderr, "error: %s is %zu bytes but its header (dim %d, hidden %d, layers %d, heads %d/%d, "
                "vocab %d, seq_len %d) needs %zu bytes; the file is %s\n", path, size, c.dim, c.hidden_dim,
                c.n_layers, c.n_heads, c.n_kv_heads, h[5], c.seq_len, expected,
                size < expected ? "truncated or not a llama2.c checkpoint" : "longer than its header says");
        free(buf);
        return -1;
    }
    m->config = c;
    m->shared_classifier = shared;
    m->n_params = model_param_count(&c, shared);
    m->params = xmalloc(m->n_params * sizeof(float));
    /* copy every tensor but the two RoPE tables, which we recompute */
    const float *src = (const float *)(buf + sizeof(h));
    float *dst = m->params;
    for (int i = 0; i < T_COUNT; i++) {
        if (i != T_ROPE_REAL && i != T_ROPE_IMAG) {
            memcpy(dst, src, t.count[i] * sizeof(float));
            dst += t.count[i];
        }
        src += t.count[i];
    }
    free(buf);
    size_t bad = first_nonfinite(m->params, m->n_params);
    if (bad < m->n_params) {
        fprintf(stderr, "error: %s: weight %zu of %zu is %g; the checkpoint is corrupt\n", path, bad, m->n_params,
                m->params[bad]);
        model_free(m);
        return -1;
    }
    model_refresh(m);
    return 0;
}

int model_init_random(Model *m, Config c, int shared, uint64_t seed, float std) {
    memset(m, 0, sizeof(*m));
    if (check_config(&c, "random model") != 0) return -1;
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

int model_save(const Model *m, const char *path) {
    const Config *c = &m->config;
    int h[HEADER_INTS] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                          m->shared_classifier ? c->vocab_size : -c->vocab_size, c->seq_len};
    TensorSizes t = tensor_sizes(c, m->shared_classifier);
    /* RoPE tables as llama2.c's export writes them: cos and sin of pos * freq_i */
    int d = c->dim / c->n_heads;
    float *rope = xmalloc(2 * t.count[T_ROPE_REAL] * sizeof(float));
    for (int pos = 0; pos < c->seq_len; pos++)
        for (int i = 0; i < d / 2; i++) {
            float angle = pos * (1.0f / powf(10000.0f, (2.0f * i) / d));
            rope[pos * (d / 2) + i] = cosf(angle);
            rope[t.count[T_ROPE_REAL] + pos * (d / 2) + i] = sinf(angle);
        }
    size_t before_rope = 0;
    for (int i = 0; i < T_ROPE_REAL; i++) before_rope += t.count[i];
    const void *parts[4] = {h, m->params, rope, m->params + before_rope};
    size_t sizes[4] = {sizeof(h), before_rope * sizeof(float), 2 * t.count[T_ROPE_REAL] * sizeof(float),
                       t.count[T_CLS] * sizeof(float)};
    int rc = write_file_atomic(path, parts, sizes, 4);
    free(rope);
    return rc;
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

/* ------------------------------------------------------------------------ */
/* Attention states and their merge                                         */

void attention_states(int nq, int nk, int d, const float *q, int ldq,
                      const float *k, const float *v, int ldkv, int visible,
                      float *A, int ldA, float *lse, int ldlse, float *scores) {
    if (nk > 0)  /* scores (nq, nk) = Q K^T / sqrt(d) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, d, 1.0f / sqrtf((float)d),
                    q, ldq, k, ldkv, 0.0f, scores, nk);
    for (int i = 0; i < nq; i++) {
        float *row = scores + (size_t)i * nk;
        int seen = visible + i < nk ? visible + i : nk;
        if (seen <= 0) {  /* empty set: state (0, -inf) */
            memset(row, 0, (size_t)nk * sizeof(float));
            lse[(size_t)i * ldlse] = -INFINITY;
            continue;
        }
        float max = row[0];
        for (int j = 1; j < seen; j++) max = row[j] > max ? row[j] : max;
        float sum = 0.0f;
        for (int j = 0; j < seen; j++) { row[j] = expf(row[j] - max); sum += row[j]; }
        /* lse = log sum_j exp(s_j) = max + log sum_j exp(s_j - max) */
        lse[(size_t)i * ldlse] = max + logf(sum);
        float inv = 1.0f / sum;
        for (int j = 0; j < seen; j++) row[j] *= inv;
        for (int j = seen; j < nk; j++) row[j] = 0.0f;
    }
    if (nk > 0)  /* A (nq, d) = P V */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, d, nk, 1.0f,
                    scores, nk, v, ldkv, 0.0f, A, ldA);
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
    if (dv) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, d, nq, 1.0f,
                        scores, nk, dA, ldA, 1.0f, dv, ldkv);
    /* tmp (nq, nk) = dA V^T, then ds in place */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, d, 1.0f, dA, ldA, v, ldkv, 0.0f, tmp, nk);
    for (int i = 0; i < nq; i++) {
        float dA_dot_A = 0.0f;
        for (int c = 0; c < d; c++) dA_dot_A += dA[(size_t)i * ldA + c] * A[(size_t)i * ldA + c];
        float g = dlse ? dlse[(size_t)i * ldlse] : 0.0f;
        for (int j = 0; j < nk; j++) {
            size_t ij = (size_t)i * nk + j;
            tmp[ij] = scores[ij] * (g + tmp[ij] - dA_dot_A);
        }
    }
    if (dq) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, d, nk, scale,
                        tmp, nk, k, ldkv, 1.0f, dq, ldq);
    if (dk) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, d, nq, scale,
                        tmp, nk, q, ldq, 1.0f, dk, ldkv);
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
/* Nectar modules                                                           */
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

static size_t module_param_count(const ModuleSet *s, int size) {
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

void modulework_shape(ModuleWork *w, const ModuleSet *s, int max_q) {
    memset(w, 0, sizeof(*w));
    w->max_q = max_q;
    w->n_hidden = s->arch == ARCH_MLP ? s->depth_backbone + s->depth_score + s->depth_target : 0;
    for (int i = 0; i < s->n_layers * s->n_kv_heads; i++) {
        if (s->modules[i].width > w->max_width) w->max_width = s->modules[i].width;
        if (s->modules[i].n_pairs > w->max_pairs) w->max_pairs = s->modules[i].n_pairs;
    }
}

void modulework_alloc(ModuleWork *w, const ModuleSet *s, int max_q) {
    modulework_shape(w, s, max_q);
    size_t N = max_q, d = s->head_size, hidden = (size_t)w->n_hidden * N * w->max_width;
    w->x = xmalloc(N * d * sizeof(float));
    w->dx = xmalloc(N * d * sizeof(float));
    w->pre = xmalloc(hidden * sizeof(float));
    w->hid = xmalloc(hidden * sizeof(float));
    w->dhid = xmalloc(hidden * sizeof(float));
    w->probs = xmalloc(N * w->max_pairs * sizeof(float));
    w->tmp = xmalloc(N * w->max_pairs * sizeof(float));
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
                size_t src = ((size_t)l * doc->n + j) * doc->kv_dim + (size_t)g * d;
                memcpy(W + (size_t)j * d, doc->key + src, d * sizeof(float));
                memcpy(Z + (size_t)j * d, doc->value + src, d * sizeof(float));
            }
        }
}

static float silu(float z) { return z / (1.0f + expf(-z)); }

/* Y (N, n_out) = X (N, n_in) W^T + beta Y: W stored (n_out, n_in), as every
 * weight matrix here (beta 1 adds into Y, as the residual stream does). */
static void matmul(int N, int n_in, int n_out, const float *X, const float *W, float beta, float *Y) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, n_out, n_in, 1.0f, X, n_in, W, n_in, beta, Y, n_out);
}

/* dW += dY^T X for a linear layer Y = X W^T (W stored (n_out, n_in)), if dW. */
static void weight_grad(int ntok, int n_in, int n_out, const float *dY, const float *X, float *dW) {
    if (dW) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n_out, n_in, ntok, 1.0f,
                        dY, n_out, X, n_in, 1.0f, dW, n_in);
}

/* dX (+)= dY W for Y = X W^T; beta 0 overwrites, 1 adds. */
static void input_grad(int ntok, int n_in, int n_out, const float *dY, const float *W, float beta, float *dX) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ntok, n_in, n_out, 1.0f,
                dY, n_out, W, n_in, beta, dX, n_in);
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
        for (size_t j = 0; j < layer_size; j++) {  /* SiLU'(z) = s(z) (1 + z (1 - s(z))) */
            float sg = 1.0f / (1.0f + expf(-pre[j]));
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
/* Fitting                                                                  */

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
                    memcpy(b->q + row * d, t->q + at * D + (size_t)h * d, d * sizeof(float));
                    memcpy(b->A_t + row * d, t->A + at * D + (size_t)h * d, d * sizeof(float));
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

int promptset_max_len(const PromptSet *p) {
    int max_len = 1;
    for (int i = 0; i < p->n_prompts; i++)
        if (p->offsets[i + 1] - p->offsets[i] > max_len) max_len = p->offsets[i + 1] - p->offsets[i];
    return max_len;
}

void promptset_free(PromptSet *p) {
    free(p->offsets); free(p->tokens); free(p->challenge);
    memset(p, 0, sizeof(*p));
}

/* Module file: a fixed header, a table of (size, input_scale) per module,
 * every parameter, then the held-out prompts: offsets (n + 1), tokens,
 * challenge flags (n), all int32. */
enum { MODULE_MAGIC = 0x5243544E /* "NTCR" */, MODULE_VERSION = 1 };
typedef struct {
    uint32_t magic, version;
    int32_t arch, n_layers, n_kv_heads, head_size;
    int32_t depth_backbone, depth_score, depth_target, n_doc;
    float rho;
    int32_t n_heldout;
    uint64_t model_fingerprint, doc_fingerprint, n_params;
    int64_t n_heldout_tokens;
    uint8_t pad[128 - 80];
} ModuleFileHeader;
_Static_assert(sizeof(ModuleFileHeader) == 128, "module file header is 128 bytes");

typedef struct { int32_t size; float input_scale; } ModuleFileEntry;

int moduleset_save(const ModuleSet *s, const char *path) {
    ModuleFileHeader h = {0};
    h.magic = MODULE_MAGIC; h.version = MODULE_VERSION; h.arch = s->arch;
    h.n_layers = s->n_layers; h.n_kv_heads = s->n_kv_heads; h.head_size = s->head_size;
    h.depth_backbone = s->depth_backbone; h.depth_score = s->depth_score;
    h.depth_target = s->depth_target; h.n_doc = s->n_doc; h.rho = s->rho;
    h.model_fingerprint = s->model_fingerprint; h.doc_fingerprint = s->doc_fingerprint;
    h.n_params = s->n_params;
    const PromptSet *p = &s->heldout;
    h.n_heldout = p->n_prompts;
    h.n_heldout_tokens = p->n_prompts ? p->offsets[p->n_prompts] : 0;
    int count = s->n_layers * s->n_kv_heads;
    ModuleFileEntry *table = xmalloc(count * sizeof(ModuleFileEntry));
    for (int i = 0; i < count; i++) {
        const Module *mod = &s->modules[i];
        table[i].size = s->arch == ARCH_MLP ? mod->width : mod->n_pairs;
        table[i].input_scale = mod->input_scale;
    }
    int32_t *flags = xmalloc((p->n_prompts + 1) * sizeof(int32_t));
    for (int i = 0; i < p->n_prompts; i++) flags[i] = p->challenge[i];
    const void *parts[6] = {&h, table, s->params, p->offsets, p->tokens, flags};
    size_t sizes[6] = {sizeof(h), count * sizeof(ModuleFileEntry), s->n_params * sizeof(float),
                       p->n_prompts ? (p->n_prompts + 1) * sizeof(int32_t) : 0,
                       h.n_heldout_tokens * sizeof(int32_t), p->n_prompts * sizeof(int32_t)};
    int rc = write_file_atomic(path, parts, sizes, 6);
    free(table); free(flags);
    return rc;
}

int moduleset_load(ModuleSet *s, const char *path, uint64_t model_fp, uint64_t doc_fp) {
    memset(s, 0, sizeof(*s));
    size_t size;
    unsigned char *buf = read_file(path, &size);
    if (!buf) return -1;
    ModuleFileHeader h;
    if (size < sizeof(h)) {
        fprintf(stderr, "error: %s is %zu bytes, shorter than a module file header\n", path, size);
        free(buf);
        return -1;
    }
    memcpy(&h, buf, sizeof(h));
    const char *why = NULL;
    if (h.magic != MODULE_MAGIC) why = "it is not a Nectar module file (bad magic number)";
    else if (h.version != MODULE_VERSION) why = "its version is not one this program reads";
    else if (h.arch != ARCH_MLP && h.arch != ARCH_QUAD) why = "its architecture is unknown";
    else if (h.n_layers <= 0 || h.n_kv_heads <= 0 || h.head_size <= 0 || h.n_doc <= 0 ||
             h.n_layers > 4096 || h.n_kv_heads > 4096 || h.head_size > 65536 ||
             h.n_layers * h.n_kv_heads > (1 << 16) ||
             h.n_heldout < 0 || h.n_heldout_tokens < 0 || h.n_heldout_tokens > (1 << 28))
        why = "its dimensions are out of range";
    if (why) {
        fprintf(stderr, "error: %s: %s\n", path, why);
        free(buf);
        return -1;
    }
    int count = h.n_layers * h.n_kv_heads;
    size_t table_bytes = count * sizeof(ModuleFileEntry);
    if (size < sizeof(h) + table_bytes) {
        fprintf(stderr, "error: %s is truncated (its module table is incomplete)\n", path);
        free(buf);
        return -1;
    }
    ModuleFileEntry *table = (ModuleFileEntry *)(buf + sizeof(h));
    /* sizes per layer, the same for every KV head; the file size they imply,
     * checked before anything is allocated */
    int *sizes = xmalloc(h.n_layers * sizeof(int));
    int ok = h.arch != ARCH_MLP || depths_valid(h.depth_backbone, h.depth_score, h.depth_target);
    size_t n_params = 0;
    for (int l = 0; l < h.n_layers && ok; l++) {
        sizes[l] = table[l * h.n_kv_heads].size;
        for (int g = 0; g < h.n_kv_heads; g++)
            ok &= table[l * h.n_kv_heads + g].size == sizes[l] && sizes[l] > 0 && sizes[l] <= (1 << 20) &&
                  isfinite(table[l * h.n_kv_heads + g].input_scale);
        if (ok) n_params += (size_t)h.n_kv_heads * (h.arch == ARCH_MLP
            ? mlp_param_count(h.head_size, sizes[l], h.depth_backbone, h.depth_score, h.depth_target)
            : 2 * (size_t)sizes[l] * h.head_size);
    }
    size_t prompt_ints = h.n_heldout ? 2 * (size_t)h.n_heldout + 1 + h.n_heldout_tokens : 0;
    size_t expected = sizeof(h) + table_bytes + n_params * sizeof(float) + prompt_ints * sizeof(int32_t);
    if (!ok) why = "its module table is inconsistent";
    /* n_params <= size / 4 first: up to 2^62 parameters fit the header's limits, and 4 n_params would wrap */
    else if (n_params != h.n_params || n_params > size / sizeof(float) || size != expected)
        why = "its size does not match its header: it is truncated or corrupt";
    if (why || moduleset_alloc(s, h.arch, h.n_layers, h.n_kv_heads, h.head_size, h.depth_backbone,
                               h.depth_score, h.depth_target, sizes, 0) != 0) {
        fprintf(stderr, "error: %s: %s\n", path, why ? why : "its modules cannot be allocated");
        free(sizes); free(buf);
        return -1;
    }
    free(sizes);
    if (model_fp && h.model_fingerprint != model_fp) why = "it was fitted to a different model";
    else if (doc_fp && h.doc_fingerprint != doc_fp) why = "it was fitted to a different document";
    if (why) {
        fprintf(stderr, "error: %s: %s; refusing to use it\n", path, why);
        moduleset_free(s); free(buf);
        return -1;
    }
    s->n_doc = h.n_doc; s->rho = h.rho;
    s->model_fingerprint = h.model_fingerprint; s->doc_fingerprint = h.doc_fingerprint;
    for (int i = 0; i < count; i++) s->modules[i].input_scale = table[i].input_scale;
    const unsigned char *at = buf + sizeof(h) + table_bytes;
    memcpy(s->params, at, s->n_params * sizeof(float));
    at += s->n_params * sizeof(float);
    size_t bad = first_nonfinite(s->params, s->n_params);
    if (bad < s->n_params) {
        fprintf(stderr, "error: %s: parameter %zu of %zu is %g; the file is corrupt\n", path, bad, s->n_params,
                s->params[bad]);
        moduleset_free(s); free(buf);
        return -1;
    }
    if (h.n_heldout) {  /* held-out prompts: offsets must rise from 0 to the token count */
        PromptSet *p = &s->heldout;
        p->n_prompts = h.n_heldout;
        p->offsets = xmalloc((h.n_heldout + 1) * sizeof(int));
        p->tokens = xmalloc(h.n_heldout_tokens * sizeof(int));
        p->challenge = xmalloc(h.n_heldout);
        memcpy(p->offsets, at, (h.n_heldout + 1) * sizeof(int));
        at += (h.n_heldout + 1) * sizeof(int);
        memcpy(p->tokens, at, h.n_heldout_tokens * sizeof(int));
        at += h.n_heldout_tokens * sizeof(int);
        int ok_offsets = p->offsets[0] == 0 && p->offsets[h.n_heldout] == h.n_heldout_tokens;
        for (int i = 0; i < h.n_heldout; i++) {
            int32_t flag;
            memcpy(&flag, at + i * sizeof(int32_t), sizeof(flag));
            p->challenge[i] = flag != 0;
            ok_offsets &= p->offsets[i + 1] > p->offsets[i];
        }
        if (!ok_offsets) {
            fprintf(stderr, "error: %s: its held-out prompt table is corrupt\n", path);
            moduleset_free(s); free(buf);
            return -1;
        }
    }
    free(buf);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Transformer forward                                                      */

void runstate_alloc(RunState *s, const Model *m, const Document *doc, int max_block, int capacity) {
    memset(s, 0, sizeof(*s));
    const Config *c = &m->config;
    size_t B = max_block, D = c->dim, F = c->hidden_dim, H = c->n_heads;
    size_t KVD = (size_t)c->dim / c->n_heads * c->n_kv_heads;
    s->max_block = max_block;
    s->capacity = capacity;
    s->max_doc = doc && doc->mode == DOC_EXACT && doc->cache ? doc->cache->n : 0;
    size_t keys = s->max_doc > capacity ? s->max_doc : capacity;
    s->x = xmalloc(B * D * sizeof(float));
    s->xb = xmalloc(B * D * sizeof(float));
    s->q = xmalloc(B * D * sizeof(float));
    s->k = xmalloc(B * KVD * sizeof(float));
    s->v = xmalloc(B * KVD * sizeof(float));
    s->att = xmalloc(B * D * sizeof(float));
    s->doc_A = xmalloc(B * D * sizeof(float));
    s->doc_lse = xmalloc(B * H * sizeof(float));
    s->loc_A = xmalloc(B * D * sizeof(float));
    s->loc_lse = xmalloc(B * H * sizeof(float));
    s->x_mid = xmalloc(B * D * sizeof(float));
    s->xb2 = xmalloc(B * D * sizeof(float));
    s->hb = xmalloc(B * F * sizeof(float));
    s->hb2 = xmalloc(B * F * sizeof(float));
    s->hgate = xmalloc(B * F * sizeof(float));
    s->scores = xmalloc(B * keys * sizeof(float));
    s->logits = xmalloc(B * c->vocab_size * sizeof(float));
    s->key_cache = xmalloc((size_t)c->n_layers * capacity * KVD * sizeof(float));
    s->value_cache = xmalloc((size_t)c->n_layers * capacity * KVD * sizeof(float));
    if (doc && doc->mode == DOC_NECTAR) {
        s->mq = xmalloc(B * D * sizeof(float));
        s->ma = xmalloc(B * H * sizeof(float));
        s->mA = xmalloc(B * D * sizeof(float));
        modulework_alloc(&s->work, doc->modules, max_block * (c->n_heads / c->n_kv_heads));
    }
}

void runstate_free(RunState *s) {
    free(s->x); free(s->xb); free(s->q); free(s->k); free(s->v); free(s->att);
    free(s->doc_A); free(s->doc_lse); free(s->loc_A); free(s->loc_lse);
    free(s->hb); free(s->hb2); free(s->scores); free(s->logits);
    free(s->key_cache); free(s->value_cache); free(s->mq); free(s->ma); free(s->mA);
    modulework_free(&s->work);
    free(s->tap_q); free(s->tap_doc_A); free(s->tap_doc_lse);
    free(s->x_mid); free(s->xb2); free(s->hgate);
    float *grads[] = {s->saved_x, s->dx, s->dx_mid, s->dxb, s->dq, s->dk, s->dv, s->datt, s->dhb, s->dhb2,
                      s->dhgate, s->ddoc_A, s->dloc_A, s->ddoc_lse, s->dloc_lse, s->dmq, s->dma, s->dmA, s->tmp};
    for (size_t i = 0; i < sizeof(grads) / sizeof(grads[0]); i++) free(grads[i]);
    memset(s, 0, sizeof(*s));
}

void runstate_enable_backward(RunState *s, const Model *m) {
    const Config *c = &m->config;
    size_t B = s->max_block, D = c->dim, F = c->hidden_dim, H = c->n_heads;
    size_t KVD = (size_t)c->dim / c->n_heads * c->n_kv_heads;
    size_t keys = s->max_doc > s->capacity ? s->max_doc : s->capacity;
    s->saved_x = xmalloc((size_t)(c->n_layers + 1) * B * D * sizeof(float));
    float **bd[] = {&s->dx, &s->dx_mid, &s->dxb, &s->dq, &s->datt, &s->ddoc_A, &s->dloc_A, &s->dmq, &s->dmA};
    for (size_t i = 0; i < sizeof(bd) / sizeof(bd[0]); i++) *bd[i] = xmalloc(B * D * sizeof(float));
    s->dk = xmalloc(B * KVD * sizeof(float));
    s->dv = xmalloc(B * KVD * sizeof(float));
    s->dhb = xmalloc(B * F * sizeof(float));
    s->dhb2 = xmalloc(B * F * sizeof(float));
    s->dhgate = xmalloc(B * F * sizeof(float));
    s->ddoc_lse = xmalloc(B * H * sizeof(float));
    s->dloc_lse = xmalloc(B * H * sizeof(float));
    s->dma = xmalloc(B * H * sizeof(float));
    s->tmp = xmalloc(B * keys * sizeof(float));
}

void runstate_enable_taps(RunState *s, const Model *m) {
    size_t rows = (size_t)m->config.n_layers * s->max_block;
    s->tap_q = xmalloc(rows * m->config.dim * sizeof(float));
    s->tap_doc_A = xmalloc(rows * m->config.dim * sizeof(float));
    s->tap_doc_lse = xmalloc(rows * m->config.n_heads * sizeof(float));
}

/* o = w * x * r,  r = 1 / sqrt(mean(x^2) + 1e-5) */
static void rmsnorm(float *o, const float *x, const float *w, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    ss = 1.0f / sqrtf(ss / n + 1e-5f);
    for (int i = 0; i < n; i++) o[i] = w[i] * (ss * x[i]);
}

/* Backward of o = w * x * r:
 *   dx_j += r w_j do_j - (r^3 / n) x_j sum_i w_i do_i x_i,   dw_i += do_i x_i r */
static void rmsnorm_backward(float *dx, float *dw, const float *x, const float *w, const float *dout, int n) {
    float ss = 0.0f, dot = 0.0f;
    for (int i = 0; i < n; i++) { ss += x[i] * x[i]; dot += w[i] * dout[i] * x[i]; }
    float r = 1.0f / sqrtf(ss / n + 1e-5f), c = r * r * r / n * dot;
    for (int i = 0; i < n; i++) {
        dx[i] += r * w[i] * dout[i] - c * x[i];
        if (dw) dw[i] += dout[i] * x[i] * r;
    }
}

/* RoPE, llama2.c convention: each adjacent pair (v_i, v_i+1) of a head is
 * rotated by the angle pos * theta^(-(i mod d) / d), theta = 10000.
 * direction -1 rotates back: the backward of the rotation. */
static void rope(float *vec, int n, int head_size, int pos, float direction) {
    for (int i = 0; i < head_size; i += 2) {  /* one angle per pair index, shared by every head */
        float freq = 1.0f / powf(10000.0f, i / (float)head_size);
        float angle = pos * freq, fcr = cosf(angle), fci = direction * sinf(angle);
        for (int j = i; j < n; j += head_size) {
            float v0 = vec[j], v1 = vec[j + 1];
            vec[j] = v0 * fcr - v1 * fci;
            vec[j + 1] = v0 * fci + v1 * fcr;
        }
    }
}

/* The local tokens' state: causal attention of the block's queries over the
 * local keys cached so far, including their own. */
static void local_states(const Model *m, RunState *s, int l, int ntok, int pos) {
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, KVD = d * c->n_kv_heads, group = c->n_heads / c->n_kv_heads;
    size_t layer = (size_t)l * s->capacity * KVD;
    for (int h = 0; h < c->n_heads; h++) {
        size_t kv = layer + (size_t)(h / group) * d;
        attention_states(ntok, pos + ntok, d, s->q + h * d, c->dim, s->key_cache + kv,
                         s->value_cache + kv, KVD, pos + 1, s->loc_A + h * d, c->dim,
                         s->loc_lse + h, c->n_heads, s->scores);
    }
}

/* Exact: the document's state from its KV cache (no cache: the empty state). */
static void document_states_exact(const Model *m, RunState *s, const DocCache *cache, int l, int ntok) {
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, KVD = d * c->n_kv_heads, group = c->n_heads / c->n_kv_heads;
    int n = cache ? cache->n : 0;
    for (int h = 0; h < c->n_heads; h++) {
        size_t kv = ((size_t)l * n) * KVD + (size_t)(h / group) * d;
        attention_states(ntok, n, d, s->q + h * d, c->dim, n ? cache->key + kv : NULL,
                         n ? cache->value + kv : NULL, KVD, n, s->doc_A + h * d, c->dim,
                         s->doc_lse + h, c->n_heads, s->scores);
    }
}

/* Nectar: the document's state from the module of each KV head, all the
 * queries of its heads (ntok rows x group heads) in one batch. */
static void document_states_nectar(const Model *m, RunState *s, const ModuleSet *ms, int l, int ntok) {
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, group = c->n_heads / c->n_kv_heads;
    for (int g = 0; g < c->n_kv_heads; g++) {
        /* the heads of group g are adjacent: row t holds group * d floats at q + t D + g group d */
        copy_rows(s->mq, group * d, s->q + g * group * d, c->dim, ntok, group * d);
        module_forward(ms, &ms->modules[l * c->n_kv_heads + g], &s->work, s->mq, ntok * group, s->ma, s->mA);
        copy_rows(s->doc_A + g * group * d, c->dim, s->mA, group * d, ntok, group * d);
        copy_rows(s->doc_lse + g * group, c->n_heads, s->ma, group, ntok, group);
    }
}

/* Merges document and local state of every (row, head) into s->att; the
 * merged lse is not needed downstream (only A feeds the output projection). */
static void merge_rows(const Model *m, RunState *s, int ntok) {
    const Config *c = &m->config;
    int d = c->dim / c->n_heads;
    for (int t = 0; t < ntok; t++)
        for (int h = 0; h < c->n_heads; h++) {
            size_t row = (size_t)t * c->dim + h * d, head = (size_t)t * c->n_heads + h;
            float lse;
            merge_states(d, s->doc_A + row, s->doc_lse[head], s->loc_A + row, s->loc_lse[head],
                         s->att + row, &lse);
        }
}

/* The two attention paths, side by side: they differ in one line only,
 * where the document's state (A, lse) comes from. */
static void attention_exact(const Model *m, RunState *s, const Document *doc, int l, int ntok, int pos) {
    document_states_exact(m, s, doc->cache, l, ntok);     /* the document's KV cache */
    local_states(m, s, l, ntok, pos);
    merge_rows(m, s, ntok);
}

static void attention_nectar(const Model *m, RunState *s, const Document *doc, int l, int ntok, int pos) {
    document_states_nectar(m, s, doc->modules, l, ntok);  /* the document's module */
    local_states(m, s, l, ntok, pos);
    merge_rows(m, s, ntok);
}

/* One transformer layer over the block: s->x (ntok, D) in, s->x out. */
static void layer_forward(const Model *m, RunState *s, const Document *doc, int l, int ntok, int pos) {
    const Config *c = &m->config;
    const Weights *w = &m->w;
    int D = c->dim, F = c->hidden_dim, d = D / c->n_heads, KVD = d * c->n_kv_heads;
    for (int t = 0; t < ntok; t++)
        rmsnorm(s->xb + (size_t)t * D, s->x + (size_t)t * D, w->rms_att + (size_t)l * D, D);
    /* q, k, v (B, D / KVD) = xb Wq^T, xb Wk^T, xb Wv^T */
    matmul(ntok, D, D, s->xb, w->wq + (size_t)l * D * D, 0.0f, s->q);
    matmul(ntok, D, KVD, s->xb, w->wk + (size_t)l * KVD * D, 0.0f, s->k);
    matmul(ntok, D, KVD, s->xb, w->wv + (size_t)l * KVD * D, 0.0f, s->v);
    for (int t = 0; t < ntok; t++) {
        int position = doc->n + pos + t;  /* local tokens follow the document */
        rope(s->q + (size_t)t * D, D, d, position, 1.0f);
        rope(s->k + (size_t)t * KVD, KVD, d, position, 1.0f);
    }
    size_t cache_row = ((size_t)l * s->capacity + pos) * KVD;
    memcpy(s->key_cache + cache_row, s->k, (size_t)ntok * KVD * sizeof(float));
    memcpy(s->value_cache + cache_row, s->v, (size_t)ntok * KVD * sizeof(float));

    if (doc->mode == DOC_NECTAR) attention_nectar(m, s, doc, l, ntok, pos);
    else attention_exact(m, s, doc, l, ntok, pos);
    if (s->tap_q) {
        size_t row = (size_t)l * s->max_block;
        memcpy(s->tap_q + row * D, s->q, (size_t)ntok * D * sizeof(float));
        memcpy(s->tap_doc_A + row * D, s->doc_A, (size_t)ntok * D * sizeof(float));
        memcpy(s->tap_doc_lse + row * c->n_heads, s->doc_lse, (size_t)ntok * c->n_heads * sizeof(float));
    }

    /* x_mid = x + att Wo^T */
    memcpy(s->x_mid, s->x, (size_t)ntok * D * sizeof(float));
    matmul(ntok, D, D, s->att, w->wo + (size_t)l * D * D, 1.0f, s->x_mid);
    /* x = x_mid + W2 (SiLU(W1 xb2) * W3 xb2), xb2 = rmsnorm(x_mid) */
    for (int t = 0; t < ntok; t++)
        rmsnorm(s->xb2 + (size_t)t * D, s->x_mid + (size_t)t * D, w->rms_ffn + (size_t)l * D, D);
    matmul(ntok, D, F, s->xb2, w->w1 + (size_t)l * F * D, 0.0f, s->hb);
    matmul(ntok, D, F, s->xb2, w->w3 + (size_t)l * F * D, 0.0f, s->hb2);
    for (size_t i = 0; i < (size_t)ntok * F; i++) s->hgate[i] = silu(s->hb[i]) * s->hb2[i];
    memcpy(s->x, s->x_mid, (size_t)ntok * D * sizeof(float));
    matmul(ntok, F, D, s->hgate, w->w2 + (size_t)l * D * F, 1.0f, s->x);
}

int forward_check(const Model *m, const RunState *s, const Document *doc, const int *tokens, int ntok, int pos) {
    if (ntok < 1 || ntok > s->max_block || pos < 0 || pos + ntok > s->capacity) {
        fprintf(stderr, "error: %d tokens at local position %d do not fit the run state "
                "(block %d, capacity %d)\n", ntok, pos, s->max_block, s->capacity);
        return -1;
    }
    if (check_tokens(m, tokens, ntok, "forward") != 0) return -1;
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

int forward(const Model *m, RunState *s, const Document *doc, const int *tokens, int ntok, int pos,
            int logits) {
    const Config *c = &m->config;
    int D = c->dim;
    if (forward_check(m, s, doc, tokens, ntok, pos) != 0) return -1;
    s->block_pos = pos;
    s->block_ntok = ntok;
    for (int t = 0; t < ntok; t++)
        memcpy(s->x + (size_t)t * D, m->w.token_embedding + (size_t)tokens[t] * D, D * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) {
        if (s->saved_x) memcpy(s->saved_x + (size_t)l * s->max_block * D, s->x, (size_t)ntok * D * sizeof(float));
        layer_forward(m, s, doc, l, ntok, pos);
    }
    if (s->saved_x) memcpy(s->saved_x + (size_t)c->n_layers * s->max_block * D, s->x, (size_t)ntok * D * sizeof(float));
    if (logits == LOGITS_NONE) return 0;
    int first = logits == LOGITS_ALL ? 0 : ntok - 1, rows = ntok - first;
    for (int t = first; t < ntok; t++)
        rmsnorm(s->xb + (size_t)t * D, s->x + (size_t)t * D, m->w.rms_final, D);
    /* logits (rows, V) = xb Wcls^T */
    matmul(rows, D, c->vocab_size, s->xb + (size_t)first * D, m->w.wcls, 0.0f, s->logits + (size_t)first * c->vocab_size);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Backward pass: each step quotes the forward line it differentiates       */

/* Backward of local_states for a block from local position 0: causal
 * attention over the block's own keys, recomputed head by head; writes dq
 * and the block's dk, dv (GQA heads add into their KV head). */
static void local_states_backward(const Model *m, RunState *s, int l, int ntok) {
    const Config *c = &m->config;
    int D = c->dim, H = c->n_heads, d = D / H, KVD = d * c->n_kv_heads, group = H / c->n_kv_heads;
    memset(s->dq, 0, (size_t)ntok * D * sizeof(float));
    memset(s->dk, 0, (size_t)ntok * KVD * sizeof(float));
    memset(s->dv, 0, (size_t)ntok * KVD * sizeof(float));
    size_t layer = (size_t)l * s->capacity * KVD;
    for (int h = 0; h < H; h++) {
        size_t kv = layer + (size_t)(h / group) * d;
        attention_states(ntok, ntok, d, s->q + h * d, D, s->key_cache + kv, s->value_cache + kv, KVD, 1,
                         s->loc_A + h * d, D, s->loc_lse + h, H, s->scores);
        attention_states_backward(ntok, ntok, d, s->q + h * d, D, s->key_cache + kv, s->value_cache + kv, KVD,
                                  s->loc_A + h * d, s->dloc_A + h * d, D, s->dloc_lse + h, H, s->scores,
                                  s->dq + h * d, s->dk + (h / group) * d, s->dv + (h / group) * d, s->tmp);
    }
}

/* Exact: backward through the document's state into the queries (the cache
 * itself is frozen). P is recomputed head by head. */
static void document_states_exact_backward(const Model *m, RunState *s, const DocCache *cache, int l, int ntok) {
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, KVD = d * c->n_kv_heads, group = c->n_heads / c->n_kv_heads;
    int n = cache ? cache->n : 0;
    if (n == 0) return;
    for (int h = 0; h < c->n_heads; h++) {
        size_t kv = ((size_t)l * n) * KVD + (size_t)(h / group) * d;
        attention_states(ntok, n, d, s->q + h * d, c->dim, cache->key + kv, cache->value + kv, KVD, n,
                         s->doc_A + h * d, c->dim, s->doc_lse + h, c->n_heads, s->scores);
        attention_states_backward(ntok, n, d, s->q + h * d, c->dim, cache->key + kv, cache->value + kv, KVD,
                                  s->doc_A + h * d, s->ddoc_A + h * d, c->dim, s->ddoc_lse + h, c->n_heads,
                                  s->scores, s->dq + h * d, NULL, NULL, s->tmp);
    }
}

/* Nectar: backward through each module (recomputed on the same queries),
 * into its parameters and the queries. */
static void document_states_nectar_backward(const Model *m, RunState *s, const ModuleSet *ms, int l, int ntok) {
    const Config *c = &m->config;
    int d = c->dim / c->n_heads, group = c->n_heads / c->n_kv_heads;
    size_t row = (size_t)group * d;
    for (int g = 0; g < c->n_kv_heads; g++) {
        const Module *mod = &ms->modules[l * c->n_kv_heads + g];
        copy_rows(s->mq, row, s->q + g * row, c->dim, ntok, row);
        copy_rows(s->dmA, row, s->ddoc_A + g * row, c->dim, ntok, row);
        copy_rows(s->dma, group, s->ddoc_lse + g * group, c->n_heads, ntok, group);
        module_forward(ms, mod, &s->work, s->mq, ntok * group, s->ma, s->mA);
        module_backward(ms, mod, &s->work, s->mq, ntok * group, s->mA, s->dma, s->dmA, s->dmq);
        for (int t = 0; t < ntok; t++)
            for (size_t j = 0; j < row; j++) s->dq[(size_t)t * c->dim + g * row + j] += s->dmq[t * row + j];
    }
}

/* layer l's slice of a per-layer gradient tensor; NULL when not asked for */
#define LAYER(ptr, l, size) ((ptr) ? (ptr) + (size_t)(l) * (size) : NULL)

/* Backward of layer_forward: s->dx holds dL/d(output x); on return it
 * holds dL/d(input x). The layer's forward is recomputed first. */
static void layer_backward(const Model *m, RunState *s, const Document *doc, int l, int ntok, Weights *dw) {
    const Config *c = &m->config;
    const Weights *w = &m->w;
    int D = c->dim, F = c->hidden_dim, H = c->n_heads, d = D / H, KVD = d * c->n_kv_heads;
    memcpy(s->x, s->saved_x + (size_t)l * s->max_block * D, (size_t)ntok * D * sizeof(float));
    layer_forward(m, s, doc, l, ntok, 0);
    const float *x_in = s->saved_x + (size_t)l * s->max_block * D;

    /* x = x_mid + hgate W2^T */
    input_grad(ntok, F, D, s->dx, w->w2 + (size_t)l * D * F, 0.0f, s->dhgate);
    weight_grad(ntok, F, D, s->dx, s->hgate, LAYER(dw->w2, l, (size_t)D * F));
    /* hgate = SiLU(hb) * hb2 */
    for (size_t i = 0; i < (size_t)ntok * F; i++) {
        float sg = 1.0f / (1.0f + expf(-s->hb[i]));
        s->dhb2[i] = s->dhgate[i] * s->hb[i] * sg;
        s->dhb[i] = s->dhgate[i] * s->hb2[i] * sg * (1.0f + s->hb[i] * (1.0f - sg));
    }
    /* hb = xb2 W1^T, hb2 = xb2 W3^T */
    input_grad(ntok, D, F, s->dhb, w->w1 + (size_t)l * F * D, 0.0f, s->dxb);
    input_grad(ntok, D, F, s->dhb2, w->w3 + (size_t)l * F * D, 1.0f, s->dxb);
    weight_grad(ntok, D, F, s->dhb, s->xb2, LAYER(dw->w1, l, (size_t)F * D));
    weight_grad(ntok, D, F, s->dhb2, s->xb2, LAYER(dw->w3, l, (size_t)F * D));
    /* xb2 = rmsnorm(x_mid); x_mid also flows straight to x */
    memcpy(s->dx_mid, s->dx, (size_t)ntok * D * sizeof(float));
    for (int t = 0; t < ntok; t++)
        rmsnorm_backward(s->dx_mid + (size_t)t * D, LAYER(dw->rms_ffn, l, D), s->x_mid + (size_t)t * D,
                         w->rms_ffn + (size_t)l * D, s->dxb + (size_t)t * D, D);
    /* x_mid = x + att Wo^T */
    input_grad(ntok, D, D, s->dx_mid, w->wo + (size_t)l * D * D, 0.0f, s->datt);
    weight_grad(ntok, D, D, s->dx_mid, s->att, LAYER(dw->wo, l, (size_t)D * D));
    /* att = merge(document state, local state), per (row, head) */
    for (int t = 0; t < ntok; t++)
        for (int h = 0; h < H; h++) {
            size_t row = (size_t)t * D + h * d, head = (size_t)t * H + h;
            merge_states_backward(d, s->doc_A + row, s->doc_lse[head], s->loc_A + row, s->loc_lse[head],
                                  s->datt + row, s->ddoc_A + row, &s->ddoc_lse[head], s->dloc_A + row,
                                  &s->dloc_lse[head]);
        }
    local_states_backward(m, s, l, ntok);
    /* document state: the one place where the two paths differ */
    if (doc->mode == DOC_NECTAR) document_states_nectar_backward(m, s, doc->modules, l, ntok);
    else document_states_exact_backward(m, s, doc->cache, l, ntok);
    /* q, k rotated at their positions: rotate the gradients back */
    for (int t = 0; t < ntok; t++) {
        rope(s->dq + (size_t)t * D, D, d, doc->n + t, -1.0f);
        rope(s->dk + (size_t)t * KVD, KVD, d, doc->n + t, -1.0f);
    }
    /* q, k, v = xb Wq^T, xb Wk^T, xb Wv^T */
    input_grad(ntok, D, D, s->dq, w->wq + (size_t)l * D * D, 0.0f, s->dxb);
    input_grad(ntok, D, KVD, s->dk, w->wk + (size_t)l * KVD * D, 1.0f, s->dxb);
    input_grad(ntok, D, KVD, s->dv, w->wv + (size_t)l * KVD * D, 1.0f, s->dxb);
    weight_grad(ntok, D, D, s->dq, s->xb, LAYER(dw->wq, l, (size_t)D * D));
    weight_grad(ntok, D, KVD, s->dk, s->xb, LAYER(dw->wk, l, (size_t)KVD * D));
    weight_grad(ntok, D, KVD, s->dv, s->xb, LAYER(dw->wv, l, (size_t)KVD * D));
    /* xb = rmsnorm(x); x also flows straight to x_mid */
    memcpy(s->dx, s->dx_mid, (size_t)ntok * D * sizeof(float));
    for (int t = 0; t < ntok; t++)
        rmsnorm_backward(s->dx + (size_t)t * D, LAYER(dw->rms_att, l, D), x_in + (size_t)t * D,
                         w->rms_att + (size_t)l * D, s->dxb + (size_t)t * D, D);
}

int backward(const Model *m, RunState *s, const Document *doc, const int *tokens, int ntok,
             const float *dlogits, Weights *dw) {
    const Config *c = &m->config;
    int D = c->dim, V = c->vocab_size, L = c->n_layers;
    if (!s->saved_x || ntok != s->block_ntok || s->block_pos != 0) {
        fprintf(stderr, "error: backward needs a run state with backward enabled and the block just run from position 0\n");
        return -1;
    }
    Weights no_weight_grads = {0};  /* every tensor NULL: the model's gradients are skipped */
    if (!dw) dw = &no_weight_grads;
    /* logits = rmsnorm(x_L) Wcls^T */
    const float *x_final = s->saved_x + (size_t)L * s->max_block * D;
    for (int t = 0; t < ntok; t++) rmsnorm(s->xb + (size_t)t * D, x_final + (size_t)t * D, m->w.rms_final, D);
    input_grad(ntok, D, V, dlogits, m->w.wcls, 0.0f, s->dxb);
    weight_grad(ntok, D, V, dlogits, s->xb, dw->wcls);
    memset(s->dx, 0, (size_t)ntok * D * sizeof(float));
    for (int t = 0; t < ntok; t++)
        rmsnorm_backward(s->dx + (size_t)t * D, dw->rms_final, x_final + (size_t)t * D,
                         m->w.rms_final, s->dxb + (size_t)t * D, D);
    for (int l = L - 1; l >= 0; l--) layer_backward(m, s, doc, l, ntok, dw);
    /* x_0 = token_embedding[token] */
    if (dw->token_embedding)
        for (int t = 0; t < ntok; t++)
            for (int i = 0; i < D; i++) dw->token_embedding[(size_t)tokens[t] * D + i] += s->dx[(size_t)t * D + i];
    return 0;
}

int doccache_build(DocCache *dc, const Model *m, const int *tokens, int n, int block) {
    memset(dc, 0, sizeof(*dc));
    if (n < 1) {
        fprintf(stderr, "error: the document is empty\n");
        return -1;
    }
    if (check_tokens(m, tokens, n, "document") != 0) return -1;
    if (block > n) block = n;
    Document none = {DOC_EXACT, 0, NULL, NULL};
    RunState s;
    runstate_alloc(&s, m, &none, block, n);
    for (int pos = 0; pos < n; pos += block) {
        int len = n - pos < block ? n - pos : block;
        forward(m, &s, &none, tokens + pos, len, pos, LOGITS_NONE);
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
/* Evaluation                                                               */

/* log softmax of n logits, in doubles */
static void log_softmax(const float *x, int n, double *out) {
    double max = x[argmax(x, n)], sum = 0;
    for (int i = 0; i < n; i++) sum += exp(x[i] - max);
    double lse = max + log(sum);
    for (int i = 0; i < n; i++) out[i] = x[i] - lse;
}

/* KL(p || q) from log-probabilities */
static double kl_divergence(const double *logp, const double *logq, int n) {
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

int evaluate(const Model *m, const DocCache *doc, const ModuleSet *ms, const PromptSet *prompts,
             int challenge_only, EvalResult *r) {
    const Config *c = &m->config;
    int L = c->n_layers, H = c->n_heads, G = c->n_kv_heads, D = c->dim, V = c->vocab_size;
    int d = D / H, group = H / G;
    memset(r, 0, sizeof(*r));
    r->score_mse_layer = xmalloc(L * sizeof(double));
    r->target_mse_layer = xmalloc(L * sizeof(double));
    int max_len = promptset_max_len(prompts);
    if (ms->n_doc != doc->n) {
        fprintf(stderr, "error: the modules stand for a document of %d tokens, not %d\n", ms->n_doc, doc->n);
        return -1;
    }
    if (doc->n + max_len > c->seq_len) {
        fprintf(stderr, "error: document (%d) plus the longest prompt (%d) exceed the context of %d\n",
                doc->n, max_len, c->seq_len);
        return -1;
    }
    Document full = {DOC_EXACT, doc->n, doc, NULL};
    Document nectar = {DOC_NECTAR, ms->n_doc, NULL, ms};
    Document none = {DOC_EXACT, 0, NULL, NULL};
    RunState sf, sn, s0;
    runstate_alloc(&sf, m, &full, max_len, max_len);
    runstate_enable_taps(&sf, m);
    runstate_alloc(&sn, m, &nectar, max_len, max_len);
    runstate_alloc(&s0, m, &none, max_len + 1, max_len + 1);
    ModuleWork w;
    modulework_alloc(&w, ms, max_len * group);
    int *with_bos = xmalloc((max_len + 1) * sizeof(int));
    float *a = xmalloc((size_t)max_len * group * sizeof(float));
    float *A = xmalloc((size_t)max_len * group * d * sizeof(float));
    float *q = xmalloc((size_t)max_len * group * d * sizeof(float));
    double *lp_full = xmalloc(V * sizeof(double)), *lp_other = xmalloc(V * sizeof(double));
    double *rte_sum = xmalloc((size_t)L * H * sizeof(double));
    long *layer_samples = xmalloc(L * sizeof(long));
    long hits_full = 0, hits_nectar = 0, hits_nodoc = 0, agree = 0, agree_nodoc = 0;

    for (int i = 0; i < prompts->n_prompts; i++) {
        if (challenge_only && !prompts->challenge[i]) continue;
        const int *prompt = prompts->tokens + prompts->offsets[i];
        int len = prompts->offsets[i + 1] - prompts->offsets[i];
        if (check_tokens(m, prompt, len, "evaluation prompt") != 0) return -1;
        r->n_prompts++;
        forward(m, &sf, &full, prompt, len, 0, LOGITS_ALL);
        forward(m, &sn, &nectar, prompt, len, 0, LOGITS_ALL);
        /* without the document the prompt starts a sequence: BOS first, unless it has one */
        int bos = prompt[0] != 1;
        with_bos[0] = 1;
        memcpy(with_bos + bos, prompt, len * sizeof(int));
        forward(m, &s0, &none, with_bos, len + bos, 0, LOGITS_ALL);
        /* next-token predictions at positions 0 .. len-2 */
        for (int t = 0; t + 1 < len; t++) {
            const float *lf = sf.logits + (size_t)t * V, *ln = sn.logits + (size_t)t * V;
            const float *l0 = s0.logits + (size_t)(t + bos) * V;
            int top_full = argmax(lf, V), top_nectar = argmax(ln, V), top_nodoc = argmax(l0, V);
            int truth = prompt[t + 1];
            hits_full += top_full == truth;
            hits_nectar += top_nectar == truth;
            hits_nodoc += top_nodoc == truth;
            agree += top_nectar == top_full;
            agree_nodoc += top_nodoc == top_full;
            log_softmax(lf, V, lp_full);
            log_softmax(ln, V, lp_other);
            r->kl += kl_divergence(lp_full, lp_other, V);
            log_softmax(l0, V, lp_other);
            r->kl_nodoc += kl_divergence(lp_full, lp_other, V);
            r->n_positions++;
        }
        /* the modules on the teacher's queries, against the exact document state */
        for (int l = 0; l < L; l++)
            for (int g = 0; g < G; g++) {
                const float *tq = sf.tap_q + (size_t)l * max_len * D;
                const float *tA = sf.tap_doc_A + (size_t)l * max_len * D;
                const float *tlse = sf.tap_doc_lse + (size_t)l * max_len * H;
                copy_rows(q, group * d, tq + g * group * d, D, len, group * d);
                module_forward(ms, &ms->modules[l * G + g], &w, q, len * group, a, A);
                for (int t = 0; t < len; t++)
                    for (int j = 0; j < group; j++) {
                        int h = g * group + j;
                        size_t row = (size_t)t * group + j;
                        const float *Aref = tA + (size_t)t * D + h * d, *qh = q + row * d;
                        double da = a[row] - tlse[(size_t)t * H + h], err = 0, base = 0;
                        for (int k = 0; k < d; k++) {
                            double e = A[row * d + k] - Aref[k], b = qh[k] - Aref[k];
                            err += e * e;
                            base += b * b;
                        }
                        r->score_mse_layer[l] += da * da;
                        r->target_mse_layer[l] += err;
                        /* log(||A_theta - A||^2 / ||q - A||^2), guarded against log 0 */
                        rte_sum[l * H + h] += log((err + 1e-30) / (base + 1e-30));
                        layer_samples[l]++;
                    }
            }
    }
    if (r->n_positions > 0) {
        double n = r->n_positions;
        r->acc_full = hits_full / n; r->acc_nectar = hits_nectar / n; r->acc_nodoc = hits_nodoc / n;
        r->agree = agree / n; r->agree_nodoc = agree_nodoc / n;
        r->kl /= n; r->kl_nodoc /= n;
        long total = 0;
        double log_rte = 0;
        for (int l = 0; l < L; l++) {
            r->score_mse += r->score_mse_layer[l];
            r->target_mse += r->target_mse_layer[l];
            total += layer_samples[l];
            r->score_mse_layer[l] /= layer_samples[l];
            r->target_mse_layer[l] /= layer_samples[l];
            /* each (layer, head) has layer_samples[l] / H queries */
            for (int h = 0; h < H; h++) log_rte += rte_sum[l * H + h] / (layer_samples[l] / H);
        }
        r->score_mse /= total;
        r->target_mse /= total;
        r->rte = exp(log_rte / (L * H));
        r->n_queries = total;
    }
    free(with_bos); free(a); free(A); free(q); free(lp_full); free(lp_other); free(rte_sum); free(layer_samples);
    modulework_free(&w);
    runstate_free(&sf); runstate_free(&sn); runstate_free(&s0);
    if (!isfinite(r->kl) || !isfinite(r->score_mse) || !isfinite(r->target_mse) || !isfinite(r->rte)) {
        fprintf(stderr, "error: the modules' outputs on the held-out prompts are not finite (KL %g, score MSE %g, "
                "target MSE %g): they diverged in fitting or are corrupt\n", r->kl, r->score_mse, r->target_mse);
        evalresult_free(r);
        return -1;
    }
    return 0;
}

void evalresult_free(EvalResult *r) {
    free(r->score_mse_layer); free(r->target_mse_layer);
    memset(r, 0, sizeof(*r));
}

void print_eval_table(FILE *f, const char *title, const EvalResult *r, int n_layers) {
    fprintf(f, "%s: %d prompts, %d next-token positions\n", title, r->n_prompts, r->n_positions);
    fprintf(f, "  %-26s %10s %10s %10s\n", "", "full cache", "Nectar", "no doc");
    fprintf(f, "  %-26s %10.4f %10.4f %10.4f\n", "token accuracy", r->acc_full, r->acc_nectar, r->acc_nodoc);
    fprintf(f, "  %-26s %10s %10.2f %10.2f\n", "gap to full cache (pp)", "",
            100 * (r->acc_full - r->acc_nectar), 100 * (r->acc_full - r->acc_nodoc));
    fprintf(f, "  %-26s %10s %10.4f %10.4f\n", "top-1 agreement with full", "", r->agree, r->agree_nodoc);
    fprintf(f, "  %-26s %10s %10.4f %10.4f\n", "mean KL(full || model)", "", r->kl, r->kl_nodoc);
    fprintf(f, "  module fit on the teacher's queries (%ld evaluations):\n", r->n_queries);
    fprintf(f, "    score MSE %.4g   target MSE %.4g   relative transport error %.4g\n",
            r->score_mse, r->target_mse, r->rte);
    fprintf(f, "    %-6s %12s %12s\n", "layer", "score MSE", "target MSE");
    for (int l = 0; l < n_layers; l++)
        fprintf(f, "    %-6d %12.4g %12.4g\n", l, r->score_mse_layer[l], r->target_mse_layer[l]);
}

void print_eval_json(FILE *f, const EvalResult *r) {
    fprintf(f, "{\"n_prompts\": %d, \"n_positions\": %d, \"acc_full\": %.6f, \"acc_nectar\": %.6f, "
            "\"acc_nodoc\": %.6f, \"gap_pp\": %.4f, \"agree\": %.6f, \"agree_nodoc\": %.6f, "
            "\"kl\": %.6g, \"kl_nodoc\": %.6g, \"score_mse\": %.6g, \"target_mse\": %.6g, \"rte\": %.6g}",
            r->n_prompts, r->n_positions, r->acc_full, r->acc_nectar, r->acc_nodoc,
            100 * (r->acc_full - r->acc_nectar), r->agree, r->agree_nodoc, r->kl, r->kl_nodoc,
            r->score_mse, r->target_mse, r->rte);
}

/* ------------------------------------------------------------------------ */
/* Sampling: greedy, temperature, top-p (as llama2.c)                       */

int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

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

/* ------------------------------------------------------------------------ */
/* Tokenizer: llama2.c tokenizer.bin, byte pair encoding                    */
/* File format (native little-endian): int32 max_token_length, then for every
 * token: float32 score, int32 length, `length` bytes (no NUL). The number of
 * tokens is not stored; the caller passes it, or 0 to read to end of file.
 * encode/decode reproduce the behaviour of llama2.c's run.c. */

#define MAX_TOKEN_BYTES (1 << 20) /* sanity limit for the max_token_length header */

typedef struct { const char *str; int id; } SortEntry;

static int cmp_entry(const void *a, const void *b) {
    const SortEntry *x = a, *y = b;
    int c = strcmp(x->str, y->str);
    return c ? c : (x->id > y->id) - (x->id < y->id); /* equal strings: lower id first */
}

/* Binary search for str in the sorted vocab; its id, or -1 if absent. */
static int lookup(const Tokenizer *t, const char *str) {
    size_t lo = 0, hi = (size_t)t->vocab_size;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(str, t->vocab[t->sorted_ids[mid]]);
        if (c < 0) hi = mid;
        else if (c > 0) lo = mid + 1;
        else return t->sorted_ids[mid];
    }
    return -1;
}

void tokenizer_free(Tokenizer *t) {
    for (int i = 0; t->vocab && i < t->vocab_size; i++) free(t->vocab[i]);
    free(t->vocab);
    free(t->scores);
    free(t->sorted_ids);
    t->vocab = NULL; t->scores = NULL; t->sorted_ids = NULL;
    t->vocab_size = 0;
}

int tokenizer_load(Tokenizer *t, const char *path, int vocab_size) {
    char err[160] = "could not be loaded: out of memory";
    int cap = 0;
    int32_t mtl, len;
    float score;
    memset(t, 0, sizeof *t);
    for (int i = 0; i < 256; i++) t->byte_pieces[2 * i] = (unsigned char)i; /* 2*i+1 stays 0 */
    if (vocab_size < 0) {
        fprintf(stderr, "error: cannot load tokenizer %s with a negative vocab_size (%d)\n", path, vocab_size);
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open tokenizer file %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (fread(&mtl, 1, 4, f) != 4) { snprintf(err, sizeof err, "is too short to hold its 4-byte header"); goto fail; }
    if (mtl < 0 || mtl > MAX_TOKEN_BYTES) {
        snprintf(err, sizeof err, "has an implausible max_token_length of %ld", (long)mtl);
        goto fail;
    }
    t->max_token_length = mtl;
    while (vocab_size == 0 || t->vocab_size < vocab_size) {
        int i = t->vocab_size;
        size_t got = fread(&score, 1, 4, f);
        if (got == 0 && vocab_size == 0 && !ferror(f)) break; /* clean end of file */
        if (got == 0 && !ferror(f)) {
            snprintf(err, sizeof err, "has only %d entries but %d were requested", i, vocab_size);
            goto fail;
        }
        if (got != 4 || fread(&len, 1, 4, f) != 4) {
            snprintf(err, sizeof err, "is truncated inside entry %d", i);
            goto fail;
        }
        if (len < 0 || len > mtl) {
            snprintf(err, sizeof err, "has entry %d with length %ld, outside 0..max_token_length (%ld)",
                     i, (long)len, (long)mtl);
            goto fail;
        }
        if (i == cap) { /* grow both arrays */
            if (cap > INT_MAX / 2) goto fail;
            int ncap = cap ? cap * 2 : 1024;
            char **v = realloc(t->vocab, (size_t)ncap * sizeof *v);
            if (!v) goto fail;
            t->vocab = v;
            float *s = realloc(t->scores, (size_t)ncap * sizeof *s);
            if (!s) goto fail;
            t->scores = s;
            cap = ncap;
        }
        char *str = malloc((size_t)len + 1);
        if (!str) goto fail;
        t->vocab[i] = str;
        t->scores[i] = score;
        t->vocab_size++; /* counted now so that tokenizer_free releases it */
        if (fread(str, 1, (size_t)len, f) != (size_t)len) {
            snprintf(err, sizeof err, "is truncated inside entry %d", i);
            goto fail;
        }
        str[len] = '\0';
    }
    if (t->vocab_size == 0) { snprintf(err, sizeof err, "contains no token entries"); goto fail; }
    /* sort ids by token string once, for binary search in encode */
    SortEntry *tmp = malloc((size_t)t->vocab_size * sizeof *tmp);
    t->sorted_ids = malloc((size_t)t->vocab_size * sizeof *t->sorted_ids);
    if (!tmp || !t->sorted_ids) { free(tmp); goto fail; }
    for (int i = 0; i < t->vocab_size; i++) { tmp[i].str = t->vocab[i]; tmp[i].id = i; }
    qsort(tmp, (size_t)t->vocab_size, sizeof *tmp, cmp_entry);
    for (int i = 0; i < t->vocab_size; i++) t->sorted_ids[i] = tmp[i].id;
    free(tmp);
    fclose(f);
    return 0;
fail:
    fclose(f);
    fprintf(stderr, "error: tokenizer file %s %s\n", path, err);
    tokenizer_free(t);
    return -1;
}

/* Byte-fallback token for byte b: ids 0..2 are <unk>, <s>, </s>, so bytes start at 3. */
static int byte_token(const Tokenizer *t, unsigned char b) {
    return b + 3 < t->vocab_size ? b + 3 : -1;
}

int tokenizer_encode(const Tokenizer *t, const char *text, int bos, int eos, int *tokens, int max_tokens) {
    if (!text) { fprintf(stderr, "error: cannot encode a NULL string\n"); return -1; }
    size_t len = strlen(text);
    if (len > INT_MAX - 3) { fprintf(stderr, "error: text of %zu bytes is too long to encode\n", len); return -1; }
    /* at most BOS + dummy prefix + one token per byte + EOS */
    int *buf = malloc((len + 3) * sizeof *buf);
    /* room for two concatenated tokens, or one 4-byte code point, plus NUL */
    char *str = malloc((size_t)t->max_token_length * 2 + 5);
    int n = 0, ret = -1, id;
    if (!buf || !str) { fprintf(stderr, "error: out of memory while encoding\n"); goto done; }

    if (bos) buf[n++] = 1;
    if (len > 0) { /* sentencepiece's add_dummy_prefix */
        id = lookup(t, " ");
        if (id < 0 && (id = byte_token(t, ' ')) < 0) goto no_bytes; /* llama2.c would store -1 */
        buf[n++] = id;
    }
    /* one token per UTF-8 code point: a byte plus the continuation bytes (10xxxxxx)
       after it, at most 4 bytes; unknown code points fall back to one token per byte */
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0, k; i < len; i += k) {
        for (k = 1; k < 4 && i + k < len && (p[i + k] & 0xC0) == 0x80; k++) {}
        memcpy(str, p + i, k);
        str[k] = '\0';
        if ((id = lookup(t, str)) >= 0) { buf[n++] = id; continue; }
        for (size_t j = 0; j < k; j++) {
            if ((id = byte_token(t, p[i + j])) < 0) goto no_bytes;
            buf[n++] = id;
        }
    }
    /* a token joins at most max_token_length tokens of one or more bytes: refuse what
       cannot fit now, not after the merging, which takes time quadratic in n */
    int nonempty = 0;
    for (int i = 0; i < n; i++) nonempty += t->vocab[buf[i]][0] != '\0';
    int at_least = t->max_token_length > 0 ? (nonempty + t->max_token_length - 1) / t->max_token_length : 0;
    if (at_least + (eos != 0) > max_tokens) {
        fprintf(stderr, "error: the text encodes to at least %d tokens; only %d fit in the model's context\n",
                at_least + (eos != 0), max_tokens);
        goto done;
    }
    /* BPE: repeatedly merge the adjacent pair whose concatenation is in the vocab with
       the highest score (leftmost on ties), until no pair is in the vocab */
    for (;;) {
        float best_score = -1e10f;
        int best_id = -1, best_i = -1;
        for (int i = 0; i + 1 < n; i++) {
            size_t la = strlen(t->vocab[buf[i]]);
            memcpy(str, t->vocab[buf[i]], la);
            strcpy(str + la, t->vocab[buf[i + 1]]);
            id = lookup(t, str);
            if (id >= 0 && t->scores[id] > best_score) { best_score = t->scores[id]; best_id = id; best_i = i; }
        }
        if (best_i < 0) break;
        buf[best_i] = best_id;
        memmove(buf + best_i + 1, buf + best_i + 2, (size_t)(n - best_i - 2) * sizeof *buf);
        n--;
    }
    if (eos) buf[n++] = 2;
    if (n > max_tokens) {
        fprintf(stderr, "error: the text encodes to %d tokens; only %d fit in the model's context\n", n, max_tokens);
        goto done;
    }
    if (n > 0) memcpy(tokens, buf, (size_t)n * sizeof *buf);
    ret = n;
    goto done;
no_bytes:
    fprintf(stderr, "error: byte fallback needs token ids 3..258 but the vocab has only %d entries\n", t->vocab_size);
done:
    free(buf);
    free(str);
    return ret;
}

const char *tokenizer_decode(const Tokenizer *t, int prev_token, int token) {
    if (token < 0 || token >= t->vocab_size) return NULL;
    const char *piece = t->vocab[token];
    if (prev_token == 1 && piece[0] == ' ') piece++; /* sentencepiece strips the space after BOS */
    unsigned char byte; /* raw byte tokens look like "<0x0A>" */
    if (sscanf(piece, "<0x%02hhX>", &byte) == 1) piece = (const char *)t->byte_pieces + 2 * byte;
    return piece;
}

int read_token_ids(const char *path, int **ids) {
    *ids = NULL;
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "error: cannot open token id file %s: %s\n", path, strerror(errno)); return -1; }
    int n = 0, cap = 64, line = 1, c, ret = -1;
    int *a = malloc((size_t)cap * sizeof *a);
    char word[64];
    if (!a) { fprintf(stderr, "error: out of memory reading %s\n", path); goto done; }
    for (;;) {
        while ((c = fgetc(f)) != EOF && isspace(c)) line += c == '\n';
        if (c == EOF) break;
        size_t k = 0;
        int bad = 0;
        for (; c != EOF && !isspace(c); c = fgetc(f)) {
            if (c == '\0' || k == sizeof word - 1) bad = 1; /* NUL byte or absurdly long word */
            else word[k++] = (char)c;
        }
        word[k] = '\0';
        char *end;
        errno = 0;
        long v = strtol(word, &end, 10);
        if (bad || end == word || *end || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
            fprintf(stderr, "error: %s line %d: item %d (\"%s%s\") is not an integer\n",
                    path, line, n + 1, word, bad ? "..." : "");
            goto done;
        }
        if (n == cap) {
            int *b = cap <= INT_MAX / 2 ? realloc(a, (size_t)cap * 2 * sizeof *a) : NULL;
            if (!b) { fprintf(stderr, "error: out of memory reading %s\n", path); goto done; }
            a = b;
            cap *= 2;
        }
        a[n++] = (int)v;
        line += c == '\n';
    }
    if (ferror(f)) { fprintf(stderr, "error: read error in token id file %s\n", path); goto done; }
    *ids = a;
    a = NULL;
    ret = n;
done:
    free(a);
    fclose(f);
    return ret;
}
