/*
 * plan_cost.h — the α-β time model of `igrad plan` (docs/plan.md): link
 * presets, parsing "NAME" or "GBITS,LAT_US", and the time of one
 * collective by its formula. Pure arithmetic; the bytes come from the
 * engine's plan (igrad_engine_plan_step) or, for routes not implemented
 * yet, from the formulas in plan_cost.c.
 */
#ifndef IGRAD_PLAN_COST_H
#define IGRAD_PLAN_COST_H

#include <stdint.h>

/* One level of the network: per-GPU bandwidth (one direction) and the
 * latency of one message. */
typedef struct plan_link {
    char name[32];          /* preset name or "custom" */
    double bytes_per_s;     /* beta = 1 / bytes_per_s */
    double latency_s;       /* alpha */
} plan_link_t;

/* Parses "nvlink", "pcie4", "400g", ... or "GBITS,LAT_US" (Gbit/s and
 * microseconds, both > 0). Returns 0, or -1 after printing
 * "igrad plan: --link NAME: ..." to stderr. */
int plan_link_parse(const char *flag, const char *text, plan_link_t *out);
/* Prints the presets (name, figures, what they assume) to fp. */
void plan_link_print_presets(void *fp);

/* Ring all-gather of m bytes per rank over P ranks: (P-1) alpha + (P-1) m beta. */
double plan_ring_allgather_s(double m, int64_t P, const plan_link_t *l);
/* Ring all-reduce of n bytes: 2(P-1) alpha + 2(P-1)/P n beta. */
double plan_ring_allreduce_s(double n, int64_t P, const plan_link_t *l);

/* Projected routes (not implemented in the engine yet): bytes per rank on
 * each level and the time, P = N nodes x L ranks. Hierarchical: the node
 * reduce-scatter of n bytes (every parameter, F32, once per step), then
 * per collective of `payload` sparse bytes per rank over a dense region of
 * `dense` bytes the exchange between shard owners and the node
 * all-gather. Sparse all-reduce: per collective of `payload` bytes. */
typedef struct plan_level_cost {
    double intra_nbytes, inter_nbytes, seconds;
} plan_level_cost_t;
plan_level_cost_t plan_node_reduce_scatter(double n, int64_t L, const plan_link_t *intra);
plan_level_cost_t plan_hier_gather(double payload, double dense, int64_t N, int64_t L,
                                   const plan_link_t *intra, const plan_link_t *inter);
plan_level_cost_t plan_sparse_allreduce(double payload, int64_t P, const plan_link_t *link);

#endif /* IGRAD_PLAN_COST_H */
