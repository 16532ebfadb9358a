/* corpus.c - the synthetic reading corpus (formats in corpus.h).
 *
 * Read top to bottom: word lists and invented names, the fact templates,
 * the template matcher (which both checks generated sentences and parses
 * documents back into facts), documents, tasks, samples.
 */
#include "corpus.h"
#include "../src/util.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Word lists and invented names                                            */

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define LIST(a) (a), COUNT(a)

static const char *const ONSETS[] = {"b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r",
                                     "s", "t", "v", "z", "br", "dr", "kr", "st", "th", "sh", "tr"};
static const char *const VOWELS[] = {"a", "e", "i", "o", "u", "a", "e", "o", "ai", "ou", "ei"};
static const char *const CODAS[] = {"", "", "", "n", "r", "l", "s", "m", "k"};
static const char *const ANIMALS[] = {"goats", "sheep", "hens", "geese", "cows", "pigs",
                                      "ducks", "horses", "cats", "dogs", "bees", "rabbits"};
static const char *const JOBS[] = {"baker", "smith", "potter", "weaver", "fisher", "miller",
                                   "tailor", "carpenter", "farmer", "healer", "singer", "painter",
                                   "teacher", "sailor", "mason", "cook", "guard", "builder"};
static const char *const COLORS[] = {"red", "blue", "green", "yellow", "purple", "orange",
                                     "white", "black", "grey", "brown", "pink", "gold"};
static const char *const LANDMARKS[] = {"river", "hill", "lake", "forest", "tower", "bridge",
                                        "valley", "well"};

static int rnd(uint64_t *rng, int n) { return (int)(rng_u32(rng) % (uint32_t)n); }

/* A capitalized word of n syllables (onset? vowel), the last with a coda:
 * at most 4 bytes a syllable and 1 of coda. */
static void make_name(uint64_t *rng, int n, char *out) {
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (i > 0 || rnd(rng, 6) != 0) strcat(out, ONSETS[rnd(rng, COUNT(ONSETS))]);
        strcat(out, VOWELS[rnd(rng, COUNT(VOWELS))]);
    }
    strcat(out, CODAS[rnd(rng, COUNT(CODAS))]);
    out[0] = (char)(out[0] - 'a' + 'A');
}

/* ------------------------------------------------------------------------ */
/* Fact templates                                                           */

/* Slots: {S} the subject (a person or a place of the document), {O} the
 * object (the answer), {W} a word from the template's list that the
 * question repeats. */
enum { OBJ_PLACE, OBJ_NUMBER, OBJ_WORD, OBJ_NAME };
typedef struct {
    const char *sentence, *question;
    int person;                             /* subject: 1 a person, 0 a place */
    int object;                             /* OBJ_* */
    const char *const *objects; int n_objects; /* OBJ_WORD's choices */
    const char *const *words; int n_words;     /* {W}'s choices */
    int lo, hi;                             /* OBJ_NUMBER's range */
} Template;

static const Template TEMPLATES[] = {
    {"{S} lives in {O}", "Where does {S} live?", 1, OBJ_PLACE, NULL, 0, NULL, 0, 0, 0},
    {"{S} keeps {O} {W}", "How many {W} does {S} keep?", 1, OBJ_NUMBER, NULL, 0, LIST(ANIMALS), 2, 40},
    {"{S} works as a {O}", "What does {S} work as?", 1, OBJ_WORD, LIST(JOBS), NULL, 0, 0, 0},
    {"{S} was born in {O}", "When was {S} born?", 1, OBJ_NUMBER, NULL, 0, NULL, 0, 1700, 1999},
    {"{S} likes the color {O}", "Which color does {S} like?", 1, OBJ_WORD, LIST(COLORS), NULL, 0, 0, 0},
    {"{S} is {O} years old", "How old is {S}?", 1, OBJ_NUMBER, NULL, 0, NULL, 0, 5, 90},
    {"The {W} of {S} is called {O}", "What is the {W} of {S} called?", 0, OBJ_NAME, NULL, 0, LIST(LANDMARKS), 0, 0},
    {"{S} is home to {O} people", "How many people live in {S}?", 0, OBJ_NUMBER, NULL, 0, NULL, 0, 40, 9000},
};

/* ------------------------------------------------------------------------ */
/* Matching a sentence against a template                                   */

typedef struct { const char *p; int n; } Span;  /* slots[0] S, [1] O, [2] W */

static int slot_of(char c) { return c == 'S' ? 0 : c == 'O' ? 1 : 2; }

/* A subject is letters and spaces (names of one or two words); an object or
 * a word is letters and digits. */
static int slot_char(int slot, char c) {
    int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    return slot == 0 ? alpha || c == ' ' : alpha || (c >= '0' && c <= '9');
}

/* Backtracking match of the n bytes at s against pat; fills the slots. */
static int match(const char *pat, const char *s, int n, Span *slots) {
    if (!*pat) return n == 0;
    if (*pat == '{') {
        Span *sp = &slots[slot_of(pat[1])];
        for (int k = 1; k <= n && slot_char(slot_of(pat[1]), s[k - 1]); k++) {
            sp->p = s; sp->n = k;
            if (match(pat + 3, s + k, n - k, slots)) return 1;
        }
        return 0;
    }
    return n > 0 && *pat == *s && match(pat + 1, s + 1, n - 1, slots);
}

/* The first template that the sentence matches, or -1. */
static int parse_fact(const char *s, int n, Span *slots) {
    for (int t = 0; t < COUNT(TEMPLATES); t++)
        if (match(TEMPLATES[t].sentence, s, n, slots)) return t;
    return -1;
}

/* Writes fmt with its slots filled (NUL-terminated); returns the length, or
 * -1 when it does not fit in cap. */
static int fill(const char *fmt, const Span *slots, char *out, int cap) {
    int len = 0;
    for (const char *f = fmt; *f; f++) {
        const char *p = f; int n = 1;
        if (*f == '{') { p = slots[slot_of(f[1])].p; n = slots[slot_of(f[1])].n; f += 2; }
        if (len + n >= cap) return -1;
        memcpy(out + len, p, n);
        len += n;
    }
    out[len] = '\0';
    return len;
}

/* ------------------------------------------------------------------------ */
/* Documents                                                                */

#define MAX_SENTENCES 32
typedef struct { int start, len; } Sentence;  /* len without the '.' */

/* Splits a document at its periods (names hold none). Returns the count. */
static int split_sentences(const char *doc, int doc_len, Sentence *s) {
    int n = 0, start = 0;
    for (int i = 0; i < doc_len && n < MAX_SENTENCES; i++) {
        if (doc[i] != '.') continue;
        s[n].start = start; s[n].len = i - start; n++;
        start = i + 2;  /* past ". " */
    }
    return n;
}

static int taken(char names[][32], int n, const char *name) {
    for (int j = 0; j < n; j++) if (!strcmp(names[j], name)) return 1;
    return 0;
}

/* A document of at most max_len bytes: facts about 2-4 people and 1-3
 * places until a random target length in CORPUS_DOC_MIN..CORPUS_DOC_MAX.
 * A fact is kept only if it parses back to its own template and asks a
 * question no earlier fact asks, so every question has one answer. */
static int make_document(uint64_t *rng, char *text, int cap, int max_len) {
    char people[4][32], places[3][32], questions[MAX_SENTENCES][96];
    int n_people = 2 + rnd(rng, 3), n_places = 1 + rnd(rng, 3), n_questions = 0, len = 0;
    /* distinct names (the bound on tries only matters for a stuck rng) */
    for (int i = 0, tries = 0; i < n_people; tries++) {
        char first[16], last[16];
        make_name(rng, 2, first);
        make_name(rng, 1 + rnd(rng, 2), last);
        snprintf(people[i], sizeof people[i], "%s %s", first, last);
        if (!taken(people, i, people[i]) || tries > 100) i++;
    }
    for (int i = 0, tries = 0; i < n_places; tries++) {
        make_name(rng, 2 + rnd(rng, 2), places[i]);
        if (!taken(places, i, places[i]) || tries > 100) i++;
    }
    int limit = max_len < cap - 1 ? max_len : cap - 1;
    int target = CORPUS_DOC_MIN + rnd(rng, CORPUS_DOC_MAX - CORPUS_DOC_MIN + 1);
    if (target > limit) target = limit;
    for (int tries = 0; len < target && tries < 200 && n_questions < MAX_SENTENCES; tries++) {
        const Template *t = &TEMPLATES[rnd(rng, COUNT(TEMPLATES))];
        char object[16], sentence[96];
        const char *subject = t->person ? people[rnd(rng, n_people)] : places[rnd(rng, n_places)];
        const char *word = t->n_words ? t->words[rnd(rng, t->n_words)] : "";
        switch (t->object) {
        case OBJ_PLACE:  strcpy(object, places[rnd(rng, n_places)]); break;
        case OBJ_NUMBER: snprintf(object, sizeof object, "%d", t->lo + rnd(rng, t->hi - t->lo + 1)); break;
        case OBJ_WORD:   strcpy(object, t->objects[rnd(rng, t->n_objects)]); break;
        default:         make_name(rng, 2, object); break;
        }
        Span slots[3] = {{subject, (int)strlen(subject)}, {object, (int)strlen(object)},
                         {word, (int)strlen(word)}}, back[3];
        int n = fill(t->sentence, slots, sentence, sizeof sentence);
        int need = (len ? 1 : 0) + n + 1;  /* " " + sentence + "." */
        if (n < 0 || len + need > limit) continue;
        if (parse_fact(sentence, n, back) != (int)(t - TEMPLATES)) continue;
        char *q = questions[n_questions];
        if (fill(t->question, slots, q, sizeof questions[0]) < 0) continue;
        int seen = 0;
        for (int j = 0; j < n_questions; j++) seen |= !strcmp(q, questions[j]);
        if (seen) continue;
        n_questions++;
        len += snprintf(text + len, cap - len, "%s%s.", len ? " " : "", sentence);
    }
    text[len] = '\0';
    return len;
}

int corpus_document(uint64_t *rng, char *text, int cap) {
    if (cap < 1) return 0;
    return make_document(rng, text, cap, CORPUS_DOC_MAX);
}

/* ------------------------------------------------------------------------ */
/* Tasks                                                                    */

/* Is the k-byte prefix of sentence i (its '.' counted) a prefix of another? */
static int prefix_shared(const char *doc, const Sentence *s, int ns, int i, int k) {
    for (int j = 0; j < ns; j++)
        if (j != i && s[j].len + 1 >= k && !memcmp(doc + s[i].start, doc + s[j].start, k)) return 1;
    return 0;
}

/* The cue length of sentence i for a task kind (the sentence bytes before
 * the answer), or -1 if it has none: quote cuts after 3..6 bytes, continue
 * after 2..3 words, each further on until the cue tells the sentence apart;
 * a question cuts nothing but needs the sentence to parse. */
static int cue_length(uint64_t *rng, const char *doc, const Sentence *s, int ns, int i, int kind) {
    const char *p = doc + s[i].start;
    if (kind == CORPUS_QUOTE) {
        int k = 3 + rnd(rng, 4);
        while (k < s[i].len && prefix_shared(doc, s, ns, i, k)) k++;
        return k < s[i].len ? k : -1;
    }
    if (kind == CORPUS_CONTINUE) {
        int words = 2 + rnd(rng, 2), k = 0;
        for (int w = 0; k < s[i].len; k++) {
            if (p[k] != ' ') continue;
            /* the cue is p[0..k), followed by a space and at least one word */
            if (++w >= words && !prefix_shared(doc, s, ns, i, k + 1)) return k;
        }
        return -1;
    }
    Span slots[3];
    return parse_fact(p, s[i].len, slots) >= 0 ? 0 : -1;
}

int corpus_task(uint64_t *rng, const char *doc, int doc_len, int kind, char *task, int cap,
                int *answer_start) {
    if (kind < CORPUS_QUOTE || kind > CORPUS_QUESTION) return -1;
    Sentence s[MAX_SENTENCES];
    int ns = split_sentences(doc, doc_len, s), cue[MAX_SENTENCES], ok[MAX_SENTENCES], n_ok = 0;
    for (int i = 0; i < ns; i++)
        if ((cue[i] = cue_length(rng, doc, s, ns, i, kind)) >= 0) ok[n_ok++] = i;
    if (n_ok == 0) return -1;
    int i = ok[rnd(rng, n_ok)], k = cue[i], len = -1;
    const char *p = doc + s[i].start;
    if (kind == CORPUS_QUOTE) {
        len = snprintf(task, cap, "Quote: %.*s.\n", s[i].len, p);
        *answer_start = 7 + k;
    } else if (kind == CORPUS_CONTINUE) {
        len = snprintf(task, cap, "Continue: %.*s | %.*s.\n", k, p, s[i].len - k - 1, p + k + 1);
        *answer_start = 10 + k + 3;
    } else {
        Span slots[3];
        char q[96];
        const Template *t = &TEMPLATES[parse_fact(p, s[i].len, slots)];
        if (fill(t->question, slots, q, sizeof q) < 0) return -1;
        len = snprintf(task, cap, "Q: %s\nA: %.*s.\n", q, slots[1].n, slots[1].p);
        *answer_start = len - slots[1].n - 2;
    }
    return len >= 0 && len < cap ? len : -1;
}

/* ------------------------------------------------------------------------ */
/* Multiple-choice questions                                                */

/* The places a document names: the objects of "lives in" and the subjects
 * of its place facts, each once. Returns the count. */
static int document_places(const char *doc, const Sentence *s, int ns, char places[][32]) {
    int n = 0;
    for (int i = 0; i < ns; i++) {
        Span slots[3];
        int t = parse_fact(doc + s[i].start, s[i].len, slots);
        if (t < 0 || (TEMPLATES[t].object != OBJ_PLACE && TEMPLATES[t].person)) continue;
        const Span *place = TEMPLATES[t].person ? &slots[1] : &slots[0];
        char name[32];
        snprintf(name, sizeof name, "%.*s", place->n, place->p);
        if (!taken(places, n, name)) strcpy(places[n++], name);
    }
    return n;
}

/* A wrong answer to a fact of template t whose answer is `right`, none of
 * the k already in wrong[]: a number of the template's range, another word
 * of its list, another of the document's places (invented ones when it has
 * too few), an invented name. */
static void wrong_object(uint64_t *rng, const Template *t, const char *right, char places[][32], int n_places,
                         char wrong[][32], int k) {
    for (int tries = 0;; tries++) {
        char *w = wrong[k];
        switch (t->object) {
        case OBJ_NUMBER: snprintf(w, 32, "%d", t->lo + rnd(rng, t->hi - t->lo + 1)); break;
        case OBJ_WORD:   strcpy(w, t->objects[rnd(rng, t->n_objects)]); break;
        case OBJ_PLACE:  if (tries < 20 && n_places > 1) { strcpy(w, places[rnd(rng, n_places)]); break; }
                         /* fall through */
        default:         make_name(rng, 2 + rnd(rng, 2), w); break;
        }
        if (strcmp(w, right) && !taken(wrong, k, w)) return;
    }
}

int corpus_questions(uint64_t *rng, const char *doc, int doc_len, char *out, int cap) {
    Sentence s[MAX_SENTENCES];
    char places[MAX_SENTENCES][32], wrong[3][32];
    int ns = split_sentences(doc, doc_len, s), n_places = document_places(doc, s, ns, places), len = 0;
    for (int i = 0; i < ns && len >= 0 && len < cap; i++) {
        Span slots[3];
        int t = parse_fact(doc + s[i].start, s[i].len, slots), right_at = rnd(rng, 4);
        char question[96], right[32];
        if (t < 0 || fill(TEMPLATES[t].question, slots, question, sizeof question) < 0) continue;
        snprintf(right, sizeof right, "%.*s", slots[1].n, slots[1].p);
        for (int k = 0; k < 3; k++) wrong_object(rng, &TEMPLATES[t], right, places, n_places, wrong, k);
        len += snprintf(out + len, cap - len, "%s? \\nQ: %s\\nA:\n", len ? "\n" : "", question);
        for (int k = 0, w = 0; k < 4 && len < cap; k++)
            len += snprintf(out + len, cap - len, "%c %s.\\n\n", k == right_at ? '+' : '-',
                            k == right_at ? right : wrong[w++]);
    }
    return len < cap ? len : -1;
}

/* ------------------------------------------------------------------------ */
/* Samples                                                                  */

static void set_weights(float *weight, int from, int to, float w) {
    for (int i = from; i < to; i++) weight[i] = w;
}

CorpusSample corpus_sample(uint64_t *rng, float p_copy, char *text, float *weight, int cap) {
    CorpusSample r = {0, 0};
    if (cap < CORPUS_MIN_CAP) return r;
    if (rng_uniform(rng) < p_copy) {
        /* letters of both cases and digits, with single spaces, neither first
         * nor last: 62 symbols, so that a symbol rarely repeats within a
         * string and copying it can start from one-symbol lookups */
        static const char ALPHABET[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        int n = 20 + rnd(rng, 81), most = (cap - 1 - 10) / 2;
        if (n > most) n = most;
        for (int i = 0; i < n; i++)
            text[i] = i > 0 && i < n - 1 && text[i - 1] != ' ' && rnd(rng, 6) == 0
                    ? ' ' : ALPHABET[rnd(rng, 62)];
        memcpy(text + n, "\nRepeat: ", 9);
        memcpy(text + n + 9, text, n);
        text[2 * n + 9] = '\n';
        text[2 * n + 10] = '\0';
        set_weights(weight, 0, n + 9, CORPUS_PROMPT_WEIGHT);
        set_weights(weight, n + 9, 2 * n + 10, CORPUS_ANSWER_WEIGHT);
        r.len = 2 * n + 10; r.doc_len = n;
        return r;
    }
    int room = cap - 1 - 1 - CORPUS_TASK_MAX;  /* leaves room for "\n" and one task */
    r.doc_len = make_document(rng, text, cap, room < CORPUS_DOC_MAX ? room : CORPUS_DOC_MAX);
    text[r.doc_len] = '\n';
    r.len = r.doc_len + 1;
    set_weights(weight, 0, r.len, CORPUS_PROMPT_WEIGHT);
    for (int n_tasks = 1 + rnd(rng, 3); n_tasks > 0; n_tasks--) {
        char task[CORPUS_TASK_MAX + 1];
        int a, n = -1, kind = rnd(rng, 3);
        for (int k = 0; k < 3 && n < 0; k++)  /* another kind if a document offers none */
            n = corpus_task(rng, text, r.doc_len, (kind + k) % 3, task, sizeof task, &a);
        if (n < 0 || r.len + n > cap - 1) continue;
        memcpy(text + r.len, task, n);
        set_weights(weight, r.len, r.len + a, CORPUS_PROMPT_WEIGHT);
        set_weights(weight, r.len + a, r.len + n, CORPUS_ANSWER_WEIGHT);
        r.len += n;
    }
    text[r.len] = '\0';
    return r;
}
