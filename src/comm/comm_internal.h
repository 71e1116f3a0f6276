/*
 * comm_internal.h — what the communicator files (comm.c, comm_self.c,
 * comm_mpi.c, comm_nccl.c, comm_self_cuda.c) and the engine share: the layout of
 * igrad_comm_t and igrad_comm_request_t and the backend table behind them.
 *
 * The public igrad_comm_ops_t (igrad.h) is the table *callers* fill for the
 * custom backend; this internal table is what every backend, custom
 * included, presents to the generic layer in comm.c. They differ because a
 * built-in backend records its own error messages (with the MPI text) and
 * keeps its per-request state in igrad's request object, while a caller's
 * callbacks only return a status and an opaque handle.
 *
 * Argument checking lives in comm.c only: a backend function is called
 * with a valid comm, buffers that are non-NULL (or a dummy when the size is
 * 0), recv sized size*nbytes for allgather, an allreduce dtype of F32, F64
 * or I64 and a valid op, and a root in range. Callers of the backend table
 * other than comm.c (tests that need an error only MPI itself can raise)
 * take those checks on themselves.
 *
 * The one internal-only collective, alltoallv (the sparse all-reduce's
 * exchanges), is optional: backends without it refuse that route. It takes
 * a memory space and a stream like the engine's other collectives but is
 * blocking (its counts and displacements are host arrays).
 *
 * What a device backend (comm_nccl.c, comm_self_cuda.c) needs is in the table too, so
 * it is one more row: the memory spaces its buffers may live in (comm.c
 * refuses any other before the backend is called), a stream on the
 * non-blocking collectives (an opaque queue of the backend's; NULL is its
 * default, and the host backends ignore it) and optional group hooks that
 * bracket a step's collectives so they can be launched together.
 */
#ifndef IGRAD_COMM_INTERNAL_H
#define IGRAD_COMM_INTERNAL_H

#include "core/internal.h"

typedef struct igrad__comm_vtable {
    /* IGRAD__MEM_BIT of every memory space the collectives' buffers may
     * live in (self, MPI, custom: host). igrad__comm_new copies it into
     * the comm, where a backend may narrow or widen it per instance. */
    unsigned spaces;
    /* Blocking collectives. Return IGRAD_OK or a recorded error. */
    igrad_status_t (*allgather)(igrad_comm_t *comm, const void *send, size_t nbytes,
                                void *recv);
    igrad_status_t (*allreduce)(igrad_comm_t *comm, const void *send, void *recv,
                                size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op);
    igrad_status_t (*bcast)(igrad_comm_t *comm, void *buf, size_t nbytes, int root);
    igrad_status_t (*barrier)(igrad_comm_t *comm);
    /* Non-blocking: start the operation on `stream` (the backend's queue;
     * NULL = its default; host backends ignore it) and keep its state in
     * req->handle (or complete it now and set req->done). May be NULL:
     * comm.c then runs the blocking function and marks the request done,
     * so a backend that uses streams must have both. */
    igrad_status_t (*iallgather)(igrad_comm_t *comm, const void *send, size_t nbytes,
                                 void *recv, void *stream, igrad_comm_request_t *req);
    igrad_status_t (*iallreduce)(igrad_comm_t *comm, const void *send, void *recv,
                                 size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                 void *stream, igrad_comm_request_t *req);
    /* Completes a request that is not done and releases req->handle, also
     * when the operation failed. Required when either i* function exists. */
    igrad_status_t (*wait)(igrad_comm_t *comm, igrad_comm_request_t *req);
    /* Sets *done without blocking (the handle stays until wait). May be
     * NULL: comm.c then waits, which always makes progress. */
    igrad_status_t (*test)(igrad_comm_t *comm, igrad_comm_request_t *req, int *done);
    /* Optional (both or neither; NULL for self and MPI, where comm.c makes
     * them no-ops): the non-blocking collectives issued between start and
     * end form one group that the backend may launch at end (ncclGroupStart
     * / ncclGroupEnd). comm.c calls them for the outermost pair only, and
     * while such a group is open it neither tests nor waits a request with
     * a live handle (test reports not done; wait is refused) and refuses
     * blocking collectives. After a failed group_end, wait must still
     * release the group's requests without blocking. */
    igrad_status_t (*group_start)(igrad_comm_t *comm);
    igrad_status_t (*group_end)(igrad_comm_t *comm);
    /* Releases comm->impl (not the comm itself). May be NULL. */
    void (*destroy)(igrad_comm_t *comm);
    /* Optional, all three or none (the two-level sync, engine_hier.c, needs
     * them; NULL for a custom comm without them, which it then refuses).
     * split: collective; a new comm of the ranks with the same color,
     * ordered by key (IGRAD__SPLIT_NODE: the ranks sharing this rank's
     * node). ireduce: non-blocking SUM/MAX/MIN of count elements of every
     * rank's send into root's recv (recv is not touched elsewhere). ibcast:
     * non-blocking broadcast of nbytes from root's buf. Buffers in one of the
     * comm's spaces (comm.c checks the space the engine names), queued on
     * `stream` as iallgather is (NULL: the backend's default). */
    igrad_status_t (*split)(igrad_comm_t *comm, int color, int key, igrad_comm_t **out);
    igrad_status_t (*ireduce)(igrad_comm_t *comm, const void *send, void *recv, size_t count,
                              igrad_dtype_t dtype, igrad_reduce_op_t op, int root, void *stream,
                              igrad_comm_request_t *req);
    igrad_status_t (*ibcast)(igrad_comm_t *comm, void *buf, size_t nbytes, int root,
                             void *stream, igrad_comm_request_t *req);
    /* Blocking variable all-to-all of bytes (igrad__comm_alltoallv):
     * send + send_displs[j] (send_nbytes[j] bytes) goes to rank j, rank
     * j's block for this rank lands at recv + recv_displs[j]. Called with
     * host arrays of comm->size entries, buffers in one of the comm's
     * spaces, blocks inside their buffers and send not overlapping recv.
     * Device backends queue it on `stream` (NULL: their default) and
     * return once it has completed there; host backends ignore `stream`.
     * Self and MPI: host bytes; self_cuda: host or device (a copy); NCCL:
     * device (ncclSend / ncclRecv); custom: ops->alltoallv in the table's
     * memory. May be NULL (a custom comm without ops->alltoallv): the
     * sparse all-reduce is then unavailable on the comm. */
    igrad_status_t (*alltoallv)(igrad_comm_t *comm, const void *send, const size_t *send_nbytes,
                                const size_t *send_displs, void *recv,
                                const size_t *recv_nbytes, const size_t *recv_displs,
                                void *stream);
} igrad__comm_vtable_t;

/* split's color for "the ranks of my node" (MPI_COMM_TYPE_SHARED). */
#define IGRAD__SPLIT_NODE (-2)

struct igrad_comm {
    const igrad__comm_vtable_t *vt;
    const char *backend;  /* "self", "mpi", "custom" (static string) */
    int rank;
    int size;
    void *impl;           /* backend state, owned by the backend */
    unsigned spaces;      /* IGRAD__MEM_BIT of the memory spaces it takes */
    int group_depth;      /* open igrad__comm_group_start calls */
    int64_t pending;      /* requests issued and not yet waited */
    double timeout_s;     /* per operation; 0 = none (igrad_comm_set_timeout) */
    int broken;           /* an operation timed out and was left pending:
                             every later call fails fast */
    char broken_msg[512]; /* the message of that timeout */
};

struct igrad_comm_request {
    igrad_comm_t *comm;   /* the comm that issued it (checked by wait) */
    const char *op;       /* "iallgather" / "iallreduce", for messages */
    int done;             /* completed: wait only releases */
    void *handle;         /* backend state of an operation in flight */
};

/* Marks the comm unusable after an operation that had to be left pending
 * (a timeout): keeps the current igrad_last_error() as the reason that
 * every later call quotes. Returns `status`. */
igrad_status_t igrad__comm_break(igrad_comm_t *comm, igrad_status_t status);


/* Refuses, with IGRAD_E_UNSUPPORTED naming the communicator and the
 * space ("communicator 'mpi' cannot take device buffers"), buffers in a
 * memory space the comm does not take. `what` prefixes the message. */
igrad_status_t igrad__comm_check_space(const igrad_comm_t *comm, igrad__mem_space_t space,
                                       const char *what);

/* The non-blocking collectives as the engine issues them: igrad_comm_i*'s
 * checks, plus the buffers' memory space (checked against comm->spaces)
 * and the stream handed to the backend (NULL = its default). The public
 * igrad_comm_i* are these with host buffers and a NULL stream. */
igrad_status_t igrad__comm_iallgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                      void *recv, igrad__mem_space_t space, void *stream,
                                      igrad_comm_request_t **req);
igrad_status_t igrad__comm_iallreduce(igrad_comm_t *comm, const void *send, void *recv,
                                      size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                      igrad__mem_space_t space, void *stream,
                                      igrad_comm_request_t **req);

/* A request of `comm` that is already complete (`op` names it in
 * messages), for an operation that ran blocking, as the fallback above
 * makes for a backend without the non-blocking op: wait and test on it
 * return at once. IGRAD_E_NOMEM. */
igrad_status_t igrad__comm_request_done(igrad_comm_t *comm, const char *op,
                                       igrad_comm_request_t **req);

/* The vtable's split / ireduce / ibcast with argument checks (ranks,
 * buffers, dtype), the buffers' memory space (checked against comm->spaces,
 * as the engine's bucket collectives are) and the comm's state checks;
 * IGRAD_E_UNSUPPORTED naming the backend when it has none. `stream` goes to
 * the backend as for igrad__comm_iallgather. A split comm inherits the
 * timeout. */
int igrad__comm_can_split(const igrad_comm_t *comm);
igrad_status_t igrad__comm_split(igrad_comm_t *comm, int color, int key, igrad_comm_t **out);
igrad_status_t igrad__comm_ireduce(igrad_comm_t *comm, const void *send, void *recv,
                                   size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                   int root, igrad__mem_space_t space, void *stream,
                                   igrad_comm_request_t **req);
igrad_status_t igrad__comm_ibcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root,
                                  igrad__mem_space_t space, void *stream,
                                  igrad_comm_request_t **req);

/* Brackets a group of non-blocking collectives (vtable group_start /
 * group_end; no-ops for a backend without them). Pairs nest; only the
 * outermost reaches the backend. group_end without a start is
 * IGRAD_E_STATE. group_end always closes the pair, also when it fails. */
igrad_status_t igrad__comm_group_start(igrad_comm_t *comm);
igrad_status_t igrad__comm_group_end(igrad_comm_t *comm);

/* Variable all-to-all of bytes, blocking, under the comm's timeout (the
 * sparse all-reduce's exchanges, sparse_allreduce.c). Every array has
 * comm->size entries and is host memory: this rank sends send_nbytes[j]
 * bytes at send + send_displs[j] to rank j and receives recv_nbytes[j]
 * bytes from rank j at recv + recv_displs[j]; recv_nbytes[j] must equal
 * what rank j sends here (the caller exchanges the counts first: a
 * mismatch is an MPI error, a short block or a wait until the timeout,
 * not something this call can detect). send and recv may be NULL when all
 * their counts are 0 and must not overlap. The buffers live in `space`
 * (checked against comm->spaces as igrad__comm_iallgather's are: self
 * and MPI take host, NCCL device, self_cuda both, custom its table's
 * memory); `stream` is the backend's queue (NULL: its default; host
 * backends ignore it). On return the bytes have landed: a device backend
 * has waited for what it queued on the stream (and for the work queued
 * there before it), so the host may read them or queue more work there.
 * @return IGRAD_E_UNSUPPORTED for a comm without the op (custom without
 * ops->alltoallv) or buffers in a space it does not take,
 * IGRAD_E_INVALID for bad arguments, IGRAD_E_STATE on a broken comm or
 * inside an open group, IGRAD_E_COMM / IGRAD_E_TIMEOUT from the
 * backend. */
igrad_status_t igrad__comm_alltoallv(igrad_comm_t *comm, const void *send,
                                     const size_t *send_nbytes, const size_t *send_displs,
                                     void *recv, const size_t *recv_nbytes,
                                     const size_t *recv_displs, igrad__mem_space_t space,
                                     void *stream);

/* Allocates a comm around a backend's table and state. On failure `impl`
 * is left to the caller. */
igrad_status_t igrad__comm_new(const igrad__comm_vtable_t *vt, const char *backend,
                               int rank, int size, void *impl, igrad_comm_t **out);

/* The CUDA communicators of the plugin libigrad_cuda.so (core/plugin.h):
 * igrad_comm_create_self_cuda and igrad_comm_create_nccl (igrad_cuda.h)
 * once the plugin is loaded. */
struct CUstream_st;
struct ncclComm;
igrad_status_t igrad__comm_self_cuda_create(struct CUstream_st *stream, igrad_comm_t **out);
igrad_status_t igrad__comm_nccl_create(struct ncclComm *nccl_comm, struct CUstream_st *stream,
                                       igrad_comm_t **out);

/* Test hooks of the MPI backend, defined only when comm_mpi.c is built.
 * Declared unconditionally because IGRAD_HAVE_MPI reaches the library's
 * own objects, not the tests that link it (only MPI tests call these).
 *
 * MPI counts are int, so messages are cut into pieces of at most
 * `max_count` elements (bytes for allgather and bcast); the default is
 * INT_MAX. Tests lower it to drive the splitting code with small buffers. @return IGRAD_E_INVALID if `comm` is
 * not an MPI comm or max_count is 0 or above INT_MAX. */
igrad_status_t igrad__comm_mpi_set_max_count(igrad_comm_t *comm, size_t max_count);
/* After an iallgather of the MPI comm completes (in wait), calls
 * fn(user, recv, nbytes) — nbytes per rank — so that a test can change
 * what this rank alone received (a transport corrupting one rank's copy).
 * fn NULL removes the hook. */
typedef void (*igrad__comm_recv_hook_t)(void *user, void *recv, size_t nbytes);
igrad_status_t igrad__comm_mpi_set_recv_hook(igrad_comm_t *comm, igrad__comm_recv_hook_t fn,
                                             void *user);
/* Copies the library's duplicated MPI_Comm into *(MPI_Comm *)mpi_comm_out
 * (void * keeps mpi.h out of this header). */
igrad_status_t igrad__comm_mpi_handle(const igrad_comm_t *comm, void *mpi_comm_out);

#endif /* IGRAD_COMM_INTERNAL_H */
