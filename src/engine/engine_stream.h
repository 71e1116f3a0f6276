/*
 * engine_stream.h — what the streamed step (engine_stream.c:
 * igrad_engine_open / ready / close) shares with engine.c (freeing, the
 * memory statistics) and the data planes' stream stages (dp_cpu_stream.c):
 * the per-engine stream state, created at the first open.
 *
 * Not here: the public API (igrad.h "Streamed step"), the stages' table
 * (dp.h stream_ready / stream_commit).
 */
#ifndef IGRAD_ENGINE_STREAM_H
#define IGRAD_ENGINE_STREAM_H

#include "engine/engine_internal.h"

typedef struct igrad__stream {
    float **grads;           /* (ntensors) as given to ready; NULL until given */
    float **pack_grads;      /* (ntensors) what pack reads: grads, or `zeros`
                                for a NULL one (method dense packs gradients) */
    unsigned char *given;    /* (ntensors) given to ready at this step */
    size_t ngiven;
    size_t *tblock0, *tnblk; /* (ntensors) the tensor's blocks this step:
                                e->step.binfo[tblock0 .. + tnblk) */
    int *compact;            /* (nb_max) planned bucket -> index in e->step.bk, -1 empty */
    size_t *missing;         /* (nb_max) per e->step.bk: blocks whose tensor is not given */
    size_t next;             /* next bucket of e->step.bk to hand out (issue order) */
    /* the selection scratch: e->mem.stream_scratch (dp.h) */
    float *zeros;            /* method dense, a NULL gradient: zeros to pack (lazy) */
    size_t zeros_count;
    /* IGRAD_DEBUG_STREAM set (read at the first open): each given
     * gradient's hash at ready, compared at close */
    uint64_t *sums;          /* (ntensors), NULL when the check is off */
} igrad__stream_t;

/* Frees e->stream (NULL: nothing). Called by igrad_engine_free. */
void igrad__stream_free(igrad_engine_t *e);
/* Bytes the stream state holds in the data plane's memory (0 before the
 * first open): the selection scratch and the zeros. */
int64_t igrad__stream_nbytes(const igrad_engine_t *e);

#endif /* IGRAD_ENGINE_STREAM_H */
