/*
 * profile_internal.h — what trace.c, profile.c and partition.c share with
 * each other and with the tests and fuzz targets: the trace's in-memory
 * representation, in-memory parsers and writers (so fuzzers and round-trip
 * tests need no files) and the parsed form of a partition method.
 * Not part of the public API; the public side is the "Activity trace and
 * importance profile" section of igrad.h.
 */
#ifndef IGRAD_PROFILE_INTERNAL_H
#define IGRAD_PROFILE_INTERNAL_H

#include "core/internal.h"

/* Largest trace CSV / profile JSON we read into memory. A trace of 10,000
 * steps x 1,000 components is about 600 MB of text. */
#define IGRAD__TRACE_MAX_NBYTES (1024u * 1024u * 1024u)
#define IGRAD__PROFILE_MAX_NBYTES (64u * 1024u * 1024u)

/* Steps and entry counts stay below 2^53 so that they are exact in the
 * profile JSON (JSON numbers are doubles to most readers) and step + 1
 * cannot overflow. */
#define IGRAD__MAX_EXACT_INT ((int64_t)1 << 53)

/* Why a trace can have no rows, for the messages of the loader and of
 * igrad_profile_build: only tensors that map to a component are traced. */
#define IGRAD__TRACE_NO_ROWS_HINT                                                                      \
    " (a trace has rows only for tensors that map to a component: if every traced "      \
    "tensor was unmapped, e.g. a custom model or PEFT/LoRA names the built-in rules do "  \
    "not know, no traced tensor mapped to a component; `igrad layout --unmapped MODEL` "   \
    "lists such tensors, and user rules map them: --map FILE (igrad train), "             \
    "IgradState(name_map=...) or Profiler(name_map=...))"

/* A trace is a dense [steps x components] table. Components are ordered by
 * (layer, kind). A trace made by igrad_trace_create() also knows which
 * component each layout tensor feeds (tensor_comp) and keeps the exact sum
 * of squares so that several tensors of one component add up before the
 * square root; a trace read from a file has the activities and raw values
 * (v1 files: raw derived as a[s,c] * sqrt(n_c)). */

struct igrad_trace {
    uint64_t layout_hash;   /* 0 = unknown (file without "# igrad-trace") */
    char sparsifier[32];    /* "unknown" until set */
    double density;         /* 0 = unknown */

    size_t ncomp;
    int *comp_layer;        /* (ncomp) */
    igrad_kind_t *comp_kind; /* (ncomp) */
    int64_t *comp_count;    /* (ncomp) n_c */
    int *comp_tensors;      /* (ncomp) tensors per component; 0 when loaded */

    size_t ntensors;        /* 0 for a loaded trace: it cannot record */
    int *tensor_comp;       /* (ntensors) component index or -1 for OTHER */

    size_t nsteps, cap_steps;
    int64_t *steps;         /* (nsteps) strictly increasing */
    double *activity;       /* (nsteps, ncomp) a[s,c] = raw / sqrt(n_c), d_activity */
    double *raw;            /* (nsteps, ncomp) sqrt(sum of retained v^2), raw_activity */
    int64_t *retained;      /* (nsteps, ncomp) */
    double *sumsq;          /* (nsteps, ncomp) recorded traces only, else NULL */
};

/* Trace CSV parser on a text in memory; `source` names it in messages
 * ("source:LINE: ..."). NULs in the text are rejected. */
igrad_status_t igrad__trace_from_text(const char *text, size_t nbytes, const char *source,
                                      igrad_trace_t **out);

/* Prints v into buf as the shortest of %.15g, %.16g, %.17g that reads back
 * to the same double (buf of at least 32 bytes). */
void igrad__format_exact_double(char *buf, size_t nbytes, double v);

/* The exact bytes igrad_trace_save() writes. *text is malloc'd and
 * NUL-terminated. */
igrad_status_t igrad__trace_to_text(const igrad_trace_t *trace, char **text, size_t *nbytes);

/* Profile JSON parser on a text in memory (same checks as
 * igrad_profile_load, `source` names it in messages). */
igrad_status_t igrad__profile_from_json_text(const char *text, size_t nbytes,
                                             const char *source, const igrad_layout_t *layout,
                                             igrad_profile_t **out);

/* The exact text igrad_profile_save_json() writes (malloc'd). */
igrad_status_t igrad__profile_to_json_text(const igrad_profile_t *profile, char **text);

/* Marks entry i important[i] with threshold tau; a score on the wrong side
 * of tau (a class the re-profiling hysteresis kept) is moved to the edge
 * of its class (tau, or the double below it), so that important = score
 * >= tau still holds and the profile's JSON reloads to the same classes.
 * tau is first clamped to 1 (above every score: igrad_target_fit's tau
 * when nothing fits) and, with a low entry, to at least the smallest
 * positive double, so that every score stays in [0, 1]. */
igrad_status_t igrad__profile_set_classes(igrad_profile_t *profile, double tau,
                                          const unsigned char *important);

/* A parsed partition method ("knee", "percentile:40", ...). */
typedef enum igrad__partition_kind {
    IGRAD__PARTITION_KNEE,
    IGRAD__PARTITION_OTSU,
    IGRAD__PARTITION_KMEANS2,
    IGRAD__PARTITION_GMM2,
    IGRAD__PARTITION_PERCENTILE,
    IGRAD__PARTITION_FIXED
} igrad__partition_kind_t;

typedef struct igrad__partition_method {
    igrad__partition_kind_t kind;
    double param; /* P for percentile (0..100), F for fixed (0, 1] */
} igrad__partition_method_t;

/* Parses a method string. IGRAD_E_INVALID names it when unknown or when its
 * parameter is malformed or out of range. */
igrad_status_t igrad__partition_parse(const char *method, igrad__partition_method_t *out);

/* Result of the two-Gaussian EM fit used by gmm2 (exposed for tests):
 * component 0 has the lower mean. */
typedef struct igrad__gmm2_fit {
    double mean[2], var[2], weight[2];
    int iterations;
} igrad__gmm2_fit_t;

/* Fits two Gaussians to n >= 2 values that are not all equal. */
igrad_status_t igrad__gmm2_fit(const double *x, size_t n, igrad__gmm2_fit_t *fit);

#endif /* IGRAD_PROFILE_INTERNAL_H */
