/*
 * dp_cuda.cu — the CUDA data-plane backend's row of the ops table (dp.h):
 * device memory (cudaMalloc; the engine's residuals, velocities, staged
 * selections and bucket arenas; copies in and out), the per-engine device state
 * (igrad__cuda_state_t: per-tensor result arrays and kernel scratch, a
 * few KiB plus 16 bytes per 4096 entries of the largest tensor), the
 * zero stage and the CUDA error messages. The stages live one per file
 * (dp_cuda_check.cu, dp_cuda_select.cu, dp_cuda_pack.cu). Every launch
 * and copy goes on the engine's stream (mem->dp_stream).
 */
#include "dp/cuda/dp_cuda.cuh"
#include "core/sparsifier.h"

extern "C" {
#include "comm/sparse_allreduce.h"
}

#include <stdlib.h>

igrad_status_t igrad__cuda_fail(cudaError_t err, const char *what)
{
    return igrad__fail(err == cudaErrorMemoryAllocation ? IGRAD_E_NOMEM : IGRAD_E_STATE,
                       __FILE__, __LINE__, "%s: CUDA error %d (%s): %s", what, (int)err,
                       cudaGetErrorName(err), cudaGetErrorString(err));
}

static void *cuda_alloc(size_t nbytes, int zeroed)
{
    void *p = NULL;
    if (cudaMalloc(&p, nbytes ? nbytes : 1) != cudaSuccess) return NULL;
    /* cudaMemset runs on the legacy stream; a non-blocking engine stream
     * does not wait for it, so the zeros are waited for here (create only) */
    if (zeroed && nbytes &&
        (cudaMemset(p, 0, nbytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(void *p)
{
    if (p) cudaFree(p);
}

static void cuda_copy_in(void *dst, const void *src, size_t nbytes)
{
    /* cudaMemcpy from pageable memory may return before the bytes reach
     * the device, and a non-blocking engine stream would not wait for the
     * legacy stream: waited for here (state loads only) */
    if (nbytes && cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice) == cudaSuccess)
        cudaDeviceSynchronize();
}

/* Device to host on the engine's stream, after the kernels queued there
 * (the residuals' last writers), and waited for: dst is the caller's to
 * read on return. */
static igrad_status_t cuda_copy_out(IGRAD__DP_CARGS, void *dst, const void *src, size_t nbytes)
{
    if (!nbytes) return IGRAD_OK;
    const igrad__cuda_state_t *st = (const igrad__cuda_state_t *)mem->dp_state;
    cudaError_t err = st ? cudaSetDevice(st->device) : cudaSuccess;
    cudaStream_t s = igrad__cuda_stream(plan, step, mem);
    if (err == cudaSuccess) err = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    return err == cudaSuccess ? IGRAD_OK
                              : igrad__cuda_fail(err, "CUDA data plane: copying device memory out");
}

static igrad_status_t cuda_copy(IGRAD__DP_CARGS, void *dst, const void *src, size_t nbytes)
{
    if (!nbytes) return IGRAD_OK;
    const igrad__cuda_state_t *st = (const igrad__cuda_state_t *)mem->dp_state;
    cudaError_t err = st ? cudaSetDevice(st->device) : cudaSuccess;
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice,
                              igrad__cuda_stream(plan, step, mem));
    return err == cudaSuccess ? IGRAD_OK
                              : igrad__cuda_fail(err, "CUDA data plane: copying device memory");
}

static void state_free(igrad__cuda_state_t *st)
{
    if (!st) return;
    cudaFree(st->d_tnorm);
    cudaFree(st->d_tsumsq);
    cudaFree(st->d_part);
    cudaFree(st->d_hist);
    cudaFree(st->d_radix);
    cudaFree(st->d_chunks);
    cudaFree(st->d_first);
    cudaFree(st->d_bad);
    cudaFree(st->d_blk);
    free(st->h_blk);
    cudaFree(st->d_seg);
    cudaFree(st->d_segsum);
    free(st->h_seg);
    free(st->h_segsum);
    free(st->h_bad);
    free(st->h_sums);
    free(st);
}

static void cuda_release(IGRAD__DP_ARGS)
{
    (void)plan;
    (void)step;
    state_free((igrad__cuda_state_t *)mem->dp_state);
    mem->dp_state = NULL;
}

igrad_status_t igrad__cuda_state_create(IGRAD__DP_ARGS)
{
    (void)step;
    if (mem->dp_state) return IGRAD_OK;
    igrad__cuda_state_t *st = (igrad__cuda_state_t *)calloc(1, sizeof *st);
    IGRAD_FAIL_IF(!st, IGRAD_E_NOMEM, "CUDA data plane: out of memory for its state");
    cudaError_t err = cudaGetDevice(&st->device);
    int64_t most = 1;
    for (size_t t = 0; t < plan->ntensors; t++)
        if (plan->t[t].n > most) most = plan->t[t].n;
    st->ntensors = plan->ntensors;
    st->max_chunks = (size_t)((most + IGRAD__CUDA_CHUNK - 1) / IGRAD__CUDA_CHUNK);
    size_t T = plan->ntensors ? plan->ntensors : 1;
    st->h_sums = (double *)calloc(2 * T, sizeof *st->h_sums);
    if (!st->h_sums) {
        state_free(st);
        return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__,
                           "CUDA data plane: out of memory for its state");
    }
    if (err == cudaSuccess) err = cudaMalloc(&st->d_tnorm, T * sizeof(double));
    if (err == cudaSuccess) err = cudaMalloc(&st->d_tsumsq, 2 * T * sizeof(double));
    if (err == cudaSuccess) err = cudaMalloc(&st->d_part, IGRAD__CUDA_SUM_BLOCKS * sizeof(double));
    if (err == cudaSuccess) err = cudaMalloc(&st->d_hist, IGRAD__RADIX_BINS_MAX * sizeof(uint32_t));
    if (err == cudaSuccess) err = cudaMalloc(&st->d_radix, 2 * sizeof(uint64_t));
    if (err == cudaSuccess) err = cudaMalloc(&st->d_chunks, 2 * st->max_chunks * sizeof(uint64_t));
    if (err == cudaSuccess) err = cudaMalloc(&st->d_first, sizeof(unsigned long long));
    if (err != cudaSuccess) {
        state_free(st);
        return igrad__cuda_fail(err, "CUDA data plane: allocating its state");
    }
    mem->dp_state = st;
    return IGRAD_OK;
}

igrad__cuda_state_t *igrad__cuda_state(IGRAD__DP_ARGS)
{
    if (!mem->dp_state && igrad__cuda_state_create(plan, step, mem) != IGRAD_OK) return NULL;
    igrad__cuda_state_t *st = (igrad__cuda_state_t *)mem->dp_state;
    cudaSetDevice(st->device);
    return st;
}

/* Zeroes the gradients that unpacking adds into (sparse methods: all). */
static void cuda_zero(IGRAD__DP_ARGS, float *const *grads)
{
    if (igrad__sparsifier_dense(plan->sp)) return;
    cudaStream_t s = igrad__cuda_stream(plan, step, mem);
    for (size_t t = 0; t < plan->ntensors; t++)
        cudaMemsetAsync(grads[t], 0, (size_t)plan->t[t].n * sizeof(float), s);
}

extern "C" const igrad__dp_ops_t igrad__dp_cuda = {
    /* .name = */ "cuda",
    /* .space = */ IGRAD__MEM_DEVICE,
    /* .alloc = */ cuda_alloc,
    /* .free = */ cuda_free,
    /* .copy_in = */ cuda_copy_in,
    /* .copy_out = */ cuda_copy_out,
    /* .copy = */ cuda_copy,
    /* .check = */ igrad__dp_cuda_check,
    /* .first_bad = */ igrad__dp_cuda_first_bad,
    /* .select_into = */ igrad__dp_cuda_select_into,
    /* .pack = */ {igrad__dp_cuda_pack_sparse, igrad__dp_cuda_pack_dense, igrad__dp_cuda_pack_sar},
    /* .unpack = */ {igrad__dp_cuda_unpack_sparse, igrad__dp_cuda_unpack_dense,
                     igrad__dp_cuda_unpack_sar},
    /* .sar = */ &igrad__sar_cuda,
    /* .unpack16 = */ NULL, /* F32 gradients only: create refuses grad_dtype 16-bit */
    /* .zero = */ cuda_zero,
    /* .release = */ cuda_release,
    /* .prepare = */ igrad__cuda_state_create,
};
