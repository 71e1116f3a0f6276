/*
 * sparsifier.h — the sparsifier table: one row per igrad_sparsifier_t
 * (none = dense, topk, adtopk), indexed by its value. A row is everything
 * that differs between sparsifiers: the name (igrad_sparsifier_name, the
 * CLI's and Python's lists), whether it keeps every entry, how many
 * entries a tensor keeps at a step (flat or row-wise, with interleave) and
 * the width of an index on the wire. igrad_select_spec, the plan, the data
 * planes (CPU and CUDA) and the tools ask the row and never test a kind,
 * so a new sparsifier is its keep function and one row in sparsifier.c
 * (and its value in igrad.h's enum).
 *
 * The selection itself (select.c, dp_cuda_select.cu) follows the spec the
 * row's keep function fills: the largest |a| over the flat tensor, or
 * per_row of each row when spec.row_wise.
 *
 * Not here: the validation of igrad_select_spec's arguments (plan/
 * select_spec.c), which method uses which sparsifier (the config).
 */
#ifndef IGRAD_SPARSIFIER_H
#define IGRAD_SPARSIFIER_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct igrad__sparsifier {
    const char *name; /* first member: names.c reads the names from the rows */
    /* Keeps every entry: no selection, no residual, no indices on the
     * wire, the whole tensor in dense segments. */
    int dense;
    /* The entries a tensor shape[0..ndim) keeps at `step` with
     * density (0, 1] and scale > 0: sets out->count and out->per_row and,
     * row-wise, out->row_wise, rows and cols. out comes filled flat
     * (n, rows 1, cols n); the arguments are valid. */
    void (*keep)(double density, double scale, int interleave, int64_t step, int ndim,
                 const int64_t *shape, igrad_select_spec_t *out);
    /* Bytes of one index of a selection `sp` on the wire when the config
     * asks for index_dtype (U16 or U32); 0: no indices. */
    int (*index_nbytes)(const igrad_select_spec_t *sp, igrad_dtype_t index_dtype);
} igrad__sparsifier_t;

#define IGRAD__NSPARSIFIERS 3

/* Indexed by igrad_sparsifier_t. */
extern const igrad__sparsifier_t igrad__sparsifiers[IGRAD__NSPARSIFIERS];

/* The row of sp; NULL for a value outside the table. */
static inline const igrad__sparsifier_t *igrad__sparsifier(igrad_sparsifier_t sp)
{
    return (int)sp >= 0 && (int)sp < IGRAD__NSPARSIFIERS ? &igrad__sparsifiers[sp] : NULL;
}

/* sp keeps every entry (sp valid). */
static inline int igrad__sparsifier_dense(igrad_sparsifier_t sp)
{
    return igrad__sparsifiers[sp].dense;
}

/* The names of the sparsifiers that select (not dense), joined by sep
 * ("topk|adtopk"), into buf; returns buf. For the CLI's lists of what
 * iad and ig accept. */
const char *igrad__sparsifier_list_sparse(const char *sep, char *buf, size_t nbytes);

/* ceil(x) clamped to [1, n] (x may be NaN or huge), in double exactly as
 * written, so every implementation that evaluates ceil(density * n) in
 * double agrees with it. */
int64_t igrad__ceil_clamped(double x, int64_t n);

#ifdef __cplusplus
}
#endif

#endif /* IGRAD_SPARSIFIER_H */
