/*
 * test_sar_ops.c — the sparse all-reduce's host backend (igrad__sar_host,
 * sparse_allreduce.c) step by step against brute-force references:
 * split, reduce and collect on the cases of sar_cases.h, which
 * tests/cuda_sar.c runs on the CUDA backend too. The protocol around the
 * steps is test_sparse_allreduce.c's and mpi_sparse_allreduce.c's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "sar_cases.h"

static void *host_alloc(size_t nbytes) { return malloc(nbytes ? nbytes : 1); }
static void host_free(void *p) { free(p); }
static void host_copy(void *dst, const void *src, size_t nbytes)
{
    if (nbytes) memcpy(dst, src, nbytes);
}

static void test_host_backend(void **state)
{
    (void)state;
    const sar_mem_t mem = {host_alloc, host_free, host_copy, host_copy};
    sar_check_backend(&igrad__sar_host, &mem);
    assert_int_equal(sar_failures, 0);
}

/* The brute force itself on a case small enough to write down: indices 3
 * and 5 twice, 4 once; kout 2 keeps |1.5| (5) and the lower of the tied
 * |1| (3 before 4). */
static void test_reference(void **state)
{
    (void)state;
    const igrad__sar_entry_t recv[] = {{5, 1.0f}, {3, -0.5f}, {4, 1.0f}, {5, 0.5f}, {3, -0.5f}};
    igrad__sar_entry_t kept[2], rem[5];
    size_t nk = 0, nr = 0;
    sar_reduce_reference(recv, 5, 3, 6, 2, kept, &nk, rem, &nr);
    assert_int_equal(nk, 2);
    assert_int_equal(nr, 1);
    assert_int_equal(kept[0].index, 3);
    assert_true(kept[0].value == -1.0f);
    assert_int_equal(kept[1].index, 5);
    assert_true(kept[1].value == 1.5f);
    assert_int_equal(rem[0].index, 4);
    assert_true(rem[0].value == 1.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_host_backend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
