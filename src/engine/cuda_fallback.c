/*
 * cuda_fallback.c — igrad_cuda.h's functions in a build without CUDA (or
 * without NCCL for igrad_comm_create_nccl): each says so with
 * IGRAD_E_UNSUPPORTED, so that the API is the same in every build (as
 * igrad_comm_create_mpi without MPI). With CUDA the real ones are in
 * dp_cuda_engine.cu, comm_self_cuda.c and comm_nccl.c.
 */
#include "core/internal.h"
#include "igrad_cuda.h"

#if !defined(IGRAD_HAVE_CUDA)
igrad_status_t igrad_engine_create_cuda(const igrad_layout_t *layout,
                                        const igrad_profile_t *profile,
                                        const igrad_config_t *config, igrad_comm_t *comm,
                                        int device, struct CUstream_st *stream,
                                        igrad_engine_t **out)
{
    (void)layout, (void)profile, (void)config, (void)comm, (void)device, (void)stream;
    if (out) *out = NULL;
    return igrad__fail(IGRAD_E_UNSUPPORTED, __FILE__, __LINE__,
                       "igrad_engine_create_cuda: this build of igrad has no CUDA (nvcc was "
                       "not found at configure time)");
}

igrad_status_t igrad_engine_set_stream_cuda(igrad_engine_t *engine, struct CUstream_st *stream)
{
    (void)engine, (void)stream;
    return igrad__fail(IGRAD_E_UNSUPPORTED, __FILE__, __LINE__,
                       "igrad_engine_set_stream_cuda: this build of igrad has no CUDA");
}

igrad_status_t igrad_comm_create_self_cuda(struct CUstream_st *stream, igrad_comm_t **out)
{
    (void)stream;
    if (out) *out = NULL;
    return igrad__fail(IGRAD_E_UNSUPPORTED, __FILE__, __LINE__,
                       "igrad_comm_create_self_cuda: this build of igrad has no CUDA");
}
#endif

#if !defined(IGRAD_HAVE_NCCL)
igrad_status_t igrad_comm_create_nccl(struct ncclComm *nccl_comm, struct CUstream_st *stream,
                                      igrad_comm_t **out)
{
    (void)nccl_comm, (void)stream;
    if (out) *out = NULL;
    return igrad__fail(IGRAD_E_UNSUPPORTED, __FILE__, __LINE__,
                       "igrad_comm_create_nccl: this build of igrad has no NCCL (CUDA and "
                       "nccl.h/libnccl were not both found at configure time)");
}
#endif
