/*
 * test_wire_code.c — the compact index codes (src/core/wire_code.h) against
 * an independent reference written from docs/formats.md §8 ("Index
 * codes"), not from the code: its own sizes, its own choice of code and its
 * own bit-by-bit decoder of each layout. Property test over many (k, u),
 * among them k = u, k = 1, u = 1, u = 65536 and u = 65537, random subsets:
 * the library's bytes decode (reference decoder) to the subset, the
 * library's reader gives it back too, and malformed runs of every kind (an
 * EF high part with an extra or a missing one, an index >= u, a bitmap
 * whose popcount is not k, non-increasing fixed indices, a set padding
 * bit) are errors of the right kind, never reads outside the run.
 *
 * Not here: the engine's wire as a whole (test_contract_wire.c decodes
 * buckets with contract_model.h), the fuzzing (fuzz_wire_code.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/wire_code.h"
#include "wire_code_ref.h"

/* ---- helpers ----------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* k distinct indices of [0, u), ascending (a partial Fisher–Yates over a
 * bitmap for small u, rejection for large). */
static void random_subset(int64_t k, int64_t u, uint32_t *out)
{
    unsigned char *take = calloc((size_t)u, 1);
    assert_non_null(take);
    int64_t have = 0;
    if (2 * k > u) { /* dense: drop u - k */
        memset(take, 1, (size_t)u);
        for (int64_t d = u - k; d > 0;) {
            int64_t x = (int64_t)(next64() % (uint64_t)u);
            if (take[x]) take[x] = 0, d--;
        }
    } else {
        while (have < k) {
            int64_t x = (int64_t)(next64() % (uint64_t)u);
            if (!take[x]) take[x] = 1, have++;
        }
    }
    int64_t n = 0;
    for (int64_t x = 0; x < u; x++)
        if (take[x]) out[n++] = (uint32_t)x;
    assert_int_equal(n, k);
    free(take);
}

/* The library's reader: 0 and the indices, or its first error. */
static int lib_decode(int code, const unsigned char *p, int64_t k, int64_t u, uint32_t *out)
{
    igrad__code_rd_t rd;
    igrad__code_start(&rd, code, p, k, u);
    for (int64_t i = 0; i < k; i++) {
        int e = igrad__code_next(&rd, &out[i]);
        if (e) return e;
    }
    return igrad__code_finish(&rd);
}

/* One (k, u): sizes, choice, encode + both decoders, for every code that
 * can carry it. */
static void check_case(int64_t k, int64_t u)
{
    uint32_t *idx = malloc((size_t)k * sizeof *idx), *dec = malloc((size_t)k * sizeof *dec);
    assert_non_null(idx);
    assert_non_null(dec);
    random_subset(k, u, idx);
    assert_int_equal(igrad__ef_low_bits(k, u), ref_l(k, u));
    assert_int_equal(igrad__code_choose(k, u, u <= 65536 ? 2 : 4), ref_choose(k, u, 1));
    assert_int_equal(igrad__code_choose(k, u, 4), ref_choose(k, u, 0));
    for (int code = 1; code <= 4; code++) {
        if (code == 1 && u > 65536) continue;
        int64_t nb = igrad__code_nbytes(code, k, u);
        assert_int_equal(nb, ref_nbytes(code, k, u));
        unsigned char *buf = malloc((size_t)nb + 1);
        assert_non_null(buf);
        buf[nb] = 0xa5; /* the encoder must not write past the run */
        igrad__code_encode(code, idx, k, u, buf);
        assert_int_equal(buf[nb], 0xa5);
        memset(dec, 0xff, (size_t)k * sizeof *dec);
        if (ref_decode(code, buf, k, u, dec) != 0)
            fail_msg("%s k %lld u %lld: the reference refuses the library's bytes",
                     igrad__code_name(code), (long long)k, (long long)u);
        assert_memory_equal(dec, idx, (size_t)k * sizeof *idx);
        memset(dec, 0xff, (size_t)k * sizeof *dec);
        assert_int_equal(lib_decode(code, buf, k, u, dec), 0);
        assert_memory_equal(dec, idx, (size_t)k * sizeof *idx);
        free(buf);
    }
    free(idx);
    free(dec);
}

/* ---- tests ------------------------------------------------------------- */

static void test_edges(void **state)
{
    (void)state;
    static const int64_t us[] = {1, 2, 3, 7, 8, 9, 63, 64, 65, 1000, 65535, 65536, 65537, 200003};
    for (size_t a = 0; a < sizeof us / sizeof *us; a++) {
        int64_t u = us[a];
        int64_t ks[] = {1, 2, u / 64, u / 16, u / 8, u / 4, u / 2, u - 1, u};
        for (size_t b = 0; b < sizeof ks / sizeof *ks; b++)
            if (ks[b] >= 1 && ks[b] <= u) check_case(ks[b], u);
    }
}

static void test_random(void **state)
{
    (void)state;
    for (int t = 0; t < 400; t++) {
        int64_t u = 1 + (int64_t)(next64() % (t % 4 == 0 ? 70000 : 600));
        int64_t k = 1 + (int64_t)(next64() % (uint64_t)u);
        if (t % 3 == 0) k = 1 + k / 50; /* sparse rows, as the selections are */
        check_case(k, u);
    }
}

/* What the choice gives at the sizes the wire has: one row of 1 % of 768
 * columns, and flat blocks. */
static void test_choice_examples(void **state)
{
    (void)state;
    /* k 8, u 768: l = 6, 48 + 8 + 12 = 68 bits = 9 bytes; fixed16 16 */
    assert_int_equal(igrad__code_choose(8, 768, 2), IGRAD__CODE_EF);
    assert_int_equal(igrad__code_nbytes(IGRAD__CODE_EF, 8, 768), 9);
    /* every entry: the bitmap */
    assert_int_equal(igrad__code_choose(64, 64, 2), IGRAD__CODE_BITMAP);
    /* one entry of 3: fixed16 (2 bytes) ties EF (l 1: 1 + 1 + 1 bits = 1
     * byte)? EF is 1 byte: EF */
    assert_int_equal(igrad__code_choose(1, 3, 2), IGRAD__CODE_EF);
    /* u 1, k 1: EF l 0, 0 + 1 + 1 bits = 1 byte; bitmap 1 byte: EF first */
    assert_int_equal(igrad__code_choose(1, 1, 2), IGRAD__CODE_EF);
}

/* Each malformed kind of run: the reader's error, from bytes the test
 * writes by the layout. */
static void test_malformed(void **state)
{
    (void)state;
    uint32_t out[8];
    /* EF k 3, u 100 (l 5): {1, 34, 99} is 0x41 0x8c 0x12 */
    unsigned char ef[3] = {0x41, 0x8c, 0x12};
    assert_int_equal(lib_decode(IGRAD__CODE_EF, ef, 3, 100, out), 0);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 34);
    assert_int_equal(out[2], 99);
    unsigned char more[3] = {0x41, 0x8c, 0x12 | 0x08}; /* an extra one at bit 19 */
    assert_int_equal(lib_decode(IGRAD__CODE_EF, more, 3, 100, out), IGRAD__CODE_E_MANY);
    unsigned char few[3] = {0x41, 0x8c, 0x02}; /* the third one gone */
    assert_int_equal(lib_decode(IGRAD__CODE_EF, few, 3, 100, out), IGRAD__CODE_E_FEW);
    unsigned char pad[3] = {0x41, 0x8c, 0x12 | 0x40}; /* bit 22: padding */
    assert_int_equal(lib_decode(IGRAD__CODE_EF, pad, 3, 100, out), IGRAD__CODE_E_MANY);
    /* high 3, low 31: 127 >= 100 */
    unsigned char range[3] = {0x41, 0x8c | 0x70, 0x12};
    assert_int_equal(lib_decode(IGRAD__CODE_EF, range, 3, 100, out), IGRAD__CODE_E_RANGE);
    /* lows 1, 1, 0 and ones at 15, 17, 18 (highs 0, 1, 1): 1, 33, 32 */
    unsigned char order[3] = {0x21, 0x80, 0x06};
    assert_int_equal(lib_decode(IGRAD__CODE_EF, order, 3, 100, out), IGRAD__CODE_E_ORDER);
    /* bitmap k 3, u 10 */
    unsigned char bm_ok[2] = {0x21, 0x02}, bm_more[2] = {0x23, 0x02}, bm_few[2] = {0x21, 0x00},
                  bm_pad[2] = {0x21, 0x06};
    assert_int_equal(lib_decode(IGRAD__CODE_BITMAP, bm_ok, 3, 10, out), 0);
    assert_int_equal(lib_decode(IGRAD__CODE_BITMAP, bm_more, 3, 10, out), IGRAD__CODE_E_MANY);
    assert_int_equal(lib_decode(IGRAD__CODE_BITMAP, bm_few, 3, 10, out), IGRAD__CODE_E_FEW);
    /* bit 10 set, one past u: an index outside (k 3 counts 0, 5, 9 first,
     * then the padding bit is one too many) */
    assert_int_equal(lib_decode(IGRAD__CODE_BITMAP, bm_pad, 3, 10, out), IGRAD__CODE_E_MANY);
    unsigned char bm_out[2] = {0x20, 0x06}; /* 5, 9, 10 */
    assert_int_equal(lib_decode(IGRAD__CODE_BITMAP, bm_out, 3, 10, out), IGRAD__CODE_E_RANGE);
    /* fixed16: 5, 5 and 5, 70000-ish out of range */
    unsigned char f_eq[4] = {5, 0, 5, 0}, f_out[4] = {5, 0, 0xff, 0xff};
    assert_int_equal(lib_decode(IGRAD__CODE_FIXED16, f_eq, 2, 100, out), IGRAD__CODE_E_ORDER);
    assert_int_equal(lib_decode(IGRAD__CODE_FIXED16, f_out, 2, 100, out), IGRAD__CODE_E_RANGE);
}

/* Every run of a few bytes, decoded: the reader and the reference agree on
 * what is valid and on the indices (exhaustive over 2 bytes). */
static void test_exhaustive_small(void **state)
{
    (void)state;
    for (int64_t u = 1; u <= 16; u++)
        for (int64_t k = 1; k <= u; k++)
            for (int code = 3; code <= 4; code++) {
                int64_t nb = igrad__code_nbytes(code, k, u);
                if (nb > 2) continue;
                for (unsigned v = 0; v < (1u << (8 * nb)); v++) {
                    unsigned char b[2] = {(unsigned char)v, (unsigned char)(v >> 8)};
                    uint32_t a[16], r[16];
                    int ea = lib_decode(code, b, k, u, a);
                    int er = ref_decode(code, b, k, u, r);
                    if ((ea == 0) != (er == 0))
                        fail_msg("%s k %lld u %lld bytes 0x%04x: reader %d, reference %d",
                                 igrad__code_name(code), (long long)k, (long long)u, v, ea, er);
                    if (ea == 0) assert_memory_equal(a, r, (size_t)k * sizeof *a);
                }
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edges),           cmocka_unit_test(test_random),
        cmocka_unit_test(test_choice_examples), cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_exhaustive_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
