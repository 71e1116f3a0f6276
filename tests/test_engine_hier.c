/*
 * test_engine_hier.c — the two-level sync on one rank (self comm): one
 * node of one rank, so its shard is the whole layout and every step must
 * equal a flat engine's bit for bit (gradients and residuals) for every
 * method; the plan-only form's arguments; refusals named (begin, open,
 * set_trace, set_profile, online profiling, a custom comm, which cannot
 * be split). The multi-rank semantics are tests/mpi_hier.c's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "igrad.h"
#include "test_util.h"

static igrad_layout_t *layout(void)
{
    return llama_test_layout(2, 64, 16, 32, IGRAD_DTYPE_F32);
}

static void fill(grads_t *G, int64_t step)
{
    for (size_t t = 0; t < G->T; t++)
        for (int64_t i = 0; i < G->n[t]; i++) {
            uint64_t h = mix64(((uint64_t)step << 40) ^ ((uint64_t)t << 24) ^ (uint64_t)i);
            G->g[t][i] = (float)((double)(h >> 11) / 9007199254740992.0 - 0.5);
        }
}

static void test_one_rank_equals_flat(void **state)
{
    (void)state;
    igrad_layout_t *L = layout();
    igrad_profile_t *P = fixed_rule_profile(L, "fixed:0.4");
    igrad_comm_t *self = NULL;
    assert_ok(igrad_comm_create_self(&self));
    const igrad_method_t methods[] = {IGRAD_METHOD_DENSE, IGRAD_METHOD_TOPK_SYNC,
                                      IGRAD_METHOD_ADTOPK_SYNC, IGRAD_METHOD_IAD,
                                      IGRAD_METHOD_IG};
    for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++) {
        igrad_config_t c = IGRAD_CONFIG_INIT;
        c.method = methods[m];
        c.density = 0.05;
        c.block_entries = 64;
        c.threads = 1;
        igrad_config_t h = c;
        h.topology = IGRAD_TOPOLOGY_HIER;
        igrad_engine_t *ef = NULL, *eh = NULL;
        assert_ok(igrad_engine_create(L, P, &c, self, &ef));
        assert_ok(igrad_engine_create(L, P, &h, self, &eh));
        grads_t A = grads_new(L), B = grads_new(L);
        for (int64_t s = 0; s < 9; s++) {
            fill(&A, s);
            fill(&B, s);
            assert_ok(igrad_engine_sync(ef, s, A.g));
            assert_ok(igrad_engine_sync(eh, s, B.g));
            for (size_t t = 0; t < A.T; t++) {
                assert_memory_equal(A.g[t], B.g[t], (size_t)A.n[t] * sizeof(float));
                const float *ra = igrad_engine_residual(ef, t), *rb = igrad_engine_residual(eh, t);
                assert_true((ra == NULL) == (rb == NULL));
                if (ra) assert_memory_equal(ra, rb, (size_t)A.n[t] * sizeof(float));
                igrad_tensor_plan_t pa, pb;
                assert_ok(igrad_engine_tensor_plan(ef, t, &pa));
                assert_ok(igrad_engine_tensor_plan(eh, t, &pb));
                assert_memory_equal(&pa, &pb, sizeof pa);
            }
            igrad_step_stats_t sa, sb;
            assert_ok(igrad_engine_last_stats(ef, &sa));
            assert_ok(igrad_engine_last_stats(eh, &sb));
            assert_int_equal(sa.payload_nbytes, sb.payload_nbytes);
            assert_int_equal(sb.intra_wire_nbytes, 0);
            assert_int_equal(igrad_engine_predict_payload(ef, s + 1),
                             igrad_engine_predict_payload(eh, s + 1));
        }
        assert_int_equal(igrad_engine_step(eh), 8);
        igrad_config_t back;
        assert_ok(igrad_engine_config(eh, &back));
        assert_int_equal(back.topology, IGRAD_TOPOLOGY_HIER);
        grads_free(&A);
        grads_free(&B);
        igrad_engine_free(ef);
        igrad_engine_free(eh);
    }
    igrad_comm_free(self);
    igrad_profile_free(P);
    igrad_layout_free(L);
}

static void test_refusals(void **state)
{
    (void)state;
    igrad_layout_t *L = layout();
    igrad_profile_t *P = fixed_rule_profile(L, "fixed:0.4");
    igrad_comm_t *self = NULL;
    assert_ok(igrad_comm_create_self(&self));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.topology = IGRAD_TOPOLOGY_HIER;
    c.threads = 1;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, P, &c, self, &e));
    grads_t G = grads_new(L);
    const igrad_bucket_t *bk = NULL;
    size_t nb = 0;
    assert_status(igrad_engine_begin(e, 0, G.g, &bk, &nb), IGRAD_E_UNSUPPORTED);
    assert_error_has("igrad_engine_begin");
    assert_error_has("igrad_engine_sync");
    assert_status(igrad_engine_open(e, 0), IGRAD_E_UNSUPPORTED);
    assert_status(igrad_engine_set_profile(e, P), IGRAD_E_UNSUPPORTED);
    igrad_trace_t *tr = NULL;
    assert_ok(igrad_trace_create(L, &tr));
    assert_status(igrad_engine_set_trace(e, tr), IGRAD_E_UNSUPPORTED);
    igrad_trace_free(tr);
    /* the step still runs */
    fill(&G, 0);
    assert_ok(igrad_engine_sync(e, 0, G.g));
    igrad_engine_free(e);

    /* online profiling needs the flat engine */
    igrad_config_t o = c;
    o.profile_steps = 8;
    e = NULL;
    assert_status(igrad_engine_create(L, NULL, &o, self, &e), IGRAD_E_UNSUPPORTED);
    assert_error_has("profile");
    assert_null(e);
    /* a bad topology value */
    igrad_config_t b = c;
    b.topology = (igrad_topology_t)7;
    assert_status(igrad_engine_create(L, P, &b, self, &e), IGRAD_E_INVALID);
    assert_error_has("config.topology");
    /* names */
    igrad_topology_t tp;
    assert_ok(igrad_topology_from_name("HIER", &tp));
    assert_int_equal(tp, IGRAD_TOPOLOGY_HIER);
    assert_string_equal(igrad_topology_name(IGRAD_TOPOLOGY_FLAT), "flat");
    assert_status(igrad_topology_from_name("tree", &tp), IGRAD_E_INVALID);

    /* plan-only: ranks_per_node is required and must divide P */
    igrad_engine_t *p = NULL;
    assert_status(igrad_engine_create_plan(L, P, &c, 8, &p), IGRAD_E_INVALID);
    assert_error_has("ranks_per_node");
    c.ranks_per_node = 3;
    assert_status(igrad_engine_create_plan(L, P, &c, 8, &p), IGRAD_E_INVALID);
    c.ranks_per_node = 4;
    assert_ok(igrad_engine_create_plan(L, P, &c, 8, &p));
    igrad_step_stats_t s;
    igrad_planned_bucket_t pb[32];
    size_t n = 0;
    assert_ok(igrad_engine_plan_step(p, 0, &s, pb, 32, &n));
    assert_true(n > 0);
    int seen[4] = {0};
    for (size_t j = 0; j < n && j < 32; j++) {
        assert_true(pb[j].local_rank >= 0 && pb[j].local_rank < 4);
        seen[pb[j].local_rank] = 1;
    }
    for (int l = 0; l < 4; l++) assert_true(seen[l]); /* every shard has buckets */
    assert_near(s.intra_wire_nbytes, 2.0 * 3.0 / 4.0 * 4.0 * (double)igrad_layout_total_count(L),
                0.0);
    assert_status(igrad_engine_sync(p, 0, G.g), IGRAD_E_STATE);
    igrad_engine_free(p);
    grads_free(&G);
    igrad_comm_free(self);
    igrad_profile_free(P);
    igrad_layout_free(L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_rank_equals_flat),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
