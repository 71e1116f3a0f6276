/*
 * fuzz_checkpoint.c — fuzz target for the trainer's checkpoint readers
 * (trainer/checkpoint.h): config.json (checkpoint_read_config), model
 * weights (checkpoint_load_params into a fixed 1-layer model) and the
 * optimizer state (checkpoint_load_optim for that model). The readers take
 * paths, so each input is written to a per-process temporary file first.
 *
 * Input: one mode byte (value % 3: 0 config.json, 1 model.safetensors,
 * 2 optimizer.safetensors), then the file's bytes. Seeds are files the
 * trainer's own writers produce for the fixed model (and a few configs).
 *
 * Invariants: no crash; a failure is FORMAT, MISMATCH, INVALID,
 * UNSUPPORTED or NOMEM with a message; the same input twice gives the same
 * status and message; a config that reads is written and read back equal;
 * loaded weights (moments) saved again and reloaded are bit-identical.
 * train_state.json's reader is static in trainer/train.c: not reachable
 * from here. The driver is tests/fuzz_main.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"

int igrad_fuzz_one(const uint8_t *data, size_t size);
const char *igrad_fuzz_name(void);
size_t igrad_fuzz_seed_count(void);
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size);

enum { MODE_CONFIG, MODE_MODEL, MODE_OPTIM, NMODES };

static char dir[256], path[320], path2[320];
static model_t *model;        /* the fixed model the weight files are for */
static optim_t *opt;
#define NSEEDS 6
static uint8_t *seeds[NSEEDS];
static size_t seed_n[NSEEDS];

static void die(const char *what)
{
    fprintf(stderr, "fuzz_checkpoint: setup failed: %s: %s\n", what, trainer_last_error());
    abort();
}

static uint8_t *slurp(const char *p, size_t *n, uint8_t mode)
{
    FILE *fp = fopen(p, "rb");
    if (!fp) die(p);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)len + 1);
    if (!buf || fread(buf + 1, 1, (size_t)len, fp) != (size_t)len) die("read");
    fclose(fp);
    buf[0] = mode;
    *n = (size_t)len + 1;
    return buf;
}

static void remove_dir(void)
{
    unlink(path);
    unlink(path2);
    rmdir(dir);
}

static void setup(void)
{
    if (model) return;
    atexit(remove_dir);
    snprintf(dir, sizeof dir, "/tmp/igrad_fuzz_checkpoint.%ld", (long)getpid());
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/in", dir);
    snprintf(path2, sizeof path2, "%s/back", dir);
    model_config_t c;
    if (model_config_preset("tiny", &c) != IGRAD_OK) die("preset");
    c.vocab_size = 16;
    c.n_layer = 1;
    c.dim = 8;
    c.n_head = 2;
    c.n_kv_head = 1;
    c.ffn_dim = 12;
    c.max_seq_len = 8;
    if (model_create(&c, &model) != IGRAD_OK) die("model");
    model_init_random(model, 7, 0.5f);
    optim_config_t oc = optim_config_default();
    if (optim_create_for_model(&oc, model, &opt) != IGRAD_OK) die("optim");
    for (int64_t i = 0; i < opt->count; i++) {
        opt->m[i] = 0.001f * (float)(i % 17);
        opt->v[i] = 0.0001f * (float)(i % 5);
    }
    opt->step = 3;
    char p[400];
    if (checkpoint_save_model(model, dir) != IGRAD_OK) die("save model");
    snprintf(p, sizeof p, "%s/%s", dir, CHECKPOINT_CONFIG_FILE);
    seeds[0] = slurp(p, &seed_n[0], MODE_CONFIG);
    snprintf(p, sizeof p, "%s/%s", dir, CHECKPOINT_MODEL_FILE);
    seeds[1] = slurp(p, &seed_n[1], MODE_MODEL);
    snprintf(p, sizeof p, "%s/%s", dir, CHECKPOINT_OPTIM_FILE);
    if (checkpoint_save_optim(opt, model, p) != IGRAD_OK) die("save optim");
    seeds[2] = slurp(p, &seed_n[2], MODE_OPTIM);
    /* other configs: tied embeddings, GQA, the defaults left out */
    model_config_t t = c;
    t.tie_embeddings = 1;
    t.n_kv_head = 2;
    t.rope_theta = 500000;
    snprintf(p, sizeof p, "%s/%s", dir, CHECKPOINT_CONFIG_FILE);
    if (checkpoint_write_config(&t, p) != IGRAD_OK) die("config");
    seeds[3] = slurp(p, &seed_n[3], MODE_CONFIG);
    static const char minimal[] =
        "\x00{\"model_type\": \"llama\", \"hidden_size\": 8, \"intermediate_size\": 12, "
        "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"vocab_size\": 16, "
        "\"max_position_embeddings\": 8}";
    static const char refused[] =
        "\x00{\"model_type\": \"llama\", \"hidden_size\": 8, \"intermediate_size\": 12, "
        "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"vocab_size\": 16, "
        "\"max_position_embeddings\": 8, \"attention_bias\": true, \"rope_scaling\": "
        "{\"type\": \"linear\", \"factor\": 2.0}, \"hidden_act\": \"gelu\"}";
    const char *lit[2] = {minimal, refused};
    size_t litn[2] = {sizeof minimal - 1, sizeof refused - 1};
    for (int k = 0; k < 2; k++) {
        seeds[4 + k] = malloc(litn[k]);
        if (!seeds[4 + k]) die("malloc");
        memcpy(seeds[4 + k], lit[k], litn[k]);
        seed_n[4 + k] = litn[k];
    }
    char files[3][400];
    snprintf(files[0], sizeof files[0], "%s/%s", dir, CHECKPOINT_CONFIG_FILE);
    snprintf(files[1], sizeof files[1], "%s/%s", dir, CHECKPOINT_MODEL_FILE);
    snprintf(files[2], sizeof files[2], "%s/%s", dir, CHECKPOINT_OPTIM_FILE);
    for (int k = 0; k < 3; k++) unlink(files[k]);
}

const char *igrad_fuzz_name(void) { return "checkpoint"; }
size_t igrad_fuzz_seed_count(void) { return NSEEDS; }
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size)
{
    setup();
    *size = seed_n[i];
    return seeds[i];
}

static int write_input(const uint8_t *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    int bad = n && fwrite(p, 1, n, fp) != n;
    return fclose(fp) != 0 || bad ? -1 : 0;
}

static int expected_failure(igrad_status_t st)
{
    return st == IGRAD_E_FORMAT || st == IGRAD_E_MISMATCH || st == IGRAD_E_INVALID ||
           st == IGRAD_E_UNSUPPORTED || st == IGRAD_E_NOMEM;
}

/* One read of the input file; the result lands in cfg / the model /
 * the optimizer. */
static igrad_status_t read_once(int mode, model_config_t *cfg)
{
    switch (mode) {
    case MODE_CONFIG: return checkpoint_read_config(path, cfg);
    case MODE_MODEL: return checkpoint_load_params(path, model);
    default: return checkpoint_load_optim(path, model, opt);
    }
}

static int check_round_trip(int mode, const model_config_t *cfg)
{
    if (mode == MODE_CONFIG) {
        model_config_t back;
        memset(&back, 0, sizeof back);
        if (checkpoint_write_config(cfg, path2) != IGRAD_OK ||
            checkpoint_read_config(path2, &back) != IGRAD_OK) {
            fprintf(stderr, "config that reads does not write and read back: %s\n",
                    trainer_last_error());
            return 1;
        }
        /* the writer prints doubles as the shortest text that reads back
         * to the same bits, so the whole config must come back exactly */
        model_config_t same = back;
        if (memcmp(&same, cfg, sizeof same) != 0) {
            const model_config_t *a = cfg, *b = &back;
            fprintf(stderr,
                    "config read back differs: V %d/%d L %d/%d C %d/%d H %d/%d KV %d/%d "
                    "F %d/%d maxT %d/%d tie %d/%d theta %.17g/%.17g eps %.17g/%.17g\n",
                    a->vocab_size, b->vocab_size, a->n_layer, b->n_layer, a->dim, b->dim,
                    a->n_head, b->n_head, a->n_kv_head, b->n_kv_head, a->ffn_dim, b->ffn_dim,
                    a->max_seq_len, b->max_seq_len, a->tie_embeddings, b->tie_embeddings,
                    a->rope_theta, b->rope_theta, a->rms_norm_eps, b->rms_norm_eps);
            return 1;
        }
        return 0;
    }
    size_t nbytes = (size_t)model->num_params * sizeof(float);
    float *a = malloc(nbytes), *b = malloc(nbytes);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    int bad = 0;
    if (mode == MODE_MODEL) {
        memcpy(a, model->params, nbytes);
        char cfgp[400];
        snprintf(cfgp, sizeof cfgp, "%s/%s", dir, CHECKPOINT_MODEL_FILE);
        bad = checkpoint_save_model(model, dir) != IGRAD_OK;
        memset(model->params, 0, nbytes);
        bad = bad || checkpoint_load_params(cfgp, model) != IGRAD_OK;
        memcpy(b, model->params, nbytes);
        unlink(cfgp);
        snprintf(cfgp, sizeof cfgp, "%s/%s", dir, CHECKPOINT_CONFIG_FILE);
        unlink(cfgp);
    } else {
        memcpy(a, opt->m, nbytes);
        int64_t step = opt->step;
        bad = checkpoint_save_optim(opt, model, path2) != IGRAD_OK;
        memset(opt->m, 0, nbytes);
        bad = bad || checkpoint_load_optim(path2, model, opt) != IGRAD_OK ||
              opt->step != step;
        memcpy(b, opt->m, nbytes);
    }
    if (bad) fprintf(stderr, "loaded %s does not save and load back: %s\n",
                     mode == MODE_MODEL ? "weights" : "optimizer state", trainer_last_error());
    else if (memcmp(a, b, nbytes) != 0) {
        fprintf(stderr, "loaded %s saved and reloaded differ\n",
                mode == MODE_MODEL ? "weights" : "optimizer moments");
        bad = 1;
    }
    free(a);
    free(b);
    return bad;
}

int igrad_fuzz_one(const uint8_t *data, size_t size)
{
    setup();
    if (size == 0) return 0;
    int mode = data[0] % NMODES;
    if (write_input(data + 1, size - 1) != 0) return 0;
    model_config_t cfg, cfg2;
    memset(&cfg, 0, sizeof cfg);
    memset(&cfg2, 0, sizeof cfg2);
    igrad_status_t sa = read_once(mode, &cfg);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sa == IGRAD_OK ? "" : trainer_last_error());
    igrad_status_t sb = read_once(mode, &cfg2);
    int bad = 0;
    if (sa != sb || (sa != IGRAD_OK && strcmp(msg, trainer_last_error()) != 0) ||
        (sa == IGRAD_OK && mode == MODE_CONFIG && memcmp(&cfg, &cfg2, sizeof cfg) != 0)) {
        fprintf(stderr, "not deterministic: %d '%s' vs %d '%s'\n", (int)sa, msg, (int)sb,
                trainer_last_error());
        bad = 1;
    } else if (sa == IGRAD_OK) {
        bad = check_round_trip(mode, &cfg);
    } else if (!expected_failure(sa) || msg[0] == '\0') {
        fprintf(stderr, "unexpected status %d: '%s'\n", (int)sa, msg);
        bad = 1;
    }
    unlink(path);
    unlink(path2);
    return bad;
}
