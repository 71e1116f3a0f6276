/*
 * test_gate.c — which tensors the engine sends every step and which it
 * defers (the gate of plan_phases): EMB, HEAD and NORM components follow
 * the profile like projections, and are always sent when the
 * profile lacks them (a profile from before they were components); OTHER
 * tensors are always sent. Checked through the public tensor plans and
 * the predicted payload.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "igrad.h"
#include "profile/profile_internal.h"
#include "test_util.h"

/* 2 blocks of width 16 (q, k, v, o, up, down, two norms), embedding 64x16,
 * final norm, untied lm_head, and a tensor no rule maps (OTHER). */
static igrad_layout_t *gate_layout(void)
{
    igrad_layout_t *l = NULL;
    assert_ok(igrad_layout_create(&l));
    int64_t emb[2] = {64, 16}, sq[2] = {16, 16}, up[2] = {32, 16}, down[2] = {16, 32},
            vec[1] = {16}, mystery[2] = {4, 16};
    assert_ok(igrad_layout_add(l, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb));
    static const char *const sqn[] = {"self_attn.q_proj", "self_attn.k_proj",
                                      "self_attn.v_proj", "self_attn.o_proj"};
    char name[128];
    for (int b = 0; b < 2; b++) {
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 1, vec));
        for (int k = 0; k < 4; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", b, sqn[k]);
            assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, sq));
        }
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 1, vec));
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, up));
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", b);
        assert_ok(igrad_layout_add(l, name, IGRAD_DTYPE_F32, 2, down));
    }
    assert_ok(igrad_layout_add(l, "model.layers.1.mlp.mystery.weight", IGRAD_DTYPE_F32, 2,
                               mystery));
    assert_ok(igrad_layout_add(l, "model.norm.weight", IGRAD_DTYPE_F32, 1, vec));
    assert_ok(igrad_layout_add(l, "lm_head.weight", IGRAD_DTYPE_F32, 2, emb));
    return l;
}

/* V and O carry high activity, the rest low: kmeans2 marks V and O. The
 * trace text (for dropping rows) goes to *text when not NULL. */
static igrad_trace_t *gate_trace(const igrad_layout_t *l)
{
    igrad_trace_t *t = NULL;
    assert_ok(igrad_trace_create(l, &t));
    assert_ok(igrad_trace_set_sparsifier(t, IGRAD_SPARSIFIER_ADTOPK, 0.01));
    for (int s = 0; s < 6; s++)
        for (size_t i = 0; i < igrad_layout_count(l); i++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(l, i, &ti));
            double level = ti.kind == IGRAD_KIND_V || ti.kind == IGRAD_KIND_O ? 4.0 : 1.0;
            double sumsq = level * level * (double)ti.count * (1.0 + 0.01 * ((s + (int)i) % 3));
            assert_ok(igrad_trace_record(t, s, i, sumsq, 1));
        }
    return t;
}

static igrad_profile_t *profile_of(const igrad_trace_t *t)
{
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    opts.method = "kmeans2";
    igrad_profile_t *p = NULL;
    assert_ok(igrad_profile_build(t, &opts, &p));
    return p;
}

static int is_outer(igrad_kind_t k)
{
    return k == IGRAD_KIND_EMB || k == IGRAD_KIND_HEAD || k == IGRAD_KIND_NORM;
}

/* Every tensor's every_step against the rule; returns how many outer
 * tensors were deferred. */
static int check_plan(const igrad_layout_t *l, const igrad_profile_t *p)
{
    igrad_comm_t *comm = NULL;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    assert_ok(igrad_engine_create(l, p, &c, comm, &e));
    int deferred_outer = 0;
    for (size_t i = 0; i < igrad_layout_count(l); i++) {
        igrad_tensor_info_t ti;
        igrad_tensor_plan_t tp;
        assert_ok(igrad_layout_tensor(l, i, &ti));
        assert_ok(igrad_engine_tensor_plan(e, i, &tp));
        int imp = igrad_profile_is_important(p, ti.layer, ti.kind);
        int want;
        if (ti.kind == IGRAD_KIND_OTHER) want = 1;
        else if (is_outer(ti.kind) && imp < 0) want = 1;
        else want = imp == 1;
        if (tp.every_step != want)
            fail_msg("%s (%s, profile says %d): every_step %d, expected %d", ti.name,
                     igrad_kind_name(ti.kind), imp, tp.every_step, want);
        if (is_outer(ti.kind) && !tp.every_step) deferred_outer++;
    }
    igrad_engine_free(e);
    igrad_comm_free(comm);
    return deferred_outer;
}

static void test_gate_outer(void **state)
{
    (void)state;
    igrad_layout_t *l = gate_layout();
    assert_int_equal(igrad_layout_component_count(l), 2 * 7 + 3);
    igrad_trace_t *t = gate_trace(l);
    igrad_profile_t *p = profile_of(t);
    assert_int_equal(igrad_profile_is_important(p, -1, IGRAD_KIND_EMB), 0);
    assert_int_equal(igrad_profile_is_important(p, 0, IGRAD_KIND_V), 1);
    /* embedding, head, the 5 norms deferred */
    assert_int_equal(check_plan(l, p), 1 + 1 + 5);
    igrad_profile_free(p);
    igrad_trace_free(t);
    igrad_layout_free(l);
}

/* A profile without EMB/HEAD/NORM rows (made before they were components):
 * the engine accepts it and sends them every step. One lacking a
 * projection is refused. */
static void test_profile_without_outer_rows(void **state)
{
    (void)state;
    igrad_layout_t *l = gate_layout();
    igrad_trace_t *t = gate_trace(l);
    char *text = NULL;
    size_t n = 0;
    assert_ok(igrad__trace_to_text(t, &text, &n));
    char *old = malloc(n + 1), *o = old;
    assert_non_null(old);
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) + 1 : strlen(line);
        int drop = 0;
        static const char *const kinds[] = {",EMB,", ",HEAD,", ",NORM,"};
        for (int k = 0; k < 3; k++) {
            char *hit = strstr(line, kinds[k]);
            if (hit && hit < line + len) drop = 1;
        }
        if (!drop) {
            memcpy(o, line, len);
            o += len;
        }
        line += len;
    }
    *o = '\0';
    igrad_trace_t *u = NULL;
    assert_ok(igrad__trace_from_text(old, strlen(old), "old.csv", &u));
    igrad_profile_t *p = profile_of(u);
    assert_int_equal(igrad_profile_count(p), 2 * 6);
    assert_int_equal(check_plan(l, p), 0);
    igrad_profile_free(p);
    igrad_trace_free(u);
    free(old);
    free(text);
    igrad_trace_free(t);
    igrad_layout_free(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_outer),
        cmocka_unit_test(test_profile_without_outer_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
