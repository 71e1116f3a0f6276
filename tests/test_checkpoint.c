/*
 * test_checkpoint.c — the trainer's checkpoint files: model save -> load is
 * bit-identical (tied and untied), the optimizer state round-trips, the
 * written config.json and model.safetensors give libigrad the same layout
 * (names, shapes, hash) as the model itself, every kind of bad input fails
 * with a message naming the file and the tensor or key, and a save that
 * fails part-way (file size limit) leaves nothing under the final name and
 * the previous checkpoint intact.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "model.h"
#include "optim.h"

static char tmp_root[64];

static void remove_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char child[512];
            snprintf(child, sizeof child, "%s/%s", path, e->d_name);
            remove_tree(child);
        }
        if (d) closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmp_root, sizeof tmp_root, "/tmp/igrad-test-checkpoint-XXXXXX");
    return mkdtemp(tmp_root) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove_tree(tmp_root);
    return 0;
}

static const char *tmp_path(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", tmp_root, name);
    return buf;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Entries of tmp_root whose name starts with `prefix`. */
static int count_prefixed(const char *prefix)
{
    DIR *d = opendir(tmp_root);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) != NULL) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d) closedir(d);
    return n;
}

static model_t *make_model(int tie, int kv_heads, uint64_t seed)
{
    model_config_t cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), IGRAD_OK);
    cfg.tie_embeddings = tie;
    if (kv_heads) cfg.n_kv_head = kv_heads;
    model_t *m = NULL;
    if (model_create(&cfg, &m) != IGRAD_OK) fail_msg("model_create: %s", trainer_last_error());
    model_init_random(m, seed, 0.3f);
    for (int64_t i = 0; i < m->num_params; i += 97) m->params[i] += 0.125f; /* norms != 1 */
    return m;
}

static void assert_same_params(const model_t *a, const model_t *b)
{
    assert_int_equal(a->num_params, b->num_params);
    assert_int_equal(a->n_tensors, b->n_tensors);
    for (int64_t i = 0; i < a->num_params; i++)
        if (memcmp(&a->params[i], &b->params[i], sizeof(float)) != 0)
            fail_msg("param %lld: %.9g vs %.9g", (long long)i, a->params[i], b->params[i]);
}

/* Expects `st` to be a failure whose message contains every needle. */
static void assert_fails_with(igrad_status_t st, igrad_status_t want, const char *n1,
                              const char *n2)
{
    const char *msg = trainer_last_error();
    if (st != want)
        fail_msg("status %d (%s), expected %d; message: %s", st, igrad_status_str(st), want, msg);
    if ((n1 && !strstr(msg, n1)) || (n2 && !strstr(msg, n2)))
        fail_msg("message \"%s\" lacks \"%s\" / \"%s\"", msg, n1 ? n1 : "", n2 ? n2 : "");
}

static void test_model_round_trip(void **state)
{
    (void)state;
    for (int tie = 0; tie <= 1; tie++) {
        char dir[256];
        tmp_path(dir, sizeof dir, tie ? "tied" : "untied");
        model_t *m = make_model(tie, 0, 5 + (uint64_t)tie);
        assert_int_equal(checkpoint_save(dir, m, NULL), IGRAD_OK);
        model_t *back = NULL;
        if (checkpoint_load_model(dir, &back) != IGRAD_OK)
            fail_msg("load: %s", trainer_last_error());
        assert_memory_equal(&back->config, &m->config, sizeof m->config);
        assert_same_params(m, back);
        for (int i = 0; i < m->n_tensors; i++)
            assert_string_equal(back->tensors[i].name, m->tensors[i].name);
        /* saving again over the existing checkpoint replaces it */
        m->params[3] = 42.0f;
        assert_int_equal(checkpoint_save(dir, m, NULL), IGRAD_OK);
        model_free(back);
        assert_int_equal(checkpoint_load_model(dir, &back), IGRAD_OK);
        assert_true(back->params[3] == 42.0f);
        model_free(back);
        model_free(m);
    }
}

static void test_layout_agrees(void **state)
{
    (void)state;
    for (int tie = 0; tie <= 1; tie++) {
        char dir[256], cfg_path[300];
        tmp_path(dir, sizeof dir, tie ? "layout-tied" : "layout");
        model_t *m = make_model(tie, 1, 9);
        assert_int_equal(checkpoint_save(dir, m, NULL), IGRAD_OK);
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
        igrad_layout_t *mine = NULL, *from_cfg = NULL, *from_dir = NULL;
        assert_int_equal(model_layout(m, &mine), IGRAD_OK);
        if (igrad_layout_from_hf_config(cfg_path, &from_cfg) != IGRAD_OK)
            fail_msg("igrad_layout_from_hf_config: %s", igrad_last_error());
        if (igrad_layout_load(dir, &from_dir) != IGRAD_OK)
            fail_msg("igrad_layout_load: %s", igrad_last_error());
        const igrad_layout_t *others[2] = {from_cfg, from_dir};
        for (int k = 0; k < 2; k++) {
            assert_int_equal(igrad_layout_count(others[k]), igrad_layout_count(mine));
            for (size_t i = 0; i < igrad_layout_count(mine); i++) {
                igrad_tensor_info_t a, b;
                assert_int_equal(igrad_layout_tensor(mine, i, &a), IGRAD_OK);
                assert_int_equal(igrad_layout_tensor(others[k], i, &b), IGRAD_OK);
                assert_string_equal(a.name, b.name);
                assert_int_equal(a.ndim, b.ndim);
                assert_int_equal(a.shape[0], b.shape[0]);
                assert_int_equal(a.shape[1], b.shape[1]);
                assert_int_equal(a.offset, b.offset);
                assert_int_equal(a.offset, m->tensors[i].offset);
            }
            if (igrad_layout_hash(others[k]) != igrad_layout_hash(mine))
                fail_msg("%s: layout hash %016llx, model's %016llx",
                         k ? "model.safetensors" : "config.json",
                         (unsigned long long)igrad_layout_hash(others[k]),
                         (unsigned long long)igrad_layout_hash(mine));
        }
        assert_string_equal(igrad_layout_family(from_cfg), "llama");
        igrad_layout_free(mine);
        igrad_layout_free(from_cfg);
        igrad_layout_free(from_dir);
        model_free(m);
    }
}

static void test_optim_round_trip(void **state)
{
    (void)state;
    char dir[256], path[300];
    tmp_path(dir, sizeof dir, "with-optim");
    model_t *m = make_model(0, 0, 21);
    optim_config_t oc = optim_config_default();
    optim_t *opt = NULL, *back = NULL;
    assert_int_equal(optim_create_for_model(&oc, m, &opt), IGRAD_OK);
    for (int s = 0; s < 3; s++) {
        for (int64_t i = 0; i < m->num_params; i++)
            m->grads[i] = (float)((i * 7 + s * 13) % 17) * 0.01f - 0.08f;
        optim_update(opt, m->params, m->grads, 1e-3);
    }
    assert_int_equal(checkpoint_save(dir, m, opt), IGRAD_OK);
    snprintf(path, sizeof path, "%s/%s", dir, CHECKPOINT_OPTIM_FILE);
    assert_int_equal(optim_create_for_model(&oc, m, &back), IGRAD_OK);
    if (checkpoint_load_optim(path, m, back) != IGRAD_OK)
        fail_msg("load optim: %s", trainer_last_error());
    assert_int_equal(back->step, 3);
    assert_memory_equal(back->m, opt->m, (size_t)m->num_params * sizeof(float));
    assert_memory_equal(back->v, opt->v, (size_t)m->num_params * sizeof(float));
    model_t *loaded = NULL;
    assert_int_equal(checkpoint_load_model(dir, &loaded), IGRAD_OK);
    assert_same_params(m, loaded);
    model_free(loaded);

    /* state of another model is refused by its layout hash */
    model_t *other = make_model(0, 1, 21);
    optim_t *oo = NULL;
    assert_int_equal(optim_create_for_model(&oc, other, &oo), IGRAD_OK);
    assert_fails_with(checkpoint_load_optim(path, other, oo), IGRAD_E_MISMATCH, path,
                      "layout hash");
    /* the same model after one more step (another save of the same run, or
     * another run at the same step): the moments belong to other parameters */
    float p0 = m->params[0];
    m->params[0] = p0 + 1e-3f;
    assert_fails_with(checkpoint_load_optim(path, m, back), IGRAD_E_MISMATCH, path,
                      "saved with other parameters");
    m->params[0] = p0;
    if (checkpoint_load_optim(path, m, back) != IGRAD_OK)
        fail_msg("load optim again: %s", trainer_last_error());
    /* a model file is not an optimizer file */
    char model_path[300];
    snprintf(model_path, sizeof model_path, "%s/%s", dir, CHECKPOINT_MODEL_FILE);
    assert_fails_with(checkpoint_load_optim(model_path, m, back), IGRAD_E_FORMAT, model_path,
                      "igrad-adamw");
    optim_free(oo);
    model_free(other);
    optim_free(opt);
    optim_free(back);
    model_free(m);
}

/* Writes `nbytes` of `data` to path. */
static void write_file(const char *path, const void *data, size_t nbytes)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, nbytes, fp), nbytes);
    assert_int_equal(fclose(fp), 0);
}

static char *read_whole(const char *path, size_t *nbytes)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *nbytes = (size_t)n;
    return buf;
}

/* Writes the model's tensors with one of them dropped or given another
 * dtype, as a model.safetensors of dir. */
static void write_variant(const model_t *m, const char *dir, const char *drop,
                          const char *as_f16)
{
    checkpoint_tensor_t ts[64];
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        if (drop && !strcmp(t->name, drop)) continue;
        ts[n] = (checkpoint_tensor_t){t->name, IGRAD_DTYPE_F32, t->ndim,
                                      {t->shape[0], t->shape[1]}, m->params + t->offset};
        if (as_f16 && !strcmp(t->name, as_f16)) ts[n].dtype = IGRAD_DTYPE_F16;
        n++;
    }
    char path[300];
    snprintf(path, sizeof path, "%s/%s", dir, CHECKPOINT_MODEL_FILE);
    assert_int_equal(checkpoint_write_safetensors(path, ts, n, NULL), IGRAD_OK);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    char dir[256], st_path[300], cfg_path[300];
    tmp_path(dir, sizeof dir, "bad");
    snprintf(st_path, sizeof st_path, "%s/%s", dir, CHECKPOINT_MODEL_FILE);
    snprintf(cfg_path, sizeof cfg_path, "%s/%s", dir, CHECKPOINT_CONFIG_FILE);
    model_t *m = make_model(0, 0, 31), *out = NULL;
    assert_int_equal(checkpoint_save(dir, m, NULL), IGRAD_OK);
    size_t good_n = 0;
    char *good = read_whole(st_path, &good_n);

    /* truncated in the data: the last tensor runs past the end */
    write_file(st_path, good, good_n - 100);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_FORMAT, "lm_head.weight",
                      "truncated");
    assert_non_null(strstr(trainer_last_error(), st_path));
    assert_null(out);
    /* truncated inside the length field */
    write_file(st_path, good, 5);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_FORMAT, st_path, "truncated");
    /* header length larger than the file */
    char *bad = malloc(good_n);
    assert_non_null(bad);
    memcpy(bad, good, good_n);
    bad[5] = 0x01; /* header length += 2^40 */
    write_file(st_path, bad, good_n);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_FORMAT, st_path,
                      "larger than the file");
    /* header that is not JSON */
    memcpy(bad, good, good_n);
    bad[8] = '[';
    bad[9] = '!';
    write_file(st_path, bad, good_n);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_FORMAT, st_path, "JSON");
    /* extra bytes after the last tensor */
    char *longer = malloc(good_n + 4);
    assert_non_null(longer);
    memcpy(longer, good, good_n);
    memset(longer + good_n, 0, 4);
    write_file(st_path, longer, good_n + 4);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_FORMAT, st_path,
                      "after the last tensor");
    /* a tensor named twice (valid JSON, invalid safetensors) */
    static const char dup_header[] =
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    size_t dn = strlen(dup_header);
    memset(bad, ' ', 8 + dn + 8 + 8);
    for (int i = 0; i < 8; i++) bad[i] = (char)(i == 0 ? (dn + 7) / 8 * 8 : 0);
    memcpy(bad + 8, dup_header, dn);
    memset(bad + 8 + (dn + 7) / 8 * 8, 0, 8);
    write_file(st_path, bad, 8 + (dn + 7) / 8 * 8 + 8);
    assert_fails_with(checkpoint_load_params(st_path, m), IGRAD_E_FORMAT, "'a' appears twice",
                      st_path);
    write_file(st_path, good, good_n);
    assert_int_equal(checkpoint_load_model(dir, &out), IGRAD_OK);
    model_free(out);
    out = NULL;

    /* missing tensor */
    write_variant(m, dir, "model.layers.1.mlp.up_proj.weight", NULL);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_FORMAT,
                      "missing tensor 'model.layers.1.mlp.up_proj.weight'", st_path);
    /* wrong dtype */
    write_variant(m, dir, NULL, "model.norm.weight");
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_FORMAT, "'model.norm.weight'",
                      "dtype F16, expected F32");
    write_file(st_path, good, good_n);

    /* config/tensor mismatch: wider hidden_size than the tensors */
    model_config_t cfg = m->config;
    cfg.dim = 64;
    assert_int_equal(checkpoint_write_config(&cfg, cfg_path), IGRAD_OK);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_MISMATCH,
                      "'model.embed_tokens.weight' has shape [257, 32]", "[257, 64]");
    /* fewer layers in the config than in the file */
    cfg = m->config;
    cfg.n_layer = 1;
    assert_int_equal(checkpoint_write_config(&cfg, cfg_path), IGRAD_OK);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_MISMATCH,
                      "unexpected tensor 'model.layers.1.", st_path);
    /* tied in the config, but the file has lm_head */
    cfg = m->config;
    cfg.tie_embeddings = 1;
    assert_int_equal(checkpoint_write_config(&cfg, cfg_path), IGRAD_OK);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_MISMATCH,
                      "unexpected tensor 'lm_head.weight'", NULL);
    /* config.json without a required key / with an unsupported option */
    static const char no_layers[] =
        "{\"model_type\": \"llama\", \"vocab_size\": 257, \"hidden_size\": 32, "
        "\"intermediate_size\": 64, \"num_attention_heads\": 4, "
        "\"max_position_embeddings\": 64}";
    write_file(cfg_path, no_layers, strlen(no_layers));
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_FORMAT, cfg_path,
                      "\"num_hidden_layers\"");
    static const char gpt2[] = "{\"model_type\": \"gpt2\"}";
    write_file(cfg_path, gpt2, strlen(gpt2));
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_UNSUPPORTED, cfg_path, "gpt2");
    write_file(cfg_path, "{", 1);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_FORMAT, cfg_path, "JSON");
    /* \u0000 in a config string: cJSON would cut "llama" to "lla" */
    static const char nul_cfg[] = "{\"model_type\": \"lla\\u0000ma\"}";
    write_file(cfg_path, nul_cfg, strlen(nul_cfg));
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_FORMAT, cfg_path, "\\u0000");
    /* a raw NUL byte inside a string: cJSON would read "lla" */
    static const char nul_byte_cfg[] = "{\"model_type\": \"lla\0ma\"}";
    write_file(cfg_path, nul_byte_cfg, sizeof nul_byte_cfg - 1);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_FORMAT, cfg_path, "NUL byte");
    /* ... and in a tensor name of the safetensors header */
    static const char nul_header[] =
        "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    size_t nn = strlen(nul_header);
    memset(bad, ' ', 8 + (nn + 7) / 8 * 8 + 4);
    for (int i = 0; i < 8; i++) bad[i] = (char)(i == 0 ? (nn + 7) / 8 * 8 : 0);
    memcpy(bad + 8, nul_header, nn);
    memset(bad + 8 + (nn + 7) / 8 * 8, 0, 4);
    write_file(st_path, bad, 8 + (nn + 7) / 8 * 8 + 4);
    assert_fails_with(checkpoint_load_params(st_path, m), IGRAD_E_FORMAT, st_path, "\\u0000");
    write_file(st_path, good, good_n);
    unlink(cfg_path);
    assert_fails_with(checkpoint_load_model(dir, &out), IGRAD_E_IO, cfg_path, NULL);
    assert_null(out);

    free(longer);
    free(bad);
    free(good);
    model_free(m);
}

/* A save that fails part-way (RLIMIT_FSIZE: writes past 16 KiB fail with
 * EFBIG) leaves no directory under the final name, no temporary, and an
 * existing checkpoint untouched. */
static void test_failed_save_leaves_nothing(void **state)
{
    (void)state;
    char fresh[256], existing[256];
    tmp_path(fresh, sizeof fresh, "never");
    tmp_path(existing, sizeof existing, "kept");
    model_t *m = make_model(0, 0, 41), *back = NULL;
    assert_int_equal(checkpoint_save(existing, m, NULL), IGRAD_OK);
    float first = m->params[0];
    m->params[0] = first + 1.0f;

    struct rlimit saved, small;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
    small = saved;
    small.rlim_cur = 16384;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    igrad_status_t st1 = checkpoint_save(fresh, m, NULL);
    igrad_status_t st2 = checkpoint_save(existing, m, NULL);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
    signal(SIGXFSZ, old_handler);

    assert_fails_with(st1, IGRAD_E_IO, "model.safetensors", NULL);
    assert_int_equal(st2, IGRAD_E_IO);
    assert_false(exists(fresh));
    assert_int_equal(count_prefixed("never."), 0);
    assert_int_equal(count_prefixed("kept."), 0);
    assert_int_equal(checkpoint_load_model(existing, &back), IGRAD_OK);
    assert_true(back->params[0] == first);
    model_free(back);
    model_free(m);
}

/* A pid that no process has: a child that has exited and been reaped. */
static long dead_pid(void)
{
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    assert_true(pid > 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return (long)pid;
}

static void make_dir_with(const char *dir, const char *file)
{
    char p[512];
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    fputs("x", fp);
    fclose(fp);
}

/* What killed saves leave: a dead process's folders go, a live one's and
 * another host's stay; a checkpoint caught between the two renames of a
 * commit (only "<dir>.old.*" left) is put back. */
static void test_tidy(void **state)
{
    (void)state;
    char dir[256], p[512], host[256] = "";
    tmp_path(dir, sizeof dir, "ck");
    gethostname(host, sizeof host);
    long dead = dead_pid(), live = (long)getppid();
    char hosttag[64];
    size_t k = 0;
    for (const char *c = host; *c && k < 63; c++, k++) {
        int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                 (*c >= '0' && *c <= '9') || *c == '.' || *c == '-' || *c == '_';
        hosttag[k] = ok ? *c : '_';
    }
    hosttag[k] = '\0';

    snprintf(p, sizeof p, "%s.tmp.%ld", dir, dead); /* an older igrad's name */
    make_dir_with(p, "model.safetensors");
    snprintf(p, sizeof p, "%s.tmp.%ld@%s", dir, dead, hosttag);
    make_dir_with(p, "model.safetensors");
    snprintf(p, sizeof p, "%s.tmp.%ld@%s", dir, live, hosttag);
    make_dir_with(p, "model.safetensors");
    snprintf(p, sizeof p, "%s.tmp.%ld@another-host.example", dir, dead);
    make_dir_with(p, "model.safetensors");
    snprintf(p, sizeof p, "%s.old.%ld@%s", dir, dead, hosttag);
    make_dir_with(p, "train_state.json");
    snprintf(p, sizeof p, "%s.oldish", dir); /* not ours: never touched */
    make_dir_with(p, "x");

    int recovered = 0;
    assert_int_equal(checkpoint_tidy(dir, "train_state.json", &recovered), IGRAD_OK);
    assert_int_equal(recovered, 1);
    snprintf(p, sizeof p, "%s/train_state.json", dir);
    assert_true(exists(p));
    snprintf(p, sizeof p, "%s.tmp.%ld", dir, dead);
    assert_false(exists(p));
    snprintf(p, sizeof p, "%s.tmp.%ld@%s", dir, dead, hosttag);
    assert_false(exists(p));
    snprintf(p, sizeof p, "%s.tmp.%ld@%s", dir, live, hosttag);
    assert_true(exists(p));
    snprintf(p, sizeof p, "%s.tmp.%ld@another-host.example", dir, dead);
    assert_true(exists(p));
    snprintf(p, sizeof p, "%s.oldish", dir);
    assert_true(exists(p));
    assert_int_equal(count_prefixed("ck.old."), 0);

    /* With the checkpoint present, a dead save's moved-aside copy is
     * stale and goes; nothing is "recovered". */
    snprintf(p, sizeof p, "%s.old.%ld", dir, dead);
    make_dir_with(p, "train_state.json");
    assert_int_equal(checkpoint_tidy(dir, "train_state.json", &recovered), IGRAD_OK);
    assert_int_equal(recovered, 0);
    assert_false(exists(p));
    snprintf(p, sizeof p, "%s/train_state.json", dir);
    assert_true(exists(p));

    /* A killed save whose process is a zombie (not reaped yet: kill(pid, 0)
     * still succeeds; in a container whose init never reaps, for good) is
     * dead too. */
    pid_t zombie = fork();
    assert_true(zombie >= 0);
    if (zombie == 0) _exit(0);
    char stat_path[64], st[256] = "";
    snprintf(stat_path, sizeof stat_path, "/proc/%ld/stat", (long)zombie);
    for (int i = 0; i < 500 && !strstr(st, ") Z"); i++) { /* until it has exited */
        FILE *fp = fopen(stat_path, "r");
        if (fp) {
            size_t n = fread(st, 1, sizeof st - 1, fp);
            st[n] = '\0';
            fclose(fp);
        }
        nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
    }
    assert_non_null(strstr(st, ") Z"));
    snprintf(p, sizeof p, "%s.tmp.%ld@%s", dir, (long)zombie, hosttag);
    make_dir_with(p, "model.safetensors");
    assert_int_equal(checkpoint_tidy(dir, "train_state.json", &recovered), IGRAD_OK);
    assert_false(exists(p));
    waitpid(zombie, NULL, 0);
}

/* The checkpoint checksum: FNV-1a 64 over the size word, then the words
 * (computed here by hand for "a"); one flipped bit anywhere changes it;
 * a file that ends with the word-wise FNV-1a of the rest (as an engine
 * state does) does not hash to a constant. */
static void test_file_hash(void **state)
{
    (void)state;
    char p[256];
    tmp_path(p, sizeof p, "hashme");
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    fputs("a", fp);
    fclose(fp);
    uint64_t h = 0, n = 0;
    assert_int_equal(checkpoint_file_hash(p, &h, &n), IGRAD_OK);
    assert_int_equal(n, 1);
    uint64_t want = 0xcbf29ce484222325ULL;
    want = (want ^ 1u) * 0x100000001b3ULL;    /* size: 1 byte */
    want = (want ^ 0x61u) * 0x100000001b3ULL; /* "a", zero-padded */
    assert_true(h == want);

    unsigned char buf[3000];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 7);
    fp = fopen(p, "wb");
    fwrite(buf, 1, sizeof buf, fp);
    fclose(fp);
    uint64_t base = 0;
    assert_int_equal(checkpoint_file_hash(p, &base, &n), IGRAD_OK);
    for (size_t i = 0; i < sizeof buf; i += 997) {
        buf[i] ^= 0x10;
        fp = fopen(p, "wb");
        fwrite(buf, 1, sizeof buf, fp);
        fclose(fp);
        assert_int_equal(checkpoint_file_hash(p, &h, &n), IGRAD_OK);
        assert_true(h != base);
        buf[i] ^= 0x10;
    }
    /* Self-checksummed files of two different contents. */
    uint64_t got[2];
    for (int f = 0; f < 2; f++) {
        uint64_t words[5] = {1, 2, 3, (uint64_t)f + 4, 0}, c = 0xcbf29ce484222325ULL;
        for (int i = 0; i < 4; i++) c = (c ^ words[i]) * 0x100000001b3ULL;
        words[4] = c;
        fp = fopen(p, "wb");
        fwrite(words, 8, 5, fp);
        fclose(fp);
        assert_int_equal(checkpoint_file_hash(p, &got[f], &n), IGRAD_OK);
    }
    assert_true(got[0] != got[1]);
    tmp_path(p, sizeof p, "no-such-file");
    assert_int_equal(checkpoint_file_hash(p, &h, &n), IGRAD_E_IO);
}

/* The general writer: other dtypes and a scalar, readable by libigrad's
 * own safetensors reader. */
static void test_write_safetensors(void **state)
{
    (void)state;
    char path[256];
    tmp_path(path, sizeof path, "misc.safetensors");
    int32_t ids[6] = {1, 2, 3, 4, 5, 256};
    float scalar = 2.5f;
    checkpoint_tensor_t ts[2] = {
        {"ids", IGRAD_DTYPE_I32, 2, {2, 3}, ids},
        {"loss", IGRAD_DTYPE_F32, 0, {0}, &scalar},
    };
    const char *meta[] = {"note", "hello", NULL};
    assert_int_equal(checkpoint_write_safetensors(path, ts, 2, meta), IGRAD_OK);
    igrad_layout_t *layout = NULL;
    if (igrad_layout_from_safetensors(path, &layout) != IGRAD_OK)
        fail_msg("igrad_layout_from_safetensors: %s", igrad_last_error());
    assert_int_equal(igrad_layout_count(layout), 2);
    igrad_tensor_info_t ti;
    assert_int_equal(igrad_layout_tensor(layout, 0, &ti), IGRAD_OK);
    assert_string_equal(ti.name, "ids");
    assert_int_equal(ti.dtype, IGRAD_DTYPE_I32);
    assert_int_equal(ti.count, 6);
    igrad_layout_free(layout);
    size_t n = 0;
    char *bytes = read_whole(path, &n);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
    assert_int_equal(hlen % 8, 0);
    assert_int_equal(n, 8 + hlen + sizeof ids + sizeof scalar);
    assert_memory_equal(bytes + 8 + hlen, ids, sizeof ids);
    assert_true(strstr(bytes + 8, "\"__metadata__\":{\"note\":\"hello\",\"format\":\"pt\"}") != NULL);
    free(bytes);
    checkpoint_tensor_t dup[2] = {ts[0], ts[0]};
    assert_int_equal(checkpoint_write_safetensors(path, dup, 2, NULL), IGRAD_E_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_round_trip),
        cmocka_unit_test(test_layout_agrees),
        cmocka_unit_test(test_optim_round_trip),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_failed_save_leaves_nothing),
        cmocka_unit_test(test_tidy),
        cmocka_unit_test(test_file_hash),
        cmocka_unit_test(test_write_safetensors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
