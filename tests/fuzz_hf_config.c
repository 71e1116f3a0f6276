/*
 * fuzz_hf_config.c — fuzz target for igrad_layout_from_hf_config_string():
 * small configs of every supported family (and the variants that change
 * the table: GQA, biases, tied heads, OPT projections, Falcon
 * architectures, Phi qk norms) mutated by tests/fuzz_main.c. Each input is
 * parsed twice (same status, message, hash); a layout that parses must
 * pass igrad_fuzz_check_layout(). Failures other than FORMAT/UNSUPPORTED
 * (or NOMEM) are bugs: configs never produce INVALID.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "model/layout_internal.h"

int igrad_fuzz_one(const uint8_t *data, size_t size);
const char *igrad_fuzz_name(void);
size_t igrad_fuzz_seed_count(void);
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size);
int igrad_fuzz_check_layout(const igrad_layout_t *layout);

static const char *const seeds[] = {
    "{\"model_type\": \"llama\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 24, "
    "\"vocab_size\": 32, \"tie_word_embeddings\": false, \"torch_dtype\": \"float16\"}",
    "{\"model_type\": \"llama\", \"hidden_size\": 16, \"num_hidden_layers\": 1, "
    "\"num_attention_heads\": 2, \"intermediate_size\": 8, \"vocab_size\": 32, "
    "\"attention_bias\": true, \"mlp_bias\": true, \"head_dim\": 4}",
    "{\"model_type\": \"mistral\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"intermediate_size\": 24, "
    "\"vocab_size\": 32, \"sliding_window\": 4096, \"torch_dtype\": \"bfloat16\"}",
    "{\"model_type\": \"qwen2\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 24, "
    "\"vocab_size\": 32, \"tie_word_embeddings\": true}",
    "{\"model_type\": \"gemma\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32, "
    "\"intermediate_size\": 64, \"vocab_size\": 32}",
    "{\"model_type\": \"mixtral\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 24, "
    "\"vocab_size\": 32, \"num_local_experts\": 3, \"num_experts_per_tok\": 2}",
    "{\"model_type\": \"opt\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
    "\"ffn_dim\": 32, \"vocab_size\": 40, \"max_position_embeddings\": 12, "
    "\"do_layer_norm_before\": true, \"word_embed_proj_dim\": 16, \"torch_dtype\": \"float16\"}",
    "{\"model_type\": \"opt\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
    "\"ffn_dim\": 32, \"vocab_size\": 40, \"max_position_embeddings\": 12, "
    "\"do_layer_norm_before\": false, \"word_embed_proj_dim\": 8, \"enable_bias\": true}",
    "{\"model_type\": \"gpt2\", \"n_embd\": 16, \"n_layer\": 2, \"n_head\": 4, "
    "\"n_positions\": 8, \"n_inner\": null, \"vocab_size\": 50}",
    "{\"model_type\": \"gpt_neox\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"intermediate_size\": 64, \"vocab_size\": 50, "
    "\"rotary_pct\": 0.25, \"tie_word_embeddings\": false}",
    "{\"model_type\": \"bloom\", \"n_embed\": 16, \"n_layer\": 2, \"num_attention_heads\": 4, "
    "\"vocab_size\": 50}",
    "{\"model_type\": \"falcon\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"vocab_size\": 50, \"multi_query\": true, "
    "\"parallel_attn\": true, \"bias\": false, \"torch_dtype\": \"bfloat16\"}",
    "{\"model_type\": \"falcon\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_kv_heads\": 2, \"vocab_size\": 50, "
    "\"new_decoder_architecture\": true, \"parallel_attn\": true, \"ffn_hidden_size\": 40}",
    "{\"model_type\": \"falcon\", \"hidden_size\": 16, \"num_hidden_layers\": 1, "
    "\"num_attention_heads\": 4, \"vocab_size\": 50, \"parallel_attn\": false, \"bias\": true,"
    " \"multi_query\": false, \"tie_word_embeddings\": false}",
    "{\"model_type\": \"gptj\", \"n_embd\": 16, \"n_layer\": 2, \"n_head\": 4, "
    "\"n_inner\": null, \"rotary_dim\": 4, \"vocab_size\": 50}",
    "{\"model_type\": \"phi\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"intermediate_size\": 64, "
    "\"vocab_size\": 50, \"qk_layernorm\": true, \"torch_dtype\": \"float32\"}",
};

const char *igrad_fuzz_name(void) { return "hf_config"; }

size_t igrad_fuzz_seed_count(void) { return sizeof seeds / sizeof seeds[0]; }

const uint8_t *igrad_fuzz_seed(size_t i, size_t *size)
{
    *size = strlen(seeds[i]);
    return (const uint8_t *)seeds[i];
}

int igrad_fuzz_one(const uint8_t *data, size_t size)
{
    igrad_layout_t *a = NULL, *b = NULL;
    char msg[1024];
    const char *json = (const char *)data;
    igrad_status_t sa = igrad_layout_from_hf_config_string(json, size, "fuzz.json", &a);
    snprintf(msg, sizeof msg, "%s", sa == IGRAD_OK ? "" : igrad_last_error());
    igrad_status_t sb = igrad_layout_from_hf_config_string(json, size, "fuzz.json", &b);
    int bad = 0;
    if (sa != sb || (sa != IGRAD_OK && strcmp(msg, igrad_last_error()) != 0)) {
        fprintf(stderr, "not deterministic: %d '%s' vs %d '%s'\n", (int)sa, msg, (int)sb,
                igrad_last_error());
        bad = 1;
    } else if (sa == IGRAD_OK) {
        if (igrad_layout_hash(a) != igrad_layout_hash(b)) {
            fprintf(stderr, "not deterministic: hashes differ\n");
            bad = 1;
        } else {
            bad = igrad_fuzz_check_layout(a);
        }
    } else if (a || b) {
        fprintf(stderr, "failed parse left a layout behind\n");
        bad = 1;
    } else if (sa != IGRAD_E_FORMAT && sa != IGRAD_E_UNSUPPORTED && sa != IGRAD_E_NOMEM) {
        fprintf(stderr, "unexpected status %d: %s\n", (int)sa, msg);
        bad = 1;
    }
    igrad_layout_free(a);
    igrad_layout_free(b);
    return bad;
}
