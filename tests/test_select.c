/*
 * test_select.c — fused error feedback + selection (src/select.c) against
 * an independent reference: a stable sort of all entries by |a| descending,
 * index ascending, whose first k are the kept set. Covers budgets and specs
 * (valid and invalid), topk on many sizes and distributions (ties, all
 * equal, negatives, heavy tails, k = 1, k = n, n = 1), adtopk per row
 * through both row-wise paths (the candidate buffer and the few-per-row
 * list, forced through the workspace) on rows of every length around the
 * block sizes, interleave, none, the recovery paths forced through the
 * workspace policy, both pass-1 kernels (AVX2 and portable C), NaN/Inf
 * handling (residual bit-identical), conservation over 200 steps of sends
 * and deferrals, determinism, and OpenMP thread counts on large tensors.
 * Every reference check also runs the engine's two halves (find, apply:
 * the sum of a^2 and, with 16-bit values, the rounding in pass 2).
 * No timings here (see `igrad bench select`).
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

/* ------------------------------------------------------------------------ */
/* Data                                                                     */
/* ------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) /* (0, 1) */
{
    return ((double)(rng_next(s) >> 11) + 0.5) * 0x1.0p-53;
}

static float rng_normal(uint64_t *s)
{
    double r = sqrt(-2.0 * log(rng_unit(s)));
    return (float)(r * cos(6.283185307179586 * rng_unit(s)));
}

typedef enum dist {
    DIST_NORMAL,  /* standard normal */
    DIST_TIES,    /* {-2,-1,0,1,2} / 2: mostly ties */
    DIST_EQUAL,   /* every entry 1.5 */
    DIST_ZERO,    /* every entry 0 (with -0 too) */
    DIST_NEG,     /* -|normal| */
    DIST_CAUCHY,  /* heavy tails */
    DIST_ROWSCALE /* normal times 10^(row % 7 - 3) with rows of 97 */
} dist_t;

static void fill(float *x, int64_t n, dist_t d, uint64_t seed)
{
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        switch (d) {
        case DIST_NORMAL: x[i] = rng_normal(&s); break;
        case DIST_TIES: x[i] = (float)((int)(rng_next(&s) % 5) - 2) * 0.5f; break;
        case DIST_EQUAL: x[i] = 1.5f; break;
        case DIST_ZERO: x[i] = (i % 3 == 0) ? -0.0f : 0.0f; break;
        case DIST_NEG: x[i] = -fabsf(rng_normal(&s)); break;
        case DIST_CAUCHY: x[i] = (float)tan(3.141592653589793 * (rng_unit(&s) - 0.5)); break;
        case DIST_ROWSCALE: x[i] = rng_normal(&s) * powf(10.0f, (float)((i / 97) % 7 - 3)); break;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Reference                                                                */
/* ------------------------------------------------------------------------ */

static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static uint64_t bits64(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static void expect_same_floats(const float *got, const float *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        if (bits(got[i]) != bits(want[i])) {
            print_error("%s[%lld]: got %.9g, want %.9g\n", what, (long long)i, (double)got[i],
                        (double)want[i]);
            assert_int_equal(bits(got[i]), bits(want[i]));
        }
    }
}

static void expect_same_u32(const uint32_t *got, const uint32_t *want, int64_t n,
                            const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        if (got[i] != want[i]) print_error("%s[%lld] differs\n", what, (long long)i);
        assert_int_equal(got[i], want[i]);
    }
}

/* One value as the 16-bit wire sends it, through the public converter:
 * round to nearest even, and a finite value that would become Inf clamped
 * to the largest finite one (architecture.md §5.2). */
static float ref_round16(igrad_dtype_t dt, float v)
{
    uint16_t h;
    float q;
    assert_int_equal(igrad_convert(&v, IGRAD_DTYPE_F32, &h, dt, 1), IGRAD_OK);
    assert_int_equal(igrad_convert(&h, dt, &q, IGRAD_DTYPE_F32, 1), IGRAD_OK);
    if (isinf(q)) q = v > 0 ? (dt == IGRAD_DTYPE_F16 ? 65504.0f : 0x1.fep127f)
                            : (dt == IGRAD_DTYPE_F16 ? -65504.0f : -0x1.fep127f);
    return q;
}

/* The engine's two halves of a selection (find, then apply) on (g, e0):
 * the same selection and residual as the one-call reference want_*, a^2
 * summed by find within 1e-12 of the double sum, and with 16-bit values
 * (dt BF16 / F16) the sent values rounded, their rounding errors in the
 * residual and the sum of their squares, against want_* rounded here.
 * @return find's sum of a^2 (every kernel must give the same bits). */
static double check_halves(const float *g, const float *e0, const igrad_select_spec_t *spec,
                         igrad_select_ws_t *ws, igrad_dtype_t dt, const uint32_t *want_idx,
                         const float *want_val, const float *want_e, double want_sumsq)
{
    int64_t n = spec->n, k = spec->count;
    int64_t rows = spec->row_wise ? spec->rows : 1;
    int64_t len = spec->row_wise ? spec->cols : n, per = spec->row_wise ? spec->per_row : k;
    float *e = malloc((size_t)n * sizeof *e), *gz = malloc((size_t)n * sizeof *gz);
    float *val = malloc((size_t)k * sizeof *val), *rval = malloc((size_t)k * sizeof *rval);
    float *re = malloc((size_t)n * sizeof *re);
    uint32_t *idx = malloc((size_t)k * sizeof *idx);
    int32_t *bound = malloc((size_t)rows * sizeof *bound);
    assert_true(e && gz && val && rval && re && idx && bound);
    memcpy(e, e0, (size_t)n * sizeof *e);
    memcpy(gz, g, (size_t)n * sizeof *gz);
    memcpy(re, want_e, (size_t)n * sizeof *re);
    memcpy(rval, want_val, (size_t)k * sizeof *rval);
    double want_rsum = 0.0, want_a2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double a = (double)(g[i] + e0[i]);
        want_a2 += a * a;
    }
    if (dt != IGRAD_DTYPE_F32)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < per; j++) {
                int64_t q = r * per + j, flat = r * len + (k == n ? j : want_idx[q]);
                float v = want_val[q], h = ref_round16(dt, v), d = v - h;
                rval[q] = h;
                re[flat] += d;
                want_rsum += (double)d * (double)d;
            }
    igrad_selection_t sel = {.index = idx, .value = val};
    double a2 = -1.0, rsum = -1.0;
    igrad_status_t st = igrad__select_find(g, e, spec, "t", ws, &sel, bound, &a2);
    if (st != IGRAD_OK) print_error("%s\n", igrad_last_error());
    assert_int_equal(st, IGRAD_OK);
    expect_same_floats(e, e0, n, "residual after find"); /* find writes nothing */
    igrad__select_apply(gz, e, spec, ws, &sel, bound, 1, dt, &rsum);
    if (k < n) expect_same_u32(idx, want_idx, k, "index (halves)");
    expect_same_floats(val, rval, k, "value (halves)");
    expect_same_floats(e, re, n, "residual (halves)");
    for (int64_t i = 0; i < n; i++) assert_true(gz[i] == 0.0f); /* zero_grad */
    assert_float_equal(sel.sumsq, want_sumsq, 1e-9 * (want_sumsq + 1e-30));
    assert_float_equal(a2, want_a2, 1e-12 * want_a2);
    if (dt != IGRAD_DTYPE_F32 && rsum != want_rsum)
        print_error("rounded sumsq %.17g, want %.17g\n", rsum, want_rsum);
    assert_true(dt == IGRAD_DTYPE_F32 || rsum == want_rsum);
    free(e);
    free(gz);
    free(val);
    free(rval);
    free(re);
    free(idx);
    free(bound);
    return a2;
}

/* Row-wise paths, AUTO first (the one the library takes). */
static const int row_modes[3] = {IGRAD__SELECT_ROWS_AUTO, IGRAD__SELECT_ROWS_FEW,
                                 IGRAD__SELECT_ROWS_GENERAL};

/* Runs igrad_select_ef on (g, e0) under `spec` and checks the selection,
 * the values, sumsq and the new residual against the sort reference. */
static void check_against_reference(const float *g, const float *e0,
                                    const igrad_select_spec_t *spec, igrad_select_ws_t *ws)
{
    int64_t n = spec->n, k = spec->count;
    float *a = malloc((size_t)n * sizeof *a), *e = malloc((size_t)n * sizeof *e);
    float *want_e = malloc((size_t)n * sizeof *want_e), *val = malloc((size_t)k * sizeof *val);
    uint32_t *idx = malloc((size_t)k * sizeof *idx), *want = malloc((size_t)k * sizeof *want);
    assert_true(a && e && want_e && val && idx && want);
    for (int64_t i = 0; i < n; i++) a[i] = g[i] + e0[i];
    memcpy(e, e0, (size_t)n * sizeof *e);

    /* reference: per row (row-wise) or over the whole tensor */
    int64_t rows = spec->row_wise ? spec->rows : 1;
    int64_t len = spec->row_wise ? spec->cols : n;
    int64_t per = spec->row_wise ? spec->per_row : k;
    memcpy(want_e, a, (size_t)n * sizeof *a);
    for (int64_t r = 0; r < rows; r++) {
        ref_topk(a + r * len, len, per, want + r * per);
        for (int64_t j = 0; j < per; j++) want_e[r * len + want[r * per + j]] = 0.0f;
    }
    double want_sumsq = 0.0;
    float *want_val = malloc((size_t)k * sizeof *want_val);
    assert_non_null(want_val);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < per; j++) {
            want_val[r * per + j] = a[r * len + want[r * per + j]];
            want_sumsq += (double)want_val[r * per + j] * want_val[r * per + j];
        }

    /* both pass-1 kernels (AVX2 where the CPU has it, and portable C), and
     * for rows that keep a few entries each row-wise path */
    int modes = spec->row_wise && spec->per_row <= 16 ? 3 : 1;
    double a2_auto = 0.0; /* find's sum of a^2 with the AUTO kernel, this row path */
    for (int run = 0; run < 2 * modes; run++) {
        int kernel = run % 2;
        igrad__select_ws_kernel(ws, kernel ? IGRAD__SELECT_KERNEL_GENERIC
                                           : IGRAD__SELECT_KERNEL_AUTO);
        igrad__select_ws_rows(ws, row_modes[run / 2]);
        memcpy(e, e0, (size_t)n * sizeof *e);
        igrad_selection_t sel = {.index = idx, .value = val};
        igrad_status_t st = igrad_select_ef(g, e, spec, "t", ws, &sel);
        if (st != IGRAD_OK) print_error("%s\n", igrad_last_error());
        assert_int_equal(st, IGRAD_OK);
        assert_int_equal(sel.count, k);
        assert_int_equal(sel.row_wise, spec->row_wise);
        if (memcmp(idx, want, (size_t)k * sizeof *idx) != 0 ||
            memcmp(val, want_val, (size_t)k * sizeof *val) != 0 ||
            memcmp(e, want_e, (size_t)n * sizeof *e) != 0)
            print_error("%lld x %lld, per_row %lld, kernel %d, row path %d:\n",
                        (long long)rows, (long long)len, (long long)per, kernel,
                        row_modes[run / 2]);
        expect_same_u32(idx, want, k, "index");
        expect_same_floats(val, want_val, k, "value");
        expect_same_floats(e, want_e, n, "residual");
        assert_float_equal(sel.sumsq, want_sumsq, 1e-9 * (want_sumsq + 1e-30));
        double a2 = check_halves(g, e0, spec, ws, IGRAD_DTYPE_F32, want, want_val, want_e,
                                 want_sumsq);
        if (kernel == 1 && bits64(a2) != bits64(a2_auto))
            print_error("sum of a^2: portable %a, AVX2/auto %a\n", a2, a2_auto);
        if (kernel == 1) assert_true(bits64(a2) == bits64(a2_auto));
        a2_auto = a2;
        if (kernel == 0) {
            check_halves(g, e0, spec, ws, IGRAD_DTYPE_BF16, want, want_val, want_e, want_sumsq);
            check_halves(g, e0, spec, ws, IGRAD_DTYPE_F16, want, want_val, want_e, want_sumsq);
        }
    }
    igrad__select_ws_kernel(ws, IGRAD__SELECT_KERNEL_AUTO);
    igrad__select_ws_rows(ws, IGRAD__SELECT_ROWS_AUTO);
    free(a);
    free(e);
    free(want_e);
    free(val);
    free(idx);
    free(want);
    free(want_val);
}

static const int policies[] = {IGRAD__SELECT_NORMAL, IGRAD__SELECT_FORCE_HIGH,
                               IGRAD__SELECT_FORCE_LOW};

/* Flat topk of n entries at `density` under every policy. */
static void check_topk(int64_t n, double density, dist_t dg, dist_t de, uint64_t seed,
                       int all_policies)
{
    float *g = malloc((size_t)n * sizeof *g), *e0 = malloc((size_t)n * sizeof *e0);
    assert_true(g && e0);
    fill(g, n, dg, seed);
    fill(e0, n, de, seed + 1);
    if (de == DIST_NORMAL) /* a residual smaller than the gradient */
        for (int64_t i = 0; i < n; i++) e0[i] *= 0.25f;
    int64_t shape[1] = {n};
    igrad_select_spec_t spec;
    assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_TOPK, density, 1.0, 0, 0, 1, shape,
                                       &spec), IGRAD_OK);
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    int np = all_policies ? 3 : 1;
    for (int p = 0; p < np; p++) {
        igrad__select_ws_force(ws, policies[p]);
        check_against_reference(g, e0, &spec, ws);
    }
    igrad_select_ws_free(ws);
    free(g);
    free(e0);
}

/* ------------------------------------------------------------------------ */
/* Budgets, names, specs                                                    */
/* ------------------------------------------------------------------------ */

static void test_budget(void **state)
{
    (void)state;
    assert_int_equal(igrad_budget(0, 0.5), 0);
    assert_int_equal(igrad_budget(-3, 0.5), 0);
    assert_int_equal(igrad_budget(1, 1e-9), 1);
    assert_int_equal(igrad_budget(100, 0.01), 1);
    assert_int_equal(igrad_budget(101, 0.01), 2);
    assert_int_equal(igrad_budget(16777216, 0.01), 167773);
    assert_int_equal(igrad_budget(10, 1.0), 10);
    assert_int_equal(igrad_budget(4096, 0.01), 41);
    /* matches ceil(density * n) evaluated in double */
    for (int64_t n = 1; n < 3000; n += 7) {
        double d = 0.003 * (double)(n % 13 + 1);
        int64_t want = (int64_t)ceil(d * (double)n);
        if (want < 1) want = 1;
        if (want > n) want = n;
        assert_int_equal(igrad_budget(n, d), want);
    }
}

static void test_names(void **state)
{
    (void)state;
    igrad_sparsifier_t sp;
    const igrad_sparsifier_t all[] = {IGRAD_SPARSIFIER_NONE, IGRAD_SPARSIFIER_TOPK,
                                      IGRAD_SPARSIFIER_ADTOPK};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(igrad_sparsifier_from_name(igrad_sparsifier_name(all[i]), &sp),
                         IGRAD_OK);
        assert_int_equal(sp, all[i]);
    }
    assert_string_equal(igrad_sparsifier_name(IGRAD_SPARSIFIER_ADTOPK), "adtopk");
    assert_int_equal(igrad_sparsifier_from_name("TopK", &sp), IGRAD_OK);
    assert_int_equal(sp, IGRAD_SPARSIFIER_TOPK);
    assert_int_equal(igrad_sparsifier_from_name("top", &sp), IGRAD_E_INVALID);
    assert_non_null(strstr(igrad_last_error(), "top"));
    assert_int_equal(igrad_sparsifier_from_name("topkk", &sp), IGRAD_E_INVALID);
    assert_int_equal(igrad_sparsifier_from_name(NULL, &sp), IGRAD_E_INVALID);
    assert_int_equal(igrad_sparsifier_from_name("none", NULL), IGRAD_E_INVALID);
}

static igrad_select_spec_t spec_of(igrad_sparsifier_t sp, double density, double scale,
                                   int interleave, int64_t step, int ndim,
                                   const int64_t *shape)
{
    igrad_select_spec_t s;
    igrad_status_t st = igrad_select_spec(sp, density, scale, interleave, step, ndim, shape, &s);
    if (st != IGRAD_OK) print_error("%s\n", igrad_last_error());
    assert_int_equal(st, IGRAD_OK);
    return s;
}

static void test_spec(void **state)
{
    (void)state;
    const int64_t v1000[1] = {1000}, m8x300[2] = {8, 300}, m8x100[2] = {8, 100};
    const int64_t t3[3] = {4, 5, 6}, m5x4[2] = {5, 4};
    igrad_select_spec_t s = spec_of(IGRAD_SPARSIFIER_TOPK, 0.01, 1.0, 0, 0, 1, v1000);
    assert_int_equal(s.row_wise, 0);
    assert_int_equal(s.count, 10);
    assert_int_equal(s.n, 1000);
    s = spec_of(IGRAD_SPARSIFIER_TOPK, 0.01, 2.5, 0, 0, 1, v1000);
    assert_int_equal(s.count, 25);
    s = spec_of(IGRAD_SPARSIFIER_TOPK, 0.5, 3.0, 0, 0, 1, v1000); /* capped at n */
    assert_int_equal(s.count, 1000);
    s = spec_of(IGRAD_SPARSIFIER_TOPK, 0.01, 0.1, 0, 0, 1, v1000); /* at least 1 */
    assert_int_equal(s.count, 1);
    s = spec_of(IGRAD_SPARSIFIER_TOPK, 0.01, 1.0, 0, 0, 2, m8x300); /* flat on 2-D */
    assert_int_equal(s.row_wise, 0);
    assert_int_equal(s.count, 24);

    s = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 0, 0, 2, m8x300);
    assert_int_equal(s.row_wise, 1);
    assert_int_equal(s.rows, 8);
    assert_int_equal(s.cols, 300);
    assert_int_equal(s.per_row, 3);
    assert_int_equal(s.count, 24);
    s = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 0, 0, 2, m8x100); /* max(1, ...) */
    assert_int_equal(s.per_row, 1);
    assert_int_equal(s.count, 8);
    s = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.01, 2.5, 0, 0, 2, m8x300);
    assert_int_equal(s.per_row, 8); /* ceil(2.5 * 3) */
    s = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.3, 10.0, 0, 0, 2, m5x4); /* capped at cols */
    assert_int_equal(s.per_row, 4);
    assert_int_equal(s.count, 20);
    s = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.1, 1.0, 0, 0, 3, t3); /* rows 4, cols 30 */
    assert_int_equal(s.row_wise, 1);
    assert_int_equal(s.rows, 4);
    assert_int_equal(s.cols, 30);
    assert_int_equal(s.per_row, 3);
    s = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 0, 0, 1, v1000); /* 1-D: topk */
    assert_int_equal(s.row_wise, 0);
    assert_int_equal(s.count, 10);

    /* interleave: even steps row-wise, odd steps the same count flat */
    for (int64_t step = 0; step < 6; step++) {
        s = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 1, step, 2, m8x300);
        assert_int_equal(s.row_wise, step % 2 == 0);
        assert_int_equal(s.count, 24);
        assert_int_equal(s.n, 2400);
        if (!s.row_wise) assert_int_equal(s.per_row, 24);
        s = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 0, step, 2, m8x300);
        assert_int_equal(s.row_wise, 1);
    }

    s = spec_of(IGRAD_SPARSIFIER_NONE, 0.01, 1.0, 0, 0, 2, m8x300);
    assert_int_equal(s.count, 2400);
    assert_int_equal(s.row_wise, 0);
    s = spec_of(IGRAD_SPARSIFIER_TOPK, 0.01, 1.0, 0, 0, 0, NULL); /* scalar */
    assert_int_equal(s.n, 1);
    assert_int_equal(s.count, 1);
}

static void test_spec_invalid(void **state)
{
    (void)state;
    const int64_t v10[1] = {10}, zero[2] = {4, 0}, neg[2] = {-1, 4};
    const int64_t huge[2] = {(int64_t)1 << 31, 3}, over[2] = {INT64_MAX / 2, 3};
    igrad_select_spec_t s;
    const double bad_density[] = {0.0, -0.1, 1.5, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_density / sizeof bad_density[0]; i++) {
        assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_TOPK, bad_density[i], 1.0, 0, 0, 1,
                                           v10, &s), IGRAD_E_INVALID);
        assert_non_null(strstr(igrad_last_error(), "density"));
    }
    const double bad_scale[] = {0.0, -1.0, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_scale / sizeof bad_scale[0]; i++)
        assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_ADTOPK, 0.01, bad_scale[i], 0, 0,
                                           1, v10, &s), IGRAD_E_INVALID);
    assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_TOPK, 0.01, 1.0, 0, 0, -1, v10, &s),
                     IGRAD_E_INVALID);
    assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_TOPK, 0.01, 1.0, 0, 0, 5, v10, &s),
                     IGRAD_E_INVALID);
    assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_TOPK, 0.01, 1.0, 0, 0, 1, NULL, &s),
                     IGRAD_E_INVALID);
    assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_TOPK, 0.01, 1.0, 0, 0, 2, zero, &s),
                     IGRAD_E_INVALID);
    assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 0, 0, 2, neg, &s),
                     IGRAD_E_INVALID);
    assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_TOPK, 0.01, 1.0, 0, 0, 2, huge, &s),
                     IGRAD_E_INVALID); /* more than 32-bit indices address */
    assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_TOPK, 0.01, 1.0, 0, 0, 2, over, &s),
                     IGRAD_E_INVALID);
    assert_int_equal(igrad_select_spec((igrad_sparsifier_t)7, 0.01, 1.0, 0, 0, 1, v10, &s),
                     IGRAD_E_INVALID);
    assert_int_equal(igrad_select_spec(IGRAD_SPARSIFIER_TOPK, 0.01, 1.0, 0, 0, 1, v10, NULL),
                     IGRAD_E_INVALID);
}

/* ------------------------------------------------------------------------ */
/* topk                                                                     */
/* ------------------------------------------------------------------------ */

static void test_topk_sizes(void **state)
{
    (void)state;
    /* both sides of the block size, the take-everything size, the buffered
     * limit (65536) and a range long enough for the sampled stream path */
    const int64_t sizes[] = {1, 2, 7, 15, 16, 17, 100, 255, 256, 257, 1000, 4097,
                             65536, 65537, 300001};
    const double densities[] = {0.001, 0.01, 0.1, 0.5, 1.0};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t d = 0; d < sizeof densities / sizeof densities[0]; d++)
            check_topk(sizes[i], densities[d], DIST_NORMAL, DIST_NORMAL, 100 + i * 7 + d,
                       sizes[i] <= 70000);
}

static void test_topk_ties(void **state)
{
    (void)state;
    const int64_t sizes[] = {50, 5000, 100000};
    const double densities[] = {0.001, 0.01, 0.2, 0.45};
    for (size_t i = 0; i < 3; i++)
        for (size_t d = 0; d < 4; d++) {
            check_topk(sizes[i], densities[d], DIST_TIES, DIST_ZERO, 7 + d, 1);
            check_topk(sizes[i], densities[d], DIST_TIES, DIST_TIES, 9 + d, 1);
        }
}

static void test_topk_tie_boundaries(void **state)
{
    (void)state;
    /* c1 entries of 2, c2 of -1, the rest 0.5, shuffled: k on both sides of
     * each group's edge, where an off-by-one in the k-th value shows */
    const int64_t sizes[2] = {30000, 120000};
    for (int si = 0; si < 2; si++) {
        int64_t n = sizes[si], c1 = n / 10 + 3, c2 = n / 5 + 1;
        float *g = malloc((size_t)n * sizeof *g), *e0 = calloc((size_t)n, sizeof *e0);
        assert_true(g && e0);
        for (int64_t i = 0; i < n; i++) g[i] = i < c1 ? 2.0f : i < c1 + c2 ? -1.0f : 0.5f;
        uint64_t s = 99;
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)(rng_next(&s) % (uint64_t)(i + 1));
            float t = g[i];
            g[i] = g[j];
            g[j] = t;
        }
        const int64_t ks[] = {1, c1 - 1, c1, c1 + 1, c1 + c2 - 1, c1 + c2, c1 + c2 + 1, n - 1};
        igrad_select_ws_t *ws = NULL;
        assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            igrad_select_spec_t spec = {.row_wise = 0, .rows = 1, .cols = n,
                                        .per_row = ks[ki], .count = ks[ki], .n = n};
            for (int p = 0; p < 3; p++) {
                igrad__select_ws_force(ws, policies[p]);
                check_against_reference(g, e0, &spec, ws);
            }
        }
        igrad_select_ws_free(ws);
        free(g);
        free(e0);
    }
}

static void test_topk_all_equal(void **state)
{
    (void)state;
    /* every entry ties: the lowest indices win */
    const int64_t sizes[] = {1, 33, 5000, 200000};
    for (size_t i = 0; i < 4; i++) {
        check_topk(sizes[i], 0.01, DIST_EQUAL, DIST_ZERO, 1, 1);
        check_topk(sizes[i], 0.3, DIST_ZERO, DIST_ZERO, 1, 1);
    }
}

static void test_topk_k1_kn_n1(void **state)
{
    (void)state;
    check_topk(1, 0.01, DIST_NORMAL, DIST_NORMAL, 5, 1);         /* n = 1 */
    check_topk(1000, 1e-6, DIST_NORMAL, DIST_NORMAL, 6, 1);      /* k = 1 */
    check_topk(200000, 1e-9, DIST_NORMAL, DIST_NORMAL, 7, 1);    /* k = 1, long */
    check_topk(1000, 1.0, DIST_NORMAL, DIST_NORMAL, 8, 1);       /* k = n */
    check_topk(200000, 0.9999999, DIST_NORMAL, DIST_NORMAL, 9, 0); /* k = n, long */
    check_topk(200000, 0.99, DIST_NORMAL, DIST_NORMAL, 10, 0);   /* k near n */
}

static void test_topk_distributions(void **state)
{
    (void)state;
    check_topk(3000, 0.01, DIST_NEG, DIST_ZERO, 11, 1);
    check_topk(150000, 0.01, DIST_NEG, DIST_NEG, 12, 1);
    check_topk(3000, 0.05, DIST_CAUCHY, DIST_NORMAL, 13, 1);
    check_topk(150000, 0.01, DIST_CAUCHY, DIST_CAUCHY, 14, 1);
    check_topk(150000, 0.002, DIST_ROWSCALE, DIST_ZERO, 15, 1);
    /* mostly zero with a few entries (an embedding with unused rows) */
    int64_t n = 100000;
    float *g = calloc((size_t)n, sizeof *g), *e0 = calloc((size_t)n, sizeof *e0);
    assert_true(g && e0);
    for (int64_t i = 0; i < n; i += 331) g[i] = (float)(i % 17) - 8.0f;
    int64_t shape[1] = {n};
    igrad_select_spec_t spec = spec_of(IGRAD_SPARSIFIER_TOPK, 0.01, 1.0, 0, 0, 1, shape);
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    for (int p = 0; p < 3; p++) {
        igrad__select_ws_force(ws, policies[p]);
        check_against_reference(g, e0, &spec, ws);
    }
    igrad_select_ws_free(ws);
    free(g);
    free(e0);
}

/* ------------------------------------------------------------------------ */
/* adtopk, interleave, none                                                 */
/* ------------------------------------------------------------------------ */

static void check_matrix(igrad_sparsifier_t sp, int ndim, const int64_t *shape, double density,
                         int interleave, int64_t step, dist_t dg, uint64_t seed)
{
    igrad_select_spec_t spec = spec_of(sp, density, 1.0, interleave, step, ndim, shape);
    int64_t n = spec.n;
    float *g = malloc((size_t)n * sizeof *g), *e0 = malloc((size_t)n * sizeof *e0);
    assert_true(g && e0);
    fill(g, n, dg, seed);
    fill(e0, n, DIST_NORMAL, seed + 1);
    for (int64_t i = 0; i < n; i++) e0[i] *= 0.125f;
    if (dg == DIST_TIES || dg == DIST_EQUAL) memset(e0, 0, (size_t)n * sizeof *e0);
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    for (int p = 0; p < 3; p++) {
        igrad__select_ws_force(ws, policies[p]);
        check_against_reference(g, e0, &spec, ws);
    }
    igrad_select_ws_free(ws);
    free(g);
    free(e0);
}

static void test_adtopk_rows(void **state)
{
    (void)state;
    const int64_t a[2] = {64, 100}, b[2] = {33, 4096}, c[2] = {1000, 3}, d[2] = {7, 1};
    const int64_t e[3] = {4, 8, 50}, f[2] = {3, 70001}, h[2] = {200, 700};
    check_matrix(IGRAD_SPARSIFIER_ADTOPK, 2, a, 0.01, 0, 0, DIST_NORMAL, 20);
    check_matrix(IGRAD_SPARSIFIER_ADTOPK, 2, b, 0.01, 0, 0, DIST_NORMAL, 21);
    check_matrix(IGRAD_SPARSIFIER_ADTOPK, 2, b, 0.01, 0, 0, DIST_TIES, 22);
    check_matrix(IGRAD_SPARSIFIER_ADTOPK, 2, b, 0.05, 0, 0, DIST_EQUAL, 23);
    check_matrix(IGRAD_SPARSIFIER_ADTOPK, 2, c, 0.01, 0, 0, DIST_NORMAL, 24);
    check_matrix(IGRAD_SPARSIFIER_ADTOPK, 2, d, 0.01, 0, 0, DIST_NORMAL, 25);
    check_matrix(IGRAD_SPARSIFIER_ADTOPK, 3, e, 0.02, 0, 0, DIST_NORMAL, 26);
    check_matrix(IGRAD_SPARSIFIER_ADTOPK, 2, f, 0.001, 0, 0, DIST_NORMAL, 27); /* long rows */
    /* row scales jump by orders of magnitude: the hint from the previous
     * row is often wrong in both directions */
    check_matrix(IGRAD_SPARSIFIER_ADTOPK, 2, h, 0.01, 0, 0, DIST_ROWSCALE, 28);
    check_matrix(IGRAD_SPARSIFIER_ADTOPK, 2, h, 0.01, 0, 0, DIST_CAUCHY, 29);
}

static void test_adtopk_zero_rows(void **state)
{
    (void)state;
    /* rows of zeros between normal rows (frozen or unused embedding rows) */
    const int64_t rows = 40, cols = 3000, n = rows * cols;
    const int64_t shape[2] = {rows, cols};
    float *g = malloc((size_t)n * sizeof *g), *e0 = calloc((size_t)n, sizeof *e0);
    assert_true(g && e0);
    fill(g, n, DIST_NORMAL, 31);
    for (int64_t r = 0; r < rows; r += 3) memset(g + r * cols, 0, (size_t)cols * sizeof *g);
    igrad_select_spec_t spec = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 0, 0, 2, shape);
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    check_against_reference(g, e0, &spec, ws);
    igrad_select_ws_free(ws);
    free(g);
    free(e0);
}

/* Rows that keep a few entries: every row-wise path against the per-row
 * sort, on rows of every length around the block sizes (8, 16, 32), every
 * k up to 16 and up to the whole row, with ties, equal rows and zeros of
 * both signs, and with the largest entries where the lane-maxima bound of
 * the few-per-row path is weakest: all in one lane, or rising along the
 * row so that every entry beats the ones before. */
typedef enum row_pattern {
    ROWS_DIST,      /* fill() of a distribution */
    ROWS_ONE_LANE,  /* large entries only in the columns c % 16 == 5 */
    ROWS_RISING,    /* |a| grows along each row (ties in pairs) */
    ROWS_FALLING    /* |a| shrinks along each row */
} row_pattern_t;

static void check_few(int64_t rows, int64_t cols, int64_t k, row_pattern_t pat, dist_t d,
                      uint64_t seed, igrad_select_ws_t *ws)
{
    int64_t n = rows * cols;
    float *g = malloc((size_t)n * sizeof *g), *e0 = calloc((size_t)n, sizeof *e0);
    assert_true(g && e0);
    fill(g, n, pat == ROWS_DIST ? d : DIST_NORMAL, seed);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float *x = &g[r * cols + c];
            if (pat == ROWS_ONE_LANE && c % 16 == 5) *x = (r % 2 ? -100.0f : 100.0f) + (float)c;
            if (pat == ROWS_RISING) *x = (float)(c / 2) * (c % 3 ? 1.0f : -1.0f);
            if (pat == ROWS_FALLING) *x = (float)(cols - c) + 0.5f * (float)(r % 3);
        }
    if (pat == ROWS_DIST && d != DIST_TIES && d != DIST_EQUAL && d != DIST_ZERO) {
        fill(e0, n, DIST_NORMAL, seed + 1);
        for (int64_t i = 0; i < n; i++) e0[i] *= 0.125f;
    }
    igrad_select_spec_t spec = {.row_wise = 1, .rows = rows, .cols = cols, .per_row = k,
                                .count = rows * k, .n = n};
    check_against_reference(g, e0, &spec, ws);
    free(g);
    free(e0);
}

static void test_adtopk_few(void **state)
{
    (void)state;
    const int64_t cols[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40,
                            63, 64, 65, 100, 255, 256, 257, 688, 1000};
    const int64_t ks[] = {1, 2, 3, 4, 7, 8, 9, 15, 16};
    const dist_t dists[] = {DIST_NORMAL, DIST_TIES, DIST_EQUAL, DIST_ZERO, DIST_CAUCHY};
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    uint64_t seed = 500;
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        int64_t rows = cols[c] < 100 ? 40 : 12;
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            int64_t k = ks[ki] < cols[c] ? ks[ki] : cols[c]; /* k = cols: every entry */
            for (size_t d = 0; d < sizeof dists / sizeof dists[0]; d++)
                check_few(rows, cols[c], k, ROWS_DIST, dists[d], seed++, ws);
            check_few(rows, cols[c], k, ROWS_ONE_LANE, DIST_NORMAL, seed++, ws);
            check_few(rows, cols[c], k, ROWS_RISING, DIST_NORMAL, seed++, ws);
            check_few(rows, cols[c], k, ROWS_FALLING, DIST_NORMAL, seed++, ws);
            if (ks[ki] >= cols[c]) break;
        }
    }
    /* the demo model's shapes at 1 % (3 and 7 per row), through the spec */
    const int64_t shapes[4][2] = {{257, 256}, {128, 256}, {688, 256}, {256, 688}};
    for (int s = 0; s < 4; s++)
        check_matrix(IGRAD_SPARSIFIER_ADTOPK, 2, shapes[s], 0.01, 0, 0, DIST_NORMAL, 600 + s);
    igrad_select_ws_free(ws);
}

/* NaN/Inf in rows that keep a few entries: the first bad entry in index
 * order is named wherever it sits in its row (first or last column, the
 * tail after the last block, the middle) and whatever comes after it, and
 * the residual is left bit-identical by every row path. */
static void test_adtopk_few_nonfinite(void **state)
{
    (void)state;
    const int64_t rows = 24, cols = 250, n = rows * cols; /* 250: a tail after 16-blocks */
    igrad_select_spec_t spec = {.row_wise = 1, .rows = rows, .cols = cols, .per_row = 3,
                                .count = rows * 3, .n = n};
    float *g = malloc((size_t)n * sizeof *g), *e = malloc((size_t)n * sizeof *e);
    float *e0 = malloc((size_t)n * sizeof *e0), *val = malloc((size_t)n * sizeof *val);
    uint32_t *idx = malloc((size_t)n * sizeof *idx);
    assert_true(g && e && e0 && val && idx);
    const struct {
        int64_t first, second; /* flat indices; second < 0: none */
        float first_g, second_g;
    } cases[] = {
        {7 * cols + 125, -1, NAN, 0}, {7 * cols + 125, 7 * cols + 126, NAN, INFINITY},
        {3 * cols, -1, -INFINITY, 0}, {3 * cols + cols - 1, 20 * cols + 4, NAN, NAN},
        {12 * cols + 245, 12 * cols + 248, INFINITY, NAN}, {n - 1, -1, NAN, 0},
        {5 * cols + 1, 9 * cols, 3e38f, NAN}, /* 3e38 + 3e38 overflows */
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        fill(g, n, DIST_NORMAL, 70 + t);
        fill(e0, n, DIST_NORMAL, 80 + t);
        g[cases[t].first] = cases[t].first_g;
        if (cases[t].first_g == 3e38f) e0[cases[t].first] = 3e38f;
        if (cases[t].second >= 0) g[cases[t].second] = cases[t].second_g;
        char want[64];
        snprintf(want, sizeof want, "index %lld", (long long)cases[t].first);
        igrad_select_ws_t *ws = NULL;
        assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
        for (int p = 0; p < 6; p++) {
            igrad__select_ws_rows(ws, row_modes[p % 3]);
            igrad__select_ws_kernel(ws, p < 3 ? IGRAD__SELECT_KERNEL_AUTO
                                              : IGRAD__SELECT_KERNEL_GENERIC);
            memcpy(e, e0, (size_t)n * sizeof *e);
            igrad_selection_t sel = {.index = idx, .value = val};
            assert_int_equal(igrad_select_ef(g, e, &spec, "few", ws, &sel), IGRAD_E_NONFINITE);
            if (!strstr(igrad_last_error(), want))
                print_error("case %zu, run %d: %s\n", t, p, igrad_last_error());
            assert_non_null(strstr(igrad_last_error(), want));
            expect_same_floats(e, e0, n, "residual after failure");
        }
        /* the same workspace then selects a finite tensor correctly */
        g[cases[t].first] = 1.0f;
        e0[cases[t].first] = 0.0f;
        if (cases[t].second >= 0) g[cases[t].second] = -2.0f;
        check_against_reference(g, e0, &spec, ws);
        igrad_select_ws_free(ws);
    }
    free(g);
    free(e);
    free(e0);
    free(val);
    free(idx);
}

static void test_interleave(void **state)
{
    (void)state;
    const int64_t shape[2] = {50, 400};
    for (int64_t step = 0; step < 4; step++) {
        igrad_select_spec_t s = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 1, step, 2, shape);
        assert_int_equal(s.row_wise, step % 2 == 0);
        /* row-wise vs flat reference follows from the spec's row_wise */
        check_matrix(IGRAD_SPARSIFIER_ADTOPK, 2, shape, 0.01, 1, step, DIST_CAUCHY, 40 + step);
    }
    /* a flat step really differs from a row-wise one on skewed rows */
    igrad_select_spec_t even = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 1, 0, 2, shape);
    igrad_select_spec_t odd = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 1, 1, 2, shape);
    int64_t n = even.n;
    float *g = malloc((size_t)n * sizeof *g), *e = calloc((size_t)n, sizeof *e);
    float *val = malloc((size_t)n * sizeof *val);
    uint32_t *idx = malloc((size_t)n * sizeof *idx);
    assert_true(g && e && val && idx);
    fill(g, n, DIST_NORMAL, 3);
    for (int64_t i = 0; i < 400; i++) g[i] *= 100.0f; /* row 0 dominates */
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    igrad_selection_t sel = {.index = idx, .value = val};
    assert_int_equal(igrad_select_ef(g, e, &odd, "x", ws, &sel), IGRAD_OK);
    for (int64_t j = 0; j < sel.count; j++) assert_in_range(idx[j], 0, 399); /* all row 0 */
    memset(e, 0, (size_t)n * sizeof *e);
    assert_int_equal(igrad_select_ef(g, e, &even, "x", ws, &sel), IGRAD_OK);
    assert_int_equal(even.per_row, 4);
    for (int64_t r = 0; r < 50; r++) /* every row sends its own 4 entries */
        for (int64_t j = 0; j < 4; j++)
            assert_int_equal(bits(val[r * 4 + j]), bits(g[r * 400 + idx[r * 4 + j]]));
    igrad_select_ws_free(ws);
    free(g);
    free(e);
    free(val);
    free(idx);
}

static void test_none(void **state)
{
    (void)state;
    const int64_t shape[2] = {30, 70};
    igrad_select_spec_t s = spec_of(IGRAD_SPARSIFIER_NONE, 0.01, 1.0, 0, 0, 2, shape);
    int64_t n = s.n;
    float *g = malloc((size_t)n * sizeof *g), *e = malloc((size_t)n * sizeof *e);
    float *a = malloc((size_t)n * sizeof *a), *val = malloc((size_t)n * sizeof *val);
    float *zeros = calloc((size_t)n, sizeof *zeros);
    uint32_t *idx = malloc((size_t)n * sizeof *idx);
    assert_true(g && e && a && val && zeros && idx);
    fill(g, n, DIST_NORMAL, 50);
    fill(e, n, DIST_CAUCHY, 51);
    for (int64_t i = 0; i < n; i++) a[i] = g[i] + e[i];
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    igrad_selection_t sel = {.index = idx, .value = val};
    assert_int_equal(igrad_select_ef(g, e, &s, "dense", ws, &sel), IGRAD_OK);
    assert_int_equal(sel.count, n);
    expect_same_floats(val, a, n, "value");
    expect_same_floats(e, zeros, n, "residual");
    for (int64_t i = 0; i < n; i++) assert_int_equal(idx[i], i);
    /* index may be NULL for a dense spec */
    memcpy(e, a, (size_t)n * sizeof *e);
    sel = (igrad_selection_t){.index = NULL, .value = val};
    assert_int_equal(igrad_select_ef(zeros, e, &s, "dense", ws, &sel), IGRAD_OK);
    expect_same_floats(val, a, n, "value");
    /* a row-wise spec that keeps every column is dense too: column indices */
    igrad_select_spec_t rw = spec_of(IGRAD_SPARSIFIER_ADTOPK, 1.0, 1.0, 0, 0, 2, shape);
    assert_int_equal(rw.count, n);
    memcpy(e, a, (size_t)n * sizeof *e);
    sel = (igrad_selection_t){.index = idx, .value = val};
    assert_int_equal(igrad_select_ef(zeros, e, &rw, "dense", ws, &sel), IGRAD_OK);
    for (int64_t i = 0; i < n; i++) assert_int_equal(idx[i], i % 70);
    igrad_select_ws_free(ws);
    free(g);
    free(e);
    free(a);
    free(val);
    free(zeros);
    free(idx);
}

/* ------------------------------------------------------------------------ */
/* Invalid arguments, non-finite values                                     */
/* ------------------------------------------------------------------------ */

static void test_select_invalid(void **state)
{
    (void)state;
    const int64_t shape[2] = {4, 25};
    igrad_select_spec_t s = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.1, 1.0, 0, 0, 2, shape);
    float g[100] = {0}, e[100] = {0}, val[100];
    uint32_t idx[100];
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    igrad_selection_t sel = {.index = idx, .value = val};
    assert_int_equal(igrad_select_ef(NULL, e, &s, "x", ws, &sel), IGRAD_E_INVALID);
    assert_int_equal(igrad_select_ef(g, NULL, &s, "x", ws, &sel), IGRAD_E_INVALID);
    assert_int_equal(igrad_select_ef(g, e, NULL, "x", ws, &sel), IGRAD_E_INVALID);
    assert_int_equal(igrad_select_ef(g, e, &s, "x", NULL, &sel), IGRAD_E_INVALID);
    assert_int_equal(igrad_select_ef(g, e, &s, "x", ws, NULL), IGRAD_E_INVALID);
    sel.index = NULL; /* sparse spec needs indices */
    assert_int_equal(igrad_select_ef(g, e, &s, "x", ws, &sel), IGRAD_E_INVALID);
    sel = (igrad_selection_t){.index = idx, .value = NULL};
    assert_int_equal(igrad_select_ef(g, e, &s, "x", ws, &sel), IGRAD_E_INVALID);
    sel = (igrad_selection_t){.index = idx, .value = val};
    igrad_select_spec_t bad = s;
    bad.per_row = 26;
    bad.count = 104;
    assert_int_equal(igrad_select_ef(g, e, &bad, "x", ws, &sel), IGRAD_E_INVALID);
    bad = s;
    bad.cols = 24;
    assert_int_equal(igrad_select_ef(g, e, &bad, "x", ws, &sel), IGRAD_E_INVALID);
    bad = s;
    bad.count = 9;
    assert_int_equal(igrad_select_ef(g, e, &bad, "x", ws, &sel), IGRAD_E_INVALID);
    bad = s;
    bad.row_wise = 0;
    bad.count = 0;
    assert_int_equal(igrad_select_ef(g, e, &bad, "x", ws, &sel), IGRAD_E_INVALID);
    bad.count = 101;
    assert_int_equal(igrad_select_ef(g, e, &bad, "x", ws, &sel), IGRAD_E_INVALID);
    bad.n = 0;
    bad.count = 0;
    assert_int_equal(igrad_select_ef(g, e, &bad, "x", ws, &sel), IGRAD_E_INVALID);
    assert_int_equal(igrad_residual_accumulate(NULL, e, 100, "x"), IGRAD_E_INVALID);
    assert_int_equal(igrad_residual_accumulate(g, e, -1, "x"), IGRAD_E_INVALID);
    assert_int_equal(igrad_select_ws_create(NULL), IGRAD_E_INVALID);
    igrad_select_ws_free(NULL);
    assert_int_equal(igrad_select_ws_nbytes(NULL), 0);
    igrad_select_ws_free(ws);
}

/* Puts `bad` into g (or, with in_residual, into e0) at `pos` and checks the
 * call fails with the tensor's name and index, leaving e bit-identical. */
static void check_nonfinite(const igrad_select_spec_t *spec, int64_t pos, float bad_g,
                            float bad_e)
{
    int64_t n = spec->n;
    float *g = malloc((size_t)n * sizeof *g), *e = malloc((size_t)n * sizeof *e);
    float *e0 = malloc((size_t)n * sizeof *e0), *val = malloc((size_t)n * sizeof *val);
    uint32_t *idx = malloc((size_t)n * sizeof *idx);
    assert_true(g && e && e0 && val && idx);
    fill(g, n, DIST_NORMAL, 60);
    fill(e0, n, DIST_NORMAL, 61);
    g[pos] = bad_g;
    e0[pos] = bad_e;
    memcpy(e, e0, (size_t)n * sizeof *e);
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    char want[64];
    snprintf(want, sizeof want, "index %lld", (long long)pos);
    int modes = spec->row_wise && spec->per_row <= 16 ? 3 : 1;
    for (int p = 0; p < 6 * modes; p++) {
        igrad__select_ws_force(ws, policies[p % 3]);
        igrad__select_ws_kernel(ws, p % 6 < 3 ? IGRAD__SELECT_KERNEL_AUTO
                                              : IGRAD__SELECT_KERNEL_GENERIC);
        igrad__select_ws_rows(ws, row_modes[p / 6]);
        igrad_selection_t sel = {.index = idx, .value = val};
        assert_int_equal(igrad_select_ef(g, e, spec, "model.layers.0.mlp.up_proj.weight", ws,
                                         &sel), IGRAD_E_NONFINITE);
        const char *msg = igrad_last_error();
        if (!strstr(msg, "up_proj") || !strstr(msg, want)) print_error("message: %s\n", msg);
        assert_non_null(strstr(msg, "model.layers.0.mlp.up_proj.weight"));
        assert_non_null(strstr(msg, want));
        expect_same_floats(e, e0, n, "residual after failure");
    }
    assert_int_equal(igrad_residual_accumulate(g, e, n, "acc.weight"), IGRAD_E_NONFINITE);
    assert_non_null(strstr(igrad_last_error(), "acc.weight"));
    assert_non_null(strstr(igrad_last_error(), want));
    expect_same_floats(e, e0, n, "residual after failed accumulate");
    igrad_select_ws_free(ws);
    free(g);
    free(e);
    free(e0);
    free(val);
    free(idx);
}

static void test_nonfinite(void **state)
{
    (void)state;
    const int64_t small[1] = {5000}, large[1] = {100003}, mat[2] = {20, 3001};
    const int64_t longrows[2] = {2, 70001}, few[2] = {30, 250}; /* few: 3 per row */
    const igrad_sparsifier_t sps[] = {IGRAD_SPARSIFIER_TOPK, IGRAD_SPARSIFIER_ADTOPK,
                                      IGRAD_SPARSIFIER_NONE};
    for (int s = 0; s < 3; s++) {
        igrad_select_spec_t specs[5] = {
            spec_of(sps[s], 0.01, 1.0, 0, 0, 1, small), spec_of(sps[s], 0.01, 1.0, 0, 0, 1, large),
            spec_of(sps[s], 0.01, 1.0, 0, 0, 2, mat), spec_of(sps[s], 0.01, 1.0, 0, 0, 2, longrows),
            spec_of(sps[s], 0.01, 1.0, 0, 0, 2, few)};
        for (int t = 0; t < 5; t++) {
            int64_t n = specs[t].n;
            const int64_t where[] = {0, 17, n / 2, n - 1};
            for (int w = 0; w < 4; w++) {
                check_nonfinite(&specs[t], where[w], NAN, 0.0f);
                check_nonfinite(&specs[t], where[w], 0.5f, NAN);
            }
            check_nonfinite(&specs[t], n - 1, INFINITY, 0.0f);
            check_nonfinite(&specs[t], n / 3, -INFINITY, 1.0f);
            check_nonfinite(&specs[t], n / 2, 3e38f, 3e38f);   /* the sum overflows */
            check_nonfinite(&specs[t], 5, -3e38f, -3e38f);
        }
    }
    /* overflow is reported as such */
    const int64_t one[1] = {1};
    igrad_select_spec_t s1 = spec_of(IGRAD_SPARSIFIER_TOPK, 1.0, 1.0, 0, 0, 1, one);
    float g = 3e38f, e = 3e38f, val;
    uint32_t idx;
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    igrad_selection_t sel = {.index = &idx, .value = &val};
    assert_int_equal(igrad_select_ef(&g, &e, &s1, NULL, ws, &sel), IGRAD_E_NONFINITE);
    assert_non_null(strstr(igrad_last_error(), "overflow"));
    assert_int_equal(bits(e), bits(3e38f));
    igrad_select_ws_free(ws);
}

/* ------------------------------------------------------------------------ */
/* Conservation and determinism                                             */
/* ------------------------------------------------------------------------ */

static void test_conservation(void **state)
{
    (void)state;
    /* per tensor and per entry: sum of gradients = sum sent + residual */
    const int64_t shapes[3][2] = {{50, 40}, {1, 3000}, {12, 700}};
    const igrad_sparsifier_t sps[3] = {IGRAD_SPARSIFIER_ADTOPK, IGRAD_SPARSIFIER_TOPK,
                                       IGRAD_SPARSIFIER_ADTOPK};
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    uint64_t s = 77;
    for (int t = 0; t < 3; t++) {
        int64_t n = shapes[t][0] * shapes[t][1];
        float *g = malloc((size_t)n * sizeof *g), *e = calloc((size_t)n, sizeof *e);
        float *val = malloc((size_t)n * sizeof *val);
        uint32_t *idx = malloc((size_t)n * sizeof *idx);
        double *sum_g = calloc((size_t)n, sizeof *sum_g), *sum_abs = calloc((size_t)n, sizeof *sum_abs);
        double *sum_sent = calloc((size_t)n, sizeof *sum_sent);
        assert_true(g && e && val && idx && sum_g && sum_abs && sum_sent);
        for (int64_t step = 0; step < 200; step++) {
            fill(g, n, (step % 5 == 0) ? DIST_CAUCHY : DIST_NORMAL, s + (uint64_t)step);
            for (int64_t i = 0; i < n; i++) {
                sum_g[i] += g[i];
                sum_abs[i] += fabs(g[i]);
            }
            if (rng_next(&s) % 3 == 0) {
                assert_int_equal(igrad_residual_accumulate(g, e, n, "acc"), IGRAD_OK);
                continue;
            }
            double scale = 1.0 + (double)(rng_next(&s) % 4);
            igrad_select_spec_t spec = spec_of(sps[t], 0.01, scale, 1, step, 2, shapes[t]);
            igrad_selection_t sel = {.index = idx, .value = val};
            assert_int_equal(igrad_select_ef(g, e, &spec, "cons", ws, &sel), IGRAD_OK);
            for (int64_t j = 0; j < sel.count; j++) {
                int64_t flat = sel.row_wise ? (j / spec.per_row) * spec.cols + idx[j] : idx[j];
                sum_sent[flat] += val[j];
            }
        }
        double tot_g = 0, tot_sent = 0, tot_e = 0, tot_abs = 0;
        for (int64_t i = 0; i < n; i++) {
            double lhs = sum_g[i], rhs = sum_sent[i] + e[i];
            assert_float_equal(lhs, rhs, 1e-4 * sum_abs[i] + 1e-30);
            tot_g += sum_g[i];
            tot_sent += sum_sent[i];
            tot_e += e[i];
            tot_abs += sum_abs[i];
        }
        assert_float_equal(tot_g, tot_sent + tot_e, 1e-4 * fabs(tot_g) + 1e-6 * tot_abs);
        free(g);
        free(e);
        free(val);
        free(idx);
        free(sum_g);
        free(sum_abs);
        free(sum_sent);
    }
    igrad_select_ws_free(ws);
}

static void test_determinism(void **state)
{
    (void)state;
    const int64_t shapes[3][2] = {{1, 250000}, {300, 500}, {1, 999}};
    const igrad_sparsifier_t sps[3] = {IGRAD_SPARSIFIER_TOPK, IGRAD_SPARSIFIER_ADTOPK,
                                       IGRAD_SPARSIFIER_TOPK};
    igrad_select_ws_t *ws1 = NULL, *ws2 = NULL;
    assert_int_equal(igrad_select_ws_create(&ws1), IGRAD_OK);
    assert_int_equal(igrad_select_ws_create(&ws2), IGRAD_OK);
    for (int t = 0; t < 3; t++) {
        igrad_select_spec_t spec = spec_of(sps[t], 0.01, 1.0, 0, 0, 2, shapes[t]);
        int64_t n = spec.n, k = spec.count;
        float *g = malloc((size_t)n * 4), *e0 = malloc((size_t)n * 4);
        float *e1 = malloc((size_t)n * 4), *e2 = malloc((size_t)n * 4);
        float *v1 = malloc((size_t)k * 4), *v2 = malloc((size_t)k * 4);
        uint32_t *i1 = malloc((size_t)k * 4), *i2 = malloc((size_t)k * 4);
        assert_true(g && e0 && e1 && e2 && v1 && v2 && i1 && i2);
        fill(g, n, DIST_TIES, 90 + (uint64_t)t);
        fill(e0, n, DIST_NORMAL, 95 + (uint64_t)t);
        for (int64_t i = 0; i < n; i++) e0[i] *= 0.01f;
        memcpy(e1, e0, (size_t)n * 4);
        memcpy(e2, e0, (size_t)n * 4);
        igrad_selection_t s1 = {.index = i1, .value = v1}, s2 = {.index = i2, .value = v2};
        assert_int_equal(igrad_select_ef(g, e1, &spec, "d", ws1, &s1), IGRAD_OK);
        /* a workspace with another history (a larger earlier call) */
        assert_int_equal(igrad_select_ef(g, e2, &spec, "d", ws2, &s2), IGRAD_OK);
        memcpy(e2, e0, (size_t)n * 4);
        assert_int_equal(igrad_select_ef(g, e2, &spec, "d", ws2, &s2), IGRAD_OK);
        expect_same_u32(i1, i2, k, "index");
        expect_same_floats(v1, v2, k, "value");
        expect_same_floats(e1, e2, n, "residual");
        assert_true(s1.sumsq == s2.sumsq);
        free(g);
        free(e0);
        free(e1);
        free(e2);
        free(v1);
        free(v2);
        free(i1);
        free(i2);
    }
    assert_true(igrad_select_ws_nbytes(ws1) > 0);
    igrad_select_ws_free(ws1);
    igrad_select_ws_free(ws2);
}

/* Large tensors are split over OpenMP threads (pass 1 of a flat selection,
 * pass 2 always); the answer must not depend on the thread count, on
 * whether the parallel attempt gives up (overflow, too few candidates) or
 * on where the pieces are cut. One reference, many runs. */
static void check_threads(const float *g, const float *e0, const igrad_select_spec_t *spec,
                          const uint32_t *want, int64_t nan_at)
{
    int64_t n = spec->n, k = spec->count;
    int64_t rows = spec->row_wise ? spec->rows : 1, len = n / rows;
    int64_t per = spec->row_wise ? spec->per_row : k;
    float *e = malloc((size_t)n * sizeof *e), *want_e = malloc((size_t)n * sizeof *want_e);
    float *val = malloc((size_t)k * sizeof *val), *want_val = malloc((size_t)k * sizeof *val);
    uint32_t *idx = malloc((size_t)k * sizeof *idx);
    assert_true(e && want_e && val && want_val && idx);
    for (int64_t i = 0; i < n; i++) want_e[i] = g[i] + e0[i];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < per; j++) {
            int64_t flat = r * len + want[r * per + j];
            want_val[r * per + j] = want_e[flat];
        }
    for (int64_t j = 0; j < k; j++) want_e[(j / per) * len + want[j]] = 0.0f;
    igrad_select_ws_t *ws = NULL;
    assert_int_equal(igrad_select_ws_create(&ws), IGRAD_OK);
    for (int threads = 1; threads <= 3; threads++) {
#ifdef _OPENMP
        omp_set_num_threads(threads);
#endif
        for (int p = 0; p < 6; p++) {
            igrad__select_ws_force(ws, policies[p % 3]);
            igrad__select_ws_kernel(ws, p < 3 ? IGRAD__SELECT_KERNEL_AUTO
                                              : IGRAD__SELECT_KERNEL_GENERIC);
            memcpy(e, e0, (size_t)n * sizeof *e);
            igrad_selection_t sel = {.index = idx, .value = val};
            igrad_status_t st = igrad_select_ef(g, e, spec, "big", ws, &sel);
            if (nan_at >= 0) {
                char where[64];
                snprintf(where, sizeof where, "index %lld", (long long)nan_at);
                assert_int_equal(st, IGRAD_E_NONFINITE);
                if (!strstr(igrad_last_error(), where)) print_error("%s\n", igrad_last_error());
                assert_non_null(strstr(igrad_last_error(), where));
                expect_same_floats(e, e0, n, "residual after failure");
                continue;
            }
            assert_int_equal(st, IGRAD_OK);
            expect_same_u32(idx, want, k, "index");
            expect_same_floats(val, want_val, k, "value");
            expect_same_floats(e, want_e, n, "residual");
        }
        memcpy(e, e0, (size_t)n * sizeof *e);
        igrad_status_t st = igrad_residual_accumulate(g, e, n, "acc");
        if (nan_at >= 0) {
            assert_int_equal(st, IGRAD_E_NONFINITE);
            expect_same_floats(e, e0, n, "residual after failed accumulate");
        } else {
            assert_int_equal(st, IGRAD_OK);
            for (int64_t i = 0; i < n; i++) assert_int_equal(bits(e[i]), bits(g[i] + e0[i]));
        }
    }
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    igrad_select_ws_free(ws);
    free(e);
    free(want_e);
    free(val);
    free(want_val);
    free(idx);
}

static void test_threads(void **state)
{
    (void)state;
    const int64_t n = 2200000 + 77; /* two pieces of >= 2^20 and a tail */
    const int64_t flat[1] = {n};
    float *g = malloc((size_t)n * sizeof *g), *e0 = malloc((size_t)n * sizeof *e0);
    float *a = malloc((size_t)n * sizeof *a);
    assert_true(g && e0 && a);
    fill(g, n, DIST_CAUCHY, 101);
    fill(e0, n, DIST_NORMAL, 102);
    for (int64_t i = 0; i < n; i++) a[i] = g[i] + e0[i];
    igrad_select_spec_t spec = spec_of(IGRAD_SPARSIFIER_TOPK, 0.003, 1.0, 0, 0, 1, flat);
    uint32_t *want = malloc((size_t)spec.count * sizeof *want);
    assert_non_null(want);
    ref_topk(a, n, spec.count, want);
    check_threads(g, e0, &spec, want, -1);
    /* all equal: the parallel attempt overflows, the serial path finishes */
    for (int64_t i = 0; i < n; i++) g[i] = -2.5f;
    memset(e0, 0, (size_t)n * sizeof *e0);
    for (int64_t j = 0; j < spec.count; j++) want[j] = (uint32_t)j;
    check_threads(g, e0, &spec, want, -1);
    /* NaN/Inf in the last piece, then also in the first */
    fill(g, n, DIST_NORMAL, 103);
    g[n - 5] = NAN;
    check_threads(g, e0, &spec, want, n - 5);
    g[1000] = INFINITY;
    check_threads(g, e0, &spec, want, 1000);
    free(want);
    /* row-wise: pass 2 cut in the middle of rows */
    const int64_t mat[2] = {700, 3001};
    igrad_select_spec_t rs = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 0, 0, 2, mat);
    fill(g, rs.n, DIST_NORMAL, 104);
    fill(e0, rs.n, DIST_NORMAL, 105);
    for (int64_t i = 0; i < rs.n; i++) a[i] = g[i] + e0[i];
    want = malloc((size_t)rs.count * sizeof *want);
    assert_non_null(want);
    for (int64_t r = 0; r < rs.rows; r++)
        ref_topk(a + r * rs.cols, rs.cols, rs.per_row, want + r * rs.per_row);
    check_threads(g, e0, &rs, want, -1);
    free(want);
    /* row-wise keeping 10 per row (the few-per-row path): both of its passes
     * by rows; a NaN late in the tensor, then also one early */
    igrad_select_spec_t fs = spec_of(IGRAD_SPARSIFIER_ADTOPK, 0.003, 1.0, 0, 0, 2, mat);
    assert_int_equal(fs.per_row, 10);
    want = malloc((size_t)fs.count * sizeof *want);
    assert_non_null(want);
    for (int64_t r = 0; r < fs.rows; r++)
        ref_topk(a + r * fs.cols, fs.cols, fs.per_row, want + r * fs.per_row);
    check_threads(g, e0, &fs, want, -1);
    g[650 * 3001 + 1234] = NAN;
    check_threads(g, e0, &fs, want, 650 * 3001 + 1234);
    e0[2 * 3001 + 3000] = -INFINITY;
    check_threads(g, e0, &fs, want, 2 * 3001 + 3000);
    free(want);
    free(g);
    free(e0);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_spec),
        cmocka_unit_test(test_spec_invalid),
        cmocka_unit_test(test_topk_sizes),
        cmocka_unit_test(test_topk_ties),
        cmocka_unit_test(test_topk_tie_boundaries),
        cmocka_unit_test(test_topk_all_equal),
        cmocka_unit_test(test_topk_k1_kn_n1),
        cmocka_unit_test(test_topk_distributions),
        cmocka_unit_test(test_adtopk_rows),
        cmocka_unit_test(test_adtopk_zero_rows),
        cmocka_unit_test(test_adtopk_few),
        cmocka_unit_test(test_adtopk_few_nonfinite),
        cmocka_unit_test(test_interleave),
        cmocka_unit_test(test_none),
        cmocka_unit_test(test_select_invalid),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_conservation),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
