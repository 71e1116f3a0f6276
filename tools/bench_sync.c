/*
 * bench_sync.c — `igrad bench sync`: the five synchronization methods timed
 * side by side over MPI (run under `mpirun -np P`; without mpirun it runs
 * as one rank) on a real model's parameter table and synthetic gradients.
 *
 * What it does, in one run:
 *  1. builds the layout from a Hugging Face config.json (remapped by
 *     --map's name rules when given, as igrad train --map does);
 *  2. makes every rank a synthetic gradient (below) and profiles it the way
 *     a real run would: --profile-steps steps of the sparsifier's *_sync
 *     method record the activity trace of their own selections, and rank
 *     0's knee profile is shared with every rank (as a profile file would
 *     be);
 *  3. times --steps steps of the memory floor of a step (below), then of
 *     dense, topk_sync, adtopk_sync, iad and ig, and ig once more per
 *     packing policy for the packing table. Every method sees the same
 *     gradients at the same step. A step's time is the slowest rank's;
 *     medians over steps are reported; bytes are means (over ranks and
 *     steps; --topology hier also reports each shard's: its owners' own
 *     payload and inter-node bytes per step, per local rank, and their
 *     min, max and max / mean over the shards).
 * The floor: one plain streaming pass per tensor over the same gradient
 * buffers and a residual-sized buffer, e = e + g then g = 0 chunk by chunk
 * (read g and e, write e and g: what any error-feedback step that hands
 * back zeroed gradients for the unpack must move), on the same threads
 * (tensors over OpenMP, like the engine). The table's /floor is a
 * method's sync ms over it.
 * Timings are never asserted anywhere; the byte counts are exact.
 *
 * The synthetic gradient (documented so that nobody mistakes it for a
 * measurement of a real model). Entry values are Laplace(1), times a
 * log-normal factor per row (sigma 0.5), so values are heavy-tailed and
 * rows differ (what separates ADTopk from top-k). Each component (layer,
 * kind) has a scale: a per-kind factor — V 1.5, O 1.3, QKV 1.0, K 0.8,
 * FC2 0.7, Q 0.6, FC1 0.5, OTHER 1.0 — times a log-normal draw (sigma 0.5),
 * the same on every rank. The kind factors follow the qualitative finding
 * of the PyTorch simulation in NOTES.md (attention V/O/K carried the
 * important gradient, MLP less); they are a plausible shape, not a fit,
 * and nothing was tuned to reach a payload target. Each step, a
 * component's scale is multiplied by exp(v * xi), xi a standard normal
 * shared by the ranks and v in [0.1, 1] a per-component volatility (so
 * persistence differs too), and the values are rotated by a step-dependent
 * offset so that selections change between steps. Ranks draw different
 * values (seed + rank).
 *
 * f_imp, printed beside the ratios, is the share of the sparsifier's
 * per-step budget (entries) that ig sends every step (important components
 * and OTHER tensors); NOTES.md: ratio ~ f_imp + kappa (1 - f_imp).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef IGRAD_HAVE_MPI
#include <mpi.h>
#endif

#include "cli.h"
#include "core/internal.h" /* igrad__create_private */
#include "core/sparsifier.h"
#include "bench_stats.h"
#include "plan_cost.h"

#define NMETHODS 5
#define NPOLICIES 5

typedef struct options {
    const char *config;
    const char *map_path; /* --map FILE or NULL */
    int64_t steps, profile_steps, buckets, block_entries, release_period, threads;
    double density, release_keep;
    igrad_pack_policy_t pack;
    igrad_sparsifier_t sparsifier;
    uint64_t seed;
    int json;
    igrad_dtype_t value_dtype; /* config.value_dtype of the sparse methods */
    igrad_collective_t collective; /* config.collective of the sparse methods */
    igrad_dtype_t grad_dtype;  /* config.grad_dtype of every method */
    igrad_topology_t topology; /* config.topology of every method */
    int64_t ranks_per_node;    /* config.ranks_per_node (0: MPI's nodes) */
    int64_t dense_below;       /* config.dense_below of the sparse methods */
    int64_t link_latency_ns, link_bandwidth_mbps; /* the link auto prices (--link) */
    int auto_sparse_reduce;    /* config.auto_sparse_reduce of the sparse methods */
    int aligned;               /* --aligned: begin, barrier, collectives, end */
    const char *profile_out;   /* --profile-out: where rank 0 saves the profile */
} options_t;

/* What one method's run produced (medians of the slowest rank's times). */
typedef struct result {
    int ran;
    double payload, wire;                  /* mean bytes per step */
    double intra, inter;                   /* wire split by level (mean per step) */
    double select_ms, pack_ms, comm_ms, unpack_ms, sync_ms;
    double comm_window_ms;                 /* stats.comm_window_ms over ranks (median) */
    double window_ms[3];                   /* its three windows (medians): bucket
                                              collectives, node sums, node broadcasts */
    double imbalance, cv, overflow;        /* medians; overflow: mean per step */
    double mem_per_param;                  /* stats.dataplane_nbytes_per_param */
    int buckets;                           /* median collectives per step */
    /* --topology hier: each shard's bytes per step as its owners' engines
     * sent them (stats.payload_nbytes and inter_wire_nbytes of the shard
     * engine on each rank, gathered; a shard's: the mean over its N
     * owners), per local rank (nshards of them), and their spread */
    int nshards;
    double *shard_payload, *shard_inter;   /* (nshards) mean bytes per step */
    bench_shards_t shards_payload, shards_inter;
} result_t;

/* The synthetic gradients of this rank. */
typedef struct synth {
    size_t T;
    int64_t *n;
    float **base;   /* one step's values before scaling and rotation */
    float **g;      /* the gradient (F32) */
    float *base_mem, *g_mem;
    uint16_t *g16_mem; /* --grad-dtype bf16/fp16: g rounded, what the engine gets */
    float **g16;       /* (T) pointers into g16_mem, cast as the API takes them */
    double *scale;  /* static scale per tensor (its component's) */
    double *vol;    /* volatility per tensor */
    uint64_t *id;   /* per tensor: what its step factor is drawn from */
    uint64_t seed;
} synth_t;

static int rank_, nranks_ = 1, use_mpi_;

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: [mpirun -np P] igrad bench sync [options]\n"
            "\n"
            "Times dense, topk_sync, adtopk_sync, iad and ig on a model's layout with\n"
            "synthetic heavy-tailed gradients (profiled first, like a real run), and\n"
            "packs ig's payload with every packing policy. One table (or --json).\n"
            "\n"
            "options:\n"
            "  --config PATH          HF config.json (configs/opt-125m.json)\n"
            "  --map FILE             user name rules ('PATTERN KIND LAYER' per line, tried\n"
            "                         before the built-in ones; docs/formats.md), applied to\n"
            "                         --config's layout before it is profiled\n"
            "  --steps S              timed steps per method (20)\n"
            "  --profile-steps W      profiling window (16)\n"
            "  --density RHO          sparsifier density (0.01)\n"
            "  --release-period R     low components released every R steps (4)\n"
            "  --release-keep KAPPA   ig release keeps ceil(kappa R k) (0.25)\n"
                        "  --buckets B            buckets per step (4)\n"
            "  --block-entries N      entries per packing block (16384)\n"
            "  --pack POLICY          policy of the ig row: direct, sequential, greedy,\n"
            "                         risk, contiguous (contiguous)\n"
            "  --sparsifier SP        sparsifier of iad and ig: topk, adtopk (adtopk)\n"
            "  --value-dtype DT       wire values of the sparse methods: f32, bf16, fp16, fp8\n"
            "                         (f32; dense always all-reduces f32)\n"
            "  --collective C         the sparse methods' buckets: auto, gather, reduce\n"
            "                         or sparse_reduce (auto)\n"
            "  --grad-dtype DT        gradients the engines read and write in place:\n"
            "                         f32, bf16, fp16 (f32; the floor stays f32)\n"
            "  --threads N            OpenMP threads per rank (cores / ranks on the node)\n"
            "  --topology T           flat or hier (flat): hier sums each tensor onto its\n"
            "                         owner in the node and exchanges between nodes\n"
            "  --ranks-per-node L     ranks per node (0: the nodes MPI reports)\n"
            "  --dense-below N        tensors of fewer entries are sent whole (64; 0: off)\n"
            "  --link SPEC            the link collective auto prices (igrad plan's presets\n"
            "                         or GBITS,LAT_US; default: latency 0, bytes alone)\n"
            "  --auto-sparse-reduce   auto may take the sparse all-reduce (sparse methods)\n"
            "  --aligned              comm is the step's collectives timed from a barrier\n"
            "                         (begin, barrier, the buckets issued together, end):\n"
            "                         their own time, without the wait for ranks still\n"
            "                         selecting (what igrad plan projects; flat only)\n"
            "  --profile-out PATH     save the profile the runs use (JSON, rank 0), for\n"
            "                         igrad plan --profile\n"
            "  --seed N               synthetic data seed (1)\n"
            "  --json                 print one JSON object instead of the table\n"
            "  --help                 this text\n");
}

static int parse_args(int argc, char **argv, options_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
        if (!strcmp(argv[i], "--json")) {
            o->json = 1;
            continue;
        }
#define OPT_I64(name, field, lo)                                                        \
        if ((r = cli_opt(argc, argv, &i, name, &v)) != 0) {                             \
            if (r < 0 || cli_parse_i64(name, v, &o->field) < 0) return -1;              \
            if (o->field < (lo)) {                                                      \
                fprintf(stderr, "igrad: %s must be >= %d\n", name, (int)(lo));          \
                return -1;                                                              \
            }                                                                           \
            continue;                                                                   \
        }
#define OPT_F64(name, field)                                                            \
        if ((r = cli_opt(argc, argv, &i, name, &v)) != 0) {                             \
            if (r < 0 || cli_parse_f64(name, v, &o->field) < 0) return -1;              \
            continue;                                                                   \
        }
        OPT_I64("--steps", steps, 1)
        OPT_I64("--profile-steps", profile_steps, 1)
        OPT_I64("--buckets", buckets, 1)
        OPT_I64("--block-entries", block_entries, 1)
        OPT_I64("--release-period", release_period, 1)
        OPT_I64("--threads", threads, 1)
        OPT_I64("--ranks-per-node", ranks_per_node, 0)
        OPT_I64("--dense-below", dense_below, 0)
        OPT_F64("--density", density)
        OPT_F64("--release-keep", release_keep)
#undef OPT_I64
#undef OPT_F64
        if ((r = cli_opt(argc, argv, &i, "--grad-dtype", &v)) != 0) {
            if (r < 0 || cli_parse_value_dtype("--grad-dtype", v, &o->grad_dtype) != 0)
                return 1;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--value-dtype", &v)) != 0) {
            if (r < 0 || cli_parse_value_dtype("--value-dtype", v, &o->value_dtype) != 0)
                return -1;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--collective", &v)) != 0) {
            if (r < 0) return -1;
            if (igrad_collective_from_name(v, &o->collective) != IGRAD_OK) {
                fprintf(stderr, "igrad bench sync: --collective is '%s' (auto, gather, reduce "
                                "or sparse_reduce)\n", v);
                return -1;
            }
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--link", &v)) != 0) {
            if (r < 0 || plan_engine_link_parse("igrad bench sync: --link", v,
                                                &o->link_latency_ns,
                                                &o->link_bandwidth_mbps) != 0)
                return -1;
            continue;
        }
        if (!strcmp(argv[i], "--auto-sparse-reduce")) {
            o->auto_sparse_reduce = 1;
            continue;
        }
        if (!strcmp(argv[i], "--aligned")) {
            o->aligned = 1;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--topology", &v)) != 0) {
            if (r < 0) return -1;
            if (igrad_topology_from_name(v, &o->topology) != IGRAD_OK) {
                fprintf(stderr, "igrad: --topology: %s\n", igrad_last_error());
                return -1;
            }
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--config", &v)) != 0) {
            if (r < 0) return -1;
            o->config = v;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--profile-out", &v)) != 0) {
            if (r < 0) return -1;
            o->profile_out = v;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--map", &v)) != 0) {
            if (r < 0) return -1;
            o->map_path = v;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--seed", &v)) != 0) {
            int64_t s;
            if (r < 0 || cli_parse_i64("--seed", v, &s) < 0) return -1;
            o->seed = (uint64_t)s;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--pack", &v)) != 0) {
            if (r < 0) return -1;
            if (igrad_pack_policy_from_name(v, &o->pack) != IGRAD_OK) {
                fprintf(stderr, "igrad: --pack: %s\n", igrad_last_error());
                return -1;
            }
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--sparsifier", &v)) != 0) {
            if (r < 0) return -1;
            if (igrad_sparsifier_from_name(v, &o->sparsifier) != IGRAD_OK ||
                igrad__sparsifier_dense(o->sparsifier)) {
                char sp[64];
                fprintf(stderr, "igrad: --sparsifier: '%s' (%s)\n", v,
                        igrad__sparsifier_list_sparse(", ", sp, sizeof sp));
                return -1;
            }
            continue;
        }
        fprintf(stderr, "igrad: bench sync: unknown argument '%s'\n", argv[i]);
        return -1;
    }
    if (!(o->density > 0.0 && o->density <= 1.0)) {
        fprintf(stderr, "igrad: --density must be in (0, 1]\n");
        return -1;
    }
    if (!(o->release_keep > 0.0 && o->release_keep <= 1.0)) {
        fprintf(stderr, "igrad: --release-keep must be in (0, 1]\n");
        return -1;
    }
    if (o->aligned && (o->topology == IGRAD_TOPOLOGY_HIER || o->auto_sparse_reduce ||
                       o->collective == IGRAD_COLLECTIVE_SPARSE_REDUCE)) {
        fprintf(stderr, "igrad: bench sync: --aligned times the buckets of igrad_engine_begin, "
                        "which the two-level sync and the sparse all-reduce do not have "
                        "(drop --topology hier / --auto-sparse-reduce / --collective "
                        "sparse_reduce)\n");
        return -1;
    }
    return 0;
}

/* ---- MPI glue (one rank without MPI) ----------------------------------------- */

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

/* Element-wise mean over ranks (bytes per GPU: a hierarchical engine's
 * ranks own different shards). */
static void mean_over_ranks(double *x, int n)
{
#ifdef IGRAD_HAVE_MPI
    if (use_mpi_) MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
#endif
    for (int i = 0; i < n; i++) x[i] /= (double)nranks_;
}

/* Element-wise max over ranks (the slowest rank's time). */
static void max_over_ranks(double *x, int n)
{
#ifdef IGRAD_HAVE_MPI
    if (use_mpi_) MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
#else
    (void)x, (void)n;
#endif
}

/* Whether any rank failed a local phase (so all stop together instead of
 * some waiting in the next collective). */
static int any_failed(int rc)
{
#ifdef IGRAD_HAVE_MPI
    if (use_mpi_) MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
#endif
    return rc != 0;
}

static void barrier(void)
{
#ifdef IGRAD_HAVE_MPI
    if (use_mpi_) MPI_Barrier(MPI_COMM_WORLD);
#endif
}

/* Ranks on this node: cores are shared between them. */
static int ranks_on_node(void)
{
#ifdef IGRAD_HAVE_MPI
    if (use_mpi_) {
        MPI_Comm node;
        int n = 1;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        MPI_Comm_size(node, &n);
        MPI_Comm_free(&node);
        return n;
    }
#endif
    return 1;
}

/* This rank's shard under --topology hier: its local rank, as the engine
 * forms nodes (ranks_per_node L: ranks [nL, nL + L), in rank order; 0:
 * the nodes MPI reports, in rank order); -1 for a flat engine. */
static int shard_of_rank(const options_t *o)
{
    if (o->topology != IGRAD_TOPOLOGY_HIER) return -1;
    if (o->ranks_per_node > 0) return rank_ % (int)o->ranks_per_node;
#ifdef IGRAD_HAVE_MPI
    if (use_mpi_) {
        MPI_Comm node;
        int r = 0;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &r);
        MPI_Comm_free(&node);
        return r;
    }
#endif
    return 0;
}

/* Every rank's x, in rank order, into all (nranks_). */
static void gather_ranks(double x, double *all)
{
    all[0] = x;
#ifdef IGRAD_HAVE_MPI
    if (use_mpi_) MPI_Allgather(&x, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, MPI_COMM_WORLD);
#endif
}

/* res->shard_*: each rank's measured bytes per step (payload, inter) and
 * shard gathered, summed up per shard. @return 0, or 1 (out of memory). */
static int shard_bytes(const options_t *o, double payload, double inter, result_t *res)
{
    res->nshards = 0;
    int mine = shard_of_rank(o);
    if (mine < 0) return 0;
    double *all = calloc((size_t)nranks_ * 3, sizeof *all);
    int *shard = calloc((size_t)nranks_, sizeof *shard);
    res->shard_payload = calloc((size_t)nranks_, sizeof *res->shard_payload);
    res->shard_inter = calloc((size_t)nranks_, sizeof *res->shard_inter);
    int rc = any_failed(!all || !shard || !res->shard_payload || !res->shard_inter);
    if (!rc) {
        gather_ranks(payload, all);
        gather_ranks(inter, all + nranks_);
        gather_ranks((double)mine, all + 2 * nranks_);
        for (int r = 0; r < nranks_; r++) shard[r] = (int)all[2 * nranks_ + r];
        rc = bench_shard_bytes(all, shard, nranks_, res->shard_payload, &res->shards_payload) ||
             bench_shard_bytes(all + nranks_, shard, nranks_, res->shard_inter,
                               &res->shards_inter);
        res->nshards = res->shards_payload.n; /* local ranks 0 .. L-1 */
    }
    free(all);
    free(shard);
    return rc;
}

static void result_free(result_t *r)
{
    free(r->shard_payload);
    free(r->shard_inter);
    r->shard_payload = r->shard_inter = NULL;
}

/* ---- synthetic gradients ------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static double uniform01(uint64_t *s) /* (0, 1) */
{
    *s += 0x9e3779b97f4a7c15ULL;
    return ((double)(mix64(*s) >> 11) + 0.5) * 0x1.0p-53;
}

static double normal(uint64_t *s)
{
    double u1 = uniform01(s), u2 = uniform01(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static double kind_factor(igrad_kind_t k)
{
    switch (k) {
    case IGRAD_KIND_V: return 1.5;
    case IGRAD_KIND_O: return 1.3;
    case IGRAD_KIND_QKV: return 1.0;
    case IGRAD_KIND_K: return 0.8;
    case IGRAD_KIND_FC2: return 0.7;
    case IGRAD_KIND_Q: return 0.6;
    case IGRAD_KIND_FC1: return 0.5;
    default: return 1.0;
    }
}

static void synth_free(synth_t *s)
{
    free(s->n);
    free(s->base);
    free(s->g);
    free(s->base_mem);
    free(s->g_mem);
    free(s->g16_mem);
    free(s->g16);
    free(s->scale);
    free(s->vol);
    free(s->id);
    memset(s, 0, sizeof *s);
}

static int synth_init(synth_t *s, const igrad_layout_t *L, uint64_t seed, int threads,
                      igrad_dtype_t grad_dtype)
{
    memset(s, 0, sizeof *s);
    s->T = igrad_layout_count(L);
    s->seed = seed;
    size_t T = s->T;
    int64_t total = igrad_layout_total_count(L);
    s->n = calloc(T, sizeof *s->n);
    s->base = calloc(T, sizeof *s->base);
    s->g = calloc(T, sizeof *s->g);
    s->scale = calloc(T, sizeof *s->scale);
    s->vol = calloc(T, sizeof *s->vol);
    s->id = calloc(T, sizeof *s->id);
    s->base_mem = malloc((size_t)total * sizeof(float));
    s->g_mem = malloc((size_t)total * sizeof(float));
    if (!s->n || !s->base || !s->g || !s->scale || !s->vol || !s->id || !s->base_mem ||
        !s->g_mem) {
        fprintf(stderr, "igrad: bench sync: out of memory for 2 x %lld gradient entries\n",
                (long long)total);
        synth_free(s);
        return 1;
    }
    int64_t off = 0;
    int64_t *rows = calloc(T, sizeof *rows);
    if (!rows) {
        synth_free(s);
        return 1;
    }
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        igrad_layout_tensor(L, t, &ti);
        s->n[t] = ti.count;
        s->base[t] = s->base_mem + off;
        s->g[t] = s->g_mem + off;
        off += ti.count;
        rows[t] = ti.ndim >= 2 ? ti.shape[0] : 1;
        /* component-level draws are the same on every rank: they describe
         * the model, not the rank's data */
        uint64_t key = ti.component >= 0 ? (uint64_t)ti.component : 100000u + (uint64_t)t;
        uint64_t cs = mix64(seed ^ mix64(key + 17));
        s->scale[t] = kind_factor(ti.kind) * exp(0.5 * normal(&cs));
        s->vol[t] = 0.1 + 0.9 * uniform01(&cs);
        s->id[t] = key;
    }
    int64_t Tn = (int64_t)T;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
#else
    (void)threads;
#endif
    for (int64_t t = 0; t < Tn; t++) {
        uint64_t st = mix64(seed * 0x100000001b3ULL + (uint64_t)rank_ * 7919u + (uint64_t)t);
        int64_t cols = s->n[t] / rows[t];
        float *x = s->base[t];
        for (int64_t r = 0; r < rows[t]; r++) {
            double rf = exp(0.5 * normal(&st));
            for (int64_t c = 0; c < cols; c++) {
                double v = uniform01(&st) - 0.5;
                double lap = -copysign(log1p(-2.0 * fabs(v)), v);
                x[r * cols + c] = (float)(lap * rf);
            }
        }
    }
    free(rows);
    if (grad_dtype != IGRAD_DTYPE_F32) {
        s->g16_mem = malloc((size_t)total * sizeof *s->g16_mem);
        s->g16 = calloc(T, sizeof *s->g16);
        if (!s->g16_mem || !s->g16) {
            fprintf(stderr, "igrad: bench sync: out of memory for the 16-bit gradients\n");
            synth_free(s);
            return 1;
        }
        for (size_t t = 0, o16 = 0; t < T; o16 += (size_t)s->n[t], t++)
            s->g16[t] = (float *)(void *)(s->g16_mem + o16);
    }
    return 0;
}

/* What the engine is given: g, or g rounded into its 16-bit codes. */
static float *const *synth_grads(synth_t *s, igrad_dtype_t grad_dtype)
{
    if (grad_dtype == IGRAD_DTYPE_F32) return s->g;
    for (size_t t = 0; t < s->T; t++)
        igrad_convert(s->g[t], IGRAD_DTYPE_F32, s->g16[t], grad_dtype, (size_t)s->n[t]);
    return s->g16;
}

/* The gradient of `step`: base rotated by a step offset, times the
 * tensor's scale and its step factor. */
static void synth_fill(synth_t *s, int64_t step, int threads)
{
    int64_t Tn = (int64_t)s->T;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
#else
    (void)threads;
#endif
    for (int64_t t = 0; t < Tn; t++) {
        uint64_t st = mix64(s->seed ^ mix64(s->id[t] * 1000003u + (uint64_t)step));
        float f = (float)(s->scale[t] * exp(s->vol[t] * normal(&st)) * 1e-3);
        int64_t n = s->n[t], shift = (int64_t)(((uint64_t)step * 7919u + (uint64_t)t) % (uint64_t)n);
        const float *b = s->base[t];
        float *g = s->g[t];
        for (int64_t i = 0; i < n - shift; i++) g[i] = b[i + shift] * f;
        for (int64_t i = n - shift; i < n; i++) g[i] = b[i - (n - shift)] * f;
    }
}

/* ---- statistics helpers --------------------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ---- the runs --------------------------------------------------------------------------- */

/* The floor pass over one tensor: e = e + g, g = 0, in chunks whose
 * constant trip count lets -O2 vectorize (a fair, fast loop: every ratio
 * against it would flatter igrad otherwise). */
#define FLOOR_CHUNK 4096
static void floor_tensor(float *restrict g, float *restrict e, int64_t n)
{
    int64_t i = 0;
    for (; i + FLOOR_CHUNK <= n; i += FLOOR_CHUNK) {
        for (int j = 0; j < FLOOR_CHUNK; j++) e[i + j] = e[i + j] + g[i + j];
        memset(g + i, 0, FLOOR_CHUNK * sizeof *g);
    }
    for (; i < n; i++) {
        e[i] = e[i] + g[i];
        g[i] = 0.0f;
    }
}

/* Median ms over --steps steps of the floor pass (slowest rank), on the
 * step's synthetic gradients and a zeroed residual of the model's size.
 * @return NAN when the residual cannot be allocated. */
static double run_floor(const options_t *o, synth_t *s, int64_t total)
{
    float *e_mem = calloc((size_t)total, sizeof *e_mem);
    double *col = calloc((size_t)o->steps, sizeof *col);
    int64_t *off = calloc(s->T + 1, sizeof *off);
    if (!e_mem || !col || !off) {
        free(e_mem);
        free(col);
        free(off);
        return NAN;
    }
    for (size_t t = 1; t < s->T; t++) off[t] = off[t - 1] + s->n[t - 1];
    for (int64_t step = 0; step <= o->steps; step++) {
        synth_fill(s, step, (int)o->threads);
        barrier();
        double t0 = now_ms();
        int64_t Tn = (int64_t)s->T;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)o->threads)
#endif
        for (int64_t t = 0; t < Tn; t++) floor_tensor(s->g[t], e_mem + off[t], s->n[t]);
        double ms = now_ms() - t0;
        max_over_ranks(&ms, 1);
        if (step > 0) col[step - 1] = ms; /* step 0 warms up, as for the methods */
    }
    double med = bench_median(col, (int)o->steps);
    free(off);
    free(col);
    free(e_mem);
    return med;
}

static igrad_config_t make_config(const options_t *o, igrad_method_t m, igrad_pack_policy_t pack)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = m;
    c.sparsifier = o->sparsifier;
    c.density = o->density;
    c.release_period = (int)o->release_period;
    c.release_keep = o->release_keep;
    c.buckets = (int)o->buckets;
    c.block_entries = o->block_entries;
    c.pack = pack;
    c.threads = (int)o->threads;
    if (m != IGRAD_METHOD_DENSE) {
        c.value_dtype = o->value_dtype;
        c.collective = o->collective;
    }
    c.grad_dtype = o->grad_dtype;
    c.topology = o->topology;
    c.ranks_per_node = (int)o->ranks_per_node;
    c.dense_below = o->dense_below;
    c.link_latency_ns = o->link_latency_ns;
    c.link_bandwidth_mbps = o->link_bandwidth_mbps;
    if (m != IGRAD_METHOD_DENSE) c.auto_sparse_reduce = o->auto_sparse_reduce;
    return c;
}

static int fail(const char *what, igrad_status_t st)
{
    if (rank_ == 0) cli_fail(what, st);
    return 1;
}

/* One step for --aligned: begin (agreement, selection, packing), a barrier,
 * every bucket's collective issued at once in bucket order and waited for
 * in that order (as igrad_engine_sync() issues them), then end (unpacking).
 * *comm_ms: this rank's time from the barrier to the last completion. */
static igrad_status_t aligned_step(igrad_engine_t *e, igrad_comm_t *comm, int64_t step,
                                   float *const *grads, double *comm_ms)
{
    const igrad_bucket_t *bk = NULL;
    size_t nb = 0;
    igrad_status_t st = igrad_engine_begin(e, step, grads, &bk, &nb);
    if (st != IGRAD_OK) return st;
    igrad_comm_request_t **req = calloc(nb ? nb : 1, sizeof *req);
    if (!req) return IGRAD_E_NOMEM;
    barrier();
    double t0 = now_ms();
    size_t issued = 0;
    for (; issued < nb; issued++) {
        const igrad_bucket_t *b = &bk[issued];
        st = b->kind == IGRAD_BUCKET_GATHER
                 ? igrad_comm_iallgather(comm, b->send, b->send_nbytes, b->recv, &req[issued])
                 : igrad_comm_iallreduce(comm, b->send, b->recv, b->count, IGRAD_DTYPE_F32,
                                         IGRAD_REDUCE_SUM, &req[issued]);
        if (st != IGRAD_OK) break;
    }
    for (size_t j = 0; j < issued; j++) {
        igrad_status_t ws = igrad_comm_wait(comm, req[j]);
        if (st == IGRAD_OK) st = ws;
    }
    *comm_ms = now_ms() - t0;
    free(req);
    if (st != IGRAD_OK) return st;
    return igrad_engine_end(e, step, grads);
}

/* Warm-up step 0, then steps 1..S timed. */
static int run_method(const options_t *o, const igrad_layout_t *L, const igrad_profile_t *P,
                      igrad_comm_t *comm, synth_t *s, igrad_method_t m,
                      igrad_pack_policy_t pack, result_t *res, double *f_imp)
{
    igrad_config_t c = make_config(o, m, pack);
    igrad_engine_t *e = NULL;
    igrad_status_t st = igrad_engine_create(L, P, &c, comm, &e);
    if (st != IGRAD_OK) return fail(igrad_method_name(m), st);
    if (f_imp) {
        double every = 0, all = 0;
        for (size_t t = 0; t < s->T; t++) {
            igrad_tensor_plan_t tp;
            igrad_engine_tensor_plan(e, t, &tp);
            all += (double)tp.count;
            if (tp.every_step) every += (double)tp.count;
        }
        *f_imp = all > 0 ? every / all : 0.0;
    }
    int S = (int)o->steps;
    double *col[12];
    for (int k = 0; k < 12; k++) {
        col[k] = calloc((size_t)S, sizeof(double));
        if (!col[k]) {
            for (int j = 0; j < k; j++) free(col[j]);
            igrad_engine_free(e);
            return fail("out of memory", IGRAD_E_NOMEM);
        }
    }
    memset(res, 0, sizeof *res);
    double payload = 0, wire = 0, intra = 0, inter = 0, overflow = 0;
    double own_payload = 0, own_inter = 0; /* this rank's (its shard's), summed */
    int rc = 0;
    for (int64_t step = 0; step <= S; step++) {
        synth_fill(s, step, (int)o->threads);
        float *const *grads = synth_grads(s, o->grad_dtype);
        barrier();
        double aligned_ms = 0.0;
        st = o->aligned ? aligned_step(e, comm, step, grads, &aligned_ms)
                        : igrad_engine_sync(e, step, grads);
        if (st != IGRAD_OK) {
            rc = fail(igrad_method_name(m), st);
            break;
        }
        if (step == 0) continue;
        igrad_step_stats_t ss;
        igrad_engine_last_stats(e, &ss);
        if (o->aligned) ss.comm_ms = aligned_ms; /* begin/end time no collective */
        /* each window from the last rank's start to the last rank's end
         * (one host: the ranks share CLOCK_MONOTONIC) */
        double win[6];
        for (int q = 0; q < 6; q++) win[q] = ss.comm_window_ms[q];
        max_over_ranks(win, 6);
        double window_ms = 0.0;
        for (int q = 0; q < 6; q += 2) {
            double w = win[q] > 0.0 && win[q + 1] > win[q] ? win[q + 1] - win[q] : 0.0;
            col[9 + q / 2][(int)step - 1] = w;
            window_ms += w;
        }
        double t[5] = {ss.select_ms, ss.pack_ms, ss.comm_ms, ss.unpack_ms, ss.total_ms};
        max_over_ranks(t, 5);
        int k = (int)step - 1;
        for (int q = 0; q < 5; q++) col[q][k] = t[q];
        col[8][k] = window_ms;
        col[5][k] = ss.imbalance;
        col[6][k] = ss.cv;
        col[7][k] = (double)ss.buckets;
        own_payload += (double)ss.payload_nbytes;
        own_inter += ss.inter_wire_nbytes;
        double bytes[4] = {(double)ss.payload_nbytes, ss.wire_nbytes, ss.intra_wire_nbytes,
                           ss.inter_wire_nbytes};
        mean_over_ranks(bytes, 4);
        payload += bytes[0];
        wire += bytes[1];
        intra += bytes[2];
        inter += bytes[3];
        res->mem_per_param = ss.dataplane_nbytes_per_param;
        overflow += ss.overflow;
    }
    if (!rc) {
        res->ran = 1;
        res->payload = payload / S;
        res->wire = wire / S;
        res->intra = intra / S;
        res->inter = inter / S;
        res->select_ms = bench_median(col[0], S);
        res->pack_ms = bench_median(col[1], S);
        res->comm_ms = bench_median(col[2], S);
        res->comm_window_ms = bench_median(col[8], S);
        for (int q = 0; q < 3; q++) res->window_ms[q] = bench_median(col[9 + q], S);
        res->unpack_ms = bench_median(col[3], S);
        res->sync_ms = bench_median(col[4], S);
        res->imbalance = bench_median(col[5], S);
        res->cv = bench_median(col[6], S);
        res->buckets = (int)bench_median(col[7], S);
        res->overflow = overflow / S;
        if (shard_bytes(o, own_payload / S, own_inter / S, res))
            rc = fail("shard bytes: out of memory", IGRAD_E_NOMEM);
    }
    for (int k = 0; k < 12; k++) free(col[k]);
    igrad_engine_free(e);
    return rc;
}

/* Profiles the synthetic gradients with the sparsifier's *_sync method and
 * gives every rank rank 0's profile (through its JSON text). */
static int build_profile(const options_t *o, const igrad_layout_t *L, igrad_comm_t *comm,
                         synth_t *s, igrad_profile_t **out)
{
    igrad_method_t m = o->sparsifier == IGRAD_SPARSIFIER_TOPK ? IGRAD_METHOD_TOPK_SYNC
                                                              : IGRAD_METHOD_ADTOPK_SYNC;
    igrad_config_t c = make_config(o, m, IGRAD_PACK_CONTIGUOUS);
    c.topology = IGRAD_TOPOLOGY_FLAT; /* a trace records a flat engine's selections */
    igrad_engine_t *e = NULL;
    igrad_trace_t *tr = NULL;
    igrad_status_t st = igrad_engine_create(L, NULL, &c, comm, &e);
    if (st != IGRAD_OK) return fail("profile run", st);
    if ((st = igrad_trace_create(L, &tr)) != IGRAD_OK ||
        (st = igrad_engine_set_trace(e, tr)) != IGRAD_OK) {
        igrad_engine_free(e);
        igrad_trace_free(tr);
        return fail("trace", st);
    }
    /* negative steps would be refused by the trace: profile steps come
     * first, the timed runs reuse step numbers from 0 on other engines */
    for (int64_t step = 0; step < o->profile_steps; step++) {
        synth_fill(s, step, (int)o->threads);
        if ((st = igrad_engine_sync(e, step, synth_grads(s, o->grad_dtype))) != IGRAD_OK) {
            igrad_engine_free(e);
            igrad_trace_free(tr);
            return fail("profile run", st);
        }
    }
    igrad_engine_free(e);

    char path[64] = "";
    char *text = NULL;
    long nbytes = 0;
    if (rank_ == 0) {
        igrad_profile_options_t po = IGRAD_PROFILE_OPTIONS_INIT;
        igrad_profile_t *p = NULL;
        st = igrad_profile_build(tr, &po, &p);
        if (st == IGRAD_OK) {
            snprintf(path, sizeof path, "/tmp/igrad-bench-profile-%ld.json", (long)getpid());
            st = igrad_profile_save_json(p, path);
            igrad_profile_free(p);
        }
        if (st != IGRAD_OK) {
            cli_fail("profile", st);
            nbytes = -1;
        } else {
            FILE *fp = fopen(path, "rb");
            if (fp && fseek(fp, 0, SEEK_END) == 0 && (nbytes = ftell(fp)) > 0 &&
                fseek(fp, 0, SEEK_SET) == 0 && (text = malloc((size_t)nbytes)) &&
                fread(text, 1, (size_t)nbytes, fp) == (size_t)nbytes) {
            } else {
                fprintf(stderr, "igrad: bench sync: cannot read back %s\n", path);
                nbytes = -1;
            }
            if (fp) fclose(fp);
            unlink(path);
        }
    }
    igrad_trace_free(tr);
#ifdef IGRAD_HAVE_MPI
    if (use_mpi_) {
        MPI_Bcast(&nbytes, 1, MPI_LONG, 0, MPI_COMM_WORLD);
        if (nbytes > 0 && rank_ != 0) text = malloc((size_t)nbytes);
        if (nbytes > 0) MPI_Bcast(text, (int)nbytes, MPI_CHAR, 0, MPI_COMM_WORLD);
    }
#endif
    if (nbytes <= 0) {
        free(text);
        return 1;
    }
    snprintf(path, sizeof path, "/tmp/igrad-bench-profile-r%d.json", rank_);
    char *tmp = NULL; /* created O_EXCL | O_NOFOLLOW under a private name */
    int fd = igrad__create_private(path, &tmp);
    FILE *fp = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0 && !fp) close(fd);
    int ok = fp && fwrite(text, 1, (size_t)nbytes, fp) == (size_t)nbytes;
    if (fp && fclose(fp) != 0) ok = 0;
    free(text);
    st = ok ? igrad_profile_load(tmp, L, out) : IGRAD_E_IO;
    if (tmp) unlink(tmp);
    free(tmp);
    if (!ok) fprintf(stderr, "igrad: bench sync: cannot write %s\n", path);
    if (st != IGRAD_OK) return ok ? fail("profile", st) : 1;
    return 0;
}

/* ---- output ----------------------------------------------------------------------------- */

static void json_num(const char *key, double v, int last)
{
    if (isfinite(v)) printf("\"%s\": %.12g%s", key, v, last ? "" : ", ");
    else printf("\"%s\": null%s", key, last ? "" : ", ");
}

static void json_method(const result_t *r)
{
    json_num("payload_bytes_per_step", r->payload, 0);
    json_num("wire_bytes_per_step", r->wire, 0);
    json_num("intra_wire_bytes_per_step", r->intra, 0);
    json_num("inter_wire_bytes_per_step", r->inter, 0);
    json_num("select_ms", r->select_ms, 0);
    json_num("pack_ms", r->pack_ms, 0);
    json_num("comm_ms", r->comm_ms, 0);
    json_num("comm_window_ms", r->comm_window_ms, 0);
    printf("\"comm_windows_ms\": {\"buckets\": %.12g, \"node_sums\": %.12g, "
           "\"node_broadcasts\": %.12g}, ", r->window_ms[0], r->window_ms[1], r->window_ms[2]);
    json_num("unpack_ms", r->unpack_ms, 0);
    json_num("sync_ms", r->sync_ms, 0);
    json_num("buckets", r->buckets, 0);
    json_num("imbalance", r->imbalance, 0);
    json_num("dataplane_bytes_per_param", r->mem_per_param, 0);
    json_num("cv", r->cv, 0);
    if (!r->nshards) {
        printf("\"shards\": null");
        return;
    }
    /* per shard (local rank): its owners' measured bytes per step */
    printf("\"shards\": {\"count\": %d, ", r->nshards);
    const double *v[2] = {r->shard_payload, r->shard_inter};
    const bench_shards_t *sp[2] = {&r->shards_payload, &r->shards_inter};
    const char *key[2] = {"payload", "inter_wire"};
    for (int q = 0; q < 2; q++) {
        printf("\"%s_bytes_per_step\": [", key[q]);
        for (int l = 0; l < r->nshards; l++) printf("%s%.12g", l ? ", " : "", v[q][l]);
        printf("], \"%s_min\": %.12g, \"%s_max\": %.12g, \"%s_mean\": %.12g, ", key[q],
               sp[q]->min, key[q], sp[q]->max, key[q], sp[q]->mean);
        json_num(q ? "inter_wire_max_over_mean" : "payload_max_over_mean",
                 sp[q]->max_over_mean, q == 1);
    }
    printf("}");
}

static const igrad_method_t methods[NMETHODS] = {IGRAD_METHOD_DENSE, IGRAD_METHOD_TOPK_SYNC,
                                                 IGRAD_METHOD_ADTOPK_SYNC, IGRAD_METHOD_IAD,
                                                 IGRAD_METHOD_IG};

static void print_json(const options_t *o, const igrad_layout_t *L, const result_t *res,
                       const result_t *packing, double f_imp, double f_other, int nimp,
                       int ncomp, double floor_ms)
{
    double topk = res[1].payload, own = res[o->sparsifier == IGRAD_SPARSIFIER_TOPK ? 1 : 2].payload;
    printf("{\"ranks\": %d, ", nranks_);
    printf("\"layout\": {\"config\": \"%s\", \"family\": \"%s\", \"tensors\": %zu, "
           "\"params\": %lld, \"components\": %d, \"important_components\": %d}, ",
           o->config, igrad_layout_family(L), igrad_layout_count(L),
           (long long)igrad_layout_total_count(L), ncomp, nimp);
    printf("\"steps\": %lld, \"profile_steps\": %lld, ", (long long)o->steps,
           (long long)o->profile_steps);
    printf("\"knobs\": {\"density\": %g, \"release_period\": %lld, \"release_keep\": %g, "
           "\"buckets\": %lld, \"block_entries\": %lld, \"pack\": \"%s\", \"sparsifier\": "
           "\"%s\", \"value_dtype\": \"%s\", \"collective\": \"%s\", \"grad_dtype\": \"%s\", "
           "\"threads\": %lld, \"topology\": \"%s\", \"ranks_per_node\": %lld, \"seed\": %llu, "
           "\"aligned\": %s}, ",
           o->density, (long long)o->release_period, o->release_keep, (long long)o->buckets,
           (long long)o->block_entries, igrad_pack_policy_name(o->pack),
           igrad_sparsifier_name(o->sparsifier), igrad_dtype_name(o->value_dtype),
           igrad_collective_name(o->collective),
           igrad_dtype_name(o->grad_dtype), (long long)o->threads,
           igrad_topology_name(o->topology), (long long)o->ranks_per_node,
           (unsigned long long)o->seed, o->aligned ? "true" : "false");
    json_num("f_imp", f_imp, 0);
    json_num("f_other", f_other, 0);
    json_num("predicted_ig_ratio", f_imp + o->release_keep * (1.0 - f_imp), 0);
    json_num("floor_ms", floor_ms, 0);
    printf("\"methods\": {");
    for (int k = 0; k < NMETHODS; k++) {
        igrad_method_t m = methods[k];
        printf("\"%s\": {", igrad_method_name(m));
        json_method(&res[k]);
        printf(", ");
        json_num("ratio_to_floor", res[k].sync_ms / floor_ms, 0);
        json_num("ratio_to_topk_sync", topk > 0 ? res[k].payload / topk : NAN,
                 m != IGRAD_METHOD_IAD && m != IGRAD_METHOD_IG);
        if (m == IGRAD_METHOD_IAD || m == IGRAD_METHOD_IG) {
            json_num("ratio_to_sparsifier_sync", own > 0 ? res[k].payload / own : NAN, 0);
            json_num("f_imp", f_imp, 1);
        }
        if (m == IGRAD_METHOD_IG) {
            printf(", \"packing\": {");
            for (int p = 0; p < NPOLICIES; p++) {
                printf("\"%s\": {", igrad_pack_policy_name((igrad_pack_policy_t)p));
                json_num("imbalance", packing[p].imbalance, 0);
                json_num("cv", packing[p].cv, 0);
                json_num("overflow", packing[p].overflow, 0);
                json_num("sync_ms", packing[p].sync_ms, 1);
                printf("}%s", p + 1 < NPOLICIES ? ", " : "");
            }
            printf("}");
        }
        printf("}%s", k + 1 < NMETHODS ? ", " : "");
    }
    printf("}}\n");
}

static void print_table(const options_t *o, const igrad_layout_t *L, const result_t *res,
                        const result_t *packing, double f_imp, double f_other, int nimp,
                        int ncomp, double floor_ms, double wall_s)
{
    char b1[32], b2[32];
    const char *own_name = o->sparsifier == IGRAD_SPARSIFIER_TOPK ? "topk_sync" : "adtopk_sync";
    double topk = res[1].payload, own = res[o->sparsifier == IGRAD_SPARSIFIER_TOPK ? 1 : 2].payload;
    printf("igrad bench sync: %s (%s, %zu tensors, %lld params), %d rank(s), %lld timed "
           "steps, %lld profile steps\n",
           o->config, igrad_layout_family(L), igrad_layout_count(L),
           (long long)igrad_layout_total_count(L), nranks_, (long long)o->steps,
           (long long)o->profile_steps);
    printf("density %g, R %lld, kappa %g, B %lld, sparsifier %s, values %s, grads %s, "
           "%lld thread(s)/rank; profile: %d of %d components important\n",
           o->density, (long long)o->release_period, o->release_keep, (long long)o->buckets,
           igrad_sparsifier_name(o->sparsifier), igrad_dtype_name(o->value_dtype),
           igrad_dtype_name(o->grad_dtype),
           (long long)o->threads, nimp, ncomp);
    printf("f_imp %.3f (outside the projections: %.3f of the budget); predicted ig ratio f_imp + kappa (1 - f_imp) "
           "= %.3f\n\n",
           f_imp, f_other, f_imp + o->release_keep * (1.0 - f_imp));
    printf("floor (read g and e, write e and g): %.2f ms\n", floor_ms);
    printf("%-12s %12s %12s %8s %8s %6s %8s %8s %8s %8s %8s %7s %7s\n", "method", "payload/step",
           "wire/step", "/topk", "/own", "f_imp", "select", "pack", "comm", "unpack", "sync ms",
           "/floor", "B/param");
    for (int k = 0; k < NMETHODS; k++) {
        igrad_method_t m = methods[k];
        int defer = m == IGRAD_METHOD_IAD || m == IGRAD_METHOD_IG;
        char own_r[16] = "-", fi[16] = "-";
        if (defer) {
            snprintf(own_r, sizeof own_r, "%.3f", own > 0 ? res[k].payload / own : NAN);
            snprintf(fi, sizeof fi, "%.3f", f_imp);
        }
        char label[24];
        snprintf(label, sizeof label, "%s%s", igrad_method_name(m),
                 m == IGRAD_METHOD_IG ? "*" : "");
        printf("%-12s %12s %12s %8.3f %8s %6s %8.2f %8.2f %8.2f %8.2f %8.2f %7.2f %7.3f\n",
               label, cli_human_bytes(res[k].payload, b1, sizeof b1),
               cli_human_bytes(res[k].wire, b2, sizeof b2),
               topk > 0 ? res[k].payload / topk : NAN, own_r, fi, res[k].select_ms,
               res[k].pack_ms, res[k].comm_ms, res[k].unpack_ms, res[k].sync_ms,
               res[k].sync_ms / floor_ms, res[k].mem_per_param);
    }
    printf("(/own: ratio to %s, the same sparsifier; * ig packs with %s; times: medians of "
           "the slowest rank; /floor: sync ms over the floor pass; B/param: igrad's data-plane "
           "memory per parameter on a rank)\n\n",
           own_name, igrad_pack_policy_name(o->pack));
    printf("ig packing, %lld buckets:\n%-12s %10s %8s %10s %8s\n", (long long)o->buckets,
           "policy", "imbalance", "cv", "overflow", "sync ms");
    for (int p = 0; p < NPOLICIES; p++)
        printf("%-12s %10.3f %8.3f %10.2f %8.2f\n", igrad_pack_policy_name((igrad_pack_policy_t)p),
               packing[p].imbalance, packing[p].cv, packing[p].overflow, packing[p].sync_ms);
    printf("(imbalance max/min bucket bytes, cv std/mean: medians over steps; overflow: "
           "buckets > 1.05 x mean per step)\n");
    if (res[0].nshards) {
        printf("\nhier shards (%d; each shard's bytes per step as its owners' engines sent "
               "them):\n%-12s %12s %12s %8s %12s %12s %8s\n",
               res[0].nshards, "method", "payload min", "max", "max/mean", "inter min", "max",
               "max/mean");
        for (int k = 0; k < NMETHODS; k++) {
            const result_t *r = &res[k];
            char b3[32], b4[32];
            printf("%-12s %12s %12s %8.3f %12s %12s %8.3f\n", igrad_method_name(methods[k]),
                   cli_human_bytes(r->shards_payload.min, b1, sizeof b1),
                   cli_human_bytes(r->shards_payload.max, b2, sizeof b2),
                   r->shards_payload.max_over_mean,
                   cli_human_bytes(r->shards_inter.min, b3, sizeof b3),
                   cli_human_bytes(r->shards_inter.max, b4, sizeof b4),
                   r->shards_inter.max_over_mean);
        }
    }
    printf("wall %.1f s\n", wall_s);
}

/* ---- entry --------------------------------------------------------------------------------- */

int bench_sync(int argc, char **argv)
{
    options_t o = {.config = "configs/opt-125m.json",
                   .steps = 20,
                   .profile_steps = 16,
                   .buckets = 4,
                   .block_entries = 16384,
                   .release_period = IGRAD_DEFAULT_RELEASE_PERIOD,
                   .dense_below = IGRAD_DEFAULT_DENSE_BELOW,
                   .threads = 0,
                   .density = 0.01,
                   .release_keep = IGRAD_DEFAULT_RELEASE_KEEP,
                   .link_bandwidth_mbps = 100000, /* IGRAD_CONFIG_INIT's */
                   .pack = IGRAD_PACK_CONTIGUOUS,
                   .sparsifier = IGRAD_SPARSIFIER_ADTOPK,
                   .collective = IGRAD_COLLECTIVE_AUTO,
                   .seed = 1,
                   .json = 0};
    int pr = parse_args(argc, argv, &o);
    if (pr == 1) {
        usage(stdout);
        return 0;
    }
    if (pr < 0) {
        usage(stderr);
        return 2;
    }
    if (access(o.config, R_OK) != 0) {
        /* run from a build directory: the shipped configs are in the source */
        const char *src = getenv("IGRAD_SOURCE_DIR");
        static char alt[4096];
        if (src && o.config[0] != '/') {
            snprintf(alt, sizeof alt, "%s/%s", src, o.config);
            if (access(alt, R_OK) == 0) o.config = alt;
        }
    }

    use_mpi_ = 0;
#ifdef IGRAD_HAVE_MPI
    if (under_mpi_launcher()) {
        if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
            fprintf(stderr, "igrad: bench sync: MPI_Init failed\n");
            return 1;
        }
        use_mpi_ = 1;
    }
#endif
    igrad_comm_t *comm = NULL;
    igrad_status_t st = use_mpi_ ? igrad_comm_create_mpi(NULL, &comm)
                                 : igrad_comm_create_self(&comm);
    if (st != IGRAD_OK) {
        fprintf(stderr, "igrad: bench sync: communicator: %s\n", igrad_last_error());
#ifdef IGRAD_HAVE_MPI
        if (use_mpi_) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
        return 1;
    }
    rank_ = igrad_comm_rank(comm);
    nranks_ = igrad_comm_size(comm);
    if (o.threads <= 0) {
        const char *env = getenv("OMP_NUM_THREADS");
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int local = ranks_on_node();
        o.threads = env && atoi(env) > 0 ? atoi(env) : (cores > 0 ? cores / local : 1);
        if (o.threads < 1) o.threads = 1;
    }

    int rc = 1;
    double t0 = now_ms();
    igrad_layout_t *L = NULL;
    igrad_profile_t *P = NULL;
    synth_t s;
    memset(&s, 0, sizeof s);
    result_t res[NMETHODS], packing[NPOLICIES];
    memset(res, 0, sizeof res);
    memset(packing, 0, sizeof packing);
    double f_imp = 0.0, f_other = 0.0, floor_ms = NAN;
    int nimp = 0, ncomp = 0;

    st = igrad_layout_from_hf_config(o.config, &L);
    if (st != IGRAD_OK) {
        fail(o.config, st);
        goto done;
    }
    if ((st = cli_apply_map(o.map_path, &L)) != IGRAD_OK) {
        fail("--map", st);
        goto done;
    }
    if (any_failed(synth_init(&s, L, o.seed, (int)o.threads, o.grad_dtype))) goto done;
    if (any_failed(build_profile(&o, L, comm, &s, &P))) goto done;
    if (o.profile_out) {
        st = rank_ == 0 ? igrad_profile_save_json(P, o.profile_out) : IGRAD_OK;
        if (any_failed(st != IGRAD_OK ? fail("--profile-out", st) : 0)) goto done;
    }
    ncomp = (int)igrad_profile_count(P);
    for (int i = 0; i < ncomp; i++) {
        igrad_profile_entry_t pe;
        igrad_profile_entry(P, (size_t)i, &pe);
        nimp += pe.important;
    }
    if (!o.json && rank_ == 0) fprintf(stderr, "igrad: bench sync: floor...\n");
    floor_ms = run_floor(&o, &s, igrad_layout_total_count(L));
    for (int k = 0; k < NMETHODS; k++) {
        igrad_method_t m = methods[k];
        if (m == IGRAD_METHOD_IG) continue; /* from the packing runs */
        if (!o.json && rank_ == 0) fprintf(stderr, "igrad: bench sync: %s...\n", igrad_method_name(m));
        if (run_method(&o, L, P, comm, &s, m, o.pack, &res[k], NULL)) goto done;
    }
    for (int p = 0; p < NPOLICIES; p++) {
        if (!o.json && rank_ == 0)
            fprintf(stderr, "igrad: bench sync: ig, %s packing...\n",
                    igrad_pack_policy_name((igrad_pack_policy_t)p));
        if (run_method(&o, L, P, comm, &s, IGRAD_METHOD_IG, (igrad_pack_policy_t)p, &packing[p],
                       &f_imp))
            goto done;
    }
    res[NMETHODS - 1] = packing[o.pack];
    /* the share of the budget outside the projections (OTHER, EMB, HEAD, NORM) */
    {
        igrad_config_t c = make_config(&o, IGRAD_METHOD_IG, o.pack);
        double other = 0, all = 0;
        for (size_t t = 0; t < s.T; t++) {
            igrad_tensor_info_t ti;
            igrad_select_spec_t sp;
            igrad_layout_tensor(L, t, &ti);
            igrad_select_spec(c.sparsifier, c.density, 1.0, 0, 0, ti.ndim, ti.shape, &sp);
            all += (double)sp.count;
            if (ti.component < 0 || ti.kind == IGRAD_KIND_EMB || ti.kind == IGRAD_KIND_HEAD ||
                ti.kind == IGRAD_KIND_NORM)
                other += (double)sp.count;
        }
        f_other = all > 0 ? other / all : 0.0;
    }
    if (rank_ == 0) {
        if (o.json) print_json(&o, L, res, packing, f_imp, f_other, nimp, ncomp, floor_ms);
        else print_table(&o, L, res, packing, f_imp, f_other, nimp, ncomp, floor_ms,
                         (now_ms() - t0) / 1e3);
    }
    rc = 0;
done:
    for (int k = 0; k < NMETHODS - 1; k++) result_free(&res[k]); /* res[ig]: packing's */
    for (int p = 0; p < NPOLICIES; p++) result_free(&packing[p]);
    synth_free(&s);
    igrad_profile_free(P);
    igrad_layout_free(L);
    igrad_comm_free(comm);
#ifdef IGRAD_HAVE_MPI
    if (use_mpi_) MPI_Finalize();
#endif
    return rc;
}
