/*
 * fuzz_engine_state.c — fuzz target for the engine state loader
 * (igrad__engine_state_load_bytes, src/engine_state.c: everything
 * igrad_engine_load_state does after reading the file) on one engine over
 * the self communicator: two tensors of 72 and 5 entries (odd: the file
 * has padding), risk packing (the file has a history). A second engine
 * over the same layout runs ig with online profiling and re-profiling
 * (profile_steps 2, reprofile_every 2, R 2), so that files with the online
 * profile and the re-profiling section reach their parsers.
 *
 * Input: one mode byte, then the file. Mode bit 0 set: the harness first
 * recomputes the checksum (FNV-1a over the 64-bit words before the last 8
 * bytes, docs/formats.md §7) and writes it into the last 8 bytes, so
 * mutations get past the checksum to the field checks; the library itself
 * has no such switch. Mode bit 1 set: the file goes to the re-profiling
 * engine.
 *
 * Invariants: no crash; status OK, FORMAT, MISMATCH or NOMEM; a refused
 * file leaves residuals, step and history as they were (bit for bit); a
 * loaded file sets the residuals to the file's and, saved again, gives the
 * same bytes except config.verify_every (the engine's own, not the file's)
 * — for the re-profiling engine, whose file holds a profile as JSON text,
 * saved again gives a file that loads and saves back to itself;
 * the same input twice gives the same status and message. After a load
 * the engine is put back to its base state, so every input starts alike.
 * IGRAD_FUZZ_VERBOSE=1 prints each input's outcome (which check refused it).
 * The driver is tests/fuzz_main.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_state.h"

int igrad_fuzz_one(const uint8_t *data, size_t size);
const char *igrad_fuzz_name(void);
size_t igrad_fuzz_seed_count(void);
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size);

#define NRES 77
#define OFF_RESIDUALS (24 + 8 * IGRAD__NITEMS + 32)
#define OFF_VERIFY_EVERY (24 + 8 * IGRAD__ITEM_CFG_VERIFY_EVERY)
#define OFF_TIMEOUT (24 + 8 * IGRAD__ITEM_CFG_TIMEOUT)

/* The two engines (mode bit 1) and their state files after the warm-up. */
typedef struct target {
    igrad_engine_t *eng;
    uint8_t *base;
    size_t base_n;
} target_t;

#define NSEEDS 6
static target_t tg[2];
static igrad_engine_t *eng; /* the engine of the input being run */
static uint8_t *seed_buf[NSEEDS];
static size_t seed_n[NSEEDS];
static char tmp_path[256];

static uint64_t fnv_words(const uint8_t *p, size_t nbytes)
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

static void put_checksum(uint8_t *p, size_t n)
{
    if (n < 8) return;
    uint64_t h = fnv_words(p, n - 8);
    for (int b = 0; b < 8; b++) p[n - 8 + (size_t)b] = (uint8_t)(h >> (8 * b));
}

static int read_whole(const char *path, uint8_t **out, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return -1;
    uint8_t *buf = malloc(1 << 16);
    size_t got = buf ? fread(buf, 1, 1 << 16, fp) : 0;
    fclose(fp);
    if (!buf) return -1;
    *out = buf;
    *n = got;
    return 0;
}

static void die(const char *what)
{
    fprintf(stderr, "fuzz_engine_state: setup failed: %s: %s\n", what, igrad_last_error());
    abort();
}

static void gradients(int64_t s, float *g0, float *g1)
{
    for (int i = 0; i < 72; i++) g0[i] = (float)((i * 37 + s * 11) % 23 - 11);
    for (int i = 0; i < 5; i++) g1[i] = (float)(i + 1) * (s % 2 ? -1.f : 1.f);
}

/* Runs target t for 7 steps, saving the states after the steps in `at`
 * (ascending, the last one 7: the base) as seeds k, k + 1, ... */
static void warm_up(target_t *t, const int64_t *at, size_t nat, uint8_t mode_bits, int *k)
{
    float g0[72], g1[5];
    float *g[2] = {g0, g1};
    size_t next = 0;
    for (int64_t s = 0; s <= 7; s++) {
        if (next < nat && s == at[next]) {
            next++;
            if (igrad_engine_save_state(t->eng, tmp_path) != IGRAD_OK) die("save");
            uint8_t *f;
            size_t n;
            if (read_whole(tmp_path, &f, &n) != 0) die("read back");
            seed_buf[*k] = malloc(n + 1);
            if (!seed_buf[*k]) die("malloc");
            seed_buf[*k][0] = (uint8_t)(mode_bits | (*k & 1)); /* both checksum modes */
            memcpy(seed_buf[*k] + 1, f, n);
            seed_n[*k] = n + 1;
            (*k)++;
            if (s == 7) {
                t->base = f;
                t->base_n = n;
            } else {
                free(f);
            }
        }
        if (s == 7) break;
        gradients(s, g0, g1);
        if (igrad_engine_sync(t->eng, s, g) != IGRAD_OK) die("sync");
    }
}

/* The engines and their base states, built once per process. */
static void setup(void)
{
    if (tg[0].eng) return;
    snprintf(tmp_path, sizeof tmp_path, "/tmp/igrad_fuzz_engine_state.%ld.bin", (long)getpid());
    igrad_layout_t *L = NULL;
    igrad_comm_t *comm = NULL;
    int64_t s0[2] = {8, 9}, s1[1] = {5};
    if (igrad_layout_create(&L) != IGRAD_OK ||
        igrad_layout_add(L, "model.layers.0.mlp.up_proj.weight", IGRAD_DTYPE_F32, 2, s0) !=
            IGRAD_OK ||
        igrad_layout_add(L, "model.norm.weight", IGRAD_DTYPE_F32, 1, s1) != IGRAD_OK ||
        igrad_comm_create_self(&comm) != IGRAD_OK)
        die("layout");
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.density = 0.2;
    c.pack = IGRAD_PACK_RISK;
    c.block_entries = 4;
    c.buckets = 2;
    if (igrad_engine_create(L, NULL, &c, comm, &tg[0].eng) != IGRAD_OK) die("engine");
    c.method = IGRAD_METHOD_IG;
    c.pack = IGRAD_PACK_CONTIGUOUS;
    c.release_period = 2;
    c.profile_steps = 2;
    c.profile_partition = "fixed:0.5";
    c.reprofile_every = 2;
    if (igrad_engine_create(L, NULL, &c, comm, &tg[1].eng) != IGRAD_OK) die("ig engine");
    igrad_layout_free(L); /* copied; comm lives as long as the process */

    /* Seeds: states before any step, after 1 and after 7 steps (the base);
     * of the re-profiling engine after 3 (inside a window) and 7 (its base). */
    int k = 0;
    static const int64_t at0[] = {0, 1, 7}, at1[] = {3, 7};
    warm_up(&tg[0], at0, 3, 0, &k);
    /* a 4th seed: the base file with its checksum left to the harness */
    seed_buf[3] = malloc(tg[0].base_n + 1);
    if (!seed_buf[3]) die("malloc");
    seed_buf[3][0] = 1;
    memcpy(seed_buf[3] + 1, tg[0].base, tg[0].base_n);
    memset(seed_buf[3] + 1 + tg[0].base_n - 8, 0, 8);
    seed_n[3] = tg[0].base_n + 1;
    k = 4;
    warm_up(&tg[1], at1, 2, 2, &k);
    unlink(tmp_path);
}

const char *igrad_fuzz_name(void) { return "engine_state"; }
size_t igrad_fuzz_seed_count(void) { return NSEEDS; }
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size)
{
    setup();
    *size = seed_n[i];
    return seed_buf[i];
}

/* What a refused file must leave as it was. */
typedef struct snapshot {
    float res[NRES];
    int64_t step;
    size_t hist_count;
    double hist_mean0;
    igrad_online_info_t online;
} snapshot_t;

static void take_snapshot(snapshot_t *s)
{
    size_t k = 0;
    for (size_t t = 0; t < 2; t++) {
        const float *r = igrad_engine_residual(eng, t);
        size_t n = t == 0 ? 72 : 5;
        memcpy(s->res + k, r, n * sizeof *r);
        k += n;
    }
    s->step = igrad_engine_step(eng);
    s->hist_count = eng->plan.hist.count;
    s->hist_mean0 = eng->plan.hist.count ? eng->plan.hist.mean[0] : 0;
    igrad_engine_online_info(eng, &s->online);
}

static int same_snapshot(const snapshot_t *a, const snapshot_t *b)
{
    const igrad_online_info_t *x = &a->online, *y = &b->online;
    return memcmp(a->res, b->res, sizeof a->res) == 0 && a->step == b->step &&
           a->hist_count == b->hist_count &&
           memcmp(&a->hist_mean0, &b->hist_mean0, sizeof a->hist_mean0) == 0 &&
           x->profiling == y->profiling && x->steps_recorded == y->steps_recorded &&
           x->switch_step == y->switch_step && x->replans == y->replans &&
           x->reprofiles == y->reprofiles && x->reprofile_replans == y->reprofile_replans &&
           x->last_flips == y->last_flips;
}

static int restore_base(void)
{
    const target_t *t = eng == tg[0].eng ? &tg[0] : &tg[1];
    if (igrad__engine_state_load_bytes(eng, t->base, t->base_n, "base") != IGRAD_OK) {
        fprintf(stderr, "the base state no longer loads: %s\n", igrad_last_error());
        return 1;
    }
    return 0;
}

/* A loaded file: residuals are the file's, and saving gives the file back. */
static int check_loaded(const uint8_t *file, size_t n)
{
    size_t k = 0;
    for (size_t t = 0; t < 2; t++) {
        size_t cnt = t == 0 ? 72 : 5;
        if (memcmp(igrad_engine_residual(eng, t), file + OFF_RESIDUALS + 4 * k, 4 * cnt) != 0) {
            fprintf(stderr, "loaded residuals of tensor %zu are not the file's\n", t);
            return 1;
        }
        k += cnt;
    }
    if (igrad_engine_save_state(eng, tmp_path) != IGRAD_OK) {
        fprintf(stderr, "save after load: %s\n", igrad_last_error());
        return 1;
    }
    uint8_t *back;
    size_t bn;
    if (read_whole(tmp_path, &back, &bn) != 0) return 1;
    unlink(tmp_path);
    int bad = 0;
    if (eng == tg[1].eng) {
        /* The online profile is JSON: a file whose text differs from the
         * writer's (other white space) loads to the same profile but
         * saves back canonical, so the saved file must be a fixed point. */
        uint8_t *again = NULL;
        size_t an = 0;
        bad = igrad__engine_state_load_bytes(eng, back, bn, "saved back") != IGRAD_OK ||
              igrad_engine_save_state(eng, tmp_path) != IGRAD_OK ||
              read_whole(tmp_path, &again, &an) != 0 || an != bn || memcmp(again, back, bn) != 0;
        unlink(tmp_path);
        free(again);
        if (bad) fprintf(stderr, "the saved-back state is not a fixed point: %s\n", igrad_last_error());
        free(back);
        return bad;
    }
    bad = bn != n;
    if (!bad) {
        /* verify_every and timeout_s are the engine's own (not compared at
         * load): patch them back, fix the sum */
        memcpy(back + OFF_VERIFY_EVERY, file + OFF_VERIFY_EVERY, 8);
        memcpy(back + OFF_TIMEOUT, file + OFF_TIMEOUT, 8);
        put_checksum(back, bn);
        bad = memcmp(back, file, n) != 0;
    }
    if (bad) fprintf(stderr, "loaded file saved back differs (%zu vs %zu bytes)\n", bn, n);
    free(back);
    return bad;
}

int igrad_fuzz_one(const uint8_t *data, size_t size)
{
    setup();
    if (size == 0) return 0;
    size_t n = size - 1;
    uint8_t *file = malloc(n ? n : 1);
    if (!file) return 0;
    if (n) memcpy(file, data + 1, n);
    if (data[0] & 1) put_checksum(file, n);
    eng = tg[(data[0] >> 1) & 1].eng;

    snapshot_t before, after;
    take_snapshot(&before);
    igrad_status_t st = igrad__engine_state_load_bytes(eng, file, n, "fuzz.bin");
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st == IGRAD_OK ? "" : igrad_last_error());
    if (getenv("IGRAD_FUZZ_VERBOSE")) /* which check refused it (corpus reviews) */
        fprintf(stderr, "%s\n", st == IGRAD_OK ? "loaded" : msg);
    int bad = 0;
    if (st == IGRAD_OK) {
        bad = check_loaded(file, n);
        if (!bad) bad = restore_base();
        /* the same file again: loads again */
        if (!bad && igrad__engine_state_load_bytes(eng, file, n, "fuzz.bin") != IGRAD_OK) {
            fprintf(stderr, "not deterministic: a loaded file fails the second time: %s\n",
                    igrad_last_error());
            bad = 1;
        }
        if (!bad) bad = restore_base();
    } else {
        take_snapshot(&after);
        if (!same_snapshot(&before, &after)) {
            fprintf(stderr, "a refused file (%s) changed the engine\n", msg);
            bad = 1;
        } else if (st != IGRAD_E_FORMAT && st != IGRAD_E_MISMATCH && st != IGRAD_E_NOMEM) {
            fprintf(stderr, "unexpected status %d: %s\n", (int)st, msg);
            bad = 1;
        } else {
            igrad_status_t st2 = igrad__engine_state_load_bytes(eng, file, n, "fuzz.bin");
            if (st2 != st || strcmp(msg, igrad_last_error()) != 0) {
                fprintf(stderr, "not deterministic: %d '%s' vs %d '%s'\n", (int)st, msg,
                            (int)st2, igrad_last_error());
                bad = 1;
            }
        }
    }
    free(file);
    return bad;
}
