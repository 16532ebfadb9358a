/* test_gguf.c - the GGUF reader (gguf.c) against gguf-py, on the fixtures
 * that tests/make_gguf_fixtures.py wrote into tests/data: every tensor's
 * dequantization against gguf-py's; the metadata API on values of every
 * type, wrong types included; the Llama hyperparameters and tensor checks;
 * every kind of bad input, made here by editing a copy of a fixture in
 * memory (each must be refused with one "error: " sentence); every
 * truncation of a fixture; and a seeded mutation fuzz loop whose mutants
 * must be refused with one sentence or read without a crash (build it with
 * -fsanitize=address,undefined to catch reads out of bounds too).
 *
 *   tests/test_gguf                       the tests above (run from the repository root)
 *   tests/test_gguf --model FILE.gguf [NAME=REF.f32 ...]
 *       a real model: its hyperparameters, the dequantization of every
 *       tensor (timed), and each named tensor against the raw float32 file
 *       tests/gguf_reference.py wrote for it.
 *
 * Every check prints what it compared; the last line is "N passed, M failed"
 * and the exit status is non-zero on any failure.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/gguf.h"
#include "gguf_walk.h"

#define TYPES_FIXTURE "tests/data/gguf_types.gguf"
#define TYPES_EXPECT  "tests/data/gguf_types.expect"
#define LLAMA_FIXTURE "tests/data/gguf_llama.gguf"
#define LLAMA_EXPECT  "tests/data/gguf_llama.expect"
#define MISTRAL_FIXTURE "tests/data/gguf_mistral.gguf"
#define MISTRAL_EXPECT  "tests/data/gguf_mistral.expect"

static int n_passed, n_failed;

static void check(const char *what, int ok) {
    printf("  %-64s %s\n", what, ok ? "ok" : "FAIL");
    if (ok) n_passed++; else n_failed++;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "error: out of memory (%zu bytes)\n", n); exit(1); }
    return p;
}

static uint8_t *read_whole(const char *path, size_t *size) {
    FILE *in = fopen(path, "rb");
    if (!in) { fprintf(stderr, "error: cannot open %s (run from the repository root)\n", path); exit(1); }
    fseek(in, 0, SEEK_END);
    *size = (size_t)ftell(in);
    rewind(in);
    uint8_t *bytes = xmalloc(*size);
    if (fread(bytes, 1, *size, in) != *size) { fprintf(stderr, "error: cannot read %s\n", path); exit(1); }
    fclose(in);
    return bytes;
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* The reader's error sentences                                             */

static FILE *sink;            /* the reader's error stream during the tests (a temp file) */
static char said[2048];       /* what it said since listen() */

static void listen(void) { rewind(sink); }

static const char *heard(void) {
    long n = ftell(sink);
    rewind(sink);
    size_t got = fread(said, 1, n < (long)sizeof said - 1 ? (size_t)n : sizeof said - 1, sink);
    said[got] = '\0';
    return said;
}

/* One line that starts "error: ", and nothing else. */
static int one_sentence(const char *text) {
    size_t n = strlen(text);
    return n > 8 && strncmp(text, "error: ", 7) == 0 && strchr(text, '\n') == text + n - 1;
}

/* status must be -1 and the reader must have said one sentence holding
 * word1 and word2 (either may be NULL). */
static void check_refusal(const char *what, int status, const char *word1, const char *word2) {
    const char *text = heard();
    int ok = status == -1 && one_sentence(text) && (!word1 || strstr(text, word1)) &&
             (!word2 || strstr(text, word2));
    check(what, ok);
    if (!ok) printf("    status %d, said: %s", status, text[0] ? text : "(nothing)\n");
}

#define CHECK_REFUSED(what, call, word1, word2) \
    do { listen(); int status_ = (call); check_refusal(what, status_, word1, word2); } while (0)

/* ------------------------------------------------------------------------ */
/* Fixtures and edited copies of them                                       */

typedef struct {
    uint8_t *bytes;           /* (size) the file */
    size_t size;
    GgufFile f;               /* it, opened: where its fields lie */
} Fixture;

static void load_fixture(Fixture *fx, const char *path) {
    fx->bytes = read_whole(path, &fx->size);
    if (gguf_open_memory(&fx->f, fx->bytes, fx->size, path)) exit(1);
}

static void free_fixture(Fixture *fx) {
    gguf_close(&fx->f);
    free(fx->bytes);
}

/* Opens a copy of bytes[0..size) held in exactly size bytes, so the
 * sanitizers see any read past its end; *copy is freed after gguf_close. */
static int open_copy(GgufFile *f, const uint8_t *bytes, size_t size, uint8_t **copy) {
    *copy = xmalloc(size);
    memcpy(*copy, bytes, size);
    listen();
    return gguf_open_memory(f, *copy, size, "mutant.gguf");
}

/* The fixture with n bytes at pos replaced by `with`, opened. */
static int open_edit(GgufFile *f, const Fixture *fx, size_t pos, const void *with, size_t n,
                     uint8_t **copy) {
    uint8_t *edited = xmalloc(fx->size);
    memcpy(edited, fx->bytes, fx->size);
    memcpy(edited + pos, with, n);
    int status = open_copy(f, edited, fx->size, copy);
    free(edited);
    return status;
}

/* The fixture with that edit must be refused by gguf_open_memory with one
 * sentence holding `word`. */
static void check_edit_refused(const char *what, const Fixture *fx, size_t pos, const void *with,
                               size_t n, const char *word) {
    GgufFile f;
    uint8_t *copy;
    int status = open_edit(&f, fx, pos, with, n, &copy);
    check_refusal(what, status, word, NULL);
    if (status == 0) gguf_close(&f);
    free(copy);
}

static const uint8_t *u32_bytes(uint8_t out[4], uint32_t v) {
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(v >> 8 * i);
    return out;
}
static const uint8_t *u64_bytes(uint8_t out[8], uint64_t v) {
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(v >> 8 * i);
    return out;
}

static size_t at(const Fixture *fx, const void *p) { return (size_t)((const uint8_t *)p - fx->bytes); }

/* Where a tensor info's fields lie in the fixture. */
typedef struct { size_t n_dims, dims, type, offset; } InfoFields;

static InfoFields info_fields(const Fixture *fx, const char *name) {
    const GgufTensor *t = gguf_find_tensor(&fx->f, name);
    if (!t) { fprintf(stderr, "error: the fixture has no tensor %s\n", name); exit(1); }
    InfoFields p;
    p.n_dims = at(fx, t->name.ptr + t->name.len);
    p.dims = p.n_dims + 4;
    p.type = p.dims + 8 * t->n_dims;
    p.offset = p.type + 4;
    return p;
}

static const GgufKV *fixture_key(const Fixture *fx, const char *key) {
    const GgufKV *kv = gguf_find_key(&fx->f, key);
    if (!kv) { fprintf(stderr, "error: the fixture has no key %s\n", key); exit(1); }
    return kv;
}

/* ------------------------------------------------------------------------ */
/* Dequantization against gguf-py                                           */

typedef struct {
    char name[64], type[16];
    uint32_t n_dims;
    uint64_t dims[GGUF_MAX_DIMS];
    size_t count;             /* dims[0] * ... * dims[3] */
    size_t n_values;          /* values read: count, or 0 when the type must be refused */
    uint32_t *bits;           /* (n_values) float32 bit patterns */
} Expected;

/* Reads the .expect file: "tensor NAME TYPE NDIMS DIMS..." lines, each
 * followed by lines of hex float32 bits. Returns the number of tensors. */
static int read_expected(const char *path, Expected *e, int cap) {
    FILE *in = fopen(path, "r");
    char line[256];
    int n = 0;
    if (!in) { fprintf(stderr, "error: cannot open %s\n", path); exit(1); }
    while (fgets(line, sizeof line, in)) {
        if (line[0] == '#') continue;
        if (strncmp(line, "tensor ", 7) == 0) {
            Expected *t = &e[n];
            unsigned long long d[GGUF_MAX_DIMS] = {1, 1, 1, 1};
            if (n == cap || sscanf(line, "tensor %63s %15s %u %llu %llu %llu %llu", t->name, t->type,
                                   &t->n_dims, &d[0], &d[1], &d[2], &d[3]) < 4) {
                fprintf(stderr, "error: %s: a bad line: %s", path, line);
                exit(1);
            }
            n++;
            t->count = 1;
            for (int i = 0; i < GGUF_MAX_DIMS; i++) t->count *= (size_t)(t->dims[i] = d[i]);
            t->bits = xmalloc(t->count * sizeof(uint32_t));
            t->n_values = 0;
            continue;
        }
        char *p = line, *end;
        for (unsigned long v; n > 0 && (v = strtoul(p, &end, 16), end != p); p = end) {
            Expected *t = &e[n - 1];
            if (t->n_values == t->count) { fprintf(stderr, "error: %s: too many values\n", path); exit(1); }
            t->bits[t->n_values++] = (uint32_t)v;
        }
    }
    fclose(in);
    return n;
}

static float float_of(uint32_t bits) { float x; memcpy(&x, &bits, 4); return x; }

/* got against gguf-py's values: F32, F16 and BF16 must match bit for bit
 * (NaN payloads included); quantized types within |got - ref| <= 1e-6 |ref|
 * + 1e-7 (both sides compute the same float products and sums in the same
 * order, so they are bit-identical unless a compiler fuses a multiply-add). */
static void compare_dequantized(const Expected *e, const float *got) {
    int exact = !strcmp(e->type, "F32") || !strcmp(e->type, "F16") || !strcmp(e->type, "BF16");
    size_t identical = 0, bad = 0;
    double max_abs = 0, max_rel = 0;
    for (size_t i = 0; i < e->n_values; i++) {
        uint32_t got_bits;
        memcpy(&got_bits, &got[i], 4);
        double ref = float_of(e->bits[i]), diff = fabs((double)got[i] - ref);
        identical += got_bits == e->bits[i];
        if (got_bits == e->bits[i]) continue;
        if (exact || !(diff <= 1e-6 * fabs(ref) + 1e-7)) {
            if (bad++ < 3) printf("    %s[%zu]: got %08x, want %08x\n", e->name, i, got_bits, e->bits[i]);
            continue;
        }
        if (diff > max_abs) max_abs = diff;
        if (diff / fabs(ref) > max_rel) max_rel = diff / fabs(ref);
    }
    char what[200];
    snprintf(what, sizeof what, "%.63s (%.15s, %zu values) = gguf-py: max abs %.1e rel %.1e, %zu bit-exact",
             e->name, e->type, e->n_values, max_abs, max_rel, identical);
    check(what, bad == 0);
}

static void test_dequantize(const GgufFile *f) {
    printf("dequantization against gguf-py (%s)\n", TYPES_EXPECT);
    Expected e[32];
    int n = read_expected(TYPES_EXPECT, e, 32);
    check("the expect file lists the fixture's 13 tensors", n == 13 && (size_t)n == f->n_tensors);
    for (int i = 0; i < n; i++) {
        const GgufTensor *t = gguf_find_tensor(f, e[i].name);
        size_t count = e[i].count;
        int shape_ok = t && !strcmp(gguf_tensor_type_name(t->type), e[i].type) &&
                       t->n_dims == e[i].n_dims && !memcmp(t->dims, e[i].dims, sizeof t->dims) &&
                       t->n_elements == count;
        if (!shape_ok) { check(e[i].name, 0); continue; }
        if (e[i].n_values == 0) {
            float one[32];
            CHECK_REFUSED("a Q5_0 tensor is refused, naming the type", gguf_dequantize(t, one, 32),
                          "Q5_0", e[i].name);
            continue;
        }
        float *got = xmalloc(count * sizeof(float));
        if (e[i].n_values != count || gguf_dequantize(t, got, count)) check(e[i].name, 0);
        else compare_dequantized(&e[i], got);
        free(got);
    }
    for (int i = 0; i < n; i++) free(e[i].bits);
}

/* ------------------------------------------------------------------------ */
/* Metadata                                                                 */

static void test_scalars(const GgufFile *f) {
    uint64_t u = 0;
    int64_t s = 0;
    double x = 0;
    int b = -1;
    printf("metadata: scalars\n");
    check("version 3, 26 keys, 13 tensors, alignment 64",
          f->version == 3 && f->n_kv == 26 && f->n_tensors == 13 && f->alignment == 64);
    check("the data section starts at a multiple of 64", f->data_start % 64 == 0);
    check("uint8 200 as unsigned and signed",
          !gguf_get_uint(f, "test.u8", &u) && u == 200 && !gguf_get_int(f, "test.u8", &s) && s == 200);
    check("int8 -100, uint16 60000, int16 -30000",
          !gguf_get_int(f, "test.i8", &s) && s == -100 && !gguf_get_uint(f, "test.u16", &u) &&
          u == 60000 && !gguf_get_int(f, "test.i16", &s) && s == -30000);
    check("uint32 4000000000, int32 -2000000000",
          !gguf_get_uint(f, "test.u32", &u) && u == 4000000000u && !gguf_get_int(f, "test.i32", &s) &&
          s == -2000000000);
    check("uint64 2^64-1 and int64 -2^63",
          !gguf_get_uint(f, "test.u64", &u) && u == UINT64_MAX && !gguf_get_int(f, "test.i64", &s) &&
          s == INT64_MIN);
    CHECK_REFUSED("uint64 2^64-1 as int64 is refused", gguf_get_int(f, "test.u64", &s), "test.u64", "int64");
    CHECK_REFUSED("int8 -100 as unsigned is refused", gguf_get_uint(f, "test.i8", &u), "test.i8", "-100");
    check("float32 0.1 (as a float) and float64 -2.5e-300",
          !gguf_get_float(f, "test.f32", &x) && x == (double)0.1f && !gguf_get_float(f, "test.f64", &x) &&
          x == -2.5e-300);
    check("bools true and false", !gguf_get_bool(f, "test.true", &b) && b == 1 &&
          !gguf_get_bool(f, "test.false", &b) && b == 0);
    CHECK_REFUSED("a uint8 as a float is refused, naming both types", gguf_get_float(f, "test.u8", &x),
                  "uint8", "float32 or float64");
    CHECK_REFUSED("a float as an integer is refused, naming both types", gguf_get_uint(f, "test.f32", &u),
                  "float32", "integer");
    CHECK_REFUSED("a string as a bool is refused, naming both types", gguf_get_bool(f, "test.string", &b),
                  "string", "not bool");
    CHECK_REFUSED("a missing key is refused by a getter", gguf_get_uint(f, "test.none", &u), "test.none", "missing");
    check("gguf_find_key: NULL for a missing key, and no sentence",
          (listen(), gguf_find_key(f, "test.none") == NULL && heard()[0] == '\0'));
}

static void test_strings(const GgufFile *f) {
    GgufString s = {0};
    printf("metadata: strings\n");
    check("a UTF-8 string", !gguf_get_string(f, "test.string", &s) &&
          gguf_string_equals(s, "h\xc3\xa9llo w\xc3\xb6rld") && !gguf_string_equals(s, "h\xc3\xa9llo"));
    check("an empty string", !gguf_get_string(f, "test.empty", &s) && s.len == 0 && gguf_string_equals(s, ""));
    check("a string holding a NUL byte: 3 bytes, copied whole",
          !gguf_get_string(f, "test.nul", &s) && s.len == 3 && !gguf_string_equals(s, "a"));
    char *copy = gguf_string_dup(s);
    check("  its copy is a\\0b and NUL-terminated", copy && !memcmp(copy, "a\0b", 4));
    free(copy);
    check("general.architecture is test", !gguf_get_string(f, "general.architecture", &s) &&
          gguf_string_equals(s, "test"));
    CHECK_REFUSED("a uint32 as a string is refused, naming both types", gguf_get_string(f, "test.u32", &s),
                  "test.u32", "uint32");
}

static void test_arrays(const GgufFile *f) {
    const GgufKV *a;
    int64_t s = 0;
    double x = 0;
    GgufString str = {0};
    printf("metadata: arrays\n");
    a = gguf_get_array(f, "test.array_i16");
    check("int16 [-1, 2, -3]", a && a->array_type == GGUF_VALUE_INT16 && a->array_count == 3 &&
          !gguf_array_int(a, 0, &s) && s == -1 && !gguf_array_int(a, 2, &s) && s == -3);
    CHECK_REFUSED("element 3 of 3 is refused", gguf_array_int(a, 3, &s), "element 3", "past the end");
    CHECK_REFUSED("an int16 element as a float is refused", gguf_array_float(a, 0, &x), "int16", "float32");
    a = gguf_get_array(f, "test.array_u64");
    check("uint64 [0, 2^64-1]: 0 as int64", a && !gguf_array_int(a, 0, &s) && s == 0);
    CHECK_REFUSED("  2^64-1 as int64 is refused", gguf_array_int(a, 1, &s), "test.array_u64", "int64");
    a = gguf_get_array(f, "test.array_f32");
    check("float32 [1.5, -0.25]", a && !gguf_array_float(a, 0, &x) && x == 1.5 &&
          !gguf_array_float(a, 1, &x) && x == -0.25);
    a = gguf_get_array(f, "test.array_f64");
    check("float64 [1e300, -5e-324 (subnormal)]", a && !gguf_array_float(a, 0, &x) && x == 1e300 &&
          !gguf_array_float(a, 1, &x) && x == -5e-324);
    a = gguf_get_array(f, "test.array_string");
    check("string [alpha, \"\", gamma in Greek, with space]", a && a->array_count == 4 && a->string_offsets &&
          !gguf_array_string(a, 0, &str) && gguf_string_equals(str, "alpha") &&
          !gguf_array_string(a, 1, &str) && str.len == 0 &&
          !gguf_array_string(a, 2, &str) && gguf_string_equals(str, "\xce\xb3\xce\xac\xce\xbc\xce\xbc\xce\xb1") &&
          !gguf_array_string(a, 3, &str) && gguf_string_equals(str, "with space"));
    CHECK_REFUSED("a string element as an integer is refused", gguf_array_int(a, 0, &s), "string", "integer");
    a = gguf_get_array(f, "test.array_nested");
    check("an array of 3 arrays is parsed (and skipped)", a && a->array_type == GGUF_VALUE_ARRAY &&
          a->array_count == 3);
    CHECK_REFUSED("  its elements are refused as integers", gguf_array_int(a, 0, &s), "array", "integer");
    a = gguf_get_array(f, "test.array_bool");
    CHECK_REFUSED("a bool element as an integer is refused", gguf_array_int(a, 0, &s), "bool", "integer");
    listen();
    a = gguf_get_array(f, "test.u8");
    check_refusal("a uint8 as an array is refused, naming both types", a ? 0 : -1, "uint8", "array");
    check("type names", !strcmp(gguf_value_type_name(GGUF_VALUE_FLOAT64), "float64") &&
          !strcmp(gguf_value_type_name(99), "unknown") && !strcmp(gguf_tensor_type_name(12), "Q4_K") &&
          !strcmp(gguf_tensor_type_name(4), "unknown"));
}

static void test_tensor_api(const GgufFile *f) {
    printf("tensors\n");
    const GgufTensor *t = gguf_find_tensor(f, "q8_0_3d");
    float buf[192];
    check("q8_0_3d: [32, 2, 3], 192 values in 6 blocks of 34 bytes",
          t && t->n_dims == 3 && t->dims[2] == 3 && t->dims[3] == 1 && t->n_elements == 192 &&
          t->n_bytes == 204 && t->offset % 64 == 0);
    check("gguf_find_tensor: NULL for a missing name", gguf_find_tensor(f, "q8_0_3") == NULL);
    CHECK_REFUSED("a buffer one float short is refused", gguf_dequantize(t, buf, 191), "192", "191");
    CHECK_REFUSED("a buffer one float long is refused", gguf_dequantize(t, buf, 193), "192", "193");
}

/* ------------------------------------------------------------------------ */
/* Llama hyperparameters and tensor checks                                  */

#define FIELD(name, is_float) {#name, offsetof(GgufLlamaConfig, name), is_float}
static const struct { const char *name; size_t offset; int is_float; } LLAMA_FIELDS[] = {
    FIELD(dim, 0), FIELD(hidden_dim, 0), FIELD(n_layers, 0), FIELD(n_heads, 0), FIELD(n_kv_heads, 0),
    FIELD(head_size, 0), FIELD(vocab_size, 0), FIELD(context_length, 0), FIELD(rope_theta, 1),
    FIELD(rms_eps, 1), FIELD(tied_embeddings, 0),
};
#define N_LLAMA_FIELDS (sizeof LLAMA_FIELDS / sizeof LLAMA_FIELDS[0])

/* The "name value" lines of the .expect file into a config; every field
 * must be there. */
static GgufLlamaConfig read_llama_expect(const char *path) {
    GgufLlamaConfig c;
    char name[64], value[64];
    size_t found = 0;
    FILE *in = fopen(path, "r");
    if (!in) { fprintf(stderr, "error: cannot open %s\n", path); exit(1); }
    while (fscanf(in, "%63s %63s", name, value) == 2)
        for (size_t i = 0; i < N_LLAMA_FIELDS; i++) {
            if (strcmp(name, LLAMA_FIELDS[i].name)) continue;
            char *field = (char *)&c + LLAMA_FIELDS[i].offset;
            if (LLAMA_FIELDS[i].is_float) *(float *)field = strtof(value, NULL);
            else *(int *)field = atoi(value);
            found++;
        }
    fclose(in);
    if (found != N_LLAMA_FIELDS) { fprintf(stderr, "error: %s lacks fields\n", path); exit(1); }
    return c;
}

static void check_llama_fields(const GgufLlamaConfig *got, const GgufLlamaConfig *want) {
    for (size_t i = 0; i < N_LLAMA_FIELDS; i++) {
        const char *g = (const char *)got + LLAMA_FIELDS[i].offset;
        const char *w = (const char *)want + LLAMA_FIELDS[i].offset;
        char what[96];
        if (LLAMA_FIELDS[i].is_float)
            snprintf(what, sizeof what, "%s %.9g (want %.9g)", LLAMA_FIELDS[i].name, *(const float *)g,
                     *(const float *)w);
        else
            snprintf(what, sizeof what, "%s %d (want %d)", LLAMA_FIELDS[i].name, *(const int *)g,
                     *(const int *)w);
        check(what, LLAMA_FIELDS[i].is_float ? *(const float *)g == *(const float *)w
                                             : *(const int *)g == *(const int *)w);
    }
}

/* The model fixture with an edit, opened (that must succeed; else -2) and
 * its gguf_llama_config status, with *c filled. */
static int config_of_edit(const Fixture *fx, size_t pos, const void *with, size_t n, GgufLlamaConfig *c) {
    GgufFile f;
    uint8_t *copy;
    int status = open_edit(&f, fx, pos, with, n, &copy);
    if (status == 0) {
        listen();
        status = gguf_llama_config(&f, c);
        gguf_close(&f);
    } else {
        status = -2;
    }
    free(copy);
    return status;
}

/* The same with a second edit (n2 bytes at pos2) made first. */
static int config_of_edits(const Fixture *fx, size_t pos, const void *with, size_t n, size_t pos2,
                           const void *with2, size_t n2, GgufLlamaConfig *c) {
    Fixture edited = *fx;
    uint8_t *bytes = xmalloc(fx->size);
    memcpy(bytes, fx->bytes, fx->size);
    memcpy(bytes + pos2, with2, n2);
    edited.bytes = bytes;
    int status = config_of_edit(&edited, pos, with, n, c);
    free(bytes);
    return status;
}

static size_t value_at(const Fixture *fx, const char *key) { return at(fx, fixture_key(fx, key)->value); }
static size_t name_at_key(const Fixture *fx, const char *key) { return at(fx, fixture_key(fx, key)->key.ptr); }
static size_t name_at(const Fixture *fx, const char *tensor) {
    return at(fx, gguf_find_tensor(&fx->f, tensor)->name.ptr);
}

static void test_llama_refusals(const Fixture *fx) {
    GgufLlamaConfig c;
    uint8_t v[16];
    float minus_one = -1.0f;
    printf("llama: edited models refused, each with one sentence\n");
    check_refusal("architecture llamb", config_of_edit(fx, value_at(fx, "general.architecture") + 8,
                  "llamb", 5, &c), "architecture is llamb", NULL);
    check_refusal("head_count 5 does not divide 64", config_of_edit(fx, value_at(fx, "llama.attention.head_count"),
                  u32_bytes(v, 5), 4, &c), "multiple of the head count 5", NULL);
    check_refusal("head_count_kv 3 does not divide 4", config_of_edit(fx,
                  value_at(fx, "llama.attention.head_count_kv"), u32_bytes(v, 3), 4, &c), "KV head count 3", NULL);
    check_refusal("key_length 8 != 64 / 4", config_of_edit(fx, value_at(fx, "llama.attention.key_length"),
                  u32_bytes(v, 8), 4, &c), "key and value lengths (8, 16)", NULL);
    check_refusal("rope.dimension_count 8 < head size", config_of_edit(fx,
                  value_at(fx, "llama.rope.dimension_count"), u32_bytes(v, 8), 4, &c), "partial rotary", NULL);
    check_refusal("block_count 0", config_of_edit(fx, value_at(fx, "llama.block_count"), u32_bytes(v, 0), 4, &c),
                  "llama.block_count is 0", NULL);
    check_refusal("block_count 1: the file's blk.1 tensors unused", config_of_edit(fx,
                  value_at(fx, "llama.block_count"), u32_bytes(v, 1), 4, &c), "tensor blk.1.", "of 1 blocks");
    check_refusal("blk.0.ffn_up.weight renamed blk.0.ffn_uq.weight: an unknown tensor",
                  config_of_edit(fx, name_at(fx, "blk.0.ffn_up.weight"), "blk.0.ffn_uq", 12, &c),
                  "tensor blk.0.ffn_up.weight is missing", NULL);
    check_refusal("output.weight renamed outpuX.weight: an unknown tensor", config_of_edit(fx,
                  name_at(fx, "output.weight"), "outpuX", 6, &c), "tensor outpuX.weight is not one", NULL);
    /* the fixture has no special-token id: rope.dimension_count (uint32, 16, the head size) renamed to one */
    size_t rope_dims = name_at_key(fx, "llama.rope.dimension_count");
    check_refusal("tokenizer.ggml.xx_token_id = 128 (vocabulary of 128)", config_of_edits(fx, rope_dims,
                  "tokenizer.ggml.xx_token_id", 26, value_at(fx, "llama.rope.dimension_count"), u32_bytes(v, 128), 4,
                  &c), "tokenizer.ggml.xx_token_id = 128 is not a token id", NULL);
    check("tokenizer.ggml.xx_token_id = 127 is read", config_of_edits(fx, rope_dims, "tokenizer.ggml.xx_token_id",
          26, value_at(fx, "llama.rope.dimension_count"), u32_bytes(v, 127), 4, &c) == 0);
    check_refusal("block_count 3: layer 2 missing", config_of_edit(fx, value_at(fx, "llama.block_count"),
                  u32_bytes(v, 3), 4, &c), "tensor blk.2.attn_norm.weight is missing", NULL);
    check_refusal("rms epsilon -1", config_of_edit(fx, value_at(fx, "llama.attention.layer_norm_rms_epsilon"),
                  &minus_one, 4, &c), "not a positive float", NULL);
    check_refusal("blk.1.ffn_up.weight renamed", config_of_edit(fx, name_at(fx, "blk.1.ffn_up.weight"),
                  "blk.1.ffn_uq", 12, &c), "tensor blk.1.ffn_up.weight is missing", NULL);
    u64_bytes(v, 32);
    u64_bytes(v + 8, 64);
    check_refusal("attn_k stored [32, 64] (same size)", config_of_edit(fx, info_fields(fx,
                  "blk.0.attn_k.weight").dims, v, 16, &c), "has shape [32, 64]; this model needs [64, 32]", NULL);
    check_edit_refused("token_embd as Q5_0: its size changes", fx, info_fields(fx, "token_embd.weight").type,
                       u32_bytes(v, 6), 4, "before it, token_embd.weight (5632 bytes of Q5_0)");
}

/* The model's config against its .expect file, and every tensor read. */
static void test_model_config(const Fixture *fx, const char *path, const char *expect_path) {
    GgufLlamaConfig got, want = read_llama_expect(expect_path);
    printf("llama hyperparameters (%s against %s)\n", path, expect_path);
    check("gguf_llama_config reads the model", gguf_llama_config(&fx->f, &got) == 0);
    check_llama_fields(&got, &want);
    check("every tensor of the model dequantizes", walk_gguf(&fx->f) == 0);
}

static void test_llama(const Fixture *llama, const Fixture *mistral) {
    GgufLlamaConfig c;
    uint8_t v[4];
    test_model_config(llama, LLAMA_FIXTURE, LLAMA_EXPECT);
    test_model_config(mistral, MISTRAL_FIXTURE, MISTRAL_EXPECT);
    check_refusal("mistral.vocab_size 33 but 32 tokens", config_of_edit(mistral,
                  value_at(mistral, "mistral.vocab_size"), u32_bytes(v, 33), 4, &c),
                  "mistral.vocab_size is 33 but tokenizer.ggml.tokens holds 32 tokens", NULL);
    test_llama_refusals(llama);
}

/* ------------------------------------------------------------------------ */
/* Bad input                                                                */

static void test_bad_header_and_metadata(const Fixture *fx) {
    uint8_t v[8];
    size_t first_key = at(fx, fx->f.kv[0].key.ptr);
    printf("bad input: header and metadata, each refused with one sentence\n");
    check_edit_refused("wrong magic", fx, 0, "GGUX", 4, "not a GGUF file");
    GgufFile f;
    uint8_t *copy;
    int status = open_edit(&f, fx, 4, u32_bytes(v, 2), 4, &copy);
    check("version 2 (the same layout) is read", status == 0 && f.version == 2);
    if (status == 0) gguf_close(&f);
    free(copy);
    check_edit_refused("version 1", fx, 4, u32_bytes(v, 1), 4, "unsupported GGUF version 1 ");
    check_edit_refused("version 4", fx, 4, u32_bytes(v, 4), 4, "unsupported GGUF version 4 ");
    check_edit_refused("version 3 big-endian", fx, 4, "\0\0\0\3", 4, "little-endian");
    check_edit_refused("tensor_count 2^60", fx, 8, u64_bytes(v, 1ull << 60), 8, "tensor_count");
    check_edit_refused("kv_count 2^64-1", fx, 16, u64_bytes(v, UINT64_MAX), 8, "kv_count");
    check_edit_refused("a key's length 2^64-1", fx, first_key - 8, u64_bytes(v, UINT64_MAX), 8, "past the end");
    check_edit_refused("a key's length = the file's size", fx, first_key - 8, u64_bytes(v, fx->size), 8,
                       "past the end");
    check_edit_refused("a string value's length 2^63", fx, value_at(fx, "test.string"),
                       u64_bytes(v, 1ull << 63), 8, "past the end");
    check_edit_refused("value type 13", fx, first_key + fx->f.kv[0].key.len, u32_bytes(v, 13), 4,
                       "unknown value type 13");
    check_edit_refused("array element type 13", fx, value_at(fx, "test.array_i16") - 12, u32_bytes(v, 13), 4,
                       "unknown array element type 13");
    check_edit_refused("a uint64 array's count 2^61", fx, value_at(fx, "test.array_u64") - 8,
                       u64_bytes(v, 1ull << 61), 8, "runs past the end");
    check_edit_refused("a string array's count 2^62", fx, value_at(fx, "test.array_string") - 8,
                       u64_bytes(v, 1ull << 62), 8, "runs past the end");
    check_edit_refused("a nested array's count 2^40", fx, value_at(fx, "test.array_nested") + 4,
                       u64_bytes(v, 1ull << 40), 8, "runs past the end");
    check_edit_refused("a key repeated", fx, at(fx, fixture_key(fx, "test.dup_b")->key.ptr), "test.dup_a", 10,
                       "key test.dup_a appears twice");
    check_edit_refused("general.alignment 48", fx, value_at(fx, "general.alignment"), u32_bytes(v, 48), 4,
                       "48, not a power of two");
    check_edit_refused("general.alignment 0", fx, value_at(fx, "general.alignment"), u32_bytes(v, 0), 4,
                       "0, not a power of two");
    check_edit_refused("general.alignment as a float32", fx, value_at(fx, "general.alignment") - 4,
                       u32_bytes(v, GGUF_VALUE_FLOAT32), 4, "float32, not an integer type");
}

static void test_bad_tensor_infos(const Fixture *fx) {
    uint8_t v[16];
    InfoFields q41 = info_fields(fx, "q4_1"), f32 = info_fields(fx, "f32"), f16 = info_fields(fx, "f16");
    InfoFields last = info_fields(fx, "q5_0_unsupported");     /* the last tensor in the file */
    printf("bad input: tensor infos, each refused with one sentence\n");
    check_edit_refused("n_dims 5", fx, q41.n_dims, u32_bytes(v, 5), 4, "5 dimensions");
    check_edit_refused("n_dims 0", fx, q41.n_dims, u32_bytes(v, 0), 4, "0 dimensions");
    check_edit_refused("a dimension of 0", fx, q41.dims + 8, u64_bytes(v, 0), 8, "dimension 1 of shape [64, 0] is 0");
    u64_bytes(v, 1ull << 32);
    u64_bytes(v + 8, 1ull << 32);
    check_edit_refused("dims [2^32, 2^32]: 2^64 elements", fx, q41.dims, v, 16, "more than 2^63 elements");
    u64_bytes(v, 1ull << 31);
    u64_bytes(v + 8, 1ull << 31);
    check_edit_refused("F32 dims [2^31, 2^31]: 2^64 bytes", fx, f32.dims, v, 16, "more than 2^64 bytes");
    check_edit_refused("a Q4_1 row of 48 (block size 32)", fx, q41.dims, u64_bytes(v, 48), 8, "block size 32");
    check_edit_refused("tensor type 99", fx, q41.type, u32_bytes(v, 99), 4, "unknown tensor type 99");
    check_edit_refused("tensor type 4 (removed from ggml)", fx, q41.type, u32_bytes(v, 4), 4, "unknown tensor type 4");
    check_edit_refused("a tensor's data 2^40 bytes in", fx, last.offset, u64_bytes(v, 1ull << 40), 8,
                       "runs past the end");
    check_edit_refused("a tensor's offset 2^64-64 (wraps around)", fx, last.offset, u64_bytes(v, UINT64_MAX - 63), 8,
                       "runs past the end");
    uint64_t offset = gguf_find_tensor(&fx->f, "q4_1")->offset;
    check_edit_refused("a tensor offset off the alignment by 32", fx, q41.offset, u64_bytes(v, offset + 32), 8,
                       "not a multiple of the alignment 64");
    check_edit_refused("two tensors overlapping", fx, f16.offset, fx->bytes + f32.offset, 8,
                       "tensor f16's data starts at 0, but the tensor before it, f32");
    check_edit_refused("the first tensor's data 64 bytes in", fx, f32.offset, u64_bytes(v, 64), 8,
                       "tensor f32, the first, starts its data at 64, not at 0");
    check_edit_refused("a tensor name repeated", fx, name_at(fx, "q4_1"), "q4_0", 4, "tensor name q4_0 appears twice");
    GgufFile f;
    uint8_t *copy;
    const GgufTensor *t = gguf_find_tensor(&fx->f, "q5_0_unsupported");
    size_t data_end = fx->f.data_start + (size_t)(t->offset + t->n_bytes);
    int status = open_copy(&f, fx->bytes, data_end - 1, &copy);
    check_refusal("the file cut 1 byte before its last tensor's end", status, "runs past the end", NULL);
    if (status == 0) gguf_close(&f);
    free(copy);
    uint8_t *longer = xmalloc(fx->size + 64);
    memcpy(longer, fx->bytes, fx->size);
    memset(longer + fx->size, 0, 64);
    int appended = open_copy(&f, longer, fx->size + 64, &copy);
    check_refusal("64 bytes appended past the last tensor", appended, "more than the", "its tensors take");
    if (appended == 0) gguf_close(&f);
    free(copy);
    free(longer);
}

static size_t put32(uint8_t *out, size_t n, uint32_t v) { u32_bytes(out + n, v); return n + 4; }
static size_t put64(uint8_t *out, size_t n, uint64_t v) { u64_bytes(out + n, v); return n + 8; }

/* A GGUF file with no tensors and one key whose value is `depth` arrays,
 * each holding the next; the innermost holds no uint8. Returns its size. */
static size_t nested_arrays(uint8_t *out, int depth) {
    memcpy(out, "GGUF", 4);
    size_t n = put32(out, 4, 3);             /* version */
    n = put64(out, n, 0);                    /* tensor_count */
    n = put64(out, n, 1);                    /* kv_count */
    n = put64(out, n, 1);                    /* the key "k" */
    out[n++] = 'k';
    n = put32(out, n, GGUF_VALUE_ARRAY);
    for (int level = 1; level <= depth; level++) {
        n = put32(out, n, level < depth ? GGUF_VALUE_ARRAY : GGUF_VALUE_UINT8);  /* element type */
        n = put64(out, n, level < depth ? 1 : 0);                                /* count */
    }
    return n;
}

static void test_small_files(void) {
    uint8_t bytes[256], *copy;
    GgufFile f;
    printf("small files made here\n");
    size_t n = nested_arrays(bytes, 8);
    int status = open_copy(&f, bytes, n, &copy);
    check("arrays nested 8 deep are read; no tensors, no alignment key",
          status == 0 && f.n_kv == 1 && f.n_tensors == 0 && f.kv[0].array_count == 1 && f.alignment == 32);
    if (status == 0) gguf_close(&f);
    free(copy);
    n = nested_arrays(bytes, 9);
    status = open_copy(&f, bytes, n, &copy);
    check_refusal("arrays nested 9 deep are refused", status, "nested more than 8 deep", NULL);
    if (status == 0) gguf_close(&f);
    free(copy);
    put64(bytes, 16, 0);                     /* kv_count 0 */
    status = open_copy(&f, bytes, 24, &copy);
    check("a header alone (no keys, no tensors) is read", status == 0 && !gguf_find_key(&f, "k") &&
          !gguf_find_tensor(&f, "t"));
    if (status == 0) gguf_close(&f);
    free(copy);
    listen();
    check_refusal("a file that does not exist", gguf_open(&f, "tests/data/no_such_file.gguf"),
                  "cannot open tests/data/no_such_file.gguf", NULL);
    listen();
    check_refusal("a directory", gguf_open(&f, "tests/data"), "cannot read tests/data", NULL);
}

/* ------------------------------------------------------------------------ */
/* Every truncation, and mutants                                            */

/* Every prefix of the file (every `stride`-th one inside the tensor data)
 * shorter than the end of its last tensor's data must be refused with one
 * sentence; longer ones (cutting only the padding after it) are read. */
static void test_truncations(const Fixture *fx, const char *name, size_t stride) {
    size_t data_end = 0, tried = 0, bad = 0;
    for (size_t i = 0; i < fx->f.n_tensors; i++) {
        size_t end = fx->f.data_start + (size_t)(fx->f.tensors[i].offset + fx->f.tensors[i].n_bytes);
        if (end > data_end) data_end = end;
    }
    for (size_t cut = 0; cut < fx->size; cut += cut < fx->f.data_start ? 1 : stride, tried++) {
        GgufFile f;
        uint8_t *copy;
        int status = open_copy(&f, fx->bytes, cut, &copy);
        int ok = cut < data_end ? status == -1 && one_sentence(heard()) : status == 0;
        if (!ok && bad++ < 3) printf("    cut at %zu: status %d, said %s", cut, status, heard());
        if (status == 0) gguf_close(&f);
        free(copy);
    }
    char what[128];
    snprintf(what, sizeof what, "%zu truncations of %s (data ends at %zu of %zu)", tried, name,
             data_end, fx->size);
    check(what, bad == 0);
}

static uint64_t next_random(uint64_t *state) {        /* xorshift64* */
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 2685821657736338717ull;
}

/* The positions of the fixture's counts, lengths, types, dims and offsets:
 * where a mutation does the most harm. */
static size_t field_positions(const Fixture *fx, size_t *pos, size_t cap) {
    size_t n = 0;
    pos[n++] = 4, pos[n++] = 8, pos[n++] = 16;
    for (size_t i = 0; i < fx->f.n_kv && n + 4 <= cap; i++) {
        const GgufKV *kv = &fx->f.kv[i];
        pos[n++] = at(fx, kv->key.ptr) - 8;
        pos[n++] = at(fx, kv->key.ptr + kv->key.len);
        pos[n++] = at(fx, kv->value) - (kv->type == GGUF_VALUE_ARRAY ? 12 : 0);
        if (kv->type == GGUF_VALUE_ARRAY) pos[n++] = at(fx, kv->value) - 8;
    }
    for (size_t i = 0; i < fx->f.n_tensors && n + 8 <= cap; i++) {
        const GgufTensor *t = &fx->f.tensors[i];
        size_t p = at(fx, t->name.ptr + t->name.len);
        pos[n++] = at(fx, t->name.ptr) - 8;
        for (uint32_t k = 0; k < 4 + 2 * t->n_dims + 3; k += 2) pos[n++] = p + 2 * k;  /* every 4 bytes */
    }
    return n;
}

/* 1 to 3 edits: a bit flipped, a random byte, an extreme u32 or u64 written
 * (at a field, half the time), or the file cut short. Returns the new size. */
static size_t mutate(uint8_t *bytes, size_t size, const size_t *fields, size_t n_fields, uint64_t *rng) {
    static const uint64_t extremes[] = {0, 1, 2, 5, 13, 31, 32, 63, 64, 255, 0x7fffffff, 0xffffffff,
                                        1ull << 32, 1ull << 62, 1ull << 63, UINT64_MAX - 63, UINT64_MAX};
    int n_edits = 1 + (int)(next_random(rng) % 3);
    for (int e = 0; e < n_edits && size > 0; e++) {
        uint64_t r = next_random(rng);
        size_t pos = r & 1 ? fields[(r >> 8) % n_fields] : (size_t)((r >> 8) % size);
        uint64_t value = r >> 40 & 1 ? extremes[(r >> 41) % 17] : next_random(rng) % (size + 1);
        switch ((r >> 4) % 5) {
        case 0: if (pos < size) bytes[pos] ^= (uint8_t)(1u << (r >> 32) % 8); break;
        case 1: if (pos < size) bytes[pos] = (uint8_t)(r >> 32); break;
        case 2: if (pos + 8 <= size) u64_bytes(bytes + pos, value); break;
        case 3: if (pos + 4 <= size) u32_bytes(bytes + pos, (uint32_t)value); break;
        default: size = (size_t)(next_random(rng) % (size + 1)); break;
        }
    }
    return size;
}

/* Each mutant is refused with one sentence, or read and walked by walk_gguf
 * (every getter and every dequantization) without a broken invariant. */
static void test_fuzz(const Fixture *fx, const char *name, int n_mutants, uint64_t seed) {
    size_t fields[4096], n_fields = field_positions(fx, fields, 4096);
    uint8_t *work = xmalloc(fx->size);
    int read = 0, refused = 0, bad = 0;
    for (int m = 0; m < n_mutants; m++) {
        memcpy(work, fx->bytes, fx->size);
        size_t size = mutate(work, fx->size, fields, n_fields, &seed);
        GgufFile f;
        uint8_t *copy;
        if (open_copy(&f, work, size, &copy) == 0) {
            read++;
            bad += walk_gguf(&f) != 0;
            gguf_close(&f);
        } else {
            refused++;
            if (!one_sentence(heard()) && bad++ < 3) printf("    mutant %d said: %s", m, said);
        }
        free(copy);
    }
    free(work);
    char what[128];
    snprintf(what, sizeof what, "%d mutants of %s: %d refused, %d read, %d wrong", n_mutants, name,
             refused, read, bad);
    check(what, bad == 0 && read > 0 && refused > 0);
}

/* ------------------------------------------------------------------------ */
/* A real model                                                             */

static void print_model(const GgufFile *f, const GgufLlamaConfig *c) {
    GgufString model = {"", 0}, pre = {"", 0}, first = {"", 0};
    const GgufKV *tokens = gguf_get_array(f, "tokenizer.ggml.tokens");
    const GgufKV *merges = gguf_find_key(f, "tokenizer.ggml.merges");
    printf("  dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, head_size %d\n",
           c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_size);
    printf("  vocab_size %d, context_length %d, rope_theta %g, rms_eps %g, tied_embeddings %d\n",
           c->vocab_size, c->context_length, c->rope_theta, c->rms_eps, c->tied_embeddings);
    gguf_get_string(f, "tokenizer.ggml.model", &model);
    gguf_get_string(f, "tokenizer.ggml.pre", &pre);
    if (tokens) gguf_array_string(tokens, 0, &first);
    printf("  tokenizer %.*s (pre %.*s): %llu tokens (token 0 \"%.*s\"), %llu merges\n",
           (int)model.len, model.ptr, (int)pre.len, pre.ptr, tokens ? (unsigned long long)tokens->array_count : 0,
           (int)first.len, first.ptr, merges ? (unsigned long long)merges->array_count : 0);
}

/* Dequantizes every tensor into one buffer of the largest size, timed;
 * every value of a trained model must be finite. */
static void dequantize_all(const GgufFile *f) {
    uint64_t largest = 0, total = 0, non_finite = 0;
    for (size_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].n_elements > largest) largest = f->tensors[i].n_elements;
    float *out = xmalloc((size_t)largest * sizeof(float));    /* (largest) */
    int failed = 0;
    double elapsed = 0;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const GgufTensor *t = &f->tensors[i];
        double start = seconds();
        failed += gguf_dequantize(t, out, (size_t)t->n_elements) != 0;
        elapsed += seconds() - start;
        for (uint64_t j = 0; j < t->n_elements; j++) non_finite += !isfinite(out[j]);
        total += t->n_elements;
    }
    char what[160];
    snprintf(what, sizeof what, "all %zu tensors dequantized: %.1f M values in %.3f s", f->n_tensors,
             (double)total / 1e6, elapsed);
    check(what, failed == 0);
    check("  every value is finite", non_finite == 0);
    free(out);
}

/* NAME=FILE: the tensor against raw float32 values (gguf-py's), bit for bit. */
static void compare_with_file(const GgufFile *f, const char *arg) {
    char name[128];
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : 0;
    if (!eq || n >= sizeof name) { fprintf(stderr, "error: expected NAME=FILE, got %s\n", arg); exit(1); }
    memcpy(name, arg, n);
    name[n] = '\0';
    const GgufTensor *t = gguf_find_tensor(f, name);
    size_t size, count = t ? (size_t)t->n_elements : 0, identical = 0;
    uint8_t *ref = read_whole(eq + 1, &size);
    float *got = xmalloc(count * sizeof(float));
    double max_abs = 0;
    int ok = t && size == count * 4 && gguf_dequantize(t, got, count) == 0;
    for (size_t i = 0; ok && i < count; i++) {
        float r;
        memcpy(&r, ref + 4 * i, 4);
        identical += memcmp(&r, &got[i], 4) == 0;
        if (fabs((double)got[i] - r) > max_abs) max_abs = fabs((double)got[i] - r);
    }
    char what[256];
    snprintf(what, sizeof what, "%s (%s, %zu values) = gguf-py: max abs diff %.1e, %zu bit-exact", name,
             t ? gguf_tensor_type_name(t->type) : "missing", count, max_abs, identical);
    check(what, ok && identical == count);
    free(got);
    free(ref);
}

static int run_model(int argc, char **argv) {
    GgufFile f;
    GgufLlamaConfig c;
    gguf_set_error_stream(NULL);
    double start = seconds();
    if (gguf_open(&f, argv[2])) return 1;
    printf("%s: GGUF version %u, %zu keys, %zu tensors, %zu bytes, read and checked in %.3f s\n",
           argv[2], f.version, f.n_kv, f.n_tensors, f.size, seconds() - start);
    if (gguf_llama_config(&f, &c)) return 1;
    print_model(&f, &c);
    dequantize_all(&f);
    for (int i = 3; i < argc; i++) compare_with_file(&f, argv[i]);
    gguf_close(&f);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed != 0;
}

int main(int argc, char **argv) {
    sink = tmpfile();
    if (!sink) { fprintf(stderr, "error: cannot make a temporary file\n"); return 1; }
    gguf_set_error_stream(sink);
    if (argc >= 3 && !strcmp(argv[1], "--model")) return run_model(argc, argv);
    if (argc != 1) {
        fprintf(stderr, "error: usage: tests/test_gguf [--model FILE.gguf [NAME=REF.f32 ...]]\n");
        return 1;
    }
    Fixture types, llama, mistral;
    load_fixture(&types, TYPES_FIXTURE);
    load_fixture(&llama, LLAMA_FIXTURE);
    load_fixture(&mistral, MISTRAL_FIXTURE);
    test_dequantize(&types.f);
    test_scalars(&types.f);
    test_strings(&types.f);
    test_arrays(&types.f);
    test_tensor_api(&types.f);
    test_llama(&llama, &mistral);
    test_bad_header_and_metadata(&types);
    test_bad_tensor_infos(&types);
    test_small_files();
    printf("truncations and mutants\n");
    test_truncations(&types, "gguf_types.gguf", 1);
    test_truncations(&llama, "gguf_llama.gguf", 61);
    test_fuzz(&types, "gguf_types.gguf", 2000, 1);
    test_fuzz(&llama, "gguf_llama.gguf", 2000, 2);
    free_fixture(&types);
    free_fixture(&llama);
    free_fixture(&mistral);
    fclose(sink);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed != 0;
}
