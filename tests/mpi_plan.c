/*
 * mpi_plan.c — a plan-only engine (igrad_engine_create_plan, what `igrad
 * plan` reports) against a real engine over MPI on the same layout and
 * ranks (CTest runs it with -np 2 and -np 4). For dense, topk_sync,
 * adtopk_sync (interleaved), ig and iad, under collective auto at a low
 * and a high density (auto picks reduce buckets at P = 4), forced gather
 * and forced reduce, and the pack policies contiguous and risk: over two
 * full release cycles every step's planned statistics (payload and wire
 * bytes, buckets by route, bucket loads, tensors and entries sent,
 * deferred and released components) equal what the real engine measured
 * (igrad_engine_last_stats), and the planned buckets equal the buckets
 * the two-phase API hands out (kind, index, bytes), whose collectives this
 * test runs with MPI itself. The same with a link (config.link_latency_ns,
 * link_bandwidth_mbps: auto's α-β choice) and, at P = 4, a link latency of
 * 1 s that leaves no reduce bucket where bytes alone chose some. With
 * config.auto_sparse_reduce (igrad_engine_sync, which alone runs the
 * sparse all-reduce; fixed 32-bit indices, so that its fitted price takes
 * it at P = 4): every step's payload, buckets by route (sparse
 * all-reduce included) and entries equal the plan's (wire bytes not: the
 * engine counts what its sparse all-reduce moved, the plan gives the
 * balanced model). Also: a plan-only engine refuses to run steps,
 * a real engine refuses to plan, and bad arguments are named.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "igrad.h"

#include "mpi_util.h"

/* Gradients from (rank, step, tensor, index). */
static void fill(float **g, const int64_t *n, size_t T, int64_t step)
{
    for (size_t t = 0; t < T; t++)
        for (int64_t i = 0; i < n[t]; i++) {
            uint64_t h = mix64(((uint64_t)me << 48) ^ ((uint64_t)step << 32) ^
                               ((uint64_t)t << 24) ^ (uint64_t)i);
            g[t][i] = (float)((double)(h >> 11) / 9007199254740992.0 - 0.5);
        }
}

static void compare_stats(const igrad_step_stats_t *p, const igrad_step_stats_t *m,
                          const char *what, int64_t step)
{
#define SAME(f, fmt)                                                                        \
    CHECK(p->f == m->f, "%s step %lld: " #f " planned " fmt ", measured " fmt, what,       \
          (long long)step, p->f, m->f)
    CHECK(p->payload_nbytes == m->payload_nbytes,
          "%s step %lld: payload_nbytes planned %lld, measured %lld", what, (long long)step,
          (long long)p->payload_nbytes, (long long)m->payload_nbytes);
    SAME(wire_nbytes, "%.17g");
    SAME(buckets, "%d");
    SAME(gather_buckets, "%d");
    SAME(reduce_buckets, "%d");
    SAME(bucket_count, "%d");
    CHECK(p->tensors_sent == m->tensors_sent && p->entries_sent == m->entries_sent,
          "%s step %lld: tensors/entries sent planned %lld/%lld, measured %lld/%lld", what,
          (long long)step, (long long)p->tensors_sent, (long long)p->entries_sent,
          (long long)m->tensors_sent, (long long)m->entries_sent);
    SAME(deferred_components, "%d");
    SAME(released_components, "%d");
    SAME(imbalance, "%.17g");
    SAME(overflow, "%d");
#undef SAME
    for (int j = 0; j < p->bucket_count && j < m->bucket_count; j++)
        CHECK(p->bucket_loads[j] == m->bucket_loads[j],
              "%s step %lld: bucket %d load planned %lld, measured %lld", what, (long long)step,
              j, (long long)p->bucket_loads[j], (long long)m->bucket_loads[j]);
}

/* One F32 gradient buffer per tensor of L and their entry counts. */
static float **grads_alloc(const igrad_layout_t *L, int64_t **n_out)
{
    size_t T = igrad_layout_count(L);
    int64_t *n = calloc(T, sizeof *n);
    float **g = calloc(T, sizeof *g);
    REQUIRE(n && g);
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
        n[t] = ti.count;
        g[t] = malloc((size_t)ti.count * sizeof **g);
        REQUIRE(g[t]);
    }
    *n_out = n;
    return g;
}

static void grads_free(float **g, int64_t *n, size_t T)
{
    for (size_t t = 0; t < T; t++) free(g[t]);
    free(g);
    free(n);
}

/* Two cycles of config c: real engine (two-phase, MPI collectives run
 * here) vs plan-only engine. */
static void plan_vs_engine(igrad_comm_t *comm, const igrad_layout_t *L,
                           const igrad_profile_t *prof, igrad_config_t c, const char *what)
{
    const igrad_profile_t *pr = (c.method == IGRAD_METHOD_IG || c.method == IGRAD_METHOD_IAD)
                                    ? prof
                                    : NULL;
    igrad_engine_t *e = NULL, *plan = NULL;
    REQUIRE(igrad_engine_create(L, pr, &c, comm, &e) == IGRAD_OK);
    REQUIRE(igrad_engine_create_plan(L, pr, &c, np, &plan) == IGRAD_OK);
    size_t T = igrad_layout_count(L);
    int64_t *n = NULL;
    float **g = grads_alloc(L, &n);
    size_t cap = T;
    igrad_planned_bucket_t *pb = calloc(cap, sizeof *pb);
    REQUIRE(pb);
    int64_t steps = 2 * 2 * c.release_period; /* two cycles, both parities */
    int64_t payload_total = 0;
    for (int64_t s = 0; s < steps; s++) {
        fill(g, n, T, s);
        const igrad_bucket_t *bk = NULL;
        size_t nb = 0, npb = 0;
        igrad_step_stats_t ps, ms;
        CHECK_OK(igrad_engine_plan_step(plan, s, &ps, pb, cap, &npb));
        CHECK_OK(igrad_engine_begin(e, s, g, &bk, &nb));
        CHECK(nb == npb, "%s step %lld: %zu buckets, planned %zu", what, (long long)s, nb, npb);
        for (size_t j = 0; j < nb; j++) {
            if (j < npb) {
                CHECK(bk[j].kind == pb[j].kind && bk[j].index == pb[j].index,
                      "%s step %lld bucket %zu: kind %d index %d, planned %d %d", what,
                      (long long)s, j, (int)bk[j].kind, bk[j].index, (int)pb[j].kind,
                      pb[j].index);
                int64_t bytes = bk[j].kind == IGRAD_BUCKET_GATHER
                                    ? (int64_t)bk[j].send_nbytes
                                    : (int64_t)(bk[j].count * sizeof(float));
                CHECK(bytes == pb[j].payload_nbytes, "%s step %lld bucket %zu: %lld bytes, "
                      "planned %lld", what, (long long)s, j, (long long)bytes,
                      (long long)pb[j].payload_nbytes);
                if (bk[j].kind == IGRAD_BUCKET_REDUCE)
                    CHECK((int64_t)bk[j].count == pb[j].dense_count,
                          "%s step %lld bucket %zu: count %zu, planned %lld", what,
                          (long long)s, j, bk[j].count, (long long)pb[j].dense_count);
            }
            if (bk[j].kind == IGRAD_BUCKET_GATHER)
                MPI_Allgather(bk[j].send, (int)bk[j].send_nbytes, MPI_BYTE, bk[j].recv,
                              (int)bk[j].send_nbytes, MPI_BYTE, MPI_COMM_WORLD);
            else
                MPI_Allreduce(MPI_IN_PLACE, bk[j].recv, (int)bk[j].count, MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
        }
        CHECK_OK(igrad_engine_end(e, s, g));
        CHECK_OK(igrad_engine_last_stats(e, &ms));
        compare_stats(&ps, &ms, what, s);
        payload_total += ms.payload_nbytes;
    }
    /* an independent floor: a dense step moves every parameter as F32 */
    if (c.method == IGRAD_METHOD_DENSE)
        CHECK(payload_total == steps * 4 * igrad_layout_total_count(L),
              "%s: dense payload %lld over %lld steps, expected 4 x %lld per step", what,
              (long long)payload_total, (long long)steps,
              (long long)igrad_layout_total_count(L));
    CHECK(payload_total > 0, "%s: nothing sent", what);
    free(pb);
    grads_free(g, n, T);
    igrad_engine_free(plan);
    igrad_engine_free(e);
}

/* auto with the sparse all-reduce: the real engine under igrad_engine_sync
 * against the plan, two cycles. Returns the sparse all-reduce buckets seen. */
static int plan_vs_sync(igrad_comm_t *comm, const igrad_layout_t *L, const igrad_profile_t *prof,
                        igrad_config_t c, const char *what)
{
    const igrad_profile_t *pr = c.method == IGRAD_METHOD_IG ? prof : NULL;
    igrad_engine_t *e = NULL, *plan = NULL;
    REQUIRE(igrad_engine_create(L, pr, &c, comm, &e) == IGRAD_OK);
    REQUIRE(igrad_engine_create_plan(L, pr, &c, np, &plan) == IGRAD_OK);
    size_t T = igrad_layout_count(L);
    int64_t *n = NULL;
    float **g = grads_alloc(L, &n);
    int sar = 0;
    for (int64_t s = 0; s < 2 * c.release_period; s++) {
        fill(g, n, T, s);
        igrad_step_stats_t ps, ms;
        size_t npb = 0;
        CHECK_OK(igrad_engine_plan_step(plan, s, &ps, NULL, 0, &npb));
        CHECK_OK(igrad_engine_sync(e, s, g));
        CHECK_OK(igrad_engine_last_stats(e, &ms));
        CHECK(ps.payload_nbytes == ms.payload_nbytes && ps.buckets == ms.buckets &&
                  ps.gather_buckets == ms.gather_buckets &&
                  ps.reduce_buckets == ms.reduce_buckets &&
                  ps.sparse_reduce_buckets == ms.sparse_reduce_buckets &&
                  ps.entries_sent == ms.entries_sent,
              "%s step %lld: planned payload %lld, buckets %d (%d/%d/%d), entries %lld; "
              "measured %lld, %d (%d/%d/%d), %lld",
              what, (long long)s, (long long)ps.payload_nbytes, ps.buckets, ps.gather_buckets,
              ps.reduce_buckets, ps.sparse_reduce_buckets, (long long)ps.entries_sent,
              (long long)ms.payload_nbytes, ms.buckets, ms.gather_buckets, ms.reduce_buckets,
              ms.sparse_reduce_buckets, (long long)ms.entries_sent);
        sar += ms.sparse_reduce_buckets;
    }
    grads_free(g, n, T);
    igrad_engine_free(plan);
    igrad_engine_free(e);
    return sar;
}

/* Reduce buckets of step 0's plan for config c. */
static int planned_reduces(const igrad_layout_t *L, const igrad_profile_t *prof,
                           const igrad_config_t *c)
{
    igrad_engine_t *p = NULL;
    REQUIRE(igrad_engine_create_plan(L, c->method == IGRAD_METHOD_IG ? prof : NULL, c, np, &p) ==
            IGRAD_OK);
    igrad_step_stats_t s;
    size_t nb = 0;
    CHECK_OK(igrad_engine_plan_step(p, 0, &s, NULL, 0, &nb));
    igrad_engine_free(p);
    return s.reduce_buckets;
}

static void test_refusals(igrad_comm_t *comm, const igrad_layout_t *L)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    igrad_engine_t *plan = NULL, *e = NULL;
    CHECK_STATUS(igrad_engine_create_plan(L, NULL, &c, 0, &plan), IGRAD_E_INVALID);
    CHECK(strstr(igrad_last_error(), "nranks is 0") != NULL, "message: %s", igrad_last_error());
    CHECK(plan == NULL, "plan set on failure");
    c.start_iter = 3;
    CHECK_STATUS(igrad_engine_create_plan(L, NULL, &c, 4, &plan), IGRAD_E_INVALID);
    CHECK(strstr(igrad_last_error(), "config.start_iter") != NULL, "message: %s",
          igrad_last_error());
    c.start_iter = 0;
    c.density = 0.0;
    CHECK_STATUS(igrad_engine_create_plan(L, NULL, &c, 4, &plan), IGRAD_E_INVALID);
    CHECK(strstr(igrad_last_error(), "config.density") != NULL, "message: %s",
          igrad_last_error());
    c.density = 0.01;
    c.method = IGRAD_METHOD_IG;
    CHECK_STATUS(igrad_engine_create_plan(L, NULL, &c, 4, &plan), IGRAD_E_INVALID);
    CHECK(strstr(igrad_last_error(), "needs a profile") != NULL, "message: %s",
          igrad_last_error());
    c.method = IGRAD_METHOD_TOPK_SYNC;

    c.collective = IGRAD_COLLECTIVE_GATHER;
    REQUIRE(igrad_engine_create_plan(L, NULL, &c, 1024, &plan) == IGRAD_OK);
    size_t T = igrad_layout_count(L);
    float **g = calloc(T, sizeof *g);
    REQUIRE(g);
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
        g[t] = calloc((size_t)ti.count, sizeof **g);
        REQUIRE(g[t]);
    }
    CHECK_STATUS(igrad_engine_sync(plan, 0, g), IGRAD_E_STATE);
    CHECK(strstr(igrad_last_error(), "plan-only") != NULL, "message: %s", igrad_last_error());
    igrad_step_stats_t s;
    size_t nb = 0;
    CHECK_STATUS(igrad_engine_plan_step(plan, 0, NULL, NULL, 0, &nb), IGRAD_E_INVALID);
    CHECK_OK(igrad_engine_plan_step(plan, 0, &s, NULL, 0, &nb));
    CHECK(nb > 0 && (size_t)s.buckets == nb, "planned %zu buckets, stats %d", nb, s.buckets);
    CHECK(s.wire_nbytes == 1023.0 * (double)s.payload_nbytes,
          "P = 1024, all gather: wire %.17g, payload %lld", s.wire_nbytes,
          (long long)s.payload_nbytes);
    CHECK(s.payload_nbytes == igrad_engine_predict_payload(plan, 0),
          "planned payload %lld, predicted %lld", (long long)s.payload_nbytes,
          (long long)igrad_engine_predict_payload(plan, 0));
    igrad_engine_free(plan);

    REQUIRE(igrad_engine_create(L, NULL, &c, comm, &e) == IGRAD_OK);
    CHECK_STATUS(igrad_engine_plan_step(e, 0, &s, NULL, 0, &nb), IGRAD_E_STATE);
    CHECK(strstr(igrad_last_error(), "not plan-only") != NULL, "message: %s",
          igrad_last_error());
    igrad_engine_free(e);
    for (size_t t = 0; t < T; t++) free(g[t]);
    free(g);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_layout_t *L = mpi_llama_layout(3000);
    igrad_profile_t *prof = mpi_fixed_profile(L, "fixed:0.4");

    static const igrad_method_t methods[] = {IGRAD_METHOD_DENSE, IGRAD_METHOD_TOPK_SYNC,
                                             IGRAD_METHOD_ADTOPK_SYNC, IGRAD_METHOD_IG,
                                             IGRAD_METHOD_IAD};
    static const struct {
        double density;
        igrad_collective_t collective;
        igrad_pack_policy_t pack;
        int64_t latency_ns, mbps;
        const char *name;
    } variants[] = {
        {0.01, IGRAD_COLLECTIVE_AUTO, IGRAD_PACK_CONTIGUOUS, 0, 100000, "auto, density 0.01"},
        {0.5, IGRAD_COLLECTIVE_AUTO, IGRAD_PACK_CONTIGUOUS, 0, 100000, "auto, density 0.5"},
        {0.05, IGRAD_COLLECTIVE_GATHER, IGRAD_PACK_RISK, 0, 100000, "gather, risk"},
        {0.05, IGRAD_COLLECTIVE_REDUCE, IGRAD_PACK_DIRECT, 0, 100000, "reduce, direct"},
        {0.5, IGRAD_COLLECTIVE_AUTO, IGRAD_PACK_CONTIGUOUS, 8000, 100000,
         "auto, density 0.5, link 100g"},
        {0.2, IGRAD_COLLECTIVE_AUTO, IGRAD_PACK_CONTIGUOUS, 15000, 25000,
         "auto, density 0.2, link 25g"},
    };
    int reduce_seen = 0;
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++)
        for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++) {
            igrad_config_t c = IGRAD_CONFIG_INIT;
            c.method = methods[m];
            c.density = variants[v].density;
            c.collective = variants[v].collective;
            c.pack = variants[v].pack;
            c.link_latency_ns = variants[v].latency_ns;
            c.link_bandwidth_mbps = variants[v].mbps;
            c.release_period = 3; /* odd: the cycle spans both parities */
            c.block_entries = 40;
            c.buckets = 3;
            char what[128];
            snprintf(what, sizeof what, "%s (%s)", igrad_method_name(c.method),
                     variants[v].name);
            plan_vs_engine(comm, L, prof, c, what);
            /* auto chooses reduce somewhere at density 0.5 with 4 ranks */
            if (v == 1 && np >= 4 && c.method != IGRAD_METHOD_DENSE) {
                igrad_engine_t *p = NULL;
                REQUIRE(igrad_engine_create_plan(L, c.method == IGRAD_METHOD_IG ||
                                                         c.method == IGRAD_METHOD_IAD
                                                     ? prof
                                                     : NULL,
                                                 &c, np, &p) == IGRAD_OK);
                igrad_step_stats_t s;
                size_t nb = 0;
                CHECK_OK(igrad_engine_plan_step(p, 0, &s, NULL, 0, &nb));
                reduce_seen += s.reduce_buckets > 0;
                igrad_engine_free(p);
            }
        }
    if (np >= 4) CHECK(reduce_seen > 0, "auto never chose reduce at density 0.5 (np %d)", np);

    /* the link decides: a 1 s latency leaves no reduce (two steps of it
     * against the gather's one) where bytes alone chose some */
    if (np >= 4) {
        int bytes_only = 0, slow = 0;
        static const igrad_method_t ms[] = {IGRAD_METHOD_TOPK_SYNC, IGRAD_METHOD_ADTOPK_SYNC,
                                            IGRAD_METHOD_IG};
        for (size_t m = 0; m < sizeof ms / sizeof ms[0]; m++) {
            igrad_config_t c = IGRAD_CONFIG_INIT;
            c.method = ms[m];
            c.density = 0.5;
            c.release_period = 3;
            c.block_entries = 40;
            c.buckets = 3;
            bytes_only += planned_reduces(L, prof, &c);
            c.link_latency_ns = 1000000000;
            slow += planned_reduces(L, prof, &c);
        }
        CHECK(bytes_only > 0 && slow == 0, "reduce buckets: %d by bytes, %d at 1 s latency",
              bytes_only, slow);
    }

    /* auto with the sparse all-reduce, under igrad_engine_sync */
    int sar_seen = 0;
    static const igrad_method_t sparse[] = {IGRAD_METHOD_TOPK_SYNC, IGRAD_METHOD_ADTOPK_SYNC,
                                            IGRAD_METHOD_IG};
    for (size_t m = 0; m < sizeof sparse / sizeof sparse[0]; m++)
        for (int64_t lat = 0; lat <= 8000; lat += 8000) {
            igrad_config_t c = IGRAD_CONFIG_INIT;
            c.method = sparse[m];
            c.density = 0.05;
            c.release_period = 3;
            c.block_entries = 40;
            c.buckets = 3;
            c.auto_sparse_reduce = 1;
            c.link_latency_ns = lat;
            c.timeout_s = 60;
            /* fixed 32-bit indices: at 4 ranks the fitted price of the
             * sparse all-reduce (route.h) beats the gather only above
             * 7.2 gather bytes an entry (F32 values: 8 with them) */
            c.index_code = IGRAD_INDEX_CODE_FIXED;
            c.index_dtype = IGRAD_DTYPE_U32;
            char what[128];
            snprintf(what, sizeof what, "%s (auto_sparse_reduce, %lld ns)",
                     igrad_method_name(c.method), (long long)lat);
            sar_seen += plan_vs_sync(comm, L, prof, c, what);
        }
    if (np >= 4) CHECK(sar_seen > 0, "auto_sparse_reduce: no sparse all-reduce bucket (np %d)", np);
    test_refusals(comm, L);

    igrad_profile_free(prof);
    igrad_layout_free(L);
    igrad_comm_free(comm);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("mpi_plan: %d failure(s) on %d ranks\n", total, np);
    MPI_Finalize();
    return total ? 1 : 0;
}
