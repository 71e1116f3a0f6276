/*
 * test_layout.c — the parameter table and its readers: add/offsets/
 * components against a brute-force recomputation, hash sensitivity,
 * published parameter counts of every shipped HF config, config vs a real
 * safetensors file written here (sparse, so a 93 GB Mixtral file costs
 * nothing), content-sniffing load, name lists, to_json, and bad input of
 * every kind with a check that the message names the culprit.
 *
 * Name -> component rules are tested in test_component.c; random inputs in
 * tests/fuzz_safetensors.c and tests/fuzz_hf_config.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "igrad.h"

/* ---- helpers ------------------------------------------------------------ */

#define EXPECT_FAIL(expr, want, needle)                                                 \
    do {                                                                                \
        igrad_status_t got_ = (expr);                                                   \
        if (got_ != (want))                                                             \
            fail_msg("%s: status %d (%s), expected %d; message: %s", #expr, (int)got_,   \
                     igrad_status_str(got_), (int)(want), igrad_last_error());           \
        expect_msg(#expr, (needle));                                                    \
    } while (0)

static void expect_msg(const char *expr, const char *needle)
{
    if (needle && !strstr(igrad_last_error(), needle))
        fail_msg("%s: message '%s' does not mention '%s'", expr, igrad_last_error(), needle);
}

#define EXPECT_OK(expr)                                                                 \
    do {                                                                                \
        igrad_status_t got_ = (expr);                                                   \
        if (got_ != IGRAD_OK)                                                           \
            fail_msg("%s: status %d (%s): %s", #expr, (int)got_, igrad_status_str(got_), \
                     igrad_last_error());                                               \
    } while (0)

static char tmpdir[256];

static int setup_tmpdir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/igrad-test-layout-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmpdir(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *source_dir(void)
{
    static char dir[4096];
    const char *env = getenv("IGRAD_SOURCE_DIR");
    if (env && *env) return env;
    snprintf(dir, sizeof dir, "%s", __FILE__); /* <src>/tests/test_layout.c */
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, "..");
    return dir;
}

static void config_path(const char *name, char *buf, size_t size)
{
    snprintf(buf, size, "%s/configs/%s.json", source_dir(), name);
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) fail_msg("cannot create %s", path);
    if (fwrite(data, 1, n, fp) != n) fail_msg("cannot write %s", path);
    fclose(fp);
}

static void tmp_path(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", tmpdir, name);
}

/* ---- core table --------------------------------------------------------- */

static void test_add_offsets_components(void **state)
{
    (void)state;
    igrad_layout_t *l = NULL;
    EXPECT_OK(igrad_layout_create(&l));
    assert_int_equal(igrad_layout_count(l), 0);
    assert_int_equal(igrad_layout_total_count(l), 0);
    assert_int_equal(igrad_layout_component_count(l), 0);

    /* Out of layer order on purpose, so components must be re-sorted. */
    struct {
        const char *name;
        int ndim;
        int64_t shape[4];
    } rows[] = {
        {"model.embed_tokens.weight", 2, {10, 4}},
        {"model.layers.1.mlp.up_proj.weight", 2, {6, 4}},
        {"model.layers.1.self_attn.q_proj.weight", 2, {4, 4}},
        {"model.layers.0.mlp.down_proj.weight", 2, {4, 6}},
        {"model.layers.0.self_attn.q_proj.weight", 2, {4, 4}},
        {"model.layers.0.self_attn.q_proj.bias", 1, {4}},
        {"model.layers.1.mlp.gate_proj.weight", 2, {6, 4}},
        {"model.layers.0.input_layernorm.weight", 1, {4}},
        {"scale", 0, {0}},
        {"conv.weight", 4, {2, 3, 5, 7}},
    };
    size_t n = sizeof rows / sizeof rows[0];
    for (size_t i = 0; i < n; i++)
        EXPECT_OK(igrad_layout_add(l, rows[i].name, IGRAD_DTYPE_BF16, rows[i].ndim, rows[i].shape));
    assert_int_equal(igrad_layout_count(l), n);
    assert_string_equal(igrad_layout_family(l), "custom");

    int64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        igrad_tensor_info_t t;
        EXPECT_OK(igrad_layout_tensor(l, i, &t));
        assert_string_equal(t.name, rows[i].name);
        assert_int_equal(t.dtype, IGRAD_DTYPE_BF16);
        assert_int_equal(t.ndim, rows[i].ndim);
        int64_t count = 1;
        for (int d = 0; d < 4; d++) {
            int64_t want = d < rows[i].ndim ? rows[i].shape[d] : 1;
            assert_int_equal(t.shape[d], want);
            count *= want;
        }
        assert_int_equal(t.count, count);
        assert_int_equal(t.offset, offset);
        offset += count;
        int layer;
        igrad_kind_t kind = igrad_component_of(rows[i].name, &layer);
        assert_int_equal(t.kind, kind);
        assert_int_equal(t.layer, layer);
        size_t len = strlen(rows[i].name);
        assert_int_equal(t.is_bias, len >= 4 && !strcmp(rows[i].name + len - 4, "bias"));
        assert_int_equal(igrad_layout_find(l, rows[i].name), (int)i);
    }
    assert_int_equal(igrad_layout_total_count(l), offset);
    assert_int_equal(igrad_layout_find(l, "model.layers.0"), -1);
    assert_int_equal(igrad_layout_find(l, ""), -1);

    /* Brute force: for each (layer, kind) pair present, in (layer, kind)
     * order, the sum of counts and number of tensors. */
    size_t nc = igrad_layout_component_count(l);
    size_t expect_index = 0;
    for (int layer = -1; layer < 4; layer++) {
        for (int k = 0; k < IGRAD_KIND_COUNT; k++) {
            if (k == IGRAD_KIND_OTHER) continue; /* never a component */
            int64_t count = 0;
            int tensors = 0;
            for (size_t i = 0; i < n; i++) {
                igrad_tensor_info_t t;
                igrad_layout_tensor(l, i, &t);
                if (t.layer == layer && (int)t.kind == k) {
                    count += t.count;
                    tensors++;
                    /* the tensor points at this component */
                    assert_int_equal(t.component, (int)expect_index);
                }
            }
            if (!tensors) continue;
            igrad_component_info_t c;
            EXPECT_OK(igrad_layout_component(l, expect_index, &c));
            assert_int_equal(c.layer, layer);
            assert_int_equal(c.kind, k);
            assert_int_equal(c.count, count);
            assert_int_equal(c.tensors, tensors);
            expect_index++;
        }
    }
    assert_int_equal(nc, expect_index);
    assert_int_equal(nc, 6); /* (-1,EMB) (0,Q) (0,FC2) (0,NORM) (1,Q) (1,FC1) */

    igrad_tensor_info_t t;
    igrad_component_info_t c;
    EXPECT_FAIL(igrad_layout_tensor(l, n, &t), IGRAD_E_INVALID, "out of range");
    EXPECT_FAIL(igrad_layout_component(l, nc, &c), IGRAD_E_INVALID, "out of range");
    igrad_layout_free(l);
    igrad_layout_free(NULL);
}

static void test_add_errors(void **state)
{
    (void)state;
    igrad_layout_t *l = NULL;
    EXPECT_OK(igrad_layout_create(&l));
    int64_t ok[2] = {3, 4};
    EXPECT_OK(igrad_layout_add(l, "a.weight", IGRAD_DTYPE_F32, 2, ok));
    EXPECT_FAIL(igrad_layout_add(l, "a.weight", IGRAD_DTYPE_F32, 2, ok), IGRAD_E_INVALID,
                "duplicate tensor name 'a.weight'");
    int64_t five[5] = {1, 1, 1, 1, 1};
    EXPECT_FAIL(igrad_layout_add(l, "b", IGRAD_DTYPE_F32, 5, five), IGRAD_E_INVALID, "'b'");
    EXPECT_FAIL(igrad_layout_add(l, "b", IGRAD_DTYPE_F32, -1, five), IGRAD_E_INVALID, "'b'");
    int64_t zero[2] = {3, 0};
    EXPECT_FAIL(igrad_layout_add(l, "c", IGRAD_DTYPE_F32, 2, zero), IGRAD_E_INVALID,
                "must be positive");
    int64_t neg[1] = {-2};
    EXPECT_FAIL(igrad_layout_add(l, "c", IGRAD_DTYPE_F32, 1, neg), IGRAD_E_INVALID, "-2");
    int64_t huge[2] = {INT64_C(1) << 32, INT64_C(1) << 32};
    EXPECT_FAIL(igrad_layout_add(l, "d", IGRAD_DTYPE_F32, 2, huge), IGRAD_E_INVALID,
                "overflows");
    int64_t big[1] = {INT64_MAX - 5};
    EXPECT_FAIL(igrad_layout_add(l, "e", IGRAD_DTYPE_F32, 1, big), IGRAD_E_INVALID,
                "total entry count overflows");
    EXPECT_FAIL(igrad_layout_add(l, "", IGRAD_DTYPE_F32, 2, ok), IGRAD_E_INVALID, "empty");
    EXPECT_FAIL(igrad_layout_add(l, "f", IGRAD_DTYPE_COUNT, 2, ok), IGRAD_E_INVALID, "dtype");
    EXPECT_FAIL(igrad_layout_add(l, NULL, IGRAD_DTYPE_F32, 2, ok), IGRAD_E_INVALID, NULL);
    /* safetensors keeps metadata under this key: such a tensor would not
     * survive a round trip (libFuzzer found it) */
    EXPECT_FAIL(igrad_layout_add(l, "__metadata__", IGRAD_DTYPE_F32, 2, ok), IGRAD_E_INVALID,
                "'__metadata__' is reserved");
    EXPECT_OK(igrad_layout_add(l, "x.__metadata__", IGRAD_DTYPE_F32, 2, ok));
    /* Failed adds leave the table as it was. */
    assert_int_equal(igrad_layout_count(l), 2);
    assert_int_equal(igrad_layout_total_count(l), 24);
    igrad_layout_free(l);

    /* A name list naming it is refused at its line. */
    char path[1100];
    tmp_path(path, sizeof path, "meta.names");
    write_file(path, "a 2\n__metadata__ 4\n", 20);
    l = NULL;
    EXPECT_FAIL(igrad_layout_from_name_list(path, &l), IGRAD_E_FORMAT, "meta.names:2:");
    expect_msg("name list", "reserved");
    assert_null(l);
}

static void test_dtypes(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        size_t nbytes;
    } want[IGRAD_DTYPE_COUNT] = {
        {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I8", 1},
        {"I16", 2}, {"I32", 4}, {"I64", 8},  {"U8", 1},  {"U16", 2},
        {"U32", 4}, {"U64", 8}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    for (int d = 0; d < IGRAD_DTYPE_COUNT; d++) {
        assert_string_equal(igrad_dtype_name((igrad_dtype_t)d), want[d].name);
        assert_int_equal(igrad_dtype_nbytes((igrad_dtype_t)d), want[d].nbytes);
        igrad_dtype_t back;
        EXPECT_OK(igrad_dtype_from_name(want[d].name, &back));
        assert_int_equal(back, d);
    }
    igrad_dtype_t dt;
    EXPECT_FAIL(igrad_dtype_from_name("F128", &dt), IGRAD_E_INVALID, "F128");
    assert_int_equal(igrad_dtype_nbytes(IGRAD_DTYPE_COUNT), 0);
}

static igrad_layout_t *small_layout(const char *n2, igrad_dtype_t dt2, int64_t d2)
{
    igrad_layout_t *l = NULL;
    int64_t a[2] = {4, 8};
    int64_t b[1] = {d2};
    igrad_layout_create(&l);
    igrad_layout_add(l, "model.layers.0.self_attn.q_proj.weight", IGRAD_DTYPE_F32, 2, a);
    igrad_layout_add(l, n2, dt2, 1, b);
    return l;
}

static void test_hash(void **state)
{
    (void)state;
    const char *n = "model.norm.weight";
    igrad_layout_t *base = small_layout(n, IGRAD_DTYPE_F32, 8);
    igrad_layout_t *same = small_layout(n, IGRAD_DTYPE_F32, 8);
    igrad_layout_t *name = small_layout("model.norm.bias", IGRAD_DTYPE_F32, 8);
    igrad_layout_t *dtype = small_layout(n, IGRAD_DTYPE_F16, 8);
    igrad_layout_t *shape = small_layout(n, IGRAD_DTYPE_F32, 9);
    igrad_layout_t *empty = NULL;
    igrad_layout_create(&empty);
    assert_int_equal(igrad_layout_count(base), 2);
    assert_true(igrad_layout_hash(base) == igrad_layout_hash(same));
    assert_true(igrad_layout_hash(base) != igrad_layout_hash(name));
    assert_true(igrad_layout_hash(base) != igrad_layout_hash(dtype));
    assert_true(igrad_layout_hash(base) != igrad_layout_hash(shape));
    assert_true(igrad_layout_hash(base) != igrad_layout_hash(empty));
    /* [4, 8] and [32] have the same count but are different tensors. */
    igrad_layout_t *flat = NULL;
    int64_t s32[1] = {32}, s48[2] = {4, 8};
    igrad_layout_create(&flat);
    igrad_layout_add(flat, "x", IGRAD_DTYPE_F32, 1, s32);
    igrad_layout_t *mat = NULL;
    igrad_layout_create(&mat);
    igrad_layout_add(mat, "x", IGRAD_DTYPE_F32, 2, s48);
    assert_true(igrad_layout_hash(flat) != igrad_layout_hash(mat));
    igrad_layout_free(base);
    igrad_layout_free(same);
    igrad_layout_free(name);
    igrad_layout_free(dtype);
    igrad_layout_free(shape);
    igrad_layout_free(empty);
    igrad_layout_free(flat);
    igrad_layout_free(mat);
}

/* ---- HF configs --------------------------------------------------------- */

static const struct {
    const char *config;
    const char *family;
    int64_t total;   /* published parameter count */
    size_t tensors;  /* len(list(model.named_parameters())) */
    igrad_dtype_t dtype;
} published[] = {
    {"gpt2", "gpt2", 124439808, 148, IGRAD_DTYPE_F32},
    {"opt-125m", "opt", 125239296, 196, IGRAD_DTYPE_F16},
    {"opt-350m", "opt", 331196416, 388, IGRAD_DTYPE_F16},
    {"pythia-160m", "gpt_neox", 162322944, 148, IGRAD_DTYPE_F16},
    {"llama-2-7b", "llama", 6738415616, 291, IGRAD_DTYPE_F16},
    {"mistral-7b", "mistral", 7241732096, 291, IGRAD_DTYPE_BF16},
    {"mixtral-8x7b", "mixtral", 46702792704, 995, IGRAD_DTYPE_BF16},
    {"qwen2-0.5b", "qwen2", 494032768, 290, IGRAD_DTYPE_BF16},
    {"gemma-2b", "gemma", 2506172416, 164, IGRAD_DTYPE_BF16},
    {"phi-2", "phi", 2779683840, 453, IGRAD_DTYPE_F16},
    {"bloom-560m", "bloom", 559214592, 293, IGRAD_DTYPE_F32},
    {"gpt-j-6b", "gptj", 6050882784, 285, IGRAD_DTYPE_F32},
    {"falcon-7b", "falcon", 6921720704, 195, IGRAD_DTYPE_BF16},
    /* not published: 12 x (4 x 768^2 + 3 x 768 x 2048 + 2 x 768) + 768 + 32000 x 768 */
    {"llama-100m", "llama", 109529856, 110, IGRAD_DTYPE_F32},
};

static void test_published_counts(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof published / sizeof published[0]; i++) {
        char path[4200];
        config_path(published[i].config, path, sizeof path);
        igrad_layout_t *l = NULL;
        EXPECT_OK(igrad_layout_from_hf_config(path, &l));
        if (igrad_layout_total_count(l) != published[i].total)
            fail_msg("%s: %lld parameters, published %lld", published[i].config,
                     (long long)igrad_layout_total_count(l), (long long)published[i].total);
        if (igrad_layout_count(l) != published[i].tensors)
            fail_msg("%s: %zu tensors, expected %zu", published[i].config,
                     igrad_layout_count(l), published[i].tensors);
        assert_string_equal(igrad_layout_family(l), published[i].family);
        igrad_tensor_info_t t;
        EXPECT_OK(igrad_layout_tensor(l, 0, &t));
        assert_int_equal(t.dtype, published[i].dtype);
        igrad_layout_free(l);
    }
}

static igrad_layout_t *from_json_text(const char *json)
{
    igrad_layout_t *l = NULL;
    if (igrad_layout_from_hf_config_string(json, strlen(json), "test.json", &l) != IGRAD_OK)
        fail_msg("config: %s", igrad_last_error());
    return l;
}

static void expect_shape(const igrad_layout_t *l, const char *name, int64_t d0, int64_t d1)
{
    int i = igrad_layout_find(l, name);
    if (i < 0) fail_msg("tensor %s missing", name);
    igrad_tensor_info_t t;
    igrad_layout_tensor(l, (size_t)i, &t);
    int ndim = d1 ? 2 : 1;
    if (t.ndim != ndim || t.shape[0] != d0 || (d1 && t.shape[1] != d1))
        fail_msg("%s: shape [%lld, %lld] (ndim %d), expected [%lld, %lld]", name,
                 (long long)t.shape[0], (long long)t.shape[1], t.ndim, (long long)d0,
                 (long long)d1);
}

static void expect_absent(const igrad_layout_t *l, const char *name)
{
    if (igrad_layout_find(l, name) >= 0) fail_msg("tensor %s should not exist", name);
}

static void test_config_details(void **state)
{
    (void)state;
    char path[4200];
    igrad_layout_t *l = NULL;

    /* GQA widths, qwen2 biases on q/k/v only, tied head */
    config_path("qwen2-0.5b", path, sizeof path);
    EXPECT_OK(igrad_layout_from_hf_config(path, &l));
    expect_shape(l, "model.layers.0.self_attn.q_proj.weight", 896, 896);
    expect_shape(l, "model.layers.0.self_attn.k_proj.weight", 128, 896);
    expect_shape(l, "model.layers.0.self_attn.k_proj.bias", 128, 0);
    expect_absent(l, "model.layers.0.self_attn.o_proj.bias");
    expect_absent(l, "lm_head.weight");
    igrad_layout_free(l);

    /* gemma: explicit head_dim, tied by default (no key in the config) */
    config_path("gemma-2b", path, sizeof path);
    EXPECT_OK(igrad_layout_from_hf_config(path, &l));
    expect_shape(l, "model.layers.17.self_attn.q_proj.weight", 2048, 2048);
    expect_shape(l, "model.layers.17.self_attn.v_proj.weight", 256, 2048);
    expect_absent(l, "lm_head.weight");
    igrad_layout_free(l);

    /* opt-350m: projections, post-norm (no final layer norm), head width */
    config_path("opt-350m", path, sizeof path);
    EXPECT_OK(igrad_layout_from_hf_config(path, &l));
    expect_shape(l, "model.decoder.embed_tokens.weight", 50272, 512);
    expect_shape(l, "model.decoder.embed_positions.weight", 2050, 1024);
    expect_shape(l, "model.decoder.project_out.weight", 512, 1024);
    expect_shape(l, "model.decoder.project_in.weight", 1024, 512);
    expect_absent(l, "model.decoder.final_layer_norm.weight");
    expect_absent(l, "model.decoder.project_in.bias");
    /* k, v, q, out order inside the attention module */
    assert_int_equal(igrad_layout_find(l, "model.decoder.layers.0.self_attn.k_proj.weight") + 4,
                     igrad_layout_find(l, "model.decoder.layers.0.self_attn.q_proj.weight"));
    igrad_layout_free(l);

    /* gpt2: Conv1D weights are [in, out] */
    config_path("gpt2", path, sizeof path);
    EXPECT_OK(igrad_layout_from_hf_config(path, &l));
    expect_shape(l, "transformer.h.0.attn.c_attn.weight", 768, 2304);
    expect_shape(l, "transformer.h.11.mlp.c_proj.weight", 3072, 768);
    expect_absent(l, "lm_head.weight");
    igrad_layout_free(l);

    /* falcon-7b: multi-query qkv, one norm per block, no biases */
    config_path("falcon-7b", path, sizeof path);
    EXPECT_OK(igrad_layout_from_hf_config(path, &l));
    expect_shape(l, "transformer.h.0.self_attention.query_key_value.weight", 4544 + 128, 4544);
    expect_absent(l, "transformer.h.0.self_attention.query_key_value.bias");
    expect_absent(l, "transformer.h.0.post_attention_layernorm.weight");
    expect_shape(l, "transformer.h.0.input_layernorm.bias", 4544, 0);
    igrad_layout_free(l);

    /* gpt-j: lm_head has a bias; rotary has no parameters */
    config_path("gpt-j-6b", path, sizeof path);
    EXPECT_OK(igrad_layout_from_hf_config(path, &l));
    expect_shape(l, "lm_head.bias", 50400, 0);
    expect_shape(l, "transformer.h.0.mlp.fc_in.weight", 16384, 4096);
    expect_absent(l, "transformer.h.0.attn.q_proj.bias");
    igrad_layout_free(l);

    /* mixtral: router and experts */
    config_path("mixtral-8x7b", path, sizeof path);
    EXPECT_OK(igrad_layout_from_hf_config(path, &l));
    expect_shape(l, "model.layers.31.block_sparse_moe.gate.weight", 8, 4096);
    expect_shape(l, "model.layers.31.block_sparse_moe.experts.7.w2.weight", 4096, 14336);
    igrad_layout_free(l);

    /* falcon new decoder architecture (40b-like): GQA qkv, ln_attn/ln_mlp */
    l = from_json_text("{\"model_type\": \"falcon\", \"hidden_size\": 64, "
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 8, "
                       "\"num_kv_heads\": 2, \"vocab_size\": 100, \"new_decoder_architecture\": "
                       "true, \"parallel_attn\": true, \"bias\": false}");
    expect_shape(l, "transformer.h.1.self_attention.query_key_value.weight", (2 * 2 + 8) * 8, 64);
    expect_shape(l, "transformer.h.1.ln_attn.weight", 64, 0);
    expect_shape(l, "transformer.h.1.ln_mlp.bias", 64, 0);
    expect_absent(l, "transformer.h.1.input_layernorm.weight");
    igrad_layout_free(l);

    /* falcon sequential (not parallel): both norms, plain 3H qkv with bias */
    l = from_json_text("{\"model_type\": \"falcon\", \"hidden_size\": 64, "
                       "\"num_hidden_layers\": 1, \"num_attention_heads\": 8, "
                       "\"vocab_size\": 100, \"multi_query\": false, \"parallel_attn\": false, "
                       "\"bias\": true, \"tie_word_embeddings\": false}");
    expect_shape(l, "transformer.h.0.self_attention.query_key_value.bias", 192, 0);
    expect_shape(l, "transformer.h.0.post_attention_layernorm.weight", 64, 0);
    expect_shape(l, "lm_head.weight", 100, 64);
    assert_true(igrad_layout_find(l, "transformer.h.0.post_attention_layernorm.weight") <
                igrad_layout_find(l, "transformer.h.0.input_layernorm.weight"));
    igrad_layout_free(l);

    /* llama with attention and mlp biases, tie off by default, GQA */
    l = from_json_text("{\"model_type\": \"llama\", \"hidden_size\": 32, "
                       "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
                       "\"num_key_value_heads\": 2, \"intermediate_size\": 48, "
                       "\"vocab_size\": 50, \"attention_bias\": true, \"mlp_bias\": true}");
    expect_shape(l, "model.layers.0.self_attn.k_proj.weight", 16, 32);
    expect_shape(l, "model.layers.0.self_attn.o_proj.bias", 32, 0);
    expect_shape(l, "model.layers.0.mlp.down_proj.bias", 32, 0);
    expect_shape(l, "lm_head.weight", 50, 32);
    igrad_tensor_info_t t;
    igrad_layout_tensor(l, 0, &t);
    assert_int_equal(t.dtype, IGRAD_DTYPE_F32); /* no torch_dtype: F32 */
    igrad_layout_free(l);

    /* phi with qk_layernorm and GQA; opt without elementwise-affine norms */
    l = from_json_text("{\"model_type\": \"phi\", \"hidden_size\": 32, "
                       "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
                       "\"num_key_value_heads\": 1, \"intermediate_size\": 64, "
                       "\"vocab_size\": 50, \"qk_layernorm\": true, \"dtype\": \"bfloat16\"}");
    expect_shape(l, "model.layers.0.self_attn.q_layernorm.weight", 8, 0);
    expect_shape(l, "model.layers.0.self_attn.v_proj.bias", 8, 0);
    igrad_layout_tensor(l, 0, &t);
    assert_int_equal(t.dtype, IGRAD_DTYPE_BF16);
    igrad_layout_free(l);
    l = from_json_text("{\"model_type\": \"opt\", \"hidden_size\": 16, \"num_hidden_layers\": 1,"
                       "\"ffn_dim\": 32, \"vocab_size\": 40, \"max_position_embeddings\": 10,"
                       "\"layer_norm_elementwise_affine\": false, \"enable_bias\": false}");
    assert_int_equal(igrad_layout_count(l), 2 + 6);
    igrad_layout_free(l);
}

static void test_config_errors(void **state)
{
    (void)state;
    igrad_layout_t *l = (igrad_layout_t *)0x1;
    const char *j;

    j = "{\"model_type\": \"t5\", \"hidden_size\": 8}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l),
                IGRAD_E_UNSUPPORTED, "'t5'");
    assert_null(l);
    if (!strstr(igrad_last_error(), "llama") || !strstr(igrad_last_error(), "mixtral") ||
        !strstr(igrad_last_error(), "cfg.json"))
        fail_msg("message should list the supported families: %s", igrad_last_error());

    j = "{\"model_type\": \"llama\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
        "\"num_attention_heads\": 2, \"vocab_size\": 10}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "'intermediate_size'");
    j = "{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_positions\": 4, \"vocab_size\": 10}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "'n_embd'");
    j = "{\"model_type\": \"llama\", \"hidden_size\": \"8\"}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "'hidden_size' must be an integer");
    j = "{\"model_type\": \"llama\", \"hidden_size\": 8.5}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "'hidden_size'");
    j = "{\"model_type\": \"llama\", \"hidden_size\": -8}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "'hidden_size'");
    j = "{\"model_type\": \"llama\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
        "\"num_attention_heads\": 3, \"intermediate_size\": 8, \"vocab_size\": 10}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "divisible");
    j = "{\"model_type\": \"opt\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
        "\"ffn_dim\": 8, \"vocab_size\": 10, \"max_position_embeddings\": 4, "
        "\"do_layer_norm_before\": 1}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "'do_layer_norm_before' must be true or false");
    j = "{\"model_type\": \"llama\", \"torch_dtype\": \"int4\"}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "'int4'");
    j = "{\"model_type\": 7}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "'model_type'");
    j = "{\"hidden_size\": 8}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "missing required key 'model_type'");
    j = "{\"model_type\": \"llama\",";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "malformed JSON");
    j = "[1, 2]";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "not a JSON object");
    j = "{\"model_type\": \"llama\"} x";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "trailing");
    j = "{\"model_type\": \"mixtral\", \"hidden_size\": 8, \"num_hidden_layers\": 1024, "
        "\"num_attention_heads\": 2, \"intermediate_size\": 8, \"vocab_size\": 10, "
        "\"num_local_experts\": 1024}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "experts");
    j = "{\"model_type\": \"llama\", \"hidden_size\": 8, \"num_hidden_layers\": 100000}";
    EXPECT_FAIL(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l), IGRAD_E_FORMAT,
                "'num_hidden_layers'");

    /* impossible head counts, each named by its key */
    static const struct {
        const char *json;
        const char *needle;
    } heads[] = {
        {"{\"model_type\": \"llama\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
         "\"num_attention_heads\": 4, \"num_key_value_heads\": 3, \"intermediate_size\": 8, "
         "\"vocab_size\": 10}",
         "key 'num_key_value_heads' (3) must divide key 'num_attention_heads' (4)"},
        {"{\"model_type\": \"mistral\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
         "\"num_attention_heads\": 4, \"num_key_value_heads\": 8, \"intermediate_size\": 8, "
         "\"vocab_size\": 10}",
         "key 'num_key_value_heads' (8) must divide key 'num_attention_heads' (4)"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
         "\"num_attention_heads\": 3, \"intermediate_size\": 8, \"vocab_size\": 10}",
         "key 'hidden_size' (8) is not divisible by key 'num_attention_heads' (3"},
        {"{\"model_type\": \"mixtral\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
         "\"num_attention_heads\": 2, \"intermediate_size\": 8, \"vocab_size\": 10, "
         "\"num_local_experts\": 4, \"num_experts_per_tok\": 5}",
         "key 'num_experts_per_tok' (5) is more than key 'num_local_experts' (4)"},
        {"{\"model_type\": \"phi\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
         "\"num_attention_heads\": 4, \"num_key_value_heads\": 3, \"intermediate_size\": 8, "
         "\"vocab_size\": 10}",
         "key 'num_key_value_heads' (3) must divide"},
        {"{\"model_type\": \"falcon\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
         "\"num_attention_heads\": 4, \"num_kv_heads\": 3, \"new_decoder_architecture\": true, "
         "\"vocab_size\": 10}",
         "key 'num_kv_heads' (3) must divide"},
        {"{\"model_type\": \"gpt2\", \"n_embd\": 8, \"n_layer\": 1, \"n_head\": 3, "
         "\"n_positions\": 4, \"vocab_size\": 10}",
         "key 'n_embd' (8) is not divisible by key 'n_head' (3"},
        {"{\"model_type\": \"gptj\", \"n_embd\": 8, \"n_layer\": 1, \"n_head\": 0, "
         "\"vocab_size\": 10}",
         "'n_head' is 0"},
        {"{\"model_type\": \"opt\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
         "\"ffn_dim\": 8, \"vocab_size\": 10, \"max_position_embeddings\": 4, "
         "\"num_attention_heads\": 5}",
         "key 'hidden_size' (8) is not divisible by key 'num_attention_heads' (5"},
        {"{\"model_type\": \"gpt_neox\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
         "\"intermediate_size\": 8, \"vocab_size\": 10, \"num_attention_heads\": 3}",
         "key 'hidden_size' (8) is not divisible by key 'num_attention_heads' (3"},
        {"{\"model_type\": \"bloom\", \"hidden_size\": 8, \"n_layer\": 1, "
         "\"vocab_size\": 10, \"n_head\": 3}",
         "key 'hidden_size' (8) is not divisible by key 'n_head' (3"},
    };
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        l = (igrad_layout_t *)0x1;
        EXPECT_FAIL(igrad_layout_from_hf_config_string(heads[i].json, strlen(heads[i].json),
                                                       "cfg.json", &l),
                    IGRAD_E_FORMAT, heads[i].needle);
        assert_null(l);
    }
    /* ... while dividing counts, and head_dim given explicitly, build */
    j = "{\"model_type\": \"llama\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 8, "
        "\"vocab_size\": 10}";
    EXPECT_OK(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l));
    igrad_layout_free(l);
    j = "{\"model_type\": \"gemma\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
        "\"num_attention_heads\": 3, \"head_dim\": 4, \"intermediate_size\": 8, "
        "\"vocab_size\": 10}";
    EXPECT_OK(igrad_layout_from_hf_config_string(j, strlen(j), "cfg.json", &l));
    igrad_layout_free(l);

    char path[512];
    tmp_path(path, sizeof path, "missing.json");
    EXPECT_FAIL(igrad_layout_from_hf_config(path, &l), IGRAD_E_IO, "missing.json");
    tmp_path(path, sizeof path, "bad.json");
    j = "{\"model_type\": \"llama\", \"hidden_size\": 8, \"num_hidden_layers\": 2}";
    write_file(path, j, strlen(j));
    EXPECT_FAIL(igrad_layout_from_hf_config(path, &l), IGRAD_E_FORMAT, "bad.json");
    if (!strstr(igrad_last_error(), "'num_attention_heads'"))
        fail_msg("message: %s", igrad_last_error());
}

/* ---- safetensors -------------------------------------------------------- */

/* The test's own writer (independent of the library's): header JSON with
 * the tensors packed in layout order, padded with spaces to 8 bytes, then
 * a sparse data region of the right size. */
static size_t test_dtype_size(igrad_dtype_t dt)
{
    switch (dt) {
    case IGRAD_DTYPE_F32: return 4;
    case IGRAD_DTYPE_F16:
    case IGRAD_DTYPE_BF16: return 2;
    default: return 0;
    }
}

static void write_safetensors(const igrad_layout_t *l, const char *path)
{
    size_t cap = 256 + igrad_layout_count(l) * 512, len = 0;
    char *json = malloc(cap);
    assert_non_null(json);
    uint64_t at = 0;
    len += (size_t)snprintf(json + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < igrad_layout_count(l); i++) {
        igrad_tensor_info_t t;
        igrad_layout_tensor(l, i, &t);
        size_t es = test_dtype_size(t.dtype);
        assert_true(es > 0);
        uint64_t nb = (uint64_t)t.count * es;
        len += (size_t)snprintf(json + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                t.name, igrad_dtype_name(t.dtype));
        for (int d = 0; d < t.ndim; d++)
            len += (size_t)snprintf(json + len, cap - len, "%s%lld", d ? "," : "",
                                    (long long)t.shape[d]);
        len += (size_t)snprintf(json + len, cap - len, "],\"data_offsets\":[%llu,%llu]}",
                                (unsigned long long)at, (unsigned long long)(at + nb));
        at += nb;
    }
    len += (size_t)snprintf(json + len, cap - len, "}");
    assert_true(len < cap);
    while (len % 8) json[len++] = ' ';
    unsigned char n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((uint64_t)len >> (8 * i));
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(n8, 1, 8, fp), 8);
    assert_int_equal(fwrite(json, 1, len, fp), len);
    assert_int_equal(fflush(fp), 0);
    assert_int_equal(ftruncate(fileno(fp), (off_t)(8 + len + at)), 0);
    fclose(fp);
    free(json);
}

static void expect_same_table(const igrad_layout_t *a, const igrad_layout_t *b, const char *what)
{
    if (igrad_layout_count(a) != igrad_layout_count(b))
        fail_msg("%s: %zu vs %zu tensors", what, igrad_layout_count(a), igrad_layout_count(b));
    for (size_t i = 0; i < igrad_layout_count(a); i++) {
        igrad_tensor_info_t x, y;
        igrad_layout_tensor(a, i, &x);
        igrad_layout_tensor(b, i, &y);
        if (strcmp(x.name, y.name) || x.dtype != y.dtype || x.ndim != y.ndim ||
            memcmp(x.shape, y.shape, sizeof x.shape) || x.offset != y.offset ||
            x.component != y.component)
            fail_msg("%s: row %zu differs: %s vs %s", what, i, x.name, y.name);
    }
    if (igrad_layout_hash(a) != igrad_layout_hash(b))
        fail_msg("%s: hash %016llx vs %016llx", what, (unsigned long long)igrad_layout_hash(a),
                 (unsigned long long)igrad_layout_hash(b));
}

static void test_config_vs_safetensors(void **state)
{
    (void)state;
    static const char *const configs[] = {"gpt2", "opt-350m", "pythia-160m", "llama-100m",
                                          "qwen2-0.5b", "mixtral-8x7b", "phi-2", "falcon-7b"};
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        char cfg[4200], st_path[512];
        config_path(configs[c], cfg, sizeof cfg);
        snprintf(st_path, sizeof st_path, "%s/%s.safetensors", tmpdir, configs[c]);
        igrad_layout_t *from_cfg = NULL, *from_st = NULL, *loaded = NULL;
        EXPECT_OK(igrad_layout_from_hf_config(cfg, &from_cfg));
        write_safetensors(from_cfg, st_path);
        EXPECT_OK(igrad_layout_from_safetensors(st_path, &from_st));
        expect_same_table(from_cfg, from_st, configs[c]);
        assert_string_equal(igrad_layout_family(from_st), "safetensors");
        EXPECT_OK(igrad_layout_load(st_path, &loaded));
        expect_same_table(from_cfg, loaded, configs[c]);
        assert_string_equal(igrad_layout_family(loaded), "safetensors");
        igrad_layout_free(loaded);
        EXPECT_OK(igrad_layout_load(cfg, &loaded));
        assert_string_equal(igrad_layout_family(loaded), igrad_layout_family(from_cfg));
        igrad_layout_free(from_cfg);
        igrad_layout_free(from_st);
        igrad_layout_free(loaded);
        remove(st_path);
    }
}

/* Header-only buffer: 8-byte length + json; file size adds data_nbytes. */
static igrad_status_t st_parse(const char *json, uint64_t data_nbytes, igrad_layout_t **out)
{
    size_t n = strlen(json);
    unsigned char *buf = malloc(8 + n);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, json, n);
    igrad_status_t st =
        igrad_layout_from_safetensors_bytes(buf, 8 + n, 8 + n + data_nbytes, "t.safetensors", out);
    free(buf);
    return st;
}

static void test_safetensors_good(void **state)
{
    (void)state;
    igrad_layout_t *l = NULL;
    /* Header order differs from data order: the layout follows the data.
     * A zero-size tensor is skipped; __metadata__ is skipped. */
    const char *j = "{\"b\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[16,28]},"
                    "\"__metadata__\":{\"format\":\"pt\"},"
                    "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[16,16]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                    "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[28,36]}}   ";
    EXPECT_OK(st_parse(j, 36, &l));
    assert_int_equal(igrad_layout_count(l), 3);
    igrad_tensor_info_t t;
    igrad_layout_tensor(l, 0, &t);
    assert_string_equal(t.name, "a");
    igrad_layout_tensor(l, 1, &t);
    assert_string_equal(t.name, "b");
    assert_int_equal(t.dtype, IGRAD_DTYPE_F16);
    assert_int_equal(t.offset, 4);
    igrad_layout_tensor(l, 2, &t);
    assert_string_equal(t.name, "s");
    assert_int_equal(t.ndim, 0);
    assert_int_equal(t.count, 1);
    assert_int_equal(igrad_layout_find(l, "empty"), -1);
    igrad_layout_free(l);
    /* more data than the tensors use is allowed */
    EXPECT_OK(st_parse(j, 100, &l));
    igrad_layout_free(l);
}

static void test_safetensors_errors(void **state)
{
    (void)state;
    igrad_layout_t *l = NULL;
    char path[512];
    static const struct {
        const char *json;
        uint64_t data;
        const char *needle;
    } bad[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, "malformed JSON"},
        {"[1,2]", 0, "not a JSON object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16,
         "duplicate tensor name 'a'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,10]}}", 10,
         "not an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
         "\"data_offsets\":[0,8]}}", 8, "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,8]}}", 8, "too large"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
         "5 dimensions"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", 8,
         "'shape' is not an array"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8,
         "span 4 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
         "end before begin"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 8,
         "not [begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8,
         "past the data region"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16, "overlap"},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         "unknown dtype 'F33'"},
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "missing 'dtype'"},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "missing 'shape'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "missing 'data_offsets'"},
        {"{\"a\":[1]}", 0, "tensor 'a' is not an object"},
        {"{\"__metadata__\":{}}", 0, "no tensors"},
        {"{\"__metadata__\":7,\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         8, "'__metadata__' is not an object"},
        /* a tensor entry under the reserved key is not metadata */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"__metadata__\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
         16, "'__metadata__' entry 'shape' is not a string"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 8, "trailing"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        l = NULL;
        igrad_status_t st = st_parse(bad[i].json, bad[i].data, &l);
        if (st != IGRAD_E_FORMAT)
            fail_msg("case %zu: status %d, expected FORMAT (%s)", i, (int)st, bad[i].json);
        assert_null(l);
        if (!strstr(igrad_last_error(), bad[i].needle) ||
            !strstr(igrad_last_error(), "t.safetensors"))
            fail_msg("case %zu: message '%s' lacks '%s'", i, igrad_last_error(), bad[i].needle);
    }

    /* Header length beyond the file, truncated header, tiny files: via
     * real files, which is where these happen. */
    unsigned char buf[64] = {0};
    const char *j = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    size_t n = strlen(j);

    tmp_path(path, sizeof path, "long.safetensors");
    buf[0] = 200; /* announces 200 header bytes, file has fewer */
    memcpy(buf + 8, j, 40);
    write_file(path, buf, 48);
    EXPECT_FAIL(igrad_layout_from_safetensors(path, &l), IGRAD_E_FORMAT, "larger than the file");

    tmp_path(path, sizeof path, "huge.safetensors");
    memset(buf, 0xff, 8);
    write_file(path, buf, 16);
    EXPECT_FAIL(igrad_layout_from_safetensors(path, &l), IGRAD_E_FORMAT, "allowed");

    tmp_path(path, sizeof path, "short.safetensors");
    write_file(path, buf, 5);
    EXPECT_FAIL(igrad_layout_from_safetensors(path, &l), IGRAD_E_FORMAT, "too short");

    /* In memory: the caller gave fewer bytes than the header announces. */
    unsigned char *mem = malloc(8 + n);
    for (int i = 0; i < 8; i++) mem[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(mem + 8, j, n);
    EXPECT_FAIL(igrad_layout_from_safetensors_bytes(mem, 8 + n - 10, 8 + n + 4, "mem", &l),
                IGRAD_E_FORMAT, "truncated header");
    EXPECT_OK(igrad_layout_from_safetensors_bytes(mem, 8 + n, 8 + n + 4, "mem", &l));
    igrad_layout_free(l);
    /* data region missing from the file: offsets past its end */
    EXPECT_FAIL(igrad_layout_from_safetensors_bytes(mem, 8 + n, 8 + n, "mem", &l),
                IGRAD_E_FORMAT, "past the data region");
    mem[8 + 10] = '\0';
    EXPECT_FAIL(igrad_layout_from_safetensors_bytes(mem, 8 + n, 8 + n + 4, "mem", &l),
                IGRAD_E_FORMAT, "NUL");
    free(mem);

    tmp_path(path, sizeof path, "nope.safetensors");
    EXPECT_FAIL(igrad_layout_from_safetensors(path, &l), IGRAD_E_IO, "nope.safetensors");
}

/* ---- name lists, load dispatch, JSON ------------------------------------ */

static void test_name_list(void **state)
{
    (void)state;
    char path[512];
    igrad_layout_t *l = NULL;
    tmp_path(path, sizeof path, "names.txt");
    const char *good = "# a model\n"
                       "\n"
                       "model.embed_tokens.weight 100 16   # trailing comment\n"
                       "model.layers.0.self_attn.q_proj.weight [16, 16]\r\n"
                       "  model.layers.0.self_attn.q_proj.bias (16,)\n"
                       "model.layers.0.mlp.up_proj.weight\t(32,16)\n"
                       "scalar []\n"
                       "conv [2, 3, 4, 5]";
    write_file(path, good, strlen(good));
    EXPECT_OK(igrad_layout_from_name_list(path, &l));
    assert_string_equal(igrad_layout_family(l), "names");
    assert_int_equal(igrad_layout_count(l), 6);
    assert_int_equal(igrad_layout_total_count(l), 1600 + 256 + 16 + 512 + 1 + 120);
    expect_shape(l, "model.layers.0.self_attn.q_proj.bias", 16, 0);
    expect_shape(l, "model.layers.0.mlp.up_proj.weight", 32, 16);
    igrad_tensor_info_t t;
    igrad_layout_tensor(l, 1, &t);
    assert_int_equal(t.kind, IGRAD_KIND_Q);
    assert_int_equal(t.dtype, IGRAD_DTYPE_F32);
    igrad_layout_free(l);
    /* igrad_layout_load sniffs it as a name list */
    EXPECT_OK(igrad_layout_load(path, &l));
    assert_string_equal(igrad_layout_family(l), "names");
    igrad_layout_free(l);

    static const struct {
        const char *text;
        const char *needle;
    } bad[] = {
        {"a 1 2\nb 3 x\n", "names.txt:2:"},
        {"a 1 2\n\n# c\nb [3, 4\n", "names.txt:4: missing ']'"},
        {"a 1\nb (3 4)\n", "names.txt:2: expected ','"},
        {"a 1\nb\n", "names.txt:2: no shape"},
        {"a 1\na 2\n", "names.txt:2: duplicate tensor name 'a'"},
        {"a 1 2 3 4 5\n", "names.txt:1: more than 4"},
        {"a 0\n", "names.txt:1: a dimension is 0"},
        {"a -1\n", "names.txt:1:"},
        {"a [1] junk\n", "names.txt:1: unexpected text"},
        {"a 99999999999999999999\n", "names.txt:1:"},
        {"a 4294967296 4294967296\n", "names.txt:1:"},
        {"[2, 3]\n", "names.txt:1: missing tensor name"},
        {"# only comments\n\n", "no tensors"},
        {"a 1\n\x01 2\n", "names.txt:2: control character"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(path, bad[i].text, strlen(bad[i].text));
        l = NULL;
        igrad_status_t st = igrad_layout_from_name_list(path, &l);
        if (st != IGRAD_E_FORMAT || l)
            fail_msg("case %zu: status %d, expected FORMAT", i, (int)st);
        if (!strstr(igrad_last_error(), bad[i].needle))
            fail_msg("case %zu: message '%s' lacks '%s'", i, igrad_last_error(), bad[i].needle);
    }
}

static void test_load_dispatch(void **state)
{
    (void)state;
    char path[1100], dir[512], cfg[4200];
    igrad_layout_t *l = NULL;

    /* A config whose byte 8 is '{' must not be taken for safetensors. */
    const char *j = "{\"a_b\": {}, \"model_type\": \"gpt2\", \"n_embd\": 8, \"n_layer\": 1, "
                    "\"n_head\": 2, \"n_positions\": 4, \"vocab_size\": 10}";
    assert_int_equal(j[8], '{');
    tmp_path(path, sizeof path, "brace.json");
    write_file(path, j, strlen(j));
    EXPECT_OK(igrad_layout_load(path, &l));
    assert_string_equal(igrad_layout_family(l), "gpt2");
    igrad_layout_free(l);

    /* A directory: model.safetensors wins over config.json */
    tmp_path(dir, sizeof dir, "ckpt");
    assert_int_equal(mkdir(dir, 0755), 0);
    EXPECT_FAIL(igrad_layout_load(dir, &l), IGRAD_E_IO, "neither");
    config_path("opt-125m", cfg, sizeof cfg);
    igrad_layout_t *ref = NULL;
    EXPECT_OK(igrad_layout_from_hf_config(cfg, &ref));
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = NULL;
    FILE *fp = fopen(cfg, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    text = malloc((size_t)size);
    assert_int_equal(fread(text, 1, (size_t)size, fp), (size_t)size);
    fclose(fp);
    write_file(path, text, (size_t)size);
    free(text);
    EXPECT_OK(igrad_layout_load(dir, &l));
    assert_string_equal(igrad_layout_family(l), "opt");
    expect_same_table(ref, l, "dir/config.json");
    igrad_layout_free(l);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_safetensors(ref, path);
    EXPECT_OK(igrad_layout_load(dir, &l));
    assert_string_equal(igrad_layout_family(l), "safetensors");
    expect_same_table(ref, l, "dir/model.safetensors");
    igrad_layout_free(l);
    igrad_layout_free(ref);

    tmp_path(path, sizeof path, "absent");
    EXPECT_FAIL(igrad_layout_load(path, &l), IGRAD_E_IO, "absent");
}

/* The extension picks the reader first: a damaged .safetensors file gets
 * the safetensors reader's message (it was read as a name list and failed
 * on "control character 0x08"); content decides only without one. */
static void test_load_by_extension(void **state)
{
    (void)state;
    char path[1100];
    igrad_layout_t *l = NULL;
    /* length 8 (one byte short of the header below), then a header */
    static const char hdr[] = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    unsigned char buf[128];
    size_t hlen = sizeof hdr - 1;
    memcpy(buf + 8, hdr, hlen);
    memset(buf + 8 + hlen, 0, 4);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)8 >> (8 * i));
    tmp_path(path, sizeof path, "short.safetensors");
    write_file(path, buf, 8 + hlen + 4);
    EXPECT_FAIL(igrad_layout_load(path, &l), IGRAD_E_FORMAT, "malformed JSON header");
    assert_null(l);
    /* a length beyond the file, upper-case extension */
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)5000 >> (8 * i));
    tmp_path(path, sizeof path, "long.SafeTensors");
    write_file(path, buf, 8 + hlen + 4);
    EXPECT_FAIL(igrad_layout_load(path, &l), IGRAD_E_FORMAT, "larger than the file");
    /* without an extension, binary length bytes before '{' still say
     * safetensors */
    tmp_path(path, sizeof path, "weights.bin");
    write_file(path, buf, 8 + hlen + 4);
    EXPECT_FAIL(igrad_layout_load(path, &l), IGRAD_E_FORMAT, "larger than the file");
    /* the correct length loads whatever the name */
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    tmp_path(path, sizeof path, "good.bin");
    write_file(path, buf, 8 + hlen + 4);
    EXPECT_OK(igrad_layout_load(path, &l));
    assert_string_equal(igrad_layout_family(l), "safetensors");
    igrad_layout_free(l);
    l = NULL;
    /* .json is a config: a name list in it is malformed JSON, not a list */
    tmp_path(path, sizeof path, "model.json");
    write_file(path, "a 1 2\n", 6);
    EXPECT_FAIL(igrad_layout_load(path, &l), IGRAD_E_FORMAT, "malformed JSON");
    /* a name list and a config without those extensions are sniffed */
    tmp_path(path, sizeof path, "model.names");
    write_file(path, "a 1 2\n", 6);
    EXPECT_OK(igrad_layout_load(path, &l));
    assert_string_equal(igrad_layout_family(l), "names");
    igrad_layout_free(l);
    const char *j = "{\"model_type\": \"gpt2\", \"n_embd\": 8, \"n_layer\": 1, "
                    "\"n_head\": 2, \"n_positions\": 4, \"vocab_size\": 10}";
    tmp_path(path, sizeof path, "config.txt");
    write_file(path, j, strlen(j));
    EXPECT_OK(igrad_layout_load(path, &l));
    assert_string_equal(igrad_layout_family(l), "gpt2");
    igrad_layout_free(l);
}

static void test_to_json(void **state)
{
    (void)state;
    char cfg[4200];
    config_path("llama-2-7b", cfg, sizeof cfg);
    igrad_layout_t *l = NULL;
    EXPECT_OK(igrad_layout_from_hf_config(cfg, &l));
    char *text = NULL;
    EXPECT_OK(igrad_layout_to_json(l, &text));
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    /* exactly these four keys, in this order */
    static const char *const keys[] = {"family", "total_numel", "tensors", "kinds"};
    int nkeys = 0;
    for (cJSON *it = root->child; it; it = it->next, nkeys++) {
        assert_true(nkeys < 4);
        assert_string_equal(it->string, keys[nkeys]);
    }
    assert_int_equal(nkeys, 4);
    assert_string_equal(cJSON_GetObjectItem(root, "family")->valuestring, "llama");
    assert_true(cJSON_GetObjectItem(root, "total_numel")->valuedouble == 6738415616.0);
    cJSON *tensors = cJSON_GetObjectItem(root, "tensors");
    assert_int_equal(cJSON_GetArraySize(tensors), 291);
    cJSON *t1 = cJSON_GetArrayItem(tensors, 1);
    static const char *const tkeys[] = {"name", "shape", "numel", "layer", "kind"};
    int ntk = 0;
    for (cJSON *it = t1->child; it; it = it->next, ntk++) {
        assert_true(ntk < 5);
        assert_string_equal(it->string, tkeys[ntk]);
    }
    assert_int_equal(ntk, 5);
    assert_string_equal(cJSON_GetObjectItem(t1, "name")->valuestring,
                        "model.layers.0.self_attn.q_proj.weight");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(t1, "shape")), 2);
    assert_int_equal(cJSON_GetObjectItem(t1, "numel")->valueint, 4096 * 4096);
    assert_int_equal(cJSON_GetObjectItem(t1, "layer")->valueint, 0);
    assert_string_equal(cJSON_GetObjectItem(t1, "kind")->valuestring, "Q");
    cJSON *t0 = cJSON_GetArrayItem(tensors, 0);
    assert_int_equal(cJSON_GetObjectItem(t0, "layer")->valueint, -1);
    assert_string_equal(cJSON_GetObjectItem(t0, "kind")->valuestring, "EMB");
    cJSON *kinds = cJSON_GetObjectItem(root, "kinds");
    assert_int_equal(cJSON_GetArraySize(kinds), IGRAD_KIND_COUNT);
    static const int want[IGRAD_KIND_COUNT] = {32, 32, 32, 0, 32, 64, 32, 0, 1, 1, 65};
    for (int k = 0; k < IGRAD_KIND_COUNT; k++) {
        cJSON *v = cJSON_GetObjectItem(kinds, igrad_kind_name((igrad_kind_t)k));
        assert_non_null(v);
        if (v->valueint != want[k])
            fail_msg("kinds.%s = %d, expected %d", igrad_kind_name((igrad_kind_t)k), v->valueint,
                     want[k]);
    }
    cJSON_Delete(root);
    igrad_free(text);
    igrad_layout_free(l);
}

/* "\u0000" in a JSON string: cJSON returns C strings cut at the NUL, so
 * "gpt2\u0000x" read as gpt2 and a tensor "a\u0000junk" as "a". Refused
 * with the file, position and string; an escaped backslash before
 * "u0000" is an ordinary string. */
static void test_json_nul_escape(void **state)
{
    (void)state;
    igrad_layout_t *l = NULL;
    const char *tail = "\"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, \"n_positions\": 4, "
                       "\"vocab_size\": 10}";
    char json[512];
    snprintf(json, sizeof json, "{\"model_type\": \"gpt2\\u0000x\",\n %s", tail);
    EXPECT_FAIL(igrad_layout_from_hf_config_string(json, strlen(json), "c.json", &l),
                IGRAD_E_FORMAT, "c.json:1:21: string \"gpt2\\u0000...\" holds \\u0000");
    assert_null(l);
    snprintf(json, sizeof json, "{\"model_type\": \"gpt2\",\n \"n_inner\\u0000\": 3, %s", tail);
    EXPECT_FAIL(igrad_layout_from_hf_config_string(json, strlen(json), "c.json", &l),
                IGRAD_E_FORMAT, "c.json:2:10: string \"n_inner\\u0000...\"");
    /* escaped backslashes: "\\u0000" is a backslash and "u0000"; in
     * "\\\u0000" the NUL escape follows one */
    snprintf(json, sizeof json, "{\"model_type\": \"gpt2\", \"x\": \"a\\\\u0000\", %s", tail);
    EXPECT_OK(igrad_layout_from_hf_config_string(json, strlen(json), "c.json", &l));
    igrad_layout_free(l);
    l = NULL;
    snprintf(json, sizeof json, "{\"model_type\": \"gpt2\", \"x\": \"a\\\\\\u0000\", %s", tail);
    EXPECT_FAIL(igrad_layout_from_hf_config_string(json, strlen(json), "c.json", &l),
                IGRAD_E_FORMAT, "holds \\u0000");
    /* a '"' inside a string does not end it */
    snprintf(json, sizeof json, "{\"model_type\": \"gpt2\", \"x\": \"\\\"\\u0000\", %s", tail);
    EXPECT_FAIL(igrad_layout_from_hf_config_string(json, strlen(json), "c.json", &l),
                IGRAD_E_FORMAT, "holds \\u0000");
    /* other escapes of code points are fine */
    snprintf(json, sizeof json, "{\"model_type\": \"gpt2\", \"x\": \"\\u0001\\u00e9\", %s", tail);
    EXPECT_OK(igrad_layout_from_hf_config_string(json, strlen(json), "c.json", &l));
    igrad_layout_free(l);
    l = NULL;

    /* safetensors: a name and a dtype */
    static const struct {
        const char *json;
        const char *needle;
    } bad[] = {
        {"{\"model.layers.0.mlp.up_proj.weight\\u0000junk\":{\"dtype\":\"F32\",\"shape\":[2],"
         "\"data_offsets\":[0,8]}}", "string \"model.layers.0.mlp.up_proj.weight\\u0000...\" "
         "at byte 43 holds \\u0000"},
        {"{\"a\":{\"dtype\":\"F32\\u0000x\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         "string \"F32\\u0000...\" at byte 26"},
        {"{\"a\\u0000\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", "holds \\u0000"},
    };
    char path[1100];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t hlen = strlen(bad[i].json);
        unsigned char *buf = calloc(1, 8 + hlen + 16);
        assert_non_null(buf);
        for (int b = 0; b < 8; b++) buf[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
        memcpy(buf + 8, bad[i].json, hlen);
        snprintf(path, sizeof path, "%s/nul%zu.safetensors", tmpdir, i);
        write_file(path, buf, 8 + hlen + 16);
        free(buf);
        l = NULL;
        EXPECT_FAIL(igrad_layout_load(path, &l), IGRAD_E_FORMAT, bad[i].needle);
        expect_msg("safetensors", path);
        assert_null(l);
    }
}

/* ---- building at scale -------------------------------------------------- */

/* FNV-1a over the little-endian bytes of each value: a digest of what the
 * accessors return (per tensor: component, layer, kind, offset; per
 * component: layer, kind, count, tensors), to pin results across changes
 * of the table's internals. */
static uint64_t digest_i64(uint64_t h, int64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (uint64_t)(v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void layout_digests(const igrad_layout_t *l, uint64_t *tensors, uint64_t *comps)
{
    uint64_t ht = 0xcbf29ce484222325ULL, hc = ht;
    for (size_t i = 0; i < igrad_layout_count(l); i++) {
        igrad_tensor_info_t t;
        EXPECT_OK(igrad_layout_tensor(l, i, &t));
        ht = digest_i64(digest_i64(digest_i64(digest_i64(ht, t.component), t.layer), t.kind),
                        t.offset);
    }
    for (size_t i = 0; i < igrad_layout_component_count(l); i++) {
        igrad_component_info_t c;
        EXPECT_OK(igrad_layout_component(l, i, &c));
        hc = digest_i64(digest_i64(digest_i64(digest_i64(hc, c.layer), c.kind), c.count),
                        c.tensors);
    }
    *tensors = ht;
    *comps = hc;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A llama-like model of `layers` blocks (9 tensors each, after an
 * embedding), names sorted as a safetensors header lists them (layer 0,
 * 1, 10, 100, ...): most components arrive out of (layer, kind) order.
 * Returns the malloc'd name list text; *n receives the tensor count. */
static char *sorted_model_list(int layers, size_t *n)
{
    static const char *const parts[] = {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
        "mlp.down_proj",    "input_layernorm",  "post_attention_layernorm",
    };
    size_t count = 1 + (size_t)layers * 9, at = 0;
    char **names = malloc(count * sizeof *names);
    assert_non_null(names);
    names[at++] = strdup("model.embed_tokens.weight");
    for (int l = 0; l < layers; l++) {
        for (int p = 0; p < 9; p++) {
            char buf[96];
            snprintf(buf, sizeof buf, "model.layers.%d.%s.weight", l, parts[p]);
            names[at++] = strdup(buf);
        }
    }
    qsort(names, count, sizeof *names, cmp_name);
    size_t cap = count * 96, len = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    for (size_t i = 0; i < count; i++) {
        assert_non_null(names[i]);
        /* shapes vary with the position so counts are not all equal */
        len += (size_t)snprintf(text + len, cap - len, strstr(names[i], "norm") ? "%s %zu\n"
                                : "%s 4 %zu\n", names[i], 1 + i % 7);
        free(names[i]);
    }
    free(names);
    *n = count;
    return text;
}

/* Components and every tensor's component index against a recomputation
 * by sorting (layer, kind) keys, for tensors added in a shuffled order. */
typedef struct key_count {
    int layer, kind;
    int64_t count;
    int tensors;
} key_count_t;

static int cmp_key(const void *a, const void *b)
{
    const key_count_t *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return (x->kind > y->kind) - (x->kind < y->kind);
}

static void expect_components_brute_force(const igrad_layout_t *l)
{
    size_t n = igrad_layout_count(l), nk = 0;
    key_count_t *keys = calloc(n ? n : 1, sizeof *keys);
    assert_non_null(keys);
    for (size_t i = 0; i < n; i++) {
        igrad_tensor_info_t t;
        EXPECT_OK(igrad_layout_tensor(l, i, &t));
        if (t.kind == IGRAD_KIND_OTHER) continue;
        keys[nk++] = (key_count_t){t.layer, (int)t.kind, t.count, 1};
    }
    qsort(keys, nk, sizeof *keys, cmp_key);
    size_t nu = 0;
    for (size_t i = 0; i < nk; i++) {
        if (nu && cmp_key(&keys[nu - 1], &keys[i]) == 0) {
            keys[nu - 1].count += keys[i].count;
            keys[nu - 1].tensors++;
        } else {
            keys[nu++] = keys[i];
        }
    }
    assert_int_equal(igrad_layout_component_count(l), nu);
    for (size_t c = 0; c < nu; c++) {
        igrad_component_info_t ci;
        EXPECT_OK(igrad_layout_component(l, c, &ci));
        if (ci.layer != keys[c].layer || (int)ci.kind != keys[c].kind ||
            ci.count != keys[c].count || ci.tensors != keys[c].tensors)
            fail_msg("component %zu is (%d, %s, %lld, %d), expected (%d, %s, %lld, %d)", c,
                     ci.layer, igrad_kind_name(ci.kind), (long long)ci.count, ci.tensors,
                     keys[c].layer, igrad_kind_name((igrad_kind_t)keys[c].kind),
                     (long long)keys[c].count, keys[c].tensors);
    }
    for (size_t i = 0; i < n; i++) {
        igrad_tensor_info_t t;
        EXPECT_OK(igrad_layout_tensor(l, i, &t));
        if (t.kind == IGRAD_KIND_OTHER) {
            assert_int_equal(t.component, -1);
            continue;
        }
        key_count_t k = {t.layer, (int)t.kind, 0, 0};
        key_count_t *at = bsearch(&k, keys, nu, sizeof *keys, cmp_key);
        assert_non_null(at);
        if (t.component != (int)(at - keys))
            fail_msg("%s: component %d, expected %d", t.name, t.component, (int)(at - keys));
    }
    free(keys);
}

static void test_components_any_order(void **state)
{
    (void)state;
    char path[1100];
    size_t n = 0;
    char *text = sorted_model_list(3000, &n);
    tmp_path(path, sizeof path, "sorted.names");
    write_file(path, text, strlen(text));
    free(text);
    igrad_layout_t *l = NULL;
    EXPECT_OK(igrad_layout_from_name_list(path, &l));
    assert_int_equal(igrad_layout_count(l), n);
    expect_components_brute_force(l);
    /* Pinned from the sorted-array implementation this replaced: same
     * components, same order, same hash (digests regenerated when norms and
     * the embedding became components; the hash is unchanged). */
    uint64_t ht, hc;
    layout_digests(l, &ht, &hc);
    if (igrad_layout_hash(l) != 0x3b0b9e7746cae7cbULL || ht != 0xf3339138c953ccd5ULL ||
        hc != 0xe1671c3341a76e9aULL)
        fail_msg("sorted list: hash %016llx tensors %016llx comps %016llx changed",
                 (unsigned long long)igrad_layout_hash(l), (unsigned long long)ht,
                 (unsigned long long)hc);

    /* The same tensors added in a shuffled order (a fixed LCG). */
    size_t *order = malloc(n * sizeof *order);
    assert_non_null(order);
    for (size_t i = 0; i < n; i++) order[i] = i;
    uint64_t r = 12345;
    for (size_t i = n - 1; i > 0; i--) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t j = (size_t)((r >> 33) % (i + 1));
        size_t tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    igrad_layout_t *shuffled = NULL;
    EXPECT_OK(igrad_layout_create(&shuffled));
    for (size_t i = 0; i < n; i++) {
        igrad_tensor_info_t t;
        EXPECT_OK(igrad_layout_tensor(l, order[i], &t));
        EXPECT_OK(igrad_layout_add(shuffled, t.name, t.dtype, t.ndim, t.shape));
    }
    expect_components_brute_force(shuffled);
    size_t nc = igrad_layout_component_count(l);
    assert_int_equal(igrad_layout_component_count(shuffled), nc);
    for (size_t c = 0; c < nc; c++) {
        igrad_component_info_t a, b;
        EXPECT_OK(igrad_layout_component(l, c, &a));
        EXPECT_OK(igrad_layout_component(shuffled, c, &b));
        assert_int_equal(a.layer, b.layer);
        assert_int_equal(a.kind, b.kind);
        assert_int_equal(a.count, b.count);
        assert_int_equal(a.tensors, b.tensors);
    }
    free(order);
    igrad_layout_free(shuffled);
    igrad_layout_free(l);
}

/* Every shipped config's table, pinned from the implementation before the
 * component tree (layout hash, per-tensor and per-component digests).
 * The digests were regenerated when EMB/HEAD/NORM became components (the
 * layout hashes did not change: they cover names, dtypes and shapes); the
 * brute force below checks the new components independently. */
static void test_shipped_configs_pinned(void **state)
{
    (void)state;
    static const struct {
        const char *config;
        uint64_t hash, tensors, comps;
    } pinned[] = {
        {"bloom-560m", 0x4b3fe74e3af4b6ecULL, 0xb6722d06fb4d8450ULL, 0xb60813616faf47ffULL},
        {"falcon-7b", 0x3526029175210343ULL, 0x1ccc9895c163efb1ULL, 0x764678fccb4c56a6ULL},
        {"gemma-2b", 0x6780bc9151f69b4eULL, 0xf294d209144681a6ULL, 0x1532218a1990622fULL},
        {"gpt-j-6b", 0xec1ae0fdea325995ULL, 0xf42416d6c8791ea5ULL, 0x7625111295741273ULL},
        {"gpt2", 0x259356be40fe6735ULL, 0xe8163c2b2002c278ULL, 0x5f309d1c8f61377eULL},
        {"llama-100m", 0xc9ebe59dc7199b41ULL, 0x8557e6f60888e8ffULL, 0xbb959e2ea554db92ULL},
        {"llama-2-7b", 0x204a252657b7d59dULL, 0x75e84f986953d2d9ULL, 0x36911b89c8e61627ULL},
        {"mistral-7b", 0x0234237962046962ULL, 0xe4231607b4222868ULL, 0x796697925159bca7ULL},
        /* digests regenerated when the routers became FC1 (the hash is the same) */
        {"mixtral-8x7b", 0xbdb0057d3a16ebfcULL, 0x7d30229a58f339fdULL, 0x47ec5f552bb61da7ULL},
        {"opt-125m", 0x4fb755b0eb80ae70ULL, 0xf46cb47076965e0cULL, 0xc1332c5800bbb6ccULL},
        {"opt-350m", 0x8a103e16e320b560ULL, 0x11cacf6c00b88695ULL, 0x4266786a69e607d0ULL},
        {"phi-2", 0xd8c55fa17504fea8ULL, 0xf35859e38f52907dULL, 0x1d5cd7b1bb110fc3ULL},
        {"pythia-160m", 0x68165434a8d9790fULL, 0x2ff0ef448689181bULL, 0xc5a01ad776639f06ULL},
        {"qwen2-0.5b", 0xc13ac18bd746b2d5ULL, 0xd587bfdb6dc04388ULL, 0xb282df973d2699f7ULL},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) {
        char path[4200];
        config_path(pinned[i].config, path, sizeof path);
        igrad_layout_t *l = NULL;
        EXPECT_OK(igrad_layout_from_hf_config(path, &l));
        uint64_t ht, hc;
        layout_digests(l, &ht, &hc);
        if (igrad_layout_hash(l) != pinned[i].hash || ht != pinned[i].tensors ||
            hc != pinned[i].comps) {
            print_error("{\"%s\", 0x%016llxULL, 0x%016llxULL, 0x%016llxULL},\n",
                        pinned[i].config, (unsigned long long)igrad_layout_hash(l),
                        (unsigned long long)ht, (unsigned long long)hc);
            bad = 1;
        }
        expect_components_brute_force(l);
        igrad_layout_free(l);
    }
    if (bad) fail_msg("shipped configs: tables differ from the pinned values (printed above)");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds to read a model of `layers` blocks (in header order) as a name
 * list and as a safetensors header; both tables are checked equal. */
static void time_reads(int layers, double *list_s, double *st_s, size_t *n)
{
    char path[1100], st_path[1100];
    char *text = sorted_model_list(layers, n);
    tmp_path(path, sizeof path, "large.names");
    write_file(path, text, strlen(text));
    free(text);
    igrad_layout_t *l = NULL, *st = NULL;
    double t0 = now_s();
    EXPECT_OK(igrad_layout_from_name_list(path, &l));
    double t1 = now_s();
    assert_int_equal(igrad_layout_count(l), *n);
    tmp_path(st_path, sizeof st_path, "large.safetensors");
    write_safetensors(l, st_path);
    double t2 = now_s();
    EXPECT_OK(igrad_layout_from_safetensors(st_path, &st));
    double t3 = now_s();
    expect_same_table(l, st, "large.safetensors");
    igrad_layout_free(st);
    igrad_layout_free(l);
    unlink(path);
    unlink(st_path);
    *list_s = t1 - t0;
    *st_s = t3 - t2;
}

/* 300k tensors in header order, as a name list and a safetensors header.
 * Building the table was quadratic: 10 s for 100k, about 90 s here, 100
 * times the 30k-tensor time. It now takes about a second (10 to 15 s in
 * a -O0 sanitizer build), about 10 times the 30k time. Failing needs
 * both a slow read (over 30 s) and a superlinear one (over 40 times the
 * small read), so neither a slow machine nor a loaded one trips it. */
static void test_large_layout_fast(void **state)
{
    (void)state;
    size_t n_small, n;
    double list_small, st_small, list_s, st_s;
    time_reads(3333, &list_small, &st_small, &n_small);
    time_reads(33333, &list_s, &st_s, &n);
    print_message("      %zu tensors: name list %.2f s, safetensors header %.2f s "
                  "(%zu tensors: %.3f s, %.3f s)\n", n, list_s, st_s, n_small, list_small,
                  st_small);
    int list_slow = list_s > 30.0 && list_s > 40.0 * list_small;
    int st_slow = st_s > 30.0 && st_s > 40.0 * st_small;
    if (list_slow || st_slow)
        fail_msg("%zu tensors: name list %.1f s, safetensors %.1f s; %zu tensors: %.2f s, "
                 "%.2f s (limit: 30 s and 40 times the small read)", n, list_s, st_s,
                 n_small, list_small, st_small);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_offsets_components),
        cmocka_unit_test(test_add_errors),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_hash),
        cmocka_unit_test(test_published_counts),
        cmocka_unit_test(test_config_details),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_config_vs_safetensors),
        cmocka_unit_test(test_safetensors_good),
        cmocka_unit_test(test_safetensors_errors),
        cmocka_unit_test(test_name_list),
        cmocka_unit_test(test_load_dispatch),
        cmocka_unit_test(test_load_by_extension),
        cmocka_unit_test(test_json_nul_escape),
        cmocka_unit_test(test_to_json),
        cmocka_unit_test(test_components_any_order),
        cmocka_unit_test(test_shipped_configs_pinned),
        cmocka_unit_test(test_large_layout_fast),
    };
    return cmocka_run_group_tests(tests, setup_tmpdir, teardown_tmpdir);
}
