/*
 * mpi_comm.c — the MPI communicator backend under mpirun (CTest runs it
 * with -np 2 and -np 4): allgather of rank-dependent bytes of several
 * sizes, allreduce sum/max/min over F32/F64/I64 against values computed
 * here, in place, bcast from every root, many non-blocking operations in
 * flight waited out of order, messages cut into pieces (max count lowered
 * through a test hook), MPI errors returned as IGRAD_E_COMM, and the
 * duplicated communicator keeping igrad's traffic apart from the caller's.
 * The same operations again on a comm with a timeout (every operation then
 * runs non-blocking, polled), and a rank joining an allgather 3 s late:
 * the others get IGRAD_E_TIMEOUT after the 1 s limit, the comm refuses
 * everything afterwards, and the abandoned allgather still completes when
 * the late rank joins it.
 *
 * Every check runs on every rank and only counts failures, so no rank
 * leaves a collective early; the counts are summed at the end and every
 * rank exits nonzero if any check failed anywhere.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <inttypes.h>
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h" /* test hooks; tests link the static library */
#include "igrad.h"

static int failures;
static int me, np; /* rank and size in MPI_COMM_WORLD */

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            failures++;                                                         \
            fprintf(stderr, "[rank %d] %s:%d: %s: ", me, __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

#define CHECK_STATUS(call, want)                                                \
    do {                                                                        \
        igrad_status_t s_ = (call);                                             \
        CHECK(s_ == (want), "%s returned %d (%s), expected %d; last error: %s", #call, \
              (int)s_, igrad_status_str(s_), (int)(want), igrad_last_error());  \
    } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, IGRAD_OK)

static unsigned char pattern(int rank, size_t i, int salt)
{
    return (unsigned char)((unsigned)rank * 37u + i * 11u + (unsigned)salt * 5u + 3u);
}

/* Checks every rank's block of an allgather result and the guard bytes
 * after it; reports the first bad byte only. */
static void check_gathered(const unsigned char *recv, size_t nbytes, int size, int salt,
                           const char *what)
{
    for (int r = 0; r < size; r++) {
        for (size_t i = 0; i < nbytes; i++) {
            unsigned char got = recv[(size_t)r * nbytes + i], want = pattern(r, i, salt);
            if (got != want) {
                CHECK(got == want, "%s nbytes %zu: block of rank %d byte %zu is %u, expected %u",
                      what, nbytes, r, i, got, want);
                return;
            }
        }
    }
    for (size_t i = 0; i < 8; i++)
        CHECK(recv[(size_t)size * nbytes + i] == 0xEE, "%s nbytes %zu: wrote past the end",
              what, nbytes);
}

/* Sizes up to max_nbytes from {0, 1, 3, 7, 64, 1001, 65537}. */
static void test_allgather(igrad_comm_t *comm, size_t max_nbytes, int salt, const char *what)
{
    static const size_t sizes[] = {0, 1, 3, 7, 64, 1001, 65537};
    int rank = igrad_comm_rank(comm), size = igrad_comm_size(comm);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0] && sizes[s] <= max_nbytes; s++) {
        size_t n = sizes[s];
        unsigned char *send = malloc(n + 1), *recv = malloc((size_t)size * n + 8);
        if (!send || !recv) abort();
        for (size_t i = 0; i < n; i++) send[i] = pattern(rank, i, salt);
        memset(recv, 0xEE, (size_t)size * n + 8);
        CHECK_OK(igrad_comm_allgather(comm, send, n, recv));
        check_gathered(recv, n, size, salt, what);

        /* in place: this rank's block is already in recv */
        memset(recv, 0xEE, (size_t)size * n + 8);
        memcpy(recv + (size_t)rank * n, send, n);
        CHECK_OK(igrad_comm_allgather(comm, recv + (size_t)rank * n, n, recv));
        check_gathered(recv, n, size, salt, what);
        free(send);
        free(recv);
    }
}

/* Value of element i on rank r for the reduction tests; exact in every
 * dtype so sums do not depend on the summation order. */
static double value(int r, size_t i, int dtype_salt)
{
    return (double)(r + 1) * ((double)(i % 17) - 8.0) * 0.5 + dtype_salt * 0.25 * (double)r;
}

static double value_maxmin(int r, size_t i, int size)
{
    return (double)((i + (size_t)r * 7) % (size_t)size) * 1000.0 - (double)i;
}

static int64_t value_i64(int r, size_t i)
{
    /* beyond 2^53, so a reduction through double would be caught */
    return ((int64_t)1 << 55) * (r % 3 - 1) + (int64_t)i * (r + 1) - 7;
}

static void test_allreduce(igrad_comm_t *comm, size_t n, const char *what)
{
    int rank = igrad_comm_rank(comm), size = igrad_comm_size(comm);
    float *f = malloc(n * sizeof *f + 1), *fr = malloc(n * sizeof *fr + 1);
    double *d = malloc(n * sizeof *d + 1), *dr = malloc(n * sizeof *dr + 1);
    int64_t *q = malloc(n * sizeof *q + 1), *qr = malloc(n * sizeof *qr + 1);
    if (!f || !fr || !d || !dr || !q || !qr) abort();

    for (int o = 0; o < 3; o++) {
        igrad_reduce_op_t op = (igrad_reduce_op_t)o;
        for (int in_place = 0; in_place < 2; in_place++) {
            for (size_t i = 0; i < n; i++) {
                f[i] = (float)(op == IGRAD_REDUCE_SUM ? value(rank, i, 1)
                                                      : value_maxmin(rank, i, size));
                d[i] = op == IGRAD_REDUCE_SUM ? value(rank, i, 2) : value_maxmin(rank, i, size);
                q[i] = value_i64(rank, i);
            }
            float *fo = in_place ? f : fr;
            double *dout = in_place ? d : dr;
            int64_t *qo = in_place ? q : qr;
            CHECK_OK(igrad_comm_allreduce(comm, f, fo, n, IGRAD_DTYPE_F32, op));
            CHECK_OK(igrad_comm_allreduce(comm, d, dout, n, IGRAD_DTYPE_F64, op));
            CHECK_OK(igrad_comm_allreduce(comm, q, qo, n, IGRAD_DTYPE_I64, op));
            int bad = 0;
            for (size_t i = 0; i < n && bad < 3; i++) {
                double fw = 0, dw = 0;
                int64_t qw = op == IGRAD_REDUCE_SUM ? 0 : value_i64(0, i);
                for (int r = 0; r < size; r++) {
                    double fv = op == IGRAD_REDUCE_SUM ? value(r, i, 1) : value_maxmin(r, i, size);
                    double dv = op == IGRAD_REDUCE_SUM ? value(r, i, 2) : value_maxmin(r, i, size);
                    int64_t qv = value_i64(r, i);
                    if (op == IGRAD_REDUCE_SUM) {
                        fw += fv, dw += dv, qw += qv;
                    } else if (r == 0) {
                        fw = fv, dw = dv;
                    } else if (op == IGRAD_REDUCE_MAX) {
                        fw = fv > fw ? fv : fw, dw = dv > dw ? dv : dw, qw = qv > qw ? qv : qw;
                    } else {
                        fw = fv < fw ? fv : fw, dw = dv < dw ? dv : dw, qw = qv < qw ? qv : qw;
                    }
                }
                if ((double)fo[i] != fw || dout[i] != dw || qo[i] != qw) bad++;
                CHECK((double)fo[i] == fw, "%s F32 op %d in_place %d [%zu]: %.9g, expected %.9g",
                      what, o, in_place, i, (double)fo[i], fw);
                CHECK(dout[i] == dw, "%s F64 op %d in_place %d [%zu]: %.17g, expected %.17g",
                      what, o, in_place, i, dout[i], dw);
                CHECK(qo[i] == qw, "%s I64 op %d in_place %d [%zu]: %" PRId64 ", expected %" PRId64,
                      what, o, in_place, i, qo[i], qw);
            }
        }
    }
    free(f), free(fr), free(d), free(dr), free(q), free(qr);
}

static void test_bcast(igrad_comm_t *comm, size_t n, const char *what)
{
    int rank = igrad_comm_rank(comm), size = igrad_comm_size(comm);
    unsigned char *buf = malloc(n + 1);
    if (!buf) abort();
    for (int root = 0; root < size; root++) {
        for (size_t i = 0; i < n; i++) buf[i] = rank == root ? pattern(root, i, 9) : 0xCC;
        CHECK_OK(igrad_comm_bcast(comm, buf, n, root));
        for (size_t i = 0; i < n; i++) {
            if (buf[i] != pattern(root, i, 9)) {
                CHECK(buf[i] == pattern(root, i, 9), "%s nbytes %zu root %d: byte %zu is %u", what,
                      n, root, i, buf[i]);
                break;
            }
        }
    }
    free(buf);
}

/* Many operations in flight at once, completed in an order unrelated to
 * the issue order, some polled with test first. */
static void test_pipelined(igrad_comm_t *comm, const char *what)
{
    enum { K = 24 };
    int rank = igrad_comm_rank(comm), size = igrad_comm_size(comm);
    unsigned char *send[K], *recv[K];
    float *red[K];
    size_t len[K];
    igrad_comm_request_t *req[K];
    for (int k = 0; k < K; k++) {
        len[k] = (size_t)(k * 211 % 5003) + (size_t)k;
        if (k == 21) len[k] = 20000; /* 80 KB in place: Open MPI's send copy */
        send[k] = recv[k] = NULL;
        red[k] = NULL;
        if (k % 2 == 0) {
            send[k] = malloc(len[k] + 1);
            recv[k] = malloc((size_t)size * len[k] + 8);
            if (!send[k] || !recv[k]) abort();
            for (size_t i = 0; i < len[k]; i++) send[k][i] = pattern(rank, i, k);
            memset(recv[k], 0xEE, (size_t)size * len[k] + 8);
            CHECK_OK(igrad_comm_iallgather(comm, send[k], len[k], recv[k], &req[k]));
        } else {
            red[k] = malloc(len[k] * sizeof(float) + 1);
            if (!red[k]) abort();
            for (size_t i = 0; i < len[k]; i++) red[k][i] = (float)value(rank, i + (size_t)k, 0);
            CHECK_OK(igrad_comm_iallreduce(comm, red[k], red[k], len[k], IGRAD_DTYPE_F32,
                                           IGRAD_REDUCE_SUM, &req[k]));
        }
    }
    /* poll a few: test must never block nor complete a request twice */
    for (int k = 1; k < K; k += 5) {
        int done = -1;
        CHECK_OK(igrad_comm_test(comm, req[k], &done));
        CHECK(done == 0 || done == 1, "test set done to %d", done);
    }
    int order[K], m = 0;
    for (int k = K - 1; k >= 0; k -= 3) order[m++] = k;
    for (int k = 0; k < K; k++)
        if ((K - 1 - k) % 3 != 0) order[m++] = k;
    for (int j = 0; j < K; j++) CHECK_OK(igrad_comm_wait(comm, req[order[j]]));
    CHECK(comm->pending == 0, "%" PRId64 " requests still pending", comm->pending);

    for (int k = 0; k < K; k++) {
        if (k % 2 == 0) {
            check_gathered(recv[k], len[k], size, k, what);
        } else {
            for (size_t i = 0; i < len[k]; i++) {
                double want = 0;
                for (int r = 0; r < size; r++) want += value(r, i + (size_t)k, 0);
                if ((double)red[k][i] != want) {
                    CHECK((double)red[k][i] == want, "%s iallreduce %d [%zu]: %.9g, expected %.9g",
                          what, k, i, (double)red[k][i], want);
                    break;
                }
            }
        }
        free(send[k]), free(recv[k]), free(red[k]);
    }
}

/* The seams of a device backend on MPI: host memory only (device buffers
 * refused, naming the comm), a stream accepted and ignored, groups that
 * are no-ops (MPI has no hooks), so requests inside one complete as
 * usual. Every rank takes the same path: a refusal is local, before MPI. */
static void test_device_seams(igrad_comm_t *comm)
{
    int rank = igrad_comm_rank(comm), size = igrad_comm_size(comm);
    CHECK(comm->spaces == IGRAD__MEM_BIT(IGRAD__MEM_HOST), "spaces 0x%x", comm->spaces);
    CHECK(!comm->vt->group_start && !comm->vt->group_end, "MPI has group hooks");
    unsigned char send[40], recv[64 * 40 + 8]; /* at most 64 ranks, 8 guard bytes */
    for (size_t i = 0; i < sizeof send; i++) send[i] = pattern(rank, i, 7);
    memset(recv, 0xEE, sizeof recv);
    igrad_comm_request_t *req = NULL;
    CHECK_STATUS(igrad__comm_iallgather(comm, send, sizeof send, recv, IGRAD__MEM_DEVICE, NULL,
                                        &req),
                 IGRAD_E_UNSUPPORTED);
    const char *msg = igrad_last_error();
    CHECK(strstr(msg, "communicator 'mpi' cannot take device buffers") != NULL,
          "message \"%s\"", msg);
    CHECK(req == NULL && comm->pending == 0, "a refused request was issued");

    int queue = 0, done = 0;
    float x = (float)(rank + 1);
    igrad_comm_request_t *r2 = NULL;
    CHECK_OK(igrad__comm_group_start(comm));
    CHECK_OK(igrad__comm_iallgather(comm, send, sizeof send, recv, IGRAD__MEM_HOST, &queue,
                                    &req));
    CHECK_OK(igrad__comm_iallreduce(comm, &x, &x, 1, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM,
                                    IGRAD__MEM_HOST, NULL, &r2));
    CHECK_OK(igrad_comm_test(comm, r2, &done));
    CHECK_OK(igrad_comm_wait(comm, r2)); /* no hooks: waiting inside is fine */
    CHECK_OK(igrad__comm_group_end(comm));
    CHECK_OK(igrad_comm_wait(comm, req));
    CHECK_STATUS(igrad__comm_group_end(comm), IGRAD_E_STATE);
    check_gathered(recv, sizeof send, size, 7, "allgather in a group");
    CHECK(x == (float)size * (float)(size + 1) / 2.0f, "allreduce in a group: %g", (double)x);
}

/* igrad's traffic runs on a duplicate: congruent with, but not the same
 * as, the caller's communicator, with its own error handler. */
static void test_isolation(igrad_comm_t *comm)
{
    MPI_Comm dup = MPI_COMM_NULL;
    CHECK_OK(igrad__comm_mpi_handle(comm, &dup));
    int cmp = -1;
    MPI_Comm_compare(dup, MPI_COMM_WORLD, &cmp);
    CHECK(cmp == MPI_CONGRUENT, "MPI_Comm_compare(dup, world) = %d, expected MPI_CONGRUENT %d",
          cmp, MPI_CONGRUENT);
    MPI_Errhandler eh_dup, eh_world;
    MPI_Comm_get_errhandler(dup, &eh_dup);
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh_world);
    CHECK(eh_dup == MPI_ERRORS_RETURN, "the duplicate's error handler is not MPI_ERRORS_RETURN");
    CHECK(eh_world == MPI_ERRORS_ARE_FATAL, "the caller's error handler was changed");
    MPI_Errhandler_free(&eh_dup);
    MPI_Errhandler_free(&eh_world);

    /* A message the caller has in flight on MPI_COMM_WORLD while igrad runs
     * collectives arrives intact, and never shows up on igrad's side. */
    const int tag = 4242, payload = 12345 + me;
    int to = (me + 1) % np, from = (me + np - 1) % np, got = -1;
    MPI_Request sreq;
    MPI_Isend(&payload, 1, MPI_INT, to, tag, MPI_COMM_WORLD, &sreq);
    int64_t x = me, sum = 0;
    unsigned char b = (unsigned char)me, all[64];
    CHECK_OK(igrad_comm_allreduce(comm, &x, &sum, 1, IGRAD_DTYPE_I64, IGRAD_REDUCE_SUM));
    CHECK_OK(igrad_comm_allgather(comm, &b, 1, all));
    CHECK_OK(igrad_comm_barrier(comm));
    CHECK(sum == (int64_t)np * (np - 1) / 2, "sum of ranks %" PRId64, sum);
    MPI_Recv(&got, 1, MPI_INT, from, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Wait(&sreq, MPI_STATUS_IGNORE);
    CHECK(got == 12345 + from, "caller's message: got %d, expected %d", got, 12345 + from);
    int flag = 1;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, dup, &flag, MPI_STATUS_IGNORE);
    CHECK(flag == 0, "a point-to-point message is pending on igrad's communicator");
}

/* MPI's own failures come back as IGRAD_E_COMM with MPI's text; the
 * process is not aborted and the comm stays usable. The public wrapper
 * refuses a bad root itself, so the backend is called directly to make
 * MPI raise the error. */
static void test_mpi_errors(igrad_comm_t *comm)
{
    unsigned char buf[4] = {0};
    int size = igrad_comm_size(comm);
    CHECK_STATUS(igrad_comm_bcast(comm, buf, sizeof buf, size), IGRAD_E_INVALID);
    CHECK_STATUS(comm->vt->bcast(comm, buf, sizeof buf, size + 3), IGRAD_E_COMM);
    const char *msg = igrad_last_error();
    CHECK(strstr(msg, "MPI_Ibcast") != NULL, "message \"%s\" does not name MPI_Ibcast", msg);
    CHECK(strstr(msg, "root") != NULL, "message \"%s\" lacks MPI's text", msg);
    CHECK_OK(igrad_comm_barrier(comm));

    igrad_comm_t *bad = NULL;
    MPI_Comm null_comm = MPI_COMM_NULL;
    CHECK_STATUS(igrad_comm_create_mpi(&null_comm, &bad), IGRAD_E_INVALID);
    CHECK(bad == NULL, "out set on failure");
    CHECK_STATUS(igrad_comm_create_mpi(NULL, NULL), IGRAD_E_INVALID);
    CHECK_STATUS(igrad__comm_mpi_set_max_count(comm, 0), IGRAD_E_INVALID);
    CHECK_STATUS(igrad__comm_mpi_set_max_count(comm, (size_t)INT_MAX + 1), IGRAD_E_INVALID);
}

/* Pieces: with max_count lowered, every operation is cut into many MPI
 * calls and must still give the results of one. Sizes stay small: each
 * piece is a collective, slow on oversubscribed cores. */
static void test_pieces(igrad_comm_t *comm)
{
    CHECK_OK(igrad__comm_mpi_set_max_count(comm, 7));
    test_allgather(comm, 1001, 3, "allgather in pieces of 7");
    test_allreduce(comm, 100, "allreduce in pieces of 7");
    CHECK_OK(igrad__comm_mpi_set_max_count(comm, 9999));
    test_allreduce(comm, 40000, "allreduce of 40000 in pieces of 9999");
    test_bcast(comm, 1001, "bcast in pieces of 7");
    CHECK_OK(igrad__comm_mpi_set_max_count(comm, 499));
    test_pipelined(comm, "pipelined in pieces of 499");
    CHECK_OK(igrad__comm_mpi_set_max_count(comm, 1));
    test_bcast(comm, 5, "bcast in pieces of 1");
    test_allreduce(comm, 3, "allreduce in pieces of 1");
    CHECK_OK(igrad__comm_mpi_set_max_count(comm, INT_MAX));
}

/* A comm made from a caller's sub-communicator works within it. */
static void test_split(void)
{
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, me % 2, me, &half);
    igrad_comm_t *comm = NULL;
    CHECK_OK(igrad_comm_create_mpi(&half, &comm));
    if (!comm) return;
    int hsize;
    MPI_Comm_size(half, &hsize);
    CHECK(igrad_comm_size(comm) == hsize, "size %d, expected %d", igrad_comm_size(comm), hsize);
    CHECK(igrad_comm_rank(comm) == me / 2, "rank %d, expected %d", igrad_comm_rank(comm), me / 2);
    int64_t mine = me, ranks[64];
    CHECK_OK(igrad_comm_allgather(comm, &mine, sizeof mine, ranks));
    for (int r = 0; r < hsize; r++)
        CHECK(ranks[r] == 2 * r + me % 2, "sub-comm block %d holds world rank %" PRId64, r,
              ranks[r]);
    igrad_comm_free(comm);
    MPI_Comm_free(&half);
}

/* ---- timeouts ----------------------------------------------------------------- */

static double now_s(void) { return MPI_Wtime(); }

/* Rank 0 joins an allgather `late_s` seconds after the others, whose limit
 * is `limit_s`: they get IGRAD_E_TIMEOUT after about limit_s, the comm is
 * then unusable (fast IGRAD_E_STATE quoting the timeout). Rank 0 (no
 * limit) completes once the others are inside MPI again. */
static void test_wedged_rank(void)
{
    const double limit_s = 1.0, late_s = 3.0;
    igrad_comm_t *comm = NULL;
    CHECK_OK(igrad_comm_create_mpi(NULL, &comm));
    if (!comm) return;
    uint64_t mine = 100 + (uint64_t)me, all[64] = {0};
    /* one good round with the limit on every rank */
    CHECK_OK(igrad_comm_set_timeout(comm, limit_s));
    CHECK_OK(igrad_comm_allgather(comm, &mine, sizeof mine, all));
    CHECK(all[np - 1] == 100 + (uint64_t)(np - 1), "allgather under a timeout: %" PRIu64,
          all[np - 1]);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) {
        CHECK_OK(igrad_comm_set_timeout(comm, 0.0));
        double t0 = now_s();
        while (now_s() - t0 < late_s) {
            struct timespec ts = {0, 10000000L};
            nanosleep(&ts, NULL);
        }
        /* matches the allgather the others gave up on */
        CHECK_OK(igrad_comm_allgather(comm, &mine, sizeof mine, all));
        for (int r = 0; r < np; r++)
            CHECK(all[r] == 100 + (uint64_t)r, "late allgather: block %d holds %" PRIu64, r,
                  all[r]);
    } else {
        double t0 = now_s();
        CHECK_STATUS(igrad_comm_allgather(comm, &mine, sizeof mine, all), IGRAD_E_TIMEOUT);
        double waited = now_s() - t0;
        CHECK(waited >= limit_s && waited < late_s - 0.5,
              "timed out after %.3f s, limit %.1f s", waited, limit_s);
        CHECK(strstr(igrad_last_error(), "allgather of 8 bytes per rank did not complete "
                                         "within 1 s"),
              "message: %s", igrad_last_error());
        if (me == 1) printf("mpi_comm: timeout of %.1f s returned after %.3f s\n", limit_s, waited);
        /* unusable from now on, and fast */
        t0 = now_s();
        CHECK_STATUS(igrad_comm_allgather(comm, &mine, sizeof mine, all), IGRAD_E_STATE);
        CHECK(strstr(igrad_last_error(), "unusable") &&
                  strstr(igrad_last_error(), "did not complete within 1 s"),
              "message: %s", igrad_last_error());
        igrad_comm_request_t *r = NULL;
        CHECK_STATUS(igrad_comm_iallgather(comm, &mine, sizeof mine, all, &r), IGRAD_E_STATE);
        CHECK(r == NULL, "request handed out by a broken comm");
        CHECK_STATUS(igrad_comm_barrier(comm), IGRAD_E_STATE);
        CHECK_STATUS(igrad_comm_bcast(comm, &mine, sizeof mine, 0), IGRAD_E_STATE);
        CHECK(now_s() - t0 < 0.5, "a broken comm took %.3f s to refuse", now_s() - t0);
    }
    /* Inside MPI the others' abandoned allgather still progresses, and
     * completes when rank 0 joins it: MPI writes `all` after the timeout,
     * which is why a timed-out operation's buffers must stay allocated. */
    MPI_Barrier(MPI_COMM_WORLD);
    if (me != 0)
        CHECK(all[0] == 100, "rank 0's late bytes did not land (%" PRIu64 ")", all[0]);
    igrad_comm_free(comm); /* leaves the duplicate to MPI on the broken ranks */
}


int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (np > 64) {
        if (me == 0) fprintf(stderr, "mpi_comm: at most 64 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    igrad_comm_t *comm = NULL;
    CHECK_OK(igrad_comm_create_mpi(NULL, &comm));
    if (!comm) MPI_Abort(MPI_COMM_WORLD, 1);
    CHECK(igrad_comm_rank(comm) == me && igrad_comm_size(comm) == np,
          "rank %d size %d, expected %d %d", igrad_comm_rank(comm), igrad_comm_size(comm), me,
          np);
    CHECK(strcmp(igrad_comm_backend(comm), "mpi") == 0, "backend \"%s\"",
          igrad_comm_backend(comm));

    test_isolation(comm);
    test_allgather(comm, SIZE_MAX, 1, "allgather");
    test_allreduce(comm, 1000, "allreduce");
    /* 160 KB of F32 and more: at np >= 4 under Open MPI an in-place call
     * sends from a copy (comm_mpi.c, OMPI_LIBNBC_FIXES) */
    test_allreduce(comm, 40000, "allreduce of 40000");
    test_allreduce(comm, 1, "allreduce of 1");
    test_allreduce(comm, 0, "allreduce of 0");
    test_bcast(comm, 1001, "bcast");
    test_bcast(comm, 0, "bcast of 0");
    CHECK_OK(igrad_comm_barrier(comm));
    test_pipelined(comm, "pipelined");
    test_pieces(comm);
    test_mpi_errors(comm);
    test_device_seams(comm);
    test_split();

    /* the same operations polled under a timeout (non-blocking MPI calls
     * and MPI_Testall), then a rank that comes late */
    igrad_comm_t *timed = NULL;
    CHECK_OK(igrad_comm_create_mpi(NULL, &timed));
    if (!timed) MPI_Abort(MPI_COMM_WORLD, 1);
    CHECK_OK(igrad_comm_set_timeout(timed, 60.0));
    test_allgather(timed, SIZE_MAX, 2, "allgather under a timeout");
    test_allreduce(timed, 1000, "allreduce under a timeout");
    test_allreduce(timed, 40000, "allreduce of 40000 under a timeout");
    test_bcast(timed, 1001, "bcast under a timeout");
    CHECK_OK(igrad_comm_barrier(timed));
    test_pipelined(timed, "pipelined under a timeout");
    test_pieces(timed);
    igrad_comm_free(timed);
    test_wedged_rank();

    /* The same comm from an explicit pointer to MPI_COMM_WORLD; it is freed
     * only after MPI_Finalize, where igrad releases just its memory. */
    igrad_comm_t *late = NULL;
    MPI_Comm world = MPI_COMM_WORLD;
    CHECK_OK(igrad_comm_create_mpi(&world, &late));
    test_bcast(late, 17, "bcast on a second comm");
    igrad_comm_free(comm);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0)
        printf("mpi_comm: %d ranks, %d failed checks\n", np, total);
    MPI_Finalize();
    igrad_comm_free(late);
    return total ? 1 : 0;
}
