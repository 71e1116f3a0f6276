/*
 * test_value16.c — 16-bit wire values (config.value_dtype BF16 and F16):
 * igrad_convert() against a brute-force nearest-value search over every
 * finite 16-bit code (ties to the even code, overflow past the largest
 * finite value's half step to Inf), every code's round trip; and on the
 * one-rank "self" communicator, over several steps of topk_sync,
 * adtopk_sync, momentum correction and the reduce route, that nothing is
 * lost: per entry, result + new residual == (m*u +) g + old residual
 * exactly, every result is the 16-bit rounding of that value (F16: clamped
 * to +-65504, the remainder kept), and the payload is 2 bytes per value
 * smaller than F32's and equals igrad_engine_predict_payload().
 *
 * Not here: the converters against PyTorch (tests/python/test_value16.py).
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

/* ---- converters ---------------------------------------------------------- */

static float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Every finite non-negative value of dt, by code (codes 0..max are
 * increasing), decoded with igrad_convert; *nmax = the largest finite code. */
static float *finite_table(igrad_dtype_t dt, uint16_t *nmax)
{
    uint16_t max = dt == IGRAD_DTYPE_F16 ? 0x7bff : 0x7f7f;
    uint16_t *codes = malloc((size_t)(max + 1) * 2);
    float *v = malloc((size_t)(max + 1) * sizeof *v);
    assert_non_null(codes);
    assert_non_null(v);
    for (uint32_t c = 0; c <= max; c++) codes[c] = (uint16_t)c;
    assert_ok(igrad_convert(codes, dt, v, IGRAD_DTYPE_F32, (size_t)max + 1));
    for (uint32_t c = 1; c <= max; c++) assert_true(v[c] > v[c - 1]);
    free(codes);
    *nmax = max;
    return v;
}

/* The reference rounding of a finite x >= 0: the nearest table value by
 * binary search and exact double distances, ties to the even code; past
 * max, the next step up (2 * 2^emax) stands for Inf. */
static uint16_t nearest_code(const float *tab, uint16_t max, double top, float x)
{
    uint32_t lo = 0, hi = max; /* largest code with tab[code] <= x */
    if ((double)x >= (double)tab[max]) {
        double dl = (double)x - tab[max], dh = top - (double)x;
        if (dl < dh || (dl == dh && !(max & 1))) return max;
        return (uint16_t)(max + 1); /* Inf (0x7c00, 0x7f80) */
    }
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (tab[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    double dl = (double)x - tab[lo], dh = (double)tab[lo + 1] - (double)x;
    if (dl < dh || (dl == dh && !(lo & 1))) return (uint16_t)lo;
    return (uint16_t)(lo + 1);
}

static void check_rounding(igrad_dtype_t dt)
{
    uint16_t max;
    float *tab = finite_table(dt, &max);
    double top = dt == IGRAD_DTYPE_F16 ? 65536.0 : ldexp(1.0, 128);
    enum { N = 200000 };
    float *x = malloc(N * sizeof *x);
    uint16_t *h = malloc(N * 2);
    assert_non_null(x);
    assert_non_null(h);
    uint64_t s = 12345;
    for (int i = 0; i < N; i++) {
        s = mix64(s + (uint64_t)i);
        uint32_t u;
        if (i % 4 == 0) {
            u = (uint32_t)s & 0x7f7fffffu; /* any finite positive pattern */
        } else if (i % 4 == 1) {
            /* exact ties and their neighbours: a table midpoint, +-1 ulp */
            uint32_t c = (uint32_t)(s % max);
            double mid = 0.5 * ((double)tab[c] + (double)tab[c + 1]);
            u = bits_of_f32((float)mid) + (uint32_t)((s >> 32) % 3) - 1u;
        } else {
            /* the 16-bit format's own range, with subnormals and top end */
            uint32_t lo = dt == IGRAD_DTYPE_F16 ? 0x33000000u : 0x00000000u;
            uint32_t hi = dt == IGRAD_DTYPE_F16 ? 0x47800000u : 0x7f7fffffu;
            u = lo + (uint32_t)(s % (hi - lo));
        }
        if ((u & 0x7f800000u) == 0x7f800000u) u = 0x3f800000u; /* keep finite */
        x[i] = f32_of_bits(u);
        if (i % 2) x[i] = -x[i];
    }
    assert_ok(igrad_convert(x, IGRAD_DTYPE_F32, h, dt, N));
    uint16_t inf = dt == IGRAD_DTYPE_F16 ? 0x7c00 : 0x7f80;
    for (int i = 0; i < N; i++) {
        uint16_t sign = signbit(x[i]) ? 0x8000 : 0;
        uint16_t want = nearest_code(tab, max, top, fabsf(x[i]));
        if (want == max + 1) want = inf;
        want |= sign;
        if (h[i] != want)
            fail_msg("%s: %a (0x%08x) rounds to 0x%04x, the nearest even code is 0x%04x",
                     igrad_dtype_name(dt), (double)x[i], bits_of_f32(x[i]), h[i], want);
    }
    free(x);
    free(h);
    free(tab);
}

static void test_convert_bf16_rounding(void **state)
{
    (void)state;
    check_rounding(IGRAD_DTYPE_BF16);
}

static void test_convert_f16_rounding(void **state)
{
    (void)state;
    check_rounding(IGRAD_DTYPE_F16);
}

/* Every code decodes and encodes back to itself (NaNs to the quiet NaN);
 * Inf, NaN and the f16 overflow edge; bad dtype pairs are named. */
static void test_convert_codes(void **state)
{
    (void)state;
    static const igrad_dtype_t dts[2] = {IGRAD_DTYPE_BF16, IGRAD_DTYPE_F16};
    uint16_t *c = malloc(65536 * 2), *back = malloc(65536 * 2);
    float *f = malloc(65536 * sizeof *f);
    assert_non_null(c);
    assert_non_null(back);
    assert_non_null(f);
    for (uint32_t i = 0; i < 65536; i++) c[i] = (uint16_t)i;
    for (int d = 0; d < 2; d++) {
        igrad_dtype_t dt = dts[d];
        uint16_t expmask = dt == IGRAD_DTYPE_F16 ? 0x7c00 : 0x7f80;
        assert_ok(igrad_convert(c, dt, f, IGRAD_DTYPE_F32, 65536));
        assert_ok(igrad_convert(f, IGRAD_DTYPE_F32, back, dt, 65536));
        for (uint32_t i = 0; i < 65536; i++) {
            int nan = (i & expmask) == expmask && (i & (uint32_t)~(expmask | 0x8000u));
            if (nan) {
                assert_true(isnan(f[i]));
                assert_int_equal(back[i] & 0x7fff, dt == IGRAD_DTYPE_F16 ? 0x7e00 : 0x7fc0);
            } else if (back[i] != i) {
                fail_msg("%s code 0x%04x -> %a -> 0x%04x", igrad_dtype_name(dt), i,
                         (double)f[i], back[i]);
            }
        }
    }
    float edge[6] = {65504.0f, 65519.996f, 65520.0f, INFINITY, -INFINITY, 1e30f};
    uint16_t h[6];
    assert_ok(igrad_convert(edge, IGRAD_DTYPE_F32, h, IGRAD_DTYPE_F16, 6));
    assert_int_equal(h[0], 0x7bff);
    assert_int_equal(h[1], 0x7bff);
    assert_int_equal(h[2], 0x7c00);
    assert_int_equal(h[3], 0x7c00);
    assert_int_equal(h[4], 0xfc00);
    assert_int_equal(h[5], 0x7c00);
    assert_ok(igrad_convert(edge, IGRAD_DTYPE_F32, h, IGRAD_DTYPE_BF16, 6));
    assert_int_equal(h[0], 0x4780); /* 65504 ties up to 65536 */
    assert_int_equal(h[3], 0x7f80);
    assert_status(igrad_convert(edge, IGRAD_DTYPE_F32, h, IGRAD_DTYPE_I16, 6), IGRAD_E_INVALID);
    assert_error_has("F32 to I16 is not supported");
    assert_status(igrad_convert(NULL, IGRAD_DTYPE_F32, h, IGRAD_DTYPE_F16, 1), IGRAD_E_INVALID);
    assert_ok(igrad_convert(NULL, IGRAD_DTYPE_F32, NULL, IGRAD_DTYPE_F16, 0));
    free(c);
    free(back);
    free(f);
}

/* ---- the engine ----------------------------------------------------------- */

/* A 2-D tensor (row-wise under adtopk, 16-bit column indices), a 1-D one
 * past 65536 entries (32-bit indices) and a small one. */
static igrad_layout_t *make_layout(void)
{
    igrad_layout_t *L = NULL;
    assert_ok(igrad_layout_create(&L));
    int64_t a[2] = {48, 300}, b[1] = {70000}, c[1] = {40};
    assert_ok(igrad_layout_add(L, "model.layers.0.mlp.up_proj.weight", IGRAD_DTYPE_F32, 2, a));
    assert_ok(igrad_layout_add(L, "flat.weight", IGRAD_DTYPE_F32, 1, b));
    assert_ok(igrad_layout_add(L, "small.bias", IGRAD_DTYPE_F32, 1, c));
    return L;
}

/* The wire's value of v: the 16-bit rounding, clamped to the largest
 * finite value where it would be Inf. */
static float wire_value(igrad_dtype_t dt, float v)
{
    uint16_t h;
    float q;
    assert_ok(igrad_convert(&v, IGRAD_DTYPE_F32, &h, dt, 1));
    assert_ok(igrad_convert(&h, dt, &q, IGRAD_DTYPE_F32, 1));
    float max = dt == IGRAD_DTYPE_F16 ? 65504.0f : 0x1.fep127f;
    if (isinf(q)) q = v > 0 ? max : -max;
    return q;
}

/* Gradient entry i of tensor t at step s: mostly O(1), with tiny values
 * (F16 subnormals) and, with `huge`, some beyond F16's range. */
static float grad_value(int s, size_t t, int64_t i, int huge)
{
    uint64_t h = mix64(((uint64_t)s << 40) ^ ((uint64_t)t << 32) ^ (uint64_t)i);
    double u = (double)(h >> 11) * 0x1p-53 - 0.5;
    switch (h % 16) {
    case 0: return (float)(u * 1e-6);                 /* F16 subnormal range */
    case 1: return huge ? (float)(u * 4e6) : (float)u; /* F16 overflow */
    case 2: return (float)(u * 1e-9);                 /* F16 underflow to 0 */
    default: return (float)(u * (1.0 + (double)(h % 7)));
    }
}

typedef struct run_result {
    int64_t payload[8];
    int64_t entries[8];
} run_result_t;

/* `steps` steps of config c; after each, the per-entry conservation and
 * rounding checks (P = 1: the result is what was sent). */
static run_result_t run_checked(igrad_config_t c, int steps, int huge)
{
    run_result_t out;
    memset(&out, 0, sizeof out);
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    grads_t G = grads_new(L);
    float m = (float)c.momentum;
    for (int s = 0; s < steps; s++) {
        float **a = calloc(G.T, sizeof *a);
        assert_non_null(a);
        for (size_t t = 0; t < G.T; t++) {
            const float *r = igrad_engine_residual(e, t), *u = igrad_engine_velocity(e, t);
            a[t] = malloc((size_t)G.n[t] * sizeof(float));
            assert_non_null(a[t]);
            for (int64_t i = 0; i < G.n[t]; i++) {
                G.g[t][i] = grad_value(s, t, i, huge);
                float v = u ? m * u[i] + G.g[t][i] : G.g[t][i];
                a[t][i] = v + r[i];
            }
        }
        int64_t predicted = igrad_engine_predict_payload(e, s);
        assert_ok(igrad_engine_sync(e, s, G.g));
        igrad_step_stats_t st;
        assert_ok(igrad_engine_last_stats(e, &st));
        if (st.reduce_buckets == 0) assert_int_equal(st.payload_nbytes, predicted);
        out.payload[s] = st.payload_nbytes;
        out.entries[s] = st.entries_sent;
        for (size_t t = 0; t < G.T; t++) {
            const float *r = igrad_engine_residual(e, t);
            for (int64_t i = 0; i < G.n[t]; i++) {
                float q = G.g[t][i];
                if (q + r[i] != a[t][i])
                    fail_msg("%s step %d tensor %zu entry %lld: sent %a + residual %a != %a",
                             igrad_dtype_name(c.value_dtype), s, t, (long long)i, (double)q,
                             (double)r[i], (double)a[t][i]);
                if (q != 0.0f && c.value_dtype != IGRAD_DTYPE_F32 &&
                    q != wire_value(c.value_dtype, a[t][i]))
                    fail_msg("%s step %d tensor %zu entry %lld: sent %a for %a, not its "
                             "16-bit rounding %a",
                             igrad_dtype_name(c.value_dtype), s, t, (long long)i, (double)q,
                             (double)a[t][i], (double)wire_value(c.value_dtype, a[t][i]));
            }
            free(a[t]);
        }
        free(a);
    }
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_layout_free(L);
    return out;
}

static void check_method(igrad_method_t method, double density, int huge)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = method;
    c.density = density;
    c.collective = IGRAD_COLLECTIVE_GATHER;
    run_result_t f32 = run_checked(c, 4, huge);
    c.value_dtype = IGRAD_DTYPE_BF16;
    run_result_t bf16 = run_checked(c, 4, huge);
    c.value_dtype = IGRAD_DTYPE_F16;
    run_result_t f16 = run_checked(c, 4, huge);
    for (int s = 0; s < 4; s++) {
        assert_int_equal(bf16.entries[s], f32.entries[s]);
        assert_int_equal(bf16.payload[s], f32.payload[s] - 2 * f32.entries[s]);
        assert_int_equal(f16.payload[s], bf16.payload[s]);
    }
}

static void test_engine_topk(void **state)
{
    (void)state;
    check_method(IGRAD_METHOD_TOPK_SYNC, 0.05, 0);
}

static void test_engine_adtopk(void **state)
{
    (void)state;
    check_method(IGRAD_METHOD_ADTOPK_SYNC, 0.05, 0);
}

/* Everything sent: every subnormal, underflow and (F16) overflow value is
 * on the wire, clamped where F16 cannot carry it. */
static void test_engine_all_sent_clamped(void **state)
{
    (void)state;
    check_method(IGRAD_METHOD_TOPK_SYNC, 1.0, 1);
    check_method(IGRAD_METHOD_ADTOPK_SYNC, 1.0, 1);
}

/* Momentum correction with masking: a = m*u + g + e, sent + residual = a. */
static void test_engine_momentum(void **state)
{
    (void)state;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.momentum = 0.9;
    c.value_dtype = IGRAD_DTYPE_BF16;
    run_checked(c, 5, 0);
    c.value_dtype = IGRAD_DTYPE_F16;
    run_checked(c, 5, 1);
}

/* The reduce route sums F32, but of the rounded values. */
static void test_engine_reduce(void **state)
{
    (void)state;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    c.value_dtype = IGRAD_DTYPE_BF16;
    run_checked(c, 3, 0);
    c.value_dtype = IGRAD_DTYPE_F16;
    run_checked(c, 3, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert_bf16_rounding),
        cmocka_unit_test(test_convert_f16_rounding),
        cmocka_unit_test(test_convert_codes),
        cmocka_unit_test(test_engine_topk),
        cmocka_unit_test(test_engine_adtopk),
        cmocka_unit_test(test_engine_all_sent_clamped),
        cmocka_unit_test(test_engine_momentum),
        cmocka_unit_test(test_engine_reduce),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
