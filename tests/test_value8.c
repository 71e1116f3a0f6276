/*
 * test_value8.c — FP8 wire values (config.value_dtype F8_E4M3,
 * core/value8.h): the 256 codes against a table computed independently
 * with ldexp from the OCP E4M3 definition (bias 7, no infinities, NaN
 * S.1111.111, max 448); the encoder against a brute-force nearest search
 * over that table (ties to the even code, saturation past 448); the block
 * scale against its definition searched in double; the round-trip error
 * bound; the pack of rounded values decoding back to them; and on the
 * one-rank "self" communicator, over several steps of topk_sync,
 * adtopk_sync (several blocks per tensor), momentum and the reduce route,
 * that nothing is lost (result + new residual == a, bit for bit), that
 * every value is its block's rounding, and the payload: F32's minus 3 bytes
 * per entry plus 4 per block, as igrad_engine_predict_payload says.
 *
 * Not here: two ranks (tests/mpi_value16.c runs F8_E4M3 too), peers' bad
 * bytes (tests/fuzz_value8.c, mpi_corrupt-style checks in test_engine).
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
#include "core/value8.h"
#include "core/internal.h" /* igrad__fail */
#include "test_util.h"

/* ---- the reference ------------------------------------------------------- */

/* Code c's value by the OCP definition, in double (NaN for S.1111.111). */
static double ref_value(unsigned c)
{
    unsigned e = (c >> 3) & 15u, m = c & 7u;
    if (e == 15 && m == 7) return NAN;
    double mag = e == 0 ? ldexp((double)m, -9) : ldexp(8.0 + (double)m, (int)e - 10);
    return (c & 0x80u) ? -mag : mag;
}

/* The nearest code to x >= 0 (double) over codes 0..0x7e, ties to the even
 * code; beyond 448 the largest (saturation). */
static unsigned ref_encode_abs(double x)
{
    if (x >= 448.0) return 0x7e;
    unsigned best = 0;
    for (unsigned c = 1; c <= 0x7e; c++) {
        double dc = fabs(ref_value(c) - x), db = fabs(ref_value(best) - x);
        if (dc < db || (dc == db && !(c & 1u))) best = c;
    }
    return best;
}

static unsigned ref_encode(float x)
{
    unsigned c = ref_encode_abs(fabs((double)x));
    return signbit(x) ? (c | 0x80u) : c;
}

/* The smallest k >= -126 with amax <= 448 * 2^k, searched in double. */
static int ref_scale_exp(float amax)
{
    int k = -126;
    while ((double)amax > ldexp(448.0, k)) k++;
    return k;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- the codes ----------------------------------------------------------- */

static void test_decode_all_codes(void **state)
{
    (void)state;
    for (unsigned c = 0; c < 256; c++) {
        double want = ref_value(c);
        float got = igrad__fp8_decode((uint8_t)c);
        assert_int_equal(igrad__fp8_is_nan((uint8_t)c), isnan(want) ? 1 : 0);
        if (isnan(want)) {
            assert_true(isnan(got));
            continue;
        }
        if ((double)got != want || !signbit(got) != !signbit(want))
            fail_msg("code 0x%02x decodes to %a, the definition says %a", c, (double)got, want);
        /* every finite code encodes back to itself */
        if (igrad__fp8_encode(got) != (uint8_t)c)
            fail_msg("code 0x%02x -> %a -> 0x%02x", c, (double)got, igrad__fp8_encode(got));
    }
    assert_true(igrad__fp8_decode(0x7e) == 448.0f);
    assert_true(igrad__fp8_decode(0x01) == 0x1p-9f);
    assert_true(igrad__fp8_decode(0x08) == 0x1p-6f);
}

static void test_encode_nearest_even(void **state)
{
    (void)state;
    /* every midpoint between neighbouring codes (a tie), +-1 ulp, and
     * random values over the whole range and beyond 448 */
    enum { N = 60000 };
    uint64_t s = 777;
    for (int i = 0; i < N; i++) {
        s = mix64(s + (uint64_t)i);
        float x;
        if (i < 126 * 3) {
            unsigned c = (unsigned)(i / 3);
            double mid = 0.5 * (ref_value(c) + ref_value(c + 1));
            x = from_bits(bits((float)mid) + (uint32_t)(i % 3) - 1u);
            if (i % 3 == 1) assert_true((double)x == mid); /* an exact tie */
        } else if (i % 3 == 0) {
            x = from_bits((uint32_t)(0x3a000000u + s % (0x44000000u - 0x3a000000u)));
        } else if (i % 3 == 1) {
            x = (float)ldexp((double)(s >> 40) * 0x1p-24, (int)(s % 30) - 14);
        } else {
            x = from_bits((uint32_t)s & 0x7f7fffffu);
        }
        if (s & (1ull << 63)) x = -x;
        unsigned want = ref_encode(x), got = igrad__fp8_encode(x);
        if (got != want)
            fail_msg("%a (0x%08x) encodes to 0x%02x, the nearest even code is 0x%02x",
                     (double)x, bits(x), got, want);
    }
    assert_int_equal(igrad__fp8_encode(INFINITY), 0x7e);
    assert_int_equal(igrad__fp8_encode(-1e30f), 0xfe);
    assert_int_equal(igrad__fp8_encode(464.0f), 0x7e);
    assert_int_equal(igrad__fp8_encode(0x1p-10f), 0x00);          /* tie to even 0 */
    assert_int_equal(igrad__fp8_encode(0x1.000002p-10f), 0x01);
    assert_int_equal(igrad__fp8_encode(0x3p-10f), 0x02);          /* 1.5 units: tie to 2 */
    assert_int_equal(igrad__fp8_encode(NAN) & 0x7f, 0x7f);
}

static void test_scale_exp(void **state)
{
    (void)state;
    uint64_t s = 99;
    for (int i = 0; i < 20000; i++) {
        s = mix64(s + (uint64_t)i);
        float amax = from_bits((uint32_t)s & 0x7f7fffffu);
        if (i % 4 == 0) amax = (float)ldexp(448.0, (int)(s % 200) - 140); /* exactly 448 * 2^k */
        if (i % 4 == 1) amax = from_bits(bits((float)ldexp(448.0, (int)(s % 200) - 140)) + 1u);
        int k = igrad__fp8_scale_exp(amax);
        if (k != ref_scale_exp(amax))
            fail_msg("scale of max %a: k %d, the definition says %d", (double)amax, k,
                     ref_scale_exp(amax));
    }
    assert_int_equal(igrad__fp8_scale_exp(0.0f), -126);
    assert_int_equal(igrad__fp8_scale_exp(448.0f), 0);
    assert_int_equal(igrad__fp8_scale_exp(448.00003f), 1);
    assert_int_equal(igrad__fp8_scale_exp(0x1.fffffep127f), 120);
}

/* Random blocks of magnitudes spread over many binades: each value's
 * rounding is the reference nearest-even at the block's scale, the error
 * is at most half a step (2^-4 relative in the normal range, 2^-10 * scale
 * below), v - q is exact, and the pack of the rounded values decodes to
 * them (scale a positive normal power of two, no NaN code). */
static void test_block_round_trip(void **state)
{
    (void)state;
    enum { B = 300, NB = 400 };
    float v[B], q[B];
    unsigned char wire[IGRAD__FP8_SCALE_NBYTES + B];
    uint64_t s = 4242;
    for (int b = 0; b < NB; b++) {
        int n = 1 + (int)(mix64((uint64_t)b) % B);
        int spread = (int)(mix64((uint64_t)b + 7) % 40), base = (int)(mix64((uint64_t)b + 9) % 250) - 140;
        for (int i = 0; i < n; i++) {
            s = mix64(s + (uint64_t)i);
            double m = (double)(s >> 11) * 0x1p-53;
            v[i] = (float)ldexp(m, base - (int)(s % (uint64_t)(spread + 1)));
            if (s & 1) v[i] = -v[i];
            if (b == 0) v[i] = 0.0f; /* a block of zeros */
        }
        if (b == 1) v[0] = 0x1.fffffep127f; /* q must not overflow */
        int k = igrad__fp8_block_exp(v, n);
        float sc = igrad__fp8_pow2(k), inv = igrad__fp8_pow2(-k);
        float amax = 0.0f;
        for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(v[i]));
        assert_int_equal(k, ref_scale_exp(amax));
        for (int i = 0; i < n; i++) {
            q[i] = igrad__fp8_round(v[i], inv, sc);
            assert_true(isfinite(q[i]));
            double want = ref_value(ref_encode_abs(fabs(ldexp((double)v[i], -k)))) * ldexp(1.0, k);
            if (v[i] < 0) want = -want;
            if (b != 1 || i != 0)
                if ((double)q[i] != want)
                    fail_msg("block %d entry %d: %a rounds to %a at 2^%d, the reference %a", b,
                             i, (double)v[i], (double)q[i], k, want);
            double err = fabs((double)v[i] - (double)q[i]);
            double bound = fabs((double)v[i]) >= ldexp(1.0, k - 6)
                               ? ldexp(fabs((double)v[i]), -4)
                               : ldexp(1.0, k - 10);
            if (b != 1 || i != 0) assert_true(err <= bound);
            float d = v[i] - q[i];
            if ((double)d != (double)v[i] - (double)q[i] || q[i] + d != v[i])
                fail_msg("block %d entry %d: %a - %a is not exact", b, i, (double)v[i],
                         (double)q[i]);
        }
        igrad__fp8_pack(q, n, wire);
        int k2 = igrad__fp8_scale_read(wire);
        assert_true(k2 != 0x7fffffff);
        float s2 = igrad__fp8_pow2(k2);
        for (int i = 0; i < n; i++) {
            uint8_t c = wire[IGRAD__FP8_SCALE_NBYTES + i];
            assert_false(igrad__fp8_is_nan(c));
            if (igrad__fp8_decode(c) * s2 != q[i])
                fail_msg("block %d entry %d: packed 0x%02x at 2^%d decodes to %a, sent %a", b,
                         i, c, k2, (double)(igrad__fp8_decode(c) * s2), (double)q[i]);
        }
    }
    /* the overflow guard: FLT_MAX's block sends the next code down */
    float big = 0x1.fffffep127f;
    int k = igrad__fp8_block_exp(&big, 1);
    float q0 = igrad__fp8_round(big, igrad__fp8_pow2(-k), igrad__fp8_pow2(k));
    assert_true(q0 == 0x1.ep127f); /* 240 * 2^120 */
    assert_true(big - q0 + q0 == big);
}

static void test_scale_read(void **state)
{
    (void)state;
    unsigned char b[4];
    static const uint32_t bad[] = {0x00000000u, 0x80000000u, 0x3f800001u, 0xbf800000u,
                                   0x7f800000u, 0x7fc00000u, 0x00400000u, 0xff800000u};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(b, &bad[i], 4);
        assert_int_equal(igrad__fp8_scale_read(b), 0x7fffffff);
    }
    uint32_t one = 0x3f800000u, lo = 0x00800000u, hi = 0x7f000000u;
    memcpy(b, &one, 4);
    assert_int_equal(igrad__fp8_scale_read(b), 0);
    memcpy(b, &lo, 4);
    assert_int_equal(igrad__fp8_scale_read(b), -126);
    memcpy(b, &hi, 4);
    assert_int_equal(igrad__fp8_scale_read(b), 127);
    assert_int_equal(igrad__value_area_nbytes(1, 10), 14);
    assert_int_equal(igrad__value_area_nbytes(2, 10), 20);
    assert_int_equal(igrad__value_area_nbytes(4, 10), 40);
    assert_int_equal(igrad__value_area_nbytes(1, 0), 0);
}

/* ---- the engine ----------------------------------------------------------- */

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

/* Gradient entry i of tensor t at step s: O(1) values with some far
 * smaller (rounded to 0 or subnormal codes at the block's scale) and some
 * far larger. */
static float grad_value(int s, size_t t, int64_t i)
{
    uint64_t h = mix64(((uint64_t)s << 40) ^ ((uint64_t)t << 32) ^ (uint64_t)i);
    double u = (double)(h >> 11) * 0x1p-53 - 0.5;
    switch (h % 16) {
    case 0: return (float)(u * 1e-6);
    case 1: return (float)(u * 1e4);
    case 2: return (float)(u * 1e-30);
    default: return (float)(u * (1.0 + (double)(h % 7)));
    }
}

typedef struct run_result {
    int64_t payload[8];
    int64_t entries[8];
} run_result_t;

/* `steps` steps of config c on one rank; after each, per entry: sent +
 * residual == a bit for bit, and (one block per tensor: block_entries
 * large) every sent value is a's nearest-even rounding at the scale of the
 * tensor's largest sent |a| (the reference of this file). */
static run_result_t run_checked(igrad_config_t c, int steps, int one_block)
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
    int fp8 = c.value_dtype == IGRAD_DTYPE_F8_E4M3;
    for (int s = 0; s < steps; s++) {
        float **a = calloc(G.T, sizeof *a);
        assert_non_null(a);
        for (size_t t = 0; t < G.T; t++) {
            const float *r = igrad_engine_residual(e, t), *u = igrad_engine_velocity(e, t);
            a[t] = malloc((size_t)G.n[t] * sizeof(float));
            assert_non_null(a[t]);
            for (int64_t i = 0; i < G.n[t]; i++) {
                G.g[t][i] = grad_value(s, t, i);
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
            float amax = 0.0f; /* the largest |a| sent (its q is never 0) */
            for (int64_t i = 0; i < G.n[t]; i++) {
                float q = G.g[t][i];
                if (q + r[i] != a[t][i])
                    fail_msg("%s step %d tensor %zu entry %lld: sent %a + residual %a != %a",
                             igrad_dtype_name(c.value_dtype), s, t, (long long)i, (double)q,
                             (double)r[i], (double)a[t][i]);
                if (q != 0.0f) amax = fmaxf(amax, fabsf(a[t][i]));
            }
            if (!fp8 || !one_block) continue;
            int k = ref_scale_exp(amax);
            for (int64_t i = 0; i < G.n[t]; i++) {
                float q = G.g[t][i];
                if (q == 0.0f) continue;
                double want = ref_value(ref_encode_abs(fabs(ldexp((double)a[t][i], -k)))) *
                              ldexp(1.0, k);
                if (fabs((double)q) != want)
                    fail_msg("step %d tensor %zu entry %lld: sent %a for %a, not its rounding "
                             "%a at 2^%d",
                             s, t, (long long)i, (double)q, (double)a[t][i], want, k);
            }
        }
        for (size_t t = 0; t < G.T; t++) free(a[t]);
        free(a);
    }
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_layout_free(L);
    return out;
}

static void check_method(igrad_method_t method, double density)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = method;
    c.density = density;
    c.collective = IGRAD_COLLECTIVE_GATHER;
    c.block_entries = 1 << 20; /* one block per tensor */
    run_result_t f32 = run_checked(c, 4, 1);
    c.value_dtype = IGRAD_DTYPE_F8_E4M3;
    run_result_t f8 = run_checked(c, 4, 1);
    for (int s = 0; s < 4; s++) {
        assert_int_equal(f8.entries[s], f32.entries[s]);
        /* one block per sent tensor (all three are sent at every step) */
        assert_int_equal(f8.payload[s], f32.payload[s] - 3 * f32.entries[s] + 3 * 4);
    }
    c.block_entries = 100; /* several blocks per tensor, each its own scale */
    run_checked(c, 3, 0);
}

static void test_engine_topk(void **state)
{
    (void)state;
    check_method(IGRAD_METHOD_TOPK_SYNC, 0.05);
}

static void test_engine_adtopk(void **state)
{
    (void)state;
    check_method(IGRAD_METHOD_ADTOPK_SYNC, 0.05);
    check_method(IGRAD_METHOD_ADTOPK_SYNC, 1.0);
}

static void test_engine_momentum_reduce_fixed(void **state)
{
    (void)state;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.momentum = 0.9;
    c.value_dtype = IGRAD_DTYPE_F8_E4M3;
    c.block_entries = 1 << 20;
    run_checked(c, 5, 1);
    c.momentum = 0.0;
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    run_checked(c, 3, 1);
    c.collective = IGRAD_COLLECTIVE_GATHER;
    c.index_code = IGRAD_INDEX_CODE_FIXED;
    run_checked(c, 3, 1);
}

/* ---- a peer's bad bytes ---------------------------------------------------- */

/* A one-rank custom communicator whose iallgather copies the rank's bytes
 * and then, when armed, writes nbytes of `poke` at offset `at`. */
typedef struct poke_comm {
    int armed;
    size_t at, nbytes;
    unsigned char poke[4];
} poke_comm_t;

static igrad_status_t pc_allgather(void *user, const void *send, size_t nbytes, void *recv)
{
    (void)user;
    if (send != recv) memmove(recv, send, nbytes);
    return IGRAD_OK;
}

static igrad_status_t pc_allreduce(void *user, const void *send, void *recv, size_t count,
                                   igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    (void)user, (void)op;
    if (send != recv) memmove(recv, send, count * igrad_dtype_nbytes(dtype));
    return IGRAD_OK;
}

static igrad_status_t pc_bcast(void *user, void *buf, size_t nbytes, int root)
{
    (void)user, (void)buf, (void)nbytes, (void)root;
    return IGRAD_OK;
}

static igrad_status_t pc_barrier(void *user)
{
    (void)user;
    return IGRAD_OK;
}

static igrad_status_t pc_iallgather(void *user, const void *send, size_t nbytes, void *recv,
                                    void **handle)
{
    poke_comm_t *pc = user;
    *handle = NULL;
    pc_allgather(user, send, nbytes, recv);
    if (pc->armed) {
        assert_true(nbytes >= pc->at + pc->nbytes);
        memcpy((unsigned char *)recv + pc->at, pc->poke, pc->nbytes);
    }
    return IGRAD_OK;
}

static igrad_status_t pc_wait(void *user, void *handle)
{
    (void)user, (void)handle;
    return IGRAD_OK;
}

/* topk_sync of 20 of 1000 entries in one FP8 block and bucket: a rank's
 * bytes are the scale (0-3), 20 codes (4-23), then the indices; step 1's
 * received bytes get `poke` at `at`. @return step 1's status. */
static igrad_status_t sync_poked(size_t at, const void *poke, size_t nbytes)
{
    igrad_layout_t *L = NULL;
    assert_ok(igrad_layout_create(&L));
    int64_t flat[1] = {1000};
    assert_ok(igrad_layout_add(L, "model.norm.weight", IGRAD_DTYPE_F32, 1, flat));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.density = 0.02;
    c.buckets = 1;
    c.collective = IGRAD_COLLECTIVE_GATHER;
    c.value_dtype = IGRAD_DTYPE_F8_E4M3;
    poke_comm_t pc = {0, at, nbytes, {0}};
    memcpy(pc.poke, poke, nbytes);
    igrad_comm_ops_t ops = {.size = sizeof ops,
                            .allgather = pc_allgather,
                            .allreduce = pc_allreduce,
                            .bcast = pc_bcast,
                            .barrier = pc_barrier,
                            .iallgather = pc_iallgather,
                            .wait = pc_wait};
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_custom(&ops, &pc, 0, 1, &comm));
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    float *g = malloc(1000 * sizeof *g);
    assert_non_null(g);
    for (int i = 0; i < 1000; i++) g[i] = (float)((i * 37) % 101) - 50.0f;
    assert_ok(igrad_engine_sync(e, 0, &g));
    for (int i = 0; i < 1000; i++) g[i] = (float)((i * 37) % 101) - 50.0f;
    pc.armed = 1;
    igrad_status_t st = igrad_engine_sync(e, 1, &g);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", igrad_last_error());
    free(g);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_layout_free(L);
    igrad__fail(st, __FILE__, __LINE__, "%s", msg); /* the sync's message again */
    return st;
}

static void test_peer_bad_bytes(void **state)
{
    (void)state;
    /* a valid other scale and a valid code are taken */
    const uint32_t two = 0x40000000u, odd = 0x3f800001u, neg = 0xbf800000u, zero = 0,
                   inf = 0x7f800000u, sub = 0x00400000u;
    assert_ok(sync_poked(0, &two, 4));
    const unsigned char code448 = 0x7e, nan = 0x7f, nnan = 0xff;
    assert_ok(sync_poked(4 + 3, &code448, 1));
    const uint32_t *bad[] = {&odd, &neg, &zero, &inf, &sub};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_status(sync_poked(0, bad[i], 4), IGRAD_E_COMM);
        assert_error_has("step 1: bucket 0: rank 0 sent the FP8 block scale ");
        assert_error_has("for tensor model.norm.weight (the block of 20 entries from entry 0)");
        assert_error_has("not a positive normal power of two");
    }
    assert_status(sync_poked(4 + 3, &nan, 1), IGRAD_E_COMM);
    assert_error_has("step 1: bucket 0: rank 0 sent the non-finite value nan (an FP8 NaN code");
    assert_error_has("tensor model.norm.weight (entry 3 of a block of 20)");
    assert_status(sync_poked(4 + 19, &nnan, 1), IGRAD_E_COMM);
    assert_error_has("(entry 19 of a block of 20)");
    /* 448 at a scale of 2^127 is beyond F32 */
    const uint32_t big = 0x7f000000u;
    unsigned char both[5];
    memcpy(both, &big, 4);
    both[4] = 0x7e;
    assert_status(sync_poked(0, both, 5), IGRAD_E_COMM);
    assert_error_has("sent the non-finite value inf");
}

/* The dtype is named where configs are checked; dense refuses it. */
static void test_config(void **state)
{
    (void)state;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.value_dtype = IGRAD_DTYPE_F8_E4M3;
    assert_ok(igrad_config_validate(&c));
    c.method = IGRAD_METHOD_DENSE;
    assert_status(igrad_config_validate(&c), IGRAD_E_UNSUPPORTED);
    assert_error_has("F8_E4M3");
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.value_dtype = IGRAD_DTYPE_F8_E5M2;
    assert_status(igrad_config_validate(&c), IGRAD_E_INVALID);
    assert_error_has("F32, BF16, F16 or F8_E4M3");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_all_codes),
        cmocka_unit_test(test_encode_nearest_even),
        cmocka_unit_test(test_scale_exp),
        cmocka_unit_test(test_block_round_trip),
        cmocka_unit_test(test_scale_read),
        cmocka_unit_test(test_engine_topk),
        cmocka_unit_test(test_engine_adtopk),
        cmocka_unit_test(test_engine_momentum_reduce_fixed),
        cmocka_unit_test(test_peer_bad_bytes),
        cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
