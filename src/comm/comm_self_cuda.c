/*
 * comm_self_cuda.c — the one-rank backend for device buffers: like
 * comm_self.c every collective is a copy (or nothing, in place), but the
 * copies go through CUDA (cudaMemcpyDefault: host or device pointers
 * alike), the non-blocking ones on the stream they are given, so that an
 * engine on one GPU needs no NCCL. A copy queued on the engine's stream
 * is complete for everything queued after it there: requests are done at
 * issue. It splits (into itself), reduces and broadcasts, so the two-level
 * sync runs on one GPU, and its alltoallv (blocking) is one copy waited
 * for on its stream. Part of the plugin libigrad_cuda.so (built only with
 * CUDA): igrad_comm_create_self_cuda reaches it through the plugin's table
 * (core/plugin.h). Argument checks live in comm.c.
 */
#include "comm/comm_internal.h"
#include "igrad_cuda.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

typedef struct self_cuda {
    cudaStream_t stream; /* the default queue of the non-blocking copies */
} self_cuda_t;

static igrad_status_t cuda_result(cudaError_t err, const char *what)
{
    if (err == cudaSuccess) return IGRAD_OK;
    return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__, "self_cuda comm: %s: CUDA error %d (%s)",
                       what, (int)err, cudaGetErrorString(err));
}

static igrad_status_t copy_now(const void *send, void *recv, size_t nbytes, const char *what)
{
    if (send == recv || nbytes == 0) return IGRAD_OK;
    return cuda_result(cudaMemcpy(recv, send, nbytes, cudaMemcpyDefault), what);
}

static igrad_status_t self_cuda_allgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                          void *recv)
{
    (void)comm;
    return copy_now(send, recv, nbytes, "allgather");
}

static igrad_status_t self_cuda_allreduce(igrad_comm_t *comm, const void *send, void *recv,
                                          size_t count, igrad_dtype_t dtype,
                                          igrad_reduce_op_t op)
{
    (void)comm;
    (void)op; /* sum, max and min of one value are the value */
    return copy_now(send, recv, count * igrad_dtype_nbytes(dtype), "allreduce");
}

static igrad_status_t self_cuda_bcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root)
{
    (void)comm, (void)buf, (void)nbytes, (void)root; /* root is 0: data in place */
    return IGRAD_OK;
}

static igrad_status_t self_cuda_barrier(igrad_comm_t *comm)
{
    (void)comm;
    return IGRAD_OK;
}

static igrad_status_t copy_queued(igrad_comm_t *comm, const void *send, void *recv,
                                  size_t nbytes, void *stream, igrad_comm_request_t *req,
                                  const char *what)
{
    const self_cuda_t *impl = comm->impl;
    req->done = 1;
    if (send == recv || nbytes == 0) return IGRAD_OK;
    cudaStream_t s = stream ? (cudaStream_t)stream : impl->stream;
    return cuda_result(cudaMemcpyAsync(recv, send, nbytes, cudaMemcpyDefault, s), what);
}

static igrad_status_t self_cuda_iallgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                           void *recv, void *stream, igrad_comm_request_t *req)
{
    return copy_queued(comm, send, recv, nbytes, stream, req, "iallgather");
}

static igrad_status_t self_cuda_iallreduce(igrad_comm_t *comm, const void *send, void *recv,
                                           size_t count, igrad_dtype_t dtype,
                                           igrad_reduce_op_t op, void *stream,
                                           igrad_comm_request_t *req)
{
    (void)op;
    return copy_queued(comm, send, recv, count * igrad_dtype_nbytes(dtype), stream, req,
                       "iallreduce");
}

/* The two-level sync on one GPU: a node of one rank. */
static igrad_status_t self_cuda_split(igrad_comm_t *comm, int color, int key, igrad_comm_t **out)
{
    const self_cuda_t *impl = comm->impl;
    (void)color, (void)key; /* one rank: its own group */
    return igrad__comm_self_cuda_create(impl->stream, out);
}

static igrad_status_t self_cuda_ireduce(igrad_comm_t *comm, const void *send, void *recv,
                                        size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                        int root, void *stream, igrad_comm_request_t *req)
{
    (void)op, (void)root; /* one rank: the sum is its own values, root 0 */
    return copy_queued(comm, send, recv, count * igrad_dtype_nbytes(dtype), stream, req,
                       "ireduce");
}

static igrad_status_t self_cuda_ibcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root,
                                       void *stream, igrad_comm_request_t *req)
{
    (void)comm, (void)buf, (void)nbytes, (void)root, (void)stream; /* in place */
    req->done = 1;
    return IGRAD_OK;
}

/* One rank: its one block goes to itself (comm.c refuses overlap). The
 * call is blocking, so the copy is waited for on its stream: the host may
 * read recv on return. */
static igrad_status_t self_cuda_alltoallv(igrad_comm_t *comm, const void *send,
                                          const size_t *send_nbytes, const size_t *send_displs,
                                          void *recv, const size_t *recv_nbytes,
                                          const size_t *recv_displs, void *stream)
{
    const self_cuda_t *impl = comm->impl;
    IGRAD_FAIL_IF(send_nbytes[0] != recv_nbytes[0], IGRAD_E_INVALID,
                  "igrad__comm_alltoallv: self_cuda comm sends %zu bytes to itself but "
                  "expects %zu",
                  send_nbytes[0], recv_nbytes[0]);
    cudaStream_t s = stream ? (cudaStream_t)stream : impl->stream;
    if (send_nbytes[0] > 0)
        IGRAD_CHECK(cuda_result(cudaMemcpyAsync((unsigned char *)recv + recv_displs[0],
                                                (const unsigned char *)send + send_displs[0],
                                                send_nbytes[0], cudaMemcpyDefault, s),
                                "alltoallv"));
    /* also with nothing to copy: on return the stream's earlier work is
     * done, as after the NCCL comm's */
    return cuda_result(cudaStreamSynchronize(s), "alltoallv");
}

static igrad_status_t self_cuda_wait(igrad_comm_t *comm, igrad_comm_request_t *req)
{
    (void)comm, (void)req; /* done at issue */
    return IGRAD_OK;
}

static void self_cuda_destroy(igrad_comm_t *comm) { free(comm->impl); }

static const igrad__comm_vtable_t self_cuda_vtable = {
    .spaces = IGRAD__MEM_BIT(IGRAD__MEM_HOST) | IGRAD__MEM_BIT(IGRAD__MEM_DEVICE),
    .allgather = self_cuda_allgather,
    .allreduce = self_cuda_allreduce,
    .bcast = self_cuda_bcast,
    .barrier = self_cuda_barrier,
    .iallgather = self_cuda_iallgather,
    .iallreduce = self_cuda_iallreduce,
    .wait = self_cuda_wait,
    .destroy = self_cuda_destroy,
    .split = self_cuda_split,
    .ireduce = self_cuda_ireduce,
    .ibcast = self_cuda_ibcast,
    .alltoallv = self_cuda_alltoallv,
};

igrad_status_t igrad__comm_self_cuda_create(struct CUstream_st *stream, igrad_comm_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_comm_create_self_cuda: out is NULL");
    *out = NULL;
    self_cuda_t *impl = calloc(1, sizeof *impl);
    IGRAD_FAIL_IF(!impl, IGRAD_E_NOMEM, "igrad_comm_create_self_cuda: out of memory");
    impl->stream = stream;
    igrad_status_t st = igrad__comm_new(&self_cuda_vtable, "self_cuda", 0, 1, impl, out);
    if (st != IGRAD_OK) free(impl);
    return st;
}
