/*
 * layout_hf.c — Hugging Face config.json -> the exact parameter table that
 * the transformers implementation of the family creates for its
 * *ForCausalLM model: names, order of named_parameters(), shapes, biases,
 * tied embeddings.
 *
 * Not here: the table itself (layout.c), name -> component rules
 * (component.c), checkpoints (safetensors.c).
 *
 * Where the facts come from: the modeling_*.py / configuration_*.py files
 * of huggingface/transformers (module registration order in each
 * __init__, nn.Linear bias flags, config defaults), cross-checked against
 * the published parameter counts of the shipped configs (tests/test_layout.c).
 * named_parameters() yields parameters in module registration order and
 * lists a tied lm_head only once (under the embedding's name), so a tied
 * model has no lm_head.weight. Per family:
 *   llama/mistral/qwen2/gemma  model.embed_tokens; layers.N.{self_attn.
 *     {q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm,
 *     post_attention_layernorm}; model.norm; lm_head. k/v rows =
 *     num_key_value_heads * head_dim (head_dim explicit or hidden/heads).
 *     Biases: llama attention_bias / mlp_bias (default off), qwen2 q/k/v
 *     only, mistral and gemma none. tie_word_embeddings default: gemma
 *     true, the others false.
 *   mixtral  as llama, but the MLP is block_sparse_moe.{gate [E,H],
 *     experts.E.{w1,w2,w3}} (the w1/w2/w3 naming of transformers 4.x).
 *   opt  model.decoder.{embed_tokens [V,word_embed_proj_dim], embed_positions
 *     [max_pos+2,H], project_out, project_in (both only when
 *     word_embed_proj_dim != hidden, no bias), final_layer_norm (only when
 *     do_layer_norm_before and not _remove_final_layer_norm), layers.N.
 *     {self_attn.{k,v,q,out}_proj, self_attn_layer_norm, fc1, fc2,
 *     final_layer_norm}}; lm_head [V,word_embed_proj_dim]; tied by default.
 *   gpt2  transformer.{wte, wpe, h.N.{ln_1, attn.c_attn [H,3H], attn.c_proj,
 *     ln_2, mlp.c_fc [H,inner], mlp.c_proj [inner,H]}, ln_f} (Conv1D weights
 *     are [in,out]); tied by default.
 *   gpt_neox  gpt_neox.{embed_in, layers.N.{input_layernorm,
 *     post_attention_layernorm, attention.query_key_value, attention.dense,
 *     mlp.dense_h_to_4h, mlp.dense_4h_to_h}, final_layer_norm}; embed_out;
 *     not tied by default; rotary has no parameters.
 *   bloom  transformer.{word_embeddings, word_embeddings_layernorm,
 *     h.N.{input_layernorm, self_attention.{query_key_value,dense},
 *     post_attention_layernorm, mlp.{dense_h_to_4h,dense_4h_to_h}}, ln_f};
 *     tied by default.
 *   falcon  transformer.{word_embeddings, h.N.{self_attention.
 *     {query_key_value,dense}, mlp.{dense_h_to_4h,dense_4h_to_h}, norms},
 *     ln_f}; lm_head tied by default. qkv rows: new_decoder_architecture
 *     (2*num_kv_heads + heads)*head_dim, multi_query hidden + 2*head_dim,
 *     else 3*hidden. Norms: not parallel_attn -> post_attention_layernorm,
 *     input_layernorm; parallel with 2 norms (new architecture default) ->
 *     ln_attn, ln_mlp; else input_layernorm. Linear biases per `bias`.
 *   gptj  transformer.{wte, h.N.{ln_1, attn.{k,v,q,out}_proj (no bias),
 *     mlp.{fc_in,fc_out} (bias)}, ln_f}; lm_head with bias, not tied.
 *   phi  model.{embed_tokens, layers.N.{self_attn.{q_proj,k_proj,v_proj,
 *     dense} (bias) [+ q_layernorm, k_layernorm], mlp.{fc1,fc2} (bias),
 *     input_layernorm}, final_layernorm}; lm_head with bias, not tied.
 * Shapes transformers would refuse are refused too, naming the keys: a
 * hidden size that is not a whole number of heads (unless head_dim is
 * given; for gpt2, opt, gpt_neox, bloom and gptj only when the head count
 * key is present, as their tables do not use it), a key/value head count
 * that does not divide the head count, more experts per token than
 * experts. Every dimension is an integer in [1, 2^24].
 */
#define _POSIX_C_SOURCE 200809L
#include "core/json_strict.h"
#include "model/layout_internal.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Limits that keep a hostile config from asking for billions of tensors
 * or absurd dimensions; real models are far below them. */
#define MAX_LAYERS 1024
#define MAX_EXPERTS 1024
#define MAX_LAYER_EXPERTS 65536
#define MAX_DIM (INT64_C(1) << 24)

typedef struct hf {
    const cJSON *root;
    const char *src;
    const char *family;
    igrad_layout_t *layout;
    igrad_dtype_t dtype;
} hf_t;

/* ---- reading config values -------------------------------------------- */

/* First present, non-null key of a NULL-terminated alias list. */
static const cJSON *cfg_find(const hf_t *h, const char *const *keys, const char **found)
{
    for (; *keys; keys++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(h->root, *keys);
        if (v && !cJSON_IsNull(v)) {
            *found = *keys;
            return v;
        }
    }
    return NULL;
}

static void alias_text(const char *const *keys, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "'%s'", keys[0]);
    for (int i = 1; keys[i] && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, " (or '%s')", keys[i]);
}

/* Integer in [lo, hi]. `dflt` < 0 means the key is required. */
static igrad_status_t cfg_int_keys(const hf_t *h, const char *const *keys, int64_t dflt,
                                   int64_t lo, int64_t hi, int64_t *out)
{
    const char *key = keys[0];
    const cJSON *v = cfg_find(h, keys, &key);
    if (!v) {
        char names[160];
        alias_text(keys, names, sizeof names);
        IGRAD_FAIL_IF(dflt < 0, IGRAD_E_FORMAT, "%s: missing required key %s", h->src, names);
        *out = dflt;
        return IGRAD_OK;
    }
    IGRAD_FAIL_IF(!cJSON_IsNumber(v), IGRAD_E_FORMAT, "%s: key '%s' must be an integer",
                  h->src, key);
    double d = v->valuedouble;
    IGRAD_FAIL_IF(!(d >= (double)lo && d <= (double)hi) || d != (double)(int64_t)d,
                  IGRAD_E_FORMAT, "%s: key '%s' is %.17g, expected an integer in [%lld, %lld]",
                  h->src, key, d, (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return IGRAD_OK;
}

static igrad_status_t cfg_int(const hf_t *h, const char *key, int64_t dflt, int64_t lo,
                              int64_t hi, int64_t *out)
{
    const char *keys[] = {key, NULL};
    return cfg_int_keys(h, keys, dflt, lo, hi, out);
}

static igrad_status_t cfg_dim(const hf_t *h, const char *key, int64_t dflt, int64_t *out)
{
    return cfg_int(h, key, dflt, 1, MAX_DIM, out);
}

static igrad_status_t cfg_bool(const hf_t *h, const char *key, int dflt, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h->root, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return IGRAD_OK;
    }
    IGRAD_FAIL_IF(!cJSON_IsBool(v), IGRAD_E_FORMAT, "%s: key '%s' must be true or false",
                  h->src, key);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return IGRAD_OK;
}

/* `hidden` (read from key hidden_key) must be a whole number of heads:
 * the attention modules of every family but an explicit head_dim raise a
 * ValueError otherwise. */
static igrad_status_t cfg_check_divides(const hf_t *h, const char *hidden_key, int64_t hidden,
                                        const char *heads_key, int64_t heads)
{
    IGRAD_FAIL_IF(hidden % heads != 0, IGRAD_E_FORMAT,
                  "%s: key '%s' (%lld) is not divisible by key '%s' (%lld attention heads)",
                  h->src, hidden_key, (long long)hidden, heads_key, (long long)heads);
    return IGRAD_OK;
}

/* Grouped-query attention: each key/value head serves a whole group of
 * query heads, so the kv count must divide the head count. */
static igrad_status_t cfg_check_kv_heads(const hf_t *h, const char *kv_key, int64_t kv,
                                         const char *heads_key, int64_t heads)
{
    IGRAD_FAIL_IF(heads % kv != 0, IGRAD_E_FORMAT,
                  "%s: key '%s' (%lld) must divide key '%s' (%lld): each key/value head "
                  "serves a whole group of query heads", h->src, kv_key, (long long)kv,
                  heads_key, (long long)heads);
    return IGRAD_OK;
}

/* Families whose tables do not depend on the head count still refuse a
 * count that transformers would refuse; checked only when the key is
 * there (the table is well defined without it). */
static igrad_status_t cfg_check_heads(const hf_t *h, const char *const *keys,
                                      const char *hidden_key, int64_t hidden)
{
    const char *key = keys[0];
    if (!cfg_find(h, keys, &key)) return IGRAD_OK;
    int64_t heads;
    IGRAD_CHECK(cfg_int_keys(h, keys, -1, 1, MAX_DIM, &heads));
    return cfg_check_divides(h, hidden_key, hidden, key, heads);
}

/* head_dim: explicit when given (gemma), else hidden / heads, which must
 * then divide evenly. */
static igrad_status_t cfg_head_dim(const hf_t *h, int64_t hidden, int64_t heads, int64_t *out)
{
    IGRAD_CHECK(cfg_dim(h, "head_dim", 0, out));
    if (*out > 0) return IGRAD_OK;
    IGRAD_CHECK(cfg_check_divides(h, "hidden_size", hidden, "num_attention_heads", heads));
    *out = hidden / heads;
    return IGRAD_OK;
}

static igrad_status_t cfg_dtype(hf_t *h)
{
    static const char *const keys[] = {"torch_dtype", "dtype", NULL};
    const char *key = keys[0];
    const cJSON *v = cfg_find(h, keys, &key);
    h->dtype = IGRAD_DTYPE_F32;
    if (!v) return IGRAD_OK;
    IGRAD_FAIL_IF(!cJSON_IsString(v), IGRAD_E_FORMAT, "%s: key '%s' must be a string",
                  h->src, key);
    const char *s = v->valuestring;
    if (strcmp(s, "float32") == 0) h->dtype = IGRAD_DTYPE_F32;
    else if (strcmp(s, "float16") == 0) h->dtype = IGRAD_DTYPE_F16;
    else if (strcmp(s, "bfloat16") == 0) h->dtype = IGRAD_DTYPE_BF16;
    else if (strcmp(s, "float64") == 0) h->dtype = IGRAD_DTYPE_F64;
    else
        return igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                           "%s: key '%s' is '%s', expected float32, float16, bfloat16 or "
                           "float64", h->src, key, s);
    return IGRAD_OK;
}

/* ---- adding tensors ---------------------------------------------------- */

/* Adds one tensor; d1 == 0 makes it 1-D. The name is printf-formatted. */
static igrad_status_t add(hf_t *h, int64_t d0, int64_t d1, const char *fmt, ...)
    IGRAD__PRINTF(4, 5);
static igrad_status_t add(hf_t *h, int64_t d0, int64_t d1, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t shape[2] = {d0, d1};
    igrad_status_t st = igrad_layout_add(h->layout, name, h->dtype, d1 > 0 ? 2 : 1, shape);
    if (st == IGRAD_E_INVALID) {
        /* A config whose sizes cannot form a table is malformed input. */
        char why[512];
        snprintf(why, sizeof why, "%s", igrad_last_error());
        return igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__, "%s: %s", h->src, why);
    }
    return st;
}

/* nn.Linear(in, out): weight [out, in], then bias [out] if present. */
static igrad_status_t linear(hf_t *h, const char *prefix, int64_t out, int64_t in, int bias)
{
    IGRAD_CHECK(add(h, out, in, "%s.weight", prefix));
    if (bias) IGRAD_CHECK(add(h, out, 0, "%s.bias", prefix));
    return IGRAD_OK;
}

/* GPT-2's Conv1D(nf=out, nx=in): weight [in, out], bias [out]. */
static igrad_status_t conv1d(hf_t *h, const char *prefix, int64_t out, int64_t in)
{
    IGRAD_CHECK(add(h, in, out, "%s.weight", prefix));
    return add(h, out, 0, "%s.bias", prefix);
}

static igrad_status_t layer_norm(hf_t *h, const char *prefix, int64_t n, int bias)
{
    IGRAD_CHECK(add(h, n, 0, "%s.weight", prefix));
    if (bias) IGRAD_CHECK(add(h, n, 0, "%s.bias", prefix));
    return IGRAD_OK;
}

static const char *pfx(char *buf, size_t size, const char *fmt, int layer, const char *rest)
{
    char head[96];
    snprintf(head, sizeof head, fmt, layer);
    snprintf(buf, size, "%s.%s", head, rest);
    return buf;
}

static igrad_status_t cfg_layers(const hf_t *h, const char *const *keys, int64_t *out)
{
    return cfg_int_keys(h, keys, -1, 1, MAX_LAYERS, out);
}

/* ---- families ---------------------------------------------------------- */

/* llama, mistral, qwen2, gemma, mixtral: the LLaMA block with RMSNorms. */
static igrad_status_t build_llama(hf_t *h)
{
    static const char *const layers_keys[] = {"num_hidden_layers", NULL};
    const char *fam = h->family;
    int is_qwen2 = strcmp(fam, "qwen2") == 0;
    int is_gemma = strcmp(fam, "gemma") == 0;
    int is_mixtral = strcmp(fam, "mixtral") == 0;
    int is_llama = strcmp(fam, "llama") == 0;

    int64_t H, L, nH, nKV, hd, I, V, E = 0;
    int attn_bias = 0, mlp_bias = 0, tie = 0;
    IGRAD_CHECK(cfg_dim(h, "hidden_size", -1, &H));
    IGRAD_CHECK(cfg_layers(h, layers_keys, &L));
    IGRAD_CHECK(cfg_dim(h, "num_attention_heads", -1, &nH));
    IGRAD_CHECK(cfg_dim(h, "num_key_value_heads", nH, &nKV));
    IGRAD_CHECK(cfg_check_kv_heads(h, "num_key_value_heads", nKV, "num_attention_heads", nH));
    IGRAD_CHECK(cfg_head_dim(h, H, nH, &hd));
    IGRAD_CHECK(cfg_dim(h, "intermediate_size", -1, &I));
    IGRAD_CHECK(cfg_dim(h, "vocab_size", -1, &V));
    if (is_llama || is_gemma || is_mixtral)
        IGRAD_CHECK(cfg_bool(h, "attention_bias", 0, &attn_bias));
    if (is_llama) IGRAD_CHECK(cfg_bool(h, "mlp_bias", 0, &mlp_bias));
    IGRAD_CHECK(cfg_bool(h, "tie_word_embeddings", is_gemma, &tie));
    if (is_mixtral) {
        IGRAD_CHECK(cfg_int(h, "num_local_experts", 8, 1, MAX_EXPERTS, &E));
        int64_t top_k;
        IGRAD_CHECK(cfg_int(h, "num_experts_per_tok", 1, 1, MAX_EXPERTS, &top_k));
        IGRAD_FAIL_IF(top_k > E, IGRAD_E_FORMAT,
                      "%s: key 'num_experts_per_tok' (%lld) is more than key "
                      "'num_local_experts' (%lld)", h->src, (long long)top_k, (long long)E);
        IGRAD_FAIL_IF(L * E > MAX_LAYER_EXPERTS, IGRAD_E_FORMAT,
                      "%s: %lld layers x %lld experts is more than the %d supported", h->src,
                      (long long)L, (long long)E, MAX_LAYER_EXPERTS);
    }
    int qkv_bias = attn_bias || is_qwen2;

    char p[160];
    IGRAD_CHECK(add(h, V, H, "model.embed_tokens.weight"));
    for (int l = 0; l < (int)L; l++) {
        const char *b = "model.layers.%d";
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.q_proj"), nH * hd, H, qkv_bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.k_proj"), nKV * hd, H, qkv_bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.v_proj"), nKV * hd, H, qkv_bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.o_proj"), H, nH * hd, attn_bias));
        if (is_mixtral) {
            IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "block_sparse_moe.gate"), E, H, 0));
            for (int e = 0; e < (int)E; e++) {
                char q[64];
                snprintf(q, sizeof q, "block_sparse_moe.experts.%d.w1", e);
                IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, q), I, H, 0));
                snprintf(q, sizeof q, "block_sparse_moe.experts.%d.w2", e);
                IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, q), H, I, 0));
                snprintf(q, sizeof q, "block_sparse_moe.experts.%d.w3", e);
                IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, q), I, H, 0));
            }
        } else {
            IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.gate_proj"), I, H, mlp_bias));
            IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.up_proj"), I, H, mlp_bias));
            IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.down_proj"), H, I, mlp_bias));
        }
        IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "input_layernorm"), H, 0));
        IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "post_attention_layernorm"), H, 0));
    }
    IGRAD_CHECK(add(h, H, 0, "model.norm.weight"));
    if (!tie) IGRAD_CHECK(add(h, V, H, "lm_head.weight"));
    return IGRAD_OK;
}

static igrad_status_t build_opt(hf_t *h)
{
    static const char *const layers_keys[] = {"num_hidden_layers", NULL};
    int64_t H, L, F, V, P, D;
    int pre_norm, remove_final, bias, affine, tie;
    IGRAD_CHECK(cfg_dim(h, "hidden_size", -1, &H));
    IGRAD_CHECK(cfg_layers(h, layers_keys, &L));
    IGRAD_CHECK(cfg_dim(h, "ffn_dim", -1, &F));
    IGRAD_CHECK(cfg_dim(h, "vocab_size", -1, &V));
    IGRAD_CHECK(cfg_dim(h, "max_position_embeddings", -1, &P));
    IGRAD_CHECK(cfg_dim(h, "word_embed_proj_dim", H, &D));
    static const char *const heads_keys[] = {"num_attention_heads", NULL};
    IGRAD_CHECK(cfg_check_heads(h, heads_keys, "hidden_size", H));
    IGRAD_CHECK(cfg_bool(h, "do_layer_norm_before", 1, &pre_norm));
    IGRAD_CHECK(cfg_bool(h, "_remove_final_layer_norm", 0, &remove_final));
    IGRAD_CHECK(cfg_bool(h, "enable_bias", 1, &bias));
    IGRAD_CHECK(cfg_bool(h, "layer_norm_elementwise_affine", 1, &affine));
    IGRAD_CHECK(cfg_bool(h, "tie_word_embeddings", 1, &tie));

    char p[160];
    IGRAD_CHECK(add(h, V, D, "model.decoder.embed_tokens.weight"));
    /* OPT's learned positions reserve 2 extra rows (fairseq's offset). */
    IGRAD_CHECK(add(h, P + 2, H, "model.decoder.embed_positions.weight"));
    if (D != H) {
        IGRAD_CHECK(linear(h, "model.decoder.project_out", D, H, 0));
        IGRAD_CHECK(linear(h, "model.decoder.project_in", H, D, 0));
    }
    if (pre_norm && !remove_final && affine)
        IGRAD_CHECK(layer_norm(h, "model.decoder.final_layer_norm", H, 1));
    for (int l = 0; l < (int)L; l++) {
        const char *b = "model.decoder.layers.%d";
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.k_proj"), H, H, bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.v_proj"), H, H, bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.q_proj"), H, H, bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.out_proj"), H, H, bias));
        if (affine)
            IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "self_attn_layer_norm"), H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "fc1"), F, H, bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "fc2"), H, F, bias));
        if (affine)
            IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "final_layer_norm"), H, 1));
    }
    if (!tie) IGRAD_CHECK(add(h, V, D, "lm_head.weight"));
    return IGRAD_OK;
}

static igrad_status_t build_gpt2(hf_t *h)
{
    static const char *const hidden_keys[] = {"n_embd", "hidden_size", NULL};
    static const char *const layers_keys[] = {"n_layer", "num_hidden_layers", NULL};
    static const char *const pos_keys[] = {"n_positions", "max_position_embeddings", NULL};
    int64_t H, L, I, V, P;
    int tie, cross;
    IGRAD_CHECK(cfg_int_keys(h, hidden_keys, -1, 1, MAX_DIM, &H));
    IGRAD_CHECK(cfg_layers(h, layers_keys, &L));
    IGRAD_CHECK(cfg_dim(h, "n_inner", 4 * H, &I));
    IGRAD_CHECK(cfg_dim(h, "vocab_size", -1, &V));
    IGRAD_CHECK(cfg_int_keys(h, pos_keys, -1, 1, MAX_DIM, &P));
    IGRAD_CHECK(cfg_bool(h, "tie_word_embeddings", 1, &tie));
    IGRAD_CHECK(cfg_bool(h, "add_cross_attention", 0, &cross));
    static const char *const heads_keys[] = {"n_head", "num_attention_heads", NULL};
    IGRAD_CHECK(cfg_check_heads(h, heads_keys, "n_embd", H));
    IGRAD_FAIL_IF(cross, IGRAD_E_UNSUPPORTED,
                  "%s: gpt2 with add_cross_attention is not supported", h->src);

    char p[160];
    IGRAD_CHECK(add(h, V, H, "transformer.wte.weight"));
    IGRAD_CHECK(add(h, P, H, "transformer.wpe.weight"));
    for (int l = 0; l < (int)L; l++) {
        const char *b = "transformer.h.%d";
        IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "ln_1"), H, 1));
        IGRAD_CHECK(conv1d(h, pfx(p, sizeof p, b, l, "attn.c_attn"), 3 * H, H));
        IGRAD_CHECK(conv1d(h, pfx(p, sizeof p, b, l, "attn.c_proj"), H, H));
        IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "ln_2"), H, 1));
        IGRAD_CHECK(conv1d(h, pfx(p, sizeof p, b, l, "mlp.c_fc"), I, H));
        IGRAD_CHECK(conv1d(h, pfx(p, sizeof p, b, l, "mlp.c_proj"), H, I));
    }
    IGRAD_CHECK(layer_norm(h, "transformer.ln_f", H, 1));
    if (!tie) IGRAD_CHECK(add(h, V, H, "lm_head.weight"));
    return IGRAD_OK;
}

static igrad_status_t build_gpt_neox(hf_t *h)
{
    static const char *const layers_keys[] = {"num_hidden_layers", NULL};
    int64_t H, L, I, V;
    int tie, bias;
    IGRAD_CHECK(cfg_dim(h, "hidden_size", -1, &H));
    IGRAD_CHECK(cfg_layers(h, layers_keys, &L));
    IGRAD_CHECK(cfg_dim(h, "intermediate_size", -1, &I));
    IGRAD_CHECK(cfg_dim(h, "vocab_size", -1, &V));
    IGRAD_CHECK(cfg_bool(h, "tie_word_embeddings", 0, &tie));
    IGRAD_CHECK(cfg_bool(h, "attention_bias", 1, &bias));
    static const char *const heads_keys[] = {"num_attention_heads", NULL};
    IGRAD_CHECK(cfg_check_heads(h, heads_keys, "hidden_size", H));

    char p[160];
    IGRAD_CHECK(add(h, V, H, "gpt_neox.embed_in.weight"));
    for (int l = 0; l < (int)L; l++) {
        const char *b = "gpt_neox.layers.%d";
        IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "input_layernorm"), H, 1));
        IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "post_attention_layernorm"), H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "attention.query_key_value"), 3 * H, H,
                           bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "attention.dense"), H, H, bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.dense_h_to_4h"), I, H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.dense_4h_to_h"), H, I, 1));
    }
    IGRAD_CHECK(layer_norm(h, "gpt_neox.final_layer_norm", H, 1));
    if (!tie) IGRAD_CHECK(add(h, V, H, "embed_out.weight"));
    return IGRAD_OK;
}

static igrad_status_t build_bloom(hf_t *h)
{
    static const char *const hidden_keys[] = {"hidden_size", "n_embed", NULL};
    static const char *const layers_keys[] = {"n_layer", "num_hidden_layers", NULL};
    int64_t H, L, V;
    int tie;
    IGRAD_CHECK(cfg_int_keys(h, hidden_keys, -1, 1, MAX_DIM, &H));
    IGRAD_CHECK(cfg_layers(h, layers_keys, &L));
    IGRAD_CHECK(cfg_dim(h, "vocab_size", -1, &V));
    IGRAD_CHECK(cfg_bool(h, "tie_word_embeddings", 1, &tie));
    static const char *const heads_keys[] = {"n_head", "num_attention_heads", NULL};
    IGRAD_CHECK(cfg_check_heads(h, heads_keys, "hidden_size", H));

    char p[160];
    IGRAD_CHECK(add(h, V, H, "transformer.word_embeddings.weight"));
    IGRAD_CHECK(layer_norm(h, "transformer.word_embeddings_layernorm", H, 1));
    for (int l = 0; l < (int)L; l++) {
        const char *b = "transformer.h.%d";
        IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "input_layernorm"), H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attention.query_key_value"), 3 * H,
                           H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attention.dense"), H, H, 1));
        IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "post_attention_layernorm"), H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.dense_h_to_4h"), 4 * H, H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.dense_4h_to_h"), H, 4 * H, 1));
    }
    IGRAD_CHECK(layer_norm(h, "transformer.ln_f", H, 1));
    if (!tie) IGRAD_CHECK(add(h, V, H, "lm_head.weight"));
    return IGRAD_OK;
}

static igrad_status_t build_falcon(hf_t *h)
{
    static const char *const hidden_keys[] = {"hidden_size", "n_embed", NULL};
    static const char *const layers_keys[] = {"num_hidden_layers", "n_layer", NULL};
    static const char *const heads_keys[] = {"num_attention_heads", "n_head", NULL};
    int64_t H, L, nH, nKV, V, F, n_ln;
    int new_arch, multi_query, parallel, bias, tie;
    IGRAD_CHECK(cfg_int_keys(h, hidden_keys, -1, 1, MAX_DIM, &H));
    IGRAD_CHECK(cfg_layers(h, layers_keys, &L));
    IGRAD_CHECK(cfg_int_keys(h, heads_keys, -1, 1, MAX_DIM, &nH));
    IGRAD_CHECK(cfg_dim(h, "num_kv_heads", nH, &nKV));
    IGRAD_CHECK(cfg_dim(h, "vocab_size", -1, &V));
    IGRAD_CHECK(cfg_dim(h, "ffn_hidden_size", 4 * H, &F));
    IGRAD_CHECK(cfg_bool(h, "new_decoder_architecture", 0, &new_arch));
    IGRAD_CHECK(cfg_bool(h, "multi_query", 1, &multi_query));
    IGRAD_CHECK(cfg_bool(h, "parallel_attn", 1, &parallel));
    IGRAD_CHECK(cfg_bool(h, "bias", 0, &bias));
    IGRAD_CHECK(cfg_bool(h, "tie_word_embeddings", 1, &tie));
    IGRAD_CHECK(cfg_int(h, "num_ln_in_parallel_attn", new_arch ? 2 : 0, 0, 2, &n_ln));
    IGRAD_CHECK(cfg_check_divides(h, "hidden_size", H, "num_attention_heads", nH));
    if (new_arch)
        IGRAD_CHECK(cfg_check_kv_heads(h, "num_kv_heads", nKV, "num_attention_heads", nH));
    int64_t hd = H / nH;
    int64_t qkv = new_arch ? (2 * nKV + nH) * hd : multi_query ? H + 2 * hd : 3 * H;

    char p[160];
    IGRAD_CHECK(add(h, V, H, "transformer.word_embeddings.weight"));
    for (int l = 0; l < (int)L; l++) {
        const char *b = "transformer.h.%d";
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attention.query_key_value"), qkv, H,
                           bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attention.dense"), H, H, bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.dense_h_to_4h"), F, H, bias));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.dense_4h_to_h"), H, F, bias));
        if (!parallel) {
            IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "post_attention_layernorm"), H, 1));
            IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "input_layernorm"), H, 1));
        } else if (n_ln == 2) {
            IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "ln_attn"), H, 1));
            IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "ln_mlp"), H, 1));
        } else {
            IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "input_layernorm"), H, 1));
        }
    }
    IGRAD_CHECK(layer_norm(h, "transformer.ln_f", H, 1));
    if (!tie) IGRAD_CHECK(add(h, V, H, "lm_head.weight"));
    return IGRAD_OK;
}

static igrad_status_t build_gptj(hf_t *h)
{
    static const char *const hidden_keys[] = {"n_embd", "hidden_size", NULL};
    static const char *const layers_keys[] = {"n_layer", "num_hidden_layers", NULL};
    int64_t H, L, I, V;
    int tie;
    IGRAD_CHECK(cfg_int_keys(h, hidden_keys, -1, 1, MAX_DIM, &H));
    IGRAD_CHECK(cfg_layers(h, layers_keys, &L));
    IGRAD_CHECK(cfg_dim(h, "n_inner", 4 * H, &I));
    IGRAD_CHECK(cfg_dim(h, "vocab_size", -1, &V));
    IGRAD_CHECK(cfg_bool(h, "tie_word_embeddings", 0, &tie));
    static const char *const heads_keys[] = {"n_head", "num_attention_heads", NULL};
    IGRAD_CHECK(cfg_check_heads(h, heads_keys, "n_embd", H));

    char p[160];
    IGRAD_CHECK(add(h, V, H, "transformer.wte.weight"));
    for (int l = 0; l < (int)L; l++) {
        const char *b = "transformer.h.%d";
        IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "ln_1"), H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "attn.k_proj"), H, H, 0));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "attn.v_proj"), H, H, 0));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "attn.q_proj"), H, H, 0));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "attn.out_proj"), H, H, 0));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.fc_in"), I, H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.fc_out"), H, I, 1));
    }
    IGRAD_CHECK(layer_norm(h, "transformer.ln_f", H, 1));
    if (!tie) IGRAD_CHECK(add(h, V, H, "lm_head.weight"));
    IGRAD_CHECK(add(h, V, 0, "lm_head.bias"));
    return IGRAD_OK;
}

static igrad_status_t build_phi(hf_t *h)
{
    static const char *const layers_keys[] = {"num_hidden_layers", NULL};
    int64_t H, L, nH, nKV, I, V;
    int tie, qk_norm;
    IGRAD_CHECK(cfg_dim(h, "hidden_size", -1, &H));
    IGRAD_CHECK(cfg_layers(h, layers_keys, &L));
    IGRAD_CHECK(cfg_dim(h, "num_attention_heads", -1, &nH));
    IGRAD_CHECK(cfg_dim(h, "num_key_value_heads", nH, &nKV));
    IGRAD_CHECK(cfg_dim(h, "intermediate_size", -1, &I));
    IGRAD_CHECK(cfg_dim(h, "vocab_size", -1, &V));
    IGRAD_CHECK(cfg_bool(h, "tie_word_embeddings", 0, &tie));
    IGRAD_CHECK(cfg_bool(h, "qk_layernorm", 0, &qk_norm));
    IGRAD_CHECK(cfg_check_divides(h, "hidden_size", H, "num_attention_heads", nH));
    IGRAD_CHECK(cfg_check_kv_heads(h, "num_key_value_heads", nKV, "num_attention_heads", nH));
    int64_t hd = H / nH;

    char p[160];
    IGRAD_CHECK(add(h, V, H, "model.embed_tokens.weight"));
    for (int l = 0; l < (int)L; l++) {
        const char *b = "model.layers.%d";
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.q_proj"), nH * hd, H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.k_proj"), nKV * hd, H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.v_proj"), nKV * hd, H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "self_attn.dense"), H, nH * hd, 1));
        if (qk_norm) {
            IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "self_attn.q_layernorm"), hd, 1));
            IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "self_attn.k_layernorm"), hd, 1));
        }
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.fc1"), I, H, 1));
        IGRAD_CHECK(linear(h, pfx(p, sizeof p, b, l, "mlp.fc2"), H, I, 1));
        IGRAD_CHECK(layer_norm(h, pfx(p, sizeof p, b, l, "input_layernorm"), H, 1));
    }
    IGRAD_CHECK(layer_norm(h, "model.final_layernorm", H, 1));
    if (!tie) IGRAD_CHECK(add(h, V, H, "lm_head.weight"));
    IGRAD_CHECK(add(h, V, 0, "lm_head.bias"));
    return IGRAD_OK;
}

static const struct {
    const char *model_type;
    igrad_status_t (*build)(hf_t *h);
} families[] = {
    {"llama", build_llama},   {"mistral", build_llama},  {"qwen2", build_llama},
    {"gemma", build_llama},   {"mixtral", build_llama},  {"opt", build_opt},
    {"gpt2", build_gpt2},     {"gpt_neox", build_gpt_neox}, {"bloom", build_bloom},
    {"falcon", build_falcon}, {"gptj", build_gptj},      {"phi", build_phi},
};

static igrad_status_t from_json(const cJSON *root, const char *src, igrad_layout_t **out)
{
    IGRAD_FAIL_IF(!cJSON_IsObject(root), IGRAD_E_FORMAT, "%s: not a JSON object", src);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    IGRAD_FAIL_IF(!mt, IGRAD_E_FORMAT, "%s: missing required key 'model_type'", src);
    IGRAD_FAIL_IF(!cJSON_IsString(mt), IGRAD_E_FORMAT, "%s: key 'model_type' must be a string",
                  src);
    size_t nfam = sizeof families / sizeof families[0];
    size_t f = 0;
    while (f < nfam && strcmp(families[f].model_type, mt->valuestring) != 0) f++;
    if (f == nfam) {
        char list[256];
        size_t n = 0;
        list[0] = '\0';
        for (size_t i = 0; i < nfam && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "",
                                  families[i].model_type);
        return igrad__fail(IGRAD_E_UNSUPPORTED, __FILE__, __LINE__,
                           "%s: unsupported model_type '%.64s' (supported: %s)", src,
                           mt->valuestring, list);
    }

    hf_t h = {.root = root, .src = src, .family = families[f].model_type};
    IGRAD_CHECK(cfg_dtype(&h));
    IGRAD_CHECK(igrad_layout_create(&h.layout));
    igrad_status_t st = igrad__layout_set_family(h.layout, h.family);
    if (st == IGRAD_OK) st = families[f].build(&h);
    if (st != IGRAD_OK) {
        igrad_layout_free(h.layout);
        return st;
    }
    *out = h.layout;
    return IGRAD_OK;
}

igrad_status_t igrad_layout_from_hf_config_string(const char *json, size_t nbytes,
                                                  const char *source, igrad_layout_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_layout_from_hf_config_string: NULL out");
    *out = NULL;
    IGRAD_FAIL_IF(!json, IGRAD_E_INVALID, "igrad_layout_from_hf_config_string: NULL json");
    const char *src = source ? source : "<config>";
    if (nbytes >= 3 && memcmp(json, "\xEF\xBB\xBF", 3) == 0) { /* UTF-8 byte order mark */
        json += 3;
        nbytes -= 3;
    }
    IGRAD_FAIL_IF(memchr(json, '\0', nbytes) != NULL, IGRAD_E_FORMAT,
                  "%s: NUL byte in JSON text", src);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, nbytes, &end, 0);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        return igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                           "%s: malformed JSON near byte %zu", src, at);
    }
    size_t at = (size_t)(end - json);
    while (at < nbytes && (json[at] == ' ' || json[at] == '\n' || json[at] == '\r' ||
                           json[at] == '\t'))
        at++;
    size_t str_at = 0, nul = igrad__json_find_nul_escape(json, nbytes, &str_at);
    igrad_status_t st;
    if (at != nbytes) {
        st = igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                         "%s: trailing data after the JSON object at byte %zu", src, at);
    } else if (nul != IGRAD__JSON_NO_NUL) {
        /* cJSON would hand out the string cut at the NUL. */
        char excerpt[64];
        size_t line, col;
        igrad__json_nul_excerpt(json, nul, str_at, excerpt, sizeof excerpt);
        igrad__text_line_col(json, nul, &line, &col);
        st = igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                         "%s:%zu:%zu: string %s holds \\u0000 (a NUL character), which "
                         "igrad does not accept in JSON strings", src, line, col, excerpt);
    } else {
        st = from_json(root, src, out);
    }
    cJSON_Delete(root);
    return st;
}

igrad_status_t igrad_layout_from_hf_config(const char *path, igrad_layout_t **out)
{
    IGRAD_FAIL_IF(!out || !path, IGRAD_E_INVALID, "igrad_layout_from_hf_config: NULL argument");
    *out = NULL;
    char *text = NULL;
    size_t n = 0;
    IGRAD_CHECK(igrad__read_file(path, IGRAD__TEXT_MAX_NBYTES, &text, &n));
    igrad_status_t st = igrad_layout_from_hf_config_string(text, n, path, out);
    free(text);
    return st;
}
