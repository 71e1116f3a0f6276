/*
 * dp_cpu_select.c — the CPU data plane's select_into stage: error
 * feedback fused with selection (igrad__select_ef, select.c) for the
 * tensors sent this step, written into the engine's staged selection, and
 * the accumulate-or-drop of the others, one tensor per OpenMP task (so
 * every selection inside is single-threaded). With the remedies on
 * (architecture.md §5.5a) momentum correction, factor masking and residual
 * decay run here too. With `zero` each gradient is zeroed in the pass that
 * reads it. With 16-bit wire values (config.value_dtype BF16 or F16)
 * each sent value is rounded here, its rounding error kept in the
 * residual (architecture.md §5.2). Which tensors are sent and their specs
 * are the control plane's (engine.c, schedule.c).
 */
#include "dp_cpu.h"
#include "select_internal.h"
#include "value16.h"

#include <math.h>
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

/* One sent value v as the 16-bit wire carries it: round-to-nearest-even,
 * and a finite value that would round to Inf (F16: |v| >= 65520; BF16:
 * within half a step of FLT_MAX) clamped to the largest finite value
 * (65504; 0x1.fep127). Returns the rounded value (exactly representable
 * in dt). */
static inline float round16(igrad_dtype_t dt, float v)
{
    float q = igrad__from16(dt, igrad__to16(dt, v));
    if (isinf(q)) q = v > 0.0f ? igrad__max16(dt) : -igrad__max16(dt);
    return q;
}

/* 16-bit wire values: every selected value v becomes round16(v) and v -
 * round16(v) goes back into its residual entry (which the selection left
 * at 0), so that nothing is lost: sent + residual = a. v - q is exact
 * (Sterbenz) except after an F16 clamp of |v| >= 2^29, where it is the
 * nearest float (a relative error below 2^-24 of v). Returns the sum of
 * squares of what went back. */
static double round_sent(igrad_dtype_t dt, float *restrict r, const igrad_select_spec_t *sp,
                         const igrad_selection_t *sel)
{
    double s = 0.0;
    float *val = sel->value;
    int64_t per = sp->row_wise ? sp->per_row : sp->count;
    int64_t rows = sp->row_wise ? sp->rows : 1, cols = sp->row_wise ? sp->cols : sp->n;
    for (int64_t row = 0; row < rows; row++)
        for (int64_t j = 0; j < per; j++) {
            int64_t k = row * per + j;
            /* a dense spec (count == n) keeps every entry in place */
            int64_t i = sp->count == sp->n ? k : row * cols + (int64_t)sel->index[k];
            float q = round16(dt, val[k]);
            float d = val[k] - q;
            r[i] += d;
            val[k] = q;
            s += (double)d * (double)d;
        }
    return s;
}

/* One sent tensor with the remedies on (momentum correction, masking,
 * residual decay); the plain case calls igrad__select_ef directly. The
 * selection reads u = m*u + g in place of g. */
static igrad_status_t select_remedies(const igrad_engine_t *e, igrad__engine_tensor_t *tp,
                                      float *restrict g, const igrad_select_spec_t *sp,
                                      igrad_select_ws_t *ws, igrad_selection_t *sel, int zero,
                                      double *rounded)
{
    float *restrict u = tp->velocity, *restrict r = tp->residual;
    int64_t n = tp->n;
    if (u) {
        float m = (float)e->cfg.momentum;
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
        IGRAD_CHECK(igrad_select_ef(u, r, sp, tp->name, ws, sel));
    } else {
        IGRAD_CHECK(igrad__select_ef(g, r, sp, tp->name, ws, sel, zero));
    }
    if (u && e->cfg.momentum_masking) mask_sent(u, sp, sel->index);
    if (e->cfg.value_dtype != IGRAD_DTYPE_F32)
        *rounded = round_sent(e->cfg.value_dtype, r, sp, sel);
    if (e->cfg.residual_decay < 1.0) {
        float d = (float)e->cfg.residual_decay;
        SIMD
        for (int64_t i = 0; i < n; i++) r[i] = d * r[i];
    }
    return IGRAD_OK;
}

void igrad__dp_cpu_select_into(igrad_engine_t *e, float *const *grads, int zero)
{
    int64_t T = (int64_t)e->ntensors;
    int drop = e->cfg.residual == IGRAD_RESIDUAL_DROP;
    int remedies = e->cfg.momentum > 0.0 || e->cfg.residual_decay < 1.0;
    float m = (float)e->cfg.momentum, d = (float)e->cfg.residual_decay;
    double d2 = (double)d * (double)d;
    int par = igrad__step_parity(e, e->cur_step);
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(e->nthreads)
#endif
    for (int64_t w = 0; w < T; w++) {
#ifdef _OPENMP
        int tid = omp_get_thread_num();
#else
        int tid = 0;
#endif
        uint32_t t = e->work[w];
        igrad__engine_tensor_t *tp = &e->t[t];
        float *restrict g = grads[t];
        float *restrict r = tp->residual;
        int64_t n = tp->n;
        double a2 = e->tnorm[t]; /* sum of (g + e)^2 from the check */
        if (e->sent[t]) {
            igrad_selection_t sel = {.index = e->stage_idx + e->stage_off[t],
                                     .value = e->stage_val + e->stage_off[t]};
            const igrad_select_spec_t *sp = &tp->spec[e->rel[t]][par];
            double rounded = 0.0; /* sum of squares of rounding errors kept */
            if (remedies) {
                e->tstatus[t] = select_remedies(e, tp, g, sp, e->ws[tid], &sel, zero, &rounded);
            } else {
                e->tstatus[t] = igrad__select_ef(g, r, sp, tp->name, e->ws[tid], &sel, zero);
                if (e->tstatus[t] == IGRAD_OK && e->cfg.value_dtype != IGRAD_DTYPE_F32)
                    rounded = round_sent(e->cfg.value_dtype, r, sp, &sel);
            }
            e->tsumsq[t] = sel.sumsq;
            /* the residual is a with the selected entries zeroed (plus their
             * rounding errors, then decayed) */
            double kept = a2 - sel.sumsq > 0.0 ? a2 - sel.sumsq : 0.0;
            e->tnorm[t] = (kept + rounded) * (remedies ? d2 : 1.0);
        } else if (!drop && !remedies) {
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
        } else if (!drop) {
            float *restrict u = tp->velocity;
            if (u) {
                SIMD
                for (int64_t i = 0; i < n; i++) {
                    u[i] = m * u[i] + g[i];
                    r[i] = d * (u[i] + r[i]);
                }
            } else {
                SIMD
                for (int64_t i = 0; i < n; i++) r[i] = d * (g[i] + r[i]);
            }
            if (zero) memset(g, 0, (size_t)n * sizeof *g);
            e->tnorm[t] = a2 * d2;
        } else {
            /* the ablation drops the velocity with the residual */
            if (tp->velocity) memset(tp->velocity, 0, (size_t)n * sizeof *tp->velocity);
            memset(r, 0, (size_t)n * sizeof *r);
            if (zero) memset(g, 0, (size_t)n * sizeof *g);
            e->tdropped[t] = a2;
            e->tnorm[t] = 0.0;
        }
    }
}
