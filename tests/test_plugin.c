/*
 * test_plugin.c — the plugin loader (src/core/plugin.c, igrad__plugin_load)
 * as a program linked with libigrad.a sees it: the MPI and CUDA plugins the
 * build made are linked in and found without a file (the public entry
 * points reach them with IGRAD_PLUGIN_DIR at an empty directory); a plugin
 * that is absent, not a shared object, without its table, built from other
 * sources (libigrad_fakeabi.so, tests/plugin_fake.c) or bound to another
 * copy of libigrad (libigrad_fakecore.so, linked against libigrad.so) is
 * refused with IGRAD_E_UNSUPPORTED and a message naming the file and the
 * reason; a refusal is not remembered, a success is. The loading of the
 * real plugins by libigrad.so, with their libraries present and absent, is
 * tests/python/test_wheel_cpu.py's. The fake plugins link against the
 * internal functions libigrad.so exports for the real ones, so they exist
 * (IGRAD_TEST_FAKE_PLUGINS) in a build that has MPI or CUDA.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/plugin.h"
#include "igrad.h"
#include "test_util.h"

extern const igrad__plugin_mpi_t igrad__plugin_mpi __attribute__((weak));
extern const igrad__plugin_cuda_t igrad__plugin_cuda __attribute__((weak));

static char empty_dir[4096];

/* A fresh directory under $TMPDIR (or /tmp) named <what>-XXXXXX. */
static void temp_dir(char *dir, size_t cap, const char *what)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", what);
    assert_non_null(mkdtemp(dir));
}

#if defined(IGRAD_TEST_FAKE_PLUGINS)
static const char *fake_dir(void)
{
    static char dir[4096];
    const char *build = getenv("IGRAD_BUILD_DIR");
    snprintf(dir, sizeof dir, "%s/test_plugins", build ? build : ".");
    return dir;
}
#endif

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb");
    FILE *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
}

static igrad_status_t load(const char *name, const igrad__plugin_head_t **t)
{
    return igrad__plugin_load(name, "TESTING", "test_plugin", NULL, t);
}

/* The build's plugins are in the program: the entry points reach them with
 * no plugin file anywhere the loader looks. */
static void test_linked_in(void **state)
{
    (void)state;
    assert_int_equal(setenv("IGRAD_PLUGIN_DIR", empty_dir, 1), 0);
    const igrad__plugin_head_t *t = NULL;
#if defined(IGRAD_HAVE_MPI)
    assert_non_null(&igrad__plugin_mpi);
    assert_ok(igrad__plugin_load("mpi", "MPI", "test_plugin", &igrad__plugin_mpi.head, &t));
    assert_ptr_equal(t, &igrad__plugin_mpi.head);
    igrad_comm_t *comm = NULL;
    /* the plugin's own answer: MPI is not initialized in this program */
    assert_status(igrad_comm_create_mpi(NULL, &comm), IGRAD_E_STATE);
    assert_error_has("MPI is not initialized");
    assert_null(comm);
#endif
#if defined(IGRAD_HAVE_CUDA)
    assert_non_null(&igrad__plugin_cuda);
    assert_ok(igrad__plugin_load("cuda", "CUDA", "test_plugin", &igrad__plugin_cuda.head, &t));
    assert_ptr_equal(t, &igrad__plugin_cuda.head);
    igrad_comm_t *cc = NULL;
    assert_ok(igrad_comm_create_self_cuda(NULL, &cc)); /* no device needed */
    assert_string_equal(igrad_comm_backend(cc), "self_cuda");
    igrad_comm_free(cc);
#endif
    (void)t;
    unsetenv("IGRAD_PLUGIN_DIR");
}

static void test_absent(void **state)
{
    (void)state;
    assert_int_equal(setenv("IGRAD_PLUGIN_DIR", empty_dir, 1), 0);
    const igrad__plugin_head_t *t = (const igrad__plugin_head_t *)&t;
    assert_status(load("nosuch", &t), IGRAD_E_UNSUPPORTED);
    assert_null(t);
    assert_error_has("test_plugin: this igrad has no TESTING (it runs without TESTING): ");
    char want[4400];
    snprintf(want, sizeof want,
             "libigrad_nosuch.so is neither in %s (IGRAD_PLUGIN_DIR) nor on the library "
             "search path (libigrad_nosuch.so: cannot open shared object file",
             empty_dir);
    assert_error_has(want);
    unsetenv("IGRAD_PLUGIN_DIR");
}

/* A file that is there is the one meant: its failure is the answer. */
static void test_not_a_library(void **state)
{
    (void)state;
    char dir[4096], path[4200];
    temp_dir(dir, sizeof dir, "igrad-plugin");
    snprintf(path, sizeof path, "%s/libigrad_broken.so", dir);
    write_file(path, "not a shared object\n");
    assert_int_equal(setenv("IGRAD_PLUGIN_DIR", dir, 1), 0);
    const igrad__plugin_head_t *t = NULL;
    assert_status(load("broken", &t), IGRAD_E_UNSUPPORTED);
    char want[4400];
    snprintf(want, sizeof want, "%s could not be loaded: ", path);
    assert_error_has(want);
    /* a shared object without the table: a copy of libigrad.so */
    char core[4200], other[4200];
    const char *build = getenv("IGRAD_BUILD_DIR");
    snprintf(core, sizeof core, "%s/libigrad.so", build ? build : ".");
    snprintf(other, sizeof other, "%s/libigrad_notable.so", dir);
    copy_file(core, other);
    assert_status(load("notable", &t), IGRAD_E_UNSUPPORTED);
    snprintf(want, sizeof want, "%s has no table igrad__plugin_notable", other);
    assert_error_has(want);
    unlink(other);
    unsetenv("IGRAD_PLUGIN_DIR");
    unlink(path);
    rmdir(dir);
}

#if defined(IGRAD_TEST_FAKE_PLUGINS)

static void test_other_sources(void **state)
{
    (void)state;
    assert_int_equal(setenv("IGRAD_PLUGIN_DIR", fake_dir(), 1), 0);
    const igrad__plugin_head_t *t = NULL;
    assert_status(load("fakeabi", &t), IGRAD_E_UNSUPPORTED);
    assert_null(t);
    assert_error_has("libigrad_fakeabi.so was built from other sources than this libigrad "
                     "(ABI 0.0.0+other, libigrad's ");
    assert_error_has("use the plugins of the same build (make lib)");
    unsetenv("IGRAD_PLUGIN_DIR");
}

/* libigrad_fakecore.so binds igrad__fail in libigrad.so, which this
 * program (libigrad.a) does not use: two copies of the library would keep
 * two error states and two sets of tables. */
static void test_other_copy(void **state)
{
    (void)state;
    assert_int_equal(setenv("IGRAD_PLUGIN_DIR", fake_dir(), 1), 0);
    const igrad__plugin_head_t *t = NULL;
    for (int attempt = 0; attempt < 2; attempt++) { /* a refusal is not kept */
        assert_status(load("fakecore", &t), IGRAD_E_UNSUPPORTED);
        assert_null(t);
        assert_error_has("libigrad_fakecore.so uses another copy of libigrad (");
        assert_error_has("libigrad.so");
        assert_error_has("a program linked with libigrad.a links the plugin in "
                         "(-Wl,-u,igrad__plugin_fakecore)");
    }
    unsetenv("IGRAD_PLUGIN_DIR");
}
#endif

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(empty_dir, sizeof empty_dir, "%s/igrad-plugin-empty-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(empty_dir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linked_in),
        cmocka_unit_test(test_absent),
        cmocka_unit_test(test_not_a_library),
#if defined(IGRAD_TEST_FAKE_PLUGINS)
        cmocka_unit_test(test_other_sources),
        cmocka_unit_test(test_other_copy),
#endif
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(empty_dir);
    return failed;
}
