/*
 * internal.h — helpers shared by the library's source files (not installed).
 *
 * Error recording (IGRAD_FAIL_IF / IGRAD_CHECK and their goto-cleanup
 * variants), 64-bit hashing, whole-file reading and crash-safe file writing.
 * Functions here use the igrad__ prefix: visible across the library's files,
 * hidden from its users (the shared library exports IGRAD_API and the few
 * that its plugins call: core/plugin.h).
 */
#ifndef IGRAD_INTERNAL_H
#define IGRAD_INTERNAL_H

#include "igrad.h"

#include <stdarg.h>
#include <stdio.h>

#if defined(__GNUC__)
#  define IGRAD__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#  define IGRAD__PRINTF(a, b)
#endif

/* Records a failure for igrad_last_error() ("message [file.c:line]") and
 * returns `status`, so it can be returned directly. */
igrad_status_t igrad__fail(igrad_status_t status, const char *file, int line,
                           const char *fmt, ...) IGRAD__PRINTF(4, 5);

/* Return early with a recorded error when `cond` holds. */
#define IGRAD_FAIL_IF(cond, status, ...)                                   \
    do {                                                                   \
        if (cond) return igrad__fail((status), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* Propagate a non-OK status (its message was recorded where it arose). */
#define IGRAD_CHECK(expr)                                                  \
    do {                                                                   \
        igrad_status_t igrad__s = (expr);                                  \
        if (igrad__s != IGRAD_OK) return igrad__s;                         \
    } while (0)

/* Variants for functions with a `igrad_status_t st` variable and a
 * `cleanup:` label that releases what was allocated so far. */
#define IGRAD_FAIL_GOTO(cond, status, ...)                                 \
    do {                                                                   \
        if (cond) {                                                        \
            st = igrad__fail((status), __FILE__, __LINE__, __VA_ARGS__);   \
            goto cleanup;                                                  \
        }                                                                  \
    } while (0)

#define IGRAD_CHECK_GOTO(expr)                                             \
    do {                                                                   \
        st = (expr);                                                       \
        if (st != IGRAD_OK) goto cleanup;                                  \
    } while (0)

/* Where a buffer lives: the data plane's memory (dp.h, `space`) and what
 * a communicator's collectives accept (comm_internal.h, `spaces`). */
typedef enum igrad__mem_space {
    IGRAD__MEM_HOST = 0,  /* ordinary host memory (the CPU data plane) */
    IGRAD__MEM_DEVICE = 1 /* a CUDA device's memory (dp_cuda*.cu, comm_nccl.c) */
} igrad__mem_space_t;
/* A set of memory spaces as a bit mask. */
#define IGRAD__MEM_BIT(space) (1u << (unsigned)(space))

static inline const char *igrad__mem_space_name(igrad__mem_space_t space)
{
    return space == IGRAD__MEM_HOST ? "host" : space == IGRAD__MEM_DEVICE ? "device" : "unknown";
}

/* FNV-1a, 64-bit. Chain calls by passing the previous result as `h`;
 * start from IGRAD__HASH_SEED. Stable across platforms and runs. */
#define IGRAD__HASH_SEED 0xcbf29ce484222325ULL
/* Milliseconds on a monotonic clock (step timings, collective deadlines). */
double igrad__now_ms(void);

uint64_t igrad__hash_bytes(uint64_t h, const void *data, size_t nbytes);
uint64_t igrad__hash_str(uint64_t h, const char *s);   /* includes the NUL */
uint64_t igrad__hash_i64(uint64_t h, int64_t v);       /* little-endian bytes */
uint64_t igrad__hash_f64(uint64_t h, double v);

/* Reads a whole file into a NUL-terminated buffer (malloc'd, *nbytes
 * excludes the NUL). Refuses files larger than max_nbytes with
 * IGRAD_E_FORMAT ("<path>: file is N bytes, more than the M allowed"). */
igrad_status_t igrad__read_file(const char *path, size_t max_nbytes, char **data,
                                size_t *nbytes);

/* Opens `path` for reading if it is a regular file (a FIFO, device or
 * directory is refused at once, never waited on: "<path>: not a regular
 * file"); *nbytes (may be NULL) is its size. */
igrad_status_t igrad__open_regular(const char *path, FILE **fp, uint64_t *nbytes);

/* Creates "<path>.tmp.<16 hex digits>" for writing with O_CREAT | O_EXCL |
 * O_NOFOLLOW (mode 0666 less the umask), trying other unpredictable names
 * while one exists, so that a link planted beside `path` is never followed.
 * Returns the descriptor and the name in *tmp_path (malloc'd), or -1 with
 * errno set. */
int igrad__create_private(const char *path, char **tmp_path);

/* Crash-safe writing: open a private temporary beside `path`
 * (igrad__create_private), write, then commit renames it over `path`
 * (fsync'd; a link at `path` is replaced, not followed), so a reader never
 * sees a half-written file. abort removes the temporary. */
typedef struct igrad__atomic_file {
    FILE *fp;
    char *final_path;
    char *tmp_path;
} igrad__atomic_file_t;
igrad_status_t igrad__atomic_open(igrad__atomic_file_t *af, const char *path);
igrad_status_t igrad__atomic_commit(igrad__atomic_file_t *af);
void igrad__atomic_abort(igrad__atomic_file_t *af);

/* 1 if a and b are equal ignoring ASCII case (locale-independent), else 0.
 * Used by every *_from_name parser. */
int igrad__name_equal(const char *a, const char *b);
/* 1 for EMB, HEAD and NORM: the kinds outside the projections (gated
 * like them; sent every step when the profile lacks them) (component.c). */
int igrad__kind_is_outer(igrad_kind_t kind);

/* igrad_target_fit for the profile's own important set (score >= its
 * tau): only kappa is chosen, out->tau is the profile's (target.c). */
igrad_status_t igrad__target_fit_kappa(const igrad_layout_t *layout,
                                       const igrad_profile_t *profile,
                                       const igrad_config_t *config, double target_ratio,
                                       double min_keep, igrad_target_fit_t *out);

/* strdup (NULL when out of memory). */
char *igrad__strdup(const char *s);

/* Returns a malloc'd string formatted like printf (NULL when out of memory). */
char *igrad__strprintf(const char *fmt, ...) IGRAD__PRINTF(1, 2);

#endif /* IGRAD_INTERNAL_H */
