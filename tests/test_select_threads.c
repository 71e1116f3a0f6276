/*
 * test_select_threads.c — one tensor split across OpenMP threads by
 * select.c, compared bit for bit with the one-thread result and with a
 * sort-based top-k (test_util.h's ref_topk).
 *
 * When a tensor is split (include/igrad.h, igrad_select_ef; the code path in
 * src/dp/cpu/select.c, par_threads): a pass over n >= 2^21 entries, outside
 * any parallel region, is cut into min(omp_get_max_threads(), n / 2^20, 64)
 * pieces. The pieces depend only on that count, not on how many threads the
 * runtime actually starts, so the cases below split on a one-core machine
 * too. What each case drives in pieces:
 *   flat topk (and adtopk's interleaved odd step, a flat selection of a
 *     2-D tensor): pass 1 (candidates per piece, joined in index order, the
 *     top k of the join) and pass 2 (the residual);
 *   adtopk row-wise, many per row (the candidate buffer per row): pass 2,
 *     pieces cut in the middle of rows;
 *   adtopk row-wise, a few per row (the few-per-row path): both passes,
 *     by rows;
 *   adtopk with rows longer than 2^21: pass 1 of each row in pieces.
 * The data are quantized, so the k-th value of every selection is tied
 * across piece boundaries and the lowest-index rule decides; sizes give
 * 2, 3 and 4 pieces. tests/test_select.c covers the selection itself
 * (sizes, distributions, recovery paths) and test_engine.c the engine's
 * thread count; this file only the split.
 *
 * Without OpenMP there is nothing to split: the test exits 77 (skipped).
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
#ifdef _OPENMP
#include <omp.h>
#endif

#include "igrad.h"
#include "dp/cpu/select_internal.h"
#include "test_util.h"

#define MI ((int64_t)1 << 20) /* entries per piece at least */
#define MAX_THREADS 4

/* Values on a grid of 1/32 from a bell-shaped sum of uniforms: a few
 * hundred entries share each value in the tail, where the k-th lies. */
static void fill_ties(float *x, int64_t n, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = mix64(seed ^ mix64((uint64_t)i));
        double s = 0.0;
        for (int j = 0; j < 4; j++) s += (double)((u >> (16 * j)) & 0xffff) / 65536.0;
        x[i] = (float)(nearbyint((s - 2.0) * 2.0 * 32.0) / 32.0);
    }
}

/* What one run returns: the selection and the new residual. */
typedef struct result {
    uint32_t *idx;
    float *val;
    float *e;
    double sumsq;
} result_t;

static result_t result_new(const igrad_select_spec_t *spec)
{
    result_t r = {malloc((size_t)spec->count * sizeof(uint32_t)),
                  malloc((size_t)spec->count * sizeof(float)),
                  malloc((size_t)spec->n * sizeof(float)), 0.0};
    assert_true(r.idx && r.val && r.e);
    return r;
}

static void result_free(result_t *r)
{
    free(r->idx);
    free(r->val);
    free(r->e);
}

static void expect_bits(const void *got, const void *want, size_t nbytes, size_t elem,
                        const char *what, int threads, int kernel)
{
    if (memcmp(got, want, nbytes) == 0) return;
    size_t i = 0;
    while (memcmp((const char *)got + i * elem, (const char *)want + i * elem, elem) == 0) i++;
    fail_msg("%s differs at %zu (%d threads, kernel %d)", what, i, threads, kernel);
}

/* The reference: per row (row-wise) or over the whole tensor, the top k of
 * |g + e0| by sorting, their values, and the residual with them zeroed. */
static result_t reference(const float *g, const float *e0, const igrad_select_spec_t *spec)
{
    result_t r = result_new(spec);
    int64_t rows = spec->row_wise ? spec->rows : 1, len = spec->n / rows;
    int64_t per = spec->row_wise ? spec->per_row : spec->count;
    for (int64_t i = 0; i < spec->n; i++) r.e[i] = g[i] + e0[i];
    for (int64_t row = 0; row < rows; row++) {
        uint32_t *idx = r.idx + row * per;
        ref_topk(r.e + row * len, len, per, idx);
        for (int64_t j = 0; j < per; j++) {
            float *a = &r.e[row * len + idx[j]];
            r.val[row * per + j] = *a;
            r.sumsq += (double)*a * *a;
            *a = 0.0f;
        }
    }
    return r;
}

/* Pieces select.c cuts a pass over n entries into at `threads`. */
static int pieces(int64_t n, int threads)
{
    if (n < 2 * MI) return 1;
    return n / MI < threads ? (int)(n / MI) : threads;
}

/* Runs the selection at 1..MAX_THREADS threads with both pass-1 kernels and
 * compares each run with the one-thread run and the reference, bit for bit;
 * `most` is the number of pieces the largest pass must reach. */
static void check_split(const float *g, const float *e0, const igrad_select_spec_t *spec,
                        int most)
{
    result_t want = reference(g, e0, spec), first = result_new(spec), got = result_new(spec);
    igrad_select_ws_t *ws = NULL;
    assert_ok(igrad_select_ws_create(&ws));
    int reached = 1;
    for (int threads = 1; threads <= MAX_THREADS; threads++) {
#ifdef _OPENMP
        omp_set_num_threads(threads);
        assert_int_equal(omp_get_max_threads(), threads); /* what par_threads reads */
        assert_int_equal(omp_get_level(), 0);
#endif
        int p = pieces(spec->n, threads);
        reached = p > reached ? p : reached;
        for (int kernel = 0; kernel < 2; kernel++) {
            igrad__select_ws_kernel(ws, kernel ? IGRAD__SELECT_KERNEL_GENERIC
                                               : IGRAD__SELECT_KERNEL_AUTO);
            memcpy(got.e, e0, (size_t)spec->n * sizeof(float));
            memset(got.idx, 0xff, (size_t)spec->count * 4); /* nothing left from a run before */
            memset(got.val, 0xff, (size_t)spec->count * 4);
            igrad_selection_t sel = {.index = got.idx, .value = got.val};
            assert_ok(igrad_select_ef(g, got.e, spec, "big", ws, &sel));
            assert_int_equal(sel.count, spec->count);
            got.sumsq = sel.sumsq;
            const result_t *cmp[2] = {&want, &first};
            const char *name[2] = {"reference", "1 thread"};
            for (int c = threads == 1 && kernel == 0 ? 0 : 1; c >= 0; c--) {
                char what[64];
                snprintf(what, sizeof what, "index vs %s", name[c]);
                expect_bits(got.idx, cmp[c]->idx, (size_t)spec->count * 4, 4, what, threads,
                            kernel);
                snprintf(what, sizeof what, "value vs %s", name[c]);
                expect_bits(got.val, cmp[c]->val, (size_t)spec->count * 4, 4, what, threads,
                            kernel);
                snprintf(what, sizeof what, "residual vs %s", name[c]);
                expect_bits(got.e, cmp[c]->e, (size_t)spec->n * 4, 4, what, threads, kernel);
                if (c == 1) /* the same sum in the same order */
                    expect_bits(&got.sumsq, &first.sumsq, sizeof(double), sizeof(double),
                                "sumsq vs 1 thread", threads, kernel);
            }
            if (threads == 1 && kernel == 0) {
                memcpy(first.idx, got.idx, (size_t)spec->count * 4);
                memcpy(first.val, got.val, (size_t)spec->count * 4);
                memcpy(first.e, got.e, (size_t)spec->n * 4);
                first.sumsq = got.sumsq;
                assert_near(first.sumsq, want.sumsq, 1e-9 * want.sumsq);
            }
        }
    }
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    assert_int_equal(reached, most);
    igrad_select_ws_free(ws);
    result_free(&want);
    result_free(&first);
    result_free(&got);
}

static igrad_select_spec_t spec_for(igrad_sparsifier_t sp, double density, int interleave,
                                    int64_t step, int ndim, const int64_t *shape)
{
    igrad_select_spec_t s;
    assert_ok(igrad_select_spec(sp, density, 1.0, interleave, step, ndim, shape, &s));
    return s;
}

/* (g, e0) of rows x len entries, both tied on the 1/32 grid; in each row
 * the two entries either side of every cut into 2..MAX_THREADS pieces
 * (select.c's cuts: at n*p/T rounded down to a multiple of 64) get |a| = 8,
 * above everything else, so a piece that stops one entry short or starts one
 * late loses a kept entry. */
static void data(int64_t rows, int64_t len, uint64_t seed, float **g, float **e0)
{
    int64_t n = rows * len;
    *g = malloc((size_t)n * sizeof **g);
    *e0 = malloc((size_t)n * sizeof **e0);
    assert_true(*g && *e0);
    fill_ties(*g, n, seed);
    fill_ties(*e0, n, seed + 1);
    for (int64_t r = 0; r < rows; r++)
        for (int T = 2; T <= MAX_THREADS; T++)
            for (int p = 1; p < T; p++) {
                int64_t cut = r * len + ((len * p / T) & ~(int64_t)63);
                (*g)[cut - 1] = (*g)[cut] = p % 2 ? 8.0f : -8.0f;
                (*e0)[cut - 1] = (*e0)[cut] = 0.0f;
            }
}

/* Flat top-k at 2, 3 and 4 pieces; and just below the split (one piece). */
static void test_flat_topk(void **state)
{
    (void)state;
    static const int64_t sizes[] = {2 * MI - 1, 2 * MI, 3 * MI + 37, 4 * MI + 1001};
    static const int most[] = {1, 2, 3, 4};
    for (int s = 0; s < 4; s++) {
        int64_t n = sizes[s];
        float *g, *e0;
        data(1, n, 100 + (uint64_t)s, &g, &e0);
        igrad_select_spec_t spec = spec_for(IGRAD_SPARSIFIER_TOPK, 0.001, 0, 0, 1, &n);
        assert_int_equal(spec.row_wise, 0);
        check_split(g, e0, &spec, most[s]);
        free(g);
        free(e0);
    }
}

/* adtopk: row-wise with many per row (pass 2 cut mid-row), with a few per
 * row (both passes by rows), with rows longer than 2^21 (pass 1 of a row in
 * pieces), and the interleaved odd step (flat over a 2-D tensor). */
static void test_adtopk(void **state)
{
    (void)state;
    float *g, *e0;
    const int64_t many[2] = {1500, 2099}; /* 3,148,500 entries */
    data(1, many[0] * many[1], 200, &g, &e0);
    igrad_select_spec_t rs = spec_for(IGRAD_SPARSIFIER_ADTOPK, 0.05, 0, 0, 2, many);
    assert_true(rs.row_wise && rs.per_row == 105);
    check_split(g, e0, &rs, 3);
    igrad_select_spec_t odd = spec_for(IGRAD_SPARSIFIER_ADTOPK, 0.001, 1, 1, 2, many);
    assert_true(!odd.row_wise && odd.count == 1500 * 3);
    check_split(g, e0, &odd, 3);
    free(g);
    free(e0);

    const int64_t few[2] = {4099, 1031}; /* 4,226,069 entries */
    data(1, few[0] * few[1], 300, &g, &e0);
    igrad_select_spec_t fs = spec_for(IGRAD_SPARSIFIER_ADTOPK, 0.004, 0, 0, 2, few);
    assert_true(fs.row_wise && fs.per_row == 5);
    check_split(g, e0, &fs, 4);
    free(g);
    free(e0);

    const int64_t longrows[2] = {2, 2 * MI + 333};
    data(longrows[0], longrows[1], 400, &g, &e0);
    igrad_select_spec_t ls = spec_for(IGRAD_SPARSIFIER_ADTOPK, 0.001, 0, 0, 2, longrows);
    assert_true(ls.row_wise && ls.per_row == 2098);
    check_split(g, e0, &ls, 4);
    free(g);
    free(e0);
}

/* A NaN in the third piece and an Inf in the second of a flat selection:
 * every thread count names the Inf (the first), and the residual stays. */
static void test_nonfinite_pieces(void **state)
{
    (void)state;
    int64_t n = 3 * MI + 37;
    float *g, *e0;
    data(1, n, 500, &g, &e0);
    g[n - 3] = NAN;
    e0[MI + MI / 2] = INFINITY;
    igrad_select_spec_t spec = spec_for(IGRAD_SPARSIFIER_TOPK, 0.001, 0, 0, 1, &n);
    float *e = malloc((size_t)n * sizeof *e), *val = malloc((size_t)spec.count * sizeof *val);
    uint32_t *idx = malloc((size_t)spec.count * sizeof *idx);
    assert_true(e && val && idx);
    igrad_select_ws_t *ws = NULL;
    assert_ok(igrad_select_ws_create(&ws));
    char where[64];
    snprintf(where, sizeof where, "index %lld", (long long)(MI + MI / 2));
    for (int threads = 1; threads <= MAX_THREADS; threads++) {
#ifdef _OPENMP
        omp_set_num_threads(threads);
#endif
        memcpy(e, e0, (size_t)n * sizeof *e);
        igrad_selection_t sel = {.index = idx, .value = val};
        assert_status(igrad_select_ef(g, e, &spec, "big", ws, &sel), IGRAD_E_NONFINITE);
        assert_error_has(where);
        assert_int_equal(memcmp(e, e0, (size_t)n * sizeof *e), 0);
        assert_status(igrad_residual_accumulate(g, e, n, "big"), IGRAD_E_NONFINITE);
        assert_error_has(where);
        assert_int_equal(memcmp(e, e0, (size_t)n * sizeof *e), 0);
    }
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    igrad_select_ws_free(ws);
    free(e);
    free(val);
    free(idx);
    free(g);
    free(e0);
}

int main(void)
{
#ifndef _OPENMP
    printf("skipped: built without OpenMP, so select.c never splits a tensor\n");
    return 77;
#else
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flat_topk),
        cmocka_unit_test(test_adtopk),
        cmocka_unit_test(test_nonfinite_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
