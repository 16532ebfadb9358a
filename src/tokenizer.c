/* tokenizer.c - the two tokenizers, and the chat template.
 *
 * Scores: byte pair encoding by merge score over a vocabulary of pieces, with
 * byte fallback at ids 3..258, as llama2.c's run.c encodes and decodes; its
 * vocabulary comes from llama2.c's tokenizer.bin or from a GGUF file whose
 * tokenizer.ggml.model is "llama" (SentencePiece's pieces, U+2581 for a
 * space). tokenizer.bin (native little-endian): int32 max_token_length, then
 * for every token: float32 score, int32 length, `length` bytes (no NUL). The
 * number of tokens is not stored; the caller passes it, or 0 to read to end
 * of file.
 *
 * Byte-level BPE (tokenizer_bpe.c): a GGUF file whose tokenizer.ggml.model is
 * "gpt2", as SmolLM2's.
 *
 * The chat template: ChatML, where a GGUF file's tokenizer.chat_template uses
 * it; the document goes into the user's turn, before the question.
 */
#include "tokenizer.h"
#include "formats.h"
#include "gguf.h"
#include "util.h"

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

/* Sorts ids by piece once, for the binary search of encode. */
static void sort_vocab(Tokenizer *t) {
    SortEntry *tmp = xmalloc((size_t)t->vocab_size * sizeof *tmp);
    t->sorted_ids = xmalloc((size_t)t->vocab_size * sizeof *t->sorted_ids);
    for (int i = 0; i < t->vocab_size; i++) { tmp[i].str = t->vocab[i]; tmp[i].id = i; }
    qsort(tmp, (size_t)t->vocab_size, sizeof *tmp, cmp_entry);
    for (int i = 0; i < t->vocab_size; i++) t->sorted_ids[i] = tmp[i].id;
    free(tmp);
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

static int load_tokenizer_bin(Tokenizer *t, const char *path, int vocab_size) {
    char err[160] = "could not be loaded: out of memory";
    int cap = 0;
    int32_t mtl, len;
    float score;
    FILE *f = open_regular_file(path, "tokenizer file");
    if (!f) return -1;
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
    fclose(f);
    /* llama2.c's conventions: BOS 1, EOS 2, BOS before a text that starts a
     * sequence, a space before the text */
    t->bos_id = 1; t->eos_id = 2; t->add_bos = 1; t->add_space_prefix = 1;
    sort_vocab(t);
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

static int encode_scores(const Tokenizer *t, const char *text, int bos, int eos, int *tokens, int max_tokens) {
    size_t len = strlen(text);
    if (len > INT_MAX - 3) { fprintf(stderr, "error: text of %zu bytes is too long to encode\n", len); return -1; }
    /* at most BOS + dummy prefix + one token per byte + EOS */
    int *buf = malloc((len + 3) * sizeof *buf);
    /* room for two concatenated tokens, or one 4-byte code point, plus NUL */
    char *str = malloc((size_t)t->max_token_length * 2 + 5);
    int n = 0, ret = -1, id;
    if (!buf || !str) { fprintf(stderr, "error: out of memory while encoding\n"); goto done; }

    if (bos) buf[n++] = t->bos_id;
    if (len > 0 && t->add_space_prefix) { /* sentencepiece's add_dummy_prefix */
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
    if (eos) buf[n++] = t->eos_id;
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

static const char *decode_scores(const Tokenizer *t, int prev_token, int token) {
    const char *piece = t->vocab[token];
    if (prev_token == t->bos_id && piece[0] == ' ') piece++; /* sentencepiece strips the space after BOS */
    unsigned char byte; /* raw byte tokens look like "<0x0A>" */
    if (sscanf(piece, "<0x%02hhX>", &byte) == 1) piece = (const char *)t->byte_pieces + 2 * byte;
    return piece;
}

/* A GGUF "llama" vocabulary: SentencePiece's pieces, U+2581 standing for a
 * space, written with spaces as tokenizer.bin holds them; byte tokens
 * <0x00>..<0xFF> must sit at ids 3..258, where the byte fallback looks. */
static int load_gguf_scores(Tokenizer *t, const GgufFile *g, const GgufKV *tokens) {
    const GgufKV *scores = gguf_get_array(g, "tokenizer.ggml.scores");
    if (!scores) return -1;
    if (scores->array_count != tokens->array_count) {
        fprintf(stderr, "error: %s: %llu scores for %llu tokens\n", g->name, (unsigned long long)scores->array_count,
                (unsigned long long)tokens->array_count);
        return -1;
    }
    t->vocab = xmalloc((size_t)t->vocab_size * sizeof(char *));
    t->scores = xmalloc((size_t)t->vocab_size * sizeof(float));
    for (int i = 0; i < t->vocab_size; i++) {
        GgufString s;
        double score;
        if (gguf_array_string(tokens, i, &s) != 0 || gguf_array_float(scores, i, &score) != 0) return -1;
        char *piece = xmalloc(s.len + 1);
        size_t n = 0;
        for (size_t k = 0; k < s.len; k++) {
            if (k + 2 < s.len && !memcmp(s.ptr + k, "\xE2\x96\x81", 3)) { piece[n++] = ' '; k += 2; }
            else piece[n++] = s.ptr[k];
        }
        t->vocab[i] = piece;
        t->scores[i] = (float)score;
        if ((int)n > t->max_token_length) t->max_token_length = (int)n;
    }
    for (int b = 0; b < 256; b += 255) {  /* the first and last byte token */
        char want[8];
        snprintf(want, sizeof want, "<0x%02X>", b);
        if (t->vocab_size <= 3 + b || strcmp(t->vocab[3 + b], want)) {
            fprintf(stderr, "error: %s: the byte token %s is not at id %d, where the byte fallback needs it\n",
                    g->name, want, 3 + b);
            return -1;
        }
    }
    sort_vocab(t);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Byte-level BPE: a GGUF "gpt2" vocabulary                                 */

static int load_gguf_bpe(Tokenizer *t, const GgufFile *g, const GgufKV *tokens) {
    const GgufKV *merges = gguf_get_array(g, "tokenizer.ggml.merges");
    const GgufKV *types = gguf_find_key(g, "tokenizer.ggml.token_type") ? gguf_get_array(g, "tokenizer.ggml.token_type")
                                                                        : NULL;
    GgufString pre_name = {"gpt2", 4};
    if (!merges || (gguf_find_key(g, "tokenizer.ggml.pre") && gguf_get_string(g, "tokenizer.ggml.pre", &pre_name)))
        return -1;
    size_t V = tokens->array_count, M = merges->array_count;
    if (types && types->array_count != V) {
        fprintf(stderr, "error: %s: %zu token types for %zu tokens\n", g->name, (size_t)types->array_count, V);
        return -1;
    }
    const char **pieces = xmalloc(V * sizeof(char *)), **merge = xmalloc((M + 1) * sizeof(char *));
    size_t *piece_len = xmalloc(V * sizeof(size_t)), *merge_len = xmalloc((M + 1) * sizeof(size_t));
    int32_t *type = types ? xmalloc(V * sizeof(int32_t)) : NULL;
    char *pre = gguf_string_dup(pre_name);
    int rc = 0;
    for (size_t i = 0; i < V && rc == 0; i++) {
        GgufString s;
        int64_t ty = 1;
        rc = gguf_array_string(tokens, i, &s) || (types && gguf_array_int(types, i, &ty));
        pieces[i] = s.ptr; piece_len[i] = s.len;
        if (type) type[i] = ty >= INT32_MIN && ty <= INT32_MAX ? (int32_t)ty : 0;  /* bpe_init refuses 0 */
    }
    for (size_t i = 0; i < M && rc == 0; i++) {
        GgufString s;
        rc = gguf_array_string(merges, i, &s);
        merge[i] = s.ptr; merge_len[i] = s.len;
    }
    if (rc == 0) rc = bpe_init(&t->bpe, g->name, (int)V, pieces, piece_len, type, (int)M, merge, merge_len, pre);
    free(pieces); free(merge); free(piece_len); free(merge_len); free(type); free(pre);
    return rc ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* A GGUF file's tokenizer: its kind, special ids and chat template         */

/* An id from the metadata (absent: fallback), which must be a token. */
static int special_id(const GgufFile *g, const char *key, int fallback, int vocab_size, int *id) {
    uint64_t v = (uint64_t)fallback;
    if (gguf_find_key(g, key) && gguf_get_uint(g, key, &v) != 0) return -1;
    if (fallback >= 0 && v >= (uint64_t)vocab_size) {
        fprintf(stderr, "error: %s: %s = %llu is not a token id (vocabulary of %d)\n", g->name, key,
                (unsigned long long)v, vocab_size);
        return -1;
    }
    *id = (int)v;
    return 0;
}

/* ChatML's default system message from the template (SmolLM2's writes one
 * when the conversation has none), or "" when the template has none. */
static char *chatml_system(const char *template_text) {
    static const char open[] = "<|im_start|>system\n";
    const char *from = strstr(template_text, open), *to = from ? strstr(from, "<|im_end|>") : NULL;
    size_t n = to ? (size_t)(to - from) - (sizeof open - 1) : 0;
    char *system = xmalloc(n + 1);
    if (n) memcpy(system, from + sizeof open - 1, n);
    return system;
}

static int load_gguf_tokenizer(Tokenizer *t, const char *path) {
    GgufFile g;
    if (gguf_open(&g, path) != 0) return -1;
    GgufString model;
    const GgufKV *tokens = NULL;
    int rc = gguf_get_string(&g, "tokenizer.ggml.model", &model);
    if (rc == 0 && !(tokens = gguf_get_array(&g, "tokenizer.ggml.tokens"))) rc = -1;
    if (rc == 0 && (tokens->array_count < 1 || tokens->array_count > (1u << 24))) {
        fprintf(stderr, "error: %s: a vocabulary of %llu tokens is out of range\n", path,
                (unsigned long long)tokens->array_count);
        rc = -1;
    }
    if (rc == 0) {
        t->vocab_size = (int)tokens->array_count;
        int llama = gguf_string_equals(model, "llama");
        t->kind = llama ? TOKENIZER_SCORES : TOKENIZER_BYTE_BPE;
        if (llama) rc = load_gguf_scores(t, &g, tokens);
        else if (gguf_string_equals(model, "gpt2")) rc = load_gguf_bpe(t, &g, tokens);
        else {
            fprintf(stderr, "error: %s: tokenizer.ggml.model '%s' is not one this program reads (llama, gpt2)\n",
                    path, gguf_show(model).text);
            rc = -1;
        }
        t->add_space_prefix = llama;  /* SentencePiece's default */
        t->add_bos = llama;
    }
    if (rc == 0) rc = special_id(&g, "tokenizer.ggml.bos_token_id", 1, t->vocab_size, &t->bos_id) ||
                      special_id(&g, "tokenizer.ggml.eos_token_id", 2, t->vocab_size, &t->eos_id);
    if (rc == 0 && gguf_find_key(&g, "tokenizer.ggml.add_bos_token"))
        rc = gguf_get_bool(&g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    if (rc == 0 && t->kind == TOKENIZER_SCORES && gguf_find_key(&g, "tokenizer.ggml.add_space_prefix"))
        rc = gguf_get_bool(&g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
    GgufString chat;
    if (rc == 0 && gguf_find_key(&g, "tokenizer.chat_template") &&
        gguf_get_string(&g, "tokenizer.chat_template", &chat) == 0) {
        char *text = gguf_string_dup(chat);
        if (strstr(text, "<|im_start|>")) t->chat_system = chatml_system(text);
        free(text);
    }
    gguf_close(&g);
    return rc ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* The tokenizer's interface                                                */

const char *tokenizer_source(const char *model_path, const char *tok_path, int *refused) {
    int gguf = model_path && is_gguf_file(model_path);
    *refused = gguf && tok_path;
    if (*refused)
        fprintf(stderr, "error: -z %s: the model %s is a GGUF file that brings its own tokenizer; drop -z\n",
                tok_path, model_path);
    return *refused ? NULL : tok_path ? tok_path : gguf ? model_path : NULL;
}

int tokenizer_load(Tokenizer *t, const char *path, int vocab_size) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < 256; i++) t->byte_pieces[2 * i] = (unsigned char)i; /* 2*i+1 stays 0 */
    if (vocab_size < 0) {
        fprintf(stderr, "error: cannot load tokenizer %s with a negative vocab_size (%d)\n", path, vocab_size);
        return -1;
    }
    if (!is_gguf_file(path)) {
        t->kind = TOKENIZER_SCORES;
        return load_tokenizer_bin(t, path, vocab_size);
    }
    int rc = load_gguf_tokenizer(t, path);
    if (rc == 0 && vocab_size && t->vocab_size != vocab_size) {
        fprintf(stderr, "error: %s: its tokenizer has %d tokens but the model %d\n", path, t->vocab_size, vocab_size);
        rc = -1;
    }
    if (rc != 0) tokenizer_free(t);
    return rc;
}

void tokenizer_free(Tokenizer *t) {
    for (int i = 0; t->vocab && i < t->vocab_size; i++) free(t->vocab[i]);
    free(t->vocab); free(t->scores); free(t->sorted_ids);
    if (t->kind == TOKENIZER_BYTE_BPE) bpe_free(&t->bpe);
    free(t->chat_system); free(t->piece);
    memset(t, 0, sizeof *t);
}

int tokenizer_encode(const Tokenizer *t, const char *text, int bos, int eos, int *tokens, int max_tokens) {
    if (!text) { fprintf(stderr, "error: cannot encode a NULL string\n"); return -1; }
    if (t->kind == TOKENIZER_SCORES) return encode_scores(t, text, bos, eos, tokens, max_tokens);
    int first = bos != 0, room = max_tokens - first - (eos != 0);
    if (room < 0) {
        fprintf(stderr, "error: no room for the text's tokens in the model's context (%d)\n", max_tokens);
        return -1;
    }
    int n = bpe_encode(&t->bpe, text, strlen(text), tokens + first, room);
    if (n < 0) return -1;
    if (bos) tokens[0] = t->bos_id;
    if (eos) tokens[first + n] = t->eos_id;
    return first + n + (eos != 0);
}

const char *tokenizer_decode(const Tokenizer *t, int prev_token, int token) {
    if (token < 0 || token >= t->vocab_size) return NULL;
    if (t->kind == TOKENIZER_SCORES) return decode_scores(t, prev_token, token);
    size_t len;
    const char *bytes = bpe_piece_bytes(&t->bpe, token, &len);
    Tokenizer *mut = (Tokenizer *)t;  /* the decode buffer, grown as pieces need */
    if (len + 1 > mut->piece_cap) {
        free(mut->piece);
        mut->piece_cap = 2 * len + 16;
        mut->piece = xmalloc(mut->piece_cap);
    }
    memcpy(mut->piece, bytes, len);
    mut->piece[len] = '\0';
    return mut->piece;
}

/* ------------------------------------------------------------------------ */
/* The chat template (ChatML)                                               */

/* malloc'd concatenation of the strings parts (n) */
static char *join(const char *const *parts, int n) {
    size_t len = 0;
    for (int i = 0; i < n; i++) len += strlen(parts[i]);
    char *out = xmalloc(len + 1), *at = out;
    for (int i = 0; i < n; i++) { size_t k = strlen(parts[i]); memcpy(at, parts[i], k); at += k; }
    return out;
}

char *chat_document(const Tokenizer *t, const char *document) {
    const char *sys = t->chat_system && t->chat_system[0] ? t->chat_system : NULL;
    const char *parts[] = {sys ? "<|im_start|>system\n" : "", sys ? sys : "", sys ? "<|im_end|>\n" : "",
                           "<|im_start|>user\n", document, document[0] ? "\n\n" : ""};
    return join(parts, 6);
}

char *chat_prompt(const Tokenizer *t, const char *question, int after_document) {
    char *head = after_document ? NULL : chat_document(t, "");
    const char *parts[] = {head ? head : "", question, "<|im_end|>\n<|im_start|>assistant\n"};
    char *out = join(parts, 3);
    free(head);
    return out;
}

/* text's ids (at most max), BOS first when asked and the tokenizer adds one */
static int *encode_text(const Tokenizer *t, const char *text, int bos, int max, int *n) {
    size_t len = strlen(text);
    int room = len + 3 < (size_t)max ? (int)len + 3 : max;  /* at most a token per byte, BOS and a space */
    int *ids = xmalloc((size_t)(room > 0 ? room : 1) * sizeof(int));
    *n = tokenizer_encode(t, text, bos && t->add_bos, 0, ids, room);
    if (*n < 0) { free(ids); return NULL; }
    return ids;
}

int *encode_document(const Tokenizer *t, const char *text, int chat, int later, int max, int *n) {
    const char *parts[] = {text, text[0] ? "\n\n" : ""};
    char *framed = !chat ? NULL : later ? join(parts, 2) : chat_document(t, text);
    int *ids = encode_text(t, framed ? framed : text, !later, max, n);
    free(framed);
    return ids;
}

int *encode_prompt(const Tokenizer *t, const char *text, int chat, int after_document, int max, int *n) {
    char *framed = chat ? chat_prompt(t, text, after_document) : NULL;
    int *ids = encode_text(t, framed ? framed : text, !after_document, max, n);
    free(framed);
    return ids;
}

/* The newline's id: the piece "\n" (or its byte "<0x0A>") of a scores
 * vocabulary, the one token a byte-level vocabulary encodes it as; -1. */
static int newline_token(const Tokenizer *t) {
    if (t->kind == TOKENIZER_SCORES) {
        for (int i = 0; i < t->vocab_size; i++)
            if (!strcmp(t->vocab[i], "\n") || !strcmp(t->vocab[i], "<0x0A>")) return i;
        return -1;
    }
    int ids[4];
    return tokenizer_encode(t, "\n", 0, 0, ids, 4) == 1 ? ids[0] : -1;
}

/* The one id a control token's text encodes as, or fallback. The texts
 * are short and a byte is at most one token, so the ids always fit. */
static int control_token(const Tokenizer *t, const char *text, int fallback) {
    int ids[64];
    return strlen(text) < 64 && tokenizer_encode(t, text, 0, 0, ids, 64) == 1 ? ids[0] : fallback;
}

void answer_conventions(const Tokenizer *t, int chat, PromptSet *p) {
    int n = 1, *prefix = t ? encode_document(t, "", chat, 0, MAX_NODOC_PREFIX, &n) : NULL;
    free(p->nodoc_prefix);
    p->nodoc_prefix = prefix ? prefix : xmalloc(sizeof(int));
    p->n_nodoc_prefix = prefix ? n : 1;
    if (!prefix) p->nodoc_prefix[0] = 1;  /* llama2.c's BOS */
    if (t && chat) {  /* ChatML: the end of the turn, or the end of the text */
        p->answer_stop[0] = control_token(t, "<|im_end|>", t->eos_id);
        p->answer_stop[1] = control_token(t, "<|endoftext|>", t->eos_id);
    } else {          /* a text model's line (the single-newline token), or a new sequence */
        p->answer_stop[0] = t ? newline_token(t) : -1;
        p->answer_stop[1] = t ? t->bos_id : 1;
    }
}
