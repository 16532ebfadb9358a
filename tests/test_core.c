/* test_core.c - the CPU reference against closed forms, naive loops,
 * finite differences and fixtures written by tests/reference.py.
 *
 * It includes nectar.c itself so it can reach the static helpers (the MLP
 * parameter layout). Every check prints what it compared; the last line is
 * "N passed, M failed" and the exit status is non-zero on any failure.
 */
#include "../nectar.c"
#include "../src/eval.h"
#include "../src/formats.h"
#include "../src/tokenizer.h"

#include "../examples/check.h"

#include <float.h>

/* Naive double-precision attention state of one query: the closed form. */
static void naive_state(int nk, int d, const float *q, const float *k, const float *v, int ld,
                        double *A, double *lse) {
    double max = -INFINITY, sum = 0, *s = xmalloc((nk + 1) * sizeof(double));
    for (int j = 0; j < nk; j++) {
        s[j] = 0;
        for (int c = 0; c < d; c++) s[j] += (double)q[c] * k[(size_t)j * ld + c];
        s[j] /= sqrt((double)d);
        if (s[j] > max) max = s[j];
    }
    for (int c = 0; c < d; c++) A[c] = 0;
    for (int j = 0; j < nk; j++) {
        double e = exp(s[j] - max);
        sum += e;
        for (int c = 0; c < d; c++) A[c] += e * v[(size_t)j * ld + c];
    }
    for (int c = 0; c < d; c++) A[c] = nk ? A[c] / sum : 0;
    *lse = nk ? max + log(sum) : -INFINITY;
    free(s);
}

/* ------------------------------------------------------------------------ */

/* exp_fast against the closed form, double exp, on every 64th float of
 * [-104, 89] (30 million; all of them, 1.98e9, give the same maxima:
 * relative 1.004e-7 where the result is normal, absolute 1.08e-45 where it
 * is denormal), and its special values. */
static void test_exp_fast_matches_exp(void) {
    printf("exp_fast against double exp\n");
    double max_rel = 0, max_rel_expf = 0, max_abs_denormal = 0, worst_x = 0;
    int overflow_ok = 1;
    long count = 0;
    for (int negative = 0; negative < 2; negative++)
        for (uint32_t u = negative ? 0x80000000u : 0;; u += 64) {
            float x = float_of(u);
            if (negative ? x < -104.0f : x > 89.0f) break;
            double ref = exp((double)x), got = exp_fast(x);
            count++;
            if (ref > FLT_MAX) overflow_ok &= isinf(got) && got > 0;
            else if (ref >= FLT_MIN) {
                double rel = fabs(got - ref) / ref;
                if (rel > max_rel) { max_rel = rel; worst_x = x; }
                max_rel_expf = fmax(max_rel_expf, fabs(expf(x) - ref) / ref);
            } else {
                max_abs_denormal = fmax(max_abs_denormal, fabs(got - ref));
            }
        }
    printf("    %ld values: max rel error %.3e at x = %.7g (expf: %.3e); denormal results: max abs %.2e\n", count,
           max_rel, worst_x, max_rel_expf, max_abs_denormal);
    check("relative error below 1.01e-7 where exp(x) is normal", max_rel < 1.01e-7);
    check("absolute error below 2^-149 where exp(x) is denormal", max_abs_denormal < ldexp(1.0, -149));
    check("+inf where exp(x) > FLT_MAX", overflow_ok);
    check("exp(0) = 1, exp(-inf) = 0, exp(-200) = 0, exp(+inf) = +inf, exp(NaN) = NaN",
          exp_fast(0.0f) == 1.0f && exp_fast(-INFINITY) == 0.0f && exp_fast(-200.0f) == 0.0f &&
          isinf(exp_fast(INFINITY)) && isnan(exp_fast(NAN)));
}

static void test_merge_splits_attention_exactly(void) {
    printf("attention states and merge\n");
    enum { NQ = 5, NK = 37, D = 16 };
    uint64_t rng = 7;
    float q[NQ * D], k[NK * D], v[NK * D], A[NQ * D], lse[NQ], scores[NQ * NK];
    fill_normal(q, NQ * D, 1.5f, &rng);
    fill_normal(k, NK * D, 1.5f, &rng);
    fill_normal(v, NK * D, 1.0f, &rng);
    attention_states(NQ, NK, D, q, D, k, v, D, NK, A, D, lse, 1, scores);
    double refA[NQ * D], reflse[NQ];
    for (int i = 0; i < NQ; i++) naive_state(NK, D, q + i * D, k, v, D, refA + i * D, &reflse[i]);
    check_close("BLAS attention A vs naive loop", A, refA, NQ * D, 1e-5, 1e-4);
    check_close("BLAS attention lse vs naive loop", lse, reflse, NQ, 1e-5, 1e-5);

    /* causal visibility: query i sees keys j < visible + i */
    float Ac[NQ * D], lsec[NQ];
    attention_states(NQ, NK, D, q, D, k, v, D, 30, Ac, D, lsec, 1, scores);
    for (int i = 0; i < NQ; i++) naive_state(30 + i, D, q + i * D, k, v, D, refA + i * D, &reflse[i]);
    check_close("causal attention A vs naive loop", Ac, refA, NQ * D, 1e-5, 1e-4);
    check_close("causal attention lse vs naive loop", lsec, reflse, NQ, 1e-5, 1e-5);

    /* split at every point 0..n, merge, compare with the full state */
    double worst = 0;
    int nan_seen = 0;
    for (int split = 0; split <= NK; split++) {
        float A1[NQ * D], l1[NQ], A2[NQ * D], l2[NQ];
        attention_states(NQ, split, D, q, D, k, v, D, split, A1, D, l1, 1, scores);
        attention_states(NQ, NK - split, D, q, D, k + split * D, v + split * D, D, NK - split, A2, D, l2, 1, scores);
        for (int i = 0; i < NQ; i++) {
            float Am[D], lm;
            merge_states(D, A1 + i * D, l1[i], A2 + i * D, l2[i], Am, &lm);
            for (int c = 0; c < D; c++) {
                double e = fabs(Am[c] - A[i * D + c]);
                worst = e > worst ? e : worst;
                nan_seen |= isnan(Am[c]);
            }
            worst = fabs(lm - lse[i]) > worst ? fabs(lm - lse[i]) : worst;
        }
    }
    printf("    split-then-merge, every split 0..%d: max abs diff %.2e\n", NK, worst);
    check("merge(doc[0,s), rest[s,n)) == full, s = 0..n", worst <= 2e-6 && !nan_seen);

    /* commutative and associative, on a three-way split */
    float Aa[D], la, Ab[D], lb, Ac3[D], lc, t1[D], lt1, t2[D], lt2, r1[D], lr1, r2[D], lr2;
    attention_states(1, 10, D, q, D, k, v, D, 10, Aa, D, &la, 1, scores);
    attention_states(1, 12, D, q, D, k + 10 * D, v + 10 * D, D, 12, Ab, D, &lb, 1, scores);
    attention_states(1, 15, D, q, D, k + 22 * D, v + 22 * D, D, 15, Ac3, D, &lc, 1, scores);
    merge_states(D, Aa, la, Ab, lb, t1, &lt1);
    merge_states(D, Ab, lb, Aa, la, t2, &lt2);
    int same = lt1 == lt2;
    for (int c = 0; c < D; c++) same &= fabsf(t1[c] - t2[c]) <= 1e-7f;
    check("merge is commutative", same);
    merge_states(D, t1, lt1, Ac3, lc, r1, &lr1);             /* (a b) c */
    merge_states(D, Ab, lb, Ac3, lc, t2, &lt2);
    merge_states(D, Aa, la, t2, lt2, r2, &lr2);              /* a (b c) */
    double assoc = fabs(lr1 - lr2);
    for (int c = 0; c < D; c++) assoc = fmax(assoc, fabs(r1[c] - r2[c]));
    printf("    (a.b).c vs a.(b.c): max abs diff %.2e\n", assoc);
    check("merge is associative", assoc <= 1e-6);

    /* empty states: (0, -inf) */
    float zero[D] = {0}, out[D], lo;
    merge_states(D, zero, -INFINITY, Aa, la, out, &lo);
    int exact_copy = lo == la;
    for (int c = 0; c < D; c++) exact_copy &= out[c] == Aa[c];
    check("merge(empty, x) == x bit for bit", exact_copy);
    merge_states(D, Aa, la, zero, -INFINITY, out, &lo);
    exact_copy = lo == la;
    for (int c = 0; c < D; c++) exact_copy &= out[c] == Aa[c];
    check("merge(x, empty) == x bit for bit", exact_copy);
    merge_states(D, zero, -INFINITY, zero, -INFINITY, out, &lo);
    int empty_ok = lo == -INFINITY;
    for (int c = 0; c < D; c++) empty_ok &= out[c] == 0.0f;
    check("merge(empty, empty) == (0, -inf), no NaN", empty_ok);

    /* gate form equals merge form */
    double gate_worst = 0;
    for (int trial = 0; trial < 50; trial++) {
        float Ad[D], Al[D], ad = 8.0f * rng_normal(&rng), ll = 8.0f * rng_normal(&rng), m[D], g[D], lm;
        fill_normal(Ad, D, 1.0f, &rng);
        fill_normal(Al, D, 1.0f, &rng);
        merge_states(D, Ad, ad, Al, ll, m, &lm);
        gate_merge(D, Ad, ad, Al, ll, g);
        for (int c = 0; c < D; c++) gate_worst = fmax(gate_worst, fabs(m[c] - g[c]));
    }
    printf("    gate vs merge over 50 random states: max abs diff %.2e\n", gate_worst);
    check("gate form == merge form", gate_worst <= 1e-6);
}

/* ------------------------------------------------------------------------ */
/* Modules: a naive double-precision forward, and finite differences on it  */

/* The MLP of nectar.c's comment, in doubles and plain loops. */
static void naive_mlp(const ModuleSet *s, const Module *mod, const double *params, const float *q,
                      double *a, double *A) {
    int d = s->head_size, w = mod->width, Db = s->depth_backbone, Ds = s->depth_score, Dt = s->depth_target;
    /* offsets of the float layout, applied to the double copy */
    MlpParams p;
    mlp_layout(d, w, Db, Ds, Dt, mod->params, &p);
#define OFF(ptr) (params + ((ptr) - mod->params))
    double x[256], h[MAX_HIDDEN][256];
    for (int c = 0; c < d; c++) x[c] = mod->input_scale * q[c];
    for (int i = 0; i < Db + Ds + Dt; i++) {
        int prev = mlp_prev(i, Db, Ds);
        for (int r = 0; r < w; r++) {
            double z = OFF(p.b[i])[r];
            for (int c = 0; c < d; c++) z += OFF(p.Vq[i])[r * d + c] * x[c];
            if (prev >= 0) for (int c = 0; c < w; c++) z += OFF(p.U[i])[r * w + c] * h[prev][c];
            h[i][r] = z / (1 + exp(-z));
        }
    }
    int hs = mlp_head_input(0, Db, Ds, Dt), ht = mlp_head_input(1, Db, Ds, Dt);
    const double *in_s = hs >= 0 ? h[hs] : x, *in_t = ht >= 0 ? h[ht] : x;
    int ns = hs >= 0 ? w : d, nt = ht >= 0 ? w : d;
    *a = OFF(p.bs)[0];
    for (int c = 0; c < ns; c++) *a += OFF(p.ws)[c] * in_s[c];
    for (int r = 0; r < d; r++) {
        A[r] = OFF(p.bt)[r];
        for (int c = 0; c < nt; c++) A[r] += OFF(p.Wt)[r * nt + c] * in_t[c];
    }
#undef OFF
}

static void naive_module(const ModuleSet *s, const Module *mod, const double *params, const float *q,
                         double *a, double *A) {
    if (s->arch == ARCH_MLP) { naive_mlp(s, mod, params, q, a, A); return; }
    int d = s->head_size, p = mod->n_pairs;
    /* quadrature is attention over (W, Z) = params, in doubles */
    double max = -INFINITY, sum = 0, sc[4096];
    for (int j = 0; j < p; j++) {
        sc[j] = 0;
        for (int c = 0; c < d; c++) sc[j] += params[j * d + c] * q[c];
        sc[j] /= sqrt((double)d);
        max = fmax(max, sc[j]);
    }
    for (int c = 0; c < d; c++) A[c] = 0;
    for (int j = 0; j < p; j++) {
        double e = exp(sc[j] - max);
        sum += e;
        for (int c = 0; c < d; c++) A[c] += e * params[(size_t)(p + j) * d + c];
    }
    for (int c = 0; c < d; c++) A[c] /= sum;
    *a = max + log(sum);
}

/* L = sum_i ca_i a_i + sum_i cA_i . A_i over N queries, in doubles. */
static double naive_loss(const ModuleSet *s, const Module *mod, const double *params, const float *q,
                         int N, const float *ca, const float *cA) {
    int d = s->head_size;
    double L = 0, a, A[256];
    for (int i = 0; i < N; i++) {
        naive_module(s, mod, params, q + (size_t)i * d, &a, A);
        L += ca[i] * a;
        for (int c = 0; c < d; c++) L += cA[(size_t)i * d + c] * A[c];
    }
    return L;
}

static void test_module_gradients_match_finite_differences(ModuleArch arch, int Db, int Ds, int Dt, int size) {
    enum { N = 7, D = 12 };
    char name[96];
    if (arch == ARCH_MLP) snprintf(name, sizeof name, "MLP (Db,Ds,Dt)=(%d,%d,%d) w=%d", Db, Ds, Dt, size);
    else snprintf(name, sizeof name, "quadrature p=%d", size);
    printf("module %s\n", name);
    ModuleSet s;
    moduleset_alloc(&s, arch, 1, 1, D, Db, Ds, Dt, &size, 1);
    Module *mod = &s.modules[0];
    uint64_t rng = 99;
    fill_normal(mod->params, mod->n_params, 0.4f, &rng);  /* nonzero outputs too */
    mod->input_scale = 0.7f;
    float q[N * D], ca[N], cA[N * D], a[N], A[N * D], dq[N * D];
    fill_normal(q, N * D, 1.0f, &rng);
    fill_normal(ca, N, 1.0f, &rng);
    fill_normal(cA, N * D, 1.0f, &rng);
    ModuleWork w;
    modulework_alloc(&w, &s, N);
    module_forward(&s, mod, &w, q, N, a, A);

    double *params = xmalloc(mod->n_params * sizeof(double));
    for (size_t i = 0; i < mod->n_params; i++) params[i] = mod->params[i];
    double ref_a[N], ref_A[N * D];
    for (int i = 0; i < N; i++) naive_module(&s, mod, params, q + i * D, &ref_a[i], ref_A + i * D);
    check_close("forward a vs naive loop", a, ref_a, N, 1e-5, 1e-4);
    check_close("forward A vs naive loop", A, ref_A, N * D, 1e-5, 1e-4);

    memset(s.grads, 0, s.n_params * sizeof(float));
    module_backward(&s, mod, &w, q, N, A, ca, cA, dq);

    /* central differences in doubles: dL/dtheta_i = (L(+h) - L(-h)) / 2h */
    const double h = 1e-6;
    double *fd = xmalloc(mod->n_params * sizeof(double));
    for (size_t i = 0; i < mod->n_params; i++) {
        double keep = params[i];
        params[i] = keep + h; double up = naive_loss(&s, mod, params, q, N, ca, cA);
        params[i] = keep - h; double down = naive_loss(&s, mod, params, q, N, ca, cA);
        params[i] = keep;
        fd[i] = (up - down) / (2 * h);
    }
    /* relative error per whole gradient: ||g - fd|| / ||fd|| */
    double num = 0, den = 0;
    for (size_t i = 0; i < mod->n_params; i++) {
        num += (mod->grads[i] - fd[i]) * (mod->grads[i] - fd[i]);
        den += fd[i] * fd[i];
    }
    printf("    parameter gradient: rel err %.2e over %zu params\n", sqrt(num / den), mod->n_params);
    check("parameter gradient vs finite differences", sqrt(num / den) < 1e-4);
    check_close("parameter gradient elementwise", mod->grads, fd, mod->n_params, 1e-4, 1e-3);

    /* gradient with respect to the queries */
    double fdq[N * D], qnum = 0, qden = 0;
    for (int i = 0; i < N * D; i++) {
        float keep = q[i];
        double up, down, a1, A1[256];
        q[i] = keep + 1e-3f;
        naive_module(&s, mod, params, q + (i / D) * D, &a1, A1);
        up = ca[i / D] * a1; for (int c = 0; c < D; c++) up += cA[(i / D) * D + c] * A1[c];
        float qup = q[i];
        q[i] = keep - 1e-3f;
        naive_module(&s, mod, params, q + (i / D) * D, &a1, A1);
        down = ca[i / D] * a1; for (int c = 0; c < D; c++) down += cA[(i / D) * D + c] * A1[c];
        fdq[i] = (up - down) / ((double)qup - q[i]);
        q[i] = keep;
        qnum += (dq[i] - fdq[i]) * (dq[i] - fdq[i]);
        qden += fdq[i] * fdq[i];
    }
    printf("    query gradient: rel err %.2e\n", sqrt(qnum / qden));
    check("query gradient vs finite differences", sqrt(qnum / qden) < 1e-3);
    free(fd); free(params);
    modulework_free(&w);
    moduleset_free(&s);
}

static void test_width_is_largest_within_budget(void) {
    printf("MLP width from the budget\n");
    int d = 32, ok = 1;
    for (long budget = 2000; budget < 200000; budget = budget * 3 / 2) {
        int w = mlp_width_for_budget(d, budget, 1, 1, 1);
        ok &= (long)mlp_param_count(d, w, 1, 1, 1) <= budget &&
              (long)mlp_param_count(d, w + 1, 1, 1, 1) > budget;
    }
    check("largest width that fits, for budgets 2K..200K", ok);
    /* the count by hand, (Db,Ds,Dt) = (1,1,1), w = 10, d = 32:
     * backbone 10*32+10, score 10*32+10*10+10, target same, ws 10 + 1, Wt 32*10 + 32 */
    size_t by_hand = (320 + 10) + 2 * (320 + 100 + 10) + 11 + 352;
    check("parameter count matches the count by hand", mlp_param_count(32, 10, 1, 1, 1) == by_hand);
}

/* ------------------------------------------------------------------------ */
/* The transformer                                                          */

static Config small_gqa = {64, 160, 3, 8, 2, 97, 128, LLAMA2C_ROPE_THETA, LLAMA2C_NORM_EPS};

/* Oracle equivalence: quadrature modules with p = n, W = K, Z = V return the
 * exact document state, so the Nectar forward must give the logits of the
 * plain forward over document + prompt, through prefill and 20 decode steps. */
static void test_exact_state_modules_reproduce_full_cache(void) {
    printf("oracle equivalence (random GQA model, H=8, G=2)\n");
    Model m;
    model_init_random(&m, small_gqa, 1, 42, 0.15f);
    const Config *c = &m.config;
    enum { NDOC = 40, NPROMPT = 9, NDEC = 20 };
    int all[NDOC + NPROMPT + NDEC];
    uint64_t rng = 5;
    for (int i = 0; i < NDOC + NPROMPT; i++) all[i] = 3 + rng_u32(&rng) % (c->vocab_size - 3);

    /* reference: one plain causal sequence, greedy, token by token after the prefill */
    RunState ref;
    runstate_alloc(&ref, &m, &NO_DOCUMENT, NDOC + NPROMPT, NDOC + NPROMPT + NDEC);
    float *ref_logits = xmalloc((size_t)(NDEC + 1) * c->vocab_size * sizeof(float));
    forward(&m, &ref, &NO_DOCUMENT, all, NDOC + NPROMPT, 0, LOGITS_LAST);
    memcpy(ref_logits, ref.logits, c->vocab_size * sizeof(float));
    for (int t = 0; t < NDEC; t++) {
        int pos = NDOC + NPROMPT + t;
        all[pos] = argmax(ref_logits + (size_t)t * c->vocab_size, c->vocab_size);
        forward(&m, &ref, &NO_DOCUMENT, &all[pos], 1, pos, LOGITS_LAST);
        memcpy(ref_logits + (size_t)(t + 1) * c->vocab_size, ref.logits, c->vocab_size * sizeof(float));
    }

    DocCache cache;
    doccache_build(&cache, &m, all, NDOC, 16);  /* prefill in blocks of 16 */
    ModuleSet oracle;
    int p[3] = {NDOC, NDOC, NDOC};
    moduleset_alloc(&oracle, ARCH_QUAD, c->n_layers, c->n_kv_heads, c->dim / c->n_heads, 0, 0, 0, p, 0);
    quad_init_from_cache(&oracle, &cache);
    oracle.n_doc = NDOC;

    Document docs[2] = {{DOC_EXACT, NDOC, &cache, NULL, NULL}, {DOC_NECTAR, NDOC, NULL, &oracle, NULL}};
    const char *names[2] = {"exact (doc cache + local, merged)", "Nectar with oracle modules"};
    for (int which = 0; which < 2; which++) {
        RunState s;
        runstate_alloc(&s, &m, &docs[which], NPROMPT, NPROMPT + NDEC);
        float *got = xmalloc((size_t)(NDEC + 1) * c->vocab_size * sizeof(float));
        forward(&m, &s, &docs[which], all + NDOC, NPROMPT, 0, LOGITS_LAST);
        memcpy(got, s.logits, c->vocab_size * sizeof(float));
        for (int t = 0; t < NDEC; t++) {
            forward(&m, &s, &docs[which], &all[NDOC + NPROMPT + t], 1, NPROMPT + t, LOGITS_LAST);
            memcpy(got + (size_t)(t + 1) * c->vocab_size, s.logits, c->vocab_size * sizeof(float));
        }
        char what[128];
        snprintf(what, sizeof what, "%s: logits, prefill + %d steps", names[which], NDEC);
        check_close_f(what, got, ref_logits, (size_t)(NDEC + 1) * c->vocab_size, 1e-4, 0);
        free(got);
        runstate_free(&s);
    }
    /* the test can fail: without the document the logits are far from these */
    RunState s;
    runstate_alloc(&s, &m, &NO_DOCUMENT, NPROMPT, NPROMPT);
    forward(&m, &s, &NO_DOCUMENT, all + NDOC, NPROMPT, 0, LOGITS_LAST);
    double nodoc_diff = 0;
    for (int j = 0; j < c->vocab_size; j++)
        nodoc_diff = fmax(nodoc_diff, fabs(s.logits[j] - ref_logits[j]));
    printf("    no-document logits differ by up to %.3f\n", nodoc_diff);
    check("the document matters (no-document logits differ > 0.05)", nodoc_diff > 0.05);
    runstate_free(&s);

    /* quadrature with p = n at the module level: the same alpha and A */
    ModuleWork w;
    modulework_alloc(&w, &oracle, 4);
    float q[4 * 8], a[4], A[4 * 8];
    double ra[4], rA[4 * 8];
    int d = c->dim / c->n_heads;
    fill_normal(q, 4 * d, 1.0f, &rng);
    module_forward(&oracle, &oracle.modules[1 * c->n_kv_heads + 1], &w, q, 4, a, A);
    for (int i = 0; i < 4; i++)
        naive_state(NDOC, d, q + i * d, cache.key + (size_t)(1 * c->n_kv_heads + 1) * NDOC * d,
                    cache.value + (size_t)(1 * c->n_kv_heads + 1) * NDOC * d, d, rA + i * d, &ra[i]);
    check_close("quadrature p=n, W=K, Z=V: alpha", a, ra, 4, 1e-5, 1e-5);
    check_close("quadrature p=n, W=K, Z=V: A", A, rA, 4 * d, 1e-5, 1e-4);
    modulework_free(&w);
    moduleset_free(&oracle);
    doccache_free(&cache);
    runstate_free(&ref);
    free(ref_logits);
    model_free(&m);
}

/* A composition of documents prefilled apart, against one document made
 * by hand from their caches: document i's keys rotated forward by its
 * offset P_i (the test's own RoPE, in doubles) and laid after the ones
 * before it. Exact, Nectar with oracle modules (W = K, Z = V) and mixed
 * compositions of 1, 2 and 3 documents must all give its logits, through
 * a prefill and greedy decode steps; without the rotation they must not. */
static void joined_cache(const Model *m, DocCache *const caches[], int count, int rotate, DocCache *out) {
    const Config *c = &m->config;
    int L = c->n_layers, G = c->n_kv_heads, d = c->dim / c->n_heads, n = 0;
    for (int i = 0; i < count; i++) n += caches[i]->n;
    *out = (DocCache){n, L, G * d, xmalloc((size_t)L * G * n * d * sizeof(float)),
                      xmalloc((size_t)L * G * n * d * sizeof(float)), 0};
    for (int l = 0; l < L; l++)
        for (int g = 0; g < G; g++)
            for (int i = 0, P = 0; i < count; P += caches[i]->n, i++)
                for (int j = 0; j < caches[i]->n; j++) {
                    size_t from = (((size_t)l * G + g) * caches[i]->n + j) * d, to = (((size_t)l * G + g) * n + P + j) * d;
                    const float *k = caches[i]->key + from;
                    for (int e = 0; e < d; e += 2) {  /* pair e turned by P theta^(-e/d) more */
                        double angle = rotate ? P * pow(c->rope_theta, -(double)e / d) : 0;
                        out->key[to + e] = (float)(k[e] * cos(angle) - k[e + 1] * sin(angle));
                        out->key[to + e + 1] = (float)(k[e] * sin(angle) + k[e + 1] * cos(angle));
                    }
                    memcpy(out->value + to, caches[i]->value + from, d * sizeof(float));
                }
}

/* Logits of the prompt's last row and of `steps` greedy steps after it
 * (the tokens fed are `feed`, so every run sees the same ones). */
static void prefill_and_decode(const Model *m, const Document *doc, const int *prompt, int np, const int *feed,
                               int steps, float *logits) {
    int V = m->config.vocab_size;
    RunState s;
    runstate_alloc(&s, m, doc, np, np + steps);
    forward(m, &s, doc, prompt, np, 0, LOGITS_LAST);
    memcpy(logits, s.logits, V * sizeof(float));
    for (int t = 0; t < steps; t++) {
        forward(m, &s, doc, &feed[t], 1, np + t, LOGITS_LAST);
        memcpy(logits + (size_t)(t + 1) * V, s.logits, V * sizeof(float));
    }
    runstate_free(&s);
}

static void test_composition_equals_documents_at_offsets(void) {
    printf("composition: documents prefilled apart, read at their offsets (exact, oracle Nectar, mixed)\n");
    Model m;
    model_init_random(&m, small_gqa, 1, 42, 0.15f);
    const Config *c = &m.config;
    enum { NP = 7, STEPS = 12 };
    int lens[3] = {23, 17, 37}, V = c->vocab_size, d = c->dim / c->n_heads;
    uint64_t rng = 11;
    DocCache caches[3];
    ModuleSet oracles[3];
    DocCache *cache_ptrs[3] = {&caches[0], &caches[1], &caches[2]};
    for (int i = 0; i < 3; i++) {
        int ids[37], p[3] = {lens[i], lens[i], lens[i]};
        for (int j = 0; j < lens[i]; j++) ids[j] = 3 + rng_u32(&rng) % (V - 3);
        doccache_build(&caches[i], &m, ids, lens[i], 8);
        moduleset_alloc(&oracles[i], ARCH_QUAD, c->n_layers, c->n_kv_heads, d, 0, 0, 0, p, 0);
        quad_init_from_cache(&oracles[i], &caches[i]);
        oracles[i].n_doc = lens[i];
    }
    int prompt[NP], feed[STEPS];
    for (int j = 0; j < NP; j++) prompt[j] = 3 + rng_u32(&rng) % (V - 3);
    for (int j = 0; j < STEPS; j++) feed[j] = 3 + rng_u32(&rng) % (V - 3);
    size_t nl = (size_t)(STEPS + 1) * V;
    float *ref = xmalloc(nl * sizeof(float)), *got = xmalloc(nl * sizeof(float)), *unrotated = xmalloc(nl * sizeof(float));
    for (int count = 1; count <= 3; count++) {
        DocCache joined, flat;
        joined_cache(&m, cache_ptrs, count, 1, &joined);
        Document one = {DOC_EXACT, joined.n, &joined, NULL, NULL};
        prefill_and_decode(&m, &one, prompt, NP, feed, STEPS, ref);
        /* mode 0 exact, 1 Nectar, 2 mixed (Nectar where i is odd) */
        for (int mode = 0; mode < 3 && (mode < 2 || count > 1); mode++) {
            Document docs[3];
            for (int i = count - 1; i >= 0; i--) {
                int nectar = mode == 1 || (mode == 2 && i % 2 == 1);
                docs[i] = nectar ? (Document){DOC_NECTAR, lens[i], NULL, &oracles[i], NULL}
                                 : (Document){DOC_EXACT, lens[i], &caches[i], NULL, NULL};
                docs[i].next = i + 1 < count ? &docs[i + 1] : NULL;
            }
            prefill_and_decode(&m, &docs[0], prompt, NP, feed, STEPS, got);
            char what[128];
            snprintf(what, sizeof what, "%d document%s, %s: logits, prefill + %d steps", count, count > 1 ? "s" : "",
                     mode == 0 ? "exact" : mode == 1 ? "oracle Nectar" : "mixed", STEPS);
            check_close_f(what, got, ref, nl, 1e-4, 0);
            if (count > 1 && mode == 0) {  /* the test can fail: the offsets matter */
                joined_cache(&m, cache_ptrs, count, 0, &flat);
                Document plain = {DOC_EXACT, flat.n, &flat, NULL, NULL};
                prefill_and_decode(&m, &plain, prompt, NP, feed, STEPS, unrotated);
                double diff = 0;
                for (size_t j = 0; j < nl; j++) diff = fmax(diff, fabs(unrotated[j] - got[j]));
                printf("    without the rotation by the offsets the logits differ by up to %.3f\n", diff);
                check("the offsets matter (unrotated keys differ > 0.05)", diff > 0.05);
                doccache_free(&flat);
            }
        }
        doccache_free(&joined);
    }

    /* the states of three key sets and the local one merge in any order */
    enum { NQ = 3, D = 16, NK = 10 };
    float q[NQ * D], k[4][NK * D], v[4][NK * D], A[4][NQ * D], lse[4][NQ], scores[NQ * NK * 4];
    fill_normal(q, NQ * D, 1.5f, &rng);
    for (int i = 0; i < 4; i++) {
        fill_normal(k[i], NK * D, 1.5f, &rng);
        fill_normal(v[i], NK * D, 1.0f, &rng);
        attention_states(NQ, NK, D, q, D, k[i], v[i], D, NK, A[i], D, lse[i], 1, scores);
    }
    int orders[3][4] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {2, 0, 3, 1}};
    double refA[NQ * D], reflse[NQ];
    float allk[4 * NK * D], allv[4 * NK * D];
    for (int i = 0; i < 4; i++) {
        memcpy(allk + i * NK * D, k[i], sizeof k[i]);
        memcpy(allv + i * NK * D, v[i], sizeof v[i]);
    }
    for (int r = 0; r < NQ; r++) naive_state(4 * NK, D, q + r * D, allk, allv, D, refA + r * D, &reflse[r]);
    for (int o = 0; o < 3; o++) {
        float mA[NQ * D], mlse[NQ];
        for (int r = 0; r < NQ; r++) {
            memcpy(mA + r * D, A[orders[o][0]] + r * D, D * sizeof(float));
            mlse[r] = lse[orders[o][0]][r];
            for (int i = 1; i < 4; i++)
                merge_states(D, mA + r * D, mlse[r], A[orders[o][i]] + r * D, lse[orders[o][i]][r], mA + r * D, &mlse[r]);
        }
        char what[96];
        snprintf(what, sizeof what, "four states merged in order %d%d%d%d: A", orders[o][0], orders[o][1],
                 orders[o][2], orders[o][3]);
        check_close(what, mA, refA, NQ * D, 1e-5, 1e-4);
        snprintf(what, sizeof what, "four states merged in order %d%d%d%d: lse", orders[o][0], orders[o][1],
                 orders[o][2], orders[o][3]);
        check_close(what, mlse, reflse, NQ, 1e-5, 1e-5);
    }
    for (int i = 0; i < 3; i++) { doccache_free(&caches[i]); moduleset_free(&oracles[i]); }
    free(ref); free(got); free(unrotated);
    model_free(&m);
}

/* parallel_for runs every task exactly once, with one to three threads,
 * its tasks calling parallel_for again (run inline). */
typedef struct { int *count; int n_inner; } TaskCounts;

static void count_inner_task(void *ctx, int i) { ((int *)ctx)[i]++; }

static void count_task(void *ctx, int i) {
    TaskCounts *t = ctx;
    t->count[i]++;
    if (t->n_inner) parallel_for(t->n_inner, count_inner_task, t->count + 1000 + i * t->n_inner);
}

static void test_parallel_for_runs_every_task_once(void) {
    printf("parallel_for\n");
    int sizes[] = {0, 1, 2, 3, 7, 64, 1000}, ok = 1, *count = xmalloc((1000 + 1000 * 5) * sizeof(int));
    for (int threads = 1; threads <= 3; threads++) {
        parallel_set_threads(threads);
        for (int k = 0; k < 7; k++)
            for (int n_inner = 0; n_inner <= 5; n_inner += 5) {
                memset(count, 0, (1000 + 1000 * 5) * sizeof(int));
                TaskCounts t = {count, n_inner};
                for (int rep = 0; rep < 50; rep++) parallel_for(sizes[k], count_task, &t);
                for (int i = 0; i < 1000 + 1000 * 5; i++) {
                    int want = i < 1000 ? (i < sizes[k] ? 50 : 0) : (i - 1000 < sizes[k] * n_inner ? 50 : 0);
                    if (count[i] != want) ok = 0;
                }
            }
    }
    parallel_set_threads(0);
    check("every task once, 0 to 1000 tasks, nested calls, 1 to 3 threads", ok);
    free(count);
}

/* An exact document longer than one chunk of keys (600 = 256 + 256 + 88):
 * its chunks' states, merged, give the logits of one causal sequence over
 * document + prompt, through prefill and decode, on one to three threads
 * (the local attention of both, past 512 keys, runs in tiles that merge). */
static void test_chunked_document_equals_one_sequence(void) {
    printf("exact document in chunks of %d keys\n", DOC_CHUNK_KEYS);
    Model m;
    model_init_random(&m, small_gqa, 1, 8, 0.15f);
    const Config *c = &m.config;
    enum { NDOC = 600, NPROMPT = 5, NDEC = 4, N = NDOC + NPROMPT + NDEC };
    int all[N];
    uint64_t rng = 9;
    for (int i = 0; i < N; i++) all[i] = 3 + rng_u32(&rng) % (c->vocab_size - 3);
    RunState ref;
    runstate_alloc(&ref, &m, &NO_DOCUMENT, N, N);
    forward(&m, &ref, &NO_DOCUMENT, all, N, 0, LOGITS_ALL);
    DocCache cache;
    doccache_build(&cache, &m, all, NDOC, 256);
    Document doc = {DOC_EXACT, NDOC, &cache, NULL, NULL};
    for (int threads = 1; threads <= 3; threads++) {
        parallel_set_threads(threads);
        RunState s;
        runstate_alloc(&s, &m, &doc, NPROMPT, NPROMPT + NDEC);
        float *got = xmalloc((size_t)(NPROMPT + NDEC) * c->vocab_size * sizeof(float));
        forward(&m, &s, &doc, all + NDOC, NPROMPT, 0, LOGITS_ALL);
        memcpy(got, s.logits, (size_t)NPROMPT * c->vocab_size * sizeof(float));
        for (int t = 0; t < NDEC; t++) {
            forward(&m, &s, &doc, &all[NDOC + NPROMPT + t], 1, NPROMPT + t, LOGITS_LAST);
            memcpy(got + (size_t)(NPROMPT + t) * c->vocab_size, s.logits, c->vocab_size * sizeof(float));
        }
        char what[96];
        snprintf(what, sizeof what, "%d threads: prompt and %d decode steps vs one sequence", threads, NDEC);
        check_close_f(what, got, ref.logits + (size_t)NDOC * c->vocab_size, (size_t)(NPROMPT + NDEC) * c->vocab_size,
                      1e-4, 1e-4);
        free(got);
        runstate_free(&s);
    }
    parallel_set_threads(0);
    doccache_free(&cache);
    runstate_free(&ref);
    model_free(&m);
}

/* Prefill in one block gives the logits of token-by-token decoding. */
static void test_prefill_equals_decode(void) {
    printf("prefill vs token-by-token\n");
    Model m;
    model_init_random(&m, small_gqa, 0, 3, 0.08f);
    int V = m.config.vocab_size, n = 23, tokens[23];
    uint64_t rng = 11;
    for (int i = 0; i < n; i++) tokens[i] = rng_u32(&rng) % V;
    RunState a, b;
    runstate_alloc(&a, &m, &NO_DOCUMENT, n, n);
    runstate_alloc(&b, &m, &NO_DOCUMENT, 1, n);
    forward(&m, &a, &NO_DOCUMENT, tokens, n, 0, LOGITS_ALL);
    float *step = xmalloc((size_t)n * V * sizeof(float));
    for (int i = 0; i < n; i++) {
        forward(&m, &b, &NO_DOCUMENT, &tokens[i], 1, i, LOGITS_LAST);
        memcpy(step + (size_t)i * V, b.logits, V * sizeof(float));
    }
    check_close_f("all logits, block of 23 vs 23 single steps", a.logits, step, (size_t)n * V, 1e-4, 1e-4);
    /* one convention for LOGITS_LAST: the last row's logits in row 0, from forward and forward_segments alike */
    Segment whole = {tokens, n, 0, 0};
    forward(&m, &a, &NO_DOCUMENT, tokens, n, 0, LOGITS_LAST);
    memcpy(step, a.logits, V * sizeof(float));
    forward_segments(&m, &a, &NO_DOCUMENT, &whole, 1, LOGITS_LAST);
    check_close_f("LOGITS_LAST: forward's row 0 is the block's last row", step, step + (size_t)(n - 1) * V, V, 1e-4, 1e-4);
    check_close_f("LOGITS_LAST: forward_segments' row 0 is forward's", a.logits, step, V, 0, 0);
    free(step);
    runstate_free(&a); runstate_free(&b);
    model_free(&m);
}

/* Three sequences of different lengths after one document, run together
 * (prefill segments in one block, then decode steps of one token each),
 * give each sequence's logits run alone, for the exact and the Nectar
 * (modules) document. */
static void test_segments_equal_sequences_alone(void) {
    printf("several sequences in one forward vs each alone\n");
    enum { NDOC = 20, S = 3, STEPS = 4 };
    Model m;
    model_init_random(&m, small_gqa, 1, 5, 0.08f);
    const Config *c = &m.config;
    int V = c->vocab_size, len[S] = {7, 1, 12}, tokens[S][16], doc_ids[NDOC];
    uint64_t rng = 17;
    for (int i = 0; i < NDOC; i++) doc_ids[i] = rng_u32(&rng) % V;
    for (int k = 0; k < S; k++) for (int i = 0; i < 16; i++) tokens[k][i] = rng_u32(&rng) % V;
    DocCache cache;
    doccache_build(&cache, &m, doc_ids, NDOC, 8);
    ModuleSet ms;
    int widths[3] = {9, 9, 9};
    moduleset_alloc(&ms, ARCH_MLP, c->n_layers, c->n_kv_heads, c->dim / c->n_heads, 1, 1, 1, widths, 0);
    mlp_init(&ms, 3, NULL, NULL);
    for (size_t i = 0; i < ms.n_params; i++) ms.params[i] += 0.05f * rng_normal(&rng);  /* nonzero outputs */
    ms.n_doc = NDOC;
    Document docs[2] = {{DOC_EXACT, NDOC, &cache, NULL, NULL}, {DOC_NECTAR, NDOC, NULL, &ms, NULL}};
    for (int which = 0; which < 2; which++) {
        const Document *doc = &docs[which];
        RunState together, alone;
        runstate_alloc_seqs(&together, &m, doc, 20, 16, S);
        Segment prefill[S];
        for (int k = 0; k < S; k++) prefill[k] = (Segment){tokens[k], len[k], k, 0};
        forward_segments(&m, &together, doc, prefill, S, LOGITS_LAST);
        float *got = xmalloc((size_t)S * (STEPS + 1) * V * sizeof(float));
        memcpy(got, together.logits, (size_t)S * V * sizeof(float));
        for (int step = 0; step < STEPS; step++) {
            Segment next[S];
            for (int k = 0; k < S; k++) next[k] = (Segment){&tokens[k][len[k] + step], 1, k, len[k] + step};
            forward_segments(&m, &together, doc, next, S, LOGITS_LAST);
            memcpy(got + (size_t)(step + 1) * S * V, together.logits, (size_t)S * V * sizeof(float));
        }
        double max_err = 0;
        for (int k = 0; k < S; k++) {
            runstate_alloc(&alone, &m, doc, 16, 16);
            for (int step = 0; step <= STEPS; step++) {
                int n = step ? 1 : len[k], pos = step ? len[k] + step - 1 : 0;
                forward(&m, &alone, doc, &tokens[k][pos], n, pos, LOGITS_LAST);
                const float *want = alone.logits, *g = got + ((size_t)step * S + k) * V;
                for (int i = 0; i < V; i++) max_err = fmax(max_err, fabs(g[i] - want[i]));
            }
            runstate_free(&alone);
        }
        printf("    %s: prefill and %d decode steps, max |together - alone| %.2e\n", which ? "Nectar" : "exact", STEPS,
               max_err);
        check(which ? "Nectar: every sequence's logits as if it ran alone (1e-5)"
                    : "exact: every sequence's logits as if it ran alone (1e-5)", max_err < 1e-5);
        free(got);
        runstate_free(&together);
    }
    moduleset_free(&ms);
    doccache_free(&cache);
    model_free(&m);
}

static void test_checkpoint_roundtrip_is_exact(void) {
    printf("checkpoint write, load, run\n");
    for (int shared = 0; shared <= 1; shared++) {
        Model m, back;
        model_init_random(&m, small_gqa, shared, 17 + shared, 0.08f);
        const char *path = "tests/tmp_roundtrip.bin";
        int ok = model_save(&m, path) == 0 && model_load(&back, path) == 0;
        ok = ok && back.n_params == m.n_params && back.shared_classifier == shared &&
             memcmp(back.params, m.params, m.n_params * sizeof(float)) == 0 &&
             back.fingerprint == m.fingerprint;
        if (ok) {
            RunState s1, s2;
            int tokens[5] = {1, 50, 60, 70, 80};
            runstate_alloc(&s1, &m, &NO_DOCUMENT, 5, 5);
            runstate_alloc(&s2, &back, &NO_DOCUMENT, 5, 5);
            forward(&m, &s1, &NO_DOCUMENT, tokens, 5, 0, LOGITS_ALL);
            forward(&back, &s2, &NO_DOCUMENT, tokens, 5, 0, LOGITS_ALL);
            ok = memcmp(s1.logits, s2.logits, 5 * m.config.vocab_size * sizeof(float)) == 0;
            runstate_free(&s1); runstate_free(&s2);
            model_free(&back);
        }
        check(shared ? "shared classifier: same weights and logits" : "unshared classifier: same weights and logits", ok);
        remove(path);
        model_free(&m);
    }
}

/* The fixtures of tests/reference.py: logits at every position of
 * prompt + greedy continuation, and the greedy tokens themselves. */
static void test_logits_match_numpy_reference(const char *name) {
    printf("numpy reference fixture %s\n", name);
    char path[256], line_kind[16];
    snprintf(path, sizeof path, "tests/data/%s.bin", name);
    Model m;
    if (model_load(&m, path) != 0) { check("fixture model loads", 0); return; }
    snprintf(path, sizeof path, "tests/data/%s.expect", name);
    FILE *f = fopen(path, "r");
    if (!f) { check("fixture expectations open", 0); model_free(&m); return; }
    int V = m.config.vocab_size, np, ng, seq[512];
    int ok = fscanf(f, "%15s %d", line_kind, &np) == 2 && np < 256;
    for (int i = 0; ok && i < np; i++) ok = fscanf(f, "%d", &seq[i]) == 1;
    ok = ok && fscanf(f, "%15s %d", line_kind, &ng) == 2 && np + ng < 512;
    for (int i = 0; ok && i < ng; i++) ok = fscanf(f, "%d", &seq[np + i]) == 1;
    int n = np + ng - 1;  /* logits after each fed token */
    double *ref = xmalloc((size_t)n * V * sizeof(double));
    for (int t = 0; ok && t < n; t++) {
        int pos, vv;
        ok = fscanf(f, "%15s %d %d", line_kind, &pos, &vv) == 3 && pos == t && vv == V;
        for (int j = 0; ok && j < V; j++) ok = fscanf(f, "%lf", &ref[(size_t)t * V + j]) == 1;
    }
    fclose(f);
    check("fixture parses", ok);
    if (ok) {
        RunState s;
        runstate_alloc(&s, &m, &NO_DOCUMENT, n, n);
        forward(&m, &s, &NO_DOCUMENT, seq, n, 0, LOGITS_ALL);
        check_close("logits vs numpy float64, every position", s.logits, ref, (size_t)n * V, 1e-4, 1e-4);
        runstate_free(&s);
        /* greedy generation: prefill the prompt, then decode token by token */
        runstate_alloc(&s, &m, &NO_DOCUMENT, np, np + ng);
        forward(&m, &s, &NO_DOCUMENT, seq, np, 0, LOGITS_LAST);
        const float *last = s.logits;
        int same = 1;
        for (int i = 0; i < ng; i++) {
            int next = argmax(last, V);
            same &= next == seq[np + i];
            forward(&m, &s, &NO_DOCUMENT, &next, 1, np + i, LOGITS_LAST);
            last = s.logits;
        }
        check("greedy tokens equal the reference's", same);
        runstate_free(&s);
    }
    free(ref);
    model_free(&m);
}

static void test_module_file_roundtrip_and_fingerprints(void) {
    printf("module file\n");
    int sizes[2] = {5, 7};
    ModuleSet s, back;
    moduleset_alloc(&s, ARCH_MLP, 2, 3, 8, 1, 1, 1, sizes, 0);
    mlp_init(&s, 3, NULL, NULL);
    s.modules[4].input_scale = 0.25f;
    s.n_doc = 100; s.rho = 1.0f; s.model_fingerprint = 111; s.doc_fingerprint = 222;  /* rho: room for the sizes */
    const char *path = "tests/tmp_module.nectar";
    int ok = moduleset_save(&s, path) == 0 && moduleset_load(&back, path, 111, 222) == 0;
    ok = ok && back.n_params == s.n_params && memcmp(back.params, s.params, s.n_params * sizeof(float)) == 0 &&
         back.modules[4].input_scale == 0.25f && back.modules[5].width == 7 && back.n_doc == 100;
    if (ok) moduleset_free(&back);
    check("save and load give the same modules", ok);
    fprintf(stderr, "    (two refusals expected below)\n");
    check("another model's fingerprint is refused", moduleset_load(&back, path, 112, 222) != 0);
    check("another document's fingerprint is refused", moduleset_load(&back, path, 111, 223) != 0);
    remove(path);
    moduleset_free(&s);
}

static void test_tokenizer_roundtrip_and_merges(void) {
    printf("tokenizer\n");
    Tokenizer t;
    if (tokenizer_load(&t, "tests/data/tok_test.bin", 0) != 0) { check("test tokenizer loads", 0); return; }
    const char *texts[] = {"The quick brown fox jumps over the lazy dog.", "héllo wörld ✓\nline two",
                           "a", "   spaces   and\ttabs"};
    for (int i = 0; i < 4; i++) {
        int ids[256], n = tokenizer_encode(&t, texts[i], 1, 0, ids, 256);
        char out[512] = "";
        for (int j = 1; j < n; j++) strcat(out, tokenizer_decode(&t, ids[j - 1], ids[j]));
        char what[96];
        snprintf(what, sizeof what, "encode/decode round trip %d (%d tokens)", i, n);
        check(what, n > 1 && ids[0] == 1 && strcmp(out, texts[i]) == 0);
    }
    int ids[64], n_plain = tokenizer_encode(&t, "the the the", 0, 0, ids, 64);
    check("merges shorten 'the the the' below 12 tokens", n_plain > 0 && n_plain < 12);
    tokenizer_free(&t);
}


/* ------------------------------------------------------------------------ */
/* Backward through the transformer                                         */

/* Per-op checks: float backward against central differences of a double
 * version of the same forward. */
static void test_op_backward_matches_finite_differences(void) {
    printf("op backward vs finite differences (double)\n");
    enum { N = 24 };
    uint64_t rng = 123;
    float x[N], w[N], dout[N], dx[N] = {0}, dw[N] = {0};
    fill_normal(x, N, 1.0f, &rng);
    fill_normal(w, N, 1.0f, &rng);
    fill_normal(dout, N, 1.0f, &rng);
    rmsnorm_backward(dx, dw, x, w, dout, N, 1e-5f);
    double fdx[N], fdw[N], h = 1e-6;
    for (int which = 0; which < 2; which++)
        for (int j = 0; j < N; j++) {
            double L[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                double xx[N], ww[N], ss = 0;
                for (int i = 0; i < N; i++) { xx[i] = x[i]; ww[i] = w[i]; }
                (which ? ww : xx)[j] += sgn ? -h : h;
                for (int i = 0; i < N; i++) ss += xx[i] * xx[i];
                double r = 1 / sqrt(ss / N + 1e-5);
                L[sgn] = 0;
                for (int i = 0; i < N; i++) L[sgn] += dout[i] * ww[i] * xx[i] * r;
            }
            (which ? fdw : fdx)[j] = (L[0] - L[1]) / (2 * h);
        }
    check_close("rmsnorm backward dx", dx, fdx, N, 1e-5, 1e-4);
    check_close("rmsnorm backward dw", dw, fdw, N, 1e-5, 1e-4);

    /* RoPE: the backward is the rotation by minus the angle (base 100000, as SmolLM2's) */
    float v[N], g[N], gr[N];
    fill_normal(v, N, 1.0f, &rng);
    fill_normal(g, N, 1.0f, &rng);
    memcpy(gr, g, sizeof g);
    float cs[8];
    rope_angles(cs, 1, 37, 8, 100000.0f);
    rope(gr, N, 8, cs, -1.0f);
    double fdr[N];
    for (int j = 0; j < N; j++) {
        double L[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            double vv[N];
            for (int i = 0; i < N; i++) vv[i] = v[i];
            vv[j] += sgn ? -h : h;
            L[sgn] = 0;
            for (int i = 0; i < N; i += 2) {
                double a = 37.0 / pow(100000.0, (i % 8) / 8.0);
                L[sgn] += g[i] * (vv[i] * cos(a) - vv[i + 1] * sin(a)) + g[i + 1] * (vv[i] * sin(a) + vv[i + 1] * cos(a));
            }
        }
        fdr[j] = (L[0] - L[1]) / (2 * h);
    }
    check_close("rope backward (rotation by -angle)", gr, fdr, N, 1e-5, 1e-4);

    /* merge: A = (e^l1 A1 + e^l2 A2) / (e^l1 + e^l2) */
    enum { D = 8 };
    float A1[D], A2[D], dA[D], dA1[D], dA2[D], l1 = 0.7f, l2 = -0.4f, dl1, dl2;
    fill_normal(A1, D, 1.0f, &rng);
    fill_normal(A2, D, 1.0f, &rng);
    fill_normal(dA, D, 1.0f, &rng);
    merge_states_backward(D, A1, l1, A2, l2, dA, dA1, &dl1, dA2, &dl2);
    float got[2 * D + 2];
    double fd[2 * D + 2];
    memcpy(got, dA1, sizeof dA1); memcpy(got + D, dA2, sizeof dA2); got[2 * D] = dl1; got[2 * D + 1] = dl2;
    for (int j = 0; j < 2 * D + 2; j++) {
        double L[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            double a1[D], a2[D], la = l1, lb = l2, e = sgn ? -h : h;
            for (int i = 0; i < D; i++) { a1[i] = A1[i]; a2[i] = A2[i]; }
            if (j < D) a1[j] += e; else if (j < 2 * D) a2[j - D] += e; else if (j == 2 * D) la += e; else lb += e;
            double w1 = exp(la), w2 = exp(lb);
            L[sgn] = 0;
            for (int i = 0; i < D; i++) L[sgn] += dA[i] * (w1 * a1[i] + w2 * a2[i]) / (w1 + w2);
        }
        fd[j] = (L[0] - L[1]) / (2 * h);
    }
    check_close("merge backward (dA1, dA2, dlse1, dlse2)", got, fd, 2 * D + 2, 1e-5, 1e-4);
    float zero[D] = {0};
    merge_states_backward(D, zero, -INFINITY, A2, l2, dA, dA1, &dl1, dA2, &dl2);
    int finite = dl1 == 0 && dl2 == 0;
    for (int i = 0; i < D; i++) finite &= dA1[i] == 0 && dA2[i] == dA[i];
    check("merge backward with an empty document state", finite);
}

/* KL(teacher || Nectar student) of the prompt, in doubles: the loss the
 * finite differences perturb. */
static double student_kl(const Model *m, RunState *s, const Document *doc, const int *prompt, int n,
                         const float *teacher, float *dlogits) {
    forward(m, s, doc, prompt, n, 0, LOGITS_ALL);
    return kl_loss(teacher, s->logits, n, m->config.vocab_size, dlogits);
}

static void test_kl_gradient_matches_finite_differences(void) {
    printf("KL distillation gradients through the frozen transformer\n");
    Model m;
    model_init_random(&m, small_gqa, 1, 42, 0.15f);
    const Config *c = &m.config;
    int L = c->n_layers, G = c->n_kv_heads, d = c->dim / c->n_heads, V = c->vocab_size;
    enum { NDOC = 30, NP = 12 };
    int doc_ids[NDOC], prompt[NP];
    uint64_t rng = 77;
    for (int i = 0; i < NDOC; i++) doc_ids[i] = 3 + rng_u32(&rng) % (V - 3);
    for (int i = 0; i < NP; i++) prompt[i] = 3 + rng_u32(&rng) % (V - 3);
    DocCache cache;
    doccache_build(&cache, &m, doc_ids, NDOC, 8);
    Document full = {DOC_EXACT, NDOC, &cache, NULL, NULL};
    RunState ts;
    runstate_alloc(&ts, &m, &full, NP, NP);
    forward(&m, &ts, &full, prompt, NP, 0, LOGITS_ALL);
    float *teacher = xmalloc((size_t)NP * V * sizeof(float)), *dlogits = xmalloc((size_t)NP * V * sizeof(float));
    memcpy(teacher, ts.logits, (size_t)NP * V * sizeof(float));

    /* oracle modules: KL is zero to float precision */
    ModuleSet oracle;
    int p[3] = {NDOC, NDOC, NDOC};
    moduleset_alloc(&oracle, ARCH_QUAD, L, G, d, 0, 0, 0, p, 0);
    quad_init_from_cache(&oracle, &cache);
    oracle.n_doc = NDOC;
    Document od = {DOC_NECTAR, NDOC, NULL, &oracle, NULL};
    RunState os;
    runstate_alloc(&os, &m, &od, NP, NP);
    double kl0 = student_kl(&m, &os, &od, prompt, NP, teacher, NULL);
    printf("    KL(teacher || oracle Nectar) = %.3g\n", kl0);
    check("KL of the oracle module is 0 to float precision", fabs(kl0) < 1e-9);
    runstate_free(&os);
    moduleset_free(&oracle);

    /* MLP modules with random (nonzero) outputs, and weight gradients too */
    for (int arch = ARCH_MLP; arch <= ARCH_QUAD; arch++) {
        ModuleSet ms;
        int sizes[3] = {6, 6, 6};
        moduleset_alloc(&ms, arch, L, G, d, 1, 1, 1, sizes, 1);
        if (arch == ARCH_MLP) fill_normal(ms.params, ms.n_params, 0.3f, &rng);
        else quad_init_from_cache(&ms, &cache);
        ms.n_doc = NDOC;
        Document nd = {DOC_NECTAR, NDOC, NULL, &ms, NULL};
        RunState s;
        runstate_alloc(&s, &m, &nd, NP, NP);
        runstate_enable_backward(&s, &m);
        float *dparams = xmalloc(m.n_params * sizeof(float));
        Weights dw;
        weights_view(c, m.shared_classifier, dparams, &dw);
        memset(ms.grads, 0, ms.n_params * sizeof(float));
        double kl = student_kl(&m, &s, &nd, prompt, NP, teacher, dlogits);
        backward(&m, &s, &nd, prompt, NP, dlogits, &dw);
        printf("    %s modules: KL %.4f\n", arch == ARCH_MLP ? "MLP" : "quadrature", kl);

        /* central differences on a handful of parameters, each the largest
         * gradient of its tensor: first- and last-layer modules, and weights */
        struct { const char *name; float *param, *grad; size_t n; } groups[] = {
            {"module (layer 0, KV head 0)", ms.modules[0].params, ms.modules[0].grads, ms.modules[0].n_params},
            {"module (last layer, KV head 1)", ms.modules[L * G - 1].params, ms.modules[L * G - 1].grads, ms.modules[L * G - 1].n_params},
            {"wq layer 0", m.w.wq, dw.wq, (size_t)c->dim * c->dim},
            {"wk layer 0", m.w.wk, dw.wk, (size_t)c->dim * c->dim / 4},
            {"wv layer 1", m.w.wv + (size_t)c->dim * c->dim / 4, dw.wv + (size_t)c->dim * c->dim / 4, (size_t)c->dim * c->dim / 4},
            {"wo layer 2", m.w.wo + (size_t)2 * c->dim * c->dim, dw.wo + (size_t)2 * c->dim * c->dim, (size_t)c->dim * c->dim},
            {"w1 layer 1", m.w.w1 + (size_t)c->dim * c->hidden_dim, dw.w1 + (size_t)c->dim * c->hidden_dim, (size_t)c->dim * c->hidden_dim},
            {"w2 layer 0", m.w.w2, dw.w2, (size_t)c->dim * c->hidden_dim},
            {"w3 layer 2", m.w.w3 + (size_t)2 * c->dim * c->hidden_dim, dw.w3 + (size_t)2 * c->dim * c->hidden_dim, (size_t)c->dim * c->hidden_dim},
            {"rms_att", m.w.rms_att, dw.rms_att, (size_t)L * c->dim},
            {"rms_ffn", m.w.rms_ffn, dw.rms_ffn, (size_t)L * c->dim},
            {"rms_final", m.w.rms_final, dw.rms_final, (size_t)c->dim},
            {"token_embedding (= classifier)", m.w.token_embedding, dw.token_embedding, (size_t)V * c->dim},
        };
        int n_groups = arch == ARCH_MLP ? (int)(sizeof(groups) / sizeof(groups[0])) : 2;
        double worst = 0;
        for (int gi = 0; gi < n_groups; gi++) {
            size_t picked[3];
            for (int pick = 0; pick < 3; pick++) {
                /* the largest |gradient| entries not yet picked: float noise is small beside them */
                size_t best = SIZE_MAX;
                for (size_t i = 0; i < groups[gi].n; i++) {
                    int taken = 0;
                    for (int k = 0; k < pick; k++) taken |= picked[k] == i;
                    if (!taken && (best == SIZE_MAX || fabsf(groups[gi].grad[i]) > fabsf(groups[gi].grad[best]))) best = i;
                }
                picked[pick] = best;
                /* dKL/dtheta ~ (KL(theta + eps) - KL(theta - eps)) / 2 eps. The step
                 * (2% of the parameter, at least 6e-3) must move the KL far beyond
                 * the rounding of the float forward, about 2e-7 here and different
                 * at every theta: the smallest gradients picked (the last layer's
                 * modules, 4e-3) had 0.4% of noise with steps of 1% (at least 1e-3) */
                float *p = &groups[gi].param[best], keep = *p, eps = 2e-2f * fmaxf(fabsf(keep), 0.3f);
                *p = keep + eps;
                double up = student_kl(&m, &s, &nd, prompt, NP, teacher, NULL);
                *p = keep - eps;
                double down = student_kl(&m, &s, &nd, prompt, NP, teacher, NULL);
                *p = keep;
                double fd = (up - down) / (2.0 * eps), rel = fabs(fd - groups[gi].grad[best]) / fmax(fabs(fd), 1e-12);
                worst = fmax(worst, rel);
                printf("    %-32s grad %+.5e  fd %+.5e  rel %.1e\n", groups[gi].name, groups[gi].grad[best], fd, rel);
            }
        }
        char what[96];
        snprintf(what, sizeof what, "%s: KL gradients vs central differences (rel < 5e-3)", arch == ARCH_MLP ? "MLP" : "quadrature");
        check(what, worst < 5e-3);
        free(dparams);
        runstate_free(&s);
        moduleset_free(&ms);
    }
    free(teacher); free(dlogits);
    runstate_free(&ts);
    doccache_free(&cache);
    model_free(&m);
}

/* The value of a bf16 bit pattern's magnitude from its fields, in doubles:
 * exponent field e, mantissa m (7 bits): m 2^-133 when e = 0, else
 * (128 + m) 2^(e - 134); e = 255, m = 0 gives 2^128, the step past the
 * largest finite bf16, which rounding reaches as infinity. */
static double bf16_magnitude(uint32_t h) {
    uint32_t e = (h >> 7) & 0xFF, m = h & 0x7F;
    return e ? ldexp(128.0 + m, (int)e - 134) : ldexp(m, -133);
}

/* bf16_from_float against rounding to nearest from the definition: of the
 * two bf16 magnitudes around |x| (the float's upper half, and the next),
 * the nearer, a tie to the even pattern; every bf16 other than a NaN
 * round-trips, a NaN stays a NaN. */
static void test_bf16_rounds_to_nearest_even(void) {
    printf("bf16: round to nearest even, against the definition\n");
    int round_trip = 1, nan_kept = 1;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float x = float_from_bf16((uint16_t)h);
        if (isnan(x)) nan_kept &= isnan(float_from_bf16(bf16_from_float(x)));
        else round_trip &= bf16_from_float(x) == h;
    }
    check("every bf16 but NaN round-trips, NaN stays NaN", round_trip && nan_kept);
    uint64_t rng = 11;
    long wrong = 0, ties = 0;
    double max_rel = 0;
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = rng_u32(&rng);
        if (i % 4 == 0) u = (u & 0xFFFF0000u) | 0x8000u;  /* exactly halfway */
        if ((u & 0x7F800000u) == 0x7F800000u) continue;  /* infinities and NaNs */
        float x;
        memcpy(&x, &u, sizeof x);
        uint32_t low = u >> 16, high = low + 1;  /* patterns of the magnitudes below and above |x| */
        double below = fabs(x) - bf16_magnitude(low), above = bf16_magnitude(high) - fabs(x);
        uint32_t want = below < above || (below == above && !(low & 1)) ? low : high;
        ties += below == above;
        wrong += bf16_from_float(x) != want;
        if (isnormal(x) && fabs(x) < 3e38) max_rel = fmax(max_rel, fabs(float_from_bf16(bf16_from_float(x)) - x) / fabs(x));
    }
    printf("    %ld of 1e6 floats rounded otherwise, %ld ties among them; relative error at most %.3g\n", wrong, ties, max_rel);
    check("every float rounds to the nearest bf16, ties to even", wrong == 0 && ties > 100000);
    check("relative error at most 2^-8 (normal floats)", max_rel <= ldexp(1, -8));
    check("the largest float rounds to infinity", isinf(float_from_bf16(bf16_from_float(3.40282347e38f))));
}

/* The regression loss of train.c over every module, in doubles, from the
 * definition: module g of layer l sees head h = g (H/G) + j at each batch
 * position, and
 *   L = sum_(l, g) [lambda_alpha mean (a - alpha)^2 + lambda_A mean ||A_theta - A||^2]
 * with means over the module's N = B (H/G) queries. */
static double naive_regression_loss(const ModuleSet *s, const double *params, const FitTargets *t,
                                    const long *pos, int B, int H, double lambda_alpha, double lambda_A) {
    int L = s->n_layers, G = s->n_kv_heads, d = s->head_size, group = H / G, N = B * group;
    double loss = 0, a, A[256];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < G; g++) {
            const Module *mod = &s->modules[l * G + g];
            for (int bi = 0; bi < B; bi++)
                for (int j = 0; j < group; j++) {
                    int h = g * group + j;
                    size_t at = (size_t)l * t->P + pos[bi];
                    float q[256];
                    for (int c = 0; c < d; c++) q[c] = float_from_bf16(t->q[at * H * d + (size_t)h * d + c]);
                    naive_module(s, mod, params + (mod->params - s->params), q, &a, A);
                    double ea = a - t->alpha[at * H + h], eA = 0;
                    for (int c = 0; c < d; c++) {
                        double e = A[c] - float_from_bf16(t->A[at * H * d + (size_t)h * d + c]);
                        eA += e * e;
                    }
                    loss += (lambda_alpha * ea * ea + lambda_A * eA) / N;
                }
        }
    return loss;
}

/* regression_grads (gather, loss weights, every module's backward) against
 * the definition above: its loss, and its gradient by central differences. */
static void test_regression_loss_matches_definition(ModuleArch arch) {
    enum { L = 2, G = 2, H = 6, d = 8, P = 5, B = 3 };
    printf("regression loss over all modules, %s, GQA %d/%d\n", arch == ARCH_MLP ? "MLP" : "quadrature", H, G);
    int sizes[L] = {4, 3};
    ModuleSet s;
    moduleset_alloc(&s, arch, L, G, d, 1, 1, 1, sizes, 1);
    uint64_t rng = 5;
    fill_normal(s.params, s.n_params, 0.4f, &rng);
    for (int i = 0; i < L * G; i++) s.modules[i].input_scale = 0.5f + 0.1f * i;
    uint16_t q[L * P * H * d], A_t[L * P * H * d];  /* bf16, as train.c keeps them */
    float alpha_t[L * P * H];
    fill_normal_bf16(q, L * P * H * d, 1.0f, &rng);
    fill_normal_bf16(A_t, L * P * H * d, 1.0f, &rng);
    fill_normal(alpha_t, L * P * H, 2.0f, &rng);
    FitTargets t = {P, q, A_t, alpha_t};
    FitBatch b;
    fitbatch_alloc(&b, &s, H, B);
    long pos[B] = {3, 0, 3};  /* a position drawn twice counts twice */
    memcpy(b.pos, pos, sizeof pos);
    ModuleWork w;
    modulework_alloc(&w, &s, b.N);
    const float lambda_alpha = 0.3f, lambda_A = 1.7f;
    memset(s.grads, 0, s.n_params * sizeof(float));
    double loss = regression_grads(&s, &w, &b, &t, H, lambda_alpha, lambda_A);

    double *params = xmalloc(s.n_params * sizeof(double)), *fd = xmalloc(s.n_params * sizeof(double));
    for (size_t i = 0; i < s.n_params; i++) params[i] = s.params[i];
    double want = naive_regression_loss(&s, params, &t, pos, B, H, lambda_alpha, lambda_A);
    printf("    loss %.9g, by the definition %.9g\n", loss, want);
    check("loss equals the definition (rel 1e-5)", fabs(loss - want) <= 1e-5 * fabs(want));
    /* dL/dtheta_i = (L(+h) - L(-h)) / 2h */
    const double h = 1e-6;
    for (size_t i = 0; i < s.n_params; i++) {
        double keep = params[i];
        params[i] = keep + h; double up = naive_regression_loss(&s, params, &t, pos, B, H, lambda_alpha, lambda_A);
        params[i] = keep - h; double down = naive_regression_loss(&s, params, &t, pos, B, H, lambda_alpha, lambda_A);
        params[i] = keep;
        fd[i] = (up - down) / (2 * h);
    }
    check_close("gradient of every module vs finite differences", s.grads, fd, s.n_params, 1e-5, 1e-3);
    free(params); free(fd);
    modulework_free(&w);
    fitbatch_free(&b);
    moduleset_free(&s);
}

/* clip_grad_norm and adamw_update against their closed forms. */
static void test_clip_and_adamw_match_closed_forms(void) {
    printf("gradient clipping and AdamW against closed forms\n");
    float g[2] = {3, 4};
    double norm = clip_grad_norm(g, 2, 1.0), want_g[2] = {0.6, 0.8};
    check("clip (3, 4) to norm 1: returns 5", fabs(norm - 5) < 1e-12);
    check_close("clip (3, 4) to norm 1: leaves (0.6, 0.8)", g, want_g, 2, 0, 1e-7);
    float small[2] = {0.3f, 0.4f};
    double want_small[2] = {0.3f, 0.4f};
    clip_grad_norm(small, 2, 1.0);
    check_close("clip (0.3, 0.4) to norm 1: unchanged", small, want_small, 2, 0, 0);

    /* two steps from m = v = 0, in doubles:
     *   m_t = b1 m_{t-1} + (1 - b1) g_t,  v_t = b2 v_{t-1} + (1 - b2) g_t^2,
     *   theta -= lr ((m_t / (1 - b1^t)) / (sqrt(v_t / (1 - b2^t)) + eps) + wd theta) */
    enum { N = 4 };
    const float grads[2][N] = {{0.5f, -2.0f, 1e-3f, 0.0f}, {-0.25f, -1.0f, 3e-3f, 0.0f}};
    const float lr = 0.01f, wd = 0.1f, b1 = ADAM_BETA1;
    const float beta2s[2] = {ADAM_BETA2, 0.95f};
    for (int k = 0; k < 2; k++) {
        float params[N] = {1.0f, -0.5f, 2.0f, 3.0f}, m[N] = {0}, v[N] = {0};
        double want[N], dm[N] = {0}, dv[N] = {0}, b2 = beta2s[k];
        for (int i = 0; i < N; i++) want[i] = params[i];
        for (int step = 1; step <= 2; step++) {
            adamw_update(params, grads[step - 1], m, v, N, step, lr, wd, beta2s[k]);
            for (int i = 0; i < N; i++) {
                double gi = grads[step - 1][i];
                dm[i] = b1 * dm[i] + (1 - b1) * gi;
                dv[i] = b2 * dv[i] + (1 - b2) * gi * gi;
                double mhat = dm[i] / (1 - pow(b1, step)), vhat = dv[i] / (1 - pow(b2, step));
                want[i] -= lr * (mhat / (sqrt(vhat) + ADAM_EPS) + wd * want[i]);
            }
        }
        char what[80];
        snprintf(what, sizeof what, "AdamW, two steps, beta2 %.3g (one gradient 0: decay only)", beta2s[k]);
        check_close(what, params, want, N, 0, 1e-6);
    }
}

/* The top-k KL against its definition, computed naively in doubles: the
 * teacher's k likeliest tokens found by sorting, the rest one bucket, the
 * student's softmax summed over the same buckets; its gradient against
 * central differences; with k = V, kl_loss itself. */
static void test_top_k_kl_matches_definition(void) {
    enum { T = 3, V = 40, K = 5 };
    printf("top-k KL (k = %d of %d) against its definition\n", K, V);
    uint64_t rng = 11;
    float teacher[T * V], student[T * V], logp[T * V], rest[T], grad[T * V], grad_full[T * V];
    int ids[T * V];
    fill_normal(teacher, T * V, 2.0f, &rng);
    fill_normal(student, T * V, 2.0f, &rng);
    teacher[3] = teacher[7] = 8.0f;  /* the likeliest two, tied: the lower id first */
    double want_kl = 0, want_grad[T * V], want_rest[T], want_logp[T * K];
    int ids_ok = 1;
    for (int t = 0; t < T; t++) {
        double p[V], q[V], zp = 0, zq = 0;
        for (int j = 0; j < V; j++) { zp += exp(teacher[t * V + j]); zq += exp(student[t * V + j]); }
        for (int j = 0; j < V; j++) { p[j] = exp(teacher[t * V + j]) / zp; q[j] = exp(student[t * V + j]) / zq; }
        int top[V], is_top[V] = {0};
        for (int j = 0; j < V; j++) top[j] = j;
        for (int a = 0; a < V; a++)      /* selection sort: largest p first, the lower id on a tie */
            for (int b = a + 1; b < V; b++)
                if (p[top[b]] > p[top[a]] || (p[top[b]] == p[top[a]] && top[b] < top[a])) {
                    int x = top[a]; top[a] = top[b]; top[b] = x;
                }
        top_k_logprobs(teacher + t * V, V, K, ids + t * K, logp + t * K, rest + t);
        double p_rest = 0, q_rest = 0;
        for (int r = 0; r < K; r++) {
            is_top[top[r]] = 1;
            ids_ok &= ids[t * K + r] == top[r];
            want_logp[t * K + r] = log(p[top[r]]);
            want_kl += p[top[r]] * log(p[top[r]] / q[top[r]]) / T;
        }
        for (int j = 0; j < V; j++) if (!is_top[j]) { p_rest += p[j]; q_rest += q[j]; }
        want_rest[t] = log(p_rest);
        want_kl += p_rest * log(p_rest / q_rest) / T;
        for (int j = 0; j < V; j++)
            want_grad[t * V + j] = (is_top[j] ? q[j] - p[j] : q[j] - p_rest * q[j] / q_rest) / T;
    }
    check("the k likeliest tokens, largest first (a tie: the lower id)", ids_ok);
    check_close("their log-probabilities", logp, want_logp, T * K, 1e-6, 1e-6);
    check_close("the log of the rest's mass", rest, want_rest, T, 1e-6, 1e-6);
    double kl = kl_loss_top_k(ids, logp, rest, K, student, T, V, grad);
    check("KL = sum_top p log(p/q) + p_rest log(p_rest/q_rest)", fabs(kl - want_kl) <= 1e-6 * want_kl);
    check_close("its gradient: q_j - p_j (top), q_j (1 - p_rest / q_rest) (rest)", grad, want_grad, T * V, 1e-7, 1e-5);
    /* central differences of the function itself, in its float inputs */
    double fd[T * V];
    for (int j = 0; j < T * V; j++) {
        float keep = student[j], h = 1e-2f;
        student[j] = keep + h;
        double up = kl_loss_top_k(ids, logp, rest, K, student, T, V, NULL);
        student[j] = keep - h;
        double down = kl_loss_top_k(ids, logp, rest, K, student, T, V, NULL);
        student[j] = keep;
        fd[j] = (up - down) / (2.0 * h);
    }
    check_close("its gradient against central differences", grad, fd, T * V, 2e-5, 1e-2);
    /* k = V: the whole distribution, no rest: kl_loss */
    for (int t = 0; t < T; t++) top_k_logprobs(teacher + t * V, V, V, ids + t * V, logp + t * V, rest + t);
    kl = kl_loss_top_k(ids, logp, rest, V, student, T, V, grad);
    double full = kl_loss(teacher, student, T, V, grad_full), want_full[T * V];
    for (int j = 0; j < T * V; j++) want_full[j] = grad_full[j];
    check("k = V: no rest (log mass -inf), the KL of kl_loss", isinf(rest[0]) && rest[0] < 0 && fabs(kl - full) <= 1e-6 * full);
    check_close("k = V: the gradient of kl_loss", grad, want_full, T * V, 1e-8, 1e-5);
}

/* evaluate() against its definitions, recomputed here. Quadrature modules
 * W = K, Z = V + u (u one vector per (layer, KV head)) give alpha exactly and
 * A_theta = A + u (the softmax sums to 1), so the module error is known. */
static void test_evaluate_metrics_match_definitions(void) {
    printf("evaluate() against its definitions (quadrature modules with a known error)\n");
    Model m;
    model_init_random(&m, small_gqa, 1, 42, 0.15f);
    const Config *c = &m.config;
    int L = c->n_layers, G = c->n_kv_heads, H = c->n_heads, D = c->dim, d = D / H, V = c->vocab_size;
    enum { NDOC = 30, NPROMPTS = 3, MAXLEN = 9 };
    const int lens[NPROMPTS] = {7, 9, 5};
    int doc_ids[NDOC], offsets[NPROMPTS + 1] = {0}, tokens[NPROMPTS * MAXLEN];
    unsigned char split_flags[NPROMPTS] = {0};
    uint64_t rng = 31;
    for (int i = 0; i < NDOC; i++) doc_ids[i] = 3 + rng_u32(&rng) % (V - 3);
    DocCache cache;
    doccache_build(&cache, &m, doc_ids, NDOC, 8);
    Document full = {DOC_EXACT, NDOC, &cache, NULL, NULL};
    RunState sf;
    runstate_alloc(&sf, &m, &full, MAXLEN, MAXLEN);
    runstate_enable_taps(&sf, &m);
    /* prompts: random tokens, every other one the full model's greedy choice,
     * so that accuracy is not 0 */
    for (int i = 0; i < NPROMPTS; i++) {
        offsets[i + 1] = offsets[i] + lens[i];
        for (int t = 0; t < lens[i]; t++) {
            int *at = tokens + offsets[i] + t;
            if (t % 2 == 0) { *at = 3 + rng_u32(&rng) % (V - 3); continue; }
            forward(&m, &sf, &full, tokens + offsets[i], t, 0, LOGITS_LAST);
            *at = argmax(sf.logits, V);
        }
    }
    PromptSet prompts = {.n_prompts = NPROMPTS, .offsets = offsets, .tokens = tokens, .split = split_flags};
    ModuleSet ms;
    int p[3] = {NDOC, NDOC, NDOC};
    moduleset_alloc(&ms, ARCH_QUAD, L, G, d, 0, 0, 0, p, 0);
    quad_init_from_cache(&ms, &cache);
    ms.n_doc = NDOC;
    float *u = xmalloc((size_t)L * G * d * sizeof(float));  /* (L, G, d) */
    fill_normal(u, (size_t)L * G * d, 0.05f, &rng);
    for (int i = 0; i < L * G; i++)
        for (int j = 0; j < NDOC; j++)
            for (int k = 0; k < d; k++) ms.modules[i].params[(size_t)(NDOC + j) * d + k] += u[(size_t)i * d + k];

    EvalResult split[EVAL_SPLITS];
    Document nectar = {DOC_NECTAR, NDOC, NULL, &ms, NULL};
    check("evaluate runs", evaluate(&m, &full, &nectar, &prompts, split) == 0);
    const EvalResult r = split[EVAL_RANDOM];

    /* the same quantities from forward passes of our own */
    RunState sn;
    runstate_alloc(&sn, &m, &nectar, MAXLEN, MAXLEN);
    double kl = 0, kl_reverse = 0, hits_full = 0, hits_nectar = 0, agree = 0, positions = 0, target_mse = 0;
    double *log_ratio = xmalloc((size_t)L * H * sizeof(double));  /* (L, H) sums over queries */
    double prompt_kl[NPROMPTS], prompt_positions[NPROMPTS];      /* each prompt's KL sum and positions */
    long queries = 0;
    for (int i = 0; i < NPROMPTS; i++) {
        const int *prompt = tokens + offsets[i];
        int len = lens[i];
        forward(&m, &sf, &full, prompt, len, 0, LOGITS_ALL);
        forward(&m, &sn, &nectar, prompt, len, 0, LOGITS_ALL);
        /* KL(full || Nectar) over the len - 1 next-token predictions */
        prompt_kl[i] = kl_loss(sf.logits, sn.logits, len - 1, V, NULL) * (len - 1);
        prompt_positions[i] = len - 1;
        kl += prompt_kl[i];
        kl_reverse += kl_loss(sn.logits, sf.logits, len - 1, V, NULL) * (len - 1);
        for (int t = 0; t + 1 < len; t++) {
            int top_full = argmax(sf.logits + (size_t)t * V, V), top_nectar = argmax(sn.logits + (size_t)t * V, V);
            hits_full += top_full == prompt[t + 1];
            hits_nectar += top_nectar == prompt[t + 1];
            agree += top_nectar == top_full;
            positions++;
        }
        /* RTE's terms log(||u||^2 / ||q - A||^2) at every query of every (layer, head) */
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++) {
                const float *uh = u + ((size_t)l * G + h / (H / G)) * d;
                double uu = 0;
                for (int k = 0; k < d; k++) uu += (double)uh[k] * uh[k];
                for (int t = 0; t < len; t++) {
                    const float *q = sf.taps.q + ((size_t)l * MAXLEN + t) * D + h * d;
                    const float *A = sf.taps.doc_A + ((size_t)l * MAXLEN + t) * D + h * d;
                    double base = 0;
                    for (int k = 0; k < d; k++) base += ((double)q[k] - A[k]) * ((double)q[k] - A[k]);
                    log_ratio[l * H + h] += log(uu / base);
                    target_mse += uu;
                }
            }
        queries += (long)len * L * H;
    }
    double log_rte = 0;
    for (int i = 0; i < L * H; i++) log_rte += log_ratio[i] / (queries / (L * H));
    printf("    KL(full || Nectar) %.5f, KL(Nectar || full) %.5f\n", kl / positions, kl_reverse / positions);
    check("the two KL directions differ here by > 1000x the tolerance", fabs(kl - kl_reverse) > 1e-3 * kl);
    struct { const char *name; double got, want, rtol; } metrics[] = {
        {"KL(full || Nectar)", r.kl, kl / positions, 1e-6},
        {"accuracy, full cache", r.acc_full, hits_full / positions, 0},
        {"accuracy, Nectar", r.acc_nectar, hits_nectar / positions, 0},
        {"top-1 agreement", r.agree, agree / positions, 0},
        {"target MSE = mean ||u||^2", r.target_mse, target_mse / queries, 1e-4},
        {"RTE = exp(mean_{l,h} mean log(|u|^2 / |q - A|^2))", r.rte, exp(log_rte / (L * H)), 1e-4},
    };
    for (size_t i = 0; i < sizeof metrics / sizeof metrics[0]; i++) {
        float got = (float)metrics[i].got;
        check_close(metrics[i].name, &got, &metrics[i].want, 1, 1e-7, metrics[i].rtol);
    }
    check("score MSE is 0 to float precision (alpha exact)", r.score_mse < 1e-9);
    printf("    %.0f positions: %.0f right (full), %.0f right (Nectar), %.0f agree\n", positions, hits_full, hits_nectar, agree);
    check("accuracy, agreement and KL are not trivial here", agree > 0 && agree < positions && kl > 1e-4);
    /* KL's interval: prompts as clusters, SE^2 = n / (n - 1) sum_i (y_i - R x_i)^2 / (sum x)^2 */
    double R = kl / positions, spread = 0;
    for (int i = 0; i < NPROMPTS; i++) spread += pow(prompt_kl[i] - R * prompt_positions[i], 2);
    double se = sqrt(spread * NPROMPTS / (NPROMPTS - 1)) / positions;
    float ci[2] = {(float)r.kl_ci[0], (float)r.kl_ci[1]};
    double z = 1.959963984540054;
    check_close("KL's 95% interval over prompts: R -+ 1.96 SE", ci, (double[]){R - z * se, R + z * se}, 2, 0, 1e-5);
    for (int k = 0; k < EVAL_SPLITS; k++) evalresult_free(&split[k]);
    free(log_ratio); free(u);
    runstate_free(&sf); runstate_free(&sn);
    moduleset_free(&ms);
    doccache_free(&cache);
    model_free(&m);
}

/* answer_prefix_fraction on hand-built answers: the tokens of ref that got
 * reproduces before the first difference, over ref's length. */
static void test_answer_prefix_matches_definition(void) {
    printf("answer prefix: hand-built cases\n");
    const int ref[4] = {5, 6, 7, 8}, diverge[3] = {5, 6, 9}, same[4] = {5, 6, 7, 8}, longer[5] = {5, 6, 7, 8, 9};
    const int first[1] = {9};
    struct { const char *what; const int *got; int n_got; double want; } cases[] = {
        {"2 of 4 before the divergence: 0.5", diverge, 3, 0.5},
        {"the same answer: 1", same, 4, 1.0},
        {"ref then more: all of ref reproduced, 1", longer, 5, 1.0},
        {"a first token that differs: 0", first, 1, 0.0},
        {"an empty answer: 0", first, 0, 0.0},
        {"stopped after 3 of ref's 4: 0.75", same, 3, 0.75},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check(cases[i].what, answer_prefix_fraction(ref, 4, cases[i].got, cases[i].n_got) == cases[i].want);
    check("an empty ref counts as reproduced: 1", answer_prefix_fraction(ref, 0, first, 1) == 1.0);
}

/* The greedy answer by its definition: every token is the argmax of a
 * forward of the whole question + answer so far, from position 0 (no
 * decoding cache), until a stop token (kept) or cap tokens. */
static int naive_answer(const Model *m, const Document *doc, const int *question, int nq, const int stop[2], int cap,
                        int *answer) {
    int V = m->config.vocab_size, n = 0, *seq = xmalloc((nq + cap) * sizeof(int));  /* (nq + cap) */
    memcpy(seq, question, nq * sizeof(int));
    RunState s;
    runstate_alloc(&s, m, doc, nq + cap, nq + cap);
    while (n < cap) {
        forward(m, &s, doc, seq, nq + n, 0, LOGITS_LAST);
        int next = argmax(s.logits, V);
        seq[nq + n] = answer[n] = next;
        n++;
        if (next == stop[0] || next == stop[1]) break;
    }
    runstate_free(&s);
    free(seq);
    return n;
}

/* The metrics recomputed from naive_answer for one split. */
typedef struct {
    double match, match_nodoc, prefix;
    int n, stopped, same_answers;
    int ends[3], loops[3], full_ends, both_end;  /* end with a stop, repeat a 4-gram 3 times (k = run) */
} AnswerCount;

/* An answer in a loop by its definition, counted another way: some
 * 4-token window equal to at least two other windows. */
static int naive_loops(const int *t, int n) {
    for (int i = 0; i + 4 <= n; i++) {
        int equal = 0;
        for (int j = 0; j + 4 <= n; j++)
            equal += j != i && t[j] == t[i] && t[j + 1] == t[i + 1] && t[j + 2] == t[i + 2] && t[j + 3] == t[i + 3];
        if (equal >= 2) return 1;
    }
    return 0;
}

/* Whether prompt i counts in split k of evaluate (EVAL_*): the random split
 * holds every self-study prompt held out, challenge ones included, and no
 * evaluation-only task. */
static int counts_in(const PromptSet *p, int i, int k) {
    return k == EVAL_RANDOM ? p->split[i] != SPLIT_TASKS
         : k == EVAL_CHALLENGE ? p->split[i] == SPLIT_CHALLENGE : p->split[i] == SPLIT_TASKS;
}

static AnswerCount count_answers(const Model *m, const Document runs[3], const PromptSet *p, int split,
                                 const EvalResult *r) {
    enum { CAP = 24 };
    AnswerCount a = {.same_answers = 1};
    int nodoc_input[64];  /* the prefix, then the question */
    for (int i = 0; i < p->n_prompts; i++) {
        if (p->question_len[i] == 0 || !counts_in(p, i, split)) continue;
        const int *q = p->tokens + p->offsets[i];
        int want[3][CAP], len[3], nq = p->question_len[i], K = p->n_nodoc_prefix;
        memcpy(nodoc_input, p->nodoc_prefix, K * sizeof(int));
        memcpy(nodoc_input + K, q, nq * sizeof(int));
        len[0] = naive_answer(m, &runs[0], q, nq, p->answer_stop, CAP, want[0]);
        len[1] = naive_answer(m, &runs[1], q, nq, p->answer_stop, CAP, want[1]);
        len[2] = naive_answer(m, &runs[2], nodoc_input, K + nq, p->answer_stop, CAP, want[2]);
        a.stopped += len[0] < CAP;
        int ended[3];
        for (int run = 0; run < 3; run++) {
            int last = len[run] ? want[run][len[run] - 1] : -2;
            ended[run] = last == p->answer_stop[0] || last == p->answer_stop[1];
            a.ends[run] += ended[run];
            a.loops[run] += naive_loops(want[run], len[run]);
        }
        a.full_ends += ended[0];
        a.both_end += ended[0] && ended[1];
        a.match += len[1] == len[0] && !memcmp(want[1], want[0], len[0] * sizeof(int));
        a.match_nodoc += len[2] == len[0] && !memcmp(want[2], want[0], len[0] * sizeof(int));
        int k = 0;  /* the first divergence, counted here by hand */
        while (k < len[0] && k < len[1] && want[0][k] == want[1][k]) k++;
        a.prefix += (double)k / len[0];
        for (int run = 0; run < 3 && a.n < r->n_answers; run++)
            a.same_answers &= r->answer_len[a.n * 3 + run] == len[run] &&
                !memcmp(r->answer_tokens + ((size_t)a.n * 3 + run) * r->answer_cap, want[run], len[run] * sizeof(int));
        a.same_answers &= a.n < r->n_answers && r->answer_prompt[a.n] == i;
        a.n++;
    }
    return a;
}

/* The checks of one split's answer metrics against count_answers. */
static void check_answer_split(const EvalResult *r, const AnswerCount *a, int split, int n_doc, int expect_oracle) {
    printf("    %d task prompts (%d stop before the cap): match %.3f, no document %.3f, prefix %.3f\n", a->n,
           a->stopped, a->match / a->n, a->match_nodoc / a->n, a->prefix / a->n);
    check("n_answers: the prompts with a question part", r->n_answers == a->n);
    check("the answers are the greedy answers by definition", a->same_answers);
    check("answer_match = share of Nectar answers equal to the full cache's", r->answer_match == a->match / a->n);
    check("answer_match_nodoc, the same without the document", r->answer_match_nodoc == a->match_nodoc / a->n);
    check_close("answer_prefix = mean reproduced share before divergence", (float[]){(float)r->answer_prefix},
                (double[]){a->prefix / a->n}, 1, 0, 1e-6);
    int ends_ok = r->n_full_ends == a->full_ends, loops_ok = 1;
    for (int k = 0; k < 3; k++) {
        ends_ok &= r->answer_ends[k] == (double)a->ends[k] / a->n;
        loops_ok &= r->answer_repeats[k] == (double)a->loops[k] / a->n;
    }
    ends_ok &= a->full_ends ? r->nectar_ends_too == (double)a->both_end / a->full_ends : isnan(r->nectar_ends_too);
    printf("    end with a stop: %d / %d / %d, Nectar where the full cache does %d of %d; loop: %d / %d / %d\n",
           a->ends[0], a->ends[1], a->ends[2], a->both_end, a->full_ends, a->loops[0], a->loops[1], a->loops[2]);
    check("answer_ends, nectar_ends_too: answers ending with a stop", ends_ok);
    check("answer_repeats: answers with a 4-gram 3 times", loops_ok);
    if (expect_oracle)
        check("oracle modules: every answer is the full cache's", r->answer_match == 1 && r->answer_prefix == 1);
    else if (!split)
        check("modules with an error: some answers equal, some differ", r->answer_match > 0 && r->answer_match < 1);
    if (split) return;
    check("some answers end with the stop and some run to the cap", a->ends[0] > 0 && a->ends[0] < a->n);
    check("some answers of the full cache loop (the count is tested)", a->loops[0] > 0);
    if (n_doc == 1)
        check("BOS alone as the document: no-document answers all equal", r->answer_match_nodoc == 1);
    else
        check("the document matters (some no-document answer differs)", r->answer_match_nodoc < 1);
    check("the stop token ends some answers", a->stopped > 0 && a->stopped < a->n);
}

/* A split's metrics from evaluate's one pass are those of its prompts
 * evaluated alone, to the bit: the same sums in the same order. */
static void check_split_alone(const Model *m, const DocCache *cache, const ModuleSet *ms, const PromptSet *p, int k,
                              const EvalResult *got) {
    enum { MAX_PROMPTS = 64, MAX_TOKENS = 512 };
    int offsets[MAX_PROMPTS + 1], tokens[MAX_TOKENS], question_len[MAX_PROMPTS], n = 0;
    unsigned char marked[MAX_PROMPTS];
    offsets[0] = 0;
    if (p->n_prompts > MAX_PROMPTS || p->offsets[p->n_prompts] > MAX_TOKENS) {
        check("the split's prompts fit the test's buffers", 0);
        return;
    }
    for (int i = 0; i < p->n_prompts; i++) {
        if (!counts_in(p, i, k)) continue;
        int len = p->offsets[i + 1] - p->offsets[i];
        memcpy(tokens + offsets[n], p->tokens + p->offsets[i], len * sizeof(int));
        question_len[n] = p->question_len[i];
        marked[n] = p->split[i];
        offsets[n + 1] = offsets[n] + len;
        n++;
    }
    PromptSet alone = *p;
    alone.n_prompts = n; alone.offsets = offsets; alone.tokens = tokens;
    alone.question_len = question_len; alone.split = marked;
    EvalResult split[EVAL_SPLITS], *a = &split[k];
    Document full = {DOC_EXACT, cache->n, cache, NULL, NULL}, nectar = {DOC_NECTAR, ms->n_doc, NULL, ms, NULL};
    int ran = evaluate(m, &full, &nectar, &alone, split) == 0;
    int L = m->config.n_layers;
    int ok = ran && a->n_prompts == got->n_prompts && a->n_positions == got->n_positions &&
         a->n_queries == got->n_queries && a->acc_full == got->acc_full && a->acc_nectar == got->acc_nectar &&
         a->acc_nodoc == got->acc_nodoc && a->agree == got->agree && a->agree_nodoc == got->agree_nodoc &&
         a->kl == got->kl && a->kl_nodoc == got->kl_nodoc && a->score_mse == got->score_mse &&
         a->target_mse == got->target_mse && a->rte == got->rte &&
         !memcmp(a->score_mse_layer, got->score_mse_layer, L * sizeof(double)) &&
         !memcmp(a->target_mse_layer, got->target_mse_layer, L * sizeof(double)) &&
         a->n_answers == got->n_answers && a->answer_match == got->answer_match &&
         !memcmp(a->answer_ends, got->answer_ends, sizeof a->answer_ends) &&
         !memcmp(a->answer_repeats, got->answer_repeats, sizeof a->answer_repeats) &&
         a->n_full_ends == got->n_full_ends &&
         a->answer_match_nodoc == got->answer_match_nodoc && a->answer_prefix == got->answer_prefix &&
         a->answer_cap == got->answer_cap &&
         !memcmp(a->answer_len, got->answer_len, 3 * got->n_answers * sizeof(int)) &&
         !memcmp(a->answer_tokens, got->answer_tokens, (size_t)3 * got->n_answers * got->answer_cap * sizeof(int));
    check(k == EVAL_CHALLENGE ? "challenge split of one pass = its prompts evaluated alone, bit for bit"
                              : "evaluation-only tasks of one pass = the tasks evaluated alone, bit for bit", ok);
    if (ran) for (int j = 0; j < EVAL_SPLITS; j++) evalresult_free(&split[j]);
}

/* answer_in_loop on answers made by hand: a 4-gram three times (apart,
 * overlapping, at the end), twice only, and shorter runs. */
static void test_answer_repeats_by_hand(void) {
    printf("answer_in_loop: a 4-gram three times or more\n");
    int three[] = {1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 3, 4};
    int overlapping[] = {7, 7, 7, 7, 7, 7};      /* 7 7 7 7 at 0, 1, 2 */
    int twice[] = {1, 2, 3, 4, 1, 2, 3, 4, 5};
    int five_short[] = {5, 5, 5, 5, 5};          /* 5 5 5 5 at 0 and 1 only */
    int three_grams[] = {1, 2, 3, 1, 2, 3, 1, 2, 3};  /* 1 2 3 1 at 0, 3: twice */
    int cycle[] = {1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3};  /* 1 2 3 1 at 0, 3, 6 */
    check("a 4-gram three times apart: a loop", answer_in_loop(three, 14) && naive_loops(three, 14));
    check("six equal tokens (overlapping windows): a loop", answer_in_loop(overlapping, 6));
    check("a 4-gram twice: not a loop", !answer_in_loop(twice, 9) && !naive_loops(twice, 9));
    check("five equal tokens (two windows): not a loop", !answer_in_loop(five_short, 5));
    check("a 3-token cycle three times: not yet (4-grams twice)", !answer_in_loop(three_grams, 9));
    check("a 3-token cycle four times: a loop", answer_in_loop(cycle, 12));
    check("empty and short answers: no loop", !answer_in_loop(three, 0) && !answer_in_loop(three, 3));
}

/* A document (random tokens, or BOS alone: then the no-document model, whose
 * prefix is BOS, sees the same sequence as the full cache), quadrature
 * modules W = K, Z = V + u (u = 0: the oracle, which returns the exact
 * document state) and task prompts whose questions are their first tokens;
 * the answer metrics of evaluate() against the ones recomputed from
 * naive_answer. */
/* stop_profile against its definition: each answer the full cache ends,
 * question and answer through a forward of its own, the log-probability
 * of its stop token at its last row; with oracle modules Nectar's equals
 * the full cache's, and no document's does not. */
static void check_stop_profile(const Model *m, const Document runs[3], const PromptSet *p, const EvalResult *r,
                               int expect_oracle, int n_doc) {
    StopResult got;
    check("stop_profile runs", stop_profile(m, &runs[0], &runs[1], p, r, &got) == 0);
    int V = m->config.vocab_size, n = 0;
    double want[2] = {0, 0}, *lp = xmalloc(V * sizeof(double));
    for (int a = 0; a < r->n_answers; a++) {
        const int *answer = r->answer_tokens + (size_t)a * 3 * r->answer_cap;
        int len = r->answer_len[(size_t)a * 3], i = r->answer_prompt[a], nq = p->question_len[i];
        if (len == 0 || (answer[len - 1] != p->answer_stop[0] && answer[len - 1] != p->answer_stop[1])) continue;
        int seq[64];
        memcpy(seq, p->tokens + p->offsets[i], nq * sizeof(int));
        memcpy(seq + nq, answer, len * sizeof(int));
        for (int k = 0; k < 2; k++) {
            RunState s;
            runstate_alloc(&s, m, &runs[k], nq + len, nq + len);
            forward(m, &s, &runs[k], seq, nq + len, 0, LOGITS_ALL);
            log_softmax(s.logits + (size_t)(nq + len - 2) * V, V, lp);
            want[k] += lp[answer[len - 1]];
            runstate_free(&s);
        }
        n++;
    }
    printf("    stop_profile: %d answers end; mean log p(stop): full %.4f, Nectar %.4f, no document %.4f\n",
           got.n_answers, got.logp[0][STOP_BINS], got.logp[1][STOP_BINS], got.logp[2][STOP_BINS]);
    check("stop_profile counts the answers the full cache ends", got.n_answers == n && n == r->n_full_ends);
    if (n > 0) {
        double means[2] = {want[0] / n, want[1] / n};
        check_close("stop_profile: log p(stop) of the full cache and Nectar, by definition",
                    (float[]){(float)got.logp[0][STOP_BINS], (float)got.logp[1][STOP_BINS]}, means, 2, 1e-4, 1e-4);
    }
    if (n > 0 && expect_oracle)  /* a document of BOS alone is no document */
        check("oracle modules: Nectar's log p(stop) is the full cache's; no document's is not",
              fabs(got.logp[1][STOP_BINS] - got.logp[0][STOP_BINS]) < 1e-4 &&
              (n_doc == 1 || fabs(got.logp[2][STOP_BINS] - got.logp[0][STOP_BINS]) > 1e-3));
    free(lp);
}

static void test_answer_metrics_match_definitions(const char *name, int n_doc, float error_std, int expect_oracle) {
    printf("answer metrics of evaluate(), %s\n", name);
    Model m;
    model_init_random(&m, small_gqa, 1, 42, 0.15f);
    const Config *c = &m.config;
    int L = c->n_layers, G = c->n_kv_heads, d = c->dim / c->n_heads, V = c->vocab_size;
    enum { NPROMPTS = 6, LEN = 8, CAP = 24, MAX_DOC = 30 };
    int doc_ids[MAX_DOC], offsets[NPROMPTS + 1], tokens[NPROMPTS * LEN], question_len[NPROMPTS], bos[1] = {1};
    unsigned char split_flags[NPROMPTS] = {0, 1, 0, 1, 2, 0};  /* prompt 4: an evaluation-only task */
    uint64_t rng = 77;
    for (int i = 0; i < n_doc; i++) doc_ids[i] = n_doc == 1 ? 1 : 3 + rng_u32(&rng) % (V - 3);
    for (int i = 0; i < NPROMPTS * LEN; i++) tokens[i] = 3 + rng_u32(&rng) % (V - 3);
    for (int i = 0; i <= NPROMPTS; i++) offsets[i] = i * LEN;
    for (int i = 0; i < NPROMPTS; i++) question_len[i] = i == 2 ? 0 : 2 + i % 5;  /* prompt 2: a span, no answer */
    DocCache cache;
    doccache_build(&cache, &m, doc_ids, n_doc, 8);
    Document full = {DOC_EXACT, n_doc, &cache, NULL, NULL};
    /* the stop: the third token of the full cache's answer to prompt 0, so that some answers stop early */
    int answer[CAP];
    naive_answer(&m, &full, tokens, question_len[0], (int[2]){-1, -1}, CAP, answer);
    PromptSet prompts = {.n_prompts = NPROMPTS, .offsets = offsets, .tokens = tokens, .split = split_flags,
                         .question_len = question_len, .answer_cap = CAP, .answer_stop = {answer[2], 1},
                         .n_nodoc_prefix = 1, .nodoc_prefix = bos};
    ModuleSet ms;
    int p[3] = {n_doc, n_doc, n_doc};
    moduleset_alloc(&ms, ARCH_QUAD, L, G, d, 0, 0, 0, p, 0);
    quad_init_from_cache(&ms, &cache);
    ms.n_doc = n_doc;
    for (int i = 0; i < L * G; i++)
        for (int k = 0; k < d; k++) {
            float u = error_std * rng_normal(&rng);  /* one offset per (layer, KV head) and dimension */
            for (int j = 0; j < n_doc; j++) ms.modules[i].params[(size_t)(n_doc + j) * d + k] += u;
        }
    Document runs[3] = {full, {DOC_NECTAR, n_doc, NULL, &ms, NULL}, NO_DOCUMENT};
    EvalResult r[EVAL_SPLITS];
    check("evaluate runs", evaluate(&m, &runs[0], &runs[1], &prompts, r) == 0);
    for (int split = 0; split < EVAL_SPLITS; split++) {
        AnswerCount a = count_answers(&m, runs, &prompts, split, &r[split]);
        check_answer_split(&r[split], &a, split, n_doc, expect_oracle);
    }
    check_stop_profile(&m, runs, &prompts, &r[EVAL_RANDOM], expect_oracle, n_doc);
    check_split_alone(&m, &cache, &ms, &prompts, EVAL_CHALLENGE, &r[EVAL_CHALLENGE]);
    check_split_alone(&m, &cache, &ms, &prompts, EVAL_TASKS, &r[EVAL_TASKS]);
    for (int split = 0; split < EVAL_SPLITS; split++) evalresult_free(&r[split]);
    moduleset_free(&ms);
    doccache_free(&cache);
    model_free(&m);
}

/* drift_profile with oracle modules (W = K, Z = V: the exact document
 * state): in every bin Nectar's KL is 0 to rounding and its top-1 is the
 * full cache's, where no document's KL is not; each bin counts the
 * positions [lo, hi) of every sequence (its question, then `length`
 * tokens); a length beyond the context is shortened to what is left, and
 * no room at all is refused. */
static void test_drift_bins_with_oracle_modules(void) {
    printf("drift: oracle modules, bins of the distance from the document\n");
    Model m;
    model_init_random(&m, small_gqa, 1, 42, 0.15f);
    const Config *c = &m.config;
    enum { NPROMPTS = 5, LEN = 8, N_DOC = 30 };
    int doc_ids[N_DOC], offsets[NPROMPTS + 1], tokens[NPROMPTS * LEN], bos[1] = {1};
    /* the evaluation-only tasks 0, 3 and 4 are continued: not prompt 1 (no question) nor 2 (a self-study one) */
    int question_len[NPROMPTS] = {3, 0, 5, 2, 6};
    unsigned char split_flags[NPROMPTS] = {2, 0, 1, 2, 2};
    uint64_t rng = 5;
    for (int i = 0; i < N_DOC; i++) doc_ids[i] = 3 + rng_u32(&rng) % (c->vocab_size - 3);
    for (int i = 0; i < NPROMPTS * LEN; i++) tokens[i] = 3 + rng_u32(&rng) % (c->vocab_size - 3);
    for (int i = 0; i <= NPROMPTS; i++) offsets[i] = i * LEN;
    PromptSet prompts = {.n_prompts = NPROMPTS, .offsets = offsets, .tokens = tokens, .split = split_flags,
                         .question_len = question_len, .answer_cap = 8, .answer_stop = {2, 1},
                         .n_nodoc_prefix = 1, .nodoc_prefix = bos};
    DocCache cache;
    doccache_build(&cache, &m, doc_ids, N_DOC, 8);
    ModuleSet ms;
    int p[3] = {N_DOC, N_DOC, N_DOC};
    moduleset_alloc(&ms, ARCH_QUAD, c->n_layers, c->n_kv_heads, c->dim / c->n_heads, 0, 0, 0, p, 0);
    quad_init_from_cache(&ms, &cache);
    ms.n_doc = N_DOC;
    DriftResult r;
    Document full = {DOC_EXACT, N_DOC, &cache, NULL, NULL}, nectar = {DOC_NECTAR, N_DOC, NULL, &ms, NULL};
    int ok = drift_profile(&m, &full, &nectar, &prompts, 1000, 3, &r) == 0;
    int room = c->seq_len - N_DOC - 6;  /* the longest question of the three chosen: 6 */
    check("drift runs; a length beyond the context is shortened to the room", ok && r.length == room);
    long want[DRIFT_MAX_BINS] = {0}, total = 0;
    int chosen[3] = {0, 3, 4};
    for (int a = 0; ok && a < 3; a++)
        for (int t = 0; t + 1 < question_len[chosen[a]] + r.length; t++) want[t < 64 ? 0 : 1]++;
    double max_kl = 0, min_agree = 1, min_kl_nodoc = INFINITY;
    for (int b = 0; ok && b < r.n_bins; b++) {
        total += r.positions[b];
        ok &= r.positions[b] == want[b];
        max_kl = fmax(max_kl, r.kl[b]);
        min_agree = fmin(min_agree, r.agree[b]);
        min_kl_nodoc = fmin(min_kl_nodoc, r.kl_nodoc[b]);
    }
    printf("    %d sequences of %d tokens after their questions, %d bins, %ld positions; Nectar KL at most %.2e, "
           "agreement at least %.4f; no document's KL at least %.3f\n", r.n_seqs, r.length, r.n_bins, total,
           max_kl, min_agree, min_kl_nodoc);
    check("bins [0, 64) and [64, 128), each position counted in its own", ok && r.n_bins == 2 && r.lo[1] == 64);
    check("oracle modules: KL 0 to rounding (1e-6) and agreement 1 in every bin", ok && max_kl < 1e-6 && min_agree == 1);
    check("without the document the KL is not 0 (the measure can fail)", ok && min_kl_nodoc > 1e-3);
    int long_question[NPROMPTS] = {c->seq_len - N_DOC, 0, 0, 0, 0};
    int long_offsets[NPROMPTS + 1] = {0, c->seq_len - N_DOC, c->seq_len - N_DOC, c->seq_len - N_DOC,
                                      c->seq_len - N_DOC, c->seq_len - N_DOC};
    int *long_tokens = xmalloc(c->seq_len * sizeof(int));
    for (int i = 0; i < c->seq_len; i++) long_tokens[i] = 3;
    PromptSet full_context = prompts;
    full_context.question_len = long_question; full_context.offsets = long_offsets; full_context.tokens = long_tokens;
    fprintf(stderr, "    (one refusal expected below)\n");
    check("no room after the question: refused", drift_profile(&m, &full, &nectar, &full_context, 10, 3, &r) != 0);
    free(long_tokens);
    moduleset_free(&ms);
    doccache_free(&cache);
    model_free(&m);
}

/* The held-out prompts' question lengths, answer stops and cap and the
 * no-document prefix survive the module file; a question longer than its
 * prompt is refused. */
static void test_module_file_keeps_answer_parts(void) {
    printf("module file: question lengths, answer stops and cap, no-document prefix\n");
    int sizes[2] = {5, 7}, offsets[4] = {0, 4, 9, 12}, tokens[12] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    int question_len[3] = {2, 0, 3}, prefix[2] = {1, 17};
    unsigned char split_flags[3] = {SPLIT_RANDOM, SPLIT_CHALLENGE, SPLIT_TASKS};
    ModuleSet s, back;
    moduleset_alloc(&s, ARCH_MLP, 2, 3, 8, 1, 1, 1, sizes, 0);
    mlp_init(&s, 3, NULL, NULL);
    s.n_doc = 100; s.rho = 1.0f;
    s.heldout = (PromptSet){.n_prompts = 3, .offsets = offsets, .tokens = tokens, .split = split_flags,
                            .question_len = question_len, .answer_cap = 21, .answer_stop = {13, 2},
                            .n_nodoc_prefix = 2, .nodoc_prefix = prefix};
    const char *path = "tests/tmp_answers.nectar";
    int ok = moduleset_save(&s, path) == 0 && moduleset_load(&back, path, 0, 0) == 0;
    const PromptSet *h = &back.heldout;
    ok = ok && h->n_prompts == 3 && h->answer_stop[0] == 13 && h->answer_stop[1] == 2 && h->answer_cap == 21 &&
         h->n_nodoc_prefix == 2 && !memcmp(h->nodoc_prefix, prefix, sizeof prefix) &&
         !memcmp(h->question_len, question_len, sizeof question_len) && !memcmp(h->tokens, tokens, sizeof tokens) &&
         !memcmp(h->split, split_flags, sizeof split_flags);
    if (ok) moduleset_free(&back);
    check("question lengths, splits, stops, cap and prefix round trip", ok);
    /* a question of 5 tokens in a prompt of 4: the first question length, before the prefix and the
     * checksum at the end; the checksum written again, so that the question's check is the one reached */
    size_t size;
    unsigned char *bytes = read_file(path, &size);
    memcpy(bytes + size - sizeof(uint64_t) - sizeof prefix - sizeof question_len, &(int32_t){5}, sizeof(int32_t));
    uint64_t checksum = fnv1a(FNV_OFFSET, bytes, size - sizeof checksum);
    memcpy(bytes + size - sizeof checksum, &checksum, sizeof checksum);
    const void *part = bytes;
    write_file_atomic(path, &part, &size, 1);
    fprintf(stderr, "    (one refusal expected below)\n");
    check("a question longer than its prompt is refused", moduleset_load(&back, path, 0, 0) != 0);
    free(bytes);
    remove(path);
    s.heldout = (PromptSet){0};  /* the arrays above are not the set's to free */
    moduleset_free(&s);
}

/* The library's fit (src/compile.c): one fit_steps call to the end gives
 * the bits of the same fit in three calls (a stage boundary inside one),
 * and what it cannot run is refused with a sentence, not a crash. */
static void test_fit_in_pieces_equals_one_call(void) {
    printf("the fit of the library, in pieces and at once\n");
    Model m;
    model_init_random(&m, small_gqa, 1, 21, 0.1f);
    enum { NDOC = 48, NPROMPTS = 6, LEN = 10 };
    int doc[NDOC], offsets[NPROMPTS + 1] = {0}, tokens[NPROMPTS * LEN];
    unsigned char is_train[NPROMPTS] = {1, 1, 1, 1, 1, 0}, split[NPROMPTS] = {0};
    uint64_t rng = 22;
    for (int i = 0; i < NDOC; i++) doc[i] = rng_u32(&rng) % m.config.vocab_size;
    for (int i = 0; i < NPROMPTS * LEN; i++) tokens[i] = doc[i % NDOC];
    for (int i = 0; i < NPROMPTS; i++) offsets[i + 1] = (i + 1) * LEN;
    PromptSet prompts = {.n_prompts = NPROMPTS, .offsets = offsets, .tokens = tokens, .split = split};
    DocCache cache;
    doccache_build(&cache, &m, doc, NDOC, 16);
    Document exact = {DOC_EXACT, NDOC, &cache, NULL, NULL};
    TeacherData td;
    teacher_alloc(&td, &m.config, &prompts, is_train, 1, 0, 1 << 20);
    teacher_pass(&m, &exact, &prompts, is_train, &td, NULL, NULL, NULL);
    FitOptions o = {.steps = 12, .kl_steps = 6, .batch = 8, .kl_prompts = 2, .lr = 1e-2f, .kl_lr = 1e-3f,
                    .warmup_fraction = 0.1f, .lambda_alpha = 0.1f, .lambda_A = 1, .lambda_kl = 0.5f, .seed = 5};
    ModuleSet ms[2];
    Fit fit;
    for (int k = 0; k < 2; k++) {
        moduleset_for_budget(&ms[k], &m, &cache, ARCH_MLP, 0.5f, 1, 1, 1, NULL, 1);
        moduleset_init(&ms[k], &td.fit, &cache, &m.config, 3);
        fit_begin(&fit, &m, &ms[k], &td, &prompts, &exact, &o, NULL);
        int rc = k == 0 ? fit_steps(&fit, 18, NULL, NULL)
                        : fit_steps(&fit, 5, NULL, NULL) | fit_steps(&fit, 14, NULL, NULL) | fit_steps(&fit, 18, NULL, NULL);
        check(k == 0 ? "18 steps in one call" : "18 steps in calls to 5, 14 and 18", rc == 0 && fit.step == 18);
        fit_end(&fit);
    }
    check("the same modules, bit for bit", !memcmp(ms[0].params, ms[1].params, ms[0].n_params * sizeof(float)));
    printf("    (refusals expected below)\n");
    fit_begin(&fit, &m, &ms[0], &td, &prompts, &exact, &o, NULL);
    check("a step past the fit's last is refused", fit_steps(&fit, 19, NULL, NULL) == -1 && fit.step == 0);
    fit_end(&fit);
    FitOptions many = o;
    many.kl_prompts = MAX_KL_PROMPTS + 1;
    check("more KL prompts than MAX_KL_PROMPTS are refused", fit_begin(&fit, &m, &ms[0], &td, &prompts, &exact,
                                                                          &many, NULL) == -1);
    fit_end(&fit);
    ModuleSet no_grads;
    moduleset_for_budget(&no_grads, &m, &cache, ARCH_MLP, 0.5f, 1, 1, 1, NULL, 0);
    check("modules without gradients are refused", fit_begin(&fit, &m, &no_grads, &td, &prompts, &exact, &o,
                                                                NULL) == -1);
    fit_end(&fit);
    moduleset_free(&no_grads); moduleset_free(&ms[0]); moduleset_free(&ms[1]);
    teacherdata_free(&td);
    doccache_free(&cache);
    model_free(&m);
}

/* ------------------------------------------------------------------------ */
/* Generation                                                               */

/* The first step from `from` on whose token the run has not written
 * before (a stop there ends the run at that step), or -1. */
static int first_new_token_step(const int *tokens, int n, int from) {
    for (int k = from; k < n; k++) {
        int seen = 0;
        for (int j = 0; j < k; j++) seen |= tokens[j] == tokens[k];
        if (!seen) return k;
    }
    return -1;
}

/* generate's refusals (-1 after a sentence), and the context's last
 * position: document n + prompt + max_new - 1 = T is accepted. */
static void check_generate_refusals(const Model *m, const Document *doc, const int *prompt, int np, Sampler *greedy) {
    const int no_stop[2] = {-1, -1};
    int T = m->config.seq_len, room = T + 1 - doc->n - np, *out = xmalloc((room + 1) * sizeof(int));  /* (room + 1) */
    int *bad = xmalloc(np * sizeof(int));  /* (np) the prompt with one id past the vocabulary */
    memcpy(bad, prompt, np * sizeof(int));
    bad[np / 2] = m->config.vocab_size;
    check("refused: a prompt of no tokens", generate(m, doc, prompt, 0, 4, no_stop, greedy, out) == -1);
    check("refused: max_new below 0", generate(m, doc, prompt, np, -1, no_stop, greedy, out) == -1);
    check("refused: a token fed one position past the context",
          generate(m, doc, prompt, np, room + 1, no_stop, greedy, out) == -1);
    check("refused: a prompt id outside the vocabulary", generate(m, doc, bad, np, 4, no_stop, greedy, out) == -1);
    check("max_new 0: no tokens", generate(m, doc, prompt, np, 0, no_stop, greedy, out) == 0);
    check("the last token at position T (fed up to T - 1): all of them",
          generate(m, doc, prompt, np, room, no_stop, greedy, out) == room);
    free(bad);
    free(out);
}

/* generate with a greedy sampler is naive_answer (the argmax of a whole
 * forward per token, no decoding cache) after an exact document, a Nectar
 * one (quadrature modules of the first half of the cache's pairs: not the
 * exact state) and none; a stop ends the run at the step that writes it
 * (kept); sampled runs repeat with their seed and not with another; and
 * what it cannot run is refused. */
static void test_generate_matches_argmax_loop(void) {
    printf("generate: greedy against the argmax loop, stops, seeds, refusals\n");
    Model m;
    model_init_random(&m, small_gqa, 1, 42, 0.15f);
    const Config *c = &m.config;
    enum { NDOC = 40, NP = 9, NEW = 16, SAMPLED = 24 };
    int V = c->vocab_size, doc_ids[NDOC], prompt[NP];
    uint64_t rng = 31;
    for (int i = 0; i < NDOC; i++) doc_ids[i] = 3 + rng_u32(&rng) % (V - 3);
    for (int i = 0; i < NP; i++) prompt[i] = 3 + rng_u32(&rng) % (V - 3);
    DocCache cache;
    doccache_build(&cache, &m, doc_ids, NDOC, 16);
    ModuleSet half;
    int pairs[3] = {NDOC / 2, NDOC / 2, NDOC / 2};
    moduleset_alloc(&half, ARCH_QUAD, c->n_layers, c->n_kv_heads, c->dim / c->n_heads, 0, 0, 0, pairs, 0);
    quad_init_from_cache(&half, &cache);
    half.n_doc = NDOC;
    Document docs[3] = {{DOC_EXACT, NDOC, &cache, NULL, NULL}, {DOC_NECTAR, NDOC, NULL, &half, NULL}, NO_DOCUMENT};
    const char *names[3] = {"exact", "Nectar (half the pairs)", "no document"};
    const int no_stop[2] = {-1, -1};
    Sampler greedy;
    sampler_init(&greedy, V, 0.0f, 1.0f, 0);
    int got[3][NEW], want[NEW];  /* each document's greedy tokens; the argmax loop's */
    char what[128];
    for (int k = 0; k < 3; k++) {
        int n = generate(&m, &docs[k], prompt, NP, NEW, no_stop, &greedy, got[k]);
        int n_want = naive_answer(&m, &docs[k], prompt, NP, no_stop, NEW, want);
        snprintf(what, sizeof what, "%s: %d greedy tokens, the argmax loop's", names[k], NEW);
        check(what, n == NEW && n_want == NEW && !memcmp(got[k], want, sizeof want));
    }
    check("the document matters (exact and no document's tokens differ)", memcmp(got[0], got[2], sizeof got[0]));

    /* a stop: the token the exact run first writes at step k >= 2 */
    int k = first_new_token_step(got[0], NEW, 2), stops[2][2] = {{-1, -1}, {-1, -1}};
    printf("    stop at step %d (token %d)\n", k, k >= 0 ? got[0][k] : -1);
    for (int slot = 0; slot < 2; slot++) {
        stops[slot][slot] = k >= 0 ? got[0][k] : -1;
        int n = generate(&m, &docs[0], prompt, NP, NEW, stops[slot], &greedy, want);
        snprintf(what, sizeof what, "stop[%d]: %d tokens, the last the stop", slot, k + 1);
        check(what, k >= 0 && n == k + 1 && !memcmp(want, got[0], (k + 1) * sizeof(int)));
    }

    /* sampled: temperature 1, top-p 0.9, seeds 7, 7 and 8. The random
     * model spreads its next token over many of the V = 97 (seeds 7 and 8
     * draw other tokens at every step here), and the seeds are fixed: the
     * checks cannot be flaky. */
    int drawn[3][SAMPLED], seeds[3] = {7, 7, 8}, n_drawn[3], parted = 0;
    for (int r = 0; r < 3; r++) {
        Sampler sampler;
        sampler_init(&sampler, V, 1.0f, 0.9f, seeds[r]);
        n_drawn[r] = generate(&m, &docs[0], prompt, NP, SAMPLED, no_stop, &sampler, drawn[r]);
        sampler_free(&sampler);
    }
    for (int t = 0; t < SAMPLED; t++) parted += drawn[0][t] != drawn[2][t];
    printf("    seeds 7 and 8 draw other tokens at %d of %d steps\n", parted, SAMPLED);
    check("sampled, seed 7 twice: the same tokens",
          n_drawn[0] == SAMPLED && n_drawn[1] == SAMPLED && !memcmp(drawn[0], drawn[1], sizeof drawn[0]));
    check("sampled, seed 8: other tokens", n_drawn[2] == SAMPLED && memcmp(drawn[0], drawn[2], sizeof drawn[0]));
    check("sampled tokens are not the greedy ones", memcmp(drawn[0], got[0], sizeof got[0]));

    check_generate_refusals(&m, &docs[0], prompt, NP, &greedy);
    sampler_free(&greedy);
    moduleset_free(&half);
    doccache_free(&cache);
    model_free(&m);
}

int main(void) {
    test_exp_fast_matches_exp();
    test_merge_splits_attention_exactly();
    test_module_gradients_match_finite_differences(ARCH_MLP, 1, 1, 2, 9);
    test_module_gradients_match_finite_differences(ARCH_MLP, 0, 1, 1, 6);
    test_module_gradients_match_finite_differences(ARCH_MLP, 2, 0, 0, 5);
    test_module_gradients_match_finite_differences(ARCH_QUAD, 0, 0, 0, 11);
    test_width_is_largest_within_budget();
    test_exact_state_modules_reproduce_full_cache();
    test_composition_equals_documents_at_offsets();
    test_prefill_equals_decode();
    test_segments_equal_sequences_alone();
    test_parallel_for_runs_every_task_once();
    test_chunked_document_equals_one_sequence();
    test_checkpoint_roundtrip_is_exact();
    test_logits_match_numpy_reference("ref_gqa");
    test_logits_match_numpy_reference("ref_mha_unshared");
    test_module_file_roundtrip_and_fingerprints();
    test_tokenizer_roundtrip_and_merges();
    test_op_backward_matches_finite_differences();
    test_kl_gradient_matches_finite_differences();
    test_bf16_rounds_to_nearest_even();
    test_regression_loss_matches_definition(ARCH_MLP);
    test_regression_loss_matches_definition(ARCH_QUAD);
    test_clip_and_adamw_match_closed_forms();
    test_top_k_kl_matches_definition();
    test_evaluate_metrics_match_definitions();
    test_answer_prefix_matches_definition();
    test_answer_repeats_by_hand();
    test_answer_metrics_match_definitions("oracle modules (u = 0)", 30, 0.0f, 1);
    test_answer_metrics_match_definitions("modules with an error (Z = V + u)", 30, 0.02f, 0);
    test_answer_metrics_match_definitions("a document of BOS alone, oracle modules", 1, 0.0f, 1);
    test_module_file_keeps_answer_parts();
    test_drift_bins_with_oracle_modules();
    test_fit_in_pieces_equals_one_call();
    test_generate_matches_argmax_loop();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
