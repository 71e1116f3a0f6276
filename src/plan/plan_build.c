/*
 * plan_build.c — the plan an engine makes at create (plan.h): the layout
 * copied into per-tensor plans and components, each tensor's select specs
 * and wire index widths, the release phases from the profile and the
 * schedule, the largest step (what the scratch is sized for), the plan
 * and profile hashes the ranks agree on, and the selection threads' work
 * order. Pure functions of layout, profile and config.
 */
#include "plan/plan.h"
#include "core/sparsifier.h"
#include "plan/allocate.h"
#include "plan/schedule.h"
#include "plan/route.h"
#include "profile/profile_internal.h"
#include "model/layout_internal.h"

#include "core/value8.h"
#include "core/wire_code.h"

#include <stdlib.h>
#include <string.h>

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Wire index bytes of one selection spec: the plan's sparsifier's (a
 * tensor below dense_below, whose spec is dense, keeps its indices). */
static int index_nbytes(const igrad__plan_t *p, const igrad_select_spec_t *sp)
{
    return igrad__sparsifiers[p->sp].index_nbytes(sp, p->cfg.index_dtype);
}

/* Checks that a profile describes the layout's components. The profile may
 * lack EMB/HEAD/NORM components (made before they were components): those
 * are important (plan_phases). Both lists are sorted by (layer, kind). A
 * shard's layout (the two-level sync, `subset`) holds some of the profiled
 * model's components: the profile may have more, and its layout hash is
 * the whole model's. */
static int comp_before(int layer, igrad_kind_t kind, int layer2, igrad_kind_t kind2)
{
    return layer < layer2 || (layer == layer2 && kind < kind2);
}

igrad_status_t igrad__plan_check_profile(const igrad_profile_t *profile,
                                    const igrad_layout_t *layout, int subset)
{
    size_t nc = igrad_layout_component_count(layout), np = igrad_profile_count(profile);
    uint64_t ph = igrad_profile_layout_hash(profile), lh = igrad_layout_hash(layout);
    IGRAD_FAIL_IF(!subset && ph != 0 && ph != lh, IGRAD_E_MISMATCH,
                  "profile does not match the layout: made for layout 0x%016llx, this layout "
                  "is 0x%016llx",
                  (unsigned long long)ph, (unsigned long long)lh);
    size_t p = 0;
    for (size_t c = 0; c < nc; c++) {
        igrad_component_info_t ci;
        igrad_profile_entry_t pe = {0};
        IGRAD_CHECK(igrad_layout_component(layout, c, &ci));
        if (p < np) IGRAD_CHECK(igrad_profile_entry(profile, p, &pe));
        while (subset && p < np && comp_before(pe.layer, pe.kind, ci.layer, ci.kind))
            if (++p < np) IGRAD_CHECK(igrad_profile_entry(profile, p, &pe));
        int same = p < np && ci.layer == pe.layer && ci.kind == pe.kind;
        if (!same && igrad__kind_is_outer(ci.kind)) continue; /* absent: important */
        IGRAD_FAIL_IF(p >= np, IGRAD_E_MISMATCH,
                      "profile does not match the layout: it has %zu components and lacks "
                      "the layout's (%d, %s)",
                      np, ci.layer, igrad_kind_name(ci.kind));
        IGRAD_FAIL_IF(!same || ci.count != pe.count, IGRAD_E_MISMATCH,
                      "profile does not match the layout at component %zu: profile has "
                      "(%d, %s) with %lld entries, layout (%d, %s) with %lld",
                      c, pe.layer, igrad_kind_name(pe.kind), (long long)pe.count, ci.layer,
                      igrad_kind_name(ci.kind), (long long)ci.count);
        p++;
    }
    IGRAD_FAIL_IF(!subset && p != np, IGRAD_E_MISMATCH,
                  "profile does not match the layout: %zu components in the profile, %zu of "
                  "them in the layout",
                  np, p);
    return IGRAD_OK;
}

/* Copies the layout's tensors and components into the engine. */
igrad_status_t igrad__plan_copy_layout(igrad__plan_t *p, const igrad_layout_t *layout)
{
    size_t T = igrad_layout_count(layout);
    IGRAD_FAIL_IF(T == 0, IGRAD_E_INVALID, "igrad_engine_create: the layout has no tensors");
    IGRAD_FAIL_IF(T > UINT32_MAX, IGRAD_E_INVALID,
                  "igrad_engine_create: %zu tensors, more than block keys can address", T);
    p->ntensors = T;
    p->t = calloc(T, sizeof *p->t);
    p->tensor_hash = calloc(T, sizeof *p->tensor_hash);
    IGRAD_FAIL_IF(!p->t || !p->tensor_hash, IGRAD_E_NOMEM,
                  "igrad_engine_create: out of memory");
    size_t names_nbytes = 0;
    for (size_t i = 0; i < T; i++) {
        igrad_tensor_info_t ti;
        IGRAD_CHECK(igrad_layout_tensor(layout, i, &ti));
        names_nbytes += strlen(ti.name) + 1;
    }
    p->names = malloc(names_nbytes);
    IGRAD_FAIL_IF(!p->names, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    char *at = p->names;
    for (size_t i = 0; i < T; i++) {
        igrad_tensor_info_t ti;
        IGRAD_CHECK(igrad_layout_tensor(layout, i, &ti));
        igrad__plan_tensor_t *tp = &p->t[i];
        size_t len = strlen(ti.name) + 1;
        memcpy(at, ti.name, len);
        tp->name = at;
        at += len;
        tp->ndim = ti.ndim;
        for (int d = 0; d < IGRAD_MAX_DIMS; d++) tp->shape[d] = ti.shape[d];
        tp->n = ti.count;
        tp->comp = ti.component;
        IGRAD_FAIL_IF(ti.count > (int64_t)UINT32_MAX + 1, IGRAD_E_INVALID,
                      "tensor %s has %lld entries, more than 32-bit indices address", ti.name,
                      (long long)ti.count);
        uint64_t h = igrad__hash_str(IGRAD__HASH_SEED, ti.name);
        h = igrad__hash_i64(h, (int64_t)ti.dtype);
        h = igrad__hash_i64(h, ti.ndim);
        for (int d = 0; d < ti.ndim; d++) h = igrad__hash_i64(h, ti.shape[d]);
        p->tensor_hash[i] = h;
    }
    size_t C = igrad_layout_component_count(layout);
    p->ncomp = C;
    size_t Cn = C ? C : 1;
    p->comp_layer = calloc(Cn, sizeof *p->comp_layer);
    p->comp_kind = calloc(Cn, sizeof *p->comp_kind);
    p->comp_count = calloc(Cn, sizeof *p->comp_count);
    p->comp_important = calloc(Cn, 1);
    p->comp_phase = calloc(Cn, sizeof *p->comp_phase);
    p->comp_keep = calloc(Cn, sizeof *p->comp_keep);
    IGRAD_FAIL_IF(!p->comp_layer || !p->comp_kind || !p->comp_count ||
                      !p->comp_important || !p->comp_phase || !p->comp_keep,
                  IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    for (size_t c = 0; c < C; c++) {
        igrad_component_info_t ci;
        IGRAD_CHECK(igrad_layout_component(layout, c, &ci));
        p->comp_layer[c] = ci.layer;
        p->comp_kind[c] = ci.kind;
        p->comp_count[c] = ci.count;
        p->comp_important[c] = 1;
        p->comp_keep[c] = p->cfg.release_keep;
    }
    return IGRAD_OK;
}

/* Specs, index widths and block cuts of every tensor. */
igrad_status_t igrad__plan_tensors(igrad__plan_t *p)
{
    const igrad_config_t *c = &p->cfg;
    for (size_t i = 0; i < p->ntensors; i++) {
        igrad__plan_tensor_t *tp = &p->t[i];
        double keep = tp->comp >= 0 ? p->comp_keep[tp->comp] : c->release_keep;
        double rscale = c->method == IGRAD_METHOD_IG
                            ? igrad__release_scale(keep, c->release_period)
                            : 1.0;
        for (int rel = 0; rel < 2; rel++)
            for (int par = 0; par < 2; par++) {
                igrad_select_spec_t *sp = &tp->spec[rel][par];
                /* below config.dense_below: every entry, whenever it is sent */
                igrad_sparsifier_t tsp =
                    !igrad__sparsifier_dense(p->sp) && tp->n < c->dense_below
                        ? IGRAD_SPARSIFIER_NONE
                        : p->sp;
                IGRAD_CHECK(igrad_select_spec(tsp, c->density, rel ? rscale : 1.0,
                                              c->interleave, par, tp->ndim, tp->shape, sp));
                tp->idx_nbytes[rel][par] = index_nbytes(p, sp);
                int64_t blk = c->block_entries;
                if (sp->row_wise) {
                    /* whole rows per block, so a block's row is known from
                     * its position and indices can be column indices */
                    int64_t rows_per = blk / sp->per_row;
                    blk = sp->per_row * (rows_per > 0 ? rows_per : 1);
                }
                tp->blk_entries[rel][par] = blk;
                tp->nblocks[rel][par] = igrad__pack_split_count(sp->count, blk);
            }
    }
    return IGRAD_OK;
}

/* Bytes a tensor sends at a step kind with the fixed index widths (FP8
 * values: and a scale per block). */
int64_t igrad__plan_tensor_nbytes(const igrad__plan_t *p, const igrad__plan_tensor_t *tp, int rel,
                             int par)
{
    int64_t scales = p->value_nbytes == 1 ? tp->nblocks[rel][par] * IGRAD__FP8_SCALE_NBYTES : 0;
    return tp->spec[rel][par].count * (p->value_nbytes + tp->idx_nbytes[rel][par]) + scales;
}

/* The bytes its blocks take on the gather wire (config.index_code). */
int64_t igrad__plan_tensor_wire_nbytes(const igrad__plan_t *p, const igrad__plan_tensor_t *tp,
                                       int rel, int par)
{
    const igrad_select_spec_t *sp = &tp->spec[rel][par];
    int64_t blk = tp->blk_entries[rel][par], total = 0;
    if (blk <= 0) blk = sp->count;
    igrad__step_block_t bi;
    memset(&bi, 0, sizeof bi);
    bi.tensor = (uint32_t)(tp - p->t);
    bi.idx_nbytes = tp->idx_nbytes[rel][par];
    bi.row_wise = sp->row_wise;
    for (int64_t f = 0; f < sp->count; f += blk) {
        bi.count = sp->count - f < blk ? sp->count - f : blk;
        igrad__plan_block_code(p, sp, &bi);
        total += igrad__value_area_nbytes(p->value_nbytes, bi.count) +
                 igrad__step_block_idx_bytes(&bi);
    }
    return total;
}

void igrad__plan_block_code(const igrad__plan_t *p, const igrad_select_spec_t *sp,
                            igrad__step_block_t *bi)
{
    bi->idx_code = IGRAD__CODE_NONE;
    bi->code_k = bi->code_u = bi->code_nbytes = 0;
    if (p->cfg.index_code != IGRAD_INDEX_CODE_COMPACT || bi->idx_nbytes == 0 || bi->count <= 0)
        return;
    bi->code_k = sp->row_wise ? sp->per_row : bi->count;
    bi->code_u = sp->row_wise ? sp->cols : p->t[bi->tensor].n;
    bi->idx_code = igrad__code_choose(bi->code_k, bi->code_u, bi->idx_nbytes);
    bi->code_nbytes = igrad__code_nbytes(bi->idx_code, bi->code_k, bi->code_u);
}

/* Floats a tensor needs in reduce buckets (its dense segments). */
static int64_t tensor_dense_cap(const igrad__plan_t *p, const igrad__plan_tensor_t *tp, int rel,
                                int par)
{
    const igrad_select_spec_t *sp = &tp->spec[rel][par];
    int64_t nb = tp->nblocks[rel][par];
    if (igrad__sparsifier_dense(p->sp) || sp->row_wise || nb <= 1 ||
        p->per_tensor_buckets)
        return tp->n;
    /* flat blocks of one tensor in k buckets carry the whole tensor k times */
    return tp->n * (nb < p->nb_max ? nb : p->nb_max);
}

/* Phases: important components and OTHER every step, the rest by the
 * schedule, weighted by their release payload. EMB/HEAD/NORM components
 * are important when the profile lacks them. */
igrad_status_t igrad__plan_phases(igrad__plan_t *p, const igrad_profile_t *profile)
{
    size_t C = p->ncomp;
    for (size_t c = 0; c < C; c++) p->comp_phase[c] = IGRAD__PHASE_EVERY;
    if (p->deferral) {
        /* none: all important (online); the budget allocation: its own */
        for (size_t c = 0; c < C && profile && !p->allocated; c++) {
            int outer = igrad__kind_is_outer(p->comp_kind[c]);
            int imp =
                igrad_profile_is_important(profile, p->comp_layer[c], p->comp_kind[c]);
            if (outer && imp < 0) imp = 1;
            IGRAD_FAIL_IF(imp < 0, IGRAD_E_MISMATCH,
                          "profile has no component (%d, %s) of the layout", p->comp_layer[c],
                          igrad_kind_name(p->comp_kind[c]));
            p->comp_important[c] = (unsigned char)imp;
        }
        if (C > 0) {
            int64_t *rel_nbytes = calloc(C, sizeof *rel_nbytes);
            IGRAD_FAIL_IF(!rel_nbytes, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
            for (size_t i = 0; i < p->ntensors; i++)
                if (p->t[i].comp >= 0)
                    rel_nbytes[p->t[i].comp] += igrad__plan_tensor_nbytes(p, &p->t[i], 1, 0);
            igrad_status_t st =
                igrad__schedule_assign(p->cfg.schedule, p->cfg.release_period, C,
                                       rel_nbytes, p->comp_important, p->comp_phase);
            free(rel_nbytes);
            IGRAD_CHECK(st);
        }
    }
    for (size_t i = 0; i < p->ntensors; i++) {
        igrad__plan_tensor_t *tp = &p->t[i];
        tp->important = tp->comp < 0 ? 1 : p->comp_important[tp->comp];
        tp->phase = tp->comp < 0 ? IGRAD__PHASE_EVERY : p->comp_phase[tp->comp];
    }
    return IGRAD_OK;
}

typedef struct phase_sum {
    int phase;
    int64_t v[4]; /* entries, blocks, bytes, dense floats */
} phase_sum_t;

static int cmp_phase(const void *pa, const void *pb)
{
    const phase_sum_t *a = pa, *b = pb;
    return (a->phase > b->phase) - (a->phase < b->phase);
}

/* Largest step of the cycle, per quantity: everything sent every step plus
 * the heaviest phase's releases (each quantity maximised on its own, so
 * the result bounds every step). */
igrad_status_t igrad__plan_maxima(igrad__plan_t *p, int64_t out[4])
{
    int64_t every[4] = {0, 0, 0, 0};
    size_t nlow = 0;
    for (size_t i = 0; i < p->ntensors; i++)
        if (p->t[i].phase >= 0) nlow++;
    phase_sum_t *low = calloc(nlow ? nlow : 1, sizeof *low);
    IGRAD_FAIL_IF(!low, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < p->ntensors; i++) {
        const igrad__plan_tensor_t *tp = &p->t[i];
        int rel = tp->phase >= 0;
        int64_t v[4];
        v[0] = tp->spec[rel][0].count; /* the same on both parities */
        v[1] = max64(tp->nblocks[rel][0], tp->nblocks[rel][1]);
        v[2] = max64(igrad__plan_tensor_nbytes(p, tp, rel, 0),
                     igrad__plan_tensor_nbytes(p, tp, rel, 1));
        v[3] = max64(tensor_dense_cap(p, tp, rel, 0), tensor_dense_cap(p, tp, rel, 1));
        if (!rel) {
            for (int q = 0; q < 4; q++) every[q] += v[q];
        } else {
            low[k].phase = tp->phase;
            memcpy(low[k].v, v, sizeof v);
            k++;
        }
    }
    qsort(low, nlow, sizeof *low, cmp_phase);
    int64_t best[4] = {0, 0, 0, 0};
    for (size_t a = 0; a < nlow;) {
        int64_t sum[4] = {0, 0, 0, 0};
        size_t b = a;
        for (; b < nlow && low[b].phase == low[a].phase; b++)
            for (int q = 0; q < 4; q++) sum[q] += low[b].v[q];
        for (int q = 0; q < 4; q++) best[q] = max64(best[q], sum[q]);
        a = b;
    }
    free(low);
    for (int q = 0; q < 4; q++) out[q] = every[q] + best[q];
    return IGRAD_OK;
}

/* Blocks of every tensor at its normal budget (even step), readiness order. */
igrad_status_t igrad__plan_full_blocks(const igrad__plan_t *p, igrad__pack_block_t **out,
                                  size_t *nout)
{
    size_t n = 0;
    for (size_t i = 0; i < p->ntensors; i++) n += (size_t)p->t[i].nblocks[0][0];
    igrad__pack_block_t *b = calloc(n ? n : 1, sizeof *b);
    IGRAD_FAIL_IF(!b, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    size_t m = 0;
    for (size_t k = p->ntensors; k-- > 0;) {
        const igrad__plan_tensor_t *tp = &p->t[k];
        m += (size_t)igrad__pack_split((uint32_t)k, tp->spec[0][0].count, tp->blk_entries[0][0],
                                       p->value_nbytes + tp->idx_nbytes[0][0],
                                       (int64_t)(p->ntensors - 1 - k), b + m);
    }
    *out = b;
    *nout = m;
    return IGRAD_OK;
}

uint64_t igrad__plan_hash(const igrad__plan_t *p)
{
    uint64_t h =
        igrad__schedule_hash(IGRAD__HASH_SEED, p->cfg.schedule, p->cfg.release_period,
                             p->cfg.release_keep, p->ncomp, p->comp_phase);
    if (p->allocated) /* each component's kappa (only then not release_keep) */
        for (size_t c = 0; c < p->ncomp; c++) {
            uint64_t u;
            memcpy(&u, &p->comp_keep[c], sizeof u);
            h = igrad__hash_i64(h, (int64_t)u);
        }
    for (size_t i = 0; i < p->ntensors; i++) {
        const igrad__plan_tensor_t *tp = &p->t[i];
        h = igrad__hash_i64(h, tp->phase);
        for (int rel = 0; rel < 2; rel++)
            for (int par = 0; par < 2; par++) {
                const igrad_select_spec_t *sp = &tp->spec[rel][par];
                h = igrad__hash_i64(h, sp->row_wise);
                h = igrad__hash_i64(h, sp->per_row);
                h = igrad__hash_i64(h, sp->count);
                h = igrad__hash_i64(h, tp->idx_nbytes[rel][par]);
                h = igrad__hash_i64(h, tp->blk_entries[rel][par]);
            }
    }
    h = igrad__pack_map_hash(h, &p->map);
    return h;
}

uint64_t igrad__plan_profile_hash(const igrad__plan_t *p)
{
    if (!p->deferral) return 0;
    uint64_t h = igrad__hash_i64(IGRAD__HASH_SEED, (int64_t)p->ncomp);
    for (size_t c = 0; c < p->ncomp; c++) {
        h = igrad__hash_i64(h, p->comp_layer[c]);
        h = igrad__hash_i64(h, (int64_t)p->comp_kind[c]);
        h = igrad__hash_i64(h, p->comp_count[c]);
        h = igrad__hash_i64(h, p->comp_important[c]);
    }
    return h;
}

static int cmp_work(const void *pa, const void *pb, const igrad__plan_t *p)
{
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    if (p->t[a].n != p->t[b].n) return p->t[a].n > p->t[b].n ? -1 : 1;
    return (a > b) - (a < b);
}

/* Static work order for the selection threads: largest tensors first, so
 * the dynamic schedule ends with small ones (an insertion sort: a few
 * hundred tensors, once). */
void igrad__plan_sort_work(const igrad__plan_t *p, uint32_t *work)
{
    for (size_t i = 0; i < p->ntensors; i++) work[i] = (uint32_t)i;
    for (size_t i = 1; i < p->ntensors; i++) {
        uint32_t x = work[i];
        size_t j = i;
        while (j > 0 && cmp_work(&work[j - 1], &x, p) > 0) {
            work[j] = work[j - 1];
            j--;
        }
        work[j] = x;
    }
}

static int method_defers(igrad_method_t m)
{
    return m == IGRAD_METHOD_IAD || m == IGRAD_METHOD_IG;
}

igrad_status_t igrad__plan_build(igrad__plan_t *p, const igrad_layout_t *layout,
                                 const igrad_profile_t *profile, int shard)
{
    const igrad_config_t *c = &p->cfg;
    int dense = igrad__sparsifier_dense(p->sp);
    p->kargs = (igrad__kernel_args_t){.momentum = (float)c->momentum,
                                      .grad_dtype = c->grad_dtype,
                                      .value_dtype = c->value_dtype,
                                      .residual_drop = c->residual == IGRAD_RESIDUAL_DROP};
    p->deferral = method_defers(c->method);
    p->per_tensor_buckets = c->method == IGRAD_METHOD_IAD;
    IGRAD_FAIL_IF(p->deferral && !profile && c->profile_steps == 0, IGRAD_E_INVALID,
                  "igrad_engine_create: method %s needs a profile (igrad_profile_build or "
                  "igrad_profile_load) or config.profile_steps > 0 (online profiling)",
                  igrad_method_name(c->method));
    if (p->deferral && profile) IGRAD_CHECK(igrad__plan_check_profile(profile, layout, shard));
    /* iad/ig: the engine's online state copies the partition string and points at the copy */
    if (!p->deferral) p->cfg.profile_partition = NULL;

    IGRAD_CHECK(igrad__plan_copy_layout(p, layout));
    size_t T = p->ntensors;
    for (size_t i = 0; i < T; i++) p->nparams += p->t[i].n;
    p->nb_max = p->per_tensor_buckets ? (int)(T < INT32_MAX ? T : INT32_MAX) : c->buckets;
    if (p->deferral && profile && c->method == IGRAD_METHOD_IG && c->target_ratio > 0.0 &&
        c->allocation == IGRAD_ALLOCATION_BUDGET) {
        /* a pure function of the agreed profile and config (allocate.h) */
        int met = 0;
        IGRAD_CHECK(igrad__allocate(layout, profile, c, c->target_ratio, p->comp_important,
                                    p->comp_keep, &p->alloc_ratio, &met));
        p->allocated = 1;
    }
    IGRAD_CHECK(igrad__plan_tensors(p));
    IGRAD_CHECK(igrad__plan_phases(p, profile));

    if (c->pack == IGRAD_PACK_DIRECT && !p->per_tensor_buckets) {
        igrad__pack_block_t *full = NULL;
        size_t nfull = 0;
        IGRAD_CHECK(igrad__plan_full_blocks(p, &full, &nfull));
        igrad_status_t st = igrad__pack_map_build(full, nfull, c->buckets, &p->map);
        free(full);
        IGRAD_CHECK(st);
    }
    if (c->pack == IGRAD_PACK_RISK && !p->per_tensor_buckets) {
        size_t nkeys = 0;
        for (size_t i = 0; i < T; i++) {
            const igrad__plan_tensor_t *tp = &p->t[i];
            nkeys += (size_t)max64(max64(tp->nblocks[0][0], tp->nblocks[0][1]),
                                   max64(tp->nblocks[1][0], tp->nblocks[1][1]));
        }
        uint64_t *keys = malloc((nkeys ? nkeys : 1) * sizeof *keys);
        IGRAD_FAIL_IF(!keys, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
        size_t k = 0;
        for (size_t i = 0; i < T; i++) {
            const igrad__plan_tensor_t *tp = &p->t[i];
            int64_t nb = max64(max64(tp->nblocks[0][0], tp->nblocks[0][1]),
                               max64(tp->nblocks[1][0], tp->nblocks[1][1]));
            for (int64_t b = 0; b < nb; b++) keys[k++] = igrad__pack_key((uint32_t)i, (uint32_t)b);
        }
        igrad_status_t st = igrad__pack_history_init(&p->hist, keys, nkeys);
        free(keys);
        IGRAD_CHECK(st);
    }

    /* buffers for the largest step */
    int64_t mx[4];
    IGRAD_CHECK(igrad__plan_maxima(p, mx));
    p->max_entries = dense ? 0 : (size_t)mx[0];
    p->max_blocks = (size_t)mx[1];
    p->max_gather_nbytes = mx[2];
    p->max_dense_count = mx[3];
    return IGRAD_OK;
}

igrad_status_t igrad__plan_warm(igrad__plan_t *w, const igrad__plan_t *p,
                                const igrad_layout_t *layout, int shard)
{
    w->cfg = p->cfg;
    w->cfg.method = IGRAD_METHOD_DENSE;
    w->cfg.momentum = 0.0;
    w->cfg.start_iter = 0;
    w->cfg.profile_steps = 0; /* online profiling is the method's, after the warm-up */
    w->cfg.reprofile_every = 0;
    w->cfg.target_ratio = 0.0;
    w->cfg.value_dtype = IGRAD_DTYPE_F32; /* as method dense requires */
    w->sp = IGRAD_SPARSIFIER_NONE;
    w->value_nbytes = (int)igrad_dtype_nbytes(w->cfg.value_dtype);
    w->nthreads = p->nthreads;
    w->rank = p->rank;
    w->nranks = p->nranks;
    w->node_ranks = p->node_ranks;
    w->avg_ranks = p->avg_ranks;
    w->auto_sar = 0; /* the sparse all-reduce is for sparse methods only (route.c) */
    return igrad__plan_build(w, layout, NULL, shard);
}

void igrad__plan_free(igrad__plan_t *p)
{
    igrad__pack_map_free(&p->map);
    igrad__pack_history_free(&p->hist);
    free(p->t);
    free(p->names);
    free(p->tensor_hash);
    free(p->comp_layer);
    free(p->comp_kind);
    free(p->comp_count);
    free(p->comp_important);
    free(p->comp_phase);
    free(p->comp_keep);
}
