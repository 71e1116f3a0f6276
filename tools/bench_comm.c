/*
 * bench_comm.c — `igrad bench comm`: a message-size sweep of the two
 * collectives the engine issues (igrad_comm_iallgather + wait,
 * igrad_comm_iallreduce F32 sum + wait) over MPI, for fitting the α-β model
 * of `igrad plan` (experiments/plan_validation/run.py fits α, β from it).
 *
 * For every size, --warmup untimed calls, then --reps calls each after a
 * barrier; a call's time is the slowest rank's, and the median over calls
 * is reported. Sizes are bytes: for allgather the bytes each rank sends
 * (it receives P times that), for allreduce the vector's bytes. Must run
 * under mpirun (one rank has nothing to time). Timings are never asserted.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef IGRAD_HAVE_MPI
#include <mpi.h>
#endif

#include "cli.h"
#include "bench_stats.h"

#define MAX_SIZES 64

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np P igrad bench comm [--sizes B,B,...] [--reps N] [--warmup N]\n"
            "                                    [--json]\n"
            "  --sizes   message sizes in bytes (allgather: per rank; allreduce: the\n"
            "            F32 vector, a multiple of 4); default 1024,4096,...,4194304\n"
            "  --reps    timed calls per size and collective (default 15)\n"
            "  --warmup  untimed calls first (default 2)\n"
            "  --json    one JSON object instead of the table\n");
}

static int parse_sizes(const char *text, int64_t *sizes, int *n)
{
    char buf[1024];
    if (strlen(text) >= sizeof buf) {
        fprintf(stderr, "igrad: bench comm: --sizes is too long\n");
        return -1;
    }
    strcpy(buf, text);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_SIZES) {
            fprintf(stderr, "igrad: bench comm: --sizes: more than %d sizes\n", MAX_SIZES);
            return -1;
        }
        int64_t v;
        if (cli_parse_i64("--sizes", tok, &v) < 0) return -1;
        if (v < 4 || v % 4) {
            fprintf(stderr, "igrad: bench comm: --sizes: %lld is not a positive multiple of 4\n",
                    (long long)v);
            return -1;
        }
        sizes[(*n)++] = v;
    }
    if (*n == 0) {
        fprintf(stderr, "igrad: bench comm: --sizes is empty\n");
        return -1;
    }
    return 0;
}

#ifdef IGRAD_HAVE_MPI
/* Median over reps of the slowest rank's time (ms) of one collective. */
static int time_collective(igrad_comm_t *comm, int allreduce, size_t nbytes, void *send,
                           void *recv, int reps, int warmup, double *median_ms)
{
    double *t = calloc((size_t)reps, sizeof *t);
    if (!t) {
        fprintf(stderr, "igrad: bench comm: out of memory\n");
        return -1;
    }
    for (int r = -warmup; r < reps; r++) {
        igrad_comm_request_t *req = NULL;
        igrad_status_t st = igrad_comm_barrier(comm);
        double t0 = MPI_Wtime();
        if (st == IGRAD_OK)
            st = allreduce ? igrad_comm_iallreduce(comm, send, recv, nbytes / 4,
                                                   IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM, &req)
                           : igrad_comm_iallgather(comm, send, nbytes, recv, &req);
        if (st == IGRAD_OK) st = igrad_comm_wait(comm, req);
        double ms = (MPI_Wtime() - t0) * 1e3;
        if (st != IGRAD_OK) {
            free(t);
            return cli_fail(allreduce ? "allreduce" : "allgather", st);
        }
        MPI_Allreduce(MPI_IN_PLACE, &ms, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r >= 0) t[r] = ms;
    }
    *median_ms = bench_median(t, reps);
    free(t);
    return 0;
}
#endif

int bench_comm(int argc, char **argv)
{
    int64_t sizes[MAX_SIZES], reps = 15, warmup = 2;
    int nsizes = 0, json = 0;
    for (int64_t s = 1024; s <= 4194304; s *= 4) sizes[nsizes++] = s;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if ((r = cli_opt(argc, argv, &i, "--sizes", &v)) != 0) {
            if (r < 0 || parse_sizes(v, sizes, &nsizes) < 0) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--reps", &v)) != 0) {
            if (r < 0 || cli_parse_i64("--reps", v, &reps) < 0) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--warmup", &v)) != 0) {
            if (r < 0 || cli_parse_i64("--warmup", v, &warmup) < 0) return 2;
        } else {
            fprintf(stderr, "igrad: bench comm: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (reps < 1 || reps > 100000 || warmup < 0 || warmup > 100000) {
        fprintf(stderr, "igrad: bench comm: --reps must be in [1, 100000] and --warmup in "
                        "[0, 100000]\n");
        return 2;
    }
#ifndef IGRAD_HAVE_MPI
    (void)json;
    fprintf(stderr, "igrad: bench comm: this igrad was built without MPI\n");
    return 1;
#else
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
    if (!ws) ws = getenv("PMI_SIZE");
    if (!ws || atoi(ws) < 2) {
        fprintf(stderr, "igrad: bench comm: run it under mpirun with at least 2 ranks\n");
        return 2;
    }
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, "igrad: bench comm: MPI_Init failed\n");
        return 1;
    }
    igrad_comm_t *comm = NULL;
    igrad_status_t st = igrad_comm_create_mpi(NULL, &comm);
    if (st != IGRAD_OK) {
        fprintf(stderr, "igrad: bench comm: communicator: %s\n", igrad_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    int rank = igrad_comm_rank(comm), P = igrad_comm_size(comm), rc = 0;
    int64_t maxb = 0;
    for (int k = 0; k < nsizes; k++) maxb = sizes[k] > maxb ? sizes[k] : maxb;
    char *send = calloc((size_t)maxb, 1), *recv = calloc((size_t)maxb * (size_t)P, 1);
    if (!send || !recv) {
        fprintf(stderr, "igrad: bench comm: out of memory for %lld-byte buffers\n",
                (long long)maxb);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) {
        if (json) printf("{\"ranks\": %d, \"reps\": %lld, \"rows\": [", P, (long long)reps);
        else printf("# igrad bench comm: P = %d, median of %lld calls (slowest rank)\n"
                    "%-10s %12s %12s\n", P, (long long)reps, "op", "bytes", "ms");
    }
    for (int op = 0; op < 2 && rc == 0; op++) {
        for (int k = 0; k < nsizes && rc == 0; k++) {
            double ms = 0;
            rc = time_collective(comm, op, (size_t)sizes[k], send, recv, (int)reps,
                                 (int)warmup, &ms);
            if (rc == 0 && rank == 0) {
                const char *name = op ? "allreduce" : "allgather";
                if (json) printf("%s{\"op\": \"%s\", \"bytes\": %lld, \"ms\": %.6f}",
                                 op + k ? ", " : "", name, (long long)sizes[k], ms);
                else printf("%-10s %12lld %12.4f\n", name, (long long)sizes[k], ms);
                fflush(stdout);
            }
        }
    }
    if (rank == 0 && json && rc == 0) printf("]}\n");
    free(send);
    free(recv);
    igrad_comm_free(comm);
    MPI_Finalize();
    return rc ? 1 : 0;
#endif
}
