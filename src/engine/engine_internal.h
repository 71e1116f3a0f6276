/*
 * engine_internal.h — what the engine's files (engine.c: create and
 * step; engine_agree.c: agreement; engine_state.c: save/load of a rank's
 * state; engine_stream.c, engine_online.c, engine_hier.c) share: the
 * engine, made of its plan (plan/plan.h), step (plan/step.h) and
 * data-plane memory (dp/dp.h) parts plus what only the engine keeps, and
 * the agreement items, the fixed list of values every rank
 * must have in common (layout, profile, config fields, plan), which the
 * cross-rank check and the state file both compare one by one so that a
 * difference is reported by name.
 *
 * Not here: the public API (igrad.h "Sync engine"), the schedule
 * (schedule.h) and the packing policies (pack.h).
 */
#ifndef IGRAD_ENGINE_INTERNAL_H
#define IGRAD_ENGINE_INTERNAL_H

#include "core/internal.h"
#include "dp/dp.h"
#include "plan/pack.h"
#include "plan/plan.h"
#include "plan/step.h"

/* ---- agreement items ---------------------------------------------------- */

/* How an item's 64-bit value is shown in a message. */
typedef enum igrad__item_type {
    IGRAD__ITEM_I64,       /* signed integer */
    IGRAD__ITEM_F64,       /* double, bit pattern */
    IGRAD__ITEM_HASH,      /* 64-bit hash, hex */
    IGRAD__ITEM_METHOD,    /* igrad_method_t */
    IGRAD__ITEM_SPARSIFIER,
    IGRAD__ITEM_SCHEDULE,
    IGRAD__ITEM_RESIDUAL,
    IGRAD__ITEM_PACK,
    IGRAD__ITEM_DTYPE,
    IGRAD__ITEM_COLLECTIVE,
    IGRAD__ITEM_TOPOLOGY,
    IGRAD__ITEM_INDEX_CODE
} igrad__item_type_t;

/* Item indices, in the order a mismatch is looked for: the first differing
 * item is the one reported, so the layout comes before what depends on it. */
enum {
    IGRAD__ITEM_VERSION,
    IGRAD__ITEM_TENSORS,    /* layout tensor count */
    IGRAD__ITEM_LAYOUT,     /* layout hash (detail: per-tensor hashes) */
    IGRAD__ITEM_COMPONENTS, /* layout component count */
    IGRAD__ITEM_PROFILE,    /* hash of the important set (detail: per component) */
    IGRAD__ITEM_CFG_METHOD,
    IGRAD__ITEM_CFG_SPARSIFIER,
    IGRAD__ITEM_CFG_INTERLEAVE,
    IGRAD__ITEM_CFG_DENSITY,
    IGRAD__ITEM_CFG_RELEASE_PERIOD,
    IGRAD__ITEM_CFG_RELEASE_KEEP,
    IGRAD__ITEM_CFG_SCHEDULE,
    IGRAD__ITEM_CFG_RESIDUAL,
    IGRAD__ITEM_CFG_PACK,
    IGRAD__ITEM_CFG_BUCKETS,
    IGRAD__ITEM_CFG_BLOCK_ENTRIES,
    IGRAD__ITEM_CFG_VERIFY_EVERY, /* ranks only: results do not depend on it */
    IGRAD__ITEM_CFG_VALUE_DTYPE,
    IGRAD__ITEM_CFG_INDEX_DTYPE,
    IGRAD__ITEM_CFG_COLLECTIVE,
    IGRAD__ITEM_CFG_TIMEOUT,      /* ranks only: a stopped rank must not outwait
                                     the others' limit */
    IGRAD__ITEM_PLAN,       /* phases, budgets, block cuts, direct map */
    /* The dynamic items: compared at every exchange, not only every
     * verify_every calls, since ranks out of step would otherwise unpack
     * each other's buckets with the wrong plan. */
    IGRAD__ITEM_STEP,       /* step of the call (ranks only) */
    IGRAD__ITEM_CALLS,      /* begin calls so far */
    IGRAD__ITEM_HISTORY,    /* risk policy's size history */
    /* Appended later (so earlier items keep their numbers in the state
     * file); static, but after FIRST_DYNAMIC they are compared at every
     * exchange, which costs nothing. */
    IGRAD__ITEM_CFG_PROFILE_STEPS,     /* online profiling (engine_online.c) */
    IGRAD__ITEM_CFG_PROFILE_ALPHA,
    IGRAD__ITEM_CFG_PROFILE_PARTITION, /* hash of the method string */
    IGRAD__ITEM_ONLINE,     /* online profiling: steps recorded, -1 when not recording */
    /* Config fields added after the state file's version 2; they sit past
     * the dynamic items so that the numbers of the items above (formats.md
     * §7) stay put. Being constant, comparing them at every exchange costs
     * nothing. */
    IGRAD__ITEM_CFG_MOMENTUM,
    IGRAD__ITEM_CFG_START_ITER,
    IGRAD__ITEM_CFG_TARGET_RATIO,
    IGRAD__ITEM_CFG_REPROFILE_EVERY, /* periodic re-profiling (engine_online.c) */
    IGRAD__ITEM_CFG_REPROFILE_MARGIN,
    IGRAD__ITEM_CFG_TOPOLOGY,        /* two-level sync (engine_hier.c) */
    IGRAD__ITEM_CFG_RANKS_PER_NODE,
    IGRAD__ITEM_CFG_DENSE_BELOW,     /* small tensors sent whole */
    IGRAD__ITEM_CFG_LINK_LATENCY,    /* the link auto prices (route.c) */
    IGRAD__ITEM_CFG_LINK_BANDWIDTH,
    IGRAD__ITEM_CFG_AUTO_SPARSE_REDUCE,
    IGRAD__ITEM_CFG_INDEX_CODE,      /* the wire's index code (formats.md §8) */
    IGRAD__ITEM_CFG_ALLOCATION,      /* ig's partition or budget allocation (the
                                        allocation's kappas: in the plan item) */
    IGRAD__NITEMS
};
#define IGRAD__ITEM_FIRST_DYNAMIC IGRAD__ITEM_STEP

typedef struct igrad__item_desc {
    const char *name;          /* "config.density", "layout", ... */
    igrad__item_type_t type;
    int in_state;              /* compared when a state file is loaded */
} igrad__item_desc_t;

extern const igrad__item_desc_t igrad__items[IGRAD__NITEMS];

/* Formats item i's value for a message ("0.01", "ig", "0x1234..."). */
void igrad__item_format(int i, uint64_t value, char *buf, size_t nbytes);

/* ---- the engine ----------------------------------------------------------- */

enum {
    IGRAD__ENGINE_IDLE = 0,
    IGRAD__ENGINE_BEGUN = 1,
    IGRAD__ENGINE_STREAM = 2 /* a streamed step is open (engine_stream.c) */
};

/* An engine: its plan (plan/plan.h), its step (plan/step.h) and its
 * data-plane memory (dp/dp.h), which the data-plane stages take, and what
 * only the engine keeps: the comm, agreement, statistics, state. */
struct igrad_engine {
    /* The engine table's row (flat or hier): every public entry point
     * dispatches through it once. */
    const struct igrad__engine_ops *ops;
    igrad__plan_t plan;
    igrad__step_t step;
    igrad__dp_mem_t mem;
    igrad_comm_t *comm;                 /* borrowed; NULL for a plan-only engine */
    igrad_trace_t *trace;               /* borrowed, may be NULL */

    uint64_t items[IGRAD__NITEMS];      /* static items (step/calls/history
                                           filled when exchanged) */
    /* Dense warm-up (cfg.start_iter > 0 with a sparse method; NULL
     * otherwise): method dense's plan (igrad__plan_warm), which the steps
     * below start_iter run with (IGRAD__RUN) over this engine's step and
     * data-plane memory, under its agreement, statistics and state. Its
     * room, the arenas' bytes beyond the method's, is held while
     * warm_room is set (from create to the first step past the warm-up;
     * igrad__engine_room). arena_nbytes: what each plan's steps need,
     * [method, warm-up][send, recv]. warm_on: the data-plane memory is
     * set for the warm-up's plan: its stages see no residual and no
     * velocity, as a method dense engine's (mem.residual and
     * mem.velocity point at a list of NULLs; warm_keep holds the
     * method's lists; swapped back when it is not set). */
    igrad__plan_t *warm;
    int warm_room, warm_on;
    size_t arena_nbytes[2][2];
    float **warm_keep[2];
    uint64_t *agree_buf;                /* nranks * (2 + IGRAD__NITEMS) */

    /* the step in progress / last step */
    int state;
    int64_t last_step;
    int64_t calls;                      /* begin calls that reached the agreement */
    igrad_step_stats_t stats;
    double t_start;                     /* ms clock at begin */

    /* Broken: a failure after the ranks agreed on a step (selection or
     * planning failed here, a collective failed or timed out, a peer sent
     * bad bytes) leaves this engine out of step with the others; every
     * later call fails fast with IGRAD_E_STATE quoting the first error. */
    igrad_status_t broken;              /* IGRAD_OK while usable */
    char broken_msg[768];

    /* iad/ig: the layout copy and online-profiling state (engine_online.c);
     * NULL for the other methods. */
    struct igrad__online *online;

    /* Streamed steps (igrad_engine_open/ready/close, engine_stream.c):
     * created at the first open, NULL before. */
    struct igrad__stream *stream;

    /* Two-level sync (engine_hier.c). On the engine the caller holds (a
     * plan-only engine of the whole layout over all P ranks, which runs the
     * world's agreement): the shards, comms and buffers; NULL otherwise. */
    struct igrad__hier *hier;
    /* After the engine's own step agreement (igrad__engine_agree_step):
     * `ag` the agreed status, `st`/`bad` this rank's own; returns the step's
     * final status. The flat row's keeps `ag`; on a shard engine of the
     * two-level sync, engine_hier.c sets one that agrees the outcome over
     * the world's comm too (its context in `world`). Set through
     * igrad__engine_link_world. */
    igrad_status_t (*after_agree)(igrad_engine_t *e, int64_t step, igrad_status_t st,
                                  int64_t bad, igrad_status_t ag);
    struct igrad__world_link *world;
    int shard;
};

/* IGRAD_OK, or IGRAD_E_STATE "<what>: the engine is unusable since ..."
 * for a broken engine. Every entry point that changes the engine or talks
 * to the other ranks (begin, end, sync, save_state, load_state) calls it
 * first. */
igrad_status_t igrad__engine_usable(const igrad_engine_t *e, const char *what);

/* Marks the engine broken with `status` and the current igrad_last_error()
 * (the first failure is kept). Returns `status`. */
igrad_status_t igrad__engine_break(igrad_engine_t *e, igrad_status_t status);

/* engine_agree.c: the items that depend only on what the engine was built
 * from, into items[] (at create). */
void igrad__engine_static_items(igrad_engine_t *e, uint64_t layout_hash, uint64_t profile_hash,
                                uint64_t plan_hash);

/* Fills the items that change with the run (step, calls, history) into
 * items[] of the engine (the static ones were set at create). */
void igrad__engine_dynamic_items(igrad_engine_t *e, int64_t step);

/* Words per rank of the agreement exchange: status, detail, check flag,
 * the items. */
#define IGRAD__AGREE_WORDS (3 + IGRAD__NITEMS)

/* Exchanges (status, detail, items) with every rank and decides
 * (the exchange runs under e->plan.cfg.timeout_s when e is given; if it fails or
 * times out, e is marked broken: the comm can no longer be trusted):
 *  - some rank failed (status != OK): returns the first failing rank's
 *    status; that rank keeps its own message (local_msg), the others get
 *    "<context> failed on rank R (<status>)[ at tensor NAME]" (detail >= 0
 *    names tensor `detail`);
 *  - all OK: compares the dynamic items (step, calls, history) and, when
 *    check_items is set on any rank, every item in order, and returns
 *    IGRAD_E_MISMATCH naming the first differing one (a second exchange
 *    names the tensor or component where layouts or profiles differ);
 *  - else IGRAD_OK.
 * `e` may be partly built (or NULL) when `status` is not OK; buf holds
 * nranks * (3 + IGRAD__NITEMS) values. Collective: every rank makes the
 * same exchanges whatever its own status. */
igrad_status_t igrad__engine_agree(igrad_engine_t *e, igrad_comm_t *comm, int nranks,
                                   uint64_t *buf, igrad_status_t status, int64_t detail,
                                   const char *local_msg, const uint64_t *items,
                                   int check_items, const char *context);

/* engine.c: plans step `step` of a plan-only engine as a real step would
 * (which tensors are sent, blocks, buckets, routes) and fills the byte and
 * bucket fields of e->stats as the step's statistics would have them. */
igrad_status_t igrad__engine_plan_only_step(igrad_engine_t *e, int64_t step);
/* A plan-only engine made: marked broken (every step entry point refuses
 * it with IGRAD_E_STATE) and handed out in *out (engine_plan.c). */
void igrad__engine_plan_only_done(igrad_engine_t *e, igrad_engine_t **out);

/* The plan step `step` runs with: the dense warm-up's below
 * cfg.start_iter, else the engine's own. IGRAD__RUN(e): that of the step
 * in progress or last run (e->step.cur_step). Macros, so that a const
 * engine gives a const plan. */
#define IGRAD__PLAN_OF(e, s) ((e)->warm && (s) < (e)->plan.cfg.start_iter ? (e)->warm : &(e)->plan)
#define IGRAD__RUN(e) IGRAD__PLAN_OF(e, (e)->step.cur_step)

/* What the route table (route.h) needs of the engine's data plane, and
 * where its collectives run. */
static inline igrad__route_dp_t igrad__engine_route_dp(const igrad_engine_t *e)
{
    const igrad__dp_ops_t *dp = e->mem.dp;
    igrad__route_dp_t r = {dp->name, dp->space, {0}, dp->sar != NULL};
    for (int w = 0; w < IGRAD__NWIRES; w++) r.wire[w] = dp->pack[w] && dp->unpack[w];
    return r;
}

static inline igrad__route_io_t igrad__engine_route_io(const igrad_engine_t *e)
{
    igrad__route_io_t io = {e->comm, e->mem.dp->space, e->mem.dp_stream, e->mem.dp->sar,
                            e->mem.send_arena};
    return io;
}

/* The step's blocks and buckets (plan/plan_step.c) in this engine's
 * arenas, with the plan of the step (IGRAD__RUN). */
static inline igrad_status_t igrad__engine_plan_step(igrad_engine_t *e, int update_history)
{
    return igrad__plan_step(IGRAD__RUN(e), &e->step, update_history, e->mem.send_arena,
                            e->mem.send_arena_nbytes, e->mem.recv_arena,
                            e->mem.recv_arena_nbytes);
}

/* The three parts the data-plane stages take (dp.h): the plan of the
 * step (the warm-up's below start_iter), its step, the memory. */
#define IGRAD__PARTS(e) IGRAD__RUN(e), &(e)->step, &(e)->mem

/* ---- engine.c / engine_online.c ----------------------------------------- */


/* igrad_engine_create on data plane `dp` with queue `stream` (the CPU one
 * and NULL for igrad_engine_create; igrad_engine_create_cuda for the
 * device one). */
igrad_status_t igrad__engine_create(const igrad_layout_t *layout, const igrad_profile_t *profile,
                                    const igrad_config_t *config, igrad_comm_t *comm,
                                    const struct igrad__dp_ops *dp, void *stream,
                                    igrad_engine_t **out);

/* A shard engine of the two-level sync on data plane `dp` (and `stream`):
 * its results average over avg_ranks (> 0) ranks, and its profile may
 * cover components its layout lacks (engine_hier.c). */
igrad_status_t igrad__engine_create_shard(const igrad_layout_t *layout,
                                          const igrad_profile_t *profile,
                                          const igrad_config_t *config, igrad_comm_t *comm,
                                          int64_t avg_ranks, const struct igrad__dp_ops *dp,
                                          void *stream, igrad_engine_t **out);

/* Everything igrad_engine_create does before the agreement: plan, buffers,
 * residuals (zeroed), workspaces, static items, for `profile` (NULL with
 * iad/ig only when config->profile_steps > 0: every component important).
 * Local; `e` is zeroed memory (but for e->mem.dp and e->mem.dp_stream, which may be
 * set: NULL dp is the CPU one), freed with igrad_engine_free on failure. */
igrad_status_t igrad__engine_build(igrad_engine_t *e, const igrad_layout_t *layout,
                                   const igrad_profile_t *profile,
                                   const igrad_config_t *config, igrad_comm_t *comm);

/* engine_online.c: sets up e->online for iad/ig (a layout copy; with
 * profile_steps > 0 and no profile, the window buffers). Local. */
igrad_status_t igrad__online_init(igrad_engine_t *e, const igrad_layout_t *layout,
                                  const igrad_profile_t *profile);
void igrad__online_free(struct igrad__online *on);
/* Steps recorded in the window, -1 when not profiling (the ONLINE item). */
int64_t igrad__online_item(const igrad_engine_t *e);
/* At the start of a begin: when the window is complete, gathers the ranks'
 * records, builds the profile and re-plans (collective, agreed). */
igrad_status_t igrad__online_before_step(igrad_engine_t *e, int64_t step);
/* At the end of a completed step: records its selections into the window. */
void igrad__online_record(igrad_engine_t *e);

/* ---- engine.c, shared with the streamed step (engine_stream.c) ------------ */

/* The step's local failures as the whole step reports them: the first
 * NULL gradient (IGRAD_E_INVALID), and after the check stage the first
 * tensor whose e->step.tnorm is not finite (IGRAD_E_NONFINITE with its first
 * bad index). *bad_tensor is the tensor, -1 when OK. */
igrad_status_t igrad__engine_null_grads(igrad_engine_t *e, int64_t step, float *const *grads,
                                        int64_t *bad_tensor);
igrad_status_t igrad__engine_nonfinite(igrad_engine_t *e, int64_t step, float *const *grads,
                                       int64_t *bad_tensor);
/* engine_fail.c: a collective of bucket j failed or timed out (says
 * which, at which step); the step's group start or end (`what`) failed;
 * keep_first keeps the message of a step's first failure in buf. Each
 * returns st. */
igrad_status_t igrad__engine_bucket_failed(const igrad_engine_t *e, size_t j, igrad_status_t st);
igrad_status_t igrad__engine_group_failed(const igrad_engine_t *e, const char *what,
                                          igrad_status_t st);
igrad_status_t igrad__engine_keep_first(igrad_status_t st, char *buf, size_t nbytes);
/* engine_fail.c: rank `rank`'s status word of an exchange (`what`: the
 * agreement, a two-level verdict): IGRAD_OK when it is an igrad status,
 * else IGRAD_E_COMM naming the rank, the word and bad bytes as the cause
 * (not a failure of that rank's). */
igrad_status_t igrad__engine_peer_word(const char *what, int rank, uint64_t word);
/* The step's agreement: this rank's status `st` (its message is
 * igrad_last_error(); `bad` the tensor or -1), the dynamic items and, every
 * verify_every calls, all items (igrad__engine_agree); counts the call. */
igrad_status_t igrad__engine_agree_step(igrad_engine_t *e, int64_t step, igrad_status_t st,
                                        int64_t bad);
/* Blocks and buckets of the step from e->step.sent/e->step.rel (update_history: the
 * risk policy's history learns them). */
/* The start of a step: statistics cleared (bucket_loads kept), step
 * number and clock set; returns the clock in ms (engine.c). */
double igrad__engine_step_reset(igrad_engine_t *e, int64_t step);
/* The gate of step (e->step.sent, e->step.rel), each sent tensor's offset in the
 * staged selection, the per-tensor results reset (engine.c). */
/* Statistics, online record and trace of a step whose result is in grads;
 * the engine is idle after it. */
igrad_status_t igrad__engine_finish_step(igrad_engine_t *e);
/* The memory statistics (dataplane_nbytes and per parameter) into *s. */
void igrad__engine_stats_memory(const igrad_engine_t *e, igrad_step_stats_t *s);
/* The sparse all-reduce's owner load of the step's buckets into *s
 * (sar_busiest_entries, sar_entries, sar_busiest_over_mean). */
void igrad__engine_stats_sar(const igrad_engine_t *e, igrad_step_stats_t *s);
/* Dense warm-up: the data-plane memory made ready for the plan of step
 * e->step.cur_step (IGRAD__RUN), at the start of a step (engine.c). When
 * it changes plan, the backend's per-engine state (made for the other
 * plan) is released and the arenas are resized: to the method's after
 * the warm-up (the warm-up's room freed; if the smaller ones cannot be
 * had, the larger stay), to both plans' largest for a warm-up step after
 * that (a state file of the warm-up loaded later; IGRAD_E_NOMEM if that
 * fails). Local. */
igrad_status_t igrad__engine_room(igrad_engine_t *e);

/* ---- the engine table (engine_api.c) ---------------------------------------
 *
 * One row per topology, like the route table (plan/route.h): the public
 * entry points (engine_api.c) check their arguments and call the row of
 * the engine they are given. The flat row (igrad__engine_flat: engine.c,
 * engine_stream.c, engine_state.c, engine_online.c, engine_plan.c,
 * engine_stats.c) runs one engine over one comm; the hier row
 * (igrad__engine_hier, engine_hier.c) owns flat shard engines and calls
 * them through the public API. An entry point a row does not have
 * returns IGRAD_E_UNSUPPORTED naming it. */
typedef struct igrad__engine_ops {
    const char *name; /* "flat", "hier" */
    void (*free)(igrad_engine_t *e);
    igrad_status_t (*sync)(igrad_engine_t *e, int64_t step, float *const *grads);
    igrad_status_t (*begin)(igrad_engine_t *e, int64_t step, float *const *grads,
                            const igrad_bucket_t **buckets, size_t *nbuckets);
    igrad_status_t (*end)(igrad_engine_t *e, int64_t step, float *const *grads);
    igrad_status_t (*open)(igrad_engine_t *e, int64_t step);
    igrad_status_t (*ready)(igrad_engine_t *e, int64_t step, const size_t *tensors, size_t n,
                            float *const *grads, const igrad_bucket_t **buckets,
                            size_t *nbuckets);
    igrad_status_t (*close)(igrad_engine_t *e, int64_t step);
    igrad_status_t (*save_state)(const igrad_engine_t *e, const char *path);
    igrad_status_t (*load_state)(igrad_engine_t *e, const char *path);
    igrad_status_t (*set_profile)(igrad_engine_t *e, const igrad_profile_t *profile);
    igrad_status_t (*set_trace)(igrad_engine_t *e, igrad_trace_t *trace);
    igrad_status_t (*plan_step)(igrad_engine_t *e, int64_t step, igrad_step_stats_t *stats,
                                igrad_planned_bucket_t *buckets, size_t capacity,
                                size_t *nbuckets);
    /* t < ntensors (checked by the caller) */
    igrad_status_t (*tensor_plan)(const igrad_engine_t *e, size_t t, igrad_tensor_plan_t *out);
    const float *(*residual)(const igrad_engine_t *e, size_t t);
    const float *(*velocity)(const igrad_engine_t *e, size_t t);
    int64_t (*predict_payload)(const igrad_engine_t *e, int64_t step);
    size_t (*workspace_nbytes)(const igrad_engine_t *e);
    /* igrad_engine_set_stream_<dp>: the queue of the engine's data plane
     * `dp` (hier: its shard engine's and node collectives'). */
    igrad_status_t (*set_stream)(igrad_engine_t *e, const struct igrad__dp_ops *dp,
                                 void *stream);
} igrad__engine_ops_t;

extern const igrad__engine_ops_t igrad__engine_flat;
extern const igrad__engine_ops_t igrad__engine_hier;

/* A zeroed engine of row `ops` (NULL: out of memory), its after_agree the
 * flat one. */
igrad_engine_t *igrad__engine_alloc(const igrad__engine_ops_t *ops);
/* Sets e's after_agree hook and its context. */
void igrad__engine_link_world(igrad_engine_t *e,
                              igrad_status_t (*after_agree)(igrad_engine_t *, int64_t,
                                                            igrad_status_t, int64_t,
                                                            igrad_status_t),
                              struct igrad__world_link *world);

/* The flat row's entries (their public names without igrad_engine_). */
void igrad__flat_free(igrad_engine_t *e);
igrad_status_t igrad__flat_sync(igrad_engine_t *e, int64_t step, float *const *grads);
igrad_status_t igrad__flat_begin(igrad_engine_t *e, int64_t step, float *const *grads,
                                 const igrad_bucket_t **buckets, size_t *nbuckets);
igrad_status_t igrad__flat_end(igrad_engine_t *e, int64_t step, float *const *grads);
igrad_status_t igrad__flat_open(igrad_engine_t *e, int64_t step);
igrad_status_t igrad__flat_ready(igrad_engine_t *e, int64_t step, const size_t *tensors,
                                 size_t n, float *const *grads, const igrad_bucket_t **buckets,
                                 size_t *nbuckets);
igrad_status_t igrad__flat_close(igrad_engine_t *e, int64_t step);
igrad_status_t igrad__flat_save_state(const igrad_engine_t *e, const char *path);
igrad_status_t igrad__flat_load_state(igrad_engine_t *e, const char *path);
igrad_status_t igrad__flat_set_profile(igrad_engine_t *e, const igrad_profile_t *profile);
igrad_status_t igrad__flat_set_trace(igrad_engine_t *e, igrad_trace_t *trace);
igrad_status_t igrad__flat_plan_step(igrad_engine_t *e, int64_t step, igrad_step_stats_t *stats,
                                     igrad_planned_bucket_t *buckets, size_t capacity,
                                     size_t *nbuckets);
igrad_status_t igrad__flat_tensor_plan(const igrad_engine_t *e, size_t t,
                                       igrad_tensor_plan_t *out);
const float *igrad__flat_residual(const igrad_engine_t *e, size_t t);
const float *igrad__flat_velocity(const igrad_engine_t *e, size_t t);
int64_t igrad__flat_predict_payload(const igrad_engine_t *e, int64_t step);
size_t igrad__flat_workspace_nbytes(const igrad_engine_t *e);
igrad_status_t igrad__flat_set_stream(igrad_engine_t *e, const struct igrad__dp_ops *dp,
                                      void *stream);

/* engine_shard.c: what else the hier row asks of its flat shard engines
 * (it reads none of their fields). create_shard_plan: a plan-only shard
 * engine for nranks ranks. failure: the engine's broken status (IGRAD_OK
 * while usable) and, with msg, its first error. progress: the last step
 * it completed and its begin calls. copy: nbytes within its data plane's
 * memory, queued after its work (dp.h copy). bucket_slots: its plan's
 * bucket slots. prepare: its data plane's state made now (dp.h prepare).
 * world: the context of its after_agree hook. */
igrad_status_t igrad__flat_create_shard_plan(const igrad_layout_t *layout,
                                             const igrad_profile_t *profile,
                                             const igrad_config_t *config, int nranks,
                                             igrad_engine_t **out);
igrad_status_t igrad__flat_failure(const igrad_engine_t *e, const char **msg);
void igrad__flat_progress(const igrad_engine_t *e, int64_t *last_step, int64_t *calls);
igrad_status_t igrad__flat_copy(igrad_engine_t *e, void *dst, const void *src, size_t nbytes);
int igrad__flat_bucket_slots(const igrad_engine_t *e);
igrad_status_t igrad__flat_prepare(igrad_engine_t *e);
struct igrad__world_link *igrad__flat_world(const igrad_engine_t *e);

/* ---- engine_hier.c: the two-level sync (config.topology = hier) ---------- */

/* A two-level engine whose shard engine and shard buffers are on data
 * plane `dp` (igrad__dp_cpu or igrad__dp_cuda) and `stream`; the shard's
 * data-plane state is made at create (dp.h prepare). */
igrad_status_t igrad__hier_create(const igrad_layout_t *layout, const igrad_profile_t *profile,
                                  const igrad_config_t *config, igrad_comm_t *comm,
                                  const struct igrad__dp_ops *dp, void *stream,
                                  igrad_engine_t **out);
/* igrad_engine_create_plan of a hier config: the L shard plans for N = P/L. */
igrad_status_t igrad__hier_create_plan(const igrad_layout_t *layout,
                                       const igrad_profile_t *profile,
                                       const igrad_config_t *config, int nranks,
                                       igrad_engine_t **out);

#endif /* IGRAD_ENGINE_INTERNAL_H */
