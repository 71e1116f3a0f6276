/*
 * engine_stream.c — the streamed step (igrad_engine_open, igrad_engine_ready,
 * igrad_engine_close; architecture.md §5.9a): a step whose tensors arrive
 * in pieces, as backward produces their gradients, and whose buckets are
 * handed out for their collectives as soon as every tensor they hold has
 * been given, in bucket order. The result equals igrad_engine_sync's bit
 * for bit, and a step skipped at close leaves residuals and velocities
 * bit-identical on every rank.
 *
 * Why it is shaped this way:
 *  - Which tensors are sent, their budgets and the bucket plan depend only
 *    on (plan, step), so open plans the whole step before any gradient is
 *    seen, and every rank knows which tensors each bucket waits for.
 *  - ready runs the check and the selection of the given tensors into the
 *    staged selection but writes no residual, velocity or gradient (the
 *    data plane's stream_ready selects from a scratch copy), so nothing
 *    has to be undone when close finds the step skipped. A rank with a
 *    NaN, a NULL gradient or a failed selection still packs and hands out
 *    every bucket (placeholder selections), since the other ranks do not
 *    know yet and wait in those collectives.
 *  - close runs the step's one agreement (finiteness, argument errors and
 *    the periodic item check, with the whole step's messages), then, only
 *    if every rank is fine, writes residuals and velocities as the fused
 *    pass would have (stream_commit: one more pass over g, u and e), zeroes
 *    the gradients and unpacks every bucket in bucket order.
 *  - Bucket j is handed out only after buckets < j, so the collectives are
 *    issued in the same order on every rank whatever order and chunks the
 *    ranks give their tensors in.
 *  - A gradient the caller changes between its ready and close is not
 *    noticed by default (checking would cost a pass over every gradient).
 *    What happens is fixed, though: the values sent are those of ready
 *    (packed then), the finiteness verdict too (a NaN written later is not
 *    seen), and close recomputes residuals and velocities from the changed
 *    gradient (sent tensors: the change at the selected entries is lost,
 *    elsewhere it enters the residual; other tensors: it accumulates); the
 *    dense method's change is lost under the unpacked average. Every rank
 *    still ends with the same gradients. With the environment variable
 *    IGRAD_DEBUG_STREAM set (not "0") at the first open, ready hashes each
 *    given gradient and close compares: a changed one fails the step on
 *    every rank, named (IGRAD_E_INVALID).
 *
 * Not here: the whole step (engine.c), the stages' loops (dp_cpu_stream.c).
 */
#include "engine/engine_stream.h"
#include "dp/dp.h"
#include "plan/pack.h"
#include "plan/route.h"
#include "plan/schedule.h"

#include <stdlib.h>
#include <string.h>

void igrad__stream_free(igrad_engine_t *e)
{
    igrad__stream_t *s = e->stream;
    if (!s) return;
    free(s->grads);
    free(s->pack_grads);
    free(s->given);
    free(s->tblock0);
    free(s->tnblk);
    free(s->compact);
    free(s->missing);
    free(s->sums);
    if (e->mem.dp) {
        e->mem.dp->free(e->mem.stream_scratch);
        e->mem.stream_scratch = NULL;
        e->mem.stream_scratch_count = 0;
        e->mem.dp->free(s->zeros);
    }
    free(s);
    e->stream = NULL;
}

int64_t igrad__stream_nbytes(const igrad_engine_t *e)
{
    const igrad__stream_t *s = e->stream;
    if (!s) return 0;
    size_t n = (size_t)e->plan.nthreads * e->mem.stream_scratch_count + s->zeros_count;
    return (int64_t)(n * sizeof(float));
}

/* The stream state, once per engine (the first open). */
static igrad_status_t stream_create(igrad_engine_t *e)
{
    if (e->stream) return IGRAD_OK;
    size_t T = e->plan.ntensors, nb = e->step.nb_cap; /* either plan's buckets */
    igrad__stream_t *s = calloc(1, sizeof *s);
    IGRAD_FAIL_IF(!s, IGRAD_E_NOMEM, "igrad_engine_open: out of memory");
    e->stream = s;
    s->grads = calloc(T, sizeof *s->grads);
    s->pack_grads = calloc(T, sizeof *s->pack_grads);
    s->given = calloc(T, 1);
    s->tblock0 = calloc(T, sizeof *s->tblock0);
    s->tnblk = calloc(T, sizeof *s->tnblk);
    s->compact = calloc(nb ? nb : 1, sizeof *s->compact);
    s->missing = calloc(nb ? nb : 1, sizeof *s->missing);
    IGRAD_FAIL_IF(!s->grads || !s->pack_grads || !s->given || !s->tblock0 || !s->tnblk ||
                      !s->compact || !s->missing,
                  IGRAD_E_NOMEM, "igrad_engine_open: out of memory");
    const char *dbg = getenv("IGRAD_DEBUG_STREAM");
    if (dbg && dbg[0] && strcmp(dbg, "0") != 0) {
        s->sums = calloc(T ? T : 1, sizeof *s->sums);
        IGRAD_FAIL_IF(!s->sums, IGRAD_E_NOMEM, "igrad_engine_open: out of memory");
    }
    if (e->plan.sp != IGRAD_SPARSIFIER_NONE) {
        int64_t most = 0;
        for (size_t t = 0; t < T; t++)
            if (e->plan.t[t].n > most) most = e->plan.t[t].n;
        e->mem.stream_scratch_count = (size_t)most * (e->mem.velocity_count > 0 ? 2 : 1);
        e->mem.stream_scratch = e->mem.dp->alloc(
            (size_t)e->plan.nthreads * e->mem.stream_scratch_count * sizeof(float), 0);
        IGRAD_FAIL_IF(!e->mem.stream_scratch, IGRAD_E_NOMEM,
                      "igrad_engine_open: out of memory for the streamed selection's scratch "
                      "(%d x %zu floats)",
                      e->plan.nthreads, e->mem.stream_scratch_count);
    }
    return IGRAD_OK;
}

/* Which blocks each tensor has this step and how many each bucket waits for. */
static void stream_plan(igrad_engine_t *e)
{
    igrad__stream_t *s = e->stream;
    size_t T = e->plan.ntensors;
    memset(s->given, 0, T);
    memset(s->grads, 0, T * sizeof *s->grads);
    memset(s->pack_grads, 0, T * sizeof *s->pack_grads);
    memset(s->tnblk, 0, T * sizeof *s->tnblk);
    s->ngiven = 0;
    s->next = 0;
    for (int j = 0; j < IGRAD__RUN(e)->nb_max; j++) s->compact[j] = -1;
    for (size_t j = 0; j < e->step.nbk; j++) {
        s->compact[e->step.bk[j].index] = (int)j;
        s->missing[j] = e->step.bk[j].nblocks;
    }
    for (size_t i = e->step.nblk; i-- > 0;) { /* a tensor's blocks are consecutive */
        uint32_t t = e->step.binfo[i].tensor;
        s->tblock0[t] = i;
        s->tnblk[t]++;
    }
}

igrad_status_t igrad__flat_open(igrad_engine_t *e, int64_t step)
{
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_open"));
    IGRAD_FAIL_IF(step < 0, IGRAD_E_INVALID,
                  "igrad_engine_open: step %lld is negative (steps count from 0, as "
                  "igrad_engine_sync's)",
                  (long long)step);
    IGRAD_CHECK(igrad__route_check_caller(&e->plan.cfg, e->plan.sp == IGRAD_SPARSIFIER_NONE,
                                          "igrad_engine_open"));
    IGRAD_FAIL_IF(e->state != IGRAD__ENGINE_IDLE, IGRAD_E_STATE,
                  "igrad_engine_open: step %lld is still open (close or end it first)",
                  (long long)e->step.cur_step);
    IGRAD_FAIL_IF(e->plan.cfg.grad_dtype != IGRAD_DTYPE_F32, IGRAD_E_UNSUPPORTED,
                  "igrad_engine_open: config.grad_dtype is %s, but the streamed step reads "
                  "F32 gradients only (use igrad_engine_sync, or F32 gradients)",
                  igrad_dtype_name(e->plan.cfg.grad_dtype));
    IGRAD_FAIL_IF(!e->mem.dp->stream_ready || !e->mem.dp->stream_commit, IGRAD_E_UNSUPPORTED,
                  "igrad_engine_open: the %s data plane has no streamed step (use "
                  "igrad_engine_begin/end or igrad_engine_sync)",
                  e->mem.dp->name);
    double t0 = igrad__engine_step_reset(e, step);
    /* collective like the whole step's (every rank opens the same step);
     * online profiling is the method's, not a warm-up step's */
    if (e->online && IGRAD__RUN(e) == &e->plan)
        IGRAD_CHECK(igrad__online_before_step(e, step)); /* may re-plan */
    /* after it: a re-plan swaps in a new engine, whose stream state is new */
    IGRAD_CHECK(stream_create(e));
    igrad_status_t st = igrad__engine_room(e); /* the dense warm-up's below start_iter */
    if (st != IGRAD_OK) return igrad__engine_break(e, st); /* the others go on */
    igrad__engine_stats_memory(e, &e->stats);

    igrad__plan_gate(IGRAD__RUN(e), &e->step, step);
    /* The history learns this step's blocks at close, if the step counts. */
    st = igrad__engine_plan_step(e, 0);
    if (st != IGRAD_OK) return igrad__engine_break(e, st); /* the others go on */
    stream_plan(e);
    e->stats.pack_ms = igrad__now_ms() - t0;
    e->state = IGRAD__ENGINE_STREAM;
    return IGRAD_OK;
}

/* IGRAD_DEBUG_STREAM's hash of tensor t's gradient bytes. */
static uint64_t grad_hash(const igrad_engine_t *e, size_t t, const float *g)
{
    return igrad__hash_bytes(IGRAD__HASH_SEED, g, (size_t)e->plan.t[t].n * sizeof *g);
}

/* Checks the tensor list of a ready call: in range, not given before, not
 * twice. Leaves nothing marked. */
static igrad_status_t check_tensors(igrad_engine_t *e, const size_t *tensors, size_t n)
{
    igrad__stream_t *s = e->stream;
    size_t T = e->plan.ntensors;
    igrad_status_t st = IGRAD_OK;
    size_t i = 0;
    for (; i < n; i++) {
        size_t t = tensors[i];
        if (t >= T) {
            st = igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                             "igrad_engine_ready: step %lld: tensors[%zu] is %zu, but the "
                             "layout has %zu tensors",
                             (long long)e->step.cur_step, i, t, T);
            break;
        }
        if (s->given[t]) {
            st = igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                             "igrad_engine_ready: step %lld: tensor %zu (%s) was already given "
                             "at this step",
                             (long long)e->step.cur_step, t, e->plan.t[t].name);
            break;
        }
        s->given[t] = 2; /* in this call */
    }
    for (size_t k = 0; k < i; k++) s->given[tensors[k]] = 0;
    return st;
}

/* `step` is the streamed step open on e (IGRAD_E_STATE naming `fn`
 * otherwise). */
static igrad_status_t check_open(const igrad_engine_t *e, int64_t step, const char *fn)
{
    IGRAD_FAIL_IF(e->state != IGRAD__ENGINE_STREAM, IGRAD_E_STATE,
                  "%s: step %lld: no streamed step is open (call igrad_engine_open first)",
                  fn, (long long)step);
    IGRAD_FAIL_IF(step != e->step.cur_step, IGRAD_E_STATE, "%s: step %lld, but step %lld is open",
                  fn, (long long)step, (long long)e->step.cur_step);
    return IGRAD_OK;
}

/* Zeros for the dense method to pack in place of a NULL gradient (the step
 * fails at close on every rank; the collectives still run). */
static igrad_status_t zeros_for(igrad_engine_t *e, size_t t, float **out)
{
    igrad__stream_t *s = e->stream;
    if (!s->zeros) {
        int64_t most = 0;
        for (size_t k = 0; k < e->plan.ntensors; k++)
            if (e->plan.t[k].n > most) most = e->plan.t[k].n;
        s->zeros = e->mem.dp->alloc((size_t)most * sizeof(float), 1);
        IGRAD_FAIL_IF(!s->zeros, IGRAD_E_NOMEM,
                      "igrad_engine_ready: step %lld: out of memory for the zeros packed in "
                      "place of the NULL gradient of %s",
                      (long long)e->step.cur_step, e->plan.t[t].name);
        s->zeros_count = (size_t)most;
    }
    *out = s->zeros;
    return IGRAD_OK;
}

igrad_status_t igrad__flat_ready(igrad_engine_t *e, int64_t step, const size_t *tensors,
                                 size_t n, float *const *grads, const igrad_bucket_t **buckets,
                                 size_t *nbuckets)
{
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_ready"));
    IGRAD_FAIL_IF(!buckets || !nbuckets, IGRAD_E_INVALID,
                  "igrad_engine_ready: buckets or nbuckets is NULL");
    *buckets = NULL;
    *nbuckets = 0;
    IGRAD_CHECK(check_open(e, step, "igrad_engine_ready"));
    IGRAD_FAIL_IF(n > 0 && (!tensors || !grads), IGRAD_E_INVALID,
                  "igrad_engine_ready: step %lld: tensors or grads is NULL", (long long)step);
    IGRAD_CHECK(check_tensors(e, tensors, n));

    igrad__stream_t *s = e->stream;
    int dense = IGRAD__RUN(e)->sp == IGRAD_SPARSIFIER_NONE; /* a warm-up step's too */
    for (size_t i = 0; i < n; i++) {
        size_t t = tensors[i];
        s->given[t] = 1;
        s->grads[t] = grads[i];
        s->pack_grads[t] = grads[i];
        if (!grads[i] && dense) {
            igrad_status_t st = zeros_for(e, t, &s->pack_grads[t]);
            if (st != IGRAD_OK) return igrad__engine_break(e, st);
        }
    }
    s->ngiven += n;
    if (s->sums)
        for (size_t i = 0; i < n; i++)
            if (grads[i]) s->sums[tensors[i]] = grad_hash(e, tensors[i], grads[i]);
    double t0 = igrad__now_ms();
    e->mem.dp->stream_ready(IGRAD__PARTS(e), s->grads, tensors, n);
    double t1 = igrad__now_ms();
    e->stats.select_ms += t1 - t0;

    for (size_t i = 0; i < n; i++) {
        size_t t = tensors[i];
        for (size_t b = s->tblock0[t]; b < s->tblock0[t] + s->tnblk[t]; b++)
            s->missing[s->compact[e->step.bucket_of[b]]]--;
    }
    size_t first = s->next;
    while (s->next < e->step.nbk && s->missing[s->next] == 0) {
        size_t j = s->next++;
        e->mem.dp->pack[e->step.bk[j].route->wire](IGRAD__PARTS(e), j, s->pack_grads);
    }
    e->stats.pack_ms += igrad__now_ms() - t1;
    *buckets = e->step.desc + first;
    *nbuckets = s->next - first;
    return IGRAD_OK;
}

/* IGRAD_DEBUG_STREAM: the first gradient whose bytes differ from what
 * ready hashed, as this rank's failure of the step. */
static igrad_status_t changed_since_ready(igrad_engine_t *e, int64_t *bad)
{
    const igrad__stream_t *s = e->stream;
    for (size_t t = 0; t < e->plan.ntensors; t++) {
        if (!s->grads[t] || grad_hash(e, t, s->grads[t]) == s->sums[t]) continue;
        *bad = (int64_t)t;
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           "igrad_engine_close: step %lld: the gradient of %s changed between "
                           "igrad_engine_ready and igrad_engine_close (IGRAD_DEBUG_STREAM "
                           "compares them); the step is skipped on every rank",
                           (long long)e->step.cur_step, e->plan.t[t].name);
    }
    return IGRAD_OK;
}

/* This rank's failure of the step, as the whole step would report it: a
 * NULL gradient, then per tensor a failed selection or a non-finite
 * value; with IGRAD_DEBUG_STREAM a gradient changed since ready. */
static igrad_status_t local_failure(igrad_engine_t *e, int64_t *bad)
{
    float *const *grads = e->stream->grads;
    IGRAD_CHECK(igrad__engine_null_grads(e, e->step.cur_step, grads, bad));
    if (e->stream->sums) IGRAD_CHECK(changed_since_ready(e, bad));
    /* a failed selection too (tstatus), as the fused check reports it */
    return igrad__engine_nonfinite(e, e->step.cur_step, grads, bad);
}

igrad_status_t igrad__flat_close(igrad_engine_t *e, int64_t step)
{
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_close"));
    IGRAD_CHECK(check_open(e, step, "igrad_engine_close"));
    igrad__stream_t *s = e->stream;
    igrad__plan_t *p = IGRAD__RUN(e); /* the warm-up's below start_iter */
    if (s->ngiven < e->plan.ntensors) {
        size_t t = 0;
        while (s->given[t]) t++;
        return igrad__fail(IGRAD_E_STATE, __FILE__, __LINE__,
                           "igrad_engine_close: step %lld: %zu of %zu tensors were not given "
                           "to igrad_engine_ready (the first is %s); the step stays open",
                           (long long)step, e->plan.ntensors - s->ngiven, e->plan.ntensors,
                           e->plan.t[t].name);
    }

    double t0 = igrad__now_ms();
    int64_t bad = -1;
    igrad_status_t st = local_failure(e, &bad);
    igrad_status_t ag = igrad__engine_agree_step(e, step, st, bad);
    double t1 = igrad__now_ms();
    e->stats.comm_ms += t1 - t0;
    if (ag != IGRAD_OK) {
        e->stats.skipped = 1;
        e->stats.total_ms = t1 - e->t_start;
        e->state = IGRAD__ENGINE_IDLE;
        return ag;
    }

    /* From here on the step counts on every rank. */
    e->state = IGRAD__ENGINE_IDLE; /* a failure below breaks the engine */
    if (p->hist.count) {
        st = igrad__pack_history_update(&p->hist, e->step.blocks, e->step.nblk);
        if (st != IGRAD_OK) return igrad__engine_break(e, st);
    }
    if (p->sp != IGRAD_SPARSIFIER_NONE)
        e->mem.dp->stream_commit(IGRAD__PARTS(e), s->grads);
    else
        e->mem.dp->zero(IGRAD__PARTS(e), s->grads);
    double t2 = igrad__now_ms();
    e->stats.select_ms += t2 - t1;
    for (size_t j = 0; j < e->step.nbk; j++) {
        st = e->mem.dp->unpack[e->step.bk[j].route->wire](IGRAD__PARTS(e), j, s->grads);
        if (st != IGRAD_OK) return igrad__engine_break(e, st);
    }
    e->stats.unpack_ms = igrad__now_ms() - t2;
    return igrad__engine_finish_step(e);
}
