/* util.h - small utilities of the core (util.c): checked allocation,
 * time, copying strided rows, hashing, random numbers, whole files.
 */
#ifndef NECTAR_UTIL_H
#define NECTAR_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {  /* the CUDA path and its tests are C++ */
#endif

/* Checked allocation: zeroed memory (calloc), or a sentence naming the file
 * and line and exit(1). Code relies on the zeroing. */
void *check_malloc(size_t n, const char *file, int line);
#define xmalloc(n) check_malloc((n), __FILE__, __LINE__)
double now_seconds(void);
/* dst row r (stride ld_dst) = src row r (stride ld_src), `width` floats each:
 * gathers the query heads of a KV group into one batch, and back. */
void copy_rows(float *dst, int ld_dst, const float *src, int ld_src, int rows, int width);
uint64_t fnv1a(uint64_t h, const void *data, size_t n);
#define FNV_OFFSET 1469598103934665603ULL
uint32_t rng_u32(uint64_t *state);
float    rng_uniform(uint64_t *state);   /* [0, 1) */
float    rng_normal(uint64_t *state);
int      argmax(const float *x, int n);

/* Writes n_parts buffers to path atomically: a temporary file, then rename. */
int  write_file_atomic(const char *path, const void *const *parts, const size_t *sizes, int n_parts);
/* path opened for reading ("rb"), if it is a regular file: NULL after a
 * sentence naming `what` ("tokenizer file", or "") when it cannot be opened or
 * is a directory or another kind of file. */
FILE *open_regular_file(const char *path, const char *what);
/* A whole file, malloc'd with a NUL after its last byte; NULL after a sentence. */
unsigned char *read_file(const char *path, size_t *size);
/* Index of the first NaN or infinity in x (n), or n if every value is finite. */
size_t first_nonfinite(const float *x, size_t n);

#ifdef __cplusplus
}
#endif

#endif
