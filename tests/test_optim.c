/*
 * test_optim.c — the trainer's optimizer against references written here:
 * AdamW updates against the torch.optim.AdamW formulas evaluated in double
 * (decoupled decay applied only where the mask says, bias correction), the
 * warm-up + cosine schedule at its landmarks, global-norm clipping against
 * a direct sum, gradient scaling, the decay policy for a model (2-D tensors
 * decay, 1-D norm weights do not) and refused configurations; and the
 * update-returning step (optim_update_delta, --ef-on update) against
 * optim_update itself, bit for bit.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model.h"
#include "optim.h"

static void assert_close(double got, double want, double rtol, double atol, const char *what)
{
    if (!(fabs(got - want) <= rtol * fabs(want) + atol))
        fail_msg("%s: got %.12g, want %.12g", what, got, want);
}

static void test_adamw_matches_reference(void **state)
{
    (void)state;
    enum { N = 37, STEPS = 6 };
    optim_config_t c = optim_config_default();
    c.beta1 = 0.8;
    c.beta2 = 0.99;
    c.eps = 1e-6;
    c.weight_decay = 0.3;
    optim_t *o = NULL;
    assert_int_equal(optim_create(&c, N, &o), IGRAD_OK);
    assert_int_equal(optim_set_decay(o, 10, 5, 0), IGRAD_OK); /* [10, 15) no decay */
    float p[N], g[N];
    double rp[N], rm[N] = {0}, rv[N] = {0};
    for (int i = 0; i < N; i++) rp[i] = p[i] = (float)(0.5 * sin(i + 1.0));
    for (int s = 0; s < STEPS; s++) {
        double lr = 1e-2 * (s + 1);
        for (int i = 0; i < N; i++) g[i] = (float)(cos(3.0 * i + s) * (i % 3 ? 1.0 : 1e-3));
        optim_update(o, p, g, lr);
        /* torch.optim.AdamW, single tensor, in double */
        int t = s + 1;
        double bc1 = 1.0 - pow(c.beta1, t), bc2 = 1.0 - pow(c.beta2, t);
        for (int i = 0; i < N; i++) {
            int decay = !(i >= 10 && i < 15);
            if (decay) rp[i] *= 1.0 - lr * c.weight_decay;
            rm[i] = c.beta1 * rm[i] + (1.0 - c.beta1) * g[i];
            rv[i] = c.beta2 * rv[i] + (1.0 - c.beta2) * (double)g[i] * g[i];
            rp[i] -= lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + c.eps);
        }
    }
    assert_int_equal(o->step, STEPS);
    for (int i = 0; i < N; i++) {
        char what[32];
        snprintf(what, sizeof what, "param %d", i);
        assert_close(p[i], rp[i], 1e-5, 1e-7, what);
        assert_close(o->m[i], rm[i], 1e-5, 1e-9, "exp_avg");
        assert_close(o->v[i], rv[i], 1e-5, 1e-12, "exp_avg_sq");
    }
    optim_free(o);
}

static void test_schedule(void **state)
{
    (void)state;
    optim_config_t c = optim_config_default();
    c.lr = 1e-3;
    c.min_lr = 1e-4;
    c.warmup_steps = 10;
    c.total_steps = 110;
    assert_close(optim_lr(&c, 0), 1e-4, 1e-12, 0, "first warm-up step");
    assert_close(optim_lr(&c, 4), 5e-4, 1e-12, 0, "mid warm-up");
    assert_close(optim_lr(&c, 9), 1e-3, 1e-12, 0, "last warm-up step");
    assert_close(optim_lr(&c, 10), 1e-3, 1e-12, 0, "peak");
    assert_close(optim_lr(&c, 60), 5.5e-4, 1e-12, 0, "cosine midpoint");
    assert_close(optim_lr(&c, 35), 1e-4 + 9e-4 * 0.5 * (1 + cos(0.785398163397448309616)), 1e-12, 0,
                 "cosine quarter");
    assert_close(optim_lr(&c, 110), 1e-4, 1e-12, 0, "end");
    assert_close(optim_lr(&c, 1000), 1e-4, 1e-12, 0, "after the end");
    for (int64_t s = 11; s < 110; s++)
        if (!(optim_lr(&c, s) < optim_lr(&c, s - 1)))
            fail_msg("lr not decreasing at step %lld", (long long)s);
    c.total_steps = 0; /* no decay: constant after warm-up */
    assert_close(optim_lr(&c, 500), 1e-3, 1e-12, 0, "constant");
}

static void test_clip_and_scale(void **state)
{
    (void)state;
    enum { N = 10000 };
    float *g = malloc(N * sizeof *g);
    assert_non_null(g);
    double sumsq = 0.0;
    for (int i = 0; i < N; i++) {
        g[i] = (float)sin(0.37 * i);
        sumsq += (double)g[i] * g[i];
    }
    double norm = optim_clip_grad_norm(g, N, 1e9); /* below the limit: unchanged */
    assert_close(norm, sqrt(sumsq), 1e-12, 0, "norm");
    assert_true(g[1] == (float)sin(0.37));
    norm = optim_clip_grad_norm(g, N, 2.0);
    assert_close(norm, sqrt(sumsq), 1e-12, 0, "norm before clipping");
    double after = 0.0;
    for (int i = 0; i < N; i++) after += (double)g[i] * g[i];
    assert_close(sqrt(after), 2.0, 1e-6, 0, "norm after clipping");
    optim_scale(g, N, 0.5f);
    assert_close(optim_clip_grad_norm(g, N, 0.0), 1.0, 1e-6, 0, "scaled norm");
    g[17] = NAN;
    float before = g[3];
    assert_true(isnan(optim_clip_grad_norm(g, N, 1e-3)));
    assert_true(g[3] == before); /* nothing scaled */
    free(g);
}

/* With zero gradients AdamW only decays: matrices shrink by 1 - lr*wd,
 * norm weights stay. */
static void test_model_decay_policy(void **state)
{
    (void)state;
    model_config_t mc;
    assert_int_equal(model_config_preset("tiny", &mc), IGRAD_OK);
    mc.tie_embeddings = 1;
    model_t *m = NULL;
    assert_int_equal(model_create(&mc, &m), IGRAD_OK);
    model_init_random(m, 3, 0.02f);
    float *before = malloc((size_t)m->num_params * sizeof(float));
    assert_non_null(before);
    memcpy(before, m->params, (size_t)m->num_params * sizeof(float));
    optim_config_t c = optim_config_default();
    c.weight_decay = 0.5;
    optim_t *o = NULL;
    assert_int_equal(optim_create_for_model(&c, m, &o), IGRAD_OK);
    model_zero_grad(m);
    optim_update(o, m->params, m->grads, 0.1);
    for (int t = 0; t < m->n_tensors; t++) {
        const model_tensor_t *tt = &m->tensors[t];
        float factor = tt->ndim == 2 ? (float)(1.0 - 0.1 * 0.5) : 1.0f;
        for (int64_t j = 0; j < tt->count; j++) {
            float want = before[tt->offset + j] * factor;
            if (m->params[tt->offset + j] != want)
                fail_msg("%s[%lld]: %.9g, want %.9g", tt->name, (long long)j,
                         m->params[tt->offset + j], want);
        }
    }
    free(before);
    optim_free(o);
    model_free(m);
}

static void test_refused(void **state)
{
    (void)state;
    optim_t *o = NULL;
    optim_config_t c = optim_config_default();
    c.beta2 = 1.0;
    assert_int_equal(optim_create(&c, 10, &o), IGRAD_E_INVALID);
    assert_non_null(strstr(trainer_last_error(), "betas"));
    c = optim_config_default();
    c.eps = 0.0;
    assert_int_equal(optim_create(&c, 10, &o), IGRAD_E_INVALID);
    c = optim_config_default();
    assert_int_equal(optim_create(&c, 0, &o), IGRAD_E_INVALID);
    assert_null(o);
    assert_int_equal(optim_create(&c, 10, &o), IGRAD_OK);
    assert_int_equal(optim_set_decay(o, 5, 6, 0), IGRAD_E_INVALID);
    assert_int_equal(optim_set_decay(o, -1, 2, 0), IGRAD_E_INVALID);
    optim_free(o);
    optim_free(NULL);
}

/* optim_update_delta against optim_update on a twin optimizer: the
 * update is exactly (optim_update's new params) - (old params), moments
 * and step are bit-equal, in place (delta == grads) too; old + delta gives
 * optim_update's params bit for bit wherever the subtraction is exact (new
 * within a factor 2 of old, same sign: most entries here), else within one
 * ulp. */
static void test_update_delta_matches_update(void **state)
{
    (void)state;
    enum { N = 53, STEPS = 5 };
    optim_config_t c = optim_config_default();
    c.weight_decay = 0.2;
    optim_t *a = NULL, *b = NULL;
    assert_int_equal(optim_create(&c, N, &a), IGRAD_OK);
    assert_int_equal(optim_create(&c, N, &b), IGRAD_OK);
    assert_int_equal(optim_set_decay(a, 20, 9, 0), IGRAD_OK);
    assert_int_equal(optim_set_decay(b, 20, 9, 0), IGRAD_OK);
    float pa[N], pb[N], g[N], d[N];
    int exact_entries = 0;
    for (int i = 0; i < N; i++) pa[i] = pb[i] = (float)(0.5 * sin(i + 1.0));
    for (int s = 0; s < STEPS; s++) {
        double lr = 2e-3 * (s + 1);
        for (int i = 0; i < N; i++) g[i] = (float)(cos(5.0 * i + s) * (i % 4 ? 1.0 : 1e-4));
        float old[N];
        memcpy(old, pb, sizeof old);
        optim_update(a, pa, g, lr);
        if (s % 2) { /* in place: the gradient buffer receives the update */
            memcpy(d, g, sizeof d);
            optim_update_delta(b, pb, d, lr, d);
        } else {
            optim_update_delta(b, pb, g, lr, d);
        }
        assert_memory_equal(pb, old, sizeof old); /* params untouched */
        assert_int_equal(a->step, b->step);
        assert_memory_equal(a->m, b->m, sizeof(float) * N);
        assert_memory_equal(a->v, b->v, sizeof(float) * N);
        for (int i = 0; i < N; i++) {
            float want = pa[i] - old[i];
            if (memcmp(&d[i], &want, sizeof want))
                fail_msg("step %d entry %d: delta %.9g, optim_update moved by %.9g", s, i, d[i],
                         want);
            pb[i] = old[i] + d[i];
            int sterbenz = (old[i] > 0) == (pa[i] > 0) && fabsf(pa[i]) <= 2.0f * fabsf(old[i]) &&
                           fabsf(old[i]) <= 2.0f * fabsf(pa[i]);
            if (sterbenz) {
                exact_entries++;
                if (memcmp(&pb[i], &pa[i], sizeof(float)))
                    fail_msg("step %d entry %d: old + delta %.9g != optim_update's %.9g", s, i,
                             pb[i], pa[i]);
            } else {
                assert_true(fabsf(pb[i] - pa[i]) <= nextafterf(fabsf(pa[i]), INFINITY) -
                                                     fabsf(pa[i]));
                pb[i] = pa[i]; /* continue both from the same point */
            }
        }
    }
    assert_true(exact_entries > N * STEPS * 9 / 10);
    optim_free(a);
    optim_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_matches_reference),
        cmocka_unit_test(test_update_delta_matches_update),
        cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_clip_and_scale),
        cmocka_unit_test(test_model_decay_policy),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
