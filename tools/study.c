/* study.c - the instruments of finished studies, kept apart from the
 * programs for users: each measures Nectar's modules against the full
 * cache of their document on the held-out prompts the module file keeps
 * (or on a question file), on the CPU, for a table of docs/results.md.
 *
 *   ./study -m model.bin -z tokenizer.bin -d doc.txt -k doc.nectar --drift 1024   KL along long continuations
 *   ./study -m model.bin -z tokenizer.bin -d doc.txt -k doc.nectar --stops        where answers end
 *   ./study -m model.bin -z tokenizer.bin -d a.txt -d b.txt -k a.nectar -k b.nectar --joined
 *                                                 held to the true concatenation of the documents
 *   ./study fit -m model.bin -z tokenizer.bin -d doc.txt -o doc.nectar --batch 128 --eval-train
 *                                                 train's run with the fitting knobs and instruments
 *
 * The model, documents and modules are read and checked as infer reads
 * them (src/serve.c). main reads as its steps: the options; the model,
 * tokenizer, documents and modules; their KV caches; the instrument.
 * `study fit` is train's run (src/train_run.c) with the study options.
 */
#include "../nectar.h"
#include "../src/cli.h"
#include "../src/eval.h"
#include "../src/serve.h"
#include "../src/train_run.h"
#include "../src/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: study -m MODEL -d DOC -k MODULE INSTRUMENT [options]\n"
        "       study fit [train's options and the study options of ./study fit --help]\n"
        "The instruments of finished studies: each measures the modules of -k against the full cache\n"
        "of their document (-d/-D) on the held-out prompts kept in the module file, on the CPU.\n"
        "The model, documents and modules are given as to infer (./infer --help):\n"
        "  -m MODEL       a GGUF file or a llama2.c checkpoint (v0)\n"
        "  -z TOKENIZER   llama2.c tokenizer.bin (a GGUF model has its own)\n"
        "  -d DOC.txt     document as text (several -d, -D and -k: a composition, in order)\n"
        "  -D DOC.ids     document as token ids\n"
        "  -k MODULE      Nectar module file, given beside the document it was fitted to\n"
        "  --chat         the model's chat template, as the modules were fitted with it\n"
        "Instruments (one a run):\n"
        "  --drift N      how far from the document Nectar stays: the full cache continues held-out\n"
        "                 task prompts (its evaluation-only tasks where the module file has them)\n"
        "                 N tokens (no stop), and KL(full || Nectar, no document) and top-1 agreement\n"
        "                 along them, in bins of the distance from the document (one -k)\n"
        "  --drift-prompts K  how many held-out task prompts --drift continues (default 8)\n"
        "  --stops        where answers end: each held-out answer the full cache ends with its stop,\n"
        "                 teacher-forced, and each model's log-probability of that stop there, by\n"
        "                 the answer's length\n"
        "  --joined       with several -d/-D: the full cache is one prefill over all of them, each\n"
        "                 document attending to those before it (the true concatenation), instead\n"
        "                 of each document's KV cache made on its own; held to it, infer --eval's\n"
        "                 answers of each module file, or with --qa infer --qa's questions\n"
        "  --qa FILE      with --joined: the multiple-choice questions of FILE (-k not needed)\n"
        "  --json         one JSON object on stdout\n"
        "  --help         this text\n");
}

/* study fit's usage: the options train refuses (STUDY_OPTIONS). */
static void fit_usage(FILE *f) {
    fprintf(f,
        "usage: study fit -m MODEL (-d DOC.txt | -D DOC.ids) -o OUT.nectar [options]\n"
        "train's run (./train --help: its options hold here too), with the fitting knobs and the\n"
        "instruments of finished studies; the module file is the one train writes for the same options.\n"
        "  --no-chat         the document and prompts as plain text, even for a chat model (the plain\n"
        "                    recipes' defaults: train --help, --chat)\n"
        "  --depths B,S,T    MLP depths: backbone, score head, target head (default 1,1,1)\n"
        "  --groups SPEC     layer-group capacity multipliers a-b:m,... (layers a..b-1 get m;\n"
        "                    normalised to average 1), e.g. 0-2:1,2-4:2 for 4 layers\n"
        "  --batch N         prompt positions per step (default 64; x heads per group)\n"
        "  --wd W            weight decay (default 0)\n"
        "  --warmup F        warmup fraction of each stage's steps (default 0.05)\n"
        "  --kl-lr LR        the peak learning rate of the --kl-steps (default 3e-3; 6e-3 with --chat)\n"
        "  --lambda-alpha X  score loss weight (presets: 0.1; kl 0)\n"
        "  --lambda-A X      target loss weight (presets: 1; kl 0)\n"
        "  --lambda-kl X     KL distillation weight (presets: kl and mixed 1, regression 0)\n"
        "  --kl-prompts N    training prompts per step for the KL term (default 2)\n"
        "  --kl-top-k K      the KL term's teacher as its K likeliest tokens and one bucket for the rest\n"
        "                    (8 K + 4 bytes a position, not 4 V; the KL over K + 1 outcomes; default 32\n"
        "                    with --chat or a large model, else 0: the whole vocabulary)\n"
        "  --teacher-logits-mb N  the KL term's teacher logits are kept from the teacher pass up to N MB,\n"
        "                    else recomputed at each step, on the CPU (default 2048)\n"
        "  --prompt-len N    prompt length cap in tokens, answer included (default 80; 196 with --chat)\n"
        "  --answer-len N    answers (the full cache's greedy answer after a task or extra prompt,\n"
        "                    and the held-out answer rollouts) end at a newline, or at the end of a\n"
        "                    chat turn with --chat, or after N tokens (default 48; 128 with --chat)\n"
        "  --prompt-ids FILE extra prompts, one per line (token ids)\n"
        "  --eval-tasks-from FILE.nectar  take the evaluation-only tasks of a module file fitted to this\n"
        "                    model and document instead of making them: fits compared on the same tasks\n"
        "  --far-prompts K   K more training prompts that reach far from the document: the questions of\n"
        "                    the first K training task prompts, each continued by the full cache,\n"
        "                    greedily and past its stop, for --far-len tokens (default 0: none; with\n"
        "                    --self-study too: they are made after the split)\n"
        "  --far-len N       how far past their questions those prompts go (default 512; at most what\n"
        "                    the context leaves)\n"
        "  --save-self-study FILE  write this run's self-study prompts and evaluation-only tasks to FILE\n"
        "  --self-study FILE take the self-study prompts and evaluation-only tasks of FILE (written by\n"
        "                    --save-self-study for this model and document) instead of making them:\n"
        "                    fits compared on the same prompts; the split and the rest as -s gives them\n"
        "  --checkpoint-every N  with --checkpoint, every N steps (default a quarter of the steps)\n"
        "  --stop-after N    stop after step N (with a checkpoint), as if interrupted\n"
        "  --eval-train      the metrics on the training prompts too (what the fit saw; against the\n"
        "                    held-out ones, what generalising to new prompts costs)\n"
        "  --help            this text\n");
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */

typedef struct {
    ServeOptions serve;        /* -m, -z, -d, -D, -k, --chat, --qa */
    int drift, drift_prompts;  /* --drift N, --drift-prompts K (0: not given) */
    int stops, joined, json;
} Options;

/* The combinations that cannot run: NULL or the sentence. */
static const char *options_problem(const Options *o) {
    const ServeOptions *so = &o->serve;
    int has_ids = 0;
    for (int i = 0; i < so->n_docs; i++) has_ids |= so->docs[i].kind == DOC_IDS;
    if (o->drift_prompts && !o->drift) return "--drift-prompts needs --drift N";
    if ((o->drift > 0) + o->stops + o->joined != 1) return "give one instrument: --drift N, --stops or --joined";
    if (o->drift && so->n_modules > 1) return "--drift follows the held-out prompts of one module file; give one -k";
    if (o->joined && so->n_texts < 2) return "--joined prefills several documents as one; give two or more -d/-D";
    if (so->qa_path && !o->joined) return "--qa is held to --joined here (infer --qa holds it to the documents "
                                          "apart); add --joined";
    if (!so->qa_path && !(so->n_modules && so->n_texts))
        return "the instruments need a module file (-k) and its document (-d/-D)";
    if (so->chat && has_ids) return "--chat frames texts (-d); token ids (-D) are used as given";
    return NULL;
}

/* An option of study's own (parse_command_line reads the rest). */
static int parse_own_option(int argc, char **argv, int *i, void *options) {
    Options *o = options;
    const char *a = argv[*i];
    int *flag = !strcmp(a, "--stops") ? &o->stops : !strcmp(a, "--joined") ? &o->joined
              : !strcmp(a, "--json") ? &o->json : NULL;
    int *count = !strcmp(a, "--drift") ? &o->drift : !strcmp(a, "--drift-prompts") ? &o->drift_prompts : NULL;
    if (flag) { *flag = 1; return 1; }
    if (!count || *i + 1 >= argc) return 0;
    if (parse_int_option(a, argv[++*i], count) != 0) return -1;
    if (*count < 1) { fprintf(stderr, "error: %s needs a count >= 1\n", a); return -1; }
    return 1;
}

static int parse_options(int argc, char **argv, Options *o) {
    *o = (Options){0};  /* --drift-prompts: 8 */
    if (parse_command_line(argc, argv, &o->serve, usage, parse_own_option, o) != 0) return -1;
    const char *why = options_problem(o);
    if (why) { fprintf(stderr, "error: %s\n", why); return -1; }
    o->serve.full_cache_mode = o->drift ? "--drift" : o->stops ? "--stops" : "--joined";
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The documents' KV caches                                                 */

typedef struct {
    DocCache caches[MAX_DOCUMENTS];  /* each document's KV cache, where built */
    int has_cache[MAX_DOCUMENTS];
    DocCache joined;                 /* --joined: one KV cache of all the documents */
    int has_joined;
} Caches;

/* The prefills the instrument reads (on the CPU): the full cache, every
 * document's KV cache on its own or with --joined one prefill of them all;
 * and Nectar's, the caches of the documents without modules. */
static int build_caches(Caches *ca, const Options *o, const Served *s) {
    for (int k = 0; k < s->n_parts; k++) {
        const Part *p = &s->parts[k];
        int for_nectar = s->has_modules && !p->module_path;
        if (o->joined && !for_nectar) continue;
        if (doccache_build(&ca->caches[k], &s->model, p->ids, p->n_ids, 256) != 0) return -1;
        ca->has_cache[k] = 1;
    }
    if (!o->joined) return 0;
    int *ids = xmalloc((s->n_before + 1) * sizeof(int)), n = 0;  /* (n_before) the documents' ids in order */
    for (int k = 0; k < s->n_parts; n += s->parts[k].n_ids, k++)
        memcpy(ids + n, s->parts[k].ids, s->parts[k].n_ids * sizeof(int));
    int rc = doccache_build(&ca->joined, &s->model, ids, n, 256);
    free(ids);
    ca->has_joined = rc == 0;
    return rc;
}

static void caches_free(Caches *ca) {
    for (int k = 0; k < MAX_DOCUMENTS; k++)
        if (ca->has_cache[k]) doccache_free(&ca->caches[k]);
    if (ca->has_joined) doccache_free(&ca->joined);
}

/* ------------------------------------------------------------------------ */
/* The instruments                                                          */

/* --drift: the drift table (or its JSON). */
static int run_drift(const Options *o, const Served *s, const Compositions *c) {
    DriftResult r;
    int n_seqs = o->drift_prompts ? o->drift_prompts : 8;
    const ModuleSet *ms = NULL;  /* the one module file's (options_problem) */
    for (int k = 0; k < s->n_parts; k++) if (s->parts[k].module_path) ms = &s->parts[k].modules;
    if (drift_profile(&s->model, c->full, c->nectar, &ms->heldout, o->drift, n_seqs, &r) != 0) return -1;
    if (o->json) printf("{\"drift\": {\"n_seqs\": %d, \"length\": %d, \"bins\": [", r.n_seqs, r.length);
    else printf("drift: %d held-out task prompts, each continued %d tokens by the full cache (greedy, no stop)\n"
                "  %-14s %9s %12s %12s %27s %10s %10s\n", r.n_seqs, r.length, "local tokens", "positions",
                "KL Nectar", "KL no doc", "Nectar's KL 95% interval", "agree", "agree nodoc");
    for (int b = 0; b < r.n_bins; b++) {
        if (o->json) {
            printf("%s{\"lo\": %d, \"hi\": %d, \"positions\": %ld, \"kl\": %.6g, \"kl_nodoc\": %.6g",
                   b ? ", " : "", r.lo[b], r.hi[b], r.positions[b], r.kl[b], r.kl_nodoc[b]);
            print_interval_json(stdout, "kl_ci", r.kl_ci[b]);
            printf(", \"agree\": %.6f, \"agree_nodoc\": %.6f}", r.agree[b], r.agree_nodoc[b]);
        } else {
            char ci_text[64];
            printf("  %5d - %-6d %9ld %12.4f %12.4f %27s %10.4f %10.4f\n", r.lo[b], r.hi[b], r.positions[b], r.kl[b],
                   r.kl_nodoc[b], interval_text(ci_text, sizeof ci_text, r.kl_ci[b]), r.agree[b], r.agree_nodoc[b]);
        }
    }
    if (o->json) printf("]}}\n");
    return 0;
}

/* --stops, of one module file: where the answers of the random split and
 * of the evaluation-only tasks end (stop_profile), a table or a JSON
 * object. */
static int report_stops(const Served *s, const Compositions *c, const Part *p, const EvalResult split[EVAL_SPLITS],
                        int json) {
    static const char *const names[2] = {"random", "tasks"};
    const int splits[2] = {EVAL_RANDOM, EVAL_TASKS};
    if (json) printf("{");
    for (int k = 0; k < 2; k++) {
        StopResult r;
        if (stop_profile(&s->model, c->full, c->nectar, &p->modules.heldout, &split[splits[k]], &r) != 0) return -1;
        if (json) printf("%s\"%s\": {\"n_answers\": %d, \"bins\": [", k ? ", " : "", names[k], r.n_answers);
        else {
            printf("%swhere the full cache's answers end (%s split: %d answers end with its stop)", k ? "\n" : "",
                   names[k], r.n_answers);
            if (r.n_answers == 0) {
                printf("\n");
                continue;
            }
            printf(": each model's log p(stop) there, teacher-forced\n  %-14s %6s %12s %12s %12s   %s\n",
                   "stop at token", "count", "full cache", "Nectar", "no document",
                   "stop the likeliest: full / Nectar / no doc");
        }
        for (int b = 0, first = 1; b <= r.n_bins; b++) {
            int at = b < r.n_bins ? b : STOP_BINS;  /* the bins, then all of them */
            if (r.count[at] == 0) continue;
            if (json) printf("%s{\"lo\": %d, \"hi\": %d, \"count\": %d, \"logp\": [%.6g, %.6g, %.6g], "
                             "\"top\": [%.6f, %.6f, %.6f]}", first ? "" : ", ", b < r.n_bins ? r.lo[b] : 0,
                             b < r.n_bins ? r.hi[b] : split[splits[k]].answer_cap, r.count[at], r.logp[0][at],
                             r.logp[1][at], r.logp[2][at], r.top[0][at], r.top[1][at], r.top[2][at]);
            else if (b < r.n_bins) printf("  %5d - %-6d %6d %12.4f %12.4f %12.4f   %.3f / %.3f / %.3f\n", r.lo[b],
                                          r.hi[b], r.count[at], r.logp[0][at], r.logp[1][at], r.logp[2][at],
                                          r.top[0][at], r.top[1][at], r.top[2][at]);
            else printf("  %-14s %6d %12.4f %12.4f %12.4f   %.3f / %.3f / %.3f\n", "all", r.count[at], r.logp[0][at],
                        r.logp[1][at], r.logp[2][at], r.top[0][at], r.top[1][at], r.top[2][at]);
            first = 0;
        }
        if (json) printf("]}");
    }
    if (json) printf("}");
    return 0;
}

/* The instrument the options ask for, over the compositions of the caches
 * (with --joined, the full one is the joined prefill). */
static int run_instrument(const Options *o, const Served *s, const Caches *ca) {
    Compositions c;
    const ModuleSet *modules[MAX_DOCUMENTS] = {0};
    for (int k = 0; k < s->n_parts; k++) modules[k] = s->parts[k].module_path ? &s->parts[k].modules : NULL;
    compositions(s, ca->caches, ca->has_cache, modules, &c);
    if (ca->has_joined) c.full[0] = (Document){DOC_EXACT, ca->joined.n, &ca->joined, NULL, NULL};
    if (s->has_modules) print_storage(s);
    if (o->drift) return run_drift(o, s, &c);
    if (o->stops) return eval_modules(s, &c, o->json, report_stops);
    return o->serve.qa_path ? run_qa(s, &c, o->json) : eval_modules(s, &c, o->json, report_answers);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "fit")) {  /* train's run, with the study options */
        TrainOptions to;
        if (train_options_parse(argc - 1, argv + 1, &to, fit_usage, 1) != 0) return 1;
        return train_run(&to) != 0;
    }

    /* 1. options */
    Options o;
    if (parse_options(argc, argv, &o) != 0) return 1;

    /* 2. the model, tokenizer, documents and modules */
    Served s;
    Caches ca = {0};
    int rc = served_load(&s, &o.serve);

    /* 3. the documents' KV caches, on the CPU */
    if (rc == 0) rc = build_caches(&ca, &o, &s);

    /* 4. the instrument, then everything freed (on the way out of an error too) */
    if (rc == 0) rc = run_instrument(&o, &s, &ca);
    caches_free(&ca);
    served_free(&s);
    return rc != 0;
}
