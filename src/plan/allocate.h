/*
 * allocate.h — the budget allocation of method ig (config.allocation
 * BUDGET, decision 0059): the step's byte budget (target_ratio times the
 * *_sync payload) spread across components, each one sent every step
 * (level 0) or deferred and released once per R steps at its own keep
 * kappa_c = 1/j (level j = 1 .. J, J = min(3R, 20): down to the rounding
 * floor of a 3-entry ADTopk row, never below IGRAD_TARGET_MIN_KEEP).
 *
 * Cost of a level: the engine's fixed-width wire bytes of the component's
 * tensors (target.c's byte model, rounding and index widths as planned),
 * in integer units of bytes per 2R steps, so that sums are exact.
 * Value of a level (the documented model): w_c x the entries it delivers
 * over 2R steps, capped at the every-step entries, a deferred entry worth
 * (1 - 2^-10) of a fresh one (so that deferring at kappa 1 never beats
 * sending every step); w_c = the profile's score + 1e-6 (a score is a
 * per-entry activity, so the value of a component is its score times its
 * volume). The allocation maximises the summed value under the budget: a
 * multiple-choice knapsack solved exactly by dynamic programming over the
 * budget cut into at most IGRAD__ALLOC_SLOTS slots (costs rounded up to a
 * slot, so a solution always fits; exact when the budget has fewer units
 * than slots).
 *
 * Bit-identity: a pure function of (layout, profile scores, config,
 * target); fixed component order, sequential float arithmetic, ties kept
 * by the first (cheaper) level, so every rank of an agreed profile
 * decides the same bits. Its result is hashed into the plan item.
 */
#ifndef IGRAD_ALLOCATE_H
#define IGRAD_ALLOCATE_H

#include "core/internal.h"

#define IGRAD__ALLOC_SLOTS 16384
#define IGRAD__ALLOC_MAX_LEVELS 20 /* j <= 20: kappa >= 0.05 = IGRAD_TARGET_MIN_KEEP */
#define IGRAD__ALLOC_DELAY 0.0009765625 /* 2^-10: a deferred entry's discount */
#define IGRAD__ALLOC_EPS 1e-6           /* added to every score */

/* The problem: per gated component and level, its cost and value. */
typedef struct igrad__alloc_table {
    size_t ncomp;     /* layout components */
    int nlev;         /* 1 + J */
    unsigned char *gated; /* (ncomp) 1: scored by the profile, allocated */
    int64_t *cost;    /* (ncomp * nlev) units: bytes per 2R steps */
    double *value;    /* (ncomp * nlev) */
    int64_t forced;   /* units always sent: OTHER tensors, ungated components */
    int64_t total;    /* units of the *_sync payload */
} igrad__alloc_table_t;

/* target.c's byte model, shared: the count and fixed-width wire bytes of
 * tensor ti's selection at `scale` and `parity`, and the sparsifier the
 * engine uses for it (NONE below config.dense_below). */
igrad_status_t igrad__target_tensor_spec(const igrad_config_t *c, igrad_sparsifier_t sp,
                                         const igrad_tensor_info_t *ti, double scale,
                                         int parity, int64_t *count, int64_t *nbytes);
igrad_sparsifier_t igrad__target_tensor_sparsifier(const igrad_config_t *c,
                                                   const igrad_tensor_info_t *ti);
/* Whether component ci is under the gate (the profile has its row: its
 * score into *score); 0 for an EMB/HEAD/NORM the profile lacks, which is
 * sent every step as in the engine. */
int igrad__target_comp_score(const igrad_profile_t *profile, const igrad_component_info_t *ci,
                             double *score);

/* The levels: J for release period R; kappa of level j >= 1 is 1.0 / j. */
int igrad__alloc_levels(int period);
static inline double igrad__alloc_level_keep(int j)
{
    return 1.0 / (double)j;
}

igrad_status_t igrad__alloc_table(const igrad_layout_t *layout, const igrad_profile_t *profile,
                                  const igrad_config_t *config, igrad__alloc_table_t *t);
void igrad__alloc_table_free(igrad__alloc_table_t *t);

/* The budget in units: floor(target * total) - forced (may be negative). */
int64_t igrad__alloc_budget(const igrad__alloc_table_t *t, double target_ratio);

/* The best choice[c] (level per component; ungated: 0) under `budget`
 * units. *met = 0 when even the cheapest levels exceed it (choice is
 * then the cheapest). Allocates its DP tables (setup time). */
igrad_status_t igrad__alloc_solve(const igrad__alloc_table_t *t, int64_t budget, int *choice,
                                  int *met);

/* The allocation applied: every[c] (1: sent every step) and keep[c]
 * (its kappa; config->release_keep when every[c]), *ratio = planned
 * payload / *_sync's, *met as above. */
igrad_status_t igrad__allocate(const igrad_layout_t *layout, const igrad_profile_t *profile,
                               const igrad_config_t *config, double target_ratio,
                               unsigned char *every, double *keep, double *ratio, int *met);

#endif /* IGRAD_ALLOCATE_H */
