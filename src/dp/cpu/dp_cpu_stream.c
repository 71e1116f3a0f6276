/*
 * dp_cpu_stream.c — the CPU data plane's stages of a streamed step
 * (engine_stream.c; architecture.md §5.9a). stream_ready: for the tensors
 * a ready call gives, the check's sum of a^2 (a = (m*u +) g + e) and, for
 * the sent ones, the fused selection of select.c run on a per-thread
 * scratch copy of the residual (and of m*u + g), so the staged selection
 * is exactly the whole step's while residual, velocity and gradient stay
 * untouched. stream_commit, once the ranks agreed that the step counts:
 * per tensor the residual and velocity that dp_cpu_select.c's select_into
 * would have written — sent: e = a with the selected entries 0 (16-bit
 * or FP8 values: their rounding remainder a - q), momentum masking; not sent:
 * accumulate or drop — recomputed from g, u, e and the staged selection,
 * zeroing g in the same pass. Same float operations in the same order as
 * select_into, so the result is bit-identical (tests/mpi_stream.c).
 */
#include "dp/cpu/dp_cpu.h"
#include "core/sparsifier.h"
#include "core/value16.h"

#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* A selection the step will never use (this rank fails it at close) but
 * whose buckets must still be packed: valid ascending indices, zeros. */
static void placeholder(const igrad_select_spec_t *sp, uint32_t *idx, float *val)
{
    int64_t per = sp->row_wise ? sp->per_row : sp->count;
    for (int64_t k = 0; k < sp->count; k++) {
        idx[k] = (uint32_t)(k % per);
        val[k] = 0.0f;
    }
}

/* 16-bit wire values: each staged v becomes round16(v) (a finite value
 * that would round to Inf clamped to the largest finite one), as
 * select.c's pass 2 does (igrad__round16); returns the sum of (v - q)^2, the
 * part the residual keeps. */
static double round_staged(igrad_dtype_t dt, float *val, int64_t count)
{
    double s = 0.0;
    for (int64_t k = 0; k < count; k++) {
        float q = igrad__round16(dt, val[k]);
        float d = val[k] - q;
        val[k] = q;
        s += (double)d * (double)d;
    }
    return s;
}

/* su = m*u + g over n entries (u, g untouched) */
static void momentum_into(float *restrict su, const float *restrict u, const float *restrict g,
                          float m, int64_t n)
{
    SIMD
    for (int64_t i = 0; i < n; i++) su[i] = m * u[i] + g[i];
}

void igrad__dp_cpu_stream_ready(IGRAD__DP_ARGS, float *const *grads, const size_t *tensors,
                                size_t n)
{
    int dense = igrad__sparsifier_dense(plan->sp);
    float m = plan->kargs.momentum;
    int par = igrad__plan_parity(plan, step->cur_step);
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(plan->nthreads)
#endif
    for (int64_t w = 0; w < (int64_t)n; w++) {
#ifdef _OPENMP
        int tid = omp_get_thread_num();
#else
        int tid = 0;
#endif
        size_t t = tensors[w];
        igrad__plan_tensor_t *tp = &plan->t[t];
        const float *g = grads[t];
        const igrad_select_spec_t *sp = &tp->spec[step->rel[t]][par];
        igrad_selection_t sel = {
            .index = step->stage_idx ? step->stage_idx + step->stage_off[t] : NULL,
            .value = step->stage_val ? step->stage_val + step->stage_off[t] : NULL};
        double a2 =
            g ? igrad__dp_cpu_sumsq(g, mem->velocity[t], dense ? NULL : mem->residual[t], m, tp->n)
              : NAN;
        step->tnorm[t] = a2; /* the check's; close turns it into the residual's */
        if (dense || !step->sent[t]) continue;
        if (!isfinite(a2)) {
            placeholder(sp, sel.index, sel.value);
            continue;
        }
        float *sr = mem->stream_scratch + (size_t)tid * mem->stream_scratch_count;
        float *su = sr + tp->n;
        memcpy(sr, mem->residual[t], (size_t)tp->n * sizeof *sr);
        const float *src = g;
        if (mem->velocity[t]) {
            momentum_into(su, mem->velocity[t], g, m, tp->n);
            src = su;
        }
        igrad_status_t st = igrad_select_ef(src, sr, sp, tp->name, mem->ws[tid], &sel);
        if (st != IGRAD_OK) {
            step->tstatus[t] = st;
            placeholder(sp, sel.index, sel.value);
            continue;
        }
        double rounded = 0.0;
        if (plan->kargs.value_dtype == IGRAD_DTYPE_F8_E4M3)
            rounded = igrad__dp_cpu_round8(plan, step, mem, t, sel.index, sel.value, NULL);
        else if (plan->kargs.value_dtype != IGRAD_DTYPE_F32)
            rounded = round_staged(plan->kargs.value_dtype, sel.value, sp->count);
        step->tsumsq[t] = sel.sumsq;
        double kept = a2 - sel.sumsq > 0.0 ? a2 - sel.sumsq : 0.0;
        step->tnorm[t] = kept + rounded;
    }
}

/* A sent tensor of n entries: e = a (u = m*u + g first; u NULL without
 * momentum), the selected entries (sp, idx, val: the staged selection) 0
 * or, with 16-bit or FP8 values (value16), their rounding remainder (and, with
 * momentum, their velocity: DGC's masking); g zeroed. */
static void commit_sent(float *restrict r, float *restrict u, float *restrict g, float m,
                        int64_t n, const igrad_select_spec_t *sp, const uint32_t *idx,
                        const float *val, int value16)
{
    if (u) {
        SIMD
        for (int64_t i = 0; i < n; i++) {
            u[i] = m * u[i] + g[i];
            r[i] = u[i] + r[i];
            g[i] = 0.0f;
        }
    } else {
        SIMD
        for (int64_t i = 0; i < n; i++) {
            r[i] = g[i] + r[i];
            g[i] = 0.0f;
        }
    }
    for (int64_t k = 0; k < sp->count; k++) {
        int64_t i = igrad__dp_cpu_sel_pos(sp, idx, k);
        /* r[i] holds a = the selected value; the fused pass zeroes it, then
         * adds the rounding remainder a - q (q the staged value) */
        r[i] = value16 ? 0.0f + (r[i] - val[k]) : 0.0f;
        if (u) u[i] = 0.0f;
    }
}

void igrad__dp_cpu_stream_commit(IGRAD__DP_ARGS, float *const *grads)
{
    int par = igrad__plan_parity(plan, step->cur_step);
    float m = plan->kargs.momentum;
    int value16 = plan->kargs.value_dtype != IGRAD_DTYPE_F32;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(plan->nthreads)
#endif
    for (int64_t w = 0; w < (int64_t)plan->ntensors; w++) {
        uint32_t t = step->work[w];
        igrad__plan_tensor_t *tp = &plan->t[t];
        if (step->sent[t])
            commit_sent(mem->residual[t], mem->velocity[t], grads[t], m, tp->n,
                        &tp->spec[step->rel[t]][par], step->stage_idx + step->stage_off[t],
                        step->stage_val + step->stage_off[t], value16);
        else
            igrad__dp_cpu_accumulate(plan, step, mem, t, grads[t], 1);
    }
}
