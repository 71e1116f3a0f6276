/*
 * route.c — the bucket route table (route.h): one row per collective a
 * bucket can take, with its wire layout, the cost model of
 * `collective = auto`, its arena room, its issue function and its
 * statistics. Adding a collective is adding a row here (plus, for a new
 * wire layout, its pack/unpack in each data-plane backend).
 *
 * Not here: the choice of blocks per bucket (pack.c), the bytes (dp_*.c).
 */
#include "plan/route.h"

#include "comm/comm_internal.h"
#include "comm/sparse_allreduce.h"
#include "core/value8.h"

#include <stddef.h>


static size_t align8(size_t x) { return (x + 7) & ~(size_t)7; }

/* The scaled α-β time of route.h: `steps` message steps of α and `pbytes`
 * = wire bytes × P, both divided by P−1 (every route's steps and bytes
 * have that factor), so cost = P·B·steps'·α + 8000·pbytes'. */
static igrad__cost_t ab_cost(const igrad__route_link_t *l, int64_t P, int64_t steps,
                             igrad__cost_t pbytes)
{
    return (igrad__cost_t)P * l->bandwidth_mbps * steps * l->latency_ns +
           (igrad__cost_t)8000 * pbytes;
}

/* ---- gather: one allgather of the sparse payload ------------------------ */

/* Ring all-gather: P−1 steps, (P−1)·s bytes; over P−1: 1 step, s bytes. */
static igrad__cost_t gather_cost(const igrad__route_bucket_t *b, const igrad__route_link_t *l)
{
    return ab_cost(l, b->P, 1, (igrad__cost_t)b->P * b->s);
}

static void gather_arena(int64_t smax, int64_t emax, int64_t dmax, size_t P, int forced,
                         size_t slack, size_t *send, size_t *recv)
{
    (void)emax;
    (void)dmax;
    (void)forced;
    *send = (size_t)smax + slack;
    *recv = P * (size_t)smax + slack;
}

/* [values of every block][32-bit indices][16-bit indices][coded indices]
 * (formats.md §8; a block has fixed widths or codes, by config.index_code) */
static void gather_layout(igrad__step_t *s, int nranks, int value_nbytes, igrad__step_bucket_t *bk,
                          size_t *send_off, size_t *recv_off)
{
    size_t v = 0;
    for (size_t q = 0; q < bk->nblocks; q++) {
        igrad__step_block_t *bi = &s->binfo[s->order[bk->first + q]];
        bi->val_off = v;
        v += (size_t)igrad__value_area_nbytes(value_nbytes, bi->count); /* FP8: + scale */
    }
    for (int width = 4; width >= 2; width -= 2)
        for (size_t q = 0; q < bk->nblocks; q++) {
            igrad__step_block_t *bi = &s->binfo[s->order[bk->first + q]];
            if (bi->idx_code || bi->idx_nbytes != width) continue;
            bi->idx_off = v;
            v += (size_t)bi->count * (size_t)width;
        }
    for (size_t q = 0; q < bk->nblocks; q++) {
        igrad__step_block_t *bi = &s->binfo[s->order[bk->first + q]];
        if (!bi->idx_code) continue;
        bi->idx_off = v;
        v += (size_t)igrad__step_block_idx_bytes(bi);
    }
    bk->send_off = *send_off;
    bk->send_nbytes = v;
    *send_off = align8(*send_off + v);
    bk->recv_off = *recv_off;
    bk->recv_nbytes = (size_t)nranks * v;
    *recv_off = align8(*recv_off + bk->recv_nbytes);
}

static void gather_describe(unsigned char *send_arena, const igrad__step_bucket_t *bk,
                            igrad_bucket_t *d)
{
    d->send = send_arena + bk->send_off;
    d->send_nbytes = bk->send_nbytes;
    d->dtype = IGRAD_DTYPE_U8;
    d->count = bk->send_nbytes;
}

static int64_t gather_payload(const igrad__step_bucket_t *bk)
{
    return (int64_t)bk->send_nbytes;
}

static double gather_wire(const igrad__step_bucket_t *bk, double P)
{
    return (P - 1.0) * (double)bk->send_nbytes;
}

static igrad_status_t gather_issue(const igrad__route_io_t *io, igrad__step_t *s, size_t j,
                                   igrad_comm_request_t **req)
{
    const igrad_bucket_t *d = &s->desc[j];
    return igrad__comm_iallgather(io->comm, d->send, d->send_nbytes, d->recv, io->space, io->stream,
                                  req);
}

/* ---- reduce: one in-place SUM all-reduce of dense segments -------------- */

/* Ring all-reduce: 2(P−1) steps, 2(P−1)/P·4d bytes; over P−1: 2 steps,
 * 8d/P bytes. */
static igrad__cost_t reduce_cost(const igrad__route_bucket_t *b, const igrad__route_link_t *l)
{
    return ab_cost(l, b->P, 2, (igrad__cost_t)8 * b->d);
}

/* Under auto a reduce bucket is chosen only when its cost is below the
 * gather's; its α term is twice the gather's, so that implies 8d < P*s,
 * and its 4d bytes fit in the room of the gather it replaces: no room of
 * its own. */
static void reduce_arena(int64_t smax, int64_t emax, int64_t dmax, size_t P, int forced,
                         size_t slack, size_t *send, size_t *recv)
{
    (void)smax;
    (void)emax;
    (void)P;
    *send = 0;
    *recv = forced ? (size_t)dmax * sizeof(float) + slack : 0;
}

static void reduce_layout(igrad__step_t *s, int nranks, int value_nbytes, igrad__step_bucket_t *bk,
                          size_t *send_off, size_t *recv_off)
{
    (void)s;
    (void)nranks;
    (void)value_nbytes;
    (void)send_off;
    bk->recv_off = *recv_off;
    bk->recv_nbytes = bk->dense_count * sizeof(float);
    *recv_off = align8(*recv_off + bk->recv_nbytes);
}

static void reduce_describe(unsigned char *send_arena, const igrad__step_bucket_t *bk,
                            igrad_bucket_t *d)
{
    (void)send_arena;
    d->send = d->recv;
    d->send_nbytes = bk->recv_nbytes;
    d->dtype = IGRAD_DTYPE_F32;
    d->count = bk->dense_count;
}

static int64_t reduce_payload(const igrad__step_bucket_t *bk)
{
    return (int64_t)bk->recv_nbytes;
}

static double reduce_wire(const igrad__step_bucket_t *bk, double P)
{
    return 2.0 * (P - 1.0) / P * (double)bk->recv_nbytes;
}

static igrad_status_t reduce_issue(const igrad__route_io_t *io, igrad__step_t *s, size_t j,
                                   igrad_comm_request_t **req)
{
    const igrad_bucket_t *d = &s->desc[j];
    return igrad__comm_iallreduce(io->comm, d->recv, d->recv, d->count, IGRAD_DTYPE_F32,
                                  IGRAD_REDUCE_SUM, io->space, io->stream, req);
}

/* ---- sparse all-reduce: split, reduce and re-sparsify, all-gather ------- */

/* auto's only with config.auto_sparse_reduce (an opt-in route): its
 * result is not the mean of what the ranks sent but the top of it, the
 * rest going to the owners' residuals, so choosing it per bucket changes
 * the method's result with P and the link (docs/architecture.md §5.7).
 * Priced by the time fitted to the testbed (route.h: 17 α + 9/5 × the
 * wire bytes × β) on sar_wire's balanced bytes, (P−1)(112 + 8·kout) +
 * 8k(P−1)/P. Scaled as every route, × B·P/(P−1): the α term
 * 17·α·B·P/(P−1), rounded down (the other routes' costs are integers, so
 * "cheaper than route X" stays exact: floor(y) < x iff y < x for an
 * integer x), and the bytes term 8000·9/5·(P(112 + 8·kout) + 8k). */
_Static_assert((8000 * IGRAD__SAR_FIT_BETA_NUM) % IGRAD__SAR_FIT_BETA_DEN == 0,
               "the sparse all-reduce's scaled bytes term must stay an integer");

static igrad__cost_t sar_cost(const igrad__route_bucket_t *b, const igrad__route_link_t *l)
{
    igrad__cost_t P = b->P;
    igrad__cost_t kout = (igrad__cost_t)igrad__sar_kout((size_t)b->k, (int)b->P);
    igrad__cost_t alpha = (igrad__cost_t)IGRAD__SAR_FIT_ALPHA * l->latency_ns *
                          l->bandwidth_mbps * P / (P - 1);
    return alpha + (igrad__cost_t)(8000 * IGRAD__SAR_FIT_BETA_NUM / IGRAD__SAR_FIT_BETA_DEN) *
                       (P * (112 + 8 * kout) + (igrad__cost_t)8 * b->k);
}

/* The send arena holds its entries, 8 bytes each (not a multiple of the
 * gather bytes: an FP8 or 16-bit entry with a compact index takes under 4
 * of them), forced or under auto (where the table's maximum takes it).
 * Nothing in the recv arena: the result and the remainder stay in the
 * bucket slot's workspace (step->sar) until unpack. */
static void sar_arena(int64_t smax, int64_t emax, int64_t dmax, size_t P, int forced,
                      size_t slack, size_t *send, size_t *recv)
{
    (void)smax;
    (void)dmax;
    (void)P;
    (void)forced;
    *send = (size_t)emax * sizeof(igrad__sar_entry_t) + slack;
    *recv = 0;
}

static void sar_layout(igrad__step_t *s, int nranks, int value_nbytes, igrad__step_bucket_t *bk,
                       size_t *send_off, size_t *recv_off)
{
    (void)s;
    (void)nranks;
    (void)value_nbytes;
    bk->send_off = *send_off;
    bk->send_nbytes = (size_t)bk->entries * sizeof(igrad__sar_entry_t);
    *send_off = align8(*send_off + bk->send_nbytes);
    bk->recv_off = *recv_off;
    bk->recv_nbytes = 0;
    bk->wire_counted = -1.0;
}

/* What the call moved for this rank (sparse_allreduce.h's counts: the
 * split's counts and entries sent, the status records and the reduced
 * blocks received). A bucket that did not run (a plan-only engine) gets
 * the balanced model of the same counts: the entries outside a rank's own
 * range are k(P-1)/P when the indices are spread evenly. */
static double sar_wire(const igrad__step_bucket_t *bk, double P)
{
    if (bk->wire_counted >= 0.0) return bk->wire_counted;
    if (P <= 1.0) return 0.0;
    double k = (double)bk->entries;
    double kout = (double)igrad__sar_kout((size_t)bk->entries, (int)P);
    return (P - 1.0) * (8.0 + 40.0 + 64.0 + 8.0 * kout) + 8.0 * k * (P - 1.0) / P;
}

/* The bucket's index space by what lies where in it: FNV-1a over each
 * dense segment's tensor, first entry and size, in order (two steps'
 * buckets of one size but other tensors, e.g. two release phases over
 * layers of equal shapes, are other spaces). */
static uint64_t sar_space_key(const igrad__step_t *s, const igrad__step_bucket_t *bk)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &s->binfo[s->order[bk->first + q]];
        if (!bi->seg_owner) continue;
        const uint64_t v[3] = {bi->tensor, (uint64_t)bi->seg_begin, (uint64_t)bi->seg_count};
        for (int i = 0; i < 3; i++) {
            h ^= v[i];
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}

/* Blocking: the module runs its exchanges here and the request is done.
 * Balanced split points (decision 0060): each bucket slot's workspace
 * carries the points its last call over an index space derived to its
 * next call over the same space and ranks (equal ranges otherwise; a
 * space is its size and sar_space_key), the same on every rank; the
 * engine's saved state keeps them (engine_state.c). */
static igrad_status_t sar_issue(const igrad__route_io_t *io, igrad__step_t *s, size_t j,
                                igrad_comm_request_t **req)
{
    igrad__step_bucket_t *bk = &s->bk[j];
    igrad__sar_t *w = &s->sar[j];
    w->balanced = 1;
    w->space_key = sar_space_key(s, bk);
    const igrad__sar_entry_t *in =
        (const igrad__sar_entry_t *)(const void *)(io->send_arena + bk->send_off);
    IGRAD_CHECK(igrad__sar_allreduce_on(w, io->sar_ops, io->stream, io->comm,
                                        (uint64_t)bk->dense_count, (size_t)bk->entries, in));
    bk->wire_counted =
        (double)(w->bytes.split_sent + w->bytes.status_recv + w->bytes.gather_recv);
    return igrad__comm_request_done(io->comm, "sparse all-reduce", req);
}

/* ---- the table ------------------------------------------------------------ */

/* Indexed by igrad_bucket_kind_t; order matters for auto's ties (the
 * earlier row wins). */
static const igrad__route_t routes[] = {
    {IGRAD_BUCKET_GATHER, "gather", IGRAD__WIRE_SPARSE, 0, IGRAD_COLLECTIVE_GATHER, 1,
     gather_cost, 0, gather_arena, gather_layout, gather_describe,
     offsetof(igrad_step_stats_t, gather_buckets), gather_payload, gather_wire, gather_issue},
    {IGRAD_BUCKET_REDUCE, "reduce", IGRAD__WIRE_DENSE, 1, IGRAD_COLLECTIVE_REDUCE, 1,
     reduce_cost, 0, reduce_arena, reduce_layout, reduce_describe,
     offsetof(igrad_step_stats_t, reduce_buckets), reduce_payload, reduce_wire, reduce_issue},
    {IGRAD_BUCKET_SPARSE_REDUCE, "sparse all-reduce", IGRAD__WIRE_SAR, 0,
     IGRAD_COLLECTIVE_SPARSE_REDUCE, 0, sar_cost, 1, sar_arena, sar_layout,
     gather_describe /* its send bytes, as U8 */,
     offsetof(igrad_step_stats_t, sparse_reduce_buckets),
     gather_payload /* its send bytes: 8 per entry */, sar_wire, sar_issue},
};
#define NROUTES (sizeof routes / sizeof routes[0])

const igrad__route_t *igrad__route_of(igrad_bucket_kind_t kind)
{
    for (size_t i = 0; i < NROUTES; i++)
        if (routes[i].kind == kind) return &routes[i];
    return NULL;
}

/* The route `collective` (or the dense method) forces, or NULL under auto. */
static const igrad__route_t *forced_route(igrad_collective_t collective, int dense)
{
    for (size_t i = 0; i < NROUTES; i++)
        if (dense ? routes[i].dense_method : routes[i].forced_by == collective)
            return &routes[i];
    return NULL;
}

const igrad__route_t *igrad__route_choose(igrad_collective_t collective, int dense,
                                          const igrad__route_bucket_t *b,
                                          const igrad__route_link_t *l)
{
    const igrad__route_t *f = forced_route(collective, dense);
    if (f) return f;
    if (b->P == 1) return &routes[0]; /* one rank: a copy of the payload */
    const igrad__route_t *best = &routes[0];
    igrad__cost_t c = best->cost(b, l);
    for (size_t i = 1; i < NROUTES; i++) {
        if (routes[i].optin && !l->sar) continue;
        igrad__cost_t ci = routes[i].cost(b, l);
        if (ci < c) {
            best = &routes[i];
            c = ci;
        }
    }
    return best;
}

void igrad__route_arenas(igrad_collective_t collective, int dense, int sar, int64_t smax,
                         int64_t emax, int64_t dmax, size_t P, size_t slack, size_t *send,
                         size_t *recv)
{
    const igrad__route_t *f = forced_route(collective, dense);
    *send = *recv = 0;
    for (size_t i = 0; i < NROUTES; i++) {
        if (f && f != &routes[i]) continue;
        if (!f && routes[i].optin && !sar) continue;
        size_t s = 0, r = 0;
        routes[i].arena(smax, emax, dmax, P, f != NULL, slack, &s, &r);
        if (s > *send) *send = s;
        if (r > *recv) *recv = r;
    }
}

igrad_status_t igrad__route_check_engine(const igrad_config_t *c, int dense,
                                         const igrad__route_dp_t *dp, const igrad_comm_t *comm)
{
    const igrad__route_t *f = forced_route(c->collective, dense);
    if (!f) return IGRAD_OK;
    IGRAD_FAIL_IF(!dp->wire[f->wire] || (f->wire == IGRAD__WIRE_SAR && !dp->sar),
                  IGRAD_E_UNSUPPORTED,
                  "igrad_engine_create: config.collective %s, but the '%s' data plane has no "
                  "%s route (use another collective, or the CPU data plane)",
                  igrad_collective_name(c->collective), dp->name, f->name);
    if (f->wire != IGRAD__WIRE_SAR) return IGRAD_OK;
    IGRAD_FAIL_IF(!comm->vt->alltoallv, IGRAD_E_UNSUPPORTED,
                  "igrad_engine_create: config.collective sparse_reduce needs a communicator "
                  "with a variable all-to-all (self, MPI, NCCL, self_cuda, custom with "
                  "ops->alltoallv); '%s' has none",
                  comm->backend);
    IGRAD_FAIL_IF(!(comm->spaces & IGRAD__MEM_BIT(dp->space)), IGRAD_E_UNSUPPORTED,
                  "igrad_engine_create: config.collective sparse_reduce runs on the '%s' data "
                  "plane's %s memory, which communicator '%s' does not take",
                  dp->name, igrad__mem_space_name(dp->space), comm->backend);
    IGRAD_FAIL_IF(c->grad_dtype != IGRAD_DTYPE_F32, IGRAD_E_UNSUPPORTED,
                  "igrad_engine_create: config.collective sparse_reduce takes F32 gradients "
                  "only (config.grad_dtype is %s)",
                  igrad_dtype_name(c->grad_dtype));
    return IGRAD_OK;
}

igrad_status_t igrad__route_check_caller(const igrad_config_t *c, int dense, const char *what)
{
    const igrad__route_t *f = forced_route(c->collective, dense);
    IGRAD_FAIL_IF(f && !f->caller_runs, IGRAD_E_UNSUPPORTED,
                  "%s: collective %s needs igrad_engine_sync (the %s is the engine's own "
                  "exchanges, which a caller's collective cannot run)",
                  what, igrad_collective_name(c->collective), f->name);
    return IGRAD_OK;
}

int igrad__route_auto_sar(const igrad_config_t *c, int dense, int plan_only,
                          const igrad__route_dp_t *dp, const igrad_comm_t *comm)
{
    if (!c->auto_sparse_reduce || c->collective != IGRAD_COLLECTIVE_AUTO) return 0;
    if (dense || c->grad_dtype != IGRAD_DTYPE_F32) return 0;
    if (plan_only) return 1; /* the CPU data plane over MPI, as igrad plan models */
    return dp->wire[IGRAD__WIRE_SAR] && dp->sar && comm && comm->vt->alltoallv &&
           (comm->spaces & IGRAD__MEM_BIT(dp->space));
}

igrad__route_link_t igrad__route_link_of(const igrad_config_t *c, int sar)
{
    igrad__route_link_t l = {c->link_latency_ns, c->link_bandwidth_mbps, sar};
    return l;
}
