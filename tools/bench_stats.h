/*
 * bench_stats.h — what the benchmarks report: the median (igrad bench
 * select, igrad bench sync, bench/cuda_bench.c: sorts v in place; NaN for
 * n <= 0) and the spread of a two-level run's bytes over its shards
 * (igrad bench sync, tests/mpi_shard_bytes.c).
 */
#ifndef IGRAD_TOOLS_BENCH_STATS_H
#define IGRAD_TOOLS_BENCH_STATS_H

#include <math.h>
#include <stdlib.h>

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline double bench_median(double *v, int n)
{
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The spread over shards of what each rank measured. */
typedef struct bench_shards {
    int n;                      /* shards (the local ranks present) */
    double min, max, mean;      /* over shards of each shard's bytes */
    double max_over_mean;       /* max / mean (NaN when mean is 0) */
} bench_shards_t;

/* A two-level run's bytes per shard: rank r holds shard shard[r] (its
 * local rank, in [0, nranks)) and measured bytes[r]; a shard's bytes are
 * the mean over its ranks (its N owners, one per node, each sending its
 * own selection); per_shard (nranks) receives them, NaN for a local rank
 * no rank holds. @return 0, or -1 for a shard out of range. */
static inline int bench_shard_bytes(const double *bytes, const int *shard, int nranks,
                                    double *per_shard, bench_shards_t *out)
{
    out->n = 0;
    out->min = out->max = out->mean = out->max_over_mean = NAN;
    for (int l = 0; l < nranks; l++) per_shard[l] = 0.0;
    int *owners = (int *)calloc((size_t)(nranks > 0 ? nranks : 1), sizeof *owners);
    if (!owners) return -1;
    for (int r = 0; r < nranks; r++) {
        if (shard[r] < 0 || shard[r] >= nranks) {
            free(owners);
            return -1;
        }
        per_shard[shard[r]] += bytes[r];
        owners[shard[r]]++;
    }
    double sum = 0.0;
    for (int l = 0; l < nranks; l++) {
        if (!owners[l]) {
            per_shard[l] = NAN;
            continue;
        }
        double b = per_shard[l] /= (double)owners[l];
        if (out->n == 0 || b < out->min) out->min = b;
        if (out->n == 0 || b > out->max) out->max = b;
        sum += b;
        out->n++;
    }
    free(owners);
    if (out->n > 0) {
        out->mean = sum / (double)out->n;
        out->max_over_mean = out->mean > 0.0 ? out->max / out->mean : NAN;
    }
    return 0;
}

#endif /* IGRAD_TOOLS_BENCH_STATS_H */
