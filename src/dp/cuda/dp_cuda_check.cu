/*
 * dp_cuda_check.cu — the CUDA data plane's check stage: per tensor the
 * sum of a^2 in double for a = (m*u +) g (+ e), one read-only pass that
 * proves a finite (a NaN or Inf makes the sum non-finite, a finite float
 * squared never overflows a double) and gives the residual norm, in a
 * fixed order (dp_cuda.cuh's sums: the same bits on every rank; the CPU
 * backend's vectorized order differs in the last bits, the finiteness
 * verdict never). The per-tensor sums come back to the host as one small
 * array. After a non-finite sum, where the first bad entry is.
 */
#include "dp/cuda/dp_cuda.cuh"
#include "core/sparsifier.h"

#include <math.h>

namespace {

/* a = m*u + g + e as the selection will form it (select_into). */
struct a_of {
    const float *g, *u, *e;
    float m;
    __device__ float operator()(int64_t i) const
    {
        float v = u ? igrad__momentum(m, u[i], g[i]) : g[i];
        return e ? igrad__fadd(v, e[i]) : v;
    }
};

__global__ void first_bad_kernel(a_of f, int64_t n, unsigned long long *first)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = f.u ? igrad__momentum(f.m, f.u[i], f.g[i]) : f.g[i];
        if (!igrad__finite(v) || !igrad__finite(f.e ? igrad__fadd(v, f.e[i]) : v))
            atomicMin(first, (unsigned long long)i);
    }
}

} // namespace

void igrad__dp_cuda_check(IGRAD__DP_ARGS, float *const *grads)
{
    igrad__cuda_state_t *st = igrad__cuda_state(plan, step, mem);
    int dense = igrad__sparsifier_dense(plan->sp);
    if (!st) { /* no state: every tensor reads as failed (NaN) */
        for (size_t t = 0; t < plan->ntensors; t++) step->tnorm[t] = NAN;
        return;
    }
    cudaStream_t s = igrad__cuda_stream(plan, step, mem);
    for (size_t t = 0; t < plan->ntensors; t++) {
        const igrad__plan_tensor_t *tp = &plan->t[t];
        a_of f = {grads[t], mem->velocity[t], dense ? NULL : mem->residual[t],
                  plan->kargs.momentum};
        igrad__cuda_sum_launch(f, tp->n, st->d_part, st->d_tnorm + t, s);
    }
    cudaError_t err = cudaMemcpyAsync(step->tnorm, st->d_tnorm, plan->ntensors * sizeof(double),
                                      cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) {
        igrad__cuda_fail(err, "CUDA check");
        for (size_t t = 0; t < plan->ntensors; t++) step->tnorm[t] = NAN;
    }
}

int64_t igrad__dp_cuda_first_bad(IGRAD__DP_CARGS, float *const *grads, size_t t, float *g, float *u,
                                 float *r)
{
    const igrad__cuda_state_t *st = (const igrad__cuda_state_t *)mem->dp_state;
    const igrad__plan_tensor_t *tp = &plan->t[t];
    *g = *u = *r = NAN;
    if (!st) return 0;
    cudaStream_t s = igrad__cuda_stream(plan, step, mem);
    const float *rv = igrad__sparsifier_dense(plan->sp) ? NULL : mem->residual[t];
    a_of f = {grads[t], mem->velocity[t], rv, plan->kargs.momentum};
    unsigned long long first = ~0ull;
    cudaMemcpyAsync(st->d_first, &first, sizeof first, cudaMemcpyHostToDevice, s);
    first_bad_kernel<<<igrad__cuda_grid(tp->n), IGRAD__CUDA_THREADS, 0, s>>>(f, tp->n,
                                                                           st->d_first);
    cudaMemcpyAsync(&first, st->d_first, sizeof first, cudaMemcpyDeviceToHost, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) return 0;
    int64_t i = first == ~0ull ? 0 : (int64_t)first; /* none: cannot happen */
    cudaMemcpy(g, grads[t] + i, sizeof *g, cudaMemcpyDeviceToHost);
    *u = 0.0f;
    if (mem->velocity[t]) cudaMemcpy(u, mem->velocity[t] + i, sizeof *u, cudaMemcpyDeviceToHost);
    *r = 0.0f;
    if (rv) cudaMemcpy(r, rv + i, sizeof *r, cudaMemcpyDeviceToHost);
    return i;
}
