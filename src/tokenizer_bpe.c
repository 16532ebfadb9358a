/* tokenizer_bpe.c - byte-level BPE (the GPT-2 scheme, as SmolLM2 uses it),
 * built from a GGUF file's tokenizer.ggml.tokens, token_type and merges.
 *
 * Text becomes ids in four steps, the steps Hugging Face `tokenizers` takes
 * for the same vocabulary, so the ids are the same:
 *   1. control and user-defined tokens written in the text are cut out first
 *      (the leftmost match; the longest where several start there), each
 *      giving its one id;
 *   2. the pieces of text between them are cut into words by the
 *      pre-tokenizer: for "smollm" every numeric character is a word by
 *      itself; then, for "smollm" and "gpt2", the GPT-2 split pattern
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      cuts the rest (at each position the first alternative that matches
 *      wins; the character classes are Unicode's, from unicode_tables.h);
 *   3. a word starts as one symbol per byte: the vocabulary spells byte b as
 *      one character (GPT-2's byte-to-character map, "Ġ" for a space);
 *   4. adjacent symbols merge by rank: of all adjacent pairs that have a
 *      merge, the one whose merge comes first in the list merges, the
 *      leftmost where it occurs more than once; the pairs it makes with its
 *      neighbours join the candidates; until no adjacent pair has a merge.
 * A token's bytes are its piece's characters mapped back through the
 * byte-to-character map; a control token stands for its text.
 *
 * Where `tokenizers` takes a choice this file does not: it works on Rust
 * strings, always valid UTF-8, so invalid UTF-8 here is refused; it drops,
 * without a word, a byte whose character is not in the vocabulary (SmolLM2
 * has none for 21 bytes, among them the controls 0x04, 0x06, 0x13, 0x14,
 * 0x16, 0x1D), bpe_encode refuses a text that holds one. A merge listed
 * twice takes its last rank, as there.
 */
#include "tokenizer_bpe.h"
#include "gguf.h"
#include "unicode_tables.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BPE_MAX_ENTRIES (1 << 26) /* vocabulary and merge list sizes beyond this are refused */

/* ------------------------------------------------------------------------ */
/* UTF-8 and character classes                                              */

/* The code point that starts s (n bytes available) and its length 1..4, or
 * 0 if the bytes are not valid UTF-8 (bad lead or continuation byte, an
 * overlong form, a surrogate, a code point above U+10FFFF, a cut sequence). */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    static const uint32_t min_for_length[5] = {0, 0, 0x80, 0x800, 0x10000};
    size_t len = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3
               : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    uint32_t c = len == 1 ? s[0] : s[0] & (0x7F >> len);
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (s[k] & 0x3F);
    }
    if (c < min_for_length[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return len;
}

int utf8_valid(const unsigned char *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0, len; i < n; i += len)
        if ((len = utf8_decode(s + i, n - i, &cp)) == 0) return 0;
    return 1;
}

/* UCLASS_LETTER, _NUMBER, _SPACE or _OTHER: a binary search of the ranges. */
static int char_class(uint32_t cp) {
    size_t lo = 0, hi = sizeof unicode_class_ranges / sizeof unicode_class_ranges[0];
    while (lo < hi) { /* the answer lies in [lo, hi) */
        size_t mid = lo + (hi - lo) / 2;
        if (cp < unicode_class_ranges[mid].first) hi = mid;
        else if (cp > unicode_class_ranges[mid].last) lo = mid + 1;
        else return unicode_class_ranges[mid].cls;
    }
    return UCLASS_OTHER;
}

/* 1 if cp has general category Nd, Nl or No (what the Digits split cuts). */
static int is_numeric(uint32_t cp) {
    size_t lo = 0, hi = sizeof unicode_numeric_ranges / sizeof unicode_numeric_ranges[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < unicode_numeric_ranges[mid][0]) hi = mid;
        else if (cp > unicode_numeric_ranges[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* The class and length of the character at s[i] of valid UTF-8 text. */
static int class_at(const unsigned char *s, size_t i, size_t n, size_t *len) {
    uint32_t cp = 0;
    *len = utf8_decode(s + i, n - i, &cp);
    return char_class(cp);
}

/* ------------------------------------------------------------------------ */
/* Pre-tokenizers: where the words of a piece of text end                   */

/* The length of 's 't 're 've 'm 'll or 'd at s (n bytes), or 0. */
static size_t contraction_length(const unsigned char *s, size_t n) {
    static const char *const suffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (n < 2 || s[0] != '\'') return 0;
    for (size_t k = 0; k < sizeof suffixes / sizeof suffixes[0]; k++) {
        size_t len = strlen(suffixes[k]);
        if (len < n && memcmp(s + 1, suffixes[k], len) == 0) return len + 1;
    }
    return 0;
}

/* The end of the GPT-2 pattern's match at s[i], i < n, in a piece that ends
 * at n. The alternatives in their order:
 *   's|'t|'re|'ve|'m|'ll|'d   a contraction;
 *   ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'   a run of one class, after
 *       an optional space: the space is taken when such a run follows it;
 *   '\s+(?!\S)'   white space not followed by a non-space: the whole run at
 *       the end of the piece, else the run less its last character (which
 *       then starts the next word, as the space before a letter does);
 *   '\s+'   a run of one white-space character before a non-space. */
static size_t pattern_match_end(const unsigned char *s, size_t i, size_t n) {
    size_t len, contraction = contraction_length(s + i, n - i);
    if (contraction) return i + contraction;
    size_t start = s[i] == ' ' && i + 1 < n ? i + 1 : i;
    int cls = class_at(s, start, n, &len);
    if (cls != UCLASS_SPACE) { /* one of the three runs */
        size_t end = start + len;
        while (end < n && class_at(s, end, n, &len) == cls) end += len;
        return end;
    }
    size_t end = i, last = i; /* the run of white space; last: where its last character starts */
    while (end < n && class_at(s, end, n, &len) == UCLASS_SPACE) { last = end; end += len; }
    if (end == n) return n;
    return last > i ? last : end;
}

/* The end of the Digits split's piece at s[i], i < n: a numeric character
 * alone, or everything up to the next numeric character. */
static size_t digits_piece_end(const unsigned char *s, size_t i, size_t n) {
    uint32_t cp = 0;
    size_t len = utf8_decode(s + i, n - i, &cp);
    if (is_numeric(cp)) return i + len;
    for (i += len; i < n; i += len) {
        len = utf8_decode(s + i, n - i, &cp);
        if (is_numeric(cp)) break;
    }
    return i;
}

/* ------------------------------------------------------------------------ */
/* Hash tables: piece -> id (while building) and (left, right) -> merge      */

/* FNV-1a over a then b (64-bit). */
static uint64_t fnv1a(const char *a, size_t na, const char *b, size_t nb) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < na; i++) h = (h ^ (unsigned char)a[i]) * 0x100000001b3ULL;
    for (size_t i = 0; i < nb; i++) h = (h ^ (unsigned char)b[i]) * 0x100000001b3ULL;
    return h;
}

/* The smallest power of two >= 2 n (a table at most half full), n <= BPE_MAX_ENTRIES. */
static uint32_t table_size(int n) {
    uint32_t size = 16;
    while (size < 2 * (uint32_t)n) size *= 2;
    return size;
}

typedef struct {
    const char *const *pieces;
    const size_t *piece_len;
    int32_t *slots; /* (mask + 1) ids, -1 for an empty slot */
    uint32_t mask;
} PieceIndex;

/* The id of the piece spelled a followed by b, or -1. */
static int piece_find(const PieceIndex *ix, const char *a, size_t na, const char *b, size_t nb) {
    for (uint32_t slot = (uint32_t)fnv1a(a, na, b, nb) & ix->mask;; slot = (slot + 1) & ix->mask) {
        int id = ix->slots[slot];
        if (id < 0) return -1;
        const char *p = ix->pieces[id];
        if (ix->piece_len[id] == na + nb && memcmp(p, a, na) == 0 && memcmp(p + na, b, nb) == 0) return id;
    }
}

/* A sentence about building the tokenizer of `source` (the file its
 * vocabulary comes from): "error: SOURCE: ..."; returns -1. */
static int init_fail(const char *source, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "error: %s: ", source);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    return -1;
}

/* Indexes every piece; refuses a piece that appears twice. */
static int piece_index_build(const char *source, PieceIndex *ix, int n_vocab, const char *const *pieces, const size_t *piece_len) {
    ix->pieces = pieces;
    ix->piece_len = piece_len;
    ix->mask = table_size(n_vocab) - 1;
    ix->slots = malloc(((size_t)ix->mask + 1) * sizeof *ix->slots);
    if (!ix->slots) return init_fail(source, "out of memory for the BPE vocabulary index");
    memset(ix->slots, 0xFF, ((size_t)ix->mask + 1) * sizeof *ix->slots); /* every slot -1 */
    for (int id = 0; id < n_vocab; id++) {
        int other = piece_find(ix, pieces[id], piece_len[id], "", 0);
        if (other >= 0)
            return init_fail(source, "BPE tokens %d and %d are the same piece \"%s\"", other, id,
                             gguf_show((GgufString){pieces[id], piece_len[id]}).text);
        uint32_t slot = (uint32_t)fnv1a(pieces[id], piece_len[id], "", 0) & ix->mask;
        while (ix->slots[slot] >= 0) slot = (slot + 1) & ix->mask;
        ix->slots[slot] = id;
    }
    return 0;
}

/* A 64-bit mix of the pair (MurmurHash3's finalizer). */
static uint32_t pair_hash(int32_t left, int32_t right) {
    uint64_t x = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

/* The merge of the pair (left, right), or NULL. */
static const BpeMerge *merge_find(const BpeTokenizer *t, int32_t left, int32_t right) {
    for (uint32_t slot = pair_hash(left, right) & t->merge_mask;; slot = (slot + 1) & t->merge_mask) {
        const BpeMerge *m = &t->merges[slot];
        if (m->left < 0) return NULL;
        if (m->left == left && m->right == right) return m;
    }
}

/* Adds a merge; a pair already there takes the new rank (a HashMap built
 * from the list in order keeps the last one). */
static void merge_insert(BpeTokenizer *t, BpeMerge merge) {
    uint32_t slot = pair_hash(merge.left, merge.right) & t->merge_mask;
    while (t->merges[slot].left >= 0 && !(t->merges[slot].left == merge.left && t->merges[slot].right == merge.right))
        slot = (slot + 1) & t->merge_mask;
    t->merges[slot] = merge;
}

/* ------------------------------------------------------------------------ */
/* Building the tokenizer                                                    */

/* GPT-2's byte-to-character map: the printable bytes '!'..'~', 0xA1..0xAC and
 * 0xAE..0xFF stand for themselves; the other 68 (controls, space, 0x7F..0xA0,
 * 0xAD) take the code points 256, 257, ... in byte order. */
static void byte_level_map(uint32_t char_of_byte[256]) {
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        char_of_byte[b] = printable ? (uint32_t)b : next++;
    }
}

/* The bytes piece p (n bytes) spells, if each of its characters is one of
 * the map's: written to out (at most n bytes), their count returned; else -1. */
static long byte_level_decode(const unsigned char *p, size_t n, const int16_t *byte_of_char, unsigned char *out) {
    size_t n_out = 0;
    for (size_t i = 0, len; i < n; i += len) {
        uint32_t cp = 0;
        len = utf8_decode(p + i, n - i, &cp);
        if (len == 0 || cp >= 324 || byte_of_char[cp] < 0) return -1;
        out[n_out++] = (unsigned char)byte_of_char[cp];
    }
    return (long)n_out;
}

/* t->bytes: what each token stands for (control and user-defined tokens, and
 * pieces that are not byte-level spellings, stand for their own text). */
static int build_token_bytes(const char *source, BpeTokenizer *t, const char *const *pieces, const size_t *piece_len,
                             const int32_t *types, const uint32_t char_of_byte[256]) {
    int16_t byte_of_char[324]; /* (256 + 68) the inverse map; -1: no byte */
    for (int c = 0; c < 324; c++) byte_of_char[c] = -1;
    for (int b = 0; b < 256; b++) byte_of_char[char_of_byte[b]] = (int16_t)b;
    size_t total = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        if (piece_len[id] > SIZE_MAX / 2 - total) return init_fail(source, "the BPE pieces are too long");
        total += piece_len[id];
    }
    t->bytes = malloc(total ? total : 1);
    t->bytes_offset = malloc(((size_t)t->n_vocab + 1) * sizeof *t->bytes_offset);
    if (!t->bytes || !t->bytes_offset) return init_fail(source, "out of memory for the BPE pieces");
    size_t at = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        int special = types && (types[id] == BPE_TOKEN_CONTROL || types[id] == BPE_TOKEN_USER_DEFINED);
        const unsigned char *p = (const unsigned char *)pieces[id];
        long n = special ? -1 : byte_level_decode(p, piece_len[id], byte_of_char, t->bytes + at);
        if (n < 0) { memcpy(t->bytes + at, p, piece_len[id]); n = (long)piece_len[id]; }
        t->bytes_offset[id] = at;
        at += (size_t)n;
    }
    t->bytes_offset[t->n_vocab] = at;
    return 0;
}

/* t->byte_token: the id of the one-character piece of every byte (-1: none). */
static void find_byte_tokens(BpeTokenizer *t, const PieceIndex *ix, const uint32_t char_of_byte[256]) {
    for (int b = 0; b < 256; b++) {
        uint32_t c = char_of_byte[b]; /* < 0x800: two UTF-8 bytes at most */
        char utf8[2] = {(char)(c < 0x80 ? c : 0xC0 | (c >> 6)), (char)(0x80 | (c & 0x3F))};
        t->byte_token[b] = piece_find(ix, utf8, c < 0x80 ? 1 : 2, "", 0);
    }
}

/* t->merges from the strings "A B": rank i for merges[i]. */
static int build_merge_table(const char *source, BpeTokenizer *t, const PieceIndex *ix, int n_merges,
                             const char *const *merges, const size_t *merge_len) {
    t->merge_mask = table_size(n_merges) - 1;
    t->merges = malloc(((size_t)t->merge_mask + 1) * sizeof *t->merges);
    if (!t->merges) return init_fail(source, "out of memory for the BPE merges");
    memset(t->merges, 0xFF, ((size_t)t->merge_mask + 1) * sizeof *t->merges); /* left -1: empty */
    for (int i = 0; i < n_merges; i++) {
        const char *m = merges[i], *space = memchr(m, ' ', merge_len[i]);
        GgufShown shown = gguf_show((GgufString){m, merge_len[i]});
        if (!space || memchr(space + 1, ' ', merge_len[i] - (size_t)(space + 1 - m)))
            return init_fail(source, "BPE merge %d \"%s\" does not hold exactly one space", i, shown.text);
        size_t n_left = (size_t)(space - m), n_right = merge_len[i] - n_left - 1;
        int left = piece_find(ix, m, n_left, "", 0), right = piece_find(ix, space + 1, n_right, "", 0);
        int merged = piece_find(ix, m, n_left, space + 1, n_right);
        if (left < 0 || right < 0 || merged < 0)
            return init_fail(source, "BPE merge %d \"%s\": %s not in the vocabulary", i, shown.text,
                             left < 0 ? "its left part is" : right < 0 ? "its right part is" : "the joined piece is");
        merge_insert(t, (BpeMerge){left, right, i, merged});
    }
    return 0;
}

typedef struct { unsigned char first; size_t len; int id; } SpecialKey;

/* By first byte, then longest first (ties cannot happen: pieces are unique). */
static int special_key_order(const void *pa, const void *pb) {
    const SpecialKey *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* t->special_ids: the control and user-defined tokens with a non-empty piece. */
static int build_special_list(const char *source, BpeTokenizer *t, const int32_t *types) {
    int n = 0;
    for (int id = 0; types && id < t->n_vocab; id++)
        n += (types[id] == BPE_TOKEN_CONTROL || types[id] == BPE_TOKEN_USER_DEFINED) &&
             t->bytes_offset[id + 1] > t->bytes_offset[id];
    SpecialKey *keys = malloc((size_t)(n ? n : 1) * sizeof *keys); /* (n) */
    t->special_ids = malloc((size_t)(n ? n : 1) * sizeof *t->special_ids);
    if (!keys || !t->special_ids) { free(keys); return init_fail(source, "out of memory for the BPE control tokens"); }
    for (int id = 0, k = 0; k < n; id++) {
        size_t len = t->bytes_offset[id + 1] - t->bytes_offset[id];
        if ((types[id] == BPE_TOKEN_CONTROL || types[id] == BPE_TOKEN_USER_DEFINED) && len > 0)
            keys[k++] = (SpecialKey){t->bytes[t->bytes_offset[id]], len, id};
    }
    qsort(keys, (size_t)n, sizeof *keys, special_key_order);
    for (int b = 0, k = 0; b <= 256; b++) { /* special_start[b]: the first key whose first byte is >= b */
        while (k < n && keys[k].first < b) k++;
        t->special_start[b] = k;
    }
    for (int k = 0; k < n; k++) t->special_ids[k] = keys[k].id;
    t->n_special = n;
    free(keys);
    return 0;
}

/* The counts, pointers, token types and the pre-tokenizer's name. */
static int check_init_args(const char *source, int n_vocab, const char *const *pieces, const size_t *piece_len, const int32_t *types,
                           int n_merges, const char *const *merges, const size_t *merge_len, const char *pre,
                           int *pre_kind) {
    if (n_vocab <= 0 || n_vocab > BPE_MAX_ENTRIES || n_merges <= 0 || n_merges > BPE_MAX_ENTRIES)
        return init_fail(source, "a BPE tokenizer needs 1..%d pieces and 1..%d merges, not %d and %d",
                         BPE_MAX_ENTRIES, BPE_MAX_ENTRIES, n_vocab, n_merges);
    if (!pieces || !piece_len || !merges || !merge_len)
        return init_fail(source, "the BPE tokenizer was given no pieces or no merges");
    for (int id = 0; id < n_vocab; id++) {
        if (!pieces[id]) return init_fail(source, "BPE token %d has no piece", id);
        if (types && (types[id] < BPE_TOKEN_NORMAL || types[id] > BPE_TOKEN_BYTE))
            return init_fail(source, "BPE token %d has type %d, outside 1..6", id, (int)types[id]);
    }
    for (int i = 0; i < n_merges; i++)
        if (!merges[i]) return init_fail(source, "BPE merge %d is missing", i);
    if (!pre) return init_fail(source, "the BPE tokenizer names no pre-tokenizer");
    if (strcmp(pre, "gpt2") == 0) *pre_kind = BPE_PRE_GPT2;
    else if (strcmp(pre, "smollm") == 0) *pre_kind = BPE_PRE_SMOLLM;
    else return init_fail(source, "unknown BPE pre-tokenizer \"%.64s\" (known: gpt2, smollm)", pre);
    return 0;
}

int bpe_init(BpeTokenizer *t, const char *source, int n_vocab, const char *const *pieces, const size_t *piece_len,
             const int32_t *types, int n_merges, const char *const *merges, const size_t *merge_len,
             const char *pre) {
    memset(t, 0, sizeof *t);
    int pre_kind = 0;
    if (check_init_args(source, n_vocab, pieces, piece_len, types, n_merges, merges, merge_len, pre, &pre_kind) < 0)
        return -1;
    t->n_vocab = n_vocab;
    t->pre = pre_kind;
    uint32_t char_of_byte[256];
    byte_level_map(char_of_byte);
    PieceIndex ix = {0};
    int ok = piece_index_build(source, &ix, n_vocab, pieces, piece_len) == 0 &&
             build_token_bytes(source, t, pieces, piece_len, types, char_of_byte) == 0;
    if (ok) find_byte_tokens(t, &ix, char_of_byte);
    ok = ok && build_merge_table(source, t, &ix, n_merges, merges, merge_len) == 0 &&
         build_special_list(source, t, types) == 0;
    free(ix.slots);
    if (!ok) { bpe_free(t); return -1; }
    return 0;
}

void bpe_free(BpeTokenizer *t) {
    free(t->bytes);
    free(t->bytes_offset);
    free(t->merges);
    free(t->special_ids);
    memset(t, 0, sizeof *t);
}

const char *bpe_piece_bytes(const BpeTokenizer *t, int id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        fprintf(stderr, "error: token id %d is outside the vocabulary [0, %d)\n", id, t->n_vocab);
        *len = 0;
        return NULL;
    }
    *len = t->bytes_offset[id + 1] - t->bytes_offset[id];
    return (const char *)t->bytes + t->bytes_offset[id];
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                  */

typedef struct { int32_t token, prev, next; } Symbol; /* token -1: merged into its left neighbour */
typedef struct { int32_t rank, pos, merged; } Candidate; /* the pair starting at symbol pos */

/* One bpe_encode call: its text, the ids written so far, the BPE scratch. */
typedef struct {
    const unsigned char *text; /* the whole text, for offsets in messages */
    int *ids;                  /* (max_ids) */
    int max_ids, n_ids;
    Symbol *symbols;           /* (cap) one per byte of the word */
    Candidate *heap;           /* (3 cap) a min-heap by (rank, pos) */
    size_t cap;
} Encoding;

static int emit(Encoding *e, int id) {
    if (e->n_ids >= e->max_ids) {
        fprintf(stderr, "error: the text needs more than %d tokens\n", e->max_ids);
        return -1;
    }
    e->ids[e->n_ids++] = id;
    return 0;
}

static int scratch_reserve(Encoding *e, size_t n) {
    if (n <= e->cap) return 0;
    Symbol *s = realloc(e->symbols, n * sizeof *s);
    if (s) e->symbols = s;
    Candidate *h = s ? realloc(e->heap, 3 * n * sizeof *h) : NULL;
    if (!h) { fprintf(stderr, "error: out of memory for a word of %zu bytes\n", n); return -1; }
    e->heap = h;
    e->cap = n;
    return 0;
}

static int candidate_before(Candidate a, Candidate b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

/* Pushes the pair starting at symbol pos if it has a merge. */
static void candidate_push(const BpeTokenizer *t, const Symbol *sym, int32_t pos, Candidate *heap, size_t *n) {
    const BpeMerge *m = merge_find(t, sym[pos].token, sym[sym[pos].next].token);
    if (!m) return;
    size_t i = (*n)++;
    heap[i] = (Candidate){m->rank, pos, m->merged};
    while (i > 0 && candidate_before(heap[i], heap[(i - 1) / 2])) { /* sift up */
        Candidate up = heap[(i - 1) / 2];
        heap[(i - 1) / 2] = heap[i];
        heap[i] = up;
        i = (i - 1) / 2;
    }
}

static Candidate candidate_pop(Candidate *heap, size_t *n) {
    Candidate top = heap[0];
    heap[0] = heap[--*n];
    for (size_t i = 0;;) { /* sift down */
        size_t child = 2 * i + 1;
        if (child >= *n) break;
        if (child + 1 < *n && candidate_before(heap[child + 1], heap[child])) child++;
        if (!candidate_before(heap[child], heap[i])) break;
        Candidate down = heap[i];
        heap[i] = heap[child];
        heap[child] = down;
        i = child;
    }
    return top;
}

/* BPE on one word (n >= 1 bytes): one symbol per byte, then merges by rank.
 * A candidate whose pair has changed since it was pushed (its left symbol
 * merged away, or now is last, or the pair's merge is another) is dropped.
 * Each merge pushes at most two candidates, so the heap holds < 3 n. */
static int bpe_word(const BpeTokenizer *t, const unsigned char *word, size_t n, Encoding *e) {
    if (scratch_reserve(e, n) < 0) return -1;
    Symbol *sym = e->symbols;
    size_t n_heap = 0;
    for (size_t i = 0; i < n; i++) {
        sym[i] = (Symbol){t->byte_token[word[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
        if (sym[i].token < 0) {
            fprintf(stderr, "error: the text holds the byte 0x%02X (at byte %zu), which the vocabulary has no piece for\n",
                    word[i], (size_t)(word + i - e->text));
            return -1;
        }
    }
    for (size_t i = 0; i + 1 < n; i++) candidate_push(t, sym, (int32_t)i, e->heap, &n_heap);
    while (n_heap > 0) {
        Candidate top = candidate_pop(e->heap, &n_heap);
        Symbol *left = &sym[top.pos];
        if (left->token < 0 || left->next < 0) continue;
        Symbol *right = &sym[left->next];
        const BpeMerge *m = merge_find(t, left->token, right->token);
        if (!m || m->merged != top.merged) continue;
        left->token = top.merged; /* left takes in right */
        right->token = -1;
        left->next = right->next;
        if (left->next >= 0) sym[left->next].prev = top.pos;
        if (left->prev >= 0) candidate_push(t, sym, left->prev, e->heap, &n_heap);
        if (left->next >= 0) candidate_push(t, sym, top.pos, e->heap, &n_heap);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) /* symbol 0 is never merged away */
        if (emit(e, sym[i].token) < 0) return -1;
    return 0;
}

/* The end of the pre-tokenizer's word at s[i], i < n, in text without
 * control tokens. *digits_end: where the current piece of the Digits split
 * ends (start at 0; found once per piece, not once per word). */
static size_t word_end(const BpeTokenizer *t, const unsigned char *s, size_t i, size_t n, size_t *digits_end) {
    if (t->pre != BPE_PRE_SMOLLM) return pattern_match_end(s, i, n);
    if (i >= *digits_end) *digits_end = digits_piece_end(s, i, n);
    return pattern_match_end(s, i, *digits_end);
}

/* Text without control tokens (n bytes): pre-tokenizer words, then BPE. */
static int encode_piece(const BpeTokenizer *t, const unsigned char *s, size_t n, Encoding *e) {
    for (size_t i = 0, digits_end = 0, end; i < n; i = end) {
        end = word_end(t, s, i, n, &digits_end);
        if (bpe_word(t, s + i, end - i, e) < 0) return -1;
    }
    return 0;
}

/* The first control or user-defined token in s[from, n) (the longest of
 * those that start at the same byte): its id, *at its offset; -1 and *at = n
 * if there is none. */
static int find_special(const BpeTokenizer *t, const unsigned char *s, size_t from, size_t n, size_t *at) {
    for (size_t i = from; i < n; i++) {
        for (int k = t->special_start[s[i]]; k < t->special_start[s[i] + 1]; k++) {
            int id = t->special_ids[k];
            size_t len = t->bytes_offset[id + 1] - t->bytes_offset[id];
            if (len <= n - i && memcmp(s + i, t->bytes + t->bytes_offset[id], len) == 0) { *at = i; return id; }
        }
    }
    *at = n;
    return -1;
}

/* The text is valid UTF-8 without a NUL byte. */
static int check_text(const unsigned char *s, size_t n) {
    for (size_t i = 0, len; i < n; i += len) {
        uint32_t cp = 0;
        len = utf8_decode(s + i, n - i, &cp);
        if (len == 0) { fprintf(stderr, "error: the text is not valid UTF-8 at byte %zu\n", i); return -1; }
        if (cp == 0) { fprintf(stderr, "error: the text holds a NUL byte at byte %zu\n", i); return -1; }
    }
    return 0;
}

int bpe_encode(const BpeTokenizer *t, const char *text, size_t len, int *ids, int max_ids) {
    if ((!text && len > 0) || max_ids < 0 || (!ids && max_ids > 0)) {
        fprintf(stderr, "error: bpe_encode was given no text or no room for its ids\n");
        return -1;
    }
    if (len > INT32_MAX) { /* symbol positions are int32 */
        fprintf(stderr, "error: a text of %zu bytes is too long to encode (at most 2^31-1)\n", len);
        return -1;
    }
    const unsigned char *s = (const unsigned char *)text;
    if (check_text(s, len) < 0) return -1;
    Encoding e = {s, ids, max_ids, 0, NULL, NULL, 0};
    int rc = 0;
    for (size_t pos = 0; pos < len && rc == 0;) {
        size_t at;
        int special = find_special(t, s, pos, len, &at);
        rc = encode_piece(t, s + pos, at - pos, &e);
        if (special < 0 || rc < 0) break;
        rc = emit(&e, special);
        pos = at + (t->bytes_offset[special + 1] - t->bytes_offset[special]);
    }
    free(e.symbols);
    free(e.heap);
    return rc < 0 ? -1 : e.n_ids;
}
