/* mutants.c - corrupted copies of a file, for tests/test_fuzz.sh.
 *
 *   tests/mutants gguf|bytes FILE SEED COUNT OUTDIR
 *
 * Writes COUNT copies of FILE, each changed in one to three places (a bit
 * flipped, a byte replaced, a 32- or 64-bit field set to a value that
 * breaks sizes and counts, the file cut short or made longer), as
 * OUTDIR/mutant-N plus a suffix of FILE's (.gguf, .bin, .nectar). Prints
 * one line a copy: its path and where it was changed.
 *
 * With `gguf` each byte of FILE is classed first (src/gguf.c reads it):
 * "structure" is the header, each key's length and type, each array's
 * element type and count, the tensor infos and the padding after them;
 * "content" is each key's name and value and the tensor data. A copy
 * changed anywhere in the structure is "structure", else "content". The
 * structure says how to read the file, so a change there must be refused
 * or change nothing; content is what the file says (GGUF has no checksum),
 * a key renamed being a file without that key. With `bytes` every copy is
 * "bytes". Same SEED, same copies. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/gguf.h"

enum { STRUCTURE, CONTENT };

static uint64_t rng_state;
static uint64_t next_random(void) {          /* xorshift64* */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}
static size_t below(size_t n) { return (size_t)(next_random() % n); }

static uint8_t *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    long n = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    uint8_t *bytes = n > 0 ? malloc((size_t)n) : NULL;
    if (!bytes || fseek(f, 0, SEEK_SET) || fread(bytes, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "error: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    *size = (size_t)n;
    return bytes;
}

static void mark(uint8_t *cls, size_t from, size_t to, uint8_t c) { memset(cls + from, c, to - from); }

/* cls[i]: STRUCTURE or CONTENT for byte i of the GGUF file (see above). */
static void class_gguf(const char *path, const uint8_t *bytes, size_t size, uint8_t *cls) {
    GgufFile f;
    if (gguf_open_memory(&f, bytes, size, path) != 0) exit(1);
    mark(cls, 0, f.data_start, STRUCTURE);
    mark(cls, f.data_start, size, CONTENT);
    size_t infos = f.n_tensors ? (size_t)(f.tensors[0].name.ptr - (const char *)bytes) - 8 : f.data_start;
    for (size_t i = 0; i < f.n_kv; i++) {
        const GgufKV *kv = &f.kv[i];
        size_t name = (size_t)(kv->key.ptr - (const char *)bytes), value = (size_t)(kv->value - bytes);
        size_t end = i + 1 < f.n_kv ? (size_t)(f.kv[i + 1].key.ptr - (const char *)bytes) - 8 : infos;
        mark(cls, name, name + kv->key.len, CONTENT);   /* then the type (and an array's type and count) */
        mark(cls, value, end, CONTENT);
    }
    gguf_close(&f);
}

/* The class of byte pos: cls[pos] within the original's n_cls bytes, and
 * STRUCTURE past them (bytes an extension added) or without classes. */
static int class_at(const uint8_t *cls, size_t n_cls, size_t pos) {
    return cls && pos < n_cls ? cls[pos] : STRUCTURE;
}

/* One change at a position of the wanted class; returns the class it hit
 * (a cut or an extension: STRUCTURE). *size may change; b has room for 64
 * bytes more. */
static int mutate_once(uint8_t *b, size_t *size, const uint8_t *cls, size_t n_cls, int want) {
    static const uint64_t edges[] = {0, 1, 0x7f, 0x80, 0xff, 0x7fffffff, 0x80000000, 0xffffffff,
                                     0x100000000ull, 0x7fffffffffffffffull, 0xffffffffffffffffull};
    size_t pos = below(*size);
    for (int tries = 0; cls && class_at(cls, n_cls, pos) != want && tries < 100000; tries++) pos = below(*size);
    int op = (int)below(10), hit = class_at(cls, n_cls, pos);
    if (op < 3) b[pos] ^= (uint8_t)(1u << below(8));                     /* a bit flipped */
    else if (op < 6) b[pos] ^= (uint8_t)(1 + below(255));                /* a byte replaced */
    else if (op < 8) {                                                    /* a field set to an edge */
        uint64_t v = edges[below(sizeof edges / sizeof edges[0])];
        size_t width = op == 6 ? 4 : 8;
        for (size_t i = 0; i < width && pos + i < *size; i++) {
            b[pos + i] = (uint8_t)(v >> 8 * i);
            if (class_at(cls, n_cls, pos + i) == STRUCTURE) hit = STRUCTURE;
        }
    } else if (op == 8) { *size = pos; hit = STRUCTURE; }                /* cut short */
    else {                                                               /* made longer */
        size_t extra = 1 + below(64);
        for (size_t i = 0; i < extra; i++) b[*size + i] = (uint8_t)next_random();
        *size += extra;
        hit = STRUCTURE;
    }
    return hit;
}

int main(int argc, char **argv) {
    if (argc != 6 || (strcmp(argv[1], "gguf") && strcmp(argv[1], "bytes"))) {
        fprintf(stderr, "usage: tests/mutants gguf|bytes FILE SEED COUNT OUTDIR\n");
        return 1;
    }
    size_t size, count = strtoull(argv[4], NULL, 10);
    uint8_t *original = read_all(argv[2], &size), *cls = NULL;
    if (!strcmp(argv[1], "gguf")) { cls = malloc(size); class_gguf(argv[2], original, size, cls); }
    const char *dot = strrchr(argv[2], '.'), *suffix = dot && !strchr(dot, '/') ? dot : "";
    rng_state = strtoull(argv[3], NULL, 10) * 0x9E3779B97F4A7C15ull + 1;
    uint8_t *b = malloc(size + 3 * 64);
    for (size_t n = 0; n < count; n++) {
        size_t len;
        int where;
        do {   /* three changes at most, of the chosen class; a copy equal to FILE is drawn again */
            memcpy(b, original, size);
            len = size;
            int want = below(3) ? STRUCTURE : CONTENT, changes = 1 + (int)below(3);
            where = CONTENT;
            for (int k = 0; k < changes && len > 1; k++)
                if (mutate_once(b, &len, cls, size, want) == STRUCTURE) where = STRUCTURE;
        } while (len == size && !memcmp(b, original, size));
        char path[4096];
        snprintf(path, sizeof path, "%s/mutant-%zu%s", argv[5], n, suffix);
        FILE *out = fopen(path, "wb");
        if (!out || fwrite(b, 1, len, out) != len || fclose(out)) { fprintf(stderr, "error: cannot write %s\n", path); return 1; }
        printf("%s %s\n", path, !cls ? "bytes" : where == STRUCTURE ? "structure" : "content");
    }
    free(b); free(cls); free(original);
    return 0;
}
