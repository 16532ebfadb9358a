/* cli.c - what the programs (infer, train, pretrain, benchmark) share:
 * parsing numbers from the command line into checked values, progress lines
 * with an ETA on stderr, and the metrics of an evaluation as a table or as
 * JSON on stdout.
 */
#include "cli.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int parse_int_option(const char *option, const char *text, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
        fprintf(stderr, "error: option %s expects an integer, got '%s'\n", option, text);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int parse_float_option(const char *option, const char *text, float *out) {
    char *end;
    float v = strtof(text, &end);
    if (end == text || *end || !isfinite(v)) {
        fprintf(stderr, "error: option %s expects a finite number, got '%s'\n", option, text);
        return -1;
    }
    *out = v;
    return 0;
}

int parse_seed_option(const char *option, const char *text, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || *end || errno == ERANGE || strchr(text, '-')) {
        fprintf(stderr, "error: option %s expects a seed (an integer >= 0), got '%s'\n", option, text);
        return -1;
    }
    *out = v;
    return 0;
}

void report_last_option(const char *option, const char *value_options) {
    char word[64];
    snprintf(word, sizeof word, " %s ", option);
    fprintf(stderr, "error: option %s %s (see --help)\n", option,
            strstr(value_options, word) ? "needs a value" : "is unknown");
}

int option_once(SeenOptions *s, const char *option) {
    for (int k = 0; k < s->n; k++)
        if (!strcmp(s->names[k], option)) {
            fprintf(stderr, "error: %s is given twice; give it once\n", option);
            return -1;
        }
    if (s->n == MAX_OPTIONS) { fprintf(stderr, "error: more than %d options\n", MAX_OPTIONS); return -1; }
    s->names[s->n++] = option;
    return 0;
}

void print_progress(const char *what, int done, int total, double t_start) {
    double elapsed = now_seconds() - t_start;
    if (done < 1) { fprintf(stderr, "\r%s 0/%d  %.1fs  ETA unknown   ", what, total, elapsed); return; }
    fprintf(stderr, "\r%s %d/%d  %.1fs  ETA %.0fs   ", what, done, total, elapsed,
            elapsed / done * (total - done));
}

/* The answer metrics' lines of the table. */
static void print_answer_summary(FILE *f, const EvalResult *r) {
    if (r->n_answers == 0) {
        fprintf(f, "  answers: none of these prompts has a question part (document spans and continuations "
                "have none)\n");
        return;
    }
    fprintf(f, "  answers to the %d task prompts (greedy, to the model's stop or %d tokens):\n", r->n_answers,
            r->answer_cap);
    fprintf(f, "  %-26s %10s %10.4f %10.4f   Nectar's 95%% interval [%.3f, %.3f]\n", "equal to the full cache's",
            "", r->answer_match, r->answer_match_nodoc, r->answer_match_ci[0], r->answer_match_ci[1]);
    fprintf(f, "  %-26s %10s %10.4f\n", "prefix reproduced", "", r->answer_prefix);
    fprintf(f, "  %-26s %10.4f %10.4f %10.4f   Nectar's 95%% interval [%.3f, %.3f]\n", "end with the model's stop",
            r->answer_ends[0], r->answer_ends[1], r->answer_ends[2], r->answer_ends_ci[1][0], r->answer_ends_ci[1][1]);
    if (r->n_full_ends)
        fprintf(f, "  %-26s %10s %10.4f %10s   of the %d the full cache ends; 95%% interval [%.3f, %.3f]\n",
                "end where the full cache's", "", r->nectar_ends_too, "", r->n_full_ends, r->nectar_ends_too_ci[0],
                r->nectar_ends_too_ci[1]);
    char loops[40];
    snprintf(loops, sizeof loops, "repeat a %d-gram %d times", REPEAT_GRAM, REPEAT_TIMES);
    fprintf(f, "  %-26s %10.4f %10.4f %10.4f   Nectar's 95%% interval [%.3f, %.3f]\n", loops, r->answer_repeats[0],
            r->answer_repeats[1], r->answer_repeats[2], r->answer_repeats_ci[1][0], r->answer_repeats_ci[1][1]);
}

const char *interval_text(char *buf, size_t size, const double ci[2]) {
    if (isfinite(ci[0]) && isfinite(ci[1])) snprintf(buf, size, "[%.4f, %.4f]", ci[0], ci[1]);
    else snprintf(buf, size, "none (fewer than 2 prompts)");
    return buf;
}

void print_eval_table(FILE *f, const char *title, const EvalResult *r, int n_layers) {
    char ci_text[2][64];
    fprintf(f, "%s: %d prompts, %d next-token positions\n", title, r->n_prompts, r->n_positions);
    fprintf(f, "  %-26s %10s %10s %10s\n", "", "full cache", "Nectar", "no doc");
    fprintf(f, "  %-26s %10.4f %10.4f %10.4f\n", "token accuracy", r->acc_full, r->acc_nectar, r->acc_nodoc);
    fprintf(f, "  %-26s %10s %10.2f %10.2f\n", "gap to full cache (pp)", "",
            100 * (r->acc_full - r->acc_nectar), 100 * (r->acc_full - r->acc_nodoc));
    fprintf(f, "  %-26s %10s %10.4f %10.4f   Nectar's 95%% interval %s\n", "top-1 agreement with full", "",
            r->agree, r->agree_nodoc, interval_text(ci_text[0], sizeof ci_text[0], r->agree_ci));
    fprintf(f, "  %-26s %10s %10.4f %10.4f   Nectar's 95%% interval %s\n", "mean KL(full || model)", "", r->kl,
            r->kl_nodoc, interval_text(ci_text[1], sizeof ci_text[1], r->kl_ci));
    if (r->n_queries > 0) {  /* none for a composition of documents */
        fprintf(f, "  module fit on the teacher's queries (%ld evaluations):\n", r->n_queries);
        fprintf(f, "    score MSE %.4g   target MSE %.4g   relative transport error %.4g\n",
                r->score_mse, r->target_mse, r->rte);
        fprintf(f, "    %-6s %12s %12s\n", "layer", "score MSE", "target MSE");
        for (int l = 0; l < n_layers; l++)
            fprintf(f, "    %-6d %12.4g %12.4g\n", l, r->score_mse_layer[l], r->target_mse_layer[l]);
    }
    print_answer_summary(f, r);
}

void print_interval_json(FILE *f, const char *name, const double ci[2]) {
    if (isfinite(ci[0]) && isfinite(ci[1])) fprintf(f, ", \"%s\": [%.6g, %.6g]", name, ci[0], ci[1]);
    else fprintf(f, ", \"%s\": null", name);
}

/* ", \"name\": {\"full\": x, \"nectar\": y, \"nodoc\": z}, \"name_ci\": {...}" */
static void print_triple_json(FILE *f, const char *name, const double x[3], const double ci[3][2]) {
    static const char *const keys[3] = {"full", "nectar", "nodoc"};
    fprintf(f, ", \"%s\": {", name);
    for (int k = 0; k < 3; k++) fprintf(f, "%s\"%s\": %.6f", k ? ", " : "", keys[k], x[k]);
    fprintf(f, "}, \"%s_ci\": {", name);
    for (int k = 0; k < 3; k++) fprintf(f, "%s\"%s\": [%.6g, %.6g]", k ? ", " : "", keys[k], ci[k][0], ci[k][1]);
    fprintf(f, "}");
}

void print_eval_json(FILE *f, const EvalResult *r) {
    fprintf(f, "{\"n_prompts\": %d, \"n_positions\": %d, \"acc_full\": %.6f, \"acc_nectar\": %.6f, "
            "\"acc_nodoc\": %.6f, \"gap_pp\": %.4f, \"agree\": %.6f, \"agree_nodoc\": %.6f, "
            "\"kl\": %.6g, \"kl_nodoc\": %.6g, ",
            r->n_prompts, r->n_positions, r->acc_full, r->acc_nectar, r->acc_nodoc,
            100 * (r->acc_full - r->acc_nectar), r->agree, r->agree_nodoc, r->kl, r->kl_nodoc);
    if (r->n_queries > 0)
        fprintf(f, "\"score_mse\": %.6g, \"target_mse\": %.6g, \"rte\": %.6g, ", r->score_mse, r->target_mse, r->rte);
    else fprintf(f, "\"score_mse\": null, \"target_mse\": null, \"rte\": null, ");  /* a composition */
    fprintf(f, "\"n_answers\": %d, \"answer_match\": %.6f, \"answer_match_nodoc\": %.6f, \"answer_prefix\": %.6f",
            r->n_answers, r->answer_match, r->answer_match_nodoc, r->answer_prefix);
    print_interval_json(f, "kl_ci", r->kl_ci);
    print_interval_json(f, "agree_ci", r->agree_ci);
    double none[2] = {NAN, NAN};
    print_interval_json(f, "answer_match_ci", r->n_answers > 0 ? r->answer_match_ci : none);
    if (r->n_answers > 0) {
        print_triple_json(f, "answer_ends", r->answer_ends, r->answer_ends_ci);
        print_triple_json(f, "answer_repeats", r->answer_repeats, r->answer_repeats_ci);
        fprintf(f, ", \"n_full_ends\": %d, \"nectar_ends_too\": ", r->n_full_ends);
        fprintf(f, r->n_full_ends ? "%.6f" : "null", r->nectar_ends_too);
        print_interval_json(f, "nectar_ends_too_ci", r->nectar_ends_too_ci);
    }
    fprintf(f, "}");
}

static const char *const SPLIT_TITLES[EVAL_SPLITS] = {"held-out prompts (random split)",
    "held-out prompts (challenge split)", "evaluation-only tasks (never in self-study)"};
static const char *const SPLIT_KEYS[EVAL_SPLITS] = {"random", "challenge", "tasks"};

void print_eval_splits_table(FILE *f, const EvalResult split[EVAL_SPLITS], int n_layers) {
    for (int k = 0; k < EVAL_SPLITS; k++)
        if (k != EVAL_TASKS || split[k].n_prompts > 0) print_eval_table(f, SPLIT_TITLES[k], &split[k], n_layers);
}

void print_eval_splits_json(FILE *f, const EvalResult split[EVAL_SPLITS]) {
    for (int k = 0; k < EVAL_SPLITS; k++) {
        if (k == EVAL_TASKS && split[k].n_prompts == 0) continue;
        fprintf(f, "%s\"%s\": ", k ? ", " : "", SPLIT_KEYS[k]);
        print_eval_json(f, &split[k]);
    }
}
