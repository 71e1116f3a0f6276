/*
 * comm_self.c — the one-rank backend: every collective is a copy (or
 * nothing, in place), so single-process runs and tests need no MPI. It has
 * no non-blocking functions of its own: comm.c's fallback runs the copy at
 * issue time, which is exactly when a one-rank collective can complete.
 * Host memory only, no streams, no group hooks (comm.c's no-ops).
 * Argument checks live in comm.c.
 */
#include "comm/comm_internal.h"

#include <string.h>

static igrad_status_t self_allgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                     void *recv)
{
    (void)comm;
    /* One rank: its block is the whole of recv. memmove, since in place
     * send == recv and comm.c refuses any other overlap anyway. */
    if (send != recv) memmove(recv, send, nbytes);
    return IGRAD_OK;
}

static igrad_status_t self_allreduce(igrad_comm_t *comm, const void *send, void *recv,
                                     size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    (void)comm;
    (void)op; /* sum, max and min of one value are the value */
    if (send != recv) memmove(recv, send, count * igrad_dtype_nbytes(dtype));
    return IGRAD_OK;
}

static igrad_status_t self_bcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root)
{
    (void)comm, (void)buf, (void)nbytes, (void)root; /* root is 0: data in place */
    return IGRAD_OK;
}

static igrad_status_t self_barrier(igrad_comm_t *comm)
{
    (void)comm;
    return IGRAD_OK;
}

static igrad_status_t self_split(igrad_comm_t *comm, int color, int key, igrad_comm_t **out)
{
    (void)comm, (void)color, (void)key; /* one rank: its own group */
    return igrad_comm_create_self(out);
}

static igrad_status_t self_ireduce(igrad_comm_t *comm, const void *send, void *recv,
                                   size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                   int root, void *stream, igrad_comm_request_t *req)
{
    (void)root, (void)stream;
    req->done = 1;
    return self_allreduce(comm, send, recv, count, dtype, op);
}

static igrad_status_t self_ibcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root,
                                  void *stream, igrad_comm_request_t *req)
{
    (void)stream;
    req->done = 1;
    return self_bcast(comm, buf, nbytes, root);
}

/* One rank: its one block goes to itself (comm.c refuses overlap). Host
 * bytes, so there is no stream. */
static igrad_status_t self_alltoallv(igrad_comm_t *comm, const void *send,
                                     const size_t *send_nbytes, const size_t *send_displs,
                                     void *recv, const size_t *recv_nbytes,
                                     const size_t *recv_displs, void *stream)
{
    (void)comm, (void)stream;
    IGRAD_FAIL_IF(send_nbytes[0] != recv_nbytes[0], IGRAD_E_INVALID,
                  "igrad__comm_alltoallv: self comm sends %zu bytes to itself but expects %zu",
                  send_nbytes[0], recv_nbytes[0]);
    if (send_nbytes[0] > 0)
        memcpy((unsigned char *)recv + recv_displs[0],
               (const unsigned char *)send + send_displs[0], send_nbytes[0]);
    return IGRAD_OK;
}

static const igrad__comm_vtable_t self_vtable = {
    .spaces = IGRAD__MEM_BIT(IGRAD__MEM_HOST),
    .allgather = self_allgather,
    .allreduce = self_allreduce,
    .bcast = self_bcast,
    .barrier = self_barrier,
    .split = self_split,
    .ireduce = self_ireduce,
    .ibcast = self_ibcast,
    .alltoallv = self_alltoallv,
};

igrad_status_t igrad_comm_create_self(igrad_comm_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_comm_create_self: out is NULL");
    *out = NULL;
    return igrad__comm_new(&self_vtable, "self", 0, 1, NULL, out);
}
