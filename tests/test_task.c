/*
 * test_task.c — the synthetic tasks (trainer/task.c) and their data side
 * (the task: spec of trainer/data.c): spec grammar and its errors,
 * generator determinism and each kind's answer checked by an independent
 * computation here, the held-out split by problem identity (no held-out
 * problem in training, distinct test problems, prefixes), the alpaca
 * formatting of the rows and streams, independence of --seed, and the
 * exact-match metric against real greedy decoding on a tiny model trained
 * here for a few hundred steps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "data.h"
#include "model.h"
#include "optim.h"
#include "task.h"

static task_spec_t parse_ok(const char *arg)
{
    task_spec_t s;
    char msg[512] = "";
    if (task_spec_parse(arg, &s, msg, sizeof msg) != 0) fail_msg("task:%s: %s", arg, msg);
    return s;
}

static void parse_fails(const char *arg, const char *needle)
{
    task_spec_t s;
    char msg[512] = "";
    if (task_spec_parse(arg, &s, msg, sizeof msg) == 0) fail_msg("task:%s parsed", arg);
    if (!strstr(msg, needle)) fail_msg("task:%s: message '%s' lacks '%s'", arg, msg, needle);
}

static void test_spec(void **state)
{
    (void)state;
    task_spec_t s = parse_ok("mix");
    assert_int_equal(s.nkinds, TASK_NKINDS);
    assert_int_equal(s.ntrain, TASK_DEFAULT_TRAIN);
    assert_int_equal(s.ntest, TASK_DEFAULT_TEST);
    assert_int_equal(s.size, TASK_DEFAULT_SIZE);
    s = parse_ok("recall+arith:test=7:train=123:size=2");
    assert_int_equal(s.nkinds, 2);
    assert_int_equal(s.kinds[0], TASK_RECALL);
    assert_int_equal(s.kinds[1], TASK_ARITH);
    assert_int_equal(s.ntrain, 123);
    assert_int_equal(s.ntest, 7);
    assert_int_equal(s.size, 2);
    parse_fails("", "no task kinds");
    parse_fails("arith+mul", "unknown task kind 'mul'; valid: mix, arith");
    parse_fails("sort+sort", "'sort' is given twice");
    parse_fails("copy+", "unknown task kind ''");
    parse_fails("copy:tests=5", "unknown option 'tests'");
    parse_fails("copy:test", "unknown option 'test'");
    parse_fails("copy:test=0", "test=0: expected a whole number in [1, 100000]");
    parse_fails("copy:train=-3", "train=-3: expected");
    parse_fails("copy:train=12x", "train=12x: expected");
    parse_fails("copy:size=5", "size=5: expected a whole number in [1, 4]");
}

static int is_sorted_permutation(const char *in, const char *out)
{
    size_t n = strlen(in);
    if (strlen(out) != n) return 0;
    int count[256] = {0};
    for (size_t i = 0; i < n; i++) count[(unsigned char)in[i]]++, count[(unsigned char)out[i]]--;
    for (int c = 0; c < 256; c++)
        if (count[c]) return 0;
    for (size_t i = 1; i < n; i++)
        if (out[i - 1] > out[i]) return 0;
    return 1;
}

/* Each kind's answer recomputed from its input by other means. */
static void check_answer(const task_problem_t *p)
{
    size_t n = strlen(p->input);
    char expect[32] = "";
    switch (p->kind) {
    case TASK_ARITH: {
        unsigned a, b;
        char op;
        assert_int_equal(sscanf(p->input, "%u%c%u", &a, &op, &b), 3);
        assert_true(op == '+' || (op == '-' && a >= b));
        snprintf(expect, sizeof expect, "%u", op == '+' ? a + b : a - b);
        break;
    }
    case TASK_SORT:
        if (!is_sorted_permutation(p->input, p->output))
            fail_msg("sort %s -> %s", p->input, p->output);
        return;
    case TASK_REVERSE:
        for (size_t i = 0; i < n; i++) expect[i] = p->input[n - 1 - i];
        break;
    case TASK_COPY: snprintf(expect, sizeof expect, "%s", p->input); break;
    default: {
        char key;
        assert_int_equal(sscanf(p->instruction, "Give the value of %c.", &key), 1);
        char pat[4] = {key, '=', 0, 0};
        const char *at = strstr(p->input, pat);
        assert_non_null(at);
        snprintf(expect, sizeof expect, "%c", at[2]);
        assert_null(strstr(at + 1, pat)); /* keys are distinct */
        break;
    }
    }
    if (strcmp(expect, p->output) != 0)
        fail_msg("%s %s: got '%s', expected '%s'", task_kind_name(p->kind), p->input, p->output,
                 expect);
}

static void test_generators(void **state)
{
    (void)state;
    for (int size = 1; size <= 4; size++)
        for (int k = 0; k < TASK_NKINDS; k++)
            for (uint64_t i = 0; i < 300; i++) {
                task_problem_t a, b;
                task_generate((task_kind_t)k, size, i, &a);
                task_generate((task_kind_t)k, size, i, &b);
                assert_memory_equal(&a, &b, sizeof a); /* deterministic */
                check_answer(&a);
                assert_true(a.output[0] != '\0' && a.input[0] != '\0');
                /* task.h: a formatted record is at most 90 bytes */
                size_t bytes = strlen("### Instruction:\n\n\n### Input:\n\n\n### Response:\n") +
                               strlen(a.instruction) + strlen(a.input) + strlen(a.output);
                if (bytes > 90) fail_msg("%s %s: %zu bytes", a.instruction, a.input, bytes);
            }
    /* Different instances differ (not one problem repeated). */
    task_problem_t a, b;
    task_generate(TASK_REVERSE, 3, 0, &a);
    task_generate(TASK_REVERSE, 3, 1, &b);
    assert_string_not_equal(a.input, b.input);
}

static int same(const task_problem_t *a, const task_problem_t *b)
{
    return a->kind == b->kind && !strcmp(a->instruction, b->instruction) &&
           !strcmp(a->input, b->input);
}

static void test_split_disjoint(void **state)
{
    (void)state;
    task_spec_t spec = parse_ok("mix:train=3000:test=200:size=1");
    task_problem_t *train, *test, *train2, *test2;
    uint64_t ninst, ninst2;
    char msg[512];
    assert_int_equal(task_build(&spec, &train, &test, &ninst, msg, sizeof msg), 0);
    /* Brute force: no training problem is any test problem; test problems
     * are distinct and held out; kinds take turns. */
    size_t per_kind[TASK_NKINDS] = {0};
    for (size_t j = 0; j < spec.ntest; j++) {
        assert_true(task_is_held_out(&test[j]));
        per_kind[test[j].kind]++;
        for (size_t k = 0; k < j; k++)
            if (same(&test[j], &test[k])) fail_msg("test problem %zu repeats %zu", j, k);
        for (size_t i = 0; i < spec.ntrain; i++)
            if (same(&train[i], &test[j]))
                fail_msg("test problem %s/%s is training problem %zu", test[j].instruction,
                         test[j].input, i);
    }
    for (int k = 0; k < TASK_NKINDS; k++) assert_true(per_kind[k] > 0);
    for (size_t i = 0; i < spec.ntrain; i++) assert_false(task_is_held_out(&train[i]));
    assert_true(ninst > spec.ntrain + spec.ntest);

    /* Larger counts extend both sets. */
    task_spec_t bigger = spec;
    bigger.ntrain = 4000;
    bigger.ntest = 260;
    assert_int_equal(task_build(&bigger, &train2, &test2, &ninst2, msg, sizeof msg), 0);
    assert_memory_equal(train, train2, spec.ntrain * sizeof *train);
    assert_memory_equal(test, test2, spec.ntest * sizeof *test);
    free(train);
    free(test);
    free(train2);
    free(test2);

    /* A problem space too small for the test count fails, naming why. */
    task_spec_t small = parse_ok("arith:size=1:train=10:test=100");
    assert_int_equal(task_build(&small, &train, &test, &ninst, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "distinct held-out problems (of test=100)"));
    assert_null(train);
}

/* The record as data.h's alpaca template spells it. */
static void record_text(const task_problem_t *p, char *buf, size_t cap, size_t *nprompt)
{
    int n = snprintf(buf, cap, "### Instruction:\n%s\n\n### Input:\n%s\n\n### Response:\n",
                     p->instruction, p->input);
    *nprompt = (size_t)n;
    snprintf(buf + n, cap - (size_t)n, "%s", p->output);
}

static data_options_t opts(int T, uint64_t seed, int response_only)
{
    data_options_t o = DATA_OPTIONS_INIT;
    o.seq_len = T;
    o.seed = seed;
    o.response_only = response_only;
    return o;
}

static int stream_contains(const data_split_t *sp, const char *text)
{
    size_t n = strlen(text);
    for (size_t at = 0; at + n <= sp->count; at++) {
        size_t k = 0;
        while (k < n && sp->tokens[at + k] == (unsigned char)text[k]) k++;
        if (k == n) return 1;
    }
    return 0;
}

static void test_dataset(void **state)
{
    (void)state;
    const char *spec = "task:copy+recall+arith:train=400:test=40";
    dataset_t ds, ds2;
    data_error_t err;
    data_options_t o = opts(128, 1337, 1);
    if (dataset_load(&ds, spec, &o, &err) != DATA_OK) fail_msg("%s", err.message);
    assert_int_equal(ds.ntask, 40);
    assert_int_equal(ds.train.ndocs, 400);
    assert_int_equal(ds.val.ndocs, 40);
    assert_true(ds.task_seq_len > 40 && ds.task_seq_len <= 128);

    task_spec_t ts = parse_ok("copy+recall+arith:train=400:test=40");
    task_problem_t *train, *test;
    uint64_t ninst;
    char msg[512], rec[256];
    assert_int_equal(task_build(&ts, &train, &test, &ninst, msg, sizeof msg), 0);

    /* Rows: EOT, the record, EOT padding; targets only on the response and
     * the final EOT. */
    const int T = ds.task_seq_len;
    int *in = malloc(sizeof(int) * 40 * (size_t)T), *tg = malloc(sizeof(int) * 40 * (size_t)T);
    assert_int_equal(dataset_task_batch(&ds, 0, 40, T, in, tg, &err), DATA_OK);
    int longest = 0;
    for (size_t i = 0; i < 40; i++) {
        size_t np;
        record_text(&test[i], rec, sizeof rec, &np);
        int n = (int)strlen(rec);
        if (n + 1 > longest) longest = n + 1;
        const int *ri = in + i * (size_t)T, *rt = tg + i * (size_t)T;
        assert_int_equal(ri[0], DATA_EOT);
        for (int t = 0; t < T; t++) {
            int want_in = t == 0 ? DATA_EOT : t <= n ? (unsigned char)rec[t - 1] : DATA_EOT;
            int want_tg = t < (int)np || t > n ? -1 : t < n ? (unsigned char)rec[t] : DATA_EOT;
            if (ri[t] != want_in || rt[t] != want_tg)
                fail_msg("problem %zu position %d: input %d target %d, expected %d %d", i, t,
                         ri[t], rt[t], want_in, want_tg);
        }
        /* It is in validation and nowhere in training. */
        assert_true(stream_contains(&ds.val, rec));
        assert_false(stream_contains(&ds.train, rec));
    }
    assert_int_equal(longest, T);
    /* Training records in order, masked up to the response. */
    size_t np0;
    record_text(&train[0], rec, sizeof rec, &np0);
    for (size_t t = 0; t < strlen(rec); t++) {
        assert_int_equal(ds.train.tokens[t], (unsigned char)rec[t]);
        assert_int_equal(ds.train.counts[t], t >= np0);
    }
    assert_int_equal(ds.train.tokens[strlen(rec)], DATA_EOT);
    assert_int_equal(ds.train.counts[strlen(rec)], 1);

    /* Ranges and short rows are refused. */
    assert_int_equal(dataset_task_batch(&ds, 39, 2, T, in, tg, &err), DATA_E_ARG);
    assert_non_null(strstr(err.message, "outside [0, 40)"));
    assert_int_equal(dataset_task_batch(&ds, 0, 1, T - 1, in, tg, &err), DATA_E_ARG);
    assert_non_null(strstr(err.message, "shorter than the longest problem"));

    /* Another seed, another validation fraction: the same problems. */
    data_options_t o2 = opts(128, 7, 1);
    o2.val_fraction = 0.0;
    if (dataset_load(&ds2, spec, &o2, &err) != DATA_OK) fail_msg("%s", err.message);
    assert_int_equal(ds2.ntask, ds.ntask);
    assert_int_equal(ds2.val.count, ds.val.count);
    assert_memory_equal(ds2.val.tokens, ds.val.tokens, ds.val.count * sizeof *ds.val.tokens);
    assert_memory_equal(ds2.train.tokens, ds.train.tokens,
                        ds.train.count * sizeof *ds.train.tokens);
    assert_memory_equal(ds2.task_tokens, ds.task_tokens,
                        ds.task_offsets[ds.ntask] * sizeof *ds.task_tokens);
    dataset_free(&ds2);
    free(in);
    free(tg);
    free(train);
    free(test);
    dataset_free(&ds);
}

static void test_dataset_errors(void **state)
{
    (void)state;
    dataset_t ds;
    data_error_t err;
    data_options_t o = opts(128, 1, 1);
    struct {
        const char *spec;
        int status;
        const char *needle;
    } cases[] = {
        {"task:", DATA_E_ARG, "no task kinds"},
        {"task:add", DATA_E_ARG, "unknown task kind 'add'"},
        {"task:copy:train=10:test=5,task:sort", DATA_E_ARG, "more than one task: element"},
        {"task:arith:size=1:train=10:test=200", DATA_E_ARG, "too few different problems"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int st = dataset_load(&ds, cases[i].spec, &o, &err);
        if (st != cases[i].status || !strstr(err.message, cases[i].needle))
            fail_msg("%s: status %d '%s', expected %d with '%s'", cases[i].spec, st, err.message,
                     cases[i].status, cases[i].needle);
    }
    data_options_t shortT = opts(40, 1, 1);
    assert_int_equal(dataset_load(&ds, "task:recall:train=50:test=5", &shortT, &err), DATA_E_ARG);
    assert_non_null(strstr(err.message, "more than the sequence length 40"));
}

/* Teacher-forced exact match == greedy decoding, on a tiny model trained
 * here just enough to stop after short answers (so some greedy answers end
 * with EOT and some of those are right). */
static void test_metric_matches_greedy(void **state)
{
    (void)state;
    model_config_t cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), IGRAD_OK);
    cfg.max_seq_len = 128;
    model_t *m;
    assert_int_equal(model_create(&cfg, &m), IGRAD_OK);
    model_init_random(m, 7, 0.02f);
    optim_config_t oc = optim_config_default();
    oc.lr = 3e-3;
    oc.total_steps = 300;
    optim_t *opt;
    assert_int_equal(optim_create_for_model(&oc, m, &opt), IGRAD_OK);

    dataset_t ds;
    data_error_t err;
    data_options_t o = opts(96, 3, 1);
    if (dataset_load(&ds, "task:copy+recall:size=1:train=2000:test=60", &o, &err) != DATA_OK)
        fail_msg("%s", err.message);
    const int B = 8, T = 96, V = cfg.vocab_size;
    int *in = malloc(sizeof(int) * (size_t)B * T), *tg = malloc(sizeof(int) * (size_t)B * T);
    for (int64_t step = 0; step < 300; step++) {
        assert_int_equal(dataset_train_batch(&ds, step, B, 0, 1, in, tg, &err), DATA_OK);
        model_zero_grad(m);
        assert_int_equal(model_forward(m, in, tg, B, T), IGRAD_OK);
        assert_int_equal(model_backward(m), IGRAD_OK);
        optim_clip_grad_norm(m->grads, m->num_params, 1.0);
        optim_update(opt, m->params, m->grads, optim_lr(&oc, step));
    }

    const int Tt = ds.task_seq_len;
    int *row_in = malloc(sizeof(int) * (size_t)Tt), *row_tg = malloc(sizeof(int) * (size_t)Tt);
    int seq[160];
    size_t stopped = 0, solved = 0, self_checked = 0;
    for (size_t i = 0; i < ds.ntask; i++) {
        assert_int_equal(dataset_task_batch(&ds, i, 1, Tt, row_in, row_tg, &err), DATA_OK);
        /* Metric: one forward over the whole row. */
        assert_int_equal(model_forward(m, row_in, NULL, 1, Tt), IGRAD_OK);
        int exact = task_row_exact(m->acts.logits, row_tg, Tt, V);

        /* Greedy: the prompt (EOT + prompt bytes), then argmax until EOT. */
        int np = 0;
        while (row_tg[np] < 0) np++; /* first counted position = last prompt input */
        int n = np + 1, ref_end = np;
        while (ref_end < Tt && row_tg[ref_end] >= 0) ref_end++;
        memcpy(seq, row_in, sizeof(int) * (size_t)n);
        int ended = 0;
        while (n < Tt + 8 && n < (int)(sizeof seq / sizeof seq[0])) {
            assert_int_equal(model_forward(m, seq, NULL, 1, n), IGRAD_OK);
            int next = task_argmax(m->acts.logits + (size_t)(n - 1) * V, V);
            seq[n++] = next;
            if (next == DATA_EOT) {
                ended = 1;
                break;
            }
        }
        /* The greedy answer vs the reference (response bytes + EOT). */
        int greedy_right = ended && n - (np + 1) == ref_end - np;
        for (int t = np; greedy_right && t < ref_end; t++)
            greedy_right = seq[t + 1] == row_tg[t];
        if (exact != greedy_right)
            fail_msg("problem %zu: teacher-forced exact match %d, greedy decoding %s", i, exact,
                     greedy_right ? "right" : "wrong");
        solved += (size_t)exact;
        stopped += (size_t)ended;

        /* The model's own greedy answer, scored as if it were the
         * reference, must count as exact; one byte changed must not. */
        if (ended && n <= Tt) {
            int *own = malloc(sizeof(int) * (size_t)n);
            for (int t = 0; t < n - 1; t++) own[t] = t < np ? -1 : seq[t + 1];
            own[n - 1] = -1;
            assert_int_equal(model_forward(m, seq, NULL, 1, n - 1), IGRAD_OK);
            assert_int_equal(task_row_exact(m->acts.logits, own, n - 1, V), 1);
            own[np] = own[np] == 'x' ? 'y' : 'x';
            assert_int_equal(task_row_exact(m->acts.logits, own, n - 1, V), 0);
            free(own);
            self_checked++;
        }
    }
    printf("tiny model: %zu of %zu greedy answers stop, %zu right\n", stopped, ds.ntask, solved);
    assert_true(self_checked >= 5); /* the comparison saw answers that stop */

    /* Rows with nothing counted are never exact. */
    int none[4] = {-1, -1, -1, -1};
    assert_int_equal(task_row_exact(m->acts.logits, none, 4, V), 0);
    free(row_in);
    free(row_tg);
    free(in);
    free(tg);
    dataset_free(&ds);
    optim_free(opt);
    model_free(m);
}

static void test_argmax_ties(void **state)
{
    (void)state;
    float x[5] = {1, 3, 3, -1, 2};
    assert_int_equal(task_argmax(x, 5), 1);
    float logits[2 * 3] = {0, 5, 5, 9, 0, 0};
    int targets[2] = {1, 0};
    assert_int_equal(task_row_exact(logits, targets, 2, 3), 1);
    targets[0] = 2; /* a tie goes to the lower index */
    assert_int_equal(task_row_exact(logits, targets, 2, 3), 0);
}

int main(void)
{
    /* One thread: the tiny model's matrices are too small to share, and a
     * loaded machine makes spinning threads slow. */
    openblas_set_num_threads(1);
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec),
        cmocka_unit_test(test_generators),
        cmocka_unit_test(test_split_disjoint),
        cmocka_unit_test(test_dataset),
        cmocka_unit_test(test_dataset_errors),
        cmocka_unit_test(test_argmax_ties),
        cmocka_unit_test(test_metric_matches_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
