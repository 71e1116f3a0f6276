/*
 * test_allocate.c — ig's budget allocation (src/plan/allocate.c, decision
 * 0059) against independent references:
 *   - the table: every component's cost and value per level recomputed
 *     here from igrad_select_spec() and the profile's scores;
 *   - the solver: the exact optimum of a brute force over all assignments
 *     (every component at every level) on small layouts and several
 *     budgets: the allocation fits and reaches the same value;
 *   - the plan: an engine with config.allocation BUDGET predicts exactly
 *     the allocation's ratio (igrad_engine_predict_payload over 2R steps,
 *     divided by adtopk_sync's), sends every-step components every step and
 *     releases the others with the budget of their own kappa;
 *   - the default (PARTITION) plan is untouched, and the config checks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "igrad.h"
#include "plan/allocate.h"
#include "plan/schedule.h"
#include "test_util.h"

/* One block (or two) of a small model: rows of 300 keep 3 entries at
 * density 0.01 (ADTopk's per-row rounding), a 48-entry norm below
 * dense_below, K of 40 x 20. Components: EMB, HEAD, NORM, per block NORM,
 * Q, K, V, FC1, FC2. `rows`: of Q and V (300). */
static igrad_layout_t *small_layout(int blocks, int64_t rows)
{
    igrad_layout_t *l = NULL;
    assert_ok(igrad_layout_create(&l));
    int64_t emb[2] = {2 * rows / 3, 300}, sq[2] = {rows, 300}, up[2] = {2 * rows, 300},
            down[2] = {rows, 600},
            vec[1] = {300}, small[2] = {40, 20}, tiny[1] = {48};
    assert_ok(igrad_layout_add(l, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb));
    char name[128];
    for (int b = 0; b < blocks; b++) {
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 1, vec));
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 1, tiny));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, sq));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_proj.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, small));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.v_proj.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, sq));
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, up));
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, down));
    }
    assert_ok(igrad_layout_add(l, "model.layers.0.mlp.mystery.weight", IGRAD_DTYPE_F32, 2, small));
    assert_ok(igrad_layout_add(l, "model.norm.weight", IGRAD_DTYPE_F32, 1, vec));
    assert_ok(igrad_layout_add(l, "lm_head.weight", IGRAD_DTYPE_F32, 2, emb));
    return l;
}

/* Component c's activity 1 + ((c * mul) mod 11), over 4 steps. */
static igrad_profile_t *small_profile(const igrad_layout_t *l, int mul)
{
    igrad_trace_t *t = NULL;
    assert_ok(igrad_trace_create(l, &t));
    assert_ok(igrad_trace_set_sparsifier(t, IGRAD_SPARSIFIER_ADTOPK, 0.01));
    for (int s = 0; s < 4; s++)
        for (size_t i = 0; i < igrad_layout_count(l); i++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(l, i, &ti));
            if (ti.component < 0) continue;
            double a = 1.0 + (double)((ti.component * mul + s) % 11);
            assert_ok(igrad_trace_record(t, s, i, a * a * (double)ti.count, 1));
        }
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    igrad_profile_t *p = NULL;
    assert_ok(igrad_profile_build(t, &opts, &p));
    igrad_trace_free(t);
    return p;
}

static igrad_config_t budget_config(int period, double target)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.release_period = period;
    c.target_ratio = target;
    c.allocation = IGRAD_ALLOCATION_BUDGET;
    c.index_code = IGRAD_INDEX_CODE_FIXED; /* the budget is in fixed-width bytes */
    return c;
}

/* The table recomputed from the public select spec and the profile. */
static void check_table(const igrad_layout_t *l, const igrad_profile_t *p,
                        const igrad_config_t *c, const igrad__alloc_table_t *t)
{
    int R = c->release_period, L = t->nlev;
    assert_int_equal(L, 1 + (3 * R < 20 ? 3 * R : 20));
    size_t C = igrad_layout_component_count(l);
    assert_int_equal(t->ncomp, C);
    int64_t *cost = calloc(C * (size_t)L, sizeof *cost), *ent = calloc(C * (size_t)L, sizeof *ent);
    assert_non_null(cost);
    assert_non_null(ent);
    int64_t total = 0, forced = 0;
    for (size_t i = 0; i < igrad_layout_count(l); i++) {
        igrad_tensor_info_t ti;
        assert_ok(igrad_layout_tensor(l, i, &ti));
        igrad_sparsifier_t sp =
            ti.count < c->dense_below ? IGRAD_SPARSIFIER_NONE : IGRAD_SPARSIFIER_ADTOPK;
        for (int j = 0; j < L; j++) {
            double scale = j == 0 ? 1.0 : (1.0 / j) * (double)R;
            int64_t n = 0, b = 0;
            for (int par = 0; par < 2; par++) {
                igrad_select_spec_t s;
                assert_ok(igrad_select_spec(sp, c->density, scale, 0, par, ti.ndim, ti.shape, &s));
                int64_t range = s.row_wise ? s.cols : s.n;
                n += s.count;
                b += s.count * (4 + (range <= 65536 ? 2 : 4));
            }
            if (j == 0) {
                n *= R;
                b *= R;
                total += b;
            }
            if (ti.component < 0 || !t->gated[ti.component]) {
                if (j == 0) forced += b;
                continue;
            }
            cost[(size_t)ti.component * (size_t)L + (size_t)j] += b;
            ent[(size_t)ti.component * (size_t)L + (size_t)j] += n;
        }
    }
    assert_int_equal(t->total, total);
    assert_int_equal(t->forced, forced);
    for (size_t k = 0; k < igrad_profile_count(p); k++) {
        igrad_profile_entry_t e;
        assert_ok(igrad_profile_entry(p, k, &e));
        for (size_t ci = 0; ci < C; ci++) {
            igrad_component_info_t info;
            assert_ok(igrad_layout_component(l, ci, &info));
            if (info.layer != e.layer || info.kind != e.kind) continue;
            assert_true(t->gated[ci]);
            for (int j = 0; j < L; j++) {
                size_t at = ci * (size_t)L + (size_t)j;
                int64_t full = ent[ci * (size_t)L];
                int64_t got = ent[at] < full ? ent[at] : full;
                double v = (e.score + 1e-6) * (double)got * (j ? 1.0 - 1.0 / 1024.0 : 1.0);
                assert_int_equal(t->cost[at], cost[at]);
                assert_true(t->value[at] == v);
            }
        }
    }
    free(cost);
    free(ent);
}

/* The best value of any assignment within `budget` (exhaustive; levels
 * as an odometer over the gated components). */
static double brute_force(const igrad__alloc_table_t *t, int64_t budget)
{
    size_t C = t->ncomp, L = (size_t)t->nlev, G = 0;
    size_t idx[32];
    for (size_t c = 0; c < C; c++)
        if (t->gated[c]) idx[G++] = c;
    assert_true(G <= 32);
    int lev[32] = {0};
    double best = -1.0;
    for (;;) {
        int64_t cost = 0;
        double v = 0.0;
        for (size_t g = 0; g < G; g++) {
            cost += t->cost[idx[g] * L + (size_t)lev[g]];
            v += t->value[idx[g] * L + (size_t)lev[g]];
        }
        if (cost <= budget && v > best) best = v;
        size_t g = 0;
        while (g < G && ++lev[g] == (int)L) lev[g++] = 0;
        if (g == G) break;
    }
    return best;
}

static void check_solver(const igrad_layout_t *l, const igrad_profile_t *p, int period)
{
    igrad_config_t c = budget_config(period, 0.25);
    igrad__alloc_table_t t;
    assert_ok(igrad__alloc_table(l, p, &c, &t));
    check_table(l, p, &c, &t);
    int *choice = calloc(t.ncomp, sizeof *choice);
    assert_non_null(choice);
    size_t L = (size_t)t.nlev;
    int nmet = 0;
    double targets[20];
    for (int k = 0; k < 20; k++) targets[k] = 0.05 * (k + 1);
    for (size_t k = 0; k < sizeof targets / sizeof *targets; k++) {
        int64_t budget = igrad__alloc_budget(&t, targets[k]);
        if (budget >= IGRAD__ALLOC_SLOTS) continue; /* one unit per slot: exact */
        int met = -1;
        assert_ok(igrad__alloc_solve(&t, budget, choice, &met));
        double want = brute_force(&t, budget);
        int64_t cost = 0;
        double v = 0.0;
        for (size_t ci = 0; ci < t.ncomp; ci++) {
            if (!t.gated[ci]) {
                assert_int_equal(choice[ci], 0);
                continue;
            }
            cost += t.cost[ci * L + (size_t)choice[ci]];
            v += t.value[ci * L + (size_t)choice[ci]];
        }
        if (want < 0.0) {
            assert_int_equal(met, 0);
            continue;
        }
        assert_int_equal(met, 1);
        nmet++;
        if (cost > budget) fail_msg("R %d target %g: cost %lld over budget %lld", period,
                                    targets[k], (long long)cost, (long long)budget);
        if (!(v >= want * (1.0 - 1e-12)))
            fail_msg("R %d target %g: value %.17g, the brute force finds %.17g", period,
                     targets[k], v, want);
    }
    assert_true(nmet >= 5);
    free(choice);
    igrad__alloc_table_free(&t);
}

static void test_solver_brute_force(void **state)
{
    (void)state;
    igrad_layout_t *l1 = small_layout(1, 60); /* budgets below the slots */
    igrad_profile_t *p1 = small_profile(l1, 7), *p2 = small_profile(l1, 3);
    check_solver(l1, p1, 1); /* 4 levels, 9 components */
    check_solver(l1, p2, 1);
    igrad_profile_free(p1);
    igrad_profile_free(p2);
    igrad_layout_free(l1);
}

static double mean_payload(const igrad_layout_t *l, const igrad_profile_t *p,
                           const igrad_config_t *c)
{
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create_plan(l, p, c, 2, &e));
    int steps = 2 * c->release_period;
    double sum = 0.0;
    for (int s = 0; s < steps; s++) sum += (double)igrad_engine_predict_payload(e, s);
    igrad_engine_free(e);
    return sum / steps;
}

/* The engine plans what the allocation says, byte for byte. */
static void check_engine(const igrad_layout_t *l, const igrad_profile_t *p, int period,
                         double target)
{
    igrad_config_t c = budget_config(period, target);
    size_t C = igrad_layout_component_count(l);
    unsigned char *every = calloc(C, 1);
    double *keep = calloc(C, sizeof *keep), ratio = 0.0;
    assert_non_null(every);
    assert_non_null(keep);
    int met = 0;
    assert_ok(igrad__allocate(l, p, &c, target, every, keep, &ratio, &met));
    igrad_config_t sync = IGRAD_CONFIG_INIT;
    sync.method = IGRAD_METHOD_ADTOPK_SYNC;
    sync.index_code = IGRAD_INDEX_CODE_FIXED;
    double base = mean_payload(l, NULL, &sync);
    double got = mean_payload(l, p, &c) / base;
    if (got != ratio) fail_msg("R %d target %g: engine %.17g, allocation %.17g", period, target,
                               got, ratio);
    if (met) assert_true(ratio <= target);
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create_plan(l, p, &c, 2, &e));
    int deferred = 0;
    for (size_t i = 0; i < igrad_layout_count(l); i++) {
        igrad_tensor_plan_t tp;
        igrad_tensor_info_t ti;
        assert_ok(igrad_engine_tensor_plan(e, i, &tp));
        assert_ok(igrad_layout_tensor(l, i, &ti));
        if (ti.component < 0) {
            assert_int_equal(tp.every_step, 1);
            continue;
        }
        assert_int_equal(tp.every_step, every[ti.component]);
        if (every[ti.component]) continue;
        deferred++;
        igrad_select_spec_t s;
        igrad_sparsifier_t sp =
            ti.count < c.dense_below ? IGRAD_SPARSIFIER_NONE : IGRAD_SPARSIFIER_ADTOPK;
        assert_ok(igrad_select_spec(sp, c.density, keep[ti.component] * (double)period, 0, 0,
                                    ti.ndim, ti.shape, &s));
        assert_int_equal(tp.release_count, s.count);
    }
    if (target < 0.5) assert_true(deferred > 0);
    igrad_engine_free(e);
    free(every);
    free(keep);
}

static void test_engine_plans_the_allocation(void **state)
{
    (void)state;
    igrad_layout_t *l = small_layout(2, 300);
    igrad_profile_t *p = small_profile(l, 7);
    static const double targets[] = {0.1, 0.25, 0.4, 0.7};
    for (int R = 1; R <= 4; R *= 2)
        for (size_t k = 0; k < sizeof targets / sizeof *targets; k++)
            check_engine(l, p, R, targets[k]);
    /* more levels than slots: a budget cut into slots still fits */
    igrad__alloc_table_t t;
    igrad_config_t c = budget_config(4, 0.25);
    assert_ok(igrad__alloc_table(l, p, &c, &t));
    int64_t budget = igrad__alloc_budget(&t, 0.25);
    int *choice = calloc(t.ncomp, sizeof *choice);
    assert_non_null(choice);
    int met = 0;
    assert_ok(igrad__alloc_solve(&t, budget, choice, &met));
    assert_int_equal(met, 1);
    assert_true(budget > IGRAD__ALLOC_SLOTS);
    int64_t cost = 0;
    for (size_t ci = 0; ci < t.ncomp; ci++)
        if (t.gated[ci]) cost += t.cost[ci * (size_t)t.nlev + (size_t)choice[ci]];
    assert_true(cost <= budget);
    assert_true(cost > budget - (int64_t)t.ncomp * (budget / IGRAD__ALLOC_SLOTS + 1) -
                           t.cost[0]); /* within the slots' rounding of full */
    free(choice);
    igrad__alloc_table_free(&t);
    igrad_profile_free(p);
    igrad_layout_free(l);
}

/* Slots of q units: costs rounded up, so that no choice overspends. Three
 * components of 13334 units (4444.67 slots of 3) in a budget of 40000: all
 * three at level 0 would be 40002. */
static void test_slots_never_overspend(void **state)
{
    (void)state;
    unsigned char gated[3] = {1, 1, 1};
    int64_t cost[6] = {13334, 1, 13334, 1, 13334, 1};
    double value[6] = {10.0, 1.0, 10.0, 1.0, 10.0, 1.0};
    igrad__alloc_table_t t = {.ncomp = 3, .nlev = 2, .gated = gated, .cost = cost,
                              .value = value, .forced = 0, .total = 40002};
    int choice[3], met = 0;
    assert_ok(igrad__alloc_solve(&t, 40000, choice, &met));
    assert_int_equal(met, 1);
    int64_t used = 0;
    for (int c = 0; c < 3; c++) used += cost[2 * c + choice[c]];
    assert_true(used <= 40000);
    assert_int_equal(used, 13334 + 13334 + 1); /* the best that fits */
    /* ties go to the first (lower) level, the same on every call */
    int64_t tie_cost[4] = {5, 5, 5, 5};
    double tie_value[4] = {1.0, 1.0, 1.0, 1.0};
    igrad__alloc_table_t u = {.ncomp = 2, .nlev = 2, .gated = gated, .cost = tie_cost,
                              .value = tie_value, .forced = 0, .total = 10};
    assert_ok(igrad__alloc_solve(&u, 10, choice, &met));
    assert_int_equal(choice[0], 0);
    assert_int_equal(choice[1], 0);
}

static void test_config_and_default(void **state)
{
    (void)state;
    igrad_layout_t *l = small_layout(1, 300);
    igrad_profile_t *p = small_profile(l, 7);
    igrad_config_t c = IGRAD_CONFIG_INIT;
    assert_int_equal(c.allocation, IGRAD_ALLOCATION_PARTITION);
    c.allocation = (igrad_allocation_t)2;
    assert_status(igrad_config_validate(&c), IGRAD_E_INVALID);
    assert_error_has("config.allocation is 2");
    c.allocation = IGRAD_ALLOCATION_BUDGET;
    assert_ok(igrad_config_validate(&c));
    c.topology = IGRAD_TOPOLOGY_HIER;
    assert_status(igrad_config_validate(&c), IGRAD_E_UNSUPPORTED);
    assert_error_has("topology flat");
    /* PARTITION with a target, or BUDGET without one: the profile's own
     * classes at release_keep, as before */
    igrad_config_t a = IGRAD_CONFIG_INIT, b = IGRAD_CONFIG_INIT;
    a.target_ratio = 0.25;
    b.allocation = IGRAD_ALLOCATION_BUDGET;
    igrad_config_t base = IGRAD_CONFIG_INIT;
    double m0 = mean_payload(l, p, &base);
    assert_true(mean_payload(l, p, &a) == m0);
    assert_true(mean_payload(l, p, &b) == m0);
    igrad_profile_free(p);
    igrad_layout_free(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_solver_brute_force),
        cmocka_unit_test(test_engine_plans_the_allocation),
        cmocka_unit_test(test_slots_never_overspend),
        cmocka_unit_test(test_config_and_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
