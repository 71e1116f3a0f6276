/*
 * dp_cpu_check.c — the CPU data plane's check stage: per tensor the sum
 * of a^2 in double for a = (m*u +) g (+ e), one read-only pass that both
 * proves a finite (a NaN or Inf makes the sum non-finite, while a finite
 * float squared never overflows a double) and gives the residual norm
 * and dropped mass without another pass; and, after a non-finite sum,
 * where the first bad entry is. The messages are the engine's.
 */
#include "dp_cpu.h"

#include <math.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* sum of (g + e)^2 in double (e may be NULL): one read-only pass that both
 * proves a = g + e finite (a NaN or Inf makes the sum non-finite, while a
 * finite float squared never overflows a double) and gives the residual
 * norm and dropped mass without another pass. */
static double sumsq_ge(const float *restrict g, const float *restrict e, int64_t n)
{
    double s = 0.0;
    if (e) {
        SIMD_SUM
        for (int64_t i = 0; i < n; i++) {
            float a = g[i] + e[i];
            s += (double)a * (double)a;
        }
    } else {
        SIMD_SUM
        for (int64_t i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
    }
    return s;
}

/* With momentum correction: sum of a^2 for a = (m*u + g) + e, computed as
 * select_all will (u becomes m*u + g, then the selection adds e), so the
 * check proves finite exactly the values the step will write. */
static double sumsq_muge(const float *restrict g, const float *restrict u,
                         const float *restrict e, float m, int64_t n)
{
    double s = 0.0;
    SIMD_SUM
    for (int64_t i = 0; i < n; i++) {
        float v = m * u[i] + g[i];
        float a = v + e[i];
        s += (double)a * (double)a;
    }
    return s;
}

/* First index where a = (m*u +) g (+ e) is not finite, or -1 (after the
 * sum said there is one). u may be NULL (no momentum), e too (dense). */
static int64_t first_nonfinite(const float *g, const float *u, float m, const float *e,
                               int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float v = u ? m * u[i] + g[i] : g[i];
        if (!isfinite(v) || !isfinite(v + (e ? e[i] : 0.0f))) return i;
    }
    return -1;
}

void igrad__dp_cpu_check(igrad_engine_t *e, float *const *grads)
{
    int dense = e->sp == IGRAD_SPARSIFIER_NONE;
    int64_t T = (int64_t)e->ntensors;
    float m = (float)e->cfg.momentum;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(e->nthreads)
#endif
    for (int64_t w = 0; w < T; w++) {
        uint32_t t = e->work[w];
        const igrad__engine_tensor_t *tp = &e->t[t];
        /* kept in tnorm until select_into turns it into the residual's */
        e->tnorm[t] = tp->velocity
                          ? sumsq_muge(grads[t], tp->velocity, tp->residual, m, tp->n)
                          : sumsq_ge(grads[t], dense ? NULL : tp->residual, tp->n);
    }
}

int64_t igrad__dp_cpu_first_bad(const igrad_engine_t *e, float *const *grads, size_t t,
                                float *g, float *u, float *r)
{
    const igrad__engine_tensor_t *tp = &e->t[t];
    const float *rv = e->sp == IGRAD_SPARSIFIER_NONE ? NULL : tp->residual;
    int64_t i = first_nonfinite(grads[t], tp->velocity, (float)e->cfg.momentum, rv, tp->n);
    if (i < 0) i = 0; /* cannot happen: the sum saw a non-finite a */
    *g = grads[t][i];
    *u = tp->velocity ? tp->velocity[i] : 0.0f;
    *r = rv ? rv[i] : 0.0f;
    return i;
}
