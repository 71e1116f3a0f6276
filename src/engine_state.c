/*
 * engine_state.c — saving and loading one rank's engine state (residuals,
 * step, agreement items, the risk policy's size history), so that a resumed
 * run continues exactly. The format is documented at
 * igrad_engine_save_state() in igrad.h.
 *
 * Every section is a multiple of 8 bytes (the residuals are padded), so the
 * checksum is FNV-1a taken over 64-bit words: one multiply per 8 bytes
 * keeps a 500 MB state file from costing seconds to hash.
 *
 * Loading reads the file twice: the first pass checks everything (sizes,
 * checksum, items against this engine) without touching the engine; then
 * the ranks agree, and only if every rank's file is good does the second
 * pass copy the residuals in. So a bad file on one rank leaves every
 * engine as it was.
 *
 * Not here: the engine itself (engine.c).
 */
#include "engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_MAGIC "IGRADST"      /* 7 characters + NUL = 8 bytes */
#define STATE_VERSION 1u
#define FNV_PRIME 0x100000001b3ULL
#define CHUNK_NBYTES (1u << 20)

static uint64_t hash_words(uint64_t h, const unsigned char *p, size_t nbytes)
{
    for (size_t i = 0; i + 8 <= nbytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h ^= w;
        h *= FNV_PRIME;
    }
    return h;
}

/* ---- writing ------------------------------------------------------------ */

typedef struct writer {
    FILE *fp;
    uint64_t h;
    int err;
} writer_t;

/* nbytes must be a multiple of 8. */
static void put(writer_t *w, const void *p, size_t nbytes)
{
    if (w->err || nbytes == 0) return;
    w->h = hash_words(w->h, p, nbytes);
    if (fwrite(p, 1, nbytes, w->fp) != nbytes) w->err = 1;
}

static void put_u64(writer_t *w, uint64_t v) { put(w, &v, 8); }

static void put_u32_pair(writer_t *w, uint32_t a, uint32_t b)
{
    unsigned char buf[8];
    memcpy(buf, &a, 4);
    memcpy(buf + 4, &b, 4);
    put(w, buf, 8);
}

/* Floats, padded with zeros to a multiple of 8 bytes. */
static void put_floats(writer_t *w, const float *x, size_t n)
{
    size_t even = n & ~(size_t)1;
    put(w, x, even * sizeof(float));
    if (n & 1) {
        unsigned char buf[8] = {0};
        memcpy(buf, x + even, 4);
        put(w, buf, 8);
    }
}

igrad_status_t igrad_engine_save_state(const igrad_engine_t *engine, const char *path)
{
    IGRAD_FAIL_IF(!engine || !path, IGRAD_E_INVALID, "igrad_engine_save_state: NULL argument");
    IGRAD_CHECK(igrad__engine_usable(engine, "igrad_engine_save_state"));
    IGRAD_FAIL_IF(engine->state != IGRAD__ENGINE_IDLE, IGRAD_E_STATE,
                  "igrad_engine_save_state: step %lld is open (call igrad_engine_end first)",
                  (long long)engine->cur_step);
    const igrad_engine_t *e = engine;
    uint64_t items[IGRAD__NITEMS];
    memcpy(items, e->items, sizeof items);
    items[IGRAD__ITEM_STEP] = (uint64_t)e->last_step;
    items[IGRAD__ITEM_CALLS] = (uint64_t)e->calls;
    items[IGRAD__ITEM_HISTORY] = igrad__pack_history_hash(IGRAD__HASH_SEED, &e->hist);

    igrad__atomic_file_t af;
    IGRAD_CHECK(igrad__atomic_open(&af, path));
    writer_t w = {af.fp, IGRAD__HASH_SEED, 0};
    char magic[8] = STATE_MAGIC;
    put(&w, magic, 8);
    put_u32_pair(&w, STATE_VERSION, (uint32_t)e->rank);
    put_u32_pair(&w, (uint32_t)e->nranks, (uint32_t)IGRAD__NITEMS);
    put(&w, items, sizeof items);
    put_u64(&w, (uint64_t)e->last_step);
    put_u64(&w, (uint64_t)e->calls);
    put_u64(&w, (uint64_t)e->ntensors);
    put_u64(&w, (uint64_t)e->residual_count);
    if (e->residual_count) put_floats(&w, e->residual_mem, (size_t)e->residual_count);
    size_t hc = e->hist.count;
    put_u64(&w, (uint64_t)hc);
    if (hc) {
        put(&w, e->hist.key, hc * sizeof *e->hist.key);
        put(&w, e->hist.n, hc * sizeof *e->hist.n);
        put(&w, e->hist.mean, hc * sizeof *e->hist.mean);
        put(&w, e->hist.m2, hc * sizeof *e->hist.m2);
    }
    uint64_t sum = w.h;
    if (!w.err && fwrite(&sum, 1, 8, af.fp) != 8) w.err = 1;
    if (w.err) {
        igrad__atomic_abort(&af);
        return igrad__fail(IGRAD_E_IO, __FILE__, __LINE__, "%s: write failed", path);
    }
    return igrad__atomic_commit(&af);
}

/* ---- reading -------------------------------------------------------------- */

typedef struct reader {
    FILE *fp;
    const char *path;
    uint64_t h;
    uint64_t pos;
} reader_t;

/* Reads nbytes (a multiple of 8) into p, or only hashes them when p is
 * NULL. */
static igrad_status_t get(reader_t *r, void *p, size_t nbytes, const char *what)
{
    unsigned char buf[4096];
    size_t done = 0;
    while (done < nbytes) {
        size_t want = nbytes - done;
        unsigned char *dst = p ? (unsigned char *)p + done : buf;
        if (!p && want > sizeof buf) want = sizeof buf;
        if (p && want > CHUNK_NBYTES) want = CHUNK_NBYTES;
        size_t got = fread(dst, 1, want, r->fp);
        r->h = hash_words(r->h, dst, got & ~(size_t)7);
        r->pos += got;
        done += got;
        if (got != want)
            return igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                               "%s: truncated state file (ends at byte %llu, inside %s)",
                               r->path, (unsigned long long)r->pos, what);
    }
    return IGRAD_OK;
}

static igrad_status_t get_u64(reader_t *r, uint64_t *v, const char *what)
{
    return get(r, v, 8, what);
}

/* What the first pass learns. */
typedef struct state_header {
    uint32_t rank, size;
    uint64_t items[IGRAD__NITEMS];
    int64_t step, calls;
    uint64_t ntensors, residual_count, hist_count;
} state_header_t;

/* Reads the header; checks magic, version and item count. */
static igrad_status_t read_header(reader_t *r, state_header_t *hd)
{
    char magic[8];
    uint32_t pair[2];
    IGRAD_CHECK(get(r, magic, 8, "the magic"));
    IGRAD_FAIL_IF(memcmp(magic, STATE_MAGIC, 8) != 0, IGRAD_E_FORMAT,
                  "%s: not an igrad engine state file (bad magic)", r->path);
    IGRAD_CHECK(get(r, pair, 8, "the header"));
    IGRAD_FAIL_IF(pair[0] != STATE_VERSION, IGRAD_E_FORMAT,
                  "%s: state file version %u (this igrad reads %u)", r->path, pair[0],
                  STATE_VERSION);
    hd->rank = pair[1];
    IGRAD_CHECK(get(r, pair, 8, "the header"));
    hd->size = pair[0];
    IGRAD_FAIL_IF(pair[1] != IGRAD__NITEMS, IGRAD_E_MISMATCH,
                  "%s: state file has %u agreement items, this igrad %d (saved by another "
                  "version)",
                  r->path, pair[1], IGRAD__NITEMS);
    IGRAD_CHECK(get(r, hd->items, sizeof hd->items, "the agreement items"));
    uint64_t v;
    IGRAD_CHECK(get_u64(r, &v, "the step"));
    hd->step = (int64_t)v;
    IGRAD_CHECK(get_u64(r, &v, "the step count"));
    hd->calls = (int64_t)v;
    IGRAD_CHECK(get_u64(r, &hd->ntensors, "the tensor count"));
    IGRAD_CHECK(get_u64(r, &hd->residual_count, "the residual count"));
    return IGRAD_OK;
}

/* Compares a header with the engine. */
static igrad_status_t check_header(const igrad_engine_t *e, const char *path,
                                   const state_header_t *hd)
{
    for (int i = 0; i < IGRAD__NITEMS; i++) {
        if (!igrad__items[i].in_state || hd->items[i] == e->items[i]) continue;
        char a[64], b[64];
        igrad__item_format(i, hd->items[i], a, sizeof a);
        igrad__item_format(i, e->items[i], b, sizeof b);
        return igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                           "%s: %s differs: the state file has %s, this engine %s", path,
                           igrad__items[i].name, a, b);
    }
    IGRAD_FAIL_IF(hd->size != (uint32_t)e->nranks || hd->rank != (uint32_t)e->rank,
                  IGRAD_E_MISMATCH,
                  "%s: state of rank %u of %u, loaded on rank %d of %d", path, hd->rank,
                  hd->size, e->rank, e->nranks);
    IGRAD_FAIL_IF(hd->ntensors != e->ntensors || hd->residual_count != (uint64_t)e->residual_count,
                  IGRAD_E_FORMAT,
                  "%s: %llu tensors with %llu residual entries, the engine has %zu with %lld",
                  path, (unsigned long long)hd->ntensors,
                  (unsigned long long)hd->residual_count, e->ntensors,
                  (long long)e->residual_count);
    IGRAD_FAIL_IF(hd->step < -1 || hd->calls < 0, IGRAD_E_FORMAT,
                  "%s: step %lld, step count %lld", path, (long long)hd->step,
                  (long long)hd->calls);
    return IGRAD_OK;
}

/* The whole file: header, residuals (into `residuals` or only hashed),
 * history (into the engine's arrays when `hist` is not NULL, else hashed
 * and its keys compared), checksum. */
static igrad_status_t read_state(const igrad_engine_t *e, const char *path, state_header_t *hd,
                                 float *residuals, igrad__pack_history_t *hist)
{
    FILE *fp = fopen(path, "rb");
    IGRAD_FAIL_IF(!fp, IGRAD_E_IO, "%s: cannot open the state file", path);
    reader_t r = {fp, path, IGRAD__HASH_SEED, 0};
    igrad_status_t st;
    uint64_t *keys = NULL;
    IGRAD_CHECK_GOTO(read_header(&r, hd));
    IGRAD_CHECK_GOTO(check_header(e, path, hd));
    size_t rc = (size_t)hd->residual_count, even = rc & ~(size_t)1;
    IGRAD_CHECK_GOTO(get(&r, residuals, even * sizeof(float), "the residuals"));
    if (rc & 1) {
        unsigned char pad[8];
        IGRAD_CHECK_GOTO(get(&r, pad, 8, "the residuals"));
        if (residuals) memcpy(residuals + even, pad, 4);
    }
    IGRAD_CHECK_GOTO(get_u64(&r, &hd->hist_count, "the history count"));
    IGRAD_FAIL_GOTO(hd->hist_count != e->hist.count, IGRAD_E_MISMATCH,
                    "%s: risk history of %llu blocks, this engine has %zu", path,
                    (unsigned long long)hd->hist_count, e->hist.count);
    size_t hc = (size_t)hd->hist_count;
    if (hc) {
        keys = malloc(hc * sizeof *keys);
        IGRAD_FAIL_GOTO(!keys, IGRAD_E_NOMEM, "%s: out of memory", path);
        IGRAD_CHECK_GOTO(get(&r, keys, hc * sizeof *keys, "the history keys"));
        IGRAD_FAIL_GOTO(memcmp(keys, e->hist.key, hc * sizeof *keys) != 0, IGRAD_E_MISMATCH,
                        "%s: the risk history has other blocks than this engine", path);
        IGRAD_CHECK_GOTO(get(&r, hist ? (void *)hist->n : NULL, hc * sizeof(int64_t),
                             "the history"));
        IGRAD_CHECK_GOTO(get(&r, hist ? (void *)hist->mean : NULL, hc * sizeof(double),
                             "the history"));
        IGRAD_CHECK_GOTO(get(&r, hist ? (void *)hist->m2 : NULL, hc * sizeof(double),
                             "the history"));
    }
    uint64_t want = r.h, sum;
    IGRAD_CHECK_GOTO(get_u64(&r, &sum, "the checksum"));
    IGRAD_FAIL_GOTO(sum != want, IGRAD_E_FORMAT,
                    "%s: checksum mismatch (file 0x%016llx, computed 0x%016llx): corrupt state "
                    "file",
                    path, (unsigned long long)sum, (unsigned long long)want);
    IGRAD_FAIL_GOTO(fgetc(fp) != EOF, IGRAD_E_FORMAT,
                    "%s: unexpected bytes after the checksum", path);
    st = IGRAD_OK;
cleanup:
    free(keys);
    fclose(fp);
    return st;
}

igrad_status_t igrad_engine_load_state(igrad_engine_t *engine, const char *path)
{
    IGRAD_FAIL_IF(!engine, IGRAD_E_INVALID, "igrad_engine_load_state: engine is NULL");
    IGRAD_CHECK(igrad__engine_usable(engine, "igrad_engine_load_state"));
    igrad_engine_t *e = engine;
    state_header_t hd;
    memset(&hd, 0, sizeof hd);
    igrad_status_t st;
    if (!path) st = igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                                "igrad_engine_load_state: path is NULL");
    else if (e->state != IGRAD__ENGINE_IDLE)
        st = igrad__fail(IGRAD_E_STATE, __FILE__, __LINE__,
                         "igrad_engine_load_state: step %lld is open", (long long)e->cur_step);
    else st = read_state(e, path, &hd, NULL, NULL);
    char msg[1024] = "";
    if (st != IGRAD_OK) snprintf(msg, sizeof msg, "%s", igrad_last_error());

    /* Every rank's file must be good and from the same point of the run. */
    uint64_t items[IGRAD__NITEMS];
    memcpy(items, e->items, sizeof items);
    items[IGRAD__ITEM_STEP] = (uint64_t)hd.step;
    items[IGRAD__ITEM_CALLS] = (uint64_t)hd.calls;
    items[IGRAD__ITEM_HISTORY] = hd.items[IGRAD__ITEM_HISTORY];
    IGRAD_CHECK(igrad__engine_agree(e, e->comm, e->nranks, e->agree_buf, st, -1, msg, items, 1,
                                    "load state"));

    IGRAD_CHECK(read_state(e, path, &hd, e->residual_mem, &e->hist));
    e->last_step = hd.step;
    e->calls = hd.calls;
    igrad__engine_dynamic_items(e, hd.step);
    return IGRAD_OK;
}
