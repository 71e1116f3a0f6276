/*
 * dp_cpu.h — what the CPU data-plane files (dp_cpu*.c) share: the
 * vectorization pragmas and the stage functions the table row in
 * dp_cpu.c points at. The table itself is dp.h.
 */
#ifndef IGRAD_DP_CPU_H
#define IGRAD_DP_CPU_H

#include "dp/dp.h"

/* Sums of squares vectorize only when the compiler may reorder them; with
 * OpenMP, "omp simd" says so. The order is fixed by the build, not by the
 * thread count, so every rank of one build gets the same bits. */
#ifdef _OPENMP
#define SIMD_SUM _Pragma("omp simd reduction(+ : s)")
#define SIMD _Pragma("omp simd")
#else
#define SIMD_SUM
#define SIMD
#endif

/* The CPU backend's per-engine state (mem->dp_state, dp_cpu_mem.c): the
 * row bounds of the few-per-row selection path (select_internal.h), kept
 * from the check, where selection pass 1 runs, to select_into, where pass
 * 2 uses them. Offsets per tensor, room for its largest row-wise spec. */
typedef struct igrad__dp_cpu_state {
    int32_t *bound;
    int64_t *bound_off; /* (ntensors) */
    /* 16-bit gradients (plan->kargs.grad_dtype) only, else NULL: per thread an F32
     * copy of the tensor it works on (room for the largest), and for
     * unpack16 a grads array whose every entry is g32[0]. */
    float **g32;    /* (nthreads) */
    float **alias;  /* (ntensors) */
} igrad__dp_cpu_state_t;

/* mem->dp_state, made on first use; NULL when out of memory. */
igrad__dp_cpu_state_t *igrad__dp_cpu_state(IGRAD__DP_ARGS);
void igrad__dp_cpu_release(IGRAD__DP_ARGS);

/* Tensor t's gradient as F32: grads[t] itself, or with 16-bit gradients
 * its upcast into thread tid's copy (cs from igrad__dp_cpu_state). */
float *igrad__dp_cpu_grad(IGRAD__DP_CARGS, const igrad__dp_cpu_state_t *cs, float *const *grads,
                          size_t t, int tid);
/* Zeroes tensor t's gradient in its own dtype. */
void igrad__dp_cpu_zero_grad(IGRAD__DP_CARGS, float *const *grads, size_t t);

/* Does tensor t's selection start in the check (its pass 1 fused with the
 * finiteness check) and finish in select_into? Sent tensors of a sparse
 * method without momentum (whose selection reads m*u + g, which is formed
 * only after the ranks agreed). */
int igrad__dp_cpu_fused(IGRAD__DP_CARGS, size_t t);

/* dp_cpu_check.c */
void igrad__dp_cpu_check(IGRAD__DP_ARGS, float *const *grads);
/* The check's sum of a^2 in double, a = (m*u + g) + e (u given), g + e,
 * or g (e NULL, the dense method); the streamed step sums the same way. */
double igrad__dp_cpu_sumsq(const float *g, const float *u, const float *e, float m, int64_t n);
int64_t igrad__dp_cpu_first_bad(IGRAD__DP_CARGS, float *const *grads, size_t t, float *g, float *u,
                                float *r);
/* dp_cpu_select.c */
void igrad__dp_cpu_select_into(IGRAD__DP_ARGS, float *const *grads, int zero);
/* Position in the tensor of selected entry k of a selection (idx) of spec
 * sp (a dense spec keeps every entry in place). */
static inline int64_t igrad__dp_cpu_sel_pos(const igrad_select_spec_t *sp, const uint32_t *idx,
                                            int64_t k)
{
    if (sp->count == sp->n) return k;
    if (!sp->row_wise) return (int64_t)idx[k];
    return k / sp->per_row * sp->cols + (int64_t)idx[k];
}
/* FP8 wire values (config.value_dtype F8_E4M3, core/value8.h): tensor t's
 * staged selection (idx, val: sp->count entries, its values a) rounded in
 * place, block by block as the step cuts it (the tensor's blk_entries),
 * each at its block's scale; with r (whose selected entries hold 0) each
 * selected entry's residual becomes a - q (exact). Returns the sum of
 * (a - q)^2. */
double igrad__dp_cpu_round8(IGRAD__DP_CARGS, size_t t, const uint32_t *idx, float *val, float *r);
/* The dtype select.c rounds staged values to: the 16-bit value dtype, or
 * F32 (no rounding there) for F32 and FP8 (igrad__dp_cpu_round8 after). */
static inline igrad_dtype_t igrad__dp_cpu_round16_dtype(const igrad__plan_t *plan)
{
    igrad_dtype_t vt = plan->kargs.value_dtype;
    return vt == IGRAD_DTYPE_BF16 || vt == IGRAD_DTYPE_F16 ? vt : IGRAD_DTYPE_F32;
}
/* A tensor not sent: accumulated or dropped, g zeroed with `zero`
 * (dp_cpu_select.c; the streamed step's commit too). */
void igrad__dp_cpu_accumulate(IGRAD__DP_ARGS, size_t t, float *g, int zero);
/* dp_cpu_pack.c */
void igrad__dp_cpu_pack_sparse(IGRAD__DP_ARGS, size_t j, float *const *grads);
void igrad__dp_cpu_pack_dense(IGRAD__DP_ARGS, size_t j, float *const *grads);
void igrad__dp_cpu_pack_sar(IGRAD__DP_ARGS, size_t j, float *const *grads);
/* dp_cpu_unpack.c */
igrad_status_t igrad__dp_cpu_unpack_sparse(IGRAD__DP_ARGS, size_t j, float *const *grads);
igrad_status_t igrad__dp_cpu_unpack_dense(IGRAD__DP_ARGS, size_t j, float *const *grads);
igrad_status_t igrad__dp_cpu_unpack_sar(IGRAD__DP_ARGS, size_t j, float *const *grads);
igrad_status_t igrad__dp_cpu_unpack16(IGRAD__DP_ARGS, float *const *grads);
/* dp_cpu_stream.c */
void igrad__dp_cpu_stream_ready(IGRAD__DP_ARGS, float *const *grads, const size_t *tensors,
                                size_t n);
void igrad__dp_cpu_stream_commit(IGRAD__DP_ARGS, float *const *grads);
/* dp_cpu_mem.c */
void *igrad__dp_cpu_alloc(size_t nbytes, int zeroed);
void igrad__dp_cpu_free(void *p);
void igrad__dp_cpu_copy_in(void *dst, const void *src, size_t nbytes);
igrad_status_t igrad__dp_cpu_copy_out(IGRAD__DP_CARGS, void *dst, const void *src, size_t nbytes);
void igrad__dp_cpu_zero(IGRAD__DP_ARGS, float *const *grads);

#endif /* IGRAD_DP_CPU_H */
