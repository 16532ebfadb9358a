/* infer.c - generate after a document: exact (its KV cache), Nectar (its
 * module, no document prefill at all) or with no document, on the CPU or
 * (--gpu, in a build with nvcc) the GPU.
 *
 *   ./infer -m model.bin -z tokenizer.bin -d doc.txt -i "prompt"          exact
 *   ./infer -m model.bin -z tokenizer.bin -k doc.nectar -i "prompt"       Nectar
 *   ./infer -m model.bin -z tokenizer.bin -i "prompt"                     no document
 */
#include "nectar.h"
#ifdef NECTAR_CUDA
#include "nectar_cuda.h"
#endif

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: infer -m MODEL [options]\n"
        "  -m MODEL       llama2.c checkpoint (v0)\n"
        "  -z TOKENIZER   llama2.c tokenizer.bin; without it, input and output are token ids\n"
        "  -d DOC.txt     document (text, encoded with BOS first)   -D DOC.ids  document as token ids\n"
        "  -k MODULE      Nectar module file: stands in for the document (no prefill)\n"
        "  -i \"prompt\"    prompt text (BOS only when there is no document)\n"
        "  -I PROMPT.ids  prompt as token ids, used as given\n"
        "  -n N           tokens to generate (default 64; stops early at the context end or BOS)\n"
        "  -t T           temperature (default 1.0; 0 = greedy)\n"
        "  -p P           top-p (default 0.9)\n"
        "  -s SEED        sampling seed (default 1234)\n"
        "  --ids          print the generated token ids, space-separated, on stdout\n"
        "  --encode       print the token ids of -i and exit (needs only -z; BOS first unless\n"
        "                 -d, -D or -k is given too, as for a prompt after a document)\n"
        "  --compare      with -k and -d/-D: exact, Nectar and no-document generations in turn\n"
        "  --eval         with -k and -d/-D: metrics on the held-out prompts kept in the module\n"
        "  --json         with --eval: one JSON object on stdout\n"
        "  --gpu          run on the GPU (builds with nvcc; not with --eval)\n"
        "  --help         this text\n"
        "Modes: with -d/-D the document's KV cache is used (exact); with -k the module is\n"
        "used instead (if -d/-D is also given, it must be the document the module was fitted\n"
        "to); with neither, there is no document.\n");
}

/* Token ids of a text (via the tokenizer; at most `room` of them) or of an id
 * file. NULL after a sentence. */
static int *load_tokens(const Tokenizer *tok, const char *text, const char *ids_path, int bos, int room, int *n) {
    if (ids_path) {
        int *ids;
        *n = read_token_ids(ids_path, &ids);
        return *n < 0 ? NULL : ids;
    }
    if (!tok) {
        fprintf(stderr, "error: text input needs a tokenizer (-z), or give token ids (-D/-I)\n");
        return NULL;
    }
    int max = strlen(text) + 3 < (size_t)room ? (int)strlen(text) + 3 : room;
    int *ids = xmalloc(max * sizeof(int));
    *n = tokenizer_encode(tok, text, bos, 0, ids, max);
    if (*n < 0) { free(ids); return NULL; }
    return ids;
}

/* The run state of a generation on the CPU, or on the GPU (m and doc then
 * hold device copies). */
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

/* Generates up to `steps` tokens after the prompt, printing them to stdout
 * (pieces with a tokenizer, else ids). Returns the count, or -1. */
static int generate(const Model *m, const Document *doc, int gpu, const int *prompt, int n_prompt, int steps,
                    Sampler *sampler, const Tokenizer *tok, int print_ids, double *ms_first, double *tok_per_s) {
    int V = m->config.vocab_size;
    Runner r;
    runner_alloc(&r, gpu, m, doc, n_prompt, n_prompt + (steps > 0 ? steps - 1 : 0));
    const float *last;
    double t0 = now_seconds();
    if (runner_forward(&r, m, doc, prompt, n_prompt, 0, &last) != 0) { runner_free(&r); return -1; }
    double t_first = now_seconds();
    int prev = prompt[n_prompt - 1], generated = 0;
    for (int i = 0; i < steps; i++) {
        int next = sample(sampler, last, V);
        if (next == 1) break;  /* BOS delimits sequences, as in llama2.c */
        generated++;
        if (print_ids || !tok) printf("%s%d", i ? " " : "", next);
        else {
            const char *piece = tokenizer_decode(tok, prev, next);
            /* raw bytes are printed only when printable or whitespace */
            if (piece && !(piece[0] && !piece[1] && (unsigned char)piece[0] < 32 &&
                           !strchr("\t\n\r", piece[0])))
                fputs(piece, stdout);
        }
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

int main(int argc, char **argv) {
    const char *model_path = NULL, *tok_path = NULL, *doc_text_path = NULL, *doc_ids_path = NULL;
    const char *module_path = NULL, *prompt_text = NULL, *prompt_ids_path = NULL;
    int n_gen = 64, print_ids = 0, encode_only = 0, eval = 0, compare = 0, json = 0, gpu = 0;
    float temperature = 1.0f, topp = 0.9f;
    unsigned long long seed = 1234;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--ids")) { print_ids = 1; continue; }
        if (!strcmp(a, "--encode")) { encode_only = 1; continue; }
        if (!strcmp(a, "--eval")) { eval = 1; continue; }
        if (!strcmp(a, "--compare")) { compare = 1; continue; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--gpu")) { gpu = 1; continue; }
        if (a[0] != '-' || strlen(a) != 2 || i + 1 >= argc) {
            fprintf(stderr, "error: unknown or incomplete option '%s' (see --help)\n", a);
            return 1;
        }
        const char *v = argv[++i];
        int bad = 0;
        switch (a[1]) {
        case 'm': model_path = v; break;
        case 'z': tok_path = v; break;
        case 'd': doc_text_path = v; break;
        case 'D': doc_ids_path = v; break;
        case 'k': module_path = v; break;
        case 'i': prompt_text = v; break;
        case 'I': prompt_ids_path = v; break;
        case 'n': bad = parse_int_option(a, v, &n_gen); break;
        case 't': bad = parse_float_option(a, v, &temperature); break;
        case 'p': bad = parse_float_option(a, v, &topp); break;
        case 's': bad = parse_seed_option(a, v, &seed); break;
        default:
            fprintf(stderr, "error: unknown option '%s' (see --help)\n", a);
            return 1;
        }
        if (bad) return 1;
    }
    if (n_gen < 0 || temperature < 0.0f || topp < 0.0f || topp > 1.0f) {
        fprintf(stderr, "error: need -n >= 0, -t >= 0 and -p in [0, 1]\n");
        return 1;
    }
    if ((eval || compare) && !(module_path && (doc_text_path || doc_ids_path))) {
        fprintf(stderr, "error: --eval and --compare need the module (-k) and its document (-d/-D)\n");
        return 1;
    }
    if (json && !eval) {
        fprintf(stderr, "error: --json is the output of --eval; add --eval or drop --json\n");
        return 1;
    }
    if (gpu && eval) {
        fprintf(stderr, "error: --eval runs on the CPU; drop --gpu\n");
        return 1;
    }
#ifndef NECTAR_CUDA
    if (gpu) {
        fprintf(stderr, "error: " NO_GPU_SUPPORT "\n");
        return 1;
    }
#endif
    if ((doc_text_path && doc_ids_path) || (prompt_text && prompt_ids_path)) {
        fprintf(stderr, "error: give the document as -d or -D and the prompt as -i or -I, not both\n");
        return 1;
    }

    Tokenizer tok, *tokp = NULL;
    if (encode_only) {
        if (!tok_path || !prompt_text) {
            fprintf(stderr, "error: --encode needs -z TOKENIZER and -i \"text\"\n");
            return 1;
        }
        if (tokenizer_load(&tok, tok_path, 0) != 0) return 1;
        int bos = !(doc_text_path || doc_ids_path || module_path);  /* as the prompt would get */
        int n, *ids = load_tokens(&tok, prompt_text, NULL, bos, INT_MAX, &n);
        if (!ids) return 1;
        for (int i = 0; i < n; i++) printf("%d%c", ids[i], i + 1 < n ? ' ' : '\n');
        free(ids);
        tokenizer_free(&tok);
        return 0;
    }
    if (!model_path) {
        fprintf(stderr, "error: a model is required (-m MODEL); see --help\n");
        return 1;
    }
    Model model;
    if (model_load(&model, model_path) != 0) return 1;
    const Config *c = &model.config;
    if (tok_path) {
        if (tokenizer_load(&tok, tok_path, c->vocab_size) != 0) return 1;
        tokp = &tok;
    }

    /* the document: exact KV cache, module, or none */
    int n_doc = 0, *doc_ids = NULL;
    int has_doc = doc_text_path || doc_ids_path;
    if (has_doc) {
        char *text = doc_text_path ? read_text_file(doc_text_path) : NULL;
        if (doc_text_path && !text) return 1;
        if (text && !text[0]) { fprintf(stderr, "error: the document %s is empty\n", doc_text_path); return 1; }
        doc_ids = load_tokens(tokp, text, doc_ids_path, 1, c->seq_len, &n_doc);
        free(text);
        if (!doc_ids || check_tokens(&model, doc_ids, n_doc, "document") != 0) return 1;
        if (n_doc == 0) { fprintf(stderr, "error: the document is empty\n"); return 1; }
    }
    ModuleSet modules;
    Document doc = {DOC_EXACT, 0, NULL, NULL};
    DocCache cache;
    if (module_path) {
        uint64_t doc_fp = has_doc ? document_fingerprint(doc_ids, n_doc) : 0;
        if (moduleset_load(&modules, module_path, model.fingerprint, doc_fp) != 0) return 1;
        if (modules.n_layers != c->n_layers || modules.n_kv_heads != c->n_kv_heads ||
            modules.head_size != c->dim / c->n_heads) {
            fprintf(stderr, "error: %s has modules for a different model shape\n", module_path);
            return 1;
        }
        if (has_doc && modules.n_doc != n_doc) {
            fprintf(stderr, "error: %s stands for a document of %d tokens, but the document has %d; "
                    "the file is corrupt\n", module_path, modules.n_doc, n_doc);
            return 1;
        }
        if (modules.n_doc >= c->seq_len) {
            fprintf(stderr, "error: %s stands for a document of %d tokens, which leaves no room in the "
                    "model's context of %d\n", module_path, modules.n_doc, c->seq_len);
            return 1;
        }
    }

    /* the prompt */
    int n_before = has_doc ? n_doc : module_path ? modules.n_doc : 0;  /* tokens before the prompt */
    int n_prompt = 0, *prompt = NULL;
    if (prompt_text || prompt_ids_path) {
        prompt = load_tokens(tokp, prompt_text, prompt_ids_path, !(has_doc || module_path), c->seq_len - n_before,
                             &n_prompt);
        if (!prompt || check_tokens(&model, prompt, n_prompt, "prompt") != 0) return 1;
    }
    if (n_prompt == 0) {
        if ((has_doc || module_path) && !eval) {
            fprintf(stderr, "error: give a prompt (-i or -I) to follow the document\n");
            return 1;
        }
        free(prompt);
        prompt = xmalloc(sizeof(int));
        prompt[0] = 1;  /* BOS */
        n_prompt = 1;
    }
    if (n_before + n_prompt > c->seq_len) {
        fprintf(stderr, "error: document (%d tokens) plus prompt (%d tokens) exceed the model's context "
                "of %d tokens\n", n_before, n_prompt, c->seq_len);
        return 1;
    }
    /* generated token i sits at position n_before + n_prompt + i; the last
     * one is sampled but never fed, so it may fall just past the context */
    int steps = n_gen;
    if (!eval && steps > c->seq_len + 1 - n_before - n_prompt) {
        steps = c->seq_len + 1 - n_before - n_prompt;
        fprintf(stderr, "note: generating %d tokens, not %d: the context ends at %d tokens\n", steps, n_gen, c->seq_len);
    }

    /* what generation runs on: the host's model and document state, or their
     * GPU copies (--gpu) */
    const Model *run_model = &model;
    const DocCache *run_cache = &cache;
    const ModuleSet *run_modules = &modules;
#ifdef NECTAR_CUDA
    Model model_dev;
    DocCache cache_dev;
    ModuleSet modules_dev;
    if (gpu) {
        if (nectar_cuda_init() != 0) return 1;
        model_upload_cuda(&model_dev, &model);
        if (module_path) moduleset_upload_cuda(&modules_dev, &modules, 0);
        run_model = &model_dev; run_cache = &cache_dev; run_modules = &modules_dev;
    }
#endif
    if (module_path) doc = (Document){DOC_NECTAR, modules.n_doc, NULL, run_modules};

    double t0 = now_seconds();
    /* the exact path's prefill: the document's KV cache (with a module, only
     * --eval and --compare need it) */
    int need_cache = has_doc && (!module_path || eval || compare);
    if (need_cache) {
#ifdef NECTAR_CUDA
        if (gpu && doccache_build_cuda(&cache_dev, &model_dev, doc_ids, n_doc, 256) != 0) return 1;
#endif
        if (!gpu && doccache_build(&cache, &model, doc_ids, n_doc, 256) != 0) return 1;
        if (!module_path) doc = (Document){DOC_EXACT, n_doc, run_cache, NULL};
    }
    double prefill_ms = (now_seconds() - t0) * 1e3;
    if (module_path) {
        size_t kv_bytes = 2 * sizeof(float) * (size_t)c->n_layers * modules.n_doc * (c->dim / c->n_heads) * c->n_kv_heads;
        fprintf(stderr, "storage: document KV state %zu bytes, module %zu bytes (%.1fx smaller)\n",
                kv_bytes, modules.n_params * sizeof(float), (double)kv_bytes / (modules.n_params * sizeof(float)));
    }
    if (eval) {
        if (modules.heldout.n_prompts == 0) {
            fprintf(stderr, "error: %s holds no held-out prompts to evaluate on\n", module_path);
            return 1;
        }
        EvalResult random_split, challenge_split;
        if (evaluate(&model, &cache, &modules, &modules.heldout, 0, &random_split) != 0 ||
            evaluate(&model, &cache, &modules, &modules.heldout, 1, &challenge_split) != 0) return 1;
        if (json) {
            printf("{\"arch\": \"%s\", \"rho\": %.6g, \"params\": %zu, \"kv_entries\": %ld, \"random\": ",
                   modules.arch == ARCH_MLP ? "mlp" : "quad", modules.rho, modules.n_params,
                   2L * c->n_layers * n_doc * (c->dim / c->n_heads) * c->n_kv_heads);
            print_eval_json(stdout, &random_split);
            printf(", \"challenge\": ");
            print_eval_json(stdout, &challenge_split);
            printf("}\n");
        } else {
            print_eval_table(stdout, "held-out prompts (random split)", &random_split, c->n_layers);
            print_eval_table(stdout, "held-out prompts (challenge split)", &challenge_split, c->n_layers);
        }
        evalresult_free(&random_split); evalresult_free(&challenge_split);
    } else if (compare) {
        /* the same prompt and seed three ways; without a document the prompt starts with BOS */
        Document exact = {DOC_EXACT, n_doc, run_cache, NULL}, none = {DOC_EXACT, 0, NULL, NULL};
        int *bos_prompt = xmalloc((n_prompt + 1) * sizeof(int));
        int bos = prompt[0] != 1;
        bos_prompt[0] = 1;
        memcpy(bos_prompt + bos, prompt, n_prompt * sizeof(int));
        struct { const char *name; const Document *doc; const int *prompt; int n; } runs[3] = {
            {"exact (document KV cache)", &exact, prompt, n_prompt},
            {"Nectar (module)", &doc, prompt, n_prompt},
            {"no document", &none, bos_prompt, n_prompt + bos}};
        for (int r = 0; r < 3; r++) {
            double first_ms, rate;
            Sampler sampler;
            sampler_init(&sampler, c->vocab_size, temperature, topp, seed);
            printf("--- %s ---\n", runs[r].name);
            fflush(stdout);
            int n = generate(run_model, runs[r].doc, gpu, runs[r].prompt, runs[r].n, steps, &sampler, tokp, print_ids,
                             &first_ms, &rate);
            sampler_free(&sampler);
            if (n < 0) return 1;
            fprintf(stderr, "%s: %.1f ms to first token, %d tokens at %.1f tok/s\n", runs[r].name, first_ms, n, rate);
        }
        free(bos_prompt);
    } else {
        double first_ms, rate;
        Sampler sampler;
        sampler_init(&sampler, c->vocab_size, temperature, topp, seed);
        int n = generate(run_model, &doc, gpu, prompt, n_prompt, steps, &sampler, tokp, print_ids, &first_ms, &rate);
        sampler_free(&sampler);
        if (n < 0) return 1;
        const char *mode = module_path ? "Nectar" : has_doc ? "exact" : "no document";
        fprintf(stderr, "%s%s: document %d tokens (prefill %.1f ms), prompt %d tokens (%.1f ms to first token), "
                "%d generated at %.1f tok/s\n", mode, gpu ? " (GPU)" : "", n_before, module_path ? 0.0 : prefill_ms, n_prompt,
                first_ms, n, rate);
    }

#ifdef NECTAR_CUDA
    if (gpu) {
        if (need_cache) doccache_free_cuda(&cache_dev);
        if (module_path) moduleset_free_cuda(&modules_dev);
        model_free_cuda(&model_dev);
        nectar_cuda_free();
    }
#endif
    if (need_cache && !gpu) doccache_free(&cache);
    if (module_path) moduleset_free(&modules);
    free(prompt); free(doc_ids);
    if (tokp) tokenizer_free(tokp);
    model_free(&model);
    return 0;
}
