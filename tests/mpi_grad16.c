/*
 * mpi_grad16.c — 16-bit gradients in place (config.grad_dtype BF16, F16)
 * over MPI (CTest runs it with -np 2 and -np 4). Each rank runs two
 * engines on the same comm size: one given BF16/F16 gradients, one given
 * their float32 upcast (exact). After every step the 16-bit result must be
 * the F32 engine's result rounded once to nearest even, bit for bit, and
 * the residuals, velocities and the step's payload and entry counts equal,
 * over several steps of dense, topk_sync, adtopk_sync (gather and reduce
 * buckets, momentum, a start_iter warm-up) and ig (online profiling, then
 * deferral), with F32 and BF16 wire values; F16 with gradients near the
 * F16 range. A NaN in one rank's BF16 gradient skips the step on every
 * rank, as it does the F32 engine's. An F16 engine refuses
 * igrad_engine_open.
 *
 * Checks only count failures, so every rank reaches every collective.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "igrad.h"

#include "mpi_util.h"

static igrad_layout_t *make_layout(void)
{
    igrad_layout_t *L = NULL;
    REQUIRE(igrad_layout_create(&L) == IGRAD_OK);
    int64_t a[2] = {40, 96}, b[2] = {96, 40}, c[1] = {3000}, d[1] = {70000}, f[2] = {30, 8};
    REQUIRE(igrad_layout_add(L, "model.layers.0.mlp.up_proj.weight", IGRAD_DTYPE_BF16, 2, a) ==
            IGRAD_OK);
    REQUIRE(igrad_layout_add(L, "model.layers.0.mlp.down_proj.weight", IGRAD_DTYPE_BF16, 2, b) ==
            IGRAD_OK);
    REQUIRE(igrad_layout_add(L, "model.layers.0.self_attn.q_proj.weight", IGRAD_DTYPE_BF16, 2,
                             f) == IGRAD_OK);
    REQUIRE(igrad_layout_add(L, "flat.bias", IGRAD_DTYPE_BF16, 1, c) == IGRAD_OK);
    REQUIRE(igrad_layout_add(L, "wide.weight", IGRAD_DTYPE_BF16, 1, d) == IGRAD_OK);
    return L;
}

/* near = 1: F16 values up to ~6e4 (near its largest, 65504) and subnormals */
static float grad_value(int rank, int step, size_t t, int64_t i, int near)
{
    uint64_t h = mix64(((uint64_t)rank << 56) ^ ((uint64_t)step << 40) ^ ((uint64_t)t << 32) ^
                       (uint64_t)i);
    double u = (double)(h >> 11) * 0x1p-53 - 0.5;
    if (near && h % 16 == 0) return (float)(u * 1e-6);
    if (near && h % 16 == 1) return (float)(u * 1.2e5);
    return (float)(u * (1.0 + (double)(h % 5)));
}

static uint16_t to16(igrad_dtype_t dt, float v)
{
    uint16_t h = 0;
    REQUIRE(igrad_convert(&v, IGRAD_DTYPE_F32, &h, dt, 1) == IGRAD_OK);
    return h;
}

static float from16(igrad_dtype_t dt, uint16_t h)
{
    float v = 0.0f;
    REQUIRE(igrad_convert(&h, dt, &v, IGRAD_DTYPE_F32, 1) == IGRAD_OK);
    return v;
}

static int same_floats(const float *a, const float *b, int64_t n)
{
    if (!a || !b) return a == b;
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* Steps `steps` of both engines; `nan_step` >= 0 puts a NaN in the last
 * rank's gradient of tensor 1 at that step. */
static void run(igrad_config_t c, igrad_dtype_t gd, const char *what, int steps, int near,
                int nan_step)
{
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL, *comm32 = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    REQUIRE(igrad_comm_create_mpi(NULL, &comm32) == IGRAD_OK);
    igrad_engine_t *e = NULL, *ref = NULL;
    igrad_config_t c16 = c;
    c16.grad_dtype = gd;
    REQUIRE(igrad_engine_create(L, NULL, &c16, comm, &e) == IGRAD_OK);
    REQUIRE(igrad_engine_create(L, NULL, &c, comm32, &ref) == IGRAD_OK);
    size_t T = igrad_layout_count(L);
    uint16_t **h = calloc(T, sizeof *h);
    float **g = calloc(T, sizeof *g), **hp = calloc(T, sizeof *hp);
    int64_t *n = calloc(T, sizeof *n);
    REQUIRE(h && g && hp && n);
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
        n[t] = ti.count;
        h[t] = malloc((size_t)n[t] * sizeof(uint16_t));
        g[t] = malloc((size_t)n[t] * sizeof(float));
        REQUIRE(h[t] && g[t]);
        hp[t] = (float *)(void *)h[t]; /* the API's grads type; the engine reads codes */
    }
    for (int step = 0; step < steps; step++) {
        for (size_t t = 0; t < T; t++)
            for (int64_t i = 0; i < n[t]; i++) {
                h[t][i] = to16(gd, grad_value(me, step, t, i, near));
                g[t][i] = from16(gd, h[t][i]);
            }
        int nan_here = step == nan_step;
        if (nan_here && me == np - 1) {
            h[1][5] = to16(gd, NAN);
            g[1][5] = NAN;
        }
        igrad_status_t want = nan_here ? IGRAD_E_NONFINITE : IGRAD_OK;
        CHECK_STATUS(igrad_engine_sync(e, step, hp), want);
        CHECK_STATUS(igrad_engine_sync(ref, step, g), want);
        int bad_g = 0, bad_r = 0, bad_u = 0;
        for (size_t t = 0; t < T; t++) {
            for (int64_t i = 0; i < n[t]; i++)
                if (h[t][i] != to16(gd, g[t][i])) bad_g++;
            if (!same_floats(igrad_engine_residual(e, t), igrad_engine_residual(ref, t), n[t]))
                bad_r++;
            if (!same_floats(igrad_engine_velocity(e, t), igrad_engine_velocity(ref, t), n[t]))
                bad_u++;
        }
        igrad_step_stats_t s16, s32;
        CHECK_OK(igrad_engine_last_stats(e, &s16));
        CHECK_OK(igrad_engine_last_stats(ref, &s32));
        CHECK(bad_g == 0, "%s step %d: %d gradient entries differ from the F32 result rounded",
              what, step, bad_g);
        CHECK(bad_r == 0 && bad_u == 0, "%s step %d: %d residuals, %d velocities differ", what,
              step, bad_r, bad_u);
        CHECK(s16.payload_nbytes == s32.payload_nbytes && s16.entries_sent == s32.entries_sent &&
                  s16.skipped == s32.skipped && s16.skipped == nan_here &&
                  s16.residual_norm == s32.residual_norm,
              "%s step %d: stats differ (payload %lld vs %lld, skipped %d vs %d)", what, step,
              (long long)s16.payload_nbytes, (long long)s32.payload_nbytes, s16.skipped,
              s32.skipped);
    }
    if (gd == IGRAD_DTYPE_F16)
        CHECK_STATUS(igrad_engine_open(e, steps), IGRAD_E_UNSUPPORTED);
    for (size_t t = 0; t < T; t++) {
        free(h[t]);
        free(g[t]);
    }
    free(h);
    free(g);
    free(hp);
    free(n);
    igrad_engine_free(e);
    igrad_engine_free(ref);
    igrad_comm_free(comm);
    igrad_comm_free(comm32);
    igrad_layout_free(L);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    {
        igrad_config_t c = IGRAD_CONFIG_INIT;
        c.grad_dtype = IGRAD_DTYPE_F64;
        CHECK_STATUS(igrad_config_validate(&c), IGRAD_E_INVALID);
        c.grad_dtype = IGRAD_DTYPE_F32;
        c.method = IGRAD_METHOD_DENSE;
        run(c, IGRAD_DTYPE_BF16, "dense/bf16", 3, 0, -1);
    }
    static const igrad_dtype_t vts[2] = {IGRAD_DTYPE_F32, IGRAD_DTYPE_BF16};
    for (int v = 0; v < 2; v++) {
        igrad_config_t c = IGRAD_CONFIG_INIT;
        c.value_dtype = vts[v];
        c.density = 0.05;
        c.method = IGRAD_METHOD_TOPK_SYNC;
        run(c, IGRAD_DTYPE_BF16, "topk_sync/bf16", 3, 0, -1);
        c.method = IGRAD_METHOD_ADTOPK_SYNC;
        c.collective = IGRAD_COLLECTIVE_REDUCE;
        run(c, IGRAD_DTYPE_BF16, "adtopk_sync/reduce/bf16", 3, 0, -1);
        c.collective = IGRAD_COLLECTIVE_GATHER;
        run(c, IGRAD_DTYPE_BF16, "adtopk_sync/gather/bf16 nan", 4, 0, 2);
        c.collective = IGRAD_COLLECTIVE_AUTO;
        c.start_iter = 2; /* the dense warm-up engine reads 16-bit too */
        run(c, IGRAD_DTYPE_BF16, "adtopk_sync/start_iter/bf16", 4, 0, -1);
        c.start_iter = 0;
        c.momentum = 0.9;
        run(c, IGRAD_DTYPE_BF16, "adtopk_sync/momentum/bf16", 3, 0, -1);
        c.momentum = 0.0;
        c.method = IGRAD_METHOD_IG;
        c.profile_steps = 2;
        run(c, IGRAD_DTYPE_BF16, "ig/online/bf16", 6, 0, -1);
        c.method = IGRAD_METHOD_TOPK_SYNC;
        c.profile_steps = 0;
        run(c, IGRAD_DTYPE_F16, "topk_sync/f16 near range", 4, 1, -1);
    }
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("mpi_grad16: %d failure(s) over %d ranks\n", total, np);
    MPI_Finalize();
    return total ? 1 : 0;
}
