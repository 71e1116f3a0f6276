/*
 * select_spec.c — the control-plane half of selection: sparsifier names,
 * igrad_budget (k = ceil(density * n) in [1, n]) and igrad_select_spec
 * (how many entries a tensor keeps, flat or per row, at a step), the
 * arithmetic every rank must agree on. No gradient memory here; the
 * selection itself is select.c.
 */
#include "core/internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ceil(x) clamped to [1, n]; x may be NaN or huge. The product is taken in
 * double exactly as written (no epsilon), so any other implementation that
 * evaluates ceil(density * n) in double agrees with it. */
static int64_t ceil_clamped(double x, int64_t n)
{
    double c = ceil(x);
    if (!(c >= 1.0)) return 1;
    if (c >= (double)n) return n;
    return (int64_t)c;
}

int64_t igrad_budget(int64_t n, double density)
{
    if (n <= 0) return 0;
    return ceil_clamped(density * (double)n, n);
}

igrad_status_t igrad_select_spec(igrad_sparsifier_t sp, double density, double scale,
                                 int interleave, int64_t step, int ndim,
                                 const int64_t *shape, igrad_select_spec_t *out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_select_spec: out is NULL");
    IGRAD_FAIL_IF(sp != IGRAD_SPARSIFIER_NONE && sp != IGRAD_SPARSIFIER_TOPK &&
                      sp != IGRAD_SPARSIFIER_ADTOPK,
                  IGRAD_E_INVALID, "igrad_select_spec: unknown sparsifier %d", (int)sp);
    IGRAD_FAIL_IF(!(density > 0.0 && density <= 1.0), IGRAD_E_INVALID,
                  "igrad_select_spec: density %g outside (0, 1]", density);
    IGRAD_FAIL_IF(!(scale > 0.0 && scale <= DBL_MAX), IGRAD_E_INVALID,
                  "igrad_select_spec: scale %g is not a positive finite number", scale);
    IGRAD_FAIL_IF(ndim < 0 || ndim > IGRAD_MAX_DIMS, IGRAD_E_INVALID,
                  "igrad_select_spec: ndim %d outside 0..%d", ndim, IGRAD_MAX_DIMS);
    IGRAD_FAIL_IF(ndim > 0 && !shape, IGRAD_E_INVALID, "igrad_select_spec: shape is NULL");
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        IGRAD_FAIL_IF(shape[d] <= 0, IGRAD_E_INVALID,
                      "igrad_select_spec: dimension %d is %lld", d, (long long)shape[d]);
        IGRAD_FAIL_IF(n > INT64_MAX / shape[d], IGRAD_E_INVALID,
                      "igrad_select_spec: entry count overflows int64");
        n *= shape[d];
    }
    /* Selections carry 32-bit indices. */
    IGRAD_FAIL_IF(n > (int64_t)UINT32_MAX + 1, IGRAD_E_INVALID,
                  "igrad_select_spec: %lld entries, more than 32-bit indices can address",
                  (long long)n);

    memset(out, 0, sizeof *out);
    out->n = n;
    out->rows = 1;
    out->cols = n;
    if (sp == IGRAD_SPARSIFIER_NONE) {
        out->count = out->per_row = n;
        return IGRAD_OK;
    }
    if (sp == IGRAD_SPARSIFIER_ADTOPK && ndim >= 2) {
        int64_t rows = shape[0], cols = n / rows;
        int64_t per_row = ceil_clamped(scale * (double)igrad_budget(cols, density), cols);
        if (interleave && step % 2 != 0) {
            out->count = out->per_row = rows * per_row;
        } else {
            out->row_wise = 1;
            out->rows = rows;
            out->cols = cols;
            out->per_row = per_row;
            out->count = rows * per_row;
        }
        return IGRAD_OK;
    }
    out->count = out->per_row = ceil_clamped(scale * (double)igrad_budget(n, density), n);
    return IGRAD_OK;
}
