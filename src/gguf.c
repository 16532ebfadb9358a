/* gguf.c - the GGUF reader declared in gguf.h: parsing and checking the
 * header, metadata and tensor infos; metadata and tensor lookup; the
 * dequantization of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K
 * blocks to fp32 (the block layouts of ggml, each written out above its
 * function); and the hyperparameters and tensor checks of a Llama model.
 *
 * Parsing reads the file front to back through one cursor that refuses any
 * read past the end; every count is compared with the bytes left before
 * anything is allocated for it, and sizes are multiplied with a check for
 * overflow. Lookup by name or key is a binary search over a sorted index,
 * which also finds repeated names.
 */
#include "gguf.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* The dequantizers round every product before it is added, as ggml's
 * reference code and gguf-py do, so the results are bit-identical to
 * theirs. GCC does not fuse a*b+c in ISO C mode (-std=c11); clang needs
 * to be told. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__GNUC__)
#define PRINTF_LIKE(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define PRINTF_LIKE(fmt, args)
#endif

#define DEFAULT_ALIGNMENT 32
#define MAX_ARRAY_DEPTH 8      /* arrays of arrays of ... deeper than this are refused */
#define MESSAGE_ROOM (4 * GGUF_MAX_SHOWN + 64)  /* a message part that holds one, escaped */

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */

static FILE *error_stream;     /* NULL: stderr */

void gguf_set_error_stream(FILE *stream) { error_stream = stream; }

/* Prints "error: <file>: <message>" as one line (no file part when file is
 * NULL) and returns -1. */
PRINTF_LIKE(2, 3)
static int fail(const char *file, const char *fmt, ...) {
    FILE *out = error_stream ? error_stream : stderr;
    va_list args;
    va_start(args, fmt);
    fputs("error: ", out);
    if (file) fprintf(out, "%s: ", file);
    vfprintf(out, fmt, args);
    fputc('\n', out);
    va_end(args);
    return -1;
}

GgufShown gguf_show(GgufString s) {
    GgufShown out;
    size_t n = s.len > GGUF_MAX_SHOWN ? GGUF_MAX_SHOWN : s.len, len = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c < 0x20 || c >= 0x7f || c == '\\') len += (size_t)snprintf(out.text + len, 5, "\\x%02x", c);
        else out.text[len++] = (char)c;
    }
    memcpy(out.text + len, s.len > n ? "..." : "", s.len > n ? 4 : 1);
    return out;
}

typedef unsigned long long ull;   /* for printf's %llu */

/* ------------------------------------------------------------------------ */
/* Bytes and arithmetic                                                     */

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static float float_from_bits(uint32_t bits) { float x; memcpy(&x, &bits, sizeof x); return x; }
static double double_from_bits(uint64_t bits) { double x; memcpy(&x, &bits, sizeof x); return x; }

/* The low `bits` bits of x read as a two's complement number. */
static int64_t sign_extend(uint64_t x, int bits) {
    uint64_t sign = (uint64_t)1 << (bits - 1), mask = (sign << 1) - 1;  /* bits = 64: all ones */
    x &= mask;
    return x & sign ? -(int64_t)(~x & mask) - 1 : (int64_t)x;
}

/* *out = a * b; -1 when that overflows 64 bits. */
static int checked_mul(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return -1;
    *out = a * b;
    return 0;
}

/* A shape as "[576, 49152]" into buf. */
static const char *format_dims(char *buf, size_t cap, const uint64_t *dims, uint32_t n_dims) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < n_dims && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, d ? ", %llu" : "%llu", (ull)dims[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
    return buf;
}

/* ------------------------------------------------------------------------ */
/* Type tables                                                              */

static const char *const VALUE_TYPE_NAMES[] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
    "string", "array", "uint64", "int64", "float64",
};
/* Bytes of a value of each fixed-size type; 0 for string and array. */
static const uint8_t VALUE_SIZES[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static int value_type_known(uint32_t type) { return type <= GGUF_VALUE_FLOAT64; }

const char *gguf_value_type_name(uint32_t type) {
    return value_type_known(type) ? VALUE_TYPE_NAMES[type] : "unknown";
}

/* The fewest bytes a value of this type takes: a string its u64 length, an
 * array its element type and count. */
static uint64_t min_value_size(uint32_t type) {
    if (type == GGUF_VALUE_STRING) return 8;
    if (type == GGUF_VALUE_ARRAY) return 12;
    return VALUE_SIZES[type];
}

typedef struct {
    const char *name;        /* NULL: not a type id ggml knows */
    uint32_t block_size;     /* weights per block */
    uint32_t type_size;      /* bytes per block */
    void (*dequantize)(const uint8_t *blocks, float *y, size_t n_blocks); /* NULL: not read here */
} TensorType;

static const TensorType *tensor_type(uint32_t type);   /* the table follows the dequantizers */

const char *gguf_tensor_type_name(uint32_t type) {
    const TensorType *t = tensor_type(type);
    return t ? t->name : "unknown";
}

int gguf_can_dequantize(uint32_t type) {
    const TensorType *t = tensor_type(type);
    return t && t->dequantize;
}

/* ------------------------------------------------------------------------ */
/* The cursor                                                               */

typedef struct {
    GgufFile *f;
    size_t pos;              /* the next byte to read */
    char where[MESSAGE_ROOM]; /* what is being read, for messages */
} Parser;

PRINTF_LIKE(2, 3)
static int parse_fail(const Parser *ps, const char *fmt, ...) {
    char message[320];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    return fail(ps->f->name, "%s: %s", ps->where, message);
}

static size_t bytes_left(const Parser *ps) { return ps->f->size - ps->pos; }

/* The next n bytes, or NULL with a sentence when the file ends first. */
static const uint8_t *take(Parser *ps, uint64_t n) {
    if (n > bytes_left(ps)) {
        parse_fail(ps, "the file is truncated (it ends at byte %zu, %llu bytes short)",
                   ps->f->size, (ull)(n - bytes_left(ps)));
        return NULL;
    }
    const uint8_t *p = ps->f->bytes + ps->pos;
    ps->pos += (size_t)n;
    return p;
}

static int read_u32(Parser *ps, uint32_t *v) {
    const uint8_t *p = take(ps, 4);
    if (!p) return -1;
    *v = le32(p);
    return 0;
}

static int read_u64(Parser *ps, uint64_t *v) {
    const uint8_t *p = take(ps, 8);
    if (!p) return -1;
    *v = le64(p);
    return 0;
}

/* A string: u64 length, then that many bytes. `what` names it in messages. */
static int read_string(Parser *ps, GgufString *s, const char *what) {
    uint64_t len;
    if (read_u64(ps, &len)) return -1;
    if (len > bytes_left(ps))
        return parse_fail(ps, "%s is %llu bytes long, past the end of the file (%zu bytes left)",
                          what, (ull)len, bytes_left(ps));
    s->ptr = (const char *)ps->f->bytes + ps->pos;
    s->len = (size_t)len;
    ps->pos += (size_t)len;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Metadata                                                                 */

static int skip_value(Parser *ps, uint32_t type, int depth);

/* An array's element type and count, checked: count elements of at least
 * min_value_size bytes each must fit in what is left of the file. */
static int read_array_header(Parser *ps, uint32_t *type, uint64_t *count, int depth) {
    if (depth > MAX_ARRAY_DEPTH)
        return parse_fail(ps, "arrays are nested more than %d deep", MAX_ARRAY_DEPTH);
    if (read_u32(ps, type) || read_u64(ps, count)) return -1;
    if (!value_type_known(*type)) return parse_fail(ps, "unknown array element type %u", *type);
    if (*count > bytes_left(ps) / min_value_size(*type))
        return parse_fail(ps, "an array of %llu %s elements runs past the end of the file "
                          "(%zu bytes left)", (ull)*count, VALUE_TYPE_NAMES[*type], bytes_left(ps));
    return 0;
}

static int skip_elements(Parser *ps, uint32_t type, uint64_t count, int depth) {
    if (VALUE_SIZES[type]) return take(ps, count * VALUE_SIZES[type]) ? 0 : -1; /* fits: checked */
    for (uint64_t i = 0; i < count; i++)
        if (skip_value(ps, type, depth)) return -1;
    return 0;
}

/* Steps over one value (of a known type); arrays are checked level by level. */
static int skip_value(Parser *ps, uint32_t type, int depth) {
    if (type == GGUF_VALUE_STRING) {
        GgufString s;
        return read_string(ps, &s, "a string value");
    }
    if (type == GGUF_VALUE_ARRAY) {
        uint32_t element_type;
        uint64_t count;
        if (read_array_header(ps, &element_type, &count, depth + 1)) return -1;
        return skip_elements(ps, element_type, count, depth + 1);
    }
    return take(ps, VALUE_SIZES[type]) ? 0 : -1;
}

/* Steps over a string array's elements, recording where each starts. */
static int index_strings(Parser *ps, GgufKV *kv) {
    /* count <= bytes left / 8 (read_array_header), so this size cannot overflow */
    kv->string_offsets = malloc(kv->array_count ? (size_t)kv->array_count * sizeof(size_t) : 1);
    if (!kv->string_offsets) return parse_fail(ps, "out of memory");
    for (uint64_t i = 0; i < kv->array_count; i++) {
        GgufString s;
        kv->string_offsets[i] = (size_t)(ps->f->bytes + ps->pos - kv->value);
        if (read_string(ps, &s, "a string element")) return -1;
    }
    return 0;
}

static int parse_kv(Parser *ps, size_t index, GgufKV *kv) {
    snprintf(ps->where, sizeof ps->where, "metadata entry %zu", index);
    if (read_string(ps, &kv->key, "its key")) return -1;
    snprintf(ps->where, sizeof ps->where, "key %s", gguf_show(kv->key).text);
    if (read_u32(ps, &kv->type)) return -1;
    if (!value_type_known(kv->type)) return parse_fail(ps, "unknown value type %u", kv->type);
    if (kv->type != GGUF_VALUE_ARRAY) {
        kv->value = ps->f->bytes + ps->pos;
        return skip_value(ps, kv->type, 0);
    }
    if (read_array_header(ps, &kv->array_type, &kv->array_count, 1)) return -1;
    kv->value = ps->f->bytes + ps->pos;
    if (kv->array_type == GGUF_VALUE_STRING) return index_strings(ps, kv);
    return skip_elements(ps, kv->array_type, kv->array_count, 1);
}

/* ------------------------------------------------------------------------ */
/* Sorted indexes: lookup and repeated names                                */

static int compare_strings(GgufString a, GgufString b) {
    int c = memcmp(a.ptr, b.ptr, a.len < b.len ? a.len : b.len);
    return c ? c : (a.len > b.len) - (a.len < b.len);
}

static int compare_kv_keys(const void *a, const void *b) {
    return compare_strings((*(GgufKV *const *)a)->key, (*(GgufKV *const *)b)->key);
}
static int compare_tensor_names(const void *a, const void *b) {
    return compare_strings((*(GgufTensor *const *)a)->name, (*(GgufTensor *const *)b)->name);
}
static int key_vs_kv(const void *key, const void *kv) {
    return compare_strings(*(const GgufString *)key, (*(GgufKV *const *)kv)->key);
}
static int name_vs_tensor(const void *name, const void *t) {
    return compare_strings(*(const GgufString *)name, (*(GgufTensor *const *)t)->name);
}

/* Sorts the index of the metadata by key; a key repeated is refused. */
static int index_keys(GgufFile *f) {
    f->kv_by_key = malloc((f->n_kv ? f->n_kv : 1) * sizeof *f->kv_by_key);
    if (!f->kv_by_key) return fail(f->name, "out of memory");
    for (size_t i = 0; i < f->n_kv; i++) f->kv_by_key[i] = &f->kv[i];
    if (f->n_kv) qsort(f->kv_by_key, f->n_kv, sizeof *f->kv_by_key, compare_kv_keys);
    for (size_t i = 1; i < f->n_kv; i++)
        if (!compare_kv_keys(&f->kv_by_key[i - 1], &f->kv_by_key[i]))
            return fail(f->name, "key %s appears twice", gguf_show(f->kv_by_key[i]->key).text);
    return 0;
}

/* Sorts the index of the tensors by name (a name repeated is refused). */
static int index_tensors(GgufFile *f) {
    size_t n = f->n_tensors;
    f->tensors_by_name = malloc((n ? n : 1) * sizeof(GgufTensor *));
    if (!f->tensors_by_name) return fail(f->name, "out of memory");
    for (size_t i = 0; i < n; i++) f->tensors_by_name[i] = &f->tensors[i];
    if (n) qsort(f->tensors_by_name, n, sizeof(GgufTensor *), compare_tensor_names);
    for (size_t i = 1; i < n; i++) {
        const GgufTensor *a = f->tensors_by_name[i - 1], *b = f->tensors_by_name[i];
        if (!compare_strings(a->name, b->name))
            return fail(f->name, "tensor name %s appears twice", gguf_show(b->name).text);
    }
    return 0;
}

const GgufKV *gguf_find_key(const GgufFile *f, const char *key) {
    GgufString wanted = {key, strlen(key)};
    if (!f->n_kv) return NULL;
    GgufKV *const *hit = bsearch(&wanted, f->kv_by_key, f->n_kv, sizeof *f->kv_by_key, key_vs_kv);
    return hit ? *hit : NULL;
}

const GgufTensor *gguf_find_tensor(const GgufFile *f, const char *name) {
    GgufString wanted = {name, strlen(name)};
    if (!f->n_tensors) return NULL;
    GgufTensor *const *hit = bsearch(&wanted, f->tensors_by_name, f->n_tensors,
                                     sizeof *f->tensors_by_name, name_vs_tensor);
    return hit ? *hit : NULL;
}

/* ------------------------------------------------------------------------ */
/* Tensor infos                                                             */

/* Checks the type and dims and sets n_elements and n_bytes, overflow-safe:
 * the element count must stay below 2^63 (as ggml requires). */
static int tensor_size(Parser *ps, GgufTensor *t) {
    const TensorType *type = tensor_type(t->type);
    char shape[128];
    format_dims(shape, sizeof shape, t->dims, t->n_dims);
    if (!type) return parse_fail(ps, "unknown tensor type %u", t->type);
    t->n_elements = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        if (t->dims[d] == 0) return parse_fail(ps, "dimension %d of shape %s is 0", d, shape);
        if (checked_mul(t->n_elements, t->dims[d], &t->n_elements) || t->n_elements > INT64_MAX)
            return parse_fail(ps, "the shape %s holds more than 2^63 elements", shape);
    }
    if (t->dims[0] % type->block_size)
        return parse_fail(ps, "its first dimension (%llu) is not a multiple of %s's block size %u",
                          (ull)t->dims[0], type->name, type->block_size);
    if (checked_mul(t->n_elements / type->block_size, type->type_size, &t->n_bytes))
        return parse_fail(ps, "the shape %s of type %s takes more than 2^64 bytes", shape, type->name);
    return 0;
}

static int parse_tensor_info(Parser *ps, size_t index, GgufTensor *t) {
    snprintf(ps->where, sizeof ps->where, "tensor info %zu", index);
    if (read_string(ps, &t->name, "its name")) return -1;
    snprintf(ps->where, sizeof ps->where, "tensor %s", gguf_show(t->name).text);
    if (read_u32(ps, &t->n_dims)) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return parse_fail(ps, "it has %u dimensions (GGUF tensors have 1 to %d)",
                          t->n_dims, GGUF_MAX_DIMS);
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->dims[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if (read_u64(ps, &t->dims[d])) return -1;
    if (read_u32(ps, &t->type) || read_u64(ps, &t->offset)) return -1;
    return tensor_size(ps, t);
}

/* As llama.cpp reads a file: in the order of their infos, each tensor's
 * data starts where the one before ends, padded to the alignment, and the
 * data section ends with the last one (padded or not). A type or a shape
 * changed in a tensor's info changes its size, and shows here. */
static int tensors_tile_data(const GgufFile *f) {
    uint64_t a = f->alignment, expected = 0, end = 0;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const GgufTensor *t = &f->tensors[i];
        if (t->offset != expected && i == 0)
            return fail(f->name, "tensor %s, the first, starts its data at %llu, not at 0", gguf_show(t->name).text,
                        (ull)t->offset);
        if (t->offset != expected) {
            const GgufTensor *before = &f->tensors[i - 1];
            return fail(f->name, "tensor %s's data starts at %llu, but the tensor before it, %s (%llu bytes of "
                        "%s), ends at %llu: a type or shape in the file does not match its data",
                        gguf_show(t->name).text, (ull)t->offset, gguf_show(before->name).text, (ull)before->n_bytes,
                        gguf_tensor_type_name(before->type), (ull)end);
        }
        end = expected + t->n_bytes;
        expected = end + (a - end % a) % a;  /* no overflow: place_tensors kept every tensor inside the file */
    }
    size_t data = f->size - f->data_start;  /* at least end: place_tensors kept every tensor inside */
    if (f->n_tensors && data > expected)
        return fail(f->name, "its data section holds %zu bytes, more than the %llu its tensors take: a type "
                    "or shape in the file does not match its data", data, (ull)expected);
    return 0;
}

/* The data section starts at the first multiple of the alignment after the
 * tensor infos; each tensor's offset must be aligned and its bytes inside
 * the file. */
static int place_tensors(GgufFile *f, size_t infos_end) {
    uint64_t a = f->alignment, start = infos_end + (a - infos_end % a) % a;
    if (start < infos_end || start > f->size) {          /* wrapped, or past the end */
        if (f->n_tensors) return fail(f->name, "the file is truncated: its tensor data "
                                      "would start past its end (%zu bytes)", f->size);
        start = f->size;
    }
    f->data_start = (size_t)start;
    size_t room = f->size - f->data_start;
    for (size_t i = 0; i < f->n_tensors; i++) {
        GgufTensor *t = &f->tensors[i];
        if (t->offset % a)
            return fail(f->name, "tensor %s's offset %llu is not a multiple of the alignment %llu",
                        gguf_show(t->name).text, (ull)t->offset, (ull)a);
        if (t->offset > room || t->n_bytes > room - t->offset)
            return fail(f->name, "tensor %s's data (%llu bytes at data offset %llu) runs past "
                        "the end of the file (the data section holds %zu bytes)",
                        gguf_show(t->name).text, (ull)t->n_bytes, (ull)t->offset, room);
        t->data = f->bytes + f->data_start + t->offset;
    }
    return tensors_tile_data(f);
}

/* ------------------------------------------------------------------------ */
/* Opening                                                                  */

/* Magic, version and the two counts; a count that cannot fit in the bytes
 * left (a metadata entry takes at least 13, a tensor info 32) is refused
 * before anything is allocated for it. */
static int parse_header(Parser *ps, uint64_t *n_kv, uint64_t *n_tensors) {
    snprintf(ps->where, sizeof ps->where, "the header");
    const uint8_t *magic = take(ps, 4);
    if (!magic) return -1;
    if (memcmp(magic, "GGUF", 4))
        return parse_fail(ps, "not a GGUF file (it starts with bytes %02x %02x %02x %02x, not "
                          "\"GGUF\")", magic[0], magic[1], magic[2], magic[3]);
    uint32_t version, swapped;
    if (read_u32(ps, &version)) return -1;
    swapped = version >> 24 | (version >> 8 & 0xff00) | (version << 8 & 0xff0000) | version << 24;
    if (version != 2 && version != 3)
        return parse_fail(ps, "unsupported GGUF version %u (this reader reads versions 2 and 3%s)",
                          version, swapped == 2 || swapped == 3 ? ", little-endian" : "");
    ps->f->version = version;
    if (read_u64(ps, n_tensors) || read_u64(ps, n_kv)) return -1;
    if (*n_kv > bytes_left(ps) / 13)
        return parse_fail(ps, "kv_count %llu cannot fit in the %zu bytes left (a truncated "
                          "or corrupt file)", (ull)*n_kv, bytes_left(ps));
    if (*n_tensors > bytes_left(ps) / 32)
        return parse_fail(ps, "tensor_count %llu cannot fit in the %zu bytes left (a truncated "
                          "or corrupt file)", (ull)*n_tensors, bytes_left(ps));
    return 0;
}

/* general.alignment (any integer type), a power of two; 32 when absent. */
static int read_alignment(GgufFile *f) {
    uint64_t a = DEFAULT_ALIGNMENT;
    if (gguf_find_key(f, "general.alignment") && gguf_get_uint(f, "general.alignment", &a))
        return -1;
    if (a == 0 || (a & (a - 1)))
        return fail(f->name, "general.alignment is %llu, not a power of two", (ull)a);
    f->alignment = a;
    return 0;
}

static int parse(GgufFile *f) {
    Parser ps = {f, 0, ""};
    uint64_t n_kv, n_tensors;
    if (parse_header(&ps, &n_kv, &n_tensors)) return -1;
    f->n_kv = (size_t)n_kv;                      /* both fit: bounded by the file's size */
    f->n_tensors = (size_t)n_tensors;
    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors) return fail(f->name, "out of memory");
    for (size_t i = 0; i < f->n_kv; i++)
        if (parse_kv(&ps, i, &f->kv[i])) return -1;
    if (index_keys(f) || read_alignment(f)) return -1;
    for (size_t i = 0; i < f->n_tensors; i++)
        if (parse_tensor_info(&ps, i, &f->tensors[i])) return -1;
    if (place_tensors(f, ps.pos)) return -1;
    return index_tensors(f);
}

int gguf_open_memory(GgufFile *f, const uint8_t *bytes, size_t size, const char *name) {
    memset(f, 0, sizeof *f);
    size_t name_len = strlen(name);
    f->name = malloc(name_len + 1);
    if (!f->name) return fail(name, "out of memory");
    memcpy(f->name, name, name_len + 1);
    f->bytes = bytes;
    f->size = size;
    if (parse(f)) {
        gguf_close(f);
        return -1;
    }
    return 0;
}

/* The whole file into a malloc'd buffer. */
static int read_file(const char *path, uint8_t **bytes, size_t *size) {
    FILE *in = fopen(path, "rb");
    if (!in) return fail(NULL, "cannot open %s: %s", path, strerror(errno));
    long end = -1;
    if (fgetc(in) == EOF && ferror(in)) {          /* a directory opens but cannot be read */
        fail(NULL, "cannot read %s: %s", path, strerror(errno));
        fclose(in);
        return -1;
    }
    if (fseek(in, 0, SEEK_END) == 0) end = ftell(in);
    if (end < 0 || fseek(in, 0, SEEK_SET) != 0) {
        fclose(in);
        return fail(NULL, "cannot find the size of %s (not a regular file?)", path);
    }
    *size = (size_t)end;
    *bytes = malloc(*size ? *size : 1);
    size_t got = *bytes ? fread(*bytes, 1, *size, in) : 0;
    fclose(in);
    if (!*bytes) return fail(NULL, "out of memory reading %s (%zu bytes)", path, *size);
    if (got != *size) {
        free(*bytes);
        return fail(NULL, "reading %s failed after %zu of %zu bytes", path, got, *size);
    }
    return 0;
}

int gguf_open(GgufFile *f, const char *path) {
    uint8_t *bytes = NULL;
    size_t size = 0;
    memset(f, 0, sizeof *f);
    if (read_file(path, &bytes, &size)) return -1;
    if (gguf_open_memory(f, bytes, size, path)) {
        free(bytes);
        return -1;
    }
    f->owned = bytes;
    return 0;
}

void gguf_close(GgufFile *f) {
    if (f->kv)
        for (size_t i = 0; i < f->n_kv; i++) free(f->kv[i].string_offsets);
    free(f->kv);
    free(f->kv_by_key);
    free(f->tensors);
    free(f->tensors_by_name);
    free(f->owned);
    free(f->name);
    memset(f, 0, sizeof *f);
}

/* ------------------------------------------------------------------------ */
/* Metadata values                                                          */

/* The value at p of integer type `type`: *is_signed, and the value in *u
 * (unsigned types) or *s (signed types). -1 when type is not an integer type. */
static int decode_integer(uint32_t type, const uint8_t *p, int *is_signed, uint64_t *u, int64_t *s) {
    int bits;
    switch (type) {
    case GGUF_VALUE_UINT8:  case GGUF_VALUE_INT8:  bits = 8;  *u = p[0];     break;
    case GGUF_VALUE_UINT16: case GGUF_VALUE_INT16: bits = 16; *u = le16(p);  break;
    case GGUF_VALUE_UINT32: case GGUF_VALUE_INT32: bits = 32; *u = le32(p);  break;
    case GGUF_VALUE_UINT64: case GGUF_VALUE_INT64: bits = 64; *u = le64(p);  break;
    default: return -1;
    }
    *is_signed = type == GGUF_VALUE_INT8 || type == GGUF_VALUE_INT16 ||
                 type == GGUF_VALUE_INT32 || type == GGUF_VALUE_INT64;
    *s = sign_extend(*u, bits);
    return 0;
}

/* The converters below are shared by the scalar getters and the array
 * element getters; `what` names the value in messages ("key X" or
 * "element I of key X") and file the file (NULL for array elements). */
static int value_as_uint(const char *file, const char *what, uint32_t type, const uint8_t *p,
                         uint64_t *out) {
    int is_signed;
    uint64_t u;
    int64_t s;
    if (decode_integer(type, p, &is_signed, &u, &s))
        return fail(file, "%s has type %s, not an integer type", what, gguf_value_type_name(type));
    if (is_signed && s < 0)
        return fail(file, "%s is %lld (%s); wanted an unsigned integer", what, (long long)s,
                    gguf_value_type_name(type));
    *out = is_signed ? (uint64_t)s : u;
    return 0;
}

static int value_as_int(const char *file, const char *what, uint32_t type, const uint8_t *p,
                        int64_t *out) {
    int is_signed;
    uint64_t u;
    int64_t s;
    if (decode_integer(type, p, &is_signed, &u, &s))
        return fail(file, "%s has type %s, not an integer type", what, gguf_value_type_name(type));
    if (!is_signed && u > INT64_MAX)
        return fail(file, "%s is %llu (uint64), past the int64 range", what, (ull)u);
    *out = is_signed ? s : (int64_t)u;
    return 0;
}

static int value_as_float(const char *file, const char *what, uint32_t type, const uint8_t *p,
                          double *out) {
    if (type == GGUF_VALUE_FLOAT32) *out = float_from_bits(le32(p));
    else if (type == GGUF_VALUE_FLOAT64) *out = double_from_bits(le64(p));
    else return fail(file, "%s has type %s, not float32 or float64", what, gguf_value_type_name(type));
    return 0;
}

/* The scalar entry for key, or NULL with a sentence when it is missing;
 * `what` receives "key <key>" for messages. */
static const GgufKV *require_key(const GgufFile *f, const char *key, char *what, size_t cap) {
    const GgufKV *kv = gguf_find_key(f, key);
    snprintf(what, cap, "key %s", key);
    if (!kv) fail(f->name, "key %s is missing", key);
    return kv;
}

int gguf_get_uint(const GgufFile *f, const char *key, uint64_t *out) {
    char what[MESSAGE_ROOM];
    const GgufKV *kv = require_key(f, key, what, sizeof what);
    return kv ? value_as_uint(f->name, what, kv->type, kv->value, out) : -1;
}

int gguf_get_int(const GgufFile *f, const char *key, int64_t *out) {
    char what[MESSAGE_ROOM];
    const GgufKV *kv = require_key(f, key, what, sizeof what);
    return kv ? value_as_int(f->name, what, kv->type, kv->value, out) : -1;
}

int gguf_get_float(const GgufFile *f, const char *key, double *out) {
    char what[MESSAGE_ROOM];
    const GgufKV *kv = require_key(f, key, what, sizeof what);
    return kv ? value_as_float(f->name, what, kv->type, kv->value, out) : -1;
}

int gguf_get_bool(const GgufFile *f, const char *key, int *out) {
    char what[MESSAGE_ROOM];
    const GgufKV *kv = require_key(f, key, what, sizeof what);
    if (!kv) return -1;
    if (kv->type != GGUF_VALUE_BOOL)
        return fail(f->name, "%s has type %s, not bool", what, gguf_value_type_name(kv->type));
    if (kv->value[0] > 1)
        return fail(f->name, "%s holds the byte %u, not a bool (0 or 1)", what, kv->value[0]);
    *out = kv->value[0];
    return 0;
}

/* A string value at p (its u64 length, then the bytes: checked when parsed). */
static GgufString string_at(const uint8_t *p) {
    GgufString s = {(const char *)p + 8, (size_t)le64(p)};
    return s;
}

int gguf_get_string(const GgufFile *f, const char *key, GgufString *out) {
    char what[MESSAGE_ROOM];
    const GgufKV *kv = require_key(f, key, what, sizeof what);
    if (!kv) return -1;
    if (kv->type != GGUF_VALUE_STRING)
        return fail(f->name, "%s has type %s, not string", what, gguf_value_type_name(kv->type));
    *out = string_at(kv->value);
    return 0;
}

const GgufKV *gguf_get_array(const GgufFile *f, const char *key) {
    char what[MESSAGE_ROOM];
    const GgufKV *kv = require_key(f, key, what, sizeof what);
    if (kv && kv->type != GGUF_VALUE_ARRAY) {
        fail(f->name, "%s has type %s, not array", what, gguf_value_type_name(kv->type));
        return NULL;
    }
    return kv;
}

/* Element i of an array of a fixed-size type: checks i and names it in what. */
static const uint8_t *array_element(const GgufKV *a, uint64_t i, char *what, size_t cap) {
    snprintf(what, cap, "element %llu of key %s", (ull)i, gguf_show(a->key).text);
    if (a->type != GGUF_VALUE_ARRAY) {
        fail(NULL, "key %s has type %s, not array", gguf_show(a->key).text, gguf_value_type_name(a->type));
        return NULL;
    }
    if (i >= a->array_count) {
        fail(NULL, "%s is past the end of the array (%llu elements)", what, (ull)a->array_count);
        return NULL;
    }
    if (a->array_type == GGUF_VALUE_STRING) return a->value + a->string_offsets[i];
    if (a->array_type == GGUF_VALUE_ARRAY) return a->value;  /* refused by the caller's type check */
    return a->value + i * VALUE_SIZES[a->array_type];
}

int gguf_array_int(const GgufKV *array, uint64_t i, int64_t *out) {
    char what[MESSAGE_ROOM];
    const uint8_t *p = array_element(array, i, what, sizeof what);
    return p ? value_as_int(NULL, what, array->array_type, p, out) : -1;
}

int gguf_array_float(const GgufKV *array, uint64_t i, double *out) {
    char what[MESSAGE_ROOM];
    const uint8_t *p = array_element(array, i, what, sizeof what);
    return p ? value_as_float(NULL, what, array->array_type, p, out) : -1;
}

int gguf_array_string(const GgufKV *array, uint64_t i, GgufString *out) {
    char what[MESSAGE_ROOM];
    const uint8_t *p = array_element(array, i, what, sizeof what);
    if (!p) return -1;
    if (array->array_type != GGUF_VALUE_STRING)
        return fail(NULL, "%s has type %s, not string", what, gguf_value_type_name(array->array_type));
    *out = string_at(p);
    return 0;
}

int gguf_string_equals(GgufString s, const char *text) {
    return strlen(text) == s.len && memcmp(s.ptr, text, s.len) == 0;
}

char *gguf_string_dup(GgufString s) {
    char *copy = malloc(s.len + 1);           /* s.len < the file's size: no overflow */
    if (!copy) {
        fail(NULL, "out of memory copying a string of %zu bytes", s.len);
        return NULL;
    }
    memcpy(copy, s.ptr, s.len);
    copy[s.len] = '\0';
    return copy;
}

/* ------------------------------------------------------------------------ */
/* Dequantization                                                           */

/* IEEE half precision (1 sign, 5 exponent, 10 mantissa bits) to float,
 * exactly, with no compiler half type:
 *   exponent 0:  (-1)^s * m * 2^-24       zero and subnormals
 *   exponent 31: infinity (m = 0) or NaN  (payload kept, not quieted)
 *   otherwise:   (-1)^s * (1 + m/1024) * 2^(e-15): the same bits with the
 *                exponent rebiased from 15 to 127 (+112). */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = h >> 10 & 0x1f, mantissa = h & 0x3ff;
    if (exponent == 0) {
        float magnitude = (float)mantissa * 0x1p-24f;   /* exact: mantissa < 2^10 */
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 31) return float_from_bits(sign | 0x7f800000u | mantissa << 13);
    return float_from_bits(sign | (exponent + 112) << 23 | mantissa << 13);
}

static float half_at(const uint8_t *p) { return half_to_float(le16(p)); }

/* 4-bit value i of a 32-weight group packed in 16 bytes: weights 0..15 in
 * the low nibbles of q[0..15], weights 16..31 in the high nibbles. */
static int nibble(const uint8_t *q, int i) { return i < 16 ? q[i] & 15 : q[i - 16] >> 4; }

static int as_int8(uint8_t x) { return x < 128 ? x : x - 256; }

/* F32: 4 bytes. F16: 2 bytes, half_to_float. BF16: 2 bytes, the top half of
 * a float's bits. */
static void dequantize_f32(const uint8_t *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = float_from_bits(le32(b + 4 * i));
}
static void dequantize_f16(const uint8_t *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = half_at(b + 2 * i);
}
static void dequantize_bf16(const uint8_t *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = float_from_bits((uint32_t)le16(b + 2 * i) << 16);
}

/* Q8_0, 32 weights in 34 bytes: fp16 d, int8 q[32].   y_j = d * q_j */
static void dequantize_q8_0(const uint8_t *b, float *y, size_t n_blocks) {
    for (size_t i = 0; i < n_blocks; i++, b += 34, y += 32) {
        float d = half_at(b);
        for (int j = 0; j < 32; j++) y[j] = d * (float)as_int8(b[2 + j]);
    }
}

/* Q4_0, 32 weights in 18 bytes: fp16 d, 16 bytes of 4-bit q (see nibble).
 *   y_j = d * (q_j - 8) */
static void dequantize_q4_0(const uint8_t *b, float *y, size_t n_blocks) {
    for (size_t i = 0; i < n_blocks; i++, b += 18, y += 32) {
        float d = half_at(b);
        for (int j = 0; j < 32; j++) y[j] = d * (float)(nibble(b + 2, j) - 8);
    }
}

/* Q4_1, 32 weights in 20 bytes: fp16 d, fp16 m, 16 bytes of 4-bit q.
 *   y_j = d * q_j + m */
static void dequantize_q4_1(const uint8_t *b, float *y, size_t n_blocks) {
    for (size_t i = 0; i < n_blocks; i++, b += 20, y += 32) {
        float d = half_at(b), m = half_at(b + 2);
        for (int j = 0; j < 32; j++) y[j] = d * (float)nibble(b + 4, j) + m;
    }
}

/* The K-quants hold 256 weights per block ("super-block") in sub-blocks
 * with their own scales. Q4_K and Q5_K pack 8 six-bit scales sc_s and 8
 * six-bit mins mn_s (one per sub-block s of 32 weights) in 12 bytes:
 *   s < 4:  sc = byte[s] & 63,   mn = byte[s+4] & 63
 *   s >= 4: sc = (byte[s+4] & 15) | (byte[s-4] >> 6) << 4,
 *           mn = (byte[s+4] >> 4) | (byte[s]   >> 6) << 4 */
static void k_scale_min(const uint8_t *s12, int s, int *sc, int *mn) {
    if (s < 4) {
        *sc = s12[s] & 63;
        *mn = s12[s + 4] & 63;
    } else {
        *sc = (s12[s + 4] & 15) | (s12[s - 4] >> 6) << 4;
        *mn = (s12[s + 4] >> 4) | (s12[s] >> 6) << 4;
    }
}

/* Q4_K, 256 weights in 144 bytes: fp16 d, fp16 dmin, 12 bytes of scales and
 * mins, 128 bytes of 4-bit q. Sub-blocks 2k and 2k+1 (32 weights each) take
 * the low and the high nibbles of bytes 32k..32k+31.
 *   y = (d * sc_s) * q - dmin * mn_s */
static void dequantize_q4_k(const uint8_t *b, float *y, size_t n_blocks) {
    for (size_t i = 0; i < n_blocks; i++, b += 144, y += 256) {
        float d = half_at(b), dmin = half_at(b + 2);
        const uint8_t *scales = b + 4, *q = b + 16;
        for (int s = 0; s < 8; s++) {
            int sc, mn;
            k_scale_min(scales, s, &sc, &mn);
            float scale = d * (float)sc, min = dmin * (float)mn;
            for (int l = 0; l < 32; l++) {
                int low = q[32 * (s / 2) + l];
                y[32 * s + l] = scale * (float)(s % 2 ? low >> 4 : low & 15) - min;
            }
        }
    }
}

/* Q5_K, 256 weights in 176 bytes: fp16 d, fp16 dmin, 12 bytes of scales and
 * mins, 32 bytes qh of high bits, 128 bytes of 4-bit low parts laid out as
 * in Q4_K. Weight l of sub-block s takes bit s of qh[l] as its fifth bit.
 *   y = (d * sc_s) * (low | high << 4) - dmin * mn_s */
static void dequantize_q5_k(const uint8_t *b, float *y, size_t n_blocks) {
    for (size_t i = 0; i < n_blocks; i++, b += 176, y += 256) {
        float d = half_at(b), dmin = half_at(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *q = b + 48;
        for (int s = 0; s < 8; s++) {
            int sc, mn;
            k_scale_min(scales, s, &sc, &mn);
            float scale = d * (float)sc, min = dmin * (float)mn;
            for (int l = 0; l < 32; l++) {
                int low = q[32 * (s / 2) + l], high = qh[l] >> s & 1;
                y[32 * s + l] = scale * (float)((s % 2 ? low >> 4 : low & 15) | high << 4) - min;
            }
        }
    }
}

/* Q6_K, 256 weights in 210 bytes: 128 bytes ql of low 4 bits, 64 bytes qh of
 * high 2 bits, 16 int8 scales (one per 16 weights), fp16 d. Each half h of
 * 128 weights uses ql[64h..64h+63], qh[32h..32h+31], scales[8h..8h+7]; its
 * weight 32k + l (k < 4, l < 32) has
 *   low  = nibble (k >= 2 ? high : low) of ql[64h + l + 32 (k % 2)]
 *   high = bits 2k, 2k+1 of qh[32h + l]
 *   y = (d * scale[8h + 2k + l/16]) * ((low | high << 4) - 32) */
static void dequantize_q6_k(const uint8_t *b, float *y, size_t n_blocks) {
    for (size_t i = 0; i < n_blocks; i++, b += 210, y += 256) {
        const uint8_t *ql = b, *qh = b + 128, *scales = b + 192;
        float d = half_at(b + 208);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++) {
                    int low = ql[64 * h + l + 32 * (k % 2)], high = qh[32 * h + l] >> 2 * k & 3;
                    int q = ((k >= 2 ? low >> 4 : low & 15) | high << 4) - 32;
                    float scale = d * (float)as_int8(scales[8 * h + 2 * k + l / 16]);
                    y[128 * h + 32 * k + l] = scale * (float)q;
                }
    }
}

/* Every type id ggml knows, with its block size and bytes per block (the
 * sizes gguf_open needs to place a tensor); only some are dequantized. */
static const TensorType TENSOR_TYPES[] = {
    [0]  = {"F32", 1, 4, dequantize_f32},        [1]  = {"F16", 1, 2, dequantize_f16},
    [2]  = {"Q4_0", 32, 18, dequantize_q4_0},    [3]  = {"Q4_1", 32, 20, dequantize_q4_1},
    [6]  = {"Q5_0", 32, 22, NULL},               [7]  = {"Q5_1", 32, 24, NULL},
    [8]  = {"Q8_0", 32, 34, dequantize_q8_0},    [9]  = {"Q8_1", 32, 36, NULL},
    [10] = {"Q2_K", 256, 84, NULL},              [11] = {"Q3_K", 256, 110, NULL},
    [12] = {"Q4_K", 256, 144, dequantize_q4_k},  [13] = {"Q5_K", 256, 176, dequantize_q5_k},
    [14] = {"Q6_K", 256, 210, dequantize_q6_k},  [15] = {"Q8_K", 256, 292, NULL},
    [16] = {"IQ2_XXS", 256, 66, NULL},           [17] = {"IQ2_XS", 256, 74, NULL},
    [18] = {"IQ3_XXS", 256, 98, NULL},           [19] = {"IQ1_S", 256, 50, NULL},
    [20] = {"IQ4_NL", 32, 18, NULL},             [21] = {"IQ3_S", 256, 110, NULL},
    [22] = {"IQ2_S", 256, 82, NULL},             [23] = {"IQ4_XS", 256, 136, NULL},
    [24] = {"I8", 1, 1, NULL},                   [25] = {"I16", 1, 2, NULL},
    [26] = {"I32", 1, 4, NULL},                  [27] = {"I64", 1, 8, NULL},
    [28] = {"F64", 1, 8, NULL},                  [29] = {"IQ1_M", 256, 56, NULL},
    [30] = {"BF16", 1, 2, dequantize_bf16},      [34] = {"TQ1_0", 256, 54, NULL},
    [35] = {"TQ2_0", 256, 66, NULL},             [39] = {"MXFP4", 32, 17, NULL},
    [40] = {"NVFP4", 64, 36, NULL},              [41] = {"Q1_0", 128, 18, NULL},
};

static const TensorType *tensor_type(uint32_t type) {
    size_t n = sizeof TENSOR_TYPES / sizeof TENSOR_TYPES[0];
    return type < n && TENSOR_TYPES[type].name ? &TENSOR_TYPES[type] : NULL;
}

int gguf_dequantize(const GgufTensor *t, float *out, size_t out_len) {
    const TensorType *type = tensor_type(t->type);
    if (!type || !type->dequantize)
        return fail(NULL, "tensor %s has type %s (%u), which this reader cannot dequantize "
                    "(it reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K)",
                    gguf_show(t->name).text, gguf_tensor_type_name(t->type), t->type);
    if (out_len != t->n_elements)
        return fail(NULL, "tensor %s holds %llu values but the buffer given holds %zu",
                    gguf_show(t->name).text, (ull)t->n_elements, out_len);
    type->dequantize(t->data, out, (size_t)(t->n_elements / type->block_size));
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Llama models                                                             */

/* "<arch>.<suffix>" into key (cap bytes). */
static const char *arch_key(char *key, size_t cap, const char *arch, const char *suffix) {
    snprintf(key, cap, "%s.%s", arch, suffix);
    return key;
}

/* <arch>.<suffix> as an int in [1, INT_MAX]; when the key is absent,
 * fallback (a missing key is refused when fallback is 0). */
static int read_count(const GgufFile *f, const char *arch, const char *suffix, int fallback,
                      int *out) {
    char key[96];
    uint64_t v;
    arch_key(key, sizeof key, arch, suffix);
    if (!gguf_find_key(f, key)) {
        *out = fallback;
        return fallback ? 0 : fail(f->name, "key %s is missing", key);
    }
    if (gguf_get_uint(f, key, &v)) return -1;
    if (v < 1 || v > INT_MAX) return fail(f->name, "key %s is %llu, not in 1..%d", key, (ull)v, INT_MAX);
    *out = (int)v;
    return 0;
}

/* <arch>.<suffix> as a positive finite float; fallback when absent. */
static int read_positive(const GgufFile *f, const char *arch, const char *suffix, double fallback,
                         float *out) {
    char key[96];
    double v = fallback;
    arch_key(key, sizeof key, arch, suffix);
    if (gguf_find_key(f, key) && gguf_get_float(f, key, &v)) return -1;
    if (!(v > 0 && v <= 3.4e38)) return fail(f->name, "key %s is %g, not a positive float", key, v);
    *out = (float)v;
    return 0;
}

/* general.architecture must be llama or mistral (the same keys under its
 * own prefix); arch receives it. */
static int read_architecture(const GgufFile *f, char arch[16]) {
    GgufString name;
    if (gguf_get_string(f, "general.architecture", &name)) return -1;
    if (!gguf_string_equals(name, "llama") && !gguf_string_equals(name, "mistral"))
        return fail(f->name, "the architecture is %s; this reader reads llama (and mistral) "
                    "models", gguf_show(name).text);
    memcpy(arch, name.ptr, name.len);
    arch[name.len] = '\0';
    return 0;
}

/* Things a Llama forward pass as written here cannot do: a mixture of
 * experts, rope scaling, partial rotary embeddings. */
static int refuse_variants(const GgufFile *f, const char *arch, const GgufLlamaConfig *c) {
    char key[96];
    uint64_t experts = 0, rope_dims = (uint64_t)c->head_size;
    GgufString scaling = {"none", 4};
    if (gguf_find_key(f, arch_key(key, sizeof key, arch, "expert_count")) &&
        gguf_get_uint(f, key, &experts)) return -1;
    if (experts > 0) return fail(f->name, "%s is %llu: mixtures of experts are not supported", key, (ull)experts);
    if (gguf_find_key(f, arch_key(key, sizeof key, arch, "rope.scaling.type")) &&
        gguf_get_string(f, key, &scaling)) return -1;
    if (!gguf_string_equals(scaling, "none"))
        return fail(f->name, "%s is %s: rope scaling is not supported", key, gguf_show(scaling).text);
    if (gguf_find_tensor(f, "rope_freqs.weight"))
        return fail(f->name, "the model has rope_freqs.weight: rope frequency factors are not supported");
    if (gguf_find_key(f, arch_key(key, sizeof key, arch, "rope.dimension_count")) &&
        gguf_get_uint(f, key, &rope_dims)) return -1;
    if (rope_dims != (uint64_t)c->head_size)
        return fail(f->name, "%s is %llu but the head size is %d: partial rotary embeddings are "
                    "not supported", key, (ull)rope_dims, c->head_size);
    return 0;
}

/* The sizes and their relations: D = H * d with d even, G divides H, and
 * the optional key/value lengths equal d. */
static int read_llama_sizes(const GgufFile *f, const char *arch, GgufLlamaConfig *c) {
    int key_length, value_length;
    if (read_count(f, arch, "block_count", 0, &c->n_layers) ||
        read_count(f, arch, "embedding_length", 0, &c->dim) ||
        read_count(f, arch, "feed_forward_length", 0, &c->hidden_dim) ||
        read_count(f, arch, "context_length", 0, &c->context_length) ||
        read_count(f, arch, "attention.head_count", 0, &c->n_heads) ||
        read_count(f, arch, "attention.head_count_kv", c->n_heads, &c->n_kv_heads)) return -1;
    if (c->dim % c->n_heads)
        return fail(f->name, "the embedding length %d is not a multiple of the head count %d",
                    c->dim, c->n_heads);
    c->head_size = c->dim / c->n_heads;
    if (c->n_heads % c->n_kv_heads)
        return fail(f->name, "the head count %d is not a multiple of the KV head count %d",
                    c->n_heads, c->n_kv_heads);
    if (c->head_size % 2) return fail(f->name, "the head size %d is odd (RoPE rotates pairs)", c->head_size);
    if (read_count(f, arch, "attention.key_length", c->head_size, &key_length) ||
        read_count(f, arch, "attention.value_length", c->head_size, &value_length)) return -1;
    if (key_length != c->head_size || value_length != c->head_size)
        return fail(f->name, "the key and value lengths (%d, %d) differ from embedding_length / "
                    "head_count = %d", key_length, value_length, c->head_size);
    return refuse_variants(f, arch, c);
}

/* V from <arch>.vocab_size or the number of tokenizer.ggml.tokens (which
 * must agree when both are there). */
static int read_vocab_size(const GgufFile *f, const char *arch, GgufLlamaConfig *c) {
    char key[96];
    const GgufKV *tokens = NULL;
    if (gguf_find_key(f, "tokenizer.ggml.tokens") && !(tokens = gguf_get_array(f, "tokenizer.ggml.tokens")))
        return -1;
    if (gguf_find_key(f, arch_key(key, sizeof key, arch, "vocab_size"))) {
        if (read_count(f, arch, "vocab_size", 0, &c->vocab_size)) return -1;
        if (tokens && tokens->array_count != (uint64_t)c->vocab_size)
            return fail(f->name, "%s is %d but tokenizer.ggml.tokens holds %llu tokens", key,
                        c->vocab_size, (ull)tokens->array_count);
        return 0;
    }
    if (!tokens) return fail(f->name, "neither %s nor tokenizer.ggml.tokens gives the vocabulary size", key);
    if (tokens->array_count < 1 || tokens->array_count > INT_MAX)
        return fail(f->name, "tokenizer.ggml.tokens holds %llu tokens, not 1..%d",
                    (ull)tokens->array_count, INT_MAX);
    c->vocab_size = (int)tokens->array_count;
    return 0;
}

/* Every tokenizer.ggml.*_token_id the file gives (bos, eos, unknown,
 * padding, ...) must name a token of the vocabulary. */
static int check_special_ids(const GgufFile *f, int vocab_size) {
    static const char prefix[] = "tokenizer.ggml.", suffix[] = "_token_id";
    size_t np = sizeof prefix - 1, ns = sizeof suffix - 1;
    for (size_t i = 0; i < f->n_kv; i++) {
        GgufString key = f->kv[i].key;
        if (key.len <= np + ns || memcmp(key.ptr, prefix, np) || memcmp(key.ptr + key.len - ns, suffix, ns)) continue;
        char name[GGUF_MAX_SHOWN + 1];
        if (key.len > GGUF_MAX_SHOWN) return fail(f->name, "key %s is too long", gguf_show(key).text);
        memcpy(name, key.ptr, key.len);
        name[key.len] = 0;
        uint64_t id;
        if (gguf_get_uint(f, name, &id)) return -1;
        if (id >= (uint64_t)vocab_size)
            return fail(f->name, "%s = %llu is not a token id (vocabulary of %d)", gguf_show(key).text, (ull)id,
                        vocab_size);
    }
    return 0;
}

/* Tensor `name` must have shape [ne0] (ne1 = 0) or [ne0, ne1] and a type
 * gguf_dequantize reads. 1 when it does, 0 when it is absent and optional,
 * -1 with a sentence otherwise. */
static int check_tensor(const GgufFile *f, const char *name, uint64_t ne0, uint64_t ne1, int optional) {
    const GgufTensor *t = gguf_find_tensor(f, name);
    uint64_t want[GGUF_MAX_DIMS] = {ne0, ne1 ? ne1 : 1, 1, 1};
    char got_shape[128], want_shape[128];
    if (!t) return optional ? 0 : fail(f->name, "tensor %s is missing", name);
    if (memcmp(t->dims, want, sizeof want))
        return fail(f->name, "tensor %s has shape %s; this model needs %s", name,
                    format_dims(got_shape, sizeof got_shape, t->dims, t->n_dims),
                    format_dims(want_shape, sizeof want_shape, want, ne1 ? 2 : 1));
    if (!gguf_can_dequantize(t->type))
        return fail(f->name, "tensor %s has type %s, which this reader cannot dequantize", name,
                    gguf_tensor_type_name(t->type));
    return 1;
}

enum { SIZE_D = 1, SIZE_F, SIZE_KVD };      /* the sizes in the table below; 0: none */

static const struct { const char *name; int ne0, ne1; } LAYER_TENSORS[] = {
    {"attn_norm", SIZE_D, 0},     {"attn_q", SIZE_D, SIZE_D},   {"attn_k", SIZE_D, SIZE_KVD},
    {"attn_v", SIZE_D, SIZE_KVD}, {"attn_output", SIZE_D, SIZE_D}, {"ffn_norm", SIZE_D, 0},
    {"ffn_gate", SIZE_D, SIZE_F}, {"ffn_up", SIZE_D, SIZE_F},   {"ffn_down", SIZE_F, SIZE_D},
};

/* 1 when the tensor is one of a llama model of n_layers blocks. */
static int llama_uses(const GgufTensor *t, int n_layers) {
    char name[64];
    if (t->name.len >= sizeof name) return 0;
    memcpy(name, t->name.ptr, t->name.len);
    name[t->name.len] = 0;
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "output_norm.weight") || !strcmp(name, "output.weight"))
        return 1;
    int layer, used = 0;
    char part[64];
    if (sscanf(name, "blk.%d.%63[a-z_].weight%n", &layer, part, &used) != 2 || used != (int)t->name.len ||
        layer < 0 || layer >= n_layers) return 0;
    char canonical[96];
    snprintf(canonical, sizeof canonical, "blk.%d.%s.weight", layer, part);  /* no "blk.01" or "blk.+1" */
    if (strcmp(canonical, name)) return 0;
    for (size_t i = 0; i < sizeof LAYER_TENSORS / sizeof LAYER_TENSORS[0]; i++)
        if (!strcmp(part, LAYER_TENSORS[i].name)) return 1;
    return 0;
}

static int check_llama_tensors(const GgufFile *f, GgufLlamaConfig *c) {
    uint64_t D = (uint64_t)c->dim, V = (uint64_t)c->vocab_size;
    uint64_t sizes[] = {0, D, (uint64_t)c->hidden_dim, (uint64_t)c->n_kv_heads * (uint64_t)c->head_size};
    if (check_tensor(f, "token_embd.weight", D, V, 0) < 0 ||
        check_tensor(f, "output_norm.weight", D, 0, 0) < 0) return -1;
    int has_output = check_tensor(f, "output.weight", D, V, 1);
    if (has_output < 0) return -1;
    c->tied_embeddings = !has_output;
    size_t per_layer = sizeof LAYER_TENSORS / sizeof LAYER_TENSORS[0];
    for (int layer = 0; layer < c->n_layers; layer++)
        for (size_t i = 0; i < per_layer; i++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", layer, LAYER_TENSORS[i].name);
            if (check_tensor(f, name, sizes[LAYER_TENSORS[i].ne0], sizes[LAYER_TENSORS[i].ne1], 0) < 0)
                return -1;
        }
    /* every tensor the model uses is there, once (names are unique): any more is one it does not use */
    if (f->n_tensors == 2 + (size_t)has_output + (size_t)c->n_layers * per_layer) return 0;
    for (size_t i = 0; i < f->n_tensors; i++)
        if (!llama_uses(&f->tensors[i], c->n_layers))
            return fail(f->name, "tensor %s is not one a llama model of %d blocks (its block_count) uses",
                        gguf_show(f->tensors[i].name).text, c->n_layers);
    return fail(f->name, "it holds %llu tensors, not the %llu its model uses", (ull)f->n_tensors,
                (ull)(2 + has_output + (size_t)c->n_layers * per_layer));
}

int gguf_llama_config(const GgufFile *f, GgufLlamaConfig *c) {
    char arch[16];
    memset(c, 0, sizeof *c);
    if (read_architecture(f, arch) || read_llama_sizes(f, arch, c) ||
        read_positive(f, arch, "rope.freq_base", 10000.0, &c->rope_theta) ||
        read_positive(f, arch, "attention.layer_norm_rms_epsilon", 1e-5, &c->rms_eps) ||
        read_vocab_size(f, arch, c) || check_special_ids(f, c->vocab_size))
        return -1;
    return check_llama_tensors(f, c);
}
