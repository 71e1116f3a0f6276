/*
 * select_spec.c — the control-plane half of selection: igrad_select_spec
 * (how many entries a tensor keeps, flat or per row, at a step), the
 * arithmetic every rank must agree on. It checks the arguments and asks
 * the sparsifier's row (core/sparsifier.c: names, igrad_budget, the keep
 * functions). No gradient memory here; the selection itself is select.c.
 */
#include "core/sparsifier.h"

#include <float.h>
#include <string.h>

igrad_status_t igrad_select_spec(igrad_sparsifier_t sp, double density, double scale,
                                 int interleave, int64_t step, int ndim,
                                 const int64_t *shape, igrad_select_spec_t *out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_select_spec: out is NULL");
    const igrad__sparsifier_t *row = igrad__sparsifier(sp);
    IGRAD_FAIL_IF(!row, IGRAD_E_INVALID, "igrad_select_spec: unknown sparsifier %d", (int)sp);
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
    row->keep(density, scale, interleave, step, ndim, shape, out);
    return IGRAD_OK;
}
