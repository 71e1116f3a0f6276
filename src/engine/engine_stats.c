/*
 * engine_stats.c — what an engine says about itself: its memory
 * (igrad_engine_workspace_nbytes and the statistics' data-plane bytes),
 * the last step's statistics, a tensor's plan, predicted payloads,
 * residuals and velocities, the config, and the trace it records into.
 * Reads only; the two-level engine answers through its shards.
 */
#include "engine/engine_internal.h"
#include "engine/engine_stream.h"
#include "plan/schedule.h"
#include "comm/sparse_allreduce.h"
#include "dp/cpu/select_internal.h"
#include "profile/profile_internal.h"

#include <stdlib.h>
#include <string.h>

/* Bytes in the data plane's memory (stats.dataplane_nbytes): every
 * dp->alloc of the engine (the arenas as large as they are: during the
 * dense warm-up, large enough for its plan too). */
static int64_t dataplane_nbytes(const igrad_engine_t *e)
{
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
    return n;
}

/* The memory statistics, on every step (skipped ones too). */
void igrad__engine_stats_memory(const igrad_engine_t *e, igrad_step_stats_t *s)
{
    s->dataplane_nbytes = dataplane_nbytes(e);
    s->dataplane_nbytes_per_param =
        e->plan.nparams > 0 ? (double)s->dataplane_nbytes / (double)e->plan.nparams : 0.0;
}

void igrad__engine_stats_sar(const igrad_engine_t *e, igrad_step_stats_t *s)
{
    s->sar_busiest_entries = s->sar_entries = 0;
    s->sar_busiest_over_mean = 0.0;
    if (!e->step.sar) return;
    for (size_t j = 0; j < e->step.nbk; j++) {
        const igrad__step_bucket_t *bk = &e->step.bk[j];
        if (bk->route->kind != IGRAD_BUCKET_SPARSE_REDUCE || bk->wire_counted < 0.0) continue;
        s->sar_busiest_entries += (int64_t)e->step.sar[j].balance.recv_max;
        s->sar_entries += (int64_t)e->step.sar[j].balance.recv_total;
    }
    if (s->sar_entries > 0)
        s->sar_busiest_over_mean = (double)s->sar_busiest_entries * (double)e->plan.nranks /
                                   (double)s->sar_entries;
}

igrad_status_t igrad_engine_last_stats(const igrad_engine_t *e, igrad_step_stats_t *out)
{
    IGRAD_FAIL_IF(!e || !out, IGRAD_E_INVALID, "igrad_engine_last_stats: NULL argument");
    *out = e->stats;
    return IGRAD_OK;
}

igrad_status_t igrad__flat_tensor_plan(const igrad_engine_t *e, size_t t,
                                       igrad_tensor_plan_t *out)
{
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
    out->step_nbytes = igrad__plan_tensor_wire_nbytes(&e->plan, tp, 0, 0);
    out->release_nbytes =
        tp->phase >= 0 ? igrad__plan_tensor_wire_nbytes(&e->plan, tp, 1, 0) : 0;
    return IGRAD_OK;
}

int64_t igrad__flat_predict_payload(const igrad_engine_t *e, int64_t step)
{
    const igrad__plan_t *p = IGRAD__PLAN_OF(e, step); /* the warm-up's below start_iter */
    int par = igrad__plan_parity(p, step);
    int64_t total = 0;
    for (size_t t = 0; t < p->ntensors; t++) {
        const igrad__plan_tensor_t *tp = &p->t[t];
        if (!igrad__schedule_sent(tp->phase, p->cfg.release_period, step)) continue;
        total += igrad__plan_tensor_wire_nbytes(p, tp, tp->phase >= 0, par);
    }
    return total;
}

/* During the warm-up the data plane's lists are empty (engine.c): the
 * method's are in warm_keep. */
const float *igrad__flat_residual(const igrad_engine_t *e, size_t t)
{
    float *const *r = e->warm_on ? e->warm_keep[0] : e->mem.residual;
    return r ? r[t] : NULL;
}

const float *igrad__flat_velocity(const igrad_engine_t *e, size_t t)
{
    float *const *v = e->warm_on ? e->warm_keep[1] : e->mem.velocity;
    return v ? v[t] : NULL;
}

igrad_status_t igrad__flat_set_trace(igrad_engine_t *e, igrad_trace_t *trace)
{
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

size_t igrad__flat_workspace_nbytes(const igrad_engine_t *e)
{
    size_t T = e->plan.ntensors, mb = e->step.blk_cap, nb = e->step.nb_cap;
    size_t n = sizeof *e +
               T * (sizeof *e->plan.t + sizeof *e->plan.tensor_hash + sizeof *e->step.stage_off +
                    2 + sizeof *e->step.work + sizeof *e->step.tstatus + 3 * sizeof(double));
    n += (size_t)(e->mem.residual_count + e->mem.velocity_count) * sizeof(float);
    if (e->warm) /* the dense warm-up's plan (its arenas' room is in the arenas) */
        n += sizeof *e->warm +
             T * (sizeof *e->warm->t + sizeof *e->warm->tensor_hash) +
             e->warm->map.count * (sizeof(uint64_t) + sizeof(int)) +
             e->warm->hist.count * (sizeof(uint64_t) + sizeof(int64_t) + 2 * sizeof(double));
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
