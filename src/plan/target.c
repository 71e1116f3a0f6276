/*
 * target.c — budget-driven planning (igrad_target_fit): the important set
 * and kappa that make ig send a chosen share of its sparsifier's *_sync
 * payload, from a profile's scores and the layout's per-tensor budgets.
 *
 * The payload model is the engine's own plan, not the f_imp + kappa(1 -
 * f_imp) approximation: per tensor the wire bytes of igrad_select_spec()
 * at scale 1 (sent every step) or at the release scale kappa*R (once per R
 * steps), with the engine's index widths (U16 where the index range fits),
 * averaged over even and odd steps. Per-row rounding of ADTopk therefore
 * counts: a row that keeps 3 entries releases at least one per R steps, so
 * small kappas cost more than kappa says. tests/test_target.c checks the
 * model against igrad_engine_predict_payload() and the choice against a
 * brute force. igrad__target_fit_kappa is the second half alone: kappa for
 * the profile's own important set (periodic re-profiling, whose classes
 * come from the hysteresis rule). The phase schedule is not here
 * (engine.c, schedule.c).
 */
#include "core/internal.h"
#include "plan/allocate.h"
#include "plan/schedule.h"

#include <math.h>
#include <stdlib.h>

typedef struct comp_cost {
    double score;
    double every;   /* bytes per step when sent every step */
    double release; /* bytes per step when deferred (at the current kappa) */
} comp_cost_t;

igrad_status_t igrad__target_tensor_spec(const igrad_config_t *c, igrad_sparsifier_t sp,
                                         const igrad_tensor_info_t *ti, double scale,
                                         int parity, int64_t *count, int64_t *nbytes)
{
    igrad_select_spec_t s;
    IGRAD_CHECK(igrad_select_spec(sp, c->density, scale, c->interleave, parity, ti->ndim,
                                  ti->shape, &s));
    int64_t range = s.row_wise ? s.cols : s.n;
    int64_t ib = c->index_dtype == IGRAD_DTYPE_U16 && range <= 65536 ? 2 : 4;
    *count = s.count;
    *nbytes = s.count * ((int64_t)igrad_dtype_nbytes(c->value_dtype) + ib);
    return IGRAD_OK;
}

igrad_sparsifier_t igrad__target_tensor_sparsifier(const igrad_config_t *c,
                                                   const igrad_tensor_info_t *ti)
{
    /* below config.dense_below the engine sends every entry (engine.c) */
    return c->sparsifier != IGRAD_SPARSIFIER_NONE && ti->count < c->dense_below
               ? IGRAD_SPARSIFIER_NONE
               : c->sparsifier;
}

/* Wire bytes of a tensor at one step kind, as the engine plans them. */
static igrad_status_t spec_nbytes(const igrad_config_t *c, igrad_sparsifier_t sp,
                                  const igrad_tensor_info_t *ti, double scale, int parity,
                                  double *out)
{
    int64_t count, nbytes;
    IGRAD_CHECK(igrad__target_tensor_spec(c, sp, ti, scale, parity, &count, &nbytes));
    *out = (double)nbytes;
    return IGRAD_OK;
}

/* Mean bytes per step of tensor `ti`: sent every step, or deferred and
 * released once per R steps at scale kappa*R. */
static igrad_status_t tensor_cost(const igrad_config_t *c, igrad_sparsifier_t sp,
                                  const igrad_tensor_info_t *ti, double keep, double *every,
                                  double *release)
{
    double e0, e1, r0, r1;
    double rs = igrad__release_scale(keep, c->release_period);
    IGRAD_CHECK(spec_nbytes(c, sp, ti, 1.0, 0, &e0));
    IGRAD_CHECK(spec_nbytes(c, sp, ti, 1.0, 1, &e1));
    IGRAD_CHECK(spec_nbytes(c, sp, ti, rs, 0, &r0));
    IGRAD_CHECK(spec_nbytes(c, sp, ti, rs, 1, &r1));
    if (every) *every = 0.5 * (e0 + e1);
    if (release) *release = 0.5 * (r0 + r1) / (double)c->release_period;
    return IGRAD_OK;
}

typedef struct fit_ctx {
    const igrad_layout_t *layout;
    const igrad_profile_t *profile;
    const igrad_config_t *cfg;
    size_t nc;
    comp_cost_t *comp; /* (nc) gated components; others have score NAN */
    size_t *order;     /* gated component indices by score, descending */
    size_t ngated;
    double forced;     /* bytes per step always sent (OTHER, ungated components) */
    double total;      /* the *_sync payload per step */
} fit_ctx_t;

int igrad__target_comp_score(const igrad_profile_t *profile, const igrad_component_info_t *ci,
                             double *score)
{
    size_t n = igrad_profile_count(profile);
    for (size_t i = 0; i < n; i++) {
        igrad_profile_entry_t e;
        if (igrad_profile_entry(profile, i, &e) != IGRAD_OK) return 0;
        if (e.layer == ci->layer && e.kind == ci->kind) {
            *score = e.score;
            return 1;
        }
    }
    return 0; /* absent EMB/HEAD/NORM: important, as in the engine */
}

/* Fills per-component costs at `keep` (the every-step bytes do not depend
 * on it, so only the release bytes change between calls). */
static igrad_status_t fill_costs(fit_ctx_t *x, double keep)
{
    for (size_t c = 0; c < x->nc; c++) x->comp[c].every = x->comp[c].release = 0.0;
    x->forced = x->total = 0.0;
    for (size_t t = 0; t < igrad_layout_count(x->layout); t++) {
        igrad_tensor_info_t ti;
        double every, release;
        IGRAD_CHECK(igrad_layout_tensor(x->layout, t, &ti));
        igrad_sparsifier_t tsp = igrad__target_tensor_sparsifier(x->cfg, &ti);
        IGRAD_CHECK(tensor_cost(x->cfg, tsp, &ti, keep, &every, &release));
        x->total += every;
        if (ti.component < 0 || isnan(x->comp[ti.component].score)) {
            x->forced += every;
        } else {
            x->comp[ti.component].every += every;
            x->comp[ti.component].release += release;
        }
    }
    return IGRAD_OK;
}

/* Payload ratio with the first k components of `order` important. */
static double ratio_of(const fit_ctx_t *x, size_t k)
{
    double b = x->forced;
    for (size_t i = 0; i < x->ngated; i++) {
        const comp_cost_t *cc = &x->comp[x->order[i]];
        b += i < k ? cc->every : cc->release;
    }
    return x->total > 0 ? b / x->total : 0.0;
}

typedef struct scored {
    double score;
    size_t c;
} scored_t;

static int by_score_desc(const void *pa, const void *pb)
{
    const scored_t *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return (a->c > b->c) - (a->c < b->c); /* deterministic among ties */
}

/* A prefix of k may end only where the score drops (ties are one class:
 * the threshold important = score >= tau cannot split them). */
static int prefix_ok(const fit_ctx_t *x, size_t k)
{
    if (k == 0 || k == x->ngated) return 1;
    return x->comp[x->order[k - 1]].score > x->comp[x->order[k]].score;
}

/* keep_classes: the important set is the profile's (score >= its tau), only
 * kappa is chosen. */
static igrad_status_t fit(const igrad_layout_t *layout, const igrad_profile_t *profile,
                          const igrad_config_t *config, double target_ratio, double min_keep,
                          int keep_classes, igrad_target_fit_t *out)
{
    IGRAD_FAIL_IF(!layout || !profile || !config || !out, IGRAD_E_INVALID,
                  "igrad_target_fit: NULL argument");
    IGRAD_CHECK(igrad_config_validate(config));
    IGRAD_FAIL_IF(config->method != IGRAD_METHOD_IG, IGRAD_E_INVALID,
                  "igrad_target_fit: config.method is %s; a payload target needs ig",
                  igrad_method_name(config->method));
    IGRAD_FAIL_IF(!(target_ratio > 0.0 && target_ratio <= 1.0), IGRAD_E_INVALID,
                  "igrad_target_fit: target ratio %g (must be in (0, 1])", target_ratio);
    IGRAD_FAIL_IF(!(min_keep > 0.0 && min_keep <= 1.0), IGRAD_E_INVALID,
                  "igrad_target_fit: min_keep %g (must be in (0, 1])", min_keep);

    igrad_status_t st = IGRAD_OK;
    fit_ctx_t x = {.layout = layout, .profile = profile, .cfg = config};
    x.nc = igrad_layout_component_count(layout);
    x.comp = calloc(x.nc ? x.nc : 1, sizeof *x.comp);
    x.order = calloc(x.nc ? x.nc : 1, sizeof *x.order);
    IGRAD_FAIL_GOTO(!x.comp || !x.order, IGRAD_E_NOMEM, "igrad_target_fit: out of memory");
    for (size_t c = 0; c < x.nc; c++) {
        igrad_component_info_t ci;
        IGRAD_CHECK_GOTO(igrad_layout_component(layout, c, &ci));
        double score = NAN;
        if (igrad__target_comp_score(x.profile, &ci, &score)) x.order[x.ngated++] = c;
        else score = NAN;
        x.comp[c].score = score;
    }
    scored_t *sorted = calloc(x.ngated ? x.ngated : 1, sizeof *sorted);
    IGRAD_FAIL_GOTO(!sorted, IGRAD_E_NOMEM, "igrad_target_fit: out of memory");
    for (size_t i = 0; i < x.ngated; i++) sorted[i] = (scored_t){x.comp[x.order[i]].score, x.order[i]};
    qsort(sorted, x.ngated, sizeof *sorted, by_score_desc);
    for (size_t i = 0; i < x.ngated; i++) x.order[i] = sorted[i].c;
    free(sorted);

    /* 1. The most important components that still leave kappa >= min_keep
     *    within the target. */
    IGRAD_CHECK_GOTO(fill_costs(&x, min_keep));
    size_t best_k = 0;
    int met = 0;
    if (keep_classes) {
        /* a threshold's important set is a prefix of the order */
        double tau = igrad_profile_threshold(profile);
        while (best_k < x.ngated && x.comp[x.order[best_k]].score >= tau) best_k++;
        met = ratio_of(&x, best_k) <= target_ratio;
    }
    for (size_t k = 0; k <= x.ngated && !keep_classes; k++) {
        if (!prefix_ok(&x, k)) continue;
        if (ratio_of(&x, k) <= target_ratio) {
            best_k = k;
            met = 1;
        }
    }
    /* 2. The largest kappa in [min_keep, 1] that meets it: the ratio does
     *    not decrease with kappa, so bisect on the plan itself. */
    double keep = min_keep;
    if (met) {
        double lo = min_keep, hi = 1.0;
        IGRAD_CHECK_GOTO(fill_costs(&x, hi));
        if (ratio_of(&x, best_k) <= target_ratio) {
            lo = hi;
        } else {
            for (int it = 0; it < 60; it++) {
                double mid = 0.5 * (lo + hi);
                IGRAD_CHECK_GOTO(fill_costs(&x, mid));
                if (ratio_of(&x, best_k) <= target_ratio) lo = mid;
                else hi = mid;
            }
        }
        keep = lo;
    }
    IGRAD_CHECK_GOTO(fill_costs(&x, keep));

    double every = x.forced;
    for (size_t i = 0; i < best_k; i++) every += x.comp[x.order[i]].every;
    out->release_keep = keep;
    out->n_important = best_k;
    out->n_gated = x.ngated;
    /* tau: the lowest important score, or above every score when none */
    if (keep_classes) out->tau = igrad_profile_threshold(profile);
    else if (best_k > 0) out->tau = x.comp[x.order[best_k - 1]].score;
    else if (x.ngated > 0) out->tau = nextafter(x.comp[x.order[0]].score, HUGE_VAL);
    else out->tau = 1.0;
    out->f_imp = x.total > 0 ? every / x.total : 0.0;
    out->ratio = ratio_of(&x, best_k);
    out->model_ratio = out->f_imp + keep * (1.0 - out->f_imp);
    out->met = met;
cleanup:
    free(x.comp);
    free(x.order);
    return st;
}

igrad_status_t igrad_target_fit(const igrad_layout_t *layout, const igrad_profile_t *profile,
                                const igrad_config_t *config, double target_ratio,
                                double min_keep, igrad_target_fit_t *out)
{
    return fit(layout, profile, config, target_ratio, min_keep, 0, out);
}

igrad_status_t igrad__target_fit_kappa(const igrad_layout_t *layout,
                                       const igrad_profile_t *profile,
                                       const igrad_config_t *config, double target_ratio,
                                       double min_keep, igrad_target_fit_t *out)
{
    return fit(layout, profile, config, target_ratio, min_keep, 1, out);
}
