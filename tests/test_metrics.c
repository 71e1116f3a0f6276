/*
 * test_metrics.c — the evaluation side of trainer/metrics.c: eval.csv rows
 * with task accuracy written and read back on resume (rows after the
 * resume step dropped), an older four-column eval.csv accepted on resume
 * and rewritten with task_accuracy nan / task_problems 0, a malformed row
 * refused, and the summary's final / top-level task fields.
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics.h"
#include "model.h" /* trainer_last_error */

static char g_dir[256];

static const char *eval_path(void)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, METRICS_EVAL_FILE);
    return p;
}

static char *slurp(const char *path)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    buf[n] = '\0';
    fclose(fp);
    return buf;
}

static void spit(const char *path, const char *text)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/igrad_test_metrics.XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, METRICS_CSV_FILE);
    unlink(p);
    unlink(eval_path());
    rmdir(g_dir);
    return 0;
}

static void test_task_columns_round_trip(void **state)
{
    (void)state;
    metrics_t *mt;
    assert_int_equal(metrics_open(g_dir, "dense", -1, &mt), IGRAD_OK);
    metrics_eval_t a = {0, 2.5, exp(2.5), 0.25, 0.0, 200};
    metrics_eval_t b = {40, 2.0, exp(2.0), 0.5, 0.315, 200};
    metrics_eval_t c = {80, 1.9, exp(1.9), 0.55, 0.4, 200};
    assert_int_equal(metrics_add_eval(mt, &a), IGRAD_OK);
    assert_int_equal(metrics_add_eval(mt, &b), IGRAD_OK);
    assert_int_equal(metrics_add_eval(mt, &c), IGRAD_OK);
    metrics_close(mt);
    const char *text = slurp(eval_path());
    assert_non_null(strstr(text, METRICS_EVAL_HEADER "\n0,2.5,"));
    assert_non_null(strstr(text, ",0.5,0.315,200\n"));

    /* Resume at 40: the row at 40 stays, the one at 80 goes. */
    assert_int_equal(metrics_open(g_dir, "dense", 40, &mt), IGRAD_OK);
    assert_int_equal(mt->nevals, 2);
    assert_true(mt->evals[1].task_accuracy == 0.315);
    assert_int_equal(mt->evals[1].task_problems, 200);
    cJSON *root = cJSON_CreateObject();
    assert_int_equal(metrics_summary_add(mt, 1024, root), IGRAD_OK);
    cJSON *fin = cJSON_GetObjectItem(root, "final");
    assert_true(cJSON_GetObjectItem(fin, "task_accuracy")->valuedouble == 0.315);
    assert_true(cJSON_GetObjectItem(fin, "task_problems")->valuedouble == 200);
    assert_true(cJSON_GetObjectItem(root, "task_accuracy")->valuedouble == 0.315);
    cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "eval"), 1);
    assert_int_equal(cJSON_GetArraySize(row), 6);
    cJSON_Delete(root);
    metrics_close(mt);
}

static void test_legacy_eval_csv(void **state)
{
    (void)state;
    spit(eval_path(), METRICS_EVAL_HEADER_V1 "\n0,3,20.08,0.1\n10,2.5,12.18,0.2\n20,2,7.39,0.3\n");
    metrics_t *mt;
    assert_int_equal(metrics_open(g_dir, "dense", 10, &mt), IGRAD_OK);
    assert_int_equal(mt->nevals, 2);
    assert_true(isnan(mt->evals[1].task_accuracy));
    assert_int_equal(mt->evals[1].task_problems, 0);
    metrics_eval_t e = {20, 2.1, exp(2.1), 0.3, NAN, 0};
    assert_int_equal(metrics_add_eval(mt, &e), IGRAD_OK);
    cJSON *root = cJSON_CreateObject();
    assert_int_equal(metrics_summary_add(mt, 1024, root), IGRAD_OK);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(root, "task_accuracy")));
    cJSON_Delete(root);
    metrics_close(mt);
    assert_string_equal(slurp(eval_path()), METRICS_EVAL_HEADER "\n0,3,20.08,0.1,nan,0\n"
                                            "10,2.5,12.18,0.2,nan,0\n20,2.1,8.16616991,0.3,nan,0\n");

    /* A four-field row under the new header is malformed. */
    spit(eval_path(), METRICS_EVAL_HEADER "\n0,3,20.08,0.1\n");
    assert_int_equal(metrics_open(g_dir, "dense", 10, &mt), IGRAD_E_FORMAT);
    assert_non_null(strstr(trainer_last_error(), ":2: malformed row"));
    spit(eval_path(), METRICS_EVAL_HEADER "\n0,3,20.08,0.1,0.5,2.5\n");
    assert_int_equal(metrics_open(g_dir, "dense", 10, &mt), IGRAD_E_FORMAT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_task_columns_round_trip),
        cmocka_unit_test(test_legacy_eval_csv),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
