/* gguf.h - a reader of GGUF files (llama.cpp's model format), versions 2
 * and 3: metadata lookup, tensor lookup, dequantization to fp32, and the
 * hyperparameters of a Llama-architecture model. It depends on libc and libm
 * only (gguf.c).
 *
 * The whole file is read into memory with fread (portable C; a 100 MB model
 * takes a fraction of a second) and every count, length, offset and size in
 * it is checked against the file's size, with overflow-safe arithmetic,
 * before it is used. Strings, metadata values and tensor data are views into
 * that memory, valid until gguf_close.
 *
 * File layout (little endian; "string" = u64 length + bytes, no NUL):
 *   "GGUF", u32 version, u64 tensor_count, u64 kv_count
 *   kv_count x     { string key, u32 value type, value }
 *                  (array value = u32 element type, u64 count, elements)
 *   tensor_count x { string name, u32 n_dims, u64 dims[n_dims], u32 type,
 *                    u64 offset }
 *   padding up to the alignment (key general.alignment, default 32), then
 *   the data section: a tensor's bytes start at data_start + offset.
 * Tensor dims are ggml's ne: dims[0] is the contiguous one, so a matrix
 * stored (out, in) row-major has dims [in, out].
 *
 * Errors: one sentence on stderr (or the stream gguf_set_error_stream
 * names) starting "error: ", and a -1 or NULL return.
 */
#ifndef GGUF_H
#define GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Metadata value types (the numbers the file uses). */
enum {
    GGUF_VALUE_UINT8 = 0, GGUF_VALUE_INT8 = 1, GGUF_VALUE_UINT16 = 2, GGUF_VALUE_INT16 = 3,
    GGUF_VALUE_UINT32 = 4, GGUF_VALUE_INT32 = 5, GGUF_VALUE_FLOAT32 = 6, GGUF_VALUE_BOOL = 7,
    GGUF_VALUE_STRING = 8, GGUF_VALUE_ARRAY = 9, GGUF_VALUE_UINT64 = 10, GGUF_VALUE_INT64 = 11,
    GGUF_VALUE_FLOAT64 = 12,
};

/* The tensor types gguf_dequantize reads (ggml's numbers). Every other type
 * ggml knows is accepted by gguf_open and refused by gguf_dequantize. */
enum {
    GGUF_TENSOR_F32 = 0, GGUF_TENSOR_F16 = 1, GGUF_TENSOR_Q4_0 = 2, GGUF_TENSOR_Q4_1 = 3,
    GGUF_TENSOR_Q8_0 = 8, GGUF_TENSOR_Q4_K = 12, GGUF_TENSOR_Q5_K = 13, GGUF_TENSOR_Q6_K = 14,
    GGUF_TENSOR_BF16 = 30,
};

#define GGUF_MAX_DIMS 4

typedef struct {
    const char *ptr;          /* (len) bytes, NOT NUL-terminated */
    size_t len;
} GgufString;

/* A key, name or string value from a file made fit for a one-line message:
 * at most GGUF_MAX_SHOWN bytes, each byte that is not printable ASCII (and
 * the backslash) as \xNN, so that an untrusted file puts no control byte or
 * invalid UTF-8 on the terminal. Used as gguf_show(s).text within one call
 * (C11 keeps the returned struct alive to the end of the full expression). */
#define GGUF_MAX_SHOWN 96
typedef struct { char text[4 * GGUF_MAX_SHOWN + 4]; } GgufShown;
GgufShown gguf_show(GgufString s);

typedef struct {
    GgufString key;
    uint32_t type;            /* GGUF_VALUE_* */
    const uint8_t *value;     /* the value's bytes in the file; arrays: the first element */
    uint32_t array_type;      /* arrays: the element type */
    uint64_t array_count;     /* arrays: the number of elements */
    size_t *string_offsets;   /* string arrays: (array_count) offset from value of each
                                 element's length field; NULL otherwise */
} GgufKV;

typedef struct {
    GgufString name;
    uint32_t n_dims;          /* 1..GGUF_MAX_DIMS */
    uint64_t dims[GGUF_MAX_DIMS]; /* ne: dims[0] contiguous; 1 past n_dims */
    uint32_t type;            /* ggml type id (GGUF_TENSOR_* or another type ggml knows) */
    uint64_t offset;          /* from data_start; a multiple of the alignment */
    uint64_t n_elements;      /* dims[0] * ... * dims[3] */
    uint64_t n_bytes;         /* its size in the file */
    const uint8_t *data;      /* (n_bytes) inside the file's memory */
} GgufTensor;

typedef struct {
    char *name;               /* the path (or the name given), for messages */
    const uint8_t *bytes;     /* (size) the whole file */
    size_t size;
    uint8_t *owned;           /* == bytes when gguf_open read the file; freed by gguf_close */
    uint32_t version;         /* 2 or 3 */
    size_t n_kv;
    GgufKV *kv;               /* (n_kv) in file order */
    GgufKV **kv_by_key;       /* (n_kv) sorted by key, for lookup */
    size_t n_tensors;
    GgufTensor *tensors;      /* (n_tensors) in file order */
    GgufTensor **tensors_by_name; /* (n_tensors) sorted by name, for lookup */
    uint64_t alignment;       /* a power of two */
    size_t data_start;        /* offset of the data section in the file */
} GgufFile;

/* ---- opening ----------------------------------------------------------- */

/* Reads and checks the file at path. 0, or -1 with a sentence. */
int  gguf_open(GgufFile *f, const char *path);
/* The same on a file already in memory: borrows bytes (size of them), which
 * the caller keeps alive until gguf_close; name is used in messages. */
int  gguf_open_memory(GgufFile *f, const uint8_t *bytes, size_t size, const char *name);
/* Frees what gguf_open* allocated; safe on a zeroed or failed GgufFile. */
void gguf_close(GgufFile *f);
/* Where the error sentences go (NULL: stderr, the default). */
void gguf_set_error_stream(FILE *stream);

/* ---- metadata ---------------------------------------------------------- */

/* The entry with this key, or NULL (no message) when there is none. */
const GgufKV *gguf_find_key(const GgufFile *f, const char *key);
/* The value of key, into *out; 0, or -1 with a sentence when the key is
 * missing, has another type, or its value does not fit *out.
 * gguf_get_uint and gguf_get_int accept every integer type; gguf_get_float
 * accepts float32 and float64; gguf_get_bool gives 0 or 1. */
int  gguf_get_uint(const GgufFile *f, const char *key, uint64_t *out);
int  gguf_get_int(const GgufFile *f, const char *key, int64_t *out);
int  gguf_get_float(const GgufFile *f, const char *key, double *out);
int  gguf_get_bool(const GgufFile *f, const char *key, int *out);
int  gguf_get_string(const GgufFile *f, const char *key, GgufString *out);
/* The array entry with this key (its array_type and array_count tell what
 * it holds), or NULL with a sentence when missing or not an array. */
const GgufKV *gguf_get_array(const GgufFile *f, const char *key);
/* Element i of an array entry; 0, or -1 with a sentence when i is past the
 * end or the elements have another type (integers: any integer type whose
 * value fits; floats: float32 or float64). */
int  gguf_array_int(const GgufKV *array, uint64_t i, int64_t *out);
int  gguf_array_float(const GgufKV *array, uint64_t i, double *out);
int  gguf_array_string(const GgufKV *array, uint64_t i, GgufString *out);
/* The name of a value type ("uint32", "string", ...), "unknown" for others. */
const char *gguf_value_type_name(uint32_t type);

/* ---- strings ----------------------------------------------------------- */

/* 1 when s holds exactly the bytes of the NUL-terminated text, else 0. */
int   gguf_string_equals(GgufString s, const char *text);
/* A malloc'd NUL-terminated copy of s (free it); NULL with a sentence when
 * out of memory. A NUL byte inside s stays in the copy. */
char *gguf_string_dup(GgufString s);

/* ---- tensors ----------------------------------------------------------- */

/* The tensor with this name, or NULL (no message) when there is none. */
const GgufTensor *gguf_find_tensor(const GgufFile *f, const char *name);
/* ggml's name of a tensor type ("Q4_K", ...), "unknown" for an unknown id. */
const char *gguf_tensor_type_name(uint32_t type);
/* 1 when gguf_dequantize reads this type, else 0. */
int  gguf_can_dequantize(uint32_t type);
/* Writes the tensor's n_elements values as fp32 into out, which holds
 * out_len floats; 0, or -1 with a sentence when out_len != n_elements or
 * the type is not one gguf_dequantize reads. Bit-exact with ggml's
 * reference dequantization (and gguf-py's). */
int  gguf_dequantize(const GgufTensor *t, float *out, size_t out_len);

/* ---- Llama models ------------------------------------------------------ */

typedef struct {
    int dim;              /* D  <arch>.embedding_length */
    int hidden_dim;       /* F  <arch>.feed_forward_length */
    int n_layers;         /* L  <arch>.block_count */
    int n_heads;          /* H  <arch>.attention.head_count */
    int n_kv_heads;       /* G  <arch>.attention.head_count_kv (default H) */
    int head_size;        /* d = D / H */
    int vocab_size;       /* V  <arch>.vocab_size, or the length of tokenizer.ggml.tokens */
    int context_length;   /* T  <arch>.context_length */
    float rope_theta;     /* <arch>.rope.freq_base (default 10000) */
    float rms_eps;        /* <arch>.attention.layer_norm_rms_epsilon (default 1e-5) */
    int tied_embeddings;  /* 1: no output.weight, the classifier is token_embd.weight */
} GgufLlamaConfig;

/* Reads the hyperparameters of a model whose general.architecture is
 * "llama" (or "mistral", with the same keys under "mistral.") and checks
 * that every tensor the model needs is there with its shape and a type
 * gguf_dequantize reads:
 *   token_embd.weight [D, V], output_norm.weight [D], output.weight [D, V]
 *   (optional: absent = tied), and for each layer N < L: blk.N.attn_norm
 *   and ffn_norm [D], attn_q [D, D], attn_k and attn_v [D, G*d],
 *   attn_output [D, D], ffn_gate and ffn_up [D, F], ffn_down [F, D]
 *   (each name ending in ".weight").
 * 0, or -1 with a sentence naming the first thing wrong. */
int  gguf_llama_config(const GgufFile *f, GgufLlamaConfig *c);

#endif
