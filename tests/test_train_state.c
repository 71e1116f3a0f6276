/*
 * test_train_state.c — train_state.json on its own (trainer/train_state.h):
 * a file as docs/formats.md §10 shows it reads to every field; what the
 * writer prints reads back to the same fields (seeds and steps near 2^53
 * included, which cJSON's number printer rounded); each kind of bad input
 * (a number out of range or not an integer, a bad hex checksum, a missing
 * field, a \u0000 escape or a NUL byte, a file name too long, a file over
 * 16 MiB) fails with IGRAD_E_FORMAT and the exact message naming the file
 * and the field, and leaves the state empty; informational fields that are
 * malformed are ignored, as they always were.
 *
 * Not here: whether a run may continue a state, and the checksums against
 * the files (tests/cli/fault_checkpoint.sh, mpi_train.c).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model.h" /* trainer_last_error */
#include "train_state.h"

#define P "ck/train_state.json" /* the name messages use; nothing is opened */

/* docs/formats.md §10's example, trimmed to two files. */
static const char GOOD[] =
    "{\"format\": \"igrad-train-state\", \"version\": 2, \"step\": 10, "
    "\"sequences_consumed\": 40, \"ranks\": 2, \"data\": \"corpus\", \"batch\": 4, "
    "\"seq_len\": 32, \"seed\": 1337, \"method\": \"dense\", \"steps\": 20, "
    "\"param_hash\": \"0050659f45dbc5a5\", \"optimizer_step\": 10, \"engine_step\": 9, "
    "\"files\": {\"config.json\": {\"nbytes\": 489, \"fnv1a64\": \"1935d77028c07300\"}, "
    "\"engine.rank1.bin\": {\"nbytes\": 272, \"fnv1a64\": \"8514E9D4DBDCD9E8\"}}}";

/* GOOD with the first `from` replaced by `to` (static buffer). */
static const char *edit(const char *from, const char *to)
{
    static char buf[2048];
    const char *at = strstr(GOOD, from);
    if (!at) fail_msg("'%s' is not in the good state", from);
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - GOOD), GOOD, to, at + strlen(from));
    return buf;
}

/* Parsing text must fail with `want` and exactly the message `msg`, and
 * leave *out empty. */
static void expect_refused(const char *text, size_t n, igrad_status_t want, const char *msg)
{
    train_state_t s;
    memset(&s, 0x5a, sizeof s);
    igrad_status_t st = train_state_parse(P, text, n, &s);
    if (st != want || strcmp(trainer_last_error(), msg) != 0)
        fail_msg("status %d, message\n  '%s'\nexpected %d,\n  '%s'\ninput: %s", (int)st,
                 trainer_last_error(), (int)want, msg, text);
    assert_null(s.data);
    assert_null(s.method);
    assert_null(s.files);
    assert_int_equal(s.nfiles, 0);
    train_state_free(&s);
}

#define REFUSED(text, msg) expect_refused((text), strlen(text), IGRAD_E_FORMAT, (msg))

static void test_reads_every_field(void **state)
{
    (void)state;
    train_state_t s;
    assert_int_equal(train_state_parse(P, GOOD, strlen(GOOD), &s), IGRAD_OK);
    assert_int_equal(s.version, 2);
    assert_int_equal(s.step, 10);
    assert_int_equal(s.ranks, 2);
    assert_int_equal(s.batch, 4);
    assert_int_equal(s.seq_len, 32);
    assert_int_equal(s.seed, 1337);
    assert_string_equal(s.data, "corpus");
    assert_string_equal(s.method, "dense");
    assert_int_equal(s.param_hash, 0x0050659f45dbc5a5ULL);
    assert_true(s.has_sequences_consumed && s.has_steps && s.has_optimizer_step &&
                s.has_engine_step);
    assert_int_equal(s.sequences_consumed, 40);
    assert_int_equal(s.steps, 20);
    assert_int_equal(s.optimizer_step, 10);
    assert_int_equal(s.engine_step, 9);
    assert_int_equal(s.nfiles, 2);
    assert_string_equal(s.files[0].name, "config.json");
    assert_int_equal(s.files[0].nbytes, 489);
    assert_int_equal(s.files[0].hash, 0x1935d77028c07300ULL);
    assert_string_equal(s.files[1].name, "engine.rank1.bin");
    assert_int_equal(s.files[1].nbytes, 272);
    assert_int_equal(s.files[1].hash, 0x8514e9d4dbdcd9e8ULL); /* upper case hex */
    train_state_free(&s);
    assert_null(s.data);
    train_state_free(&s); /* twice, and NULL: no-ops */
    train_state_free(NULL);

    /* version 1: "files" is not read; informational fields may be absent */
    static const char v1[] =
        "{\"format\": \"igrad-train-state\", \"version\": 1, \"step\": 0, \"ranks\": 1, "
        "\"data\": \"\", \"batch\": 1, \"seq_len\": 1, \"seed\": \"18446744073709551615\", "
        "\"method\": \"m\", \"param_hash\": \"ffffffffffffffff\", \"files\": 7}";
    assert_int_equal(train_state_parse(P, v1, strlen(v1), &s), IGRAD_OK);
    assert_int_equal(s.version, 1);
    assert_int_equal(s.nfiles, 0);
    assert_null(s.files);
    assert_true(s.seed == UINT64_MAX);
    assert_false(s.has_steps || s.has_sequences_consumed || s.has_optimizer_step ||
                 s.has_engine_step);
    train_state_free(&s);

    /* informational fields that are malformed are ignored, not refused */
    const char *t = edit("\"steps\": 20", "\"steps\": \"twenty\", \"engine_step\": -2");
    assert_int_equal(train_state_parse(P, t, strlen(t), &s), IGRAD_OK);
    assert_false(s.has_steps);
    assert_false(s.has_engine_step); /* the first "engine_step" (-2) counts */
    assert_int_equal(s.steps, 0);
    train_state_free(&s);
    t = edit("\"engine_step\": 9", "\"engine_step\": -1");
    assert_int_equal(train_state_parse(P, t, strlen(t), &s), IGRAD_OK);
    assert_true(s.has_engine_step);
    assert_int_equal(s.engine_step, -1);
    train_state_free(&s);
}

static void assert_same_state(const train_state_t *a, const train_state_t *b)
{
    assert_int_equal(a->version, b->version);
    assert_int_equal(a->step, b->step);
    assert_int_equal(a->ranks, b->ranks);
    assert_int_equal(a->batch, b->batch);
    assert_int_equal(a->seq_len, b->seq_len);
    assert_true(a->seed == b->seed);
    assert_string_equal(a->data, b->data);
    assert_string_equal(a->method, b->method);
    assert_true(a->param_hash == b->param_hash);
    assert_int_equal(a->has_sequences_consumed, b->has_sequences_consumed);
    assert_int_equal(a->sequences_consumed, b->sequences_consumed);
    assert_int_equal(a->has_steps, b->has_steps);
    assert_int_equal(a->steps, b->steps);
    assert_int_equal(a->has_optimizer_step, b->has_optimizer_step);
    assert_int_equal(a->optimizer_step, b->optimizer_step);
    assert_int_equal(a->has_engine_step, b->has_engine_step);
    assert_int_equal(a->engine_step, b->engine_step);
    assert_int_equal(a->nfiles, b->nfiles);
    for (int i = 0; i < a->nfiles; i++) {
        assert_string_equal(a->files[i].name, b->files[i].name);
        assert_true(a->files[i].nbytes == b->files[i].nbytes);
        assert_true(a->files[i].hash == b->files[i].hash);
    }
}

static void test_write_reads_back(void **state)
{
    (void)state;
    char dir[] = "/tmp/igrad-test-train-state-XXXXXX", path[96];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/train_state.json", dir);
    train_state_file_t files[2] = {{"model.safetensors", 9007199254740992ULL, 1},
                                   {"engine.rank0.bin", 0, 0xffffffffffffffffULL}};
    /* Integers whose 15-digit rounding lies within DBL_EPSILON of them:
     * cJSON's number printer wrote 5000000000000001 as 5e+15. */
    uint64_t seeds[] = {5000000000000001ULL, 9007199254740992ULL, 9007199254740993ULL, 0};
    for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++) {
        train_state_t s = {
            .version = 2, .step = 9007199254740991LL, .ranks = 2147483647, .batch = 1,
            .seq_len = 7, .seed = seeds[k], .data = "fortunes:art\t\"x\"", .method = "dense",
            .param_hash = 0xa5a5000000000001ULL, .has_sequences_consumed = 1,
            .sequences_consumed = 4999999999999999LL, .has_steps = 1, .steps = 9007199254740992LL,
            .has_engine_step = 1, .engine_step = -1, .nfiles = 2, .files = files,
        };
        train_state_t back;
        assert_int_equal(train_state_write(path, &s), IGRAD_OK);
        if (train_state_read(path, &back) != IGRAD_OK) fail_msg("%s", trainer_last_error());
        assert_same_state(&s, &back);
        train_state_free(&back);
    }
    /* the trainer's layout of the file: "files" last, the seed a number up
     * to 2^53 and a string above */
    train_state_t s = {.version = 2, .step = 4, .ranks = 1, .batch = 4, .seq_len = 32,
                       .seed = 9007199254740993ULL, .data = "d", .method = "dense",
                       .nfiles = 2, .files = files};
    char *text = train_state_print(&s);
    assert_non_null(text);
    const char *keys[] = {"\"format\":\t\"igrad-train-state\"", "\"version\":\t2", "\"step\":\t4",
                          "\"ranks\":\t1", "\"data\":\t\"d\"", "\"batch\":\t4",
                          "\"seq_len\":\t32", "\"seed\":\t\"9007199254740993\"",
                          "\"method\":\t\"dense\"", "\"param_hash\":\t\"0000000000000000\"",
                          "\"files\":\t{", "\"nbytes\":\t9007199254740992"};
    const char *at = text;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const char *k = strstr(at, keys[i]);
        if (!k) fail_msg("'%s' missing or out of order in\n%s", keys[i], text);
        at = k;
    }
    assert_null(strstr(text, "steps")); /* informational fields left out when absent */
    assert_int_equal(text[strlen(text) - 1], '\n');
    free(text);
    unlink(path);
    rmdir(dir);
}

static void test_bad_numbers(void **state)
{
    (void)state;
    REFUSED(edit("\"ranks\": 2", "\"ranks\": 4294967298"),
            P ": \"ranks\" is 4294967298, not an integer in [1, 2147483647]");
    REFUSED(edit("\"step\": 10", "\"step\": 1e300"),
            P ": \"step\" is 1.0000000000000001e+300, not an integer in [0, 9007199254740992]");
    REFUSED(edit("\"step\": 10", "\"step\": 9007199254740994"),
            P ": \"step\" is 9007199254740994, not an integer in [0, 9007199254740992]");
    REFUSED(edit("\"step\": 10", "\"step\": -1"),
            P ": \"step\" is -1, not an integer in [0, 9007199254740992]");
    REFUSED(edit("\"batch\": 4", "\"batch\": 2.5"),
            P ": \"batch\" is 2.5, not an integer in [1, 2147483647]");
    REFUSED(edit("\"seq_len\": 32", "\"seq_len\": 0"),
            P ": \"seq_len\" is 0, not an integer in [1, 2147483647]");
    REFUSED(edit("\"version\": 2", "\"version\": 3"),
            P ": \"version\" is 3, not an integer in [1, 2]");
    REFUSED(edit("\"ranks\": 2", "\"ranks\": \"2\""), P ": \"ranks\" is missing or not a number");
    static const char *const seeds[] = {"-1", "1.5", "1e300", "\"12a\"", "\" 1\"", "\"\"",
                                        "\"18446744073709551616\"", "\"-1\"", "null"};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char to[64];
        snprintf(to, sizeof to, "\"seed\": %s", seeds[i]);
        REFUSED(edit("\"seed\": 1337", to),
                P ": \"seed\" is not an integer in [0, 2^53] or a decimal string");
    }
    REFUSED(edit("\"nbytes\": 489", "\"nbytes\": -1"),
            P ": \"files.config.json.nbytes\" is not an integer in [0, 2^53]");
    REFUSED(edit("\"nbytes\": 272", "\"nbytes\": 9007199254740994"),
            P ": \"files.engine.rank1.bin.nbytes\" is not an integer in [0, 2^53]");
}

static void test_bad_hex(void **state)
{
    (void)state;
    static const char *const hashes[] = {"0050659f45dbc5a", "0050659f45dbc5a55",
                                         "0050659f45dbc5ag", "0x50659f45dbc5a5", ""};
    for (size_t i = 0; i < sizeof hashes / sizeof hashes[0]; i++) {
        char to[64];
        snprintf(to, sizeof to, "\"param_hash\": \"%s\"", hashes[i]);
        REFUSED(edit("\"param_hash\": \"0050659f45dbc5a5\"", to),
                P ": \"data\", \"method\" or \"param_hash\" (16 hex digits) is missing or "
                  "malformed");
    }
    REFUSED(edit("\"1935d77028c07300\"", "\"1935d77028c0730\""),
            P ": files.\"config.json\" needs \"nbytes\" and \"fnv1a64\" (16 hex digits)");
    REFUSED(edit("\"8514E9D4DBDCD9E8\"", "\"8514E9D4DBDCD9E8 \""),
            P ": files.\"engine.rank1.bin\" needs \"nbytes\" and \"fnv1a64\" (16 hex digits)");
}

static void test_missing_fields(void **state)
{
    (void)state;
    REFUSED(edit("\"batch\": 4, ", ""), P ": \"batch\" is missing or not a number");
    REFUSED(edit("\"format\": \"igrad-train-state\", ", ""),
            P ": \"format\" is not \"igrad-train-state\"");
    REFUSED(edit("\"igrad-train-state\"", "\"igrad-train-stat\""),
            P ": \"format\" is not \"igrad-train-state\"");
    REFUSED(edit("\"seed\": 1337, ", ""),
            P ": \"seed\" is not an integer in [0, 2^53] or a decimal string");
    REFUSED(edit("\"data\": \"corpus\", ", ""),
            P ": \"data\", \"method\" or \"param_hash\" (16 hex digits) is missing or malformed");
    REFUSED(edit("\"method\": \"dense\"", "\"method\": 1"),
            P ": \"data\", \"method\" or \"param_hash\" (16 hex digits) is missing or malformed");
    REFUSED(edit("\"files\":", "\"filez\":"), P ": \"files\" is missing or not an object");
    REFUSED(edit("\"nbytes\": 489, ", ""),
            P ": \"files.config.json.nbytes\" is not an integer in [0, 2^53]");
    REFUSED(edit("\"config.json\": {", "\"config.json\": [{"),
            P ": not a valid JSON object"); /* unbalanced */
    REFUSED(edit("{\"nbytes\": 489, \"fnv1a64\": \"1935d77028c07300\"}", "[]"),
            P ": files.\"config.json\" needs \"nbytes\" and \"fnv1a64\" (16 hex digits)");
    /* a file name of 64 bytes is refused, 63 are read */
    char name[80], to[96], msg[200];
    memset(name, 'n', 64);
    name[64] = '\0';
    snprintf(to, sizeof to, "\"%s\"", name);
    snprintf(msg, sizeof msg,
             P ": files.\"%s\" needs \"nbytes\" and \"fnv1a64\" (16 hex digits)", name);
    REFUSED(edit("\"config.json\"", to), msg);
    snprintf(to, sizeof to, "\"%s\"", name + 1);
    train_state_t s;
    const char *t = edit("\"config.json\"", to);
    assert_int_equal(train_state_parse(P, t, strlen(t), &s), IGRAD_OK);
    assert_string_equal(s.files[0].name, name + 1);
    train_state_free(&s);
    REFUSED("[]", P ": not a valid JSON object");
    REFUSED("", P ": not a valid JSON object");
}

static void test_nul(void **state)
{
    (void)state;
    REFUSED(edit("\"corpus\"", "\"cor\\u0000pus\""),
            P ": train state 1:109: string \"cor\\u0000...\" holds \\u0000 (a NUL character), "
              "which names and values cannot contain");
    REFUSED(edit("\"config.json\"", "\"config\\u0000.json\""),
            P ": train state 1:279: string \"config\\u0000...\" holds \\u0000 (a NUL character), "
              "which names and values cannot contain");
    /* an escaped backslash before u0000 is text */
    train_state_t s;
    const char *t = edit("\"corpus\"", "\"C:\\\\u0000\"");
    assert_int_equal(train_state_parse(P, t, strlen(t), &s), IGRAD_OK);
    assert_string_equal(s.data, "C:\\u0000");
    train_state_free(&s);
    /* a NUL byte: cJSON would end "corpus" there, or skip it as white space */
    char raw[2048];
    size_t n = strlen(GOOD);
    memcpy(raw, GOOD, n + 1);
    char *at = strstr(raw, "corpus") + 3;
    *at = '\0';
    expect_refused(raw, n, IGRAD_E_FORMAT,
                   P ": train state 1:109: NUL byte, which a JSON text cannot hold");
    *at = 'p';
    at = strstr(raw, "\"ranks\":") + 8;
    *at = '\0';
    expect_refused(raw, n, IGRAD_E_FORMAT,
                   P ": train state 1:93: NUL byte, which a JSON text cannot hold");
    /* after the object too: no writer puts one there */
    *at = ' ';
    raw[n] = '\0';
    expect_refused(raw, n + 1, IGRAD_E_FORMAT,
                   P ": train state 1:403: NUL byte, which a JSON text cannot hold");
}

static void test_files_on_disk(void **state)
{
    (void)state;
    char dir[] = "/tmp/igrad-test-train-state-XXXXXX", path[96], msg[200];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/train_state.json", dir);
    train_state_t s;
    assert_int_equal(train_state_read(path, &s), IGRAD_E_IO);
    snprintf(msg, sizeof msg, "%s: No such file or directory", path);
    assert_string_equal(trainer_last_error(), msg);
    /* over 16 MiB: refused before it is read, and by the parser alike */
    size_t big = (size_t)TRAIN_STATE_MAX_NBYTES + 1;
    char *text = malloc(big);
    assert_non_null(text);
    memset(text, ' ', big);
    memcpy(text, GOOD, strlen(GOOD));
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(text, 1, big, fp), big);
    assert_int_equal(fclose(fp), 0);
    assert_int_equal(train_state_read(path, &s), IGRAD_E_FORMAT);
    snprintf(msg, sizeof msg, "%s: larger than 16 MiB (or unreadable)", path);
    assert_string_equal(trainer_last_error(), msg);
    expect_refused(text, big, IGRAD_E_FORMAT, P ": larger than 16 MiB (or unreadable)");
    /* 16 MiB exactly is read */
    assert_int_equal(truncate(path, (off_t)big - 1), 0);
    if (train_state_read(path, &s) != IGRAD_OK) fail_msg("%s", trainer_last_error());
    assert_int_equal(s.nfiles, 2);
    train_state_free(&s);
    free(text);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_every_field), cmocka_unit_test(test_write_reads_back),
        cmocka_unit_test(test_bad_numbers),       cmocka_unit_test(test_bad_hex),
        cmocka_unit_test(test_missing_fields),    cmocka_unit_test(test_nul),
        cmocka_unit_test(test_files_on_disk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
