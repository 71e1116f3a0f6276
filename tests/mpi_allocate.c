/*
 * mpi_allocate.c — ig's budget allocation (config.allocation BUDGET,
 * decision 0059) decided bit-identically on every rank: an online-profiled
 * ig engine whose ranks hold different gradients switches to its
 * allocation after W steps; the ranks arrive at each step in one order in
 * the first run (rank r waits r ms) and in the reverse order in the second.
 * Every rank's plan (per tensor: every step or not, phase, budgets) must be
 * the same in both runs and on every rank, equal to the allocation each
 * rank computes from the engine's built profile itself, deferring some
 * components at kappas of their own, within the target, and differ from
 * the plan of the same run under the partition.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "igrad.h"
#include "plan/allocate.h"

#include "mpi_util.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Rank r's gradient: a per-tensor scale (so the components score apart)
 * times a rank- and step-dependent value. */
static void fill(float **g, const igrad_layout_t *L, int rank, int64_t step)
{
    for (size_t t = 0; t < igrad_layout_count(L); t++) {
        igrad_tensor_info_t ti;
        REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
        float scale = 0.1f + 0.3f * (float)((t * 5) % 7);
        for (int64_t i = 0; i < ti.count; i++) {
            uint64_t u = mix64(mix64((uint64_t)rank * 131u + 7u) ^ mix64((uint64_t)step * 977u + t) ^
                               (uint64_t)i * 0x9e3779b97f4a7c15ULL);
            g[t][i] = scale * ((float)((double)(u >> 40) / 16777216.0) * 2.0f - 1.0f);
        }
    }
}

static uint64_t plan_fingerprint(const igrad_engine_t *e, size_t T)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_plan_t tp;
        CHECK_OK(igrad_engine_tensor_plan(e, t, &tp));
        int64_t v[5] = {tp.every_step, tp.important, tp.phase, tp.count, tp.release_count};
        const unsigned char *p = (const unsigned char *)v;
        for (size_t i = 0; i < sizeof v; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    }
    return h;
}

static void check_same(uint64_t h, const char *what)
{
    uint64_t lo = 0, hi = 0;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lo == hi, "%s differs between ranks (%llx here)", what, (unsigned long long)h);
}

/* One run: W + 2 steps, rank r waiting wait(r) ms before each. Returns the
 * plan's fingerprint after the switch and checks it against the
 * allocation this rank computes from the engine's profile. */
static uint64_t run(igrad_comm_t *comm, const igrad_layout_t *L, const igrad_config_t *c,
                    int reverse)
{
    int budget = c->allocation == IGRAD_ALLOCATION_BUDGET;
    size_t T = igrad_layout_count(L);
    float **g = calloc(T, sizeof *g);
    REQUIRE(g);
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
        g[t] = calloc((size_t)ti.count, sizeof(float));
        REQUIRE(g[t]);
    }
    igrad_engine_t *e = NULL;
    CHECK_OK(igrad_engine_create(L, NULL, c, comm, &e));
    REQUIRE(e);
    for (int64_t s = 0; s < c->profile_steps + 2; s++) {
        sleep_ms(reverse ? np - 1 - me : me);
        fill(g, L, me, s);
        CHECK_OK(igrad_engine_sync(e, s, g));
    }
    uint64_t h = plan_fingerprint(e, T);
    if (!budget) goto done;

    /* the allocation of the engine's own profile, computed here */
    const igrad_profile_t *p = igrad_engine_profile(e);
    REQUIRE(p);
    size_t C = igrad_layout_component_count(L);
    unsigned char *every = calloc(C, 1);
    double *keep = calloc(C, sizeof *keep), ratio = 0.0;
    REQUIRE(every && keep);
    int met = 0;
    CHECK_OK(igrad__allocate(L, p, c, c->target_ratio, every, keep, &ratio, &met));
    CHECK(met && ratio <= c->target_ratio, "allocation ratio %g, met %d", ratio, met);
    int deferred = 0, kappas = 0;
    double first = 0.0;
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_plan_t tp;
        igrad_tensor_info_t ti;
        CHECK_OK(igrad_engine_tensor_plan(e, t, &tp));
        REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
        if (ti.component < 0) continue;
        CHECK(tp.every_step == every[ti.component], "tensor %s: every_step %d, allocation %d",
              ti.name, tp.every_step, every[ti.component]);
        if (every[ti.component]) continue;
        deferred++;
        if (first == 0.0) first = keep[ti.component];
        else if (keep[ti.component] != first) kappas = 1;
    }
    CHECK(deferred > 0 && kappas, "deferred tensors %d, more than one kappa %d", deferred, kappas);
    free(every);
    free(keep);
done:
    igrad_engine_free(e);
    for (size_t t = 0; t < T; t++) free(g[t]);
    free(g);
    return h;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_layout_t *L = mpi_llama_layout(200);

    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.block_entries = 40;
    c.profile_steps = 4;
    c.target_ratio = 0.3;
    c.allocation = IGRAD_ALLOCATION_BUDGET;
    uint64_t a = run(comm, L, &c, 0), b = run(comm, L, &c, 1);
    check_same(a, "the allocated plan (rank r first)");
    check_same(b, "the allocated plan (rank r last)");
    CHECK(a == b, "the allocated plan depends on the ranks' order of arrival");
    /* the partition (igrad_target_fit's prefix at one kappa) of the same
     * run plans otherwise */
    c.allocation = IGRAD_ALLOCATION_PARTITION;
    CHECK(run(comm, L, &c, 0) != a, "the budget plan equals the partition's");

    igrad_layout_free(L);
    igrad_comm_free(comm);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("mpi_allocate on %d ranks: %d failure(s)\n", np, total);
    MPI_Finalize();
    return total ? 1 : 0;
}
