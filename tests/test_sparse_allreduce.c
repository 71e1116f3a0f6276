/*
 * test_sparse_allreduce.c — the sparse all-reduce (sparse_allreduce.c) on
 * one rank, and the internal alltoallv's argument checks (comm.c) on the
 * self comm: kout and the index ranges, the one-rank result against a
 * dense sum in input order, every refusal of bad input, a comm without
 * alltoallv (custom) refused, workspace reuse. Several ranks, corrupt
 * peers and the byte counts are tests/mpi_sparse_allreduce.c's.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm_internal.h"
#include "igrad.h"
#include "sparse_allreduce.h"
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

/* ---- a custom comm has no alltoallv ------------------------------------ */

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
    assert_status(igrad__comm_alltoallv(comm, NULL, n, d, NULL, n, d), IGRAD_E_UNSUPPORTED);
    igrad__sar_clear(&w);
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
    /* self: the block at send + 2 lands at recv + 20 - 16 (recv = buf + 16) */
    assert_status(igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, rn, (size_t[]){4}),
                  IGRAD_OK);
    for (int i = 0; i < 5; i++) assert_int_equal(buf[20 + i], 2 + i);
    assert_status(igrad__comm_alltoallv(NULL, buf, sn, sd, buf + 16, rn, rd), IGRAD_E_INVALID);
    assert_status(igrad__comm_alltoallv(comm, buf, NULL, sd, buf + 16, rn, rd),
                  IGRAD_E_INVALID);
    assert_error_has("send_nbytes is NULL");
    assert_status(igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, rn, NULL),
                  IGRAD_E_INVALID);
    assert_error_has("recv_displs is NULL");
    assert_status(igrad__comm_alltoallv(comm, NULL, sn, sd, buf + 16, rn, rd),
                  IGRAD_E_INVALID);
    assert_error_has("send buffer is NULL");
    assert_status(igrad__comm_alltoallv(comm, buf, sn, (size_t[]){SIZE_MAX - 2}, buf + 16, rn,
                                        rd),
                  IGRAD_E_INVALID);
    assert_error_has("overflows size_t");
    /* send [2, 7) and recv [0 + 4, 9) of the same bytes overlap */
    assert_status(igrad__comm_alltoallv(comm, buf, sn, sd, buf, rn, (size_t[]){4}),
                  IGRAD_E_INVALID);
    assert_error_has("overlap");
    assert_status(igrad__comm_alltoallv(comm, buf, sn, sd, buf + 16, (size_t[]){4}, rd),
                  IGRAD_E_INVALID);
    assert_error_has("sends 5 bytes to itself but expects 4");
    /* nothing to move: NULL buffers are fine */
    size_t z[1] = {0};
    assert_status(igrad__comm_alltoallv(comm, NULL, z, z, NULL, z, z), IGRAD_OK);
    igrad_comm_free(comm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kout_and_ranges),
        cmocka_unit_test(test_one_rank),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_custom_comm_unsupported),
        cmocka_unit_test(test_alltoallv_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
