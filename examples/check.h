/* check.h - the checks shared by the examples and the C and CUDA test
 * programs: each prints what it compared and counts a pass or a failure; a
 * program ends with "N passed, M failed" and a non-zero status on any
 * failure. */
#ifndef CHECK_H
#define CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../nectar.h"
#include "../src/util.h"

static int n_passed, n_failed;

static inline void check(const char *what, int ok) {
    printf("  %-56s %s\n", what, ok ? "ok" : "FAIL");
    if (ok) n_passed++; else n_failed++;
}

/* |got - ref| <= atol + rtol |ref| elementwise (infinities must match
 * exactly, NaN never passes); prints max errors and the first mismatches. */
static inline int check_close(const char *what, const float *got, const double *ref, size_t n,
                       double atol, double rtol) {
    double max_abs = 0, max_rel = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i], diff = fabs(g - r);
        int ok = isinf(r) || isinf(g) ? g == r : diff <= atol + rtol * fabs(r);
        if (!ok && bad++ < 3) printf("    %s[%zu]: got %.9g, want %.9g\n", what, i, g, r);
        if (isinf(r) || isinf(g)) continue;
        if (diff > max_abs) max_abs = diff;
        if (fabs(r) > 1e-12 && diff / fabs(r) > max_rel) max_rel = diff / fabs(r);
    }
    printf("  %-56s max abs %.2e  max rel %.2e  %s\n", what, max_abs, max_rel, bad ? "FAIL" : "ok");
    if (bad) { printf("    %zu of %zu elements out of tolerance\n", bad, n); n_failed++; }
    else n_passed++;
    return bad == 0;
}

/* The same against a float reference. */
static inline int check_close_f(const char *what, const float *got, const float *ref, size_t n,
                         double atol, double rtol) {
    double *r = (double *)xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) r[i] = ref[i];
    int ok = check_close(what, got, r, n, atol, rtol);
    free(r);
    return ok;
}

static inline void fill_normal(float *x, size_t n, float std, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) x[i] = std * rng_normal(rng);
}

/* The same draws, each kept in bf16 (as the fit's targets q and A are). */
static inline void fill_normal_bf16(uint16_t *x, size_t n, float std, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) x[i] = bf16_from_float(std * rng_normal(rng));
}

#endif
