/*
 * dp_cpu_check.c — the CPU data plane's check stage: per tensor the sum
 * of a^2 in double for a = (m*u +) g (+ e), one read-only pass that both
 * proves a finite (a NaN or Inf makes the sum non-finite, while a finite
 * float squared never overflows a double) and gives the residual norm
 * and dropped mass without another pass; and, after a non-finite sum,
 * where the first bad entry is. The messages are the engine's.
 * For the tensors sent this step (without momentum) that pass is the
 * selection's own pass 1 (igrad__select_find): the same read of g and e
 * also leaves the selection in the staging memory (or the row bounds in
 * the backend's state), which select_into finishes after the ranks
 * agreed, so such a tensor is read twice per step, not three times.
 * 16-bit gradients (config.grad_dtype) are read through their thread's
 * F32 copy (igrad__dp_cpu_grad), the same kernels then run on it.
 */
#include "dp/cpu/dp_cpu.h"
#include "core/sparsifier.h"
#include "dp/cpu/select_internal.h"
#include "core/value16.h"

#include <math.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* sum of (g + e)^2 in double (e may be NULL, the dense method): one
 * read-only pass that both proves a = g + e finite (a NaN or Inf makes the
 * sum non-finite, while a finite float squared never overflows a double)
 * and gives the residual norm and dropped mass without another pass. */
static double sumsq_ge(const float *restrict g, const float *restrict e, int64_t n)
{
    if (e) return igrad__sumsq_ge(g, e, n);
    double s = 0.0;
    SIMD_SUM
    for (int64_t i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
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

double igrad__dp_cpu_sumsq(const float *g, const float *u, const float *e, float m, int64_t n)
{
    return u ? sumsq_muge(g, u, e, m, n) : sumsq_ge(g, e, n);
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

int igrad__dp_cpu_fused(IGRAD__DP_CARGS, size_t t)
{
    return !igrad__sparsifier_dense(plan->sp) && step->sent[t] && !mem->velocity[t];
}

/* Selection pass 1 of sent tensor t, which is also its check: tnorm[t] =
 * sum of a^2, or NaN when some a is not finite (first_bad then says
 * where); other failures in tstatus[t]. */
static void find_sent(IGRAD__DP_ARGS, const igrad__dp_cpu_state_t *cs, const float *g, uint32_t t,
                      igrad_select_ws_t *ws)
{
    const igrad__plan_tensor_t *tp = &plan->t[t];
    int par = igrad__plan_parity(plan, step->cur_step);
    igrad_selection_t sel = {.index = step->stage_idx + step->stage_off[t],
                             .value = step->stage_val + step->stage_off[t]};
    double a2 = 0.0;
    igrad_status_t st = igrad__select_find(g, mem->residual[t], &tp->spec[step->rel[t]][par],
                                           tp->name, ws, &sel, cs->bound + cs->bound_off[t], &a2);
    step->tnorm[t] = st == IGRAD_OK ? a2 : NAN;
    if (st != IGRAD_E_NONFINITE) step->tstatus[t] = st;
}

void igrad__dp_cpu_check(IGRAD__DP_ARGS, float *const *grads)
{
    int dense = igrad__sparsifier_dense(plan->sp);
    int64_t T = (int64_t)plan->ntensors;
    float m = plan->kargs.momentum;
    int grad16 = plan->kargs.grad_dtype != IGRAD_DTYPE_F32;
    igrad__dp_cpu_state_t *cs = dense && !grad16 ? NULL : igrad__dp_cpu_state(plan, step, mem);
    if ((!dense || grad16) && !cs) {
        for (size_t t = 0; t < plan->ntensors; t++) step->tstatus[t] = IGRAD_E_NOMEM;
        return;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(plan->nthreads)
#endif
    for (int64_t w = 0; w < T; w++) {
#ifdef _OPENMP
        int tid = omp_get_thread_num();
#else
        int tid = 0;
#endif
        uint32_t t = step->work[w];
        const igrad__plan_tensor_t *tp = &plan->t[t];
        const float *g = igrad__dp_cpu_grad(plan, step, mem, cs, grads, t, tid);
        /* kept in tnorm until select_into turns it into the residual's */
        if (igrad__dp_cpu_fused(plan, step, mem, t))
            find_sent(plan, step, mem, cs, g, t, mem->ws[tid]);
        else
            step->tnorm[t] =
                igrad__dp_cpu_sumsq(g, mem->velocity[t], dense ? NULL : mem->residual[t], m, tp->n);
    }
}

int64_t igrad__dp_cpu_first_bad(IGRAD__DP_CARGS, float *const *grads, size_t t, float *g, float *u,
                                float *r)
{
    (void)step;
    const igrad__plan_tensor_t *tp = &plan->t[t];
    const float *rv = igrad__sparsifier_dense(plan->sp) ? NULL : mem->residual[t];
    float m = plan->kargs.momentum;
    int64_t i = -1;
    if (plan->kargs.grad_dtype == IGRAD_DTYPE_F32) {
        i = first_nonfinite(grads[t], mem->velocity[t], m, rv, tp->n);
    } else { /* 16-bit gradients: upcast a chunk at a time */
        const uint16_t *h = (const uint16_t *)(const void *)grads[t];
        float buf[1024];
        for (int64_t i0 = 0; i < 0 && i0 < tp->n; i0 += 1024) {
            int64_t len = tp->n - i0 < 1024 ? tp->n - i0 : 1024;
            igrad__from16_n(plan->kargs.grad_dtype, h + i0, buf, len);
            int64_t k = first_nonfinite(buf, mem->velocity[t] ? mem->velocity[t] + i0 : NULL, m,
                                        rv ? rv + i0 : NULL, len);
            if (k >= 0) i = i0 + k;
        }
    }
    if (i < 0) i = 0; /* cannot happen: the sum saw a non-finite a */
    if (plan->kargs.grad_dtype == IGRAD_DTYPE_F32)
        *g = grads[t][i];
    else
        igrad__from16_n(plan->kargs.grad_dtype, (const uint16_t *)(const void *)grads[t] + i, g, 1);
    *u = mem->velocity[t] ? mem->velocity[t][i] : 0.0f;
    *r = rv ? rv[i] : 0.0f;
    return i;
}
