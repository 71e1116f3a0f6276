/*
 * dp_cuda_engine.cu — igrad_cuda.h's engine entry points: an engine on
 * the CUDA data plane (dp_cuda.cu's row of dp.h) for one device and
 * stream, and changing its stream. The engine itself is engine.c's; only
 * the data plane and its queue differ from igrad_engine_create.
 */
#include "dp/cuda/dp_cuda.cuh"
/* The engine entry points: an engine-layer file (igrad__engine_create,
 * the two-level engine), here because it is compiled with the device code. */
extern "C" {
#include "engine/engine_internal.h"
}

extern "C" {
#include "igrad_cuda.h"
}

extern "C" igrad_status_t igrad_engine_create_cuda(const igrad_layout_t *layout,
                                                   const igrad_profile_t *profile,
                                                   const igrad_config_t *config,
                                                   igrad_comm_t *comm, int device,
                                                   struct CUstream_st *stream,
                                                   igrad_engine_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_engine_create_cuda: out is NULL");
    *out = NULL;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess)
        return igrad__fail(IGRAD_E_UNSUPPORTED, __FILE__, __LINE__,
                           "igrad_engine_create_cuda: no CUDA device (cudaGetDeviceCount: %s)",
                           cudaGetErrorString(err));
    IGRAD_FAIL_IF(device < 0 || device >= count, IGRAD_E_INVALID,
                  "igrad_engine_create_cuda: device %d outside [0, %d)", device, count);
    err = cudaSetDevice(device);
    if (err != cudaSuccess) return igrad__cuda_fail(err, "igrad_engine_create_cuda: cudaSetDevice");
    igrad_engine_t *e = NULL;
    int hier = config && config->size >= sizeof *config &&
               config->topology == IGRAD_TOPOLOGY_HIER;
    if (hier) /* the two-level engine: its shard engine and buffers on the device */
        IGRAD_CHECK(igrad__hier_create(layout, profile, config, comm, &igrad__dp_cuda, stream, &e));
    else
        IGRAD_CHECK(
            igrad__engine_create(layout, profile, config, comm, &igrad__dp_cuda, stream, &e));
    /* The device state now, so that running out of memory is said here;
     * the warm-up engine makes its own on first use. */
    igrad_engine_t *data = hier ? igrad__hier_shard(e) : e;
    igrad_status_t st = igrad__cuda_state_create(IGRAD__PARTS(data));
    if (st != IGRAD_OK) {
        igrad_engine_free(e);
        return st;
    }
    *out = e;
    return IGRAD_OK;
}

extern "C" igrad_status_t igrad_engine_set_stream_cuda(igrad_engine_t *engine,
                                                       struct CUstream_st *stream)
{
    IGRAD_FAIL_IF(!engine, IGRAD_E_INVALID, "igrad_engine_set_stream_cuda: engine is NULL");
    /* a two-level engine's data plane is its shard engine's */
    igrad_engine_t *data = engine->hier ? igrad__hier_shard(engine) : engine;
    IGRAD_FAIL_IF(!data || data->mem.dp != &igrad__dp_cuda, IGRAD_E_INVALID,
                  "igrad_engine_set_stream_cuda: the engine's data plane is '%s', not cuda "
                  "(made by igrad_engine_create, not igrad_engine_create_cuda)",
                  data && data->mem.dp ? data->mem.dp->name : "none");
    IGRAD_FAIL_IF(engine->state != IGRAD__ENGINE_IDLE, IGRAD_E_STATE,
                  "igrad_engine_set_stream_cuda: step %lld is open",
                  (long long)engine->step.cur_step);
    for (igrad_engine_t *e = data; e; e = e->warmup) e->mem.dp_stream = stream;
    return IGRAD_OK;
}
