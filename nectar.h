/* nectar.h - Nectar in C: the method's types and functions (nectar.c).
 *
 * Nectar replaces a fixed document's KV cache by one small module per layer
 * and KV head. A module maps a rotated query q to an attention *state*
 * (A, lse): the document's retrieved content A(q) and its log attention mass
 * alpha(q). States merge exactly by log-sum-exp with the state of the local
 * tokens (the prompt and what is generated).
 *
 * Dimension legend (used in every shape comment):
 *   D  model dim              F  FFN hidden dim        L  layers
 *   H  query heads            G  KV heads              d  head size = D / H
 *   KVD = G * d               V  vocabulary size       T  context (seq_len)
 *   n  document tokens        m  local tokens (prompt + generated)
 *   B  tokens in one forward block            N  queries in a module batch
 *   w  MLP module width       p  quadrature pairs
 *
 * The core is this header, nectar.c (the method: sections 1-5 below, and
 * section 8: generation), src/compile.c (section 6: compiling a document:
 * its modules sized by a budget, the teacher pass, the fit), src/modfile.c
 * (section 7: module files) and the three files of src/ they run on:
 * kernels (exp_fast and the matrix products), parallel (the thread pool)
 * and util (memory, time, random numbers, whole files). It calls nothing
 * else: model files, tokenizers, self-study prompts, evaluation and the
 * command line sit above it in src/.
 *
 * A compiled document's life, each step one call (examples/compile.c runs
 * them all):
 *   doccache_build                 the document's KV cache (its prefill)
 *   moduleset_for_budget           modules sized by the budget rho
 *   teacher_alloc, teacher_pass    the full cache's targets over prompts
 *   moduleset_init                 the modules' starting point
 *   fit_begin, fit_steps, fit_end  the fit (regression, KL, or both)
 *   moduleset_save, moduleset_load the module file
 *   forward (DOC_NECTAR)           the model with the modules, a block at a time
 *   generate (DOC_NECTAR)          tokens after them, greedy or sampled
 *
 * Conventions: fp32; natural log; nothing prints but errors, which print
 * one sentence on stderr and return -1 (or NULL); progress goes through a
 * callback.
 */
#ifndef NECTAR_H
#define NECTAR_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* The model: a llama2.c transformer (src/formats.c loads and writes it)    */

typedef struct {
    int dim;          /* D */
    int hidden_dim;   /* F */
    int n_layers;     /* L */
    int n_heads;      /* H */
    int n_kv_heads;   /* G */
    int vocab_size;   /* V (always positive here; see shared_classifier) */
    int seq_len;      /* T */
    float rope_theta; /* RoPE base: 10000 for llama2.c checkpoints, rope.freq_base in a GGUF */
    float norm_eps;   /* RMSNorm epsilon: 1e-5 for llama2.c checkpoints */
} Config;

/* The RoPE base and RMSNorm epsilon of llama2.c, whose checkpoints hold neither. */
#define LLAMA2C_ROPE_THETA 10000.0f
#define LLAMA2C_NORM_EPS   1e-5f

typedef struct {          /* views into Model.params, in file order */
    float *token_embedding; /* (V, D) */
    float *rms_att;         /* (L, D) */
    float *wq;              /* (L, D, D)    y = W x, W stored (out, in) */
    float *wk;              /* (L, KVD, D) */
    float *wv;              /* (L, KVD, D) */
    float *wo;              /* (L, D, D) */
    float *rms_ffn;         /* (L, D) */
    float *w1;              /* (L, F, D) */
    float *w2;              /* (L, D, F) */
    float *w3;              /* (L, F, D) */
    float *rms_final;       /* (D) */
    float *wcls;            /* (V, D): token_embedding when shared */
} Weights;

typedef struct {
    Config config;
    int shared_classifier;  /* 1: logits use token_embedding */
    float *params;          /* all weights in one block (RoPE tables dropped) */
    size_t n_params;
    Weights w;
    uint64_t fingerprint;   /* hash of config and weights */
} Model;

/* The weights in one block, in llama2.c's file order without its RoPE
 * tables: the count, and the views w of the tensors in a block laid out so
 * (the weights, or their gradients). */
size_t model_param_count(const Config *c, int shared_classifier);
void weights_view(const Config *c, int shared_classifier, float *base, Weights *w);
/* A sentence naming `what` and -1 unless the shape is one this code can run. */
int  config_check(const Config *c, const char *what);
/* Allocates a model of the given shape with weights drawn from a seeded
 * normal distribution (scale `std`; RMSNorm weights 1). For tests and demos. */
int  model_init_random(Model *m, Config c, int shared_classifier, uint64_t seed, float std);
/* Sets params views and the fingerprint after params changed. */
void model_refresh(Model *m);
void model_free(Model *m);
/* A sentence and -1 if any id is outside [0, V). `what` names the input. */
int  check_tokens(const Model *m, const int *tokens, int n, const char *what);

/* ------------------------------------------------------------------------ */
/* 1. Attention states and their merge                                      */

/* state = (A, lse); the empty set is (0, -inf).
 * attention_states: for nq queries against nk keys/values,
 *   s_ij = q_i . k_j / sqrt(d),  lse_i = log sum_j exp(s_ij),
 *   A_i  = sum_j softmax(s_i)_j v_j,
 * where query i sees only keys j < visible + i (visible >= nk: all keys).
 * Rows are strided so heads can be read in place. scores: (nq, nk) scratch,
 * left holding the softmax probabilities. */
void attention_states(int nq, int nk, int d,
                      const float *q, int ldq,
                      const float *k, const float *v, int ldkv, int visible,
                      float *A, int ldA, float *lse, int ldlse, float *scores);
/* Backward of attention_states: given dA (nq, d) and dlse (nq; NULL = 0),
 * the forward A and the probabilities it left in `scores`, adds into dq
 * (nq, d), dk and dv (nk, d), each with the stride of its forward twin
 * (any may be NULL). tmp: (nq, nk) scratch. */
void attention_states_backward(int nq, int nk, int d, const float *q, int ldq,
                               const float *k, const float *v, int ldkv,
                               const float *A, const float *dA, int ldA, const float *dlse, int ldlse,
                               const float *scores, float *dq, float *dk, float *dv, float *tmp);
/* Merge of two states of the same query (exact split of one softmax sum). */
void merge_states(int d, const float *A1, float lse1, const float *A2, float lse2,
                  float *A, float *lse);
/* Backward of merge_states' A: gradients of both input states. */
void merge_states_backward(int d, const float *A1, float lse1, const float *A2, float lse2,
                           const float *dA, float *dA1, float *dlse1, float *dA2, float *dlse2);
/* Gate form of the same merge (local set not empty):
 * g = sigmoid(a_doc - lse_loc), out = g A_doc + (1 - g) A_loc. */
void gate_merge(int d, const float *A_doc, float a_doc, const float *A_loc,
                float lse_loc, float *out);

/* ------------------------------------------------------------------------ */
/* 2. Nectar modules: one per (layer, KV head)                              */

typedef enum { ARCH_MLP = 1, ARCH_QUAD = 2 } ModuleArch;

typedef struct {
    int width;          /* w (MLP) */
    int n_pairs;        /* p (quadrature) */
    float input_scale;  /* MLP input x = input_scale * q (not trained) */
    size_t n_params;
    float *params;      /* view into ModuleSet.params */
    float *grads;       /* view into ModuleSet.grads, or NULL */
} Module;

/* Prompts, one after another; the held-out ones travel in the module file,
 * with what their evaluation needs. A task prompt is a question followed by
 * the full-cache model's answer: its first question_len[i] tokens are what
 * a user types, the rest the answer, which ends with one of answer_stop.
 * Spans and continuations of the document have no answer part. */
enum { MAX_NODOC_PREFIX = 4096 };
enum { SPLIT_RANDOM = 0, SPLIT_CHALLENGE = 1, SPLIT_TASKS = 2 };
typedef struct {
    int n_prompts;
    int *offsets;             /* (n_prompts + 1) prompt i is tokens[offsets[i] .. offsets[i+1]) */
    int *tokens;              /* (offsets[n_prompts]) */
    unsigned char *split;     /* (n_prompts) where a held-out prompt counts: SPLIT_RANDOM, SPLIT_CHALLENGE
                               * (also in the random split: the held-out prompts least like the training
                               * ones) or SPLIT_TASKS (an evaluation-only task, never in self-study) */
    int *question_len;        /* (n_prompts) tokens before the answer; 0: no answer part */
    int answer_cap;           /* an answer is at most this many tokens */
    int answer_stop[2];       /* the tokens that end an answer (a text model's newline and BOS, a chat
                               * model's end of turn and end of text); -1: unused */
    int n_nodoc_prefix;       /* <= MAX_NODOC_PREFIX */
    int *nodoc_prefix;        /* (n_nodoc_prefix) what a prompt follows when there is no document:
                               * BOS, or a chat turn's opening (the document's own opening) */
} PromptSet;

typedef struct {
    ModuleArch arch;
    int n_layers, n_kv_heads, head_size;       /* L, G, d */
    int depth_backbone, depth_score, depth_target; /* Db, Ds, Dt (MLP) */
    int n_doc;                  /* n: the document length it replaces */
    float rho;                  /* budget: params / (2 n d) per module */
    int chat;                   /* 1: fitted to a document framed as a chat turn (--chat) */
    int later;                  /* 1: fitted to it as a later document of a composition (train
                                   --later-document: it continues others, no BOS or turn opening) */
    uint64_t model_fingerprint, doc_fingerprint;
    Module *modules;            /* (L * G), module of (l, g) at l * G + g */
    float *params;              /* (n_params) every module, contiguous */
    float *grads;               /* (n_params) or NULL */
    size_t n_params;
    PromptSet heldout;          /* held-out prompts, for infer --eval */
} ModuleSet;

/* The MLP's parameter layout (nectar.c explains it): hidden layers are
 * numbered backbone [0, Db), score head [Db, Db+Ds), target [Db+Ds, Db+Ds+Dt). */
enum { MAX_HIDDEN = 64 };
typedef struct {
    float *Vq[MAX_HIDDEN], *U[MAX_HIDDEN], *b[MAX_HIDDEN];  /* (w, d), (w, w) or NULL, (w) */
    float *ws, *bs, *Wt, *bt;                               /* (in_s), (1), (d, in_t), (d) */
} MlpParams;
/* The hidden layer feeding layer i, or -1 when it starts from the input. */
int    mlp_prev(int i, int Db, int Ds);
/* The hidden layer feeding the score (head 0) or target (head 1) output, or -1. */
int    mlp_head_input(int head, int Db, int Ds, int Dt);
/* Points p at a module's parameters (or gradients) at base; returns the count. */
size_t mlp_layout(int d, int w, int Db, int Ds, int Dt, float *base, MlpParams *p);
/* Parameters of one MLP module of width w. */
size_t mlp_param_count(int d, int w, int Db, int Ds, int Dt);
/* The largest width whose parameter count fits `budget`; 0 if none. */
int    mlp_width_for_budget(int d, long budget, int Db, int Ds, int Dt);
/* The size of one module for a budget of rho_n 2 d parameters, where rho_n =
 * rho x n (x its layer's multiplier) for a document of n tokens: an MLP's
 * largest width within it, or a quadrature module's p = floor(rho_n) pairs
 * (2 p d parameters); 0 if none. */
int    module_size_for_budget(ModuleArch arch, int d, double rho_n, int Db, int Ds, int Dt);
/* Parameters of one module of the set's architecture and this size (w or p). */
size_t module_param_count(const ModuleSet *s, int size);
/* 1 when the MLP depths are each >= 0 and sum to at most MAX_HIDDEN. */
int    depths_valid(int Db, int Ds, int Dt);
/* Allocates a set; widths (MLP) or pair counts (quad) per layer: (L). */
int  moduleset_alloc(ModuleSet *s, ModuleArch arch, int L, int G, int d,
                     int Db, int Ds, int Dt, const int *size_per_layer, int with_grads);
void moduleset_free(ModuleSet *s);
/* The longest prompt's length (at least 1). */
int  promptset_max_len(const PromptSet *p);
void promptset_free(PromptSet *p);

/* Scratch for a batch of up to max_q queries through one module. */
typedef struct {
    int max_q, max_width, max_pairs, n_hidden;
    float *x;       /* (N, d)  scaled input */
    float *pre;     /* (n_hidden, N, w) pre-activations */
    float *hid;     /* (n_hidden, N, w) SiLU(pre) */
    float *dhid;    /* (n_hidden, N, w) gradient scratch */
    float *dx;      /* (N, d) */
    float *probs;   /* (N, p) quadrature softmax */
    float *tmp;     /* (N, p) quadrature backward scratch */
} ModuleWork;

/* Sets the counts (max_q, widest module, most pairs, hidden layers) only. */
void modulework_shape(ModuleWork *w, const ModuleSet *s, int max_q);
void modulework_alloc(ModuleWork *w, const ModuleSet *s, int max_q);
void modulework_free(ModuleWork *w);
/* Random init (seeded). MLP: hidden N(0, 1/fan_in), output weights 0 and
 * output biases at the given means (mean_a (L*G), mean_A (L*G, d); NULL = 0).
 * Quadrature needs quad_init_from_cache instead. */
void mlp_init(ModuleSet *s, uint64_t seed, const float *mean_a, const float *mean_A);
/* W, Z = the first p cached keys/values of each (layer, KV head). */
struct DocCache;
void quad_init_from_cache(ModuleSet *s, const struct DocCache *doc);
/* Forward of N queries q (N, d) -> a (N), A (N, d). Keeps what backward needs. */
void module_forward(const ModuleSet *s, const Module *mod, ModuleWork *w,
                    const float *q, int N, float *a, float *A);
/* Backward of the last module_forward on w (A its output): given da (N) and
 * dA (N, d), adds parameter gradients into mod->grads and, if dq is not
 * NULL, writes dq (N, d). */
void module_backward(const ModuleSet *s, const Module *mod, ModuleWork *w,
                     const float *q, int N, const float *A, const float *da, const float *dA, float *dq);

/* ------------------------------------------------------------------------ */
/* 3. Losses and the fitting step                                           */

/* bf16, the upper half of an fp32 (sign, 8 exponent bits, 7 mantissa
 * bits): float -> bf16 rounds to nearest, ties to even (relative error at
 * most 2^-8: half the 2^-7 step at 1); bf16 -> float is exact. */
uint16_t bf16_from_float(float x);
float    float_from_bf16(uint16_t h);

/* What the full-cache model records at P positions, per layer: the targets
 * of the regression loss. q and A are kept in bf16, half the memory of
 * fp32 with the fit's result unmoved (measured in docs/results.md); alpha,
 * a log that the score loss compares at its own scale, stays fp32. */
typedef struct {
    long P;
    uint16_t *q;   /* (L, P, D) rotated queries, bf16 */
    uint16_t *A;   /* (L, P, D) exact document state A(q), bf16 */
    float *alpha;  /* (L, P, H) exact log attention mass alpha(q) */
} FitTargets;

/* One batch of B positions, a layer at a time: module g of the layer gets
 * the N = B * (H / G) queries of its heads, row b (H / G) + j for head j of
 * its group at position b. */
typedef struct {
    int B, N;
    long *pos;            /* (B) positions in the targets */
    float *q, *a, *A;     /* (G, N, d), (G, N), (G, N, d) module inputs and outputs */
    float *alpha_t, *A_t; /* (G, N), (G, N, d) their targets */
    float *da, *dA;       /* (G, N), (G, N, d) loss gradients */
    long *pos_device;     /* GPU only (NULL on the CPU): (B) pos on the device */
    double *row_loss;     /* GPU only: (L G N + 1) each row's loss, then their sum */
} FitBatch;

void fitbatch_alloc(FitBatch *b, const ModuleSet *s, int n_heads, int B);
void fitbatch_free(FitBatch *b);
/* Adds into s->grads the gradient of the regression loss of every module
 * over the positions b->pos,
 *   lambda_alpha mean (a - alpha)^2 + lambda_A mean ||A_theta - A||^2
 * (means over the module's N queries), and returns the loss summed over the
 * modules. w holds N queries. */
double regression_grads(ModuleSet *s, ModuleWork *w, FitBatch *b, const FitTargets *t, int n_heads,
                        float lambda_alpha, float lambda_A);
/* log softmax of n logits, in doubles: out_i = x_i - log sum_j exp(x_j). */
void   log_softmax(const float *x, int n, double *out);
/* KL(p || q) = sum_i p_i (log p_i - log q_i), from log-probabilities. */
double kl_divergence(const double *logp, const double *logq, int n);
/* Mean over ntok positions of KL(softmax(teacher) || softmax(student));
 * if dlogits (ntok, V) is not NULL, its gradient with respect to the
 * student's logits. */
double kl_loss(const float *teacher_logits, const float *student_logits, int ntok, int V, float *dlogits);
/* The teacher's distribution kept small: the k largest log-probabilities
 * of softmax(logits) (V of them) with their token ids, largest first, and
 * the log of the mass of the other V - k tokens (-inf when k = V). */
void   top_k_logprobs(const float *logits, int V, int k, int *ids, float *logp, float *log_rest);
/* Mean over ntok positions of the KL from the teacher's top k (ids, logp:
 * (ntok, k); log_rest: (ntok)) to the student, the other tokens one bucket
 * on both sides; if dlogits (ntok, V) is not NULL, its gradient with
 * respect to the student's logits. With k = V it is kl_loss. */
double kl_loss_top_k(const int *ids, const float *logp, const float *log_rest, int k, const float *student_logits,
                     int ntok, int V, float *dlogits);
/* Scales grads (n) down to norm max_norm when their norm is larger; returns
 * the norm before. */
double clip_grad_norm(float *grads, size_t n, double max_norm);
/* AdamW's constants, shared by the CPU and the GPU (module fitting uses
 * beta2 ADAM_BETA2; pretraining 0.95) */
#define ADAM_BETA1 0.9f
#define ADAM_BETA2 0.999f
#define ADAM_EPS   1e-8f
/* One AdamW step; `step` counts from 1:
 *   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,
 *   theta -= lr ((m / c1) / (sqrt(v / c2) + eps) + wd theta),  c_i = 1 - b_i^step */
void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, int step, float lr, float wd,
                  float beta2);

/* ------------------------------------------------------------------------ */
/* 4. The transformer: the forward pass                                     */

/* On the CPU each KV head's keys (and values) lie together, (L, G, n, d):
 * a head's attention reads them as one stream (a decode step's products of
 * three queries against them ran at half the speed with the heads
 * interleaved, (L, n, KVD)). nectar_cuda.cu's device copies keep (L, n, KVD). */
typedef struct DocCache {
    int n;          /* document tokens */
    int n_layers, kv_dim;
    float *key;     /* (L, G, n, d) rotated at positions 0..n-1 */
    float *value;   /* (L, G, n, d) */
    uint64_t fingerprint; /* hash of the document's token ids */
} DocCache;

/* An exact document's keys are split into chunks of DOC_CHUNK_KEYS keys
 * (the last one shorter), whose states merge: the chunks run on the pool's
 * threads. */
enum { DOC_CHUNK_KEYS = 256 };

/* Where the document's attention state comes from: its KV cache (exact) or
 * its modules (Nectar). */
typedef enum { DOC_EXACT = 1, DOC_NECTAR = 2 } DocMode;

typedef struct Document {
    DocMode mode;
    int n;                       /* document length (cache->n or modules->n_doc) */
    const DocCache *cache;       /* DOC_EXACT */
    const ModuleSet *modules;    /* DOC_NECTAR */
    const struct Document *next; /* a composition: the next document, at the positions after this one's,
                                    exact or Nectar on its own; NULL: the last (or only) one */
} Document;

/* No document: the exact path with no cache, whose state is the empty
 * state (0, -inf); the local tokens start at position 0. */
extern const Document NO_DOCUMENT;

/* A composition of documents d_1 .. d_m (doc, doc->next, ...): d_i sits at
 * positions P_i = n_1 + ... + n_(i-1) onwards, the local tokens after all
 * of them. Each document's KV cache is prefilled on its own (or its modules
 * fitted) at positions 0 .. n_i - 1, so a query at position t reads d_i
 * rotated back by P_i (RoPE is relative: q(t - P_i) . k(j) = q(t) . k(P_i + j)).
 * The documents' states and the local state merge by log-sum-exp, in any
 * order. The forward pass runs compositions on the CPU; backward and the
 * GPU take one document. */
enum { MAX_DOCUMENTS = 8 };
/* The tokens before the local ones: the documents' lengths added up. */
int document_length(const Document *doc);
/* The documents of a composition (1 for one document or none). */
int document_count(const Document *doc);

/* What the teacher pass records (runstate_enable_taps): every layer's
 * queries and document states. */
typedef struct {
    float *q;       /* (L, B, D) rotated queries */
    float *doc_A;   /* (L, B, D) document state A per query head (one document: forward_check refuses a
                       composition) */
    float *doc_lse; /* (L, B, H) document state lse (alpha) */
} TeacherTaps;

/* What backward needs (runstate_enable_backward): forward keeps every
 * layer's input, backward recomputes each layer from it. Each gradient has
 * the shape of its forward twin (d + the RunState buffer's name). */
typedef struct {
    float *saved_x;     /* (L + 1, B, D) input of layer l; the final residual at L */
    float *dx, *dx_mid, *dxb, *dq, *datt;  /* (B, D) */
    float *dk, *dv;                        /* (B, KVD) */
    float *dhb, *dhb2, *dhgate;            /* (B, F) */
    float *ddoc_A, *dloc_A;                /* (B, D) */
    float *ddoc_lse, *dloc_lse;            /* (B, H) */
    float *dmq, *dmA, *dma;                /* module twins: (B * H, d), (B * H, d), (B * H) */
    float *tmp;                            /* (B, max(n, capacity)) */
} BackwardBuffers;

/* The forward buffers of a block of up to B tokens, the local KV cache, and
 * the optional taps and backward buffers. */
typedef struct {
    int max_block, capacity, max_doc;  /* B, local tokens cached per sequence, n (the longest exact
                                          document's of a composition) */
    int n_seqs;                        /* S: sequences with a local cache of their own */
    int with_modules;                  /* sized for documents' modules (DOC_NECTAR) */
    float *x;       /* (B, D) residual stream */
    float *xb;      /* (B, D) rmsnorm(x) before attention (and before the classifier) */
    float *q;       /* (B, D) queries of every head, rotated */
    float *k;       /* (B, KVD) */
    float *v;       /* (B, KVD) */
    float *att;     /* (B, D) merged attention output of every head */
    float *doc_A;   /* (B, H, d) document state per query head (of a composition: all its documents merged) */
    float *doc_lse; /* (B, H) */
    float *loc_A;   /* (B, H, d) local state */
    float *loc_lse; /* (B, H) */
    float *tile_A;  /* (B, H, d) the local state of one tile of keys, merged into loc_A; before the
                       local states, a later document's state (compose_documents) */
    float *tile_lse;/* (B, H) the same; after the merge, the merged lse (unused downstream) */
    float *rope;    /* (B, d) cos and sin of each row's RoPE angles, the pair (cos, sin) of pair i at 2 (i / 2) */
    float *rope_doc;/* (d) the same for one offset: a later document's, to rotate queries back by */
    float *x_mid;   /* (B, D) residual after attention */
    float *xb2;     /* (B, D) rmsnorm(x_mid) */
    float *hb;      /* (B, F) W1 xb2 */
    float *hb2;     /* (B, F) W3 xb2 */
    float *hgate;   /* (B, F) SiLU(hb) * hb2 */
    float *scores;  /* (B, max(capacity, (H / G) n)): a head's B local rows, or a KV group's B (H / G) over n keys */
    float *logits;  /* (B, V) */
    float *key_cache;   /* (L, S, G, capacity, d) local keys, rotated (the GPU's: (L, capacity, KVD)) */
    float *value_cache; /* (L, S, G, capacity, d) */
    float *mq;          /* (B * H, d) queries gathered per KV head (DOC_NECTAR, or an exact document) */
    float *ma;          /* (B * H) their document state: module scores, or lse */
    float *mA;          /* (B * H, d) module targets, or A */
    float *chunk_A;     /* (n / DOC_CHUNK_KEYS rounded up, B * H, d) an exact document's states per chunk */
    float *chunk_lse;   /* (n / DOC_CHUNK_KEYS rounded up, B * H) */
    ModuleWork work;    /* for DOC_NECTAR */
    TeacherTaps taps;   /* NULL unless runstate_enable_taps: forward copies into them */
    BackwardBuffers back; /* NULL unless runstate_enable_backward */
    int block_pos, block_ntok;  /* local position and length of the last forward's block */
} RunState;

/* The buffers of a run state by group, with their sizes in floats: the one
 * table that allocating and freeing read, on the CPU and the GPU (adding a
 * buffer is one line there). A size of 0 leaves the buffer NULL. The shape
 * fields of s (max_block, capacity, max_doc, with_modules) must be set. */
typedef enum { BUFFERS_FORWARD, BUFFERS_TAPS, BUFFERS_BACKWARD } BufferGroup;
typedef struct { float **buf; size_t floats; } RunBuffer;
enum { MAX_RUN_BUFFERS = 32 };
int  runstate_buffers(RunState *s, const Config *c, BufferGroup group, RunBuffer table[MAX_RUN_BUFFERS]);
/* A run state is sized for the document(s) doc it will serve: an exact one
 * for caches up to its cache's length, a Nectar one for modules up to its
 * modules' sizes; no document needs nothing. Comparing an exact and a
 * Nectar document takes a run state for each (forward refuses a document
 * its run state was not sized for, with a sentence). */
void runstate_alloc(RunState *s, const Model *m, const Document *doc, int max_block, int capacity);
/* The same for n_seqs sequences at once (forward_segments), each with a
 * local cache of `capacity` tokens; runstate_alloc is one sequence. */
void runstate_alloc_seqs(RunState *s, const Model *m, const Document *doc, int max_block, int capacity, int n_seqs);
void runstate_free(RunState *s);
/* Allocates the taps (freed with the run state). */
void runstate_enable_taps(RunState *s, const Model *m);
/* Allocates what backward needs (freed with the run state). */
void runstate_enable_backward(RunState *s, const Model *m);

/* Where logits land, for forward and forward_segments alike: LOGITS_ALL,
 * row r of the block in row r of s->logits (B, V); LOGITS_LAST, the last
 * row of segment k in row k (forward is one segment: its last token's
 * logits are row 0, s->logits itself); LOGITS_NONE, none. */
/* Runs tokens (ntok <= B) at local positions [pos, pos + ntok), writing their
 * keys/values into the local cache, and their logits (LOGITS_*, above). Returns 0, or -1 with a
 * sentence (ids out of range, block or capacity exceeded). The model's
 * context is not enforced here (benchmarks run past it); programs check it. */
enum { LOGITS_NONE = 0, LOGITS_LAST = 1, LOGITS_ALL = 2 };
int forward(const Model *m, RunState *s, const Document *doc,
            const int *tokens, int ntok, int pos, int logits);
/* forward's checks of its arguments (shared with the GPU forward): 0, or -1
 * with a sentence. */
int forward_check(const Model *m, const RunState *s, const Document *doc, const int *tokens, int ntok, int pos);

/* A run of ntok tokens of sequence seq at its local positions
 * [pos, pos + ntok). */
typedef struct { const int *tokens; int ntok, seq, pos; } Segment;
/* forward over several sequences at once, all after the same document: the
 * segments' tokens, one after another (at most B rows in all), go through
 * every weight matrix as one product, and each row attends to the document
 * and to its own sequence's local tokens. Logits as forward's: every row
 * in block order, or segment k's last row in row k. 0, or -1 with a sentence. */
int forward_segments(const Model *m, RunState *s, const Document *doc, const Segment *seg, int n_segs, int logits);

/* Prefill of the document: builds its KV cache in blocks of `block`. */
int  doccache_build(DocCache *c, const Model *m, const int *tokens, int n, int block);
void doccache_free(DocCache *c);
uint64_t document_fingerprint(const int *tokens, int n);

/* ------------------------------------------------------------------------ */
/* 5. The transformer: the backward pass                                    */

/* Backward of the last forward (one block from local position 0, run with
 * backward enabled): given dlogits (ntok, V), adds the gradients of the
 * modules' parameters (DOC_NECTAR, into their grads) and, when dw is not
 * NULL, of the model's weights (dw: views of a block shaped like
 * Model.params). The model itself stays frozen. */
int backward(const Model *m, RunState *s, const Document *doc, const int *tokens, int ntok,
             const float *dlogits, Weights *dw);

/* ------------------------------------------------------------------------ */
/* 6. Compiling a document (src/compile.c)                                  */

/* The modules of a document within the budget: rho * 2 n d parameters per
 * (layer, KV head), times the layer's multiplier (layer_mult (L), averaging
 * 1; NULL: 1 everywhere). Sets every field the forward needs and the
 * module file's budget and fingerprints (n_doc, rho, both fingerprints,
 * `model`'s and `cache`'s shape), with gradients when with_grads; what the
 * caller knows of the document's framing (chat, later) and the held-out
 * prompts it keeps (heldout) stay 0 until set. 0, or -1 with a sentence when a layer gets
 * no room (or, for quadrature, more pairs than the document has). */
int moduleset_for_budget(ModuleSet *ms, const Model *m, const DocCache *cache, ModuleArch arch, float rho,
                         int Db, int Ds, int Dt, const float *layer_mult, int with_grads);

/* What the full-cache model (the teacher) records over the training
 * prompts: per layer P positions, each with H query heads, and the KL
 * term's teacher. */
typedef struct {
    FitTargets fit; /* P, and q, A(q), alpha(q) at the P positions */
    float *logits;  /* (P, V) the teacher's logits, for the KL term (or NULL) */
    int top_k;      /* > 0: instead, the teacher's top k at each position (top_k_logprobs): */
    int *top_ids;   /* (P, top_k) their token ids */
    float *top_logp, *top_rest; /* (P, top_k) their log-probabilities; (P) the log of the rest's mass */
    int n_train;    /* training prompts */
    int *prompt;    /* (n_train) their index in the prompt set */
    long *start;    /* (n_train) the position of their first token in P */
} TeacherData;

/* Room for the targets of the prompts with is_train[i] (td->prompt,
 * td->start set), and, when want_logits, for the KL term's teacher: its top
 * top_k (> 0), or all its logits when they take at most logits_budget bytes
 * (else the fit recomputes them). Returns the bytes allocated. */
size_t teacher_alloc(TeacherData *td, const Config *c, const PromptSet *p, const unsigned char *is_train,
                     int want_logits, int top_k, size_t logits_budget);
/* Progress of a long step: `done` of `total` (prompts, steps). */
typedef void (*ProgressFn)(const char *what, long done, long total, void *user);
/* The teacher pass: the model runs every prompt of p after doc (exact),
 * several prompts a forward, recording the training prompts' targets into
 * td (teacher_alloc'd); every prompt's embedding, the mean of its final
 * normalised hidden states, goes into embed (n_prompts, D) when not NULL.
 * progress (or NULL) after each forward. 0, or -1 with a sentence. */
int  teacher_pass(const Model *m, const Document *doc, const PromptSet *p, const unsigned char *is_train,
                  TeacherData *td, float *embed, ProgressFn progress, void *user);
void teacherdata_free(TeacherData *td);

/* The modules' starting point. MLP: input scale 1 / rms(q) and output
 * biases at the training means of alpha and A, per (layer, KV head), from
 * the teacher's targets; hidden weights drawn from `seed` (mlp_init).
 * Quadrature: the first p pairs of the document's KV cache. */
void moduleset_init(ModuleSet *ms, const FitTargets *targets, const DocCache *cache, const Config *c,
                    uint64_t seed);

/* The fit's settings. Stage 1 minimises
 *   L = lambda_alpha L_alpha / var_alpha + lambda_A L_A / var_A + lambda_kl KL(teacher || Nectar)
 * for `steps` steps at peak rate lr (var_*: the targets' variances, the
 * loss of modules that predict their means); stage 2, when kl_steps > 0,
 * pure KL from stage 1's modules, with fresh AdamW moments and its own
 * schedule at peak rate kl_lr. Each stage: linear warmup over
 * warmup_fraction of its steps, then cosine decay to 0; global gradient
 * clipping at 1.0; AdamW with weight_decay. A step draws `batch` positions
 * (the regression) and kl_prompts training prompts (the KL term) from a
 * generator seeded by (seed, its step within the stage). */
typedef struct {
    int steps, kl_steps, batch, kl_prompts;
    float lr, kl_lr, weight_decay, warmup_fraction;
    float lambda_alpha, lambda_A, lambda_kl;
    unsigned long long seed;
} FitOptions;
/* 1 when the fit has a KL term (the teacher's logits are needed). */
int fit_uses_kl(const FitOptions *o);

/* A stage: the fit's steps [first, first + steps), its peak rate and its
 * loss weights (the regression ones divided by their normalisers). */
typedef struct {
    int first, steps;
    float lr;
    float weight_alpha, weight_A, lambda_kl;
} Stage;
/* lr(t) at the stage's step t (from 0): linear warmup over warmup_fraction
 * of its steps to the peak, then cosine decay to 0. */
float learning_rate(const Stage *s, float warmup_fraction, int t);

/* The teacher at one prompt's positions: its logits (len, V), or its top k
 * (k > 0: ids and logp (len, k), rest (len)). */
typedef struct {
    const float *logits;
    int k;
    const int *ids;
    const float *logp, *rest;
} TeacherRows;
/* One prompt's KL term, weight KL(teacher || student): returns the KL and
 * leaves its gradient with respect to the student's logits, times the
 * weight, in dlogits (len, V). */
double kl_term(const TeacherRows *teacher, const float *student_logits, int len, int V, float weight,
               float *dlogits);

/* A fit in progress: the modules and their AdamW moments, the teacher's
 * data, and the device's buffers (fit_backend_cpu's here; the GPU's,
 * nectar_cuda.cu's fit_backend_cuda, keep device copies, synchronised with
 * the host by fit_sync). */
typedef struct Fit Fit;
typedef struct {
    void   (*start)(Fit *f);
    double (*regression)(Fit *f, const long *pos);  /* zeroes the gradients, adds the regression's */
    double (*kl)(Fit *f, const int *tokens, int len, const TeacherRows *teacher, float weight);  /* adds */
    double (*update)(Fit *f, float lr, int t);       /* clipping, AdamW step t of the stage (from 1) */
    void   (*download)(Fit *f);                      /* parameters and moments to the host */
    void   (*finish)(Fit *f);
} FitBackend;
const FitBackend *fit_backend_cpu(void);

struct Fit {
    FitOptions o;
    const FitBackend *backend;
    const Model *model;
    ModuleSet *ms;
    const TeacherData *td;
    const PromptSet *prompts;  /* the prompts td indexes */
    const Document *doc;       /* the exact document: the KL term's teacher, where td keeps no logits */
    RunState teacher;          /* its run state then */
    Stage stages[2];
    const Stage *stage;        /* the stage of the step being taken */
    int step;                  /* the steps done, through both stages */
    float *adam_m, *adam_v;    /* (n_params) AdamW moments */
    long *pos;                 /* (batch) the step's positions in the targets */
    float *dlogits;            /* (max_len, V) the CPU's KL term's gradient, or NULL without one */
    ModuleWork work;           /* the CPU's: a module's batch of queries */
    FitBatch batch;
    Document student_doc;      /* the KL term's student: the Nectar model, teacher-forced */
    RunState student;
    void *device;              /* the GPU backend's state */
    double diverged_loss, diverged_norm;  /* set when fit_steps returns FIT_DIVERGED */
};

/* What a step reports to the progress callback. */
typedef struct {
    int step, last_step;  /* the step just taken (from 1), the last of this fit_steps */
    int stage;            /* 0, or 1: the KL stage */
    double loss, grad_norm;
    float lr;
} FitStatus;
/* Called after every step; it may fit_sync and save a checkpoint. Returns
 * 0 to go on, or -1 (after a sentence) to stop the fit. */
typedef int (*FitProgressFn)(Fit *f, const FitStatus *st, void *user);
enum { FIT_DIVERGED = -2 };

/* Sets up a fit of ms (moduleset_for_budget'd with gradients, and
 * initialised) on td's targets over `prompts`, doc the exact document,
 * on `backend` (NULL: the CPU). 0, or -1 with a sentence (no training
 * positions, no gradients, a batch below 1, kl_prompts outside
 * 1..MAX_KL_PROMPTS with a KL term); fit_end is safe after either, and on
 * a zeroed Fit. */
enum { MAX_KL_PROMPTS = 64 };
int  fit_begin(Fit *f, const Model *m, ModuleSet *ms, const TeacherData *td, const PromptSet *prompts,
               const Document *doc, const FitOptions *o, const FitBackend *backend);
/* Runs the fit's steps from f->step up to last_step (at most
 * o.steps + o.kl_steps: more is refused), on the backend's device from start to finish
 * (the modules on the host after it). The batches depend only on (seed, the stage's
 * step), so a fit stopped and continued (f->step and the moments restored)
 * draws the same ones. 0; FIT_DIVERGED when the loss or the gradient norm
 * stops being finite (f->diverged_*); -1 after a sentence. */
int  fit_steps(Fit *f, int last_step, FitProgressFn progress, void *user);
/* The modules and moments on the host, in a progress callback (for a
 * checkpoint). */
void fit_sync(Fit *f);
/* Frees the fit's buffers; the modules stay in ms. */
void fit_end(Fit *f);

/* ------------------------------------------------------------------------ */
/* 7. Module files (src/modfile.c)                                          */

/* A fixed header (the shape, budget, depths and both fingerprints), the
 * module table, the parameters, the held-out prompts, and a checksum of
 * every byte before it; written atomically. load refuses a file fitted to
 * another model or document (fingerprints given; 0 skips that check), a
 * file whose checksum or sizes do not match, with a sentence. */
int  moduleset_save(const ModuleSet *s, const char *path);
int  moduleset_load(ModuleSet *s, const char *path, uint64_t model_fp, uint64_t doc_fp);

/* ------------------------------------------------------------------------ */
/* 8. Generation                                                            */

/* A token sampler, as llama2.c's: greedy (argmax) at temperature 0; else a
 * draw from softmax(logits / temperature), restricted to the top-p mass
 * (the smallest set of likeliest tokens whose probabilities add up to at
 * least topp) when 0 < topp < 1. Its generator is seeded (seed 0 counts as 1). */
typedef struct { float prob; int index; } Candidate;
typedef struct {
    float temperature, topp;
    uint64_t rng;
    Candidate *cand;  /* (V) probabilities, sorted for top-p */
} Sampler;

void sampler_init(Sampler *s, int vocab_size, float temperature, float topp, uint64_t seed);
void sampler_free(Sampler *s);
/* The next token from logits (n = V). */
int  sample(Sampler *s, const float *logits, int n);

/* Tokens after a document doc (exact, Nectar, a composition, or
 * &NO_DOCUMENT): the prompt (n_prompt ids) at local positions 0 ..
 * n_prompt - 1, then up to max_new tokens into out (max_new), each drawn by
 * the sampler from the last row's logits (V) and fed back, until one equal
 * to stop[0] or stop[1] (kept as the last token; -1: no stop). The tokens
 * fed, the prompt and every new token but the last, must fit the model's
 * context after the document: n + n_prompt + max_new - 1 <= T. Runs the CPU
 * forward on a run state of its own (a block of n_prompt). Returns the
 * tokens written, or -1 with a sentence (a prompt of no tokens, max_new
 * below 0, past the context, ids outside the vocabulary). */
int generate(const Model *m, const Document *doc, const int *prompt, int n_prompt, int max_new, const int stop[2],
             Sampler *sampler, int *out);

#endif
