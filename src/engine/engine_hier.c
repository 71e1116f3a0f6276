/*
 * engine_hier.c — the two-level sync (config.topology = hier, issue 12 §1).
 *
 * The P ranks form N nodes of L ranks. Every tensor has an owner among a
 * node's L ranks (whole components, balanced by entries), or, when whole
 * components cannot be balanced within 1.10 x total/L, the largest tensors
 * are split by rows into L pieces, one per local rank (igrad__hier_ownership).
 * Node collectives and shard engines work per piece. A step
 * (1) agrees over all P ranks that every gradient pointer is there and the
 * ranks are at the same step (the engine the caller holds is a plan-only
 * engine of the whole layout for P ranks: its items are what the world
 * agrees on, at create and at every step, before any node collective);
 * (2) sums each tensor onto its owner inside the node (a reduce into the
 * owner's shard buffer; the gradients themselves are not written); (3) runs
 * the owner's *shard engine* — an ordinary engine over the owned tensors
 * whose comm is the N ranks with the same local rank, one per node — on
 * those node sums: error feedback, gate, selection, packing and the sparse
 * exchange, averaged over all P ranks; its step's outcome is agreed over
 * the world too (agree_world, its after_agree hook), so a NaN in one shard skips the
 * step on every rank; (4) broadcasts each owner's result inside the node.
 * Residuals live with the owner and hold node sums; per shard and owner,
 * Σ_steps (node sum) = Σ_steps sent + residual.
 *
 * The shard engines are flat engines that this file reaches only through
 * the public entry points and the flat row's small API for it
 * (engine_shard.c: failure, progress, copy, bucket slots, prepare,
 * set_stream), never through their fields.
 *
 * Not here: what a shard engine does (engine.c and the rest, unchanged),
 * the comm ops (comm.c: split, ireduce, ibcast), the time model of the
 * route (tools/plan_cost.c).
 */
#include "engine/engine_internal.h"
#include "engine/engine_state.h"

#include "comm/comm_internal.h"
#include "dp/dp.h"
#include "model/layout_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a shard engine needs to agree a step's outcome with the world. */
typedef struct igrad__world_link {
    igrad_comm_t *comm;        /* the world (borrowed) */
    const igrad_engine_t *top; /* the engine the caller holds: tensor names */
    const size_t *full;        /* (shard tensors) layout index of each */
    uint64_t *buf;             /* (3 P) exchange buffer */
} igrad__world_link_t;

/* Rows [row0, row0 + rows) of tensor t (entries [off, off + n)), owned by
 * local rank `owner`, index `sub` in its shard; a whole tensor is one piece
 * with split 0. */
typedef struct igrad__piece {
    size_t t, sub;
    int64_t row0, rows, off, n;
    int owner, split;
} igrad__piece_t;

typedef struct igrad__hier {
    const igrad__dp_ops_t *dp;  /* of the shard engine and buffers (NULL: plan-only) */
    void *stream;               /* the data plane's queue: the shard engine's and the
                                   node collectives' (igrad_engine_set_stream_cuda) */
    int L, N;                   /* ranks per node, nodes */
    int local, node;            /* this rank's place (0, 0 when plan-only) */
    igrad_comm_t *node_comm;    /* owned: the L ranks of this node */
    igrad_comm_t *inter_comm;   /* owned: the N ranks with this local rank */
    size_t npieces;
    igrad__piece_t *pieces;     /* (npieces) every tensor's, layout order */
    size_t *first;              /* (T + 1) tensor t's pieces: [first[t], first[t+1]) */
    int64_t busiest;            /* the busiest shard's planned bytes per step */
    igrad_engine_t **plans;     /* (L) plan-only shard engines, N ranks each */
    igrad_engine_t *inner;      /* this rank's shard engine (NULL: plan-only) */
    igrad__world_link_t link;
    size_t nown;
    size_t *own;                /* (nown) the owned pieces, layout order */
    int64_t own_entries;        /* their entries: the shard buffer's floats */
    float *shard_mem;           /* node sums of the owned tensors, concatenated
                                   (the data plane's memory) */
    float **shard;              /* (nown) pointers into shard_mem */
    igrad_comm_request_t **reqs; /* (npieces) */
    uint64_t *status_buf;       /* (P) world_verdict */
    int64_t *loads;             /* plan-only: every shard's bucket loads */
} igrad__hier_t;

/* IGRAD_E_UNSUPPORTED for an entry point the two-level sync does not have. */
static igrad_status_t refuse(const char *what)
{
    return igrad__fail(IGRAD_E_UNSUPPORTED, __FILE__, __LINE__,
                       "%s: a two-level engine (config.topology hier) runs whole steps with "
                       "its own collectives: use igrad_engine_sync",
                       what);
}

/* ---- ownership ------------------------------------------------------------ */

/* The ownership rule (a pure function of the layout and L; the same on
 * every node and rank).
 *
 * Units are the layout's components (all their tensors together, so a
 * shard's components are whole and its profile rows are the model's) and
 * each OTHER tensor. (1) LPT by entries over the units (largest first,
 * ties by unit number; each to the least loaded rank, ties to the lower).
 * If the busiest rank then holds at most IGRAD__HIER_BOUND_NUM /
 * IGRAD__HIER_BOUND_DEN (1.10) of total/L, that is the plan: no piece.
 * (2) Otherwise tensors are split, one at a time, the largest unsplit
 * tensor first (entries down, ties to the lower index) among those of two
 * or more dimensions and at least L rows: a split tensor of R rows becomes
 * L pieces, piece j its rows [jR/L, (j+1)R/L) owned by local rank j (so
 * every shard holds a piece of it, and its component, whose other tensors
 * stay whole with their unit); the units, less their split tensors, are then placed by LPT as in
 * (1) onto the loads of the pieces. Splitting stops when the bound holds or
 * no tensor is left to split. 1-D tensors are never split: their
 * selection spec is over the whole vector (a flat budget), and they are
 * norms and biases, never the dominant unit.
 *
 * The weights are the tensors' entries (igrad__hier_ownership) or, as
 * the engine uses it, their planned wire bytes per step
 * (igrad__hier_ownership_weighted with hier_weights; a split piece weighs
 * its rows' share): the slowest shard sets the node's time, and a sparse
 * method's bytes are not its entries (issue 28: ig at P = 256 had shard
 * payloads 1.28x the mean by entries, 1.00x by bytes). The same bound,
 * 1.10, for both: a split changes the selection (top-k per piece), so
 * LPT over whole units is preferred wherever it is good enough.
 *
 * owner[t]: the local rank of a whole tensor (for a split one: -1);
 * parts[t]: 1 for a whole tensor, L for a split one. *busiest: the busiest
 * rank's weight. */
#define IGRAD__HIER_BOUND_NUM 11
#define IGRAD__HIER_BOUND_DEN 10

igrad_status_t igrad__hier_ownership(const igrad_layout_t *layout, int L, int *owner,
                                     int *parts, int64_t *busiest);
igrad_status_t igrad__hier_ownership_weighted(const igrad_layout_t *layout, int L,
                                              const int64_t *weight, int bound_num,
                                              int bound_den, int *owner, int *parts,
                                              int64_t *busiest);

static int64_t piece_rows(int64_t R, int k, int j)
{
    return (int64_t)(((__int128)R * (j + 1)) / k - ((__int128)R * j) / k);
}

static int64_t piece_row0(int64_t R, int k, int j) { return (int64_t)(((__int128)R * j) / k); }

igrad_status_t igrad__hier_ownership(const igrad_layout_t *layout, int L, int *owner,
                                     int *parts, int64_t *busiest)
{
    return igrad__hier_ownership_weighted(layout, L, NULL, IGRAD__HIER_BOUND_NUM,
                                          IGRAD__HIER_BOUND_DEN, owner, parts, busiest);
}

/* weight: (T) each tensor's weight, NULL for its entries; the bound
 * bound_num / bound_den of the mean. */
igrad_status_t igrad__hier_ownership_weighted(const igrad_layout_t *layout, int L,
                                              const int64_t *weight, int bound_num,
                                              int bound_den, int *owner, int *parts,
                                              int64_t *busiest)
{
    size_t T = igrad_layout_count(layout), C = igrad_layout_component_count(layout);
    size_t U = C;
    IGRAD_FAIL_IF(L < 1, IGRAD_E_INVALID, "igrad_engine_create: %d ranks per node", L);
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        IGRAD_CHECK(igrad_layout_tensor(layout, t, &ti));
        if (ti.component < 0) U++;
    }
    IGRAD_FAIL_IF(U < (size_t)L, IGRAD_E_INVALID,
                  "igrad_engine_create: config.topology hier with %d ranks per node needs at "
                  "least %d components or OTHER tensors to own; the layout has %zu",
                  L, L, U);
    int64_t *w = calloc(U, sizeof *w), *load = calloc((size_t)L, sizeof *load);
    size_t *unit = calloc(T ? T : 1, sizeof *unit), *order = calloc(U, sizeof *order);
    int *uowner = calloc(U, sizeof *uowner);
    igrad_status_t st = IGRAD_OK;
    if (!w || !load || !unit || !order || !uowner) {
        st = igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "igrad_engine_create: out of memory");
        goto done;
    }
    int64_t total = 0;
    size_t u_other = C;
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        igrad_layout_tensor(layout, t, &ti);
        unit[t] = ti.component >= 0 ? (size_t)ti.component : u_other++;
        parts[t] = 1;
        total += weight ? weight[t] : ti.count;
    }
    for (;;) {
        /* the units' weights without their split tensors; the pieces' loads */
        memset(w, 0, U * sizeof *w);
        memset(load, 0, (size_t)L * sizeof *load);
        for (size_t t = 0; t < T; t++) {
            igrad_tensor_info_t ti;
            igrad_layout_tensor(layout, t, &ti);
            if (parts[t] == 1) {
                w[unit[t]] += weight ? weight[t] : ti.count;
                continue;
            }
            int64_t row = ti.count / ti.shape[0];
            for (int j = 0; j < parts[t]; j++) {
                int64_t rows = piece_rows(ti.shape[0], parts[t], j);
                load[j] += weight ? (int64_t)((__int128)weight[t] * rows / ti.shape[0])
                                  : rows * row;
            }
        }
        for (size_t u = 0; u < U; u++) order[u] = u;
        for (size_t i = 1; i < U; i++) { /* insertion sort: weight down, unit up */
            size_t x = order[i], j = i;
            while (j > 0 &&
                   (w[order[j - 1]] < w[x] || (w[order[j - 1]] == w[x] && order[j - 1] > x))) {
                order[j] = order[j - 1];
                j--;
            }
            order[j] = x;
        }
        for (size_t i = 0; i < U; i++) {
            int best = 0;
            for (int l = 1; l < L; l++)
                if (load[l] < load[best]) best = l;
            uowner[order[i]] = best;
            load[best] += w[order[i]];
        }
        int64_t top = 0;
        for (int l = 0; l < L; l++) top = load[l] > top ? load[l] : top;
        *busiest = top;
        if ((__int128)top * bound_den * L <= (__int128)total * bound_num) break;
        /* the next tensor to split */
        size_t pick = T;
        int64_t pick_n = -1;
        for (size_t t = 0; t < T; t++) {
            igrad_tensor_info_t ti;
            igrad_layout_tensor(layout, t, &ti);
            if (parts[t] != 1 || ti.ndim < 2 || ti.shape[0] < L || L < 2) continue;
            int64_t wt = weight ? weight[t] : ti.count;
            if (wt > pick_n) {
                pick = t;
                pick_n = wt;
            }
        }
        if (pick == T) break;
        parts[pick] = L;
    }
    for (size_t t = 0; t < T; t++) owner[t] = parts[t] == 1 ? uowner[unit[t]] : -1;
done:
    free(w);
    free(load);
    free(unit);
    free(order);
    free(uowner);
    return st;
}

/* The pieces of every tensor from the rule: a whole tensor is one piece
 * (its rows all), a split one k; pieces in layout order, each tensor's by
 * rows; each with its index in its owner's shard. */
static igrad_status_t make_pieces(igrad__hier_t *h, const igrad_layout_t *layout,
                                  const int64_t *weight)
{
    size_t T = igrad_layout_count(layout);
    int *owner = calloc(T ? T : 1, sizeof *owner), *parts = calloc(T ? T : 1, sizeof *parts);
    size_t *next = calloc((size_t)h->L, sizeof *next);
    h->first = calloc(T + 1, sizeof *h->first);
    igrad_status_t st = IGRAD_OK;
    if (!owner || !parts || !next || !h->first)
        st = igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "igrad_engine_create: out of memory");
    if (st == IGRAD_OK)
        st = igrad__hier_ownership_weighted(layout, h->L, weight, IGRAD__HIER_BOUND_NUM,
                                            IGRAD__HIER_BOUND_DEN, owner, parts, &h->busiest);
    size_t np = 0;
    for (size_t t = 0; t < T && st == IGRAD_OK; t++) np += (size_t)parts[t];
    if (st == IGRAD_OK) {
        h->pieces = calloc(np ? np : 1, sizeof *h->pieces);
        h->npieces = np;
        if (!h->pieces)
            st = igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__,
                             "igrad_engine_create: out of memory");
    }
    for (size_t t = 0, p = 0; t < T && st == IGRAD_OK; t++) {
        igrad_tensor_info_t ti;
        igrad_layout_tensor(layout, t, &ti);
        h->first[t] = p;
        int64_t R = ti.ndim > 0 ? ti.shape[0] : 1, row = R > 0 ? ti.count / R : 0;
        for (int j = 0; j < parts[t]; j++, p++) {
            igrad__piece_t *pc = &h->pieces[p];
            pc->t = t;
            pc->owner = parts[t] == 1 ? owner[t] : j;
            pc->row0 = parts[t] == 1 ? 0 : piece_row0(R, parts[t], j);
            pc->rows = parts[t] == 1 ? R : piece_rows(R, parts[t], j);
            pc->off = pc->row0 * row;
            pc->n = parts[t] == 1 ? ti.count : pc->rows * row;
            pc->split = parts[t] > 1;
            pc->sub = next[pc->owner]++;
        }
    }
    if (st == IGRAD_OK) h->first[T] = np;
    free(owner);
    free(parts);
    free(next);
    return st;
}

/* The layout of local rank l's shard: its pieces in layout order (a whole
 * tensor as itself, a piece as its row range with the tensor's name). The
 * shard's components count the model's entries of every tensor they hold
 * a piece of or whole (the profile rows apply): a component's pieces and
 * whole tensors in the shard add up to the model's component only when
 * all its tensors are there, so each piece counts its whole tensor, and
 * the component's tensors held by other shards are added to its first
 * piece here. */
static igrad_status_t shard_layout(const igrad_layout_t *layout, const igrad__hier_t *h, int l,
                                   igrad_layout_t **out)
{
    IGRAD_CHECK(igrad__layout_create_like(layout, out)); /* with its name map */
    size_t C = igrad_layout_component_count(layout);
    int64_t *held = calloc(C ? C : 1, sizeof *held); /* model entries this shard counts */
    unsigned char *first = calloc(C ? C : 1, 1);
    igrad_status_t st = held && first ? IGRAD_OK
                                      : igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__,
                                                    "igrad_engine_create: out of memory");
    for (size_t p = 0; p < h->npieces && st == IGRAD_OK; p++) {
        const igrad__piece_t *pc = &h->pieces[p];
        if (pc->owner != l) continue;
        igrad_tensor_info_t ti;
        igrad_layout_tensor(layout, pc->t, &ti);
        if (ti.component >= 0) held[ti.component] += ti.count;
    }
    for (size_t p = 0; p < h->npieces && st == IGRAD_OK; p++) {
        const igrad__piece_t *pc = &h->pieces[p];
        if (pc->owner != l) continue;
        igrad_tensor_info_t ti;
        st = igrad_layout_tensor(layout, pc->t, &ti);
        if (st != IGRAD_OK) break;
        if (!pc->split) {
            st = igrad_layout_add(*out, ti.name, ti.dtype, ti.ndim, ti.shape);
            continue;
        }
        int64_t ce = ti.count;
        if (ti.component >= 0 && !first[ti.component]) {
            igrad_component_info_t ci;
            st = igrad_layout_component(layout, (size_t)ti.component, &ci);
            if (st != IGRAD_OK) break;
            ce += ci.count - held[ti.component];
            first[ti.component] = 1;
        }
        st = igrad__layout_add_rows(*out, ti.name, ti.dtype, ti.ndim, ti.shape, pc->row0, pc->rows,
                                    ce);
    }
    free(held);
    free(first);
    if (st != IGRAD_OK) {
        igrad_layout_free(*out);
        *out = NULL;
    }
    return st;
}

/* A shard engine's config: the sync is flat among the N owners (all on
 * different nodes: every byte it moves is inter-node). */
static igrad_config_t shard_config(const igrad_config_t *c)
{
    igrad_config_t s = *c;
    s.topology = IGRAD_TOPOLOGY_FLAT;
    s.ranks_per_node = 1;
    return s;
}

/* Each tensor's planned wire bytes per step, from a plan-only flat engine
 * of the whole layout over the N owners (the shard engines' config): a
 * tensor sent every step weighs its step bytes, a deferred one its
 * release bytes over the release period (it is sent once per period); at
 * least 1, so that an empty selection still counts. *out: (T), the
 * caller frees it. */
static igrad_status_t hier_weights(const igrad_layout_t *layout, const igrad_profile_t *profile,
                                   const igrad_config_t *sc, int N, int64_t **out)
{
    *out = NULL;
    size_t T = igrad_layout_count(layout);
    igrad_engine_t *whole = NULL;
    IGRAD_CHECK(igrad__flat_create_shard_plan(layout, profile, sc, N, &whole));
    int64_t *weight = calloc(T ? T : 1, sizeof *weight);
    igrad_status_t st = weight ? IGRAD_OK
                               : igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__,
                                             "igrad_engine_create: out of memory");
    const int R = sc->release_period > 0 ? sc->release_period : 1;
    for (size_t t = 0; t < T && st == IGRAD_OK; t++) {
        igrad_tensor_plan_t tp;
        st = igrad__flat_tensor_plan(whole, t, &tp);
        if (st != IGRAD_OK) break;
        int64_t b = tp.every_step ? tp.step_nbytes : (tp.release_nbytes + R - 1) / R;
        weight[t] = b > 0 ? b : 1;
    }
    igrad_engine_free(whole);
    if (st != IGRAD_OK) {
        free(weight);
        return st;
    }
    *out = weight;
    return IGRAD_OK;
}

/* Everything both kinds of engine share: owners, indices, the L plan-only
 * shard engines (for N ranks). */
static igrad_status_t hier_plans(igrad__hier_t *h, const igrad_layout_t *layout,
                                 const igrad_profile_t *profile, const igrad_config_t *config)
{
    h->plans = calloc((size_t)h->L, sizeof *h->plans);
    IGRAD_FAIL_IF(!h->plans, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    igrad_config_t sc = shard_config(config);
    int64_t *weight = NULL;
    IGRAD_CHECK(hier_weights(layout, profile, &sc, h->N, &weight));
    igrad_status_t made = make_pieces(h, layout, weight);
    free(weight);
    IGRAD_CHECK(made);
    for (int l = 0; l < h->L; l++) {
        igrad_layout_t *sl = NULL;
        IGRAD_CHECK(shard_layout(layout, h, l, &sl));
        igrad_status_t st = igrad__flat_create_shard_plan(sl, profile, &sc, h->N, &h->plans[l]);
        igrad_layout_free(sl);
        IGRAD_CHECK(st);
    }
    return IGRAD_OK;
}

static void hier_free(igrad__hier_t *h)
{
    if (!h) return;
    igrad_engine_free(h->inner);
    if (h->plans)
        for (int l = 0; l < h->L; l++) igrad_engine_free(h->plans[l]);
    free(h->plans);
    igrad_comm_free(h->inter_comm);
    igrad_comm_free(h->node_comm);
    free(h->pieces);
    free(h->first);
    free(h->own);
    if (h->dp) h->dp->free(h->shard_mem);
    free(h->shard);
    free(h->reqs);
    free(h->status_buf);
    free(h->link.buf);
    free((void *)h->link.full);
    free(h->loads);
    free(h);
}

/* The engine the caller holds: plan-only over the whole layout for P ranks
 * (no data-plane memory), with its hier part. */
static igrad_status_t top_build(igrad_engine_t **out, const igrad_layout_t *layout,
                                const igrad_profile_t *profile, const igrad_config_t *config,
                                int P)
{
    igrad_engine_t *e = igrad__engine_alloc(&igrad__engine_hier);
    IGRAD_FAIL_IF(!e, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    *out = e;
    e->plan.plan_only = 1;
    e->plan.nranks = P;
    IGRAD_CHECK(igrad__engine_build(e, layout, profile, config, NULL));
    IGRAD_FAIL_IF(config->profile_steps > 0, IGRAD_E_UNSUPPORTED,
                  "igrad_engine_create: config.topology hier needs its profile at create "
                  "(config.profile_steps is %lld; profile first with a flat engine)",
                  (long long)config->profile_steps);
    int L = config->ranks_per_node;
    IGRAD_FAIL_IF(L > 0 && P % L != 0, IGRAD_E_INVALID,
                  "igrad_engine_create: config.ranks_per_node is %d, but there are %d ranks "
                  "(not a multiple)",
                  L, P);
    e->hier = calloc(1, sizeof *e->hier);
    IGRAD_FAIL_IF(!e->hier, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    return IGRAD_OK;
}

/* ---- the world's verdicts -------------------------------------------------- */

/* Every rank of the world returns the same status: the lowest failing
 * rank's, whose own message it keeps; the others get "<context> failed on
 * rank R (<status>); every rank fails it". */
static igrad_status_t world_verdict(igrad_engine_t *e, igrad_status_t st, const char *context)
{
    igrad__hier_t *h = e->hier;
    char msg[1024] = "";
    if (st != IGRAD_OK) snprintf(msg, sizeof msg, "%s", igrad_last_error());
    uint64_t mine = (uint64_t)st;
    igrad_status_t xs = igrad_comm_allgather(e->comm, &mine, sizeof mine, h->status_buf);
    if (xs != IGRAD_OK) return igrad__engine_break(e, xs);
    for (int r = 0; r < e->plan.nranks; r++) {
        igrad_status_t s = (igrad_status_t)h->status_buf[r];
        if (s == IGRAD_OK) continue;
        xs = igrad__engine_peer_word(context, r, h->status_buf[r]);
        if (xs != IGRAD_OK) return igrad__engine_break(e, xs);
        if (r == e->plan.rank) return igrad__fail(s, __FILE__, __LINE__, "%s", msg);
        return igrad__fail(s, __FILE__, __LINE__, "%s failed on rank %d (%s); every rank fails it",
                           context, r, igrad_status_str(s));
    }
    return IGRAD_OK;
}

/* The world's verdict on a shard engine's step agreement (its after_agree
 * hook): `st`/`bad` this rank's own result, `ag` the shard's agreed one;
 * every rank of the world returns the same status. */
static igrad_status_t agree_world(igrad_engine_t *shard, int64_t step, igrad_status_t st,
                                       int64_t bad, igrad_status_t ag)
{
    igrad__world_link_t *w = igrad__flat_world(shard);
    char msg[1024] = "";
    if (ag != IGRAD_OK) snprintf(msg, sizeof msg, "%s", igrad_last_error());
    int P = igrad_comm_size(w->comm), me = igrad_comm_rank(w->comm);
    uint64_t mine[3] = {(uint64_t)st, bad >= 0 ? (uint64_t)w->full[bad] : UINT64_MAX,
                        (uint64_t)ag};
    igrad_status_t xs = igrad_comm_allgather(w->comm, mine, sizeof mine, w->buf);
    if (xs != IGRAD_OK) return igrad__engine_break(shard, xs);
    /* a rank's own failure first (the cause), then a shard's verdict */
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < P; r++) {
            igrad_status_t s = (igrad_status_t)w->buf[3 * r + (pass ? 2 : 0)];
            if (s == IGRAD_OK) continue;
            char what[64];
            snprintf(what, sizeof what, "step %lld: the world's verdict", (long long)step);
            xs = igrad__engine_peer_word(what, r, w->buf[3 * r + (pass ? 2 : 0)]);
            if (xs != IGRAD_OK) return igrad__engine_break(shard, xs);
            if (r == me || (pass == 1 && ag != IGRAD_OK))
                return igrad__fail(s, __FILE__, __LINE__, "%s", msg); /* its own message */
            uint64_t t = w->buf[3 * r + 1];
            char where[300] = "";
            if (pass == 0 && t < w->top->plan.ntensors)
                snprintf(where, sizeof where, " at tensor %s", w->top->plan.t[t].name);
            return igrad__fail(s, __FILE__, __LINE__,
                               "step %lld failed on rank %d (%s)%s; every rank fails it",
                               (long long)step, r, igrad_status_str(s), where);
        }
    return IGRAD_OK;
}

/* ---- create ---------------------------------------------------------------- */

/* After the world agreed on layout, profile and config: the node and
 * inter-node comms, the node shape (checked on every rank), the shard
 * engine and its buffers. Collective over the world. */
static igrad_status_t hier_connect(igrad_engine_t *e, const igrad_layout_t *layout,
                                   const igrad_profile_t *profile)
{
    igrad__hier_t *h = e->hier;
    int P = e->plan.nranks, rank = e->plan.rank, L = e->plan.cfg.ranks_per_node;
    igrad_status_t st;
    if (L > 0) st = igrad__comm_split(e->comm, rank / L, rank, &h->node_comm);
    else st = igrad__comm_split(e->comm, IGRAD__SPLIT_NODE, rank, &h->node_comm);
    IGRAD_CHECK(st); /* same on every rank: the comm kind was agreed */
    h->local = igrad_comm_rank(h->node_comm);
    h->L = igrad_comm_size(h->node_comm);
    IGRAD_CHECK(igrad__comm_split(e->comm, h->local, rank, &h->inter_comm));
    h->node = igrad_comm_rank(h->inter_comm);
    h->N = igrad_comm_size(h->inter_comm);
    int64_t mine[2] = {h->L, h->N}, *all = calloc((size_t)P * 2, sizeof *all);
    IGRAD_FAIL_IF(!all, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    st = igrad_comm_allgather(e->comm, mine, sizeof mine, all);
    for (int r = 0; r < P && st == IGRAD_OK; r++)
        if (all[2 * r] != h->L || all[2 * r] * all[2 * r + 1] != P)
            st = igrad__fail(IGRAD_E_UNSUPPORTED, __FILE__, __LINE__,
                             "igrad_engine_create: config.topology hier needs nodes of equal "
                             "size: rank %d's node has %lld ranks, rank %d's %lld (%d ranks in "
                             "all); set config.ranks_per_node",
                             rank, (long long)h->L, r, (long long)all[2 * r], P);
    free(all);
    IGRAD_CHECK(st);
    e->plan.node_ranks = h->L;
    IGRAD_CHECK(hier_plans(h, layout, profile, &e->plan.cfg));

    size_t NP = h->npieces;
    int64_t n = 0;
    for (size_t p = 0; p < NP; p++)
        if (h->pieces[p].owner == h->local) {
            h->nown++;
            n += h->pieces[p].n;
        }
    h->own = calloc(h->nown ? h->nown : 1, sizeof *h->own);
    h->shard = calloc(h->nown ? h->nown : 1, sizeof *h->shard);
    h->own_entries = n;
    h->shard_mem = h->dp->alloc((size_t)n * sizeof *h->shard_mem, 0);
    h->reqs = calloc(NP ? NP : 1, sizeof *h->reqs);
    size_t *full = calloc(h->nown ? h->nown : 1, sizeof *full);
    h->link.full = full;
    h->link.buf = calloc((size_t)P * 3, sizeof *h->link.buf);
    IGRAD_FAIL_IF(!h->own || !h->shard || !h->shard_mem || !h->reqs || !full || !h->link.buf,
                  IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    int64_t off = 0;
    for (size_t p = 0, k = 0; p < NP; p++) {
        if (h->pieces[p].owner != h->local) continue;
        h->own[k] = p;
        full[k] = h->pieces[p].t;
        h->shard[k++] = h->shard_mem + off;
        off += h->pieces[p].n;
    }
    h->link.comm = e->comm;
    h->link.top = e;
    return IGRAD_OK;
}

igrad_status_t igrad__hier_create(const igrad_layout_t *layout, const igrad_profile_t *profile,
                                  const igrad_config_t *config, igrad_comm_t *comm,
                                  const igrad__dp_ops_t *dp, void *stream,
                                  igrad_engine_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_engine_create: out is NULL");
    *out = NULL;
    IGRAD_FAIL_IF(!comm, IGRAD_E_INVALID, "igrad_engine_create: comm is NULL");
    int P = igrad_comm_size(comm);
    uint64_t *abuf = calloc((size_t)P * IGRAD__AGREE_WORDS, sizeof *abuf);
    uint64_t *sbuf = calloc((size_t)P, sizeof *sbuf);
    if (!abuf || !sbuf) {
        free(abuf);
        free(sbuf);
        return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "igrad_engine_create: out of memory");
    }
    igrad_engine_t *e = NULL;
    igrad_status_t st = top_build(&e, layout, profile, config, P);
    if (st == IGRAD_OK) {
        e->hier->dp = dp;
        e->hier->stream = stream;
    }
    if (st == IGRAD_OK && !igrad__comm_can_split(comm))
        st = igrad__fail(IGRAD_E_UNSUPPORTED, __FILE__, __LINE__,
                         "igrad_engine_create: config.topology hier needs a communicator that "
                         "can be split into nodes (MPI, NCCL, self, self_cuda, or custom with "
                         "split, ireduce and ibcast); '%s' cannot",
                         igrad_comm_backend(comm));
    char msg[1024] = "";
    if (st != IGRAD_OK) snprintf(msg, sizeof msg, "%s", igrad_last_error());
    /* The world's agreement first, in the very exchange a flat engine's
     * create makes: a rank with another topology fails it by name
     * (config.topology differs) instead of waiting in a node collective. */
    double saved = igrad_comm_timeout(comm);
    if (config && config->size >= sizeof *config) igrad_comm_set_timeout(comm, config->timeout_s);
    igrad_status_t ag = igrad__engine_agree(st == IGRAD_OK ? e : NULL, comm, P, abuf, st, -1,
                                            msg, st == IGRAD_OK ? e->items : NULL, 1,
                                            "engine create");
    if (ag != IGRAD_OK) {
        igrad_comm_set_timeout(comm, saved);
        igrad_engine_free(e);
        if (ag != IGRAD_E_TIMEOUT) free(abuf);
        free(sbuf);
        return ag;
    }
    e->comm = comm;
    e->plan.rank = igrad_comm_rank(comm);
    e->agree_buf = abuf;
    e->hier->status_buf = sbuf;
    st = hier_connect(e, layout, profile);
    if (st == IGRAD_OK) st = world_verdict(e, IGRAD_OK, "engine create");
    else world_verdict(e, st, "engine create");
    if (st == IGRAD_OK) {
        /* the shard engine: its own agreement among the N owners, then the
         * world's verdict (a shard that failed fails every rank) */
        igrad__hier_t *h = e->hier;
        igrad_layout_t *sl = NULL;
        igrad_config_t sc = shard_config(&e->plan.cfg);
        igrad_status_t ls = shard_layout(layout, h, h->local, &sl);
        if (ls == IGRAD_OK)
            ls = igrad__engine_create_shard(sl, profile, &sc, h->inter_comm, P, dp, stream,
                                            &h->inner);
        igrad_layout_free(sl);
        if (ls == IGRAD_OK) igrad__engine_link_world(h->inner, agree_world, &h->link);
        if (ls == IGRAD_OK) ls = igrad__flat_prepare(h->inner);
        st = world_verdict(e, ls, "engine create");
    }
    igrad_comm_set_timeout(comm, saved);
    if (st != IGRAD_OK) {
        igrad_engine_free(e);
        return st;
    }
    e->stats.step = -1;
    *out = e;
    return IGRAD_OK;
}

igrad_status_t igrad__hier_create_plan(const igrad_layout_t *layout,
                                       const igrad_profile_t *profile,
                                       const igrad_config_t *config, int nranks,
                                       igrad_engine_t **out)
{
    IGRAD_FAIL_IF(config->ranks_per_node < 1, IGRAD_E_INVALID,
                  "igrad_engine_create_plan: config.topology hier needs config.ranks_per_node "
                  "(a plan has no MPI to ask)");
    IGRAD_FAIL_IF(config->start_iter > 0, IGRAD_E_INVALID,
                  "igrad_engine_create_plan: config.start_iter is %lld: the dense warm-up "
                  "is not planned (plan method dense for those steps, start_iter 0)",
                  (long long)config->start_iter);
    igrad_engine_t *e = NULL;
    igrad_status_t st = top_build(&e, layout, profile, config, nranks);
    if (st == IGRAD_OK) {
        e->hier->L = config->ranks_per_node;
        e->hier->N = nranks / config->ranks_per_node;
        e->plan.node_ranks = e->hier->L;
        st = hier_plans(e->hier, layout, profile, config);
    }
    if (st != IGRAD_OK) {
        igrad_engine_free(e);
        return st;
    }
    igrad__engine_plan_only_done(e, out);
    return IGRAD_OK;
}

/* ---- a step ---------------------------------------------------------------- */

/* Completes the node collectives issued so far (all of them, also after a
 * failure: their buffers must not be reused while in flight). */
static igrad_status_t wait_all(igrad__hier_t *h, size_t n, igrad_status_t st)
{
    for (size_t t = 0; t < n; t++) {
        igrad_status_t w = igrad_comm_wait(h->node_comm, h->reqs[t]);
        h->reqs[t] = NULL;
        if (st == IGRAD_OK) st = w;
    }
    return st;
}

/* Intra-node bytes per rank of a step: the node sum and the broadcast of
 * every parameter, each modelled as (L-1)/L of 4 bytes per parameter
 * (what a reduce-scatter and an all-gather of the whole gradient move). */
static double intra_nbytes(const igrad_engine_t *e)
{
    int L = e->hier->L;
    return 2.0 * (double)(L - 1) / (double)L * 4.0 * (double)e->plan.nparams;
}

/* Per piece (a whole tensor, or rows of a split one: contiguous in the
 * gradient): the node's sum onto the piece's owner. The node collectives
 * of a step are one group (NCCL: launched together at its end), on the
 * shard engine's stream, in the data plane's memory. */
static igrad_status_t node_reduce(igrad_engine_t *e, float *const *grads)
{
    igrad__hier_t *h = e->hier;
    void *stream = h->stream;
    igrad_status_t st = igrad__comm_group_start(h->node_comm);
    size_t p = 0;
    for (size_t k = 0; p < h->npieces && st == IGRAD_OK; p++) {
        const igrad__piece_t *pc = &h->pieces[p];
        float *dst = pc->owner == h->local ? h->shard[k++] : NULL;
        st = igrad__comm_ireduce(h->node_comm, grads[pc->t] + pc->off, dst, (size_t)pc->n,
                                 IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM, pc->owner, h->dp->space,
                                 stream, &h->reqs[p]);
    }
    igrad_status_t ge = igrad__comm_group_end(h->node_comm);
    return wait_all(h, p, st != IGRAD_OK ? st : ge);
}

static igrad_status_t node_bcast(igrad_engine_t *e, float *const *grads)
{
    igrad__hier_t *h = e->hier;
    void *stream = h->stream;
    igrad_status_t st = igrad__comm_group_start(h->node_comm);
    size_t p = 0;
    for (size_t k = 0; p < h->npieces && st == IGRAD_OK; p++) {
        const igrad__piece_t *pc = &h->pieces[p];
        float *buf = pc->owner == h->local ? h->shard[k++] : grads[pc->t] + pc->off;
        st = igrad__comm_ibcast(h->node_comm, buf, (size_t)pc->n * sizeof(float), pc->owner,
                                h->dp->space, stream, &h->reqs[p]);
    }
    igrad_status_t ge = igrad__comm_group_end(h->node_comm);
    st = wait_all(h, p, st != IGRAD_OK ? st : ge);
    for (size_t k = 0; k < h->nown && st == IGRAD_OK; k++) {
        const igrad__piece_t *pc = &h->pieces[h->own[k]];
        st = igrad__flat_copy(h->inner, grads[pc->t] + pc->off, h->shard[k],
                              (size_t)pc->n * sizeof(float));
    }
    return st;
}

/* The shard's statistics as the node's rank reports them. */
static void hier_stats(igrad_engine_t *e, double t0, double intra_ms)
{
    igrad__hier_t *h = e->hier;
    igrad_step_stats_t s;
    igrad_engine_last_stats(h->inner, &s);
    s.inter_wire_nbytes = s.wire_nbytes;
    s.intra_wire_nbytes = s.skipped ? 0.0 : intra_nbytes(e);
    s.wire_nbytes = s.inter_wire_nbytes + s.intra_wire_nbytes;
    s.comm_ms += intra_ms;
    s.dataplane_nbytes += h->own_entries * (int64_t)sizeof(float); /* the shard buffer */
    s.dataplane_nbytes_per_param = (double)s.dataplane_nbytes / (double)e->plan.nparams;
    s.total_ms = igrad__now_ms() - t0;
    e->stats = s;
}

static igrad_status_t hier_sync(igrad_engine_t *e, int64_t step, float *const *grads)
{
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_sync"));
    igrad__hier_t *h = e->hier;
    double t0 = igrad__engine_step_reset(e, step);
    double saved_w = igrad_comm_timeout(e->comm), saved_n = igrad_comm_timeout(h->node_comm);
    igrad_comm_set_timeout(e->comm, e->plan.cfg.timeout_s);
    igrad_comm_set_timeout(h->node_comm, e->plan.cfg.timeout_s);

    int64_t bad = -1;
    igrad_status_t st = IGRAD_OK;
    if (!grads)
        st = igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__, "igrad_engine_sync: grads is NULL");
    else st = igrad__engine_null_grads(e, step, grads, &bad);
    /* the world agrees before any node collective reads a pointer */
    igrad_status_t ag = igrad__engine_agree_step(e, step, st, bad);
    double t1 = igrad__now_ms();
    if (ag != IGRAD_OK) {
        e->stats.skipped = 1;
        e->stats.comm_ms = t1 - t0;
        e->stats.total_ms = t1 - t0;
        st = ag;
        goto done;
    }
    st = node_reduce(e, grads);
    double t2 = igrad__now_ms();
    if (st != IGRAD_OK) {
        st = igrad__engine_break(e, st);
        goto done;
    }
    st = igrad_engine_sync(h->inner, step, h->shard);
    double t3 = igrad__now_ms();
    if (st == IGRAD_OK) st = node_bcast(e, grads);
    if (st != IGRAD_OK && (igrad__flat_failure(h->inner, NULL) != IGRAD_OK ||
                           st == IGRAD_E_COMM || st == IGRAD_E_TIMEOUT)) {
        /* after the ranks agreed: out of step with the others */
        st = igrad__engine_break(e, st);
        goto done;
    }
    double t4 = igrad__now_ms();
    hier_stats(e, t0, (t2 - t0) + (t4 - t3)); /* the node's collectives */
    double *w = e->stats.comm_window_ms; /* [0], [1]: the shard's, from its engine */
    w[2] = t1, w[3] = t2, w[4] = t3, w[5] = t4;
    if (st == IGRAD_OK) e->last_step = step;
done:
    igrad_comm_set_timeout(e->comm, saved_w);
    igrad_comm_set_timeout(h->node_comm, saved_n);
    return st;
}

/* ---- accessors, state, plans ---------------------------------------------- */

/* A split tensor: the plan of its first piece (rows from 0, local rank
 * 0's); no rank holds its residual whole (NULL). */
static const igrad_engine_t *owner_of(const igrad_engine_t *e, size_t t, int real, size_t *sub)
{
    const igrad__hier_t *h = e->hier;
    const igrad__piece_t *pc = &h->pieces[h->first[t]];
    *sub = pc->sub;
    if (!real) return h->plans[pc->owner];
    return h->inner && !pc->split && pc->owner == h->local ? h->inner : NULL;
}

static size_t hier_workspace_nbytes(const igrad_engine_t *e)
{
    const igrad__hier_t *h = e->hier;
    size_t n = sizeof *e + sizeof *h + h->npieces * (sizeof *h->pieces + sizeof *h->reqs) +
               (e->plan.ntensors + 1) * sizeof *h->first;
    n += igrad_engine_workspace_nbytes(h->inner);
    for (int l = 0; l < h->L && h->plans; l++) n += igrad_engine_workspace_nbytes(h->plans[l]);
    return n + (size_t)h->own_entries * sizeof(float);
}

static igrad_status_t hier_save_state(const igrad_engine_t *e, const char *path)
{
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_save_state"));
    return igrad_engine_save_state(e->hier->inner, path);
}

/* Collective: the shard's own load (agreed among the N owners of the
 * shard), then the world's verdict and its step. */
static igrad_status_t hier_load_state(igrad_engine_t *e, const char *path)
{
    IGRAD_CHECK(igrad__engine_usable(e, "igrad_engine_load_state"));
    igrad__hier_t *h = e->hier;
    double saved = igrad_comm_timeout(e->comm);
    igrad_comm_set_timeout(e->comm, e->plan.cfg.timeout_s);
    igrad_status_t st = igrad_engine_load_state(h->inner, path);
    if (st == IGRAD_E_MISMATCH || st == IGRAD_E_FORMAT) /* another topology's file? */
        st = igrad__engine_state_topology(path, e->plan.nranks, h->L, h->N, st);
    if (st != IGRAD_OK && igrad__flat_failure(h->inner, NULL) != IGRAD_OK) {
        igrad_comm_set_timeout(e->comm, saved);
        return igrad__engine_break(e, st);
    }
    st = world_verdict(e, st, "load state");
    if (st == IGRAD_OK) {
        /* the world's step: the same on every rank, or a named mismatch */
        igrad__flat_progress(h->inner, &e->last_step, &e->calls);
        int64_t mine[2] = {e->last_step, e->calls};
        int64_t *all = calloc((size_t)e->plan.nranks * 2, sizeof *all);
        st = all ? igrad_comm_allgather(e->comm, mine, sizeof mine, all)
                 : igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "load state: out of memory");
        for (int r = 0; r < e->plan.nranks && st == IGRAD_OK; r++)
            if (all[2 * r] != mine[0] || all[2 * r + 1] != mine[1])
                st = igrad__fail(IGRAD_E_MISMATCH, __FILE__, __LINE__,
                                 "load state: the files are of different steps: rank %d's "
                                 "is at step %lld (%lld calls), rank %d's at %lld (%lld)",
                                 e->plan.rank, (long long)mine[0], (long long)mine[1], r,
                                 (long long)all[2 * r], (long long)all[2 * r + 1]);
        free(all);
        if (st != IGRAD_OK) st = igrad__engine_break(e, st);
    }
    igrad_comm_set_timeout(e->comm, saved);
    return st;
}

/* A planned step of every shard: the buckets of all L shards (local rank
 * l's first, then l + 1's); payload and inter-node bytes of the busiest
 * shard (the rank that bounds the step; each rank's own are its shard's
 * buckets), intra-node bytes per rank, counts as the node's totals. */
static igrad_status_t hier_plan_step(igrad_engine_t *e, int64_t step,
                                     igrad_step_stats_t *stats, igrad_planned_bucket_t *buckets,
                                     size_t capacity, size_t *nbuckets)
{
    igrad__hier_t *h = e->hier;
    int nload = 0;
    for (int l = 0; l < h->L; l++) nload += igrad__flat_bucket_slots(h->plans[l]);
    if (!h->loads) {
        h->loads = calloc((size_t)(nload > 0 ? nload : 1), sizeof *h->loads);
        IGRAD_FAIL_IF(!h->loads, IGRAD_E_NOMEM, "igrad_engine_plan_step: out of memory");
    }
    igrad_step_stats_t tot, ps;
    memset(&tot, 0, sizeof tot);
    size_t nb = 0;
    int nl = 0;
    for (int l = 0; l < h->L; l++) {
        size_t pn = 0;
        IGRAD_CHECK(igrad_engine_plan_step(h->plans[l], step, &ps,
                                           capacity > nb ? buckets + nb : NULL,
                                           capacity > nb ? capacity - nb : 0, &pn));
        for (size_t j = nb; j < nb + pn && j < capacity; j++) buckets[j].local_rank = l;
        nb += pn;
        memcpy(h->loads + nl, ps.bucket_loads, (size_t)ps.bucket_count * sizeof *h->loads);
        nl += ps.bucket_count;
        tot.tensors_sent += ps.tensors_sent;
        tot.entries_sent += ps.entries_sent;
        tot.deferred_components += ps.deferred_components;
        tot.released_components += ps.released_components;
        tot.buckets += ps.buckets;
        tot.gather_buckets += ps.gather_buckets;
        tot.reduce_buckets += ps.reduce_buckets;
        tot.sparse_reduce_buckets += ps.sparse_reduce_buckets;
        if (ps.payload_nbytes > tot.payload_nbytes) tot.payload_nbytes = ps.payload_nbytes;
        if (ps.wire_nbytes > tot.inter_wire_nbytes) tot.inter_wire_nbytes = ps.wire_nbytes;
    }
    tot.step = step;
    tot.intra_wire_nbytes = intra_nbytes(e);
    tot.wire_nbytes = tot.inter_wire_nbytes + tot.intra_wire_nbytes;
    tot.bucket_count = nl;
    tot.bucket_loads = h->loads;
    if (nl > 0) {
        igrad_pack_metrics_t pm;
        IGRAD_CHECK(igrad__pack_metrics(h->loads, nl, &pm));
        tot.imbalance = pm.imbalance;
        tot.cv = pm.cv;
        tot.overflow = pm.overflow;
    } else {
        tot.imbalance = 1.0;
    }
    *stats = tot;
    *nbuckets = nb;
    return IGRAD_OK;
}

/* ---- the hier row of the engine table --------------------------------------- */

/* The shard engine that holds tensor t (this rank's for a real engine, NULL
 * when another rank of the node owns t; a plan-only one: the owner's plan),
 * asked through the public API. */
static igrad_status_t hier_tensor_plan(const igrad_engine_t *e, size_t t,
                                       igrad_tensor_plan_t *out)
{
    size_t sub = 0;
    const igrad_engine_t *owner = owner_of(e, t, 0, &sub);
    return igrad_engine_tensor_plan(owner, sub, out);
}

static const float *hier_residual(const igrad_engine_t *e, size_t t)
{
    size_t sub = 0;
    const igrad_engine_t *owner = owner_of(e, t, 1, &sub);
    return igrad_engine_residual(owner, sub);
}

static const float *hier_velocity(const igrad_engine_t *e, size_t t)
{
    size_t sub = 0;
    const igrad_engine_t *owner = owner_of(e, t, 1, &sub);
    return igrad_engine_velocity(owner, sub);
}

/* This rank's shard's. */
static int64_t hier_predict_payload(const igrad_engine_t *e, int64_t step)
{
    size_t sub = 0;
    const igrad_engine_t *own = NULL;
    for (size_t t = 0; t < e->plan.ntensors && !own; t++) own = owner_of(e, t, 1, &sub);
    return own ? igrad_engine_predict_payload(own, step) : -1;
}

/* The shards and comms, then the engine the caller holds (a flat plan-only
 * engine of the whole layout) as the flat row frees it. */
static void hier_engine_free(igrad_engine_t *e)
{
    hier_free(e->hier);
    e->hier = NULL;
    igrad__engine_flat.free(e);
}

static igrad_status_t hier_begin(igrad_engine_t *e, int64_t step, float *const *grads,
                                 const igrad_bucket_t **buckets, size_t *nbuckets)
{
    (void)e, (void)step, (void)grads, (void)buckets, (void)nbuckets;
    return refuse("igrad_engine_begin");
}

static igrad_status_t hier_end(igrad_engine_t *e, int64_t step, float *const *grads)
{
    (void)e, (void)step, (void)grads;
    return refuse("igrad_engine_end");
}

static igrad_status_t hier_open(igrad_engine_t *e, int64_t step)
{
    (void)e, (void)step;
    return refuse("igrad_engine_open");
}

static igrad_status_t hier_ready(igrad_engine_t *e, int64_t step, const size_t *tensors,
                                 size_t n, float *const *grads, const igrad_bucket_t **buckets,
                                 size_t *nbuckets)
{
    (void)e, (void)step, (void)tensors, (void)n, (void)grads, (void)buckets, (void)nbuckets;
    return refuse("igrad_engine_ready");
}

static igrad_status_t hier_close(igrad_engine_t *e, int64_t step)
{
    (void)e, (void)step;
    return refuse("igrad_engine_close");
}

static igrad_status_t hier_set_profile(igrad_engine_t *e, const igrad_profile_t *profile)
{
    (void)e, (void)profile;
    return refuse("igrad_engine_set_profile");
}

static igrad_status_t hier_set_trace(igrad_engine_t *e, igrad_trace_t *trace)
{
    (void)e, (void)trace;
    return refuse("igrad_engine_set_trace");
}

/* Forwarded to this rank's shard engine (none in a plan-only engine: its
 * data plane is "none"); the node collectives take the same queue. */
static igrad_status_t hier_set_stream(igrad_engine_t *e, const igrad__dp_ops_t *dp, void *stream)
{
    igrad__hier_t *h = e->hier;
    IGRAD_FAIL_IF(!h->inner, IGRAD_E_INVALID,
                  "igrad_engine_set_stream_%s: the engine's data plane is 'none', not %s "
                  "(made by igrad_engine_create, not igrad_engine_create_%s)",
                  dp->name, dp->name, dp->name);
    IGRAD_CHECK(igrad__flat_set_stream(h->inner, dp, stream));
    h->stream = stream;
    return IGRAD_OK;
}

const igrad__engine_ops_t igrad__engine_hier = {
    .name = "hier",
    .free = hier_engine_free,
    .sync = hier_sync,
    .begin = hier_begin,
    .end = hier_end,
    .open = hier_open,
    .ready = hier_ready,
    .close = hier_close,
    .save_state = hier_save_state,
    .load_state = hier_load_state,
    .set_profile = hier_set_profile,
    .set_trace = hier_set_trace,
    .plan_step = hier_plan_step,
    .tensor_plan = hier_tensor_plan,
    .residual = hier_residual,
    .velocity = hier_velocity,
    .predict_payload = hier_predict_payload,
    .workspace_nbytes = hier_workspace_nbytes,
    .set_stream = hier_set_stream,
};

/* For tests (tests/mpi_hier.c): piece p of a two-level engine (real or
 * plan-only) in layout order: its tensor, rows and owner, its planned
 * sparsification (its owner's shard plan), and its residual when this
 * rank's shard holds it (NULL otherwise). 0 past the last piece. */
int igrad__hier_piece(const igrad_engine_t *e, size_t p, size_t *t, int64_t *row0, int64_t *rows,
                      int *owner, igrad_tensor_plan_t *plan, const float **residual);

int igrad__hier_piece(const igrad_engine_t *e, size_t p, size_t *t, int64_t *row0, int64_t *rows,
                      int *owner, igrad_tensor_plan_t *plan, const float **residual)
{
    const igrad__hier_t *h = e && e->hier ? e->hier : NULL;
    if (!h || p >= h->npieces) return 0;
    const igrad__piece_t *pc = &h->pieces[p];
    *t = pc->t;
    *row0 = pc->row0;
    *rows = pc->rows;
    *owner = pc->owner;
    if (igrad_engine_tensor_plan(h->plans[pc->owner], pc->sub, plan) != IGRAD_OK) return 0;
    *residual = h->inner && pc->owner == h->local ? igrad_engine_residual(h->inner, pc->sub)
                                                  : NULL;
    return 1;
}
