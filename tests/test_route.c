/*
 * test_route.c — `collective = auto`'s choice (route.c) against a
 * brute-force evaluation of the α-β formulas of docs/architecture.md §5.7
 * over a grid of (s, d, k, P, α, B), ties included: here each route's time
 * is taken as stated — steps·α + wire bytes·8000/B ns, gather (P−1) steps
 * and (P−1)s bytes, reduce 2(P−1) steps and 2(P−1)/P·4d bytes; the sparse
 * all-reduce its fitted time (docs/plan.md §2, decision 0060), 17 α +
 * 9/5 × its wire bytes (P−1)(112 + 8⌈k/P⌉) + 8k(P−1)/P × 8000/B — and
 * compared exactly, scaled by 5·B·P (not by B·P/(P−1) as route.c does), the
 * first in table order (gather, reduce, sparse all-reduce) winning ties.
 * Also: α = 0 without the sparse all-reduce is the old bytes rule (reduce
 * iff 8d < P·s); forced routes, the dense method and one rank; the arenas
 * cover every route auto can take; config validation of the link; the
 * named links (igrad_link_parse, igrad_link_to_config: presets, numbers,
 * rounding and clamping, refusals).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "igrad.h"
#include "plan/route.h"
#include "test_util.h"

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

__extension__ typedef __int128 wide_t;

static void status_msg(igrad_status_t st, igrad_status_t want, const char *frag)
{
    assert_int_equal(st, want);
    assert_error_has(frag);
}

/* Exact time × 5 × B × P of one route as stated (the 5 makes the sparse
 * all-reduce's 9/5 an integer). 0 gather, 1 reduce, 2 sar. */
static wide_t stated(int route, int64_t s, int64_t d, int64_t k, int64_t P, int64_t a, int64_t B)
{
    wide_t steps, pbytes; /* pbytes = wire bytes × P */
    if (route == 0) {
        steps = P - 1;
        pbytes = (wide_t)(P - 1) * s * P;
    } else if (route == 1) {
        steps = 2 * (P - 1);
        pbytes = (wide_t)2 * (P - 1) * 4 * d;
    } else {
        int64_t kout = (k + P - 1) / P;
        pbytes = (wide_t)(P - 1) * (112 + 8 * kout) * P + (wide_t)8 * k * (P - 1);
        /* 17 α, not (P−1)-dependent steps; 9/5 of the bytes */
        return (wide_t)5 * 17 * a * B * P + (wide_t)9 * 8000 * pbytes;
    }
    return 5 * (steps * a * B * P + 8000 * pbytes);
}

static igrad_bucket_kind_t brute(int sar, int64_t s, int64_t d, int64_t k, int64_t P, int64_t a,
                                 int64_t B)
{
    static const igrad_bucket_kind_t kinds[3] = {IGRAD_BUCKET_GATHER, IGRAD_BUCKET_REDUCE,
                                                 IGRAD_BUCKET_SPARSE_REDUCE};
    int best = 0;
    wide_t c = stated(0, s, d, k, P, a, B);
    for (int r = 1; r < (sar ? 3 : 2); r++) {
        wide_t cr = stated(r, s, d, k, P, a, B);
        if (cr < c) {
            best = r;
            c = cr;
        }
    }
    return kinds[best];
}

static igrad_bucket_kind_t choose(int sar, int64_t s, int64_t d, int64_t k, int64_t P, int64_t a,
                                  int64_t B)
{
    igrad__route_bucket_t b = {P, s, d, k};
    igrad__route_link_t l = {a, B, sar};
    return igrad__route_choose(IGRAD_COLLECTIVE_AUTO, 0, &b, &l)->kind;
}

static void test_grid_matches_brute_force(void **state)
{
    (void)state;
    static const int64_t Ps[] = {2, 3, 4, 5, 8, 16, 64, 1024};
    static const int64_t ks[] = {0, 1, 7, 40, 41, 100, 1000, 65536, 10000000};
    static const int64_t bpe[] = {6, 8, 4}; /* gather bytes per entry: F32+u16, F32+u32, BF16+u16 */
    static const int64_t dmul[] = {1, 2, 3, 5, 10, 100, 1000};
    static const int64_t as[] = {0, 1, 8000, 15000, 1000000, IGRAD__LINK_MAX_LATENCY_NS};
    static const int64_t Bs[] = {1, 10000, 100000, 3600000, IGRAD__LINK_MAX_BANDWIDTH_MBPS};
    long n = 0, won[3] = {0, 0, 0}, ties = 0;
    for (size_t ip = 0; ip < COUNT_OF(Ps); ip++)
        for (size_t ik = 0; ik < COUNT_OF(ks); ik++)
            for (size_t ie = 0; ie < COUNT_OF(bpe); ie++)
                for (size_t id = 0; id < COUNT_OF(dmul) + 1; id++)
                    for (size_t ia = 0; ia < COUNT_OF(as); ia++)
                        for (size_t ib = 0; ib < COUNT_OF(Bs); ib++)
                            for (int sar = 0; sar <= 1; sar++) {
                                int64_t P = Ps[ip], k = ks[ik], s = k * bpe[ie];
                                /* d: multiples of k, and the gather/reduce tie 8d = P s */
                                int64_t d = id < COUNT_OF(dmul) ? k * dmul[id]
                                                                : (P * s) / 8;
                                int64_t a = as[ia], B = Bs[ib];
                                igrad_bucket_kind_t want = brute(sar, s, d, k, P, a, B);
                                igrad_bucket_kind_t got = choose(sar, s, d, k, P, a, B);
                                if (want != got)
                                    fail_msg("P %lld s %lld d %lld k %lld alpha %lld B %lld "
                                             "sar %d: route %d, the formulas say %d",
                                             (long long)P, (long long)s, (long long)d,
                                             (long long)k, (long long)a, (long long)B, sar,
                                             (int)got, (int)want);
                                won[want]++;
                                n++;
                                if (stated(0, s, d, k, P, a, B) == stated(1, s, d, k, P, a, B) ||
                                    (sar && stated(0, s, d, k, P, a, B) ==
                                                stated(2, s, d, k, P, a, B)))
                                    ties++;
                            }
    /* the grid exercises every route and ties */
    assert_true(won[0] > 0 && won[1] > 0 && won[2] > 0);
    assert_true(ties > 0);
    print_message("%ld cases: gather %ld, reduce %ld, sparse all-reduce %ld; %ld ties\n", n,
                  won[0], won[1], won[2], ties);
}

static void test_ties_and_old_rule(void **state)
{
    (void)state;
    /* zero latency, no sparse all-reduce: reduce iff 8d < P s, ties gather,
     * whatever the bandwidth */
    for (int64_t P = 2; P <= 9; P++)
        for (int64_t s = 0; s <= 60; s += 3)
            for (int64_t d = 0; d <= 60; d++)
                for (int64_t B = 1; B <= 1000000000; B *= 1000) {
                    igrad_bucket_kind_t want =
                        8 * d < P * s ? IGRAD_BUCKET_REDUCE : IGRAD_BUCKET_GATHER;
                    assert_int_equal(choose(0, s, d, s / 6, P, 0, B), want);
                }
    /* an exact gather/sparse all-reduce tie at alpha 0, P 4, k 12: gather
     * (P-1)s = 3*288 = 864 = 9/5 (3*(112 + 8*3) + 8*12*3/4) = 9/5 * 480 */
    assert_true(stated(0, 288, 1000000, 12, 4, 0, 1) == stated(2, 288, 1000000, 12, 4, 0, 1));
    assert_int_equal(choose(1, 288, 1000000, 12, 4, 0, 1), IGRAD_BUCKET_GATHER);
    assert_int_equal(choose(1, 288 + 1, 1000000, 12, 4, 0, 1), IGRAD_BUCKET_SPARSE_REDUCE);
    /* ... and enough latency makes its 17 alpha lose to the gather's
     * P - 1 = 3: the byte more of s costs the gather 3 x 8,000 ns at B 1,
     * which 14 alpha outweigh from alpha = 1,715 ns on */
    assert_int_equal(choose(1, 288 + 1, 1000000, 12, 4, 1, 1), IGRAD_BUCKET_SPARSE_REDUCE);
    assert_int_equal(choose(1, 288 + 1, 1000000, 12, 4, 100000, 1), IGRAD_BUCKET_GATHER);
    /* the alpha term does not grow with P: at P 64 with a latency that
     * the old 4(P-1) alpha priced out, the fitted 17 alpha keeps the
     * sparse all-reduce (k 64000, gather 8 bytes an entry: 63 * 512000
     * bytes against 9/5 * (63 * (112 + 8000) + 8 * 64000 * 63 / 64)) */
    assert_int_equal(choose(1, 8 * 64000, 100000000, 64000, 64, 1000000, 100000),
                     IGRAD_BUCKET_SPARSE_REDUCE);
    /* a gather/reduce tie with latency (P 4, alpha 1, B 8000): 12 + 96000 s
     * against 24 + 192000 d, equal for s = 201, d = 100 */
    assert_true(stated(0, 201, 100, 0, 4, 1, 8000) == stated(1, 201, 100, 0, 4, 1, 8000));
    assert_int_equal(choose(0, 201, 100, 0, 4, 1, 8000), IGRAD_BUCKET_GATHER);
    assert_int_equal(choose(0, 201, 99, 0, 4, 1, 8000), IGRAD_BUCKET_REDUCE);
    /* at alpha 0 the same bucket reduces (8d = 800 < P s = 804) */
    assert_int_equal(choose(0, 201, 100, 0, 4, 0, 8000), IGRAD_BUCKET_REDUCE);
}

static void test_forced_dense_one_rank(void **state)
{
    (void)state;
    igrad__route_bucket_t b = {4, 1000, 10, 100};
    igrad__route_link_t l = {0, 100000, 1};
    assert_int_equal(igrad__route_choose(IGRAD_COLLECTIVE_GATHER, 0, &b, &l)->kind,
                     IGRAD_BUCKET_GATHER);
    assert_int_equal(igrad__route_choose(IGRAD_COLLECTIVE_REDUCE, 0, &b, &l)->kind,
                     IGRAD_BUCKET_REDUCE);
    assert_int_equal(igrad__route_choose(IGRAD_COLLECTIVE_SPARSE_REDUCE, 0, &b, &l)->kind,
                     IGRAD_BUCKET_SPARSE_REDUCE);
    /* the dense method is its route whatever auto would say */
    assert_int_equal(igrad__route_choose(IGRAD_COLLECTIVE_AUTO, 1, &b, &l)->kind,
                     IGRAD_BUCKET_REDUCE);
    b.P = 1;
    assert_int_equal(igrad__route_choose(IGRAD_COLLECTIVE_AUTO, 0, &b, &l)->kind,
                     IGRAD_BUCKET_GATHER);
}

static void test_arenas_cover_auto(void **state)
{
    (void)state;
    size_t send, recv, send_sar, recv_sar;
    igrad__route_arenas(IGRAD_COLLECTIVE_AUTO, 0, 0, 1000, 400, 5000, 4, 64, &send, &recv);
    assert_int_equal(send, 1000 + 64);
    assert_int_equal(recv, 4 * 1000 + 64);
    /* with the sparse all-reduce: its entries, 8 bytes each (400 entries
     * in 1000 gather bytes: FP8 values, compact indices) */
    igrad__route_arenas(IGRAD_COLLECTIVE_AUTO, 0, 1, 1000, 400, 5000, 4, 64, &send_sar,
                        &recv_sar);
    assert_int_equal(send_sar, 8 * 400 + 64);
    assert_int_equal(recv_sar, recv);
    /* forced: its own */
    igrad__route_arenas(IGRAD_COLLECTIVE_SPARSE_REDUCE, 0, 0, 1000, 400, 5000, 4, 64, &send,
                        &recv);
    assert_int_equal(send, 8 * 400 + 64);
    assert_int_equal(recv, 0);
}

static void test_config_validation(void **state)
{
    (void)state;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    assert_int_equal(c.link_latency_ns, 0);
    assert_int_equal(c.link_bandwidth_mbps, 100000);
    assert_int_equal(c.auto_sparse_reduce, 0);
    assert_ok(igrad_config_validate(&c));
    c.link_latency_ns = -1;
    status_msg(igrad_config_validate(&c), IGRAD_E_INVALID, "config.link_latency_ns is -1");
    c.link_latency_ns = IGRAD__LINK_MAX_LATENCY_NS + 1;
    status_msg(igrad_config_validate(&c), IGRAD_E_INVALID, "config.link_latency_ns");
    c.link_latency_ns = IGRAD__LINK_MAX_LATENCY_NS;
    assert_ok(igrad_config_validate(&c));
    c.link_bandwidth_mbps = 0;
    status_msg(igrad_config_validate(&c), IGRAD_E_INVALID,
                      "config.link_bandwidth_mbps is 0");
    c.link_bandwidth_mbps = IGRAD__LINK_MAX_BANDWIDTH_MBPS + 1;
    status_msg(igrad_config_validate(&c), IGRAD_E_INVALID, "config.link_bandwidth_mbps");
    c.link_bandwidth_mbps = 1;
    assert_ok(igrad_config_validate(&c));
    c.auto_sparse_reduce = 2;
    status_msg(igrad_config_validate(&c), IGRAD_E_INVALID,
                      "config.auto_sparse_reduce is 2");
}

static void test_link_parse(void **state)
{
    (void)state;
    double bw = 0, lat = 0;
    int64_t ns = -1, mbps = -1;
    assert_int_equal(igrad_link_preset_count(), 7);
    assert_null(igrad_link_preset(7));
    for (size_t i = 0; i < igrad_link_preset_count(); i++) {
        const igrad_link_preset_t *p = igrad_link_preset(i);
        assert_int_equal(igrad_link_parse(p->name, &bw, &lat), IGRAD_OK);
        assert_true(bw == p->gbit_per_s && lat == p->latency_us && p->assumes[0]);
    }
    assert_int_equal(igrad_link_parse("100g", &bw, &lat), IGRAD_OK);
    igrad_link_to_config(bw, lat, &ns, &mbps);
    assert_true(ns == 8000 && mbps == 100000);
    assert_int_equal(igrad_link_parse("0.2,835.3", &bw, &lat), IGRAD_OK);
    igrad_link_to_config(bw, lat, &ns, &mbps);
    assert_true(ns == 835300 && mbps == 200);
    /* rounding to the nearest, clamping to the config's ranges */
    igrad_link_to_config(1e-4, 1e-4, &ns, &mbps); /* 0.1 ns, 0.1 Mbit/s */
    assert_true(ns == 0 && mbps == 1);
    igrad_link_to_config(1e9, 1e7, &ns, &mbps);
    assert_true(ns == 1000000000LL && mbps == 1000000000LL);
    igrad_link_to_config(12.3456, 2.0004, &ns, &mbps);
    assert_true(ns == 2000 && mbps == 12346);
    const char *bad[] = {"fast", "100", "100,", ",8", "-1,8", "100,8x", "nan,8", "inf,8",
                         "0x10,8", "100,0x8", "+100,8", " 100,8", ""};
    for (size_t i = 0; i < COUNT_OF(bad); i++) {
        assert_int_equal(igrad_link_parse(bad[i], &bw, &lat), IGRAD_E_INVALID);
        assert_non_null(strstr(igrad_last_error(), "is neither a preset"));
    }
    /* out of the config's range: refused by name, never clamped */
    const char *range[] = {"100,0", "0,8", "1e308,1e308", "100,1e-300", "1e7,8", "100,2e6",
                           "0.0001,8"};
    for (size_t i = 0; i < COUNT_OF(range); i++) {
        assert_int_equal(igrad_link_parse(range[i], &bw, &lat), IGRAD_E_INVALID);
        assert_non_null(strstr(igrad_last_error(), "is outside ["));
    }
    assert_int_equal(igrad_link_parse("1e6,1e6", &bw, &lat), IGRAD_OK);
    igrad_link_to_config(bw, lat, &ns, &mbps);
    assert_true(ns == 1000000000LL && mbps == 1000000000LL);
    assert_int_equal(igrad_link_parse("0.001,0.001", &bw, &lat), IGRAD_OK);
    igrad_link_to_config(bw, lat, &ns, &mbps);
    assert_true(ns == 1 && mbps == 1);
    assert_int_equal(igrad_link_parse(NULL, &bw, &lat), IGRAD_E_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_matches_brute_force),
        cmocka_unit_test(test_ties_and_old_rule),
        cmocka_unit_test(test_forced_dense_one_rank),
        cmocka_unit_test(test_arenas_cover_auto),
        cmocka_unit_test(test_config_validation),
        cmocka_unit_test(test_link_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
