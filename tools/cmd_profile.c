/*
 * cmd_profile.c — `igrad profile`: reads an activity trace CSV, builds the
 * importance profile over a window of steps, prints the components ranked
 * by score with the threshold and the important share, and writes the
 * profile JSON (and optionally the reference CSV). With --target-ratio X
 * (and the model's --layout) the important set and kappa come from
 * igrad_target_fit, the engine's own budget-driven choice: the profile is
 * re-marked at its threshold and the JSON gains a "target" object (kappa
 * and the planned ratio; readers ignore it); --map FILE remaps --layout by
 * user name rules first (the trace's hash then covers them). All computation lives in the
 * library (src/profile.c, src/partition.c, src/target.c); this file only
 * parses arguments and prints.
 */
#define _POSIX_C_SOURCE 200809L /* stat */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "core/internal.h" /* igrad__atomic_* */

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: igrad profile --trace TRACE.csv [--window A:B] [--alpha 0.7]\n"
            "                     [--method knee] [--out profile.json] [--csv profile.csv]\n"
            "                     [--target-ratio X --layout MODEL [--map FILE]\n"
            "                      [--release-period R]] [--quiet]\n"
            "\n"
            "Scores each (layer, kind) component of an activity trace over a window of\n"
            "steps (magnitude and persistence of the retained gradient), splits them into\n"
            "important and low-importance by a threshold, and writes the profile.\n"
            "\n"
            "  --trace F    trace CSV: igrad's (step,layer,component,raw_activity,\n"
            "               d_activity,numel,retained_numel; v2 as igrad_trace_save()\n"
            "               writes it, or v1) or the reference method's\n"
            "               component_activity_trace.csv as its scripts write it\n"
            "  --window W   steps A <= s < B: 'A:B', 'A:' (to the end), ':B' (from the\n"
            "               start); default: all steps\n"
            "  --alpha X    weight of magnitude in the score, in [0, 1] (default 0.7)\n"
            "  --method M   knee (default), otsu, kmeans2, gmm2, percentile:P (P in\n"
            "               [0, 100]) or fixed:F (top fraction F in (0, 1])\n"
            "  --out F      write the profile JSON (the engine's input)\n"
            "  --csv F      also write layer,component,final_score,global_tau,is_important\n"
            "  --target-ratio X  choose the important set and kappa so that ig sends at most\n"
            "               X (in (0, 1]) times the sparsifier's *_sync payload per step\n"
            "               (igrad_target_fit, as igrad train --target-ratio does): the\n"
            "               threshold becomes the chosen one, the choice is printed and\n"
            "               --out's JSON gets a \"target\" object (tau, release_keep = kappa,\n"
            "               n_important, f_imp, planned and model ratio, met)\n"
            "  --layout M   the model (anything `igrad layout` reads: HF config.json,\n"
            "               .safetensors, a checkpoint directory); needed by --target-ratio\n"
            "  --map FILE   user name rules ('PATTERN KIND LAYER' per line, tried before\n"
            "               the built-in ones; docs/formats.md), applied to --layout: give\n"
            "               the rules the trace was recorded with (igrad train --map), as\n"
            "               the layout hash covers them\n"
            "  --release-period R  R of the plan priced by --target-ratio (default 4)\n"
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

/* --target-ratio: what igrad_target_fit chose, for the printout and the
 * JSON. */
typedef struct target_choice {
    double ratio;
    int release_period;
    igrad_target_fit_t fit;
} target_choice_t;

/* @return 0, or 1 after printing why not. */
static int fit_target(igrad_profile_t *profile, const char *layout_path, const char *map_path,
                      target_choice_t *tc)
{
    igrad_layout_t *layout = NULL;
    igrad_status_t st = igrad_layout_load(layout_path, &layout);
    if (st != IGRAD_OK) return cli_fail("profile: --layout", st);
    if ((st = cli_apply_map(map_path, &layout)) != IGRAD_OK) {
        igrad_layout_free(layout);
        return cli_fail("profile: --map", st);
    }
    int rc = 1;
    uint64_t ph = igrad_profile_layout_hash(profile);
    igrad_config_t cfg = IGRAD_CONFIG_INIT;
    cfg.method = IGRAD_METHOD_IG;
    cfg.release_period = tc->release_period;
    cfg.density = igrad_profile_density(profile);
    if (ph != 0 && ph != igrad_layout_hash(layout)) {
        fprintf(stderr, "igrad: profile: --layout %s is not the model of the trace (layout "
                        "hash 0x%016llx, the trace's 0x%016llx)\n",
                layout_path, (unsigned long long)igrad_layout_hash(layout),
                (unsigned long long)ph);
    } else if (igrad_sparsifier_from_name(igrad_profile_sparsifier(profile), &cfg.sparsifier) !=
                   IGRAD_OK ||
               !(cfg.density > 0.0)) {
        fprintf(stderr, "igrad: profile: --target-ratio prices the trace's sparsifier and "
                        "density, but the trace names none ('%s', %g): record it with igrad "
                        "train --trace\n",
                igrad_profile_sparsifier(profile), cfg.density);
    } else {
        st = igrad_target_fit(layout, profile, &cfg, tc->ratio, IGRAD_TARGET_MIN_KEEP,
                              &tc->fit);
        if (st == IGRAD_OK) st = igrad_profile_set_threshold(profile, tc->fit.tau);
        rc = st == IGRAD_OK ? 0 : cli_fail("profile: --target-ratio", st);
    }
    igrad_layout_free(layout);
    return rc;
}

/* Appends the "target" object to the profile JSON at `path`, as text (the
 * numbers as %.17g), before the final '}'. */
static int write_target(const char *path, const target_choice_t *tc)
{
    FILE *fp = fopen(path, "rb");
    char *text = NULL;
    long n = -1;
    if (fp && fseek(fp, 0, SEEK_END) == 0 && (n = ftell(fp)) > 0 && fseek(fp, 0, SEEK_SET) == 0 &&
        (text = malloc((size_t)n + 1)) && fread(text, 1, (size_t)n, fp) == (size_t)n)
        text[n] = '\0';
    else
        n = -1;
    if (fp) fclose(fp);
    char *end = n > 0 ? strrchr(text, '}') : NULL;
    if (!end) {
        free(text);
        fprintf(stderr, "igrad: profile: cannot read back %s to add the target\n", path);
        return 1;
    }
    while (end > text && (end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t')) end--;
    *end = '\0';
    const igrad_target_fit_t *f = &tc->fit;
    igrad__atomic_file_t af; /* a private temporary renamed over path: no link followed */
    fp = igrad__atomic_open(&af, path) == IGRAD_OK ? af.fp : NULL;
    int ok = fp && fprintf(fp,
                           "%s,\n\t\"target\":\t{\n\t\t\"ratio\":\t%.17g,\n"
                           "\t\t\"release_period\":\t%d,\n"
                           "\t\t\"tau\":\t%.17g,\n\t\t\"release_keep\":\t%.17g,\n"
                           "\t\t\"n_important\":\t%zu,\n\t\t\"n_gated\":\t%zu,\n"
                           "\t\t\"f_imp\":\t%.17g,\n\t\t\"planned_ratio\":\t%.17g,\n"
                           "\t\t\"model_ratio\":\t%.17g,\n\t\t\"met\":\t%s\n\t}\n}\n",
                           text, tc->ratio, tc->release_period, f->tau, f->release_keep,
                           f->n_important, f->n_gated, f->f_imp, f->ratio, f->model_ratio,
                           f->met ? "true" : "false") > 0;
    if (fp && ok) ok = igrad__atomic_commit(&af) == IGRAD_OK;
    else if (fp) igrad__atomic_abort(&af);
    free(text);
    if (!ok) {
        fprintf(stderr, "igrad: profile: writing %s failed\n", path);
        return 1;
    }
    return 0;
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
        printf("# layout hash unknown (no '# igrad-trace' line in the trace, or the "
               "reference method's file): the profile can only be checked against a model's "
               "components\n");
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
    const char *out = NULL, *csv = NULL, *layout_path = NULL, *target_text = NULL;
    const char *map_path = NULL;
    target_choice_t tc = {.release_period = IGRAD_DEFAULT_RELEASE_PERIOD};
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
        } else if ((r = cli_opt(argc, argv, &i, "--target-ratio", &v)) != 0) {
            if (r < 0) return 2;
            target_text = v;
        } else if ((r = cli_opt(argc, argv, &i, "--layout", &v)) != 0) {
            if (r < 0) return 2;
            layout_path = v;
        } else if ((r = cli_opt(argc, argv, &i, "--map", &v)) != 0) {
            if (r < 0) return 2;
            map_path = v;
        } else if ((r = cli_opt(argc, argv, &i, "--release-period", &v)) != 0) {
            int64_t rp = 0;
            if (r < 0 || cli_parse_i64("--release-period", v, &rp) != 0) return 2;
            if (rp < 1 || rp > 1000000) {
                fprintf(stderr, "igrad: --release-period %lld must be in [1, 1000000]\n",
                        (long long)rp);
                return 2;
            }
            tc.release_period = (int)rp;
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
    if (target_text) {
        if (cli_parse_f64("--target-ratio", target_text, &tc.ratio) != 0) return 2;
        if (!(tc.ratio > 0.0 && tc.ratio <= 1.0)) {
            fprintf(stderr, "igrad: --target-ratio %s must be in (0, 1]\n", target_text);
            return 2;
        }
        if (!layout_path) {
            fprintf(stderr, "igrad: profile: --target-ratio needs --layout MODEL (the tensor "
                            "shapes price the plan)\n");
            return 2;
        }
    } else if (layout_path) {
        fprintf(stderr, "igrad: profile: --layout is only used with --target-ratio\n");
        return 2;
    }
    if (map_path && !layout_path) {
        fprintf(stderr, "igrad: profile: --map applies to --layout (with --target-ratio); a "
                        "trace's components were mapped when it was recorded\n");
        return 2;
    }
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
    if (target_text && (rc = fit_target(profile, layout_path, map_path, &tc)) != 0) goto done;
    if (out && (st = igrad_profile_save_json(profile, out)) != IGRAD_OK) {
        rc = cli_fail("profile", st);
        goto done;
    }
    if (out && target_text && write_target(out, &tc) != 0) {
        rc = 1;
        goto done;
    }
    if (csv && (st = igrad_profile_save_csv(profile, csv)) != IGRAD_OK) {
        rc = cli_fail("profile", st);
        goto done;
    }
    if (!quiet) {
        rc = print_profile(profile, trace, trace_path);
        if (target_text) {
            const igrad_target_fit_t *f = &tc.fit;
            printf("target ratio %g (R %d): %zu of %zu gated components "
                   "important (tau %.6g), kappa %.6g, f_imp %.4f, planned ratio %.4f (model "
                   "%.4f)%s\n",
                   tc.ratio, tc.release_period, f->n_important,
                   f->n_gated, f->tau, f->release_keep, f->f_imp, f->ratio, f->model_ratio,
                   f->met ? "" : ": NOT met, even no important component at the smallest kappa");
        }
        if (out) printf("wrote %s\n", out);
        if (csv) printf("wrote %s\n", csv);
    }
done:
    igrad_profile_free(profile);
    igrad_trace_free(trace);
    return rc;
}
