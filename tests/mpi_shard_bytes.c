/*
 * mpi_shard_bytes.c — what `igrad bench sync --topology hier` reports as
 * each shard's bytes (tools/bench_stats.h, bench_shard_bytes over every
 * rank's engine statistics) against an independent count: the bytes each
 * rank's bucket collectives were handed on the wire (CTest runs it with
 * -np 2: nodes of 1, one shard; and -np 4: 2 nodes of 2, two shards).
 *
 * The engines run over a custom communicator on MPI that counts, per
 * rank and step, the bytes of every non-blocking all-gather (send bytes)
 * and all-reduce (count x 4) it carries: the shard engines' bucket
 * collectives among the N owners (the node sums and broadcasts are
 * ireduce / ibcast, the agreements blocking calls, none counted). For
 * dense, adtopk_sync and ig over two release cycles of a small LLaMA-like
 * layout:
 *  - every step, the engine's payload_nbytes on each rank equals the
 *    bytes counted there;
 *  - the ranks of one shard (the same local rank on every node) send the
 *    same bytes (the grouping by local rank is the engine's);
 *  - bench_shard_bytes on the engines' figures gives, per shard, the
 *    brute-force mean over that shard's ranks of the counted bytes, and
 *    their min, max, mean and max / mean;
 *  - at 4 ranks, ig's two shards differ (so a figure averaged over ranks,
 *    what the bench reported before, would fail the check above).
 * Not here: the engine's results and ownership (mpi_hier.c), the bench's
 * output format (tests/cli/bench_sync.sh).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "igrad.h"

#include "mpi_util.h"
#include "../tools/bench_stats.h"

#define STEPS 8

/* ---- a custom comm over MPI that counts the bucket collectives' bytes ---- */

typedef struct ccomm {
    MPI_Comm c;
} ccomm_t;

static double counted; /* this rank's bytes in non-blocking collectives */

static MPI_Datatype type_of(igrad_dtype_t dt)
{
    switch (dt) {
    case IGRAD_DTYPE_F32: return MPI_FLOAT;
    case IGRAD_DTYPE_F64: return MPI_DOUBLE;
    case IGRAD_DTYPE_I64: return MPI_INT64_T;
    case IGRAD_DTYPE_U64: return MPI_UINT64_T;
    case IGRAD_DTYPE_I32: return MPI_INT32_T;
    case IGRAD_DTYPE_U32: return MPI_UINT32_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op op_of(igrad_reduce_op_t op)
{
    return op == IGRAD_REDUCE_MAX ? MPI_MAX : op == IGRAD_REDUCE_MIN ? MPI_MIN : MPI_SUM;
}

static igrad_status_t rc_of(int rc) { return rc == MPI_SUCCESS ? IGRAD_OK : IGRAD_E_COMM; }

static igrad_status_t c_allgather(void *user, const void *send, size_t nbytes, void *recv)
{
    ccomm_t *t = user;
    int size;
    MPI_Comm_size(t->c, &size);
    void *copy = NULL;
    const unsigned char *s = send, *r = recv;
    if (nbytes && s < r + (size_t)size * nbytes && r < s + nbytes) { /* overlapping */
        copy = malloc(nbytes);
        if (!copy) return IGRAD_E_NOMEM;
        memcpy(copy, send, nbytes);
        send = copy;
    }
    int rc = MPI_Allgather(send, (int)nbytes, MPI_BYTE, recv, (int)nbytes, MPI_BYTE, t->c);
    free(copy);
    return rc_of(rc);
}

static igrad_status_t c_allreduce(void *user, const void *send, void *recv, size_t count,
                                  igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    ccomm_t *t = user;
    return rc_of(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count,
                               type_of(dtype), op_of(op), t->c));
}

static igrad_status_t c_bcast(void *user, void *buf, size_t nbytes, int root)
{
    ccomm_t *t = user;
    return rc_of(MPI_Bcast(buf, (int)nbytes, MPI_BYTE, root, t->c));
}

static igrad_status_t c_barrier(void *user)
{
    ccomm_t *t = user;
    return rc_of(MPI_Barrier(t->c));
}

/* The non-blocking variants complete at once (handle NULL) and count. */
static igrad_status_t c_iallgather(void *user, const void *send, size_t nbytes, void *recv,
                                   void **handle)
{
    *handle = NULL;
    counted += (double)nbytes;
    return c_allgather(user, send, nbytes, recv);
}

static igrad_status_t c_iallreduce(void *user, const void *send, void *recv, size_t count,
                                   igrad_dtype_t dtype, igrad_reduce_op_t op, void **handle)
{
    *handle = NULL;
    REQUIRE(dtype == IGRAD_DTYPE_F32); /* what a reduce bucket all-reduces */
    counted += 4.0 * (double)count;
    return c_allreduce(user, send, recv, count, dtype, op);
}

static igrad_status_t c_wait(void *user, void *handle)
{
    (void)user, (void)handle;
    return IGRAD_OK;
}

static void c_destroy(void *user)
{
    ccomm_t *t = user;
    MPI_Comm_free(&t->c);
    free(t);
}

static igrad_status_t c_split(void *user, int color, int key, const igrad_comm_ops_t **ops_out,
                              void **user_out, int *rank_out, int *size_out);

static igrad_status_t c_ireduce(void *user, const void *send, void *recv, size_t count,
                                igrad_dtype_t dtype, igrad_reduce_op_t op, int root,
                                void **handle)
{
    ccomm_t *t = user;
    *handle = NULL;
    int rank;
    MPI_Comm_rank(t->c, &rank);
    return rc_of(MPI_Reduce(rank == root && send == recv ? MPI_IN_PLACE : send, recv, (int)count,
                            type_of(dtype), op_of(op), root, t->c));
}

static igrad_status_t c_ibcast(void *user, void *buf, size_t nbytes, int root, void **handle)
{
    *handle = NULL;
    return c_bcast(user, buf, nbytes, root);
}

static const igrad_comm_ops_t c_ops = {
    .size = sizeof(igrad_comm_ops_t),
    .allgather = c_allgather,
    .allreduce = c_allreduce,
    .bcast = c_bcast,
    .barrier = c_barrier,
    .iallgather = c_iallgather,
    .iallreduce = c_iallreduce,
    .wait = c_wait,
    .destroy = c_destroy,
    .memory = IGRAD_MEMORY_HOST,
    .split = c_split,
    .ireduce = c_ireduce,
    .ibcast = c_ibcast,
};

/* config.ranks_per_node is set, so every split has a color >= 0. */
static igrad_status_t c_split(void *user, int color, int key, const igrad_comm_ops_t **ops_out,
                              void **user_out, int *rank_out, int *size_out)
{
    ccomm_t *t = user, *n = calloc(1, sizeof *n);
    if (!n) return IGRAD_E_NOMEM;
    if (color < 0 || MPI_Comm_split(t->c, color, key, &n->c) != MPI_SUCCESS) {
        free(n);
        return IGRAD_E_COMM;
    }
    MPI_Comm_rank(n->c, rank_out);
    MPI_Comm_size(n->c, size_out);
    *ops_out = &c_ops;
    *user_out = n;
    return IGRAD_OK;
}

static igrad_comm_t *ccomm_new(void)
{
    ccomm_t *t = calloc(1, sizeof *t);
    REQUIRE(t && MPI_Comm_dup(MPI_COMM_WORLD, &t->c) == MPI_SUCCESS);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_custom(&c_ops, t, me, np, &comm) == IGRAD_OK);
    return comm;
}

/* ---- the check ------------------------------------------------------------ */

static int close_to(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(b) + 1.0); }

/* Runs `method` over the counting comm on nodes of rpn ranks; checks
 * what the bench would report against the counted bytes. */
static void check_method(igrad_method_t method, int rpn, const igrad_layout_t *L,
                         const igrad_profile_t *prof)
{
    const char *name = igrad_method_name(method);
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = method;
    c.density = 0.05;
    c.release_period = 4;
    c.buckets = 2;
    c.block_entries = 256;
    c.threads = 1;
    c.timeout_s = 60;
    c.topology = IGRAD_TOPOLOGY_HIER;
    c.ranks_per_node = rpn;
    igrad_comm_t *comm = ccomm_new();
    igrad_engine_t *e = NULL;
    REQUIRE(igrad_engine_create(L, prof, &c, comm, &e) == IGRAD_OK);
    size_t T = igrad_layout_count(L);
    float **g = calloc(T, sizeof *g);
    REQUIRE(g);
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
        g[t] = calloc((size_t)ti.count, sizeof **g);
        REQUIRE(g[t]);
    }
    double stats_sum = 0.0, counted_sum = 0.0;
    for (int64_t step = 0; step < STEPS; step++) {
        for (size_t t = 0; t < T; t++) {
            igrad_tensor_info_t ti;
            igrad_layout_tensor(L, t, &ti);
            for (int64_t i = 0; i < ti.count; i++) g[t][i] = mpi_value_2p10(me, step, t, i);
        }
        counted = 0.0;
        CHECK_OK(igrad_engine_sync(e, step, g));
        igrad_step_stats_t ss;
        CHECK_OK(igrad_engine_last_stats(e, &ss));
        CHECK((double)ss.payload_nbytes == counted,
              "%s rpn %d step %lld: the engine says %lld payload bytes, its collectives were "
              "handed %.0f",
              name, rpn, (long long)step, (long long)ss.payload_nbytes, counted);
        stats_sum += (double)ss.payload_nbytes;
        counted_sum += counted;
    }
    /* every rank's figures and shard, as the bench gathers them */
    double mine[2] = {stats_sum / STEPS, counted_sum / STEPS};
    double *all = calloc(2 * (size_t)np, sizeof *all), *st = calloc((size_t)np, sizeof *st);
    double *per = calloc((size_t)np, sizeof *per);
    int *shard = calloc((size_t)np, sizeof *shard);
    REQUIRE(all && st && per && shard);
    MPI_Allgather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, MPI_COMM_WORLD);
    for (int r = 0; r < np; r++) {
        st[r] = all[2 * r];
        shard[r] = r % rpn; /* nodes of rpn ranks in rank order: the local rank */
    }
    bench_shards_t got;
    CHECK(bench_shard_bytes(st, shard, np, per, &got) == 0, "%s: bench_shard_bytes failed", name);
    CHECK(got.n == rpn, "%s: %d shards reported, %d local ranks", name, got.n, rpn);
    /* brute force from the counted bytes */
    double lo = INFINITY, hi = -INFINITY, sum = 0.0;
    for (int l = 0; l < rpn; l++) {
        double s = 0.0, first = NAN;
        int owners = 0;
        for (int r = 0; r < np; r++) {
            if (r % rpn != l) continue;
            double b = all[2 * r + 1];
            if (owners == 0) first = b;
            CHECK(b == first, "%s shard %d: rank %d counted %.0f bytes per step, its first "
                  "owner %.0f", name, l, r, b, first);
            s += b;
            owners++;
        }
        double want = s / owners;
        CHECK(close_to(per[l], want), "%s shard %d: reported %.3f bytes per step, counted %.3f",
              name, l, per[l], want);
        lo = want < lo ? want : lo;
        hi = want > hi ? want : hi;
        sum += want;
    }
    double mean = sum / rpn;
    CHECK(close_to(got.min, lo) && close_to(got.max, hi) && close_to(got.mean, mean),
          "%s: reported min %.3f max %.3f mean %.3f, counted %.3f %.3f %.3f", name, got.min,
          got.max, got.mean, lo, hi, mean);
    CHECK(close_to(got.max_over_mean, hi / mean), "%s: max/mean %.6f, counted %.6f", name,
          got.max_over_mean, hi / mean);
    if (me == 0)
        printf("%s, %d x %d: shard payload %.0f - %.0f bytes per step, max/mean %.4f\n", name,
               np / rpn, rpn, got.min, got.max, got.max_over_mean);
    if (method == IGRAD_METHOD_IG && rpn > 1)
        CHECK(hi > lo, "%s: the shards send the same bytes (%.0f): the check cannot tell a "
              "per-shard figure from a mean over ranks", name, hi);
    free(all);
    free(st);
    free(per);
    free(shard);
    for (size_t t = 0; t < T; t++) free(g[t]);
    free(g);
    igrad_engine_free(e);
    igrad_comm_free(comm);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    int rpn = np >= 4 && np % 2 == 0 ? 2 : 1;
    igrad_layout_t *L = mpi_llama_layout(200);
    igrad_profile_t *prof = mpi_fixed_profile(L, "fixed:0.4");
    static const igrad_method_t methods[] = {IGRAD_METHOD_DENSE, IGRAD_METHOD_ADTOPK_SYNC,
                                             IGRAD_METHOD_IG};
    for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++)
        check_method(methods[k], rpn, L, prof);
    igrad_profile_free(prof);
    igrad_layout_free(L);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("%s\n", total ? "FAILED" : "all checks passed");
    MPI_Finalize();
    return total ? 1 : 0;
}
