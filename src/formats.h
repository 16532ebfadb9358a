/* formats.h - the files the programs read and write (formats.c): models
 * (llama2.c checkpoints and GGUF files), self-study files, text and
 * token-id files. Module files are the core's (modfile.c, nectar.h).
 */
#ifndef NECTAR_FORMATS_H
#define NECTAR_FORMATS_H

#include <stdio.h>

#include "../nectar.h"
#include "util.h"

/* A model file, told apart by its first bytes: a GGUF file of the Llama
 * architecture (its weights dequantized to fp32, RoPE base and RMSNorm
 * epsilon from its metadata), or a llama2.c "v0" checkpoint (seven int32
 * header fields: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
 * seq_len, a negative vocab_size meaning an unshared classifier; then the
 * fp32 tensors). */
int  model_load(Model *m, const char *path);
/* 1 when the file starts with GGUF's magic number. */
int  is_gguf_file(const char *path);
int  model_save(const Model *m, const char *path);

/* Self-study files (train --save-self-study, --self-study): the prompts of
 * a self-study and its evaluation-only tasks, which share their answers'
 * conventions, for the model and document of the fingerprints. load
 * refuses a file made with another model or for another document (0 skips
 * that check) with a sentence. */
int  selfstudy_save(const char *path, const PromptSet *prompts, const PromptSet *tasks, uint64_t model_fp,
                    uint64_t doc_fp);
int  selfstudy_load(const char *path, uint64_t model_fp, uint64_t doc_fp, PromptSet *prompts, PromptSet *tasks);

/* Whitespace-separated integers; returns the count and a malloc'd array. */
int  read_token_ids(const char *path, int **ids);
/* A whole text file, NUL-terminated, malloc'd; NULL after a sentence (also
 * for a file with a NUL byte in it). */
char *read_text_file(const char *path);
/* Whether `path` can be a program's output, found before any work: not
 * empty, not a directory, in a folder that exists and takes a new file (the
 * temporary one of write_file_atomic), not an existing file that cannot be
 * written (read-only or immutable: it would be replaced all the same), and
 * none of the n inputs (NULL entries are skipped): the same file (device
 * and inode) or the same path once links are resolved. 0, or -1 after a
 * sentence naming `option`. */
int  check_output(const char *option, const char *path, const char *const *inputs, int n);

#endif
