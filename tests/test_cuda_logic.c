/*
 * test_cuda_logic.c — the CUDA data plane's numeric decisions
 * (src/dp_cuda_logic.h, the same functions the kernels call), run on the
 * CPU: an emulation of the kernels' flow — three histogram rounds of the
 * radix select, then the chunked gather whose slots come from per-chunk
 * counts of greater and tied keys and their exclusive scan — checked
 * against a sort (ties to the lower index) and bit for bit against the CPU
 * backend's igrad_select_ef (indices, values and residual), flat and row
 * by row, on random and adversarial inputs (ties, all equal, +-0,
 * subnormals, huge values, a NaN that must not be chosen, k = 1, k = n,
 * n = 1, sizes around the kernels' block and chunk sizes). Also the wire
 * reads and writes at odd offsets and the rounding of the float helpers,
 * and the flow of the value kernels (16-bit and FP8 wire values): the FP8
 * block maximum as the largest key (any order), the rounding and the pack
 * from it, against the CPU backend's functions (core/value8.h).
 * Runs everywhere: no GPU is involved.
 */
#include <float.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "igrad.h"
#include "test_util.h"

#include "dp/cuda/dp_cuda_logic.h"
#include "core/value8.h" /* the wire's values: what the CUDA value kernels call */

static float rnd_normal(uint64_t *s)
{
    double u1 = ((double)(mix64((*s)++) >> 11) + 0.5) * 0x1.0p-53;
    double u2 = ((double)(mix64((*s)++) >> 11) + 0.5) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

typedef enum dist {
    D_NORMAL,
    D_TIES,     /* five values: mostly ties */
    D_EQUAL,    /* one value */
    D_ZEROS,    /* +0 and -0 */
    D_TINY,     /* subnormals and zeros */
    D_HUGE,     /* near FLT_MAX, both signs */
    D_LOWBITS,  /* keys that differ only in their lowest 10 bits */
    D_NDIST
} dist_t;

static float draw(dist_t d, uint64_t *s, int64_t i)
{
    uint64_t r = mix64((*s)++);
    switch (d) {
    case D_NORMAL: return rnd_normal(s);
    case D_TIES: return (float)((int)(r % 5) - 2) * 0.5f;
    case D_EQUAL: return -1.25f;
    case D_ZEROS: return (r & 1) ? -0.0f : 0.0f;
    case D_TINY: {
        uint32_t u = (uint32_t)(r % 64) | (uint32_t)(r >> 63) << 31;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case D_HUGE: return (r & 1 ? 1.0f : -1.0f) * (2.0e38f + (float)(r % 7) * 1.0e37f);
    case D_LOWBITS: {
        uint32_t u = 0x3f800000u | (uint32_t)(r % 1024) | (uint32_t)(i & 1) << 31;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: return 0.0f;
    }
}

/* ---- the kernels' flow, on the host ---- */

/* k-th largest key of keys[0..n) and the ties kept, as the histogram
 * rounds of dp_cuda_select.cu find them. */
static void emu_kth(const uint32_t *keys, int64_t n, int64_t k, uint32_t *kth, uint64_t *ties)
{
    uint32_t hist[IGRAD__RADIX_BINS_MAX];
    uint32_t prefix = 0;
    uint64_t kk = (uint64_t)k;
    for (int round = 0; round < IGRAD__RADIX_ROUNDS; round++) {
        memset(hist, 0, sizeof hist);
        for (int64_t i = 0; i < n; i++)
            if (igrad__radix_matches(keys[i], prefix, round))
                hist[igrad__radix_digit(keys[i], round)]++;
        uint32_t d = igrad__radix_choose(hist, round, &kk);
        prefix = igrad__radix_extend(prefix, d, round);
    }
    *kth = prefix;
    *ties = kk;
}

/* Top k of a[0..n) into idx/val in index order through chunks of `chunk`
 * entries: per chunk the counts of greater and tied keys, their exclusive
 * scan, then each chunk's entries placed from its scanned counts. */
static void emu_topk(const float *a, int64_t n, int64_t k, int64_t chunk, uint32_t *idx,
                     float *val)
{
    uint32_t *keys = malloc((size_t)n * sizeof *keys);
    assert_non_null(keys);
    for (int64_t i = 0; i < n; i++) keys[i] = igrad__key(a[i]);
    uint32_t kth;
    uint64_t ties;
    emu_kth(keys, n, k, &kth, &ties);
    uint64_t gbase = 0, tbase = 0, placed = 0;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        int64_t c1 = c0 + chunk < n ? c0 + chunk : n;
        uint64_t g = gbase, t = tbase;
        for (int64_t i = c0; i < c1; i++) {
            if (igrad__keep(keys[i], kth, t, ties)) {
                uint64_t slot = igrad__keep_slot(g, t, ties);
                assert_true(slot < (uint64_t)k);
                idx[slot] = (uint32_t)i;
                val[slot] = a[i];
                placed++;
            }
            g += keys[i] > kth;
            t += keys[i] == kth;
        }
        gbase = g; /* the scan: counts of the chunks before the next */
        tbase = t;
    }
    assert_int_equal(placed, k);
    free(keys);
}

/* The sort reference is test_util.h's ref_topk (on |a| as floats, not on
 * the kernels' keys). */

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* One tensor of rows x cols (rows = 1: flat) keeping k per row: the
 * emulation against the sort per row, and the whole selection and residual
 * against igrad_select_ef bit for bit. */
static void check_case(const float *g, const float *e0, int64_t rows, int64_t cols, int64_t k,
                       int64_t chunk)
{
    int64_t n = rows * cols;
    float *a = malloc((size_t)n * sizeof *a), *res = malloc((size_t)n * sizeof *res);
    float *emu_res = malloc((size_t)n * sizeof *emu_res);
    uint32_t *idx = malloc((size_t)(rows * k) * sizeof *idx);
    uint32_t *ref = malloc((size_t)k * sizeof *ref);
    uint32_t *cpu_idx = malloc((size_t)(rows * k) * sizeof *cpu_idx);
    float *val = malloc((size_t)(rows * k) * sizeof *val);
    float *cpu_val = malloc((size_t)(rows * k) * sizeof *cpu_val);
    assert_true(a && res && emu_res && idx && ref && cpu_idx && val && cpu_val);
    for (int64_t i = 0; i < n; i++) a[i] = igrad__fadd(g[i], e0[i]);
    memcpy(emu_res, a, (size_t)n * sizeof *a);
    for (int64_t r = 0; r < rows; r++) {
        const float *ar = a + r * cols;
        emu_topk(ar, cols, k, chunk, idx + r * k, val + r * k);
        ref_topk(ar, cols, k, ref);
        for (int64_t j = 0; j < k; j++) {
            if (idx[r * k + j] != ref[j]) {
                print_error("rows %lld cols %lld k %lld chunk %lld: row %lld entry %lld: "
                            "emulation %u, sort %u\n",
                            (long long)rows, (long long)cols, (long long)k, (long long)chunk,
                            (long long)r, (long long)j, idx[r * k + j], ref[j]);
                fail();
            }
            emu_res[r * cols + idx[r * k + j]] = 0.0f;
        }
    }
    /* the CPU backend's selection on the same inputs */
    memcpy(res, e0, (size_t)n * sizeof *res);
    igrad_select_spec_t sp = {.row_wise = rows > 1, .rows = rows, .cols = cols,
                              .per_row = k, .count = rows * k, .n = n};
    if (rows == 1) sp.row_wise = 0, sp.cols = n, sp.per_row = k;
    igrad_select_ws_t *ws = NULL;
    assert_ok(igrad_select_ws_create(&ws));
    igrad_selection_t sel = {.index = cpu_idx, .value = cpu_val};
    assert_ok(igrad_select_ef(g, res, &sp, "t", ws, &sel));
    igrad_select_ws_free(ws);
    for (int64_t j = 0; j < rows * k; j++) {
        if (cpu_idx[j] != idx[j] || bits_of(cpu_val[j]) != bits_of(val[j])) {
            print_error("rows %lld cols %lld k %lld: entry %lld: emulation %u (%a), "
                        "igrad_select_ef %u (%a)\n",
                        (long long)rows, (long long)cols, (long long)k, (long long)j, idx[j],
                        (double)val[j], cpu_idx[j], (double)cpu_val[j]);
            fail();
        }
    }
    for (int64_t i = 0; i < n; i++)
        if (bits_of(res[i]) != bits_of(emu_res[i])) {
            print_error("residual %lld: emulation %a, igrad_select_ef %a\n", (long long)i,
                        (double)emu_res[i], (double)res[i]);
            fail();
        }
    free(a), free(res), free(emu_res), free(idx), free(ref), free(cpu_idx), free(val);
    free(cpu_val);
}

static void run_case(dist_t dg, dist_t de, int64_t rows, int64_t cols, int64_t k, uint64_t seed)
{
    int64_t n = rows * cols;
    float *g = malloc((size_t)n * sizeof *g), *e = malloc((size_t)n * sizeof *e);
    assert_true(g && e);
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) g[i] = draw(dg, &s, i);
    for (int64_t i = 0; i < n; i++) e[i] = de == D_ZEROS ? 0.0f : draw(de, &s, i) * 0.25f;
    if (dg == D_HUGE || de == D_HUGE) /* g + e must stay finite */
        for (int64_t i = 0; i < n; i++) e[i] = 0.0f;
    static const int64_t chunks[] = {1, 7, 256, 4096};
    check_case(g, e, rows, cols, k, chunks[seed % 4]);
    free(g), free(e);
}

/* ---- tests ---- */

static void test_key_order(void **state)
{
    (void)state;
    /* keys order like |v| over finite floats, and +-0 share key 0 */
    uint64_t s = 1;
    for (int i = 0; i < 200000; i++) {
        uint32_t ua = (uint32_t)mix64(s++), ub = (uint32_t)mix64(s++);
        float a, b;
        memcpy(&a, &ua, 4);
        memcpy(&b, &ub, 4);
        if (!isfinite(a) || !isfinite(b)) {
            assert_false(igrad__finite(a) && igrad__finite(b));
            continue;
        }
        assert_true(igrad__finite(a) && igrad__finite(b));
        int by_value = fabsf(a) < fabsf(b) ? -1 : fabsf(a) > fabsf(b);
        uint32_t ka = igrad__key(a), kb = igrad__key(b);
        int by_key = ka < kb ? -1 : ka > kb;
        assert_int_equal(by_value, by_key);
    }
    assert_int_equal(igrad__key(-0.0f), igrad__key(0.0f));
    assert_false(igrad__finite(INFINITY));
    assert_false(igrad__finite(-INFINITY));
    assert_false(igrad__finite(NAN));
    assert_true(igrad__finite(FLT_MAX));
    assert_true(igrad__finite(-FLT_MAX));
}

static void test_radix_kth(void **state)
{
    (void)state;
    /* the rounds find the k-th largest key and the ties, against a sort */
    uint64_t s = 7;
    for (int trial = 0; trial < 400; trial++) {
        int64_t n = 1 + (int64_t)(mix64(s++) % 3000);
        uint32_t *keys = malloc((size_t)n * 4), *sorted = malloc((size_t)n * 4);
        assert_true(keys && sorted);
        int mode = trial % 4;
        for (int64_t i = 0; i < n; i++) {
            uint32_t r = (uint32_t)mix64(s++) & 0x7fffffffu;
            keys[i] = mode == 0 ? r : mode == 1 ? r % 5 : mode == 2 ? 0x3f800000u | (r & 7u) << 10
                                                                   : (r & 0x7ff00000u);
        }
        memcpy(sorted, keys, (size_t)n * 4);
        qsort(sorted, (size_t)n, 4, cmp_u32);
        for (int rep = 0; rep < 4; rep++) {
            int64_t k = rep == 0 ? 1 : rep == 1 ? n : 1 + (int64_t)(mix64(s++) % (uint64_t)n);
            uint32_t kth;
            uint64_t ties;
            emu_kth(keys, n, k, &kth, &ties);
            uint32_t want = sorted[n - k];
            assert_int_equal(kth, want);
            int64_t greater = 0;
            for (int64_t i = 0; i < n; i++) greater += keys[i] > want;
            assert_int_equal(ties, (uint64_t)(k - greater));
        }
        free(keys), free(sorted);
    }
}

static void test_flat_distributions(void **state)
{
    (void)state;
    static const int64_t sizes[] = {1, 2, 15, 255, 256, 257, 1023, 1024, 1025, 4095, 4096,
                                    4097, 20000};
    uint64_t seed = 11;
    for (int d = 0; d < D_NDIST; d++)
        for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++) {
            int64_t n = sizes[z];
            int64_t ks[4] = {1, n, n / 100 + 1, n / 3 + 1};
            for (int j = 0; j < 4; j++) {
                int64_t k = ks[j] > n ? n : ks[j];
                run_case((dist_t)d, (dist_t)((d + j) % D_NDIST), 1, n, k, seed++);
            }
        }
}

static void test_rows(void **state)
{
    (void)state;
    /* ADTopk: per row, column indices; rows around the block sizes */
    static const int64_t cols[] = {1, 3, 16, 255, 256, 257, 768, 1024, 1025};
    uint64_t seed = 101;
    for (int d = 0; d < D_NDIST; d++)
        for (size_t c = 0; c < sizeof cols / sizeof *cols; c++) {
            int64_t C = cols[c], R = 1 + (int64_t)(mix64(seed) % 9);
            int64_t ks[3] = {1, C, (C + 99) / 100};
            for (int j = 0; j < 3; j++)
                run_case((dist_t)d, D_NORMAL, R == 1 ? 2 : R, C, ks[j], seed++);
        }
}

static void test_nan_not_selected(void **state)
{
    (void)state;
    /* A NaN's key is above every finite one: the check stage must have
     * refused the step first (the kernels rely on it), which
     * igrad__finite decides. */
    float v[3] = {1.0f, NAN, 2.0f};
    int bad = 0;
    for (int i = 0; i < 3; i++) bad |= !igrad__finite(v[i]);
    assert_true(bad);
    assert_true(igrad__key(NAN) >= IGRAD__KEY_INF);
}

static void test_wire(void **state)
{
    (void)state;
    unsigned char buf[64];
    uint64_t s = 3;
    for (int i = 0; i < 64; i++) buf[i] = (unsigned char)mix64(s++);
    for (int off = 0; off < 8; off++)
        for (int k = 0; k < 8; k++) {
            uint32_t u32;
            uint16_t u16;
            float f;
            memcpy(&u32, buf + off + 4 * k, 4);
            memcpy(&u16, buf + off + 2 * k, 2);
            memcpy(&f, buf + off + 4 * k, 4);
            assert_int_equal(igrad__read_index(buf + off, 4, k), u32);
            assert_int_equal(igrad__read_index(buf + off, 2, k), u16);
            assert_int_equal(bits_of(igrad__read_value(buf + off, k)), bits_of(f));
        }
    unsigned char out[16];
    for (uint32_t c = 0; c < 65536; c += 251) {
        igrad__write_index16(out + 1, 3, c);
        uint16_t back;
        memcpy(&back, out + 1 + 6, 2);
        assert_int_equal(back, c);
        assert_int_equal(igrad__read_index(out + 1, 2, 3), c);
    }
}

static void test_float_ops(void **state)
{
    (void)state;
    /* the helpers round like the CPU backend's expressions */
    uint64_t s = 5;
    for (int i = 0; i < 100000; i++) {
        float m = 0.9f, u = rnd_normal(&s), g = rnd_normal(&s), v = rnd_normal(&s);
        volatile float mu = m * u;
        float want = mu + g;
        assert_int_equal(bits_of(igrad__momentum(m, u, g)), bits_of(want));
        float inv = 1.0f / 3.0f;
        volatile float vi = v * inv;
        float want2 = g + vi;
        assert_int_equal(bits_of(igrad__unpack_add(g, v, inv)), bits_of(want2));
    }
}

/* The CUDA value kernels' flow on the host (dp_cuda_select.cu's
 * round8_kernel and round16_kernel, dp_cuda_pack.cu's values8_kernel and
 * values16_kernel, the unpack's igrad__value_read), block by block of
 * every distribution: the largest key is the CPU's igrad__fp8_block_amax
 * (as a value: +0 for a block of zeros), the rounding at its scale gives
 * the CPU's igrad__fp8_round values and exact errors, the pack of the
 * rounded values from their largest key writes igrad__fp8_pack's bytes,
 * and every byte reads back (at an odd offset) as the rounded value. */
static void test_values(void **state)
{
    (void)state;
    enum { N = 700 };
    float v[N], q[N], q16[N];
    unsigned char cpu[4 + N + 1], gpu[4 + N + 1], w16[2 * N + 1];
    uint64_t s = 11;
    for (int d = 0; d < D_NDIST; d++)
        for (int64_t n = 1; n <= N; n = n * 3 + 1) {
            for (int64_t i = 0; i < n; i++) v[i] = draw((dist_t)d, &s, i);
            uint32_t key = 0; /* the kernels' shared-memory atomicMax */
            for (int64_t i = n - 1; i >= 0; i--) /* another order than the CPU's */
                key = igrad__key(v[i]) > key ? igrad__key(v[i]) : key;
            float amax = igrad__f32_from_bits(key);
            assert_int_equal(bits_of(amax), bits_of(igrad__fp8_block_amax(v, n)));
            float sc, inv, cs = igrad__fp8_pow2(igrad__fp8_block_exp(v, n));
            igrad__fp8_scales(amax, &sc, &inv);
            assert_int_equal(bits_of(sc), bits_of(cs));
            for (int64_t i = 0; i < n; i++) {
                q[i] = igrad__fp8_round(v[i], inv, sc);
                double err = (double)v[i] - (double)q[i];
                assert_true((double)(v[i] - q[i]) == err); /* exact */
                q16[i] = igrad__round16(IGRAD_DTYPE_BF16, v[i]);
                igrad__value_write16(w16 + 1, i, igrad__to16(IGRAD_DTYPE_BF16, q16[i]));
            }
            igrad__fp8_pack(q, n, cpu + 1);
            key = 0;
            for (int64_t i = 0; i < n; i++) key = igrad__key(q[i]) > key ? igrad__key(q[i]) : key;
            igrad__fp8_head(gpu + 1, igrad__f32_from_bits(key), &sc, &inv);
            for (int64_t i = 0; i < n; i++) gpu[1 + 4 + i] = igrad__fp8_code(q[i], inv, sc);
            assert_memory_equal(cpu + 1, gpu + 1, (size_t)(4 + n));
            const unsigned char *v0;
            float rs;
            assert_int_equal(igrad__value_start(gpu + 1, 1, &v0, &rs), 0);
            for (int64_t i = 0; i < n; i++) {
                assert_int_equal(bits_of(igrad__value_read(v0, 1, IGRAD_DTYPE_F32, rs, i)),
                                 bits_of(q[i]));
                assert_int_equal(bits_of(igrad__value_read(w16 + 1, 2, IGRAD_DTYPE_BF16, 1.0f, i)),
                                 bits_of(q16[i]));
            }
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_order),
        cmocka_unit_test(test_radix_kth),
        cmocka_unit_test(test_flat_distributions),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_nan_not_selected),
        cmocka_unit_test(test_wire),
        cmocka_unit_test(test_float_ops),
        cmocka_unit_test(test_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
