/*
 * bench_comm.c — `igrad bench comm`: a message-size sweep of the
 * collectives the engine issues, for fitting the α-β model of `igrad plan`
 * per collective (experiments/plan_validation/run.py fits α, β from it):
 * allgather and allreduce (igrad_comm_iallgather, igrad_comm_iallreduce
 * F32 sum, + wait: the bucket collectives) and reduce and bcast (the hier
 * route's node sums and broadcasts: one MPI_Ireduce / MPI_Ibcast per
 * tensor, all in flight, owners spread over the ranks — here P of them,
 * the r-th rooted at rank r; the public comm API has no reduce or bcast).
 *
 * With --ranks-per-node L every collective runs inside groups of L
 * consecutive ranks ("nodes"), all groups at once — the intra level as the
 * engine's node step meets it, other nodes' ranks busy beside it. With
 * --across-nodes as well, the groups are instead the N ranks that share a
 * local rank, one per node, all L groups at once — the hier route's shard
 * exchange (L rings sharing each node's link).
 *
 * For every size, --warmup untimed calls, then --reps calls each after a
 * world barrier; a call's time is the slowest rank's, and the median over calls
 * is reported. Sizes are bytes: for allgather the bytes each rank sends
 * (it receives P times that), for the others the F32 vector's bytes (reduce
 * and bcast: all P pieces together). Must run under mpirun (one rank has
 * nothing to time). Timings are never asserted.
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
            "usage: mpirun -np P igrad bench comm [--sizes B,B,...] [--ops LIST] [--reps N]\n"
            "                                    [--warmup N] [--node-pieces K]\n"
            "                                    [--ranks-per-node L [--across-nodes]] [--json]\n"
            "  --sizes   message sizes in bytes (allgather: per rank; the others: the\n"
            "            F32 vector, a multiple of 4); default 1024,4096,...,4194304\n"
            "  --ops     collectives to sweep (allgather,allreduce,reduce,bcast): reduce\n"
            "            and bcast are P in-flight MPI_Ireduce / MPI_Ibcast of 1/P of\n"
            "            the vector each, the r-th rooted at rank r (hier's node step);\n"
            "            also allreduce_in_place (igrad_comm_iallreduce with send == recv,\n"
            "            as the engine's reduce buckets) and mpi_allreduce_in_place\n"
            "            (MPI_Iallreduce with MPI_IN_PLACE, which igrad avoids on Open MPI)\n"
            "  --node-pieces K  reduce and bcast cut the vector into K pieces (default P),\n"
            "            piece k rooted at rank k mod P, all in flight\n"
            "  --ranks-per-node L  run every collective inside groups of L consecutive\n"
            "            ranks, all groups at once (default: one group of all ranks)\n"
            "  --across-nodes  with --ranks-per-node L: groups of the ranks that share a\n"
            "            local rank, one per node (hier's shard exchange), all at once\n"
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

enum { OP_ALLGATHER, OP_ALLREDUCE, OP_REDUCE, OP_BCAST, OP_ALLREDUCE_IN_PLACE,
       OP_MPI_ALLREDUCE_IN_PLACE, NOPS };
static const char *const op_names[NOPS] = {"allgather", "allreduce", "reduce", "bcast",
                                           "allreduce_in_place", "mpi_allreduce_in_place"};

static int parse_ops(const char *text, int *on)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    for (int k = 0; k < NOPS; k++) on[k] = 0;
    int any = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < NOPS && strcmp(tok, op_names[k])) k++;
        if (k == NOPS) {
            fprintf(stderr, "igrad: bench comm: --ops: '%s' is not a collective (allgather, "
                            "allreduce, reduce, bcast, allreduce_in_place, "
                            "mpi_allreduce_in_place)\n", tok);
            return -1;
        }
        on[k] = any = 1;
    }
    if (!any) {
        fprintf(stderr, "igrad: bench comm: --ops is empty\n");
        return -1;
    }
    return 0;
}

#ifdef IGRAD_HAVE_MPI
/* The hier node step's pattern: K reduces (or broadcasts) in flight, the
 * F32 vector cut into K equal pieces, piece k rooted at rank k mod P
 * (K = P by default; the engine issues one per tensor piece). */
static int node_collectives(MPI_Comm group, int reduce, size_t nbytes, char *send, char *recv,
                            int P, int K, MPI_Request *reqs)
{
    size_t n = nbytes / 4, off = 0;
    for (int k = 0; k < K; k++) {
        int cnt = (int)(n / (size_t)K + ((size_t)k < n % (size_t)K));
        int root = k % P;
        int rc = reduce ? MPI_Ireduce(send + 4 * off, recv + 4 * off, cnt, MPI_FLOAT, MPI_SUM,
                                      root, group, &reqs[k])
                        : MPI_Ibcast(recv + 4 * off, cnt, MPI_FLOAT, root, group, &reqs[k]);
        if (rc != MPI_SUCCESS) return -1;
        off += (size_t)cnt;
    }
    return MPI_Waitall(K, reqs, MPI_STATUSES_IGNORE) == MPI_SUCCESS ? 0 : -1;
}

/* Median over reps of the slowest rank's time (ms) of one collective. */
static int time_collective(igrad_comm_t *comm, MPI_Comm group, int op, size_t nbytes,
                           char *send, char *recv, MPI_Request *reqs, int pieces, int reps,
                           int warmup, double *median_ms)
{
    double *t = calloc((size_t)reps, sizeof *t);
    if (!t) {
        fprintf(stderr, "igrad: bench comm: out of memory\n");
        return -1;
    }
    for (int r = -warmup; r < reps; r++) {
        igrad_comm_request_t *req = NULL;
        igrad_status_t st = MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS ? IGRAD_OK : IGRAD_E_COMM;
        double t0 = MPI_Wtime();
        if (st == IGRAD_OK && (op == OP_REDUCE || op == OP_BCAST)) {
            if (node_collectives(group, op == OP_REDUCE, nbytes, send, recv,
                                 igrad_comm_size(comm), pieces, reqs)) {
                free(t);
                fprintf(stderr, "igrad: bench comm: MPI_I%s failed\n", op_names[op]);
                return -1;
            }
        } else if (st == IGRAD_OK && op == OP_MPI_ALLREDUCE_IN_PLACE) {
            if (MPI_Iallreduce(MPI_IN_PLACE, recv, (int)(nbytes / 4), MPI_FLOAT, MPI_SUM, group,
                               &reqs[0]) != MPI_SUCCESS ||
                MPI_Wait(&reqs[0], MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                free(t);
                fprintf(stderr, "igrad: bench comm: MPI_Iallreduce failed\n");
                return -1;
            }
        } else if (st == IGRAD_OK && op == OP_ALLREDUCE_IN_PLACE) {
            st = igrad_comm_iallreduce(comm, recv, recv, nbytes / 4, IGRAD_DTYPE_F32,
                                       IGRAD_REDUCE_SUM, &req);
            if (st == IGRAD_OK) st = igrad_comm_wait(comm, req);
        } else if (st == IGRAD_OK) {
            st = op == OP_ALLREDUCE ? igrad_comm_iallreduce(comm, send, recv, nbytes / 4,
                                                            IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM,
                                                            &req)
                                    : igrad_comm_iallgather(comm, send, nbytes, recv, &req);
            if (st == IGRAD_OK) st = igrad_comm_wait(comm, req);
        }
        double ms = (MPI_Wtime() - t0) * 1e3;
        if (st != IGRAD_OK) {
            free(t);
            return cli_fail(op_names[op], st);
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
    int64_t sizes[MAX_SIZES], reps = 15, warmup = 2, per_node = 0, pieces = 0;
    int nsizes = 0, json = 0, across = 0, on[NOPS] = {1, 1, 1, 1, 0, 0};
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
        } else if (!strcmp(argv[i], "--across-nodes")) {
            across = 1;
        } else if ((r = cli_opt(argc, argv, &i, "--sizes", &v)) != 0) {
            if (r < 0 || parse_sizes(v, sizes, &nsizes) < 0) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--ops", &v)) != 0) {
            if (r < 0 || parse_ops(v, on) < 0) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--ranks-per-node", &v)) != 0) {
            if (r < 0 || cli_parse_i64("--ranks-per-node", v, &per_node) < 0) return 2;
            if (per_node < 1) {
                fprintf(stderr, "igrad: bench comm: --ranks-per-node is %lld (must be >= 1)\n",
                        (long long)per_node);
                return 2;
            }
        } else if ((r = cli_opt(argc, argv, &i, "--node-pieces", &v)) != 0) {
            if (r < 0 || cli_parse_i64("--node-pieces", v, &pieces) < 0) return 2;
            if (pieces < 1 || pieces > 65536) {
                fprintf(stderr, "igrad: bench comm: --node-pieces is %lld (must be in [1, "
                                "65536])\n", (long long)pieces);
                return 2;
            }
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
    if (across && per_node < 1) {
        fprintf(stderr, "igrad: bench comm: --across-nodes needs --ranks-per-node L\n");
        return 2;
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
    int wrank = 0, wsize = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    if (per_node > 0 && (per_node < 2 || wsize % per_node != 0)) {
        if (wrank == 0)
            fprintf(stderr, "igrad: bench comm: --ranks-per-node %lld: the %d ranks do not form "
                            "groups of at least 2 of that size\n", (long long)per_node, wsize);
        MPI_Finalize();
        return 2;
    }
    if (across && wsize / per_node < 2) {
        if (wrank == 0)
            fprintf(stderr, "igrad: bench comm: --across-nodes: the %d ranks form one node of "
                            "%lld: nothing crosses nodes\n", wsize, (long long)per_node);
        MPI_Finalize();
        return 2;
    }
    MPI_Comm group = MPI_COMM_WORLD;
    if (per_node > 0)
        MPI_Comm_split(MPI_COMM_WORLD, across ? wrank % (int)per_node : wrank / (int)per_node,
                       wrank, &group);
    igrad_comm_t *comm = NULL;
    igrad_status_t st = igrad_comm_create_mpi(&group, &comm);
    if (st != IGRAD_OK) {
        fprintf(stderr, "igrad: bench comm: communicator: %s\n", igrad_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    int rank = wrank, P = igrad_comm_size(comm), rc = 0;
    int64_t maxb = 0;
    for (int k = 0; k < nsizes; k++) maxb = sizes[k] > maxb ? sizes[k] : maxb;
    char *send = calloc((size_t)maxb, 1), *recv = calloc((size_t)maxb * (size_t)P, 1);
    int K = pieces > 0 ? (int)pieces : P;
    MPI_Request *reqs = calloc((size_t)(K > 1 ? K : 1), sizeof *reqs);
    if (!send || !recv || !reqs) {
        fprintf(stderr, "igrad: bench comm: out of memory for %lld-byte buffers\n",
                (long long)maxb);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* rank 0's group as MPI formed it: its members' world ranks, in order */
    int *members = calloc((size_t)P, sizeof *members), *in = calloc((size_t)P, sizeof *in);
    if (!members || !in) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Group g, w;
    MPI_Comm_group(group, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &w);
    for (int r = 0; r < P; r++) in[r] = r;
    MPI_Group_translate_ranks(g, P, in, w, members);
    MPI_Group_free(&g);
    MPI_Group_free(&w);
    free(in);
    if (rank == 0) {
        if (json) {
            printf("{\"ranks\": %d, \"group_ranks\": %d, \"group_of_rank0\": [", wsize, P);
            for (int r = 0; r < P; r++) printf("%s%d", r ? ", " : "", members[r]);
            printf("], \"reps\": %lld, \"rows\": [", (long long)reps);
        }
        else printf("# igrad bench comm: %d ranks, collectives over groups of %d, median of "
                    "%lld calls (slowest rank)\n%-22s %12s %12s\n", wsize, P, (long long)reps,
                    "op", "bytes", "ms");
    }
    int nrows = 0;
    for (int op = 0; op < NOPS && rc == 0; op++) {
        for (int k = 0; on[op] && k < nsizes && rc == 0; k++) {
            double ms = 0;
            rc = time_collective(comm, group, op, (size_t)sizes[k], send, recv, reqs, K,
                                 (int)reps, (int)warmup, &ms);
            if (rc == 0 && rank == 0) {
                if (json) printf("%s{\"op\": \"%s\", \"bytes\": %lld, \"ms\": %.6f}",
                                 nrows ? ", " : "", op_names[op], (long long)sizes[k], ms);
                else printf("%-22s %12lld %12.4f\n", op_names[op], (long long)sizes[k], ms);
                fflush(stdout);
            }
            nrows++;
        }
    }
    if (rank == 0 && json && rc == 0) printf("]}\n");
    free(send);
    free(recv);
    free(reqs);
    free(members);
    igrad_comm_free(comm);
    if (group != MPI_COMM_WORLD) MPI_Comm_free(&group);
    MPI_Finalize();
    return rc ? 1 : 0;
#endif
}
