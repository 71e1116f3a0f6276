/*
 * cmd_profile.c — `igrad profile`: reads an activity trace CSV, builds the
 * importance profile over a window of steps, prints the components ranked
 * by score with the threshold and the important share, and writes the
 * profile JSON (and optionally the reference CSV). All computation lives
 * in the library (src/profile.c, src/partition.c); this file only parses
 * arguments and prints.
 */
#define _POSIX_C_SOURCE 200809L /* stat */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: igrad profile --trace TRACE.csv [--window A:B] [--alpha 0.7]\n"
            "                     [--method knee] [--out profile.json] [--csv profile.csv]\n"
            "                     [--quiet]\n"
            "\n"
            "Scores each (layer, kind) component of an activity trace over a window of\n"
            "steps (magnitude and persistence of the retained gradient), splits them into\n"
            "important and low-importance by a threshold, and writes the profile.\n"
            "\n"
            "  --trace F    trace CSV (step,layer,component,raw_activity,d_activity,\n"
            "               numel,retained_numel), as written by igrad_trace_save()\n"
            "  --window W   steps A <= s < B: 'A:B', 'A:' (to the end), ':B' (from the\n"
            "               start); default: all steps\n"
            "  --alpha X    weight of magnitude in the score, in [0, 1] (default 0.7)\n"
            "  --method M   knee (default), otsu, kmeans2, gmm2, percentile:P (P in\n"
            "               [0, 100]) or fixed:F (top fraction F in (0, 1])\n"
            "  --out F      write the profile JSON (the engine's input)\n"
            "  --csv F      also write layer,component,final_score,global_tau,is_important\n"
            "  --quiet      print nothing but errors\n"
            "  -h, --help   this text\n");
}

/* "A:B", "A:", ":B" -> [begin, end) with end -1 for "to the end". */
static int parse_window(const char *text, int64_t *begin, int64_t *end)
{
    const char *colon = strchr(text, ':');
    if (!colon || strchr(colon + 1, ':')) {
        fprintf(stderr, "igrad: --window: '%s' is not A:B, A: or :B\n", text);
        return -1;
    }
    size_t na = (size_t)(colon - text);
    char a[64];
    if (na >= sizeof a) {
        fprintf(stderr, "igrad: --window: '%s' is too long\n", text);
        return -1;
    }
    memcpy(a, text, na);
    a[na] = '\0';
    *begin = 0;
    *end = -1;
    if (na && cli_parse_i64("--window", a, begin) != 0) return -1;
    if (colon[1] && cli_parse_i64("--window", colon + 1, end) != 0) return -1;
    if (*begin < 0 || (colon[1] && *end <= *begin)) {
        fprintf(stderr, "igrad: --window: '%s' is empty or negative (need 0 <= A < B)\n", text);
        return -1;
    }
    return 0;
}

/* 1 if both paths name the same file (by name, or by device and inode when
 * both exist). */
static int same_file(const char *a, const char *b)
{
    if (!strcmp(a, b)) return 1;
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0) return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static const igrad_profile_entry_t *rank_entries;

/* Score descending; ties keep the profile's (layer, kind) order. */
static int by_score(const void *pa, const void *pb)
{
    size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
    double sa = rank_entries[a].score, sb = rank_entries[b].score;
    if (sa != sb) return sa > sb ? -1 : 1;
    return (a > b) - (a < b);
}

static int print_profile(const igrad_profile_t *p, const igrad_trace_t *t, const char *path)
{
    size_t n = igrad_profile_count(p);
    igrad_profile_entry_t *e = calloc(n ? n : 1, sizeof *e);
    size_t *order = calloc(n ? n : 1, sizeof *order);
    if (!e || !order) {
        free(e);
        free(order);
        fprintf(stderr, "igrad: profile: out of memory\n");
        return 1;
    }
    int64_t total = 0, important_entries = 0;
    size_t important = 0;
    for (size_t i = 0; i < n; i++) {
        igrad_profile_entry(p, i, &e[i]);
        order[i] = i;
        total += e[i].count;
        if (e[i].important) {
            important++;
            important_entries += e[i].count;
        }
    }
    rank_entries = e;
    qsort(order, n, sizeof *order, by_score);

    int64_t wb = 0, we = 0;
    size_t steps = 0;
    igrad_profile_window(p, &wb, &we, &steps);
    printf("# %s: %zu steps (%lld..%lld), window [%lld, %lld) holds %zu; %zu components\n", path,
           igrad_trace_step_count(t), (long long)igrad_trace_step(t, 0),
           (long long)igrad_trace_step(t, igrad_trace_step_count(t) - 1), (long long)wb,
           (long long)we, steps, n);
    uint64_t hash = igrad_profile_layout_hash(p);
    if (hash) {
        printf("# layout 0x%016llx, sparsifier %s, density %g\n", (unsigned long long)hash,
               igrad_profile_sparsifier(p), igrad_profile_density(p));
    } else {
        printf("# layout hash unknown (no '# igrad-trace' line in the trace): the profile "
               "can only be checked against a model's components\n");
    }
    printf("%4s %5s %-4s %12s %13s %9s %11s %9s  %s\n", "rank", "layer", "kind", "numel",
           "mean_act", "magnitude", "persistence", "score", "important");
    for (size_t r = 0; r < n; r++) {
        const igrad_profile_entry_t *x = &e[order[r]];
        printf("%4zu %5d %-4s %12lld %13.6g %9.4f %11.4f %9.4f  %s\n", r + 1, x->layer,
               igrad_kind_name(x->kind), (long long)x->count, x->mean_activity, x->magnitude,
               x->persistence, x->score, x->important ? "*" : "");
    }
    printf("threshold tau = %.6g (method %s, alpha %g)\n", igrad_profile_threshold(p),
           igrad_profile_method(p), igrad_profile_alpha(p));
    printf("important: %zu of %zu components, %lld of %lld entries (%.1f%%)\n", important, n,
           (long long)important_entries, (long long)total,
           total ? 100.0 * (double)important_entries / (double)total : 0.0);
    free(e);
    free(order);
    return 0;
}

int cmd_profile(int argc, char **argv)
{
    const char *trace_path = NULL, *window = NULL, *alpha_text = NULL, *method = "knee";
    const char *out = NULL, *csv = NULL;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--quiet")) {
            quiet = 1;
            continue;
        }
        if ((r = cli_opt(argc, argv, &i, "--trace", &v)) != 0) {
            if (r < 0) return 2;
            trace_path = v;
        } else if ((r = cli_opt(argc, argv, &i, "--window", &v)) != 0) {
            if (r < 0) return 2;
            window = v;
        } else if ((r = cli_opt(argc, argv, &i, "--alpha", &v)) != 0) {
            if (r < 0) return 2;
            alpha_text = v;
        } else if ((r = cli_opt(argc, argv, &i, "--method", &v)) != 0) {
            if (r < 0) return 2;
            method = v;
        } else if ((r = cli_opt(argc, argv, &i, "--out", &v)) != 0) {
            if (r < 0) return 2;
            out = v;
        } else if ((r = cli_opt(argc, argv, &i, "--csv", &v)) != 0) {
            if (r < 0) return 2;
            csv = v;
        } else {
            fprintf(stderr, "igrad: profile: unknown argument '%s'\n\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!trace_path) {
        fprintf(stderr, "igrad: profile: --trace is required\n\n");
        usage(stderr);
        return 2;
    }
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    opts.method = method;
    if (alpha_text && cli_parse_f64("--alpha", alpha_text, &opts.alpha) != 0) return 2;
    if (window && parse_window(window, &opts.window_begin, &opts.window_end) != 0) return 2;
    if ((out && same_file(out, trace_path)) || (csv && same_file(csv, trace_path))) {
        fprintf(stderr, "igrad: profile: refusing to write over the input trace %s\n",
                trace_path);
        return 2;
    }
    if (out && csv && same_file(out, csv)) {
        fprintf(stderr, "igrad: profile: --out and --csv name the same file %s\n", out);
        return 2;
    }

    igrad_trace_t *trace = NULL;
    igrad_profile_t *profile = NULL;
    igrad_status_t st = igrad_trace_load(trace_path, &trace);
    if (st != IGRAD_OK) return cli_fail("profile", st);
    int rc = 0;
    st = igrad_profile_build(trace, &opts, &profile);
    if (st != IGRAD_OK) {
        rc = cli_fail(trace_path, st);
        goto done;
    }
    if (out && (st = igrad_profile_save_json(profile, out)) != IGRAD_OK) {
        rc = cli_fail("profile", st);
        goto done;
    }
    if (csv && (st = igrad_profile_save_csv(profile, csv)) != IGRAD_OK) {
        rc = cli_fail("profile", st);
        goto done;
    }
    if (!quiet) {
        rc = print_profile(profile, trace, trace_path);
        if (out) printf("wrote %s\n", out);
        if (csv) printf("wrote %s\n", csv);
    }
done:
    igrad_profile_free(profile);
    igrad_trace_free(trace);
    return rc;
}
