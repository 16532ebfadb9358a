/* corpus.h - a synthetic corpus that teaches a tiny byte-level model to read
 * a document in its context (corpus.c).
 *
 * A document is 100..220 bytes of ASCII sentences, each "<fact>." and joined
 * by one space, about invented people and places:
 *   "Dorin Vale lives in Kesma. The river of Kesma is called Ulo. ..."
 * A training sample is the document, "\n", then 1-3 tasks about it, each one
 * line(s) ending in "\n" (the answer always runs to the end of the task):
 *   quote     "Quote: <sentence>.\n"          the first bytes of the sentence
 *             (at least 3, and enough to tell it from every other sentence)
 *             are the cue; the answer is the rest, ".\n" included
 *   continue  "Continue: <first words> | <rest of the sentence>.\n"
 *             the words before " | " tell the sentence apart; the answer
 *             follows " | "
 *   question  "Q: Where does Dorin Vale live?\nA: Kesma.\n"
 *             the answer follows "A: "
 * A copy sample is "<20..100 random letters, digits and spaces>\n"
 * "Repeat: <the same string>\n"; the answer follows "Repeat: ".
 *
 * Loss weights: weight[i] is the weight of the loss on predicting text[i]
 * from text[..i-1]; CORPUS_ANSWER_WEIGHT on answer bytes,
 * CORPUS_PROMPT_WEIGHT on every other byte (document, "\n", task prefixes).
 * Everything is a deterministic function of the rng state. Text is ASCII
 * with no BOS (the caller adds it) and always NUL-terminated: a length is at
 * most cap - 1.
 */
#ifndef CORPUS_H
#define CORPUS_H

#include <stdint.h>

#define CORPUS_PROMPT_WEIGHT 0.3f
#define CORPUS_ANSWER_WEIGHT 1.0f
#define CORPUS_DOC_MIN 100        /* document length in bytes, inclusive */
#define CORPUS_DOC_MAX 220
#define CORPUS_TASK_MAX 72        /* no task is longer (tests check it) */
/* corpus_sample's smallest cap, and the cap from which its documents use the
 * full 100..220 range (below it they are at most cap - 2 - CORPUS_TASK_MAX). */
#define CORPUS_MIN_CAP 128
#define CORPUS_FULL_CAP (CORPUS_DOC_MAX + 1 + CORPUS_TASK_MAX + 1)

enum { CORPUS_QUOTE = 0, CORPUS_CONTINUE = 1, CORPUS_QUESTION = 2 };

typedef struct { int len, doc_len; } CorpusSample;  /* doc_len: bytes before the "\n" ending the document */

/* One sample: a copy sample with probability p_copy, else a document with
 * 1-3 tasks. Writes text (len + 1 bytes with the NUL) and weight (len).
 * Returns {0, 0} when cap < CORPUS_MIN_CAP. */
CorpusSample corpus_sample(uint64_t *rng, float p_copy, char *text, float *weight, int cap);

/* A document alone (demo, held-out evaluation). Returns its length:
 * CORPUS_DOC_MIN..CORPUS_DOC_MAX when cap > CORPUS_DOC_MAX. */
int corpus_document(uint64_t *rng, char *text, int cap);

/* For a document from corpus_document: writes one task of the given kind
 * (CORPUS_QUOTE, CORPUS_CONTINUE, CORPUS_QUESTION) about a random sentence
 * into task, in the formats above, and sets *answer_start to the offset of
 * the answer bytes (the bytes to score, up to and including the final
 * "\n"). Returns the task length, or -1 if the document offers no such task
 * or it does not fit in cap. */
int corpus_task(uint64_t *rng, const char *doc, int doc_len, int kind, char *task, int cap,
                int *answer_start);

/* A multiple-choice question file (format: src/qa.h) about a document from
 * corpus_document: for each of its facts, the fact's question as a task
 * prompt ("\nQ: <question>\nA:") and four answers, the right one and three
 * of the same kind drawn from rng, in a random order. Returns the length
 * written to out (NUL-terminated), or -1 when it does not fit in cap. */
int corpus_questions(uint64_t *rng, const char *doc, int doc_len, char *out, int cap);

#endif
