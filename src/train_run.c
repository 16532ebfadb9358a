/* train_run.c - compiling a document into Nectar modules, the run train
 * and `study fit` share (train_run.h).
 *
 * train_run reads as its steps:
 * 1. the model, the tokenizer and the document's KV cache; the recipe for
 *    what the command line left out; the modules within the budget (and
 *    --init's file) checked before the long steps;
 * 2. self-study prompts (selfstudy.c): document spans to quote,
 *    continuations of them, tasks the full-cache model writes about the
 *    document and answers, and prompts from a file; a seeded 80/20 split
 *    into train and held-out; evaluation-only tasks, made as the tasks but
 *    from another seed and never trained on; with --far-prompts, training
 *    prompts that reach far from the document;
 * 3. teacher pass: the full-cache model runs every prompt after the document
 *    and records, per position, layer and query head, q, alpha(q) and A(q);
 *    the challenge subset of the held-out prompts;
 * 4. the modules initialised (from the teacher's data, the cache, or --init);
 * 5. fitting: per (layer, KV head) module, AdamW with warmup and cosine
 *    decay, global gradient clipping at 1.0, on the CPU or (--gpu, in a
 *    build with nvcc) the GPU, each layer's modules batched; with
 *    --kl-steps, then a pure-KL stage from the fitted modules;
 * 6. the metrics on the held-out prompts and the evaluation-only tasks, and
 *    the module file (with both).
 */
#include "train_run.h"
#include "cli.h"
#include "eval.h"
#include "formats.h"
#include "parallel.h"
#include "qa.h"
#include "selfstudy.h"
#include "tokenizer.h"
#include "util.h"
#ifdef NECTAR_CUDA
#include "../nectar_cuda.h"
#endif

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------------------ */
/* Options and recipes                                                      */

static const char *const LOSS_NAMES[] = {"kl", "regression", "mixed"};  /* by LossPreset */

/* Train's defaults, as the model is: a recipe fills in what the command line
 * left out (NOT_GIVEN, or NaN for --kl-lr) once load_inputs knows the model
 * and whether the run is a chat one; the run takes the last recipe of
 * RECIPES whose `chat` is the run's and whose `min_params` the model has.
 * - plain: a small plain-text model, of llama2.c's size, fits best by pure
 *   KL, 6000 steps at --lr, minutes on a CPU.
 * - large plain: a real LLM is another matter, each of its KL steps a
 *   forward and backward of all its layers: a regression fit (2000 cheap
 *   steps), then 400 KL steps going on from it, the KL term's teacher as
 *   its top 32 tokens (a real vocabulary's logits would take 196 KB a
 *   position). Read as plain text, it writes none of the tasks the plain
 *   self-study asks for (their formats are the default model's), so its
 *   self-study is 200 spans and continuations, and MLP modules (the four
 *   losses on SmolLM2 read as plain text: a third of pure KL's KL in half
 *   its time). A model is large from 10M parameters: the geometric middle
 *   of the two models the plain recipes were measured on (the default
 *   model's 0.8M, SmolLM2's 135M).
 * - chat: the large recipe, read as a chat: quadrature modules on a smaller
 *   self-study (96 spans and continuations, 64 chat tasks: three times the
 *   spans it had, the step measured that keeps demo-real within 30
 *   minutes), 27 minutes on 2 cores for SmolLM2-135M and Apache-2.0. No
 *   evaluation-only tasks unless asked (--eval-tasks): a chat model writes
 *   them slowly (100 took 29 of MPL-2.0's 56 minutes), and the held-out
 *   split measures the fit.
 * docs/real-model.md: what each part of the chat recipe gains. */
typedef struct {
    const char *name;
    int chat;           /* for a run read as a chat (1) or as plain text (0) */
    double min_params;  /* for a model of at least this many parameters */
    ModuleArch arch;
    LossPreset loss;
    int steps, kl_steps, n_prompts, n_tasks, eval_tasks, prompt_len, answer_len, kl_top_k;
    float kl_lr;
} Recipe;
static const Recipe RECIPES[] = {
    /* name          chat  params arch       loss             steps  kl  spans tasks eval len answer top-k kl_lr */
    {"plain",          0,     0, ARCH_MLP,  LOSS_KL,          6000,   0,  50, 300, 100,  80,  48,  0, 3e-3f},
    {"large plain",    0,  10e6, ARCH_MLP,  LOSS_REGRESSION,  2000, 400, 200,   0,   0,  80,  48, 32, 3e-3f},
    {"chat",           1,     0, ARCH_QUAD, LOSS_REGRESSION,  2000, 400,  96,  64,   0, 196, 128, 32, 6e-3f},
};

/* the options that take a value, for the message when one comes last */
static const char VALUE_OPTIONS[] = " -m -z -d -D -o --self-study --save-self-study --prompts --prompt-ids --checkpoint --resume --init --qa --groups --arch --depths "
    "--rho --lr --wd --warmup --lambda-alpha --lambda-A --lambda-kl --kl-prompts --loss --steps --kl-steps --kl-lr "
    "--batch --n-prompts "
    "--tasks --eval-tasks --eval-tasks-from --far-prompts --far-len --kl-top-k --teacher-logits-mb --prompt-len --answer-len --checkpoint-every --stop-after -s ";

/* The options with a word for a value: --arch, --depths, --loss. 1 if a is
 * one of them, -1 after a sentence when its value is not one they take. */
static int parse_word_option(const char *a, const char *v, TrainOptions *o) {
    if (!strcmp(a, "--arch")) {
        if (!strcmp(v, "mlp")) o->arch = ARCH_MLP;
        else if (!strcmp(v, "quad")) o->arch = ARCH_QUAD;
        else { fprintf(stderr, "error: --arch must be mlp or quad, not '%s'\n", v); return -1; }
    } else if (!strcmp(a, "--depths")) {
        int used = 0;
        if (sscanf(v, "%d,%d,%d%n", &o->depth_backbone, &o->depth_score, &o->depth_target, &used) != 3 || v[used]) {
            fprintf(stderr, "error: --depths expects three integers B,S,T, got '%s'\n", v);
            return -1;
        }
    } else if (!strcmp(a, "--loss")) {
        for (int k = 0; k < (int)(sizeof LOSS_NAMES / sizeof *LOSS_NAMES); k++)
            if (!strcmp(v, LOSS_NAMES[k])) o->loss_preset = k;
        if (o->loss_preset == NOT_GIVEN) {
            fprintf(stderr, "error: --loss must be regression, mixed or kl, not '%s'\n", v);
            return -1;
        }
    } else return 0;
    return 1;
}

/* The option a with value v into o: 0, or -1 after a sentence. */
static int parse_value_option(const char *a, const char *v, TrainOptions *o) {
    int word = parse_word_option(a, v, o);
    if (word) return word < 0 ? -1 : 0;
    const char **paths[] = {&o->model_path, &o->tok_path, &o->doc_text_path, &o->doc_ids_path, &o->out_path,
                            &o->prompts_text_path, &o->prompts_ids_path, &o->checkpoint_path, &o->resume_path,
                            &o->init_path, &o->qa_path, &o->eval_tasks_from, &o->groups, &o->self_study_path,
                            &o->save_self_study_path};
    static const char *path_names[] = {"-m", "-z", "-d", "-D", "-o", "--prompts", "--prompt-ids", "--checkpoint",
                                       "--resume", "--init", "--qa", "--eval-tasks-from", "--groups", "--self-study",
                                       "--save-self-study"};
    for (size_t k = 0; k < sizeof path_names / sizeof *path_names; k++)
        if (!strcmp(a, path_names[k])) { *paths[k] = v; return 0; }
    float *floats[] = {&o->rho, &o->lr, &o->weight_decay, &o->warmup_fraction, &o->lambda_alpha, &o->lambda_A,
                       &o->lambda_kl, &o->kl_lr};
    static const char *float_names[] = {"--rho", "--lr", "--wd", "--warmup", "--lambda-alpha", "--lambda-A",
                                        "--lambda-kl", "--kl-lr"};
    for (int k = 0; k < 8; k++)
        if (!strcmp(a, float_names[k])) return parse_float_option(a, v, floats[k]);
    int *ints[] = {&o->kl_prompts, &o->steps, &o->batch, &o->n_prompts, &o->n_tasks, &o->prompt_len,
                   &o->answer_len, &o->checkpoint_every, &o->stop_after, &o->teacher_logits_mb, &o->kl_steps,
                   &o->eval_tasks, &o->kl_top_k, &o->far_prompts, &o->far_len};
    static const char *int_names[] = {"--kl-prompts", "--steps", "--batch", "--n-prompts", "--tasks",
                                      "--prompt-len", "--answer-len", "--checkpoint-every", "--stop-after",
                                      "--teacher-logits-mb", "--kl-steps", "--eval-tasks", "--kl-top-k",
                                      "--far-prompts", "--far-len"};
    for (int k = 0; k < 15; k++) {
        if (strcmp(a, int_names[k])) continue;
        if (parse_int_option(a, v, ints[k]) != 0) return -1;
        if (*ints[k] != NOT_GIVEN) return 0;  /* the value that stands for "left to the recipe" */
        fprintf(stderr, "error: %s %s is out of range\n", a, v);
        return -1;
    }
    if (!strcmp(a, "-s")) return parse_seed_option(a, v, &o->seed);
    fprintf(stderr, "error: unknown option '%s' (see --help)\n", a);
    return -1;
}

/* The steps of the run: --steps, then --kl-steps. */
static int total_steps(const TrainOptions *o) { return o->steps + o->kl_steps; }

/* 1 if option value v was given and is below min. */
static int given_below(int v, int min) { return v != NOT_GIVEN && v < min; }

/* What the command line gave, checked before the model is read (what it
 * left to the recipe, in apply_recipe): NULL or the sentence. */
static const char *check_options(const TrainOptions *o) {
    if (!o->model_path) return "a model is required (-m); see --help";
    if (!o->out_path) return "an output file is required (-o OUT.nectar)";
    if (!o->doc_text_path == !o->doc_ids_path) return "give the document as -d DOC.txt or -D DOC.ids (one of them)";
    if (!(o->rho > 0 && o->rho <= 100)) return "--rho must be in (0, 100]";
    if (!depths_valid(o->depth_backbone, o->depth_score, o->depth_target) ||
        o->depth_backbone + o->depth_score + o->depth_target < 1)
        return "--depths B,S,T must be >= 0 with 1 <= B+S+T <= 64";
    if (given_below(o->steps, 0) || given_below(o->kl_steps, 0))
        return "need --steps >= 0 (0: evaluate the initial modules) and --kl-steps >= 0";
    if (o->batch < 1 || given_below(o->n_prompts, 0) || given_below(o->n_tasks, 0) || given_below(o->eval_tasks, 0) ||
        given_below(o->prompt_len, 2) || given_below(o->answer_len, 0) ||
        o->stop_after < 0 || o->checkpoint_every < 0 || o->teacher_logits_mb < 0 || o->teacher_logits_mb > (1 << 24) ||
        given_below(o->kl_top_k, 0) || o->far_prompts < 0 || o->far_len < 1)
        return "need --batch >= 1, --n-prompts >= 0, --tasks >= 0, --eval-tasks >= 0, "
               "--prompt-len >= 2, --answer-len >= 0, --stop-after >= 0, --checkpoint-every >= 0, --kl-top-k >= 0, "
               "--far-prompts >= 0, --far-len >= 1 and --teacher-logits-mb in 0..16777216";
    if (!(o->lr > 0) || !(isnan(o->kl_lr) || o->kl_lr > 0) || o->weight_decay < 0 || o->warmup_fraction < 0 ||
        o->warmup_fraction >= 1)
        return "need --lr > 0, --kl-lr > 0, --wd >= 0 and --warmup in [0, 1)";
    if (o->lambda_alpha < 0 || o->lambda_A < 0 || o->lambda_kl < 0) return "the loss weights must be >= 0";
    if (o->kl_prompts < 1 || o->kl_prompts > MAX_KL_PROMPTS) return "--kl-prompts must be in 1..64";
    if (o->stop_after > 0 && !o->checkpoint_path) return "--stop-after needs --checkpoint, or the fit is lost";
    if (o->init_path && o->resume_path) return "--init and --resume both give the modules to start from; give one";
    if (o->eval_tasks_from && o->eval_tasks != NOT_GIVEN)
        return "--eval-tasks and --eval-tasks-from both give the evaluation-only tasks; give one";
    if (o->self_study_path && (o->n_prompts != NOT_GIVEN || o->n_tasks != NOT_GIVEN || o->eval_tasks != NOT_GIVEN ||
                               o->eval_tasks_from || o->prompts_text_path || o->prompts_ids_path))
        return "--self-study gives the prompts and the evaluation-only tasks; drop --n-prompts, --tasks, --eval-tasks, "
               "--eval-tasks-from, --prompts and --prompt-ids";
    if (o->self_study_path && o->save_self_study_path)
        return "--self-study reads a saved self-study; --save-self-study would write it again";
    if (o->chat == 1 && (o->doc_ids_path || o->prompts_ids_path))
        return "--chat frames texts (-d, --prompts); token ids (-D, --prompt-ids) are used as given";
#ifndef NECTAR_CUDA
    if (o->gpu) return NO_GPU_SUPPORT;
#endif
    return NULL;
}

/* Recipe r for what the command line left out (its KL stage goes with its
 * loss: another --loss has none unless --kl-steps asks), then the loss presets
 * (lambda_alpha, lambda_A, lambda_kl): regression (0.1, 1, 0); mixed adds 1
 * KL (the regression terms are normalised, of order 0.1-1, and KL is in
 * nats per position); pure KL (0, 0, 1), which reproduces the full cache's
 * answers best. Explicit values win (a weight not given is NaN, which
 * parsing never yields). NULL, or the sentence. */
static const char *apply_recipe(TrainOptions *o, const Recipe *r) {
    int *given[] = {&o->arch, &o->loss_preset, &o->steps, &o->n_prompts, &o->n_tasks, &o->prompt_len, &o->answer_len,
                    &o->kl_top_k};
    const int recipe[] = {r->arch, r->loss, r->steps, r->n_prompts, r->n_tasks, r->prompt_len, r->answer_len,
                          r->kl_top_k};
    for (int k = 0; k < 8; k++)
        if (*given[k] == NOT_GIVEN) *given[k] = recipe[k];
    if (o->eval_tasks == NOT_GIVEN) o->eval_tasks = o->eval_tasks_from ? 0 : r->eval_tasks;
    if (o->kl_steps == NOT_GIVEN) o->kl_steps = o->loss_preset == (int)r->loss ? r->kl_steps : 0;
    if (o->steps > INT_MAX - o->kl_steps) return "--steps and --kl-steps must be at most 2147483647 together";
    if (!isnan(o->kl_lr) && o->kl_steps == 0) return "--kl-lr sets the rate of the --kl-steps; give both";
    if (isnan(o->kl_lr)) o->kl_lr = r->kl_lr;
    int preset = o->loss_preset;
    if (isnan(o->lambda_alpha)) o->lambda_alpha = preset == LOSS_KL ? 0.0f : 0.1f;
    if (isnan(o->lambda_A)) o->lambda_A = preset == LOSS_KL ? 0.0f : 1.0f;
    if (isnan(o->lambda_kl)) o->lambda_kl = preset == LOSS_REGRESSION ? 0.0f : 1.0f;
    if (o->lambda_alpha + o->lambda_A + o->lambda_kl == 0) return "the loss weights must not all be 0";
    int total = total_steps(o);
    if (o->checkpoint_every <= 0) o->checkpoint_every = total / 4 > 0 ? total / 4 : 1;
    return NULL;
}

/* Finds out now, not after the fitting, that an output cannot be written or
 * would destroy an input. The checkpoint may be the file --resume reads:
 * the run goes on writing it. */
static int check_outputs(const TrainOptions *o) {
    const char *inputs[] = {o->model_path, o->tok_path, o->doc_text_path, o->doc_ids_path, o->init_path,
                            o->prompts_text_path, o->prompts_ids_path, o->qa_path, o->eval_tasks_from,
                            o->self_study_path, o->resume_path};
    int n = sizeof inputs / sizeof *inputs;
    if (check_output("-o", o->out_path, inputs, n) != 0) return -1;
    const char *saved = o->save_self_study_path;
    if (saved && (!strcmp(saved, o->out_path) || (o->checkpoint_path && !strcmp(saved, o->checkpoint_path)))) {
        fprintf(stderr, "error: --save-self-study %s is another output of this run; give it a file of its own\n", saved);
        return -1;
    }
    if (saved && check_output("--save-self-study", saved, inputs, n) != 0) return -1;
    if (!o->checkpoint_path) return 0;
    if (!strcmp(o->checkpoint_path, o->out_path)) {
        fprintf(stderr, "error: -o and --checkpoint are both %s; give them two files\n", o->out_path);
        return -1;
    }
    return check_output("--checkpoint", o->checkpoint_path, inputs, n - 1);  /* not --resume: it goes on */
}

const char *const STUDY_OPTIONS[] = {
    "--no-chat", "--depths", "--groups", "--kl-lr", "--batch", "--wd", "--warmup", "--lambda-alpha", "--lambda-A",
    "--lambda-kl", "--kl-prompts", "--kl-top-k", "--teacher-logits-mb", "--prompt-len", "--answer-len",
    "--prompt-ids", "--eval-tasks-from", "--far-prompts", "--far-len", "--save-self-study", "--self-study",
    "--stop-after", "--checkpoint-every", "--eval-train", NULL};

/* 1 if a is one of STUDY_OPTIONS. */
static int study_option(const char *a) {
    for (int k = 0; STUDY_OPTIONS[k]; k++)
        if (!strcmp(a, STUDY_OPTIONS[k])) return 1;
    return 0;
}

int train_options_parse(int argc, char **argv, TrainOptions *o, void (*usage)(FILE *), int study) {
    *o = (TrainOptions){.arch = NOT_GIVEN, .loss_preset = NOT_GIVEN, .rho = 0.1f, .lr = 3e-2f, .kl_lr = NAN,
                        .warmup_fraction = 0.05f, .lambda_alpha = NAN, .lambda_A = NAN, .lambda_kl = NAN,
                        .kl_prompts = 2, .steps = NOT_GIVEN, .kl_steps = NOT_GIVEN, .batch = 64,
                        .n_prompts = NOT_GIVEN, .n_tasks = NOT_GIVEN, .prompt_len = NOT_GIVEN,
                        .answer_len = NOT_GIVEN, .kl_top_k = NOT_GIVEN, .chat = -1, .eval_tasks = NOT_GIVEN,
                        .far_len = 512, .teacher_logits_mb = 2048, .depth_backbone = 1, .depth_score = 1,
                        .depth_target = 1, .groups = "", .seed = 1234};
    SeenOptions seen = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        if (!study && study_option(a)) {
            fprintf(stderr, "error: %s is a study option: run the same command as ./study fit ... %s "
                    "(./study fit --help)\n", a, a);
            return -1;
        }
        if (option_once(&seen, a) != 0 ||
            ((!strcmp(a, "--chat") || !strcmp(a, "--no-chat")) && option_once(&seen, "--chat or --no-chat") != 0))
            return -1;
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--eval-train")) { o->eval_train = 1; continue; }
        if (!strcmp(a, "--gpu")) { o->gpu = 1; continue; }
        if (!strcmp(a, "--chat")) { o->chat = 1; continue; }
        if (!strcmp(a, "--no-chat")) { o->chat = 0; continue; }
        if (!strcmp(a, "--later-document")) { o->later_document = 1; continue; }
        if (i + 1 >= argc) { report_last_option(a, VALUE_OPTIONS); return -1; }
        if (parse_value_option(a, argv[++i], o) != 0) return -1;
    }
    const char *why = check_options(o);
    if (why) { fprintf(stderr, "error: %s\n", why); return -1; }
    return check_outputs(o);
}

/* ------------------------------------------------------------------------ */
/* The model, the tokenizer and the document                                */

typedef struct {
    Model model;
    Tokenizer tok, *tokp;  /* tokp: &tok when -z was given, else NULL */
    int n_doc, *doc_ids;   /* (n_doc) the document's token ids */
    char *doc_text;        /* the document's text (NULL for token ids) */
    DocCache cache;
    Document doc;          /* the exact document: its KV cache */
    Questions qa;          /* --qa: the questions, and each option as a prompt after the document */
    PromptSet qa_prompts;
} Inputs;

/* The document's token ids: from an id file, or its text encoded with BOS
 * first where the tokenizer adds one, framed as a chat turn with --chat (at
 * most seq_len tokens); with --later-document, as it continues others. */
static int read_document(const TrainOptions *o, Inputs *in) {
    const Config *c = &in->model.config;
    if (o->doc_ids_path) {
        in->n_doc = read_token_ids(o->doc_ids_path, &in->doc_ids);
        return in->n_doc < 0 ? -1 : 0;
    }
    if (!in->tokp) {
        fprintf(stderr, "error: a text document needs a tokenizer (-z, or a GGUF model)\n");
        return -1;
    }
    in->doc_text = read_text_file(o->doc_text_path);
    if (!in->doc_text) return -1;
    in->doc_ids = encode_document(in->tokp, in->doc_text, o->chat, o->later_document, c->seq_len, &in->n_doc);
    return in->doc_ids ? 0 : -1;
}

/* The recipe for model m, read as a chat or not: the last of RECIPES that
 * is for it. A recipe other than the first is named on stderr, with what
 * it sets. */
static const Recipe *recipe_for(const Model *m, int chat) {
    const Recipe *r = NULL;
    for (size_t k = 0; k < sizeof RECIPES / sizeof *RECIPES; k++)
        if (RECIPES[k].chat == chat && m->n_params >= RECIPES[k].min_params) r = &RECIPES[k];
    if (r == &RECIPES[0]) return r;
    fprintf(stderr, "a model of %.0fM parameters read as %s: the %s recipe's defaults hold where the command line "
            "is silent (%s, %d %s steps then %d KL steps at %g, the teacher's top %d; %d spans, %d tasks, "
            "%d evaluation-only tasks)\n", m->n_params / 1e6, chat ? "a chat" : "plain text", r->name,
            r->arch == ARCH_MLP ? "MLP" : "quadrature", r->steps, LOSS_NAMES[r->loss], r->kl_steps, r->kl_lr, r->kl_top_k, r->n_prompts,
            r->n_tasks, r->eval_tasks);
    return r;
}

/* Chat or not (-1: chat for a model with a ChatML template and a text
 * document), and the recipe that goes with it. */
static int choose_chat(TrainOptions *o, const Model *m, const Tokenizer *tok) {
    int has_template = tok && tok->chat_system;
    if (o->chat == 1 && !has_template) {
        fprintf(stderr, "error: --chat needs a tokenizer with a ChatML chat template (a GGUF chat model)\n");
        return -1;
    }
    if (o->chat == -1) {
        o->chat = has_template && o->doc_text_path && !o->prompts_ids_path;
        if (o->chat) fprintf(stderr, "the model has a chat template: the document is a chat turn, self-study "
                             "writes chat tasks (./study fit --no-chat: plain text; infer needs --chat)\n");
    }
    const char *why = apply_recipe(o, recipe_for(m, o->chat));
    if (why) { fprintf(stderr, "error: %s\n", why); return -1; }
    return 0;
}

static int load_inputs(TrainOptions *o, Inputs *in) {
    memset(in, 0, sizeof(*in));
    if (model_load(&in->model, o->model_path) != 0) return -1;
    const Config *c = &in->model.config;
    if (o->batch > INT_MAX / c->n_heads) {  /* a step's module queries, batch x n_heads, are counted in int */
        fprintf(stderr, "error: --batch %d is too large for a model of %d heads; keep it below %d\n",
                o->batch, c->n_heads, INT_MAX / c->n_heads);
        return -1;
    }
    int refused;
    const char *tok_path = tokenizer_source(o->model_path, o->tok_path, &refused);
    if (refused) return -1;
    if (tok_path) {
        if (tokenizer_load(&in->tok, tok_path, c->vocab_size) != 0) return -1;
        in->tokp = &in->tok;
    }
    if (choose_chat(o, &in->model, in->tokp) != 0) return -1;
    if (o->kl_top_k > c->vocab_size) {
        fprintf(stderr, "error: --kl-top-k %d is more than the model's vocabulary of %d tokens\n", o->kl_top_k,
                c->vocab_size);
        return -1;
    }
    if (o->prompts_text_path && !in->tokp) {
        fprintf(stderr, "error: --prompts needs a tokenizer (-z, or a GGUF model); use --prompt-ids for token ids\n");
        return -1;
    }
    if (o->qa_path && !in->tokp) {
        fprintf(stderr, "error: --qa needs a tokenizer (-z, or a GGUF model): its questions are text\n");
        return -1;
    }
    if (read_document(o, in) != 0) return -1;
    if (in->n_doc < 2) { fprintf(stderr, "error: the document needs at least 2 tokens\n"); return -1; }
    if (o->qa_path && (questions_load(&in->qa, o->qa_path) != 0 ||
                       questions_prompts(&in->qa, in->tokp, o->chat, c->seq_len - in->n_doc, &in->qa_prompts) != 0))
        return -1;
    if (check_tokens(&in->model, in->doc_ids, in->n_doc, "document") != 0) return -1;
    int prompt_cap = o->prompt_len < in->n_doc ? o->prompt_len : in->n_doc;
    if (in->n_doc + prompt_cap > c->seq_len) {
        fprintf(stderr, "error: document (%d tokens) plus prompts (up to %d) exceed the model's context of %d; "
                "shorten the document or the prompts (./study fit --prompt-len)\n", in->n_doc, prompt_cap, c->seq_len);
        return -1;
    }
    if (doccache_build(&in->cache, &in->model, in->doc_ids, in->n_doc, 256) != 0) return -1;
    in->doc = (Document){DOC_EXACT, in->n_doc, &in->cache, NULL, NULL};
    return 0;
}

static void inputs_free(Inputs *in) {
    doccache_free(&in->cache);
    questions_free(&in->qa);
    promptset_free(&in->qa_prompts);
    free(in->doc_ids);
    free(in->doc_text);
    if (in->tokp) tokenizer_free(in->tokp);
    model_free(&in->model);
}

/* 1 if one of b's prompts starts with the question of prompt i of a (the
 * rule that keeps a question of the evaluation-only tasks out of training). */
static int question_among(const PromptSet *a, int i, const PromptSet *b) {
    int n = a->question_len[i];
    for (int j = 0; j < b->n_prompts; j++)
        if (b->offsets[j + 1] - b->offsets[j] >= n &&
            !memcmp(a->tokens + a->offsets[i], b->tokens + b->offsets[j], (size_t)n * sizeof(int)))
            return 1;
    return 0;
}

/* --eval-tasks-from: the evaluation-only tasks of a module file fitted to
 * this model and document, answered by the same full cache. Refused when
 * their answers follow other conventions than this run's prompts (all), or
 * one of them is among this run's self-study prompts. */
static int load_eval_tasks(const char *path, const Inputs *in, const PromptSet *all, PromptSet *out) {
    ModuleSet file;
    if (moduleset_load(&file, path, in->model.fingerprint, in->cache.fingerprint) != 0) return -1;
    const PromptSet *h = &file.heldout;
    unsigned char *is_task = xmalloc((size_t)h->n_prompts + 1);
    for (int i = 0; i < h->n_prompts; i++) is_task[i] = h->split[i] == SPLIT_TASKS;
    *out = select_prompts(h, is_task, 1);
    free(is_task);
    const char *why = out->n_prompts == 0 ? "it holds no evaluation-only tasks" : NULL;
    if (!why && (h->answer_cap != all->answer_cap || memcmp(h->answer_stop, all->answer_stop, sizeof h->answer_stop) ||
                 h->n_nodoc_prefix != all->n_nodoc_prefix ||
                 memcmp(h->nodoc_prefix, all->nodoc_prefix, (size_t)h->n_nodoc_prefix * sizeof(int))))
        why = "its answers end and start otherwise than this run's (--chat, --answer-len)";
    for (int i = 0; !why && i < out->n_prompts; i++)
        if (question_among(out, i, all)) why = "one of its tasks asks what a self-study prompt of this run asks";
    moduleset_free(&file);
    if (!why) {
        fprintf(stderr, "%d evaluation-only tasks from %s\n", out->n_prompts, path);
        return 0;
    }
    fprintf(stderr, "error: --eval-tasks-from %s: %s\n", path, why);
    promptset_free(out);
    return -1;
}

/* --self-study: the prompts and evaluation-only tasks of a self-study
 * file made with this model for this document, whose answers end and start
 * as this run's. */
static int read_self_study(const TrainOptions *o, const Inputs *in, PromptSet *all, PromptSet *eval_tasks) {
    if (selfstudy_load(o->self_study_path, in->model.fingerprint, in->cache.fingerprint, all, eval_tasks) != 0)
        return -1;
    const PromptSet *sets[2] = {all, eval_tasks};  /* ids within the vocabulary, lengths within the context */
    for (int k = 0; k < 2; k++) {
        const PromptSet *p = sets[k];
        if (p->n_prompts > 0 && check_tokens(&in->model, p->tokens, p->offsets[p->n_prompts], o->self_study_path) != 0)
            return -1;
        if (p->n_prompts > 0 && in->n_doc + promptset_max_len(p) > in->model.config.seq_len) {
            fprintf(stderr, "error: --self-study %s: a prompt of %d tokens after the document (%d) exceeds the context "
                    "of %d\n", o->self_study_path, promptset_max_len(p), in->n_doc, in->model.config.seq_len);
            return -1;
        }
    }
    PromptSet want = {.answer_cap = o->answer_len};  /* this run's conventions, as make_prompt_set sets them */
    answer_conventions(in->tokp, o->chat, &want);
    int same = all->answer_cap == want.answer_cap && !memcmp(all->answer_stop, want.answer_stop, sizeof want.answer_stop) &&
               all->n_nodoc_prefix == want.n_nodoc_prefix &&
               !memcmp(all->nodoc_prefix, want.nodoc_prefix, (size_t)want.n_nodoc_prefix * sizeof(int));
    promptset_free(&want);
    if (same) {
        fprintf(stderr, "%d self-study prompts and %d evaluation-only tasks from %s\n", all->n_prompts,
                eval_tasks->n_prompts, o->self_study_path);
        return 0;
    }
    fprintf(stderr, "error: --self-study %s: its answers end and start otherwise than this run's (--chat, "
            "--answer-len)\n", o->self_study_path);
    return -1;
}

/* Self-study's options and inputs (selfstudy.h), as train's options set them. */
static void selfstudy_setup(const TrainOptions *o, const Inputs *in, SelfStudyOptions *so, SelfStudyInputs *si) {
    *so = (SelfStudyOptions){o->n_prompts, o->n_tasks, o->prompt_len, o->answer_len, o->chat, o->seed,
                             o->prompts_text_path, o->prompts_ids_path, NULL, 0,  /* no label, not eval-only */
                             o->far_prompts, o->far_len};
    *si = (SelfStudyInputs){&in->model, in->tokp, in->doc_text, in->doc_ids, in->n_doc, &in->doc};
}

/* Self-study with train's options (selfstudy.c), and the evaluation-only
 * tasks, made as its tasks from another seed or taken from a module file;
 * or both from a self-study file. --save-self-study writes them. */
static int make_prompts(const TrainOptions *o, const Inputs *in, PromptSet *all, PromptSet *eval_tasks) {
    SelfStudyOptions so;
    SelfStudyInputs si;
    selfstudy_setup(o, in, &so, &si);
    if (o->self_study_path) return read_self_study(o, in, all, eval_tasks);
    if (make_prompt_set(&so, &si, all) != 0) return -1;
    if (o->eval_tasks_from && load_eval_tasks(o->eval_tasks_from, in, all, eval_tasks) != 0) return -1;
    if (!o->eval_tasks_from) make_eval_tasks(&so, &si, all, o->eval_tasks, eval_tasks);
    if (!o->save_self_study_path) return 0;
    if (selfstudy_save(o->save_self_study_path, all, eval_tasks, in->model.fingerprint, in->cache.fingerprint) != 0)
        return -1;
    fprintf(stderr, "wrote the self-study to %s\n", o->save_self_study_path);
    return 0;
}

/* --far-prompts: prompts far from the document, made from the training
 * prompts' questions (so that no held-out answer is trained on), join the
 * set as training prompts. */
static void add_far_prompts(const TrainOptions *o, const Inputs *in, PromptSet *all, unsigned char **is_train) {
    SelfStudyOptions so;
    SelfStudyInputs si;
    selfstudy_setup(o, in, &so, &si);
    PromptSet far;
    make_far_prompts(&so, &si, all, *is_train, &far);
    PromptSet joined = join_prompts(all, &far, SPLIT_RANDOM);
    *is_train = realloc(*is_train, (size_t)joined.n_prompts + 1);
    if (!*is_train) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    memset(*is_train + all->n_prompts, 1, far.n_prompts);
    promptset_free(all); promptset_free(&far);
    *all = joined;
}

/* ------------------------------------------------------------------------ */
/* Teacher pass                                                             */

/* The fit's settings from the options. */
static FitOptions fit_options(const TrainOptions *o) {
    return (FitOptions){.steps = o->steps, .kl_steps = o->kl_steps, .batch = o->batch, .kl_prompts = o->kl_prompts,
                        .lr = o->lr, .kl_lr = o->kl_lr, .weight_decay = o->weight_decay,
                        .warmup_fraction = o->warmup_fraction, .lambda_alpha = o->lambda_alpha,
                        .lambda_A = o->lambda_A, .lambda_kl = o->lambda_kl, .seed = o->seed};
}

/* The teacher pass's progress line. */
static void print_teacher_progress(const char *what, long done, long total, void *user) {
    print_progress(what, (int)done, (int)total, *(const double *)user);
}

/* The teacher pass over every prompt (teacher_pass): the training prompts'
 * targets into td, and for the KL term the teacher's top k or logits (kept
 * up to logits_mb); every prompt's embedding (D). */
static int run_teacher_pass(const TrainOptions *o, const Inputs *in, const PromptSet *p, const unsigned char *is_train,
                            TeacherData *td, float *embed) {
    const Config *c = &in->model.config;
    FitOptions fo = fit_options(o);
    int want_logits = fit_uses_kl(&fo);
    size_t budget = (size_t)o->teacher_logits_mb << 20;
    size_t bytes = teacher_alloc(td, c, p, is_train, want_logits, o->kl_top_k, budget);
    fprintf(stderr, "teacher pass: %d prompts, %ld training positions, %.1f MB of targets%s\n", p->n_prompts,
            td->fit.P, bytes / 1e6, want_logits && !td->logits && !td->top_k ? " (its logits, above "
            "./study fit --teacher-logits-mb, are recomputed at each KL step)" : "");
    double t0 = now_seconds();
    int rc = teacher_pass(&in->model, &in->doc, p, is_train, td, embed, print_teacher_progress, &t0);
    fprintf(stderr, "\n");
    return rc;
}

/* Challenge split: the held-out prompts whose embedding is least similar
 * (max cosine over training prompts) to any training prompt; a quarter of them. */
static void mark_challenge(PromptSet *p, const unsigned char *is_train, const float *embed, int D) {
    int n = p->n_prompts, n_held = 0;
    float *best = xmalloc(n * sizeof(float));
    for (int i = 0; i < n; i++) {
        p->split[i] = SPLIT_RANDOM;
        if (is_train[i]) continue;
        n_held++;
        best[i] = -2;
        for (int j = 0; j < n; j++) {
            if (!is_train[j]) continue;
            double dot = 0, ni = 0, nj = 0;
            for (int k = 0; k < D; k++) {
                dot += embed[(size_t)i * D + k] * embed[(size_t)j * D + k];
                ni += embed[(size_t)i * D + k] * embed[(size_t)i * D + k];
                nj += embed[(size_t)j * D + k] * embed[(size_t)j * D + k];
            }
            float cosine = (float)(dot / sqrt(ni * nj + 1e-30));
            best[i] = cosine > best[i] ? cosine : best[i];
        }
    }
    int want = (n_held + 3) / 4;
    for (int picked = 0; picked < want; picked++) {  /* the `want` lowest best[] */
        int pick = -1;
        for (int i = 0; i < n; i++)
            if (!is_train[i] && p->split[i] != SPLIT_CHALLENGE && (pick < 0 || best[i] < best[pick])) pick = i;
        p->split[pick] = SPLIT_CHALLENGE;
    }
    free(best);
}

/* ------------------------------------------------------------------------ */
/* Budget                                                                   */

/* Per-layer multipliers from "a-b:m,..." (layers [a, b) get m), normalised
 * so that they average 1 over the layers: the total budget is unchanged. */
static int layer_multipliers(const char *spec, int L, float *mult) {
    for (int l = 0; l < L; l++) mult[l] = 1.0f;
    if (!spec[0]) return 0;
    for (const char *p = spec; *p;) {
        int a, b, used;
        float m;
        if (sscanf(p, "%d-%d:%f%n", &a, &b, &m, &used) != 3 || a < 0 || b > L || a >= b || !(m > 0)) {
            fprintf(stderr, "error: --groups '%s': expected a-b:m,... with 0 <= a < b <= %d and m > 0\n", spec, L);
            return -1;
        }
        for (int l = a; l < b; l++) mult[l] = m;
        p += used;
        if (*p == ',') p++;
        else if (*p) { fprintf(stderr, "error: --groups '%s': unexpected '%s'\n", spec, p); return -1; }
    }
    double sum = 0;
    for (int l = 0; l < L; l++) sum += mult[l];
    for (int l = 0; l < L; l++) mult[l] *= (float)(L / sum);
    return 0;
}

/* The module set within the budget: rho * 2 n d parameters per (layer, KV
 * head), times the layer's multiplier. Prints the budget table. */
static int make_modules(const TrainOptions *o, const Inputs *in, ModuleSet *ms) {
    const Config *c = &in->model.config;
    int L = c->n_layers, G = c->n_kv_heads, d = c->dim / c->n_heads, n_doc = in->n_doc;
    float *mult = xmalloc(L * sizeof(float));  /* (L) */
    int rc = layer_multipliers(o->groups, L, mult);
    if (rc == 0) rc = moduleset_for_budget(ms, &in->model, &in->cache, o->arch, o->rho, o->depth_backbone,
                                           o->depth_score, o->depth_target, mult, 1);
    if (rc != 0) { free(mult); return -1; }
    ms->chat = o->chat;
    ms->later = o->later_document;
    long kv_entries = 2L * n_doc * d * L * G;
    FILE *info = o->json ? stderr : stdout;
    fprintf(info, "budget: %s, rho %.3g, document %d tokens, %d layers x %d KV heads, head size %d\n",
            o->arch == ARCH_MLP ? "MLP" : "quadrature", o->rho, n_doc, L, G, d);
    fprintf(info, "  %-6s %6s %8s %12s %12s %8s\n", "layer", "mult", o->arch == ARCH_MLP ? "width" : "pairs",
            "params/mod", "KV entries", "rho");
    for (int l = 0; l < L; l++) {
        const Module *mod = &ms->modules[l * G];
        fprintf(info, "  %-6d %6.2f %8d %12zu %12ld %8.4f\n", l, mult[l], o->arch == ARCH_MLP ? mod->width
                : mod->n_pairs, mod->n_params, 2L * n_doc * d, mod->n_params / (2.0 * n_doc * d));
    }
    fprintf(info, "  total %zu params for %ld KV entries: rho %.4f\n", ms->n_params, kv_entries,
            (double)ms->n_params / kv_entries);
    free(mult);
    return 0;
}

/* 1 if two prompt sets hold the same prompts, token for token. */
static int same_prompts(const PromptSet *a, const PromptSet *b) {
    int n = a->n_prompts;
    if (n != b->n_prompts) return 0;
    return n == 0 || (!memcmp(a->offsets, b->offsets, (n + 1) * sizeof(int)) &&
                      !memcmp(a->tokens, b->tokens, (size_t)a->offsets[n] * sizeof(int)));
}

/* --init's file, loaded into `file` for this model and document if its
 * modules have the shape of ms (the modules this run makes): 0, or -1 after
 * a sentence. */
static int load_init(const char *path, const Inputs *in, const ModuleSet *ms, ModuleSet *file) {
    if (moduleset_load(file, path, in->model.fingerprint, in->cache.fingerprint) != 0) return -1;
    const char *why = NULL;
    if (file->n_layers != ms->n_layers || file->n_kv_heads != ms->n_kv_heads || file->head_size != ms->head_size ||
        file->n_doc != ms->n_doc)
        why = "its modules are for another model shape or document length; the file is corrupt";
    else if (file->arch != ms->arch || file->n_params != ms->n_params || file->depth_backbone != ms->depth_backbone ||
             file->depth_score != ms->depth_score || file->depth_target != ms->depth_target)
        why = "its modules have another architecture, depth or budget";
    for (int i = 0; !why && i < ms->n_layers * ms->n_kv_heads; i++)
        if (file->modules[i].n_params != ms->modules[i].n_params) why = "its modules have other sizes (--groups)";
    if (!why) return 0;
    fprintf(stderr, "error: --init %s: %s\n", path, why);
    moduleset_free(file);
    return -1;
}

/* --init: the modules of `file` (load_init) into ms, if they held out this
 * run's held-out prompts (modules that saw them in their fit would flatter
 * its metrics); file is freed. */
static int init_from_file(const char *path, ModuleSet *file, ModuleSet *ms) {
    const char *why = same_prompts(&file->heldout, &ms->heldout) ? NULL
                      : "it held out other prompts (other self-study options or seed)";
    if (why) fprintf(stderr, "error: --init %s: %s\n", path, why);
    else {
        memcpy(ms->params, file->params, ms->n_params * sizeof(float));
        for (int i = 0; i < ms->n_layers * ms->n_kv_heads; i++) ms->modules[i].input_scale = file->modules[i].input_scale;
        fprintf(stderr, "starting from the modules of %s\n", path);
    }
    moduleset_free(file);
    return why ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Fitting                                                                  */

/* The device the fit runs on; NULL after a sentence when --gpu finds no
 * usable GPU. */
static const FitBackend *fit_backend(const TrainOptions *o) {
#ifdef NECTAR_CUDA
    if (o->gpu) return nectar_cuda_init() == 0 ? fit_backend_cuda() : NULL;
#endif
    return fit_backend_cpu();
}

/* Checkpoint: header, then params, Adam m and v. */
enum { CKPT_MAGIC = 0x4B43544E /* "NTCK" */, CKPT_VERSION = 1 };
typedef struct { uint32_t magic, version; int32_t step, reserved; uint64_t n_params, run_hash; } CkptHeader;

static int save_checkpoint(const char *path, const Fit *f, uint64_t run_hash) {
    CkptHeader h = {CKPT_MAGIC, CKPT_VERSION, f->step, 0, f->ms->n_params, run_hash};
    size_t bytes = f->ms->n_params * sizeof(float);
    const void *parts[4] = {&h, f->ms->params, f->adam_m, f->adam_v};
    size_t sizes[4] = {sizeof h, bytes, bytes, bytes};
    return write_file_atomic(path, parts, sizes, 4);
}

static int load_checkpoint(const char *path, Fit *f, uint64_t run_hash, int steps) {
    FILE *file = fopen(path, "rb");
    if (!file) { fprintf(stderr, "error: cannot open checkpoint %s\n", path); return -1; }
    CkptHeader h;
    size_t n = f->ms->n_params;
    const char *why = NULL;
    if (fread(&h, sizeof h, 1, file) != 1 || h.magic != CKPT_MAGIC || h.version != CKPT_VERSION)
        why = "it is not a train checkpoint";
    else if (h.n_params != n || h.run_hash != run_hash)
        why = "it was written by a run with other data or options";
    else if (h.step < 1 || h.step > steps) why = "its step count is corrupt";
    else if (fread(f->ms->params, sizeof(float), n, file) != n || fread(f->adam_m, sizeof(float), n, file) != n ||
             fread(f->adam_v, sizeof(float), n, file) != n || fgetc(file) != EOF)
        why = "it is truncated or corrupt";
    fclose(file);
    if (why) { fprintf(stderr, "error: checkpoint %s: %s\n", path, why); return -1; }
    f->step = h.step;
    return 0;
}

/* What the progress callback keeps: the options, the checkpoint's run
 * hash, and the progress line's times: the fit's start, the last step's
 * end, the current stage's start and the step it began at here (stage -1
 * before the first step). */
typedef struct {
    const TrainOptions *o;
    uint64_t run_hash;
    double t_fit, t_step, t_stage, last_print;
    int stage, stage_start;
} FitProgress;

/* After each step: the progress line, at most once a second and at the last
 * step of a stage or of the run (the time since the fit started, and the
 * ETA of the stage at its own pace: a KL step is a forward and a backward
 * of the model, a regression step far less); then the checkpoint when one
 * is due. */
static int fit_progress(Fit *f, const FitStatus *st, void *user) {
    FitProgress *p = user;
    const TrainOptions *o = p->o;
    const Stage *s = &f->stages[st->stage];
    double now = now_seconds();
    if (st->stage != p->stage) {
        p->stage = st->stage;
        p->t_stage = p->t_step;
        p->stage_start = st->step - 1;
    }
    p->t_step = now;
    int stage_end = s->first + s->steps, next_stage = st->stage == 0 && o->kl_steps > 0;
    if (now - p->last_print >= 1.0 || st->step == stage_end || st->step == st->last_step) {
        p->last_print = now;
        double eta = (now - p->t_stage) / (st->step - p->stage_start) * (stage_end - st->step);
        fprintf(stderr, "\rstep %d/%d%s  loss %.5f  lr %.2e  |g| %.3f  %.1fs  ETA %.0fs%s   ", st->step,
                total_steps(o), st->stage ? " (KL)" : "", st->loss, st->lr, st->grad_norm, now - p->t_fit, eta,
                next_stage ? " + the KL stage" : "");
        if (st->step == stage_end && next_stage && st->step < st->last_step) fprintf(stderr, "\n");
    }
    if (!o->checkpoint_path || (st->step % o->checkpoint_every != 0 && st->step != st->last_step)) return 0;
    fit_sync(f);
    return save_checkpoint(o->checkpoint_path, f, p->run_hash);
}

/* A hash of everything the fit depends on: a checkpoint of another run is
 * refused. */
static uint64_t run_fingerprint(const TrainOptions *o, const Inputs *in, const PromptSet *all) {
    uint64_t h = fnv1a(FNV_OFFSET, &o->arch, sizeof o->arch);
    float floats[] = {o->rho, o->lr, o->weight_decay, o->warmup_fraction, o->lambda_alpha, o->lambda_A, o->lambda_kl};
    int ints[] = {o->steps, o->batch, o->kl_prompts, o->n_prompts, o->n_tasks, o->prompt_len, o->answer_len,
                  o->depth_backbone, o->depth_score, o->depth_target};
    h = fnv1a(h, floats, sizeof floats);
    h = fnv1a(h, ints, sizeof ints);
    if (o->kl_steps > 0) {  /* hashed where there is a KL stage: a checkpoint of a run without one stays valid */
        h = fnv1a(h, &o->kl_steps, sizeof o->kl_steps);
        h = fnv1a(h, &o->kl_lr, sizeof o->kl_lr);
    }
    if (o->kl_top_k > 0) h = fnv1a(h, &o->kl_top_k, sizeof o->kl_top_k);  /* likewise */
    h = fnv1a(h, &o->seed, sizeof o->seed);
    h = fnv1a(h, o->groups, strlen(o->groups));
    h = fnv1a(h, &in->model.fingerprint, sizeof(uint64_t));
    h = fnv1a(h, &in->cache.fingerprint, sizeof(uint64_t));
    return fnv1a(h, all->tokens, all->offsets[all->n_prompts] * sizeof(int));
}

/* --resume: the modules and Adam moments of a checkpoint of this run. */
static int resume(const TrainOptions *o, Fit *f, uint64_t run_hash) {
    if (load_checkpoint(o->resume_path, f, run_hash, total_steps(o)) != 0) return -1;
    fprintf(stderr, "resumed from %s at step %d\n", o->resume_path, f->step);
    if (o->stop_after > 0 && o->stop_after <= f->step) {
        fprintf(stderr, "error: --stop-after %d is not after the checkpoint's step %d\n", o->stop_after, f->step);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Metrics and the module file                                              */

/* The metrics of the run: the held-out prompts' (every split: EVAL_*), with
 * --eval-train the training prompts', with --qa the questions'. */
typedef struct {
    EvalResult split[EVAL_SPLITS], train_split;
    QaResult qa;
} Results;

/* The results as one JSON object, or as tables. */
static void print_results(const TrainOptions *o, const Inputs *in, const ModuleSet *ms, const TeacherData *td,
                          const Results *r, double fit_seconds, double t_start) {
    const Config *c = &in->model.config;
    if (!o->json) {
        print_eval_splits_table(stdout, r->split, c->n_layers);
        if (o->eval_train) print_eval_table(stdout, "training prompts (what the fit saw)", &r->train_split, c->n_layers);
        if (o->qa_path) print_qa_table(stdout, &in->qa, &r->qa);
        return;
    }
    long kv_entries = 2L * in->n_doc * (c->dim / c->n_heads) * c->n_layers * c->n_kv_heads;
    printf("{\"arch\": \"%s\", \"rho\": %.6g, \"params\": %zu, \"kv_entries\": %ld, \"n_doc\": %d, "
           "\"train_prompts\": %d, \"train_positions\": %ld, \"steps\": %d, \"kl_steps\": %d, \"kl_top_k\": %d, "
           "\"loss\": \"%s\", \"lr\": %g, \"kl_lr\": %g, \"fit_seconds\": %.3f, \"total_seconds\": %.3f, ",
           o->arch == ARCH_MLP ? "mlp" : "quad", o->rho, ms->n_params, kv_entries, in->n_doc, td->n_train,
           td->fit.P, o->steps, o->kl_steps, o->kl_top_k, LOSS_NAMES[o->loss_preset], o->lr, o->kl_lr, fit_seconds,
           now_seconds() - t_start);
    print_eval_splits_json(stdout, r->split);
    if (o->eval_train) {
        printf(", \"train\": ");
        print_eval_json(stdout, &r->train_split);
    }
    if (o->qa_path) {
        printf(", \"qa\": ");
        print_qa_json(stdout, &in->qa, &r->qa);
    }
    printf("}\n");
}

/* The metrics (evaluate refuses modules whose outputs are not finite), then
 * the module file with the held-out prompts, then the tables or JSON. */
static int evaluate_and_save(const TrainOptions *o, const Inputs *in, ModuleSet *ms, const TeacherData *td,
                             const PromptSet *fitted, double fit_seconds, double t_start) {
    const Config *c = &in->model.config;
    Results r = {0};
    EvalResult train_splits[EVAL_SPLITS];
    Document nectar = {DOC_NECTAR, ms->n_doc, NULL, ms, NULL};
    if (evaluate(&in->model, &in->doc, &nectar, &ms->heldout, r.split) != 0) return -1;
    if (o->eval_train) {
        if (evaluate(&in->model, &in->doc, &nectar, fitted, train_splits) != 0) return -1;
        r.train_split = train_splits[EVAL_RANDOM];
        evalresult_free(&train_splits[EVAL_CHALLENGE]); evalresult_free(&train_splits[EVAL_TASKS]);
    }
    if (o->qa_path && qa_evaluate(&in->model, &in->doc, &nectar, &in->qa, &in->qa_prompts, &r.qa) != 0) return -1;
    if (moduleset_save(ms, o->out_path) != 0) return -1;
    long kv_entries = 2L * in->n_doc * (c->dim / c->n_heads) * c->n_layers * c->n_kv_heads;
    fprintf(stderr, "wrote %s: %zu parameters, %.1f KB (document KV state: %.1f KB)\n", o->out_path,
            ms->n_params, ms->n_params * 4 / 1e3, kv_entries * 4 / 1e3);
    print_results(o, in, ms, td, &r, fit_seconds, t_start);
    fprintf(stderr, "fitting took %.1fs (%d steps), the whole run %.1fs\n", fit_seconds, total_steps(o),
            now_seconds() - t_start);
    for (int k = 0; k < EVAL_SPLITS; k++) evalresult_free(&r.split[k]);
    evalresult_free(&r.train_split);
    qaresult_free(&r.qa);
    return 0;
}

/* ------------------------------------------------------------------------ */

/* Everything a run holds, freed by run_free whichever step it stopped at. */
typedef struct {
    Inputs in;
    ModuleSet ms, init;          /* the modules; --init's file until it is copied in */
    PromptSet all, eval_tasks;   /* self-study, and the evaluation-only tasks */
    unsigned char *is_train;     /* (all.n_prompts) the split */
    TeacherData td;
    Fit fit;
} Run;

static void run_free(Run *r) {
    free(r->is_train);
    fit_end(&r->fit);
    teacherdata_free(&r->td);
    moduleset_free(&r->ms); moduleset_free(&r->init);
    promptset_free(&r->all); promptset_free(&r->eval_tasks);
    inputs_free(&r->in);
}

/* 3. the teacher pass and the challenge split; 4. the modules initialised,
 * with the held-out prompts and the evaluation-only tasks. */
static int teach_and_initialise(const TrainOptions *o, Run *r) {
    const Config *c = &r->in.model.config;
    float *embed = xmalloc((size_t)r->all.n_prompts * c->dim * sizeof(float));
    int rc = run_teacher_pass(o, &r->in, &r->all, r->is_train, &r->td, embed);
    if (rc == 0) mark_challenge(&r->all, r->is_train, embed, c->dim);
    free(embed);
    if (rc != 0) return -1;
    PromptSet heldout = select_prompts(&r->all, r->is_train, 0);
    r->ms.heldout = join_prompts(&heldout, &r->eval_tasks, SPLIT_TASKS);
    promptset_free(&heldout);
    if (o->init_path) return init_from_file(o->init_path, &r->init, &r->ms);
    moduleset_init(&r->ms, &r->td.fit, &r->in.cache, c, o->seed + 7);
    return 0;
}

/* The sentence for a fit that diverged at its last step. */
static void print_divergence(const TrainOptions *o, const Fit *f) {
    int kl_stage = f->stage == &f->stages[1];
    fprintf(stderr, "\nerror: training diverged at step %d%s (loss %g, gradient norm %g); lower %s (%g)%s\n",
            f->step, kl_stage ? " (KL)" : "", f->diverged_loss, f->diverged_norm, kl_stage ? "--kl-lr" : "--lr",
            f->stage->lr, kl_stage ? " or --wd (./study fit)" : "; ./study fit: --wd or the loss weights");
}

/* 5. fitting, from a checkpoint with --resume, to the last step asked for:
 * *stopped when that is before the end. */
static int fit_run(const TrainOptions *o, const FitBackend *backend, Run *r, double *fit_seconds, int *stopped) {
    FitOptions fo = fit_options(o);
    if (fit_begin(&r->fit, &r->in.model, &r->ms, &r->td, &r->all, &r->in.doc, &fo, backend) != 0) return -1;
    FitProgress progress = {.o = o, .run_hash = run_fingerprint(o, &r->in, &r->all), .stage = -1};
    if (o->resume_path && resume(o, &r->fit, progress.run_hash) != 0) return -1;
    int last_step = o->stop_after > 0 && o->stop_after < total_steps(o) ? o->stop_after : total_steps(o);
    progress.t_fit = progress.t_step = now_seconds();
    int rc = fit_steps(&r->fit, last_step, fit_progress, &progress);
    if (rc == FIT_DIVERGED) print_divergence(o, &r->fit);
    else if (rc == 0) fprintf(stderr, "\n");
    *fit_seconds = now_seconds() - progress.t_fit;
    *stopped = last_step < total_steps(o);
    if (rc == 0 && *stopped)
        fprintf(stderr, "stopped after step %d as asked; resume with --resume %s%s\n", last_step,
                o->checkpoint_path ? o->checkpoint_path : "(no --checkpoint given)",
                o->init_path ? " instead of --init (the checkpoint holds the modules)" : "");
    return rc != 0 ? -1 : 0;
}

int train_run(TrainOptions *o) {
    const FitBackend *backend = fit_backend(o);
    if (!backend) return -1;
    double t_start = now_seconds(), fit_seconds = 0;
    Run r = {0};
    int stopped = 0;

    /* 1. the model, the tokenizer, the document and its KV cache; the modules
     * within the budget, and --init's: what cannot be used is refused before
     * the long steps */
    int rc = load_inputs(o, &r.in);
    if (rc == 0) rc = make_modules(o, &r.in, &r.ms);
    if (rc == 0 && o->init_path) rc = load_init(o->init_path, &r.in, &r.ms, &r.init);

    /* 2. prompts, the evaluation-only tasks and the split; then any training prompts far from the document */
    if (rc == 0) rc = make_prompts(o, &r.in, &r.all, &r.eval_tasks);
    if (rc == 0) r.is_train = split_prompts(r.all.n_prompts, o->seed);
    if (rc == 0 && o->far_prompts > 0) add_far_prompts(o, &r.in, &r.all, &r.is_train);

    /* 3. the teacher pass and the challenge split; 4. the modules initialised */
    if (rc == 0) rc = teach_and_initialise(o, &r);

    /* 5. fitting */
    if (rc == 0) rc = fit_run(o, backend, &r, &fit_seconds, &stopped);

    /* 6. metrics on the held-out prompts, the module file */
    if (rc == 0 && !stopped) {
        PromptSet fitted = o->eval_train ? select_prompts(&r.all, r.is_train, 1) : (PromptSet){0};
        rc = evaluate_and_save(o, &r.in, &r.ms, &r.td, &fitted, fit_seconds, t_start);
        promptset_free(&fitted);
    }
    run_free(&r);
#ifdef NECTAR_CUDA
    if (o->gpu) nectar_cuda_free();
#endif
    return rc != 0 ? -1 : 0;
}
