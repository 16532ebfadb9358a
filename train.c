/* train.c - compile a document into Nectar modules.
 *
 *   ./train -m model.bin -z tokenizer.bin -d doc.txt -o doc.nectar --arch mlp --rho 0.1
 *
 * 1. self-study prompts: document spans to quote, continuations the
 *    full-cache model samples after a span, and prompts from a file;
 *    a seeded 80/20 split into train and held-out, and a challenge subset;
 * 2. teacher pass: the full-cache model runs every prompt after the document
 *    and records, per position, layer and query head, q, alpha(q) and A(q);
 * 3. fitting: per (layer, KV head) module, AdamW with warmup and cosine
 *    decay, global gradient clipping at 1.0 (on the GPU with --gpu, in a
 *    build with nvcc, each layer's modules batched);
 * 4. the module file (with the held-out prompts) and the metrics.
 */
#include "nectar.h"
#ifdef NECTAR_CUDA
#include "nectar_cuda.h"
#endif

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const char *model_path, *tok_path, *doc_text_path, *doc_ids_path, *out_path;
    const char *prompts_text_path, *prompts_ids_path, *checkpoint_path, *resume_path;
    ModuleArch arch;
    float rho, lr, weight_decay, warmup_fraction, lambda_alpha, lambda_A, lambda_kl;
    int steps, batch, kl_prompts, n_prompts, prompt_len, answer_len, checkpoint_every, stop_after, json, gpu;
    int depth_backbone, depth_score, depth_target;
    const char *groups;
    unsigned long long seed;
} Options;

static void usage(FILE *f) {
    fprintf(f,
        "usage: train -m MODEL (-d DOC.txt | -D DOC.ids) -o OUT.nectar [options]\n"
        "  -m MODEL          llama2.c checkpoint          -z TOKENIZER  tokenizer.bin (text input)\n"
        "  -d DOC.txt        document text (BOS first)    -D DOC.ids    document token ids\n"
        "  -o OUT.nectar     module file to write\n"
        "  --arch mlp|quad   module architecture (default mlp)\n"
        "  --rho R           budget: params / (2 n d) per module (default 0.1)\n"
        "  --depths B,S,T    MLP depths: backbone, score head, target head (default 1,1,1)\n"
        "  --groups SPEC     layer-group capacity multipliers a-b:m,... (layers a..b-1 get m;\n"
        "                    normalised to average 1), e.g. 0-2:1,2-4:2 for 4 layers\n"
        "  --steps N         optimisation steps (default 6000; 0 evaluates the initial modules)\n"
        "  --batch N         prompt positions per step (default 64; x heads per group)\n"
        "  --lr LR           peak learning rate (default 1e-2)   --wd W  weight decay (default 0)\n"
        "  --warmup F        warmup fraction of the steps (default 0.05)\n"
        "  --lambda-alpha X  score loss weight (default 0.1 mlp, 0 quad)\n"
        "  --lambda-A X      target loss weight (default 1)\n"
        "  --lambda-kl X     KL distillation weight (default 0)\n"
        "  --loss PRESET     regression (default) | mixed (regression + 0.01 KL) | kl (pure KL)\n"
        "  --kl-prompts N    training prompts per step for the KL term (default 2)\n"
        "  --n-prompts N     self-study prompts to make (default 200)\n"
        "  --prompt-len N    prompt length cap in tokens (default 48)\n"
        "  --prompts FILE    extra prompts, one per line (text, needs -z; \\n is a newline)\n"
        "  --prompt-ids FILE extra prompts, one per line (token ids)\n"
        "  --answer-len N    tokens the full-cache model adds after each extra prompt (default 16)\n"
        "  --checkpoint P    write a checkpoint to P every --checkpoint-every steps (default steps/4)\n"
        "  --resume P        continue from checkpoint P (same data and options)\n"
        "  --stop-after N    stop after step N (with a checkpoint), as if interrupted\n"
        "  -s SEED           seed of prompts, split, init and batches (default 1234)\n"
        "  --json            one JSON object on stdout instead of tables\n"
        "  --gpu             fit on the GPU (builds with nvcc)\n"
        "  --help            this text\n");
}

/* the options that take a value, for the message when one comes last */
static const char VALUE_OPTIONS[] = " -m -z -d -D -o --prompts --prompt-ids --checkpoint --resume --groups --arch --depths "
    "--rho --lr --wd --warmup --lambda-alpha --lambda-A --lambda-kl --kl-prompts --loss --steps --batch --n-prompts "
    "--prompt-len --answer-len --checkpoint-every --stop-after -s ";

static int parse_options(int argc, char **argv, Options *o) {
    *o = (Options){.arch = ARCH_MLP, .rho = 0.1f, .lr = 1e-2f, .warmup_fraction = 0.05f,
                   .lambda_alpha = NAN, .lambda_A = NAN, .lambda_kl = NAN, .kl_prompts = 2, .answer_len = 16,
                   .steps = 6000, .batch = 64, .n_prompts = 200,
                   .prompt_len = 48, .depth_backbone = 1, .depth_score = 1, .depth_target = 1, .groups = "",
                   .seed = 1234};
    int preset = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--gpu")) { o->gpu = 1; continue; }
        if (i + 1 >= argc) { report_last_option(a, VALUE_OPTIONS); return -1; }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "-m")) o->model_path = v;
        else if (!strcmp(a, "-z")) o->tok_path = v;
        else if (!strcmp(a, "-d")) o->doc_text_path = v;
        else if (!strcmp(a, "-D")) o->doc_ids_path = v;
        else if (!strcmp(a, "-o")) o->out_path = v;
        else if (!strcmp(a, "--prompts")) o->prompts_text_path = v;
        else if (!strcmp(a, "--prompt-ids")) o->prompts_ids_path = v;
        else if (!strcmp(a, "--checkpoint")) o->checkpoint_path = v;
        else if (!strcmp(a, "--resume")) o->resume_path = v;
        else if (!strcmp(a, "--groups")) o->groups = v;
        else if (!strcmp(a, "--arch")) {
            if (!strcmp(v, "mlp")) o->arch = ARCH_MLP;
            else if (!strcmp(v, "quad")) o->arch = ARCH_QUAD;
            else { fprintf(stderr, "error: --arch must be mlp or quad, not '%s'\n", v); return -1; }
        } else if (!strcmp(a, "--depths")) {
            int used = 0;
            if (sscanf(v, "%d,%d,%d%n", &o->depth_backbone, &o->depth_score, &o->depth_target, &used) != 3 ||
                v[used]) {
                fprintf(stderr, "error: --depths expects three integers B,S,T, got '%s'\n", v);
                return -1;
            }
        }
        else if (!strcmp(a, "--rho")) bad = parse_float_option(a, v, &o->rho);
        else if (!strcmp(a, "--lr")) bad = parse_float_option(a, v, &o->lr);
        else if (!strcmp(a, "--wd")) bad = parse_float_option(a, v, &o->weight_decay);
        else if (!strcmp(a, "--warmup")) bad = parse_float_option(a, v, &o->warmup_fraction);
        else if (!strcmp(a, "--lambda-alpha")) bad = parse_float_option(a, v, &o->lambda_alpha);
        else if (!strcmp(a, "--lambda-A")) bad = parse_float_option(a, v, &o->lambda_A);
        else if (!strcmp(a, "--lambda-kl")) bad = parse_float_option(a, v, &o->lambda_kl);
        else if (!strcmp(a, "--kl-prompts")) bad = parse_int_option(a, v, &o->kl_prompts);
        else if (!strcmp(a, "--loss")) {
            if (!strcmp(v, "regression")) preset = 0;
            else if (!strcmp(v, "mixed")) preset = 1;
            else if (!strcmp(v, "kl")) preset = 2;
            else { fprintf(stderr, "error: --loss must be regression, mixed or kl, not '%s'\n", v); return -1; }
        }
        else if (!strcmp(a, "--steps")) bad = parse_int_option(a, v, &o->steps);
        else if (!strcmp(a, "--batch")) bad = parse_int_option(a, v, &o->batch);
        else if (!strcmp(a, "--n-prompts")) bad = parse_int_option(a, v, &o->n_prompts);
        else if (!strcmp(a, "--prompt-len")) bad = parse_int_option(a, v, &o->prompt_len);
        else if (!strcmp(a, "--answer-len")) bad = parse_int_option(a, v, &o->answer_len);
        else if (!strcmp(a, "--checkpoint-every")) bad = parse_int_option(a, v, &o->checkpoint_every);
        else if (!strcmp(a, "--stop-after")) bad = parse_int_option(a, v, &o->stop_after);
        else if (!strcmp(a, "-s")) bad = parse_seed_option(a, v, &o->seed);
        else { fprintf(stderr, "error: unknown option '%s' (see --help)\n", a); return -1; }
        if (bad) return -1;
    }
    /* loss presets (GUIDE): regression MLP (0.1, 1, 0), quadrature (0, 1, 0);
     * mixed adds 0.01 KL; pure KL (0, 0, 1). Explicit weights win. */
    float preset_alpha = preset == 2 ? 0.0f : o->arch == ARCH_MLP ? 0.1f : 0.0f;
    if (isnan(o->lambda_alpha)) o->lambda_alpha = preset_alpha;  /* not given (parsing refuses nan) */
    if (isnan(o->lambda_A)) o->lambda_A = preset == 2 ? 0.0f : 1.0f;
    if (isnan(o->lambda_kl)) o->lambda_kl = preset == 0 ? 0.0f : preset == 1 ? 0.01f : 1.0f;
    const char *why = NULL;
    if (!o->model_path) why = "a model is required (-m); see --help";
    else if (!o->out_path) why = "an output file is required (-o OUT.nectar)";
    else if (!o->doc_text_path == !o->doc_ids_path) why = "give the document as -d DOC.txt or -D DOC.ids (one of them)";
    else if (!(o->rho > 0 && o->rho <= 100)) why = "--rho must be in (0, 100]";
    else if (!depths_valid(o->depth_backbone, o->depth_score, o->depth_target) ||
             o->depth_backbone + o->depth_score + o->depth_target < 1)
        why = "--depths B,S,T must be >= 0 with 1 <= B+S+T <= 64";
    else if (o->steps < 0 || o->batch < 1 || o->n_prompts < 0 || o->prompt_len < 2 ||
             o->answer_len < 0 || o->stop_after < 0 || o->checkpoint_every < 0)
        why = "need --steps >= 0 (0: evaluate the initial modules), --batch >= 1, --n-prompts >= 0, "
              "--prompt-len >= 2, --answer-len >= 0, --stop-after >= 0 and --checkpoint-every >= 0";
    else if (!(o->lr > 0) || o->weight_decay < 0 || o->warmup_fraction < 0 || o->warmup_fraction >= 1)
        why = "need --lr > 0, --wd >= 0 and --warmup in [0, 1)";
    else if (o->lambda_alpha < 0 || o->lambda_A < 0 || o->lambda_kl < 0 || o->lambda_alpha + o->lambda_A + o->lambda_kl == 0)
        why = "the loss weights must be >= 0 and not all 0";
    else if (o->kl_prompts < 1 || o->kl_prompts > 64) why = "--kl-prompts must be in 1..64";
    else if (o->stop_after > 0 && !o->checkpoint_path) why = "--stop-after needs --checkpoint, or the fit is lost";
#ifndef NECTAR_CUDA
    else if (o->gpu) why = NO_GPU_SUPPORT;
#endif
    if (why) { fprintf(stderr, "error: %s\n", why); return -1; }
    if (o->checkpoint_every <= 0) o->checkpoint_every = o->steps / 4 > 0 ? o->steps / 4 : 1;
    /* find out now, not after the fitting, that the output cannot be written */
    const char *outputs[2] = {o->out_path, o->checkpoint_path};
    for (int k = 0; k < 2 && outputs[k]; k++) {
        struct stat st;
        if (stat(outputs[k], &st) == 0 && S_ISDIR(st.st_mode)) {
            fprintf(stderr, "error: %s is a directory; give a file name\n", outputs[k]);
            return -1;
        }
        char probe[4096];
        snprintf(probe, sizeof probe, "%s.tmp", outputs[k]);
        FILE *f = fopen(probe, "wb");
        if (!f) { fprintf(stderr, "error: cannot write %s: %s\n", probe, strerror(errno)); return -1; }
        fclose(f);
        remove(probe);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Prompts                                                                  */

typedef struct { int cap_prompts, cap_tokens; PromptSet set; } PromptBuilder;  /* a growing PromptSet */

static void add_prompt(PromptBuilder *b, const int *tokens, int len) {
    PromptSet *p = &b->set;
    if (p->n_prompts + 1 >= b->cap_prompts) {
        b->cap_prompts = 2 * b->cap_prompts + 16;
        p->offsets = realloc(p->offsets, b->cap_prompts * sizeof(int));
        p->challenge = realloc(p->challenge, b->cap_prompts);
        if (!p->offsets || !p->challenge) { fprintf(stderr, "error: out of memory\n"); exit(1); }
        if (p->n_prompts == 0) p->offsets[0] = 0;
    }
    int used = p->offsets[p->n_prompts];
    if (used + len > b->cap_tokens) {
        b->cap_tokens = 2 * (used + len) + 64;
        p->tokens = realloc(p->tokens, b->cap_tokens * sizeof(int));
        if (!p->tokens) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    }
    memcpy(p->tokens + used, tokens, len * sizeof(int));
    p->challenge[p->n_prompts] = 0;
    p->offsets[++p->n_prompts] = used + len;
}

/* Samples `len` tokens that the full-cache model generates after `span`. */
static void continue_span(const Model *m, const Document *doc, const int *span, int n_span, int len,
                          Sampler *sampler, int *out) {
    RunState s;
    runstate_alloc(&s, m, doc, n_span, n_span + len);
    forward(m, &s, doc, span, n_span, 0, LOGITS_LAST);
    float *logits = s.logits + (size_t)(n_span - 1) * m->config.vocab_size;
    for (int i = 0; i < len; i++) {
        out[i] = sample(sampler, logits, m->config.vocab_size);
        if (i + 1 < len) forward(m, &s, doc, &out[i], 1, n_span + i, LOGITS_LAST);
        logits = s.logits;
    }
    runstate_free(&s);
}

/* Self-study prompts: half quote a document span, half continue one with the
 * model's own sampled tokens; then the user's prompts. */
static void make_prompts(const Options *o, const Model *m, const Document *doc, const int *doc_ids,
                         int n_doc, PromptBuilder *b) {
    uint64_t rng = o->seed * 2654435761ULL + 17;
    int cap = o->prompt_len < n_doc ? o->prompt_len : n_doc;
    Sampler sampler;
    sampler_init(&sampler, m->config.vocab_size, 0.8f, 0.95f, o->seed + 1);
    int *buf = xmalloc((cap + 1) * sizeof(int));
    double t0 = now_seconds();
    for (int i = 0; i < o->n_prompts; i++) {
        int len = cap / 2 + (int)(rng_u32(&rng) % (cap - cap / 2 + 1));  /* in [cap/2, cap] */
        if (len < 2) len = 2 <= n_doc ? 2 : n_doc;
        int start = 1 + (int)(rng_u32(&rng) % (uint32_t)(n_doc - len > 0 ? n_doc - len : 1));
        if (start + len > n_doc) start = n_doc - len;
        if (i % 2 == 0 || len < 4) {  /* quote: a span of the document */
            add_prompt(b, doc_ids + start, len);
        } else {                        /* continue: half a span, then the model's own tokens */
            int half = len / 2;
            memcpy(buf, doc_ids + start, half * sizeof(int));
            continue_span(m, doc, buf, half, len - half, &sampler, buf + half);
            add_prompt(b, buf, len);
        }
        if (i % 20 == 19 || i + 1 == o->n_prompts) {
            double el = now_seconds() - t0;
            fprintf(stderr, "\rprompts %d/%d  %.1fs  ETA %.0fs   ", i + 1, o->n_prompts, el,
                    el / (i + 1) * (o->n_prompts - i - 1));
        }
    }
    if (o->n_prompts) fprintf(stderr, "\n");
    sampler_free(&sampler);
    free(buf);
}

/* Reads user prompts, one per line: text (needs a tokenizer) or token ids.
 * Each is followed by up to answer_len tokens that the full-cache model
 * samples after it (its own answer), within the length cap. */
static int read_user_prompts(const char *path, const Tokenizer *tok, const Model *m, const Document *doc, int cap,
                             int answer_len, Sampler *sampler, PromptBuilder *b) {
    char *text = read_text_file(path);
    if (!text) return -1;
    size_t room = strlen(text) + 3 + (size_t)cap;
    int *ids = xmalloc(room * sizeof(int)), line_no = 0, count = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        line_no++;
        if (!*line) continue;
        int n = 0;
        if (tok) {
            /* a backslash-n in a line stands for a newline, two backslashes for one */
            char *out = line;
            for (char *in = line; *in; in++) {
                if (in[0] == '\\' && (in[1] == 'n' || in[1] == '\\')) { *out++ = in[1] == 'n' ? '\n' : '\\'; in++; }
                else *out++ = *in;
            }
            *out = 0;
            n = tokenizer_encode(tok, line, 0, 0, ids, (int)strlen(line) + 3);
        } else {
            for (char *p = line, *end;; p = end) {
                errno = 0;
                long v = strtol(p, &end, 10);
                if (end != p && (errno == ERANGE || v < INT_MIN || v > INT_MAX)) end = p;  /* not an int */
                if (end == p) {
                    while (*end == ' ' || *end == '\t' || *end == '\r') end++;
                    if (*end) { fprintf(stderr, "error: %s line %d: '%s' is not a token id\n", path, line_no, end); n = -1; }
                    break;
                }
                ids[n++] = (int)v;
            }
        }
        if (n < 0 || check_tokens(m, ids, n, path) != 0) { free(ids); free(text); return -1; }
        if (n == 0) continue;  /* a blank line */
        if (n > cap) n = cap;
        int answer = cap - n < answer_len ? cap - n : answer_len;
        if (answer > 0) continue_span(m, doc, ids, n, answer, sampler, ids + n);
        if (n + answer >= 2) { add_prompt(b, ids, n + answer); count++; }
    }
    free(ids);
    free(text);
    fprintf(stderr, "read %d prompts from %s, each followed by up to %d tokens of the model's own answer\n",
            count, path, answer_len);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Teacher pass                                                             */

/* What the full-cache model records over the training prompts, per layer:
 * P positions, each with H query heads. */
typedef struct {
    FitTargets fit; /* P, and q, A(q), alpha(q) at the P positions */
    float *logits; /* (P, V) the teacher's logits, for the KL term (or NULL) */
    int n_train;   /* training prompts */
    int *prompt;   /* (n_train) their index in the prompt set */
    long *start;   /* (n_train) the position of their first token in P */
} TeacherData;

/* Runs the full-cache model over every prompt: train prompts (is_train[i])
 * are recorded into `td`; every prompt gets an embedding (D), the mean of its
 * final normalised hidden states. */
static void teacher_pass(const Model *m, const Document *doc, const PromptSet *p, const unsigned char *is_train,
                         int keep_logits, TeacherData *td, float *embed) {
    const Config *c = &m->config;
    int L = c->n_layers, D = c->dim, H = c->n_heads, max_len = promptset_max_len(p);
    FitTargets *f = &td->fit;
    f->P = 0;
    td->n_train = 0;
    td->prompt = xmalloc(p->n_prompts * sizeof(int));
    td->start = xmalloc(p->n_prompts * sizeof(long));
    for (int i = 0; i < p->n_prompts; i++) {
        int len = p->offsets[i + 1] - p->offsets[i];
        if (!is_train[i]) continue;
        td->prompt[td->n_train] = i;
        td->start[td->n_train++] = f->P;
        f->P += len;
    }
    size_t bytes = (size_t)f->P * ((size_t)L * (2 * D + H) + (keep_logits ? c->vocab_size : 0)) * sizeof(float);
    fprintf(stderr, "teacher pass: %d prompts, %ld training positions, %.1f MB of targets\n",
            p->n_prompts, f->P, bytes / 1e6);
    f->q = xmalloc((size_t)L * f->P * D * sizeof(float));
    f->A = xmalloc((size_t)L * f->P * D * sizeof(float));
    f->alpha = xmalloc((size_t)L * f->P * H * sizeof(float));
    td->logits = keep_logits ? xmalloc((size_t)f->P * c->vocab_size * sizeof(float)) : NULL;
    RunState s;
    runstate_alloc(&s, m, doc, max_len, max_len);
    runstate_enable_taps(&s, m);
    long at = 0;
    double t0 = now_seconds();
    for (int i = 0; i < p->n_prompts; i++) {
        int len = p->offsets[i + 1] - p->offsets[i];
        forward(m, &s, doc, p->tokens + p->offsets[i], len, 0, LOGITS_ALL);  /* s.xb: final normed rows */
        for (int k = 0; k < D; k++) {
            double sum = 0;
            for (int t = 0; t < len; t++) sum += s.xb[(size_t)t * D + k];
            embed[(size_t)i * D + k] = (float)(sum / len);
        }
        if (is_train[i]) {
            for (int l = 0; l < L; l++) {
                memcpy(f->q + ((size_t)l * f->P + at) * D, s.taps.q + (size_t)l * max_len * D, (size_t)len * D * sizeof(float));
                memcpy(f->A + ((size_t)l * f->P + at) * D, s.taps.doc_A + (size_t)l * max_len * D, (size_t)len * D * sizeof(float));
                memcpy(f->alpha + ((size_t)l * f->P + at) * H, s.taps.doc_lse + (size_t)l * max_len * H, (size_t)len * H * sizeof(float));
            }
            if (td->logits)
                memcpy(td->logits + (size_t)at * c->vocab_size, s.logits, (size_t)len * c->vocab_size * sizeof(float));
            at += len;
        }
        if (i % 20 == 19 || i + 1 == p->n_prompts) {
            double el = now_seconds() - t0;
            fprintf(stderr, "\rteacher %d/%d  %.1fs  ETA %.0fs   ", i + 1, p->n_prompts, el,
                    el / (i + 1) * (p->n_prompts - i - 1));
        }
    }
    fprintf(stderr, "\n");
    runstate_free(&s);
}

/* Challenge split: the held-out prompts whose embedding is least similar
 * (max cosine over training prompts) to any training prompt; a quarter of them. */
static void mark_challenge(PromptSet *p, const unsigned char *is_train, const float *embed, int D) {
    int n = p->n_prompts, n_held = 0;
    float *best = xmalloc(n * sizeof(float));
    for (int i = 0; i < n; i++) {
        p->challenge[i] = 0;
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
            if (!is_train[i] && !p->challenge[i] && (pick < 0 || best[i] < best[pick])) pick = i;
        p->challenge[pick] = 1;
    }
    free(best);
}

/* The prompts with is_train[i] == keep, as a new set. */
static PromptSet select_prompts(const PromptSet *p, const unsigned char *is_train, int keep) {
    PromptBuilder b = {0};
    for (int i = 0; i < p->n_prompts; i++)
        if (is_train[i] == keep) {
            add_prompt(&b, p->tokens + p->offsets[i], p->offsets[i + 1] - p->offsets[i]);
            b.set.challenge[b.set.n_prompts - 1] = p->challenge[i];
        }
    return b.set;
}

/* MLP initialisation from the teacher's data: output biases at the training
 * means of alpha and A, input scale 1 / rms(q), per (layer, KV head). */
static void mlp_init_from_teacher(ModuleSet *ms, const FitTargets *targets, const Config *c, uint64_t seed) {
    int L = c->n_layers, G = c->n_kv_heads, H = c->n_heads, D = c->dim, d = D / H, group = H / G;
    float *mean_a = xmalloc((size_t)L * G * sizeof(float)), *mean_A = xmalloc((size_t)L * G * d * sizeof(float));
    double *sA = xmalloc(d * sizeof(double));
    for (int l = 0; l < L; l++)
        for (int g = 0; g < G; g++) {
            double sa = 0, sq = 0;
            memset(sA, 0, d * sizeof(double));
            for (long t = 0; t < targets->P; t++)
                for (int j = 0; j < group; j++) {
                    size_t row = ((size_t)l * targets->P + t) * D + (size_t)(g * group + j) * d;
                    sa += targets->alpha[((size_t)l * targets->P + t) * H + g * group + j];
                    for (int k = 0; k < d; k++) {
                        sA[k] += targets->A[row + k];
                        sq += targets->q[row + k] * targets->q[row + k];
                    }
                }
            double count = (double)targets->P * group;
            mean_a[l * G + g] = (float)(sa / count);
            for (int k = 0; k < d; k++) mean_A[((size_t)l * G + g) * d + k] = (float)(sA[k] / count);
            ms->modules[l * G + g].input_scale = (float)(1.0 / sqrt(sq / (count * d) + 1e-12));
        }
    mlp_init(ms, seed, mean_a, mean_A);
    free(mean_a); free(mean_A); free(sA);
}

/* ------------------------------------------------------------------------ */
/* Budget                                                                   */

/* floor(x) for a budget given in decimal, where x may fall just below the
 * integer meant: 0.53 is stored as 0.52999997, and 0.53 x 200 must give 106 */
static long budget_floor(double x) {
    double nearest = round(x);
    return (long)(fabs(x - nearest) <= 1e-6 * x ? nearest : floor(x));
}

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

/* ------------------------------------------------------------------------ */
/* Optimisation                                                             */

typedef struct {
    float *m, *v;   /* (n_params) Adam moments */
    int step;       /* steps done */
} Adam;

/* lr(t): linear warmup to the peak, then cosine decay to 0 */
static float learning_rate(const Options *o, int step) {
    int warmup = (int)(o->warmup_fraction * o->steps);
    if (step < warmup) return o->lr * (step + 1) / warmup;
    float progress = (float)(step - warmup) / (float)(o->steps - warmup > 0 ? o->steps - warmup : 1);
    return o->lr * 0.5f * (1.0f + cosf(3.14159265f * progress));
}

/* One prompt's KL term, weight KL(teacher || student): returns the KL and
 * leaves its gradient with respect to the student's logits, times the
 * weight, in dlogits (len, V). */
static double kl_term(const float *teacher_logits, const float *student_logits, int len, int V, float weight,
                      float *dlogits) {
    double kl = kl_loss(teacher_logits, student_logits, len, V, dlogits);
    for (size_t j = 0; j < (size_t)len * V; j++) dlogits[j] *= weight;
    return kl;
}

#ifdef NECTAR_CUDA
/* The fit on the GPU: device copies of the modules (with gradients), of
 * their Adam moments, of the targets and of the model, a batch, and the
 * student of the KL term (the Nectar model on the device modules). */
typedef struct {
    ModuleSet ms;
    float *m, *v;        /* (n_params) */
    FitTargets targets;
    ModuleWork work;
    FitBatch batch;
    Model model;
    int with_kl;         /* the student below is there */
    Document student_doc;
    RunStateCuda student;
} GpuFit;

static void gpu_fit_start(GpuFit *g, const Model *model, const ModuleSet *ms, const Adam *adam, const FitTargets *t,
                          int B, int max_len, int with_kl) {
    const Config *c = &model->config;
    size_t bytes = ms->n_params * sizeof(float);
    moduleset_upload_cuda(&g->ms, ms, 1);
    g->m = cuda_xmalloc(bytes);
    g->v = cuda_xmalloc(bytes);
    CUDA_CHECK(cudaMemcpy(g->m, adam->m, bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(g->v, adam->v, bytes, cudaMemcpyHostToDevice));
    fittargets_upload_cuda(&g->targets, t, c->n_layers, c->dim, c->n_heads);
    modulework_alloc_cuda(&g->work, ms, B * c->n_heads);  /* a layer's G modules, B H / G queries each */
    fitbatch_alloc_cuda(&g->batch, ms, c->n_heads, B);
    model_upload_cuda(&g->model, model);
    g->student_doc = (Document){DOC_NECTAR, ms->n_doc, NULL, &g->ms};
    g->with_kl = with_kl;
    if (with_kl) {
        runstate_alloc_cuda(&g->student, &g->model, &g->student_doc, max_len, max_len);
        runstate_enable_backward_cuda(&g->student, &g->model);
    }
}

/* Zeroes the gradients, then adds the regression loss's at the positions
 * `pos` (B), if it has a weight; returns the loss. */
static double gpu_fit_regression(GpuFit *g, const long *pos, const Options *o, int H) {
    CUDA_CHECK(cudaMemset(g->ms.grads, 0, g->ms.n_params * sizeof(float)));
    if (o->lambda_alpha + o->lambda_A == 0) return 0;
    memcpy(g->batch.pos, pos, g->batch.B * sizeof(long));
    return regression_grads_cuda(&g->ms, &g->work, &g->batch, &g->targets, H, o->lambda_alpha, o->lambda_A);
}

/* The KL term of one prompt (see kl_term), its gradient added on the GPU. */
static double gpu_fit_kl(GpuFit *g, const int *tokens, int len, const float *teacher_logits, float weight,
                         float *dlogits) {
    forward_cuda(&g->model, &g->student, &g->student_doc, tokens, len, 0, LOGITS_ALL);
    double kl = kl_term(teacher_logits, g->student.logits, len, g->model.config.vocab_size, weight, dlogits);
    backward_cuda(&g->model, &g->student, &g->student_doc, len, dlogits);
    return kl;
}

/* Global norm clipping at 1.0 and the AdamW step; returns the norm. */
static double gpu_fit_update(GpuFit *g, int step, float lr, float wd) {
    double norm = clip_grad_norm_cuda(g->ms.grads, g->ms.n_params, 1.0);
    adamw_update_cuda(g->ms.params, g->ms.grads, g->m, g->v, g->ms.n_params, step, lr, wd, ADAM_BETA2);
    return norm;
}

/* The parameters and moments back to the host (checkpoints, the end). */
static void gpu_fit_download(const GpuFit *g, ModuleSet *ms, Adam *adam) {
    size_t bytes = ms->n_params * sizeof(float);
    moduleset_download_cuda(ms, &g->ms);
    CUDA_CHECK(cudaMemcpy(adam->m, g->m, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(adam->v, g->v, bytes, cudaMemcpyDeviceToHost));
}

static void gpu_fit_free(GpuFit *g) {
    CUDA_CHECK(cudaFree(g->m)); CUDA_CHECK(cudaFree(g->v));
    if (g->with_kl) runstate_free_cuda(&g->student);
    model_free_cuda(&g->model);
    fitbatch_free_cuda(&g->batch);
    modulework_free_cuda(&g->work);
    fittargets_free_cuda(&g->targets);
    moduleset_free_cuda(&g->ms);
    nectar_cuda_free();
}
#endif

/* Checkpoint: header, then params, Adam m and v. */
enum { CKPT_MAGIC = 0x4B43544E /* "NTCK" */, CKPT_VERSION = 1 };
typedef struct { uint32_t magic, version; int32_t step, reserved; uint64_t n_params, run_hash; } CkptHeader;

static int save_checkpoint(const char *path, const ModuleSet *s, const Adam *adam, uint64_t run_hash) {
    CkptHeader h = {CKPT_MAGIC, CKPT_VERSION, adam->step, 0, s->n_params, run_hash};
    size_t bytes = s->n_params * sizeof(float);
    const void *parts[4] = {&h, s->params, adam->m, adam->v};
    size_t sizes[4] = {sizeof h, bytes, bytes, bytes};
    return write_file_atomic(path, parts, sizes, 4);
}

static int load_checkpoint(const char *path, ModuleSet *s, Adam *adam, uint64_t run_hash, int steps) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "error: cannot open checkpoint %s\n", path); return -1; }
    CkptHeader h;
    const char *why = NULL;
    if (fread(&h, sizeof h, 1, f) != 1 || h.magic != CKPT_MAGIC || h.version != CKPT_VERSION)
        why = "it is not a train checkpoint";
    else if (h.n_params != s->n_params || h.run_hash != run_hash)
        why = "it was written by a run with other data or options";
    else if (h.step < 1 || h.step > steps) why = "its step count is corrupt";
    else if (fread(s->params, sizeof(float), s->n_params, f) != s->n_params ||
             fread(adam->m, sizeof(float), s->n_params, f) != s->n_params ||
             fread(adam->v, sizeof(float), s->n_params, f) != s->n_params || fgetc(f) != EOF)
        why = "it is truncated or corrupt";
    fclose(f);
    if (why) { fprintf(stderr, "error: checkpoint %s: %s\n", path, why); return -1; }
    adam->step = h.step;
    return 0;
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    Options o;
    if (parse_options(argc, argv, &o) != 0) return 1;
#ifdef NECTAR_CUDA
    if (o.gpu && nectar_cuda_init() != 0) return 1;
#endif
    double t_start = now_seconds();
    Model model;
    if (model_load(&model, o.model_path) != 0) return 1;
    const Config *c = &model.config;
    int L = c->n_layers, G = c->n_kv_heads, H = c->n_heads, D = c->dim, d = D / H, group = H / G;
    if (o.batch > INT_MAX / H) {  /* a step's module queries, batch x n_heads, are counted in int */
        fprintf(stderr, "error: --batch %d is too large for a model of %d heads; keep it below %d\n",
                o.batch, H, INT_MAX / H);
        return 1;
    }
    Tokenizer tok, *tokp = NULL;
    if (o.tok_path) {
        if (tokenizer_load(&tok, o.tok_path, c->vocab_size) != 0) return 1;
        tokp = &tok;
    }
    if (o.prompts_text_path && !tokp) {
        fprintf(stderr, "error: --prompts needs a tokenizer (-z); use --prompt-ids for token ids\n");
        return 1;
    }

    /* the document and its KV cache */
    int n_doc, *doc_ids;
    if (o.doc_ids_path) {
        n_doc = read_token_ids(o.doc_ids_path, &doc_ids);
        if (n_doc < 0) return 1;
    } else {
        if (!tokp) { fprintf(stderr, "error: a text document needs a tokenizer (-z)\n"); return 1; }
        char *text = read_text_file(o.doc_text_path);
        if (!text) return 1;
        doc_ids = xmalloc((size_t)c->seq_len * sizeof(int));  /* (seq_len): a longer document is refused */
        n_doc = tokenizer_encode(tokp, text, 1, 0, doc_ids, c->seq_len);
        free(text);
        if (n_doc < 0) return 1;
    }
    if (n_doc < 2) { fprintf(stderr, "error: the document needs at least 2 tokens\n"); return 1; }
    if (check_tokens(&model, doc_ids, n_doc, "document") != 0) return 1;
    int prompt_cap = o.prompt_len < n_doc ? o.prompt_len : n_doc;
    if (n_doc + prompt_cap > c->seq_len) {
        fprintf(stderr, "error: document (%d tokens) plus prompts (up to %d) exceed the model's context of %d; "
                "shorten the document or --prompt-len\n", n_doc, prompt_cap, c->seq_len);
        return 1;
    }
    DocCache cache;
    if (doccache_build(&cache, &model, doc_ids, n_doc, 256) != 0) return 1;
    Document doc = {DOC_EXACT, n_doc, &cache, NULL};

    /* 1. prompts and the split */
    PromptBuilder builder = {0};
    make_prompts(&o, &model, &doc, doc_ids, n_doc, &builder);
    Sampler answer_sampler;
    sampler_init(&answer_sampler, c->vocab_size, 0.8f, 0.95f, o.seed + 2);
    if (o.prompts_text_path && read_user_prompts(o.prompts_text_path, tokp, &model, &doc, prompt_cap, o.answer_len,
                                                 &answer_sampler, &builder) != 0) return 1;
    if (o.prompts_ids_path && read_user_prompts(o.prompts_ids_path, NULL, &model, &doc, prompt_cap, o.answer_len,
                                                &answer_sampler, &builder) != 0) return 1;
    sampler_free(&answer_sampler);
    PromptSet *all = &builder.set;
    if (all->n_prompts < 5) {
        fprintf(stderr, "error: %d prompts are too few for a train/held-out split (need 5)\n", all->n_prompts);
        return 1;
    }
    unsigned char *is_train = xmalloc(all->n_prompts);
    int *order = xmalloc(all->n_prompts * sizeof(int));
    uint64_t split_rng = o.seed * 0x9E3779B97F4A7C15ULL + 3;
    for (int i = 0; i < all->n_prompts; i++) order[i] = i;
    for (int i = all->n_prompts - 1; i > 0; i--) {  /* Fisher-Yates */
        int j = rng_u32(&split_rng) % (i + 1), t = order[i];
        order[i] = order[j]; order[j] = t;
    }
    int n_train = (int)(0.8 * all->n_prompts);
    for (int i = 0; i < all->n_prompts; i++) is_train[order[i]] = i < n_train;

    /* 2. teacher pass, challenge split */
    TeacherData td;
    float *embed = xmalloc((size_t)all->n_prompts * D * sizeof(float));
    teacher_pass(&model, &doc, all, is_train, o.lambda_kl > 0, &td, embed);
    mark_challenge(all, is_train, embed, D);

    /* 3. modules within the budget: rho * 2 n d parameters per (layer, KV head) */
    float *mult = xmalloc(L * sizeof(float));
    if (layer_multipliers(o.groups, L, mult) != 0) return 1;
    int *sizes = xmalloc(L * sizeof(int));
    for (int l = 0; l < L; l++) {
        double budget = o.rho * mult[l] * 2.0 * n_doc * d;
        sizes[l] = o.arch == ARCH_MLP
            ? mlp_width_for_budget(d, budget_floor(budget), o.depth_backbone, o.depth_score, o.depth_target)
            : (int)budget_floor((double)o.rho * mult[l] * n_doc);  /* p = floor(rho n): 2 p d parameters */
        if (o.arch == ARCH_QUAD && sizes[l] > n_doc) {
            fprintf(stderr, "error: layer %d would get %d quadrature pairs, more than the %d cached pairs they start "
                    "from; keep rho x multiplier <= 1\n", l, sizes[l], n_doc);
            return 1;
        }
    }
    ModuleSet ms;
    if (moduleset_alloc(&ms, o.arch, L, G, d, o.depth_backbone, o.depth_score, o.depth_target, sizes, 1) != 0) {
        fprintf(stderr, "error: raise --rho (the document has %d tokens) or lower the depths\n", n_doc);
        return 1;
    }
    ms.n_doc = n_doc; ms.rho = o.rho;
    ms.model_fingerprint = model.fingerprint; ms.doc_fingerprint = cache.fingerprint;
    long kv_entries = 2L * n_doc * d * L * G;
    FILE *info = o.json ? stderr : stdout;
    fprintf(info, "budget: %s, rho %.3g, document %d tokens, %d layers x %d KV heads, head size %d\n",
            o.arch == ARCH_MLP ? "MLP" : "quadrature", o.rho, n_doc, L, G, d);
    fprintf(info, "  %-6s %6s %8s %12s %12s %8s\n", "layer", "mult", o.arch == ARCH_MLP ? "width" : "pairs",
            "params/mod", "KV entries", "rho");
    for (int l = 0; l < L; l++) {
        size_t np = ms.modules[l * G].n_params;
        fprintf(info, "  %-6d %6.2f %8d %12zu %12ld %8.4f\n", l, mult[l], sizes[l], np, 2L * n_doc * d,
                np / (2.0 * n_doc * d));
    }
    fprintf(info, "  total %zu params for %ld KV entries: rho %.4f\n", ms.n_params, kv_entries,
            (double)ms.n_params / kv_entries);

    if (o.arch == ARCH_MLP) mlp_init_from_teacher(&ms, &td.fit, c, o.seed + 7);
    else quad_init_from_cache(&ms, &cache);

    /* 4. fitting */
    uint64_t run_hash = fnv1a(FNV_OFFSET, &o.arch, sizeof o.arch);
    float floats[] = {o.rho, o.lr, o.weight_decay, o.warmup_fraction, o.lambda_alpha, o.lambda_A, o.lambda_kl};
    int ints[] = {o.steps, o.batch, o.kl_prompts, o.n_prompts, o.prompt_len, o.answer_len, o.depth_backbone, o.depth_score, o.depth_target};
    run_hash = fnv1a(run_hash, floats, sizeof floats);
    run_hash = fnv1a(run_hash, ints, sizeof ints);
    run_hash = fnv1a(run_hash, &o.seed, sizeof o.seed);
    run_hash = fnv1a(run_hash, o.groups, strlen(o.groups));
    run_hash = fnv1a(run_hash, &model.fingerprint, sizeof(uint64_t));
    run_hash = fnv1a(run_hash, &cache.fingerprint, sizeof(uint64_t));
    run_hash = fnv1a(run_hash, all->tokens, all->offsets[all->n_prompts] * sizeof(int));

    Adam adam = {xmalloc(ms.n_params * sizeof(float)), xmalloc(ms.n_params * sizeof(float)), 0};
    if (o.resume_path) {
        if (load_checkpoint(o.resume_path, &ms, &adam, run_hash, o.steps) != 0) return 1;
        fprintf(stderr, "resumed from %s at step %d\n", o.resume_path, adam.step);
        if (o.stop_after > 0 && o.stop_after <= adam.step) {
            fprintf(stderr, "error: --stop-after %d is not after the checkpoint's step %d\n", o.stop_after, adam.step);
            return 1;
        }
    }
    ModuleWork work;
    modulework_alloc(&work, &ms, o.batch * group);
    FitBatch batch;
    fitbatch_alloc(&batch, &ms, H, o.batch);
    /* the student for the KL term: the Nectar model, teacher-forced on a prompt */
    Document student_doc = {DOC_NECTAR, n_doc, NULL, &ms};
    RunState student;
    int max_len = promptset_max_len(all), cpu_student = o.lambda_kl > 0 && !o.gpu;
    float *dlogits = o.lambda_kl > 0 ? xmalloc((size_t)max_len * c->vocab_size * sizeof(float)) : NULL;
    if (cpu_student) {
        runstate_alloc(&student, &model, &student_doc, max_len, max_len);
        runstate_enable_backward(&student, &model);
    }
#ifdef NECTAR_CUDA
    GpuFit gpu;
    if (o.gpu) gpu_fit_start(&gpu, &model, &ms, &adam, &td.fit, o.batch, max_len, o.lambda_kl > 0);
#endif
    double t_fit = now_seconds(), last_print = 0, loss = 0;
    int last_step = o.stop_after > 0 && o.stop_after < o.steps ? o.stop_after : o.steps;
    int first_step = adam.step;
    for (int step = first_step; step < last_step; step++) {
        /* the batch depends only on (seed, step): resuming draws the same batches */
        uint64_t batch_rng = fnv1a(o.seed, &step, sizeof step) | 1;
        for (int b = 0; b < batch.B; b++) batch.pos[b] = (long)(rng_u32(&batch_rng) % (uint32_t)td.fit.P);
        float lr = learning_rate(&o, step);
        adam.step++;
        /* L = regression over the batch positions + lambda_kl mean KL(teacher || Nectar)
         * over the positions of kl_prompts prompts */
#ifdef NECTAR_CUDA
        if (o.gpu) loss = gpu_fit_regression(&gpu, batch.pos, &o, H);
        else
#endif
        {
            memset(ms.grads, 0, ms.n_params * sizeof(float));
            loss = o.lambda_alpha + o.lambda_A > 0
                ? regression_grads(&ms, &work, &batch, &td.fit, H, o.lambda_alpha, o.lambda_A) : 0;
        }
        int kl_pick[64], kl_positions = 0;
        for (int k = 0; o.lambda_kl > 0 && k < o.kl_prompts; k++) {
            kl_pick[k] = rng_u32(&batch_rng) % td.n_train;
            int i = td.prompt[kl_pick[k]];
            kl_positions += all->offsets[i + 1] - all->offsets[i];
        }
        for (int k = 0; o.lambda_kl > 0 && k < o.kl_prompts; k++) {
            int i = td.prompt[kl_pick[k]], len = all->offsets[i + 1] - all->offsets[i];
            const int *tokens = all->tokens + all->offsets[i];
            const float *teacher = td.logits + (size_t)td.start[kl_pick[k]] * c->vocab_size;
            /* kl_loss averages over this prompt's positions; weigh by its share of all of them */
            float share = (float)len / kl_positions;
            double kl;
#ifdef NECTAR_CUDA
            if (o.gpu) kl = gpu_fit_kl(&gpu, tokens, len, teacher, o.lambda_kl * share, dlogits);
            else
#endif
            {
                forward(&model, &student, &student_doc, tokens, len, 0, LOGITS_ALL);
                kl = kl_term(teacher, student.logits, len, c->vocab_size, o.lambda_kl * share, dlogits);
                backward(&model, &student, &student_doc, tokens, len, dlogits, NULL);
            }
            loss += o.lambda_kl * kl * share;
        }
        double norm;
#ifdef NECTAR_CUDA
        if (o.gpu) norm = gpu_fit_update(&gpu, adam.step, lr, o.weight_decay);
        else
#endif
        {
            norm = clip_grad_norm(ms.grads, ms.n_params, 1.0);  /* global norm clipping at 1.0 */
            adamw_update(ms.params, ms.grads, adam.m, adam.v, ms.n_params, adam.step, lr, o.weight_decay, ADAM_BETA2);
        }
        if (!isfinite(loss) || !isfinite(norm)) {  /* a NaN norm would pass the clipping unseen */
            fprintf(stderr, "\nerror: training diverged at step %d (loss %g, gradient norm %g); lower --lr (%g), "
                    "--wd or the loss weights\n", step + 1, loss, norm, o.lr);
            return 1;
        }
        double now = now_seconds() - t_fit;
        if (now - last_print > 1.0 || step + 1 == last_step) {
            last_print = now;
            int done = step + 1 - first_step;
            fprintf(stderr, "\rstep %d/%d  loss %.5f  lr %.2e  |g| %.3f  %.1fs  ETA %.0fs   ", step + 1, o.steps,
                    loss, lr, norm, now, now / done * (last_step - step - 1));
        }
        if (o.checkpoint_path && ((step + 1) % o.checkpoint_every == 0 || step + 1 == last_step)) {
#ifdef NECTAR_CUDA
            if (o.gpu) gpu_fit_download(&gpu, &ms, &adam);
#endif
            if (save_checkpoint(o.checkpoint_path, &ms, &adam, run_hash) != 0) return 1;
        }
    }
    fprintf(stderr, "\n");
#ifdef NECTAR_CUDA
    if (o.gpu) {
        gpu_fit_download(&gpu, &ms, &adam);
        gpu_fit_free(&gpu);
    }
#endif
    double fit_seconds = now_seconds() - t_fit;
    if (last_step < o.steps) {
        fprintf(stderr, "stopped after step %d as asked; resume with --resume %s\n", last_step,
                o.checkpoint_path ? o.checkpoint_path : "(no --checkpoint given)");
        return 0;
    }

    /* 5. metrics on the held-out prompts, all of them and the challenge split
     * (evaluate refuses modules whose outputs are not finite) */
    ms.heldout = select_prompts(all, is_train, 0);
    EvalResult random_split, challenge_split;
    if (evaluate(&model, &cache, &ms, &ms.heldout, 0, &random_split) != 0) return 1;
    if (evaluate(&model, &cache, &ms, &ms.heldout, 1, &challenge_split) != 0) return 1;

    /* 6. the module file, with the held-out prompts */
    if (moduleset_save(&ms, o.out_path) != 0) return 1;
    fprintf(stderr, "wrote %s: %zu parameters, %.1f KB (document KV state: %.1f KB)\n", o.out_path,
            ms.n_params, ms.n_params * 4 / 1e3, kv_entries * 4 / 1e3);
    if (o.json) {
        printf("{\"arch\": \"%s\", \"rho\": %.6g, \"params\": %zu, \"kv_entries\": %ld, \"n_doc\": %d, "
               "\"steps\": %d, \"fit_seconds\": %.3f, \"total_seconds\": %.3f, \"random\": ",
               o.arch == ARCH_MLP ? "mlp" : "quad", o.rho, ms.n_params, kv_entries, n_doc, o.steps,
               fit_seconds, now_seconds() - t_start);
        print_eval_json(stdout, &random_split);
        printf(", \"challenge\": ");
        print_eval_json(stdout, &challenge_split);
        printf("}\n");
    } else {
        print_eval_table(stdout, "held-out prompts (random split)", &random_split, L);
        print_eval_table(stdout, "held-out prompts (challenge split)", &challenge_split, L);
    }
    fprintf(stderr, "fitting took %.1fs (%d steps), the whole run %.1fs\n", fit_seconds, o.steps,
            now_seconds() - t_start);

    evalresult_free(&random_split); evalresult_free(&challenge_split);
    fitbatch_free(&batch);
    free(adam.m); free(adam.v); free(mult); free(sizes); free(embed); free(is_train); free(order);
    free(td.fit.q); free(td.fit.A); free(td.fit.alpha); free(td.logits); free(td.prompt); free(td.start);
    if (cpu_student) runstate_free(&student);
    free(dlogits);
    modulework_free(&work);
    moduleset_free(&ms);
    promptset_free(all);
    doccache_free(&cache);
    free(doc_ids);
    if (tokp) tokenizer_free(tokp);
    model_free(&model);
    return 0;
}
