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
    char what[96];
    snprintf(what, sizeof what, "igrad plan: --link %s", flag);
    return plan_link_parse_as(what, text, out);
}

int plan_link_parse_as(const char *what, const char *text, plan_link_t *out)
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
                "%s: '%s' is neither a preset (nvlink, pcie4, 400g, 200g, "
                "100g, 25g, 10g) nor GBITS,LAT_US with both > 0 (e.g. 100,8)\n",
                what, text);
        return -1;
    }
    snprintf(out->name, sizeof out->name, "%g,%g", bw, lat);
    out->bytes_per_s = bw * 1e9 / 8.0;
    out->latency_s = lat * 1e-6;
    return 0;
}

static const char *const coll_names[PLAN_NCOLL] = {"allgather", "allreduce", "reduce", "bcast"};

const char *plan_coll_name(plan_coll_t c)
{
    return c >= 0 && c < PLAN_NCOLL ? coll_names[c] : "unknown";
}

int plan_level_parse(const char *text, plan_level_t levels[2])
{
    static const char *const level_names[2] = {"intra", "inter"};
    const char *eq = strchr(text, '=');
    size_t klen = eq ? (size_t)(eq - text) : 0;
    char key[48];
    if (!eq || klen >= sizeof key) goto bad;
    memcpy(key, text, klen);
    key[klen] = '\0';
    char *dot = strchr(key, '.');
    if (dot) *dot++ = '\0';
    int lv = !strcmp(key, "intra") ? 0 : !strcmp(key, "inter") ? 1 : -1;
    int c = -1;
    if (dot)
        for (int k = 0; k < PLAN_NCOLL; k++)
            if (!strcmp(dot, coll_names[k])) c = k;
    if (lv < 0 || (dot && c < 0)) goto bad;
    char flag[64];
    snprintf(flag, sizeof flag, "%s%s%s", level_names[lv], dot ? "." : "", dot ? dot : "");
    plan_link_t link;
    if (plan_link_parse(flag, eq + 1, &link)) return -1;
    plan_level_t *L = &levels[lv];
    for (int k = 0; k < PLAN_NCOLL; k++) {
        if (c >= 0 && k != c) continue;
        if (c < 0 && L->set[k]) continue; /* a per-collective link wins */
        L->coll[k] = link;
        if (c >= 0) L->set[k] = 1;
    }
    return 0;
bad:
    fprintf(stderr,
            "igrad plan: --link '%s': expected intra=SPEC, inter=SPEC or LEVEL.COLL=SPEC "
            "(COLL: allgather, allreduce, reduce, bcast)\n",
            text);
    return -1;
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

/* The hier route's node sums and broadcasts (engine_hier.c): one
 * MPI_Ireduce (MPI_Ibcast) per tensor, all in flight, owners balanced by
 * entries over the L ranks. Together they move what one ring
 * reduce-scatter (all-gather) of the n bytes moves: each rank receives
 * (L-1)/L n (sends it, for the broadcast); the latencies of collectives in
 * flight overlap, so L-1 of them are counted, not T (L-1). */
double plan_node_collectives_s(double n, int64_t L, const plan_link_t *l)
{
    if (L <= 1) return 0.0;
    double l1 = (double)(L - 1);
    return l1 * l->latency_s + l1 / (double)L * n / l->bytes_per_s;
}

/* Ok-Topk / SparCML family (Li & Hoefler, PPoPP 2022): split and reduce by
 * index range, re-sparsify each partial sum to the budget, all-gather the
 * reduced result. Ideal balance: 2(P-1)/P payload bytes per rank (the
 * lower bound Ok-Topk cites; its own bound is 3x that); latency: P-1
 * messages for the split plus ceil(log2 P) for the recursive-doubling
 * all-gather. */
plan_level_cost_t plan_sparse_allreduce(double payload, int64_t P, const plan_link_t *link)
{
    plan_level_cost_t c = {0, 0};
    if (P <= 1) return c;
    double v = 2.0 * (double)(P - 1) / (double)P * payload;
    c.wire_nbytes = v;
    c.seconds = ((double)(P - 1) + ceil(log2((double)P))) * link->latency_s +
                v / link->bytes_per_s;
    return c;
}

/* Nearest integers, clamped to what igrad_config_validate accepts (a
 * latency under 0.5 ns is 0: auto by bytes alone). */
void plan_link_to_engine(const plan_link_t *l, int64_t *latency_ns, int64_t *bandwidth_mbps)
{
    double ns = l->latency_s * 1e9, mbps = l->bytes_per_s * 8.0 / 1e6;
    *latency_ns = ns >= 1e9 ? 1000000000LL : (int64_t)llround(ns);
    *bandwidth_mbps = mbps >= 1e9 ? 1000000000LL : mbps < 1.0 ? 1 : (int64_t)llround(mbps);
}

int plan_engine_link_parse(const char *what, const char *text, int64_t *latency_ns,
                           int64_t *bandwidth_mbps)
{
    plan_link_t l;
    if (plan_link_parse_as(what, text, &l)) return -1;
    plan_link_to_engine(&l, latency_ns, bandwidth_mbps);
    return 0;
}

plan_link_t plan_link_of_engine(int64_t latency_ns, int64_t bandwidth_mbps)
{
    plan_link_t l;
    memset(&l, 0, sizeof l);
    snprintf(l.name, sizeof l.name, "%lld ns,%lld Mbit/s", (long long)latency_ns,
             (long long)bandwidth_mbps);
    l.latency_s = (double)latency_ns * 1e-9;
    l.bytes_per_s = (double)bandwidth_mbps * 1e6 / 8.0;
    return l;
}

/* The engine's sparse all-reduce bucket (route.c): two alltoallv of P-1
 * messages and two ring all-gathers, 4(P-1) alpha, and the bytes the
 * engine counts (a plan-only engine: the balanced model). */
double plan_engine_sar_s(double wire_nbytes, int64_t P, const plan_link_t *l)
{
    if (P <= 1) return 0.0;
    return 4.0 * (double)(P - 1) * l->latency_s + wire_nbytes / l->bytes_per_s;
}
