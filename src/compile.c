/* compile.c - compiling a document into Nectar modules (nectar.h, section
 * 6): the modules sized by a budget, the teacher pass that records what the
 * full cache does after the document, the modules' starting point, and the
 * fit (regression on the states, KL distillation through the frozen model,
 * or a regression stage then a KL stage), on the CPU here or on the GPU
 * (nectar_cuda.cu's backend) through the same loop.
 */
#include "../nectar.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* The budget                                                               */

int moduleset_for_budget(ModuleSet *ms, const Model *m, const DocCache *cache, ModuleArch arch, float rho,
                         int Db, int Ds, int Dt, const float *layer_mult, int with_grads) {
    const Config *c = &m->config;
    int L = c->n_layers, G = c->n_kv_heads, d = c->dim / c->n_heads, n_doc = cache->n;
    memset(ms, 0, sizeof(*ms));
    int *sizes = xmalloc(L * sizeof(int)), rc = -1;  /* (L) width or pairs per layer */
    for (int l = 0; l < L; l++) {
        double mult = layer_mult ? layer_mult[l] : 1.0;
        sizes[l] = module_size_for_budget(arch, d, (double)rho * mult * n_doc, Db, Ds, Dt);
        if (arch == ARCH_QUAD && sizes[l] > n_doc) {
            fprintf(stderr, "error: layer %d would get %d quadrature pairs, more than the %d cached pairs they start "
                    "from; keep rho x multiplier <= 1\n", l, sizes[l], n_doc);
            goto done;
        }
        if (sizes[l] < 1) {
            fprintf(stderr, "error: rho %g leaves layer %d no room for even one %s of a document of %d tokens; "
                    "raise rho%s\n", rho, l, arch == ARCH_MLP ? "hidden unit" : "pair", n_doc,
                    arch == ARCH_MLP ? " or lower the depths" : "");
            goto done;
        }
    }
    if (moduleset_alloc(ms, arch, L, G, d, Db, Ds, Dt, sizes, with_grads) != 0) goto done;
    ms->n_doc = n_doc;
    ms->rho = rho;
    ms->model_fingerprint = m->fingerprint;
    ms->doc_fingerprint = cache->fingerprint;
    rc = 0;
done:
    free(sizes);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The teacher pass                                                         */

size_t teacher_alloc(TeacherData *td, const Config *c, const PromptSet *p, const unsigned char *is_train,
                     int want_logits, int top_k, size_t logits_budget) {
    int L = c->n_layers, D = c->dim, H = c->n_heads;
    FitTargets *f = &td->fit;
    memset(td, 0, sizeof(*td));
    td->prompt = xmalloc(p->n_prompts * sizeof(int));
    td->start = xmalloc(p->n_prompts * sizeof(long));
    for (int i = 0; i < p->n_prompts; i++) {
        if (!is_train[i]) continue;
        td->prompt[td->n_train] = i;
        td->start[td->n_train++] = f->P;
        f->P += p->offsets[i + 1] - p->offsets[i];
    }
    size_t logit_bytes = top_k ? (size_t)f->P * (top_k * (sizeof(int) + sizeof(float)) + sizeof(float))
                               : (size_t)f->P * c->vocab_size * sizeof(float);
    int keep_logits = want_logits && (top_k || logit_bytes <= logits_budget);
    td->top_k = keep_logits ? top_k : 0;
    f->q = xmalloc((size_t)L * f->P * D * sizeof(uint16_t));
    f->A = xmalloc((size_t)L * f->P * D * sizeof(uint16_t));
    f->alpha = xmalloc((size_t)L * f->P * H * sizeof(float));
    if (keep_logits && top_k) {
        td->top_ids = xmalloc((size_t)f->P * top_k * sizeof(int));
        td->top_logp = xmalloc((size_t)f->P * top_k * sizeof(float));
        td->top_rest = xmalloc((size_t)f->P * sizeof(float));
    } else if (keep_logits) {
        td->logits = xmalloc((size_t)f->P * c->vocab_size * sizeof(float));
    }
    return (size_t)f->P * L * (2 * D * sizeof(uint16_t) + H * sizeof(float)) + (keep_logits ? logit_bytes : 0);
}

void teacherdata_free(TeacherData *td) {
    free(td->fit.q); free(td->fit.A); free(td->fit.alpha);
    free(td->logits); free(td->top_ids); free(td->top_logp); free(td->top_rest);
    free(td->prompt); free(td->start);
    memset(td, 0, sizeof(*td));
}

/* Prompt i's rows [row, row + len) of the last forward: its embedding (the
 * mean of its final normalised hidden states, s->xb), and for a training
 * prompt its targets at P position `at` (and logits). */
static void teacher_record(const Config *c, const RunState *s, int row, int len, int i, int is_train, long at,
                           TeacherData *td, float *embed) {
    int L = c->n_layers, D = c->dim, H = c->n_heads, B = s->max_block, V = c->vocab_size;
    FitTargets *f = &td->fit;
    for (int k = 0; embed && k < D; k++) {
        double sum = 0;
        for (int t = 0; t < len; t++) sum += s->xb[(size_t)(row + t) * D + k];
        embed[(size_t)i * D + k] = (float)(sum / len);
    }
    if (!is_train) return;
    for (int l = 0; l < L; l++) {
        size_t tap = (size_t)l * B + row, target = (size_t)l * f->P + at;
        for (size_t e = 0; e < (size_t)len * D; e++) {
            f->q[target * D + e] = bf16_from_float(s->taps.q[tap * D + e]);
            f->A[target * D + e] = bf16_from_float(s->taps.doc_A[tap * D + e]);
        }
        memcpy(f->alpha + target * H, s->taps.doc_lse + tap * H, (size_t)len * H * sizeof(float));
    }
    if (td->logits) memcpy(td->logits + (size_t)at * V, s->logits + (size_t)row * V, (size_t)len * V * sizeof(float));
    for (long t = 0; td->top_ids && t < len; t++) {
        size_t k = (size_t)td->top_k;
        top_k_logprobs(s->logits + (size_t)(row + t) * V, V, td->top_k, td->top_ids + (at + t) * k,
                       td->top_logp + (at + t) * k, td->top_rest + at + t);
    }
}

/* TEACHER_SEQS prompts a forward (forward_segments: one matrix product per
 * weight for all their rows), in blocks of at least TEACHER_ROWS rows. */
enum { TEACHER_SEQS = 8, TEACHER_ROWS = 256 };
int teacher_pass(const Model *m, const Document *doc, const PromptSet *p, const unsigned char *is_train,
                 TeacherData *td, float *embed, ProgressFn progress, void *user) {
    const Config *c = &m->config;
    int max_len = promptset_max_len(p), block = max_len > TEACHER_ROWS ? max_len : TEACHER_ROWS;
    RunState s;
    runstate_alloc_seqs(&s, m, doc, block, max_len, TEACHER_SEQS);
    runstate_enable_taps(&s, m);
    Segment seg[TEACHER_SEQS];
    long at = 0;
    int rc = 0;
    for (int i = 0; i < p->n_prompts && rc == 0;) {
        int n = 0, rows = 0;  /* the next prompts that fit one block */
        for (; n < TEACHER_SEQS && i + n < p->n_prompts; n++) {
            int len = p->offsets[i + n + 1] - p->offsets[i + n];
            if (rows + len > block) break;
            seg[n] = (Segment){p->tokens + p->offsets[i + n], len, n, 0};
            rows += len;
        }
        rc = forward_segments(m, &s, doc, seg, n, LOGITS_ALL);
        for (int k = 0, row = 0; k < n && rc == 0; row += seg[k].ntok, k++) {
            teacher_record(c, &s, row, seg[k].ntok, i + k, is_train[i + k], at, td, embed);
            if (is_train[i + k]) at += seg[k].ntok;
        }
        i += n;
        if (progress) progress("teacher", i, p->n_prompts, user);
    }
    runstate_free(&s);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The starting point                                                       */

/* MLP: output biases at the training means of alpha and A, input scale
 * 1 / rms(q), per (layer, KV head). */
static void mlp_init_from_teacher(ModuleSet *ms, const FitTargets *targets, const Config *c, uint64_t seed) {
    int L = c->n_layers, G = c->n_kv_heads, H = c->n_heads, D = c->dim, d = D / H, group = H / G;
    float *mean_a = xmalloc((size_t)L * G * sizeof(float));      /* (L, G) */
    float *mean_A = xmalloc((size_t)L * G * d * sizeof(float));  /* (L, G, d) */
    double *sA = xmalloc(d * sizeof(double));                    /* (d) */
    for (int l = 0; l < L; l++)
        for (int g = 0; g < G; g++) {
            double sa = 0, sq = 0;
            memset(sA, 0, d * sizeof(double));
            for (long t = 0; t < targets->P; t++)
                for (int j = 0; j < group; j++) {
                    size_t row = ((size_t)l * targets->P + t) * D + (size_t)(g * group + j) * d;
                    sa += targets->alpha[((size_t)l * targets->P + t) * H + g * group + j];
                    for (int k = 0; k < d; k++) {
                        double q = float_from_bf16(targets->q[row + k]);
                        sA[k] += float_from_bf16(targets->A[row + k]);
                        sq += q * q;
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

void moduleset_init(ModuleSet *ms, const FitTargets *targets, const DocCache *cache, const Config *c,
                    uint64_t seed) {
    if (ms->arch == ARCH_MLP) mlp_init_from_teacher(ms, targets, c, seed);
    else quad_init_from_cache(ms, cache);
}

/* ------------------------------------------------------------------------ */
/* The fit's pieces                                                         */

int fit_uses_kl(const FitOptions *o) { return o->lambda_kl > 0 || o->kl_steps > 0; }

/* The regression terms' normalisers: what modules that predict their
 * training means would score, summed over (layer, KV head) as the loss is:
 * the variance of alpha, and sum_k Var(A_k), over each module's training
 * queries. L_alpha and L_A divided by them are 1 for the mean predictor and
 * 0 for a perfect fit whatever the model's scale, so that the KL term (nats
 * per position) can be weighed against them. */
static void regression_normalisers(const FitTargets *t, const Config *c, double *var_alpha, double *var_A) {
    int L = c->n_layers, G = c->n_kv_heads, H = c->n_heads, D = c->dim, d = D / H, group = H / G;
    double *sA = xmalloc(d * sizeof(double)), *sAA = xmalloc(d * sizeof(double));  /* (d) sums of A_k, A_k^2 */
    double count = (double)t->P * group;
    *var_alpha = *var_A = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < G; g++) {
            double sa = 0, saa = 0;
            memset(sA, 0, d * sizeof(double));
            memset(sAA, 0, d * sizeof(double));
            for (long p = 0; p < t->P; p++)
                for (int j = 0; j < group; j++) {
                    double a = t->alpha[((size_t)l * t->P + p) * H + g * group + j];
                    const uint16_t *A = t->A + ((size_t)l * t->P + p) * D + (size_t)(g * group + j) * d;
                    sa += a; saa += a * a;
                    for (int k = 0; k < d; k++) {
                        double A_k = float_from_bf16(A[k]);
                        sA[k] += A_k; sAA[k] += A_k * A_k;
                    }
                }
            /* Var(x) = E[x^2] - E[x]^2 */
            *var_alpha += saa / count - (sa / count) * (sa / count);
            for (int k = 0; k < d; k++) *var_A += sAA[k] / count - (sA[k] / count) * (sA[k] / count);
        }
    if (!(*var_alpha > 0)) *var_alpha = 1;  /* constant targets: nothing to normalise */
    if (!(*var_A > 0)) *var_A = 1;
    free(sA); free(sAA);
}

float learning_rate(const Stage *s, float warmup_fraction, int t) {
    int warmup = (int)(warmup_fraction * s->steps);
    if (t < warmup) return s->lr * (t + 1) / warmup;
    float progress = (float)(t - warmup) / (float)(s->steps - warmup > 0 ? s->steps - warmup : 1);
    return s->lr * 0.5f * (1.0f + cosf(3.14159265f * progress));
}

double kl_term(const TeacherRows *teacher, const float *student_logits, int len, int V, float weight,
               float *dlogits) {
    double kl = teacher->k ? kl_loss_top_k(teacher->ids, teacher->logp, teacher->rest, teacher->k, student_logits,
                                           len, V, dlogits)
                           : kl_loss(teacher->logits, student_logits, len, V, dlogits);
    for (size_t j = 0; j < (size_t)len * V; j++) dlogits[j] *= weight;
    return kl;
}

/* ------------------------------------------------------------------------ */
/* The CPU's backend                                                        */

static void cpu_start(Fit *f) {
    const Config *c = &f->model->config;
    int max_len = promptset_max_len(f->prompts);
    modulework_alloc(&f->work, f->ms, f->o.batch * (c->n_heads / c->n_kv_heads));
    fitbatch_alloc(&f->batch, f->ms, c->n_heads, f->o.batch);
    f->student_doc = (Document){DOC_NECTAR, f->ms->n_doc, NULL, f->ms, NULL};
    if (fit_uses_kl(&f->o)) {
        runstate_alloc(&f->student, f->model, &f->student_doc, max_len, max_len);
        runstate_enable_backward(&f->student, f->model);
        f->dlogits = xmalloc((size_t)max_len * c->vocab_size * sizeof(float));
    }
}

static double cpu_regression(Fit *f, const long *pos) {
    const Stage *stage = f->stage;
    memset(f->ms->grads, 0, f->ms->n_params * sizeof(float));
    if (stage->weight_alpha + stage->weight_A == 0) return 0;
    memcpy(f->batch.pos, pos, f->batch.B * sizeof(long));
    return regression_grads(f->ms, &f->work, &f->batch, &f->td->fit, f->model->config.n_heads,
                            stage->weight_alpha, stage->weight_A);
}

static double cpu_kl(Fit *f, const int *tokens, int len, const TeacherRows *teacher, float weight) {
    forward(f->model, &f->student, &f->student_doc, tokens, len, 0, LOGITS_ALL);
    double kl = kl_term(teacher, f->student.logits, len, f->model->config.vocab_size, weight, f->dlogits);
    backward(f->model, &f->student, &f->student_doc, tokens, len, f->dlogits, NULL);
    return kl;
}

static double cpu_update(Fit *f, float lr, int t) {
    ModuleSet *ms = f->ms;
    double norm = clip_grad_norm(ms->grads, ms->n_params, 1.0);  /* global norm clipping at 1.0 */
    if (t == 1) {
        memset(f->adam_m, 0, ms->n_params * sizeof(float));
        memset(f->adam_v, 0, ms->n_params * sizeof(float));
    }
    adamw_update(ms->params, ms->grads, f->adam_m, f->adam_v, ms->n_params, t, lr, f->o.weight_decay, ADAM_BETA2);
    return norm;
}

static void cpu_download(Fit *f) { (void)f; }  /* the CPU fits the host's modules in place */

static void cpu_finish(Fit *f) {
    fitbatch_free(&f->batch);
    modulework_free(&f->work);
    if (fit_uses_kl(&f->o)) runstate_free(&f->student);
    free(f->dlogits);
    f->dlogits = NULL;
}

static const FitBackend CPU_FIT = {cpu_start, cpu_regression, cpu_kl, cpu_update, cpu_download, cpu_finish};
const FitBackend *fit_backend_cpu(void) { return &CPU_FIT; }

/* ------------------------------------------------------------------------ */
/* The fit: one loop, on the CPU or the GPU                                 */

/* NULL, or why a fit of these settings and data cannot run. */
static const char *fit_problem(const ModuleSet *ms, const TeacherData *td, const FitOptions *o) {
    if (td->n_train < 1 || td->fit.P < 1) return "there are no training positions";
    if (!ms->grads) return "the modules have no gradients (moduleset_for_budget with_grads)";
    if (o->batch < 1 || o->steps < 0 || o->kl_steps < 0) return "the batch must be at least 1, the steps at least 0";
    if (fit_uses_kl(o) && (o->kl_prompts < 1 || o->kl_prompts > MAX_KL_PROMPTS))
        return "kl_prompts must be in 1..MAX_KL_PROMPTS with a KL term";
    return NULL;
}

int fit_begin(Fit *f, const Model *m, ModuleSet *ms, const TeacherData *td, const PromptSet *prompts,
              const Document *doc, const FitOptions *o, const FitBackend *backend) {
    const Config *c = &m->config;
    memset(f, 0, sizeof(*f));
    const char *why = fit_problem(ms, td, o);
    if (why) {
        fprintf(stderr, "error: cannot fit: %s\n", why);
        return -1;
    }
    f->o = *o;
    f->backend = backend ? backend : &CPU_FIT;
    f->model = m; f->ms = ms; f->td = td; f->prompts = prompts; f->doc = doc;
    f->adam_m = xmalloc(ms->n_params * sizeof(float));
    f->adam_v = xmalloc(ms->n_params * sizeof(float));
    f->pos = xmalloc(o->batch * sizeof(long));
    double var_alpha, var_A;
    regression_normalisers(&td->fit, c, &var_alpha, &var_A);
    f->stages[0] = (Stage){0, o->steps, o->lr, (float)(o->lambda_alpha / var_alpha), (float)(o->lambda_A / var_A),
                           o->lambda_kl};
    f->stages[1] = (Stage){o->steps, o->kl_steps, o->kl_lr, 0, 0, 1};
    int max_len = promptset_max_len(prompts);
    if (fit_uses_kl(o) && !td->logits && !td->top_k) runstate_alloc(&f->teacher, m, doc, max_len, max_len);
    return 0;
}

/* The KL term over kl_prompts training prompts drawn from rng, each
 * weighted by its share of their positions, added into *loss; -1 after a
 * sentence when the teacher's recomputed forward fails. */
static int kl_terms(Fit *f, const Stage *stage, uint64_t *rng, double *loss) {
    const TeacherData *td = f->td;
    const PromptSet *all = f->prompts;
    int pick[MAX_KL_PROMPTS], positions = 0, V = f->model->config.vocab_size;  /* (kl_prompts) */
    for (int k = 0; k < f->o.kl_prompts; k++) {
        pick[k] = rng_u32(rng) % td->n_train;
        int i = td->prompt[pick[k]];
        positions += all->offsets[i + 1] - all->offsets[i];
    }
    for (int k = 0; k < f->o.kl_prompts; k++) {
        int i = td->prompt[pick[k]], len = all->offsets[i + 1] - all->offsets[i];
        const int *tokens = all->tokens + all->offsets[i];
        long at = td->start[pick[k]];
        TeacherRows teacher = {td->logits ? td->logits + at * V : f->teacher.logits, td->top_k, NULL, NULL, NULL};
        if (td->top_k)
            teacher = (TeacherRows){NULL, td->top_k, td->top_ids + at * td->top_k, td->top_logp + at * td->top_k,
                                    td->top_rest + at};
        if (!td->logits && !td->top_k && forward(f->model, &f->teacher, f->doc, tokens, len, 0, LOGITS_ALL) != 0)
            return -1;
        /* kl_loss averages over this prompt's positions; weigh by its share of all of them */
        float share = (float)len / positions;
        double kl = f->backend->kl(f, tokens, len, &teacher, stage->lambda_kl * share);
        *loss += stage->lambda_kl * kl * share;
    }
    return 0;
}

/* One step (f->step, from 0): the batch and the KL prompts drawn from
 * (seed, the stage's step), the loss and its gradient, the update. */
static int fit_step(Fit *f, FitStatus *st) {
    /* with no KL stage, step < stages[1].first = o.steps */
    const Stage *stage = f->stage = &f->stages[f->step >= f->stages[1].first];
    int stage_step = f->step - stage->first;  /* from 0 */
    uint64_t batch_rng = fnv1a(f->o.seed, &stage_step, sizeof stage_step) | 1;
    for (int b = 0; b < f->o.batch; b++) f->pos[b] = (long)(rng_u32(&batch_rng) % (uint32_t)f->td->fit.P);
    float lr = learning_rate(stage, f->o.warmup_fraction, stage_step);
    f->step++;
    double loss = f->backend->regression(f, f->pos);
    if (stage->lambda_kl > 0 && kl_terms(f, stage, &batch_rng, &loss) != 0) return -1;
    double norm = f->backend->update(f, lr, stage_step + 1);
    *st = (FitStatus){.step = f->step, .stage = stage == &f->stages[1], .loss = loss, .grad_norm = norm, .lr = lr};
    if (isfinite(loss) && isfinite(norm)) return 0;  /* a NaN norm would pass the clipping unseen */
    f->diverged_loss = loss;
    f->diverged_norm = norm;
    return FIT_DIVERGED;
}

int fit_steps(Fit *f, int last_step, FitProgressFn progress, void *user) {
    if (last_step > f->o.steps + f->o.kl_steps) {
        fprintf(stderr, "error: the fit has %d steps, not %d\n", f->o.steps + f->o.kl_steps, last_step);
        return -1;
    }
    f->backend->start(f);
    int rc = 0;
    while (f->step < last_step && rc == 0) {
        FitStatus st;
        rc = fit_step(f, &st);
        st.last_step = last_step;
        if (rc == 0 && progress && progress(f, &st, user) != 0) rc = -1;
    }
    f->backend->finish(f);
    return rc;
}

void fit_sync(Fit *f) { f->backend->download(f); }

void fit_end(Fit *f) {
    free(f->adam_m); free(f->adam_v); free(f->pos);
    runstate_free(&f->teacher);
    memset(f, 0, sizeof(*f));
}
