/*
 * engine.c — the sync engine (DESIGN.md §2): create (the plan of
 * plan/plan_build.c, the step's scratch, the data-plane memory) and free,
 * and the order of one step: check, agree, gate, select, plan the blocks and
 * buckets, pack, the collectives (two-phase or pipelined), unpack, with
 * statistics. This is the control plane: every touch of gradient,
 * residual, velocity or bucket memory goes through the data-plane table
 * e->mem.dp (dp.h; the CPU backend is dp_cpu*.c), and every choice of
 * collective through the bucket routes (route.h).
 *
 * Not here: names (core/names.c), config validation (plan/config.c), the
 * plan and the per-step plan (plan/plan_build.c, plan_step.c), the step's
 * failure messages (engine_fail.c), accessors and statistics
 * (engine_stats.c); the agreement items and their exchange (engine_agree.c);
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
 *  - The dense warm-up (cfg.start_iter) is a plan, not an engine: steps
 *    below start_iter run with method dense's plan (e->warm) over this
 *    engine's step, memory, agreement and statistics, whose arenas are
 *    sized for both plans until the first step after it, which frees the
 *    warm-up's room (igrad__engine_room).
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
/* Building the plan                                                        */
/* ------------------------------------------------------------------------ */

/* The data-plane memory's residual and velocity lists for the warm-up's
 * plan (`on`: none, as a method dense engine has) or the method's. */
static void warm_switch(igrad_engine_t *e, int on)
{
    if (on == e->warm_on) return;
    float **r = e->mem.residual, **v = e->mem.velocity;
    e->mem.residual = e->warm_keep[0];
    e->mem.velocity = e->warm_keep[1];
    e->warm_keep[0] = r;
    e->warm_keep[1] = v;
    e->warm_on = on;
}

/* The arenas' sizes for the method's plan, or with `warm` for both it
 * and the warm-up's (the larger of each). */
static void arenas_for(const igrad_engine_t *e, int warm, size_t *send, size_t *recv)
{
    const size_t(*a)[2] = e->arena_nbytes;
    *send = warm && a[1][0] > a[0][0] ? a[1][0] : a[0][0];
    *recv = warm && a[1][1] > a[0][1] ? a[1][1] : a[0][1];
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
#ifdef _OPENMP
    e->plan.nthreads = c->threads > 0 ? c->threads : omp_get_max_threads();
#else
    e->plan.nthreads = 1;
#endif
    if (e->plan.nthreads < 1) e->plan.nthreads = 1;
    IGRAD_CHECK(igrad__plan_build(&e->plan, layout, profile, e->shard));
    if (!dense && c->start_iter > 0 && !e->plan.plan_only) { /* the dense warm-up's plan */
        e->warm = calloc(1, sizeof *e->warm);
        IGRAD_FAIL_IF(!e->warm, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
        IGRAD_CHECK(igrad__plan_warm(e->warm, &e->plan, layout, e->shard));
        IGRAD_CHECK(igrad__route_check_engine(&e->warm->cfg, 1, &rdp, e->comm));
        e->warm_room = 1;
    }
    for (int w = 0; w < 1 + (e->warm != NULL); w++) { /* the arenas each plan needs */
        const igrad__plan_t *p = w ? e->warm : &e->plan;
        size_t slack = (size_t)p->nb_max * 8; /* each bucket's offset is 8-aligned */
        igrad__route_arenas(p->cfg.collective, p->sp == IGRAD_SPARSIFIER_NONE, p->auto_sar,
                            p->max_gather_nbytes, (int64_t)p->max_entries, p->max_dense_count,
                            (size_t)e->plan.nranks, slack, &e->arena_nbytes[w][0],
                            &e->arena_nbytes[w][1]);
    }
    arenas_for(e, e->warm_room, &e->mem.send_arena_nbytes, &e->mem.recv_arena_nbytes);

    int sar = !dense && !e->plan.plan_only &&
              (c->collective == IGRAD_COLLECTIVE_SPARSE_REDUCE || e->plan.auto_sar);
    IGRAD_CHECK(igrad__step_alloc(&e->step, &e->plan, e->warm, sar));
    if (!e->plan.plan_only) IGRAD_CHECK(igrad__dp_mem_alloc(&e->mem, &e->plan, &e->step));
    if (e->warm) { /* what the data plane sees in a warm-up step (igrad__engine_room) */
        e->warm_keep[0] = e->warm_keep[1] = calloc(e->plan.ntensors, sizeof(float *));
        IGRAD_FAIL_IF(!e->warm_keep[0], IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    }
    e->mem.ws = calloc((size_t)e->plan.nthreads, sizeof *e->mem.ws);
    IGRAD_FAIL_IF(!e->mem.ws, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    for (int i = 0; i < e->plan.nthreads; i++) IGRAD_CHECK(igrad_select_ws_create(&e->mem.ws[i]));
    if (e->plan.deferral) IGRAD_CHECK(igrad__online_init(e, layout, profile));

    igrad__engine_static_items(e, igrad_layout_hash(layout), igrad__plan_profile_hash(&e->plan),
                               igrad__plan_hash(&e->plan));
    e->calls = 0;
    igrad__engine_dynamic_items(e, -1);
    e->stats.step = -1;
    return IGRAD_OK;
}

void igrad__flat_free(igrad_engine_t *e)
{
    if (e->mem.ws)
        for (int i = 0; i < e->plan.nthreads; i++) igrad_select_ws_free(e->mem.ws[i]);
    free(e->mem.ws);
    if (e->mem.dp && e->mem.dp->release) e->mem.dp->release(IGRAD__PARTS(e));
    if (e->warm_on) warm_switch(e, 0); /* the method's residual and velocity lists back */
    free(e->warm_keep[0]);
    igrad__plan_free(&e->plan);
    if (e->warm) igrad__plan_free(e->warm);
    free(e->warm);
    if (e->mem.dp) { /* set first thing at build: without it, nothing below was allocated */
        e->mem.dp->free(e->mem.residual_mem);
        e->mem.dp->free(e->mem.velocity_mem);
        e->mem.dp->free(e->step.stage_idx);
        e->mem.dp->free(e->step.stage_val);
    }
    free(e->mem.residual);
    free(e->mem.velocity);
    igrad__step_free(&e->step, e->plan.nb_max);
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
    igrad_engine_t *e = igrad__engine_alloc(&igrad__engine_flat);
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
        if (e->warm) e->warm->node_ranks = e->plan.node_ranks;
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

/* The step's local checks (engine_fail.c): a NULL gradient, then the
 * check stage and a non-finite tensor; *bad_tensor the tensor or -1. */
static igrad_status_t local_checks(igrad_engine_t *e, int64_t step, float *const *grads,
                                   int64_t *bad_tensor)
{
    IGRAD_CHECK(igrad__engine_null_grads(e, step, grads, bad_tensor));
    e->mem.dp->check(IGRAD__PARTS(e), grads);
    return igrad__engine_nonfinite(e, step, grads, bad_tensor);
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
    return e->after_agree(e, step, st, bad, ag);
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
    /* online profiling is the method's: a warm-up step neither re-plans nor records */
    if (e->online && IGRAD__RUN(e) == &e->plan)
        IGRAD_CHECK(igrad__online_before_step(e, step)); /* may re-plan */
    igrad_status_t st = igrad__engine_room(e);
    igrad__plan_t *p = IGRAD__RUN(e);
    igrad__engine_stats_memory(e, &e->stats);
    igrad__plan_gate(p, &e->step, step);

    int64_t bad = -1;
    if (st == IGRAD_OK) st = local_checks(e, step, grads, &bad);
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
    if (p->sp != IGRAD_SPARSIFIER_NONE) {
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

igrad_status_t igrad__engine_room(igrad_engine_t *e)
{
    if (!e->warm) return IGRAD_OK;
    int w = IGRAD__RUN(e) == e->warm;
    if (w != e->warm_on) {
        if (e->mem.dp->release) /* made for the other plan: the next stage makes it anew */
            e->mem.dp->release(e->warm_on ? e->warm : &e->plan, &e->step, &e->mem);
        warm_switch(e, w);
    }
    if (w == e->warm_room) return IGRAD_OK;
    size_t send, recv;
    arenas_for(e, w, &send, &recv);
    igrad__dp_mem_t *m = &e->mem;
    int grow = send > m->send_arena_nbytes || recv > m->recv_arena_nbytes;
    if (grow || (!w && (send < m->send_arena_nbytes || recv < m->recv_arena_nbytes))) {
        unsigned char *sa = m->dp->alloc(send, 0), *ra = sa ? m->dp->alloc(recv, 0) : NULL;
        if (!ra) {
            m->dp->free(sa);
            /* leaving the warm-up: the larger arenas serve */
            IGRAD_FAIL_IF(w, IGRAD_E_NOMEM,
                          "step %lld: out of memory for the dense warm-up's %zu + %zu bytes "
                          "of buckets",
                          (long long)e->step.cur_step, send, recv);
        } else {
            m->dp->free(m->send_arena);
            m->dp->free(m->recv_arena);
            m->send_arena = sa;
            m->recv_arena = ra;
            m->send_arena_nbytes = send;
            m->recv_arena_nbytes = recv;
        }
    }
    e->warm_room = w;
    return IGRAD_OK;
}

/* Statistics and the trace, once the step's result is in grads. */
igrad_status_t igrad__engine_finish_step(igrad_engine_t *e)
{
    igrad_step_stats_t *s = &e->stats;
    const igrad__plan_t *p = IGRAD__RUN(e); /* the warm-up's below start_iter */
    int par = igrad__plan_parity(p, e->step.cur_step);
    double P = (double)p->nranks;
    for (size_t t = 0; t < p->ntensors; t++) {
        if (!e->step.sent[t]) continue;
        s->tensors_sent++;
        if (p->sp != IGRAD_SPARSIFIER_NONE && p->t[t].n < p->cfg.dense_below)
            s->dense_small_tensors++;
        s->entries_sent += p->t[t].spec[e->step.rel[t]][par].count;
    }
    for (size_t c = 0; c < p->ncomp; c++) {
        int ph = p->comp_phase[c];
        if (ph < 0) continue;
        if (igrad__schedule_sent(ph, p->cfg.release_period, e->step.cur_step))
            s->released_components++;
        else s->deferred_components++;
    }
    for (size_t j = 0; j < e->step.nbk; j++) {
        const igrad__step_bucket_t *bk = &e->step.bk[j];
        (*(int *)(void *)((char *)s + bk->route->stats_count))++;
        s->payload_nbytes += bk->route->payload(bk);
        s->wire_nbytes += bk->route->wire_nbytes(bk, P);
    }
    igrad__engine_stats_sar(e, s);
    /* levels: the share of this rank's peers on its own node */
    if (p->nranks > 1) {
        s->intra_wire_nbytes = s->wire_nbytes * (double)(p->node_ranks - 1) / (P - 1.0);
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
    if (p->sp != IGRAD_SPARSIFIER_NONE)
        for (size_t t = 0; t < p->ntensors; t++) {
            norm += e->step.tnorm[t];
            dropped += e->step.tdropped[t];
        }
    s->residual_norm = sqrt(norm);
    s->dropped_sumsq = dropped;
    e->last_step = e->step.cur_step;
    e->state = IGRAD__ENGINE_IDLE;
    s->total_ms = igrad__now_ms() - e->t_start;
    if (e->online && p == &e->plan) igrad__online_record(e);
    if (e->trace && p->sp != IGRAD_SPARSIFIER_NONE)
        for (size_t t = 0; t < p->ntensors; t++)
            if (e->step.sent[t])
                IGRAD_CHECK(igrad_trace_record(e->trace, e->step.cur_step, t, e->step.tsumsq[t],
                                               p->t[t].spec[e->step.rel[t]][par].count));
    return IGRAD_OK;
}

igrad_status_t igrad__flat_begin(igrad_engine_t *e, int64_t step, float *const *grads,
                                 const igrad_bucket_t **buckets, size_t *nbuckets)
{
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
    IGRAD_CHECK(step_prepare(e, step, grads, 0));
    double t0 = igrad__now_ms();
    for (size_t j = 0; j < e->step.nbk; j++) pack_bucket(e, j, grads);
    e->stats.pack_ms += igrad__now_ms() - t0;
    e->state = IGRAD__ENGINE_BEGUN;
    *buckets = e->step.desc;
    *nbuckets = e->step.nbk;
    return IGRAD_OK;
}

igrad_status_t igrad__flat_end(igrad_engine_t *e, int64_t step, float *const *grads)
{
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_end"));
    IGRAD_FAIL_IF(e->state != IGRAD__ENGINE_BEGUN, IGRAD_E_STATE,
                  "igrad_engine_end: no step is open (call igrad_engine_begin first)");
    IGRAD_FAIL_IF(step != e->step.cur_step, IGRAD_E_STATE,
                  "igrad_engine_end: step %lld, but step %lld is open", (long long)step,
                  (long long)e->step.cur_step);
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
    if (st != IGRAD_OK)
        st = igrad__engine_keep_first(igrad__engine_group_failed(e, "group start", st), smsg,
                                      sizeof smsg);
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
            st = igrad__engine_keep_first(igrad__engine_bucket_failed(e, j, st), smsg, sizeof smsg);
            break;
        }
        issued++;
        /* unpack, in order, the buckets that have already arrived */
        while (done + 1 < issued) {
            int ready = 0;
            st = igrad_comm_test(e->comm, e->step.bk[done].req, &ready);
            if (st != IGRAD_OK) {
                st = igrad__engine_keep_first(igrad__engine_bucket_failed(e, done, st), smsg,
                                              sizeof smsg);
                break;
            }
            if (!ready) break;
            st = igrad_comm_wait(e->comm, e->step.bk[done].req);
            e->step.bk[done].req = NULL;
            b = igrad__now_ms();
            comm_ms += b - a;
            e->stats.comm_window_ms[1] = b;
            if (st != IGRAD_OK) {
                st = igrad__engine_keep_first(igrad__engine_bucket_failed(e, done, st), smsg,
                                              sizeof smsg);
                break;
            }
            if (ust == IGRAD_OK)
                ust = igrad__engine_keep_first(unpack_bucket(e, done, grads), umsg, sizeof umsg);
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
            st = igrad__engine_keep_first(igrad__engine_group_failed(e, "group end", gs), smsg,
                                          sizeof smsg);
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
            st = igrad__engine_keep_first(igrad__engine_bucket_failed(e, done, ws), smsg,
                                          sizeof smsg);
        if (st == IGRAD_OK && ust == IGRAD_OK) {
            ust = igrad__engine_keep_first(unpack_bucket(e, done, grads), umsg, sizeof umsg);
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

igrad_status_t igrad__flat_sync(igrad_engine_t *e, int64_t step, float *const *grads)
{
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_sync"));
    IGRAD_FAIL_IF(e->state != IGRAD__ENGINE_IDLE, IGRAD_E_STATE,
                  "igrad_engine_sync: step %lld is open (call igrad_engine_end first)",
                  (long long)e->step.cur_step);
    double saved = igrad_comm_timeout(e->comm);
    igrad_comm_set_timeout(e->comm, e->plan.cfg.timeout_s);
    /* only this entry point runs the sparse all-reduce (never a warm-up step's plan) */
    e->step.step_sar = IGRAD__PLAN_OF(e, step)->auto_sar;
    igrad_status_t st = sync_step(e, step, grads);
    e->step.step_sar = 0;
    igrad_comm_set_timeout(e->comm, saved);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Accessors                                                                */
/* ------------------------------------------------------------------------ */
