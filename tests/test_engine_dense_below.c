/*
 * test_engine_dense_below.c — config.dense_below: tensors of fewer entries
 * are sent whole whenever they are sent (one rank, self comm). adtopk_sync:
 * the small tensors' plans keep every entry, the result of each step is
 * their gradient exactly and their residual stays 0, the large ones keep
 * their budget; the statistics count the small tensors; ig: a small
 * tensor of a deferred component accumulates while deferred and is sent
 * whole at its release (residual 0 after it, the released values the sum
 * of the deferred steps' gradients); a negative value is refused by name.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "igrad.h"
#include "test_util.h"

#define SMALL 100 /* the layout's norms have 16 entries, everything else >= 256 */

static void fill(grads_t *G, int64_t step)
{
    for (size_t t = 0; t < G->T; t++)
        for (int64_t i = 0; i < G->n[t]; i++) {
            uint64_t h = mix64(((uint64_t)step << 40) ^ ((uint64_t)t << 24) ^ (uint64_t)i);
            /* multiples of 2^-8: sums over a few steps are exact */
            G->g[t][i] = (float)((int64_t)(h % 513) - 256) / 256.0f;
        }
}

static void test_sync_sends_small_tensors_whole(void **state)
{
    (void)state;
    igrad_layout_t *L = llama_test_layout(2, 64, 16, 32, IGRAD_DTYPE_F32);
    igrad_comm_t *self = NULL;
    assert_ok(igrad_comm_create_self(&self));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.density = 0.05;
    c.threads = 1;
    c.dense_below = SMALL;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, self, &e));
    grads_t G = grads_new(L), W = grads_new(L);
    int64_t nsmall = 0, payload = 0;
    for (size_t t = 0; t < G.T; t++) {
        igrad_tensor_plan_t tp;
        assert_ok(igrad_engine_tensor_plan(e, t, &tp));
        if (G.n[t] < SMALL) {
            nsmall++;
            assert_int_equal(tp.count, G.n[t]);
        } else {
            assert_true(tp.count < G.n[t]);
        }
        payload += tp.step_nbytes;
    }
    assert_true(nsmall > 0);
    for (int64_t s = 0; s < 4; s++) {
        fill(&G, s);
        fill(&W, s);
        assert_ok(igrad_engine_sync(e, s, G.g));
        igrad_step_stats_t st;
        assert_ok(igrad_engine_last_stats(e, &st));
        assert_int_equal(st.dense_small_tensors, nsmall);
        if (s % 2 == 0) assert_int_equal(st.payload_nbytes, payload);
        for (size_t t = 0; t < G.T; t++) {
            if (G.n[t] >= SMALL) continue;
            assert_memory_equal(G.g[t], W.g[t], (size_t)G.n[t] * sizeof(float));
            const float *r = igrad_engine_residual(e, t);
            for (int64_t i = 0; i < G.n[t]; i++) assert_true(r[i] == 0.0f);
        }
    }
    igrad_engine_free(e);
    c.dense_below = -1;
    assert_status(igrad_engine_create(L, NULL, &c, self, &e), IGRAD_E_INVALID);
    assert_error_has("config.dense_below");
    grads_free(&G);
    grads_free(&W);
    igrad_comm_free(self);
    igrad_layout_free(L);
}

static void test_deferred_small_tensor_released_whole(void **state)
{
    (void)state;
    igrad_layout_t *L = llama_test_layout(2, 64, 16, 32, IGRAD_DTYPE_F32);
    igrad_profile_t *P = fixed_rule_profile(L, "fixed:0.1");
    igrad_comm_t *self = NULL;
    assert_ok(igrad_comm_create_self(&self));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_IG;
    c.density = 0.05;
    c.threads = 1;
    c.dense_below = SMALL;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, P, &c, self, &e));
    grads_t G = grads_new(L);
    size_t T = G.T;
    /* a small tensor of a deferred component */
    size_t small = T;
    igrad_tensor_plan_t tp;
    for (size_t t = 0; t < T && small == T; t++) {
        assert_ok(igrad_engine_tensor_plan(e, t, &tp));
        if (G.n[t] < SMALL && !tp.every_step) small = t;
    }
    assert_true(small < T);
    assert_ok(igrad_engine_tensor_plan(e, small, &tp));
    assert_int_equal(tp.release_count, G.n[small]);
    int64_t n = G.n[small];
    float *acc = calloc((size_t)n, sizeof *acc);
    assert_non_null(acc);
    for (int64_t s = 0; s < 2 * c.release_period; s++) {
        fill(&G, s);
        for (int64_t i = 0; i < n; i++) acc[i] += G.g[small][i];
        assert_ok(igrad_engine_sync(e, s, G.g));
        const float *r = igrad_engine_residual(e, small);
        if (s % c.release_period == tp.phase) { /* released: everything, once */
            assert_memory_equal(G.g[small], acc, (size_t)n * sizeof(float));
            for (int64_t i = 0; i < n; i++) assert_true(r[i] == 0.0f);
            for (int64_t i = 0; i < n; i++) acc[i] = 0.0f;
        } else { /* deferred: nothing arrives, the residual holds the sum */
            for (int64_t i = 0; i < n; i++) assert_true(G.g[small][i] == 0.0f);
            assert_memory_equal(r, acc, (size_t)n * sizeof(float));
        }
    }
    free(acc);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(self);
    igrad_profile_free(P);
    igrad_layout_free(L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_sends_small_tensors_whole),
        cmocka_unit_test(test_deferred_small_tensor_released_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
