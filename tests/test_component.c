/*
 * test_component.c — parameter name -> (layer, kind): one case per naming
 * pattern of every supported family, the tricky ones (norms inside blocks,
 * biases, DDP "module." prefix, bare base-model names, lm_head, MoE routers
 * and experts, T5's relative bias, layer scales),
 * kind names, and per-kind weight counts of every shipped config checked
 * against counts worked out by hand from the architecture.
 *
 * The table machinery itself (offsets, hash, readers) is tested in
 * test_layout.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "igrad.h"

typedef struct name_case {
    const char *name;
    int layer;
    igrad_kind_t kind;
} name_case_t;

#define Q IGRAD_KIND_Q
#define K IGRAD_KIND_K
#define V IGRAD_KIND_V
#define QKV IGRAD_KIND_QKV
#define O IGRAD_KIND_O
#define FC1 IGRAD_KIND_FC1
#define FC2 IGRAD_KIND_FC2
#define OTHER IGRAD_KIND_OTHER
#define EMB IGRAD_KIND_EMB
#define HEAD IGRAD_KIND_HEAD
#define NORM IGRAD_KIND_NORM

static const name_case_t cases[] = {
    /* llama / mistral / qwen2 / gemma */
    {"model.layers.3.self_attn.q_proj.weight", 3, Q},
    {"model.layers.3.self_attn.k_proj.weight", 3, K},
    {"model.layers.3.self_attn.v_proj.weight", 3, V},
    {"model.layers.3.self_attn.o_proj.weight", 3, O},
    {"model.layers.3.mlp.gate_proj.weight", 3, FC1},
    {"model.layers.3.mlp.up_proj.weight", 3, FC1},
    {"model.layers.3.mlp.down_proj.weight", 3, FC2},
    {"model.layers.31.self_attn.q_proj.bias", 31, Q}, /* qwen2 bias */
    {"model.layers.0.input_layernorm.weight", 0, NORM},
    {"model.layers.0.post_attention_layernorm.weight", 0, NORM},
    {"model.embed_tokens.weight", -1, EMB},
    {"model.norm.weight", -1, NORM},
    {"lm_head.weight", -1, HEAD},
    /* mixtral */
    {"model.layers.3.block_sparse_moe.experts.5.w1.weight", 3, FC1},
    {"model.layers.3.block_sparse_moe.experts.5.w3.weight", 3, FC1},
    {"model.layers.3.block_sparse_moe.experts.7.w2.weight", 3, FC2},
    /* MoE routers read the MLP input: FC1 (docs/decisions/0041, (d)) */
    {"model.layers.3.block_sparse_moe.gate.weight", 3, FC1},
    /* Qwen2-MoE / Qwen3-MoE / DeepSeek-MoE / OLMoE: router mlp.gate (not
     * LLaMA's mlp.gate_proj, FC1 as a projection), experts, shared expert */
    {"model.layers.5.mlp.gate.weight", 5, FC1},
    {"model.layers.5.mlp.experts.0.gate_proj.weight", 5, FC1},
    {"model.layers.5.mlp.experts.0.up_proj.weight", 5, FC1},
    {"model.layers.5.mlp.experts.59.down_proj.weight", 5, FC2},
    {"model.layers.5.mlp.shared_expert.gate_proj.weight", 5, FC1},
    {"model.layers.5.mlp.shared_expert.up_proj.weight", 5, FC1},
    {"model.layers.5.mlp.shared_expert.down_proj.weight", 5, FC2},
    {"model.layers.5.mlp.shared_expert_gate.weight", 5, FC1},
    {"model.layers.5.mlp.shared_experts.down_proj.weight", 5, FC2}, /* DeepSeek */
    {"model.layers.5.mlp.gate.e_score_correction_bias", 5, FC1},    /* DeepSeek-V3 */
    /* DeepSeek-V2/V3 multi-head latent attention: the low-rank pairs */
    {"model.layers.5.self_attn.q_a_proj.weight", 5, Q},
    {"model.layers.5.self_attn.q_b_proj.weight", 5, Q},
    {"model.layers.5.self_attn.kv_a_proj_with_mqa.weight", 5, QKV},
    {"model.layers.5.self_attn.kv_b_proj.weight", 5, QKV},
    {"model.layers.5.self_attn.q_a_layernorm.weight", 5, NORM},
    {"model.layers.5.self_attn.kv_a_layernorm.weight", 5, NORM},
    {"model.layers.5.self_attn.o_proj.weight", 5, O},
    /* a norm-like word in a container above the projections (DBRX's
     * norm_attn_norm): the projection decides, the container's norms are NORM */
    {"transformer.blocks.2.norm_attn_norm.attn.Wqkv.weight", 2, QKV},
    {"transformer.blocks.2.norm_attn_norm.attn.out_proj.weight", 2, O},
    {"transformer.blocks.2.norm_attn_norm.norm_1.weight", 2, NORM},
    {"transformer.blocks.2.norm_attn_norm.norm_2.weight", 2, NORM},
    {"model.layers.1.norm_block.self_attn.q_proj.weight", 1, Q},
    {"model.layers.1.norm_block.mlp.down_proj.weight", 1, FC2},
    /* transformers' fused experts (3-D parameters, no .weight) */
    {"model.layers.5.mlp.experts.gate_up_proj", 5, FC1},
    {"model.layers.5.mlp.experts.down_proj", 5, FC2},
    /* other routers: Jamba, DBRX, Switch Transformers, GPT-OSS */
    {"model.layers.2.feed_forward.router.weight", 2, FC1},
    {"transformer.blocks.2.ffn.router.layer.weight", 2, FC1},
    {"encoder.block.1.layer.1.mlp.router.classifier.weight", 1, FC1},
    {"model.layers.2.mlp.router.bias", 2, FC1},
    /* a "gate" or "router" outside a MoE module is no router */
    {"model.layers.2.gate.weight", -1, OTHER},
    {"model.layers.2.self_attn.gate.weight", -1, OTHER},
    {"model.layers.2.router.weight", -1, OTHER},
    /* opt */
    {"model.decoder.layers.4.self_attn.q_proj.weight", 4, Q},
    {"model.decoder.layers.4.self_attn.k_proj.bias", 4, K},
    {"model.decoder.layers.4.self_attn.v_proj.weight", 4, V},
    {"model.decoder.layers.4.self_attn.out_proj.weight", 4, O},
    {"model.decoder.layers.4.fc1.weight", 4, FC1},
    {"model.decoder.layers.4.fc2.bias", 4, FC2},
    {"model.decoder.layers.4.self_attn_layer_norm.weight", 4, NORM},
    {"model.decoder.layers.4.final_layer_norm.bias", 4, NORM},
    {"model.decoder.embed_positions.weight", -1, EMB},
    {"model.decoder.project_in.weight", -1, OTHER},
    {"model.decoder.final_layer_norm.weight", -1, NORM},
    /* gpt2 */
    {"transformer.h.3.attn.c_attn.weight", 3, QKV},
    {"transformer.h.3.attn.c_attn.bias", 3, QKV},
    {"transformer.h.3.attn.c_proj.weight", 3, O},
    {"transformer.h.3.mlp.c_fc.weight", 3, FC1},
    {"transformer.h.3.mlp.c_proj.weight", 3, FC2},
    {"transformer.h.3.mlp.c_proj.bias", 3, FC2},
    {"transformer.h.3.ln_1.weight", 3, NORM},
    {"transformer.h.3.ln_2.bias", 3, NORM},
    {"transformer.h.3.attn.bias", -1, OTHER}, /* old checkpoints: causal mask buffer */
    {"transformer.wte.weight", -1, EMB},
    {"transformer.wpe.weight", -1, EMB},
    {"transformer.ln_f.weight", -1, NORM},
    /* gpt_neox / pythia */
    {"gpt_neox.layers.5.attention.query_key_value.weight", 5, QKV},
    {"gpt_neox.layers.5.attention.dense.weight", 5, O},
    {"gpt_neox.layers.5.mlp.dense_h_to_4h.bias", 5, FC1},
    {"gpt_neox.layers.5.mlp.dense_4h_to_h.weight", 5, FC2},
    {"gpt_neox.layers.5.input_layernorm.weight", 5, NORM},
    {"gpt_neox.embed_in.weight", -1, EMB},
    {"gpt_neox.final_layer_norm.weight", -1, NORM},
    {"embed_out.weight", -1, HEAD},
    /* bloom and falcon */
    {"transformer.h.7.self_attention.query_key_value.weight", 7, QKV},
    {"transformer.h.7.self_attention.dense.bias", 7, O},
    {"transformer.h.7.mlp.dense_h_to_4h.weight", 7, FC1},
    {"transformer.h.7.mlp.dense_4h_to_h.weight", 7, FC2},
    {"transformer.word_embeddings_layernorm.weight", -1, NORM},
    {"transformer.h.7.ln_attn.weight", 7, NORM},
    {"transformer.h.7.ln_mlp.bias", 7, NORM},
    /* gptj */
    {"transformer.h.2.attn.q_proj.weight", 2, Q},
    {"transformer.h.2.attn.k_proj.weight", 2, K},
    {"transformer.h.2.attn.v_proj.weight", 2, V},
    {"transformer.h.2.attn.out_proj.weight", 2, O},
    {"transformer.h.2.mlp.fc_in.weight", 2, FC1},
    {"transformer.h.2.mlp.fc_out.bias", 2, FC2},
    {"lm_head.bias", -1, HEAD},
    /* phi (transformers naming and the short q/k/v/dense form) */
    {"model.layers.9.self_attn.q_proj.weight", 9, Q},
    {"model.layers.9.self_attn.dense.weight", 9, O},
    {"model.layers.9.self_attn.q.weight", 9, Q},
    {"model.layers.9.self_attn.k.bias", 9, K},
    {"model.layers.9.self_attn.v.weight", 9, V},
    {"model.layers.9.mlp.fc1.weight", 9, FC1},
    {"model.layers.9.mlp.fc2.bias", 9, FC2},
    {"model.layers.9.self_attn.q_layernorm.weight", 9, NORM},
    {"model.final_layernorm.weight", -1, NORM},
    /* DDP prefix and bare base models */
    {"module.model.layers.2.mlp.down_proj.weight", 2, FC2},
    {"module.transformer.h.11.attn.c_attn.weight", 11, QKV},
    {"layers.9.mlp.up_proj.weight", 9, FC1},
    {"h.4.attn.c_proj.bias", 4, O},
    {"decoder.layers.1.fc2.weight", 1, FC2},
    {"layers.0.self_attn.o_proj.weight", 0, O},
    /* torch.nn.TransformerEncoder(Layer), as named_parameters() prints it */
    {"encoder.layers.0.self_attn.in_proj_weight", 0, QKV},
    {"encoder.layers.0.self_attn.in_proj_bias", 0, QKV},
    {"encoder.layers.0.self_attn.out_proj.weight", 0, O},
    {"encoder.layers.0.self_attn.out_proj.bias", 0, O},
    {"encoder.layers.0.linear1.weight", 0, FC1},
    {"encoder.layers.0.linear1.bias", 0, FC1},
    {"encoder.layers.0.linear2.weight", 0, FC2},
    {"encoder.layers.0.linear2.bias", 0, FC2},
    {"encoder.layers.0.norm1.weight", 0, NORM},
    {"encoder.layers.0.norm2.bias", 0, NORM},
    {"layers.5.self_attn.in_proj_weight", 5, QKV},             /* a bare ModuleList */
    {"decoder.layers.1.multihead_attn.in_proj_weight", 1, QKV}, /* cross-attention */
    {"decoder.layers.1.multihead_attn.q_proj_weight", 1, Q},    /* kdim != embed_dim */
    {"decoder.layers.1.multihead_attn.k_proj_weight", 1, K},
    {"decoder.layers.1.multihead_attn.v_proj_weight", 1, V},
    {"decoder.layers.1.norm3.weight", 1, NORM},
    /* Meta's LLaMA (llama/model.py) */
    {"layers.7.attention.wq.weight", 7, Q},
    {"layers.7.attention.wk.weight", 7, K},
    {"layers.7.attention.wv.weight", 7, V},
    {"layers.7.attention.wo.weight", 7, O},
    {"layers.7.feed_forward.w1.weight", 7, FC1},
    {"layers.7.feed_forward.w2.weight", 7, FC2},
    {"layers.7.feed_forward.w3.weight", 7, FC1},
    {"layers.7.attention_norm.weight", 7, NORM},
    {"layers.7.ffn_norm.weight", 7, NORM},
    /* PEFT LoRA / DoRA on a LLaMA: adapters take their base projection's component */
    {"base_model.model.model.layers.2.self_attn.q_proj.lora_A.default.weight", 2, Q},
    {"base_model.model.model.layers.2.self_attn.q_proj.lora_B.default.weight", 2, Q},
    {"base_model.model.model.layers.2.self_attn.q_proj.base_layer.weight", 2, Q},
    {"base_model.model.model.layers.2.self_attn.v_proj.lora_A.default.weight", 2, V},
    {"base_model.model.model.layers.2.self_attn.o_proj.lora_B.default.weight", 2, O},
    {"base_model.model.model.layers.2.mlp.down_proj.lora_A.default.weight", 2, FC2},
    {"base_model.model.model.layers.2.mlp.gate_proj.lora_B.adapter_1.weight", 2, FC1},
    {"base_model.model.model.layers.2.self_attn.k_proj.lora_magnitude_vector.default.weight", 2,
     K},
    {"base_model.model.model.embed_tokens.lora_embedding_A.default", -1, EMB},
    {"base_model.model.lm_head.modules_to_save.default.weight", -1, HEAD},
    {"base_model.model.model.layers.2.input_layernorm.weight", 2, NORM},
    /* timm ViT */
    {"blocks.11.attn.qkv.weight", 11, QKV},
    {"blocks.11.attn.qkv.bias", 11, QKV},
    {"blocks.11.attn.proj.weight", 11, O},
    {"blocks.11.mlp.fc1.weight", 11, FC1},
    {"blocks.11.mlp.fc2.bias", 11, FC2},
    {"blocks.11.norm1.weight", 11, NORM},
    {"blocks.11.norm2.bias", 11, NORM},
    {"pos_embed", -1, EMB},
    {"cls_token", -1, EMB},
    {"embed.weight", -1, EMB}, /* a hand-written model's nn.Embedding */
    {"head.weight", -1, HEAD},
    {"patch_embed.proj.weight", -1, OTHER}, /* outside blocks: no warning either */
    /* BERT / RoBERTa */
    {"bert.encoder.layer.3.attention.self.query.weight", 3, Q},
    {"bert.encoder.layer.3.attention.self.key.bias", 3, K},
    {"bert.encoder.layer.3.attention.self.value.weight", 3, V},
    {"bert.encoder.layer.3.attention.output.dense.weight", 3, O},
    {"bert.encoder.layer.3.attention.output.LayerNorm.weight", 3, NORM},
    {"bert.encoder.layer.3.intermediate.dense.weight", 3, FC1},
    {"bert.encoder.layer.3.output.dense.bias", 3, FC2},
    {"bert.encoder.layer.3.output.LayerNorm.bias", 3, NORM},
    {"bert.embeddings.word_embeddings.weight", -1, EMB},
    {"bert.embeddings.position_embeddings.weight", -1, EMB},
    {"bert.embeddings.token_type_embeddings.weight", -1, EMB},
    {"bert.embeddings.LayerNorm.weight", -1, NORM},
    {"roberta.encoder.layer.0.attention.output.dense.weight", 0, O},
    {"classifier.weight", -1, HEAD},
    /* DistilBERT */
    {"distilbert.transformer.layer.1.attention.q_lin.weight", 1, Q},
    {"distilbert.transformer.layer.1.attention.out_lin.weight", 1, O},
    {"distilbert.transformer.layer.1.ffn.lin1.weight", 1, FC1},
    {"distilbert.transformer.layer.1.ffn.lin2.weight", 1, FC2},
    /* T5 (and v1.1's gated wi_0 / wi_1) */
    {"encoder.block.4.layer.0.SelfAttention.q.weight", 4, Q},
    {"encoder.block.4.layer.0.SelfAttention.k.weight", 4, K},
    {"encoder.block.4.layer.0.SelfAttention.v.weight", 4, V},
    {"encoder.block.4.layer.0.SelfAttention.o.weight", 4, O},
    {"encoder.block.4.layer.0.layer_norm.weight", 4, NORM},
    {"encoder.block.4.layer.1.DenseReluDense.wi.weight", 4, FC1},
    {"encoder.block.4.layer.1.DenseReluDense.wi_0.weight", 4, FC1},
    {"encoder.block.4.layer.1.DenseReluDense.wi_1.weight", 4, FC1},
    {"encoder.block.4.layer.1.DenseReluDense.wo.weight", 4, FC2},
    {"decoder.block.2.layer.1.EncDecAttention.q.weight", 2, Q},
    {"decoder.block.2.layer.1.EncDecAttention.o.weight", 2, O},
    {"decoder.block.2.layer.2.DenseReluDense.wo.weight", 2, FC2},
    /* the relative position bias sits on the logits with q.k: Q */
    {"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 0, Q},
    {"decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 0, Q},
    {"model.layers.0.mlp.relative_attention_bias.weight", -1, OTHER}, /* not under attention */
    {"shared.weight", -1, EMB},
    {"encoder.final_layer_norm.weight", -1, NORM},
    /* Mamba: in_proj and the scan's input side are QKV, out_proj is O */
    {"backbone.layers.6.mixer.in_proj.weight", 6, QKV},
    {"backbone.layers.6.mixer.conv1d.weight", 6, QKV},
    {"backbone.layers.6.mixer.conv1d.bias", 6, QKV},
    {"backbone.layers.6.mixer.x_proj.weight", 6, QKV},
    {"backbone.layers.6.mixer.dt_proj.weight", 6, QKV},
    {"backbone.layers.6.mixer.dt_proj.bias", 6, QKV},
    {"backbone.layers.6.mixer.A_log", 6, QKV},
    {"backbone.layers.6.mixer.D", 6, QKV},
    {"backbone.layers.6.mixer.out_proj.weight", 6, O},
    {"backbone.layers.6.norm.weight", 6, NORM},
    {"backbone.embedding.weight", -1, EMB},
    {"backbone.norm_f.weight", -1, NORM},
    /* InternLM2 */
    {"model.layers.3.attention.wqkv.weight", 3, QKV},
    {"model.layers.3.attention.wo.weight", 3, O},
    {"model.layers.3.feed_forward.w1.weight", 3, FC1},
    {"model.layers.3.feed_forward.w3.weight", 3, FC1},
    {"model.layers.3.feed_forward.w2.weight", 3, FC2},
    {"model.tok_embeddings.weight", -1, EMB},
    {"output.weight", -1, HEAD},
    /* OLMo (v1) */
    {"model.transformer.blocks.5.att_proj.weight", 5, QKV},
    {"model.transformer.blocks.5.attn_out.weight", 5, O},
    {"model.transformer.blocks.5.ff_proj.weight", 5, FC1},
    {"model.transformer.blocks.5.ff_out.weight", 5, FC2},
    {"model.transformer.blocks.5.attn_norm.weight", 5, NORM},
    {"model.transformer.wte.weight", -1, EMB},
    {"model.transformer.ff_out.weight", -1, HEAD}, /* the untied head */
    /* Baichuan */
    {"model.layers.8.self_attn.W_pack.weight", 8, QKV},
    {"model.layers.8.self_attn.o_proj.weight", 8, O},
    /* unknown and malformed names */
    {"", -1, OTHER},
    {"weight", -1, OTHER},
    {"model.layers.x.self_attn.q_proj.weight", -1, OTHER},
    {"model.layers.3", -1, OTHER},
    {"model.layers.3.weight", -1, OTHER},
    {"model.layers.3.mlp.dense.weight", -1, OTHER}, /* "dense" is O only under attention */
    {"model.layers.3.self_attn.rotary_emb.inv_freq", -1, OTHER},
    {"model.layers.99999999.self_attn.q_proj.weight", -1, OTHER}, /* index too large */
    {"vision.encoder.blocks.1.attn.qkv.weight", 1, QKV}, /* timm's naming */
    /* timm's LayerScale, BEiT's gamma_1/2, DINOv2's layer_scale1/2: NORM */
    {"blocks.7.ls1.gamma", 7, NORM},
    {"blocks.7.ls2.gamma", 7, NORM},
    {"vision.encoder.blocks.1.ls1.gamma", 1, NORM},
    {"blocks.3.gamma_1", 3, NORM},
    {"blocks.3.gamma_2", 3, NORM},
    {"encoder.layer.4.layer_scale1.lambda1", 4, NORM},
    {"encoder.layer.4.layer_scale2.lambda1", 4, NORM},
    {"blocks.7.ls3.gamma", -1, OTHER},
    {"blocks.7.gamma", -1, OTHER},
    {"model.decoder.project_out.weight", -1, OTHER}, /* OPT-350m's projections */
    {"model.word_embeddings.weight", -1, EMB},
    {"tok_embeddings.weight", -1, EMB},
    {"output.weight", -1, HEAD}, /* Meta's llama naming */
    {"norm.weight", -1, NORM},
    {"model.layers.3.mlp.experts.0.router_norm.weight", 3, NORM},
    {"model.embed_tokens.extra", -1, OTHER}, /* the last module decides */
    {"model.lm_head_scale", -1, OTHER},
    {"model.vision_tower.patch_embed.weight", -1, OTHER},
};

static void test_component_of_names(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int layer = 12345;
        igrad_kind_t kind = igrad_component_of(cases[i].name, &layer);
        if (kind != cases[i].kind || layer != cases[i].layer)
            fail_msg("'%s': got (%d, %s), expected (%d, %s)", cases[i].name, layer,
                     igrad_kind_name(kind), cases[i].layer, igrad_kind_name(cases[i].kind));
    }
    /* layer pointer is optional, NULL name is OTHER */
    assert_int_equal(igrad_component_of("model.layers.1.mlp.up_proj.weight", NULL), FC1);
    int layer = 7;
    assert_int_equal(igrad_component_of(NULL, &layer), OTHER);
    assert_int_equal(layer, -1);
}

static void test_kind_names(void **state)
{
    (void)state;
    static const char *const names[] = {"Q",   "K",     "V",   "QKV",  "O",   "FC1",
                                        "FC2", "OTHER", "EMB", "HEAD", "NORM"};
    assert_int_equal(sizeof names / sizeof names[0], IGRAD_KIND_COUNT);
    for (int k = 0; k < IGRAD_KIND_COUNT; k++) {
        assert_string_equal(igrad_kind_name((igrad_kind_t)k), names[k]);
        igrad_kind_t back = IGRAD_KIND_COUNT;
        assert_int_equal(igrad_kind_from_name(names[k], &back), IGRAD_OK);
        assert_int_equal(back, k);
    }
    igrad_kind_t kind;
    assert_int_equal(igrad_kind_from_name("fc1", &kind), IGRAD_OK);
    assert_int_equal(kind, FC1);
    assert_int_equal(igrad_kind_from_name("qkv", &kind), IGRAD_OK);
    assert_int_equal(kind, QKV);
    assert_int_equal(igrad_kind_from_name("FC3", &kind), IGRAD_E_INVALID);
    if (!strstr(igrad_last_error(), "FC3")) fail_msg("message: %s", igrad_last_error());
    assert_int_equal(igrad_kind_from_name("", &kind), IGRAD_E_INVALID);
    assert_string_equal(igrad_kind_name((igrad_kind_t)99), "?");
}

/* ---- per-kind counts of the shipped configs ----------------------------- */

static const char *source_dir(void)
{
    static char dir[4096];
    const char *env = getenv("IGRAD_SOURCE_DIR");
    if (env && *env) return env;
    /* Fallback for runs outside CTest: this file lives in <src>/tests/. */
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, "..");
    return dir;
}

typedef struct family_case {
    const char *config;
    int layers;
    /* weight tensors (biases not counted) of Q, K, V, QKV, O, FC1, FC2, OTHER,
     * EMB, HEAD, NORM */
    int weights[IGRAD_KIND_COUNT];
    int components; /* (layer, kind) pairs: per-block projections and NORM,
                       then (-1, EMB), (-1, HEAD) if untied, (-1, NORM) if any */
} family_case_t;

static const family_case_t families[] = {
    {"llama-2-7b", 32, {32, 32, 32, 0, 32, 64, 32, 0, 1, 1, 65}, 32 * 7 + 3},
    {"llama-100m", 12, {12, 12, 12, 0, 12, 24, 12, 0, 1, 0, 25}, 12 * 7 + 2},
    {"mistral-7b", 32, {32, 32, 32, 0, 32, 64, 32, 0, 1, 1, 65}, 32 * 7 + 3},
    {"qwen2-0.5b", 24, {24, 24, 24, 0, 24, 48, 24, 0, 1, 0, 49}, 24 * 7 + 2},
    {"gemma-2b", 18, {18, 18, 18, 0, 18, 36, 18, 0, 1, 0, 37}, 18 * 7 + 2},
    /* 8 experts x (w1, w3) x 32 layers = 512 FC1, and the 32 routers */
    {"mixtral-8x7b", 32, {32, 32, 32, 0, 32, 544, 256, 0, 1, 1, 65}, 32 * 7 + 3},
    /* tied; token and position embeddings are one EMB component */
    {"opt-125m", 12, {12, 12, 12, 0, 12, 12, 12, 0, 2, 0, 25}, 12 * 7 + 2},
    /* post-norm: no final norm; project_in/out stay OTHER */
    {"opt-350m", 24, {24, 24, 24, 0, 24, 24, 24, 2, 2, 0, 48}, 24 * 7 + 1},
    {"gpt2", 12, {0, 0, 0, 12, 12, 12, 12, 0, 2, 0, 25}, 12 * 5 + 2},
    {"pythia-160m", 12, {0, 0, 0, 12, 12, 12, 12, 0, 1, 1, 25}, 12 * 5 + 3},
    {"bloom-560m", 24, {0, 0, 0, 24, 24, 24, 24, 0, 1, 0, 50}, 24 * 5 + 2},
    {"falcon-7b", 32, {0, 0, 0, 32, 32, 32, 32, 0, 1, 0, 33}, 32 * 5 + 2},
    {"gpt-j-6b", 28, {28, 28, 28, 0, 28, 28, 28, 0, 1, 1, 29}, 28 * 7 + 3},
    {"phi-2", 32, {32, 32, 32, 0, 32, 32, 32, 0, 1, 1, 33}, 32 * 7 + 3},
};

static void test_family_kind_counts(void **state)
{
    (void)state;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        const family_case_t *fc = &families[f];
        char path[4200];
        snprintf(path, sizeof path, "%s/configs/%s.json", source_dir(), fc->config);
        igrad_layout_t *l = NULL;
        if (igrad_layout_from_hf_config(path, &l) != IGRAD_OK)
            fail_msg("%s: %s", path, igrad_last_error());
        int weights[IGRAD_KIND_COUNT] = {0};
        int max_layer = -1;
        for (size_t i = 0; i < igrad_layout_count(l); i++) {
            igrad_tensor_info_t t;
            assert_int_equal(igrad_layout_tensor(l, i, &t), IGRAD_OK);
            if (!t.is_bias) weights[t.kind]++;
            if (t.layer > max_layer) max_layer = t.layer;
            /* OTHER always has layer -1 and no component; projections both;
             * EMB and HEAD layer -1, NORM either, and a component */
            int outer = t.kind == EMB || t.kind == HEAD || t.kind == NORM;
            if (t.kind == OTHER && (t.layer != -1 || t.component != -1))
                fail_msg("%s: %s is OTHER with layer %d component %d", fc->config, t.name,
                         t.layer, t.component);
            if (outer && (t.component < 0 || (t.kind != NORM && t.layer != -1)))
                fail_msg("%s: %s is %s with layer %d component %d", fc->config, t.name,
                         igrad_kind_name(t.kind), t.layer, t.component);
            if (t.kind != OTHER && !outer && (t.layer < 0 || t.component < 0))
                fail_msg("%s: %s is %s with layer %d component %d", fc->config, t.name,
                         igrad_kind_name(t.kind), t.layer, t.component);
        }
        for (int k = 0; k < IGRAD_KIND_COUNT; k++) {
            if (weights[k] != fc->weights[k])
                fail_msg("%s: %d %s weight tensors, expected %d", fc->config, weights[k],
                         igrad_kind_name((igrad_kind_t)k), fc->weights[k]);
        }
        if (max_layer != fc->layers - 1)
            fail_msg("%s: last layer %d, expected %d", fc->config, max_layer, fc->layers - 1);
        if ((int)igrad_layout_component_count(l) != fc->components)
            fail_msg("%s: %zu components, expected %d", fc->config,
                     igrad_layout_component_count(l), fc->components);
        igrad_layout_free(l);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_component_of_names),
        cmocka_unit_test(test_kind_names),
        cmocka_unit_test(test_family_kind_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
