/* test_bpe.c - the byte-level BPE tokenizer against Hugging Face tokenizers.
 *
 *     tests/test_bpe DATA_DIR [SMOLLM2.gguf]
 *
 * DATA_DIR holds the fixtures tests/make_bpe_fixtures.py wrote with
 * tokenizers: bpe_classes.txt (the class of every code point), bpe_tiny.txt
 * (a small vocabulary with its cases) and bpe_cases.txt (SmolLM2's ids for
 * the test texts and the license files). SMOLLM2.gguf is the model file,
 * whose vocabulary is read with gguf.c as the programs read it (make
 * test-real gives it); without it those cases say SKIP.
 * Every case must give tokenizers' ids exactly and decode back to its text
 * byte for byte; bad input must be refused with one "error: " sentence.
 *
 * It includes tokenizer_bpe.c itself so it can reach the character classes.
 * The last line is "N passed, M failed"; the exit status is non-zero on any
 * failure.
 */
#include "../src/tokenizer_bpe.c"
#include "../src/gguf.h"

#include <errno.h>
#include <time.h>
#include <unistd.h>

static int n_passed, n_failed;

static void check(const char *what, int ok) {
    printf("  %-60s %s\n", what, ok ? "ok" : "FAIL");
    if (ok) n_passed++; else n_failed++;
}

/* ------------------------------------------------------------------------ */
/* Files, fixture lines and their escapes                                   */

/* A whole file, malloc'd (NUL-terminated too) and its length; NULL if it cannot be read. */
static char *read_whole_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *data = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n + 65536 + 1 > cap) {
            char *grown = realloc(data, cap = 2 * cap + 65536 + 1);
            if (!grown) { free(data); fclose(f); return NULL; }
            data = grown;
        }
        got = fread(data + n, 1, cap - n - 1, f);
        n += got;
    } while (got > 0);
    int failed = ferror(f);
    fclose(f);
    if (failed) { free(data); return NULL; }
    data[n] = '\0';
    *len = n;
    return data;
}

/* Cuts s at each tab (in place) into at most max fields; returns the count. */
static int split_fields(char *s, char **fields, int max) {
    int n = 0;
    fields[n++] = s;
    for (char *p = s; *p && n < max; p++)
        if (*p == '\t') { *p = '\0'; fields[n++] = p + 1; }
    return n;
}

/* Undoes the fixture escapes \\ \n \t \r \xHH in place; returns the length. */
static size_t unescape(char *s) {
    size_t n = 0;
    for (char *p = s; *p; p++) {
        if (*p != '\\' || !p[1]) { s[n++] = *p; continue; }
        char c = *++p;
        if (c == 'x' && p[1] && p[2]) {
            char hex[3] = {p[1], p[2], 0};
            s[n++] = (char)strtol(hex, NULL, 16);
            p += 2;
        } else {
            s[n++] = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
        }
    }
    s[n] = '\0';
    return n;
}

/* Space-separated ids into ids (room for max); returns the count, -1 if more. */
static int parse_ids(const char *s, int *ids, int max) {
    int n = 0;
    for (char *end;; s = end) {
        long v = strtol(s, &end, 10);
        if (end == s) return n;
        if (n == max) return -1;
        ids[n++] = (int)v;
    }
}

/* The fixture's lines (the buffer cut at newlines, in place). */
typedef struct { char *data; char **lines; int n_lines; } Fixture;

static int fixture_load(Fixture *fx, const char *dir, const char *name) {
    char path[4096];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    memset(fx, 0, sizeof *fx);
    fx->data = read_whole_file(path, &len);
    if (!fx->data) { printf("  cannot read %s: %s\n", path, strerror(errno)); return -1; }
    int n = 1;
    for (size_t i = 0; i < len; i++) n += fx->data[i] == '\n';
    fx->lines = malloc((size_t)n * sizeof *fx->lines);
    if (!fx->lines) return -1;
    for (char *p = fx->data, *nl; *p; p = nl + 1) {
        nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        if (*p != '#') fx->lines[fx->n_lines++] = p;
        if (!nl) break;
    }
    return 0;
}

static void fixture_free(Fixture *fx) { free(fx->data); free(fx->lines); }

/* ------------------------------------------------------------------------ */
/* The vocabulary as bpe_init takes it: from a GGUF file's metadata (as the  */
/* programs' tokenizer.c reads it), or from the tiny fixture.                */

typedef struct {
    int n_vocab, n_merges;
    const char **pieces; size_t *piece_len; int32_t *types; /* (n_vocab) */
    const char **merges; size_t *merge_len;                 /* (n_merges) */
    char pre[64];
    GgufFile gguf;  /* the file the strings point into, when read from one */
} Vocab;

static void vocab_free(Vocab *v) {
    free(v->pieces); free(v->piece_len); free(v->types);
    free(v->merges); free(v->merge_len);
    gguf_close(&v->gguf);
    memset(v, 0, sizeof *v);
}

static int vocab_alloc(Vocab *v, int n_vocab, int n_merges) {
    v->n_vocab = n_vocab;
    v->n_merges = n_merges;
    v->pieces = calloc((size_t)n_vocab + 1, sizeof *v->pieces);
    v->piece_len = calloc((size_t)n_vocab + 1, sizeof *v->piece_len);
    v->types = calloc((size_t)n_vocab + 1, sizeof *v->types);
    v->merges = calloc((size_t)n_merges + 1, sizeof *v->merges);
    v->merge_len = calloc((size_t)n_merges + 1, sizeof *v->merge_len);
    return v->pieces && v->piece_len && v->types && v->merges && v->merge_len ? 0 : -1;
}

/* SmolLM2's pieces, token types and merges from the GGUF file at path: 1,
 * or -1 when they cannot be read. */
static int vocab_load(Vocab *v, const char *path) {
    memset(v, 0, sizeof *v);
    if (gguf_open(&v->gguf, path) != 0) return -1;
    const GgufKV *tokens = gguf_get_array(&v->gguf, "tokenizer.ggml.tokens");
    const GgufKV *types = gguf_get_array(&v->gguf, "tokenizer.ggml.token_type");
    const GgufKV *merges = gguf_get_array(&v->gguf, "tokenizer.ggml.merges");
    GgufString pre;
    if (!tokens || !types || !merges || types->array_count != tokens->array_count ||
        gguf_get_string(&v->gguf, "tokenizer.ggml.pre", &pre) || pre.len >= sizeof v->pre ||
        vocab_alloc(v, (int)tokens->array_count, (int)merges->array_count) < 0)
        return -1;
    memcpy(v->pre, pre.ptr, pre.len);
    for (int i = 0; i < v->n_vocab; i++) {
        GgufString piece;
        int64_t type;
        if (gguf_array_string(tokens, i, &piece) || gguf_array_int(types, i, &type)) return -1;
        v->pieces[i] = piece.ptr; v->piece_len[i] = piece.len; v->types[i] = (int32_t)type;
    }
    for (int i = 0; i < v->n_merges; i++) {
        GgufString merge;
        if (gguf_array_string(merges, i, &merge)) return -1;
        v->merges[i] = merge.ptr; v->merge_len[i] = merge.len;
    }
    return 1;
}

/* The small vocabulary of bpe_tiny.txt: its piece and merge lines, in order
 * (unescaped in place: the strings point into the fixture). */
static int vocab_from_tiny(Vocab *v, Fixture *fx) {
    int n_vocab = 0, n_merges = 0;
    char *f[3];
    memset(v, 0, sizeof *v);
    for (int i = 0; i < fx->n_lines; i++) {
        n_vocab += strncmp(fx->lines[i], "piece\t", 6) == 0;
        n_merges += strncmp(fx->lines[i], "merge\t", 6) == 0;
    }
    if (vocab_alloc(v, n_vocab, n_merges) < 0) return -1;
    n_vocab = n_merges = 0;
    for (int i = 0; i < fx->n_lines; i++) {
        if (strncmp(fx->lines[i], "piece\t", 6) == 0) {
            if (split_fields(fx->lines[i], f, 3) != 3) return -1;
            v->types[n_vocab] = (int32_t)atoi(f[1]);
            v->piece_len[n_vocab] = unescape(f[2]);
            v->pieces[n_vocab++] = f[2];
        } else if (strncmp(fx->lines[i], "merge\t", 6) == 0) {
            split_fields(fx->lines[i], f, 2);
            v->merge_len[n_merges] = unescape(f[1]);
            v->merges[n_merges++] = f[1];
        }
    }
    return 0;
}

static int vocab_tokenizer(BpeTokenizer *t, const Vocab *v, const char *pre) {
    return bpe_init(t, "test vocabulary", v->n_vocab, v->pieces, v->piece_len, v->types, v->n_merges, v->merges, v->merge_len, pre);
}

/* ------------------------------------------------------------------------ */
/* Comparing ids and decoding                                               */

static void print_ids(const char *label, const int *ids, int n, int from, int to) {
    printf("      %s [%d..%d):", label, from, to < n ? to : n);
    for (int i = from; i < to && i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

/* 1 if got equals want; else prints the first differing position with both lists around it. */
static int same_ids(const char *what, const int *got, int n_got, const int *want, int n_want) {
    int i = 0;
    while (i < n_got && i < n_want && got[i] == want[i]) i++;
    if (i == n_got && i == n_want) return 1;
    printf("    %s: %d ids, tokenizers %d; first difference at id %d\n", what, n_got, n_want, i);
    print_ids("got ", got, n_got, i > 4 ? i - 4 : 0, i + 6);
    print_ids("want", want, n_want, i > 4 ? i - 4 : 0, i + 6);
    return 0;
}

/* 1 if the ids' bytes, concatenated, are the text byte for byte. */
static int decodes_back(const BpeTokenizer *t, const int *ids, int n, const char *text, size_t len) {
    size_t at = 0, piece_len;
    for (int i = 0; i < n; i++) {
        const char *piece = bpe_piece_bytes(t, ids[i], &piece_len);
        if (!piece || piece_len > len - at || memcmp(text + at, piece, piece_len) != 0) return 0;
        at += piece_len;
    }
    return at == len;
}

/* Where bpe_encode's words end (byte offsets; a control token is a word):
 * its own cutting functions, in its order. Returns the count, -1 if more than max. */
static int word_ends(const BpeTokenizer *t, const char *text, size_t len, int *ends, int max) {
    const unsigned char *s = (const unsigned char *)text;
    int n = 0;
    for (size_t pos = 0; pos < len;) {
        size_t at;
        int special = find_special(t, s, pos, len, &at);
        for (size_t i = 0, digits_end = 0; i < at - pos;) { /* offsets from pos */
            i = word_end(t, s + pos, i, at - pos, &digits_end);
            if (n == max) return -1;
            ends[n++] = (int)(pos + i);
        }
        if (special < 0) break;
        pos = at + (t->bytes_offset[special + 1] - t->bytes_offset[special]);
        if (n == max) return -1;
        ends[n++] = (int)pos;
    }
    return n;
}

/* Every "case" line of the fixture for this pre-tokenizer: the words, the
 * ids and decoding. */
static void run_cases(const BpeTokenizer *t, Fixture *fx, const char *pre, const char *label) {
    enum { MAX_IDS = 4096 };
    static int got[MAX_IDS], want[MAX_IDS];
    int n_cases = 0, n_words = 0, n_equal = 0, n_back = 0;
    char *f[5], what[128];
    for (int i = 0; i < fx->n_lines; i++) {
        if (strncmp(fx->lines[i], "case\t", 5) != 0) continue;
        char *line = strdup(fx->lines[i]); /* split and unescaped again for each tokenizer */
        if (!line || split_fields(line, f, 5) != 5 || strcmp(f[1], pre) != 0) { free(line); continue; }
        size_t len = unescape(f[2]);
        n_cases++;
        snprintf(what, sizeof what, "%s \"%.40s\" words", label, fx->lines[i] + 5);
        int n_want = parse_ids(f[4], want, MAX_IDS), n_got = word_ends(t, f[2], len, got, MAX_IDS);
        if (n_got >= 0 && n_want >= 0 && same_ids(what, got, n_got, want, n_want)) n_words++;
        snprintf(what, sizeof what, "%s \"%.40s\" ids", label, fx->lines[i] + 5);
        n_want = parse_ids(f[3], want, MAX_IDS), n_got = bpe_encode(t, f[2], len, got, MAX_IDS);
        if (n_got >= 0 && n_want >= 0 && same_ids(what, got, n_got, want, n_want)) n_equal++;
        if (n_got >= 0 && decodes_back(t, got, n_got, f[2], len)) n_back++;
        else printf("    %s: do not decode back to the text\n", what);
        free(line);
    }
    snprintf(what, sizeof what, "%s: %d of %d cases cut into tokenizers' words", label, n_words, n_cases);
    check(what, n_cases > 0 && n_words == n_cases);
    snprintf(what, sizeof what, "%s: %d of %d cases give tokenizers' ids", label, n_equal, n_cases);
    check(what, n_cases > 0 && n_equal == n_cases);
    snprintf(what, sizeof what, "%s: %d of %d cases decode back byte for byte", label, n_back, n_cases);
    check(what, n_cases > 0 && n_back == n_cases);
}

/* ------------------------------------------------------------------------ */
/* SHA-256 (FIPS 180-4), to know a license file is the one the fixture saw  */

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* One 64-byte block into the state h[8]. */
static void sha256_block(uint32_t h[8], const unsigned char *block) {
    uint32_t w[64], v[8]; /* the message schedule; the working variables a..h */
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 | (uint32_t)block[4 * i + 2] << 8 | block[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(v, h, sizeof v);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = v[7] + (rotr(v[4], 6) ^ rotr(v[4], 11) ^ rotr(v[4], 25)) + ((v[4] & v[5]) ^ (~v[4] & v[6])) + sha256_k[i] + w[i];
        uint32_t t2 = (rotr(v[0], 2) ^ rotr(v[0], 13) ^ rotr(v[0], 22)) + ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
        memmove(v + 1, v, 7 * sizeof v[0]);
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) h[i] += v[i];
}

/* The digest of data[0..n) as 64 lowercase hex digits (hex holds 65). */
static void sha256_hex(const unsigned char *data, size_t n, char *hex) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char tail[128] = {0}; /* the last bytes, 0x80, zeros, the bit length: one or two blocks */
    size_t full = n / 64 * 64, rest = n - full, n_tail = rest < 56 ? 64 : 128;
    for (size_t i = 0; i < full; i += 64) sha256_block(h, data + i);
    memcpy(tail, data + full, rest);
    tail[rest] = 0x80;
    for (int i = 0; i < 8; i++) tail[n_tail - 1 - i] = (unsigned char)(((uint64_t)n * 8) >> (8 * i));
    for (size_t i = 0; i < n_tail; i += 64) sha256_block(h, tail + i);
    for (int i = 0; i < 8; i++) sprintf(hex + 8 * i, "%08x", h[i]);
}

/* FNV-1a (64-bit) over the ids as int32 little-endian. */
static uint64_t fnv1a_ids(const int *ids, int n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) h = (h ^ (((uint32_t)ids[i] >> (8 * b)) & 0xFF)) * 0x100000001b3ULL;
    return h;
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* One license text: the id count and hash the fixture holds, decoding back,
 * and the time one encoding takes. */
static void check_license_text(const BpeTokenizer *t, const char *label, const char *path, const char *text,
                               size_t len, int want_count, uint64_t want_hash) {
    char what[160];
    int *ids = malloc((len + 1) * sizeof *ids); /* (len + 1): never more ids than bytes */
    if (!ids) { check("memory for the license text's ids", 0); return; }
    const int repeats = 10; /* for the timing */
    double start = seconds_now();
    int n = 0;
    for (int r = 0; r < repeats; r++) n = bpe_encode(t, text, len, ids, (int)len + 1);
    double ms = (seconds_now() - start) / repeats * 1e3;
    uint64_t hash = n > 0 ? fnv1a_ids(ids, n) : 0;
    snprintf(what, sizeof what, "%s %s: %d ids (want %d), hash %016llx", label, path, n, want_count,
             (unsigned long long)hash);
    check(what, n == want_count && hash == want_hash);
    snprintf(what, sizeof what, "%s %s: decodes back byte for byte", label, path);
    check(what, n > 0 && decodes_back(t, ids, n, text, len));
    printf("    %s: %zu bytes encoded in %.2f ms (mean of %d)\n", path, len, ms, repeats);
    free(ids);
}

/* Every "file" line for this pre-tokenizer, the license read where the
 * system keeps it: SKIP if it is absent or not the file the fixture saw. */
static void run_license_files(const BpeTokenizer *t, Fixture *fx, const char *pre, const char *label) {
    char *f[6], digest[65];
    for (int i = 0; i < fx->n_lines; i++) {
        if (strncmp(fx->lines[i], "file\t", 5) != 0) continue;
        char *line = strdup(fx->lines[i]);
        if (!line || split_fields(line, f, 6) != 6 || strcmp(f[1], pre) != 0) { free(line); continue; }
        size_t len = 0;
        char *text = read_whole_file(f[2], &len);
        if (text) sha256_hex((const unsigned char *)text, len, digest);
        if (!text) printf("  SKIP %s %s: the file is absent\n", label, f[2]);
        else if (strcmp(digest, f[3]) != 0) printf("  SKIP %s %s: differs from the one the fixture was made from\n", label, f[2]);
        else check_license_text(t, label, f[2], text, len, atoi(f[4]), strtoull(f[5], NULL, 16));
        free(text);
        free(line);
    }
}

/* ------------------------------------------------------------------------ */
/* Character classes: unicode_tables.h against what tokenizers does         */

/* Every code point (but NUL and the surrogates): the split pattern's class
 * and whether the Digits split isolates it, as bpe_classes.txt records. */
static void test_classes(const char *dir) {
    Fixture fx;
    if (fixture_load(&fx, dir, "bpe_classes.txt") < 0) { check("bpe_classes.txt can be read", 0); return; }
    char *want = malloc(2 * 0x110000); /* (0x110000, 2) class letter, then 'd' or '-' */
    if (!want) { fixture_free(&fx); check("memory for the class table", 0); return; }
    for (uint32_t cp = 0; cp < 0x110000; cp++) { want[2 * cp] = 'O'; want[2 * cp + 1] = '-'; }
    for (int i = 0; i < fx.n_lines; i++) {
        unsigned long first, last;
        char cls[3];
        if (sscanf(fx.lines[i], "%lx %lx %2s", &first, &last, cls) != 3 || last >= 0x110000) continue;
        for (unsigned long cp = first; cp <= last; cp++) memcpy(want + 2 * cp, cls, 2);
    }
    long n_checked = 0, n_bad = 0;
    for (uint32_t cp = 1; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char got_class = "OLNS"[char_class(cp)], got_digit = is_numeric(cp) ? 'd' : '-';
        n_checked++;
        if (got_class == want[2 * cp] && got_digit == want[2 * cp + 1]) continue;
        if (n_bad++ < 5) printf("    U+%04X: class %c%c, tokenizers %c%c\n", (unsigned)cp, got_class, got_digit,
                                want[2 * cp], want[2 * cp + 1]);
    }
    char what[128];
    snprintf(what, sizeof what, "%ld code points, %ld classed unlike tokenizers", n_checked, n_bad);
    check(what, fx.n_lines > 100 && n_bad == 0);
    free(want);
    fixture_free(&fx);
}

/* ------------------------------------------------------------------------ */
/* Bad input: refused with one "error: " sentence                           */

static int saved_stderr = -1;
static FILE *captured;

/* stderr goes to a temporary file until capture_end. */
static void capture_begin(void) {
    fflush(stderr);
    captured = tmpfile();
    saved_stderr = dup(2);
    if (captured && saved_stderr >= 0) dup2(fileno(captured), 2);
}

/* What stderr got since capture_begin (at most size - 1 bytes). */
static void capture_end(char *text, size_t size) {
    size_t n = 0;
    fflush(stderr);
    if (saved_stderr >= 0) { dup2(saved_stderr, 2); close(saved_stderr); }
    if (captured) { rewind(captured); n = fread(text, 1, size - 1, captured); fclose(captured); }
    text[n] = '\0';
}

/* rc must be -1 and stderr one line starting "error: ". */
static void check_refused(const char *what, int rc, const char *message) {
    size_t len = strlen(message);
    int one_sentence = strncmp(message, "error: ", 7) == 0 && len > 0 && strchr(message, '\n') == message + len - 1;
    check(what, rc == -1 && one_sentence);
    printf("    %s", len ? message : "(nothing on stderr)\n");
}

static void expect_init_refused(const char *what, const Vocab *v, const char *pre) {
    BpeTokenizer t;
    char message[512];
    capture_begin();
    int rc = vocab_tokenizer(&t, v, pre);
    capture_end(message, sizeof message);
    if (rc == 0) bpe_free(&t);
    check_refused(what, rc, message);
}

/* The tiny vocabulary with merge i replaced by m. */
static void expect_merge_refused(const char *what, Vocab *v, int i, const char *m) {
    const char *kept = v->merges[i];
    size_t kept_len = v->merge_len[i];
    v->merges[i] = m;
    v->merge_len[i] = strlen(m);
    expect_init_refused(what, v, "gpt2");
    v->merges[i] = kept;
    v->merge_len[i] = kept_len;
}

/* The tiny vocabulary with piece id replaced by p. */
static void expect_piece_refused(const char *what, Vocab *v, int id, const char *p) {
    const char *kept = v->pieces[id];
    size_t kept_len = v->piece_len[id];
    v->pieces[id] = p;
    v->piece_len[id] = strlen(p);
    expect_init_refused(what, v, "gpt2");
    v->pieces[id] = kept;
    v->piece_len[id] = kept_len;
}

static void test_init_refusals(Vocab *v) {
    expect_init_refused("unknown pre-tokenizer \"llama3\"", v, "llama3");
    expect_init_refused("no pre-tokenizer name", v, NULL);
    expect_merge_refused("merge without a space", v, 0, "aba");
    expect_merge_refused("merge with two spaces", v, 0, "a  b");
    expect_merge_refused("merge of three parts", v, 0, "a b c");
    expect_merge_refused("merge with an empty left part", v, 0, " a");
    expect_merge_refused("merge whose right part is not a piece", v, 0, "ab zz");
    expect_merge_refused("merge whose joined piece is not a piece", v, 0, "c x");
    expect_piece_refused("a piece given twice", v, v->n_vocab - 1, "ab");
    int32_t kept = v->types[5];
    v->types[5] = 7;
    expect_init_refused("token type 7", v, "gpt2");
    v->types[5] = kept;
    Vocab empty = *v;
    empty.n_vocab = 0;
    expect_init_refused("an empty vocabulary", &empty, "gpt2");
    empty = *v;
    empty.n_merges = 0;
    expect_init_refused("no merges", &empty, "gpt2");
}

static void expect_encode_refused(const char *what, const BpeTokenizer *t, const char *text, size_t len, int max_ids) {
    int ids[64];
    char message[512];
    capture_begin();
    int rc = bpe_encode(t, text, len, ids, max_ids);
    capture_end(message, sizeof message);
    check_refused(what, rc, message);
}

static void test_encode_refusals(const BpeTokenizer *t) {
    int ids[8];
    expect_encode_refused("text with a NUL byte", t, "ab\0cd", 5, 8);
    expect_encode_refused("invalid UTF-8: a lone continuation byte", t, "a\x80", 2, 8);
    expect_encode_refused("invalid UTF-8: an overlong '/'", t, "\xC0\xAF", 2, 8);
    expect_encode_refused("invalid UTF-8: a cut 3-byte sequence", t, "\xE4\xB8", 2, 8);
    expect_encode_refused("invalid UTF-8: a surrogate", t, "\xED\xA0\x80", 3, 8);
    expect_encode_refused("invalid UTF-8: above U+10FFFF", t, "\xF4\x90\x80\x80", 4, 8);
    expect_encode_refused("invalid UTF-8: the byte 0xFF", t, "x\xFF", 2, 8);
    expect_encode_refused("\"abab\" (2 ids) into max_ids 1", t, "abab", 4, 1);
    expect_encode_refused("\"a</s>\" (2 ids, the second a control) into 1", t, "a</s>", 5, 1);
    check("\"abab\" into max_ids 2 gives 2 ids", bpe_encode(t, "abab", 4, ids, 2) == 2);
    check("U+10FFFF and U+E000 are accepted", bpe_encode(t, "\xF4\x8F\xBF\xBF\xEE\x80\x80", 7, ids, 8) == 7);
    check("the empty text gives no ids, even with max_ids 0", bpe_encode(t, "", 0, NULL, 0) == 0);
    size_t len;
    char message[512];
    capture_begin();
    const char *p = bpe_piece_bytes(t, t->n_vocab, &len);
    capture_end(message, sizeof message);
    check_refused("bpe_piece_bytes of id V", p ? 0 : -1, message);
}

/* A vocabulary without a piece for 'A' builds, and refuses only text with an 'A'. */
static void test_missing_byte(Vocab *v) {
    const char *kept = v->pieces['A'];
    size_t kept_len = v->piece_len['A'];
    BpeTokenizer t;
    int ids[8];
    v->pieces['A'] = "AAAA";
    v->piece_len['A'] = 4;
    if (vocab_tokenizer(&t, v, "gpt2") < 0) {
        check("a vocabulary without the byte 'A' builds", 0);
    } else {
        check("without the byte 'A', \"xyz\" still encodes", bpe_encode(&t, "xyz", 3, ids, 8) == 2);
        expect_encode_refused("without the byte 'A', \"xAy\"", &t, "xAy", 3, 8);
        bpe_free(&t);
    }
    v->pieces['A'] = kept;
    v->piece_len['A'] = kept_len;
}

/* ------------------------------------------------------------------------ */
/* The tests                                                                */

static void test_tiny(const char *dir) {
    Fixture fx;
    Vocab v;
    BpeTokenizer t;
    if (fixture_load(&fx, dir, "bpe_tiny.txt") < 0) { check("bpe_tiny.txt can be read", 0); return; }
    if (vocab_from_tiny(&v, &fx) < 0) { check("bpe_tiny.txt holds a vocabulary", 0); fixture_free(&fx); return; }
    const char *pres[] = {"gpt2", "smollm"};
    for (int k = 0; k < 2; k++) {
        if (vocab_tokenizer(&t, &v, pres[k]) < 0) { check("the small vocabulary builds", 0); continue; }
        run_cases(&t, &fx, pres[k], pres[k]);
        if (k == 0) test_encode_refusals(&t);
        bpe_free(&t);
    }
    if (vocab_tokenizer(&t, &v, "gpt2") == 0) {
        int id = -1;
        size_t len = 0;
        for (int i = 0; i < v.n_vocab; i++) if (v.piece_len[i] == 4 && memcmp(v.pieces[i], "<\xC4\xA0>", 4) == 0) id = i;
        const char *bytes = id >= 0 ? bpe_piece_bytes(&t, id, &len) : NULL;
        check("the control token \"<\xC4\xA0>\" stands for its own text", bytes && len == 4 && memcmp(bytes, "<\xC4\xA0>", 4) == 0);
        bpe_free(&t);
    }
    test_init_refusals(&v);
    test_missing_byte(&v);
    vocab_free(&v);
    fixture_free(&fx);
}

static void test_model(const char *dir, const char *vocab_path) {
    Vocab v;
    Fixture fx;
    int loaded = vocab_path ? vocab_load(&v, vocab_path) : 0;
    if (loaded == 0) { printf("  SKIP: no model given (make test-real gives SmolLM2's GGUF file)\n"); return; }
    if (loaded < 0) { check("the GGUF file's vocabulary can be read", 0); vocab_free(&v); return; }
    if (fixture_load(&fx, dir, "bpe_cases.txt") < 0) { check("bpe_cases.txt can be read", 0); vocab_free(&v); return; }
    const char *pres[] = {v.pre, strcmp(v.pre, "gpt2") ? "gpt2" : "smollm"}; /* the file's, then the other */
    for (int k = 0; k < 2; k++) {
        BpeTokenizer t;
        double start = seconds_now();
        if (vocab_tokenizer(&t, &v, pres[k]) < 0) { check("the vocabulary builds", 0); continue; }
        printf("    %d pieces, %d merges, %d control tokens: built in %.1f ms\n", t.n_vocab, v.n_merges,
               t.n_special, (seconds_now() - start) * 1e3);
        run_cases(&t, &fx, pres[k], pres[k]);
        run_license_files(&t, &fx, pres[k], pres[k]);
        if (k == 0) /* where tokenizers drops the byte without a word */
            expect_encode_refused("\"a\\x04b\": SmolLM2 has no piece for the byte 0x04", &t, "a\x04" "b", 3, 8);
        bpe_free(&t);
    }
    fixture_free(&fx);
    vocab_free(&v);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s DATA_DIR [SMOLLM2.gguf]\n", argv[0]);
        return 1;
    }
    char digest[65];
    sha256_hex((const unsigned char *)"abc", 3, digest);
    printf("SHA-256:\n");
    check("sha256(\"abc\") is the FIPS 180-4 example's",
          strcmp(digest, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
    printf("character classes (Unicode %s, numeric %s) against tokenizers:\n", UNICODE_CLASS_VERSION,
           UNICODE_NUMERIC_VERSION);
    test_classes(argv[1]);
    printf("a small vocabulary (bpe_tiny.txt):\n");
    test_tiny(argv[1]);
    printf("SmolLM2's vocabulary (bpe_cases.txt):\n");
    test_model(argv[1], argc > 2 ? argv[2] : NULL);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
