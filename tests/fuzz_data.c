/*
 * fuzz_data.c — fuzz target for the trainer's data readers
 * (trainer/data.h: dataset_load with "jsonl:PATH" and "alpaca:PATH",
 * prompt masking on or off, with or without a validation split). The
 * reader takes a spec, so each input is written to a per-process temporary
 * file first.
 *
 * Input: one mode byte (bit 0: alpaca: instead of jsonl:, bit 1:
 * response_only, bit 2: val_fraction 0.3, bits 3-4: seq_len 1, 2, 4 or 8),
 * then the file's bytes. With bit 5 set the bytes (up to a NUL or comma)
 * are instead the argument of a "task:" spec at seq_len 96 or 128 (bit 3);
 * specs asking for more than 2000 problems are only parsed.
 *
 * Invariants: no crash; a failure is FORMAT, EMPTY or NOMEM (never IO or
 * ARG: the file exists and the options are valid) with a message; the same
 * input twice gives the same status, message and tokens; a loaded dataset
 * has tokens < 257, each split ends with EOT, ndocs = train + val
 * documents, masks 0/1 and a train batch of step 0 and 1 whose targets are
 * tokens or -1. A JSONL document field ("text", "instruction", "input",
 * "output") holding "\u0000" that loads is issue 9's known truncation
 * (refused once the parser fix is in). A task: spec loads or fails with
 * ARG or EMPTY (too few tokens for T); a loaded one has test= exact-match rows whose targets are -1 or
 * tokens and end, after the response, with EOT.
 * The driver is tests/fuzz_main.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "task.h"

int igrad_fuzz_one(const uint8_t *data, size_t size);
const char *igrad_fuzz_name(void);
size_t igrad_fuzz_seed_count(void);
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size);
int igrad_fuzz_fixed_defect(const char *what);
int igrad_fuzz_has_u0000(const uint8_t *data, size_t size);

/* mode byte first (as a \x escape), then the file */
static const struct {
    const char *bytes;
    size_t n;
} SEEDS[] = {
#define S(x) {x, sizeof x - 1}
    S("\x00{\"text\": \"Hello world, this is the first document.\"}\n"
      "{\"text\": \"A second one\\nwith a newline and \\u00e9 \\\"quotes\\\".\"}\n\n"
      "{\"text\": \"third\", \"meta\": {\"id\": 3}}\n"),
    S("\x1c{\"text\": \"abcdefghijklmnopqrstuvwxyz\"}\r\n{\"text\": \"0123456789\"}\r\n"
      "{\"text\": \"\"}\r\n{\"text\": \"last one without newline\"}"),
    S("\x01{\"instruction\": \"Add the numbers.\", \"input\": \"2 and 3\", \"output\": \"5\"}\n"
      "{\"instruction\": \"Say hi.\", \"output\": \"hi\"}\n"
      "{\"instruction\": \"Echo.\", \"input\": \"\", \"output\": \"Echo.\"}\n"),
    S("\x0f{\"instruction\": \"Translate to French: cat\", \"input\": \"\", \"output\": "
      "\"chat\"}\n{\"instruction\": \"Count to three.\", \"output\": \"1 2 3\"}\n"
      "{\"instruction\": \"What is 2+2?\", \"input\": \"math\", \"output\": \"4\"}\n"
      "{\"instruction\": \"Name a colour.\", \"input\": null, \"output\": \"blue\"}\n"),
    S("\x02{\"instruction\": \"kind decided by the first record\", \"output\": \"alpaca\"}\n"
      "{\"text\": \"then a text record\"}\n"),
    S("\x00{\"text\": 5}\n"),
    S("\x00[1, 2, 3]\n{\"text\": \"x\"\n"),
    S("\x22mix:train=60:test=10"),
    S("\x2a" "arith+copy:size=1:train=30:test=3"),
    S("\x20recall:size=4:test=4:train=9"),
    S("\x20sort+sort"),
    S("\x20" "arith:size=1:test=300:train=5"),
#undef S
};

static char path[256], spec[300];

const char *igrad_fuzz_name(void) { return "data"; }
size_t igrad_fuzz_seed_count(void) { return sizeof SEEDS / sizeof SEEDS[0]; }
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size)
{
    *size = SEEDS[i].n;
    return (const uint8_t *)SEEDS[i].bytes;
}

/* Whether some \u0000 of the file lies in the string value of a "text",
 * "instruction", "input" or "output" key (the fields that become
 * documents); a \u0000 elsewhere (another field) may load legitimately. */
static int u0000_in_document(const uint8_t *p, size_t n)
{
    static const char *const keys[] = {"text", "instruction", "input", "output"};
    for (size_t i = 0; i + 6 <= n; i++) {
        if (!igrad_fuzz_has_u0000(p + i, 6)) continue;
        /* "\\u0000" is an escaped backslash and the text "u0000" */
        size_t esc = 0;
        while (esc < i && p[i - esc - 1] == '\\') esc++;
        if (esc % 2 != 0) continue;
        /* back to the opening quote of this string */
        size_t q = i;
        while (q > 0) {
            q--;
            if (p[q] != '"') continue;
            size_t bs = 0;
            while (q >= bs + 1 && p[q - bs - 1] == '\\') bs++;
            if (bs % 2 == 0) break;
        }
        if (p[q] != '"' || q == 0) continue;
        size_t k = q;
        while (k > 0 && (p[k - 1] == ' ' || p[k - 1] == '\t')) k--;
        if (k == 0 || p[k - 1] != ':') continue;
        k--;
        while (k > 0 && (p[k - 1] == ' ' || p[k - 1] == '\t')) k--;
        if (k == 0 || p[k - 1] != '"') continue;
        size_t end = k - 1, start = end;
        while (start > 0 && p[start - 1] != '"') start--;
        if (start == 0) continue;
        for (size_t j = 0; j < 4; j++)
            if (end - start == strlen(keys[j]) && memcmp(p + start, keys[j], end - start) == 0)
                return 1;
    }
    return 0;
}

static int check_split(const data_split_t *s, const char *name)
{
    if (s->count == 0) return 0;
    for (size_t i = 0; i < s->count; i++) {
        if (s->tokens[i] > DATA_EOT) {
            fprintf(stderr, "%s token %zu is %u\n", name, i, (unsigned)s->tokens[i]);
            return 1;
        }
        if (s->counts && s->counts[i] > 1) {
            fprintf(stderr, "%s mask %zu is %u\n", name, i, (unsigned)s->counts[i]);
            return 1;
        }
    }
    if (s->tokens[s->count - 1] != DATA_EOT) {
        fprintf(stderr, "%s does not end with EOT\n", name);
        return 1;
    }
    return 0;
}

static int check_dataset(const dataset_t *ds)
{
    if (ds->ndocs != ds->train.ndocs + ds->val.ndocs) {
        fprintf(stderr, "ndocs %zu != %zu + %zu\n", ds->ndocs, ds->train.ndocs,
                ds->val.ndocs);
        return 1;
    }
    if (check_split(&ds->train, "train") || check_split(&ds->val, "val")) return 1;
    if (ds->nwindows < 1) {
        fprintf(stderr, "a loaded dataset has no training window\n");
        return 1;
    }
    int T = ds->seq_len, G = 2;
    int *in = malloc(sizeof(int) * (size_t)(G * T)), *tg = malloc(sizeof(int) * (size_t)(G * T));
    int bad = 0;
    for (int64_t step = 0; step < 2 && in && tg && !bad; step++) {
        data_error_t err;
        if (dataset_train_batch(ds, step, G, 0, 1, in, tg, &err) != DATA_OK) {
            fprintf(stderr, "train batch %lld: %s\n", (long long)step, err.message);
            bad = 1;
            break;
        }
        for (int i = 0; i < G * T; i++)
            if (in[i] < 0 || in[i] > DATA_EOT || tg[i] < -1 || tg[i] > DATA_EOT) {
                fprintf(stderr, "batch %lld entry %d: input %d target %d\n", (long long)step,
                        i, in[i], tg[i]);
                bad = 1;
                break;
            }
    }
    free(in);
    free(tg);
    return bad;
}

/* The exact-match rows of a loaded task dataset. */
static int check_task_rows(const dataset_t *ds, size_t want)
{
    if (ds->ntask != want) {
        fprintf(stderr, "%zu task rows, test=%zu\n", ds->ntask, want);
        return 1;
    }
    int T = ds->task_seq_len, bad = 0;
    int *in = malloc(sizeof(int) * (size_t)T), *tg = malloc(sizeof(int) * (size_t)T);
    for (size_t i = 0; i < ds->ntask && in && tg && !bad; i++) {
        data_error_t err;
        if (dataset_task_batch(ds, i, 1, T, in, tg, &err) != DATA_OK) {
            fprintf(stderr, "task row %zu: %s\n", i, err.message);
            bad = 1;
            break;
        }
        int last = -1;
        for (int t = 0; t < T; t++) {
            if (in[t] < 0 || in[t] > DATA_EOT || tg[t] < -1 || tg[t] > DATA_EOT) bad = 1;
            if (tg[t] >= 0) last = t;
        }
        if (bad || last < 1 || tg[last] != DATA_EOT || tg[last - 1] < 0) {
            fprintf(stderr, "task row %zu: bad targets\n", i);
            bad = 1;
        }
    }
    free(in);
    free(tg);
    return bad;
}

static int fuzz_task(const uint8_t *data, size_t size)
{
    char arg[200];
    size_t n = 0;
    while (n + 1 < size && n + 1 < sizeof arg && data[n + 1] && data[n + 1] != ',') {
        arg[n] = (char)data[n + 1];
        n++;
    }
    arg[n] = '\0';
    task_spec_t ts;
    char msg[512];
    if (task_spec_parse(arg, &ts, msg, sizeof msg) != 0) {
        if (!msg[0]) {
            fprintf(stderr, "task:%s refused without a message\n", arg);
            return 1;
        }
        return 0;
    }
    if (ts.ntrain + ts.ntest > 2000) return 0;
    snprintf(spec, sizeof spec, "task:%s", arg);
    data_options_t opts = DATA_OPTIONS_INIT;
    opts.seq_len = data[0] & 8 ? 128 : 96;
    opts.response_only = (data[0] >> 1) & 1;
    opts.val_fraction = data[0] & 4 ? 0.3 : 0.0;
    dataset_t a, b;
    data_error_t ea, eb;
    int sa = dataset_load(&a, spec, &opts, &ea), sb = dataset_load(&b, spec, &opts, &eb);
    int bad = 0;
    if (sa != sb || strcmp(ea.message, eb.message) != 0) {
        fprintf(stderr, "%s not deterministic: %d '%s' vs %d '%s'\n", spec, sa, ea.message, sb,
                eb.message);
        bad = 1;
    } else if (sa == DATA_OK) {
        if (a.train.count != b.train.count || a.val.count != b.val.count ||
            memcmp(a.train.tokens, b.train.tokens, a.train.count * sizeof *a.train.tokens) ||
            memcmp(a.val.tokens, b.val.tokens, a.val.count * sizeof *a.val.tokens))
            bad = 1, fprintf(stderr, "%s: the token streams differ\n", spec);
        else
            bad = check_dataset(&a) || check_task_rows(&a, ts.ntest);
    } else if ((sa != DATA_E_ARG && sa != DATA_E_EMPTY) || !ea.message[0]) {
        fprintf(stderr, "%s: unexpected status %d: '%s'\n", spec, sa, ea.message);
        bad = 1;
    }
    dataset_free(&a);
    dataset_free(&b);
    return bad;
}

int igrad_fuzz_one(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    if (data[0] & 0x20) return fuzz_task(data, size);
    if (!path[0]) snprintf(path, sizeof path, "/tmp/igrad_fuzz_data.%ld.jsonl", (long)getpid());
    uint8_t mode = data[0];
    FILE *fp = fopen(path, "wb");
    if (!fp) return 0;
    if (size > 1) fwrite(data + 1, 1, size - 1, fp);
    if (fclose(fp) != 0) return 0;
    snprintf(spec, sizeof spec, "%s:%s", mode & 1 ? "alpaca" : "jsonl", path);
    static const int seq[4] = {1, 2, 4, 8};
    data_options_t opts = DATA_OPTIONS_INIT;
    opts.seq_len = seq[(mode >> 3) & 3];
    opts.response_only = (mode >> 1) & 1;
    opts.val_fraction = mode & 4 ? 0.3 : 0.0;
    opts.data_dir = "/nonexistent";

    dataset_t a, b;
    data_error_t ea, eb;
    int sa = dataset_load(&a, spec, &opts, &ea);
    int sb = dataset_load(&b, spec, &opts, &eb);
    int bad = 0;
    if (sa != sb || strcmp(ea.message, eb.message) != 0) {
        fprintf(stderr, "not deterministic: %d '%s' vs %d '%s'\n", sa, ea.message, sb,
                eb.message);
        bad = 1;
    } else if (sa == DATA_OK) {
        if (a.train.count != b.train.count || a.val.count != b.val.count ||
            memcmp(a.train.tokens, b.train.tokens, a.train.count * sizeof *a.train.tokens) ||
            (a.val.count &&
             memcmp(a.val.tokens, b.val.tokens, a.val.count * sizeof *a.val.tokens))) {
            fprintf(stderr, "not deterministic: the token streams differ\n");
            bad = 1;
        } else {
            bad = check_dataset(&a);
        }
        if (!bad && u0000_in_document(data + 1, size - 1))
            bad = igrad_fuzz_fixed_defect("a JSONL file with \\u0000 in a string loaded "
                                         "(documents are cut at the NUL)");
    } else if ((sa != DATA_E_FORMAT && sa != DATA_E_EMPTY && sa != DATA_E_NOMEM) ||
               ea.message[0] == '\0') {
        fprintf(stderr, "unexpected status %d: '%s'\n", sa, ea.message);
        bad = 1;
    }
    dataset_free(&a);
    dataset_free(&b);
    unlink(path);
    return bad;
}
