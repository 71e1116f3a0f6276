/*
 * cuda_plugin.c — igrad_cuda.h's functions in libigrad.so: each loads the
 * plugin libigrad_cuda.so on first use (core/plugin.h) and calls its
 * table (engine/engine_cuda.cu), so that libigrad.so links no CUDA or
 * NCCL library and the API is the same in every build. Where the plugin
 * cannot be loaded (not built, or its CUDA runtime missing) each returns
 * IGRAD_E_UNSUPPORTED naming the file and the dynamic linker's reason; a
 * plugin built without NCCL refuses igrad_comm_create_nccl the same way.
 * A program linked with libigrad.a has the plugin linked in.
 */
#include "core/plugin.h"

extern const igrad__plugin_cuda_t igrad__plugin_cuda __attribute__((weak));

static igrad_status_t cuda_table(const char *caller, const igrad__plugin_cuda_t **out)
{
    const igrad__plugin_head_t *t = NULL;
    IGRAD_CHECK(igrad__plugin_load("cuda", "CUDA", caller,
                                   &igrad__plugin_cuda ? &igrad__plugin_cuda.head : NULL, &t));
    *out = (const igrad__plugin_cuda_t *)t;
    return IGRAD_OK;
}

igrad_status_t igrad_engine_create_cuda(const igrad_layout_t *layout,
                                        const igrad_profile_t *profile,
                                        const igrad_config_t *config, igrad_comm_t *comm,
                                        int device, struct CUstream_st *stream,
                                        igrad_engine_t **out)
{
    if (out) *out = NULL;
    const igrad__plugin_cuda_t *cuda = NULL;
    IGRAD_CHECK(cuda_table("igrad_engine_create_cuda", &cuda));
    return cuda->engine_create(layout, profile, config, comm, device, stream, out);
}

igrad_status_t igrad_engine_set_stream_cuda(igrad_engine_t *engine, struct CUstream_st *stream)
{
    const igrad__plugin_cuda_t *cuda = NULL;
    IGRAD_CHECK(cuda_table("igrad_engine_set_stream_cuda", &cuda));
    return cuda->engine_set_stream(engine, stream);
}

igrad_status_t igrad_comm_create_self_cuda(struct CUstream_st *stream, igrad_comm_t **out)
{
    if (out) *out = NULL;
    const igrad__plugin_cuda_t *cuda = NULL;
    IGRAD_CHECK(cuda_table("igrad_comm_create_self_cuda", &cuda));
    return cuda->comm_create_self(stream, out);
}

igrad_status_t igrad_comm_create_nccl(struct ncclComm *nccl_comm, struct CUstream_st *stream,
                                      igrad_comm_t **out)
{
    if (out) *out = NULL;
    const igrad__plugin_cuda_t *cuda = NULL;
    IGRAD_CHECK(cuda_table("igrad_comm_create_nccl", &cuda));
    IGRAD_FAIL_IF(!cuda->comm_create_nccl, IGRAD_E_UNSUPPORTED,
                  "igrad_comm_create_nccl: this igrad has no NCCL: its libigrad_cuda.so was "
                  "built without NCCL (nccl.h and libnccl were not both found at configure "
                  "time)");
    return cuda->comm_create_nccl(nccl_comm, stream, out);
}
