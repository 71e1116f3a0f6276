/*
 * comm_mpi.c — the MPI backend (compiled only when CMake finds MPI, which
 * also defines IGRAD_HAVE_MPI). It works on a duplicate of the caller's
 * communicator with MPI_ERRORS_RETURN, so igrad's collectives never match
 * the caller's messages and a failing MPI call becomes IGRAD_E_COMM with
 * MPI's own error text instead of aborting a process that may be hosting
 * Python.
 *
 * MPI counts are int. Rather than refuse larger messages, every operation
 * is cut into pieces of at most max_count elements (INT_MAX by default):
 * allreduce and bcast pieces are contiguous runs; an allgather piece at
 * byte offset o gathers each rank's bytes [o, o+n) with a receive datatype
 * whose extent is the whole per-rank block, so the pieces land where one
 * large allgather would have put them. Non-blocking operations keep one
 * MPI_Request per piece. The internal alltoallv is point-to-point, one
 * message (or more pieces) per pair (mpi_alltoallv). Argument checks live
 * in comm.c; they also keep away the few argument errors (aliased
 * send/recv buffers) that Open MPI reports through MPI_COMM_WORLD's error
 * handler whatever the handler of the communicator in use.
 *
 * Every operation, blocking ones included, is started non-blocking
 * (MPI_Iallgather, MPI_Iallreduce, MPI_Ibcast, MPI_Ibarrier) and completed
 * by mpi_complete(): MPI does not match a blocking collective with a
 * non-blocking one, so a rank with a timeout and a rank without must issue
 * the same kind. Without a timeout mpi_complete() is MPI_Waitall; with one
 * (comm->timeout_s > 0) it polls MPI_Testall against the deadline. It spins (with sched_yield) for the
 * first SPIN_S seconds, as a blocking MPI call would, because Open MPI
 * advances a non-blocking collective only while the process is inside MPI;
 * only a wait that is already long sleeps, with a backoff capped at
 * SLEEP_MAX_NS, so the deadline is met within about a millisecond. MPI has
 * no portable way to cancel a collective: on expiry the operation is left
 * pending (its requests and buffers are never released), the comm is
 * marked broken and its duplicate is not freed.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep, sched_yield */
#include "comm/comm_internal.h"

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPIN_S 0.2              /* poll without sleeping for this long */
#define SLEEP_MIN_NS 50000L     /* then sleep 50 us, doubling ... */
#define SLEEP_MAX_NS 1000000L   /* ... up to 1 ms between polls */

/* Reusable buffers for the Open MPI all-reduce fixes (OMPI_LIBNBC_FIXES):
 * an in-place call's send copy, the 2-rank swap's receive buffer. Fresh
 * memory for every call would cost its page faults each time: 4 MiB at
 * np 4 on this VM took 19 ms against 8 ms from a buffer kept. */
#define SCRATCH_SLOTS 8
typedef struct scratch_slot {
    void *buf;
    size_t cap;
    int busy; /* held by a request in flight */
} scratch_slot_t;

typedef struct mpi_impl {
    MPI_Comm comm;    /* the library's duplicate; freed by mpi_destroy */
    scratch_slot_t scratch[SCRATCH_SLOTS]; /* freed by mpi_destroy when not busy */
    size_t max_count; /* largest count handed to one MPI call */
    igrad__comm_recv_hook_t recv_hook; /* test hook (comm_internal.h) */
    void *recv_hook_user;
} mpi_impl_t;

/* State of one non-blocking operation: its pieces' requests. */
typedef struct mpi_request {
    void *recv;         /* iallgather: the receive buffer (for the test hook) */
    size_t nbytes;      /* iallgather: bytes per rank */
    void *scratch;      /* iallreduce: an in-place call's send copy, or the swap's receive buffer */
    mpi_impl_t *scratch_pool; /* the comm whose slot scratch_slot holds it; NULL: own malloc */
    int scratch_slot;
    /* an all-reduce by swap (use_exchange): summed at completion */
    void *exch_result;      /* where the result goes (recv) */
    const void *exch_own;   /* this rank's vector (send, or recv in place) */
    size_t exch_count;
    igrad_dtype_t exch_dtype;
    igrad_reduce_op_t exch_op;
    int count;
    MPI_Request reqs[]; /* count entries */
} mpi_request_t;

/* Records "<what> failed: <MPI's text>" and returns IGRAD_E_COMM. */
static igrad_status_t mpi_fail(int rc, const char *what, const char *file, int line)
{
    char text[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS || len < 0) len = 0;
    text[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING] = '\0';
    return igrad__fail(IGRAD_E_COMM, file, line, "%s failed: %s (MPI error %d)", what,
                       len > 0 ? text : "unknown MPI error", rc);
}

#define MPI_CHECK(call, what)                                                   \
    do {                                                                        \
        int mpi_rc_ = (call);                                                   \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_fail(mpi_rc_, what, __FILE__, __LINE__); \
    } while (0)

static size_t piece_count(size_t n, size_t max_count)
{
    return n == 0 ? 1 : (n - 1) / max_count + 1;
}

static MPI_Datatype mpi_dtype(igrad_dtype_t dtype)
{
    switch (dtype) {
    case IGRAD_DTYPE_F32: return MPI_FLOAT;
    case IGRAD_DTYPE_F64: return MPI_DOUBLE;
    default: return MPI_INT64_T; /* comm.c admits only F32, F64 and I64 */
    }
}

static MPI_Op mpi_op(igrad_reduce_op_t op)
{
    switch (op) {
    case IGRAD_REDUCE_MAX: return MPI_MAX;
    case IGRAD_REDUCE_MIN: return MPI_MIN;
    default: return MPI_SUM;
    }
}

/* Allocates the request state for `pieces` operations (all MPI_REQUEST_NULL,
 * so waiting on a partly issued set is safe). */
static igrad_status_t request_state_new(size_t pieces, const char *what, mpi_request_t **out)
{
    IGRAD_FAIL_IF(pieces > INT_MAX, IGRAD_E_INVALID,
                  "%s: %zu pieces are more than one MPI_Waitall can take", what, pieces);
    mpi_request_t *state = malloc(sizeof *state + pieces * sizeof(MPI_Request));
    IGRAD_FAIL_IF(!state, IGRAD_E_NOMEM, "%s: out of memory for %zu MPI requests", what,
                  pieces);
    state->recv = NULL;
    state->nbytes = 0;
    state->scratch = NULL;
    state->scratch_pool = NULL;
    state->scratch_slot = -1;
    state->exch_result = NULL;
    state->count = (int)pieces;
    for (size_t i = 0; i < pieces; i++) state->reqs[i] = MPI_REQUEST_NULL;
    *out = state;
    return IGRAD_OK;
}

/* A send copy of nbytes: a free slot's buffer (the smallest that fits, or
 * one regrown), or its own malloc when every slot is busy. NULL: no memory. */
static void *scratch_take(mpi_impl_t *impl, size_t nbytes, int *slot)
{
    int fit = -1, any = -1;
    for (int i = 0; i < SCRATCH_SLOTS; i++) {
        const scratch_slot_t *sl = &impl->scratch[i];
        if (sl->busy) continue;
        if (sl->cap >= nbytes && (fit < 0 || sl->cap < impl->scratch[fit].cap)) fit = i;
        if (any < 0 || sl->cap > impl->scratch[any].cap) any = i;
    }
    *slot = fit >= 0 ? fit : any;
    if (*slot < 0) return malloc(nbytes);
    scratch_slot_t *sl = &impl->scratch[*slot];
    if (fit < 0) { /* regrow the largest free one */
        free(sl->buf);
        sl->buf = malloc(nbytes);
        sl->cap = sl->buf ? nbytes : 0;
        if (!sl->buf) return NULL;
    }
    sl->busy = 1;
    return sl->buf;
}

static void request_state_free(mpi_request_t *state)
{
    if (state->scratch_pool) state->scratch_pool->scratch[state->scratch_slot].busy = 0;
    else free(state->scratch);
    free(state);
}

/* After a piece failed to start, the pieces already started still use the
 * caller's buffers: let them finish before reporting the failure. */
static igrad_status_t abandon_pieces(mpi_request_t *state, igrad_status_t st)
{
    MPI_Waitall(state->count, state->reqs, MPI_STATUSES_IGNORE);
    request_state_free(state);
    return st;
}

static void exchange_finish(const igrad_comm_t *comm, const mpi_request_t *state);

/* Completes every piece of `state` and frees it, within the comm's timeout
 * when it has one. On expiry the pieces are left pending and `state` is
 * leaked on purpose (MPI still owns the requests and the buffers), the comm
 * is marked broken and IGRAD_E_TIMEOUT names `what`. */
static igrad_status_t mpi_complete(igrad_comm_t *comm, mpi_request_t *state, const char *what)
{
    double limit = comm->timeout_s;
    int rc;
    if (limit <= 0.0) {
        rc = MPI_Waitall(state->count, state->reqs, MPI_STATUSES_IGNORE);
    } else {
        double t0 = igrad__now_ms();
        long sleep_ns = 0;
        for (;;) {
            int flag = 0;
            rc = MPI_Testall(state->count, state->reqs, &flag, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS || flag) break;
            double waited = (igrad__now_ms() - t0) / 1e3;
            if (waited >= limit) {
                igrad__fail(IGRAD_E_TIMEOUT, __FILE__, __LINE__,
                            "%s did not complete within %g s (a rank is stopped, wedged or "
                            "out of step); it is left pending and the communicator is "
                            "unusable: abort the job",
                            what, limit);
                return igrad__comm_break(comm, IGRAD_E_TIMEOUT);
            }
            if (waited < SPIN_S) {
                sched_yield();
                continue;
            }
            sleep_ns = sleep_ns ? 2 * sleep_ns : SLEEP_MIN_NS;
            if (sleep_ns > SLEEP_MAX_NS) sleep_ns = SLEEP_MAX_NS;
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
        }
    }
    if (rc == MPI_SUCCESS && state->exch_result) exchange_finish(comm, state);
    request_state_free(state);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, what, __FILE__, __LINE__);
    return IGRAD_OK;
}

/* ---- allgather ----------------------------------------------------------- */

/* Starts gathering bytes [off, off+n) of every rank's nbytes-byte block. */
static igrad_status_t allgather_piece(const mpi_impl_t *impl, const void *send, size_t nbytes,
                                      void *recv, size_t off, size_t n, int in_place,
                                      MPI_Request *req)
{
    const char *what = "MPI_Iallgather";
    const void *sbuf = in_place ? MPI_IN_PLACE : (const unsigned char *)send + off;
    void *rbuf = (unsigned char *)recv + off;
    if (n == nbytes) {
        /* The whole block in one piece: no derived datatype needed. */
        MPI_CHECK(MPI_Iallgather(sbuf, (int)n, MPI_BYTE, rbuf, (int)n, MPI_BYTE, impl->comm,
                                 req),
                  what);
        return IGRAD_OK;
    }
    MPI_Datatype piece, block;
    MPI_CHECK(MPI_Type_contiguous((int)n, MPI_BYTE, &piece), "MPI_Type_contiguous");
    int rc = MPI_Type_create_resized(piece, 0, (MPI_Aint)nbytes, &block);
    MPI_Type_free(&piece);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Type_create_resized", __FILE__, __LINE__);
    rc = MPI_Type_commit(&block);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Iallgather(sbuf, (int)n, MPI_BYTE, rbuf, 1, block, impl->comm, req);
    } else {
        what = "MPI_Type_commit";
    }
    /* Freeing a datatype that a pending operation uses is allowed: MPI
     * releases it when the operation completes. */
    MPI_Type_free(&block);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, what, __FILE__, __LINE__);
    return IGRAD_OK;
}

static igrad_status_t mpi_gather_all(igrad_comm_t *comm, const void *send, size_t nbytes,
                                     void *recv, mpi_request_t *state)
{
    const mpi_impl_t *impl = comm->impl;
    const unsigned char *own = (const unsigned char *)recv + (size_t)comm->rank * nbytes;
    int in_place = nbytes > 0 && send == (const void *)own;
    size_t pieces = piece_count(nbytes, impl->max_count);
    for (size_t i = 0; i < pieces; i++) {
        size_t off = i * impl->max_count;
        size_t n = nbytes - off < impl->max_count ? nbytes - off : impl->max_count;
        IGRAD_CHECK(allgather_piece(impl, send, nbytes, recv, off, n, in_place,
                                    &state->reqs[i]));
    }
    return IGRAD_OK;
}

static igrad_status_t mpi_allgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                    void *recv)
{
    const mpi_impl_t *impl = comm->impl;
    mpi_request_t *state = NULL;
    IGRAD_CHECK(request_state_new(piece_count(nbytes, impl->max_count), "igrad_comm_allgather",
                                  &state));
    igrad_status_t st = mpi_gather_all(comm, send, nbytes, recv, state);
    if (st != IGRAD_OK) return abandon_pieces(state, st);
    char what[96];
    snprintf(what, sizeof what, "allgather of %zu bytes per rank", nbytes);
    return mpi_complete(comm, state, what);
}

static igrad_status_t mpi_iallgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                     void *recv, void *stream, igrad_comm_request_t *req)
{
    (void)stream; /* MPI has no streams */
    const mpi_impl_t *impl = comm->impl;
    mpi_request_t *state = NULL;
    IGRAD_CHECK(request_state_new(piece_count(nbytes, impl->max_count),
                                  "igrad_comm_iallgather", &state));
    igrad_status_t st = mpi_gather_all(comm, send, nbytes, recv, state);
    if (st != IGRAD_OK) return abandon_pieces(state, st);
    state->recv = recv;
    state->nbytes = nbytes;
    req->handle = state;
    return IGRAD_OK;
}

/* ---- allreduce ----------------------------------------------------------- */

/* Open MPI's MPI_Iallreduce (coll/libnbc) takes a bandwidth-optimal
 * algorithm (recursive halving then doubling) only for at least 4 ranks,
 * 64 KiB and a send buffer that is not MPI_IN_PLACE; an in-place call gets
 * the binomial reduce-then-broadcast,
 * which moves the whole vector log2(P) times each way. Measured on the
 * namespace testbed (4 x 1, 200 Mbit/s): 16 MiB F32 in place 3.54 s, from a
 * separate send buffer 1.10 s (docs/results/plan_validation.md). So an
 * in-place call that would get that algorithm otherwise sends from a copy: one
 * memcpy of the vector, held until the request completes. */
#if defined(OPEN_MPI) && OPEN_MPI
#define OMPI_LIBNBC_FIXES 1
#else
#define OMPI_LIBNBC_FIXES 0
#endif
#define OMPI_FAST_MIN_RANKS 4
#define OMPI_FAST_MIN_BYTES 65536

static int in_place_needs_copy(const igrad_comm_t *comm, size_t nbytes)
{
    return OMPI_LIBNBC_FIXES && comm->size >= OMPI_FAST_MIN_RANKS && nbytes >= OMPI_FAST_MIN_BYTES;
}

/* Open MPI's MPI_Iallreduce takes the binomial tree below 4 ranks whatever
 * the buffers: at 2 ranks one sends its vector, the other adds and sends
 * the sum back, 2 n bytes in turn where the ring's halves cross at once.
 * From EXCHANGE_MIN_BYTES at 2 ranks the two therefore swap vectors
 * (MPI_Isend / MPI_Irecv on the duplicate, tag EXCHANGE_TAG) and each sums
 * them in rank order when the request completes: n bytes each way at once,
 * the same bits on both ranks, n bytes of pooled receive buffer. Testbed,
 * 2 x 1 at 200 Mbit/s: 4 MiB in 184 ms against MPI's 353 ms; on one host's
 * shared memory about even (3 MiB 2.2 vs 1.5-2.0 ms, 12 MiB 11.3 vs 17.0). At 3 ranks the
 * same swap (2 n each way) measured no faster than the tree (720 vs 704
 * ms), so there MPI keeps it. */
#define EXCHANGE_MIN_BYTES 65536
#define EXCHANGE_TAG 0x1a2b

static int use_exchange(const igrad_comm_t *comm, size_t nbytes)
{
    return OMPI_LIBNBC_FIXES && comm->size == 2 && nbytes >= EXCHANGE_MIN_BYTES;
}

#define EXCHANGE_SUM(T, OPX)                                                \
    do {                                                                   \
        T *out = state->exch_result;                                       \
        const T *a = first, *b = second;                                   \
        for (size_t i = 0; i < n; i++) out[i] = OPX(a[i], b[i]);           \
    } while (0)
#define EXCH_ADD(a, b) ((a) + (b))
#define EXCH_MAX(a, b) ((b) > (a) ? (b) : (a))
#define EXCH_MIN(a, b) ((b) < (a) ? (b) : (a))

/* The swap's result, rank 0's vector first (so both ranks get the same
 * bits); the result may alias this rank's vector (in place). */
static void exchange_finish(const igrad_comm_t *comm, const mpi_request_t *state)
{
    size_t n = state->exch_count;
    const void *first = comm->rank == 0 ? state->exch_own : state->scratch;
    const void *second = comm->rank == 0 ? state->scratch : state->exch_own;
    igrad_reduce_op_t op = state->exch_op;
    switch (state->exch_dtype) {
    case IGRAD_DTYPE_F32:
        if (op == IGRAD_REDUCE_MAX) EXCHANGE_SUM(float, EXCH_MAX);
        else if (op == IGRAD_REDUCE_MIN) EXCHANGE_SUM(float, EXCH_MIN);
        else EXCHANGE_SUM(float, EXCH_ADD);
        break;
    case IGRAD_DTYPE_F64:
        if (op == IGRAD_REDUCE_MAX) EXCHANGE_SUM(double, EXCH_MAX);
        else if (op == IGRAD_REDUCE_MIN) EXCHANGE_SUM(double, EXCH_MIN);
        else EXCHANGE_SUM(double, EXCH_ADD);
        break;
    default: /* I64: comm.c admits no other */
        if (op == IGRAD_REDUCE_MAX) EXCHANGE_SUM(int64_t, EXCH_MAX);
        else if (op == IGRAD_REDUCE_MIN) EXCHANGE_SUM(int64_t, EXCH_MIN);
        else EXCHANGE_SUM(int64_t, EXCH_ADD);
        break;
    }
}

/* Takes a pooled buffer of nbytes into state->scratch; 0 when none. */
static int state_take_scratch(mpi_impl_t *impl, mpi_request_t *state, size_t nbytes)
{
    int slot = -1;
    state->scratch = scratch_take(impl, nbytes, &slot);
    if (state->scratch && slot >= 0) {
        state->scratch_pool = impl;
        state->scratch_slot = slot;
    }
    return state->scratch != NULL;
}

/* Starts an all-reduce: the exchange (use_exchange), else MPI_Iallreduce in
 * pieces, from a send copy where in place would cost the ring
 * (in_place_needs_copy); without memory for a copy or the exchange's buffers
 * it falls back to plain MPI_Iallreduce (correct, slower). On failure
 * *out is NULL and nothing is left in flight. */
static igrad_status_t mpi_reduce_start(igrad_comm_t *comm, const void *send, void *recv,
                                       size_t count, igrad_dtype_t dtype,
                                       igrad_reduce_op_t op, const char *what,
                                       mpi_request_t **out)
{
    mpi_impl_t *impl = comm->impl;
    size_t elem = igrad_dtype_nbytes(dtype), nbytes = count * elem;
    size_t pieces = piece_count(count, impl->max_count);
    mpi_request_t *state = NULL;
    *out = NULL;
    if (use_exchange(comm, nbytes)) {
        IGRAD_CHECK(request_state_new(2 * pieces, what, &state));
        if (state_take_scratch(impl, state, nbytes)) {
            int peer = 1 - comm->rank;
            state->exch_result = recv;
            state->exch_own = send;
            state->exch_count = count;
            state->exch_dtype = dtype;
            state->exch_op = op;
            for (size_t i = 0; i < pieces; i++) {
                size_t off = i * impl->max_count;
                int n = (int)(count - off < impl->max_count ? count - off : impl->max_count);
                int rc = MPI_Irecv((unsigned char *)state->scratch + off * elem, n,
                                   mpi_dtype(dtype), peer, EXCHANGE_TAG, impl->comm,
                                   &state->reqs[2 * i]);
                if (rc == MPI_SUCCESS)
                    rc = MPI_Isend((const unsigned char *)send + off * elem, n, mpi_dtype(dtype),
                                   peer, EXCHANGE_TAG, impl->comm, &state->reqs[2 * i + 1]);
                if (rc != MPI_SUCCESS)
                    return abandon_pieces(state, mpi_fail(rc, "MPI_Isend/MPI_Irecv", __FILE__,
                                                          __LINE__));
            }
            *out = state;
            return IGRAD_OK;
        }
        request_state_free(state); /* no memory for the exchange */
        state = NULL;
    }
    IGRAD_CHECK(request_state_new(pieces, what, &state));
    int in_place = count > 0 && send == (const void *)recv;
    if (in_place && in_place_needs_copy(comm, nbytes) && state_take_scratch(impl, state, nbytes)) {
        memcpy(state->scratch, recv, nbytes);
        send = state->scratch;
        in_place = 0;
    }
    for (size_t i = 0; i < pieces; i++) {
        size_t off = i * impl->max_count;
        size_t n = count - off < impl->max_count ? count - off : impl->max_count;
        const void *sbuf = in_place ? MPI_IN_PLACE : (const unsigned char *)send + off * elem;
        void *rbuf = (unsigned char *)recv + off * elem;
        int rc = MPI_Iallreduce(sbuf, rbuf, (int)n, mpi_dtype(dtype), mpi_op(op), impl->comm,
                                &state->reqs[i]);
        if (rc != MPI_SUCCESS)
            return abandon_pieces(state, mpi_fail(rc, "MPI_Iallreduce", __FILE__, __LINE__));
    }
    *out = state;
    return IGRAD_OK;
}

static igrad_status_t mpi_allreduce(igrad_comm_t *comm, const void *send, void *recv,
                                    size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    mpi_request_t *state = NULL;
    IGRAD_CHECK(mpi_reduce_start(comm, send, recv, count, dtype, op, "igrad_comm_allreduce",
                                 &state));
    char what[96];
    snprintf(what, sizeof what, "allreduce of %zu elements", count);
    return mpi_complete(comm, state, what);
}

static igrad_status_t mpi_iallreduce(igrad_comm_t *comm, const void *send, void *recv,
                                     size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                     void *stream, igrad_comm_request_t *req)
{
    (void)stream;
    mpi_request_t *state = NULL;
    IGRAD_CHECK(mpi_reduce_start(comm, send, recv, count, dtype, op, "igrad_comm_iallreduce",
                                 &state));
    req->handle = state;
    return IGRAD_OK;
}

/* ---- alltoallv -------------------------------------------------------------- */

/* Point-to-point rather than MPI_Ialltoallv, whose counts and displacements
 * are int: each pair's block is cut into pieces of at most max_count bytes,
 * which both ends of the pair count alike from the same block size, while
 * cutting a collective would need every rank to know the largest block.
 * Every pair exchanges at least one (possibly empty) message each way, as
 * MPI_Alltoallv does, so a receive posted too small fails (MPI_ERR_TRUNCATE)
 * instead of waiting for a message that never comes. MPI keeps messages of
 * one sender and tag in order, so the pieces, and the blocks of back-to-back
 * calls, match; point-to-point traffic never matches a collective. */
#define ALLTOALLV_TAG 0x1a2a

static igrad_status_t mpi_alltoallv(igrad_comm_t *comm, const void *send,
                                    const size_t *send_nbytes, const size_t *send_displs,
                                    void *recv, const size_t *recv_nbytes,
                                    const size_t *recv_displs, void *stream)
{
    (void)stream; /* host bytes (the comm's spaces): no queue */
    const mpi_impl_t *impl = comm->impl;
    const int P = comm->size, me = comm->rank;
    IGRAD_FAIL_IF(send_nbytes[me] != recv_nbytes[me], IGRAD_E_INVALID,
                  "igrad__comm_alltoallv: rank %d sends %zu bytes to itself but expects %zu",
                  me, send_nbytes[me], recv_nbytes[me]);
    size_t pieces = 0;
    for (int j = 0; j < P; j++)
        if (j != me)
            pieces += piece_count(send_nbytes[j], impl->max_count) +
                      piece_count(recv_nbytes[j], impl->max_count);
    mpi_request_t *state = NULL;
    IGRAD_CHECK(request_state_new(pieces, "igrad__comm_alltoallv", &state));
    if (send_nbytes[me] > 0)
        memcpy((unsigned char *)recv + recv_displs[me],
               (const unsigned char *)send + send_displs[me], send_nbytes[me]);
    size_t r = 0;
    /* receives first, then sends in rotated order (me+1, me+2, ...) so that
     * not every rank starts with rank 0 */
    for (int pass = 0; pass < 2; pass++) {
        for (int s = 1; s < P; s++) {
            int j = pass == 0 ? (me - s + P) % P : (me + s) % P;
            size_t n = pass == 0 ? recv_nbytes[j] : send_nbytes[j];
            size_t off = pass == 0 ? recv_displs[j] : send_displs[j];
            size_t np = piece_count(n, impl->max_count);
            for (size_t i = 0; i < np; i++) {
                size_t at = i * impl->max_count;
                int len = (int)(n - at < impl->max_count ? n - at : impl->max_count);
                int rc = pass == 0
                             ? MPI_Irecv((unsigned char *)recv + off + at, len, MPI_BYTE, j,
                                         ALLTOALLV_TAG, impl->comm, &state->reqs[r])
                             : MPI_Isend((const unsigned char *)send + off + at, len, MPI_BYTE,
                                         j, ALLTOALLV_TAG, impl->comm, &state->reqs[r]);
                if (rc != MPI_SUCCESS)
                    return abandon_pieces(state, mpi_fail(rc, pass == 0 ? "MPI_Irecv"
                                                                       : "MPI_Isend",
                                                          __FILE__, __LINE__));
                r++;
            }
        }
    }
    return mpi_complete(comm, state, "alltoallv");
}

/* ---- bcast, barrier, completion ----------------------------------------- */

static igrad_status_t mpi_bcast_all(const mpi_impl_t *impl, void *buf, size_t nbytes, int root,
                                    mpi_request_t *state)
{
    size_t pieces = piece_count(nbytes, impl->max_count);
    for (size_t i = 0; i < pieces; i++) {
        size_t off = i * impl->max_count;
        size_t n = nbytes - off < impl->max_count ? nbytes - off : impl->max_count;
        MPI_CHECK(MPI_Ibcast((unsigned char *)buf + off, (int)n, MPI_BYTE, root, impl->comm,
                             &state->reqs[i]),
                  "MPI_Ibcast");
    }
    return IGRAD_OK;
}

static igrad_status_t mpi_bcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root)
{
    const mpi_impl_t *impl = comm->impl;
    mpi_request_t *state = NULL;
    IGRAD_CHECK(request_state_new(piece_count(nbytes, impl->max_count), "igrad_comm_bcast",
                                  &state));
    igrad_status_t st = mpi_bcast_all(impl, buf, nbytes, root, state);
    if (st != IGRAD_OK) return abandon_pieces(state, st);
    char what[96];
    snprintf(what, sizeof what, "bcast of %zu bytes from rank %d", nbytes, root);
    return mpi_complete(comm, state, what);
}

static igrad_status_t mpi_barrier(igrad_comm_t *comm)
{
    const mpi_impl_t *impl = comm->impl;
    mpi_request_t *state = NULL;
    IGRAD_CHECK(request_state_new(1, "igrad_comm_barrier", &state));
    int rc = MPI_Ibarrier(impl->comm, &state->reqs[0]);
    if (rc != MPI_SUCCESS) {
        request_state_free(state);
        return mpi_fail(rc, "MPI_Ibarrier", __FILE__, __LINE__);
    }
    return mpi_complete(comm, state, "barrier");
}

static igrad_status_t mpi_wait(igrad_comm_t *comm, igrad_comm_request_t *req)
{
    mpi_request_t *state = req->handle;
    /* the request is released whatever happens (on a timeout the state
     * stays with MPI, see mpi_complete) */
    req->handle = NULL;
    char what[64];
    snprintf(what, sizeof what, "an %s", req->op);
    void *recv = state->recv;
    size_t nbytes = state->nbytes;
    igrad_status_t st = mpi_complete(comm, state, what);
    const mpi_impl_t *impl = comm->impl;
    if (st == IGRAD_OK && recv && impl->recv_hook)
        impl->recv_hook(impl->recv_hook_user, recv, nbytes);
    return st;
}

static igrad_status_t mpi_test(igrad_comm_t *comm, igrad_comm_request_t *req, int *done)
{
    (void)comm;
    mpi_request_t *state = req->handle;
    int flag = 0;
    int rc = MPI_Testall(state->count, state->reqs, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        char what[64];
        snprintf(what, sizeof what, "MPI_Testall on an %s", req->op);
        return mpi_fail(rc, what, __FILE__, __LINE__);
    }
    *done = flag != 0;
    return IGRAD_OK;
}

/* ---- split, reduce to a root, non-blocking bcast (the two-level sync) ---- */

static igrad_status_t mpi_wrap(MPI_Comm c, igrad_comm_t **out);

static igrad_status_t mpi_split(igrad_comm_t *comm, int color, int key, igrad_comm_t **out)
{
    const mpi_impl_t *impl = comm->impl;
    MPI_Comm c = MPI_COMM_NULL;
    if (color == IGRAD__SPLIT_NODE)
        MPI_CHECK(MPI_Comm_split_type(impl->comm, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &c),
                  "MPI_Comm_split_type");
    else MPI_CHECK(MPI_Comm_split(impl->comm, color, key, &c), "MPI_Comm_split");
    igrad_status_t st = mpi_wrap(c, out);
    if (st != IGRAD_OK) MPI_Comm_free(&c);
    return st;
}

static igrad_status_t mpi_ireduce(igrad_comm_t *comm, const void *send, void *recv,
                                  size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                  int root, void *stream, igrad_comm_request_t *req)
{
    const mpi_impl_t *impl = comm->impl;
    (void)stream; /* host buffers: no queue */
    mpi_request_t *state = NULL;
    IGRAD_CHECK(request_state_new(piece_count(count, impl->max_count), "igrad_comm ireduce",
                                  &state));
    size_t elem = igrad_dtype_nbytes(dtype);
    for (int i = 0; i < state->count; i++) {
        size_t off = (size_t)i * impl->max_count;
        size_t n = count - off < impl->max_count ? count - off : impl->max_count;
        void *rbuf = recv ? (unsigned char *)recv + off * elem : NULL;
        int rc = MPI_Ireduce((const unsigned char *)send + off * elem, rbuf, (int)n,
                             mpi_dtype(dtype), mpi_op(op), root, impl->comm, &state->reqs[i]);
        if (rc != MPI_SUCCESS)
            return abandon_pieces(state, mpi_fail(rc, "MPI_Ireduce", __FILE__, __LINE__));
    }
    req->handle = state;
    return IGRAD_OK;
}

static igrad_status_t mpi_ibcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root,
                                 void *stream, igrad_comm_request_t *req)
{
    const mpi_impl_t *impl = comm->impl;
    (void)stream;
    mpi_request_t *state = NULL;
    IGRAD_CHECK(request_state_new(piece_count(nbytes, impl->max_count), "igrad_comm ibcast",
                                  &state));
    igrad_status_t st = mpi_bcast_all(impl, buf, nbytes, root, state);
    if (st != IGRAD_OK) return abandon_pieces(state, st);
    req->handle = state;
    return IGRAD_OK;
}

static void mpi_destroy(igrad_comm_t *comm)
{
    mpi_impl_t *impl = comm->impl;
    int finalized = 0;
    MPI_Finalized(&finalized);
    /* After MPI_Finalize no MPI call is allowed; the duplicate died with
     * MPI, only our memory is left to release. */
    /* A broken comm has an operation pending on its duplicate: freeing it
     * would hand MPI a communicator still in use, so it is left to MPI. */
    if (!finalized && !comm->broken && impl->comm != MPI_COMM_NULL) MPI_Comm_free(&impl->comm);
    /* a busy copy belongs to an operation left pending (a timeout) */
    for (int i = 0; i < SCRATCH_SLOTS; i++)
        if (!impl->scratch[i].busy) free(impl->scratch[i].buf);
    free(impl);
}

/* Host buffers (a CUDA-aware MPI could add the device bit per comm); no
 * group hooks: each collective starts when issued. */
static const igrad__comm_vtable_t mpi_vtable = {
    .spaces = IGRAD__MEM_BIT(IGRAD__MEM_HOST),
    .allgather = mpi_allgather,
    .allreduce = mpi_allreduce,
    .bcast = mpi_bcast,
    .barrier = mpi_barrier,
    .iallgather = mpi_iallgather,
    .iallreduce = mpi_iallreduce,
    .wait = mpi_wait,
    .test = mpi_test,
    .destroy = mpi_destroy,
    .split = mpi_split,
    .ireduce = mpi_ireduce,
    .ibcast = mpi_ibcast,
    .alltoallv = mpi_alltoallv,
};

/* A comm around `c`, which it owns from here on (errors return). */
static igrad_status_t mpi_wrap(MPI_Comm c, igrad_comm_t **out)
{
    mpi_impl_t *impl = calloc(1, sizeof *impl);
    IGRAD_FAIL_IF(!impl, IGRAD_E_NOMEM, "igrad_comm split: out of memory");
    impl->comm = c;
    impl->max_count = INT_MAX;
    int rank = 0, size = 0;
    int rc = MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
        free(impl);
        return mpi_fail(rc, "igrad_comm split: MPI_Comm_set_errhandler", __FILE__, __LINE__);
    }
    MPI_Comm_rank(c, &rank);
    MPI_Comm_size(c, &size);
    igrad_status_t st = igrad__comm_new(&mpi_vtable, "mpi", rank, size, impl, out);
    if (st != IGRAD_OK) free(impl);
    return st;
}

igrad_status_t igrad_comm_create_mpi(const void *mpi_comm, igrad_comm_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_comm_create_mpi: out is NULL");
    *out = NULL;
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    IGRAD_FAIL_IF(!initialized, IGRAD_E_STATE,
                  "igrad_comm_create_mpi: MPI is not initialized (call MPI_Init first)");
    IGRAD_FAIL_IF(finalized, IGRAD_E_STATE,
                  "igrad_comm_create_mpi: MPI has already been finalized");
    MPI_Comm parent = mpi_comm ? *(const MPI_Comm *)mpi_comm : MPI_COMM_WORLD;
    IGRAD_FAIL_IF(parent == MPI_COMM_NULL, IGRAD_E_INVALID,
                  "igrad_comm_create_mpi: the communicator is MPI_COMM_NULL");
    int inter = 0;
    MPI_CHECK(MPI_Comm_test_inter(parent, &inter), "igrad_comm_create_mpi: MPI_Comm_test_inter");
    IGRAD_FAIL_IF(inter, IGRAD_E_INVALID,
                  "igrad_comm_create_mpi: intercommunicators are not supported");

    igrad_status_t st = IGRAD_OK;
    mpi_impl_t *impl = calloc(1, sizeof *impl);
    IGRAD_FAIL_IF(!impl, IGRAD_E_NOMEM, "igrad_comm_create_mpi: out of memory");
    impl->comm = MPI_COMM_NULL;
    impl->max_count = INT_MAX;
    int rank = 0, size = 0, rc;
    /* A failing dup reports through the caller's error handler: the
     * duplicate's own handler can only be set once it exists. */
    rc = MPI_Comm_dup(parent, &impl->comm);
    if (rc != MPI_SUCCESS) {
        impl->comm = MPI_COMM_NULL; /* undefined after a failed dup */
        st = mpi_fail(rc, "igrad_comm_create_mpi: MPI_Comm_dup", __FILE__, __LINE__);
        goto cleanup;
    }
    rc = MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
        st = mpi_fail(rc, "igrad_comm_create_mpi: MPI_Comm_set_errhandler", __FILE__,
                      __LINE__);
        goto cleanup;
    }
    MPI_Comm_set_name(impl->comm, "igrad");
    MPI_Comm_rank(impl->comm, &rank);
    MPI_Comm_size(impl->comm, &size);
    IGRAD_CHECK_GOTO(igrad__comm_new(&mpi_vtable, "mpi", rank, size, impl, out));
    return IGRAD_OK;

cleanup:
    if (impl->comm != MPI_COMM_NULL) MPI_Comm_free(&impl->comm);
    free(impl);
    return st;
}

/* ---- test hooks (comm_internal.h) -------------------------------------- */

igrad_status_t igrad__comm_mpi_set_max_count(igrad_comm_t *comm, size_t max_count)
{
    IGRAD_FAIL_IF(!comm || comm->vt != &mpi_vtable, IGRAD_E_INVALID,
                  "igrad__comm_mpi_set_max_count: not an MPI communicator");
    IGRAD_FAIL_IF(max_count == 0 || max_count > INT_MAX, IGRAD_E_INVALID,
                  "igrad__comm_mpi_set_max_count: %zu outside [1, INT_MAX]", max_count);
    mpi_impl_t *impl = comm->impl;
    impl->max_count = max_count;
    return IGRAD_OK;
}

igrad_status_t igrad__comm_mpi_set_recv_hook(igrad_comm_t *comm, igrad__comm_recv_hook_t fn,
                                             void *user)
{
    IGRAD_FAIL_IF(!comm || comm->vt != &mpi_vtable, IGRAD_E_INVALID,
                  "igrad__comm_mpi_set_recv_hook: not an MPI communicator");
    mpi_impl_t *impl = comm->impl;
    impl->recv_hook = fn;
    impl->recv_hook_user = user;
    return IGRAD_OK;
}

igrad_status_t igrad__comm_mpi_handle(const igrad_comm_t *comm, void *mpi_comm_out)
{
    IGRAD_FAIL_IF(!comm || comm->vt != &mpi_vtable || !mpi_comm_out, IGRAD_E_INVALID,
                  "igrad__comm_mpi_handle: not an MPI communicator");
    const mpi_impl_t *impl = comm->impl;
    memcpy(mpi_comm_out, &impl->comm, sizeof impl->comm);
    return IGRAD_OK;
}
