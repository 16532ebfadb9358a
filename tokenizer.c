/* tokenizer.c - the llama2.c tokenizer (tokenizer.bin): byte pair encoding
 * by merge score over a vocabulary of pieces, with byte fallback at ids
 * 3..258, as llama2.c's run.c encodes and decodes.
 *
 * File format (native little-endian): int32 max_token_length, then for every
 * token: float32 score, int32 length, `length` bytes (no NUL). The number of
 * tokens is not stored; the caller passes it, or 0 to read to end of file.
 */
#include "nectar.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKEN_BYTES (1 << 20) /* sanity limit for the max_token_length header */

typedef struct { const char *str; int id; } SortEntry;

static int cmp_entry(const void *a, const void *b) {
    const SortEntry *x = a, *y = b;
    int c = strcmp(x->str, y->str);
    return c ? c : (x->id > y->id) - (x->id < y->id); /* equal strings: lower id first */
}

/* Binary search for str in the sorted vocab; its id, or -1 if absent. */
static int lookup(const Tokenizer *t, const char *str) {
    size_t lo = 0, hi = (size_t)t->vocab_size;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(str, t->vocab[t->sorted_ids[mid]]);
        if (c < 0) hi = mid;
        else if (c > 0) lo = mid + 1;
        else return t->sorted_ids[mid];
    }
    return -1;
}

void tokenizer_free(Tokenizer *t) {
    for (int i = 0; t->vocab && i < t->vocab_size; i++) free(t->vocab[i]);
    free(t->vocab);
    free(t->scores);
    free(t->sorted_ids);
    t->vocab = NULL; t->scores = NULL; t->sorted_ids = NULL;
    t->vocab_size = 0;
}

int tokenizer_load(Tokenizer *t, const char *path, int vocab_size) {
    char err[160] = "could not be loaded: out of memory";
    int cap = 0;
    int32_t mtl, len;
    float score;
    memset(t, 0, sizeof *t);
    for (int i = 0; i < 256; i++) t->byte_pieces[2 * i] = (unsigned char)i; /* 2*i+1 stays 0 */
    if (vocab_size < 0) {
        fprintf(stderr, "error: cannot load tokenizer %s with a negative vocab_size (%d)\n", path, vocab_size);
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open tokenizer file %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (fread(&mtl, 1, 4, f) != 4) { snprintf(err, sizeof err, "is too short to hold its 4-byte header"); goto fail; }
    if (mtl < 0 || mtl > MAX_TOKEN_BYTES) {
        snprintf(err, sizeof err, "has an implausible max_token_length of %ld", (long)mtl);
        goto fail;
    }
    t->max_token_length = mtl;
    while (vocab_size == 0 || t->vocab_size < vocab_size) {
        int i = t->vocab_size;
        size_t got = fread(&score, 1, 4, f);
        if (got == 0 && vocab_size == 0 && !ferror(f)) break; /* clean end of file */
        if (got == 0 && !ferror(f)) {
            snprintf(err, sizeof err, "has only %d entries but %d were requested", i, vocab_size);
            goto fail;
        }
        if (got != 4 || fread(&len, 1, 4, f) != 4) {
            snprintf(err, sizeof err, "is truncated inside entry %d", i);
            goto fail;
        }
        if (len < 0 || len > mtl) {
            snprintf(err, sizeof err, "has entry %d with length %ld, outside 0..max_token_length (%ld)",
                     i, (long)len, (long)mtl);
            goto fail;
        }
        if (i == cap) { /* grow both arrays */
            if (cap > INT_MAX / 2) goto fail;
            int ncap = cap ? cap * 2 : 1024;
            char **v = realloc(t->vocab, (size_t)ncap * sizeof *v);
            if (!v) goto fail;
            t->vocab = v;
            float *s = realloc(t->scores, (size_t)ncap * sizeof *s);
            if (!s) goto fail;
            t->scores = s;
            cap = ncap;
        }
        char *str = malloc((size_t)len + 1);
        if (!str) goto fail;
        t->vocab[i] = str;
        t->scores[i] = score;
        t->vocab_size++; /* counted now so that tokenizer_free releases it */
        if (fread(str, 1, (size_t)len, f) != (size_t)len) {
            snprintf(err, sizeof err, "is truncated inside entry %d", i);
            goto fail;
        }
        str[len] = '\0';
    }
    if (t->vocab_size == 0) { snprintf(err, sizeof err, "contains no token entries"); goto fail; }
    /* sort ids by token string once, for binary search in encode */
    SortEntry *tmp = malloc((size_t)t->vocab_size * sizeof *tmp);
    t->sorted_ids = malloc((size_t)t->vocab_size * sizeof *t->sorted_ids);
    if (!tmp || !t->sorted_ids) { free(tmp); goto fail; }
    for (int i = 0; i < t->vocab_size; i++) { tmp[i].str = t->vocab[i]; tmp[i].id = i; }
    qsort(tmp, (size_t)t->vocab_size, sizeof *tmp, cmp_entry);
    for (int i = 0; i < t->vocab_size; i++) t->sorted_ids[i] = tmp[i].id;
    free(tmp);
    fclose(f);
    return 0;
fail:
    fclose(f);
    fprintf(stderr, "error: tokenizer file %s %s\n", path, err);
    tokenizer_free(t);
    return -1;
}

/* Byte-fallback token for byte b: ids 0..2 are <unk>, <s>, </s>, so bytes start at 3. */
static int byte_token(const Tokenizer *t, unsigned char b) {
    return b + 3 < t->vocab_size ? b + 3 : -1;
}

int tokenizer_encode(const Tokenizer *t, const char *text, int bos, int eos, int *tokens, int max_tokens) {
    if (!text) { fprintf(stderr, "error: cannot encode a NULL string\n"); return -1; }
    size_t len = strlen(text);
    if (len > INT_MAX - 3) { fprintf(stderr, "error: text of %zu bytes is too long to encode\n", len); return -1; }
    /* at most BOS + dummy prefix + one token per byte + EOS */
    int *buf = malloc((len + 3) * sizeof *buf);
    /* room for two concatenated tokens, or one 4-byte code point, plus NUL */
    char *str = malloc((size_t)t->max_token_length * 2 + 5);
    int n = 0, ret = -1, id;
    if (!buf || !str) { fprintf(stderr, "error: out of memory while encoding\n"); goto done; }

    if (bos) buf[n++] = 1;
    if (len > 0) { /* sentencepiece's add_dummy_prefix */
        id = lookup(t, " ");
        if (id < 0 && (id = byte_token(t, ' ')) < 0) goto no_bytes; /* llama2.c would store -1 */
        buf[n++] = id;
    }
    /* one token per UTF-8 code point: a byte plus the continuation bytes (10xxxxxx)
       after it, at most 4 bytes; unknown code points fall back to one token per byte */
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0, k; i < len; i += k) {
        for (k = 1; k < 4 && i + k < len && (p[i + k] & 0xC0) == 0x80; k++) {}
        memcpy(str, p + i, k);
        str[k] = '\0';
        if ((id = lookup(t, str)) >= 0) { buf[n++] = id; continue; }
        for (size_t j = 0; j < k; j++) {
            if ((id = byte_token(t, p[i + j])) < 0) goto no_bytes;
            buf[n++] = id;
        }
    }
    /* a token joins at most max_token_length tokens of one or more bytes: refuse what
       cannot fit now, not after the merging, which takes time quadratic in n */
    int nonempty = 0;
    for (int i = 0; i < n; i++) nonempty += t->vocab[buf[i]][0] != '\0';
    int at_least = t->max_token_length > 0 ? (nonempty + t->max_token_length - 1) / t->max_token_length : 0;
    if (at_least + (eos != 0) > max_tokens) {
        fprintf(stderr, "error: the text encodes to at least %d tokens; only %d fit in the model's context\n",
                at_least + (eos != 0), max_tokens);
        goto done;
    }
    /* BPE: repeatedly merge the adjacent pair whose concatenation is in the vocab with
       the highest score (leftmost on ties), until no pair is in the vocab */
    for (;;) {
        float best_score = -1e10f;
        int best_id = -1, best_i = -1;
        for (int i = 0; i + 1 < n; i++) {
            size_t la = strlen(t->vocab[buf[i]]);
            memcpy(str, t->vocab[buf[i]], la);
            strcpy(str + la, t->vocab[buf[i + 1]]);
            id = lookup(t, str);
            if (id >= 0 && t->scores[id] > best_score) { best_score = t->scores[id]; best_id = id; best_i = i; }
        }
        if (best_i < 0) break;
        buf[best_i] = best_id;
        memmove(buf + best_i + 1, buf + best_i + 2, (size_t)(n - best_i - 2) * sizeof *buf);
        n--;
    }
    if (eos) buf[n++] = 2;
    if (n > max_tokens) {
        fprintf(stderr, "error: the text encodes to %d tokens; only %d fit in the model's context\n", n, max_tokens);
        goto done;
    }
    if (n > 0) memcpy(tokens, buf, (size_t)n * sizeof *buf);
    ret = n;
    goto done;
no_bytes:
    fprintf(stderr, "error: byte fallback needs token ids 3..258 but the vocab has only %d entries\n", t->vocab_size);
done:
    free(buf);
    free(str);
    return ret;
}

const char *tokenizer_decode(const Tokenizer *t, int prev_token, int token) {
    if (token < 0 || token >= t->vocab_size) return NULL;
    const char *piece = t->vocab[token];
    if (prev_token == 1 && piece[0] == ' ') piece++; /* sentencepiece strips the space after BOS */
    unsigned char byte; /* raw byte tokens look like "<0x0A>" */
    if (sscanf(piece, "<0x%02hhX>", &byte) == 1) piece = (const char *)t->byte_pieces + 2 * byte;
    return piece;
}
