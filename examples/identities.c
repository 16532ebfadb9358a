/* identities.c - the core lifted out, checking the method's identities.
 * Built from the core's files alone (no model files, tokenizers, evaluation
 * or command line), as README's "Lifting the core out" builds it:
 *
 *   cc -O2 -fopenmp-simd examples/identities.c $CORE $(pkg-config --cflags --libs openblas) -lm -pthread
 *
 * (CORE: README's list of the core's .c files) and checks the method's three identities on a small random model made in
 * memory:
 *   1. merge: the state (A, lse) of all keys is the merge of the states of
 *      any split of them, in either order;
 *   2. gate: with a non-empty local set, g A_doc + (1 - g) A_loc with
 *      g = sigmoid(a_doc - lse_loc) is the merge's A;
 *   3. oracle: quadrature modules of p = n pairs holding the document's own
 *      keys and values (W = K, Z = V) stand in for its KV cache exactly: the
 *      Nectar path's logits are the exact path's, through prefill and decode.
 * The last line is "N passed, M failed"; the exit status is non-zero on any
 * failure.
 */
#include "../nectar.h"
#include "../src/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"  /* check, check_close_f, fill_normal */

/* 1. One query over nk keys, and over the keys [0, split) and [split, nk)
 * merged both ways round. */
static void test_merge_identity(int nk, int split, int d, uint64_t seed) {
    uint64_t rng = seed;
    float *q = xmalloc(d * sizeof(float)), *k = xmalloc((size_t)nk * d * sizeof(float));
    float *v = xmalloc((size_t)nk * d * sizeof(float)), *scores = xmalloc(nk * sizeof(float));
    float *A = xmalloc(d * sizeof(float)), *A1 = xmalloc(d * sizeof(float)), *A2 = xmalloc(d * sizeof(float));
    float *merged = xmalloc(d * sizeof(float)), lse, lse1, lse2, lse_merged;
    fill_normal(q, d, 2.0f, &rng);
    fill_normal(k, (size_t)nk * d, 1.0f, &rng);
    fill_normal(v, (size_t)nk * d, 1.0f, &rng);
    attention_states(1, nk, d, q, d, k, v, d, nk, A, d, &lse, 1, scores);
    attention_states(1, split, d, q, d, k, v, d, split, A1, d, &lse1, 1, scores);
    attention_states(1, nk - split, d, q, d, k + (size_t)split * d, v + (size_t)split * d, d, nk - split, A2, d,
                     &lse2, 1, scores);
    char what[96];
    for (int order = 0; order < 2; order++) {
        if (order == 0) merge_states(d, A1, lse1, A2, lse2, merged, &lse_merged);
        else merge_states(d, A2, lse2, A1, lse1, merged, &lse_merged);
        snprintf(what, sizeof what, "merge: %d keys = %d then %d merged (%s), A", nk, split, nk - split,
                 order == 0 ? "in order" : "reversed");
        check_close_f(what, merged, A, d, 1e-6, 1e-5);
        snprintf(what, sizeof what, "merge: %d keys = %d then %d merged (%s), lse", nk, split, nk - split,
                 order == 0 ? "in order" : "reversed");
        check_close_f(what, &lse_merged, &lse, 1, 1e-6, 1e-6);
    }
    float *bufs[] = {q, k, v, scores, A, A1, A2, merged};
    for (int i = 0; i < 8; i++) free(bufs[i]);
}

/* 2. The gate form against the merge, at a log-mass gap of `gap`. */
static void test_gate_identity(int d, float gap, uint64_t seed) {
    uint64_t rng = seed;
    float *A_doc = xmalloc(d * sizeof(float)), *A_loc = xmalloc(d * sizeof(float));
    float *gated = xmalloc(d * sizeof(float)), *merged = xmalloc(d * sizeof(float)), lse;
    fill_normal(A_doc, d, 1.0f, &rng);
    fill_normal(A_loc, d, 1.0f, &rng);
    float lse_loc = 3.0f * rng_normal(&rng), a_doc = lse_loc + gap;
    gate_merge(d, A_doc, a_doc, A_loc, lse_loc, gated);
    merge_states(d, A_doc, a_doc, A_loc, lse_loc, merged, &lse);
    char what[96];
    snprintf(what, sizeof what, "gate = merge, a_doc - lse_loc = %g", gap);
    check_close_f(what, gated, merged, d, 1e-6, 1e-5);
    free(A_doc); free(A_loc); free(gated); free(merged);
}

/* Runs the prompt after doc (prefill of n_prompt tokens, then `decode`
 * tokens one at a time) and keeps every logit row: (n_prompt + decode, V). */
static float *run_logits(const Model *m, const Document *doc, const int *tokens, int n_prompt, int decode) {
    int V = m->config.vocab_size, n = n_prompt + decode;
    float *logits = xmalloc((size_t)n * V * sizeof(float));
    RunState s;
    runstate_alloc(&s, m, doc, n_prompt, n);
    if (forward(m, &s, doc, tokens, n_prompt, 0, LOGITS_ALL) != 0) exit(1);
    memcpy(logits, s.logits, (size_t)n_prompt * V * sizeof(float));
    for (int t = n_prompt; t < n; t++) {
        if (forward(m, &s, doc, &tokens[t], 1, t, LOGITS_LAST) != 0) exit(1);
        memcpy(logits + (size_t)t * V, s.logits, V * sizeof(float));
    }
    runstate_free(&s);
    return logits;
}

/* 3. A random model, a random document of n_doc tokens (prefilled in blocks
 * of 64) and prompt: the exact path against quadrature modules W = K, Z = V. */
static void test_oracle_identity(Config c, int n_doc, int n_prompt, int decode, uint64_t seed) {
    Model m;
    if (model_init_random(&m, c, 1, seed, 0.3f) != 0) exit(1);
    uint64_t rng = seed;
    int n = n_prompt + decode, *doc_ids = xmalloc(n_doc * sizeof(int)), *tokens = xmalloc(n * sizeof(int));
    for (int i = 0; i < n_doc; i++) doc_ids[i] = rng_u32(&rng) % c.vocab_size;
    for (int i = 0; i < n; i++) tokens[i] = rng_u32(&rng) % c.vocab_size;
    DocCache cache;
    if (doccache_build(&cache, &m, doc_ids, n_doc, 64) != 0) exit(1);
    ModuleSet ms;  /* rho 1: p = n pairs, started from the cache: W = K, Z = V */
    if (moduleset_for_budget(&ms, &m, &cache, ARCH_QUAD, 1.0f, 0, 0, 0, NULL, 0) != 0) exit(1);
    moduleset_init(&ms, NULL, &cache, &m.config, seed);
    Document exact = {DOC_EXACT, n_doc, &cache, NULL, NULL}, nectar = {DOC_NECTAR, n_doc, NULL, &ms, NULL};
    float *want = run_logits(&m, &exact, tokens, n_prompt, decode);
    float *got = run_logits(&m, &nectar, tokens, n_prompt, decode);
    char what[96];
    snprintf(what, sizeof what, "oracle: D%d L%d H%d G%d, document %d, prefill %d + decode %d, logits", c.dim,
             c.n_layers, c.n_heads, c.n_kv_heads, n_doc, n_prompt, decode);
    check_close_f(what, got, want, (size_t)n * c.vocab_size, 1e-4, 1e-4);
    int same = 1;
    for (int t = 0; t < n; t++)
        same &= argmax(got + (size_t)t * c.vocab_size, c.vocab_size) == argmax(want + (size_t)t * c.vocab_size, c.vocab_size);
    check("oracle: every row's greedy token the same", same);
    free(want); free(got); free(doc_ids); free(tokens);
    moduleset_free(&ms);
    doccache_free(&cache);
    model_free(&m);
}

int main(void) {
    printf("the core alone: merge, gate and oracle identities\n");
    test_merge_identity(37, 1, 16, 1);
    test_merge_identity(300, 256, 64, 2);    /* the split a document's chunks make */
    test_merge_identity(64, 63, 32, 3);
    test_gate_identity(64, 0.0f, 4);
    test_gate_identity(64, 8.0f, 5);
    test_gate_identity(64, -30.0f, 6);       /* the local set takes nearly all the mass */
    Config gqa = {64, 96, 2, 4, 2, 67, 512, LLAMA2C_ROPE_THETA, LLAMA2C_NORM_EPS};
    Config mha = {48, 80, 3, 3, 3, 37, 512, 100000.0f, 1e-6f};
    test_oracle_identity(gqa, 300, 9, 6, 7);   /* past one chunk of DOC_CHUNK_KEYS keys */
    test_oracle_identity(mha, 40, 5, 4, 8);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed != 0;
}
