/*
 * plan_cost.c — the α-β model of `igrad plan` (plan_cost.h). Every
 * formula here is stated, with its source, in docs/plan.md §2; the
 * figures of the link presets are assumptions named there too. Not
 * validated against measurements yet.
 */
#include "plan_cost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per GPU, one direction. */
static const struct {
    const char *name;
    double gbit_per_s;
    double latency_us;
    const char *assumes;
} presets[] = {
    {"nvlink", 3600.0, 3.0, "H100 SXM NVLink 4: 450 GB/s per direction per GPU"},
    {"pcie4", 200.0, 5.0, "PCIe 4.0 x16: 25 GB/s usable of 32 GB/s"},
    {"400g", 400.0, 5.0, "one 400 Gbit/s NIC per GPU (NDR InfiniBand, DGX H100)"},
    {"200g", 200.0, 5.0, "one 200 Gbit/s NIC per GPU (HDR InfiniBand)"},
    {"100g", 100.0, 8.0, "100 Gbit/s per GPU (EDR InfiniBand / RoCE)"},
    {"25g", 25.0, 15.0, "25 Gbit/s Ethernet per GPU (TCP)"},
    {"10g", 10.0, 25.0, "10 Gbit/s Ethernet per GPU (TCP)"},
};
#define NPRESETS (sizeof presets / sizeof presets[0])

void plan_link_print_presets(void *fp)
{
    for (size_t i = 0; i < NPRESETS; i++)
        fprintf((FILE *)fp, "  %-7s %7.0f Gbit/s %5.1f us  %s\n", presets[i].name,
                presets[i].gbit_per_s, presets[i].latency_us, presets[i].assumes);
}

int plan_link_parse(const char *flag, const char *text, plan_link_t *out)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < NPRESETS; i++)
        if (!strcmp(text, presets[i].name)) {
            snprintf(out->name, sizeof out->name, "%s", presets[i].name);
            out->bytes_per_s = presets[i].gbit_per_s * 1e9 / 8.0;
            out->latency_s = presets[i].latency_us * 1e-6;
            return 0;
        }
    char *end = NULL;
    double bw = strtod(text, &end);
    double lat = -1.0;
    if (end != text && *end == ',') {
        const char *rest = end + 1;
        lat = strtod(rest, &end);
        if (end == rest || *end != '\0') lat = -1.0;
    }
    if (!(bw > 0.0) || !(lat > 0.0) || !isfinite(bw) || !isfinite(lat)) {
        fprintf(stderr,
                "igrad plan: --link %s: '%s' is neither a preset (nvlink, pcie4, 400g, 200g, "
                "100g, 25g, 10g) nor GBITS,LAT_US with both > 0 (e.g. 100,8)\n",
                flag, text);
        return -1;
    }
    snprintf(out->name, sizeof out->name, "%g,%g", bw, lat);
    out->bytes_per_s = bw * 1e9 / 8.0;
    out->latency_s = lat * 1e-6;
    return 0;
}

double plan_ring_allgather_s(double m, int64_t P, const plan_link_t *l)
{
    if (P <= 1) return 0.0;
    double p1 = (double)(P - 1);
    return p1 * l->latency_s + p1 * m / l->bytes_per_s;
}

double plan_ring_allreduce_s(double n, int64_t P, const plan_link_t *l)
{
    if (P <= 1) return 0.0;
    double p1 = (double)(P - 1);
    return 2.0 * p1 * l->latency_s + 2.0 * p1 / (double)P * n / l->bytes_per_s;
}

/* Issue 12 §1, first stage, once per step over every parameter (the
 * shard owner keeps the residual, so a deferred tensor's node sum is
 * needed too): ring reduce-scatter of n bytes inside the node,
 * (L-1) alpha + (L-1)/L n beta. */
plan_level_cost_t plan_node_reduce_scatter(double n, int64_t L, const plan_link_t *intra)
{
    plan_level_cost_t c = {0, 0, 0};
    if (L <= 1) return c;
    double l1 = (double)(L - 1);
    c.intra_nbytes = l1 / (double)L * n;
    c.seconds = l1 * intra->latency_s + c.intra_nbytes / intra->bytes_per_s;
    return c;
}

/* The rest, per bucket: selection on the shard (payload/L bytes per owner),
 * ring all-gather among the N owners of a shard over the network, then the
 * node all-gather of what arrived: sparse (N payload/L per rank) or the
 * decoded dense shard (dense/L), whichever is smaller. */
plan_level_cost_t plan_hier_gather(double payload, double dense, int64_t N, int64_t L,
                                   const plan_link_t *intra, const plan_link_t *inter)
{
    plan_level_cost_t c = {0, 0, 0};
    double shard = payload / (double)L;
    double back = fmin((double)N * shard, dense / (double)L);
    if (L > 1) {
        c.intra_nbytes = (double)(L - 1) * back;
        c.seconds += plan_ring_allgather_s(back, L, intra);
    }
    c.inter_nbytes = (double)(N - 1) * shard;
    c.seconds += plan_ring_allgather_s(shard, N, inter);
    return c;
}

/* Ok-Topk / SparCML family (Li & Hoefler, PPoPP 2022): split and reduce by
 * index range, re-sparsify each partial sum to the budget, all-gather the
 * reduced result. Ideal balance: 2(P-1)/P payload bytes per rank (the
 * lower bound Ok-Topk cites; its own bound is 3x that); latency: P-1
 * messages for the split plus ceil(log2 P) for the recursive-doubling
 * all-gather. */
plan_level_cost_t plan_sparse_allreduce(double payload, int64_t P, const plan_link_t *link)
{
    plan_level_cost_t c = {0, 0, 0};
    if (P <= 1) return c;
    double v = 2.0 * (double)(P - 1) / (double)P * payload;
    c.inter_nbytes = v;
    c.seconds = ((double)(P - 1) + ceil(log2((double)P))) * link->latency_s +
                v / link->bytes_per_s;
    return c;
}
