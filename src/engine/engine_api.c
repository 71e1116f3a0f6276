/*
 * engine_api.c — the public entry points of an engine and the engine
 * table's flat row. Each entry point checks its arguments and dispatches
 * once through e->ops: igrad__engine_flat (one engine over one comm; its
 * entries live in engine.c, engine_stream.c, engine_state.c,
 * engine_online.c, engine_plan.c and engine_stats.c) or igrad__engine_hier
 * (engine_hier.c, the two-level sync, which owns flat shard engines).
 *
 * Not here: create (engine.c, engine_plan.c, engine_hier.c choose the row
 * from config.topology), what either row does.
 */
#include "engine/engine_internal.h"

#include <stdlib.h>

/* The flat row's after_agree: the engine's own agreement is the step's. */
static igrad_status_t agree_alone(igrad_engine_t *e, int64_t step, igrad_status_t st, int64_t bad,
                                  igrad_status_t ag)
{
    (void)e, (void)step, (void)st, (void)bad;
    return ag;
}

const igrad__engine_ops_t igrad__engine_flat = {
    .name = "flat",
    .free = igrad__flat_free,
    .sync = igrad__flat_sync,
    .begin = igrad__flat_begin,
    .end = igrad__flat_end,
    .open = igrad__flat_open,
    .ready = igrad__flat_ready,
    .close = igrad__flat_close,
    .save_state = igrad__flat_save_state,
    .load_state = igrad__flat_load_state,
    .set_profile = igrad__flat_set_profile,
    .set_trace = igrad__flat_set_trace,
    .plan_step = igrad__flat_plan_step,
    .tensor_plan = igrad__flat_tensor_plan,
    .residual = igrad__flat_residual,
    .velocity = igrad__flat_velocity,
    .predict_payload = igrad__flat_predict_payload,
    .workspace_nbytes = igrad__flat_workspace_nbytes,
    .set_stream = igrad__flat_set_stream,
};

igrad_engine_t *igrad__engine_alloc(const igrad__engine_ops_t *ops)
{
    igrad_engine_t *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->ops = ops;
    e->after_agree = agree_alone;
    return e;
}

void igrad__engine_link_world(igrad_engine_t *e,
                              igrad_status_t (*after_agree)(igrad_engine_t *, int64_t,
                                                            igrad_status_t, int64_t,
                                                            igrad_status_t),
                              struct igrad__world_link *world)
{
    e->after_agree = after_agree;
    e->world = world;
}

/* ---- the public entry points ------------------------------------------------ */

void igrad_engine_free(igrad_engine_t *e)
{
    if (e) e->ops->free(e);
}

igrad_status_t igrad_engine_sync(igrad_engine_t *e, int64_t step, float *const *grads)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_sync: engine is NULL");
    return e->ops->sync(e, step, grads);
}

igrad_status_t igrad_engine_begin(igrad_engine_t *e, int64_t step, float *const *grads,
                                  const igrad_bucket_t **buckets, size_t *nbuckets)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_begin: engine is NULL");
    return e->ops->begin(e, step, grads, buckets, nbuckets);
}

igrad_status_t igrad_engine_end(igrad_engine_t *e, int64_t step, float *const *grads)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_end: engine is NULL");
    return e->ops->end(e, step, grads);
}

igrad_status_t igrad_engine_open(igrad_engine_t *e, int64_t step)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_open: engine is NULL");
    return e->ops->open(e, step);
}

igrad_status_t igrad_engine_ready(igrad_engine_t *e, int64_t step, const size_t *tensors,
                                  size_t n, float *const *grads, const igrad_bucket_t **buckets,
                                  size_t *nbuckets)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_ready: engine is NULL");
    return e->ops->ready(e, step, tensors, n, grads, buckets, nbuckets);
}

igrad_status_t igrad_engine_close(igrad_engine_t *e, int64_t step)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_close: engine is NULL");
    return e->ops->close(e, step);
}

igrad_status_t igrad_engine_save_state(const igrad_engine_t *engine, const char *path)
{
    IGRAD_FAIL_IF(!engine || !path, IGRAD_E_INVALID, "igrad_engine_save_state: NULL argument");
    return engine->ops->save_state(engine, path);
}

igrad_status_t igrad_engine_load_state(igrad_engine_t *engine, const char *path)
{
    IGRAD_FAIL_IF(!engine, IGRAD_E_INVALID, "igrad_engine_load_state: engine is NULL");
    return engine->ops->load_state(engine, path);
}

igrad_status_t igrad_engine_set_profile(igrad_engine_t *e, const igrad_profile_t *profile)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_set_profile: engine is NULL");
    return e->ops->set_profile(e, profile);
}

igrad_status_t igrad_engine_set_trace(igrad_engine_t *e, igrad_trace_t *trace)
{
    IGRAD_FAIL_IF(!e, IGRAD_E_INVALID, "igrad_engine_set_trace: engine is NULL");
    return e->ops->set_trace(e, trace);
}

igrad_status_t igrad_engine_plan_step(igrad_engine_t *e, int64_t step,
                                      igrad_step_stats_t *stats,
                                      igrad_planned_bucket_t *buckets, size_t capacity,
                                      size_t *nbuckets)
{
    IGRAD_FAIL_IF(!e || !stats || !nbuckets || (capacity > 0 && !buckets), IGRAD_E_INVALID,
                  "igrad_engine_plan_step: NULL argument");
    return e->ops->plan_step(e, step, stats, buckets, capacity, nbuckets);
}

igrad_status_t igrad_engine_tensor_plan(const igrad_engine_t *e, size_t t,
                                        igrad_tensor_plan_t *out)
{
    IGRAD_FAIL_IF(!e || !out, IGRAD_E_INVALID, "igrad_engine_tensor_plan: NULL argument");
    IGRAD_FAIL_IF(t >= e->plan.ntensors, IGRAD_E_INVALID,
                  "igrad_engine_tensor_plan: tensor %zu out of range (%zu tensors)", t,
                  e->plan.ntensors);
    return e->ops->tensor_plan(e, t, out);
}

const float *igrad_engine_residual(const igrad_engine_t *e, size_t t)
{
    if (!e || t >= e->plan.ntensors) return NULL;
    return e->ops->residual(e, t);
}

const float *igrad_engine_velocity(const igrad_engine_t *e, size_t t)
{
    if (!e || t >= e->plan.ntensors) return NULL;
    return e->ops->velocity(e, t);
}

int64_t igrad_engine_predict_payload(const igrad_engine_t *e, int64_t step)
{
    return e ? e->ops->predict_payload(e, step) : -1;
}

size_t igrad_engine_workspace_nbytes(const igrad_engine_t *e)
{
    return e ? e->ops->workspace_nbytes(e) : 0;
}
