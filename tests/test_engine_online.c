/*
 * test_engine_online.c — online profiling (config.profile_steps) and
 * igrad_engine_set_profile on one rank: every component is sent during the
 * window; the switch happens at the first begin after it; the built
 * profile is the one `igrad profile` builds from the engine's own trace;
 * the plan after the switch is the plan of an engine created with that
 * profile; gradients are conserved through the switch (sum in = sum
 * applied + residual); a refused re-plan changes nothing; the state file
 * resumes a run stopped inside and after the window exactly; and the
 * hysteresis rule against hand-computed cases. Periodic re-profiling
 * (config.reprofile_every): the classes after every re-profile against
 * an independent reference built from the engine's trace hook,
 * conservation through every re-plan, the margin, exact resume from
 * states saved anywhere in the re-profiling cycle, kappa refitted on the
 * hysteresis classes with target_ratio.
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
#include "engine/engine_online.h"    /* igrad__hysteresis_update */
#include "profile/profile_internal.h" /* the trace's sums of squares, for the reference */

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

static igrad_config_t reprofile_config(int64_t W, int64_t Wr, double margin)
{
    igrad_config_t c = online_config(W);
    c.reprofile_every = Wr;
    c.reprofile_margin = margin;
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

/* Per-entry sums over steps (double), for the conservation checks. */
static double **sums_new(const grads_t *G)
{
    double **x = calloc(G->T, sizeof *x);
    assert_non_null(x);
    for (size_t t = 0; t < G->T; t++) {
        x[t] = calloc((size_t)G->n[t], sizeof(double));
        assert_non_null(x[t]);
    }
    return x;
}

static void sums_free(double **x, size_t T)
{
    for (size_t t = 0; t < T && x; t++) free(x[t]);
    free(x);
}

/* One sync of G, adding the gradients given to `in`, their magnitudes to
 * `mag` and the result to `out`. */
static void sync_counted(igrad_engine_t *e, int64_t step, grads_t *G, double **in, double **out,
                         double **mag)
{
    for (size_t t = 0; t < G->T; t++)
        for (int64_t i = 0; i < G->n[t]; i++) {
            in[t][i] += G->g[t][i];
            mag[t][i] += fabs((double)G->g[t][i]);
        }
    assert_ok(igrad_engine_sync(e, step, G->g));
    for (size_t t = 0; t < G->T; t++)
        for (int64_t i = 0; i < G->n[t]; i++) out[t][i] += G->g[t][i];
}

/* Conservation: per entry, sum of the gradients given = sum applied +
 * residual (to float rounding of the sums). */
static void check_conservation(const igrad_engine_t *e, const grads_t *G, double *const *in,
                               double *const *out, double *const *mag)
{
    for (size_t t = 0; t < G->T; t++) {
        const float *r = igrad_engine_residual(e, t);
        assert_non_null(r);
        double err = 0.0, ref = 0.0;
        for (int64_t i = 0; i < G->n[t]; i++) {
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
}

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
    double **in = sums_new(&G), **out = sums_new(&G), **mag = sums_new(&G);
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
        sync_counted(e, s, &G, in, out, mag);
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
    check_conservation(e, &G, in, out, mag); /* through the switch */

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
    sums_free(in, T);
    sums_free(out, T);
    sums_free(mag, T);
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
    c = reprofile_config(5, -1, 0.05);
    assert_status(igrad_config_validate(&c), IGRAD_E_INVALID);
    assert_error_has("config.reprofile_every is -1");
    c = reprofile_config(0, 8, 0.05);
    assert_status(igrad_config_validate(&c), IGRAD_E_INVALID);
    assert_error_has("re-profiling follows online profiling");
    c = reprofile_config(5, 8, 1.5);
    assert_status(igrad_config_validate(&c), IGRAD_E_INVALID);
    assert_error_has("config.reprofile_margin is 1.5");
    c = reprofile_config(5, 8, NAN);
    assert_status(igrad_config_validate(&c), IGRAD_E_INVALID);
    assert_error_has("config.reprofile_margin");
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
                          grads_t *G, igrad_comm_t *comm, igrad_engine_t **out)
{
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, c, comm, &e));
    for (int64_t s = 0; s < steps; s++) {
        grads_fill(G, 5, s);
        assert_ok(igrad_engine_sync(e, s, G->g));
    }
    *out = e;
}

/* Overwrites n bytes of the state file at `from_end` bytes before its end
 * and recomputes the checksum (formats.md §7), so that the loader's field
 * checks see the change. */
static void patch_state(const char *path, long from_end, const void *bytes, size_t n)
{
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long nb = ftell(fp);
    assert_true(from_end <= nb && from_end >= (long)n + 8);
    unsigned char *buf = malloc((size_t)nb);
    assert_non_null(buf);
    fseek(fp, 0, SEEK_SET);
    assert_int_equal(fread(buf, 1, (size_t)nb, fp), (size_t)nb);
    memcpy(buf + nb - from_end, bytes, n);
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
            run_reference(L, &c, stop, &H, comm, &a);
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
        run_reference(L, &c, 3, &H, comm, &a);
        assert_ok(igrad_engine_save_state(a, bad));
        igrad_engine_free(a);
        double neg = -1.0;
        /* before the checksum: the sparse all-reduce section (8), the window */
        patch_state(bad, 8 + 8 + 16 * W * (long)T, &neg, 8); /* record 0, tensor 0 */
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


/* ---- periodic re-profiling ------------------------------------------------ */

/* grads_fill with the tensor scales reversed from step `swap` on. */
static void grads_fill_swap(grads_t *G, uint64_t seed, int64_t step, int64_t swap)
{
    grads_fill(G, seed, step);
    if (step < swap) return;
    for (size_t t = 0; t < G->T; t++) {
        float from = 0.1f + 0.1f * (float)((t * 7) % 9);
        float to = 0.1f + 0.1f * (float)(8 - (t * 7) % 9);
        for (int64_t i = 0; i < G->n[t]; i++) G->g[t][i] = G->g[t][i] / from * to;
    }
}


/* The independent reference of one re-profile: from the engine's own
 * trace (every sent tensor's selection sum of squares, through the public
 * hook), each component's last selection per accumulated step, held
 * between selections, over the window's steps [b, e); the profile of those
 * rows; the hysteresis rule written out. */
typedef struct ref_reprofile {
    size_t nc;
    double *held;        /* (nc) */
    int64_t *last;       /* (nc) */
    unsigned char *imp;  /* (nc) current classes */
    unsigned char *pend; /* (nc) */
    int *nflips;         /* (nc) class changes so far */
    size_t row;          /* trace rows consumed */
    igrad_trace_t *win;  /* this window's held rows */
} ref_reprofile_t;

static int64_t comp_tensor(const igrad_layout_t *L, int layer, igrad_kind_t kind)
{
    for (size_t t = 0; t < igrad_layout_count(L); t++) {
        igrad_tensor_info_t ti;
        assert_ok(igrad_layout_tensor(L, t, &ti));
        if (ti.component >= 0 && ti.layer == layer && ti.kind == kind) return (int64_t)t;
    }
    fail();
    return -1;
}

/* Consumes the engine trace's rows up to step `end` (exclusive), updating
 * the held values; rows at steps >= `begin` go into the window trace. */
static void ref_advance(ref_reprofile_t *r, const igrad_layout_t *L, const igrad_trace_t *tr,
                        int64_t begin, int64_t end)
{
    for (; r->row < tr->nsteps && tr->steps[r->row] < end; r->row++) {
        int64_t step = tr->steps[r->row];
        for (size_t c = 0; c < r->nc; c++) {
            double v = tr->sumsq[r->row * tr->ncomp + c];
            if (v > 0.0) {
                int64_t span = r->last[c] >= 0 ? step - r->last[c] : 1;
                r->held[c] = v / (double)span;
                r->last[c] = step;
            }
            if (step >= begin)
                assert_ok(igrad_trace_record(
                    r->win, step,
                    (size_t)comp_tensor(L, tr->comp_layer[c], tr->comp_kind[c]), r->held[c],
                    1));
        }
    }
}

/* The reference re-profile over the window trace: @return flips; imp and
 * pend updated; *crossed[c] set where a score was beyond tau -+ m. */
static int ref_reprofile(ref_reprofile_t *r, double margin, unsigned char *crossed)
{
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    opts.method = "fixed:0.4";
    igrad_profile_t *p = NULL;
    assert_ok(igrad_profile_build(r->win, &opts, &p));
    double tau = igrad_profile_threshold(p);
    int flips = 0;
    for (size_t c = 0; c < r->nc; c++) {
        igrad_profile_entry_t en;
        assert_ok(igrad_profile_entry(p, c, &en));
        int cross = r->imp[c] ? en.score < tau - margin : en.score >= tau + margin;
        crossed[c] |= (unsigned char)cross;
        if (cross && r->pend[c]) {
            r->nflips[c]++;
            r->imp[c] = (unsigned char)!r->imp[c];
            r->pend[c] = 0;
            flips++;
        } else {
            r->pend[c] = (unsigned char)cross;
        }
    }
    igrad_profile_free(p);
    return flips;
}

/* The engine's classes per trace component, from its plan. */
static void engine_classes(const igrad_engine_t *e, const igrad_layout_t *L,
                           const igrad_trace_t *tr, unsigned char *out)
{
    for (size_t c = 0; c < tr->ncomp; c++) {
        igrad_tensor_plan_t tp;
        assert_ok(igrad_engine_tensor_plan(
            e, (size_t)comp_tensor(L, tr->comp_layer[c], tr->comp_kind[c]), &tp));
        out[c] = (unsigned char)tp.important;
    }
}

/* One run of W + REPROFILE_WINDOWS windows of Wr steps with the scales
 * reversed at step `swap`: at every re-profile the engine's classes are
 * the reference's (and change nowhere else), conservation holds through
 * every re-plan. Per window the flips, per component whether a score was
 * ever beyond the margin and how often it moved. @return re-plans made by
 * re-profiles. */
#define REPROFILE_WINDOWS 8
static int64_t run_reprofile(double margin, int64_t swap, int *window_flips,
                             unsigned char *ever_crossed, int *nflips)
{
    const int64_t W = 8, Wr = 8, nwin = REPROFILE_WINDOWS, steps = W + nwin * Wr + 1;
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = reprofile_config(W, Wr, margin);
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    igrad_trace_t *tr = NULL;
    assert_ok(igrad_trace_create(L, &tr));
    assert_ok(igrad_engine_set_trace(e, tr));
    size_t T = igrad_layout_count(L), nc = igrad_trace_component_count(tr);
    assert_true(nc <= 64);
    grads_t G = grads_new(L);
    double **in = sums_new(&G), **out = sums_new(&G), **mag = sums_new(&G);
    ref_reprofile_t r = {.nc = nc, .nflips = nflips};
    r.held = calloc(nc, sizeof *r.held);
    r.last = malloc(nc * sizeof *r.last);
    r.imp = calloc(nc, 1);
    r.pend = calloc(nc, 1);
    unsigned char *cls = calloc(nc, 1);
    assert_true(r.held && r.last && r.imp && r.pend && cls);
    for (size_t k = 0; k < nc; k++) r.last[k] = -1;
    int64_t replans = 0, nreprof = 0;
    for (int64_t s = 0; s < steps; s++) {
        grads_fill_swap(&G, 9, s, swap);
        sync_counted(e, s, &G, in, out, mag);
        igrad_online_info_t oi;
        assert_ok(igrad_engine_online_info(e, &oi));
        assert_int_equal(oi.reprofile_every, Wr);
        if (s >= W) assert_int_equal(oi.switch_step, W); /* re-profiles leave it */
        if (s == W) { /* the switch: the reference starts from its classes */
            engine_classes(e, L, tr, r.imp);
            assert_int_equal(oi.reprofiles, 0);
        }
        /* windows [W + k Wr, W + (k + 1) Wr), each re-profiled at the begin
         * after it (a phase boundary: W and Wr are multiples of R) */
        if (s > W && (s - W) % Wr == 0) {
            nreprof++;
            assert_int_equal(oi.reprofiles, nreprof);
            assert_ok(igrad_trace_create(L, &r.win));
            ref_advance(&r, L, tr, s - Wr, s);
            int flips = ref_reprofile(&r, margin, ever_crossed);
            igrad_trace_free(r.win);
            r.win = NULL;
            assert_int_equal(oi.last_flips, flips);
            window_flips[nreprof - 1] = flips;
            if (flips > 0) replans++;
            assert_int_equal(oi.reprofile_replans, replans);
            assert_int_equal(oi.replans, 1 + replans);
            assert_true(oi.reprofile_ms >= 0.0);
            engine_classes(e, L, tr, cls);
            for (size_t k = 0; k < nc; k++) {
                if (cls[k] != r.imp[k]) {
                    print_error("re-profile %lld: component %zu (%d, %s): engine %d, reference "
                                "%d\n",
                                (long long)nreprof, k, tr->comp_layer[k],
                                igrad_kind_name(tr->comp_kind[k]), cls[k], r.imp[k]);
                    fail();
                }
            }
            check_conservation(e, &G, in, out, mag);
            if (flips > 0) { /* the current profile is a valid one with those classes */
                const igrad_profile_t *cur = igrad_engine_profile(e);
                for (size_t k = 0; k < nc; k++)
                    assert_int_equal(igrad_profile_is_important(cur, tr->comp_layer[k],
                                                                tr->comp_kind[k]),
                                     r.imp[k]);
            }
        }
        /* every step: the engine's classes change only at re-profiles */
        if (s > W && (s - W) % Wr != 0) {
            engine_classes(e, L, tr, cls);
            assert_memory_equal(cls, r.imp, nc);
        }
    }
    assert_int_equal(nreprof, nwin);
    check_conservation(e, &G, in, out, mag);
    sums_free(in, T);
    sums_free(out, T);
    sums_free(mag, T);
    free(r.held);
    free(r.last);
    free(r.imp);
    free(r.pend);
    free(cls);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_trace_free(tr);
    igrad_comm_free(comm);
    igrad_layout_free(L);
    return replans;
}

static void test_reprofile(void **state)
{
    (void)state;
    int wf[REPROFILE_WINDOWS], nflips[64];
    unsigned char crossed[64];
    /* the scales reversed at the start of the third window */
    memset(crossed, 0, sizeof crossed);
    memset(nflips, 0, sizeof nflips);
    int64_t moved = run_reprofile(0.05, 8 + 2 * 8, wf, crossed, nflips);
    assert_true(moved >= 1);
    /* nothing moves before the change, nor on its first window (one
     * window beyond the margin is not enough) */
    for (int k = 0; k < 3; k++) assert_int_equal(wf[k], 0);
    /* under the new scales a component moves once and stays; one never
     * beyond the margin never moves */
    int total = 0;
    for (size_t k = 0; k < 64; k++) {
        assert_true(nflips[k] <= 1);
        if (!crossed[k]) assert_int_equal(nflips[k], 0);
        total += nflips[k];
    }
    int sum = 0;
    for (int k = 0; k < REPROFILE_WINDOWS; k++) sum += wf[k];
    assert_int_equal(sum, total);
    /* a margin no score can exceed: nothing ever moves */
    memset(crossed, 0, sizeof crossed);
    memset(nflips, 0, sizeof nflips);
    assert_int_equal(run_reprofile(1.0, 8 + 2 * 8, wf, crossed, nflips), 0);
    for (size_t k = 0; k < sizeof crossed; k++) assert_int_equal(crossed[k], 0);
}

/* A run with re-profiling stopped anywhere (inside the first window, in a
 * re-profiling window with hysteresis flags set, right before a
 * re-profile, after a re-plan) resumes exactly from its state file; a
 * refused igrad_engine_set_profile on the way changes nothing; a file
 * whose re-profiling section was edited (checksum recomputed) is refused
 * by name and changes nothing. With target_ratio, a re-plan refits kappa
 * alone on the hysteresis classes. */
static void run_swap(igrad_engine_t *e, int64_t from, int64_t to, grads_t *G, float **keep,
                     int64_t ntot)
{
    for (int64_t s = from; s < to; s++) {
        grads_fill_swap(G, 5, s, 24);
        assert_ok(igrad_engine_sync(e, s, G->g));
        if (!keep) continue;
        if (!keep[s]) keep[s] = malloc((size_t)ntot * sizeof(float));
        assert_non_null(keep[s]);
        int64_t off = 0;
        for (size_t t = 0; t < G->T; t++) {
            memcpy(keep[s] + off, G->g[t], (size_t)G->n[t] * sizeof(float));
            off += G->n[t];
        }
    }
}

static void check_reprofile_resume(const igrad_config_t *c)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/igrad_reprof_XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    const int64_t total = 66;
    size_t T = igrad_layout_count(L);
    int64_t ntot = igrad_layout_total_count(L);
    grads_t G = grads_new(L);
    igrad_engine_t *ref = NULL;
    assert_ok(igrad_engine_create(L, NULL, c, comm, &ref));
    float **refg = calloc((size_t)total, sizeof *refg), **got = calloc((size_t)total, sizeof *got);
    assert_true(refg && got);
    run_swap(ref, 0, total, &G, refg, ntot);
    igrad_online_info_t ri;
    assert_ok(igrad_engine_online_info(ref, &ri));
    assert_true(ri.reprofile_replans >= 1);
    static const int64_t stops[] = {12, 36, 47, 48, 52, 60};
    for (size_t k = 0; k < sizeof stops / sizeof *stops; k++) {
        int64_t stop = stops[k];
        char path[512];
        snprintf(path, sizeof path, "%s/state_%lld.bin", tmpdir, (long long)stop);
        igrad_engine_t *a = NULL;
        assert_ok(igrad_engine_create(L, NULL, c, comm, &a));
        run_swap(a, 0, stop, &G, NULL, ntot);
        igrad_online_info_t before, after;
        assert_ok(igrad_engine_online_info(a, &before));
        assert_status(igrad_engine_set_profile(a, NULL), IGRAD_E_INVALID);
        assert_ok(igrad_engine_online_info(a, &after));
        assert_int_equal(after.steps_recorded, before.steps_recorded);
        assert_int_equal(after.replans, before.replans);
        assert_ok(igrad_engine_save_state(a, path));
        igrad_engine_t *b = NULL;
        if (stop == 36) { /* corrupt re-profiling sections, checksums recomputed */
            char bad[560];
            snprintf(bad, sizeof bad, "%s.bad", path);
            size_t C = igrad_layout_component_count(L);
            long Wr = (long)c->reprofile_every, cpad = (long)((C + 7) & ~(size_t)7);
            long rep = 40 + 8 * Wr + 16 * Wr * (long)T + 24 * (long)T + cpad;
            long sar = 8; /* then the sparse all-reduce's section: no slots here */
            static const struct {
                int what;
                uint64_t value;
                const char *msg;
            } cases[] = {{0, 2, "hysteresis flag 0 is 2"},
                         {1, 7, "re-profiling classes flag 7"},
                         {2, 5, "the re-profiling counters are not a run's"}};
            for (size_t q = 0; q < sizeof cases / sizeof *cases; q++) {
                FILE *in = fopen(path, "rb"), *out = fopen(bad, "wb");
                assert_true(in && out);
                int ch;
                while ((ch = fgetc(in)) != EOF) fputc(ch, out);
                fclose(in);
                fclose(out);
                unsigned char flag = (unsigned char)cases[q].value;
                if (cases[q].what == 0) patch_state(bad, 8 + sar + cpad, &flag, 1);
                else if (cases[q].what == 1) patch_state(bad, 8 + sar + rep, &cases[q].value, 8);
                else patch_state(bad, 8 + sar + rep - 16, &cases[q].value, 8); /* re-plans > re-profiles */
                assert_ok(igrad_engine_create(L, NULL, c, comm, &b));
                assert_status(igrad_engine_load_state(b, bad), IGRAD_E_FORMAT);
                assert_error_has(cases[q].msg);
                assert_int_equal(igrad_engine_step(b), -1);
                igrad_online_info_t oi;
                assert_ok(igrad_engine_online_info(b, &oi));
                assert_int_equal(oi.profiling, 1);
                igrad_engine_free(b);
                b = NULL;
            }
            remove(bad);
        }
        assert_ok(igrad_engine_create(L, NULL, c, comm, &b));
        assert_ok(igrad_engine_load_state(b, path));
        igrad_online_info_t bi;
        assert_ok(igrad_engine_online_info(b, &bi));
        assert_int_equal(bi.steps_recorded, before.steps_recorded);
        assert_int_equal(bi.reprofiles, before.reprofiles);
        assert_int_equal(bi.reprofile_replans, before.reprofile_replans);
        assert_int_equal(bi.last_flips, before.last_flips);
        assert_int_equal(bi.replans, before.replans);
        igrad_config_t ca, cb;
        assert_ok(igrad_engine_config(a, &ca));
        assert_ok(igrad_engine_config(b, &cb));
        assert_true(ca.release_keep == cb.release_keep);
        assert_plans_equal(a, b, T, c->release_period);
        /* the stopped engine and the resumed one go on as the reference */
        for (int run = 0; run < 2; run++) {
            run_swap(run ? b : a, stop, total, &G, got, ntot);
            for (int64_t s = stop; s < total; s++)
                if (memcmp(refg[s], got[s], (size_t)ntot * sizeof(float)) != 0) {
                    print_error("%s after step %lld: step %lld differs\n",
                                run ? "resumed" : "stopped", (long long)stop - 1, (long long)s);
                    fail();
                }
        }
        igrad_online_info_t ai;
        assert_ok(igrad_engine_online_info(a, &ai));
        assert_int_equal(ai.reprofile_replans, ri.reprofile_replans);
        assert_ok(igrad_engine_online_info(b, &bi));
        assert_int_equal(bi.reprofiles, ri.reprofiles);
        assert_int_equal(bi.reprofile_replans, ri.reprofile_replans);
        for (size_t t = 0; t < T; t++)
            assert_memory_equal(igrad_engine_residual(ref, t), igrad_engine_residual(b, t),
                                (size_t)G.n[t] * sizeof(float));
        igrad_engine_free(a);
        igrad_engine_free(b);
        remove(path);
    }
    if (c->target_ratio > 0.0) {
        /* kappa refitted on the hysteresis classes, which the profile holds */
        const igrad_profile_t *cur = igrad_engine_profile(ref);
        igrad_config_t used;
        assert_ok(igrad_engine_config(ref, &used));
        igrad_target_fit_t fit;
        assert_ok(igrad__target_fit_kappa(L, cur, c, c->target_ratio, IGRAD_TARGET_MIN_KEEP,
                                          &fit));
        assert_true(used.release_keep == fit.release_keep);
        assert_true(fit.tau == igrad_profile_threshold(cur));
        if (fit.met) {
            int64_t sum = 0, R = c->release_period;
            for (int64_t s = 0; s < R; s++) sum += igrad_engine_predict_payload(ref, 100 + s);
            igrad_config_t sc = *c;
            sc.method = IGRAD_METHOD_ADTOPK_SYNC;
            sc.profile_steps = sc.reprofile_every = 0;
            sc.target_ratio = 0.0;
            igrad_engine_t *sy = NULL;
            assert_ok(igrad_engine_create(L, NULL, &sc, comm, &sy));
            int64_t ssum = 0;
            for (int64_t s = 0; s < R; s++) ssum += igrad_engine_predict_payload(sy, 100 + s);
            assert_true((double)sum <= c->target_ratio * (double)ssum * (1.0 + 1e-12));
            igrad_engine_free(sy);
        }
    }
    rmdir(tmpdir);
    for (int64_t s = 0; s < total; s++) {
        free(refg[s]);
        free(got[s]);
    }
    free(refg);
    free(got);
    igrad_engine_free(ref);
    grads_free(&G);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

static void test_reprofile_resume(void **state)
{
    (void)state;
    igrad_config_t c = reprofile_config(8, 8, 0.05);
    check_reprofile_resume(&c);
    c.target_ratio = 0.3;
    check_reprofile_resume(&c);
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
        cmocka_unit_test(test_reprofile),
        cmocka_unit_test(test_reprofile_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
