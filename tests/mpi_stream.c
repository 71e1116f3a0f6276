/*
 * mpi_stream.c — the streamed step (igrad_engine_open / ready / close) over
 * MPI (CTest runs it with -np 2 and -np 3). Each rank gives its tensors in
 * its own random order and random chunks, issues every bucket ready hands
 * out at once (non-blocking, on the engine's comm), waits them in order
 * and closes; a twin engine runs igrad_engine_sync on a copy of the same
 * gradients. Over 20 steps, for ig (gather, reduce + 16-bit values, risk
 * packing, residual drop, online profiling), iad, topk_sync (with momentum
 * and BF16 values, with a dense warm-up), adtopk_sync (interleave, decay;
 * and with FP8 values)
 * and dense: gradients, residuals and velocities equal the twin's bit for
 * bit after every step, as do the statistics (payload, entries, buckets;
 * the residual norm to 1e-12). At one step the last rank's gradient has a
 * NaN: both engines skip it on every rank with the same status and
 * message, residuals unchanged. Error cases (ready or close without open,
 * another step, an index out of range, a tensor given twice, close before
 * every tensor was given, open twice, a NULL gradient on one rank) give
 * clear errors on every rank and never hang.
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

#define NSTEPS 20
#define NAN_STEP 7

typedef struct model {
    igrad_layout_t *layout;
    size_t T;
    int64_t *n;
} model_t;

static model_t model_new(void)
{
    model_t M = {0};
    REQUIRE(igrad_layout_create(&M.layout) == IGRAD_OK);
    int64_t emb[2] = {300, 16}, attn[2] = {16, 16}, mlp[2] = {64, 16}, vec[1] = {16};
    char name[128];
    REQUIRE(igrad_layout_add(M.layout, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb) ==
            IGRAD_OK);
    for (int l = 0; l < 2; l++) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", l);
        REQUIRE(igrad_layout_add(M.layout, name, IGRAD_DTYPE_F32, 2, attn) == IGRAD_OK);
        snprintf(name, sizeof name, "model.layers.%d.self_attn.v_proj.weight", l);
        REQUIRE(igrad_layout_add(M.layout, name, IGRAD_DTYPE_F32, 2, attn) == IGRAD_OK);
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        REQUIRE(igrad_layout_add(M.layout, name, IGRAD_DTYPE_F32, 2, mlp) == IGRAD_OK);
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        REQUIRE(igrad_layout_add(M.layout, name, IGRAD_DTYPE_F32, 1, vec) == IGRAD_OK);
    }
    REQUIRE(igrad_layout_add(M.layout, "model.norm.weight", IGRAD_DTYPE_F32, 1, vec) ==
            IGRAD_OK);
    M.T = igrad_layout_count(M.layout);
    M.n = calloc(M.T, sizeof *M.n);
    REQUIRE(M.n);
    for (size_t t = 0; t < M.T; t++) {
        igrad_tensor_info_t ti;
        REQUIRE(igrad_layout_tensor(M.layout, t, &ti) == IGRAD_OK);
        M.n[t] = ti.count;
    }
    return M;
}

/* A profile with some components low (deferred by ig/iad). */
static igrad_profile_t *profile_new(const model_t *M)
{
    igrad_trace_t *tr = NULL;
    REQUIRE(igrad_trace_create(M->layout, &tr) == IGRAD_OK);
    for (int64_t s = 0; s < 3; s++)
        for (size_t t = 0; t < M->T; t++) {
            igrad_tensor_info_t ti;
            REQUIRE(igrad_layout_tensor(M->layout, t, &ti) == IGRAD_OK);
            if (ti.component < 0) continue;
            double act = (double)((ti.component * 5) % 4 + 1);
            REQUIRE(igrad_trace_record(tr, s, t, act * act, 1) == IGRAD_OK);
        }
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    opts.method = "fixed:0.5";
    igrad_profile_t *p = NULL;
    REQUIRE(igrad_profile_build(tr, &opts, &p) == IGRAD_OK);
    igrad_trace_free(tr);
    return p;
}

static float **grads_alloc(const model_t *M)
{
    float **g = calloc(M->T, sizeof *g);
    REQUIRE(g);
    for (size_t t = 0; t < M->T; t++) REQUIRE((g[t] = calloc((size_t)M->n[t], sizeof(float))));
    return g;
}

static void grads_release(const model_t *M, float **g)
{
    for (size_t t = 0; t < M->T; t++) free(g[t]);
    free(g);
}

/* This rank's gradient of a step, from (rank, step, tensor, index). */
static void grads_set(const model_t *M, float **g, int64_t step)
{
    for (size_t t = 0; t < M->T; t++)
        for (int64_t i = 0; i < M->n[t]; i++) {
            uint64_t u = mix64(((uint64_t)me << 48) ^ ((uint64_t)step << 32) ^
                               ((uint64_t)t << 24) ^ (uint64_t)i);
            float x = (float)((double)(u >> 40) / 16777216.0) - 0.5f;
            g[t][i] = (u & 0x3f) == 0 ? 20.0f * x : x;
        }
}

/* Bitwise equality of two float arrays (NULL = NULL). */
static int same_floats(const float *a, const float *b, int64_t n)
{
    if (!a || !b) return a == b;
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* The streamed step: tensors in a random order (per rank and step) in
 * chunks of 1 to 4, every bucket issued at once, all waited, then close.
 * Returns close's status (or the first failing call's). */
static igrad_status_t stream_step(igrad_engine_t *e, igrad_comm_t *comm, const model_t *M,
                                  float **g, int64_t step, uint64_t seed, int null_tensor)
{
    size_t T = M->T, *perm = calloc(T, sizeof *perm);
    igrad_comm_request_t **req = calloc(64, sizeof *req);
    REQUIRE(perm && req);
    for (size_t i = 0; i < T; i++) perm[i] = i;
    uint64_t r = mix64(seed ^ ((uint64_t)me * 0x51ed27ULL) ^ (uint64_t)step);
    for (size_t i = T; i-- > 1;) {
        r = mix64(r);
        size_t j = (size_t)(r % (i + 1)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    igrad_status_t st = igrad_engine_open(e, step);
    size_t nreq = 0;
    for (size_t i = 0; i < T && st == IGRAD_OK;) {
        r = mix64(r);
        size_t k = 1 + (size_t)(r % 4);
        if (k > T - i) k = T - i;
        float *chunk[4];
        for (size_t q = 0; q < k; q++)
            chunk[q] = (int)perm[i + q] == null_tensor ? NULL : g[perm[i + q]];
        const igrad_bucket_t *bk = NULL;
        size_t nb = 0;
        st = igrad_engine_ready(e, step, perm + i, k, chunk, &bk, &nb);
        for (size_t j = 0; j < nb && st == IGRAD_OK; j++) {
            REQUIRE(nreq < 64);
            st = bk[j].kind == IGRAD_BUCKET_GATHER
                     ? igrad_comm_iallgather(comm, bk[j].send, bk[j].send_nbytes, bk[j].recv,
                                             &req[nreq])
                     : igrad_comm_iallreduce(comm, bk[j].recv, bk[j].recv, bk[j].count,
                                             IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM, &req[nreq]);
            nreq++;
        }
        i += k;
    }
    for (size_t j = 0; j < nreq; j++) {
        igrad_status_t ws = igrad_comm_wait(comm, req[j]);
        if (st == IGRAD_OK) st = ws;
    }
    if (st == IGRAD_OK) st = igrad_engine_close(e, step);
    free(perm);
    free(req);
    return st;
}

/* After a step: the stream engine b equals the sync engine a. */
static void compare(const model_t *M, igrad_engine_t *a, float **ga, igrad_engine_t *b,
                    float **gb, int64_t step, const char *what)
{
    for (size_t t = 0; t < M->T; t++) {
        CHECK(same_floats(ga[t], gb[t], M->n[t]), "%s step %lld: gradient of tensor %zu differs",
              what, (long long)step, t);
        CHECK(same_floats(igrad_engine_residual(a, t), igrad_engine_residual(b, t), M->n[t]),
              "%s step %lld: residual of tensor %zu differs", what, (long long)step, t);
        CHECK(same_floats(igrad_engine_velocity(a, t), igrad_engine_velocity(b, t), M->n[t]),
              "%s step %lld: velocity of tensor %zu differs", what, (long long)step, t);
    }
    igrad_step_stats_t sa, sb;
    CHECK_OK(igrad_engine_last_stats(a, &sa));
    CHECK_OK(igrad_engine_last_stats(b, &sb));
    CHECK(sa.skipped == sb.skipped && sa.payload_nbytes == sb.payload_nbytes &&
              sa.entries_sent == sb.entries_sent && sa.tensors_sent == sb.tensors_sent &&
              sa.buckets == sb.buckets && sa.gather_buckets == sb.gather_buckets &&
              sa.reduce_buckets == sb.reduce_buckets && sa.bucket_count == sb.bucket_count &&
              sa.deferred_components == sb.deferred_components,
          "%s step %lld: stats differ: skipped %d/%d payload %lld/%lld entries %lld/%lld "
          "buckets %d/%d",
          what, (long long)step, sa.skipped, sb.skipped, (long long)sa.payload_nbytes,
          (long long)sb.payload_nbytes, (long long)sa.entries_sent, (long long)sb.entries_sent,
          sa.buckets, sb.buckets);
    double dn = fabs(sa.residual_norm - sb.residual_norm);
    CHECK(dn <= 1e-12 * (1.0 + sa.residual_norm) && sa.dropped_sumsq == sb.dropped_sumsq,
          "%s step %lld: residual norm %.17g (sync) vs %.17g (stream), dropped %g vs %g", what,
          (long long)step, sa.residual_norm, sb.residual_norm, sa.dropped_sumsq,
          sb.dropped_sumsq);
    CHECK(igrad_engine_step(a) == igrad_engine_step(b), "%s: last step %lld vs %lld", what,
          (long long)igrad_engine_step(a), (long long)igrad_engine_step(b));
}

static igrad_engine_t *engine_new(const model_t *M, const igrad_profile_t *P,
                                  const igrad_config_t *c, igrad_comm_t *comm)
{
    igrad_engine_t *e = NULL;
    igrad_status_t st = igrad_engine_create(M->layout, P, c, comm, &e);
    CHECK(st == IGRAD_OK, "engine create: %s", igrad_last_error());
    REQUIRE(e);
    return e;
}

/* NSTEPS steps of one config, stream vs sync, a NaN on the last rank at
 * NAN_STEP. */
static void stream_vs_sync(igrad_comm_t *comm, const model_t *M, const igrad_profile_t *P,
                           igrad_config_t c, const char *what)
{
    igrad_engine_t *a = engine_new(M, P, &c, comm), *b = engine_new(M, P, &c, comm);
    float **ga = grads_alloc(M), **gb = grads_alloc(M);
    int used = 0;
    for (int64_t s = 0; s < NSTEPS; s++) {
        grads_set(M, ga, s);
        if (s == NAN_STEP && me == np - 1) ga[3][5] = NAN;
        for (size_t t = 0; t < M->T; t++)
            memcpy(gb[t], ga[t], (size_t)M->n[t] * sizeof(float));
        igrad_status_t sa = igrad_engine_sync(a, s, ga);
        char ma[1024];
        snprintf(ma, sizeof ma, "%s", igrad_last_error());
        igrad_status_t sb = stream_step(b, comm, M, gb, s, 0x5eed + (uint64_t)s, -1);
        igrad_status_t want = s == NAN_STEP ? IGRAD_E_NONFINITE : IGRAD_OK;
        CHECK(sa == want && sb == want, "%s step %lld: sync %s, stream %s (%s), expected %s",
              what, (long long)s, igrad_status_str(sa), igrad_status_str(sb),
              igrad_last_error(), igrad_status_str(want));
        if (want != IGRAD_OK)
            CHECK(strcmp(ma, igrad_last_error()) == 0,
                  "%s step %lld: messages differ:\n  sync:   %s\n  stream: %s", what,
                  (long long)s, ma, igrad_last_error());
        compare(M, a, ga, b, gb, s, what);
        igrad_step_stats_t st;
        CHECK_OK(igrad_engine_last_stats(b, &st));
        used += st.buckets;
    }
    CHECK(used > 0, "%s: no bucket was exchanged", what);
    grads_release(M, ga);
    grads_release(M, gb);
    igrad_engine_free(a);
    igrad_engine_free(b);
}

/* Call-order and argument errors, the same on every rank; and a NULL
 * gradient on the last rank only. */
static void test_errors(igrad_comm_t *comm, const model_t *M, const igrad_profile_t *P)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.density = 0.05;
    c.block_entries = 40;
    igrad_engine_t *a = engine_new(M, P, &c, comm), *b = engine_new(M, P, &c, comm);
    float **ga = grads_alloc(M), **gb = grads_alloc(M);
    const igrad_bucket_t *bk = NULL;
    size_t nb = 0, t0 = 0, t1 = 1, twice[2] = {2, 2}, out = M->T;
    float *one[2] = {gb[2], gb[2]};

    CHECK_STATUS(igrad_engine_ready(b, 0, &t0, 1, gb, &bk, &nb), IGRAD_E_STATE);
    CHECK(strstr(igrad_last_error(), "no streamed step is open"), "ready: %s", igrad_last_error());
    CHECK_STATUS(igrad_engine_close(b, 0), IGRAD_E_STATE);
    CHECK_OK(igrad_engine_open(b, 0));
    CHECK_STATUS(igrad_engine_open(b, 0), IGRAD_E_STATE);
    CHECK_STATUS(igrad_engine_sync(b, 0, gb), IGRAD_E_STATE);
    CHECK_STATUS(igrad_engine_ready(b, 1, &t0, 1, gb, &bk, &nb), IGRAD_E_STATE);
    CHECK(strstr(igrad_last_error(), "step 1, but step 0 is open"), "ready: %s",
          igrad_last_error());
    CHECK_STATUS(igrad_engine_ready(b, 0, &out, 1, gb, &bk, &nb), IGRAD_E_INVALID);
    CHECK(strstr(igrad_last_error(), "layout has"), "ready: %s", igrad_last_error());
    CHECK_STATUS(igrad_engine_ready(b, 0, twice, 2, one, &bk, &nb), IGRAD_E_INVALID);
    CHECK(strstr(igrad_last_error(), "already given"), "ready: %s", igrad_last_error());
    CHECK_STATUS(igrad_engine_close(b, 1), IGRAD_E_STATE);
    CHECK_STATUS(igrad_engine_close(b, 0), IGRAD_E_STATE);
    CHECK(strstr(igrad_last_error(), "were not given"), "close: %s", igrad_last_error());
    /* give tensors 0 and 1, then 1 again: refused, the step stays usable */
    grads_set(M, ga, 0);
    for (size_t t = 0; t < M->T; t++) memcpy(gb[t], ga[t], (size_t)M->n[t] * sizeof(float));
    float *g01[2] = {gb[0], gb[1]};
    size_t i01[2] = {0, 1};
    CHECK_OK(igrad_engine_ready(b, 0, i01, 2, g01, &bk, &nb));
    size_t nfirst = nb;
    igrad_comm_request_t *req[64];
    size_t nreq = 0;
    for (size_t j = 0; j < nb; j++)
        CHECK_OK(bk[j].kind == IGRAD_BUCKET_GATHER
                     ? igrad_comm_iallgather(comm, bk[j].send, bk[j].send_nbytes, bk[j].recv,
                                             &req[nreq++])
                     : igrad_comm_iallreduce(comm, bk[j].recv, bk[j].recv, bk[j].count,
                                             IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM, &req[nreq++]));
    CHECK_STATUS(igrad_engine_ready(b, 0, &t1, 1, &gb[1], &bk, &nb), IGRAD_E_INVALID);
    CHECK(nb == 0, "a refused ready returned %zu buckets", nb);
    for (size_t t = 2; t < M->T; t++) {
        CHECK_OK(igrad_engine_ready(b, 0, &t, 1, &gb[t], &bk, &nb));
        for (size_t j = 0; j < nb; j++) {
            REQUIRE(nreq < 64);
            CHECK_OK(bk[j].kind == IGRAD_BUCKET_GATHER
                         ? igrad_comm_iallgather(comm, bk[j].send, bk[j].send_nbytes,
                                                 bk[j].recv, &req[nreq++])
                         : igrad_comm_iallreduce(comm, bk[j].recv, bk[j].recv, bk[j].count,
                                                 IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM, &req[nreq++]));
        }
    }
    (void)nfirst;
    for (size_t j = 0; j < nreq; j++) CHECK_OK(igrad_comm_wait(comm, req[j]));
    CHECK_OK(igrad_engine_close(b, 0));
    CHECK_OK(igrad_engine_sync(a, 0, ga));
    compare(M, a, ga, b, gb, 0, "after refused calls");

    /* a NULL gradient on the last rank: IGRAD_E_INVALID on every rank, as sync */
    grads_set(M, ga, 1);
    for (size_t t = 0; t < M->T; t++) memcpy(gb[t], ga[t], (size_t)M->n[t] * sizeof(float));
    float *keep = ga[4];
    if (me == np - 1) ga[4] = NULL;
    igrad_status_t sa = igrad_engine_sync(a, 1, ga);
    ga[4] = keep;
    igrad_status_t sb = stream_step(b, comm, M, gb, 1, 77, me == np - 1 ? 4 : -1);
    CHECK(sa == IGRAD_E_INVALID && sb == IGRAD_E_INVALID, "NULL gradient: sync %s, stream %s",
          igrad_status_str(sa), igrad_status_str(sb));
    CHECK(strstr(igrad_last_error(), me == np - 1 ? "is NULL" : "failed on rank"),
          "NULL gradient: %s", igrad_last_error());
    compare(M, a, ga, b, gb, 1, "NULL gradient");
    /* and the next step goes on as usual */
    grads_set(M, ga, 1);
    for (size_t t = 0; t < M->T; t++) memcpy(gb[t], ga[t], (size_t)M->n[t] * sizeof(float));
    CHECK_OK(igrad_engine_sync(a, 1, ga));
    CHECK_OK(stream_step(b, comm, M, gb, 1, 78, -1));
    compare(M, a, ga, b, gb, 1, "after the NULL gradient");

    grads_release(M, ga);
    grads_release(M, gb);
    igrad_engine_free(a);
    igrad_engine_free(b);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    model_t M = model_new();
    igrad_profile_t *P = profile_new(&M);

    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.density = 0.05;
    c.block_entries = 40;
    c.release_period = 3;
    stream_vs_sync(comm, &M, P, c, "ig gather");
    c.pack = IGRAD_PACK_RISK;
    c.residual = IGRAD_RESIDUAL_DROP;
    stream_vs_sync(comm, &M, P, c, "ig risk, drop");
    c.pack = IGRAD_PACK_CONTIGUOUS;
    c.residual = IGRAD_RESIDUAL_ON;
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    c.value_dtype = IGRAD_DTYPE_F16;
    stream_vs_sync(comm, &M, P, c, "ig reduce, F16");
    c.collective = IGRAD_COLLECTIVE_AUTO;
    c.value_dtype = IGRAD_DTYPE_F32;
    c.method = IGRAD_METHOD_IAD;
    stream_vs_sync(comm, &M, P, c, "iad");

    igrad_config_t o = c;
    o.method = IGRAD_METHOD_IG;
    o.profile_steps = 4;
    stream_vs_sync(comm, &M, NULL, o, "ig online profiling");

    igrad_config_t k = IGRAD_CONFIG_INIT;
    k.density = 0.1;
    k.block_entries = 50;
    k.method = IGRAD_METHOD_TOPK_SYNC;
    stream_vs_sync(comm, &M, NULL, k, "topk_sync");
    k.momentum = 0.9;
    k.value_dtype = IGRAD_DTYPE_BF16;
    stream_vs_sync(comm, &M, NULL, k, "topk_sync momentum, BF16");
    k.momentum = 0.0;
    k.value_dtype = IGRAD_DTYPE_F32;
    k.start_iter = 3;
    stream_vs_sync(comm, &M, NULL, k, "topk_sync dense warm-up");
    k.start_iter = 0;
    k.method = IGRAD_METHOD_ADTOPK_SYNC;
    k.interleave = 1;
    k.momentum = 0.5;
    stream_vs_sync(comm, &M, NULL, k, "adtopk_sync interleave, momentum");
    k.value_dtype = IGRAD_DTYPE_F8_E4M3; /* a scale per block of 50 */
    stream_vs_sync(comm, &M, NULL, k, "adtopk_sync interleave, momentum, FP8");
    igrad_config_t d = IGRAD_CONFIG_INIT;
    d.method = IGRAD_METHOD_DENSE;
    d.block_entries = 200;
    stream_vs_sync(comm, &M, NULL, d, "dense");

    test_errors(comm, &M, P);

    igrad_profile_free(P);
    igrad_layout_free(M.layout);
    free(M.n);
    igrad_comm_free(comm);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("mpi_stream on %d ranks: %d failure(s)\n", np, total);
    MPI_Finalize();
    return total ? 1 : 0;
}
