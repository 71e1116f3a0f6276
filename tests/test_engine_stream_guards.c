/*
 * test_engine_stream_guards.c — the streamed step's argument checks and
 * what a gradient changed between igrad_engine_ready and
 * igrad_engine_close does (engine_stream.c), on one rank (self comm):
 *
 *  - open with a negative step is refused by name (IGRAD_E_INVALID), and
 *    the engine opens step 0 after it;
 *  - by default a change goes unnoticed, with the documented outcome:
 *    the result is that of the gradients as given to ready (the values
 *    were packed then), and the changed tensor's residual holds the
 *    changed gradient at every entry that was not selected (0 at the
 *    selected ones), computed here from the unchanged run's selection;
 *  - with IGRAD_DEBUG_STREAM=1 (read at an engine's first open) the same
 *    change fails the step by name (IGRAD_E_INVALID, the tensor named),
 *    residuals untouched, and an unchanged step after it succeeds.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "igrad.h"
#include "test_util.h"

#define CHANGED 1 /* model.layers.0.self_attn.q_proj.weight */

static igrad_layout_t *layout(void)
{
    return llama_test_layout(1, 96, 16, 32, IGRAD_DTYPE_F32);
}

/* Nonzero values in (-0.5, 0.5): every selected entry reads back nonzero. */
static void fill(grads_t *G, int64_t step)
{
    for (size_t t = 0; t < G->T; t++)
        for (int64_t i = 0; i < G->n[t]; i++) {
            uint64_t h = mix64(((uint64_t)step << 40) ^ ((uint64_t)t << 24) ^ (uint64_t)i);
            float v = (float)((double)(h >> 11) / 9007199254740992.0 - 0.5);
            G->g[t][i] = v != 0.0f ? v : 0.25f;
        }
}

static igrad_engine_t *engine(const igrad_layout_t *L, igrad_comm_t *self)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.density = 0.1;
    c.buckets = 2;
    c.threads = 1;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, self, &e));
    return e;
}

/* open, every tensor given to ready and the buckets' collectives run on
 * `self`, then `change` added to tensor CHANGED before close; close's
 * status. */
static igrad_status_t stream_step(igrad_engine_t *e, igrad_comm_t *self, int64_t step,
                                  grads_t *G, float change)
{
    assert_ok(igrad_engine_open(e, step));
    size_t *idx = calloc(G->T, sizeof *idx);
    assert_non_null(idx);
    for (size_t t = 0; t < G->T; t++) idx[t] = t;
    const igrad_bucket_t *b = NULL;
    size_t nb = 0;
    assert_ok(igrad_engine_ready(e, step, idx, G->T, G->g, &b, &nb));
    free(idx);
    for (size_t j = 0; j < nb; j++) {
        igrad_comm_request_t *req = NULL;
        assert_ok(b[j].kind == IGRAD_BUCKET_GATHER
                      ? igrad_comm_iallgather(self, b[j].send, b[j].send_nbytes, b[j].recv, &req)
                      : igrad_comm_iallreduce(self, b[j].recv, b[j].recv, b[j].count,
                                              IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM, &req));
        assert_ok(igrad_comm_wait(self, req));
    }
    for (int64_t i = 0; i < G->n[CHANGED]; i++) G->g[CHANGED][i] += change;
    return igrad_engine_close(e, step);
}

static void test_negative_step(void **state)
{
    (void)state;
    igrad_layout_t *L = layout();
    igrad_comm_t *self = NULL;
    assert_ok(igrad_comm_create_self(&self));
    igrad_engine_t *e = engine(L, self);
    assert_status(igrad_engine_open(e, -1), IGRAD_E_INVALID);
    assert_error_has("igrad_engine_open: step -1 is negative");
    assert_status(igrad_engine_open(e, INT64_MIN), IGRAD_E_INVALID);
    grads_t G = grads_new(L);
    fill(&G, 0);
    assert_ok(stream_step(e, self, 0, &G, 0.0f));
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(self);
    igrad_layout_free(L);
}

static void test_change_unnoticed_by_default(void **state)
{
    (void)state;
    assert_int_equal(unsetenv("IGRAD_DEBUG_STREAM"), 0);
    igrad_layout_t *L = layout();
    igrad_comm_t *self = NULL;
    assert_ok(igrad_comm_create_self(&self));
    igrad_engine_t *a = engine(L, self), *b = engine(L, self);
    grads_t A = grads_new(L), B = grads_new(L), given = grads_new(L);
    fill(&A, 0);
    fill(&B, 0);
    fill(&given, 0);
    assert_ok(stream_step(a, self, 0, &A, 0.0f));
    assert_ok(stream_step(b, self, 0, &B, 0.375f)); /* close does not notice */
    for (size_t t = 0; t < A.T; t++)
        assert_memory_equal(A.g[t], B.g[t], (size_t)A.n[t] * sizeof(float));
    const float *ra = igrad_engine_residual(a, CHANGED), *rb = igrad_engine_residual(b, CHANGED);
    assert_non_null(ra);
    assert_non_null(rb);
    int64_t selected = 0;
    for (int64_t i = 0; i < A.n[CHANGED]; i++) {
        int sel = A.g[CHANGED][i] != 0.0f; /* one rank: the result is the sent value */
        selected += sel;
        float want_a = sel ? 0.0f : given.g[CHANGED][i];
        float want_b = sel ? 0.0f : given.g[CHANGED][i] + 0.375f;
        assert_true(ra[i] == want_a);
        assert_true(rb[i] == want_b);
    }
    assert_true(selected > 0 && selected < A.n[CHANGED]);
    for (size_t t = 0; t < A.T; t++) {
        if (t == CHANGED) continue;
        const float *x = igrad_engine_residual(a, t), *y = igrad_engine_residual(b, t);
        if (x && y) assert_memory_equal(x, y, (size_t)A.n[t] * sizeof(float));
    }
    grads_free(&A);
    grads_free(&B);
    grads_free(&given);
    igrad_engine_free(a);
    igrad_engine_free(b);
    igrad_comm_free(self);
    igrad_layout_free(L);
}

static void test_change_detected_with_debug_env(void **state)
{
    (void)state;
    assert_int_equal(setenv("IGRAD_DEBUG_STREAM", "1", 1), 0);
    igrad_layout_t *L = layout();
    igrad_comm_t *self = NULL;
    assert_ok(igrad_comm_create_self(&self));
    igrad_engine_t *e = engine(L, self);
    grads_t G = grads_new(L);
    fill(&G, 0);
    assert_ok(stream_step(e, self, 0, &G, 0.0f)); /* unchanged: fine with the check */
    size_t n = (size_t)G.n[CHANGED];
    float *before = malloc(n * sizeof *before);
    assert_non_null(before);
    memcpy(before, igrad_engine_residual(e, CHANGED), n * sizeof *before);
    fill(&G, 1);
    assert_status(stream_step(e, self, 1, &G, 0.375f), IGRAD_E_INVALID);
    assert_error_has("step 1: the gradient of model.layers.0.self_attn.q_proj.weight changed "
                     "between igrad_engine_ready and igrad_engine_close");
    assert_memory_equal(before, igrad_engine_residual(e, CHANGED), n * sizeof *before);
    fill(&G, 1);
    assert_ok(stream_step(e, self, 1, &G, 0.0f)); /* the skipped step again, unchanged */
    assert_int_equal(unsetenv("IGRAD_DEBUG_STREAM"), 0);
    free(before);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(self);
    igrad_layout_free(L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_negative_step),
        cmocka_unit_test(test_change_unnoticed_by_default),
        cmocka_unit_test(test_change_detected_with_debug_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
