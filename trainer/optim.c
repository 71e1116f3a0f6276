/*
 * optim.c — AdamW, the warm-up + cosine learning-rate schedule, global-norm
 * clipping and gradient scaling for the reference trainer (see optim.h for
 * the rules). Element-wise loops are OpenMP-parallel; the one reduction
 * (the gradient norm) sums fixed blocks and then the blocks in order, so it
 * does not depend on the thread count. Not here: state files
 * (checkpoint.c).
 */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

optim_config_t optim_config_default(void)
{
    optim_config_t c = {
        .lr = 3e-4,
        .min_lr = 3e-5,
        .warmup_steps = 0,
        .total_steps = 0,
        .beta1 = 0.9,
        .beta2 = 0.95,
        .eps = 1e-8,
        .weight_decay = 0.1,
        .grad_clip = 1.0,
    };
    return c;
}

static igrad_status_t validate(const optim_config_t *c)
{
    if (!(c->lr >= 0.0) || !isfinite(c->lr) || !(c->min_lr >= 0.0) || !isfinite(c->min_lr))
        return trainer_fail(IGRAD_E_INVALID, "optimizer: lr %g and min_lr %g must be >= 0",
                            c->lr, c->min_lr);
    if (!(c->beta1 >= 0.0 && c->beta1 < 1.0) || !(c->beta2 >= 0.0 && c->beta2 < 1.0))
        return trainer_fail(IGRAD_E_INVALID, "optimizer: betas (%g, %g) must be in [0, 1)",
                            c->beta1, c->beta2);
    if (!(c->eps > 0.0) || !(c->weight_decay >= 0.0) || c->warmup_steps < 0 ||
        c->total_steps < 0 || isnan(c->grad_clip))
        return trainer_fail(IGRAD_E_INVALID, "optimizer: eps %g must be > 0, weight decay %g "
                            ">= 0, warm-up %lld and total %lld steps >= 0", c->eps,
                            c->weight_decay, (long long)c->warmup_steps,
                            (long long)c->total_steps);
    return IGRAD_OK;
}

igrad_status_t optim_create(const optim_config_t *cfg, int64_t count, optim_t **out)
{
    *out = NULL;
    igrad_status_t st = validate(cfg);
    if (st != IGRAD_OK) return st;
    if (count < 1)
        return trainer_fail(IGRAD_E_INVALID, "optimizer: %lld parameters", (long long)count);
    optim_t *o = calloc(1, sizeof *o);
    if (o) {
        o->m = calloc((size_t)count, sizeof(float));
        o->v = calloc((size_t)count, sizeof(float));
        o->decay = malloc((size_t)count);
    }
    if (!o || !o->m || !o->v || !o->decay) {
        optim_free(o);
        return trainer_fail(IGRAD_E_NOMEM, "optimizer: out of memory for %lld parameters",
                            (long long)count);
    }
    memset(o->decay, 1, (size_t)count);
    o->config = *cfg;
    o->count = count;
    *out = o;
    return IGRAD_OK;
}

igrad_status_t optim_create_for_model(const optim_config_t *cfg, const model_t *m,
                                      optim_t **out)
{
    igrad_status_t st = optim_create(cfg, m->num_params, out);
    if (st != IGRAD_OK) return st;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].ndim == 1)
            optim_set_decay(*out, m->tensors[i].offset, m->tensors[i].count, 0);
    return IGRAD_OK;
}

void optim_free(optim_t *opt)
{
    if (!opt) return;
    free(opt->m);
    free(opt->v);
    free(opt->decay);
    free(opt);
}

igrad_status_t optim_set_decay(optim_t *opt, int64_t offset, int64_t count, int decay)
{
    if (offset < 0 || count < 0 || offset > opt->count - count)
        return trainer_fail(IGRAD_E_INVALID, "optimizer: range [%lld, +%lld) outside %lld "
                            "parameters", (long long)offset, (long long)count,
                            (long long)opt->count);
    memset(opt->decay + offset, decay ? 1 : 0, (size_t)count);
    return IGRAD_OK;
}

double optim_lr(const optim_config_t *c, int64_t step)
{
    if (step < c->warmup_steps) return c->lr * (double)(step + 1) / (double)c->warmup_steps;
    if (c->total_steps <= c->warmup_steps) return c->lr;
    if (step >= c->total_steps) return c->min_lr;
    double progress = (double)(step - c->warmup_steps) /
                      (double)(c->total_steps - c->warmup_steps);
    double cosine = 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
    return c->min_lr + (c->lr - c->min_lr) * cosine;
}

#define NORM_BLOCK 4096

double optim_clip_grad_norm(float *grads, int64_t count, double max_norm)
{
    int64_t nblocks = (count + NORM_BLOCK - 1) / NORM_BLOCK;
    double *partial = malloc((size_t)(nblocks > 0 ? nblocks : 1) * sizeof(double));
    double sumsq = 0.0;
    if (partial) {
#pragma omp parallel for
        for (int64_t b = 0; b < nblocks; b++) {
            int64_t end = (b + 1) * NORM_BLOCK < count ? (b + 1) * NORM_BLOCK : count;
            double s = 0.0;
            for (int64_t i = b * NORM_BLOCK; i < end; i++) s += (double)grads[i] * grads[i];
            partial[b] = s;
        }
        for (int64_t b = 0; b < nblocks; b++) sumsq += partial[b];
        free(partial);
    } else {
        for (int64_t i = 0; i < count; i++) sumsq += (double)grads[i] * grads[i];
    }
    double norm = sqrt(sumsq);
    if (isfinite(norm) && max_norm > 0.0 && norm > max_norm)
        optim_scale(grads, count, (float)(max_norm / norm));
    return norm;
}

void optim_scale(float *grads, int64_t count, float scale)
{
#pragma omp parallel for
    for (int64_t i = 0; i < count; i++) grads[i] *= scale;
}

/* The coefficients of one AdamW step at opt->step + 1 (optim_update). */
typedef struct adamw_coeffs {
    float step_size, inv_sqrt_bc2, decay, b1, b2, eps;
} adamw_coeffs_t;

static adamw_coeffs_t adamw_coeffs(const optim_t *opt, double lr)
{
    const optim_config_t *c = &opt->config;
    double t = (double)(opt->step + 1);
    adamw_coeffs_t k = {
        .step_size = (float)(lr / (1.0 - pow(c->beta1, t))),
        .inv_sqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(c->beta2, t))),
        .decay = (float)(1.0 - lr * c->weight_decay),
        .b1 = (float)c->beta1,
        .b2 = (float)c->beta2,
        .eps = (float)c->eps,
    };
    return k;
}

/* Element i's new parameter value; updates its moments. The one place the
 * AdamW rule is written (optim_update and optim_update_delta share it). */
static inline float adamw_element(const adamw_coeffs_t *k, optim_t *opt, int64_t i, float p,
                                  float g)
{
    if (opt->decay[i]) p *= k->decay;
    float mi = k->b1 * opt->m[i] + (1.0f - k->b1) * g;
    float vi = k->b2 * opt->v[i] + (1.0f - k->b2) * g * g;
    opt->m[i] = mi;
    opt->v[i] = vi;
    return p - k->step_size * mi / (sqrtf(vi) * k->inv_sqrt_bc2 + k->eps);
}

void optim_update(optim_t *opt, float *params, const float *grads, double lr)
{
    adamw_coeffs_t k = adamw_coeffs(opt, lr);
#pragma omp parallel for
    for (int64_t i = 0; i < opt->count; i++) params[i] = adamw_element(&k, opt, i, params[i], grads[i]);
    opt->step++;
}

void optim_update_delta(optim_t *opt, const float *params, const float *grads, double lr,
                        float *delta)
{
    adamw_coeffs_t k = adamw_coeffs(opt, lr);
#pragma omp parallel for
    for (int64_t i = 0; i < opt->count; i++) {
        float p = params[i];
        delta[i] = adamw_element(&k, opt, i, p, grads[i]) - p;
    }
    opt->step++;
}
