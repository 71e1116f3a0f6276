/*
 * component.c — parameter name -> (layer, kind), and kind names.
 *
 * One name grammar covers every supported family: an optional "module."
 * (DDP) or PEFT "base_model.model." prefix, a block marker ("layers.N",
 * "h.N", "blocks.N", "block.N", "layer.N"), then the module path inside
 * the block, then "weight"/"bias". The kind comes from the last module
 * token, read in the context of its parent and grandparent (GPT-2's
 * c_proj is O under "attn" but FC2 under "mlp"; "dense" is O only under an
 * attention module or BERT's attention.output; "wo" is O under attention
 * and FC2 under T5's DenseReluDense; a bare "gate" under a MoE module is
 * its router, the MLP's input side: FC1). PEFT adapters (lora_A, lora_B,
 * base_layer, ...) take the component of the module they wrap;
 * nn.MultiheadAttention's in_proj_weight is that module's QKV. Outside the
 * projections: a norm is (block, NORM) inside a block and (-1, NORM) outside
 * (final and embedding norms); token and position embeddings are (-1, EMB) (a
 * tied lm_head is the embedding tensor, so it is EMB too); an untied
 * lm_head/embed_out/output is (-1, HEAD). T5's relative_attention_bias is its
 * block's Q, layer scales (timm's ls1/ls2) the block's NORM. Anything else
 * (unknown modules) is OTHER with layer -1, never a component. User rules that
 * come before these (igrad_name_map_t) live in name_map.c; the table of a whole
 * model (layout.c) and the HF family builders (layout_hf.c) live elsewhere.
 */
#define _POSIX_C_SOURCE 200809L
#include "core/internal.h"
#include "model/layout_internal.h"

#include <ctype.h>
#include <string.h>

static const char *const kind_names[IGRAD_KIND_COUNT] = {
    "Q", "K", "V", "QKV", "O", "FC1", "FC2", "OTHER", "EMB", "HEAD", "NORM",
};

int igrad__kind_is_outer(igrad_kind_t kind)
{
    return kind == IGRAD_KIND_EMB || kind == IGRAD_KIND_HEAD || kind == IGRAD_KIND_NORM;
}

const char *igrad_kind_name(igrad_kind_t kind)
{
    if ((int)kind < 0 || kind >= IGRAD_KIND_COUNT) return "?";
    return kind_names[kind];
}

igrad_status_t igrad_kind_from_name(const char *name, igrad_kind_t *kind)
{
    IGRAD_FAIL_IF(!name || !kind, IGRAD_E_INVALID, "igrad_kind_from_name: NULL argument");
    for (int k = 0; k < IGRAD_KIND_COUNT; k++) {
        if (igrad__name_equal(name, kind_names[k])) {
            *kind = (igrad_kind_t)k;
            return IGRAD_OK;
        }
    }
    return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                       "unknown component kind '%s' (expected Q, K, V, QKV, O, FC1, FC2, "
                       "OTHER, EMB, HEAD or NORM)", name);
}

/* Names are split into at most this many dot-separated tokens; anything
 * deeper than any supported family is not a known projection. */
#define MAX_TOKENS 16
#define MAX_TOKEN_LEN 64

typedef struct token {
    const char *s;
    size_t n;
} token_t;

static int tok_is(const token_t *t, const char *lit)
{
    size_t n = strlen(lit);
    return t->n == n && memcmp(t->s, lit, n) == 0;
}

static int tok_in(const token_t *t, const char *const *lits)
{
    for (; *lits; lits++) {
        if (tok_is(t, *lits)) return 1;
    }
    return 0;
}

int igrad__parse_layer_index(const char *s, size_t n)
{
    if (n == 0 || n > 6) return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static int tok_index(const token_t *t) { return igrad__parse_layer_index(t->s, t->n); }

/* Norms appear under many names: input_layernorm, post_attention_layernorm,
 * self_attn_layer_norm, final_layer_norm, ln_1, ln_attn, q_norm, ... */
static int tok_is_norm(const token_t *t)
{
    char buf[MAX_TOKEN_LEN + 1];
    if (t->n > MAX_TOKEN_LEN) return 0;
    for (size_t i = 0; i < t->n; i++) buf[i] = (char)tolower((unsigned char)t->s[i]);
    buf[t->n] = '\0';
    if (strstr(buf, "norm")) return 1;
    if (strcmp(buf, "ln") == 0 || strncmp(buf, "ln_", 3) == 0) return 1;
    return 0;
}

static const char *const attention_modules[] = {
    "self_attn", "attn", "attention", "self_attention", "mixer", "multihead_attn",
    "SelfAttention", "EncDecAttention", "crossattention", NULL,
};
static const char *const mlp_modules[] = {"mlp", "feed_forward", "ffn", "DenseReluDense",
                                          NULL};
/* Where a MoE layer keeps its router: Mixtral's block_sparse_moe, the
 * "mlp" of Qwen2-MoE / DeepSeek-MoE / OLMoE, Jamba's feed_forward, DBRX's
 * ffn, Switch Transformers' mlp (router.classifier). */
static const char *const moe_modules[] = {"block_sparse_moe", "mlp", "moe", "feed_forward",
                                          "ffn", NULL};

/* A MoE router: a small linear map (experts x hidden) that reads the MLP
 * input and picks the experts, or the gate of Qwen2-MoE's shared expert
 * (1 x hidden). It is the MLP's input side, like the experts' w1/w3 and
 * gate_proj/up_proj: FC1 (docs/decisions/0041-parameter-name-rules.md, (d)). Its own
 * tensors ("gate.weight", DeepSeek-V3's "gate.e_score_correction_bias",
 * "router.classifier.weight", "router.layer.weight") all count. */
static int is_moe_router(const token_t *mod, const token_t *parent, const token_t *grand)
{
    static const char *const router[] = {"gate", "router", NULL};
    if (parent && tok_in(parent, moe_modules) &&
        (tok_in(mod, router) || tok_is(mod, "shared_expert_gate")))
        return 1;
    return parent && grand && tok_in(parent, router) && tok_in(grand, moe_modules);
}

/* Per-channel scales of a block's residual branches: timm's LayerScale
 * (ls1.gamma, ls2.gamma), BEiT's gamma_1/gamma_2, DINOv2's layer_scale1/2.
 * An elementwise scale of the block's width like a norm's weight: NORM. */
static int tok_is_layer_scale(const token_t *t)
{
    static const char *const scales[] = {"ls1",          "ls2",          "gamma_1",
                                         "gamma_2",      "layer_scale1", "layer_scale2",
                                         NULL};
    return tok_in(t, scales);
}

static igrad_kind_t kind_of_module(const token_t *mod, const token_t *parent,
                                   const token_t *grand)
{
    /* Multi-head latent attention (DeepSeek-V2/V3) factors Q into a
     * low-rank pair q_a_proj, q_b_proj (both Q) and K with V into
     * kv_a_proj_with_mqa, kv_b_proj: projections that feed more than one
     * of Q, K, V are QKV. */
    static const char *const q[] = {"q_proj", "query", "wq", "q_lin", "q_a_proj", "q_b_proj",
                                    NULL};
    static const char *const k[] = {"k_proj", "key", "wk", "k_lin", NULL};
    static const char *const v[] = {"v_proj", "value", "wv", "v_lin", NULL};
    static const char *const qkv[] = {"c_attn",   "query_key_value",    "qkv_proj", "Wqkv",
                                      "qkv",      "wqkv",               "W_pack",   "in_proj",
                                      "att_proj", "kv_a_proj_with_mqa", "kv_b_proj", NULL};
    static const char *const o[] = {"o_proj", "out_proj", "attn_out", "out_lin", NULL};
    static const char *const fc1[] = {"gate_proj", "up_proj", "gate_up_proj", "w1", "w3",
                                      "fc1", "fc_in", "c_fc", "dense_h_to_4h", "linear1",
                                      "ff_proj", "lin1", NULL};
    static const char *const fc2[] = {"down_proj", "w2", "fc2", "fc_out", "dense_4h_to_h",
                                      "linear2", "ff_out", "lin2", NULL};
    /* Mamba's mixer: the selective scan's input side (in_proj is QKV by
     * the list above); out_proj is O like every attention output. */
    static const char *const ssm_in[] = {"conv1d", "x_proj", "dt_proj", "A_log", "D",
                                         "dt_bias", NULL};
    static const char *const t5_fc1[] = {"wi", "wi_0", "wi_1", NULL};
    int in_attn = parent && tok_in(parent, attention_modules);
    int in_mlp = parent && tok_in(parent, mlp_modules);

    if (tok_in(mod, q)) return IGRAD_KIND_Q;
    if (tok_in(mod, k)) return IGRAD_KIND_K;
    if (tok_in(mod, v)) return IGRAD_KIND_V;
    if (tok_in(mod, qkv)) return IGRAD_KIND_QKV;
    if (tok_in(mod, o)) return IGRAD_KIND_O;
    if (tok_in(mod, fc1)) return IGRAD_KIND_FC1;
    if (tok_in(mod, fc2)) return IGRAD_KIND_FC2;
    /* Phi names its attention projections q, k, v and dense; T5 q, k, v
     * and o. */
    if (in_attn && tok_is(mod, "q")) return IGRAD_KIND_Q;
    if (in_attn && tok_is(mod, "k")) return IGRAD_KIND_K;
    if (in_attn && tok_is(mod, "v")) return IGRAD_KIND_V;
    if (in_attn && (tok_is(mod, "dense") || tok_is(mod, "o"))) return IGRAD_KIND_O;
    /* GPT-2 reuses c_proj for the attention output and the MLP down
     * projection; Meta's LLaMA and InternLM2 name the attention output wo,
     * T5 its MLP's down projection. */
    if (tok_is(mod, "c_proj") || tok_is(mod, "wo")) {
        if (in_attn) return IGRAD_KIND_O;
        if (in_mlp) return IGRAD_KIND_FC2;
    }
    if (in_mlp && tok_in(mod, t5_fc1)) return IGRAD_KIND_FC1;
    /* timm's attention output is attn.proj. */
    if (in_attn && tok_is(mod, "proj")) return IGRAD_KIND_O;
    if (parent && tok_is(parent, "mixer") && tok_in(mod, ssm_in)) return IGRAD_KIND_QKV;
    if (is_moe_router(mod, parent, grand)) return IGRAD_KIND_FC1;
    /* T5's relative position bias (buckets x heads, in block 0's
     * attention) is added to the logits next to q.k: the attention's input
     * side, Q (docs/decisions/0041-parameter-name-rules.md, (d)). */
    if (in_attn && tok_is(mod, "relative_attention_bias")) return IGRAD_KIND_Q;
    /* BERT: attention.output.dense is the attention output,
     * intermediate.dense the up projection, a block's output.dense the
     * down projection. */
    if (tok_is(mod, "dense") && parent) {
        if (tok_is(parent, "intermediate")) return IGRAD_KIND_FC1;
        if (tok_is(parent, "output")) {
            if (grand && tok_in(grand, attention_modules)) return IGRAD_KIND_O;
            return IGRAD_KIND_FC2;
        }
    }
    return IGRAD_KIND_OTHER;
}

/* Names outside any block: embeddings and the output head. A
 * "word_embeddings_layernorm" is a norm (checked first). OLMo's untied
 * head is transformer.ff_out, timm's and a classifier's "head". */
static igrad_kind_t kind_outside_block(const token_t *tok, int ntok)
{
    static const char *const emb[] = {"embed_tokens",          "embed_positions",
                                      "embed_in",              "wte",
                                      "wpe",                   "word_embeddings",
                                      "tok_embeddings",        "position_embeddings",
                                      "token_embeddings",      "token_type_embeddings",
                                      "shared",                "embedding",
                                      "pos_embed",             "cls_token",
                                      "embed",                 NULL};
    static const char *const head[] = {"lm_head", "embed_out", "output", "ff_out", "head",
                                       "classifier", NULL};
    int end = ntok;
    if (end > 0 && (tok_is(&tok[end - 1], "weight") || tok_is(&tok[end - 1], "bias"))) end--;
    if (end <= 0) return IGRAD_KIND_OTHER;
    for (int i = 0; i < end; i++) {
        if (tok_is_norm(&tok[i])) return IGRAD_KIND_NORM;
    }
    if (tok_in(&tok[end - 1], emb)) return IGRAD_KIND_EMB;
    if (tok_in(&tok[end - 1], head)) return IGRAD_KIND_HEAD;
    return IGRAD_KIND_OTHER;
}

/* Splits a name at its dots; 0 when it has more tokens than any family. */
static int tokenize(const char *name, token_t *tok)
{
    int ntok = 0;
    const char *p = name;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (ntok == MAX_TOKENS) return 0;
        tok[ntok].s = p;
        tok[ntok].n = n;
        ntok++;
        if (!dot) break;
        p = dot + 1;
    }
    return ntok;
}

/* The first block marker followed by an index starts the block: returns
 * the token where the block's module path starts (-1: no block) and the
 * index in *index. */
static int find_block(const token_t *tok, int ntok, int *index)
{
    static const char *const block_markers[] = {"layers", "h", "blocks", "block", "layer",
                                                NULL};
    for (int i = 0; i + 1 < ntok; i++) {
        if (tok_in(&tok[i], block_markers)) {
            *index = tok_index(&tok[i + 1]);
            if (*index >= 0) return i + 2;
        }
    }
    *index = -1;
    return -1;
}

/* PEFT wraps a module: q_proj.lora_A.default.weight, q_proj.base_layer.
 * weight, lm_head.modules_to_save.default.weight. The name is cut at the
 * first adapter token, so the wrapped module decides. */
static int cut_adapter(const token_t *tok, int ntok, int from)
{
    static const char *const adapter[] = {"lora_A",           "lora_B",
                                          "lora_embedding_A", "lora_embedding_B",
                                          "lora_magnitude_vector", "base_layer",
                                          "modules_to_save",  "original_module",
                                          NULL};
    for (int i = from > 1 ? from : 1; i < ntok; i++)
        if (tok_in(&tok[i], adapter)) return i;
    return ntok;
}

/* nn.MultiheadAttention's parameters are in_proj_weight / in_proj_bias
 * (and q/k/v_proj_weight with kdim or vdim set): the module token with
 * its "_weight"/"_bias" cut off. */
static void split_mha_suffix(token_t *last)
{
    static const char *const mha[] = {"in_proj", "q_proj", "k_proj", "v_proj", NULL};
    static const char *const suffixes[] = {"_weight", "_bias", NULL};
    for (const char *const *sfx = suffixes; *sfx; sfx++) {
        size_t m = strlen(*sfx);
        if (last->n <= m || memcmp(last->s + last->n - m, *sfx, m) != 0) continue;
        token_t stem = {last->s, last->n - m};
        if (tok_in(&stem, mha)) *last = stem;
        return;
    }
}

int igrad__name_block_index(const char *name)
{
    token_t tok[MAX_TOKENS];
    int index = -1;
    int ntok = name ? tokenize(name, tok) : 0;
    if (ntok > 0) find_block(tok, ntok, &index);
    return index;
}

igrad_kind_t igrad_component_of(const char *name, int *layer)
{
    if (layer) *layer = -1;
    if (!name) return IGRAD_KIND_OTHER;

    token_t tok[MAX_TOKENS];
    int ntok = tokenize(name, tok);
    if (ntok == 0) return IGRAD_KIND_OTHER;

    int index = -1;
    int block = find_block(tok, ntok, &index);
    int cut = cut_adapter(tok, ntok, block);
    int stripped = cut < ntok; /* the wrapped module is the last token */
    ntok = cut;
    if (block < 0) return kind_outside_block(tok, ntok);

    int end = ntok;
    if (!stripped && end > block &&
        (tok_is(&tok[end - 1], "weight") || tok_is(&tok[end - 1], "bias")))
        end--;
    if (end <= block) return IGRAD_KIND_OTHER;
    token_t mod = tok[end - 1];
    if (end == ntok && !stripped) split_mha_suffix(&mod);
    const token_t *parent = end - 2 >= block ? &tok[end - 2] : NULL;
    const token_t *grand = end - 3 >= block ? &tok[end - 3] : NULL;
    /* The module itself decides first: a projection stays one under a
     * container whose name holds a norm-like word (DBRX's
     * blocks.N.norm_attn_norm.attn.Wqkv). A norm or layer scale is the
     * last module or its parent (ln_1.weight, ls1.gamma, q_a_layernorm). */
    igrad_kind_t kind = kind_of_module(&mod, parent, grand);
    if (kind == IGRAD_KIND_OTHER) {
        for (int i = end - 1; i >= block && i >= end - 2; i--) {
            if (tok_is_norm(&tok[i]) || tok_is_layer_scale(&tok[i])) {
                kind = IGRAD_KIND_NORM;
                break;
            }
        }
    }
    if (kind != IGRAD_KIND_OTHER && layer) *layer = index;
    return kind;
}
