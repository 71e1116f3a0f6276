/*
 * test_safe_files.c — the library's file writing and reading against a
 * hostile directory (src/core/common.c): a symbolic link planted where the
 * old writer put its temporary ("<file>.tmp.<pid>") or at the file itself
 * must never be written through, and a FIFO given as an input file must be
 * refused at once instead of blocking the reader.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "%s", "/tmp/igrad-safe-files.XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        char p[512];
        while ((de = readdir(d)) != NULL) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
    return 0;
}

static void put(const char *path, const char *text)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static void expect_text(const char *path, const char *text)
{
    char *got = NULL;
    size_t n = 0;
    assert_int_equal(igrad__read_file(path, 1 << 20, &got, &n), IGRAD_OK);
    assert_string_equal(got, text);
    free(got);
}

static void write_atomic(const char *path, const char *text)
{
    igrad__atomic_file_t af;
    assert_int_equal(igrad__atomic_open(&af, path), IGRAD_OK);
    fputs(text, af.fp);
    assert_int_equal(igrad__atomic_commit(&af), IGRAD_OK);
}

static int count_entries(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

/* The old temporary's name, "<file>.tmp.<pid>", is a link to a victim: the
 * victim keeps its bytes and the file is a regular file with the new text. */
static void test_planted_temporary_link(void **state)
{
    (void)state;
    char victim[256], out[256], link_path[300];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(out, sizeof out, "%s/summary.json", dir);
    snprintf(link_path, sizeof link_path, "%s.tmp.%ld", out, (long)getpid());
    put(victim, "precious\n");
    assert_int_equal(symlink(victim, link_path), 0);
    write_atomic(out, "{\"ok\": 1}\n");
    expect_text(victim, "precious\n");
    expect_text(out, "{\"ok\": 1}\n");
    struct stat sb;
    assert_int_equal(lstat(out, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    assert_int_equal(lstat(link_path, &sb), 0); /* the planted link is left alone */
    assert_true(S_ISLNK(sb.st_mode));
    assert_int_equal(count_entries(), 3); /* victim, link, file: no temporary left */
}

/* A link at the file itself is replaced by the new file, not written through. */
static void test_link_at_file(void **state)
{
    (void)state;
    char victim[256], out[256];
    snprintf(victim, sizeof victim, "%s/victim2", dir);
    snprintf(out, sizeof out, "%s/profile.json", dir);
    put(victim, "precious\n");
    assert_int_equal(symlink(victim, out), 0);
    write_atomic(out, "new\n");
    expect_text(victim, "precious\n");
    struct stat sb;
    assert_int_equal(lstat(out, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    expect_text(out, "new\n");
}

/* Two private temporaries of one path get different names, and an abort
 * removes its own. */
static void test_private_names(void **state)
{
    (void)state;
    char out[256];
    snprintf(out, sizeof out, "%s/x", dir);
    char *a = NULL, *b = NULL;
    int fa = igrad__create_private(out, &a);
    int fb = igrad__create_private(out, &b);
    assert_true(fa >= 0 && fb >= 0);
    assert_string_not_equal(a, b);
    assert_int_equal(strncmp(a, out, strlen(out)), 0);
    close(fa);
    close(fb);
    unlink(a);
    unlink(b);
    free(a);
    free(b);
    igrad__atomic_file_t af;
    assert_int_equal(igrad__atomic_open(&af, out), IGRAD_OK);
    igrad__atomic_abort(&af);
    assert_int_equal(count_entries(), 0);
}

/* A FIFO with no writer: refused at once by name (the old fopen blocked
 * until a writer came; alarm() turns a hang into a failed test). */
static void test_fifo_refused(void **state)
{
    (void)state;
    char fifo[256];
    snprintf(fifo, sizeof fifo, "%s/config.json", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20);
    char *text = NULL;
    size_t n = 0;
    assert_int_equal(igrad__read_file(fifo, 1 << 20, &text, &n), IGRAD_E_IO);
    assert_non_null(strstr(igrad_last_error(), "not a regular file"));
    igrad_layout_t *layout = NULL;
    assert_int_not_equal(igrad_layout_load(fifo, &layout), IGRAD_OK);
    assert_non_null(strstr(igrad_last_error(), "not a regular file"));
    assert_int_not_equal(igrad_layout_from_safetensors(fifo, &layout), IGRAD_OK);
    assert_non_null(strstr(igrad_last_error(), "not a regular file"));
    alarm(0);
    assert_null(layout);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_planted_temporary_link, setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_at_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_private_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fifo_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
