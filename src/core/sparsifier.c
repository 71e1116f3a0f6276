/*
 * sparsifier.c — the sparsifier table (sparsifier.h): each sparsifier's
 * keep and index functions, then the rows. igrad_budget (k = ceil(density
 * * n) in [1, n]) is here because every keep function starts from it.
 */
#include "core/sparsifier.h"

#include <math.h>
#include <stdio.h>

int64_t igrad__ceil_clamped(double x, int64_t n)
{
    double c = ceil(x);
    if (!(c >= 1.0)) return 1;
    if (c >= (double)n) return n;
    return (int64_t)c;
}

int64_t igrad_budget(int64_t n, double density)
{
    if (n <= 0) return 0;
    return igrad__ceil_clamped(density * (double)n, n);
}

/* none: every entry, no indices. */
static void keep_all(double density, double scale, int interleave, int64_t step, int ndim,
                     const int64_t *shape, igrad_select_spec_t *out)
{
    (void)density, (void)scale, (void)interleave, (void)step, (void)ndim, (void)shape;
    out->count = out->per_row = out->n;
}

static int index_none(const igrad_select_spec_t *sp, igrad_dtype_t index_dtype)
{
    (void)sp, (void)index_dtype;
    return 0;
}

/* Indices are < the range they address (a row's columns, or the flat
 * tensor): 16 bits when asked and they fit, else 32. */
static int index_in_range(const igrad_select_spec_t *sp, igrad_dtype_t index_dtype)
{
    int64_t range = sp->row_wise ? sp->cols : sp->n;
    return index_dtype == IGRAD_DTYPE_U16 && range <= 65536 ? 2 : 4;
}

/* topk: ceil(scale * budget(n)) entries of the flat tensor. */
static void keep_flat(double density, double scale, int interleave, int64_t step, int ndim,
                      const int64_t *shape, igrad_select_spec_t *out)
{
    (void)interleave, (void)step, (void)ndim, (void)shape;
    out->count = out->per_row = igrad__ceil_clamped(scale * (double)igrad_budget(out->n, density),
                                                    out->n);
}

/* adtopk: on ndim >= 2, rows = shape[0], ceil(scale * budget(cols)) of each
 * row; with interleave, odd steps take the same count flat. 1-D: topk. */
static void keep_rows(double density, double scale, int interleave, int64_t step, int ndim,
                      const int64_t *shape, igrad_select_spec_t *out)
{
    if (ndim < 2) {
        keep_flat(density, scale, interleave, step, ndim, shape, out);
        return;
    }
    int64_t rows = shape[0], cols = out->n / rows;
    int64_t per_row = igrad__ceil_clamped(scale * (double)igrad_budget(cols, density), cols);
    if (interleave && step % 2 != 0) {
        out->count = out->per_row = rows * per_row;
    } else {
        out->row_wise = 1;
        out->rows = rows;
        out->cols = cols;
        out->per_row = per_row;
        out->count = rows * per_row;
    }
}

const igrad__sparsifier_t igrad__sparsifiers[IGRAD__NSPARSIFIERS] = {
    [IGRAD_SPARSIFIER_NONE] = {"none", 1, keep_all, index_none},
    [IGRAD_SPARSIFIER_TOPK] = {"topk", 0, keep_flat, index_in_range},
    [IGRAD_SPARSIFIER_ADTOPK] = {"adtopk", 0, keep_rows, index_in_range},
};

const char *igrad__sparsifier_list_sparse(const char *sep, char *buf, size_t nbytes)
{
    size_t at = 0;
    if (nbytes) buf[0] = '\0';
    for (int i = 0; i < IGRAD__NSPARSIFIERS && at < nbytes; i++) {
        if (igrad__sparsifiers[i].dense) continue;
        int n = snprintf(buf + at, nbytes - at, "%s%s", at ? sep : "", igrad__sparsifiers[i].name);
        if (n < 0) break;
        at += (size_t)n;
    }
    return buf;
}
