/*
 * plan_cost.c — the α-β model of `igrad plan` (plan_cost.h). Every
 * formula here is stated, with its source, in docs/plan.md §2; the link
 * presets and their parser are the library's (src/link.c, igrad_link_*),
 * shared with the Python binding. Measured against the namespace testbed
 * in docs/results/plan_validation.md.
 */
#include "plan_cost.h"

#include "igrad.h"
#include "plan/route.h" /* the sparse all-reduce's fitted constants */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void plan_link_print_presets(void *fp)
{
    for (size_t i = 0; i < igrad_link_preset_count(); i++) {
        const igrad_link_preset_t *p = igrad_link_preset(i);
        fprintf((FILE *)fp, "  %-7s %7.0f Gbit/s %5.1f us  %s\n", p->name, p->gbit_per_s,
                p->latency_us, p->assumes);
    }
}

int plan_link_parse(const char *flag, const char *text, plan_link_t *out)
{
    char what[96];
    snprintf(what, sizeof what, "igrad plan: --link %s", flag);
    return plan_link_parse_as(what, text, out);
}

/* The presets and the parser are the library's (src/link.c), shared with
 * the Python binding. */
int plan_link_parse_as(const char *what, const char *text, plan_link_t *out)
{
    memset(out, 0, sizeof *out);
    double bw, lat;
    if (igrad_link_parse(text, &bw, &lat) != IGRAD_OK) {
        fprintf(stderr, "%s: %s\n", what, igrad_last_error());
        return -1;
    }
    int preset = 0;
    for (size_t i = 0; i < igrad_link_preset_count(); i++)
        preset |= !strcmp(text, igrad_link_preset(i)->name);
    if (preset)
        snprintf(out->name, sizeof out->name, "%s", text);
    else
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
 * reduced result. Ideal balance: 2(P-1)/P payload bytes per rank, the
 * payload counting index and value, so in the paper's units (values) 2x
 * the lower bound 2k(P-1)/P it cites; Ok-Topk's own bound, 6k(P-1)/P, is
 * 1.5x this (docs/plan.md §2). Latency: P-1
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

void plan_link_to_engine(const plan_link_t *l, int64_t *latency_ns, int64_t *bandwidth_mbps)
{
    igrad_link_to_config(l->bytes_per_s * 8.0 / 1e9, l->latency_s * 1e6, latency_ns,
                         bandwidth_mbps);
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

/* The engine's sparse all-reduce bucket: route.h's fitted time, the
 * constants auto's price (route.c's sar_cost) reads: 17 alpha whatever P
 * (four exchanges, each with every message in flight at once) and 9/5 x
 * the bytes the engine counts (a plan-only engine: the balanced model) at
 * the link's rate (the split's all-to-all meets each receiver's link from
 * P-1 senders at once), fitted to the namespace testbed at 4 and 8 ranks
 * (docs/results/sparse_allreduce.md). */
double plan_engine_sar_s(double wire_nbytes, int64_t P, const plan_link_t *l)
{
    if (P <= 1) return 0.0;
    return (double)IGRAD__SAR_FIT_ALPHA * l->latency_s +
           (double)IGRAD__SAR_FIT_BETA_NUM / (double)IGRAD__SAR_FIT_BETA_DEN * wire_nbytes /
               l->bytes_per_s;
}

double plan_time_s(plan_time_t t) { return t.lat_s + t.bw_s; }

/* The bandwidth term of V bytes per rank through a node's NICs and its
 * NVLink: NCCL's channels cross each node boundary once per ring, so a
 * node's NICs together carry what one rank sends, V, split over its K NICs
 * (docs/plan.md §2a); every rank sends at most V on intra. */
static plan_time_t fabric_bw(double v, const plan_fabric_t *f)
{
    plan_time_t t = {0, v / f->intra->bytes_per_s, 0};
    if (f->N > 1) {
        t.nic_nbytes = v / (double)f->K;
        double e = t.nic_nbytes / f->inter->bytes_per_s;
        if (e > t.bw_s) t.bw_s = e;
    }
    return t;
}

/* NCCL src/graph/tuning.cc: a ring's latency is (nsteps - nInterSteps)
 * intra-node hops and nInterSteps inter-node ones, nInterSteps =
 * 2(nNodes-1) for all-reduce and nNodes-1 for all-gather. */
static double ring_lat(int64_t steps, int64_t inter_steps, const plan_fabric_t *f)
{
    return (double)(steps - inter_steps) * f->intra->latency_s +
           (double)inter_steps * f->inter->latency_s;
}

plan_time_t plan_nccl_ring_allreduce(double n, const plan_fabric_t *f)
{
    plan_time_t t = {0, 0, 0};
    if (f->P <= 1) return t;
    t = fabric_bw(2.0 * (double)(f->P - 1) / (double)f->P * n, f);
    t.lat_s = ring_lat(2 * (f->P - 1), 2 * (f->N - 1), f);
    return t;
}

/* NCCL's tuner prices a tree all-reduce at 0.92 of the bus bandwidth
 * (tuning.cc: busBw * .92). */
#define PLAN_NCCL_TREE_BW 0.92

plan_time_t plan_nccl_tree_allreduce(double n, const plan_fabric_t *f)
{
    plan_time_t t = {0, 0, 0};
    if (f->P <= 1) return t;
    t = fabric_bw(2.0 * n, f);
    t.bw_s /= PLAN_NCCL_TREE_BW; /* slower, not more bytes */
    int64_t log2n = 0; /* NCCL's log2i: floor */
    for (int64_t v = f->N; v > 1; v >>= 1) log2n++;
    t.lat_s = 2.0 * ((double)(f->L - 1) * f->intra->latency_s +
                     (double)log2n * f->inter->latency_s);
    return t;
}

plan_time_t plan_nccl_allreduce(double n, const plan_fabric_t *f, int *tree)
{
    plan_time_t r = plan_nccl_ring_allreduce(n, f), t = plan_nccl_tree_allreduce(n, f);
    int use_tree = plan_time_s(t) < plan_time_s(r);
    if (tree) *tree = use_tree;
    return use_tree ? t : r;
}

plan_time_t plan_nccl_allgather(double m, const plan_fabric_t *f)
{
    plan_time_t t = {0, 0, 0};
    if (f->P <= 1) return t;
    t = fabric_bw((double)(f->P - 1) * m, f);
    t.lat_s = ring_lat(f->P - 1, f->N - 1, f);
    return t;
}

plan_link_t plan_fabric_p2p_link(const plan_fabric_t *f)
{
    if (f->N <= 1) return *f->intra;
    plan_link_t l = *f->inter;
    l.bytes_per_s *= (double)f->K / (double)f->L;
    return l;
}
