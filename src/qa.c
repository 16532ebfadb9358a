/* qa.c - multiple-choice questions scored by likelihood (format in qa.h):
 * the file's parser, the options as prompts, the three runs and their
 * report. The scoring itself is answer_loglik's (eval.c).
 */
#include "qa.h"
#include "eval.h"
#include "formats.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* The file                                                                 */

/* A question file as it is parsed: the questions so far (arrays sized for
 * one question or option a line) and the open block, question q->n. */
typedef struct {
    Questions *q;
    int open;     /* a block's question has been read and not closed */
    int rights;   /* right options of the open block */
} Parser;

static int parse_error(const char *path, int line, const char *why) {
    fprintf(stderr, "error: %s:%d: %s\n", path, line, why);
    return -1;
}

/* The open block is complete: one right option among at least two. */
static int close_block(Parser *ps) {
    Questions *q = ps->q;
    if (!ps->open) return 0;
    int options = q->first[q->n + 1] - q->first[q->n], line = q->line[q->n];
    if (ps->rights == 0) return parse_error(q->path, line, "the question has no right option (a line '+ ...')");
    if (ps->rights > 1) return parse_error(q->path, line, "the question has more than one right option ('+')");
    if (options < 2) return parse_error(q->path, line, "the question has fewer than two options");
    ps->open = 0;
    q->n++;
    return 0;
}

/* A copy of the text after a line's two-byte marker, its backslash-n
 * turned into a newline and two backslashes into one; NULL when empty. */
static char *marked_text(const char *line) {
    const char *text = line + 2;
    while (*text == ' ') text++;
    if (!*text) return NULL;
    char *out = xmalloc(strlen(text) + 1), *o = out;
    for (const char *c = text; *c; c++) {
        if (c[0] == '\\' && (c[1] == 'n' || c[1] == '\\')) { *o++ = c[1] == 'n' ? '\n' : '\\'; c++; }
        else *o++ = *c;
    }
    *o = 0;
    return out;
}

/* One line of the file (NUL-terminated, no newline): 0, or -1 after a sentence. */
static int parse_line(Parser *ps, const char *line, int line_no) {
    Questions *q = ps->q;
    const char *path = q->path;
    size_t len = strlen(line);
    if (len > QA_MAX_LINE) return parse_error(path, line_no, "the line is longer than 1000 bytes");
    if (!utf8_valid((const unsigned char *)line, len)) return parse_error(path, line_no, "invalid UTF-8");
    if (line[0] == '#') return 0;
    if (strspn(line, " \t\r") == len) return close_block(ps);  /* a blank line ends a block */
    int kind = (line[0] == '?' || line[0] == '+' || line[0] == '-') && line[1] == ' ' ? line[0] : 0;
    if (!kind) return parse_error(path, line_no, "a line is '? question', '+ right option', '- wrong option', "
                                  "'# comment' or blank");
    if (kind == '?' && ps->open) return parse_error(path, line_no, "a new question needs a blank line before it");
    if (kind != '?' && !ps->open) return parse_error(path, line_no, "an option outside a question ('? ...' first)");
    char *text = marked_text(line);
    if (!text) return parse_error(path, line_no, kind == '?' ? "the question is empty" : "the option is empty");
    if (kind == '?') {
        q->question[q->n] = text;
        q->line[q->n] = line_no;
        q->first[q->n + 1] = q->first[q->n];
        ps->open = 1;
        ps->rights = 0;
        return 0;
    }
    if (kind == '+') { q->right[q->n] = q->first[q->n + 1] - q->first[q->n]; ps->rights++; }
    q->option[q->first[q->n + 1]++] = text;
    return 0;
}

int questions_load(Questions *q, const char *path) {
    memset(q, 0, sizeof(*q));
    q->path = path;
    char *text = read_text_file(path);
    if (!text) return -1;
    size_t lines = 1;
    for (const char *c = text; *c; c++) lines += *c == '\n';
    q->question = xmalloc(lines * sizeof(char *));
    q->option = xmalloc(lines * sizeof(char *));
    q->first = xmalloc((lines + 1) * sizeof(int));
    q->right = xmalloc(lines * sizeof(int));
    q->line = xmalloc(lines * sizeof(int));
    Parser ps = {q, 0, 0};
    int rc = 0, line_no = 0;
    for (char *line = text, *next; rc == 0 && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        rc = parse_line(&ps, line, ++line_no);
    }
    if (rc == 0) rc = close_block(&ps);
    free(text);
    if (rc == 0 && q->n == 0) { fprintf(stderr, "error: %s holds no question\n", path); rc = -1; }
    if (ps.open) {  /* a block an error left open: its texts are not counted in q->n */
        free(q->question[q->n]);
        for (int k = q->first[q->n]; k < q->first[q->n + 1]; k++) free(q->option[k]);
    }
    if (rc != 0) questions_free(q);
    return rc;
}

void questions_free(Questions *q) {
    for (int i = 0; i < q->n; i++) free(q->question[i]);
    for (int k = 0; q->first && k < q->first[q->n]; k++) free(q->option[k]);
    free(q->question); free(q->first); free(q->option); free(q->right); free(q->line);
    memset(q, 0, sizeof(*q));
}

/* ------------------------------------------------------------------------ */
/* The options as prompts                                                   */

/* Appends n ids to the prompt being built, p's prompt n_prompts (room
 * grown as needed). */
static void append_ids(PromptSet *p, size_t *room, const int *ids, int n) {
    size_t used = p->offsets[p->n_prompts + 1];
    if (used + n > *room) {
        *room = 2 * (used + n);
        int *grown = xmalloc(*room * sizeof(int));
        if (used) memcpy(grown, p->tokens, used * sizeof(int));
        free(p->tokens);
        p->tokens = grown;
    }
    memcpy(p->tokens + used, ids, n * sizeof(int));
    p->offsets[p->n_prompts + 1] += n;
}

/* The reply tokens of option `text` after question ids qids (nq of them),
 * into out (at most cap): with chat, the option then the end of the turn;
 * without, the tokens the question's text followed by a space and the
 * option adds to the question's own. The count, or -1 after a sentence. */
static int option_ids(const Tokenizer *t, int chat, const PromptSet *p, const char *question, const int *qids,
                      int nq, const char *text, int *out, int cap) {
    if (chat) {
        int n = tokenizer_encode(t, text, 0, 0, out, cap - 1);
        if (n < 0) return -1;
        out[n] = p->answer_stop[0];  /* the end of the assistant's turn */
        return n + 1;
    }
    size_t lq = strlen(question);
    char *joint = xmalloc(lq + strlen(text) + 2);
    memcpy(joint, question, lq);
    joint[lq] = ' ';
    strcpy(joint + lq + 1, text);
    int n, *ids = encode_prompt(t, joint, 0, 1, nq + cap, &n);
    free(joint);
    if (!ids) return -1;
    int ok = n > nq && !memcmp(ids, qids, nq * sizeof(int));
    if (ok) memcpy(out, ids + nq, (n - nq) * sizeof(int));
    free(ids);
    if (!ok) fprintf(stderr, "error: the option '%s' does not add its own tokens to its question's\n", text);
    return ok ? n - nq : -1;
}

int questions_prompts(const Questions *q, const Tokenizer *t, int chat, int max_len, PromptSet *p) {
    memset(p, 0, sizeof(*p));
    answer_conventions(t, chat, p);
    int n_options = q->first[q->n], *reply = xmalloc(max_len * sizeof(int)), rc = 0;
    size_t room = 0;
    p->offsets = xmalloc((n_options + 1) * sizeof(int));
    p->question_len = xmalloc(n_options * sizeof(int));
    p->split = xmalloc(n_options);
    for (int i = 0; i < q->n && rc == 0; i++) {
        int nq, *qids = encode_prompt(t, q->question[i], chat, 1, max_len - 1, &nq);
        if (!qids) { rc = -1; break; }
        for (int k = q->first[i]; k < q->first[i + 1] && rc == 0; k++) {
            int nr = option_ids(t, chat, p, q->question[i], qids, nq, q->option[k], reply, max_len - nq);
            if (nr < 0) {
                fprintf(stderr, "error: %s:%d: an option of this question is longer than the room after the "
                        "document (%d tokens with the question) or cannot be encoded\n", q->path, q->line[i], max_len);
                rc = -1;
                break;
            }
            p->offsets[p->n_prompts + 1] = p->offsets[p->n_prompts];
            append_ids(p, &room, qids, nq);
            append_ids(p, &room, reply, nr);
            p->question_len[p->n_prompts++] = nq;
        }
        free(qids);
    }
    free(reply);
    if (rc != 0) promptset_free(p);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The three runs                                                           */

/* Run k's choices: the option of highest mean log-probability per token
 * (the first of equal ones). */
static void choose(const Questions *q, const PromptSet *p, QaResult *r, int k) {
    double *sum = r->sum + (size_t)k * r->n_options, *mean = r->mean + (size_t)k * r->n_options;
    for (int o = 0; o < r->n_options; o++)  /* over the option's tokens: the prompt's after its question */
        mean[o] = sum[o] / (p->offsets[o + 1] - p->offsets[o] - p->question_len[o]);
    for (int i = 0; i < q->n; i++) {
        int best = 0;
        for (int o = 1; o < q->first[i + 1] - q->first[i]; o++)
            if (mean[q->first[i] + o] > mean[q->first[i] + best]) best = o;
        r->choice[(size_t)k * q->n + i] = best;
        r->correct[k] += best == q->right[i];
    }
}

int qa_evaluate(const Model *m, const Document *full, const Document *nectar, const Questions *q,
                const PromptSet *p, QaResult *r) {
    memset(r, 0, sizeof(*r));
    r->n = q->n;
    r->n_options = p->n_prompts;
    r->has_nectar = nectar != NULL;
    r->choice = xmalloc((size_t)QA_RUNS * q->n * sizeof(int));
    r->sum = xmalloc((size_t)QA_RUNS * r->n_options * sizeof(double));
    r->mean = xmalloc((size_t)QA_RUNS * r->n_options * sizeof(double));
    const Document *runs[QA_RUNS] = {full, nectar, NULL};  /* NULL: no document */
    static const char *const names[QA_RUNS] = {"questions, full cache", "questions, Nectar",
                                               "questions, no document"};
    for (int k = 0; k < QA_RUNS; k++) {
        if (k == QA_NECTAR && !nectar) continue;
        if (answer_loglik(m, runs[k], p, names[k], r->sum + (size_t)k * r->n_options) != 0) return -1;
        choose(q, p, r, k);
    }
    for (int k = 0; k < QA_RUNS; k++)
        for (int i = 0; i < q->n; i++) r->agree[k] += r->choice[(size_t)k * q->n + i] == r->choice[i];
    return 0;
}

void qaresult_free(QaResult *r) {
    free(r->choice); free(r->sum); free(r->mean);
    memset(r, 0, sizeof(*r));
}

/* ------------------------------------------------------------------------ */
/* Reports                                                                  */

static void print_rate(FILE *f, int k, int n) {
    double lo, hi;
    wilson_interval(k, n, &lo, &hi);
    fprintf(f, "%4d/%-4d = %.3f [%.3f, %.3f]", k, n, (double)k / n, lo, hi);
}

void print_qa_table(FILE *f, const Questions *q, const QaResult *r) {
    static const char *const names[QA_RUNS] = {"full cache ", "Nectar     ", "no document"};
    fprintf(f, "\n%d questions of %s, each option scored by its mean log-probability per token as the reply\n"
            "               right option chosen (95%% interval)   the full cache's choice (95%% interval)\n",
            r->n, q->path);
    for (int k = 0; k < QA_RUNS; k++) {
        if (k == QA_NECTAR && !r->has_nectar) continue;
        fprintf(f, "  %s  ", names[k]);
        print_rate(f, r->correct[k], r->n);
        if (k != QA_FULL) { fprintf(f, "   "); print_rate(f, r->agree[k], r->n); }
        fprintf(f, "\n");
    }
}

/* Each question's options, [[a, b, c, d], ...], of one run's scores x. */
static void json_scores(FILE *f, const Questions *q, const double *x) {
    for (int i = 0; i < q->n; i++)
        for (int o = q->first[i]; o < q->first[i + 1]; o++)
            fprintf(f, "%s%.6g%s", o > q->first[i] ? ", " : i ? ", [" : "[[", x[o],
                    o + 1 == q->first[i + 1] ? "]" : "");
    fprintf(f, "]");
}

/* The JSON fields, each an object of the runs; agreement is with the full
 * cache's choice, so it has no "full". */
enum { J_ACCURACY, J_ACCURACY_CI, J_AGREE, J_AGREE_CI, J_CHOICES, J_SUM, J_MEAN, J_FIELDS };
static const char *const JSON_FIELDS[J_FIELDS] = {"accuracy", "accuracy_ci", "agree", "agree_ci", "choices",
                                                  "logprob_sum", "logprob_mean"};

static void json_value(FILE *f, const Questions *q, const QaResult *r, int field, int k) {
    double lo, hi;
    int hits = field <= J_ACCURACY_CI ? r->correct[k] : r->agree[k];
    switch (field) {
    case J_ACCURACY: case J_AGREE: fprintf(f, "%.6f", (double)hits / r->n); break;
    case J_ACCURACY_CI: case J_AGREE_CI:
        wilson_interval(hits, r->n, &lo, &hi);
        fprintf(f, "[%.6f, %.6f]", lo, hi);
        break;
    case J_CHOICES:
        for (int i = 0; i < r->n; i++) fprintf(f, "%s%d", i ? ", " : "[", r->choice[(size_t)k * r->n + i]);
        fprintf(f, "]");
        break;
    default: json_scores(f, q, (field == J_SUM ? r->sum : r->mean) + (size_t)k * r->n_options);
    }
}

void print_qa_json(FILE *f, const Questions *q, const QaResult *r) {
    static const char *const runs[QA_RUNS] = {"full", "nectar", "nodoc"};
    fprintf(f, "{\"n\": %d", r->n);
    for (int field = 0; field < J_FIELDS; field++) {
        int from = field == J_AGREE || field == J_AGREE_CI ? QA_NECTAR : QA_FULL;
        fprintf(f, ", \"%s\": {", JSON_FIELDS[field]);
        for (int k = from; k < QA_RUNS; k++) {
            fprintf(f, "%s\"%s\": ", k > from ? ", " : "", runs[k]);
            if (k == QA_NECTAR && !r->has_nectar) fprintf(f, "null");
            else json_value(f, q, r, field, k);
        }
        fprintf(f, "}");
    }
    fprintf(f, "}");
}
