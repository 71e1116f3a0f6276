/*
 * cmd_train.c — `igrad train`: the reference trainer's command line.
 * Parses options into train_options_t, starts MPI when launched by mpirun
 * (else runs as one rank without MPI), picks the thread count, runs
 * train_run() (trainer/train.c) and turns its status into the exit code.
 *
 * Not here: the training loop, files and metrics (trainer/train.c,
 * trainer/metrics.c).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core/names.h"
#include "core/sparsifier.h"
#include "plan_cost.h"

#ifdef IGRAD_HAVE_TRAINER
#include <mpi.h>

#include "model.h"
#include "train.h"

static void usage(FILE *fp)
{
    fprintf(fp,
"usage: [mpirun -np P] igrad train --data SPEC --out DIR [options]\n"
"\n"
"Trains the reference LLaMA (byte vocabulary) data-parallel over P ranks; every\n"
"gradient synchronization goes through igrad's engine, dense included.\n"
"\n"
"model (a fresh model unless --init; with --resume the checkpoint in --out wins):\n"
"  --size tiny|small|base      preset (default tiny); overrides: --layers L --dim C\n"
"                              --heads H --kv-heads KV --ffn F --tie --rope-theta X\n"
"                              --rms-eps X; --init-std S (default 0.02)\n"
"  --init DIR                  start from a checkpoint (config.json + model.safetensors)\n"
"data:\n"
"  --data SPEC                 text file/dir, jsonl:, alpaca:, brown:G[+G], fortunes:, kjv:,\n"
"                              task:KINDS[:train=N][:test=N][:size=S] (trainer/task.h)\n"
"                              (comma-separated list; see trainer/data.h)\n"
"  --response-only             alpaca data: loss on response tokens only\n"
"  --val-fraction F            documents held out for validation (default 0.05)\n"
"  --seq-len T                 tokens per sequence (default 64)\n"
"  --batch G                   global sequences per step, the same for any P (default 8)\n"
"  --micro-batch M             rows per forward/backward on a rank (gradient\n"
"                              accumulation; must divide G/P; default G/P)\n"
"optimization:\n"
"  --steps N (100)  --lr X (1e-3)  --min-lr X (1e-4)  --warmup N (0)\n"
"  --weight-decay X (0.1)  --clip X (1.0; 0 = off)  --seed S (1337)\n"
"  --beta1 X|auto (auto)  --beta2 X (0.95)   AdamW's moment decay rates; auto =\n"
"                              0.9 for --method dense, 0 for the sparse methods\n"
"                              (error feedback already integrates the gradient: a\n"
"                              first moment on top keeps pushing stale released\n"
"                              residuals; docs/results/remedies.md)\n"
"  --ef-on grad|update         what error feedback compresses (grad). update: each\n"
"                              rank clips its local gradient by its own global norm\n"
"                              and takes a local AdamW step with its own moments;\n"
"                              the engine syncs that update (error feedback,\n"
"                              selection and the 1/P average as for a gradient) and\n"
"                              every rank applies the result (no --resume: only\n"
"                              rank 0's moments are saved). beta1 auto as above\n"
"                              (0 measured best here too). With dense: the\n"
"                              average of the local AdamW updates\n"
"  --threads N                 OpenMP/OpenBLAS threads per rank (default\n"
"                              $OMP_NUM_THREADS, else cores / ranks on this node)\n"
"synchronization:\n");
    /* the kinds from the library's name tables (core/names.h) */
    char m[128], sp[64], sc[64], rs[64], pk[128], tp[64];
    fprintf(fp,
"  --method %s   (default dense)\n"
"  --sparsifier %-14s for iad/ig (default adtopk)\n"
"  --density RHO               entries sent per step / entries (default: "
TRAIN_STR(TRAIN_SPARSE_DENSITY) " for the\n"
"                              sparse methods, the fewest bytes within 1 %% of dense\n"
"                              on the suite, docs/results/vs_dense.md; the yardstick\n"
"                              adtopk_sync at 0.01 is --density 0.01)\n"
"  --release-period R (4)  --release-keep KAPPA (0.25)\n"
"  --schedule %s  --residual %s  --buckets B (4)\n"
"  --pack %s  --verify-every N (100)\n"
"  --topology %-16s hier: each tensor is summed onto its owner inside the\n"
"                              node, owners exchange between nodes, the result is\n"
"                              broadcast in the node (default flat; needs a profile\n"
"                              file, not --profile auto)\n"
"  --allocation partition|budget  how ig spends --target-ratio: the partition's\n"
"                              important set at one kappa (default) or the budget\n"
"                              allocated across components, each every step or at\n"
"                              its own kappa (decision 0059)\n"
"  --ranks-per-node L          ranks [kL, (k+1)L) form node k (default 0: the nodes\n"
"                              MPI reports)\n"
"  --dense-below N             tensors of fewer than N entries (norms, biases) are\n"
"                              sent whole whenever sent (default 64; 0: off)\n"
"  --link SPEC                 the link collective auto prices each bucket with\n"
"                              (igrad plan's presets or GBITS,LAT_US; for hier the\n"
"                              inter-node link). Default: latency 0, by bytes alone\n"
"  --auto-sparse-reduce        auto may take the sparse all-reduce too, where it is\n"
"                              cheapest on the link (its result is the top of the\n"
"                              sum; the rest goes to the owners' residuals)\n"
"  --value-dtype f32|bf16|fp16|fp8\n"
"                              wire values of the sparse methods (default bf16;\n"
"                              dense sends f32): bf16/fp16 send 2-byte values,\n"
"                              f32 4 bytes, fp8 1-byte E4M3 codes and a\n"
"                              power-of-two scale per block; the rounding error is\n"
"                              kept in the residual (dense all-reduces f32)\n"
"  --comm-timeout S            a collective that has not completed after S seconds\n"
"                              (a stopped or hung rank) ends the job on every rank\n"
"                              that waits, naming the step (default 300; 0 = never)\n"
"  --momentum M                DGC momentum correction in the engine, M in [0, 1):\n"
"                              velocity u = M*u + g before error feedback, u zeroed\n"
"                              where entries were sent (use with --beta1 0; one more\n"
"                              float per parameter). Default: 0 (off)\n"
"  --start-iter N              the first N steps are plain dense averages (default 0)\n"
"                              The two above act on error feedback: sparse methods\n"
"                              only. summary.json records what they resolved to\n"
"  --early-density R:N         topk_sync/adtopk_sync: density R for the first N\n"
"                              steps, then --density (the engine is re-created at\n"
"                              step N; its residuals join that step's gradients)\n"
"  --map FILE                  user name rules ('PATTERN KIND LAYER' per line, tried\n"
"                              before the built-in ones; docs/formats.md). The same on\n"
"                              every rank; a profile is tied to the rules it was made with\n"
"  --target-ratio X            ig: choose the important set and kappa from the\n"
"                              profile's scores so the payload is X times *_sync's\n"
"                              (with --profile auto: when the engine switches).\n"
"                              Default for ig: 0.25, unless --release-keep is given\n"
"                              (then the profile's set and that kappa); 0 = off\n"
"  --profile FILE|auto         importance profile (required for iad and ig); auto:\n"
"                              the engine profiles the first --profile-steps steps of\n"
"                              this run itself (sending as the sparsifier's *_sync),\n"
"                              then switches to the method; DIR/profile.json is the\n"
"                              profile it built\n"
"  --profile-steps W (30)  --profile-partition knee|otsu|kmeans2|gmm2|percentile:P|fixed:F\n"
"  --reprofile-every N (0 = off)  with --profile auto: after the switch, re-profile every\n"
"                              N steps (at a release-period boundary) and re-plan when a\n"
"                              component changed class; summary.json logs each re-profile\n"
"  --reprofile-margin M (0.05)  a component changes class only when its score is beyond\n"
"                              the threshold by M in two re-profiles in a row\n"
"  --trace FILE                record the activity trace of this run (sparse methods);\n"
"                              rank 0 writes it: the trace of rank 0's selections\n"
"evaluation, checkpoints, output:\n"
"  --eval-every N (50; 0 = at the end only)  --eval-batches K (4: K*G sequences)\n"
"  --save-every N (0 = at the end only)  --stop-at N (stop after N steps, checkpointed)\n"
"  --out DIR                   metrics.csv, eval.csv, summary.json, checkpoint/\n"
"  --resume                    continue exactly from DIR/checkpoint (same P, data,\n"
"                              batch, seq-len, seed and method; every file is\n"
"                              checked against the checksums in train_state.json)\n"
"  --overwrite                 a fresh run into a DIR that holds a checkpoint replaces\n"
"                              it (deleted at the start) and its metrics; without it,\n"
"                              such a run is refused\n"
"  --progress auto|line|plain|quiet   --log-every N (plain lines; default steps/20)\n"
"\n"
"Every rank must get the same options, except --threads, --progress, --log-every,\n"
"--trace and --overwrite (a difference fails every rank, naming the option).\n",
            igrad__names_list(&igrad__method_names, "|", m, sizeof m),
            igrad__sparsifier_list_sparse("|", sp, sizeof sp),
            igrad__names_list(&igrad__schedule_names, "|", sc, sizeof sc),
            igrad__names_list(&igrad__residual_names, "|", rs, sizeof rs),
            igrad__names_list(&igrad__pack_names, "|", pk, sizeof pk),
            igrad__names_list(&igrad__topology_names, "|", tp, sizeof tp));
}

/* Model architecture overrides on top of the preset. @return 1 consumed,
 * 0 not a model option, -1 error. */
static int model_option(int argc, char **argv, int *i, model_config_t *cfg)
{
    if (!strcmp(argv[*i], "--tie")) {
        cfg->tie_embeddings = 1;
        return 1;
    }
    static const char *const keys[] = {"layers", "dim", "heads", "kv-heads", "ffn",
                                       "rope-theta", "rms-eps"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        char name[32];
        const char *value = NULL;
        snprintf(name, sizeof name, "--%s", keys[k]);
        int r = cli_opt(argc, argv, i, name, &value);
        if (r == 0) continue;
        if (r < 0) return -1;
        if (model_config_set(cfg, keys[k], value) != IGRAD_OK) {
            fprintf(stderr, "igrad: %s: %s\n", name, trainer_last_error());
            return -1;
        }
        return 1;
    }
    return 0;
}

static int parse_int(const char *name, const char *v, int64_t lo, int64_t *out)
{
    if (cli_parse_i64(name, v, out) != 0) return -1;
    if (*out < lo) {
        fprintf(stderr, "igrad: %s must be >= %lld\n", name, (long long)lo);
        return -1;
    }
    return 0;
}

/* Parses argv into *o. @return 0, 1 for --help, -1 on a usage error. */
static int parse_args(int argc, char **argv, train_options_t *o)
{
    const char *size = "tiny";
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r = cli_opt(argc, argv, &i, "--size", &v);
        if (r < 0) return -1;
        if (r > 0) size = v;
    }
    if (model_config_preset(size, &o->model) != IGRAD_OK) {
        fprintf(stderr, "igrad: --size: %s\n", trainer_last_error());
        return -1;
    }
    o->model_name = size;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int64_t n = 0;
        double x = 0;
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        if (!strcmp(a, "--resume")) { o->resume = 1; continue; }
        if (!strcmp(a, "--overwrite")) { o->overwrite = 1; continue; }
        if (!strcmp(a, "--response-only")) { o->response_only = 1; continue; }
        if ((r = model_option(argc, argv, &i, &o->model)) != 0) {
            if (r < 0) return -1;
            continue;
        }
#define STR_OPT(flag, field)                                        \
        if ((r = cli_opt(argc, argv, &i, flag, &v)) != 0) {         \
            if (r < 0) return -1;                                   \
            o->field = v;                                           \
            continue;                                               \
        }
#define INT_OPT(flag, lo, field)                                    \
        if ((r = cli_opt(argc, argv, &i, flag, &v)) != 0) {         \
            if (r < 0 || parse_int(flag, v, lo, &n) != 0) return -1; \
            o->field = n;                                           \
            continue;                                               \
        }
#define F64_OPT(flag, field)                                        \
        if ((r = cli_opt(argc, argv, &i, flag, &v)) != 0) {         \
            if (r < 0 || cli_parse_f64(flag, v, &x) != 0) return -1; \
            o->field = x;                                           \
            continue;                                               \
        }
        if ((r = cli_opt(argc, argv, &i, "--size", &v)) != 0) continue; /* read above */
        STR_OPT("--init", init_dir)
        STR_OPT("--data", data)
        STR_OPT("--method", method)
        STR_OPT("--sparsifier", sparsifier)
        STR_OPT("--schedule", schedule)
        STR_OPT("--residual", residual)
        STR_OPT("--pack", pack)
        STR_OPT("--topology", topology)
        STR_OPT("--allocation", allocation)
        STR_OPT("--profile", profile)
        STR_OPT("--profile-partition", profile_partition)
        INT_OPT("--profile-steps", 1, profile_steps)
        INT_OPT("--reprofile-every", 0, reprofile_every)
        F64_OPT("--reprofile-margin", reprofile_margin)
        STR_OPT("--trace", trace)
        STR_OPT("--out", out)
        INT_OPT("--steps", 1, steps)
        INT_OPT("--stop-at", 0, stop_at)
        INT_OPT("--batch", 1, batch)
        INT_OPT("--micro-batch", 1, micro_batch)
        INT_OPT("--seq-len", 1, seq_len)
        INT_OPT("--warmup", 0, optim.warmup_steps)
        INT_OPT("--threads", 1, threads)
        INT_OPT("--release-period", 1, release_period)
        INT_OPT("--buckets", 1, buckets)
        INT_OPT("--ranks-per-node", 0, ranks_per_node)
        INT_OPT("--dense-below", 0, dense_below)
        INT_OPT("--verify-every", 0, verify_every)
        INT_OPT("--eval-every", 0, eval_every)
        INT_OPT("--eval-batches", 1, eval_batches)
        INT_OPT("--save-every", 0, save_every)
        INT_OPT("--log-every", 1, log_every)
        F64_OPT("--lr", optim.lr)
        F64_OPT("--min-lr", optim.min_lr)
        F64_OPT("--weight-decay", optim.weight_decay)
        F64_OPT("--clip", optim.grad_clip)
        if ((r = cli_opt(argc, argv, &i, "--beta1", &v)) != 0) {
            if (r < 0) return -1;
            if (!strcmp(v, "auto")) {
                o->beta1_auto = 1;
                continue;
            }
            if (cli_parse_f64("--beta1", v, &x) != 0) return -1;
            o->optim.beta1 = x;
            o->beta1_auto = 0;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--ef-on", &v)) != 0) {
            if (r < 0) return -1;
            if (strcmp(v, "grad") && strcmp(v, "update")) {
                fprintf(stderr, "igrad: --ef-on: '%s' is not grad or update\n", v);
                return -1;
            }
            o->ef_on_update = !strcmp(v, "update");
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--value-dtype", &v)) != 0) {
            if (r < 0 || cli_parse_value_dtype("--value-dtype", v, &o->value_dtype) != 0)
                return -1;
            o->value_dtype_auto = 0;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--link", &v)) != 0) {
            if (r < 0 || plan_engine_link_parse("igrad train: --link", v, &o->link_latency_ns,
                                                &o->link_bandwidth_mbps) != 0)
                return -1;
            continue;
        }
        if (!strcmp(argv[i], "--auto-sparse-reduce")) {
            o->auto_sparse_reduce = 1;
            continue;
        }
        F64_OPT("--momentum", momentum)
        INT_OPT("--start-iter", 0, start_iter)
        if ((r = cli_opt(argc, argv, &i, "--early-density", &v)) != 0) {
            if (r < 0) return -1;
            const char *colon = strchr(v, ':');
            char *end = NULL;
            double rho = colon ? strtod(v, &end) : NAN;
            long long steps = colon && end == colon ? strtoll(colon + 1, &end, 10) : 0;
            if (!colon || *end || !(rho > 0.0 && rho <= 1.0) || steps < 1) {
                fprintf(stderr, "igrad: --early-density: '%s' is not R:N (a density in (0, 1] "
                        "and a step count >= 1)\n", v);
                return -1;
            }
            o->early_density = rho;
            o->early_steps = (int64_t)steps;
            continue;
        }
        F64_OPT("--beta2", optim.beta2)
        F64_OPT("--density", density)
        F64_OPT("--comm-timeout", comm_timeout_s)
        if ((r = cli_opt(argc, argv, &i, "--release-keep", &v)) != 0) {
            if (r < 0 || cli_parse_f64("--release-keep", v, &x) != 0) return -1;
            o->release_keep = x;
            o->release_keep_given = 1;
            continue;
        }
        F64_OPT("--target-ratio", target_ratio)
        if ((r = cli_opt(argc, argv, &i, "--map", &v)) != 0) {
            if (r < 0) return -1;
            o->name_map = v;
            continue;
        }
        F64_OPT("--val-fraction", val_fraction)
        if ((r = cli_opt(argc, argv, &i, "--init-std", &v)) != 0) {
            if (r < 0 || cli_parse_f64("--init-std", v, &x) != 0) return -1;
            if (!(x > 0)) {
                fprintf(stderr, "igrad: --init-std must be positive\n");
                return -1;
            }
            o->init_std = (float)x;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--seed", &v)) != 0) {
            if (r < 0 || cli_parse_i64("--seed", v, &n) != 0) return -1;
            o->seed = (uint64_t)n;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--progress", &v)) != 0) {
            if (r < 0) return -1;
            if (!strcmp(v, "auto")) o->progress = TRAIN_PROGRESS_AUTO;
            else if (!strcmp(v, "line")) o->progress = TRAIN_PROGRESS_LINE;
            else if (!strcmp(v, "plain")) o->progress = TRAIN_PROGRESS_PLAIN;
            else if (!strcmp(v, "quiet")) o->progress = TRAIN_PROGRESS_QUIET;
            else {
                fprintf(stderr, "igrad: --progress: '%s' is not auto, line, plain or quiet\n", v);
                return -1;
            }
            continue;
        }
#undef STR_OPT
#undef INT_OPT
#undef F64_OPT
        fprintf(stderr, "igrad: train: unknown argument '%s' (see igrad train --help)\n", a);
        return -1;
    }
    if (!o->data || !o->out) {
        fprintf(stderr, "igrad: train: --data SPEC and --out DIR are required "
                        "(see igrad train --help)\n");
        return -1;
    }
    if (!(o->comm_timeout_s >= 0.0) || !isfinite(o->comm_timeout_s)) {
        fprintf(stderr, "igrad: train: --comm-timeout %g must be a number of seconds >= 0 "
                        "(0 = never)\n", o->comm_timeout_s);
        return -1;
    }
    return 0;
}

/* Launched by mpirun/mpiexec (Open MPI, MPICH/Hydra, PMIx)? A plain
 * `igrad train` runs as one rank and never touches MPI. */
static int under_mpi_launcher(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                       "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && v[0]) return 1;
    }
    return 0;
}

/* Threads per rank when --threads is not given: $OMP_NUM_THREADS, else the
 * cores shared by the ranks on this node (oversubscribing cores with
 * OpenMP/OpenBLAS threads of several ranks is much slower than 1 each). */
static int default_threads(int nranks)
{
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && atoi(env) > 0) return atoi(env);
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int on_node = local && atoi(local) > 0 ? atoi(local) : nranks;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = cores > 0 ? (int)(cores / (on_node > 0 ? on_node : 1)) : 1;
    return t > 0 ? t : 1;
}

int cmd_train(int argc, char **argv)
{
    train_options_t o;
    train_options_default(&o);
    int pr = parse_args(argc, argv, &o);
    if (pr == 1) {
        usage(stdout);
        return 0;
    }
    if (pr < 0) return 2;

    int use_mpi = under_mpi_launcher();
    igrad_comm_t *comm = NULL;
    igrad_status_t st;
    if (use_mpi) {
        if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
            fprintf(stderr, "igrad: train: MPI_Init failed\n");
            return 1;
        }
        st = igrad_comm_create_mpi(NULL, &comm);
    } else {
        st = igrad_comm_create_self(&comm);
    }
    if (st != IGRAD_OK) {
        fprintf(stderr, "igrad: train: communicator: %s\n", igrad_last_error());
        if (use_mpi) MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    int rank = igrad_comm_rank(comm), P = igrad_comm_size(comm);
    if (o.threads <= 0) o.threads = default_threads(P);

    train_result_t res;
    st = train_run(&o, comm, &res);
    if (st != IGRAD_OK) {
        if (rank == 0) fprintf(stderr, "igrad: train: %s\n", trainer_last_error());
        /* A failed or timed-out collective (and the communicator or engine
         * it left unusable: E_STATE) may leave ranks out of step, where a
         * clean shutdown could hang: the one case for MPI_Abort. */
        if (use_mpi && (st == IGRAD_E_COMM || st == IGRAD_E_TIMEOUT || st == IGRAD_E_STATE)) {
            if (rank != 0) fprintf(stderr, "igrad: train (rank %d): %s\n", rank,
                                   trainer_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    } else if (rank == 0 && o.progress != TRAIN_PROGRESS_QUIET) {
        char task[64] = "";
        if (res.task_problems > 0)
            snprintf(task, sizeof task, ", task_accuracy %.4f of %lld", res.task_accuracy,
                     (long long)res.task_problems);
        char mem[32];
        printf("done: %lld steps, last loss %.4f, val_loss %.4f (ppl %.3f, acc %.4f%s), %.1f s; "
               "igrad memory %s per rank (%.2f B/param); results in %s\n",
               (long long)res.steps_done, res.last_loss, res.val_loss, res.val_ppl, res.val_acc,
               task, res.wall_s, cli_human_bytes((double)res.dataplane_nbytes, mem, sizeof mem),
               res.dataplane_nbytes_per_param, o.out);
    }
    igrad_comm_free(comm);
    if (use_mpi) MPI_Finalize();
    return st == IGRAD_OK ? 0 : 1;
}

#else /* !IGRAD_HAVE_TRAINER */

int cmd_train(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "igrad: train: this build has no trainer (it needs OpenBLAS and MPI; "
                    "run scripts/bootstrap and rebuild)\n");
    return 1;
}

#endif
