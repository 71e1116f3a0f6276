/*
 * engine_agree.c — the agreement items (the values every rank must have in
 * common: version, layout, profile, config fields, plan, and the dynamic
 * step/calls/history) and their exchange across ranks: one allgather of
 * (status, detail, items) per step, the first failing rank's status or
 * the first differing item reported by name, a second exchange naming
 * the tensor or component when layouts or profiles differ. Control plane
 * only: hashes and counts, no gradient memory.
 *
 * Not here: what the items are computed from (engine.c builds the plan),
 * comparing them with a state file (engine_state.c).
 */
#define _POSIX_C_SOURCE 200809L

#include "engine/engine_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Agreement items                                                          */
/* ------------------------------------------------------------------------ */

const igrad__item_desc_t igrad__items[IGRAD__NITEMS] = {
    [IGRAD__ITEM_VERSION] = {"igrad version", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_TENSORS] = {"layout tensor count", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_LAYOUT] = {"layout", IGRAD__ITEM_HASH, 1},
    [IGRAD__ITEM_COMPONENTS] = {"layout component count", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_PROFILE] = {"profile", IGRAD__ITEM_HASH, 1},
    [IGRAD__ITEM_CFG_METHOD] = {"config.method", IGRAD__ITEM_METHOD, 1},
    [IGRAD__ITEM_CFG_SPARSIFIER] = {"config.sparsifier", IGRAD__ITEM_SPARSIFIER, 1},
    [IGRAD__ITEM_CFG_INTERLEAVE] = {"config.interleave", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_DENSITY] = {"config.density", IGRAD__ITEM_F64, 1},
    [IGRAD__ITEM_CFG_RELEASE_PERIOD] = {"config.release_period", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_RELEASE_KEEP] = {"config.release_keep", IGRAD__ITEM_F64, 1},
    [IGRAD__ITEM_CFG_SCHEDULE] = {"config.schedule", IGRAD__ITEM_SCHEDULE, 1},
    [IGRAD__ITEM_CFG_RESIDUAL] = {"config.residual", IGRAD__ITEM_RESIDUAL, 1},
    [IGRAD__ITEM_CFG_PACK] = {"config.pack", IGRAD__ITEM_PACK, 1},
    [IGRAD__ITEM_CFG_BUCKETS] = {"config.buckets", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_BLOCK_ENTRIES] = {"config.block_entries", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_VERIFY_EVERY] = {"config.verify_every", IGRAD__ITEM_I64, 0},
    [IGRAD__ITEM_CFG_VALUE_DTYPE] = {"config.value_dtype", IGRAD__ITEM_DTYPE, 1},
    [IGRAD__ITEM_CFG_INDEX_DTYPE] = {"config.index_dtype", IGRAD__ITEM_DTYPE, 1},
    [IGRAD__ITEM_CFG_COLLECTIVE] = {"config.collective", IGRAD__ITEM_COLLECTIVE, 1},
    [IGRAD__ITEM_CFG_TIMEOUT] = {"config.timeout_s", IGRAD__ITEM_F64, 0},
    [IGRAD__ITEM_CFG_PROFILE_STEPS] = {"config.profile_steps", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_PROFILE_ALPHA] = {"config.profile_alpha", IGRAD__ITEM_F64, 1},
    [IGRAD__ITEM_CFG_PROFILE_PARTITION] = {"config.profile_partition", IGRAD__ITEM_HASH, 1},
    [IGRAD__ITEM_PLAN] = {"plan", IGRAD__ITEM_HASH, 1},
    [IGRAD__ITEM_STEP] = {"step", IGRAD__ITEM_I64, 0},
    [IGRAD__ITEM_CALLS] = {"engine step count", IGRAD__ITEM_I64, 0},
    [IGRAD__ITEM_HISTORY] = {"risk size history", IGRAD__ITEM_HASH, 0},
    [IGRAD__ITEM_ONLINE] = {"online profiling steps recorded", IGRAD__ITEM_I64, 0},
    [IGRAD__ITEM_CFG_MOMENTUM] = {"config.momentum", IGRAD__ITEM_F64, 1},
    [IGRAD__ITEM_CFG_START_ITER] = {"config.start_iter", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_TARGET_RATIO] = {"config.target_ratio", IGRAD__ITEM_F64, 1},
    [IGRAD__ITEM_CFG_REPROFILE_EVERY] = {"config.reprofile_every", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_REPROFILE_MARGIN] = {"config.reprofile_margin", IGRAD__ITEM_F64, 1},
    [IGRAD__ITEM_CFG_TOPOLOGY] = {"config.topology", IGRAD__ITEM_TOPOLOGY, 1},
    [IGRAD__ITEM_CFG_RANKS_PER_NODE] = {"config.ranks_per_node", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_DENSE_BELOW] = {"config.dense_below", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_LINK_LATENCY] = {"config.link_latency_ns", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_LINK_BANDWIDTH] = {"config.link_bandwidth_mbps", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_AUTO_SPARSE_REDUCE] = {"config.auto_sparse_reduce", IGRAD__ITEM_I64, 1},
    [IGRAD__ITEM_CFG_INDEX_CODE] = {"config.index_code", IGRAD__ITEM_INDEX_CODE, 1},
    [IGRAD__ITEM_CFG_ALLOCATION] = {"config.allocation", IGRAD__ITEM_I64, 1},
};

static uint64_t f64_bits(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

void igrad__item_format(int i, uint64_t value, char *buf, size_t nbytes)
{
    int64_t s = (int64_t)value;
    int type = igrad__items[i].type;
    /* An enum item outside int (a corrupt state file) would be cut by the
     * cast below and could print as a valid name on both sides. */
    if (type != IGRAD__ITEM_I64 && type != IGRAD__ITEM_F64 && type != IGRAD__ITEM_HASH &&
        (s < 0 || s > 0x7fffffff)) {
        snprintf(buf, nbytes, "%lld (not a valid value)", (long long)s);
        return;
    }
    switch (type) {
    case IGRAD__ITEM_I64: snprintf(buf, nbytes, "%lld", (long long)s); return;
    case IGRAD__ITEM_F64: {
        double d;
        memcpy(&d, &value, sizeof d);
        /* the short form when it reads back exactly, else all digits */
        snprintf(buf, nbytes, "%g", d);
        if (strtod(buf, NULL) != d) snprintf(buf, nbytes, "%.17g", d);
        return;
    }
    case IGRAD__ITEM_HASH:
        snprintf(buf, nbytes, "0x%016llx", (unsigned long long)value);
        return;
    case IGRAD__ITEM_METHOD: snprintf(buf, nbytes, "%s", igrad_method_name((igrad_method_t)s)); return;
    case IGRAD__ITEM_SPARSIFIER:
        snprintf(buf, nbytes, "%s", igrad_sparsifier_name((igrad_sparsifier_t)s));
        return;
    case IGRAD__ITEM_SCHEDULE:
        snprintf(buf, nbytes, "%s", igrad_schedule_name((igrad_schedule_t)s));
        return;
    case IGRAD__ITEM_RESIDUAL:
        snprintf(buf, nbytes, "%s", igrad_residual_policy_name((igrad_residual_policy_t)s));
        return;
    case IGRAD__ITEM_PACK:
        snprintf(buf, nbytes, "%s", igrad_pack_policy_name((igrad_pack_policy_t)s));
        return;
    case IGRAD__ITEM_DTYPE: { /* value_dtype's item: grad_dtype in bits 8.. */
        const char *nm = igrad_dtype_name((igrad_dtype_t)(s & 0xff));
        const char *gm = igrad_dtype_name((igrad_dtype_t)(s >> 8));
        if (s >> 8) snprintf(buf, nbytes, "%s (grad_dtype %s)", nm ? nm : "?", gm ? gm : "?");
        else snprintf(buf, nbytes, "%s", nm ? nm : "?");
        return;
    }
    case IGRAD__ITEM_COLLECTIVE:
        snprintf(buf, nbytes, "%s", igrad_collective_name((igrad_collective_t)s));
        return;
    case IGRAD__ITEM_TOPOLOGY:
        snprintf(buf, nbytes, "%s", igrad_topology_name((igrad_topology_t)s));
        return;
    case IGRAD__ITEM_INDEX_CODE:
        snprintf(buf, nbytes, "%s", igrad_index_code_name((igrad_index_code_t)s));
        return;
    }
    snprintf(buf, nbytes, "%llu", (unsigned long long)value);
}

void igrad__engine_static_items(igrad_engine_t *e, uint64_t layout_hash, uint64_t profile_hash,
                                uint64_t plan_hash)
{
    const igrad_config_t *c = &e->plan.cfg;
    uint64_t *v = e->items;
    v[IGRAD__ITEM_VERSION] = (uint64_t)IGRAD_VERSION_NUMBER;
    v[IGRAD__ITEM_TENSORS] = (uint64_t)e->plan.ntensors;
    v[IGRAD__ITEM_LAYOUT] = layout_hash;
    v[IGRAD__ITEM_COMPONENTS] = (uint64_t)e->plan.ncomp;
    v[IGRAD__ITEM_PROFILE] = profile_hash;
    v[IGRAD__ITEM_CFG_METHOD] = (uint64_t)(int64_t)c->method;
    v[IGRAD__ITEM_CFG_SPARSIFIER] = (uint64_t)(int64_t)c->sparsifier;
    v[IGRAD__ITEM_CFG_INTERLEAVE] = (uint64_t)(int64_t)c->interleave;
    v[IGRAD__ITEM_CFG_DENSITY] = f64_bits(c->density);
    v[IGRAD__ITEM_CFG_RELEASE_PERIOD] = (uint64_t)(int64_t)c->release_period;
    v[IGRAD__ITEM_CFG_RELEASE_KEEP] = f64_bits(c->release_keep);
    v[IGRAD__ITEM_CFG_SCHEDULE] = (uint64_t)(int64_t)c->schedule;
    v[IGRAD__ITEM_CFG_RESIDUAL] = (uint64_t)(int64_t)c->residual;
    v[IGRAD__ITEM_CFG_PACK] = (uint64_t)(int64_t)c->pack;
    v[IGRAD__ITEM_CFG_BUCKETS] = (uint64_t)(int64_t)c->buckets;
    v[IGRAD__ITEM_CFG_BLOCK_ENTRIES] = (uint64_t)c->block_entries;
    v[IGRAD__ITEM_CFG_VERIFY_EVERY] = (uint64_t)c->verify_every;
    /* grad_dtype folded in (F32 is 0: the item, and state files, unchanged) */
    v[IGRAD__ITEM_CFG_VALUE_DTYPE] =
        (uint64_t)(int64_t)c->value_dtype | (uint64_t)(int64_t)c->grad_dtype << 8;
    v[IGRAD__ITEM_CFG_INDEX_DTYPE] = (uint64_t)(int64_t)c->index_dtype;
    v[IGRAD__ITEM_CFG_COLLECTIVE] = (uint64_t)(int64_t)c->collective;
    v[IGRAD__ITEM_CFG_TIMEOUT] = f64_bits(c->timeout_s);
    v[IGRAD__ITEM_PLAN] = plan_hash;
    /* online profiling */
    v[IGRAD__ITEM_CFG_PROFILE_STEPS] = (uint64_t)c->profile_steps;
    v[IGRAD__ITEM_CFG_PROFILE_ALPHA] = f64_bits(c->profile_alpha);
    v[IGRAD__ITEM_CFG_PROFILE_PARTITION] =
        igrad__hash_str(IGRAD__HASH_SEED, c->profile_partition ? c->profile_partition : "knee");
    v[IGRAD__ITEM_CFG_MOMENTUM] = f64_bits(c->momentum);
    v[IGRAD__ITEM_CFG_START_ITER] = (uint64_t)c->start_iter;
    v[IGRAD__ITEM_CFG_TARGET_RATIO] = f64_bits(c->target_ratio);
    v[IGRAD__ITEM_CFG_REPROFILE_EVERY] = (uint64_t)c->reprofile_every;
    v[IGRAD__ITEM_CFG_REPROFILE_MARGIN] = f64_bits(c->reprofile_margin);
    v[IGRAD__ITEM_CFG_TOPOLOGY] = (uint64_t)(int64_t)c->topology;
    v[IGRAD__ITEM_CFG_RANKS_PER_NODE] = (uint64_t)(int64_t)c->ranks_per_node;
    v[IGRAD__ITEM_CFG_DENSE_BELOW] = (uint64_t)c->dense_below;
    v[IGRAD__ITEM_CFG_LINK_LATENCY] = (uint64_t)c->link_latency_ns;
    v[IGRAD__ITEM_CFG_LINK_BANDWIDTH] = (uint64_t)c->link_bandwidth_mbps;
    v[IGRAD__ITEM_CFG_AUTO_SPARSE_REDUCE] = (uint64_t)(int64_t)c->auto_sparse_reduce;
    v[IGRAD__ITEM_CFG_INDEX_CODE] = (uint64_t)(int64_t)c->index_code;
    v[IGRAD__ITEM_CFG_ALLOCATION] = (uint64_t)(int64_t)c->allocation;
}

void igrad__engine_dynamic_items(igrad_engine_t *e, int64_t step)
{
    e->items[IGRAD__ITEM_STEP] = (uint64_t)step;
    e->items[IGRAD__ITEM_CALLS] = (uint64_t)e->calls;
    e->items[IGRAD__ITEM_HISTORY] = igrad__pack_history_hash(IGRAD__HASH_SEED, &e->plan.hist);
    e->items[IGRAD__ITEM_ONLINE] = (uint64_t)igrad__online_item(e);
}

/* ------------------------------------------------------------------------ */
/* Agreement across ranks                                                   */
/* ------------------------------------------------------------------------ */

igrad_status_t igrad__engine_usable(const igrad_engine_t *e, const char *what)
{
    IGRAD_FAIL_IF(e->broken != IGRAD_OK, IGRAD_E_STATE,
                  "%s: the engine is unusable since a failure after the ranks agreed (%s): %s",
                  what, igrad_status_str(e->broken), e->broken_msg);
    return IGRAD_OK;
}

igrad_status_t igrad__engine_break(igrad_engine_t *e, igrad_status_t status)
{
    if (e->broken == IGRAD_OK) {
        e->broken = status;
        snprintf(e->broken_msg, sizeof e->broken_msg, "%s", igrad_last_error());
    }
    return status;
}

/* A failed exchange (the comm's error, or a timeout): says where it
 * happened and returns the comm's status. */
static igrad_status_t exchange_failed(igrad_status_t st, const char *context)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", igrad_last_error());
    return igrad__fail(st, __FILE__, __LINE__, "%s: agreement: %s", context, msg);
}

/* Allocates a detail exchange's receive buffer and agrees on whether every
 * rank could (one word per rank in `buf`), so that an allocation failure
 * on one rank never leaves the others waiting in the detail allgather.
 * *out is NULL and *short_rank the first rank without memory when one
 * failed. */
static igrad_status_t detail_alloc(igrad_comm_t *comm, int nranks, uint64_t *buf,
                                   size_t nbytes, void **out, int *short_rank)
{
    void *p = malloc(nbytes + 1);
    uint64_t ok = p != NULL;
    *out = NULL;
    *short_rank = -1;
    igrad_status_t st = igrad_comm_allgather(comm, &ok, sizeof ok, buf);
    if (st != IGRAD_OK) {
        free(p);
        return st;
    }
    for (int r = 0; r < nranks && *short_rank < 0; r++)
        if (!buf[r]) *short_rank = r;
    if (*short_rank >= 0) {
        free(p);
        return IGRAD_OK;
    }
    *out = p;
    return IGRAD_OK;
}

/* Second exchange after a layout mismatch: per-tensor hashes. Returns
 * IGRAD_E_MISMATCH, or the comm's status if an exchange failed. */
static igrad_status_t layout_detail(igrad_engine_t *e, igrad_comm_t *comm, int nranks,
                                    uint64_t *buf, const char *context)
{
    size_t T = e->plan.ntensors;
    uint64_t *all = NULL;
    int short_rank = -1;
    IGRAD_CHECK(detail_alloc(comm, nranks, buf, (size_t)nranks * T * sizeof *all,
                             (void **)&all, &short_rank));
    if (short_rank >= 0)
        return igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                           "%s: layout differs between ranks (rank %d ran out of memory "
                           "naming the tensor)",
                           context, short_rank);
    igrad_status_t st = igrad_comm_allgather(comm, e->plan.tensor_hash, T * sizeof *all, all);
    if (st != IGRAD_OK) {
        if (st != IGRAD_E_TIMEOUT) free(all); /* else MPI may still write it */
        return st;
    }
    for (size_t t = 0; t < T; t++)
        for (int r = 1; r < nranks; r++)
            if (all[(size_t)r * T + t] != all[t]) {
                free(all);
                return igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                                   "%s: layout differs at tensor %s (index %zu): rank 0 and "
                                   "rank %d have a different name, dtype or shape there",
                                   context, e->plan.t[t].name, t, r);
            }
    /* Same tensors: then the name rules differ (a layout with a name map
     * hashes its (layer, kind) assignment). Name the first tensor. */
    uint64_t *mine = malloc(T * sizeof *mine);
    if (!mine) {
        free(all);
        return igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                           "%s: layout differs between ranks (same tensors; other name "
                           "rules?)",
                           context);
    }
    for (size_t t = 0; t < T; t++) {
        int c = e->plan.t[t].comp;
        int layer = c < 0 ? -1 : e->plan.comp_layer[c];
        int kind = c < 0 ? (int)IGRAD_KIND_OTHER : (int)e->plan.comp_kind[c];
        mine[t] = ((uint64_t)(uint32_t)(layer + 1) << 8) | (uint64_t)kind;
    }
    st = igrad_comm_allgather(comm, mine, T * sizeof *mine, all);
    free(mine);
    if (st != IGRAD_OK) {
        if (st != IGRAD_E_TIMEOUT) free(all);
        return st;
    }
    for (size_t t = 0; t < T; t++)
        for (int r = 1; r < nranks; r++)
            if (all[(size_t)r * T + t] != all[t]) {
                uint64_t a = all[t], b = all[(size_t)r * T + t];
                free(all);
                return igrad__fail(
                    IGRAD_E_MISMATCH, __FILE__, __LINE__,
                    "%s: layout differs at tensor %s (index %zu): rank 0 maps it to (layer "
                    "%d, %s), rank %d to (layer %d, %s): the ranks' name rules (--map, "
                    "name_map=) differ",
                    context, e->plan.t[t].name, t, (int)(a >> 8) - 1,
                    igrad_kind_name((igrad_kind_t)(a & 0xff)), r, (int)(b >> 8) - 1,
                    igrad_kind_name((igrad_kind_t)(b & 0xff)));
            }
    free(all);
    return igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                       "%s: layout differs between ranks (same tensors and components; one "
                       "rank has name rules that map them as the built-in ones do)",
                       context);
}

/* Second exchange after a profile mismatch: the important flags. Returns
 * as layout_detail. */
static igrad_status_t profile_detail(igrad_engine_t *e, igrad_comm_t *comm, int nranks,
                                     uint64_t *buf, const char *context)
{
    size_t C = e->plan.ncomp;
    unsigned char *all = NULL;
    int short_rank = -1;
    IGRAD_CHECK(detail_alloc(comm, nranks, buf, (size_t)nranks * C, (void **)&all,
                             &short_rank));
    if (short_rank >= 0)
        return igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                           "%s: profile differs between ranks (rank %d ran out of memory "
                           "naming the component)",
                           context, short_rank);
    igrad_status_t st = igrad_comm_allgather(comm, e->plan.comp_important, C, all);
    if (st != IGRAD_OK) {
        if (st != IGRAD_E_TIMEOUT) free(all); /* else MPI may still write it */
        return st;
    }
    for (size_t c = 0; c < C; c++)
        for (int r = 1; r < nranks; r++)
            if (all[(size_t)r * C + c] != all[c]) {
                int imp0 = all[c];
                free(all);
                return igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                                   "%s: profile differs at component (%d, %s): rank 0 has it "
                                   "%s, rank %d %s",
                                   context, e->plan.comp_layer[c],
                                   igrad_kind_name(e->plan.comp_kind[c]),
                                   imp0 ? "important" : "low-importance", r,
                                   imp0 ? "low-importance" : "important");
            }
    free(all);
    return igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                       "%s: profile differs between ranks (one rank has none?)", context);
}

/* igrad__engine_agree without the timeout and the broken mark. *comm_failed
 * is set when an exchange itself failed. */
static igrad_status_t agree(igrad_engine_t *e, igrad_comm_t *comm, int nranks, uint64_t *buf,
                            igrad_status_t status, int64_t detail, const char *local_msg,
                            const uint64_t *items, int check_items, const char *context,
                            int *comm_failed)
{
    uint64_t mine[IGRAD__AGREE_WORDS];
    memset(mine, 0, sizeof mine);
    mine[0] = (uint64_t)status;
    mine[1] = (uint64_t)detail;
    mine[2] = (uint64_t)(check_items != 0);
    if (items) memcpy(mine + 3, items, IGRAD__NITEMS * sizeof *items);
    igrad_status_t st = igrad_comm_allgather(comm, mine, sizeof mine, buf);
    if (st != IGRAD_OK) {
        *comm_failed = 1;
        return exchange_failed(st, context);
    }

    int failed = -1, check = 0;
    char what[256];
    snprintf(what, sizeof what, "%s: agreement", context);
    for (int r = 0; r < nranks; r++) {
        const uint64_t *w = buf + (size_t)r * IGRAD__AGREE_WORDS;
        /* bad bytes, not a failure of rank r: named, and the engine broken */
        st = w[2] > 1 ? igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                                    "%s: rank %d's block is corrupt (its check word is "
                                    "0x%016llx, not 0 or 1): bad bytes from the transport, or "
                                    "ranks out of step; the engine is unusable",
                                    what, r, (unsigned long long)w[2])
                      : igrad__engine_peer_word(what, r, w[0]);
        if (st != IGRAD_OK) {
            *comm_failed = 1;
            return st;
        }
        if (w[0] != 0 && failed < 0) failed = r;
        check |= w[2] != 0;
    }
    if (failed >= 0) {
        if (status != IGRAD_OK)
            return igrad__fail(status, __FILE__, __LINE__, "%s", local_msg ? local_msg : "");
        const uint64_t *w = buf + (size_t)failed * IGRAD__AGREE_WORDS;
        igrad_status_t fs = (igrad_status_t)w[0];
        int64_t det = (int64_t)w[1];
        if (e && e->plan.t && det >= 0 && (size_t)det < e->plan.ntensors)
            return igrad__fail(fs, __FILE__, __LINE__,
                               "%s failed on rank %d (%s) at tensor %s; every rank fails it",
                               context, failed, igrad_status_str(fs), e->plan.t[det].name);
        return igrad__fail(fs, __FILE__, __LINE__, "%s failed on rank %d (%s); every rank fails it",
                           context, failed, igrad_status_str(fs));
    }

    /* Every rank sees the same words, so every rank takes the same branch
     * below (and makes the same detail exchanges). */
    for (int i = check ? 0 : IGRAD__ITEM_FIRST_DYNAMIC; i < IGRAD__NITEMS; i++) {
        uint64_t v0 = buf[3 + i];
        for (int r = 1; r < nranks; r++) {
            uint64_t vr = buf[(size_t)r * IGRAD__AGREE_WORDS + 3 + (size_t)i];
            if (vr == v0) continue;
            if (i == IGRAD__ITEM_LAYOUT || i == IGRAD__ITEM_PROFILE) {
                st = i == IGRAD__ITEM_LAYOUT ? layout_detail(e, comm, nranks, buf, context)
                                             : profile_detail(e, comm, nranks, buf, context);
                if (st == IGRAD_E_MISMATCH) return st;
                *comm_failed = 1;
                return exchange_failed(st, context);
            }
            char a[64], b[64];
            igrad__item_format(i, v0, a, sizeof a);
            igrad__item_format(i, vr, b, sizeof b);
            return igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                               "%s: %s differs: rank 0 has %s, rank %d has %s", context,
                               igrad__items[i].name, a, r, b);
        }
    }
    return IGRAD_OK;
}

igrad_status_t igrad__engine_agree(igrad_engine_t *e, igrad_comm_t *comm, int nranks,
                                   uint64_t *buf, igrad_status_t status, int64_t detail,
                                   const char *local_msg, const uint64_t *items,
                                   int check_items, const char *context)
{
    double saved = igrad_comm_timeout(comm);
    if (e) igrad_comm_set_timeout(comm, e->plan.cfg.timeout_s);
    int comm_failed = 0;
    igrad_status_t st = agree(e, comm, nranks, buf, status, detail, local_msg, items,
                              check_items, context, &comm_failed);
    igrad_comm_set_timeout(comm, saved);
    if (comm_failed && e) igrad__engine_break(e, st);
    return st;
}
