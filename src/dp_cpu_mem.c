/*
 * dp_cpu_mem.c — the CPU data plane's memory: host allocations (calloc
 * for zeroed ones: the kernel hands out zero pages lazily), copies in and
 * out, and
 * the zero stage (the gradients that unpack adds into, on the engine's
 * threads).
 */
#include "dp_cpu.h"

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

igrad_status_t igrad__dp_cpu_copy_out(const igrad_engine_t *e, void *dst, const void *src,
                                      size_t nbytes)
{
    (void)e;
    if (nbytes) memcpy(dst, src, nbytes);
    return IGRAD_OK;
}

/* Zeroes the gradients that unpacking adds into (sparse methods: all). */
void igrad__dp_cpu_zero(igrad_engine_t *e, float *const *grads)
{
    if (e->sp == IGRAD_SPARSIFIER_NONE) return;
    int64_t T = (int64_t)e->ntensors;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(e->nthreads)
#endif
    for (int64_t w = 0; w < T; w++) {
        uint32_t t = e->work[w];
        memset(grads[t], 0, (size_t)e->t[t].n * sizeof(float));
    }
}

