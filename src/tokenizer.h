/* tokenizer.h - text to token ids and back (tokenizer.c: llama2.c's
 * tokenizer.bin and a GGUF file's vocabulary; tokenizer_bpe.c: byte-level
 * BPE), and the chat template.
 */
#ifndef NECTAR_TOKENIZER_H
#define NECTAR_TOKENIZER_H

#include "../nectar.h"
#include "tokenizer_bpe.h"

typedef enum {
    TOKENIZER_SCORES = 1,   /* BPE by merge score: llama2.c's tokenizer.bin, a GGUF "llama" vocabulary */
    TOKENIZER_BYTE_BPE = 2, /* byte-level BPE by merge rank: a GGUF "gpt2" vocabulary (SmolLM2) */
} TokenizerKind;

typedef struct {
    TokenizerKind kind;
    int vocab_size;
    int bos_id, eos_id;     /* BOS, and EOS: the end of a chat model's turn */
    int add_bos;            /* 1: a text that starts a sequence gets BOS */
    char *chat_system;      /* ChatML's default system message ("" for none); NULL: no ChatML template */
    /* TOKENIZER_SCORES */
    int max_token_length;
    int add_space_prefix;           /* SentencePiece's space before the text */
    char **vocab;                   /* (V) NUL-terminated pieces */
    float *scores;                  /* (V) merge scores */
    int *sorted_ids;                /* (V) ids sorted by piece, for lookup */
    unsigned char byte_pieces[512]; /* each byte as a 1-char string */
    /* TOKENIZER_BYTE_BPE */
    BpeTokenizer bpe;
    char *piece;                    /* (piece_cap) tokenizer_decode's buffer */
    size_t piece_cap;
} Tokenizer;

/* The tokenizer to load: -z's tokenizer.bin (NULL: none given), or a GGUF
 * model's own; NULL without either, or after a sentence (in *refused) when
 * -z is given with a GGUF model, whose tokenizer is part of it. */
const char *tokenizer_source(const char *model_path, const char *tok_path, int *refused);
/* A tokenizer.bin, or the tokenizer of a GGUF file (told apart by content);
 * vocab_size 0: every entry in the file, else the model's (checked). */
int  tokenizer_load(Tokenizer *t, const char *path, int vocab_size);
void tokenizer_free(Tokenizer *t);
/* Text to at most max_tokens ids, with BOS first and EOS last when asked.
 * Scores: BPE as llama2.c encodes; byte-level: as Hugging Face tokenizers
 * encodes, control tokens written in the text as their one id. Returns the
 * count, or -1 with a sentence (too many tokens, a text the vocabulary
 * cannot spell). */
int  tokenizer_encode(const Tokenizer *t, const char *text, int bos, int eos,
                      int *tokens, int max_tokens);
/* The text to print for `token` after `prev_token` (byte-level: its bytes);
 * NULL if out of range. */
const char *tokenizer_decode(const Tokenizer *t, int prev_token, int token);

/* The chat convention (ChatML), one for infer, train and evaluation: the
 * document goes into the user's turn, before the question:
 *   chat_document: "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{document}\n\n"
 *   chat_prompt:   "{question}<|im_end|>\n<|im_start|>assistant\n"
 * (no system turn when the template has no default system message). With no
 * document, chat_prompt(after_document 0) carries the turn's start itself.
 * Both malloc'd. */
char *chat_document(const Tokenizer *t, const char *document);
char *chat_prompt(const Tokenizer *t, const char *question, int after_document);
/* The ids of a document's text (framed as a chat turn when chat), BOS first
 * where the tokenizer adds one; of a prompt, BOS first only when it starts
 * the sequence (no document before it). At most max ids; NULL after a
 * sentence; malloc'd. A later document of a composition (later 1: it
 * follows other documents in the same sequence) continues their text: no
 * BOS and, with chat, no turn opening ("{document}\n\n", the user's turn
 * going on). */
int *encode_document(const Tokenizer *t, const char *text, int chat, int later, int max, int *n);
int *encode_prompt(const Tokenizer *t, const char *text, int chat, int after_document, int max, int *n);
/* A prompt set's conventions (PromptSet): its answers end with a chat
 * model's `<|im_end|>` or `<|endoftext|>` (EOS where the vocabulary has
 * neither as one token), or a text model's newline (its single-newline
 * token: a token holding a newline among other text does not stop) or BOS;
 * without the
 * document a prompt follows the document's own opening (BOS, or the chat
 * turn's start: encode_document of ""). No tokenizer (token ids and a
 * llama2.c checkpoint): BOS = 1 opens a sequence and ends an answer. */
void answer_conventions(const Tokenizer *t, int chat, PromptSet *p);

#endif
