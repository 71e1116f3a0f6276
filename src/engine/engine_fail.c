/*
 * engine_fail.c — a step's failures as the whole step reports them: the
 * local checks' (a NULL gradient, a non-finite tensor with its first bad
 * entry), and a bucket's or the bucket group's failed collective, with
 * the step and bucket named; the first failure's message is kept; a
 * peer's status word that is no status (corrupt bytes) named as such.
 */
#define _POSIX_C_SOURCE 200809L

#include "engine/engine_internal.h"

#include <math.h>
#include <stdio.h>

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
/* A collective of bucket j failed or timed out: says which, at which step,
 * and returns the comm's status. */
igrad_status_t igrad__engine_bucket_failed(const igrad_engine_t *e, size_t j, igrad_status_t st)
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
igrad_status_t igrad__engine_group_failed(const igrad_engine_t *e, const char *what,
                                          igrad_status_t st)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", igrad_last_error());
    return igrad__fail(st, __FILE__, __LINE__, "step %lld: %s of the step's %zu buckets: %s",
                       (long long)e->step.cur_step, what, e->step.nbk, msg);
}

igrad_status_t igrad__engine_peer_word(const char *what, int rank, uint64_t word)
{
    if (word <= (uint64_t)IGRAD_E_TIMEOUT) return IGRAD_OK; /* the last status */
    return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                       "%s: rank %d's block is corrupt (its status word is 0x%016llx, which is "
                       "no igrad status): bad bytes from the transport, or ranks out of step; "
                       "the engine is unusable",
                       what, rank, (unsigned long long)word);
}

/* Keeps the message of a step's first failure in buf: waiting out the
 * remaining requests records later ones. */
igrad_status_t igrad__engine_keep_first(igrad_status_t st, char *buf, size_t nbytes)
{
    if (st != IGRAD_OK && !buf[0]) snprintf(buf, nbytes, "%s", igrad_last_error());
    return st;
}
