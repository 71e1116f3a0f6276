/*
 * step.h — the step part of an engine: one step's plan and results,
 * scratch sized at create for the largest step. The control plane fills
 * the gate (sent, rel), the staged selection's offsets, the blocks and
 * buckets (plan_step); the data plane (dp.h) writes the staged selection
 * and the per-tensor results (tstatus, tsumsq, tnorm, tdropped), which
 * the control plane reads.
 *
 * Not here: the plan made at create (plan.h), the data plane's memory
 * (dp.h).
 */
#ifndef IGRAD_STEP_H
#define IGRAD_STEP_H

#include "core/internal.h"
#include "plan/pack.h"

struct igrad__route; /* route.h */
struct igrad__sar;   /* comm/sparse_allreduce.h */

/* One block of a step: a run of a tensor's selected entries. */
typedef struct igrad__step_block {
    uint32_t tensor;
    int idx_nbytes;          /* 0 (dense method), 2 or 4 */
    int row_wise;
    int seg_owner;           /* reduce: this block opens its dense segment */
    int64_t first, count;    /* entries [first, first+count) of the selection */
    int64_t row0;            /* row-wise: first row */
    int64_t seg_begin;       /* dense segment: tensor entries [seg_begin, +seg_count) */
    int64_t seg_count;
    int idx_code;            /* compact wire (config.index_code): the code of each of
                                the block's runs (core/wire_code.h); 0: the fixed
                                widths of idx_nbytes */
    int64_t code_k, code_u;  /* compact: entries and index range of each run (a row:
                                per_row, cols; a flat block: count, the tensor's n) */
    int64_t code_nbytes;     /* compact: bytes of each run; count / code_k runs */
    size_t val_off, idx_off; /* gather: offsets in a rank's bytes of the bucket */
    size_t dense_off;        /* reduce: offset (floats) of the segment in the bucket */
} igrad__step_block_t;

/* Bytes of a block's indices on the gather wire. */
static inline int64_t igrad__step_block_idx_bytes(const igrad__step_block_t *bi)
{
    return bi->idx_code ? bi->count / bi->code_k * bi->code_nbytes
                        : bi->count * (int64_t)bi->idx_nbytes;
}

/* One bucket of a step. */
typedef struct igrad__step_bucket {
    const struct igrad__route *route; /* its collective (route.h) */
    igrad_bucket_kind_t kind;         /* route->kind */
    int index;
    size_t first, nblocks;   /* its blocks: order[first .. first + nblocks) */
    int64_t entries;
    size_t send_off, send_nbytes;  /* in the send arena (gather) */
    size_t recv_off, recv_nbytes;  /* in the recv arena */
    size_t dense_count;            /* reduce: floats; sparse all-reduce: its index space */
    double wire_counted;           /* sparse all-reduce: the bytes its exchanges moved
                                      for this rank, < 0 until it ran (route.c) */
    igrad_comm_request_t *req;
} igrad__step_bucket_t;

typedef struct igrad__step {
    int64_t cur_step;                   /* the step in progress / last planned */
    int step_sar;                       /* auto may take the sparse all-reduce in
                                           this step: the plan's auto_sar under
                                           igrad_engine_sync (and plan-only steps),
                                           0 for begin/open */
    uint32_t *stage_idx;                /* selections, concatenated */
    float *stage_val;
    int64_t *stage_off;                 /* (ntensors) offset of t's selection */
    unsigned char *sent;                /* (ntensors) sent this step */
    unsigned char *rel;                 /* (ntensors) released this step */
    uint32_t *work;                     /* (ntensors) tensors, largest first */
    int64_t *tstatus;                   /* (ntensors) per-tensor results */
    double *tsumsq;                     /* (ntensors) selection sum of squares */
    double *tnorm;                      /* (ntensors) residual sum of squares */
    double *tdropped;                   /* (ntensors) dropped sum of squares */
    igrad__pack_block_t *blocks;        /* (blk_cap) */
    igrad__step_block_t *binfo;         /* (blk_cap) */
    int *bucket_of;                     /* (blk_cap) */
    size_t *order;                      /* (blk_cap) */
    size_t *start;                      /* (nb_cap + 1) */
    int64_t *loads;                     /* (nb_cap) */
    igrad__step_bucket_t *bk;           /* (nb_cap) */
    igrad_bucket_t *desc;               /* (nb_cap) */
    struct igrad__sar *sar;             /* (nb_max) collective sparse_reduce: the sparse
                                           all-reduce's workspace per bucket slot, whose
                                           result and remainder unpack reads; else NULL */
    size_t nb_cap, blk_cap;             /* bucket slots and blocks allocated: the
                                           largest of the engine's plans (plan.h) */
    void *pack_scratch;
    size_t pack_scratch_nbytes;
    size_t nblk;                        /* blocks this step */
    size_t nbk;                         /* non-empty buckets this step */
    int nplanned;                       /* planned buckets (bucket_count) */
} igrad__step_t;

#endif /* IGRAD_STEP_H */
