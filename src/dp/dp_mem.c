/*
 * dp_mem.c — the data-plane memory part of an engine (dp.h): the staged
 * selection, the bucket arenas (mem->send_arena_nbytes and
 * recv_arena_nbytes set by the caller), residuals and velocities, made in
 * the backend's memory through its alloc; each tensor's residual and
 * velocity pointed at its share.
 */
#include "dp/dp.h"
#include "core/sparsifier.h"

#include <stdlib.h>

void igrad__dp_mem_point(igrad__dp_mem_t *mem, const igrad__plan_t *plan)
{
    int64_t off = 0;
    for (size_t i = 0; i < plan->ntensors; i++) {
        mem->residual[i] = mem->residual_mem ? mem->residual_mem + off : NULL;
        mem->velocity[i] = mem->velocity_mem ? mem->velocity_mem + off : NULL;
        off += plan->t[i].n;
    }
}

igrad_status_t igrad__dp_mem_alloc(igrad__dp_mem_t *mem, const igrad__plan_t *plan,
                                   igrad__step_t *step)
{
    int dense = igrad__sparsifier_dense(plan->sp);
    size_t T = plan->ntensors;
    if (plan->max_entries) {
        step->stage_idx = mem->dp->alloc(plan->max_entries * sizeof *step->stage_idx, 0);
        step->stage_val = mem->dp->alloc(plan->max_entries * sizeof *step->stage_val, 0);
        IGRAD_FAIL_IF(!step->stage_idx || !step->stage_val, IGRAD_E_NOMEM,
                      "igrad_engine_create: out of memory for %zu staged entries",
                      plan->max_entries);
    }
    mem->send_arena = mem->dp->alloc(mem->send_arena_nbytes, 0);
    mem->recv_arena = mem->dp->alloc(mem->recv_arena_nbytes, 0);
    IGRAD_FAIL_IF(!mem->send_arena || !mem->recv_arena, IGRAD_E_NOMEM,
                  "igrad_engine_create: out of memory for %zu + %zu bytes of buckets",
                  mem->send_arena_nbytes, mem->recv_arena_nbytes);

    mem->residual = calloc(T ? T : 1, sizeof *mem->residual);
    mem->velocity = calloc(T ? T : 1, sizeof *mem->velocity);
    IGRAD_FAIL_IF(!mem->residual || !mem->velocity, IGRAD_E_NOMEM,
                  "igrad_engine_create: out of memory");
    if (!dense) {
        int64_t total = 0;
        for (size_t i = 0; i < T; i++) total += plan->t[i].n;
        mem->residual_count = total;
        mem->residual_mem = mem->dp->alloc((size_t)total * sizeof(float), 1);
        IGRAD_FAIL_IF(!mem->residual_mem, IGRAD_E_NOMEM,
                      "igrad_engine_create: out of memory for %lld residual entries",
                      (long long)total);
        if (plan->kargs.momentum > 0.0f) {
            mem->velocity_count = total;
            mem->velocity_mem = mem->dp->alloc((size_t)total * sizeof(float), 1);
            IGRAD_FAIL_IF(!mem->velocity_mem, IGRAD_E_NOMEM,
                          "igrad_engine_create: out of memory for %lld velocity entries "
                          "(config.momentum)",
                          (long long)total);
        }
    }
    igrad__dp_mem_point(mem, plan);
    return IGRAD_OK;
}
