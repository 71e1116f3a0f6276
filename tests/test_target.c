/*
 * test_target.c — igrad_target_fit (src/target.c) against a brute force
 * that uses the engine's own plan: for every prefix of components by score
 * (ties kept together) and a grid of kappas, an ig engine is built and its
 * igrad_engine_predict_payload() averaged over 2R steps, divided by an
 * adtopk_sync engine's. The fit must pick the longest prefix that meets the
 * target at the smallest kappa, then a kappa no grid point beats, and its
 * planned ratio must equal the engine's. Also: an unreachable target
 * (met = 0) and argument errors.
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
#include "test_util.h"

/* Rows of 300 entries keep 3 at density 0.01 (ADTopk per-row rounding
 * matters), 1-D norms use flat top-k, but those of 48 entries (and the
 * 6 x 8 bias) are below the default dense_below and sent whole. */
static igrad_layout_t *target_layout(void)
{
    igrad_layout_t *l = NULL;
    assert_ok(igrad_layout_create(&l));
    int64_t emb[2] = {200, 300}, sq[2] = {300, 300}, up[2] = {600, 300}, down[2] = {300, 600},
            vec[1] = {300}, small[2] = {40, 20}, tiny[1] = {48}, bias[2] = {6, 8};
    assert_ok(igrad_layout_add(l, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb));
    char name[128];
    for (int b = 0; b < 2; b++) {
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 1, vec));
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 1, tiny));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, sq));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.bias", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, bias));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_proj.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, small));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.v_proj.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, sq));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.o_proj.weight", b);
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

/* Component c has activity 1 + (7c mod 11): distinct scores but for a few
 * ties (c and c + 11), which the fit must keep together. */
static igrad_profile_t *target_profile(const igrad_layout_t *l)
{
    igrad_trace_t *t = NULL;
    assert_ok(igrad_trace_create(l, &t));
    assert_ok(igrad_trace_set_sparsifier(t, IGRAD_SPARSIFIER_ADTOPK, 0.01));
    for (int s = 0; s < 4; s++)
        for (size_t i = 0; i < igrad_layout_count(l); i++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(l, i, &ti));
            if (ti.component < 0) continue;
            double a = 1.0 + (double)((ti.component * 7) % 11);
            assert_ok(igrad_trace_record(t, s, i, a * a * (double)ti.count, 1));
        }
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    igrad_profile_t *p = NULL;
    assert_ok(igrad_profile_build(t, &opts, &p));
    igrad_trace_free(t);
    return p;
}

static double mean_payload(const igrad_layout_t *l, const igrad_profile_t *p,
                           const igrad_config_t *c)
{
    igrad_comm_t *comm = NULL;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    assert_ok(igrad_engine_create(l, p, c, comm, &e));
    int steps = 2 * c->release_period;
    double sum = 0.0;
    for (int s = 0; s < steps; s++) sum += (double)igrad_engine_predict_payload(e, s);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    return sum / steps;
}

/* The engine's ratio with tau and kappa applied. */
static double engine_ratio(const igrad_layout_t *l, igrad_profile_t *p, double tau,
                           double keep, double base)
{
    assert_ok(igrad_profile_set_threshold(p, tau));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.release_keep = keep;
    /* the target is a ratio of fixed-width bytes (decision 0056): the
     * same kappa and phases under either index code */
    c.index_code = IGRAD_INDEX_CODE_FIXED;
    return mean_payload(l, p, &c) / base;
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

static void check_against_brute_force(double target)
{
    igrad_layout_t *l = target_layout();
    igrad_profile_t *p = target_profile(l);
    igrad_config_t sync = IGRAD_CONFIG_INIT;
    sync.method = IGRAD_METHOD_ADTOPK_SYNC;
    sync.index_code = IGRAD_INDEX_CODE_FIXED;
    double base = mean_payload(l, NULL, &sync);

    /* the distinct scores of the gated components, highest first */
    size_t n = igrad_profile_count(p), ns = 0;
    double *sc = calloc(n, sizeof *sc);
    assert_non_null(sc);
    for (size_t i = 0; i < n; i++) {
        igrad_profile_entry_t e;
        assert_ok(igrad_profile_entry(p, i, &e));
        sc[ns++] = e.score;
    }
    size_t ngated = ns;
    qsort(sc, ns, sizeof *sc, cmp_desc);
    size_t nd = 0;
    for (size_t i = 0; i < ns; i++)
        if (nd == 0 || sc[nd - 1] != sc[i]) sc[nd++] = sc[i];

    /* brute force: prefixes by distinct score (tau = that score; the
     * empty prefix tau = 2 > every score) at the smallest kappa */
    double kmin = IGRAD_TARGET_MIN_KEEP;
    long best = -1;
    double best_tau = 2.0;
    for (long k = 0; k <= (long)nd; k++) {
        double tau = k == 0 ? 2.0 : sc[k - 1];
        if (engine_ratio(l, p, tau, kmin, base) <= target) {
            best = k;
            best_tau = tau;
        }
    }

    igrad_config_t ig = IGRAD_CONFIG_INIT;
    igrad_target_fit_t fit;
    assert_ok(igrad_target_fit(l, p, &ig, target, kmin, &fit));
    assert_int_equal(fit.n_gated, ngated);
    if (best < 0) {
        assert_int_equal(fit.met, 0);
        assert_int_equal(fit.n_important, 0);
        assert_near(fit.release_keep, kmin, 0);
    } else {
        assert_int_equal(fit.met, 1);
        /* the same prefix: its important count and threshold */
        assert_ok(igrad_profile_set_threshold(p, best_tau));
        size_t want_imp = 0;
        for (size_t i = 0; i < n; i++) {
            igrad_profile_entry_t e;
            assert_ok(igrad_profile_entry(p, i, &e));
            if (e.important) want_imp++;
        }
        assert_int_equal(fit.n_important, want_imp);
        if (best > 0) assert_near(fit.tau, best_tau, 0);
        /* meets the target on the engine's plan, and says so exactly */
        double got = engine_ratio(l, p, fit.tau, fit.release_keep, base);
        assert_true(got <= target);
        assert_near(fit.ratio, got, 1e-12);
        /* no grid kappa above the chosen one meets it */
        for (int g = 0; g <= 40; g++) {
            double keep = kmin + (1.0 - kmin) * g / 40.0;
            if (keep <= fit.release_keep + 1e-9) continue;
            double r = engine_ratio(l, p, fit.tau, keep, base);
            if (r <= target)
                fail_msg("target %g: kappa %g meets it (%.6f) above the chosen %g", target,
                         keep, r, fit.release_keep);
        }
        assert_near(fit.model_ratio, fit.f_imp + fit.release_keep * (1.0 - fit.f_imp), 1e-15);
    }
    free(sc);
    igrad_profile_free(p);
    igrad_layout_free(l);
}

static void test_fit_brute_force(void **state)
{
    (void)state;
    static const double targets[] = {0.1, 0.25, 0.4, 0.7};
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++) {
        check_against_brute_force(targets[i]);
    }
}

static void test_fit_unreachable_and_errors(void **state)
{
    (void)state;
    igrad_layout_t *l = target_layout();
    igrad_profile_t *p = target_profile(l);
    igrad_config_t c = IGRAD_CONFIG_INIT;
    igrad_target_fit_t fit;
    /* 1% of the payload: even everything deferred at kappa 0.05 sends more
     * (rows of 3 release at least one entry per row per R steps) */
    assert_ok(igrad_target_fit(l, p, &c, 0.01, IGRAD_TARGET_MIN_KEEP, &fit));
    assert_int_equal(fit.met, 0);
    assert_int_equal(fit.n_important, 0);
    assert_true(fit.ratio > 0.01);
    /* kappa 1 and everything important: ratio 1 */
    assert_ok(igrad_target_fit(l, p, &c, 1.0, IGRAD_TARGET_MIN_KEEP, &fit));
    assert_int_equal(fit.met, 1);
    assert_int_equal(fit.n_important, fit.n_gated);
    assert_near(fit.ratio, 1.0, 1e-12);
    assert_int_equal(igrad_target_fit(l, p, &c, 0.0, 0.05, &fit), IGRAD_E_INVALID);
    assert_error_has("target ratio 0");
    assert_int_equal(igrad_target_fit(l, p, &c, 0.25, 0.0, &fit), IGRAD_E_INVALID);
    assert_error_has("min_keep 0");
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    assert_int_equal(igrad_target_fit(l, p, &c, 0.25, 0.05, &fit), IGRAD_E_INVALID);
    assert_error_has("needs ig");
    assert_int_equal(igrad_profile_set_threshold(p, NAN), IGRAD_E_INVALID);
    igrad_profile_free(p);
    igrad_layout_free(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fit_brute_force),
        cmocka_unit_test(test_fit_unreachable_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
