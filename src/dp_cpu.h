/*
 * dp_cpu.h — what the CPU data-plane files (dp_cpu*.c) share: the
 * vectorization pragmas and the stage functions the table row in
 * dp_cpu.c points at. The table itself is dp.h.
 */
#ifndef IGRAD_DP_CPU_H
#define IGRAD_DP_CPU_H

#include "dp.h"

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

/* dp_cpu_check.c */
void igrad__dp_cpu_check(igrad_engine_t *e, float *const *grads);
int64_t igrad__dp_cpu_first_bad(const igrad_engine_t *e, float *const *grads, size_t t,
                                float *g, float *u, float *r);
/* dp_cpu_select.c */
void igrad__dp_cpu_select_into(igrad_engine_t *e, float *const *grads, int zero);
/* dp_cpu_pack.c */
void igrad__dp_cpu_pack_sparse(igrad_engine_t *e, size_t j, float *const *grads);
void igrad__dp_cpu_pack_dense(igrad_engine_t *e, size_t j, float *const *grads);
/* dp_cpu_unpack.c */
igrad_status_t igrad__dp_cpu_unpack_sparse(igrad_engine_t *e, size_t j, float *const *grads);
igrad_status_t igrad__dp_cpu_unpack_dense(igrad_engine_t *e, size_t j, float *const *grads);
/* dp_cpu_stream.c */
void igrad__dp_cpu_stream_ready(igrad_engine_t *e, float *const *grads, const size_t *tensors,
                                size_t n);
void igrad__dp_cpu_stream_commit(igrad_engine_t *e, float *const *grads);
/* dp_cpu_mem.c */
void *igrad__dp_cpu_alloc(size_t nbytes, int zeroed);
void igrad__dp_cpu_free(void *p);
void igrad__dp_cpu_copy_in(void *dst, const void *src, size_t nbytes);
igrad_status_t igrad__dp_cpu_copy_out(const igrad_engine_t *e, void *dst, const void *src,
                                      size_t nbytes);
void igrad__dp_cpu_zero(igrad_engine_t *e, float *const *grads);

#endif /* IGRAD_DP_CPU_H */
