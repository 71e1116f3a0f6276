/*
 * engine_online.c — online profiling and re-planning of iad/ig engines:
 * with config.profile_steps = W and no profile, the engine sends every
 * component every step (the plan of an all-important profile, which is the
 * sparsifier's *_sync method with ig's buckets) and records each completed
 * step's selections (per tensor: sum of squares, count). At the first
 * begin after W recorded steps it gathers every rank's records, sums them
 * over ranks in rank order (so every rank holds bit-identical data and
 * builds the same profile with the code of `igrad profile`: trace record,
 * igrad_profile_build), builds the new plan and agrees on it (profile and
 * plan hashes are agreement items), and only then swaps it in, moving
 * every residual over unchanged. igrad_engine_set_profile is the same
 * re-plan for a profile the caller gives.
 *
 * Why the ranks' sums and not rank 0's trace: the sum is the activity of
 * the whole batch, not of one rank's shard, and because every rank sums
 * the same gathered bytes in the same order, no profile has to travel.
 *
 * Also here: the hysteresis rule for re-profiling (a pure function) and
 * the online part of the engine state file.
 *
 * Not here: the plan itself (engine.c), the profile (profile.c).
 */
#include "engine/engine_online.h"
#include "model/layout_internal.h"
#include "profile/profile_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- set-up ------------------------------------------------------------- */

static igrad_status_t copy_layout_obj(const igrad_layout_t *src, igrad_layout_t **out)
{
    igrad_layout_t *l = NULL;
    IGRAD_CHECK(igrad__layout_create_like(src, &l)); /* with src's name map */
    igrad_status_t st = IGRAD_OK;
    for (size_t i = 0; i < igrad_layout_count(src); i++) {
        igrad_tensor_info_t ti;
        IGRAD_CHECK_GOTO(igrad_layout_tensor(src, i, &ti));
        IGRAD_CHECK_GOTO(igrad_layout_add(l, ti.name, ti.dtype, ti.ndim, ti.shape));
    }
    IGRAD_CHECK_GOTO(igrad__layout_set_family(l, igrad_layout_family(src)));
    IGRAD_FAIL_GOTO(igrad_layout_hash(l) != igrad_layout_hash(src), IGRAD_E_INVALID,
                    "igrad_engine_create: the layout copy hashes differently");
    *out = l;
    return IGRAD_OK;
cleanup:
    igrad_layout_free(l);
    return st;
}

static size_t window_words(const igrad__online_t *on, size_t T)
{
    return 2 + on->cap + 2 * on->cap * T;
}

igrad_status_t igrad__online_init(igrad_engine_t *e, const igrad_layout_t *layout,
                                  const igrad_profile_t *profile)
{
    igrad__online_t *on = calloc(1, sizeof *on);
    IGRAD_FAIL_IF(!on, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    e->online = on;
    const char *part = e->plan.cfg.profile_partition ? e->plan.cfg.profile_partition : "knee";
    snprintf(on->partition, sizeof on->partition, "%s", part);
    e->plan.cfg.profile_partition = on->partition; /* the engine's own copy */
    IGRAD_CHECK(copy_layout_obj(layout, &on->layout));
    on->W = e->plan.cfg.profile_steps;
    on->Wr = e->plan.cfg.reprofile_every;
    on->switch_step = -1;
    if (profile || on->W == 0) return IGRAD_OK;
    on->active = 1;
    on->cap = (size_t)(on->W > on->Wr ? on->W : on->Wr);
    size_t T = e->plan.ntensors, W = on->cap, P = (size_t)e->plan.nranks;
    on->steps = calloc(W, sizeof *on->steps);
    on->sumsq = calloc(W * T, sizeof *on->sumsq);
    on->count = calloc(W * T, sizeof *on->count);
    /* the exchange buffers now: a rank without them could not take part */
    on->send = calloc(window_words(on, T), 8);
    on->recv = calloc(window_words(on, T) * P, 8);
    IGRAD_FAIL_IF(!on->steps || !on->sumsq || !on->count || !on->send || !on->recv,
                  IGRAD_E_NOMEM, "igrad_engine_create: out of memory for a %lld-step profiling "
                  "window",
                  (long long)on->cap);
    if (on->Wr == 0) return IGRAD_OK;
    on->npend = igrad_layout_component_count(layout);
    on->held = calloc(T ? T : 1, sizeof *on->held);
    on->held_count = calloc(T ? T : 1, sizeof *on->held_count);
    on->last_sel = malloc((T ? T : 1) * sizeof *on->last_sel);
    on->pending = calloc(on->npend ? on->npend : 1, 1);
    IGRAD_FAIL_IF(!on->held || !on->held_count || !on->last_sel || !on->pending, IGRAD_E_NOMEM,
                  "igrad_engine_create: out of memory for re-profiling");
    for (size_t t = 0; t < T; t++) on->last_sel[t] = -1;
    return IGRAD_OK;
}

static void free_window(igrad__online_t *on)
{
    free(on->steps);
    free(on->sumsq);
    free(on->count);
    on->steps = NULL;
    on->sumsq = NULL;
    on->count = NULL;
    if (!on->leak_buffers) {
        free(on->send);
        free(on->recv);
    }
    on->send = on->recv = NULL;
}

void igrad__online_free(igrad__online_t *on)
{
    if (!on) return;
    free_window(on);
    free(on->held);
    free(on->held_count);
    free(on->last_sel);
    free(on->pending);
    igrad_layout_free(on->layout);
    igrad_profile_free(on->profile);
    free(on);
}

int64_t igrad__online_item(const igrad_engine_t *e)
{
    const igrad__online_t *on = e->online;
    return on && (on->active || on->reprof) ? (int64_t)on->nrec : -1;
}

/* What a re-profiling window records per tensor: its last selection's sum
 * of squares divided by the steps of gradient it had accumulated (1 for a
 * tensor sent every step, up to R for a deferred one at its release),
 * held until the next selection. A deferred component is then scored from
 * the residual-inclusive selection it was last released with, at every
 * step, rather than as 0 between releases (what the sent-only trace would
 * say, which would keep it low for good); the division puts its release,
 * which selects kappa*R times the entries from R steps of gradient, on a
 * per-step footing with the important ones. */
static void update_held(igrad_engine_t *e, int par)
{
    igrad__online_t *on = e->online;
    for (size_t t = 0; t < e->plan.ntensors; t++) {
        if (!e->step.sent[t]) continue;
        int64_t span = on->last_sel[t] >= 0 ? e->step.cur_step - on->last_sel[t] : 1;
        on->held[t] = e->step.tsumsq[t] / (double)(span > 1 ? span : 1);
        on->held_count[t] = e->plan.t[t].spec[e->step.rel[t]][par].count;
        on->last_sel[t] = e->step.cur_step;
    }
}

void igrad__online_record(igrad_engine_t *e)
{
    igrad__online_t *on = e->online;
    int par = e->plan.cfg.interleave ? (int)(e->step.cur_step & 1) : 0;
    if (on->reprof) update_held(e, par);
    size_t len = (size_t)(on->active ? on->W : on->Wr);
    if (!(on->active || on->reprof) || on->nrec >= len) return;
    size_t T = e->plan.ntensors, s = on->nrec;
    on->steps[s] = e->step.cur_step;
    for (size_t t = 0; t < T; t++) {
        if (on->reprof) {
            on->sumsq[s * T + t] = on->last_sel[t] >= 0 ? on->held[t] : 0.0;
            on->count[s * T + t] = on->last_sel[t] >= 0 ? on->held_count[t] : 0;
        } else {
            on->sumsq[s * T + t] = e->step.sent[t] ? e->step.tsumsq[t] : 0.0;
            on->count[s * T + t] =
                e->step.sent[t] ? e->plan.t[t].spec[e->step.rel[t]][par].count : 0;
        }
    }
    on->nrec++;
}

/* ---- re-planning ---------------------------------------------------------- */

/* A profile copy the engine owns (a JSON round trip: exact, %.17g). */
static igrad_status_t copy_profile(const igrad_profile_t *p, const igrad_layout_t *layout,
                                   igrad_profile_t **out)
{
    char *text = NULL;
    IGRAD_CHECK(igrad__profile_to_json_text(p, &text));
    igrad_status_t st =
        igrad__profile_from_json_text(text, strlen(text), "profile", layout, out);
    free(text);
    return st;
}

igrad_status_t igrad__online_prepare(const igrad_engine_t *e, igrad_profile_t *profile,
                                     int fixed_classes, igrad_engine_t **out)
{
    *out = NULL;
    igrad_config_t cfg = e->plan.cfg;
    if (cfg.target_ratio > 0.0) {
        /* A pure function of the profile's scores and the config, the same
         * on every rank; the agreement below compares its result (the
         * release_keep item, the profile and plan hashes). */
        igrad_target_fit_t fit;
        if (fixed_classes) {
            IGRAD_CHECK(igrad__target_fit_kappa(e->online->layout, profile, &cfg,
                                                cfg.target_ratio, IGRAD_TARGET_MIN_KEEP, &fit));
        } else {
            IGRAD_CHECK(igrad_target_fit(e->online->layout, profile, &cfg, cfg.target_ratio,
                                         IGRAD_TARGET_MIN_KEEP, &fit));
            IGRAD_CHECK(igrad_profile_set_threshold(profile, fit.tau));
        }
        cfg.release_keep = fit.release_keep;
    }
    igrad_engine_t *n = igrad__engine_alloc(&igrad__engine_flat);
    IGRAD_FAIL_IF(!n, IGRAD_E_NOMEM, "re-plan: out of memory");
    n->mem.dp = e->mem.dp; /* the same data plane and queue */
    n->mem.dp_stream = e->mem.dp_stream;
    igrad_status_t st = igrad__engine_build(n, e->online->layout, profile, &cfg, e->comm);
    if (st != IGRAD_OK) {
        igrad_engine_free(n);
        return st;
    }
    n->calls = e->calls;
    n->last_step = e->last_step;
    igrad__engine_dynamic_items(n, e->last_step);
    *out = n;
    return IGRAD_OK;
}

void igrad__online_commit(igrad_engine_t *e, igrad_engine_t *n, igrad_profile_t *profile)
{
    /* What belongs to the run, not to the plan, moves to n. The residuals
     * move by pointer (same layout, same offsets): no copy, and n's own
     * calloc'd block, never touched, costs no memory until it is freed. */
    float *mine = n->mem.residual_mem;
    n->mem.residual_mem = e->mem.residual_mem;
    e->mem.residual_mem = mine;
    igrad__dp_mem_point(&n->mem, &n->plan);
    n->trace = e->trace;
    n->calls = e->calls;
    n->last_step = e->last_step;
    n->step.cur_step = e->step.cur_step;
    n->t_start = e->t_start;
    n->stats = e->stats;
    n->stats.bucket_loads = n->step.loads;
    n->agree_buf = e->agree_buf;
    e->agree_buf = NULL;
    igrad__online_t *on = e->online;
    e->online = n->online; /* n's fresh copy is freed with the old plan */
    n->online = on;
    if (on->Wr > 0) {
        if (on->active && on->nrec > 0) { /* every tensor was selected at the last record */
            size_t T = n->plan.ntensors, s = on->nrec - 1;
            for (size_t t = 0; t < T; t++) {
                on->held[t] = on->sumsq[s * T + t];
                on->held_count[t] = on->count[s * T + t];
                on->last_sel[t] = on->steps[s];
            }
        }
        on->nrec = 0;
        on->reprof = 1;
    } else {
        free_window(on);
    }
    on->active = 0;
    igrad_profile_free(on->profile);
    on->profile = profile;
    on->switch_step = e->last_step + 1;
    on->replans++;
    n->plan.cfg.profile_partition = on->partition;

    igrad_engine_t tmp = *e;
    *e = *n;
    *n = tmp;
    igrad_engine_free(n); /* the old plan's buffers */
    igrad__engine_dynamic_items(e, e->last_step);
}

/* Prepare locally, agree with every rank on the new items, commit or
 * leave the engine as it was. Takes `profile` (freed on failure). */
static igrad_status_t replan(igrad_engine_t *e, igrad_profile_t *profile, igrad_status_t st,
                             const char *context)
{
    igrad_engine_t *n = NULL;
    if (st == IGRAD_OK) st = igrad__online_prepare(e, profile, 0, &n);
    char msg[1024] = "";
    if (st != IGRAD_OK) snprintf(msg, sizeof msg, "%s", igrad_last_error());
    igrad_status_t ag = igrad__engine_agree(e, e->comm, e->plan.nranks, e->agree_buf, st, -1, msg,
                                            n ? n->items : e->items, 1, context);
    if (ag != IGRAD_OK) {
        igrad_engine_free(n);
        igrad_profile_free(profile);
        return ag;
    }
    igrad__online_commit(e, n, profile);
    e->online->fixed = 0;
    if (e->online->pending) memset(e->online->pending, 0, e->online->npend);
    return IGRAD_OK;
}

/* Sums the gathered windows over ranks (rank order) and builds the profile
 * from them with the trace and profile code of `igrad profile`. */
static igrad_status_t build_profile(const igrad_engine_t *e, igrad_profile_t **out)
{
    const igrad__online_t *on = e->online;
    size_t T = e->plan.ntensors, W = on->cap, words = window_words(on, T);
    size_t P = (size_t)e->plan.nranks;
    for (size_t r = 0; r < P; r++) {
        const uint64_t *w = on->recv + r * words;
        if (w[0] != IGRAD_OK)
            return igrad__fail(IGRAD_E_STATE, __FILE__, __LINE__,
                               "online profile: rank %zu could not send its records", r);
        IGRAD_FAIL_IF(w[1] != (uint64_t)on->nrec ||
                          memcmp(w + 2, on->recv + 2, on->nrec * 8) != 0,
                      IGRAD_E_MISMATCH,
                      "online profile: rank %zu recorded %llu steps, this rank %zu (or other "
                      "step numbers)",
                      r, (unsigned long long)w[1], on->nrec);
    }
    igrad_trace_t *tr = NULL;
    igrad_profile_t *p = NULL;
    igrad_status_t st = IGRAD_OK;
    IGRAD_CHECK_GOTO(igrad_trace_create(on->layout, &tr));
    IGRAD_CHECK_GOTO(igrad_trace_set_sparsifier(tr, e->plan.sp, e->plan.cfg.density));
    for (size_t s = 0; s < on->nrec; s++) {
        int64_t step;
        memcpy(&step, on->recv + 2 + s, 8);
        for (size_t t = 0; t < T; t++) {
            double sum = 0.0;
            int64_t cnt;
            memcpy(&cnt, on->recv + 2 + W + W * T + s * T + t, 8);
            for (size_t r = 0; r < P; r++) {
                double v;
                memcpy(&v, on->recv + r * words + 2 + W + s * T + t, 8);
                sum += v;
            }
            if (cnt > 0 && e->plan.t[t].comp >= 0)
                IGRAD_CHECK_GOTO(igrad_trace_record(tr, step, t, sum, cnt));
        }
    }
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    opts.alpha = e->plan.cfg.profile_alpha;
    opts.method = on->partition;
    IGRAD_CHECK_GOTO(igrad_profile_build(tr, &opts, &p));
    *out = p;
    p = NULL;
cleanup:
    igrad_profile_free(p);
    igrad_trace_free(tr);
    return st;
}

/* Allgathers every rank's window records (a failure breaks the engine:
 * the exchange buffers may still be in use). */
static igrad_status_t exchange_window(igrad_engine_t *e, int64_t step, const char *what)
{
    igrad__online_t *on = e->online;
    size_t T = e->plan.ntensors, W = on->cap, words = window_words(on, T);
    uint64_t *w = on->send;
    memset(w, 0, words * 8);
    w[0] = IGRAD_OK;
    w[1] = (uint64_t)on->nrec;
    memcpy(w + 2, on->steps, on->nrec * 8);
    memcpy(w + 2 + W, on->sumsq, on->nrec * T * 8);
    memcpy(w + 2 + W + W * T, on->count, on->nrec * T * 8);
    double saved = igrad_comm_timeout(e->comm);
    igrad_comm_set_timeout(e->comm, e->plan.cfg.timeout_s);
    igrad_status_t st = igrad_comm_allgather(e->comm, on->send, words * 8, on->recv);
    igrad_comm_set_timeout(e->comm, saved);
    if (st == IGRAD_OK) return IGRAD_OK;
    if (st == IGRAD_E_TIMEOUT) on->leak_buffers = 1; /* MPI may still write them */
    char msg[900];
    snprintf(msg, sizeof msg, "%s", igrad_last_error());
    igrad__fail(st, __FILE__, __LINE__, "step %lld: exchanging the %s window failed: %s",
                (long long)step, what, msg);
    return igrad__engine_break(e, st);
}

/* The first switch: window profile, re-plan. */
static igrad_status_t switch_plan(igrad_engine_t *e, int64_t step)
{
    double t0 = igrad__now_ms();
    IGRAD_CHECK(exchange_window(e, step, "online profiling"));
    double t1 = igrad__now_ms();
    igrad_profile_t *p = NULL;
    igrad_status_t st = build_profile(e, &p);
    char context[64];
    snprintf(context, sizeof context, "step %lld: online profile", (long long)step);
    double gather_ms = t1 - t0;
    st = replan(e, p, st, context);
    if (st != IGRAD_OK) return st;
    e->online->gather_ms = gather_ms;
    e->online->build_ms = igrad__now_ms() - t1;
    return IGRAD_OK;
}

/* The hysteresis step of a re-profile over the gated entries of the new
 * profile p against the current profile's classes: tau is p's (or, with
 * target_ratio, the threshold igrad_target_fit chooses on p's scores).
 * Writes the new classes (every entry) and pending flags; @return flips
 * through *flips. */
static igrad_status_t classify(const igrad_engine_t *e, const igrad_profile_t *p,
                               unsigned char *important, unsigned char *pending, double *tau,
                               int *flips)
{
    const igrad__online_t *on = e->online;
    const igrad_profile_t *cur = on->profile;
    size_t n = igrad_profile_count(p);
    IGRAD_FAIL_IF(!cur || igrad_profile_count(cur) != n || n > on->npend, IGRAD_E_STATE,
                  "re-profile: the new profile has %zu components, the current one %zu", n,
                  cur ? igrad_profile_count(cur) : 0);
    *tau = igrad_profile_threshold(p);
    if (e->plan.cfg.target_ratio > 0.0) {
        igrad_target_fit_t fit;
        IGRAD_CHECK(igrad_target_fit(on->layout, p, &e->plan.cfg, e->plan.cfg.target_ratio,
                                     IGRAD_TARGET_MIN_KEEP, &fit));
        *tau = fit.tau;
    }
    size_t n1 = n ? n : 1;
    double *score = calloc(n1, sizeof *score);
    unsigned char *was = calloc(n1, 1), *pend = calloc(n1, 1), *now = calloc(n1, 1);
    size_t *idx = calloc(n1, sizeof *idx);
    igrad_status_t st = IGRAD_OK;
    IGRAD_FAIL_GOTO(!score || !was || !pend || !now || !idx, IGRAD_E_NOMEM,
                    "re-profile: out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        igrad_profile_entry_t a, b;
        IGRAD_CHECK_GOTO(igrad_profile_entry(p, i, &a));
        IGRAD_CHECK_GOTO(igrad_profile_entry(cur, i, &b));
        IGRAD_FAIL_GOTO(a.layer != b.layer || a.kind != b.kind, IGRAD_E_STATE,
                        "re-profile: component %zu is (%d, %s) in the new profile, (%d, %s) in "
                        "the current one",
                        i, a.layer, igrad_kind_name(a.kind), b.layer, igrad_kind_name(b.kind));
        important[i] = (unsigned char)b.important;
        pending[i] = 0;
        score[m] = a.score;
        was[m] = (unsigned char)b.important;
        pend[m] = on->pending[i];
        idx[m++] = i;
    }
    *flips = igrad__hysteresis_update(m, score, *tau, e->plan.cfg.reprofile_margin, was, pend, now);
    for (size_t k = 0; k < m; k++) {
        important[idx[k]] = now[k];
        pending[idx[k]] = pend[k];
    }
cleanup:
    free(score);
    free(was);
    free(pend);
    free(now);
    free(idx);
    return st;
}

/* A periodic re-profile: the window's profile, the hysteresis rule, and a
 * re-plan only when a class changed. The ranks agree in any case (each
 * computes the same classes from the same gathered bytes, but a local
 * failure must keep every rank's plan); on refusal the window and the
 * hysteresis state stay as they were and the next phase boundary retries. */
static igrad_status_t reprofile(igrad_engine_t *e, int64_t step)
{
    double t0 = igrad__now_ms();
    IGRAD_CHECK(exchange_window(e, step, "re-profiling"));
    igrad__online_t *on = e->online;
    size_t np = on->npend ? on->npend : 1;
    unsigned char *imp = calloc(np, 1), *pend = calloc(np, 1);
    igrad_profile_t *p = NULL;
    igrad_engine_t *n = NULL;
    double tau = 0.0;
    int flips = 0;
    igrad_status_t st = imp && pend ? IGRAD_OK
                                    : igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__,
                                                  "re-profile: out of memory");
    if (st == IGRAD_OK) st = build_profile(e, &p);
    if (st == IGRAD_OK) st = classify(e, p, imp, pend, &tau, &flips);
    if (st == IGRAD_OK && flips > 0) st = igrad__profile_set_classes(p, tau, imp);
    if (st == IGRAD_OK && flips > 0) st = igrad__online_prepare(e, p, 1, &n);
    char msg[1024] = "";
    if (st != IGRAD_OK) snprintf(msg, sizeof msg, "%s", igrad_last_error());
    char context[64];
    snprintf(context, sizeof context, "step %lld: re-profile", (long long)step);
    igrad_status_t ag = igrad__engine_agree(e, e->comm, e->plan.nranks, e->agree_buf, st, -1, msg,
                                            n ? n->items : e->items, 1, context);
    if (ag == IGRAD_OK) {
        memcpy(on->pending, pend, on->npend);
        on->reprofiles++;
        on->last_flips = flips;
        on->nrec = 0;
        if (n) {
            int64_t switched = on->switch_step; /* stays the first switch's */
            igrad__online_commit(e, n, p);     /* restarts the window */
            on->switch_step = switched;
            on->fixed = 1;
            on->reprofile_replans++;
            p = NULL;
            n = NULL;
        }
        on->reprofile_ms = igrad__now_ms() - t0;
    }
    igrad_engine_free(n);
    igrad_profile_free(p);
    free(imp);
    free(pend);
    return ag;
}

igrad_status_t igrad__online_before_step(igrad_engine_t *e, int64_t step)
{
    igrad__online_t *on = e->online;
    if (on->active && on->nrec >= (size_t)on->W) return switch_plan(e, step);
    int64_t R = e->plan.cfg.release_period, ph = ((step % R) + R) % R;
    if (on->reprof && on->nrec >= (size_t)on->Wr && ph == 0) return reprofile(e, step);
    return IGRAD_OK;
}

/* ---- public --------------------------------------------------------------- */

igrad_status_t igrad__flat_set_profile(igrad_engine_t *e, const igrad_profile_t *profile)
{
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_set_profile"));
    igrad_status_t st = IGRAD_OK;
    igrad_profile_t *copy = NULL;
    if (!e->plan.deferral)
        st = igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                         "igrad_engine_set_profile: method %s uses no profile (iad, ig)",
                         igrad_method_name(e->plan.cfg.method));
    else if (e->state != IGRAD__ENGINE_IDLE)
        st =
            igrad__fail(IGRAD_E_STATE, __FILE__, __LINE__,
                        "igrad_engine_set_profile: step %lld is open", (long long)e->step.cur_step);
    else if (!profile)
        st = igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                         "igrad_engine_set_profile: profile is NULL");
    else
        st = copy_profile(profile, e->online->layout, &copy);
    double t0 = igrad__now_ms();
    st = replan(e, copy, st, "set profile");
    if (st == IGRAD_OK) e->online->build_ms = igrad__now_ms() - t0;
    return st;
}

const igrad_profile_t *igrad_engine_profile(const igrad_engine_t *e)
{
    return e && e->online ? e->online->profile : NULL;
}

igrad_status_t igrad_engine_online_info(const igrad_engine_t *e, igrad_online_info_t *out)
{
    IGRAD_FAIL_IF(!e || !out, IGRAD_E_INVALID, "igrad_engine_online_info: NULL argument");
    memset(out, 0, sizeof *out);
    out->switch_step = -1;
    const igrad__online_t *on = e->online;
    if (!on) return IGRAD_OK;
    out->profiling = on->active;
    out->profile_steps = on->W;
    out->steps_recorded = (int64_t)on->nrec;
    out->switch_step = on->switch_step;
    out->replans = on->replans;
    out->gather_ms = on->gather_ms;
    out->build_ms = on->build_ms;
    out->reprofile_every = on->Wr;
    out->reprofiles = on->reprofiles;
    out->reprofile_replans = on->reprofile_replans;
    out->last_flips = on->last_flips;
    out->reprofile_ms = on->reprofile_ms;
    return IGRAD_OK;
}

/* ---- hysteresis ----------------------------------------------------------- */

int igrad__hysteresis_update(size_t n, const double *score, double tau, double margin,
                             const unsigned char *important, unsigned char *pending,
                             unsigned char *out)
{
    int flips = 0;
    for (size_t c = 0; c < n; c++) {
        int cross = important[c] ? score[c] < tau - margin : score[c] >= tau + margin;
        out[c] = important[c];
        if (!cross) {
            pending[c] = 0;
        } else if (pending[c]) {
            out[c] = (unsigned char)!important[c];
            pending[c] = 0;
            flips++;
        } else {
            pending[c] = 1;
        }
    }
    return flips;
}
