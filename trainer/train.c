/*
 * train.c — the reference trainer's training loop (see train.h): the
 * run-defining options compared across ranks, setup agreed across ranks,
 * the step (micro-batched forward/backward, engine sync, clipping, AdamW),
 * evaluation with the cross-rank parameter check, multi-rank checkpoints
 * that are complete or absent and carry every file's checksum, resume
 * verified against them, metrics, progress and the run summary.
 *
 * Collectives go through igrad_comm_t only (the engine's communicator), so
 * this file needs no mpi.h and runs the same on one process ("self").
 *
 * Not here: argument parsing, MPI start-up and exit codes (cmd_train.c);
 * CSV/JSON details (metrics.c); the model, optimizer, data and checkpoint
 * files themselves, train_state.json included (train_state.c: this file
 * fills it and compares what it reads with the run).
 */
#define _POSIX_C_SOURCE 200809L
#include "train.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "checkpoint.h"
#include "core/internal.h" /* libigrad's FNV-1a (igrad__hash_bytes) */
#include "data.h"
#include "task.h"
#include "metrics.h"
#include "train_state.h"

#define MSG_NBYTES 1000 /* per-rank error message exchanged by agree() */

/* Propagates a failure (its message is already recorded). */
#define TRY(expr)                                   \
    do {                                            \
        igrad_status_t try_st_ = (expr);            \
        if (try_st_ != IGRAD_OK) return try_st_;    \
    } while (0)

/* ------------------------------------------------------------------------ */
/* small helpers                                                            */
/* ------------------------------------------------------------------------ */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static char *path_join(const char *dir, const char *file)
{
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, file);
    return p;
}

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* mkdir -p. @return 0 or -1 with errno. */
static int make_dirs(const char *path)
{
    char *p = malloc(strlen(path) + 1);
    if (!p) return -1;
    strcpy(p, path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            free(p);
            return -1;
        }
        *s = '/';
    }
    int r = mkdir(p, 0755);
    free(p);
    if (r != 0 && errno == EEXIST) {
        struct stat sb;
        if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return 0;
        errno = ENOTDIR;
        return -1;
    }
    return r;
}

/* trainer_fail() with the library's last error appended. */
static igrad_status_t lib_fail(igrad_status_t st, const char *what)
{
    return trainer_fail(st, "%s: %s", what, igrad_last_error());
}

/* Prefixes the current trainer message (copied first: trainer_fail writes
 * the buffer it would read). */
static igrad_status_t prefix_fail(igrad_status_t st, const char *prefix)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", trainer_last_error());
    return trainer_fail(st, "%s: %s", prefix, msg);
}

static igrad_status_t data_fail(const data_error_t *err)
{
    igrad_status_t st = IGRAD_E_INVALID;
    switch (err->status) {
    case DATA_E_IO: st = IGRAD_E_IO; break;
    case DATA_E_FORMAT: st = IGRAD_E_FORMAT; break;
    case DATA_E_EMPTY: st = IGRAD_E_INVALID; break;
    case DATA_E_NOMEM: st = IGRAD_E_NOMEM; break;
    case DATA_E_CORPUS: st = IGRAD_E_IO; break;
    default: break;
    }
    return trainer_fail(st, "data: %s", err->message);
}

uint64_t train_hash_floats(const float *x, int64_t n)
{
    return igrad__hash_bytes(IGRAD__HASH_SEED, x, (size_t)n * sizeof *x);
}

/* Every rank passes its own status; all ranks return the status of the
 * lowest failing rank, and its message (prefixed "rank r: " on the other
 * ranks). One all-gather of a fixed-size record, so no rank can be left
 * waiting while another gives up. */
static igrad_status_t agree(igrad_comm_t *comm, igrad_status_t st)
{
    int P = igrad_comm_size(comm), rank = igrad_comm_rank(comm);
    struct record {
        int32_t status;
        char msg[MSG_NBYTES];
    } mine;
    memset(&mine, 0, sizeof mine);
    mine.status = (int32_t)st;
    if (st != IGRAD_OK) snprintf(mine.msg, sizeof mine.msg, "%s", trainer_last_error());
    struct record *all = calloc((size_t)P, sizeof *all);
    if (!all) {
        /* Cannot even agree: the caller aborts (cmd_train uses MPI_Abort). */
        return trainer_fail(IGRAD_E_NOMEM, "out of memory while agreeing on a failure");
    }
    igrad_status_t cst = igrad_comm_allgather(comm, &mine, sizeof mine, all);
    if (cst != IGRAD_OK) {
        free(all);
        return lib_fail(cst, "agreeing across ranks");
    }
    igrad_status_t out = IGRAD_OK;
    for (int r = 0; r < P; r++) {
        if (all[r].status == IGRAD_OK) continue;
        out = (igrad_status_t)all[r].status;
        all[r].msg[MSG_NBYTES - 1] = '\0';
        if (r == rank) trainer_fail(out, "%s", all[r].msg);
        else trainer_fail(out, "rank %d: %s", r, all[r].msg);
        break;
    }
    free(all);
    return out;
}

/* ------------------------------------------------------------------------ */
/* agreement of the run-defining options                                    */
/* ------------------------------------------------------------------------ */

#define OPT_MAX 64
#define OPT_VALUE_NBYTES 120 /* shown value, truncated with "..." */

/* One option as compared across ranks: a hash of its full value and the
 * value as shown in the message. */
typedef struct opt_slot {
    uint64_t hash;
    char name[24];
    char value[OPT_VALUE_NBYTES];
} opt_slot_t;

typedef struct opt_list {
    int n;
    opt_slot_t slot[OPT_MAX];
} opt_list_t;


static void opt_add(opt_list_t *l, const char *name, const char *value)
{
    if (l->n >= OPT_MAX) abort(); /* a programming error: raise OPT_MAX */
    opt_slot_t *s = &l->slot[l->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    size_t len = strlen(value);
    s->hash = igrad__hash_bytes(igrad__hash_str(IGRAD__HASH_SEED, name), value, len);
    if (len < sizeof s->value) memcpy(s->value, value, len + 1);
    else snprintf(s->value, sizeof s->value, "%.*s...", (int)sizeof s->value - 4, value);
}

static void opt_add_i64(opt_list_t *l, const char *name, int64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%lld", (long long)v);
    opt_add(l, name, b);
}

/* NaN is how an option that was not given (its default depends on
 * --method, train_options_resolve) is kept until then. */
#define OPT_AUTO "(not given: the default for the method)"

static void opt_add_f64(opt_list_t *l, const char *name, double v)
{
    char b[40];
    snprintf(b, sizeof b, "%.17g", v);
    opt_add(l, name, isnan(v) ? OPT_AUTO : b);
}

/* Options added only when they differ from their default (so that the
 * options of runs from before they existed hash as they did): what a rank
 * that lacks one has. */
static const struct {
    const char *name, *absent;
} opt_absent[] = {
    {"--value-dtype", "F32"},
    {"--topology", "flat (the default)"},
    {"--allocation", "partition (the default)"},
    {"--ranks-per-node", "0 (the default: the nodes MPI reports)"},
    {"--dense-below", "0"},
    {"--link", "the default link (100g's bandwidth, latency 0)"},
    {"--auto-sparse-reduce", "0 (the default)"},
    {"--ef-on", "grad (the default)"},
    {"--early-density", "not given (--density from step 0)"},
};

static const char *opt_absent_value(const char *name)
{
    for (size_t i = 0; i < sizeof opt_absent / sizeof opt_absent[0]; i++)
        if (!strcmp(opt_absent[i].name, name)) return opt_absent[i].absent;
    return "(absent)";
}

static const opt_slot_t *opt_find(const opt_list_t *l, const char *name)
{
    for (int i = 0; i < l->n && i < OPT_MAX; i++)
        if (!strcmp(l->slot[i].name, name)) return &l->slot[i];
    return NULL;
}

static void opt_add_str(opt_list_t *l, const char *name, const char *v)
{
    opt_add(l, name, v ? v : "(not given)");
}

/* Every option that changes the run or its sequence of collectives, as
 * the command line names it. Not here, because they are legitimately
 * per rank: --threads, --progress, --log-every (each rank's own), --trace
 * and --overwrite (only rank 0 acts on them). */
static void run_defining_options(const train_options_t *o, opt_list_t *l)
{
    const model_config_t *mc = &o->model;
    l->n = 0;
    opt_add_str(l, "--init", o->init_dir ? "(given: compared by its parameters)" : NULL);
    opt_add_i64(l, "--layers", mc->n_layer);
    opt_add_i64(l, "--dim", mc->dim);
    opt_add_i64(l, "--heads", mc->n_head);
    opt_add_i64(l, "--kv-heads", mc->n_kv_head);
    opt_add_i64(l, "--ffn", mc->ffn_dim);
    opt_add_i64(l, "--size (vocab)", mc->vocab_size);
    opt_add_i64(l, "--size (max len)", mc->max_seq_len);
    opt_add_i64(l, "--tie", mc->tie_embeddings);
    opt_add_f64(l, "--rope-theta", mc->rope_theta);
    opt_add_f64(l, "--rms-eps", mc->rms_norm_eps);
    opt_add_f64(l, "--init-std", (double)o->init_std);
    opt_add_str(l, "--data", o->data);
    opt_add_i64(l, "--response-only", o->response_only);
    opt_add_f64(l, "--val-fraction", o->val_fraction);
    opt_add_i64(l, "--seq-len", o->seq_len);
    opt_add_i64(l, "--batch", o->batch);
    opt_add_i64(l, "--micro-batch", o->micro_batch);
    opt_add_i64(l, "--steps", o->steps);
    opt_add_i64(l, "--stop-at", o->stop_at);
    opt_add_f64(l, "--lr", o->optim.lr);
    opt_add_f64(l, "--min-lr", o->optim.min_lr);
    opt_add_i64(l, "--warmup", o->optim.warmup_steps);
    opt_add_f64(l, "--weight-decay", o->optim.weight_decay);
    opt_add_f64(l, "--clip", o->optim.grad_clip);
    if (o->beta1_auto) opt_add_str(l, "--beta1", "auto");
    else opt_add_f64(l, "--beta1", o->optim.beta1);
    opt_add_f64(l, "--beta2", o->optim.beta2);
    opt_add_f64(l, "eps", o->optim.eps);
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, o->seed);
    opt_add(l, "--seed", seed);
    opt_add_str(l, "--method", o->method);
    opt_add_str(l, "--sparsifier", o->sparsifier);
    opt_add_f64(l, "--density", o->density);
    opt_add_i64(l, "--release-period", o->release_period);
    opt_add_f64(l, "--release-keep", o->release_keep);
    opt_add_str(l, "--schedule", o->schedule);
    opt_add_str(l, "--residual", o->residual);
    opt_add_str(l, "--pack", o->pack);
    /* only when not F32 (the default before BF16) or left to the sparse
     * method's default: F32 and dense checkpoints of runs from before the
     * option resume */
    if (o->value_dtype_auto && !(o->method && igrad__name_equal(o->method, "dense")))
        opt_add(l, "--value-dtype", OPT_AUTO);
    else if (!o->value_dtype_auto && o->value_dtype != IGRAD_DTYPE_F32)
        opt_add_str(l, "--value-dtype", igrad_dtype_name(o->value_dtype));
    opt_add_i64(l, "--buckets", o->buckets);
    if (o->topology) opt_add_str(l, "--topology", o->topology); /* only when given, too */
    if (o->allocation) opt_add_str(l, "--allocation", o->allocation); /* only when given */
    if (o->ranks_per_node) opt_add_i64(l, "--ranks-per-node", o->ranks_per_node);
    if (o->dense_below) opt_add_i64(l, "--dense-below", o->dense_below);
    {
        /* only when not the default, too: auto's routes change the sums' order */
        const igrad_config_t d = IGRAD_CONFIG_INIT;
        if (o->link_latency_ns != d.link_latency_ns ||
            o->link_bandwidth_mbps != d.link_bandwidth_mbps) {
            char link[64];
            snprintf(link, sizeof link, "%lld ns, %lld Mbit/s", (long long)o->link_latency_ns,
                     (long long)o->link_bandwidth_mbps);
            opt_add(l, "--link", link);
        }
        if (o->auto_sparse_reduce) opt_add_i64(l, "--auto-sparse-reduce", 1);
    }
    opt_add_i64(l, "--verify-every", o->verify_every);
    opt_add_f64(l, "--comm-timeout", o->comm_timeout_s);
    opt_add_f64(l, "--target-ratio", o->target_ratio);
    opt_add_f64(l, "--momentum", o->momentum);
    if (o->start_iter < 0) opt_add(l, "--start-iter", OPT_AUTO);
    else opt_add_i64(l, "--start-iter", o->start_iter);
    /* only when given: checkpoints of runs before the option resume */
    if (o->ef_on_update) opt_add_str(l, "--ef-on", "update");
    if (o->early_steps > 0) { /* only when given, too */
        char b[64];
        snprintf(b, sizeof b, "%.17g:%lld", o->early_density, (long long)o->early_steps);
        opt_add(l, "--early-density", b);
    }
    if (!o->profile || train_profile_auto(o)) {
        opt_add_str(l, "--profile", o->profile);
        opt_add_i64(l, "--profile-steps", o->profile_steps);
        opt_add_str(l, "--profile-partition", o->profile_partition);
        opt_add_i64(l, "--reprofile-every", o->reprofile_every);
        opt_add_f64(l, "--reprofile-margin", o->reprofile_margin);
    } else {
        /* By content: the path may differ from host to host. */
        uint64_t h = 0, nbytes = 0;
        char b[64];
        if (checkpoint_file_hash(o->profile, &h, &nbytes) == IGRAD_OK)
            snprintf(b, sizeof b, "a file of %" PRIu64 " bytes, hash %016" PRIx64, nbytes, h);
        else
            snprintf(b, sizeof b, "an unreadable file");
        opt_add(l, "--profile", b);
    }
    opt_add_i64(l, "--eval-every", o->eval_every);
    opt_add_i64(l, "--eval-batches", o->eval_batches);
    opt_add_i64(l, "--save-every", o->save_every);
    opt_add_str(l, "--out", o->out);
    opt_add_i64(l, "--resume", o->resume);
}

/* Collective: one all-gather of a 64-bit hash of the options; only when
 * they differ, a second one of the options themselves, to name the first
 * that differs with both values. Every rank takes the same path (the
 * hashes are the same on every rank), so none is left waiting. */
static igrad_status_t agree_options(igrad_comm_t *comm, const train_options_t *o)
{
    int P = igrad_comm_size(comm);
    opt_list_t *mine = calloc(1, sizeof *mine);
    uint64_t *hashes = calloc((size_t)P, sizeof *hashes);
    igrad_status_t st = mine && hashes ? IGRAD_OK : trainer_fail(IGRAD_E_NOMEM, "out of memory");
    opt_list_t *all = NULL;
    if (st == IGRAD_OK) run_defining_options(o, mine);
    /* An allocation failure must not skip the collectives: agree first. */
    if ((st = agree(comm, st)) != IGRAD_OK) goto cleanup;
    uint64_t h = IGRAD__HASH_SEED;
    for (int i = 0; i < mine->n; i++) h = igrad__hash_bytes(h, &mine->slot[i].hash, sizeof(uint64_t));
    if ((st = igrad_comm_allgather(comm, &h, sizeof h, hashes)) != IGRAD_OK) {
        st = lib_fail(st, "comparing options across ranks");
        goto cleanup;
    }
    int same = 1;
    for (int q = 1; q < P; q++) same &= hashes[q] == hashes[0];
    if (same) goto cleanup;

    all = calloc((size_t)P, sizeof *all);
    st = all ? IGRAD_OK : trainer_fail(IGRAD_E_NOMEM, "out of memory");
    if ((st = agree(comm, st)) != IGRAD_OK) goto cleanup;
    if ((st = igrad_comm_allgather(comm, mine, sizeof *mine, all)) != IGRAD_OK) {
        st = lib_fail(st, "comparing options across ranks");
        goto cleanup;
    }
    st = trainer_fail(IGRAD_E_MISMATCH, "the ranks were started with different options "
                      "(hash %016" PRIx64 " on rank 0)", hashes[0]);
    /* By name, both ways: an option one rank lacks (given on the other
     * only) shows as its default. */
    for (int q = 1; q < P; q++) {
        for (int side = 0; side < 2; side++) {
            const opt_list_t *a = side ? &all[q] : &all[0], *b = side ? &all[0] : &all[q];
            for (int i = 0; i < a->n && i < OPT_MAX; i++) {
                char name[sizeof a->slot[i].name];
                snprintf(name, sizeof name, "%.*s", (int)sizeof name - 1, a->slot[i].name);
                const opt_slot_t *other = opt_find(b, name);
                if (other && other->hash == a->slot[i].hash) continue;
                char va[OPT_VALUE_NBYTES], vb[OPT_VALUE_NBYTES];
                snprintf(va, sizeof va, "%.*s", (int)sizeof va - 1, a->slot[i].value);
                snprintf(vb, sizeof vb, "%.*s", (int)sizeof vb - 1,
                         other ? other->value : opt_absent_value(name));
                st = trainer_fail(IGRAD_E_MISMATCH,
                                  "%s differs: rank 0 has %s, rank %d has %s (options that "
                                  "define the run must be the same on every rank)",
                                  name, side ? vb : va, q, side ? va : vb);
                goto cleanup;
            }
        }
    }
cleanup:
    free(all);
    free(hashes);
    free(mine);
    return st;
}

/* ------------------------------------------------------------------------ */
/* defaults                                                                 */
/* ------------------------------------------------------------------------ */

void train_options_default(train_options_t *o)
{
    memset(o, 0, sizeof *o);
    model_config_preset("tiny", &o->model);
    o->model_name = "tiny";
    o->init_std = 0.02f;
    o->val_fraction = 0.05;
    o->seq_len = 64;
    o->batch = 8;
    o->steps = 100;
    o->optim = optim_config_default();
    o->optim.lr = 1e-3;
    o->optim.min_lr = 1e-4;
    o->seed = 1337;
    o->method = "dense";
    o->density = NAN; /* auto: by method (train_options_resolve) */
    o->value_dtype_auto = 1;
    o->release_period = IGRAD_DEFAULT_RELEASE_PERIOD;
    o->dense_below = IGRAD_DEFAULT_DENSE_BELOW;
    o->release_keep = IGRAD_DEFAULT_RELEASE_KEEP;
    o->target_ratio = NAN;
    o->buckets = 4;
    {
        const igrad_config_t d = IGRAD_CONFIG_INIT;
        o->link_latency_ns = d.link_latency_ns;
        o->link_bandwidth_mbps = d.link_bandwidth_mbps;
        o->auto_sparse_reduce = d.auto_sparse_reduce;
    }
    o->verify_every = 100;
    o->comm_timeout_s = IGRAD_DEFAULT_TIMEOUT_S;
    o->beta1_auto = 1;
    o->momentum = NAN;
    o->start_iter = -1;
    o->eval_every = 50;
    o->eval_batches = 4;
    o->progress = TRAIN_PROGRESS_AUTO;
    o->profile_steps = 30;
    o->reprofile_margin = 0.05;
}

void train_options_resolve(train_options_t *o)
{
    int dense = o->method && igrad__name_equal(o->method, "dense");
    if (o->beta1_auto) o->optim.beta1 = dense ? TRAIN_DENSE_BETA1 : TRAIN_SPARSE_BETA1;
    o->beta1_auto = 0;
    if (isnan(o->momentum)) o->momentum = dense ? 0.0 : TRAIN_SPARSE_MOMENTUM;
    if (o->start_iter < 0) o->start_iter = dense ? 0 : TRAIN_SPARSE_START_ITER;
    if (isnan(o->density)) o->density = dense ? TRAIN_DENSE_DENSITY : TRAIN_SPARSE_DENSITY;
    if (o->value_dtype_auto) o->value_dtype = dense ? IGRAD_DTYPE_F32 : TRAIN_SPARSE_VALUE_DTYPE;
    o->value_dtype_auto = 0;
    if (isnan(o->target_ratio)) {
        /* --target-ratio not given: ig aims at the library's default share of
         * its sparsifier's *_sync payload (the method's promise; the Python
         * binding reads the same getter), unless --release-keep is given
         * (then the profile's set and that kappa). Other methods: 0. */
        int ig = o->method && igrad__name_equal(o->method, "ig");
        o->target_ratio = ig && !o->release_keep_given ? igrad_ig_default_target_ratio() : 0.0;
    }
}

/* ------------------------------------------------------------------------ */
/* the run's state                                                          */
/* ------------------------------------------------------------------------ */

typedef struct run {
    const train_options_t *o;
    igrad_comm_t *comm;
    int rank, P;
    int B, M, T, G;           /* rows per rank, per micro-batch, seq len, global batch */
    model_t *model;
    optim_t *opt;
    optim_config_t ocfg;
    dataset_t ds;
    igrad_layout_t *layout;
    igrad_profile_t *profile;
    igrad_config_t scfg;
    igrad_engine_t *engine;
    igrad_engine_t *early_engine; /* --early-density: the early phase's engine, between
                                 the switch and the next sync (its residuals) */
    double early_switch_ms;   /* --early-density: the switch's engine create (NaN: none) */
    igrad_trace_t *trace;     /* rank 0 only, with opts->trace */
    char *trace_prefix;       /* rows of an earlier invocation's trace (resume) */
    metrics_t *metrics;       /* rank 0 only */
    float **grad_ptrs;        /* (n_tensors) into model->grads */
    float *acc;               /* (num_params) micro-batch accumulation, when needed */
    int *inputs, *targets;    /* (B*T) */
    int *vin, *vtg;           /* (M*T) validation rows */
    char *ckpt_dir;           /* out/checkpoint */
    int64_t start_step;
    train_state_t state;      /* the checkpoint resumed from, as its train_state.json
                                 records it (version 1: files without checksums) */
    double f_imp;
    igrad_target_fit_t target; /* --target-ratio's choice (zero when off) */
    double t_start_ms;
    double last_val[5];       /* loss, ppl, acc, task accuracy, task problems of the
                                 last evaluation */
    int beta1_was_auto;       /* --beta1 not given (resolved by method) */
    int tty;
    int online_written;       /* --profile auto: out/profile.json written */
    cJSON *reprofile_log;     /* --reprofile-every: one entry per re-profile */
    int64_t reprofiles_seen;
    cJSON *sar_balance;       /* steps with sparse all-reduce buckets: the busiest
                                 owner's entries over the mean (stats), per step */
} run_t;

/* ------------------------------------------------------------------------ */
/* synchronization config                                                   */
/* ------------------------------------------------------------------------ */

static igrad_status_t sync_config(const train_options_t *o, igrad_config_t *cfg)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    igrad_status_t st;
    if ((st = igrad_method_from_name(o->method, &c.method)) != IGRAD_OK)
        return lib_fail(st, "--method");
    if (o->sparsifier && (st = igrad_sparsifier_from_name(o->sparsifier, &c.sparsifier)) != IGRAD_OK)
        return lib_fail(st, "--sparsifier");
    c.density = o->density;
    c.release_period = o->release_period;
    c.release_keep = o->release_keep;
    if (o->schedule && (st = igrad_schedule_from_name(o->schedule, &c.schedule)) != IGRAD_OK)
        return lib_fail(st, "--schedule");
    if (o->residual && (st = igrad_residual_policy_from_name(o->residual, &c.residual)) != IGRAD_OK)
        return lib_fail(st, "--residual");
    if (o->pack && (st = igrad_pack_policy_from_name(o->pack, &c.pack)) != IGRAD_OK)
        return lib_fail(st, "--pack");
    c.buckets = o->buckets;
    if (o->topology && (st = igrad_topology_from_name(o->topology, &c.topology)) != IGRAD_OK)
        return lib_fail(st, "--topology");
    if (o->allocation) {
        if (!strcmp(o->allocation, "budget")) c.allocation = IGRAD_ALLOCATION_BUDGET;
        else if (strcmp(o->allocation, "partition") != 0)
            return trainer_fail(IGRAD_E_INVALID, "--allocation %s (partition, budget)",
                                o->allocation);
    }
    c.ranks_per_node = o->ranks_per_node;
    c.dense_below = o->dense_below;
    c.link_latency_ns = o->link_latency_ns;
    c.link_bandwidth_mbps = o->link_bandwidth_mbps;
    c.auto_sparse_reduce = o->auto_sparse_reduce;
    c.verify_every = o->verify_every;
    c.timeout_s = o->comm_timeout_s;
    c.threads = o->threads;
    if (train_profile_auto(o) && (c.method == IGRAD_METHOD_IAD || c.method == IGRAD_METHOD_IG)) {
        c.profile_steps = o->profile_steps; /* other methods: refused in setup, by name */
        c.profile_partition = o->profile_partition;
        if (c.method == IGRAD_METHOD_IG) c.target_ratio = o->target_ratio;
        c.reprofile_every = o->reprofile_every;
        c.reprofile_margin = o->reprofile_margin;
    }
    /* the budget allocation plans a profile file's bytes at create, too */
    if (c.allocation == IGRAD_ALLOCATION_BUDGET && c.method == IGRAD_METHOD_IG)
        c.target_ratio = o->target_ratio > 0.0 ? o->target_ratio : 0.0;
    if (c.method == IGRAD_METHOD_DENSE && (o->momentum > 0.0 || o->start_iter > 0))
        return trainer_fail(IGRAD_E_INVALID,
                            "--momentum and --start-iter act on error "
                            "feedback: method dense has none (use a sparse --method)");
    if (o->early_steps > 0) {
        /* The residuals move to the new engine through the gradients; a
         * velocity or a profile's plan would not (iad/ig fit their plan,
         * --profile auto its window, to one density). */
        if (c.method != IGRAD_METHOD_TOPK_SYNC && c.method != IGRAD_METHOD_ADTOPK_SYNC)
            return trainer_fail(IGRAD_E_INVALID, "--early-density is for topk_sync and "
                                "adtopk_sync, not --method %s", o->method);
        if (!(o->early_density > 0.0 && o->early_density <= 1.0))
            return trainer_fail(IGRAD_E_INVALID, "--early-density: the density %g is not in "
                                "(0, 1]", o->early_density);
        if (o->momentum > 0.0)
            return trainer_fail(IGRAD_E_INVALID, "--early-density with --momentum: the "
                                "velocities would be lost at the switch");
        if (o->early_steps >= o->steps)
            return trainer_fail(IGRAD_E_INVALID, "--early-density %g:%lld: the switch step is "
                                "not before --steps %lld", o->early_density,
                                (long long)o->early_steps, (long long)o->steps);
    }
    c.momentum = o->momentum;
    c.start_iter = o->start_iter;
    c.value_dtype = o->value_dtype;
    if ((st = igrad_config_validate(&c)) != IGRAD_OK) return lib_fail(st, "sync config");
    *cfg = c;
    return IGRAD_OK;
}

/* The sparsifier whose selections the method sends (none for dense). */
static igrad_sparsifier_t method_sparsifier(const igrad_config_t *c)
{
    switch (c->method) {
    case IGRAD_METHOD_DENSE: return IGRAD_SPARSIFIER_NONE;
    case IGRAD_METHOD_TOPK_SYNC: return IGRAD_SPARSIFIER_TOPK;
    case IGRAD_METHOD_ADTOPK_SYNC: return IGRAD_SPARSIFIER_ADTOPK;
    default: return c->sparsifier;
    }
}

/* --map FILE: the model's layout remapped by the user's name rules. Every
 * rank must give the same rules; a layout with a map hashes its (layer,
 * kind) assignment, so the engine's layout agreement refuses rules that
 * map differently on two ranks. */
static igrad_status_t apply_name_map(run_t *r, const char *path)
{
    igrad_name_map_t *map = NULL;
    igrad_status_t st = igrad_name_map_load(path, &map);
    if (st != IGRAD_OK) return lib_fail(st, "--map");
    igrad_layout_t *mapped = NULL;
    st = igrad_layout_remap(r->layout, map, &mapped);
    igrad_name_map_free(map);
    if (st != IGRAD_OK) return lib_fail(st, "--map");
    igrad_layout_free(r->layout);
    r->layout = mapped;
    return IGRAD_OK;
}

/* --target-ratio: the important set and kappa from the profile's scores
 * (igrad_target_fit), applied to the loaded profile and the sync config
 * before the engine exists. The same on every rank (a pure function of
 * agreed inputs; the engine's agreement checks the result). */
static igrad_status_t fit_target(run_t *r)
{
    const train_options_t *o = r->o;
    if (r->scfg.method != IGRAD_METHOD_IG)
        return trainer_fail(IGRAD_E_INVALID, "--target-ratio needs --method ig (not %s)",
                            o->method);
    if (!(o->target_ratio > 0.0 && o->target_ratio <= 1.0))
        return trainer_fail(IGRAD_E_INVALID, "--target-ratio %g must be in (0, 1]",
                            o->target_ratio);
    if (!r->profile) return IGRAD_OK; /* --profile auto: the engine fits when it switches */
    igrad_status_t st = igrad_target_fit(r->layout, r->profile, &r->scfg, o->target_ratio,
                                         IGRAD_TARGET_MIN_KEEP, &r->target);
    if (st != IGRAD_OK) return lib_fail(st, "--target-ratio");
    if ((st = igrad_profile_set_threshold(r->profile, r->target.tau)) != IGRAD_OK)
        return lib_fail(st, "--target-ratio");
    r->scfg.release_keep = r->target.release_keep;
    if (r->rank == 0) {
        fprintf(stderr,
                "train: --target-ratio %g: %zu of %zu gated components important (tau %.6g), "
                "kappa %.6g, f_imp %.4f, planned ratio %.4f (model %.4f)%s\n",
                o->target_ratio, r->target.n_important, r->target.n_gated, r->target.tau,
                r->target.release_keep, r->target.f_imp, r->target.ratio,
                r->target.model_ratio,
                r->target.met ? "" : " -- NOT met: even no important component at the "
                                     "smallest kappa sends more");
    }
    return IGRAD_OK;
}

/* f_imp: the share of the sparsifier's per-step budget that goes to
 * tensors sent every step (important components and OTHER tensors, which
 * are never deferred; EMB/HEAD/NORM too when the profile lacks them). The payload ratio to *_sync is about
 * f_imp + kappa * (1 - f_imp) (NOTES.md). */
static double compute_f_imp(const igrad_layout_t *layout, const igrad_profile_t *profile,
                            igrad_sparsifier_t sp, double density)
{
    double every = 0.0, all = 0.0;
    for (size_t t = 0; t < igrad_layout_count(layout); t++) {
        igrad_tensor_info_t ti;
        igrad_select_spec_t spec;
        if (igrad_layout_tensor(layout, t, &ti) != IGRAD_OK ||
            igrad_select_spec(sp, density, 1.0, 0, 0, ti.ndim, ti.shape, &spec) != IGRAD_OK)
            return NAN;
        all += (double)spec.count;
        if (ti.kind == IGRAD_KIND_OTHER ||
            igrad_profile_is_important(profile, ti.layer, ti.kind) != 0)
            every += (double)spec.count;
    }
    return all > 0 ? every / all : NAN;
}

/* ------------------------------------------------------------------------ */
/* resume state (train_state.json)                                          */
/* ------------------------------------------------------------------------ */

static void engine_file_name(char *buf, size_t cap, int rank)
{
    snprintf(buf, cap, "engine.rank%d.bin", rank);
}

/* The last file of a save: what the others are (`engine` holds every
 * rank's engine file hash and size, gathered by the caller; the others are
 * hashed here, as written). */
static igrad_status_t write_state(const run_t *r, const char *dir, int64_t next_step,
                                  const uint64_t *engine)
{
    const train_options_t *o = r->o;
    static const char *const own[] = {CHECKPOINT_CONFIG_FILE, CHECKPOINT_MODEL_FILE,
                                      CHECKPOINT_OPTIM_FILE};
    enum { NOWN = sizeof own / sizeof own[0] };
    char *path = path_join(dir, TRAIN_STATE_FILE);
    train_state_t s = {
        .version = TRAIN_STATE_VERSION,
        .step = next_step,
        .ranks = r->P,
        .batch = r->G,
        .seq_len = r->T,
        .seed = o->seed,
        .data = (char *)o->data, /* borrowed: not freed below */
        .method = (char *)igrad_method_name(r->scfg.method),
        .param_hash = train_hash_floats(r->model->params, r->model->num_params),
        .ef_on_update = o->ef_on_update,
        /* step x batch, left out in the (unreachable) case of more than 2^53 */
        .has_sequences_consumed = next_step <= (INT64_C(1) << 53) / r->G,
        .sequences_consumed = next_step <= (INT64_C(1) << 53) / r->G ? next_step * r->G : 0,
        .has_steps = 1, .steps = o->steps,
        .has_optimizer_step = 1, .optimizer_step = r->opt->step,
        .has_engine_step = 1, .engine_step = igrad_engine_step(r->engine),
        .nfiles = NOWN + r->P,
        .files = calloc((size_t)NOWN + (size_t)r->P, sizeof(train_state_file_t)),
    };
    igrad_status_t st = IGRAD_OK;
    if (!path || !s.files) {
        st = trainer_fail(IGRAD_E_NOMEM, "checkpoint: out of memory");
        goto cleanup;
    }
    for (int i = 0; i < NOWN; i++) {
        char *p = path_join(dir, own[i]);
        st = p ? checkpoint_file_hash(p, &s.files[i].hash, &s.files[i].nbytes)
               : trainer_fail(IGRAD_E_NOMEM, "out of memory");
        free(p);
        if (st != IGRAD_OK) goto cleanup;
        snprintf(s.files[i].name, sizeof s.files[i].name, "%s", own[i]);
    }
    for (int q = 0; q < r->P; q++) {
        train_state_file_t *f = &s.files[NOWN + q];
        engine_file_name(f->name, sizeof f->name, q);
        f->hash = engine[2 * q];
        f->nbytes = engine[2 * q + 1];
    }
    st = train_state_write(path, &s);
cleanup:
    free(s.files); /* data and method are borrowed */
    free(path);
    return st;
}

/* Reads the checkpoint's state (train_state.c checks the file itself) and
 * checks that this run continues it. */
static igrad_status_t read_state(run_t *r, const char *dir, int64_t *next_step)
{
    const train_options_t *o = r->o;
    char *path = path_join(dir, TRAIN_STATE_FILE);
    if (!path) return trainer_fail(IGRAD_E_NOMEM, "out of memory");
    train_state_t *s = &r->state;
    igrad_status_t st = train_state_read(path, s);
    if (st != IGRAD_OK) {
        st = prefix_fail(st, "--resume");
        goto cleanup;
    }
    if (s->version < 2 && r->rank == 0)
        fprintf(stderr, "igrad: train: warning: %s was written by an older igrad (version 1): "
                "its files have no checksums; only the parameter hash and the steps are "
                "checked\n", path);
    /* What decides the data stream, the residuals and the update must be
     * the same, or "continue exactly" would be a lie. */
    if (s->ranks != r->P)
        st = trainer_fail(IGRAD_E_MISMATCH,
                          "--resume: the checkpoint has engine state for %lld ranks, this run "
                          "has %d", (long long)s->ranks, r->P);
    else if (strcmp(s->data, o->data) != 0)
        st = trainer_fail(IGRAD_E_MISMATCH, "--resume: the checkpoint was trained on --data "
                          "%s, this run has %s", s->data, o->data);
    else if (s->batch != r->G || s->seq_len != r->T)
        st = trainer_fail(IGRAD_E_MISMATCH, "--resume: the checkpoint has --batch %lld "
                          "--seq-len %lld, this run has %d and %d", (long long)s->batch,
                          (long long)s->seq_len, r->G, r->T);
    else if (s->seed != o->seed)
        st = trainer_fail(IGRAD_E_MISMATCH, "--resume: the checkpoint has --seed %" PRIu64
                          ", this run has %" PRIu64, s->seed, o->seed);
    else if (strcmp(s->method, igrad_method_name(r->scfg.method)) != 0)
        st = trainer_fail(IGRAD_E_MISMATCH, "--resume: the checkpoint used --method %s, this "
                          "run has %s", s->method, igrad_method_name(r->scfg.method));
    else if (s->ef_on_update)
        st = trainer_fail(IGRAD_E_UNSUPPORTED, "--resume: the checkpoint was trained with "
                          "--ef-on update, whose AdamW moments are per rank and not saved in "
                          "it: it cannot be resumed exactly (start a new run from it with "
                          "--init)");
    else
        *next_step = s->step;
cleanup:
    free(path);
    return st;
}

/* Resume: the file `name` of the checkpoint against the size and checksum
 * train_state.json records for it (a version 1 state has none). */
static igrad_status_t verify_file(const run_t *r, const char *name)
{
    if (r->state.version < 2) return IGRAD_OK;
    const train_state_file_t *f = NULL;
    for (int i = 0; i < r->state.nfiles && !f; i++)
        if (!strcmp(r->state.files[i].name, name)) f = &r->state.files[i];
    if (!f)
        return trainer_fail(IGRAD_E_FORMAT, "--resume: %s/%s records no checksum for %s",
                            r->ckpt_dir, TRAIN_STATE_FILE, name);
    char *p = path_join(r->ckpt_dir, name);
    if (!p) return trainer_fail(IGRAD_E_NOMEM, "out of memory");
    uint64_t h = 0, nbytes = 0;
    igrad_status_t st = checkpoint_file_hash(p, &h, &nbytes);
    if (st != IGRAD_OK) {
        st = prefix_fail(st, "--resume");
    } else if (h != f->hash || nbytes != f->nbytes) {
        st = trainer_fail(IGRAD_E_MISMATCH,
                          "--resume: %s is not the file this checkpoint was saved with: %" PRIu64
                          " bytes, checksum %016" PRIx64 "; %s records %" PRIu64 " bytes, %016"
                          PRIx64 " (changed, corrupt, or copied from another save or run)",
                          p, nbytes, h, TRAIN_STATE_FILE, f->nbytes, f->hash);
    }
    free(p);
    return st;
}

/* ------------------------------------------------------------------------ */
/* activity trace (rank 0)                                                  */
/* ------------------------------------------------------------------------ */

/* A resumed run records only its own steps; the rows an earlier
 * invocation saved for steps before the resume step are kept as text and
 * written in front of the new ones, so the file covers the whole run. */
static igrad_status_t trace_keep_prefix(run_t *r)
{
    FILE *fp = fopen(r->o->trace, "rb");
    if (!fp) return IGRAD_OK; /* nothing recorded yet */
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap), *line = NULL;
    size_t lcap = 0;
    ssize_t n;
    int header_seen = 0;
    if (!out) {
        fclose(fp);
        return trainer_fail(IGRAD_E_NOMEM, "out of memory");
    }
    while ((n = getline(&line, &lcap, fp)) >= 0) {
        if (line[0] == '#') continue;
        if (!header_seen) {
            header_seen = 1;
            continue;
        }
        if (strtoll(line, NULL, 10) >= r->start_step) continue;
        if (len + (size_t)n + 1 > cap) {
            cap = 2 * (len + (size_t)n + 1);
            char *p = realloc(out, cap);
            if (!p) {
                free(out);
                free(line);
                fclose(fp);
                return trainer_fail(IGRAD_E_NOMEM, "out of memory");
            }
            out = p;
        }
        memcpy(out + len, line, (size_t)n);
        len += (size_t)n;
    }
    out[len] = '\0';
    free(line);
    fclose(fp);
    r->trace_prefix = out;
    return IGRAD_OK;
}

static igrad_status_t trace_save(run_t *r)
{
    if (!r->trace) return IGRAD_OK;
    igrad_status_t st = igrad_trace_save(r->trace, r->o->trace);
    if (st != IGRAD_OK) return lib_fail(st, "--trace");
    if (!r->trace_prefix || !r->trace_prefix[0]) return IGRAD_OK;
    /* Splice the earlier rows in after the comment and header lines. */
    FILE *fp = fopen(r->o->trace, "rb");
    if (!fp) return trainer_fail(IGRAD_E_IO, "%s: %s", r->o->trace, strerror(errno));
    size_t cap = strlen(r->trace_prefix) + (1 << 16), len = 0;
    char *out = malloc(cap), *line = NULL;
    size_t lcap = 0;
    ssize_t n;
    int header_done = 0;
    if (!out) {
        fclose(fp);
        return trainer_fail(IGRAD_E_NOMEM, "out of memory");
    }
    out[0] = '\0';
    while ((n = getline(&line, &lcap, fp)) >= 0) {
        size_t need = len + (size_t)n + (header_done ? 0 : strlen(r->trace_prefix)) + 1;
        if (need > cap) {
            cap = 2 * need;
            char *p = realloc(out, cap);
            if (!p) {
                st = trainer_fail(IGRAD_E_NOMEM, "out of memory");
                break;
            }
            out = p;
        }
        memcpy(out + len, line, (size_t)n);
        len += (size_t)n;
        out[len] = '\0';
        if (!header_done && line[0] != '#') {
            header_done = 1;
            size_t pl = strlen(r->trace_prefix);
            memcpy(out + len, r->trace_prefix, pl + 1);
            len += pl;
        }
    }
    free(line);
    fclose(fp);
    if (st == IGRAD_OK) st = metrics_write_text(r->o->trace, out);
    free(out);
    return st;
}

/* ------------------------------------------------------------------------ */
/* setup                                                                    */
/* ------------------------------------------------------------------------ */

/* Rank 0, before anything reads the output directory: restore a checkpoint
 * caught between a save's two renames, remove what dead saves left, and
 * refuse a fresh run into an --out that holds a checkpoint (it would be
 * replaced, and metrics.csv with it) unless --overwrite. */
static igrad_status_t prepare_out(run_t *r)
{
    const train_options_t *o = r->o;
    int recovered = 0;
    TRY(checkpoint_tidy(r->ckpt_dir, TRAIN_STATE_FILE, &recovered));
    if (o->resume || o->overwrite || !file_exists(r->ckpt_dir)) return IGRAD_OK;
    return trainer_fail(IGRAD_E_INVALID,
                        "--out %s already holds a checkpoint (%s): pass --resume to continue "
                        "that run, or --overwrite to replace it and its metrics", o->out,
                        r->ckpt_dir);
}

static igrad_status_t check_options(const train_options_t *o, int P)
{
    if (!o->data || !o->data[0]) return trainer_fail(IGRAD_E_INVALID, "--data is required");
    if (!o->out || !o->out[0]) return trainer_fail(IGRAD_E_INVALID, "--out is required");
    if (o->steps < 1) return trainer_fail(IGRAD_E_INVALID, "--steps must be >= 1");
    if (o->seq_len < 1) return trainer_fail(IGRAD_E_INVALID, "--seq-len must be >= 1");
    if (o->batch < 1) return trainer_fail(IGRAD_E_INVALID, "--batch must be >= 1");
    if (o->batch % P != 0)
        return trainer_fail(IGRAD_E_INVALID,
                            "--batch %d is not divisible by the number of ranks %d (the global "
                            "batch is split evenly over ranks)", o->batch, P);
    int B = o->batch / P;
    if (o->micro_batch < 0 || (o->micro_batch > 0 && B % o->micro_batch != 0))
        return trainer_fail(IGRAD_E_INVALID,
                            "--micro-batch %d must divide the %d rows per rank (--batch %d / %d "
                            "ranks)", o->micro_batch, B, o->batch, P);
    if (o->eval_batches < 1) return trainer_fail(IGRAD_E_INVALID, "--eval-batches must be >= 1");
    if (o->eval_every < 0 || o->save_every < 0 || o->stop_at < 0)
        return trainer_fail(IGRAD_E_INVALID,
                            "--eval-every, --save-every and --stop-at must be >= 0");
    if (!(o->optim.lr > 0) || !(o->optim.min_lr >= 0) || o->optim.warmup_steps < 0)
        return trainer_fail(IGRAD_E_INVALID, "--lr must be > 0, --min-lr >= 0, --warmup >= 0");
    return IGRAD_OK;
}

/* Model and optimizer: from the checkpoint (resume), --init, or fresh. */
static igrad_status_t setup_model(run_t *r)
{
    const train_options_t *o = r->o;
    igrad_status_t st;
    const char *from = o->resume ? r->ckpt_dir : o->init_dir;
    if (from) {
        st = checkpoint_load_model(from, &r->model);
        if (st != IGRAD_OK) return prefix_fail(st, o->resume ? "--resume" : "--init");
        uint64_t h = train_hash_floats(r->model->params, r->model->num_params);
        if (o->resume && h != r->state.param_hash)
            return trainer_fail(IGRAD_E_MISMATCH,
                                "--resume: %s/%s: the loaded parameters hash to %016" PRIx64
                                ", %s records %016" PRIx64 " (not the model of this "
                                "checkpoint)", from, CHECKPOINT_MODEL_FILE, h, TRAIN_STATE_FILE,
                                r->state.param_hash);
        if (r->T > r->model->config.max_seq_len)
            return trainer_fail(IGRAD_E_INVALID,
                                "--seq-len %d is longer than the model's "
                                "max_position_embeddings %d (%s/config.json)",
                                r->T, r->model->config.max_seq_len, from);
    } else {
        model_config_t cfg = o->model;
        if (cfg.max_seq_len < r->T) cfg.max_seq_len = r->T; /* only the RoPE table grows */
        st = model_create(&cfg, &r->model);
        if (st != IGRAD_OK) return prefix_fail(st, "model");
        model_init_random(r->model, o->seed, o->init_std);
    }
    r->ocfg = o->optim;
    r->ocfg.total_steps = o->steps;
    st = optim_create_for_model(&r->ocfg, r->model, &r->opt);
    if (st != IGRAD_OK) return prefix_fail(st, "optimizer");
    if (o->resume) {
        char *p = path_join(r->ckpt_dir, CHECKPOINT_OPTIM_FILE);
        if (!p) return trainer_fail(IGRAD_E_NOMEM, "out of memory");
        st = checkpoint_load_optim(p, r->model, r->opt);
        if (st == IGRAD_OK && r->opt->step != r->start_step)
            st = trainer_fail(IGRAD_E_MISMATCH,
                              "%s has taken %lld steps, but %s/%s says the run is at step %lld "
                              "(edited, or the files come from different saves)", p,
                              (long long)r->opt->step, r->ckpt_dir, TRAIN_STATE_FILE,
                              (long long)r->start_step);
        free(p);
        if (st != IGRAD_OK) return prefix_fail(st, "--resume");
    }
    return IGRAD_OK;
}

static igrad_status_t setup_data(run_t *r)
{
    const train_options_t *o = r->o;
    data_options_t dopt = DATA_OPTIONS_INIT;
    data_error_t err;
    dopt.seq_len = r->T;
    dopt.val_fraction = o->val_fraction;
    dopt.seed = o->seed;
    dopt.response_only = o->response_only;
    dopt.val_max_seqs = (size_t)o->eval_batches * (size_t)r->G;
    if (dataset_load(&r->ds, o->data, &dopt, &err) != DATA_OK) return data_fail(&err);
    if (o->val_fraction > 0 && r->ds.nval_seqs == 0)
        return trainer_fail(IGRAD_E_INVALID, "data: %s: no validation sequences", o->data);
    return IGRAD_OK;
}

static igrad_status_t setup_buffers(run_t *r)
{
    model_t *m = r->model;
    r->grad_ptrs = calloc((size_t)m->n_tensors, sizeof *r->grad_ptrs);
    r->inputs = malloc((size_t)r->B * r->T * sizeof *r->inputs);
    r->targets = malloc((size_t)r->B * r->T * sizeof *r->targets);
    r->vin = malloc((size_t)r->M * r->T * sizeof *r->vin);
    r->vtg = malloc((size_t)r->M * r->T * sizeof *r->vtg);
    if (!r->grad_ptrs || !r->inputs || !r->targets || !r->vin || !r->vtg)
        return trainer_fail(IGRAD_E_NOMEM, "out of memory for the batch buffers");
    model_tensor_pointers(m, m->grads, r->grad_ptrs);
    return IGRAD_OK;
}

/* Local part of the setup, before the engine: anything here may fail on
 * one rank only, so the caller agrees on the result afterwards. */
static igrad_status_t setup_local(run_t *r)
{
    const train_options_t *o = r->o;
    igrad_status_t st;
    TRY(check_options(o, r->P));
    TRY(sync_config(o, &r->scfg));
    if (o->trace && method_sparsifier(&r->scfg) == IGRAD_SPARSIFIER_NONE)
        return trainer_fail(IGRAD_E_INVALID,
                            "--trace records the sparsifier's selections: use it with "
                            "topk_sync, adtopk_sync, iad or ig, not dense");
    if (o->resume && o->ef_on_update)
        return trainer_fail(IGRAD_E_INVALID,
                            "--resume with --ef-on update: each rank's AdamW moments are its "
                            "own there, and a checkpoint saves only rank 0's, so the run "
                            "could not continue exactly (start a new run with --init)");
    if (o->resume) {
        char *state = path_join(r->ckpt_dir, TRAIN_STATE_FILE);
        int ok = state && file_exists(state);
        free(state);
        if (!ok)
            return trainer_fail(IGRAD_E_IO, "--resume: no checkpoint in %s (expected %s/%s)",
                                o->out, r->ckpt_dir, TRAIN_STATE_FILE);
        TRY(read_state(r, r->ckpt_dir, &r->start_step));
        /* Every file against its checksum before any is trusted; the
         * engine file now too, so that no rank enters the collective load
         * with a file another save wrote. */
        char engine[64];
        engine_file_name(engine, sizeof engine, r->rank);
        TRY(verify_file(r, CHECKPOINT_CONFIG_FILE));
        TRY(verify_file(r, CHECKPOINT_MODEL_FILE));
        TRY(verify_file(r, CHECKPOINT_OPTIM_FILE));
        TRY(verify_file(r, engine));
    }
    TRY(setup_model(r));
    TRY(setup_data(r));
    TRY(setup_buffers(r));
    if ((st = model_layout(r->model, &r->layout)) != IGRAD_OK) return prefix_fail(st, "layout");
    if (o->name_map) TRY(apply_name_map(r, o->name_map));
    if (r->rank == 0) {
        char *unmapped = NULL;
        if (igrad_layout_unmapped_report(r->layout, 8, &unmapped) == IGRAD_OK && unmapped)
            fprintf(stderr, "igrad: train: warning: %s\n", unmapped);
        igrad_free(unmapped);
    }

    int needs_profile = r->scfg.method == IGRAD_METHOD_IAD || r->scfg.method == IGRAD_METHOD_IG;
    if (needs_profile && !o->profile)
        return trainer_fail(IGRAD_E_INVALID,
                            "--method %s needs --profile FILE (build one with `igrad profile` "
                            "from a --trace of an adtopk_sync or topk_sync run) or --profile "
                            "auto", o->method);
    if (train_profile_auto(o) && !needs_profile)
        return trainer_fail(IGRAD_E_INVALID,
                            "--profile auto profiles online for iad and ig; --method %s uses no "
                            "profile", o->method);
    if (o->reprofile_every != 0 && !train_profile_auto(o))
        return trainer_fail(IGRAD_E_INVALID,
                            "--reprofile-every %lld re-profiles an online profile; it needs "
                            "--profile auto",
                            (long long)o->reprofile_every);
    if (o->profile && !train_profile_auto(o)) {
        st = igrad_profile_load(o->profile, r->layout, &r->profile);
        if (st == IGRAD_E_MISMATCH)
            return trainer_fail(st, "--profile %s was made for another model: %s", o->profile,
                                igrad_last_error());
        if (st != IGRAD_OK) return lib_fail(st, "--profile");
    }
    if (o->target_ratio != 0.0) TRY(fit_target(r));
    r->f_imp = NAN;
    if (r->profile && method_sparsifier(&r->scfg) != IGRAD_SPARSIFIER_NONE)
        r->f_imp = compute_f_imp(r->layout, r->profile, method_sparsifier(&r->scfg),
                                 r->scfg.density);
    return IGRAD_OK;
}

/* A profile records the sparsifier and density of the trace it was built
 * from; importance measured at another density (or by another sparsifier)
 * may not be what this run would measure. A warning: it still works. */
static void warn_profile(const run_t *r)
{
    igrad_sparsifier_t sp = method_sparsifier(&r->scfg);
    if (sp == IGRAD_SPARSIFIER_NONE) return;
    const char *psp = igrad_profile_sparsifier(r->profile);
    double pd = igrad_profile_density(r->profile);
    const char *rsp = igrad_sparsifier_name(sp);
    int sp_differs = psp && psp[0] && strcmp(psp, "unknown") != 0 && strcmp(psp, rsp) != 0;
    int d_differs = pd > 0 && fabs(pd - r->scfg.density) > 1e-9 * fmax(pd, r->scfg.density);
    if (!sp_differs && !d_differs) return;
    fprintf(stderr, "igrad: train: warning: --profile %s was made with sparsifier %s at density "
            "%g; this run uses %s at density %g (importance may differ at another budget)\n",
            r->o->profile, psp && psp[0] ? psp : "unknown", pd, rsp, r->scfg.density);
}

/* Rank 0's files: metrics, trace. */
static igrad_status_t setup_rank0(run_t *r)
{
    const train_options_t *o = r->o;
    igrad_status_t st;
    /* Created only now, so a run that fails in setup leaves nothing. */
    if (make_dirs(o->out) != 0)
        return trainer_fail(IGRAD_E_IO, "--out %s: cannot create directory: %s", o->out,
                            strerror(errno));
    /* --overwrite: the old checkpoint goes now, not at the first save, so
     * that it never sits next to this run's metrics. */
    if (!o->resume && o->overwrite && file_exists(r->ckpt_dir)) {
        TRY(checkpoint_remove(r->ckpt_dir));
        if (o->progress != TRAIN_PROGRESS_QUIET)
            printf("train: --overwrite: removed the previous checkpoint %s\n", r->ckpt_dir);
    }
    st = metrics_open(o->out, igrad_method_name(r->scfg.method), o->resume ? r->start_step : -1,
                      &r->metrics);
    if (st != IGRAD_OK) return st;
    if (o->trace) {
        igrad_sparsifier_t sp = method_sparsifier(&r->scfg);
        if ((st = igrad_trace_create(r->layout, &r->trace)) != IGRAD_OK ||
            (st = igrad_trace_set_sparsifier(r->trace, sp, r->scfg.density)) != IGRAD_OK)
            return lib_fail(st, "--trace");
        if (o->resume) TRY(trace_keep_prefix(r));
    }
    return IGRAD_OK;
}

static void run_free(run_t *r)
{
    cJSON_Delete(r->reprofile_log);
    cJSON_Delete(r->sar_balance);
    igrad_engine_free(r->early_engine);
    igrad_engine_free(r->engine);
    igrad_trace_free(r->trace);
    igrad_profile_free(r->profile);
    igrad_layout_free(r->layout);
    metrics_close(r->metrics);
    dataset_free(&r->ds);
    optim_free(r->opt);
    model_free(r->model);
    free(r->trace_prefix);
    free(r->grad_ptrs);
    free(r->acc);
    free(r->inputs);
    free(r->targets);
    free(r->vin);
    free(r->vtg);
    free(r->ckpt_dir);
    train_state_free(&r->state);
}

/* ------------------------------------------------------------------------ */
/* evaluation                                                               */
/* ------------------------------------------------------------------------ */

igrad_status_t train_check_same_params(igrad_comm_t *comm, const float *params, int64_t n,
                                      int64_t steps_done)
{
    int P = igrad_comm_size(comm);
    uint64_t mine = train_hash_floats(params, n);
    uint64_t *all = malloc((size_t)P * sizeof *all);
    igrad_status_t st = all ? IGRAD_OK : trainer_fail(IGRAD_E_NOMEM, "out of memory");
    TRY(agree(comm, st));
    st = igrad_comm_allgather(comm, &mine, sizeof mine, all);
    if (st != IGRAD_OK) {
        free(all);
        return lib_fail(st, "parameter check");
    }
    for (int q = 1; q < P; q++) {
        if (all[q] == all[0]) continue;
        st = trainer_fail(IGRAD_E_MISMATCH,
                          "parameters of rank %d differ from rank 0's after %lld steps (hash "
                          "%016" PRIx64 " vs %016" PRIx64 "): the ranks no longer train the "
                          "same model", q, (long long)steps_done, all[q], all[0]);
        break;
    }
    free(all);
    return st;
}

/* Validation loss, perplexity and next-token accuracy over the fixed
 * validation set, and task exact match over the held-out task problems
 * (task.h; one teacher-forced row each), each rank a disjoint share of both
 * and the sums reduced, then the parameter check: every rank's parameter
 * hash against rank 0's. out: loss, ppl, acc, task accuracy (NaN without
 * task problems), task problems. */
static igrad_status_t evaluate(run_t *r, int64_t steps_done, double *out)
{
    model_t *m = r->model;
    const int T = r->T, V = m->config.vocab_size;
    size_t begin = 0, end = 0;
    double sums[5] = {0, 0, 0, 0, 0}; /* loss sum, correct, counted targets, solved, problems */
    igrad_status_t st = IGRAD_OK;
    data_shard(r->ds.nval_seqs, r->rank, r->P, &begin, &end);
    for (size_t first = begin; first < end && st == IGRAD_OK; first += (size_t)r->M) {
        size_t count = end - first < (size_t)r->M ? end - first : (size_t)r->M;
        data_error_t err;
        if (dataset_val_batch(&r->ds, first, count, r->vin, r->vtg, &err) != DATA_OK) {
            st = data_fail(&err);
            break;
        }
        st = model_forward(m, r->vin, r->vtg, (int)count, T);
        if (st != IGRAD_OK) {
            st = prefix_fail(st, "evaluation");
            break;
        }
        sums[0] += m->loss * (double)m->loss_count;
        sums[2] += (double)m->loss_count;
        for (size_t i = 0; i < count * (size_t)T; i++) {
            if (r->vtg[i] < 0) continue;
            sums[1] += task_argmax(m->acts.logits + i * (size_t)V, V) == r->vtg[i];
        }
    }
    /* Task rows are only as long as the longest problem needs (<= T). */
    const int Tt = r->ds.task_seq_len;
    data_shard(r->ds.ntask, r->rank, r->P, &begin, &end);
    for (size_t first = begin; first < end && st == IGRAD_OK; first += (size_t)r->M) {
        size_t count = end - first < (size_t)r->M ? end - first : (size_t)r->M;
        data_error_t err;
        if (dataset_task_batch(&r->ds, first, count, Tt, r->vin, r->vtg, &err) != DATA_OK) {
            st = data_fail(&err);
            break;
        }
        if ((st = model_forward(m, r->vin, NULL, (int)count, Tt)) != IGRAD_OK) {
            st = prefix_fail(st, "task evaluation");
            break;
        }
        for (size_t i = 0; i < count; i++)
            sums[3] += task_row_exact(m->acts.logits + i * (size_t)Tt * (size_t)V,
                                      r->vtg + i * (size_t)Tt, Tt, V);
        sums[4] += (double)count;
    }
    /* A local failure must not leave the others in the all-reduce alone. */
    TRY(agree(r->comm, st));
    if ((st = igrad_comm_allreduce(r->comm, sums, sums, 5, IGRAD_DTYPE_F64, IGRAD_REDUCE_SUM)) !=
        IGRAD_OK)
        return lib_fail(st, "evaluation all-reduce");
    out[0] = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    out[1] = exp(out[0]);
    out[2] = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    out[3] = sums[4] > 0 ? sums[3] / sums[4] : NAN; /* integer counts: exact on every rank */
    out[4] = sums[4];

    return train_check_same_params(r->comm, m->params, m->num_params, steps_done);
}

/* ------------------------------------------------------------------------ */
/* checkpoints                                                              */
/* ------------------------------------------------------------------------ */

/* Collective. Rank 0 assembles "<out>/checkpoint.tmp.<pid>@<host>" (model,
 * config, optimizer) and every rank adds its engine state and reports its
 * checksum; rank 0 then writes train_state.json with every file's checksum
 * (so it is the last file) and, only when every rank reports success,
 * renames the directory over the previous checkpoint, so the directory
 * under its final name is always complete. */
static igrad_status_t save_checkpoint(run_t *r, int64_t next_step)
{
    igrad_status_t st = IGRAD_OK;
    char *tmp = NULL;
    uint64_t len = 0;
    uint64_t mine[2] = {0, 0}; /* this rank's engine file: hash, size */
    uint64_t *engine = NULL;   /* (2 P) every rank's */
    char pathbuf[4096];
    memset(pathbuf, 0, sizeof pathbuf);
    if (r->rank == 0) {
        st = checkpoint_begin(r->ckpt_dir, &tmp);
        if (st == IGRAD_OK) {
            len = strlen(tmp);
            if (len >= sizeof pathbuf) st = trainer_fail(IGRAD_E_INVALID, "--out path too long");
            else memcpy(pathbuf, tmp, len);
        }
    }
    TRY(agree(r->comm, st));
    if ((st = igrad_comm_bcast(r->comm, pathbuf, sizeof pathbuf, 0)) != IGRAD_OK)
        return lib_fail(st, "checkpoint");
    if (r->rank == 0) {
        st = checkpoint_save_model(r->model, tmp);
        if (st == IGRAD_OK) {
            char *p = path_join(tmp, CHECKPOINT_OPTIM_FILE);
            st = p ? checkpoint_save_optim(r->opt, r->model, p)
                   : trainer_fail(IGRAD_E_NOMEM, "out of memory");
            free(p);
        }
    }
    if (st == IGRAD_OK) {
        char name[64];
        engine_file_name(name, sizeof name, r->rank);
        char *p = path_join(pathbuf, name);
        if (!p) st = trainer_fail(IGRAD_E_NOMEM, "out of memory");
        else if ((st = igrad_engine_save_state(r->engine, p)) != IGRAD_OK)
            st = lib_fail(st, "engine state");
        /* Hashed as it lies on disk, which is what a resume will read. */
        if (st == IGRAD_OK) st = checkpoint_file_hash(p, &mine[0], &mine[1]);
        free(p);
    }
    if (st == IGRAD_OK && r->rank == 0 && !(engine = malloc((size_t)r->P * sizeof mine)))
        st = trainer_fail(IGRAD_E_NOMEM, "out of memory");
    st = agree(r->comm, st);
    if (st == IGRAD_OK) {
        /* Rank 0 needs every rank's checksum for train_state.json; an
         * all-gather (the communicator has no gather) of 16 bytes a rank. */
        uint64_t *all = malloc((size_t)r->P * sizeof mine);
        st = all ? IGRAD_OK : trainer_fail(IGRAD_E_NOMEM, "out of memory");
        if ((st = agree(r->comm, st)) == IGRAD_OK) {
            if ((st = igrad_comm_allgather(r->comm, mine, sizeof mine, all)) != IGRAD_OK) {
                free(all);
                free(engine);
                if (r->rank == 0) checkpoint_abort(tmp);
                return lib_fail(st, "checkpoint");
            }
            if (engine) memcpy(engine, all, (size_t)r->P * sizeof mine);
        }
        free(all);
    }
    if (st == IGRAD_OK && r->rank == 0) {
        /* train_state.json last: a checkpoint whose state file names every
         * other file's checksum. */
        st = write_state(r, tmp, next_step, engine);
        if (st == IGRAD_OK) st = trace_save(r);
    }
    free(engine);
    st = agree(r->comm, st);
    if (r->rank == 0) {
        if (st == IGRAD_OK) st = checkpoint_commit(tmp, r->ckpt_dir);
        else checkpoint_abort(tmp);
    }
    st = agree(r->comm, st);
    return st == IGRAD_OK ? IGRAD_OK : prefix_fail(st, "checkpoint");
}

/* ------------------------------------------------------------------------ */
/* progress                                                                 */
/* ------------------------------------------------------------------------ */

static void fmt_duration(double s, char *buf, size_t cap)
{
    if (!(s >= 0) || s > 1e7) snprintf(buf, cap, "?");
    else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(buf, cap, "%.0fs", s);
}

static void fmt_bytes(double b, char *buf, size_t cap)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB"};
    int i = 0;
    while (b >= 1024 && i < 3) b /= 1024, i++;
    snprintf(buf, cap, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void show_progress(run_t *r, int64_t step, const metrics_row_t *row, double elapsed_ms,
                          int64_t done_here)
{
    const train_options_t *o = r->o;
    if (r->rank != 0 || o->progress == TRAIN_PROGRESS_QUIET) return;
    double per_step = done_here > 0 ? elapsed_ms / (double)done_here : 0;
    int64_t last = o->stop_at > 0 && o->stop_at < o->steps ? o->stop_at : o->steps;
    char eta[32], bytes[32];
    fmt_duration(per_step * (double)(last - step - 1) / 1000.0, eta, sizeof eta);
    fmt_bytes(row->payload_bytes, bytes, sizeof bytes);
    if (r->tty) {
        printf("\r  step %lld/%lld  loss %.4f  %.0f tok/s  %s/step  ETA %s   ",
               (long long)step + 1, (long long)o->steps, row->loss, row->tokens_per_s, bytes, eta);
        fflush(stdout);
        return;
    }
    int64_t every = o->log_every > 0 ? o->log_every : (o->steps >= 20 ? o->steps / 20 : 1);
    if ((step + 1) % every != 0 && step + 1 != last) return;
    printf("step %lld/%lld loss %.4f tok/s %.0f payload %s/step sync %.2f ms step %.1f ms eta %s\n",
           (long long)step + 1, (long long)o->steps, row->loss, row->tokens_per_s, bytes,
           row->sync_ms, row->step_ms, eta);
    fflush(stdout);
}

static void show_eval(run_t *r, int64_t steps_done, const double *v)
{
    if (r->rank != 0 || r->o->progress == TRAIN_PROGRESS_QUIET) return;
    char task[64] = "";
    if (v[4] > 0) snprintf(task, sizeof task, " task_acc %.4f (%.0f problems)", v[3], v[4]);
    printf("%seval after %lld steps: val_loss %.4f ppl %.3f acc %.4f%s\n",
           r->tty ? "\r\033[K" : "", (long long)steps_done, v[0], v[1], v[2], task);
    fflush(stdout);
}

static metrics_eval_t eval_row(int64_t steps_done, const double *v)
{
    metrics_eval_t ev = {steps_done, v[0], v[1], v[2], v[3], (int64_t)v[4]};
    return ev;
}

/* ------------------------------------------------------------------------ */
/* one step                                                                 */
/* ------------------------------------------------------------------------ */

/* Forward/backward over this rank's rows in micro-batches. Leaves in
 * m->grads the gradient of (sum of token losses) * P / global count, whose
 * average over ranks is the gradient of the global mean loss; *loss gets
 * that global mean. */
static igrad_status_t forward_backward(run_t *r, int64_t step, double *loss)
{
    model_t *m = r->model;
    const int T = r->T, M = r->M, nmicro = r->B / r->M;
    const size_t rows = (size_t)M * T;
    data_error_t err;
    igrad_status_t st = IGRAD_OK;
    if (dataset_train_batch(&r->ds, step, r->G, r->rank, r->P, r->inputs, r->targets, &err) !=
        DATA_OK)
        return data_fail(&err);

    /* Micro-batches with equal target counts (always, unless targets are
     * masked) can share one final scale; otherwise each is weighted by its
     * count in a separate accumulator. */
    int64_t first_count = -1;
    int equal = 1;
    for (int i = 0; i < nmicro; i++) {
        int64_t c = 0;
        for (size_t j = 0; j < rows; j++) c += r->targets[(size_t)i * rows + j] >= 0;
        if (first_count < 0) first_count = c;
        else if (c != first_count) equal = 0;
    }
    if (!equal && !r->acc) {
        r->acc = malloc((size_t)m->num_params * sizeof *r->acc);
        if (!r->acc) return trainer_fail(IGRAD_E_NOMEM, "out of memory");
    }
    if (!equal) memset(r->acc, 0, (size_t)m->num_params * sizeof *r->acc);

    double sums[2] = {0, 0}; /* loss sum, counted targets */
    model_zero_grad(m);
    for (int i = 0; i < nmicro && st == IGRAD_OK; i++) {
        st = model_forward(m, r->inputs + (size_t)i * rows, r->targets + (size_t)i * rows, M, T);
        if (st == IGRAD_OK) st = model_backward(m);
        if (st != IGRAD_OK) break;
        sums[0] += m->loss * (double)m->loss_count;
        sums[1] += (double)m->loss_count;
        if (!equal) {
            cblas_saxpy((int)m->num_params, (float)m->loss_count, m->grads, 1, r->acc, 1);
            model_zero_grad(m);
        }
    }
    if (st != IGRAD_OK) st = prefix_fail(st, "forward/backward");
    TRY(agree(r->comm, st));
    if ((st = igrad_comm_allreduce(r->comm, sums, sums, 2, IGRAD_DTYPE_F64, IGRAD_REDUCE_SUM)) !=
        IGRAD_OK)
        return lib_fail(st, "loss all-reduce");
    *loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    if (sums[1] > 0) {
        double scale = (double)r->P / sums[1];
        if (equal) optim_scale(m->grads, m->num_params, (float)((double)first_count * scale));
        else {
            memcpy(m->grads, r->acc, (size_t)m->num_params * sizeof *m->grads);
            optim_scale(m->grads, m->num_params, (float)scale);
        }
    }
    return IGRAD_OK;
}

/* --early-density's switch (collective, the same step on every rank): a
 * new engine at --density; the early one is kept until train_step has
 * added its residuals into the gradients. */
static igrad_status_t early_switch(run_t *r)
{
    double t0 = now_ms();
    igrad_engine_t *n = NULL;
    igrad_status_t st = igrad_engine_create(r->layout, r->profile, &r->scfg, r->comm, &n);
    if (st != IGRAD_OK) return lib_fail(st, "sync engine (--early-density's switch)");
    if (r->trace && (st = igrad_engine_set_trace(n, r->trace)) != IGRAD_OK) {
        igrad_engine_free(n);
        return lib_fail(st, "--trace");
    }
    r->early_engine = r->engine;
    r->engine = n;
    r->early_switch_ms = now_ms() - t0;
    return IGRAD_OK;
}

static igrad_status_t train_step(run_t *r, int64_t step, metrics_row_t *row)
{
    model_t *m = r->model;
    double t0 = now_ms(), loss = 0.0;
    TRY(forward_backward(r, step, &loss));
    if (!isfinite(loss))
        return trainer_fail(IGRAD_E_NONFINITE, "training diverged at step %lld: loss is %g "
                            "(lower --lr?)", (long long)step, loss);

    /* --ef-on update: the local gradient, clipped by its own norm, takes a
     * local AdamW step whose update replaces it in m->grads; the engine
     * syncs that. A non-finite local norm clips nothing and leaves a
     * non-finite update, which the engine's check below catches on every
     * rank at once. */
    if (r->o->ef_on_update) {
        optim_clip_grad_norm(m->grads, m->num_params, r->ocfg.grad_clip);
        optim_update_delta(r->opt, m->params, m->grads, optim_lr(&r->ocfg, step), m->grads);
    }

    /* --early-density's first step at the final density: the early
     * engine's residuals join this step's gradients (what error feedback
     * adds before selecting), then that engine goes. */
    if (r->early_engine) {
        for (int t = 0; t < m->n_tensors; t++) {
            const float *res = igrad_engine_residual(r->early_engine, (size_t)t);
            if (res) cblas_saxpy((int)m->tensors[t].count, 1.0f, res, 1, r->grad_ptrs[t], 1);
        }
        igrad_engine_free(r->early_engine);
        r->early_engine = NULL;
    }

    /* The engine fails a step on every rank at once (NaN/Inf on any rank,
     * a failed collective), so its status needs no extra agreement. */
    igrad_status_t st = igrad_engine_sync(r->engine, step, r->grad_ptrs);
    if (st == IGRAD_E_NONFINITE)
        return trainer_fail(st, "training diverged at step %lld: %s", (long long)step,
                            igrad_last_error());
    if (st != IGRAD_OK) return lib_fail(st, "sync");
    igrad_step_stats_t ss;
    igrad_engine_last_stats(r->engine, &ss);
    if (ss.sar_entries > 0 && r->rank == 0) {
        if (!r->sar_balance) r->sar_balance = cJSON_CreateArray();
        cJSON *pt = cJSON_CreateArray();
        if (pt) {
            cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)step));
            cJSON_AddItemToArray(pt, cJSON_CreateNumber(ss.sar_busiest_over_mean));
        }
        if (r->sar_balance && pt) cJSON_AddItemToArray(r->sar_balance, pt);
        else cJSON_Delete(pt);
    }

    /* After the sync every rank holds the same gradient (or update), so the
     * norm and the update agree without communication. */
    if (r->o->ef_on_update) {
        cblas_saxpy((int)m->num_params, 1.0f, m->grads, 1, m->params, 1);
    } else {
        double norm = optim_clip_grad_norm(m->grads, m->num_params, r->ocfg.grad_clip);
        if (!isfinite(norm))
            return trainer_fail(IGRAD_E_NONFINITE, "training diverged at step %lld: gradient "
                                "norm is %g", (long long)step, norm);
        optim_update(r->opt, m->params, m->grads, optim_lr(&r->ocfg, step));
    }
    double t1 = now_ms();

    memset(row, 0, sizeof *row);
    row->step = step;
    row->loss = loss;
    row->payload_bytes = (double)ss.payload_nbytes;
    row->wire_bytes = (double)ss.wire_nbytes;
    row->sent_entries = (double)ss.entries_sent;
    row->select_ms = ss.select_ms;
    row->pack_ms = ss.pack_ms;
    row->comm_ms = ss.comm_ms;
    row->unpack_ms = ss.unpack_ms;
    row->sync_ms = ss.total_ms;
    row->step_ms = t1 - t0;
    row->tokens_per_s = (double)r->G * r->T / ((t1 - t0) / 1000.0);
    row->buckets = ss.buckets;
    row->imbalance = ss.imbalance;
    row->cv = ss.cv;
    row->overflow = ss.overflow;
    return IGRAD_OK;
}

/* ------------------------------------------------------------------------ */
/* summary                                                                  */
/* ------------------------------------------------------------------------ */

static igrad_status_t write_summary(run_t *r, int64_t steps_done, double wall_s)
{
    const train_options_t *o = r->o;
    const model_config_t *mc = &r->model->config;
    char *path = path_join(o->out, TRAIN_SUMMARY_FILE);
    cJSON *root = cJSON_CreateObject();
    igrad_status_t st = IGRAD_OK;
    if (!path || !root) {
        st = trainer_fail(IGRAD_E_NOMEM, "summary: out of memory");
        goto cleanup;
    }
    cJSON_AddStringToObject(root, "method", igrad_method_name(r->scfg.method));
    cJSON_AddNumberToObject(root, "ranks", r->P);
    cJSON_AddNumberToObject(root, "steps", (double)steps_done);
    cJSON_AddNumberToObject(root, "steps_planned", (double)o->steps);
    cJSON_AddBoolToObject(root, "complete", steps_done >= o->steps);
    cJSON_AddStringToObject(root, "workload", o->data);
    cJSON_AddNumberToObject(root, "tokens_per_step", (double)r->G * r->T);

    cJSON *cfg = cJSON_AddObjectToObject(root, "config");
    cJSON *model = cJSON_AddObjectToObject(cfg, "model");
    if (o->resume || o->init_dir)
        cJSON_AddStringToObject(model, "init", o->resume ? r->ckpt_dir : o->init_dir);
    else if (o->model_name)
        cJSON_AddStringToObject(model, "size", o->model_name);
    cJSON_AddNumberToObject(model, "num_params", (double)r->model->num_params);
    cJSON_AddNumberToObject(model, "layers", mc->n_layer);
    cJSON_AddNumberToObject(model, "dim", mc->dim);
    cJSON_AddNumberToObject(model, "heads", mc->n_head);
    cJSON_AddNumberToObject(model, "kv_heads", mc->n_kv_head);
    cJSON_AddNumberToObject(model, "ffn", mc->ffn_dim);
    cJSON_AddBoolToObject(model, "tie", mc->tie_embeddings);
    cJSON_AddStringToObject(cfg, "data", o->data);
    cJSON_AddBoolToObject(cfg, "response_only", o->response_only);
    cJSON_AddNumberToObject(cfg, "val_fraction", o->val_fraction);
    cJSON_AddNumberToObject(cfg, "val_sequences", (double)r->ds.nval_seqs);
    cJSON_AddNumberToObject(cfg, "batch", r->G);
    cJSON_AddNumberToObject(cfg, "micro_batch", r->M);
    cJSON_AddNumberToObject(cfg, "seq_len", r->T);
    cJSON_AddNumberToObject(cfg, "lr", r->ocfg.lr);
    cJSON_AddNumberToObject(cfg, "min_lr", r->ocfg.min_lr);
    cJSON_AddNumberToObject(cfg, "warmup", (double)r->ocfg.warmup_steps);
    cJSON_AddNumberToObject(cfg, "weight_decay", r->ocfg.weight_decay);
    cJSON_AddNumberToObject(cfg, "beta1", r->ocfg.beta1);
    /* "auto": --beta1 was not given and resolved by method (train_options_resolve) */
    cJSON_AddStringToObject(cfg, "beta1_source", r->beta1_was_auto ? "auto" : "given");
    cJSON_AddStringToObject(cfg, "ef_on", o->ef_on_update ? "update" : "grad");
    cJSON_AddNumberToObject(cfg, "beta2", r->ocfg.beta2);
    cJSON_AddNumberToObject(cfg, "clip", r->ocfg.grad_clip);
    cJSON_AddNumberToObject(cfg, "seed", (double)o->seed);
    cJSON_AddNumberToObject(cfg, "threads", o->threads);
    cJSON *sync = cJSON_AddObjectToObject(cfg, "sync");
    cJSON_AddStringToObject(sync, "method", igrad_method_name(r->scfg.method));
    cJSON_AddStringToObject(sync, "sparsifier", igrad_sparsifier_name(method_sparsifier(&r->scfg)));
    cJSON_AddNumberToObject(sync, "density", r->scfg.density);
    cJSON_AddNumberToObject(sync, "release_period", r->scfg.release_period);
    cJSON_AddNumberToObject(sync, "release_keep", r->scfg.release_keep);
    cJSON_AddStringToObject(sync, "schedule", igrad_schedule_name(r->scfg.schedule));
    cJSON_AddStringToObject(sync, "residual", igrad_residual_policy_name(r->scfg.residual));
    cJSON_AddStringToObject(sync, "pack", igrad_pack_policy_name(r->scfg.pack));
    cJSON_AddNumberToObject(sync, "buckets", r->scfg.buckets);
    cJSON_AddStringToObject(sync, "topology", igrad_topology_name(r->scfg.topology));
    cJSON_AddStringToObject(sync, "allocation",
                            r->scfg.allocation == IGRAD_ALLOCATION_BUDGET ? "budget" : "partition");
    cJSON_AddNumberToObject(sync, "ranks_per_node", r->scfg.ranks_per_node);
    cJSON_AddNumberToObject(sync, "dense_below", (double)r->scfg.dense_below);
    cJSON_AddNumberToObject(sync, "link_latency_ns", (double)r->scfg.link_latency_ns);
    cJSON_AddNumberToObject(sync, "link_bandwidth_mbps", (double)r->scfg.link_bandwidth_mbps);
    cJSON_AddBoolToObject(sync, "auto_sparse_reduce", r->scfg.auto_sparse_reduce);
    if (o->target_ratio != 0.0) {
        cJSON *tg = cJSON_AddObjectToObject(sync, "target");
        cJSON_AddNumberToObject(tg, "ratio", o->target_ratio);
        cJSON_AddNumberToObject(tg, "planned_ratio", r->target.ratio);
        cJSON_AddNumberToObject(tg, "release_keep", r->target.release_keep);
        cJSON_AddNumberToObject(tg, "tau", r->target.tau);
        cJSON_AddNumberToObject(tg, "n_important", (double)r->target.n_important);
        cJSON_AddNumberToObject(tg, "n_gated", (double)r->target.n_gated);
        cJSON_AddNumberToObject(tg, "f_imp", r->target.f_imp);
        cJSON_AddBoolToObject(tg, "met", r->target.met);
    }
    cJSON_AddNumberToObject(sync, "momentum", r->scfg.momentum);
    cJSON_AddNumberToObject(sync, "start_iter", (double)r->scfg.start_iter);
    if (o->early_steps > 0) {
        cJSON *ed = cJSON_AddObjectToObject(sync, "early_density");
        cJSON_AddNumberToObject(ed, "density", o->early_density);
        cJSON_AddNumberToObject(ed, "steps", (double)o->early_steps);
        metrics_json_number(ed, "switch_ms", r->early_switch_ms);
    }
    cJSON_AddStringToObject(sync, "value_dtype", igrad_dtype_name(r->scfg.value_dtype));
    int nsar = r->sar_balance ? cJSON_GetArraySize(r->sar_balance) : 0;
    if (nsar > 0) { /* the sparse all-reduce's busiest owner over the mean, per step */
        cJSON *sb = cJSON_AddObjectToObject(sync, "sar_busiest_over_mean");
        double sum = 0.0, most = 0.0;
        for (int i = 0; i < nsar; i++) {
            double v = cJSON_GetArrayItem(cJSON_GetArrayItem(r->sar_balance, i), 1)->valuedouble;
            sum += v;
            most = v > most ? v : most;
        }
        cJSON_AddNumberToObject(sb, "mean", sum / nsar);
        cJSON_AddNumberToObject(sb, "max", most);
        cJSON_AddNumberToObject(sb, "steps", nsar);
        cJSON_AddItemReferenceToObject(sb, "per_step", r->sar_balance); /* [step, value] */
    }
    igrad_step_stats_t ss;
    if (igrad_engine_last_stats(r->engine, &ss) == IGRAD_OK) {
        cJSON *mem = cJSON_AddObjectToObject(sync, "memory");
        cJSON_AddNumberToObject(mem, "dataplane_nbytes", (double)ss.dataplane_nbytes);
        cJSON_AddNumberToObject(mem, "dataplane_nbytes_per_param",
                                ss.dataplane_nbytes_per_param);
    }
    if (o->profile) cJSON_AddStringToObject(cfg, "profile", o->profile);
    if (train_profile_auto(o)) {
        igrad_online_info_t oi;
        if (igrad_engine_online_info(r->engine, &oi) == IGRAD_OK) {
            cJSON *on = cJSON_AddObjectToObject(root, "online_profile");
            cJSON_AddNumberToObject(on, "profile_steps", (double)oi.profile_steps);
            cJSON_AddNumberToObject(on, "switch_step", (double)oi.switch_step);
            metrics_json_number(on, "gather_ms", oi.gather_ms);
            metrics_json_number(on, "build_ms", oi.build_ms);
            if (oi.reprofile_every > 0) {
                cJSON_AddNumberToObject(on, "reprofile_every", (double)oi.reprofile_every);
                cJSON_AddNumberToObject(on, "reprofile_margin", r->scfg.reprofile_margin);
                cJSON_AddNumberToObject(on, "reprofiles", (double)oi.reprofiles);
                cJSON_AddNumberToObject(on, "reprofile_replans", (double)oi.reprofile_replans);
                metrics_json_number(on, "reprofile_ms", oi.reprofile_ms);
                if (r->reprofile_log)
                    cJSON_AddItemReferenceToObject(on, "reprofile_log", r->reprofile_log);
            }
            if (r->online_written)
                cJSON_AddStringToObject(on, "file", TRAIN_ONLINE_PROFILE_FILE);
        }
    }
    if (o->trace) cJSON_AddStringToObject(cfg, "trace", o->trace);
    const igrad_profile_t *prof = r->profile ? r->profile : igrad_engine_profile(r->engine);
    if (prof) {
        size_t nc = igrad_profile_count(prof), nimp = 0;
        for (size_t i = 0; i < nc; i++) {
            igrad_profile_entry_t e;
            if (igrad_profile_entry(prof, i, &e) == IGRAD_OK && e.important) nimp++;
        }
        cJSON *pj = cJSON_AddObjectToObject(root, "profile");
        cJSON_AddNumberToObject(pj, "components", (double)nc);
        cJSON_AddNumberToObject(pj, "important", (double)nimp);
        metrics_json_number(pj, "tau", igrad_profile_threshold(prof));
        cJSON_AddStringToObject(pj, "method", igrad_profile_method(prof));
    }
    metrics_json_number(root, "f_imp", r->f_imp);

    st = metrics_summary_add(r->metrics, (int64_t)r->G * r->T, root);
    if (st != IGRAD_OK) goto cleanup;
    /* The headline numbers: the mean payload (release steps vary, so the
     * mean is what a run costs) and the median sync time (robust to the
     * noise of an oversubscribed machine). */
    metrics_stat_t pay = metrics_stat_of(r->metrics, offsetof(metrics_row_t, payload_bytes));
    metrics_stat_t syn = metrics_stat_of(r->metrics, offsetof(metrics_row_t, sync_ms));
    metrics_json_number(root, "payload_bytes_per_step", pay.n ? pay.mean : NAN);
    metrics_json_number(root, "sync_ms_per_step", syn.n ? syn.median : NAN);
    metrics_json_number(root, "wall_s", wall_s);
    st = metrics_write_json(path, root);
cleanup:
    cJSON_Delete(root);
    free(path);
    return st;
}

/* ------------------------------------------------------------------------ */
/* the run                                                                  */
/* ------------------------------------------------------------------------ */

static int at_multiple(int64_t done, int64_t every) { return every > 0 && done % every == 0; }

/* A failure inside the step loop: the trainer's own collectives (loss and
 * evaluation all-reduces, agreements) say nothing of the step, the
 * engine's do. */
static igrad_status_t at_step(igrad_status_t st, int64_t step)
{
    if (strstr(trainer_last_error(), "step ")) return st;
    char where[48];
    snprintf(where, sizeof where, "step %lld", (long long)step);
    return prefix_fail(st, where);
}

/* --reprofile-every: an entry for a re-profile made at this step's begin
 * (what moved, whether it re-planned, its cost) for summary.json. */
static void log_reprofile(run_t *r, int64_t step)
{
    igrad_online_info_t oi;
    if (igrad_engine_online_info(r->engine, &oi) != IGRAD_OK || oi.reprofiles <= r->reprofiles_seen)
        return;
    r->reprofiles_seen = oi.reprofiles;
    if (!r->reprofile_log) r->reprofile_log = cJSON_CreateArray();
    cJSON *e = cJSON_CreateObject();
    if (!r->reprofile_log || !e) {
        cJSON_Delete(e);
        return;
    }
    cJSON_AddNumberToObject(e, "step", (double)step);
    cJSON_AddNumberToObject(e, "flips", (double)oi.last_flips);
    cJSON_AddNumberToObject(e, "replans", (double)oi.reprofile_replans);
    metrics_json_number(e, "ms", oi.reprofile_ms);
    cJSON_AddItemToArray(r->reprofile_log, e);
}

/* --profile auto: once the engine has built its profile (or loaded it with
 * a resumed state), rank 0 writes it to out/profile.json for users to
 * inspect or reuse with --profile FILE, and f_imp is known. */
static igrad_status_t online_profile_written(run_t *r)
{
    if (!train_profile_auto(r->o) || r->online_written) return IGRAD_OK;
    const igrad_profile_t *p = igrad_engine_profile(r->engine);
    if (!p) return IGRAD_OK;
    r->online_written = 1;
    if (r->o->target_ratio > 0.0) {
        /* what the engine chose at the switch (the same pure function of
         * the profile's scores), for the log and summary.json */
        igrad_status_t fst = igrad_target_fit(r->layout, p, &r->scfg, r->o->target_ratio,
                                              IGRAD_TARGET_MIN_KEEP, &r->target);
        if (fst != IGRAD_OK) return lib_fail(fst, "--target-ratio");
        r->scfg.release_keep = r->target.release_keep;
    }
    r->f_imp = compute_f_imp(r->layout, p, method_sparsifier(&r->scfg), r->scfg.density);
    if (r->rank != 0 || !r->o->out) return IGRAD_OK;
    char *path = path_join(r->o->out, TRAIN_ONLINE_PROFILE_FILE);
    if (!path) return trainer_fail(IGRAD_E_NOMEM, "out of memory");
    igrad_status_t st = igrad_profile_save_json(p, path);
    free(path);
    return st == IGRAD_OK ? IGRAD_OK : lib_fail(st, "--profile auto: writing the profile");
}

igrad_status_t train_run(const train_options_t *opts, igrad_comm_t *comm, train_result_t *res)
{
    run_t r;
    memset(&r, 0, sizeof r);
    memset(res, 0, sizeof *res);
    res->val_loss = res->val_ppl = res->val_acc = res->task_accuracy = res->f_imp = NAN;
    train_options_t resolved = *opts; /* the auto values made concrete */
    train_options_resolve(&resolved);
    const train_options_t *o = &resolved;
    r.beta1_was_auto = opts->beta1_auto;
    r.o = o;
    r.comm = comm;
    r.rank = igrad_comm_rank(comm);
    r.P = igrad_comm_size(comm);
    r.G = o->batch;
    r.T = o->seq_len;
    r.B = r.P > 0 ? o->batch / r.P : 0;
    r.M = o->micro_batch > 0 ? o->micro_batch : r.B;
    r.last_val[0] = r.last_val[1] = r.last_val[2] = r.last_val[3] = NAN;
    r.last_val[4] = 0;
    r.early_switch_ms = NAN;
    r.t_start_ms = now_ms();
    r.tty = o->progress == TRAIN_PROGRESS_LINE ||
            (o->progress == TRAIN_PROGRESS_AUTO && isatty(STDOUT_FILENO));
#ifdef _OPENMP
    if (o->threads > 0) omp_set_num_threads(o->threads);
#endif
    if (o->threads > 0) openblas_set_num_threads(o->threads);

    /* Every collective of the run, the trainer's own too, is bounded: a
     * stopped rank ends the others with IGRAD_E_TIMEOUT (cmd_train then
     * aborts the job) instead of a hang. A rank with another value fails
     * the option agreement below, naming --comm-timeout. */
    igrad_status_t st = igrad_comm_set_timeout(comm, o->comm_timeout_s);
    if (st != IGRAD_OK) return lib_fail(st, "--comm-timeout"); /* refused by cmd_train first */
    /* Options first: a rank with another --steps or --save-every would
     * otherwise leave the others waiting in a collective it never calls. */
    /* as given (auto unresolved), so that a rank with another --method is
     * named by --method, not by the --beta1 it resolves to */
    st = agree_options(comm, opts);
    if (st != IGRAD_OK) goto cleanup;
    r.ckpt_dir = o->out ? path_join(o->out, TRAIN_CHECKPOINT_DIR) : NULL;
    st = o->out && !r.ckpt_dir ? trainer_fail(IGRAD_E_NOMEM, "out of memory") : IGRAD_OK;
    if (st == IGRAD_OK && r.rank == 0 && r.ckpt_dir) st = prepare_out(&r);
    if ((st = agree(comm, st)) != IGRAD_OK) goto cleanup;
    st = agree(comm, setup_local(&r));
    if (st != IGRAD_OK) goto cleanup;
    /* Every rank starts from the same parameters (an --init that differs
     * between hosts, a fresh init that did not come out the same). */
    st = train_check_same_params(comm, r.model->params, r.model->num_params, r.start_step);
    if (st != IGRAD_OK) {
        st = prefix_fail(st, o->resume ? "--resume" : o->init_dir ? "--init" : "model init");
        goto cleanup;
    }
    if (r.rank == 0 && r.profile) warn_profile(&r);

    /* Collective from here on: every rank reached this point. */
    {
        igrad_config_t c0 = r.scfg; /* --early-density before its switch step */
        if (r.start_step < o->early_steps) c0.density = o->early_density;
        st = igrad_engine_create(r.layout, r.profile, &c0, comm, &r.engine);
    }
    if (st != IGRAD_OK) {
        st = lib_fail(st, "sync engine");
        goto cleanup;
    }
    if (o->resume) {
        char name[64];
        engine_file_name(name, sizeof name, r.rank);
        char *p = path_join(r.ckpt_dir, name);
        st = p ? igrad_engine_load_state(r.engine, p) : IGRAD_E_NOMEM;
        if (st != IGRAD_OK) st = lib_fail(st, p ? p : "engine state");
        /* The engine's last step is the one before the resume step. */
        else if (igrad_engine_step(r.engine) != r.start_step - 1)
            st = trainer_fail(IGRAD_E_MISMATCH,
                              "--resume: %s holds the engine state after step %lld, but %s says "
                              "the run is at step %lld (the files come from different saves)",
                              p, (long long)igrad_engine_step(r.engine), TRAIN_STATE_FILE,
                              (long long)r.start_step);
        free(p);
        if ((st = agree(comm, st)) != IGRAD_OK) goto cleanup;
    }
    st = r.rank == 0 ? setup_rank0(&r) : IGRAD_OK;
    if ((st = agree(comm, st)) != IGRAD_OK) goto cleanup;
    if (r.trace) igrad_engine_set_trace(r.engine, r.trace);

    res->start_step = r.start_step;
    res->f_imp = r.f_imp;
    if (r.rank == 0 && o->progress != TRAIN_PROGRESS_QUIET) {
        printf("train: %s on %d rank%s, %lld parameters, data %s (%zu train tokens, %zu val "
               "sequences), batch %d x %d tokens, steps %lld..%lld\n",
               igrad_method_name(r.scfg.method), r.P, r.P == 1 ? "" : "s",
               (long long)r.model->num_params, o->data, r.ds.train.count, r.ds.nval_seqs, r.G,
               r.T, (long long)r.start_step, (long long)o->steps);
        fflush(stdout);
    }

    int64_t last = o->stop_at > 0 && o->stop_at < o->steps ? o->stop_at : o->steps;
    if (r.start_step == 0 && o->eval_every > 0) {
        if ((st = evaluate(&r, 0, r.last_val)) != IGRAD_OK) goto cleanup;
        metrics_eval_t ev = eval_row(0, r.last_val);
        if (r.rank == 0) st = metrics_add_eval(r.metrics, &ev);
        if ((st = agree(comm, st)) != IGRAD_OK) goto cleanup;
        show_eval(&r, 0, r.last_val);
    }
    double loop_start = now_ms();
    int64_t step = r.start_step;
    for (; step < last; step++) {
        metrics_row_t row;
        if (step == o->early_steps && step > r.start_step && (st = early_switch(&r)) != IGRAD_OK)
            break;
        if ((st = train_step(&r, step, &row)) != IGRAD_OK) break;
        /* the same step on every rank: the engines switch together */
        if (train_profile_auto(o) && !r.online_written && igrad_engine_profile(r.engine))
            if ((st = agree(comm, online_profile_written(&r))) != IGRAD_OK) break;
        if (o->reprofile_every > 0) log_reprofile(&r, step);
        if (step == r.start_step) res->first_loss = row.loss;
        res->last_loss = row.loss;
        res->steps_done = step + 1;
        st = r.rank == 0 ? metrics_add_step(r.metrics, &row) : IGRAD_OK;
        if ((st = agree(comm, st)) != IGRAD_OK) break;
        show_progress(&r, step, &row, now_ms() - loop_start, step + 1 - r.start_step);

        int64_t done = step + 1;
        if (at_multiple(done, o->eval_every) || done == o->steps ||
            (done == last && !at_multiple(done, o->eval_every))) {
            if ((st = evaluate(&r, done, r.last_val)) != IGRAD_OK) break;
            metrics_eval_t ev = eval_row(done, r.last_val);
            st = r.rank == 0 ? metrics_add_eval(r.metrics, &ev) : IGRAD_OK;
            if ((st = agree(comm, st)) != IGRAD_OK) break;
            show_eval(&r, done, r.last_val);
        }
        if (at_multiple(done, o->save_every) || done == last)
            if ((st = save_checkpoint(&r, done)) != IGRAD_OK) break;
    }
    if (st != IGRAD_OK) {
        st = at_step(st, step);
        goto cleanup;
    }
    if (r.start_step >= last) res->steps_done = r.start_step;

    res->wall_s = (now_ms() - r.t_start_ms) / 1000.0;
    res->f_imp = r.f_imp;
    st = IGRAD_OK;
    if (r.rank == 0) {
        if (r.tty && o->progress != TRAIN_PROGRESS_QUIET) printf("\n");
        st = write_summary(&r, res->steps_done, res->wall_s);
        if (st == IGRAD_OK) st = trace_save(&r);
    }
    st = agree(comm, st);
    res->val_loss = r.last_val[0];
    res->val_ppl = r.last_val[1];
    res->val_acc = r.last_val[2];
    res->task_accuracy = r.last_val[3];
    res->task_problems = (int64_t)r.last_val[4];
    res->param_hash = train_hash_floats(r.model->params, r.model->num_params);
    igrad_step_stats_t ss;
    if (igrad_engine_last_stats(r.engine, &ss) == IGRAD_OK) {
        res->dataplane_nbytes = ss.dataplane_nbytes;
        res->dataplane_nbytes_per_param = ss.dataplane_nbytes_per_param;
    }
cleanup:
    if (r.tty && r.rank == 0 && st != IGRAD_OK && o->progress != TRAIN_PROGRESS_QUIET)
        printf("\n");
    run_free(&r);
    return st;
}
