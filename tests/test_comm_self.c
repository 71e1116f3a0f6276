/*
 * test_comm_self.c — communicators without MPI: the self backend, the
 * custom backend driven by a small callback table written here (a complete
 * in-process backend of 1 rank, or of 2 ranks whose peer is simulated),
 * the generic layer's fallbacks for missing non-blocking callbacks, error
 * propagation from callbacks, and argument checking; and the seams a
 * device backend plugs into (memory spaces, streams, group hooks), through
 * a logging backend on the internal table and the engine on top of it.
 *
 * The MPI backend is tested by tests/mpi_comm.c under mpirun.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm_internal.h" /* pending counter; tests link the static library */
#include "igrad.h"

#define assert_f64_equal(got, want)                                               \
    do {                                                                          \
        double g_ = (got), w_ = (want);                                           \
        if (!(g_ == w_)) fail_msg("%s = %.17g, expected %.17g", #got, g_, w_);    \
    } while (0)

#define assert_i64_equal(got, want)                                               \
    do {                                                                          \
        int64_t g_ = (got), w_ = (want);                                          \
        if (g_ != w_)                                                             \
            fail_msg("%s = %" PRId64 ", expected %" PRId64, #got, g_, w_);        \
    } while (0)

#define assert_status(call, want)                                                 \
    do {                                                                          \
        igrad_status_t s_ = (call);                                               \
        if (s_ != (want))                                                         \
            fail_msg("%s returned %d (%s), expected %d (%s); last error: %s", #call, \
                     (int)s_, igrad_status_str(s_), (int)(want),                  \
                     igrad_status_str(want), igrad_last_error());                 \
    } while (0)

#define assert_error_mentions(text)                                               \
    do {                                                                          \
        if (!strstr(igrad_last_error(), (text)))                                  \
            fail_msg("last error \"%s\" does not mention \"%s\"", igrad_last_error(), \
                     (text));                                                     \
    } while (0)

static void fill_bytes(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed * 131u + i * 7u + 1u);
}

/* ---- self backend -------------------------------------------------------- */

static void test_self_basics(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    assert_int_equal(igrad_comm_rank(comm), 0);
    assert_int_equal(igrad_comm_size(comm), 1);
    assert_string_equal(igrad_comm_backend(comm), "self");
    assert_status(igrad_comm_barrier(comm), IGRAD_OK);
    igrad_comm_free(comm);

    assert_int_equal(igrad_comm_rank(NULL), -1);
    assert_int_equal(igrad_comm_size(NULL), 0);
    assert_string_equal(igrad_comm_backend(NULL), "");
    igrad_comm_free(NULL);
    assert_status(igrad_comm_create_self(NULL), IGRAD_E_INVALID);
}

/* The timeout setting: validated, stored, and harmless on the self comm
 * (its collectives complete at once). */
static void test_self_timeout(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    assert_true(igrad_comm_timeout(comm) == 0.0); /* a new comm waits forever */
    assert_status(igrad_comm_set_timeout(comm, -1.0), IGRAD_E_INVALID);
    assert_error_mentions("-1 s");
    assert_status(igrad_comm_set_timeout(comm, NAN), IGRAD_E_INVALID);
    assert_status(igrad_comm_set_timeout(comm, INFINITY), IGRAD_E_INVALID);
    assert_status(igrad_comm_set_timeout(NULL, 1.0), IGRAD_E_INVALID);
    assert_true(igrad_comm_timeout(comm) == 0.0);
    assert_status(igrad_comm_set_timeout(comm, 0.25), IGRAD_OK);
    assert_true(igrad_comm_timeout(comm) == 0.25);
    assert_true(igrad_comm_timeout(NULL) == 0.0);
    unsigned char a[16], b[16];
    fill_bytes(a, sizeof a, 7);
    assert_status(igrad_comm_allgather(comm, a, sizeof a, b), IGRAD_OK);
    assert_memory_equal(a, b, sizeof a);
    igrad_comm_request_t *r = NULL;
    assert_status(igrad_comm_iallgather(comm, a, sizeof a, b, &r), IGRAD_OK);
    assert_status(igrad_comm_wait(comm, r), IGRAD_OK);
    assert_status(igrad_comm_barrier(comm), IGRAD_OK);
    assert_status(igrad_comm_set_timeout(comm, 0.0), IGRAD_OK);
    igrad_comm_free(comm);
}

static void test_self_allgather(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    static const size_t sizes[] = {0, 1, 3, 7, 1000, 4097};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        unsigned char *send = malloc(n + 1), *recv = malloc(n + 1), *want = malloc(n + 1);
        assert_non_null(send);
        assert_non_null(recv);
        assert_non_null(want);
        fill_bytes(send, n, (unsigned)s);
        memcpy(want, send, n);
        memset(recv, 0xEE, n + 1);
        assert_status(igrad_comm_allgather(comm, send, n, recv), IGRAD_OK);
        assert_memory_equal(recv, want, n);
        assert_int_equal(recv[n], 0xEE); /* nothing written past size * nbytes */
        /* in place: this rank's block already sits in recv */
        assert_status(igrad_comm_allgather(comm, recv, n, recv), IGRAD_OK);
        assert_memory_equal(recv, want, n);
        free(send);
        free(recv);
        free(want);
    }
    assert_status(igrad_comm_allgather(comm, NULL, 0, NULL), IGRAD_OK);
    igrad_comm_free(comm);
}

static void test_self_allreduce(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    enum { N = 37 };
    static const igrad_reduce_op_t ops[] = {IGRAD_REDUCE_SUM, IGRAD_REDUCE_MAX,
                                            IGRAD_REDUCE_MIN};
    for (size_t o = 0; o < 3; o++) {
        float f[N], fr[N];
        double d[N], dr[N];
        int64_t q[N], qr[N];
        for (int i = 0; i < N; i++) {
            f[i] = (float)i * 0.25f - 3.0f;
            d[i] = (double)i * 1e-3 - 0.01;
            q[i] = ((int64_t)1 << 60) - (int64_t)i * 3; /* beyond double's 2^53 */
        }
        assert_status(igrad_comm_allreduce(comm, f, fr, N, IGRAD_DTYPE_F32, ops[o]), IGRAD_OK);
        assert_status(igrad_comm_allreduce(comm, d, dr, N, IGRAD_DTYPE_F64, ops[o]), IGRAD_OK);
        assert_status(igrad_comm_allreduce(comm, q, qr, N, IGRAD_DTYPE_I64, ops[o]), IGRAD_OK);
        for (int i = 0; i < N; i++) {
            assert_f64_equal(fr[i], (float)i * 0.25f - 3.0f);
            assert_f64_equal(dr[i], (double)i * 1e-3 - 0.01);
            assert_i64_equal(qr[i], ((int64_t)1 << 60) - (int64_t)i * 3);
        }
        assert_status(igrad_comm_allreduce(comm, q, q, N, IGRAD_DTYPE_I64, ops[o]), IGRAD_OK);
        assert_memory_equal(q, qr, sizeof q);
    }
    assert_status(igrad_comm_allreduce(comm, NULL, NULL, 0, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM),
                  IGRAD_OK);
    igrad_comm_free(comm);
}

static void test_self_bcast(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    unsigned char buf[33], want[33];
    fill_bytes(buf, sizeof buf, 5);
    memcpy(want, buf, sizeof buf);
    assert_status(igrad_comm_bcast(comm, buf, sizeof buf, 0), IGRAD_OK);
    assert_memory_equal(buf, want, sizeof buf);
    assert_status(igrad_comm_bcast(comm, buf, sizeof buf, 1), IGRAD_E_INVALID);
    assert_error_mentions("root 1");
    assert_status(igrad_comm_bcast(comm, buf, sizeof buf, -1), IGRAD_E_INVALID);
    assert_status(igrad_comm_bcast(comm, NULL, 0, 0), IGRAD_OK);
    assert_status(igrad_comm_bcast(comm, NULL, 4, 0), IGRAD_E_INVALID);
    igrad_comm_free(comm);
}

static void test_self_nonblocking(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL, *other = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    assert_status(igrad_comm_create_self(&other), IGRAD_OK);
    unsigned char send[10], recv[10];
    fill_bytes(send, sizeof send, 9);
    double d[4] = {1.5, -2.5, 3.0, 0.0}, dr[4] = {0};
    igrad_comm_request_t *r1 = NULL, *r2 = NULL;
    assert_status(igrad_comm_iallgather(comm, send, sizeof send, recv, &r1), IGRAD_OK);
    assert_status(igrad_comm_iallreduce(comm, d, dr, 4, IGRAD_DTYPE_F64, IGRAD_REDUCE_SUM, &r2),
                  IGRAD_OK);
    assert_non_null(r1);
    assert_non_null(r2);
    assert_i64_equal(comm->pending, 2);
    int done = -1;
    assert_status(igrad_comm_test(comm, r2, &done), IGRAD_OK);
    assert_int_equal(done, 1);
    /* a request is bound to its comm: waiting it elsewhere is refused and
     * leaves it intact */
    assert_status(igrad_comm_wait(other, r2), IGRAD_E_INVALID);
    assert_status(igrad_comm_test(other, r2, &done), IGRAD_E_INVALID);
    assert_status(igrad_comm_wait(comm, r2), IGRAD_OK);
    assert_status(igrad_comm_wait(comm, r1), IGRAD_OK);
    assert_i64_equal(comm->pending, 0);
    assert_memory_equal(recv, send, sizeof send);
    for (int i = 0; i < 4; i++) assert_f64_equal(dr[i], d[i]);
    assert_status(igrad_comm_wait(comm, NULL), IGRAD_OK);
    igrad_comm_free(comm);
    igrad_comm_free(other);
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    float buf[16] = {0};
    igrad_comm_request_t sentinel = {0};
    igrad_comm_request_t *req = &sentinel; /* must be reset to NULL */

    assert_status(igrad_comm_allgather(NULL, buf, 4, buf), IGRAD_E_INVALID);
    assert_error_mentions("comm is NULL");
    assert_status(igrad_comm_allgather(comm, NULL, 4, buf), IGRAD_E_INVALID);
    assert_error_mentions("send");
    assert_status(igrad_comm_allgather(comm, buf, 4, NULL), IGRAD_E_INVALID);
    assert_error_mentions("recv");
    /* partial overlap: neither separate nor this rank's block */
    assert_status(igrad_comm_allgather(comm, (char *)buf + 1, 8, buf), IGRAD_E_INVALID);
    assert_error_mentions("overlap");

    assert_status(igrad_comm_allreduce(NULL, buf, buf, 4, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM),
                  IGRAD_E_INVALID);
    assert_status(igrad_comm_allreduce(comm, buf, buf, 4, IGRAD_DTYPE_F16, IGRAD_REDUCE_SUM),
                  IGRAD_E_INVALID);
    assert_error_mentions("F16");
    assert_status(igrad_comm_allreduce(comm, buf, buf, 4, (igrad_dtype_t)99, IGRAD_REDUCE_SUM),
                  IGRAD_E_INVALID);
    assert_status(igrad_comm_allreduce(comm, buf, buf, 4, IGRAD_DTYPE_F32, (igrad_reduce_op_t)7),
                  IGRAD_E_INVALID);
    assert_error_mentions("op 7");
    assert_status(igrad_comm_allreduce(comm, buf, buf + 1, 4, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM),
                  IGRAD_E_INVALID);
    assert_error_mentions("overlap");
    assert_status(igrad_comm_allreduce(comm, NULL, buf, 4, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM),
                  IGRAD_E_INVALID);
    /* adjacent, not overlapping */
    assert_status(igrad_comm_allreduce(comm, buf, buf + 4, 4, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM),
                  IGRAD_OK);

    assert_status(igrad_comm_bcast(NULL, buf, 4, 0), IGRAD_E_INVALID);
    assert_status(igrad_comm_barrier(NULL), IGRAD_E_INVALID);

    assert_status(igrad_comm_iallgather(comm, buf, 4, buf + 8, NULL), IGRAD_E_INVALID);
    assert_status(igrad_comm_iallgather(comm, NULL, 4, buf, &req), IGRAD_E_INVALID);
    assert_null(req);
    req = &sentinel;
    assert_status(igrad_comm_iallreduce(comm, buf, buf, 4, IGRAD_DTYPE_U8, IGRAD_REDUCE_SUM, &req),
                  IGRAD_E_INVALID);
    assert_null(req);
    assert_status(igrad_comm_iallreduce(comm, buf, buf, 4, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM,
                                        NULL),
                  IGRAD_E_INVALID);
    assert_status(igrad_comm_test(comm, NULL, NULL), IGRAD_E_INVALID);
    int done = 7;
    assert_status(igrad_comm_test(comm, NULL, &done), IGRAD_E_INVALID);
    assert_int_equal(done, 0);
    assert_i64_equal(comm->pending, 0);
    igrad_comm_free(comm);
}

/* ---- a custom backend written against the public callback table --------- */

enum { CB_ALLGATHER, CB_ALLREDUCE, CB_BCAST, CB_BARRIER, CB_IALLGATHER, CB_IALLREDUCE,
       CB_WAIT, CB_TEST, CB_COUNT };

/* An in-process backend of `size` ranks (1 or 2) seen from `rank`. With
 * two ranks the peer is simulated: its allgather block is the bitwise
 * complement of ours, and its allreduce contribution is each of our
 * values plus one. Non-blocking operations are deferred: nothing reaches
 * recv until test (after `polls_to_finish` polls) or wait runs them. */
typedef struct fake {
    int rank, size;
    int calls[CB_COUNT];
    int outstanding;      /* handles given out and not yet waited */
    int polls_to_finish;
    int fail_status;      /* nonzero: every callback returns it */
    const char *message;  /* what error_message reports */
    int destroyed;
} fake_t;

typedef struct fake_op {
    int is_reduce;
    const void *send;
    void *recv;
    size_t nbytes, count;
    igrad_dtype_t dtype;
    igrad_reduce_op_t op;
    int polls;
    int finished;
} fake_op_t;

static void fake_gather(const fake_t *f, const void *send, size_t nbytes, void *recv)
{
    unsigned char *own = (unsigned char *)recv + (size_t)f->rank * nbytes;
    if ((const void *)own != send) memmove(own, send, nbytes);
    if (f->size == 2) {
        unsigned char *peer = (unsigned char *)recv + (size_t)(1 - f->rank) * nbytes;
        for (size_t i = 0; i < nbytes; i++) peer[i] = (unsigned char)~own[i];
    }
}

static double fake_combine(const fake_t *f, double x, igrad_reduce_op_t op)
{
    if (f->size == 1) return x;
    double peer = x + 1;
    return op == IGRAD_REDUCE_SUM ? x + peer : op == IGRAD_REDUCE_MAX ? peer : x;
}

static void fake_reduce(const fake_t *f, const void *send, void *recv, size_t count,
                        igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    for (size_t i = 0; i < count; i++) {
        if (dtype == IGRAD_DTYPE_F32)
            ((float *)recv)[i] = (float)fake_combine(f, ((const float *)send)[i], op);
        else if (dtype == IGRAD_DTYPE_F64)
            ((double *)recv)[i] = fake_combine(f, ((const double *)send)[i], op);
        else {
            int64_t x = ((const int64_t *)send)[i];
            ((int64_t *)recv)[i] = f->size == 1 ? x
                                   : op == IGRAD_REDUCE_SUM ? 2 * x + 1
                                   : op == IGRAD_REDUCE_MAX ? x + 1
                                                            : x;
        }
    }
}

static igrad_status_t fake_allgather(void *user, const void *send, size_t nbytes, void *recv)
{
    fake_t *f = user;
    f->calls[CB_ALLGATHER]++;
    if (f->fail_status) return (igrad_status_t)f->fail_status;
    fake_gather(f, send, nbytes, recv);
    return IGRAD_OK;
}

static igrad_status_t fake_allreduce(void *user, const void *send, void *recv, size_t count,
                                     igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    fake_t *f = user;
    f->calls[CB_ALLREDUCE]++;
    if (f->fail_status) return (igrad_status_t)f->fail_status;
    fake_reduce(f, send, recv, count, dtype, op);
    return IGRAD_OK;
}

static igrad_status_t fake_bcast(void *user, void *buf, size_t nbytes, int root)
{
    fake_t *f = user;
    f->calls[CB_BCAST]++;
    if (f->fail_status) return (igrad_status_t)f->fail_status;
    /* the simulated peer, when root, sends all-0x5A */
    if (root != f->rank) memset(buf, 0x5A, nbytes);
    return IGRAD_OK;
}

static igrad_status_t fake_barrier(void *user)
{
    fake_t *f = user;
    f->calls[CB_BARRIER]++;
    return (igrad_status_t)f->fail_status;
}

static igrad_status_t fake_start(fake_t *f, fake_op_t op, void **handle)
{
    if (f->fail_status) return (igrad_status_t)f->fail_status;
    fake_op_t *p = malloc(sizeof *p);
    if (!p) return IGRAD_E_NOMEM;
    *p = op;
    f->outstanding++;
    *handle = p;
    return IGRAD_OK;
}

static igrad_status_t fake_iallgather(void *user, const void *send, size_t nbytes, void *recv,
                                      void **handle)
{
    fake_t *f = user;
    f->calls[CB_IALLGATHER]++;
    fake_op_t op = {.is_reduce = 0, .send = send, .recv = recv, .nbytes = nbytes};
    return fake_start(f, op, handle);
}

static igrad_status_t fake_iallreduce(void *user, const void *send, void *recv, size_t count,
                                      igrad_dtype_t dtype, igrad_reduce_op_t op, void **handle)
{
    fake_t *f = user;
    f->calls[CB_IALLREDUCE]++;
    fake_op_t o = {.is_reduce = 1, .send = send, .recv = recv, .count = count,
                   .dtype = dtype, .op = op};
    return fake_start(f, o, handle);
}

static void fake_finish(const fake_t *f, fake_op_t *p)
{
    if (p->finished) return;
    if (p->is_reduce)
        fake_reduce(f, p->send, p->recv, p->count, p->dtype, p->op);
    else
        fake_gather(f, p->send, p->nbytes, p->recv);
    p->finished = 1;
}

static igrad_status_t fake_wait(void *user, void *handle)
{
    fake_t *f = user;
    f->calls[CB_WAIT]++;
    fake_finish(f, handle);
    free(handle);
    f->outstanding--;
    return (igrad_status_t)f->fail_status;
}

static igrad_status_t fake_test(void *user, void *handle, int *done)
{
    fake_t *f = user;
    fake_op_t *p = handle;
    f->calls[CB_TEST]++;
    if (++p->polls >= f->polls_to_finish) fake_finish(f, p);
    *done = p->finished;
    return (igrad_status_t)f->fail_status;
}

static const char *fake_error_message(void *user)
{
    return ((fake_t *)user)->message;
}

static void fake_destroy(void *user)
{
    ((fake_t *)user)->destroyed++;
}

static igrad_comm_ops_t fake_ops(int nonblocking)
{
    igrad_comm_ops_t ops = {
        .size = sizeof(igrad_comm_ops_t),
        .allgather = fake_allgather,
        .allreduce = fake_allreduce,
        .bcast = fake_bcast,
        .barrier = fake_barrier,
        .error_message = fake_error_message,
        .destroy = fake_destroy,
    };
    if (nonblocking) {
        ops.iallgather = fake_iallgather;
        ops.iallreduce = fake_iallreduce;
        ops.wait = fake_wait;
        ops.test = fake_test;
    }
    return ops;
}

/* Group callbacks of a custom table: they append to custom_group_log. */
static char custom_group_log[16];

static void custom_group_note(char c)
{
    size_t n = strlen(custom_group_log);
    if (n + 1 < sizeof custom_group_log) custom_group_log[n] = c, custom_group_log[n + 1] = 0;
}

static igrad_status_t custom_group_start_cb(void *user)
{
    (void)user;
    custom_group_note('S');
    return IGRAD_OK;
}

static igrad_status_t custom_group_end_cb(void *user)
{
    (void)user;
    custom_group_note('E');
    return IGRAD_OK;
}

static void test_custom_validation(void **state)
{
    (void)state;
    fake_t f = {.rank = 0, .size = 1};
    igrad_comm_t sentinel = {0};
    igrad_comm_t *comm = &sentinel; /* must be reset to NULL */
    igrad_comm_ops_t ops = fake_ops(1);

    assert_status(igrad_comm_create_custom(NULL, &f, 0, 1, &comm), IGRAD_E_INVALID);
    assert_null(comm);
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, NULL), IGRAD_E_INVALID);

    ops.size = offsetof(igrad_comm_ops_t, group_start) - 1;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);
    assert_error_mentions("ops->size");
    ops.size = 0;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);

    static const char *const names[] = {"allgather", "allreduce", "bcast", "barrier"};
    for (int i = 0; i < 4; i++) {
        ops = fake_ops(1);
        if (i == 0) ops.allgather = NULL;
        if (i == 1) ops.allreduce = NULL;
        if (i == 2) ops.bcast = NULL;
        if (i == 3) ops.barrier = NULL;
        assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);
        char want[32];
        snprintf(want, sizeof want, "ops->%s", names[i]);
        assert_error_mentions(want);
    }
    ops = fake_ops(1);
    ops.wait = NULL;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);
    assert_error_mentions("ops->wait");
    ops.iallgather = NULL; /* iallreduce alone still needs wait */
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);

    ops = fake_ops(1);
    assert_status(igrad_comm_create_custom(&ops, &f, 1, 1, &comm), IGRAD_E_INVALID);
    assert_error_mentions("rank 1, size 1");
    assert_status(igrad_comm_create_custom(&ops, &f, -1, 2, &comm), IGRAD_E_INVALID);
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 0, &comm), IGRAD_E_INVALID);
    assert_null(comm);
    assert_int_equal(f.destroyed, 0);

    /* group callbacks: both or neither */
    ops = fake_ops(1);
    ops.group_start = custom_group_start_cb;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);
    assert_error_mentions("ops->group_end");
    ops.group_start = NULL;
    ops.group_end = custom_group_end_cb;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);
    assert_error_mentions("ops->group_start");

    /* a table of the first version (it ended at destroy) still works, and
     * what lies past its size is never read */
    ops = fake_ops(1);
    ops.group_start = custom_group_start_cb; /* past size: ignored */
    ops.size = offsetof(igrad_comm_ops_t, group_start);
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_OK);
    assert_null(comm->vt->group_start);
    assert_null(comm->vt->group_end);
    igrad_comm_free(comm);
    assert_int_equal(f.destroyed, 1);
    f.destroyed = 0;
    /* group_end cut off, so absent: group_start alone is refused */
    ops.size = offsetof(igrad_comm_ops_t, group_end) + sizeof ops.group_end - 1;
    ops.group_end = custom_group_end_cb;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);
    assert_error_mentions("ops->group_end");

    /* a table from a newer header (larger size) is accepted */
    struct {
        igrad_comm_ops_t ops;
        void (*future_callback)(void);
    } newer = {fake_ops(0), NULL};
    newer.ops.size = sizeof newer;
    assert_status(igrad_comm_create_custom(&newer.ops, &f, 0, 1, &comm), IGRAD_OK);
    assert_string_equal(igrad_comm_backend(comm), "custom");
    igrad_comm_free(comm);
    assert_int_equal(f.destroyed, 1);
}

/* Without non-blocking callbacks, i* run the blocking callback at issue
 * time and wait is a no-op. */
static void test_custom_blocking_fallback(void **state)
{
    (void)state;
    fake_t f = {.rank = 0, .size = 1};
    igrad_comm_ops_t ops = fake_ops(0);
    ops.destroy = NULL; /* optional */
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_OK);
    assert_int_equal(igrad_comm_rank(comm), 0);
    assert_int_equal(igrad_comm_size(comm), 1);

    unsigned char send[13], recv[13] = {0};
    fill_bytes(send, sizeof send, 3);
    igrad_comm_request_t *r1 = NULL, *r2 = NULL;
    assert_status(igrad_comm_iallgather(comm, send, sizeof send, recv, &r1), IGRAD_OK);
    assert_int_equal(f.calls[CB_ALLGATHER], 1);
    assert_memory_equal(recv, send, sizeof send); /* already there before wait */

    int64_t q[3] = {5, -7, INT64_MAX}, qr[3] = {0};
    assert_status(igrad_comm_iallreduce(comm, q, qr, 3, IGRAD_DTYPE_I64, IGRAD_REDUCE_MAX, &r2),
                  IGRAD_OK);
    assert_int_equal(f.calls[CB_ALLREDUCE], 1);
    for (int i = 0; i < 3; i++) assert_i64_equal(qr[i], q[i]);

    int done = 0;
    assert_status(igrad_comm_test(comm, r1, &done), IGRAD_OK);
    assert_int_equal(done, 1);
    assert_status(igrad_comm_wait(comm, r2), IGRAD_OK);
    assert_status(igrad_comm_wait(comm, r1), IGRAD_OK);
    assert_int_equal(f.calls[CB_ALLGATHER], 1);
    assert_int_equal(f.calls[CB_ALLREDUCE], 1);
    assert_int_equal(f.calls[CB_WAIT] + f.calls[CB_TEST], 0);
    assert_i64_equal(comm->pending, 0);
    igrad_comm_free(comm);
    assert_int_equal(f.destroyed, 0);
}

/* Deferred operations complete only through test/wait; several in flight
 * waited in an order other than issue order; each handle waited once. */
static void test_custom_nonblocking(void **state)
{
    (void)state;
    fake_t f = {.rank = 0, .size = 1, .polls_to_finish = 2};
    igrad_comm_ops_t ops = fake_ops(1);
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_OK);

    enum { K = 6, N = 9 };
    float send[K][N], recv[K][N];
    igrad_comm_request_t *req[K];
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < N; i++) {
            send[k][i] = (float)(k * 100 + i);
            recv[k][i] = -1.0f;
        }
        if (k % 2)
            assert_status(igrad_comm_iallgather(comm, send[k], sizeof send[k], recv[k], &req[k]),
                          IGRAD_OK);
        else
            assert_status(igrad_comm_iallreduce(comm, send[k], recv[k], N, IGRAD_DTYPE_F32,
                                                IGRAD_REDUCE_SUM, &req[k]),
                          IGRAD_OK);
    }
    assert_int_equal(f.outstanding, K);
    assert_i64_equal(comm->pending, K);
    for (int k = 0; k < K; k++) assert_f64_equal(recv[k][0], -1.0); /* nothing yet */

    int done = -1;
    assert_status(igrad_comm_test(comm, req[3], &done), IGRAD_OK);
    assert_int_equal(done, 0);
    assert_status(igrad_comm_test(comm, req[3], &done), IGRAD_OK);
    assert_int_equal(done, 1);
    assert_status(igrad_comm_test(comm, req[3], &done), IGRAD_OK); /* stays done */
    assert_int_equal(done, 1);
    assert_int_equal(f.calls[CB_TEST], 2);
    assert_int_equal(f.calls[CB_WAIT], 0);
    assert_f64_equal(recv[3][N - 1], send[3][N - 1]);

    static const int order[K] = {4, 1, 5, 3, 0, 2};
    for (int j = 0; j < K; j++) assert_status(igrad_comm_wait(comm, req[order[j]]), IGRAD_OK);
    assert_int_equal(f.calls[CB_WAIT], K);
    assert_int_equal(f.outstanding, 0);
    assert_i64_equal(comm->pending, 0);
    for (int k = 0; k < K; k++)
        for (int i = 0; i < N; i++) assert_f64_equal(recv[k][i], send[k][i]);

    /* no test callback: igrad_comm_test completes by waiting, and the
     * handle is not waited a second time */
    igrad_comm_free(comm);
    ops.test = NULL;
    memset(f.calls, 0, sizeof f.calls);
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_OK);
    igrad_comm_request_t *r = NULL;
    assert_status(igrad_comm_iallgather(comm, send[0], sizeof send[0], recv[0], &r), IGRAD_OK);
    assert_status(igrad_comm_test(comm, r, &done), IGRAD_OK);
    assert_int_equal(done, 1);
    assert_int_equal(f.calls[CB_WAIT], 1);
    assert_status(igrad_comm_wait(comm, r), IGRAD_OK);
    assert_int_equal(f.calls[CB_WAIT], 1);
    assert_int_equal(f.outstanding, 0);
    igrad_comm_free(comm);
    assert_int_equal(f.destroyed, 2);
}

/* A two-rank backend: recv holds size * nbytes, this rank's block at
 * rank * nbytes, and the reductions combine both ranks' values. */
static void test_custom_two_ranks(void **state)
{
    (void)state;
    fake_t f = {.rank = 1, .size = 2, .polls_to_finish = 1};
    igrad_comm_ops_t ops = fake_ops(1);
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_custom(&ops, &f, 1, 2, &comm), IGRAD_OK);
    assert_int_equal(igrad_comm_rank(comm), 1);
    assert_int_equal(igrad_comm_size(comm), 2);

    enum { NB = 11 };
    unsigned char send[NB], recv[2 * NB];
    fill_bytes(send, NB, 1);
    assert_status(igrad_comm_allgather(comm, send, NB, recv), IGRAD_OK);
    for (int i = 0; i < NB; i++) {
        assert_int_equal(recv[i], (unsigned char)~send[i]);
        assert_int_equal(recv[NB + i], send[i]);
    }
    /* in place: rank 1's block is recv + NB */
    memset(recv, 0, sizeof recv);
    memcpy(recv + NB, send, NB);
    assert_status(igrad_comm_allgather(comm, recv + NB, NB, recv), IGRAD_OK);
    for (int i = 0; i < NB; i++) assert_int_equal(recv[i], (unsigned char)~send[i]);
    /* rank 0's block is not where rank 1's data may come from */
    assert_status(igrad_comm_allgather(comm, recv, NB, recv), IGRAD_E_INVALID);

    double d[5] = {0.5, -1.25, 3.0, 1e10, -2.0};
    int64_t q[5] = {1, -1, (int64_t)1 << 60, -5, 0};
    for (int o = 0; o < 3; o++) {
        igrad_reduce_op_t op = (igrad_reduce_op_t)o;
        double dr[5];
        int64_t qr[5];
        memcpy(qr, q, sizeof q);
        assert_status(igrad_comm_allreduce(comm, d, dr, 5, IGRAD_DTYPE_F64, op), IGRAD_OK);
        igrad_comm_request_t *r = NULL;
        assert_status(igrad_comm_iallreduce(comm, qr, qr, 5, IGRAD_DTYPE_I64, op, &r), IGRAD_OK);
        assert_status(igrad_comm_wait(comm, r), IGRAD_OK);
        for (int i = 0; i < 5; i++) {
            /* the peer contributes value + 1 */
            double dw = op == IGRAD_REDUCE_SUM ? 2 * d[i] + 1
                        : op == IGRAD_REDUCE_MAX ? d[i] + 1 : d[i];
            int64_t qw = op == IGRAD_REDUCE_SUM ? 2 * q[i] + 1
                         : op == IGRAD_REDUCE_MAX ? q[i] + 1 : q[i];
            assert_f64_equal(dr[i], dw);
            assert_i64_equal(qr[i], qw);
        }
    }
    unsigned char b[4] = {1, 2, 3, 4};
    assert_status(igrad_comm_bcast(comm, b, sizeof b, 0), IGRAD_OK);
    assert_int_equal(b[3], 0x5A);
    assert_status(igrad_comm_bcast(comm, b, sizeof b, 2), IGRAD_E_INVALID);
    assert_int_equal(f.calls[CB_BCAST], 1);
    igrad_comm_free(comm);
}

/* Callback failures become igrad statuses with the callback's name and the
 * backend's own message. */
static void test_custom_errors(void **state)
{
    (void)state;
    fake_t f = {.rank = 0, .size = 1, .polls_to_finish = 1};
    igrad_comm_ops_t ops = fake_ops(1);
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_OK);
    float x[4] = {1, 2, 3, 4}, y[4];

    f.fail_status = IGRAD_E_COMM;
    f.message = "peer 3 timed out";
    assert_status(igrad_comm_allreduce(comm, x, y, 4, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM),
                  IGRAD_E_COMM);
    assert_error_mentions("allreduce");
    assert_error_mentions("peer 3 timed out");
    assert_status(igrad_comm_barrier(comm), IGRAD_E_COMM);
    assert_error_mentions("barrier");

    f.fail_status = 42; /* not a status: reported as a communication error */
    f.message = NULL;
    assert_status(igrad_comm_allgather(comm, x, sizeof x, y), IGRAD_E_COMM);
    assert_error_mentions("returned 42");
    f.fail_status = -1;
    assert_status(igrad_comm_bcast(comm, x, sizeof x, 0), IGRAD_E_COMM);
    assert_error_mentions("returned -1");
    f.fail_status = IGRAD_E_NOMEM;
    assert_status(igrad_comm_bcast(comm, x, sizeof x, 0), IGRAD_E_NOMEM);
    /* a callback that gives up on its own timeout says so, as it is */
    f.fail_status = IGRAD_E_TIMEOUT;
    f.message = "peer 2 silent for 30 s";
    assert_status(igrad_comm_allgather(comm, x, sizeof x, y), IGRAD_E_TIMEOUT);
    assert_error_mentions("returned 10 (timed out)");
    assert_error_mentions("peer 2 silent for 30 s");
    f.message = NULL;
    f.fail_status = IGRAD_E_TIMEOUT + 1; /* not a status (yet): a communication error */
    assert_status(igrad_comm_barrier(comm), IGRAD_E_COMM);

    /* a failed start hands back no request and leaves nothing pending */
    igrad_comm_request_t sentinel = {0};
    igrad_comm_request_t *r = &sentinel;
    f.fail_status = IGRAD_E_COMM;
    assert_status(igrad_comm_iallgather(comm, x, sizeof x, y, &r), IGRAD_E_COMM);
    assert_null(r);
    assert_error_mentions("iallgather");
    assert_i64_equal(comm->pending, 0);

    /* a failure found at wait still releases the request and the handle */
    f.fail_status = 0;
    assert_status(igrad_comm_iallreduce(comm, x, y, 4, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM, &r),
                  IGRAD_OK);
    f.fail_status = IGRAD_E_COMM;
    f.message = "lost";
    assert_status(igrad_comm_wait(comm, r), IGRAD_E_COMM);
    assert_error_mentions("wait");
    assert_int_equal(f.outstanding, 0);
    assert_i64_equal(comm->pending, 0);

    f.fail_status = 0;
    assert_status(igrad_comm_iallreduce(comm, x, y, 4, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM, &r),
                  IGRAD_OK);
    f.fail_status = IGRAD_E_COMM;
    int done = -1;
    assert_status(igrad_comm_test(comm, r, &done), IGRAD_E_COMM);
    assert_error_mentions("test");
    assert_int_equal(done, 0);
    f.fail_status = 0;
    assert_status(igrad_comm_wait(comm, r), IGRAD_OK);
    assert_int_equal(f.outstanding, 0);
    igrad_comm_free(comm);
}

/* This executable never initializes MPI: the MPI backend must say so
 * (or, in a build without MPI, that it is unsupported), not crash. */
/* ---- the generic layer's device-backend seams --------------------------- */

/* A one-rank backend on the internal table, with group hooks, that logs
 * what comm.c calls and which stream it passes: a test double of a device
 * backend (comm_nccl.c is not in this build) for the layer above it. Its
 * non-blocking operations stay in flight (a live handle) until waited. */
typedef struct group_fake {
    char log[256];      /* S group_start, E group_end, A blocking allgather,
                           g iallgather, r iallreduce, t test, w wait */
    size_t n;
    void *stream;       /* the last stream an i* call got */
    int streams_seen;   /* i* calls */
    int fail_end;       /* group_end returns IGRAD_E_COMM */
} group_fake_t;

static void group_log(igrad_comm_t *comm, char c)
{
    group_fake_t *g = comm->impl;
    if (g->n + 1 < sizeof g->log) g->log[g->n++] = c;
    g->log[g->n] = '\0';
}

static igrad_status_t group_allgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                      void *recv)
{
    group_log(comm, 'A');
    if (send != recv) memmove(recv, send, nbytes);
    return IGRAD_OK;
}

static igrad_status_t group_allreduce(igrad_comm_t *comm, const void *send, void *recv,
                                      size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    (void)op;
    group_log(comm, 'R');
    if (send != recv) memmove(recv, send, count * igrad_dtype_nbytes(dtype));
    return IGRAD_OK;
}

static igrad_status_t group_bcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root)
{
    (void)buf, (void)nbytes, (void)root;
    group_log(comm, 'B');
    return IGRAD_OK;
}

static igrad_status_t group_barrier(igrad_comm_t *comm)
{
    group_log(comm, 'b');
    return IGRAD_OK;
}

static int group_token; /* the handle of every operation in flight */

/* Both i* functions: log `c`, note the stream, copy (one rank), stay in
 * flight. */
static igrad_status_t group_issue(igrad_comm_t *comm, char c, const void *send, void *recv,
                                  size_t nbytes, void *stream, igrad_comm_request_t *req)
{
    group_fake_t *g = comm->impl;
    group_log(comm, c);
    g->stream = stream;
    g->streams_seen++;
    if (send != recv) memmove(recv, send, nbytes);
    req->handle = &group_token;
    return IGRAD_OK;
}

static igrad_status_t group_iallgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                       void *recv, void *stream, igrad_comm_request_t *req)
{
    return group_issue(comm, 'g', send, recv, nbytes, stream, req);
}

static igrad_status_t group_iallreduce(igrad_comm_t *comm, const void *send, void *recv,
                                       size_t count, igrad_dtype_t dtype,
                                       igrad_reduce_op_t op, void *stream,
                                       igrad_comm_request_t *req)
{
    (void)op;
    return group_issue(comm, 'r', send, recv, count * igrad_dtype_nbytes(dtype), stream, req);
}

static igrad_status_t group_wait(igrad_comm_t *comm, igrad_comm_request_t *req)
{
    group_log(comm, 'w');
    req->handle = NULL;
    return IGRAD_OK;
}

static igrad_status_t group_test(igrad_comm_t *comm, igrad_comm_request_t *req, int *done)
{
    (void)req;
    group_log(comm, 't');
    *done = 1;
    return IGRAD_OK;
}

static igrad_status_t group_start(igrad_comm_t *comm)
{
    group_log(comm, 'S');
    return IGRAD_OK;
}

static igrad_status_t group_end(igrad_comm_t *comm)
{
    group_fake_t *g = comm->impl;
    group_log(comm, 'E');
    return g->fail_end ? igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__, "fake group end failed")
                       : IGRAD_OK;
}

static const igrad__comm_vtable_t group_vtable = {
    .spaces = IGRAD__MEM_BIT(IGRAD__MEM_HOST),
    .allgather = group_allgather,
    .allreduce = group_allreduce,
    .bcast = group_bcast,
    .barrier = group_barrier,
    .iallgather = group_iallgather,
    .iallreduce = group_iallreduce,
    .wait = group_wait,
    .test = group_test,
    .group_start = group_start,
    .group_end = group_end,
};

static igrad_comm_t *group_comm(group_fake_t *g, unsigned spaces)
{
    memset(g, 0, sizeof *g);
    igrad_comm_t *comm = NULL;
    assert_status(igrad__comm_new(&group_vtable, "grouped", 0, 1, g, &comm), IGRAD_OK);
    assert_int_equal(comm->spaces, IGRAD__MEM_BIT(IGRAD__MEM_HOST));
    comm->spaces = spaces;
    return comm;
}

static void test_group_hooks(void **state)
{
    (void)state;
    group_fake_t g;
    igrad_comm_t *comm = group_comm(&g, IGRAD__MEM_BIT(IGRAD__MEM_HOST));
    float a[4] = {1, 2, 3, 4}, b[4] = {0}, c[4] = {0};
    int queue = 0, done = -1;
    igrad_comm_request_t *r1 = NULL, *r2 = NULL;

    assert_status(igrad__comm_group_end(comm), IGRAD_E_STATE);
    assert_error_mentions("no group");
    assert_status(igrad__comm_group_start(comm), IGRAD_OK);
    assert_status(igrad__comm_group_start(comm), IGRAD_OK); /* nested: not forwarded */
    assert_status(igrad__comm_iallgather(comm, a, sizeof a, b, IGRAD__MEM_HOST, &queue, &r1),
                  IGRAD_OK);
    assert_true(g.stream == &queue);
    assert_status(igrad__comm_iallreduce(comm, a, c, 4, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM,
                                         IGRAD__MEM_HOST, NULL, &r2),
                  IGRAD_OK);
    assert_null(g.stream);
    /* inside the group nothing has been launched: no test, wait or
     * blocking collective reaches the backend */
    assert_status(igrad_comm_test(comm, r1, &done), IGRAD_OK);
    assert_int_equal(done, 0);
    assert_status(igrad_comm_wait(comm, r1), IGRAD_E_STATE);
    assert_error_mentions("still open");
    assert_status(igrad_comm_barrier(comm), IGRAD_E_STATE);
    assert_error_mentions("group of the grouped communicator is open");
    assert_status(igrad_comm_allgather(comm, a, sizeof a, b), IGRAD_E_STATE);
    assert_status(igrad__comm_group_end(comm), IGRAD_OK); /* inner */
    assert_status(igrad_comm_test(comm, r1, &done), IGRAD_OK);
    assert_int_equal(done, 0);
    assert_status(igrad__comm_group_end(comm), IGRAD_OK); /* outer: forwarded */
    assert_i64_equal(comm->pending, 2);
    assert_status(igrad_comm_test(comm, r1, &done), IGRAD_OK);
    assert_int_equal(done, 1);
    assert_status(igrad_comm_wait(comm, r1), IGRAD_OK);
    assert_status(igrad_comm_wait(comm, r2), IGRAD_OK);
    assert_i64_equal(comm->pending, 0);
    assert_string_equal(g.log, "SgrEtww");
    assert_memory_equal(b, a, sizeof a);
    assert_memory_equal(c, a, sizeof a);

    /* the public wrappers: host buffers, NULL stream */
    g.stream = &queue;
    assert_status(igrad_comm_iallgather(comm, a, sizeof a, b, &r1), IGRAD_OK);
    assert_null(g.stream);
    assert_status(igrad_comm_wait(comm, r1), IGRAD_OK);
    assert_int_equal(g.streams_seen, 3);

    /* a failing group end closes the pair; its requests are still waited */
    g.fail_end = 1;
    g.n = 0;
    assert_status(igrad__comm_group_start(comm), IGRAD_OK);
    assert_status(igrad_comm_iallgather(comm, a, sizeof a, b, &r1), IGRAD_OK);
    assert_status(igrad__comm_group_end(comm), IGRAD_E_COMM);
    assert_int_equal(comm->group_depth, 0);
    assert_status(igrad_comm_wait(comm, r1), IGRAD_OK);
    assert_string_equal(g.log, "SgEw");
    igrad_comm_free(comm);
}

/* Backends without hooks: group start/end are no-ops that still pair, and
 * a request inside the "group" completes as it always does. */
static void test_group_noop(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    assert_null(comm->vt->group_start);
    assert_null(comm->vt->group_end);
    double x = 2.5, y = 0.0;
    int done = 0;
    igrad_comm_request_t *req = NULL;
    assert_status(igrad__comm_group_start(comm), IGRAD_OK);
    assert_status(igrad__comm_iallreduce(comm, &x, &y, 1, IGRAD_DTYPE_F64, IGRAD_REDUCE_SUM,
                                         IGRAD__MEM_HOST, NULL, &req),
                  IGRAD_OK);
    assert_status(igrad_comm_test(comm, req, &done), IGRAD_OK);
    assert_int_equal(done, 1);
    assert_status(igrad_comm_wait(comm, req), IGRAD_OK);
    assert_status(igrad_comm_barrier(comm), IGRAD_OK);
    assert_status(igrad__comm_group_end(comm), IGRAD_OK);
    assert_f64_equal(y, 2.5);
    assert_status(igrad__comm_group_end(comm), IGRAD_E_STATE);
    igrad_comm_free(comm);

    fake_t f = {.rank = 0, .size = 1};
    igrad_comm_ops_t ops = fake_ops(1);
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_OK);
    assert_status(igrad__comm_group_start(comm), IGRAD_OK);
    assert_status(igrad__comm_group_end(comm), IGRAD_OK);
    igrad_comm_free(comm);
}

/* A custom table with group callbacks: the outermost pair reaches them,
 * in order, and a handle issued inside is neither tested nor waited
 * before the group ends. */
static void test_custom_groups(void **state)
{
    (void)state;
    fake_t f = {.rank = 0, .size = 1, .polls_to_finish = 1};
    igrad_comm_ops_t ops = fake_ops(1);
    ops.group_start = custom_group_start_cb;
    ops.group_end = custom_group_end_cb;
    igrad_comm_t *comm = NULL;
    custom_group_log[0] = '\0';
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_OK);
    double x = 1.5, y = 0.0;
    int done = -1;
    igrad_comm_request_t *req = NULL;
    assert_status(igrad__comm_group_start(comm), IGRAD_OK);
    assert_status(igrad__comm_group_start(comm), IGRAD_OK);
    assert_string_equal(custom_group_log, "S");
    assert_status(igrad_comm_iallreduce(comm, &x, &y, 1, IGRAD_DTYPE_F64, IGRAD_REDUCE_SUM,
                                        &req),
                  IGRAD_OK);
    assert_status(igrad_comm_test(comm, req, &done), IGRAD_OK);
    assert_int_equal(done, 0);
    assert_status(igrad_comm_wait(comm, req), IGRAD_E_STATE);
    assert_int_equal(f.calls[CB_TEST], 0);
    assert_int_equal(f.calls[CB_WAIT], 0);
    assert_status(igrad__comm_group_end(comm), IGRAD_OK);
    assert_string_equal(custom_group_log, "S");
    assert_status(igrad__comm_group_end(comm), IGRAD_OK);
    assert_string_equal(custom_group_log, "SE");
    assert_status(igrad_comm_wait(comm, req), IGRAD_OK);
    assert_f64_equal(y, 1.5);
    igrad_comm_free(comm);
    assert_int_equal(f.destroyed, 1);
}

/* Buffers in a memory space the comm does not take are refused before the
 * backend sees them, naming both. */
static void test_memory_space(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    assert_int_equal(comm->spaces, IGRAD__MEM_BIT(IGRAD__MEM_HOST));
    assert_status(igrad__comm_check_space(comm, IGRAD__MEM_HOST, "here"), IGRAD_OK);
    assert_status(igrad__comm_check_space(comm, IGRAD__MEM_DEVICE, "here"),
                  IGRAD_E_UNSUPPORTED);
    assert_error_mentions("here: communicator 'self' cannot take device buffers");
    float a[2] = {1, 2}, b[2] = {0};
    igrad_comm_request_t *req = (igrad_comm_request_t *)&req;
    assert_status(igrad__comm_iallgather(comm, a, sizeof a, b, IGRAD__MEM_DEVICE, NULL, &req),
                  IGRAD_E_UNSUPPORTED);
    assert_error_mentions("communicator 'self' cannot take device buffers");
    assert_null(req);
    assert_status(igrad__comm_iallreduce(comm, a, b, 2, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM,
                                         IGRAD__MEM_DEVICE, NULL, &req),
                  IGRAD_E_UNSUPPORTED);
    assert_i64_equal(comm->pending, 0);
    assert_f64_equal(b[0], 0.0);
    igrad_comm_free(comm);

    group_fake_t g;
    comm = group_comm(&g, IGRAD__MEM_BIT(IGRAD__MEM_DEVICE));
    assert_status(igrad__comm_iallgather(comm, a, sizeof a, b, IGRAD__MEM_HOST, NULL, &req),
                  IGRAD_E_UNSUPPORTED);
    assert_error_mentions("communicator 'grouped' cannot take host buffers");
    assert_string_equal(g.log, "");
    igrad_comm_free(comm);
}

/* set_stream of a device custom table: records the stream it is given. */
static void *custom_stream_seen;
static int custom_stream_calls;

static igrad_status_t custom_set_stream_cb(void *user, void *stream)
{
    (void)user;
    custom_stream_seen = stream;
    custom_stream_calls++;
    return IGRAD_OK;
}

/* The custom table's memory field: a CUDA table needs its non-blocking
 * callbacks, refuses an unknown memory and set_stream on host memory;
 * its comm takes device buffers only (the public wrappers' host buffers
 * are refused naming both spaces), hands each non-blocking collective's
 * stream to set_stream first, and a CPU engine refuses it naming its data
 * plane and both spaces. A table that ends before `memory` is host. */
static void test_custom_memory(void **state)
{
    (void)state;
    fake_t f = {.rank = 0, .size = 1};
    igrad_comm_t *comm = NULL;
    igrad_comm_ops_t ops = fake_ops(0);
    ops.memory = IGRAD_MEMORY_CUDA;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);
    assert_error_mentions("ops->iallgather is NULL but required with memory IGRAD_MEMORY_CUDA");
    ops = fake_ops(1);
    ops.iallreduce = NULL;
    ops.memory = IGRAD_MEMORY_CUDA;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);
    assert_error_mentions("ops->iallreduce is NULL but required with memory IGRAD_MEMORY_CUDA");
    ops = fake_ops(1);
    ops.memory = (igrad_memory_t)7;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);
    assert_error_mentions("ops->memory is 7");
    ops.memory = IGRAD_MEMORY_HOST;
    ops.set_stream = custom_set_stream_cb;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_E_INVALID);
    assert_error_mentions("ops->set_stream is set but ops->memory is IGRAD_MEMORY_HOST");
    /* cut off before memory: host, and set_stream past the size unread */
    ops.memory = IGRAD_MEMORY_CUDA;
    ops.size = offsetof(igrad_comm_ops_t, memory);
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_OK);
    assert_int_equal(comm->spaces, IGRAD__MEM_BIT(IGRAD__MEM_HOST));
    igrad_comm_free(comm);

    ops = fake_ops(1);
    ops.memory = IGRAD_MEMORY_CUDA;
    ops.set_stream = custom_set_stream_cb;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_OK);
    assert_int_equal(comm->spaces, IGRAD__MEM_BIT(IGRAD__MEM_DEVICE));
    float a[2] = {1, 2}, b[2] = {0};
    igrad_comm_request_t *req = NULL;
    assert_status(igrad_comm_iallgather(comm, a, sizeof a, b, &req), IGRAD_E_UNSUPPORTED);
    assert_error_mentions("communicator 'custom' cannot take host buffers (it takes device "
                          "buffers)");
    assert_int_equal(f.calls[CB_IALLGATHER], 0);
    /* the fake copies bytes, so host memory stands in for the device here */
    custom_stream_calls = 0;
    assert_status(igrad__comm_iallgather(comm, a, sizeof a, b, IGRAD__MEM_DEVICE,
                                         (void *)&custom_stream_seen, &req),
                  IGRAD_OK);
    assert_int_equal(custom_stream_calls, 1);
    assert_ptr_equal(custom_stream_seen, (void *)&custom_stream_seen);
    assert_status(igrad_comm_wait(comm, req), IGRAD_OK);
    assert_f64_equal(b[1], 2.0);
    assert_status(igrad__comm_iallreduce(comm, a, b, 2, IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM,
                                         IGRAD__MEM_DEVICE, NULL, &req),
                  IGRAD_OK);
    assert_int_equal(custom_stream_calls, 2);
    assert_null(custom_stream_seen);
    assert_status(igrad_comm_wait(comm, req), IGRAD_OK);
    /* blocking collectives (the engine's agreement) stay on host memory */
    assert_status(igrad_comm_allgather(comm, a, sizeof a, b), IGRAD_OK);

    igrad_layout_t *L = NULL;
    int64_t n = 16;
    assert_status(igrad_layout_create(&L), IGRAD_OK);
    assert_status(igrad_layout_add(L, "model.norm.weight", IGRAD_DTYPE_F32, 1, &n), IGRAD_OK);
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    igrad_engine_t *e = (igrad_engine_t *)&e;
    assert_status(igrad_engine_create(L, NULL, &c, comm, &e), IGRAD_E_UNSUPPORTED);
    assert_null(e);
    assert_error_mentions("igrad_engine_create (data plane 'cpu'): communicator 'custom' cannot "
                          "take host buffers (it takes device buffers)");
    igrad_layout_free(L);
    igrad_comm_free(comm);
}

/* Two 2-D tensors and a 1-D one. */
static igrad_layout_t *small_layout(void)
{
    igrad_layout_t *L = NULL;
    int64_t w[2] = {48, 40}, v[2] = {40, 24}, bias[1] = {100};
    assert_status(igrad_layout_create(&L), IGRAD_OK);
    assert_status(igrad_layout_add(L, "model.layers.0.mlp.up_proj.weight", IGRAD_DTYPE_F32, 2,
                                   w),
                  IGRAD_OK);
    assert_status(igrad_layout_add(L, "model.layers.0.mlp.down_proj.weight", IGRAD_DTYPE_F32,
                                   2, v),
                  IGRAD_OK);
    assert_status(igrad_layout_add(L, "model.norm.weight", IGRAD_DTYPE_F32, 1, bias),
                  IGRAD_OK);
    return L;
}

/* The two-level sync needs a comm it can split into nodes: a custom comm
 * (no split, reduce or broadcast callbacks) is refused by name. */
static void test_hier_needs_split(void **state)
{
    (void)state;
    fake_t f = {.rank = 0, .size = 1};
    igrad_comm_ops_t ops = fake_ops(1);
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_custom(&ops, &f, 0, 1, &comm), IGRAD_OK);
    igrad_layout_t *L = small_layout();
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.topology = IGRAD_TOPOLOGY_HIER;
    igrad_engine_t *e = (igrad_engine_t *)&e;
    assert_status(igrad_engine_create(L, NULL, &c, comm, &e), IGRAD_E_UNSUPPORTED);
    assert_null(e);
    assert_error_mentions("can be split into nodes (MPI, NCCL, self, self_cuda, or custom with split, ireduce and ibcast); 'custom' cannot");
    igrad_layout_free(L);
    igrad_comm_free(comm);
}

/* igrad_engine_sync on a backend with group hooks: the step's collectives
 * are issued inside one group (none tested or waited before its end) on
 * the default stream, with the same result, bit for bit, as on the self
 * comm; an engine refuses a comm that cannot take its (host) buffers. */
static void test_engine_grouped(void **state)
{
    (void)state;
    igrad_layout_t *L = small_layout();
    size_t T = igrad_layout_count(L), n[3];
    float *ref[3], *got[3];
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        assert_status(igrad_layout_tensor(L, t, &ti), IGRAD_OK);
        n[t] = (size_t)ti.count;
        ref[t] = malloc(n[t] * sizeof(float));
        got[t] = malloc(n[t] * sizeof(float));
        assert_non_null(ref[t]);
        assert_non_null(got[t]);
    }
    igrad_config_t cfg = IGRAD_CONFIG_INIT;
    cfg.method = IGRAD_METHOD_TOPK_SYNC;
    cfg.density = 0.1;
    cfg.buckets = 3;

    igrad_comm_t *self = NULL;
    group_fake_t g;
    igrad_comm_t *grouped = group_comm(&g, IGRAD__MEM_BIT(IGRAD__MEM_HOST));
    igrad_engine_t *e_ref = NULL, *e_got = NULL;
    assert_status(igrad_comm_create_self(&self), IGRAD_OK);
    assert_status(igrad_engine_create(L, NULL, &cfg, self, &e_ref), IGRAD_OK);
    assert_status(igrad_engine_create(L, NULL, &cfg, grouped, &e_got), IGRAD_OK);
    for (int64_t step = 0; step < 3; step++) {
        for (size_t t = 0; t < T; t++)
            for (size_t i = 0; i < n[t]; i++)
                ref[t][i] = got[t][i] =
                    (float)sin(0.37 * (double)(i + 1) * (double)(t + 1) + (double)step);
        g.n = 0;
        g.log[0] = '\0';
        assert_status(igrad_engine_sync(e_ref, step, ref), IGRAD_OK);
        assert_status(igrad_engine_sync(e_got, step, got), IGRAD_OK);
        for (size_t t = 0; t < T; t++) assert_memory_equal(got[t], ref[t], n[t] * sizeof(float));
        igrad_step_stats_t st;
        assert_status(igrad_engine_last_stats(e_got, &st), IGRAD_OK);
        /* the finiteness agreement, then one group of st.buckets gathers,
         * waited in order after its end */
        char want[64] = "A", *w = want + 1;
        *w++ = 'S';
        for (int j = 0; j < st.buckets; j++) *w++ = 'g';
        *w++ = 'E';
        for (int j = 0; j < st.buckets; j++) *w++ = 'w';
        *w = '\0';
        assert_true(st.buckets >= 2);
        assert_string_equal(g.log, want);
        assert_null(g.stream);
    }
    assert_int_equal(grouped->group_depth, 0);
    igrad_engine_free(e_got);
    igrad_comm_free(grouped);

    /* a device-only comm and the host data plane */
    igrad_comm_t *dev = group_comm(&g, IGRAD__MEM_BIT(IGRAD__MEM_DEVICE));
    e_got = (igrad_engine_t *)&e_got;
    assert_status(igrad_engine_create(L, NULL, &cfg, dev, &e_got), IGRAD_E_UNSUPPORTED);
    assert_error_mentions("communicator 'grouped' cannot take host buffers");
    assert_null(e_got);
    igrad_comm_free(dev);

    igrad_engine_free(e_ref);
    igrad_comm_free(self);
    for (size_t t = 0; t < T; t++) {
        free(ref[t]);
        free(got[t]);
    }
    igrad_layout_free(L);
}

static void test_mpi_without_init(void **state)
{
    (void)state;
    igrad_comm_t sentinel = {0};
    igrad_comm_t *comm = &sentinel;
    igrad_status_t st = igrad_comm_create_mpi(NULL, &comm);
    if (st != IGRAD_E_STATE && st != IGRAD_E_UNSUPPORTED)
        fail_msg("igrad_comm_create_mpi returned %d (%s), expected %d or %d", (int)st,
                 igrad_status_str(st), IGRAD_E_STATE, IGRAD_E_UNSUPPORTED);
    assert_null(comm);
    assert_error_mentions(st == IGRAD_E_STATE ? "not initialized" : "without MPI");
    assert_status(igrad_comm_create_mpi(NULL, NULL), st == IGRAD_E_STATE ? IGRAD_E_INVALID
                                                                          : IGRAD_E_UNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_basics),
        cmocka_unit_test(test_self_timeout),
        cmocka_unit_test(test_self_allgather),
        cmocka_unit_test(test_self_allreduce),
        cmocka_unit_test(test_self_bcast),
        cmocka_unit_test(test_self_nonblocking),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_custom_validation),
        cmocka_unit_test(test_custom_blocking_fallback),
        cmocka_unit_test(test_custom_nonblocking),
        cmocka_unit_test(test_custom_two_ranks),
        cmocka_unit_test(test_custom_errors),
        cmocka_unit_test(test_group_hooks),
        cmocka_unit_test(test_group_noop),
        cmocka_unit_test(test_custom_groups),
        cmocka_unit_test(test_memory_space),
        cmocka_unit_test(test_custom_memory),
        cmocka_unit_test(test_engine_grouped),
        cmocka_unit_test(test_hier_needs_split),
        cmocka_unit_test(test_mpi_without_init),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
