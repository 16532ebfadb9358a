/* infer.c - generate after a document: exact (its KV cache), Nectar (its
 * module, no document prefill at all) or with no document, on the CPU or
 * (--gpu, in a build with nvcc) the GPU.
 *
 *   ./infer -m model.bin -z tokenizer.bin -d doc.txt -i "prompt"          exact
 *   ./infer -m model.bin -z tokenizer.bin -k doc.nectar -i "prompt"       Nectar
 *   ./infer -m model.bin -z tokenizer.bin -i "prompt"                     no document
 *   ./infer -m model.bin -z tokenizer.bin -d a.txt -k b.nectar -i "prompt"  a composition: a, then b
 *
 * Several documents (-d, -D and -k, in command-line order) make a
 * composition: each at the positions after those before it, read from its
 * own KV cache or its modules; a module given beside its document's text
 * stands in for it (src/serve.c reads and checks them).
 *
 * main reads as its steps: the options; the model, tokenizer, documents,
 * modules and prompt; the device (the host, or GPU copies) and the
 * documents' KV caches on it; then one mode: generate, --compare (exact,
 * Nectar and no document in turn), --eval (the held-out answers of the
 * module file) or --qa (multiple-choice questions scored by likelihood).
 * The instruments of finished studies are tools/study.c's.
 */
#include "nectar.h"
#include "src/cli.h"
#include "src/eval.h"
#include "src/formats.h"
#include "src/parallel.h"
#include "src/serve.h"
#include "src/tokenizer.h"
#include "src/util.h"
#ifdef NECTAR_CUDA
#include "nectar_cuda.h"
#endif

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: infer -m MODEL [options]\n"
        "  -m MODEL       a GGUF file (Llama architecture; its tokenizer too) or a llama2.c checkpoint (v0)\n"
        "  -z TOKENIZER   llama2.c tokenizer.bin (a GGUF model has its own); without either, input and\n"
        "                 output are token ids\n"
        "  -d DOC.txt     document (text, encoded with BOS first where the tokenizer adds one)\n"
        "  -D DOC.ids     document as token ids\n"
        "  -k MODULE      Nectar module file: stands in for the document (no prefill)\n"
        "  Several -d, -D and -k make a composition of up to %d documents, in command-line order:\n"
        "                 each document at the positions after those before it, prefilled on its\n"
        "                 own (its KV cache) or read by its modules; a module given beside the text\n"
        "                 of its document (matched by the fingerprint the file holds) stands in for\n"
        "                 it. Later documents continue the first: no BOS, and with --chat no turn\n"
        "                 opening (their modules are fitted with train --later-document)\n"
        "  -i \"prompt\"    prompt text (BOS only when there is no document)\n"
        "  -I PROMPT.ids  prompt as token ids, used as given\n"
        "  --chat         the model's chat template (ChatML): the document goes into the user's turn\n"
        "                 before the prompt, which ends the turn; generation stops at the turn's end\n"
        "  -n N           tokens to generate (default 64; stops early at the context end or BOS)\n"
        "  -t T           temperature (default 1.0; 0 = greedy)\n"
        "  -p P           top-p (default 0.9; 0 or 1: off, the whole distribution)\n"
        "  -s SEED        sampling seed (default 1234)\n"
        "  --ids          print the generated token ids, space-separated, on stdout\n"
        "  --encode       print the token ids of -i and exit (needs only -z; no BOS after -d, -D or -k)\n"
        "  --compare      with -k and -d/-D: exact, Nectar and no-document generations in turn\n"
        "  --eval         with -k and -d/-D: each held-out task prompt kept in the module file with\n"
        "                 its exact, Nectar and no-document greedy answers, then the answer match\n"
        "  --json         with --eval or --qa: one JSON object on stdout (--eval: every metric on the\n"
        "                 held-out prompts, and the answers' token ids)\n"
        "  --qa FILE      with -d/-D: the multiple-choice questions of FILE (format: docs/formats.md),\n"
        "                 each option scored by its mean log-probability per token as the reply\n"
        "                 after the question (with --chat, the assistant's turn), with the full\n"
        "                 cache, Nectar (with -k) and no document: accuracy and agreement with the\n"
        "                 full cache's choice, with 95%% intervals (--json: one JSON object)\n"
        "  --gpu          run on the GPU (builds with nvcc; one document; not with --eval or --qa)\n"
        "  --help         this text\n"
        "Modes: with -d/-D the document's KV cache is used (exact); with -k the module is\n"
        "used instead (given beside the document it was fitted to, it stands in for it;\n"
        "another document makes a composition); with neither, there is no document.\n"
        "The instruments of finished studies (--drift, --stops, --joined) are ./study's.\n", MAX_DOCUMENTS);
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */

typedef struct {
    ServeOptions serve;  /* -m, -z, -d, -D, -k, --chat, --qa */
    const char *prompt_text, *prompt_ids_path;
    int n_gen, print_ids, encode_only, eval, compare, json, gpu;
    float temperature, topp;
    unsigned long long seed;
} Options;

/* A flag (an option without a value) into o: 1 if a is one, else 0. */
static int parse_flag(const char *a, Options *o) {
    int *flags[] = {&o->print_ids, &o->encode_only, &o->eval, &o->compare, &o->json, &o->gpu};
    static const char *names[] = {"--ids", "--encode", "--eval", "--compare", "--json", "--gpu"};
    for (int k = 0; k < 6; k++)
        if (!strcmp(a, names[k])) { *flags[k] = 1; return 1; }
    return 0;
}

/* The one-letter option a with value v into o: 0, or -1 after a sentence. */
static int parse_value(const char *a, const char *v, Options *o) {
    switch (a[1]) {
    case 'i': o->prompt_text = v; return 0;
    case 'I': o->prompt_ids_path = v; return 0;
    case 'n': return parse_int_option(a, v, &o->n_gen);
    case 't': return parse_float_option(a, v, &o->temperature);
    case 'p': return parse_float_option(a, v, &o->topp);
    case 's': return parse_seed_option(a, v, &o->seed);
    }
    fprintf(stderr, "error: unknown option '%s' (see --help)\n", a);
    return -1;
}

/* The combinations that cannot run: NULL or the sentence. */
static const char *options_problem(const Options *o) {
    const ServeOptions *so = &o->serve;
    int has_doc = so->n_texts > 0, has_ids = 0;
    for (int i = 0; i < so->n_docs; i++) has_ids |= so->docs[i].kind == DOC_IDS;
    if (o->n_gen < 0 || o->temperature < 0.0f || o->topp < 0.0f || o->topp > 1.0f)
        return "need -n >= 0, -t >= 0 and -p in [0, 1]";
    if ((o->eval || o->compare) && !(so->n_modules && has_doc))
        return "--eval and --compare need the module (-k) and its document (-d/-D)";
    if (so->qa_path && !has_doc)
        return "--qa needs the document (-d/-D): the full cache is what the others are held to";
    if (so->qa_path && (o->eval || o->compare)) return "--qa is a mode of its own; drop --eval and --compare";
    if (o->json && !o->eval && !so->qa_path) return "--json is the output of --eval or --qa; add one or drop --json";
    if (o->gpu && (o->eval || so->qa_path)) return "--eval and --qa run on the CPU; drop --gpu";
#ifndef NECTAR_CUDA
    if (o->gpu) return NO_GPU_SUPPORT;
#endif
    if (o->prompt_text && o->prompt_ids_path) return "give the prompt as -i or -I, not both";
    if (so->chat && (has_ids || o->prompt_ids_path))
        return "--chat frames texts (-d, -i); token ids (-D, -I) are used as given";
    return NULL;
}

/* An option of infer's own (parse_command_line reads the rest). */
static int parse_own_option(int argc, char **argv, int *i, void *options) {
    Options *o = options;
    const char *a = argv[*i];
    if (parse_flag(a, o)) return 1;
    if (a[0] != '-' || strlen(a) != 2 || *i + 1 >= argc) return 0;
    return parse_value(a, argv[++*i], o) == 0 ? 1 : -1;
}

static int parse_options(int argc, char **argv, Options *o) {
    *o = (Options){.n_gen = 64, .temperature = 1.0f, .topp = 0.9f, .seed = 1234};
    if (parse_command_line(argc, argv, &o->serve, usage, parse_own_option, o) != 0) return -1;
    const char *why = options_problem(o);
    if (why) { fprintf(stderr, "error: %s\n", why); return -1; }
    o->serve.full_cache_mode = o->eval ? "--eval" : o->compare ? "--compare" : o->serve.qa_path ? "--qa" : NULL;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The prompt                                                               */

/* --encode: the token ids of -i, as the prompt would get them. */
static int encode_only(const Options *o) {
    int refused;
    const char *path = tokenizer_source(o->serve.model_path, o->serve.tok_path, &refused);
    if (refused) return 1;
    if (!path || !o->prompt_text) {
        fprintf(stderr, "error: --encode needs a tokenizer (-z, or a GGUF model -m) and -i \"text\"\n");
        return 1;
    }
    Tokenizer tok;
    if (tokenizer_load(&tok, path, 0) != 0 || check_chat(o->serve.chat, &tok) != 0) return 1;
    int after_doc = o->serve.n_docs > 0;  /* BOS only without a document */
    int n, *ids = encode_prompt(&tok, o->prompt_text, o->serve.chat, after_doc, INT_MAX, &n);
    if (!ids) return 1;
    for (int i = 0; i < n; i++) printf("%d%c", ids[i], i + 1 < n ? ' ' : '\n');
    free(ids);
    tokenizer_free(&tok);
    return 0;
}

/* The prompt after the documents, and what generation after it needs. */
typedef struct {
    int n_prompt, *prompt;
    int n_alone, *alone;  /* the prompt as it starts a sequence, for the no-document model of --compare */
    int steps;            /* tokens to generate, within the context */
    int stop_id;          /* generation also stops at this token (the end of a chat turn); -1: none */
} Prompt;

/* The prompt (BOS alone when none is given and there is no document), and
 * the number of tokens to generate within the context. */
static int load_prompt(const Options *o, const Served *s, Prompt *pr) {
    const Config *c = &s->model.config;
    int after_doc = s->has_doc || s->has_modules, bos = s->tokp ? s->tok.bos_id : 1;
    memset(pr, 0, sizeof(*pr));
    pr->stop_id = o->serve.chat ? s->tok.eos_id : -1;
    if (o->prompt_ids_path && (pr->n_prompt = read_token_ids(o->prompt_ids_path, &pr->prompt)) < 0) return -1;
    if (o->prompt_text) {
        if (need_tokenizer(s->tokp) != 0) return -1;
        pr->prompt = encode_prompt(s->tokp, o->prompt_text, o->serve.chat, after_doc, c->seq_len - s->n_before,
                                   &pr->n_prompt);
        if (pr->prompt && o->serve.chat)
            pr->alone = encode_prompt(s->tokp, o->prompt_text, 1, 0, c->seq_len, &pr->n_alone);
    }
    if ((o->prompt_text || o->prompt_ids_path) &&
        (!pr->prompt || check_tokens(&s->model, pr->prompt, pr->n_prompt, "prompt") != 0)) return -1;
    if (pr->n_prompt == 0) {
        if (after_doc && !o->eval && !o->serve.qa_path) {
            fprintf(stderr, "error: give a prompt (-i or -I) to follow the document%s\n", s->n_parts > 1 ? "s" : "");
            return -1;
        }
        free(pr->prompt);
        pr->prompt = xmalloc(sizeof(int));
        pr->prompt[0] = bos;
        pr->n_prompt = 1;
    }
    if (!pr->alone) {  /* without the document the prompt starts a sequence: BOS first, unless it has one */
        int add = pr->prompt[0] != bos;
        pr->alone = xmalloc((pr->n_prompt + 1) * sizeof(int));
        pr->alone[0] = bos;
        memcpy(pr->alone + add, pr->prompt, pr->n_prompt * sizeof(int));
        pr->n_alone = pr->n_prompt + add;
    }
    if (s->n_before + pr->n_prompt > c->seq_len) {
        fprintf(stderr, "error: document%s (%d tokens) plus prompt (%d tokens) exceed the model's context "
                "of %d tokens\n", s->n_parts > 1 ? "s" : "", s->n_before, pr->n_prompt, c->seq_len);
        return -1;
    }
    /* generated token i sits at position n_before + n_prompt + i; the last
     * one is sampled but never fed, so it may fall just past the context */
    pr->steps = o->n_gen;
    if (!o->eval && pr->steps > c->seq_len + 1 - s->n_before - pr->n_prompt) {
        pr->steps = c->seq_len + 1 - s->n_before - pr->n_prompt;
        fprintf(stderr, "note: generating %d tokens, not %d: the context ends at %d\n", pr->steps, o->n_gen,
                c->seq_len);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The device: the host, or GPU copies of the model and document state      */

/* What generation runs on. On the host: the loaded model and modules and the
 * KV caches built here; with --gpu (one document): their device copies. */
typedef struct {
    int gpu;
    const Model *model;
    const ModuleSet *modules[MAX_DOCUMENTS];  /* each document's modules (NULL: none) */
    DocCache caches[MAX_DOCUMENTS];           /* each document's KV cache on the device, where built */
    int has_cache[MAX_DOCUMENTS];
    Model model_dev;                          /* --gpu: the copies */
    ModuleSet modules_dev;
} Device;

/* The one place the device is chosen: uploads to the GPU with --gpu. */
static int device_open(Device *dv, const Options *o, const Served *s) {
    memset(dv, 0, sizeof(*dv));
    dv->model = &s->model;
    for (int k = 0; k < s->n_parts; k++) dv->modules[k] = s->parts[k].module_path ? &s->parts[k].modules : NULL;
    if (o->gpu && s->n_parts > 1) {
        fprintf(stderr, "error: the GPU runs one document; a composition of %d documents runs on the CPU (drop "
                "--gpu)\n", s->n_parts);
        return -1;
    }
#ifdef NECTAR_CUDA
    if (o->gpu) {
        if (nectar_cuda_init() != 0) return -1;
        dv->gpu = 1;  /* from here on the device has copies to free */
        model_upload_cuda(&dv->model_dev, &s->model);
        if (dv->modules[0]) moduleset_upload_cuda(&dv->modules_dev, dv->modules[0], 0);
        dv->model = &dv->model_dev;
        if (dv->modules[0]) dv->modules[0] = &dv->modules_dev;
    }
#endif
    return 0;
}

/* A KV cache of the n ids on the device (a prefill). */
static int device_prefill(const Device *dv, const int *ids, int n, DocCache *cache) {
#ifdef NECTAR_CUDA
    if (dv->gpu) return doccache_build_cuda(cache, dv->model, ids, n, 256);
#endif
    return doccache_build(cache, dv->model, ids, n, 256);
}

/* The exact path's prefills, those the mode reads: the full cache (every
 * document's KV cache) for --eval, --compare, --qa and generation without
 * modules; and Nectar's, the caches of the documents without modules. */
static int device_build_caches(Device *dv, const Options *o, const Served *s) {
    int need_full = !s->has_modules || o->serve.full_cache_mode;
    for (int k = 0; k < s->n_parts; k++) {
        const Part *p = &s->parts[k];
        int for_nectar = s->has_modules && !p->module_path;
        if (!p->text_path || !(for_nectar || need_full)) continue;
        if (device_prefill(dv, p->ids, p->n_ids, &dv->caches[k]) != 0) return -1;
        dv->has_cache[k] = 1;
    }
    return 0;
}

static void device_close(Device *dv) {
    for (int k = 0; k < MAX_DOCUMENTS; k++)
        if (dv->has_cache[k]) {
#ifdef NECTAR_CUDA
            if (dv->gpu) { doccache_free_cuda(&dv->caches[k]); continue; }
#endif
            doccache_free(&dv->caches[k]);
        }
#ifdef NECTAR_CUDA
    if (dv->gpu) {
        if (dv->modules[0]) moduleset_free_cuda(&dv->modules_dev);
        model_free_cuda(&dv->model_dev);
        nectar_cuda_free();
    }
#endif
}

/* The run state of a generation on the device. */
typedef struct {
    int gpu;
    RunState cpu;
#ifdef NECTAR_CUDA
    RunStateCuda dev;
#endif
} Runner;

static void runner_alloc(Runner *r, int gpu, const Model *m, const Document *doc, int max_block, int capacity) {
    r->gpu = gpu;
#ifdef NECTAR_CUDA
    if (gpu) { runstate_alloc_cuda(&r->dev, m, doc, max_block, capacity); return; }
#endif
    runstate_alloc(&r->cpu, m, doc, max_block, capacity);
}

/* forward with LOGITS_LAST; *logits: the last row's logits, on the host. */
static int runner_forward(Runner *r, const Model *m, const Document *doc, const int *tokens, int ntok, int pos,
                          const float **logits) {
#ifdef NECTAR_CUDA
    if (r->gpu) {
        *logits = r->dev.logits;
        return forward_cuda(m, &r->dev, doc, tokens, ntok, pos, LOGITS_LAST);
    }
#endif
    *logits = r->cpu.logits;
    return forward(m, &r->cpu, doc, tokens, ntok, pos, LOGITS_LAST);
}

static void runner_free(Runner *r) {
#ifdef NECTAR_CUDA
    if (r->gpu) { runstate_free_cuda(&r->dev); return; }
#endif
    runstate_free(&r->cpu);
}

/* ------------------------------------------------------------------------ */
/* The modes                                                                */

/* Prints a generated token: its piece with a tokenizer (raw bytes only when
 * printable or whitespace), else its id. */
static void print_token(const Tokenizer *tok, int print_ids, int i, int prev, int next) {
    if (print_ids || !tok) { printf("%s%d", i ? " " : "", next); return; }
    const char *piece = tokenizer_decode(tok, prev, next);
    if (piece && !(piece[0] && !piece[1] && (unsigned char)piece[0] < 32 && !strchr("\t\n\r", piece[0])))
        fputs(piece, stdout);
}

/* Generates up to `steps` tokens after the prompt, each drawn by the core's
 * sample, printing them to stdout as they come (the core's generate, on the
 * CPU or the GPU, streamed and timed); stops at BOS and at stop_id (the end
 * of a chat turn; -1: none), neither printed. Returns the count, or -1. */
static int generate_streamed(const Device *dv, const Document *doc, const int *prompt, int n_prompt, int steps,
                             int stop_id, Sampler *sampler, const Tokenizer *tok, int print_ids, double *ms_first,
                             double *tok_per_s) {
    const Model *m = dv->model;
    Runner r;
    runner_alloc(&r, dv->gpu, m, doc, n_prompt, n_prompt + (steps > 0 ? steps - 1 : 0));
    const float *last;
    double t0 = now_seconds();
    if (runner_forward(&r, m, doc, prompt, n_prompt, 0, &last) != 0) { runner_free(&r); return -1; }
    double t_first = now_seconds();
    int prev = prompt[n_prompt - 1], generated = 0;
    for (int i = 0; i < steps; i++) {
        int next = sample(sampler, last, m->config.vocab_size);
        if (next == (tok ? tok->bos_id : 1) || next == stop_id) break;  /* BOS delimits sequences, as in llama2.c */
        generated++;
        print_token(tok, print_ids, i, prev, next);
        fflush(stdout);
        prev = next;
        if (i + 1 < steps && runner_forward(&r, m, doc, &next, 1, n_prompt + i, &last) != 0) {
            runner_free(&r);
            return -1;
        }
    }
    printf("\n");
    fflush(stdout);  /* before the timing line on stderr */
    *ms_first = (t_first - t0) * 1e3;
    *tok_per_s = generated > 1 ? (generated - 1) / (now_seconds() - t_first) : 0.0;
    runner_free(&r);
    return generated;
}

/* --compare: the same prompt and seed three ways; without a document the
 * prompt starts with BOS. */
static int run_compare(const Options *o, const Served *s, const Prompt *pr, const Device *dv, const Compositions *c) {
    struct { const char *name; const Document *doc; const int *prompt; int n; } runs[3] = {
        {"exact (document KV cache)", c->full, pr->prompt, pr->n_prompt},
        {"Nectar (module)", c->nectar, pr->prompt, pr->n_prompt},
        {"no document", &NO_DOCUMENT, pr->alone, pr->n_alone}};
    int rc = 0;
    for (int r = 0; r < 3 && rc == 0; r++) {
        double first_ms, rate;
        Sampler sampler;
        sampler_init(&sampler, s->model.config.vocab_size, o->temperature, o->topp, o->seed);
        printf("--- %s ---\n", runs[r].name);
        fflush(stdout);
        int n = generate_streamed(dv, runs[r].doc, runs[r].prompt, runs[r].n, pr->steps, pr->stop_id, &sampler,
                                  s->tokp, o->print_ids, &first_ms, &rate);
        sampler_free(&sampler);
        if (n < 0) rc = -1;
        else fprintf(stderr, "%s: %.1f ms to first token, %d tokens at %.1f tok/s\n", runs[r].name, first_ms, n, rate);
    }
    return rc;
}

/* Generation with the document state `doc` (exact, Nectar or none). */
static int run_generate(const Options *o, const Served *s, const Prompt *pr, const Device *dv, const Document *doc,
                        double prefill_ms) {
    double first_ms, rate;
    Sampler sampler;
    sampler_init(&sampler, s->model.config.vocab_size, o->temperature, o->topp, o->seed);
    int n = generate_streamed(dv, doc, pr->prompt, pr->n_prompt, pr->steps, pr->stop_id, &sampler, s->tokp,
                              o->print_ids, &first_ms, &rate);
    sampler_free(&sampler);
    if (n < 0) return -1;
    const char *mode = s->has_modules ? "Nectar" : s->has_doc ? "exact" : "no document";
    fprintf(stderr, "%s%s: %d document%s of %d tokens (prefill %.1f ms), prompt %d tokens (%.1f ms to first token), "
            "%d generated at %.1f tok/s\n", mode, dv->gpu ? " (GPU)" : "", s->n_parts, s->n_parts == 1 ? "" : "s",
            s->n_before, prefill_ms, pr->n_prompt, first_ms, n, rate);
    return 0;
}

/* The mode the options ask for, with the documents as the device holds
 * them: generation reads Nectar's composition where there are modules. */
static int run_mode(const Options *o, const Served *s, const Prompt *pr, const Device *dv, double prefill_ms) {
    Compositions c;
    compositions(s, dv->caches, dv->has_cache, dv->modules, &c);
    if (s->has_modules) print_storage(s);
    return o->serve.qa_path ? run_qa(s, &c, o->json) : o->eval ? eval_modules(s, &c, o->json, report_answers)
         : o->compare ? run_compare(o, s, pr, dv, &c)
         : run_generate(o, s, pr, dv, s->has_modules ? c.nectar : c.full, prefill_ms);
}

int main(int argc, char **argv) {
    /* 1. options; --encode needs nothing else */
    Options o;
    if (parse_options(argc, argv, &o) != 0) return 1;
    if (o.encode_only) return encode_only(&o);

    /* 2. the model, tokenizer, documents, modules and prompt */
    Served s;
    Prompt pr = {0};
    Device dv = {0};
    int rc = served_load(&s, &o.serve);
    if (rc == 0) rc = load_prompt(&o, &s, &pr);

    /* 3. the device, and the documents' KV caches on it (with modules, only
     * --eval, --compare and --qa need the full cache) */
    if (rc == 0) rc = device_open(&dv, &o, &s);
    double t0 = now_seconds();
    if (rc == 0) rc = device_build_caches(&dv, &o, &s);
    double prefill_ms = (now_seconds() - t0) * 1e3;

    /* 4. the mode, then everything freed (on the way out of an error too) */
    if (rc == 0) rc = run_mode(&o, &s, &pr, &dv, prefill_ms);
    device_close(&dv);
    free(pr.prompt); free(pr.alone);
    served_free(&s);
    return rc != 0;
}
