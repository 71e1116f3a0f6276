/*
 * mpi_engine.c — the sync engine over MPI (CTest runs it with -np 2 and
 * -np 4). Every rank's gradient is a deterministic function of (rank, step,
 * tensor, index), so each rank can recompute what every other rank sends.
 *
 *  - topk_sync: the result equals the average of every rank's top-k of
 *    (g + residual), computed here by a full sort per rank with each rank's
 *    error feedback simulated independently; every rank ends with
 *    bit-identical gradients (hash compared by MIN/MAX all-reduce).
 *  - dense: equals MPI_Allreduce / P.
 *  - ig over 100 steps: conservation per rank (a twin engine on the self
 *    communicator sees the same gradients: its residuals equal the MPI
 *    engine's bit for bit and its output is exactly what this rank sent, so
 *    sum g = sum sent + e is checked per rank, and the MPI result is the
 *    average of every rank's sent selection) and over all ranks (sum over
 *    ranks of sum g - e = P x sum of the averaged results), every deferred
 *    tensor arrives only at its phase, payload bytes = the engine's
 *    prediction = a prediction recomputed here from the budget and
 *    schedule rules.
 *  - two-phase with this test running MPI_Allgather / MPI_Allreduce =
 *    igrad_engine_sync.
 *  - save at step 50, fresh engine, load, run to 100 = uninterrupted.
 *  - the remedies (momentum correction, residual decay, dense warm-up): the
 *    warm-up steps and later ones equal the average of per-rank twin
 *    engines, bit-identical on every rank; another momentum on one rank is
 *    IGRAD_E_MISMATCH naming config.momentum.
 *  - the dense warm-up equals method dense bit for bit with the same
 *    buckets (sync, two-phase, streamed, across a save/load), then the
 *    method from zero residuals; another start_iter on one rank fails every
 *    rank naming config.start_iter.
 *  - one rank with another density or another profile: IGRAD_E_MISMATCH on
 *    every rank naming it; NaN on one rank: IGRAD_E_NONFINITE on every rank,
 *    residuals unchanged; none of it hangs.
 *  - step skew (the last rank one step ahead) for topk_sync, adtopk_sync +
 *    interleave, ig over gather (sync and two-phase) and over reduce:
 *    IGRAD_E_MISMATCH on every rank, "step differs: rank 0 has 2, rank P-1
 *    has 3", residuals unchanged, the step can be redone.
 *  - a peer's bytes overwritten with 0xff (a custom comm over MPI corrupts
 *    the last rank's block of every gather bucket on every rank): flat and
 *    row-wise indices, sync and two-phase: IGRAD_E_COMM on every rank naming
 *    the rank, bucket and tensor, then every later call IGRAD_E_STATE.
 *
 * Checks only count failures, so every rank reaches every collective; the
 * counts are summed at the end and every rank exits nonzero on any failure.
 * Configs pin dense_below = 0: every tensor takes the sparsifier path, which
 * the references and goldens here model (the default, 64, sends tensors
 * under 64 entries whole: tests/test_engine_dense_below.c, test_target.c).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "igrad.h"
#include "plan/schedule.h"

#include "mpi_util.h"

typedef struct grads {
    size_t T;
    int64_t *n;
    float **g;
} grads_t;

static grads_t grads_new(const igrad_layout_t *L)
{
    grads_t G;
    G.T = igrad_layout_count(L);
    G.n = calloc(G.T, sizeof *G.n);
    G.g = calloc(G.T, sizeof *G.g);
    REQUIRE(G.n && G.g);
    for (size_t t = 0; t < G.T; t++) {
        igrad_tensor_info_t ti;
        REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
        G.n[t] = ti.count;
        G.g[t] = calloc((size_t)ti.count, sizeof(float));
        REQUIRE(G.g[t]);
    }
    return G;
}

static void grads_free(grads_t *G)
{
    for (size_t t = 0; t < G->T; t++) free(G->g[t]);
    free(G->g);
    free(G->n);
}

/* Rank r's gradient at a step. */
static float grad_value(int rank, int64_t step, size_t t, int64_t i)
{
    uint64_t u = mix64(mix64((uint64_t)rank * 7919u + 1) ^ mix64((uint64_t)step * 1000003u + t) ^
                       (uint64_t)i * 0x9e3779b97f4a7c15ULL);
    float x = (float)((double)(u >> 40) / 16777216.0) * 2.0f - 1.0f;
    if ((u & 0xff) == 0) x *= 10.0f;
    return (0.2f + 0.25f * (float)(t % 4)) * x;
}

static void grads_fill(grads_t *G, int rank, int64_t step)
{
    for (size_t t = 0; t < G->T; t++)
        for (int64_t i = 0; i < G->n[t]; i++) G->g[t][i] = grad_value(rank, step, t, i);
}

static void grads_copy(grads_t *d, const grads_t *s)
{
    for (size_t t = 0; t < s->T; t++) memcpy(d->g[t], s->g[t], (size_t)s->n[t] * sizeof(float));
}

static uint64_t grads_hash(const grads_t *G)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t t = 0; t < G->T; t++) {
        const unsigned char *p = (const unsigned char *)G->g[t];
        for (size_t i = 0; i < (size_t)G->n[t] * sizeof(float); i++) {
            h ^= p[i];
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}

/* Every rank holds the same gradients (bitwise). */
static void check_identical(const grads_t *G, const char *what)
{
    uint64_t h = grads_hash(G), lo = 0, hi = 0;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lo == hi && lo == h, "%s: gradients differ between ranks (hash %llx, min %llx, max %llx)",
          what, (unsigned long long)h, (unsigned long long)lo, (unsigned long long)hi);
}

static igrad_engine_t *create(const igrad_layout_t *L, const igrad_profile_t *P,
                              const igrad_config_t *c, igrad_comm_t *comm)
{
    igrad_engine_t *e = NULL;
    igrad_status_t st = igrad_engine_create(L, P, c, comm, &e);
    CHECK(st == IGRAD_OK, "engine create: %s (%s)", igrad_status_str(st), igrad_last_error());
    REQUIRE(e);
    return e;
}

/* ---- topk_sync against an independent reference --------------------------- */

typedef struct ranked {
    float mag;
    int64_t i;
} ranked_t;

static int cmp_ranked(const void *pa, const void *pb)
{
    const ranked_t *a = pa, *b = pb;
    if (a->mag != b->mag) return a->mag > b->mag ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

static void test_topk_sync(igrad_comm_t *comm, const igrad_layout_t *L)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.density = 0.03;
    c.block_entries = 5; /* several blocks per tensor, split over buckets */
    c.buckets = 3;
    igrad_engine_t *e = create(L, NULL, &c, comm);
    grads_t G = grads_new(L);
    size_t T = G.T;
    /* every rank's residual, simulated here */
    float ***res = calloc((size_t)np, sizeof *res);
    REQUIRE(res);
    for (int r = 0; r < np; r++) {
        res[r] = calloc(T, sizeof *res[r]);
        REQUIRE(res[r]);
        for (size_t t = 0; t < T; t++) {
            res[r][t] = calloc((size_t)G.n[t], sizeof(float));
            REQUIRE(res[r][t]);
        }
    }
    for (int64_t s = 0; s < 4; s++) {
        grads_fill(&G, me, s);
        CHECK_OK(igrad_engine_sync(e, s, G.g));
        for (size_t t = 0; t < T; t++) {
            int64_t n = G.n[t], k = igrad_budget(n, c.density);
            double *want = calloc((size_t)n, sizeof *want), *scale = calloc((size_t)n, sizeof *scale);
            ranked_t *rk = malloc((size_t)n * sizeof *rk);
            float *a = malloc((size_t)n * sizeof *a);
            REQUIRE(want && scale && rk && a);
            for (int r = 0; r < np; r++) {
                for (int64_t i = 0; i < n; i++) {
                    a[i] = grad_value(r, s, t, i) + res[r][t][i];
                    rk[i].mag = fabsf(a[i]);
                    rk[i].i = i;
                }
                qsort(rk, (size_t)n, sizeof *rk, cmp_ranked);
                for (int64_t i = 0; i < n; i++) res[r][t][i] = a[i];
                for (int64_t j = 0; j < k; j++) {
                    int64_t i = rk[j].i;
                    want[i] += (double)a[i] / np;
                    scale[i] += fabs((double)a[i]) / np;
                    res[r][t][i] = 0.0f;
                }
            }
            for (int64_t i = 0; i < n; i++) {
                /* float sums of P terms: rounding relative to the terms */
                double tol = 1e-6 * scale[i];
                if (!(fabs((double)G.g[t][i] - want[i]) <= tol)) {
                    CHECK(0, "topk_sync step %lld tensor %zu entry %lld: got %.9g, reference %.9g",
                          (long long)s, t, (long long)i, (double)G.g[t][i], want[i]);
                    break;
                }
            }
            const float *mine = igrad_engine_residual(e, t);
            for (int64_t i = 0; i < n; i++)
                if (mine[i] != res[me][t][i]) {
                    CHECK(0, "topk_sync step %lld tensor %zu residual %lld: %.9g, reference %.9g",
                          (long long)s, t, (long long)i, (double)mine[i], (double)res[me][t][i]);
                    break;
                }
            free(a);
            free(rk);
            free(want);
            free(scale);
        }
        check_identical(&G, "topk_sync");
    }
    for (int r = 0; r < np; r++) {
        for (size_t t = 0; t < T; t++) free(res[r][t]);
        free(res[r]);
    }
    free(res);
    grads_free(&G);
    igrad_engine_free(e);
}

/* ---- dense ---------------------------------------------------------------------- */

static void test_dense(igrad_comm_t *comm, const igrad_layout_t *L)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_DENSE;
    c.block_entries = 300;
    igrad_engine_t *e = create(L, NULL, &c, comm);
    grads_t G = grads_new(L), R = grads_new(L), A = grads_new(L);
    for (int64_t s = 0; s < 2; s++) {
        grads_fill(&G, me, s);
        for (size_t t = 0; t < G.T; t++) {
            MPI_Allreduce(G.g[t], R.g[t], (int)G.n[t], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            for (int64_t i = 0; i < G.n[t]; i++) A.g[t][i] = fabsf(G.g[t][i]);
            MPI_Allreduce(MPI_IN_PLACE, A.g[t], (int)G.n[t], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        CHECK_OK(igrad_engine_sync(e, s, G.g));
        for (size_t t = 0; t < G.T; t++)
            for (int64_t i = 0; i < G.n[t]; i++) {
                double want = (double)R.g[t][i] / np;
                /* summation orders differ: rounding relative to the terms */
                if (!(fabs(G.g[t][i] - want) <= 1e-6 * (double)A.g[t][i] / np)) {
                    CHECK(0, "dense tensor %zu entry %lld: %.9g, MPI_Allreduce/P %.9g", t,
                          (long long)i, (double)G.g[t][i], want);
                    break;
                }
            }
        check_identical(&G, "dense");
        igrad_step_stats_t st;
        CHECK_OK(igrad_engine_last_stats(e, &st));
        double wire = 2.0 * (np - 1) / np * (double)igrad_layout_total_count(L) * 4;
        CHECK(fabs(st.wire_nbytes - wire) <= 1e-6 * wire, "dense wire %.1f, model %.1f",
              st.wire_nbytes, wire);
        /* the exchange's window on this rank's clock; no node windows (flat) */
        const double *w = st.comm_window_ms;
        CHECK(w[0] > 0 && w[1] >= w[0] && w[1] - w[0] <= st.total_ms + 1e-9 && w[2] == 0 &&
                  w[3] == 0 && w[4] == 0 && w[5] == 0,
              "dense comm window [%.3f, %.3f] (total %.3f ms), node windows %g %g %g %g", w[0],
              w[1], st.total_ms, w[2], w[3], w[4], w[5]);
    }
    grads_free(&G);
    grads_free(&R);
    grads_free(&A);
    igrad_engine_free(e);
}

/* ---- ig over 100 steps ------------------------------------------------------- */

static void expect_tensor(const igrad_tensor_info_t *ti, const igrad_config_t *c, int release,
                          int64_t *count, int *idxb)
{
    int64_t n = ti->count, range;
    if (c->sparsifier == IGRAD_SPARSIFIER_ADTOPK && ti->ndim >= 2) {
        int64_t rows = ti->shape[0], cols = n / rows;
        int64_t per_row = igrad_budget(cols, c->density);
        if (release)
            per_row = igrad__release_per_row(per_row, cols, c->release_keep, c->release_period);
        *count = rows * per_row;
        range = cols;
    } else {
        int64_t k = igrad_budget(n, c->density);
        if (release) k = igrad__release_count(k, n, c->release_keep, c->release_period);
        *count = k;
        range = n;
    }
    *idxb = range <= 65536 ? 2 : 4;
}

static void test_ig(igrad_comm_t *comm, const igrad_layout_t *L, const igrad_profile_t *P)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.collective = IGRAD_COLLECTIVE_GATHER;
    c.verify_every = 7; /* the periodic check runs too */
    /* the byte oracle below models the fixed widths; compact sizes are
     * test_engine.c's and test_contract_wire.c's */
    c.index_code = IGRAD_INDEX_CODE_FIXED;
    igrad_engine_t *e = create(L, P, &c, comm);
    igrad_comm_t *self = NULL;
    REQUIRE(igrad_comm_create_self(&self) == IGRAD_OK);
    igrad_engine_t *twin = create(L, P, &c, self);
    grads_t G = grads_new(L), S = grads_new(L), A = grads_new(L);
    size_t T = G.T;
    double **din = calloc(T, sizeof *din), **dout = calloc(T, sizeof *dout);
    double **mag = calloc(T, sizeof *mag), **dsent = calloc(T, sizeof *dsent);
    double **lin = calloc(T, sizeof *lin);
    int *phase = calloc(T, sizeof *phase);
    int64_t *pstep = calloc(T, sizeof *pstep), *prel = calloc(T, sizeof *prel);
    REQUIRE(din && dout && mag && dsent && lin && phase && pstep && prel);
    int nlow = 0;
    for (size_t t = 0; t < T; t++) {
        din[t] = calloc((size_t)G.n[t], sizeof(double));
        dout[t] = calloc((size_t)G.n[t], sizeof(double));
        mag[t] = calloc((size_t)G.n[t], sizeof(double));
        dsent[t] = calloc((size_t)G.n[t], sizeof(double));
        lin[t] = calloc((size_t)G.n[t], sizeof(double));
        REQUIRE(din[t] && dout[t] && mag[t] && dsent[t] && lin[t]);
        igrad_tensor_plan_t tp;
        CHECK_OK(igrad_engine_tensor_plan(e, t, &tp));
        phase[t] = tp.phase;
        nlow += tp.phase >= 0;
        igrad_tensor_info_t ti;
        REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
        int64_t cnt;
        int idxb;
        expect_tensor(&ti, &c, 0, &cnt, &idxb);
        pstep[t] = cnt * (4 + idxb);
        expect_tensor(&ti, &c, 1, &cnt, &idxb);
        prel[t] = cnt * (4 + idxb);
        CHECK(tp.step_nbytes == pstep[t], "tensor %zu: plan %lld bytes/step, expected %lld", t,
              (long long)tp.step_nbytes, (long long)pstep[t]);
    }
    CHECK(nlow > 0, "the profile leaves no low-importance tensor");

    for (int64_t s = 0; s < 100; s++) {
        grads_fill(&G, me, s);
        grads_copy(&S, &G);
        for (size_t t = 0; t < T; t++)
            for (int64_t i = 0; i < G.n[t]; i++) {
                din[t][i] += G.g[t][i];
                lin[t][i] += G.g[t][i];
                mag[t][i] += fabs((double)G.g[t][i]);
            }
        /* the twin's result on one rank is exactly this rank's selection */
        CHECK_OK(igrad_engine_sync(twin, s, S.g));
        int64_t predicted = igrad__schedule_step_nbytes(T, phase, c.release_period, pstep, prel, s);
        CHECK(igrad_engine_predict_payload(e, s) == predicted, "step %lld: predict %lld vs %lld",
              (long long)s, (long long)igrad_engine_predict_payload(e, s), (long long)predicted);
        CHECK_OK(igrad_engine_sync(e, s, G.g));
        igrad_step_stats_t st;
        CHECK_OK(igrad_engine_last_stats(e, &st));
        CHECK(st.payload_nbytes == predicted, "step %lld: payload %lld, predicted %lld",
              (long long)s, (long long)st.payload_nbytes, (long long)predicted);
        CHECK(fabs(st.wire_nbytes - (double)(np - 1) * (double)predicted) < 0.5,
              "step %lld: wire %.1f, model %.1f", (long long)s, st.wire_nbytes,
              (double)(np - 1) * (double)predicted);
        for (size_t t = 0; t < T; t++) {
            int due = igrad__schedule_sent(phase[t], c.release_period, s);
            igrad_tensor_info_t ti;
            REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
            int64_t cnt;
            int idxb;
            expect_tensor(&ti, &c, phase[t] >= 0, &cnt, &idxb);
            int64_t nz = 0;
            for (int64_t i = 0; i < G.n[t]; i++) {
                nz += G.g[t][i] != 0.0f;
                dout[t][i] += G.g[t][i];
            }
            if (due)
                CHECK(nz >= cnt && nz <= cnt * np,
                      "step %lld tensor %s due: %lld nonzero, budget %lld per rank", (long long)s,
                      ti.name, (long long)nz, (long long)cnt);
            else
                CHECK(nz == 0, "step %lld tensor %s (phase %d) not due but %lld entries arrived",
                      (long long)s, ti.name, phase[t], (long long)nz);
        }
        if (s % 25 == 0) check_identical(&G, "ig");
        /* the MPI result is the mean of every rank's selection */
        for (size_t t = 0; t < T; t++) {
            const float *rm = igrad_engine_residual(e, t), *rt = igrad_engine_residual(twin, t);
            if (memcmp(rm, rt, (size_t)G.n[t] * sizeof(float)) != 0)
                CHECK(0, "step %lld tensor %zu: the MPI engine's residual differs from the "
                      "self twin's", (long long)s, t);
            for (int64_t i = 0; i < G.n[t]; i++) {
                dsent[t][i] += S.g[t][i];
                A.g[t][i] = fabsf(S.g[t][i]);
            }
            MPI_Allreduce(MPI_IN_PLACE, S.g[t], (int)G.n[t], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, A.g[t], (int)G.n[t], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            for (int64_t i = 0; i < G.n[t]; i++) {
                double want = (double)S.g[t][i] / np;
                if (!(fabs(G.g[t][i] - want) <= 1e-6 * (double)A.g[t][i] / np)) {
                    CHECK(0, "step %lld tensor %zu entry %lld: result %.9g, mean of the ranks' "
                          "selections %.9g", (long long)s, t, (long long)i, (double)G.g[t][i],
                          want);
                    break;
                }
            }
        }
    }
    /* conservation on this rank: sum g = sum sent + e */
    for (size_t t = 0; t < T; t++) {
        const float *r = igrad_engine_residual(e, t);
        double err = 0.0, ref = 0.0;
        for (int64_t i = 0; i < G.n[t]; i++) {
            double d = lin[t][i] - dsent[t][i] - (double)r[i];
            err += d * d;
        }
        for (int64_t i = 0; i < G.n[t]; i++) ref += mag[t][i] * mag[t][i]; /* this rank's */
        CHECK(sqrt(err) <= 1e-4 * sqrt(ref),
              "tensor %zu: this rank's conservation error %.9g vs 1e-4 x %.9g", t, sqrt(err),
              sqrt(ref));
    }
    /* conservation: sum_r (sum g_r - e_r) = P x sum of averages */
    for (size_t t = 0; t < T; t++) {
        const float *r = igrad_engine_residual(e, t);
        for (int64_t i = 0; i < G.n[t]; i++) din[t][i] -= r[i];
        MPI_Allreduce(MPI_IN_PLACE, din[t], (int)G.n[t], MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, mag[t], (int)G.n[t], MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double err = 0.0, ref = 0.0;
        for (int64_t i = 0; i < G.n[t]; i++) {
            double d = din[t][i] - np * dout[t][i];
            err += d * d;
            ref += mag[t][i] * mag[t][i];
        }
        CHECK(sqrt(err) <= 1e-4 * sqrt(ref), "tensor %zu: conservation error %.9g vs 1e-4 x %.9g",
              t, sqrt(err), sqrt(ref));
    }
    for (size_t t = 0; t < T; t++) {
        free(din[t]);
        free(dout[t]);
        free(mag[t]);
        free(dsent[t]);
        free(lin[t]);
    }
    free(din);
    free(dout);
    free(mag);
    free(dsent);
    free(lin);
    grads_free(&S);
    grads_free(&A);
    igrad_engine_free(twin);
    igrad_comm_free(self);
    free(phase);
    free(pstep);
    free(prel);
    grads_free(&G);
    igrad_engine_free(e);
}

/* ---- two-phase with MPI run here --------------------------------------------- */

static void two_phase_vs_sync(igrad_comm_t *comm, const igrad_layout_t *L,
                              const igrad_profile_t *P, igrad_config_t c, int exact,
                              const char *what)
{
    igrad_engine_t *a = create(L, P, &c, comm), *b = create(L, P, &c, comm);
    grads_t Ga = grads_new(L), Gb = grads_new(L);
    for (int64_t s = 0; s < 9; s++) {
        grads_fill(&Ga, me, s);
        grads_copy(&Gb, &Ga);
        CHECK_OK(igrad_engine_sync(a, s, Ga.g));
        const igrad_bucket_t *bk = NULL;
        size_t nb = 0;
        CHECK_OK(igrad_engine_begin(b, s, Gb.g, &bk, &nb));
        for (size_t j = 0; j < nb; j++) {
            if (bk[j].kind == IGRAD_BUCKET_GATHER) {
                CHECK(bk[j].recv_nbytes == bk[j].send_nbytes * (size_t)np, "%s: recv %zu",
                      what, bk[j].recv_nbytes);
                MPI_Allgather(bk[j].send, (int)bk[j].send_nbytes, MPI_BYTE, bk[j].recv,
                              (int)bk[j].send_nbytes, MPI_BYTE, MPI_COMM_WORLD);
            } else {
                CHECK(bk[j].send == bk[j].recv && bk[j].dtype == IGRAD_DTYPE_F32, "%s: reduce",
                      what);
                MPI_Allreduce(MPI_IN_PLACE, bk[j].recv, (int)bk[j].count, MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
            }
        }
        CHECK_OK(igrad_engine_end(b, s, Gb.g));
        for (size_t t = 0; t < Ga.T; t++) {
            /* all-reduce sums may be ordered differently by the two calls:
             * rounding relative to the tensor's largest value */
            float big = 0.0f;
            for (int64_t i = 0; i < Ga.n[t]; i++) big = fmaxf(big, fabsf(Ga.g[t][i]));
            for (int64_t i = 0; i < Ga.n[t]; i++) {
                float x = Ga.g[t][i], y = Gb.g[t][i];
                int same = exact ? memcmp(&x, &y, sizeof x) == 0
                                 : fabsf(x - y) <= 1e-5f * big;
                if (!same) {
                    CHECK(0, "%s step %lld tensor %zu entry %lld: sync %.9g, two-phase %.9g",
                          what, (long long)s, t, (long long)i, (double)x, (double)y);
                    t = Ga.T - 1;
                    break;
                }
            }
        }
    }
    for (size_t t = 0; t < Ga.T; t++) {
        const float *ra = igrad_engine_residual(a, t), *rb = igrad_engine_residual(b, t);
        if (ra && rb)
            CHECK(memcmp(ra, rb, (size_t)Ga.n[t] * sizeof(float)) == 0,
                  "%s: residual of tensor %zu differs", what, t);
    }
    grads_free(&Ga);
    grads_free(&Gb);
    igrad_engine_free(a);
    igrad_engine_free(b);
}

/* ---- save / load ------------------------------------------------------------------- */

static void test_resume(igrad_comm_t *comm, const igrad_layout_t *L, const igrad_profile_t *P)
{
    char dir[128] = "/tmp/igrad_mpi_engine_XXXXXX";
    if (me == 0) REQUIRE(mkdtemp(dir) != NULL);
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    char path[256];
    snprintf(path, sizeof path, "%s/state.rank%d.bin", dir, me);

    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.pack = IGRAD_PACK_RISK;
    c.block_entries = 40;
    igrad_engine_t *a = create(L, P, &c, comm), *b = create(L, P, &c, comm);
    grads_t Ga = grads_new(L), Gb = grads_new(L);
    for (int64_t s = 0; s < 100; s++) {
        grads_fill(&Ga, me, s);
        grads_copy(&Gb, &Ga);
        CHECK_OK(igrad_engine_sync(a, s, Ga.g));
        if (s == 50) {
            CHECK_OK(igrad_engine_save_state(b, path));
            igrad_engine_free(b);
            b = create(L, P, &c, comm);
            CHECK_OK(igrad_engine_load_state(b, path));
        }
        CHECK_OK(igrad_engine_sync(b, s, Gb.g));
        if (s >= 50 && (s % 10 == 0 || s == 99))
            for (size_t t = 0; t < Ga.T; t++)
                CHECK(memcmp(Ga.g[t], Gb.g[t], (size_t)Ga.n[t] * sizeof(float)) == 0,
                      "resume: step %lld tensor %zu differs from the uninterrupted run",
                      (long long)s, t);
    }
    for (size_t t = 0; t < Ga.T; t++)
        CHECK(memcmp(igrad_engine_residual(a, t), igrad_engine_residual(b, t),
                     (size_t)Ga.n[t] * sizeof(float)) == 0,
              "resume: residual of tensor %zu differs", t);

    /* one rank's file missing: every rank fails, no engine changes */
    char other[256];
    snprintf(other, sizeof other, "%s/state.rank%d.bin", dir, me == np - 1 ? 1000 : me);
    float before = igrad_engine_residual(b, 0)[0];
    CHECK_OK(igrad_engine_save_state(a, path));
    CHECK_STATUS(igrad_engine_load_state(b, other), IGRAD_E_IO);
    CHECK(igrad_engine_residual(b, 0)[0] == before, "a failed load changed the residual");
    /* another rank's file */
    snprintf(other, sizeof other, "%s/state.rank%d.bin", dir, (me + 1) % np);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK_STATUS(igrad_engine_load_state(b, other), IGRAD_E_MISMATCH);

    MPI_Barrier(MPI_COMM_WORLD);
    unlink(path);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) rmdir(dir);
    grads_free(&Ga);
    grads_free(&Gb);
    igrad_engine_free(a);
    igrad_engine_free(b);
}

/* ---- online profiling ---------------------------------------------------------------- */

static uint64_t plan_hash_of(const igrad_engine_t *e, size_t T)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_plan_t tp;
        CHECK_OK(igrad_engine_tensor_plan(e, t, &tp));
        int64_t v[5] = {tp.every_step, tp.important, tp.phase, tp.count, tp.release_count};
        const unsigned char *p = (const unsigned char *)v;
        for (size_t i = 0; i < sizeof v; i++) {
            h ^= p[i];
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}

static void check_same_u64(uint64_t h, const char *what)
{
    uint64_t lo = 0, hi = 0;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lo == hi, "%s differs between ranks (%llx here, min %llx, max %llx)", what,
          (unsigned long long)h, (unsigned long long)lo, (unsigned long long)hi);
}

/* b's state saved and loaded into a fresh engine made the same way. */
static igrad_engine_t *reloaded(igrad_engine_t *b, const char *path, const igrad_layout_t *L,
                                const igrad_config_t *c, igrad_comm_t *comm)
{
    CHECK_OK(igrad_engine_save_state(b, path));
    igrad_engine_free(b);
    b = create(L, NULL, c, comm);
    CHECK_OK(igrad_engine_load_state(b, path));
    return b;
}

/* The resumed twin's gradients equal the uninterrupted run's, and every
 * rank holds the same. */
static void check_twin(const grads_t *Ga, const grads_t *Gb, int64_t step, const char *what)
{
    for (size_t t = 0; t < Ga->T; t++)
        CHECK(memcmp(Ga->g[t], Gb->g[t], (size_t)Ga->n[t] * sizeof(float)) == 0,
              "%s resume: step %lld tensor %zu differs from the uninterrupted run", what,
              (long long)step, t);
    check_identical(Ga, what);
}

/* Per-entry sums over steps (double), for the conservation checks. */
static double **sums_new(const grads_t *G)
{
    double **x = calloc(G->T, sizeof *x);
    REQUIRE(x);
    for (size_t t = 0; t < G->T; t++) REQUIRE((x[t] = calloc((size_t)G->n[t], sizeof(double))));
    return x;
}

static void sums_free(double **x, size_t T)
{
    for (size_t t = 0; t < T && x; t++) free(x[t]);
    free(x);
}

/* One sync of G on engine a, adding the gradients given to `in` and the
 * result to `out`. */
static void sync_counted(igrad_engine_t *a, int64_t step, grads_t *G, double **in, double **out)
{
    for (size_t t = 0; t < G->T; t++)
        for (int64_t i = 0; i < G->n[t]; i++) in[t][i] += G->g[t][i];
    CHECK_OK(igrad_engine_sync(a, step, G->g));
    for (size_t t = 0; t < G->T; t++)
        for (int64_t i = 0; i < G->n[t]; i++) out[t][i] += G->g[t][i];
}

/* Sum over ranks of every rank's gradients = P x applied + sum over ranks
 * of the residuals, per entry (in, out: this rank's sums over steps). */
static void check_conservation_over_ranks(const igrad_engine_t *a, const grads_t *G,
                                          double *const *in, double *const *out,
                                          const char *what)
{
    for (size_t t = 0; t < G->T; t++) {
        int64_t n = G->n[t];
        double *loc = malloc(2 * (size_t)n * sizeof *loc), *sum = malloc(2 * (size_t)n * sizeof *sum);
        REQUIRE(loc && sum);
        const float *r = igrad_engine_residual(a, t);
        for (int64_t i = 0; i < n; i++) {
            loc[i] = in[t][i];
            loc[n + i] = (double)r[i];
        }
        MPI_Allreduce(loc, sum, 2 * (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double err = 0.0, ref = 0.0;
        for (int64_t i = 0; i < n; i++) {
            double d = sum[i] - (double)np * out[t][i] - sum[n + i];
            err += d * d;
            ref += sum[i] * sum[i];
        }
        CHECK(sqrt(err) <= 1e-4 * sqrt(ref) + 1e-6,
              "%s conservation, tensor %zu: |sum in - P applied - sum e| = %g (ref %g)", what, t,
              sqrt(err), sqrt(ref));
        free(loc);
        free(sum);
    }
}

/* The switch on every rank: identical plans and profiles, the same
 * gradients, conservation over ranks (sum of every rank's gradients =
 * P x applied + sum of residuals), and a resume from inside the window and
 * from after the switch. */
static void test_online(igrad_comm_t *comm, const igrad_layout_t *L)
{
    char dir[128] = "/tmp/igrad_mpi_online_XXXXXX";
    if (me == 0) REQUIRE(mkdtemp(dir) != NULL);
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    char path[256];
    snprintf(path, sizeof path, "%s/state.rank%d.bin", dir, me);

    const int64_t W = 8, steps = 30;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.block_entries = 40;
    c.profile_steps = W;
    c.profile_partition = "fixed:0.4";
    igrad_engine_t *a = create(L, NULL, &c, comm), *b = create(L, NULL, &c, comm);
    size_t T = igrad_layout_count(L);
    grads_t Ga = grads_new(L), Gb = grads_new(L);
    double **in = sums_new(&Ga), **out = sums_new(&Ga);
    for (int64_t s = 0; s < steps; s++) {
        grads_fill(&Ga, me, s);
        grads_copy(&Gb, &Ga);
        sync_counted(a, s, &Ga, in, out);
        if (s == 5 || s == 20) { /* inside the window, after the switch */
            b = reloaded(b, path, L, &c, comm);
        }
        CHECK_OK(igrad_engine_sync(b, s, Gb.g));
        check_twin(&Ga, &Gb, s, "online");
        if (s == W) {
            igrad_online_info_t oi;
            CHECK_OK(igrad_engine_online_info(a, &oi));
            CHECK(oi.profiling == 0 && oi.switch_step == W, "online: switch_step %lld",
                  (long long)oi.switch_step);
            check_same_u64(plan_hash_of(a, T), "the plan after the switch");
            const igrad_profile_t *pa = igrad_engine_profile(a);
            REQUIRE(pa);
            uint64_t h = 0xcbf29ce484222325ULL;
            for (size_t k = 0; k < igrad_profile_count(pa); k++) {
                igrad_profile_entry_t pe;
                CHECK_OK(igrad_profile_entry(pa, k, &pe));
                uint64_t bits;
                memcpy(&bits, &pe.score, 8);
                h = (h ^ bits ^ (uint64_t)pe.important) * 0x100000001b3ULL;
            }
            check_same_u64(h, "the built profile");
        }
    }
    CHECK(plan_hash_of(a, T) == plan_hash_of(b, T), "online resume: plans differ");
    check_conservation_over_ranks(a, &Ga, in, out, "online");
    /* one rank with another window: every rank fails, naming it */
    igrad_config_t d = c;
    if (me == np - 1) d.profile_steps = W + 1;
    igrad_engine_t *x = NULL;
    CHECK_STATUS(igrad_engine_create(L, NULL, &d, comm, &x), IGRAD_E_MISMATCH);
    CHECK(strstr(igrad_last_error(), "config.profile_steps differs"), "message: %s",
          igrad_last_error());
    /* a profile and a window on one rank only: every rank fails, none hangs */
    igrad_profile_t *P0 = mpi_fixed_profile(L, "fixed:0.4");
    CHECK_STATUS(igrad_engine_create(L, me == 0 ? P0 : NULL, &c, comm, &x), IGRAD_E_INVALID);
    igrad_profile_free(P0);
    /* set_profile with another profile on one rank: refused, nothing changes */
    igrad_engine_t *y = create(L, NULL, &c, comm);
    igrad_profile_t *P1 = mpi_fixed_profile(L, "fixed:0.4"), *P2 = mpi_fixed_profile(L, "fixed:0.7");
    uint64_t before = plan_hash_of(y, T);
    CHECK_STATUS(igrad_engine_set_profile(y, me == np - 1 ? P2 : P1), IGRAD_E_MISMATCH);
    CHECK(plan_hash_of(y, T) == before, "a refused set_profile changed the plan");
    CHECK_OK(igrad_engine_set_profile(y, P1));
    check_same_u64(plan_hash_of(y, T), "the plan after set_profile");
    igrad_profile_free(P1);
    igrad_profile_free(P2);
    igrad_engine_free(y);

    MPI_Barrier(MPI_COMM_WORLD);
    unlink(path);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) rmdir(dir);
    sums_free(in, T);
    sums_free(out, T);
    grads_free(&Ga);
    grads_free(&Gb);
    igrad_engine_free(a);
    igrad_engine_free(b);
}

/* Periodic re-profiling on every rank: the scales of the tensors reversed
 * at step 24, so that components move; after every re-profile the ranks
 * hold the same plan, profile and counters, the gradients stay identical,
 * a run resumed from a state saved inside a re-profiling window (with
 * hysteresis flags set) continues exactly, and the sum over ranks is
 * conserved through every re-plan. */
static void grads_fill_swap(grads_t *G, int rank, int64_t step)
{
    grads_fill(G, rank, step);
    if (step < 24) return;
    for (size_t t = 0; t < G->T; t++) {
        float f = (0.2f + 0.25f * (float)(3 - t % 4)) / (0.2f + 0.25f * (float)(t % 4));
        for (int64_t i = 0; i < G->n[t]; i++) G->g[t][i] *= f;
    }
}

static void test_reprofile(igrad_comm_t *comm, const igrad_layout_t *L)
{
    char dir[128] = "/tmp/igrad_mpi_reprof_XXXXXX";
    if (me == 0) REQUIRE(mkdtemp(dir) != NULL);
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    char path[256];
    snprintf(path, sizeof path, "%s/state.rank%d.bin", dir, me);

    const int64_t W = 8, Wr = 8, steps = 66;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.block_entries = 40;
    c.profile_steps = W;
    c.profile_partition = "fixed:0.4";
    c.reprofile_every = Wr;
    c.reprofile_margin = 0.05;
    igrad_engine_t *a = create(L, NULL, &c, comm), *b = create(L, NULL, &c, comm);
    size_t T = igrad_layout_count(L);
    grads_t Ga = grads_new(L), Gb = grads_new(L);
    double **in = sums_new(&Ga), **out = sums_new(&Ga);
    for (int64_t s = 0; s < steps; s++) {
        grads_fill_swap(&Ga, me, s);
        grads_copy(&Gb, &Ga);
        sync_counted(a, s, &Ga, in, out);
        if (s == 36 || s == 49) { /* a window with flags set, after a re-plan */
            b = reloaded(b, path, L, &c, comm);
        }
        CHECK_OK(igrad_engine_sync(b, s, Gb.g));
        check_twin(&Ga, &Gb, s, "re-profiling");
        if (s > W && (s - W) % Wr == 0) {
            igrad_online_info_t oi;
            CHECK_OK(igrad_engine_online_info(a, &oi));
            CHECK(oi.reprofiles == (s - W) / Wr, "step %lld: %lld re-profiles", (long long)s,
                  (long long)oi.reprofiles);
            check_same_u64(plan_hash_of(a, T), "the plan after a re-profile");
            check_same_u64((uint64_t)oi.last_flips, "the flips of a re-profile");
            check_same_u64((uint64_t)oi.reprofile_replans, "the re-plans of re-profiling");
            check_same_u64(igrad_profile_threshold(igrad_engine_profile(a)) > 0.0 ? 1 : 0,
                           "the profile's threshold sign");
        }
    }
    igrad_online_info_t oi;
    CHECK_OK(igrad_engine_online_info(a, &oi));
    CHECK(oi.reprofile_replans >= 1, "the reversed scales moved no component (%lld re-plans)",
          (long long)oi.reprofile_replans);
    CHECK(plan_hash_of(a, T) == plan_hash_of(b, T), "re-profiling resume: plans differ");
    check_conservation_over_ranks(a, &Ga, in, out, "re-profiling");
    /* one rank with another margin: every rank fails, naming it */
    igrad_config_t d = c;
    if (me == np - 1) d.reprofile_margin = 0.1;
    igrad_engine_t *x = NULL;
    CHECK_STATUS(igrad_engine_create(L, NULL, &d, comm, &x), IGRAD_E_MISMATCH);
    CHECK(strstr(igrad_last_error(), "config.reprofile_margin differs"), "message: %s",
          igrad_last_error());
    sums_free(in, T);
    sums_free(out, T);
    grads_free(&Ga);
    grads_free(&Gb);
    igrad_engine_free(a);
    igrad_engine_free(b);
    remove(path);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) rmdir(dir);
}

/* ---- agreement and faults ------------------------------------------------------------ */

static void test_mismatch(igrad_comm_t *comm, const igrad_layout_t *L, const igrad_profile_t *P)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    if (me == 1) c.density = 0.02;
    igrad_engine_t *e = (igrad_engine_t *)(uintptr_t)1;
    CHECK_STATUS(igrad_engine_create(L, P, &c, comm, &e), IGRAD_E_MISMATCH);
    CHECK(e == NULL, "engine not NULL after a failed create");
    CHECK(strstr(igrad_last_error(), "config.density differs: rank 0 has 0.01, rank 1 has 0.02"),
          "message: %s", igrad_last_error());

    igrad_profile_t *P2 = mpi_fixed_profile(L, "fixed:0.7");
    igrad_config_t d = IGRAD_CONFIG_INIT;
    d.dense_below = 0;
    CHECK_STATUS(igrad_engine_create(L, me == np - 1 ? P2 : P, &d, comm, &e), IGRAD_E_MISMATCH);
    CHECK(strstr(igrad_last_error(), "profile differs at component ("), "message: %s",
          igrad_last_error());
    igrad_profile_free(P2);

    /* an invalid config on one rank fails every rank */
    igrad_config_t x = IGRAD_CONFIG_INIT;
    x.dense_below = 0;
    if (me == 0) x.buckets = 0;
    CHECK_STATUS(igrad_engine_create(L, P, &x, comm, &e), IGRAD_E_INVALID);
    if (me != 0)
        CHECK(strstr(igrad_last_error(), "rank 0"), "message: %s", igrad_last_error());
    else
        CHECK(strstr(igrad_last_error(), "config.buckets is 0"), "message: %s",
              igrad_last_error());
}

/* ---- the dense warm-up is method dense ----------------------------------------- */

/* Runs bucket list bk (nb) with MPI here, as a caller of begin / ready does. */
static void run_buckets(const igrad_bucket_t *bk, size_t nb)
{
    for (size_t j = 0; j < nb; j++) {
        if (bk[j].kind == IGRAD_BUCKET_GATHER)
            MPI_Allgather(bk[j].send, (int)bk[j].send_nbytes, MPI_BYTE, bk[j].recv,
                          (int)bk[j].send_nbytes, MPI_BYTE, MPI_COMM_WORLD);
        else
            MPI_Allreduce(MPI_IN_PLACE, bk[j].recv, (int)bk[j].count, MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
    }
}

/* The two engines' buckets are the same collectives (kind, number, sizes). */
static void same_buckets(const igrad_bucket_t *a, size_t na, const igrad_bucket_t *b, size_t nb,
                         const char *what, int64_t s)
{
    CHECK(na == nb, "%s step %lld: %zu buckets, method dense %zu", what, (long long)s, na, nb);
    for (size_t j = 0; j < na && j < nb; j++)
        CHECK(a[j].kind == b[j].kind && a[j].index == b[j].index && a[j].count == b[j].count &&
                  a[j].send_nbytes == b[j].send_nbytes && a[j].recv_nbytes == b[j].recv_nbytes,
              "%s step %lld bucket %zu: kind %d index %d count %zu, method dense: %d %d %zu", what,
              (long long)s, j, (int)a[j].kind, a[j].index, a[j].count, (int)b[j].kind,
              b[j].index, b[j].count);
}

/* ig with momentum and start_iter 4: steps 0-3 (sync, begin/end, a
 * streamed step, sync after a save/load into a fresh engine) equal a method
 * dense engine's bit for bit with the same buckets (cut, count, sizes: the
 * all-reduce's summation order depends on them), payload 4 B/parameter and
 * residuals and velocities zero; steps 4-7 equal an engine without
 * warm-up started at step 4 (zero residuals); another start_iter on one
 * rank fails every rank's create naming config.start_iter. */
static void test_warmup_is_dense(igrad_comm_t *comm, const igrad_layout_t *L,
                                 const igrad_profile_t *P)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.block_entries = 30;
    c.buckets = 3;
    c.momentum = 0.9;
    c.start_iter = 4;
    igrad_config_t d = IGRAD_CONFIG_INIT;
    d.method = IGRAD_METHOD_DENSE;
    d.dense_below = 0;
    d.block_entries = 30;
    d.buckets = 3;
    igrad_config_t r = c;
    r.start_iter = 0;
    igrad_engine_t *w = create(L, P, &c, comm), *de = create(L, NULL, &d, comm);
    igrad_engine_t *ref = create(L, P, &r, comm);
    grads_t G = grads_new(L), H = grads_new(L);
    size_t T = G.T;
    size_t *order = calloc(T, sizeof *order);
    REQUIRE(order);
    for (size_t t = 0; t < T; t++) order[t] = T - 1 - t;
    int64_t total = igrad_layout_total_count(L);
    char dir[] = "/tmp/igrad_mpi_warm_XXXXXX", path[96];
    if (me == 0) REQUIRE(mkdtemp(dir) != NULL);
    MPI_Bcast(dir, (int)sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof path, "%s/state_%d.bin", dir, me);
    for (int64_t s = 0; s < 4; s++) {
        grads_fill(&G, me, s);
        grads_copy(&H, &G);
        const igrad_bucket_t *ba = NULL, *bb = NULL;
        size_t na = 0, nb = 0;
        if (s == 1) { /* two-phase */
            CHECK_OK(igrad_engine_begin(w, s, G.g, &ba, &na));
            CHECK_OK(igrad_engine_begin(de, s, H.g, &bb, &nb));
            same_buckets(ba, na, bb, nb, "warm-up begin", s);
            run_buckets(ba, na);
            run_buckets(bb, nb);
            CHECK_OK(igrad_engine_end(w, s, G.g));
            CHECK_OK(igrad_engine_end(de, s, H.g));
        } else if (s == 2) { /* streamed, every tensor in one ready call */
            CHECK_OK(igrad_engine_open(w, s));
            CHECK_OK(igrad_engine_open(de, s));
            float **ga = calloc(T, sizeof *ga), **gb = calloc(T, sizeof *gb);
            REQUIRE(ga && gb);
            for (size_t k = 0; k < T; k++) {
                ga[k] = G.g[order[k]];
                gb[k] = H.g[order[k]];
            }
            CHECK_OK(igrad_engine_ready(w, s, order, T, ga, &ba, &na));
            CHECK_OK(igrad_engine_ready(de, s, order, T, gb, &bb, &nb));
            same_buckets(ba, na, bb, nb, "warm-up streamed", s);
            run_buckets(ba, na);
            run_buckets(bb, nb);
            CHECK_OK(igrad_engine_close(w, s));
            CHECK_OK(igrad_engine_close(de, s));
            free(ga);
            free(gb);
        } else {
            if (s == 3) { /* the state of the warm-up into a fresh engine */
                CHECK_OK(igrad_engine_save_state(w, path));
                igrad_engine_free(w);
                w = create(L, P, &c, comm);
                CHECK_OK(igrad_engine_load_state(w, path));
                CHECK(igrad_engine_step(w) == 2, "loaded step %lld", (long long)igrad_engine_step(w));
            }
            CHECK_OK(igrad_engine_sync(w, s, G.g));
            CHECK_OK(igrad_engine_sync(de, s, H.g));
            igrad_step_stats_t sa, sb;
            CHECK_OK(igrad_engine_last_stats(w, &sa));
            CHECK_OK(igrad_engine_last_stats(de, &sb));
            CHECK(sa.buckets == sb.buckets && sa.bucket_count == sb.bucket_count &&
                      sa.reduce_buckets == sb.reduce_buckets,
                  "warm-up sync step %lld: %d buckets (%d reduce), method dense %d (%d)",
                  (long long)s, sa.buckets, sa.reduce_buckets, sb.buckets, sb.reduce_buckets);
            for (int j = 0; j < sa.bucket_count && j < sb.bucket_count; j++)
                CHECK(sa.bucket_loads[j] == sb.bucket_loads[j],
                      "warm-up sync step %lld: bucket %d holds %lld, method dense %lld",
                      (long long)s, j, (long long)sa.bucket_loads[j],
                      (long long)sb.bucket_loads[j]);
        }
        igrad_step_stats_t st;
        CHECK_OK(igrad_engine_last_stats(w, &st));
        CHECK(st.payload_nbytes == 4 * total && igrad_engine_predict_payload(w, s) == 4 * total,
              "warm-up step %lld: payload %lld", (long long)s, (long long)st.payload_nbytes);
        for (size_t t = 0; t < T; t++) {
            CHECK(memcmp(G.g[t], H.g[t], (size_t)G.n[t] * sizeof(float)) == 0,
                  "warm-up step %lld tensor %zu differs from method dense", (long long)s, t);
            const float *rv = igrad_engine_residual(w, t), *vv = igrad_engine_velocity(w, t);
            for (int64_t i = 0; i < G.n[t]; i++)
                if (rv[i] != 0.0f || vv[i] != 0.0f) {
                    CHECK(0, "warm-up step %lld tensor %zu: residual or velocity not 0",
                          (long long)s, t);
                    break;
                }
        }
        check_identical(&G, "warm-up");
    }
    for (int64_t s = 4; s < 8; s++) {
        grads_fill(&G, me, s);
        grads_copy(&H, &G);
        CHECK_OK(igrad_engine_sync(w, s, G.g));
        CHECK_OK(igrad_engine_sync(ref, s, H.g));
        for (size_t t = 0; t < T; t++)
            CHECK(memcmp(G.g[t], H.g[t], (size_t)G.n[t] * sizeof(float)) == 0 &&
                      memcmp(igrad_engine_residual(w, t), igrad_engine_residual(ref, t),
                             (size_t)G.n[t] * sizeof(float)) == 0,
                  "after the warm-up, step %lld tensor %zu: not the method from zero residuals",
                  (long long)s, t);
    }
    unlink(path);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) rmdir(dir);
    free(order);
    grads_free(&G);
    grads_free(&H);
    igrad_engine_free(w);
    igrad_engine_free(de);
    igrad_engine_free(ref);

    igrad_config_t x = c;
    if (me == np - 1) x.start_iter = 5;
    igrad_engine_t *e = (igrad_engine_t *)(uintptr_t)1;
    CHECK_STATUS(igrad_engine_create(L, P, &x, comm, &e), IGRAD_E_MISMATCH);
    CHECK(e == NULL && strstr(igrad_last_error(), "config.start_iter"), "message: %s",
          igrad_last_error());
}

/* ---- error-feedback remedies across ranks ---------------------------------- */

/* ig with momentum correction, residual decay and a dense warm-up: every
 * rank ends every step with bit-identical gradients; the warm-up steps are
 * MPI_Allreduce / P, later steps the average of what every rank's twin
 * engine (self communicator, that rank's gradients, recomputed here) sends;
 * one rank with another momentum fails every rank naming config.momentum. */
static void test_remedies(igrad_comm_t *comm, const igrad_layout_t *L, const igrad_profile_t *P)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.block_entries = 30;
    c.momentum = 0.9;
    c.start_iter = 3;
    igrad_engine_t *e = create(L, P, &c, comm);
    igrad_comm_t *self = NULL;
    REQUIRE(igrad_comm_create_self(&self) == IGRAD_OK);
    igrad_engine_t **twin = calloc((size_t)np, sizeof *twin);
    REQUIRE(twin);
    for (int r = 0; r < np; r++) twin[r] = create(L, P, &c, self);
    grads_t G = grads_new(L), S = grads_new(L), W = grads_new(L);
    for (int64_t s = 0; s < 16; s++) {
        for (size_t t = 0; t < W.T; t++) memset(W.g[t], 0, (size_t)W.n[t] * sizeof(float));
        for (int r = 0; r < np; r++) {
            grads_fill(&S, r, s);
            CHECK_OK(igrad_engine_sync(twin[r], s, S.g));
            for (size_t t = 0; t < W.T; t++)
                for (int64_t i = 0; i < W.n[t]; i++) W.g[t][i] += S.g[t][i] / (float)np;
        }
        grads_fill(&G, me, s);
        CHECK_OK(igrad_engine_sync(e, s, G.g));
        char what[64];
        snprintf(what, sizeof what, "remedies step %lld", (long long)s);
        check_identical(&G, what);
        double worst = 0.0;
        for (size_t t = 0; t < W.T; t++)
            for (int64_t i = 0; i < W.n[t]; i++) {
                double dlt = fabs((double)G.g[t][i] - (double)W.g[t][i]);
                double tol = 1e-6 * (1.0 + fabs((double)W.g[t][i]));
                if (dlt > tol && dlt > worst) worst = dlt;
            }
        CHECK(worst == 0.0, "%s: the average differs from the twins' by %g", what, worst);
        for (size_t t = 0; t < W.T; t++) {
            const float *u = igrad_engine_velocity(e, t), *ut = igrad_engine_velocity(twin[me], t);
            CHECK(u && ut && memcmp(u, ut, (size_t)W.n[t] * sizeof *u) == 0,
                  "%s: tensor %zu: velocity differs from this rank's twin", what, t);
            CHECK(memcmp(igrad_engine_residual(e, t), igrad_engine_residual(twin[me], t),
                         (size_t)W.n[t] * sizeof(float)) == 0,
                  "%s: tensor %zu: residual differs from this rank's twin", what, t);
        }
    }
    grads_free(&G);
    grads_free(&S);
    grads_free(&W);
    for (int r = 0; r < np; r++) igrad_engine_free(twin[r]);
    free(twin);
    igrad_engine_free(e);
    igrad_comm_free(self);

    igrad_config_t d = c;
    if (me == np - 1) d.momentum = 0.5;
    igrad_engine_t *x = NULL;
    CHECK_STATUS(igrad_engine_create(L, P, &d, comm, &x), IGRAD_E_MISMATCH);
    CHECK(strstr(igrad_last_error(), "config.momentum differs"), "message: %s",
          igrad_last_error());
}

static void test_nonfinite(igrad_comm_t *comm, const igrad_layout_t *L, const igrad_profile_t *P)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.verify_every = 1;
    igrad_engine_t *e = create(L, P, &c, comm);
    grads_t G = grads_new(L);
    for (int64_t s = 0; s < 3; s++) {
        grads_fill(&G, me, s);
        CHECK_OK(igrad_engine_sync(e, s, G.g));
    }
    int64_t total = igrad_layout_total_count(L);
    float *snap = malloc((size_t)total * sizeof *snap);
    REQUIRE(snap);
    int64_t off = 0;
    for (size_t t = 0; t < G.T; t++) {
        memcpy(snap + off, igrad_engine_residual(e, t), (size_t)G.n[t] * sizeof(float));
        off += G.n[t];
    }
    grads_fill(&G, me, 3);
    size_t victim = 5;
    if (me == np - 1) G.g[victim][7] = NAN;
    CHECK_STATUS(igrad_engine_sync(e, 3, G.g), IGRAD_E_NONFINITE);
    igrad_tensor_info_t ti;
    REQUIRE(igrad_layout_tensor(L, victim, &ti) == IGRAD_OK);
    CHECK(strstr(igrad_last_error(), ti.name), "message does not name %s: %s", ti.name,
          igrad_last_error());
    if (me != np - 1) {
        char want[32];
        snprintf(want, sizeof want, "rank %d", np - 1);
        CHECK(strstr(igrad_last_error(), want), "message does not name %s: %s", want,
              igrad_last_error());
    }
    off = 0;
    for (size_t t = 0; t < G.T; t++) {
        CHECK(memcmp(snap + off, igrad_engine_residual(e, t), (size_t)G.n[t] * sizeof(float)) == 0,
              "residual of tensor %zu changed by the failed step", t);
        off += G.n[t];
    }
    /* NULL pointer on one rank */
    grads_fill(&G, me, 3);
    float *keep = G.g[2];
    if (me == 0) G.g[2] = NULL;
    CHECK_STATUS(igrad_engine_sync(e, 3, G.g), IGRAD_E_INVALID);
    G.g[2] = keep;
    /* the step can be retried on every rank */
    CHECK_OK(igrad_engine_sync(e, 3, G.g));
    check_identical(&G, "after a skipped step");
    free(snap);
    grads_free(&G);
    igrad_engine_free(e);
}

/* ---- step skew ------------------------------------------------------------------------ */

/* The last rank passes step s + 1 while the others pass s (a counter off by
 * one): every rank must fail with IGRAD_E_MISMATCH naming both steps, with
 * residuals unchanged and the engine still usable, instead of unpacking the
 * other ranks' buckets with its own plan. */
static void skew_one(igrad_comm_t *comm, const igrad_layout_t *L, const igrad_profile_t *P,
                     igrad_config_t c, int two_phase, const char *what)
{
    igrad_engine_t *e = create(L, P, &c, comm);
    grads_t G = grads_new(L);
    int64_t s = 0;
    for (; s < 2; s++) {
        grads_fill(&G, me, s);
        CHECK_OK(igrad_engine_sync(e, s, G.g));
    }
    int64_t total = igrad_layout_total_count(L);
    float *snap = malloc((size_t)total * sizeof *snap);
    REQUIRE(snap);
    int64_t off = 0;
    for (size_t t = 0; t < G.T; t++) {
        const float *r = igrad_engine_residual(e, t);
        if (r) memcpy(snap + off, r, (size_t)G.n[t] * sizeof(float));
        off += G.n[t];
    }
    int64_t mine = me == np - 1 ? s + 1 : s;
    grads_fill(&G, me, mine);
    if (two_phase) {
        const igrad_bucket_t *bk = NULL;
        size_t nb = 0;
        CHECK_STATUS(igrad_engine_begin(e, mine, G.g, &bk, &nb), IGRAD_E_MISMATCH);
        CHECK(nb == 0, "%s: %zu buckets after a failed begin", what, nb);
    } else {
        CHECK_STATUS(igrad_engine_sync(e, mine, G.g), IGRAD_E_MISMATCH);
    }
    char want[128];
    snprintf(want, sizeof want, "step differs: rank 0 has %lld, rank %d has %lld",
             (long long)s, np - 1, (long long)(s + 1));
    CHECK(strstr(igrad_last_error(), want), "%s: message does not say \"%s\": %s", what, want,
          igrad_last_error());
    off = 0;
    for (size_t t = 0; t < G.T; t++) {
        const float *r = igrad_engine_residual(e, t);
        if (r)
            CHECK(memcmp(snap + off, r, (size_t)G.n[t] * sizeof(float)) == 0,
                  "%s: residual of tensor %zu changed by the refused step", what, t);
        off += G.n[t];
    }
    /* detected at the agreement: nothing is broken, the step can be redone */
    grads_fill(&G, me, s);
    CHECK_OK(igrad_engine_sync(e, s, G.g));
    check_identical(&G, what);
    free(snap);
    grads_free(&G);
    igrad_engine_free(e);
}

static void test_step_skew(igrad_comm_t *comm, const igrad_layout_t *L, const igrad_profile_t *P)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_TOPK_SYNC; /* flat indices */
    c.density = 0.05;
    c.block_entries = 30;
    c.collective = IGRAD_COLLECTIVE_GATHER;
    skew_one(comm, L, P, c, 0, "skew topk_sync");
    c.method = IGRAD_METHOD_ADTOPK_SYNC; /* row-wise on even steps, flat on odd */
    c.interleave = 1;
    skew_one(comm, L, P, c, 0, "skew adtopk_sync + interleave");
    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.block_entries = 30;
    c.collective = IGRAD_COLLECTIVE_GATHER;
    skew_one(comm, L, P, c, 0, "skew ig (gather)");
    skew_one(comm, L, P, c, 1, "skew ig (gather, two-phase)");
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    skew_one(comm, L, P, c, 0, "skew ig (reduce)");
}

/* ---- bad bytes from a peer ------------------------------------------------------------ */

/* A custom communicator over MPI whose iallgather, once armed, overwrites
 * the bytes of rank `victim` in the received buffer with 0xff (values NaN,
 * every index out of range) — on every rank, as a peer sending bad bytes
 * would look. The blocking callbacks (the per-step agreement) are left
 * alone. */
typedef struct corrupt_comm {
    MPI_Comm comm;
    int armed, victim;
    int64_t corrupted; /* buckets corrupted */
} corrupt_comm_t;

static MPI_Datatype cc_dtype(igrad_dtype_t d)
{
    return d == IGRAD_DTYPE_F32 ? MPI_FLOAT : d == IGRAD_DTYPE_F64 ? MPI_DOUBLE : MPI_INT64_T;
}

static igrad_status_t cc_allgather(void *user, const void *send, size_t nbytes, void *recv)
{
    corrupt_comm_t *cc = user;
    const void *s = send == (const unsigned char *)recv + (size_t)me * nbytes ? MPI_IN_PLACE
                                                                              : send;
    return MPI_Allgather(s, (int)nbytes, MPI_BYTE, recv, (int)nbytes, MPI_BYTE, cc->comm) ==
                   MPI_SUCCESS
               ? IGRAD_OK
               : IGRAD_E_COMM;
}

static igrad_status_t cc_allreduce(void *user, const void *send, void *recv, size_t count,
                                   igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    corrupt_comm_t *cc = user;
    MPI_Op o = op == IGRAD_REDUCE_MAX ? MPI_MAX : op == IGRAD_REDUCE_MIN ? MPI_MIN : MPI_SUM;
    return MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, cc_dtype(dtype), o,
                         cc->comm) == MPI_SUCCESS
               ? IGRAD_OK
               : IGRAD_E_COMM;
}

static igrad_status_t cc_bcast(void *user, void *buf, size_t nbytes, int root)
{
    corrupt_comm_t *cc = user;
    return MPI_Bcast(buf, (int)nbytes, MPI_BYTE, root, cc->comm) == MPI_SUCCESS ? IGRAD_OK
                                                                                : IGRAD_E_COMM;
}

static igrad_status_t cc_barrier(void *user)
{
    corrupt_comm_t *cc = user;
    return MPI_Barrier(cc->comm) == MPI_SUCCESS ? IGRAD_OK : IGRAD_E_COMM;
}

static igrad_status_t cc_iallgather(void *user, const void *send, size_t nbytes, void *recv,
                                    void **handle)
{
    corrupt_comm_t *cc = user;
    *handle = NULL; /* completed here */
    igrad_status_t st = cc_allgather(user, send, nbytes, recv);
    if (st == IGRAD_OK && cc->armed) {
        memset((unsigned char *)recv + (size_t)cc->victim * nbytes, 0xff, nbytes);
        cc->corrupted++;
    }
    return st;
}

static igrad_status_t cc_iallreduce(void *user, const void *send, void *recv, size_t count,
                                    igrad_dtype_t dtype, igrad_reduce_op_t op, void **handle)
{
    *handle = NULL;
    return cc_allreduce(user, send, recv, count, dtype, op);
}

static igrad_status_t cc_wait(void *user, void *handle)
{
    (void)user, (void)handle; /* never called: every handle is NULL */
    return IGRAD_OK;
}

/* After a failure past the agreement every later call fails fast with
 * IGRAD_E_STATE quoting the first error (`first`). */
static void check_broken(igrad_engine_t *e, grads_t *G, int64_t step, const char *first,
                         const char *what)
{
    const igrad_bucket_t *bk = NULL;
    size_t nb = 0;
    CHECK_STATUS(igrad_engine_sync(e, step, G->g), IGRAD_E_STATE);
    CHECK(strstr(igrad_last_error(), "unusable") && strstr(igrad_last_error(), first),
          "%s: sync on a broken engine: %s", what, igrad_last_error());
    CHECK_STATUS(igrad_engine_begin(e, step, G->g, &bk, &nb), IGRAD_E_STATE);
    CHECK_STATUS(igrad_engine_end(e, step, G->g), IGRAD_E_STATE);
    CHECK_STATUS(igrad_engine_save_state(e, "/nonexistent/never-written.bin"), IGRAD_E_STATE);
    CHECK(strstr(igrad_last_error(), first), "%s: save_state: %s", what, igrad_last_error());
    CHECK_STATUS(igrad_engine_load_state(e, "/nonexistent/never-read.bin"), IGRAD_E_STATE);
}

static void bad_bytes_one(const igrad_layout_t *L, const igrad_profile_t *P, igrad_config_t c,
                          int two_phase, const char *what)
{
    corrupt_comm_t cc = {MPI_COMM_NULL, 0, np - 1, 0};
    REQUIRE(MPI_Comm_dup(MPI_COMM_WORLD, &cc.comm) == MPI_SUCCESS);
    igrad_comm_ops_t ops = {.size = sizeof ops,
                            .allgather = cc_allgather,
                            .allreduce = cc_allreduce,
                            .bcast = cc_bcast,
                            .barrier = cc_barrier,
                            .iallgather = cc_iallgather,
                            .iallreduce = cc_iallreduce,
                            .wait = cc_wait};
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_custom(&ops, &cc, me, np, &comm) == IGRAD_OK);
    igrad_engine_t *e = create(L, P, &c, comm);
    grads_t G = grads_new(L);
    for (int64_t s = 0; s < 2; s++) {
        grads_fill(&G, me, s);
        CHECK_OK(igrad_engine_sync(e, s, G.g));
    }
    grads_fill(&G, me, 2);
    cc.armed = 1;
    if (two_phase) {
        const igrad_bucket_t *bk = NULL;
        size_t nb = 0;
        CHECK_OK(igrad_engine_begin(e, 2, G.g, &bk, &nb));
        for (size_t j = 0; j < nb; j++) {
            void *h = NULL;
            if (bk[j].kind == IGRAD_BUCKET_GATHER)
                CHECK(cc_iallgather(&cc, bk[j].send, bk[j].send_nbytes, bk[j].recv, &h) ==
                          IGRAD_OK,
                      "%s: allgather", what);
            else
                CHECK(cc_iallreduce(&cc, bk[j].recv, bk[j].recv, bk[j].count, IGRAD_DTYPE_F32,
                                    IGRAD_REDUCE_SUM, &h) == IGRAD_OK,
                      "%s: allreduce", what);
        }
        CHECK_STATUS(igrad_engine_end(e, 2, G.g), IGRAD_E_COMM);
    } else {
        CHECK_STATUS(igrad_engine_sync(e, 2, G.g), IGRAD_E_COMM);
    }
    cc.armed = 0;
    CHECK(cc.corrupted > 0, "%s: no gather bucket was corrupted", what);
    char want[64];
    snprintf(want, sizeof want, "rank %d sent ", np - 1); /* "index …" (fixed) or "a bad … index code" (compact) */
    const char *msg = igrad_last_error();
    CHECK(strstr(msg, want) && strstr(msg, "bucket ") && strstr(msg, "for tensor model."),
          "%s: message does not name the rank, bucket and tensor: %s", what, msg);
    check_broken(e, &G, 3, want, what);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    MPI_Comm_free(&cc.comm);
}

static void test_bad_peer_bytes(const igrad_layout_t *L, const igrad_profile_t *P)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_TOPK_SYNC; /* flat indices */
    c.density = 0.05;
    c.block_entries = 30;
    c.collective = IGRAD_COLLECTIVE_GATHER;
    bad_bytes_one(L, P, c, 0, "bad bytes topk_sync");
    c.method = IGRAD_METHOD_ADTOPK_SYNC; /* row-wise (column indices) at even steps */
    bad_bytes_one(L, P, c, 0, "bad bytes adtopk_sync");
    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.collective = IGRAD_COLLECTIVE_GATHER;
    bad_bytes_one(L, P, c, 0, "bad bytes ig");
    bad_bytes_one(L, P, c, 1, "bad bytes ig (two-phase)");
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_layout_t *L = mpi_llama_layout(200);
    igrad_profile_t *P = mpi_fixed_profile(L, "fixed:0.4");

    test_topk_sync(comm, L);
    test_dense(comm, L);
    test_ig(comm, L, P);
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.block_entries = 30;
    two_phase_vs_sync(comm, L, P, c, 1, "two-phase ig (gather)");
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    two_phase_vs_sync(comm, L, P, c, np == 2, "two-phase ig (reduce)");
    c.method = IGRAD_METHOD_IAD;
    c.collective = IGRAD_COLLECTIVE_AUTO;
    two_phase_vs_sync(comm, L, P, c, 1, "two-phase iad");
    test_resume(comm, L, P);
    test_online(comm, L);
    test_reprofile(comm, L);
    test_mismatch(comm, L, P);
    test_remedies(comm, L, P);
    test_warmup_is_dense(comm, L, P);
    test_nonfinite(comm, L, P);
    test_step_skew(comm, L, P);
    test_bad_peer_bytes(L, P);

    igrad_profile_free(P);
    igrad_layout_free(L);
    igrad_comm_free(comm);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("mpi_engine on %d ranks: %d failure(s)\n", np, total);
    MPI_Finalize();
    return total ? 1 : 0;
}
