/*
 * schedule.c — release schedule: schedule names, phase assignment
 * (aligned / staggered by longest-processing-time), release budgets, the
 * predicted payload of a step and the schedule hash. The API and how the
 * engine drives it are documented in schedule.h.
 *
 * Not here: the residual policy and selection (engine.c, select.c), bucket
 * packing (pack.c).
 */
#include "plan/schedule.h"

#include <math.h>
#include <stdlib.h>

igrad_status_t igrad__schedule_check(int period, double keep)
{
    IGRAD_FAIL_IF(period < 1 || period > IGRAD__SCHEDULE_MAX_PERIOD, IGRAD_E_INVALID,
                  "release period %d outside [1, %d]", period, IGRAD__SCHEDULE_MAX_PERIOD);
    /* written so that NaN fails too */
    IGRAD_FAIL_IF(!(keep > 0.0 && keep <= 1.0), IGRAD_E_INVALID,
                  "release keep %g outside (0, 1]", keep);
    return IGRAD_OK;
}

/* One component waiting for a slot: weight, then index for the tie-break. */
typedef struct weighted {
    int64_t weight;
    size_t index;
} weighted_t;

/* Heavier first; equal weights: lower component index first. A total
 * order, so qsort's instability cannot show. */
static int cmp_heavier_first(const void *pa, const void *pb)
{
    const weighted_t *a = pa, *b = pb;
    if (a->weight != b->weight) return a->weight > b->weight ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

igrad_status_t igrad__schedule_assign(igrad_schedule_t kind, int period, size_t n,
                                      const int64_t *release_nbytes,
                                      const unsigned char *important, int *phase)
{
    IGRAD_FAIL_IF(kind != IGRAD_SCHEDULE_ALIGNED && kind != IGRAD_SCHEDULE_STAGGERED,
                  IGRAD_E_INVALID, "unknown schedule %d", (int)kind);
    IGRAD_FAIL_IF(period < 1 || period > IGRAD__SCHEDULE_MAX_PERIOD, IGRAD_E_INVALID,
                  "release period %d outside [1, %d]", period, IGRAD__SCHEDULE_MAX_PERIOD);
    if (n == 0) return IGRAD_OK;
    IGRAD_FAIL_IF(!phase, IGRAD_E_INVALID, "schedule: NULL phase array");

    if (kind == IGRAD_SCHEDULE_ALIGNED) {
        for (size_t c = 0; c < n; c++)
            phase[c] = important && important[c] ? IGRAD__PHASE_EVERY : period - 1;
        return IGRAD_OK;
    }

    IGRAD_FAIL_IF(!release_nbytes, IGRAD_E_INVALID,
                  "staggered schedule: NULL release byte counts");
    size_t nlow = 0;
    for (size_t c = 0; c < n; c++) {
        if (important && important[c]) continue;
        IGRAD_FAIL_IF(release_nbytes[c] < 0, IGRAD_E_INVALID,
                      "staggered schedule: component %zu has %lld release bytes", c,
                      (long long)release_nbytes[c]);
        nlow++;
    }

    weighted_t *order = malloc((nlow ? nlow : 1) * sizeof *order);
    /* Slot loads: sums of int64 byte counts. Saturating at INT64_MAX would
     * only matter past 9 EB of payload. */
    int64_t *load = calloc((size_t)period, sizeof *load);
    if (!order || !load) {
        free(order);
        free(load);
        return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__,
                           "staggered schedule: out of memory for %zu components", n);
    }
    size_t m = 0;
    for (size_t c = 0; c < n; c++) {
        if (important && important[c]) {
            phase[c] = IGRAD__PHASE_EVERY;
        } else {
            order[m].weight = release_nbytes[c];
            order[m].index = c;
            m++;
        }
    }
    qsort(order, nlow, sizeof *order, cmp_heavier_first);
    /* A linear scan for the lightest slot: O(nlow * R), and both are small
     * (components of one model, R of a few steps); this runs once. */
    for (size_t i = 0; i < nlow; i++) {
        int best = 0;
        for (int s = 1; s < period; s++)
            if (load[s] < load[best]) best = s;
        load[best] += order[i].weight;
        phase[order[i].index] = best;
    }
    free(order);
    free(load);
    return IGRAD_OK;
}

int64_t igrad__release_count(int64_t k, int64_t n, double keep, int period)
{
    if (k <= 0 || n <= 0) return 0;
    double want = ceil(igrad__release_scale(keep, period) * (double)k);
    /* compare in double before converting, so a huge product cannot
     * overflow the int64 conversion */
    if (!(want < (double)n)) return n;
    return (int64_t)want;
}

int64_t igrad__release_per_row(int64_t per_row, int64_t cols, double keep, int period)
{
    return igrad__release_count(per_row, cols, keep, period);
}

int64_t igrad__schedule_step_nbytes(size_t n, const int *phase, int period,
                                    const int64_t *step_nbytes,
                                    const int64_t *release_nbytes, int64_t step)
{
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (phase[i] < 0)
            total += step_nbytes[i];
        else if (igrad__schedule_sent(phase[i], period, step))
            total += release_nbytes[i];
    }
    return total;
}

uint64_t igrad__schedule_hash(uint64_t h, igrad_schedule_t kind, int period, double keep,
                              size_t n, const int *phase)
{
    h = igrad__hash_str(h, "igrad-schedule");
    h = igrad__hash_i64(h, (int64_t)kind);
    h = igrad__hash_i64(h, (int64_t)period);
    h = igrad__hash_f64(h, keep);
    h = igrad__hash_i64(h, (int64_t)n);
    for (size_t i = 0; i < n; i++) h = igrad__hash_i64(h, (int64_t)phase[i]);
    return h;
}
