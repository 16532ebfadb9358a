/* compile.c - a document compiled into Nectar modules end to end, with the
 * core alone (README, "Lifting the core out", builds it):
 *
 *   cc -O2 -fopenmp-simd examples/compile.c $CORE $(pkg-config --cflags --libs openblas) -lm -pthread
 *   ./a.out [OUT.nectar]
 *
 * A small random model made in memory reads a random document; prompts are
 * spans of the document (a prompt that quotes the document is one the
 * document's KV cache answers). Each step of a compiled document's life is
 * one call of nectar.h: the KV cache, modules sized by the budget, the
 * teacher pass, the fit (regression, then KL), the module file written and
 * read back; then the held-out prompts with the exact document, with the
 * modules and with no document: the mean KL from the exact one's
 * next-token distribution, and greedy tokens. The last line is
 * "N passed, M failed".
 */
#include "../nectar.h"
#include "../src/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"  /* check */

enum { N_DOC = 192, N_PROMPTS = 60, PROMPT_LEN = 24, N_GENERATE = 12 };

static void print_teacher(const char *what, long done, long total, void *user) {
    fprintf(stderr, "\r%s %ld/%ld", what, done, total);
    if (done == total) fprintf(stderr, "\n");
}

static int print_fit(Fit *f, const FitStatus *st, void *user) {
    if (st->step % 100 == 0 || st->step == st->last_step)
        fprintf(stderr, "\rstep %d/%d%s  loss %.5f  lr %.2e%s", st->step, st->last_step, st->stage ? " (KL)" : "",
                st->loss, st->lr, st->step == st->last_step ? "\n" : "");
    return 0;
}

/* N_PROMPTS spans of the document, PROMPT_LEN tokens each from a random
 * start, and a seeded 80/20 split (is_train: (N_PROMPTS)). */
static PromptSet document_spans(const int *doc, uint64_t seed, unsigned char *is_train) {
    PromptSet p = {.n_prompts = N_PROMPTS};
    p.offsets = xmalloc((N_PROMPTS + 1) * sizeof(int));
    p.tokens = xmalloc(N_PROMPTS * PROMPT_LEN * sizeof(int));
    p.split = xmalloc(N_PROMPTS);
    p.question_len = xmalloc(N_PROMPTS * sizeof(int));
    for (int i = 0; i < N_PROMPTS; i++) {
        int start = rng_u32(&seed) % (N_DOC - PROMPT_LEN);
        memcpy(p.tokens + i * PROMPT_LEN, doc + start, PROMPT_LEN * sizeof(int));
        p.offsets[i + 1] = (i + 1) * PROMPT_LEN;
        is_train[i] = rng_uniform(&seed) < 0.8f;
    }
    return p;
}

/* Mean over the held-out prompts' positions of KL(exact || other), each
 * prompt teacher-forced after its document. */
static double held_out_kl(const Model *m, const Document *exact, const Document *other, const PromptSet *p,
                          const unsigned char *is_train) {
    int V = m->config.vocab_size;
    double *logp = xmalloc(V * sizeof(double)), *logq = xmalloc(V * sizeof(double)), sum = 0;  /* (V) */
    long positions = 0;
    RunState s_exact, s_other;  /* a run state for each kind of document */
    runstate_alloc(&s_exact, m, exact, PROMPT_LEN, PROMPT_LEN);
    runstate_alloc(&s_other, m, other, PROMPT_LEN, PROMPT_LEN);
    for (int i = 0; i < p->n_prompts; i++) {
        if (is_train[i]) continue;
        const int *tokens = p->tokens + p->offsets[i];
        if (forward(m, &s_exact, exact, tokens, PROMPT_LEN, 0, LOGITS_ALL) != 0 ||
            forward(m, &s_other, other, tokens, PROMPT_LEN, 0, LOGITS_ALL) != 0) exit(1);
        for (int t = 0; t < PROMPT_LEN; t++, positions++) {
            log_softmax(s_exact.logits + (size_t)t * V, V, logp);
            log_softmax(s_other.logits + (size_t)t * V, V, logq);
            sum += kl_divergence(logp, logq, V);
        }
    }
    runstate_free(&s_exact); runstate_free(&s_other);
    free(logp); free(logq);
    return sum / positions;
}

/* For how many held-out prompts the modules' and no document's first
 * greedy token (first[0], first[1]) and whole generation of N_GENERATE
 * tokens (whole[0], whole[1]) are the exact document's. */
static void compare_generations(const Model *m, const Document *docs[3], const PromptSet *p,
                                const unsigned char *is_train, int first[2], int whole[2]) {
    const char *names[3] = {"exact", "Nectar", "no document"};
    const int no_stop[2] = {-1, -1};
    int out[3][N_GENERATE], shown = 0;
    Sampler greedy;
    sampler_init(&greedy, m->config.vocab_size, 0.0f, 1.0f, 0);  /* temperature 0: the argmax */
    first[0] = first[1] = whole[0] = whole[1] = 0;
    for (int i = 0; i < p->n_prompts; i++) {
        if (is_train[i]) continue;
        for (int k = 0; k < 3; k++)
            if (generate(m, docs[k], p->tokens + p->offsets[i], PROMPT_LEN, N_GENERATE, no_stop, &greedy, out[k]) < 0)
                exit(1);
        for (int k = 1; k < 3; k++) {
            first[k - 1] += out[k][0] == out[0][0];
            whole[k - 1] += !memcmp(out[k], out[0], sizeof out[0]);
        }
        for (int k = 0; k < 3 && shown++ < 9; k++) {  /* the first three prompts' */
            printf("  %-12s", names[k]);
            for (int t = 0; t < N_GENERATE; t++) printf(" %d", out[k][t]);
            printf("\n");
        }
    }
    sampler_free(&greedy);
}

/* The held-out prompts after the exact document, the modules and no
 * document: the KL from the exact one's distribution, and greedy tokens. */
static void compare_documents(const Model *m, const Document *exact, const Document *nectar, const PromptSet *p,
                              const unsigned char *is_train) {
    double kl_nectar = held_out_kl(m, exact, nectar, p, is_train);
    double kl_nodoc = held_out_kl(m, exact, &NO_DOCUMENT, p, is_train);
    printf("held-out KL(exact || Nectar) %.4f, KL(exact || no document) %.4f: %.3fx\n", kl_nectar, kl_nodoc,
           kl_nectar / kl_nodoc);
    const Document *docs[3] = {exact, nectar, &NO_DOCUMENT};
    int first[2], whole[2];
    printf("greedy tokens after the first held-out prompts:\n");
    compare_generations(m, docs, p, is_train, first, whole);
    printf("the exact document's first token: Nectar %d, no document %d; its %d tokens: Nectar %d, no document %d\n",
           first[0], first[1], N_GENERATE, whole[0], whole[1]);
    check("the document matters (KL with no document > 0.05)", kl_nodoc > 0.05);
    check("Nectar's KL is under half of no document's", kl_nectar < 0.5 * kl_nodoc);
    check("Nectar's first token is the exact one's more often than no document's", first[0] > first[1]);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "compiled.nectar";
    Config c = {64, 172, 2, 4, 2, 96, 512, LLAMA2C_ROPE_THETA, LLAMA2C_NORM_EPS};
    Model m;
    if (model_init_random(&m, c, 1, 1, 0.3f) != 0) return 1;
    uint64_t rng = 2;
    int doc[N_DOC];
    for (int i = 0; i < N_DOC; i++) doc[i] = rng_u32(&rng) % c.vocab_size;

    /* 1. the document's KV cache, and the prompts: spans of it, 80/20 into training and held-out */
    DocCache cache;
    if (doccache_build(&cache, &m, doc, N_DOC, 64) != 0) return 1;
    Document exact = {DOC_EXACT, N_DOC, &cache, NULL, NULL};
    unsigned char is_train[N_PROMPTS];
    PromptSet prompts = document_spans(doc, 3, is_train);

    /* 2. modules within the budget: MLP, rho 25% of the document's KV entries per (layer, KV head) */
    ModuleSet modules;
    if (moduleset_for_budget(&modules, &m, &cache, ARCH_MLP, 0.25f, 1, 1, 1, NULL, 1) != 0) return 1;

    /* 3. the teacher pass: q, alpha(q), A(q) and the logits of the full cache at every training position */
    TeacherData teacher;
    teacher_alloc(&teacher, &c, &prompts, is_train, 1, 0, 64 << 20);
    if (teacher_pass(&m, &exact, &prompts, is_train, &teacher, NULL, print_teacher, NULL) != 0) return 1;

    /* 4. the fit: 600 regression steps from the modules' starting point, then 200 KL steps */
    moduleset_init(&modules, &teacher.fit, &cache, &c, 7);
    FitOptions fit_options = {.steps = 600, .kl_steps = 200, .batch = 32, .kl_prompts = 2, .lr = 3e-2f,
                              .kl_lr = 3e-3f, .warmup_fraction = 0.05f, .lambda_alpha = 0.1f, .lambda_A = 1,
                              .seed = 4};
    Fit fit;
    if (fit_begin(&fit, &m, &modules, &teacher, &prompts, &exact, &fit_options, NULL) != 0) return 1;
    int rc = fit_steps(&fit, fit_options.steps + fit_options.kl_steps, print_fit, NULL);
    fit_end(&fit);
    if (rc != 0) return 1;

    /* 5. the module file, written and read back for this model and document */
    ModuleSet loaded;
    if (moduleset_save(&modules, path) != 0 || moduleset_load(&loaded, path, m.fingerprint, cache.fingerprint) != 0)
        return 1;
    Document nectar = {DOC_NECTAR, N_DOC, NULL, &loaded, NULL};

    /* 6. the held-out prompts: exact against Nectar against no document */
    check("the module file reads back the fitted parameters",
          !memcmp(loaded.params, modules.params, modules.n_params * sizeof(float)));
    compare_documents(&m, &exact, &nectar, &prompts, is_train);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    teacherdata_free(&teacher);
    moduleset_free(&modules); moduleset_free(&loaded);
    promptset_free(&prompts);
    doccache_free(&cache);
    model_free(&m);
    return n_failed != 0;
}
