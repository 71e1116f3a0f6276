/*
 * sparse_allreduce.h — the sparse all-reduce (issue 12 part 2): every rank
 * brings k (index, value) entries of one dense index space [0, D), every
 * rank leaves with the same reduced sparse result of at most P·kout
 * disjoint entries, and each rank keeps the part of its own partial sums
 * that re-sparsification dropped (its remainder, which the caller adds to
 * its residual, so nothing is lost). Per-rank volume does not grow with P:
 * about 2·k·(P−1)/P entries when the indices are balanced over the ranges
 * (docs/architecture.md §5.7a, after Ok-Topk and SparCML).
 *
 * Phases, over igrad_comm_t (igrad__comm_alltoallv and allgather):
 *  1. split: [0, D) is cut into P equal index ranges (igrad__sar_range);
 *     the counts, then the entries, go to their range's owner;
 *  2. reduce: the owner sums what it received in rank order (then the
 *     sender's input order), keeps the top kout = ceil(k/P) sums by |sum|
 *     (ties: the lower index) and returns the rest as its remainder;
 *  3. gather: an all-gather of exactly kout entries per rank (padded), so
 *     the result is the owners' kept entries in rank order = index order.
 * Received bytes are untrusted: counts and indices are checked; a local
 * failure, a bad count or a bad index found by an owner becomes the same
 * error on every rank, because it travels in the exchanges that follow
 * (a status all-gather after the counts, the header of phase 3's blocks).
 *
 * Not here: which entries a bucket sends (the engine's selection), the
 * residual the remainder goes to, the route (route.c).
 */
#ifndef IGRAD_SPARSE_ALLREDUCE_H
#define IGRAD_SPARSE_ALLREDUCE_H

#include "internal.h"

#include <stddef.h>
#include <stdint.h>

/* One entry, as it travels (8 bytes, host byte order as every wire here). */
typedef struct igrad__sar_entry {
    uint32_t index; /* in [0, D) */
    float value;
} igrad__sar_entry_t;

/* What one call moved for this rank, in bytes (counted, not modelled,
 * except that an all-gather is counted as the (P-1) blocks this rank
 * receives from the others). */
typedef struct igrad__sar_bytes {
    uint64_t split_sent;    /* phase 1 to other ranks: counts + entries */
    uint64_t split_recv;    /* phase 1 from other ranks: counts + entries */
    uint64_t status_recv;   /* the status all-gather: (P-1) records */
    uint64_t gather_recv;   /* phase 3: (P-1) blocks of header + kout entries */
} igrad__sar_bytes_t;

/* Reusable workspace and the results of the last successful call. Zero it
 * before the first call (`igrad__sar_t w = {0}`); igrad__sar_clear frees
 * what it holds. The result and remainder point into it and stay valid
 * until the next call or the clear. */
typedef struct igrad__sar {
    const igrad__sar_entry_t *result; /* same on every rank, ascending index */
    size_t result_count;              /* <= P * kout */
    const igrad__sar_entry_t *remainder; /* this rank's dropped partial sums,
                                            ascending index */
    size_t remainder_count;
    igrad__sar_bytes_t bytes;
    /* workspace (grown as needed) */
    void *buf[10];
    size_t cap[10];
} igrad__sar_t;

/* Entries each owner keeps: ceil(k / P) (0 for k = 0). */
size_t igrad__sar_kout(size_t k, int P);

/* The index range [*lo, *hi) that rank r of P owns: lo = floor(D·r/P).
 * Equal ranges (sizes differ by at most one; some are empty when D < P). */
void igrad__sar_range(uint64_t dense_count, int P, int r, uint64_t *lo, uint64_t *hi);

/* The collective: this rank's k entries `in` (indices < dense_count, finite
 * values, duplicates allowed: they add up in input order). k and
 * dense_count must be the same on every rank (checked: IGRAD_E_MISMATCH);
 * dense_count <= 2^32. Blocking; call it on every rank of `comm`.
 * @return IGRAD_OK with w->result / w->remainder set; IGRAD_E_INVALID for
 * NULL w or comm (no exchange) or, on every rank, a rank's bad input;
 * IGRAD_E_UNSUPPORTED for a comm without alltoallv (NCCL; custom without ops->alltoallv);
 * IGRAD_E_COMM on every rank when an owner received a count or index
 * outside its range, naming the ranks; IGRAD_E_COMM on this rank alone when
 * phase 3's bytes from a rank are inconsistent (as the gather route's
 * unpack); IGRAD_E_NOMEM; the comm's own errors (IGRAD_E_COMM,
 * IGRAD_E_TIMEOUT). On failure the result and remainder are empty. */
igrad_status_t igrad__sar_allreduce(igrad__sar_t *w, igrad_comm_t *comm, uint64_t dense_count,
                                    size_t k, const igrad__sar_entry_t *in);

/* Frees the workspace; w is zeroed (ready for reuse). NULL is a no-op. */
void igrad__sar_clear(igrad__sar_t *w);

#endif /* IGRAD_SPARSE_ALLREDUCE_H */
