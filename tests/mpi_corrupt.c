/*
 * mpi_corrupt.c — bad bytes from a peer, and a state file of another
 * topology, each reported as what it is (CTest runs it with -np 2 and
 * -np 4). The engines run over a custom communicator on MPI whose
 * allgathers can overwrite the last rank's block after it arrived, on
 * every rank alike (a transport that corrupts what that rank sent), so
 * that every rank takes the same path and nothing is left pending:
 *
 *  1. the step's agreement block (flat: every byte; config.topology hier:
 *     its status word): every rank fails with IGRAD_E_COMM naming the rank
 *     whose block is corrupt and the bad word (not "failed on rank R
 *     (unknown status)", after which the engine went on), and the engine
 *     is unusable after it;
 *  2. hier's world verdict (the 3 words each rank sends after its shard's
 *     agreement): the same;
 *  3. the values of a sparse bucket made NaN, indices intact: IGRAD_E_COMM
 *     naming the rank, the bucket and the tensor (not gradients of NaN
 *     returned as if this rank's own);
 *  4. a hier state file loaded by a hier engine of another ranks_per_node
 *     (built-in MPI comm): IGRAD_E_MISMATCH on every rank, rank 0's message
 *     saying that the topology differs with both ranks_per_node values.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h" /* IGRAD__AGREE_WORDS; a bucket's blocks */
#include "igrad.h"

#include "mpi_util.h"

static int victim;

/* ---- a custom comm over MPI with a corruption hook ------------------------ */

typedef struct tcomm {
    MPI_Comm c;
} tcomm_t;

enum { ARM_OFF, ARM_BLOCKING, ARM_BUCKET };

/* The one corruption armed: the next blocking allgather of `nbytes` per
 * rank (ARM_BLOCKING) or the next iallgather (ARM_BUCKET) on `comm` gets
 * fn applied to the victim's block, once. */
static struct {
    int kind;
    const tcomm_t *comm;
    size_t nbytes;
    void (*fn)(unsigned char *block, size_t nbytes);
    int done;
} arm;

static void after_gather(const tcomm_t *c, int kind, void *recv, size_t nbytes)
{
    if (arm.kind != kind || arm.comm != c || (arm.nbytes && arm.nbytes != nbytes)) return;
    arm.kind = ARM_OFF;
    arm.done = 1;
    arm.fn((unsigned char *)recv + (size_t)victim * nbytes, nbytes);
}

static void all_ff(unsigned char *block, size_t nbytes) { memset(block, 0xff, nbytes); }

/* The first word only (an agreement block's status word). */
static void status_ff(unsigned char *block, size_t nbytes)
{
    (void)nbytes;
    memset(block, 0xff, sizeof(uint64_t));
}

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

static igrad_status_t t_allgather(void *user, const void *send, size_t nbytes, void *recv)
{
    tcomm_t *t = user;
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
    if (rc == MPI_SUCCESS) after_gather(t, ARM_BLOCKING, recv, nbytes);
    return rc_of(rc);
}

static igrad_status_t t_allreduce(void *user, const void *send, void *recv, size_t count,
                                  igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    tcomm_t *t = user;
    return rc_of(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count,
                               type_of(dtype), op_of(op), t->c));
}

static igrad_status_t t_bcast(void *user, void *buf, size_t nbytes, int root)
{
    tcomm_t *t = user;
    return rc_of(MPI_Bcast(buf, (int)nbytes, MPI_BYTE, root, t->c));
}

static igrad_status_t t_barrier(void *user)
{
    tcomm_t *t = user;
    return rc_of(MPI_Barrier(t->c));
}

/* The non-blocking variants complete at once (handle NULL). */
static igrad_status_t t_iallgather(void *user, const void *send, size_t nbytes, void *recv,
                                   void **handle)
{
    tcomm_t *t = user;
    *handle = NULL;
    int rc = MPI_Allgather(send, (int)nbytes, MPI_BYTE, recv, (int)nbytes, MPI_BYTE, t->c);
    if (rc == MPI_SUCCESS) after_gather(t, ARM_BUCKET, recv, nbytes);
    return rc_of(rc);
}

static igrad_status_t t_iallreduce(void *user, const void *send, void *recv, size_t count,
                                   igrad_dtype_t dtype, igrad_reduce_op_t op, void **handle)
{
    *handle = NULL;
    return t_allreduce(user, send, recv, count, dtype, op);
}

static igrad_status_t t_wait(void *user, void *handle)
{
    (void)user, (void)handle;
    return IGRAD_OK;
}

static void t_destroy(void *user)
{
    tcomm_t *t = user;
    MPI_Comm_free(&t->c);
    free(t);
}

static igrad_status_t t_split(void *user, int color, int key, const igrad_comm_ops_t **ops_out,
                              void **user_out, int *rank_out, int *size_out);

static igrad_status_t t_ireduce(void *user, const void *send, void *recv, size_t count,
                                igrad_dtype_t dtype, igrad_reduce_op_t op, int root,
                                void **handle)
{
    tcomm_t *t = user;
    *handle = NULL;
    int rank;
    MPI_Comm_rank(t->c, &rank);
    return rc_of(MPI_Reduce(rank == root && send == recv ? MPI_IN_PLACE : send, recv, (int)count,
                            type_of(dtype), op_of(op), root, t->c));
}

static igrad_status_t t_ibcast(void *user, void *buf, size_t nbytes, int root, void **handle)
{
    *handle = NULL;
    return t_bcast(user, buf, nbytes, root);
}

static const igrad_comm_ops_t t_ops = {
    .size = sizeof(igrad_comm_ops_t),
    .allgather = t_allgather,
    .allreduce = t_allreduce,
    .bcast = t_bcast,
    .barrier = t_barrier,
    .iallgather = t_iallgather,
    .iallreduce = t_iallreduce,
    .wait = t_wait,
    .destroy = t_destroy,
    .memory = IGRAD_MEMORY_HOST,
    .split = t_split,
    .ireduce = t_ireduce,
    .ibcast = t_ibcast,
};

/* One machine: color -1 (this node's ranks) is every rank. */
static igrad_status_t t_split(void *user, int color, int key, const igrad_comm_ops_t **ops_out,
                              void **user_out, int *rank_out, int *size_out)
{
    tcomm_t *t = user, *n = calloc(1, sizeof *n);
    if (!n) return IGRAD_E_NOMEM;
    if (MPI_Comm_split(t->c, color < 0 ? 0 : color, key, &n->c) != MPI_SUCCESS) {
        free(n);
        return IGRAD_E_COMM;
    }
    MPI_Comm_rank(n->c, rank_out);
    MPI_Comm_size(n->c, size_out);
    *ops_out = &t_ops;
    *user_out = n;
    return IGRAD_OK;
}

static igrad_comm_t *tcomm_new(tcomm_t **t)
{
    *t = calloc(1, sizeof **t);
    REQUIRE(*t && MPI_Comm_dup(MPI_COMM_WORLD, &(*t)->c) == MPI_SUCCESS);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_custom(&t_ops, *t, me, np, &comm) == IGRAD_OK);
    return comm;
}

/* ---- the checks ------------------------------------------------------------ */

static igrad_config_t config_of(igrad_topology_t topology, int rpn)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.density = 0.05;
    c.dense_below = 0;
    c.buckets = 2;
    c.block_entries = 256;
    c.threads = 1;
    c.timeout_s = 60;
    c.topology = topology;
    c.ranks_per_node = rpn;
    return c;
}

static int has(const char *frag)
{
    return strstr(igrad_last_error(), frag) != NULL;
}

/* A step with the armed corruption: IGRAD_E_COMM on every rank with
 * `want` (%d: the victim) in the message and no "unknown status"; the
 * engine refuses the next step. */
static void corrupt_step(const mpi_model_t *m, igrad_config_t c, int kind, size_t nbytes,
                         void (*fn)(unsigned char *, size_t), const char *want,
                         const char *what)
{
    tcomm_t *t = NULL;
    igrad_comm_t *comm = tcomm_new(&t);
    igrad_engine_t *e = NULL;
    REQUIRE(igrad_engine_create(m->L, m->prof, &c, comm, &e) == IGRAD_OK);
    float **g = mpi_grads_alloc(m);
    mpi_grads_fill(m, g, me, 0);
    CHECK_OK(igrad_engine_sync(e, 0, g));
    arm.kind = kind;
    arm.comm = t;
    arm.nbytes = nbytes;
    arm.fn = fn;
    arm.done = 0;
    mpi_grads_fill(m, g, me, 1);
    CHECK_STATUS(igrad_engine_sync(e, 1, g), IGRAD_E_COMM);
    CHECK(arm.done, "%s: the corruption was never applied", what);
    char frag[160];
    snprintf(frag, sizeof frag, want, victim);
    CHECK(has(frag) && !has("unknown status"), "%s: message: %s", what, igrad_last_error());
    if (me == 0) printf("mpi_corrupt: %s: %s\n", what, igrad_last_error());
    mpi_grads_fill(m, g, me, 2);
    CHECK_STATUS(igrad_engine_sync(e, 2, g), IGRAD_E_STATE);
    arm.kind = ARM_OFF;
    mpi_grads_free(m, g);
    igrad_engine_free(e);
    igrad_comm_free(comm);
}

/* 3: the values of the step's first bucket (a gather: dense_below 0) from
 * the victim made NaN, its indices left as sent. */
static const igrad_engine_t *wire_engine;

static void nan_values(unsigned char *block, size_t nbytes)
{
    const igrad_engine_t *e = wire_engine;
    const igrad__step_bucket_t *bk = &e->step.bk[0];
    REQUIRE(bk->send_nbytes == nbytes);
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &e->step.binfo[e->step.order[bk->first + q]];
        memset(block + bi->val_off, 0xff, (size_t)bi->count * (size_t)e->plan.value_nbytes);
    }
}

static void check_wire_values(const mpi_model_t *m)
{
    tcomm_t *t = NULL;
    igrad_comm_t *comm = tcomm_new(&t);
    igrad_config_t c = config_of(IGRAD_TOPOLOGY_FLAT, 0);
    igrad_engine_t *e = NULL;
    REQUIRE(igrad_engine_create(m->L, m->prof, &c, comm, &e) == IGRAD_OK);
    float **g = mpi_grads_alloc(m);
    mpi_grads_fill(m, g, me, 0);
    CHECK_OK(igrad_engine_sync(e, 0, g));
    wire_engine = e;
    arm.kind = ARM_BUCKET;
    arm.comm = t;
    arm.nbytes = 0;
    arm.fn = nan_values;
    arm.done = 0;
    mpi_grads_fill(m, g, me, 1);
    CHECK_STATUS(igrad_engine_sync(e, 1, g), IGRAD_E_COMM);
    CHECK(arm.done, "the values were never corrupted");
    char frag[96];
    snprintf(frag, sizeof frag, "bucket %d: rank %d sent the non-finite value ",
             wire_engine->step.bk[0].index, victim);
    CHECK(has(frag) && has("nan for tensor"), "message: %s", igrad_last_error());
    if (me == 0) printf("mpi_corrupt: wire values: %s\n", igrad_last_error());
    arm.kind = ARM_OFF;
    mpi_grads_free(m, g);
    igrad_engine_free(e);
    igrad_comm_free(comm);
}

/* 4: saved at ranks_per_node 2, loaded at another (np 2: 1, np 4: 4). */
static void check_state_topology(const mpi_model_t *m)
{
    int other = np == 2 ? 1 : 4;
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_config_t ca = config_of(IGRAD_TOPOLOGY_HIER, 2), cb = config_of(IGRAD_TOPOLOGY_HIER, other);
    igrad_engine_t *a = NULL, *b = NULL;
    REQUIRE(igrad_engine_create(m->L, m->prof, &ca, comm, &a) == IGRAD_OK);
    REQUIRE(igrad_engine_create(m->L, m->prof, &cb, comm, &b) == IGRAD_OK);
    float **g = mpi_grads_alloc(m);
    mpi_grads_fill(m, g, me, 0);
    CHECK_OK(igrad_engine_sync(a, 0, g));
    char path[128];
    snprintf(path, sizeof path, "mpi_corrupt_state_np%d_r%d.bin", np, me);
    CHECK_OK(igrad_engine_save_state(a, path));
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK_STATUS(igrad_engine_load_state(b, path), IGRAD_E_MISMATCH);
    if (me == 0) {
        char want[160];
        snprintf(want, sizeof want,
                 "holds a shard of %d nodes, config.ranks_per_node 2%s, this config.topology "
                 "hier engine has %d nodes, config.ranks_per_node %d",
                 np / 2, "", np / other, other);
        CHECK(has("load state: the topology differs: ") && has(want), "message: %s",
              igrad_last_error());
        printf("mpi_corrupt: state topology: %s\n", igrad_last_error());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    remove(path);
    mpi_grads_free(m, g);
    igrad_engine_free(a);
    igrad_engine_free(b);
    igrad_comm_free(comm);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    victim = np - 1;
    mpi_model_t m;
    mpi_model_init(&m);
    const size_t agree_nbytes = IGRAD__AGREE_WORDS * sizeof(uint64_t);
    corrupt_step(&m, config_of(IGRAD_TOPOLOGY_FLAT, 0), ARM_BLOCKING, agree_nbytes, all_ff,
                 "step 1: agreement: rank %d's block is corrupt (its check word is 0x",
                 "flat agreement");
    corrupt_step(&m, config_of(IGRAD_TOPOLOGY_HIER, 2), ARM_BLOCKING, agree_nbytes, status_ff,
                 "step 1: agreement: rank %d's block is corrupt (its status word is 0x",
                 "hier agreement");
    corrupt_step(&m, config_of(IGRAD_TOPOLOGY_HIER, 2), ARM_BLOCKING, 3 * sizeof(uint64_t),
                 all_ff, "step 1: the world's verdict: rank %d's block is corrupt",
                 "hier verdict");
    check_wire_values(&m);
    check_state_topology(&m);
    mpi_model_free(&m);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0)
        printf("mpi_corrupt: %s (%d failures over %d ranks)\n", total ? "FAILED" : "ok", total,
               np);
    MPI_Finalize();
    return total ? 1 : 0;
}
