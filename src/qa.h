/* qa.h - multiple-choice questions about a document, scored by likelihood
 * (qa.c): each option's teacher-forced log-likelihood as the model's reply
 * to its question, with the full cache, with Nectar's modules and with no
 * document; the choice is the option of highest mean log-probability per
 * token.
 *
 * A question file is plain text, blocks separated by blank lines:
 *
 *   # a comment line
 *   ? What must a redistributor give every recipient?
 *   + A copy of this License.
 *   - A written offer for the source.
 *   - A list of the contributors.
 *
 * `? ` the question, then its options one a line, `+ ` the right one and
 * `- ` each other, in any order (at least two, one right). A backslash-n
 * in a question or an option stands for a newline, two backslashes for one.
 */
#ifndef NECTAR_QA_H
#define NECTAR_QA_H

#include <stdio.h>

#include "../nectar.h"
#include "tokenizer.h"

enum { QA_MAX_LINE = 1000 };  /* bytes in a line of a question file, newline excluded */

typedef struct {
    int n;               /* questions */
    char **question;     /* (n) their texts */
    int *first;          /* (n + 1) question i's options are option[first[i] .. first[i + 1]) */
    char **option;       /* (first[n]) option texts, in file order */
    int *right;          /* (n) the right option's index among its question's */
    int *line;           /* (n) the question's line in the file */
    const char *path;
} Questions;

/* The questions of a file; 0, or -1 after "error: PATH:LINE: ..." (no right
 * option, two right options, fewer than two options, an empty question or
 * option, an overlong line, invalid UTF-8, a line of no known kind). */
int  questions_load(Questions *q, const char *path);
void questions_free(Questions *q);

/* Every option as a prompt after the document: its question as a user
 * types it (question_len tokens; with chat, the end of the user's turn and
 * the start of the assistant's), then the option as the reply (with chat,
 * followed by the end of the turn; without, after a space: the question's
 * text continues with it). Prompt k is option k in file order; the set's
 * no-document prefix is the tokenizer's (answer_conventions). 0, or -1
 * after a sentence (an option longer than max_len tokens with its question,
 * or one whose first token merges with the question's last). */
int  questions_prompts(const Questions *q, const Tokenizer *t, int chat, int max_len, PromptSet *p);

/* The three runs' choices and how they compare. */
enum { QA_FULL, QA_NECTAR, QA_NODOC, QA_RUNS };
typedef struct {
    int n;                        /* questions */
    int has_nectar;               /* 0: the Nectar run was not made */
    int correct[QA_RUNS];         /* questions whose choice is the right option */
    int agree[QA_RUNS];           /* questions whose choice is the full cache's */
    int *choice;                  /* (QA_RUNS, n) the chosen option's index among its question's */
    double *sum, *mean;           /* (QA_RUNS, options) each option's log-likelihood, and per token */
    int n_options;
} QaResult;

/* Scores every option with the full cache (full: a document's KV cache, or
 * a composition of documents), Nectar (the same documents with modules
 * standing in for some or all; NULL: not run) and no document. 0, or -1
 * after a sentence. */
int  qa_evaluate(const Model *m, const Document *full, const Document *nectar, const Questions *q,
                 const PromptSet *p, QaResult *r);
void qaresult_free(QaResult *r);
/* Accuracy and agreement with their 95% Wilson intervals: a table, or a
 * JSON object {"n", "accuracy", "accuracy_ci", "agree", "agree_ci",
 * "choices", "logprob_sum", "logprob_mean"}. */
void print_qa_table(FILE *f, const Questions *q, const QaResult *r);
void print_qa_json(FILE *f, const Questions *q, const QaResult *r);

#endif
