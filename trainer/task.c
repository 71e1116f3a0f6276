/*
 * task.c — the synthetic instruction tasks of task.h: the spec parser, the
 * per-instance generators, the held-out split by problem identity, and
 * the exact-match check of one teacher-forced row.
 *
 * Not here: the alpaca template and token streams (data.c), evaluation
 * (train.c). Nothing here prints or exits.
 */
#include "task.h"
#include "data.h" /* data_mix64 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const KIND_NAMES[TASK_NKINDS] = {"arith", "sort", "reverse", "copy",
                                                     "recall"};

const char *task_kind_name(task_kind_t kind)
{
    return (int)kind >= 0 && kind < TASK_NKINDS ? KIND_NAMES[kind] : NULL;
}

/* ------------------------------------------------------------------------ */
/* Spec                                                                     */
/* ------------------------------------------------------------------------ */

static int spec_fail(char *msg, size_t cap, const char *arg, const char *what)
{
    if (msg && cap) snprintf(msg, cap, "task:%s: %s", arg, what);
    return -1;
}

/* A decimal count in [lo, hi] filling all of s. */
static int parse_count(const char *s, size_t lo, size_t hi, size_t *out)
{
    if (s[0] < '0' || s[0] > '9') return -1;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi) return -1;
    *out = (size_t)v;
    return 0;
}

int task_spec_parse(const char *arg, task_spec_t *spec, char *msg, size_t cap)
{
    char buf[256], what[320];
    memset(spec, 0, sizeof *spec);
    spec->ntrain = TASK_DEFAULT_TRAIN;
    spec->ntest = TASK_DEFAULT_TEST;
    spec->size = TASK_DEFAULT_SIZE;
    if (!arg || !arg[0])
        return spec_fail(msg, cap, arg ? arg : "",
                         "no task kinds; use mix or KIND[+KIND...] with kinds arith, sort, "
                         "reverse, copy, recall");
    if (strlen(arg) >= sizeof buf) return spec_fail(msg, cap, arg, "spec too long");
    strcpy(buf, arg);
    char *opts = strchr(buf, ':');
    if (opts) *opts++ = '\0';

    if (strcmp(buf, "mix") == 0) {
        for (int k = 0; k < TASK_NKINDS; k++) spec->kinds[k] = (task_kind_t)k;
        spec->nkinds = TASK_NKINDS;
    } else {
        for (char *name = buf; name;) {
            char *plus = strchr(name, '+');
            if (plus) *plus = '\0';
            int found = -1;
            for (int k = 0; k < TASK_NKINDS; k++)
                if (strcmp(name, KIND_NAMES[k]) == 0) found = k;
            if (found < 0) {
                snprintf(what, sizeof what,
                         "unknown task kind '%.60s'; valid: mix, arith, sort, reverse, copy, "
                         "recall (joined with '+')", name);
                return spec_fail(msg, cap, arg, what);
            }
            for (int k = 0; k < spec->nkinds; k++)
                if (spec->kinds[k] == (task_kind_t)found) {
                    snprintf(what, sizeof what, "task kind '%.60s' is given twice", name);
                    return spec_fail(msg, cap, arg, what);
                }
            spec->kinds[spec->nkinds++] = (task_kind_t)found;
            name = plus ? plus + 1 : NULL;
        }
    }
    for (char *opt = opts; opt;) {
        char *colon = strchr(opt, ':');
        if (colon) *colon = '\0';
        char *eq = strchr(opt, '=');
        if (eq) *eq = '\0';
        int is_train = strcmp(opt, "train") == 0, is_test = strcmp(opt, "test") == 0,
            is_size = strcmp(opt, "size") == 0;
        if (!eq || !(is_train || is_test || is_size)) {
            snprintf(what, sizeof what, "unknown option '%.60s'; valid: train=N, test=N, size=N",
                     opt);
            return spec_fail(msg, cap, arg, what);
        }
        size_t hi = is_train ? 10000000 : is_test ? 100000 : 4, size = 0;
        size_t *dst = is_train ? &spec->ntrain : is_test ? &spec->ntest : &size;
        if (parse_count(eq + 1, 1, hi, dst) != 0) {
            snprintf(what, sizeof what, "%.60s=%.60s: expected a whole number in [1, %zu]", opt,
                     eq + 1, hi);
            return spec_fail(msg, cap, arg, what);
        }
        if (is_size) spec->size = (int)size;
        opt = colon ? colon + 1 : NULL;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Generators                                                               */
/* ------------------------------------------------------------------------ */

/* Draw k of an instance: a counter-based stream, so instances are
 * independent of each other and of the order they are generated in. */
typedef struct draw {
    uint64_t base, k;
} draw_t;

static uint64_t draw_next(draw_t *d) { return data_mix64(d->base + d->k++); }

static unsigned draw_below(draw_t *d, unsigned n) { return (unsigned)(draw_next(d) % n); }

static void random_letters(draw_t *d, char *out, unsigned n)
{
    for (unsigned i = 0; i < n; i++) out[i] = (char)('a' + draw_below(d, 26));
    out[n] = '\0';
}

static int cmp_char(const void *a, const void *b)
{
    return *(const char *)a - *(const char *)b;
}

void task_generate(task_kind_t kind, int size, uint64_t index, task_problem_t *p)
{
    const unsigned S = (unsigned)(size < 1 ? 1 : size > 4 ? 4 : size);
    unsigned range = 1;
    for (unsigned i = 0; i < S; i++) range *= 10;
    memset(p, 0, sizeof *p);
    p->kind = kind;
    draw_t d = {data_mix64(data_mix64(0x7461736bULL + (uint64_t)kind) ^ index), 0};
    switch (kind) {
    case TASK_ARITH: {
        unsigned a = draw_below(&d, range), b = draw_below(&d, range);
        int minus = (int)draw_below(&d, 2);
        if (minus && a < b) {
            unsigned t = a;
            a = b;
            b = t;
        }
        snprintf(p->instruction, sizeof p->instruction, "Calculate.");
        snprintf(p->input, sizeof p->input, "%u%c%u", a, minus ? '-' : '+', b);
        snprintf(p->output, sizeof p->output, "%u", minus ? a - b : a + b);
        break;
    }
    case TASK_SORT: {
        unsigned n = S + draw_below(&d, 3);
        random_letters(&d, p->input, n);
        memcpy(p->output, p->input, n + 1);
        qsort(p->output, n, 1, cmp_char);
        snprintf(p->instruction, sizeof p->instruction, "Sort the letters.");
        break;
    }
    case TASK_REVERSE: {
        unsigned n = S + draw_below(&d, 3);
        random_letters(&d, p->input, n);
        for (unsigned i = 0; i < n; i++) p->output[i] = p->input[n - 1 - i];
        snprintf(p->instruction, sizeof p->instruction, "Reverse the letters.");
        break;
    }
    case TASK_COPY: {
        unsigned n = S + draw_below(&d, 4);
        random_letters(&d, p->input, n);
        memcpy(p->output, p->input, n + 1);
        snprintf(p->instruction, sizeof p->instruction, "Repeat the letters.");
        break;
    }
    case TASK_RECALL:
    default: {
        char keys[5];
        unsigned vals[5], npairs = S + 1, nkeys = 0;
        while (nkeys < npairs) {
            char c = (char)('a' + draw_below(&d, 26));
            if (!memchr(keys, c, nkeys)) keys[nkeys++] = c;
        }
        for (unsigned i = 0; i < npairs; i++) vals[i] = draw_below(&d, 10);
        unsigned q = draw_below(&d, npairs);
        for (unsigned i = 0, at = 0; i < npairs; i++)
            at += (unsigned)snprintf(p->input + at, sizeof p->input - at, "%s%c=%u",
                                     i ? " " : "", keys[i], vals[i]);
        snprintf(p->instruction, sizeof p->instruction, "Give the value of %c.", keys[q]);
        snprintf(p->output, sizeof p->output, "%u", vals[q]);
        break;
    }
    }
}

/* ------------------------------------------------------------------------ */
/* Identity and the split                                                   */
/* ------------------------------------------------------------------------ */

static uint64_t hash_str(uint64_t h, const char *s)
{
    for (; *s; s++) h = data_mix64(h ^ (unsigned char)*s);
    return data_mix64(h ^ 0x100); /* the terminator: "ab"+"c" differs from "a"+"bc" */
}

uint64_t task_problem_id(const task_problem_t *p)
{
    uint64_t h = data_mix64(0x6964ULL + (uint64_t)p->kind);
    h = hash_str(h, p->instruction);
    return hash_str(h, p->input);
}

int task_is_held_out(const task_problem_t *p)
{
    return (double)(task_problem_id(p) >> 11) * 0x1.0p-53 < TASK_HOLDOUT_FRACTION;
}

static int same_problem(const task_problem_t *a, const task_problem_t *b)
{
    return a->kind == b->kind && strcmp(a->instruction, b->instruction) == 0 &&
           strcmp(a->input, b->input) == 0;
}

int task_build(const task_spec_t *spec, task_problem_t **train_out, task_problem_t **test_out,
               uint64_t *ninstances, char *msg, size_t cap)
{
    *train_out = *test_out = NULL;
    *ninstances = 0;
    size_t nslots = 16;
    while (nslots < 2 * spec->ntest) nslots *= 2;
    task_problem_t *train = malloc(spec->ntrain * sizeof *train);
    task_problem_t *test = malloc(spec->ntest * sizeof *test);
    size_t *slots = malloc(nslots * sizeof *slots); /* test index + 1, 0 = empty */
    if (!train || !test || !slots) {
        free(train);
        free(test);
        free(slots);
        if (msg && cap) snprintf(msg, cap, "task: out of memory");
        return -1;
    }
    memset(slots, 0, nslots * sizeof *slots);
    size_t ntrain = 0, ntest = 0;
    const uint64_t limit = 1000 * (uint64_t)(spec->ntrain + spec->ntest);
    uint64_t i = 0;
    for (; i < limit && (ntrain < spec->ntrain || ntest < spec->ntest); i++) {
        task_problem_t p;
        task_generate(spec->kinds[i % (uint64_t)spec->nkinds], spec->size,
                      i / (uint64_t)spec->nkinds, &p);
        uint64_t id = task_problem_id(&p);
        if ((double)(id >> 11) * 0x1.0p-53 >= TASK_HOLDOUT_FRACTION) {
            if (ntrain < spec->ntrain) train[ntrain++] = p;
            continue;
        }
        if (ntest == spec->ntest) continue;
        size_t s = (size_t)id & (nslots - 1);
        int dup = 0;
        for (; slots[s]; s = (s + 1) & (nslots - 1))
            if (same_problem(&test[slots[s] - 1], &p)) {
                dup = 1;
                break;
            }
        if (dup) continue;
        test[ntest++] = p;
        slots[s] = ntest;
    }
    free(slots);
    *ninstances = i;
    if (ntrain < spec->ntrain || ntest < spec->ntest) {
        free(train);
        free(test);
        if (msg && cap)
            snprintf(msg, cap,
                     "task: only %zu distinct held-out problems (of test=%zu) in %llu instances: "
                     "these kinds have too few different problems; lower test=",
                     ntest, spec->ntest, (unsigned long long)i);
        return -1;
    }
    *train_out = train;
    *test_out = test;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Exact match                                                              */
/* ------------------------------------------------------------------------ */

int task_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int task_row_exact(const float *logits, const int *targets, int T, int V)
{
    int counted = 0;
    for (int t = 0; t < T; t++) {
        if (targets[t] < 0) continue;
        if (task_argmax(logits + (size_t)t * (size_t)V, V) != targets[t]) return 0;
        counted = 1;
    }
    return counted;
}
