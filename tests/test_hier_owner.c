/*
 * test_hier_owner.c — the ownership rule of the two-level sync
 * (igrad__hier_ownership, engine_hier.c; docs/architecture.md §5.7b) on
 * seeded random layouts and L = 1..8, against what the rule states:
 * deterministic; components whole (their unsplit tensors on one rank);
 * only tensors of >= 2 dims and >= L rows split, into L pieces; the split
 * tensors the largest splittable ones, in order; the busiest rank within
 * 1.10 x total/L, or nothing left to split; where whole-unit LPT (written
 * here again) already meets the bound, no split and LPT's owners. Also the
 * row-range add of the shard layouts (igrad__layout_add_rows).
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
#include "model/layout_internal.h"
#include "test_util.h"

/* engine_hier.c (not in a header: tests only) */
igrad_status_t igrad__hier_ownership(const igrad_layout_t *layout, int L, int *owner,
                                     int *parts, int64_t *busiest);

/* A random model: a few layers of attention / MLP matrices and norms, an
 * embedding of random size (often dominant), sometimes a head and OTHER
 * tensors. */
static igrad_layout_t *random_layout(uint64_t seed)
{
    igrad_layout_t *L = NULL;
    assert_ok(igrad_layout_create(&L));
    uint64_t r = mix64(seed + 1);
    int64_t dim = 4 + (int64_t)(r % 29);
    int64_t vocab = 1 + (int64_t)(mix64(r) % 2000);
    int layers = 1 + (int)(mix64(r + 1) % 5);
    int64_t emb[2] = {vocab, dim}, vec[1] = {dim};
    assert_ok(igrad_layout_add(L, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb));
    char name[128];
    for (int l = 0; l < layers; l++) {
        uint64_t h = mix64(r + 17 * (uint64_t)l + 5);
        int64_t up[2] = {dim * (1 + (int64_t)(h % 4)), dim};
        int64_t sq[2] = {dim, dim};
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, sq));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.o_proj.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, sq));
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, up));
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 1, vec));
    }
    if (mix64(r + 2) % 2) {
        int64_t head[2] = {1 + (int64_t)(mix64(r + 3) % 3000), dim};
        assert_ok(igrad_layout_add(L, "lm_head.weight", IGRAD_DTYPE_F32, 2, head));
    }
    int other = (int)(mix64(r + 4) % 3);
    for (int k = 0; k < other; k++) {
        int64_t big[1] = {1 + (int64_t)(mix64(r + 9 + (uint64_t)k) % 5000)};
        snprintf(name, sizeof name, "extra_%d", k);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 1, big));
    }
    assert_ok(igrad_layout_add(L, "model.norm.weight", IGRAD_DTYPE_F32, 1, vec));
    return L;
}

typedef struct uw {
    int64_t w;
    size_t u;
} uw_t;

static int heavier(const void *a, const void *b)
{
    const uw_t *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return (x->u > y->u) - (x->u < y->u);
}

/* Whole-unit LPT as §5.7b states it: owners per tensor, the busiest load. */
static int64_t lpt(const igrad_layout_t *lay, int L, int *own)
{
    size_t T = igrad_layout_count(lay), U = igrad_layout_component_count(lay);
    size_t *unit = calloc(T, sizeof *unit);
    assert_non_null(unit);
    for (size_t t = 0, o = U; t < T; t++) {
        igrad_tensor_info_t ti;
        assert_ok(igrad_layout_tensor(lay, t, &ti));
        unit[t] = ti.component >= 0 ? (size_t)ti.component : o;
        if (ti.component < 0) o++;
    }
    for (size_t t = 0; t < T; t++) U = unit[t] + 1 > U ? unit[t] + 1 : U;
    uw_t *w = calloc(U, sizeof *w);
    int *uo = calloc(U, sizeof *uo);
    int64_t *load = calloc((size_t)L, sizeof *load);
    assert_true(w && uo && load);
    for (size_t u = 0; u < U; u++) w[u].u = u;
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        assert_ok(igrad_layout_tensor(lay, t, &ti));
        w[unit[t]].w += ti.count;
    }
    qsort(w, U, sizeof *w, heavier);
    for (size_t i = 0; i < U; i++) {
        int b = 0;
        for (int l = 1; l < L; l++) b = load[l] < load[b] ? l : b;
        uo[w[i].u] = b;
        load[b] += w[i].w;
    }
    int64_t top = 0;
    for (int l = 0; l < L; l++) top = load[l] > top ? load[l] : top;
    for (size_t t = 0; t < T; t++) own[t] = uo[unit[t]];
    free(unit);
    free(w);
    free(uo);
    free(load);
    return top;
}

static void test_rule_on_random_layouts(void **state)
{
    (void)state;
    int nsplit_cases = 0, nkept = 0;
    for (uint64_t seed = 0; seed < 300; seed++) {
        igrad_layout_t *lay = random_layout(seed);
        size_t T = igrad_layout_count(lay);
        size_t U = igrad_layout_component_count(lay);
        for (size_t t = 0; t < T; t++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(lay, t, &ti));
            U += ti.component < 0;
        }
        int64_t total = igrad_layout_total_count(lay);
        int *owner = calloc(T, sizeof *owner), *parts = calloc(T, sizeof *parts);
        int *owner2 = calloc(T, sizeof *owner2), *parts2 = calloc(T, sizeof *parts2);
        int *lown = calloc(T, sizeof *lown);
        int64_t *load = calloc(8, sizeof *load);
        assert_true(owner && parts && owner2 && parts2 && lown && load);
        for (int L = 1; L <= 8; L++) {
            int64_t busiest = -1, busiest2 = -2;
            if ((size_t)L > U) {
                assert_int_equal(igrad__hier_ownership(lay, L, owner, parts, &busiest),
                                 IGRAD_E_INVALID);
                continue;
            }
            assert_ok(igrad__hier_ownership(lay, L, owner, parts, &busiest));
            assert_ok(igrad__hier_ownership(lay, L, owner2, parts2, &busiest2));
            assert_memory_equal(owner, owner2, T * sizeof *owner); /* deterministic */
            assert_memory_equal(parts, parts2, T * sizeof *parts);
            assert_int_equal(busiest, busiest2);
            memset(load, 0, 8 * sizeof *load);
            int *comp_owner = calloc(igrad_layout_component_count(lay) + 1, sizeof *comp_owner);
            assert_non_null(comp_owner);
            for (size_t c = 0; c <= igrad_layout_component_count(lay); c++) comp_owner[c] = -1;
            int any_split = 0;
            for (size_t t = 0; t < T; t++) {
                igrad_tensor_info_t ti;
                assert_ok(igrad_layout_tensor(lay, t, &ti));
                if (parts[t] == 1) {
                    assert_true(owner[t] >= 0 && owner[t] < L);
                    load[owner[t]] += ti.count;
                    if (ti.component >= 0) { /* unsplit tensors of a component together */
                        if (comp_owner[ti.component] < 0) comp_owner[ti.component] = owner[t];
                        assert_int_equal(comp_owner[ti.component], owner[t]);
                    }
                    continue;
                }
                any_split = 1;
                assert_int_equal(parts[t], L);
                assert_int_equal(owner[t], -1);
                assert_true(ti.ndim >= 2 && ti.shape[0] >= L && L >= 2);
                int64_t R = ti.shape[0], row = ti.count / R, got = 0;
                for (int j = 0; j < L; j++) {
                    int64_t rows = (R * (j + 1)) / L - (R * j) / L;
                    assert_true(rows >= 1);
                    load[j] += rows * row;
                    got += rows;
                }
                assert_int_equal(got, R);
            }
            free(comp_owner);
            int64_t top = 0;
            for (int l = 0; l < L; l++) top = load[l] > top ? load[l] : top;
            assert_int_equal(top, busiest);
            int within = top * 10 * L <= total * 11;
            /* the split tensors: the largest splittable ones, in order */
            int64_t smallest_split = INT64_MAX, largest_kept = -1;
            size_t at_small = 0, at_large = 0;
            for (size_t t = 0; t < T; t++) {
                igrad_tensor_info_t ti;
                assert_ok(igrad_layout_tensor(lay, t, &ti));
                int splittable = ti.ndim >= 2 && ti.shape[0] >= L && L >= 2;
                if (!splittable) continue;
                if (parts[t] > 1 && ti.count <= smallest_split) {
                    if (ti.count < smallest_split || t > at_small) at_small = t;
                    smallest_split = ti.count;
                }
                if (parts[t] == 1 && (ti.count > largest_kept ||
                                      (ti.count == largest_kept && t < at_large))) {
                    largest_kept = ti.count;
                    at_large = t;
                }
            }
            if (any_split && largest_kept >= 0)
                assert_true(largest_kept < smallest_split ||
                            (largest_kept == smallest_split && at_large > at_small));
            if (!within) assert_int_equal(largest_kept, -1); /* nothing left to split */
            int64_t ltop = lpt(lay, L, lown);
            if (ltop * 10 * L <= total * 11) { /* balanced today: today's plan */
                assert_false(any_split);
                assert_memory_equal(owner, lown, T * sizeof *owner);
                nkept++;
            } else {
                assert_true(any_split || largest_kept == -1);
                nsplit_cases += any_split;
            }
        }
        free(owner);
        free(parts);
        free(owner2);
        free(parts2);
        free(lown);
        free(load);
        igrad_layout_free(lay);
    }
    /* the seeds exercise both branches */
    assert_true(nsplit_cases > 100);
    assert_true(nkept > 100);
}

/* Embedding and untied head of 900 x 24 (76 % of the entries together):
 * at L = 2 they balance whole (no split); at L = 4 and 8 both are split,
 * the busiest rank within 1 % of total/L. */
static void test_dominant_embedding(void **state)
{
    (void)state;
    igrad_layout_t *lay = llama_test_layout(3, 900, 24, 48, IGRAD_DTYPE_F32);
    size_t T = igrad_layout_count(lay);
    int64_t total = igrad_layout_total_count(lay);
    int *owner = calloc(T, sizeof *owner), *parts = calloc(T, sizeof *parts);
    assert_true(owner && parts);
    for (int L = 2; L <= 8; L *= 2) {
        int64_t busiest = 0;
        assert_ok(igrad__hier_ownership(lay, L, owner, parts, &busiest));
        int want = L == 2 ? 1 : L;
        assert_int_equal(parts[0], want);     /* model.embed_tokens.weight */
        assert_int_equal(parts[T - 1], want); /* lm_head.weight */
        assert_true((double)busiest <= 1.01 * (double)total / L);
    }
    free(owner);
    free(parts);
    igrad_layout_free(lay);
}

/* A row range: its shape and entries, its component counting what it is
 * told, its hash a tensor's of that shape (other row counts differ). */
static void test_layout_add_rows(void **state)
{
    (void)state;
    int64_t shape[2] = {10, 4};
    igrad_layout_t *a = NULL, *b = NULL, *c = NULL;
    assert_ok(igrad_layout_create(&a));
    assert_ok(igrad_layout_create(&b));
    assert_ok(igrad_layout_create(&c));
    assert_ok(igrad__layout_add_rows(a, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, shape,
                                     5, 5, 40));
    igrad_tensor_info_t ti;
    assert_ok(igrad_layout_tensor(a, 0, &ti));
    assert_int_equal(ti.shape[0], 5);
    assert_int_equal(ti.shape[1], 4);
    assert_int_equal(ti.count, 20);
    assert_int_equal(igrad_layout_total_count(a), 20);
    igrad_component_info_t ci;
    assert_ok(igrad_layout_component(a, 0, &ci));
    assert_int_equal(ci.count, 40);
    int64_t half[2] = {5, 4};
    assert_ok(igrad_layout_add(b, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, half));
    assert_true(igrad_layout_hash(a) == igrad_layout_hash(b));
    assert_ok(igrad__layout_add_rows(c, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, shape,
                                     0, 4, 40));
    assert_true(igrad_layout_hash(a) != igrad_layout_hash(c));
    assert_int_equal(igrad__layout_add_rows(c, "x", IGRAD_DTYPE_F32, 2, shape, 8, 3, 0),
                     IGRAD_E_INVALID);
    assert_int_equal(igrad__layout_add_rows(c, "x", IGRAD_DTYPE_F32, 2, shape, 0, 0, 0),
                     IGRAD_E_INVALID);
    igrad_layout_free(a);
    igrad_layout_free(b);
    igrad_layout_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule_on_random_layouts),
        cmocka_unit_test(test_dominant_embedding),
        cmocka_unit_test(test_layout_add_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
