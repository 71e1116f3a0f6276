/*
 * plan_cost.h — the α-β time model of `igrad plan` (docs/plan.md): link
 * presets, parsing "NAME" or "GBITS,LAT_US", the links of one level per
 * collective (a fit of `igrad bench comm` may give each collective its own
 * α and β), the time of one collective by its formula, and NCCL's
 * collectives over a node's NICs (plan_fabric_t, docs/plan.md §2a). Pure
 * arithmetic; the bytes come from the engine's plan
 * (igrad_engine_plan_step) or, for the published sparse all-reduce row,
 * from the formula in plan_cost.c.
 */
#ifndef IGRAD_PLAN_COST_H
#define IGRAD_PLAN_COST_H

#include <stdint.h>

/* One level of the network: per-GPU bandwidth (one direction) and the
 * latency of one message. */
typedef struct plan_link {
    char name[32];          /* preset name or "GBITS,LAT_US" */
    double bytes_per_s;     /* beta = 1 / bytes_per_s */
    double latency_s;       /* alpha */
} plan_link_t;

/* The collectives the model prices, each with its own link per level. */
typedef enum plan_coll {
    PLAN_ALLGATHER = 0, /* gather buckets */
    PLAN_ALLREDUCE = 1, /* reduce buckets, dense bf16, sparse all-reduce */
    PLAN_REDUCE = 2,    /* hier: the node sums onto the owners */
    PLAN_BCAST = 3,     /* hier: the owners' results back to the node */
    PLAN_NCOLL = 4
} plan_coll_t;

/* "allgather", "allreduce", "reduce", "bcast". */
const char *plan_coll_name(plan_coll_t c);

/* A level's links: one for every collective (all the same unless a
 * per-collective --link LEVEL.COLL=SPEC set one). */
typedef struct plan_level {
    plan_link_t coll[PLAN_NCOLL];
    int set[PLAN_NCOLL]; /* given per collective (not overwritten by LEVEL=SPEC) */
} plan_level_t;

/* Parses "nvlink", "pcie4", "400g", ... or "GBITS,LAT_US" (Gbit/s and
 * microseconds, both > 0). Returns 0, or -1 after printing
 * "igrad plan: --link NAME: ..." to stderr. */
int plan_link_parse(const char *flag, const char *text, plan_link_t *out);
/* The same, the error prefixed by `what` (e.g. "igrad train: --link"). */
int plan_link_parse_as(const char *what, const char *text, plan_link_t *out);
/* The link as the engine's config takes it (config.link_latency_ns,
 * link_bandwidth_mbps: nearest integers, clamped to their valid ranges). */
void plan_link_to_engine(const plan_link_t *l, int64_t *latency_ns, int64_t *bandwidth_mbps);
/* plan_link_parse_as then plan_link_to_engine: `igrad train --link`,
 * `igrad bench sync --link`. Returns 0, or -1 after printing the error. */
int plan_engine_link_parse(const char *what, const char *text, int64_t *latency_ns,
                           int64_t *bandwidth_mbps);
/* The model's link of an engine config's integers. */
plan_link_t plan_link_of_engine(int64_t latency_ns, int64_t bandwidth_mbps);
/* Parses "LEVEL=SPEC" or "LEVEL.COLL=SPEC" (LEVEL intra or inter) into
 * levels[0] (intra) or levels[1] (inter): LEVEL=SPEC sets every collective
 * not given on its own. Returns 0, or -1 after printing the error. */
int plan_level_parse(const char *text, plan_level_t levels[2]);
/* Prints the presets (name, figures, what they assume) to fp. */
void plan_link_print_presets(void *fp);

/* Reduces (or broadcasts) of n bytes in all inside a node of L ranks, one
 * per tensor, all in flight, their roots (owners) balanced over the L
 * ranks: priced as one reduce-scatter (all-gather) of n bytes,
 * (L-1) alpha + (L-1)/L n beta. */
double plan_node_collectives_s(double n, int64_t L, const plan_link_t *l);

/* A collective's time split into its latency and bandwidth terms, and the
 * bytes it puts through the busiest NIC of a node (0 inside one node). */
typedef struct plan_time {
    double lat_s, bw_s, nic_nbytes;
} plan_time_t;

/* P ranks in N nodes of L, K NICs per node (1 <= K <= L, K divides L),
 * each NIC of the inter link's bandwidth; intra the per-GPU link inside a
 * node. The collectives below price one collective as NCCL runs it
 * (docs/plan.md §2a): rings (channels) spread over the K NICs. */
typedef struct plan_fabric {
    int64_t P, N, L, K;
    const plan_link_t *intra, *inter;
} plan_fabric_t;

/* NCCL's ring all-reduce of n bytes: latency (2(P-1) - 2(N-1)) alpha_intra
 * + 2(N-1) alpha_inter (NCCL's tuning.cc: nsteps, nInterSteps), bandwidth
 * max(V / (K B_inter), V / B_intra) with V = 2(P-1)/P n (N = 1: V / B_intra). */
plan_time_t plan_nccl_ring_allreduce(double n, const plan_fabric_t *f);
/* NCCL's double binary tree all-reduce of n bytes: latency
 * 2((L-1) alpha_intra + floor(log2 N) alpha_inter) (tuning.cc), bandwidth
 * max(2n / (K B_inter), 2n / B_intra) / 0.92 (tuning.cc: the tree ratio
 * 1/2, its bus bandwidth 0.92 of the ring's). */
plan_time_t plan_nccl_tree_allreduce(double n, const plan_fabric_t *f);
/* The faster of the two (what NCCL's tuner picks on its own estimates);
 * *tree (may be NULL) is set to 1 when the tree is. */
plan_time_t plan_nccl_allreduce(double n, const plan_fabric_t *f, int *tree);
/* NCCL's ring all-gather of m bytes per rank: latency (P-N) alpha_intra +
 * (N-1) alpha_inter, bandwidth max(V / (K B_inter), V / B_intra), V = (P-1) m. */
plan_time_t plan_nccl_allgather(double m, const plan_fabric_t *f);
/* The per-GPU link of point-to-point traffic leaving the node: the inter
 * link with its bandwidth shared by the L/K GPUs of one NIC (N = 1: intra). */
plan_link_t plan_fabric_p2p_link(const plan_fabric_t *f);
/* Total seconds of a plan_time_t. */
double plan_time_s(plan_time_t t);

/* The published sparse all-reduce (Ok-Topk family) at ideal balance:
 * bytes per rank and the time of one collective of `payload` bytes over
 * P ranks. */
typedef struct plan_level_cost {
    double wire_nbytes, seconds;
} plan_level_cost_t;
plan_level_cost_t plan_sparse_allreduce(double payload, int64_t P, const plan_link_t *link);
/* The engine's sparse all-reduce bucket (config.collective sparse_reduce,
 * or auto with auto_sparse_reduce): the fitted time auto prices it by
 * (plan/route.h: 17 alpha + 9/5 x wire_nbytes beta), on the wire bytes the
 * engine's plan gives. */
double plan_engine_sar_s(double wire_nbytes, int64_t P, const plan_link_t *l);

#endif /* IGRAD_PLAN_COST_H */
