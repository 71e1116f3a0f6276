/*
 * cmd_plan.c — `igrad plan`: for a model layout and P ranks (N nodes of L),
 * every method's exact payload and wire bytes per step over the whole
 * release cycle, from the engine's own plan (igrad_engine_create_plan /
 * igrad_engine_plan_step: the buckets and routes a real run would issue),
 * and a projected sync and step time from the α-β model of plan_cost.c.
 * Every method runs on two engine routes: flat (one ring over all P ranks)
 * and hier (config.topology hier: node sums onto the owners, the shard
 * engines' buckets among the N owners, node broadcasts), both planned by
 * the engine, bytes per level from its statistics. The published sparse
 * all-reduce and the dense bf16 baseline are priced by formula from the
 * same per-bucket payload and labelled "projected". Flat collectives and
 * the baseline are priced as NCCL runs them over the node's
 * --nics-per-node NICs (plan_cost.h); --overlap prices what backward
 * hides: DDP's buckets for the baseline, the streamed step for the flat
 * route, nothing for hier and the sparse all-reduce.
 * --map FILE remaps the layout's names first, as igrad train --map does.
 * --allocation budget prices ig with config.allocation budget (the
 * target's bytes allocated across components, decision 0059; the flat
 * route only, as the engine allows) and lists each component's class from
 * the same igrad__allocate the engine's plan calls; partition (the
 * default) lists the target fit's.
 * The sparse rows default to what igrad train runs without flags
 * (TRAIN_SPARSE_DENSITY, TRAIN_SPARSE_VALUE_DTYPE of trainer/train_defaults.h,
 * decision 0064); dense rows stay F32, as train's dense does.
 * docs/plan.md says what every number means and where its formula comes
 * from.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan/allocate.h" /* igrad__allocate: the engine plan's own allocation */
#include "plan_cost.h"
#include "train_defaults.h" /* TRAIN_SPARSE_*: igrad train's defaults */

#define PLAN_MAX_METHODS 8

typedef struct plan_opts {
    const char *config_path, *profile_path, *map_path;
    int64_t ranks, per_node;
    plan_level_t net[2];      /* [0] intra, [1] inter: a link per collective */
    double compute_ms;        /* < 0: from the FLOP model */
    double mfu, peak_tflops;
    int64_t tokens_per_rank;
    igrad_method_t methods[PLAN_MAX_METHODS];
    int nmethods;
    double density, target_ratio; /* target_ratio 0: ig uses the profile as it is */
    int64_t release_period, buckets;
    igrad_dtype_t value_dtype;
    igrad_index_code_t index_code; /* config.index_code of the sparse methods */
    igrad_allocation_t allocation; /* config.allocation of ig */
    igrad_collective_t collective;
    int auto_sparse_reduce;   /* config.auto_sparse_reduce of the sparse methods */
    int latency_overlap;      /* --latency overlap: a step's buckets' latencies overlap */
    int64_t nics;             /* --nics-per-node K; 0: one per GPU (L) */
    int overlap;              /* --overlap: sync hidden behind backward where it can be */
    double backward_share;    /* backward's share of compute (--backward-share) */
    int json;
} plan_opts_t;

/* Per-step values of one (method, route) row over the cycle. */
typedef struct plan_series {
    double min, max, sum;
    int64_t n;
} plan_series_t;

#define PLAN_CYCLE_LISTED 64 /* cycles up to this long are listed step by step (JSON) */

typedef struct plan_row {
    const char *method, *route;
    int projected;
    plan_series_t payload, wire, intra, inter, intra_ms, inter_ms, sync_ms, collectives;
    plan_series_t nic;        /* bytes through the busiest NIC of a node */
    plan_series_t exposed_ms; /* the part of sync_ms not hidden behind backward */
    plan_series_t gather, reduce, sar; /* the engine's routes: buckets per step */
    plan_series_t tree;       /* dense_bf16: all-reduces NCCL would run as trees */
    const char *overlap_model; /* how exposed_ms was priced (docs/plan.md §2b) */
    double step_payload[PLAN_CYCLE_LISTED], step_sync_ms[PLAN_CYCLE_LISTED];
    double *shard_sum; /* (2 L) hier: per local rank, Σ over the cycle of its
                          buckets' payload and wire bytes; owned */
} plan_row_t;

static void series_add(plan_series_t *s, double v)
{
    if (s->n == 0 || v < s->min) s->min = v;
    if (s->n == 0 || v > s->max) s->max = v;
    s->sum += v;
    s->n++;
}

static double series_mean(const plan_series_t *s) { return s->n ? s->sum / (double)s->n : 0.0; }

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: igrad plan --config MODEL.json --ranks P [options]\n"
            "\n"
            "Exact payload and wire bytes per step (every step of the release cycle) from\n"
            "the engine's own plan for P ranks, and a projected sync and step time from an\n"
            "alpha-beta model (docs/plan.md). Nothing is run and no gradient is needed.\n"
            "\n"
            "  --config FILE          model: HF config.json (or anything `igrad layout` reads)\n"
            "  --map FILE             user name rules ('PATTERN KIND LAYER' per line, tried\n"
            "                         before the built-in ones; docs/formats.md), applied to\n"
            "                         --config before anything else; a --profile must be\n"
            "                         made with the same rules\n"
            "  --profile FILE         profile for ig/iad (default: a synthetic one, scores by\n"
            "                         a fixed rule; ig's bytes then follow --target-ratio)\n"
            "  --ranks P              data-parallel ranks (GPUs)\n"
            "  --ranks-per-node L     ranks per node (8; P must be a multiple, or P < L)\n"
            "  --link intra=SPEC      link inside a node (nvlink)\n"
            "  --link inter=SPEC      link between nodes: one NIC (100g; per GPU with the\n"
            "                         default one NIC per GPU)\n"
            "  --nics-per-node K      NICs per node (default L, one per GPU as on HGX/DGX\n"
            "                         nodes; 1 for a node with one NIC); K divides L. NCCL's\n"
            "                         rings spread over all K; hier shards share them\n"
            "                         SPEC: a preset or GBITS,LAT_US (e.g. 100,8)\n"
            "  --link LEVEL.COLL=SPEC one collective's own alpha-beta on a level (a fit of\n"
            "                         igrad bench comm); COLL: allgather, allreduce, reduce,\n"
            "                         bcast; wins over LEVEL=SPEC in any order\n"
            "  --compute-ms MS        compute time per step (default: 6 N tokens / (MFU peak))\n"
            "  --overlap              hide sync behind backward where the route can: dense\n"
            "                         bf16 as DDP (25 MiB buckets as backward fills them),\n"
            "                         igrad's flat route as its streamed step; hier and\n"
            "                         sparse all-reduce rows sync after backward\n"
            "  --backward-share X     backward's share of compute for --overlap (0.667: 4 of\n"
            "                         the 6 N FLOPs per token)\n"
            "  --tokens-per-rank T    tokens per rank per step for the default (16384)\n"
            "  --mfu X                model FLOP utilisation for the default (0.40)\n"
            "  --peak-tflops X        peak bf16 TFLOP/s per GPU for the default (989, H100)\n"
            "  --method LIST          comma-separated (dense,topk_sync,adtopk_sync,ig)\n"
            "  --density X            sparsifier density (%g: igrad train's default for the\n"
            "                         sparse methods, TRAIN_SPARSE_DENSITY)\n"
            "  --target-ratio X       ig: payload X times adtopk_sync's (0.5 with the synthetic\n"
            "                         profile; with --profile: the profile as it is unless given)\n"
            "  --allocation A         ig: partition (the target fit's important set, one\n"
            "                         kappa for the rest; the default) or budget (the\n"
            "                         target's bytes allocated across components, each\n"
            "                         every step or at a kappa of its own; decision 0059;\n"
            "                         needs a target, flat route only: no hier row)\n"
            "  --release-period R     (%d)\n"
            "  --buckets B            (4)\n"
            "  --value-dtype D        wire values of the sparse methods: f32, bf16, fp16 or\n"
            "                         fp8 (%s: igrad train's default, TRAIN_SPARSE_VALUE_DTYPE);\n"
            "                         dense rows are F32 as train's dense\n"
            "  --index-code C         compact or fixed: how indices are coded (compact;\n"
            "                         docs/formats.md section 8)\n"
            "  --collective C         auto, gather, reduce or sparse_reduce (auto); auto\n"
            "                         prices every bucket with the link its collectives\n"
            "                         cross (inter with more than one node, else intra):\n"
            "                         the engine's config.link_latency_ns/bandwidth_mbps\n"
            "  --auto-sparse-reduce   auto may take the sparse all-reduce too\n"
            "                         (config.auto_sparse_reduce)\n"
            "  --latency sum|overlap  a step's bucket collectives: each pays its latency\n"
            "                         terms in turn (sum, default: NCCL runs a group's\n"
            "                         collectives one after another) or all are in flight\n"
            "                         at once and the step pays the largest (overlap: the\n"
            "                         engine's non-blocking MPI buckets); bandwidth terms\n"
            "                         add up either way\n"
            "  --json                 one JSON object instead of the table\n"
            "  --list-links           print the link presets and exit\n"
            "  -h, --help             this text\n",
            TRAIN_SPARSE_DENSITY, IGRAD_DEFAULT_RELEASE_PERIOD,
            igrad_dtype_name(TRAIN_SPARSE_VALUE_DTYPE));
}

static int parse_methods(const char *text, plan_opts_t *o)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    o->nmethods = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (o->nmethods == PLAN_MAX_METHODS) {
            fprintf(stderr, "igrad plan: --method: more than %d methods\n", PLAN_MAX_METHODS);
            return -1;
        }
        if (igrad_method_from_name(tok, &o->methods[o->nmethods]) != IGRAD_OK) {
            fprintf(stderr,
                    "igrad plan: --method: '%s' is not a method (dense, topk_sync, "
                    "adtopk_sync, iad, ig)\n",
                    tok);
            return -1;
        }
        o->nmethods++;
    }
    if (o->nmethods == 0) {
        fprintf(stderr, "igrad plan: --method is empty\n");
        return -1;
    }
    return 0;
}

/* 0 ok, 1 exit 0 (help), -1 usage error (printed). */
static int parse_args(int argc, char **argv, plan_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--list-links")) {
            plan_link_print_presets(stdout);
            return 1;
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
#define OPT(name) ((r = cli_opt(argc, argv, &i, name, &v)) != 0)
        if (OPT("--config")) {
            if (r < 0) return -1;
            o->config_path = v;
        } else if (OPT("--map")) {
            if (r < 0) return -1;
            o->map_path = v;
        } else if (OPT("--profile")) {
            if (r < 0) return -1;
            o->profile_path = v;
        } else if (OPT("--ranks")) {
            if (r < 0 || cli_parse_i64("ranks", v, &o->ranks)) return -1;
        } else if (OPT("--ranks-per-node")) {
            if (r < 0 || cli_parse_i64("ranks-per-node", v, &o->per_node)) return -1;
        } else if (OPT("--link")) {
            if (r < 0 || plan_level_parse(v, o->net)) return -1;
        } else if (OPT("--compute-ms")) {
            if (r < 0 || cli_parse_f64("compute-ms", v, &o->compute_ms)) return -1;
            if (o->compute_ms < 0) {
                fprintf(stderr, "igrad plan: --compute-ms is %g (must be >= 0)\n", o->compute_ms);
                return -1;
            }
        } else if (OPT("--nics-per-node")) {
            if (r < 0 || cli_parse_i64("nics-per-node", v, &o->nics)) return -1;
            if (o->nics < 1) {
                fprintf(stderr, "igrad plan: --nics-per-node is %lld (must be >= 1)\n",
                        (long long)o->nics);
                return -1;
            }
        } else if (!strcmp(a, "--overlap")) {
            o->overlap = 1;
        } else if (OPT("--backward-share")) {
            if (r < 0 || cli_parse_f64("backward-share", v, &o->backward_share)) return -1;
            if (!(o->backward_share > 0.0 && o->backward_share <= 1.0)) {
                fprintf(stderr, "igrad plan: --backward-share is %g (must be in (0, 1])\n",
                        o->backward_share);
                return -1;
            }
        } else if (OPT("--tokens-per-rank")) {
            if (r < 0 || cli_parse_i64("tokens-per-rank", v, &o->tokens_per_rank)) return -1;
        } else if (OPT("--mfu")) {
            if (r < 0 || cli_parse_f64("mfu", v, &o->mfu)) return -1;
        } else if (OPT("--peak-tflops")) {
            if (r < 0 || cli_parse_f64("peak-tflops", v, &o->peak_tflops)) return -1;
        } else if (OPT("--method")) {
            if (r < 0 || parse_methods(v, o)) return -1;
        } else if (OPT("--density")) {
            if (r < 0 || cli_parse_f64("density", v, &o->density)) return -1;
        } else if (OPT("--target-ratio")) {
            if (r < 0 || cli_parse_f64("target-ratio", v, &o->target_ratio)) return -1;
            if (!(o->target_ratio > 0.0 && o->target_ratio <= 1.0)) {
                fprintf(stderr, "igrad plan: --target-ratio is %g (must be in (0, 1])\n",
                        o->target_ratio);
                return -1;
            }
        } else if (OPT("--allocation")) {
            if (r < 0) return -1;
            if (strcmp(v, "partition") && strcmp(v, "budget")) {
                fprintf(stderr, "igrad plan: --allocation is '%s' (partition or budget)\n", v);
                return -1;
            }
            o->allocation = strcmp(v, "budget") ? IGRAD_ALLOCATION_PARTITION
                                                : IGRAD_ALLOCATION_BUDGET;
        } else if (OPT("--release-period")) {
            if (r < 0 || cli_parse_i64("release-period", v, &o->release_period)) return -1;
        } else if (OPT("--buckets")) {
            if (r < 0 || cli_parse_i64("buckets", v, &o->buckets)) return -1;
        } else if (OPT("--value-dtype")) {
            if (r < 0 || cli_parse_value_dtype("value-dtype", v, &o->value_dtype)) return -1;
        } else if (OPT("--index-code")) {
            if (r < 0) return -1;
            if (igrad_index_code_from_name(v, &o->index_code) != IGRAD_OK) {
                fprintf(stderr, "igrad plan: --index-code is '%s' (compact or fixed)\n", v);
                return -1;
            }
        } else if (!strcmp(a, "--auto-sparse-reduce")) {
            o->auto_sparse_reduce = 1;
        } else if (OPT("--latency")) {
            if (r < 0) return -1;
            if (strcmp(v, "sum") && strcmp(v, "overlap")) {
                fprintf(stderr, "igrad plan: --latency is '%s' (sum or overlap)\n", v);
                return -1;
            }
            o->latency_overlap = !strcmp(v, "overlap");
        } else if (OPT("--collective")) {
            if (r < 0) return -1;
            if (igrad_collective_from_name(v, &o->collective) != IGRAD_OK) {
                fprintf(stderr,
                        "igrad plan: --collective is '%s' (auto, gather, reduce or "
                        "sparse_reduce)\n",
                        v);
                return -1;
            }
        } else {
            fprintf(stderr, "igrad plan: unknown argument '%s' (see igrad plan --help)\n", a);
            return -1;
        }
#undef OPT
    }
    if (!o->config_path) {
        fprintf(stderr, "igrad plan: --config MODEL.json is required\n");
        return -1;
    }
    if (o->ranks < 1 || o->ranks > (1 << 20)) {
        fprintf(stderr, "igrad plan: --ranks is %lld (give P in [1, 1048576])\n",
                (long long)o->ranks);
        return -1;
    }
    if (o->per_node < 1) {
        fprintf(stderr, "igrad plan: --ranks-per-node is %lld (must be >= 1)\n",
                (long long)o->per_node);
        return -1;
    }
    if (o->per_node > o->ranks) { /* one partly filled node */
        o->per_node = o->ranks;
        if (o->nics > o->per_node) o->nics = o->per_node;
    }
    if (o->nics == 0) o->nics = o->per_node; /* one NIC per GPU */
    if (o->nics > o->per_node || o->per_node % o->nics != 0) {
        fprintf(stderr, "igrad plan: --nics-per-node %lld does not divide --ranks-per-node %lld\n",
                (long long)o->nics, (long long)o->per_node);
        return -1;
    }
    if (o->ranks % o->per_node != 0) {
        fprintf(stderr, "igrad plan: --ranks %lld is not a multiple of --ranks-per-node %lld\n",
                (long long)o->ranks, (long long)o->per_node);
        return -1;
    }
    if (o->compute_ms < 0 && (!(o->mfu > 0.0 && o->mfu <= 1.0) || !(o->peak_tflops > 0.0) ||
                              o->tokens_per_rank < 1)) {
        fprintf(stderr, "igrad plan: --mfu must be in (0, 1], --peak-tflops > 0 and "
                        "--tokens-per-rank >= 1 (or give --compute-ms)\n");
        return -1;
    }
    return 0;
}

/* A profile whose scores follow a fixed rule over the components (the
 * bytes of ig then depend on the fitted important share and kappa, not
 * on which components those are). */
static igrad_status_t synthetic_profile(const igrad_layout_t *layout, igrad_profile_t **out)
{
    igrad_trace_t *tr = NULL;
    igrad_status_t st = igrad_trace_create(layout, &tr);
    for (int64_t s = 0; st == IGRAD_OK && s < 4; s++)
        for (size_t t = 0; st == IGRAD_OK && t < igrad_layout_count(layout); t++) {
            igrad_tensor_info_t ti;
            st = igrad_layout_tensor(layout, t, &ti);
            if (st != IGRAD_OK || ti.component < 0) continue;
            double act = (double)((ti.component * 7) % 5 + 1) + 0.1 * (double)s;
            st = igrad_trace_record(tr, s, t, act * act, 1);
        }
    if (st == IGRAD_OK) {
        igrad_profile_options_t po = IGRAD_PROFILE_OPTIONS_INIT;
        st = igrad_profile_build(tr, &po, out);
    }
    igrad_trace_free(tr);
    return st;
}

/* The steps of one full cycle: R for deferring methods (2R when odd and
 * interleaving), else 1 or 2. */
static int64_t cycle_steps(const igrad_config_t *c)
{
    int64_t R = (c->method == IGRAD_METHOD_IG || c->method == IGRAD_METHOD_IAD)
                    ? c->release_period
                    : 1;
    return (c->interleave && R % 2) ? 2 * R : R;
}

typedef struct plan_ctx {
    const plan_opts_t *o;
    const igrad_layout_t *layout;
    igrad_profile_t *profile; /* loaded or synthetic; NULL until needed */
    int synthetic;
    int64_t N, L;
    const plan_level_t *flat; /* the flat ring's slowest level */
    plan_fabric_t fab[PLAN_NCOLL];  /* flat: P ranks in N nodes of L, K NICs */
    plan_fabric_t hfab[PLAN_NCOLL]; /* hier shard exchange: N ranks, one per node */
    double compute_s, backward_s;
    plan_time_t ddp;                /* --overlap: dense bf16 as DDP's buckets, whole step */
    double ddp_exposed_s, ddp_tree;
    int64_t ddp_buckets;
    plan_row_t rows[PLAN_MAX_METHODS * 3 + 1];
    int nrows;
    int64_t cycle;
    double ig_ratio;          /* the fit's planned ratio (ig), 0 if none */
    int ig_met;               /* the target is met (ig with a target) */
    size_t ncomp;             /* ig with a target: the layout's components, */
    unsigned char *comp_every; /* (ncomp) 1: sent every step (the plan's) */
    double *comp_keep;        /* (ncomp) a deferred one's kappa */
    int64_t nparams;
} plan_ctx_t;

static plan_row_t *new_row(plan_ctx_t *x, const char *method, const char *route, int projected)
{
    plan_row_t *r = &x->rows[x->nrows++];
    memset(r, 0, sizeof *r);
    r->method = method;
    r->route = route;
    r->projected = projected;
    return r;
}

/* The rows one plan engine's cycle fills: `engine` the engine's own route
 * (flat or hier, as its config says); on a flat engine, `bf16` (dense
 * method only) the same buckets as a bf16 ring all-reduce and `sar` (a
 * plan forced to gather, so every bucket carries its sparse payload) the
 * projected sparse all-reduce. NULL: not wanted. */
typedef struct plan_targets {
    plan_row_t *engine, *bf16, *sar;
} plan_targets_t;

/* One step's values of one row. exposed_s < 0: all of the sync is exposed. */
typedef struct plan_point {
    double payload, wire, intra, inter, intra_s, inter_s, nic, exposed_s, tree;
} plan_point_t;

static void row_add(plan_row_t *r, int64_t step, const plan_point_t *p, int64_t buckets,
                    const igrad_step_stats_t *s)
{
    if (!r) return;
    series_add(&r->gather, s ? (double)s->gather_buckets : 0.0);
    series_add(&r->reduce, s ? (double)s->reduce_buckets : 0.0);
    series_add(&r->sar, s ? (double)s->sparse_reduce_buckets : 0.0);
    double ms = 1e3 * (p->intra_s + p->inter_s);
    if (step < PLAN_CYCLE_LISTED) {
        r->step_payload[step] = p->payload;
        r->step_sync_ms[step] = ms;
    }
    series_add(&r->payload, p->payload);
    series_add(&r->wire, p->wire);
    series_add(&r->intra, p->intra);
    series_add(&r->inter, p->inter);
    series_add(&r->intra_ms, 1e3 * p->intra_s);
    series_add(&r->inter_ms, 1e3 * p->inter_s);
    series_add(&r->sync_ms, ms);
    series_add(&r->nic, p->nic);
    series_add(&r->exposed_ms, p->exposed_s < 0 ? ms : 1e3 * p->exposed_s);
    series_add(&r->tree, p->tree);
    series_add(&r->collectives, (double)buckets);
}

/* A flat ring's wire bytes split by level as the engine splits them
 * (intra = wire (L-1)/(P-1)), its time put on the level that bounds it. */
static plan_point_t flat_point(const plan_ctx_t *x, double payload, double wire, double seconds)
{
    int64_t P = x->o->ranks;
    plan_point_t p = {payload, wire, 0, 0, 0, 0, 0, -1.0, 0};
    p.intra = P > 1 ? wire * (double)(x->L - 1) / (double)(P - 1) : 0.0;
    p.inter = wire - p.intra;
    if (x->N > 1) p.inter_s = seconds;
    else p.intra_s = seconds;
    return p;
}

/* The engine's sparse all-reduce bucket on fabric f: its point-to-point
 * traffic leaves through the rank's share of a NIC (plan_fabric_p2p_link). */
static plan_time_t sar_time(double wire_nbytes, const plan_fabric_t *f)
{
    plan_time_t t = {0, 0, 0};
    if (f->P <= 1) return t;
    plan_link_t l = plan_fabric_p2p_link(f);
    t.lat_s = plan_engine_sar_s(0.0, f->P, &l);
    t.bw_s = plan_engine_sar_s(wire_nbytes, f->P, &l) - t.lat_s;
    t.nic_nbytes = f->N > 1 ? wire_nbytes * (double)f->L / (double)f->K : 0.0;
    return t;
}

/* A bucket's collective on the fabrics `fab` (one per collective): NCCL's
 * all-gather of its payload, NCCL's all-reduce (ring or tree) of its dense
 * values, or the engine's sparse all-reduce (its planned wire bytes, 4(P-1)
 * messages, on the all-reduce link). */
static plan_time_t bucket_time(const igrad_planned_bucket_t *b, const plan_fabric_t *fab)
{
    double pay = (double)b->payload_nbytes;
    if (b->kind == IGRAD_BUCKET_SPARSE_REDUCE)
        return sar_time(b->wire_nbytes, &fab[PLAN_ALLREDUCE]);
    return b->kind == IGRAD_BUCKET_GATHER ? plan_nccl_allgather(pay, &fab[PLAN_ALLGATHER])
                                          : plan_nccl_allreduce(pay, &fab[PLAN_ALLREDUCE], NULL);
}

/* A step's bucket collectives on one level: bandwidth terms add up (the
 * buckets share the link); latency terms add up too (--latency sum) or,
 * all in flight at once, the largest counts (overlap). */
typedef struct step_time {
    double bw_s, lat_sum_s, lat_max_s, nic_nbytes;
} step_time_t;

static void step_time_add(step_time_t *t, plan_time_t c)
{
    t->bw_s += c.bw_s;
    t->lat_sum_s += c.lat_s;
    if (c.lat_s > t->lat_max_s) t->lat_max_s = c.lat_s;
    t->nic_nbytes += c.nic_nbytes;
}

static double step_latency_s(const step_time_t *t, int overlap)
{
    return overlap ? t->lat_max_s : t->lat_sum_s;
}

static double step_time_s(const step_time_t *t, int overlap)
{
    return t->bw_s + step_latency_s(t, overlap);
}

/* Collectives issued in order on one stream as backward makes them ready:
 * collective j (dur[j] seconds) is ready at ready[j] and starts when it is
 * ready and its predecessor done. Returns how long the last one ends after
 * backward (backward_s) does, at least 0. */
static double exposed_after_backward(const double *ready, const double *dur, size_t n,
                                     double backward_s)
{
    double end = 0.0;
    for (size_t j = 0; j < n; j++) end = (ready[j] > end ? ready[j] : end) + dur[j];
    return end > backward_s ? end - backward_s : 0.0;
}

/* The flat route's streamed step (--overlap; engine_stream.c): bucket j
 * goes out once its tensors are given, after buckets < j. The default
 * contiguous packing gives bucket j the j-th run of the readiness order,
 * so it is ready when backward has produced the bytes of buckets 0..j
 * (backward's gradients taken to appear at a steady rate per byte of
 * payload). The engine has no streamed sparse all-reduce: a step with one
 * syncs after backward. dur: scratch of nb. */
static double streamed_exposed_s(const plan_ctx_t *x, const igrad_planned_bucket_t *bk, size_t nb,
                                 double *dur, double *ready, double sync_s)
{
    double total = 0.0;
    for (size_t j = 0; j < nb; j++) {
        if (bk[j].kind == IGRAD_BUCKET_SPARSE_REDUCE) return sync_s;
        total += (double)bk[j].payload_nbytes;
    }
    double cum = 0.0;
    for (size_t j = 0; j < nb; j++) {
        cum += (double)bk[j].payload_nbytes;
        ready[j] = total > 0 ? x->backward_s * cum / total : x->backward_s;
        dur[j] = plan_time_s(bucket_time(&bk[j], x->fab));
    }
    double e = exposed_after_backward(ready, dur, nb, x->backward_s);
    return e < sync_s ? e : sync_s;
}

/* PyTorch DDP's dense bf16 sync (--overlap): gradients bucketed in
 * backward's order, the first bucket 1 MiB and the others 25 MiB
 * (bucket_cap_mb), each all-reduced by NCCL as soon as it is full, one
 * after another; backward's bytes appear at a steady rate. Fills x->ddp
 * (the sum of its all-reduces), x->ddp_exposed_s, x->ddp_buckets and
 * x->ddp_tree (how many NCCL would run as trees). */
static int ddp_price(plan_ctx_t *x)
{
    const double first = 1048576.0, cap = 25.0 * 1048576.0;
    double total = 2.0 * (double)x->nparams;
    int64_t nb = total <= first ? 1 : 1 + (int64_t)ceil((total - first) / cap);
    double *ready = malloc((size_t)nb * sizeof *ready), *dur = malloc((size_t)nb * sizeof *dur);
    if (!ready || !dur) {
        free(ready);
        free(dur);
        fprintf(stderr, "igrad plan: out of memory\n");
        return 1;
    }
    double done = 0.0;
    x->ddp = (plan_time_t){0, 0, 0};
    x->ddp_tree = 0;
    for (int64_t j = 0; j < nb; j++) {
        double size = j == 0 ? first : cap;
        if (size > total - done) size = total - done;
        done += size;
        int tree = 0;
        plan_time_t t = plan_nccl_allreduce(size, &x->fab[PLAN_ALLREDUCE], &tree);
        x->ddp.lat_s += t.lat_s;
        x->ddp.bw_s += t.bw_s;
        x->ddp.nic_nbytes += t.nic_nbytes;
        x->ddp_tree += tree;
        ready[j] = x->backward_s * done / total;
        dur[j] = plan_time_s(t);
    }
    x->ddp_buckets = nb;
    x->ddp_exposed_s = exposed_after_backward(ready, dur, (size_t)nb, x->backward_s);
    free(ready);
    free(dur);
    return 0;
}

/* One step of a hier plan: the node sums and broadcasts of every parameter
 * on intra, then every local rank's shard buckets among the N owners on
 * inter. Shard l leaves through NIC l K / L: the shards of one NIC share
 * its bandwidth (their bandwidth terms add up, their latencies overlap)
 * and the step waits for the slowest NIC. inter_s[] has L slots, nic_s[]
 * K; shard_sum (2 L) accumulates every shard's payload and wire bytes. */
static plan_point_t hier_point(const plan_ctx_t *x, const igrad_step_stats_t *s,
                               const igrad_planned_bucket_t *bk, size_t nb, step_time_t *inter_s,
                               step_time_t *nic_s, double *shard_sum)
{
    const plan_level_t *intra = &x->o->net[0];
    double n = 4.0 * (double)x->nparams;
    int64_t K = x->o->nics;
    plan_point_t p = {(double)s->payload_nbytes, s->wire_nbytes, s->intra_wire_nbytes,
                      s->inter_wire_nbytes, 0, 0, 0, -1.0, 0};
    if (!s->skipped)
        p.intra_s = plan_node_collectives_s(n, x->L, &intra->coll[PLAN_REDUCE]) +
                    plan_node_collectives_s(n, x->L, &intra->coll[PLAN_BCAST]);
    for (int64_t l = 0; l < x->L; l++) inter_s[l] = (step_time_t){0, 0, 0, 0};
    for (int64_t k = 0; k < K; k++) nic_s[k] = (step_time_t){0, 0, 0, 0};
    for (size_t j = 0; j < nb; j++) {
        int l = bk[j].local_rank;
        step_time_add(&inter_s[l], bucket_time(&bk[j], x->hfab));
        shard_sum[2 * l] += (double)bk[j].payload_nbytes;
        shard_sum[2 * l + 1] += bk[j].wire_nbytes;
    }
    int ov = x->o->latency_overlap;
    for (int64_t l = 0; l < x->L; l++) {
        step_time_t *k = &nic_s[l * K / x->L];
        double lat = step_latency_s(&inter_s[l], ov);
        k->bw_s += inter_s[l].bw_s;
        if (lat > k->lat_max_s) k->lat_max_s = lat;
        k->nic_nbytes += inter_s[l].nic_nbytes;
    }
    for (int64_t k = 0; k < K; k++) {
        double t = nic_s[k].bw_s + nic_s[k].lat_max_s;
        if (t > p.inter_s) p.inter_s = t;
        if (nic_s[k].nic_nbytes > p.nic) p.nic = nic_s[k].nic_nbytes;
    }
    return p;
}

/* Walks one cycle of plan engine e (config c) into the rows of `to`. */
static int walk_cycle(plan_ctx_t *x, igrad_engine_t *e, const igrad_config_t *c, size_t cap,
                      const plan_targets_t *to)
{
    int hier = c->topology == IGRAD_TOPOLOGY_HIER;
    size_t nscratch = cap ? cap : 1;
    igrad_planned_bucket_t *bk = calloc(nscratch, sizeof *bk);
    step_time_t *inter_s = calloc((size_t)x->L, sizeof *inter_s);
    step_time_t *nic_s = calloc((size_t)x->o->nics, sizeof *nic_s);
    double *dur = calloc(2 * nscratch, sizeof *dur);
    if (hier && to->engine && !to->engine->shard_sum)
        to->engine->shard_sum = calloc(2 * (size_t)x->L, sizeof(double));
    if (!bk || !inter_s || !nic_s || !dur ||
        (hier && (!to->engine || !to->engine->shard_sum))) {
        free(bk);
        free(inter_s);
        free(nic_s);
        free(dur);
        fprintf(stderr, "igrad plan: out of memory\n");
        return 1;
    }
    int64_t C = cycle_steps(c), P = x->o->ranks;
    if (C > x->cycle) x->cycle = C;
    int ov = x->o->latency_overlap, streamed = x->o->overlap;
    const char *last = "after backward (last bucket)";
    if (to->engine) to->engine->overlap_model = !streamed ? "none" : hier ? last : "streamed step";
    if (to->bf16) to->bf16->overlap_model = streamed ? "DDP buckets" : "none";
    if (to->sar) to->sar->overlap_model = streamed ? last : "none";
    igrad_status_t st = IGRAD_OK;
    for (int64_t step = 0; step < C; step++) {
        igrad_step_stats_t s;
        size_t nb = 0;
        st = igrad_engine_plan_step(e, step, &s, bk, cap, &nb);
        if (st != IGRAD_OK) break;
        if (nb > cap) nb = cap;
        if (hier) {
            plan_point_t p = hier_point(x, &s, bk, nb, inter_s, nic_s, to->engine->shard_sum);
            row_add(to->engine, step, &p, s.buckets, &s);
            continue;
        }
        const plan_fabric_t *ar = &x->fab[PLAN_ALLREDUCE];
        plan_link_t p2p = plan_fabric_p2p_link(ar);
        step_time_t t_flat = {0, 0, 0, 0}, t_bf16 = {0, 0, 0, 0}, t_sar = {0, 0, 0, 0};
        double sar_wire = 0, bf16_wire = 0, trees = 0;
        for (size_t j = 0; j < nb; j++) {
            step_time_add(&t_flat, bucket_time(&bk[j], x->fab));
            double half = 2.0 * (double)bk[j].dense_count;
            int tree = 0;
            step_time_add(&t_bf16, plan_nccl_allreduce(half, ar, &tree));
            trees += tree;
            bf16_wire += P <= 1 ? 0.0 : tree ? 2.0 * half : 2.0 * (double)(P - 1) / (double)P * half;
            double pay_j = (double)bk[j].payload_nbytes;
            plan_level_cost_t a = plan_sparse_allreduce(pay_j, P, &p2p);
            plan_time_t ta = {0, a.wire_nbytes / p2p.bytes_per_s, 0};
            ta.lat_s = a.seconds - ta.bw_s;
            if (x->N > 1) ta.nic_nbytes = a.wire_nbytes * (double)x->L / (double)x->o->nics;
            step_time_add(&t_sar, ta);
            sar_wire += a.wire_nbytes;
        }
        double pay = (double)s.payload_nbytes;
        plan_point_t pf = flat_point(x, pay, s.wire_nbytes, step_time_s(&t_flat, ov));
        pf.intra = s.intra_wire_nbytes; /* the engine's own split */
        pf.inter = s.inter_wire_nbytes;
        pf.nic = t_flat.nic_nbytes;
        if (streamed)
            pf.exposed_s = streamed_exposed_s(x, bk, nb, dur, dur + nscratch,
                                              step_time_s(&t_flat, ov));
        plan_point_t pb = flat_point(x, pay / 2.0, bf16_wire, step_time_s(&t_bf16, ov));
        pb.nic = t_bf16.nic_nbytes;
        pb.tree = trees;
        if (streamed) { /* DDP's buckets, not the plan's */
            pb = flat_point(x, pay / 2.0, bf16_wire, plan_time_s(x->ddp));
            pb.nic = x->ddp.nic_nbytes;
            pb.tree = x->ddp_tree;
            pb.exposed_s = x->ddp_exposed_s;
        }
        plan_point_t pa = flat_point(x, pay, sar_wire, step_time_s(&t_sar, ov));
        pa.nic = t_sar.nic_nbytes;
        row_add(to->engine, step, &pf, s.buckets, &s);
        row_add(to->bf16, step, &pb, streamed ? x->ddp_buckets : s.buckets, NULL);
        row_add(to->sar, step, &pa, s.buckets, NULL);
    }
    free(bk);
    free(inter_s);
    free(nic_s);
    free(dur);
    return st == IGRAD_OK ? 0 : cli_fail("plan step", st);
}

/* The per-component arrays of ig's allocation (x->ncomp entries). */
static int comp_arrays(plan_ctx_t *x)
{
    x->ncomp = igrad_layout_component_count(x->layout);
    free(x->comp_every);
    free(x->comp_keep);
    x->comp_every = calloc(x->ncomp ? x->ncomp : 1, 1);
    x->comp_keep = calloc(x->ncomp ? x->ncomp : 1, sizeof *x->comp_keep);
    if (x->comp_every && x->comp_keep) return 0;
    fprintf(stderr, "igrad plan: out of memory\n");
    return 1;
}

/* ig's every-step components as plan engine e planned them (a component
 * of which any tensor is sent every step). */
static void comp_every_from_plan(plan_ctx_t *x, const igrad_engine_t *e)
{
    if (!x->comp_every) return;
    memset(x->comp_every, 0, x->ncomp);
    for (size_t t = 0; t < igrad_layout_count(x->layout); t++) {
        igrad_tensor_plan_t tp;
        if (igrad_engine_tensor_plan(e, t, &tp) == IGRAD_OK && tp.every_step &&
            tp.component >= 0 && (size_t)tp.component < x->ncomp)
            x->comp_every[tp.component] = 1;
    }
}

/* Component k's name: LAYER.KIND, or KIND for a component of no layer. */
static const char *comp_name(const plan_ctx_t *x, size_t k, char *buf, size_t size)
{
    igrad_component_info_t ci;
    if (igrad_layout_component(x->layout, k, &ci) != IGRAD_OK) snprintf(buf, size, "?");
    else if (ci.layer < 0) snprintf(buf, size, "%s", igrad_kind_name(ci.kind));
    else snprintf(buf, size, "%d.%s", ci.layer, igrad_kind_name(ci.kind));
    return buf;
}

/* Method m's config (and profile, for ig/iad) as the plan uses it. */
static int method_config(plan_ctx_t *x, igrad_method_t m, igrad_config_t *c,
                         const igrad_profile_t **profile)
{
    const plan_opts_t *o = x->o;
    igrad_config_t d = IGRAD_CONFIG_INIT;
    *c = d;
    c->method = m;
    c->density = o->density;
    c->release_period = o->release_period;
    c->buckets = (int)o->buckets;
    c->value_dtype = m == IGRAD_METHOD_DENSE ? IGRAD_DTYPE_F32 : o->value_dtype;
    c->collective = o->collective;
    c->index_code = o->index_code;
    c->auto_sparse_reduce = m == IGRAD_METHOD_DENSE ? 0 : o->auto_sparse_reduce;
    /* auto prices with the link the buckets cross: the flat ring's slowest
     * level (plan_method sets inter for hier, whose shard engines' buckets
     * run among the owners of different nodes) */
    plan_link_to_engine(&x->flat->coll[PLAN_ALLGATHER], &c->link_latency_ns,
                        &c->link_bandwidth_mbps);
    c->ranks_per_node = (int)x->L; /* flat: splits the wire bytes by level; hier: the nodes */
    *profile = NULL;
    if (m != IGRAD_METHOD_IG && m != IGRAD_METHOD_IAD) return 0;
    if (!x->profile) {
        igrad_status_t st = o->profile_path
                                ? igrad_profile_load(o->profile_path, x->layout, &x->profile)
                                : synthetic_profile(x->layout, &x->profile);
        if (st != IGRAD_OK) return cli_fail("profile", st);
        x->synthetic = !o->profile_path;
    }
    double target = o->target_ratio > 0 ? o->target_ratio : x->synthetic ? 0.5 : 0.0;
    if (m == IGRAD_METHOD_IG && o->allocation == IGRAD_ALLOCATION_BUDGET) {
        if (!(target > 0)) {
            fprintf(stderr, "igrad plan: --allocation budget allocates a payload target: give "
                            "--target-ratio X with --profile\n");
            return 1;
        }
        c->allocation = IGRAD_ALLOCATION_BUDGET;
        c->target_ratio = target;
        if (comp_arrays(x)) return 1;
        int met = 0;
        igrad_status_t st = igrad__allocate(x->layout, x->profile, c, target, x->comp_every,
                                            x->comp_keep, &x->ig_ratio, &met);
        if (st != IGRAD_OK) return cli_fail("ig budget allocation", st);
        x->ig_met = met;
    } else if (m == IGRAD_METHOD_IG && target > 0) {
        igrad_target_fit_t fit;
        igrad_status_t st =
            igrad_target_fit(x->layout, x->profile, c, target, IGRAD_TARGET_MIN_KEEP, &fit);
        if (st == IGRAD_OK) st = igrad_profile_set_threshold(x->profile, fit.tau);
        if (st != IGRAD_OK) return cli_fail("ig target fit", st);
        c->release_keep = fit.release_keep;
        x->ig_ratio = fit.ratio;
        x->ig_met = fit.ratio <= target;
        if (comp_arrays(x)) return 1;
        for (size_t k = 0; k < x->ncomp; k++) x->comp_keep[k] = fit.release_keep;
    }
    *profile = x->profile;
    return 0;
}

/* One plan engine of config c walked over its cycle into the rows of `to`. */
static int plan_walk(plan_ctx_t *x, const igrad_config_t *c, const igrad_profile_t *profile,
                     const plan_targets_t *to)
{
    igrad_engine_t *e = NULL;
    igrad_status_t st = igrad_engine_create_plan(x->layout, profile, c, (int)x->o->ranks, &e);
    if (st != IGRAD_OK) return cli_fail(igrad_method_name(c->method), st);
    /* buckets of one step: per shard at most config.buckets (iad: one per
     * tensor, and the shards' tensors add up to the layout's) */
    size_t cap = c->method == IGRAD_METHOD_IAD ? igrad_layout_count(x->layout)
                 : c->topology == IGRAD_TOPOLOGY_HIER ? (size_t)c->buckets * (size_t)x->L
                                                      : (size_t)c->buckets;
    if (c->method == IGRAD_METHOD_IG && c->topology == IGRAD_TOPOLOGY_FLAT && to->engine)
        comp_every_from_plan(x, e);
    int rc = walk_cycle(x, e, c, cap, to);
    igrad_engine_free(e);
    return rc;
}

/* Method m: the engine's two routes, flat and hier (one row each), and for
 * the sparse methods the projected sparse all-reduce on the flat plan's
 * per-bucket sparse payload. */
static int plan_method(plan_ctx_t *x, igrad_method_t m)
{
    igrad_config_t c;
    const igrad_profile_t *profile = NULL;
    if (method_config(x, m, &c, &profile)) return 1;
    const char *name = igrad_method_name(m);
    plan_targets_t flat = {new_row(x, name, "flat", 0), NULL, NULL};
    if (plan_walk(x, &c, profile, &flat)) return 1;
    if (c.allocation != IGRAD_ALLOCATION_BUDGET) { /* the engine's budget is flat only */
        igrad_config_t h = c;
        h.topology = IGRAD_TOPOLOGY_HIER;
        plan_link_to_engine(&x->o->net[1].coll[PLAN_ALLGATHER], &h.link_latency_ns,
                            &h.link_bandwidth_mbps);
        plan_targets_t hier = {new_row(x, name, "hier", 0), NULL, NULL};
        if (plan_walk(x, &h, profile, &hier)) return 1;
    }
    if (m == IGRAD_METHOD_DENSE) return 0;
    c.collective = IGRAD_COLLECTIVE_GATHER;
    plan_targets_t sar = {NULL, NULL, new_row(x, name, "sparse_allreduce", 1)};
    return plan_walk(x, &c, profile, &sar);
}

/* Compute time per step and where it came from. */
static double compute_ms(const plan_opts_t *o, int64_t nparams, char *src, size_t size)
{
    if (o->compute_ms >= 0) {
        snprintf(src, size, "--compute-ms");
        return o->compute_ms;
    }
    double flops = 6.0 * (double)nparams * (double)o->tokens_per_rank;
    snprintf(src, size, "6 N T / (MFU peak): T %lld tokens/rank, MFU %.2f, peak %.0f TFLOP/s",
             (long long)o->tokens_per_rank, o->mfu, o->peak_tflops);
    return 1e3 * flops / (o->mfu * o->peak_tflops * 1e12);
}

/* ig's allocation per component: JSON members, or text lines (every
 * step, then the deferred with their kappa, in the layout's order). */
static void print_components(const plan_ctx_t *x, int json)
{
    const char *alloc = x->o->allocation == IGRAD_ALLOCATION_BUDGET ? "budget" : "partition";
    char nm[64];
    if (json) {
        printf("\"ig_allocation\": \"%s\", ", alloc);
        if (!x->comp_every) return;
        printf("\"ig_target_met\": %s, \"ig_components\": [", x->ig_met ? "true" : "false");
        for (size_t k = 0; k < x->ncomp; k++)
            printf("%s{\"component\": \"%s\", \"every_step\": %s, \"keep\": %.17g}",
                   k ? ", " : "", comp_name(x, k, nm, sizeof nm),
                   x->comp_every[k] ? "true" : "false", x->comp_every[k] ? 1.0 : x->comp_keep[k]);
        printf("], ");
        return;
    }
    if (!x->comp_every) return;
    size_t every = 0;
    for (size_t k = 0; k < x->ncomp; k++) every += x->comp_every[k];
    printf("# ig allocation %s: planned payload %.4f x adtopk_sync (fixed widths; target %s);"
           " every step (%zu):", alloc, x->ig_ratio, x->ig_met ? "met" : "NOT met", every);
    for (size_t k = 0; k < x->ncomp; k++)
        if (x->comp_every[k]) printf(" %s", comp_name(x, k, nm, sizeof nm));
    printf("; deferred (kappa):");
    for (size_t k = 0; k < x->ncomp; k++)
        if (!x->comp_every[k]) printf(" %s %.4g", comp_name(x, k, nm, sizeof nm), x->comp_keep[k]);
    printf("\n");
}

static void json_series(const char *key, const plan_series_t *s, int last)
{
    printf("\"%s\": {\"min\": %.17g, \"mean\": %.17g, \"max\": %.17g}%s", key, s->min,
           series_mean(s), s->max, last ? "" : ", ");
}

static void json_link_fields(const plan_link_t *l)
{
    printf("\"name\": \"%s\", \"gbit_per_s\": %.17g, \"latency_us\": %.17g", l->name,
           l->bytes_per_s * 8.0 / 1e9, l->latency_s * 1e6);
}

/* A level: its all-gather link at the top (the level's link unless a
 * collective was given its own) and every collective's under "by_collective". */
static void json_level(const char *key, const plan_level_t *lv)
{
    printf("\"%s\": {", key);
    json_link_fields(&lv->coll[PLAN_ALLGATHER]);
    printf(", \"by_collective\": {");
    for (int k = 0; k < PLAN_NCOLL; k++) {
        printf("%s\"%s\": {", k ? ", " : "", plan_coll_name((plan_coll_t)k));
        json_link_fields(&lv->coll[k]);
        printf("}");
    }
    printf("}}");
}

/* One level's link as the table header shows it. */
static void print_level(const char *key, const plan_level_t *lv)
{
    const plan_link_t *l = &lv->coll[PLAN_ALLGATHER];
    printf("%s %s (%.0f Gbit/s, %.1f us", key, l->name, l->bytes_per_s * 8e-9, l->latency_s * 1e6);
    for (int k = 1; k < PLAN_NCOLL; k++)
        if (lv->set[k] || lv->set[0])
            printf("; %s %.3g Gbit/s, %.3g us", plan_coll_name((plan_coll_t)k),
                   lv->coll[k].bytes_per_s * 8e-9, lv->coll[k].latency_s * 1e6);
    printf(")");
}

static void print_json(const plan_ctx_t *x, int64_t nparams, double cms, const char *csrc)
{
    const plan_opts_t *o = x->o;
    double base = series_mean(&x->rows[0].exposed_ms);
    printf("{\"config\": \"%s\", \"params\": %lld, \"ranks\": %lld, \"ranks_per_node\": %lld, "
           "\"nodes\": %lld, ",
           o->config_path, (long long)nparams, (long long)o->ranks, (long long)x->L,
           (long long)x->N);
    json_level("intra", &o->net[0]);
    printf(", ");
    json_level("inter", &o->net[1]);
    printf(", \"nics_per_node\": %lld, \"overlap\": %s, \"backward_share\": %.17g, "
           "\"backward_ms\": %.17g, ",
           (long long)o->nics, o->overlap ? "true" : "false", o->backward_share,
           1e3 * x->backward_s);
    if (o->overlap)
        printf("\"ddp_buckets\": %lld, \"ddp_bucket_nbytes\": %d, ", (long long)x->ddp_buckets,
               25 * 1048576);
    printf("\"compute_ms\": %.17g, \"compute_source\": \"%s\", \"cycle_steps\": %lld, "
           "\"density\": %.17g, \"value_dtype\": \"%s\", \"release_period\": %lld, "
           "\"buckets\": %lld, "
           "\"latency\": \"%s\", \"profile\": \"%s\", \"ig_planned_ratio\": %.17g, ",
           cms, csrc, (long long)x->cycle, o->density, igrad_dtype_name(o->value_dtype),
           (long long)o->release_period,
           (long long)o->buckets, o->latency_overlap ? "overlap" : "sum",
           o->profile_path ? o->profile_path : x->profile ? "synthetic" : "none", x->ig_ratio);
    print_components(x, 1);
    printf("\"rows\": [");
    for (int i = 0; i < x->nrows; i++) {
        const plan_row_t *r = &x->rows[i];
        double step = cms + series_mean(&r->exposed_ms);
        printf("%s{\"method\": \"%s\", \"route\": \"%s\", \"projected\": %s, \"steps\": %lld, "
               "\"overlap_model\": \"%s\", ",
               i ? ", " : "", r->method, r->route, r->projected ? "true" : "false",
               (long long)r->payload.n, r->overlap_model ? r->overlap_model : "none");
        json_series("payload_nbytes", &r->payload, 0);
        json_series("wire_nbytes", &r->wire, 0);
        json_series("intra_nbytes", &r->intra, 0);
        json_series("inter_nbytes", &r->inter, 0);
        json_series("nic_nbytes", &r->nic, 0);
        json_series("intra_ms", &r->intra_ms, 0);
        json_series("inter_ms", &r->inter_ms, 0);
        if (r->payload.n <= PLAN_CYCLE_LISTED) {
            printf("\"per_step\": [");
            for (int64_t k = 0; k < r->payload.n; k++)
                printf("%s{\"step\": %lld, \"payload_nbytes\": %.17g, \"sync_ms\": %.17g}",
                       k ? ", " : "", (long long)k, r->step_payload[k], r->step_sync_ms[k]);
            printf("], ");
        }
        if (r->shard_sum) { /* hier: every shard's mean bytes per step */
            printf("\"by_local_rank\": [");
            for (int64_t l = 0; l < x->L; l++)
                printf("%s{\"local_rank\": %lld, \"payload_nbytes\": %.17g, "
                       "\"inter_nbytes\": %.17g}",
                       l ? ", " : "", (long long)l, r->shard_sum[2 * l] / (double)r->payload.n,
                       r->shard_sum[2 * l + 1] / (double)r->payload.n);
            printf("], ");
        }
        json_series("collectives", &r->collectives, 0);
        if (!r->projected) {
            json_series("gather_buckets", &r->gather, 0);
            json_series("reduce_buckets", &r->reduce, 0);
            json_series("sparse_reduce_buckets", &r->sar, 0);
        }
        if (!strcmp(r->method, "dense_bf16")) json_series("nccl_tree_collectives", &r->tree, 0);
        json_series("sync_ms", &r->sync_ms, 0);
        json_series("exposed_ms", &r->exposed_ms, 0);
        printf("\"step_ms\": %.17g, \"step_speedup_vs_dense_bf16\": %.17g}", step,
               (cms + base) / step);
    }
    printf("]}\n");
}

static void print_table(const plan_ctx_t *x, int64_t nparams, double cms, const char *csrc)
{
    const plan_opts_t *o = x->o;
    char b1[32], b2[32], b3[32], b4[32];
    printf("# igrad plan: %s, %lld parameters, P = %lld (%lld node%s x %lld)\n", o->config_path,
           (long long)nparams, (long long)o->ranks, (long long)x->N, x->N == 1 ? "" : "s",
           (long long)x->L);
    printf("# links: ");
    print_level("intra", &o->net[0]);
    printf(", ");
    print_level("inter", &o->net[1]);
    printf("%s; %lld NIC%s per node\n", x->N == 1 ? " (one node: the flat ring runs on intra)" : "",
           (long long)o->nics, o->nics == 1 ? "" : "s");
    {
        int64_t fl, fb, hl, hb;
        plan_link_to_engine(&x->flat->coll[PLAN_ALLGATHER], &fl, &fb);
        plan_link_to_engine(&o->net[1].coll[PLAN_ALLGATHER], &hl, &hb);
        printf("# collective %s%s; auto prices flat buckets at %lld ns, %lld Mbit/s, hier "
               "shard buckets at %lld ns, %lld Mbit/s (config.link_latency_ns, "
               "link_bandwidth_mbps); 'auto g/r/s': the engine's gather/reduce/sparse "
               "all-reduce buckets per step\n",
               igrad_collective_name(o->collective),
               o->auto_sparse_reduce ? " with auto_sparse_reduce" : "", (long long)fl,
               (long long)fb, (long long)hl, (long long)hb);
    }
    printf("# compute %.1f ms/step (%s); cycle %lld steps; density %g, %s values (dense "
           "F32), R %lld, B %lld; bucket latencies %s",
           cms, csrc, (long long)x->cycle, o->density, igrad_dtype_name(o->value_dtype),
           (long long)o->release_period,
           (long long)o->buckets, o->latency_overlap ? "overlap" : "summed");
    if (x->profile)
        printf("; ig profile %s, planned payload %.3f x adtopk_sync",
               o->profile_path ? o->profile_path : "synthetic", x->ig_ratio);
    if (o->overlap)
        printf("\n# --overlap: backward %.1f ms (%.3f of compute); dense_bf16 as DDP's %lld "
               "buckets (25 MiB), flat engine rows as the streamed step, hier and sparse "
               "all-reduce rows after backward; step = compute + exposed sync",
               1e3 * x->backward_s, o->backward_share, (long long)x->ddp_buckets);
    else
        printf("\n# no overlap: step = compute + sync (--overlap hides sync behind backward)");
    printf("\n");
    print_components(x, 0);
    printf("# bytes per rank per step (min / mean / max over the cycle); 'engine' rows are the "
           "engine's plan (hier: the busiest shard's payload and inter bytes), 'proj' rows are "
           "formulas (docs/plan.md); 'NIC mean': bytes through a node's busiest NIC\n");
    printf("%-12s %-16s %-6s %28s %11s %11s %11s %11s %10s %27s %11s %10s %8s  %s\n", "method",
           "route", "source", "payload min/mean/max", "wire mean", "intra mean", "inter mean",
           "NIC mean", "colls", "sync ms min/mean/max", "exposed ms", "step ms", "speedup",
           "auto g/r/s");
    double base = series_mean(&x->rows[0].exposed_ms);
    for (int i = 0; i < x->nrows; i++) {
        const plan_row_t *r = &x->rows[i];
        double step = cms + series_mean(&r->exposed_ms);
        char pay[64], sync[64];
        snprintf(pay, sizeof pay, "%s/%s/%s", cli_human_bytes(r->payload.min, b1, sizeof b1),
                 cli_human_bytes(series_mean(&r->payload), b2, sizeof b2),
                 cli_human_bytes(r->payload.max, b3, sizeof b3));
        snprintf(sync, sizeof sync, "%.2f/%.2f/%.2f", r->sync_ms.min, series_mean(&r->sync_ms),
                 r->sync_ms.max);
        printf("%-12s %-16s %-6s %28s %11s %11s %11s %11s %10.1f %27s %11.2f %10.1f %7.2fx",
               r->method, r->route, r->projected ? "proj" : "engine", pay,
               cli_human_bytes(series_mean(&r->wire), b4, sizeof b4),
               cli_human_bytes(series_mean(&r->intra), b1, sizeof b1),
               cli_human_bytes(series_mean(&r->inter), b2, sizeof b2),
               cli_human_bytes(series_mean(&r->nic), b3, sizeof b3),
               series_mean(&r->collectives), sync, series_mean(&r->exposed_ms), step,
               (cms + base) / step);
        if (r->projected) printf("  -\n");
        else printf("  %.1f/%.1f/%.1f\n", series_mean(&r->gather), series_mean(&r->reduce),
                    series_mean(&r->sar));
    }
}

int cmd_plan(int argc, char **argv)
{
    plan_opts_t o;
    memset(&o, 0, sizeof o);
    o.per_node = 8;
    o.compute_ms = -1.0;
    o.mfu = 0.40;
    o.peak_tflops = 989.0;
    o.tokens_per_rank = 16384;
    o.density = TRAIN_SPARSE_DENSITY; /* igrad train's defaults: one definition */
    o.release_period = IGRAD_DEFAULT_RELEASE_PERIOD;
    o.buckets = 4;
    o.value_dtype = TRAIN_SPARSE_VALUE_DTYPE;
    o.index_code = IGRAD_INDEX_CODE_COMPACT;
    o.collective = IGRAD_COLLECTIVE_AUTO;
    o.backward_share = 2.0 / 3.0;
    plan_level_parse("intra=nvlink", o.net);
    plan_level_parse("inter=100g", o.net);
    parse_methods("dense,topk_sync,adtopk_sync,ig", &o);
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;

    igrad_layout_t *layout = NULL;
    igrad_status_t st = igrad_layout_load(o.config_path, &layout);
    if (st != IGRAD_OK) return cli_fail("--config", st);
    if ((st = cli_apply_map(o.map_path, &layout)) != IGRAD_OK) {
        igrad_layout_free(layout);
        return cli_fail("--map", st);
    }
    plan_ctx_t *x = calloc(1, sizeof *x);
    if (!x) {
        igrad_layout_free(layout);
        fprintf(stderr, "igrad plan: out of memory\n");
        return 1;
    }
    x->o = &o;
    x->layout = layout;
    x->L = o.per_node;
    x->N = o.ranks / o.per_node;
    x->flat = &o.net[x->N > 1 ? 1 : 0];
    x->nparams = igrad_layout_total_count(layout);
    for (int k = 0; k < PLAN_NCOLL; k++) {
        x->fab[k] = (plan_fabric_t){o.ranks, x->N, x->L, o.nics, &o.net[0].coll[k],
                                    &o.net[1].coll[k]};
        /* one owner per node: every hop crosses nodes, one NIC per shard */
        x->hfab[k] = (plan_fabric_t){x->N, x->N, 1, 1, &o.net[1].coll[k], &o.net[1].coll[k]};
    }
    char csrc[160];
    double cms = compute_ms(&o, x->nparams, csrc, sizeof csrc);
    x->compute_s = cms / 1e3;
    x->backward_s = o.backward_share * x->compute_s;
    int rc = o.overlap ? ddp_price(x) : 0;
    /* the reference every speed-up is against: dense bf16 on the dense plan's buckets */
    igrad_config_t dc;
    const igrad_profile_t *none = NULL;
    if (!rc) rc = method_config(x, IGRAD_METHOD_DENSE, &dc, &none);
    if (!rc) {
        plan_targets_t ref = {NULL, new_row(x, "dense_bf16", "ring_allreduce", 1), NULL};
        rc = plan_walk(x, &dc, NULL, &ref);
    }
    for (int i = 0; !rc && i < o.nmethods; i++) rc = plan_method(x, o.methods[i]);
    if (!rc) {
        int64_t nparams = x->nparams;
        if (o.json) print_json(x, nparams, cms, csrc);
        else print_table(x, nparams, cms, csrc);
        if (fflush(stdout) != 0) {
            perror("igrad plan: stdout");
            rc = 1;
        }
    }
    igrad_profile_free(x->profile);
    for (int i = 0; i < x->nrows; i++) free(x->rows[i].shard_sum);
    free(x->comp_every);
    free(x->comp_keep);
    free(x);
    igrad_layout_free(layout);
    return rc;
}
