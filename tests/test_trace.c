/*
 * test_trace.c — the activity trace of src/trace.c: recording per tensor
 * into (layer, kind) components against hand-computed activities, the
 * record-time errors, the CSV round trip (values, d_activity, byte-identical
 * rewrite) and every malformed-CSV case the reader must refuse with
 * IGRAD_E_FORMAT naming the file and line. Profiles are in test_profile.c.
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
#include "profile/profile_internal.h"

/* A 2-layer llama-style model, C = 8, kv width 4, F = 16, vocab 32:
 * components per layer Q (64), K (32), V (32), O (64), FC1 = gate + up
 * (256), FC2 (128), NORM (16); then (-1, EMB) 256, (-1, HEAD) 256,
 * (-1, NORM) 8; 17 components. Layer 0 also has "mlp.mystery" (8x8),
 * which no rule maps: OTHER, no component. */
static igrad_layout_t *llama_layout(void)
{
    igrad_layout_t *l = NULL;
    assert_ok(igrad_layout_create(&l));
    int64_t emb[2] = {32, 8}, q[2] = {8, 8}, kv[2] = {4, 8}, up[2] = {16, 8}, down[2] = {8, 16},
            norm[1] = {8};
    assert_ok(igrad_layout_add(l, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb));
    char name[128];
    for (int i = 0; i < 2; i++) {
        static const struct {
            const char *suffix;
            int which;
        } t[] = {{"input_layernorm.weight", 0},   {"self_attn.q_proj.weight", 1},
                 {"self_attn.k_proj.weight", 2},  {"self_attn.v_proj.weight", 2},
                 {"self_attn.o_proj.weight", 1},  {"post_attention_layernorm.weight", 0},
                 {"mlp.gate_proj.weight", 3},     {"mlp.up_proj.weight", 3},
                 {"mlp.down_proj.weight", 4}};
        for (size_t k = 0; k < sizeof t / sizeof *t; k++) {
            const int64_t *shape = t[k].which == 0   ? norm
                                   : t[k].which == 1 ? q
                                   : t[k].which == 2 ? kv
                                   : t[k].which == 3 ? up
                                                     : down;
            snprintf(name, sizeof name, "model.layers.%d.%s", i, t[k].suffix);
            assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, t[k].which ? 2 : 1, shape));
        }
    }
    assert_ok(igrad_layout_add(l, "model.layers.0.mlp.mystery.weight", IGRAD_DTYPE_F32, 2, q));
    assert_ok(igrad_layout_add(l, "model.norm.weight", IGRAD_DTYPE_F32, 1, norm));
    assert_ok(igrad_layout_add(l, "lm_head.weight", IGRAD_DTYPE_F32, 2, emb));
    return l;
}

static size_t tensor(const igrad_layout_t *l, const char *name)
{
    int i = igrad_layout_find(l, name);
    if (i < 0) {
        print_error("no tensor '%s'\n", name);
        fail();
    }
    return (size_t)i;
}

static long comp_index(const igrad_trace_t *t, int layer, igrad_kind_t kind)
{
    for (size_t c = 0; c < igrad_trace_component_count(t); c++) {
        igrad_component_info_t ci;
        assert_ok(igrad_trace_component(t, c, &ci));
        if (ci.layer == layer && ci.kind == kind) return (long)c;
    }
    return -1;
}

static double activity_at(const igrad_trace_t *t, size_t s, int layer, igrad_kind_t kind,
                          int64_t *retained)
{
    long c = comp_index(t, layer, kind);
    assert_true(c >= 0);
    double a = NAN;
    assert_ok(igrad_trace_value(t, s, (size_t)c, &a, retained));
    return a;
}

static void test_record_by_hand(void **state)
{
    (void)state;
    igrad_layout_t *l = llama_layout();
    igrad_trace_t *t = NULL;
    assert_ok(igrad_trace_create(l, &t));
    assert_int_equal(igrad_trace_component_count(t), 17);
    assert_int_equal(igrad_trace_step_count(t), 0);
    assert_true(igrad_trace_layout_hash(t) == igrad_layout_hash(l));
    assert_string_equal(igrad_trace_sparsifier(t), "unknown");

    /* step 3: q of layer 0 keeps sumsq 16 over 64 entries: a = sqrt(16/64)
     * = 0.5. FC1 of layer 1 = gate (sumsq 1) + up (sumsq 3) over 256
     * entries: a = sqrt(4/256) = 0.125, retained 5 + 7. The embedding
     * (sumsq 64 over 256: 0.5) and layer 0's input norm (sumsq 9 over the
     * 16 entries of both norms: 0.75) are components too. */
    assert_ok(igrad_trace_record(t, 3, tensor(l, "model.layers.0.self_attn.q_proj.weight"),
                                 16.0, 6));
    assert_ok(igrad_trace_record(t, 3, tensor(l, "model.layers.1.mlp.gate_proj.weight"), 1.0,
                                 5));
    assert_ok(igrad_trace_record(t, 3, tensor(l, "model.layers.1.mlp.up_proj.weight"), 3.0, 7));
    assert_ok(igrad_trace_record(t, 3, tensor(l, "model.embed_tokens.weight"), 64.0, 100));
    assert_ok(igrad_trace_record(t, 3, tensor(l, "model.layers.0.input_layernorm.weight"), 9.0,
                                 1));
    /* step 3 again (same step may be recorded in several calls), then 7 */
    assert_ok(igrad_trace_record(t, 3, tensor(l, "model.layers.1.self_attn.v_proj.weight"),
                                 2.0, 1));
    assert_ok(igrad_trace_record(t, 7, tensor(l, "model.layers.0.mlp.down_proj.weight"), 32.0,
                                 2));
    /* an OTHER tensor (mlp.mystery) at a later step adds no step row */
    assert_ok(igrad_trace_record(t, 9, tensor(l, "model.layers.0.mlp.mystery.weight"), 1.0, 1));
    assert_int_equal(igrad_trace_step_count(t), 2);
    assert_int_equal(igrad_trace_step(t, 0), 3);
    assert_int_equal(igrad_trace_step(t, 1), 7);
    assert_int_equal(igrad_trace_step(t, 2), -1);

    int64_t r = -1;
    assert_near(activity_at(t, 0, 0, IGRAD_KIND_Q, &r), 0.5, 1e-15);
    assert_int_equal(r, 6);
    assert_near(activity_at(t, 0, 1, IGRAD_KIND_FC1, &r), 0.125, 1e-15);
    assert_int_equal(r, 12);
    assert_near(activity_at(t, 0, 1, IGRAD_KIND_V, &r), sqrt(2.0 / 32.0), 1e-15);
    assert_int_equal(r, 1);
    assert_near(activity_at(t, 0, -1, IGRAD_KIND_EMB, &r), 0.5, 1e-15);
    assert_int_equal(r, 100);
    assert_near(activity_at(t, 0, 0, IGRAD_KIND_NORM, &r), 0.75, 1e-15);
    assert_int_equal(r, 1);
    assert_near(activity_at(t, 0, -1, IGRAD_KIND_HEAD, &r), 0.0, 0);
    /* components not recorded at a step: activity 0, retained 0 */
    assert_near(activity_at(t, 0, 0, IGRAD_KIND_FC2, &r), 0.0, 0);
    assert_int_equal(r, 0);
    assert_near(activity_at(t, 1, 0, IGRAD_KIND_Q, &r), 0.0, 0);
    assert_int_equal(r, 0);
    assert_near(activity_at(t, 1, 0, IGRAD_KIND_FC2, &r), sqrt(32.0 / 128.0), 1e-15);
    assert_int_equal(r, 2);
    /* component table: ordered by layer then kind, with tensor counts */
    igrad_component_info_t ci;
    assert_ok(igrad_trace_component(t, 7, &ci));
    assert_int_equal(ci.layer, 0);
    assert_int_equal(ci.kind, IGRAD_KIND_FC1);
    assert_int_equal(ci.count, 256);
    assert_int_equal(ci.tensors, 2);
    assert_ok(igrad_trace_component(t, 0, &ci));
    assert_int_equal(ci.layer, -1);
    assert_int_equal(ci.kind, IGRAD_KIND_EMB);
    assert_ok(igrad_trace_component(t, 2, &ci));
    assert_int_equal(ci.layer, -1);
    assert_int_equal(ci.kind, IGRAD_KIND_NORM);
    assert_int_equal(ci.count, 8);
    assert_ok(igrad_trace_component(t, 9, &ci));
    assert_int_equal(ci.layer, 0);
    assert_int_equal(ci.kind, IGRAD_KIND_NORM);
    assert_int_equal(ci.count, 16);
    assert_int_equal(ci.tensors, 2);
    igrad_trace_free(t);
    igrad_layout_free(l);
}

static void test_record_errors(void **state)
{
    (void)state;
    igrad_layout_t *l = llama_layout();
    igrad_trace_t *t = NULL;
    assert_ok(igrad_trace_create(l, &t));
    size_t q0 = tensor(l, "model.layers.0.self_attn.q_proj.weight");
    assert_ok(igrad_trace_record(t, 5, q0, 1.0, 10));
    assert_int_equal(igrad_trace_record(t, 4, q0, 1.0, 1), IGRAD_E_INVALID);
    assert_error_has("step 4 after step 5");
    assert_int_equal(igrad_trace_record(t, 6, igrad_layout_count(l), 1.0, 1), IGRAD_E_INVALID);
    assert_error_has("out of range");
    assert_int_equal(igrad_trace_record(t, 6, q0, -1.0, 1), IGRAD_E_INVALID);
    assert_int_equal(igrad_trace_record(t, 6, q0, NAN, 1), IGRAD_E_INVALID);
    assert_int_equal(igrad_trace_record(t, 6, q0, 1.0, -1), IGRAD_E_INVALID);
    assert_int_equal(igrad_trace_record(t, -1, q0, 1.0, 1), IGRAD_E_INVALID);
    /* q has 64 entries: 10 + 55 > 64 (recorded twice?) */
    assert_int_equal(igrad_trace_record(t, 5, q0, 1.0, 55), IGRAD_E_INVALID);
    assert_error_has("10 + 55 of its 64");
    assert_int_equal(igrad_trace_step_count(t), 1); /* failed calls added nothing */
    assert_int_equal(igrad_trace_set_sparsifier(t, IGRAD_SPARSIFIER_TOPK, 0.0), IGRAD_E_INVALID);
    assert_int_equal(igrad_trace_set_sparsifier(t, IGRAD_SPARSIFIER_TOPK, 1.5), IGRAD_E_INVALID);
    assert_int_equal(igrad_trace_set_sparsifier(t, (igrad_sparsifier_t)9, 0.1), IGRAD_E_INVALID);
    igrad_trace_free(t);
    t = (igrad_trace_t *)1;
    assert_int_equal(igrad_trace_create(NULL, &t), IGRAD_E_INVALID);
    assert_null(t);
    igrad_layout_free(l);
}

static char tmpdir[64];

static void make_tmpdir(void)
{
    if (tmpdir[0]) return;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/igrad-test-trace-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
}

static char *tmp_path(const char *name)
{
    static char path[128];
    make_tmpdir();
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    return path;
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

static void write_all(const char *path, const char *text)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

/* A trace with irrational-looking activities over 5 steps. */
static igrad_trace_t *sample_trace(const igrad_layout_t *l)
{
    igrad_trace_t *t = NULL;
    assert_ok(igrad_trace_create(l, &t));
    assert_ok(igrad_trace_set_sparsifier(t, IGRAD_SPARSIFIER_ADTOPK, 0.01));
    for (int64_t s = 10; s < 15; s++) {
        for (size_t i = 0; i < igrad_layout_count(l); i++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(l, i, &ti));
            if (ti.component < 0) continue;
            double sumsq = 1.0 / (double)(3 + i + (size_t)s * 7) + 1e-7 * (double)i;
            assert_ok(igrad_trace_record(t, s, i, sumsq, 1 + (int64_t)i % 3));
        }
    }
    return t;
}

static void test_save_load_round_trip(void **state)
{
    (void)state;
    igrad_layout_t *l = llama_layout();
    igrad_trace_t *t = sample_trace(l);
    char *p1 = strdup(tmp_path("trace.csv"));
    assert_ok(igrad_trace_save(t, p1));

    igrad_trace_t *u = NULL;
    assert_ok(igrad_trace_load(p1, &u));
    assert_int_equal(igrad_trace_step_count(u), 5);
    assert_int_equal(igrad_trace_component_count(u), 17);
    assert_true(igrad_trace_layout_hash(u) == igrad_layout_hash(l));
    assert_string_equal(igrad_trace_sparsifier(u), "adtopk");
    assert_near(igrad_trace_density(u), 0.01, 0);
    for (size_t s = 0; s < 5; s++) {
        assert_int_equal(igrad_trace_step(u, s), igrad_trace_step(t, s));
        for (size_t c = 0; c < 17; c++) {
            double a0, a1;
            int64_t r0, r1;
            igrad_component_info_t c0, c1;
            assert_ok(igrad_trace_value(t, s, c, &a0, &r0));
            assert_ok(igrad_trace_value(u, s, c, &a1, &r1));
            assert_ok(igrad_trace_component(t, c, &c0));
            assert_ok(igrad_trace_component(u, c, &c1));
            /* v2 prints every double exactly */
            assert_true(a1 == a0);
            assert_int_equal(r1, r0);
            assert_int_equal(c1.layer, c0.layer);
            assert_int_equal(c1.kind, c0.kind);
            assert_int_equal(c1.count, c0.count);
            assert_int_equal(c1.tensors, 0); /* not in the file */
        }
    }
    /* Written again, the file is byte-identical (d_activity included). */
    char *p2 = strdup(tmp_path("trace2.csv"));
    assert_ok(igrad_trace_save(u, p2));
    char *text1 = read_all(p1), *text2 = read_all(p2);
    assert_string_equal(text1, text2);

    /* The columns, checked from the file itself with an independent reader:
     * raw_activity = sqrt(sum of retained v^2) of the component (its
     * tensors' recorded sums added), d_activity = raw / sqrt(numel). */
    char *save = NULL;
    char *line = strtok_r(text1, "\n", &save);
    assert_non_null(strstr(line, "# igrad-trace v2 layout_hash=0x"));
    line = strtok_r(NULL, "\n", &save);
    assert_string_equal(line,
                        "step,layer,component,raw_activity,d_activity,numel,retained_numel");
    size_t rows = 0;
    while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
        long long step, numel, ret;
        int layer;
        char kind[8];
        double raw, d;
        assert_int_equal(sscanf(line, "%lld,%d,%7[^,],%lf,%lf,%lld,%lld", &step, &layer, kind,
                                &raw, &d, &numel, &ret),
                         7);
        double sumsq = 0.0; /* sample_trace()'s sums over the component's tensors */
        for (size_t i = 0; i < igrad_layout_count(l); i++) {
            igrad_tensor_info_t ti;
            igrad_component_info_t ci;
            assert_ok(igrad_layout_tensor(l, i, &ti));
            if (ti.component < 0) continue;
            assert_ok(igrad_layout_component(l, (size_t)ti.component, &ci));
            if (ci.layer != layer || strcmp(igrad_kind_name(ci.kind), kind) != 0) continue;
            sumsq += 1.0 / (double)(3 + i + (size_t)step * 7) + 1e-7 * (double)i;
        }
        assert_near(raw, sqrt(sumsq), 1e-15 * raw);
        assert_near(d, raw / sqrt((double)numel), 1e-15 * d);
        rows++;
    }
    assert_int_equal(rows, 5 * 17);
    free(text1);
    free(text2);
    unlink(p1);
    unlink(p2);
    free(p1);
    free(p2);
    igrad_trace_free(t);
    igrad_trace_free(u);
    igrad_layout_free(l);
}

static const char HEADER[] = "step,layer,component,raw_activity,d_activity,numel,retained_numel\n";

/* Parses `body` after `header` as file `source` and checks the status and
 * a fragment of the message. */
static void expect_format_after(const char *header, const char *source, const char *body,
                                const char *frag)
{
    char text[2048];
    snprintf(text, sizeof text, "%s%s", header, body);
    igrad_trace_t *t = (igrad_trace_t *)1;
    igrad_status_t st = igrad__trace_from_text(text, strlen(text), source, &t);
    if (st != IGRAD_E_FORMAT) {
        print_error("expected IGRAD_E_FORMAT for:\n%s\ngot %d: %s\n", text, (int)st,
                    igrad_last_error());
        fail();
    }
    assert_null(t);
    char named[64];
    snprintf(named, sizeof named, "%s:", source);
    assert_error_has(named);
    assert_error_has(frag);
}

static void expect_format(const char *body, const char *frag)
{
    expect_format_after(HEADER, "bad.csv", body, frag);
}

static void test_load_errors(void **state)
{
    (void)state;
    static const char GOOD2[] = "0,0,Q,0.5,0,64,3\n0,0,K,0.25,0,32,2\n";
    /* the reference: two complete steps load fine */
    {
        char text[512];
        snprintf(text, sizeof text, "%s%s1,0,K,0.5,0.25,32,1\n1,0,Q,0.1,-0.4,64,0\n", HEADER,
                 GOOD2);
        igrad_trace_t *t = NULL;
        assert_ok(igrad__trace_from_text(text, strlen(text), "ok.csv", &t));
        assert_int_equal(igrad_trace_step_count(t), 2);
        /* no comment line: layout hash unknown */
        assert_true(igrad_trace_layout_hash(t) == 0);
        assert_string_equal(igrad_trace_sparsifier(t), "unknown");
        /* rows within a step may come in any order */
        assert_near(activity_at(t, 1, 0, IGRAD_KIND_Q, NULL), 0.1, 0);
        igrad_trace_free(t);
    }
    expect_format("0,0,Q,0.5,0,64\n", "bad.csv:2: expected 7 fields");
    expect_format("0,0,Q,0.5,0,64,3,9\n", "found 8");
    expect_format("0,0,Q,abc,0,64,3\n", "raw_activity 'abc'");
    expect_format("0,0,Q,0.5,0,64x,3\n", "numel '64x'");
    expect_format("0,0,Q,-0.5,0,64,3\n", "raw_activity '-0.5'");
    expect_format("0,0,Q,nan,0,64,3\n", "raw_activity 'nan'");
    expect_format("0,0,Q,0.5,inf,64,3\n", "d_activity 'inf'");
    expect_format("0,0,Q,1e999,0,64,3\n", "raw_activity '1e999'");
    expect_format("-1,0,Q,0.5,0,64,3\n", "step '-1'");
    expect_format("0,-2,Q,0.5,0,64,3\n", "layer '-2'");
    expect_format("0.5,0,Q,0.5,0,64,3\n", "step '0.5'");
    expect_format("0,0,QQ,0.5,0,64,3\n", "unknown component kind 'QQ'");
    expect_format("0,0,OTHER,0.5,0,64,3\n", "unknown component kind 'OTHER'");
    expect_format("0,-1,Q,0.5,0,64,3\n", "layer -1 is only for EMB, HEAD and NORM, not Q");
    expect_format("0,0,,0.5,0,64,3\n", "bad.csv:2: empty component field");
    expect_format("0,0,Q,0.5,0,0,0\n", "numel '0'");
    expect_format("0,0,Q,0.5,0,64,65\n", "retained_numel 65 is more than numel 64");
    expect_format("0,0,Q,0.5,0,64,-1\n", "retained_numel '-1'");
    /* steps decreasing */
    expect_format("1,0,Q,0.5,0,64,3\n0,0,Q,0.5,0,64,3\n", "bad.csv:3: step 0 after step 1");
    /* duplicate (step, component): in the first step and in a later one */
    expect_format("0,0,Q,0.5,0,64,3\n0,0,K,0.5,0,32,3\n0,0,Q,0.6,0,64,3\n",
                  "bad.csv:4: duplicate row for step 0, layer 0, component Q (first at line 2)");
    expect_format("0,0,Q,0.5,0,64,3\n1,0,Q,0.5,0,64,3\n1,0,Q,0.6,0,64,3\n",
                  "bad.csv:4: duplicate row for step 1, layer 0, component Q");
    /* a step missing a component, at the end and in the middle */
    expect_format("0,0,Q,0.5,0,64,3\n0,0,K,0.5,0,32,3\n1,0,Q,0.5,0,64,3\n",
                  "bad.csv:4: step 1 has no row for layer 0 component K");
    expect_format("0,0,Q,0.5,0,64,3\n0,0,K,0.5,0,32,3\n1,0,K,0.5,0,32,3\n2,0,Q,0.5,0,64,3\n"
                  "2,0,K,0.5,0,32,3\n",
                  "step 1 has no row for layer 0 component Q");
    /* a component that the first step does not have */
    expect_format("0,0,Q,0.5,0,64,3\n1,0,Q,0.5,0,64,3\n1,1,Q,0.5,0,64,3\n",
                  "bad.csv:4: step 1 lists layer 1 component Q, which step 0 does not");
    /* numel changing across steps */
    expect_format("0,0,Q,0.5,0,64,3\n1,0,Q,0.5,0,63,3\n",
                  "layer 0 component Q has numel 63 here but 64 at step 0");
    /* no rows, wrong header, empty file */
    expect_format("", "no data rows");
    {
        static const char *const bad_headers[] = {
            "step,layer,component,raw_activity,d_activity,numel\n0,0,Q,0.5,0,64,3\n",
            "step,layer,kind,raw_activity,d_activity,numel,retained_numel\n",
            "0,0,Q,0.5,0,64,3\n", ""};
        for (size_t i = 0; i < sizeof bad_headers / sizeof *bad_headers; i++) {
            igrad_trace_t *t = NULL;
            assert_int_equal(igrad__trace_from_text(bad_headers[i], strlen(bad_headers[i]),
                                                    "h.csv", &t),
                             IGRAD_E_FORMAT);
            assert_error_has(i < 3 ? "h.csv:1: expected the header" : "no header line");
        }
    }
    /* a malformed igrad-trace comment line */
    {
        static const char *const bad_meta[] = {
            "# igrad-trace v3 layout_hash=0x1\n", "# igrad-trace v1 layout_hash=12\n",
            "# igrad-trace v1 density=2\n", "# igrad-trace v1 sparsifier=a,b\n",
            "# igrad-trace v1 layout_hash\n"};
        for (size_t i = 0; i < sizeof bad_meta / sizeof *bad_meta; i++) {
            char text[512];
            snprintf(text, sizeof text, "%s%s%s", bad_meta[i], HEADER, GOOD2);
            igrad_trace_t *t = NULL;
            assert_int_equal(igrad__trace_from_text(text, strlen(text), "m.csv", &t),
                             IGRAD_E_FORMAT);
            assert_error_has("m.csv:1:");
        }
    }
    /* NUL byte */
    {
        igrad_trace_t *t = NULL;
        char text[] = "step\0,layer";
        assert_int_equal(igrad__trace_from_text(text, sizeof text - 1, "z.csv", &t),
                         IGRAD_E_FORMAT);
        assert_error_has("NUL");
    }
}

/* Every prefix of a valid file that cuts a line short is refused (files
 * cut at a line boundary between steps are valid shorter traces). */
/* The reference method's component_activity_trace.csv (csv.DictWriter:
 * \r\n, a field with a comma quoted) and igrad's v2: the activity is
 * d_activity = raw_activity / sqrt(numel); the reference's GATE and DOWN
 * are igrad's FC1 and FC2. */
#define REF_HEAD                                                                    \
    "step,seed,model_name,workload_name,dataset_name,layer,component,raw_activity," \
    "d_activity,numel,retained_numel\r\n"
#define REF_RUN "42,facebook/opt-125m,pubmed,\"a,\"\"b\"\"\""

static void expect_ref_format(const char *rows, const char *frag)
{
    expect_format_after(REF_HEAD, "ref.csv", rows, frag);
}

static void test_reference_and_v2(void **state)
{
    (void)state;
    static const char REF[] = REF_HEAD
        "1," REF_RUN ",0,Q,3.0,0.375,64,2\r\n"
        "1," REF_RUN ",0,GATE,0.5,0.0625,64,1\r\n"
        "1," REF_RUN ",0,DOWN,1.0,0.125,64,1\r\n"
        "2," REF_RUN ",0,Q,0.0,0.0,64,0\r\n"
        "2," REF_RUN ",0,GATE,1.5,0.1875,64,1\r\n"
        "2," REF_RUN ",0,DOWN,2.0,0.25,64,1\r\n";
    igrad_trace_t *t = NULL;
    assert_ok(igrad__trace_from_text(REF, strlen(REF), "ref.csv", &t));
    assert_int_equal(igrad_trace_step_count(t), 2);
    assert_int_equal(igrad_trace_step(t, 0), 1);
    assert_true(igrad_trace_layout_hash(t) == 0);
    assert_string_equal(igrad_trace_sparsifier(t), "unknown");
    assert_near(activity_at(t, 0, 0, IGRAD_KIND_Q, NULL), 0.375, 0);
    assert_near(activity_at(t, 1, 0, IGRAD_KIND_FC1, NULL), 0.1875, 0);
    assert_near(activity_at(t, 1, 0, IGRAD_KIND_FC2, NULL), 0.25, 0);
    /* written as v2 and read back: the same numbers, raw_activity kept */
    char *text = NULL;
    size_t n = 0;
    assert_ok(igrad__trace_to_text(t, &text, &n));
    assert_non_null(strstr(text, "# igrad-trace v2 "));
    assert_non_null(strstr(text, "\n1,0,Q,3,0.375,64,2\n"));
    assert_non_null(strstr(text, "\n2,0,FC1,1.5,0.1875,64,1\n"));
    igrad_trace_t *u = NULL;
    assert_ok(igrad__trace_from_text(text, n, "v2.csv", &u));
    assert_near(activity_at(u, 1, 0, IGRAD_KIND_FC2, NULL), 0.25, 0);
    free(text);
    igrad_trace_free(u);
    igrad_trace_free(t);

    /* the same numbers as v1 (raw_activity = a) give the same activities */
    static const char V1[] = "# igrad-trace v1\n"
                             "step,layer,component,raw_activity,d_activity,numel,retained_numel\n"
                             "1,0,Q,0.375,0,64,2\n2,0,Q,0,-0.375,64,0\n";
    assert_ok(igrad__trace_from_text(V1, strlen(V1), "v1.csv", &t));
    assert_near(activity_at(t, 0, 0, IGRAD_KIND_Q, NULL), 0.375, 0);
    assert_ok(igrad__trace_to_text(t, &text, &n));
    assert_non_null(strstr(text, "\n1,0,Q,3,0.375,64,2\n")); /* raw = a * sqrt(64) */
    free(text);
    igrad_trace_free(t);

    /* v2: d_activity must be raw_activity / sqrt(numel) (a v1 file under a
     * v2 line is refused, not scored) */
    expect_format_after("# igrad-trace v2\n", "v2.csv", "step,layer,component,raw_activity,"
                        "d_activity,numel,retained_numel\n1,0,Q,0.375,0,64,2\n",
                        "v2.csv:3: d_activity 0 is not raw_activity / sqrt(numel)");
    expect_format_after("# igrad-trace v2\n", "v2.csv", "step,layer,component,raw_activity,"
                        "d_activity,numel,retained_numel\n1,0,Q,0,-1e-310,64,2\n",
                        "v2.csv:3: d_activity -1e-310");
    /* v1 raw_activity so large that raw * sqrt(numel) overflows */
    expect_format_after("# igrad-trace v1\n", "v1.csv", "step,layer,component,raw_activity,"
                        "d_activity,numel,retained_numel\n1,0,Q,1e308,0,64,2\n",
                        "v1.csv:3: raw_activity '1e308' times sqrt(numel 64) is not finite");

    /* every malformed reference row is named by line */
    expect_ref_format("1," REF_RUN ",0,Q,3.0,0.375,64\r\n", "ref.csv:2: expected 11 fields");
    expect_ref_format("1," REF_RUN ",0,attn_q,3.0,0.375,64,2\r\n",
                      "ref.csv:2: unknown component 'attn_q' (the reference method's names");
    expect_ref_format("1," REF_RUN ",-1,EMB,3.0,0.375,64,2\r\n", "unknown component 'EMB'");
    expect_ref_format("1," REF_RUN ",0,Q,3.0,0.5,64,2\r\n",
                      "ref.csv:2: d_activity 0.5 is not raw_activity / sqrt(numel) = 3.0 / "
                      "sqrt(64) = 0.375 (the reference method's columns");
    expect_ref_format("1," REF_RUN ",0,Q,nan,nan,64,2\r\n", "raw_activity 'nan'");
    expect_ref_format("1," REF_RUN ",0,Q,-3,-0.375,64,2\r\n", "raw_activity '-3'");
    expect_ref_format("1," REF_RUN ",0,Q,3.0,0.375,64,65\r\n",
                      "retained_numel 65 is more than numel 64");
    expect_ref_format("1,x,m,w,d,0,Q,3.0,0.375,64,2\r\n", "ref.csv:2: seed 'x' is not an integer");
    expect_ref_format("1,42,m,w,\"d,0,Q,3.0,0.375,64,2\r\n", "ref.csv:2: unterminated or stray");
    expect_ref_format("1,42,m,w,d\"x,0,Q,3.0,0.375,64,2\r\n", "ref.csv:2: unterminated or stray");
    expect_ref_format("1,42,m,w,,0,Q,3.0,0.375,64,2\r\n", "ref.csv:2: empty dataset_name field");
    expect_ref_format("1," REF_RUN ",0,Q,3.0,0.375,64,2\r\n"
                      "2,42,facebook/opt-350m,pubmed,d,0,Q,3.0,0.375,64,2\r\n",
                      "ref.csv:3: model_name 'facebook/opt-350m' differs from "
                      "'facebook/opt-125m' on the first row (a trace file holds one run)");
    /* GATE and UP both mean FC1: one row per (step, layer, component) */
    expect_ref_format("1," REF_RUN ",0,GATE,3.0,0.375,64,2\r\n1," REF_RUN
                      ",0,UP,3.0,0.375,64,2\r\n",
                      "ref.csv:3: duplicate row for step 1, layer 0, component FC1");
    expect_ref_format("1," REF_RUN ",0,Q,3.0,0.375,64,2\r\n2," REF_RUN ",0,K,3.0,0.375,64,2\r\n",
                      "ref.csv:3: step 2 lists layer 0 component K, which step 1 does not");
    /* the reference header under an igrad-trace line */
    static const char MIXED[] = "# igrad-trace v2\n" REF_HEAD "1," REF_RUN
                                ",0,Q,3.0,0.375,64,2\r\n";
    assert_int_equal(igrad__trace_from_text(MIXED, strlen(MIXED), "mixed.csv", &t),
                     IGRAD_E_FORMAT);
    assert_error_has("mixed.csv:2: the reference method's header after a '# igrad-trace v2'");
}

static void test_truncated_file(void **state)
{
    (void)state;
    igrad_layout_t *l = llama_layout();
    igrad_trace_t *t = sample_trace(l);
    char *path = strdup(tmp_path("full.csv"));
    assert_ok(igrad_trace_save(t, path));
    char *text = read_all(path);
    size_t n = strlen(text);
    size_t refused = 0, accepted = 0;
    for (size_t cut = 0; cut < n; cut++) {
        igrad_trace_t *u = NULL;
        igrad_status_t st = igrad__trace_from_text(text, cut, "cut.csv", &u);
        if (st == IGRAD_OK) {
            /* only cuts that end a step's last row (or end inside its last
             * field, keeping a valid shorter number) can be accepted */
            accepted++;
            assert_true(igrad_trace_step_count(u) >= 1);
            igrad_trace_free(u);
        } else {
            assert_int_equal(st, IGRAD_E_FORMAT);
            refused++;
        }
    }
    assert_true(refused > n * 9 / 10);
    assert_true(accepted > 0);
    /* the file's real load path names the file */
    char *cut_path = strdup(tmp_path("cut.csv"));
    text[n / 2] = '\0';
    write_all(cut_path, text);
    igrad_trace_t *u = NULL;
    assert_int_equal(igrad_trace_load(cut_path, &u), IGRAD_E_FORMAT);
    assert_error_has(cut_path);
    assert_int_equal(igrad_trace_load(tmp_path("missing.csv"), &u), IGRAD_E_IO);
    unlink(cut_path);
    unlink(path);
    free(cut_path);
    free(path);
    free(text);
    igrad_trace_free(t);
    igrad_layout_free(l);
}

static void test_loaded_trace_cannot_record(void **state)
{
    (void)state;
    char text[256];
    snprintf(text, sizeof text, "%s0,0,Q,0.5,0,64,3\n", HEADER);
    igrad_trace_t *t = NULL;
    assert_ok(igrad__trace_from_text(text, strlen(text), "x.csv", &t));
    assert_int_equal(igrad_trace_record(t, 1, 0, 1.0, 1), IGRAD_E_INVALID);
    assert_error_has("read from a file");
    igrad_trace_free(t);
}

/* A model none of whose tensors maps to a component (a custom model, PEFT
 * adapters the rules do not know) traces nothing: the profile builder and
 * the loader of its saved trace say so and point to `igrad layout
 * --unmapped` and the user rules; a trace whose mapped tensors were just
 * never recorded says that instead. The reference's files get no hint. */
static void test_unmapped_names_hint(void **state)
{
    (void)state;
    igrad_layout_t *l = NULL;
    assert_ok(igrad_layout_create(&l));
    int64_t sq[2] = {8, 8};
    assert_ok(igrad_layout_add(l, "model.layers.0.mixer_x.ia3_vec", IGRAD_DTYPE_F32, 2, sq));
    assert_ok(igrad_layout_add(l, "model.layers.1.mixer_x.ia3_vec", IGRAD_DTYPE_F32, 2, sq));
    igrad_trace_t *t = NULL;
    assert_ok(igrad_trace_create(l, &t));
    assert_ok(igrad_trace_record(t, 0, 0, 1.0, 1)); /* OTHER: nothing kept */
    igrad_profile_options_t po = IGRAD_PROFILE_OPTIONS_INIT;
    igrad_profile_t *p = NULL;
    assert_int_equal(igrad_profile_build(t, &po, &p), IGRAD_E_INVALID);
    assert_error_has("none of its layout's 2 tensors maps to one");
    assert_error_has("no traced tensor mapped to a component");
    assert_error_has("igrad layout --unmapped");
    assert_error_has("--map FILE");
    assert_error_has("name_map=");
    /* its saved file: a header and no rows */
    char *path = strdup(tmp_path("unmapped.csv"));
    assert_ok(igrad_trace_save(t, path));
    igrad_trace_t *u = NULL;
    assert_int_equal(igrad_trace_load(path, &u), IGRAD_E_FORMAT);
    assert_error_has("no data rows after the header");
    assert_error_has("no traced tensor mapped to a component");
    assert_error_has("igrad layout --unmapped");
    unlink(path);
    free(path);
    igrad_trace_free(t);

    /* one mapped tensor never recorded, one OTHER recorded */
    assert_ok(igrad_layout_add(l, "model.layers.0.self_attn.q_proj.weight", IGRAD_DTYPE_F32, 2,
                               sq));
    assert_ok(igrad_trace_create(l, &t));
    assert_ok(igrad_trace_record(t, 0, 0, 1.0, 1));
    assert_int_equal(igrad_profile_build(t, &po, &p), IGRAD_E_INVALID);
    assert_error_has("nothing was recorded for the 1 of its layout's 3 tensors that map to a "
                     "component (igrad_trace_record skips the others; `igrad layout "
                     "--unmapped MODEL`");
    igrad_trace_free(t);
    /* every tensor mapped: no hint about names */
    igrad_layout_t *m = NULL;
    assert_ok(igrad_layout_create(&m));
    assert_ok(igrad_layout_add(m, "model.layers.0.self_attn.q_proj.weight", IGRAD_DTYPE_F32, 2,
                               sq));
    assert_ok(igrad_trace_create(m, &t));
    assert_int_equal(igrad_profile_build(t, &po, &p), IGRAD_E_INVALID);
    assert_error_has("nothing was recorded for the 1 of its layout's 1 tensors");
    if (strstr(igrad_last_error(), "--unmapped")) fail_msg("hint: %s", igrad_last_error());
    igrad_trace_free(t);
    igrad_layout_free(m);
    igrad_layout_free(l);

    /* the reference method's file without rows: its components are names
     * of its own, no hint */
    expect_ref_format("", "no data rows after the header");
    if (strstr(igrad_last_error(), "--unmapped")) fail_msg("hint: %s", igrad_last_error());
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
        cmocka_unit_test(test_record_by_hand),
        cmocka_unit_test(test_record_errors),
        cmocka_unit_test(test_save_load_round_trip),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_reference_and_v2),
        cmocka_unit_test(test_truncated_file),
        cmocka_unit_test(test_loaded_trace_cannot_record),
        cmocka_unit_test(test_unmapped_names_hint),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
