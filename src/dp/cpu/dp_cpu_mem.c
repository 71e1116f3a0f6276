/*
 * dp_cpu_mem.c — the CPU data plane's memory: host allocations (calloc
 * for zeroed ones: the kernel hands out zero pages lazily), copies in and
 * out, the backend's per-engine state (row bounds kept from the check to
 * select_into; with 16-bit gradients, per thread an F32 copy of one
 * tensor's), and the zero stage (the gradients that unpack adds into,
 * on the engine's threads).
 */
#include "dp/cpu/dp_cpu.h"
#include "core/sparsifier.h"
#include "core/value16.h"

#include <stdlib.h>
#include <string.h>

void *igrad__dp_cpu_alloc(size_t nbytes, int zeroed)
{
    if (nbytes == 0) nbytes = 1;
    return zeroed ? calloc(nbytes, 1) : malloc(nbytes);
}

void igrad__dp_cpu_free(void *p) { free(p); }

void igrad__dp_cpu_copy_in(void *dst, const void *src, size_t nbytes)
{
    if (nbytes) memcpy(dst, src, nbytes);
}

igrad_status_t igrad__dp_cpu_copy_out(IGRAD__DP_CARGS, void *dst, const void *src, size_t nbytes)
{
    (void)plan;
    (void)step;
    (void)mem;
    if (nbytes) memcpy(dst, src, nbytes);
    return IGRAD_OK;
}

igrad__dp_cpu_state_t *igrad__dp_cpu_state(IGRAD__DP_ARGS)
{
    if (mem->dp_state) return mem->dp_state;
    igrad__dp_cpu_state_t *cs = calloc(1, sizeof *cs);
    if (!cs) return NULL;
    cs->bound_off = malloc((plan->ntensors ? plan->ntensors : 1) * sizeof *cs->bound_off);
    int64_t off = 0;
    for (size_t t = 0; cs->bound_off && t < plan->ntensors; t++) {
        int64_t rows = 0;
        for (int rel = 0; rel < 2; rel++)
            for (int par = 0; par < 2; par++) {
                const igrad_select_spec_t *sp = &plan->t[t].spec[rel][par];
                if (sp->row_wise && sp->rows > rows) rows = sp->rows;
            }
        cs->bound_off[t] = off;
        off += rows;
    }
    cs->bound = malloc((size_t)(off ? off : 1) * sizeof *cs->bound);
    mem->dp_state = cs;
    if (!cs->bound_off || !cs->bound) {
        igrad__dp_cpu_release(plan, step, mem);
        return NULL;
    }
    if (plan->kargs.grad_dtype != IGRAD_DTYPE_F32) {
        int64_t most = 1;
        for (size_t t = 0; t < plan->ntensors; t++)
            if (plan->t[t].n > most) most = plan->t[t].n;
        cs->g32 = calloc((size_t)plan->nthreads, sizeof *cs->g32);
        cs->alias = malloc((plan->ntensors ? plan->ntensors : 1) * sizeof *cs->alias);
        int ok = cs->g32 && cs->alias;
        for (int i = 0; ok && i < plan->nthreads; i++)
            ok = (cs->g32[i] = malloc((size_t)most * sizeof(float))) != NULL;
        if (!ok) {
            igrad__dp_cpu_release(plan, step, mem);
            return NULL;
        }
        for (size_t t = 0; t < plan->ntensors; t++) cs->alias[t] = cs->g32[0];
    }
    return cs;
}

void igrad__dp_cpu_release(IGRAD__DP_ARGS)
{
    (void)step;
    igrad__dp_cpu_state_t *cs = mem->dp_state;
    if (!cs) return;
    free(cs->bound);
    free(cs->bound_off);
    for (int i = 0; cs->g32 && i < plan->nthreads; i++) free(cs->g32[i]);
    free(cs->g32);
    free(cs->alias);
    free(cs);
    mem->dp_state = NULL;
}

float *igrad__dp_cpu_grad(IGRAD__DP_CARGS, const igrad__dp_cpu_state_t *cs, float *const *grads,
                          size_t t, int tid)
{
    (void)step;
    (void)mem;
    if (plan->kargs.grad_dtype == IGRAD_DTYPE_F32) return grads[t];
    igrad__from16_n(plan->kargs.grad_dtype, (const uint16_t *)(const void *)grads[t], cs->g32[tid],
                    plan->t[t].n);
    return cs->g32[tid];
}

void igrad__dp_cpu_zero_grad(IGRAD__DP_CARGS, float *const *grads, size_t t)
{
    (void)step;
    (void)mem;
    size_t width = plan->kargs.grad_dtype == IGRAD_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
    memset(grads[t], 0, (size_t)plan->t[t].n * width);
}

/* Zeroes the gradients that unpacking adds into (sparse methods: all). */
void igrad__dp_cpu_zero(IGRAD__DP_ARGS, float *const *grads)
{
    if (igrad__sparsifier_dense(plan->sp)) return;
    int64_t T = (int64_t)plan->ntensors;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(plan->nthreads)
#endif
    for (int64_t w = 0; w < T; w++) {
        igrad__dp_cpu_zero_grad(plan, step, mem, grads, step->work[w]);
    }
}

