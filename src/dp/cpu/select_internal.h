/*
 * select_internal.h — internals of select.c that tests and the engine's
 * data plane may reach: the selection that also clears the gradient, and
 * knobs that force the selection's threshold policy, so that the rare
 * recovery paths (too few candidates, buffer overflow and compaction) run
 * on small inputs, its pass-1 kernels, and which row-wise path runs. Results never depend on any of them, only the time does; the
 * public API lives in include/igrad.h.
 */
#ifndef IGRAD_SELECT_INTERNAL_H
#define IGRAD_SELECT_INTERNAL_H

#include "igrad.h"

/* Threshold policies of a workspace (the default is NORMAL). */
enum {
    IGRAD__SELECT_NORMAL = 0,  /* sampled threshold, then recovery if needed */
    IGRAD__SELECT_FORCE_HIGH,  /* thresholds too high: the largest sample
                                  (too few candidates when k > len/samples),
                                  then +Inf (none), so every retry runs */
    IGRAD__SELECT_FORCE_LOW    /* threshold 0 and a candidate buffer only
                                  k/8 above k: many compactions */
};

/* Sets the policy used by later igrad_select_ef() calls on `ws`. */
void igrad__select_ws_force(igrad_select_ws_t *ws, int policy);

/* Pass-1 kernels: AUTO takes AVX2 where the CPU has it, GENERIC forces the
 * portable C one (both give identical results; tests run both). */
enum { IGRAD__SELECT_KERNEL_AUTO = 0, IGRAD__SELECT_KERNEL_GENERIC = 1 };
void igrad__select_ws_kernel(igrad_select_ws_t *ws, int kernel);

/* Row-wise paths: AUTO takes the few-per-row path where it is the faster
 * one, GENERAL never takes it (the candidate buffer for every row), FEW
 * takes it whenever a row keeps at most 16 entries. All give identical
 * results; tests run all three. */
enum { IGRAD__SELECT_ROWS_AUTO = 0, IGRAD__SELECT_ROWS_GENERAL = 1, IGRAD__SELECT_ROWS_FEW = 2 };
void igrad__select_ws_rows(igrad_select_ws_t *ws, int rows);

/* igrad_select_ef() in two halves, for the engine's data plane, which
 * runs the first inside its finiteness check (before the ranks agree on
 * the step) and the second after the agreement:
 *  find   reads grad and residual once: proves a = grad + residual finite
 *         (IGRAD_E_NONFINITE naming the tensor and index otherwise) and,
 *         with a_sumsq, sums a^2 in double in a fixed order (what the
 *         engine's check needs); then the selection's indices and values
 *         into out (a dense spec: the values; the few-per-row path: only
 *         each row's bound into row_bound, spec->rows entries, which must
 *         then be given to apply). Writes nothing but out and row_bound.
 *  apply  writes the residual (a with the kept entries zeroed) and, with
 *         zero_grad, zeroes grad chunk by chunk right after adding it in,
 *         while it is in cache (the engine's sync unpacks into it anyway);
 *         sets out->sumsq, count and row_wise. With value_dtype BF16 or
 *         F16 every kept value v is also rounded to q (value16.h; a value
 *         that would be Inf clamped to the largest finite one) and v - q
 *         is that entry's residual, in the same write (architecture.md
 *         §5.2); *rounded_sumsq gets the sum of (v - q)^2 in kept order
 *         (out->sumsq stays that of the unrounded values).
 * find and apply must see the same spec, workspace policy and buffers,
 * and nothing may change grad or residual in between. */
igrad_status_t igrad__select_find(const float *grad, const float *residual,
                                  const igrad_select_spec_t *spec, const char *name,
                                  igrad_select_ws_t *ws, igrad_selection_t *out,
                                  int32_t *row_bound, double *a_sumsq);
void igrad__select_apply(float *grad, float *residual, const igrad_select_spec_t *spec,
                         const igrad_select_ws_t *ws, igrad_selection_t *out,
                         const int32_t *row_bound, int zero_grad, igrad_dtype_t value_dtype,
                         double *rounded_sumsq);

/* Sum of a^2 in double for a = g + e, in eight fixed lanes (entry i in
 * lane i % 8, then a fixed tree): what find sums, for the engine's check of
 * the tensors it does not select (the same bits with every kernel). */
double igrad__sumsq_ge(const float *g, const float *e, int64_t n);

/* Both halves in one call (zero_grad, value_dtype and rounded_sumsq as for
 * apply; rounded_sumsq may be NULL). Nothing is written to grad or the
 * residual before the selection is known to succeed. With zero_grad 0 and
 * F32 values it is igrad_select_ef() and grad is only read. */
igrad_status_t igrad__select_ef(float *grad, float *residual, const igrad_select_spec_t *spec,
                                const char *name, igrad_select_ws_t *ws, igrad_selection_t *out,
                                int zero_grad, igrad_dtype_t value_dtype, double *rounded_sumsq);

#endif /* IGRAD_SELECT_INTERNAL_H */
