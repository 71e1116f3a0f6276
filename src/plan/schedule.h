/*
 * schedule.h — internal API of the release schedule (DESIGN.md §3,
 * "Schedule"): which component is sent at which step, with which budget.
 *
 * Lives here: release phases (aligned / staggered), the send gate, release
 * budgets k_rel, the predicted payload of a step and the schedule hash used
 * by the cross-rank agreement check. Does not live here: the residual policy
 * (on / drop) and the selection itself (the engine and select.c), and the
 * bucket packing of a step's payload (pack.h).
 *
 * How the engine uses it:
 *   setup, once:
 *     igrad__schedule_check(period, keep)            validate the knobs
 *     release_nbytes[c] = wire bytes of component c at its release budget
 *                         (sum over c's tensors of k_rel * entry bytes)
 *     igrad__schedule_assign(kind, period, n, release_nbytes, important,
 *                            phase)                   one phase per component
 *     h = igrad__schedule_hash(h, kind, period, keep, n, phase)
 *   every step, for a tensor of component c (OTHER tensors: phase
 *   IGRAD__PHASE_EVERY):
 *     if (!igrad__schedule_sent(phase[c], period, step)) -> not sent
 *     else select with scale igrad__schedule_scale(phase[c], period, keep)
 *     (1.0 every step, keep*period at a release), which makes
 *     igrad_select_spec() keep exactly igrad__release_count(k, n, keep,
 *     period) entries (flat) or igrad__release_per_row(...) per row.
 *
 * Everything here is a pure function of its arguments: no global state,
 * nothing depends on gradient values, so every rank computes the same
 * schedule. Only igrad__schedule_assign() allocates (once, at setup).
 */
#ifndef IGRAD_SCHEDULE_H
#define IGRAD_SCHEDULE_H

#include "core/internal.h"

/* Phase of a component that is sent every step (important components and
 * OTHER tensors) with the normal per-step budget k. */
#define IGRAD__PHASE_EVERY (-1)

/* Release periods above this are refused: a period of thousands of steps
 * would leave low components unsynchronised for most of a run. */
#define IGRAD__SCHEDULE_MAX_PERIOD 1000000

/* IGRAD_OK if period >= 1 (and <= IGRAD__SCHEDULE_MAX_PERIOD) and
 * keep (kappa) is in (0, 1]; IGRAD_E_INVALID naming the bad value otherwise. */
igrad_status_t igrad__schedule_check(int period, double keep);

/* Assigns a phase to each of n components.
 *   important[c] != 0  -> phase[c] = IGRAD__PHASE_EVERY (important may be
 *                         NULL: every component is low-importance)
 *   aligned            -> phase[c] = period - 1 for every low component
 *                         (releases at steps R-1, 2R-1, ...)
 *   staggered          -> longest-processing-time over `period` slots,
 *                         weighted by release_nbytes[c]: components in
 *                         order of decreasing weight (ties: lower index
 *                         first), each into the slot with the least load so
 *                         far (ties: lower slot). Afterwards the slot loads
 *                         differ by at most the largest weight.
 * release_nbytes may be NULL for aligned (unused); for staggered it must
 * hold n values >= 0 (weights of important components are ignored).
 * With period 1 every low component gets phase 0 (sent every step).
 * Allocates a temporary order array (setup-time call).
 * @return IGRAD_E_INVALID (bad kind, period, negative weight, NULL array)
 * or IGRAD_E_NOMEM. */
igrad_status_t igrad__schedule_assign(igrad_schedule_t kind, int period, size_t n,
                                      const int64_t *release_nbytes,
                                      const unsigned char *important, int *phase);

/* @return 1 if a component with this phase is sent at `step`: always for
 * IGRAD__PHASE_EVERY, else iff step mod period == phase (mathematical
 * modulo, so negative steps are well defined). period must be >= 1. */
static inline int igrad__schedule_sent(int phase, int period, int64_t step)
{
    if (phase < 0) return 1;
    int64_t r = step % period;
    if (r < 0) r += period;
    return r == (int64_t)phase;
}

/* @return the release scale kappa * R as one double product. This exact
 * value is what the engine passes as `scale` to igrad_select_spec(), and
 * what igrad__release_count() multiplies k by, so both agree bit for bit. */
static inline double igrad__release_scale(double keep, int period)
{
    return keep * (double)period;
}

/* @return the selection scale of a component at a step where it is sent:
 * 1.0 for IGRAD__PHASE_EVERY, igrad__release_scale(keep, period) for a
 * release. */
static inline double igrad__schedule_scale(int phase, int period, double keep)
{
    return phase < 0 ? 1.0 : igrad__release_scale(keep, period);
}

/* Release budget of a flat selection: k_rel = min(n, ceil(kappa*R*k)),
 * computed as ceil(igrad__release_scale(keep, period) * k) so that it
 * equals igrad_select_spec()'s count for topk at that scale.
 * @return 0 when k <= 0 or n <= 0. keep = 1 gives min(n, R*k): the
 * amortised full budget of the R steps the component was silent. */
int64_t igrad__release_count(int64_t k, int64_t n, double keep, int period);

/* Row-wise (ADTopk) variant: entries kept per row at a release,
 * min(cols, ceil(kappa*R*per_row)). The tensor's release count is
 * rows * that. @return 0 when per_row <= 0 or cols <= 0. */
int64_t igrad__release_per_row(int64_t per_row, int64_t cols, double keep, int period);

/* Predicted payload of `step`: the sum over n items (components or
 * tensors) of step_nbytes[i] when phase[i] == IGRAD__PHASE_EVERY,
 * release_nbytes[i] when the item is released at this step, else 0.
 * release_nbytes may be NULL when no item has a phase >= 0. O(n). */
int64_t igrad__schedule_step_nbytes(size_t n, const int *phase, int period,
                                    const int64_t *step_nbytes,
                                    const int64_t *release_nbytes, int64_t step);

/* Chains the schedule into a hash (start from IGRAD__HASH_SEED or an
 * earlier result): kind, period, keep and every phase in order. Ranks
 * compare it to prove they gate identically. */
uint64_t igrad__schedule_hash(uint64_t h, igrad_schedule_t kind, int period, double keep,
                              size_t n, const int *phase);

#endif /* IGRAD_SCHEDULE_H */
