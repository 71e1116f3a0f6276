/*
 * dp_cpu_mem.c — the CPU data plane's memory: host allocations (calloc
 * for zeroed ones: the kernel hands out zero pages lazily), copies in and
 * out, the backend's per-engine state (row bounds kept from the check to
 * select_into), and the zero stage (the gradients that unpack adds into,
 * on the engine's threads).
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

igrad__dp_cpu_state_t *igrad__dp_cpu_state(igrad_engine_t *e)
{
    if (e->dp_state) return e->dp_state;
    igrad__dp_cpu_state_t *cs = calloc(1, sizeof *cs);
    if (!cs) return NULL;
    cs->bound_off = malloc((e->ntensors ? e->ntensors : 1) * sizeof *cs->bound_off);
    int64_t off = 0;
    for (size_t t = 0; cs->bound_off && t < e->ntensors; t++) {
        int64_t rows = 0;
        for (int rel = 0; rel < 2; rel++)
            for (int par = 0; par < 2; par++) {
                const igrad_select_spec_t *sp = &e->t[t].spec[rel][par];
                if (sp->row_wise && sp->rows > rows) rows = sp->rows;
            }
        cs->bound_off[t] = off;
        off += rows;
    }
    cs->bound = malloc((size_t)(off ? off : 1) * sizeof *cs->bound);
    if (!cs->bound_off || !cs->bound) {
        free(cs->bound_off);
        free(cs->bound);
        free(cs);
        return NULL;
    }
    e->dp_state = cs;
    return cs;
}

void igrad__dp_cpu_release(igrad_engine_t *e)
{
    igrad__dp_cpu_state_t *cs = e->dp_state;
    if (!cs) return;
    free(cs->bound);
    free(cs->bound_off);
    free(cs);
    e->dp_state = NULL;
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

