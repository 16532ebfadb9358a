/* selfstudy.c - the prompts train fits the modules on.
 *
 * The full-cache model writes them itself (selfstudy.h): spans of the
 * document to quote and continuations of them (what the model reads), and
 * tasks in its own formats, each a question and the full cache's greedy
 * answer (what a user asks). A task is kept only when it is well formed and
 * about the document. A user's prompt file adds questions, answered the
 * same way. Everything depends on the seed alone.
 */
#include "selfstudy.h"
#include "cli.h"
#include "eval.h"
#include "formats.h"
#include "parallel.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* A growing prompt set                                                     */

typedef struct { int cap_prompts, cap_tokens; PromptSet set; } PromptBuilder;

/* Appends a prompt of len tokens whose first question_len are its question
 * (0: no answer part). */
static void add_prompt(PromptBuilder *b, const int *tokens, int len, int question_len) {
    PromptSet *p = &b->set;
    if (p->n_prompts + 1 >= b->cap_prompts) {
        b->cap_prompts = 2 * b->cap_prompts + 16;
        p->offsets = realloc(p->offsets, b->cap_prompts * sizeof(int));
        p->split = realloc(p->split, b->cap_prompts);
        p->question_len = realloc(p->question_len, b->cap_prompts * sizeof(int));
        if (!p->offsets || !p->split || !p->question_len) { fprintf(stderr, "error: out of memory\n"); exit(1); }
        if (p->n_prompts == 0) p->offsets[0] = 0;
    }
    int used = p->offsets[p->n_prompts];
    if (used + len > b->cap_tokens) {
        b->cap_tokens = 2 * (used + len) + 64;
        p->tokens = realloc(p->tokens, b->cap_tokens * sizeof(int));
        if (!p->tokens) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    }
    memcpy(p->tokens + used, tokens, len * sizeof(int));
    p->split[p->n_prompts] = SPLIT_RANDOM;
    p->question_len[p->n_prompts] = question_len;
    p->offsets[++p->n_prompts] = used + len;
}

static const char *task_label(const SelfStudyOptions *o) { return o->label ? o->label : "tasks"; }
static int patience(const SelfStudyOptions *o) { return o->eval_only ? 3 : 1; }

/* The tasks' progress line, at most once a second (*shown: when it last was)
 * and at the end, counting tries too (most fail where a model rarely writes a
 * well-formed task): kept of wanted, tries of the most, and the ETA of
 * whichever ends the loop first at the rates so far. */
static void print_task_progress(const SelfStudyOptions *o, int kept, int tries, int most, double t_start,
                                double *shown) {
    double now = now_seconds(), elapsed = now - t_start, per_try = elapsed / (tries > 0 ? tries : 1);
    if (now - *shown < 1 && kept < o->n_tasks && tries < most) return;
    *shown = now;
    double left = most - tries;  /* tries left: at most the cap's, or those the kept rate needs */
    if (kept > 0) left = fmin(left, (double)(o->n_tasks - kept) * tries / kept);
    fprintf(stderr, "\r%s %d/%d kept, %d/%d tries  %.1fs  ETA %.0fs   ", task_label(o), kept, o->n_tasks, tries, most,
            elapsed, left * per_try);
}

/* After a task loop that kept none: what to do about it. */
static void hint_if_none_kept(const SelfStudyOptions *o, int kept) {
    if (kept == 0)
        fprintf(stderr, "%s: none kept: this model does not write them in forms the checks accept (%s 0 skips "
                "the tries)\n", task_label(o), o->eval_only ? "--eval-tasks" : "--tasks");
}

/* 1 when the builder holds a prompt whose question part is these n tokens;
 * for an evaluation-only task (o->eval_only), a prompt that starts with
 * them at all: a prompt trained on must not hold the task's question. */
static int has_question(const SelfStudyOptions *o, const PromptBuilder *b, const int *question, int n) {
    const PromptSet *p = &b->set;
    for (int i = 0; i < p->n_prompts; i++) {
        int len = o->eval_only ? p->offsets[i + 1] - p->offsets[i] : p->question_len[i];
        if ((o->eval_only ? len >= n : len == n) && !memcmp(p->tokens + p->offsets[i], question, n * sizeof(int)))
            return 1;
    }
    return 0;
}

/* Appends the prompts of p with keep[i] (NULL: all) to b, with their
 * splits (or `split` when it is not negative). */
static void add_prompts(PromptBuilder *b, const PromptSet *p, const unsigned char *keep, unsigned char want,
                        int split) {
    for (int i = 0; i < p->n_prompts; i++)
        if (!keep || keep[i] == want) {
            add_prompt(b, p->tokens + p->offsets[i], p->offsets[i + 1] - p->offsets[i], p->question_len[i]);
            b->set.split[b->set.n_prompts - 1] = split >= 0 ? (unsigned char)split : p->split[i];
        }
}

/* p's answer conventions (cap, stops, no-document prefix) into the set. */
static void copy_conventions(PromptSet *to, const PromptSet *p) {
    to->answer_cap = p->answer_cap;
    to->answer_stop[0] = p->answer_stop[0]; to->answer_stop[1] = p->answer_stop[1];
    to->n_nodoc_prefix = p->n_nodoc_prefix;
    free(to->nodoc_prefix);
    to->nodoc_prefix = xmalloc((p->n_nodoc_prefix + 1) * sizeof(int));
    memcpy(to->nodoc_prefix, p->nodoc_prefix, p->n_nodoc_prefix * sizeof(int));
}

PromptSet select_prompts(const PromptSet *p, const unsigned char *is_train, int keep) {
    PromptBuilder b = {0};
    add_prompts(&b, p, is_train, (unsigned char)keep, -1);
    copy_conventions(&b.set, p);
    return b.set;
}

PromptSet join_prompts(const PromptSet *a, const PromptSet *b, unsigned char b_split) {
    PromptBuilder j = {0};
    add_prompts(&j, a, NULL, 0, -1);
    add_prompts(&j, b, NULL, 0, b_split);
    copy_conventions(&j.set, a);
    return j.set;
}

unsigned char *split_prompts(int n, unsigned long long seed) {
    unsigned char *is_train = xmalloc(n);
    int *order = xmalloc(n * sizeof(int));
    uint64_t split_rng = seed * 0x9E3779B97F4A7C15ULL + 3;
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {  /* Fisher-Yates */
        int j = rng_u32(&split_rng) % (i + 1), t = order[i];
        order[i] = order[j]; order[j] = t;
    }
    int n_train = (int)(0.8 * n);
    for (int i = 0; i < n; i++) is_train[order[i]] = i < n_train;
    free(order);
    return is_train;
}

/* ------------------------------------------------------------------------ */
/* The full-cache model's rollouts                                          */

/* rollouts, for self-study's own run states: its failure (a sentence
 * already printed) ends the program, as no prompt set can be made. */
static void rollouts_or_exit(const SelfStudyInputs *in, RunState *s, const int stop[2], Sampler *sampler, Rollout *r,
                             int n) {
    if (rollouts(in->model, s, in->doc, stop, sampler, r, n) != 0) exit(1);
}

/* The full-cache model's rollout after n tokens (see rollouts): at most cap
 * tokens into out, up to one of stop, greedy where sampler is NULL; returns
 * its length. */
static int full_cache_rollout(const SelfStudyInputs *in, const int *tokens, int n, const int stop[2],
                              Sampler *sampler, int cap, int *out) {
    if (cap < 1) return 0;
    RunState s;
    runstate_alloc(&s, in->model, in->doc, n, n + cap);
    Rollout one = {tokens, n, cap, out, 0};
    rollouts_or_exit(in, &s, stop, sampler, &one, 1);
    runstate_free(&s);
    return one.len;
}

/* ------------------------------------------------------------------------ */
/* Spans and continuations                                                  */

/* Half the prompts quote a document span, half continue one with the
 * model's own sampled tokens; spans of [cap / 2, cap] tokens. The
 * continuations are sampled SPAN_BATCH rollouts a forward. */
enum { SPAN_BATCH = 16 };
static void make_spans(const SelfStudyOptions *o, const SelfStudyInputs *in, PromptBuilder *b) {
    uint64_t rng = o->seed * 2654435761ULL + 17;
    int n_doc = in->n_doc, cap = o->prompt_len < n_doc ? o->prompt_len : n_doc, n = o->n_spans;
    Sampler sampler;
    sampler_init(&sampler, in->model->config.vocab_size, 0.8f, 0.95f, o->seed + 1);
    int *seqs = xmalloc(((size_t)n * cap + 1) * sizeof(int)), *lens = xmalloc((n + 1) * sizeof(int));  /* (n, cap), (n) */
    RunState s;
    runstate_alloc_seqs(&s, in->model, in->doc, cap > SPAN_BATCH ? cap : SPAN_BATCH, cap, SPAN_BATCH);
    Rollout batch[SPAN_BATCH];
    const int no_stop[2] = {-1, -1};
    int m = 0;
    double t0 = now_seconds();
    for (int i = 0; i < n; i++) {
        int len = cap / 2 + (int)(rng_u32(&rng) % (cap - cap / 2 + 1));  /* in [cap/2, cap] */
        if (len < 2) len = 2 <= n_doc ? 2 : n_doc;
        int start = 1 + (int)(rng_u32(&rng) % (uint32_t)(n_doc - len > 0 ? n_doc - len : 1));
        if (start + len > n_doc) start = n_doc - len;
        int quote = i % 2 == 0 || len < 4, half = quote ? len : len / 2, *seq = seqs + (size_t)i * cap;
        memcpy(seq, in->doc_ids + start, half * sizeof(int));  /* a quote: the span; else its first half */
        lens[i] = len;
        if (!quote) batch[m++] = (Rollout){seq, half, len - half, seq + half, 0};  /* then the model's own tokens */
        if (m > 0 && (m == SPAN_BATCH || i + 1 == n)) {
            rollouts_or_exit(in, &s, no_stop, &sampler, batch, m);
            m = 0;
            print_progress("spans", i + 1, n, t0);
        }
    }
    for (int i = 0; i < n; i++) add_prompt(b, seqs + (size_t)i * cap, lens[i], 0);
    if (n) { print_progress("spans", n, n, t0); fprintf(stderr, "\n"); }
    runstate_free(&s);
    sampler_free(&sampler);
    free(seqs); free(lens);
}


/* ------------------------------------------------------------------------ */
/* Tasks the model writes                                                   */

/* The text of n ids (BOS left out), malloc'd. */
static char *decoded_text(const Tokenizer *tok, const int *ids, int n) {
    size_t room = 256, len = 0;
    char *text = xmalloc(room);
    for (int i = 0; i < n; i++) {
        const char *piece = ids[i] == tok->bos_id ? "" : tokenizer_decode(tok, i ? ids[i - 1] : tok->bos_id, ids[i]);
        size_t k = piece ? strlen(piece) : 0;
        if (len + k + 1 > room) {
            room = 2 * (len + k + 1);
            text = realloc(text, room);
            if (!text) { fprintf(stderr, "error: out of memory\n"); exit(1); }
        }
        memcpy(text + len, piece, k);
        len += k;
    }
    text[len] = 0;
    return text;
}

/* 1 when text ends with end */
static int ends_with(const char *text, const char *end) {
    size_t n = strlen(text), k = strlen(end);
    return n >= k && !strcmp(text + n - k, end);
}

/* The default model's task formats. The full-cache model writes a task
 * after `seed`, on one line: up to `end` (the question of "Q: ", which ends
 * "?\n", the cue before " | " of "Continue: "), or, with no end, a cue of a
 * few characters (what a quote starts with); then `suffix` completes the
 * question and the model's greedy answer follows, which in every format
 * ends with ANSWER_END. A task is about the document when its `grounded`
 * part is in the document's text: a quote's cue begins a word of it at one
 * place only, a continuation's cue is words of it at one place only (so the
 * task names one sentence), a question's answer is words of it and so is
 * every name (capitalised word after the first) it asks about. */
enum { CUE_STARTS_WORD, CUE_IS_WORDS, ANSWER_IS_WORDS };
typedef struct { const char *seed, *end, *suffix; int grounded; } TaskFormat;
static const TaskFormat TASK_FORMATS[3] = {
    {"\nQuote: ", NULL, "", CUE_STARTS_WORD}, {"\nContinue: ", " | ", "", CUE_IS_WORDS},
    {"\nQ: ", "?\n", "A: ", ANSWER_IS_WORDS}};
#define ANSWER_END ".\n"
enum { MAX_TEXT = 512, MAX_QUESTION = MAX_TEXT + 64 };  /* a task's sampled text (bytes), its question (tokens) */

/* Samples the full-cache model's text after f->seed into text (room bytes):
 * to f->end, or to cue_chars characters when f has none. Returns its
 * length, or -1 when the task is not well formed: the line ends without
 * f->end, no end before the seed and the text reach cap tokens, a newline
 * inside a cue, or BOS. */
static int sample_task_text(const SelfStudyInputs *in, const TaskFormat *f, int cue_chars, int cap,
                            Sampler *sampler, char *text, int room) {
    const Model *m = in->model;
    const Tokenizer *tok = in->tok;
    int seed[64], n_seed = tokenizer_encode(tok, f->seed, 0, 0, seed, 64), len = 0, ok = 0;  /* (64) the seed's ids */
    int max_tokens = cap - n_seed;
    if (n_seed < 1 || max_tokens < 1) return -1;
    RunState s;
    runstate_alloc(&s, m, in->doc, n_seed, n_seed + max_tokens);
    forward(m, &s, in->doc, seed, n_seed, 0, LOGITS_LAST);
    const float *logits = s.logits;
    text[0] = 0;
    for (int i = 0, prev = seed[n_seed - 1]; i < max_tokens && !ok; i++) {
        int next = sample(sampler, logits, m->config.vocab_size);
        const char *piece = tokenizer_decode(tok, prev, next);
        if (next == tok->bos_id || !piece || len + (int)strlen(piece) >= room) break;
        strcpy(text + len, piece);
        len += (int)strlen(piece);
        int newline = strchr(piece, '\n') != NULL;
        ok = f->end ? ends_with(text, f->end) : !newline && len >= cue_chars;
        if (newline) break;  /* the question is one line (a question's ends with the newline) */
        forward(m, &s, in->doc, &next, 1, n_seed + i, LOGITS_LAST);
        logits = s.logits;
        prev = next;
    }
    runstate_free(&s);
    return ok ? len : -1;
}

/* How often `text` (not empty) occurs in doc_text after the start or a
 * space and, if whole_words, before the end, a space or a period. */
static int count_in_document(const char *doc_text, const char *text, int whole_words) {
    size_t n = strlen(text);
    int count = 0;
    for (const char *at = strstr(doc_text, text); n && at; at = strstr(at + 1, text))
        count += (at == doc_text || at[-1] == ' ') && (!whole_words || !at[n] || at[n] == ' ' || at[n] == '.');
    return count;
}

/* 1 when every capitalised word of `text` but the first (a name: letters
 * only, up to a space or punctuation) is a word of doc_text. */
static int names_in_document(const char *doc_text, const char *text) {
    char word[64];
    for (const char *p = text; *p;) {
        while (*p == ' ') p++;
        size_t n = 0;
        while (((p[n] >= 'a' && p[n] <= 'z') || (p[n] >= 'A' && p[n] <= 'Z')) && n + 1 < sizeof word) n++;
        if (n > 0 && p != text && p[0] >= 'A' && p[0] <= 'Z') {
            memcpy(word, p, n);
            word[n] = 0;
            if (count_in_document(doc_text, word, 1) == 0) return 0;
        }
        p += n;
        while (*p && *p != ' ') p++;  /* to the next word */
    }
    return 1;
}

/* 1 when a task (its sampled cue, and its answer of n tokens) is well formed
 * and about the document: the answer's text ends with ANSWER_END, and the
 * part f->grounded names is in doc_text. */
static int task_in_document(const Tokenizer *tok, const TaskFormat *f, const char *doc_text, const char *cue,
                            const int *answer, int n) {
    char *text = decoded_text(tok, answer, n);
    int ok = ends_with(text, ANSWER_END);
    if (ok && f->grounded == ANSWER_IS_WORDS) {
        text[strlen(text) - strlen(ANSWER_END)] = 0;
        ok = count_in_document(doc_text, text[0] == ' ' ? text + 1 : text, 1) > 0 && names_in_document(doc_text, cue);
    } else if (ok) {  /* the cue without the format's end */
        size_t k = strlen(cue) - (f->end ? strlen(f->end) : 0);
        char *bare = xmalloc(k + 1);
        memcpy(bare, cue, k);
        bare[k] = 0;
        ok = count_in_document(doc_text, bare, f->grounded == CUE_IS_WORDS) == 1;
        free(bare);
    }
    free(text);
    return ok;
}

/* One try at a task of format f: its question sampled, encoded, new, and
 * answered by the full cache with a complete answer the document holds,
 * into tokens; the prompt's length (question nq tokens), or 0. */
static int try_task(const SelfStudyOptions *o, const SelfStudyInputs *in, const PromptBuilder *b,
                    const TaskFormat *f, int cue_chars, const int stop[2], const char *doc_text, Sampler *sampler,
                    int *tokens, int *nq) {
    char text[MAX_TEXT], question_text[MAX_QUESTION];
    int cap = o->prompt_len;
    if (sample_task_text(in, f, cue_chars, cap, sampler, text, MAX_TEXT) < 0) return 0;
    snprintf(question_text, sizeof question_text, "%s%s%s", f->seed, text, f->suffix);
    *nq = tokenizer_encode(in->tok, question_text, 0, 0, tokens, MAX_QUESTION);
    if (*nq < 1 || *nq >= cap || has_question(o, b, tokens, *nq)) return 0;
    int room = cap - *nq < o->answer_len ? cap - *nq : o->answer_len;
    int answer = full_cache_rollout(in, tokens, *nq, stop, NULL, room, tokens + *nq);
    int stopped = answer > 0 && (tokens[*nq + answer - 1] == stop[0] || tokens[*nq + answer - 1] == stop[1]);
    if (!stopped || !task_in_document(in->tok, f, doc_text, text, tokens + *nq, answer)) return 0;
    return *nq + answer;
}

/* Self-study task prompts: the full-cache model writes tasks about the
 * document in its own formats, kinds in turn and in equal shares, sampled
 * at its own distribution (temperature 1: diverse tasks), and answers them
 * greedily; a task is kept when try_task finds it well formed, new, and
 * about the document (tasks about what the document does not say, whose
 * answers are guesses, are left out). At most n_tasks of 8 n_tasks tries (times
 * the options' patience). */
static void make_tasks(const SelfStudyOptions *o, const SelfStudyInputs *in, const int stop[2], PromptBuilder *b) {
    int *tokens = xmalloc((MAX_QUESTION + (size_t)o->prompt_len + o->answer_len) * sizeof(int));  /* a task's ids */
    int kept[3] = {0}, tries = 0;
    Sampler sampler;
    sampler_init(&sampler, in->model->config.vocab_size, 1.0f, 1.0f, o->seed + 3);
    uint64_t rng = o->seed * 0x2545F4914F6CDD1DULL + 5;
    char *doc_text = decoded_text(in->tok, in->doc_ids, in->n_doc);
    double t0 = now_seconds(), shown = 0;
    int most = 8 * patience(o) * o->n_tasks;
    for (int done = 0, kind = 0; done < o->n_tasks && tries < most; kind = (kind + 1) % 3) {
        if (kept[kind] >= (o->n_tasks + 2 - kind) / 3) continue;
        tries++;
        int cue_chars = 3 + (int)(rng_u32(&rng) % 14), nq;  /* a quote's cue: 3..16 characters */
        int len = try_task(o, in, b, &TASK_FORMATS[kind], cue_chars, stop, doc_text, &sampler, tokens, &nq);
        if (len > 0) {
            add_prompt(b, tokens, len, nq);
            kept[kind]++;
            done++;
        }
        print_task_progress(o, done, tries, most, t0, &shown);
    }
    fprintf(stderr, "\r%s: %d quote, %d continue, %d question kept of %d tries (the rest not well formed, "
            "repeats, or without a complete answer from the document)\n", task_label(o), kept[0], kept[1], kept[2],
            tries);
    hint_if_none_kept(o, kept[0] + kept[1] + kept[2]);
    sampler_free(&sampler);
    free(doc_text);
    free(tokens);
}

/* ------------------------------------------------------------------------ */
/* Tasks for a chat model                                                   */

/* A chat model writes and answers requests about the document in its own
 * chat turn (after the document, as a user would ask). The document's text
 * is cut into chunks of about CHUNK_CHARS at sentence ends; the requests go
 * to the chunks in turn, and their kinds take turns within each chunk:
 *   question:  the model, shown the chunk, writes a question about it
 *              (sampled, temperature 0.7, top-p 0.9): CHAT_ASK below;
 *   quote:     "Quote the sentence of the document that begins with "...""
 *              (its first QUOTE_WORDS words);
 *   summarise: "Summarise in one sentence the part of the document that
 *              begins "..."" (the chunk's first SUMMARY_WORDS words).
 * (A request to continue the text after a span was tried and left out:
 * SmolLM2-135M-Instruct's answers to it never ended within 128 tokens.)
 * A model-written question is kept when it is one line of 16 to 300
 * characters ending '?'. Every request is then answered by the full cache,
 * greedily, to the end of its turn; a task is kept when the answer ends
 * there within the caps and the request is new. */
enum { CHUNK_CHARS = 600, QUOTE_WORDS = 5, SUMMARY_WORDS = 8, CHAT_BATCH = 16 };
enum { CHAT_QUESTION, CHAT_QUOTE, CHAT_SUMMARY, CHAT_KINDS };
static const char *const CHAT_KIND_NAMES[CHAT_KINDS] = {"question", "quote", "summarise"};
static const char CHAT_ASK[] = "Here is a passage of the document:\n\n%s\n\nWrite one question about this passage "
                               "that the document answers. Write only the question.";

/* The chunks of text: starts (and ends) at sentence ends, about CHUNK_CHARS
 * each; their count (at most max). */
static int document_chunks(const char *text, int max, int *start, int *end) {
    int n = 0, len = (int)strlen(text);
    for (int at = 0; at < len && n < max;) {
        while (at < len && (text[at] == ' ' || text[at] == '\n')) at++;
        if (at >= len) break;
        int stop = at + CHUNK_CHARS < len ? at + CHUNK_CHARS : len;
        while (stop < len && !(text[stop - 1] == '.' && (text[stop] == ' ' || text[stop] == '\n'))) stop++;
        start[n] = at; end[n++] = stop;
        at = stop;
    }
    return n;
}

/* The first `words` words of text from `at` (within its chunk, at most up
 * to `end`, on one line, at most WORDS_CHARS bytes: a text without spaces
 * has no words) into out, malloc'd with spaces between them. */
enum { WORDS_CHARS = 160 };
static char *first_words(const char *text, int at, int end, int words) {
    char *out = xmalloc((size_t)(end - at) + 1);  /* (end - at + 1) */
    int len = 0, count = 0;
    for (int i = at; i < end && count < words && len < WORDS_CHARS; i++) {
        char ch = text[i] == '\n' ? ' ' : text[i];
        if (ch == ' ' && (len == 0 || out[len - 1] == ' ')) continue;
        if (ch == ' ') count++;
        if (count < words) out[len++] = ch;
    }
    while (len > 0 && out[len - 1] == ' ') len--;
    out[len] = 0;
    return out;
}

/* The start of a sentence of the chunk [at, end), picked with rng: the
 * chunk's start or just after a sentence end inside it. */
static int sentence_start(const char *text, int at, int end, uint64_t *rng) {
    int starts[256], n = 0;  /* (256) the first sentence starts */
    starts[n++] = at;
    for (int i = at + 1; i + 1 < end && n < 256; i++)
        if (text[i - 1] == '.' && (text[i] == ' ' || text[i] == '\n')) {
            while (i < end && (text[i] == ' ' || text[i] == '\n')) i++;
            if (i + 1 < end) starts[n++] = i;
        }
    return starts[rng_u32(rng) % n];
}

/* The text of a request of `kind` about the chunk [at, end) of text,
 * malloc'd (for CHAT_QUESTION: CHAT_ASK, which asks the model for one). */
static char *chat_request(const char *text, int at, int end, int kind, uint64_t *rng) {
    int sentence = sentence_start(text, at, end, rng);
    char *words = kind == CHAT_QUESTION ? xmalloc((size_t)(end - at) + 1)
                : kind == CHAT_QUOTE ? first_words(text, sentence, end, QUOTE_WORDS)
                : first_words(text, at, end, SUMMARY_WORDS);
    if (kind == CHAT_QUESTION) { memcpy(words, text + at, end - at); words[end - at] = 0; }
    static const char *const formats[CHAT_KINDS] = {
        CHAT_ASK, "Quote the sentence of the document that begins with \"%s\".",
        "Summarise in one sentence the part of the document that begins \"%s\"."};
    size_t room = strlen(formats[kind]) + strlen(words) + 1;
    char *out = xmalloc(room);
    snprintf(out, room, formats[kind], words);
    free(words);
    return out;
}

/* 1 when a question the model wrote is one line of 16 to 300 characters
 * that ends '?' (its end of turn already cut). */
static int question_well_formed(const char *q) {
    size_t n = strlen(q);
    return n >= 16 && n <= 300 && q[n - 1] == '?' && !strchr(q, '\n');
}

enum { REQUEST_MAX = 256, QUESTION_CAP = 64 };  /* tokens of a request; of a question the model writes */

/* A request's ids as a prompt after the document (the end of the user's
 * turn), at most max of them: their count, or -1. */
static int encode_request(const Tokenizer *tok, const char *text, int *ids, int max) {
    int n, *encoded = encode_prompt(tok, text, 1, 1, 1 << 20, &n);
    if (!encoded || n > max) { free(encoded); return -1; }
    memcpy(ids, encoded, n * sizeof(int));
    free(encoded);
    return n;
}

/* A request of `kind` about chunk k, or, for evaluation-only tasks, a quote
 * or summary request that no prompt of b asks yet: drawn again, from any
 * chunk, up to FRESH_DRAWS times (a question is the model's to write, and
 * is checked once written). malloc'd. */
enum { FRESH_DRAWS = 16 };
static char *next_request(const SelfStudyOptions *o, const SelfStudyInputs *in, const PromptBuilder *b,
                          const int *start, const int *end, int n_chunks, int k, int kind, uint64_t *rng) {
    char *request = chat_request(in->doc_text, start[k], end[k], kind, rng);
    int ids[REQUEST_MAX];
    for (int draw = 1; o->eval_only && kind != CHAT_QUESTION && draw < FRESH_DRAWS; draw++) {
        int n = encode_request(in->tok, request, ids, REQUEST_MAX);
        if (n > 0 && !has_question(o, b, ids, n)) break;
        free(request);
        k = (int)(rng_u32(rng) % n_chunks);
        request = chat_request(in->doc_text, start[k], end[k], kind, rng);
    }
    return request;
}

/* A chat round: CHAT_BATCH requests, their ids and generations. */
typedef struct {
    char *request[CHAT_BATCH];  /* each request's text (NULL: dropped) */
    int kind[CHAT_BATCH];
    int *ids[CHAT_BATCH];       /* (REQUEST_MAX + answer cap) its prompt (n tokens), then the answer */
    int *gen[CHAT_BATCH];       /* (max(QUESTION_CAP, answer cap)) a generation (len tokens, at most cap) */
    int n[CHAT_BATCH], cap[CHAT_BATCH], len[CHAT_BATCH];
    int count;
} ChatRound;

/* The generations of the round's requests at[0..m) (rollouts, s sized for
 * CHAT_BATCH of them) after their ids: len -1 when one did not reach a stop
 * token. */
static void chat_generate(const SelfStudyInputs *in, RunState *s, Sampler *sampler, const int stop[2], ChatRound *cr,
                          const int *at, int m) {
    Rollout r[CHAT_BATCH];
    for (int j = 0; j < m; j++) r[j] = (Rollout){cr->ids[at[j]], cr->n[at[j]], cr->cap[at[j]], cr->gen[at[j]], 0};
    rollouts_or_exit(in, s, stop, sampler, r, m);
    for (int j = 0; j < m; j++) {
        int last = r[j].len > 0 ? r[j].answer[r[j].len - 1] : -1;
        cr->len[at[j]] = last == stop[0] || last == stop[1] ? r[j].len : -1;
    }
}

/* The model's question for each CHAT_QUESTION request of the round: the
 * request replaced by it, or dropped when it is not well formed. */
static void chat_write_questions(const SelfStudyInputs *in, RunState *s, Sampler *sampler, const int stop[2],
                                 ChatRound *cr) {
    int at[CHAT_BATCH], m = 0;  /* (CHAT_BATCH) the requests that ask for a question */
    for (int k = 0; k < cr->count; k++) {
        if (cr->kind[k] != CHAT_QUESTION) continue;
        cr->n[k] = encode_request(in->tok, cr->request[k], cr->ids[k], REQUEST_MAX);
        cr->cap[k] = QUESTION_CAP;
        free(cr->request[k]);
        cr->request[k] = NULL;
        if (cr->n[k] > 0) at[m++] = k;
    }
    chat_generate(in, s, sampler, stop, cr, at, m);
    for (int j = 0; j < m; j++) {
        int k = at[j];
        if (cr->len[k] < 1) continue;
        char *q = decoded_text(in->tok, cr->gen[k], cr->len[k] - 1), *text = q;  /* without its end of turn */
        while (*text == ' ' || *text == '\n') text++;
        for (size_t e = strlen(text); e > 0 && (text[e - 1] == ' ' || text[e - 1] == '\n'); e--) text[e - 1] = 0;
        if (!question_well_formed(text)) { free(q); continue; }
        memmove(q, text, strlen(text) + 1);
        cr->request[k] = q;
    }
}

/* The full cache's answer to each request of the round that is new, within
 * the caps; each one answered to the end of its turn becomes a task, up to
 * `room` of them. */
static void chat_answer_requests(const SelfStudyOptions *o, const SelfStudyInputs *in, RunState *s,
                                 const int stop[2], ChatRound *cr, PromptBuilder *b, int *kept, int room) {
    int at[CHAT_BATCH], m = 0;  /* (CHAT_BATCH) the new requests */
    int limit = o->prompt_len - 1 < REQUEST_MAX ? o->prompt_len - 1 : REQUEST_MAX;  /* the room of ids[k] */
    for (int k = 0; k < cr->count; k++) {
        if (!cr->request[k]) continue;
        int nq = encode_request(in->tok, cr->request[k], cr->ids[k], limit), repeat = nq < 0;
        for (int j = 0; j < m && !repeat; j++)
            repeat = cr->n[at[j]] == nq && !memcmp(cr->ids[at[j]], cr->ids[k], nq * sizeof(int));
        if (repeat || has_question(o, b, cr->ids[k], nq)) continue;
        cr->n[k] = nq;
        cr->cap[k] = o->prompt_len - nq < o->answer_len ? o->prompt_len - nq : o->answer_len;
        at[m++] = k;
    }
    chat_generate(in, s, NULL, stop, cr, at, m);
    for (int j = 0; j < m && room > 0; j++) {
        int k = at[j];
        if (cr->len[k] < 2) continue;  /* no answer before the end of the turn */
        memcpy(cr->ids[k] + cr->n[k], cr->gen[k], cr->len[k] * sizeof(int));
        add_prompt(b, cr->ids[k], cr->n[k] + cr->len[k], cr->n[k]);
        kept[cr->kind[k]]++;
        room--;
    }
}

/* Chat self-study tasks, CHAT_BATCH requests a round (chunks in turn, the
 * kinds in turn within them): the round's questions written in one batch of
 * rollouts, then all its requests answered in another; at most n_tasks
 * from 4 n_tasks requests (times the options' patience). */
static void make_chat_tasks(const SelfStudyOptions *o, const SelfStudyInputs *in, const int stop[2],
                            PromptBuilder *b) {
    enum { MAX_CHUNKS = 4096 };
    int *start = xmalloc(MAX_CHUNKS * sizeof(int)), *end = xmalloc(MAX_CHUNKS * sizeof(int));  /* (MAX_CHUNKS) */
    int n_chunks = document_chunks(in->doc_text, MAX_CHUNKS, start, end), kept[CHAT_KINDS] = {0}, tries = 0;
    int gen_cap = o->answer_len > QUESTION_CAP ? o->answer_len : QUESTION_CAP, done = 0;
    RunState s;
    runstate_alloc_seqs(&s, in->model, in->doc, REQUEST_MAX, REQUEST_MAX + gen_cap, CHAT_BATCH);
    ChatRound cr;
    for (int k = 0; k < CHAT_BATCH; k++) {
        cr.ids[k] = xmalloc((size_t)(REQUEST_MAX + gen_cap) * sizeof(int));
        cr.gen[k] = xmalloc((size_t)gen_cap * sizeof(int));
    }
    Sampler sampler;
    sampler_init(&sampler, in->model->config.vocab_size, 0.7f, 0.9f, o->seed + 3);
    uint64_t rng = o->seed * 0x2545F4914F6CDD1DULL + 5;
    double t0 = now_seconds(), shown = 0;
    int most = 4 * patience(o) * o->n_tasks;
    while (n_chunks > 0 && done < o->n_tasks && tries < most) {
        for (cr.count = 0; cr.count < CHAT_BATCH && tries < most; cr.count++, tries++) {
            int chunk = (tries / CHAT_KINDS) % n_chunks;
            /* evaluation-only: questions and quotes in turn (a summary request is one a chunk, and the
             * self-study asks them all already) */
            cr.kind[cr.count] = o->eval_only ? (tries % 2 ? CHAT_QUOTE : CHAT_QUESTION) : tries % CHAT_KINDS;
            cr.request[cr.count] = next_request(o, in, b, start, end, n_chunks, chunk, cr.kind[cr.count], &rng);
        }
        chat_write_questions(in, &s, &sampler, stop, &cr);
        chat_answer_requests(o, in, &s, stop, &cr, b, kept, o->n_tasks - done);
        for (int k = 0; k < cr.count; k++) free(cr.request[k]);
        done = kept[CHAT_QUESTION] + kept[CHAT_QUOTE] + kept[CHAT_SUMMARY];
        print_task_progress(o, done, tries, most, t0, &shown);
    }
    fprintf(stderr, "\r%s from %d chunks: %d %s, %d %s, %d %s kept of %d requests (the rest not well formed, "
            "repeats, or unanswered within the caps)\n", task_label(o), n_chunks, kept[0], CHAT_KIND_NAMES[0], kept[1],
            CHAT_KIND_NAMES[1], kept[2], CHAT_KIND_NAMES[2], tries);
    hint_if_none_kept(o, done);
    for (int k = 0; k < CHAT_BATCH; k++) { free(cr.ids[k]); free(cr.gen[k]); }
    sampler_free(&sampler);
    runstate_free(&s);
    free(start); free(end);
}

/* ------------------------------------------------------------------------ */
/* The user's prompts                                                       */

/* The ids of a line of token ids into ids: their count, or -1 after a sentence. */
static int parse_id_line(const char *line, const char *path, int line_no, int *ids) {
    int n = 0;
    for (const char *p = line;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end != p && (errno == ERANGE || v < INT_MIN || v > INT_MAX)) end = (char *)p;  /* not an int */
        if (end == p) {
            while (*end == ' ' || *end == '\t' || *end == '\r') end++;
            if (!*end) return n;
            fprintf(stderr, "error: %s line %d: '%s' is not a token id\n", path, line_no, end);
            return -1;
        }
        ids[n++] = (int)v;
        p = end;
    }
}

/* The ids of a line of text into ids (at most cap of them): a backslash-n
 * stands for a newline, two backslashes for one; the prompt follows the
 * document (framed as the end of a chat turn with chat). */
static int encode_text_line(char *line, const Tokenizer *tok, int chat, int cap, int *ids) {
    char *out = line;
    for (char *in = line; *in; in++) {
        if (in[0] == '\\' && (in[1] == 'n' || in[1] == '\\')) { *out++ = in[1] == 'n' ? '\n' : '\\'; in++; }
        else *out++ = *in;
    }
    *out = 0;
    int n, *encoded = encode_prompt(tok, line, chat, 1, INT_MAX, &n);
    if (!encoded) return -1;
    if (n > cap) n = cap;
    memcpy(ids, encoded, n * sizeof(int));
    free(encoded);
    return n;
}

/* Reads user prompts, one per line: text (tok given) or token ids. Each is
 * a question, followed by the full-cache model's greedy answer (to a stop
 * token or --answer-len tokens) within the length cap. */
static int read_user_prompts(const char *path, const Tokenizer *tok, const SelfStudyOptions *o,
                             const SelfStudyInputs *in, const int stop[2], PromptBuilder *b) {
    char *text = read_text_file(path);
    if (!text) return -1;
    int cap = o->prompt_len < in->n_doc ? o->prompt_len : in->n_doc;
    size_t room = strlen(text) + 3 + (size_t)cap;
    int *ids = xmalloc(room * sizeof(int)), line_no = 0, count = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        line_no++;
        if (!*line) continue;
        int n = tok ? encode_text_line(line, tok, o->chat, cap, ids) : parse_id_line(line, path, line_no, ids);
        if (n < 0 || check_tokens(in->model, ids, n, path) != 0) { free(ids); free(text); return -1; }
        if (n == 0) continue;  /* a blank line */
        if (n > cap) n = cap;
        int answer = full_cache_rollout(in, ids, n, stop, NULL, cap - n < o->answer_len ? cap - n : o->answer_len,
                                        ids + n);
        if (n + answer >= 2) { add_prompt(b, ids, n + answer, n); count++; }
    }
    free(ids);
    free(text);
    fprintf(stderr, "read %d prompts from %s, each followed by the model's own answer (up to %d tokens)\n",
            count, path, o->answer_len);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Far from the document                                                    */

void make_far_prompts(const SelfStudyOptions *o, const SelfStudyInputs *in, const PromptSet *from,
                      const unsigned char *keep, PromptSet *out) {
    PromptSet kept = select_prompts(from, keep, 1);
    PromptBuilder b = {0};
    copy_conventions(&b.set, from);
    int max_question, *chosen = xmalloc((kept.n_prompts + 1) * sizeof(int));  /* (n_prompts) */
    int n = prompts_with_questions(&kept, -1, o->far_prompts, chosen, &max_question);
    int room = in->model->config.seq_len - in->n_doc - max_question, length = o->far_len < room ? o->far_len : room;
    if (length < 0) length = 0;
    if (n < o->far_prompts || length < o->far_len)
        fprintf(stderr, "note: %d prompts far from the document (of %d asked: the training task prompts), %d tokens "
                "past their questions (of %d: the context's room)\n", n, o->far_prompts, length, o->far_len);
    int stride = max_question + length, *seqs = xmalloc(((size_t)n * stride + 1) * sizeof(int));  /* (n, stride) */
    if (n > 0 && length > 0 &&
        continue_questions(in->model, in->doc, &kept, chosen, n, max_question, length, seqs, stride,
                           "prompts far from the document, batches") != 0) exit(1);  /* as rollouts_or_exit */
    for (int k = 0; k < n && length > 0; k++) add_prompt(&b, seqs + (size_t)k * stride, kept.question_len[chosen[k]] + length, 0);
    *out = b.set;
    free(seqs); free(chosen);
    promptset_free(&kept);
}

/* ------------------------------------------------------------------------ */

int make_prompt_set(const SelfStudyOptions *o, const SelfStudyInputs *in, PromptSet *out) {
    PromptBuilder b = {0};
    answer_conventions(in->tok, o->chat, &b.set);
    b.set.answer_cap = o->answer_len;
    make_spans(o, in, &b);
    if (o->n_tasks > 0 && in->tok && o->chat) make_chat_tasks(o, in, b.set.answer_stop, &b);
    else if (o->n_tasks > 0 && in->tok) make_tasks(o, in, b.set.answer_stop, &b);
    else if (o->n_tasks > 0) fprintf(stderr, "note: no task prompts: they are text and need a tokenizer (-z)\n");
    int rc = 0;
    if (o->prompts_text_path) rc = read_user_prompts(o->prompts_text_path, in->tok, o, in, b.set.answer_stop, &b);
    if (rc == 0 && o->prompts_ids_path) rc = read_user_prompts(o->prompts_ids_path, NULL, o, in, b.set.answer_stop, &b);
    if (rc == 0 && b.set.n_prompts < 5) {
        fprintf(stderr, "error: %d prompts are too few for a train/held-out split (need 5)\n", b.set.n_prompts);
        rc = -1;
    }
    *out = b.set;
    return rc;
}

void make_eval_tasks(const SelfStudyOptions *o, const SelfStudyInputs *in, const PromptSet *fit, int n,
                     PromptSet *out) {
    /* the builder starts with the self-study prompts: a task that asks what one of them asks is a repeat */
    PromptBuilder b = {0};
    add_prompts(&b, fit, NULL, 0, -1);
    copy_conventions(&b.set, fit);
    int first = b.set.n_prompts;
    SelfStudyOptions eval = *o;
    eval.seed = o->seed ^ 0xE7A15EEDULL;
    eval.n_tasks = n;
    eval.label = "evaluation-only tasks";
    eval.eval_only = 1;  /* the self-study asked the likeliest tasks already: fewer new ones a try */
    if (n > 0 && in->tok && o->chat) make_chat_tasks(&eval, in, b.set.answer_stop, &b);
    else if (n > 0 && in->tok) make_tasks(&eval, in, b.set.answer_stop, &b);
    else if (n > 0) fprintf(stderr, "note: no evaluation-only tasks: they are text and need a tokenizer (-z)\n");
    unsigned char *is_new = xmalloc(b.set.n_prompts + 1);
    for (int i = first; i < b.set.n_prompts; i++) is_new[i] = 1;
    *out = select_prompts(&b.set, is_new, 1);
    free(is_new);
    promptset_free(&b.set);
}
