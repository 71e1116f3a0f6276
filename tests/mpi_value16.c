/*
 * mpi_value16.c — 16-bit and FP8 wire values (config.value_dtype BF16,
 * F16, F8_E4M3) over MPI (CTest runs it with -np 2 and -np 4). Each rank runs a twin engine
 * on the self communicator with the same gradients: its residuals equal
 * the MPI engine's bit for bit and its output is exactly what this rank
 * sent, so per rank sent + residual = (m*u +) g + old residual is checked
 * exactly, every sent value is 16-bit representable (FP8: a code times a
 * power of two, at most 4 significant bits), and the MPI result is
 * (1/P) times the sum over ranks of what they sent (added in rank order
 * here; bit for bit with 2 ranks, within float rounding of the order with
 * more), bit-identical on every rank. Gather and reduce buckets, adtopk_sync
 * and ig with momentum correction, a few steps each.
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
    int64_t a[2] = {40, 96}, b[2] = {96, 40}, c[1] = {3000}, d[1] = {70000};
    REQUIRE(igrad_layout_add(L, "model.layers.0.mlp.up_proj.weight", IGRAD_DTYPE_F32, 2, a) ==
            IGRAD_OK);
    REQUIRE(igrad_layout_add(L, "model.layers.0.mlp.down_proj.weight", IGRAD_DTYPE_F32, 2, b) ==
            IGRAD_OK);
    REQUIRE(igrad_layout_add(L, "flat.bias", IGRAD_DTYPE_F32, 1, c) == IGRAD_OK);
    REQUIRE(igrad_layout_add(L, "wide.weight", IGRAD_DTYPE_F32, 1, d) == IGRAD_OK);
    return L;
}

static float grad_value(int rank, int step, size_t t, int64_t i)
{
    uint64_t h = mix64(((uint64_t)rank << 56) ^ ((uint64_t)step << 40) ^ ((uint64_t)t << 32) ^
                       (uint64_t)i);
    double u = (double)(h >> 11) * 0x1p-53 - 0.5;
    if (h % 16 == 0) return (float)(u * 1e-6); /* F16 subnormals */
    if (h % 16 == 1) return (float)(u * 2e5);  /* F16 overflow: clamped */
    return (float)(u * (1.0 + (double)(h % 5)));
}

static int representable(igrad_dtype_t dt, float v)
{
    if (dt == IGRAD_DTYPE_F8_E4M3) { /* E4M3 code * 2^k: 4 significant bits */
        int e;
        float m = frexpf(fabsf(v), &e) * 16.0f;
        return isfinite(v) && m == floorf(m);
    }
    uint16_t h;
    float back;
    if (igrad_convert(&v, IGRAD_DTYPE_F32, &h, dt, 1) != IGRAD_OK) return 0;
    if (igrad_convert(&h, dt, &back, IGRAD_DTYPE_F32, 1) != IGRAD_OK) return 0;
    return back == v;
}

static void run(igrad_config_t c, const char *what, int steps)
{
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL, *self = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    REQUIRE(igrad_comm_create_self(&self) == IGRAD_OK);
    igrad_engine_t *e = NULL, *twin = NULL;
    REQUIRE(igrad_engine_create(L, NULL, &c, comm, &e) == IGRAD_OK);
    REQUIRE(igrad_engine_create(L, NULL, &c, self, &twin) == IGRAD_OK);
    size_t T = igrad_layout_count(L);
    float **g = calloc(T, sizeof *g), **s = calloc(T, sizeof *s), **a = calloc(T, sizeof *a);
    int64_t *n = calloc(T, sizeof *n);
    REQUIRE(g && s && a && n);
    int64_t nmax = 0;
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
        n[t] = ti.count;
        if (n[t] > nmax) nmax = n[t];
        g[t] = malloc((size_t)n[t] * sizeof(float));
        s[t] = malloc((size_t)n[t] * sizeof(float));
        a[t] = malloc((size_t)n[t] * sizeof(float));
        REQUIRE(g[t] && s[t] && a[t]);
    }
    float *all = malloc((size_t)np * (size_t)nmax * sizeof(float));
    float *root = malloc((size_t)nmax * sizeof(float));
    REQUIRE(all && root);
    float m = (float)c.momentum;
    const float inv = 1.0f / (float)np;
    for (int step = 0; step < steps; step++) {
        for (size_t t = 0; t < T; t++) {
            const float *r = igrad_engine_residual(e, t), *u = igrad_engine_velocity(e, t);
            for (int64_t i = 0; i < n[t]; i++) {
                g[t][i] = s[t][i] = grad_value(me, step, t, i);
                a[t][i] = (u ? m * u[i] + g[t][i] : g[t][i]) + r[i];
            }
        }
        CHECK_OK(igrad_engine_sync(e, step, g));
        CHECK_OK(igrad_engine_sync(twin, step, s));
        int bad_local = 0, bad_avg = 0, bad_same = 0;
        for (size_t t = 0; t < T; t++) {
            const float *r = igrad_engine_residual(e, t), *rt = igrad_engine_residual(twin, t);
            for (int64_t i = 0; i < n[t]; i++) {
                /* s = what this rank sent; r = what it kept */
                if (r[i] != rt[i] || s[t][i] + r[i] != a[t][i] ||
                    !representable(c.value_dtype, s[t][i]))
                    bad_local++;
            }
            MPI_Allgather(s[t], (int)n[t], MPI_FLOAT, all, (int)n[t], MPI_FLOAT, MPI_COMM_WORLD);
            double sumabs = 0.0;
            for (int64_t i = 0; i < n[t]; i++) {
                float acc = 0.0f;
                sumabs = 0.0;
                for (int q = 0; q < np; q++) {
                    acc += all[(size_t)q * (size_t)n[t] + (size_t)i] * inv;
                    sumabs += fabs((double)all[(size_t)q * (size_t)n[t] + (size_t)i]);
                }
                double tol = np == 2 ? 0.0 : 1e-6 * sumabs;
                if (fabs((double)g[t][i] - (double)acc) > tol) bad_avg++;
            }
            memcpy(root, g[t], (size_t)n[t] * sizeof(float));
            MPI_Bcast(root, (int)n[t], MPI_FLOAT, 0, MPI_COMM_WORLD);
            if (memcmp(root, g[t], (size_t)n[t] * sizeof(float)) != 0) bad_same++;
        }
        CHECK(bad_local == 0, "%s %s step %d: %d entries with sent + residual != a, or not on "
              "the dtype's grid", what, igrad_dtype_name(c.value_dtype), step, bad_local);
        CHECK(bad_avg == 0, "%s step %d: %d entries differ from the average of what was sent",
              what, step, bad_avg);
        CHECK(bad_same == 0, "%s step %d: %d tensors differ from rank 0's", what, step, bad_same);
    }
    for (size_t t = 0; t < T; t++) {
        free(g[t]);
        free(s[t]);
        free(a[t]);
    }
    free(g);
    free(s);
    free(a);
    free(n);
    free(all);
    free(root);
    igrad_engine_free(e);
    igrad_engine_free(twin);
    igrad_comm_free(comm);
    igrad_comm_free(self);
    igrad_layout_free(L);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    static const igrad_dtype_t dts[3] = {IGRAD_DTYPE_BF16, IGRAD_DTYPE_F16, IGRAD_DTYPE_F8_E4M3};
    for (int d = 0; d < 3; d++) {
        igrad_config_t c = IGRAD_CONFIG_INIT;
        c.method = IGRAD_METHOD_ADTOPK_SYNC;
        c.density = 0.05;
        c.value_dtype = dts[d];
        c.collective = IGRAD_COLLECTIVE_GATHER;
        run(c, "adtopk_sync/gather", 3);
        c.collective = IGRAD_COLLECTIVE_REDUCE;
        run(c, "adtopk_sync/reduce", 3);
        c.method = IGRAD_METHOD_TOPK_SYNC;
        c.collective = IGRAD_COLLECTIVE_AUTO;
        c.momentum = 0.9;
        run(c, "topk_sync/momentum", 4);
    }
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("mpi_value16: %d failure(s) over %d ranks\n", total, np);
    MPI_Finalize();
    return total ? 1 : 0;
}
