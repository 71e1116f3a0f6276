/*
 * comm_nccl.c — the NCCL backend: an igrad communicator over a caller's
 * ncclComm_t (borrowed) and CUDA stream.
 *  - The engine's bucket collectives (iallgather / iallreduce) take device
 *    buffers only (the comm's memory space; comm.c refuses host ones) and
 *    are queued on the stream the engine gives (NULL: the comm's). A CUDA
 *    event recorded after each tells test and wait when it is done; inside
 *    a group (ncclGroupStart / ncclGroupEnd, the group hooks) the
 *    collectives are launched at group end, so their events are recorded
 *    there.
 *  - The blocking collectives (the engine's agreement, igrad_comm_*) take
 *    host buffers, as on every backend: staged through a device buffer of
 *    the comm's, waited for on its stream.
 *  - The two-level sync's split (ncclCommSplit; the node color from the
 *    ranks' host names), reduce (ncclReduce) and broadcast (ncclBroadcast,
 *    in place) take device buffers and streams like the bucket
 *    collectives. A split comm owns its NCCL communicator and shares the
 *    parent's stream.
 *  - The sparse all-reduce's alltoallv takes device buffers too: one group
 *    of ncclSend / ncclRecv on the given stream, then waited for there
 *    (blocking, under the timeout).
 *  - Errors: every NCCL result that is not ncclSuccess becomes IGRAD_E_COMM
 *    with ncclGetErrorString's text and ncclGetLastError's detail; while
 *    waiting, ncclCommGetAsyncError is polled, so a failed peer ends the
 *    wait with its error instead of a hang; a timeout (the comm's
 *    timeout_s) is IGRAD_E_TIMEOUT and leaves the comm broken (comm.c).
 *    ncclInProgress (a non-blocking communicator) is waited out the same
 *    way. Nothing here aborts the process or the NCCL communicator: that
 *    is the caller's call (ncclCommAbort) after an error.
 * Part of the plugin libigrad_cuda.so when CUDA and NCCL are both found:
 * igrad_comm_create_nccl reaches it through the plugin's table
 * (core/plugin.h). Argument checks live in comm.c.
 */
#define _POSIX_C_SOURCE 200112L /* gethostname */
#include "comm/comm_internal.h"
#include "igrad_cuda.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct nccl_req {
    cudaEvent_t done;       /* recorded after the collective */
    cudaStream_t stream;
    int recorded;           /* 0: queued in a group not yet ended */
    struct nccl_req *next;  /* the open group's requests */
} nccl_req_t;

typedef struct nccl_impl {
    ncclComm_t comm;
    int owned;              /* made by split: destroyed with the igrad comm */
    cudaStream_t stream;
    unsigned char *bounce;  /* device staging of the blocking collectives */
    size_t bounce_nbytes;
    nccl_req_t *group;      /* requests of the open group */
    int group_failed;
} nccl_impl_t;

static igrad_status_t nccl_fail(const nccl_impl_t *impl, ncclResult_t r, const char *what)
{
    const char *detail = ncclGetLastError(impl->comm);
    return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__, "nccl comm: %s: %s (%d)%s%s", what,
                       ncclGetErrorString(r), (int)r, detail && *detail ? ": " : "",
                       detail ? detail : "");
}

static igrad_status_t cuda_fail(cudaError_t err, const char *what)
{
    return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__, "nccl comm: %s: CUDA error %d (%s)",
                       what, (int)err, cudaGetErrorString(err));
}

/* Waits until `ready` says done (or fails), polling the comm's async error
 * and the timeout. ready: 1 done, 0 not yet, -1 failed (recorded). */
static igrad_status_t poll_until(igrad_comm_t *comm, int (*ready)(void *), void *arg,
                                 const char *what)
{
    nccl_impl_t *impl = comm->impl;
    double t0 = igrad__now_ms();
    for (;;) {
        int r = ready(arg);
        if (r > 0) return IGRAD_OK;
        if (r < 0) return IGRAD_E_COMM;
        ncclResult_t ar = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(impl->comm, &ar);
        if (q != ncclSuccess) return nccl_fail(impl, q, what);
        if (ar != ncclSuccess && ar != ncclInProgress) return nccl_fail(impl, ar, what);
        if (comm->timeout_s > 0 && igrad__now_ms() - t0 > 1000.0 * comm->timeout_s) {
            igrad__fail(IGRAD_E_TIMEOUT, __FILE__, __LINE__,
                        "nccl comm: %s did not complete within %g s", what, comm->timeout_s);
            return igrad__comm_break(comm, IGRAD_E_TIMEOUT);
        }
    }
}

static int comm_settled(void *arg)
{
    nccl_impl_t *impl = arg;
    ncclResult_t ar = ncclSuccess;
    if (ncclCommGetAsyncError(impl->comm, &ar) != ncclSuccess) return 1; /* said by the poll */
    return ar != ncclInProgress;
}

/* A call's result: ncclInProgress waited out (non-blocking comms). */
static igrad_status_t nccl_result(igrad_comm_t *comm, ncclResult_t r, const char *what)
{
    nccl_impl_t *impl = comm->impl;
    if (r == ncclSuccess) return IGRAD_OK;
    if (r != ncclInProgress) return nccl_fail(impl, r, what);
    return poll_until(comm, comm_settled, impl, what);
}

static int stream_idle(void *arg)
{
    cudaError_t q = cudaStreamQuery((cudaStream_t)arg);
    if (q == cudaSuccess) return 1;
    if (q == cudaErrorNotReady) return 0;
    cuda_fail(q, "stream");
    return -1;
}

static igrad_status_t ensure_bounce(nccl_impl_t *impl, size_t nbytes)
{
    if (nbytes <= impl->bounce_nbytes) return IGRAD_OK;
    cudaFree(impl->bounce);
    impl->bounce = NULL;
    impl->bounce_nbytes = 0;
    cudaError_t err = cudaMalloc((void **)&impl->bounce, nbytes);
    if (err != cudaSuccess) return cuda_fail(err, "staging buffer");
    impl->bounce_nbytes = nbytes;
    return IGRAD_OK;
}

/* Host send (nbytes) -> device, the collective `run`, device -> host recv
 * (rbytes), waited for on the comm's stream. */
static igrad_status_t staged(igrad_comm_t *comm, const void *send, size_t nbytes, void *recv,
                             size_t rbytes, ncclResult_t (*run)(igrad_comm_t *, void *, size_t,
                                                                  void *, const void *),
                             const void *arg, const char *what)
{
    nccl_impl_t *impl = comm->impl;
    size_t off = (nbytes + 255) & ~(size_t)255;
    IGRAD_CHECK(ensure_bounce(impl, off + rbytes + 1));
    cudaError_t err = cudaMemcpyAsync(impl->bounce, send, nbytes, cudaMemcpyHostToDevice,
                                      impl->stream);
    if (err != cudaSuccess) return cuda_fail(err, what);
    IGRAD_CHECK(nccl_result(comm, run(comm, impl->bounce, nbytes, impl->bounce + off, arg), what));
    err = cudaMemcpyAsync(recv, impl->bounce + off, rbytes, cudaMemcpyDeviceToHost, impl->stream);
    if (err != cudaSuccess) return cuda_fail(err, what);
    return poll_until(comm, stream_idle, impl->stream, what);
}

static ncclResult_t run_allgather(igrad_comm_t *comm, void *dsend, size_t nbytes, void *drecv,
                                  const void *arg)
{
    nccl_impl_t *impl = comm->impl;
    (void)arg;
    return ncclAllGather(dsend, drecv, nbytes, ncclUint8, impl->comm, impl->stream);
}

static int nccl_type(igrad_dtype_t dtype, ncclDataType_t *out)
{
    switch (dtype) {
    case IGRAD_DTYPE_F32: *out = ncclFloat32; return 1;
    case IGRAD_DTYPE_F64: *out = ncclFloat64; return 1;
    case IGRAD_DTYPE_I64: *out = ncclInt64; return 1;
    default: return 0;
    }
}

static ncclRedOp_t nccl_op(igrad_reduce_op_t op)
{
    return op == IGRAD_REDUCE_MAX ? ncclMax : op == IGRAD_REDUCE_MIN ? ncclMin : ncclSum;
}

typedef struct reduce_arg {
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
} reduce_arg_t;

static ncclResult_t run_allreduce(igrad_comm_t *comm, void *dsend, size_t nbytes, void *drecv,
                                  const void *arg)
{
    nccl_impl_t *impl = comm->impl;
    const reduce_arg_t *ra = arg;
    (void)nbytes;
    return ncclAllReduce(dsend, drecv, ra->count, ra->type, ra->op, impl->comm, impl->stream);
}

static ncclResult_t run_bcast(igrad_comm_t *comm, void *dsend, size_t nbytes, void *drecv,
                              const void *arg)
{
    nccl_impl_t *impl = comm->impl;
    return ncclBroadcast(dsend, drecv, nbytes, ncclUint8, *(const int *)arg, impl->comm,
                         impl->stream);
}

static igrad_status_t nccl_allgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                     void *recv)
{
    return staged(comm, send, nbytes, recv, nbytes * (size_t)comm->size, run_allgather, NULL,
                  "allgather");
}

static igrad_status_t nccl_allreduce(igrad_comm_t *comm, const void *send, void *recv,
                                     size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    reduce_arg_t ra = {count, ncclFloat32, nccl_op(op)};
    nccl_type(dtype, &ra.type); /* comm.c admits F32, F64 and I64 only */
    size_t nbytes = count * igrad_dtype_nbytes(dtype);
    return staged(comm, send, nbytes, recv, nbytes, run_allreduce, &ra, "allreduce");
}

static igrad_status_t nccl_bcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root)
{
    return staged(comm, buf, nbytes, buf, nbytes, run_bcast, &root, "bcast");
}

static igrad_status_t nccl_barrier(igrad_comm_t *comm)
{
    int64_t one = 1, sum = 0;
    return nccl_allreduce(comm, &one, &sum, 1, IGRAD_DTYPE_I64, IGRAD_REDUCE_SUM);
}

/* ---- non-blocking: device buffers, events ---- */

static igrad_status_t record(nccl_req_t *h)
{
    cudaError_t err = cudaEventRecord(h->done, h->stream);
    if (err != cudaSuccess) return cuda_fail(err, "recording a collective's event");
    h->recorded = 1;
    return IGRAD_OK;
}

/* After the collective was queued (or failed to be): its request. */
static igrad_status_t issued(igrad_comm_t *comm, ncclResult_t r, cudaStream_t s,
                             igrad_comm_request_t *req, const char *what)
{
    nccl_impl_t *impl = comm->impl;
    IGRAD_CHECK(nccl_result(comm, r, what));
    nccl_req_t *h = calloc(1, sizeof *h);
    IGRAD_FAIL_IF(!h, IGRAD_E_NOMEM, "nccl comm: %s: out of memory", what);
    cudaError_t err = cudaEventCreateWithFlags(&h->done, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        free(h);
        return cuda_fail(err, what);
    }
    h->stream = s;
    req->handle = h;
    if (comm->group_depth > 0) { /* launched at group end */
        h->next = impl->group;
        impl->group = h;
        return IGRAD_OK;
    }
    return record(h);
}

static igrad_status_t nccl_iallgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                      void *recv, void *stream, igrad_comm_request_t *req)
{
    nccl_impl_t *impl = comm->impl;
    cudaStream_t s = stream ? (cudaStream_t)stream : impl->stream;
    return issued(comm, ncclAllGather(send, recv, nbytes, ncclUint8, impl->comm, s), s, req,
                  "iallgather");
}

static igrad_status_t nccl_iallreduce(igrad_comm_t *comm, const void *send, void *recv,
                                      size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                      void *stream, igrad_comm_request_t *req)
{
    nccl_impl_t *impl = comm->impl;
    cudaStream_t s = stream ? (cudaStream_t)stream : impl->stream;
    ncclDataType_t type = ncclFloat32;
    nccl_type(dtype, &type);
    return issued(comm, ncclAllReduce(send, recv, count, type, nccl_op(op), impl->comm, s), s,
                  req, "iallreduce");
}

static int event_done(void *arg)
{
    cudaError_t q = cudaEventQuery(((nccl_req_t *)arg)->done);
    if (q == cudaSuccess) return 1;
    if (q == cudaErrorNotReady) return 0;
    cuda_fail(q, "collective");
    return -1;
}

static void release(nccl_req_t *h)
{
    cudaEventDestroy(h->done);
    free(h);
}

static igrad_status_t nccl_wait(igrad_comm_t *comm, igrad_comm_request_t *req)
{
    nccl_req_t *h = req->handle;
    req->handle = NULL;
    if (!h->recorded) { /* its group failed to launch */
        release(h);
        return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                           "nccl comm: igrad_comm_wait: the %s request's group failed to launch",
                           req->op);
    }
    igrad_status_t st = poll_until(comm, event_done, h, req->op);
    if (st != IGRAD_E_TIMEOUT) release(h); /* else the stream may still use it */
    return st;
}

static igrad_status_t nccl_test(igrad_comm_t *comm, igrad_comm_request_t *req, int *done)
{
    nccl_impl_t *impl = comm->impl;
    nccl_req_t *h = req->handle;
    *done = 0;
    if (!h->recorded) return IGRAD_OK;
    int r = event_done(h);
    if (r < 0) return IGRAD_E_COMM;
    ncclResult_t ar = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(impl->comm, &ar);
    if (q != ncclSuccess) return nccl_fail(impl, q, "test");
    if (ar != ncclSuccess && ar != ncclInProgress) return nccl_fail(impl, ar, "test");
    *done = r;
    return IGRAD_OK;
}

static igrad_status_t nccl_group_start(igrad_comm_t *comm)
{
    nccl_impl_t *impl = comm->impl;
    impl->group = NULL;
    ncclResult_t r = ncclGroupStart();
    return r == ncclSuccess ? IGRAD_OK : nccl_fail(impl, r, "group start");
}

static igrad_status_t nccl_group_end(igrad_comm_t *comm)
{
    nccl_impl_t *impl = comm->impl;
    nccl_req_t *h = impl->group;
    impl->group = NULL;
    igrad_status_t st = nccl_result(comm, ncclGroupEnd(), "group end");
    for (; h; h = h->next) /* the launched collectives' events, in the streams' order */
        if (st == IGRAD_OK) st = record(h);
    return st;
}

/* ---- the two-level sync: split, reduce to a root, broadcast ---- */

/* The node of this rank as a color: the lowest rank whose host name is
 * this rank's (a blocking all-gather of the names). */
#define HOST_NAME_NBYTES 256
static igrad_status_t node_color(igrad_comm_t *comm, int *color)
{
    char mine[HOST_NAME_NBYTES];
    memset(mine, 0, sizeof mine);
    if (gethostname(mine, sizeof mine - 1) != 0) strcpy(mine, "?");
    char *all = malloc((size_t)comm->size * HOST_NAME_NBYTES);
    IGRAD_FAIL_IF(!all, IGRAD_E_NOMEM, "nccl comm: split: out of memory");
    igrad_status_t st = nccl_allgather(comm, mine, HOST_NAME_NBYTES, all);
    *color = comm->rank;
    for (int r = 0; r < comm->size && st == IGRAD_OK; r++)
        if (memcmp(all + (size_t)r * HOST_NAME_NBYTES, mine, HOST_NAME_NBYTES) == 0) {
            *color = r;
            break;
        }
    free(all);
    return st;
}

static igrad_status_t nccl_wrap(ncclComm_t c, int owned, cudaStream_t stream, igrad_comm_t **out);

static int split_settled(void *arg)
{
    ncclResult_t ar = ncclSuccess;
    if (ncclCommGetAsyncError((ncclComm_t)arg, &ar) != ncclSuccess) return -1;
    return ar == ncclInProgress ? 0 : ar == ncclSuccess ? 1 : -1;
}

static igrad_status_t nccl_split(igrad_comm_t *comm, int color, int key, igrad_comm_t **out)
{
    nccl_impl_t *impl = comm->impl;
    if (color == IGRAD__SPLIT_NODE) IGRAD_CHECK(node_color(comm, &color));
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommSplit(impl->comm, color, key, &c, NULL);
    if (r == ncclInProgress && c) { /* a non-blocking parent: the new comm finishes later */
        if (poll_until(comm, split_settled, c, "split") != IGRAD_OK) {
            ncclCommAbort(c);
            return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                               "nccl comm: split: the new communicator did not initialise");
        }
        r = ncclSuccess;
    }
    if (r != ncclSuccess) return nccl_fail(impl, r, "ncclCommSplit");
    igrad_status_t st = nccl_wrap(c, 1, impl->stream, out);
    if (st != IGRAD_OK) ncclCommDestroy(c);
    return st;
}

static igrad_status_t nccl_ireduce(igrad_comm_t *comm, const void *send, void *recv,
                                   size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                   int root, void *stream, igrad_comm_request_t *req)
{
    nccl_impl_t *impl = comm->impl;
    cudaStream_t s = stream ? (cudaStream_t)stream : impl->stream;
    ncclDataType_t type = ncclFloat32;
    nccl_type(dtype, &type);
    return issued(comm, ncclReduce(send, recv, count, type, nccl_op(op), root, impl->comm, s), s,
                  req, "ireduce");
}

static igrad_status_t nccl_ibcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root,
                                  void *stream, igrad_comm_request_t *req)
{
    nccl_impl_t *impl = comm->impl;
    cudaStream_t s = stream ? (cudaStream_t)stream : impl->stream;
    return issued(comm, ncclBroadcast(buf, buf, nbytes, ncclUint8, root, impl->comm, s), s, req,
                  "ibcast");
}

/* ---- alltoallv: device buffers, blocking ---- */

/* One group of ncclSend / ncclRecv, a pair per peer with bytes to move
 * (NCCL counts are size_t: no pieces), then a wait for the stream under
 * the comm's timeout, like the blocking collectives. Unlike MPI no empty
 * messages: the caller's counts agree pairwise (it exchanged them), and a
 * disagreement is a wait that the timeout or NCCL's async error ends. The
 * own block is a device copy on the same stream rather than a send to
 * self (which NCCL supports): one cudaMemcpyAsync, with no NCCL
 * point-to-point path of the rank to itself to set up or schedule, as
 * comm_mpi.c copies its own block. */
static igrad_status_t nccl_alltoallv(igrad_comm_t *comm, const void *send,
                                     const size_t *send_nbytes, const size_t *send_displs,
                                     void *recv, const size_t *recv_nbytes,
                                     const size_t *recv_displs, void *stream)
{
    nccl_impl_t *impl = comm->impl;
    const int P = comm->size, me = comm->rank;
    IGRAD_FAIL_IF(send_nbytes[me] != recv_nbytes[me], IGRAD_E_INVALID,
                  "igrad__comm_alltoallv: rank %d sends %zu bytes to itself but expects %zu",
                  me, send_nbytes[me], recv_nbytes[me]);
    cudaStream_t s = stream ? (cudaStream_t)stream : impl->stream;
    const unsigned char *sb = send;
    unsigned char *rb = recv;
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_fail(impl, r, "alltoallv: ncclGroupStart");
    /* the first failing call is reported; the group is closed either way */
    ncclResult_t op = ncclSuccess;
    for (int j = 0; j < P && (op == ncclSuccess || op == ncclInProgress); j++) {
        if (j == me) continue;
        if (send_nbytes[j] > 0)
            op = ncclSend(sb + send_displs[j], send_nbytes[j], ncclUint8, j, impl->comm, s);
        if (recv_nbytes[j] > 0 && (op == ncclSuccess || op == ncclInProgress))
            op = ncclRecv(rb + recv_displs[j], recv_nbytes[j], ncclUint8, j, impl->comm, s);
    }
    ncclResult_t end = ncclGroupEnd();
    IGRAD_CHECK(nccl_result(comm, op, "alltoallv: ncclSend/ncclRecv"));
    IGRAD_CHECK(nccl_result(comm, end, "alltoallv: ncclGroupEnd"));
    if (send_nbytes[me] > 0) {
        cudaError_t err = cudaMemcpyAsync(rb + recv_displs[me], sb + send_displs[me],
                                          send_nbytes[me], cudaMemcpyDefault, s);
        if (err != cudaSuccess) return cuda_fail(err, "alltoallv: own block");
    }
    return poll_until(comm, stream_idle, s, "alltoallv");
}

static void nccl_destroy(igrad_comm_t *comm)
{
    nccl_impl_t *impl = comm->impl;
    if (!impl) return;
    cudaFree(impl->bounce);
    /* a broken comm may have an operation pending on it: left to the process */
    if (impl->owned && !comm->broken) ncclCommDestroy(impl->comm);
    free(impl);
}

static const igrad__comm_vtable_t nccl_vtable = {
    .spaces = IGRAD__MEM_BIT(IGRAD__MEM_DEVICE),
    .allgather = nccl_allgather,
    .allreduce = nccl_allreduce,
    .bcast = nccl_bcast,
    .barrier = nccl_barrier,
    .iallgather = nccl_iallgather,
    .iallreduce = nccl_iallreduce,
    .wait = nccl_wait,
    .test = nccl_test,
    .group_start = nccl_group_start,
    .group_end = nccl_group_end,
    .destroy = nccl_destroy,
    .split = nccl_split,
    .ireduce = nccl_ireduce,
    .ibcast = nccl_ibcast,
    .alltoallv = nccl_alltoallv,
};

/* An igrad comm over c (owned: destroyed with it). */
static igrad_status_t nccl_wrap(ncclComm_t c, int owned, cudaStream_t stream, igrad_comm_t **out)
{
    int rank = 0, size = 0;
    ncclResult_t r = ncclCommUserRank(c, &rank);
    if (r == ncclSuccess) r = ncclCommCount(c, &size);
    if (r != ncclSuccess)
        return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                           "igrad_comm_create_nccl: ncclCommUserRank/ncclCommCount: %s (%d)",
                           ncclGetErrorString(r), (int)r);
    nccl_impl_t *impl = calloc(1, sizeof *impl);
    IGRAD_FAIL_IF(!impl, IGRAD_E_NOMEM, "igrad_comm_create_nccl: out of memory");
    impl->comm = c;
    impl->owned = owned;
    impl->stream = stream;
    igrad_status_t st = igrad__comm_new(&nccl_vtable, "nccl", rank, size, impl, out);
    if (st != IGRAD_OK) free(impl);
    return st;
}

igrad_status_t igrad__comm_nccl_create(struct ncclComm *nccl_comm, struct CUstream_st *stream,
                                      igrad_comm_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_comm_create_nccl: out is NULL");
    *out = NULL;
    IGRAD_FAIL_IF(!nccl_comm, IGRAD_E_INVALID, "igrad_comm_create_nccl: nccl_comm is NULL");
    return nccl_wrap(nccl_comm, 0, stream, out);
}
