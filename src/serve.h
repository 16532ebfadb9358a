/* serve.h - a request as infer and tools/study.c serve it (serve.c): its
 * model, tokenizer and documents (-d, -D and -k in command-line order, a
 * composition) read and checked; the compositions, exact and Nectar, over
 * the documents' KV caches; and the reports both programs print: each
 * module file's held-out prompts (--eval) and multiple-choice questions
 * (--qa).
 *
 * A module file given beside the text of its document (matched by the
 * fingerprint the file holds) stands in for it; one given alone is a
 * document of its own, read by its modules only.
 */
#ifndef NECTAR_SERVE_H
#define NECTAR_SERVE_H

#include "../nectar.h"
#include "cli.h"
#include "eval.h"
#include "qa.h"
#include "tokenizer.h"

/* A document option: -d (text), -D (token ids) or -k (modules). */
typedef enum { DOC_TEXT, DOC_IDS, DOC_MODULES } DocKind;
typedef struct { DocKind kind; const char *path; } DocOption;

/* What a request serves, as its command line says. */
typedef struct {
    const char *model_path, *tok_path;  /* -m, -z */
    DocOption docs[2 * MAX_DOCUMENTS];  /* -d, -D and -k in command-line order */
    int n_docs, n_texts, n_modules;     /* of them: all, -d and -D, -k */
    int chat;                           /* --chat */
    const char *qa_path;                /* --qa */
    /* the mode that reads every document's full cache, so needs every
     * document's text (its name, for the sentence); NULL: none does */
    const char *full_cache_mode;
} ServeOptions;

/* A program's own option at argv[*i] into its options: 1, with *i on the
 * last word taken; 0 when argv[*i] is none of its own (or lacks its
 * value); -1 after a sentence. */
typedef int (*ParseOwnOption)(int argc, char **argv, int *i, void *options);
/* A command line: -m, -z, -d, -D, -k, --chat and --qa FILE into o, the
 * others through parse_own into the program's options. --help or -h
 * prints usage(stdout) and exits 0; an option given twice is refused, but
 * -d, -D and -k (a composition). 0, or -1 after a sentence. */
int parse_command_line(int argc, char **argv, ServeOptions *o, void (*usage)(FILE *), ParseOwnOption parse_own,
                       void *options);

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
    Questions qa;          /* --qa: the questions, and each option as a prompt after the documents */
    PromptSet qa_prompts;
} Served;

/* The model, tokenizer, documents (each module checked against the model,
 * its place, its text and the context) and questions of o; 0, or -1 after
 * a sentence. served_free frees what was loaded, after an error too. */
int  served_load(Served *s, const ServeOptions *o);
void served_free(Served *s);
/* -1 after a sentence: text input needs a tokenizer (tok NULL). */
int need_tokenizer(const Tokenizer *tok);
/* -1 after a sentence: --chat (chat) needs a chat template (tok NULL: none). */
int check_chat(int chat, const Tokenizer *tok);

/* The compositions a mode runs, linked in order: full, every document read
 * from its KV cache caches[k] (where has_cache[k]); nectar, the modules
 * modules[k] standing in where they are given (NULL: none; the host's or a
 * device's copy). With no document, full is NO_DOCUMENT. */
typedef struct { Document full[MAX_DOCUMENTS], nectar[MAX_DOCUMENTS]; } Compositions;
void compositions(const Served *s, const DocCache caches[MAX_DOCUMENTS], const int has_cache[MAX_DOCUMENTS],
                  const ModuleSet *const modules[MAX_DOCUMENTS], Compositions *c);

/* The storage line on stderr: the KV state of the documents read by
 * modules against the modules' bytes. */
void print_storage(const Served *s);

/* What is printed of one module file p's evaluation (split, on its held-out
 * prompts): 0, or -1 after a sentence. */
typedef int (*EvalReport)(const Served *s, const Compositions *c, const Part *p, const EvalResult split[EVAL_SPLITS],
                          int json);
/* Each module file's held-out prompts evaluated (on the CPU) and reported,
 * in turn: one file, its report alone; several, each titled, and with json
 * an array "modules" of them, each with its file. */
int eval_modules(const Served *s, const Compositions *c, int json, EvalReport report);
/* infer --eval's report: each held-out task prompt with its exact, Nectar
 * and no-document greedy answers, then the answer match (json: every
 * metric, and the answers' token ids). */
int report_answers(const Served *s, const Compositions *c, const Part *p, const EvalResult split[EVAL_SPLITS],
                   int json);
/* --qa: every question's options scored as the reply with the full cache,
 * Nectar (with modules) and no document (on the CPU): a table, or one JSON
 * object. */
int run_qa(const Served *s, const Compositions *c, int json);

#endif
