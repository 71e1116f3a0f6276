/*
 * dp.h — the engine's data plane: the table of operations that touch
 * gradient, residual, velocity and bucket memory, one row per backend
 * (the CPU one is dp_cpu*.c; a CUDA one would be a second row). The
 * control plane — config, plan, budgets and select specs, schedule,
 * packing policies, bucket routes, agreement, statistics (engine.c,
 * schedule.c, pack.c, route.c, select.c's spec arithmetic) — decides what
 * happens and reaches that memory only through these calls; it reads the
 * per-tensor results the stages leave in the step (tnorm, tsumsq,
 * tdropped, tstatus), never the memory itself. A stage takes the engine's
 * three parts — plan (plan.h, read only), step (step.h) and the memory
 * part below — never the engine.
 *
 * Stages of one step, in order (architecture.md §2):
 *   check        per tensor sum of (m*u + g + e)^2 in double (finiteness);
 *                a backend may run the sent tensors' selection pass 1 in
 *                the same read (the CPU one does)
 *   select_into  error feedback + selection of the sent tensors into the
 *                staged selection, accumulate or drop the others
 *   pack         a bucket's staged selections into its wire layout
 *   unpack       a bucket's received bytes, 1/P, into the gradients
 *   zero         the gradients that unpack adds into
 * Memory: alloc/free/copy in the backend's memory space (`space`, the
 * igrad__mem_space_t of internal.h that the communicators also take);
 * copy_out is how the host reads it (engine_state.c saves residuals and
 * velocities through it, a bounded chunk at a time).
 * 16-bit wire values (kargs.value_dtype BF16/F16, value_nbytes 2): the
 * gradients stay float; select_into rounds every staged value to the
 * 16-bit dtype (igrad__round16, value16.h: a value that would be Inf
 * clamped to the largest finite one) and adds the rounding error to that
 * entry's residual; the sparse pack writes the 2-byte codes, the sparse unpack
 * decodes them; the dense wire stays F32. FP8 wire values (F8_E4M3,
 * value_nbytes 1, core/value8.h) the same way, each block of the step
 * rounded at its power-of-two scale; the sparse pack writes the scale and
 * the codes, the unpack checks both. Both backends do this (the CUDA one
 * with core/value16.h's and value8.h's host-device functions); a backend
 * that does not must refuse value_dtype != F32 at create.
 * 16-bit gradients (kargs.grad_dtype BF16/F16): grads[t] points at
 * uint16_t codes (cast to float *); every stage reads them upcast to F32
 * (exact), the residuals and velocities stay F32, unpack defers to
 * unpack16 and zero writes 16-bit zeros. A backend without unpack16 gets
 * no such engine (igrad_engine_create refuses it).
 *
 * Not here: what is sent, when and where (the control plane above).
 */
#ifndef IGRAD_DP_H
#define IGRAD_DP_H

#include "plan/plan.h"
#include "plan/route.h"
#include "plan/step.h"

struct igrad__dp_ops;

/* The data-plane memory part of an engine: everything in the backend's
 * memory space that outlives a step. */
typedef struct igrad__dp_mem {
    const struct igrad__dp_ops *dp;     /* the backend: every access to gradient,
                                           residual, velocity and bucket memory */
    void *dp_stream;                    /* the backend's queue (a CUDA stream;
                                           NULL: its default; host: unused) */
    void *dp_state;                     /* the backend's own per-engine state
                                           (CUDA: device scratch), NULL until used */
    float **residual;                   /* (ntensors) n floats each, NULL for dense */
    float **velocity;                   /* (ntensors) NULL unless kargs.momentum > 0 */
    float *residual_mem;                /* all residuals, layout order */
    int64_t residual_count;
    float *velocity_mem;                /* all velocities (momentum > 0), layout order */
    int64_t velocity_count;             /* residual_count, or 0 without momentum */
    unsigned char *send_arena;
    size_t send_arena_nbytes;
    unsigned char *recv_arena;
    size_t recv_arena_nbytes;
    igrad_select_ws_t **ws;             /* (nthreads) selection workspaces */
    float *stream_scratch;              /* streamed steps: nthreads x count floats */
    size_t stream_scratch_count;        /* per thread: the largest tensor (twice
                                           with momentum); 0 before the first open */
} igrad__dp_mem_t;

/* dp_mem.c: the memory part for plan (mem->dp set, the arenas' sizes
 * set): staged selection (in step), arenas, residuals and velocities
 * (zeroed, momentum > 0 only); what it made is freed by the engine.
 * igrad__dp_mem_point points residual[t] and velocity[t] at tensor t's
 * share of residual_mem and velocity_mem (NULL where there is none). */
igrad_status_t igrad__dp_mem_alloc(igrad__dp_mem_t *mem, const igrad__plan_t *plan,
                                   igrad__step_t *step);
void igrad__dp_mem_point(igrad__dp_mem_t *mem, const igrad__plan_t *plan);

/* Every stage takes the engine's three parts: the plan (read only), the
 * step (the control plane's gate, blocks and buckets; the stages' staged
 * selection and per-tensor results) and the data-plane memory. */
#define IGRAD__DP_ARGS const igrad__plan_t *plan, igrad__step_t *step, igrad__dp_mem_t *mem
#define IGRAD__DP_CARGS                                                                        \
    const igrad__plan_t *plan, const igrad__step_t *step, const igrad__dp_mem_t *mem

typedef struct igrad__dp_ops {
    const char *name;          /* "cpu" */
    igrad__mem_space_t space;  /* of gradients, residuals, velocities, buckets */

    /* nbytes in `space` (zeroed when asked); NULL when out of memory.
     * alloc(0) returns a valid pointer. free(NULL) is a no-op. copy moves
     * nbytes from host memory into `space`. */
    void *(*alloc)(size_t nbytes, int zeroed);
    void (*free)(void *p);
    void (*copy_in)(void *dst, const void *src, size_t nbytes);
    /* Copies nbytes from `space` (src) into host memory (dst), ordered
     * after the engine's queued work and finished on return (CUDA: on
     * mem->dp_stream, then a wait). IGRAD_OK, or a recorded error. */
    igrad_status_t (*copy_out)(IGRAD__DP_CARGS, void *dst, const void *src,
                               size_t nbytes);
    /* Copies nbytes within `space` (src to dst, not overlapping), ordered
     * after the engine's queued work (CUDA: queued on mem->dp_stream, not
     * waited for): the two-level sync's shard result into the gradients.
     * IGRAD_OK, or a recorded error. */
    igrad_status_t (*copy)(IGRAD__DP_CARGS, void *dst, const void *src, size_t nbytes);

    /* step->tnorm[t] = sum over t of a^2 in double (a = m*u + g + e; no e
     * for the dense method), for every tensor: non-finite iff some a is.
     * Reads only gradients, residuals and velocities. The gate is known
     * by then (step->sent, step->rel, step->stage_off; tstatus 0): a backend may
     * also run the sent tensors' read-only selection pass 1 here, writing
     * only the staged selection and its own state for select_into, and
     * report a failure of it other than non-finite in step->tstatus[t] (the
     * step is then skipped on every rank, like a non-finite one). */
    void (*check)(IGRAD__DP_ARGS, float *const *grads);
    /* After check found tensor t non-finite: its first bad index (0 if
     * none is found) and, as host copies, g, u (0 without momentum) and
     * the residual (0 for the dense method) there. */
    int64_t (*first_bad)(IGRAD__DP_CARGS, float *const *grads, size_t t,
                         float *g, float *u, float *r);
    /* The sent tensors' selections into step->stage_idx/stage_val at
     * step->stage_off[t] (error feedback, remedies; finishing what check
     * started), the others accumulated or dropped; per tensor
     * step->tstatus, tsumsq, tnorm (the residual's sum of squares, from
     * check's) and tdropped. With `zero` every gradient is also zeroed in
     * the pass that reads it. Runs only after check, on the same
     * gradients, with nothing written to them in between. */
    void (*select_into)(IGRAD__DP_ARGS, float *const *grads, int zero);
    /* Bucket j of the step into its send bytes (per wire layout). */
    void (*pack[IGRAD__NWIRES])(IGRAD__DP_ARGS, size_t j, float *const *grads);
    /* Bucket j's received bytes into grads; checks every received index
     * (IGRAD_E_COMM naming the rank on a bad one). The sparse all-reduce's
     * wire (IGRAD__WIRE_SAR; NULL in a backend without it, whose engines
     * refuse collective sparse_reduce at create) reads step->sar[j]'s result
     * (in this backend's memory: the row `sar` made it) and also adds this
     * rank's remainder into its residuals. */
    igrad_status_t (*unpack[IGRAD__NWIRES])(IGRAD__DP_ARGS, size_t j, float *const *grads);
    /* The sparse all-reduce's data steps in this backend's memory
     * (sparse_allreduce.h; NULL in a backend without the SAR wire). */
    const struct igrad__sar_ops *sar;
    /* 16-bit gradients only (NULL in a backend without them): after the
     * last bucket arrived, every bucket's bytes, tensor by tensor (per
     * tensor: buckets ascending, then ranks, as unpack adds them, so each
     * entry's sum has the F32 order), into an F32 copy of g, then rounded
     * once into g. Checks the indices as unpack does. */
    igrad_status_t (*unpack16)(IGRAD__DP_ARGS, float *const *grads);
    /* Zeroes the gradients unpack adds into (sparse methods: all). */
    void (*zero)(IGRAD__DP_ARGS, float *const *grads);
    /* Frees mem->dp_state (the backend's per-engine state: CPU, the row
     * bounds check leaves for select_into; CUDA, device scratch); NULL
     * when the backend keeps none. Called by igrad_engine_free. */
    void (*release)(IGRAD__DP_ARGS);
    /* Makes mem->dp_state now rather than on first use, so that running
     * out of its memory is said at create (CUDA: device scratch); NULL
     * when the backend makes it lazily. IGRAD_OK, or a recorded error. */
    igrad_status_t (*prepare)(IGRAD__DP_ARGS);

    /* Streamed steps (engine_stream.c); NULL in a backend without them,
     * whose engines refuse igrad_engine_open. stream_ready: for the n
     * tensors listed (their grads are final), check's sum into step->tnorm,
     * then for the sent ones among them whose sum is finite the selection
     * into the staged selection (tstatus, tsumsq, tnorm as select_into
     * leaves them) *without writing residual, velocity or gradient*; a
     * sent tensor with a NULL gradient, a non-finite sum or a failed
     * selection gets a placeholder selection (valid indices, zero values)
     * so that its buckets can still be packed and exchanged. stream_commit:
     * for every tensor, the residual and velocity select_into would have
     * written, recomputed from g, u, e and the staged selection; zeroes
     * every gradient (sparse methods). */
    void (*stream_ready)(IGRAD__DP_ARGS, float *const *grads, const size_t *tensors,
                         size_t n);
    void (*stream_commit)(IGRAD__DP_ARGS, float *const *grads);
} igrad__dp_ops_t;

/* A received index v, entry k of block bi from rank r, outside [0, bound)
 * of its tensor or row: IGRAD_E_COMM naming the rank whose bytes are bad,
 * the bucket and the tensor. Every rank receives the same bytes, so every
 * rank that unpacks this bucket fails with this message (every backend's
 * unpack; dp_cpu_unpack.c). */
igrad_status_t igrad__dp_bad_index(IGRAD__DP_CARGS, const igrad__step_bucket_t *bk,
                                   const igrad__step_block_t *bi, int r, int64_t k,
                                   uint32_t v, int64_t bound);
/* A compact block's run `run` of rank r's bytes that does not decode (err: a
 * core/wire_code.h reader error), reported naming the step, bucket, rank,
 * tensor, row (or block) and code (dp_cpu_unpack.c; the CUDA unpack too). */
igrad_status_t igrad__dp_bad_code(IGRAD__DP_CARGS, const igrad__step_bucket_t *bk,
                                  const igrad__step_block_t *bi, int r, int64_t run, int err);

/* Received value k of block bi from rank r is not finite (a NaN or Inf
 * F32 or 16-bit code, an FP8 NaN code, or an FP8 code times its scale
 * beyond F32), and an FP8 block's received scale (the 4 bytes at vp) that
 * is not a positive normal power of two: IGRAD_E_COMM as above
 * (dp_cpu_unpack.c; the CUDA unpack too). */
igrad_status_t igrad__dp_bad_value(IGRAD__DP_CARGS, const igrad__step_bucket_t *bk,
                                   const igrad__step_block_t *bi, int r, int64_t k, float v);
igrad_status_t igrad__dp_bad_scale(IGRAD__DP_CARGS, const igrad__step_bucket_t *bk,
                                   const igrad__step_block_t *bi, int r, const unsigned char *vp);

/* The CPU backend (dp_cpu.c). */
extern const igrad__dp_ops_t igrad__dp_cpu;
/* The CUDA backend (dp_cuda*.cu; only in a build with CUDA). */
extern const igrad__dp_ops_t igrad__dp_cuda;

#endif /* IGRAD_DP_H */
