/*
 * train.h — the reference trainer's training loop: data-parallel
 * LLaMA post-training (or pretraining) over an igrad communicator, with
 * every gradient synchronization going through igrad's sync engine (dense
 * included, so bytes and times are measured the same way for every method).
 *
 * One step on every rank (P ranks, global batch G sequences of T tokens,
 * B = G/P rows per rank in micro-batches of M rows):
 *   rows of the step (data.h: a pure function of the step, so a resumed
 *   run reads exactly what an uninterrupted one would) -> forward/backward
 *   per micro-batch, gradients of the summed token losses accumulated ->
 *   one small all-reduce of (loss sum, target count) -> gradients scaled by
 *   P / global count (the engine averages over ranks, so the result is the
 *   gradient of the global mean loss whatever P and M are) -> engine sync ->
 *   global-norm clipping -> AdamW with the step's learning rate.
 *
 * Files under opts->out (rank 0 writes all but the per-rank state):
 *   metrics.csv, eval.csv        metrics.h
 *   summary.json                 config, ranks, workload, final/best eval,
 *                                per-step medians and means, f_imp, wall time
 *   checkpoint/                  the last checkpoint (replaced atomically;
 *                                complete or absent): config.json and
 *                                model.safetensors (loadable by
 *                                `igrad layout` and `--init`),
 *                                optimizer.safetensors, train_state.json
 *                                (next step = data position, ranks, run
 *                                settings a resume must keep), and
 *                                engine.rank<r>.bin per rank (residuals)
 *   trace (opts->trace)          rank 0's activity trace, if asked for
 *
 * Options that define the run (everything but threads, progress, log
 * period, trace and overwrite, which are rank 0's or each rank's own) must
 * be equal on every rank: setup first compares one hash of them across
 * ranks and fails on every rank naming the first that differs ("--steps
 * differs: rank 0 has 20, rank 1 has 10"). Paths are compared as given
 * (--data, --out; the ranks see one file system), files by content
 * (--profile), --init by the loaded parameters.
 *
 * A resume verifies the checkpoint as a whole: every file against the
 * size and FNV-1a 64 checksum train_state.json records for it (each
 * rank's engine file included: rank 0 gathers those checksums before it
 * writes train_state.json, the last file of a save), the loaded
 * parameters against its param_hash, and the optimizer's and engine's
 * steps against its step; a fresh run refuses an out that holds a
 * checkpoint unless `overwrite`. At every start rank 0 restores a
 * checkpoint caught between a save's two renames and removes what dead
 * saves left (checkpoint_tidy).
 *
 * Errors never leave ranks disagreeing: setup failures are agreed on by a
 * collective before any rank goes on, the engine fails a step on every
 * rank at once, evaluation compares a hash of every rank's parameters with
 * rank 0's. A failing train_run() returns the same status on every rank;
 * trainer_last_error() holds the failing rank's message (prefixed with
 * "rank r: " when it was another rank's).
 *
 * Not here: argument parsing and MPI start-up (tools/cmd_train.c), the
 * model, optimizer, checkpoints and data themselves.
 */
#ifndef IGRAD_TRAINER_TRAIN_H
#define IGRAD_TRAINER_TRAIN_H

#include <stdint.h>

#include <string.h>

#include "igrad.h"
#include "model.h"
#include "optim.h"
#include "train_defaults.h"

#define TRAIN_CHECKPOINT_DIR "checkpoint"
/* --profile auto: the profile the engine built, written into --out */
#define TRAIN_ONLINE_PROFILE_FILE "profile.json"
#define TRAIN_STATE_FILE "train_state.json"
#define TRAIN_SUMMARY_FILE "summary.json"

/* How progress is shown on rank 0's stdout. */
typedef enum train_progress {
    TRAIN_PROGRESS_AUTO = 0,  /* a terminal: one updating line; else plain lines */
    TRAIN_PROGRESS_LINE = 1,  /* one line rewritten with '\r' */
    TRAIN_PROGRESS_PLAIN = 2, /* a log line every log_every steps */
    TRAIN_PROGRESS_QUIET = 3  /* nothing (tests) */
} train_progress_t;

typedef struct train_options {
    /* Model: a checkpoint to start from, else a fresh model of `model`
     * (random init with `seed`). With resume, the checkpoint in out wins. */
    const char *init_dir;
    model_config_t model;
    const char *model_name;   /* preset name for the summary ("small"), may be NULL */
    float init_std;           /* fresh model: weights ~ normal(0, init_std) */

    /* Data (data.h). */
    const char *data;         /* --data SPEC */
    int response_only;        /* alpaca: loss on response tokens only */
    double val_fraction;      /* documents held out for validation */
    int seq_len;              /* T */
    int batch;                /* G: global sequences per step, any P */
    int micro_batch;          /* M: rows per forward/backward; 0 = B (no accumulation) */
    int64_t steps;            /* total optimizer steps of the run */
    int64_t stop_at;          /* > 0: stop after this many steps with a checkpoint
                                 (a time-limited job; --resume continues); 0 = never */

    optim_config_t optim;     /* lr, min_lr, warmup, weight decay, clip (total_steps
                                 is set to `steps`) */
    uint64_t seed;            /* init, data split and sampling */
    int threads;              /* OpenMP/OpenBLAS threads per rank; 0 = keep */

    /* Synchronization (igrad engine). */
    const char *method;       /* dense|topk_sync|adtopk_sync|iad|ig */
    const char *sparsifier;   /* for iad/ig: topk|adtopk (NULL = engine default) */
    double density;           /* rho */
    int release_period;       /* R */
    double release_keep;      /* kappa */
    const char *schedule;     /* aligned|staggered (NULL = default) */
    const char *residual;     /* on|drop (NULL = default) */
    const char *pack;         /* packing policy (NULL = default) */
    igrad_dtype_t value_dtype; /* wire values of the sparse methods (F32 = 0) */
    int value_dtype_auto;     /* --value-dtype not given: by method (train_options_resolve) */
    int buckets;              /* B buckets */
    const char *topology;     /* flat|hier (NULL = flat): igrad_config_t.topology */
    const char *allocation;   /* partition|budget (NULL = partition):
                                 igrad_config_t.allocation */
    int ranks_per_node;       /* igrad_config_t.ranks_per_node (0: MPI's nodes) */
    int64_t dense_below;      /* igrad_config_t.dense_below (0: off) */
    int64_t link_latency_ns;  /* igrad_config_t.link_latency_ns (0) */
    int64_t link_bandwidth_mbps; /* igrad_config_t.link_bandwidth_mbps (100000) */
    int auto_sparse_reduce;   /* igrad_config_t.auto_sparse_reduce (0) */
    int64_t verify_every;     /* agreement check period (steps) */
    double comm_timeout_s;    /* bound on every collective, the trainer's own
                                 included (seconds; 0 = wait forever) */
    /* Error-feedback remedies (docs/results/remedies.md). Not given (the
     * AUTO values below) they resolve by method, train_options_resolve(). */
    int beta1_auto;           /* --beta1 not given: optim.beta1 by method */
    int ef_on_update;         /* --ef-on update: each rank clips its local gradient
                                 and takes a local AdamW step (its own moments);
                                 the engine syncs that update, which every rank
                                 applies. 0 (--ef-on grad): the engine syncs the
                                 gradient and one AdamW step follows */
    double momentum;          /* DGC momentum correction m in [0, 1); NaN = auto */
    int64_t start_iter;       /* dense warm-up steps; -1 = auto */
    const char *name_map;     /* --map FILE: user name rules before the built-in
                                 ones (igrad_name_map_load); NULL = none */
    double target_ratio;      /* > 0: ig picks the important set and kappa to send
                                 this share of *_sync's payload (igrad_target_fit;
                                 with --profile auto the engine does it when it
                                 switches); 0 = off (--release-keep and the
                                 profile's set); NaN = auto */
    int release_keep_given;   /* --release-keep was given (auto target: off) */
    const char *profile;      /* profile JSON, required for iad/ig; "auto": the
                                 engine profiles the first profile_steps steps
                                 itself and writes out/profile.json */
    const char *trace;        /* record rank 0's activity trace to this CSV */

    /* Evaluation, checkpoints, output. */
    int64_t eval_every;       /* steps between evaluations (0 = only at the end) */
    int eval_batches;         /* validation set = eval_batches * G sequences (capped
                                 by the data) */
    int64_t save_every;       /* steps between checkpoints (0 = only at the end) */
    int64_t log_every;        /* plain progress lines (0 = about 20 per run) */
    const char *out;          /* output directory (created) */
    int resume;               /* continue from out/checkpoint */
    int overwrite;            /* a fresh run may replace a checkpoint already in out
                                 (deleted once setup succeeded); else refused */
    train_progress_t progress;

    /* Online profiling (--profile auto). */
    int64_t profile_steps;    /* W: steps of the profiling window (30) */
    const char *profile_partition; /* partition method of the built profile (knee) */
    int64_t reprofile_every;  /* W': re-profile every W' steps after the switch (0 = off) */
    double reprofile_margin;  /* the hysteresis margin of re-profiling (0.05) */

    /* --early-density R:N: density R for steps [0, N), then --density; the
     * trainer re-creates the engine at step N and adds the old engine's
     * residuals into that step's gradients (0: off). */
    double early_density;
    int64_t early_steps;
} train_options_t;

/* Defaults: tiny model, T 64, G 8, 100 steps, optim_config_default() with
 * lr 1e-3, method dense, density auto (NaN: train_options_resolve), R 4, kappa 0.25, 4 buckets,
 * verify every 100 steps, collectives bounded by IGRAD_DEFAULT_TIMEOUT_S, val_fraction 0.05, eval every 50 steps over 4
 * batches, save only at the end, seed 1337. */
void train_options_default(train_options_t *o);

/* What the auto values (--beta1, --momentum, --start-iter, --density,
 * --value-dtype not given) resolve to: TRAIN_DENSE_* / TRAIN_SPARSE_* of
 * train_defaults.h (shared with igrad plan, which prices the same default).
 * Given values are kept. train_run() calls it on its own copy. */
void train_options_resolve(train_options_t *o);

/* What a finished run measured (the same on every rank). */
typedef struct train_result {
    int64_t start_step;       /* first step of this invocation (> 0 when resumed) */
    int64_t steps_done;       /* steps completed, counting earlier invocations */
    double first_loss, last_loss; /* train loss of the first/last step of this call */
    double val_loss, val_ppl, val_acc; /* last evaluation (NaN if none) */
    double task_accuracy;     /* its exact match on held-out task problems (NaN if none) */
    int64_t task_problems;    /* 0 without a task: workload */
    double f_imp;             /* important share of the sparsifier budget; NaN if
                                 no profile */
    double wall_s;            /* this invocation */
    uint64_t param_hash;      /* hash of the final parameters (all ranks equal) */
    int64_t dataplane_nbytes; /* igrad's data-plane memory on a rank (stats) */
    double dataplane_nbytes_per_param;
} train_result_t;

/* Runs (or resumes) a training run. Collective over `comm`: every rank
 * calls it with the same options. @return IGRAD_OK, or a status and
 * message in trainer_last_error() that agree across ranks. */
igrad_status_t train_run(const train_options_t *opts, igrad_comm_t *comm, train_result_t *res);

/* 1 for --profile auto (online profiling). */
static inline int train_profile_auto(const train_options_t *o)
{
    return o->profile && strcmp(o->profile, "auto") == 0;
}

/* FNV-1a hash of a float buffer's bytes (the cross-rank parameter check). */
uint64_t train_hash_floats(const float *x, int64_t n);

/* The check every evaluation runs: every rank's hash of its `n` parameters
 * against rank 0's. Collective. @return IGRAD_E_MISMATCH on every rank,
 * naming the first rank that differs, if any does. */
igrad_status_t train_check_same_params(igrad_comm_t *comm, const float *params, int64_t n,
                                      int64_t steps_done);

#endif /* IGRAD_TRAINER_TRAIN_H */
