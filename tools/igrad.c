/*
 * igrad.c — the igrad command line: dispatches to the subcommands in
 * tools/cmd_*.c and holds the argument helpers they share (cli.h).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: igrad <command> [options]   (igrad <command> --help for details)\n"
            "\n"
            "commands:\n"
            "  layout FILE            print a model's parameter table and components\n"
            "                         (HF config.json, .safetensors, or a name list)\n"
            "  profile --trace F ...  build an importance profile from an activity trace\n"
            "  bench select           fused error-feedback top-k vs a streaming pass\n"
            "  bench sync             sync methods over MPI on a model layout\n"
            "  train                  reference LLaMA-style trainer (under mpirun)\n"
            "  model init|eval|bench  the trainer's model: create, check, time\n"
            "  plan --config F ...    exact bytes per step and projected sync/step time\n"
            "                         for P ranks (no run, no gradients)\n"
            "  version                print the library version\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("igrad %s\n", igrad_version_string());
        return 0;
    }
    if (!strcmp(cmd, "layout")) return cmd_layout(argc - 1, argv + 1);
    if (!strcmp(cmd, "profile")) return cmd_profile(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "model")) return cmd_model(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 1, argv + 1);
    fprintf(stderr, "igrad: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}

int cli_opt(int argc, char **argv, int *i, const char *name, const char **value)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return 0;
    if (arg[n] == '=') {
        *value = arg + n + 1;
        return 1;
    }
    if (arg[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "igrad: %s needs a value\n", name);
        return -1;
    }
    *i += 1;
    *value = argv[*i];
    return 1;
}

int cli_parse_i64(const char *name, const char *text, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end != '\0') {
        fprintf(stderr, "igrad: %s: '%s' is not an integer\n", name, text);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

int cli_parse_f64(const char *name, const char *text, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end != '\0' || !isfinite(v)) {
        fprintf(stderr, "igrad: %s: '%s' is not a finite number\n", name, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_onoff(const char *name, const char *text, int *out)
{
    if (!strcmp(text, "on") || !strcmp(text, "off")) {
        *out = text[1] == 'n';
        return 0;
    }
    fprintf(stderr, "igrad: %s is '%s' (on or off)\n", name, text);
    return -1;
}

int cli_parse_value_dtype(const char *name, const char *text, igrad_dtype_t *out)
{
    static const struct {
        const char *name;
        igrad_dtype_t dtype;
    } names[] = {{"f32", IGRAD_DTYPE_F32},
                 {"bf16", IGRAD_DTYPE_BF16},
                 {"fp16", IGRAD_DTYPE_F16},
                 {"f16", IGRAD_DTYPE_F16},
                 {"fp8", IGRAD_DTYPE_F8_E4M3},
                 {"f8_e4m3", IGRAD_DTYPE_F8_E4M3}};
    char low[8] = "";
    for (size_t k = 0; text[k] && k + 1 < sizeof low; k++)
        low[k] = (char)tolower((unsigned char)text[k]);
    for (size_t k = 0; strlen(text) < sizeof low && k < sizeof names / sizeof names[0]; k++)
        if (!strcmp(low, names[k].name)) {
            *out = names[k].dtype;
            return 0;
        }
    fprintf(stderr, "igrad: %s is '%s' (f32, bf16, fp16 or fp8)\n", name, text);
    return -1;
}

int cli_fail(const char *what, igrad_status_t st)
{
    fprintf(stderr, "igrad: %s: %s (%s)\n", what, igrad_last_error(), igrad_status_str(st));
    return 1;
}

const char *cli_human_bytes(double nbytes, char *buf, int size)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (nbytes >= 1024.0 && u < 4) {
        nbytes /= 1024.0;
        u++;
    }
    snprintf(buf, (size_t)size, u ? "%.1f %s" : "%.0f %s", nbytes, units[u]);
    return buf;
}
