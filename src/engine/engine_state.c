/*
 * engine_state.c — saving and loading one rank's engine state (residuals,
 * step, agreement items, the risk policy's size history), so that a resumed
 * run continues exactly. The format is documented at
 * igrad_engine_save_state() in igrad.h.
 *
 * Saving reads residuals and velocities through the data plane's copy_out
 * (dp.h) one CHUNK_NBYTES piece at a time, so a device engine's state is
 * written with O(chunk) host memory and the bytes are the same as a CPU
 * engine's.
 *
 * Every section is a multiple of 8 bytes (the residuals are padded), so the
 * checksum is FNV-1a taken over 64-bit words: one multiply per 8 bytes
 * keeps a 500 MB state file from costing seconds to hash.
 *
 * Loading reads the file once, into memory (transiently as many bytes as
 * the file: about 4 per residual entry), then verifies all of it (sizes,
 * checksum, items against this engine, the header's duplicated fields, the
 * padding, the history and its hash) without touching the engine; then
 * the ranks agree, and only if every rank's file is good are the residuals
 * copied in from that same buffer. So a bad file on one rank leaves every
 * engine as it was, and a file replaced during the load cannot mix two
 * versions.
 *
 * Not here: the engine itself (engine.c).
 */
#include "engine/engine_state.h"
#include "engine/engine_online.h"
#include "comm/sparse_allreduce.h"
#include "dp/dp.h"
#include "profile/profile_internal.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_MAGIC "IGRADST"      /* 7 characters + NUL = 8 bytes */
#define STATE_VERSION 10u /* 2: 26 items (config.timeout_s); 3: 36 items (gate_other,
                            online profiling, remedies), the velocity section and
                            the online profiling section; 4: 38 items
                            (reprofile_every, reprofile_margin) and the
                            re-profiling section after the online profile; 5: 41
                            items (topology, ranks_per_node, dense_below); 6: 44
                            items (link_latency_ns, link_bandwidth_mbps,
                            auto_sparse_reduce); 7: 40 items (risk_lambda,
                            gate_other, momentum_masking, residual_decay
                            removed, the later items renumbered); 8: 41 items
                            (index_code); 9: 42 items (allocation); 10: the
                            sparse all-reduce's split points before the
                            checksum (decision 0060) */
/* online section modes */
#define ONLINE_NONE 0u      /* no online state (or the create-time profile) */
#define ONLINE_WINDOW 1u    /* recording: the window's records follow */
#define ONLINE_PROFILE 2u   /* re-planned: the profile JSON follows */
#define STATE_PROFILE_MAX_NBYTES (16u * 1024u * 1024u)
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

/* n floats of the data plane's memory at src (a CUDA engine's are on the
 * device) through dp->copy_out, CHUNK_NBYTES at a time into `buf`, so
 * that host memory stays one chunk whatever the residual's size; the
 * bytes are put_floats' (a chunk holds an even number of floats: only the
 * last one can need padding). */
static igrad_status_t put_dp_floats(writer_t *w, const igrad_engine_t *e, const float *src,
                                    size_t n, float *buf)
{
    const size_t per = CHUNK_NBYTES / sizeof(float);
    for (size_t i = 0; i < n && !w->err; i += per) {
        size_t k = n - i < per ? n - i : per;
        IGRAD_CHECK(e->mem.dp->copy_out(IGRAD__PARTS(e), buf, src + i, k * sizeof(float)));
        put_floats(w, buf, k);
    }
    return IGRAD_OK;
}

/* The re-profiling section (config.reprofile_every > 0, after the online
 * profile): counters, the window being recorded (Wr rows), the held
 * selections and the hysteresis flags. */
static void put_reprofile(writer_t *w, const igrad_engine_t *e)
{
    const igrad__online_t *on = e->online;
    size_t T = e->plan.ntensors, Wr = (size_t)on->Wr;
    put_u64(w, (uint64_t)on->fixed);
    put_u64(w, (uint64_t)on->reprofiles);
    put_u64(w, (uint64_t)on->reprofile_replans);
    put_u64(w, (uint64_t)on->last_flips);
    put_u64(w, (uint64_t)on->nrec);
    put(w, on->steps, Wr * 8);
    put(w, on->sumsq, Wr * T * 8);
    put(w, on->count, Wr * T * 8);
    put(w, on->held, T * 8);
    put(w, on->held_count, T * 8);
    put(w, on->last_sel, T * 8);
    for (size_t i = 0; i < on->npend; i += 8) {
        unsigned char buf[8] = {0};
        size_t k = on->npend - i < 8 ? on->npend - i : 8;
        memcpy(buf, on->pending + i, k);
        put(w, buf, 8);
    }
}

/* The sparse all-reduce's section, the last before the checksum: the
 * bucket slots S (0 without the sparse all-reduce), then per slot the
 * IGRAD__SAR_MEMO entries of split points it keeps for its next calls:
 * the index space (its size, 0: empty; its key, route.c's hash of the
 * bucket's segments), when the entry was stored, the P + 1 points (zeros
 * when empty). A balanced split point depends on the previous step
 * over the same index space (decision 0060): without them a resumed run
 * would split on equal ranges where the uninterrupted one does not. */
static uint64_t sar_slots(const igrad_engine_t *e)
{
    return e->step.sar ? (uint64_t)e->plan.nb_max : 0;
}

static uint64_t sar_entry_nbytes(const igrad_engine_t *e)
{
    return 24 + 8 * ((uint64_t)e->plan.nranks + 1);
}

static uint64_t sar_nbytes(const igrad_engine_t *e)
{
    return 8 + sar_slots(e) * IGRAD__SAR_MEMO * sar_entry_nbytes(e);
}

static void put_sar(writer_t *w, const igrad_engine_t *e)
{
    const uint64_t S = sar_slots(e);
    const int P = e->plan.nranks;
    put_u64(w, S);
    for (uint64_t j = 0; j < S; j++)
        for (int i = 0; i < IGRAD__SAR_MEMO; i++) {
            uint64_t D = 0, key = 0, stamp = 0;
            const uint64_t *pts = igrad__sar_memo_get(&e->step.sar[j], P, i, &D, &key, &stamp);
            put_u64(w, D);
            put_u64(w, key);
            put_u64(w, stamp);
            for (int r = 0; r <= P; r++) put_u64(w, pts ? pts[r] : 0);
        }
}

igrad_status_t igrad__flat_save_state(const igrad_engine_t *engine, const char *path)
{
    IGRAD_CHECK(igrad__engine_usable(engine, "igrad_engine_save_state"));
    IGRAD_FAIL_IF(engine->state != IGRAD__ENGINE_IDLE, IGRAD_E_STATE,
                  "igrad_engine_save_state: step %lld is open (call igrad_engine_end first)",
                  (long long)engine->step.cur_step);
    const igrad_engine_t *e = engine;
    uint64_t items[IGRAD__NITEMS];
    memcpy(items, e->items, sizeof items);
    items[IGRAD__ITEM_STEP] = (uint64_t)e->last_step;
    items[IGRAD__ITEM_CALLS] = (uint64_t)e->calls;
    items[IGRAD__ITEM_HISTORY] = igrad__pack_history_hash(IGRAD__HASH_SEED, &e->plan.hist);
    items[IGRAD__ITEM_ONLINE] = (uint64_t)igrad__online_item(e);

    float *chunk = NULL; /* the residuals' and velocities' way out */
    if (e->mem.residual_count || e->mem.velocity_count) {
        chunk = malloc(CHUNK_NBYTES);
        IGRAD_FAIL_IF(!chunk, IGRAD_E_NOMEM, "%s: out of memory", path);
    }
    igrad__atomic_file_t af;
    igrad_status_t st = igrad__atomic_open(&af, path);
    if (st != IGRAD_OK) {
        free(chunk);
        return st;
    }
    writer_t w = {af.fp, IGRAD__HASH_SEED, 0};
    char magic[8] = STATE_MAGIC;
    put(&w, magic, 8);
    put_u32_pair(&w, STATE_VERSION, (uint32_t)e->plan.rank);
    put_u32_pair(&w, (uint32_t)e->plan.nranks, (uint32_t)IGRAD__NITEMS);
    put(&w, items, sizeof items);
    put_u64(&w, (uint64_t)e->last_step);
    put_u64(&w, (uint64_t)e->calls);
    put_u64(&w, (uint64_t)e->plan.ntensors);
    put_u64(&w, (uint64_t)e->mem.residual_count);
    st = put_dp_floats(&w, e, e->mem.residual_mem, (size_t)e->mem.residual_count, chunk);
    put_u64(&w, (uint64_t)e->mem.velocity_count);
    if (st == IGRAD_OK)
        st = put_dp_floats(&w, e, e->mem.velocity_mem, (size_t)e->mem.velocity_count, chunk);
    free(chunk);
    if (st != IGRAD_OK) {
        igrad__atomic_abort(&af);
        return st;
    }
    size_t hc = e->plan.hist.count;
    put_u64(&w, (uint64_t)hc);
    if (hc) {
        put(&w, e->plan.hist.key, hc * sizeof *e->plan.hist.key);
        put(&w, e->plan.hist.n, hc * sizeof *e->plan.hist.n);
        put(&w, e->plan.hist.mean, hc * sizeof *e->plan.hist.mean);
        put(&w, e->plan.hist.m2, hc * sizeof *e->plan.hist.m2);
    }
    /* online profiling: the window being recorded, or the profile the plan
     * was built from (the items alone could not rebuild it) */
    const igrad__online_t *on = e->online;
    uint64_t mode = !on ? ONLINE_NONE
                    : on->active ? ONLINE_WINDOW
                    : on->profile ? ONLINE_PROFILE
                                  : ONLINE_NONE;
    put_u64(&w, mode);
    if (mode == ONLINE_WINDOW) {
        size_t WT = (size_t)on->W * e->plan.ntensors;
        put_u64(&w, (uint64_t)on->nrec);
        put(&w, on->steps, (size_t)on->W * 8);
        put(&w, on->sumsq, WT * 8);
        put(&w, on->count, WT * 8);
    } else if (mode == ONLINE_PROFILE) {
        char *text = NULL;
        igrad_status_t pst = igrad__profile_to_json_text(on->profile, &text);
        if (pst != IGRAD_OK) {
            igrad__atomic_abort(&af);
            return pst;
        }
        size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
        put_u64(&w, (uint64_t)on->switch_step);
        put_u64(&w, (uint64_t)on->replans);
        put_u64(&w, (uint64_t)len);
        char *buf = calloc(padded ? padded : 8, 1);
        if (!buf) {
            free(text);
            igrad__atomic_abort(&af);
            return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
        }
        memcpy(buf, text, len);
        put(&w, buf, padded);
        free(buf);
        free(text);
        if (on->Wr > 0) put_reprofile(&w, e);
    }
    put_sar(&w, e);
    uint64_t sum = w.h;
    if (!w.err && fwrite(&sum, 1, 8, af.fp) != 8) w.err = 1;
    if (w.err) {
        igrad__atomic_abort(&af);
        return igrad__fail(IGRAD_E_IO, __FILE__, __LINE__, "%s: write failed", path);
    }
    return igrad__atomic_commit(&af);
}

/* ---- reading -------------------------------------------------------------- */

/* Fixed part: magic, 2 u32 pairs, the items, step, calls, T, N. */
#define HEADER_NBYTES (8u + 8u + 8u + 8u * IGRAD__NITEMS + 32u)

static uint64_t residual_section_nbytes(uint64_t count)
{
    return 4 * count + (count & 1 ? 4 : 0);
}

/* Everything but the online section. */
static uint64_t base_nbytes(const igrad_engine_t *e)
{
    return HEADER_NBYTES + residual_section_nbytes((uint64_t)e->mem.residual_count) + 8 +
           residual_section_nbytes((uint64_t)e->mem.velocity_count) + 8 +
           32 * (uint64_t)e->plan.hist.count + sar_nbytes(e) + 8;
}

static uint64_t window_nbytes(const igrad_engine_t *e)
{
    uint64_t W = e->online ? (uint64_t)e->online->W : 0;
    return 8 + 8 * W + 16 * W * (uint64_t)e->plan.ntensors;
}

/* The re-profiling section, from the engine's config (0 when off). */
static uint64_t reprofile_nbytes(const igrad_engine_t *e)
{
    uint64_t Wr = (uint64_t)e->plan.cfg.reprofile_every, T = e->plan.ntensors;
    if (!e->online || Wr == 0) return 0;
    uint64_t npend = igrad_layout_component_count(e->online->layout);
    return 40 + 8 * Wr + 16 * Wr * T + 24 * T + ((npend + 7) & ~(uint64_t)7);
}

uint64_t igrad__engine_state_nbytes(const igrad_engine_t *e)
{
    const igrad__online_t *on = e->online;
    uint64_t online = 8;
    if (on && on->active) online += window_nbytes(e);
    else if (on && on->profile) {
        char *text = NULL;
        if (igrad__profile_to_json_text(on->profile, &text) == IGRAD_OK)
            online += 24 + ((strlen(text) + 7) & ~(size_t)7) + reprofile_nbytes(e);
        free(text);
    }
    return base_nbytes(e) + online;
}

/* A cursor over the file's bytes; every section is checked against the end
 * before it is read, so a short buffer is "truncated", never read past. */
typedef struct cursor {
    const unsigned char *p;
    size_t n, pos;
    const char *name;
} cursor_t;

static igrad_status_t need(cursor_t *c, uint64_t nbytes, const char *what)
{
    IGRAD_FAIL_IF(nbytes > c->n - c->pos, IGRAD_E_FORMAT,
                  "%s: truncated state file (ends at byte %zu, inside %s)", c->name, c->n, what);
    return IGRAD_OK;
}

static igrad_status_t take(cursor_t *c, void *dst, size_t nbytes, const char *what)
{
    IGRAD_CHECK(need(c, nbytes, what));
    memcpy(dst, c->p + c->pos, nbytes);
    c->pos += nbytes;
    return IGRAD_OK;
}

static igrad_status_t take_u64(cursor_t *c, uint64_t *v, const char *what)
{
    return take(c, v, 8, what);
}

/* What verification learns; offsets point into the verified bytes. */
typedef struct state_view {
    uint32_t rank, size;
    uint64_t items[IGRAD__NITEMS];
    int64_t step, calls;
    uint64_t ntensors, residual_count, velocity_count, hist_count;
    size_t residual_off;        /* N floats (not necessarily aligned) */
    size_t velocity_off;        /* velocity_count floats */
    size_t sar_off;             /* the sparse all-reduce's section */
    igrad__pack_history_t hist; /* copies of the file's history (count = H) */
} state_view_t;

static void view_free(state_view_t *v)
{
    free(v->hist.key);
    free(v->hist.n);
    free(v->hist.mean);
    free(v->hist.m2);
    memset(&v->hist, 0, sizeof v->hist);
}

/* Header fields: magic, version, item count, items against the engine,
 * rank and size, T and N. */
static igrad_status_t parse_header(const igrad_engine_t *e, cursor_t *c, state_view_t *v)
{
    char magic[8];
    uint32_t pair[2];
    IGRAD_CHECK(take(c, magic, 8, "the magic"));
    IGRAD_FAIL_IF(memcmp(magic, STATE_MAGIC, 8) != 0, IGRAD_E_FORMAT,
                  "%s: not an igrad engine state file (bad magic)", c->name);
    IGRAD_CHECK(take(c, pair, 8, "the header"));
    IGRAD_FAIL_IF(pair[0] != STATE_VERSION, IGRAD_E_FORMAT,
                  "%s: state file version %u (this igrad reads %u%s)", c->name, pair[0],
                  STATE_VERSION,
                  pair[0] == STATE_VERSION - 1
                      ? ": version 10 added the sparse all-reduce's split points, without "
                        "which a resumed run could not continue exactly; resume with the igrad "
                        "that saved it, or start a new run from the model's parameters"
                      : "");
    v->rank = pair[1];
    IGRAD_CHECK(take(c, pair, 8, "the header"));
    v->size = pair[0];
    IGRAD_FAIL_IF(pair[1] != IGRAD__NITEMS, IGRAD_E_MISMATCH,
                  "%s: state file has %u agreement items, this igrad %d (saved by another "
                  "version)",
                  c->name, pair[1], IGRAD__NITEMS);
    IGRAD_CHECK(take(c, v->items, sizeof v->items, "the agreement items"));
    uint64_t u;
    IGRAD_CHECK(take_u64(c, &u, "the step"));
    v->step = (int64_t)u;
    IGRAD_CHECK(take_u64(c, &u, "the step count"));
    v->calls = (int64_t)u;
    IGRAD_CHECK(take_u64(c, &v->ntensors, "the tensor count"));
    IGRAD_CHECK(take_u64(c, &v->residual_count, "the residual count"));

    for (int i = 0; i < IGRAD__NITEMS; i++) {
        if (!igrad__items[i].in_state || v->items[i] == e->items[i]) continue;
        char a[64], b[64];
        igrad__item_format(i, v->items[i], a, sizeof a);
        igrad__item_format(i, e->items[i], b, sizeof b);
        return igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                           "%s: %s differs: the state file has %s, this engine %s", c->name,
                           igrad__items[i].name, a, b);
    }
    IGRAD_FAIL_IF(v->size != (uint32_t)e->plan.nranks || v->rank != (uint32_t)e->plan.rank,
                  IGRAD_E_MISMATCH, "%s: state of rank %u of %u, loaded on rank %d of %d", c->name,
                  v->rank, v->size, e->plan.rank, e->plan.nranks);
    IGRAD_FAIL_IF(
        v->ntensors != e->plan.ntensors || v->residual_count != (uint64_t)e->mem.residual_count,
        IGRAD_E_FORMAT, "%s: %llu tensors with %llu residual entries, the engine has %zu with %lld",
        c->name, (unsigned long long)v->ntensors, (unsigned long long)v->residual_count,
        e->plan.ntensors, (long long)e->mem.residual_count);
    return IGRAD_OK;
}

/* The header repeats step, calls and the history hash inside the items;
 * a file whose copies disagree was not written by igrad_engine_save_state
 * (or was edited and its checksum recomputed), so it is refused by name. */
static igrad_status_t check_duplicates(const cursor_t *c, const state_view_t *v)
{
    IGRAD_FAIL_IF(v->step < -1 || v->calls < 0, IGRAD_E_FORMAT,
                  "%s: step %lld, step count %lld", c->name, (long long)v->step,
                  (long long)v->calls);
    IGRAD_FAIL_IF(v->items[IGRAD__ITEM_STEP] != (uint64_t)v->step, IGRAD_E_FORMAT,
                  "%s: the step differs from its copy in the items (%lld vs %lld): corrupt "
                  "state file",
                  c->name, (long long)v->step, (long long)v->items[IGRAD__ITEM_STEP]);
    IGRAD_FAIL_IF(v->items[IGRAD__ITEM_CALLS] != (uint64_t)v->calls, IGRAD_E_FORMAT,
                  "%s: the step count differs from its copy in the items (%lld vs %lld): "
                  "corrupt state file",
                  c->name, (long long)v->calls, (long long)v->items[IGRAD__ITEM_CALLS]);
    int64_t ve = (int64_t)v->items[IGRAD__ITEM_CFG_VERIFY_EVERY];
    IGRAD_FAIL_IF(ve < 0, IGRAD_E_FORMAT,
                  "%s: config.verify_every is %lld in the state file: corrupt state file",
                  c->name, (long long)ve);
    return IGRAD_OK;
}

/* The history section: count and keys equal to the engine's, values
 * copied out, and the hash in the items recomputed from them. */
static igrad_status_t parse_history(const igrad_engine_t *e, cursor_t *c, state_view_t *v)
{
    IGRAD_CHECK(take_u64(c, &v->hist_count, "the history count"));
    IGRAD_FAIL_IF(v->hist_count != e->plan.hist.count, IGRAD_E_MISMATCH,
                  "%s: risk history of %llu blocks, this engine has %zu", c->name,
                  (unsigned long long)v->hist_count, e->plan.hist.count);
    size_t hc = (size_t)v->hist_count;
    IGRAD_CHECK(need(c, 32 * (uint64_t)hc, "the history"));
    v->hist.count = hc;
    if (hc) {
        v->hist.key = malloc(hc * sizeof *v->hist.key);
        v->hist.n = malloc(hc * sizeof *v->hist.n);
        v->hist.mean = malloc(hc * sizeof *v->hist.mean);
        v->hist.m2 = malloc(hc * sizeof *v->hist.m2);
        IGRAD_FAIL_IF(!v->hist.key || !v->hist.n || !v->hist.mean || !v->hist.m2,
                      IGRAD_E_NOMEM, "%s: out of memory for the risk history", c->name);
        IGRAD_CHECK(take(c, v->hist.key, hc * 8, "the history keys"));
        IGRAD_FAIL_IF(memcmp(v->hist.key, e->plan.hist.key, hc * 8) != 0, IGRAD_E_MISMATCH,
                      "%s: the risk history has other blocks than this engine", c->name);
        IGRAD_CHECK(take(c, v->hist.n, hc * 8, "the history"));
        IGRAD_CHECK(take(c, v->hist.mean, hc * 8, "the history"));
        IGRAD_CHECK(take(c, v->hist.m2, hc * 8, "the history"));
        for (size_t i = 0; i < hc; i++)
            IGRAD_FAIL_IF(v->hist.n[i] < 0, IGRAD_E_FORMAT,
                          "%s: risk history block %zu has %lld observations: corrupt state "
                          "file",
                          c->name, i, (long long)v->hist.n[i]);
    }
    uint64_t h = igrad__pack_history_hash(IGRAD__HASH_SEED, &v->hist);
    IGRAD_FAIL_IF(h != v->items[IGRAD__ITEM_HISTORY], IGRAD_E_FORMAT,
                  "%s: the risk history hash differs from its copy in the items (0x%016llx vs "
                  "0x%016llx): corrupt state file",
                  c->name, (unsigned long long)h,
                  (unsigned long long)v->items[IGRAD__ITEM_HISTORY]);
    return IGRAD_OK;
}

static uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The sparse all-reduce's section (put_sar) must be what a run of this
 * engine could have written: its slots, and per entry either zeros or
 * split points 0 = s_0 <= ... <= s_P = D with 0 < D <= 2^32, stored at a
 * stamp > 0 that no other entry of the slot has. */
static igrad_status_t check_sar(const igrad_engine_t *e, const unsigned char *p,
                                const char *name)
{
    const uint64_t S = sar_slots(e), P = (uint64_t)e->plan.nranks, E = sar_entry_nbytes(e);
    IGRAD_FAIL_IF(rd64(p) != S, IGRAD_E_MISMATCH,
                  "%s: split points of %llu sparse all-reduce bucket slots, this engine has "
                  "%llu: corrupt state file",
                  name, (unsigned long long)rd64(p), (unsigned long long)S);
    for (uint64_t j = 0; j < S; j++)
        for (uint64_t i = 0; i < IGRAD__SAR_MEMO; i++) {
            const unsigned char *q = p + 8 + (j * IGRAD__SAR_MEMO + i) * E;
            uint64_t D = rd64(q), key = rd64(q + 8), stamp = rd64(q + 16);
            int ok = D <= (UINT64_C(1) << 32) && (D == 0) == (stamp == 0) && (D || !key);
            for (uint64_t r = 0; r <= P && ok; r++) {
                uint64_t x = rd64(q + 24 + 8 * r);
                ok = D == 0 ? x == 0
                            : (r == 0 ? x == 0 : x >= rd64(q + 16 + 8 * r)) && (r < P || x == D);
            }
            for (uint64_t i2 = 0; i2 < i && ok && stamp; i2++)
                ok = rd64(p + 8 + (j * IGRAD__SAR_MEMO + i2) * E + 16) != stamp;
            IGRAD_FAIL_IF(!ok, IGRAD_E_FORMAT,
                          "%s: the sparse all-reduce's split points of bucket slot %llu, entry "
                          "%llu, are not ordered points of [0, %llu] stored once: corrupt "
                          "state file",
                          name, (unsigned long long)j, (unsigned long long)i,
                          (unsigned long long)D);
        }
    return IGRAD_OK;
}

/* Room for the split points the section holds, in e's bucket slots (the
 * workspace only grows; the points are set after the ranks agreed). */
static igrad_status_t reserve_sar(igrad_engine_t *e, const unsigned char *p)
{
    const uint64_t S = sar_slots(e), P = (uint64_t)e->plan.nranks, E = sar_entry_nbytes(e);
    for (uint64_t j = 0; j < S; j++)
        for (uint64_t i = 0; i < IGRAD__SAR_MEMO; i++)
            if (rd64(p + 8 + (j * IGRAD__SAR_MEMO + i) * E) != 0)
                IGRAD_CHECK(igrad__sar_reserve_points(&e->step.sar[j], (int)P));
    return IGRAD_OK;
}

static void apply_sar(igrad_engine_t *e, const unsigned char *p)
{
    const uint64_t S = sar_slots(e), P = (uint64_t)e->plan.nranks, E = sar_entry_nbytes(e);
    for (uint64_t j = 0; j < S; j++) {
        int any = 0;
        for (uint64_t i = 0; i < IGRAD__SAR_MEMO; i++)
            any |= rd64(p + 8 + (j * IGRAD__SAR_MEMO + i) * E) != 0;
        if (!any) { /* nothing kept: equal ranges next, no memory asked for */
            e->step.sar[j].next_valid = 0;
            continue;
        }
        for (uint64_t i = 0; i < IGRAD__SAR_MEMO; i++) {
            const unsigned char *q = p + 8 + (j * IGRAD__SAR_MEMO + i) * E;
            uint64_t D = rd64(q);
            igrad__sar_memo_set(&e->step.sar[j], (int)P, (int)i, D, rd64(q + 8), rd64(q + 16),
                                D ? q + 24 : NULL);
        }
    }
}

/* Verifies all of the bytes; touches nothing of the engine. */
static igrad_status_t verify_state(const igrad_engine_t *e, const unsigned char *bytes,
                                   size_t nbytes, const char *name, uint64_t online_nbytes,
                                   state_view_t *v)
{
    cursor_t c = {bytes, nbytes, 0, name};
    IGRAD_CHECK(parse_header(e, &c, v));
    /* From here the size is known: check it whole before hashing. */
    uint64_t want = base_nbytes(e) + online_nbytes;
    uint64_t rbytes = residual_section_nbytes(v->residual_count);
    IGRAD_CHECK(need(&c, rbytes, "the residuals"));
    IGRAD_CHECK(need(&c, rbytes + 8, "the velocity count"));
    uint64_t vcount;
    memcpy(&vcount, bytes + c.pos + rbytes, 8);
    IGRAD_FAIL_IF(vcount != (uint64_t)e->mem.velocity_count, IGRAD_E_FORMAT,
                  "%s: %llu velocity entries, the engine has %lld", name,
                  (unsigned long long)vcount, (long long)e->mem.velocity_count);
    uint64_t vbytes = residual_section_nbytes(vcount);
    IGRAD_CHECK(need(&c, rbytes + 8 + vbytes, "the velocities"));
    IGRAD_CHECK(need(&c, rbytes + 8 + vbytes + 8, "the history count"));
    uint64_t sarb = sar_nbytes(e);
    IGRAD_CHECK(need(&c, want - 8 - sarb - online_nbytes - c.pos, "the history"));
    IGRAD_CHECK(need(&c, want - 8 - sarb - c.pos, "the online profiling section"));
    IGRAD_CHECK(need(&c, want - 8 - c.pos, "the sparse all-reduce's split points"));
    IGRAD_CHECK(need(&c, want - c.pos, "the checksum"));
    IGRAD_FAIL_IF(nbytes > want, IGRAD_E_FORMAT, "%s: unexpected bytes after the checksum",
                  name);
    uint64_t sum, h = hash_words(IGRAD__HASH_SEED, bytes, (size_t)want - 8);
    memcpy(&sum, bytes + want - 8, 8);
    IGRAD_FAIL_IF(sum != h, IGRAD_E_FORMAT,
                  "%s: checksum mismatch (file 0x%016llx, computed 0x%016llx): corrupt state "
                  "file",
                  name, (unsigned long long)sum, (unsigned long long)h);
    IGRAD_CHECK(check_duplicates(&c, v));
    v->residual_off = c.pos;
    size_t rc = (size_t)v->residual_count;
    if (rc & 1) {
        static const unsigned char zero[4];
        IGRAD_FAIL_IF(memcmp(bytes + c.pos + 4 * rc, zero, 4) != 0, IGRAD_E_FORMAT,
                      "%s: the residual padding is not zero: corrupt state file", name);
    }
    c.pos += (size_t)rbytes + 8;
    v->velocity_count = vcount;
    v->velocity_off = c.pos;
    if (vcount & 1) {
        static const unsigned char zero[4];
        IGRAD_FAIL_IF(memcmp(bytes + c.pos + 4 * vcount, zero, 4) != 0, IGRAD_E_FORMAT,
                      "%s: the velocity padding is not zero: corrupt state file", name);
    }
    c.pos += (size_t)vbytes;
    IGRAD_CHECK(parse_history(e, &c, v));
    v->sar_off = (size_t)(want - 8 - sarb);
    return check_sar(e, bytes + v->sar_off, name);
}

/* The online section, found without the plan (its offset follows from the
 * counts in the file). Sizes that do not fit leave mode NONE, so that
 * verify_state names what is truncated; a profile section is parsed
 * (strictly, against the layout) because the plan to verify against is
 * built from it. */
typedef struct online_view {
    uint64_t mode, nbytes;        /* section mode and size */
    uint64_t nrec;                /* WINDOW; PROFILE with re-profiling */
    size_t win_off;               /* WINDOW: offset of the steps */
    int64_t switch_step, replans; /* PROFILE */
    igrad_profile_t *profile;     /* PROFILE, parsed */
    size_t rep_off;               /* PROFILE with re-profiling: offset of its section */
    uint64_t fixed;               /* its classes came from the hysteresis */
} online_view_t;

static igrad_status_t locate_online(const igrad_engine_t *e, const unsigned char *bytes,
                                    size_t nbytes, const char *name, online_view_t *ov)
{
    memset(ov, 0, sizeof *ov);
    ov->nbytes = 8;
    if (nbytes < HEADER_NBYTES) return IGRAD_OK;
    uint64_t rc = rd64(bytes + HEADER_NBYTES - 8);
    if (rc != (uint64_t)e->mem.residual_count) return IGRAD_OK;
    uint64_t off = HEADER_NBYTES + residual_section_nbytes(rc);
    if (off + 8 > nbytes) return IGRAD_OK;
    uint64_t vc = rd64(bytes + off); /* the velocity section */
    if (vc != (uint64_t)e->mem.velocity_count) return IGRAD_OK;
    off += 8 + residual_section_nbytes(vc);
    if (off + 8 > nbytes) return IGRAD_OK;
    uint64_t hc = rd64(bytes + off);
    if (hc > nbytes / 32) return IGRAD_OK;
    off += 8 + 32 * hc;
    if (off + 8 > nbytes) return IGRAD_OK;
    uint64_t mode = rd64(bytes + off);
    if (mode == ONLINE_WINDOW) {
        int64_t W = e->plan.cfg.profile_steps;
        ov->mode = mode;
        ov->nbytes = 8 + 8 + 8 * (uint64_t)W + 16 * (uint64_t)W * e->plan.ntensors;
        if (off + 16 <= nbytes) ov->nrec = rd64(bytes + off + 8);
        ov->win_off = (size_t)off + 16;
        return IGRAD_OK;
    }
    if (mode != ONLINE_PROFILE) {
        /* ONLINE_NONE, or a bad mode that verify_state's checksum or the
         * mode check after it refuses */
        ov->mode = mode;
        return IGRAD_OK;
    }
    IGRAD_FAIL_IF(!e->online, IGRAD_E_MISMATCH,
                  "%s: the state file holds a re-planned profile, but method %s uses none", name,
                  igrad_method_name(e->plan.cfg.method));
    IGRAD_FAIL_IF(off + 32 > nbytes, IGRAD_E_FORMAT,
                  "%s: truncated state file (inside the online profiling section)", name);
    ov->mode = mode;
    ov->switch_step = (int64_t)rd64(bytes + off + 8);
    ov->replans = (int64_t)rd64(bytes + off + 16);
    uint64_t len = rd64(bytes + off + 24);
    IGRAD_FAIL_IF(len == 0 || len > STATE_PROFILE_MAX_NBYTES || len > nbytes - off - 32,
                  IGRAD_E_FORMAT, "%s: the online profile is %llu bytes (corrupt or truncated "
                  "state file)",
                  name, (unsigned long long)len);
    uint64_t padded = (len + 7) & ~(uint64_t)7;
    IGRAD_FAIL_IF(padded > nbytes - off - 32, IGRAD_E_FORMAT,
                  "%s: truncated state file (inside the online profile)", name);
    for (uint64_t i = len; i < padded; i++)
        IGRAD_FAIL_IF(bytes[off + 32 + i] != 0, IGRAD_E_FORMAT,
                      "%s: the online profile's padding is not zero: corrupt state file", name);
    ov->nbytes = 32 + padded;
    uint64_t rep = reprofile_nbytes(e);
    if (rep) { /* one that does not fit: verify_state names what is short */
        uint64_t at = off + 32 + padded;
        ov->nbytes += rep;
        if (rep <= nbytes - at && nbytes - at - rep >= 8) {
            ov->rep_off = (size_t)at;
            ov->fixed = rd64(bytes + at);
            ov->nrec = rd64(bytes + at + 32);
        }
    }
    char src[300];
    snprintf(src, sizeof src, "%s (online profile)", name);
    return igrad__profile_from_json_text((const char *)bytes + off + 32, (size_t)len, src,
                                         e->online->layout, &ov->profile);
}

/* The window's records must be what a run could have written. */
static igrad_status_t check_window(const igrad_engine_t *e, const unsigned char *bytes,
                                   const online_view_t *ov, const char *name)
{
    int64_t W = e->plan.cfg.profile_steps;
    IGRAD_FAIL_IF(ov->nrec > (uint64_t)W, IGRAD_E_FORMAT,
                  "%s: the online window has %llu records of %lld: corrupt state file", name,
                  (unsigned long long)ov->nrec, (long long)W);
    const unsigned char *p = bytes + ov->win_off;
    for (uint64_t s = 1; s < ov->nrec; s++)
        IGRAD_FAIL_IF((int64_t)rd64(p + 8 * s) <= (int64_t)rd64(p + 8 * (s - 1)), IGRAD_E_FORMAT,
                      "%s: the online window's steps do not increase: corrupt state file",
                      name);
    size_t T = e->plan.ntensors;
    const unsigned char *sq = p + 8 * (size_t)W, *cnt = sq + 8 * (size_t)W * T;
    for (size_t k = 0; k < (size_t)ov->nrec * T; k++) {
        double v;
        memcpy(&v, sq + 8 * k, 8);
        IGRAD_FAIL_IF(!(v >= 0.0 && v <= DBL_MAX) || (int64_t)rd64(cnt + 8 * k) < 0,
                      IGRAD_E_FORMAT,
                      "%s: online window record %zu of tensor %zu is not a selection "
                      "(sum of squares %g, count %lld): corrupt state file",
                      name, k / T, k % T, v, (long long)rd64(cnt + 8 * k));
    }
    return IGRAD_OK;
}

/* The re-profiling section must be what a run could have written. */
static igrad_status_t check_reprofile(const igrad_engine_t *e, const unsigned char *bytes,
                                      const online_view_t *ov, const char *name)
{
    const unsigned char *p = bytes + ov->rep_off;
    size_t T = e->plan.ntensors, Wr = (size_t)e->plan.cfg.reprofile_every;
    size_t npend = igrad_layout_component_count(e->online->layout);
    IGRAD_FAIL_IF(ov->fixed > 1 || (int64_t)rd64(p + 8) < 0 || (int64_t)rd64(p + 16) < 0 ||
                      rd64(p + 16) > rd64(p + 8) || (int64_t)rd64(p + 24) < 0 ||
                      ov->nrec > (uint64_t)Wr,
                  IGRAD_E_FORMAT,
                  "%s: the re-profiling counters are not a run's (classes flag %llu, %lld "
                  "re-profiles, %lld re-plans, %llu of %zu records): corrupt state file",
                  name, (unsigned long long)ov->fixed, (long long)rd64(p + 8),
                  (long long)rd64(p + 16), (unsigned long long)ov->nrec, Wr);
    const unsigned char *steps = p + 40, *sq = steps + 8 * Wr, *cnt = sq + 8 * Wr * T;
    const unsigned char *held = cnt + 8 * Wr * T, *hcnt = held + 8 * T, *last = hcnt + 8 * T;
    const unsigned char *pend = last + 8 * T;
    for (uint64_t s = 1; s < ov->nrec; s++)
        IGRAD_FAIL_IF((int64_t)rd64(steps + 8 * s) <= (int64_t)rd64(steps + 8 * (s - 1)),
                      IGRAD_E_FORMAT,
                      "%s: the re-profiling window's steps do not increase: corrupt state file",
                      name);
    for (size_t k = 0; k < (size_t)ov->nrec * T + T; k++) {
        int rec = k < (size_t)ov->nrec * T;
        double v;
        memcpy(&v, rec ? sq + 8 * k : held + 8 * (k - (size_t)ov->nrec * T), 8);
        int64_t c = (int64_t)rd64(rec ? cnt + 8 * k : hcnt + 8 * (k - (size_t)ov->nrec * T));
        IGRAD_FAIL_IF(!(v >= 0.0 && v <= DBL_MAX) || c < 0, IGRAD_E_FORMAT,
                      "%s: re-profiling %s %zu is not a selection (sum of squares %g, count "
                      "%lld): corrupt state file",
                      name, rec ? "record" : "held tensor",
                      rec ? k : k - (size_t)ov->nrec * T, v, (long long)c);
    }
    for (size_t t = 0; t < T; t++)
        IGRAD_FAIL_IF((int64_t)rd64(last + 8 * t) < -1, IGRAD_E_FORMAT,
                      "%s: tensor %zu's last selection is at step %lld: corrupt state file",
                      name, t, (long long)rd64(last + 8 * t));
    for (size_t i = 0; i < ((npend + 7) & ~(size_t)7); i++)
        IGRAD_FAIL_IF(i < npend ? pend[i] > 1 : pend[i] != 0, IGRAD_E_FORMAT,
                      "%s: hysteresis flag %zu is %u: corrupt state file", name, i,
                      (unsigned)pend[i]);
    return IGRAD_OK;
}

static void apply_reprofile(igrad_engine_t *e, const unsigned char *bytes,
                            const online_view_t *ov)
{
    igrad__online_t *on = e->online;
    const unsigned char *p = bytes + ov->rep_off;
    size_t T = e->plan.ntensors, Wr = (size_t)on->Wr;
    on->fixed = (int)ov->fixed;
    on->reprofiles = (int64_t)rd64(p + 8);
    on->reprofile_replans = (int64_t)rd64(p + 16);
    on->last_flips = (int64_t)rd64(p + 24);
    on->nrec = (size_t)ov->nrec;
    p += 40;
    memcpy(on->steps, p, Wr * 8);
    memcpy(on->sumsq, p + Wr * 8, Wr * T * 8);
    memcpy(on->count, p + Wr * 8 + Wr * T * 8, Wr * T * 8);
    p += Wr * 8 + 2 * Wr * T * 8;
    memcpy(on->held, p, T * 8);
    memcpy(on->held_count, p + T * 8, T * 8);
    memcpy(on->last_sel, p + 2 * T * 8, T * 8);
    memcpy(on->pending, p + 3 * T * 8, on->npend);
}

igrad_status_t igrad__engine_state_load_bytes(igrad_engine_t *e, const unsigned char *bytes,
                                              size_t nbytes, const char *name)
{
    state_view_t v;
    memset(&v, 0, sizeof v);
    online_view_t ov;
    igrad_engine_t *n = NULL; /* the plan of the file's profile */
    igrad_status_t st = locate_online(e, bytes, nbytes, name, &ov);
    if (st == IGRAD_OK && ov.profile && ov.fixed > 1)
        st = igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                         "%s: re-profiling classes flag %llu: corrupt state file", name,
                         (unsigned long long)ov.fixed);
    if (st == IGRAD_OK && ov.profile)
        st = igrad__online_prepare(e, ov.profile, (int)ov.fixed, &n);
    igrad_engine_t *target = n ? n : e;
    if (st == IGRAD_OK) st = verify_state(target, bytes, nbytes, name, ov.nbytes, &v);
    if (st == IGRAD_OK) {
        int active = e->online && e->online->active;
        if (ov.mode == ONLINE_WINDOW && !active)
            st = igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                             "%s: the state file is of a run still profiling online, this "
                             "engine is not profiling",
                             name);
        else if (ov.mode == ONLINE_NONE && active)
            st = igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                             "%s: no online profiling section, but the engine profiles online "
                             "with the same config: corrupt state file",
                             name);
        else if (ov.mode > ONLINE_PROFILE)
            st = igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                             "%s: online section mode %llu: corrupt state file", name,
                             (unsigned long long)ov.mode);
        else if (ov.mode == ONLINE_WINDOW)
            st = check_window(e, bytes, &ov, name);
        else if (ov.rep_off)
            st = check_reprofile(e, bytes, &ov, name);
        uint64_t copy = ov.mode == ONLINE_WINDOW || ov.rep_off ? ov.nrec : (uint64_t)-1;
        if (st == IGRAD_OK && v.items[IGRAD__ITEM_ONLINE] != copy)
            st = igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                             "%s: the online record count differs from its copy in the items "
                             "(%lld vs %lld): corrupt state file",
                             name, (long long)copy, (long long)v.items[IGRAD__ITEM_ONLINE]);
        if (st == IGRAD_OK) st = reserve_sar(target, bytes + v.sar_off);
    }
    char msg[1024] = "";
    if (st != IGRAD_OK) snprintf(msg, sizeof msg, "%s", igrad_last_error());

    /* Every rank's file must be good and from the same point of the run. */
    uint64_t items[IGRAD__NITEMS];
    memcpy(items, target->items, sizeof items);
    items[IGRAD__ITEM_STEP] = st == IGRAD_OK ? (uint64_t)v.step : 0;
    items[IGRAD__ITEM_CALLS] = st == IGRAD_OK ? (uint64_t)v.calls : 0;
    items[IGRAD__ITEM_HISTORY] = st == IGRAD_OK ? v.items[IGRAD__ITEM_HISTORY] : 0;
    items[IGRAD__ITEM_ONLINE] = ov.mode == ONLINE_WINDOW || ov.rep_off ? ov.nrec : (uint64_t)-1;
    igrad_status_t ag = igrad__engine_agree(e, e->comm, e->plan.nranks, e->agree_buf, st, -1, msg,
                                            items, 1, "load state");
    if (ag != IGRAD_OK) {
        view_free(&v);
        igrad_engine_free(n);
        igrad_profile_free(ov.profile);
        return ag;
    }

    /* Verified here and everywhere: apply, from the same bytes. */
    if (n) {
        igrad__online_commit(e, n, ov.profile); /* e now plans with the file's profile */
        e->online->switch_step = ov.switch_step;
        e->online->replans = ov.replans;
        if (ov.rep_off) apply_reprofile(e, bytes, &ov);
    }
    if (ov.mode == ONLINE_WINDOW) {
        igrad__online_t *on = e->online;
        size_t W = (size_t)on->W, WT = W * e->plan.ntensors;
        const unsigned char *p = bytes + ov.win_off;
        on->nrec = (size_t)ov.nrec;
        memcpy(on->steps, p, W * 8);
        memcpy(on->sumsq, p + W * 8, WT * 8);
        memcpy(on->count, p + W * 8 + WT * 8, WT * 8);
    }
    apply_sar(e, bytes + v.sar_off); /* e's bucket slots are target's now */
    if (e->mem.residual_count)
        e->mem.dp->copy_in(e->mem.residual_mem, bytes + v.residual_off,
                           4 * (size_t)e->mem.residual_count);
    if (e->mem.velocity_count)
        e->mem.dp->copy_in(e->mem.velocity_mem, bytes + v.velocity_off,
                           4 * (size_t)e->mem.velocity_count);
    size_t hc = v.hist.count;
    if (hc) {
        memcpy(e->plan.hist.n, v.hist.n, hc * sizeof *v.hist.n);
        memcpy(e->plan.hist.mean, v.hist.mean, hc * sizeof *v.hist.mean);
        memcpy(e->plan.hist.m2, v.hist.m2, hc * sizeof *v.hist.m2);
    }
    e->last_step = v.step;
    e->calls = v.calls;
    igrad__engine_dynamic_items(e, v.step);
    view_free(&v);
    return IGRAD_OK;
}

/* Reads the file in one pass: as many bytes as this engine's state file
 * has, plus one to notice trailing bytes. A file of another size is still
 * read (up to that bound) so that verification can say why it is wrong. */
static igrad_status_t read_once(const igrad_engine_t *e, const char *path, unsigned char **out,
                                size_t *nbytes)
{
    *out = NULL;
    *nbytes = 0;
    /* the online section may hold a profile of any size up to the limit */
    uint64_t cap64 = base_nbytes(e) + window_nbytes(e) + 32 + STATE_PROFILE_MAX_NBYTES +
                     reprofile_nbytes(e) + 1;
    IGRAD_FAIL_IF(cap64 > SIZE_MAX, IGRAD_E_NOMEM, "%s: state file too large", path);
    size_t cap = (size_t)cap64;
    unsigned char *buf = malloc(cap);
    IGRAD_FAIL_IF(!buf, IGRAD_E_NOMEM, "%s: out of memory for %zu bytes of state", path, cap);
    /* Not igrad__open_regular: a state file is read once, in one pass,
     * from whatever is at the path (tests/test_engine_state.c reads one
     * through a FIFO to show that a file replaced meanwhile is never mixed
     * in). */
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        free(buf);
        return igrad__fail(IGRAD_E_IO, __FILE__, __LINE__, "%s: cannot open the state file",
                           path);
    }
    size_t got = 0;
    while (got < cap) {
        size_t want = cap - got < CHUNK_NBYTES ? cap - got : CHUNK_NBYTES;
        size_t n = fread(buf + got, 1, want, fp);
        got += n;
        if (n < want) break;
    }
    int err = ferror(fp);
    fclose(fp);
    if (err) {
        free(buf);
        return igrad__fail(IGRAD_E_IO, __FILE__, __LINE__, "%s: read error", path);
    }
    *out = buf;
    *nbytes = got;
    return IGRAD_OK;
}

igrad_status_t igrad__flat_load_state(igrad_engine_t *engine, const char *path)
{
    IGRAD_CHECK(igrad__engine_usable(engine, "igrad_engine_load_state"));
    igrad_engine_t *e = engine;
    unsigned char *bytes = NULL;
    size_t nbytes = 0;
    igrad_status_t st;
    if (!path) st = igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                                "igrad_engine_load_state: path is NULL");
    else if (e->state != IGRAD__ENGINE_IDLE)
        st = igrad__fail(IGRAD_E_STATE, __FILE__, __LINE__,
                         "igrad_engine_load_state: step %lld is open", (long long)e->step.cur_step);
    else st = read_once(e, path, &bytes, &nbytes);
    if (st != IGRAD_OK) {
        /* Still collective: the other ranks wait in the agreement. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", igrad_last_error());
        uint64_t items[IGRAD__NITEMS];
        memcpy(items, e->items, sizeof items);
        items[IGRAD__ITEM_STEP] = items[IGRAD__ITEM_CALLS] = items[IGRAD__ITEM_HISTORY] = 0;
        return igrad__engine_agree(e, e->comm, e->plan.nranks, e->agree_buf, st, -1, msg, items, 1,
                                   "load state");
    }
    st = igrad__engine_state_load_bytes(e, bytes, nbytes, path);
    free(bytes);
    return st;
}

igrad_status_t igrad__engine_state_topology(const char *path, int nranks, int L, int N,
                                            igrad_status_t st)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", igrad_last_error());
    /* the header only (magic, version, rank, size), from a regular file:
     * for the message, the load itself read the file once already */
    FILE *fp = NULL;
    uint64_t nbytes = 0;
    unsigned char head[20];
    int have = 0;
    if (igrad__open_regular(path, &fp, &nbytes) == IGRAD_OK) {
        have = fread(head, 1, sizeof head, fp) == sizeof head;
        fclose(fp);
    }
    uint32_t version = 0, size = 0;
    if (have) {
        memcpy(&version, head + 8, 4);
        memcpy(&size, head + 16, 4);
    }
    if (!have || memcmp(head, STATE_MAGIC, 8) != 0 || version != STATE_VERSION || size == 0 ||
        size == (uint32_t)N)
        return igrad__fail(st, __FILE__, __LINE__, "%s", msg);
    char theirs[96];
    if (nranks % (int64_t)size == 0)
        snprintf(theirs, sizeof theirs, "%u nodes, config.ranks_per_node %lld%s", size,
                 (long long)(nranks / (int64_t)size),
                 nranks / (int64_t)size == 1 ? " (or a flat engine)" : "");
    else snprintf(theirs, sizeof theirs, "%u nodes (not of %d ranks)", size, nranks);
    return igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                       "load state: the topology differs: %s holds a shard of %s, this "
                       "config.topology hier engine has %d nodes, config.ranks_per_node %d (%d "
                       "ranks); a state file loads only with the ranks per node it was saved "
                       "with (the shard's check: %s)",
                       path, theirs, N, L, nranks, msg);
}
