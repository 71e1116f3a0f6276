/*
 * test_engine.c — the sync engine (src/engine.c, src/engine_state.c) on the
 * one-rank "self" communicator: names and config validation, profile vs
 * layout, and over 100-step runs of several methods and configs the
 * invariants of DESIGN.md §2 — conservation per tensor (sum of gradients =
 * sum sent + residual), every deferred component sent exactly at its phase
 * with its budget, payload bytes equal to an independent prediction (budgets,
 * release counts, phases and release steps computed here from their
 * definitions in docs/architecture.md §5.1 and §5.5, without the library's
 * budget or schedule code).
 * Also: topk_sync against a sort-based top-k, dense, residual=drop's
 * dropped mass, two-phase = sync, gather = reduce buckets, thread count
 * independence, save/load mid-run = uninterrupted, corrupt and mismatched
 * state files, non-finite and NULL gradients leaving residuals bit-identical,
 * calls out of order, and the trace hook. Received bytes: an index one past
 * its tensor (flat) or row (row-wise) is IGRAD_E_COMM naming rank, bucket
 * and tensor, one below is fine; after it, or after a failed or timed-out
 * collective, every call fails fast with IGRAD_E_STATE.
 *
 * Not here: several ranks (tests/mpi_engine.c), the schedule and packing
 * policies alone (test_schedule.c, test_pack.c).
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
#include "wire_code_ref.h"
#include "core/internal.h" /* igrad__fail */

/* ---- helpers ------------------------------------------------------------ */

/* A small LLaMA-like layout: embeddings, 3 blocks, norm, lm_head, and one
 * 1-D tensor of 70000 entries (flat indices that need 32 bits). */
static igrad_layout_t *make_layout(void)
{
    igrad_layout_t *L = NULL;
    assert_ok(igrad_layout_create(&L));
    int64_t emb[2] = {300, 32}, sq[2] = {32, 32}, up[2] = {64, 32}, down[2] = {32, 64};
    int64_t vec[1] = {32}, big[1] = {70000};
    char name[128];
    assert_ok(igrad_layout_add(L, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb));
    static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    for (int l = 0; l < 3; l++) {
        for (int a = 0; a < 4; a++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, attn[a]);
            assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, sq));
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate_proj.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, up));
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, up));
        if (l == 0) assert_ok(igrad_layout_add(L, "model.layers.0.mlp.up_proj.bias",
                                               IGRAD_DTYPE_F32, 1, big));
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, down));
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 1, vec));
    }
    assert_ok(igrad_layout_add(L, "model.norm.weight", IGRAD_DTYPE_F32, 1, vec));
    assert_ok(igrad_layout_add(L, "lm_head.weight", IGRAD_DTYPE_F32, 2, emb));
    return L;
}


/* Gradients: a deterministic function of (seed, step, tensor, index), with
 * per-tensor scales and an occasional large entry. */
static void grads_fill(grads_t *G, uint64_t seed, int64_t step)
{
    for (size_t t = 0; t < G->T; t++) {
        float scale = 0.1f + 0.3f * (float)(t % 5);
        for (int64_t i = 0; i < G->n[t]; i++) {
            uint64_t u = mix64(seed * 0x100000001b3ULL ^ mix64((uint64_t)step * 1000003u + t) ^
                               (uint64_t)i * 0x9e3779b97f4a7c15ULL);
            float x = (float)((double)(u >> 40) / 16777216.0) * 2.0f - 1.0f;
            if ((u & 0xff) == 0) x *= 10.0f;
            G->g[t][i] = scale * x;
        }
    }
}

static void grads_copy(grads_t *dst, const grads_t *src)
{
    for (size_t t = 0; t < src->T; t++)
        memcpy(dst->g[t], src->g[t], (size_t)src->n[t] * sizeof(float));
}

static void assert_grads_equal(const grads_t *a, const grads_t *b, const char *what)
{
    for (size_t t = 0; t < a->T; t++)
        for (int64_t i = 0; i < a->n[t]; i++)
            if (memcmp(&a->g[t][i], &b->g[t][i], sizeof(float)) != 0) {
                print_error("%s: tensor %zu entry %lld: %.9g vs %.9g\n", what, t, (long long)i,
                            (double)a->g[t][i], (double)b->g[t][i]);
                fail();
            }
}

static void assert_residuals_equal(const igrad_engine_t *a, const igrad_engine_t *b,
                                   const grads_t *shape, const char *what)
{
    for (size_t t = 0; t < shape->T; t++) {
        const float *ra = igrad_engine_residual(a, t), *rb = igrad_engine_residual(b, t);
        if (!ra && !rb) continue; /* dense: no residuals */
        assert_non_null(ra);
        assert_non_null(rb);
        for (int64_t i = 0; i < shape->n[t]; i++)
            if (memcmp(&ra[i], &rb[i], sizeof(float)) != 0) {
                print_error("%s: residual of tensor %zu entry %lld: %.9g vs %.9g\n", what, t,
                            (long long)i, (double)ra[i], (double)rb[i]);
                fail();
            }
    }
}

/* ---- names and config ----------------------------------------------------- */

static void test_names(void **state)
{
    (void)state;
    static const char *const m[] = {"dense", "topk_sync", "adtopk_sync", "iad", "ig"};
    for (int i = 0; i < 5; i++) {
        igrad_method_t x = IGRAD_METHOD_DENSE;
        assert_string_equal(igrad_method_name((igrad_method_t)i), m[i]);
        assert_ok(igrad_method_from_name(m[i], &x));
        assert_int_equal(x, i);
    }
    igrad_method_t x = IGRAD_METHOD_DENSE;
    assert_ok(igrad_method_from_name("IG", &x));
    assert_int_equal(x, IGRAD_METHOD_IG);
    assert_status(igrad_method_from_name("igx", &x), IGRAD_E_INVALID);
    assert_error_has("\"igx\"");
    assert_string_equal(igrad_method_name((igrad_method_t)9), "unknown");
    igrad_residual_policy_t r = IGRAD_RESIDUAL_ON;
    assert_ok(igrad_residual_policy_from_name("Drop", &r));
    assert_int_equal(r, IGRAD_RESIDUAL_DROP);
    assert_string_equal(igrad_residual_policy_name(IGRAD_RESIDUAL_ON), "on");
    assert_status(igrad_residual_policy_from_name("off", &r), IGRAD_E_INVALID);
    igrad_collective_t c = IGRAD_COLLECTIVE_AUTO;
    assert_ok(igrad_collective_from_name("reduce", &c));
    assert_int_equal(c, IGRAD_COLLECTIVE_REDUCE);
    assert_string_equal(igrad_collective_name(IGRAD_COLLECTIVE_GATHER), "gather");
    assert_status(igrad_collective_from_name(NULL, &c), IGRAD_E_INVALID);
}

static void test_config_validate(void **state)
{
    (void)state;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    assert_ok(igrad_config_validate(&c));
    assert_int_equal(c.method, IGRAD_METHOD_IG);
    assert_int_equal(c.pack, IGRAD_PACK_CONTIGUOUS);
    assert_int_equal(c.release_period, 4);
    assert_status(igrad_config_validate(NULL), IGRAD_E_INVALID);

#define BAD(field, value, status, frag)                    \
    do {                                                   \
        igrad_config_t b = IGRAD_CONFIG_INIT;              \
        b.dense_below = 0;                                 \
        b.field = value;                                   \
        assert_status(igrad_config_validate(&b), status);  \
        assert_error_has(frag);                            \
    } while (0)
    BAD(size, sizeof(igrad_config_t) - 8, IGRAD_E_INVALID, "config.size");
    BAD(method, (igrad_method_t)7, IGRAD_E_INVALID, "config.method");
    BAD(sparsifier, IGRAD_SPARSIFIER_NONE, IGRAD_E_INVALID, "config.sparsifier is none");
    BAD(interleave, 2, IGRAD_E_INVALID, "config.interleave is 2");
    BAD(density, 0.0, IGRAD_E_INVALID, "config.density is 0");
    BAD(density, -0.5, IGRAD_E_INVALID, "config.density is -0.5");
    BAD(density, 1.5, IGRAD_E_INVALID, "config.density is 1.5");
    BAD(density, NAN, IGRAD_E_INVALID, "config.density");
    BAD(release_period, 0, IGRAD_E_INVALID, "config.release_period is 0");
    BAD(release_keep, 0.0, IGRAD_E_INVALID, "config.release_keep is 0");
    BAD(release_keep, 1.01, IGRAD_E_INVALID, "config.release_keep is 1.01");
    BAD(schedule, (igrad_schedule_t)5, IGRAD_E_INVALID, "config.schedule");
    BAD(residual, (igrad_residual_policy_t)3, IGRAD_E_INVALID, "config.residual");
    BAD(pack, (igrad_pack_policy_t)9, IGRAD_E_INVALID, "config.pack");
    BAD(buckets, 0, IGRAD_E_INVALID, "config.buckets is 0");
    BAD(block_entries, 0, IGRAD_E_INVALID, "config.block_entries is 0");
    BAD(verify_every, -1, IGRAD_E_INVALID, "config.verify_every");
    BAD(value_dtype, IGRAD_DTYPE_I8, IGRAD_E_INVALID, "config.value_dtype");
    BAD(index_dtype, IGRAD_DTYPE_U8, IGRAD_E_INVALID, "config.index_dtype");
    BAD(collective, (igrad_collective_t)4, IGRAD_E_INVALID, "config.collective");
    BAD(threads, -2, IGRAD_E_INVALID, "config.threads");
    BAD(timeout_s, -1.0, IGRAD_E_INVALID, "config.timeout_s is -1");
    BAD(timeout_s, NAN, IGRAD_E_INVALID, "config.timeout_s is nan");
    BAD(timeout_s, INFINITY, IGRAD_E_INVALID, "config.timeout_s is inf");
#undef BAD
    assert_true(c.timeout_s == IGRAD_DEFAULT_TIMEOUT_S && c.timeout_s == 300.0);
    c.timeout_s = 0.0; /* off */
    assert_ok(igrad_config_validate(&c));
    c.timeout_s = 1e-3;
    assert_ok(igrad_config_validate(&c));
    /* the sparsifier field is ignored where the method fixes it */
    igrad_config_t d = IGRAD_CONFIG_INIT;
    d.dense_below = 0;
    d.method = IGRAD_METHOD_DENSE;
    d.sparsifier = IGRAD_SPARSIFIER_NONE;
    assert_ok(igrad_config_validate(&d));
    /* 16-bit wire values: sparse methods take them, dense (no residual) not */
    c.value_dtype = IGRAD_DTYPE_BF16;
    assert_ok(igrad_config_validate(&c));
    c.value_dtype = IGRAD_DTYPE_F16;
    assert_ok(igrad_config_validate(&c));
    d.value_dtype = IGRAD_DTYPE_BF16;
    assert_status(igrad_config_validate(&d), IGRAD_E_UNSUPPORTED);
    assert_error_has("config.value_dtype is BF16, but method dense");
    d.value_dtype = IGRAD_DTYPE_F32;
    /* a larger (newer) struct is accepted */
    d.size += 16;
    assert_ok(igrad_config_validate(&d));
}

/* Create fails cleanly (ASan checks for leaks) and names the problem. */
static void test_create_errors(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_profile_t *P = fixed_rule_profile(L, "fixed:0.4");
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_engine_t *e = (igrad_engine_t *)(uintptr_t)1;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;

    assert_status(igrad_engine_create(L, NULL, &c, comm, &e), IGRAD_E_INVALID);
    assert_null(e);
    assert_error_has("needs a profile");
    c.density = 2.0;
    assert_status(igrad_engine_create(L, P, &c, comm, &e), IGRAD_E_INVALID);
    assert_error_has("config.density is 2");
    assert_null(e);
    c.density = 0.01;
    assert_status(igrad_engine_create(NULL, P, &c, comm, &e), IGRAD_E_INVALID);
    assert_status(igrad_engine_create(L, P, NULL, comm, &e), IGRAD_E_INVALID);
    assert_status(igrad_engine_create(L, P, &c, NULL, &e), IGRAD_E_INVALID);
    assert_status(igrad_engine_create(L, P, &c, comm, NULL), IGRAD_E_INVALID);

    /* a profile made for another layout */
    igrad_layout_t *L2 = NULL;
    int64_t sq[2] = {32, 32}, other[2] = {16, 32};
    assert_ok(igrad_layout_create(&L2));
    assert_ok(igrad_layout_add(L2, "model.layers.0.self_attn.q_proj.weight", IGRAD_DTYPE_F32, 2,
                               sq));
    assert_ok(igrad_layout_add(L2, "model.layers.0.self_attn.k_proj.weight", IGRAD_DTYPE_F32, 2,
                               sq));
    igrad_profile_t *P2 = fixed_rule_profile(L2, "knee");
    assert_status(igrad_engine_create(L, P2, &c, comm, &e), IGRAD_E_MISMATCH);
    assert_error_has("profile does not match the layout");
    assert_null(e);
    /* same components, other sizes */
    igrad_layout_t *L3 = NULL;
    assert_ok(igrad_layout_create(&L3));
    assert_ok(igrad_layout_add(L3, "model.layers.0.self_attn.q_proj.weight", IGRAD_DTYPE_F32, 2,
                               other));
    assert_ok(igrad_layout_add(L3, "model.layers.0.self_attn.k_proj.weight", IGRAD_DTYPE_F32, 2,
                               sq));
    assert_status(igrad_engine_create(L3, P2, &c, comm, &e), IGRAD_E_MISMATCH);
    assert_error_has("profile does not match the layout");
    /* methods without deferral ignore the profile */
    c.method = IGRAD_METHOD_TOPK_SYNC;
    assert_ok(igrad_engine_create(L3, P2, &c, comm, &e));
    igrad_engine_free(e);
    igrad_engine_free(NULL);

    igrad_profile_free(P2);
    igrad_layout_free(L3);
    igrad_layout_free(L2);
    igrad_profile_free(P);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

/* ---- independent expectations -------------------------------------------------- */

/* The budgets and the release schedule written again from their definitions
 * (docs/architecture.md §5.1 "Budgets and select specs" and §5.5
 * "Schedule"), with no call into the library's budget or schedule code, so
 * that a change there shows up here as a difference rather than moving both
 * sides together. */

#define EXPECT_EVERY (-1) /* phase of a tensor sent at every step */

/* budget(n, rho) = clamp(ceil(rho * n), 1, n), the product in double. */
static int64_t expect_budget(int64_t n, double rho)
{
    double c = ceil(rho * (double)n);
    return c < 1.0 ? 1 : c >= (double)n ? n : (int64_t)c;
}

/* The release count of a budget k over a range of n entries:
 * min(n, ceil(kappa*R * k)), kappa*R taken first as one double product. */
static int64_t expect_release(int64_t k, int64_t n, double keep, int period)
{
    double c = ceil((keep * (double)period) * (double)k);
    return c < 1.0 ? 1 : c >= (double)n ? n : (int64_t)c;
}

/* Sent at `step`: every step for phase -1, else when step mod R == phase
 * (the mathematical modulo). */
static int expect_sent(int phase, int period, int64_t step)
{
    if (phase < 0) return 1;
    int64_t r = step % period;
    return (r < 0 ? r + period : r) == phase;
}

/* Phases of n components: -1 for important ones; aligned: R - 1 for every
 * other one; staggered: longest-processing-time over R slots, components by
 * decreasing release bytes (ties: lower index) each into the least-loaded
 * slot so far (ties: lower slot). */
static void expect_schedule(igrad_schedule_t kind, int period, size_t n, const int64_t *weight,
                            const unsigned char *important, int *phase)
{
    for (size_t c = 0; c < n; c++) phase[c] = important[c] ? EXPECT_EVERY : period - 1;
    if (kind == IGRAD_SCHEDULE_ALIGNED) return;
    assert_int_equal(kind, IGRAD_SCHEDULE_STAGGERED);
    unsigned char *placed = calloc(n + 1, 1);
    int64_t *load = calloc((size_t)period, sizeof *load);
    assert_non_null(placed);
    assert_non_null(load);
    for (;;) {
        size_t heaviest = n; /* the next component: the heaviest not placed */
        for (size_t c = 0; c < n; c++)
            if (!important[c] && !placed[c] && (heaviest == n || weight[c] > weight[heaviest]))
                heaviest = c;
        if (heaviest == n) break;
        int slot = 0;
        for (int s = 1; s < period; s++)
            if (load[s] < load[slot]) slot = s;
        phase[heaviest] = slot;
        load[slot] += weight[heaviest];
        placed[heaviest] = 1;
    }
    free(placed);
    free(load);
}

/* What a tensor sends at a step kind, from the documented rules. */
static void expect_tensor(const igrad_tensor_info_t *ti, const igrad_config_t *c, int par,
                          int release, int64_t *count, int *idxb)
{
    igrad_sparsifier_t sp = c->method == IGRAD_METHOD_TOPK_SYNC     ? IGRAD_SPARSIFIER_TOPK
                            : c->method == IGRAD_METHOD_ADTOPK_SYNC ? IGRAD_SPARSIFIER_ADTOPK
                                                                    : c->sparsifier;
    int64_t n = ti->count, range;
    if (sp == IGRAD_SPARSIFIER_ADTOPK && ti->ndim >= 2) {
        int64_t rows = ti->shape[0], cols = n / rows;
        int64_t per_row = expect_budget(cols, c->density);
        if (release && c->method == IGRAD_METHOD_IG)
            per_row = expect_release(per_row, cols, c->release_keep, c->release_period);
        *count = rows * per_row;
        range = (c->interleave && par) ? n : cols;
    } else {
        int64_t k = expect_budget(n, c->density);
        if (release && c->method == IGRAD_METHOD_IG)
            k = expect_release(k, n, c->release_keep, c->release_period);
        *count = k;
        range = n;
    }
    *idxb = (c->index_dtype == IGRAD_DTYPE_U16 && range <= 65536) ? 2 : 4;
}

/* The wire bytes of what expect_tensor gives (F32 values): with
 * config.index_code compact each block's indices coded as formats.md §8
 * says (wire_code_ref.h), blocks cut as §5.6 of architecture.md. */
static int64_t expect_wire(const igrad_tensor_info_t *ti, const igrad_config_t *c, int par,
                           int release)
{
    int64_t cnt;
    int idxb;
    expect_tensor(ti, c, par, release, &cnt, &idxb);
    if (c->index_code != IGRAD_INDEX_CODE_COMPACT) return cnt * (4 + idxb);
    igrad_sparsifier_t sp = c->method == IGRAD_METHOD_TOPK_SYNC     ? IGRAD_SPARSIFIER_TOPK
                            : c->method == IGRAD_METHOD_ADTOPK_SYNC ? IGRAD_SPARSIFIER_ADTOPK
                                                                    : c->sparsifier;
    int row_wise = sp == IGRAD_SPARSIFIER_ADTOPK && ti->ndim >= 2 && !(c->interleave && par);
    int64_t rows = row_wise ? ti->shape[0] : 1, cols = ti->count / rows;
    int64_t per_row = cnt / rows, blk = c->block_entries, total = 4 * cnt;
    if (row_wise) blk = per_row * (blk / per_row > 0 ? blk / per_row : 1);
    for (int64_t f = 0; f < cnt; f += blk) {
        int64_t m = cnt - f < blk ? cnt - f : blk;
        total += ref_block_idx_nbytes(row_wise, m, per_row, cols, ti->count, idxb);
    }
    return total;
}

/* Phases per tensor: a component's weight is its release bytes, the sum
 * over its tensors of the release count times the wire bytes of an entry
 * at an even step. */
static void expect_phases(const igrad_layout_t *L, const igrad_profile_t *P,
                          const igrad_config_t *c, int *tphase)
{
    size_t T = igrad_layout_count(L), C = igrad_layout_component_count(L);
    int defer = c->method == IGRAD_METHOD_IAD || c->method == IGRAD_METHOD_IG;
    int64_t *rel = calloc(C + 1, sizeof *rel);
    unsigned char *imp = calloc(C + 1, 1);
    int *phase = calloc(C + 1, sizeof *phase);
    assert_non_null(rel);
    assert_non_null(imp);
    assert_non_null(phase);
    for (size_t ci = 0; ci < C; ci++) {
        igrad_component_info_t info;
        assert_ok(igrad_layout_component(L, ci, &info));
        imp[ci] = defer ? (unsigned char)igrad_profile_is_important(P, info.layer, info.kind) : 1;
    }
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        assert_ok(igrad_layout_tensor(L, t, &ti));
        if (ti.component < 0) continue;
        int64_t cnt;
        int idxb;
        expect_tensor(&ti, c, 0, 1, &cnt, &idxb);
        rel[ti.component] += cnt * (4 + idxb);
    }
    expect_schedule(c->schedule, c->release_period, C, rel, imp, phase);
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        assert_ok(igrad_layout_tensor(L, t, &ti));
        tphase[t] = ti.component < 0 ? EXPECT_EVERY : phase[ti.component];
    }
    free(rel);
    free(imp);
    free(phase);
}

/* ---- the invariants over a run ------------------------------------------------- */

/* Runs `steps` synced steps and checks, at every step: which tensors
 * arrived (exactly the ones whose phase says so, each with its budget of
 * nonzero entries), stats against the plan, payload against an independent
 * prediction; at the end, conservation per tensor. */
static void run_invariants(const igrad_config_t *c, int steps)
{
    igrad_layout_t *L = make_layout();
    igrad_profile_t *P = fixed_rule_profile(L, "fixed:0.4");
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, P, c, comm, &e));
    size_t T = igrad_layout_count(L);
    int defer = c->method == IGRAD_METHOD_IAD || c->method == IGRAD_METHOD_IG;

    int *phase = calloc(T, sizeof *phase);
    assert_non_null(phase);
    expect_phases(L, P, c, phase);
    int nlow_comp = 0;
    for (size_t ci = 0; ci < igrad_layout_component_count(L); ci++) {
        igrad_component_info_t info;
        assert_ok(igrad_layout_component(L, ci, &info));
        if (defer && igrad_profile_is_important(P, info.layer, info.kind) == 0) nlow_comp++;
    }
    if (defer) assert_true(nlow_comp > 0);
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_plan_t tp;
        assert_ok(igrad_engine_tensor_plan(e, t, &tp));
        assert_int_equal(tp.phase, phase[t]);
        assert_int_equal(tp.every_step, phase[t] < 0);
    }

    grads_t G = grads_new(L);
    double **sum_in = calloc(T, sizeof *sum_in), **sum_out = calloc(T, sizeof *sum_out);
    double **sum_abs = calloc(T, sizeof *sum_abs);
    assert_non_null(sum_in);
    assert_non_null(sum_out);
    assert_non_null(sum_abs);
    for (size_t t = 0; t < T; t++) {
        sum_in[t] = calloc((size_t)G.n[t], sizeof(double));
        sum_out[t] = calloc((size_t)G.n[t], sizeof(double));
        sum_abs[t] = calloc((size_t)G.n[t], sizeof(double));
        assert_non_null(sum_in[t]);
        assert_non_null(sum_out[t]);
        assert_non_null(sum_abs[t]);
    }
    int64_t *pstep = calloc(T, sizeof *pstep), *prel = calloc(T, sizeof *prel);
    assert_non_null(pstep);
    assert_non_null(prel);

    for (int64_t s = 0; s < steps; s++) {
        grads_fill(&G, 42, s);
        for (size_t t = 0; t < T; t++)
            for (int64_t i = 0; i < G.n[t]; i++) {
                sum_in[t][i] += G.g[t][i];
                sum_abs[t][i] += fabs((double)G.g[t][i]);
            }
        /* the prediction, independently */
        int par = c->interleave && (s % 2 != 0);
        for (size_t t = 0; t < T; t++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(L, t, &ti));
            pstep[t] = expect_wire(&ti, c, par, 0);
            prel[t] = expect_wire(&ti, c, par, 1);
        }
        int64_t predicted = 0;
        for (size_t t = 0; t < T; t++)
            if (expect_sent(phase[t], c->release_period, s))
                predicted += phase[t] < 0 ? pstep[t] : prel[t];
        assert_int_equal(igrad_engine_predict_payload(e, s), predicted);

        assert_ok(igrad_engine_sync(e, s, G.g));
        igrad_step_stats_t st;
        assert_ok(igrad_engine_last_stats(e, &st));
        assert_int_equal(st.step, s);
        assert_int_equal(st.skipped, 0);
        if (c->collective != IGRAD_COLLECTIVE_REDUCE) assert_int_equal(st.payload_nbytes, predicted);
        assert_true(st.wire_nbytes == 0.0); /* one rank moves nothing */

        int64_t sent = 0, entries = 0;
        int released = 0, deferred = 0;
        for (size_t t = 0; t < T; t++) {
            int is_sent = expect_sent(phase[t], c->release_period, s);
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(L, t, &ti));
            int64_t cnt;
            int idxb;
            expect_tensor(&ti, c, par, phase[t] >= 0, &cnt, &idxb);
            int64_t nz = 0;
            for (int64_t i = 0; i < G.n[t]; i++) {
                nz += G.g[t][i] != 0.0f;
                sum_out[t][i] += G.g[t][i];
            }
            if (is_sent) {
                sent++;
                entries += cnt;
                if (nz != cnt) {
                    print_error("step %lld: tensor %s (phase %d) arrived with %lld nonzero "
                                "entries, budget %lld\n",
                                (long long)s, ti.name, phase[t], (long long)nz, (long long)cnt);
                    fail();
                }
            } else if (nz != 0) {
                print_error("step %lld: tensor %s (phase %d) is not due but %lld entries "
                            "arrived\n",
                            (long long)s, ti.name, phase[t], (long long)nz);
                fail();
            }
        }
        for (size_t ci = 0; ci < igrad_layout_component_count(L); ci++) {
            igrad_component_info_t info;
            assert_ok(igrad_layout_component(L, ci, &info));
            if (!defer || igrad_profile_is_important(P, info.layer, info.kind)) continue;
            /* a component's phase is its tensors' phase */
            int ph = -2;
            for (size_t t = 0; t < T; t++) {
                igrad_tensor_info_t ti;
                assert_ok(igrad_layout_tensor(L, t, &ti));
                if (ti.component == (int)ci) ph = phase[t];
            }
            assert_true(ph >= 0);
            if (expect_sent(ph, c->release_period, s)) released++;
            else deferred++;
        }
        assert_int_equal(st.tensors_sent, sent);
        assert_int_equal(st.entries_sent, entries);
        assert_int_equal(st.released_components, released);
        assert_int_equal(st.deferred_components, deferred);
        if (c->method == IGRAD_METHOD_IAD) {
            assert_int_equal(st.bucket_count, sent);
            assert_int_equal(st.buckets, sent);
        } else {
            assert_int_equal(st.bucket_count, c->buckets);
            int64_t total = 0;
            for (int b = 0; b < st.bucket_count; b++) total += st.bucket_loads[b];
            assert_int_equal(total, predicted);
        }
        assert_true(st.total_ms >= 0.0);
    }

    /* conservation: sum of gradients = sum sent + residual, per tensor */
    double resid_sq = 0.0;
    for (size_t t = 0; t < T; t++) {
        const float *r = igrad_engine_residual(e, t);
        assert_non_null(r);
        double err = 0.0, ref = 0.0;
        for (int64_t i = 0; i < G.n[t]; i++) {
            double d = sum_in[t][i] - sum_out[t][i] - (double)r[i];
            err += d * d;
            ref += sum_abs[t][i] * sum_abs[t][i];
            resid_sq += (double)r[i] * r[i];
        }
        if (!(sqrt(err) <= 1e-4 * sqrt(ref))) {
            print_error("tensor %zu: |sum g - sum sent - e| = %.9g, 1e-4 x |sum |g|| = %.9g\n",
                        t, sqrt(err), 1e-4 * sqrt(ref));
            fail();
        }
    }
    igrad_step_stats_t st;
    assert_ok(igrad_engine_last_stats(e, &st));
    if (!(fabs(st.residual_norm - sqrt(resid_sq)) <= 1e-9 * sqrt(resid_sq) + 1e-30)) {
        print_error("residual_norm %.17g, computed %.17g\n", st.residual_norm, sqrt(resid_sq));
        fail();
    }
    assert_int_equal(igrad_engine_step(e), steps - 1);
    assert_true(igrad_engine_workspace_nbytes(e) > (size_t)igrad_layout_total_count(L) * 4);

    for (size_t t = 0; t < T; t++) {
        free(sum_in[t]);
        free(sum_out[t]);
        free(sum_abs[t]);
    }
    free(sum_in);
    free(sum_out);
    free(sum_abs);
    free(pstep);
    free(prel);
    free(phase);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_profile_free(P);
    igrad_layout_free(L);
}

static void test_ig_default(void **state)
{
    (void)state;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05; /* rows of 32 keep 2, so releases differ from k */
    run_invariants(&c, 100);
}

static void test_ig_variants(void **state)
{
    (void)state;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.schedule = IGRAD_SCHEDULE_ALIGNED;
    c.release_keep = 0.6;
    c.release_period = 3;
    c.interleave = 1;
    c.block_entries = 40; /* many blocks, whole rows */
    c.pack = IGRAD_PACK_RISK;
    c.buckets = 5;
    run_invariants(&c, 40);
    c.sparsifier = IGRAD_SPARSIFIER_TOPK;
    c.pack = IGRAD_PACK_GREEDY;
    c.index_dtype = IGRAD_DTYPE_U32;
    run_invariants(&c, 30);
    c.pack = IGRAD_PACK_DIRECT;
    c.release_period = 1;
    run_invariants(&c, 10);
    c.pack = IGRAD_PACK_SEQUENTIAL;
    c.release_period = 4;
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    run_invariants(&c, 20);
}

static void test_other_methods(void **state)
{
    (void)state;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_IAD;
    c.density = 0.03;
    run_invariants(&c, 30);
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.block_entries = 7;
    run_invariants(&c, 10);
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    run_invariants(&c, 10);
}

/* ---- single-method references ------------------------------------------------- */

/* topk_sync, first step (residual 0): the result is the top-k of |g| by a
 * full sort (ties: lower index), values unchanged. Second step: the
 * top-k of g + residual, with the residual read before the step. */
static void test_topk_reference(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.density = 0.02;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    grads_t G = grads_new(L), A = grads_new(L);
    for (int64_t s = 0; s < 3; s++) {
        grads_fill(&G, 7, s);
        for (size_t t = 0; t < G.T; t++) {
            const float *r = igrad_engine_residual(e, t);
            for (int64_t i = 0; i < G.n[t]; i++) A.g[t][i] = G.g[t][i] + r[i];
        }
        assert_ok(igrad_engine_sync(e, s, G.g));
        for (size_t t = 0; t < G.T; t++) {
            int64_t n = G.n[t], k = expect_budget(n, c.density);
            uint32_t *top = malloc((size_t)k * sizeof *top);
            unsigned char *keep = calloc((size_t)n, 1);
            assert_non_null(top);
            assert_non_null(keep);
            ref_topk(A.g[t], n, k, top); /* a full sort, test_util.h */
            for (int64_t j = 0; j < k; j++) keep[top[j]] = 1;
            for (int64_t i = 0; i < n; i++) {
                float want = keep[i] ? A.g[t][i] : 0.0f;
                if (memcmp(&want, &G.g[t][i], sizeof want) != 0) {
                    print_error("step %lld tensor %zu entry %lld: got %.9g, top-k says %.9g\n",
                                (long long)s, t, (long long)i, (double)G.g[t][i],
                                (double)want);
                    fail();
                }
                const float *r = igrad_engine_residual(e, t);
                float rw = keep[i] ? 0.0f : A.g[t][i];
                if (memcmp(&rw, &r[i], sizeof rw) != 0) {
                    print_error("step %lld tensor %zu residual %lld: got %.9g, want %.9g\n",
                                (long long)s, t, (long long)i, (double)r[i], (double)rw);
                    fail();
                }
            }
            free(keep);
            free(top);
        }
    }
    grads_free(&G);
    grads_free(&A);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

static void test_dense(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_DENSE;
    c.block_entries = 1000;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    grads_t G = grads_new(L), W = grads_new(L);
    grads_fill(&G, 3, 0);
    grads_copy(&W, &G);
    assert_ok(igrad_engine_sync(e, 0, G.g));
    assert_grads_equal(&G, &W, "dense on one rank");
    igrad_step_stats_t st;
    assert_ok(igrad_engine_last_stats(e, &st));
    assert_int_equal(st.payload_nbytes, igrad_layout_total_count(L) * 4);
    assert_int_equal(st.payload_nbytes, igrad_engine_predict_payload(e, 0));
    assert_int_equal(st.reduce_buckets, st.buckets);
    assert_int_equal(st.entries_sent, igrad_layout_total_count(L));
    assert_null(igrad_engine_residual(e, 0));
    grads_free(&G);
    grads_free(&W);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

/* residual=drop: at a step where a low tensor is not due, exactly
 * sum (g + e)^2 over those tensors is reported and their residual is 0;
 * with the dropped vectors added, mass is conserved. */
static void test_drop(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_profile_t *P = fixed_rule_profile(L, "fixed:0.4");
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.residual = IGRAD_RESIDUAL_DROP;
    c.density = 0.05;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, P, &c, comm, &e));
    grads_t G = grads_new(L);
    size_t T = G.T;
    double *in = calloc(T, sizeof *in), *out = calloc(T, sizeof *out), *dropped = calloc(T, sizeof *dropped);
    assert_non_null(in);
    assert_non_null(out);
    assert_non_null(dropped);
    double total_dropped = 0.0;
    for (int64_t s = 0; s < 12; s++) {
        grads_fill(&G, 11, s);
        double want = 0.0;
        for (size_t t = 0; t < T; t++) {
            igrad_tensor_plan_t tp;
            assert_ok(igrad_engine_tensor_plan(e, t, &tp));
            const float *r = igrad_engine_residual(e, t);
            int due = expect_sent(tp.phase, c.release_period, s);
            for (int64_t i = 0; i < G.n[t]; i++) {
                in[t] += G.g[t][i];
                if (!due) {
                    float a = G.g[t][i] + r[i];
                    want += (double)a * a;
                    dropped[t] += a;
                }
            }
        }
        assert_ok(igrad_engine_sync(e, s, G.g));
        igrad_step_stats_t st;
        assert_ok(igrad_engine_last_stats(e, &st));
        if (!(fabs(st.dropped_sumsq - want) <= 1e-9 * want)) {
            print_error("step %lld: dropped_sumsq %.17g, expected %.17g\n", (long long)s,
                        st.dropped_sumsq, want);
            fail();
        }
        total_dropped += st.dropped_sumsq;
        for (size_t t = 0; t < T; t++) {
            igrad_tensor_plan_t tp;
            assert_ok(igrad_engine_tensor_plan(e, t, &tp));
            const float *r = igrad_engine_residual(e, t);
            int due = expect_sent(tp.phase, c.release_period, s);
            for (int64_t i = 0; i < G.n[t]; i++) {
                out[t] += G.g[t][i];
                if (!due && r[i] != 0.0f) {
                    print_error("step %lld tensor %zu: residual %lld is %g after a drop\n",
                                (long long)s, t, (long long)i, (double)r[i]);
                    fail();
                }
            }
        }
    }
    assert_true(total_dropped > 0.0);
    for (size_t t = 0; t < T; t++) {
        const float *r = igrad_engine_residual(e, t);
        double rs = 0.0, mag = 0.0;
        for (int64_t i = 0; i < G.n[t]; i++) {
            rs += r[i];
            mag += fabs((double)G.g[t][i]);
        }
        double err = fabs(in[t] - out[t] - rs - dropped[t]);
        if (!(err <= 1e-3 * (mag + 1.0))) {
            print_error("tensor %zu: in %.9g = out %.9g + residual %.9g + dropped %.9g? err %g\n",
                        t, in[t], out[t], rs, dropped[t], err);
            fail();
        }
    }
    free(in);
    free(out);
    free(dropped);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_profile_free(P);
    igrad_layout_free(L);
}

/* ---- equivalences ---------------------------------------------------------------- */

/* Runs two engines side by side; `mode` picks how engine b steps:
 * 0 two-phase with self-run collectives, 1 sync. */
static void run_pair(const igrad_config_t *ca, const igrad_config_t *cb, int mode, int steps,
                     const char *what)
{
    igrad_layout_t *L = make_layout();
    igrad_profile_t *P = fixed_rule_profile(L, "fixed:0.4");
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_engine_t *a = NULL, *b = NULL;
    assert_ok(igrad_engine_create(L, P, ca, comm, &a));
    assert_ok(igrad_engine_create(L, P, cb, comm, &b));
    grads_t Ga = grads_new(L), Gb = grads_new(L);
    for (int64_t s = 0; s < steps; s++) {
        grads_fill(&Ga, 5, s);
        grads_copy(&Gb, &Ga);
        assert_ok(igrad_engine_sync(a, s, Ga.g));
        if (mode == 0) {
            const igrad_bucket_t *bk = NULL;
            size_t nb = 0;
            assert_ok(igrad_engine_begin(b, s, Gb.g, &bk, &nb));
            for (size_t j = 0; j < nb; j++) {
                /* one rank: gather copies, reduce of one is in place */
                if (bk[j].kind == IGRAD_BUCKET_GATHER) {
                    assert_int_equal(bk[j].recv_nbytes, bk[j].send_nbytes);
                    assert_int_equal(bk[j].count, bk[j].send_nbytes);
                    memcpy(bk[j].recv, bk[j].send, bk[j].send_nbytes);
                } else {
                    assert_ptr_equal(bk[j].send, bk[j].recv);
                    assert_int_equal(bk[j].recv_nbytes, bk[j].count * 4);
                }
            }
            assert_ok(igrad_engine_end(b, s, Gb.g));
        } else {
            assert_ok(igrad_engine_sync(b, s, Gb.g));
        }
        assert_grads_equal(&Ga, &Gb, what);
    }
    assert_residuals_equal(a, b, &Ga, what);
    grads_free(&Ga);
    grads_free(&Gb);
    igrad_engine_free(a);
    igrad_engine_free(b);
    igrad_comm_free(comm);
    igrad_profile_free(P);
    igrad_layout_free(L);
}

static void test_two_phase_equals_sync(void **state)
{
    (void)state;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.block_entries = 50;
    run_pair(&c, &c, 0, 12, "two-phase vs sync (ig)");
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    run_pair(&c, &c, 0, 6, "two-phase vs sync (ig, reduce buckets)");
    c.method = IGRAD_METHOD_DENSE;
    run_pair(&c, &c, 0, 3, "two-phase vs sync (dense)");

    /* sync zeroes the gradients inside the selection pass, end zeroes them
     * before unpacking: every path of the pass must agree */
    igrad_config_t t = IGRAD_CONFIG_INIT;
    t.dense_below = 0;
    t.density = 0.05;
    t.block_entries = 50;
    t.method = IGRAD_METHOD_TOPK_SYNC;
    run_pair(&t, &t, 0, 4, "two-phase vs sync (topk_sync)");
    t.density = 1.0; /* every spec keeps all: the dense path of the selection */
    run_pair(&t, &t, 0, 3, "two-phase vs sync (topk_sync, density 1)");
    igrad_config_t r = IGRAD_CONFIG_INIT;
    r.dense_below = 0;
    r.density = 0.05;
    r.block_entries = 50;
    r.momentum = 0.9;
    run_pair(&r, &r, 0, 6, "two-phase vs sync (ig, momentum)");
    r.momentum = 0.0;
    r.residual = IGRAD_RESIDUAL_DROP;
    run_pair(&r, &r, 0, 6, "two-phase vs sync (ig, residual drop)");
}

static void test_reduce_equals_gather(void **state)
{
    (void)state;
    igrad_config_t a = IGRAD_CONFIG_INIT, b = IGRAD_CONFIG_INIT;
    a.density = b.density = 0.05;
    a.block_entries = b.block_entries = 33;
    a.collective = IGRAD_COLLECTIVE_GATHER;
    b.collective = IGRAD_COLLECTIVE_REDUCE;
    run_pair(&a, &b, 1, 10, "gather vs reduce buckets (ig adtopk)");
    a.sparsifier = b.sparsifier = IGRAD_SPARSIFIER_TOPK;
    a.interleave = b.interleave = 1;
    run_pair(&a, &b, 1, 10, "gather vs reduce buckets (ig topk)");
    a.method = b.method = IGRAD_METHOD_IAD;
    run_pair(&a, &b, 1, 8, "gather vs reduce buckets (iad)");
}

/* config.threads spreads the tensors of a step over threads; each
 * selection then runs in one piece (select.c splits a tensor only outside
 * a parallel region). Splitting one tensor: tests/test_select_threads.c. */
static void test_threads_do_not_matter(void **state)
{
    (void)state;
    igrad_config_t a = IGRAD_CONFIG_INIT, b = IGRAD_CONFIG_INIT;
    a.threads = 1;
    b.threads = 3;
    a.density = b.density = 0.02;
    run_pair(&a, &b, 1, 8, "1 vs 3 threads");
}

/* ---- state files ------------------------------------------------------------------- */

static char tmpdir[256];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/igrad_test_engine_XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
}

/* Save at step 50 of 100, load into a fresh engine, continue: the same
 * gradients and residuals as without the interruption (risk packing, so
 * the size history has to come back too: its bucket loads are compared). */
static void test_save_load_resume(void **state)
{
    (void)state;
    make_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/state.rank0.bin", tmpdir);
    igrad_layout_t *L = make_layout();
    igrad_profile_t *P = fixed_rule_profile(L, "fixed:0.4");
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.density = 0.05;
    c.pack = IGRAD_PACK_RISK;
    c.block_entries = 64;
    c.buckets = 3;
    igrad_engine_t *a = NULL, *b = NULL;
    assert_ok(igrad_engine_create(L, P, &c, comm, &a));
    assert_ok(igrad_engine_create(L, P, &c, comm, &b));
    grads_t Ga = grads_new(L), Gb = grads_new(L);
    const int steps = 100, cut = 50;
    for (int64_t s = 0; s < steps; s++) {
        grads_fill(&Ga, 9, s);
        grads_copy(&Gb, &Ga);
        assert_ok(igrad_engine_sync(a, s, Ga.g));
        if (s == cut) {
            assert_ok(igrad_engine_save_state(b, path));
            igrad_engine_free(b);
            b = NULL;
            assert_ok(igrad_engine_create(L, P, &c, comm, &b));
            assert_int_equal(igrad_engine_step(b), -1);
            assert_ok(igrad_engine_load_state(b, path));
            assert_int_equal(igrad_engine_step(b), cut - 1);
        }
        assert_ok(igrad_engine_sync(b, s, Gb.g));
        assert_grads_equal(&Ga, &Gb, "resumed run vs uninterrupted");
        igrad_step_stats_t sa, sb;
        assert_ok(igrad_engine_last_stats(a, &sa));
        assert_ok(igrad_engine_last_stats(b, &sb));
        assert_int_equal(sa.bucket_count, sb.bucket_count);
        for (int j = 0; j < sa.bucket_count; j++)
            assert_int_equal(sa.bucket_loads[j], sb.bucket_loads[j]);
    }
    assert_residuals_equal(a, b, &Ga, "resumed run vs uninterrupted");

    /* corrupt and truncated files: IGRAD_E_FORMAT, engine unchanged */
    assert_ok(igrad_engine_save_state(a, path));
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *bytes = malloc((size_t)size);
    assert_non_null(bytes);
    assert_int_equal(fread(bytes, 1, (size_t)size, fp), (size_t)size);
    fclose(fp);
    char bad[512];
    snprintf(bad, sizeof bad, "%s/bad.bin", tmpdir);
    float before = igrad_engine_residual(b, 1)[3];
    long cuts[] = {0, 5, 40, size / 2, size - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        fp = fopen(bad, "wb");
        assert_non_null(fp);
        fwrite(bytes, 1, (size_t)cuts[k], fp);
        fclose(fp);
        igrad_status_t st = igrad_engine_load_state(b, bad);
        assert_status(st, IGRAD_E_FORMAT);
    }
    bytes[size / 2] ^= 0x10; /* inside the residuals */
    fp = fopen(bad, "wb");
    fwrite(bytes, 1, (size_t)size, fp);
    fclose(fp);
    assert_status(igrad_engine_load_state(b, bad), IGRAD_E_FORMAT);
    assert_error_has("checksum");
    assert_true(igrad_engine_residual(b, 1)[3] == before);
    assert_status(igrad_engine_load_state(b, "/nonexistent/dir/x.bin"), IGRAD_E_IO);
    unlink(bad);
    free(bytes);

    /* another config / profile: IGRAD_E_MISMATCH naming it */
    igrad_config_t c2 = c;
    c2.density = 0.02;
    igrad_engine_t *m = NULL;
    assert_ok(igrad_engine_create(L, P, &c2, comm, &m));
    assert_status(igrad_engine_load_state(m, path), IGRAD_E_MISMATCH);
    assert_error_has("config.density differs");
    igrad_engine_free(m);
    igrad_profile_t *P2 = fixed_rule_profile(L, "fixed:0.7");
    assert_ok(igrad_engine_create(L, P2, &c, comm, &m));
    assert_status(igrad_engine_load_state(m, path), IGRAD_E_MISMATCH);
    assert_error_has("profile differs");
    igrad_engine_free(m);
    igrad_profile_free(P2);

    unlink(path);
    rmdir(tmpdir);
    grads_free(&Ga);
    grads_free(&Gb);
    igrad_engine_free(a);
    igrad_engine_free(b);
    igrad_comm_free(comm);
    igrad_profile_free(P);
    igrad_layout_free(L);
}

/* ---- faults ------------------------------------------------------------------------- */

static float *snapshot(const igrad_engine_t *e, const grads_t *G)
{
    int64_t total = 0;
    for (size_t t = 0; t < G->T; t++) total += G->n[t];
    float *s = malloc((size_t)total * sizeof *s);
    assert_non_null(s);
    int64_t off = 0;
    for (size_t t = 0; t < G->T; t++) {
        memcpy(s + off, igrad_engine_residual(e, t), (size_t)G->n[t] * sizeof(float));
        off += G->n[t];
    }
    return s;
}

static void assert_snapshot(const igrad_engine_t *e, const grads_t *G, const float *s)
{
    int64_t off = 0;
    for (size_t t = 0; t < G->T; t++) {
        if (memcmp(s + off, igrad_engine_residual(e, t), (size_t)G->n[t] * sizeof(float)) != 0) {
            print_error("residual of tensor %zu changed by a failed step\n", t);
            fail();
        }
        off += G->n[t];
    }
}

static void test_nonfinite_and_null(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_profile_t *P = fixed_rule_profile(L, "fixed:0.4");
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, P, &c, comm, &e));
    grads_t G = grads_new(L);
    for (int64_t s = 0; s < 3; s++) {
        grads_fill(&G, 1, s);
        assert_ok(igrad_engine_sync(e, s, G.g));
    }
    float *snap = snapshot(e, &G);
    size_t victims[] = {0, 5, G.T - 1};
    float poison[] = {NAN, INFINITY, -INFINITY};
    for (size_t v = 0; v < 3; v++) {
        grads_fill(&G, 1, 3);
        G.g[victims[v]][G.n[victims[v]] - 1] = poison[v];
        assert_status(igrad_engine_sync(e, 3, G.g), IGRAD_E_NONFINITE);
        igrad_tensor_info_t ti;
        assert_ok(igrad_layout_tensor(L, victims[v], &ti));
        assert_error_has(ti.name);
        assert_snapshot(e, &G, snap);
        igrad_step_stats_t st;
        assert_ok(igrad_engine_last_stats(e, &st));
        assert_int_equal(st.skipped, 1);
        /* two-phase fails the same way, and no end is needed */
        const igrad_bucket_t *bk = NULL;
        size_t nb = 0;
        assert_status(igrad_engine_begin(e, 3, G.g, &bk, &nb), IGRAD_E_NONFINITE);
        assert_snapshot(e, &G, snap);
    }
    /* NULL gradient pointer */
    grads_fill(&G, 1, 3);
    float *keep = G.g[4];
    G.g[4] = NULL;
    assert_status(igrad_engine_sync(e, 3, G.g), IGRAD_E_INVALID);
    igrad_tensor_info_t ti;
    assert_ok(igrad_layout_tensor(L, 4, &ti));
    assert_error_has(ti.name);
    assert_snapshot(e, &G, snap);
    G.g[4] = keep;
    assert_status(igrad_engine_sync(e, 3, NULL), IGRAD_E_INVALID);
    /* the step can be retried */
    assert_ok(igrad_engine_sync(e, 3, G.g));
    assert_int_equal(igrad_engine_step(e), 3);
    free(snap);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_profile_free(P);
    igrad_layout_free(L);
}

static void test_call_order(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    grads_t G = grads_new(L);
    grads_fill(&G, 2, 0);
    const igrad_bucket_t *bk = NULL;
    size_t nb = 0;
    assert_status(igrad_engine_end(e, 0, G.g), IGRAD_E_STATE);
    assert_ok(igrad_engine_begin(e, 0, G.g, &bk, &nb));
    assert_true(nb >= 1);
    assert_status(igrad_engine_begin(e, 0, G.g, &bk, &nb), IGRAD_E_STATE);
    assert_status(igrad_engine_sync(e, 1, G.g), IGRAD_E_STATE);
    assert_status(igrad_engine_save_state(e, "/tmp/never_written.bin"), IGRAD_E_STATE);
    assert_status(igrad_engine_end(e, 1, G.g), IGRAD_E_STATE);
    assert_error_has("step 0 is open");
    assert_status(igrad_engine_end(e, 0, NULL), IGRAD_E_INVALID);
    for (size_t j = 0; j < nb; j++)
        if (bk[j].kind == IGRAD_BUCKET_GATHER) memcpy(bk[j].recv, bk[j].send, bk[j].send_nbytes);
    assert_ok(igrad_engine_end(e, 0, G.g));
    assert_status(igrad_engine_end(e, 0, G.g), IGRAD_E_STATE);
    assert_status(igrad_engine_sync(NULL, 0, G.g), IGRAD_E_INVALID);
    igrad_tensor_plan_t tp;
    assert_status(igrad_engine_tensor_plan(e, G.T, &tp), IGRAD_E_INVALID);
    assert_null(igrad_engine_residual(e, G.T));
    igrad_config_t back;
    assert_ok(igrad_engine_config(e, &back));
    assert_int_equal(back.method, IGRAD_METHOD_ADTOPK_SYNC);
    grads_free(&G);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

/* ---- bytes from a peer, broken engine --------------------------------------- */

/* A one-rank custom communicator whose iallgather copies the rank's bytes
 * (as the self comm would) and then, when armed, writes `poke` over the
 * first index of the bucket (after its `nvalues` F32 values, 16-bit), or
 * fails with `fail` instead. */
typedef struct poke_comm {
    int armed;
    size_t nvalues;
    uint16_t poke;
    igrad_status_t fail;
} poke_comm_t;

static igrad_status_t pc_allgather(void *user, const void *send, size_t nbytes, void *recv)
{
    (void)user;
    if (send != recv) memmove(recv, send, nbytes);
    return IGRAD_OK;
}

static igrad_status_t pc_allreduce(void *user, const void *send, void *recv, size_t count,
                                   igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    (void)user, (void)op;
    if (send != recv) memmove(recv, send, count * igrad_dtype_nbytes(dtype));
    return IGRAD_OK;
}

static igrad_status_t pc_bcast(void *user, void *buf, size_t nbytes, int root)
{
    (void)user, (void)buf, (void)nbytes, (void)root;
    return IGRAD_OK;
}

static igrad_status_t pc_barrier(void *user)
{
    (void)user;
    return IGRAD_OK;
}

static igrad_status_t pc_iallgather(void *user, const void *send, size_t nbytes, void *recv,
                                    void **handle)
{
    poke_comm_t *pc = user;
    *handle = NULL;
    if (pc->armed && pc->fail != IGRAD_OK) return pc->fail;
    pc_allgather(user, send, nbytes, recv);
    if (pc->armed) {
        assert_true(nbytes >= pc->nvalues * 4 + 2);
        memcpy((unsigned char *)recv + pc->nvalues * 4, &pc->poke, 2);
    }
    return IGRAD_OK;
}

static igrad_status_t pc_wait(void *user, void *handle)
{
    (void)user, (void)handle;
    return IGRAD_OK;
}

static igrad_comm_t *poke_comm_create(poke_comm_t *pc)
{
    igrad_comm_ops_t ops = {.size = sizeof ops,
                            .allgather = pc_allgather,
                            .allreduce = pc_allreduce,
                            .bcast = pc_bcast,
                            .barrier = pc_barrier,
                            .iallgather = pc_iallgather,
                            .wait = pc_wait};
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_custom(&ops, pc, 0, 1, &comm));
    return comm;
}

/* One tensor of `ndim` dims, one block, one gather bucket; the first
 * received index is replaced by `poke`. @return the sync's status. */
/* The index code and poke offset (4-byte units into a rank's bytes) of
 * sync_with_poke: fixed widths, the first index after 20 values. */
static igrad_index_code_t poke_code = IGRAD_INDEX_CODE_FIXED;
static size_t poke_at = 20;

static igrad_status_t sync_with_poke(int ndim, uint16_t poke, igrad_method_t method,
                                     igrad_status_t fail, igrad_engine_t **keep)
{
    igrad_layout_t *L = NULL;
    assert_ok(igrad_layout_create(&L));
    int64_t flat[1] = {1000}, rows[2] = {10, 100};
    assert_ok(igrad_layout_add(L, "model.norm.weight", IGRAD_DTYPE_F32, ndim,
                               ndim == 1 ? flat : rows));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = method;
    c.density = 0.02; /* flat: 20 entries; row-wise: 2 per row */
    c.buckets = 1;
    c.index_code = poke_code;
    poke_comm_t pc = {0, poke_at, poke, fail};
    igrad_comm_t *comm = poke_comm_create(&pc);
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    float *g = malloc(1000 * sizeof *g);
    assert_non_null(g);
    for (int i = 0; i < 1000; i++) g[i] = (float)((i * 37) % 101) - 50.0f;
    assert_ok(igrad_engine_sync(e, 0, &g));
    for (int i = 0; i < 1000; i++) g[i] = (float)((i * 37) % 101) - 50.0f;
    pc.armed = 1;
    igrad_status_t st = igrad_engine_sync(e, 1, &g);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", igrad_last_error());
    if (st != IGRAD_OK) {
        /* broken: every later call fails fast, quoting the first error */
        pc.armed = 0;
        const igrad_bucket_t *bk = NULL;
        size_t nb = 0;
        assert_status(igrad_engine_sync(e, 2, &g), IGRAD_E_STATE);
        assert_error_has("unusable");
        assert_error_has(igrad_status_str(st));
        assert_status(igrad_engine_begin(e, 2, &g, &bk, &nb), IGRAD_E_STATE);
        assert_status(igrad_engine_end(e, 2, &g), IGRAD_E_STATE);
        assert_status(igrad_engine_save_state(e, "/tmp/igrad_never_written.bin"), IGRAD_E_STATE);
        assert_status(igrad_engine_load_state(e, "/tmp/igrad_never_read.bin"), IGRAD_E_STATE);
    }
    free(g);
    if (keep) *keep = e;
    else igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_layout_free(L);
    igrad__fail(st, __FILE__, __LINE__, "%s", msg); /* the sync's message again */
    return st;
}

static void test_peer_index_bounds(void **state)
{
    (void)state;
    /* flat: indices < n = 1000; n - 1 is fine, n is refused */
    assert_ok(sync_with_poke(1, 999, IGRAD_METHOD_TOPK_SYNC, IGRAD_OK, NULL));
    assert_status(sync_with_poke(1, 1000, IGRAD_METHOD_TOPK_SYNC, IGRAD_OK, NULL), IGRAD_E_COMM);
    assert_error_has("step 1: bucket 0: rank 0 sent index 1000 for tensor model.norm.weight");
    assert_error_has("outside [0, 1000)");
    assert_status(sync_with_poke(1, 65535, IGRAD_METHOD_TOPK_SYNC, IGRAD_OK, NULL), IGRAD_E_COMM);
    /* row-wise (adtopk, even step 0... and step 1 without interleave):
     * column indices < cols = 100 */
    assert_ok(sync_with_poke(2, 99, IGRAD_METHOD_ADTOPK_SYNC, IGRAD_OK, NULL));
    assert_status(sync_with_poke(2, 100, IGRAD_METHOD_ADTOPK_SYNC, IGRAD_OK, NULL), IGRAD_E_COMM);
    assert_error_has("rank 0 sent index 100 for tensor model.norm.weight");
    assert_error_has("outside [0, 100) (a column of its row)");
    /* compact: 20 of 1000 flat is an Elias–Fano run (l 5: 100 low bits,
     * then 51 high bits); 16 ones poked into its high part (bytes 16–17 of
     * the code, after 80 bytes of values) are refused, naming the code */
    poke_code = IGRAD_INDEX_CODE_COMPACT;
    poke_at = 24;
    assert_status(sync_with_poke(1, 0xffff, IGRAD_METHOD_TOPK_SYNC, IGRAD_OK, NULL),
                  IGRAD_E_COMM);
    assert_error_has("step 1: bucket 0: rank 0 sent a bad elias-fano index code for tensor "
                     "model.norm.weight");
    poke_code = IGRAD_INDEX_CODE_FIXED;
    poke_at = 20;
}

/* A collective that fails after the agreement (here a custom comm's
 * timeout) breaks the engine; the message names the step and the bucket,
 * and a timed-out engine can still be freed (its buffers are leaked on
 * purpose, which ASan's leak check is told to ignore in this suite). */
static void test_broken_after_comm_failure(void **state)
{
    (void)state;
    assert_status(sync_with_poke(1, 0, IGRAD_METHOD_TOPK_SYNC, IGRAD_E_COMM, NULL), IGRAD_E_COMM);
    assert_error_has("step 1: bucket 0 (gather of ");
    assert_error_has("custom comm: iallgather callback returned 8");
    assert_status(sync_with_poke(1, 0, IGRAD_METHOD_TOPK_SYNC, IGRAD_E_TIMEOUT, NULL),
                  IGRAD_E_TIMEOUT);
    assert_error_has("step 1: bucket 0 (gather of ");
    assert_error_has("returned 10 (timed out)");
}

/* The trace hook records each selection: a profile can be built from it. */
static void test_trace_hook(void **state)
{
    (void)state;
    igrad_layout_t *L = make_layout();
    igrad_comm_t *comm = NULL;
    assert_ok(igrad_comm_create_self(&comm));
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    igrad_engine_t *e = NULL;
    assert_ok(igrad_engine_create(L, NULL, &c, comm, &e));
    igrad_trace_t *tr = NULL;
    assert_ok(igrad_trace_create(L, &tr));
    assert_ok(igrad_engine_set_trace(e, tr));
    grads_t G = grads_new(L);
    for (int64_t s = 0; s < 5; s++) {
        grads_fill(&G, 4, s);
        assert_ok(igrad_engine_sync(e, s, G.g));
    }
    assert_int_equal(igrad_trace_step_count(tr), 5);
    assert_string_equal(igrad_trace_sparsifier(tr), "adtopk");
    /* component 0 at step 0: retained = its tensors' budgets */
    int64_t retained = -1;
    assert_ok(igrad_trace_value(tr, 0, 0, NULL, &retained));
    int64_t want = 0;
    for (size_t t = 0; t < G.T; t++) {
        igrad_tensor_info_t ti;
        assert_ok(igrad_layout_tensor(L, t, &ti));
        if (ti.component != 0) continue;
        int64_t cnt;
        int idxb;
        expect_tensor(&ti, &c, 0, 0, &cnt, &idxb);
        want += cnt;
    }
    assert_int_equal(retained, want);
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    igrad_profile_t *P = NULL;
    assert_ok(igrad_profile_build(tr, &opts, &P));
    igrad_profile_free(P);
    assert_ok(igrad_engine_set_trace(e, NULL));

    /* a trace of another layout is refused */
    igrad_layout_t *L2 = NULL;
    int64_t sq[2] = {8, 8};
    assert_ok(igrad_layout_create(&L2));
    assert_ok(igrad_layout_add(L2, "model.layers.0.self_attn.q_proj.weight", IGRAD_DTYPE_F32, 2,
                               sq));
    igrad_trace_t *tr2 = NULL;
    assert_ok(igrad_trace_create(L2, &tr2));
    assert_status(igrad_engine_set_trace(e, tr2), IGRAD_E_MISMATCH);
    igrad_trace_free(tr2);
    igrad_layout_free(L2);

    grads_free(&G);
    igrad_trace_free(tr);
    igrad_engine_free(e);
    igrad_comm_free(comm);
    igrad_layout_free(L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_config_validate),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_ig_default),
        cmocka_unit_test(test_ig_variants),
        cmocka_unit_test(test_other_methods),
        cmocka_unit_test(test_topk_reference),
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_drop),
        cmocka_unit_test(test_two_phase_equals_sync),
        cmocka_unit_test(test_reduce_equals_gather),
        cmocka_unit_test(test_threads_do_not_matter),
        cmocka_unit_test(test_save_load_resume),
        cmocka_unit_test(test_nonfinite_and_null),
        cmocka_unit_test(test_call_order),
        cmocka_unit_test(test_trace_hook),
        cmocka_unit_test(test_peer_index_bounds),
        cmocka_unit_test(test_broken_after_comm_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
