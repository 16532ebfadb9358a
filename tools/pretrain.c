/* pretrain.c - the project's own default model: a byte-level llama-style
 * transformer (GQA, RoPE, SwiGLU) trained from scratch on the synthetic
 * corpus of corpus.c, with the forward and backward of nectar.c and AdamW.
 *
 *   ./pretrain -o data            writes data/model.bin, data/tokenizer.bin,
 *                                 data/doc.txt, data/prompts.txt and data/doc.qa
 *   ./pretrain --eval data        how well the model reads its document
 *   ./pretrain --write-doc DIR --doc-index 3
 *                                 another held-out document, its prompts and questions
 *
 * Everything is a function of the seed: the same command writes the same
 * bytes (two worker threads, each with single-threaded BLAS, whose
 * gradients are summed in a fixed order).
 */
#include "corpus.h"
#include "../nectar.h"
#include "../src/cli.h"
#include "../src/eval.h"
#include "../src/formats.h"
#include "../src/parallel.h"
#include "../src/tokenizer.h"
#include "../src/util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* the default model's shape: 4 layers, 4 query heads sharing 2 KV heads of size 32 */
static const Config DEFAULT_CONFIG = {128, 384, 4, 4, 2, 259, 320, LLAMA2C_ROPE_THETA, LLAMA2C_NORM_EPS};
enum { N_WORKERS = 2, MAX_BATCH = 1 << 20 /* samples per step */ };

typedef struct {
    const char *out_dir, *eval_dir, *write_doc_dir;
    int steps, batch, eval_docs, doc_index;
    float lr, p_copy_start, p_copy_end;
    unsigned long long seed;
} Options;

/* the options that take a value, for the message when one comes last */
static const char VALUE_OPTIONS[] = " -o --eval --write-doc --doc-index --steps --batch --docs --lr --copy-start "
    "--copy-end -s ";

static void usage(FILE *f) {
    fprintf(f,
        "usage: pretrain -o DIR [options]     train the default model into DIR\n"
        "       pretrain --eval DIR [options] measure how it reads its document\n"
        "       pretrain --write-doc DIR [--doc-index N] write a held-out document and its prompts\n"
        "  -o DIR          write model.bin, tokenizer.bin, doc.txt, prompts.txt, doc.qa there\n"
        "  --eval DIR      evaluate DIR/model.bin on held-out documents\n"
        "  --steps N       optimisation steps (default 6000)\n"
        "  --batch N       samples per step (default 16)\n"
        "  --lr LR         peak learning rate (default 2e-3)\n"
        "  --copy-start P  share of \"Repeat:\" copy samples at the start (default 0.6)\n"
        "  --copy-end P    and at the end, linearly in between (default 0.25)\n"
        "  --docs N        held-out documents for --eval (default 200)\n"
        "  --write-doc DIR write DIR/doc.txt, DIR/prompts.txt (its tasks, each cut before the answer)\n"
        "                  and DIR/doc.qa (a multiple-choice question on each of its facts) for held-out\n"
        "                  document --doc-index, as -o writes them for document 0\n"
        "  --doc-index N   which held-out document (default 0, the one -o writes; --eval reads 1..--docs)\n"
        "  -s SEED         seed (default 1)\n"
        "  --help          this text\n");
}

/* ------------------------------------------------------------------------ */
/* One step: workers run forward and backward on their share of the batch   */

typedef struct {
    const Model *model;
    const Options *o;
    RunState state;
    float *dparams;   /* (n_params) this worker's gradient */
    float *dlogits;   /* (T, V) */
    char *text;       /* (T) */
    float *weight;    /* (T) */
    int *tokens;      /* (T) */
    float *token_weight; /* (T) loss weight of the prediction at each position */
    int step, first, count;  /* samples [first, first + count) of the step */
    float p_copy;
    double loss, weight_sum; /* sum of w_i * CE_i and of w_i */
    long tokens_done;
} Worker;

/* Appends byte b as token b + 3, predicted from the previous position with
 * weight wt. */
static void push_byte(int *tokens, float *out_weight, int *n, unsigned char b, float wt) {
    tokens[*n] = b + 3;
    out_weight[*n - 1] = wt;
    (*n)++;
}

/* Tokens as the tokenizer gives them when the document (or nothing) and the
 * text after it are encoded apart, llama2.c-style with a leading space each:
 *   BOS, ' ', doc[0..doc_len), ' ', rest...        (doc_len 0: BOS, ' ', rest)
 * Bytes are ids byte + 3. weight (the loss weight of predicting each byte)
 * follows the bytes; the inserted spaces get CORPUS_PROMPT_WEIGHT. Token t + 1
 * is predicted at position t, with weight out_weight[t]. Returns the count. */
static int to_tokens(const char *doc, int doc_len, const char *rest, int rest_len, const float *doc_weight,
                     const float *rest_weight, int *tokens, float *out_weight) {
    int n = 1;
    tokens[0] = 1;  /* BOS */
    push_byte(tokens, out_weight, &n, ' ', CORPUS_PROMPT_WEIGHT);
    for (int i = 0; i < doc_len; i++) push_byte(tokens, out_weight, &n, doc[i], doc_weight ? doc_weight[i] : 0);
    if (doc_len > 0) push_byte(tokens, out_weight, &n, ' ', CORPUS_PROMPT_WEIGHT);
    for (int i = 0; i < rest_len; i++) push_byte(tokens, out_weight, &n, rest[i], rest_weight ? rest_weight[i] : 0);
    return n;
}

/* the rng of sample i of a step depends only on (seed, step, i) */
static uint64_t sample_rng(unsigned long long seed, int step, int i) {
    uint64_t key[3] = {seed, (uint64_t)step, (uint64_t)i};
    return fnv1a(FNV_OFFSET, key, sizeof key) | 1;
}

static void *worker_run(void *arg) {
    Worker *w = arg;
    const Model *m = w->model;
    int V = m->config.vocab_size, T = m->config.seq_len;
    Weights dw;
    weights_view(&m->config, m->shared_classifier, w->dparams, &dw);
    memset(w->dparams, 0, m->n_params * sizeof(float));
    w->loss = w->weight_sum = 0;
    w->tokens_done = 0;
    for (int i = w->first; i < w->first + w->count; i++) {
        uint64_t rng = sample_rng(w->o->seed, w->step, i);
        CorpusSample cs = corpus_sample(&rng, w->p_copy, w->text, w->weight, T - 2);
        int n = to_tokens(w->text, cs.doc_len, w->text + cs.doc_len, cs.len - cs.doc_len, w->weight,
                          w->weight + cs.doc_len, w->tokens, w->token_weight) - 1;  /* the last token is only a target */
        forward(m, &w->state, &NO_DOCUMENT, w->tokens, n, 0, LOGITS_ALL);
        w->tokens_done += n;
        /* L = sum_t w_t CE_t / sum of all weights of the step (applied after);
         * dL/dlogits_t = w_t (softmax(logits_t) - onehot(target_t)) */
        for (int t = 0; t < n; t++) {
            const float *z = w->state.logits + (size_t)t * V;
            float *dz = w->dlogits + (size_t)t * V, wt = w->token_weight[t];
            int target = w->tokens[t + 1];
            float max = z[argmax(z, V)];
            double sum = 0;
            for (int j = 0; j < V; j++) sum += exp(z[j] - max);
            double lse = max + log(sum);
            w->loss += wt * (lse - z[target]);
            w->weight_sum += wt;
            for (int j = 0; j < V; j++) dz[j] = (float)(wt * exp(z[j] - lse));
            dz[target] -= wt;
        }
        backward(m, &w->state, &NO_DOCUMENT, w->tokens, n, w->dlogits, &dw);
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Training                                                                 */

static void init_weights(Model *m, uint64_t seed) {
    uint64_t rng = seed;
    const Config *c = &m->config;
    for (size_t i = 0; i < m->n_params; i++) m->params[i] = 0.02f * rng_normal(&rng);
    /* the two projections that write into the residual stream start smaller */
    float shrink = 1.0f / sqrtf(2.0f * c->n_layers);
    for (size_t i = 0; i < (size_t)c->n_layers * c->dim * c->dim; i++) m->w.wo[i] *= shrink;
    for (size_t i = 0; i < (size_t)c->n_layers * c->dim * c->hidden_dim; i++) m->w.w2[i] *= shrink;
    for (size_t i = 0; i < (size_t)c->n_layers * c->dim; i++) m->w.rms_att[i] = m->w.rms_ffn[i] = 1.0f;
    for (int i = 0; i < c->dim; i++) m->w.rms_final[i] = 1.0f;
}

/* Writes what `f` (an open_memstream of buf, size) holds to path, atomically. */
static int write_memstream(FILE *f, char **buf, size_t *size, const char *path) {
    int ok = fclose(f) == 0;
    const void *part = *buf;
    if (ok) ok = write_file_atomic(path, &part, size, 1) == 0;
    else fprintf(stderr, "error: out of memory writing %s\n", path);
    free(*buf);
    return ok ? 0 : -1;
}

/* byte-level llama2.c tokenizer: <unk>, BOS, EOS, then <0x00>..<0xFF> */
static int write_tokenizer(const char *path) {
    char *buf;
    size_t size;
    FILE *f = open_memstream(&buf, &size);
    if (!f) { fprintf(stderr, "error: out of memory writing %s\n", path); return -1; }
    int max_len = 6;
    fwrite(&max_len, sizeof(int), 1, f);
    for (int id = 0; id < 259; id++) {
        char piece[8];
        if (id == 0) strcpy(piece, "<unk>");
        else if (id == 1) strcpy(piece, "\n<s>\n");
        else if (id == 2) strcpy(piece, "\n</s>\n");
        else snprintf(piece, sizeof piece, "<0x%02X>", id - 3);
        float score = 0.0f;
        int len = (int)strlen(piece);
        fwrite(&score, sizeof(float), 1, f);
        fwrite(&len, sizeof(int), 1, f);
        fwrite(piece, 1, len, f);
    }
    return write_memstream(f, &buf, &size, path);
}

/* held-out documents come from their own stream, never the training one;
 * their questions' wrong answers from another */
static uint64_t heldout_rng(unsigned long long seed, int i) { return sample_rng(seed ^ 0x5EED0F4E1DULL, -1, i); }
static uint64_t questions_rng(unsigned long long seed, int i) { return sample_rng(seed ^ 0x5EED0F4E1DULL, -2, i); }

/* DIR/doc.qa: multiple-choice questions about the document, one for each
 * of its facts (corpus_questions), for infer --qa and train --qa. */
static int write_questions(const char *dir, const Options *o, const char *doc, int n) {
    char path[1024], text[8192];
    uint64_t rng = questions_rng(o->seed, o->doc_index);
    int len = snprintf(text, sizeof text, "# questions about doc.txt from its facts, written by pretrain (seed %llu, "
                       "document %d)\n\n", o->seed, o->doc_index);
    int body = corpus_questions(&rng, doc, n, text + len, (int)sizeof text - len);
    if (body < 0) { fprintf(stderr, "error: the questions of document %d do not fit\n", o->doc_index); return -1; }
    snprintf(path, sizeof path, "%s/doc.qa", dir);
    const void *part = text;
    size_t size = len + body;
    return write_file_atomic(path, &part, &size, 1);
}

/* The default document (held-out document o->doc_index: 0 for -o) and
 * default prompts: tasks about it of each kind, each cut just before its
 * answer, without repeats, kinds interleaved so that the first three are a
 * quote, a continuation and a question. A backslash-n in prompts.txt stands
 * for a newline. */
static int write_demo(const char *dir, const Options *o) {
    enum { PER_KIND = 20, TRIES = 200 };
    char path[1024], doc[512], task[256], seen[3 * PER_KIND][256];
    int n_seen = 0, kept[3] = {0};
    uint64_t rng = heldout_rng(o->seed, o->doc_index);
    int n = corpus_document(&rng, doc, sizeof doc);
    snprintf(path, sizeof path, "%s/doc.txt", dir);
    const void *doc_part = doc;
    size_t doc_size = n;
    if (write_file_atomic(path, &doc_part, &doc_size, 1) != 0 || write_questions(dir, o, doc, n) != 0) return -1;
    snprintf(path, sizeof path, "%s/prompts.txt", dir);
    char *buf;
    size_t size;
    FILE *f = open_memstream(&buf, &size);
    if (!f) { fprintf(stderr, "error: out of memory writing %s\n", path); return -1; }
    for (int attempt = 0; attempt < TRIES; attempt++) {
        int kind = attempt % 3, answer;
        if (kept[kind] == PER_KIND || corpus_task(&rng, doc, n, kind, task, sizeof task, &answer) < 0) continue;
        task[answer] = 0;
        int repeat = 0;
        for (int i = 0; i < n_seen; i++) repeat |= strcmp(seen[i], task) == 0;
        if (repeat) continue;
        strcpy(seen[n_seen++], task);
        kept[kind]++;
        fputs("\\n", f);  /* the prompt follows the document after a newline */
        for (char *c = task; *c; c++) fputs(*c == '\n' ? "\\n" : (char[2]){*c, 0}, f);
        fputc('\n', f);
    }
    return write_memstream(f, &buf, &size, path);
}

static void workers_alloc(Worker *workers, Model *m, const Options *o) {
    int T = m->config.seq_len, V = m->config.vocab_size;
    for (int k = 0; k < N_WORKERS; k++) {
        Worker *w = &workers[k];
        memset(w, 0, sizeof(*w));
        w->model = m; w->o = o;
        runstate_alloc(&w->state, m, &NO_DOCUMENT, T, T);
        runstate_enable_backward(&w->state, m);
        w->dparams = xmalloc(m->n_params * sizeof(float));
        w->dlogits = xmalloc((size_t)T * V * sizeof(float));
        w->text = xmalloc(T + 1);
        w->weight = xmalloc(T * sizeof(float));
        w->tokens = xmalloc(T * sizeof(int));
        w->token_weight = xmalloc(T * sizeof(float));
    }
}

static void workers_free(Worker *workers) {
    for (int k = 0; k < N_WORKERS; k++) {
        runstate_free(&workers[k].state);
        free(workers[k].dparams); free(workers[k].dlogits); free(workers[k].text);
        free(workers[k].weight); free(workers[k].tokens); free(workers[k].token_weight);
    }
}

/* One step's gradients and losses of every worker, run in parallel. */
static void run_workers(Worker *workers, int step, float p_copy, int batch) {
    pthread_t threads[N_WORKERS];
    for (int k = 0; k < N_WORKERS; k++) {
        Worker *w = &workers[k];
        w->step = step; w->p_copy = p_copy;
        w->first = k * batch / N_WORKERS;
        w->count = (k + 1) * batch / N_WORKERS - w->first;
        pthread_create(&threads[k], NULL, worker_run, w);
    }
    for (int k = 0; k < N_WORKERS; k++) pthread_join(threads[k], NULL);
}

/* The workers' gradients summed in a fixed order into workers[0].dparams,
 * normalised by the step's total weight and clipped at norm 1.0; returns
 * the norm before clipping and the weighted mean loss in *loss. */
static double combine_gradients(Worker *workers, size_t n_params, double *loss) {
    double loss_sum = 0, weight_sum = 0, norm = 0;
    for (int k = 0; k < N_WORKERS; k++) { loss_sum += workers[k].loss; weight_sum += workers[k].weight_sum; }
    float *g = workers[0].dparams;
    for (int k = 1; k < N_WORKERS; k++)
        for (size_t i = 0; i < n_params; i++) g[i] += workers[k].dparams[i];
    for (size_t i = 0; i < n_params; i++) { g[i] /= (float)weight_sum; norm += (double)g[i] * g[i]; }
    norm = sqrt(norm);
    float clip = norm > 1.0 ? (float)(1.0 / norm) : 1.0f;
    for (size_t i = 0; i < n_params; i++) g[i] *= clip;
    *loss = loss_sum / weight_sum;
    return norm;
}

/* lr: warmup over 2% of the steps, then cosine decay to a tenth */
static float pretrain_lr(const Options *o, int step) {
    int warmup = o->steps / 50 + 1;
    return step < warmup ? o->lr * (step + 1) / warmup
         : o->lr * (0.1f + 0.45f * (1.0f + cosf(3.14159265f * (step - warmup) / (o->steps - warmup))));
}

/* model.bin, tokenizer.bin and the demo's document and prompts into DIR. */
static int write_outputs(const Options *o, const Model *m) {
    char path[1024];
    snprintf(path, sizeof path, "%s/model.bin", o->out_dir);
    int rc = model_save(m, path);
    snprintf(path, sizeof path, "%s/tokenizer.bin", o->out_dir);
    if (rc == 0) rc = write_tokenizer(path);
    if (rc == 0) rc = write_demo(o->out_dir, o);
    if (rc == 0) fprintf(stderr, "wrote %s/{model.bin,tokenizer.bin,doc.txt,prompts.txt,doc.qa}\n", o->out_dir);
    return rc;
}

/* --write-doc: held-out document o->doc_index and its prompts into a
 * folder (made if missing), without a model. */
static int write_held_out_document(const Options *o) {
    if (mkdir(o->write_doc_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "error: cannot make %s: %s\n", o->write_doc_dir, strerror(errno));
        return -1;
    }
    if (write_demo(o->write_doc_dir, o) != 0) return -1;
    fprintf(stderr, "wrote %s/doc.txt, prompts.txt and doc.qa: held-out document %d (seed %llu)\n",
            o->write_doc_dir, o->doc_index, o->seed);
    return 0;
}

static int pretrain(const Options *o) {
    parallel_set_threads(1);  /* the workers are the parallelism (OpenBLAS single-threaded too) */
    /* find out now, not after the training, that the output cannot be written */
    char path[1024];
    snprintf(path, sizeof path, "%s/model.bin.tmp", o->out_dir);
    FILE *probe = mkdir(o->out_dir, 0755) == 0 || errno == EEXIST ? fopen(path, "wb") : NULL;
    if (!probe) { fprintf(stderr, "error: cannot write into %s: %s\n", o->out_dir, strerror(errno)); return -1; }
    fclose(probe);
    remove(path);
    Model m;
    if (model_init_random(&m, DEFAULT_CONFIG, 1, 1, 0.0f) != 0) return -1;
    init_weights(&m, o->seed * 2 + 1);
    fprintf(stderr, "pretraining %zu parameters: dim %d, hidden %d, %d layers, %d/%d heads, context %d\n",
            m.n_params, m.config.dim, m.config.hidden_dim, m.config.n_layers, m.config.n_heads,
            m.config.n_kv_heads, m.config.seq_len);
    Worker workers[N_WORKERS];
    workers_alloc(workers, &m, o);
    float *adam_m = xmalloc(m.n_params * sizeof(float)), *adam_v = xmalloc(m.n_params * sizeof(float));
    double t0 = now_seconds(), smooth = 0, tokens_seen = 0;
    int rc = 0;
    for (int step = 0; step < o->steps && rc == 0; step++) {
        /* copy curriculum: many "Repeat:" samples early, fewer later */
        float p_copy = o->p_copy_start + (o->p_copy_end - o->p_copy_start) * ((float)step / o->steps);
        run_workers(workers, step, p_copy, o->batch);
        double loss, norm = combine_gradients(workers, m.n_params, &loss);
        float lr = pretrain_lr(o, step);
        /* Adam (no weight decay), beta2 0.95 as is usual for pretraining */
        adamw_update(m.params, workers[0].dparams, adam_m, adam_v, m.n_params, step + 1, lr, 0.0f, 0.95f);
        if (!isfinite(loss) || !isfinite(norm)) {  /* a NaN norm would pass the clipping unseen */
            fprintf(stderr, "\nerror: pretraining diverged at step %d (loss %g, gradient norm %g); lower --lr (%g)\n",
                    step + 1, loss, norm, o->lr);
            rc = -1;
            break;
        }
        smooth = step ? 0.98 * smooth + 0.02 * loss : loss;
        for (int k = 0; k < N_WORKERS; k++) tokens_seen += workers[k].tokens_done;
        double el = now_seconds() - t0;
        if (step % 20 == 0 || step + 1 == o->steps)
            fprintf(stderr, "\rstep %d/%d  loss %.4f  lr %.2e  |g| %.2f  copy %.2f  %.0f tok/s  %.0fs  ETA %.0fs   ",
                    step + 1, o->steps, smooth, lr, norm, p_copy, tokens_seen / el, el,
                    el / (step + 1) * (o->steps - step - 1));
    }
    if (rc == 0) {
        fprintf(stderr, "\npretraining took %.1f minutes\n", (now_seconds() - t0) / 60);
        model_refresh(&m);
        rc = write_outputs(o, &m);
    }
    workers_free(workers);
    free(adam_m); free(adam_v);
    model_free(&m);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Does the model read its document?                                        */

/* Teacher-forced top-1 over the answer bytes of a task, after the document
 * (doc_len > 0) or alone: adds the count of correct answer bytes and of
 * answer bytes, returns 1 if all are correct (then greedy decoding writes
 * the whole answer), 0 if not, -1 if the model cannot run the tokens. */
static int score_answer(const Model *m, RunState *s, const char *doc, int doc_len, const char *task, int len,
                        int answer_start, long *correct, long *total) {
    int V = m->config.vocab_size, all = 1, *tokens = xmalloc((doc_len + len + 3) * sizeof(int));
    float *answer = xmalloc((doc_len + len + 3) * sizeof(float)), *flags = xmalloc(len * sizeof(float));
    for (int i = 0; i < len; i++) flags[i] = i >= answer_start;
    int n = to_tokens(doc, doc_len, task, len, NULL, flags, tokens, answer) - 1;
    if (forward(m, s, &NO_DOCUMENT, tokens, n, 0, LOGITS_ALL) != 0) all = -1;
    for (int t = 0; t < n && all >= 0; t++) {
        /* answer bytes only: the inserted spaces carry CORPUS_PROMPT_WEIGHT */
        if (answer[t] != 1.0f) continue;
        int ok = argmax(s->logits + (size_t)t * V, V) == tokens[t + 1];
        *correct += ok;
        (*total)++;
        all &= ok;
    }
    free(tokens); free(answer); free(flags);
    return all;
}

static int evaluate_reading(const Options *o) {
    char path[1024];
    snprintf(path, sizeof path, "%s/model.bin", o->eval_dir);
    Model m;
    if (model_load(&m, path) != 0) return -1;
    int T = m.config.seq_len;
    /* BOS, ' ', the longest document, ' ', '\n', the longest task */
    if (m.config.vocab_size < 259 || T < CORPUS_DOC_MAX + CORPUS_TASK_MAX + 4) {
        fprintf(stderr, "error: %s is not a byte-level model of this project (vocab %d, context %d; "
                "--eval needs vocab >= 259 and context >= %d)\n", path, m.config.vocab_size, T,
                CORPUS_DOC_MAX + CORPUS_TASK_MAX + 4);
        model_free(&m);
        return -1;
    }
    RunState s;
    runstate_alloc(&s, &m, &NO_DOCUMENT, T, T);
    static const char *kinds[3] = {"quote", "continue", "question"};
    long correct[3][2] = {{0}}, total[3][2] = {{0}}, exact[3][2] = {{0}}, tasks[3] = {0};
    char doc[512], task[256], text[1024];
    double t0 = now_seconds();
    for (int i = 1; i <= o->eval_docs; i++) {  /* held-out document 0 is the demo's */
        uint64_t rng = heldout_rng(o->seed, i);
        int n = corpus_document(&rng, doc, sizeof doc);
        for (int kind = 0; kind < 3; kind++) {
            int answer, len = corpus_task(&rng, doc, n, kind, task, sizeof task, &answer);
            if (len < 0) continue;
            tasks[kind]++;
            /* "\n" task, after the document and alone */
            text[0] = '\n';
            memcpy(text + 1, task, len);
            int with_doc = score_answer(&m, &s, doc, n, text, len + 1, answer + 1, &correct[kind][0], &total[kind][0]);
            int without = score_answer(&m, &s, NULL, 0, text, len + 1, answer + 1, &correct[kind][1], &total[kind][1]);
            if (with_doc < 0 || without < 0) { runstate_free(&s); model_free(&m); return -1; }
            exact[kind][0] += with_doc;
            exact[kind][1] += without;
        }
        if (i % 20 == 0 || i == o->eval_docs) {
            double el = now_seconds() - t0;
            fprintf(stderr, "\rdocuments %d/%d  %.0fs  ETA %.0fs   ", i, o->eval_docs, el, el / i * (o->eval_docs - i));
        }
    }
    fprintf(stderr, "\n");
    printf("reading held-out documents (%d documents, never seen in training); teacher-forced top-1\n", o->eval_docs);
    printf("  %-10s %7s   %-24s %-24s\n", "task", "tasks", "with the document", "without the document");
    printf("  %-10s %7s   %-11s %-12s %-11s %-12s\n", "", "", "answer bytes", "whole answer", "answer bytes", "whole answer");
    for (int k = 0; k < 3; k++)
        printf("  %-10s %7ld   %-11.3f  %-12.3f %-11.3f  %-12.3f\n", kinds[k], tasks[k],
               (double)correct[k][0] / total[k][0], (double)exact[k][0] / tasks[k],
               (double)correct[k][1] / total[k][1], (double)exact[k][1] / tasks[k]);
    runstate_free(&s);
    model_free(&m);
    return 0;
}

int main(int argc, char **argv) {
    Options o = {.steps = 6000, .batch = 16, .lr = 2e-3f, .p_copy_start = 0.6f, .p_copy_end = 0.25f,
                 .eval_docs = 200, .seed = 1};
    SeenOptions seen = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (option_once(&seen, a) != 0) return 1;
        if (i + 1 >= argc) { report_last_option(a, VALUE_OPTIONS); return 1; }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "-o")) o.out_dir = v;
        else if (!strcmp(a, "--eval")) o.eval_dir = v;
        else if (!strcmp(a, "--write-doc")) o.write_doc_dir = v;
        else if (!strcmp(a, "--doc-index")) bad = parse_int_option(a, v, &o.doc_index);
        else if (!strcmp(a, "--steps")) bad = parse_int_option(a, v, &o.steps);
        else if (!strcmp(a, "--batch")) bad = parse_int_option(a, v, &o.batch);
        else if (!strcmp(a, "--docs")) bad = parse_int_option(a, v, &o.eval_docs);
        else if (!strcmp(a, "--lr")) bad = parse_float_option(a, v, &o.lr);
        else if (!strcmp(a, "--copy-start")) bad = parse_float_option(a, v, &o.p_copy_start);
        else if (!strcmp(a, "--copy-end")) bad = parse_float_option(a, v, &o.p_copy_end);
        else if (!strcmp(a, "-s")) bad = parse_seed_option(a, v, &o.seed);
        else { fprintf(stderr, "error: unknown option '%s' (see --help)\n", a); return 1; }
        if (bad) return 1;
    }
    if (!!o.out_dir + !!o.eval_dir + !!o.write_doc_dir != 1) {
        fprintf(stderr, "error: give one of -o DIR (train), --eval DIR (measure) or --write-doc DIR\n");
        return 1;
    }
    if (o.doc_index < 0 || (o.doc_index > 0 && !o.write_doc_dir)) {
        fprintf(stderr, "error: --doc-index must be >= 0, and goes with --write-doc\n");
        return 1;
    }
    if (o.write_doc_dir) return write_held_out_document(&o) == 0 ? 0 : 1;
    if (o.steps < 1 || o.batch < N_WORKERS || o.batch > MAX_BATCH || !(o.lr > 0) || o.eval_docs < 1 ||
        o.p_copy_start < 0 || o.p_copy_start > 1 || o.p_copy_end < 0 || o.p_copy_end > 1) {
        fprintf(stderr, "error: need --steps >= 1, --batch in %d..%d, --lr > 0, --docs >= 1, --copy-start and "
                "--copy-end in [0, 1]\n", N_WORKERS, MAX_BATCH);
        return 1;
    }
    return (o.eval_dir ? evaluate_reading(&o) : pretrain(&o)) == 0 ? 0 : 1;
}
