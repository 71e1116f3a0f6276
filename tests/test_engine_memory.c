/*
 * test_engine_memory.c — the memory statistics (igrad_step_stats_t
 * dataplane_nbytes, dataplane_nbytes_per_param) on the self communicator:
 * the residual is 4 bytes per parameter and momentum adds exactly 4 more,
 * the dense warm-up holds method dense's F32 all-reduce room (about 4
 * bytes per parameter) in the engine's own arenas until its last step and
 * frees it at the first step after (back to the plain method's bytes),
 * the rest (staged selection, buckets) is a small share at density 0.01
 * and smaller with BF16 values, method dense holds only its bucket room,
 * a skipped step reports the same bytes, and the per-parameter
 * figure is the bytes over the layout's parameters.
 *
 * Not here: what the bytes are used for (test_engine.c, test_value16.c).
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

/* The statistics of steps 0 .. nsteps - 1 of one engine into out[]. */
static void steps(const igrad_layout_t *L, igrad_config_t c, int64_t nsteps,
                  igrad_step_stats_t *out)
{
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    grads_t G = grads_new(L);
    for (int64_t s = 0; s < nsteps; s++) {
        for (size_t t = 0; t < G.T; t++)
            for (int64_t i = 0; i < G.n[t]; i++)
                G.g[t][i] = (float)((double)(mix64((uint64_t)(t * 100003 + (size_t)i + s)) >> 11) *
                                        0x1p-53 -
                                    0.5);
        assert_ok(igrad_engine_sync(e, s, G.g));
        assert_ok(igrad_engine_last_stats(e, &out[s]));
    }
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(comm);
}

static igrad_step_stats_t one_step(const igrad_layout_t *L, igrad_config_t c, int nonfinite)
{
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    grads_t G = grads_new(L);
    for (size_t t = 0; t < G.T; t++)
        for (int64_t i = 0; i < G.n[t]; i++)
            G.g[t][i] = (float)((double)(mix64((uint64_t)(t * 100003 + (size_t)i)) >> 11) *
                                    0x1p-53 -
                                0.5);
    if (nonfinite) G.g[0][3] = NAN;
    igrad_status_t st = igrad_engine_sync(e, 0, G.g);
    assert_int_equal(st, nonfinite ? IGRAD_E_NONFINITE : IGRAD_OK);
    igrad_step_stats_t s;
    assert_ok(igrad_engine_last_stats(e, &s));
    assert_int_equal(s.skipped, nonfinite);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    return s;
}

static void test_dataplane_bytes(void **state)
{
    (void)state;
    igrad_layout_t *L = llama_test_layout(2, 500, 64, 160, IGRAD_DTYPE_F32);
    int64_t N = igrad_layout_total_count(L);
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    igrad_step_stats_t plain = one_step(L, c, 0);
    assert_true(plain.dataplane_nbytes > 4 * N);
    assert_true(plain.dataplane_nbytes < 4 * N + N / 2); /* residual + < 0.5 B/param */
    assert_true(plain.dataplane_nbytes_per_param ==
                (double)plain.dataplane_nbytes / (double)N);
    igrad_step_stats_t skipped = one_step(L, c, 1);
    assert_int_equal(skipped.dataplane_nbytes, plain.dataplane_nbytes);

    igrad_config_t m = c;
    m.momentum = 0.9;
    assert_int_equal(one_step(L, m, 0).dataplane_nbytes, plain.dataplane_nbytes + 4 * N);

    igrad_config_t b = c;
    b.value_dtype = IGRAD_DTYPE_BF16;
    int64_t bf = one_step(L, b, 0).dataplane_nbytes;
    assert_true(bf < plain.dataplane_nbytes && bf > 4 * N);

    igrad_config_t d = IGRAD_CONFIG_INIT;
    d.method = IGRAD_METHOD_DENSE;
    int64_t dn = one_step(L, d, 0).dataplane_nbytes;
    assert_true(dn >= 4 * N && dn < 4 * N + N / 2); /* the all-reduce room, no residual */

    /* The warm-up: the residual and method dense's all-reduce room at
     * least, in arenas shared with the method (less than a dense engine
     * beside it would add); the same at every warm-up step; after it, the
     * plain method's bytes. */
    igrad_config_t w = c;
    w.start_iter = 3;
    igrad_step_stats_t ws[6];
    steps(L, w, 6, ws);
    for (int s = 0; s < 3; s++) {
        assert_true(ws[s].dataplane_nbytes >= dn + 4 * N);
        assert_true(ws[s].dataplane_nbytes < plain.dataplane_nbytes + dn);
        assert_int_equal(ws[s].dataplane_nbytes, ws[0].dataplane_nbytes);
        assert_int_equal(ws[s].payload_nbytes, 4 * N); /* a dense step */
    }
    for (int s = 3; s < 6; s++) {
        assert_int_equal(ws[s].dataplane_nbytes, plain.dataplane_nbytes);
        assert_true(ws[s].payload_nbytes < N);
    }
    igrad_layout_free(L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dataplane_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
