/*
 * dp.h — the engine's data plane: the table of operations that touch
 * gradient, residual, velocity and bucket memory, one row per backend
 * (the CPU one is dp_cpu*.c; a CUDA one would be a second row). The
 * control plane — config, plan, budgets and select specs, schedule,
 * packing policies, bucket routes, agreement, statistics (engine.c,
 * schedule.c, pack.c, route.c, select.c's spec arithmetic) — decides what
 * happens and reaches that memory only through these calls; it reads the
 * per-tensor results the stages leave in the engine (tnorm, tsumsq,
 * tdropped, tstatus), never the memory itself.
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
 * 16-bit wire values (cfg.value_dtype BF16/F16, e->value_nbytes 2): the
 * gradients stay float; select_into rounds every staged value to the
 * 16-bit dtype (igrad__round16, value16.h: a value that would be Inf
 * clamped to the largest finite one) and adds the rounding error to that
 * entry's residual; the sparse pack writes the 2-byte codes, the sparse unpack
 * decodes them; the dense wire stays F32. A backend that does not do this
 * must refuse value_dtype != F32.
 * 16-bit gradients (cfg.grad_dtype BF16/F16): grads[t] points at
 * uint16_t codes (cast to float *); every stage reads them upcast to F32
 * (exact), the residuals and velocities stay F32, unpack defers to
 * unpack16 and zero writes 16-bit zeros. A backend without unpack16 gets
 * no such engine (igrad_engine_create refuses it).
 *
 * Not here: what is sent, when and where (the control plane above).
 */
#ifndef IGRAD_DP_H
#define IGRAD_DP_H

#include "engine/engine_internal.h"
#include "plan/route.h"

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
     * e->dp_stream, then a wait). IGRAD_OK, or a recorded error. */
    igrad_status_t (*copy_out)(const igrad_engine_t *e, void *dst, const void *src,
                               size_t nbytes);
    /* Copies nbytes within `space` (src to dst, not overlapping), ordered
     * after the engine's queued work (CUDA: queued on e->dp_stream, not
     * waited for): the two-level sync's shard result into the gradients.
     * IGRAD_OK, or a recorded error. */
    igrad_status_t (*copy)(const igrad_engine_t *e, void *dst, const void *src, size_t nbytes);

    /* e->tnorm[t] = sum over t of a^2 in double (a = m*u + g + e; no e
     * for the dense method), for every tensor: non-finite iff some a is.
     * Reads only gradients, residuals and velocities. The gate is known
     * by then (e->sent, e->rel, e->stage_off; tstatus 0): a backend may
     * also run the sent tensors' read-only selection pass 1 here, writing
     * only the staged selection and its own state for select_into, and
     * report a failure of it other than non-finite in e->tstatus[t] (the
     * step is then skipped on every rank, like a non-finite one). */
    void (*check)(igrad_engine_t *e, float *const *grads);
    /* After check found tensor t non-finite: its first bad index (0 if
     * none is found) and, as host copies, g, u (0 without momentum) and
     * the residual (0 for the dense method) there. */
    int64_t (*first_bad)(const igrad_engine_t *e, float *const *grads, size_t t,
                         float *g, float *u, float *r);
    /* The sent tensors' selections into e->stage_idx/stage_val at
     * e->stage_off[t] (error feedback, remedies; finishing what check
     * started), the others accumulated or dropped; per tensor
     * e->tstatus, tsumsq, tnorm (the residual's sum of squares, from
     * check's) and tdropped. With `zero` every gradient is also zeroed in
     * the pass that reads it. Runs only after check, on the same
     * gradients, with nothing written to them in between. */
    void (*select_into)(igrad_engine_t *e, float *const *grads, int zero);
    /* Bucket j of the step into its send bytes (per wire layout). */
    void (*pack[IGRAD__NWIRES])(igrad_engine_t *e, size_t j, float *const *grads);
    /* Bucket j's received bytes into grads; checks every received index
     * (IGRAD_E_COMM naming the rank on a bad one). The sparse all-reduce's
     * wire (IGRAD__WIRE_SAR; NULL in a backend without it, whose engines
     * refuse collective sparse_reduce at create) reads e->sar[j]'s result
     * (in this backend's memory: the row `sar` made it) and also adds this
     * rank's remainder into its residuals. */
    igrad_status_t (*unpack[IGRAD__NWIRES])(igrad_engine_t *e, size_t j, float *const *grads);
    /* The sparse all-reduce's data steps in this backend's memory
     * (sparse_allreduce.h; NULL in a backend without the SAR wire). */
    const struct igrad__sar_ops *sar;
    /* 16-bit gradients only (NULL in a backend without them): after the
     * last bucket arrived, every bucket's bytes, tensor by tensor (per
     * tensor: buckets ascending, then ranks, as unpack adds them, so each
     * entry's sum has the F32 order), into an F32 copy of g, then rounded
     * once into g. Checks the indices as unpack does. */
    igrad_status_t (*unpack16)(igrad_engine_t *e, float *const *grads);
    /* Zeroes the gradients unpack adds into (sparse methods: all). */
    void (*zero)(igrad_engine_t *e, float *const *grads);
    /* Frees e->dp_state (the backend's per-engine state: CPU, the row
     * bounds check leaves for select_into; CUDA, device scratch); NULL
     * when the backend keeps none. Called by igrad_engine_free. */
    void (*release)(igrad_engine_t *e);

    /* Streamed steps (engine_stream.c); NULL in a backend without them,
     * whose engines refuse igrad_engine_open. stream_ready: for the n
     * tensors listed (their grads are final), check's sum into e->tnorm,
     * then for the sent ones among them whose sum is finite the selection
     * into the staged selection (tstatus, tsumsq, tnorm as select_into
     * leaves them) *without writing residual, velocity or gradient*; a
     * sent tensor with a NULL gradient, a non-finite sum or a failed
     * selection gets a placeholder selection (valid indices, zero values)
     * so that its buckets can still be packed and exchanged. stream_commit:
     * for every tensor, the residual and velocity select_into would have
     * written, recomputed from g, u, e and the staged selection; zeroes
     * every gradient (sparse methods). */
    void (*stream_ready)(igrad_engine_t *e, float *const *grads, const size_t *tensors,
                         size_t n);
    void (*stream_commit)(igrad_engine_t *e, float *const *grads);
} igrad__dp_ops_t;

/* A received index v, entry k of block bi from rank r, outside [0, bound)
 * of its tensor or row: IGRAD_E_COMM naming the rank whose bytes are bad,
 * the bucket and the tensor. Every rank receives the same bytes, so every
 * rank that unpacks this bucket fails with this message (every backend's
 * unpack; dp_cpu_unpack.c). */
igrad_status_t igrad__dp_bad_index(const igrad_engine_t *e, const igrad__engine_bucket_t *bk,
                                   const igrad__engine_block_t *bi, int r, int64_t k,
                                   uint32_t v, int64_t bound);

/* The CPU backend (dp_cpu.c). */
extern const igrad__dp_ops_t igrad__dp_cpu;
/* The CUDA backend (dp_cuda*.cu; only in a build with CUDA). */
extern const igrad__dp_ops_t igrad__dp_cuda;

#endif /* IGRAD_DP_H */
