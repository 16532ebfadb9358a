/* selfstudy.h - the prompts train fits the modules on (selfstudy.c).
 *
 * Self-study: the full-cache model (the model with the whole document in
 * its context) writes its own training data about the document: spans of
 * the document to quote, continuations of them, and tasks (a question and
 * its answer) in the model's own formats; a user's prompt file may add
 * more. Every answer is the full-cache model's greedy answer, so that the
 * modules learn to reproduce what the full cache says.
 */
#ifndef SELFSTUDY_H
#define SELFSTUDY_H

#include "../nectar.h"
#include "tokenizer.h"

typedef struct {
    int n_spans;          /* document spans and continuations */
    int n_tasks;          /* task prompts the model writes (needs a tokenizer) */
    int prompt_len;       /* a prompt's length cap, answer included */
    int answer_len;       /* an answer's length cap */
    int chat;             /* the document is a chat turn; prompts end it */
    unsigned long long seed;
    const char *prompts_text_path, *prompts_ids_path;  /* the user's prompts, or NULL */
    const char *label;    /* what the tasks' progress lines call them (NULL: "tasks") */
    int eval_only;        /* evaluation-only tasks, asked after the self-study's: 3 times its tries, and a
                           * chat quote or summary request drawn again while it repeats one asked already */
    int far_prompts, far_len;  /* make_far_prompts: how many, how far */
} SelfStudyOptions;

/* What self-study reads: the model, its tokenizer (or NULL), the document's
 * text (NULL when it came as token ids), ids and exact form (its KV cache). */
typedef struct {
    const Model *model;
    const Tokenizer *tok;
    const char *doc_text;
    const int *doc_ids;
    int n_doc;
    const Document *doc;
} SelfStudyInputs;

/* Every prompt (spans and continuations, tasks, the user's), with the
 * answer conventions set (answer_conventions); 0, or -1 after a sentence
 * (a prompt file that cannot be read, fewer than 5 prompts). */
int make_prompt_set(const SelfStudyOptions *o, const SelfStudyInputs *in, PromptSet *out);
/* Evaluation-only tasks: up to n task prompts made as self-study makes its
 * own (with o's formats and caps) but from another seed, none asking what a
 * prompt of `fit` asks, each followed by the full cache's answer: they are
 * never trained on. out gets fit's conventions; it is empty without a
 * tokenizer (tasks are text). */
void make_eval_tasks(const SelfStudyOptions *o, const SelfStudyInputs *in, const PromptSet *fit, int n,
                     PromptSet *out);
/* Prompts that reach far past the document, into out (from's conventions):
 * the questions of the first far_prompts prompts of `from` with keep[i] set
 * and a question part, each continued by the full cache, greedily and with
 * no stop, for far_len tokens (a chat model writes on past its turn, as a
 * long conversation goes on), at most what the context leaves; each a
 * continuation (no answer part). */
void make_far_prompts(const SelfStudyOptions *o, const SelfStudyInputs *in, const PromptSet *from,
                      const unsigned char *keep, PromptSet *out);
/* The prompts of a, then those of b with split `b_split`, as a new set with
 * a's conventions. */
PromptSet join_prompts(const PromptSet *a, const PromptSet *b, unsigned char b_split);
/* A seeded 80/20 split: is_train (n, malloc'd) marks the training prompts. */
unsigned char *split_prompts(int n, unsigned long long seed);
/* The prompts with is_train[i] == keep, as a new set with p's conventions. */
PromptSet select_prompts(const PromptSet *p, const unsigned char *is_train, int keep);

#endif
