/*
 * engine.c — the sync engine (DESIGN.md §2): method/config names and
 * validation, the plan built at create (per tensor: every step or released
 * at a phase, budgets for normal and release steps, block cuts, buffer
 * sizes for the largest step), and the
 * order of one step: check, agree, gate, select, plan the blocks and
 * buckets, pack, the collectives (two-phase or pipelined), unpack, with
 * statistics. This is the control plane: every touch of gradient,
 * residual, velocity or bucket memory goes through the data-plane table
 * e->mem.dp (dp.h; the CPU backend is dp_cpu*.c), and every choice of
 * collective through the bucket routes (route.h).
 *
 * Not here: the agreement items and their exchange (engine_agree.c);
 * saving and loading a rank's state (engine_state.c); the gate,
 * phases and release budgets (schedule.c); bucket policies (pack.c);
 * selection itself (select.c); the stages' loops (dp_cpu*.c); the
 * collectives (comm*.c).
 *
 * Why the step is shaped the way it is:
 *  - Nothing is written before every rank knows that every gradient is
 *    finite: a read-only pass checks grad + residual, then one tiny
 *    allgather agrees on it, so a NaN on one rank fails the step on all
 *    ranks with every residual bit-identical (the caller skips the step).
 *    The same exchange carries argument errors (a NULL gradient) and, every
 *    verify_every calls, the agreement items, so no rank is ever left
 *    waiting in a collective the others skipped.
 *  - Which tensors are sent, their budgets and the bucket plan depend only
 *    on (plan, step) and byte counts, so every rank issues the same
 *    collectives without talking about it.
 *  - Every buffer is sized at create for the largest step of the release
 *    cycle; a step allocates nothing (selection workspaces grow once).
 *  - Buckets are unpacked in bucket order and ranks in rank order, so every
 *    rank computes bit-identical averages.
 */
#define _POSIX_C_SOURCE 200809L

#include "engine/engine_internal.h"
#include "engine/engine_stream.h"
#include "comm/comm_internal.h"
#include "profile/profile_internal.h"
#include "dp/dp.h"
#include "plan/route.h"
#include "plan/schedule.h"
#include "dp/cpu/select_internal.h"
#include "comm/sparse_allreduce.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif


/* ------------------------------------------------------------------------ */
/* Names                                                                    */
/* ------------------------------------------------------------------------ */

static const char *const method_names[] = {"dense", "topk_sync", "adtopk_sync", "iad", "ig"};
static const char *const residual_names[] = {"on", "drop"};
static const char *const collective_names[] = {"auto", "gather", "reduce", "sparse_reduce"};
static const char *const topology_names[] = {"flat", "hier"};
#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

const char *igrad_method_name(igrad_method_t method)
{
    int m = (int)method;
    return m >= 0 && m < COUNT_OF(method_names) ? method_names[m] : "unknown";
}

const char *igrad_residual_policy_name(igrad_residual_policy_t policy)
{
    int p = (int)policy;
    return p >= 0 && p < COUNT_OF(residual_names) ? residual_names[p] : "unknown";
}

const char *igrad_collective_name(igrad_collective_t collective)
{
    int c = (int)collective;
    return c >= 0 && c < COUNT_OF(collective_names) ? collective_names[c] : "unknown";
}

/* Index of `name` in `names`, or -1. */
static int find_name(const char *name, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (igrad__name_equal(name, names[i])) return i;
    return -1;
}

igrad_status_t igrad_method_from_name(const char *name, igrad_method_t *method)
{
    IGRAD_FAIL_IF(!name || !method, IGRAD_E_INVALID, "method name: NULL argument");
    int i = find_name(name, method_names, COUNT_OF(method_names));
    IGRAD_FAIL_IF(i < 0, IGRAD_E_INVALID,
                  "unknown method \"%s\" (dense, topk_sync, adtopk_sync, iad, ig)", name);
    *method = (igrad_method_t)i;
    return IGRAD_OK;
}

igrad_status_t igrad_residual_policy_from_name(const char *name, igrad_residual_policy_t *policy)
{
    IGRAD_FAIL_IF(!name || !policy, IGRAD_E_INVALID, "residual policy name: NULL argument");
    int i = find_name(name, residual_names, COUNT_OF(residual_names));
    IGRAD_FAIL_IF(i < 0, IGRAD_E_INVALID, "unknown residual policy \"%s\" (on, drop)", name);
    *policy = (igrad_residual_policy_t)i;
    return IGRAD_OK;
}

igrad_status_t igrad_collective_from_name(const char *name, igrad_collective_t *collective)
{
    IGRAD_FAIL_IF(!name || !collective, IGRAD_E_INVALID, "collective name: NULL argument");
    int i = find_name(name, collective_names, COUNT_OF(collective_names));
    IGRAD_FAIL_IF(i < 0, IGRAD_E_INVALID, "unknown collective \"%s\" (auto, gather, reduce, sparse_reduce)",
                  name);
    *collective = (igrad_collective_t)i;
    return IGRAD_OK;
}

const char *igrad_topology_name(igrad_topology_t topology)
{
    int c = (int)topology;
    return c >= 0 && c < COUNT_OF(topology_names) ? topology_names[c] : "unknown";
}

igrad_status_t igrad_topology_from_name(const char *name, igrad_topology_t *topology)
{
    IGRAD_FAIL_IF(!name || !topology, IGRAD_E_INVALID, "topology name: NULL argument");
    int i = find_name(name, topology_names, COUNT_OF(topology_names));
    IGRAD_FAIL_IF(i < 0, IGRAD_E_INVALID, "unknown topology \"%s\" (flat, hier)", name);
    *topology = (igrad_topology_t)i;
    return IGRAD_OK;
}

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */
/* ------------------------------------------------------------------------ */

static int method_defers(igrad_method_t m)
{
    return m == IGRAD_METHOD_IAD || m == IGRAD_METHOD_IG;
}

igrad_status_t igrad_config_validate(const igrad_config_t *c)
{
    IGRAD_FAIL_IF(!c, IGRAD_E_INVALID, "config is NULL");
    IGRAD_FAIL_IF(c->size < sizeof(igrad_config_t), IGRAD_E_INVALID,
                  "config.size is %zu, but this igrad's igrad_config_t has %zu bytes "
                  "(initialise it with IGRAD_CONFIG_INIT)",
                  c->size, sizeof(igrad_config_t));
    IGRAD_FAIL_IF((int)c->method < 0 || (int)c->method >= COUNT_OF(method_names),
                  IGRAD_E_INVALID, "config.method is %d (dense, topk_sync, adtopk_sync, iad, ig)",
                  (int)c->method);
    IGRAD_FAIL_IF((int)c->sparsifier < 0 || (int)c->sparsifier > IGRAD_SPARSIFIER_ADTOPK,
                  IGRAD_E_INVALID, "config.sparsifier is %d (none, topk, adtopk)",
                  (int)c->sparsifier);
    IGRAD_FAIL_IF(method_defers(c->method) && c->sparsifier == IGRAD_SPARSIFIER_NONE,
                  IGRAD_E_INVALID,
                  "config.sparsifier is none, but method %s needs topk or adtopk "
                  "(method dense sends everything)",
                  igrad_method_name(c->method));
    IGRAD_FAIL_IF(c->interleave != 0 && c->interleave != 1, IGRAD_E_INVALID,
                  "config.interleave is %d (must be 0 or 1)", c->interleave);
    IGRAD_FAIL_IF(!(c->density > 0.0 && c->density <= 1.0), IGRAD_E_INVALID,
                  "config.density is %g (must be in (0, 1])", c->density);
    IGRAD_FAIL_IF(c->release_period < 1 || c->release_period > IGRAD__SCHEDULE_MAX_PERIOD,
                  IGRAD_E_INVALID, "config.release_period is %d (must be in [1, %d])",
                  c->release_period, IGRAD__SCHEDULE_MAX_PERIOD);
    IGRAD_FAIL_IF(!(c->release_keep > 0.0 && c->release_keep <= 1.0), IGRAD_E_INVALID,
                  "config.release_keep is %g (must be in (0, 1])", c->release_keep);
    IGRAD_FAIL_IF(c->schedule != IGRAD_SCHEDULE_ALIGNED && c->schedule != IGRAD_SCHEDULE_STAGGERED,
                  IGRAD_E_INVALID, "config.schedule is %d (aligned, staggered)",
                  (int)c->schedule);
    IGRAD_FAIL_IF((int)c->residual < 0 || (int)c->residual >= COUNT_OF(residual_names),
                  IGRAD_E_INVALID, "config.residual is %d (on, drop)", (int)c->residual);
    IGRAD_FAIL_IF((int)c->pack < 0 || (int)c->pack > IGRAD_PACK_CONTIGUOUS, IGRAD_E_INVALID,
                  "config.pack is %d (direct, sequential, greedy, risk, contiguous)",
                  (int)c->pack);
    IGRAD_FAIL_IF(c->buckets < 1 || c->buckets > IGRAD__PACK_MAX_BUCKETS, IGRAD_E_INVALID,
                  "config.buckets is %d (must be in [1, %d])", c->buckets,
                  IGRAD__PACK_MAX_BUCKETS);
    IGRAD_FAIL_IF(c->block_entries < 1, IGRAD_E_INVALID,
                  "config.block_entries is %lld (must be >= 1)", (long long)c->block_entries);
    IGRAD_FAIL_IF(c->verify_every < 0, IGRAD_E_INVALID,
                  "config.verify_every is %lld (must be >= 0; 0 = only at create)",
                  (long long)c->verify_every);
    IGRAD_FAIL_IF(c->value_dtype != IGRAD_DTYPE_F32 && c->value_dtype != IGRAD_DTYPE_BF16 &&
                      c->value_dtype != IGRAD_DTYPE_F16,
                  IGRAD_E_INVALID, "config.value_dtype is %s (F32, BF16 or F16)",
                  igrad_dtype_name(c->value_dtype));
    IGRAD_FAIL_IF(c->value_dtype != IGRAD_DTYPE_F32 && c->method == IGRAD_METHOD_DENSE,
                  IGRAD_E_UNSUPPORTED,
                  "config.value_dtype is %s, but method dense all-reduces F32 (it keeps no "
                  "residual to take the rounding error back; use F32)",
                  igrad_dtype_name(c->value_dtype));
    IGRAD_FAIL_IF(c->grad_dtype != IGRAD_DTYPE_F32 && c->grad_dtype != IGRAD_DTYPE_BF16 &&
                      c->grad_dtype != IGRAD_DTYPE_F16,
                  IGRAD_E_INVALID, "config.grad_dtype is %s (F32, BF16 or F16)",
                  igrad_dtype_name(c->grad_dtype));
    IGRAD_FAIL_IF(c->index_dtype != IGRAD_DTYPE_U16 && c->index_dtype != IGRAD_DTYPE_U32,
                  IGRAD_E_INVALID,
                  "config.index_dtype is %s (U16: 16-bit where indices fit, U32: always 32-bit)",
                  igrad_dtype_name(c->index_dtype));
    IGRAD_FAIL_IF((int)c->collective < 0 || (int)c->collective >= COUNT_OF(collective_names),
                  IGRAD_E_INVALID, "config.collective is %d (auto, gather, reduce, sparse_reduce)",
                  (int)c->collective);
    IGRAD_FAIL_IF((int)c->topology < 0 || (int)c->topology >= COUNT_OF(topology_names),
                  IGRAD_E_INVALID, "config.topology is %d (flat, hier)", (int)c->topology);
    IGRAD_FAIL_IF(c->ranks_per_node < 0, IGRAD_E_INVALID,
                  "config.ranks_per_node is %d (must be >= 0; 0 = the nodes MPI reports)",
                  c->ranks_per_node);
    IGRAD_FAIL_IF(c->dense_below < 0, IGRAD_E_INVALID,
                  "config.dense_below is %lld (must be >= 0; 0 = off)",
                  (long long)c->dense_below);
    IGRAD_FAIL_IF(c->link_latency_ns < 0 || c->link_latency_ns > IGRAD__LINK_MAX_LATENCY_NS,
                  IGRAD_E_INVALID,
                  "config.link_latency_ns is %lld (must be in [0, 1000000000]; 0 = auto by "
                  "bytes alone)",
                  (long long)c->link_latency_ns);
    IGRAD_FAIL_IF(c->link_bandwidth_mbps < 1 ||
                      c->link_bandwidth_mbps > IGRAD__LINK_MAX_BANDWIDTH_MBPS,
                  IGRAD_E_INVALID,
                  "config.link_bandwidth_mbps is %lld (must be in [1, 1000000000] Mbit/s)",
                  (long long)c->link_bandwidth_mbps);
    IGRAD_FAIL_IF(c->auto_sparse_reduce != 0 && c->auto_sparse_reduce != 1, IGRAD_E_INVALID,
                  "config.auto_sparse_reduce is %d (0 or 1)", c->auto_sparse_reduce);
    IGRAD_FAIL_IF(c->threads < 0 || c->threads > 4096, IGRAD_E_INVALID,
                  "config.threads is %d (must be in [0, 4096]; 0 = OpenMP default)", c->threads);
    IGRAD_FAIL_IF(!(c->timeout_s >= 0.0 && c->timeout_s <= DBL_MAX), IGRAD_E_INVALID,
                  "config.timeout_s is %g (must be a finite number of seconds >= 0; 0 = no "
                  "timeout)",
                  c->timeout_s);
    /* online profiling */
    IGRAD_FAIL_IF(c->profile_steps < 0 || c->profile_steps > IGRAD__ONLINE_MAX_STEPS,
                  IGRAD_E_INVALID, "config.profile_steps is %lld (must be in [0, %d]; 0 = off)",
                  (long long)c->profile_steps, IGRAD__ONLINE_MAX_STEPS);
    IGRAD_FAIL_IF(c->profile_steps > 0 && !method_defers(c->method), IGRAD_E_INVALID,
                  "config.profile_steps is %lld, but method %s uses no profile (iad, ig)",
                  (long long)c->profile_steps, igrad_method_name(c->method));
    IGRAD_FAIL_IF(!(c->profile_alpha >= 0.0 && c->profile_alpha <= 1.0), IGRAD_E_INVALID,
                  "config.profile_alpha is %g (must be in [0, 1])", c->profile_alpha);
    if (c->profile_partition) {
        igrad__partition_method_t pm;
        IGRAD_FAIL_IF(strlen(c->profile_partition) >= IGRAD__ONLINE_PARTITION_NBYTES ||
                          igrad__partition_parse(c->profile_partition, &pm) != IGRAD_OK,
                      IGRAD_E_INVALID,
                      "config.profile_partition is \"%.60s\" (knee, otsu, kmeans2, gmm2, "
                      "percentile:P, fixed:F)",
                      c->profile_partition);
    }
    IGRAD_FAIL_IF(!(c->momentum >= 0.0 && c->momentum < 1.0), IGRAD_E_INVALID,
                  "config.momentum is %g (must be in [0, 1); 0 = off)", c->momentum);
    IGRAD_FAIL_IF(c->start_iter < 0, IGRAD_E_INVALID,
                  "config.start_iter is %lld (must be >= 0; 0 = no dense warm-up)",
                  (long long)c->start_iter);
    IGRAD_FAIL_IF(!(c->target_ratio == 0.0 || (c->target_ratio > 0.0 && c->target_ratio <= 1.0)),
                  IGRAD_E_INVALID, "config.target_ratio is %g (must be in (0, 1]; 0 = off)",
                  c->target_ratio);
    IGRAD_FAIL_IF(c->target_ratio > 0.0 && c->method != IGRAD_METHOD_IG, IGRAD_E_INVALID,
                  "config.target_ratio is %g, but method %s has no kappa to choose (ig)",
                  c->target_ratio, igrad_method_name(c->method));
    IGRAD_FAIL_IF(c->reprofile_every < 0 || c->reprofile_every > IGRAD__ONLINE_MAX_STEPS,
                  IGRAD_E_INVALID,
                  "config.reprofile_every is %lld (must be in [0, %d]; 0 = off)",
                  (long long)c->reprofile_every, IGRAD__ONLINE_MAX_STEPS);
    IGRAD_FAIL_IF(c->reprofile_every > 0 && c->profile_steps == 0, IGRAD_E_INVALID,
                  "config.reprofile_every is %lld, but config.profile_steps is 0 (re-profiling "
                  "follows online profiling)",
                  (long long)c->reprofile_every);
    IGRAD_FAIL_IF(!(c->reprofile_margin >= 0.0 && c->reprofile_margin <= 1.0), IGRAD_E_INVALID,
                  "config.reprofile_margin is %g (must be in [0, 1])", c->reprofile_margin);
    return IGRAD_OK;
}

/* ------------------------------------------------------------------------ */
/* Building the plan                                                        */
/* ------------------------------------------------------------------------ */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Wire index bytes of one selection spec. */
static int index_nbytes(const igrad_engine_t *e, const igrad_select_spec_t *sp)
{
    if (e->plan.sp == IGRAD_SPARSIFIER_NONE) return 0;
    int64_t range = sp->row_wise ? sp->cols : sp->n; /* indices are < range */
    if (e->plan.cfg.index_dtype == IGRAD_DTYPE_U16 && range <= 65536) return 2;
    return 4;
}

/* Checks that a profile describes the layout's components. The profile may
 * lack EMB/HEAD/NORM components (made before they were components): those
 * are important (plan_phases). Both lists are sorted by (layer, kind). A
 * shard's layout (the two-level sync, `subset`) holds some of the profiled
 * model's components: the profile may have more, and its layout hash is
 * the whole model's. */
static int comp_before(int layer, igrad_kind_t kind, int layer2, igrad_kind_t kind2)
{
    return layer < layer2 || (layer == layer2 && kind < kind2);
}

static igrad_status_t check_profile(const igrad_profile_t *profile,
                                    const igrad_layout_t *layout, int subset)
{
    size_t nc = igrad_layout_component_count(layout), np = igrad_profile_count(profile);
    uint64_t ph = igrad_profile_layout_hash(profile), lh = igrad_layout_hash(layout);
    IGRAD_FAIL_IF(!subset && ph != 0 && ph != lh, IGRAD_E_MISMATCH,
                  "profile does not match the layout: made for layout 0x%016llx, this layout "
                  "is 0x%016llx",
                  (unsigned long long)ph, (unsigned long long)lh);
    size_t p = 0;
    for (size_t c = 0; c < nc; c++) {
        igrad_component_info_t ci;
        igrad_profile_entry_t pe = {0};
        IGRAD_CHECK(igrad_layout_component(layout, c, &ci));
        if (p < np) IGRAD_CHECK(igrad_profile_entry(profile, p, &pe));
        while (subset && p < np && comp_before(pe.layer, pe.kind, ci.layer, ci.kind))
            if (++p < np) IGRAD_CHECK(igrad_profile_entry(profile, p, &pe));
        int same = p < np && ci.layer == pe.layer && ci.kind == pe.kind;
        if (!same && igrad__kind_is_outer(ci.kind)) continue; /* absent: important */
        IGRAD_FAIL_IF(p >= np, IGRAD_E_MISMATCH,
                      "profile does not match the layout: it has %zu components and lacks "
                      "the layout's (%d, %s)",
                      np, ci.layer, igrad_kind_name(ci.kind));
        IGRAD_FAIL_IF(!same || ci.count != pe.count, IGRAD_E_MISMATCH,
                      "profile does not match the layout at component %zu: profile has "
                      "(%d, %s) with %lld entries, layout (%d, %s) with %lld",
                      c, pe.layer, igrad_kind_name(pe.kind), (long long)pe.count, ci.layer,
                      igrad_kind_name(ci.kind), (long long)ci.count);
        p++;
    }
    IGRAD_FAIL_IF(!subset && p != np, IGRAD_E_MISMATCH,
                  "profile does not match the layout: %zu components in the profile, %zu of "
                  "them in the layout",
                  np, p);
    return IGRAD_OK;
}

/* Copies the layout's tensors and components into the engine. */
static igrad_status_t copy_layout(igrad_engine_t *e, const igrad_layout_t *layout)
{
    size_t T = igrad_layout_count(layout);
    IGRAD_FAIL_IF(T == 0, IGRAD_E_INVALID, "igrad_engine_create: the layout has no tensors");
    IGRAD_FAIL_IF(T > UINT32_MAX, IGRAD_E_INVALID,
                  "igrad_engine_create: %zu tensors, more than block keys can address", T);
    e->plan.ntensors = T;
    e->plan.t = calloc(T, sizeof *e->plan.t);
    e->plan.tensor_hash = calloc(T, sizeof *e->plan.tensor_hash);
    IGRAD_FAIL_IF(!e->plan.t || !e->plan.tensor_hash, IGRAD_E_NOMEM,
                  "igrad_engine_create: out of memory");
    size_t names_nbytes = 0;
    for (size_t i = 0; i < T; i++) {
        igrad_tensor_info_t ti;
        IGRAD_CHECK(igrad_layout_tensor(layout, i, &ti));
        names_nbytes += strlen(ti.name) + 1;
    }
    e->plan.names = malloc(names_nbytes);
    IGRAD_FAIL_IF(!e->plan.names, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    char *p = e->plan.names;
    for (size_t i = 0; i < T; i++) {
        igrad_tensor_info_t ti;
        IGRAD_CHECK(igrad_layout_tensor(layout, i, &ti));
        igrad__plan_tensor_t *tp = &e->plan.t[i];
        size_t len = strlen(ti.name) + 1;
        memcpy(p, ti.name, len);
        tp->name = p;
        p += len;
        tp->ndim = ti.ndim;
        for (int d = 0; d < IGRAD_MAX_DIMS; d++) tp->shape[d] = ti.shape[d];
        tp->n = ti.count;
        tp->comp = ti.component;
        IGRAD_FAIL_IF(ti.count > (int64_t)UINT32_MAX + 1, IGRAD_E_INVALID,
                      "tensor %s has %lld entries, more than 32-bit indices address", ti.name,
                      (long long)ti.count);
        uint64_t h = igrad__hash_str(IGRAD__HASH_SEED, ti.name);
        h = igrad__hash_i64(h, (int64_t)ti.dtype);
        h = igrad__hash_i64(h, ti.ndim);
        for (int d = 0; d < ti.ndim; d++) h = igrad__hash_i64(h, ti.shape[d]);
        e->plan.tensor_hash[i] = h;
    }
    size_t C = igrad_layout_component_count(layout);
    e->plan.ncomp = C;
    size_t Cn = C ? C : 1;
    e->plan.comp_layer = calloc(Cn, sizeof *e->plan.comp_layer);
    e->plan.comp_kind = calloc(Cn, sizeof *e->plan.comp_kind);
    e->plan.comp_count = calloc(Cn, sizeof *e->plan.comp_count);
    e->plan.comp_important = calloc(Cn, 1);
    e->plan.comp_phase = calloc(Cn, sizeof *e->plan.comp_phase);
    IGRAD_FAIL_IF(!e->plan.comp_layer || !e->plan.comp_kind || !e->plan.comp_count ||
                      !e->plan.comp_important || !e->plan.comp_phase,
                  IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    for (size_t c = 0; c < C; c++) {
        igrad_component_info_t ci;
        IGRAD_CHECK(igrad_layout_component(layout, c, &ci));
        e->plan.comp_layer[c] = ci.layer;
        e->plan.comp_kind[c] = ci.kind;
        e->plan.comp_count[c] = ci.count;
        e->plan.comp_important[c] = 1;
    }
    return IGRAD_OK;
}

/* Specs, index widths and block cuts of every tensor. */
static igrad_status_t plan_tensors(igrad_engine_t *e)
{
    const igrad_config_t *c = &e->plan.cfg;
    double rscale = c->method == IGRAD_METHOD_IG
                        ? igrad__release_scale(c->release_keep, c->release_period)
                        : 1.0;
    for (size_t i = 0; i < e->plan.ntensors; i++) {
        igrad__plan_tensor_t *tp = &e->plan.t[i];
        for (int rel = 0; rel < 2; rel++)
            for (int par = 0; par < 2; par++) {
                igrad_select_spec_t *sp = &tp->spec[rel][par];
                /* below config.dense_below: every entry, whenever it is sent */
                igrad_sparsifier_t tsp =
                    e->plan.sp != IGRAD_SPARSIFIER_NONE && tp->n < c->dense_below
                        ? IGRAD_SPARSIFIER_NONE
                        : e->plan.sp;
                IGRAD_CHECK(igrad_select_spec(tsp, c->density, rel ? rscale : 1.0,
                                              c->interleave, par, tp->ndim, tp->shape, sp));
                tp->idx_nbytes[rel][par] = index_nbytes(e, sp);
                int64_t blk = c->block_entries;
                if (sp->row_wise) {
                    /* whole rows per block, so a block's row is known from
                     * its position and indices can be column indices */
                    int64_t rows_per = blk / sp->per_row;
                    blk = sp->per_row * (rows_per > 0 ? rows_per : 1);
                }
                tp->blk_entries[rel][par] = blk;
                tp->nblocks[rel][par] = igrad__pack_split_count(sp->count, blk);
            }
    }
    return IGRAD_OK;
}

/* Bytes a tensor sends at a step kind. */
static int64_t tensor_nbytes(const igrad_engine_t *e, const igrad__plan_tensor_t *tp, int rel,
                             int par)
{
    return tp->spec[rel][par].count * (e->plan.value_nbytes + tp->idx_nbytes[rel][par]);
}

/* Floats a tensor needs in reduce buckets (its dense segments). */
static int64_t tensor_dense_cap(const igrad_engine_t *e, const igrad__plan_tensor_t *tp, int rel,
                                int par)
{
    const igrad_select_spec_t *sp = &tp->spec[rel][par];
    int64_t nb = tp->nblocks[rel][par];
    if (e->plan.sp == IGRAD_SPARSIFIER_NONE || sp->row_wise || nb <= 1 ||
        e->plan.per_tensor_buckets)
        return tp->n;
    /* flat blocks of one tensor in k buckets carry the whole tensor k times */
    return tp->n * (nb < e->plan.nb_max ? nb : e->plan.nb_max);
}

/* Phases: important components and OTHER every step, the rest by the
 * schedule, weighted by their release payload. EMB/HEAD/NORM components
 * are important when the profile lacks them. */
static igrad_status_t plan_phases(igrad_engine_t *e, const igrad_profile_t *profile)
{
    size_t C = e->plan.ncomp;
    for (size_t c = 0; c < C; c++) e->plan.comp_phase[c] = IGRAD__PHASE_EVERY;
    if (e->plan.deferral) {
        for (size_t c = 0; c < C && profile; c++) { /* none: all important (online) */
            int outer = igrad__kind_is_outer(e->plan.comp_kind[c]);
            int imp =
                igrad_profile_is_important(profile, e->plan.comp_layer[c], e->plan.comp_kind[c]);
            if (outer && imp < 0) imp = 1;
            IGRAD_FAIL_IF(imp < 0, IGRAD_E_MISMATCH,
                          "profile has no component (%d, %s) of the layout", e->plan.comp_layer[c],
                          igrad_kind_name(e->plan.comp_kind[c]));
            e->plan.comp_important[c] = (unsigned char)imp;
        }
        if (C > 0) {
            int64_t *rel_nbytes = calloc(C, sizeof *rel_nbytes);
            IGRAD_FAIL_IF(!rel_nbytes, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
            for (size_t i = 0; i < e->plan.ntensors; i++)
                if (e->plan.t[i].comp >= 0)
                    rel_nbytes[e->plan.t[i].comp] += tensor_nbytes(e, &e->plan.t[i], 1, 0);
            igrad_status_t st =
                igrad__schedule_assign(e->plan.cfg.schedule, e->plan.cfg.release_period, C,
                                       rel_nbytes, e->plan.comp_important, e->plan.comp_phase);
            free(rel_nbytes);
            IGRAD_CHECK(st);
        }
    }
    for (size_t i = 0; i < e->plan.ntensors; i++) {
        igrad__plan_tensor_t *tp = &e->plan.t[i];
        tp->important = tp->comp < 0 ? 1 : e->plan.comp_important[tp->comp];
        tp->phase = tp->comp < 0 ? IGRAD__PHASE_EVERY : e->plan.comp_phase[tp->comp];
    }
    return IGRAD_OK;
}

typedef struct phase_sum {
    int phase;
    int64_t v[4]; /* entries, blocks, bytes, dense floats */
} phase_sum_t;

static int cmp_phase(const void *pa, const void *pb)
{
    const phase_sum_t *a = pa, *b = pb;
    return (a->phase > b->phase) - (a->phase < b->phase);
}

/* Largest step of the cycle, per quantity: everything sent every step plus
 * the heaviest phase's releases (each quantity maximised on its own, so
 * the result bounds every step). */
static igrad_status_t plan_maxima(igrad_engine_t *e, int64_t out[4])
{
    int64_t every[4] = {0, 0, 0, 0};
    size_t nlow = 0;
    for (size_t i = 0; i < e->plan.ntensors; i++)
        if (e->plan.t[i].phase >= 0) nlow++;
    phase_sum_t *low = calloc(nlow ? nlow : 1, sizeof *low);
    IGRAD_FAIL_IF(!low, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < e->plan.ntensors; i++) {
        const igrad__plan_tensor_t *tp = &e->plan.t[i];
        int rel = tp->phase >= 0;
        int64_t v[4];
        v[0] = tp->spec[rel][0].count; /* the same on both parities */
        v[1] = max64(tp->nblocks[rel][0], tp->nblocks[rel][1]);
        v[2] = max64(tensor_nbytes(e, tp, rel, 0), tensor_nbytes(e, tp, rel, 1));
        v[3] = max64(tensor_dense_cap(e, tp, rel, 0), tensor_dense_cap(e, tp, rel, 1));
        if (!rel) {
            for (int q = 0; q < 4; q++) every[q] += v[q];
        } else {
            low[k].phase = tp->phase;
            memcpy(low[k].v, v, sizeof v);
            k++;
        }
    }
    qsort(low, nlow, sizeof *low, cmp_phase);
    int64_t best[4] = {0, 0, 0, 0};
    for (size_t a = 0; a < nlow;) {
        int64_t sum[4] = {0, 0, 0, 0};
        size_t b = a;
        for (; b < nlow && low[b].phase == low[a].phase; b++)
            for (int q = 0; q < 4; q++) sum[q] += low[b].v[q];
        for (int q = 0; q < 4; q++) best[q] = max64(best[q], sum[q]);
        a = b;
    }
    free(low);
    for (int q = 0; q < 4; q++) out[q] = every[q] + best[q];
    return IGRAD_OK;
}

/* Blocks of every tensor at its normal budget (even step), readiness order. */
static igrad_status_t full_blocks(const igrad_engine_t *e, igrad__pack_block_t **out,
                                  size_t *nout)
{
    size_t n = 0;
    for (size_t i = 0; i < e->plan.ntensors; i++) n += (size_t)e->plan.t[i].nblocks[0][0];
    igrad__pack_block_t *b = calloc(n ? n : 1, sizeof *b);
    IGRAD_FAIL_IF(!b, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    size_t m = 0;
    for (size_t k = e->plan.ntensors; k-- > 0;) {
        const igrad__plan_tensor_t *tp = &e->plan.t[k];
        m += (size_t)igrad__pack_split((uint32_t)k, tp->spec[0][0].count, tp->blk_entries[0][0],
                                       e->plan.value_nbytes + tp->idx_nbytes[0][0],
                                       (int64_t)(e->plan.ntensors - 1 - k), b + m);
    }
    *out = b;
    *nout = m;
    return IGRAD_OK;
}

static uint64_t plan_hash(const igrad_engine_t *e)
{
    uint64_t h =
        igrad__schedule_hash(IGRAD__HASH_SEED, e->plan.cfg.schedule, e->plan.cfg.release_period,
                             e->plan.cfg.release_keep, e->plan.ncomp, e->plan.comp_phase);
    for (size_t i = 0; i < e->plan.ntensors; i++) {
        const igrad__plan_tensor_t *tp = &e->plan.t[i];
        h = igrad__hash_i64(h, tp->phase);
        for (int rel = 0; rel < 2; rel++)
            for (int par = 0; par < 2; par++) {
                const igrad_select_spec_t *sp = &tp->spec[rel][par];
                h = igrad__hash_i64(h, sp->row_wise);
                h = igrad__hash_i64(h, sp->per_row);
                h = igrad__hash_i64(h, sp->count);
                h = igrad__hash_i64(h, tp->idx_nbytes[rel][par]);
                h = igrad__hash_i64(h, tp->blk_entries[rel][par]);
            }
    }
    h = igrad__pack_map_hash(h, &e->plan.map);
    return h;
}

static uint64_t profile_hash(const igrad_engine_t *e)
{
    if (!e->plan.deferral) return 0;
    uint64_t h = igrad__hash_i64(IGRAD__HASH_SEED, (int64_t)e->plan.ncomp);
    for (size_t c = 0; c < e->plan.ncomp; c++) {
        h = igrad__hash_i64(h, e->plan.comp_layer[c]);
        h = igrad__hash_i64(h, (int64_t)e->plan.comp_kind[c]);
        h = igrad__hash_i64(h, e->plan.comp_count[c]);
        h = igrad__hash_i64(h, e->plan.comp_important[c]);
    }
    return h;
}

static int cmp_work(const void *pa, const void *pb, const igrad_engine_t *e)
{
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    if (e->plan.t[a].n != e->plan.t[b].n) return e->plan.t[a].n > e->plan.t[b].n ? -1 : 1;
    return (a > b) - (a < b);
}

/* Static work order for the selection threads: largest tensors first, so
 * the dynamic schedule ends with small ones (an insertion sort: a few
 * hundred tensors, once). */
static void sort_work(igrad_engine_t *e)
{
    for (size_t i = 0; i < e->plan.ntensors; i++) e->step.work[i] = (uint32_t)i;
    for (size_t i = 1; i < e->plan.ntensors; i++) {
        uint32_t x = e->step.work[i];
        size_t j = i;
        while (j > 0 && cmp_work(&e->step.work[j - 1], &x, e) > 0) {
            e->step.work[j] = e->step.work[j - 1];
            j--;
        }
        e->step.work[j] = x;
    }
}

/* The engine's data-plane memory (staged selection, bucket arenas,
 * residuals, velocities), sized by the plan; none for a plan-only engine. */
static igrad_status_t alloc_dataplane(igrad_engine_t *e, int dense)
{
    const igrad_config_t *c = &e->plan.cfg;
    size_t T = e->plan.ntensors;
    if (e->plan.max_entries) {
        e->step.stage_idx = e->mem.dp->alloc(e->plan.max_entries * sizeof *e->step.stage_idx, 0);
        e->step.stage_val = e->mem.dp->alloc(e->plan.max_entries * sizeof *e->step.stage_val, 0);
        IGRAD_FAIL_IF(!e->step.stage_idx || !e->step.stage_val, IGRAD_E_NOMEM,
                      "igrad_engine_create: out of memory for %zu staged entries",
                      e->plan.max_entries);
    }
    e->mem.send_arena = e->mem.dp->alloc(e->mem.send_arena_nbytes, 0);
    e->mem.recv_arena = e->mem.dp->alloc(e->mem.recv_arena_nbytes, 0);
    IGRAD_FAIL_IF(!e->mem.send_arena || !e->mem.recv_arena, IGRAD_E_NOMEM,
                  "igrad_engine_create: out of memory for %zu + %zu bytes of buckets",
                  e->mem.send_arena_nbytes, e->mem.recv_arena_nbytes);

    e->mem.residual = calloc(T ? T : 1, sizeof *e->mem.residual);
    e->mem.velocity = calloc(T ? T : 1, sizeof *e->mem.velocity);
    IGRAD_FAIL_IF(!e->mem.residual || !e->mem.velocity, IGRAD_E_NOMEM,
                  "igrad_engine_create: out of memory");
    if (!dense) {
        int64_t total = 0;
        for (size_t i = 0; i < T; i++) total += e->plan.t[i].n;
        e->mem.residual_count = total;
        e->mem.residual_mem = e->mem.dp->alloc((size_t)total * sizeof(float), 1);
        IGRAD_FAIL_IF(!e->mem.residual_mem, IGRAD_E_NOMEM,
                      "igrad_engine_create: out of memory for %lld residual entries",
                      (long long)total);
        if (c->momentum > 0.0) {
            e->mem.velocity_count = total;
            e->mem.velocity_mem = e->mem.dp->alloc((size_t)total * sizeof(float), 1);
            IGRAD_FAIL_IF(!e->mem.velocity_mem, IGRAD_E_NOMEM,
                          "igrad_engine_create: out of memory for %lld velocity entries "
                          "(config.momentum)",
                          (long long)total);
        }
    }
    igrad__engine_point_tensors(e);
    return IGRAD_OK;
}

igrad_status_t igrad__engine_build(igrad_engine_t *e, const igrad_layout_t *layout,
                                   const igrad_profile_t *profile,
                                   const igrad_config_t *config, igrad_comm_t *comm)
{
    if (!e->mem.dp) e->mem.dp = &igrad__dp_cpu; /* igrad__engine_create may set another */
    IGRAD_FAIL_IF(!layout, IGRAD_E_INVALID, "igrad_engine_create: layout is NULL");
    IGRAD_CHECK(igrad_config_validate(config));
    memcpy(&e->plan.cfg, config, sizeof e->plan.cfg);
    e->plan.cfg.size = sizeof e->plan.cfg;
    const igrad_config_t *c = &e->plan.cfg;
    e->comm = comm;
    if (!e->plan.plan_only) { /* a plan-only engine has its nranks and no comm */
        /* The buckets live in the data plane's memory: a comm that cannot
         * take it could not run a single step. */
        char what[96];
        snprintf(what, sizeof what, "igrad_engine_create (data plane '%s')", e->mem.dp->name);
        IGRAD_CHECK(igrad__comm_check_space(comm, e->mem.dp->space, what));
        IGRAD_FAIL_IF(c->grad_dtype != IGRAD_DTYPE_F32 && !e->mem.dp->unpack16, IGRAD_E_UNSUPPORTED,
                      "igrad_engine_create: config.grad_dtype is %s, but the '%s' data plane "
                      "reads F32 gradients only (use F32)",
                      igrad_dtype_name(c->grad_dtype), e->mem.dp->name);
        e->plan.rank = igrad_comm_rank(comm);
        e->plan.nranks = igrad_comm_size(comm);
    }
    e->last_step = -1;
    IGRAD_FAIL_IF(c->topology == IGRAD_TOPOLOGY_HIER && !e->plan.plan_only, IGRAD_E_UNSUPPORTED,
                  "igrad_engine_create: config.topology hier is a two-level engine, made by "
                  "igrad_engine_create or igrad_engine_create_cuda (not for the '%s' data "
                  "plane's flat engine)",
                  e->mem.dp->name);
    IGRAD_FAIL_IF(c->ranks_per_node > 0 && e->plan.nranks % c->ranks_per_node != 0, IGRAD_E_INVALID,
                  "igrad_engine_create: config.ranks_per_node is %d, but there are %d ranks "
                  "(not a multiple)",
                  c->ranks_per_node, e->plan.nranks);
    e->plan.node_ranks = c->ranks_per_node > 0 ? c->ranks_per_node : e->plan.nranks;
    if (e->plan.avg_ranks <= 0) e->plan.avg_ranks = e->plan.nranks; /* a shard engine has its own */
    switch (c->method) {
    case IGRAD_METHOD_DENSE: e->plan.sp = IGRAD_SPARSIFIER_NONE; break;
    case IGRAD_METHOD_TOPK_SYNC: e->plan.sp = IGRAD_SPARSIFIER_TOPK; break;
    case IGRAD_METHOD_ADTOPK_SYNC: e->plan.sp = IGRAD_SPARSIFIER_ADTOPK; break;
    default: e->plan.sp = c->sparsifier; break;
    }
    e->plan.value_nbytes = (int)igrad_dtype_nbytes(c->value_dtype);
    int dense = e->plan.sp == IGRAD_SPARSIFIER_NONE;
    const igrad__route_dp_t rdp = igrad__engine_route_dp(e);
    if (!e->plan.plan_only) IGRAD_CHECK(igrad__route_check_engine(c, dense, &rdp, e->comm));
    e->plan.auto_sar = igrad__route_auto_sar(c, dense, e->plan.plan_only, &rdp, e->comm);
    e->plan.deferral = method_defers(c->method);
    e->plan.per_tensor_buckets = c->method == IGRAD_METHOD_IAD;
    IGRAD_FAIL_IF(e->plan.deferral && !profile && c->profile_steps == 0, IGRAD_E_INVALID,
                  "igrad_engine_create: method %s needs a profile (igrad_profile_build or "
                  "igrad_profile_load) or config.profile_steps > 0 (online profiling)",
                  igrad_method_name(c->method));
    if (e->plan.deferral && profile) IGRAD_CHECK(check_profile(profile, layout, e->shard));
    /* iad/ig: e->online copies the partition string and points at the copy */
    if (!e->plan.deferral) e->plan.cfg.profile_partition = NULL;

    IGRAD_CHECK(copy_layout(e, layout));
    size_t T = e->plan.ntensors;
    for (size_t i = 0; i < T; i++) e->plan.nparams += e->plan.t[i].n;
    e->plan.nb_max = e->plan.per_tensor_buckets ? (int)(T < INT32_MAX ? T : INT32_MAX) : c->buckets;
    IGRAD_CHECK(plan_tensors(e));
    IGRAD_CHECK(plan_phases(e, profile));

    if (c->pack == IGRAD_PACK_DIRECT && !e->plan.per_tensor_buckets) {
        igrad__pack_block_t *full = NULL;
        size_t nfull = 0;
        IGRAD_CHECK(full_blocks(e, &full, &nfull));
        igrad_status_t st = igrad__pack_map_build(full, nfull, c->buckets, &e->plan.map);
        free(full);
        IGRAD_CHECK(st);
    }
    if (c->pack == IGRAD_PACK_RISK && !e->plan.per_tensor_buckets) {
        size_t nkeys = 0;
        for (size_t i = 0; i < T; i++) {
            const igrad__plan_tensor_t *tp = &e->plan.t[i];
            nkeys += (size_t)max64(max64(tp->nblocks[0][0], tp->nblocks[0][1]),
                                   max64(tp->nblocks[1][0], tp->nblocks[1][1]));
        }
        uint64_t *keys = malloc((nkeys ? nkeys : 1) * sizeof *keys);
        IGRAD_FAIL_IF(!keys, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
        size_t k = 0;
        for (size_t i = 0; i < T; i++) {
            const igrad__plan_tensor_t *tp = &e->plan.t[i];
            int64_t nb = max64(max64(tp->nblocks[0][0], tp->nblocks[0][1]),
                               max64(tp->nblocks[1][0], tp->nblocks[1][1]));
            for (int64_t b = 0; b < nb; b++) keys[k++] = igrad__pack_key((uint32_t)i, (uint32_t)b);
        }
        igrad_status_t st = igrad__pack_history_init(&e->plan.hist, keys, nkeys);
        free(keys);
        IGRAD_CHECK(st);
    }

    /* buffers for the largest step */
    int64_t mx[4];
    IGRAD_CHECK(plan_maxima(e, mx));
    size_t P = (size_t)e->plan.nranks;
    e->plan.max_entries = dense ? 0 : (size_t)mx[0];
    e->plan.max_blocks = (size_t)mx[1];
    size_t slack = (size_t)e->plan.nb_max * 8; /* each bucket's offset is 8-aligned */
    igrad__route_arenas(c->collective, dense, e->plan.auto_sar, mx[2], mx[3], P, slack,
                        &e->mem.send_arena_nbytes, &e->mem.recv_arena_nbytes);

    size_t nbm = (size_t)e->plan.nb_max, mb = e->plan.max_blocks ? e->plan.max_blocks : 1;
    e->step.stage_off = calloc(T, sizeof *e->step.stage_off);
    e->step.sent = calloc(T, 1);
    e->step.rel = calloc(T, 1);
    e->step.work = calloc(T, sizeof *e->step.work);
    e->step.tstatus = calloc(T, sizeof *e->step.tstatus);
    e->step.tsumsq = calloc(T, sizeof *e->step.tsumsq);
    e->step.tnorm = calloc(T, sizeof *e->step.tnorm);
    e->step.tdropped = calloc(T, sizeof *e->step.tdropped);
    e->step.blocks = calloc(mb, sizeof *e->step.blocks);
    e->step.binfo = calloc(mb, sizeof *e->step.binfo);
    e->step.bucket_of = calloc(mb, sizeof *e->step.bucket_of);
    e->step.order = calloc(mb, sizeof *e->step.order);
    e->step.start = calloc(nbm + 1, sizeof *e->step.start);
    e->step.loads = calloc(nbm, sizeof *e->step.loads);
    e->step.bk = calloc(nbm, sizeof *e->step.bk);
    e->step.desc = calloc(nbm, sizeof *e->step.desc);
    IGRAD_FAIL_IF(!e->step.stage_off || !e->step.sent || !e->step.rel || !e->step.work ||
                      !e->step.tstatus || !e->step.tsumsq || !e->step.tnorm || !e->step.tdropped ||
                      !e->step.blocks || !e->step.binfo || !e->step.bucket_of || !e->step.order ||
                      !e->step.start || !e->step.loads || !e->step.bk || !e->step.desc,
                  IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    if (!dense && !e->plan.plan_only &&
        (c->collective == IGRAD_COLLECTIVE_SPARSE_REDUCE || e->plan.auto_sar)) {
        e->step.sar = calloc(nbm, sizeof *e->step.sar);
        IGRAD_FAIL_IF(!e->step.sar, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    }
    sort_work(e);
    if (!e->plan.per_tensor_buckets) {
        e->step.pack_scratch_nbytes = igrad__pack_scratch_nbytes(mb, c->buckets);
        e->step.pack_scratch = malloc(e->step.pack_scratch_nbytes);
        IGRAD_FAIL_IF(!e->step.pack_scratch, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    }
    if (!e->plan.plan_only) IGRAD_CHECK(alloc_dataplane(e, dense));

#ifdef _OPENMP
    e->plan.nthreads = c->threads > 0 ? c->threads : omp_get_max_threads();
#else
    e->plan.nthreads = 1;
#endif
    if (e->plan.nthreads < 1) e->plan.nthreads = 1;
    e->mem.ws = calloc((size_t)e->plan.nthreads, sizeof *e->mem.ws);
    IGRAD_FAIL_IF(!e->mem.ws, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    for (int i = 0; i < e->plan.nthreads; i++) IGRAD_CHECK(igrad_select_ws_create(&e->mem.ws[i]));
    if (e->plan.deferral) IGRAD_CHECK(igrad__online_init(e, layout, profile));

    igrad__engine_static_items(e, igrad_layout_hash(layout), profile_hash(e), plan_hash(e));
    e->calls = 0;
    igrad__engine_dynamic_items(e, -1);
    e->stats.step = -1;
    return IGRAD_OK;
}

void igrad_engine_free(igrad_engine_t *e)
{
    if (!e) return;
    igrad__hier_free(e->hier);
    igrad_engine_free(e->warmup);
    if (e->mem.ws)
        for (int i = 0; i < e->plan.nthreads; i++) igrad_select_ws_free(e->mem.ws[i]);
    free(e->mem.ws);
    igrad__pack_map_free(&e->plan.map);
    igrad__pack_history_free(&e->plan.hist);
    free(e->plan.t);
    free(e->plan.names);
    free(e->plan.tensor_hash);
    free(e->plan.comp_layer);
    free(e->plan.comp_kind);
    free(e->plan.comp_count);
    free(e->plan.comp_important);
    free(e->plan.comp_phase);
    if (e->mem.dp && e->mem.dp->release) e->mem.dp->release(IGRAD__PARTS(e));
    if (e->mem.dp) { /* set first thing at build: without it, nothing below was allocated */
        e->mem.dp->free(e->mem.residual_mem);
        e->mem.dp->free(e->mem.velocity_mem);
        e->mem.dp->free(e->step.stage_idx);
        e->mem.dp->free(e->step.stage_val);
    }
    free(e->mem.residual);
    free(e->mem.velocity);
    free(e->step.stage_off);
    free(e->step.sent);
    free(e->step.rel);
    free(e->step.work);
    free(e->step.tstatus);
    free(e->step.tsumsq);
    free(e->step.tnorm);
    free(e->step.tdropped);
    free(e->step.blocks);
    free(e->step.binfo);
    free(e->step.bucket_of);
    free(e->step.order);
    free(e->step.start);
    free(e->step.loads);
    free(e->step.bk);
    free(e->step.desc);
    if (e->step.sar)
        for (int j = 0; j < e->plan.nb_max; j++) igrad__sar_clear(&e->step.sar[j]);
    free(e->step.sar);
    free(e->step.pack_scratch);
    igrad__online_free(e->online);
    igrad__stream_free(e);
    /* After a timeout a collective is left pending on these buffers (MPI
     * may still read or write them): they are leaked on purpose. */
    if (e->broken != IGRAD_E_TIMEOUT) {
        if (e->mem.dp) {
            e->mem.dp->free(e->mem.send_arena);
            e->mem.dp->free(e->mem.recv_arena);
        }
        free(e->agree_buf);
    }
    free(e);
}

igrad_status_t igrad_engine_create(const igrad_layout_t *layout, const igrad_profile_t *profile,
                                   const igrad_config_t *config, igrad_comm_t *comm,
                                   igrad_engine_t **out)
{
    if (config && config->size >= sizeof *config && config->topology == IGRAD_TOPOLOGY_HIER)
        return igrad__hier_create(layout, profile, config, comm, &igrad__dp_cpu, NULL, out);
    return igrad__engine_create(layout, profile, config, comm, &igrad__dp_cpu, NULL, out);
}

/* igrad__engine_create, and for a shard engine of the two-level sync
 * (avg_ranks > 0: the ranks its results average over; its profile may
 * cover more components than its layout). */
static igrad_status_t create_engine(const igrad_layout_t *layout, const igrad_profile_t *profile,
                                    const igrad_config_t *config, igrad_comm_t *comm,
                                    const igrad__dp_ops_t *dp, void *stream, int64_t avg_ranks,
                                    igrad_engine_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_engine_create: out is NULL");
    *out = NULL;
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "igrad_engine_create: comm is NULL");
    int nranks = igrad_comm_size(comm);
    IGRAD_FAIL_IF(nranks < 1, IGRAD_E_INVALID, "igrad_engine_create: comm has %d ranks", nranks);
    /* The exchange buffer first: without it this rank could not even take
     * part in telling the others that it failed. */
    uint64_t *abuf = calloc((size_t)nranks * IGRAD__AGREE_WORDS, sizeof *abuf);
    IGRAD_FAIL_IF(!abuf, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");

    igrad_status_t st;
    igrad_engine_t *e = calloc(1, sizeof *e);
    if (e) {
        e->mem.dp = dp;
        e->mem.dp_stream = stream;
        e->plan.avg_ranks = avg_ranks;
        e->shard = avg_ranks > 0;
    }
    if (!e) st = igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "igrad_engine_create: out of memory");
    else if (profile && config && config->size >= sizeof *config && config->profile_steps > 0)
        /* still through the agreement below: the other ranks wait in it */
        st = igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                         "igrad_engine_create: a profile and config.profile_steps %lld given: "
                         "pass one (NULL profile for online profiling)",
                         (long long)config->profile_steps);
    else st = igrad__engine_build(e, layout, profile, config, comm);
    char msg[1024] = "";
    if (st != IGRAD_OK) snprintf(msg, sizeof msg, "%s", igrad_last_error());
    /* A rank whose build failed still waits no longer than its config says
     * (when its timeout is readable). */
    double saved = igrad_comm_timeout(comm);
    if (st != IGRAD_OK && config && config->size >= sizeof *config)
        igrad_comm_set_timeout(comm, config->timeout_s); /* refused unless valid */
    igrad_status_t ag = igrad__engine_agree(st == IGRAD_OK ? e : NULL, comm, nranks, abuf, st,
                                            -1, msg, st == IGRAD_OK ? e->items : NULL, 1,
                                            "engine create");
    igrad_comm_set_timeout(comm, saved);
    if (ag != IGRAD_OK) {
        igrad_engine_free(e);
        if (ag != IGRAD_E_TIMEOUT) free(abuf); /* else MPI may still write it */
        return ag;
    }
    e->agree_buf = abuf;
    if (e->plan.cfg.ranks_per_node == 0 && nranks > 1 && igrad__comm_can_split(comm)) {
        /* the statistics' intra/inter split: the ranks MPI puts on this
         * node (collective, after the agreement: every rank gets here) */
        igrad_comm_t *node = NULL;
        if (igrad__comm_split(comm, IGRAD__SPLIT_NODE, e->plan.rank, &node) == IGRAD_OK)
            e->plan.node_ranks = igrad_comm_size(node);
        igrad_comm_free(node);
    }
    if (e->plan.sp != IGRAD_SPARSIFIER_NONE && e->plan.cfg.start_iter > 0) {
        /* Collective, after the agreement: every rank gets here. Its own
         * agreement fails every rank if one rank cannot build it. */
        igrad_config_t dc = e->plan.cfg;
        dc.method = IGRAD_METHOD_DENSE;
        dc.momentum = 0.0;
        dc.start_iter = 0;
        dc.value_dtype = IGRAD_DTYPE_F32; /* as method dense requires */
        st = create_engine(layout, NULL, &dc, comm, e->mem.dp, e->mem.dp_stream, avg_ranks,
                           &e->warmup);
        if (st != IGRAD_OK) {
            igrad_engine_free(e);
            return st;
        }
    }
    *out = e;
    return IGRAD_OK;
}

igrad_status_t igrad__engine_create(const igrad_layout_t *layout, const igrad_profile_t *profile,
                                    const igrad_config_t *config, igrad_comm_t *comm,
                                    const igrad__dp_ops_t *dp, void *stream,
                                    igrad_engine_t **out)
{
    return create_engine(layout, profile, config, comm, dp, stream, 0, out);
}

igrad_status_t igrad__engine_create_shard(const igrad_layout_t *layout,
                                          const igrad_profile_t *profile,
                                          const igrad_config_t *config, igrad_comm_t *comm,
                                          int64_t avg_ranks, const igrad__dp_ops_t *dp,
                                          void *stream, igrad_engine_t **out)
{
    return create_engine(layout, profile, config, comm, dp, stream, avg_ranks, out);
}

/* ------------------------------------------------------------------------ */
/* One step: checks and selection                                           */
/* ------------------------------------------------------------------------ */

/* The first NULL gradient, as the step's local failure (IGRAD_E_INVALID
 * naming it; *bad_tensor its index), or IGRAD_OK. */
igrad_status_t igrad__engine_null_grads(igrad_engine_t *e, int64_t step, float *const *grads,
                                        int64_t *bad_tensor)
{
    *bad_tensor = -1;
    IGRAD_FAIL_IF(!grads, IGRAD_E_INVALID, "step %lld: grads is NULL", (long long)step);
    for (size_t t = 0; t < e->plan.ntensors; t++)
        if (!grads[t]) {
            *bad_tensor = (int64_t)t;
            return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                               "step %lld: grads[%zu] (%s) is NULL", (long long)step, t,
                               e->plan.t[t].name);
        }
    return IGRAD_OK;
}

/* After the check stage: the first tensor whose selection pass 1 failed
 * (e->step.tstatus, other than non-finite) or whose e->step.tnorm is not finite, as
 * the step's local failure (that status, or IGRAD_E_NONFINITE naming it
 * and the first bad index), or IGRAD_OK. */
igrad_status_t igrad__engine_nonfinite(igrad_engine_t *e, int64_t step, float *const *grads,
                                       int64_t *bad_tensor)
{
    *bad_tensor = -1;
    for (size_t t = 0; t < e->plan.ntensors; t++) {
        int64_t ts = e->step.tstatus[t]; /* of a selection pass 1 inside the check */
        if (ts != IGRAD_OK && ts != IGRAD_E_NONFINITE) {
            *bad_tensor = (int64_t)t;
            return igrad__fail((igrad_status_t)ts, __FILE__, __LINE__,
                               "step %lld: selection of %s failed (%s); the step is skipped on "
                               "every rank",
                               (long long)step, e->plan.t[t].name,
                               igrad_status_str((igrad_status_t)ts));
        }
        if (isfinite(e->step.tnorm[t])) continue;
        float g, u, rv;
        int64_t i = e->mem.dp->first_bad(IGRAD__PARTS(e), grads, t, &g, &u, &rv);
        *bad_tensor = (int64_t)t;
        if (e->mem.velocity_count > 0 && isfinite(g) && isfinite(u) && isfinite(rv))
            return igrad__fail(IGRAD_E_NONFINITE, __FILE__, __LINE__,
                               "step %lld: %s: momentum * velocity + grad + residual overflows "
                               "at index %lld (grad %g, velocity %g, residual %g); the step is "
                               "skipped on every rank",
                               (long long)step, e->plan.t[t].name, (long long)i, (double)g,
                               (double)u, (double)rv);
        if (isfinite(g) && isfinite(rv))
            return igrad__fail(IGRAD_E_NONFINITE, __FILE__, __LINE__,
                               "step %lld: %s: grad + residual overflows at index %lld (grad "
                               "%g, residual %g); the step is skipped on every rank",
                               (long long)step, e->plan.t[t].name, (long long)i, (double)g,
                               (double)rv);
        return igrad__fail(IGRAD_E_NONFINITE, __FILE__, __LINE__,
                           "step %lld: %s: non-finite value at index %lld (grad %g, residual "
                           "%g); the step is skipped on every rank",
                           (long long)step, e->plan.t[t].name, (long long)i, (double)g, (double)rv);
    }
    return IGRAD_OK;
}

/* Local argument and finiteness checks; records the message. */
static igrad_status_t local_checks(igrad_engine_t *e, int64_t step, float *const *grads,
                                   int64_t *bad_tensor)
{
    IGRAD_CHECK(igrad__engine_null_grads(e, step, grads, bad_tensor));
    e->mem.dp->check(IGRAD__PARTS(e), grads);
    return igrad__engine_nonfinite(e, step, grads, bad_tensor);
}

/* The gate of the step (a pure function of plan and step, so it can run
 * before the check: the data plane may start the sent tensors' selections
 * there) and where each sent tensor's selection goes in the staging
 * memory; the per-tensor results start at 0 / OK. */
void igrad__engine_gate_step(igrad_engine_t *e, int64_t step)
{
    int64_t off = 0;
    int par = igrad__step_parity(e, step);
    for (size_t t = 0; t < e->plan.ntensors; t++) {
        int ph = e->plan.t[t].phase;
        e->step.sent[t] = (unsigned char)igrad__schedule_sent(ph, e->plan.cfg.release_period, step);
        e->step.rel[t] = (unsigned char)(ph >= 0);
        e->step.stage_off[t] = off;
        e->step.tsumsq[t] = e->step.tdropped[t] = 0.0;
        e->step.tstatus[t] = IGRAD_OK;
        if (e->step.sent[t]) off += e->plan.t[t].spec[e->step.rel[t]][par].count;
    }
}

/* Error feedback + selection of sent tensors, accumulate (or drop) the
 * rest, on e->plan.nthreads threads. With `zero` set (sync: the gradients are
 * overwritten by the unpacking anyway) every gradient is also zeroed in
 * the pass that reads it, while it is in cache. */
static igrad_status_t select_all(igrad_engine_t *e, float *const *grads, int zero)
{
    e->mem.dp->select_into(IGRAD__PARTS(e), grads, zero);
    for (size_t t = 0; t < e->plan.ntensors; t++)
        if (e->step.tstatus[t] != IGRAD_OK)
            return igrad__fail((igrad_status_t)e->step.tstatus[t], __FILE__, __LINE__,
                               "step %lld: selection of %s failed (%s) after the ranks agreed; "
                               "this engine is out of step with the other ranks",
                               (long long)e->step.cur_step, e->plan.t[t].name,
                               igrad_status_str((igrad_status_t)e->step.tstatus[t]));
    return IGRAD_OK;
}

/* ------------------------------------------------------------------------ */
/* One step: blocks and buckets                                             */
/* ------------------------------------------------------------------------ */

/* Cuts the sent tensors into blocks (readiness order: last tensor first),
 * assigns them to buckets and lays the buckets out in the arenas; with
 * update_history the risk policy's history learns the step's blocks (a
 * streamed step does that at close, once the step is known to count). */
igrad_status_t igrad__engine_plan_step(igrad_engine_t *e, int update_history)
{
    int par = igrad__step_parity(e, e->step.cur_step);
    int dense = e->plan.sp == IGRAD_SPARSIFIER_NONE;
    size_t T = e->plan.ntensors, m = 0;
    int nsent = 0;
    for (size_t k = T; k-- > 0;) {
        if (!e->step.sent[k]) continue;
        const igrad__plan_tensor_t *tp = &e->plan.t[k];
        int rel = e->step.rel[k];
        const igrad_select_spec_t *sp = &tp->spec[rel][par];
        int64_t blk = tp->blk_entries[rel][par];
        int idxb = tp->idx_nbytes[rel][par];
        int64_t nb = igrad__pack_split((uint32_t)k, sp->count, blk, e->plan.value_nbytes + idxb,
                                       (int64_t)(T - 1 - k), e->step.blocks + m);
        for (int64_t b = 0; b < nb; b++) {
            igrad__step_block_t *bi = &e->step.binfo[m + (size_t)b];
            memset(bi, 0, sizeof *bi);
            bi->tensor = (uint32_t)k;
            bi->idx_nbytes = idxb;
            bi->row_wise = sp->row_wise;
            bi->first = b * blk;
            bi->count = e->step.blocks[m + (size_t)b].entries;
            if (dense) {
                bi->seg_begin = bi->first;
                bi->seg_count = bi->count;
            } else if (sp->row_wise) {
                bi->row0 = bi->first / sp->per_row;
                bi->seg_begin = bi->row0 * sp->cols;
                bi->seg_count = bi->count / sp->per_row * sp->cols;
            } else {
                bi->seg_begin = 0;
                bi->seg_count = tp->n;
            }
            if (e->plan.per_tensor_buckets) e->step.bucket_of[m + (size_t)b] = nsent;
        }
        m += (size_t)nb;
        nsent++;
    }
    e->step.nblk = m;

    int nplan;
    if (e->plan.per_tensor_buckets) {
        nplan = nsent;
        for (int j = 0; j < nplan; j++) e->step.loads[j] = 0;
        for (size_t i = 0; i < m; i++)
            e->step.loads[e->step.bucket_of[i]] += e->step.blocks[i].nbytes;
    } else {
        nplan = e->plan.cfg.buckets;
        igrad__pack_config_t pc = {.policy = e->plan.cfg.pack,
                                   .nbuckets = nplan,
                                   .history = e->plan.hist.count ? &e->plan.hist : NULL,
                                   .map = &e->plan.map};
        IGRAD_CHECK(igrad__pack_plan(&pc, e->step.blocks, m, e->step.pack_scratch,
                                     e->step.pack_scratch_nbytes, e->step.bucket_of,
                                     e->step.loads));
        if (e->plan.hist.count && update_history)
            IGRAD_CHECK(igrad__pack_history_update(&e->plan.hist, e->step.blocks, m));
    }
    e->step.nplanned = nplan;
    if (nplan > 0)
        IGRAD_CHECK(
            igrad__pack_bucket_order(e->step.bucket_of, m, nplan, e->step.start, e->step.order));

    size_t P = (size_t)e->plan.nranks;
    size_t send_off = 0, recv_off = 0;
    size_t nbk = 0;
    const igrad__route_link_t link = igrad__route_link_of(&e->plan.cfg, e->step.step_sar);
    for (int j = 0; j < nplan; j++) {
        size_t first = e->step.start[j], cnt = e->step.start[j + 1] - first;
        if (cnt == 0) continue;
        igrad__step_bucket_t *bk = &e->step.bk[nbk];
        memset(bk, 0, sizeof *bk);
        bk->index = j;
        bk->first = first;
        bk->nblocks = cnt;
        int64_t entries = 0, gbytes = 0, dcount = 0;
        const igrad__step_block_t *prev = NULL;
        for (size_t q = 0; q < cnt; q++) {
            igrad__step_block_t *bi = &e->step.binfo[e->step.order[first + q]];
            entries += bi->count;
            gbytes += bi->count * (e->plan.value_nbytes + bi->idx_nbytes);
            /* flat blocks of one tensor share its whole-tensor segment */
            int shares = !dense && !bi->row_wise && prev && prev->tensor == bi->tensor;
            bi->seg_owner = !shares;
            if (shares) {
                bi->dense_off = prev->dense_off;
            } else {
                bi->dense_off = (size_t)dcount;
                dcount += bi->seg_count;
            }
            prev = bi;
        }
        bk->entries = entries;
        bk->dense_count = (size_t)dcount;
        igrad__route_bucket_t rb = {(int64_t)P, gbytes, dcount, entries};
        bk->route = igrad__route_choose(e->plan.cfg.collective, dense, &rb, &link);
        bk->kind = bk->route->kind;
        bk->route->layout(&e->step, e->plan.nranks, e->plan.value_nbytes, bk, &send_off, &recv_off);
        nbk++;
    }
    if (send_off > e->mem.send_arena_nbytes || recv_off > e->mem.recv_arena_nbytes)
        return igrad__fail(IGRAD_E_STATE, __FILE__, __LINE__,
                           "step %lld needs %zu + %zu bucket bytes, the plan sized %zu + %zu "
                           "(internal error)",
                           (long long)e->step.cur_step, send_off, recv_off,
                           e->mem.send_arena_nbytes, e->mem.recv_arena_nbytes);
    e->step.nbk = nbk;
    if (e->plan.plan_only) return IGRAD_OK; /* no arenas to point into */
    for (size_t j = 0; j < nbk; j++) {
        igrad__step_bucket_t *bk = &e->step.bk[j];
        igrad_bucket_t *d = &e->step.desc[j];
        d->kind = bk->kind;
        d->index = bk->index;
        d->recv = e->mem.recv_arena + bk->recv_off;
        d->recv_nbytes = bk->recv_nbytes;
        bk->route->describe(e->mem.send_arena, bk, d);
    }
    return IGRAD_OK;
}

/* Bucket j into, and out of, its route's wire layout (the data plane). */
static void pack_bucket(igrad_engine_t *e, size_t j, float *const *grads)
{
    e->mem.dp->pack[e->step.bk[j].route->wire](IGRAD__PARTS(e), j, grads);
}

static igrad_status_t unpack_bucket(igrad_engine_t *e, size_t j, float *const *grads)
{
    /* 16-bit gradients: once the last bucket is in, every bucket, tensor
     * by tensor, into F32 and rounded once (buckets arrive in order) */
    if (e->plan.cfg.grad_dtype != IGRAD_DTYPE_F32)
        return j + 1 == e->step.nbk ? e->mem.dp->unpack16(IGRAD__PARTS(e), grads) : IGRAD_OK;
    return e->mem.dp->unpack[e->step.bk[j].route->wire](IGRAD__PARTS(e), j, grads);
}

/* Bytes in the data plane's memory (stats.dataplane_nbytes): every
 * dp->alloc of the engine and of its warm-up engine. */
static int64_t dataplane_nbytes(const igrad_engine_t *e)
{
    if (!e) return 0;
    int64_t n = (e->mem.residual_count + e->mem.velocity_count) * (int64_t)sizeof(float);
    n += (int64_t)(e->plan.max_entries * (sizeof *e->step.stage_idx + sizeof *e->step.stage_val));
    n += (int64_t)(e->mem.send_arena_nbytes + e->mem.recv_arena_nbytes);
    n += igrad__stream_nbytes(e);
    if (e->plan.cfg.grad_dtype != IGRAD_DTYPE_F32) { /* the per-thread F32 copy (dp.h) */
        int64_t most = 0;
        for (size_t t = 0; t < e->plan.ntensors; t++)
            if (e->plan.t[t].n > most) most = e->plan.t[t].n;
        n += (int64_t)e->plan.nthreads * most * (int64_t)sizeof(float);
    }
    return n + dataplane_nbytes(e->warmup);
}

/* The memory statistics, on every step (skipped ones too). */
void igrad__engine_stats_memory(const igrad_engine_t *e, igrad_step_stats_t *s)
{
    s->dataplane_nbytes = dataplane_nbytes(e);
    s->dataplane_nbytes_per_param =
        e->plan.nparams > 0 ? (double)s->dataplane_nbytes / (double)e->plan.nparams : 0.0;
}

igrad_status_t igrad__engine_agree_step(igrad_engine_t *e, int64_t step, igrad_status_t st,
                                        int64_t bad)
{
    char msg[1024] = "";
    if (st != IGRAD_OK) snprintf(msg, sizeof msg, "%s", igrad_last_error());
    int check =
        e->plan.cfg.verify_every > 0 && e->calls > 0 && e->calls % e->plan.cfg.verify_every == 0;
    igrad__engine_dynamic_items(e, step);
    char context[64];
    snprintf(context, sizeof context, "step %lld", (long long)step);
    igrad_status_t ag = igrad__engine_agree(e, e->comm, e->plan.nranks, e->agree_buf, st, bad, msg,
                                            e->items, check, context);
    e->calls++;
    if (e->world) ag = igrad__hier_agree_world(e, step, st, bad, ag);
    return ag;
}

/* The start of a step: its statistics cleared (the bucket_loads array
 * kept), its number and clock set; returns the clock (ms). */
double igrad__engine_step_reset(igrad_engine_t *e, int64_t step)
{
    const int64_t *loads = e->stats.bucket_loads;
    memset(&e->stats, 0, sizeof e->stats);
    e->stats.step = step;
    e->stats.bucket_loads = loads;
    e->step.cur_step = step;
    e->t_start = igrad__now_ms();
    return e->t_start;
}

/* Everything before packing: checks, agreement, gate, selection, plan.
 * zero: the selection also zeroes the gradients (sparse methods; sync
 * only, since begin must leave them as they are until end). */
static igrad_status_t step_prepare(igrad_engine_t *e, int64_t step, float *const *grads,
                                   int zero)
{
    double t0 = igrad__engine_step_reset(e, step);
    if (e->online) IGRAD_CHECK(igrad__online_before_step(e, step)); /* may re-plan */
    igrad__engine_stats_memory(e, &e->stats);
    igrad__engine_gate_step(e, step);

    int64_t bad = -1;
    igrad_status_t st = local_checks(e, step, grads, &bad);
    double t1 = igrad__now_ms();
    igrad_status_t ag = igrad__engine_agree_step(e, step, st, bad);
    double t2 = igrad__now_ms();
    e->stats.select_ms = t1 - t0;
    e->stats.comm_ms = t2 - t1;
    if (ag != IGRAD_OK) {
        e->stats.skipped = 1;
        e->stats.total_ms = t2 - t0;
        return ag;
    }

    /* From here on the other ranks go on to this step's collectives: a
     * failure leaves this engine out of step with them. */
    if (e->plan.sp != IGRAD_SPARSIFIER_NONE) {
        st = select_all(e, grads, zero);
        if (st != IGRAD_OK) return igrad__engine_break(e, st);
    }
    double t3 = igrad__now_ms();
    e->stats.select_ms += t3 - t2;
    st = igrad__engine_plan_step(e, 1);
    if (st != IGRAD_OK) return igrad__engine_break(e, st);
    e->stats.pack_ms = igrad__now_ms() - t3;
    return IGRAD_OK;
}

/* Statistics and the trace, once the step's result is in grads. */
igrad_status_t igrad__engine_finish_step(igrad_engine_t *e)
{
    igrad_step_stats_t *s = &e->stats;
    int par = igrad__step_parity(e, e->step.cur_step);
    double P = (double)e->plan.nranks;
    for (size_t t = 0; t < e->plan.ntensors; t++) {
        if (!e->step.sent[t]) continue;
        s->tensors_sent++;
        if (e->plan.sp != IGRAD_SPARSIFIER_NONE && e->plan.t[t].n < e->plan.cfg.dense_below)
            s->dense_small_tensors++;
        s->entries_sent += e->plan.t[t].spec[e->step.rel[t]][par].count;
    }
    for (size_t c = 0; c < e->plan.ncomp; c++) {
        int ph = e->plan.comp_phase[c];
        if (ph < 0) continue;
        if (igrad__schedule_sent(ph, e->plan.cfg.release_period, e->step.cur_step))
            s->released_components++;
        else s->deferred_components++;
    }
    for (size_t j = 0; j < e->step.nbk; j++) {
        const igrad__step_bucket_t *bk = &e->step.bk[j];
        (*(int *)(void *)((char *)s + bk->route->stats_count))++;
        s->payload_nbytes += bk->route->payload(bk);
        s->wire_nbytes += bk->route->wire_nbytes(bk, P);
    }
    /* levels: the share of this rank's peers on its own node */
    if (e->plan.nranks > 1) {
        s->intra_wire_nbytes = s->wire_nbytes * (double)(e->plan.node_ranks - 1) / (P - 1.0);
        s->inter_wire_nbytes = s->wire_nbytes - s->intra_wire_nbytes;
    }
    s->buckets = (int)e->step.nbk;
    s->bucket_count = e->step.nplanned;
    s->bucket_loads = e->step.loads;
    if (e->step.nplanned > 0) {
        igrad_pack_metrics_t pm;
        IGRAD_CHECK(igrad__pack_metrics(e->step.loads, e->step.nplanned, &pm));
        s->imbalance = pm.imbalance;
        s->cv = pm.cv;
        s->overflow = pm.overflow;
    } else {
        s->imbalance = 1.0;
    }
    double norm = 0.0, dropped = 0.0;
    if (e->plan.sp != IGRAD_SPARSIFIER_NONE)
        for (size_t t = 0; t < e->plan.ntensors; t++) {
            norm += e->step.tnorm[t];
            dropped += e->step.tdropped[t];
        }
    s->residual_norm = sqrt(norm);
    s->dropped_sumsq = dropped;
    e->last_step = e->step.cur_step;
    e->state = IGRAD__ENGINE_IDLE;
    s->total_ms = igrad__now_ms() - e->t_start;
    if (e->online) igrad__online_record(e);
    if (e->trace && e->plan.sp != IGRAD_SPARSIFIER_NONE)
        for (size_t t = 0; t < e->plan.ntensors; t++)
            if (e->step.sent[t])
                IGRAD_CHECK(igrad_trace_record(e->trace, e->step.cur_step, t, e->step.tsumsq[t],
                                               e->plan.t[t].spec[e->step.rel[t]][par].count));
    return IGRAD_OK;
}

igrad_status_t igrad__engine_plan_only_step(igrad_engine_t *e, int64_t step)
{
    igrad__engine_step_reset(e, step);
    igrad__engine_gate_step(e, step);
    e->step.step_sar = e->plan.auto_sar; /* a plan-only engine models igrad_engine_sync */
    igrad_status_t st = igrad__engine_plan_step(e, 1);
    e->step.step_sar = 0;
    IGRAD_CHECK(st);
    /* the step's statistics as a run has them: nothing was selected (norms
     * 0), no online window records (profile_steps is 0), no trace is set */
    IGRAD_CHECK(igrad__engine_finish_step(e));
    e->stats.total_ms = 0.0;
    return IGRAD_OK;
}

/* Dense warm-up (cfg.start_iter): a step below it runs on e->warmup, a
 * method dense engine over the same comm. This engine takes its statistics
 * and last step, and its failure if it broke; its own step count, residuals
 * and velocities are untouched. */
int igrad__engine_warmup_step(const igrad_engine_t *e, int64_t step)
{
    return e->warmup && step < e->plan.cfg.start_iter;
}

igrad_status_t igrad__engine_warmup_done(igrad_engine_t *e, igrad_status_t st)
{
    const igrad_engine_t *w = e->warmup;
    e->stats = w->stats;
    igrad__engine_stats_memory(e, &e->stats);
    e->last_step = w->last_step;
    if (w->broken != IGRAD_OK && e->broken == IGRAD_OK) {
        e->broken = w->broken;
        snprintf(e->broken_msg, sizeof e->broken_msg, "%s", w->broken_msg);
    }
    return st;
}

igrad_status_t igrad_engine_begin(igrad_engine_t *e, int64_t step, float *const *grads,
                                  const igrad_bucket_t **buckets, size_t *nbuckets)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_begin: engine is NULL");
    if (e->hier) return igrad__hier_refuse("igrad_engine_begin");
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_begin"));
    IGRAD_CHECK(igrad__route_check_caller(&e->plan.cfg, e->plan.sp == IGRAD_SPARSIFIER_NONE,
                                          "igrad_engine_begin"));
    IGRAD_FAIL_IF(e->state != IGRAD__ENGINE_IDLE, IGRAD_E_STATE,
                  "igrad_engine_begin: step %lld is still open (call igrad_engine_end first)",
                  (long long)e->step.cur_step);
    IGRAD_FAIL_IF(!buckets || !nbuckets, IGRAD_E_INVALID,
                  "igrad_engine_begin: buckets or nbuckets is NULL");
    *buckets = NULL;
    *nbuckets = 0;
    if (igrad__engine_warmup_step(e, step)) {
        IGRAD_CHECK(igrad__engine_warmup_done(
            e, igrad_engine_begin(e->warmup, step, grads, buckets, nbuckets)));
        e->state = IGRAD__ENGINE_BEGUN;
        e->warm_open = 1;
        e->step.cur_step = step;
        return IGRAD_OK;
    }
    IGRAD_CHECK(step_prepare(e, step, grads, 0));
    double t0 = igrad__now_ms();
    for (size_t j = 0; j < e->step.nbk; j++) pack_bucket(e, j, grads);
    e->stats.pack_ms += igrad__now_ms() - t0;
    e->state = IGRAD__ENGINE_BEGUN;
    *buckets = e->step.desc;
    *nbuckets = e->step.nbk;
    return IGRAD_OK;
}

igrad_status_t igrad_engine_end(igrad_engine_t *e, int64_t step, float *const *grads)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_end: engine is NULL");
    if (e->hier) return igrad__hier_refuse("igrad_engine_end");
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_end"));
    IGRAD_FAIL_IF(e->state != IGRAD__ENGINE_BEGUN, IGRAD_E_STATE,
                  "igrad_engine_end: no step is open (call igrad_engine_begin first)");
    IGRAD_FAIL_IF(step != e->step.cur_step, IGRAD_E_STATE,
                  "igrad_engine_end: step %lld, but step %lld is open", (long long)step,
                  (long long)e->step.cur_step);
    if (e->warm_open) {
        e->state = IGRAD__ENGINE_IDLE;
        e->warm_open = 0;
        return igrad__engine_warmup_done(e, igrad_engine_end(e->warmup, step, grads));
    }
    IGRAD_FAIL_IF(!grads, IGRAD_E_INVALID, "igrad_engine_end: grads is NULL");
    for (size_t t = 0; t < e->plan.ntensors; t++)
        IGRAD_FAIL_IF(!grads[t], IGRAD_E_INVALID, "igrad_engine_end: grads[%zu] (%s) is NULL", t,
                      e->plan.t[t].name);
    double t0 = igrad__now_ms();
    e->mem.dp->zero(IGRAD__PARTS(e), grads);
    for (size_t j = 0; j < e->step.nbk; j++) {
        igrad_status_t st = unpack_bucket(e, j, grads);
        if (st != IGRAD_OK) {
            e->state = IGRAD__ENGINE_IDLE;
            return igrad__engine_break(e, st);
        }
    }
    e->stats.unpack_ms = igrad__now_ms() - t0;
    return igrad__engine_finish_step(e);
}

/* A collective of bucket j failed or timed out: says which, at which step,
 * and returns the comm's status. */
static igrad_status_t bucket_failed(const igrad_engine_t *e, size_t j, igrad_status_t st)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", igrad_last_error());
    const igrad__step_bucket_t *bk = &e->step.bk[j];
    return igrad__fail(st, __FILE__, __LINE__,
                       "step %lld: bucket %d (%s of %lld bytes, %zu of %zu this step): %s",
                       (long long)e->step.cur_step, bk->index, bk->route->name,
                       (long long)bk->route->payload(bk), j + 1, e->step.nbk, msg);
}

/* The step's group start or end (`what`) failed: says so, and at which
 * step, and returns the comm's status. */
static igrad_status_t group_failed(const igrad_engine_t *e, const char *what,
                                   igrad_status_t st)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", igrad_last_error());
    return igrad__fail(st, __FILE__, __LINE__, "step %lld: %s of the step's %zu buckets: %s",
                       (long long)e->step.cur_step, what, e->step.nbk, msg);
}

/* Keeps the message of a step's first failure in buf: waiting out the
 * remaining requests records later ones. */
static igrad_status_t keep_first(igrad_status_t st, char *buf, size_t nbytes)
{
    if (st != IGRAD_OK && !buf[0]) snprintf(buf, nbytes, "%s", igrad_last_error());
    return st;
}

/* igrad_engine_sync after the argument checks, under the config's timeout.
 * Once a bucket has bad bytes nothing more is unpacked, but every bucket is
 * still issued and waited for, so this rank makes the same collectives as
 * the others (who see the same bytes and fail at the same bucket). */
static igrad_status_t sync_step(igrad_engine_t *e, int64_t step, float *const *grads)
{
    IGRAD_CHECK(step_prepare(e, step, grads, 1));

    igrad_status_t st = IGRAD_OK;  /* the collectives */
    igrad_status_t ust = IGRAD_OK; /* unpacking */
    char smsg[1024] = "", umsg[1024] = ""; /* their first failures (keep_first) */
    double pack_ms = 0.0, comm_ms = 0.0, unpack_ms = 0.0, a, b;
    size_t issued = 0, done = 0; /* the selection zeroed the gradients (sparse methods) */
    const igrad__route_io_t io = igrad__engine_route_io(e);
    /* The step's collectives are one group: a backend with group hooks
     * (a device one) launches them together at group end, and reports none
     * of them ready before; on the host backends the hooks are no-ops and
     * each bucket is unpacked as soon as it has arrived. */
    a = igrad__now_ms();
    st = igrad__comm_group_start(e->comm);
    int grouped = st == IGRAD_OK;
    comm_ms += igrad__now_ms() - a;
    if (st != IGRAD_OK) st = keep_first(group_failed(e, "group start", st), smsg, sizeof smsg);
    for (size_t j = 0; j < e->step.nbk && st == IGRAD_OK; j++) {
        a = igrad__now_ms();
        pack_bucket(e, j, grads);
        b = igrad__now_ms();
        pack_ms += b - a;
        /* the route issues on the data plane's queue (NULL: the comm's default); a
         * blocking one (the sparse all-reduce) returns a request already done */
        if (issued == 0) e->stats.comm_window_ms[0] = b;
        st = e->step.bk[j].route->issue(&io, &e->step, j, &e->step.bk[j].req);
        a = igrad__now_ms();
        comm_ms += a - b;
        if (st != IGRAD_OK) {
            st = keep_first(bucket_failed(e, j, st), smsg, sizeof smsg);
            break;
        }
        issued++;
        /* unpack, in order, the buckets that have already arrived */
        while (done + 1 < issued) {
            int ready = 0;
            st = igrad_comm_test(e->comm, e->step.bk[done].req, &ready);
            if (st != IGRAD_OK) {
                st = keep_first(bucket_failed(e, done, st), smsg, sizeof smsg);
                break;
            }
            if (!ready) break;
            st = igrad_comm_wait(e->comm, e->step.bk[done].req);
            e->step.bk[done].req = NULL;
            b = igrad__now_ms();
            comm_ms += b - a;
            e->stats.comm_window_ms[1] = b;
            if (st != IGRAD_OK) {
                st = keep_first(bucket_failed(e, done, st), smsg, sizeof smsg);
                break;
            }
            if (ust == IGRAD_OK) ust = keep_first(unpack_bucket(e, done, grads), umsg, sizeof umsg);
            done++;
            a = igrad__now_ms();
            unpack_ms += a - b;
        }
    }
    if (grouped) {
        a = igrad__now_ms();
        igrad_status_t gs = igrad__comm_group_end(e->comm);
        comm_ms += igrad__now_ms() - a;
        if (gs != IGRAD_OK && st == IGRAD_OK)
            st = keep_first(group_failed(e, "group end", gs), smsg, sizeof smsg);
    }
    /* After a failure the remaining requests are still waited for: on a
     * comm broken by a timeout that only releases them. */
    while (done < issued) {
        a = igrad__now_ms();
        igrad_status_t ws = igrad_comm_wait(e->comm, e->step.bk[done].req);
        e->step.bk[done].req = NULL;
        b = igrad__now_ms();
        comm_ms += b - a;
        e->stats.comm_window_ms[1] = b;
        if (ws != IGRAD_OK && st == IGRAD_OK)
            st = keep_first(bucket_failed(e, done, ws), smsg, sizeof smsg);
        if (st == IGRAD_OK && ust == IGRAD_OK) {
            ust = keep_first(unpack_bucket(e, done, grads), umsg, sizeof umsg);
            unpack_ms += igrad__now_ms() - b;
        }
        done++;
    }
    e->stats.pack_ms += pack_ms;
    e->stats.comm_ms += comm_ms;
    e->stats.unpack_ms = unpack_ms;
    if (st != IGRAD_OK || ust != IGRAD_OK) {
        e->state = IGRAD__ENGINE_IDLE;
        igrad__fail(st != IGRAD_OK ? st : ust, __FILE__, __LINE__, "%s",
                    st != IGRAD_OK ? smsg : umsg);
        return igrad__engine_break(e, st != IGRAD_OK ? st : ust);
    }
    return igrad__engine_finish_step(e);
}

igrad_status_t igrad_engine_sync(igrad_engine_t *e, int64_t step, float *const *grads)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_sync: engine is NULL");
    if (e->hier) return igrad__hier_sync(e, step, grads);
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_sync"));
    IGRAD_FAIL_IF(e->state != IGRAD__ENGINE_IDLE, IGRAD_E_STATE,
                  "igrad_engine_sync: step %lld is open (call igrad_engine_end first)",
                  (long long)e->step.cur_step);
    if (igrad__engine_warmup_step(e, step))
        return igrad__engine_warmup_done(e, igrad_engine_sync(e->warmup, step, grads));
    double saved = igrad_comm_timeout(e->comm);
    igrad_comm_set_timeout(e->comm, e->plan.cfg.timeout_s);
    e->step.step_sar = e->plan.auto_sar; /* only this entry point runs the sparse all-reduce */
    igrad_status_t st = sync_step(e, step, grads);
    e->step.step_sar = 0;
    igrad_comm_set_timeout(e->comm, saved);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Accessors                                                                */
/* ------------------------------------------------------------------------ */

igrad_status_t igrad_engine_last_stats(const igrad_engine_t *e, igrad_step_stats_t *out)
{
    IGRAD_FAIL_IF(!e || !out, IGRAD_E_INVALID, "igrad_engine_last_stats: NULL argument");
    *out = e->stats;
    return IGRAD_OK;
}

igrad_status_t igrad_engine_tensor_plan(const igrad_engine_t *e, size_t t,
                                        igrad_tensor_plan_t *out)
{
    IGRAD_FAIL_IF(!e || !out, IGRAD_E_INVALID, "igrad_engine_tensor_plan: NULL argument");
    IGRAD_FAIL_IF(t >= e->plan.ntensors, IGRAD_E_INVALID,
                  "igrad_engine_tensor_plan: tensor %zu out of range (%zu tensors)", t,
                  e->plan.ntensors);
    size_t sub = 0;
    if (e->hier) {
        const igrad_engine_t *owner = igrad__hier_owner(e, t, 0, &sub);
        return igrad_engine_tensor_plan(owner, sub, out);
    }
    const igrad__plan_tensor_t *tp = &e->plan.t[t];
    memset(out, 0, sizeof *out);
    out->every_step = tp->phase < 0;
    out->important = tp->important;
    out->component = tp->comp;
    out->phase = tp->phase;
    out->count = tp->spec[0][0].count;
    out->release_count = tp->phase >= 0 ? tp->spec[1][0].count : 0;
    out->row_wise = tp->spec[0][0].row_wise;
    out->index_nbytes = tp->idx_nbytes[0][0];
    out->step_nbytes = tensor_nbytes(e, tp, 0, 0);
    out->release_nbytes = tp->phase >= 0 ? tensor_nbytes(e, tp, 1, 0) : 0;
    return IGRAD_OK;
}

int64_t igrad_engine_predict_payload(const igrad_engine_t *e, int64_t step)
{
    if (!e) return -1;
    if (e->hier) { /* this rank's shard */
        size_t sub = 0;
        const igrad_engine_t *own = NULL;
        for (size_t t = 0; t < e->plan.ntensors && !own; t++)
            own = igrad__hier_owner(e, t, 1, &sub);
        return own ? igrad_engine_predict_payload(own, step) : -1;
    }
    if (igrad__engine_warmup_step(e, step)) return igrad_engine_predict_payload(e->warmup, step);
    int par = igrad__step_parity(e, step);
    int64_t total = 0;
    for (size_t t = 0; t < e->plan.ntensors; t++) {
        const igrad__plan_tensor_t *tp = &e->plan.t[t];
        if (!igrad__schedule_sent(tp->phase, e->plan.cfg.release_period, step)) continue;
        total += tensor_nbytes(e, tp, tp->phase >= 0, par);
    }
    return total;
}

const float *igrad_engine_residual(const igrad_engine_t *e, size_t t)
{
    if (!e || t >= e->plan.ntensors) return NULL;
    size_t sub = 0;
    if (e->hier) {
        const igrad_engine_t *owner = igrad__hier_owner(e, t, 1, &sub);
        return igrad_engine_residual(owner, sub);
    }
    return e->mem.residual ? e->mem.residual[t] : NULL;
}

const float *igrad_engine_velocity(const igrad_engine_t *e, size_t t)
{
    if (!e || t >= e->plan.ntensors) return NULL;
    size_t sub = 0;
    if (e->hier) {
        const igrad_engine_t *owner = igrad__hier_owner(e, t, 1, &sub);
        return igrad_engine_velocity(owner, sub);
    }
    return e->mem.velocity ? e->mem.velocity[t] : NULL;
}

igrad_status_t igrad_engine_set_trace(igrad_engine_t *e, igrad_trace_t *trace)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_set_trace: engine is NULL");
    if (e->hier) return igrad__hier_refuse("igrad_engine_set_trace");
    if (trace) {
        uint64_t th = igrad_trace_layout_hash(trace);
        IGRAD_FAIL_IF(igrad_trace_component_count(trace) != e->plan.ncomp ||
                          (th != 0 && th != e->items[IGRAD__ITEM_LAYOUT]),
                      IGRAD_E_MISMATCH,
                      "igrad_engine_set_trace: the trace was made for another layout (%zu "
                      "components, layout 0x%016llx; the engine has %zu, 0x%016llx)",
                      igrad_trace_component_count(trace), (unsigned long long)th, e->plan.ncomp,
                      (unsigned long long)e->items[IGRAD__ITEM_LAYOUT]);
        IGRAD_CHECK(igrad_trace_set_sparsifier(trace, e->plan.sp, e->plan.cfg.density));
    }
    e->trace = trace;
    return IGRAD_OK;
}

igrad_status_t igrad_engine_config(const igrad_engine_t *e, igrad_config_t *out)
{
    IGRAD_FAIL_IF(!e || !out, IGRAD_E_INVALID, "igrad_engine_config: NULL argument");
    *out = e->plan.cfg;
    return IGRAD_OK;
}

int64_t igrad_engine_step(const igrad_engine_t *e) { return e ? e->last_step : -1; }

size_t igrad_engine_workspace_nbytes(const igrad_engine_t *e)
{
    if (!e) return 0;
    if (e->hier) return igrad__hier_workspace_nbytes(e);
    size_t T = e->plan.ntensors, mb = e->plan.max_blocks, nb = (size_t)e->plan.nb_max;
    size_t n = sizeof *e +
               T * (sizeof *e->plan.t + sizeof *e->plan.tensor_hash + sizeof *e->step.stage_off +
                    2 + sizeof *e->step.work + sizeof *e->step.tstatus + 3 * sizeof(double));
    n += (size_t)(e->mem.residual_count + e->mem.velocity_count) * sizeof(float);
    n += igrad_engine_workspace_nbytes(e->warmup);
    n += e->plan.max_entries * (sizeof(uint32_t) + sizeof(float));
    n += mb * (sizeof *e->step.blocks + sizeof *e->step.binfo + sizeof *e->step.bucket_of +
               sizeof *e->step.order);
    n += nb * (sizeof *e->step.start + sizeof *e->step.loads + sizeof *e->step.bk +
               sizeof *e->step.desc);
    n += e->step.pack_scratch_nbytes + e->mem.send_arena_nbytes + e->mem.recv_arena_nbytes;
    n += e->plan.map.count * (sizeof(uint64_t) + sizeof(int));
    n += e->plan.hist.count * (sizeof(uint64_t) + sizeof(int64_t) + 2 * sizeof(double));
    for (int i = 0; i < e->plan.nthreads; i++) n += igrad_select_ws_nbytes(e->mem.ws[i]);
    if (e->step.sar) /* the sparse all-reduce's workspaces, as large as they have grown */
        for (int j = 0; j < e->plan.nb_max; j++) {
            n += sizeof e->step.sar[j];
            for (size_t b = 0; b < sizeof e->step.sar[j].cap / sizeof e->step.sar[j].cap[0]; b++)
                n += e->step.sar[j].cap[b];
        }
    return n;
}
