/*
 * engine_plan.c — plan-only engines (igrad_engine_create_plan,
 * igrad_engine_plan_step): the engine's own plan for P ranks built
 * without a communicator and without data-plane memory, so that `igrad
 * plan` can report a step's exact buckets, routes, payload and wire bytes
 * for any model and any P (a 70B layout at P = 1,024 included) from the
 * same code that plans a real step (engine.c plan_step, route.c).
 *
 * Not here: the plan itself (engine.c), the time model (tools/plan_cost.c).
 */
#include "engine/engine_internal.h"
#include "plan/route.h"

#include <stdlib.h>
#include <string.h>

igrad_status_t igrad_engine_create_plan(const igrad_layout_t *layout,
                                        const igrad_profile_t *profile,
                                        const igrad_config_t *config, int nranks,
                                        igrad_engine_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_engine_create_plan: out is NULL");
    *out = NULL;
    IGRAD_FAIL_IF(!layout || !config, IGRAD_E_INVALID,
                  "igrad_engine_create_plan: layout or config is NULL");
    IGRAD_FAIL_IF(nranks < 1, IGRAD_E_INVALID,
                  "igrad_engine_create_plan: nranks is %d (must be at least 1)", nranks);
    IGRAD_CHECK(igrad_config_validate(config));
    if (config->topology == IGRAD_TOPOLOGY_HIER)
        return igrad__hier_create_plan(layout, profile, config, nranks, out);
    IGRAD_FAIL_IF(config->profile_steps > 0, IGRAD_E_INVALID,
                  "igrad_engine_create_plan: config.profile_steps is %lld: a plan needs its "
                  "profile now (pass one, profile_steps 0)",
                  (long long)config->profile_steps);
    IGRAD_FAIL_IF(config->start_iter > 0, IGRAD_E_INVALID,
                  "igrad_engine_create_plan: config.start_iter is %lld: the dense warm-up "
                  "is not planned (plan method dense for those steps, start_iter 0)",
                  (long long)config->start_iter);
    igrad_engine_t *e = igrad__engine_alloc(&igrad__engine_flat);
    IGRAD_FAIL_IF(!e, IGRAD_E_NOMEM, "igrad_engine_create_plan: out of memory");
    e->plan.plan_only = 1;
    e->plan.rank = 0;
    e->plan.nranks = nranks;
    igrad_status_t st = igrad__engine_build(e, layout, profile, config, NULL);
    if (st != IGRAD_OK) {
        igrad_engine_free(e);
        return st;
    }
    igrad__engine_plan_only_done(e, out);
    return IGRAD_OK;
}

void igrad__engine_plan_only_done(igrad_engine_t *e, igrad_engine_t **out)
{
    /* Every entry point that would run a step or talk to ranks refuses it. */
    igrad__fail(IGRAD_E_STATE, __FILE__, __LINE__,
                "a plan-only engine (igrad_engine_create_plan) has no communicator and runs "
                "no steps");
    igrad__engine_break(e, IGRAD_E_STATE);
    *out = e;
}

igrad_status_t igrad__flat_plan_step(igrad_engine_t *e, int64_t step, igrad_step_stats_t *stats,
                                     igrad_planned_bucket_t *buckets, size_t capacity,
                                     size_t *nbuckets)
{
    IGRAD_FAIL_IF(!e->plan.plan_only, IGRAD_E_STATE,
                  "igrad_engine_plan_step: the engine is not plan-only (make it with "
                  "igrad_engine_create_plan; a running engine plans in its steps)");
    IGRAD_CHECK(igrad__engine_plan_only_step(e, step));
    *stats = e->stats;
    *nbuckets = e->step.nbk;
    for (size_t j = 0; j < e->step.nbk && j < capacity; j++) {
        const igrad__step_bucket_t *bk = &e->step.bk[j];
        igrad_planned_bucket_t *b = &buckets[j];
        b->kind = bk->kind;
        b->index = bk->index;
        b->payload_nbytes = bk->route->payload(bk);
        b->wire_nbytes = bk->route->wire_nbytes(bk, (double)e->plan.nranks);
        b->dense_count = (int64_t)bk->dense_count;
        b->local_rank = 0;
    }
    return IGRAD_OK;
}

igrad_status_t igrad__engine_plan_only_step(igrad_engine_t *e, int64_t step)
{
    igrad__engine_step_reset(e, step);
    igrad__plan_gate(&e->plan, &e->step, step);
    e->step.step_sar = e->plan.auto_sar; /* a plan-only engine models igrad_engine_sync */
    igrad_status_t st =
        igrad__engine_plan_step(e, 1);
    e->step.step_sar = 0;
    IGRAD_CHECK(st);
    /* the step's statistics as a run has them: nothing was selected (norms
     * 0), no online window records (profile_steps is 0), no trace is set */
    IGRAD_CHECK(igrad__engine_finish_step(e));
    e->stats.total_ms = 0.0;
    return IGRAD_OK;
}
