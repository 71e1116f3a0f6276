/*
 * mpi_hier.c — the two-level sync (config.topology hier, engine_hier.c)
 * over MPI (CTest runs it with -np 4 and -np 8; nodes of ranks_per_node 2
 * and 4, and the nodes MPI reports).
 *
 *  - dense, adtopk_sync and ig over two release cycles: every rank's
 *    gradients equal a brute-force reference computed here from every
 *    rank's inputs (node sums in rank order, igrad_select_ef of each node
 *    sum plus its residual with the spec the method implies for the step,
 *    the average over all P ranks), bit for bit (the gradients are
 *    multiples of 2^-10, so every sum is exact in any order); the owner's
 *    residuals equal the reference's, the other ranks have none; per shard
 *    Σ node sums = Σ sent + residual (conservation);
 *  - statistics: inter-node bytes are the shard's collectives among the N
 *    owners, intra-node bytes 2(L-1)/L·4 per parameter, and a plan-only
 *    engine of the same layout (igrad_engine_create_plan) plans exactly
 *    each rank's payload and inter-node bytes (its shard's buckets) and
 *    the busiest shard's;
 *  - agreement: a NaN on one rank, a NULL gradient, ranks at different
 *    steps, a config or topology that differs on one rank: the same error
 *    on every rank, nothing changed, the next step runs;
 *  - resume: state saved after step 5 and loaded into a new engine replays
 *    steps 6.. bit for bit;
 *  - the entry points it does not have are refused by name.
 * Configs pin dense_below = 0: every tensor takes the sparsifier path, which
 * the references and goldens here model (the default, 64, sends tensors
 * under 64 entries whole: tests/test_engine_dense_below.c, test_target.c).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "igrad.h"

#include "mpi_util.h"

#define STEPS 10

static igrad_config_t config_of(igrad_method_t method, int rpn)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = method;
    c.density = 0.05;
    c.release_period = 4;
    c.buckets = 2;
    c.block_entries = 256;
    c.threads = 1;
    c.timeout_s = 60;
    c.topology = IGRAD_TOPOLOGY_HIER;
    c.ranks_per_node = rpn;
    return c;
}

/* The reference of one method: per node and tensor the owner's residual. */
typedef struct reference {
    int N, L;
    float ***e;    /* [N][T][n] */
    float **out;   /* [T][n] the averaged result */
    double **sent; /* [N][T] Σ over steps of the values sent */
    double **in;   /* [N][T] Σ over steps of the node sums */
} reference_t;

static void ref_init(reference_t *R, const mpi_model_t *m, int N, int L)
{
    R->N = N;
    R->L = L;
    R->e = calloc((size_t)N, sizeof *R->e);
    R->sent = calloc((size_t)N, sizeof *R->sent);
    R->in = calloc((size_t)N, sizeof *R->in);
    REQUIRE(R->e && R->sent && R->in);
    for (int k = 0; k < N; k++) {
        R->e[k] = mpi_grads_alloc(m);
        REQUIRE((R->sent[k] = calloc(m->T, sizeof(double))));
        REQUIRE((R->in[k] = calloc(m->T, sizeof(double))));
    }
    R->out = mpi_grads_alloc(m);
}

static void ref_free(reference_t *R, const mpi_model_t *m)
{
    for (int k = 0; k < R->N; k++) {
        mpi_grads_free(m, R->e[k]);
        free(R->sent[k]);
        free(R->in[k]);
    }
    free(R->e);
    free(R->sent);
    free(R->in);
    mpi_grads_free(m, R->out);
}

/* One step of the reference: what every rank must end with. */
static void ref_step(reference_t *R, const mpi_model_t *m, const igrad_engine_t *e,
                     const igrad_config_t *c, int64_t step)
{
    int P = R->N * R->L;
    float inv = 1.0f / (float)P;
    float *ns = NULL;
    int64_t nmax = 0;
    for (size_t t = 0; t < m->T; t++) nmax = m->n[t] > nmax ? m->n[t] : nmax;
    ns = calloc((size_t)nmax, sizeof *ns);
    uint32_t *idx = calloc((size_t)nmax, sizeof *idx);
    float *val = calloc((size_t)nmax, sizeof *val);
    igrad_select_ws_t *ws = NULL;
    REQUIRE(ns && idx && val && igrad_select_ws_create(&ws) == IGRAD_OK);
    for (size_t t = 0; t < m->T; t++) {
        const igrad_tensor_info_t *ti = &m->info[t];
        memset(R->out[t], 0, (size_t)m->n[t] * sizeof(float));
        igrad_tensor_plan_t tp;
        REQUIRE(igrad_engine_tensor_plan(e, t, &tp) == IGRAD_OK);
        int released = tp.phase >= 0 && step % c->release_period == tp.phase;
        int sent = tp.every_step || released;
        for (int k = 0; k < R->N; k++) {
            for (int64_t i = 0; i < m->n[t]; i++) {
                float s = 0.0f;
                for (int l = 0; l < R->L; l++) s += mpi_value_2p10(k * R->L + l, step, t, i);
                ns[i] = s;
                R->in[k][t] += s;
            }
            if (c->method == IGRAD_METHOD_DENSE) {
                for (int64_t i = 0; i < m->n[t]; i++) R->out[t][i] += ns[i];
                continue;
            }
            if (!sent) {
                for (int64_t i = 0; i < m->n[t]; i++) R->e[k][t][i] += ns[i];
                continue;
            }
            double scale = released && c->method == IGRAD_METHOD_IG
                               ? c->release_keep * (double)c->release_period
                               : 1.0;
            igrad_select_spec_t sp;
            REQUIRE(igrad_select_spec(IGRAD_SPARSIFIER_ADTOPK, c->density, scale, 0, step,
                                      ti->ndim, ti->shape, &sp) == IGRAD_OK);
            CHECK(sp.count == (released ? tp.release_count : tp.count),
                  "tensor %s: reference count %lld, plan %lld", ti->name, (long long)sp.count,
                  (long long)(released ? tp.release_count : tp.count));
            igrad_selection_t sel = {idx, val, 0, 0, 0.0};
            REQUIRE(igrad_select_ef(ns, R->e[k][t], &sp, ti->name, ws, &sel) == IGRAD_OK);
            for (int64_t j = 0; j < sel.count; j++) {
                int64_t flat = sp.row_wise ? (j / sp.per_row) * sp.cols + idx[j] : idx[j];
                R->out[t][flat] += val[j] * inv;
                R->sent[k][t] += val[j];
            }
        }
        if (c->method == IGRAD_METHOD_DENSE)
            for (int64_t i = 0; i < m->n[t]; i++) R->out[t][i] *= inv;
    }
    igrad_select_ws_free(ws);
    free(ns);
    free(idx);
    free(val);
}

static int same_floats(const float *a, const float *b, int64_t n)
{
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* The engine against the reference over STEPS steps; statistics against
 * the plan. */
static void check_method(const mpi_model_t *m, igrad_method_t method, int rpn)
{
    igrad_config_t c = config_of(method, rpn);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_engine_t *e = NULL;
    CHECK_OK(igrad_engine_create(m->L, m->prof, &c, comm, &e));
    if (!e) {
        igrad_comm_free(comm);
        return;
    }
    /* the node shape MPI gave (rpn 0) or the config's */
    int L = rpn;
    if (L == 0) {
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node);
        MPI_Comm_size(node, &L);
        MPI_Comm_free(&node);
    }
    int N = np / L, local = me % L, node = me / L;
    const char *mn = igrad_method_name(method);

    /* every tensor has exactly one owner per node */
    for (size_t t = 0; t < m->T; t++) {
        int mine = igrad_engine_residual(e, t) != NULL, owners = 0;
        MPI_Allreduce(&mine, &owners, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (method != IGRAD_METHOD_DENSE)
            CHECK(owners == N, "%s: tensor %zu has %d owners over %d nodes", mn, t, owners, N);
    }

    igrad_config_t pc = c;
    pc.ranks_per_node = L;
    igrad_engine_t *plan = NULL;
    CHECK_OK(igrad_engine_create_plan(m->L, m->prof, &pc, np, &plan));
    igrad_planned_bucket_t pb[64];

    reference_t R;
    ref_init(&R, m, N, L);
    float **g = mpi_grads_alloc(m);
    for (int64_t s = 0; s < STEPS; s++) {
        mpi_grads_fill(m, g, me, s);
        CHECK_OK(igrad_engine_sync(e, s, g));
        ref_step(&R, m, e, &c, s);
        for (size_t t = 0; t < m->T; t++)
            CHECK(same_floats(g[t], R.out[t], m->n[t]), "%s L %d step %lld: tensor %s differs "
                  "from the reference", mn, L, (long long)s, m->info[t].name);
        for (size_t t = 0; t < m->T && method != IGRAD_METHOD_DENSE; t++) {
            const float *res = igrad_engine_residual(e, t);
            if (!res) continue;
            CHECK(same_floats(res, R.e[node][t], m->n[t]),
                  "%s step %lld: residual of %s differs from the reference", mn, (long long)s,
                  m->info[t].name);
            double sum = 0.0;
            for (int64_t i = 0; i < m->n[t]; i++) sum += res[i];
            CHECK(fabs(R.in[node][t] - (R.sent[node][t] + sum)) <= 1e-9 * (1.0 + fabs(R.in[node][t])),
                  "%s step %lld: conservation of %s: node sums %.17g, sent + residual %.17g",
                  mn, (long long)s, m->info[t].name, R.in[node][t], R.sent[node][t] + sum);
        }
        /* statistics: the plan's, and the levels */
        igrad_step_stats_t st, ps;
        CHECK_OK(igrad_engine_last_stats(e, &st));
        size_t nb = 0;
        CHECK_OK(igrad_engine_plan_step(plan, s, &ps, pb, 64, &nb));
        int64_t pay = 0;
        double wire = 0.0;
        for (size_t j = 0; j < nb && j < 64; j++)
            if (pb[j].local_rank == local) {
                pay += pb[j].payload_nbytes;
                wire += pb[j].wire_nbytes;
            }
        CHECK(pay == st.payload_nbytes, "%s step %lld: payload planned %lld, measured %lld", mn,
              (long long)s, (long long)pay, (long long)st.payload_nbytes);
        CHECK(fabs(wire - st.inter_wire_nbytes) <= 1e-6 * (1.0 + wire),
              "%s step %lld: inter-node bytes planned %.17g, measured %.17g", mn, (long long)s,
              wire, st.inter_wire_nbytes);
        double intra = 2.0 * (L - 1) / L * 4.0 * (double)igrad_layout_total_count(m->L);
        CHECK(st.intra_wire_nbytes == intra && ps.intra_wire_nbytes == intra,
              "%s step %lld: intra-node bytes %.17g (plan %.17g), expected %.17g", mn,
              (long long)s, st.intra_wire_nbytes, ps.intra_wire_nbytes, intra);
        CHECK(st.wire_nbytes == st.intra_wire_nbytes + st.inter_wire_nbytes,
              "%s: wire is not intra + inter", mn);
        int64_t pmax = 0;
        MPI_Allreduce(&st.payload_nbytes, &pmax, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        CHECK(pmax == ps.payload_nbytes, "%s step %lld: busiest shard planned %lld, measured %lld",
              mn, (long long)s, (long long)ps.payload_nbytes, (long long)pmax);
    }
    if (me == 0)
        printf("mpi_hier: %s, %d nodes x %d ranks: %d steps equal the reference\n", mn, N, L,
               STEPS);
    ref_free(&R, m);
    mpi_grads_free(m, g);
    igrad_engine_free(plan);
    igrad_engine_free(e);
    igrad_comm_free(comm);
}

/* Errors found at the agreement fail every rank alike and change nothing. */
static void check_agreement(const mpi_model_t *m, int rpn)
{
    igrad_config_t c = config_of(IGRAD_METHOD_IG, rpn);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_engine_t *e = NULL;
    REQUIRE(igrad_engine_create(m->L, m->prof, &c, comm, &e) == IGRAD_OK);
    float **g = mpi_grads_alloc(m);
    mpi_grads_fill(m, g, me, 0);
    CHECK_OK(igrad_engine_sync(e, 0, g));

    /* snapshot of the residuals this rank owns */
    float **snap = mpi_grads_alloc(m);
    for (size_t t = 0; t < m->T; t++)
        if (igrad_engine_residual(e, t))
            memcpy(snap[t], igrad_engine_residual(e, t), (size_t)m->n[t] * sizeof(float));
    size_t bad_t = 5;

    /* a NaN on the last rank */
    mpi_grads_fill(m, g, me, 1);
    if (me == np - 1) g[bad_t][3] = NAN;
    CHECK_STATUS(igrad_engine_sync(e, 1, g), IGRAD_E_NONFINITE);
    CHECK(strstr(igrad_last_error(), m->info[bad_t].name) != NULL,
          "the NaN's message does not name %s: %s", m->info[bad_t].name, igrad_last_error());
    igrad_step_stats_t st;
    igrad_engine_last_stats(e, &st);
    CHECK(st.skipped == 1, "a NaN step is not marked skipped");
    for (size_t t = 0; t < m->T; t++) {
        const float *r = igrad_engine_residual(e, t);
        if (r) CHECK(same_floats(r, snap[t], m->n[t]), "a NaN step changed residual %zu", t);
        if (!(me == np - 1 && t == bad_t)) {
            int same = 1;
            for (int64_t i = 0; i < m->n[t]; i++) same &= g[t][i] == mpi_value_2p10(me, 1, t, i);
            CHECK(same, "a NaN step changed the gradient of tensor %zu", t);
        }
    }
    /* a NULL gradient on rank 0 */
    mpi_grads_fill(m, g, me, 1);
    float *keep = g[2];
    if (me == 0) g[2] = NULL;
    CHECK_STATUS(igrad_engine_sync(e, 1, g), IGRAD_E_INVALID);
    g[2] = keep;
    /* ranks at different steps */
    CHECK_STATUS(igrad_engine_sync(e, me == 1 ? 2 : 1, g), IGRAD_E_MISMATCH);
    CHECK(strstr(igrad_last_error(), "step") != NULL, "step mismatch message: %s",
          igrad_last_error());
    /* and the step then runs */
    CHECK_OK(igrad_engine_sync(e, 1, g));
    igrad_engine_last_stats(e, &st);
    CHECK(st.skipped == 0, "the retried step is skipped");

    /* two-phase and streamed steps are refused by name */
    const igrad_bucket_t *bk = NULL;
    size_t nbk = 0;
    CHECK_STATUS(igrad_engine_begin(e, 2, g, &bk, &nbk), IGRAD_E_UNSUPPORTED);
    CHECK_STATUS(igrad_engine_open(e, 2), IGRAD_E_UNSUPPORTED);
    igrad_engine_free(e);

    /* a config differing on one rank: every rank fails, naming it */
    igrad_config_t c2 = c;
    if (me == np - 1) c2.density = 0.02;
    e = NULL;
    CHECK_STATUS(igrad_engine_create(m->L, m->prof, &c2, comm, &e), IGRAD_E_MISMATCH);
    CHECK(strstr(igrad_last_error(), "config.density") != NULL, "density mismatch: %s",
          igrad_last_error());
    /* one rank flat: the same exchange, the topology named */
    c2 = c;
    if (me == 0) c2.topology = IGRAD_TOPOLOGY_FLAT;
    CHECK_STATUS(igrad_engine_create(m->L, m->prof, &c2, comm, &e), IGRAD_E_MISMATCH);
    CHECK(strstr(igrad_last_error(), "config.topology") != NULL, "topology mismatch: %s",
          igrad_last_error());
    /* ranks_per_node that does not divide P */
    c2 = c;
    c2.ranks_per_node = np + 1;
    CHECK_STATUS(igrad_engine_create(m->L, m->prof, &c2, comm, &e), IGRAD_E_INVALID);
    CHECK(e == NULL, "a failed create returned an engine");
    mpi_grads_free(m, g);
    mpi_grads_free(m, snap);
    igrad_comm_free(comm);
}

/* Saved after step 5, loaded into a new engine: steps 6.. replay exactly. */
static void check_resume(const mpi_model_t *m, int rpn)
{
    igrad_config_t c = config_of(IGRAD_METHOD_IG, rpn);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_engine_t *a = NULL, *b = NULL;
    REQUIRE(igrad_engine_create(m->L, m->prof, &c, comm, &a) == IGRAD_OK);
    float **g = mpi_grads_alloc(m), **h = mpi_grads_alloc(m);
    char path[128];
    snprintf(path, sizeof path, "mpi_hier_state_r%d.bin", me);
    float ***want = calloc(STEPS, sizeof *want);
    REQUIRE(want);
    for (int64_t s = 0; s < STEPS; s++) {
        mpi_grads_fill(m, g, me, s);
        CHECK_OK(igrad_engine_sync(a, s, g));
        want[s] = mpi_grads_alloc(m);
        for (size_t t = 0; t < m->T; t++)
            memcpy(want[s][t], g[t], (size_t)m->n[t] * sizeof(float));
        if (s == 5) CHECK_OK(igrad_engine_save_state(a, path));
    }
    REQUIRE(igrad_engine_create(m->L, m->prof, &c, comm, &b) == IGRAD_OK);
    CHECK_OK(igrad_engine_load_state(b, path));
    CHECK(igrad_engine_step(b) == 5, "the loaded engine is at step %lld",
          (long long)igrad_engine_step(b));
    for (int64_t s = 6; s < STEPS; s++) {
        mpi_grads_fill(m, h, me, s);
        CHECK_OK(igrad_engine_sync(b, s, h));
        for (size_t t = 0; t < m->T; t++)
            CHECK(same_floats(h[t], want[s][t], m->n[t]),
                  "resumed step %lld: tensor %zu differs", (long long)s, t);
    }
    /* a file of another rank (another shard, or another node's) is refused
     * on every rank */
    char other[128];
    snprintf(other, sizeof other, "mpi_hier_state_r%d.bin", (me + 1) % np);
    igrad_engine_t *x = NULL;
    REQUIRE(igrad_engine_create(m->L, m->prof, &c, comm, &x) == IGRAD_OK);
    MPI_Barrier(MPI_COMM_WORLD);
    igrad_status_t ls = igrad_engine_load_state(x, other);
    CHECK(ls != IGRAD_OK, "rank %d loaded rank %d's state file", me, (me + 1) % np);
    int lsi = (int)ls, lmin = 0, lmax = 0;
    MPI_Allreduce(&lsi, &lmin, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&lsi, &lmax, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lmin == lmax, "ranks disagree on loading another rank's file (%d vs %d)", lmin, lmax);
    igrad_engine_free(x);
    MPI_Barrier(MPI_COMM_WORLD);
    remove(path);
    for (int64_t s = 0; s < STEPS; s++) mpi_grads_free(m, want[s]);
    free(want);
    mpi_grads_free(m, g);
    mpi_grads_free(m, h);
    igrad_engine_free(a);
    igrad_engine_free(b);
    igrad_comm_free(comm);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    mpi_model_t m;
    mpi_model_init(&m);
    int rpns[3] = {2, np >= 8 ? 4 : 1, 0};
    for (int k = 0; k < 3; k++) {
        check_method(&m, IGRAD_METHOD_IG, rpns[k]);
        check_method(&m, IGRAD_METHOD_ADTOPK_SYNC, rpns[k]);
        if (k == 0) check_method(&m, IGRAD_METHOD_DENSE, rpns[k]);
    }
    check_agreement(&m, 2);
    check_resume(&m, 2);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("mpi_hier: %s (%d failures over %d ranks)\n", total ? "FAILED" : "ok",
                        total, np);
    mpi_model_free(&m);
    MPI_Finalize();
    return total ? 1 : 0;
}
