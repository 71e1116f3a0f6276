/*
 * test_contract_hashes.c — golden values of every hash igrad puts in a
 * file or in the agreement exchange: the layout hash (profiles, traces,
 * state files, optimizer files), the profile hash, the plan hash and the
 * risk history hash (agreement items 5, 22 and 25 of the engine state
 * file, formats.md §7) and the state file checksum (version 9).
 *
 * The constants below were computed once and are part of the file
 * formats: a state file, profile or trace written by one build must be
 * accepted by another. They change only with a format version bump (state
 * file version, profile schema version, trace version) — a change of the FNV
 * seed or prime, of the byte encoding or order of what is hashed, or of
 * what a plan contains. If one of these tests fails, either the change is
 * a bug, or it is a format change: bump the version, update formats.md
 * and then these constants.
 *
 * Independently of the constants, every one of them is recomputed here
 * from its definition in docs/formats.md §1 and §7 (FNV-1a 64, seed
 * 0xcbf29ce484222325, prime 0x100000001b3, integers as 8 little-endian
 * bytes), so a golden value is not just whatever the code printed: the
 * layout hash from the layout's rows, the profile hash from the profile's
 * entries, the plan hash from the public select specs and tensor plans
 * (not for pack = direct, whose map is not modelled), the history hash
 * and the checksum from the state file's own bytes. The other 36 items
 * are checked against the config they encode.
 * Configs pin dense_below = 0: every tensor takes the sparsifier path, which
 * the references and goldens here model (the default, 64, sends tensors
 * under 64 entries whole: tests/test_engine_dense_below.c, test_target.c).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "igrad.h"
#include "test_util.h"

/* ---- golden values (see the header comment before changing one) ---------- */

#define GOLDEN_LAYOUT_OPT125M 0x4fb755b0eb80ae70ULL   /* configs/opt-125m.json (F16) */
#define GOLDEN_LAYOUT_SMALL 0xda8543021da82b9dULL     /* small_layout() below */
#define GOLDEN_PROFILE_SMALL 0x5d08d6c54c2bc7c2ULL    /* small_profile(), item 5 */
#define GOLDEN_PLAN_IG 0x0cbd7a126f269311ULL          /* ig_config(), item 22 */
#define GOLDEN_PLAN_ADTOPK 0x0d72d2be6b05cb01ULL      /* adtopk_sync, item 22 */
#define GOLDEN_HISTORY_RISK 0xc1d0767b70f3d702ULL     /* ig + pack risk, 2 steps, item 25 */
#define GOLDEN_CHECKSUM_FRESH 0x81d5043507f5da09ULL   /* fresh ig engine, state version 10 (9: 0xdcad59fdd3804ee6, before the sparse all-reduce section; 8: 0xb8c0fbb601aac3af, before item 42 allocation; 7: 0x67138cddda4401bb, before item 41 index_code) */

/* ---- FNV-1a 64 as the docs define it -------------------------------------- */

#define DOC_FNV_SEED 0xcbf29ce484222325ULL
#define DOC_FNV_PRIME 0x100000001b3ULL

static uint64_t fnv_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= DOC_FNV_PRIME;
    }
    return h;
}

/* an integer as 8 little-endian bytes */
static uint64_t fnv_u64(uint64_t h, uint64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    return fnv_bytes(h, b, 8);
}

/* formats.md §1: per tensor in order, the name with its NUL, then dtype,
 * ndim and each dimension as 8 little-endian bytes. */
static uint64_t doc_layout_hash(const igrad_layout_t *L)
{
    uint64_t h = DOC_FNV_SEED;
    for (size_t t = 0; t < igrad_layout_count(L); t++) {
        igrad_tensor_info_t ti;
        assert_ok(igrad_layout_tensor(L, t, &ti));
        h = fnv_bytes(h, ti.name, strlen(ti.name) + 1);
        h = fnv_u64(h, (uint64_t)ti.dtype);
        h = fnv_u64(h, (uint64_t)ti.ndim);
        for (int d = 0; d < ti.ndim; d++) h = fnv_u64(h, (uint64_t)ti.shape[d]);
    }
    return h;
}

/* a double as its IEEE bit pattern, -0.0 as +0.0 */
static uint64_t fnv_f64(uint64_t h, double v)
{
    uint64_t u;
    if (v == 0.0) v = 0.0;
    memcpy(&u, &v, sizeof u);
    return fnv_u64(h, u);
}

static uint64_t fnv_str(uint64_t h, const char *s)
{
    return fnv_bytes(h, s, strlen(s) + 1);
}

/* formats.md §7: the component count, then per component (layer, kind,
 * numel, important). */
static uint64_t doc_profile_hash(const igrad_profile_t *P)
{
    uint64_t h = fnv_u64(DOC_FNV_SEED, (uint64_t)igrad_profile_count(P));
    for (size_t c = 0; c < igrad_profile_count(P); c++) {
        igrad_profile_entry_t pe;
        assert_ok(igrad_profile_entry(P, c, &pe));
        h = fnv_u64(h, (uint64_t)(int64_t)pe.layer);
        h = fnv_u64(h, (uint64_t)pe.kind);
        h = fnv_u64(h, (uint64_t)pe.count);
        h = fnv_u64(h, (uint64_t)pe.important);
    }
    return h;
}

/* formats.md §7, plan hash: the schedule (kind, R, kappa, per component
 * its phase), per tensor its phase and, for the normal and the release
 * budget at even and odd steps, the select spec's row_wise, per_row and
 * count, the index bytes and the block entries; then the direct map
 * (empty unless pack = direct). */
static uint64_t doc_plan_hash(const igrad_engine_t *eng, const igrad_layout_t *L)
{
    igrad_config_t c;
    assert_ok(igrad_engine_config(eng, &c));
    igrad_sparsifier_t sp = c.method == IGRAD_METHOD_TOPK_SYNC     ? IGRAD_SPARSIFIER_TOPK
                            : c.method == IGRAD_METHOD_ADTOPK_SYNC ? IGRAD_SPARSIFIER_ADTOPK
                                                                   : c.sparsifier;
    assert_true(c.pack != IGRAD_PACK_DIRECT); /* the map is not modelled here */
    size_t T = igrad_layout_count(L), C = igrad_layout_component_count(L);
    int *cphase = calloc(C ? C : 1, sizeof *cphase);
    assert_non_null(cphase);
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        igrad_tensor_plan_t tp;
        assert_ok(igrad_layout_tensor(L, t, &ti));
        assert_ok(igrad_engine_tensor_plan(eng, t, &tp));
        if (ti.component >= 0) cphase[ti.component] = tp.phase;
    }
    uint64_t h = fnv_str(DOC_FNV_SEED, "igrad-schedule");
    h = fnv_u64(h, (uint64_t)c.schedule);
    h = fnv_u64(h, (uint64_t)c.release_period);
    h = fnv_f64(h, c.release_keep);
    h = fnv_u64(h, (uint64_t)C);
    for (size_t k = 0; k < C; k++) h = fnv_u64(h, (uint64_t)(int64_t)cphase[k]);
    double rscale = c.method == IGRAD_METHOD_IG ? c.release_keep * c.release_period : 1.0;
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        igrad_tensor_plan_t tp;
        assert_ok(igrad_layout_tensor(L, t, &ti));
        assert_ok(igrad_engine_tensor_plan(eng, t, &tp));
        h = fnv_u64(h, (uint64_t)(int64_t)tp.phase);
        for (int rel = 0; rel < 2; rel++)
            for (int par = 0; par < 2; par++) {
                igrad_select_spec_t ss;
                assert_ok(igrad_select_spec(sp, c.density, rel ? rscale : 1.0, c.interleave,
                                            par, ti.ndim, ti.shape, &ss));
                int64_t range = ss.row_wise ? ss.cols : ss.n;
                int64_t ib = c.index_dtype == IGRAD_DTYPE_U16 && range <= 65536 ? 2 : 4;
                int64_t blk = c.block_entries;
                if (ss.row_wise) blk = ss.per_row * (blk / ss.per_row > 0 ? blk / ss.per_row : 1);
                h = fnv_u64(h, (uint64_t)ss.row_wise);
                h = fnv_u64(h, (uint64_t)ss.per_row);
                h = fnv_u64(h, (uint64_t)ss.count);
                h = fnv_u64(h, (uint64_t)ib);
                h = fnv_u64(h, (uint64_t)blk);
            }
    }
    h = fnv_str(h, "igrad-pack-map");
    h = fnv_u64(h, 0); /* buckets of the map */
    h = fnv_u64(h, 0); /* entries */
    free(cphase);
    return h;
}

static void check_hash(uint64_t got, uint64_t want, const char *what)
{
    if (got != want) {
        print_error("%s: 0x%016llx, expected 0x%016llx\n", what, (unsigned long long)got,
                    (unsigned long long)want);
        fail();
    }
}

/* ---- fixed inputs ----------------------------------------------------------- */

static igrad_layout_t *small_layout(void)
{
    return llama_test_layout(2, 100, 16, 48, IGRAD_DTYPE_BF16);
}

/* A profile with a fixed important set: component c has activity
 * (c * 3) % 7 + 1 at every step; "fixed:0.5" marks the top half. */
static igrad_profile_t *small_profile(const igrad_layout_t *L)
{
    igrad_trace_t *tr = NULL;
    assert_ok(igrad_trace_create(L, &tr));
    assert_ok(igrad_trace_set_sparsifier(tr, IGRAD_SPARSIFIER_ADTOPK, 0.01));
    for (int64_t s = 0; s < 3; s++)
        for (size_t t = 0; t < igrad_layout_count(L); t++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(L, t, &ti));
            if (ti.component < 0) continue;
            double a = (double)((ti.component * 3) % 7 + 1);
            assert_ok(igrad_trace_record(tr, s, t, a * a * (double)ti.count, 1));
        }
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    opts.method = "fixed:0.5";
    igrad_profile_t *P = NULL;
    assert_ok(igrad_profile_build(tr, &opts, &P));
    igrad_trace_free(tr);
    return P;
}

static igrad_config_t ig_config(void)
{
    igrad_config_t c = IGRAD_CONFIG_INIT; /* ig, adtopk, rho 0.01, R 4, kappa 0.25 */
    c.dense_below = 0;
    c.block_entries = 64;
    c.buckets = 3;
    return c;
}

/* ---- the state file, read as formats.md §7 lays it out ---------------------- */

/* State file version 10: 42 agreement items, then step, calls, T at
 * ITEMS_END and N after them. */
#define NITEMS 42
#define ITEMS_END (24 + 8 * NITEMS)

typedef struct state_file {
    unsigned char *bytes;
    size_t nbytes;
    uint64_t items[NITEMS];
    uint32_t version, rank, size, nitems;
} state_file_t;

static uint64_t rd_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t rd_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static state_file_t save_and_read(const igrad_engine_t *eng)
{
    char dir[] = "/tmp/igrad_contract_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/state.bin", dir);
    assert_ok(igrad_engine_save_state(eng, path));
    state_file_t f;
    memset(&f, 0, sizeof f);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    f.nbytes = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f.bytes = malloc(f.nbytes);
    assert_non_null(f.bytes);
    assert_int_equal(fread(f.bytes, 1, f.nbytes, fp), f.nbytes);
    fclose(fp);
    remove(path);
    rmdir(dir);
    assert_true(f.nbytes >= ITEMS_END + 40);
    assert_memory_equal(f.bytes, "IGRADST\0", 8);
    f.version = rd_u32(f.bytes + 8);
    f.rank = rd_u32(f.bytes + 12);
    f.size = rd_u32(f.bytes + 16);
    f.nitems = rd_u32(f.bytes + 20);
    assert_int_equal(f.version, 10);
    assert_int_equal(f.nitems, NITEMS);
    for (int i = 0; i < NITEMS; i++) f.items[i] = rd_u64(f.bytes + 24 + 8 * i);
    return f;
}

/* Checksum (§7): h = seed; h ^= w; h *= prime per 8-byte LE word before it. */
static uint64_t doc_checksum(const state_file_t *f)
{
    assert_int_equal(f->nbytes % 8, 0);
    uint64_t h = DOC_FNV_SEED;
    for (size_t o = 0; o + 8 < f->nbytes; o += 8) {
        h ^= rd_u64(f->bytes + o);
        h *= DOC_FNV_PRIME;
    }
    return h;
}

/* formats.md §7, risk history hash, recomputed from the history stored in
 * the file itself: "igrad-pack-history" with its NUL, H, then per entry
 * key, n, mean and m2. */
static uint64_t doc_history_hash(const state_file_t *f)
{
    uint64_t N = rd_u64(f->bytes + ITEMS_END + 24);
    size_t o = ITEMS_END + 32 + 4 * (size_t)N + (N % 2 ? 4 : 0);
    uint64_t V = rd_u64(f->bytes + o); /* velocities */
    o += 8 + 4 * (size_t)V + (V % 2 ? 4 : 0);
    uint64_t H = rd_u64(f->bytes + o);
    o += 8;
    /* + online mode 0 + sparse all-reduce slots 0 (version 10) + checksum */
    assert_int_equal(o + 32 * H + 8 + 8 + 8, f->nbytes);
    assert_int_equal(rd_u64(f->bytes + o + 32 * H), 0);
    assert_int_equal(rd_u64(f->bytes + o + 32 * H + 8), 0);
    uint64_t h = fnv_str(DOC_FNV_SEED, "igrad-pack-history");
    h = fnv_u64(h, H);
    for (uint64_t i = 0; i < H; i++) {
        double mean, m2;
        uint64_t mb = rd_u64(f->bytes + o + 16 * H + 8 * i);
        uint64_t vb = rd_u64(f->bytes + o + 24 * H + 8 * i);
        memcpy(&mean, &mb, 8);
        memcpy(&m2, &vb, 8);
        h = fnv_u64(h, rd_u64(f->bytes + o + 8 * i));
        h = fnv_u64(h, rd_u64(f->bytes + o + 8 * H + 8 * i));
        h = fnv_f64(h, mean);
        h = fnv_f64(h, m2);
    }
    return h;
}

static uint64_t dbits(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* Items 1–21, 23–24 and 26–40 from their definitions (§7: enums as their numbers,
 * doubles as their IEEE bit pattern). */
static void check_items(const state_file_t *f, const igrad_layout_t *L, const igrad_config_t *c,
                        int64_t step, int64_t calls)
{
    const uint64_t want[NITEMS] = {
        [0] = IGRAD_VERSION_NUMBER,
        [1] = igrad_layout_count(L),
        [2] = igrad_layout_hash(L),
        [3] = igrad_layout_component_count(L),
        [5] = (uint64_t)c->method,
        [6] = (uint64_t)c->sparsifier,
        [7] = (uint64_t)c->interleave,
        [8] = dbits(c->density),
        [9] = (uint64_t)c->release_period,
        [10] = dbits(c->release_keep),
        [11] = (uint64_t)c->schedule,
        [12] = (uint64_t)c->residual,
        [13] = (uint64_t)c->pack,
        [14] = (uint64_t)c->buckets,
        [15] = (uint64_t)c->block_entries,
        [16] = (uint64_t)c->verify_every,
        [17] = (uint64_t)c->value_dtype,
        [18] = (uint64_t)c->index_dtype,
        [19] = (uint64_t)c->collective,
        [20] = dbits(c->timeout_s),
        [22] = (uint64_t)step,
        [23] = (uint64_t)calls,
        [25] = (uint64_t)c->profile_steps,
        [26] = dbits(c->profile_alpha),
        [27] = fnv_str(DOC_FNV_SEED, c->profile_partition ? c->profile_partition : "knee"),
        [28] = (uint64_t)-1, /* not recording an online window */
        [29] = dbits(c->momentum),
        [30] = (uint64_t)c->start_iter,
        [31] = dbits(c->target_ratio),
        [32] = (uint64_t)c->reprofile_every,
        [33] = dbits(c->reprofile_margin),
        [34] = (uint64_t)c->topology,
        [35] = (uint64_t)c->ranks_per_node,
        [36] = (uint64_t)c->dense_below,
        [37] = (uint64_t)c->link_latency_ns,
        [38] = (uint64_t)c->link_bandwidth_mbps,
        [39] = (uint64_t)c->auto_sparse_reduce,
        [40] = (uint64_t)c->index_code,
        [41] = (uint64_t)c->allocation,
    };
    for (int i = 0; i < NITEMS; i++) {
        if (i == 4 || i == 21 || i == 24) continue; /* hashes: pinned by the tests */
        if (f->items[i] != want[i]) {
            print_error("state item %d is 0x%llx, formats.md §7 says 0x%llx\n", i + 1,
                        (unsigned long long)f->items[i], (unsigned long long)want[i]);
            fail();
        }
    }
    check_hash(rd_u64(f->bytes + f->nbytes - 8), doc_checksum(f),
               "state checksum vs formats.md §7");
}

/* ---- tests -------------------------------------------------------------------- */

static void test_layout_hash_golden(void **state)
{
    (void)state;
    const char *src = getenv("IGRAD_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/configs/opt-125m.json", src ? src : "..");
    igrad_layout_t *L = NULL;
    assert_ok(igrad_layout_load(path, &L));
    assert_int_equal(igrad_layout_count(L), 196); /* OPTForCausalLM, lm_head tied */
    check_hash(igrad_layout_hash(L), doc_layout_hash(L), "opt-125m layout hash vs formats.md §1");
    check_hash(igrad_layout_hash(L), GOLDEN_LAYOUT_OPT125M, "opt-125m layout hash vs golden");
    igrad_layout_free(L);

    L = small_layout();
    check_hash(igrad_layout_hash(L), doc_layout_hash(L), "small layout hash vs formats.md §1");
    check_hash(igrad_layout_hash(L), GOLDEN_LAYOUT_SMALL, "small layout hash vs golden");
    igrad_layout_free(L);

    /* the empty layout hashes to the seed itself */
    assert_ok(igrad_layout_create(&L));
    check_hash(igrad_layout_hash(L), DOC_FNV_SEED, "empty layout hash");
    igrad_layout_free(L);
}

static void test_state_hashes_golden(void **state)
{
    (void)state;
    igrad_layout_t *L = small_layout();
    igrad_profile_t *P = small_profile(L);
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));

    /* ig: profile hash and plan hash */
    igrad_config_t c = ig_config();
    igrad_engine_t *eng = NULL;
    assert_ok(igrad_engine_create(L, P, &c, comm, &eng));
    state_file_t f = save_and_read(eng);
    assert_int_equal(f.rank, 0);
    assert_int_equal(f.size, 1);
    check_items(&f, L, &c, -1, 0);
    check_hash(f.items[2], GOLDEN_LAYOUT_SMALL, "state item 3 (layout hash) vs golden");
    check_hash(f.items[4], doc_profile_hash(P), "profile hash vs formats.md §7");
    check_hash(f.items[4], GOLDEN_PROFILE_SMALL, "profile hash vs golden");
    check_hash(f.items[21], doc_plan_hash(eng, L), "ig plan hash vs formats.md §7");
    check_hash(f.items[21], GOLDEN_PLAN_IG, "ig plan hash vs golden");
    check_hash(f.items[24], doc_history_hash(&f), "empty history hash vs formats.md §7");
    check_hash(rd_u64(f.bytes + f.nbytes - 8), GOLDEN_CHECKSUM_FRESH,
               "fresh state checksum vs golden");
    free(f.bytes);
    igrad_engine_free(eng);

    /* a method without deferral: profile hash 0 */
    c = ig_config();
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &eng));
    f = save_and_read(eng);
    igrad_config_t used;
    assert_ok(igrad_engine_config(eng, &used));
    check_items(&f, L, &used, -1, 0);
    check_hash(f.items[4], 0, "adtopk_sync profile hash");
    check_hash(f.items[21], doc_plan_hash(eng, L), "adtopk_sync plan hash vs formats.md §7");
    check_hash(f.items[21], GOLDEN_PLAN_ADTOPK, "adtopk_sync plan hash vs golden");
    free(f.bytes);
    igrad_engine_free(eng);

    /* pack risk: the history hash after two steps of fixed gradients */
    c = ig_config();
    c.pack = IGRAD_PACK_RISK;
    assert_ok(igrad_engine_create(L, P, &c, comm, &eng));
    size_t T = igrad_layout_count(L);
    float **g = calloc(T, sizeof *g);
    assert_non_null(g);
    for (int64_t s = 0; s < 2; s++) {
        for (size_t t = 0; t < T; t++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(L, t, &ti));
            if (!g[t]) g[t] = malloc((size_t)ti.count * sizeof(float));
            assert_non_null(g[t]);
            for (int64_t i = 0; i < ti.count; i++)
                g[t][i] =
                    (float)(((i + 1) * 7919 + (int64_t)t * 31 + s * 17) % 1000) / 500.0f - 1.0f;
        }
        assert_ok(igrad_engine_sync(eng, s, g));
    }
    f = save_and_read(eng);
    check_items(&f, L, &c, 1, 2);
    assert_true(rd_u64(f.bytes + ITEMS_END + 8 + 4 * igrad_layout_total_count(L) + 8) > 0); /* H, after V = 0 */
    check_hash(f.items[24], doc_history_hash(&f), "risk history hash vs formats.md §7");
    check_hash(f.items[24], GOLDEN_HISTORY_RISK, "risk history hash vs golden");
    free(f.bytes);
    igrad_engine_free(eng);
    for (size_t t = 0; t < T; t++) free(g[t]);
    free(g);

    igrad_comm_free(comm);
    igrad_profile_free(P);
    igrad_layout_free(L);
}

/* The same layout hash reaches the files that carry it: the trace CSV's
 * comment line and the profile JSON. */
static void test_hash_in_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/igrad_contract_XXXXXX", path[64], line[256], want[64];
    assert_non_null(mkdtemp(dir));
    igrad_layout_t *L = small_layout();
    igrad_trace_t *tr = NULL;
    assert_ok(igrad_trace_create(L, &tr));
    assert_ok(igrad_trace_set_sparsifier(tr, IGRAD_SPARSIFIER_TOPK, 0.01));
    assert_ok(igrad_trace_record(tr, 0, 1, 1.0, 1));
    snprintf(path, sizeof path, "%s/trace.csv", dir);
    assert_ok(igrad_trace_save(tr, path));
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    assert_non_null(fgets(line, sizeof line, fp));
    fclose(fp);
    remove(path);
    snprintf(want, sizeof want, "layout_hash=0x%016llx ", (unsigned long long)GOLDEN_LAYOUT_SMALL);
    if (!strstr(line, want)) {
        print_error("trace line 1 '%s' lacks '%s'\n", line, want);
        fail();
    }
    igrad_profile_t *P = small_profile(L);
    snprintf(path, sizeof path, "%s/profile.json", dir);
    assert_ok(igrad_profile_save_json(P, path));
    fp = fopen(path, "r");
    assert_non_null(fp);
    int found = 0;
    snprintf(want, sizeof want, "\"layout_hash\":\t\"0x%016llx\"",
             (unsigned long long)GOLDEN_LAYOUT_SMALL);
    while (fgets(line, sizeof line, fp)) found |= strstr(line, want) != NULL;
    fclose(fp);
    remove(path);
    rmdir(dir);
    if (!found) {
        print_error("profile JSON lacks %s\n", want);
        fail();
    }
    igrad_profile_free(P);
    igrad_trace_free(tr);
    igrad_layout_free(L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_hash_golden),
        cmocka_unit_test(test_state_hashes_golden),
        cmocka_unit_test(test_hash_in_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
