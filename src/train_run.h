/* train_run.h - compiling a document into a module file, as train and
 * `study fit` run it (train_run.c): the options, the recipe that fills in
 * what they leave out, and the run from the model to the module file.
 *
 * train takes the options a user compiling a document needs; `study fit`
 * takes those and the study options too (the fitting knobs and the
 * instruments of finished studies: STUDY_OPTIONS). The two run the same
 * code, so a file written by train is the one `study fit` writes for the
 * same options.
 */
#ifndef NECTAR_TRAIN_RUN_H
#define NECTAR_TRAIN_RUN_H

#include "../nectar.h"

#include <limits.h>
#include <stdio.h>

enum { NOT_GIVEN = INT_MIN };  /* an option left to the recipe, which train_run picks */
typedef enum { LOSS_KL, LOSS_REGRESSION, LOSS_MIXED } LossPreset;

typedef struct {
    const char *model_path, *tok_path, *doc_text_path, *doc_ids_path, *out_path;
    const char *prompts_text_path, *prompts_ids_path, *checkpoint_path, *resume_path, *init_path, *qa_path;
    const char *eval_tasks_from; /* a module file whose evaluation-only tasks this run takes */
    const char *self_study_path, *save_self_study_path;  /* --self-study, --save-self-study */
    int arch;         /* ModuleArch, or NOT_GIVEN */
    int loss_preset;  /* LossPreset, or NOT_GIVEN */
    float rho, lr, weight_decay, warmup_fraction, lambda_alpha, lambda_A, lambda_kl, kl_lr;
    int steps, kl_steps, batch, kl_prompts, n_prompts, n_tasks, prompt_len, answer_len, checkpoint_every, stop_after;
    int far_prompts, far_len;  /* --far-prompts, --far-len */
    int eval_tasks;   /* evaluation-only tasks to make, never trained on (NOT_GIVEN: the recipe's, or
                       * none with eval_tasks_from) */
    int json;
    int eval_train;  /* --eval-train: the metrics on the training prompts too */
    int teacher_logits_mb;  /* the teacher's logits are kept up to this size, else recomputed */
    int kl_top_k;           /* > 0: the KL term's teacher kept as its k likeliest tokens and a rest (or
                             * NOT_GIVEN: the recipe's) */
    int gpu;
    int chat;  /* 1: --chat, 0: --no-chat, -1: as the model is (the run decides) */
    int later_document;  /* --later-document: the document as a later one of a composition */
    int depth_backbone, depth_score, depth_target;
    const char *groups;
    unsigned long long seed;
} TrainOptions;

/* The options only `study fit` takes (NULL-terminated); train refuses each
 * with a sentence that names `study fit`. */
extern const char *const STUDY_OPTIONS[];

/* A command line into o: train's options, and with `study` the study
 * options too. --help or -h prints usage(stdout) and exits 0. What the
 * command line gives is checked here, and the outputs can be written; what
 * it leaves out, the recipe fills in once the model is read (train_run).
 * 0, or -1 after a sentence. */
int train_options_parse(int argc, char **argv, TrainOptions *o, void (*usage)(FILE *), int study);

/* The run, each step as a comment in train_run.c says: the model and the
 * document, the self-study prompts, the teacher pass, the modules fitted,
 * then the metrics and the module file (o: the recipe fills in what the
 * command line left out). 0, or -1 after a sentence. */
int train_run(TrainOptions *o);

#endif
