/*
 * fuzz_checkpoint.c — fuzz target for the trainer's checkpoint readers
 * (trainer/checkpoint.h, trainer/train_state.h): config.json
 * (checkpoint_read_config), model weights (checkpoint_load_params into a
 * fixed 1-layer model), the optimizer state (checkpoint_load_optim for
 * that model) and train_state.json (train_state_read / _parse). The
 * readers take paths, so each input is written to a per-process temporary
 * file first.
 *
 * Input: one mode byte (value % 4: 0 config.json, 1 model.safetensors,
 * 2 optimizer.safetensors, 3 train_state.json; bytes 0-2 meant the same
 * under the earlier % 3, so the committed corpus keeps its meaning), then
 * the file's bytes. Seeds are files the trainer's own writers produce for
 * the fixed model (and a few configs and train states).
 *
 * Invariants: no crash; a failure is FORMAT, MISMATCH, INVALID,
 * UNSUPPORTED or NOMEM with a message; the same input twice gives the same
 * status and message; a config that reads is written and read back equal;
 * loaded weights (moments) saved again and reloaded are bit-identical.
 * train_state.json: reading the file and parsing the bytes agree (status,
 * message, every field); a failure is FORMAT or NOMEM and names the file;
 * an accepted state has every field in its documented range, held no
 * \u0000 escape or NUL byte in the parsed text (either cuts a string), and
 * printed by the trainer's writer parses back to the same fields and
 * prints to the same text. The driver is tests/fuzz_main.c.
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

#include <cjson/cJSON.h>

#include "checkpoint.h"
#include "train_state.h"

int igrad_fuzz_one(const uint8_t *data, size_t size);
const char *igrad_fuzz_name(void);
size_t igrad_fuzz_seed_count(void);
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size);
int igrad_fuzz_fixed_defect(const char *what);
int igrad_fuzz_has_u0000(const uint8_t *data, size_t size);

enum { MODE_CONFIG, MODE_MODEL, MODE_OPTIM, MODE_STATE, NMODES };

static char dir[256], path[320], path2[320];
static model_t *model;        /* the fixed model the weight files are for */
static optim_t *opt;
#define NSEEDS 8
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
    /* train states: version 1 (no files, informational fields left out)
     * and a seed above 2^53, written as a string */
    static const char state_v1[] =
        "\x03{\"format\": \"igrad-train-state\", \"version\": 1, \"step\": 3, \"ranks\": 1, "
        "\"data\": \"corpus\", \"batch\": 4, \"seq_len\": 32, \"seed\": 1337, "
        "\"method\": \"dense\", \"param_hash\": \"0050659f45dbc5a5\"}";
    static const char state_v2[] =
        "\x03{\"format\": \"igrad-train-state\", \"version\": 2, \"step\": 9007199254740992, "
        "\"sequences_consumed\": 40, \"ranks\": 2, \"data\": \"fortunes:\\u00e9\", "
        "\"batch\": 4, \"seq_len\": 32, \"seed\": \"18446744073709551615\", "
        "\"method\": \"adtopk_sync\", \"steps\": 20, \"param_hash\": \"0050659F45DBC5A5\", "
        "\"optimizer_step\": 10, \"engine_step\": -1, \"files\": {"
        "\"engine.rank0.bin\": {\"nbytes\": 272, \"fnv1a64\": \"4e22e7050a345c58\"}, "
        "\"engine.rank0.bin\": {\"nbytes\": 0, \"fnv1a64\": \"ffffffffffffffff\"}}}";
    const char *lit[4] = {minimal, refused, state_v1, state_v2};
    size_t litn[4] = {sizeof minimal - 1, sizeof refused - 1, sizeof state_v1 - 1,
                      sizeof state_v2 - 1};
    for (int k = 0; k < 4; k++) {
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

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "invariant broken: " __VA_ARGS__);             \
            fprintf(stderr, " [%s:%d]\n", __FILE__, __LINE__);             \
            return 1;                                                      \
        }                                                                  \
    } while (0)

#define EXACT_MAX (INT64_C(1) << 53)

/* The first field in which two states differ, or NULL. */
static const char *state_diff(const train_state_t *a, const train_state_t *b)
{
#define SAME(f) \
    if (a->f != b->f) return #f
    SAME(version);
    SAME(step);
    SAME(ranks);
    SAME(batch);
    SAME(seq_len);
    SAME(seed);
    SAME(param_hash);
    SAME(has_sequences_consumed);
    SAME(sequences_consumed);
    SAME(has_steps);
    SAME(steps);
    SAME(has_optimizer_step);
    SAME(optimizer_step);
    SAME(has_engine_step);
    SAME(engine_step);
    SAME(nfiles);
#undef SAME
    if (!a->data || !b->data || strcmp(a->data, b->data) != 0) return "data";
    if (!a->method || !b->method || strcmp(a->method, b->method) != 0) return "method";
    for (int i = 0; i < a->nfiles; i++)
        if (strcmp(a->files[i].name, b->files[i].name) != 0 ||
            a->files[i].nbytes != b->files[i].nbytes || a->files[i].hash != b->files[i].hash)
            return "files";
    return NULL;
}

/* Every field of an accepted state within its range (train_state.h). */
static int check_state_ranges(const train_state_t *s)
{
    CHECK(s->version == 1 || s->version == 2, "version %d", s->version);
    CHECK(s->step >= 0 && s->step <= EXACT_MAX, "step %lld", (long long)s->step);
    CHECK(s->ranks >= 1 && s->batch >= 1 && s->seq_len >= 1, "ranks %d batch %d seq_len %d",
          s->ranks, s->batch, s->seq_len);
    CHECK(s->data && s->method, "data or method is NULL");
    CHECK(s->nfiles >= 0 && (s->nfiles == 0 || s->files), "nfiles %d, files %p", s->nfiles,
          (void *)s->files);
    CHECK(s->version >= 2 || s->nfiles == 0, "version 1 with %d files", s->nfiles);
    for (int i = 0; i < s->nfiles; i++) {
        const train_state_file_t *f = &s->files[i];
        CHECK(memchr(f->name, 0, sizeof f->name) != NULL, "file %d: name not terminated", i);
        CHECK(f->nbytes <= (uint64_t)EXACT_MAX, "files.%s.nbytes %llu", f->name,
              (unsigned long long)f->nbytes);
    }
    const struct {
        const char *name;
        int has;
        int64_t v, lo;
    } info[] = {{"sequences_consumed", s->has_sequences_consumed, s->sequences_consumed, 0},
                {"steps", s->has_steps, s->steps, 0},
                {"optimizer_step", s->has_optimizer_step, s->optimizer_step, 0},
                {"engine_step", s->has_engine_step, s->engine_step, -1}};
    for (size_t i = 0; i < sizeof info / sizeof info[0]; i++)
        CHECK(info[i].has == 1 ? info[i].v >= info[i].lo && info[i].v <= EXACT_MAX
                          : info[i].has == 0 && info[i].v == 0,
              "%s: has %d, value %lld", info[i].name, info[i].has, (long long)info[i].v);
    return 0;
}

/* Whether the JSON value cJSON parses from p holds a \u0000 escape (one
 * whose backslash is not itself escaped) or a NUL byte. */
static int parsed_text_has_nul(const uint8_t *p, size_t n)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)p, n, &end, 0);
    if (!root) return 0;
    cJSON_Delete(root);
    size_t m = (size_t)(end - (const char *)p);
    if (memchr(p, 0, m)) return 1;
    for (size_t i = 0; i + 6 <= m; i++) {
        if (!igrad_fuzz_has_u0000(p + i, 6)) continue;
        size_t bs = 0;
        while (bs < i && p[i - bs - 1] == '\\') bs++;
        if (bs % 2 == 0) return 1;
    }
    return 0;
}

/* Mode 3: train_state.json. */
static int fuzz_state(const uint8_t *p, size_t n)
{
    if (write_input(p, n) != 0) return 0;
    train_state_t a, b, c;
    igrad_status_t sa = train_state_read(path, &a);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sa == IGRAD_OK ? "" : trainer_last_error());
    igrad_status_t sb = train_state_parse(path, (const char *)p, n, &b);
    const char *diff = sa == IGRAD_OK && sb == IGRAD_OK ? state_diff(&a, &b) : NULL;
    int bad = 0;
    char *text = NULL, *again = NULL;
    memset(&c, 0, sizeof c);
    if (sa != sb || (sa != IGRAD_OK && strcmp(msg, trainer_last_error()) != 0)) {
        fprintf(stderr, "invariant broken: read and parse differ: %d '%s' vs %d '%s'\n",
                (int)sa, msg, (int)sb, trainer_last_error());
        bad = 1;
    } else if (diff) {
        fprintf(stderr, "invariant broken: read and parse give different \"%s\"\n", diff);
        bad = 1;
    } else if (sa != IGRAD_OK) {
        if ((sa != IGRAD_E_FORMAT && sa != IGRAD_E_NOMEM) || !strstr(msg, path)) {
            fprintf(stderr, "invariant broken: unexpected status %d or no file name: '%s'\n",
                    (int)sa, msg);
            bad = 1;
        }
    } else if (check_state_ranges(&a) != 0) {
        bad = 1;
    } else if (parsed_text_has_nul(p, n)) {
        bad = igrad_fuzz_fixed_defect("a train_state.json holding \\u0000 or a NUL byte "
                                      "accepted (cJSON cuts a string there)");
    } else if ((text = train_state_print(&a)) != NULL) { /* NULL: out of memory */
        igrad_status_t sc = train_state_parse(path2, text, strlen(text), &c);
        if (sc != IGRAD_OK) {
            fprintf(stderr, "invariant broken: printed state does not parse: %s\n",
                    trainer_last_error());
            bad = 1;
        } else if ((diff = state_diff(&a, &c)) != NULL) {
            fprintf(stderr, "invariant broken: printed and parsed back, \"%s\" differs\n", diff);
            bad = 1;
        } else if ((again = train_state_print(&c)) != NULL && strcmp(text, again) != 0) {
            fprintf(stderr, "invariant broken: printed twice, the texts differ:\n%s\n%s\n", text,
                    again);
            bad = 1;
        }
    }
    free(text);
    free(again);
    train_state_free(&a);
    train_state_free(&b);
    train_state_free(&c);
    unlink(path);
    return bad;
}

int igrad_fuzz_one(const uint8_t *data, size_t size)
{
    setup();
    if (size == 0) return 0;
    int mode = data[0] % NMODES;
    if (mode == MODE_STATE) return fuzz_state(data + 1, size - 1);
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
