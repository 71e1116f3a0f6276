/*
 * engine_shard.c — the flat row's small API for whoever holds flat
 * engines as parts: the two-level sync (engine_hier.c) calls its shard
 * engines through the public entry points and these, and reads none of
 * their fields; and set_stream, the flat row's entry of the engine table
 * that igrad_engine_set_stream_cuda reaches (engine_cuda.cu).
 *
 * Not here: the shard engine's create (igrad__engine_create_shard,
 * engine.c), what the two-level sync does with these (engine_hier.c).
 */
#include "engine/engine_internal.h"

igrad_status_t igrad__flat_create_shard_plan(const igrad_layout_t *layout,
                                             const igrad_profile_t *profile,
                                             const igrad_config_t *config, int nranks,
                                             igrad_engine_t **out)
{
    *out = NULL;
    igrad_engine_t *e = igrad__engine_alloc(&igrad__engine_flat);
    IGRAD_FAIL_IF(!e, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    e->plan.plan_only = 1;
    e->shard = 1;
    e->plan.nranks = nranks;
    igrad_status_t st = igrad__engine_build(e, layout, profile, config, NULL);
    if (st != IGRAD_OK) {
        igrad_engine_free(e);
        return st;
    }
    *out = e;
    return IGRAD_OK;
}

igrad_status_t igrad__flat_failure(const igrad_engine_t *e, const char **msg)
{
    if (msg) *msg = e->broken != IGRAD_OK ? e->broken_msg : "";
    return e->broken;
}

void igrad__flat_progress(const igrad_engine_t *e, int64_t *last_step, int64_t *calls)
{
    *last_step = e->last_step;
    *calls = e->calls;
}

igrad_status_t igrad__flat_copy(igrad_engine_t *e, void *dst, const void *src, size_t nbytes)
{
    return e->mem.dp->copy(IGRAD__PARTS(e), dst, src, nbytes);
}

int igrad__flat_bucket_slots(const igrad_engine_t *e) { return e->plan.nb_max; }

igrad_status_t igrad__flat_prepare(igrad_engine_t *e)
{
    return e->mem.dp->prepare ? e->mem.dp->prepare(IGRAD__PARTS(e)) : IGRAD_OK;
}

struct igrad__world_link *igrad__flat_world(const igrad_engine_t *e) { return e->world; }

/* The engine's queue (its dense warm-up runs on the same data plane). */
igrad_status_t igrad__flat_set_stream(igrad_engine_t *e, const igrad__dp_ops_t *dp, void *stream)
{
    IGRAD_FAIL_IF(e->mem.dp != dp, IGRAD_E_INVALID,
                  "igrad_engine_set_stream_%s: the engine's data plane is '%s', not %s "
                  "(made by igrad_engine_create, not igrad_engine_create_%s)",
                  dp->name, e->mem.dp ? e->mem.dp->name : "none", dp->name, dp->name);
    IGRAD_FAIL_IF(e->state != IGRAD__ENGINE_IDLE, IGRAD_E_STATE,
                  "igrad_engine_set_stream_%s: step %lld is open", dp->name,
                  (long long)e->step.cur_step);
    e->mem.dp_stream = stream;
    return IGRAD_OK;
}
