/*
 * mpi_util.h — what the MPI tests (tests/mpi_*.c) share: the rank and size
 * in MPI_COMM_WORLD, a failure count the test sums over ranks at the end,
 * checks that print the rank and the library's message, and REQUIRE for
 * setup failures, which aborts every rank rather than hang, and the
 * splitmix64 mixer the tests draw their data from. Include after <mpi.h>,
 * <stdio.h> and "igrad.h"; set `me` and `np` after MPI_Init.
 */
#ifndef IGRAD_MPI_UTIL_H
#define IGRAD_MPI_UTIL_H

static int failures;
static int me, np;

#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            failures++;                                                                \
            fprintf(stderr, "[rank %d] %s:%d: %s: ", me, __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
        }                                                                              \
    } while (0)

#define CHECK_STATUS(call, want)                                                       \
    do {                                                                               \
        igrad_status_t s_ = (call);                                                    \
        CHECK(s_ == (want), "%s returned %d (%s), expected %d; last error: %s", #call, \
              (int)s_, igrad_status_str(s_), (int)(want), igrad_last_error());         \
    } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, IGRAD_OK)

/* Unrecoverable setup failure: abort every rank rather than hang. */
#define REQUIRE(cond)                                                                   \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "[rank %d] %s:%d: required: %s (%s)\n", me, __FILE__, __LINE__, \
                    #cond, igrad_last_error());                                         \
            MPI_Abort(MPI_COMM_WORLD, 2);                                               \
        }                                                                               \
    } while (0)

/* splitmix64: deterministic test data from (rank, step, tensor, index). */
static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

#endif /* IGRAD_MPI_UTIL_H */
