/*
 * cmd_layout.c — `igrad layout FILE`: prints a model's parameter table
 * (name, shape, entries, layer, kind) and a per-kind summary, with --json
 * the object of igrad_layout_to_json(), with --unmapped only the tensors
 * inside numbered blocks that no name rule knows (and their share of the
 * entries); --map FILE applies user name rules first. FILE is anything
 * igrad_layout_load() reads: an HF config.json, a .safetensors file, a
 * name list, or a checkpoint directory. The parsing lives in the library.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: igrad layout [--json | --summary | --unmapped] [--map RULES] FILE\n"
            "\n"
            "Prints the trainable tensors of a model and their Transformer components.\n"
            "FILE: a Hugging Face config.json, a .safetensors checkpoint (only its header\n"
            "is read), a name list (\"name d0 d1 ...\" per line), or a directory holding\n"
            "model.safetensors or config.json.\n"
            "\n"
            "  --json     print {\"family\", \"total_numel\", \"tensors\", \"kinds\"} as JSON\n"
            "  --summary  print only the per-kind summary, not every tensor\n"
            "  --unmapped print only the tensors inside numbered blocks that no name rule\n"
            "             maps (OTHER: sent every step, never profiled or deferred) with\n"
            "             their share of the entries; exit 0 either way\n"
            "  --map RULES  user name rules, one 'PATTERN KIND LAYER' per line, tried\n"
            "             before the built-in ones (docs/formats.md)\n"
            "  -h, --help this text\n");
}

igrad_status_t cli_apply_map(const char *map_path, igrad_layout_t **layout)
{
    if (!map_path) return IGRAD_OK;
    igrad_name_map_t *map = NULL;
    igrad_layout_t *mapped = NULL;
    igrad_status_t st = igrad_name_map_load(map_path, &map);
    if (st == IGRAD_OK) st = igrad_layout_remap(*layout, map, &mapped);
    igrad_name_map_free(map);
    if (st != IGRAD_OK) return st;
    igrad_layout_free(*layout);
    *layout = mapped;
    return IGRAD_OK;
}

igrad_status_t cli_load_layout(const char *path, const char *map_path, igrad_layout_t **out)
{
    *out = NULL;
    igrad_layout_t *loaded = NULL;
    igrad_status_t st = igrad_layout_load(path, &loaded);
    if (st == IGRAD_OK) st = cli_apply_map(map_path, &loaded);
    if (st != IGRAD_OK) {
        igrad_layout_free(loaded);
        return st;
    }
    *out = loaded;
    return IGRAD_OK;
}

static void format_shape(const igrad_tensor_info_t *t, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < t->ndim && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", d ? ", " : "",
                              (long long)t->shape[d]);
    if (n < size) snprintf(buf + n, size - n, "]");
}

static int print_table(const igrad_layout_t *layout, const char *path, int summary_only)
{
    size_t count = igrad_layout_count(layout);
    int64_t total = igrad_layout_total_count(layout);
    int64_t kind_entries[IGRAD_KIND_COUNT] = {0};
    int kind_tensors[IGRAD_KIND_COUNT] = {0};
    int width = 4;
    for (size_t i = 0; i < count; i++) {
        igrad_tensor_info_t t;
        if (igrad_layout_tensor(layout, i, &t) != IGRAD_OK) return cli_fail(path, IGRAD_E_INVALID);
        int len = (int)strlen(t.name);
        if (len > width) width = len;
        kind_entries[t.kind] += t.count;
        kind_tensors[t.kind]++;
    }

    printf("# %s: family %s, %zu tensors, %lld entries, %zu components\n", path,
           igrad_layout_family(layout), count, (long long)total,
           igrad_layout_component_count(layout));
    if (!summary_only) {
        printf("%-*s  %-22s %14s %5s  %s\n", width, "name", "shape", "entries", "layer", "kind");
        for (size_t i = 0; i < count; i++) {
            igrad_tensor_info_t t;
            char shape[96];
            igrad_layout_tensor(layout, i, &t);
            format_shape(&t, shape, sizeof shape);
            char layer[16] = "-";
            if (t.layer >= 0) snprintf(layer, sizeof layer, "%d", t.layer);
            printf("%-*s  %-22s %14lld %5s  %s\n", width, t.name, shape, (long long)t.count,
                   layer, igrad_kind_name(t.kind));
        }
        printf("\n");
    }
    printf("%-6s %8s %16s %8s\n", "kind", "tensors", "entries", "share");
    for (int k = 0; k < IGRAD_KIND_COUNT; k++) {
        if (kind_tensors[k] == 0) continue;
        double share = total > 0 ? 100.0 * (double)kind_entries[k] / (double)total : 0.0;
        printf("%-6s %8d %16lld %7.2f%%\n", igrad_kind_name((igrad_kind_t)k), kind_tensors[k],
               (long long)kind_entries[k], share);
    }
    printf("%-6s %8zu %16lld %7.2f%%\n", "total", count, (long long)total, 100.0);
    return 0;
}

static int print_unmapped(const igrad_layout_t *layout, const char *path)
{
    size_t count = igrad_layout_count(layout), n = 0;
    int64_t total = igrad_layout_total_count(layout), entries = 0;
    int width = 4;
    for (size_t i = 0; i < count; i++) {
        igrad_tensor_info_t t;
        if (!igrad_layout_is_unmapped(layout, i)) continue;
        igrad_layout_tensor(layout, i, &t);
        int len = (int)strlen(t.name);
        if (len > width) width = len;
    }
    double denom = total > 0 ? (double)total : 1.0;
    for (size_t i = 0; i < count; i++) {
        igrad_tensor_info_t t;
        if (!igrad_layout_is_unmapped(layout, i)) continue;
        igrad_layout_tensor(layout, i, &t);
        if (n == 0) printf("%-*s %14s %8s\n", width, "name", "entries", "share");
        printf("%-*s %14lld %7.3f%%\n", width, t.name, (long long)t.count,
               100.0 * (double)t.count / denom);
        n++;
        entries += t.count;
    }
    printf("# %s: %zu of %zu tensors inside numbered blocks map to no component (OTHER), "
           "%lld of %lld entries (%.2f%%)\n",
           path, n, count, (long long)entries, (long long)total,
           100.0 * (double)entries / denom);
    return 0;
}

int cmd_layout(int argc, char **argv)
{
    int json = 0, summary_only = 0, unmapped = 0;
    const char *path = NULL, *map_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--summary")) {
            summary_only = 1;
        } else if (!strcmp(a, "--unmapped")) {
            unmapped = 1;
        } else if (!strcmp(a, "--map")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "igrad layout: --map needs a FILE\n");
                return 2;
            }
            map_path = argv[++i];
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "igrad layout: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (path) {
            fprintf(stderr, "igrad layout: more than one FILE ('%s', '%s')\n", path, a);
            return 2;
        } else {
            path = a;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    if (json + summary_only + unmapped > 1) {
        fprintf(stderr, "igrad layout: --json, --summary and --unmapped exclude each other\n");
        return 2;
    }

    igrad_layout_t *layout = NULL;
    igrad_status_t st = cli_load_layout(path, map_path, &layout);
    if (st != IGRAD_OK) return cli_fail("layout", st);
    int rc = 0;
    if (unmapped) {
        rc = print_unmapped(layout, path);
    } else if (json) {
        char *text = NULL;
        st = igrad_layout_to_json(layout, &text);
        if (st != IGRAD_OK) {
            rc = cli_fail("layout", st);
        } else {
            printf("%s\n", text);
            igrad_free(text);
        }
    } else {
        rc = print_table(layout, path, summary_only);
    }
    igrad_layout_free(layout);
    if (fflush(stdout) != 0) {
        perror("igrad layout: stdout");
        rc = 1;
    }
    return rc;
}
