/* modfile.c - module files: a compiled document's modules, saved and
 * loaded (nectar.h). Every count and size in a file is checked against the
 * file's length before anything is read from it, and the whole file
 * against its checksum; it is written to a temporary name and renamed, so
 * a crash never leaves half a file. The layout: docs/formats.md.
 */
#include "modfile.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Module file: a fixed header, a table of (size, input_scale) per module,
 * every parameter, then the held-out prompts (when there are any): offsets
 * (n + 1), tokens, split flags (n: SPLIT_*), question lengths (n), the
 * no-document prefix, all int32; last, the 64-bit FNV-1a hash of every byte
 * before it, which is checked before anything in the file is used. */
enum { MODULE_MAGIC = 0x5243544E /* "NTCR" */, MODULE_VERSION = 4 };
typedef struct {
    uint32_t magic, version;
    int32_t arch, n_layers, n_kv_heads, head_size;
    int32_t depth_backbone, depth_score, depth_target, n_doc;
    float rho;
    int32_t n_heldout;
    uint64_t model_fingerprint, doc_fingerprint, n_params;
    int64_t n_heldout_tokens;
    int32_t chat;             /* 1: the document was framed as a chat turn (--chat) */
    int32_t answer_cap, answer_stop[2], n_nodoc_prefix;  /* the held-out prompts' (PromptSet) */
    int32_t later;            /* 1: fitted as a later document of a composition (--later-document) */
    uint8_t pad[128 - 104];
} ModuleFileHeader;
_Static_assert(sizeof(ModuleFileHeader) == 128, "module file header is 128 bytes");

typedef struct { int32_t size; float input_scale; } ModuleFileEntry;

/* The four parts of p's prompt table (read_prompt_table) into parts and
 * sizes; flags (n_prompts + 1) holds the split flags as int32. */
void prompt_table_parts(const PromptSet *p, int32_t *flags, const void **parts, size_t *sizes) {
    int n = p->n_prompts;
    for (int i = 0; i < n; i++) flags[i] = p->split[i];
    parts[0] = p->offsets; sizes[0] = n ? (n + 1) * sizeof(int32_t) : 0;
    parts[1] = p->tokens; sizes[1] = n ? p->offsets[n] * sizeof(int32_t) : 0;
    parts[2] = flags; sizes[2] = n * sizeof(int32_t);
    parts[3] = p->question_len; sizes[3] = n * sizeof(int32_t);
}

int moduleset_save(const ModuleSet *s, const char *path) {
    ModuleFileHeader h = {0};
    h.magic = MODULE_MAGIC; h.version = MODULE_VERSION; h.arch = s->arch;
    h.n_layers = s->n_layers; h.n_kv_heads = s->n_kv_heads; h.head_size = s->head_size;
    h.depth_backbone = s->depth_backbone; h.depth_score = s->depth_score;
    h.depth_target = s->depth_target; h.n_doc = s->n_doc; h.rho = s->rho;
    h.model_fingerprint = s->model_fingerprint; h.doc_fingerprint = s->doc_fingerprint;
    h.n_params = s->n_params;
    h.chat = s->chat;
    h.later = s->later;
    const PromptSet *p = &s->heldout;
    h.n_heldout = p->n_prompts;
    h.n_heldout_tokens = p->n_prompts ? p->offsets[p->n_prompts] : 0;
    h.answer_cap = p->answer_cap; h.answer_stop[0] = p->answer_stop[0]; h.answer_stop[1] = p->answer_stop[1];
    h.n_nodoc_prefix = p->n_prompts ? p->n_nodoc_prefix : 0;
    int count = s->n_layers * s->n_kv_heads;
    ModuleFileEntry *table = xmalloc(count * sizeof(ModuleFileEntry));
    for (int i = 0; i < count; i++) {
        const Module *mod = &s->modules[i];
        table[i].size = s->arch == ARCH_MLP ? mod->width : mod->n_pairs;
        table[i].input_scale = mod->input_scale;
    }
    int32_t *flags = xmalloc((p->n_prompts + 1) * sizeof(int32_t));
    uint64_t checksum = FNV_OFFSET;
    const void *parts[9] = {&h, table, s->params, [7] = p->nodoc_prefix, [8] = &checksum};
    size_t sizes[9] = {sizeof(h), count * sizeof(ModuleFileEntry), s->n_params * sizeof(float),
                       [7] = h.n_nodoc_prefix * sizeof(int32_t), [8] = sizeof(checksum)};
    prompt_table_parts(p, flags, parts + 3, sizes + 3);
    for (int k = 0; k < 8; k++) checksum = fnv1a(checksum, parts[k], sizes[k]);
    int rc = write_file_atomic(path, parts, sizes, 9);
    free(table); free(flags);
    return rc;
}

/* Why the header's fields cannot be a module file's, or NULL: its kind,
 * then each field within its range (the sizes against the rest of the file
 * are read_modules'). */
static const char *module_header_problem(const ModuleFileHeader *h) {
    if (h->magic != MODULE_MAGIC) return "it is not a Nectar module file (bad magic number)";
    if (h->version < MODULE_VERSION)
        return "it was written by an earlier version of this program (its format has no checksum); "
               "fit the modules again";
    if (h->version != MODULE_VERSION) return "its format version is newer than this program reads";
    if (h->arch != ARCH_MLP && h->arch != ARCH_QUAD) return "its architecture is unknown";
    if (h->n_layers <= 0 || h->n_kv_heads <= 0 || h->head_size <= 0 || h->n_doc <= 0 ||
        h->n_layers > 4096 || h->n_kv_heads > 4096 || h->head_size > 65536 ||
        h->n_layers * h->n_kv_heads > (1 << 16) ||
        h->n_heldout < 0 || h->n_heldout_tokens < 0 || h->n_heldout_tokens > (1 << 28) ||
        h->n_nodoc_prefix < 0 || h->n_nodoc_prefix > MAX_NODOC_PREFIX)
        return "its dimensions are out of range";
    if (!(h->rho > 0.0f && h->rho <= 1e6f)) return "its budget rho is not a number in (0, 1e6]";
    if (h->chat != 0 && h->chat != 1) return "its chat flag is neither 0 nor 1";
    if (h->later != 0 && h->later != 1) return "its later-document flag is neither 0 nor 1";
    if (h->n_heldout > 0 && (h->answer_cap < 0 || h->answer_cap > (1 << 20) || h->answer_stop[0] < -1 ||
                             h->answer_stop[1] < -1))
        return "its held-out prompts' answer cap or stop tokens are out of range";
    return NULL;
}

/* The module sizes per layer (L), the same for every KV head, and the
 * parameter count they imply; 0 if the table is inconsistent. */
static int module_table_sizes(const ModuleFileHeader *h, const ModuleFileEntry *table, int *sizes,
                              size_t *n_params) {
    ModuleSet shape = {.arch = h->arch, .head_size = h->head_size, .depth_backbone = h->depth_backbone,
                       .depth_score = h->depth_score, .depth_target = h->depth_target};
    int ok = h->arch != ARCH_MLP || depths_valid(h->depth_backbone, h->depth_score, h->depth_target);
    *n_params = 0;
    for (int l = 0; l < h->n_layers && ok; l++) {
        sizes[l] = table[l * h->n_kv_heads].size;
        for (int g = 0; g < h->n_kv_heads; g++)
            ok &= table[l * h->n_kv_heads + g].size == sizes[l] && sizes[l] > 0 && sizes[l] <= (1 << 20) &&
                  isfinite(table[l * h->n_kv_heads + g].input_scale) && table[l * h->n_kv_heads + g].input_scale > 0;
        if (ok) *n_params += (size_t)h->n_kv_heads * module_param_count(&shape, sizes[l]);
    }
    return ok;
}

/* n int32 at *at into a new array; *at moves past them. */
static int *read_ints(const unsigned char **at, size_t n) {
    int *out = xmalloc((n + 1) * sizeof(int));
    memcpy(out, *at, n * sizeof(int));
    *at += n * sizeof(int32_t);
    return out;
}

/* A prompt table of n prompts at *at (*at moves past it): offsets (n + 1),
 * tokens, split flags (n), question lengths (n); the offsets must rise
 * from 0 to the token count, each question fit its prompt. */
int read_prompt_table(PromptSet *p, int n, int64_t n_tokens, const unsigned char **at) {
    int *flags;
    p->n_prompts = n;
    p->offsets = read_ints(at, n + 1);
    p->tokens = read_ints(at, n_tokens);
    flags = read_ints(at, n);
    p->question_len = read_ints(at, n);
    p->split = xmalloc(n + 1);
    int ok = p->offsets[0] == 0 && p->offsets[n] == n_tokens;
    for (int i = 0; i < n; i++) {
        ok &= flags[i] >= SPLIT_RANDOM && flags[i] <= SPLIT_TASKS;
        p->split[i] = ok ? (unsigned char)flags[i] : SPLIT_RANDOM;
        ok &= p->offsets[i + 1] > p->offsets[i];
        ok &= p->question_len[i] >= 0 && p->question_len[i] <= p->offsets[i + 1] - p->offsets[i];
    }
    free(flags);
    return ok ? 0 : -1;
}

/* The no-document prefix (n ints at *at) and the answers' conventions into p. */
void read_conventions(PromptSet *p, int n_prefix, int cap, const int32_t stop[2], const unsigned char **at) {
    p->nodoc_prefix = read_ints(at, n_prefix);
    p->n_nodoc_prefix = n_prefix;
    p->answer_cap = cap;
    p->answer_stop[0] = stop[0]; p->answer_stop[1] = stop[1];
}

/* The held-out prompts at `at`: a prompt table, then the no-document prefix. */
static int read_heldout(PromptSet *p, const ModuleFileHeader *h, const unsigned char *at) {
    int rc = read_prompt_table(p, h->n_heldout, h->n_heldout_tokens, &at);
    read_conventions(p, h->n_nodoc_prefix, h->answer_cap, h->answer_stop, &at);
    return rc;
}

/* The modules of the file (buf, size) into s, checked against its header h
 * (whose module table is in the file); NULL, or why it is refused (s is then
 * freed). */
static const char *read_modules(ModuleSet *s, const ModuleFileHeader *h, const unsigned char *buf, size_t size,
                                uint64_t model_fp, uint64_t doc_fp) {
    int count = h->n_layers * h->n_kv_heads;
    size_t table_bytes = count * sizeof(ModuleFileEntry);
    const ModuleFileEntry *table = (const ModuleFileEntry *)(buf + sizeof(*h));
    /* the file size the table implies, checked before anything is allocated */
    int *sizes = xmalloc(h->n_layers * sizeof(int));
    size_t n_params;
    int ok = module_table_sizes(h, table, sizes, &n_params);
    size_t prompt_ints = h->n_heldout ? 3 * (size_t)h->n_heldout + 1 + h->n_heldout_tokens + h->n_nodoc_prefix : 0;
    size_t expected = sizeof(*h) + table_bytes + n_params * sizeof(float) + prompt_ints * sizeof(int32_t) +
                      sizeof(uint64_t);
    /* rho = params / (2 n d) per module, at most: the sizes rho allows, whatever the layers' multipliers */
    double budget = (double)h->rho * 2.0 * h->n_doc * h->head_size * h->n_layers * h->n_kv_heads;
    const char *why = NULL;
    if (!ok) why = "its module table is inconsistent";
    /* n_params <= size / 4 first: up to 2^62 parameters fit the header's limits, and 4 n_params would wrap */
    else if (n_params != h->n_params || n_params > size / sizeof(float) || size != expected)
        why = "its size does not match its header: it is truncated or corrupt";
    else if ((double)n_params > budget * (1 + 1e-5)) why = "its modules are larger than its budget rho allows";
    else if (moduleset_alloc(s, h->arch, h->n_layers, h->n_kv_heads, h->head_size, h->depth_backbone,
                             h->depth_score, h->depth_target, sizes, 0) != 0)
        why = "its modules cannot be allocated";
    free(sizes);
    if (why) return why;
    if (model_fp && h->model_fingerprint != model_fp) why = "it was fitted to a different model; refusing to use it";
    else if (doc_fp && h->doc_fingerprint != doc_fp) why = "it was fitted to a different document; refusing to use it";
    if (why) { moduleset_free(s); return why; }
    s->n_doc = h->n_doc; s->rho = h->rho; s->chat = h->chat != 0; s->later = h->later != 0;
    s->model_fingerprint = h->model_fingerprint; s->doc_fingerprint = h->doc_fingerprint;
    for (int i = 0; i < count; i++) s->modules[i].input_scale = table[i].input_scale;
    const unsigned char *at = buf + sizeof(*h) + table_bytes;
    memcpy(s->params, at, s->n_params * sizeof(float));
    return NULL;
}

/* The file's last 8 bytes are the FNV-1a hash of the bytes before them. */
int checksum_matches(const unsigned char *buf, size_t size) {
    uint64_t stored;
    memcpy(&stored, buf + size - sizeof(stored), sizeof(stored));
    return fnv1a(FNV_OFFSET, buf, size - sizeof(stored)) == stored;
}

int moduleset_load(ModuleSet *s, const char *path, uint64_t model_fp, uint64_t doc_fp) {
    memset(s, 0, sizeof(*s));
    size_t size;
    unsigned char *buf = read_file(path, &size);
    if (!buf) return -1;
    ModuleFileHeader h;
    if (size < sizeof(h) + sizeof(uint64_t)) {
        fprintf(stderr, "error: %s is %zu bytes, shorter than a module file header and checksum\n", path, size);
        free(buf);
        return -1;
    }
    memcpy(&h, buf, sizeof(h));
    /* what the file is and whether it holds the bytes it was written with, before any other field is used */
    const char *why = h.magic != MODULE_MAGIC || h.version != MODULE_VERSION ? module_header_problem(&h)
                    : !checksum_matches(buf, size) ? "its checksum does not match its bytes: the file is truncated or corrupt"
                    : module_header_problem(&h);
    size_t table_bytes = why ? 0 : (size_t)h.n_layers * h.n_kv_heads * sizeof(ModuleFileEntry);
    if (!why && size < sizeof(h) + table_bytes) {
        fprintf(stderr, "error: %s is truncated (its module table is incomplete)\n", path);
        free(buf);
        return -1;
    }
    if (!why) why = read_modules(s, &h, buf, size, model_fp, doc_fp);
    if (why) {
        fprintf(stderr, "error: %s: %s\n", path, why);
        free(buf);
        return -1;
    }
    size_t bad = first_nonfinite(s->params, s->n_params);
    if (bad < s->n_params) {
        fprintf(stderr, "error: %s: parameter %zu of %zu is %g; the file is corrupt\n", path, bad, s->n_params,
                s->params[bad]);
        moduleset_free(s); free(buf);
        return -1;
    }
    const unsigned char *prompts = buf + sizeof(h) + table_bytes + s->n_params * sizeof(float);
    if (h.n_heldout && read_heldout(&s->heldout, &h, prompts) != 0) {
        fprintf(stderr, "error: %s: its held-out prompt table is corrupt\n", path);
        moduleset_free(s); free(buf);
        return -1;
    }
    free(buf);
    return 0;
}
