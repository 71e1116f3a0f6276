/*
 * comm.c — the generic communicator layer: argument checks shared by every
 * backend, the public igrad_comm_* wrappers, request bookkeeping, the
 * blocking fallback for backends without non-blocking functions, and the
 * custom backend (an adapter from the caller's igrad_comm_ops_t callbacks).
 *
 * Timeouts: the comm stores the limit (igrad_comm_set_timeout) and the
 * "broken" mark a backend sets when it had to leave a timed-out operation
 * pending; every wrapper refuses a broken comm before reaching the backend,
 * so no later collective can match the abandoned one. Only the MPI backend
 * measures time itself (comm_mpi.c); a custom backend's callbacks own their
 * timeouts.
 *
 * Groups (igrad__comm_group_start/end) reach a backend only when it has
 * the hooks; for one that has them, the requests issued inside an open
 * group are not launched yet, so nothing here blocks on them until the
 * group ends. The memory-space check (igrad__comm_check_space) is the only
 * place a comm's `spaces` is read. The internal alltoallv
 * (igrad__comm_alltoallv) is checked here like the public collectives; a
 * backend may leave it NULL.
 *
 * The self backend lives in comm_self.c. The MPI backend (comm_mpi.c) is
 * the plugin libigrad_mpi.so: igrad_comm_create_mpi() here loads it on
 * first use and reports IGRAD_E_UNSUPPORTED, naming the file and the
 * dynamic linker's reason, where it cannot be loaded, so the API is the
 * same everywhere.
 */
#include "comm/comm_internal.h"
#include "core/plugin.h"

#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Backends are never handed NULL buffers: a zero-sized operation points
 * at this byte instead, so no backend needs its own NULL special case. */
static unsigned char comm_dummy[8];

igrad_status_t igrad__comm_new(const igrad__comm_vtable_t *vt, const char *backend,
                               int rank, int size, void *impl, igrad_comm_t **out)
{
    igrad_comm_t *comm = calloc(1, sizeof *comm);
    IGRAD_FAIL_IF(!comm, IGRAD_E_NOMEM, "out of memory creating a %s communicator", backend);
    comm->vt = vt;
    comm->backend = backend;
    comm->rank = rank;
    comm->size = size;
    comm->impl = impl;
    comm->spaces = vt->spaces;
    *out = comm;
    return IGRAD_OK;
}

igrad_status_t igrad__comm_break(igrad_comm_t *comm, igrad_status_t status)
{
    if (!comm->broken) {
        comm->broken = 1;
        snprintf(comm->broken_msg, sizeof comm->broken_msg, "%s", igrad_last_error());
    }
    return status;
}

/* A broken comm refuses every operation: one of its collectives is still
 * pending, so anything issued now would be matched against it. */
static igrad_status_t check_usable(const igrad_comm_t *comm, const char *what)
{
    IGRAD_FAIL_IF(comm->broken, IGRAD_E_STATE,
                  "%s: the %s communicator is unusable since an earlier operation timed "
                  "out and was left pending (%s); abort the job",
                  what, comm->backend, comm->broken_msg);
    return IGRAD_OK;
}

/* A group of a backend with group hooks is open: its requests have not
 * been launched, so waiting on one (or a blocking collective) would hang. */
static int group_open(const igrad_comm_t *comm)
{
    return comm->group_depth > 0 && comm->vt->group_start;
}

static igrad_status_t check_no_group(const igrad_comm_t *comm, const char *what)
{
    IGRAD_FAIL_IF(group_open(comm), IGRAD_E_STATE,
                  "%s: a group of the %s communicator is open (its collectives start at "
                  "group end)",
                  what, comm->backend);
    return IGRAD_OK;
}

igrad_status_t igrad__comm_check_space(const igrad_comm_t *comm, igrad__mem_space_t space,
                                       const char *what)
{
    unsigned host = IGRAD__MEM_BIT(IGRAD__MEM_HOST), dev = IGRAD__MEM_BIT(IGRAD__MEM_DEVICE);
    const char *takes = (comm->spaces & host) && (comm->spaces & dev) ? "host and device"
                        : comm->spaces & host ? "host"
                        : comm->spaces & dev  ? "device"
                                              : "no";
    IGRAD_FAIL_IF(!(comm->spaces & IGRAD__MEM_BIT(space)), IGRAD_E_UNSUPPORTED,
                  "%s: communicator '%s' cannot take %s buffers (it takes %s buffers)", what,
                  comm->backend, igrad__mem_space_name(space), takes);
    return IGRAD_OK;
}

igrad_status_t igrad__comm_group_start(igrad_comm_t *comm)
{
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "igrad__comm_group_start: comm is NULL");
    IGRAD_CHECK(check_usable(comm, "group start"));
    if (comm->group_depth == 0 && comm->vt->group_start)
        IGRAD_CHECK(comm->vt->group_start(comm));
    comm->group_depth++;
    return IGRAD_OK;
}

igrad_status_t igrad__comm_group_end(igrad_comm_t *comm)
{
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "igrad__comm_group_end: comm is NULL");
    IGRAD_FAIL_IF(comm->group_depth <= 0, IGRAD_E_STATE,
                  "group end: no group of the %s communicator is open", comm->backend);
    if (--comm->group_depth > 0 || !comm->vt->group_end) return IGRAD_OK;
    IGRAD_CHECK(check_usable(comm, "group end"));
    return comm->vt->group_end(comm);
}

igrad_status_t igrad_comm_set_timeout(igrad_comm_t *comm, double seconds)
{
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "igrad_comm_set_timeout: comm is NULL");
    IGRAD_FAIL_IF(!(seconds >= 0.0 && seconds <= DBL_MAX), IGRAD_E_INVALID,
                  "igrad_comm_set_timeout: %g s (must be a finite number >= 0; 0 = none)",
                  seconds);
    comm->timeout_s = seconds;
    return IGRAD_OK;
}

double igrad_comm_timeout(const igrad_comm_t *comm) { return comm ? comm->timeout_s : 0.0; }

void igrad_comm_free(igrad_comm_t *comm)
{
    if (!comm) return;
    if (comm->vt->destroy) comm->vt->destroy(comm);
    free(comm);
}

int igrad_comm_rank(const igrad_comm_t *comm) { return comm ? comm->rank : -1; }
int igrad_comm_size(const igrad_comm_t *comm) { return comm ? comm->size : 0; }
const char *igrad_comm_backend(const igrad_comm_t *comm) { return comm ? comm->backend : ""; }

/* ---- argument checks ---------------------------------------------------- */

/* Do [a, a+na) and [b, b+nb) share a byte? Compared as integers because
 * relational operators on pointers into different objects are undefined. */
static int ranges_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    if (na == 0 || nb == 0) return 0;
    return pa < pb + nb && pb < pa + na;
}

static igrad_status_t check_allgather(const igrad_comm_t *comm, const char *what,
                                      const void **send, size_t nbytes, void **recv)
{
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "%s: comm is NULL", what);
    if (nbytes == 0) {
        *send = comm_dummy;
        *recv = comm_dummy;
        return IGRAD_OK;
    }
    IGRAD_FAIL_IF(!*send || !*recv, IGRAD_E_INVALID, "%s: %s buffer is NULL (nbytes %zu)",
                  what, !*send ? "send" : "recv", nbytes);
    IGRAD_FAIL_IF(nbytes > SIZE_MAX / (size_t)comm->size, IGRAD_E_INVALID,
                  "%s: %zu bytes from each of %d ranks overflow size_t", what, nbytes,
                  comm->size);
    size_t total = nbytes * (size_t)comm->size;
    const unsigned char *own = (const unsigned char *)*recv + (size_t)comm->rank * nbytes;
    IGRAD_FAIL_IF(*send != (const void *)own && ranges_overlap(*send, nbytes, *recv, total),
                  IGRAD_E_INVALID,
                  "%s: send overlaps recv; in place, send must be recv + rank * nbytes",
                  what);
    return IGRAD_OK;
}

static igrad_status_t check_allreduce(const igrad_comm_t *comm, const char *what,
                                      const void **send, void **recv, size_t count,
                                      igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "%s: comm is NULL", what);
    IGRAD_FAIL_IF(dtype != IGRAD_DTYPE_F32 && dtype != IGRAD_DTYPE_F64 &&
                      dtype != IGRAD_DTYPE_I64,
                  IGRAD_E_INVALID, "%s: dtype %d (%s) is not supported; use F32, F64 or I64",
                  what, (int)dtype,
                  igrad_dtype_nbytes(dtype) ? igrad_dtype_name(dtype) : "invalid");
    IGRAD_FAIL_IF(op != IGRAD_REDUCE_SUM && op != IGRAD_REDUCE_MAX && op != IGRAD_REDUCE_MIN,
                  IGRAD_E_INVALID, "%s: unknown reduce op %d", what, (int)op);
    if (count == 0) {
        *send = comm_dummy;
        *recv = comm_dummy;
        return IGRAD_OK;
    }
    size_t elem = igrad_dtype_nbytes(dtype);
    IGRAD_FAIL_IF(!*send || !*recv, IGRAD_E_INVALID, "%s: %s buffer is NULL (count %zu)", what,
                  !*send ? "send" : "recv", count);
    IGRAD_FAIL_IF(count > SIZE_MAX / elem, IGRAD_E_INVALID,
                  "%s: %zu elements overflow size_t bytes", what, count);
    IGRAD_FAIL_IF(*send != (const void *)*recv &&
                      ranges_overlap(*send, count * elem, *recv, count * elem),
                  IGRAD_E_INVALID, "%s: send and recv overlap without being equal", what);
    return IGRAD_OK;
}

static igrad_status_t check_request_out(igrad_comm_request_t **req, const char *what)
{
    IGRAD_FAIL_IF(!req, IGRAD_E_INVALID, "%s: req is NULL", what);
    *req = NULL;
    return IGRAD_OK;
}

/* ---- blocking wrappers ------------------------------------------------- */

igrad_status_t igrad_comm_allgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                    void *recv)
{
    IGRAD_CHECK(check_allgather(comm, "igrad_comm_allgather", &send, nbytes, &recv));
    IGRAD_CHECK(check_usable(comm, "igrad_comm_allgather"));
    IGRAD_CHECK(check_no_group(comm, "igrad_comm_allgather"));
    return comm->vt->allgather(comm, send, nbytes, recv);
}

igrad_status_t igrad_comm_allreduce(igrad_comm_t *comm, const void *send, void *recv,
                                    size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    IGRAD_CHECK(check_allreduce(comm, "igrad_comm_allreduce", &send, &recv, count, dtype, op));
    IGRAD_CHECK(check_usable(comm, "igrad_comm_allreduce"));
    IGRAD_CHECK(check_no_group(comm, "igrad_comm_allreduce"));
    return comm->vt->allreduce(comm, send, recv, count, dtype, op);
}

igrad_status_t igrad_comm_bcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root)
{
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "igrad_comm_bcast: comm is NULL");
    IGRAD_FAIL_IF(root < 0 || root >= comm->size, IGRAD_E_INVALID,
                  "igrad_comm_bcast: root %d outside [0, %d)", root, comm->size);
    if (nbytes == 0) buf = comm_dummy;
    IGRAD_FAIL_IF(!buf, IGRAD_E_INVALID, "igrad_comm_bcast: buf is NULL (nbytes %zu)", nbytes);
    IGRAD_CHECK(check_usable(comm, "igrad_comm_bcast"));
    IGRAD_CHECK(check_no_group(comm, "igrad_comm_bcast"));
    return comm->vt->bcast(comm, buf, nbytes, root);
}

igrad_status_t igrad_comm_barrier(igrad_comm_t *comm)
{
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "igrad_comm_barrier: comm is NULL");
    IGRAD_CHECK(check_usable(comm, "igrad_comm_barrier"));
    IGRAD_CHECK(check_no_group(comm, "igrad_comm_barrier"));
    return comm->vt->barrier(comm);
}

/* The end of the furthest block of a side, after checking that no block's
 * end overflows; `side` ("send", "recv") names it in messages. */
static igrad_status_t alltoallv_extent(const igrad_comm_t *comm, const char *side,
                                       const size_t *nbytes, const size_t *displs,
                                       size_t *extent)
{
    const char *what = "igrad__comm_alltoallv";
    IGRAD_FAIL_IF(!nbytes || !displs, IGRAD_E_INVALID, "%s: %s_%s is NULL", what, side,
                  !nbytes ? "nbytes" : "displs");
    *extent = 0;
    for (int j = 0; j < comm->size; j++) {
        IGRAD_FAIL_IF(displs[j] > SIZE_MAX - nbytes[j], IGRAD_E_INVALID,
                      "%s: %s block for rank %d (%zu bytes at %zu) overflows size_t", what,
                      side, j, nbytes[j], displs[j]);
        if (nbytes[j] > 0 && displs[j] + nbytes[j] > *extent) *extent = displs[j] + nbytes[j];
    }
    return IGRAD_OK;
}

igrad_status_t igrad__comm_alltoallv(igrad_comm_t *comm, const void *send,
                                     const size_t *send_nbytes, const size_t *send_displs,
                                     void *recv, const size_t *recv_nbytes,
                                     const size_t *recv_displs, igrad__mem_space_t space,
                                     void *stream)
{
    const char *what = "igrad__comm_alltoallv";
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "%s: comm is NULL", what);
    IGRAD_FAIL_IF(!comm->vt->alltoallv, IGRAD_E_UNSUPPORTED,
                  "%s: communicator '%s' has no variable all-to-all (the sparse all-reduce "
                  "needs one; the self, MPI, self_cuda and NCCL communicators have it, a "
                  "custom one with ops->alltoallv)",
                  what, comm->backend);
    size_t send_extent = 0, recv_extent = 0;
    IGRAD_CHECK(alltoallv_extent(comm, "send", send_nbytes, send_displs, &send_extent));
    IGRAD_CHECK(alltoallv_extent(comm, "recv", recv_nbytes, recv_displs, &recv_extent));
    if (send_extent == 0) send = comm_dummy;
    if (recv_extent == 0) recv = comm_dummy;
    IGRAD_FAIL_IF(!send || !recv, IGRAD_E_INVALID, "%s: %s buffer is NULL (%zu bytes)", what,
                  !send ? "send" : "recv", !send ? send_extent : recv_extent);
    IGRAD_FAIL_IF(ranges_overlap(send, send_extent, recv, recv_extent), IGRAD_E_INVALID,
                  "%s: send and recv overlap", what);
    IGRAD_CHECK(igrad__comm_check_space(comm, space, what));
    IGRAD_CHECK(check_usable(comm, what));
    IGRAD_CHECK(check_no_group(comm, what));
    return comm->vt->alltoallv(comm, send, send_nbytes, send_displs, recv, recv_nbytes,
                               recv_displs, stream);
}

/* ---- non-blocking wrappers ---------------------------------------------- */

static igrad_status_t request_new(igrad_comm_t *comm, const char *op,
                                  igrad_comm_request_t **out)
{
    igrad_comm_request_t *req = calloc(1, sizeof *req);
    IGRAD_FAIL_IF(!req, IGRAD_E_NOMEM, "%s: out of memory for a request", op);
    req->comm = comm;
    req->op = op;
    *out = req;
    return IGRAD_OK;
}

/* Hands a started (or failed) request to the caller; a failed start leaves
 * nothing behind, since the backend has nothing in flight to wait for. */
static igrad_status_t request_issued(igrad_comm_request_t *req, igrad_status_t st,
                                     igrad_comm_request_t **out)
{
    if (st != IGRAD_OK) {
        free(req);
        return st;
    }
    req->comm->pending++;
    *out = req;
    return IGRAD_OK;
}

igrad_status_t igrad__comm_request_done(igrad_comm_t *comm, const char *op,
                                       igrad_comm_request_t **out)
{
    IGRAD_CHECK(check_request_out(out, op));
    igrad_comm_request_t *req = NULL;
    IGRAD_CHECK(request_new(comm, op, &req));
    req->done = 1;
    return request_issued(req, IGRAD_OK, out);
}

igrad_status_t igrad__comm_iallgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                      void *recv, igrad__mem_space_t space, void *stream,
                                      igrad_comm_request_t **out)
{
    IGRAD_CHECK(check_request_out(out, "igrad_comm_iallgather"));
    IGRAD_CHECK(check_allgather(comm, "igrad_comm_iallgather", &send, nbytes, &recv));
    IGRAD_CHECK(igrad__comm_check_space(comm, space, "igrad_comm_iallgather"));
    IGRAD_CHECK(check_usable(comm, "igrad_comm_iallgather"));
    igrad_comm_request_t *req = NULL;
    IGRAD_CHECK(request_new(comm, "iallgather", &req));
    igrad_status_t st;
    if (comm->vt->iallgather) {
        st = comm->vt->iallgather(comm, send, nbytes, recv, stream, req);
    } else {
        st = comm->vt->allgather(comm, send, nbytes, recv);
        req->done = 1;
    }
    return request_issued(req, st, out);
}

igrad_status_t igrad__comm_iallreduce(igrad_comm_t *comm, const void *send, void *recv,
                                      size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                      igrad__mem_space_t space, void *stream,
                                      igrad_comm_request_t **out)
{
    IGRAD_CHECK(check_request_out(out, "igrad_comm_iallreduce"));
    IGRAD_CHECK(check_allreduce(comm, "igrad_comm_iallreduce", &send, &recv, count, dtype, op));
    IGRAD_CHECK(igrad__comm_check_space(comm, space, "igrad_comm_iallreduce"));
    IGRAD_CHECK(check_usable(comm, "igrad_comm_iallreduce"));
    igrad_comm_request_t *req = NULL;
    IGRAD_CHECK(request_new(comm, "iallreduce", &req));
    igrad_status_t st;
    if (comm->vt->iallreduce) {
        st = comm->vt->iallreduce(comm, send, recv, count, dtype, op, stream, req);
    } else {
        st = comm->vt->allreduce(comm, send, recv, count, dtype, op);
        req->done = 1;
    }
    return request_issued(req, st, out);
}

/* ---- split, reduce to a root, broadcast (the two-level sync) ------------ */

int igrad__comm_can_split(const igrad_comm_t *comm)
{
    return comm && comm->vt->split && comm->vt->ireduce && comm->vt->ibcast;
}

static igrad_status_t check_splittable(const igrad_comm_t *comm, const char *what)
{
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "%s: comm is NULL", what);
    IGRAD_FAIL_IF(!igrad__comm_can_split(comm), IGRAD_E_UNSUPPORTED,
                  "%s: communicator '%s' cannot be split into nodes (use an MPI "
                  "communicator)",
                  what, comm->backend);
    return check_usable(comm, what);
}

igrad_status_t igrad__comm_split(igrad_comm_t *comm, int color, int key, igrad_comm_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_comm split: out is NULL");
    *out = NULL;
    IGRAD_CHECK(check_splittable(comm, "igrad_comm split"));
    IGRAD_FAIL_IF(color < 0 && color != IGRAD__SPLIT_NODE, IGRAD_E_INVALID,
                  "igrad_comm split: color %d", color);
    IGRAD_CHECK(check_no_group(comm, "igrad_comm split"));
    IGRAD_CHECK(comm->vt->split(comm, color, key, out));
    (*out)->timeout_s = comm->timeout_s;
    return IGRAD_OK;
}

igrad_status_t igrad__comm_ireduce(igrad_comm_t *comm, const void *send, void *recv,
                                   size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                   int root, igrad__mem_space_t space, void *stream,
                                   igrad_comm_request_t **out)
{
    IGRAD_CHECK(check_request_out(out, "igrad_comm ireduce"));
    IGRAD_CHECK(check_splittable(comm, "igrad_comm ireduce"));
    IGRAD_CHECK(igrad__comm_check_space(comm, space, "igrad_comm ireduce"));
    IGRAD_FAIL_IF(root < 0 || root >= comm->size, IGRAD_E_INVALID,
                  "igrad_comm ireduce: root %d outside [0, %d)", root, comm->size);
    void *r = comm->rank == root ? recv : (void *)(uintptr_t)send; /* recv: root only */
    IGRAD_CHECK(check_allreduce(comm, "igrad_comm ireduce", &send, &r, count, dtype, op));
    IGRAD_FAIL_IF(comm->rank == root && count > 0 && send == (const void *)r, IGRAD_E_INVALID,
                  "igrad_comm ireduce: send and recv are the same buffer at the root");
    igrad_comm_request_t *req = NULL;
    IGRAD_CHECK(request_new(comm, "ireduce", &req));
    igrad_status_t st = comm->vt->ireduce(comm, send, comm->rank == root ? r : NULL, count,
                                          dtype, op, root, stream, req);
    return request_issued(req, st, out);
}

igrad_status_t igrad__comm_ibcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root,
                                  igrad__mem_space_t space, void *stream,
                                  igrad_comm_request_t **out)
{
    IGRAD_CHECK(check_request_out(out, "igrad_comm ibcast"));
    IGRAD_CHECK(check_splittable(comm, "igrad_comm ibcast"));
    IGRAD_CHECK(igrad__comm_check_space(comm, space, "igrad_comm ibcast"));
    IGRAD_FAIL_IF(root < 0 || root >= comm->size, IGRAD_E_INVALID,
                  "igrad_comm ibcast: root %d outside [0, %d)", root, comm->size);
    if (nbytes == 0) buf = comm_dummy;
    IGRAD_FAIL_IF(!buf, IGRAD_E_INVALID, "igrad_comm ibcast: buf is NULL (nbytes %zu)", nbytes);
    igrad_comm_request_t *req = NULL;
    IGRAD_CHECK(request_new(comm, "ibcast", &req));
    igrad_status_t st = comm->vt->ibcast(comm, buf, nbytes, root, stream, req);
    return request_issued(req, st, out);
}

/* The caller's buffers are host memory; a host collective has no stream. */
igrad_status_t igrad_comm_iallgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                     void *recv, igrad_comm_request_t **out)
{
    return igrad__comm_iallgather(comm, send, nbytes, recv, IGRAD__MEM_HOST, NULL, out);
}

igrad_status_t igrad_comm_iallreduce(igrad_comm_t *comm, const void *send, void *recv,
                                     size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                     igrad_comm_request_t **out)
{
    return igrad__comm_iallreduce(comm, send, recv, count, dtype, op, IGRAD__MEM_HOST, NULL,
                                  out);
}

igrad_status_t igrad_comm_wait(igrad_comm_t *comm, igrad_comm_request_t *req)
{
    if (!req) return IGRAD_OK;
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "igrad_comm_wait: comm is NULL");
    IGRAD_FAIL_IF(req->comm != comm, IGRAD_E_INVALID,
                  "igrad_comm_wait: the %s request belongs to another communicator", req->op);
    /* Kept for a wait after the group ends: its operation has not started. */
    IGRAD_FAIL_IF(req->handle && !comm->broken && group_open(comm), IGRAD_E_STATE,
                  "igrad_comm_wait: the %s request's group of the %s communicator is still "
                  "open (wait after group end)",
                  req->op, comm->backend);
    igrad_status_t st = IGRAD_OK;
    /* A request the backend completed at issue time, or whose handle it
     * released in test, has nothing left in flight. On a broken comm the
     * handle is left to leak: the backend may still own what it points to. */
    if (req->handle && comm->broken) st = check_usable(comm, "igrad_comm_wait");
    else if (req->handle) st = comm->vt->wait(comm, req);
    comm->pending--;
    free(req);
    return st;
}

igrad_status_t igrad_comm_test(igrad_comm_t *comm, igrad_comm_request_t *req, int *done)
{
    IGRAD_FAIL_IF(!done, IGRAD_E_INVALID, "igrad_comm_test: done is NULL");
    *done = 0;
    IGRAD_FAIL_IF(!comm || !req, IGRAD_E_INVALID, "igrad_comm_test: %s is NULL",
                  !comm ? "comm" : "req");
    IGRAD_FAIL_IF(req->comm != comm, IGRAD_E_INVALID,
                  "igrad_comm_test: the %s request belongs to another communicator", req->op);
    if (!req->done && !req->handle) req->done = 1;
    if (!req->done) IGRAD_CHECK(check_usable(comm, "igrad_comm_test"));
    if (!req->done && group_open(comm)) return IGRAD_OK; /* not launched yet */
    if (!req->done) {
        igrad_status_t st;
        if (comm->vt->test) {
            st = comm->vt->test(comm, req, &req->done);
        } else {
            /* No way to ask without blocking: finish it, so polling loops
             * terminate; the handle is gone, wait only releases. */
            st = comm->vt->wait(comm, req);
            req->handle = NULL;
            req->done = 1;
        }
        IGRAD_CHECK(st);
    }
    *done = req->done;
    return IGRAD_OK;
}

/* ---- custom backend --------------------------------------------------- */

typedef struct custom_impl {
    igrad_comm_ops_t ops;
    void *user;
} custom_impl_t;

/* The callbacks return whatever the caller's language produced; anything
 * that is not a failure status we know becomes IGRAD_E_COMM. */
static igrad_status_t custom_result(const custom_impl_t *impl, int rc, const char *op)
{
    if (rc == IGRAD_OK) return IGRAD_OK;
    igrad_status_t st = rc > IGRAD_OK && rc <= IGRAD_E_TIMEOUT ? (igrad_status_t)rc
                                                              : IGRAD_E_COMM;
    const char *msg = impl->ops.error_message ? impl->ops.error_message(impl->user) : NULL;
    return igrad__fail(st, __FILE__, __LINE__, "custom comm: %s callback returned %d (%s)%s%s",
                       op, rc, igrad_status_str(st), msg && *msg ? ": " : "",
                       msg ? msg : "");
}

static igrad_status_t custom_allgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                       void *recv)
{
    custom_impl_t *impl = comm->impl;
    return custom_result(impl, (int)impl->ops.allgather(impl->user, send, nbytes, recv),
                         "allgather");
}

static igrad_status_t custom_allreduce(igrad_comm_t *comm, const void *send, void *recv,
                                       size_t count, igrad_dtype_t dtype,
                                       igrad_reduce_op_t op)
{
    custom_impl_t *impl = comm->impl;
    return custom_result(
        impl, (int)impl->ops.allreduce(impl->user, send, recv, count, dtype, op), "allreduce");
}

static igrad_status_t custom_bcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root)
{
    custom_impl_t *impl = comm->impl;
    return custom_result(impl, (int)impl->ops.bcast(impl->user, buf, nbytes, root), "bcast");
}

static igrad_status_t custom_barrier(igrad_comm_t *comm)
{
    custom_impl_t *impl = comm->impl;
    return custom_result(impl, (int)impl->ops.barrier(impl->user), "barrier");
}

/* A device comm's set_stream, before each of its non-blocking collectives
 * and its alltoallv (host comms get no stream: a host collective has
 * none). */
static igrad_status_t custom_stream(const custom_impl_t *impl, void *stream)
{
    if (!impl->ops.set_stream) return IGRAD_OK;
    return custom_result(impl, (int)impl->ops.set_stream(impl->user, stream), "set_stream");
}

/* A callback that succeeds without a handle has nothing in flight. */
static igrad_status_t custom_iallgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                        void *recv, void *stream, igrad_comm_request_t *req)
{
    custom_impl_t *impl = comm->impl;
    IGRAD_CHECK(custom_stream(impl, stream));
    void *handle = NULL;
    IGRAD_CHECK(custom_result(
        impl, (int)impl->ops.iallgather(impl->user, send, nbytes, recv, &handle),
        "iallgather"));
    req->handle = handle;
    req->done = handle == NULL;
    return IGRAD_OK;
}

static igrad_status_t custom_iallreduce(igrad_comm_t *comm, const void *send, void *recv,
                                        size_t count, igrad_dtype_t dtype,
                                        igrad_reduce_op_t op, void *stream,
                                        igrad_comm_request_t *req)
{
    custom_impl_t *impl = comm->impl;
    IGRAD_CHECK(custom_stream(impl, stream));
    void *handle = NULL;
    IGRAD_CHECK(custom_result(
        impl,
        (int)impl->ops.iallreduce(impl->user, send, recv, count, dtype, op, &handle),
        "iallreduce"));
    req->handle = handle;
    req->done = handle == NULL;
    return IGRAD_OK;
}

static igrad_status_t custom_wait(igrad_comm_t *comm, igrad_comm_request_t *req)
{
    custom_impl_t *impl = comm->impl;
    igrad_status_t st =
        custom_result(impl, (int)impl->ops.wait(impl->user, req->handle), "wait");
    req->handle = NULL;
    return st;
}

static igrad_status_t custom_test(igrad_comm_t *comm, igrad_comm_request_t *req, int *done)
{
    custom_impl_t *impl = comm->impl;
    int flag = 0;
    IGRAD_CHECK(
        custom_result(impl, (int)impl->ops.test(impl->user, req->handle, &flag), "test"));
    *done = flag != 0;
    return IGRAD_OK;
}

static igrad_status_t custom_group_start(igrad_comm_t *comm)
{
    custom_impl_t *impl = comm->impl;
    return custom_result(impl, (int)impl->ops.group_start(impl->user), "group_start");
}

static igrad_status_t custom_group_end(igrad_comm_t *comm)
{
    custom_impl_t *impl = comm->impl;
    return custom_result(impl, (int)impl->ops.group_end(impl->user), "group_end");
}

static igrad_status_t custom_split(igrad_comm_t *comm, int color, int key, igrad_comm_t **out)
{
    custom_impl_t *impl = comm->impl;
    const igrad_comm_ops_t *ops = NULL;
    void *user = NULL;
    int rank = -1, size = 0;
    IGRAD_CHECK(custom_result(impl,
                              (int)impl->ops.split(impl->user, color < 0 ? -1 : color, key, &ops,
                                                   &user, &rank, &size),
                              "split"));
    IGRAD_FAIL_IF(!ops, IGRAD_E_COMM, "custom comm: split returned no table");
    return igrad_comm_create_custom(ops, user, rank, size, out);
}

static igrad_status_t custom_ireduce(igrad_comm_t *comm, const void *send, void *recv,
                                     size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                     int root, void *stream, igrad_comm_request_t *req)
{
    custom_impl_t *impl = comm->impl;
    void *handle = NULL;
    IGRAD_CHECK(custom_stream(impl, stream));
    IGRAD_CHECK(custom_result(
        impl, (int)impl->ops.ireduce(impl->user, send, recv, count, dtype, op, root, &handle),
        "ireduce"));
    req->handle = handle;
    req->done = handle == NULL;
    return IGRAD_OK;
}

static igrad_status_t custom_ibcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root,
                                    void *stream, igrad_comm_request_t *req)
{
    custom_impl_t *impl = comm->impl;
    void *handle = NULL;
    IGRAD_CHECK(custom_stream(impl, stream));
    IGRAD_CHECK(custom_result(impl,
                              (int)impl->ops.ibcast(impl->user, buf, nbytes, root, &handle),
                              "ibcast"));
    req->handle = handle;
    req->done = handle == NULL;
    return IGRAD_OK;
}

/* Blocking, but on a CUDA comm its buffers are device memory and its
 * stream is set first, as for the non-blocking callbacks. */
static igrad_status_t custom_alltoallv(igrad_comm_t *comm, const void *send,
                                       const size_t *send_nbytes, const size_t *send_displs,
                                       void *recv, const size_t *recv_nbytes,
                                       const size_t *recv_displs, void *stream)
{
    custom_impl_t *impl = comm->impl;
    IGRAD_CHECK(custom_stream(impl, stream));
    return custom_result(impl,
                         (int)impl->ops.alltoallv(impl->user, send, send_nbytes, send_displs,
                                                  recv, recv_nbytes, recv_displs),
                         "alltoallv");
}

static void custom_destroy(igrad_comm_t *comm)
{
    custom_impl_t *impl = comm->impl;
    if (impl->ops.destroy) impl->ops.destroy(impl->user);
    free(impl);
}

igrad_status_t igrad_comm_create_custom(const igrad_comm_ops_t *ops, void *user, int rank,
                                        int size, igrad_comm_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_comm_create_custom: out is NULL");
    *out = NULL;
    IGRAD_FAIL_IF(!ops, IGRAD_E_INVALID, "igrad_comm_create_custom: ops is NULL");
    /* The first version of the table ended at destroy: tables of that size
     * keep working, without the fields added since. */
    const size_t first_nbytes = offsetof(igrad_comm_ops_t, group_start);
    IGRAD_FAIL_IF(ops->size < first_nbytes, IGRAD_E_INVALID,
                  "igrad_comm_create_custom: ops->size is %zu, this library needs at least "
                  "%zu (set it to sizeof(igrad_comm_ops_t))",
                  ops->size, first_nbytes);
    /* Only the caller's `size` bytes are read; a field that ends past them
     * is absent. */
    igrad_comm_ops_t known = {0};
    memcpy(&known, ops, ops->size < sizeof known ? ops->size : sizeof known);
    if (ops->size < offsetof(igrad_comm_ops_t, group_start) + sizeof known.group_start)
        known.group_start = NULL;
    if (ops->size < offsetof(igrad_comm_ops_t, group_end) + sizeof known.group_end)
        known.group_end = NULL;
    if (ops->size < offsetof(igrad_comm_ops_t, memory) + sizeof known.memory)
        known.memory = IGRAD_MEMORY_HOST;
    if (ops->size < offsetof(igrad_comm_ops_t, set_stream) + sizeof known.set_stream)
        known.set_stream = NULL;
    if (ops->size < offsetof(igrad_comm_ops_t, ibcast) + sizeof known.ibcast)
        known.split = NULL, known.ireduce = NULL, known.ibcast = NULL;
    if (ops->size < offsetof(igrad_comm_ops_t, alltoallv) + sizeof known.alltoallv)
        known.alltoallv = NULL;
    ops = &known;
    IGRAD_FAIL_IF(ops->memory != IGRAD_MEMORY_HOST && ops->memory != IGRAD_MEMORY_CUDA,
                  IGRAD_E_INVALID,
                  "igrad_comm_create_custom: ops->memory is %d (IGRAD_MEMORY_HOST 0 or "
                  "IGRAD_MEMORY_CUDA 1)",
                  (int)ops->memory);
    const int on_device = ops->memory == IGRAD_MEMORY_CUDA;
    IGRAD_FAIL_IF(size < 1 || rank < 0 || rank >= size, IGRAD_E_INVALID,
                  "igrad_comm_create_custom: rank %d, size %d (need 0 <= rank < size)", rank,
                  size);
    const char *missing = !ops->allgather ? "allgather"
                          : !ops->allreduce ? "allreduce"
                          : !ops->bcast ? "bcast"
                          : !ops->barrier ? "barrier"
                          : (ops->iallgather || ops->iallreduce) && !ops->wait ? "wait"
                          : ops->group_start && !ops->group_end ? "group_end"
                          : ops->group_end && !ops->group_start ? "group_start"
                          : on_device && !ops->iallgather ? "iallgather"
                          : on_device && !ops->iallreduce ? "iallreduce"
                          : (ops->split || ops->ireduce || ops->ibcast) && !ops->split ? "split"
                          : (ops->split || ops->ireduce || ops->ibcast) && !ops->ireduce ? "ireduce"
                          : (ops->split || ops->ireduce || ops->ibcast) && !ops->ibcast ? "ibcast"
                          : ops->ireduce && !ops->wait ? "wait"
                          : NULL;
    /* device buffers reach the non-blocking callbacks (and alltoallv),
     * never the blocking fallback: it would hand them to callbacks that
     * take host memory */
    IGRAD_FAIL_IF(missing, IGRAD_E_INVALID,
                  "igrad_comm_create_custom: ops->%s is NULL but required%s", missing,
                  missing[0] == 'i' ? " with memory IGRAD_MEMORY_CUDA" : "");
    IGRAD_FAIL_IF(ops->set_stream && !on_device, IGRAD_E_INVALID,
                  "igrad_comm_create_custom: ops->set_stream is set but ops->memory is "
                  "IGRAD_MEMORY_HOST (host collectives have no stream)");

    /* The vtable is per comm because which non-blocking callbacks exist is
     * the caller's choice; NULL entries select comm.c's fallbacks. */
    typedef struct custom_comm_block {
        custom_impl_t impl;
        igrad__comm_vtable_t vt;
    } custom_comm_block_t;
    custom_comm_block_t *block = calloc(1, sizeof *block);
    IGRAD_FAIL_IF(!block, IGRAD_E_NOMEM, "igrad_comm_create_custom: out of memory");
    block->impl.ops = *ops; /* of a larger (newer) table, its known prefix */
    block->impl.ops.size = sizeof(igrad_comm_ops_t);
    block->impl.user = user;
    block->vt = (igrad__comm_vtable_t){
        .spaces = IGRAD__MEM_BIT(on_device ? IGRAD__MEM_DEVICE : IGRAD__MEM_HOST),
        .allgather = custom_allgather,
        .allreduce = custom_allreduce,
        .bcast = custom_bcast,
        .barrier = custom_barrier,
        .iallgather = ops->iallgather ? custom_iallgather : NULL,
        .iallreduce = ops->iallreduce ? custom_iallreduce : NULL,
        .wait = ops->wait ? custom_wait : NULL,
        .test = ops->test ? custom_test : NULL,
        .group_start = ops->group_start ? custom_group_start : NULL,
        .group_end = ops->group_end ? custom_group_end : NULL,
        .destroy = custom_destroy,
        .split = ops->split ? custom_split : NULL,
        .ireduce = ops->ireduce ? custom_ireduce : NULL,
        .ibcast = ops->ibcast ? custom_ibcast : NULL,
        .alltoallv = ops->alltoallv ? custom_alltoallv : NULL,
    };
    /* impl is the first member, so custom_destroy's free(impl) frees the
     * whole block, vtable included. */
    igrad_status_t st = igrad__comm_new(&block->vt, "custom", rank, size, &block->impl, out);
    if (st != IGRAD_OK) free(block);
    return st;
}

/* The MPI communicator is in libigrad_mpi.so (comm_mpi.c), loaded on first
 * use (core/plugin.h); a program linked with libigrad.a has it linked in. */
extern const igrad__plugin_mpi_t igrad__plugin_mpi __attribute__((weak));

igrad_status_t igrad_comm_create_mpi(const void *mpi_comm, igrad_comm_t **out)
{
    if (out) *out = NULL;
    const igrad__plugin_head_t *t = NULL;
    IGRAD_CHECK(igrad__plugin_load("mpi", "MPI", "igrad_comm_create_mpi",
                                   &igrad__plugin_mpi ? &igrad__plugin_mpi.head : NULL, &t));
    return ((const igrad__plugin_mpi_t *)t)->comm_create(mpi_comm, out);
}
