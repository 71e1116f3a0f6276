/*
 * bench_stats.h — the median the benchmarks report (igrad bench select,
 * igrad bench sync, bench/cuda_bench.c): sorts v in place; NaN for n <= 0.
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

#endif /* IGRAD_TOOLS_BENCH_STATS_H */
