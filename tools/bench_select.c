/*
 * bench_select.c — `igrad bench select`: the fused error-feedback selection
 * timed side by side with what it is measured against, in one run, on the
 * same data: fp32 standard normals from a fixed seed as the gradient and a
 * smaller normal residual (a later step's state), density 1 %.
 *   stream   one plain streaming pass over the same bytes: e = e + g
 *   topk     igrad_select_ef, flat top-k (EF add + selection + residual)
 *   adtopk   igrad_select_ef, row-wise, the data seen as [rows, cols] with
 *            cols = 4096 (or the largest divisor of n below it)
 *   sort     the textbook reference: a = g + e, qsort of all (|a|, index)
 *            pairs (|a| descending, index ascending), the first k kept, then
 *            the residual written; its selection is also compared with
 *            topk's, so the benchmark fails loudly if they disagree. It takes
 *            seconds, so it runs in the first --sort-reps repetitions only.
 * Every repetition starts from the same residual (restored outside the timed
 * region); medians are reported. Timings are never asserted anywhere.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cli.h"

typedef struct pair {
    float mag;
    uint32_t index;
} pair_t;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Standard normals by Box-Muller from a fixed seed. */
static void fill_normal(float *x, int64_t n, uint64_t seed, float scale)
{
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = ((double)(rng_next(&s) >> 11) + 1.0) * 0x1.0p-53;
        double u2 = (double)(rng_next(&s) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1));
        x[i] = (float)(r * cos(6.283185307179586 * u2)) * scale;
        if (i + 1 < n) x[i + 1] = (float)(r * sin(6.283185307179586 * u2)) * scale;
    }
}

/* The streaming baseline: e = e + g, in chunks whose constant trip count
 * lets -O2 vectorize (restrict: no alias checks), threads over chunks. It
 * must be a fair, fast loop, or every ratio against it flatters igrad. */
#define STREAM_CHUNK 4096
static void stream_chunk(const float *restrict g, float *restrict e)
{
    for (int j = 0; j < STREAM_CHUNK; j++) e[j] = e[j] + g[j];
}

static void stream_pass(const float *restrict g, float *restrict e, int64_t n)
{
    int64_t chunks = n / STREAM_CHUNK;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (omp_get_max_threads() > 1)
#endif
    for (int64_t c = 0; c < chunks; c++) stream_chunk(g + c * STREAM_CHUNK, e + c * STREAM_CHUNK);
    for (int64_t i = chunks * STREAM_CHUNK; i < n; i++) e[i] = e[i] + g[i];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int cmp_pair(const void *a, const void *b)
{
    const pair_t *x = a, *y = b;
    if (x->mag != y->mag) return x->mag > y->mag ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The reference: full sort, first k, residual. Leaves the kept indices
 * (ascending) in kept[0..k). */
static void sort_select(const float *g, float *e, int64_t n, int64_t k, pair_t *pairs,
                        uint32_t *kept)
{
    for (int64_t i = 0; i < n; i++) {
        e[i] = g[i] + e[i];
        pairs[i].mag = fabsf(e[i]);
        pairs[i].index = (uint32_t)i;
    }
    qsort(pairs, (size_t)n, sizeof *pairs, cmp_pair);
    for (int64_t j = 0; j < k; j++) kept[j] = pairs[j].index;
    qsort(kept, (size_t)k, sizeof *kept, cmp_u32);
    for (int64_t j = 0; j < k; j++) e[kept[j]] = 0.0f;
}

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: igrad bench select [--n N] [--density D] [--reps R] [--sort-reps S]\n"
            "                          [--threads T] [--json]\n"
            "  --n N         entries (default 16777216)\n"
            "  --density D   kept fraction (default 0.01)\n"
            "  --reps R      repetitions, medians reported (default 5)\n"
            "  --sort-reps S repetitions of the (slow) sort reference (default min(R, 3))\n"
            "  --threads T   OpenMP threads (default 1)\n"
            "  --json        print one JSON object {n, density, threads, stream_ms,\n"
            "                topk_ef_ms, adtopk_ef_ms, sort_ms} instead of the table\n"
            "Times one streaming pass (e = e + g), fused EF + topk, EF + adtopk on\n"
            "[n/cols, cols] (cols = 4096 when it divides n) and a qsort of (|a|, index)\n"
            "pairs, on the same fp32 normals; the sort's selection is checked against\n"
            "topk's.\n");
}

int bench_select(int argc, char **argv)
{
    int64_t n = 16777216, reps = 5, threads = 1, sort_reps = -1;
    double density = 0.01;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) {
            json = 1;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--n", &v)) != 0) {
            if (r < 0 || cli_parse_i64("--n", v, &n)) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--density", &v)) != 0) {
            if (r < 0 || cli_parse_f64("--density", v, &density)) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--reps", &v)) != 0) {
            if (r < 0 || cli_parse_i64("--reps", v, &reps)) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--sort-reps", &v)) != 0) {
            if (r < 0 || cli_parse_i64("--sort-reps", v, &sort_reps)) return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--threads", &v)) != 0) {
            if (r < 0 || cli_parse_i64("--threads", v, &threads)) return 2;
        } else {
            fprintf(stderr, "igrad: bench select: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (sort_reps < 0) sort_reps = reps < 3 ? reps : 3;
    if (n < 1 || n > ((int64_t)1 << 32) || reps < 1 || reps > 1000 || threads < 1 ||
        threads > 1024 || sort_reps < 1 || sort_reps > reps) {
        fprintf(stderr, "igrad: bench select: need 1 <= n <= 2^32, 1 <= reps <= 1000, "
                        "1 <= sort-reps <= reps, 1 <= threads <= 1024\n");
        return 2;
    }
#ifdef _OPENMP
    omp_set_num_threads((int)threads);
#endif

    int64_t cols = 4096 < n ? 4096 : n;
    while (n % cols) cols--;
    int64_t flat_shape[1] = {n}, mat_shape[2] = {n / cols, cols};
    igrad_select_spec_t spec_topk, spec_ad;
    igrad_status_t st = igrad_select_spec(IGRAD_SPARSIFIER_TOPK, density, 1.0, 0, 0, 1,
                                          flat_shape, &spec_topk);
    if (st == IGRAD_OK)
        st = igrad_select_spec(IGRAD_SPARSIFIER_ADTOPK, density, 1.0, 0, 0, 2, mat_shape,
                               &spec_ad);
    if (st != IGRAD_OK) return cli_fail("bench select", st);
    int64_t k = spec_topk.count;
    int64_t kmax = k > spec_ad.count ? k : spec_ad.count;

    size_t nb = (size_t)n * sizeof(float);
    float *g = malloc(nb), *e0 = malloc(nb), *e = malloc(nb), *val = malloc((size_t)kmax * 4);
    uint32_t *idx = malloc((size_t)kmax * 4), *kept = malloc((size_t)k * 4);
    pair_t *pairs = malloc((size_t)n * sizeof *pairs);
    double *t_stream = calloc((size_t)reps, sizeof(double));
    double *t_topk = calloc((size_t)reps, sizeof(double));
    double *t_ad = calloc((size_t)reps, sizeof(double));
    double *t_sort = calloc((size_t)reps, sizeof(double));
    igrad_select_ws_t *ws = NULL;
    int rc = 1;
    if (!g || !e0 || !e || !val || !idx || !kept || !pairs || !t_stream || !t_topk || !t_ad ||
        !t_sort) {
        fprintf(stderr, "igrad: bench select: out of memory for n = %lld\n", (long long)n);
        goto cleanup;
    }
    if ((st = igrad_select_ws_create(&ws)) != IGRAD_OK) {
        rc = cli_fail("bench select", st);
        goto cleanup;
    }
    fill_normal(g, n, 1234, 1.0f);
    fill_normal(e0, n, 5678, 0.25f);

    double checksum = 0.0;
    for (int64_t r = 0; r < reps; r++) {
        /* stream: the bytes of one EF step and nothing else */
        memcpy(e, e0, nb);
        double t0 = now_ms();
        stream_pass(g, e, n);
        t_stream[r] = now_ms() - t0;
        checksum += e[r % n]; /* e is read afterwards: the pass cannot be elided */

        memcpy(e, e0, nb);
        igrad_selection_t sel = {.index = idx, .value = val};
        t0 = now_ms();
        st = igrad_select_ef(g, e, &spec_topk, "bench", ws, &sel);
        t_topk[r] = now_ms() - t0;
        if (st != IGRAD_OK) {
            rc = cli_fail("bench select: topk", st);
            goto cleanup;
        }
        checksum += sel.sumsq;

        if (r < sort_reps) {
            memcpy(e, e0, nb);
            t0 = now_ms();
            sort_select(g, e, n, k, pairs, kept);
            t_sort[r] = now_ms() - t0;
            /* the reference's kept set must be topk's (idx not reused yet) */
            if (memcmp(kept, idx, (size_t)k * sizeof *kept) != 0) {
                fprintf(stderr, "igrad: bench select: topk and the sort disagree\n");
                goto cleanup;
            }
        }

        memcpy(e, e0, nb);
        sel = (igrad_selection_t){.index = idx, .value = val};
        t0 = now_ms();
        st = igrad_select_ef(g, e, &spec_ad, "bench", ws, &sel);
        t_ad[r] = now_ms() - t0;
        if (st != IGRAD_OK) {
            rc = cli_fail("bench select: adtopk", st);
            goto cleanup;
        }
        checksum += sel.sumsq;
    }
    double ms_stream = median(t_stream, (int)reps), ms_topk = median(t_topk, (int)reps);
    double ms_ad = median(t_ad, (int)reps), ms_sort = median(t_sort, (int)sort_reps);
    if (json) {
        printf("{\"n\": %lld, \"density\": %g, \"threads\": %lld, \"stream_ms\": %.3f, "
               "\"topk_ef_ms\": %.3f, \"adtopk_ef_ms\": %.3f, \"sort_ms\": %.3f}\n",
               (long long)n, density, (long long)threads, ms_stream, ms_topk, ms_ad, ms_sort);
    } else {
        printf("bench select: n = %lld fp32, density %g (k = %lld; adtopk on [%lld, %lld], "
               "%lld per row), threads %lld, median of %lld (sort: %lld)\n",
               (long long)n, density, (long long)k, (long long)mat_shape[0],
               (long long)cols, (long long)spec_ad.per_row, (long long)threads,
               (long long)reps, (long long)sort_reps);
        printf("  %-28s %10s %10s\n", "pass", "ms", "ratio");
        printf("  %-28s %10.2f %10s\n", "stream (e = e + g)", ms_stream, "1.00");
        printf("  %-28s %10.2f %9.2fx  (topk/stream)\n", "EF + topk", ms_topk,
               ms_topk / ms_stream);
        printf("  %-28s %10.2f %9.2fx  (adtopk/stream)\n", "EF + adtopk", ms_ad,
               ms_ad / ms_stream);
        printf("  %-28s %10.2f %9.2fx  (sort/topk)\n", "qsort of (|a|, index)", ms_sort,
               ms_sort / ms_topk);
        printf("  (checksum %.6g; selection equals the sort's)\n", checksum);
    }
    rc = 0;

cleanup:
    igrad_select_ws_free(ws);
    free(g);
    free(e0);
    free(e);
    free(val);
    free(idx);
    free(kept);
    free(pairs);
    free(t_stream);
    free(t_topk);
    free(t_ad);
    free(t_sort);
    return rc;
}
