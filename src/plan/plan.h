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
#include "plan/step.h"

/* Bounds of the online-profiling config (config.c, engine_online.c). */
#define IGRAD__ONLINE_MAX_STEPS 100000      /* config.profile_steps */
#define IGRAD__ONLINE_PARTITION_NBYTES 64   /* config.profile_partition, NUL included */

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

/* The few config values the data plane's kernels take, as plain values
 * (igrad__plan_build fills them once): no stage reads the config. */
typedef struct igrad__kernel_args {
    float momentum;                     /* DGC's m, as the kernels take it (0: no
                                           velocity; velocity[t] NULL then) */
    igrad_dtype_t grad_dtype;           /* of the gradients in memory */
    igrad_dtype_t value_dtype;          /* of the sparse wire's values */
    int residual_drop;                  /* residual "drop": a tensor not sent is dropped */
} igrad__kernel_args_t;

typedef struct igrad__plan {
    igrad_config_t cfg;                 /* copy, size = sizeof */
    igrad__kernel_args_t kargs;         /* from cfg, for the data plane */
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
    double *comp_keep;                  /* (ncomp) kappa of each component's
                                           releases: config.release_keep, or
                                           its own with the budget allocation */
    int allocated;                      /* config.allocation BUDGET applied:
                                           comp_important and comp_keep are the
                                           allocation's (allocate.h) */
    double alloc_ratio;                 /* its planned payload / *_sync's */

    igrad__pack_map_t map;              /* direct policy */
    igrad__pack_history_t hist;         /* risk policy */

    /* the largest step: what the step scratch is sized for */
    size_t max_entries, max_blocks;
    int64_t max_gather_nbytes, max_dense_count; /* what the arenas are sized for */
} igrad__plan_t;

/* Odd steps select with spec[.][1] when interleaving. */
static inline int igrad__plan_parity(const igrad__plan_t *p, int64_t step)
{
    return p->cfg.interleave && step % 2 != 0;
}

/* ---- plan_build.c: the plan made at create ------------------------------ */

/* The plan of p->cfg (set, validated; p->sp, value_nbytes, nranks too)
 * for `layout` and `profile` (NULL: every component important; with
 * `shard`, a profile that may cover more components than the layout):
 * the kernel arguments, per-tensor plans, phases, the direct policy's map and the risk
 * policy's history keys, the largest step. */
igrad_status_t igrad__plan_build(igrad__plan_t *p, const igrad_layout_t *layout,
                                 const igrad_profile_t *profile, int shard);

/* The dense warm-up's plan (config.start_iter > 0 with a sparse method):
 * into zeroed *w, method dense's plan of the layout `p` was built for,
 * made by igrad__plan_build from p's config with method dense (momentum,
 * warm-up, online profiling, re-profiling and payload target off, F32
 * values) and without a profile, exactly as a method dense engine makes
 * its own, so that its blocks, bucket cuts and routes (and with them the
 * all-reduce's summation order) are dense's. Ranks, levels and threads
 * are p's. */
igrad_status_t igrad__plan_warm(igrad__plan_t *w, const igrad__plan_t *p,
                                const igrad_layout_t *layout, int shard);
/* Frees what igrad__plan_build made (not p itself). */
void igrad__plan_free(igrad__plan_t *p);

/* The profile's components against the layout's (all of them, or with
 * `subset` a subset: a shard's). IGRAD_E_MISMATCH naming the first
 * difference. */
igrad_status_t igrad__plan_check_profile(const igrad_profile_t *profile,
                                         const igrad_layout_t *layout, int subset);
/* The layout into p->t, names, hashes and the components. */
igrad_status_t igrad__plan_copy_layout(igrad__plan_t *p, const igrad_layout_t *layout);
/* Every tensor's select specs, wire index widths and block sizes. */
igrad_status_t igrad__plan_tensors(igrad__plan_t *p);
/* Sparse wire bytes of tensor tp's selection at release `rel`, parity `par`,
 * with the fixed index widths: the release phases' weights and the arenas'
 * bound (a compact code is never larger), so neither depends on
 * config.index_code. */
int64_t igrad__plan_tensor_nbytes(const igrad__plan_t *p, const igrad__plan_tensor_t *tp,
                                  int rel, int par);
/* The bytes the same selection takes on the gather wire: its blocks'
 * values and indices as config.index_code codes them (the payload). */
int64_t igrad__plan_tensor_wire_nbytes(const igrad__plan_t *p, const igrad__plan_tensor_t *tp,
                                       int rel, int par);
/* The index code of block bi (its tensor, row_wise, count and idx_nbytes
 * set) of a selection `sp` under config.index_code: idx_code, code_k,
 * code_u, code_nbytes (all 0 for the fixed widths or a block without
 * indices). A function of the plan alone (core/wire_code.h). */
void igrad__plan_block_code(const igrad__plan_t *p, const igrad_select_spec_t *sp,
                            igrad__step_block_t *bi);
/* The components' important flags and release phases from the profile. */
igrad_status_t igrad__plan_phases(igrad__plan_t *p, const igrad_profile_t *profile);
/* The largest step: entries, blocks, gather bytes, dense floats. */
igrad_status_t igrad__plan_maxima(igrad__plan_t *p, int64_t out[4]);
/* Blocks of every tensor at its normal budget (even step), readiness order. */
igrad_status_t igrad__plan_full_blocks(const igrad__plan_t *p, igrad__pack_block_t **out,
                                       size_t *nout);
/* The plan and profile hashes of the agreement (formats.md §7). */
uint64_t igrad__plan_hash(const igrad__plan_t *p);
uint64_t igrad__plan_profile_hash(const igrad__plan_t *p);
/* work[0 .. ntensors): the tensors, largest first (the selection threads'
 * order). */
void igrad__plan_sort_work(const igrad__plan_t *p, uint32_t *work);

/* ---- plan_step.c: the per-step plan ---------------------------------------- */

/* The step's scratch for plan p, sized for its largest step and, when w
 * is not NULL (the dense warm-up's plan), for w's too: the blocks and
 * bucket slots of either (with `sar`, the sparse all-reduce's workspaces
 * per bucket slot of p); the staged selection (stage_idx, stage_val) is
 * the data plane's to allocate. igrad__step_free frees what
 * igrad__step_alloc made. */
igrad_status_t igrad__step_alloc(igrad__step_t *s, const igrad__plan_t *p,
                                 const igrad__plan_t *w, int sar);
void igrad__step_free(igrad__step_t *s, int nb_max);

/* The gate of `step` (s->sent, s->rel), each sent tensor's offset in the
 * staged selection, the per-tensor results reset. A pure function of plan
 * and step, so the data plane may start selections in its check. */
void igrad__plan_gate(const igrad__plan_t *p, igrad__step_t *s, int64_t step);
/* Blocks and buckets of step s->cur_step from the gate (readiness order:
 * last tensor first), assigned to buckets by the pack policy, each
 * bucket's route chosen and laid out within the arenas (send_cap,
 * recv_cap bytes); with update_history the risk policy's history learns
 * the step's blocks. The caller's bucket views (s->desc) point into
 * send_arena and recv_arena; none for a plan-only engine (NULL arenas). */
igrad_status_t igrad__plan_step(igrad__plan_t *p, igrad__step_t *s, int update_history,
                                unsigned char *send_arena, size_t send_cap,
                                unsigned char *recv_arena, size_t recv_cap);

#endif /* IGRAD_PLAN_H */
