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
#include "bench_stats.h"
#ifdef IGRAD_HAVE_TRAINER
#include "model.h"
#endif

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
            "       igrad bench select --shape RxC [--shape RxC ...] | --model-shapes [--model M]\n"
            "                          [--density D] [--reps R] [--threads T] [--json]\n"
            "  --n N         entries (default 16777216)\n"
            "  --density D   kept fraction (default 0.01)\n"
            "  --reps R      repetitions, medians reported (default 5; shapes: 21)\n"
            "  --sort-reps S repetitions of the (slow) sort reference (default min(R, 3))\n"
            "  --threads T   OpenMP threads (default 1)\n"
            "  --shape RxC   time tensors of this shape (R alone: 1-D; repeatable)\n"
            "  --model-shapes  time one step over every tensor of the trainer's model\n"
            "  --model M     its size: tiny, small (default; the demo model), base\n"
            "  --json        print one JSON object instead of the table\n"
            "Without --shape: times one streaming pass (e = e + g), fused EF + topk, EF\n"
            "+ adtopk on [n/cols, cols] (cols = 4096 when it divides n) and a qsort of\n"
            "(|a|, index) pairs, on the same fp32 normals; the sort's selection is\n"
            "checked against topk's.\n"
            "With --shape or --model-shapes: per shape, ns per entry of the streaming\n"
            "pass, EF + flat topk and EF + adtopk (row-wise), side by side, and the\n"
            "total per step; in the first repetition every selection is checked\n"
            "against a sort (per row for adtopk).\n");
}

/* ------------------------------------------------------------------------ */
/* Per shape: adtopk vs flat topk vs the streaming pass                     */
/* ------------------------------------------------------------------------ */

typedef struct bench_tensor {
    int ndim;
    int64_t shape[2];
    int64_t n, offset;
    int group; /* index of its distinct shape */
    igrad_select_spec_t topk, ad;
} bench_tensor_t;

typedef struct tensor_list {
    bench_tensor_t *t;
    int count, cap, ngroups;
    int first[256]; /* first tensor of each group */
    int64_t total;
} tensor_list_t;

static int list_add(tensor_list_t *l, int ndim, int64_t d0, int64_t d1)
{
    if (d0 < 1 || d1 < 1 || d0 > ((int64_t)1 << 32) / d1) {
        fprintf(stderr, "igrad: bench select: shape %lldx%lld outside 1..2^32 entries\n",
                (long long)d0, (long long)d1);
        return -1;
    }
    if (l->count == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        bench_tensor_t *t = realloc(l->t, (size_t)cap * sizeof *t);
        if (!t) return -1;
        l->t = t;
        l->cap = cap;
    }
    bench_tensor_t *t = &l->t[l->count];
    memset(t, 0, sizeof *t);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->n = d0 * d1;
    t->offset = l->total;
    t->group = -1;
    for (int g = 0; g < l->ngroups; g++) {
        const bench_tensor_t *f = &l->t[l->first[g]];
        if (f->ndim == ndim && f->shape[0] == d0 && f->shape[1] == d1) t->group = g;
    }
    if (t->group < 0) {
        if (l->ngroups == (int)(sizeof l->first / sizeof l->first[0])) {
            fprintf(stderr, "igrad: bench select: more than 256 distinct shapes\n");
            return -1;
        }
        t->group = l->ngroups;
        l->first[l->ngroups++] = l->count;
    }
    l->total += t->n;
    l->count++;
    return 0;
}

/* "RxC" (2-D) or "R" (1-D). */
static int parse_shape(const char *text, tensor_list_t *l)
{
    char *end = NULL;
    long long r = strtoll(text, &end, 10), c = 1;
    int ndim = 1;
    if (end != text && (*end == 'x' || *end == 'X')) {
        const char *p = end + 1;
        c = strtoll(p, &end, 10);
        ndim = end != p ? 2 : 0;
    }
    if (end == text || *end != '\0' || ndim == 0) {
        fprintf(stderr, "igrad: --shape: '%s' is not ROWSxCOLS or N\n", text);
        return -1;
    }
    return list_add(l, ndim, r, c);
}

/* Every tensor of the trainer's model `name`, in its order. */
static int model_tensors(const char *name, tensor_list_t *l)
{
#ifdef IGRAD_HAVE_TRAINER
    model_config_t cfg;
    model_t *m = NULL;
    if (model_config_preset(name, &cfg) != IGRAD_OK || model_create(&cfg, &m) != IGRAD_OK) {
        fprintf(stderr, "igrad: bench select: %s\n", trainer_last_error());
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < m->n_tensors && rc == 0; i++) {
        const model_tensor_t *t = &m->tensors[i];
        rc = list_add(l, t->ndim, t->shape[0], t->ndim == 2 ? t->shape[1] : 1);
    }
    model_free(m);
    return rc;
#else
    fprintf(stderr, "igrad: bench select: --model-shapes needs the trainer (built without "
                    "OpenBLAS or MPI), model '%s'\n", name);
    return -1;
#endif
}

/* Compares a selection of a = g + e0 (rows x cols, per_row kept per row)
 * and the residual e it left with a sort of each row. @return 0 if equal. */
static int check_with_sort(const float *g, const float *e0, const float *e, int64_t rows,
                           int64_t cols, int64_t per_row, const uint32_t *idx,
                           const float *val, pair_t *pairs, uint32_t *kept)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = g + r * cols, *er = e0 + r * cols;
        for (int64_t i = 0, j = 0; i < cols; i++) { /* kept entries 0, the others a */
            int is_kept = j < per_row && idx[r * per_row + j] == (uint32_t)i;
            float want = is_kept ? 0.0f : gr[i] + er[i];
            j += is_kept;
            if (memcmp(&e[r * cols + i], &want, sizeof want) != 0) return -1;
        }
        for (int64_t i = 0; i < cols; i++) {
            pairs[i].mag = fabsf(gr[i] + er[i]);
            pairs[i].index = (uint32_t)i;
        }
        qsort(pairs, (size_t)cols, sizeof *pairs, cmp_pair);
        for (int64_t j = 0; j < per_row; j++) kept[j] = pairs[j].index;
        qsort(kept, (size_t)per_row, sizeof *kept, cmp_u32);
        for (int64_t j = 0; j < per_row; j++) {
            float want = gr[kept[j]] + er[kept[j]];
            if (idx[r * per_row + j] != kept[j] ||
                memcmp(&val[r * per_row + j], &want, sizeof want) != 0)
                return -1;
        }
    }
    return 0;
}

static void fmt_shape(const bench_tensor_t *t, char *buf, size_t size)
{
    if (t->ndim == 2)
        snprintf(buf, size, "[%lld, %lld]", (long long)t->shape[0], (long long)t->shape[1]);
    else
        snprintf(buf, size, "[%lld]", (long long)t->shape[0]);
}

enum { M_STREAM, M_TOPK, M_AD, M_COUNT };

static int bench_shapes(tensor_list_t *l, const char *title, double density, int64_t reps,
                        int64_t threads, int json)
{
    int64_t nmax = 1, kmax = 1, G = l->ngroups;
    for (int i = 0; i < l->count; i++) {
        bench_tensor_t *t = &l->t[i];
        igrad_status_t st = igrad_select_spec(IGRAD_SPARSIFIER_TOPK, density, 1.0, 0, 0, t->ndim,
                                              t->shape, &t->topk);
        if (st == IGRAD_OK)
            st = igrad_select_spec(IGRAD_SPARSIFIER_ADTOPK, density, 1.0, 0, 0, t->ndim,
                                   t->shape, &t->ad);
        if (st != IGRAD_OK) return cli_fail("bench select", st);
        if (t->n > nmax) nmax = t->n;
        if (t->topk.count > kmax) kmax = t->topk.count;
        if (t->ad.count > kmax) kmax = t->ad.count;
    }
    size_t nb = (size_t)l->total * sizeof(float);
    float *g = malloc(nb), *e0 = malloc(nb), *e = malloc(nb), *val = malloc((size_t)kmax * 4);
    uint32_t *idx = malloc((size_t)kmax * 4), *kept = malloc((size_t)kmax * 4);
    pair_t *pairs = malloc((size_t)nmax * sizeof *pairs);
    /* per method, repetition and group: ms; the last "group" is the step */
    double *t_ms = calloc((size_t)(M_COUNT * reps * (G + 1)), sizeof(double));
    double *col = calloc((size_t)reps, sizeof(double));
    igrad_select_ws_t *ws = NULL;
    int rc = 1;
    if (!g || !e0 || !e || !val || !idx || !kept || !pairs || !t_ms || !col) {
        fprintf(stderr, "igrad: bench select: out of memory for %lld entries\n",
                (long long)l->total);
        goto cleanup;
    }
    igrad_status_t st = igrad_select_ws_create(&ws);
    if (st != IGRAD_OK) {
        rc = cli_fail("bench select", st);
        goto cleanup;
    }
    fill_normal(g, l->total, 1234, 1.0f);
    fill_normal(e0, l->total, 5678, 0.25f);

    double checksum = 0.0;
    for (int64_t r = 0; r < reps; r++) {
        for (int m = 0; m < M_COUNT; m++) {
            double *row = t_ms + (size_t)(m * reps + r) * (size_t)(G + 1);
            memcpy(e, e0, nb); /* every method starts from the same residuals */
            for (int i = 0; i < l->count; i++) {
                const bench_tensor_t *t = &l->t[i];
                const float *gt = g + t->offset;
                float *et = e + t->offset;
                const igrad_select_spec_t *sp = m == M_TOPK ? &t->topk : &t->ad;
                igrad_selection_t sel = {.index = idx, .value = val};
                double t0 = now_ms();
                if (m == M_STREAM) stream_pass(gt, et, t->n);
                else st = igrad_select_ef(gt, et, sp, "bench", ws, &sel);
                double dt = now_ms() - t0;
                row[t->group] += dt;
                row[G] += dt;
                if (m == M_STREAM) {
                    checksum += et[r % t->n];
                    continue;
                }
                if (st != IGRAD_OK) {
                    rc = cli_fail(m == M_TOPK ? "bench select: topk" : "bench select: adtopk",
                                  st);
                    goto cleanup;
                }
                checksum += sel.sumsq;
                if (r == 0 && check_with_sort(gt, e0 + t->offset, et, sp->rows, sp->cols,
                                              sp->per_row, idx, val, pairs, kept)) {
                    char sh[64];
                    fmt_shape(t, sh, sizeof sh);
                    fprintf(stderr, "igrad: bench select: %s on %s disagrees with the sort\n",
                            m == M_TOPK ? "topk" : "adtopk", sh);
                    goto cleanup;
                }
            }
        }
    }

    /* medians over the repetitions, per method and group */
    double med[M_COUNT][257];
    for (int m = 0; m < M_COUNT; m++)
        for (int64_t grp = 0; grp <= G; grp++) {
            for (int64_t r = 0; r < reps; r++)
                col[r] = t_ms[(size_t)(m * reps + r) * (size_t)(G + 1) + (size_t)grp];
            med[m][grp] = bench_median(col, (int)reps);
        }
    if (json) {
        printf("{\"title\": \"%s\", \"entries\": %lld, \"tensors\": %d, \"density\": %g, "
               "\"threads\": %lld, \"reps\": %lld, \"shapes\": [",
               title, (long long)l->total, l->count, density, (long long)threads,
               (long long)reps);
    } else {
        printf("bench select: %s (%lld entries in %d tensors), density %g, threads %lld, "
               "median of %lld\n",
               title, (long long)l->total, l->count, density, (long long)threads,
               (long long)reps);
        printf("  %-14s %7s %7s %12s %12s %12s %12s\n", "shape", "tensors", "per_row",
               "stream ns/e", "topk ns/e", "adtopk ns/e", "adtopk/topk");
    }
    for (int grp = 0; grp < G; grp++) {
        const bench_tensor_t *f = &l->t[l->first[grp]];
        int members = 0;
        for (int i = 0; i < l->count; i++) members += l->t[i].group == grp;
        double ent = (double)f->n * members;
        double ns[M_COUNT];
        for (int m = 0; m < M_COUNT; m++) ns[m] = med[m][grp] * 1e6 / ent;
        char sh[64];
        fmt_shape(f, sh, sizeof sh);
        if (json)
            printf("%s{\"shape\": \"%s\", \"tensors\": %d, \"per_row\": %lld, "
                   "\"row_wise\": %d, \"stream_ns\": %.4f, \"topk_ns\": %.4f, "
                   "\"adtopk_ns\": %.4f}",
                   grp ? ", " : "", sh, members, (long long)f->ad.per_row, f->ad.row_wise,
                   ns[M_STREAM], ns[M_TOPK], ns[M_AD]);
        else
            printf("  %-14s %7d %7lld %12.3f %12.3f %12.3f %11.2fx\n", sh, members,
                   f->ad.row_wise ? (long long)f->ad.per_row : 0LL, ns[M_STREAM], ns[M_TOPK],
                   ns[M_AD], ns[M_AD] / ns[M_TOPK]);
    }
    if (json) {
        printf("], \"step_stream_ms\": %.4f, \"step_topk_ms\": %.4f, \"step_adtopk_ms\": %.4f}\n",
               med[M_STREAM][G], med[M_TOPK][G], med[M_AD][G]);
    } else {
        printf("  %-30s %12.3f %12.3f %12.3f %11.2fx\n", "step, ms", med[M_STREAM][G],
               med[M_TOPK][G], med[M_AD][G], med[M_AD][G] / med[M_TOPK][G]);
        printf("  (per_row 0: 1-D, flat; checksum %.6g; selections equal the sort's)\n",
               checksum);
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
    free(t_ms);
    free(col);
    return rc;
}

int bench_select(int argc, char **argv)
{
    int64_t n = 16777216, reps = -1, threads = 1, sort_reps = -1;
    double density = 0.01;
    int json = 0, model_shapes = 0, nshape = 0;
    const char *model = "small", *shape_arg[64];
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
        if (!strcmp(argv[i], "--model-shapes")) {
            model_shapes = 1;
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
        } else if ((r = cli_opt(argc, argv, &i, "--shape", &v)) != 0) {
            if (r < 0) return 2;
            if (nshape == (int)(sizeof shape_arg / sizeof shape_arg[0])) {
                fprintf(stderr, "igrad: bench select: more than 64 --shape options\n");
                return 2;
            }
            shape_arg[nshape++] = v;
        } else if ((r = cli_opt(argc, argv, &i, "--model", &v)) != 0) {
            if (r < 0) return 2;
            model = v;
        } else {
            fprintf(stderr, "igrad: bench select: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (reps < 0) reps = nshape || model_shapes ? 21 : 5;
    if (nshape || model_shapes) {
        if (reps < 1 || reps > 1000 || threads < 1 || threads > 1024 ||
            !(density > 0.0 && density <= 1.0)) {
            fprintf(stderr, "igrad: bench select: need 1 <= reps <= 1000, 1 <= threads <= 1024, "
                            "0 < density <= 1\n");
            return 2;
        }
#ifdef _OPENMP
        omp_set_num_threads((int)threads);
#endif
        tensor_list_t list = {0};
        int bad = 0;
        char title[64];
        if (model_shapes) {
            bad = model_tensors(model, &list);
            snprintf(title, sizeof title, "model %s", model);
        } else {
            snprintf(title, sizeof title, "%d shape%s", nshape, nshape > 1 ? "s" : "");
        }
        for (int i = 0; i < nshape && !bad; i++) bad = parse_shape(shape_arg[i], &list);
        int rc = bad ? 2 : bench_shapes(&list, title, density, reps, threads, json);
        free(list.t);
        return rc;
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
    double ms_stream = bench_median(t_stream, (int)reps);
    double ms_topk = bench_median(t_topk, (int)reps), ms_ad = bench_median(t_ad, (int)reps);
    double ms_sort = bench_median(t_sort, (int)sort_reps);
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
