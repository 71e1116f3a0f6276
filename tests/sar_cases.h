/*
 * sar_cases.h — the sparse all-reduce's data steps (a backend row of
 * sparse_allreduce.h's igrad__sar_ops_t) against brute-force references,
 * shared by test_sar_ops.c (the host backend) and cuda_sar.c (the CUDA
 * backend on a GPU, also compared with the host one bit for bit):
 *  split   k entries over P owners of equal or skewed split points (some
 *          ranges empty): the counts, the grouping (each owner's entries
 *          in input order, owners found by a linear scan of the split
 *          points), the first bad entry (index >= D, NaN, Inf) with its
 *          position and value;
 *  reduce  n received entries with many duplicate indices and tied
 *          magnitudes: the sums in received order from 0.0f (a dense
 *          accumulator), the kout kept by an O(m^2) count of the sums that
 *          beat each one (|sum| bits, then the lower index), both lists
 *          ascending; the receive histogram against a count of each part's
 *          indices by the part's own bounds; an index outside the range
 *          found at its position;
 *  collect P blocks (header + entries) in equal or skewed ranges: the
 *          result in rank order, the first bad entry (outside its rank's
 *          range, not ascending).
 * `mem` moves bytes between the host and the backend's memory. Each check
 * prints what differs and counts it in sar_failures.
 */
#ifndef IGRAD_TESTS_SAR_CASES_H
#define IGRAD_TESTS_SAR_CASES_H

#include "comm/sparse_allreduce.h"
#include "core/value16.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int sar_failures = 0;

#define SAR_CHECK(cond, ...)                                               \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);          \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
            sar_failures++;                                                \
        }                                                                  \
    } while (0)

/* Host <-> backend memory for the tests. */
typedef struct sar_mem {
    void *(*alloc)(size_t nbytes);
    void (*free)(void *p);
    void (*to)(void *dst, const void *src, size_t nbytes);   /* host to backend */
    void (*from)(void *dst, const void *src, size_t nbytes); /* backend to host */
} sar_mem_t;

static uint64_t sar_rand(uint64_t *s)
{
    uint64_t x = (*s += 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Values with ties: a few magnitudes of either sign, normals, zeros. */
static float sar_value(uint64_t *s)
{
    static const float few[] = {0.5f, 0.25f, 1.0f, 0.0f, -0.0f};
    uint64_t r = sar_rand(s);
    if (r % 3 == 0) return (r & 8 ? -1.0f : 1.0f) * few[(r >> 4) % 5];
    return (float)((double)(int64_t)(r >> 11) / (double)(1ULL << 52) - 1.0);
}

static int sar_same_entries(const igrad__sar_entry_t *a, const igrad__sar_entry_t *b, size_t n,
                            const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (a[i].index != b[i].index ||
            igrad__f32_bits(a[i].value) != igrad__f32_bits(b[i].value)) {
            SAR_CHECK(0, "%s: entry %zu is (%u, %a), expected (%u, %a)", what, i,
                      (unsigned)a[i].index, (double)a[i].value, (unsigned)b[i].index,
                      (double)b[i].value);
            return 0;
        }
    }
    return 1;
}

/* The reduction by brute force: kept and rem ascending. */
static void sar_reduce_reference(const igrad__sar_entry_t *recv, size_t n, uint64_t lo,
                                 uint64_t hi, size_t kout, igrad__sar_entry_t *kept,
                                 size_t *nkept, igrad__sar_entry_t *rem, size_t *nrem)
{
    size_t width = (size_t)(hi - lo);
    float *acc = calloc(width ? width : 1, sizeof *acc);
    char *seen = calloc(width ? width : 1, 1);
    for (size_t p = 0; p < n; p++) {
        acc[recv[p].index - lo] += recv[p].value;
        seen[recv[p].index - lo] = 1;
    }
    igrad__sar_entry_t *sums = malloc((n ? n : 1) * sizeof *sums);
    size_t m = 0;
    for (size_t i = 0; i < width; i++)
        if (seen[i]) sums[m++] = (igrad__sar_entry_t){(uint32_t)(lo + i), acc[i]};
    *nkept = *nrem = 0;
    for (size_t q = 0; q < m; q++) {
        uint32_t aq = igrad__f32_bits(sums[q].value) & 0x7fffffffu;
        size_t beaten_by = 0;
        for (size_t o = 0; o < m; o++) {
            uint32_t ao = igrad__f32_bits(sums[o].value) & 0x7fffffffu;
            beaten_by += ao > aq || (ao == aq && sums[o].index < sums[q].index);
        }
        if (beaten_by < kout) kept[(*nkept)++] = sums[q];
        else rem[(*nrem)++] = sums[q];
    }
    free(acc);
    free(seen);
    free(sums);
}

/* One reduce case through the backend; the result also goes to out (kept
 * then rem, host; their counts in out_n[0], out_n[1]) when out is not
 * NULL, for a comparison of backends. */
static void sar_check_reduce(const igrad__sar_ops_t *ops, const sar_mem_t *mem, uint64_t seed,
                             size_t n, uint64_t lo, uint64_t hi, size_t kout, size_t bad_at,
                             igrad__sar_entry_t *out, size_t *out_n)
{
    uint64_t s = seed;
    igrad__sar_entry_t *recv = malloc((n ? n : 1) * sizeof *recv);
    for (size_t p = 0; p < n; p++) {
        recv[p].index = (uint32_t)(lo + sar_rand(&s) % (hi - lo));
        recv[p].value = sar_value(&s);
    }
    if (bad_at < n) recv[bad_at].index = (uint32_t)hi; /* outside the range */
    igrad__sar_t w = {0};
    w.ops = ops;
    size_t kcap = kout ? kout : 1, ncap = n ? n : 1;
    void *d_recv = mem->alloc(ncap * sizeof *recv);
    void *d_kept = mem->alloc(kcap * sizeof *recv), *d_rem = mem->alloc(ncap * sizeof *recv);
    mem->to(d_recv, recv, n * sizeof *recv);
    size_t nkept = 7, nrem = 7, bad = 0;
    uint32_t hist[IGRAD__SAR_HIST];
    memset(hist, 0x5a, sizeof hist);
    SAR_CHECK(ops->reserve(&w, n) == 0, "reserve(%zu) failed", n);
    igrad_status_t st = ops->reduce(&w, NULL, d_recv, n, lo, hi, kout, d_kept, &nkept, d_rem,
                                    &nrem, &bad, hist);
    SAR_CHECK(st == IGRAD_OK, "reduce: %s", igrad_last_error());
    igrad__sar_entry_t *kept = calloc(kcap, sizeof *kept), *rem = calloc(ncap, sizeof *rem);
    mem->from(kept, d_kept, kcap * sizeof *kept);
    mem->from(rem, d_rem, ncap * sizeof *rem);
    char what[160];
    snprintf(what, sizeof what, "%s reduce seed %llu n %zu [%llu, %llu) kout %zu", ops->name,
             (unsigned long long)seed, n, (unsigned long long)lo, (unsigned long long)hi, kout);
    if (bad_at < n) {
        SAR_CHECK(bad == bad_at, "%s: bad position %zu, expected %zu", what, bad, bad_at);
    } else {
        SAR_CHECK(bad == SIZE_MAX, "%s: bad position %zu reported", what, bad);
        /* part j of [lo, hi): lo + ceil(j w / H) <= i < lo + ceil((j+1) w / H) */
        for (int j = 0; j < IGRAD__SAR_HIST; j++) {
            uint64_t wd = hi - lo, H = IGRAD__SAR_HIST;
            uint64_t a = lo + (wd * (uint64_t)j + H - 1) / H;
            uint64_t b = lo + (wd * (uint64_t)(j + 1) + H - 1) / H;
            uint32_t want = 0;
            for (size_t p = 0; p < n; p++) want += recv[p].index >= a && recv[p].index < b;
            SAR_CHECK(hist[j] == want, "%s: histogram part %d [%llu, %llu) counts %u, expected %u",
                      what, j, (unsigned long long)a, (unsigned long long)b, hist[j], want);
        }
        igrad__sar_entry_t *rk = calloc(kcap, sizeof *rk), *rr = calloc(ncap, sizeof *rr);
        size_t rnk = 0, rnr = 0;
        if (n <= 4096) {
            sar_reduce_reference(recv, n, lo, hi, kout, rk, &rnk, rr, &rnr);
            SAR_CHECK(nkept == rnk && nrem == rnr, "%s: kept %zu rem %zu, expected %zu and %zu",
                      what, nkept, nrem, rnk, rnr);
            if (nkept == rnk && nrem == rnr) {
                sar_same_entries(kept, rk, nkept, what);
                sar_same_entries(rem, rr, nrem, what);
            }
        }
        for (size_t q = nkept; q < kout; q++) /* the block's padding */
            SAR_CHECK(kept[q].index == 0 && igrad__f32_bits(kept[q].value) == 0,
                      "%s: padding entry %zu is not zero", what, q);
        free(rk);
        free(rr);
    }
    if (out) {
        memcpy(out, kept, nkept * sizeof *kept);
        memcpy(out + nkept, rem, nrem * sizeof *rem);
        out_n[0] = nkept;
        out_n[1] = nrem;
    }
    mem->free(d_recv);
    mem->free(d_kept);
    mem->free(d_rem);
    igrad__sar_clear(&w);
    free(recv);
    free(kept);
    free(rem);
}

/* P + 1 split points of [0, D): equal (skewed = 0) or drawn at random,
 * sorted, so that ranges differ widely and some are empty. */
static uint64_t *sar_bounds(uint64_t D, int P, int skewed, uint64_t seed)
{
    uint64_t *b = malloc(((size_t)P + 1) * sizeof *b);
    igrad__sar_equal_bounds(D, P, b);
    if (!skewed) return b;
    uint64_t s = seed ^ 0x5bd1e995u;
    for (int r = 1; r < P; r++) { /* cubed draws crowd the low end */
        double u = (double)(sar_rand(&s) >> 11) / (double)(1ULL << 53);
        b[r] = (uint64_t)(u * u * u * (double)D);
        if (r % 5 == 3) b[r] = b[r - 1]; /* an empty range */
    }
    for (int r = 1; r < P; r++) /* insertion sort */
        for (int q = r; q > 1 && b[q] < b[q - 1]; q--) {
            uint64_t t = b[q];
            b[q] = b[q - 1];
            b[q - 1] = t;
        }
    return b;
}

/* The owner by a linear scan of the split points. */
static int sar_owner_scan(const uint64_t *b, int P, uint64_t i)
{
    for (int r = 0; r < P; r++)
        if (b[r] <= i && i < b[r + 1]) return r;
    return -1;
}

/* One split case: k entries over P owners of [0, D), equal or skewed
 * ranges; bad_at < k puts a bad entry there (kind 0: index D, 1: NaN, 2:
 * -Inf). */
static void sar_check_split(const igrad__sar_ops_t *ops, const sar_mem_t *mem, uint64_t seed,
                            size_t k, uint64_t D, int P, int ascending, size_t bad_at,
                            int kind, int skewed)
{
    uint64_t s = seed;
    uint64_t *bounds = sar_bounds(D, P, skewed, seed);
    igrad__sar_entry_t *in = malloc((k ? k : 1) * sizeof *in);
    for (size_t i = 0; i < k; i++) {
        in[i].index = (uint32_t)(ascending ? (D * i) / k : sar_rand(&s) % D);
        in[i].value = sar_value(&s);
    }
    if (bad_at < k) {
        if (kind == 0) in[bad_at].index = (uint32_t)D;
        else in[bad_at].value = kind == 1 ? NAN : -INFINITY;
    }
    igrad__sar_t w = {0};
    w.ops = ops;
    void *d_in = mem->alloc((k ? k : 1) * sizeof *in);
    mem->to(d_in, in, k * sizeof *in);
    void *d_bounds = mem->alloc(((size_t)P + 1) * sizeof *bounds);
    mem->to(d_bounds, bounds, ((size_t)P + 1) * sizeof *bounds);
    uint64_t *counts = calloc((size_t)P, sizeof *counts);
    igrad__sar_report_t rep = {0};
    igrad__sar_entry_t *send = NULL;
    igrad_status_t st = ops->split(&w, NULL, D, P, d_bounds, k, d_in, counts, &rep, &send);
    char what[160];
    snprintf(what, sizeof what, "%s split seed %llu k %zu D %llu P %d%s%s", ops->name,
             (unsigned long long)seed, k, (unsigned long long)D, P,
             ascending ? " ascending" : "", skewed ? " skewed" : "");
    SAR_CHECK(st == IGRAD_OK, "%s: %s", what, igrad_last_error());
    if (bad_at < k) {
        uint32_t vb = igrad__f32_bits(in[bad_at].value);
        SAR_CHECK(rep.reason == (kind == 0 ? IGRAD__SAR_INPUT_INDEX : IGRAD__SAR_INPUT_VALUE) &&
                      rep.where == bad_at && rep.value == (kind == 0 ? D : vb),
                  "%s: report %u at %llu value %llu, expected the entry at %zu", what,
                  rep.reason, (unsigned long long)rep.where, (unsigned long long)rep.value,
                  bad_at);
    } else {
        SAR_CHECK(rep.reason == IGRAD__SAR_OK, "%s: report %u", what, rep.reason);
        uint64_t *want = calloc((size_t)P, sizeof *want);
        igrad__sar_entry_t *group = malloc((k ? k : 1) * sizeof *group);
        size_t at = 0;
        int *owner = malloc((k ? k : 1) * sizeof *owner);
        for (size_t i = 0; i < k; i++) owner[i] = sar_owner_scan(bounds, P, in[i].index);
        for (int o = 0; o < P; o++) /* each owner's entries in input order */
            for (size_t i = 0; i < k; i++)
                if (owner[i] == o) {
                    group[at++] = in[i];
                    want[o]++;
                }
        for (int o = 0; o < P; o++)
            SAR_CHECK(counts[o] == want[o], "%s: owner %d counted %llu, expected %llu", what, o,
                      (unsigned long long)counts[o], (unsigned long long)want[o]);
        igrad__sar_entry_t *got = malloc((k ? k : 1) * sizeof *got);
        SAR_CHECK(send != NULL || k == 0, "%s: no send buffer", what);
        if (send) {
            mem->from(got, send, k * sizeof *got);
            sar_same_entries(got, group, k, what);
        }
        free(want);
        free(owner);
        free(group);
        free(got);
    }
    mem->free(d_in);
    mem->free(d_bounds);
    igrad__sar_clear(&w);
    free(counts);
    free(in);
    free(bounds);
}

/* One collect case: P blocks of up to kout ascending entries in their
 * ranges; corrupt: 0 none, 1 an index outside rank bad_rank's range at
 * entry bad_q, 2 not ascending there. */
static void sar_check_collect(const igrad__sar_ops_t *ops, const sar_mem_t *mem, uint64_t seed,
                              int P, uint64_t D, size_t kout, int corrupt, int bad_rank,
                              uint64_t bad_q, int skewed)
{
    uint64_t s = seed;
    uint64_t *bounds = sar_bounds(D, P, skewed, seed);
    size_t block_nbytes = sizeof(igrad__sar_header_t) + kout * sizeof(igrad__sar_entry_t);
    unsigned char *blocks = calloc((size_t)P, block_nbytes);
    uint64_t *nkept = calloc((size_t)P, sizeof *nkept);
    igrad__sar_entry_t *want = calloc((size_t)P * kout + 1, sizeof *want);
    size_t nwant = 0;
    for (int r = 0; r < P; r++) {
        uint64_t lo = bounds[r], hi = bounds[r + 1];
        size_t room = (size_t)(hi - lo) < kout ? (size_t)(hi - lo) : kout;
        nkept[r] = room ? sar_rand(&s) % (room + 1) : 0;
        if (r == bad_rank && nkept[r] <= bad_q) nkept[r] = bad_q + 1 <= room ? bad_q + 1 : room;
        igrad__sar_header_t h;
        memset(&h, 0, sizeof h);
        h.nkept = nkept[r];
        memcpy(blocks + (size_t)r * block_nbytes, &h, sizeof h);
        igrad__sar_entry_t *e = (igrad__sar_entry_t *)(void *)(blocks + (size_t)r * block_nbytes +
                                                                sizeof h);
        /* nkept[r] ascending indices out of [lo, hi): every step of the
         * range kept with the right chance */
        size_t placed = 0;
        for (uint64_t i = lo; i < hi && placed < nkept[r]; i++) {
            uint64_t left = hi - i, need = nkept[r] - placed;
            if (sar_rand(&s) % left < need) {
                e[placed].index = (uint32_t)i;
                e[placed].value = sar_value(&s);
                placed++;
            }
        }
        if (r == bad_rank && corrupt && bad_q < nkept[r]) {
            if (corrupt == 1) e[bad_q].index = (uint32_t)hi;
            else if (bad_q > 0) e[bad_q].index = e[bad_q - 1].index;
        }
        if (r < bad_rank || !corrupt)
            for (size_t q = 0; q < nkept[r]; q++) want[nwant++] = e[q];
    }
    void *d_blocks = mem->alloc((size_t)P * block_nbytes);
    void *d_result = mem->alloc(((size_t)P * kout + 1) * sizeof *want);
    mem->to(d_blocks, blocks, (size_t)P * block_nbytes);
    void *d_bounds = mem->alloc(((size_t)P + 1) * sizeof *bounds);
    mem->to(d_bounds, bounds, ((size_t)P + 1) * sizeof *bounds);
    igrad__sar_t w = {0};
    w.ops = ops;
    int got_rank = -1;
    uint64_t got_q = 0;
    uint32_t got_index = 0;
    igrad_status_t st = ops->collect(&w, NULL, d_blocks, block_nbytes, P, nkept, d_bounds,
                                     d_result, &got_rank, &got_q, &got_index);
    char what[160];
    snprintf(what, sizeof what, "%s collect seed %llu P %d D %llu kout %zu corrupt %d%s",
             ops->name, (unsigned long long)seed, P, (unsigned long long)D, kout, corrupt,
             skewed ? " skewed" : "");
    SAR_CHECK(st == IGRAD_OK, "%s: %s", what, igrad_last_error());
    int expect_bad = corrupt && bad_rank < P && bad_q < nkept[bad_rank] &&
                     (corrupt == 1 || bad_q > 0);
    if (expect_bad) {
        SAR_CHECK(got_rank == bad_rank && got_q == bad_q, "%s: bad entry %d/%llu, expected %d/%llu",
                  what, got_rank, (unsigned long long)got_q, bad_rank,
                  (unsigned long long)bad_q);
    } else {
        SAR_CHECK(got_rank == P, "%s: bad entry %d/%llu reported", what, got_rank,
                  (unsigned long long)got_q);
    }
    igrad__sar_entry_t *result = calloc((size_t)P * kout + 1, sizeof *result);
    mem->from(result, d_result, nwant * sizeof *result);
    sar_same_entries(result, want, nwant, what); /* corrupt: the ranks before the bad one */
    mem->free(d_blocks);
    mem->free(d_result);
    mem->free(d_bounds);
    igrad__sar_clear(&w);
    free(bounds);
    free(blocks);
    free(nkept);
    free(want);
    free(result);
}

/* Every case of this file on one backend. */
static void sar_check_backend(const igrad__sar_ops_t *ops, const sar_mem_t *mem)
{
    static const struct {
        size_t n;
        uint64_t lo, hi;
        size_t kout;
    } reduce_cases[] = {
        {0, 0, 10, 1},         {1, 5, 6, 1},          {40, 0, 8, 3},
        {40, 0, 8, 8},         {40, 0, 8, 100},       {300, 1000, 1100, 17},
        {300, 1000, 1100, 1},  {1000, 7, 2007, 250},  {1000, 7, 2007, 999},
        {4000, 0, 50, 20},     {4000, 0, 100000, 1500}, {3000, 0, 3000, 3000},
    };
    for (size_t c = 0; c < sizeof reduce_cases / sizeof reduce_cases[0]; c++)
        for (uint64_t seed = 1; seed <= 3; seed++)
            sar_check_reduce(ops, mem, seed * 977 + c, reduce_cases[c].n, reduce_cases[c].lo,
                             reduce_cases[c].hi, reduce_cases[c].kout, SIZE_MAX, NULL, NULL);
    sar_check_reduce(ops, mem, 5, 500, 100, 200, 9, 0, NULL, NULL);
    sar_check_reduce(ops, mem, 6, 500, 100, 200, 9, 321, NULL, NULL);
    sar_check_reduce(ops, mem, 7, 500, 100, 200, 9, 499, NULL, NULL);

    static const struct {
        size_t k;
        uint64_t D;
        int P, ascending;
    } split_cases[] = {
        {0, 10, 3, 0},     {1, 1, 1, 0},          {50, 7, 4, 0},     {500, 100000, 1, 0},
        {500, 100000, 2, 0}, {500, 100000, 5, 0}, {500, 100000, 8, 1}, {3000, 1u << 20, 13, 0},
        {3000, 1u << 20, 13, 1}, {2000, 5000, 5000, 0}, {2000, 5000, 4096, 0},
        {100, UINT64_C(1) << 32, 7, 0},
    };
    for (int skewed = 0; skewed < 2; skewed++)
        for (size_t c = 0; c < sizeof split_cases / sizeof split_cases[0]; c++)
            sar_check_split(ops, mem, 31 + c, split_cases[c].k, split_cases[c].D,
                            split_cases[c].P, split_cases[c].ascending, SIZE_MAX, 0, skewed);
    for (int kind = 0; kind < 3; kind++) {
        sar_check_split(ops, mem, 91, 700, 9000, 4, 0, 0, kind, 0);
        sar_check_split(ops, mem, 92, 700, 9000, 4, 0, 345, kind, 1);
        sar_check_split(ops, mem, 93, 700, 9000, 4, 0, 699, kind, 0);
    }

    for (int skewed = 0; skewed < 2; skewed++)
        for (int P = 1; P <= 9; P += 4)
            for (uint64_t seed = 1; seed <= 3; seed++) {
                sar_check_collect(ops, mem, seed, P, 1000, 40, 0, P, 0, skewed);
                sar_check_collect(ops, mem, seed, P, 30, 40, 0, P, 0, skewed); /* below kout */
            }
    sar_check_collect(ops, mem, 4, 5, 1000, 40, 1, 2, 1, 0);
    sar_check_collect(ops, mem, 5, 5, 1000, 40, 2, 1, 3, 0);
    sar_check_collect(ops, mem, 6, 5, 1000, 40, 1, 0, 0, 1);
    sar_check_collect(ops, mem, 7, 5, 1000, 40, 1, 4, 39, 0);
}

#endif /* IGRAD_TESTS_SAR_CASES_H */
