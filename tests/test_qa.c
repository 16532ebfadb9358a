/* test_qa.c - multiple-choice questions (src/qa.c): the file's parser
 * against good and bad files, and the options' scores against a naive
 * log-likelihood, one sequence at a time, on the default model of data/.
 *
 * The naive reference runs each option's whole sequence (document,
 * question, option: or the no-document prefix, question, option) through
 * forward with no document state at all, from position 0, and sums
 * log_softmax(logits)[next token] over the option's tokens: no KV cache, no
 * batching, no segments. The last line is "N passed, M failed"; the exit
 * status is non-zero on any failure.
 */
#include "../nectar.h"
#include "../src/eval.h"
#include "../src/formats.h"
#include "../src/qa.h"
#include "../src/tokenizer.h"
#include "../src/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/check.h"

static const char *TMP = "tests/tmp_questions.qa";

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) { perror(path); exit(1); }
}

/* ------------------------------------------------------------------------ */
/* The parser                                                               */

static void test_good_file(void) {
    printf("a question file: blocks, comments, escapes, the right option anywhere\n");
    write_file(TMP, "# a comment\n\n? First?\n- one\n+ two\n- three\n\n\n# between\n? Second\\nline\n+ a\\\\b\n- c\\n\n");
    Questions q;
    if (questions_load(&q, TMP) != 0) { check("a good file loads", 0); return; }
    check("two questions", q.n == 2);
    check("options counted per question (3, then 2)", q.first[1] == 3 && q.first[2] == 5);
    check("the right option's index among its question's (1, 0)", q.right[0] == 1 && q.right[1] == 0);
    check("texts after their markers", !strcmp(q.question[0], "First?") && !strcmp(q.option[2], "three"));
    check("backslash-n is a newline, two backslashes one",
          !strcmp(q.question[1], "Second\nline") && !strcmp(q.option[3], "a\\b") && !strcmp(q.option[4], "c\n"));
    check("each question's line", q.line[0] == 3 && q.line[1] == 10);
    questions_free(&q);
}

static void test_bad_files(void) {
    printf("bad question files, each refused\n");
    static const struct { const char *what, *text; } bad[] = {
        {"no right option", "? Q?\n- a\n- b\n"},
        {"two right options", "? Q?\n+ a\n+ b\n- c\n"},
        {"one option", "? Q?\n+ a\n"},
        {"an empty question", "?  \n+ a\n- b\n"},
        {"an empty option", "? Q?\n+ a\n- \n"},
        {"an option before any question", "+ a\n- b\n"},
        {"two questions with no blank line between", "? Q?\n+ a\n- b\n? R?\n+ c\n- d\n"},
        {"a line of no known kind", "? Q?\n+ a\n- b\nc\n"},
        {"a marker with no space", "? Q?\n+a\n- b\n"},
        {"invalid UTF-8", "? Q\xc3?\n+ a\n- b\n"},
        {"an empty file", ""},
        {"comments only", "# nothing\n\n"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(TMP, bad[i].text);
        Questions q;
        check(bad[i].what, questions_load(&q, TMP) == -1);
    }
    char *long_line = xmalloc(QA_MAX_LINE + 32);
    strcpy(long_line, "? ");
    memset(long_line + 2, 'x', QA_MAX_LINE);
    strcpy(long_line + 2 + QA_MAX_LINE, "\n+ a\n- b\n");
    write_file(TMP, long_line);
    Questions q;
    check("a line longer than QA_MAX_LINE", questions_load(&q, TMP) == -1);
    long_line[QA_MAX_LINE - 2 + 2] = 0;  /* exactly QA_MAX_LINE bytes */
    strcat(long_line, "\n+ a\n- b\n");
    write_file(TMP, long_line);
    int ok = questions_load(&q, TMP) == 0;
    check("a line of exactly QA_MAX_LINE bytes", ok);
    if (ok) questions_free(&q);
    free(long_line);
    remove(TMP);
}

/* ------------------------------------------------------------------------ */
/* The scores                                                               */

/* The naive log-likelihood of tokens [from, n) of seq (n tokens) given the
 * tokens before each: one forward over the whole sequence, no document. */
static double naive_loglik(const Model *m, const int *seq, int n, int from) {
    int V = m->config.vocab_size;
    RunState s;
    runstate_alloc(&s, m, &NO_DOCUMENT, n, n);
    if (forward(m, &s, &NO_DOCUMENT, seq, n, 0, LOGITS_ALL) != 0) exit(1);
    double *lp = xmalloc(V * sizeof(double)), sum = 0;
    for (int t = from; t < n; t++) {
        log_softmax(s.logits + (size_t)(t - 1) * V, V, lp);
        sum += lp[seq[t]];
    }
    free(lp);
    runstate_free(&s);
    return sum;
}

/* Option k as one sequence: before (nb ids: the document, or the
 * no-document prefix) then the prompt; returns its length. */
static int option_sequence(const PromptSet *p, int k, const int *before, int nb, int *seq) {
    int len = p->offsets[k + 1] - p->offsets[k];
    memcpy(seq, before, nb * sizeof(int));
    memcpy(seq + nb, p->tokens + p->offsets[k], len * sizeof(int));
    return nb + len;
}

static void test_scores_against_naive(void) {
    printf("option log-likelihoods against one sequence at a time (the default model and document)\n");
    Model m;
    Tokenizer t;
    if (model_load(&m, "data/model.bin") != 0 || tokenizer_load(&t, "data/tokenizer.bin", m.config.vocab_size) != 0) {
        check("the default model and tokenizer load", 0);
        return;
    }
    char *doc_text = read_text_file("data/doc.txt");
    int n_doc, *doc = encode_document(&t, doc_text, 0, 0, m.config.seq_len, &n_doc);
    write_file(TMP, "? \\nQ: Where does Roustul Gom live?\\nA:\n- Kesma.\\n\n+ Shoupeipou.\\n\n- Troubei.\\n\n\n"
                    "? \\nQ: How many pigs does Lustom Pe keep?\\nA:\n+ 26.\\n\n- 18.\\n\n- 7.\\n\n");
    Questions q;
    PromptSet p;
    if (questions_load(&q, TMP) != 0 || questions_prompts(&q, &t, 0, m.config.seq_len - n_doc, &p) != 0) {
        check("the questions load and encode", 0);
        return;
    }
    DocCache cache;
    doccache_build(&cache, &m, doc, n_doc, 64);
    /* Nectar: quadrature modules of the first half of the document's keys
     * and values, so that their scores differ from the full cache's */
    int d = m.config.dim / m.config.n_heads, *pairs = xmalloc(m.config.n_layers * sizeof(int));
    for (int l = 0; l < m.config.n_layers; l++) pairs[l] = n_doc / 2;
    ModuleSet ms;
    moduleset_alloc(&ms, ARCH_QUAD, m.config.n_layers, m.config.n_kv_heads, d, 0, 0, 0, pairs, 0);
    ms.n_doc = n_doc;
    quad_init_from_cache(&ms, &cache);
    Document full = {DOC_EXACT, n_doc, &cache, NULL, NULL}, nectar = {DOC_NECTAR, n_doc, NULL, &ms, NULL};
    double *got = xmalloc(p.n_prompts * sizeof(double)), *want = xmalloc(p.n_prompts * sizeof(double));
    double *full_scores = xmalloc(p.n_prompts * sizeof(double));
    int *seq = xmalloc((n_doc + promptset_max_len(&p) + p.n_nodoc_prefix) * sizeof(int));
    const char *names[3] = {"full cache: batched = one long sequence", "Nectar: batched = one prompt at a time",
                            "no document: batched = prefix + prompt alone"};
    const Document *runs[3] = {&full, &nectar, NULL};
    for (int r = 0; r < 3; r++) {
        answer_loglik(&m, runs[r], &p, "test", got);
        for (int k = 0; k < p.n_prompts; k++) {
            int start = p.question_len[k];
            if (r == 0) want[k] = naive_loglik(&m, seq, option_sequence(&p, k, doc, n_doc, seq), n_doc + start);
            else if (r == 2) want[k] = naive_loglik(&m, seq, option_sequence(&p, k, p.nodoc_prefix, p.n_nodoc_prefix, seq),
                                                    p.n_nodoc_prefix + start);
            else {  /* one prompt alone through the same modules */
                PromptSet one = p;
                one.n_prompts = 1;
                one.offsets = p.offsets + k;
                one.question_len = p.question_len + k;
                answer_loglik(&m, &nectar, &one, "test", &want[k]);
            }
        }
        float g[16], w[16];
        for (int k = 0; k < p.n_prompts; k++) { g[k] = (float)got[k]; w[k] = (float)want[k]; }
        check_close_f(names[r], g, w, p.n_prompts, 1e-4, 1e-5);
        if (r == 0) memcpy(full_scores, got, p.n_prompts * sizeof(double));
        double gap = 0;
        for (int k = 0; r == 1 && k < p.n_prompts; k++) gap = fmax(gap, fabs(got[k] - full_scores[k]));
        if (r == 1) check("half the document's pairs change the scores (so a wrong state would show)", gap > 1e-2);
    }
    QaResult res;
    qa_evaluate(&m, &full, &nectar, &q, &p, &res);
    int best = 0;
    for (int o = 1; o < 3; o++) if (res.mean[o] > res.mean[best]) best = o;
    check("the choice is the option of highest mean log-probability per token", res.choice[0] == best);
    check("the mean is the sum over the option's tokens",
          fabs(res.mean[1] - res.sum[1] / (p.offsets[2] - p.offsets[1] - p.question_len[1])) < 1e-12);
    check("agreement counts the full cache's choice itself", res.agree[QA_FULL] == q.n);
    qaresult_free(&res);
    free(got); free(want); free(full_scores); free(seq); free(pairs); free(doc); free(doc_text);
    moduleset_free(&ms);
    doccache_free(&cache);
    promptset_free(&p);
    questions_free(&q);
    tokenizer_free(&t);
    model_free(&m);
    remove(TMP);
}

static void test_wilson(void) {
    printf("the 95%% Wilson interval against its closed form\n");
    double lo, hi;
    wilson_interval(4, 4, &lo, &hi);
    check("4 of 4: [0.5101, 1]", fabs(lo - 0.510109) < 1e-5 && hi == 1.0);
    wilson_interval(0, 10, &lo, &hi);
    check("0 of 10: [0, 0.2775]", lo == 0.0 && fabs(hi - 0.277533) < 1e-5);
    wilson_interval(28, 60, &lo, &hi);
    check("28 of 60: [0.3463, 0.5911]", fabs(lo - 0.346279) < 1e-5 && fabs(hi - 0.591066) < 1e-5);
}

int main(void) {
    test_good_file();
    test_bad_files();
    test_scores_against_naive();
    test_wilson();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed != 0;
}
