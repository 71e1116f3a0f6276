/*
 * test_engine_remedies.c — the engine's error-feedback remedies (config
 * momentum with DGC's factor masking, start_iter) on the one-rank
 * "self" communicator:
 *  - validation names each field; IGRAD_CONFIG_INIT leaves them off;
 *  - topk_sync and adtopk_sync against a brute-force reference written
 *    here (velocity u = m*u + g, a = u + e, the top-k of |a| by a full sort
 *    per tensor or per row, ties to the lower index, masking, e = a -
 *    sent), bit for bit, for outputs, residuals and velocities;
 *  - conservation under deferral (ig with a profile): at every step and
 *    tensor, sent + e_new = (m*u_old + g) + e_old;
 *  - start_iter: warm-up steps are dense averages that leave residuals,
 *    velocities and the engine's step count alone; afterwards the run is
 *    bit-identical to an engine without warm-up started at that step;
 *  - save/load with velocities = uninterrupted, and a state saved with
 *    momentum refused by an engine without, naming config.momentum.
 *
 * Not here: several ranks (tests/mpi_engine.c checks the remedies agree
 * across ranks), the plain path (test_engine.c).
 * Configs pin dense_below = 0: every tensor takes the sparsifier path, which
 * the references and goldens here model (the default, 64, sends tensors
 * under 64 entries whole: tests/test_engine_dense_below.c, test_target.c).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "igrad.h"
#include "test_util.h"

/* ---- fixtures ------------------------------------------------------------- */

/* Two blocks of a LLaMA-like model plus embeddings, a norm and lm_head:
 * 2-D tensors for row-wise selection, 1-D ones for flat. */
static igrad_layout_t *make_layout(void)
{
    igrad_layout_t *L = NULL;
    assert_ok(igrad_layout_create(&L));
    int64_t emb[2] = {100, 16}, sq[2] = {16, 16}, up[2] = {40, 16}, vec[1] = {16};
    char name[128];
    assert_ok(igrad_layout_add(L, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb));
    for (int l = 0; l < 2; l++) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, sq));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.v_proj.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, sq));
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, up));
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 1, vec));
    }
    assert_ok(igrad_layout_add(L, "model.norm.weight", IGRAD_DTYPE_F32, 1, vec));
    assert_ok(igrad_layout_add(L, "lm_head.weight", IGRAD_DTYPE_F32, 2, emb));
    return L;
}

/* Half of the components important, by a made-up activity. */
static igrad_profile_t *make_profile(const igrad_layout_t *L)
{
    igrad_trace_t *tr = NULL;
    assert_ok(igrad_trace_create(L, &tr));
    assert_ok(igrad_trace_set_sparsifier(tr, IGRAD_SPARSIFIER_ADTOPK, 0.01));
    for (int64_t s = 0; s < 3; s++)
        for (size_t t = 0; t < igrad_layout_count(L); t++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(L, t, &ti));
            if (ti.component < 0) continue;
            double act = (double)((ti.component * 5) % 4 + 1);
            assert_ok(igrad_trace_record(tr, s, t, act * act, 1));
        }
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    opts.method = "fixed:0.5";
    igrad_profile_t *p = NULL;
    assert_ok(igrad_profile_build(tr, &opts, &p));
    igrad_trace_free(tr);
    return p;
}

/* Gradients as a function of (seed, step, tensor, index); a common drift
 * per tensor, so that momentum builds up, and an occasional large entry. */
static void fill(grads_t *B, uint64_t seed, int64_t step)
{
    for (size_t t = 0; t < B->T; t++)
        for (int64_t i = 0; i < B->n[t]; i++) {
            uint64_t u = mix64(seed * 0x100000001b3ULL ^ mix64((uint64_t)step * 1000003u + t) ^
                               (uint64_t)i * 0x9e3779b97f4a7c15ULL);
            float x = (float)((double)(u >> 40) / 16777216.0) * 2.0f - 1.0f;
            if ((u & 0x7f) == 0) x *= 8.0f;
            B->g[t][i] = 0.3f * x + 0.05f * (float)((i % 7) - 3);
        }
}

static void copy_bufs(grads_t *dst, const grads_t *src)
{
    for (size_t t = 0; t < src->T; t++)
        memcpy(dst->g[t], src->g[t], (size_t)src->n[t] * sizeof(float));
}

static void expect_bits(const float *got, const float *want, int64_t n, const char *what,
                        int64_t step, size_t t)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            print_error("step %lld tensor %zu %s[%lld]: got %.9g, want %.9g\n", (long long)step,
                        t, what, (long long)i, (double)got[i], (double)want[i]);
            fail();
        }
}

/* ---- config --------------------------------------------------------------- */

static void expect_invalid(const igrad_config_t *c, const char *frag)
{
    assert_int_equal(igrad_config_validate(c), IGRAD_E_INVALID);
    assert_error_has(frag);
}

static void test_config(void **state)
{
    (void)state;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    assert_true(c.momentum == 0.0);
    assert_int_equal(c.start_iter, 0);
    assert_ok(igrad_config_validate(&c));
    c.momentum = 1.0;
    expect_invalid(&c, "config.momentum is 1");
    c.momentum = -0.1;
    expect_invalid(&c, "config.momentum");
    c.momentum = NAN;
    expect_invalid(&c, "config.momentum");
    c.momentum = 0.9;
    assert_ok(igrad_config_validate(&c));
    c.start_iter = -1;
    expect_invalid(&c, "config.start_iter is -1");
    c.start_iter = 3;
    assert_ok(igrad_config_validate(&c));
}

/* ---- the reference -------------------------------------------------------- */

typedef struct ranked {
    float mag;
    int64_t i;
} ranked_t;

static int cmp_ranked(const void *pa, const void *pb)
{
    const ranked_t *a = pa, *b = pb;
    if (a->mag != b->mag) return a->mag > b->mag ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* keep[i] = 1 for the k entries of largest |a[i]| among [0, len), by a
 * full sort (ties: lower index). */
static void topk_by_sort(const float *a, int64_t len, int64_t k, unsigned char *keep)
{
    ranked_t *rk = malloc((size_t)len * sizeof *rk);
    assert_non_null(rk);
    for (int64_t i = 0; i < len; i++) {
        rk[i].mag = fabsf(a[i]);
        rk[i].i = i;
    }
    qsort(rk, (size_t)len, sizeof *rk, cmp_ranked);
    memset(keep, 0, (size_t)len);
    for (int64_t j = 0; j < k && j < len; j++) keep[rk[j].i] = 1;
    free(rk);
}

/* One step of the remedies for one tensor, everything sent every step
 * (topk_sync / adtopk_sync). u, e: the reference state, updated; out: what
 * one rank's average is (the sent values, zeros elsewhere). */
static void reference_step(const igrad_config_t *c, const igrad_tensor_info_t *ti,
                           const float *g, float *u, float *e, float *out)
{
    int64_t n = ti->count;
    float m = (float)c->momentum;
    float *a = malloc((size_t)n * sizeof *a);
    unsigned char *keep = malloc((size_t)n);
    assert_non_null(a);
    assert_non_null(keep);
    for (int64_t i = 0; i < n; i++) {
        float v = c->momentum > 0.0 ? m * u[i] + g[i] : g[i];
        if (c->momentum > 0.0) u[i] = v;
        a[i] = v + e[i];
    }
    int row_wise = c->method == IGRAD_METHOD_ADTOPK_SYNC && ti->ndim >= 2;
    int64_t rows = row_wise ? ti->shape[0] : 1, len = n / rows;
    int64_t k = row_wise ? (int64_t)ceil(c->density * (double)len) : igrad_budget(n, c->density);
    if (k < 1) k = 1;
    for (int64_t r = 0; r < rows; r++) topk_by_sort(a + r * len, len, k, keep + r * len);
    for (int64_t i = 0; i < n; i++) {
        out[i] = keep[i] ? a[i] : 0.0f;
        e[i] = keep[i] ? 0.0f : a[i];
        if (keep[i] && c->momentum > 0.0) u[i] = 0.0f;
    }
    free(a);
    free(keep);
}

static void run_reference(igrad_config_t c)
{
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_engine_t *eng = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &eng));
    grads_t G = grads_new(L), U = grads_new(L), E = grads_new(L), W = grads_new(L);
    for (int64_t s = 0; s < 8; s++) {
        fill(&G, 11, s);
        for (size_t t = 0; t < G.T; t++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(L, t, &ti));
            reference_step(&c, &ti, G.g[t], U.g[t], E.g[t], W.g[t]);
        }
        assert_ok(igrad_engine_sync(eng, s, G.g));
        for (size_t t = 0; t < G.T; t++) {
            expect_bits(G.g[t], W.g[t], G.n[t], "average", s, t);
            expect_bits(igrad_engine_residual(eng, t), E.g[t], G.n[t], "residual", s, t);
            const float *v = igrad_engine_velocity(eng, t);
            if (c.momentum > 0.0) {
                assert_non_null(v);
                expect_bits(v, U.g[t], G.n[t], "velocity", s, t);
            } else {
                assert_null(v);
            }
        }
    }
    grads_free(&G);
    grads_free(&U);
    grads_free(&E);
    grads_free(&W);
    igrad_engine_free(eng);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

static void test_reference(void **state)
{
    (void)state;
    const igrad_method_t methods[2] = {IGRAD_METHOD_TOPK_SYNC, IGRAD_METHOD_ADTOPK_SYNC};
    const double cases[] = {0.9, 0.5, 0.0};
    for (int mi = 0; mi < 2; mi++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            igrad_config_t c = IGRAD_CONFIG_INIT;
            c.dense_below = 0;
            c.method = methods[mi];
            c.density = 0.05;
            c.block_entries = 37; /* several blocks and buckets */
            c.momentum = cases[k];
            run_reference(c);
        }
}

/* ---- conservation under deferral ---------------------------------------- */

static void test_conservation_ig(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_profile_t *P = make_profile(L);
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    const double ms[2] = {0.9, 0.0};
    for (int k = 0; k < 2; k++) {
        igrad_config_t c = IGRAD_CONFIG_INIT; /* ig, adtopk, R 4 */
        c.dense_below = 0;
        c.momentum = ms[k];
        c.block_entries = 50;
        igrad_engine_t *eng = NULL;
        assert_ok(igrad_engine_create(L, P, &c, comm, &eng));
        grads_t G = grads_new(L), A = grads_new(L);
        int64_t deferred_steps = 0;
        for (int64_t s = 0; s < 12; s++) {
            fill(&G, 5, s);
            /* a = (m*u_old + g) + e_old, computed before the step */
            for (size_t t = 0; t < G.T; t++) {
                const float *u = igrad_engine_velocity(eng, t), *e = igrad_engine_residual(eng, t);
                for (int64_t i = 0; i < G.n[t]; i++) {
                    double v = (double)G.g[t][i] + (u ? c.momentum * (double)u[i] : 0.0);
                    A.g[t][i] = (float)(v + (double)e[i]);
                }
            }
            assert_ok(igrad_engine_sync(eng, s, G.g));
            for (size_t t = 0; t < G.T; t++) {
                const float *e = igrad_engine_residual(eng, t);
                int sent = 0;
                for (int64_t i = 0; i < G.n[t]; i++) {
                    double lhs = (double)G.g[t][i] + (double)e[i];
                    double tol = 1e-5 * (1.0 + fabs((double)A.g[t][i]));
                    if (fabs(lhs - (double)A.g[t][i]) > tol) {
                        print_error("config %d step %lld tensor %zu entry %lld: sent + e = "
                                    "%.9g, m*u + g + e = %.9g\n",
                                    k, (long long)s, t, (long long)i, lhs, (double)A.g[t][i]);
                        fail();
                    }
                    if (G.g[t][i] != 0.0f) sent = 1;
                }
                if (!sent) deferred_steps++;
            }
        }
        assert_true(deferred_steps > 0); /* the profile deferred something */
        grads_free(&G);
        grads_free(&A);
        igrad_engine_free(eng);
    }
    igrad_comm_free(comm);
    igrad_profile_free(P);
    igrad_layout_free(L);
}

/* ---- dense warm-up ---------------------------------------------------------- */

static void test_start_iter(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_profile_t *P = make_profile(L);
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.momentum = 0.9;
    c.start_iter = 3;
    igrad_config_t plain = c;
    plain.start_iter = 0;
    igrad_engine_t *warm = NULL, *ref = NULL;
    assert_ok(igrad_engine_create(L, P, &c, comm, &warm));
    assert_ok(igrad_engine_create(L, P, &plain, comm, &ref));
    grads_t G = grads_new(L), H = grads_new(L);
    int64_t total = igrad_layout_total_count(L);
    char dir[] = "/tmp/igrad_warm_XXXXXX", path[64], early[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/state.bin", dir);
    snprintf(early, sizeof early, "%s/early.bin", dir);
    int64_t warm_bytes = 0;
    for (int64_t s = 0; s < 3; s++) {
        if (s == 2) assert_ok(igrad_engine_save_state(warm, early));
        fill(&G, 9, s);
        copy_bufs(&H, &G);
        /* two-phase on the first, sync on the others */
        if (s == 0) {
            const igrad_bucket_t *b;
            size_t nb;
            assert_ok(igrad_engine_begin(warm, s, G.g, &b, &nb));
            assert_ok(igrad_engine_end(warm, s, G.g));
        } else {
            assert_ok(igrad_engine_sync(warm, s, G.g));
        }
        for (size_t t = 0; t < G.T; t++) {
            expect_bits(G.g[t], H.g[t], G.n[t], "warm-up average (one rank)", s, t);
            for (int64_t i = 0; i < G.n[t]; i++) {
                assert_true(igrad_engine_residual(warm, t)[i] == 0.0f);
                assert_true(igrad_engine_velocity(warm, t)[i] == 0.0f);
            }
        }
        igrad_step_stats_t st;
        assert_ok(igrad_engine_last_stats(warm, &st));
        assert_int_equal(st.payload_nbytes, total * 4);
        assert_int_equal(igrad_engine_predict_payload(warm, s), total * 4);
        if (s == 0) warm_bytes = st.dataplane_nbytes;
        assert_int_equal(st.dataplane_nbytes, warm_bytes);
        assert_int_equal(igrad_engine_step(warm), s);
    }
    assert_true(igrad_engine_predict_payload(warm, 3) < total * 4);
    assert_int_equal(igrad_engine_predict_payload(warm, 2), total * 4);
    /* the warm-up's dense all-reduce room is counted, and freed after it */
    size_t during = igrad_engine_workspace_nbytes(warm);
    assert_true(during >= igrad_engine_workspace_nbytes(ref) + (size_t)total * sizeof(float) / 2);
    for (int64_t s = 3; s < 12; s++) {
        fill(&G, 9, s);
        copy_bufs(&H, &G);
        if (s == 6) { /* a state after the warm-up, into a fresh engine */
            assert_ok(igrad_engine_save_state(warm, path));
            igrad_engine_free(warm);
            assert_ok(igrad_engine_create(L, P, &c, comm, &warm));
            assert_ok(igrad_engine_load_state(warm, path));
            assert_int_equal(igrad_engine_step(warm), 5);
        }
        assert_ok(igrad_engine_sync(warm, s, G.g));
        assert_ok(igrad_engine_sync(ref, s, H.g));
        if (s == 3) assert_true(igrad_engine_workspace_nbytes(warm) + (size_t)total < during);
        igrad_step_stats_t sw, sr;
        assert_ok(igrad_engine_last_stats(warm, &sw));
        assert_ok(igrad_engine_last_stats(ref, &sr));
        assert_int_equal(sw.dataplane_nbytes, sr.dataplane_nbytes); /* the room is gone */
        for (size_t t = 0; t < G.T; t++) {
            expect_bits(G.g[t], H.g[t], G.n[t], "after warm-up vs fresh", s, t);
            expect_bits(igrad_engine_residual(warm, t), igrad_engine_residual(ref, t), G.n[t],
                        "residual", s, t);
            expect_bits(igrad_engine_velocity(warm, t), igrad_engine_velocity(ref, t), G.n[t],
                        "velocity", s, t);
        }
    }
    /* a state of the warm-up loaded after it: dense again (the room regrown) */
    assert_ok(igrad_engine_load_state(warm, early));
    fill(&G, 9, 2);
    copy_bufs(&H, &G);
    assert_ok(igrad_engine_sync(warm, 2, G.g));
    for (size_t t = 0; t < G.T; t++) expect_bits(G.g[t], H.g[t], G.n[t], "warm-up again", 2, t);
    assert_int_equal(igrad_engine_predict_payload(warm, 2), total * 4);
    igrad_step_stats_t again;
    assert_ok(igrad_engine_last_stats(warm, &again));
    assert_int_equal(again.dataplane_nbytes, warm_bytes);
    remove(path);
    remove(early);
    rmdir(dir);
    grads_free(&G);
    grads_free(&H);
    igrad_engine_free(warm);
    igrad_engine_free(ref);
    igrad_comm_free(comm);
    igrad_profile_free(P);
    igrad_layout_free(L);
}

/* ---- state file ------------------------------------------------------------- */

static void test_save_load_velocity(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.density = 0.05;
    c.momentum = 0.9;
    char dir[] = "/tmp/igrad_remedies_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/state.bin", dir);
    igrad_engine_t *a = NULL, *b = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &a));
    grads_t G = grads_new(L), H = grads_new(L);
    for (int64_t s = 0; s < 5; s++) {
        fill(&G, 3, s);
        assert_ok(igrad_engine_sync(a, s, G.g));
    }
    assert_ok(igrad_engine_save_state(a, path));
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &b));
    assert_ok(igrad_engine_load_state(b, path));
    for (int64_t s = 5; s < 9; s++) {
        fill(&G, 3, s);
        copy_bufs(&H, &G);
        assert_ok(igrad_engine_sync(a, s, G.g));
        assert_ok(igrad_engine_sync(b, s, H.g));
        for (size_t t = 0; t < G.T; t++) {
            expect_bits(H.g[t], G.g[t], G.n[t], "resumed average", s, t);
            expect_bits(igrad_engine_velocity(b, t), igrad_engine_velocity(a, t), G.n[t],
                        "resumed velocity", s, t);
            expect_bits(igrad_engine_residual(b, t), igrad_engine_residual(a, t), G.n[t],
                        "resumed residual", s, t);
        }
    }
    igrad_engine_free(b);
    /* the same file into an engine without momentum */
    igrad_config_t off = c;
    off.momentum = 0.0;
    assert_ok(igrad_engine_create(L, NULL, &off, comm, &b));
    assert_int_equal(igrad_engine_load_state(b, path), IGRAD_E_MISMATCH);
    assert_error_has("config.momentum");
    igrad_engine_free(b);
    remove(path);
    rmdir(dir);
    grads_free(&G);
    grads_free(&H);
    igrad_engine_free(a);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_conservation_ig),
        cmocka_unit_test(test_start_iter),
        cmocka_unit_test(test_save_load_velocity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
