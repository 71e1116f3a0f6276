/*
 * test_engine_state.c — the engine state loader (src/engine_state.c) on the
 * one-rank "self" communicator, against files edited here byte by byte:
 * the checksum is recomputed by an FNV-1a written from docs/formats.md §7
 * (not from the library), so a file can be wrong in one field only.
 * Covered: a bad checksum or a refused file leaves the residuals
 * bit-identical; the header's duplicated fields (step, call count and
 * risk-history hash copies in the items), a negative verify_every and
 * non-zero residual padding are refused by name; truncated files and
 * trailing bytes are refused; and the file is read exactly once (a FIFO
 * that would hand a second reader other bytes); residual and velocity
 * sections larger than the saver's copy chunk are the engine's floats.
 *
 * Not here: save/load mid-run = uninterrupted, mismatched configs and
 * profiles (test_engine.c), several ranks (mpi_engine.c).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, mkfifo */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "igrad.h"
#include "test_util.h"

/* ---- the file format, from docs/formats.md §7 ---------------------------- */

enum {
    OFF_ITEMS = 24,
    ITEM_VERIFY_EVERY = 16,
    ITEM_STEP = 22,
    ITEM_CALLS = 23,
    ITEM_HISTORY = 24,
    OFF_STEP = 24 + 8 * ITEM_STEP,
    OFF_CALLS = 24 + 8 * ITEM_CALLS,
    NITEMS = 42,
    OFF_RESIDUALS = 24 + 8 * NITEMS + 32,
};

static uint64_t fnv_words(const unsigned char *p, size_t nbytes)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i + 8 <= nbytes; i += 8) {
        uint64_t w = 0;
        for (int b = 7; b >= 0; b--) w = (w << 8) | p[i + (size_t)b];
        h ^= w;
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int b = 0; b < 8; b++) p[b] = (unsigned char)(v >> (8 * b));
}

static uint64_t get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--) v = (v << 8) | p[b];
    return v;
}

static void fix_checksum(unsigned char *p, size_t nbytes)
{
    put_le64(p + nbytes - 8, fnv_words(p, nbytes - 8));
}

/* ---- fixture ------------------------------------------------------------ */

/* Two tensors of 72 and 5 entries: 77 residuals, odd, so the file has the
 * 4-byte padding; risk packing with small blocks, so it has a history. */
#define NTENSORS 2
static const int64_t counts[NTENSORS] = {72, 5};

typedef struct fixture {
    char dir[256], path[512];
    igrad_layout_t *layout;
    igrad_comm_t *comm;
    igrad_config_t cfg;
    igrad_engine_t *loader;      /* gets the files; its residuals differ from the file's */
    float before[77];            /* loader's residuals before any load */
    unsigned char *file;         /* a good state file */
    size_t nbytes;
    size_t off_history;          /* offset of the history count */
    uint64_t hist_count;
} fixture_t;

static void run_steps(igrad_engine_t *e, int64_t from, int64_t to, float scale)
{
    float g0[72], g1[5];
    float *g[NTENSORS] = {g0, g1};
    for (int64_t s = from; s < to; s++) {
        for (int i = 0; i < 72; i++) g0[i] = scale * (float)((i * 37 + s * 11) % 23 - 11);
        for (int i = 0; i < 5; i++) g1[i] = scale * (float)(i + 1) * (s % 2 ? -1.f : 1.f);
        assert_ok(igrad_engine_sync(e, s, g));
    }
}

static void residuals_of(const igrad_engine_t *e, float *out)
{
    size_t k = 0;
    for (size_t t = 0; t < NTENSORS; t++) {
        const float *r = igrad_engine_residual(e, t);
        assert_non_null(r);
        memcpy(out + k, r, (size_t)counts[t] * sizeof *r);
        k += (size_t)counts[t];
    }
}

static void assert_residuals_are(const igrad_engine_t *e, const float *want, const char *what)
{
    float now[77];
    residuals_of(e, now);
    if (memcmp(now, want, sizeof now) != 0) {
        for (int i = 0; i < 77; i++)
            if (memcmp(&now[i], &want[i], sizeof *now) != 0) {
                print_error("%s: residual %d is %.9g, expected %.9g\n", what, i,
                            (double)now[i], (double)want[i]);
                break;
            }
        fail();
    }
}

static void write_file(const char *path, const unsigned char *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(p, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/igrad_test_engine_state_XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/engine.rank0.bin", f->dir);
    int64_t s0[2] = {8, 9}, s1[1] = {5};
    if (igrad_layout_create(&f->layout) != IGRAD_OK ||
        igrad_layout_add(f->layout, "model.layers.0.mlp.up_proj.weight", IGRAD_DTYPE_F32, 2,
                         s0) != IGRAD_OK ||
        igrad_layout_add(f->layout, "model.norm.weight", IGRAD_DTYPE_F32, 1, s1) != IGRAD_OK ||
        igrad_comm_create_self(&f->comm) != IGRAD_OK)
        return -1;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.density = 0.2;
    c.pack = IGRAD_PACK_RISK;
    c.block_entries = 4;
    c.buckets = 2;
    f->cfg = c;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    igrad_engine_free(f->loader);
    igrad_layout_free(f->layout);
    igrad_comm_free(f->comm);
    free(f->file);
    unlink(f->path);
    rmdir(f->dir);
    free(f);
    return 0;
}

/* Saves a state after 6 steps (the good file), and builds the loader: the
 * same engine after 3 steps of other gradients. */
static void make_files(fixture_t *f)
{
    igrad_engine_t *a = NULL;
    assert_ok(igrad_engine_create(f->layout, NULL, &f->cfg, f->comm, &a));
    run_steps(a, 0, 6, 1.0f);
    assert_ok(igrad_engine_save_state(a, f->path));
    igrad_engine_free(a);
    FILE *fp = fopen(f->path, "rb");
    assert_non_null(fp);
    f->file = malloc(1 << 16);
    assert_non_null(f->file);
    f->nbytes = fread(f->file, 1, 1 << 16, fp);
    fclose(fp);
    /* 77 residuals, padding, then the velocity count (0: no momentum) */
    assert_int_equal(get_le64(f->file + OFF_RESIDUALS + 4 * 77 + 4), 0);
    f->off_history = OFF_RESIDUALS + 4 * 77 + 4 + 8;
    assert_true(f->nbytes > f->off_history + 16);
    f->hist_count = get_le64(f->file + f->off_history);
    assert_true(f->hist_count > 0);
    /* + the online section's mode word (0: none), the sparse all-reduce's
     * slot count (0: gather route) and the checksum */
    assert_int_equal(f->nbytes, f->off_history + 8 + 32 * f->hist_count + 8 + 8 + 8);
    assert_int_equal(get_le64(f->file + f->nbytes - 16), 0);

    assert_ok(igrad_engine_create(f->layout, NULL, &f->cfg, f->comm, &f->loader));
    run_steps(f->loader, 0, 3, -0.5f);
    residuals_of(f->loader, f->before);
}

/* Loads `p` (n bytes) from a file and expects `want` naming `frag`, the
 * loader unchanged (residuals and step). */
static void expect_refused(fixture_t *f, const unsigned char *p, size_t n, igrad_status_t want,
                           const char *frag)
{
    char bad[600];
    snprintf(bad, sizeof bad, "%s/bad.bin", f->dir);
    write_file(bad, p, n);
    igrad_status_t st = igrad_engine_load_state(f->loader, bad);
    unlink(bad);
    if (st != want) {
        print_error("load returned %d (%s), expected %d; last error: %s\n", (int)st,
                    igrad_status_str(st), (int)want, igrad_last_error());
        fail();
    }
    assert_error_has(frag);
    assert_residuals_are(f->loader, f->before, "after a refused file");
    assert_int_equal(igrad_engine_step(f->loader), 2);
}

/* ---- tests -------------------------------------------------------------- */

static void test_good_file_loads(void **state)
{
    fixture_t *f = *state;
    make_files(f);
    assert_ok(igrad_engine_load_state(f->loader, f->path));
    assert_int_equal(igrad_engine_step(f->loader), 5);
    float want[77];
    memcpy(want, f->file + OFF_RESIDUALS, sizeof want);
    assert_residuals_are(f->loader, want, "after loading the good file");
}

static void test_bad_checksum_leaves_residuals(void **state)
{
    fixture_t *f = *state;
    make_files(f);
    unsigned char *p = malloc(f->nbytes);
    assert_non_null(p);
    memcpy(p, f->file, f->nbytes);
    p[OFF_RESIDUALS + 4 * 10] ^= 0x40;
    expect_refused(f, p, f->nbytes, IGRAD_E_FORMAT, "checksum mismatch");
    memcpy(p, f->file, f->nbytes);
    p[f->nbytes - 1] ^= 1; /* the checksum itself */
    expect_refused(f, p, f->nbytes, IGRAD_E_FORMAT, "checksum mismatch");
    free(p);
}

static void test_duplicated_fields_cross_checked(void **state)
{
    fixture_t *f = *state;
    make_files(f);
    unsigned char *p = malloc(f->nbytes);
    assert_non_null(p);
    struct {
        size_t off;
        uint64_t delta;
        const char *frag;
    } cases[] = {
        {OFF_ITEMS + 8 * ITEM_STEP, 1, "the step differs from its copy"},
        {OFF_STEP, 1, "the step differs from its copy"},
        {OFF_ITEMS + 8 * ITEM_CALLS, 1, "the step count differs from its copy"},
        {OFF_CALLS, 3, "the step count differs from its copy"},
        {OFF_ITEMS + 8 * ITEM_HISTORY, 1, "risk history hash differs"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memcpy(p, f->file, f->nbytes);
        put_le64(p + cases[k].off, get_le64(p + cases[k].off) + cases[k].delta);
        fix_checksum(p, f->nbytes);
        expect_refused(f, p, f->nbytes, IGRAD_E_FORMAT, cases[k].frag);
    }
    /* a history value changed: its hash copy in the items no longer matches */
    memcpy(p, f->file, f->nbytes);
    size_t mean0 = f->off_history + 8 + 16 * (size_t)f->hist_count;
    p[mean0 + 3] ^= 0x01;
    fix_checksum(p, f->nbytes);
    expect_refused(f, p, f->nbytes, IGRAD_E_FORMAT, "risk history hash differs");
    /* verify_every is not compared with the engine (ranks only), but a
     * negative one is no igrad file */
    memcpy(p, f->file, f->nbytes);
    put_le64(p + OFF_ITEMS + 8 * ITEM_VERIFY_EVERY, (uint64_t)-5);
    fix_checksum(p, f->nbytes);
    expect_refused(f, p, f->nbytes, IGRAD_E_FORMAT, "config.verify_every is -5");
    /* an enum item with its high bits set is named as invalid, not printed
     * as the engine's own value cut to 32 bits (config.sparsifier is item 7) */
    memcpy(p, f->file, f->nbytes);
    put_le64(p + OFF_ITEMS + 8 * 6, get_le64(p + OFF_ITEMS + 8 * 6) | (1ull << 40));
    fix_checksum(p, f->nbytes);
    expect_refused(f, p, f->nbytes, IGRAD_E_MISMATCH, "not a valid value");
    /* the 4 bytes after the 77th residual must be zero */
    memcpy(p, f->file, f->nbytes);
    p[OFF_RESIDUALS + 4 * 77 + 2] = 0x7f;
    fix_checksum(p, f->nbytes);
    expect_refused(f, p, f->nbytes, IGRAD_E_FORMAT, "padding is not zero");
    /* a version 9 file (before the split points) is refused saying why */
    memcpy(p, f->file, f->nbytes);
    p[8] = 9;
    fix_checksum(p, f->nbytes);
    expect_refused(f, p, f->nbytes, IGRAD_E_FORMAT,
                   "version 10 added the sparse all-reduce's split points");
    /* split points for a bucket slot this (gather route) engine does not have */
    memcpy(p, f->file, f->nbytes);
    put_le64(p + f->nbytes - 16, 1);
    fix_checksum(p, f->nbytes);
    expect_refused(f, p, f->nbytes, IGRAD_E_MISMATCH, "split points of 1 sparse all-reduce");
    /* and the unedited bytes still load (the edits above were the cause) */
    memcpy(p, f->file, f->nbytes);
    fix_checksum(p, f->nbytes);
    assert_memory_equal(p, f->file, f->nbytes);
    free(p);
}

static void test_truncated_and_trailing(void **state)
{
    fixture_t *f = *state;
    make_files(f);
    size_t cuts[] = {0, 7, 20, 100, OFF_RESIDUALS, OFF_RESIDUALS + 13, f->off_history + 4,
                     f->off_history + 40, f->nbytes - 8, f->nbytes - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++)
        expect_refused(f, f->file, cuts[k], IGRAD_E_FORMAT, "truncated state file");
    unsigned char *p = malloc(f->nbytes + 8);
    assert_non_null(p);
    memcpy(p, f->file, f->nbytes);
    memset(p + f->nbytes, 0, 8);
    expect_refused(f, p, f->nbytes + 1, IGRAD_E_FORMAT, "unexpected bytes after the checksum");
    expect_refused(f, p, f->nbytes + 8, IGRAD_E_FORMAT, "unexpected bytes after the checksum");
    free(p);
}

/* collective sparse_reduce on the self comm (P = 1): the section holds
 * one entry per index space the bucket slots ran (D, its key, its stamp,
 * the points 0 and D); it loads, and points out of order are refused. */
static void test_sparse_reduce_split_points(void **state)
{
    fixture_t *f = *state;
    igrad_config_t c = f->cfg;
    c.pack = IGRAD_PACK_GREEDY;
    c.collective = IGRAD_COLLECTIVE_SPARSE_REDUCE;
    c.buckets = 1;
    igrad_engine_t *a = NULL;
    assert_ok(igrad_engine_create(f->layout, NULL, &c, f->comm, &a));
    run_steps(a, 0, 4, 1.0f);
    assert_ok(igrad_engine_save_state(a, f->path));
    FILE *fp = fopen(f->path, "rb");
    assert_non_null(fp);
    unsigned char *p = malloc(1 << 16);
    assert_non_null(p);
    size_t n = fread(p, 1, 1 << 16, fp);
    fclose(fp);
    /* the section: S, then S x 8 entries of 24 + 8 (P + 1) bytes */
    size_t entry = 24 + 8 * 2, sec = 0, S = 0;
    for (S = 1; S < 64; S++) {
        sec = 8 + S * 8 * entry;
        if (sec + 8 <= n && get_le64(p + n - 8 - sec) == S) break;
    }
    assert_true(S < 64);
    const unsigned char *e0 = p + n - 8 - sec + 8;
    uint64_t D = get_le64(e0);
    assert_true(D > 0 && get_le64(e0 + 16) > 0);           /* stored at a stamp */
    assert_int_equal(get_le64(e0 + 24), 0);                  /* 0 */
    assert_int_equal(get_le64(e0 + 32), D);                  /* D */
    igrad_engine_t *b = NULL;
    assert_ok(igrad_engine_create(f->layout, NULL, &c, f->comm, &b));
    assert_ok(igrad_engine_load_state(b, f->path));
    run_steps(a, 4, 6, 1.0f);
    run_steps(b, 4, 6, 1.0f);
    float ra[77], rb[77];
    residuals_of(a, ra);
    residuals_of(b, rb);
    assert_memory_equal(ra, rb, sizeof ra);
    put_le64(p + (size_t)(e0 - p) + 32, D + 1); /* the last point past D */
    fix_checksum(p, n);
    write_file(f->path, p, n);
    assert_int_equal(igrad_engine_load_state(b, f->path), IGRAD_E_FORMAT);
    assert_non_null(strstr(igrad_last_error(), "are not ordered points"));
    free(p);
    igrad_engine_free(a);
    igrad_engine_free(b);
}

/* A FIFO hands its first reader the good file; should the loader open it
 * a second time, it gets `second` (another valid file, or one with a bad
 * checksum). A loader that reads twice either applies the second file's
 * residuals or overwrites some before it sees the bad checksum. */
typedef struct fifo_writer {
    const char *path;
    const unsigned char *first, *second;
    size_t nbytes;
    volatile int done;       /* set by the loader's thread after the load */
    int second_open;         /* set by the writer */
    int error;
} fifo_writer_t;

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void *fifo_writer_main(void *arg)
{
    fifo_writer_t *w = arg;
    int fd = open(w->path, O_WRONLY); /* blocks until the loader opens */
    if (fd < 0 || write_all(fd, w->first, w->nbytes) != 0) w->error = 1;
    if (fd >= 0) close(fd);
    /* A reader is one that has the FIFO open (or is opening it): then a
     * non-blocking open for writing succeeds, else it fails with ENXIO.
     * First wait for the first reader to close (an open meanwhile gives
     * no bytes: a reader that reopened at once just sees an empty file),
     * then any reader is a second one. */
    struct timespec ms = {0, 1000000};
    while (!w->done) {
        fd = open(w->path, O_WRONLY | O_NONBLOCK);
        if (fd < 0) break;
        close(fd);
        nanosleep(&ms, NULL);
    }
    while (!w->done) {
        fd = open(w->path, O_WRONLY | O_NONBLOCK);
        if (fd >= 0) {
            w->second_open = 1;
            int flags = fcntl(fd, F_GETFL);
            fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
            write_all(fd, w->second, w->nbytes);
            close(fd);
            break;
        }
        nanosleep(&ms, NULL);
    }
    return NULL;
}

static void load_through_fifo(fixture_t *f, const unsigned char *second)
{
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s/state.fifo", f->dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    fifo_writer_t w = {fifo, f->file, second, f->nbytes, 0, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fifo_writer_main, &w), 0);
    igrad_status_t st = igrad_engine_load_state(f->loader, fifo);
    w.done = 1;
    pthread_join(th, NULL);
    unlink(fifo);
    assert_int_equal(w.error, 0);
    if (st != IGRAD_OK) print_error("load: %s\n", igrad_last_error());
    assert_int_equal(st, IGRAD_OK);
    assert_false(w.second_open);
    float want[77];
    memcpy(want, f->file + OFF_RESIDUALS, sizeof want);
    assert_residuals_are(f->loader, want, "loaded through the FIFO");
    assert_int_equal(igrad_engine_step(f->loader), 5);
}

static void test_read_once_valid_replacement(void **state)
{
    fixture_t *f = *state;
    make_files(f);
    unsigned char *other = malloc(f->nbytes);
    assert_non_null(other);
    memcpy(other, f->file, f->nbytes);
    for (int i = 0; i < 77; i++) {
        float x = (float)(1000 + i);
        memcpy(other + OFF_RESIDUALS + 4 * i, &x, 4);
    }
    fix_checksum(other, f->nbytes);
    load_through_fifo(f, other);
    free(other);
}

static void test_read_once_corrupt_replacement(void **state)
{
    fixture_t *f = *state;
    make_files(f);
    unsigned char *other = malloc(f->nbytes);
    assert_non_null(other);
    memcpy(other, f->file, f->nbytes);
    memset(other + OFF_RESIDUALS, 0x55, 4 * 40); /* checksum now wrong */
    load_through_fifo(f, other);
    free(other);
}

/* Residuals and velocities of more than two of the saver's 1 MiB chunks
 * (an odd count: the last chunk ends in padding): the file's sections are
 * the engine's floats in layout order, read here at formats.md §7's
 * offsets, with zero padding; the checksum is right and a fresh engine
 * loads them back bit for bit. */
#define BIG_N 600001
static void test_large_sections_chunked(void **state)
{
    fixture_t *f = *state;
    igrad_layout_t *L = NULL;
    int64_t n = BIG_N;
    assert_ok(igrad_layout_create(&L));
    assert_ok(igrad_layout_add(L, "model.norm.weight", IGRAD_DTYPE_F32, 1, &n));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.momentum = 0.5;
    igrad_engine_t *a = NULL, *b = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, f->comm, &a));
    float *g = malloc(BIG_N * sizeof *g);
    assert_non_null(g);
    for (int64_t s = 0; s < 2; s++) {
        for (int64_t i = 0; i < BIG_N; i++)
            g[i] = (float)((int64_t)(mix64((uint64_t)(s * BIG_N + i)) % 2001) - 1000) / 64.0f;
        assert_ok(igrad_engine_sync(a, s, &g));
    }
    assert_ok(igrad_engine_save_state(a, f->path));
    char *file = NULL;
    size_t nbytes = 0;
    FILE *fp = fopen(f->path, "rb");
    assert_non_null(fp);
    file = malloc(16u << 20);
    assert_non_null(file);
    nbytes = fread(file, 1, 16u << 20, fp);
    fclose(fp);
    const unsigned char *p = (const unsigned char *)file;
    const float *r = igrad_engine_residual(a, 0), *u = igrad_engine_velocity(a, 0);
    assert_non_null(r);
    assert_non_null(u);
    const size_t sec = 4 * (size_t)BIG_N + 4; /* floats + padding */
    assert_int_equal(get_le64(p + OFF_RESIDUALS - 8), BIG_N);
    assert_memory_equal(p + OFF_RESIDUALS, r, 4 * (size_t)BIG_N);
    static const unsigned char zero4[4];
    assert_memory_equal(p + OFF_RESIDUALS + 4 * (size_t)BIG_N, zero4, 4); /* padding */
    assert_int_equal(get_le64(p + OFF_RESIDUALS + sec), BIG_N);            /* velocity count */
    assert_memory_equal(p + OFF_RESIDUALS + sec + 8, u, 4 * (size_t)BIG_N);
    assert_memory_equal(p + OFF_RESIDUALS + sec + 8 + 4 * (size_t)BIG_N, zero4, 4);
    assert_true(nbytes > OFF_RESIDUALS + 2 * sec + 16);
    assert_int_equal(get_le64(p + nbytes - 8), fnv_words(p, nbytes - 8));
    assert_ok(igrad_engine_create(L, NULL, &c, f->comm, &b));
    assert_ok(igrad_engine_load_state(b, f->path));
    assert_memory_equal(igrad_engine_residual(b, 0), r, 4 * (size_t)BIG_N);
    assert_memory_equal(igrad_engine_velocity(b, 0), u, 4 * (size_t)BIG_N);
    free(file);
    free(g);
    igrad_engine_free(a);
    igrad_engine_free(b);
    igrad_layout_free(L);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* a loader that stops reading early */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_good_file_loads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_checksum_leaves_residuals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicated_fields_cross_checked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_and_trailing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sparse_reduce_split_points, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_once_valid_replacement, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_once_corrupt_replacement, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_sections_chunked, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
