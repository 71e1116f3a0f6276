/*
 * test_sparse_allreduce.c — the sparse all-reduce (sparse_allreduce.c) on
 * one rank, and the internal alltoallv's argument checks (comm.c) on the
 * self comm: kout and the index ranges, the next split points from
 * the owners' histograms (igrad__sar_next_bounds), the one-rank result against a
 * dense sum in input order, every refusal of bad input, a comm without
 * alltoallv (custom) refused, a custom comm with ops->alltoallv running it
 * (directly and as an engine's collective sparse_reduce, equal to the self
 * comm's; an older, shorter table goes without), a custom comm with memory
 * CUDA handing its alltoallv device buffers after set_stream (and refusing
 * host ones), the self comm refusing device buffers, workspace reuse.
 * Several ranks, corrupt peers and the byte counts are
 * tests/mpi_sparse_allreduce.c's.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm_internal.h"
#include "igrad.h"
#include "comm/sparse_allreduce.h"
#include "test_util.h"

static void test_kout_and_ranges(void **state)
{
    (void)state;
    assert_int_equal(igrad__sar_kout(0, 4), 0);
    assert_int_equal(igrad__sar_kout(1, 4), 1);
    assert_int_equal(igrad__sar_kout(8, 4), 2);
    assert_int_equal(igrad__sar_kout(9, 4), 3);
    assert_int_equal(igrad__sar_kout(7, 1), 7);
    /* D = 10 over 4 ranks: floor(10 r / 4) = 0, 2, 5, 7, 10 */
    static const uint64_t bounds[] = {0, 2, 5, 7, 10};
    for (int r = 0; r < 4; r++) {
        uint64_t lo, hi;
        igrad__sar_range(10, 4, r, &lo, &hi);
        assert_int_equal(lo, bounds[r]);
        assert_int_equal(hi, bounds[r + 1]);
    }
    /* D < P: empty ranges, and the last one ends at D; 2^32 still fits */
    uint64_t lo, hi, covered = 0;
    for (int r = 0; r < 8; r++) {
        igrad__sar_range(3, 8, r, &lo, &hi);
        assert_true(lo <= hi);
        assert_int_equal(lo, covered);
        covered = hi;
    }
    assert_int_equal(covered, 3);
    igrad__sar_range(UINT64_C(1) << 32, 3, 2, &lo, &hi);
    assert_int_equal(hi, UINT64_C(1) << 32);
}

/* The next split points from the owners' histograms: hand-computed
 * cases, the hysteresis, and on random histograms split points that
 * cover [0, D) without descending, the same on a second call. */
static void test_next_bounds(void **state)
{
    (void)state;
    enum { H = IGRAD__SAR_HIST };
    uint64_t next[5];
    /* P 2, D 160: all 100 entries in [0, 10), owner 0's first part:
     * split at 0 + 10 * 50 / 100 */
    uint64_t b2[3] = {0, 80, 160};
    uint32_t h2[2 * H] = {100};
    igrad__sar_next_bounds(b2, 2, h2, next);
    assert_int_equal(next[0], 0);
    assert_int_equal(next[1], 5);
    assert_int_equal(next[2], 160);
    /* within 1.05x the mean (51 of 100): kept; nothing received: kept */
    memset(h2, 0, sizeof h2);
    h2[3] = 51;
    h2[H + 7] = 49;
    igrad__sar_next_bounds(b2, 2, h2, next);
    assert_int_equal(next[1], 80);
    memset(h2, 0, sizeof h2);
    igrad__sar_next_bounds(b2, 2, h2, next);
    assert_int_equal(next[1], 80);
    /* P 4, D 1000, owner 3 with 10 entries per part; its parts start at
     * 750 + ceil(250 j / 8) = 750, 782, 813, 844, 875, 907, 938, 969: the
     * cumulative 20, 40, 60 end parts 1, 3, 5 */
    uint64_t b4[5] = {0, 250, 500, 750, 1000};
    uint32_t h4[4 * H] = {0};
    for (int j = 0; j < H; j++) h4[3 * H + j] = 10;
    igrad__sar_next_bounds(b4, 4, h4, next);
    static const uint64_t want4[5] = {0, 813, 875, 938, 1000};
    for (int r = 0; r <= 4; r++) assert_int_equal(next[r], want4[r]);
    /* random histograms over random split points */
    uint64_t x = 12345;
    for (int round = 0; round < 200; round++) {
        enum { P = 7 };
        const uint64_t D = 1 + mix64(x++) % 100000;
        uint64_t b[P + 1], n1[P + 1], n2[P + 1];
        uint32_t h[P * H];
        b[0] = 0;
        b[P] = D;
        for (int r = 1; r < P; r++) b[r] = mix64(x++) % (D + 1);
        for (int r = 1; r < P; r++) /* sort */
            for (int q = r; q > 1 && b[q] < b[q - 1]; q--) {
                uint64_t t = b[q];
                b[q] = b[q - 1];
                b[q - 1] = t;
            }
        for (int i = 0; i < P * H; i++) {
            int r = i / H, j = i % H;
            uint64_t w = b[r + 1] - b[r];
            int empty = (w * (uint64_t)(j + 1) + H - 1) / H == (w * (uint64_t)j + H - 1) / H;
            h[i] = empty || mix64(x++) % 3 == 0 ? 0 : (uint32_t)(mix64(x++) % 1000);
        }
        igrad__sar_next_bounds(b, P, h, n1);
        igrad__sar_next_bounds(b, P, h, n2);
        assert_memory_equal(n1, n2, sizeof n1);
        assert_int_equal(n1[0], 0);
        assert_int_equal(n1[P], D);
        for (int r = 0; r < P; r++) assert_true(n1[r] <= n1[r + 1]);
    }
}

/* One rank: kout = k, so everything is kept; duplicates add up in input
 * order, the result comes back ascending. */
static void test_one_rank(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    enum { D = 50, K = 40 };
    igrad__sar_entry_t in[K];
    float dense[D] = {0};
    int touched[D] = {0};
    for (int i = 0; i < K; i++) {
        uint64_t x = mix64((uint64_t)i);
        in[i].index = (uint32_t)((x >> 33) % 20) * 2 + 5; /* duplicates, gaps */
        in[i].value = (float)((int)((x >> 20) % 2001) - 1000) / 64.0f + 1e-3f * (float)i;
        dense[in[i].index] += in[i].value;
        touched[in[i].index] = 1;
    }
    igrad__sar_t w = {0};
    for (int round = 0; round < 2; round++) { /* the second reuses the workspace */
        assert_status(igrad__sar_allreduce(&w, comm, D, K, in), IGRAD_OK);
        size_t n = 0;
        for (uint32_t i = 0; i < D; i++) {
            if (!touched[i]) continue;
            assert_true(n < w.result_count);
            assert_int_equal(w.result[n].index, i);
            assert_memory_equal(&w.result[n].value, &dense[i], sizeof(float));
            n++;
        }
        assert_int_equal(w.result_count, n);
        assert_int_equal(w.remainder_count, 0);
        assert_int_equal(w.bytes.split_sent + w.bytes.split_recv + w.bytes.status_recv +
                             w.bytes.gather_recv,
                         0);
    }
    /* k = 0: an empty result */
    assert_status(igrad__sar_allreduce(&w, comm, D, 0, NULL), IGRAD_OK);
    assert_int_equal(w.result_count, 0);
    assert_int_equal(w.remainder_count, 0);
    igrad__sar_clear(&w);
    igrad__sar_clear(&w); /* cleared twice: nothing left to free */
    igrad__sar_clear(NULL);
    igrad_comm_free(comm);
}

static void test_bad_input(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    igrad__sar_t w = {0};
    igrad__sar_entry_t in[3] = {{1, 1.0f}, {2, 2.0f}, {10, 3.0f}};
    assert_status(igrad__sar_allreduce(&w, comm, 10, 3, in), IGRAD_E_INVALID);
    assert_error_has("rank 0's input entry 2 has index 10 outside [0, 10)");
    assert_null(w.result);
    in[2].index = 3;
    in[1].value = NAN;
    assert_status(igrad__sar_allreduce(&w, comm, 10, 3, in), IGRAD_E_INVALID);
    assert_error_has("input entry 1 has a non-finite value");
    in[1].value = INFINITY;
    assert_status(igrad__sar_allreduce(&w, comm, 10, 3, in), IGRAD_E_INVALID);
    in[1].value = 2.0f;
    assert_status(igrad__sar_allreduce(&w, comm, (UINT64_C(1) << 32) + 1, 3, in),
                  IGRAD_E_INVALID);
    assert_error_has("larger than 2^32");
    assert_status(igrad__sar_allreduce(&w, comm, 10, 3, NULL), IGRAD_E_INVALID);
    assert_error_has("k = 3 entries but no input buffer");
    assert_status(igrad__sar_allreduce(NULL, comm, 10, 3, in), IGRAD_E_INVALID);
    assert_status(igrad__sar_allreduce(&w, NULL, 10, 3, in), IGRAD_E_INVALID);
    /* still usable after the refusals, and 2^32 is a valid index space */
    in[0].index = UINT32_MAX;
    assert_status(igrad__sar_allreduce(&w, comm, UINT64_C(1) << 32, 3, in), IGRAD_OK);
    assert_int_equal(w.result_count, 3);
    assert_int_equal(w.result[2].index, UINT32_MAX);
    igrad__sar_clear(&w);
    igrad_comm_free(comm);
}

/* ---- a custom comm without alltoallv ----------------------------------- */

static igrad_status_t one_allgather(void *user, const void *send, size_t nbytes, void *recv)
{
    (void)user;
    memmove(recv, send, nbytes);
    return IGRAD_OK;
}

static igrad_status_t one_allreduce(void *user, const void *send, void *recv, size_t count,
                                    igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    (void)user, (void)op;
    memmove(recv, send, count * igrad_dtype_nbytes(dtype));
    return IGRAD_OK;
}

static igrad_status_t one_bcast(void *user, void *buf, size_t nbytes, int root)
{
    (void)user, (void)buf, (void)nbytes, (void)root;
    return IGRAD_OK;
}

static igrad_status_t one_barrier(void *user)
{
    (void)user;
    return IGRAD_OK;
}

static void test_custom_comm_unsupported(void **state)
{
    (void)state;
    igrad_comm_ops_t ops = {0};
    ops.size = sizeof ops;
    ops.allgather = one_allgather;
    ops.allreduce = one_allreduce;
    ops.bcast = one_bcast;
    ops.barrier = one_barrier;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_custom(&ops, NULL, 0, 1, &comm), IGRAD_OK);
    igrad__sar_t w = {0};
    igrad__sar_entry_t in[1] = {{0, 1.0f}};
    assert_status(igrad__sar_allreduce(&w, comm, 4, 1, in), IGRAD_E_UNSUPPORTED);
    assert_error_has("communicator 'custom' has no variable all-to-all");
    size_t n[1] = {0}, d[1] = {0};
    assert_status(igrad__comm_alltoallv(comm, NULL, n, d, NULL, n, d, IGRAD__MEM_HOST, NULL),
                  IGRAD_E_UNSUPPORTED);
    igrad__sar_clear(&w);
    igrad_comm_free(comm);
}

/* ---- a custom comm with ops->alltoallv --------------------------------- */

static int one_alltoallv_calls;

/* One rank: the block for rank 0 lands in rank 0's recv block. */
static igrad_status_t one_alltoallv(void *user, const void *send, const size_t *send_nbytes,
                                    const size_t *send_displs, void *recv,
                                    const size_t *recv_nbytes, const size_t *recv_displs)
{
    (void)user;
    one_alltoallv_calls++;
    if (send_nbytes[0] != recv_nbytes[0]) return IGRAD_E_COMM;
    if (send_nbytes[0])
        memcpy((unsigned char *)recv + recv_displs[0],
               (const unsigned char *)send + send_displs[0], send_nbytes[0]);
    return IGRAD_OK;
}

static igrad_comm_t *one_custom(int with_alltoallv, size_t table_size)
{
    igrad_comm_ops_t ops = {0};
    ops.size = table_size;
    ops.allgather = one_allgather;
    ops.allreduce = one_allreduce;
    ops.bcast = one_bcast;
    ops.barrier = one_barrier;
    if (with_alltoallv) ops.alltoallv = one_alltoallv;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_custom(&ops, NULL, 0, 1, &comm), IGRAD_OK);
    return comm;
}

/* One 1000-entry tensor, topk_sync, one bucket, collective sparse_reduce:
 * engine_create's status on `comm`; on success two steps run and g holds
 * step 1's result. */
static igrad_status_t sar_engine_run(igrad_comm_t *comm, float *g)
{
    igrad_layout_t *L = NULL;
    assert_status(igrad_layout_create(&L), IGRAD_OK);
    int64_t n[1] = {1000};
    assert_status(igrad_layout_add(L, "w", IGRAD_DTYPE_F32, 1, n), IGRAD_OK);
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.density = 0.02;
    c.buckets = 1;
    c.collective = IGRAD_COLLECTIVE_SPARSE_REDUCE;
    igrad_engine_t *e = NULL;
    igrad_status_t st = igrad_engine_create(L, NULL, &c, comm, &e);
    for (int step = 0; st == IGRAD_OK && step < 2; step++) {
        for (int i = 0; i < 1000; i++) g[i] = (float)((i * 37 + step * 11) % 101) - 50.0f;
        st = igrad_engine_sync(e, (uint64_t)step, &g);
        assert_status(st, IGRAD_OK);
    }
    igrad_engine_free(e);
    igrad_layout_free(L);
    return st;
}

static void test_custom_comm_alltoallv(void **state)
{
    (void)state;
    enum { D = 50, K = 40 };
    igrad__sar_entry_t in[K];
    for (int i = 0; i < K; i++) {
        uint64_t x = mix64((uint64_t)i + 7);
        in[i].index = (uint32_t)((x >> 33) % D);
        in[i].value = (float)((int)((x >> 20) % 2001) - 1000) / 64.0f;
    }
    /* the sparse all-reduce over the callback equals the self comm's */
    igrad_comm_t *self = NULL, *custom = one_custom(1, sizeof(igrad_comm_ops_t));
    assert_status(igrad_comm_create_self(&self), IGRAD_OK);
    igrad__sar_t ws = {0}, wc = {0};
    assert_status(igrad__sar_allreduce(&ws, self, D, K, in), IGRAD_OK);
    one_alltoallv_calls = 0;
    assert_status(igrad__sar_allreduce(&wc, custom, D, K, in), IGRAD_OK);
    assert_int_equal(one_alltoallv_calls, 2); /* counts, then entries */
    assert_int_equal(wc.result_count, ws.result_count);
    assert_true(ws.result_count > 0);
    assert_memory_equal(wc.result, ws.result, ws.result_count * sizeof *ws.result);
    igrad__sar_clear(&ws);
    igrad__sar_clear(&wc);

    /* the engine's route: accepted with the callback, the same result as
     * over the self comm */
    float *a = malloc(1000 * sizeof *a), *b = malloc(1000 * sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    assert_status(sar_engine_run(self, a), IGRAD_OK);
    one_alltoallv_calls = 0;
    assert_status(sar_engine_run(custom, b), IGRAD_OK);
    assert_true(one_alltoallv_calls >= 4); /* two per step */
    assert_memory_equal(a, b, 1000 * sizeof *a);
    igrad_comm_free(custom);

    /* a table without it, or one that ends before it (an older caller's
     * size), has none: the route is refused by name */
    custom = one_custom(0, sizeof(igrad_comm_ops_t));
    assert_status(sar_engine_run(custom, b), IGRAD_E_UNSUPPORTED);
    assert_error_has("custom with ops->alltoallv");
    igrad_comm_free(custom);
    custom = one_custom(1, offsetof(igrad_comm_ops_t, alltoallv));
    assert_status(sar_engine_run(custom, b), IGRAD_E_UNSUPPORTED);
    one_alltoallv_calls = 0;
    assert_status(igrad__sar_allreduce(&wc, custom, D, K, in), IGRAD_E_UNSUPPORTED);
    assert_int_equal(one_alltoallv_calls, 0);
    igrad__sar_clear(&wc);
    igrad_comm_free(custom);
    igrad_comm_free(self);
    free(a);
    free(b);
}

/* ---- a custom comm with memory CUDA and ops->alltoallv ------------------ */

/* No GPU is needed: igrad never touches the bytes of a custom comm, so
 * host memory stands in for the device memory the callback is promised. */
static void *cuda_stream_seen;
static int cuda_events; /* set_stream: +1; alltoallv: checks it was last, +10 */

static igrad_status_t cuda_set_stream(void *user, void *stream)
{
    (void)user;
    cuda_stream_seen = stream;
    cuda_events = 1;
    return IGRAD_OK;
}

static igrad_status_t cuda_alltoallv(void *user, const void *send, const size_t *send_nbytes,
                                     const size_t *send_displs, void *recv,
                                     const size_t *recv_nbytes, const size_t *recv_displs)
{
    if (cuda_events != 1) return IGRAD_E_STATE; /* set_stream did not come first */
    cuda_events += 10;
    return one_alltoallv(user, send, send_nbytes, send_displs, recv, recv_nbytes,
                         recv_displs);
}

static igrad_status_t cuda_iallgather(void *user, const void *send, size_t nbytes, void *recv,
                                      void **handle)
{
    *handle = NULL;
    return one_allgather(user, send, nbytes, recv);
}

static igrad_status_t cuda_iallreduce(void *user, const void *send, void *recv, size_t count,
                                      igrad_dtype_t dtype, igrad_reduce_op_t op, void **handle)
{
    *handle = NULL;
    return one_allreduce(user, send, recv, count, dtype, op);
}

static igrad_status_t cuda_wait(void *user, void *handle)
{
    (void)user, (void)handle;
    return IGRAD_OK;
}

static void test_custom_cuda_comm_alltoallv(void **state)
{
    (void)state;
    igrad_comm_ops_t ops = {0};
    ops.size = sizeof ops;
    ops.allgather = one_allgather;
    ops.allreduce = one_allreduce;
    ops.bcast = one_bcast;
    ops.barrier = one_barrier;
    ops.iallgather = cuda_iallgather;
    ops.iallreduce = cuda_iallreduce;
    ops.wait = cuda_wait;
    ops.memory = IGRAD_MEMORY_CUDA;
    ops.set_stream = cuda_set_stream;
    ops.alltoallv = cuda_alltoallv;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_custom(&ops, NULL, 0, 1, &comm), IGRAD_OK);
    unsigned char buf[32];
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
    size_t sn[1] = {5}, sd[1] = {2}, rn[1] = {5}, rd[1] = {4};
    static char stream; /* an opaque queue handle: only passed along */

    /* device buffers reach the callback, after set_stream with the stream */
    cuda_events = 0;
    cuda_stream_seen = NULL;
    one_alltoallv_calls = 0;
    assert_status(igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, rn, rd, IGRAD__MEM_DEVICE,
                                        &stream),
                  IGRAD_OK);
    assert_int_equal(cuda_events, 11);
    assert_ptr_equal(cuda_stream_seen, &stream);
    assert_int_equal(one_alltoallv_calls, 1);
    for (int i = 0; i < 5; i++) assert_int_equal(buf[20 + i], 2 + i);
    /* NULL: the default stream, handed on as NULL */
    cuda_events = 0;
    cuda_stream_seen = &stream;
    assert_status(
        igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, rn, rd, IGRAD__MEM_DEVICE, NULL),
        IGRAD_OK);
    assert_int_equal(cuda_events, 11);
    assert_null(cuda_stream_seen);

    /* host buffers are refused by name, before any callback */
    cuda_events = 0;
    one_alltoallv_calls = 0;
    assert_status(
        igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, rn, rd, IGRAD__MEM_HOST, NULL),
        IGRAD_E_UNSUPPORTED);
    assert_error_has("communicator 'custom' cannot take host buffers");
    assert_int_equal(cuda_events, 0);
    assert_int_equal(one_alltoallv_calls, 0);
    /* the callback's failure is reported as its status */
    assert_status(igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, (size_t[]){4}, rd,
                                        IGRAD__MEM_DEVICE, NULL),
                  IGRAD_E_COMM);
    assert_error_has("alltoallv callback returned");
    igrad_comm_free(comm);
}

/* ---- igrad__comm_alltoallv's checks ------------------------------------ */

static void test_alltoallv_checks(void **state)
{
    (void)state;
    igrad_comm_t *comm = NULL;
    assert_status(igrad_comm_create_self(&comm), IGRAD_OK);
    unsigned char buf[32];
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
    size_t sn[1] = {5}, sd[1] = {2}, rn[1] = {5}, rd[1] = {20};
    const igrad__mem_space_t host = IGRAD__MEM_HOST;
    /* self: the block at send + 2 lands at recv + 20 - 16 (recv = buf + 16) */
    assert_status(
        igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, rn, (size_t[]){4}, host, NULL),
        IGRAD_OK);
    for (int i = 0; i < 5; i++) assert_int_equal(buf[20 + i], 2 + i);
    assert_status(igrad__comm_alltoallv(NULL, buf, sn, sd, buf + 16, rn, rd, host, NULL),
                  IGRAD_E_INVALID);
    assert_status(igrad__comm_alltoallv(comm, buf, NULL, sd, buf + 16, rn, rd, host, NULL),
                  IGRAD_E_INVALID);
    assert_error_has("send_nbytes is NULL");
    assert_status(igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, rn, NULL, host, NULL),
                  IGRAD_E_INVALID);
    assert_error_has("recv_displs is NULL");
    assert_status(igrad__comm_alltoallv(comm, NULL, sn, sd, buf + 16, rn, rd, host, NULL),
                  IGRAD_E_INVALID);
    assert_error_has("send buffer is NULL");
    assert_status(igrad__comm_alltoallv(comm, buf, sn, (size_t[]){SIZE_MAX - 2}, buf + 16, rn,
                                        rd, host, NULL),
                  IGRAD_E_INVALID);
    assert_error_has("overflows size_t");
    /* send [2, 7) and recv [0 + 4, 9) of the same bytes overlap */
    assert_status(igrad__comm_alltoallv(comm, buf, sn, sd, buf, rn, (size_t[]){4}, host, NULL),
                  IGRAD_E_INVALID);
    assert_error_has("overlap");
    assert_status(
        igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, (size_t[]){4}, rd, host, NULL),
        IGRAD_E_INVALID);
    assert_error_has("sends 5 bytes to itself but expects 4");
    /* nothing to move: NULL buffers are fine */
    size_t z[1] = {0};
    assert_status(igrad__comm_alltoallv(comm, NULL, z, z, NULL, z, z, host, NULL), IGRAD_OK);

    /* the self comm takes host bytes only: device buffers are refused by
     * name before anything moves, also with nothing to move */
    memset(buf + 16, 0xee, 16);
    assert_status(igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, rn, (size_t[]){4},
                                        IGRAD__MEM_DEVICE, NULL),
                  IGRAD_E_UNSUPPORTED);
    assert_error_has("igrad__comm_alltoallv: communicator 'self' cannot take device buffers");
    for (int i = 0; i < 16; i++) assert_int_equal(buf[16 + i], 0xee);
    assert_status(igrad__comm_alltoallv(comm, NULL, z, z, NULL, z, z, IGRAD__MEM_DEVICE, NULL),
                  IGRAD_E_UNSUPPORTED);
    assert_error_has("cannot take device buffers");
    /* a host backend ignores the stream: NULL (above) or any other value */
    static char not_a_stream;
    assert_status(igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, rn, (size_t[]){4}, host,
                                        &not_a_stream),
                  IGRAD_OK);
    for (int i = 0; i < 5; i++) assert_int_equal(buf[20 + i], 2 + i);
    igrad_comm_free(comm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kout_and_ranges),
        cmocka_unit_test(test_next_bounds),
        cmocka_unit_test(test_one_rank),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_custom_comm_unsupported),
        cmocka_unit_test(test_custom_comm_alltoallv),
        cmocka_unit_test(test_custom_cuda_comm_alltoallv),
        cmocka_unit_test(test_alltoallv_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
