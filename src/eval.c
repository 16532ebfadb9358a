/* eval.c - the held-out metrics of a module set against the full cache and
 * no document, generations many at a time, the answers a user sees, and
 * sampling. Above the core: it runs the method's forward passes and
 * reports progress on the command line.
 */
#include "eval.h"
#include "cli.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* A progress line with an ETA for a long loop, shown once it has run 2 s
 * (a short one, as in the tests, stays quiet). */
typedef struct { const char *what; int total, done, shown; double t0; } EvalProgress;

static EvalProgress eval_progress_start(const char *what, int total) {
    return (EvalProgress){what, total, 0, 0, now_seconds()};
}

static void eval_progress_step(EvalProgress *p) {
    p->done++;
    if (now_seconds() - p->t0 < 2) return;
    print_progress(p->what, p->done, p->total, p->t0);
    p->shown = 1;
}

static void eval_progress_end(const EvalProgress *p) {
    if (p->shown) fputc('\n', stderr);
}

/* What an evaluation sums over prompts: next-token counts and KLs, and
 * the modules' errors. */
typedef struct {
    long positions, hits_full, hits_nectar, hits_nodoc, agree, agree_nodoc;
    double kl, kl_nodoc;
    /* over prompts (a split's, added by sums_add_prompt): their count and the
     * sums of x^2, y^2 and x y for x a prompt's positions and y its KL or
     * agreement count, for the intervals of the ratios sum y / sum x */
    long prompts;
    double x2, kl2, kl_x, agree2, agree_x;
    double *score_se, *target_se; /* (L) sums of (a - alpha)^2 and ||A_theta - A||^2 */
    double *rte_sum;            /* (L, H) sums of log(||A_theta - A||^2 / ||q - A||^2) */
    long *layer_samples;        /* (L) module evaluations per layer */
} Sums;

static void sums_clear(Sums *s, int L, int H) {
    s->positions = s->hits_full = s->hits_nectar = s->hits_nodoc = s->agree = s->agree_nodoc = s->prompts = 0;
    s->kl = s->kl_nodoc = s->x2 = s->kl2 = s->kl_x = s->agree2 = s->agree_x = 0;
    memset(s->score_se, 0, L * sizeof(double));
    memset(s->target_se, 0, L * sizeof(double));
    memset(s->rte_sum, 0, (size_t)L * H * sizeof(double));
    memset(s->layer_samples, 0, L * sizeof(long));
}

static void sums_alloc(Sums *s, int L, int H) {
    memset(s, 0, sizeof(*s));
    s->score_se = xmalloc(L * sizeof(double));
    s->target_se = xmalloc(L * sizeof(double));
    s->rte_sum = xmalloc((size_t)L * H * sizeof(double));
    s->layer_samples = xmalloc(L * sizeof(long));  /* xmalloc zeroes */
}

static void sums_free(Sums *s) { free(s->score_se); free(s->target_se); free(s->rte_sum); free(s->layer_samples); }

static void sums_add(Sums *to, const Sums *from, int L, int H) {
    to->positions += from->positions; to->hits_full += from->hits_full; to->hits_nectar += from->hits_nectar;
    to->hits_nodoc += from->hits_nodoc; to->agree += from->agree; to->agree_nodoc += from->agree_nodoc;
    to->kl += from->kl; to->kl_nodoc += from->kl_nodoc;
    for (int l = 0; l < L; l++) {
        to->score_se[l] += from->score_se[l]; to->target_se[l] += from->target_se[l];
        to->layer_samples[l] += from->layer_samples[l];
        for (int h = 0; h < H; h++) to->rte_sum[l * H + h] += from->rte_sum[l * H + h];
    }
}

/* A prompt's sums into its split's, with the moments its intervals need. */
static void sums_add_prompt(Sums *split, const Sums *prompt, int L, int H) {
    sums_add(split, prompt, L, H);
    double x = prompt->positions, kl = prompt->kl, agree = prompt->agree;
    split->prompts++;
    split->x2 += x * x;
    split->kl2 += kl * kl; split->kl_x += kl * x;
    split->agree2 += agree * agree; split->agree_x += agree * x;
}

/* The 95% interval of the ratio R = sum y / sum x over n prompts, each a
 * cluster of positions: R +- 1.96 SE, SE^2 = n / (n - 1) sum (y - R x)^2 /
 * (sum x)^2, from sum y^2, sum x y and sum x^2; NaN for n < 2. */
static void ratio_interval(double R, double sum_x, long n, double y2, double xy, double x2, double ci[2]) {
    if (n < 2) { ci[0] = ci[1] = NAN; return; }
    double spread = y2 - 2 * R * xy + R * R * x2, se = sqrt(fmax(spread, 0) * n / (n - 1)) / sum_x;
    ci[0] = R - 1.959963984540054 * se;
    ci[1] = R + 1.959963984540054 * se;
}

/* The three models of an evaluation, their scratch, one prompt's sums, and
 * the sums of each split (EVAL_*). */
typedef struct {
    const Document *full, *nectar;
    const ModuleSet *fit;       /* the modules whose fit is measured (module_fit), or NULL */
    RunState sf, sn, s0;        /* full cache (with taps), Nectar, no document */
    ModuleWork work;
    int max_len;
    int *nodoc_input;           /* (n_nodoc_prefix + max_len) a prompt after the no-document prefix */
    float *q, *a, *A;           /* (max_len group, d), (max_len group), (max_len group, d) */
    double *lp_full, *lp_other; /* (V) log-probabilities */
    Sums prompt, split[EVAL_SPLITS];
} Evaluation;

/* Whether prompt i of p counts in split k (EVAL_*). */
static int in_split(const PromptSet *p, int i, int k) {
    if (k == EVAL_RANDOM) return p->split[i] != SPLIT_TASKS;
    return p->split[i] == (k == EVAL_CHALLENGE ? SPLIT_CHALLENGE : SPLIT_TASKS);
}

/* The modules whose fit to the exact document state can be measured: those
 * of nectar when it is one document read by them and full the same
 * document read from its KV cache; else NULL (a composition: the taps hold
 * the merged state of all its documents). */
static const ModuleSet *module_fit(const Document *full, const Document *nectar) {
    int single = !full->next && !nectar->next && full->mode == DOC_EXACT && full->cache && nectar->mode == DOC_NECTAR;
    return single ? nectar->modules : NULL;
}

/* measure_fit: the module fit too (module_fit), with the taps it reads. */
static void evaluation_start(Evaluation *e, const Model *m, const Document *full, const Document *nectar,
                             const PromptSet *prompts, int max_len, int measure_fit) {
    const Config *c = &m->config;
    int L = c->n_layers, H = c->n_heads, d = c->dim / H, group = H / c->n_kv_heads, V = c->vocab_size;
    memset(e, 0, sizeof(*e));
    e->full = full;
    e->nectar = nectar;
    e->fit = measure_fit ? module_fit(full, nectar) : NULL;
    e->max_len = max_len;
    runstate_alloc(&e->sf, m, full, max_len, max_len);
    if (e->fit) runstate_enable_taps(&e->sf, m);
    runstate_alloc(&e->sn, m, nectar, max_len, max_len);
    int nodoc_len = prompts->n_nodoc_prefix + max_len;
    runstate_alloc(&e->s0, m, &NO_DOCUMENT, nodoc_len, nodoc_len);
    if (e->fit) modulework_alloc(&e->work, e->fit, max_len * group);
    e->nodoc_input = xmalloc(nodoc_len * sizeof(int));
    e->a = xmalloc((size_t)max_len * group * sizeof(float));
    e->A = xmalloc((size_t)max_len * group * d * sizeof(float));
    e->q = xmalloc((size_t)max_len * group * d * sizeof(float));
    e->lp_full = xmalloc(V * sizeof(double));
    e->lp_other = xmalloc(V * sizeof(double));
    sums_alloc(&e->prompt, L, H);
    for (int k = 0; k < EVAL_SPLITS; k++) sums_alloc(&e->split[k], L, H);
}

static void evaluation_free(Evaluation *e) {
    free(e->nodoc_input); free(e->a); free(e->A); free(e->q); free(e->lp_full); free(e->lp_other);
    sums_free(&e->prompt);
    for (int k = 0; k < EVAL_SPLITS; k++) sums_free(&e->split[k]);
    modulework_free(&e->work);
    runstate_free(&e->sf); runstate_free(&e->sn); runstate_free(&e->s0);
}

/* Without the document a prompt starts a sequence: the set's no-document
 * prefix (BOS, or the chat turn's opening) goes first, unless the prompt
 * starts with it. The prompt after it into out; returns the prefix's length. */
static int after_nodoc_prefix(const PromptSet *p, const int *prompt, int len, int *out) {
    int k = p->n_nodoc_prefix;
    if (k > 0 && len >= k && !memcmp(prompt, p->nodoc_prefix, k * sizeof(int))) k = 0;
    if (k > 0) memcpy(out, p->nodoc_prefix, k * sizeof(int));
    memcpy(out + k, prompt, len * sizeof(int));
    return k;
}

/* One prompt through the full-cache, Nectar and no-document models, every
 * position's logits kept; returns the no-document prefix's length put
 * before it (the no-document logits of position t are at t + that), or -1. */
static int forward_three(Evaluation *e, const Model *m, const PromptSet *p, const int *prompt, int len) {
    int prefix = after_nodoc_prefix(p, prompt, len, e->nodoc_input);
    if (forward(m, &e->sf, e->full, prompt, len, 0, LOGITS_ALL) != 0 ||
        forward(m, &e->sn, e->nectar, prompt, len, 0, LOGITS_ALL) != 0 ||
        forward(m, &e->s0, &NO_DOCUMENT, e->nodoc_input, prefix + len, 0, LOGITS_ALL) != 0) return -1;
    return prefix;
}

/* Position t's next-token predictions (after forward_three) against the
 * true next token and against the full cache's, into r. */
static void count_position(Evaluation *e, int V, const int *prompt, int t, int prefix, Sums *r) {
    const float *lf = e->sf.logits + (size_t)t * V, *ln = e->sn.logits + (size_t)t * V;
    const float *l0 = e->s0.logits + (size_t)(t + prefix) * V;
    int top_full = argmax(lf, V), top_nectar = argmax(ln, V), top_nodoc = argmax(l0, V);
    int truth = prompt[t + 1];
    r->hits_full += top_full == truth;
    r->hits_nectar += top_nectar == truth;
    r->hits_nodoc += top_nodoc == truth;
    r->agree += top_nectar == top_full;
    r->agree_nodoc += top_nodoc == top_full;
    log_softmax(lf, V, e->lp_full);
    log_softmax(ln, V, e->lp_other);
    r->kl += kl_divergence(e->lp_full, e->lp_other, V);
    log_softmax(l0, V, e->lp_other);
    r->kl_nodoc += kl_divergence(e->lp_full, e->lp_other, V);
    r->positions++;
}

/* One prompt's next-token predictions at positions 0 .. len-2 into e->prompt. */
static int count_next_tokens(Evaluation *e, const Model *m, const PromptSet *p, const int *prompt, int len) {
    int prefix = forward_three(e, m, p, prompt, len);
    if (prefix < 0) return -1;
    for (int t = 0; t + 1 < len; t++) count_position(e, m->config.vocab_size, prompt, t, prefix, &e->prompt);
    return 0;
}

/* The modules on the queries the full-cache model just saw (its taps),
 * against the exact document state at each of the len positions, into
 * e->prompt (nothing where there is no fit to measure: e->fit NULL). */
static void count_module_fit(Evaluation *e, const Model *m, int len) {
    const ModuleSet *ms = e->fit;
    if (!ms) return;
    Sums *r = &e->prompt;
    const Config *c = &m->config;
    int L = c->n_layers, H = c->n_heads, G = c->n_kv_heads, D = c->dim, d = D / H, group = H / G;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < G; g++) {
            const float *tq = e->sf.taps.q + (size_t)l * e->max_len * D;
            const float *tA = e->sf.taps.doc_A + (size_t)l * e->max_len * D;
            const float *tlse = e->sf.taps.doc_lse + (size_t)l * e->max_len * H;
            copy_rows(e->q, group * d, tq + g * group * d, D, len, group * d);
            module_forward(ms, &ms->modules[l * G + g], &e->work, e->q, len * group, e->a, e->A);
            for (int t = 0; t < len; t++)
                for (int j = 0; j < group; j++) {
                    int h = g * group + j;
                    size_t row = (size_t)t * group + j;
                    const float *Aref = tA + (size_t)t * D + h * d, *qh = e->q + row * d;
                    double da = e->a[row] - tlse[(size_t)t * H + h], err = 0, base = 0;
                    for (int k = 0; k < d; k++) {
                        double diff = e->A[row * d + k] - Aref[k], b = qh[k] - Aref[k];
                        err += diff * diff;
                        base += b * b;
                    }
                    r->score_se[l] += da * da;
                    r->target_se[l] += err;
                    /* log(||A_theta - A||^2 / ||q - A||^2), guarded against log 0 */
                    r->rte_sum[l * H + h] += log((err + 1e-30) / (base + 1e-30));
                    r->layer_samples[l]++;
                }
        }
}

/* A split's sums into its means; RTE as exp of the mean over (layer,
 * query head) groups of their mean log ratio. */
static void evaluation_means(const Sums *e, int L, int H, EvalResult *r) {
    r->n_positions = (int)e->positions;
    if (r->n_positions == 0) return;
    double n = r->n_positions;
    r->acc_full = e->hits_full / n; r->acc_nectar = e->hits_nectar / n; r->acc_nodoc = e->hits_nodoc / n;
    r->agree = e->agree / n; r->agree_nodoc = e->agree_nodoc / n;
    r->kl = e->kl / n; r->kl_nodoc = e->kl_nodoc / n;
    ratio_interval(r->kl, n, e->prompts, e->kl2, e->kl_x, e->x2, r->kl_ci);
    ratio_interval(r->agree, n, e->prompts, e->agree2, e->agree_x, e->x2, r->agree_ci);
    long total = 0;
    double log_rte = 0;
    for (int l = 0; l < L; l++) total += e->layer_samples[l];
    if (total == 0) {  /* no module fit measured (a composition) */
        r->score_mse = r->target_mse = r->rte = NAN;
        for (int l = 0; l < L; l++) r->score_mse_layer[l] = r->target_mse_layer[l] = NAN;
        return;
    }
    for (int l = 0; l < L; l++) {
        r->score_mse += e->score_se[l];
        r->target_mse += e->target_se[l];
        r->score_mse_layer[l] = e->score_se[l] / e->layer_samples[l];
        r->target_mse_layer[l] = e->target_se[l] / e->layer_samples[l];
        /* each (layer, head) has layer_samples[l] / H queries */
        for (int h = 0; h < H; h++) log_rte += e->rte_sum[l * H + h] / (e->layer_samples[l] / H);
    }
    r->score_mse /= total;
    r->target_mse /= total;
    r->rte = exp(log_rte / (L * H));
    r->n_queries = total;
}

/* The tokens before a prompt: the documents', or without them the
 * no-document prefix. */
static int tokens_before(const Document *full, const PromptSet *p) {
    int n = document_length(full);
    return n > p->n_nodoc_prefix ? n : p->n_nodoc_prefix;
}

/* What evaluate checks first: Nectar's documents stand for as many tokens
 * as the full cache's, the documents (or the no-document prefix) and the
 * longest prompt fit the context, the prefix's and the prompts' ids the
 * vocabulary. 0, or -1 after a sentence. */
static int evaluation_check(const Model *m, const Document *full, const Document *nectar, const PromptSet *prompts,
                            int max_len) {
    const Config *c = &m->config;
    int K = prompts->n_nodoc_prefix, n = document_length(full);
    if (document_length(nectar) != n) {
        fprintf(stderr, "error: the modules stand for documents of %d tokens, not %d\n", document_length(nectar), n);
        return -1;
    }
    if (tokens_before(full, prompts) + max_len > c->seq_len) {
        fprintf(stderr, "error: the document (%d tokens; without it, the prompts' prefix of %d) plus the longest "
                "prompt (%d) exceed the context of %d\n", n, K, max_len, c->seq_len);
        return -1;
    }
    if (check_tokens(m, prompts->nodoc_prefix, K, "no-document prefix") != 0) return -1;
    for (int i = 0; i < prompts->n_prompts; i++)
        if (check_tokens(m, prompts->tokens + prompts->offsets[i], prompts->offsets[i + 1] - prompts->offsets[i],
                         "evaluation prompt") != 0) return -1;
    return 0;
}

static int evaluate_answers(const Model *m, const Document *full, const Document *nectar, const PromptSet *prompts,
                            EvalResult split[EVAL_SPLITS]);  /* below, after the rollouts */

int evaluate(const Model *m, const Document *full, const Document *nectar, const PromptSet *prompts,
             EvalResult split[EVAL_SPLITS]) {
    int L = m->config.n_layers, H = m->config.n_heads;
    for (int k = 0; k < EVAL_SPLITS; k++) {
        memset(&split[k], 0, sizeof(EvalResult));
        split[k].score_mse_layer = xmalloc(L * sizeof(double));
        split[k].target_mse_layer = xmalloc(L * sizeof(double));
    }
    int max_len = promptset_max_len(prompts), rc = evaluation_check(m, full, nectar, prompts, max_len);
    if (rc == 0) {
        Evaluation e;
        evaluation_start(&e, m, full, nectar, prompts, max_len, 1);
        EvalProgress progress = eval_progress_start("evaluation: prompts", prompts->n_prompts);
        for (int i = 0; i < prompts->n_prompts && rc == 0; i++) {
            int len = prompts->offsets[i + 1] - prompts->offsets[i];
            sums_clear(&e.prompt, L, H);
            rc = count_next_tokens(&e, m, prompts, prompts->tokens + prompts->offsets[i], len);
            if (rc == 0) count_module_fit(&e, m, len);
            for (int k = 0; k < EVAL_SPLITS && rc == 0; k++)
                if (in_split(prompts, i, k)) {
                    sums_add_prompt(&e.split[k], &e.prompt, L, H);
                    split[k].n_prompts++;
                }
            eval_progress_step(&progress);
        }
        eval_progress_end(&progress);
        for (int k = 0; k < EVAL_SPLITS && rc == 0; k++) evaluation_means(&e.split[k], L, H, &split[k]);
        evaluation_free(&e);
    }
    /* the challenge split's sums are parts of the random split's: a term that
     * is not finite makes every sum it is in so */
    for (int k = EVAL_RANDOM; k <= EVAL_TASKS && rc == 0; k += EVAL_TASKS - EVAL_RANDOM) {
        const EvalResult *r = &split[k];
        int fit_finite = r->n_queries == 0 || (isfinite(r->score_mse) && isfinite(r->target_mse) && isfinite(r->rte));
        if (r->n_positions == 0 || (isfinite(r->kl) && fit_finite)) continue;
        fprintf(stderr, "error: the modules' outputs on the held-out prompts are not finite (KL %g, score MSE %g, "
                "target MSE %g): they diverged in fitting or are corrupt\n", r->kl, r->score_mse, r->target_mse);
        rc = -1;
    }
    if (rc == 0) rc = evaluate_answers(m, full, nectar, prompts, split);
    if (rc != 0) for (int k = 0; k < EVAL_SPLITS; k++) evalresult_free(&split[k]);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Answers: greedy rollouts after each question                            */

/* The next token of rollout r from logits row `row` (argmax, or drawn by
 * the sampler): appended; 1 when the rollout goes on (no stop token, below
 * its cap). */
static int rollout_next(const Model *m, const RunState *s, int row, const int stop[2], Sampler *sampler,
                        Rollout *r) {
    const float *logits = s->logits + (size_t)row * m->config.vocab_size;
    int next = sampler ? sample(sampler, logits, m->config.vocab_size) : argmax(logits, m->config.vocab_size);
    r->answer[r->len++] = next;
    return next != stop[0] && next != stop[1] && r->len < r->cap;
}

/* The questions of the rollouts `idx` (count) in blocks of at most
 * s->max_block rows, rollout idx[j] in sequence j, and each one's first
 * token; live[j] says whether it goes on. */
static int rollouts_prefill(const Model *m, RunState *s, const Document *doc, const int stop[2], Sampler *sampler,
                            Rollout *r, const int *idx, int count, Segment *seg, unsigned char *live) {
    for (int j = 0; j < count;) {
        int in_block = 0, rows = 0;
        for (; j + in_block < count && rows + r[idx[j + in_block]].n_question <= s->max_block; in_block++) {
            const Rollout *q = &r[idx[j + in_block]];
            seg[in_block] = (Segment){q->question, q->n_question, j + in_block, 0};
            rows += q->n_question;
        }
        if (in_block == 0) {
            fprintf(stderr, "error: a question of %d tokens does not fit a block of %d\n", r[idx[j]].n_question,
                    s->max_block);
            return -1;
        }
        if (forward_segments(m, s, doc, seg, in_block, LOGITS_LAST) != 0) return -1;
        for (int k = 0; k < in_block; k++) live[j + k] = rollout_next(m, s, k, stop, sampler, &r[idx[j + k]]);
        j += in_block;
    }
    return 0;
}

int rollouts(const Model *m, RunState *s, const Document *doc, const int stop[2], Sampler *sampler, Rollout *r,
             int n) {
    int *idx = xmalloc((n + 1) * sizeof(int)), count = 0;   /* (n) the rollouts with a question and room */
    for (int k = 0; k < n; k++) {
        r[k].len = 0;
        if (r[k].n_question >= 1 && r[k].cap >= 1) idx[count++] = k;
    }
    if (count > s->n_seqs) {
        fprintf(stderr, "error: %d rollouts need as many sequences; the run state has %d\n", count, s->n_seqs);
        free(idx);
        return -1;
    }
    Segment *seg = xmalloc((count + 1) * sizeof(Segment));  /* (count) */
    unsigned char *live = xmalloc(count + 1);               /* (count) 1: rollout idx[j] goes on */
    int *step = xmalloc((count + 1) * sizeof(int));         /* (count) the live ones in a decode step */
    int rc = rollouts_prefill(m, s, doc, stop, sampler, r, idx, count, seg, live);
    while (rc == 0) {  /* one decode step of every live rollout (up to a block of them), as one block */
        int in_step = 0;
        for (int j = 0; j < count && in_step < s->max_block; j++)
            if (live[j]) {
                Rollout *q = &r[idx[j]];
                seg[in_step] = (Segment){&q->answer[q->len - 1], 1, j, q->n_question + q->len - 1};
                step[in_step++] = j;
            }
        if (in_step == 0) break;
        rc = forward_segments(m, s, doc, seg, in_step, LOGITS_LAST);
        for (int k = 0; k < in_step && rc == 0; k++)
            live[step[k]] = rollout_next(m, s, k, stop, sampler, &r[idx[step[k]]]);
    }
    free(idx); free(seg); free(live); free(step);
    return rc;
}

/* The prompts from *next on that fit one batch (SCORE_ROWS tokens, each
 * after the no-document prefix when there is no document), as segments of
 * their own sequences into seg, their tokens into buf; *next moves past
 * them. Returns the count. */
static int score_batch(const PromptSet *p, int nodoc, int *next, int *buf, Segment *seg) {
    int n = 0, used = 0;
    while (*next < p->n_prompts && n < SCORE_SEQS) {
        int i = *next, len = p->offsets[i + 1] - p->offsets[i];
        if (n > 0 && used + len + (nodoc ? p->n_nodoc_prefix : 0) > SCORE_ROWS) break;
        const int *prompt = p->tokens + p->offsets[i];
        int k = 0;
        if (nodoc) k = after_nodoc_prefix(p, prompt, len, buf + used);
        else memcpy(buf + used, prompt, len * sizeof(int));
        seg[n] = (Segment){buf + used, k + len, n, 0};
        used += k + len;
        n++;
        (*next)++;
    }
    return n;
}

int answer_loglik(const Model *m, const Document *doc, const PromptSet *p, const char *what, double *sum) {
    int V = m->config.vocab_size, nodoc = doc == NULL, extra = nodoc ? p->n_nodoc_prefix : 0;
    int longest = promptset_max_len(p) + extra, rows = longest > SCORE_ROWS ? longest : SCORE_ROWS;
    const Document *run = nodoc ? &NO_DOCUMENT : doc;
    RunState s;
    runstate_alloc_seqs(&s, m, run, rows, longest, SCORE_SEQS);
    int *buf = xmalloc(rows * sizeof(int)), rc = 0;
    double *lp = xmalloc(V * sizeof(double));
    Segment seg[SCORE_SEQS];
    EvalProgress progress = eval_progress_start(what, p->n_prompts);
    for (int next = 0, first = 0; next < p->n_prompts && rc == 0; first = next) {
        int n = score_batch(p, nodoc, &next, buf, seg);
        if ((rc = forward_segments(m, &s, run, seg, n, LOGITS_ALL)) != 0) break;
        for (int k = 0, row = 0; k < n; row += seg[k].ntok, k++) {
            int i = first + k, start = seg[k].ntok - (p->offsets[i + 1] - p->offsets[i]) + p->question_len[i];
            sum[i] = 0;
            /* log p(token t | tokens before it) = log_softmax(logits of row t - 1)[token t] */
            for (int t = start; t < seg[k].ntok; t++) {
                log_softmax(s.logits + (size_t)(row + t - 1) * V, V, lp);
                sum[i] += lp[seg[k].tokens[t]];
            }
            eval_progress_step(&progress);
        }
    }
    eval_progress_end(&progress);
    free(buf); free(lp);
    runstate_free(&s);
    return rc;
}

void wilson_interval(int k, int n, double *lo, double *hi) {
    /* (p + z^2 / 2n +- z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n), z = 1.96 */
    double z = 1.959963984540054, p = (double)k / n, z2n = z * z / n;
    double center = (p + z2n / 2) / (1 + z2n), half = z * sqrt(p * (1 - p) / n + z2n / (4.0 * n)) / (1 + z2n);
    *lo = center - half < 0 ? 0 : center - half;
    *hi = center + half > 1 ? 1 : center + half;
}

double answer_prefix_fraction(const int *ref, int n_ref, const int *got, int n_got) {
    int k = 0;
    while (k < n_ref && k < n_got && ref[k] == got[k]) k++;
    return n_ref > 0 ? (double)k / n_ref : 1.0;
}

int answer_in_loop(const int *tokens, int n) {
    for (int i = 0; i + REPEAT_GRAM <= n; i++) {
        int times = 1;  /* the run at i, its first occurrence, and the later ones */
        for (int j = i + 1; j + REPEAT_GRAM <= n && times < REPEAT_TIMES; j++)
            times += !memcmp(tokens + i, tokens + j, REPEAT_GRAM * sizeof(int));
        if (times >= REPEAT_TIMES) return 1;
    }
    return 0;
}

/* The prompts with a question part (none when answers may have no token):
 * their count, and the longest question. */
static int answer_prompts(const PromptSet *p, int *max_question) {
    int count = 0;
    *max_question = 1;
    for (int i = 0; p->question_len && p->answer_cap > 0 && i < p->n_prompts; i++) {
        if (p->question_len[i] == 0) continue;
        count++;
        if (p->question_len[i] > *max_question) *max_question = p->question_len[i];
    }
    return count;
}

/* Run k's answers (0 full cache, 1 Nectar, 2 no document) to the prompts
 * r->answer_prompt, ROLLOUT_BATCH at a time; the no-document model reads
 * each question after the set's prefix (nodoc_input: (n_answers, stride)). */
enum { ROLLOUT_BATCH = 16 };
static int answer_run(const Model *m, const Document *run, int k, const PromptSet *p, const int *nodoc_input,
                      int stride, int max_question, int cap, EvalResult *r, EvalProgress *progress) {
    RunState s;
    int block = max_question > ROLLOUT_BATCH ? max_question : ROLLOUT_BATCH, rc = 0;
    runstate_alloc_seqs(&s, m, run, block, max_question + cap, ROLLOUT_BATCH);
    Rollout batch[ROLLOUT_BATCH];
    for (int first = 0; first < r->n_answers && rc == 0; first += ROLLOUT_BATCH) {
        int n = r->n_answers - first < ROLLOUT_BATCH ? r->n_answers - first : ROLLOUT_BATCH;
        for (int j = 0; j < n; j++) {
            int a = first + j, i = r->answer_prompt[a], nq = p->question_len[i];
            const int *nodoc = nodoc_input + (size_t)a * stride;  /* its length first, then the tokens */
            batch[j] = (Rollout){k == 2 ? nodoc + 1 : p->tokens + p->offsets[i], k == 2 ? nodoc[0] : nq, cap,
                                 r->answer_tokens + ((size_t)a * 3 + k) * r->answer_cap, 0};
        }
        rc = rollouts(m, &s, run, p->answer_stop, NULL, batch, n);
        eval_progress_step(progress);
        for (int j = 0; j < n && rc == 0; j++) r->answer_len[(size_t)(first + j) * 3 + k] = batch[j].len;
    }
    runstate_free(&s);
    return rc;
}

/* answer_match: equal token for token (so of equal length); answer_prefix:
 * the share of the full cache's answer before the first difference; an
 * answer ends when its last token is a stop (kept there by rollouts). */
static void answer_means(EvalResult *r, const int stop[2]) {
    double match = 0, match_nodoc = 0, prefix = 0;
    int ends[3] = {0}, loops[3] = {0}, both_end = 0;
    r->n_full_ends = 0;
    for (int a = 0; a < r->n_answers; a++) {
        const int *len = r->answer_len + (size_t)a * 3;
        const int *full = r->answer_tokens + (size_t)a * 3 * r->answer_cap;
        const int *nectar = full + r->answer_cap, *nodoc = full + 2 * r->answer_cap;
        match += len[1] == len[0] && !memcmp(nectar, full, len[0] * sizeof(int));
        match_nodoc += len[2] == len[0] && !memcmp(nodoc, full, len[0] * sizeof(int));
        prefix += answer_prefix_fraction(full, len[0], nectar, len[1]);
        int ended[3];
        for (int k = 0; k < 3; k++) {
            const int *answer = full + (size_t)k * r->answer_cap;
            ended[k] = len[k] > 0 && (answer[len[k] - 1] == stop[0] || answer[len[k] - 1] == stop[1]);
            ends[k] += ended[k];
            loops[k] += answer_in_loop(answer, len[k]);
        }
        r->n_full_ends += ended[0];
        both_end += ended[0] && ended[1];
    }
    if (r->n_answers == 0) return;
    r->answer_match = match / r->n_answers;
    wilson_interval((int)match, r->n_answers, &r->answer_match_ci[0], &r->answer_match_ci[1]);
    r->answer_match_nodoc = match_nodoc / r->n_answers;
    r->answer_prefix = prefix / r->n_answers;
    for (int k = 0; k < 3; k++) {
        r->answer_ends[k] = (double)ends[k] / r->n_answers;
        wilson_interval(ends[k], r->n_answers, &r->answer_ends_ci[k][0], &r->answer_ends_ci[k][1]);
        r->answer_repeats[k] = (double)loops[k] / r->n_answers;
        wilson_interval(loops[k], r->n_answers, &r->answer_repeats_ci[k][0], &r->answer_repeats_ci[k][1]);
    }
    r->nectar_ends_too = r->n_full_ends ? (double)both_end / r->n_full_ends : NAN;
    if (r->n_full_ends) wilson_interval(both_end, r->n_full_ends, &r->nectar_ends_too_ci[0], &r->nectar_ends_too_ci[1]);
    else r->nectar_ends_too_ci[0] = r->nectar_ends_too_ci[1] = NAN;
}

/* Split k's answers: those of `all` whose prompts are in it. */
static void split_answers(const PromptSet *p, const EvalResult *all, int k, EvalResult *r) {
    size_t per = (size_t)3 * all->answer_cap;  /* an answer's three rollouts */
    r->n_answers = 0;
    r->answer_cap = all->answer_cap;
    r->answer_prompt = xmalloc((all->n_answers + 1) * sizeof(int));
    r->answer_len = xmalloc(((size_t)all->n_answers * 3 + 1) * sizeof(int));
    r->answer_tokens = xmalloc((all->n_answers * per + 1) * sizeof(int));
    for (int a = 0; a < all->n_answers; a++) {
        if (!in_split(p, all->answer_prompt[a], k)) continue;
        int b = r->n_answers++;
        r->answer_prompt[b] = all->answer_prompt[a];
        memcpy(r->answer_len + (size_t)b * 3, all->answer_len + (size_t)a * 3, 3 * sizeof(int));
        memcpy(r->answer_tokens + b * per, all->answer_tokens + a * per, per * sizeof(int));
    }
    answer_means(r, p->answer_stop);
}

/* The full-cache, Nectar and no-document answers (rollouts, greedy; without
 * the document the question follows the set's nodoc_prefix) of the
 * r->n_answers prompts with a question part, each of at most `cap` tokens,
 * into r. */
static int answer_rollouts(const Model *m, const Document *full, const Document *nectar, const PromptSet *prompts,
                           int max_question, int cap, EvalResult *r) {
    int K = prompts->n_nodoc_prefix, stride = 1 + K + max_question, rc = 0;
    int *nodoc_input = xmalloc((size_t)r->n_answers * stride * sizeof(int));
    for (int i = 0, a = 0; i < prompts->n_prompts; i++) {
        if (prompts->question_len[i] == 0) continue;
        int *at = nodoc_input + (size_t)a * stride;  /* (1 + K + max_question): the length, then the tokens */
        at[0] = after_nodoc_prefix(prompts, prompts->tokens + prompts->offsets[i], prompts->question_len[i], at + 1) +
                prompts->question_len[i];
        r->answer_prompt[a++] = i;
    }
    const Document *runs[3] = {full, nectar, &NO_DOCUMENT};
    int batches = (r->n_answers + ROLLOUT_BATCH - 1) / ROLLOUT_BATCH;
    EvalProgress progress = eval_progress_start("evaluation: answer batches (full cache, Nectar, no document)",
                                                3 * batches);
    for (int k = 0; k < 3 && rc == 0; k++)
        rc = answer_run(m, runs[k], k, prompts, nodoc_input, stride, K + max_question, cap, r, &progress);
    eval_progress_end(&progress);
    free(nodoc_input);
    return rc;
}

/* The answer metrics of each split (n_answers, answer_match,
 * answer_match_nodoc, answer_prefix and the answers themselves): the
 * answers of every prompt with a question part, one cap for all (shortened
 * where the context ends), each split taking those of its prompts. */
static int evaluate_answers(const Model *m, const Document *full, const Document *nectar, const PromptSet *prompts,
                            EvalResult split[EVAL_SPLITS]) {
    EvalResult every = {0};
    int max_question;
    every.n_answers = answer_prompts(prompts, &max_question);
    /* the same cap for all three: where the context ends after the documents (or the prefix) */
    int room = m->config.seq_len - tokens_before(full, prompts) - max_question;
    int cap = prompts->answer_cap < room ? prompts->answer_cap : room;
    if (every.n_answers > 0 && cap < 1) {
        fprintf(stderr, "error: the document (%d tokens) and the longest question (%d) leave no room for an answer "
                "in the context of %d\n", document_length(full), max_question, m->config.seq_len);
        return -1;
    }
    every.answer_cap = cap > 0 ? cap : 1;
    every.answer_prompt = xmalloc((every.n_answers + 1) * sizeof(int));
    every.answer_len = xmalloc(((size_t)every.n_answers * 3 + 1) * sizeof(int));
    every.answer_tokens = xmalloc(((size_t)every.n_answers * 3 * every.answer_cap + 1) * sizeof(int));
    int rc = every.n_answers > 0 ? answer_rollouts(m, full, nectar, prompts, max_question, cap, &every) : 0;
    for (int k = 0; k < EVAL_SPLITS && rc == 0; k++) split_answers(prompts, &every, k, &split[k]);
    evalresult_free(&every);
    return rc;
}

void evalresult_free(EvalResult *r) {
    free(r->score_mse_layer); free(r->target_mse_layer);
    free(r->answer_prompt); free(r->answer_len); free(r->answer_tokens);
    memset(r, 0, sizeof(*r));
}

/* ------------------------------------------------------------------------ */
/* Drift: the models far from the document                                 */

/* Bin b of local positions: [0, 64) for b = 0, then [64 2^(b-1), 64 2^b). */
static int drift_bin_start(int b) { return b == 0 ? 0 : DRIFT_FIRST_BIN << (b - 1); }

static int drift_bin(int t) {
    int b = 0;
    while (t >= drift_bin_start(b + 1)) b++;
    return b;
}

/* The chosen prompts' questions and the full cache's greedy continuations
 * of `length` tokens (no stop) after them, into seqs (n, stride). */
int prompts_with_questions(const PromptSet *p, int split, int most, int *chosen, int *max_question) {
    int n = 0;
    *max_question = 1;
    for (int i = 0; p->question_len && i < p->n_prompts && n < most; i++) {
        if (p->question_len[i] == 0 || (split >= 0 && p->split[i] != split)) continue;
        chosen[n++] = i;
        if (p->question_len[i] > *max_question) *max_question = p->question_len[i];
    }
    return n;
}

int continue_questions(const Model *m, const Document *doc, const PromptSet *p, const int *chosen, int n,
                       int max_question, int length, int *seqs, int stride, const char *what) {
    RunState s;
    int block = max_question > ROLLOUT_BATCH ? max_question : ROLLOUT_BATCH, rc = 0;
    runstate_alloc_seqs(&s, m, doc, block, stride, ROLLOUT_BATCH);
    Rollout batch[ROLLOUT_BATCH];
    EvalProgress progress = eval_progress_start(what, (n + ROLLOUT_BATCH - 1) / ROLLOUT_BATCH);
    for (int first = 0; first < n && rc == 0; first += ROLLOUT_BATCH) {
        int count = n - first < ROLLOUT_BATCH ? n - first : ROLLOUT_BATCH;
        for (int j = 0; j < count; j++) {
            int i = chosen[first + j], nq = p->question_len[i];
            int *seq = seqs + (size_t)(first + j) * stride;
            memcpy(seq, p->tokens + p->offsets[i], nq * sizeof(int));
            batch[j] = (Rollout){seq, nq, length, seq + nq, 0};
        }
        rc = rollouts(m, &s, doc, (int[2]){-1, -1}, NULL, batch, count);  /* no stop: each runs to `length` */
        eval_progress_step(&progress);
    }
    eval_progress_end(&progress);
    runstate_free(&s);
    return rc;
}

/* Each continuation teacher-forced through the three models: position t's
 * predictions into bin drift_bin(t), each sequence a cluster of the
 * bins' intervals. */
static int drift_measure(const Model *m, const Document *full, const Document *nectar, const PromptSet *p,
                         const int *chosen, const int *seqs, int stride, int length, DriftResult *r) {
    int L = m->config.n_layers, H = m->config.n_heads, V = m->config.vocab_size, rc = 0;
    Evaluation e;
    evaluation_start(&e, m, full, nectar, p, stride, 0);
    Sums seq_bins[DRIFT_MAX_BINS], bins[DRIFT_MAX_BINS];
    for (int b = 0; b < r->n_bins; b++) { sums_alloc(&seq_bins[b], L, H); sums_alloc(&bins[b], L, H); }
    EvalProgress progress = eval_progress_start("drift: teacher-forced continuations", r->n_seqs);
    for (int a = 0; a < r->n_seqs && rc == 0; a++) {
        const int *seq = seqs + (size_t)a * stride;
        int len = p->question_len[chosen[a]] + length, prefix = forward_three(&e, m, p, seq, len);
        if (prefix < 0) { rc = -1; break; }
        for (int b = 0; b < r->n_bins; b++) sums_clear(&seq_bins[b], L, H);
        for (int t = 0; t + 1 < len; t++) count_position(&e, V, seq, t, prefix, &seq_bins[drift_bin(t)]);
        for (int b = 0; b < r->n_bins; b++)
            if (seq_bins[b].positions) sums_add_prompt(&bins[b], &seq_bins[b], L, H);
        eval_progress_step(&progress);
    }
    eval_progress_end(&progress);
    for (int b = 0; b < r->n_bins; b++) {
        const Sums *s = &bins[b];
        double n = (double)s->positions;
        r->positions[b] = s->positions;
        r->kl[b] = s->kl / n; r->kl_nodoc[b] = s->kl_nodoc / n;
        r->agree[b] = s->agree / n; r->agree_nodoc[b] = s->agree_nodoc / n;
        ratio_interval(r->kl[b], n, s->prompts, s->kl2, s->kl_x, s->x2, r->kl_ci[b]);
        sums_free(&seq_bins[b]); sums_free(&bins[b]);
    }
    evaluation_free(&e);
    return rc;
}

int drift_profile(const Model *m, const Document *full, const Document *nectar, const PromptSet *prompts, int length,
                  int n_seqs, DriftResult *r) {
    const Config *c = &m->config;
    int max_question;
    memset(r, 0, sizeof(*r));
    if (evaluation_check(m, full, nectar, prompts, promptset_max_len(prompts)) != 0) return -1;
    int *chosen = xmalloc((prompts->n_prompts + 1) * sizeof(int));  /* (n_prompts) */
    int tasks = 0;  /* the evaluation-only tasks where there are any: never trained on, and shared by fits */
    for (int i = 0; i < prompts->n_prompts; i++) tasks |= prompts->split[i] == SPLIT_TASKS;
    int n = prompts_with_questions(prompts, tasks ? SPLIT_TASKS : -1, n_seqs, chosen, &max_question);
    /* what the context leaves after the documents (or the prefix) and the longest question */
    int room = c->seq_len - tokens_before(full, prompts) - max_question;
    if (length > room) length = room;
    if (n == 0 || length < 2) {
        fprintf(stderr, "error: drift needs held-out prompts with a question part and room after them in the "
                "context (%d prompts with one; %d tokens of room)\n", n, room);
        free(chosen);
        return -1;
    }
    r->n_seqs = n;
    r->length = length;
    /* the longest sequence predicts at positions 0 .. max_question + length - 2: every bin holds some */
    while (r->n_bins < DRIFT_MAX_BINS && drift_bin_start(r->n_bins) < max_question + length - 1) {
        r->lo[r->n_bins] = drift_bin_start(r->n_bins);
        r->hi[r->n_bins] = drift_bin_start(r->n_bins + 1);
        r->n_bins++;
    }
    int stride = max_question + length;
    int *seqs = xmalloc((size_t)n * stride * sizeof(int));
    int rc = continue_questions(m, full, prompts, chosen, n, max_question, length, seqs, stride,
                                "drift: the full cache's continuations, batches");
    if (rc == 0) rc = drift_measure(m, full, nectar, prompts, chosen, seqs, stride, length, r);
    free(seqs); free(chosen);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Where answers end                                                        */

/* Bin b of answer positions: [0, 16) for b = 0, then [16 2^(b-1), 16 2^b); the last bin takes the rest. */
static int stop_bin_start(int b) { return b == 0 ? 0 : STOP_FIRST_BIN << (b - 1); }

static int stop_bin(int t) {
    int b = 0;
    while (b + 1 < STOP_BINS && t >= stop_bin_start(b + 1)) b++;
    return b;
}

/* Answer a's full-cache answer (its length, or 0 where it does not end with a stop). */
static int ended_answer(const EvalResult *r, const int stop[2], int a, const int **tokens) {
    int len = r->answer_len[(size_t)a * 3];
    *tokens = r->answer_tokens + (size_t)a * 3 * r->answer_cap;
    return len > 0 && ((*tokens)[len - 1] == stop[0] || (*tokens)[len - 1] == stop[1]) ? len : 0;
}

/* One ended answer after its question (seq, L tokens) through the three
 * models: each one's log p and top-1 of the stop at the last position into
 * bin b and the total. */
static int count_stop(Evaluation *e, const Model *m, const PromptSet *p, const int *seq, int L, int b, StopResult *r) {
    int V = m->config.vocab_size, prefix = forward_three(e, m, p, seq, L), stop = seq[L - 1];
    if (prefix < 0) return -1;
    const float *logits[3] = {e->sf.logits + (size_t)(L - 2) * V, e->sn.logits + (size_t)(L - 2) * V,
                              e->s0.logits + (size_t)(L - 2 + prefix) * V};  /* each row predicts the stop */
    for (int k = 0; k < 3; k++) {
        log_softmax(logits[k], V, e->lp_full);
        int top = argmax(logits[k], V) == stop;
        r->logp[k][b] += e->lp_full[stop]; r->logp[k][STOP_BINS] += e->lp_full[stop];
        r->top[k][b] += top; r->top[k][STOP_BINS] += top;
    }
    r->count[b]++; r->count[STOP_BINS]++;
    return 0;
}

int stop_profile(const Model *m, const Document *full, const Document *nectar, const PromptSet *prompts,
                 const EvalResult *answers, StopResult *r) {
    memset(r, 0, sizeof(*r));
    int max_len = 2, rc = 0;
    const int *tokens;
    for (int a = 0; a < answers->n_answers; a++) {
        int len = ended_answer(answers, prompts->answer_stop, a, &tokens), i = answers->answer_prompt[a];
        if (len > 0 && prompts->question_len[i] + len > max_len) max_len = prompts->question_len[i] + len;
    }
    Evaluation e;
    evaluation_start(&e, m, full, nectar, prompts, max_len, 0);
    int *seq = xmalloc(max_len * sizeof(int));  /* (max_len) a question, then its answer */
    for (int a = 0; a < answers->n_answers && rc == 0; a++) {
        int len = ended_answer(answers, prompts->answer_stop, a, &tokens), i = answers->answer_prompt[a];
        int nq = prompts->question_len[i];
        if (len == 0) continue;
        memcpy(seq, prompts->tokens + prompts->offsets[i], nq * sizeof(int));
        memcpy(seq + nq, tokens, len * sizeof(int));
        rc = count_stop(&e, m, prompts, seq, nq + len, stop_bin(len - 1), r);
    }
    r->n_answers = r->count[STOP_BINS];
    for (int b = 0; b <= STOP_BINS; b++)
        for (int k = 0; k < 3 && r->count[b] > 0; k++) { r->logp[k][b] /= r->count[b]; r->top[k][b] /= r->count[b]; }
    for (int b = 0; b < STOP_BINS; b++)
        if (r->count[b] > 0) r->n_bins = b + 1;
    for (int b = 0; b < r->n_bins; b++) {
        r->lo[b] = stop_bin_start(b);
        r->hi[b] = b + 1 < STOP_BINS ? stop_bin_start(b + 1) : answers->answer_cap;
    }
    free(seq);
    evaluation_free(&e);
    return rc;
}
