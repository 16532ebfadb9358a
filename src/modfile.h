/* modfile.h - the pieces of the module file (modfile.c) that the
 * self-study file (formats.c) shares: a prompt table and its answers'
 * conventions, and the checksum. moduleset_save and moduleset_load
 * themselves are the core's, in nectar.h.
 */
#ifndef NECTAR_MODFILE_H
#define NECTAR_MODFILE_H

#include "../nectar.h"

/* The four parts of p's prompt table (offsets (n + 1), tokens, split flags
 * (n), question lengths (n), all int32) into parts and sizes; flags
 * (n_prompts + 1) holds the split flags as int32. */
void prompt_table_parts(const PromptSet *p, int32_t *flags, const void **parts, size_t *sizes);
/* A prompt table of n prompts at *at (*at moves past it); the offsets must
 * rise from 0 to the token count, each question fit its prompt. 0, or -1. */
int  read_prompt_table(PromptSet *p, int n, int64_t n_tokens, const unsigned char **at);
/* The answers' conventions: the no-document prefix (n_prefix ints at *at,
 * *at moves past them), the answer cap and stop tokens. */
void read_conventions(PromptSet *p, int n_prefix, int cap, const int32_t stop[2], const unsigned char **at);
/* 1 when a file's last 8 bytes are the FNV-1a hash of the bytes before them. */
int  checksum_matches(const unsigned char *buf, size_t size);

#endif
