/*
 * allocate.c — method ig's budget allocation (config.allocation BUDGET,
 * decision 0059; the model and its determinism are in allocate.h): the
 * table of every gated component's cost and value per level, the exact
 * multiple-choice knapsack over it, and the allocation the plan applies
 * (plan_build.c). The reference method, a partition of the score order
 * with one kappa, is target.c's igrad_target_fit.
 */
#include "plan/allocate.h"
#include "plan/schedule.h"

#include <math.h>
#include <stdlib.h>

int igrad__alloc_levels(int period)
{
    int j = 3 * (period > 0 ? period : 1);
    return j < IGRAD__ALLOC_MAX_LEVELS ? j : IGRAD__ALLOC_MAX_LEVELS;
}

void igrad__alloc_table_free(igrad__alloc_table_t *t)
{
    free(t->gated);
    free(t->cost);
    free(t->value);
    t->gated = NULL;
    t->cost = NULL;
    t->value = NULL;
}

igrad_status_t igrad__alloc_table(const igrad_layout_t *layout, const igrad_profile_t *profile,
                                  const igrad_config_t *config, igrad__alloc_table_t *t)
{
    igrad_status_t st = IGRAD_OK;
    int R = config->release_period, J = igrad__alloc_levels(R);
    size_t C = igrad_layout_component_count(layout), L = (size_t)J + 1;
    *t = (igrad__alloc_table_t){.ncomp = C, .nlev = J + 1};
    double *score = calloc(C ? C : 1, sizeof *score);
    int64_t *ent = calloc((C ? C : 1) * L, sizeof *ent); /* entries per 2R steps */
    t->gated = calloc(C ? C : 1, 1);
    t->cost = calloc((C ? C : 1) * L, sizeof *t->cost);
    t->value = calloc((C ? C : 1) * L, sizeof *t->value);
    IGRAD_FAIL_GOTO(!score || !ent || !t->gated || !t->cost || !t->value, IGRAD_E_NOMEM,
                    "allocation: out of memory");
    for (size_t c = 0; c < C; c++) {
        igrad_component_info_t ci;
        IGRAD_CHECK_GOTO(igrad_layout_component(layout, c, &ci));
        t->gated[c] = (unsigned char)igrad__target_comp_score(profile, &ci, &score[c]);
    }
    for (size_t i = 0; i < igrad_layout_count(layout); i++) {
        igrad_tensor_info_t ti;
        IGRAD_CHECK_GOTO(igrad_layout_tensor(layout, i, &ti));
        igrad_sparsifier_t sp = igrad__target_tensor_sparsifier(config, &ti);
        int64_t n0, n1, b0, b1;
        IGRAD_CHECK_GOTO(igrad__target_tensor_spec(config, sp, &ti, 1.0, 0, &n0, &b0));
        IGRAD_CHECK_GOTO(igrad__target_tensor_spec(config, sp, &ti, 1.0, 1, &n1, &b1));
        int64_t every = (int64_t)R * (b0 + b1);
        t->total += every;
        if (ti.component < 0 || !t->gated[ti.component]) {
            t->forced += every;
            continue;
        }
        size_t row = (size_t)ti.component * L;
        t->cost[row] += every;
        ent[row] += (int64_t)R * (n0 + n1);
        for (int j = 1; j <= J; j++) {
            /* released once per R steps: two releases in 2R steps, one of
             * each parity as target.c averages them */
            double rs = igrad__release_scale(igrad__alloc_level_keep(j), R);
            IGRAD_CHECK_GOTO(igrad__target_tensor_spec(config, sp, &ti, rs, 0, &n0, &b0));
            IGRAD_CHECK_GOTO(igrad__target_tensor_spec(config, sp, &ti, rs, 1, &n1, &b1));
            t->cost[row + (size_t)j] += b0 + b1;
            ent[row + (size_t)j] += n0 + n1;
        }
    }
    for (size_t c = 0; c < C; c++) {
        if (!t->gated[c]) continue;
        double w = (score[c] > 0.0 ? score[c] : 0.0) + IGRAD__ALLOC_EPS;
        int64_t full = ent[c * L];
        t->value[c * L] = w * (double)full;
        for (size_t j = 1; j < L; j++) {
            int64_t got = ent[c * L + j] < full ? ent[c * L + j] : full;
            t->value[c * L + j] = w * (double)got * (1.0 - IGRAD__ALLOC_DELAY);
        }
    }
cleanup:
    free(score);
    free(ent);
    if (st != IGRAD_OK) igrad__alloc_table_free(t);
    return st;
}

int64_t igrad__alloc_budget(const igrad__alloc_table_t *t, double target_ratio)
{
    return (int64_t)floor(target_ratio * (double)t->total) - t->forced;
}

igrad_status_t igrad__alloc_solve(const igrad__alloc_table_t *t, int64_t budget, int *choice,
                                  int *met)
{
    size_t C = t->ncomp, L = (size_t)t->nlev;
    /* the cheapest level of each component (ties: the lower level) */
    int64_t floor_cost = 0;
    for (size_t c = 0; c < C; c++) {
        choice[c] = 0;
        if (!t->gated[c]) continue;
        for (size_t j = 1; j < L; j++)
            if (t->cost[c * L + j] < t->cost[c * L + (size_t)choice[c]]) choice[c] = (int)j;
        floor_cost += t->cost[c * L + (size_t)choice[c]];
    }
    *met = budget >= floor_cost;
    if (!*met) return IGRAD_OK;

    /* slots of q units; costs rounded up, the budget down */
    int64_t q = (budget + IGRAD__ALLOC_SLOTS - 1) / IGRAD__ALLOC_SLOTS;
    if (q < 1) q = 1;
    size_t B = (size_t)(budget / q);
    igrad_status_t st = IGRAD_OK;
    double *dp = malloc((B + 1) * sizeof *dp), *nx = malloc((B + 1) * sizeof *nx);
    unsigned char *pick = malloc((C ? C : 1) * (B + 1));
    IGRAD_FAIL_GOTO(!dp || !nx || !pick, IGRAD_E_NOMEM, "allocation: out of memory");
    /* dp[b]: the best value of the components so far within b slots
     * (-inf: none fits); components in layout order, levels in order, a
     * level replaces the best only when strictly better */
    for (size_t b = 0; b <= B; b++) dp[b] = 0.0;
    for (size_t c = 0; c < C; c++) {
        unsigned char *pk = pick + c * (B + 1);
        if (!t->gated[c]) {
            for (size_t b = 0; b <= B; b++) pk[b] = 0;
            continue;
        }
        for (size_t b = 0; b <= B; b++) {
            double best = -HUGE_VAL;
            unsigned char bj = 0;
            for (size_t j = 0; j < L; j++) {
                int64_t w = (t->cost[c * L + j] + q - 1) / q;
                if (w > (int64_t)b || dp[b - (size_t)w] == -HUGE_VAL) continue;
                double v = dp[b - (size_t)w] + t->value[c * L + j];
                if (v > best) {
                    best = v;
                    bj = (unsigned char)j;
                }
            }
            nx[b] = best;
            pk[b] = bj;
        }
        double *sw = dp;
        dp = nx;
        nx = sw;
    }
    if (dp[B] == -HUGE_VAL) {
        /* the slots' rounding left no room for the cheapest levels, which
         * fit in units: keep them */
        goto cleanup;
    }
    size_t b = B;
    for (size_t c = C; c-- > 0;) {
        if (!t->gated[c]) continue;
        int j = pick[c * (B + 1) + b];
        choice[c] = j;
        b -= (size_t)((t->cost[c * L + (size_t)j] + q - 1) / q);
    }
cleanup:
    free(dp);
    free(nx);
    free(pick);
    return st;
}

igrad_status_t igrad__allocate(const igrad_layout_t *layout, const igrad_profile_t *profile,
                               const igrad_config_t *config, double target_ratio,
                               unsigned char *every, double *keep, double *ratio, int *met)
{
    IGRAD_FAIL_IF(!(target_ratio > 0.0 && target_ratio <= 1.0), IGRAD_E_INVALID,
                  "allocation: target ratio %g (must be in (0, 1])", target_ratio);
    igrad__alloc_table_t t;
    IGRAD_CHECK(igrad__alloc_table(layout, profile, config, &t));
    igrad_status_t st = IGRAD_OK;
    int *choice = calloc(t.ncomp ? t.ncomp : 1, sizeof *choice);
    IGRAD_FAIL_GOTO(!choice, IGRAD_E_NOMEM, "allocation: out of memory");
    IGRAD_CHECK_GOTO(igrad__alloc_solve(&t, igrad__alloc_budget(&t, target_ratio), choice, met));
    size_t L = (size_t)t.nlev;
    int64_t units = t.forced;
    for (size_t c = 0; c < t.ncomp; c++) {
        int j = t.gated[c] ? choice[c] : 0;
        every[c] = (unsigned char)(j == 0);
        keep[c] = j == 0 ? config->release_keep : igrad__alloc_level_keep(j);
        if (t.gated[c]) units += t.cost[c * L + (size_t)j];
    }
    *ratio = t.total > 0 ? (double)units / (double)t.total : 0.0;
cleanup:
    free(choice);
    igrad__alloc_table_free(&t);
    return st;
}
