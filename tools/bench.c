/* bench.c - serving cost and speed, exact against Nectar, measured side by
 * side in one run (`make bench`). Every configuration runs in a child
 * process, so its peak resident memory is its own.
 *
 * References measured in the same run: a streaming read of a 1 GB array on
 * the pool's threads (decode is reported as a fraction of the memory
 * roofline, the bytes it reads per token over that bandwidth), sgemm at
 * the model's shapes, the better of OpenBLAS's own threads and a split over
 * the pool (prefill and module fitting are reported as a fraction of it),
 * the no-document decode, the exact path. Then module fitting and the
 * amortisation of a fit, and many prompts in one forward (batched
 * rollouts against one at a time). Then compositions: 1, 2 and 3
 * documents of one length before the prompt, each read from its own KV
 * cache or its own modules, exact against Nectar (the CPU only: the GPU
 * takes one document). --json prints the same as one JSON object. With
 * --gpu (a build with nvcc, `make bench-gpu`) the operations one decoded
 * token queues on the GPU, then the same on the GPU against cuBLAS sgemm,
 * and module fitting on the GPU against the CPU.
 */
#include "../nectar.h"
#include "../src/cli.h"
#include "../src/eval.h"
#include "../src/formats.h"
#include "../src/parallel.h"
#include "../src/util.h"
#ifdef NECTAR_CUDA
#include "../nectar_cuda.h"
#endif

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

enum { PROMPT = 16, DECODE = 32, BLOCK = 256, MAX_DOC = 1 << 24 };
enum { COMPOSED = 3 };  /* the composition table: 1 .. COMPOSED documents */

typedef enum { RUN_FULL_PREFILL, RUN_REUSED_CACHE, RUN_NECTAR, RUN_NO_DOC } RunKind;

typedef struct {
    double ttft_ms;       /* prompt (and document, for the full prefill) to first logits */
    double decode_tps;    /* decode tokens per second after that: 1 / the median token's time */
    double decode_mean_tps; /* DECODE / the time of all of them */
    double peak_mb;       /* peak resident memory of the process */
    double prefill_gflops;/* full prefill: model FLOPs / time */
    double prefill_ms;    /* full prefill: the documents' KV caches alone (in ttft_ms) */
    double state_bytes;   /* the documents' state: KV caches or modules */
} Measure;

/* What one child times: n_docs documents of n tokens each, composed (1 in
 * the serving table; none for RUN_NO_DOC), read from their KV caches or
 * from their modules at rho. */
typedef struct {
    RunKind kind;
    int n, n_docs;
    ModuleArch arch;
    float rho;  /* RUN_NECTAR: the modules' budget, a fraction of n */
} RunSpec;

/* A run's documents: doc[0] the composition's first (doc[i].next =
 * &doc[i + 1]), each one's KV cache or modules beside it. */
typedef struct {
    DocCache cache[MAX_DOCUMENTS];
    ModuleSet ms[MAX_DOCUMENTS];
    Document doc[MAX_DOCUMENTS];
} Documents;

/* FLOPs of the forward of `ntok` tokens after `ctx` earlier ones, with the
 * logits of `logit_rows` of them: the matmuls, 2 per multiply-add, and
 * attention (QK and PV) over what each token sees. */
static double forward_flops(const Config *c, double ntok, double ctx, double logit_rows) {
    double D = c->dim, F = c->hidden_dim, KVD = (double)c->dim / c->n_heads * c->n_kv_heads;
    double matmul = 2.0 * ntok * (2 * D * D + 2 * D * KVD + 3 * D * F) * c->n_layers + 2.0 * logit_rows * D * c->vocab_size;
    double attention = 4.0 * D * c->n_layers * (ntok * ctx + ntok * (ntok + 1) / 2);
    return matmul + attention;
}

/* The bytes of a document's KV cache: keys and values of n tokens in every layer. */
static double kv_bytes(const Config *c, int n) {
    return 2.0 * sizeof(float) * c->n_layers * n * ((double)c->dim / c->n_heads * c->n_kv_heads);
}

/* The size rho gives each (layer, KV head) for a document of n tokens, as
 * train sizes it: an MLP (1,1,1)'s width, or a quadrature module's pairs. */
static int module_size(const Config *c, ModuleArch arch, int n, float rho) {
    return module_size_for_budget(arch, c->dim / c->n_heads, (double)rho * n, 1, 1, 1);
}

/* How the tables name the modules they time. */
static const char *modules_named(ModuleArch arch) {
    return arch == ARCH_MLP ? "MLPs (1,1,1) of the width that rho allows" : "quadrature, floor(rho n) pairs";
}

/* A benchmark document of n tokens: BOS, then ids spread over 3..258 (the
 * values do not change the timing). Caller frees. */
static int *bench_document(int n) {
    int *ids = xmalloc(n * sizeof(int));
    ids[0] = 1;
    for (int i = 1; i < n; i++) ids[i] = 3 + (int)((i * 2654435761u) % 256u);
    return ids;
}

/* Parameter values for timing (they do not change it): an MLP's init with
 * every parameter moved off zero (its output layer starts at 0), or random
 * quadrature keys and values. */
static void bench_values(ModuleSet *ms) {
    uint64_t rng = 1;
    if (ms->arch == ARCH_MLP) mlp_init(ms, 1, NULL, NULL);
    for (size_t i = 0; i < ms->n_params; i++)
        ms->params[i] = ms->arch == ARCH_MLP ? ms->params[i] + 0.01f : rng_normal(&rng);
}

/* Modules of the size rho allows for a document of n tokens in every layer:
 * MLPs (1,1,1) or quadrature modules; exits when n is too short for rho
 * (moduleset_alloc says so). */
static void bench_modules(const Config *c, ModuleArch arch, int n, float rho, int with_grads, ModuleSet *ms) {
    int *sizes = xmalloc(c->n_layers * sizeof(int));
    for (int l = 0; l < c->n_layers; l++) sizes[l] = module_size(c, arch, n, rho);
    if (moduleset_alloc(ms, arch, c->n_layers, c->n_kv_heads, c->dim / c->n_heads, 1, 1, 1, sizes, with_grads) != 0)
        exit(1);
    bench_values(ms);
    ms->n_doc = n;
    free(sizes);
}

/* Progress over the document sizes min_doc, 2 min_doc, ... max_doc: the time
 * so far and, once two sizes have run, an ETA that assumes each doubling
 * costs what the last one did. */
typedef struct { const char *what; double t_start, t_size, t_last, growth; } Progress;

static void progress_size_starts(Progress *p, int n, int max_doc) {
    p->t_size = now_seconds();
    double eta = 0, t = p->t_last;
    for (long k = n; p->growth > 0 && k <= max_doc; k *= 2) {
        t *= p->growth;  /* this size's time, then the next one's */
        eta += t;
    }
    if (p->growth > 0)
        fprintf(stderr, "%sdocument of %d tokens ... (%.0fs so far, ETA %.0fs)\n", p->what, n, p->t_size - p->t_start, eta);
    else
        fprintf(stderr, "%sdocument of %d tokens ... (%.0fs so far)\n", p->what, n, p->t_size - p->t_start);
}

static void progress_size_ends(Progress *p) {
    double took = now_seconds() - p->t_size;
    if (p->t_last > 0) p->growth = took / p->t_last;
    p->t_last = took;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of x (n), which it sorts. */
static double median(double *x, int n) {
    qsort(x, n, sizeof(double), compare_doubles);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* A KV cache kept from an earlier request, of n tokens: only attending to
 * it is timed, so its values are filled in (random, from seed) rather than
 * computed by a prefill. */
static void filled_cache(const Config *c, int n, uint64_t seed, DocCache *cache) {
    cache->n = n;
    cache->n_layers = c->n_layers;
    cache->kv_dim = c->dim / c->n_heads * c->n_kv_heads;
    size_t count = (size_t)c->n_layers * n * cache->kv_dim;  /* (L, n, kv_dim) each */
    cache->key = xmalloc(count * sizeof(float));
    cache->value = xmalloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) { cache->key[i] = rng_normal(&seed); cache->value[i] = rng_normal(&seed); }
}

/* The spec's documents into ds, each at positions 0 .. n - 1 on its own
 * (NO_DOCUMENT for none): KV caches prefilled from doc_ids (full prefill)
 * or filled in (reused), or modules at rho. Returns the seconds of the
 * prefills (0 but for the full prefill); *state_bytes: the caches' or the
 * modules' bytes. Exits 1 after doccache_build's sentence. */
static double set_up_documents(const Model *m, const RunSpec *spec, const int *doc_ids, Documents *ds,
                               double *state_bytes) {
    const Config *c = &m->config;
    memset(ds, 0, sizeof *ds);
    ds->doc[0] = NO_DOCUMENT;
    *state_bytes = 0;
    double t0 = now_seconds();
    for (int i = 0; spec->kind != RUN_NO_DOC && i < spec->n_docs; i++) {
        const Document *next = i + 1 < spec->n_docs ? &ds->doc[i + 1] : NULL;
        if (spec->kind == RUN_NECTAR) {
            bench_modules(c, spec->arch, spec->n, spec->rho, 0, &ds->ms[i]);
            ds->doc[i] = (Document){DOC_NECTAR, spec->n, NULL, &ds->ms[i], next};
            *state_bytes += ds->ms[i].n_params * sizeof(float);
            continue;
        }
        if (spec->kind == RUN_FULL_PREFILL && doccache_build(&ds->cache[i], m, doc_ids, spec->n, BLOCK) != 0) _exit(1);
        if (spec->kind == RUN_REUSED_CACHE) filled_cache(c, spec->n, 5 + i, &ds->cache[i]);
        ds->doc[i] = (Document){DOC_EXACT, spec->n, &ds->cache[i], NULL, next};
        *state_bytes += kv_bytes(c, spec->n);
    }
    return spec->kind == RUN_FULL_PREFILL ? now_seconds() - t0 : 0;
}

/* One configuration, in the child (which exits 1 after forward's sentence):
 * the prompt after the spec's documents, then DECODE tokens one at a time. */
static Measure run_config(const Model *m, const RunSpec *spec, const int *doc_ids) {
    const Config *c = &m->config;
    Measure r = {0};
    int prompt[PROMPT + DECODE];
    for (int i = 0; i < PROMPT + DECODE; i++) prompt[i] = 3 + (i * 37) % 250;
    Documents ds;
    double t0 = now_seconds(), prefill_s = set_up_documents(m, spec, doc_ids, &ds, &r.state_bytes);
    if (spec->kind != RUN_FULL_PREFILL) t0 = now_seconds();  /* a reused cache (or modules) is already there */
    const Document *doc = &ds.doc[0];
    RunState s;
    runstate_alloc(&s, m, doc, PROMPT, PROMPT + DECODE);
    if (forward(m, &s, doc, prompt, PROMPT, 0, LOGITS_LAST) != 0) _exit(1);
    double t1 = now_seconds();
    r.ttft_ms = (t1 - t0) * 1e3;
    if (spec->kind == RUN_FULL_PREFILL) {
        r.prefill_ms = prefill_s * 1e3;
        r.prefill_gflops = (spec->n_docs * forward_flops(c, spec->n, 0, 0) +
                            forward_flops(c, PROMPT, (double)spec->n_docs * spec->n, 1)) / (t1 - t0) / 1e9;
    }
    double token_s[DECODE];  /* each decode step's time */
    for (int i = 0; i < DECODE; i++) {
        double t = now_seconds();
        if (forward(m, &s, doc, &prompt[PROMPT + i], 1, PROMPT + i, LOGITS_LAST) != 0) _exit(1);
        token_s[i] = now_seconds() - t;
    }
    r.decode_mean_tps = DECODE / (now_seconds() - t1);
    r.decode_tps = 1.0 / median(token_s, DECODE);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    r.peak_mb = ru.ru_maxrss / 1024.0;
    runstate_free(&s);
    for (int i = 0; i < MAX_DOCUMENTS; i++) {
        doccache_free(&ds.cache[i]);
        moduleset_free(&ds.ms[i]);
    }
    return r;
}

/* Runs one configuration in a child process and reads its result back. */
static Measure measure(const Model *m, RunSpec spec, const int *doc_ids) {
    int fd[2];
    Measure r = {0};
    if (pipe(fd) != 0) { perror("pipe"); exit(1); }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(1); }
    if (pid == 0) {
        close(fd[0]);
        r = run_config(m, &spec, doc_ids);
        ssize_t wrote = write(fd[1], &r, sizeof r);
        _exit(wrote == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fd[1]);
    ssize_t got = read(fd[0], &r, sizeof r);
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (got != (ssize_t)sizeof r || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "error: a benchmark child failed\n");
        exit(1);
    }
    return r;
}

/* sgemm's C (M, N) = A (M, K) B^T, B stored (N, K) as the model's weights,
 * on the pool's threads: C's columns in two tasks per thread, each a
 * single-threaded OpenBLAS product, as src/kernels.c splits its products. */
typedef struct { int M, N, K, cols; const float *A, *B; float *C; } SplitSgemm;

static void split_sgemm_task(void *ctx, int task) {
    const SplitSgemm *g = ctx;
    int c0 = task * g->cols, n = g->N - c0 < g->cols ? g->N - c0 : g->cols;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g->M, n, g->K, 1.0f, g->A, g->K, g->B + (size_t)c0 * g->K,
                g->K, 0.0f, g->C + c0, g->N);
}

/* One way to run the product: OpenBLAS on its own threads, or split over the pool. */
static void sgemm_once(const SplitSgemm *g, int on_pool) {
    if (on_pool) parallel_for((g->N + g->cols - 1) / g->cols, split_sgemm_task, (void *)g);
    else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g->M, g->N, g->K, 1.0f, g->A, g->K, g->B, g->K, 0.0f,
                     g->C, g->N);
}

/* sgemm GFLOP/s at (M, N, K): the better of OpenBLAS on as many threads as
 * the pool has (the pool keeps it single-threaded otherwise) and the same
 * product split over the pool, each the best of three runs of 0.2 s. */
static double sgemm_gflops(int M, int N, int K) {
    int tasks = 2 * parallel_threads();
    SplitSgemm g = {M, N, K, ((N + tasks - 1) / tasks + 15) / 16 * 16, xmalloc((size_t)M * K * sizeof(float)),
                    xmalloc((size_t)N * K * sizeof(float)), xmalloc((size_t)M * N * sizeof(float))};
    for (size_t i = 0; i < (size_t)M * K; i++) ((float *)g.A)[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)N * K; i++) ((float *)g.B)[i] = (float)(i % 7) * 0.01f;
    double best = 0;
    for (int on_pool = 0; on_pool < 2; on_pool++) {
        openblas_set_num_threads(on_pool ? 1 : parallel_threads());
        sgemm_once(&g, on_pool);  /* warm-up */
        for (int run = 0; run < 3; run++) {
            int reps = 0;
            double t0 = now_seconds(), t;
            do { sgemm_once(&g, on_pool); reps++; } while ((t = now_seconds() - t0) < 0.2);
            double gflops = 2.0 * M * N * K * reps / t / 1e9;
            if (gflops > best) best = gflops;
        }
    }
    openblas_set_num_threads(1);
    free((float *)g.A); free((float *)g.B); free(g.C);
    return best;
}

/* The streaming read: the sum of a 1 GB array, a slice per task on the
 * pool's threads, the best of five passes. */
typedef struct { const float *x; size_t per_task; double *sums; } StreamSum;

static void stream_task(void *ctx, int task) {
    const StreamSum *j = ctx;
    const float *x = j->x + (size_t)task * j->per_task;
    size_t quarter = j->per_task / 4;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;  /* four chains: one would wait on its adds */
    #pragma omp simd reduction(+:s0, s1, s2, s3)
    for (size_t i = 0; i < quarter; i++) {
        s0 += x[i]; s1 += x[i + quarter]; s2 += x[i + 2 * quarter]; s3 += x[i + 3 * quarter];
    }
    j->sums[task] = (double)s0 + s1 + s2 + s3;
}

static void stream_fill_task(void *ctx, int task) {  /* written on the threads that will read it */
    const StreamSum *j = ctx;
    float *x = (float *)j->x + (size_t)task * j->per_task;
    for (size_t i = 0; i < j->per_task; i++) x[i] = (float)(i & 7);
}

static double stream_gbs(void) {
    enum { TASKS = 64 };
    size_t n = (size_t)1 << 28;  /* 2^28 floats, 1 GB */
    double sums[TASKS], best = 0;
    StreamSum job = {xmalloc(n * sizeof(float)), n / TASKS, sums};
    parallel_for(TASKS, stream_fill_task, &job);
    for (int pass = 0; pass < 5; pass++) {
        double t0 = now_seconds();
        parallel_for(TASKS, stream_task, &job);
        double gbs = n * sizeof(float) / (now_seconds() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    double total = 0;
    for (int i = 0; i < TASKS; i++) total += sums[i];
    if (total != 3.5 * n) fprintf(stderr, "warning: the streaming read summed %.0f, not %.0f\n", total, 3.5 * n);
    free((float *)job.x);
    return best;
}

/* The bytes a decode step reads: every weight matrix and the classifier
 * (tied or not, V x D), the norms and the token's embedding row. */
static double weight_bytes_per_token(const Config *c) {
    double D = c->dim, F = c->hidden_dim, KVD = (double)c->dim / c->n_heads * c->n_kv_heads, L = c->n_layers;
    return sizeof(float) * (L * (2 * D * D + 2 * D * KVD + 3 * D * F) + (double)c->vocab_size * D + (2 * L + 2) * D);
}

/* Module fitting throughput: forward + backward of a batch of N queries
 * through one module of this size (width or pairs), as train's inner loop
 * runs it. */
static void fit_throughput(ModuleArch arch, int d, int size, int N, double *queries_per_s, double *gflops) {
    ModuleSet ms;
    moduleset_alloc(&ms, arch, 1, 1, d, 1, 1, 1, &size, 1);
    bench_values(&ms);
    ModuleWork w;
    modulework_alloc(&w, &ms, N);
    float *q = xmalloc((size_t)N * d * sizeof(float)), *a = xmalloc(N * sizeof(float));
    float *A = xmalloc((size_t)N * d * sizeof(float)), *da = xmalloc(N * sizeof(float));
    float *dA = xmalloc((size_t)N * d * sizeof(float));
    for (size_t i = 0; i < (size_t)N * d; i++) { q[i] = (float)(i % 11) * 0.1f; dA[i] = 1e-3f; }
    for (int i = 0; i < N; i++) da[i] = 1e-3f;
    int reps = 0;
    double t0 = now_seconds(), t;
    do {
        module_forward(&ms, &ms.modules[0], &w, q, N, a, A);
        module_backward(&ms, &ms.modules[0], &w, q, N, A, da, dA, NULL);
        reps++;
        t = now_seconds() - t0;
    } while (t < 0.3);
    *queries_per_s = (double)reps * N / t;
    /* a multiply-add per parameter and query: 2 FLOPs forward, 4 backward
     * (quadrature: q W^T and P Z, each p d of its 2 p d parameters) */
    *gflops = 6.0 * ms.n_params * N * reps / t / 1e9;
    free(q); free(a); free(A); free(da); free(dA);
    modulework_free(&w);
    moduleset_free(&ms);
}

#ifdef NECTAR_CUDA
/* ------------------------------------------------------------------------ */
/* The GPU. Fitting steps per second, on the GPU or the CPU: train's step
 * (regression gradients of every module at `batch` positions, clipping,
 * AdamW) over random targets. */

static double fit_steps_per_s(const Config *c, ModuleArch arch, int n, float rho, int batch, int gpu) {
    int L = c->n_layers, G = c->n_kv_heads, H = c->n_heads, D = c->dim;
    ModuleSet ms;
    bench_modules(c, arch, n, rho, 1, &ms);
    long P = 4096;
    FitTargets t = {P, xmalloc((size_t)L * P * D * sizeof(float)), xmalloc((size_t)L * P * D * sizeof(float)),
                    xmalloc((size_t)L * P * H * sizeof(float))};
    uint64_t rng = 9;
    for (size_t i = 0; i < (size_t)L * P * D; i++) { t.q[i] = rng_normal(&rng); t.A[i] = 0.3f * rng_normal(&rng); }
    for (size_t i = 0; i < (size_t)L * P * H; i++) t.alpha[i] = 2.0f * rng_normal(&rng);
    float *m = xmalloc(ms.n_params * sizeof(float)), *v = xmalloc(ms.n_params * sizeof(float));
    int steps = 0;
    double t0, elapsed;
    if (gpu) {
        ModuleSet ms_d;
        FitTargets t_d;
        ModuleWork w;
        FitBatch b;
        moduleset_upload_cuda(&ms_d, &ms, 1);
        fittargets_upload_cuda(&t_d, &t, L, D, H);
        modulework_alloc_cuda(&w, &ms, batch * H);
        fitbatch_alloc_cuda(&b, &ms, H, batch);
        float *m_d = cuda_xmalloc(ms.n_params * sizeof(float)), *v_d = cuda_xmalloc(ms.n_params * sizeof(float));
        t0 = now_seconds();
        do {  /* each step ends in a copy back (the norm): the time is the GPU's */
            for (int i = 0; i < batch; i++) b.pos[i] = rng_u32(&rng) % P;
            CUDA_CHECK(cudaMemset(ms_d.grads, 0, ms.n_params * sizeof(float)));
            regression_grads_cuda(&ms_d, &w, &b, &t_d, H, 0.1f, 1.0f);
            clip_grad_norm_cuda(ms_d.grads, ms.n_params, 1.0);
            adamw_update_cuda(ms_d.params, ms_d.grads, m_d, v_d, ms.n_params, ++steps, 1e-3f, 0.01f, ADAM_BETA2);
            elapsed = now_seconds() - t0;
        } while (elapsed < 1.0 || steps < 3);
        CUDA_CHECK(cudaDeviceSynchronize());  /* the last AdamW step */
        elapsed = now_seconds() - t0;
        CUDA_CHECK(cudaFree(m_d)); CUDA_CHECK(cudaFree(v_d));
        fitbatch_free_cuda(&b);
        modulework_free_cuda(&w);
        fittargets_free_cuda(&t_d);
        moduleset_free_cuda(&ms_d);
    } else {
        ModuleWork w;
        FitBatch b;
        modulework_alloc(&w, &ms, batch * (H / G));
        fitbatch_alloc(&b, &ms, H, batch);
        t0 = now_seconds();
        do {
            for (int i = 0; i < batch; i++) b.pos[i] = rng_u32(&rng) % P;
            memset(ms.grads, 0, ms.n_params * sizeof(float));
            regression_grads(&ms, &w, &b, &t, H, 0.1f, 1.0f);
            clip_grad_norm(ms.grads, ms.n_params, 1.0);
            adamw_update(ms.params, ms.grads, m, v, ms.n_params, ++steps, 1e-3f, 0.01f, ADAM_BETA2);
            elapsed = now_seconds() - t0;
        } while (elapsed < 1.0 || steps < 3);
        modulework_free(&w);
        fitbatch_free(&b);
    }
    free(t.q); free(t.A); free(t.alpha); free(m); free(v);
    moduleset_free(&ms);
    return steps / elapsed;
}

/* Serving on the GPU: one process (its memory is the device's), timed by
 * the wall clock; every forward_cuda ends in a copy of the logits back, so
 * the GPU's work is done when the clock stops. */

/* TTFT of the prompt and decode tokens per second after it; exits 1 after
 * forward_cuda's sentence. */
static void gpu_generate(const Model *m, const Document *doc, double *ttft_ms, double *decode_tps) {
    int prompt[PROMPT + DECODE];
    for (int i = 0; i < PROMPT + DECODE; i++) prompt[i] = 3 + (i * 37) % 250;
    RunStateCuda s;
    runstate_alloc_cuda(&s, m, doc, PROMPT, PROMPT + DECODE);
    double t0 = now_seconds();
    if (forward_cuda(m, &s, doc, prompt, PROMPT, 0, LOGITS_LAST) != 0) exit(1);
    double t1 = now_seconds();
    for (int i = 0; i < DECODE; i++)
        if (forward_cuda(m, &s, doc, &prompt[PROMPT + i], 1, PROMPT + i, LOGITS_LAST) != 0) exit(1);
    *ttft_ms = (t1 - t0) * 1e3;
    *decode_tps = DECODE / (now_seconds() - t1);
    runstate_free_cuda(&s);
}

/* The operations (nectar_cuda_ops) forward_cuda queues for one token
 * decoded after the prompt; exits 1 after forward_cuda's sentence. */
static long gpu_decode_ops(const Model *m, const Document *doc) {
    int tokens[PROMPT + 1];
    for (int i = 0; i <= PROMPT; i++) tokens[i] = 3 + (i * 37) % 250;
    RunStateCuda s;
    runstate_alloc_cuda(&s, m, doc, PROMPT, PROMPT + 1);
    if (forward_cuda(m, &s, doc, tokens, PROMPT, 0, LOGITS_LAST) != 0) exit(1);
    nectar_cuda_ops_reset();
    if (forward_cuda(m, &s, doc, &tokens[PROMPT], 1, PROMPT, LOGITS_LAST) != 0) exit(1);
    long ops = nectar_cuda_ops();
    runstate_free_cuda(&s);
    return ops;
}

/* A decode step costs about a launch's latency per operation: the count for
 * no document, the exact document (its KV cache) and Nectar modules of both
 * kinds for it, at rho 10%. */
static void gpu_decode_ops_line(const Model *m, const Document *exact) {
    const ModuleArch archs[2] = {ARCH_MLP, ARCH_QUAD};
    long nectar[2];
    for (int i = 0; i < 2; i++) {
        ModuleSet host, dev;
        bench_modules(&m->config, archs[i], exact->n, 0.10f, 0, &host);
        moduleset_upload_cuda(&dev, &host, 0);
        Document doc = {DOC_NECTAR, exact->n, NULL, &dev, NULL};
        nectar[i] = gpu_decode_ops(m, &doc);
        moduleset_free_cuda(&dev);
        moduleset_free(&host);
    }
    printf("operations per decoded token (kernel launches, copies, cuBLAS calls): no document %ld, exact %ld, "
           "Nectar MLP %ld, Nectar quadrature %ld\n", gpu_decode_ops(m, &NO_DOCUMENT), gpu_decode_ops(m, exact),
           nectar[0], nectar[1]);
}

/* cuBLAS sgemm GFLOP/s for C (M, N) = A (M, K) B^T, as matmul_cuda runs it */
static double cublas_gflops(int M, int N, int K) {
    float *A = cuda_xmalloc((size_t)M * K * sizeof(float)), *B = cuda_xmalloc((size_t)N * K * sizeof(float));
    float *C = cuda_xmalloc((size_t)M * N * sizeof(float));
    matmul_cuda(M, K, N, A, B, 0.0f, C);  /* warm-up */
    CUDA_CHECK(cudaDeviceSynchronize());
    int reps = 1;
    double t;
    do {
        double t0 = now_seconds();
        for (int r = 0; r < reps; r++) matmul_cuda(M, K, N, A, B, 0.0f, C);
        CUDA_CHECK(cudaDeviceSynchronize());
        t = now_seconds() - t0;
        reps *= 2;
    } while (t < 0.2);
    CUDA_CHECK(cudaFree(A)); CUDA_CHECK(cudaFree(B)); CUDA_CHECK(cudaFree(C));
    return 2.0 * M * N * K * (reps / 2) / t / 1e9;
}

/* The two attention kernels on one prefill block (BLOCK queries, one head
 * of size d) over the longest document's keys. */
static void gpu_attention_kernels(int d, int longest) {
    float *q = cuda_xmalloc((size_t)BLOCK * d * sizeof(float)), *kv = cuda_xmalloc((size_t)longest * d * sizeof(float));
    float *A = cuda_xmalloc((size_t)BLOCK * d * sizeof(float)), *lse = cuda_xmalloc(BLOCK * sizeof(float));
    float *scores = cuda_xmalloc((size_t)BLOCK * longest * sizeof(float));
    double kernel_ms[2];
    for (int version = 0; version < 2; version++) {
        int reps = 0;
        double t0 = now_seconds();
        do {
            if (version == 0) attention_states_cuda(BLOCK, longest, d, q, d, kv, kv, d, longest, A, d, lse, 1, scores);
            else attention_states_v2_cuda(BLOCK, longest, d, q, d, kv, kv, d, longest, A, d, lse, 1, scores);
            CUDA_CHECK(cudaDeviceSynchronize());
            reps++;
        } while (now_seconds() - t0 < 0.3);
        kernel_ms[version] = (now_seconds() - t0) / reps * 1e3;
    }
    printf("\nattention of a %d-query block over %d keys, one head of size %d: v1 (a block per query) %.2f ms, "
           "v2 (cuBLAS + softmax kernel) %.2f ms\n", BLOCK, longest, d, kernel_ms[0], kernel_ms[1]);
    float *bufs[] = {q, kv, A, lse, scores};
    for (int i = 0; i < 5; i++) CUDA_CHECK(cudaFree(bufs[i]));
}

/* Fitting: the rho 10% modules of the longest document, train's batch, on
 * the GPU against the CPU. */
static void gpu_fitting(const Config *c, ModuleArch arch, int longest) {
    int batch = 64;
    double gpu_steps = fit_steps_per_s(c, arch, longest, 0.10f, batch, 1);
    double cpu_steps = fit_steps_per_s(c, arch, longest, 0.10f, batch, 0);
    double queries = (double)batch * c->n_heads * c->n_layers;  /* module queries per step */
    printf("module fitting (rho 10%% of %d tokens: %s %d, %d modules; batch %d positions = %.0f module queries "
           "a step, forward + backward + AdamW): GPU %.1f steps/s (%.0f queries/s), CPU %.1f steps/s (%.0f queries/s): "
           "GPU %.1fx the CPU\n", longest, arch == ARCH_MLP ? "width" : "pairs", module_size(c, arch, longest, 0.10f),
           c->n_layers * c->n_kv_heads, batch, queries, gpu_steps, gpu_steps * queries, cpu_steps, cpu_steps * queries, gpu_steps / cpu_steps);
    printf("the plain recipe's 6000 steps: %.0f s on the GPU, %.0f s on the CPU\n", 6000 / gpu_steps, 6000 / cpu_steps);
}

static int bench_gpu(const Model *host, const char *model_path, ModuleArch arch, int min_doc, int max_doc) {
    if (nectar_cuda_init() != 0) return 1;
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    Model m;
    model_upload_cuda(&m, host);
    const Config *c = &m.config;
    int d = c->dim / c->n_heads;
    double t_start = now_seconds();
    double g_qkvo = cublas_gflops(BLOCK, c->dim, c->dim), g_ffn = cublas_gflops(BLOCK, c->hidden_dim, c->dim);
    double w_qkvo = 2.0 * c->dim * c->dim + 2.0 * c->dim * d * c->n_kv_heads, w_ffn = 3.0 * c->dim * c->hidden_dim;
    double sgemm = (w_qkvo + w_ffn) / (w_qkvo / g_qkvo + w_ffn / g_ffn);
    double ttft, tps;
    /* warm-up: kernels loaded and cuBLAS ready for every shape the table
     * times, so its first row pays for none of it */
    int *warm_ids = bench_document(2 * BLOCK);
    DocCache warm;
    if (doccache_build_cuda(&warm, &m, warm_ids, 2 * BLOCK, BLOCK) != 0) return 1;
    free(warm_ids);
    Document warm_doc = {DOC_EXACT, 2 * BLOCK, &warm, NULL, NULL};
    gpu_generate(&m, &warm_doc, &ttft, &tps);
    gpu_generate(&m, &NO_DOCUMENT, &ttft, &tps);
    printf("GPU: %s; model %s: dim %d, hidden %d, %d layers, %d/%d heads, head size %d, context %d\n", prop.name,
           model_path, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, d, c->seq_len);
    printf("cuBLAS sgemm (fp32), %d x (%d x %d) and %d x (%d x %d): %.0f and %.0f GFLOP/s; at the prefill's mix %.0f GFLOP/s\n",
           BLOCK, c->dim, c->dim, BLOCK, c->hidden_dim, c->dim, g_qkvo, g_ffn, sgemm);
    gpu_decode_ops_line(&m, &warm_doc);
    doccache_free_cuda(&warm);
    if (max_doc > c->seq_len)
        printf("note: documents beyond the model's context (%d) are for timing only (RoPE runs past it)\n", c->seq_len);
    printf("prompt %d tokens, then %d decoded; Nectar modules are %s\n\n", PROMPT, DECODE, modules_named(arch));
    printf("| doc tokens | TTFT full prefill | TTFT reused KV | TTFT Nectar 2%% | prefill GFLOP/s (of sgemm) "
           "| decode tok/s exact | Nectar 2%% | Nectar 10%% | no doc | KV state | module 10%% |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    int longest = min_doc;
    Progress progress = {"GPU, ", t_start, 0, 0, 0};
    for (int n = min_doc; n <= max_doc; n *= 2) {
        int *doc_ids = bench_document(n);
        progress_size_starts(&progress, n, max_doc);
        DocCache cache;
        double t0 = now_seconds();
        if (doccache_build_cuda(&cache, &m, doc_ids, n, BLOCK) != 0) return 1;
        double prefill_s = now_seconds() - t0;
        Document exact = {DOC_EXACT, n, &cache, NULL, NULL};
        double ttft_reused, tps_exact, ttft_n2, tps_n2, ttft_n10, tps_n10, ttft_none, tps_none;
        gpu_generate(&m, &exact, &ttft_reused, &tps_exact);
        double ttft_full = prefill_s * 1e3 + ttft_reused;
        double gflops = (forward_flops(c, n, 0, 0) + forward_flops(c, PROMPT, n, 1)) / (ttft_full / 1e3) / 1e9;
        doccache_free_cuda(&cache);
        ModuleSet h2, d2, h10, d10;
        bench_modules(c, arch, n, 0.02f, 0, &h2);
        bench_modules(c, arch, n, 0.10f, 0, &h10);
        moduleset_upload_cuda(&d2, &h2, 0);
        moduleset_upload_cuda(&d10, &h10, 0);
        Document nectar2 = {DOC_NECTAR, n, NULL, &d2, NULL}, nectar10 = {DOC_NECTAR, n, NULL, &d10, NULL};
        gpu_generate(&m, &nectar2, &ttft_n2, &tps_n2);
        gpu_generate(&m, &nectar10, &ttft_n10, &tps_n10);
        gpu_generate(&m, &NO_DOCUMENT, &ttft_none, &tps_none);
        double kv_mb = 2.0 * sizeof(float) * c->n_layers * n * d * c->n_kv_heads / 1e6;
        printf("| %d | %.1f ms | %.2f ms | %.2f ms | %.0f (%.0f%%) | %.0f | %.0f (%.2fx no doc) | %.0f (%.2fx) | %.0f "
               "| %.2f MB | %.2f MB |\n", n, ttft_full, ttft_reused, ttft_n2, gflops, 100 * gflops / sgemm, tps_exact,
               tps_n2, tps_n2 / tps_none, tps_n10, tps_n10 / tps_none, tps_none, kv_mb, h10.n_params * 4 / 1e6);
        fflush(stdout);
        moduleset_free_cuda(&d2); moduleset_free_cuda(&d10);
        moduleset_free(&h2); moduleset_free(&h10);
        free(doc_ids);
        longest = n;
        progress_size_ends(&progress);
    }
    gpu_attention_kernels(d, longest);
    fprintf(stderr, "fitting throughput ... (%.0fs so far)\n", now_seconds() - t_start);
    gpu_fitting(c, arch, longest);
    fprintf(stderr, "GPU bench took %.0f s\n", now_seconds() - t_start);
    model_free_cuda(&m);
    nectar_cuda_free();
    return 0;
}
#endif

static void usage(FILE *f) {
    fprintf(f, "usage: benchmark -m MODEL [--max-doc N] [--min-doc N] [--arch mlp|quad] [--json] [--gpu]\n"
               "  -m MODEL  a llama2.c checkpoint or GGUF file whose vocabulary holds ids 0..258\n"
               "  document lengths from --min-doc (default 1024) to --max-doc (default 65536), doubling; then\n"
               "  compositions of 1 to 3 documents (CPU) of the longest of those lengths of which 3 fit\n"
               "  --max-doc and the model's context (else --min-doc)\n"
               "  --arch    the Nectar modules timed: MLPs (1,1,1) of the width rho allows (mlp, the default)\n"
               "            or quadrature modules of floor(rho n) pairs (quad)\n"
               "  --json    one JSON object on stdout instead of the tables (CPU)\n"
               "  --gpu     on the GPU (a build with nvcc), with fitting on the GPU against the CPU\n"
               "  --help    this text\n");
}

typedef struct {
    const char *model_path;
    int min_doc, max_doc, gpu, json;
    ModuleArch arch;  /* the Nectar modules timed */
} Options;

static int parse_options(int argc, char **argv, Options *o) {
    *o = (Options){NULL, 1024, 65536, 0, 0, ARCH_MLP};
    SeenOptions seen = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); exit(0); }
        if (option_once(&seen, argv[i]) != 0) return -1;
        if (!strcmp(argv[i], "--gpu")) { o->gpu = 1; continue; }
        if (!strcmp(argv[i], "--json")) { o->json = 1; continue; }
        if (i + 1 >= argc) { report_last_option(argv[i], " -m --max-doc --min-doc --arch "); return -1; }
        const char *a = argv[i], *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "-m")) o->model_path = v;
        else if (!strcmp(a, "--max-doc")) bad = parse_int_option(a, v, &o->max_doc);
        else if (!strcmp(a, "--min-doc")) bad = parse_int_option(a, v, &o->min_doc);
        else if (!strcmp(a, "--arch") && (!strcmp(v, "mlp") || !strcmp(v, "quad")))
            o->arch = !strcmp(v, "mlp") ? ARCH_MLP : ARCH_QUAD;
        else if (!strcmp(a, "--arch")) { fprintf(stderr, "error: --arch is mlp or quad, not '%s'\n", v); return -1; }
        else { fprintf(stderr, "error: unknown option '%s' (see --help)\n", a); return -1; }
        if (bad) return -1;
    }
    if (!o->model_path || o->min_doc < 1 || o->max_doc < o->min_doc || o->max_doc > MAX_DOC) {
        fprintf(stderr, "error: need -m MODEL and 1 <= --min-doc <= --max-doc <= %d\n", MAX_DOC);
        return -1;
    }
    if (o->gpu && o->json) {
        fprintf(stderr, "error: --json is for the CPU tables, not --gpu\n");
        return -1;
    }
    return 0;
}

/* The composition table's document length: the longest of the serving
 * table's (min_doc, 2 min_doc, ... max_doc) whose COMPOSED documents fit
 * --max-doc, and with the prompt and the decode the model's context; the
 * shortest if none does (then for timing only, as the serving table's
 * documents beyond the context). */
static int composition_doc(const Config *c, const Options *o) {
    int best = o->min_doc;
    for (long n = o->min_doc; n <= o->max_doc; n *= 2)
        if (COMPOSED * n <= o->max_doc && COMPOSED * n + PROMPT + DECODE <= c->seq_len) best = (int)n;
    return best;
}

/* The model can run the benchmark's tokens, its smallest document fits a
 * module at rho 2%, and (on the CPU) its longest KV cache, and the
 * composition's caches, fit in half of memory. */
static int check_sizes(const Model *m, const Options *o) {
    const Config *c = &m->config;
    if (c->vocab_size < 259) {  /* bench_document's ids */
        fprintf(stderr, "error: the benchmark's tokens are ids up to 258, but %s has a vocabulary of %d\n",
                o->model_path, c->vocab_size);
        return -1;
    }
    int shortest = 1;  /* the shortest document a module at rho 2%, the table's smallest, fits */
    while (shortest < MAX_DOC && module_size(c, o->arch, shortest, 0.02f) < 1) shortest++;
    if (o->min_doc < shortest) {
        fprintf(stderr, "error: --min-doc %d is too short for a module at rho 2%% of %s; use at least %d\n",
                o->min_doc, o->model_path, shortest);
        return -1;
    }
    /* the full-prefill and reused-cache runs hold the longest document's KV
     * cache, or the composition's COMPOSED caches; refuse one that needs
     * more than half of memory (it would swap) */
    int composed = composition_doc(c, o);
    double longest = kv_bytes(c, o->max_doc), composition = COMPOSED * kv_bytes(c, composed);
    double memory = (double)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE);
    if (!o->gpu && 2 * longest > memory) {
        fprintf(stderr, "error: a document of %d tokens has a KV cache of %.1f GB, more than half of this machine's "
                "%.1f GB; lower --max-doc\n", o->max_doc, longest / 1e9, memory / 1e9);
        return -1;
    }
    if (!o->gpu && 2 * composition > memory) {
        fprintf(stderr, "error: %d documents of %d tokens have KV caches of %.1f GB, more than half of this "
                "machine's %.1f GB; lower --min-doc\n", COMPOSED, composed, composition / 1e9, memory / 1e9);
        return -1;
    }
    return 0;
}

/* What the CPU tables are measured against, all in this run. */
typedef struct {
    int threads;
    double stream_gbs;             /* streaming read */
    double weight_bytes;           /* read by a decode step */
    double g_qkvo, g_ffn, sgemm;   /* sgemm at the attention and FFN shapes, and at their mix */
    double block_gflops;           /* the model's prefill of BLOCK-token blocks without earlier context */
} References;

/* One document size: the five configurations, and the streaming read and
 * sgemm mix measured just before and just after them (the better of the
 * two: on a machine others use too, the reference of a row is taken under
 * the load its measures had). */
typedef struct { int n; Measure full, reused, n2, n10, none; double stream_gbs, sgemm; } Row;

/* The roofline: decode tokens per second if every byte it reads (weights,
 * and the document's KV cache for the exact path) came at the streaming
 * read's bandwidth. */
static double roofline_tps(double stream_gbs, double weight_bytes, const Config *c, int doc_n) {
    return stream_gbs * 1e9 / (weight_bytes + kv_bytes(c, doc_n));
}

/* sgemm at the prefill's mix of shapes: the attention projections and the
 * FFN, B = BLOCK rows, weighted by their FLOPs; *g_qkvo, *g_ffn: each shape's. */
static double sgemm_mix(const Config *c, double *g_qkvo, double *g_ffn) {
    int d = c->dim / c->n_heads;
    *g_qkvo = sgemm_gflops(BLOCK, c->dim, c->dim);
    *g_ffn = sgemm_gflops(BLOCK, c->hidden_dim, c->dim);
    double w_qkvo = 2.0 * c->dim * c->dim + 2.0 * c->dim * d * c->n_kv_heads, w_ffn = 3.0 * c->dim * c->hidden_dim;
    return (w_qkvo + w_ffn) / (w_qkvo / *g_qkvo + w_ffn / *g_ffn);
}

/* The streaming read, sgemm at the prefill's mix of shapes, and the
 * model's prefill of BLOCK-token blocks without earlier context (the weight
 * matmuls dominate). */
static References cpu_references(const Model *m) {
    const Config *c = &m->config;
    References r = {parallel_threads(), stream_gbs(), weight_bytes_per_token(c), 0, 0, 0, 0};
    r.sgemm = sgemm_mix(c, &r.g_qkvo, &r.g_ffn);
    RunState block_state;
    runstate_alloc(&block_state, m, &NO_DOCUMENT, BLOCK, BLOCK);
    int *block = xmalloc(BLOCK * sizeof(int));
    for (int i = 0; i < BLOCK; i++) block[i] = 3 + (i * 17) % 250;
    if (forward(m, &block_state, &NO_DOCUMENT, block, BLOCK, 0, LOGITS_LAST) != 0) exit(1);  /* warm-up */
    int n_blocks = 0;
    double t_blocks = now_seconds();
    while (now_seconds() - t_blocks < 0.5 || n_blocks < 4) {
        forward(m, &block_state, &NO_DOCUMENT, block, BLOCK, 0, LOGITS_LAST);
        n_blocks++;
    }
    r.block_gflops = n_blocks * forward_flops(c, BLOCK, 0, 1) / (now_seconds() - t_blocks) / 1e9;
    runstate_free(&block_state);
    free(block);
    return r;
}

static void print_references(const Model *m, const Options *o, const References *r) {
    const Config *c = &m->config;
    int d = c->dim / c->n_heads;
    printf("model %s: dim %d, hidden %d, %d layers, %d/%d heads, head size %d, context %d, vocabulary %d\n",
           o->model_path, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, d, c->seq_len, c->vocab_size);
    printf("%d threads (the pool; OpenBLAS single-threaded in its tasks)\n", r->threads);
    printf("streaming read (sum of a 1 GB array, %d threads): %.1f GB/s; a decode step reads %.1f MB of weights "
           "(+ %.3f MB of KV cache per document token): roofline with no document %.1f tokens/s\n", r->threads,
           r->stream_gbs, r->weight_bytes / 1e6, kv_bytes(c, 1) / 1e6, roofline_tps(r->stream_gbs, r->weight_bytes, c, 0));
    printf("sgemm (the better of OpenBLAS on %d threads and split over the pool), %d x (%d x %d) and %d x (%d x %d): "
           "%.1f and %.1f GFLOP/s; at the prefill's mix %.1f GFLOP/s\n", r->threads, BLOCK, c->dim, c->dim, BLOCK, c->hidden_dim, c->dim, r->g_qkvo, r->g_ffn, r->sgemm);
    printf("prefill of %d-token blocks without earlier context: %.1f GFLOP/s = %.0f%% of sgemm\n", BLOCK,
           r->block_gflops, 100 * r->block_gflops / r->sgemm);
    if (o->max_doc > c->seq_len)
        printf("note: documents beyond the model's context (%d) are for timing only (RoPE runs past it)\n", c->seq_len);
    printf("prompt %d tokens, then %d decoded; Nectar modules are %s; "
           "each row's references (streaming read, sgemm mix) are measured again around its runs; decode tok/s from "
           "the median step (robust to other processes' preemptions; the mean is in --json); \"of roofline\": "
           "decode speed over the roofline with that document's KV cache\n\n", PROMPT, DECODE,
           modules_named(o->arch));
    printf("| doc tokens | TTFT full prefill | TTFT reused KV | TTFT Nectar 2%% | prefill GFLOP/s (of sgemm) "
           "| decode tok/s exact (of roofline) | Nectar 2%% | Nectar 10%% | no doc (of roofline) | exact ms/token "
           "| peak MB full / reused / Nectar 2%% / 10%% / no doc | KV state | module 2%% | module 10%% "
           "| stream GB/s, sgemm GFLOP/s |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

static void print_row(const Config *c, const References *r, const Row *w) {
    double exact_roof = roofline_tps(w->stream_gbs, r->weight_bytes, c, w->n);
    double nodoc_roof = roofline_tps(w->stream_gbs, r->weight_bytes, c, 0);
    printf("| %d | %.1f ms | %.2f ms | %.2f ms | %.1f (%.0f%%) | %.1f (%.2f) | %.1f (%.2fx no doc) | %.1f (%.2fx) "
           "| %.1f (%.2f) | %.3f | %.0f / %.0f / %.0f / %.0f / %.0f | %.2f MB | %.2f MB | %.2f MB | %.1f, %.1f |\n",
           w->n, w->full.ttft_ms, w->reused.ttft_ms, w->n2.ttft_ms, w->full.prefill_gflops,
           100 * w->full.prefill_gflops / w->sgemm, w->reused.decode_tps, w->reused.decode_tps / exact_roof,
           w->n2.decode_tps, w->n2.decode_tps / w->none.decode_tps, w->n10.decode_tps, w->n10.decode_tps / w->none.decode_tps,
           w->none.decode_tps, w->none.decode_tps / nodoc_roof, 1e3 / w->reused.decode_tps, w->full.peak_mb,
           w->reused.peak_mb, w->n2.peak_mb, w->n10.peak_mb, w->none.peak_mb, w->full.state_bytes / 1e6,
           w->n2.state_bytes / 1e6, w->n10.state_bytes / 1e6, w->stream_gbs, w->sgemm);
    fflush(stdout);
}

/* The row's references: the better of before and after its runs. */
static void row_references(const Config *c, Row *w, int after) {
    double g_qkvo, g_ffn, stream = stream_gbs(), sgemm = sgemm_mix(c, &g_qkvo, &g_ffn);
    if (!after || stream > w->stream_gbs) w->stream_gbs = stream;
    if (!after || sgemm > w->sgemm) w->sgemm = sgemm;
}

/* The serving table, a row per document size, every configuration in a
 * child process (printed as it comes unless the output is JSON). Returns
 * the number of rows. */
static int cpu_table(const Model *m, const Options *o, const References *r, Row *rows) {
    Progress progress = {"", now_seconds(), 0, 0, 0};
    int n_rows = 0;
    for (int n = o->min_doc; n <= o->max_doc; n *= 2) {
        int *doc_ids = bench_document(n);
        progress_size_starts(&progress, n, o->max_doc);
        Row *w = &rows[n_rows++];
        w->n = n;
        row_references(&m->config, w, 0);
        w->full = measure(m, (RunSpec){RUN_FULL_PREFILL, n, 1, o->arch, 0}, doc_ids);
        w->reused = measure(m, (RunSpec){RUN_REUSED_CACHE, n, 1, o->arch, 0}, doc_ids);
        w->n2 = measure(m, (RunSpec){RUN_NECTAR, n, 1, o->arch, 0.02f}, doc_ids);
        w->n10 = measure(m, (RunSpec){RUN_NECTAR, n, 1, o->arch, 0.10f}, doc_ids);
        w->none = measure(m, (RunSpec){RUN_NO_DOC, n, 0, o->arch, 0}, doc_ids);
        row_references(&m->config, w, 1);
        if (!o->json) print_row(&m->config, r, w);
        free(doc_ids);
        progress_size_ends(&progress);
        if (n > o->max_doc / 2) break;  /* n * 2 would pass max_doc (or overflow) */
    }
    return n_rows;
}

/* The composition table: 1 .. COMPOSED documents of n tokens each before
 * the prompt, exact (each document's KV cache prefilled on its own: the
 * prefill, and TTFT with the caches reused) against Nectar (each
 * document's modules at rho 10%), and no document, in this run. */
typedef struct { int n_docs; Measure full, reused, n10; } ComposedRow;  /* full: for the caches' prefill */
typedef struct { int n; Measure none; ComposedRow rows[COMPOSED]; } Composition;

static void print_composition_header(const Config *c, const Options *o, int n) {
    printf("\ncomposition: 1 to %d documents of %d tokens each before the prompt, document i at the positions after "
           "documents 1 .. i-1; exact: each document's KV cache prefilled on its own at positions 0 .. %d, read at its "
           "offset (TTFT with the caches already there, as \"reused KV\"; their prefill beside it); Nectar: each "
           "document's modules at rho 10%% (%s), read at its offset; the same prompt and decode; no document in this "
           "run\n", COMPOSED, n, n - 1, modules_named(o->arch));
    if (COMPOSED * n + PROMPT + DECODE > c->seq_len)
        printf("note: %d documents of %d tokens pass the model's context (%d): for timing only (RoPE runs past it)\n",
               COMPOSED, n, c->seq_len);
    printf("| documents | doc tokens in all | prefill of the KV caches | TTFT exact (reused KV) | TTFT Nectar 10%% "
           "| Nectar / exact | decode tok/s exact (of no doc) | Nectar 10%% (of no doc) | Nectar / exact | KV state "
           "| modules 10%% |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
}

static void print_composed_row(const Composition *t, const ComposedRow *w) {
    const Measure *e = &w->reused, *x = &w->n10;
    double none = t->none.decode_tps;
    printf("| %d | %d | %.1f ms | %.2f ms | %.2f ms | %.2fx | %.1f (%.2fx) | %.1f (%.2fx) | %.2fx | %.2f MB "
           "| %.2f MB |\n", w->n_docs, w->n_docs * t->n, w->full.prefill_ms, e->ttft_ms, x->ttft_ms,
           x->ttft_ms / e->ttft_ms, e->decode_tps, e->decode_tps / none, x->decode_tps, x->decode_tps / none,
           x->decode_tps / e->decode_tps, e->state_bytes / 1e6, x->state_bytes / 1e6);
    fflush(stdout);
}

/* Every configuration in a child process, printed as it comes unless the
 * output is JSON; progress on stderr, its time since t_start. */
static void composition_table(const Model *m, const Options *o, double t_start, Composition *t) {
    t->n = composition_doc(&m->config, o);
    int n = t->n, *doc_ids = bench_document(n);
    if (!o->json) print_composition_header(&m->config, o, n);
    fprintf(stderr, "composition, no document ... (%.0fs so far)\n", now_seconds() - t_start);
    t->none = measure(m, (RunSpec){RUN_NO_DOC, n, 0, o->arch, 0}, doc_ids);
    if (!o->json)
        printf("| 0 (no document) | 0 | - | %.2f ms | - | - | %.1f | - | - | - | - |\n", t->none.ttft_ms,
               t->none.decode_tps);
    for (int k = 0; k < COMPOSED; k++) {
        ComposedRow *w = &t->rows[k];
        w->n_docs = k + 1;
        fprintf(stderr, "composition of %d document%s of %d tokens ... (%.0fs so far)\n", w->n_docs,
                w->n_docs > 1 ? "s" : "", n, now_seconds() - t_start);
        w->full = measure(m, (RunSpec){RUN_FULL_PREFILL, n, w->n_docs, o->arch, 0}, doc_ids);
        w->reused = measure(m, (RunSpec){RUN_REUSED_CACHE, n, w->n_docs, o->arch, 0}, doc_ids);
        w->n10 = measure(m, (RunSpec){RUN_NECTAR, n, w->n_docs, o->arch, 0.10f}, doc_ids);
        if (!o->json) print_composed_row(t, w);
    }
    free(doc_ids);
}

/* Module fitting's throughput for the rho 10% module of the longest
 * document, and the amortisation of a 6000-step fit (train's plain
 * recipe) against the per-request cost of the full prefill and of a reused
 * KV cache. */
typedef struct {
    ModuleArch arch;
    int size, batch, longest;  /* size: width or pairs */
    int sgemm_k;               /* the reference product (batch x size x sgemm_k): an MLP's hidden layer, or q W^T */
    double queries_per_s, gflops, sgemm_gflops, fit_seconds;
    double per_request[3];  /* full prefill, reused KV cache, Nectar: seconds */
} Fitting;

static Fitting fitting_and_amortisation(const Config *c, ModuleArch arch, const Row *longest) {
    int d = c->dim / c->n_heads, size = module_size(c, arch, longest->n, 0.10f);
    Fitting f = {arch, size, 64 * (c->n_heads / c->n_kv_heads), longest->n, arch == ARCH_MLP ? size : d,
                 0, 0, 0, 0, {0}};
    fit_throughput(arch, d, f.size, f.batch, &f.queries_per_s, &f.gflops);
    f.sgemm_gflops = sgemm_gflops(f.batch, f.size, f.sgemm_k);
    /* the plain recipe's 6000 steps of 64 positions, every query head of a
     * group; requests of PROMPT prompt + 64 generated tokens */
    f.fit_seconds = 6000.0 * f.batch * c->n_layers * c->n_kv_heads / f.queries_per_s;
    const Measure *m[3] = {&longest->full, &longest->reused, &longest->n10};
    for (int k = 0; k < 3; k++) f.per_request[k] = m[k]->ttft_ms / 1e3 + 64 / m[k]->decode_mean_tps;
    return f;
}

static void print_fitting(const Config *c, const Fitting *f) {
    printf("\nmodule fitting (%s %d, batch %d queries, forward + backward): %.0f queries/s, %.2f GFLOP/s = %.0f%% "
           "of sgemm at %d x (%d x %d) (%.1f GFLOP/s)\n", f->arch == ARCH_MLP ? "MLP of width" : "quadrature of pairs",
           f->size, f->batch, f->queries_per_s, f->gflops, 100 * f->gflops / f->sgemm_gflops, f->batch, f->size,
           f->sgemm_k, f->sgemm_gflops);
    printf("amortisation at %d tokens (rho 10%%, 6000 steps x %d queries x %d modules = %.0f s of fitting, not counting "
           "the teacher pass; requests of %d prompt + 64 generated tokens):\n", f->longest, f->batch,
           c->n_layers * c->n_kv_heads, f->fit_seconds, PROMPT);
    const double *p = f->per_request;
    printf("  per request: full prefill %.3f s, reused KV cache %.3f s, Nectar %.3f s\n", p[0], p[1], p[2]);
    if (p[0] > p[2])
        printf("  break-even against full prefill after %.0f requests\n", ceil(f->fit_seconds / (p[0] - p[2])));
    else
        printf("  against full prefill Nectar saves no time per request: no break-even\n");
    if (p[1] > p[2])
        printf("  break-even against a reused KV cache after %.0f requests\n", ceil(f->fit_seconds / (p[1] - p[2])));
    else
        printf("  against a reused KV cache Nectar saves no time per request: no break-even (it saves memory only)\n");
}

/* Many prompts in one forward: ROLLOUTS greedy rollouts of DECODE tokens
 * after PROMPT-token prompts and a document of n tokens, one at a time and
 * all in one batch (rollouts: each decode step one forward of every
 * sequence, one matrix product per weight); generated tokens/s of each,
 * the prompts' prefill included. */
enum { ROLLOUTS = 16 };
typedef struct { int n; double one_tps, batch_tps; } Batching;

static Batching batched_rollouts(const Model *m, int n) {
    Batching b = {n, 0, 0};
    int *doc_ids = bench_document(n), *prompts = xmalloc(ROLLOUTS * PROMPT * sizeof(int));  /* (ROLLOUTS, PROMPT) */
    int *answers = xmalloc(ROLLOUTS * DECODE * sizeof(int));                                /* (ROLLOUTS, DECODE) */
    for (int i = 0; i < ROLLOUTS * PROMPT; i++) prompts[i] = 3 + (int)((i * 40503u) % 256u);
    DocCache cache;
    if (doccache_build(&cache, m, doc_ids, n, 256) != 0) exit(1);
    Document doc = {DOC_EXACT, n, &cache, NULL, NULL};
    const int no_stop[2] = {-1, -1};
    Rollout r[ROLLOUTS];
    const int batch_sizes[2] = {1, ROLLOUTS};
    double tps[2];  /* generated tokens/s, each prompt's prefill included */
    for (int k = 0; k < 2; k++) {
        int batch = batch_sizes[k];
        RunState s;
        runstate_alloc_seqs(&s, m, &doc, PROMPT * batch, PROMPT + DECODE, batch);
        double t0 = now_seconds();
        for (int first = 0; first < ROLLOUTS; first += batch) {
            for (int j = 0; j < batch; j++)
                r[j] = (Rollout){prompts + (first + j) * PROMPT, PROMPT, DECODE, answers + (first + j) * DECODE, 0};
            if (rollouts(m, &s, &doc, no_stop, NULL, r, batch) != 0) exit(1);
        }
        tps[k] = ROLLOUTS * DECODE / (now_seconds() - t0);
        runstate_free(&s);
    }
    b.one_tps = tps[0];
    b.batch_tps = tps[1];
    doccache_free(&cache);
    free(doc_ids); free(prompts); free(answers);
    return b;
}

static void print_batching(const Batching *b) {
    printf("many prompts in one forward: %d greedy rollouts of %d tokens after %d-token prompts and a %d-token "
           "document: one at a time %.1f tokens/s, all %d in one forward a step %.1f tokens/s (%.1fx)\n", ROLLOUTS,
           DECODE, PROMPT, b->n, b->one_tps, ROLLOUTS, b->batch_tps, b->batch_tps / b->one_tps);
}

static void print_measure_json(const char *name, const Measure *m, const char *end) {
    printf("\"%s\": {\"ttft_ms\": %.4g, \"decode_tps\": %.4g, \"decode_mean_tps\": %.4g, \"peak_mb\": %.4g, "
           "\"state_bytes\": %.0f}%s", name, m->ttft_ms, m->decode_tps, m->decode_mean_tps, m->peak_mb, m->state_bytes,
           end);
}

/* The composition table's fields: its no-document run, and a row per
 * number of documents (the last of the object's fields). */
static void print_composition_json(const Composition *t) {
    printf(" ");
    print_measure_json("composition_no_doc", &t->none, ",\n");
    printf(" \"composition\": [\n");
    for (int k = 0; k < COMPOSED; k++) {
        const ComposedRow *w = &t->rows[k];
        const Measure *e = &w->reused, *x = &w->n10;
        printf("  {\"documents\": %d, \"doc_tokens\": %d, \"prefill_ms\": %.4g, \"nectar10_over_exact_ttft\": %.4g, "
               "\"nectar10_over_exact_decode\": %.4g, \"exact_of_nodoc\": %.4g, \"nectar10_of_nodoc\": %.4g,\n   ",
               w->n_docs, t->n, w->full.prefill_ms, x->ttft_ms / e->ttft_ms, x->decode_tps / e->decode_tps,
               e->decode_tps / t->none.decode_tps, x->decode_tps / t->none.decode_tps);
        print_measure_json("full_prefill", &w->full, ", ");
        print_measure_json("reused_kv", e, ",\n   ");
        print_measure_json("nectar10", x, k + 1 < COMPOSED ? "},\n" : "}\n");
    }
    printf(" ]\n");
}

static void print_json(const Model *m, const Options *o, const References *r, const Row *rows, int n_rows,
                       const Fitting *f, const Batching *b, const Composition *t) {
    const Config *c = &m->config;
    printf("{\"model\": \"%s\", \"arch\": \"%s\", \"dim\": %d, \"hidden_dim\": %d, \"n_layers\": %d, \"n_heads\": %d, "
           "\"n_kv_heads\": %d, \"vocab_size\": %d, \"seq_len\": %d, \"prompt_tokens\": %d, \"decode_tokens\": %d,\n",
           o->model_path, o->arch == ARCH_MLP ? "mlp" : "quad", c->dim, c->hidden_dim, c->n_layers, c->n_heads,
           c->n_kv_heads, c->vocab_size, c->seq_len, PROMPT, DECODE);
    printf(" \"threads\": %d, \"stream_gbs\": %.4g, \"weight_bytes_per_token\": %.0f, \"kv_bytes_per_doc_token\": %.0f, "
           "\"roofline_nodoc_tps\": %.4g,\n", r->threads, r->stream_gbs, r->weight_bytes, kv_bytes(c, 1),
           roofline_tps(r->stream_gbs, r->weight_bytes, c, 0));
    printf(" \"sgemm_qkvo_gflops\": %.4g, \"sgemm_ffn_gflops\": %.4g, \"sgemm_gflops\": %.4g, \"block_prefill_gflops\": %.4g,\n",
           r->g_qkvo, r->g_ffn, r->sgemm, r->block_gflops);
    printf(" \"rows\": [\n");
    for (int i = 0; i < n_rows; i++) {
        const Row *w = &rows[i];
        double exact_roof = roofline_tps(w->stream_gbs, r->weight_bytes, c, w->n);
        double nodoc_roof = roofline_tps(w->stream_gbs, r->weight_bytes, c, 0);
        printf("  {\"doc_tokens\": %d, \"stream_gbs\": %.4g, \"sgemm_gflops\": %.4g, \"prefill_gflops\": %.4g, "
               "\"prefill_of_sgemm\": %.4g, \"roofline_exact_tps\": %.4g, \"exact_of_roofline\": %.4g, "
               "\"roofline_nodoc_tps\": %.4g, \"nodoc_of_roofline\": %.4g, \"nectar2_of_nodoc\": %.4g, "
               "\"nectar10_of_nodoc\": %.4g,\n   ", w->n, w->stream_gbs, w->sgemm, w->full.prefill_gflops,
               w->full.prefill_gflops / w->sgemm, exact_roof, w->reused.decode_tps / exact_roof, nodoc_roof,
               w->none.decode_tps / nodoc_roof, w->n2.decode_tps / w->none.decode_tps,
               w->n10.decode_tps / w->none.decode_tps);
        print_measure_json("full_prefill", &w->full, ", ");
        print_measure_json("reused_kv", &w->reused, ",\n   ");
        print_measure_json("nectar2", &w->n2, ", ");
        print_measure_json("nectar10", &w->n10, ",\n   ");
        print_measure_json("no_doc", &w->none, i + 1 < n_rows ? "},\n" : "}\n");
    }
    printf(" ],\n \"fitting\": {\"size\": %d, \"batch\": %d, \"queries_per_s\": %.4g, \"gflops\": %.4g, "
           "\"sgemm_gflops\": %.4g, \"fit_seconds\": %.4g, \"per_request_s\": {\"full_prefill\": %.4g, "
           "\"reused_kv\": %.4g, \"nectar\": %.4g}},\n", f->size, f->batch, f->queries_per_s, f->gflops,
           f->sgemm_gflops, f->fit_seconds, f->per_request[0], f->per_request[1], f->per_request[2]);
    printf(" \"rollouts\": {\"count\": %d, \"doc_tokens\": %d, \"one_at_a_time_tps\": %.4g, \"batched_tps\": %.4g},\n",
           ROLLOUTS, b->n, b->one_tps, b->batch_tps);
    print_composition_json(t);
    printf("}\n");
}

int main(int argc, char **argv) {
    Options o;
    if (parse_options(argc, argv, &o) != 0) return 1;
    Model m;
    if (model_load(&m, o.model_path) != 0) return 1;
    if (check_sizes(&m, &o) != 0) { model_free(&m); return 1; }
    if (o.gpu) {
#ifdef NECTAR_CUDA
        int status = bench_gpu(&m, o.model_path, o.arch, o.min_doc, o.max_doc);
        model_free(&m);
        return status;
#else
        fprintf(stderr, "error: " NO_GPU_SUPPORT "\n");
        model_free(&m);
        return 1;
#endif
    }
    double t_start = now_seconds();
    References refs = cpu_references(&m);                       /* 1. the references */
    if (!o.json) print_references(&m, &o, &refs);
    Row rows[32];
    int n_rows = cpu_table(&m, &o, &refs, rows);                 /* 2. the serving table */
    Fitting fit = fitting_and_amortisation(&m.config, o.arch, &rows[n_rows - 1]);  /* 3. fitting and amortisation */
    Batching batching = batched_rollouts(&m, rows[0].n);                   /* 4. many prompts at once */
    if (!o.json) {
        print_fitting(&m.config, &fit);
        print_batching(&batching);
    }
    Composition composition;
    composition_table(&m, &o, t_start, &composition);              /* 5. compositions of documents */
    if (o.json) print_json(&m, &o, &refs, rows, n_rows, &fit, &batching, &composition);
    fprintf(stderr, "bench took %.0f s\n", now_seconds() - t_start);
    model_free(&m);
    return 0;
}
