/*
 * igrad_cuda.h — igrad on a CUDA device: the companion of igrad.h for
 * callers whose gradients live in GPU memory. Everything else (layouts,
 * profiles, configs, steps, statistics, errors) is igrad.h's.
 *
 * An engine made by igrad_engine_create_cuda keeps its residuals,
 * velocities, staged selections and bucket buffers on one device; its
 * data plane (error feedback + exact selection, packing, unpacking) runs
 * as CUDA kernels on the engine's stream, with the same results bit for
 * bit as the CPU engine on the same gradients (the norms in the step
 * statistics may differ in their last bits: they are summed in another
 * order). The host holds O(metadata): the plan, per-tensor results and
 * block descriptions, never O(parameters).
 *
 *     cudaStream_t s;  cudaStreamCreate(&s);
 *     ncclComm_t nc;   ... ncclCommInitRank(&nc, nranks, id, rank) ...
 *     igrad_comm_t *comm;
 *     igrad_comm_create_nccl(nc, s, &comm);       // or igrad_comm_create_self_cuda(s, ...)
 *     igrad_engine_t *eng;
 *     igrad_engine_create_cuda(layout, profile, &cfg, comm, 0, s, &eng);
 *     float *grads[T];                            // device pointers, one per tensor
 *     igrad_engine_sync(eng, step, grads);        // in place, on the stream
 *
 * igrad_engine_sync and igrad_engine_begin/end take a host array of device
 * pointers. The call returns once the step's results are decided (it waits
 * for the stream where the control plane needs per-tensor results); the
 * last kernels that write the gradients may still be queued on the stream,
 * so work queued after them on that stream sees the result, and the host
 * synchronizes the stream before reading the gradients itself.
 * igrad_engine_residual/velocity return device pointers.
 * igrad_engine_save_state and load_state work on a device engine: the
 * file is the CPU engine's format, byte for byte the same for the same
 * state, so either kind loads the other's (saving copies the residuals
 * out through 1 MiB of host memory at a time; loading reads the whole
 * file into host memory first, as for every engine).
 *
 * A custom communicator (igrad_comm_ops_t) takes the engine's device
 * buckets when its table says memory = IGRAD_MEMORY_CUDA (igrad.h).
 * config.topology hier (the two-level sync) works on a device engine over
 * a comm that splits (NCCL: ncclCommSplit, ncclReduce, ncclBroadcast;
 * self_cuda; a custom one with split, ireduce and ibcast): the node sums
 * and the shard engine's state live on the device. The sparse all-reduce
 * (collective sparse_reduce, and auto with auto_sparse_reduce) runs on the
 * device too, over a comm whose variable all-to-all takes device buffers
 * (NCCL: grouped ncclSend / ncclRecv; self_cuda; a custom one with
 * ops->alltoallv, which then gets device buffers): the split, the
 * reduction and re-sparsification at the owner, the result and the
 * remainder stay in device memory, and the host sees P counts and a few
 * scalars per bucket. It is blocking, as on the CPU: its steps wait for
 * the stream.
 *
 * These functions are in libigrad.so, which links no CUDA or NCCL library:
 * on first use they load the plugin libigrad_cuda.so (the CUDA data plane
 * and the CUDA communicators; it needs libcudart, and libnccl when built
 * with NCCL) from the directory of libigrad.so, or IGRAD_PLUGIN_DIR, or
 * the library search path. Where it cannot be loaded (a build without
 * CUDA, or a machine without the CUDA runtime) every function here returns
 * IGRAD_E_UNSUPPORTED with a message naming the plugin and the dynamic
 * linker's reason (e.g. "libcudart.so.13: cannot open shared object
 * file"); igrad_comm_create_nccl does the same when the plugin was built
 * without NCCL.
 */
#ifndef IGRAD_CUDA_H
#define IGRAD_CUDA_H

#include "igrad.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t is struct CUstream_st *, ncclComm_t is struct ncclComm *:
 * declared here so that this header needs neither CUDA's nor NCCL's. */
struct CUstream_st;
struct ncclComm;

/** igrad_engine_create for gradients on CUDA device `device`, with its data
 *  plane on `stream` (NULL: the device's default stream). `comm` must take
 *  device buffers (igrad_comm_create_nccl, igrad_comm_create_self_cuda, a
 *  custom comm with memory = IGRAD_MEMORY_CUDA);
 *  others are refused with IGRAD_E_UNSUPPORTED naming the communicator.
 *  Collective over comm, like igrad_engine_create.
 *  @return IGRAD_E_INVALID for a device outside [0, cudaGetDeviceCount),
 *  IGRAD_E_UNSUPPORTED without CUDA (no libigrad_cuda.so, or no device),
 *  IGRAD_E_NOMEM when device memory runs
 *  out, or igrad_engine_create's errors. */
IGRAD_API igrad_status_t igrad_engine_create_cuda(const igrad_layout_t *layout,
                                                  const igrad_profile_t *profile,
                                                  const igrad_config_t *config,
                                                  igrad_comm_t *comm, int device,
                                                  struct CUstream_st *stream,
                                                  igrad_engine_t **out);

/** Runs the engine's later steps on `stream` (NULL: the default stream).
 *  @return IGRAD_E_INVALID for an engine not made by
 *  igrad_engine_create_cuda, IGRAD_E_STATE while a step is open. */
IGRAD_API igrad_status_t igrad_engine_set_stream_cuda(igrad_engine_t *engine,
                                                      struct CUstream_st *stream);

/** A one-rank communicator for device (and host) buffers: every collective
 *  is a copy, on the stream it is given (NULL: `stream`). For one GPU
 *  without NCCL. Free with igrad_comm_free. */
IGRAD_API igrad_status_t igrad_comm_create_self_cuda(struct CUstream_st *stream,
                                                     igrad_comm_t **out);

/** A communicator over an existing NCCL communicator (borrowed: not
 *  destroyed by igrad_comm_free) whose collectives run on `stream` unless
 *  the engine gives its own. The engine's bucket collectives take device
 *  buffers only; the blocking collectives (igrad_comm_allgather, ...; the
 *  engine's agreement) take host buffers, staged through a small device
 *  buffer. A step's collectives are one NCCL group. Works with blocking
 *  and non-blocking NCCL communicators (ncclInProgress is waited out).
 *  Errors come back as IGRAD_E_COMM with ncclGetErrorString's text and the
 *  comm's ncclCommGetAsyncError; a timeout (igrad_comm_set_timeout) as
 *  IGRAD_E_TIMEOUT; the process is never aborted.
 *  @return IGRAD_E_INVALID for a NULL comm, IGRAD_E_UNSUPPORTED without
 *  NCCL (no libigrad_cuda.so, or one built without NCCL). */
IGRAD_API igrad_status_t igrad_comm_create_nccl(struct ncclComm *nccl_comm,
                                                struct CUstream_st *stream,
                                                igrad_comm_t **out);

#ifdef __cplusplus
}
#endif

#endif /* IGRAD_CUDA_H */
