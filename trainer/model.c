/*
 * model.c — the reference trainer's LLaMA in fp32: configuration presets,
 * the parameter table (Hugging Face names, shapes and order), random
 * initialisation, and the layer-by-layer forward and backward passes.
 *
 * Not here: the optimizer (optim.c), reading and writing checkpoints
 * (checkpoint.c), tokens and corpora (data.c), gradient synchronization
 * (libigrad's engine).
 *
 * Glossary (as in llm.c):
 *   B  batch size (sequences)          T  sequence length (positions)
 *   BT B*T rows of every activation    C  model width (hidden_size)
 *   V  vocabulary (257 bytes + EOT)    L  layers
 *   H  query heads                     KV key/value heads (H % KV == 0)
 *   hd head width C/H                  F  MLP width (intermediate_size)
 *   Dq = H*hd, Dk = KV*hd, Dqkv = Dq + 2*Dk (q|k|v side by side per row)
 *
 * Matrix products go through cblas_sgemm (row-major; a Linear's weight is
 * (out, in), so y = x W^T). Other loops are OpenMP-parallel over rows or
 * over columns; every sum has a fixed order, so results do not depend on
 * the OpenMP thread count. Attention's per-head products run one after the
 * other (each may use OpenBLAS threads) because OpenBLAS's pthread build
 * should not be entered from several OpenMP threads at once.
 *
 * Layer functions are `<layer>_forward(out..., in...)` and
 * `<layer>_backward(dinput..., dweight..., doutput, saved...)`; backward
 * functions ADD into parameter gradients and into the residual-stream
 * gradient, so micro-batches and the tied embedding accumulate naturally.
 */
#include "model.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* errors                                                                   */
/* ------------------------------------------------------------------------ */

static _Thread_local char trainer_error[1024];

const char *trainer_last_error(void) { return trainer_error; }

igrad_status_t trainer_fail(igrad_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(trainer_error, sizeof trainer_error, fmt, ap);
    va_end(ap);
    return st;
}

/* ------------------------------------------------------------------------ */
/* configuration                                                            */
/* ------------------------------------------------------------------------ */

igrad_status_t model_config_preset(const char *name, model_config_t *cfg)
{
    model_config_t c = {
        .vocab_size = MODEL_VOCAB_SIZE,
        .tie_embeddings = 0,
        .rope_theta = 10000.0,
        .rms_norm_eps = 1e-5,
    };
    if (name && !strcmp(name, "tiny")) {
        c.n_layer = 2, c.dim = 32, c.n_head = 4, c.n_kv_head = 2, c.ffn_dim = 64;
        c.max_seq_len = 64;
    } else if (name && !strcmp(name, "small")) {
        c.n_layer = 4, c.dim = 256, c.n_head = 8, c.n_kv_head = 4, c.ffn_dim = 688;
        c.max_seq_len = 256;
    } else if (name && !strcmp(name, "base")) {
        c.n_layer = 8, c.dim = 512, c.n_head = 8, c.n_kv_head = 8, c.ffn_dim = 1376;
        c.max_seq_len = 512;
    } else {
        return trainer_fail(IGRAD_E_INVALID, "unknown model size '%s' (tiny, small, base)",
                            name ? name : "(null)");
    }
    *cfg = c;
    return IGRAD_OK;
}

igrad_status_t model_config_validate(const model_config_t *c)
{
    /* Bounds keep every int product below (BT * max(Dqkv, 3F)) in range. */
    if (c->vocab_size < 1 || c->vocab_size > (1 << 20))
        return trainer_fail(IGRAD_E_INVALID, "vocab_size %d outside [1, 2^20]", c->vocab_size);
    if (c->n_layer < 1 || c->n_layer > 1024)
        return trainer_fail(IGRAD_E_INVALID, "num_hidden_layers %d outside [1, 1024]",
                            c->n_layer);
    if (c->dim < 1 || c->dim > 65536)
        return trainer_fail(IGRAD_E_INVALID, "hidden_size %d outside [1, 65536]", c->dim);
    if (c->n_head < 1 || c->dim % c->n_head != 0)
        return trainer_fail(IGRAD_E_INVALID,
                            "num_attention_heads %d does not divide hidden_size %d",
                            c->n_head, c->dim);
    if ((c->dim / c->n_head) % 2 != 0)
        return trainer_fail(IGRAD_E_INVALID, "head width %d (hidden_size / heads) must be "
                            "even for RoPE", c->dim / c->n_head);
    if (c->n_kv_head < 1 || c->n_head % c->n_kv_head != 0)
        return trainer_fail(IGRAD_E_INVALID,
                            "num_key_value_heads %d does not divide num_attention_heads %d",
                            c->n_kv_head, c->n_head);
    if (c->ffn_dim < 1 || c->ffn_dim > 1 << 18)
        return trainer_fail(IGRAD_E_INVALID, "intermediate_size %d outside [1, 2^18]",
                            c->ffn_dim);
    if (c->max_seq_len < 1 || c->max_seq_len > 65536)
        return trainer_fail(IGRAD_E_INVALID, "max_position_embeddings %d outside [1, 65536]",
                            c->max_seq_len);
    if (!(c->rope_theta > 0.0) || !isfinite(c->rope_theta))
        return trainer_fail(IGRAD_E_INVALID, "rope_theta %g must be positive", c->rope_theta);
    if (!(c->rms_norm_eps > 0.0) || !isfinite(c->rms_norm_eps))
        return trainer_fail(IGRAD_E_INVALID, "rms_norm_eps %g must be positive",
                            c->rms_norm_eps);
    if (c->tie_embeddings != 0 && c->tie_embeddings != 1)
        return trainer_fail(IGRAD_E_INVALID, "tie_embeddings must be 0 or 1");
    return IGRAD_OK;
}

static int parse_int(const char *text, int *out)
{
    char *end = NULL;
    long v = text ? strtol(text, &end, 10) : 0;
    if (!text || end == text || *end != '\0' || v < 0 || v > 1 << 30) return 0;
    *out = (int)v;
    return 1;
}

igrad_status_t model_config_set(model_config_t *cfg, const char *key, const char *value)
{
    static const struct {
        const char *key;
        size_t offset;
    } ints[] = {
        {"layers", offsetof(model_config_t, n_layer)},
        {"dim", offsetof(model_config_t, dim)},
        {"heads", offsetof(model_config_t, n_head)},
        {"kv-heads", offsetof(model_config_t, n_kv_head)},
        {"ffn", offsetof(model_config_t, ffn_dim)},
        {"seq-len", offsetof(model_config_t, max_seq_len)},
        {"vocab", offsetof(model_config_t, vocab_size)},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (strcmp(key, ints[i].key) != 0) continue;
        int v;
        if (!parse_int(value, &v))
            return trainer_fail(IGRAD_E_INVALID, "--%s: '%s' is not a non-negative integer",
                                key, value ? value : "");
        *(int *)((char *)cfg + ints[i].offset) = v;
        return IGRAD_OK;
    }
    if (!strcmp(key, "rope-theta") || !strcmp(key, "rms-eps")) {
        char *end = NULL;
        double v = value ? strtod(value, &end) : 0.0;
        if (!value || end == value || *end != '\0' || !(v > 0.0) || !isfinite(v))
            return trainer_fail(IGRAD_E_INVALID, "--%s: '%s' is not a positive number", key,
                                value ? value : "");
        *(key[1] == 'o' ? &cfg->rope_theta : &cfg->rms_norm_eps) = v;
        return IGRAD_OK;
    }
    if (!strcmp(key, "tie")) {
        if (!value || !strcmp(value, "1") || !strcmp(value, "true")) cfg->tie_embeddings = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false")) cfg->tie_embeddings = 0;
        else return trainer_fail(IGRAD_E_INVALID, "--tie: '%s' is not 0/1/true/false", value);
        return IGRAD_OK;
    }
    return trainer_fail(IGRAD_E_UNSUPPORTED, "unknown model option --%s", key);
}

int64_t model_config_num_params(const model_config_t *c)
{
    int64_t C = c->dim, hd = c->dim / c->n_head, F = c->ffn_dim, V = c->vocab_size;
    int64_t Dq = (int64_t)c->n_head * hd, Dk = (int64_t)c->n_kv_head * hd;
    int64_t per_layer = Dq * C + 2 * Dk * C + C * Dq + 3 * F * C + 2 * C;
    return V * C + c->n_layer * per_layer + C + (c->tie_embeddings ? 0 : V * C);
}

/* ------------------------------------------------------------------------ */
/* parameter table                                                          */
/* ------------------------------------------------------------------------ */

static void add_tensor(model_t *m, int64_t *offset, const char *name, int ndim, int64_t d0,
                       int64_t d1)
{
    model_tensor_t *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 1;
    t->count = d0 * t->shape[1];
    t->offset = *offset;
    *offset += t->count;
}

/* The HF named_parameters() order of LlamaForCausalLM: embeddings, then per
 * layer the attention projections, the MLP projections and the two norms
 * (module registration order), the final norm, and lm_head unless tied. */
static void build_table(model_t *m)
{
    const model_config_t *c = &m->config;
    int64_t C = c->dim, F = c->ffn_dim, V = c->vocab_size;
    int64_t Dq = (int64_t)c->n_head * m->head_dim, Dk = (int64_t)c->n_kv_head * m->head_dim;
    int64_t off = 0;
    char name[MODEL_NAME_MAX];
    m->n_tensors = 0;
    add_tensor(m, &off, "model.embed_tokens.weight", 2, V, C);
    for (int l = 0; l < c->n_layer; l++) {
#define LAYER_TENSOR(suffix, nd, d0, d1)                                       \
        do {                                                                   \
            snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);      \
            add_tensor(m, &off, name, nd, d0, d1);                             \
        } while (0)
        LAYER_TENSOR("self_attn.q_proj.weight", 2, Dq, C);
        LAYER_TENSOR("self_attn.k_proj.weight", 2, Dk, C);
        LAYER_TENSOR("self_attn.v_proj.weight", 2, Dk, C);
        LAYER_TENSOR("self_attn.o_proj.weight", 2, C, Dq);
        LAYER_TENSOR("mlp.gate_proj.weight", 2, F, C);
        LAYER_TENSOR("mlp.up_proj.weight", 2, F, C);
        LAYER_TENSOR("mlp.down_proj.weight", 2, C, F);
        LAYER_TENSOR("input_layernorm.weight", 1, C, 1);
        LAYER_TENSOR("post_attention_layernorm.weight", 1, C, 1);
#undef LAYER_TENSOR
    }
    add_tensor(m, &off, "model.norm.weight", 1, C, 1);
    if (!c->tie_embeddings) add_tensor(m, &off, "lm_head.weight", 2, V, C);
    m->num_params = off;
}

static void point_views(const model_t *m, float *flat, model_views_t *v)
{
    const model_tensor_t *t = m->tensors;
    v->embed = flat + t[0].offset;
    for (int l = 0; l < m->config.n_layer; l++) {
        const model_tensor_t *lt = &t[1 + 9 * l];
        model_layer_t *ly = &v->layers[l];
        ly->wq = flat + lt[0].offset;
        ly->wk = flat + lt[1].offset;
        ly->wv = flat + lt[2].offset;
        ly->wo = flat + lt[3].offset;
        ly->wgate = flat + lt[4].offset;
        ly->wup = flat + lt[5].offset;
        ly->wdown = flat + lt[6].offset;
        ly->ln1 = flat + lt[7].offset;
        ly->ln2 = flat + lt[8].offset;
    }
    v->norm = flat + t[1 + 9 * m->config.n_layer].offset;
    v->lm_head = m->config.tie_embeddings ? v->embed
                                          : flat + t[2 + 9 * m->config.n_layer].offset;
}

/* RoPE tables as Hugging Face builds them: inv_freq[i] = theta^(-2i/hd),
 * angle = position * inv_freq[i], used for dims i and i + hd/2. Computed in
 * double and rounded once. */
static void build_rope(model_t *m)
{
    int half = m->head_dim / 2;
    for (int t = 0; t < m->config.max_seq_len; t++) {
        for (int i = 0; i < half; i++) {
            double inv_freq = pow(m->config.rope_theta, -(2.0 * i) / m->head_dim);
            double angle = (double)t * inv_freq;
            m->rope_cos[(size_t)t * half + i] = (float)cos(angle);
            m->rope_sin[(size_t)t * half + i] = (float)sin(angle);
        }
    }
}

igrad_status_t model_create(const model_config_t *cfg, model_t **out)
{
    *out = NULL;
    igrad_status_t st = model_config_validate(cfg);
    if (st != IGRAD_OK) return st;
    model_t *m = calloc(1, sizeof *m);
    if (!m) return trainer_fail(IGRAD_E_NOMEM, "out of memory for the model");
    m->config = *cfg;
    m->head_dim = cfg->dim / cfg->n_head;
    m->loss = -1.0;
    size_t max_tensors = 3 + 9 * (size_t)cfg->n_layer;
    m->tensors = calloc(max_tensors, sizeof *m->tensors);
    m->p.layers = calloc((size_t)cfg->n_layer, sizeof *m->p.layers);
    m->g.layers = calloc((size_t)cfg->n_layer, sizeof *m->g.layers);
    size_t rope_count = (size_t)cfg->max_seq_len * (size_t)(m->head_dim / 2);
    m->rope_cos = malloc(rope_count * sizeof(float));
    m->rope_sin = malloc(rope_count * sizeof(float));
    if (m->tensors && m->p.layers && m->g.layers && m->rope_cos && m->rope_sin) {
        build_table(m);
        m->params = calloc((size_t)m->num_params, sizeof(float));
        m->grads = calloc((size_t)m->num_params, sizeof(float));
    }
    if (!m->params || !m->grads) {
        model_free(m);
        return trainer_fail(IGRAD_E_NOMEM, "out of memory for %lld parameters",
                            (long long)model_config_num_params(cfg));
    }
    point_views(m, m->params, &m->p);
    point_views(m, m->grads, &m->g);
    build_rope(m);
    *out = m;
    return IGRAD_OK;
}

void model_free(model_t *m)
{
    if (!m) return;
    free(m->acts.mem);
    free(m->acts.losses);
    free(m->acts.inputs);
    free(m->acts.targets);
    free(m->rope_cos);
    free(m->rope_sin);
    free(m->params);
    free(m->grads);
    free(m->p.layers);
    free(m->g.layers);
    free(m->tensors);
    free(m);
}

int model_find_tensor(const model_t *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return i;
    return -1;
}

void model_tensor_pointers(const model_t *m, float *flat, float **ptrs)
{
    for (int i = 0; i < m->n_tensors; i++) ptrs[i] = flat + m->tensors[i].offset;
}

igrad_status_t model_layout(const model_t *m, igrad_layout_t **out)
{
    *out = NULL;
    igrad_layout_t *layout = NULL;
    igrad_status_t st = igrad_layout_create(&layout);
    if (st != IGRAD_OK)
        return trainer_fail(st, "igrad_layout_create: %s", igrad_last_error());
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        st = igrad_layout_add(layout, t->name, IGRAD_DTYPE_F32, t->ndim, t->shape);
        if (st != IGRAD_OK) {
            igrad_layout_free(layout);
            return trainer_fail(st, "igrad_layout_add(%s): %s", t->name, igrad_last_error());
        }
    }
    *out = layout;
    return IGRAD_OK;
}

/* ------------------------------------------------------------------------ */
/* initialisation                                                           */
/* ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define TWO_PI 6.283185307179586476925286766559

/* Uniform in (0, 1): 53 random bits, never 0 (log in Box-Muller). */
static double uniform01(uint64_t *state)
{
    return ((double)(splitmix64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

void model_init_random(model_t *m, uint64_t seed, float std)
{
    uint64_t state = seed;
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        float *w = m->params + t->offset;
        if (t->ndim == 1) {
            for (int64_t j = 0; j < t->count; j++) w[j] = 1.0f;
            continue;
        }
        for (int64_t j = 0; j < t->count; j += 2) {
            double u1 = uniform01(&state), u2 = uniform01(&state);
            double r = sqrt(-2.0 * log(u1));
            w[j] = (float)(std * r * cos(TWO_PI * u2));
            if (j + 1 < t->count) w[j + 1] = (float)(std * r * sin(TWO_PI * u2));
        }
    }
}

void model_zero_grad(model_t *m)
{
    memset(m->grads, 0, (size_t)m->num_params * sizeof(float));
}

/* ------------------------------------------------------------------------ */
/* activations                                                              */
/* ------------------------------------------------------------------------ */

static igrad_status_t ensure_acts(model_t *m, int B, int T)
{
    model_acts_t *a = &m->acts;
    size_t BT = (size_t)B * (size_t)T;
    if (a->mem && (size_t)a->capacity_bt >= BT && a->T == T) {
        a->B = B;
        return IGRAD_OK;
    }
    const model_config_t *c = &m->config;
    size_t L = (size_t)c->n_layer, C = (size_t)c->dim, V = (size_t)c->vocab_size;
    size_t F = (size_t)c->ffn_dim, H = (size_t)c->n_head, hd = (size_t)m->head_dim;
    size_t Dq = H * hd, Dqkv = Dq + 2 * (size_t)c->n_kv_head * hd;
    size_t att = BT * H * (size_t)T; /* B * H * T * T */
    size_t per_layer = BT * (C + 1 + Dqkv + Dq + C + C + 1 + 2 * F + F) + att;
    size_t total = (L + 1) * BT * C + L * per_layer + BT * (C + 1 + 2 * V) +
                   BT * (C + C + Dqkv + Dq + 2 * F + F) + att;
    free(a->mem);
    free(a->losses);
    free(a->inputs);
    free(a->targets);
    memset(a, 0, sizeof *a);
    a->mem = malloc(total * sizeof(float));
    a->losses = malloc(BT * sizeof(double));
    a->inputs = malloc(BT * sizeof(int32_t));
    a->targets = malloc(BT * sizeof(int32_t));
    if (!a->mem || !a->losses || !a->inputs || !a->targets) {
        free(a->mem);
        free(a->losses);
        free(a->inputs);
        free(a->targets);
        memset(a, 0, sizeof *a);
        return trainer_fail(IGRAD_E_NOMEM, "out of memory for activations (%zu floats, B=%d T=%d)",
                            total, B, T);
    }
    float *p = a->mem;
#define CARVE(field, n) (a->field = p, p += (n))
    CARVE(resid, (L + 1) * BT * C);
    CARVE(ln1, L * BT * C);
    CARVE(ln1_rstd, L * BT);
    CARVE(qkv, L * BT * Dqkv);
    CARVE(att, L * att);
    CARVE(atty, L * BT * Dq);
    CARVE(resid_mid, L * BT * C);
    CARVE(ln2, L * BT * C);
    CARVE(ln2_rstd, L * BT);
    CARVE(gu, L * BT * 2 * F);
    CARVE(mlph, L * BT * F);
    CARVE(lnf, BT * C);
    CARVE(lnf_rstd, BT);
    CARVE(logits, BT * V);
    CARVE(dlogits, BT * V);
    CARVE(dresid, BT * C);
    CARVE(dln, BT * C);
    CARVE(dqkv, BT * Dqkv);
    CARVE(datt, att);
    CARVE(datty, BT * Dq);
    CARVE(dgu, BT * 2 * F);
    CARVE(dmlph, BT * F);
#undef CARVE
    a->B = B;
    a->T = T;
    a->capacity_bt = (int)BT;
    return IGRAD_OK;
}

/* ------------------------------------------------------------------------ */
/* layers                                                                   */
/* ------------------------------------------------------------------------ */

static void encoder_forward(float *out, const int32_t *inputs, const float *embed, int BT,
                            int C)
{
#pragma omp parallel for
    for (int i = 0; i < BT; i++)
        memcpy(out + (size_t)i * C, embed + (size_t)inputs[i] * C, (size_t)C * sizeof(float));
}

/* Rows are visited in order for every column block, so a token that occurs
 * several times accumulates in the same order whatever the thread count. */
static void encoder_backward(float *dembed, const float *dout, const int32_t *inputs, int BT,
                             int C)
{
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += 64) {
        int c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int i = 0; i < BT; i++) {
            float *d = dembed + (size_t)inputs[i] * C;
            const float *g = dout + (size_t)i * C;
            for (int c = c0; c < c1; c++) d[c] += g[c];
        }
    }
}

/* y = x * rsqrt(mean(x^2) + eps) * w (Hugging Face LlamaRMSNorm). */
static void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N,
                            int C, double eps)
{
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++) y[c] = w[c] * (x[c] * r);
        rstd[i] = r;
    }
}

/* dx += r*w*dy - x * r^3/C * sum(w*dy*x);  dw += sum_rows dy*x*r. */
static void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int C)
{
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        const float *dy = dout + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        float r = rstd[i];
        double dot = 0.0;
        for (int c = 0; c < C; c++) dot += (double)w[c] * dy[c] * x[c];
        float k = (float)(dot * r * r * r / C);
        for (int c = 0; c < C; c++) dx[c] += r * w[c] * dy[c] - x[c] * k;
    }
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += 64) {
        int c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C;
            const float *dy = dout + (size_t)i * C;
            float r = rstd[i];
            for (int c = c0; c < c1; c++) dw[c] += dy[c] * (x[c] * r);
        }
    }
}

/* out (N, OC) = inp (N, IC) @ w^T, w (OC, IC) as torch.nn.Linear. */
static void matmul_forward(float *out, const float *inp, const float *w, int N, int IC, int OC)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, w, IC, 0.0f,
                out, OC);
}

/* dinp (N, IC) (+)= dout @ w (dinp_beta 0 overwrites, 1 adds);
 * dw (OC, IC) += dout^T @ inp. */
static void matmul_backward(float *dinp, float dinp_beta, float *dw, const float *dout,
                            const float *inp, const float *w, int N, int IC, int OC)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC,
                dinp_beta, dinp, IC);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC,
                1.0f, dw, IC);
}

/* Rotates the q and k heads of each row in place (x*cos + rotate_half(x)*sin,
 * rotate_half(x) = [-x2, x1] on the two halves of a head). backward rotates
 * the gradient by the opposite angle. nheads = H + KV leading heads of a
 * Dqkv row. */
static void rope_apply(float *qkv, const float *cosv, const float *sinv, int B, int T,
                       int nheads, int hd, int Dqkv, float sign)
{
    int half = hd / 2;
#pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T;
        const float *cs = cosv + (size_t)t * half;
        const float *sn = sinv + (size_t)t * half;
        float *row = qkv + (size_t)bt * Dqkv;
        for (int h = 0; h < nheads; h++) {
            float *x = row + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half], c = cs[i], s = sign * sn[i];
                x[i] = x1 * c - x2 * s;
                x[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

typedef struct attn_dims {
    int B, T, H, KV, hd, Dq, Dk, Dqkv;
} attn_dims_t;

/* Causal softmax attention. att (B, H, T, T) receives the probabilities
 * (zeros above the diagonal), atty (BT, Dq) the per-head outputs. Query head
 * h reads key/value head h / (H/KV), as HF's repeat_kv. */
static void attention_forward(float *atty, float *att, const float *qkv, const attn_dims_t *d)
{
    int T = d->T, group = d->H / d->KV;
    float scale = 1.0f / sqrtf((float)d->hd);
    for (int b = 0; b < d->B; b++) {
        for (int h = 0; h < d->H; h++) {
            const float *base = qkv + (size_t)b * T * d->Dqkv;
            const float *q = base + (size_t)h * d->hd;
            const float *k = base + d->Dq + (size_t)(h / group) * d->hd;
            float *s = att + ((size_t)b * d->H + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, d->hd, scale, q,
                        d->Dqkv, k, d->Dqkv, 0.0f, s, T);
        }
    }
    int rows = d->B * d->H * T;
#pragma omp parallel for
    for (int r = 0; r < rows; r++) {
        int t = r % T;
        float *s = att + (size_t)r * T;
        float mx = s[0];
        for (int j = 1; j <= t; j++) mx = s[j] > mx ? s[j] : mx;
        double sum = 0.0;
        for (int j = 0; j <= t; j++) {
            s[j] = expf(s[j] - mx);
            sum += s[j];
        }
        float inv = (float)(1.0 / sum);
        for (int j = 0; j <= t; j++) s[j] *= inv;
        for (int j = t + 1; j < T; j++) s[j] = 0.0f;
    }
    for (int b = 0; b < d->B; b++) {
        for (int h = 0; h < d->H; h++) {
            const float *v = qkv + (size_t)b * T * d->Dqkv + d->Dq + d->Dk +
                             (size_t)(h / group) * d->hd;
            const float *p = att + ((size_t)b * d->H + h) * T * T;
            float *y = atty + (size_t)b * T * d->Dq + (size_t)h * d->hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, d->hd, T, 1.0f, p, T, v,
                        d->Dqkv, 0.0f, y, d->Dq);
        }
    }
}

/* dqkv (BT, Dqkv) = gradient w.r.t. q (after RoPE), k (after RoPE) and v.
 * datt is scratch of att's shape. Key/value heads shared by a group of
 * query heads accumulate in head order. */
static void attention_backward(float *dqkv, float *datt, const float *datty, const float *att,
                               const float *qkv, const attn_dims_t *d)
{
    int T = d->T, group = d->H / d->KV;
    float scale = 1.0f / sqrtf((float)d->hd);
    memset(dqkv, 0, (size_t)d->B * T * d->Dqkv * sizeof(float));
    for (int b = 0; b < d->B; b++) {
        for (int h = 0; h < d->H; h++) {
            const float *v = qkv + (size_t)b * T * d->Dqkv + d->Dq + d->Dk +
                             (size_t)(h / group) * d->hd;
            const float *dy = datty + (size_t)b * T * d->Dq + (size_t)h * d->hd;
            float *dp = datt + ((size_t)b * d->H + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, d->hd, 1.0f, dy, d->Dq,
                        v, d->Dqkv, 0.0f, dp, T);
        }
    }
    /* softmax backward: dS = P * (dP - sum_j P*dP), times the score scale */
    int rows = d->B * d->H * T;
#pragma omp parallel for
    for (int r = 0; r < rows; r++) {
        int t = r % T;
        const float *p = att + (size_t)r * T;
        float *ds = datt + (size_t)r * T;
        double dot = 0.0;
        for (int j = 0; j <= t; j++) dot += (double)p[j] * ds[j];
        float fdot = (float)dot;
        for (int j = 0; j <= t; j++) ds[j] = p[j] * (ds[j] - fdot) * scale;
        for (int j = t + 1; j < T; j++) ds[j] = 0.0f;
    }
    for (int b = 0; b < d->B; b++) {
        for (int h = 0; h < d->H; h++) {
            int kvh = h / group;
            const float *base = qkv + (size_t)b * T * d->Dqkv;
            float *dbase = dqkv + (size_t)b * T * d->Dqkv;
            const float *q = base + (size_t)h * d->hd;
            const float *k = base + d->Dq + (size_t)kvh * d->hd;
            const float *p = att + ((size_t)b * d->H + h) * T * T;
            const float *ds = datt + ((size_t)b * d->H + h) * T * T;
            const float *dy = datty + (size_t)b * T * d->Dq + (size_t)h * d->hd;
            float *dq = dbase + (size_t)h * d->hd;
            float *dk = dbase + d->Dq + (size_t)kvh * d->hd;
            float *dv = dbase + d->Dq + d->Dk + (size_t)kvh * d->hd;
            /* dV += P^T dY;  dQ = dS K;  dK += dS^T Q */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, d->hd, T, 1.0f, p, T, dy,
                        d->Dq, 1.0f, dv, d->Dqkv);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, d->hd, T, 1.0f, ds, T, k,
                        d->Dqkv, 1.0f, dq, d->Dqkv);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, d->hd, T, 1.0f, ds, T, q,
                        d->Dqkv, 1.0f, dk, d->Dqkv);
        }
    }
}

/* h = silu(gate) * up over gu rows laid out gate|up. */
static void swiglu_forward(float *h, const float *gu, int BT, int F)
{
#pragma omp parallel for
    for (int i = 0; i < BT; i++) {
        const float *g = gu + (size_t)i * 2 * F;
        const float *u = g + F;
        float *y = h + (size_t)i * F;
        for (int j = 0; j < F; j++) y[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}

static void swiglu_backward(float *dgu, const float *dh, const float *gu, int BT, int F)
{
#pragma omp parallel for
    for (int i = 0; i < BT; i++) {
        const float *g = gu + (size_t)i * 2 * F;
        const float *u = g + F;
        const float *dy = dh + (size_t)i * F;
        float *dg = dgu + (size_t)i * 2 * F;
        float *du = dg + F;
        for (int j = 0; j < F; j++) {
            float s = 1.0f / (1.0f + expf(-g[j]));
            float silu = g[j] * s;
            du[j] = dy[j] * silu;
            dg[j] = dy[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
        }
    }
}

static void residual_forward(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* Mean cross-entropy over unmasked targets (log-sum-exp in double) and its
 * gradient d loss / d logits = (softmax - onehot) / count; masked rows get
 * a zero gradient. Per-row losses are summed in row order afterwards, so
 * the result does not depend on the thread count. @return the loss (0 when
 * count is 0). */
static double crossentropy_forward(float *dlogits, double *losses, const float *logits,
                                   const int32_t *targets, int BT, int V, int64_t count)
{
    double inv = count > 0 ? 1.0 / (double)count : 0.0;
#pragma omp parallel for
    for (int i = 0; i < BT; i++) {
        const float *z = logits + (size_t)i * V;
        float *dz = dlogits + (size_t)i * V;
        int tgt = targets[i];
        if (tgt == MODEL_IGNORE_INDEX) {
            memset(dz, 0, (size_t)V * sizeof(float));
            losses[i] = 0.0;
            continue;
        }
        double mx = z[0];
        for (int j = 1; j < V; j++) mx = z[j] > mx ? z[j] : mx;
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += exp(z[j] - mx);
        double lse = mx + log(sum);
        losses[i] = lse - z[tgt];
        for (int j = 0; j < V; j++) dz[j] = (float)(exp(z[j] - lse) * inv);
        dz[tgt] -= (float)inv;
    }
    double total = 0.0;
    for (int i = 0; i < BT; i++) total += losses[i];
    return total * inv;
}

/* ------------------------------------------------------------------------ */
/* forward and backward of the whole model                                  */
/* ------------------------------------------------------------------------ */

static attn_dims_t dims_of(const model_t *m, int B, int T)
{
    attn_dims_t d;
    d.B = B, d.T = T, d.H = m->config.n_head, d.KV = m->config.n_kv_head, d.hd = m->head_dim;
    d.Dq = d.H * d.hd;
    d.Dk = d.KV * d.hd;
    d.Dqkv = d.Dq + 2 * d.Dk;
    return d;
}

igrad_status_t model_forward(model_t *m, const int32_t *inputs, const int32_t *targets, int B,
                             int T)
{
    const model_config_t *c = &m->config;
    m->have_forward = 0;
    m->loss = -1.0;
    if (B < 1 || T < 1 || T > c->max_seq_len)
        return trainer_fail(IGRAD_E_INVALID, "forward: B=%d T=%d (need B >= 1, 1 <= T <= %d)",
                            B, T, c->max_seq_len);
    if ((int64_t)B * T > (1 << 24))
        return trainer_fail(IGRAD_E_INVALID, "forward: B*T=%lld is too large",
                            (long long)B * T);
    int BT = B * T, C = c->dim, V = c->vocab_size, F = c->ffn_dim;
    int64_t count = 0;
    for (int i = 0; i < BT; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return trainer_fail(IGRAD_E_INVALID, "forward: input token %d at position %d is "
                                "outside [0, %d)", inputs[i], i, V);
        if (targets) {
            if (targets[i] != MODEL_IGNORE_INDEX && (targets[i] < 0 || targets[i] >= V))
                return trainer_fail(IGRAD_E_INVALID, "forward: target %d at position %d is "
                                    "outside [0, %d) and not %d", targets[i], i, V,
                                    MODEL_IGNORE_INDEX);
            count += targets[i] != MODEL_IGNORE_INDEX;
        }
    }
    igrad_status_t st = ensure_acts(m, B, T);
    if (st != IGRAD_OK) return st;
    model_acts_t *a = &m->acts;
    attn_dims_t d = dims_of(m, B, T);
    size_t bt = (size_t)BT;
    memcpy(a->inputs, inputs, bt * sizeof(int32_t));

    encoder_forward(a->resid, inputs, m->p.embed, BT, C);
    for (int l = 0; l < c->n_layer; l++) {
        const model_layer_t *w = &m->p.layers[l];
        float *x = a->resid + (size_t)l * bt * C;
        float *ln1 = a->ln1 + (size_t)l * bt * C;
        float *ln1_rstd = a->ln1_rstd + (size_t)l * bt;
        float *qkv = a->qkv + (size_t)l * bt * d.Dqkv;
        float *att = a->att + (size_t)l * bt * d.H * T;
        float *atty = a->atty + (size_t)l * bt * d.Dq;
        float *xmid = a->resid_mid + (size_t)l * bt * C;
        float *ln2 = a->ln2 + (size_t)l * bt * C;
        float *ln2_rstd = a->ln2_rstd + (size_t)l * bt;
        float *gu = a->gu + (size_t)l * bt * 2 * F;
        float *mlph = a->mlph + (size_t)l * bt * F;
        float *xout = a->resid + (size_t)(l + 1) * bt * C;

        rmsnorm_forward(ln1, ln1_rstd, x, w->ln1, BT, C, c->rms_norm_eps);
        matmul_forward(qkv, ln1, w->wq, BT, C, d.Dqkv); /* wq|wk|wv are adjacent */
        rope_apply(qkv, m->rope_cos, m->rope_sin, B, T, d.H + d.KV, d.hd, d.Dqkv, 1.0f);
        attention_forward(atty, att, qkv, &d);
        matmul_forward(xmid, atty, w->wo, BT, d.Dq, C);
        residual_forward(xmid, xmid, x, bt * C);
        rmsnorm_forward(ln2, ln2_rstd, xmid, w->ln2, BT, C, c->rms_norm_eps);
        matmul_forward(gu, ln2, w->wgate, BT, C, 2 * F); /* wgate|wup are adjacent */
        swiglu_forward(mlph, gu, BT, F);
        matmul_forward(xout, mlph, w->wdown, BT, F, C);
        residual_forward(xout, xout, xmid, bt * C);
    }
    float *xf = a->resid + (size_t)c->n_layer * bt * C;
    rmsnorm_forward(a->lnf, a->lnf_rstd, xf, m->p.norm, BT, C, c->rms_norm_eps);
    matmul_forward(a->logits, a->lnf, m->p.lm_head, BT, C, V);

    if (targets) {
        memcpy(a->targets, targets, bt * sizeof(int32_t));
        m->loss = crossentropy_forward(a->dlogits, a->losses, a->logits, targets, BT, V,
                                              count);
        m->loss_count = count;
        m->have_forward = 1;
    }
    return IGRAD_OK;
}

igrad_status_t model_backward(model_t *m)
{
    if (!m->have_forward)
        return trainer_fail(IGRAD_E_STATE, "backward needs a forward with targets first");
    const model_config_t *c = &m->config;
    model_acts_t *a = &m->acts;
    int B = a->B, T = a->T, BT = B * T, C = c->dim, V = c->vocab_size, F = c->ffn_dim;
    size_t bt = (size_t)BT;
    attn_dims_t d = dims_of(m, B, T);

    memset(a->dresid, 0, bt * C * sizeof(float));
    matmul_backward(a->dln, 0.0f, m->g.lm_head, a->dlogits, a->lnf, m->p.lm_head, BT, C, V);
    float *xf = a->resid + (size_t)c->n_layer * bt * C;
    rmsnorm_backward(a->dresid, m->g.norm, a->dln, xf, m->p.norm, a->lnf_rstd, BT, C);

    for (int l = c->n_layer - 1; l >= 0; l--) {
        const model_layer_t *w = &m->p.layers[l];
        model_layer_t *gw = &m->g.layers[l];
        float *x = a->resid + (size_t)l * bt * C;
        float *ln1 = a->ln1 + (size_t)l * bt * C;
        float *ln1_rstd = a->ln1_rstd + (size_t)l * bt;
        float *qkv = a->qkv + (size_t)l * bt * d.Dqkv;
        float *att = a->att + (size_t)l * bt * d.H * T;
        float *atty = a->atty + (size_t)l * bt * d.Dq;
        float *xmid = a->resid_mid + (size_t)l * bt * C;
        float *ln2 = a->ln2 + (size_t)l * bt * C;
        float *ln2_rstd = a->ln2_rstd + (size_t)l * bt;
        float *gu = a->gu + (size_t)l * bt * 2 * F;
        float *mlph = a->mlph + (size_t)l * bt * F;

        /* MLP: dresid is d(xout); the residual passes it to xmid unchanged */
        matmul_backward(a->dmlph, 0.0f, gw->wdown, a->dresid, mlph, w->wdown, BT, F, C);
        swiglu_backward(a->dgu, a->dmlph, gu, BT, F);
        matmul_backward(a->dln, 0.0f, gw->wgate, a->dgu, ln2, w->wgate, BT, C, 2 * F);
        rmsnorm_backward(a->dresid, gw->ln2, a->dln, xmid, w->ln2, ln2_rstd, BT, C);
        /* attention: dresid is now d(xmid) */
        matmul_backward(a->datty, 0.0f, gw->wo, a->dresid, atty, w->wo, BT, d.Dq, C);
        attention_backward(a->dqkv, a->datt, a->datty, att, qkv, &d);
        rope_apply(a->dqkv, m->rope_cos, m->rope_sin, B, T, d.H + d.KV, d.hd, d.Dqkv, -1.0f);
        matmul_backward(a->dln, 0.0f, gw->wq, a->dqkv, ln1, w->wq, BT, C, d.Dqkv);
        rmsnorm_backward(a->dresid, gw->ln1, a->dln, x, w->ln1, ln1_rstd, BT, C);
    }
    encoder_backward(m->g.embed, a->dresid, a->inputs, BT, C);
    return IGRAD_OK;
}
