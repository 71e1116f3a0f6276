/*
 * test_engine_online.c — online profiling (config.profile_steps) and
 * igrad_engine_set_profile on one rank: every component is sent during the
 * window; the switch happens at the first begin after it; the built
 * profile is the one `igrad profile` builds from the engine's own trace;
 * the plan after the switch is the plan of an engine created with that
 * profile; gradients are conserved through the switch (sum in = sum
 * applied + residual); a refused re-plan changes nothing; the state file
 * resumes a run stopped inside and after the window exactly; and the
 * hysteresis rule against hand-computed cases.
 * The same switch on 2 and 4 ranks is in mpi_engine.c.
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
#include "engine_online.h" /* igrad__hysteresis_update */

/* 3 LLaMA blocks with embeddings, norms and lm_head. */
static igrad_layout_t *make_layout(void)
{
    return llama_test_layout(3, 300, 32, 64, IGRAD_DTYPE_F32);
}

/* Tensor t's scale differs by a factor of up to 9, so the profile has a
 * clear split; entries are deterministic in (seed, step, t, i). */
static void grads_fill(grads_t *G, uint64_t seed, int64_t step)
{
    for (size_t t = 0; t < G->T; t++) {
        float scale = 0.1f + 0.1f * (float)((t * 7) % 9);
        for (int64_t i = 0; i < G->n[t]; i++) {
            uint64_t u = mix64(seed * 0x100000001b3ULL ^ mix64((uint64_t)step * 1000003u + t) ^
                               (uint64_t)i * 0x9e3779b97f4a7c15ULL);
            float x = (float)((double)(u >> 40) / 16777216.0) * 2.0f - 1.0f;
            G->g[t][i] = scale * x;
        }
    }
}

static igrad_config_t online_config(int64_t W)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_IG;
    c.profile_steps = W;
    c.profile_partition = "fixed:0.4";
    c.buckets = 3;
    c.threads = 1;
    return c;
}

static void assert_plans_equal(const igrad_engine_t *a, const igrad_engine_t *b, size_t T,
                               int R)
{
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_plan_t pa, pb;
        assert_ok(igrad_engine_tensor_plan(a, t, &pa));
        assert_ok(igrad_engine_tensor_plan(b, t, &pb));
        assert_int_equal(pa.every_step, pb.every_step);
        assert_int_equal(pa.important, pb.important);
        assert_int_equal(pa.phase, pb.phase);
        assert_int_equal(pa.count, pb.count);
        assert_int_equal(pa.release_count, pb.release_count);
    }
    for (int64_t s = 100; s < 100 + 2 * R; s++)
        assert_int_equal(igrad_engine_predict_payload(a, s), igrad_engine_predict_payload(b, s));
}

/* ---- the switch ------------------------------------------------------------ */

static void test_switch_conservation(void **state)
{
    (void)state;
    const int64_t W = 6, steps = 27;
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = online_config(W);
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    /* the engine's own records, through the public trace hook, for the
     * offline reference profile */
    igrad_trace_t *tr = NULL;
    assert_ok(igrad_trace_create(L, &tr));
    assert_ok(igrad_engine_set_trace(e, tr));
    size_t T = igrad_layout_count(L);
    grads_t G = grads_new(L);
    double **in = calloc(T, sizeof *in), **out = calloc(T, sizeof *out);
    double **mag = calloc(T, sizeof *mag);
    assert_non_null(in);
    assert_non_null(out);
    assert_non_null(mag);
    for (size_t t = 0; t < T; t++) {
        in[t] = calloc((size_t)G.n[t], sizeof(double));
        out[t] = calloc((size_t)G.n[t], sizeof(double));
        mag[t] = calloc((size_t)G.n[t], sizeof(double));
        assert_true(in[t] && out[t] && mag[t]);
    }
    for (int64_t s = 0; s < steps; s++) {
        igrad_online_info_t oi;
        assert_ok(igrad_engine_online_info(e, &oi));
        /* the switch is made by the first begin after the window */
        assert_int_equal(oi.profiling, s <= W);
        assert_int_equal(oi.steps_recorded, s < W ? s : W);
        if (s <= W) {
            assert_null(igrad_engine_profile(e));
            for (size_t t = 0; t < T; t++) {
                igrad_tensor_plan_t tp;
                assert_ok(igrad_engine_tensor_plan(e, t, &tp));
                assert_int_equal(tp.every_step, 1); /* the window sends everything */
            }
        }
        grads_fill(&G, 9, s);
        for (size_t t = 0; t < T; t++)
            for (int64_t i = 0; i < G.n[t]; i++) {
                in[t][i] += G.g[t][i];
                mag[t][i] += fabs((double)G.g[t][i]);
            }
        assert_ok(igrad_engine_sync(e, s, G.g));
        for (size_t t = 0; t < T; t++)
            for (int64_t i = 0; i < G.n[t]; i++) out[t][i] += G.g[t][i];
        if (s == W) {
            assert_ok(igrad_engine_online_info(e, &oi));
            assert_int_equal(oi.profiling, 0);
            assert_int_equal(oi.switch_step, W);
            assert_int_equal(oi.replans, 1);
            assert_true(oi.build_ms >= 0.0 && oi.gather_ms >= 0.0);
            igrad_step_stats_t st;
            assert_ok(igrad_engine_last_stats(e, &st));
            assert_true(st.deferred_components + st.released_components > 0);
        }
    }
    /* conservation through the switch */
    for (size_t t = 0; t < T; t++) {
        const float *r = igrad_engine_residual(e, t);
        assert_non_null(r);
        double err = 0.0, ref = 0.0;
        for (int64_t i = 0; i < G.n[t]; i++) {
            double d = in[t][i] - out[t][i] - (double)r[i];
            err += d * d;
            ref += mag[t][i] * mag[t][i];
        }
        if (!(sqrt(err) <= 1e-5 * sqrt(ref))) {
            print_error("tensor %zu: |sum g - sum applied - e| = %.9g, 1e-5 x |sum |g|| = %.9g\n",
                        t, sqrt(err), 1e-5 * sqrt(ref));
            fail();
        }
    }

    /* the built profile is igrad profile's over the window's records */
    const igrad_profile_t *built = igrad_engine_profile(e);
    assert_non_null(built);
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    opts.method = "fixed:0.4";
    opts.window_end = W;
    igrad_profile_t *ref = NULL;
    assert_ok(igrad_profile_build(tr, &opts, &ref));
    assert_int_equal(igrad_profile_count(built), igrad_profile_count(ref));
    int nimp = 0;
    for (size_t i = 0; i < igrad_profile_count(ref); i++) {
        igrad_profile_entry_t a, b;
        assert_ok(igrad_profile_entry(built, i, &a));
        assert_ok(igrad_profile_entry(ref, i, &b));
        assert_int_equal(a.important, b.important);
        assert_true(a.score == b.score);
        nimp += a.important;
    }
    assert_int_equal(nimp, (int)ceil(0.4 * (double)igrad_profile_count(ref) - 1e-9));
    assert_string_equal(igrad_profile_sparsifier(built), "adtopk");

    /* its plan is the plan of an engine created with that profile */
    igrad_config_t c2 = c;
    c2.profile_steps = 0;
    igrad_engine_t *e2 = NULL;
    assert_ok(igrad_engine_create(L, built, &c2, comm, &e2));
    assert_plans_equal(e, e2, T, c.release_period);

    igrad_engine_free(e2);
    igrad_profile_free(ref);
    for (size_t t = 0; t < T; t++) {
        free(in[t]);
        free(out[t]);
        free(mag[t]);
    }
    free(in);
    free(out);
    free(mag);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_trace_free(tr);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

/* config.target_ratio: at the switch the engine fits the important set and
 * kappa to the target (igrad_target_fit on the built profile), plans as a
 * fresh engine given that profile and kappa would, sends at most the
 * target share of adtopk_sync's payload, and a state saved after the
 * switch loads into a fresh online engine with the same plan. */
static void test_target_switch(void **state)
{
    (void)state;
    const int64_t W = 6, steps = 12;
    const double target = 0.3;
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = online_config(W);
    c.target_ratio = target;
    c.release_keep = 0.5; /* what the fit must replace */
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    size_t T = igrad_layout_count(L);
    grads_t G = grads_new(L);
    for (int64_t s = 0; s < steps; s++) {
        grads_fill(&G, 3, s);
        assert_ok(igrad_engine_sync(e, s, G.g));
    }
    const igrad_profile_t *built = igrad_engine_profile(e);
    assert_non_null(built);
    igrad_target_fit_t fit;
    assert_ok(igrad_target_fit(L, built, &c, target, IGRAD_TARGET_MIN_KEEP, &fit));
    assert_true(fit.met);
    igrad_config_t now;
    assert_ok(igrad_engine_config(e, &now));
    assert_true(now.release_keep == fit.release_keep);
    assert_true(now.release_keep != c.release_keep); /* the fit moved kappa */
    for (size_t i = 0; i < igrad_profile_count(built); i++) {
        igrad_profile_entry_t en;
        assert_ok(igrad_profile_entry(built, i, &en));
        assert_int_equal(en.important, en.score >= fit.tau);
    }
    /* the plan of an engine given the fitted profile and kappa */
    igrad_config_t c2 = c;
    c2.profile_steps = 0;
    c2.target_ratio = 0.0;
    c2.release_keep = fit.release_keep;
    igrad_engine_t *e2 = NULL;
    assert_ok(igrad_engine_create(L, built, &c2, comm, &e2));
    assert_plans_equal(e, e2, T, c.release_period);
    /* at most the target share of adtopk_sync's payload over a cycle */
    igrad_config_t c3 = IGRAD_CONFIG_INIT;
    c3.method = IGRAD_METHOD_ADTOPK_SYNC;
    c3.threads = 1;
    igrad_engine_t *e3 = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c3, comm, &e3));
    double mine = 0.0, sync = 0.0;
    for (int64_t s = 100; s < 100 + 2 * c.release_period; s++) {
        mine += (double)igrad_engine_predict_payload(e, s);
        sync += (double)igrad_engine_predict_payload(e3, s);
    }
    assert_true(mine <= target * sync * (1 + 1e-12));
    /* save after the switch, load into a fresh online engine */
    char dir[] = "/tmp/igrad_target_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/state.bin", dir);
    assert_ok(igrad_engine_save_state(e, path));
    igrad_engine_t *b = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &b));
    assert_ok(igrad_engine_load_state(b, path));
    assert_plans_equal(b, e, T, c.release_period);
    igrad_config_t cb;
    assert_ok(igrad_engine_config(b, &cb));
    assert_true(cb.release_keep == fit.release_keep);
    remove(path);
    rmdir(dir);
    igrad_engine_free(b);
    igrad_engine_free(e3);
    igrad_engine_free(e2);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

/* set_profile mid-run: refused calls change nothing; an accepted one keeps
 * the residuals bit for bit and plans as a fresh engine would. */
static void test_set_profile(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = online_config(50);
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    size_t T = igrad_layout_count(L);
    grads_t G = grads_new(L);
    for (int64_t s = 0; s < 3; s++) {
        grads_fill(&G, 3, s);
        assert_ok(igrad_engine_sync(e, s, G.g));
    }
    int64_t total = igrad_layout_total_count(L);
    float *before = malloc((size_t)total * sizeof *before);
    assert_non_null(before);
    int64_t off = 0;
    for (size_t t = 0; t < T; t++) {
        memcpy(before + off, igrad_engine_residual(e, t), (size_t)G.n[t] * sizeof(float));
        off += G.n[t];
    }
    assert_status(igrad_engine_set_profile(e, NULL), IGRAD_E_INVALID);
    assert_error_has("profile is NULL");

    /* a profile of another layout */
    igrad_layout_t *L2 = NULL;
    int64_t sq[2] = {8, 8};
    assert_ok(igrad_layout_create(&L2));
    assert_ok(igrad_layout_add(L2, "model.layers.0.self_attn.q_proj.weight", IGRAD_DTYPE_F32, 2,
                               sq));
    igrad_trace_t *tr2 = NULL;
    assert_ok(igrad_trace_create(L2, &tr2));
    assert_ok(igrad_trace_record(tr2, 0, 0, 1.0, 1));
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    igrad_profile_t *p2 = NULL;
    assert_ok(igrad_profile_build(tr2, &opts, &p2));
    assert_status(igrad_engine_set_profile(e, p2), IGRAD_E_MISMATCH);
    igrad_online_info_t oi;
    assert_ok(igrad_engine_online_info(e, &oi));
    assert_int_equal(oi.profiling, 1);
    assert_int_equal(oi.replans, 0);

    /* a good one: from a trace whose activity is the tensor's index */
    igrad_trace_t *tr = NULL;
    assert_ok(igrad_trace_create(L, &tr));
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        assert_ok(igrad_layout_tensor(L, t, &ti));
        if (ti.component >= 0) assert_ok(igrad_trace_record(tr, 0, t, (double)(t * t), 1));
    }
    opts.method = "fixed:0.5";
    igrad_profile_t *p = NULL;
    assert_ok(igrad_profile_build(tr, &opts, &p));
    assert_ok(igrad_engine_set_profile(e, p));
    assert_ok(igrad_engine_online_info(e, &oi));
    assert_int_equal(oi.profiling, 0);
    assert_int_equal(oi.switch_step, 3);
    assert_int_equal(igrad_engine_step(e), 2);
    off = 0;
    for (size_t t = 0; t < T; t++) {
        assert_memory_equal(before + off, igrad_engine_residual(e, t),
                            (size_t)G.n[t] * sizeof(float));
        off += G.n[t];
    }
    igrad_config_t c2 = c;
    c2.profile_steps = 0;
    igrad_engine_t *e2 = NULL;
    assert_ok(igrad_engine_create(L, p, &c2, comm, &e2));
    assert_plans_equal(e, e2, T, c.release_period);
    grads_fill(&G, 3, 3);
    assert_ok(igrad_engine_sync(e, 3, G.g));

    /* methods without a profile refuse it */
    igrad_config_t cd = IGRAD_CONFIG_INIT;
    cd.method = IGRAD_METHOD_ADTOPK_SYNC;
    igrad_engine_t *ed = NULL;
    assert_ok(igrad_engine_create(L, NULL, &cd, comm, &ed));
    assert_status(igrad_engine_set_profile(ed, p), IGRAD_E_INVALID);
    assert_error_has("uses no profile");

    igrad_engine_free(ed);
    igrad_engine_free(e2);
    igrad_profile_free(p);
    igrad_profile_free(p2);
    igrad_trace_free(tr);
    igrad_trace_free(tr2);
    igrad_layout_free(L2);
    free(before);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

static void test_config(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_engine_t *e = NULL;
    igrad_config_t c = online_config(-1);
    assert_status(igrad_config_validate(&c), IGRAD_E_INVALID);
    assert_error_has("config.profile_steps");
    c = online_config(5);
    c.method = IGRAD_METHOD_TOPK_SYNC;
    assert_status(igrad_config_validate(&c), IGRAD_E_INVALID);
    assert_error_has("uses no profile");
    c = online_config(5);
    c.profile_partition = "median";
    assert_status(igrad_config_validate(&c), IGRAD_E_INVALID);
    assert_error_has("config.profile_partition");
    c = online_config(5);
    c.profile_alpha = 1.5;
    assert_status(igrad_config_validate(&c), IGRAD_E_INVALID);
    /* ig without a profile and without a window */
    c = online_config(0);
    assert_status(igrad_engine_create(L, NULL, &c, comm, &e), IGRAD_E_INVALID);
    assert_error_has("profile_steps");
    assert_null(e);
    /* a profile and a window */
    igrad_trace_t *tr = NULL;
    assert_ok(igrad_trace_create(L, &tr));
    assert_ok(igrad_trace_record(tr, 0, 1, 1.0, 1));
    igrad_profile_options_t po = IGRAD_PROFILE_OPTIONS_INIT;
    igrad_profile_t *p = NULL;
    assert_ok(igrad_profile_build(tr, &po, &p));
    c = online_config(5);
    assert_status(igrad_engine_create(L, p, &c, comm, &e), IGRAD_E_INVALID);
    assert_error_has("pass one");
    assert_null(e);
    igrad_profile_free(p);
    igrad_trace_free(tr);
    /* the partition string is copied: the caller's buffer may change */
    char part[16] = "fixed:0.4";
    c = online_config(4);
    c.profile_partition = part;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    strcpy(part, "bogus");
    igrad_config_t got;
    assert_ok(igrad_engine_config(e, &got));
    assert_string_equal(got.profile_partition, "fixed:0.4");
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

/* ---- state: stopped inside and after the window ------------------------ */

static char tmpdir[256];

static void run_reference(const igrad_layout_t *L, const igrad_config_t *c, int64_t steps,
                          grads_t *G, igrad_engine_t **out)
{
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    (void)comm;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, c, comm, &e));
    for (int64_t s = 0; s < steps; s++) {
        grads_fill(G, 5, s);
        assert_ok(igrad_engine_sync(e, s, G->g));
    }
    *out = e;
}

static void test_state_resume(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/igrad_online_XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    const int64_t W = 6, total = 20;
    igrad_config_t c = online_config(W);
    size_t T = igrad_layout_count(L);
    grads_t G = grads_new(L), H = grads_new(L);
    /* the uninterrupted run */
    igrad_engine_t *ref = NULL;
    igrad_comm_t *rcomm = NULL;
    assert_ok(igrad_comm_create_self(&rcomm));
    assert_ok(igrad_engine_create(L, NULL, &c, rcomm, &ref));
    static const int64_t stops[] = {0, 3, 6, 7, 13};
    float **refg = calloc((size_t)total, sizeof *refg);
    assert_non_null(refg);
    int64_t ntot = igrad_layout_total_count(L);
    for (int64_t s = 0; s < total; s++) {
        grads_fill(&G, 5, s);
        assert_ok(igrad_engine_sync(ref, s, G.g));
        refg[s] = malloc((size_t)ntot * sizeof(float));
        assert_non_null(refg[s]);
        int64_t off = 0;
        for (size_t t = 0; t < T; t++) {
            memcpy(refg[s] + off, G.g[t], (size_t)G.n[t] * sizeof(float));
            off += G.n[t];
        }
    }
    for (size_t k = 0; k < sizeof stops / sizeof *stops; k++) {
        int64_t stop = stops[k];
        char path[512];
        snprintf(path, sizeof path, "%s/state_%lld.bin", tmpdir, (long long)stop);
        igrad_engine_t *a = NULL;
        if (stop > 0) {
            run_reference(L, &c, stop, &H, &a);
        } else {
            assert_ok(igrad_engine_create(L, NULL, &c, comm, &a));
        }
        assert_ok(igrad_engine_save_state(a, path));
        igrad_engine_free(a);
        /* a fresh engine made the same way, as a resumed run makes it */
        igrad_engine_t *b = NULL;
        assert_ok(igrad_engine_create(L, NULL, &c, comm, &b));
        assert_ok(igrad_engine_load_state(b, path));
        assert_int_equal(igrad_engine_step(b), stop - 1);
        igrad_online_info_t oi;
        assert_ok(igrad_engine_online_info(b, &oi));
        assert_int_equal(oi.profiling, stop < W + 1 ? 1 : 0);
        if (stop > W) assert_non_null(igrad_engine_profile(b));
        for (int64_t s = stop; s < total; s++) {
            grads_fill(&H, 5, s);
            assert_ok(igrad_engine_sync(b, s, H.g));
            int64_t off = 0;
            for (size_t t = 0; t < T; t++) {
                if (memcmp(refg[s] + off, H.g[t], (size_t)H.n[t] * sizeof(float)) != 0) {
                    print_error("resumed after step %lld: step %lld tensor %zu differs\n",
                                (long long)stop - 1, (long long)s, t);
                    fail();
                }
                off += H.n[t];
            }
        }
        for (size_t t = 0; t < T; t++)
            assert_memory_equal(igrad_engine_residual(ref, t), igrad_engine_residual(b, t),
                                (size_t)G.n[t] * sizeof(float));
        igrad_engine_free(b);
        remove(path);
    }
    /* a window record that no selection gives (negative sum of squares),
     * checksum recomputed: refused by name, the engine unchanged */
    {
        char bad[512];
        snprintf(bad, sizeof bad, "%s/state_bad.bin", tmpdir);
        igrad_engine_t *a = NULL;
        run_reference(L, &c, 3, &H, &a);
        assert_ok(igrad_engine_save_state(a, bad));
        igrad_engine_free(a);
        FILE *fp = fopen(bad, "r+b");
        assert_non_null(fp);
        fseek(fp, 0, SEEK_END);
        long nb = ftell(fp);
        unsigned char *buf = malloc((size_t)nb);
        assert_non_null(buf);
        fseek(fp, 0, SEEK_SET);
        assert_int_equal(fread(buf, 1, (size_t)nb, fp), (size_t)nb);
        double neg = -1.0;
        memcpy(buf + nb - 8 - 16 * W * (long)T, &neg, 8); /* record 0, tensor 0 */
        uint64_t h = 0xcbf29ce484222325ULL;
        for (long o = 0; o + 8 < nb; o += 8) {
            uint64_t w;
            memcpy(&w, buf + o, 8);
            h = (h ^ w) * 0x100000001b3ULL;
        }
        memcpy(buf + nb - 8, &h, 8);
        fseek(fp, 0, SEEK_SET);
        assert_int_equal(fwrite(buf, 1, (size_t)nb, fp), (size_t)nb);
        fclose(fp);
        free(buf);
        igrad_engine_t *b = NULL;
        assert_ok(igrad_engine_create(L, NULL, &c, comm, &b));
        assert_status(igrad_engine_load_state(b, bad), IGRAD_E_FORMAT);
        assert_error_has("is not a selection");
        assert_int_equal(igrad_engine_step(b), -1);
        igrad_engine_free(b);
        remove(bad);
    }
    /* a switched state cannot be loaded into an engine with another window */
    igrad_config_t c3 = online_config(W + 1);
    char path[512];
    snprintf(path, sizeof path, "%s/state_ref.bin", tmpdir);
    assert_ok(igrad_engine_save_state(ref, path));
    igrad_engine_t *b = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c3, comm, &b));
    assert_status(igrad_engine_load_state(b, path), IGRAD_E_MISMATCH);
    assert_error_has("config.profile_steps");
    igrad_online_info_t oi;
    assert_ok(igrad_engine_online_info(b, &oi));
    assert_int_equal(oi.profiling, 1);
    igrad_engine_free(b);
    remove(path);
    rmdir(tmpdir);

    for (int64_t s = 0; s < total; s++) free(refg[s]);
    free(refg);
    igrad_engine_free(ref);
    igrad_comm_free(rcomm);
    grads_free(&G);
    grads_free(&H);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

/* ---- hysteresis -------------------------------------------------------- */

static void test_hysteresis(void **state)
{
    (void)state;
    /* tau 0.5, margin 0.1: important flips below 0.4, low flips at >= 0.6,
     * each only on the second window in a row */
    const double tau = 0.5, m = 0.1;
    unsigned char imp[6] = {1, 1, 1, 0, 0, 0}, pend[6] = {0, 0, 0, 0, 0, 0}, out[6];
    /* window 1: c0 0.39 (crosses), c1 0.45 (inside the margin), c2 0.9,
     *           c3 0.6 (crosses, >=), c4 0.55 (inside), c5 0.1 */
    double s1[6] = {0.39, 0.45, 0.9, 0.6, 0.55, 0.1};
    assert_int_equal(igrad__hysteresis_update(6, s1, tau, m, imp, pend, out), 0);
    static const unsigned char want_out1[6] = {1, 1, 1, 0, 0, 0};
    static const unsigned char want_pend1[6] = {1, 0, 0, 1, 0, 0};
    assert_memory_equal(out, want_out1, 6);
    assert_memory_equal(pend, want_pend1, 6);
    /* window 2: c0 crosses again (flips to low), c3 falls back to 0.59
     * (no flip, pending cleared), c1 now crosses (pending only) */
    double s2[6] = {0.2, 0.3, 0.9, 0.59, 0.7, 0.1};
    assert_int_equal(igrad__hysteresis_update(6, s2, tau, m, imp, pend, out), 0 + 1);
    static const unsigned char want_out2[6] = {0, 1, 1, 0, 0, 0};
    static const unsigned char want_pend2[6] = {0, 1, 0, 0, 1, 0};
    assert_memory_equal(out, want_out2, 6);
    assert_memory_equal(pend, want_pend2, 6);
    /* window 3, from the new classes: c1 and c4 cross a second time */
    memcpy(imp, out, 6);
    double s3[6] = {0.2, 0.1, 0.9, 0.59, 0.65, 0.1};
    assert_int_equal(igrad__hysteresis_update(6, s3, tau, m, imp, pend, out), 2);
    static const unsigned char want_out3[6] = {0, 0, 1, 0, 1, 0};
    assert_memory_equal(out, want_out3, 6);
    /* margin 0: exactly tau keeps a low component low once, flips it twice */
    unsigned char i1[1] = {0}, p1[1] = {0}, o1[1];
    double s[1] = {0.5};
    assert_int_equal(igrad__hysteresis_update(1, s, 0.5, 0.0, i1, p1, o1), 0);
    assert_int_equal(igrad__hysteresis_update(1, s, 0.5, 0.0, i1, p1, o1), 1);
    assert_int_equal(o1[0], 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_switch_conservation),
        cmocka_unit_test(test_set_profile),
        cmocka_unit_test(test_target_switch),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_state_resume),
        cmocka_unit_test(test_hysteresis),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
