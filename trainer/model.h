/*
 * model.h — the reference trainer's model: a small LLaMA (byte vocabulary,
 * RMSNorm, causal attention with RoPE and optional grouped-query heads,
 * SwiGLU MLP, optional tied lm_head) in fp32, its forward and backward pass
 * and its parameter table.
 *
 * Parameters live in ONE flat buffer (and gradients in ONE flat buffer of
 * the same size) whose tensor order, names and shapes are exactly those of
 * Hugging Face LlamaForCausalLM.named_parameters(); the per-tensor views
 * below point into it. The same order is igrad's layout of the model
 * (model_layout()), so a tensor's `offset` in the flat buffer is its
 * igrad_tensor_info_t.offset.
 *
 * Not here: the optimizer (optim.h), checkpoints (checkpoint.h), data
 * (data.h). Errors: fallible calls return igrad_status_t and leave a
 * message in trainer_last_error() (the trainer keeps its own message buffer
 * because it uses only libigrad's public API).
 */
#ifndef IGRAD_TRAINER_MODEL_H
#define IGRAD_TRAINER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "igrad.h"

#define MODEL_VOCAB_SIZE 257   /* 256 bytes + end-of-text */
#define MODEL_EOT_TOKEN 256
#define MODEL_IGNORE_INDEX (-1) /* target value excluded from the loss */
#define MODEL_NAME_MAX 96       /* longest parameter name, with the NUL */

/* Architecture. Glossary: V vocab, L layers, C model width, H query heads,
 * KV key/value heads (H % KV == 0), hd = C / H head width, F MLP width,
 * maxT longest sequence (RoPE table). */
typedef struct model_config {
    int vocab_size;      /* V (257 for the byte vocabulary) */
    int n_layer;         /* L */
    int dim;             /* C */
    int n_head;          /* H */
    int n_kv_head;       /* KV */
    int ffn_dim;         /* F */
    int max_seq_len;     /* maxT = max_position_embeddings */
    int tie_embeddings;  /* 1: lm_head shares model.embed_tokens.weight */
    double rope_theta;   /* 10000 */
    double rms_norm_eps; /* 1e-5 */
} model_config_t;

/* Fills `cfg` with a named size: "tiny" (tests, ~35k parameters), "small"
 * (~3M), "base" (~25M). @return IGRAD_E_INVALID for another name. */
igrad_status_t model_config_preset(const char *name, model_config_t *cfg);

/* Checks divisibility and ranges (message names the field). */
igrad_status_t model_config_validate(const model_config_t *cfg);

/* Sets one architecture option by its CLI name (without "--"): layers,
 * dim, heads, kv-heads, ffn, seq-len, vocab, rope-theta, rms-eps, tie
 * (value "0"/"1", "true"/"false"; NULL means 1). @return IGRAD_E_INVALID
 * for a bad value, IGRAD_E_UNSUPPORTED for an unknown key (so callers can
 * try their own options). Validation of the whole config is separate. */
igrad_status_t model_config_set(model_config_t *cfg, const char *key, const char *value);

/* Number of parameters the config creates (tied lm_head counted once). */
int64_t model_config_num_params(const model_config_t *cfg);

/* One row of the parameter table, in HF named_parameters() order. */
typedef struct model_tensor {
    char name[MODEL_NAME_MAX]; /* e.g. "model.layers.0.self_attn.q_proj.weight" */
    int ndim;                  /* 1 or 2 */
    int64_t shape[2];          /* unused dims are 1 */
    int64_t count;             /* entries */
    int64_t offset;            /* entries before it in the flat buffers */
} model_tensor_t;

/* Views of one block's tensors into a flat buffer. q, k, v are adjacent (as
 * are gate, up), which the forward pass uses to run each group as a single
 * matrix product. */
typedef struct model_layer {
    float *wq;      /* (H*hd, C)  self_attn.q_proj.weight */
    float *wk;      /* (KV*hd, C) self_attn.k_proj.weight */
    float *wv;      /* (KV*hd, C) self_attn.v_proj.weight */
    float *wo;      /* (C, H*hd)  self_attn.o_proj.weight */
    float *wgate;   /* (F, C)     mlp.gate_proj.weight */
    float *wup;     /* (F, C)     mlp.up_proj.weight */
    float *wdown;   /* (C, F)     mlp.down_proj.weight */
    float *ln1;     /* (C)        input_layernorm.weight */
    float *ln2;     /* (C)        post_attention_layernorm.weight */
} model_layer_t;

/* Views of all tensors into one flat buffer (parameters or gradients). */
typedef struct model_views {
    float *embed;          /* (V, C) model.embed_tokens.weight */
    model_layer_t *layers; /* [L] */
    float *norm;           /* (C) model.norm.weight */
    float *lm_head;        /* (V, C) lm_head.weight; == embed when tied */
} model_views_t;

/* Activations kept from forward for backward, for B*T positions ("BT"). */
typedef struct model_acts {
    int B, T;             /* shape they were computed for */
    int capacity_bt;      /* B*T they are allocated for */
    float *mem;           /* the one allocation below point into */
    float *resid;         /* (L+1, BT, C) residual stream entering each layer ([0] =
                             embeddings, [L] = input of the final norm) */
    float *ln1;           /* (L, BT, C) input_layernorm output */
    float *ln1_rstd;      /* (L, BT) 1/rms */
    float *qkv;           /* (L, BT, (H+2KV)*hd) q|k|v per row, q and k after RoPE */
    float *att;           /* (L, B, H, T, T) softmax probabilities (causal) */
    float *atty;          /* (L, BT, H*hd) attention output before o_proj */
    float *resid_mid;     /* (L, BT, C) residual after attention */
    float *ln2;           /* (L, BT, C) post_attention_layernorm output */
    float *ln2_rstd;      /* (L, BT) */
    float *gu;            /* (L, BT, 2F) gate|up per row */
    float *mlph;          /* (L, BT, F) silu(gate) * up */
    float *lnf;           /* (BT, C) final norm output */
    float *lnf_rstd;      /* (BT) */
    float *logits;        /* (BT, V) */
    float *dlogits;       /* (BT, V) d loss / d logits (filled by forward when targets given) */
    /* backward scratch, reused by every layer */
    float *dresid;        /* (BT, C) gradient of the residual stream */
    float *dln;           /* (BT, C) gradient of a norm output */
    float *dqkv;          /* (BT, (H+2KV)*hd) */
    float *datt;          /* (B, H, T, T) */
    float *datty;         /* (BT, H*hd) */
    float *dgu;           /* (BT, 2F) */
    float *dmlph;         /* (BT, F) */
    double *losses;       /* (BT) per-position cross-entropy (0 where masked) */
    int32_t *inputs;      /* (BT) copy of the last forward's inputs */
    int32_t *targets;     /* (BT) copy of its targets (MODEL_IGNORE_INDEX = masked) */
} model_acts_t;

typedef struct model {
    model_config_t config;
    int head_dim;             /* hd = C / H */
    int64_t num_params;       /* entries of the flat buffers */
    int n_tensors;            /* 1 + 9L + 1 (+1 untied lm_head) */
    model_tensor_t *tensors;  /* [n_tensors] in HF order */
    float *params;            /* (num_params) */
    float *grads;             /* (num_params), accumulated by model_backward */
    model_views_t p;          /* views into params */
    model_views_t g;          /* views into grads */
    float *rope_cos;          /* (maxT, hd/2) */
    float *rope_sin;          /* (maxT, hd/2) */
    model_acts_t acts;
    double loss;              /* mean cross-entropy of the last forward with targets, or -1
                                 (double: finite-difference checks need its low bits) */
    int64_t loss_count;       /* targets that counted (not masked) in it */
    int have_forward;         /* backward needs a forward with targets first */
} model_t;

/* Allocates parameters (zeroed), gradients (zeroed) and the tables. */
igrad_status_t model_create(const model_config_t *cfg, model_t **out);
void model_free(model_t *m);

/* Initialises like Hugging Face: every matrix ~ normal(0, std) (std 0.02 by
 * default), norm weights 1. Deterministic for a seed; independent of the
 * thread count. */
void model_init_random(model_t *m, uint64_t seed, float std);

/* Forward over B sequences of T tokens (inputs, targets: (B, T) row-major,
 * tokens in [0, V)). With targets, computes the mean cross-entropy over the
 * targets that are not MODEL_IGNORE_INDEX into m->loss (0 when all are
 * masked) and prepares backward; targets may be NULL (logits only).
 * Activations grow as needed. T <= max_seq_len. */
igrad_status_t model_forward(model_t *m, const int32_t *inputs, const int32_t *targets,
                             int B, int T);

/* Backward of the last forward with targets: ADDS d loss / d params to
 * m->grads (so micro-batches accumulate; see model_zero_grad and
 * optim_scale). The loss is this micro-batch's mean over its own targets. */
igrad_status_t model_backward(model_t *m);

/* Sets every gradient to 0. */
void model_zero_grad(model_t *m);

/* Index of a tensor by name, or -1. */
int model_find_tensor(const model_t *m, const char *name);

/* igrad's layout of this model (same names, shapes, order, F32); the flat
 * buffer offsets equal the layout's offsets. Free with igrad_layout_free. */
igrad_status_t model_layout(const model_t *m, igrad_layout_t **out);

/* Per-tensor float pointers into `flat` (params or grads) in HF order, as
 * igrad's engine borrows them. `ptrs` has n_tensors entries. */
void model_tensor_pointers(const model_t *m, float *flat, float **ptrs);

/* Message of the calling thread's most recent failing trainer call. */
const char *trainer_last_error(void);

/* Records a message for trainer_last_error() and returns `st` (shared by
 * model.c, optim.c and checkpoint.c). */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
igrad_status_t trainer_fail(igrad_status_t st, const char *fmt, ...);

#endif /* IGRAD_TRAINER_MODEL_H */
