/*
 * test_profile.c — the importance profile of src/profile.c: magnitude,
 * persistence, score and knee threshold on a small hand-computed trace,
 * windows, the JSON round trip and CSV export, the layout checks
 * (IGRAD_E_MISMATCH naming both hashes) and the malformed-profile cases.
 * Partition methods alone are in test_partition.c, trace CSV in
 * test_trace.c.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, strdup */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "igrad.h"
#include "test_util.h"
#include "profile/profile_internal.h"

/* The hand-computed trace: components (0,Q), (0,K), (0,V), (1,O).
 *
 *   step   Q    K    V    O    median  strictly above the median
 *    0    .4   .1   .2   .3    .25     Q, O
 *    1    .5   .2   .1   .2    .20     Q
 *    2    .3   .3   .1   .1    .20     Q, K
 *    3    .4   .0   .6   .2    .30     Q, V
 *
 * mean activity: Q .4, K .15, V .25, O .2 -> min .15, range .25
 * magnitude:     Q 1,  K 0,   V .4,  O .2
 * persistence:   Q 1,  K .25, V .25, O .25
 * score (alpha .7): Q 1, K .075, V .355, O .215
 * knee: descending 1, .355, .215, .075 at u = 0, 1/3, 2/3, 1 with
 * v = (s - .075) / .925 = 1, .3027, .1514, 0: |u + v - 1| = 0, .3640,
 * .1820, 0 -> tau = .355, important = {Q, V}. */
static const char HAND_TRACE[] =
    "step,layer,component,raw_activity,d_activity,numel,retained_numel\n"
    "0,0,Q,0.4,0,64,1\n0,0,K,0.1,0,32,1\n0,0,V,0.2,0,32,1\n0,1,O,0.3,0,64,1\n"
    "1,0,Q,0.5,0,64,1\n1,0,K,0.2,0,32,1\n1,0,V,0.1,0,32,1\n1,1,O,0.2,0,64,1\n"
    "2,0,Q,0.3,0,64,1\n2,0,K,0.3,0,32,1\n2,0,V,0.1,0,32,1\n2,1,O,0.1,0,64,1\n"
    "3,0,Q,0.4,0,64,1\n3,0,K,0.0,0,32,1\n3,0,V,0.6,0,32,1\n3,1,O,0.2,0,64,1\n";

static igrad_trace_t *hand_trace(void)
{
    igrad_trace_t *t = NULL;
    assert_ok(igrad__trace_from_text(HAND_TRACE, strlen(HAND_TRACE), "hand.csv", &t));
    return t;
}

static void check_entry(const igrad_profile_t *p, size_t i, int layer, igrad_kind_t kind,
                        double mean, double mag, double pers, double score, int important)
{
    igrad_profile_entry_t e;
    assert_ok(igrad_profile_entry(p, i, &e));
    assert_int_equal(e.layer, layer);
    assert_int_equal(e.kind, kind);
    assert_near(e.mean_activity, mean, 1e-12);
    assert_near(e.magnitude, mag, 1e-12);
    assert_near(e.persistence, pers, 1e-12);
    assert_near(e.score, score, 1e-12);
    assert_int_equal(e.important, important);
}

static void test_hand_computed_profile(void **state)
{
    (void)state;
    igrad_trace_t *t = hand_trace();
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    igrad_profile_t *p = NULL;
    assert_ok(igrad_profile_build(t, &opts, &p));
    assert_int_equal(igrad_profile_count(p), 4);
    check_entry(p, 0, 0, IGRAD_KIND_Q, 0.4, 1.0, 1.0, 1.0, 1);
    check_entry(p, 1, 0, IGRAD_KIND_K, 0.15, 0.0, 0.25, 0.075, 0);
    check_entry(p, 2, 0, IGRAD_KIND_V, 0.25, 0.4, 0.25, 0.355, 1);
    check_entry(p, 3, 1, IGRAD_KIND_O, 0.2, 0.2, 0.25, 0.215, 0);
    assert_near(igrad_profile_threshold(p), 0.355, 1e-12);
    assert_string_equal(igrad_profile_method(p), "knee");
    assert_near(igrad_profile_alpha(p), 0.7, 0);
    assert_true(igrad_profile_layout_hash(p) == 0);
    int64_t b = -1, e = -1;
    size_t steps = 0;
    igrad_profile_window(p, &b, &e, &steps);
    assert_int_equal(b, 0);
    assert_int_equal(e, 4); /* -1 resolved: last step + 1 */
    assert_int_equal(steps, 4);
    assert_int_equal(igrad_profile_is_important(p, 0, IGRAD_KIND_V), 1);
    assert_int_equal(igrad_profile_is_important(p, 1, IGRAD_KIND_O), 0);
    assert_int_equal(igrad_profile_is_important(p, 1, IGRAD_KIND_Q), -1);
    igrad_profile_free(p);

    /* alpha = 0: scores are the persistences (1, .25, .25, .25); alpha = 1:
     * the magnitudes (1, 0, .4, .2). */
    opts.alpha = 0.0;
    assert_ok(igrad_profile_build(t, &opts, &p));
    check_entry(p, 1, 0, IGRAD_KIND_K, 0.15, 0.0, 0.25, 0.25, 1);
    /* knee on 1, .25, .25, .25: v = 1, 0, 0, 0 -> distances 0, 2/3, 1/3,
     * 0 -> tau = .25: all important */
    assert_near(igrad_profile_threshold(p), 0.25, 1e-15);
    igrad_profile_free(p);

    /* Window [1, 3): steps 1 and 2. means Q .4, K .25, V .1, O .15;
     * magnitude Q 1, K .5, V 0, O 1/6; persistence Q 1, K .5, V 0, O 0;
     * score Q 1, K .5, V 0, O .7/6. kmeans2 on {0, .1167, .5, 1}: splits
     * SSE {0}|rest .3924, {0,.117}|{.5,1} .1318, {0,.117,.5}|{1} .1369 ->
     * tau = .5 (K and Q important). */
    opts.alpha = 0.7;
    opts.window_begin = 1;
    opts.window_end = 3;
    opts.method = "kmeans2";
    assert_ok(igrad_profile_build(t, &opts, &p));
    check_entry(p, 0, 0, IGRAD_KIND_Q, 0.4, 1.0, 1.0, 1.0, 1);
    check_entry(p, 1, 0, IGRAD_KIND_K, 0.25, 0.5, 0.5, 0.5, 1);
    check_entry(p, 2, 0, IGRAD_KIND_V, 0.1, 0.0, 0.0, 0.0, 0);
    check_entry(p, 3, 1, IGRAD_KIND_O, 0.15, 1.0 / 6.0, 0.0, 0.7 / 6.0, 0);
    assert_near(igrad_profile_threshold(p), 0.5, 1e-12);
    igrad_profile_window(p, &b, &e, &steps);
    assert_int_equal(b, 1);
    assert_int_equal(e, 3);
    assert_int_equal(steps, 2);
    igrad_profile_free(p);
    igrad_trace_free(t);
}

static void test_build_errors(void **state)
{
    (void)state;
    igrad_trace_t *t = hand_trace();
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    igrad_profile_t *p = NULL;
    opts.window_begin = 10;
    opts.window_end = 20;
    assert_int_equal(igrad_profile_build(t, &opts, &p), IGRAD_E_INVALID);
    assert_error_has("window [10, 20) holds no step of the trace (its 4 steps run from 0 to 3)");
    assert_null(p);
    opts.window_end = -1;
    assert_int_equal(igrad_profile_build(t, &opts, &p), IGRAD_E_INVALID);
    assert_error_has("window [10, end)");
    opts.window_begin = 2;
    opts.window_end = 2;
    assert_int_equal(igrad_profile_build(t, &opts, &p), IGRAD_E_INVALID);
    assert_error_has("window [2, 2) is empty");
    opts.window_begin = 0;
    opts.window_end = -1;
    opts.alpha = 1.5;
    assert_int_equal(igrad_profile_build(t, &opts, &p), IGRAD_E_INVALID);
    assert_error_has("alpha 1.5");
    opts.alpha = NAN;
    assert_int_equal(igrad_profile_build(t, &opts, &p), IGRAD_E_INVALID);
    opts.alpha = 0.7;
    opts.method = "elbow";
    assert_int_equal(igrad_profile_build(t, &opts, &p), IGRAD_E_INVALID);
    assert_error_has("'elbow'");
    opts.method = "knee";
    opts.size = 8;
    assert_int_equal(igrad_profile_build(t, &opts, &p), IGRAD_E_INVALID);
    assert_error_has("IGRAD_PROFILE_OPTIONS_INIT");
    igrad_trace_free(t);
}

/* ---- files ---------------------------------------------------------------- */

static char tmpdir[64];

static char *tmp_path(const char *name)
{
    static char path[4][128];
    static int next;
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/igrad-test-profile-XXXXXX");
        assert_non_null(mkdtemp(tmpdir));
    }
    char *p = path[next++ % 4];
    snprintf(p, 128, "%s/%s", tmpdir, name);
    return p;
}

static char *read_all(const char *path)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    buf[n] = '\0';
    fclose(fp);
    return buf;
}

/* llama-style layout with `layers` blocks of width c (q, k, v, o, mlp). */
static igrad_layout_t *llama_layout(int layers, int64_t c)
{
    igrad_layout_t *l = NULL;
    assert_ok(igrad_layout_create(&l));
    int64_t sq[2] = {c, c}, up[2] = {2 * c, c}, down[2] = {c, 2 * c}, emb[2] = {16, c};
    assert_ok(igrad_layout_add(l, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb));
    static const char *const sq_names[] = {"self_attn.q_proj", "self_attn.k_proj",
                                           "self_attn.v_proj", "self_attn.o_proj"};
    char name[128];
    for (int i = 0; i < layers; i++) {
        for (int k = 0; k < 4; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", i, sq_names[k]);
            assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, sq));
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", i);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, up));
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", i);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, down));
    }
    return l;
}

/* A recorded trace over `steps` steps with deterministic activities. */
static igrad_trace_t *recorded_trace(const igrad_layout_t *l, int steps)
{
    igrad_trace_t *t = NULL;
    assert_ok(igrad_trace_create(l, &t));
    assert_ok(igrad_trace_set_sparsifier(t, IGRAD_SPARSIFIER_TOPK, 0.05));
    for (int s = 0; s < steps; s++) {
        for (size_t i = 0; i < igrad_layout_count(l); i++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(l, i, &ti));
            if (ti.component < 0) continue;
            double level = (ti.kind == IGRAD_KIND_V || ti.kind == IGRAD_KIND_O) ? 4.0 : 1.0;
            double sumsq = level * (1.0 + 0.1 * sin((double)(s * 13 + (int)i)));
            assert_ok(igrad_trace_record(t, s, i, sumsq, igrad_budget(ti.count, 0.05)));
        }
    }
    return t;
}

static void assert_same_profile(const igrad_profile_t *a, const igrad_profile_t *b)
{
    assert_int_equal(igrad_profile_count(a), igrad_profile_count(b));
    assert_true(igrad_profile_layout_hash(a) == igrad_profile_layout_hash(b));
    assert_near(igrad_profile_threshold(a), igrad_profile_threshold(b), 0);
    assert_near(igrad_profile_alpha(a), igrad_profile_alpha(b), 0);
    assert_near(igrad_profile_density(a), igrad_profile_density(b), 0);
    assert_string_equal(igrad_profile_method(a), igrad_profile_method(b));
    assert_string_equal(igrad_profile_sparsifier(a), igrad_profile_sparsifier(b));
    int64_t b0, e0, b1, e1;
    size_t s0, s1;
    igrad_profile_window(a, &b0, &e0, &s0);
    igrad_profile_window(b, &b1, &e1, &s1);
    assert_int_equal(b0, b1);
    assert_int_equal(e0, e1);
    assert_int_equal(s0, s1);
    for (size_t i = 0; i < igrad_profile_count(a); i++) {
        igrad_profile_entry_t x, y;
        assert_ok(igrad_profile_entry(a, i, &x));
        assert_ok(igrad_profile_entry(b, i, &y));
        assert_int_equal(x.layer, y.layer);
        assert_int_equal(x.kind, y.kind);
        assert_int_equal(x.count, y.count);
        assert_near(x.mean_activity, y.mean_activity, 0);
        assert_near(x.magnitude, y.magnitude, 0);
        assert_near(x.persistence, y.persistence, 0);
        assert_near(x.score, y.score, 0);
        assert_int_equal(x.important, y.important);
    }
}

static void test_json_round_trip_and_csv(void **state)
{
    (void)state;
    igrad_layout_t *l = llama_layout(3, 8);
    igrad_trace_t *t = recorded_trace(l, 12);
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    opts.window_begin = 2;
    opts.window_end = 10;
    opts.method = "kmeans2";
    igrad_profile_t *p = NULL, *q = NULL;
    assert_ok(igrad_profile_build(t, &opts, &p));
    assert_int_equal(igrad_profile_count(p), 19); /* 3 x 6 and (-1, EMB) */
    assert_true(igrad_profile_layout_hash(p) == igrad_layout_hash(l));
    assert_string_equal(igrad_profile_sparsifier(p), "topk");
    /* Activities sit at three levels: V and O sqrt(4/64) = .25, Q and K
     * sqrt(1/64) = .125, FC1 and FC2 sqrt(1/128) = .088 (times 1 +- 5%):
     * scores about 1, .31 and 0, so kmeans2 keeps V and O alone (the
     * embedding, 128 entries at level 1, sits with FC1 and FC2). */
    for (size_t i = 0; i < 19; i++) {
        igrad_profile_entry_t e;
        assert_ok(igrad_profile_entry(p, i, &e));
        assert_int_equal(e.important, e.kind == IGRAD_KIND_V || e.kind == IGRAD_KIND_O);
    }
    char *jpath = strdup(tmp_path("profile.json"));
    assert_ok(igrad_profile_save_json(p, jpath));
    assert_ok(igrad_profile_load(jpath, l, &q));
    assert_same_profile(p, q);
    /* saved again: the same text */
    char *jpath2 = strdup(tmp_path("profile2.json"));
    assert_ok(igrad_profile_save_json(q, jpath2));
    char *j1 = read_all(jpath), *j2 = read_all(jpath2);
    assert_string_equal(j1, j2);
    assert_non_null(strstr(j1, "\"schema\":\t\"igrad-profile\""));
    assert_null(strstr(j1, "\"note\"")); /* the hash is known */
    /* loading without a layout checks nothing about the model */
    igrad_profile_free(q);
    assert_ok(igrad_profile_load(jpath, NULL, &q));
    assert_same_profile(p, q);

    /* CSV export: the reference method's columns, is_important 1/0 */
    char *cpath = strdup(tmp_path("profile.csv"));
    assert_ok(igrad_profile_save_csv(p, cpath));
    char *csv = read_all(cpath);
    char *save = NULL;
    char *line = strtok_r(csv, "\n", &save);
    assert_string_equal(line, "layer,component,final_score,global_tau,is_important");
    size_t rows = 0;
    while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
        int layer, imp;
        char kind[8];
        double score, tau;
        assert_int_equal(sscanf(line, "%d,%7[^,],%lf,%lf,%d", &layer, kind, &score, &tau, &imp),
                         5);
        igrad_profile_entry_t e;
        assert_ok(igrad_profile_entry(p, rows, &e));
        assert_int_equal(layer, e.layer);
        assert_string_equal(kind, igrad_kind_name(e.kind));
        assert_near(score, e.score, 0); /* %.17g round-trips */
        assert_near(tau, igrad_profile_threshold(p), 0);
        assert_int_equal(imp, e.important);
        assert_int_equal(imp, score >= tau);
        rows++;
    }
    assert_int_equal(rows, 19);
    free(csv);
    free(j1);
    free(j2);
    unlink(jpath);
    unlink(jpath2);
    unlink(cpath);
    free(jpath);
    free(jpath2);
    free(cpath);
    igrad_profile_free(p);
    igrad_profile_free(q);
    igrad_trace_free(t);
    igrad_layout_free(l);
}

/* The trace text of `t` without the rows whose line contains `drop`. */
static char *trace_text_without(const igrad_trace_t *t, const char *drop)
{
    char *text = NULL;
    size_t n = 0;
    assert_ok(igrad__trace_to_text(t, &text, &n));
    char *out = malloc(n + 1), *o = out;
    assert_non_null(out);
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) + 1 : strlen(line);
        int keep = 1;
        const char *hit = strstr(line, drop);
        if (hit && hit < line + len) keep = 0;
        if (keep) {
            memcpy(o, line, len);
            o += len;
        }
        line += len;
    }
    *o = '\0';
    free(text);
    return out;
}

/* A profile from before EMB/HEAD/NORM were components lacks their rows:
 * it still loads against the layout (the engine then treats them as
 * important); a profile lacking a projection does not. */
static void test_profile_without_outer_components(void **state)
{
    (void)state;
    igrad_layout_t *l = llama_layout(2, 8);
    igrad_trace_t *t = recorded_trace(l, 4), *u = NULL;
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    igrad_profile_t *p = NULL, *q = NULL;
    char *path = strdup(tmp_path("old-profile.json"));

    char *text = trace_text_without(t, ",-1,EMB,");
    assert_ok(igrad__trace_from_text(text, strlen(text), "old.csv", &u));
    assert_int_equal(igrad_trace_component_count(u), 12);
    assert_ok(igrad_profile_build(u, &opts, &p));
    assert_true(igrad_profile_layout_hash(p) == igrad_layout_hash(l));
    assert_ok(igrad_profile_save_json(p, path));
    assert_ok(igrad_profile_load(path, l, &q));
    assert_int_equal(igrad_profile_count(q), 12);
    assert_int_equal(igrad_profile_is_important(q, -1, IGRAD_KIND_EMB), -1);
    igrad_profile_free(q);
    igrad_profile_free(p);
    igrad_trace_free(u);
    free(text);

    q = NULL;
    text = trace_text_without(t, ",0,Q,");
    assert_ok(igrad__trace_from_text(text, strlen(text), "noq.csv", &u));
    assert_ok(igrad_profile_build(u, &opts, &p));
    assert_ok(igrad_profile_save_json(p, path));
    assert_int_equal(igrad_profile_load(path, l, &q), IGRAD_E_MISMATCH);
    assert_error_has("lacks component layer 0 Q of this layout");
    assert_null(q);
    igrad_profile_free(p);
    igrad_trace_free(u);
    free(text);
    unlink(path);
    free(path);
    igrad_trace_free(t);
    igrad_layout_free(l);
}

static void test_wrong_layout(void **state)
{
    (void)state;
    igrad_layout_t *l = llama_layout(2, 8), *other = llama_layout(2, 16),
                   *fewer = llama_layout(1, 8);
    igrad_trace_t *t = recorded_trace(l, 4);
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    igrad_profile_t *p = NULL, *q = NULL;
    assert_ok(igrad_profile_build(t, &opts, &p));
    char *path = strdup(tmp_path("profile.json"));
    assert_ok(igrad_profile_save_json(p, path));
    assert_int_equal(igrad_profile_load(path, other, &q), IGRAD_E_MISMATCH);
    assert_null(q);
    char want[256];
    snprintf(want, sizeof want, "%s was made for layout 0x%016llx but this layout is 0x%016llx",
             path, (unsigned long long)igrad_layout_hash(l),
             (unsigned long long)igrad_layout_hash(other));
    assert_error_has(want);

    /* A profile with an unknown hash (trace CSV without its comment line)
     * is checked on its components: same ones load, others do not. */
    char *text = NULL;
    size_t n = 0;
    igrad_trace_t *u = NULL;
    assert_ok(igrad__trace_to_text(t, &text, &n));
    char *body = strchr(text, '\n') + 1; /* drop "# igrad-trace ..." */
    assert_ok(igrad__trace_from_text(body, strlen(body), "nohash.csv", &u));
    igrad_profile_free(p);
    assert_ok(igrad_profile_build(u, &opts, &p));
    assert_true(igrad_profile_layout_hash(p) == 0);
    assert_ok(igrad_profile_save_json(p, path));
    char *json = read_all(path);
    assert_non_null(strstr(json, "\"layout_hash\":\t\"0x0000000000000000\""));
    assert_non_null(strstr(json, "layout hash unknown"));
    assert_ok(igrad_profile_load(path, l, &q));
    igrad_profile_free(q);
    q = NULL;
    assert_int_equal(igrad_profile_load(path, other, &q), IGRAD_E_MISMATCH);
    assert_error_has("component layer -1 EMB has 128 entries, but 256 in this layout");
    assert_int_equal(igrad_profile_load(path, fewer, &q), IGRAD_E_MISMATCH);
    assert_error_has("has component layer 1 Q, which this layout does not");
    assert_null(q);
    free(json);
    free(text);
    unlink(path);
    free(path);
    igrad_profile_free(p);
    igrad_trace_free(t);
    igrad_trace_free(u);
    igrad_layout_free(l);
    igrad_layout_free(other);
    igrad_layout_free(fewer);
}

/* ---- malformed profiles ------------------------------------------------------ */

static char *valid_json(void)
{
    igrad_trace_t *t = hand_trace();
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    igrad_profile_t *p = NULL;
    assert_ok(igrad_profile_build(t, &opts, &p));
    char *text = NULL;
    assert_ok(igrad__profile_to_json_text(p, &text));
    igrad_profile_free(p);
    igrad_trace_free(t);
    return text;
}

static void expect_json_format(const char *text, const char *frag)
{
    igrad_profile_t *p = (igrad_profile_t *)1;
    igrad_status_t st = igrad__profile_from_json_text(text, strlen(text), "p.json", NULL, &p);
    if (st != IGRAD_E_FORMAT) {
        print_error("expected IGRAD_E_FORMAT (%s) for:\n%s\ngot %d: %s\n", frag, text, (int)st,
                    igrad_last_error());
        fail();
    }
    assert_null(p);
    assert_error_has("p.json");
    assert_error_has(frag);
}

typedef void (*mutate_fn)(cJSON *root);

static void expect_mutation(mutate_fn f, const char *frag)
{
    char *text = valid_json();
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    f(root);
    char *bad = cJSON_Print(root);
    expect_json_format(bad, frag);
    cJSON_free(bad);
    cJSON_Delete(root);
    free(text);
}

static cJSON *component(cJSON *root, int i)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItem(root, "components"), i);
}

static void drop_tau(cJSON *r) { cJSON_DeleteItemFromObject(r, "tau"); }
static void drop_score(cJSON *r) { cJSON_DeleteItemFromObject(component(r, 2), "score"); }
static void flip_important(cJSON *r)
{
    /* (0,K) has score .075 < tau .355 */
    cJSON_ReplaceItemInObject(component(r, 1), "important", cJSON_CreateTrue());
}
static void bad_schema(cJSON *r)
{
    cJSON_ReplaceItemInObject(r, "schema", cJSON_CreateString("igrad-trace"));
}
static void bad_version(cJSON *r) { cJSON_ReplaceItemInObject(r, "version", cJSON_CreateNumber(2)); }
static void bad_kind(cJSON *r)
{
    cJSON_ReplaceItemInObject(component(r, 0), "kind", cJSON_CreateString("MLP"));
}
static void layer_string(cJSON *r)
{
    cJSON_ReplaceItemInObject(component(r, 0), "layer", cJSON_CreateString("0"));
}
static void layer_fraction(cJSON *r)
{
    cJSON_ReplaceItemInObject(component(r, 3), "layer", cJSON_CreateNumber(1.5));
}
static void projection_at_layer_minus1(cJSON *r)
{
    cJSON_ReplaceItemInObject(component(r, 0), "layer", cJSON_CreateNumber(-1));
}
static void layer_minus2(cJSON *r)
{
    cJSON_ReplaceItemInObject(component(r, 0), "layer", cJSON_CreateNumber(-2));
}
static void duplicate_component(cJSON *r)
{
    cJSON_AddItemToArray(cJSON_GetObjectItem(r, "components"),
                         cJSON_Duplicate(component(r, 0), 1));
}
static void magnitude_range(cJSON *r)
{
    cJSON_ReplaceItemInObject(component(r, 2), "magnitude", cJSON_CreateNumber(1.5));
}
static void bad_hash(cJSON *r)
{
    cJSON_ReplaceItemInObject(r, "layout_hash", cJSON_CreateString("12345"));
}
static void bad_method(cJSON *r)
{
    cJSON_ReplaceItemInObject(r, "method", cJSON_CreateString("percentile:200"));
}
static void bad_window(cJSON *r)
{
    cJSON_ReplaceItemInObject(r, "window", cJSON_CreateIntArray((const int[]){5, 5}, 2));
}
static void empty_components(cJSON *r)
{
    cJSON_ReplaceItemInObject(r, "components", cJSON_CreateArray());
}
static void alpha_string(cJSON *r)
{
    cJSON_ReplaceItemInObject(r, "alpha", cJSON_CreateString("0.7"));
}
static void not_object(cJSON *r)
{
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(r, "components"), 1, cJSON_CreateNumber(3));
}

static void test_malformed_profiles(void **state)
{
    (void)state;
    /* the unmodified text loads */
    char *text = valid_json();
    igrad_profile_t *p = NULL;
    assert_ok(igrad__profile_from_json_text(text, strlen(text), "p.json", NULL, &p));
    assert_int_equal(igrad_profile_count(p), 4);
    igrad_profile_free(p);
    /* truncated anywhere: never OK */
    size_t n = strlen(text);
    for (size_t cut = 0; cut < n - 2; cut++) {
        p = NULL;
        assert_int_equal(igrad__profile_from_json_text(text, cut, "p.json", NULL, &p),
                         IGRAD_E_FORMAT);
        assert_null(p);
    }
    expect_json_format("{\"schema\": \"igrad-profile\",", "malformed JSON");
    expect_json_format("{} {}", "p.json:1:4: unexpected text after the JSON value");
    expect_json_format("[1, 2]", "not a JSON object");
    expect_json_format("", "malformed JSON");
    free(text);

    expect_mutation(drop_tau, "key 'tau' is missing");
    expect_mutation(drop_score, "components[2] (layer 0 V): key 'score' is missing");
    expect_mutation(flip_important, "components[1] (layer 0 K): important is true but score");
    expect_mutation(bad_schema, "key 'schema' is 'igrad-trace'");
    expect_mutation(bad_version, "key 'version' is 2");
    expect_mutation(bad_kind, "components[0]: kind 'MLP'");
    expect_mutation(layer_string, "components[0]: key 'layer' must be a number");
    expect_mutation(layer_fraction, "key 'layer' must be an integer");
    expect_mutation(projection_at_layer_minus1, "layer -1 is only for EMB, HEAD and NORM, not Q");
    expect_mutation(layer_minus2, "key 'layer' is -2");
    expect_mutation(duplicate_component, "component layer 0 Q is listed twice");
    expect_mutation(magnitude_range, "key 'magnitude' is 1.5");
    expect_mutation(bad_hash, "key 'layout_hash' is '12345'");
    expect_mutation(bad_method, "key 'method'");
    expect_mutation(bad_window, "key 'window'");
    expect_mutation(empty_components, "key 'components' is empty");
    expect_mutation(alpha_string, "key 'alpha' must be a number");
    expect_mutation(not_object, "components[1]: must be an object");

    /* through the file API: IO error for a missing file */
    assert_int_equal(igrad_profile_load(tmp_path("missing.json"), NULL, &p), IGRAD_E_IO);
}

/* Replaces the first `from` in text with `to` (malloc'd result). */
static char *replace_first(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    assert_non_null(at);
    size_t n = strlen(text), nf = strlen(from), nt = strlen(to);
    char *out = malloc(n - nf + nt + 1);
    assert_non_null(out);
    memcpy(out, text, (size_t)(at - text));
    memcpy(out + (at - text), to, nt);
    strcpy(out + (at - text) + nt, at + nf);
    return out;
}

/* "\u0000" in a string: cJSON cut "Q\u0000junk" to "Q" and "adtopk\u0000x"
 * to "adtopk", so edited profiles loaded as something else. */
static void test_nul_escape(void **state)
{
    (void)state;
    char *text = valid_json();
    char *bad = replace_first(text, "\"Q\"", "\"Q\\u0000junk\"");
    expect_json_format(bad, "string \"Q\\u0000...\" holds \\u0000");
    free(bad);
    const char *sp = strstr(text, "\"sparsifier\"");
    assert_non_null(sp);
    char key[64];
    /* the sparsifier's value, whatever it is, gets a NUL escape appended */
    const char *v = strchr(sp + 12, '"');
    const char *ve = strchr(v + 1, '"');
    snprintf(key, sizeof key, "%.*s\\u0000x\"", (int)(ve - v), v);
    char orig[64];
    snprintf(orig, sizeof orig, "%.*s\"", (int)(ve - v), v);
    bad = replace_first(text, orig, key);
    expect_json_format(bad, "holds \\u0000");
    free(bad);
    /* an escaped backslash before u0000 is a literal: the kind is then
     * simply unknown */
    bad = replace_first(text, "\"Q\"", "\"Q\\\\u0000\"");
    expect_json_format(bad, "kind 'Q\\u0000' is not one of");
    free(bad);
    free(text);
}

static int teardown(void **state)
{
    (void)state;
    if (tmpdir[0]) rmdir(tmpdir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_computed_profile),
        cmocka_unit_test(test_build_errors),
        cmocka_unit_test(test_json_round_trip_and_csv),
        cmocka_unit_test(test_wrong_layout),
        cmocka_unit_test(test_profile_without_outer_components),
        cmocka_unit_test(test_malformed_profiles),
        cmocka_unit_test(test_nul_escape),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
