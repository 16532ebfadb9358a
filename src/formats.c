/* formats.c - the files the project reads and writes: llama2.c model
 * checkpoints, Nectar module files, text and token-id files. Every count
 * and size in a file is checked against the file's length before anything
 * is read from it; files are written to a temporary name and renamed, so a
 * crash never leaves half a file.
 */
#include "formats.h"
#include "gguf.h"
#include "modfile.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Whole files, text files, token-id files                                  */

/* 1 when a and b name the same existing file. */
static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0) return 0;
    if (sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino) return 1;
    char *ra = realpath(a, NULL), *rb = realpath(b, NULL);
    int same = ra && rb && !strcmp(ra, rb);
    free(ra); free(rb);
    return same;
}

int check_output(const char *option, const char *path, const char *const *inputs, int n) {
    if (!path[0]) { fprintf(stderr, "error: %s is empty; give a file name\n", option); return -1; }
    struct stat st;
    int exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "error: %s %s is a directory; give a file name\n", option, path);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (inputs[i] && same_file(path, inputs[i])) {
            fprintf(stderr, "error: %s %s is the input %s; writing it would destroy it\n", option, path, inputs[i]);
            return -1;
        }
    /* an existing file: its write permission (kept even where root may write past it), and whether it
     * opens for writing (an immutable one does not); opened to see, never written */
    int fd = !exists ? -2 : !(st.st_mode & 0222) ? (errno = EACCES, -1) : open(path, O_WRONLY);
    if (fd == -1) {
        fprintf(stderr, "error: %s %s cannot be written (%s); refusing to replace it\n", option, path,
                errno == EACCES ? "it is read-only" : strerror(errno));
        return -1;
    }
    if (fd >= 0) close(fd);
    size_t len = strlen(path);
    char *probe = xmalloc(len + 5);
    memcpy(probe, path, len);
    memcpy(probe + len, ".tmp", 5);
    fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = errno;
    if (fd >= 0) { close(fd); unlink(probe); }
    free(probe);
    if (fd < 0) {
        fprintf(stderr, "error: %s %s cannot be written: its folder %s (%s)\n", option, path,
                err == ENOENT ? "does not exist or takes no new file" : "takes no new file", strerror(err));
        return -1;
    }
    return 0;
}

char *read_text_file(const char *path) {
    size_t size;
    char *text = (char *)read_file(path, &size);
    if (!text) return NULL;
    size_t nul = strlen(text);
    if (nul < size) {  /* C strings would end there, silently */
        fprintf(stderr, "error: %s is not a text file (a NUL byte at offset %zu)\n", path, nul);
        free(text);
        return NULL;
    }
    return text;
}

int read_token_ids(const char *path, int **ids) {
    *ids = NULL;
    FILE *f = open_regular_file(path, "token id file");
    if (!f) return -1;
    int n = 0, cap = 64, line = 1, c, ret = -1;
    int *a = malloc((size_t)cap * sizeof *a);
    char word[64];
    if (!a) { fprintf(stderr, "error: out of memory reading %s\n", path); goto done; }
    for (;;) {
        while ((c = fgetc(f)) != EOF && isspace(c)) line += c == '\n';
        if (c == EOF) break;
        size_t k = 0;
        int bad = 0;
        for (; c != EOF && !isspace(c); c = fgetc(f)) {
            if (c == '\0' || k == sizeof word - 1) bad = 1; /* NUL byte or absurdly long word */
            else word[k++] = (char)c;
        }
        word[k] = '\0';
        char *end;
        errno = 0;
        long v = strtol(word, &end, 10);
        if (bad || end == word || *end || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
            fprintf(stderr, "error: %s line %d: item %d (\"%s%s\") is not an integer\n",
                    path, line, n + 1, word, bad ? "..." : "");
            goto done;
        }
        if (n == cap) {
            int *b = cap <= INT_MAX / 2 ? realloc(a, (size_t)cap * 2 * sizeof *a) : NULL;
            if (!b) { fprintf(stderr, "error: out of memory reading %s\n", path); goto done; }
            a = b;
            cap *= 2;
        }
        a[n++] = (int)v;
        line += c == '\n';
    }
    if (ferror(f)) { fprintf(stderr, "error: read error in token id file %s\n", path); goto done; }
    *ids = a;
    a = NULL;
    ret = n;
done:
    free(a);
    fclose(f);
    return ret;
}

/* ------------------------------------------------------------------------ */
/* Model: llama2.c "v0" checkpoints                                         */

enum { HEADER_INTS = 7 };

/* After the header, a checkpoint holds the model's block (Model.params)
 * with llama2.c's two RoPE tables (T d / 2 floats each) between rms_final
 * and the unshared classifier: the floats before the tables, of each
 * table, and after them. */
typedef struct { size_t before_rope, rope, cls; } CheckpointLayout;

static CheckpointLayout checkpoint_layout(const Config *c, int shared) {
    size_t cls = shared ? 0 : (size_t)c->vocab_size * c->dim;
    return (CheckpointLayout){model_param_count(c, shared) - cls, (size_t)c->seq_len * (c->dim / c->n_heads) / 2, cls};
}

/* The last step of loading a model: its weights must be finite (else it is
 * freed and refused as corrupt, `what` naming the file's kind), then the
 * tensors derived from them are made. */
static int weights_finite(Model *m, const char *path, const char *what) {
    size_t bad = first_nonfinite(m->params, m->n_params);
    if (bad < m->n_params) {
        fprintf(stderr, "error: %s: weight %zu of %zu is %g; %s is corrupt\n", path, bad, m->n_params,
                m->params[bad], what);
        model_free(m);
        return -1;
    }
    model_refresh(m);
    return 0;
}

static int model_load_llama2c(Model *m, const char *path) {
    size_t size;
    unsigned char *buf = read_file(path, &size);
    if (!buf) return -1;
    if (size < HEADER_INTS * sizeof(int)) {
        fprintf(stderr, "error: %s is %zu bytes, shorter than a checkpoint header (28 bytes)\n", path, size);
        free(buf);
        return -1;
    }
    int h[HEADER_INTS];
    memcpy(h, buf, sizeof(h));
    Config c = {h[0], h[1], h[2], h[3], h[4], h[5] == INT_MIN ? 0 : abs(h[5]), h[6], LLAMA2C_ROPE_THETA,
                LLAMA2C_NORM_EPS};
    int shared = h[5] > 0;
    if (config_check(&c, path) != 0) { free(buf); return -1; }
    CheckpointLayout t = checkpoint_layout(&c, shared);
    size_t expected = sizeof(h) + (t.before_rope + 2 * t.rope + t.cls) * sizeof(float);
    if (size != expected) {
        fprintf(stderr, "error: %s is %zu bytes but its header (dim %d, hidden %d, layers %d, heads %d/%d, "
                "vocab %d, seq_len %d) needs %zu bytes; the file is %s\n", path, size, c.dim, c.hidden_dim,
                c.n_layers, c.n_heads, c.n_kv_heads, h[5], c.seq_len, expected,
                size < expected ? "truncated or not a llama2.c checkpoint" : "longer than its header says");
        free(buf);
        return -1;
    }
    m->config = c;
    m->shared_classifier = shared;
    m->n_params = model_param_count(&c, shared);
    m->params = xmalloc(m->n_params * sizeof(float));
    /* every tensor but the two RoPE tables, which forward recomputes */
    const float *src = (const float *)(buf + sizeof(h));
    memcpy(m->params, src, t.before_rope * sizeof(float));
    memcpy(m->params + t.before_rope, src + t.before_rope + 2 * t.rope, t.cls * sizeof(float));
    free(buf);
    return weights_finite(m, path, "the checkpoint");
}

/* ------------------------------------------------------------------------ */
/* Model: GGUF files of the Llama architecture (gguf.c reads them)          */

/* Where each GGUF tensor goes in Model.params: its name (%d: the layer),
 * the view, and the floats per layer (0: not per layer). */
typedef struct { const char *name; float *view; size_t per_layer; } TensorPlace;

static int tensor_places(const Model *m, TensorPlace *p) {
    const Config *c = &m->config;
    const Weights *w = &m->w;
    size_t D = c->dim, F = c->hidden_dim, KVD = (size_t)c->dim / c->n_heads * c->n_kv_heads;
    TensorPlace places[] = {
        {"token_embd.weight", w->token_embedding, 0},
        {"blk.%d.attn_norm.weight", w->rms_att, D},     {"blk.%d.attn_q.weight", w->wq, D * D},
        {"blk.%d.attn_k.weight", w->wk, KVD * D},       {"blk.%d.attn_v.weight", w->wv, KVD * D},
        {"blk.%d.attn_output.weight", w->wo, D * D},    {"blk.%d.ffn_norm.weight", w->rms_ffn, D},
        {"blk.%d.ffn_gate.weight", w->w1, F * D},       {"blk.%d.ffn_down.weight", w->w2, D * F},
        {"blk.%d.ffn_up.weight", w->w3, F * D},         {"output_norm.weight", w->rms_final, 0},
        {"output.weight", w->wcls, 0},
    };
    int n = (int)(sizeof places / sizeof places[0]) - (m->shared_classifier ? 1 : 0);
    memcpy(p, places, n * sizeof(TensorPlace));
    return n;
}

/* Every weight dequantized to fp32 into its place (gguf_llama_config has
 * checked that each tensor exists with the shape the config implies). */
static int read_gguf_weights(Model *m, const GgufFile *g) {
    TensorPlace places[12];
    int n = tensor_places(m, places);
    for (int i = 0; i < n; i++) {
        int layers = places[i].per_layer ? m->config.n_layers : 1;
        for (int l = 0; l < layers; l++) {
            char name[64];
            snprintf(name, sizeof name, places[i].name, l);
            const GgufTensor *t = gguf_find_tensor(g, name);
            if (!t) { fprintf(stderr, "error: %s: no tensor %s\n", g->name, name); return -1; }
            if (gguf_dequantize(t, places[i].view + (size_t)l * places[i].per_layer, t->n_elements) != 0) return -1;
        }
    }
    return 0;
}

/* A GGUF model: the hyperparameters from its metadata, the weights
 * dequantized to fp32; tied embeddings share the classifier. */
static int model_load_gguf(Model *m, const char *path) {
    GgufFile g;
    if (gguf_open(&g, path) != 0) return -1;
    GgufLlamaConfig lc;
    if (gguf_llama_config(&g, &lc) != 0) { gguf_close(&g); return -1; }
    Config c = {lc.dim, lc.hidden_dim, lc.n_layers, lc.n_heads, lc.n_kv_heads, lc.vocab_size, lc.context_length,
                lc.rope_theta, lc.rms_eps};
    if (config_check(&c, path) != 0) { gguf_close(&g); return -1; }
    m->config = c;
    m->shared_classifier = lc.tied_embeddings;
    m->n_params = model_param_count(&c, m->shared_classifier);
    m->params = xmalloc(m->n_params * sizeof(float));
    weights_view(&m->config, m->shared_classifier, m->params, &m->w);
    int rc = read_gguf_weights(m, &g);
    gguf_close(&g);
    if (rc != 0) { model_free(m); return -1; }
    return weights_finite(m, path, "the file");
}

/* 1 when the file starts with GGUF's magic number. */
int is_gguf_file(const char *path) {
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    return got == 4 && !memcmp(magic, "GGUF", 4);
}

int model_load(Model *m, const char *path) {
    memset(m, 0, sizeof(*m));
    return is_gguf_file(path) ? model_load_gguf(m, path) : model_load_llama2c(m, path);
}

int model_save(const Model *m, const char *path) {
    const Config *c = &m->config;
    if (c->rope_theta != LLAMA2C_ROPE_THETA || c->norm_eps != LLAMA2C_NORM_EPS) {
        fprintf(stderr, "error: %s: a llama2.c checkpoint holds neither a RoPE base nor an RMSNorm epsilon, and this "
                "model's (%g, %g) are not llama2.c's (%g, %g)\n", path, c->rope_theta, c->norm_eps,
                LLAMA2C_ROPE_THETA, LLAMA2C_NORM_EPS);
        return -1;
    }
    int h[HEADER_INTS] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                          m->shared_classifier ? c->vocab_size : -c->vocab_size, c->seq_len};
    CheckpointLayout t = checkpoint_layout(c, m->shared_classifier);
    /* RoPE tables as llama2.c's export writes them: cos and sin of pos * freq_i */
    int d = c->dim / c->n_heads;
    float *rope = xmalloc(2 * t.rope * sizeof(float));
    for (int pos = 0; pos < c->seq_len; pos++)
        for (int i = 0; i < d / 2; i++) {
            float angle = pos * (1.0f / powf(LLAMA2C_ROPE_THETA, (2.0f * i) / d));
            rope[pos * (d / 2) + i] = cosf(angle);
            rope[t.rope + pos * (d / 2) + i] = sinf(angle);
        }
    const void *parts[4] = {h, m->params, rope, m->params + t.before_rope};
    size_t sizes[4] = {sizeof(h), t.before_rope * sizeof(float), 2 * t.rope * sizeof(float), t.cls * sizeof(float)};
    int rc = write_file_atomic(path, parts, sizes, 4);
    free(rope);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Self-study files                                                         */

/* What train --save-self-study writes and --self-study reads: a 64-byte
 * header, the self-study prompts' table and the evaluation-only tasks'
 * (read_prompt_table's layout), the no-document prefix, then the 64-bit
 * FNV-1a hash of every byte before it. */
enum { SELFSTUDY_MAGIC = 0x5353544E /* "NTSS" */, SELFSTUDY_VERSION = 1 };
typedef struct {
    uint32_t magic, version;
    uint64_t model_fingerprint, doc_fingerprint;
    int32_t n_prompts[2];     /* the self-study prompts, the evaluation-only tasks */
    int64_t n_tokens[2];
    int32_t answer_cap, answer_stop[2], n_nodoc_prefix;  /* both sets' (PromptSet) */
} SelfStudyFileHeader;
_Static_assert(sizeof(SelfStudyFileHeader) == 64, "self-study file header is 64 bytes");

int selfstudy_save(const char *path, const PromptSet *prompts, const PromptSet *tasks, uint64_t model_fp,
                   uint64_t doc_fp) {
    const PromptSet *sets[2] = {prompts, tasks};
    SelfStudyFileHeader h = {SELFSTUDY_MAGIC, SELFSTUDY_VERSION, model_fp, doc_fp, {0}, {0}, prompts->answer_cap,
                             {prompts->answer_stop[0], prompts->answer_stop[1]}, prompts->n_nodoc_prefix};
    uint64_t checksum = FNV_OFFSET;
    const void *parts[11] = {&h, [9] = prompts->nodoc_prefix, [10] = &checksum};
    size_t sizes[11] = {sizeof(h), [9] = prompts->n_nodoc_prefix * sizeof(int32_t), [10] = sizeof(checksum)};
    int32_t *flags[2];
    for (int k = 0; k < 2; k++) {
        h.n_prompts[k] = sets[k]->n_prompts;
        h.n_tokens[k] = sets[k]->n_prompts ? sets[k]->offsets[sets[k]->n_prompts] : 0;
        flags[k] = xmalloc((sets[k]->n_prompts + 1) * sizeof(int32_t));
        prompt_table_parts(sets[k], flags[k], parts + 1 + 4 * k, sizes + 1 + 4 * k);
    }
    for (int k = 0; k < 10; k++) checksum = fnv1a(checksum, parts[k], sizes[k]);
    int rc = write_file_atomic(path, parts, sizes, 11);
    free(flags[0]); free(flags[1]);
    return rc;
}

/* Why a self-study file of `size` bytes with header h cannot be read, or
 * NULL: its kind and checksum first, then every count against the size. */
static const char *selfstudy_problem(const SelfStudyFileHeader *h, const unsigned char *buf, size_t size,
                                     uint64_t model_fp, uint64_t doc_fp) {
    if (h->magic != SELFSTUDY_MAGIC) return "it is not a Nectar self-study file (bad magic number)";
    if (h->version != SELFSTUDY_VERSION) return "its format version is not one this program reads";
    if (!checksum_matches(buf, size)) return "its checksum does not match its bytes: the file is truncated or corrupt";
    size_t ints = (size_t)h->n_nodoc_prefix + 2;  /* the checksum's 8 bytes */
    for (int k = 0; k < 2; k++) {
        if (h->n_prompts[k] < 0 || h->n_prompts[k] > (1 << 24) || h->n_tokens[k] < 0 || h->n_tokens[k] > (1 << 28) ||
            (h->n_prompts[k] == 0 && h->n_tokens[k] != 0))
            return "its prompt counts are out of range";
        ints += 3 * (size_t)h->n_prompts[k] + (h->n_prompts[k] > 0) + h->n_tokens[k];  /* no offsets for none */
    }
    if (h->n_prompts[0] < 1 || h->n_nodoc_prefix < 0 || h->n_nodoc_prefix > MAX_NODOC_PREFIX || h->answer_cap < 0 ||
        h->answer_cap > (1 << 20) || h->answer_stop[0] < -1 || h->answer_stop[1] < -1)
        return "its header fields are out of range";
    if (size != sizeof(*h) + ints * sizeof(int32_t)) return "its size does not match its header: it is corrupt";
    if (model_fp && h->model_fingerprint != model_fp) return "it was made with a different model";
    if (doc_fp && h->doc_fingerprint != doc_fp) return "it was made for a different document";
    return NULL;
}

int selfstudy_load(const char *path, uint64_t model_fp, uint64_t doc_fp, PromptSet *prompts, PromptSet *tasks) {
    memset(prompts, 0, sizeof(*prompts));
    memset(tasks, 0, sizeof(*tasks));
    size_t size;
    unsigned char *buf = read_file(path, &size);
    if (!buf) return -1;
    SelfStudyFileHeader h;
    const char *why = size < sizeof(h) + sizeof(uint64_t) ? "it is shorter than a self-study file's header" : NULL;
    if (!why) { memcpy(&h, buf, sizeof(h)); why = selfstudy_problem(&h, buf, size, model_fp, doc_fp); }
    const unsigned char *at = buf + sizeof(h);
    PromptSet *sets[2] = {prompts, tasks};
    for (int k = 0; k < 2 && !why; k++)
        if (h.n_prompts[k] > 0 && read_prompt_table(sets[k], h.n_prompts[k], h.n_tokens[k], &at) != 0)
            why = "its prompt tables are corrupt";
    for (int k = 0; k < 2 && !why; k++) {
        const unsigned char *prefix = at;
        read_conventions(sets[k], h.n_nodoc_prefix, h.answer_cap, h.answer_stop, &prefix);
    }
    free(buf);
    if (!why) return 0;
    fprintf(stderr, "error: %s: %s\n", path, why);
    promptset_free(prompts); promptset_free(tasks);
    return -1;
}
