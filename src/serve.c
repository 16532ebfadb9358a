/* serve.c - a request as infer and tools/study.c serve it (serve.h): its
 * options; its model, tokenizer and documents read and checked; the
 * compositions over the documents' KV caches; the reports of the held-out
 * prompts (--eval) and of the questions (--qa).
 */
#include "serve.h"
#include "formats.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Options                                                                  */

/* -d, -D or -k with path v, in order: 0, or -1 after a sentence. */
static int add_document_option(const char *a, const char *v, ServeOptions *o) {
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

/* argv[*i] into o if it is one of a request's options: 1, with *i on the
 * last word taken; 0 when it is none (or lacks its value); -1 after a
 * sentence. */
static int parse_serve_option(int argc, char **argv, int *i, ServeOptions *o) {
    const char *a = argv[*i];
    int document = !strcmp(a, "-d") || !strcmp(a, "-D") || !strcmp(a, "-k");
    const char **value = !strcmp(a, "-m") ? &o->model_path : !strcmp(a, "-z") ? &o->tok_path
                       : !strcmp(a, "--qa") ? &o->qa_path : NULL;
    if (!strcmp(a, "--chat")) { o->chat = 1; return 1; }
    if (!(document || value) || *i + 1 >= argc) return 0;
    if (document) return add_document_option(a, argv[++*i], o) == 0 ? 1 : -1;
    *value = argv[++*i];
    return 1;
}

int parse_command_line(int argc, char **argv, ServeOptions *o, void (*usage)(FILE *), ParseOwnOption parse_own,
                       void *options) {
    SeenOptions seen = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        int repeats = !strcmp(a, "-d") || !strcmp(a, "-D") || !strcmp(a, "-k");  /* a composition */
        if (!repeats && option_once(&seen, a) != 0) return -1;
        int taken = parse_serve_option(argc, argv, &i, o);
        if (taken == 0) taken = parse_own(argc, argv, &i, options);
        if (taken < 0) return -1;
        if (taken == 0) {
            fprintf(stderr, "error: unknown or incomplete option '%s' (see --help)\n", a);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The model, tokenizer, documents and questions                            */

int check_chat(int chat, const Tokenizer *tok) {
    if (chat && (!tok || !tok->chat_system)) {
        fprintf(stderr, "error: --chat needs a tokenizer with a ChatML chat template (a GGUF chat model)\n");
        return -1;
    }
    return 0;
}

int need_tokenizer(const Tokenizer *tok) {
    if (tok) return 0;
    fprintf(stderr, "error: text input needs a tokenizer (-z, or a GGUF model), or give token ids (-D/-I)\n");
    return -1;
}

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
static int read_framings(const Served *s, const DocOption *d, int chat, ReadOption *r) {
    const Config *c = &s->model.config;
    if (d->kind == DOC_IDS) {
        if ((r->n[0] = read_token_ids(d->path, &r->ids[0])) < 0) return -1;
        r->n[1] = r->n[0];
        r->ids[1] = xmalloc((r->n[0] + 1) * sizeof(int));
        memcpy(r->ids[1], r->ids[0], r->n[0] * sizeof(int));
    } else {
        char *text = need_tokenizer(s->tokp) == 0 ? read_text_file(d->path) : NULL;
        if (!text) return -1;
        if (!text[0]) { fprintf(stderr, "error: the document %s is empty\n", d->path); free(text); return -1; }
        for (int later = 0; later < 2 && (later == 0 || r->ids[0]); later++)  /* one error, not two */
            r->ids[later] = encode_document(s->tokp, text, chat, later, c->seq_len, &r->n[later]);
        free(text);
        if (!r->ids[0] || !r->ids[1]) return -1;
    }
    if (r->n[0] == 0 || r->n[1] == 0) { fprintf(stderr, "error: the document %s is empty\n", d->path); return -1; }
    return check_tokens(&s->model, r->ids[0], r->n[0], "document") != 0 ||
           check_tokens(&s->model, r->ids[1], r->n[1], "document") != 0 ? -1 : 0;
}

/* Every document option read; each module paired with the first text not
 * yet taken whose ids, framed first or later, have the fingerprint of the
 * document it was fitted to. */
static int read_options(const ServeOptions *o, const Served *s, ReadOption *r) {
    unsigned char taken[2 * MAX_DOCUMENTS] = {0};
    for (int i = 0; i < o->n_docs; i++) {
        r[i].text = -1;
        if (o->docs[i].kind != DOC_MODULES && read_framings(s, &o->docs[i], o->chat, &r[i]) != 0) return -1;
        if (o->docs[i].kind == DOC_MODULES &&
            moduleset_load(&r[i].modules, o->docs[i].path, s->model.fingerprint, 0) != 0) return -1;
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
static int assemble_parts(const ServeOptions *o, ReadOption *r, Served *s) {
    for (int i = 0; i < o->n_docs; i++) {
        if (o->docs[i].kind == DOC_MODULES && r[i].text >= 0) continue;  /* stands in for a text's document */
        if (s->n_parts == MAX_DOCUMENTS) {
            fprintf(stderr, "error: more than %d documents in one composition\n", MAX_DOCUMENTS);
            return -1;
        }
        Part *p = &s->parts[s->n_parts];
        int later = s->n_parts++ > 0;
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
        for (int k = 0; r[i].text >= 0 && k < s->n_parts; k++)
            if (s->parts[k].option == r[i].text) {
                s->parts[k].module_path = o->docs[i].path;
                s->parts[k].modules = r[i].modules;
                memset(&r[i].modules, 0, sizeof(ModuleSet));
            }
    return 0;
}

/* Where a module can stand: its later flag says whether it was fitted as
 * the first document or a later one. 0, or -1 after a sentence. */
static int check_module_place(const Served *s, const Part *p, int k) {
    int later = k > 0;
    if (p->modules.later == later) return 0;
    const char *as = p->modules.later ? "a later document of a composition (train --later-document)"
                                      : "a first document (train without --later-document)";
    if (!p->text_path && s->has_doc)
        fprintf(stderr, "error: %s was fitted to a different document than those given (-d/-D), so it would be "
                "document %d of its own; but it was fitted as %s\n", p->module_path, k + 1, as);
    else fprintf(stderr, "error: %s was fitted as %s, but here it is document %d of %d\n", p->module_path, as, k + 1,
                 s->n_parts);
    return -1;
}

/* A document's modules: the model's shape, its place, its text's length,
 * the context, its held-out prompts' ids and stops, the chat framing. */
static int check_part_modules(const ServeOptions *o, const Served *s, const Part *p, int k) {
    const Config *c = &s->model.config;
    const ModuleSet *ms = &p->modules;
    if (ms->n_layers != c->n_layers || ms->n_kv_heads != c->n_kv_heads || ms->head_size != c->dim / c->n_heads) {
        fprintf(stderr, "error: %s has modules for a different model shape\n", p->module_path);
        return -1;
    }
    if (check_module_place(s, p, k) != 0) return -1;
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
        (check_tokens(&s->model, held->tokens, held->offsets[held->n_prompts], p->module_path) != 0 ||
         check_tokens(&s->model, held->nodoc_prefix, held->n_nodoc_prefix, p->module_path) != 0))
        return -1;
    if (ms->chat != o->chat) {
        fprintf(stderr, "error: %s was fitted to a document %s a chat turn; %s --chat\n", p->module_path,
                ms->chat ? "framed as" : "not framed as", ms->chat ? "add" : "drop");
        return -1;
    }
    return 0;
}

/* The documents (-d, -D, -k) into s->parts, each checked; n_before. */
static int load_documents(const ServeOptions *o, Served *s) {
    ReadOption r[2 * MAX_DOCUMENTS];
    memset(r, 0, sizeof r);
    int rc = read_options(o, s, r);
    if (rc == 0) rc = assemble_parts(o, r, s);
    for (int k = 0; rc == 0 && k < s->n_parts; k++) {
        const Part *p = &s->parts[k];
        s->has_doc |= p->text_path != NULL;
        s->has_modules |= p->module_path != NULL;
        s->n_before += p->n;
    }
    for (int k = 0; rc == 0 && k < s->n_parts; k++)
        if (s->parts[k].module_path) rc = check_part_modules(o, s, &s->parts[k], k);
    if (rc == 0 && s->n_before >= s->model.config.seq_len) {
        fprintf(stderr, "error: the documents (%d tokens) leave no room in the model's context of %d\n", s->n_before,
                s->model.config.seq_len);
        rc = -1;
    }
    for (int k = 0; rc == 0 && k < s->n_parts; k++)
        if (!s->parts[k].text_path && o->full_cache_mode) {
            fprintf(stderr, "error: %s stands for a document whose text is not given; %s reads every document's "
                    "full cache (give its -d or -D too)\n", s->parts[k].module_path, o->full_cache_mode);
            rc = -1;
        }
    for (int i = 0; i < o->n_docs; i++) { free(r[i].ids[0]); free(r[i].ids[1]); moduleset_free(&r[i].modules); }
    return rc;
}

int served_load(Served *s, const ServeOptions *o) {
    memset(s, 0, sizeof(*s));
    if (!o->model_path) {
        fprintf(stderr, "error: a model is required (-m MODEL); see --help\n");
        return -1;
    }
    if (model_load(&s->model, o->model_path) != 0) return -1;
    int refused;
    const char *tok_path = tokenizer_source(o->model_path, o->tok_path, &refused);
    if (refused) return -1;
    if (tok_path) {
        if (tokenizer_load(&s->tok, tok_path, s->model.config.vocab_size) != 0) return -1;
        s->tokp = &s->tok;
    }
    if (check_chat(o->chat, s->tokp) != 0 || load_documents(o, s) != 0) return -1;
    if (o->qa_path && (need_tokenizer(s->tokp) != 0 || questions_load(&s->qa, o->qa_path) != 0 ||
                       questions_prompts(&s->qa, s->tokp, o->chat, s->model.config.seq_len - s->n_before,
                                         &s->qa_prompts) != 0)) return -1;
    return 0;
}

void served_free(Served *s) {
    for (int k = 0; k < s->n_parts; k++) { moduleset_free(&s->parts[k].modules); free(s->parts[k].ids); }
    questions_free(&s->qa);
    promptset_free(&s->qa_prompts);
    if (s->tokp) tokenizer_free(s->tokp);
    model_free(&s->model);
}

/* ------------------------------------------------------------------------ */
/* The compositions                                                         */

void compositions(const Served *s, const DocCache caches[MAX_DOCUMENTS], const int has_cache[MAX_DOCUMENTS],
                  const ModuleSet *const modules[MAX_DOCUMENTS], Compositions *c) {
    c->full[0] = NO_DOCUMENT;
    for (int k = 0; k < s->n_parts; k++) {
        const DocCache *cache = has_cache[k] ? &caches[k] : NULL;
        c->full[k] = (Document){DOC_EXACT, s->parts[k].n, cache, NULL, NULL};
        c->nectar[k] = modules[k] ? (Document){DOC_NECTAR, s->parts[k].n, NULL, modules[k], NULL} : c->full[k];
        c->full[k].next = k + 1 < s->n_parts ? &c->full[k + 1] : NULL;
        c->nectar[k].next = k + 1 < s->n_parts ? &c->nectar[k + 1] : NULL;
    }
}

void print_storage(const Served *s) {
    const Config *c = &s->model.config;
    size_t kv_bytes = 0, module_bytes = 0;
    for (int k = 0; k < s->n_parts; k++) {
        const ModuleSet *ms = &s->parts[k].modules;
        if (!s->parts[k].module_path) continue;
        kv_bytes += 2 * sizeof(float) * (size_t)c->n_layers * ms->n_doc * (c->dim / c->n_heads) * c->n_kv_heads;
        module_bytes += ms->n_params * sizeof(float);
    }
    fprintf(stderr, "storage: document KV state %zu bytes, module %zu bytes (%.1fx smaller)\n", kv_bytes,
            module_bytes, (double)kv_bytes / module_bytes);
}

/* ------------------------------------------------------------------------ */
/* The reports                                                              */

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

/* ", \"answers\": {split: [{\"prompt\": i, \"full\": [ids], \"nectar\":
 * [...], \"nodoc\": [...]}, ...], ...}" for each split with answers, i the
 * prompt's index among the module file's held-out ones. */
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

int report_answers(const Served *s, const Compositions *c, const Part *p, const EvalResult split[EVAL_SPLITS],
                   int json) {
    const Config *cf = &s->model.config;
    const ModuleSet *ms = &p->modules;
    if (json) {
        printf("{\"arch\": \"%s\", \"rho\": %.6g, \"params\": %zu, \"kv_entries\": %ld, ",
               ms->arch == ARCH_MLP ? "mlp" : "quad", ms->rho, ms->n_params,
               2L * cf->n_layers * ms->n_doc * (cf->dim / cf->n_heads) * cf->n_kv_heads);
        print_eval_splits_json(stdout, split);
        print_answers_json(split);
        printf("}");
        return 0;
    }
    printf("held-out task prompts (random split): greedy answers to the model's stop or %d tokens\n",
           ms->heldout.answer_cap);
    print_answers("random split", &split[EVAL_RANDOM], &ms->heldout, s->tokp, 1);
    print_answers("challenge split", &split[EVAL_CHALLENGE], &ms->heldout, s->tokp, 0);
    if (split[EVAL_TASKS].n_prompts > 0)
        print_answers("evaluation-only tasks", &split[EVAL_TASKS], &ms->heldout, s->tokp, 0);
    return 0;
}

/* One module file's held-out prompts evaluated and reported. */
static int eval_module(const Served *s, const Compositions *c, const Part *p, int json, EvalReport report) {
    if (p->modules.heldout.n_prompts == 0) {
        fprintf(stderr, "error: %s holds no held-out prompts to evaluate on\n", p->module_path);
        return -1;
    }
    EvalResult split[EVAL_SPLITS];
    if (evaluate(&s->model, c->full, c->nectar, &p->modules.heldout, split) != 0) return -1;
    int rc = report(s, c, p, split, json);
    for (int k = 0; k < EVAL_SPLITS; k++) evalresult_free(&split[k]);
    return rc;
}

int eval_modules(const Served *s, const Compositions *c, int json, EvalReport report) {
    int n_modules = 0, first = 1, rc = 0;
    for (int k = 0; k < s->n_parts; k++) n_modules += s->parts[k].module_path != NULL;
    int several = n_modules > 1;
    if (several && json) printf("{\"modules\": [");
    for (int k = 0; k < s->n_parts && rc == 0; k++) {
        const Part *p = &s->parts[k];
        if (!p->module_path) continue;
        if (several && json) printf("%s{\"module\": \"%s\", \"document\": %d, \"metrics\": ", first ? "" : ", ",
                                    p->module_path, k + 1);
        else if (several) printf("%s=== held-out prompts of %s (document %d of %d) ===\n", first ? "" : "\n",
                                 p->module_path, k + 1, s->n_parts);
        rc = eval_module(s, c, p, json, report);
        if (several && json) printf("}");
        first = 0;
    }
    if (several && json) printf("]}");
    if (json) printf("\n");
    return rc;
}

int run_qa(const Served *s, const Compositions *c, int json) {
    QaResult r;
    if (qa_evaluate(&s->model, c->full, s->has_modules ? c->nectar : NULL, &s->qa, &s->qa_prompts, &r) != 0)
        return -1;
    if (json) { print_qa_json(stdout, &s->qa, &r); printf("\n"); }
    else print_qa_table(stdout, &s->qa, &r);
    qaresult_free(&r);
    return 0;
}
