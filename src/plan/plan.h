/*
 * plan.h — the plan part of an engine: what igrad_engine_create decides
 * once (and online re-planning redecides): the effective config, per
 * tensor its select specs, wire index widths, block sizes and release
 * phase, the components, the bucket map and the risk policy's history,
 * the ranks and the sizes every step's scratch is made for. The data
 * plane (dp.h) reads it, never writes it.
 *
 * Not here: the per-step plan (step.h), the data plane's memory (dp.h),
 * the engine around them (engine/engine_internal.h).
 */
#ifndef IGRAD_PLAN_H
#define IGRAD_PLAN_H

#include "core/internal.h"
#include "plan/pack.h"

/* One tensor's plan. Index [rel][par]: rel = 1 at a release step, par = 1
 * on odd steps (only differs from even with interleave). */
typedef struct igrad__plan_tensor {
    const char *name;                   /* in plan->names */
    int ndim;
    int64_t shape[IGRAD_MAX_DIMS];
    int64_t n;                          /* entries */
    int comp;                           /* component index, -1 for OTHER */
    int important;                      /* component important (OTHER: 1) */
    int phase;                          /* IGRAD__PHASE_EVERY or [0, R) */
    igrad_select_spec_t spec[2][2];
    int idx_nbytes[2][2];               /* index bytes per entry on the wire */
    int64_t blk_entries[2][2];          /* block size (whole rows if row-wise) */
    int64_t nblocks[2][2];
} igrad__plan_tensor_t;

typedef struct igrad__plan {
    igrad_config_t cfg;                 /* copy, size = sizeof */
    igrad_sparsifier_t sp;              /* effective sparsifier */
    int deferral;                       /* iad / ig */
    int per_tensor_buckets;             /* iad */
    int nb_max;                         /* bucket slots: B, or tensors for iad */
    int nthreads;
    int value_nbytes;                   /* sparse wire: 4 (F32) or 2 (BF16, F16) */
    int rank, nranks;
    int plan_only;                      /* igrad_engine_create_plan: nranks set by
                                           the caller, no comm, no data-plane
                                           memory; it only plans steps */
    int auto_sar;                       /* collective auto may take the sparse
                                           all-reduce (config.auto_sparse_reduce and
                                           the engine can run it, route.c) */
    /* Levels. node_ranks: ranks per node for the statistics' intra/inter
     * split (1..nranks). avg_ranks: the gradients are averaged over this
     * many ranks (nranks; a shard engine of the two-level sync: the whole
     * world's, since what it exchanges are node sums). */
    int64_t node_ranks;
    int64_t avg_ranks;

    size_t ntensors;
    igrad__plan_tensor_t *t;
    int64_t nparams;                    /* entries of every tensor */
    char *names;                        /* all names, NUL-separated */
    uint64_t *tensor_hash;              /* (ntensors) for mismatch messages */
    size_t ncomp;
    int *comp_layer;                    /* (ncomp) */
    igrad_kind_t *comp_kind;            /* (ncomp) */
    int64_t *comp_count;                /* (ncomp) */
    unsigned char *comp_important;      /* (ncomp) */
    int *comp_phase;                    /* (ncomp) */

    igrad__pack_map_t map;              /* direct policy */
    igrad__pack_history_t hist;         /* risk policy */

    /* the largest step: what the step scratch is sized for */
    size_t max_entries, max_blocks;
} igrad__plan_t;

/* Odd steps select with spec[.][1] when interleaving. */
static inline int igrad__plan_parity(const igrad__plan_t *p, int64_t step)
{
    return p->cfg.interleave && step % 2 != 0;
}

#endif /* IGRAD_PLAN_H */
