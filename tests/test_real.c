/* test_real.c - SmolLM2-135M-Instruct, read from its GGUF file by the
 * project's loader, against the independent float64 numpy reference of
 * tests/smollm2_reference.py (the gguf package's dequantization, a forward
 * written from the model's definition):
 *
 *     tests/test_real MODEL.gguf DATA_DIR      (make test-real)
 *
 * - every tensor's dequantization (sums, a position-weighted sum and its
 *   first values, tests/data/smollm2_tensors.txt), and where the loader put
 *   it in the model;
 * - the logits of two prompts (a chat turn, a text with digits), all 49152
 *   at the last position and a subset at every position of prompt and
 *   greedy continuation, within 1e-3 + 1e-4 |ref|; the greedy tokens;
 * - the tokenizer read from the same file: the prompts' texts encode to the
 *   ids the reference was given, the chat one through the chat template.
 * The last line is "N passed, M failed"; the exit status is non-zero on any
 * failure.
 */
#include "../nectar.h"
#include "../src/formats.h"
#include "../src/gguf.h"
#include "../src/tokenizer.h"
#include "../src/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/check.h"

/* ------------------------------------------------------------------------ */
/* Tensors                                                                  */

/* Where the loader should have put the GGUF tensor `name`: a pointer into
 * the model's weights, written here from the names' meaning (not from the
 * loader's own table). NULL for a name this test does not know. */
static const float *model_place(const Model *m, const char *name) {
    const Config *c = &m->config;
    const Weights *w = &m->w;
    size_t D = c->dim, F = c->hidden_dim, KVD = (size_t)c->dim / c->n_heads * c->n_kv_heads;
    int l;
    char part[32];
    if (!strcmp(name, "token_embd.weight")) return w->token_embedding;
    if (!strcmp(name, "output_norm.weight")) return w->rms_final;
    if (sscanf(name, "blk.%d.%31[a-z_].weight", &l, part) != 2 || l < 0 || l >= c->n_layers) return NULL;
    if (!strcmp(part, "attn_norm")) return w->rms_att + l * D;
    if (!strcmp(part, "attn_q")) return w->wq + l * D * D;
    if (!strcmp(part, "attn_k")) return w->wk + l * KVD * D;
    if (!strcmp(part, "attn_v")) return w->wv + l * KVD * D;
    if (!strcmp(part, "attn_output")) return w->wo + l * D * D;
    if (!strcmp(part, "ffn_norm")) return w->rms_ffn + l * D;
    if (!strcmp(part, "ffn_gate")) return w->w1 + l * F * D;  /* W1: SiLU's input */
    if (!strcmp(part, "ffn_up")) return w->w3 + l * F * D;
    if (!strcmp(part, "ffn_down")) return w->w2 + l * D * F;
    return NULL;
}

/* One line of smollm2_tensors.txt against gguf_dequantize and the model. */
static int check_tensor(const GgufFile *g, const Model *m, const char *name, double sum, double sumsq, double wsum,
                        const float x[4], double *worst) {
    const GgufTensor *t = gguf_find_tensor(g, name);
    if (!t) return 0;
    float *v = xmalloc(t->n_elements * sizeof(float));
    int ok = gguf_dequantize(t, v, t->n_elements) == 0;
    double s = 0, s2 = 0, ws = 0;
    for (size_t i = 0; i < t->n_elements; i++) {
        s += v[i];
        s2 += (double)v[i] * v[i];
        ws += (double)v[i] * (i % 1009);
    }
    /* each value within one rounding of the reference's: |err| <= 2^-23 |x|,
     * so with B = sqrt(n SUMSQ) >= sum |x| the sums are within 1e-6 B */
    double B = sqrt((double)t->n_elements * sumsq);
    ok &= fabs(s - sum) <= 1e-6 * B && fabs(ws - wsum) <= 1e-6 * 1009 * B && fabs(s2 - sumsq) <= 1e-6 * sumsq;
    const float *place = model_place(m, name);
    for (int k = 0; k < 4; k++) ok &= fabs(v[k] - x[k]) <= 1e-6 * fabs(x[k]) && place && place[k] == v[k];
    double rel = B > 0 ? fabs(s - sum) / B : 0;
    if (rel > *worst) *worst = rel;
    free(v);
    return ok;
}

static void test_tensors_match_gguf_package(const char *model_path, const char *dir, const Model *m) {
    printf("every tensor against the gguf package's dequantization, and its place in the model\n");
    char path[512], name[128], type[16];
    snprintf(path, sizeof path, "%s/smollm2_tensors.txt", dir);
    FILE *f = fopen(path, "r");
    GgufFile g;
    if (!f || gguf_open(&g, model_path) != 0) { check("the fixture and the model open", 0); if (f) fclose(f); return; }
    int n = 0, good = 0, ndim;
    double worst = 0;
    while (fscanf(f, "%127s %15s %d", name, type, &ndim) == 3) {
        long long dim;
        for (int k = 0; k < ndim; k++) if (fscanf(f, "%lld", &dim) != 1) break;
        double sum, sumsq, wsum;
        float x[4];
        if (fscanf(f, "%lf %lf %lf %f %f %f %f", &sum, &sumsq, &wsum, &x[0], &x[1], &x[2], &x[3]) != 7) break;
        n++;
        int ok = check_tensor(&g, m, name, sum, sumsq, wsum, x, &worst);
        if (!ok && n - good <= 3) printf("    %s (%s): differs\n", name, type);
        good += ok;
    }
    fclose(f);
    gguf_close(&g);
    printf("    %d of %d tensors agree; worst |sum - ref| / sqrt(n sumsq) %.2e\n", good, n, worst);
    check("272 tensors: dequantized as the gguf package does, in their places", n == 272 && good == n);
}

/* ------------------------------------------------------------------------ */
/* Logits, greedy tokens, tokenizer                                         */

typedef struct {
    int n_prompt, prompt[64];   /* K prompt ids */
    int n_greedy, greedy[32];   /* M greedy ids */
    int n_subset, subset[128];  /* S vocabulary ids */
    double *logits;             /* (K + M - 1, S) at the subset, after each fed token */
    float *last;                /* (V) every logit at position K - 1 */
} Reference;

/* "KIND COUNT v..." lines into ints */
static int read_ints(FILE *f, const char *kind, int *out, int cap, int *n) {
    char word[16];
    if (fscanf(f, "%15s %d", word, n) != 2 || strcmp(word, kind) || *n < 1 || *n > cap) return -1;
    for (int i = 0; i < *n; i++) if (fscanf(f, "%d", &out[i]) != 1) return -1;
    return 0;
}

static int reference_load(Reference *r, const char *dir, const char *name, int V) {
    char path[512], word[16];
    memset(r, 0, sizeof(*r));
    snprintf(path, sizeof path, "%s/smollm2_%s.expect", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = read_ints(f, "prompt", r->prompt, 64, &r->n_prompt) == 0 &&
             read_ints(f, "greedy", r->greedy, 32, &r->n_greedy) == 0;
    double margin;  /* margins are for reading a failure; the ids must match */
    int n_margin;
    ok = ok && fscanf(f, "%15s %d", word, &n_margin) == 2;
    for (int i = 0; ok && i < n_margin; i++) ok = fscanf(f, "%lf", &margin) == 1;
    ok = ok && read_ints(f, "subset", r->subset, 128, &r->n_subset) == 0;
    int rows = r->n_prompt + r->n_greedy - 1;
    r->logits = xmalloc((size_t)rows * r->n_subset * sizeof(double));
    for (int t = 0; ok && t < rows; t++) {
        int pos, count;
        ok = fscanf(f, "%15s %d %d", word, &pos, &count) == 3 && pos == t && count == r->n_subset;
        for (int j = 0; ok && j < count; j++) ok = fscanf(f, "%lf", &r->logits[(size_t)t * count + j]) == 1;
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/smollm2_%s.last.f32", dir, name);
    r->last = xmalloc((size_t)V * sizeof(float));
    f = ok ? fopen(path, "rb") : NULL;
    ok = f && fread(r->last, sizeof(float), V, f) == (size_t)V && fgetc(f) == EOF;
    if (f) fclose(f);
    return ok ? 0 : -1;
}

static void reference_free(Reference *r) { free(r->logits); free(r->last); }

/* The model's logits at the reference's subset ids, row by row. */
static void gather_subset(const float *logits, const Reference *r, float *out) {
    for (int j = 0; j < r->n_subset; j++) out[j] = logits[r->subset[j]];
}

/* The prompt in one block, then greedy decoding token by token with the KV
 * cache: logits and tokens against the reference. */
static void test_logits_match_numpy_reference(const Model *m, const Reference *r, const char *name) {
    int V = m->config.vocab_size, K = r->n_prompt, M = r->n_greedy, S = r->n_subset;
    char what[96];
    RunState s;
    runstate_alloc(&s, m, &NO_DOCUMENT, K, K + M);
    forward(m, &s, &NO_DOCUMENT, r->prompt, K, 0, LOGITS_ALL);
    float *got = xmalloc((size_t)(K + M) * S * sizeof(float));
    for (int t = 0; t < K; t++) gather_subset(s.logits + (size_t)t * V, r, got + (size_t)t * S);
    snprintf(what, sizeof what, "%s: all %d logits at the last prompt position", name, V);
    check_close_f(what, s.logits + (size_t)(K - 1) * V, r->last, V, 1e-3, 1e-4);
    int same = 1, tokens[32];
    const float *last = s.logits + (size_t)(K - 1) * V;
    for (int i = 0; i < M; i++) {
        tokens[i] = argmax(last, V);
        same &= tokens[i] == r->greedy[i];
        if (i + 1 == M) break;
        forward(m, &s, &NO_DOCUMENT, &r->greedy[i], 1, K + i, LOGITS_LAST);  /* the reference's path */
        last = s.logits;
        gather_subset(last, r, got + (size_t)(K + i) * S);
    }
    snprintf(what, sizeof what, "%s: subset logits, prefill and %d decode steps", name, M - 1);
    check_close(what, got, r->logits, (size_t)(K + M - 1) * S, 1e-3, 1e-4);
    printf("    greedy:");
    for (int i = 0; i < M; i++) printf(" %d", tokens[i]);
    printf("\n");
    snprintf(what, sizeof what, "%s: the reference's %d greedy tokens", name, M);
    check(what, same);
    free(got);
    runstate_free(&s);
}

/* The prompt's text through the tokenizer (and the chat template) gives the
 * ids the reference was given. */
static void test_encoding(const Tokenizer *tok, const Reference *r, const char *name, const char *text, int chat) {
    int n, *ids = encode_prompt(tok, text, chat, 0, 1 << 20, &n);
    char what[96];
    snprintf(what, sizeof what, "%s: the text %sencodes to the reference's %d ids", name,
             chat ? "in the chat template " : "", r->n_prompt);
    check(what, ids && n == r->n_prompt && !memcmp(ids, r->prompt, n * sizeof(int)));
    free(ids);
}

/* The greedy answer up to the end of the turn, decoded to text. */
static void test_answer_decodes(const Tokenizer *tok, const Reference *r, const char *want) {
    char text[512] = "";
    size_t len = 0;
    for (int i = 0; i < r->n_greedy && r->greedy[i] != tok->eos_id; i++) {
        const char *piece = tokenizer_decode(tok, i ? r->greedy[i - 1] : -1, r->greedy[i]);
        size_t k = piece ? strlen(piece) : 0;
        if (len + k < sizeof text) { memcpy(text + len, piece, k); len += k; text[len] = 0; }
    }
    printf("    answer: \"%s\"\n", text);
    check("the chat answer, to the end of the turn, decodes to the reference's text", !strcmp(text, want));
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf DATA_DIR\n", argv[0]);
        return 1;
    }
    Model m;
    Tokenizer tok;
    double t0 = now_seconds();
    if (model_load(&m, argv[1]) != 0 || tokenizer_load(&tok, argv[1], m.config.vocab_size) != 0) return 1;
    const Config *c = &m.config;
    printf("%s: dim %d, hidden %d, %d layers, %d/%d heads, vocabulary %d, context %d, RoPE base %g, eps %g "
           "(loaded in %.1f s)\n", argv[1], c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
           c->vocab_size, c->seq_len, c->rope_theta, c->norm_eps, now_seconds() - t0);
    check("SmolLM2-135M's shape, RoPE base 100000, eps 1e-5, tied embeddings",
          c->dim == 576 && c->hidden_dim == 1536 && c->n_layers == 30 && c->n_heads == 9 && c->n_kv_heads == 3 &&
          c->vocab_size == 49152 && c->seq_len == 8192 && c->rope_theta == 100000.0f && c->norm_eps == 1e-5f &&
          m.shared_classifier);
    test_tensors_match_gguf_package(argv[1], argv[2], &m);
    struct { const char *name, *text; int chat; } prompts[2] = {
        {"chat", "What is the capital of France?", 1},
        {"text", "The Apache License, Version 2.0, January 2004. Licensed under the Apache License; you may not "
                 "use this file except in compliance with the License. 1234", 0}};
    for (int k = 0; k < 2; k++) {
        printf("%s prompt\n", prompts[k].name);
        Reference r;
        if (reference_load(&r, argv[2], prompts[k].name, c->vocab_size) != 0) {
            check("the reference fixture reads", 0);
            reference_free(&r);
            continue;
        }
        test_encoding(&tok, &r, prompts[k].name, prompts[k].text, prompts[k].chat);
        test_logits_match_numpy_reference(&m, &r, prompts[k].name);
        if (prompts[k].chat) test_answer_decodes(&tok, &r, "The capital of France is Paris.");
        reference_free(&r);
    }
    tokenizer_free(&tok);
    model_free(&m);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
