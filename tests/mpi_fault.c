/*
 * mpi_fault.c — a stopped rank under the sync engine (CTest runs it with
 * -np 2 and -np 4). The last rank stops itself with raise(SIGSTOP); the
 * others, whose engine has config.timeout_s = 2, must return
 * IGRAD_E_TIMEOUT within a bound (< 10 s) naming where and at which step,
 * and then refuse every later call fast with IGRAD_E_STATE. Rank 0 then
 * sends SIGCONT (once /proc says the victim is stopped), and the victim
 * joins the collectives the others gave up on, so that nothing is left
 * pending and mpirun exits normally.
 *
 *  1. stopped inside a step: the victim has passed the agreement
 *     (igrad_engine_begin) and stops before its bucket collectives; the
 *     others time out in "step 2: bucket ...". After SIGCONT the victim runs
 *     its buckets through the same comm and its igrad_engine_end succeeds.
 *  2. stopped before a step: the others time out in "step 2: agreement".
 *     After SIGCONT the victim calls sync with grads NULL, which takes part
 *     in the agreement exchange and fails there on its own.
 *     The same with config.topology hier (nodes of 2): the world's
 *     agreement precedes every node collective, so again "step 2:
 *     agreement".
 *  3. bad bytes seen by rank 0 alone (a test hook corrupts its received copy
 *     of one bucket): rank 0 gets IGRAD_E_COMM and is broken, the others
 *     finish the step; at the next step rank 0 refuses at once and the
 *     others time out in the agreement rather than hang.
 *
 * mpirun --timeout (CTest) bounds the whole run if anything hangs anyway.
 * Checks only count failures; the counts are summed at the end.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_internal.h"   /* test hook igrad__comm_mpi_set_recv_hook */
#include "engine/engine_internal.h" /* IGRAD__NITEMS: the agreement exchange's size */
#include "igrad.h"

#include "mpi_util.h"

#define TIMEOUT_S 2.0
#define BOUND_S 10.0 /* what "within about the timeout" must mean even on a loaded machine */

static int victim;
static pid_t *pids;
/* Every rank but the victim: rank 0 resumes the victim only once all of
 * them have timed out (a survivor that entered the step later would
 * otherwise see the victim join before its own deadline). */
static MPI_Comm survivors = MPI_COMM_NULL;

static igrad_layout_t *make_layout(void)
{
    igrad_layout_t *L = NULL;
    REQUIRE(igrad_layout_create(&L) == IGRAD_OK);
    int64_t emb[2] = {100, 16}, sq[2] = {16, 16}, vec[1] = {16};
    char name[128];
    REQUIRE(igrad_layout_add(L, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb) == IGRAD_OK);
    for (int l = 0; l < 2; l++) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", l);
        REQUIRE(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, sq) == IGRAD_OK);
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        REQUIRE(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, sq) == IGRAD_OK);
    }
    REQUIRE(igrad_layout_add(L, "model.norm.weight", IGRAD_DTYPE_F32, 1, vec) == IGRAD_OK);
    return L;
}

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

static void grads_fill(grads_t *G, int64_t step)
{
    for (size_t t = 0; t < G->T; t++)
        for (int64_t i = 0; i < G->n[t]; i++)
            G->g[t][i] = (float)((i * 7919 + (int64_t)t * 104729 + step * 31 + me * 17) % 2001) /
                             1000.0f -
                         1.0f;
}

static void grads_free(grads_t *G)
{
    for (size_t t = 0; t < G->T; t++) free(G->g[t]);
    free(G->g);
    free(G->n);
}

static double now_s(void) { return MPI_Wtime(); }

/* Rank 0: waits (at most 10 s) until the victim is stopped, then resumes
 * it. */
static void resume_victim(void)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pids[victim]);
    double t0 = now_s();
    int stopped = 0;
    while (!stopped && now_s() - t0 < 10.0) {
        FILE *fp = fopen(path, "r");
        size_t n = fp ? fread(buf, 1, sizeof buf - 1, fp) : 0;
        if (fp) fclose(fp);
        buf[n] = '\0';
        const char *paren = strrchr(buf, ')');
        stopped = paren && paren[1] == ' ' && paren[2] == 'T';
        if (!stopped) {
            struct timespec ts = {0, 10000000L};
            nanosleep(&ts, NULL);
        }
    }
    CHECK(stopped, "rank %d (pid %ld) never showed as stopped", victim, (long)pids[victim]);
    CHECK(kill(pids[victim], SIGCONT) == 0, "SIGCONT to pid %ld failed", (long)pids[victim]);
}

/* The survivors' side: the step times out within the bound, the message
 * says where, and the engine is broken afterwards (fast). */
static void expect_timeout(igrad_engine_t *e, grads_t *G, const char *where)
{
    double t0 = now_s();
    CHECK_STATUS(igrad_engine_sync(e, 2, G->g), IGRAD_E_TIMEOUT);
    double waited = now_s() - t0;
    CHECK(waited >= TIMEOUT_S && waited < BOUND_S, "%s: timed out after %.3f s (limit %.0f s)",
          where, waited, TIMEOUT_S);
    const char *msg = igrad_last_error();
    CHECK(strstr(msg, where) && strstr(msg, "did not complete within 2 s"),
          "timeout message does not name \"%s\": %s", where, msg);
    if (me == 0) printf("mpi_fault: \"%s\" timed out after %.3f s: %s\n", where, waited, msg);
    t0 = now_s();
    grads_fill(G, 3);
    CHECK_STATUS(igrad_engine_sync(e, 3, G->g), IGRAD_E_STATE);
    CHECK(strstr(igrad_last_error(), "unusable") && strstr(igrad_last_error(), "timed out"),
          "after the timeout: %s", igrad_last_error());
    CHECK_STATUS(igrad_engine_save_state(e, "/nonexistent/never-written.bin"), IGRAD_E_STATE);
    CHECK(now_s() - t0 < 1.0, "a broken engine took %.3f s to refuse", now_s() - t0);
}

static igrad_engine_t *setup_topology(const igrad_layout_t *L, igrad_comm_t **comm, grads_t *G,
                                      igrad_topology_t topology)
{
    REQUIRE(igrad_comm_create_mpi(NULL, comm) == IGRAD_OK);
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.topology = topology;
    c.ranks_per_node = topology == IGRAD_TOPOLOGY_HIER ? 2 : 0;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.density = 0.05;
    c.block_entries = 20;
    c.buckets = 3; /* several collectives in flight */
    c.timeout_s = TIMEOUT_S;
    igrad_engine_t *e = NULL;
    REQUIRE(igrad_engine_create(L, NULL, &c, *comm, &e) == IGRAD_OK);
    for (int64_t s = 0; s < 2; s++) {
        grads_fill(G, s);
        CHECK_OK(igrad_engine_sync(e, s, G->g));
    }
    grads_fill(G, 2);
    return e;
}

static igrad_engine_t *setup(const igrad_layout_t *L, igrad_comm_t **comm, grads_t *G)
{
    return setup_topology(L, comm, G, IGRAD_TOPOLOGY_FLAT);
}

static void test_stopped_in_buckets(const igrad_layout_t *L)
{
    igrad_comm_t *comm = NULL;
    grads_t G = grads_new(L);
    igrad_engine_t *e = setup(L, &comm, &G);
    if (me == victim) {
        const igrad_bucket_t *bk = NULL;
        size_t nb = 0;
        CHECK_OK(igrad_engine_begin(e, 2, G.g, &bk, &nb));
        CHECK(nb >= 2, "only %zu buckets", nb);
        fflush(stdout);
        fflush(stderr);
        raise(SIGSTOP);
        /* resumed: the collectives the others started (and gave up on) */
        igrad_comm_request_t **req = calloc(nb ? nb : 1, sizeof *req);
        REQUIRE(req);
        for (size_t j = 0; j < nb; j++)
            CHECK_OK(bk[j].kind == IGRAD_BUCKET_GATHER
                         ? igrad_comm_iallgather(comm, bk[j].send, bk[j].send_nbytes, bk[j].recv,
                                                 &req[j])
                         : igrad_comm_iallreduce(comm, bk[j].recv, bk[j].recv, bk[j].count,
                                                 IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM, &req[j]));
        for (size_t j = 0; j < nb; j++) CHECK_OK(igrad_comm_wait(comm, req[j]));
        free(req);
        CHECK_OK(igrad_engine_end(e, 2, G.g));
    } else {
        expect_timeout(e, &G, "step 2: bucket ");
        MPI_Barrier(survivors);
        if (me == 0) resume_victim();
    }
    /* inside MPI the abandoned collectives progress until the victim has
     * matched them all */
    MPI_Barrier(MPI_COMM_WORLD);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    grads_free(&G);
}

static void test_stopped_before_step(const igrad_layout_t *L, igrad_topology_t topology)
{
    igrad_comm_t *comm = NULL;
    grads_t G = grads_new(L);
    igrad_engine_t *e = setup_topology(L, &comm, &G, topology);
    if (me == victim) {
        fflush(stdout);
        fflush(stderr);
        raise(SIGSTOP);
        /* resumed: take part in the agreement the others gave up on, with
         * a local error so that no bucket follows */
        CHECK_STATUS(igrad_engine_sync(e, 2, NULL), IGRAD_E_INVALID);
    } else {
        expect_timeout(e, &G, "step 2: agreement: ");
        MPI_Barrier(survivors);
        if (me == 0) resume_victim();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    grads_free(&G);
}

/* 3. Bad bytes seen by one rank only (its transport corrupted its copy of
 * the last rank's bytes of one bucket): that rank fails with IGRAD_E_COMM
 * and is broken, the others complete the step. At the next step the broken
 * rank refuses at once, and the others time out in the agreement instead of
 * waiting forever. Rank 0 then joins that agreement exchange by hand so
 * that nothing is left pending. */
static int corrupt_once;

static void corrupt_hook(void *user, void *recv, size_t nbytes)
{
    (void)user;
    if (!corrupt_once) return;
    corrupt_once = 0;
    memset((unsigned char *)recv + (size_t)victim * nbytes, 0xff, nbytes);
}

static void test_bad_bytes_on_one_rank(const igrad_layout_t *L)
{
    igrad_comm_t *comm = NULL;
    grads_t G = grads_new(L);
    igrad_engine_t *e = setup(L, &comm, &G);
    if (me == 0) {
        REQUIRE(igrad__comm_mpi_set_recv_hook(comm, corrupt_hook, NULL) == IGRAD_OK);
        corrupt_once = 1;
        CHECK_STATUS(igrad_engine_sync(e, 2, G.g), IGRAD_E_COMM);
        char want[64];
        snprintf(want, sizeof want, "rank %d sent ", victim); /* "index …" (fixed) or "a bad … index code" (compact) */
        CHECK(strstr(igrad_last_error(), want), "message: %s", igrad_last_error());
        grads_fill(&G, 3);
        double t0 = now_s();
        CHECK_STATUS(igrad_engine_sync(e, 3, G.g), IGRAD_E_STATE);
        CHECK(strstr(igrad_last_error(), want) && now_s() - t0 < 1.0, "broken rank: %s",
              igrad_last_error());
        MPI_Barrier(MPI_COMM_WORLD); /* the others have timed out */
        uint64_t words[3 + IGRAD__NITEMS] = {0};
        uint64_t *all = calloc((size_t)np * (3 + IGRAD__NITEMS), sizeof *all);
        REQUIRE(all);
        CHECK_OK(igrad_comm_allgather(comm, words, sizeof words, all));
        free(all);
    } else {
        CHECK_OK(igrad_engine_sync(e, 2, G.g)); /* their copies were good */
        grads_fill(&G, 3);
        double t0 = now_s();
        CHECK_STATUS(igrad_engine_sync(e, 3, G.g), IGRAD_E_TIMEOUT);
        double waited = now_s() - t0;
        CHECK(waited >= TIMEOUT_S && waited < BOUND_S, "timed out after %.3f s", waited);
        CHECK(strstr(igrad_last_error(), "step 3: agreement: "), "message: %s",
              igrad_last_error());
        if (me == 1) printf("mpi_fault: a broken rank 0 held the others %.3f s\n", waited);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD); /* progresses the abandoned exchange */
    igrad_engine_free(e);
    igrad_comm_free(comm);
    grads_free(&G);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    victim = np - 1;
    /* one node (mpirun on this machine): pids are meaningful to kill() */
    long mine = (long)getpid();
    long *all = calloc((size_t)np, sizeof *all);
    pids = calloc((size_t)np, sizeof *pids);
    REQUIRE(all && pids && np >= 2);
    MPI_Allgather(&mine, 1, MPI_LONG, all, 1, MPI_LONG, MPI_COMM_WORLD);
    for (int r = 0; r < np; r++) pids[r] = (pid_t)all[r];
    free(all);

    MPI_Comm_split(MPI_COMM_WORLD, me == victim ? MPI_UNDEFINED : 0, me, &survivors);
    igrad_layout_t *L = make_layout();
    test_stopped_in_buckets(L);
    test_stopped_before_step(L, IGRAD_TOPOLOGY_FLAT);
    /* the two-level sync: the world's agreement comes before any node
     * collective, so the others time out there too */
    test_stopped_before_step(L, IGRAD_TOPOLOGY_HIER);
    test_bad_bytes_on_one_rank(L);
    igrad_layout_free(L);
    free(pids);
    if (survivors != MPI_COMM_NULL) MPI_Comm_free(&survivors);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("mpi_fault on %d ranks: %d failure(s)\n", np, total);
    MPI_Finalize();
    return total ? 1 : 0;
}
