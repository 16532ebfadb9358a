/* cli.h - what the programs share on the command line (cli.c): option
 * parsing, progress lines, the metrics as a table or JSON.
 */
#ifndef NECTAR_CLI_H
#define NECTAR_CLI_H

#include <stdio.h>

#include "eval.h"

/* Command-line numbers: all of `text` as an int within int's range, a finite
 * float, or an unsigned 64-bit seed. Anything else (empty, trailing junk,
 * overflow, nan, inf, a minus sign on a seed) gets "error: option OPTION
 * expects ..., got 'TEXT'" and -1; the programs then check the ranges. */
int parse_int_option(const char *option, const char *text, int *out);
int parse_float_option(const char *option, const char *text, float *out);
int parse_seed_option(const char *option, const char *text, unsigned long long *out);
/* The sentence for an option that comes last without a value: "needs a value"
 * when it is one of value_options (" -a --bee ... ", each between spaces),
 * else "is unknown". */
void report_last_option(const char *option, const char *value_options);
/* The options of a command line so far, to refuse one given twice (a
 * program has fewer than MAX_OPTIONS of them). */
enum { MAX_OPTIONS = 64 };
typedef struct { const char *names[MAX_OPTIONS]; int n; } SeenOptions;
/* 0, or -1 after "error: OPTION is given twice" when it is one of s's; it
 * joins them. */
int option_once(SeenOptions *s, const char *option);
/* What --gpu says in the CPU-only build. */
#define NO_GPU_SUPPORT "this is the CPU-only build; --gpu is in build-gpu/ (make gpu, where nvcc is found)"

/* "\r<what> done/total  <elapsed>s  ETA <eta>s" on stderr, for a loop that
 * started at t_start (now_seconds()). */
void print_progress(const char *what, int done, int total, double t_start);
/* A 95% interval ci: "[lo, hi]" into buf (size bytes), or "none (fewer than 2
 * prompts)" where it is not defined (NaN: a ratio over prompts needs two). */
const char *interval_text(char *buf, size_t size, const double ci[2]);
/* ", \"name\": [lo, hi]", or null where the interval is not defined */
void print_interval_json(FILE *f, const char *name, const double ci[2]);
/* The metrics as a human-readable table, or as the body of a JSON object. */
void print_eval_table(FILE *f, const char *title, const EvalResult *r, int n_layers);
void print_eval_json(FILE *f, const EvalResult *r);
/* Every split of an evaluate (the evaluation-only tasks where there are
 * any): tables, or "random": {...}, "challenge": {...}, "tasks": {...}. */
void print_eval_splits_table(FILE *f, const EvalResult split[EVAL_SPLITS], int n_layers);
void print_eval_splits_json(FILE *f, const EvalResult split[EVAL_SPLITS]);

#endif
