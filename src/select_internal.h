/*
 * select_internal.h — internals of select.c that tests (and later the
 * engine) may reach: a knob that forces the selection's threshold policy so
 * that the rare recovery paths (too few candidates, buffer overflow and
 * compaction) run on small inputs. Results never depend on the policy, only
 * the time does; the public API lives in include/igrad.h.
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

#endif /* IGRAD_SELECT_INTERNAL_H */
