/* util.c - small utilities of the core: checked allocation, time, copying
 * strided rows, hashing (FNV-1a), random numbers (xorshift*, as llama2.c),
 * whole files read and written atomically.
 */
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

/* Blocks of at least HUGE_BLOCK bytes (the weights, KV caches) are 2 MB
 * aligned and asked for transparent huge pages, where the system has them:
 * a decode step streams through them, and the hardware prefetcher stops at
 * every 4 KB page boundary (one stream of a matrix-vector product read 20
 * GB/s here with 4 KB pages, 28 with 2 MB pages). */
enum { HUGE_PAGE = 1 << 21, HUGE_BLOCK = 1 << 25 };

#ifdef MADV_HUGEPAGE
static void advise_huge_pages(void *p, size_t n) { madvise(p, n, MADV_HUGEPAGE); }
#else
static void advise_huge_pages(void *p, size_t n) { (void)p; (void)n; }
#endif

void *check_malloc(size_t n, const char *file, int line) {
    void *p;
    if (n >= HUGE_BLOCK && n <= SIZE_MAX - HUGE_PAGE) {
        size_t rounded = (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
        p = aligned_alloc(HUGE_PAGE, rounded);
        if (p) {
            advise_huge_pages(p, rounded);  /* before the first touch, which maps the pages */
            memset(p, 0, rounded);
        }
    } else {
        p = calloc(n ? n : 1, 1);
    }
    if (!p) {
        fprintf(stderr, "error: out of memory allocating %zu bytes at %s:%d\n", n, file, line);
        exit(1);
    }
    return p;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void copy_rows(float *dst, int ld_dst, const float *src, int ld_src, int rows, int width) {
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * ld_dst, src + (size_t)r * ld_src, (size_t)width * sizeof(float));
}

uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ULL; }
    return h;
}

uint32_t rng_u32(uint64_t *state) {  /* xorshift*, as llama2.c */
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1DULL) >> 32);
}

float rng_uniform(uint64_t *state) { return (rng_u32(state) >> 8) / 16777216.0f; }

float rng_normal(uint64_t *state) {  /* Box-Muller */
    float u1 = rng_uniform(state), u2 = rng_uniform(state);
    return sqrtf(-2.0f * logf(1.0f - u1)) * cosf(6.2831853f * u2);
}

int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

/* ------------------------------------------------------------------------ */
/* Files                                                                    */

int write_file_atomic(const char *path, const void *const *parts, const size_t *sizes, int n_parts) {
    size_t len = strlen(path);
    char *tmp = xmalloc(len + 5);
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fprintf(stderr, "error: cannot write %s: %s\n", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    int ok = 1;
    for (int i = 0; i < n_parts && ok; i++)
        ok = sizes[i] == 0 || fwrite(parts[i], 1, sizes[i], f) == sizes[i];
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "error: writing %s failed: %s\n", path, strerror(errno));
        remove(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

FILE *open_regular_file(const char *path, const char *what) {
    FILE *f = fopen(path, "rb");
    const char *space = what[0] ? " " : "";
    if (!f) {
        fprintf(stderr, "error: cannot open %s%s%s: %s\n", what, space, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "error: %s%s%s is %s, not a file\n", what, space, path,
                S_ISDIR(st.st_mode) ? "a directory" : "not a regular file");
        fclose(f);
        return NULL;
    }
    return f;
}

unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = open_regular_file(path, "");
    if (!f) return NULL;
    struct stat st;
    fstat(fileno(f), &st);
    long end = (long)st.st_size;
    unsigned char *buf = xmalloc((size_t)end + 1);
    if (fread(buf, 1, (size_t)end, f) != (size_t)end) {
        fprintf(stderr, "error: cannot read %s\n", path);
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[end] = 0;
    *size = (size_t)end;
    return buf;
}

size_t first_nonfinite(const float *x, size_t n) {
    size_t i = 0;
    while (i < n && isfinite(x[i])) i++;
    return i;
}
