/*
 * cuda_ranks.c — several ranks of CUDA engines on one GPU, against CPU
 * engines, bit for bit. NCCL refuses two ranks on one device, so the
 * ranks here are P threads of one process joined by a test communicator:
 * a custom comm (igrad_comm_ops_t) over a table of the ranks' buffers and
 * a barrier, whose collectives copy between the threads' buffers (device
 * memory for the CUDA engines' buckets and all-to-alls, host memory for
 * the CPU engines and for the agreement) and add in rank order. Each
 * thread runs a CPU engine over one such comm and a CUDA engine over
 * another, on the same gradients, and compares gradients and residuals
 * after every step. This is what runs the device sparse all-reduce past
 * one rank (the owners' re-sparsification, the remainders into the
 * residuals), the gather route's rank-ordered unpack, and the two-level
 * sync with nodes of 1 and 2 ranks (the comm splits; its node reduce and
 * broadcast copy between the threads too), at P = 2, 3, 4, with F32, BF16
 * and FP8 E4M3 wire values.
 * Without a CUDA device the same harness runs with a CPU engine in place
 * of the CUDA one (the rehearsal: it must give the same bits, so the
 * harness, the configs and the comparisons are known to work), then the
 * test prints "SKIP: ..." and exits 77 (CTest: Skipped); a rehearsal that
 * fails exits 1.
 */
#define _POSIX_C_SOURCE 200809L
#include "igrad.h"
#include "igrad_cuda.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 4

/* ---- the test communicator ---- */

typedef struct hub {
    int P;
    int device; /* bucket collectives and alltoallv on device memory */
    int users;  /* members not yet destroyed (split hubs are freed by the last) */
    pthread_barrier_t bar;
    const void *send[MAXP];
    void *recv[MAXP];
    const size_t *send_nbytes[MAXP], *send_displs[MAXP];
    int color[MAXP], key[MAXP];
    struct hub *sub[MAXP]; /* split: the hub each color's first rank made */
} hub_t;

typedef struct member {
    hub_t *hub;
    int rank;
    cudaStream_t stream; /* set_stream's (device hubs) */
} member_t;

static void wait_all(hub_t *h) { pthread_barrier_wait(&h->bar); }

/* A copy between ranks' buffers: host memory, or device memory on this
 * member's stream, finished on return. */
static igrad_status_t copy(const member_t *m, int device, void *dst, const void *src,
                           size_t nbytes)
{
    if (!nbytes || dst == src) return IGRAD_OK;
    if (!device) {
        memcpy(dst, src, nbytes);
        return IGRAD_OK;
    }
    if (cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, m->stream) != cudaSuccess ||
        cudaStreamSynchronize(m->stream) != cudaSuccess)
        return IGRAD_E_COMM;
    return IGRAD_OK;
}

static igrad_status_t gather(member_t *m, int device, const void *send, size_t nbytes,
                             void *recv)
{
    hub_t *h = m->hub;
    if (device && cudaStreamSynchronize(m->stream) != cudaSuccess) return IGRAD_E_COMM;
    h->send[m->rank] = send;
    wait_all(h);
    igrad_status_t st = IGRAD_OK;
    for (int r = 0; r < h->P && st == IGRAD_OK; r++)
        st = copy(m, device, (unsigned char *)recv + (size_t)r * nbytes, h->send[r], nbytes);
    wait_all(h);
    return st;
}

/* Every rank's count elements added in rank order (max / min likewise),
 * through host copies, into recv of every rank (root -1) or of root. */
static igrad_status_t reduce_to(member_t *m, int device, const void *send, void *recv,
                                size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op,
                                int root)
{
    hub_t *h = m->hub;
    size_t w = igrad_dtype_nbytes(dtype), n = count * w;
    if (device && cudaStreamSynchronize(m->stream) != cudaSuccess) return IGRAD_E_COMM;
    unsigned char *acc = malloc(n ? n : 1), *part = malloc(n ? n : 1);
    h->send[m->rank] = send;
    wait_all(h);
    igrad_status_t st = copy(m, device, acc, h->send[0], n);
    for (int r = 1; r < h->P && st == IGRAD_OK; r++) {
        st = copy(m, device, part, h->send[r], n);
        for (size_t i = 0; i < count && st == IGRAD_OK; i++) {
#define FOLD(T)                                                                           \
    do {                                                                                  \
        T a, b;                                                                           \
        memcpy(&a, acc + i * w, w);                                                       \
        memcpy(&b, part + i * w, w);                                                      \
        a = op == IGRAD_REDUCE_SUM ? a + b : op == IGRAD_REDUCE_MAX ? (a > b ? a : b)     \
                                                                    : (a < b ? a : b);    \
        memcpy(acc + i * w, &a, w);                                                       \
    } while (0)
            if (dtype == IGRAD_DTYPE_F32) FOLD(float);
            else if (dtype == IGRAD_DTYPE_F64) FOLD(double);
            else FOLD(int64_t);
#undef FOLD
        }
    }
    wait_all(h); /* everyone has read every send */
    if (st == IGRAD_OK && (root < 0 || root == m->rank)) st = copy(m, device, recv, acc, n);
    free(acc);
    free(part);
    return st;
}

static igrad_status_t op_allgather(void *user, const void *send, size_t nbytes, void *recv)
{
    return gather(user, 0, send, nbytes, recv);
}

static igrad_status_t op_allreduce(void *user, const void *send, void *recv, size_t count,
                                   igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    return reduce_to(user, 0, send, recv, count, dtype, op, -1);
}

static igrad_status_t op_bcast(void *user, void *buf, size_t nbytes, int root)
{
    member_t *m = user;
    m->hub->recv[m->rank] = buf;
    wait_all(m->hub);
    if (m->rank != root) memcpy(buf, m->hub->recv[root], nbytes);
    wait_all(m->hub);
    return IGRAD_OK;
}

static igrad_status_t op_barrier(void *user)
{
    wait_all(((member_t *)user)->hub);
    return IGRAD_OK;
}

static igrad_status_t op_iallgather(void *user, const void *send, size_t nbytes, void *recv,
                                    void **handle)
{
    member_t *m = user;
    *handle = NULL; /* done at issue */
    return gather(m, m->hub->device, send, nbytes, recv);
}

static igrad_status_t op_iallreduce(void *user, const void *send, void *recv, size_t count,
                                    igrad_dtype_t dtype, igrad_reduce_op_t op, void **handle)
{
    member_t *m = user;
    *handle = NULL;
    return reduce_to(m, m->hub->device, send, recv, count, dtype, op, -1);
}

static igrad_status_t op_wait(void *user, void *handle)
{
    (void)user, (void)handle;
    return IGRAD_OK;
}

static igrad_status_t op_set_stream(void *user, void *stream)
{
    ((member_t *)user)->stream = (cudaStream_t)stream;
    return IGRAD_OK;
}

static igrad_status_t op_alltoallv(void *user, const void *send, const size_t *send_nbytes,
                                   const size_t *send_displs, void *recv,
                                   const size_t *recv_nbytes, const size_t *recv_displs)
{
    member_t *m = user;
    hub_t *h = m->hub;
    if (h->device && cudaStreamSynchronize(m->stream) != cudaSuccess) return IGRAD_E_COMM;
    h->send[m->rank] = send;
    h->send_nbytes[m->rank] = send_nbytes;
    h->send_displs[m->rank] = send_displs;
    wait_all(h);
    igrad_status_t st = IGRAD_OK;
    for (int j = 0; j < h->P && st == IGRAD_OK; j++) {
        size_t n = h->send_nbytes[j][m->rank];
        st = n != recv_nbytes[j] ? IGRAD_E_COMM
                                 : copy(m, h->device, (unsigned char *)recv + recv_displs[j],
                                        (const unsigned char *)h->send[j] +
                                            h->send_displs[j][m->rank],
                                        n);
    }
    wait_all(h);
    return st;
}

/* The two-level sync's node collectives. */
static igrad_status_t op_ireduce(void *user, const void *send, void *recv, size_t count,
                                 igrad_dtype_t dtype, igrad_reduce_op_t op, int root,
                                 void **handle)
{
    member_t *m = user;
    *handle = NULL;
    return reduce_to(m, m->hub->device, send, recv, count, dtype, op, root);
}

static igrad_status_t op_ibcast(void *user, void *buf, size_t nbytes, int root, void **handle)
{
    member_t *m = user;
    hub_t *h = m->hub;
    *handle = NULL;
    if (h->device && cudaStreamSynchronize(m->stream) != cudaSuccess) return IGRAD_E_COMM;
    h->recv[m->rank] = buf;
    wait_all(h);
    igrad_status_t st = m->rank == root ? IGRAD_OK : copy(m, h->device, buf, h->recv[root], nbytes);
    wait_all(h);
    return st;
}

/* The tables of split comms (they outlive them; filled by main). */
static igrad_comm_ops_t split_ops[2];

/* The ranks of one color, ordered by key then rank, get a hub of their
 * own, made by the first of them (in this comm's ranks) and freed by the
 * last member destroyed. */
static igrad_status_t op_split(void *user, int color, int key, const igrad_comm_ops_t **ops_out,
                               void **user_out, int *rank_out, int *size_out)
{
    member_t *m = user;
    hub_t *h = m->hub;
    h->color[m->rank] = color;
    h->key[m->rank] = key;
    wait_all(h);
    int n = 0, first = -1, place = 0; /* place: keys ascending, then ranks */
    for (int r = 0; r < h->P; r++) {
        if (h->color[r] != color) continue;
        if (first < 0) first = r;
        n++;
        place += r != m->rank && (h->key[r] < key || (h->key[r] == key && r < m->rank));
    }
    if (m->rank == first) {
        hub_t *sub = calloc(1, sizeof *sub);
        sub->P = n;
        sub->device = h->device;
        sub->users = n;
        pthread_barrier_init(&sub->bar, NULL, (unsigned)n);
        h->sub[m->rank] = sub;
    }
    wait_all(h);
    member_t *mm = calloc(1, sizeof *mm);
    mm->hub = h->sub[first];
    mm->rank = place;
    mm->stream = m->stream;
    wait_all(h); /* every rank has read its hub */
    *ops_out = &split_ops[h->device != 0];
    *user_out = mm;
    *rank_out = place;
    *size_out = n;
    return IGRAD_OK;
}

static void op_destroy(void *user)
{
    member_t *m = user;
    if (__atomic_sub_fetch(&m->hub->users, 1, __ATOMIC_ACQ_REL) == 0) {
        pthread_barrier_destroy(&m->hub->bar);
        free(m->hub);
    }
    free(m);
}

static igrad_comm_ops_t table(int device, int split)
{
    igrad_comm_ops_t ops;
    memset(&ops, 0, sizeof ops);
    ops.size = sizeof ops;
    ops.allgather = op_allgather;
    ops.allreduce = op_allreduce;
    ops.bcast = op_bcast;
    ops.barrier = op_barrier;
    ops.iallgather = op_iallgather;
    ops.iallreduce = op_iallreduce;
    ops.wait = op_wait;
    ops.memory = device ? IGRAD_MEMORY_CUDA : IGRAD_MEMORY_HOST;
    ops.set_stream = device ? op_set_stream : NULL;
    ops.split = op_split;
    ops.ireduce = op_ireduce;
    ops.ibcast = op_ibcast;
    ops.alltoallv = op_alltoallv;
    if (split) ops.destroy = op_destroy; /* a split comm's member and hub */
    return ops;
}

static igrad_status_t make_comm(member_t *m, igrad_comm_t **out)
{
    igrad_comm_ops_t ops = table(m->hub->device, 0);
    return igrad_comm_create_custom(&ops, m, m->rank, m->hub->P, out);
}

/* ---- the ranks ---- */

typedef struct shape {
    const char *name;
    int ndim;
    int64_t dims[2];
} shape_t;

static const shape_t shapes[] = {
    {"model.embed_tokens.weight", 2, {100, 32}},
    {"model.layers.0.self_attn.q_proj.weight", 2, {64, 64}},
    {"model.layers.0.self_attn.v_proj.weight", 2, {64, 64}},
    {"model.layers.0.input_layernorm.weight", 1, {64, 0}},
    {"model.layers.0.mlp.up_proj.weight", 2, {32, 300}},
    {"model.layers.0.mlp.down_proj.weight", 2, {300, 32}},
    {"model.norm.weight", 1, {5000, 0}},
    {"lm_head.weight", 2, {100, 120}},
};
#define NT (sizeof shapes / sizeof *shapes)

static int64_t count_of(size_t t)
{
    return shapes[t].ndim == 1 ? shapes[t].dims[0] : shapes[t].dims[0] * shapes[t].dims[1];
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Rank r's gradient entry i of tensor t at `step`: many ties across the
 * ranks (so the owners' sums tie too), normals and zeros. */
static float grad_at(int r, int64_t step, size_t t, int64_t i)
{
    uint64_t x = mix64((uint64_t)step * 1000003u + t * 7919u + (uint64_t)i * 2654435761u +
                       (uint64_t)r * 0x51ed27u);
    if ((t + (size_t)step) % 2 == 0) return (float)((int)(x % 5) - 2) * 0.25f;
    return (x % 13 == 0) ? 0.0f : (float)((double)(int64_t)(x >> 11) * 0x1.0p-52 - 1.0);
}

typedef struct job {
    const char *name;
    const igrad_config_t *cfg;
    int steps, rank, cuda;
    hub_t *hhub, *dhub;
    int failures;
    char first[512];
} job_t;

#define JCHECK(j, cond, ...)                                                     \
    do {                                                                         \
        if (!(cond)) {                                                           \
            if (!(j)->failures++) snprintf((j)->first, sizeof (j)->first, __VA_ARGS__); \
        }                                                                        \
    } while (0)

/* n floats of the second engine (device memory when cuda) against the
 * first's, bit for bit; @return 0 if equal. */
static int differs(job_t *j, const float *a, const float *b, int64_t n, float *scratch,
                   const char *what, int step, size_t t)
{
    if (j->cuda) {
        if (cudaMemcpy(scratch, b, (size_t)n * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
            JCHECK(j, 0, "rank %d: copying %s back failed", j->rank, what);
            return 1;
        }
        b = scratch;
    }
    if (!memcmp(a, b, (size_t)n * 4)) return 0;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, 4)) {
            JCHECK(j, 0, "rank %d step %d: %s of %s differs at %lld: cpu %a, other %a", j->rank,
                   step, what, shapes[t].name, (long long)i, (double)a[i], (double)b[i]);
            break;
        }
    return 1;
}

static void *rank_main(void *arg)
{
    job_t *j = arg;
    member_t hm = {j->hhub, j->rank, NULL}, dm = {j->dhub, j->rank, NULL};
    igrad_layout_t *L = NULL;
    igrad_comm_t *hc = NULL, *dc = NULL;
    igrad_engine_t *ce = NULL, *ge = NULL;
    cudaStream_t s = NULL;
    float *hg[NT] = {0}, *gg[NT] = {0}, *scratch = malloc(70000 * 4);
    igrad_status_t st = igrad_layout_create(&L);
    for (size_t t = 0; t < NT && st == IGRAD_OK; t++)
        st = igrad_layout_add(L, shapes[t].name, IGRAD_DTYPE_F32, shapes[t].ndim, shapes[t].dims);
    if (st == IGRAD_OK) st = make_comm(&hm, &hc);
    if (st == IGRAD_OK) st = make_comm(&dm, &dc);
    if (st == IGRAD_OK && j->cuda && cudaStreamCreate(&s) != cudaSuccess) st = IGRAD_E_STATE;
    if (st == IGRAD_OK) st = igrad_engine_create(L, NULL, j->cfg, hc, &ce);
    if (st == IGRAD_OK)
        st = j->cuda ? igrad_engine_create_cuda(L, NULL, j->cfg, dc, 0, s, &ge)
                     : igrad_engine_create(L, NULL, j->cfg, dc, &ge);
    JCHECK(j, st == IGRAD_OK, "rank %d: setup: %s", j->rank, igrad_last_error());
    for (size_t t = 0; t < NT && st == IGRAD_OK; t++) {
        size_t nb = (size_t)count_of(t) * 4;
        hg[t] = malloc(nb);
        if (j->cuda) {
            if (cudaMalloc((void **)&gg[t], nb) != cudaSuccess) st = IGRAD_E_NOMEM;
        } else {
            gg[t] = malloc(nb);
        }
    }
    for (int step = 0; step < j->steps && st == IGRAD_OK && !j->failures; step++) {
        for (size_t t = 0; t < NT; t++) {
            for (int64_t i = 0; i < count_of(t); i++) hg[t][i] = grad_at(j->rank, step, t, i);
            if (j->cuda)
                cudaMemcpy(gg[t], hg[t], (size_t)count_of(t) * 4, cudaMemcpyHostToDevice);
            else
                memcpy(gg[t], hg[t], (size_t)count_of(t) * 4);
        }
        igrad_status_t a = igrad_engine_sync(ce, step, hg);
        JCHECK(j, a == IGRAD_OK, "rank %d step %d: cpu engine: %s", j->rank, step,
               igrad_last_error());
        igrad_status_t b = igrad_engine_sync(ge, step, gg);
        JCHECK(j, b == IGRAD_OK, "rank %d step %d: other engine: %s", j->rank, step,
               igrad_last_error());
        if (a != IGRAD_OK || b != IGRAD_OK) break;
        if (j->cuda) cudaStreamSynchronize(s);
        for (size_t t = 0; t < NT; t++) {
            if (differs(j, hg[t], gg[t], count_of(t), scratch, "gradient", step, t)) break;
            const float *ra = igrad_engine_residual(ce, t), *rb = igrad_engine_residual(ge, t);
            if (ra && rb && differs(j, ra, rb, count_of(t), scratch, "residual", step, t)) break;
        }
        igrad_step_stats_t sa, sb;
        if (igrad_engine_last_stats(ce, &sa) == IGRAD_OK &&
            igrad_engine_last_stats(ge, &sb) == IGRAD_OK)
            JCHECK(j, sa.entries_sent == sb.entries_sent && sa.wire_nbytes == sb.wire_nbytes,
                   "rank %d step %d: sent %lld / %.0f wire bytes vs %lld / %.0f", j->rank, step,
                   (long long)sa.entries_sent, (double)sa.wire_nbytes,
                   (long long)sb.entries_sent, (double)sb.wire_nbytes);
        if (j->cfg->collective == IGRAD_COLLECTIVE_SPARSE_REDUCE)
            JCHECK(j, sb.sparse_reduce_buckets > 0 || sb.entries_sent == 0,
                   "rank %d step %d: no sparse all-reduce bucket ran", j->rank, step);
    }
    for (size_t t = 0; t < NT; t++) {
        free(hg[t]);
        if (j->cuda) cudaFree(gg[t]);
        else free(gg[t]);
    }
    free(scratch);
    igrad_engine_free(ce);
    igrad_engine_free(ge);
    igrad_comm_free(hc);
    igrad_comm_free(dc);
    if (s) cudaStreamDestroy(s);
    igrad_layout_free(L);
    return NULL;
}

/* One config at P ranks; @return the failures. */
static int run(const char *name, const igrad_config_t *cfg, int P, int steps, int cuda)
{
    hub_t hh, dh;
    memset(&hh, 0, sizeof hh);
    memset(&dh, 0, sizeof dh);
    hh.P = dh.P = P;
    dh.device = cuda;
    pthread_barrier_init(&hh.bar, NULL, (unsigned)P);
    pthread_barrier_init(&dh.bar, NULL, (unsigned)P);
    job_t jobs[MAXP];
    pthread_t th[MAXP];
    for (int r = 0; r < P; r++) {
        jobs[r] = (job_t){name, cfg, steps, r, cuda, &hh, &dh, 0, ""};
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    int failures = 0;
    for (int r = 0; r < P; r++) {
        pthread_join(th[r], NULL);
        if (jobs[r].failures) fprintf(stderr, "%s P=%d: FAIL: %s\n", name, P, jobs[r].first);
        failures += jobs[r].failures;
    }
    pthread_barrier_destroy(&hh.bar);
    pthread_barrier_destroy(&dh.bar);
    printf("%-34s P=%d %s\n", name, P, failures ? "DIFFERS" : "same bits");
    return failures;
}

static int run_all(int cuda)
{
    int failures = 0;
    for (int P = 2; P <= MAXP; P++) {
        igrad_config_t c = IGRAD_CONFIG_INIT;
        c.method = IGRAD_METHOD_TOPK_SYNC;
        c.collective = IGRAD_COLLECTIVE_SPARSE_REDUCE;
        c.density = 0.05;
        c.buckets = 1;
        failures += run("sar topk 1 bucket", &c, P, 4, cuda);

        c.method = IGRAD_METHOD_ADTOPK_SYNC;
        c.buckets = 3;
        failures += run("sar adtopk 3 buckets", &c, P, 4, cuda);

        c.residual = IGRAD_RESIDUAL_DROP;
        failures += run("sar adtopk drop", &c, P, 3, cuda);

        c = (igrad_config_t)IGRAD_CONFIG_INIT; /* ig: deferral, online profile */
        c.collective = IGRAD_COLLECTIVE_SPARSE_REDUCE;
        c.profile_steps = 2;
        c.release_period = 2;
        failures += run("sar ig online", &c, P, 6, cuda);

        c = (igrad_config_t)IGRAD_CONFIG_INIT;
        c.method = IGRAD_METHOD_TOPK_SYNC;
        c.collective = IGRAD_COLLECTIVE_GATHER;
        failures += run("gather topk", &c, P, 3, cuda);

        /* 16-bit and FP8 wire values: every rank unpacks the others'
         * codes (and FP8 scales) in rank order */
        c.value_dtype = IGRAD_DTYPE_BF16;
        failures += run("gather topk bf16", &c, P, 3, cuda);
        c.method = IGRAD_METHOD_ADTOPK_SYNC;
        c.value_dtype = IGRAD_DTYPE_F8_E4M3;
        c.block_entries = 700;
        failures += run("gather adtopk fp8", &c, P, 3, cuda);
        c.collective = IGRAD_COLLECTIVE_SPARSE_REDUCE;
        failures += run("sar adtopk fp8", &c, P, 3, cuda); /* 8-byte entries, 2.x-byte wire */

        /* The two-level sync: nodes of 2 ranks (and of 1 at P = 2): the
         * node sums into the owners' device shards, the shard engines'
         * exchange between nodes, the broadcast back. */
        for (int L = 1; L <= 2; L++) {
            if (P % L || (L == 1 && P != 2)) continue;
            c = (igrad_config_t)IGRAD_CONFIG_INIT;
            c.method = IGRAD_METHOD_TOPK_SYNC;
            c.topology = IGRAD_TOPOLOGY_HIER;
            c.ranks_per_node = L;
            failures += run(L == 1 ? "hier L=1 topk" : "hier L=2 topk", &c, P, 3, cuda);
            c.collective = IGRAD_COLLECTIVE_SPARSE_REDUCE;
            failures += run(L == 1 ? "hier L=1 sar topk" : "hier L=2 sar topk", &c, P, 3, cuda);
            c.method = IGRAD_METHOD_ADTOPK_SYNC;
            c.collective = IGRAD_COLLECTIVE_REDUCE;
            c.momentum = 0.9;
            failures += run(L == 1 ? "hier L=1 adtopk reduce mom" : "hier L=2 adtopk reduce mom",
                            &c, P, 3, cuda);
            c.collective = IGRAD_COLLECTIVE_GATHER;
            c.value_dtype = IGRAD_DTYPE_F8_E4M3;
            failures += run(L == 1 ? "hier L=1 adtopk fp8 mom" : "hier L=2 adtopk fp8 mom", &c,
                            P, 3, cuda);
        }
    }
    return failures;
}

int main(void)
{
    split_ops[0] = table(0, 1);
    split_ops[1] = table(1, 1);
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        printf("no CUDA device: the rehearsal, CPU engines on both sides\n");
        int failures = run_all(0);
        if (failures) {
            printf("FAIL: the rehearsal differs (%d check(s))\n", failures);
            return 1;
        }
        printf("SKIP: no CUDA device (cudaGetDeviceCount: %s); the rehearsal gave the same bits\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return 77;
    }
    int failures = run_all(1);
    if (failures) {
        printf("FAIL: %d check(s) failed\n", failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
