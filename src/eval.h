/* eval.h - what the programs measure with the method: the held-out
 * metrics of modules against the full cache and no document (evaluate),
 * generations many at a time (rollouts) and answers (eval.c).
 */
#ifndef NECTAR_EVAL_H
#define NECTAR_EVAL_H

#include "../nectar.h"

typedef struct {
    int n_prompts, n_positions;   /* prompts, and next-token predictions counted */
    long n_queries;               /* module evaluations (positions x query heads x layers) */
    double acc_full, acc_nectar, acc_nodoc;  /* top-1 against the true next token */
    double agree, agree_nodoc;    /* top-1 equal to the full-cache model's */
    double kl, kl_nodoc;          /* mean KL(full || other) per position */
    double score_mse, target_mse; /* mean (a - alpha)^2, mean ||A_theta - A||^2 */
    double rte;                   /* exp(mean over (layer, query head) of mean log(||A_theta - A||^2 / ||q - A||^2)) */
    double *score_mse_layer, *target_mse_layer;  /* (L) */
    /* answers: greedy rollouts after the question part of each prompt that
     * has one */
    int n_answers;                /* prompts with a question part */
    double answer_match;          /* fraction whose Nectar answer equals the full cache's, token for token */
    double answer_match_nodoc;    /* the same for the no-document model */
    double answer_prefix;         /* mean fraction of the full cache's answer Nectar reproduces before it diverges */
    /* 95% intervals [lo, hi] of Nectar's: kl and agree over prompts (each a
     * cluster of positions; NaN with fewer than 2 prompts), answer_match
     * (Wilson) */
    double kl_ci[2], agree_ci[2], answer_match_ci[2];
    /* whether answers end and whether they loop, for the full cache, Nectar
     * and no document (k = 0, 1, 2), each with its 95% Wilson interval: the
     * share of the answers that end with the model's stop token within the
     * cap, and the share that repeat (answer_in_loop, below); and of the
     * n_full_ends answers the full cache ends, the share Nectar ends too */
    double answer_ends[3], answer_ends_ci[3][2];
    double answer_repeats[3], answer_repeats_ci[3][2];
    int n_full_ends;
    double nectar_ends_too, nectar_ends_too_ci[2];
    int answer_cap;               /* Acap: the longest answer, the stride below */
    int *answer_prompt;           /* (n_answers) the prompt's index in the set */
    int *answer_len;              /* (n_answers, 3) lengths: full cache, Nectar, no document */
    int *answer_tokens;           /* (n_answers, 3, Acap) the answers */
} EvalResult;

/* Runs the full-cache, Nectar and no-document models over each prompt of
 * `prompts` placed after the document, once: the metrics of the prompts of
 * each split (prompts->split) into split[k]: EVAL_RANDOM every self-study
 * prompt held out (SPLIT_RANDOM and SPLIT_CHALLENGE), EVAL_CHALLENGE those
 * least like the training prompts, EVAL_TASKS the evaluation-only tasks.
 * `full` is the reference (a document's KV cache, or a composition of
 * documents), `nectar` the same documents with modules standing in for
 * some or all of them. The module fit (score and target MSE, RTE) is
 * measured where both are one document, else NaN (n_queries 0). Returns -1
 * with a message if the modules' outputs are not finite. */
enum { EVAL_RANDOM, EVAL_CHALLENGE, EVAL_TASKS, EVAL_SPLITS };
int  evaluate(const Model *m, const Document *full, const Document *nectar, const PromptSet *prompts,
              EvalResult split[EVAL_SPLITS]);
/* Generations, many at once: rollout k writes tokens after its question (at
 * local position 0 of sequence j, its place among those with a question and
 * room), argmax (greedy; sampler NULL) or drawn by the sampler, until one
 * of stop[2] (kept as the answer's last token) or `cap` tokens. Each step
 * is one forward_segments of the live rollouts (up to a block of them): one
 * matrix product per weight for all of them. s needs a sequence per
 * rollout, a block of the longest question (and of n), and room for
 * question + cap. 0 (each len set), or -1 with a sentence. */
typedef struct {
    const int *question; int n_question;
    int cap;
    int *answer;  /* (cap) */
    int len;      /* out: the answer's length */
} Rollout;
int  rollouts(const Model *m, RunState *s, const Document *doc, const int stop[2], Sampler *sampler, Rollout *r,
               int n);
/* The log-likelihood of each prompt's answer part (its tokens from
 * question_len[i] >= 1 on) given everything before it, teacher-forced after
 * doc (NULL: no document, each prompt after the set's no-document prefix),
 * into sum (n_prompts). The prompts go through forward_segments in batches
 * of up to SCORE_ROWS tokens; `what` names the progress line. 0, or -1
 * after a sentence. */
enum { SCORE_ROWS = 512, SCORE_SEQS = 32 };
int answer_loglik(const Model *m, const Document *doc, const PromptSet *p, const char *what, double *sum);
/* The 95% Wilson score interval [lo, hi] of a rate of k successes in n
 * trials (n > 0). */
void wilson_interval(int k, int n, double *lo, double *hi);
/* The fraction of ref's n_ref tokens that got reproduces before the first
 * token where they differ (1 when ref is empty). */
double answer_prefix_fraction(const int *ref, int n_ref, const int *got, int n_got);
/* 1 if some run of REPEAT_GRAM tokens occurs REPEAT_TIMES times or more in
 * the n tokens (occurrences may overlap): an answer caught in a loop. */
enum { REPEAT_GRAM = 4, REPEAT_TIMES = 3 };
int answer_in_loop(const int *tokens, int n);
void evalresult_free(EvalResult *r);

/* Drift: how close Nectar stays to the full cache far from the document.
 * The full cache continues each of the first n_seqs held-out prompts with
 * a question part (the evaluation-only tasks where the set has any) (its question, then `length` greedy tokens, no stop:
 * a chat model writes on past its turn), shortened to what the context
 * leaves; each sequence then runs teacher-forced through the full cache,
 * Nectar and no document, and the KL(full || model) and top-1 agreement of
 * its positions are summed in bins of the local position t (tokens after
 * the document): [0, 64), [64, 128), [128, 256), ... 0, or -1 after a
 * sentence. */
enum { DRIFT_FIRST_BIN = 64, DRIFT_MAX_BINS = 16 };
typedef struct {
    int n_seqs, length, n_bins;
    int lo[DRIFT_MAX_BINS], hi[DRIFT_MAX_BINS];  /* bin b: local positions [lo, hi) */
    long positions[DRIFT_MAX_BINS];
    double kl[DRIFT_MAX_BINS], kl_nodoc[DRIFT_MAX_BINS];
    double kl_ci[DRIFT_MAX_BINS][2];             /* Nectar's KL, the sequences as clusters */
    double agree[DRIFT_MAX_BINS], agree_nodoc[DRIFT_MAX_BINS];
} DriftResult;
int drift_profile(const Model *m, const Document *full, const Document *nectar, const PromptSet *prompts, int length,
                  int n_seqs, DriftResult *r);

/* Where answers end: each answer of `answers` (an evaluate split) that the
 * full cache ends with a stop token (its last, at answer position T) is
 * teacher-forced through the full cache, Nectar and no document after its
 * question, and each model's log-probability of that stop token at T, and
 * whether it is the model's likeliest token there, are averaged in bins of
 * T: [0, 16), [16, 32), [32, 64), ... and over all of them (bin n_bins).
 * A model that gives the stop less probability at T writes on where the
 * full cache ends. The answers are evaluate's, whose checks they passed.
 * 0, or -1 after a sentence. */
enum { STOP_FIRST_BIN = 16, STOP_BINS = 8 };
typedef struct {
    int n_answers, n_bins;                    /* answers the full cache ends; bins [lo, hi) with some */
    int lo[STOP_BINS], hi[STOP_BINS], count[STOP_BINS + 1];
    double logp[3][STOP_BINS + 1];            /* mean log p(stop at T): full cache, Nectar, no document */
    double top[3][STOP_BINS + 1];             /* share with the stop the likeliest token at T */
} StopResult;
int stop_profile(const Model *m, const Document *full, const Document *nectar, const PromptSet *prompts,
                 const EvalResult *answers, StopResult *r);

/* The first prompts of p with a question part (of split `split`; -1: any),
 * at most `most`: their indices into chosen (most), the longest question
 * into *max_question; returns their count. */
int prompts_with_questions(const PromptSet *p, int split, int most, int *chosen, int *max_question);
/* Each chosen prompt's question continued `length` tokens after doc, greedily
 * and with no stop (a chat model writes on past its turn), 16 rollouts a
 * forward, into seqs (n, stride): the question, then its continuation
 * (stride >= max_question + length). `what` names the progress line. 0, or
 * -1 after a sentence. */
int continue_questions(const Model *m, const Document *doc, const PromptSet *p, const int *chosen, int n,
                       int max_question, int length, int *seqs, int stride, const char *what);

#endif
