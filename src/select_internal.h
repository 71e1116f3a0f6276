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

/* igrad_select_ef() for the engine's data plane: with zero_grad set, grad
 * is also zeroed, each chunk (or row) once pass 2 has added it into the
 * residual, so a caller that will overwrite grad anyway (the engine's sync
 * unpacks into it) saves the separate pass that clears it. Nothing is
 * written to grad before the selection is known to succeed. Without
 * zero_grad it is igrad_select_ef() and grad is only read. */
igrad_status_t igrad__select_ef(float *grad, float *residual, const igrad_select_spec_t *spec,
                                const char *name, igrad_select_ws_t *ws, igrad_selection_t *out,
                                int zero_grad);

#endif /* IGRAD_SELECT_INTERNAL_H */
