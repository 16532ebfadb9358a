/* test_corpus.c - the synthetic corpus (corpus.c) against its formats.
 *
 * Every sample is checked by a parser written here from corpus.h alone:
 * formats, lengths, weights, quotes and answers taken from the document.
 * Then examples of each kind go to stdout, answer bytes (weight 1) in
 * brackets; a "]" before a line break means the "\n" is an answer byte too.
 * The last line is "N passed, M failed"; the exit status is non-zero on any
 * failure.
 */
#include "../tools/corpus.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n_passed, n_failed;

static void check(int ok, const char *what) {
    printf("  %-60s %s\n", what, ok ? "ok" : "FAIL");
    if (ok) n_passed++; else n_failed++;
}

/* Does doc hold a sentence (at its start or after ". ") equal to the n
 * bytes at s, "." included? */
static int is_sentence(const char *doc, int doc_len, const char *s, int n) {
    for (int i = 0; i + n <= doc_len; i++)
        if ((i == 0 || (i >= 2 && doc[i - 2] == '.' && doc[i - 1] == ' ')) &&
            !memcmp(doc + i, s, n) && s[n - 1] == '.' && (i + n == doc_len || doc[i + n] == ' '))
            return 1;
    return 0;
}

/* How many sentences of doc start with the n bytes at s. */
static int sentences_starting(const char *doc, int doc_len, const char *s, int n) {
    int count = 0;
    for (int i = 0; i + n <= doc_len; i++)
        if ((i == 0 || (i >= 2 && doc[i - 2] == '.' && doc[i - 1] == ' ')) && !memcmp(doc + i, s, n))
            count++;
    return count;
}

/* Weights of the bytes [from, to) all equal w? */
static int weights_are(const float *weight, int from, int to, float w) {
    for (int i = from; i < to; i++) if (weight[i] != w) return 0;
    return 1;
}

/* Checks one task at t (n bytes, ending in "\n") about doc, with its weights
 * (NULL: answer_start is given instead). Returns NULL or what is wrong. */
static const char *check_task(const char *doc, int doc_len, const char *t, int n,
                              const float *weight, int answer_start, int *kind) {
    const float P = CORPUS_PROMPT_WEIGHT, A = CORPUS_ANSWER_WEIGHT;
    if (n < 2 || t[n - 1] != '\n') return "task does not end in a line break";
    int a = -1;  /* where the answer starts, from the format */
    if (!strncmp(t, "Quote: ", 7)) {
        *kind = CORPUS_QUOTE;
        if (!is_sentence(doc, doc_len, t + 7, n - 8)) return "quote is not a sentence of the document";
        /* the cue runs to the first answer byte; it must name one sentence */
        a = weight ? 7 : answer_start;
        while (weight && a < n && weight[a] == P) a++;
        if (a - 7 < 3) return "quote cue shorter than 3 bytes";
        if (sentences_starting(doc, doc_len, t + 7, a - 7) != 1) return "quote cue is ambiguous";
    } else if (!strncmp(t, "Continue: ", 10)) {
        *kind = CORPUS_CONTINUE;
        const char *bar = strstr(t, " | ");
        if (!bar || bar - t >= n) return "continue without \" | \"";
        char joined[256];
        int k = (int)(bar - t) - 10;
        snprintf(joined, sizeof joined, "%.*s %.*s", k, t + 10, n - 1 - (k + 13), bar + 3);
        if (!is_sentence(doc, doc_len, joined, (int)strlen(joined))) return "continue is not a sentence";
        if (sentences_starting(doc, doc_len, t + 10, k + 1) != 1) return "continue cue is ambiguous";
        a = k + 13;
    } else if (!strncmp(t, "Q: ", 3)) {
        *kind = CORPUS_QUESTION;
        const char *nl = memchr(t, '\n', n);
        if (!nl || nl[-1] != '?' || strncmp(nl + 1, "A: ", 3)) return "bad question format";
        a = (int)(nl - t) + 4;
        if (memchr(t + a, '\n', n - a - 1) || t[n - 2] != '.') return "bad answer format";
        /* every answer is a fact's object: a whole word of the document */
        int m = n - 2 - a, in_doc = 0;
        for (int i = 1; i + m < doc_len && !in_doc; i++)
            in_doc = doc[i - 1] == ' ' && !memcmp(doc + i, t + a, m) &&
                     (doc[i + m] == '.' || doc[i + m] == ' ');
        if (!in_doc) return "answer not in the document";
    } else {
        return "unknown task";
    }
    if (!weight) return a == answer_start ? NULL : "answer_start disagrees with the format";
    if (!weights_are(weight, 0, a, P) || !weights_are(weight, a, n, A)) return "wrong weights";
    return NULL;
}

/* Checks a whole sample. Returns NULL or what is wrong; counts task kinds. */
static const char *check_sample(const char *text, const float *weight, CorpusSample s, int cap,
                                int counts[4]) {
    if (s.len <= 0 || s.len > cap - 1 || text[s.len] != '\0') return "length out of range";
    if (s.doc_len <= 0 || s.doc_len >= s.len || text[s.doc_len] != '\n') return "bad doc_len";
    for (int i = 0; i < s.len; i++) {
        if (weight[i] != CORPUS_PROMPT_WEIGHT && weight[i] != CORPUS_ANSWER_WEIGHT) return "odd weight";
        if ((text[i] < 32 || text[i] > 126) && text[i] != '\n') return "byte not printable ASCII";
        if (i < s.doc_len && text[i] == '\n') return "line break inside the document";
    }
    if (!weights_are(weight, 0, s.doc_len + 1, CORPUS_PROMPT_WEIGHT)) return "document weights";
    const char *t = text + s.doc_len + 1, *end = text + s.len;
    if (!strncmp(t, "Repeat: ", 8)) {  /* the copy sample */
        counts[3]++;
        if (end - t != 8 + s.doc_len + 1 || memcmp(t + 8, text, s.doc_len)) return "repeat differs";
        if (s.doc_len < 20 || s.doc_len > 100) return "copy string length";
        for (int i = 0; i < s.doc_len; i++)
            if (!(text[i] == ' ' || isalnum((unsigned char)text[i]))) return "copy string bytes";
        if (!weights_are(weight, s.doc_len + 1, s.doc_len + 9, CORPUS_PROMPT_WEIGHT) ||
            !weights_are(weight, s.doc_len + 9, s.len, CORPUS_ANSWER_WEIGHT)) return "repeat weights";
        return NULL;
    }
    int n_tasks = 0;
    while (t < end) {
        const char *nl = memchr(t, '\n', end - t);
        if (!nl) return "unterminated task";
        if (!strncmp(t, "Q: ", 3)) nl = memchr(nl + 1, '\n', end - nl - 1);  /* the "A:" line */
        if (!nl) return "question without answer";
        int kind = -1;
        const char *err = check_task(text, s.doc_len, t, (int)(nl + 1 - t), weight + (t - text), 0, &kind);
        if (err) return err;
        counts[kind]++;
        n_tasks++;
        t = nl + 1;
    }
    return n_tasks >= 1 && n_tasks <= 3 ? NULL : "not 1..3 tasks";
}

/* Writes text with the answer bytes (weight 1) in brackets, "]" before a
 * weighted line break, and '?' for a byte of any weight but 0.3 or 1. */
static void mark(const char *text, const float *weight, int len, char *out) {
    int in = 0;
    for (int i = 0; i < len; i++) {
        int answer = weight[i] == CORPUS_ANSWER_WEIGHT;
        if (answer && !in) *out++ = '[';
        if (!answer && in) *out++ = ']';
        in = answer;
        if (text[i] == '\n' && answer) { *out++ = ']'; in = 0; }
        *out++ = answer || weight[i] == CORPUS_PROMPT_WEIGHT ? text[i] : '?';
    }
    if (in) *out++ = ']';
    *out = '\0';
}

static void print_marked(const char *text, const float *weight, int len) {
    char out[1024];
    mark(text, weight, len, out);
    printf("%s---\n", out);
}

int main(void) {
    char *text;
    float *weight;

    printf("determinism\n");
    {
        int cap = 512, same = 1, differ = 0;
        char *t2 = malloc(cap);
        float *w2 = malloc(cap * sizeof(float));
        text = malloc(cap); weight = malloc(cap * sizeof(float));
        uint64_t r1 = 42, r2 = 42, r3 = 43;
        for (int i = 0; i < 500; i++) {
            CorpusSample a = corpus_sample(&r1, 0.3f, text, weight, cap);
            CorpusSample b = corpus_sample(&r2, 0.3f, t2, w2, cap);
            same &= a.len == b.len && a.doc_len == b.doc_len && !memcmp(text, t2, a.len + 1) &&
                    !memcmp(weight, w2, a.len * sizeof(float));
            CorpusSample c = corpus_sample(&r3, 0.3f, t2, w2, cap);
            differ += c.len != a.len || memcmp(text, t2, a.len);
        }
        check(same, "same seed, same 500 samples (bytes and weights)");
        check(differ > 490, "another seed, other samples");
        free(t2); free(w2); free(text); free(weight);
    }

    printf("hand-checked examples\n");
    {
        /* seed 2: the quote cue "Hoka" is the only sentence start of its
         * kind; answers run to the end of each task, "\n" included */
        const char *doc_want =
            "The river of Fopok is called Leidik. Hokai Moun lives in Fopok. Lifos Bime is 9 years old. "
            "Utrouk Brezon likes the color purple. Utrouk Brezon works as a teacher.\n"
            "Quote: Hoka[i Moun lives in Fopok.]\n"
            "Q: What is the river of Fopok called?\n"
            "A: [Leidik.]\n"
            "Continue: Hokai Moun | [lives in Fopok.]\n";
        const char *copy_want =
            "N7 Vgrj2jq7R2za roEW1NJuGM\n"
            "Repeat: [N7 Vgrj2jq7R2za roEW1NJuGM]\n";
        int cap = 512;
        char got[1024];
        text = malloc(cap); weight = malloc(cap * sizeof(float));
        uint64_t rng = 2;
        CorpusSample s = corpus_sample(&rng, 0.0f, text, weight, cap);
        mark(text, weight, s.len, got);
        printf("%s", got);
        check(!strcmp(got, doc_want) && s.doc_len == 162, "document sample, seed 2: text and weights");
        rng = 48;
        s = corpus_sample(&rng, 1.0f, text, weight, cap);
        mark(text, weight, s.len, got);
        printf("%s", got);
        check(!strcmp(got, copy_want) && s.doc_len == 26, "copy sample, seed 48: text and weights");
        free(text); free(weight);
    }

    printf("samples at several caps (buffers of exactly cap bytes)\n");
    {
        int caps[] = {128, 200, CORPUS_FULL_CAP, 512};
        for (int c = 0; c < 4; c++) {
            int cap = caps[c], counts[4] = {0}, min_doc = 1 << 30, max_doc = 0, max_len = 0;
            const char *err = NULL;
            text = malloc(cap); weight = malloc(cap * sizeof(float));
            uint64_t rng = 1000 + c;
            for (int i = 0; i < 3000 && !err; i++) {
                CorpusSample s = corpus_sample(&rng, 0.25f, text, weight, cap);
                err = check_sample(text, weight, s, cap, counts);
                if (err) { printf("    %s in:\n", err); print_marked(text, weight, s.len); }
                if (text[s.doc_len + 1] != 'R') {
                    if (s.doc_len < min_doc) min_doc = s.doc_len;
                    if (s.doc_len > max_doc) max_doc = s.doc_len;
                }
                if (s.len > max_len) max_len = s.len;
            }
            char what[128];
            snprintf(what, sizeof what, "cap %d: 3000 samples well formed", cap);
            check(!err, what);
            printf("    quote %d, continue %d, question %d, copy %d; documents %d..%d bytes; longest %d\n",
                   counts[0], counts[1], counts[2], counts[3], min_doc, max_doc, max_len);
            check(counts[0] > 500 && counts[1] > 500 && counts[2] > 500 && counts[3] > 500,
                  "    every kind is common");
            if (cap >= CORPUS_FULL_CAP)
                check(min_doc >= CORPUS_DOC_MIN && max_doc <= CORPUS_DOC_MAX && max_doc > 210,
                      "    documents span 100..220 bytes");
            free(text); free(weight);
        }
        uint64_t rng = 5;
        char small[64];
        float w[64];
        CorpusSample s = corpus_sample(&rng, 0.5f, small, w, 64);
        check(s.len == 0 && s.doc_len == 0, "cap below CORPUS_MIN_CAP: empty sample");
    }

    printf("corpus_task on 1000 documents\n");
    {
        char doc[CORPUS_DOC_MAX + 1], task[256];
        uint64_t rng = 99;
        int bad_doc = 0, missing = 0, max_task = 0, conflicts = 0, n_questions = 0;
        const char *err = NULL;
        for (int d = 0; d < 1000; d++) {
            int n = corpus_document(&rng, doc, sizeof doc);
            bad_doc += n < CORPUS_DOC_MIN || n > CORPUS_DOC_MAX || doc[n] != '\0' || doc[n - 1] != '.';
            /* questions and their answers seen in this document */
            char qs[64][96], as[64][32];
            int nq = 0;
            for (int kind = 0; kind < 3; kind++)
                for (int rep = 0; rep < 20; rep++) {
                    int a = -1, k = -1;
                    int len = corpus_task(&rng, doc, n, kind, task, sizeof task, &a);
                    if (len < 0) { missing++; continue; }
                    if (len > max_task) max_task = len;
                    const char *e = len == (int)strlen(task) ? check_task(doc, n, task, len, NULL, a, &k)
                                                              : "length disagrees";
                    if (!e && k != kind) e = "wrong kind";
                    if (e && !err) { err = e; printf("    %s in:\n%s\n%s", e, doc, task); }
                    if (kind != CORPUS_QUESTION || e) continue;
                    /* the same question must always get the same answer */
                    char *nl = strchr(task, '\n');
                    int j, qlen = (int)(nl - task);
                    for (j = 0; j < nq; j++)
                        if ((int)strlen(qs[j]) == qlen && !strncmp(qs[j], task, qlen)) break;
                    if (j < nq) { conflicts += strcmp(as[j], nl + 4) != 0; continue; }
                    if (nq < 64) {
                        snprintf(qs[nq], sizeof qs[nq], "%.*s", qlen, task);
                        snprintf(as[nq], sizeof as[nq], "%s", nl + 4);
                        nq++;
                        n_questions++;
                    }
                }
        }
        check(bad_doc == 0, "documents are 100..220 bytes, NUL-terminated, end in '.'");
        check(missing == 0, "every kind of task on every document");
        check(!err, "tasks well formed, answer_start right, quotes and answers from the document");
        printf("    %d distinct questions; longest task %d bytes\n", n_questions, max_task);
        check(conflicts == 0, "no question has two answers");
        check(max_task <= CORPUS_TASK_MAX, "no task longer than CORPUS_TASK_MAX");
        int a;
        check(corpus_task(&rng, doc, (int)strlen(doc), CORPUS_QUOTE, task, 8, &a) == -1,
              "a task that does not fit in cap: -1");
        check(corpus_task(&rng, "", 0, CORPUS_QUESTION, task, sizeof task, &a) == -1,
              "an empty document: -1");
        check(corpus_task(&rng, doc, (int)strlen(doc), 3, task, sizeof task, &a) == -1,
              "an unknown kind: -1");
        uint64_t zero = 0;  /* xorshift never leaves 0: must still end */
        check(corpus_document(&zero, doc, sizeof doc) > 0, "a stuck rng (state 0) still ends");
    }

    printf("examples\n");
    {
        int cap = 512;
        text = malloc(cap); weight = malloc(cap * sizeof(float));
        uint64_t rng = 2024;
        printf("copy samples:\n");
        for (int i = 0; i < 3; i++) {
            CorpusSample s = corpus_sample(&rng, 1.0f, text, weight, cap);
            print_marked(text, weight, s.len);
        }
        printf("document samples:\n");
        for (int i = 0; i < 3; i++) {
            CorpusSample s = corpus_sample(&rng, 0.0f, text, weight, cap);
            print_marked(text, weight, s.len);
        }
        const char *names[] = {"quote", "continue", "question"};
        char doc[CORPUS_DOC_MAX + 1], task[128];
        for (int kind = 0; kind < 3; kind++) {
            printf("corpus_task %s:\n", names[kind]);
            for (int i = 0; i < 3; i++) {
                int n = corpus_document(&rng, doc, sizeof doc), a = 0;
                int len = corpus_task(&rng, doc, n, kind, task, sizeof task, &a);
                printf("%s\n%.*s[%.*s]\n---\n", doc, a, task, len - a - 1, task + a);
            }
        }
        free(text); free(weight);
    }

    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
