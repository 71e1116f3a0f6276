/*
 * route.h — bucket routes: the one table of the collectives a bucket can
 * take (allgather of the sparse payload, all-reduce of dense segments,
 * the sparse all-reduce of sparse_allreduce.h).
 * A route is everything the engine needs to know about a bucket kind: its
 * wire layout (which the data plane packs and unpacks, dp.h), the cost
 * model that `collective = auto` compares, its share of the bucket arenas,
 * how its collective is issued and completed, and how it is counted in the
 * statistics. engine.c asks the table and never tests a kind itself, so a
 * new collective is one entry in route.c (and, if it needs a new wire
 * layout, one pack/unpack pair per data-plane backend).
 *
 * Not here: which blocks go to which bucket (pack.c), the bytes themselves
 * (dp_cpu_pack.c, dp_cpu_unpack.c), the communicators (comm*.c), the
 * sparse all-reduce's exchanges (sparse_allreduce.c).
 */
#ifndef IGRAD_ROUTE_H
#define IGRAD_ROUTE_H

#include "plan/step.h"

struct igrad__sar_ops; /* comm/sparse_allreduce.h */

/* How a bucket's bytes are laid out; the data plane has a pack and an
 * unpack for each. */
typedef enum igrad__wire {
    IGRAD__WIRE_SPARSE = 0, /* per rank [values F32][32-bit indices][16-bit indices]
                               (formats.md §8) */
    IGRAD__WIRE_DENSE = 1,  /* F32 over the blocks' dense segments */
    IGRAD__WIRE_SAR = 2,    /* (dense index, F32) entries of the sparse all-reduce
                               (igrad__sar_entry_t), indices in the dense wire's
                               index space of the bucket */
    IGRAD__NWIRES
} igrad__wire_t;

/* What auto prices a bucket by: P ranks, s gather bytes per rank, d dense
 * floats, k entries per rank (the sparse all-reduce's k). */
typedef struct igrad__route_bucket {
    int64_t P, s, d, k;
} igrad__route_bucket_t;

/* What a route needs to know of the data plane (dp.h) and the comm that
 * run it: plain values, filled by the engine. */
typedef struct igrad__route_dp {
    const char *name;                  /* the data plane's, for messages */
    igrad__mem_space_t space;          /* its memory */
    unsigned char wire[IGRAD__NWIRES]; /* it packs and unpacks this wire */
    int sar;                           /* it has the sparse all-reduce's data steps */
} igrad__route_dp_t;

/* Where a route's collective runs: the comm, the data plane's memory
 * space, queue and sparse all-reduce steps, the send arena. */
typedef struct igrad__route_io {
    igrad_comm_t *comm;
    igrad__mem_space_t space;
    void *stream;
    const struct igrad__sar_ops *sar_ops;
    unsigned char *send_arena;
} igrad__route_io_t;

/* Bounds of config.link_latency_ns and link_bandwidth_mbps (validated), so
 * that auto's integer costs (route.c) cannot overflow. */
#define IGRAD__LINK_MAX_LATENCY_NS 1000000000LL
#define IGRAD__LINK_MAX_BANDWIDTH_MBPS 1000000000LL

/* The link: config.link_latency_ns (α) and link_bandwidth_mbps (B, so β =
 * 8000/B ns per byte); `sar`: the sparse all-reduce is priced too. */
typedef struct igrad__route_link {
    int64_t latency_ns, bandwidth_mbps;
    int sar;
} igrad__route_link_t;

/* The sparse all-reduce's time per bucket, fitted to the netns testbed
 * at 4 and 8 ranks (docs/results/sparse_allreduce.md, decision 0060):
 * IGRAD__SAR_FIT_ALPHA α whatever P (its four exchanges each put all their
 * messages in flight at once) + IGRAD__SAR_FIT_BETA_NUM /
 * IGRAD__SAR_FIT_BETA_DEN × its wire bytes × β (the split's all-to-all
 * meets each receiver's link from P−1 senders at once). The one
 * definition: auto's price (route.c) and igrad plan's engine rows
 * (tools/plan_cost.c, plan_engine_sar_s) both read it. */
#define IGRAD__SAR_FIT_ALPHA 17
#define IGRAD__SAR_FIT_BETA_NUM 9
#define IGRAD__SAR_FIT_BETA_DEN 5

/* A route's cost: (time in ns) × B × P / (P−1), where time = steps·α +
 * wire bytes·8000/B — every route's time has the factor P−1 and the wire
 * bytes × P are integers, so the scaled time is the integer
 * P·B·(steps/(P−1))·α + 8000·(P/(P−1))·(wire bytes). 128 bits: with the
 * bounds of the config (IGRAD__LINK_MAX_*) and 64-bit byte counts it
 * cannot overflow. */
__extension__ typedef __int128 igrad__cost_t;

typedef struct igrad__route {
    igrad_bucket_kind_t kind;     /* what igrad_bucket_t.kind says */
    const char *name;             /* "gather", "reduce", "sparse all-reduce" (messages) */
    igrad__wire_t wire;
    int dense_method;             /* the route of the dense method */
    igrad_collective_t forced_by; /* config.collective that always takes it */
    int caller_runs;              /* a caller can run it (igrad_engine_begin, open) */
    /* auto's α-β time of the bucket (igrad__cost_t), scaled to an
     * exact integer; auto takes the cheapest route, the earlier one in the
     * table on ties. `optin`: a route auto prices only where the engine
     * can run it and config.auto_sparse_reduce asks (the sparse
     * all-reduce). */
    igrad__cost_t (*cost)(const igrad__route_bucket_t *b, const igrad__route_link_t *l);
    int optin;
    /* This route's room in the send and recv arenas for the largest step
     * (largest gather bytes `smax`, entries `emax`, dense floats `dmax`,
     * `slack` bytes for the buckets' 8-byte alignment of an arena it
     * uses), alone when `forced`, else next to the others under auto. */
    void (*arena)(int64_t smax, int64_t emax, int64_t dmax, size_t P, int forced, size_t slack,
                  size_t *send, size_t *recv);
    /* Lays bucket bk of step s out at the running arena offsets (its
     * blocks' dense_off are set): block offsets, send/recv bytes for
     * `nranks` ranks and `value_nbytes` per sparse value; advances them. */
    void (*layout)(igrad__step_t *s, int nranks, int value_nbytes, igrad__step_bucket_t *bk,
                   size_t *send_off, size_t *recv_off);
    /* The caller's view of the bucket (igrad_engine_begin); d->recv is set. */
    void (*describe)(unsigned char *send_arena, const igrad__step_bucket_t *bk,
                     igrad_bucket_t *d);
    /* Statistics: offsetof the igrad_step_stats_t counter of its buckets
     * (an int), the bytes this rank contributes (payload) and the
     * modelled wire bytes. */
    size_t stats_count;
    int64_t (*payload)(const igrad__step_bucket_t *bk);
    double (*wire_nbytes)(const igrad__step_bucket_t *bk, double P);
    /* Issues the collective of step s's bucket j (s->bk[j], described in
     * s->desc[j]) on io->comm, its buffers in io->space, on io->stream
     * (NULL: the comm's default); completing it is igrad_comm_wait /
     * igrad_comm_test on the request for every route (a blocking route
     * returns a request that is already done). */
    igrad_status_t (*issue)(const igrad__route_io_t *io, igrad__step_t *s, size_t j,
                            igrad_comm_request_t **req);
} igrad__route_t;

/* The route of a bucket kind; NULL for a kind the table does not know. */
const igrad__route_t *igrad__route_of(igrad_bucket_kind_t kind);

/* The route of one bucket this step: the dense method's route, the one
 * `collective` forces, the first route with one rank, else (auto) the
 * cheapest by cost() among the routes the link allows (opt-in routes only
 * with l->sar). A pure function of its arguments: every rank, given the
 * same plan and config, chooses alike. */
const igrad__route_t *igrad__route_choose(igrad_collective_t collective, int dense,
                                          const igrad__route_bucket_t *b,
                                          const igrad__route_link_t *l);

/* Whether auto may take the sparse all-reduce in an engine of config c
 * (at create, after igrad__route_check_engine): config.auto_sparse_reduce,
 * collective auto, a sparse method (`dense` 0), F32 gradients and, unless
 * plan-only, the data plane's SAR wire and a comm with alltoallv. A
 * plan-only engine answers for the CPU data plane over MPI (what igrad
 * plan models). */
int igrad__route_auto_sar(const igrad_config_t *c, int dense, int plan_only,
                          const igrad__route_dp_t *dp, const igrad_comm_t *comm);

/* The link of config c (l->sar: `sar`, the step's step_sar). */
igrad__route_link_t igrad__route_link_of(const igrad_config_t *c, int sar);

/* What an engine needs for the route its config forces (at create,
 * before the agreement, so that every rank fails alike): the data plane's
 * pack and unpack of its wire and, for the sparse all-reduce, a comm with
 * alltoallv and F32 gradients. IGRAD_E_UNSUPPORTED naming what is missing. */
igrad_status_t igrad__route_check_engine(const igrad_config_t *c, int dense,
                                         const igrad__route_dp_t *dp, const igrad_comm_t *comm);

/* IGRAD_E_UNSUPPORTED from `what` (igrad_engine_begin, igrad_engine_open)
 * when the config forces a route that a caller cannot run. */
igrad_status_t igrad__route_check_caller(const igrad_config_t *c, int dense, const char *what);

/* Arena bytes for the largest step: the routes a config can choose (under
 * auto the opt-in ones only with `sar`), the largest room of each arena
 * among them. */
void igrad__route_arenas(igrad_collective_t collective, int dense, int sar, int64_t smax,
                         int64_t emax, int64_t dmax, size_t P, size_t slack, size_t *send,
                         size_t *recv);

#endif /* IGRAD_ROUTE_H */
