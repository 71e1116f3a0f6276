/*
 * test_schedule.c — unit tests of the release schedule (src/schedule.c):
 * schedule names, aligned phases against the reference semantics (sent at
 * steps R-1, 2R-1, ...), staggered phases against an independent
 * longest-processing-time reference and its balance bound, release budgets
 * against exact integer arithmetic (and igrad_select_spec's scale), the
 * predicted payload of a step and the schedule hash.
 *
 * Not here: packing (test_pack.c), the engine's use of the gate.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan/schedule.h"

/* xorshift64*: a fixed, platform-independent stream for random cases */
static uint64_t rng_state;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}
static int64_t rng_range(int64_t lo, int64_t hi) /* inclusive */
{
    return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1));
}

static void test_names(void **state)
{
    (void)state;
    igrad_schedule_t s = IGRAD_SCHEDULE_ALIGNED;
    assert_string_equal(igrad_schedule_name(IGRAD_SCHEDULE_ALIGNED), "aligned");
    assert_string_equal(igrad_schedule_name(IGRAD_SCHEDULE_STAGGERED), "staggered");
    assert_string_equal(igrad_schedule_name((igrad_schedule_t)7), "unknown");
    assert_int_equal(igrad_schedule_from_name("Staggered", &s), IGRAD_OK);
    assert_int_equal(s, IGRAD_SCHEDULE_STAGGERED);
    assert_int_equal(igrad_schedule_from_name("ALIGNED", &s), IGRAD_OK);
    assert_int_equal(s, IGRAD_SCHEDULE_ALIGNED);
    assert_int_equal(igrad_schedule_from_name("align", &s), IGRAD_E_INVALID);
    assert_non_null(strstr(igrad_last_error(), "\"align\""));
    assert_int_equal(igrad_schedule_from_name(NULL, &s), IGRAD_E_INVALID);
}

static void test_check(void **state)
{
    (void)state;
    assert_int_equal(igrad__schedule_check(IGRAD_DEFAULT_RELEASE_PERIOD,
                                           IGRAD_DEFAULT_RELEASE_KEEP), IGRAD_OK);
    assert_int_equal(igrad__schedule_check(1, 1.0), IGRAD_OK);
    assert_int_equal(igrad__schedule_check(0, 0.25), IGRAD_E_INVALID);
    assert_non_null(strstr(igrad_last_error(), "period 0"));
    assert_int_equal(igrad__schedule_check(4, 0.0), IGRAD_E_INVALID);
    assert_int_equal(igrad__schedule_check(4, 1.5), IGRAD_E_INVALID);
    assert_int_equal(igrad__schedule_check(4, NAN), IGRAD_E_INVALID);
    assert_int_equal(igrad__schedule_check(IGRAD__SCHEDULE_MAX_PERIOD + 1, 0.5),
                     IGRAD_E_INVALID);
}

/* Aligned: every low component is sent exactly when (step + 1) is a
 * multiple of R, important ones always. */
static void test_aligned_reference(void **state)
{
    (void)state;
    rng_state = 11;
    for (int R = 1; R <= 9; R++) {
        enum { N = 17 };
        unsigned char imp[N];
        int phase[N];
        for (int c = 0; c < N; c++) imp[c] = (unsigned char)(rng_next() % 3 == 0);
        assert_int_equal(igrad__schedule_assign(IGRAD_SCHEDULE_ALIGNED, R, N, NULL, imp,
                                                phase), IGRAD_OK);
        for (int c = 0; c < N; c++) {
            for (int64_t step = 0; step < 5 * R; step++) {
                int want = imp[c] ? 1 : (int)((step + 1) % R == 0);
                int got = igrad__schedule_sent(phase[c], R, step);
                if (got != want)
                    fail_msg("R=%d component %d step %lld: sent %d, expected %d", R, c,
                             (long long)step, got, want);
            }
        }
    }
    /* NULL important: all low */
    int phase[3];
    assert_int_equal(igrad__schedule_assign(IGRAD_SCHEDULE_ALIGNED, 4, 3, NULL, NULL, phase),
                     IGRAD_OK);
    for (int c = 0; c < 3; c++) assert_int_equal(phase[c], 3);
}

/* Independent LPT reference: repeatedly the heaviest unplaced low
 * component (lowest index on ties) into the least-loaded slot (lowest slot
 * on ties), by plain scans. */
static void lpt_reference(int R, size_t n, const int64_t *w, const unsigned char *imp,
                          int *phase)
{
    unsigned char *done = calloc(n ? n : 1, 1);
    int64_t *load = calloc((size_t)R, sizeof *load);
    assert_non_null(done);
    assert_non_null(load);
    for (size_t c = 0; c < n; c++)
        if (imp[c]) {
            phase[c] = IGRAD__PHASE_EVERY;
            done[c] = 1;
        }
    for (;;) {
        size_t pick = n;
        for (size_t c = 0; c < n; c++)
            if (!done[c] && (pick == n || w[c] > w[pick])) pick = c;
        if (pick == n) break;
        int slot = 0;
        for (int s = 1; s < R; s++)
            if (load[s] < load[slot]) slot = s;
        load[slot] += w[pick];
        phase[pick] = slot;
        done[pick] = 1;
    }
    free(done);
    free(load);
}

static void test_staggered_random(void **state)
{
    (void)state;
    rng_state = 12345;
    for (int trial = 0; trial < 400; trial++) {
        int R = (int)rng_range(1, 8);
        size_t n = (size_t)rng_range(0, 40);
        int64_t w[40];
        unsigned char imp[40];
        int phase[40], ref[40];
        /* mix of ranges, with ties on purpose */
        int64_t wmax_draw = trial % 3 == 0 ? 4 : 1000000;
        for (size_t c = 0; c < n; c++) {
            w[c] = rng_range(0, wmax_draw);
            imp[c] = (unsigned char)(rng_next() % 4 == 0);
        }
        assert_int_equal(igrad__schedule_assign(IGRAD_SCHEDULE_STAGGERED, R, n, w, imp,
                                                phase), IGRAD_OK);
        lpt_reference(R, n, w, imp, ref);
        int64_t load[8] = {0}, wmax = 0;
        for (size_t c = 0; c < n; c++) {
            if (phase[c] != ref[c])
                fail_msg("trial %d component %zu: phase %d, reference %d", trial, c,
                         phase[c], ref[c]);
            if (imp[c]) {
                assert_int_equal(phase[c], IGRAD__PHASE_EVERY);
                continue;
            }
            assert_in_range(phase[c], 0, R - 1);
            load[phase[c]] += w[c];
            if (w[c] > wmax) wmax = w[c];
            /* exactly one release in every window of R consecutive steps */
            for (int64_t start = 0; start < 2 * R; start++) {
                int sends = 0;
                for (int64_t s = start; s < start + R; s++)
                    sends += igrad__schedule_sent(phase[c], R, s);
                assert_int_equal(sends, 1);
            }
        }
        int64_t lmax = load[0], lmin = load[0];
        for (int s = 1; s < R; s++) {
            if (load[s] > lmax) lmax = load[s];
            if (load[s] < lmin) lmin = load[s];
        }
        if (lmax - lmin > wmax)
            fail_msg("trial %d: slot loads %lld..%lld differ by more than the largest "
                     "weight %lld", trial, (long long)lmin, (long long)lmax,
                     (long long)wmax);
    }
}

static void test_period_one(void **state)
{
    (void)state;
    int64_t w[5] = {5, 1, 9, 9, 2};
    unsigned char imp[5] = {0, 1, 0, 0, 0};
    int phase[5];
    for (int k = 0; k < 2; k++) {
        igrad_schedule_t kind = k ? IGRAD_SCHEDULE_STAGGERED : IGRAD_SCHEDULE_ALIGNED;
        assert_int_equal(igrad__schedule_assign(kind, 1, 5, w, imp, phase), IGRAD_OK);
        for (int c = 0; c < 5; c++)
            for (int64_t step = -3; step < 10; step++)
                assert_int_equal(igrad__schedule_sent(phase[c], 1, step), 1);
    }
}

static void test_sent_negative_step(void **state)
{
    (void)state;
    /* mathematical modulo: step -1 is phase R-1 */
    assert_int_equal(igrad__schedule_sent(3, 4, -1), 1);
    assert_int_equal(igrad__schedule_sent(0, 4, -4), 1);
    assert_int_equal(igrad__schedule_sent(0, 4, -3), 0);
    assert_int_equal(igrad__schedule_sent(IGRAD__PHASE_EVERY, 4, 2), 1);
}

static void test_staggered_hand(void **state)
{
    (void)state;
    int64_t w[5] = {3, 7, 4, 5, 3};
    int phase[5];
    assert_int_equal(igrad__schedule_assign(IGRAD_SCHEDULE_STAGGERED, 2, 5, w, NULL, phase),
                     IGRAD_OK);
    /* order: 7(c1) ->0; 5(c3) ->1; 4(c2) ->1 (load 5 < 7); 3(c0) ->0 (7 < 9);
     * 3(c4) ->1 (9 < 10) */
    int want[5] = {0, 0, 1, 1, 1};
    for (int c = 0; c < 5; c++) assert_int_equal(phase[c], want[c]);
}

static void test_assign_errors(void **state)
{
    (void)state;
    int64_t w[2] = {1, -1};
    int phase[2];
    assert_int_equal(igrad__schedule_assign(IGRAD_SCHEDULE_STAGGERED, 4, 2, w, NULL, phase),
                     IGRAD_E_INVALID);
    assert_non_null(strstr(igrad_last_error(), "component 1"));
    /* an important component's weight is ignored, even a bad one */
    unsigned char imp[2] = {0, 1};
    assert_int_equal(igrad__schedule_assign(IGRAD_SCHEDULE_STAGGERED, 4, 2, w, imp, phase),
                     IGRAD_OK);
    assert_int_equal(phase[0], 0);
    assert_int_equal(phase[1], IGRAD__PHASE_EVERY);
    assert_int_equal(igrad__schedule_assign(IGRAD_SCHEDULE_STAGGERED, 4, 2, NULL, NULL, phase),
                     IGRAD_E_INVALID);
    assert_int_equal(igrad__schedule_assign(IGRAD_SCHEDULE_ALIGNED, 0, 2, NULL, NULL, phase),
                     IGRAD_E_INVALID);
    assert_int_equal(igrad__schedule_assign((igrad_schedule_t)5, 4, 2, w, NULL, phase),
                     IGRAD_E_INVALID);
    assert_int_equal(igrad__schedule_assign(IGRAD_SCHEDULE_STAGGERED, 4, 0, NULL, NULL, NULL),
                     IGRAD_OK);
}

static void test_release_count_hand(void **state)
{
    (void)state;
    /* default kappa 0.25, R 4: the release sends k again */
    assert_int_equal(igrad__release_count(10, 1000, 0.25, 4), 10);
    assert_int_equal(igrad__release_count(10, 1000, 0.5, 4), 20);
    /* kappa = 1: amortised full budget, R * k */
    assert_int_equal(igrad__release_count(10, 1000, 1.0, 4), 40);
    assert_int_equal(igrad__release_count(7, 1000, 1.0, 3), 21);
    /* capped at n */
    assert_int_equal(igrad__release_count(10, 15, 1.0, 4), 15);
    assert_int_equal(igrad__release_count(INT64_MAX / 2, INT64_MAX / 2, 1.0, 1000000),
                     INT64_MAX / 2);
    /* rounding up, never below 1 for k >= 1 */
    assert_int_equal(igrad__release_count(1, 1000, 0.25, 1), 1);
    assert_int_equal(igrad__release_count(3, 1000, 0.25, 2), 2);  /* ceil(1.5) */
    assert_int_equal(igrad__release_count(0, 1000, 0.25, 4), 0);
    assert_int_equal(igrad__release_count(5, 0, 0.25, 4), 0);
    /* row-wise */
    assert_int_equal(igrad__release_per_row(3, 10, 0.25, 4), 3);
    assert_int_equal(igrad__release_per_row(3, 10, 1.0, 4), 10);
    assert_int_equal(igrad__release_per_row(3, 100, 0.5, 3), 5); /* ceil(4.5) */
    assert_int_equal(igrad__release_per_row(0, 100, 0.5, 3), 0);
    /* scales */
    assert_true(igrad__schedule_scale(IGRAD__PHASE_EVERY, 4, 0.25) == 1.0);
    assert_true(igrad__schedule_scale(2, 4, 0.25) == 1.0);
    assert_true(igrad__schedule_scale(2, 8, 0.25) == 2.0);
}

/* kappa = a/64 is exact in binary, so kappa*R*k is exact and the
 * reference is integer ceil division: min(n, ceil(a*R*k / 64)). */
static void test_release_count_exact(void **state)
{
    (void)state;
    rng_state = 777;
    for (int trial = 0; trial < 20000; trial++) {
        int64_t a = rng_range(1, 64);
        int R = (int)rng_range(1, 16);
        int64_t k = rng_range(0, 1 << 20);
        int64_t n = rng_range(0, 1 << 24);
        double keep = (double)a / 64.0;
        int64_t want = k <= 0 || n <= 0 ? 0 : (a * R * k + 63) / 64;
        if (want > n) want = n;
        int64_t got = igrad__release_count(k, n, keep, R);
        if (got != want)
            fail_msg("k=%lld n=%lld keep=%lld/64 R=%d: k_rel %lld, expected %lld",
                     (long long)k, (long long)n, (long long)a, R, (long long)got,
                     (long long)want);
    }
}

/* The engine selects a release with scale kappa*R through
 * igrad_select_spec(); the spec's count must be exactly k_rel. Arbitrary
 * (non-dyadic) kappa on purpose: the two must agree bit for bit. */
static void test_release_count_matches_select_spec(void **state)
{
    (void)state;
    rng_state = 4711;
    for (int trial = 0; trial < 20000; trial++) {
        double keep = (double)rng_range(1, 1000000) / 1000000.0;
        int R = (int)rng_range(1, 12);
        double density = (double)rng_range(1, 100000) / 1000000.0 * (trial % 7 ? 1 : 1000);
        if (density > 1.0) density = 1.0;
        double scale = igrad__release_scale(keep, R);
        int64_t shape[2] = {rng_range(1, 3000), rng_range(1, 3000)};
        int64_t n = shape[0] * shape[1];
        igrad_select_spec_t spec;

        assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_TOPK, density, scale, 0, 0, 2,
                                           shape, &spec), IGRAD_OK);
        int64_t want = igrad__release_count(igrad_budget(n, density), n, keep, R);
        if (spec.count != want)
            fail_msg("topk n=%lld density=%.17g keep=%.17g R=%d: spec %lld, k_rel %lld",
                     (long long)n, density, keep, R, (long long)spec.count,
                     (long long)want);

        assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_ADTOPK, density, scale, 0, 0, 2,
                                           shape, &spec), IGRAD_OK);
        int64_t per_row = igrad__release_per_row(igrad_budget(shape[1], density), shape[1],
                                                 keep, R);
        if (spec.per_row != per_row || spec.count != shape[0] * per_row)
            fail_msg("adtopk %lldx%lld density=%.17g keep=%.17g R=%d: spec %lld per row, "
                     "k_rel %lld per row", (long long)shape[0], (long long)shape[1],
                     density, keep, R, (long long)spec.per_row, (long long)per_row);

        /* 1-D adtopk falls back to topk */
        assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_ADTOPK, density, scale, 0, 0, 1,
                                           &n, &spec), IGRAD_OK);
        assert_int_equal(spec.count, want);
    }
}

static void test_step_nbytes(void **state)
{
    (void)state;
    /* hand case: important 100 B every step; low c1 phase 0 (40 B), low c2
     * phase 2 (60 B); R = 4 */
    int phase[3] = {IGRAD__PHASE_EVERY, 0, 2};
    int64_t every[3] = {100, 10, 15};
    int64_t rel[3] = {999, 40, 60};
    int64_t want[8] = {140, 100, 160, 100, 140, 100, 160, 100};
    for (int64_t s = 0; s < 8; s++)
        assert_int_equal(igrad__schedule_step_nbytes(3, phase, 4, every, rel, s), want[s]);

    /* random: every window of R steps carries R * every + all release
     * bytes; staggered never has a higher peak than aligned */
    rng_state = 99;
    for (int trial = 0; trial < 200; trial++) {
        int R = (int)rng_range(1, 8);
        enum { N = 30 };
        int64_t e[N], r[N];
        unsigned char imp[N];
        int ph_al[N], ph_st[N];
        int64_t every_sum = 0, rel_sum = 0;
        for (int c = 0; c < N; c++) {
            imp[c] = (unsigned char)(rng_next() % 3 == 0);
            e[c] = rng_range(1, 5000);
            r[c] = rng_range(1, 20000);
            if (imp[c]) every_sum += e[c];
            else rel_sum += r[c];
        }
        assert_int_equal(igrad__schedule_assign(IGRAD_SCHEDULE_ALIGNED, R, N, r, imp, ph_al),
                         IGRAD_OK);
        assert_int_equal(igrad__schedule_assign(IGRAD_SCHEDULE_STAGGERED, R, N, r, imp,
                                                ph_st), IGRAD_OK);
        int64_t peak_al = 0, peak_st = 0, win_al = 0, win_st = 0;
        for (int64_t s = 0; s < R; s++) {
            int64_t a = igrad__schedule_step_nbytes(N, ph_al, R, e, r, s);
            int64_t b = igrad__schedule_step_nbytes(N, ph_st, R, e, r, s);
            /* brute force of the same sum */
            int64_t bf = 0;
            for (int c = 0; c < N; c++)
                bf += imp[c] ? e[c] : ((s % R) == ph_st[c] ? r[c] : 0);
            assert_int_equal(b, bf);
            win_al += a;
            win_st += b;
            if (a > peak_al) peak_al = a;
            if (b > peak_st) peak_st = b;
        }
        assert_int_equal(win_al, R * every_sum + rel_sum);
        assert_int_equal(win_st, R * every_sum + rel_sum);
        if (peak_st > peak_al)
            fail_msg("trial %d: staggered peak %lld above aligned peak %lld", trial,
                     (long long)peak_st, (long long)peak_al);
    }
}

static void test_hash(void **state)
{
    (void)state;
    int a[4] = {IGRAD__PHASE_EVERY, 0, 1, 3};
    int b[4] = {IGRAD__PHASE_EVERY, 0, 2, 3};
    uint64_t h0 = igrad__schedule_hash(IGRAD__HASH_SEED, IGRAD_SCHEDULE_STAGGERED, 4, 0.25,
                                       4, a);
    uint64_t h1 = igrad__schedule_hash(IGRAD__HASH_SEED, IGRAD_SCHEDULE_STAGGERED, 4, 0.25,
                                       4, a);
    assert_int_equal(h0, h1);
    assert_int_not_equal(h0, igrad__schedule_hash(IGRAD__HASH_SEED,
                                                  IGRAD_SCHEDULE_STAGGERED, 4, 0.25, 4, b));
    assert_int_not_equal(h0, igrad__schedule_hash(IGRAD__HASH_SEED,
                                                  IGRAD_SCHEDULE_STAGGERED, 4, 0.5, 4, a));
    assert_int_not_equal(h0, igrad__schedule_hash(IGRAD__HASH_SEED,
                                                  IGRAD_SCHEDULE_STAGGERED, 5, 0.25, 4, a));
    assert_int_not_equal(h0, igrad__schedule_hash(IGRAD__HASH_SEED, IGRAD_SCHEDULE_ALIGNED,
                                                  4, 0.25, 4, a));
    assert_int_not_equal(h0, igrad__schedule_hash(IGRAD__HASH_SEED,
                                                  IGRAD_SCHEDULE_STAGGERED, 4, 0.25, 3, a));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_aligned_reference),
        cmocka_unit_test(test_staggered_random),
        cmocka_unit_test(test_staggered_hand),
        cmocka_unit_test(test_period_one),
        cmocka_unit_test(test_sent_negative_step),
        cmocka_unit_test(test_assign_errors),
        cmocka_unit_test(test_release_count_hand),
        cmocka_unit_test(test_release_count_exact),
        cmocka_unit_test(test_release_count_matches_select_spec),
        cmocka_unit_test(test_step_nbytes),
        cmocka_unit_test(test_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
