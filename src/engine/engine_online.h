/*
 * engine_online.h — online profiling state of an iad/ig engine and the
 * re-plan steps that engine_online.c (the switch, igrad_engine_set_profile)
 * and engine_state.c (loading a state whose plan came from another
 * profile) share, plus the hysteresis rule exposed for tests.
 *
 * Not here: the engine itself (engine_internal.h).
 */
#ifndef IGRAD_ENGINE_ONLINE_H
#define IGRAD_ENGINE_ONLINE_H

#include "engine/engine_internal.h"

typedef struct igrad__online {
    igrad_layout_t *layout;    /* copy of the engine's layout, for re-plans */
    char partition[IGRAD__ONLINE_PARTITION_NBYTES]; /* cfg.profile_partition's copy */
    int64_t W;                 /* config.profile_steps */
    int active;                /* recording the window; the plan is all-important */
    size_t nrec;               /* steps recorded so far (<= W) */
    int64_t *steps;            /* (W) step of each record */
    double *sumsq;             /* (W, ntensors) this rank's selection sum of squares */
    int64_t *count;            /* (W, ntensors) entries selected (0: not sent) */
    uint64_t *send, *recv;     /* window exchange: words, nranks * words */
    int leak_buffers;          /* the exchange timed out: MPI may still use them */
    igrad_profile_t *profile;  /* built or set profile (NULL: the create-time one) */
    int64_t switch_step;       /* first step planned with it, -1 before */
    int64_t replans;           /* re-plans so far */
    double gather_ms, build_ms; /* cost of the last switch: exchange, build + plan */
    /* periodic re-profiling (config.reprofile_every = Wr > 0) */
    int64_t Wr;                /* config.reprofile_every */
    size_t cap;                /* window rows allocated: max(W, Wr) */
    int reprof;                /* after the switch: recording a re-profiling window */
    int fixed;                 /* the profile's classes came from the hysteresis:
                                  a re-plan with target_ratio fits only kappa */
    double *held;              /* (ntensors) last selection's sum of squares per
                                  step it accumulated (sumsq / span) */
    int64_t *held_count;       /* (ntensors) its entry count */
    int64_t *last_sel;         /* (ntensors) step of the last selection, -1 none */
    unsigned char *pending;    /* (npend) profile entry crossed in the last window */
    size_t npend;              /* layout components */
    int64_t reprofiles, reprofile_replans, last_flips;
    double reprofile_ms;       /* cost of the last re-profile */
} igrad__online_t;

/* Builds, locally, an engine planned with `profile` from e's layout and
 * config, carrying e's step and call count (its items are what the ranks
 * must agree on). With config.target_ratio the profile is first fitted:
 * important set and kappa (igrad_target_fit), or with `fixed_classes`
 * (classes from the re-profiling hysteresis) kappa alone. */
igrad_status_t igrad__online_prepare(const igrad_engine_t *e, igrad_profile_t *profile,
                                     int fixed_classes, igrad_engine_t **out);

/* Swaps n's plan into e, keeping e's residuals, step, trace and exchange
 * buffer; e's online state records `profile` (taken) as the current one.
 * Frees the old plan, and the window unless re-profiling keeps recording
 * (then the window restarts empty; leaving the first window, the held
 * selections start from its last record). Cannot fail. */
void igrad__online_commit(igrad_engine_t *e, igrad_engine_t *n, igrad_profile_t *profile);

/* The hysteresis rule of re-profiling over n components: a component
 * changes class only when its score crosses tau by `margin` (important:
 * score < tau - margin; low: score >= tau + margin) in two consecutive
 * windows. important[] is the current class, pending[] (in/out) whether
 * the previous window crossed, out[] the new class. @return flips. */
int igrad__hysteresis_update(size_t n, const double *score, double tau, double margin,
                             const unsigned char *important, unsigned char *pending,
                             unsigned char *out);

#endif /* IGRAD_ENGINE_ONLINE_H */
