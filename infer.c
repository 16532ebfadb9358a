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
 * stands in for it.
 *
 * main reads as its steps: the options; the model, tokenizer, documents,
 * modules and prompt; the device (the host, or GPU copies) and the
 * documents' KV caches on it; then one mode: generate, --compare (exact,
 * Nectar and no document in turn), --eval (the held-out answers of the
 * module file) or --qa (multiple-choice questions scored by
 * likelihood).
 */
#include "nectar.h"
#include "src/cli.h"
#include "src/eval.h"
#include "src/formats.h"
#include "src/parallel.h"
#include "src/qa.h"
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
        "  --joined       with several -d/-D: the full cache is one prefill over all of them, each\n"
        "                 document attending to those before it (the true concatenation), instead\n"
        "                 of each document's KV cache made on its own\n"
        "  -i \"prompt\"    prompt text (BOS only when there is no document)\n"
        "  -I PROMPT.ids  prompt as token ids, used as given\n"
        "  --chat         the model's chat template (ChatML): the document goes into the user's turn\n"
        "                 before the prompt, which ends the turn; generation stops at the turn's end\n"
        "  -n N           tokens to generate (default 64; stops early at the context end or BOS)\n"
        "  -t T           temperature (default 1.0; 0 = greedy)\n"
        "  -p P           top-p (default 0.9; 0 or 1: off, the whole distribution)\n"
        "  -s SEED        sampling seed (default 1234)\n"
        "  --ids          print the generated token ids, space-separated, on stdout\n"
        "  --encode       print the token ids of -i and exit (needs only -z; BOS first unless\n"
        "                 -d, -D or -k is given too, as for a prompt after a document)\n"
        "  --compare      with -k and -d/-D: exact, Nectar and no-document generations in turn\n"
        "  --eval         with -k and -d/-D: each held-out task prompt kept in the module file with\n"
        "                 its exact, Nectar and no-document greedy answers, then the answer match\n"
        "  --json         with --eval or --qa: one JSON object on stdout (--eval: every metric on the\n"
        "                 held-out prompts, and the answers' token ids)\n"
        "  --drift N      with --eval, instead of its answers: the full cache continues held-out task\n"
        "                 prompts (its evaluation-only tasks where the module file has them) N tokens\n"
        "                 (no stop), and KL(full || Nectar, no document) and top-1 agreement along\n"
        "                 them, in bins of the distance from the document\n"
        "  --drift-prompts K  how many held-out task prompts --drift continues (default 8)\n"
        "  --stops        with --eval, instead of its answers: where answers end; each held-out answer\n"
        "                 the full cache ends with its stop, teacher-forced, and each model's\n"
        "                 log-probability of that stop there, by the answer's length\n"
        "  --qa FILE      with -d/-D: the multiple-choice questions of FILE (format: docs/formats.md),\n"
        "                 each option scored by its mean log-probability per token as the reply\n"
        "                 after the question (with --chat, the assistant's turn), with the full\n"
        "                 cache, Nectar (with -k) and no document: accuracy and agreement with the\n"
        "                 full cache's choice, with 95%% intervals (--json: one JSON object)\n"
        "  --gpu          run on the GPU (builds with nvcc; one document; not with --eval or --qa)\n"
        "  --help         this text\n"
        "Modes: with -d/-D the document's KV cache is used (exact); with -k the module is\n"
        "used instead (given beside the document it was fitted to, it stands in for it;\n"
        "another document makes a composition); with neither, there is no document.\n", MAX_DOCUMENTS);
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */

/* A document option: -d (text), -D (token ids) or -k (modules). */
typedef enum { DOC_TEXT, DOC_IDS, DOC_MODULES } DocKind;
typedef struct { DocKind kind; const char *path; } DocOption;

typedef struct {
    const char *model_path, *tok_path, *prompt_text, *prompt_ids_path;
    DocOption docs[2 * MAX_DOCUMENTS];  /* -d, -D and -k in command-line order */
    int n_docs, n_texts, n_modules;     /* of them: all, -d and -D, -k */
    const char *qa_path;  /* --qa */
    int n_gen, print_ids, encode_only, eval, compare, json, gpu, chat, joined, stops;
    int drift, drift_prompts;  /* --drift N, --drift-prompts K (0: not given) */
    float temperature, topp;
    unsigned long long seed;
} Options;

/* A flag (an option without a value) into o: 1 if a is one, else 0. */
static int parse_flag(const char *a, Options *o) {
    int *flags[] = {&o->print_ids, &o->encode_only, &o->eval, &o->compare, &o->json, &o->gpu, &o->chat,
                    &o->joined, &o->stops};
    static const char *names[] = {"--ids", "--encode", "--eval", "--compare", "--json", "--gpu", "--chat",
                                  "--joined", "--stops"};
    for (int k = 0; k < 9; k++)
        if (!strcmp(a, names[k])) { *flags[k] = 1; return 1; }
    return 0;
}

/* -d, -D or -k with path v, in order: 0, or -1 after a sentence. */
static int add_document_option(const char *a, const char *v, Options *o) {
    if (o->n_docs == 2 * MAX_DOCUMENTS) {
        fprintf(stderr, "error: more than %d -d, -D and -k options\n", 2 * MAX_DOCUMENTS);
        return -1;
    }
    DocKind kind = a[1] == 'd' ? DOC_TEXT : a[1] == 'D' ? DOC_IDS : DOC_MODULES;
    o->docs[o->n_docs++] = (DocOption){kind, v};
    if (kind == DOC_MODULES) o->n_modules++;
    else o->n_texts++;
    return 0;
}

/* The one-letter option a with value v into o: 0, or -1 after a sentence. */
static int parse_value(const char *a, const char *v, Options *o) {
    switch (a[1]) {
    case 'm': o->model_path = v; return 0;
    case 'z': o->tok_path = v; return 0;
    case 'd': case 'D': case 'k': return add_document_option(a, v, o);
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
    int has_doc = o->n_texts > 0, has_ids = 0;
    for (int i = 0; i < o->n_docs; i++) has_ids |= o->docs[i].kind == DOC_IDS;
    if (o->n_gen < 0 || o->temperature < 0.0f || o->topp < 0.0f || o->topp > 1.0f)
        return "need -n >= 0, -t >= 0 and -p in [0, 1]";
    if ((o->eval || o->compare) && !(o->n_modules && has_doc))
        return "--eval and --compare need the module (-k) and its document (-d/-D)";
    if (o->qa_path && !has_doc)
        return "--qa needs the document (-d/-D): the full cache is what the others are held to";
    if (o->qa_path && (o->eval || o->compare)) return "--qa is a mode of its own; drop --eval and --compare";
    if (o->json && !o->eval && !o->qa_path) return "--json is the output of --eval or --qa; add one or drop --json";
    if (o->gpu && (o->eval || o->qa_path)) return "--eval and --qa run on the CPU; drop --gpu";
    if ((o->drift || o->drift_prompts) && !o->eval) return "--drift and --drift-prompts are a mode of --eval; add --eval";
    if (o->drift_prompts && !o->drift) return "--drift-prompts needs --drift N";
    if (o->drift && o->n_modules > 1) return "--drift follows the held-out prompts of one module file; give one -k";
    if (o->stops && (!o->eval || o->drift)) return "--stops is a mode of --eval of its own; add --eval, drop --drift";
    if (o->joined && o->n_texts < 2) return "--joined prefills several documents as one; give two or more -d/-D";
    if (o->joined && o->n_modules && !(o->eval || o->compare || o->qa_path))
        return "--joined makes the full cache, which generation with modules does not read; add --compare, --eval "
               "or --qa, or drop --joined";
#ifndef NECTAR_CUDA
    if (o->gpu) return NO_GPU_SUPPORT;
#endif
    if (o->prompt_text && o->prompt_ids_path) return "give the prompt as -i or -I, not both";
    if (o->chat && (has_ids || o->prompt_ids_path))
        return "--chat frames texts (-d, -i); token ids (-D, -I) are used as given";
    return NULL;
}

static int parse_options(int argc, char **argv, Options *o) {
    *o = (Options){.n_gen = 64, .temperature = 1.0f, .topp = 0.9f, .seed = 1234};  /* --drift-prompts: 8 */
    SeenOptions seen = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        int repeatable = !strcmp(a, "-d") || !strcmp(a, "-D") || !strcmp(a, "-k");  /* a composition */
        if (!repeatable && option_once(&seen, a) != 0) return -1;
        if (parse_flag(a, o)) continue;
        if (!strcmp(a, "--qa") && i + 1 < argc) { o->qa_path = argv[++i]; continue; }
        int *count = !strcmp(a, "--drift") ? &o->drift : !strcmp(a, "--drift-prompts") ? &o->drift_prompts : NULL;
        if (count && i + 1 < argc) {
            if (parse_int_option(a, argv[++i], count) != 0) return -1;
            if (*count < 1) { fprintf(stderr, "error: %s needs a count >= 1\n", a); return -1; }
            continue;
        }
        if (a[0] != '-' || strlen(a) != 2 || i + 1 >= argc) {
            fprintf(stderr, "error: unknown or incomplete option '%s' (see --help)\n", a);
            return -1;
        }
        if (parse_value(a, argv[++i], o) != 0) return -1;
    }
    const char *why = options_problem(o);
    if (why) { fprintf(stderr, "error: %s\n", why); return -1; }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The model, tokenizer, document, modules and prompt                       */

/* A tokenizer for --chat must know the template. */
static int check_chat(const Options *o, const Tokenizer *tok) {
    if (o->chat && (!tok || !tok->chat_system)) {
        fprintf(stderr, "error: --chat needs a tokenizer with a ChatML chat template (a GGUF chat model)\n");
        return -1;
    }
    return 0;
}

/* --encode: the token ids of -i, as the prompt would get them. */
static int encode_only(const Options *o) {
    int refused;
    const char *path = tokenizer_source(o->model_path, o->tok_path, &refused);
    if (refused) return 1;
    if (!path || !o->prompt_text) {
        fprintf(stderr, "error: --encode needs a tokenizer (-z, or a GGUF model -m) and -i \"text\"\n");
        return 1;
    }
    Tokenizer tok;
    if (tokenizer_load(&tok, path, 0) != 0 || check_chat(o, &tok) != 0) return 1;
    int after_doc = o->n_docs > 0;  /* BOS only without a document */
    int n, *ids = encode_prompt(&tok, o->prompt_text, o->chat, after_doc, INT_MAX, &n);
    if (!ids) return 1;
    for (int i = 0; i < n; i++) printf("%d%c", ids[i], i + 1 < n ? ' ' : '\n');
    free(ids);
    tokenizer_free(&tok);
    return 0;
}

/* The ids of an id file; NULL after a sentence. */
static int *load_ids(const char *ids_path, int *n) {
    int *ids;
    *n = read_token_ids(ids_path, &ids);
    return *n < 0 ? NULL : ids;
}

static int need_tokenizer(const Tokenizer *tok) {
    if (tok) return 0;
    fprintf(stderr, "error: text input needs a tokenizer (-z, or a GGUF model), or give token ids (-D/-I)\n");
    return -1;
}

/* One document of the composition: its text's ids (-d/-D), the modules
 * that stand in for it (-k), or both. */
typedef struct {
    const char *text_path;    /* -d or -D (NULL: none) */
    int n_ids, *ids;          /* its ids, framed at its place */
    const char *module_path;  /* -k (NULL: none) */
    ModuleSet modules;
    int n;                    /* its length: n_ids, or what its modules stand for */
    int option;               /* the index of its -d, -D or unpaired -k among the document options */
} Part;

typedef struct {
    Model model;
    Tokenizer tok, *tokp;  /* tokp: &tok with -z or a GGUF model, else NULL */
    Part parts[MAX_DOCUMENTS];
    int n_parts;           /* the documents, in order */
    int has_doc;           /* some document has its text (-d/-D) */
    int has_modules;       /* some document has modules (-k) */
    int n_before;          /* tokens before the prompt: the documents' */
    int n_prompt, *prompt;
    int n_alone, *alone;   /* the prompt as it starts a sequence, for the no-document model of --compare */
    int steps;             /* tokens to generate, within the context */
    int stop_id;           /* generation also stops at this token (the end of a chat turn); -1: none */
    Questions qa;          /* --qa: the questions, and each option as a prompt after the documents */
    PromptSet qa_prompts;
} Inputs;

/* A document option once read: a text's (or id file's) ids framed as the
 * first document [0] and as a later one [1] (an id file's as given, for
 * both); or a module file's modules, and the text option they stand in
 * for (-1: none is given). */
typedef struct {
    int n[2], *ids[2];
    ModuleSet modules;
    int text;
} ReadOption;

/* The ids of a -d or -D option, framed first and later (encode_document). */
static int read_framings(const Inputs *in, const DocOption *d, int chat, ReadOption *r) {
    const Config *c = &in->model.config;
    if (d->kind == DOC_IDS) {
        if (!(r->ids[0] = load_ids(d->path, &r->n[0]))) return -1;
        r->n[1] = r->n[0];
        r->ids[1] = xmalloc((r->n[0] + 1) * sizeof(int));
        memcpy(r->ids[1], r->ids[0], r->n[0] * sizeof(int));
    } else {
        char *text = need_tokenizer(in->tokp) == 0 ? read_text_file(d->path) : NULL;
        if (!text) return -1;
        if (!text[0]) { fprintf(stderr, "error: the document %s is empty\n", d->path); free(text); return -1; }
        for (int later = 0; later < 2 && (later == 0 || r->ids[0]); later++)  /* one error, not two */
            r->ids[later] = encode_document(in->tokp, text, chat, later, c->seq_len, &r->n[later]);
        free(text);
        if (!r->ids[0] || !r->ids[1]) return -1;
    }
    if (r->n[0] == 0 || r->n[1] == 0) { fprintf(stderr, "error: the document %s is empty\n", d->path); return -1; }
    return check_tokens(&in->model, r->ids[0], r->n[0], "document") != 0 ||
           check_tokens(&in->model, r->ids[1], r->n[1], "document") != 0 ? -1 : 0;
}

/* Every document option read; each module paired with the first text not
 * yet taken whose ids, framed first or later, have the fingerprint of the
 * document it was fitted to. */
static int read_options(const Options *o, const Inputs *in, ReadOption *r) {
    unsigned char taken[2 * MAX_DOCUMENTS] = {0};
    for (int i = 0; i < o->n_docs; i++) {
        r[i].text = -1;
        if (o->docs[i].kind != DOC_MODULES && read_framings(in, &o->docs[i], o->chat, &r[i]) != 0) return -1;
        if (o->docs[i].kind == DOC_MODULES &&
            moduleset_load(&r[i].modules, o->docs[i].path, in->model.fingerprint, 0) != 0) return -1;
    }
    for (int i = 0; i < o->n_docs; i++)
        for (int j = 0; o->docs[i].kind == DOC_MODULES && j < o->n_docs && r[i].text < 0; j++)
            for (int later = 0; o->docs[j].kind != DOC_MODULES && !taken[j] && later < 2; later++)
                if (document_fingerprint(r[j].ids[later], r[j].n[later]) == r[i].modules.doc_fingerprint) {
                    r[i].text = j;
                    taken[j] = 1;
                    break;
                }
    return 0;
}

/* The documents in command-line order: a text, with the modules paired
 * with it, or modules alone; the ids and modules move from r into them. */
static int assemble_parts(const Options *o, ReadOption *r, Inputs *in) {
    for (int i = 0; i < o->n_docs; i++) {
        if (o->docs[i].kind == DOC_MODULES && r[i].text >= 0) continue;  /* stands in for a text's document */
        if (in->n_parts == MAX_DOCUMENTS) {
            fprintf(stderr, "error: more than %d documents in one composition\n", MAX_DOCUMENTS);
            return -1;
        }
        Part *p = &in->parts[in->n_parts];
        int later = in->n_parts++ > 0;
        p->option = i;
        if (o->docs[i].kind == DOC_MODULES) {
            p->module_path = o->docs[i].path;
            p->modules = r[i].modules;
            memset(&r[i].modules, 0, sizeof(ModuleSet));
            p->n = p->modules.n_doc;
            continue;
        }
        p->text_path = o->docs[i].path;
        p->n = p->n_ids = r[i].n[later];
        p->ids = r[i].ids[later];
        r[i].ids[later] = NULL;
    }
    for (int i = 0; i < o->n_docs; i++)
        for (int k = 0; r[i].text >= 0 && k < in->n_parts; k++)
            if (in->parts[k].option == r[i].text) {
                in->parts[k].module_path = o->docs[i].path;
                in->parts[k].modules = r[i].modules;
                memset(&r[i].modules, 0, sizeof(ModuleSet));
            }
    return 0;
}

/* Where a module can stand: its later flag says whether it was fitted as
 * the first document or a later one. 0, or -1 after a sentence. */
static int check_module_place(const Inputs *in, const Part *p, int k) {
    int later = k > 0;
    if (p->modules.later == later) return 0;
    const char *as = p->modules.later ? "a later document of a composition (train --later-document)"
                                      : "a first document (train without --later-document)";
    if (!p->text_path && in->has_doc)
        fprintf(stderr, "error: %s was fitted to a different document than those given (-d/-D), so it would be "
                "document %d of its own; but it was fitted as %s\n", p->module_path, k + 1, as);
    else fprintf(stderr, "error: %s was fitted as %s, but here it is document %d of %d\n", p->module_path, as, k + 1,
                 in->n_parts);
    return -1;
}

/* A document's modules: the model's shape, its place, its text's length,
 * the context, its held-out prompts' ids and stops, the chat framing. */
static int check_part_modules(const Options *o, const Inputs *in, const Part *p, int k) {
    const Config *c = &in->model.config;
    const ModuleSet *ms = &p->modules;
    if (ms->n_layers != c->n_layers || ms->n_kv_heads != c->n_kv_heads || ms->head_size != c->dim / c->n_heads) {
        fprintf(stderr, "error: %s has modules for a different model shape\n", p->module_path);
        return -1;
    }
    if (check_module_place(in, p, k) != 0) return -1;
    if (p->text_path && (ms->n_doc != p->n_ids || ms->doc_fingerprint != document_fingerprint(p->ids, p->n_ids))) {
        fprintf(stderr, "error: %s stands for a document of %d tokens, but %s has %d; the file is corrupt\n",
                p->module_path, ms->n_doc, p->text_path, p->n_ids);
        return -1;
    }
    if (ms->n_doc >= c->seq_len) {
        fprintf(stderr, "error: %s stands for a document of %d tokens, which leaves no room in the "
                "model's context of %d\n", p->module_path, ms->n_doc, c->seq_len);
        return -1;
    }
    const PromptSet *held = &ms->heldout;  /* its ids and stops are the model's, as a checksum cannot tell */
    for (int j = 0; j < 2 && held->n_prompts > 0; j++)
        if (held->answer_stop[j] >= c->vocab_size) {
            fprintf(stderr, "error: %s: its held-out answers' stop token %d is outside the vocabulary of %d\n",
                    p->module_path, held->answer_stop[j], c->vocab_size);
            return -1;
        }
    if (held->n_prompts > 0 &&
        (check_tokens(&in->model, held->tokens, held->offsets[held->n_prompts], p->module_path) != 0 ||
         check_tokens(&in->model, held->nodoc_prefix, held->n_nodoc_prefix, p->module_path) != 0))
        return -1;
    if (ms->chat != o->chat) {
        fprintf(stderr, "error: %s was fitted to a document %s a chat turn; %s --chat\n", p->module_path,
                ms->chat ? "framed as" : "not framed as", ms->chat ? "add" : "drop");
        return -1;
    }
    return 0;
}

/* The documents (-d, -D, -k) into in->parts, each checked; n_before. */
static int load_documents(const Options *o, Inputs *in) {
    ReadOption r[2 * MAX_DOCUMENTS];
    memset(r, 0, sizeof r);
    int rc = read_options(o, in, r);
    if (rc == 0) rc = assemble_parts(o, r, in);
    for (int k = 0; rc == 0 && k < in->n_parts; k++) {
        const Part *p = &in->parts[k];
        in->has_doc |= p->text_path != NULL;
        in->has_modules |= p->module_path != NULL;
        in->n_before += p->n;
    }
    for (int k = 0; rc == 0 && k < in->n_parts; k++)
        if (in->parts[k].module_path) rc = check_part_modules(o, in, &in->parts[k], k);
    if (rc == 0 && in->n_before >= in->model.config.seq_len) {
        fprintf(stderr, "error: the documents (%d tokens) leave no room in the model's context of %d\n", in->n_before,
                in->model.config.seq_len);
        rc = -1;
    }
    for (int k = 0; rc == 0 && k < in->n_parts; k++)
        if (!in->parts[k].text_path && (o->eval || o->compare || o->qa_path || o->joined)) {
            fprintf(stderr, "error: %s stands for a document whose text is not given; --eval, --compare, --qa and "
                    "--joined read every document's full cache (give its -d or -D too)\n", in->parts[k].module_path);
            rc = -1;
        }
    if (rc == 0 && o->gpu && in->n_parts > 1) {
        fprintf(stderr, "error: the GPU runs one document; a composition of %d documents runs on the CPU (drop "
                "--gpu)\n", in->n_parts);
        rc = -1;
    }
    for (int i = 0; i < o->n_docs; i++) { free(r[i].ids[0]); free(r[i].ids[1]); moduleset_free(&r[i].modules); }
    return rc;
}

/* The prompt (BOS alone when none is given and there is no document), and
 * the number of tokens to generate within the context. */
static int load_prompt(const Options *o, Inputs *in) {
    const Config *c = &in->model.config;
    int after_doc = in->has_doc || in->has_modules;
    if (o->prompt_ids_path) in->prompt = load_ids(o->prompt_ids_path, &in->n_prompt);
    else if (o->prompt_text) {
        if (need_tokenizer(in->tokp) != 0) return -1;
        in->prompt = encode_prompt(in->tokp, o->prompt_text, o->chat, after_doc, c->seq_len - in->n_before,
                                   &in->n_prompt);
        if (in->prompt && o->chat)
            in->alone = encode_prompt(in->tokp, o->prompt_text, 1, 0, c->seq_len, &in->n_alone);
    }
    if ((o->prompt_text || o->prompt_ids_path) &&
        (!in->prompt || check_tokens(&in->model, in->prompt, in->n_prompt, "prompt") != 0)) return -1;
    if (in->n_prompt == 0) {
        if (after_doc && !o->eval && !o->qa_path) {
            fprintf(stderr, "error: give a prompt (-i or -I) to follow the document%s\n", in->n_parts > 1 ? "s" : "");
            return -1;
        }
        free(in->prompt);
        in->prompt = xmalloc(sizeof(int));
        in->prompt[0] = in->tokp ? in->tok.bos_id : 1;  /* BOS */
        in->n_prompt = 1;
    }
    if (!in->alone) {  /* without the document the prompt starts a sequence: BOS first, unless it has one */
        int bos = in->tokp ? in->tok.bos_id : 1, add = in->prompt[0] != bos;
        in->alone = xmalloc((in->n_prompt + 1) * sizeof(int));
        in->alone[0] = bos;
        memcpy(in->alone + add, in->prompt, in->n_prompt * sizeof(int));
        in->n_alone = in->n_prompt + add;
    }
    if (in->n_before + in->n_prompt > c->seq_len) {
        fprintf(stderr, "error: document%s (%d tokens) plus prompt (%d tokens) exceed the model's context "
                "of %d tokens\n", in->n_parts > 1 ? "s" : "", in->n_before, in->n_prompt, c->seq_len);
        return -1;
    }
    /* generated token i sits at position n_before + n_prompt + i; the last
     * one is sampled but never fed, so it may fall just past the context */
    in->steps = o->n_gen;
    if (!o->eval && in->steps > c->seq_len + 1 - in->n_before - in->n_prompt) {
        in->steps = c->seq_len + 1 - in->n_before - in->n_prompt;
        fprintf(stderr, "note: generating %d tokens, not %d: the context ends at %d\n", in->steps, o->n_gen,
                c->seq_len);
    }
    return 0;
}

static int load_inputs(const Options *o, Inputs *in) {
    memset(in, 0, sizeof(*in));
    if (!o->model_path) {
        fprintf(stderr, "error: a model is required (-m MODEL); see --help\n");
        return -1;
    }
    if (model_load(&in->model, o->model_path) != 0) return -1;
    int refused;
    const char *tok_path = tokenizer_source(o->model_path, o->tok_path, &refused);
    if (refused) return -1;
    if (tok_path) {
        if (tokenizer_load(&in->tok, tok_path, in->model.config.vocab_size) != 0) return -1;
        in->tokp = &in->tok;
    }
    if (check_chat(o, in->tokp) != 0) return -1;
    in->stop_id = o->chat ? in->tok.eos_id : -1;
    if (load_documents(o, in) != 0) return -1;
    if (o->qa_path && (need_tokenizer(in->tokp) != 0 || questions_load(&in->qa, o->qa_path) != 0 ||
                       questions_prompts(&in->qa, in->tokp, o->chat, in->model.config.seq_len - in->n_before,
                                         &in->qa_prompts) != 0)) return -1;
    return load_prompt(o, in);
}

static void inputs_free(Inputs *in) {
    for (int k = 0; k < in->n_parts; k++) { moduleset_free(&in->parts[k].modules); free(in->parts[k].ids); }
    questions_free(&in->qa);
    promptset_free(&in->qa_prompts);
    free(in->prompt); free(in->alone);
    if (in->tokp) tokenizer_free(in->tokp);
    model_free(&in->model);
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
    DocCache joined;                          /* --joined: one KV cache of all the documents */
    int has_joined;
    Model model_dev;                          /* --gpu: the copies */
    ModuleSet modules_dev;
} Device;

/* The one place the device is chosen: uploads to the GPU with --gpu. */
static int device_open(Device *dv, const Options *o, const Inputs *in) {
    memset(dv, 0, sizeof(*dv));
    dv->model = &in->model;
    for (int k = 0; k < in->n_parts; k++) dv->modules[k] = in->parts[k].module_path ? &in->parts[k].modules : NULL;
#ifdef NECTAR_CUDA
    if (o->gpu) {  /* one document at most (load_documents) */
        if (nectar_cuda_init() != 0) return -1;
        dv->gpu = 1;  /* from here on the device has copies to free */
        model_upload_cuda(&dv->model_dev, &in->model);
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
 * document's KV cache on its own, or with --joined one prefill of them
 * all) for --eval, --compare, --qa and generation without modules; and
 * Nectar's, the caches of the documents without modules. */
static int device_build_caches(Device *dv, const Options *o, const Inputs *in) {
    int need_full = !in->has_modules || o->eval || o->compare || o->qa_path;
    for (int k = 0; k < in->n_parts; k++) {
        const Part *p = &in->parts[k];
        int for_nectar = in->has_modules && !p->module_path, for_full = need_full && !o->joined;
        if (!p->text_path || !(for_nectar || for_full)) continue;
        if (device_prefill(dv, p->ids, p->n_ids, &dv->caches[k]) != 0) return -1;
        dv->has_cache[k] = 1;
    }
    if (!o->joined || !need_full) return 0;
    int *ids = xmalloc((in->n_before + 1) * sizeof(int)), n = 0;  /* (n_before) the documents' ids in order */
    for (int k = 0; k < in->n_parts; n += in->parts[k].n_ids, k++)
        memcpy(ids + n, in->parts[k].ids, in->parts[k].n_ids * sizeof(int));
    int rc = device_prefill(dv, ids, n, &dv->joined);
    free(ids);
    dv->has_joined = rc == 0;
    return rc;
}

/* The compositions a mode runs, linked in order: full, every document read
 * from its KV cache (or the --joined one of them all); nectar, modules
 * standing in where they are given. With no document, full is
 * NO_DOCUMENT. */
typedef struct { Document full[MAX_DOCUMENTS], nectar[MAX_DOCUMENTS]; } Compositions;

static void compositions(const Device *dv, const Inputs *in, Compositions *c) {
    c->full[0] = NO_DOCUMENT;
    for (int k = 0; k < in->n_parts; k++) {
        const DocCache *cache = dv->has_cache[k] ? &dv->caches[k] : NULL;
        c->full[k] = (Document){DOC_EXACT, in->parts[k].n, cache, NULL, NULL};
        c->nectar[k] = dv->modules[k] ? (Document){DOC_NECTAR, in->parts[k].n, NULL, dv->modules[k], NULL} : c->full[k];
        c->full[k].next = k + 1 < in->n_parts ? &c->full[k + 1] : NULL;
        c->nectar[k].next = k + 1 < in->n_parts ? &c->nectar[k + 1] : NULL;
    }
    if (dv->has_joined) c->full[0] = (Document){DOC_EXACT, dv->joined.n, &dv->joined, NULL, NULL};
}

static void device_close(Device *dv) {
    for (int k = 0; k < MAX_DOCUMENTS; k++)
        if (dv->has_cache[k]) {
#ifdef NECTAR_CUDA
            if (dv->gpu) { doccache_free_cuda(&dv->caches[k]); continue; }
#endif
            doccache_free(&dv->caches[k]);
        }
    if (dv->has_joined) doccache_free(&dv->joined);  /* --joined runs on the CPU */
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
    int V = m->config.vocab_size;
#ifdef NECTAR_CUDA
    if (r->gpu) {
        *logits = r->dev.logits + (size_t)(ntok - 1) * V;
        return forward_cuda(m, &r->dev, doc, tokens, ntok, pos, LOGITS_LAST);
    }
#endif
    *logits = r->cpu.logits + (size_t)(ntok - 1) * V;
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

/* Generates up to `steps` tokens after the prompt, printing them to stdout;
 * stops at BOS and at stop_id (the end of a chat turn; -1: none). Returns
 * the count, or -1. */
static int generate(const Device *dv, const Document *doc, const int *prompt, int n_prompt, int steps, int stop_id,
                    Sampler *sampler, const Tokenizer *tok, int print_ids, double *ms_first, double *tok_per_s) {
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

/* Tokens as one line of text (a newline shown as \\n), or as ids without a
 * tokenizer. */
static void print_tokens(const Tokenizer *tok, const int *tokens, int n) {
    for (int i = 0; i < n; i++) {
        const char *piece = tok ? tokenizer_decode(tok, i ? tokens[i - 1] : -1, tokens[i]) : NULL;
        if (!piece) printf("%s%d", i ? " " : "", tokens[i]);
        else for (const char *c = piece; *c; c++) fputs(*c == '\n' ? "\\n" : (char[2]){*c, 0}, stdout);
    }
}

/* The held-out task prompts of an evaluation with their three answers
 * (list_each), then the answer match. */
static void print_answers(const char *split, const EvalResult *r, const PromptSet *p, const Tokenizer *tok,
                          int list_each) {
    static const char *const names[3] = {"exact ", "Nectar", "no doc"};
    if (r->n_answers == 0) {
        printf("%s: no held-out prompt has a question part (spans and continuations have none)\n", split);
        return;
    }
    for (int a = 0; list_each && a < r->n_answers; a++) {
        const int *len = r->answer_len + (size_t)a * 3, *answers = r->answer_tokens + (size_t)a * 3 * r->answer_cap;
        int i = r->answer_prompt[a];
        int same = len[1] == len[0] && !memcmp(answers, answers + r->answer_cap, len[0] * sizeof(int));
        printf("[%d] ", a + 1);
        print_tokens(tok, p->tokens + p->offsets[i], p->question_len[i]);
        printf("\n");
        for (int k = 0; k < 3; k++) {
            printf("    %s: ", names[k]);
            print_tokens(tok, answers + (size_t)k * r->answer_cap, len[k]);
            printf(k == 1 ? (same ? "   (= exact)\n" : "   (DIFFERS from exact)\n") : "\n");
        }
    }
    printf("%s: Nectar's answer equals the full cache's on %.0f of %d task prompts (answer match %.3f; no "
           "document %.3f; prefix reproduced %.3f)\n", split, r->answer_match * r->n_answers, r->n_answers,
           r->answer_match, r->answer_match_nodoc, r->answer_prefix);
    printf("    ended with the stop: full cache %.0f, Nectar %.0f, no document %.0f (Nectar on %.0f of the %d the full "
           "cache ends); in a loop: %.0f, %.0f, %.0f\n", r->answer_ends[0] * r->n_answers,
           r->answer_ends[1] * r->n_answers, r->answer_ends[2] * r->n_answers,
           r->n_full_ends ? r->nectar_ends_too * r->n_full_ends : 0, r->n_full_ends, r->answer_repeats[0] * r->n_answers,
           r->answer_repeats[1] * r->n_answers, r->answer_repeats[2] * r->n_answers);
}

/* --drift: the drift table (or its JSON). */
static int run_drift(const Options *o, const Inputs *in, const Compositions *c) {
    DriftResult r;
    int n_seqs = o->drift_prompts ? o->drift_prompts : 8;
    const ModuleSet *ms = NULL;  /* the one module file's (options_problem) */
    for (int k = 0; k < in->n_parts; k++) if (in->parts[k].module_path) ms = &in->parts[k].modules;
    if (drift_profile(&in->model, c->full, c->nectar, &ms->heldout, o->drift, n_seqs, &r) != 0) return -1;
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

/* --eval --json: ", \"answers\": {split: [{\"prompt\": i, \"full\": [ids],
 * \"nectar\": [...], \"nodoc\": [...]}, ...], ...}" for each split with
 * answers, i the prompt's index among the module file's held-out ones. */
static void print_answers_json(const EvalResult split[EVAL_SPLITS]) {
    static const char *const keys[EVAL_SPLITS] = {"random", "challenge", "tasks"}, *const runs[3] = {"full", "nectar",
                                                                                                   "nodoc"};
    printf(", \"answers\": {");
    for (int k = 0; k < EVAL_SPLITS; k++) {
        const EvalResult *r = &split[k];
        printf("%s\"%s\": [", k ? ", " : "", keys[k]);
        for (int a = 0; a < r->n_answers; a++) {
            printf("%s{\"prompt\": %d", a ? ", " : "", r->answer_prompt[a]);
            for (int j = 0; j < 3; j++) {
                const int *ids = r->answer_tokens + ((size_t)a * 3 + j) * r->answer_cap;
                printf(", \"%s\": [", runs[j]);
                for (int t = 0; t < r->answer_len[(size_t)a * 3 + j]; t++) printf("%s%d", t ? ", " : "", ids[t]);
                printf("]");
            }
            printf("}");
        }
        printf("]");
    }
    printf("}");
}

/* --stops: where the answers of the random split and of the
 * evaluation-only tasks end (stop_profile), a table or a JSON object. */
static int print_stops(const Options *o, const Inputs *in, const Compositions *c, const ModuleSet *ms,
                       const EvalResult split[EVAL_SPLITS]) {
    static const char *const names[2] = {"random", "tasks"};
    const int splits[2] = {EVAL_RANDOM, EVAL_TASKS};
    if (o->json) printf("{");
    for (int k = 0; k < 2; k++) {
        StopResult r;
        if (stop_profile(&in->model, c->full, c->nectar, &ms->heldout, &split[splits[k]], &r) != 0) return -1;
        if (o->json) printf("%s\"%s\": {\"n_answers\": %d, \"bins\": [", k ? ", " : "", names[k], r.n_answers);
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
            if (o->json) printf("%s{\"lo\": %d, \"hi\": %d, \"count\": %d, \"logp\": [%.6g, %.6g, %.6g], "
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
        if (o->json) printf("]}");
    }
    if (o->json) printf("}");
    return 0;
}

/* --eval of one document's module file: the metrics on its held-out
 * prompts (on the CPU), after all the documents. */
static int eval_module(const Options *o, const Inputs *in, const Compositions *c, const Part *p) {
    const Config *cf = &in->model.config;
    const ModuleSet *ms = &p->modules;
    if (ms->heldout.n_prompts == 0) {
        fprintf(stderr, "error: %s holds no held-out prompts to evaluate on\n", p->module_path);
        return -1;
    }
    EvalResult split[EVAL_SPLITS];
    int rc = 0;
    if (evaluate(&in->model, c->full, c->nectar, &ms->heldout, split) != 0) return -1;
    if (o->stops) rc = print_stops(o, in, c, ms, split);
    else if (o->json) {
        printf("{\"arch\": \"%s\", \"rho\": %.6g, \"params\": %zu, \"kv_entries\": %ld, ",
               ms->arch == ARCH_MLP ? "mlp" : "quad", ms->rho, ms->n_params,
               2L * cf->n_layers * ms->n_doc * (cf->dim / cf->n_heads) * cf->n_kv_heads);
        print_eval_splits_json(stdout, split);
        print_answers_json(split);
        printf("}");
    } else {
        printf("held-out task prompts (random split): greedy answers to the model's stop or %d tokens\n",
               ms->heldout.answer_cap);
        print_answers("random split", &split[EVAL_RANDOM], &ms->heldout, in->tokp, 1);
        print_answers("challenge split", &split[EVAL_CHALLENGE], &ms->heldout, in->tokp, 0);
        if (split[EVAL_TASKS].n_prompts > 0)
            print_answers("evaluation-only tasks", &split[EVAL_TASKS], &ms->heldout, in->tokp, 0);
    }
    for (int k = 0; k < EVAL_SPLITS; k++) evalresult_free(&split[k]);
    return rc;
}

/* --eval: each module file's held-out prompts in turn (one file: its
 * metrics alone; several: each titled, and --json an array "modules" of
 * them, each with its file). */
static int run_eval(const Options *o, const Inputs *in, const Compositions *c) {
    int several = o->n_modules > 1, first = 1, rc = 0;
    if (several && o->json) printf("{\"modules\": [");
    for (int k = 0; k < in->n_parts && rc == 0; k++) {
        const Part *p = &in->parts[k];
        if (!p->module_path) continue;
        if (several && o->json) printf("%s{\"module\": \"%s\", \"document\": %d, \"metrics\": ", first ? "" : ", ",
                                       p->module_path, k + 1);
        else if (several) printf("%s=== held-out prompts of %s (document %d of %d) ===\n", first ? "" : "\n",
                                 p->module_path, k + 1, in->n_parts);
        rc = eval_module(o, in, c, p);
        if (several && o->json) printf("}");
        first = 0;
    }
    if (several && o->json) printf("]}");
    if (o->json) printf("\n");
    return rc;
}

/* --qa: every question's options scored as the reply with the full cache,
 * Nectar (with -k) and no document (on the CPU). */
static int run_qa(const Options *o, const Inputs *in, const Compositions *c) {
    QaResult r;
    if (qa_evaluate(&in->model, c->full, in->has_modules ? c->nectar : NULL, &in->qa, &in->qa_prompts, &r) != 0)
        return -1;
    if (o->json) { print_qa_json(stdout, &in->qa, &r); printf("\n"); }
    else print_qa_table(stdout, &in->qa, &r);
    qaresult_free(&r);
    return 0;
}

/* --compare: the same prompt and seed three ways; without a document the
 * prompt starts with BOS. */
static int run_compare(const Options *o, const Inputs *in, const Device *dv, const Compositions *c) {
    struct { const char *name; const Document *doc; const int *prompt; int n; } runs[3] = {
        {o->joined ? "exact (the documents' joined KV cache)" : "exact (document KV cache)", c->full, in->prompt,
         in->n_prompt},
        {"Nectar (module)", c->nectar, in->prompt, in->n_prompt},
        {"no document", &NO_DOCUMENT, in->alone, in->n_alone}};
    int rc = 0;
    for (int r = 0; r < 3 && rc == 0; r++) {
        double first_ms, rate;
        Sampler sampler;
        sampler_init(&sampler, in->model.config.vocab_size, o->temperature, o->topp, o->seed);
        printf("--- %s ---\n", runs[r].name);
        fflush(stdout);
        int n = generate(dv, runs[r].doc, runs[r].prompt, runs[r].n, in->steps, in->stop_id, &sampler, in->tokp,
                         o->print_ids, &first_ms, &rate);
        sampler_free(&sampler);
        if (n < 0) rc = -1;
        else fprintf(stderr, "%s: %.1f ms to first token, %d tokens at %.1f tok/s\n", runs[r].name, first_ms, n, rate);
    }
    return rc;
}

/* Generation with the document state `doc` (exact, Nectar or none). */
static int run_generate(const Options *o, const Inputs *in, const Device *dv, const Document *doc,
                        double prefill_ms) {
    double first_ms, rate;
    Sampler sampler;
    sampler_init(&sampler, in->model.config.vocab_size, o->temperature, o->topp, o->seed);
    int n = generate(dv, doc, in->prompt, in->n_prompt, in->steps, in->stop_id, &sampler, in->tokp, o->print_ids,
                     &first_ms, &rate);
    sampler_free(&sampler);
    if (n < 0) return -1;
    const char *mode = in->has_modules ? "Nectar" : in->has_doc ? "exact" : "no document";
    fprintf(stderr, "%s%s: %d document%s of %d tokens (prefill %.1f ms), prompt %d tokens (%.1f ms to first token), "
            "%d generated at %.1f tok/s\n", mode, dv->gpu ? " (GPU)" : "", in->n_parts, in->n_parts == 1 ? "" : "s",
            in->n_before, prefill_ms, in->n_prompt, first_ms, n, rate);
    return 0;
}

/* The storage line: the KV state of the documents read by modules against
 * the modules' bytes. */
static void print_storage(const Inputs *in) {
    const Config *c = &in->model.config;
    size_t kv_bytes = 0, module_bytes = 0;
    for (int k = 0; k < in->n_parts; k++) {
        const ModuleSet *ms = &in->parts[k].modules;
        if (!in->parts[k].module_path) continue;
        kv_bytes += 2 * sizeof(float) * (size_t)c->n_layers * ms->n_doc * (c->dim / c->n_heads) * c->n_kv_heads;
        module_bytes += ms->n_params * sizeof(float);
    }
    fprintf(stderr, "storage: document KV state %zu bytes, module %zu bytes (%.1fx smaller)\n", kv_bytes,
            module_bytes, (double)kv_bytes / module_bytes);
}

/* The mode the options ask for, with the documents as the device holds
 * them: generation reads Nectar's composition where there are modules. */
static int run_mode(const Options *o, const Inputs *in, const Device *dv, double prefill_ms) {
    Compositions c;
    compositions(dv, in, &c);
    if (in->has_modules) print_storage(in);
    return o->qa_path ? run_qa(o, in, &c) : o->drift ? run_drift(o, in, &c) : o->eval ? run_eval(o, in, &c)
         : o->compare ? run_compare(o, in, dv, &c)
         : run_generate(o, in, dv, in->has_modules ? c.nectar : c.full, prefill_ms);
}

int main(int argc, char **argv) {
    /* 1. options; --encode needs nothing else */
    Options o;
    if (parse_options(argc, argv, &o) != 0) return 1;
    if (o.encode_only) return encode_only(&o);

    /* 2. the model, tokenizer, document, modules and prompt */
    Inputs in;
    Device dv = {0};
    int rc = load_inputs(&o, &in);

    /* 3. the device, and the documents' KV caches on it (with modules, only
     * --eval, --compare and --qa need the full cache) */
    if (rc == 0) rc = device_open(&dv, &o, &in);
    double t0 = now_seconds();
    if (rc == 0) rc = device_build_caches(&dv, &o, &in);
    double prefill_ms = (now_seconds() - t0) * 1e3;

    /* 4. the mode, then everything freed (on the way out of an error too) */
    if (rc == 0) rc = run_mode(&o, &in, &dv, prefill_ms);
    device_close(&dv);
    inputs_free(&in);
    return rc != 0;
}
