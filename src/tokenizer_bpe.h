/* tokenizer_bpe.h - byte-level BPE (the GPT-2 scheme, as SmolLM2 uses it):
 * the tokenizer a GGUF file describes with tokenizer.ggml.model "gpt2", its
 * pieces, token types and merges. Encoding gives the ids Hugging Face
 * `tokenizers` gives for the same vocabulary, merges and pre-tokenizer.
 * Depends only on libc. Errors print one sentence on stderr and return -1
 * (or NULL).
 */
#ifndef TOKENIZER_BPE_H
#define TOKENIZER_BPE_H

#include <stddef.h>
#include <stdint.h>

/* GGUF tokenizer.ggml.token_type values */
enum { BPE_TOKEN_NORMAL = 1, BPE_TOKEN_UNKNOWN = 2, BPE_TOKEN_CONTROL = 3,
       BPE_TOKEN_USER_DEFINED = 4, BPE_TOKEN_UNUSED = 5, BPE_TOKEN_BYTE = 6 };

/* Pre-tokenizers (tokenizer.ggml.pre): how text is cut into words first */
enum { BPE_PRE_GPT2,     /* "gpt2": the GPT-2 split pattern */
       BPE_PRE_SMOLLM }; /* "smollm": every numeric character alone, then the pattern */

typedef struct {
    int32_t left, right;  /* the pair of ids; left -1: the slot is empty */
    int32_t rank;         /* the merge's index in the list: lower merges first */
    int32_t merged;       /* the id of left's piece followed by right's */
} BpeMerge;

typedef struct {
    int n_vocab;             /* V */
    int pre;                 /* BPE_PRE_* */
    unsigned char *bytes;    /* the bytes each token stands for, concatenated */
    size_t *bytes_offset;    /* (V + 1): token i is bytes[bytes_offset[i] .. bytes_offset[i+1]) */
    int byte_token[256];     /* the id of each byte's one-character piece; -1: none */
    BpeMerge *merges;        /* (merge_mask + 1) open-addressing table keyed by (left, right) */
    uint32_t merge_mask;     /* table size - 1 (a power of two minus one) */
    int n_special;           /* control and user-defined tokens, found in text as they are */
    int *special_ids;        /* (n_special) grouped by first byte, longest first in a group */
    int special_start[257];  /* special_ids[special_start[b] .. special_start[b+1]) start with byte b */
} BpeTokenizer;

/* Builds the tokenizer from GGUF metadata. pieces: n_vocab strings (pointer +
 * length, not NUL-terminated), byte-level encoded ("Ġthe"); types: their
 * BPE_TOKEN_* values, or NULL for all normal; merges: n_merges strings "A B"
 * (pointer + length), rank = index; pre: the pre-tokenizer's name, "gpt2" or
 * "smollm". Refused with a sentence: an unknown pre-tokenizer, an empty
 * vocabulary or merge list, a repeated piece, a type outside 1..6, a merge
 * without exactly one space or whose parts or joined piece are not in the
 * vocabulary; each sentence names `source`, the file the vocabulary came
 * from. */
int  bpe_init(BpeTokenizer *t, const char *source, int n_vocab, const char *const *pieces, const size_t *piece_len,
              const int32_t *types, int n_merges, const char *const *merges, const size_t *merge_len,
              const char *pre);
void bpe_free(BpeTokenizer *t);
/* UTF-8 text (len bytes) -> ids; returns the count, at most max_ids. Control
 * and user-defined tokens written in the text encode as their one id. No BOS
 * is added. -1 with a sentence: invalid UTF-8, a NUL byte, a byte the
 * vocabulary has no piece for (tokenizers would drop it), more than max_ids
 * ids. */
int  bpe_encode(const BpeTokenizer *t, const char *text, size_t len, int *ids, int max_ids);
/* 1 when the n bytes at s are valid UTF-8 (no overlong form, surrogate, code
 * point above U+10FFFF or cut sequence). */
int  utf8_valid(const unsigned char *s, size_t n);
/* The bytes token id stands for (*len of them; not NUL-terminated): a
 * byte-level piece mapped back to raw bytes, a control token as its text.
 * NULL with a sentence for an id outside [0, V). */
const char *bpe_piece_bytes(const BpeTokenizer *t, int id, size_t *len);

#endif
