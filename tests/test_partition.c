/*
 * test_partition.c — the partition methods of src/partition.c: each method
 * on clearly bimodal score sets and on all-equal sets, hand-computed knee,
 * otsu, percentile and fixed values, kmeans2 and otsu against brute-force
 * references, gmm2 on a sampled mixture with known parameters, and the
 * method-string errors. Profiles and traces are tested in test_profile.c
 * and test_trace.c.
 */
#include <math.h>
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
#include "profile/profile_internal.h"

/* Fails printing both values when |a - b| > tol. */
/* Fails unless igrad_last_error() contains `frag`. */
static double tau_of(const double *x, size_t n, const char *method)
{
    double tau = NAN;
    igrad_status_t st = igrad_partition(x, n, method, &tau);
    if (st != IGRAD_OK) {
        print_error("igrad_partition(%s): %s\n", method, igrad_last_error());
        fail();
    }
    return tau;
}

static size_t count_at_least(const double *x, size_t n, double tau)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += x[i] >= tau;
    return k;
}

/* Deterministic generator (64-bit LCG, top bits) so no test depends on a
 * libc's rand(). */
static uint64_t lcg_state;
static double uniform01(void)
{
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return ((double)(lcg_state >> 11) + 0.5) / 9007199254740992.0;
}
static double normal01(void)
{
    double u = uniform01(), v = uniform01();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static const char *const SPLIT_METHODS[] = {"knee", "otsu", "kmeans2", "gmm2"};

/* 12 high scores 0.80..0.91 and 8 low ones 0.05..0.12, interleaved. With
 * the high mode in the majority the knee's farthest point is the last high
 * score, so every method must put exactly the 12 high ones at or above tau. */
static void test_bimodal_majority_high(void **state)
{
    (void)state;
    double x[20];
    size_t n = 0;
    for (int i = 0; i < 12; i++) x[n++] = 0.80 + 0.01 * i;
    for (int i = 0; i < 8; i++) x[n++] = 0.05 + 0.01 * i;
    /* shuffle deterministically: methods must not depend on input order */
    lcg_state = 7;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(uniform01() * (double)(i + 1));
        double t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
    for (size_t m = 0; m < sizeof SPLIT_METHODS / sizeof *SPLIT_METHODS; m++) {
        double tau = tau_of(x, n, SPLIT_METHODS[m]);
        if (!(tau > 0.12 && tau <= 0.80)) {
            print_error("%s: tau %.17g not in (0.12, 0.80]\n", SPLIT_METHODS[m], tau);
            fail();
        }
        assert_int_equal(count_at_least(x, n, tau), 12);
    }
    /* knee, otsu and kmeans2 return a score: the smallest high one. */
    assert_near(tau_of(x, n, "knee"), 0.80, 0);
    assert_near(tau_of(x, n, "otsu"), 0.80, 0);
    assert_near(tau_of(x, n, "kmeans2"), 0.80, 0);
    /* percentile:40: rank 0.4 * 19 = 7.6, between the sorted 7th (0.12) and
     * 8th (0.80) values: 0.12 + 0.6 * 0.68 = 0.528. */
    double tp = tau_of(x, n, "percentile:40");
    assert_near(tp, 0.528, 1e-12);
    assert_int_equal(count_at_least(x, n, tp), 12);
    /* fixed:0.6: m = ceil(0.6 * 20) = 12, tau = 12th largest = 0.80. */
    assert_near(tau_of(x, n, "fixed:0.6"), 0.80, 0);
}

/* 4 high (0.9..0.93) and 16 low (0.05..0.20) scores: otsu, kmeans2 and
 * gmm2 split between the modes. The knee does not, by its definition: in
 * normalised coordinates the last high point (3/19, ~1) is 3/19 from the
 * chord u + v = 1, the first low point (4/19, ~0.1) about 0.69 of it, so
 * tau is the highest low score (0.20) and 5 components are important. */
static void test_bimodal_minority_high(void **state)
{
    (void)state;
    double x[20];
    size_t n = 0;
    for (int i = 0; i < 16; i++) x[n++] = 0.05 + 0.01 * i;
    for (int i = 0; i < 4; i++) x[n++] = 0.90 + 0.01 * i;
    for (size_t m = 1; m < sizeof SPLIT_METHODS / sizeof *SPLIT_METHODS; m++) {
        double tau = tau_of(x, n, SPLIT_METHODS[m]);
        if (!(tau > 0.20 && tau <= 0.90)) {
            print_error("%s: tau %.17g not in (0.20, 0.90]\n", SPLIT_METHODS[m], tau);
            fail();
        }
        assert_int_equal(count_at_least(x, n, tau), 4);
    }
    double tk = tau_of(x, n, "knee");
    assert_near(tk, 0.20, 1e-15);
    assert_int_equal(count_at_least(x, n, tk), 5);
}

static void test_all_equal(void **state)
{
    (void)state;
    static const char *const methods[] = {"knee", "otsu", "kmeans2", "gmm2", "percentile:0",
                                          "percentile:37.5", "percentile:100", "fixed:0.01",
                                          "fixed:0.5", "fixed:1"};
    double x[7] = {0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4};
    for (size_t m = 0; m < sizeof methods / sizeof *methods; m++) {
        for (size_t n = 1; n <= 7; n += 3) {
            double tau = tau_of(x, n, methods[m]);
            assert_near(tau, 0.4, 0);
            assert_int_equal(count_at_least(x, n, tau), n);
        }
    }
    /* n = 1 with any value */
    double one = 0.123;
    for (size_t m = 0; m < sizeof methods / sizeof *methods; m++) {
        assert_near(tau_of(&one, 1, methods[m]), 0.123, 0);
    }
}

static void test_knee_by_hand(void **state)
{
    (void)state;
    /* Descending 1, .5, .3, .2, 0 at u = 0, .25, .5, .75, 1 (v = score):
     * |u + v - 1| = 0, .25, .2, .05, 0 -> the second point, tau = 0.5. */
    double a[5] = {0.3, 1.0, 0.0, 0.5, 0.2};
    assert_near(tau_of(a, 5, "knee"), 0.5, 0);
    /* A straight line: every point lies on the chord, all distances are 0
     * and the tie goes to the first point, the maximum. */
    double b[5] = {0.0, 0.25, 0.5, 0.75, 1.0};
    assert_near(tau_of(b, 5, "knee"), 1.0, 0);
    /* A point above the chord counts by its distance too: 1, .9, .8, 0 at
     * u = 0, 1/3, 2/3, 1: distances 0, .2333, .4667, 0 -> tau = 0.8. */
    double c[4] = {0.9, 0.0, 1.0, 0.8};
    assert_near(tau_of(c, 4, "knee"), 0.8, 0);
    /* Scores not in [0, 1]: normalisation makes the knee scale-free. */
    double d[5] = {30, 100, 0, 50, 20};
    assert_near(tau_of(d, 5, "knee"), 50, 0);
}

static void test_percentile_and_fixed_by_hand(void **state)
{
    (void)state;
    double x[4] = {0.8, 0.1, 0.4, 0.2}; /* sorted: .1 .2 .4 .8 */
    assert_near(tau_of(x, 4, "percentile:0"), 0.1, 0);
    assert_near(tau_of(x, 4, "percentile:100"), 0.8, 0);
    assert_near(tau_of(x, 4, "percentile:50"), 0.3, 1e-15);   /* rank 1.5 */
    assert_near(tau_of(x, 4, "percentile:25"), 0.175, 1e-15); /* rank .75 */
    assert_near(tau_of(x, 4, "percentile:90"), 0.68, 1e-15);  /* rank 2.7 */
    assert_near(tau_of(x, 4, "fixed:0.5"), 0.4, 0);           /* m = 2 */
    assert_near(tau_of(x, 4, "fixed:0.51"), 0.2, 0);          /* m = ceil(2.04) = 3 */
    assert_near(tau_of(x, 4, "fixed:0.01"), 0.8, 0);          /* m = max(1, 1) */
    assert_near(tau_of(x, 4, "fixed:1"), 0.1, 0);             /* all */
    /* 0.07 * 100 is 7.000000000000001 in binary: still 7 components. */
    double y[100];
    for (int i = 0; i < 100; i++) y[i] = i;
    assert_near(tau_of(y, 100, "fixed:0.07"), 93, 0);
    assert_int_equal(count_at_least(y, 100, tau_of(y, 100, "fixed:0.07")), 7);
    assert_near(tau_of(y, 100, "fixed:0.071"), 92, 0); /* ceil(7.1) = 8 */
}

static void test_otsu_by_hand(void **state)
{
    (void)state;
    /* Scores 0, .3, .6, 1 fall in bins 0, 76, 153, 255 (floor(s * 256),
     * the maximum in the last bin). Between-class n0 n1 (mu0 - mu1)^2 with
     * bin levels: {0}|rest 1*3*161.33^2 = 78085; {0,76}|{153,255}
     * 2*2*166^2 = 110224; {0,76,153}|{255} 3*178.67^2 = 95765. The middle
     * split wins: tau = 0.6. */
    double x[4] = {1.0, 0.3, 0.0, 0.6};
    assert_near(tau_of(x, 4, "otsu"), 0.6, 0);
    /* Binning: 0 and 0.003 share bin 0 (0.003 * 256 = 0.77), so otsu cannot
     * separate them however the rest lies; kmeans2 can. Scores 0, 0.003,
     * 1, 1: kmeans2 {0, .003}|{1, 1}; otsu the same bins -> both 1.0. With
     * 0, 0.003, 0.0035 (bin 0) and 1: kmeans2 still puts 1 alone. */
    double y[4] = {0.0, 0.003, 0.0035, 1.0};
    assert_near(tau_of(y, 4, "otsu"), 1.0, 0);
    assert_near(tau_of(y, 4, "kmeans2"), 1.0, 0);
}

/* Brute-force kmeans2: every split of the sorted values, SSE by two passes. */
static double kmeans2_reference(const double *x, size_t n)
{
    double *s = malloc(n * sizeof *s);
    memcpy(s, x, n * sizeof *s);
    for (size_t i = 1; i < n; i++) { /* insertion sort: independent of qsort */
        double v = s[i];
        size_t j = i;
        while (j > 0 && s[j - 1] > v) {
            s[j] = s[j - 1];
            j--;
        }
        s[j] = v;
    }
    double best = INFINITY, tau = s[n - 1];
    for (size_t k = 1; k < n; k++) {
        if (s[k - 1] == s[k]) continue;
        double m0 = 0, m1 = 0, sse = 0;
        for (size_t i = 0; i < k; i++) m0 += s[i];
        for (size_t i = k; i < n; i++) m1 += s[i];
        m0 /= (double)k;
        m1 /= (double)(n - k);
        for (size_t i = 0; i < k; i++) sse += (s[i] - m0) * (s[i] - m0);
        for (size_t i = k; i < n; i++) sse += (s[i] - m1) * (s[i] - m1);
        if (sse < best - 1e-12) {
            best = sse;
            tau = s[k];
        }
    }
    free(s);
    return tau;
}

/* Brute-force Otsu on the same histogram definition: for every boundary,
 * class means recomputed from the values' bin levels. */
static double otsu_reference(const double *x, size_t n)
{
    double lo = x[0], hi = x[0];
    for (size_t i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    if (hi == lo) return lo;
    double best = -1;
    int best_t = 1;
    for (int t = 1; t < 256; t++) {
        double s0 = 0, s1 = 0;
        size_t n0 = 0, n1 = 0;
        for (size_t i = 0; i < n; i++) {
            int b = (int)((x[i] - lo) / (hi - lo) * 256);
            if (b > 255) b = 255;
            if (b < t) {
                s0 += b;
                n0++;
            } else {
                s1 += b;
                n1++;
            }
        }
        if (!n0 || !n1) continue;
        double d = s0 / (double)n0 - s1 / (double)n1;
        double v = (double)n0 * (double)n1 * d * d;
        if (v > best * (1 + 1e-12)) {
            best = v;
            best_t = t;
        }
    }
    double tau = INFINITY;
    for (size_t i = 0; i < n; i++) {
        int b = (int)((x[i] - lo) / (hi - lo) * 256);
        if (b > 255) b = 255;
        if (b >= best_t && x[i] < tau) tau = x[i];
    }
    return tau;
}

static void test_kmeans2_and_otsu_against_brute_force(void **state)
{
    (void)state;
    lcg_state = 12345;
    double x[64];
    for (int trial = 0; trial < 200; trial++) {
        size_t n = 2 + (size_t)(uniform01() * 62);
        for (size_t i = 0; i < n; i++) {
            /* mixtures of a few clusters, some values repeated */
            double c = (double)(int)(uniform01() * 3) * 0.3;
            x[i] = uniform01() < 0.1 && i ? x[i - 1] : c + 0.1 * uniform01();
        }
        assert_near(tau_of(x, n, "kmeans2"), kmeans2_reference(x, n), 0);
        assert_near(tau_of(x, n, "otsu"), otsu_reference(x, n), 0);
    }
}

/* The point between m0 and m1 where w0 N(m0, s0) = w1 N(m1, s1), by
 * bisection on the log ratio (independent of the library's quadratic). */
static double boundary_reference(double w0, double m0, double s0, double w1, double m1,
                                 double s1)
{
    double a = m0, b = m1;
    for (int i = 0; i < 200; i++) {
        double x = 0.5 * (a + b);
        double l0 = log(w0) - log(s0) - (x - m0) * (x - m0) / (2 * s0 * s0);
        double l1 = log(w1) - log(s1) - (x - m1) * (x - m1) / (2 * s1 * s1);
        if (l0 > l1) a = x;
        else b = x;
    }
    return 0.5 * (a + b);
}

static void test_gmm2_known_mixture(void **state)
{
    (void)state;
    enum { N0 = 600, N1 = 300 };
    static double x[N0 + N1];
    lcg_state = 2024;
    for (int i = 0; i < N0; i++) x[i] = 0.25 + 0.05 * normal01();
    for (int i = 0; i < N1; i++) x[N0 + i] = 0.70 + 0.06 * normal01();
    igrad__gmm2_fit_t fit;
    assert_int_equal(igrad__gmm2_fit(x, N0 + N1, &fit), IGRAD_OK);
    /* Sampling error of a mean of 300 draws with sd 0.06 is 0.0035. */
    assert_near(fit.mean[0], 0.25, 0.015);
    assert_near(fit.mean[1], 0.70, 0.015);
    assert_near(sqrt(fit.var[0]), 0.05, 0.01);
    assert_near(sqrt(fit.var[1]), 0.06, 0.01);
    assert_near(fit.weight[0], 2.0 / 3.0, 0.03);
    assert_near(fit.weight[1], 1.0 / 3.0, 0.03);
    double tau = tau_of(x, N0 + N1, "gmm2");
    double truth = boundary_reference(2.0 / 3.0, 0.25, 0.05, 1.0 / 3.0, 0.70, 0.06);
    assert_near(tau, truth, 0.02);
    /* tau is where the fitted posteriors are equal. */
    double l0 = log(fit.weight[0]) - 0.5 * log(fit.var[0]) -
                (tau - fit.mean[0]) * (tau - fit.mean[0]) / (2 * fit.var[0]);
    double l1 = log(fit.weight[1]) - 0.5 * log(fit.var[1]) -
                (tau - fit.mean[1]) * (tau - fit.mean[1]) / (2 * fit.var[1]);
    assert_near(l0, l1, 1e-8);
    /* Deterministic: same data, same tau. */
    assert_near(tau_of(x, N0 + N1, "gmm2"), tau, 0);
}

static void test_bad_methods(void **state)
{
    (void)state;
    double x[3] = {0.1, 0.5, 0.9}, tau = -1;
    static const struct {
        const char *method, *frag;
    } bad[] = {{"elbow", "unknown partition method 'elbow'"},
               {"Knee", "unknown partition method 'Knee'"},
               {"", "unknown partition method ''"},
               {"percentile:", "'percentile:'"},
               {"percentile:abc", "'percentile:abc'"},
               {"percentile:101", "[0, 100]"},
               {"percentile:-1", "[0, 100]"},
               {"percentile:50x", "'percentile:50x'"},
               {"fixed:0", "(0, 1]"},
               {"fixed:1.5", "(0, 1]"},
               {"fixed:nan", "'fixed:nan'"},
               {"fixed:inf", "'fixed:inf'"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(igrad_partition(x, 3, bad[i].method, &tau), IGRAD_E_INVALID);
        assert_error_has(bad[i].frag);
        assert_near(tau, -1, 0); /* untouched on failure */
    }
    /* An unknown method is refused even when the scores are all equal. */
    double e[2] = {0.3, 0.3};
    assert_int_equal(igrad_partition(e, 2, "elbow", &tau), IGRAD_E_INVALID);
    assert_int_equal(igrad_partition(x, 3, NULL, &tau), IGRAD_E_INVALID);
    assert_int_equal(igrad_partition(x, 0, "knee", &tau), IGRAD_E_INVALID);
    assert_error_has("no scores");
    double nanx[3] = {0.1, NAN, 0.3};
    assert_int_equal(igrad_partition(nanx, 3, "knee", &tau), IGRAD_E_INVALID);
    assert_error_has("score 1 is not finite");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bimodal_majority_high),
        cmocka_unit_test(test_bimodal_minority_high),
        cmocka_unit_test(test_all_equal),
        cmocka_unit_test(test_knee_by_hand),
        cmocka_unit_test(test_percentile_and_fixed_by_hand),
        cmocka_unit_test(test_otsu_by_hand),
        cmocka_unit_test(test_kmeans2_and_otsu_against_brute_force),
        cmocka_unit_test(test_gmm2_known_mixture),
        cmocka_unit_test(test_bad_methods),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
