/* gguf_walk.h - walk_gguf calls every function of the GGUF reader on every
 * key and tensor of a file it opened, the way a loader would and beyond
 * (every getter on every key, whatever its type). Used on mutated files by
 * the fuzz loop of tests/test_gguf.c and by tests/fuzz_gguf.c: each call
 * must return 0 or -1 and never crash or read out of bounds (the sanitizer
 * builds check the latter). */
#ifndef GGUF_WALK_H
#define GGUF_WALK_H

#include <stdlib.h>
#include <string.h>

#include "../src/gguf.h"

/* Every element getter on elements 0..15 and the last one (and one past it). */
static void walk_array(const GgufKV *kv) {
    int64_t i64;
    double f64;
    GgufString s;
    for (uint64_t i = 0; i < kv->array_count + 1; i++) {
        if (i == 16 && kv->array_count > 17) i = kv->array_count - 1;
        gguf_array_int(kv, i, &i64);
        gguf_array_float(kv, i, &f64);
        if (gguf_array_string(kv, i, &s) == 0) gguf_string_equals(s, "x");
    }
}

static void walk_key(const GgufFile *f, const GgufKV *kv, char *key) {
    uint64_t u64;
    int64_t i64;
    double f64;
    int b;
    GgufString s;
    gguf_get_uint(f, key, &u64);
    gguf_get_int(f, key, &i64);
    gguf_get_float(f, key, &f64);
    gguf_get_bool(f, key, &b);
    if (gguf_get_string(f, key, &s) == 0) free(gguf_string_dup(s));
    if (gguf_get_array(f, key)) walk_array(kv);
}

/* Dequantizes a tensor (and refuses a wrong buffer size); returns the
 * number of broken invariants: its data must lie inside the file. */
static int walk_tensor(const GgufFile *f, const GgufTensor *t, char *name) {
    int broken = t->data < f->bytes || t->n_bytes > f->size ||
                 (size_t)(t->data - f->bytes) > f->size - t->n_bytes;
    broken += gguf_find_tensor(f, name) != t;
    if (broken || !gguf_can_dequantize(t->type)) return broken;
    float *out = malloc((size_t)t->n_elements * sizeof(float)); /* <= 2 x n_bytes values */
    if (!out) return 1;
    broken += gguf_dequantize(t, out, (size_t)t->n_elements) != 0;
    broken += gguf_dequantize(t, out, (size_t)t->n_elements - 1) != -1;
    free(out);
    return broken;
}

/* Keys and names with a NUL byte cannot be looked up by a C string. */
static char *c_string(GgufString s) { return memchr(s.ptr, 0, s.len) ? NULL : gguf_string_dup(s); }

static int walk_gguf(const GgufFile *f) {
    int broken = 0;
    for (size_t i = 0; i < f->n_kv; i++) {
        char *key = c_string(f->kv[i].key);
        if (!key) continue;
        broken += gguf_find_key(f, key) != &f->kv[i];
        walk_key(f, &f->kv[i], key);
        free(key);
    }
    for (size_t i = 0; i < f->n_tensors; i++) {
        char *name = c_string(f->tensors[i].name);
        if (name) broken += walk_tensor(f, &f->tensors[i], name);
        free(name);
    }
    GgufLlamaConfig config;
    gguf_llama_config(f, &config);
    return broken;
}

#endif
