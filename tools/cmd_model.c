/*
 * cmd_model.c — `igrad model`: create a randomly initialised checkpoint of
 * the reference trainer's LLaMA (init), run one forward/backward on given
 * tokens and optionally dump logits, loss and every gradient (eval — what
 * the PyTorch cross-check reads), and time forward+backward (bench).
 *
 * The model, its files and the optimizer live in trainer/; this file only
 * parses arguments and prints. Training itself is `igrad train`.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

#ifdef IGRAD_HAVE_TRAINER
#include "checkpoint.h"
#include "model.h"

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: igrad model init --size tiny|small|base [overrides] [--seed S]\n"
            "                        [--init-std 0.02] --out DIR\n"
            "       igrad model eval --init DIR (--tokens FILE.bin | --text FILE)\n"
            "                        [--batch B] [--seq-len T] [--dump FILE.safetensors]\n"
            "       igrad model bench --size tiny|small|base [overrides] [--batch 8]\n"
            "                        [--seq-len 128] [--steps 5]\n"
            "\n"
            "The reference trainer's LLaMA (byte vocabulary of 257, RMSNorm, RoPE,\n"
            "grouped-query attention, SwiGLU; Hugging Face names and shapes).\n"
            "\n"
            "overrides: --layers L --dim C --heads H --kv-heads KV --ffn F --seq-len T\n"
            "           --tie (share lm_head with the embedding) --rope-theta X --rms-eps X\n"
            "init:  writes DIR/config.json and DIR/model.safetensors (matrices ~ normal(0,\n"
            "       std), norms 1; deterministic for a seed; --seq-len sets\n"
            "       max_position_embeddings).\n"
            "eval:  tokens are uint16 little-endian (--tokens) or the bytes of a file\n"
            "       (--text); the first B*T+1 are used, row b = tokens[b*T, b*T+T) with\n"
            "       targets shifted by one. Prints the mean cross-entropy. --dump writes\n"
            "       inputs, targets, logits, loss and grad.<parameter> for every tensor\n"
            "       (defaults: --batch 4, --seq-len min(64, max_position_embeddings)).\n"
            "bench: random tokens, prints tokens/s of forward and forward+backward\n"
            "       (threads: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS).\n");
}

/* Model architecture overrides shared by init and bench: "--key VALUE" for
 * the keys model_config_set knows, "--tie" alone. @return 1 consumed,
 * 0 not a model option, -1 error. */
static int model_option(int argc, char **argv, int *i, model_config_t *cfg)
{
    const char *arg = argv[*i];
    if (strncmp(arg, "--", 2) != 0) return 0;
    if (!strcmp(arg, "--tie")) {
        cfg->tie_embeddings = 1;
        return 1;
    }
    static const char *const keys[] = {"layers", "dim", "heads", "kv-heads", "ffn",
                                       "seq-len", "rope-theta", "rms-eps", "tie"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        char name[32];
        snprintf(name, sizeof name, "--%s", keys[k]);
        const char *value = NULL;
        int r = cli_opt(argc, argv, i, name, &value);
        if (r < 0) return -1;
        if (r == 0) continue;
        if (model_config_set(cfg, keys[k], value) != IGRAD_OK) {
            fprintf(stderr, "igrad: %s\n", trainer_last_error());
            return -1;
        }
        return 1;
    }
    return 0;
}

/* Finds --size first so overrides apply on top of the preset whatever the
 * argument order. */
static int preset_from_args(int argc, char **argv, model_config_t *cfg)
{
    const char *size = "tiny";
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r = cli_opt(argc, argv, &i, "--size", &v);
        if (r < 0) return -1;
        if (r > 0) size = v;
    }
    if (model_config_preset(size, cfg) != IGRAD_OK) {
        fprintf(stderr, "igrad: --size: %s\n", trainer_last_error());
        return -1;
    }
    return 0;
}

static int trainer_error(const char *what)
{
    fprintf(stderr, "igrad: %s: %s\n", what, trainer_last_error());
    return 1;
}

static int model_init(int argc, char **argv)
{
    model_config_t cfg;
    const char *out = NULL;
    int64_t seed = 1;
    double std = 0.02;
    if (preset_from_args(argc, argv, &cfg) != 0) return 2;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if ((r = cli_opt(argc, argv, &i, "--size", &v)) != 0) {
            if (r < 0) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--out", &v)) != 0) {
            if (r < 0) return 2;
            out = v;
        } else if ((r = cli_opt(argc, argv, &i, "--seed", &v)) != 0) {
            if (r < 0 || cli_parse_i64("--seed", v, &seed) != 0) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--init-std", &v)) != 0) {
            if (r < 0 || cli_parse_f64("--init-std", v, &std) != 0) return 2;
            if (!(std > 0.0)) {
                fprintf(stderr, "igrad: --init-std must be positive\n");
                return 2;
            }
        } else if ((r = model_option(argc, argv, &i, &cfg)) != 0) {
            if (r < 0) return 2;
        } else {
            fprintf(stderr, "igrad: model init: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "igrad: model init: --out DIR is required\n");
        return 2;
    }
    model_t *m = NULL;
    if (model_create(&cfg, &m) != IGRAD_OK) return trainer_error("model init");
    model_init_random(m, (uint64_t)seed, (float)std);
    igrad_status_t st = checkpoint_save(out, m, NULL);
    if (st == IGRAD_OK)
        printf("wrote %s: %lld parameters, %d layers, dim %d, heads %d/%d, ffn %d, "
               "max_seq_len %d%s\n", out, (long long)m->num_params, cfg.n_layer, cfg.dim,
               cfg.n_head, cfg.n_kv_head, cfg.ffn_dim, cfg.max_seq_len,
               cfg.tie_embeddings ? ", tied lm_head" : "");
    model_free(m);
    return st == IGRAD_OK ? 0 : trainer_error("model init");
}

/* Reads up to `want` tokens: uint16 LE (tokens) or bytes (text). */
static int read_tokens(const char *path, int text, int32_t *tok, int64_t want, int64_t *got)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "igrad: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int64_t n = 0;
    unsigned char b[2];
    while (n < want && fread(b, 1, text ? 1 : 2, fp) == (text ? 1u : 2u))
        tok[n++] = text ? b[0] : (int32_t)(b[0] | (b[1] << 8));
    fclose(fp);
    *got = n;
    return 0;
}

static int dump_eval(const char *path, const model_t *m, int B, int T)
{
    int n = 4 + m->n_tensors;
    checkpoint_tensor_t *ts = calloc((size_t)n, sizeof *ts);
    char (*names)[MODEL_NAME_MAX + 8] = calloc((size_t)m->n_tensors, sizeof *names);
    if (!ts || !names) {
        free(ts);
        free(names);
        fprintf(stderr, "igrad: out of memory\n");
        return 1;
    }
    ts[0] = (checkpoint_tensor_t){"inputs", IGRAD_DTYPE_I32, 2, {B, T}, m->acts.inputs};
    ts[1] = (checkpoint_tensor_t){"targets", IGRAD_DTYPE_I32, 2, {B, T}, m->acts.targets};
    ts[2] = (checkpoint_tensor_t){"logits", IGRAD_DTYPE_F32, 3,
                                  {B, T, m->config.vocab_size}, m->acts.logits};
    float loss_f32 = (float)m->loss;
    ts[3] = (checkpoint_tensor_t){"loss", IGRAD_DTYPE_F32, 0, {0}, &loss_f32};
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        snprintf(names[i], sizeof names[i], "grad.%s", t->name);
        ts[4 + i] = (checkpoint_tensor_t){names[i], IGRAD_DTYPE_F32, t->ndim,
                                          {t->shape[0], t->shape[1]}, m->grads + t->offset};
    }
    char loss[32];
    snprintf(loss, sizeof loss, "%.9g", m->loss);
    const char *meta[] = {"format", "pt", "loss", loss, NULL};
    igrad_status_t st = checkpoint_write_safetensors(path, ts, n, meta);
    free(ts);
    free(names);
    return st == IGRAD_OK ? 0 : trainer_error("model eval --dump");
}

static int model_eval(int argc, char **argv)
{
    const char *init = NULL, *tokens = NULL, *text = NULL, *dump = NULL;
    int64_t B = 4, T = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if ((r = cli_opt(argc, argv, &i, "--init", &v)) != 0) {
            init = v;
        } else if ((r = cli_opt(argc, argv, &i, "--tokens", &v)) != 0) {
            tokens = v;
        } else if ((r = cli_opt(argc, argv, &i, "--text", &v)) != 0) {
            text = v;
        } else if ((r = cli_opt(argc, argv, &i, "--dump", &v)) != 0) {
            dump = v;
        } else if ((r = cli_opt(argc, argv, &i, "--batch", &v)) != 0) {
            if (r > 0 && cli_parse_i64("--batch", v, &B) != 0) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--seq-len", &v)) != 0) {
            if (r > 0 && cli_parse_i64("--seq-len", v, &T) != 0) return 2;
        } else {
            fprintf(stderr, "igrad: model eval: unknown argument '%s'\n", argv[i]);
            return 2;
        }
        if (r < 0) return 2;
    }
    if (!init || (!tokens == !text)) {
        fprintf(stderr, "igrad: model eval: needs --init DIR and one of --tokens, --text\n");
        return 2;
    }
    model_t *m = NULL;
    if (checkpoint_load_model(init, &m) != IGRAD_OK) return trainer_error("model eval");
    if (T == 0) T = m->config.max_seq_len < 64 ? m->config.max_seq_len : 64;
    if (B < 1 || B > 4096 || T < 1 || T > m->config.max_seq_len) {
        fprintf(stderr, "igrad: model eval: --batch %lld / --seq-len %lld out of range (seq-len "
                "<= %d)\n", (long long)B, (long long)T, m->config.max_seq_len);
        model_free(m);
        return 2;
    }
    int64_t want = B * T + 1, got = 0;
    int32_t *tok = malloc((size_t)want * sizeof *tok);
    int32_t *targets = malloc((size_t)(B * T) * sizeof *targets);
    int rc = 1;
    if (!tok || !targets) {
        fprintf(stderr, "igrad: out of memory\n");
        goto done;
    }
    if (read_tokens(tokens ? tokens : text, text != NULL, tok, want, &got) != 0) goto done;
    if (got < want) {
        fprintf(stderr, "igrad: model eval: %s has %lld tokens, --batch %lld x --seq-len %lld "
                "needs %lld\n", tokens ? tokens : text, (long long)got, (long long)B,
                (long long)T, (long long)want);
        goto done;
    }
    for (int64_t i = 0; i < B * T; i++) targets[i] = tok[i + 1];
    model_zero_grad(m);
    if (model_forward(m, tok, targets, (int)B, (int)T) != IGRAD_OK ||
        model_backward(m) != IGRAD_OK) {
        trainer_error("model eval");
        goto done;
    }
    double sumsq = 0.0;
    for (int64_t i = 0; i < m->num_params; i++) sumsq += (double)m->grads[i] * m->grads[i];
    printf("loss %.6f  (B=%lld T=%lld, %lld targets, grad norm %.6g)\n", m->loss,
           (long long)B, (long long)T, (long long)m->loss_count, sqrt(sumsq));
    rc = dump ? dump_eval(dump, m, (int)B, (int)T) : 0;
    if (rc == 0 && dump) printf("wrote %s\n", dump);
done:
    free(tok);
    free(targets);
    model_free(m);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int model_bench(int argc, char **argv)
{
    model_config_t cfg;
    int64_t B = 8, T = 128, steps = 5;
    if (preset_from_args(argc, argv, &cfg) != 0) return 2;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if ((r = cli_opt(argc, argv, &i, "--size", &v)) != 0) {
        } else if ((r = cli_opt(argc, argv, &i, "--batch", &v)) != 0) {
            if (r > 0 && cli_parse_i64("--batch", v, &B) != 0) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--steps", &v)) != 0) {
            if (r > 0 && cli_parse_i64("--steps", v, &steps) != 0) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--seq-len", &v)) != 0) {
            if (r > 0 && cli_parse_i64("--seq-len", v, &T) != 0) return 2;
        } else if ((r = model_option(argc, argv, &i, &cfg)) != 0) {
        } else {
            fprintf(stderr, "igrad: model bench: unknown argument '%s'\n", argv[i]);
            return 2;
        }
        if (r < 0) return 2;
    }
    if (T > cfg.max_seq_len) cfg.max_seq_len = (int)T;
    if (B < 1 || T < 1 || B * T > (1 << 20) || steps < 1) {
        fprintf(stderr, "igrad: model bench: --batch, --seq-len, --steps out of range\n");
        return 2;
    }
    model_t *m = NULL;
    if (model_create(&cfg, &m) != IGRAD_OK) return trainer_error("model bench");
    model_init_random(m, 1, 0.02f);
    int32_t *tok = malloc((size_t)(B * T + 1) * sizeof *tok);
    if (!tok) {
        model_free(m);
        fprintf(stderr, "igrad: out of memory\n");
        return 1;
    }
    uint64_t x = 88172645463325252ULL;
    for (int64_t i = 0; i <= B * T; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % (uint64_t)cfg.vocab_size);
    }
    int rc = 0;
    double t_fwd = 0.0, t_all = 0.0;
    for (int64_t s = 0; s <= steps && rc == 0; s++) { /* step 0 warms up */
        double t0 = now_s();
        if (model_forward(m, tok, tok + 1, (int)B, (int)T) != IGRAD_OK) rc = 1;
        double t1 = now_s();
        if (rc == 0 && model_backward(m) != IGRAD_OK) rc = 1;
        double t2 = now_s();
        if (s > 0) {
            t_fwd += t1 - t0;
            t_all += t2 - t0;
        }
    }
    if (rc == 0) {
        double ntok = (double)(B * T * steps);
        printf("model bench: %lld parameters (L=%d C=%d H=%d KV=%d F=%d%s), B=%lld T=%lld, "
               "%lld steps\n", (long long)m->num_params, cfg.n_layer, cfg.dim, cfg.n_head,
               cfg.n_kv_head, cfg.ffn_dim, cfg.tie_embeddings ? " tied" : "", (long long)B,
               (long long)T, (long long)steps);
        printf("  forward           %8.1f ms/step  %10.0f tokens/s\n",
               1e3 * t_fwd / (double)steps, ntok / t_fwd);
        printf("  forward+backward  %8.1f ms/step  %10.0f tokens/s\n",
               1e3 * t_all / (double)steps, ntok / t_all);
    } else {
        trainer_error("model bench");
    }
    free(tok);
    model_free(m);
    return rc;
}

int cmd_model(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "init")) return model_init(argc - 1, argv + 1);
    if (!strcmp(argv[1], "eval")) return model_eval(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) return model_bench(argc - 1, argv + 1);
    fprintf(stderr, "igrad: model: unknown subcommand '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}

#else /* built without the trainer (OpenBLAS or MPI missing) */

int cmd_model(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "igrad: 'model' needs the trainer, which this build skipped "
            "(OpenBLAS or MPI not found)\n");
    return 1;
}

#endif
