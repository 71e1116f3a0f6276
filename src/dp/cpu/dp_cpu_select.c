/*
 * dp_cpu_select.c — the CPU data plane's select_into stage: error
 * feedback fused with selection (select.c) for the tensors sent this
 * step, into the engine's staged selection, and the accumulate-or-drop of
 * the others, one tensor per OpenMP task (so every selection inside is
 * single-threaded). A sent tensor without momentum had its selection pass
 * 1 in the check (dp_cpu_check.c); here pass 2 (igrad__select_apply)
 * writes its residual. With momentum (architecture.md §5.5a) DGC's
 * momentum correction (the whole selection here, on m*u + g) and its
 * factor masking run here too. With `zero` each gradient is
 * zeroed in the pass that reads it. With 16-bit wire values
 * (config.value_dtype BF16 or F16) pass 2 rounds each sent value and
 * keeps its rounding error in the residual (architecture.md §5.2). 16-bit
 * gradients (config.grad_dtype) are read through the thread's F32 copy. Which
 * tensors are sent and their specs are the control plane's (engine.c,
 * schedule.c).
 */
#include "dp/cpu/dp_cpu.h"
#include "dp/cpu/select_internal.h"
#include "core/value8.h"

#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* Momentum factor masking: the velocity of the entries just sent is
 * cleared (the residual already is). */
static void mask_sent(float *restrict u, const igrad_select_spec_t *sp, const uint32_t *idx)
{
    if (sp->count == sp->n) {
        memset(u, 0, (size_t)sp->n * sizeof *u);
    } else if (sp->row_wise) {
        for (int64_t r = 0; r < sp->rows; r++) {
            float *ur = u + r * sp->cols;
            const uint32_t *ir = idx + r * sp->per_row;
            for (int64_t j = 0; j < sp->per_row; j++) ur[ir[j]] = 0.0f;
        }
    } else {
        for (int64_t j = 0; j < sp->count; j++) u[idx[j]] = 0.0f;
    }
}

/* u = m*u + g over n entries (g zeroed in the same pass with `zero`) */
static void momentum_step(float *restrict u, float *restrict g, float m, int64_t n, int zero)
{
    if (zero) {
        SIMD
        for (int64_t i = 0; i < n; i++) {
            u[i] = m * u[i] + g[i];
            g[i] = 0.0f;
        }
    } else {
        SIMD
        for (int64_t i = 0; i < n; i++) u[i] = m * u[i] + g[i];
    }
}

/* One sent tensor whose selection reads the velocity u: u = m*u + g,
 * then the whole selection of u + residual r (values rounded to the
 * 16-bit dtype vt unless F32), then factor masking. */
static igrad_status_t select_velocity(float *restrict u, float *restrict r, float *restrict g,
                                      float m, igrad_dtype_t vt, const igrad_select_spec_t *sp,
                                      const char *name, igrad_select_ws_t *ws,
                                      igrad_selection_t *sel, int zero, double *rounded)
{
    momentum_step(u, g, m, sp->n, zero);
    IGRAD_CHECK(igrad__select_ef(u, r, sp, name, ws, sel, 0, vt, rounded));
    mask_sent(u, sp, sel->index);
    return IGRAD_OK;
}

double igrad__dp_cpu_round8(IGRAD__DP_CARGS, size_t t, const uint32_t *idx, float *val, float *r)
{
    (void)mem;
    const igrad__plan_tensor_t *tp = &plan->t[t];
    int rel = step->rel[t], par = igrad__plan_parity(plan, step->cur_step);
    const igrad_select_spec_t *sp = &tp->spec[rel][par];
    int64_t blk = tp->blk_entries[rel][par];
    if (blk <= 0) blk = sp->count;
    double s2 = 0.0;
    for (int64_t f = 0; f < sp->count; f += blk) {
        int64_t n = sp->count - f < blk ? sp->count - f : blk;
        float s, inv; /* the block's scale (core/value8.h, as the CUDA select) */
        igrad__fp8_scales(igrad__fp8_block_amax(val + f, n), &s, &inv);
        for (int64_t j = f; j < f + n; j++) {
            float a = val[j], q = igrad__fp8_round(a, inv, s), d = a - q;
            val[j] = q;
            if (r) r[igrad__dp_cpu_sel_pos(sp, idx, j)] = d;
            s2 += (double)d * (double)d;
        }
    }
    return s2;
}

/* The error-feedback kernels of a tensor not sent, on plain arguments
 * (n entries; g zeroed in the same pass with `zero`). */

/* r = g + r */
static void ef_add(float *restrict r, float *restrict g, int64_t n, int zero)
{
    if (zero) {
        SIMD
        for (int64_t i = 0; i < n; i++) {
            r[i] = g[i] + r[i];
            g[i] = 0.0f;
        }
    } else {
        SIMD
        for (int64_t i = 0; i < n; i++) r[i] = g[i] + r[i];
    }
}

/* DGC's momentum correction: u = m*u + g, r = u + r */
static void ef_add_momentum(float *restrict r, float *restrict u, float *restrict g, float m,
                            int64_t n, int zero)
{
    SIMD
    for (int64_t i = 0; i < n; i++) {
        u[i] = m * u[i] + g[i];
        r[i] = u[i] + r[i];
    }
    if (zero) memset(g, 0, (size_t)n * sizeof *g);
}

/* The residual "drop" ablation: r = 0, and u = 0 with it (u may be NULL) */
static void ef_drop(float *restrict r, float *restrict u, float *restrict g, int64_t n, int zero)
{
    if (u) memset(u, 0, (size_t)n * sizeof *u);
    memset(r, 0, (size_t)n * sizeof *r);
    if (zero) memset(g, 0, (size_t)n * sizeof *g);
}

/* A tensor not sent this step: g added into its residual (with momentum
 * u = m*u + g, e = u + e) or, with residual "drop", dropped with its
 * velocity; with `zero` g is zeroed in the pass that reads it. The kernel
 * follows from the config and whether the tensor has a velocity.
 * step->tnorm[t] holds the check's sum of a^2 and becomes the residual's
 * (step->tdropped[t] the dropped mass). Shared by select_into and the
 * streamed step's commit (dp_cpu_stream.c). */
void igrad__dp_cpu_accumulate(IGRAD__DP_ARGS, size_t t, float *restrict g, int zero)
{
    float *r = mem->residual[t], *u = mem->velocity[t];
    int64_t n = plan->t[t].n;
    if (plan->kargs.residual_drop) {
        ef_drop(r, u, g, n, zero);
        step->tdropped[t] = step->tnorm[t];
        step->tnorm[t] = 0.0;
    } else if (u) {
        ef_add_momentum(r, u, g, plan->kargs.momentum, n, zero);
    } else {
        ef_add(r, g, n, zero);
    }
}

void igrad__dp_cpu_select_into(IGRAD__DP_ARGS, float *const *grads, int zero)
{
    int64_t T = (int64_t)plan->ntensors;
    int par = igrad__plan_parity(plan, step->cur_step);
    /* 16-bit gradients: the kernels run on the thread's F32 copy (whose
     * zeroing is then wasted) and the gradient itself is zeroed after */
    int zero16 = zero && plan->kargs.grad_dtype != IGRAD_DTYPE_F32;
    const igrad__dp_cpu_state_t *cs = mem->dp_state;
    const igrad_dtype_t vt16 = igrad__dp_cpu_round16_dtype(plan);
    const int fp8 = plan->kargs.value_dtype == IGRAD_DTYPE_F8_E4M3;
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
        igrad__plan_tensor_t *tp = &plan->t[t];
        float *restrict g = igrad__dp_cpu_grad(plan, step, mem, cs, grads, t, tid);
        float *restrict r = mem->residual[t];
        double a2 = step->tnorm[t]; /* sum of (g + e)^2 from the check */
        if (step->sent[t]) {
            igrad_selection_t sel = {.index = step->stage_idx + step->stage_off[t],
                                     .value = step->stage_val + step->stage_off[t]};
            const igrad_select_spec_t *sp = &tp->spec[step->rel[t]][par];
            double rounded = 0.0; /* sum of squares of rounding errors kept */
            if (igrad__dp_cpu_fused(plan, step, mem, t)) { /* pass 1 ran in the check */
                igrad__select_apply(g, r, sp, mem->ws[tid], &sel, cs->bound + cs->bound_off[t],
                                    zero, vt16, &rounded);
            } else {
                step->tstatus[t] = select_velocity(mem->velocity[t], r, g, plan->kargs.momentum,
                                                   vt16, sp, tp->name, mem->ws[tid], &sel, zero,
                                                   &rounded);
                if (step->tstatus[t] != IGRAD_OK) {
                    if (zero16) igrad__dp_cpu_zero_grad(plan, step, mem, grads, t);
                    continue;
                }
            }
            if (fp8) rounded = igrad__dp_cpu_round8(plan, step, mem, t, sel.index, sel.value, r);
            step->tsumsq[t] = sel.sumsq;
            /* the residual is a with the selected entries zeroed (plus their
             * rounding errors) */
            double kept = a2 - sel.sumsq > 0.0 ? a2 - sel.sumsq : 0.0;
            step->tnorm[t] = kept + rounded;
        } else {
            igrad__dp_cpu_accumulate(plan, step, mem, t, g, zero);
        }
        if (zero16) igrad__dp_cpu_zero_grad(plan, step, mem, grads, t);
    }
}
