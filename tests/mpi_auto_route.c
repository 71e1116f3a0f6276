/*
 * mpi_auto_route.c — `collective = auto` with config.auto_sparse_reduce
 * (route.c's α-β choice among gather, reduce and the sparse all-reduce)
 * under mpirun (CTest: -np 4).
 *
 *  - a link (searched in a fixed list, the first that mixes) where auto
 *    takes the sparse all-reduce for some buckets and gather or reduce for
 *    others (fixed index widths: at 4 ranks the fitted price of the
 *    sparse all-reduce, route.h, beats the gather only above 7.2 gather
 *    bytes an entry, i.e. where the indices are 32-bit: the model's
 *    3,000-row embedding), by a plan-only engine of the same config; the real engine's
 *    statistics count the same routes, its payload equals the plan's;
 *  - bucket by bucket: after step 0 every tensor's gradient and residual
 *    equal those of an engine forcing its bucket's route (gather, reduce or
 *    sparse_reduce) bit for bit (the inputs are multiples of 2^-10, so the
 *    sums are exact); some tensors only the sparse all-reduce explains,
 *    some only gather/reduce;
 *  - STEPS steps: every rank's result is the same;
 *  - without the opt-in, and under igrad_engine_begin (which cannot run
 *    it), the same link never takes the sparse all-reduce;
 *  - one rank with another link_latency_ns, link_bandwidth_mbps or
 *    auto_sparse_reduce: IGRAD_E_MISMATCH at create on every rank, naming
 *    the field.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "igrad.h"

#include "mpi_util.h"

#define STEPS 4
#define MAXB 64

static igrad_config_t config_of(int64_t latency_ns, int64_t mbps)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.sparsifier = IGRAD_SPARSIFIER_TOPK;
    c.density = 0.05;
    c.buckets = 8;
    c.threads = 1;
    c.timeout_s = 60;
    c.link_latency_ns = latency_ns;
    c.link_bandwidth_mbps = mbps;
    c.auto_sparse_reduce = 1;
    /* fixed index widths: at 4 ranks auto's fitted price of the sparse
     * all-reduce (17 alpha + 9/5 of its bytes, 8 an entry, route.h) beats
     * the gather only above 7.2 gather bytes an entry, i.e. with F32
     * values only where the indices are 32-bit (the model's embedding of
     * 3,000 x 24 entries); the other tensors' 16-bit indices (6 bytes an
     * entry) keep theirs on the gather: the mix this test checks (with
     * the default compact codes, about 5 bytes an entry, none takes it) */
    c.index_code = IGRAD_INDEX_CODE_FIXED;
    return c;
}

static int same_floats(const float *a, const float *b, int64_t n)
{
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* The routes a plan-only engine gives step `step`: counts per kind. */
static void plan_counts(const mpi_model_t *m, const igrad_config_t *c, int64_t step, int cnt[3],
                        int64_t *payload)
{
    igrad_engine_t *p = NULL;
    REQUIRE(igrad_engine_create_plan(m->L, NULL, c, np, &p) == IGRAD_OK);
    igrad_planned_bucket_t b[MAXB];
    size_t nb = 0;
    igrad_step_stats_t st;
    REQUIRE(igrad_engine_plan_step(p, step, &st, b, MAXB, &nb) == IGRAD_OK);
    cnt[0] = cnt[1] = cnt[2] = 0;
    for (size_t j = 0; j < nb; j++) cnt[b[j].kind == IGRAD_BUCKET_SPARSE_REDUCE ? 2
                                         : b[j].kind == IGRAD_BUCKET_REDUCE  ? 1
                                                                              : 0]++;
    *payload = st.payload_nbytes;
    igrad_engine_free(p);
}

static igrad_engine_t *create(const mpi_model_t *m, const igrad_config_t *c, igrad_comm_t *comm)
{
    igrad_engine_t *e = NULL;
    REQUIRE(igrad_engine_create(m->L, NULL, c, comm, &e) == IGRAD_OK);
    return e;
}

/* The same gradients on every rank (rank 0's bytes broadcast). */
static void same_on_every_rank(const mpi_model_t *m, float **g, const char *what)
{
    for (size_t t = 0; t < m->T; t++) {
        float *b = malloc((size_t)m->n[t] * sizeof *b);
        REQUIRE(b);
        memcpy(b, g[t], (size_t)m->n[t] * sizeof *b);
        MPI_Bcast(b, (int)m->n[t], MPI_FLOAT, 0, MPI_COMM_WORLD);
        CHECK(same_floats(b, g[t], m->n[t]), "%s: gradient of %s differs from rank 0's", what,
              m->info[t].name);
        free(b);
    }
}

static void mixed(const mpi_model_t *m, igrad_comm_t *comm)
{
    /* the first link of the list whose plan mixes the routes (100g first) */
    static const int64_t lat[] = {8000, 5000, 3000, 1000, 0, 15000, 25000, 50000};
    igrad_config_t c = config_of(0, 100000);
    int cnt[3] = {0, 0, 0}, found = 0;
    int64_t plan_payload = 0;
    for (size_t i = 0; i < sizeof lat / sizeof lat[0] && !found; i++) {
        c = config_of(lat[i], 100000);
        plan_counts(m, &c, 0, cnt, &plan_payload);
        found = cnt[2] > 0 && cnt[0] + cnt[1] > 0;
    }
    CHECK(found, "no link of the list mixes the sparse all-reduce with gather/reduce (last: "
                 "%d gather, %d reduce, %d sparse all-reduce)", cnt[0], cnt[1], cnt[2]);
    if (!found) return;
    if (me == 0)
        printf("mixed at link %lld ns, %lld Mbit/s: %d gather, %d reduce, %d sparse all-reduce\n",
               (long long)c.link_latency_ns, (long long)c.link_bandwidth_mbps, cnt[0], cnt[1],
               cnt[2]);

    /* step 0: the auto engine against the forced routes, tensor by tensor */
    igrad_config_t f[3] = {c, c, c};
    f[0].collective = IGRAD_COLLECTIVE_GATHER;
    f[1].collective = IGRAD_COLLECTIVE_REDUCE;
    f[2].collective = IGRAD_COLLECTIVE_SPARSE_REDUCE;
    igrad_engine_t *a = create(m, &c, comm), *fe[3];
    float **g = mpi_grads_alloc(m), **h[3];
    mpi_grads_fill(m, g, me, 0);
    CHECK_OK(igrad_engine_sync(a, 0, g));
    for (int r = 0; r < 3; r++) {
        fe[r] = create(m, &f[r], comm);
        h[r] = mpi_grads_alloc(m);
        mpi_grads_fill(m, h[r], me, 0);
        CHECK_OK(igrad_engine_sync(fe[r], 0, h[r]));
    }
    igrad_step_stats_t st;
    CHECK_OK(igrad_engine_last_stats(a, &st));
    CHECK(st.gather_buckets == cnt[0] && st.reduce_buckets == cnt[1] &&
              st.sparse_reduce_buckets == cnt[2],
          "engine: %d gather, %d reduce, %d sparse all-reduce; plan: %d, %d, %d",
          st.gather_buckets, st.reduce_buckets, st.sparse_reduce_buckets, cnt[0], cnt[1], cnt[2]);
    CHECK(st.payload_nbytes == plan_payload, "payload %lld, the plan's %lld",
          (long long)st.payload_nbytes, (long long)plan_payload);
    int only_sar = 0, only_dense_or_gather = 0;
    for (size_t t = 0; t < m->T; t++) {
        int match[3];
        for (int r = 0; r < 3; r++) {
            const float *ra = igrad_engine_residual(a, t), *rf = igrad_engine_residual(fe[r], t);
            match[r] = same_floats(g[t], h[r][t], m->n[t]) && ra && rf &&
                       same_floats(ra, rf, m->n[t]);
        }
        CHECK(match[0] || match[1] || match[2],
              "tensor %s: auto's gradient and residual match no forced route", m->info[t].name);
        only_sar += match[2] && !match[0] && !match[1];
        only_dense_or_gather += !match[2] && (match[0] || match[1]);
    }
    CHECK(only_sar > 0 && only_dense_or_gather > 0,
          "%d tensors only the sparse all-reduce explains, %d only gather/reduce", only_sar,
          only_dense_or_gather);

    /* more steps: every rank alike, the same routes as the plan */
    for (int64_t step = 1; step < STEPS; step++) {
        mpi_grads_fill(m, g, me, step);
        CHECK_OK(igrad_engine_sync(a, step, g));
        same_on_every_rank(m, g, "auto with the sparse all-reduce");
        int pc[3];
        int64_t pp;
        plan_counts(m, &c, step, pc, &pp);
        CHECK_OK(igrad_engine_last_stats(a, &st));
        CHECK(st.sparse_reduce_buckets == pc[2] && st.payload_nbytes == pp,
              "step %lld: %d sparse all-reduce buckets (plan %d), payload %lld (plan %lld)",
              (long long)step, st.sparse_reduce_buckets, pc[2], (long long)st.payload_nbytes,
              (long long)pp);
    }

    /* the two-phase API cannot run it: begin gives gather/reduce only */
    const igrad_bucket_t *bk = NULL;
    size_t nb = 0;
    mpi_grads_fill(m, g, me, STEPS);
    CHECK_OK(igrad_engine_begin(a, STEPS, g, &bk, &nb));
    for (size_t j = 0; j < nb; j++)
        CHECK(bk[j].kind != IGRAD_BUCKET_SPARSE_REDUCE, "begin: bucket %zu is a sparse "
              "all-reduce", j);
    for (size_t j = 0; j < nb; j++) {
        if (bk[j].kind == IGRAD_BUCKET_GATHER)
            MPI_Allgather(bk[j].send, (int)bk[j].send_nbytes, MPI_BYTE, bk[j].recv,
                          (int)bk[j].send_nbytes, MPI_BYTE, MPI_COMM_WORLD);
        else
            MPI_Allreduce(MPI_IN_PLACE, bk[j].recv, (int)bk[j].count, MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
    }
    CHECK_OK(igrad_engine_end(a, STEPS, g));

    /* without the opt-in the same link never takes it */
    igrad_config_t off = c;
    off.auto_sparse_reduce = 0;
    int oc[3];
    int64_t op;
    plan_counts(m, &off, 0, oc, &op);
    CHECK(oc[2] == 0, "auto_sparse_reduce 0: the plan has %d sparse all-reduce buckets", oc[2]);
    igrad_engine_t *o = create(m, &off, comm);
    mpi_grads_fill(m, g, me, 0);
    CHECK_OK(igrad_engine_sync(o, 0, g));
    CHECK_OK(igrad_engine_last_stats(o, &st));
    CHECK(st.sparse_reduce_buckets == 0 && st.gather_buckets == oc[0] &&
              st.reduce_buckets == oc[1],
          "auto_sparse_reduce 0: %d sparse all-reduce, %d gather, %d reduce buckets",
          st.sparse_reduce_buckets, st.gather_buckets, st.reduce_buckets);
    igrad_engine_free(o);

    for (int r = 0; r < 3; r++) {
        igrad_engine_free(fe[r]);
        mpi_grads_free(m, h[r]);
    }
    igrad_engine_free(a);
    mpi_grads_free(m, g);
}

/* One rank (the last) with another value of a link field. */
static void mismatch(const mpi_model_t *m, igrad_comm_t *comm, int field, const char *name)
{
    igrad_config_t c = config_of(5000, 100000);
    if (me == np - 1) {
        if (field == 0) c.link_latency_ns += 1;
        if (field == 1) c.link_bandwidth_mbps = 25000;
        if (field == 2) c.auto_sparse_reduce = 0;
    }
    igrad_engine_t *e = NULL;
    CHECK_STATUS(igrad_engine_create(m->L, NULL, &c, comm, &e), IGRAD_E_MISMATCH);
    CHECK(strstr(igrad_last_error(), name) != NULL, "mismatch of %s: message \"%s\"", name,
          igrad_last_error());
    igrad_engine_free(e);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    mpi_model_t m;
    mpi_model_init_vocab(&m, 3000); /* an embedding with 32-bit indices */
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);

    mixed(&m, comm);
    mismatch(&m, comm, 0, "config.link_latency_ns");
    mismatch(&m, comm, 1, "config.link_bandwidth_mbps");
    mismatch(&m, comm, 2, "config.auto_sparse_reduce");

    igrad_comm_free(comm);
    mpi_model_free(&m);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0)
        printf("mpi_auto_route (np %d): %s (%d failures)\n", np, total ? "FAIL" : "ok", total);
    MPI_Finalize();
    return total ? 1 : 0;
}
