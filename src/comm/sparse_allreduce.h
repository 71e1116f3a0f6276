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
 * Phases, over igrad_comm_t (igrad__comm_alltoallv and allgather), the
 * data steps in one memory space through a backend table (igrad__sar_ops_t:
 * the host's here, CUDA's in sparse_allreduce_cuda.cu):
 *  1. split: [0, D) is cut into P index ranges at P + 1 split points
 *     agreed on every rank (igrad__sar_t.bounds): equal ranges
 *     (igrad__sar_range), or, where the caller asks for it (balanced),
 *     equal on the first call over an index space and then the balanced
 *     ones the previous call's receive histogram over the same index
 *     space gave (igrad__sar_next_bounds; kept for IGRAD__SAR_MEMO index
 *     spaces at once);
 *     the counts, then the entries, go to their range's owner;
 *  2. reduce: the owner sums what it received in rank order (then the
 *     sender's input order), keeps the top kout = ceil(k/P) sums by |sum|
 *     (ties: the lower index) and returns the rest as its remainder;
 *  3. gather: an all-gather of exactly kout entries per rank (padded), so
 *     the result is the owners' kept entries in rank order = index order.
 *     Each block's header also carries a histogram of what its owner
 *     received (IGRAD__SAR_HIST counts over equal parts of its range), so
 *     every rank holds the same bytes, measures the busiest receiver
 *     (igrad__sar_t.balance) and derives the same next split points
 *     (Ok-Topk's balanced split, S. Li and T. Hoefler, PPoPP 2022, from
 *     the previous step's distribution instead of a sampled one).
 * Received bytes are untrusted: counts and indices are checked; a local
 * failure, a bad count or a bad index found by an owner becomes the same
 * error on every rank, because it travels in the exchanges that follow
 * (a status all-gather after the counts, the header of phase 3's blocks).
 *
 * Not here: which entries a bucket sends (the engine's selection), the
 * residual the remainder goes to, the route (route.c), the CUDA kernels.
 */
#ifndef IGRAD_SPARSE_ALLREDUCE_H
#define IGRAD_SPARSE_ALLREDUCE_H

#include "core/internal.h"

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

/* Counts per owner in the receive histogram of a phase-3 header: the
 * owner's range [lo, hi) in IGRAD__SAR_HIST equal parts
 * (igrad__sar_hist_bin). */
#define IGRAD__SAR_HIST 8

/* Index spaces whose balanced split points a workspace keeps at once. */
#define IGRAD__SAR_MEMO 8

/* Why a rank cannot go on. Travels in the status records and the phase-3
 * headers, so the numbers are fixed. */
typedef enum igrad__sar_reason {
    IGRAD__SAR_OK = 0,
    IGRAD__SAR_NO_INPUT = 1,    /* k > 0 but no input buffer */
    IGRAD__SAR_INPUT_INDEX = 2, /* where: input position, value: its index */
    IGRAD__SAR_INPUT_VALUE = 3, /* where: input position, value: the float's bits */
    IGRAD__SAR_DENSE_COUNT = 4, /* value: D, above 2^32 */
    IGRAD__SAR_NOMEM = 5,       /* value: bytes asked for */
    IGRAD__SAR_RECV_COUNT = 6,  /* where: the sending rank, value: its count */
    IGRAD__SAR_RECV_TOTAL = 7,  /* value: entries to receive, above one owner's limit */
    IGRAD__SAR_RECV_INDEX = 8,  /* where: the sending rank, value: the index */
    IGRAD__SAR_BACKEND = 9      /* where: the stage, value: the igrad_status_t
                                   (a device error; that rank's own message has it) */
} igrad__sar_reason_t;

typedef struct igrad__sar_report {
    uint32_t reason; /* igrad__sar_reason_t */
    uint32_t check;  /* status records: a hash of the split points this rank
                        used (they must agree); phase-3 headers: 0 */
    uint64_t where;
    uint64_t value;
} igrad__sar_report_t;

/* The head of a phase-3 block; kout entries follow (the real ones, then
 * zero padding). */
typedef struct igrad__sar_header {
    igrad__sar_report_t report;
    uint64_t nkept;                 /* real entries */
    uint32_t hist[IGRAD__SAR_HIST]; /* entries this owner received (phase 1),
                                       per part of its range */
} igrad__sar_header_t;

/* The owners' load in one call, from the phase-3 headers (the same on
 * every rank): entries received in phase 1, counted at their owner
 * (this rank's own entries to itself included; 8 bytes each). */
typedef struct igrad__sar_balance {
    uint64_t recv_max;   /* the busiest owner's entries */
    uint64_t recv_total; /* all owners' (= P k); mean = recv_total / P */
    int busiest;         /* the lowest rank with recv_max */
} igrad__sar_balance_t;

/* Workspace slots of igrad__sar_t: the first IGRAD__SAR_HOST_SLOTS are
 * host memory (the protocol's own arrays), the others the backend's
 * memory space (igrad__sar_ops_t.alloc); IGRAD__SAR_SCRATCH and after are
 * the backend's own scratch. */
enum {
    IGRAD__SAR_WS_COUNTS,  /* host: 2P u64, counts sent, counts received */
    IGRAD__SAR_WS_SIZES,   /* host: 4P size_t, the alltoallv's bytes and displacements */
    IGRAD__SAR_WS_RECORDS, /* host: P status records */
    IGRAD__SAR_WS_HEADS,   /* host: P phase-3 headers, as received */
    IGRAD__SAR_WS_BOUNDS,  /* host: 2(P+1) u64, this call's split points, the next's;
                              the histograms; IGRAD__SAR_MEMO(P+1) kept ones */
    IGRAD__SAR_HOST_SLOTS,
    IGRAD__SAR_WS_DCOUNTS = IGRAD__SAR_HOST_SLOTS, /* 2P u64 counts (device backends) */
    IGRAD__SAR_WS_DBOUNDS,   /* P+1 u64 split points (device backends) */
    IGRAD__SAR_WS_SEND,      /* k entries, grouped by owner */
    IGRAD__SAR_WS_RECV,      /* the entries received, in rank order */
    IGRAD__SAR_WS_REMAINDER, /* this rank's remainder */
    IGRAD__SAR_WS_BLOCKS,    /* P phase-3 blocks */
    IGRAD__SAR_WS_RESULT,    /* the reduced result */
    IGRAD__SAR_SCRATCH,
    IGRAD__SAR_SLOTS = 28
};

struct igrad__sar_ops;

/* Reusable workspace and the results of the last successful call. Zero it
 * before the first call (`igrad__sar_t w = {0}`); igrad__sar_clear frees
 * what it holds. The result and remainder point into it, in the memory
 * space of the backend that made them (`ops`), and stay valid until the
 * next call or the clear. */
typedef struct igrad__sar {
    const igrad__sar_entry_t *result; /* same on every rank, ascending index */
    size_t result_count;              /* <= P * kout */
    const igrad__sar_entry_t *remainder; /* this rank's dropped partial sums,
                                            ascending index */
    size_t remainder_count;
    igrad__sar_bytes_t bytes;
    const uint64_t *bounds;       /* the P + 1 split points the last call used
                                     (host; owner r had [bounds[r], bounds[r+1])) */
    igrad__sar_balance_t balance; /* the owners' load in the last call */
    int balanced;                 /* set by the caller: split points from the
                                     last call's histograms (0: always equal
                                     ranges, the algorithm before issue 28) */
    int resplit;                  /* the last call did phase 1 twice: the ranks'
                                     split points differed, equal ranges then */
    uint64_t space_key;           /* set by the caller: names the index space
                                     (with the dense_count) that the kept split
                                     points are for, e.g. a hash of which
                                     tensors lie where in it (0: the
                                     dense_count alone) */
    int next_valid;               /* split points are kept for next_ranks
                                     ranks (memo_*; 0: equal ranges next) */
    int next_ranks;
    /* the split points kept for the next calls, one entry per index space
     * (a bucket slot of the engine alternates between the index spaces of
     * its steps' tensor sets): the entry's dense_count (0: empty), its
     * space_key and when
     * it was stored (a count of stores; a full table replaces its least
     * recently stored entry); the points in the WS_BOUNDS slot */
    uint64_t memo_dense_count[IGRAD__SAR_MEMO];
    uint64_t memo_key[IGRAD__SAR_MEMO];
    uint64_t memo_stamp[IGRAD__SAR_MEMO];
    uint64_t stores;
    const struct igrad__sar_ops *ops; /* the backend holding the workspace */
    /* workspace (grown as needed) */
    void *buf[IGRAD__SAR_SLOTS];
    size_t cap[IGRAD__SAR_SLOTS];
} igrad__sar_t;

/* The data steps of the sparse all-reduce in one memory space: one row
 * per backend (igrad__sar_host below in sparse_allreduce.c, igrad__sar_cuda
 * in sparse_allreduce_cuda.cu). The protocol around them — the
 * exchanges, the checks of what arrives, the status records, every
 * message — is sparse_allreduce.c's and the same for all. Every function
 * gets the backend's queue (`stream`, NULL for the host); what it writes
 * in `space` is ready for whatever is queued after it there (copy_in and
 * copy_out return complete, and host results, counts and positions, are
 * final on return). A function that fails returns a
 * recorded error; the protocol turns it into a report (IGRAD__SAR_BACKEND)
 * so that every rank fails alike, this one with the backend's message. */
typedef struct igrad__sar_ops {
    const char *name;         /* "host", "cuda" (messages) */
    igrad__mem_space_t space; /* of the input, the exchanged buffers, result, remainder */
    /* nbytes in `space` (contents undefined); NULL when out of memory. */
    void *(*alloc)(size_t nbytes);
    void (*free)(void *p);
    /* nbytes of host memory into `space`; height rows of width bytes out
     * of it into host memory (row pitches dpitch, spitch). */
    igrad_status_t (*copy_in)(void *stream, void *dst, const void *src, size_t nbytes);
    igrad_status_t (*copy_out)(void *stream, void *dst, size_t dpitch, const void *src,
                               size_t spitch, size_t width, size_t height);
    /* Phase 1, local: the first of the k entries `in` whose index is >= D
     * or whose value is not finite into *rep (IGRAD__SAR_INPUT_INDEX /
     * _VALUE; D <= 2^32 and in != NULL are checked before); else the
     * entries counted per owner (igrad__sar_owner_of the P + 1 split
     * points `bounds`, in `space`) into send_counts (host, P) and grouped
     * by owner, each group in input order, into *send (slot
     * IGRAD__SAR_WS_SEND; IGRAD__SAR_NOMEM into *rep when it cannot be
     * had). */
    igrad_status_t (*split)(igrad__sar_t *w, void *stream, uint64_t D, int P,
                            const uint64_t *bounds, size_t k, const igrad__sar_entry_t *in,
                            uint64_t *send_counts, igrad__sar_report_t *rep,
                            igrad__sar_entry_t **send);
    /* The backend's scratch (slots from IGRAD__SAR_SCRATCH) to reduce n
     * received entries: 0, or the bytes it could not get. */
    uint64_t (*reserve)(igrad__sar_t *w, size_t n);
    /* Phase 2 at the owner of [lo, hi): *bad = the first position of the
     * n received entries whose index is outside it (SIZE_MAX: none; then
     * nothing else is done); else the sums per index in the order received
     * (from 0.0f), the kout largest |sum| (by the bits of |sum|; ties: the
     * lower index) into kept and the rest into rem, both ascending by
     * index, their counts into *nkept, *nrem, and the n entries counted
     * per igrad__sar_hist_bin into hist (host, IGRAD__SAR_HIST). kept has
     * room for kout entries, rem for n. */
    igrad_status_t (*reduce)(igrad__sar_t *w, void *stream, const igrad__sar_entry_t *recv,
                             size_t n, uint64_t lo, uint64_t hi, size_t kout,
                             igrad__sar_entry_t *kept, size_t *nkept, igrad__sar_entry_t *rem,
                             size_t *nrem, size_t *bad, uint32_t *hist);
    /* Phase 3: rank r's block (at blocks + r * block_nbytes, its nkept[r]
     * <= kout entries after the header) must have indices ascending inside
     * r's range [bounds[r], bounds[r+1]) (bounds in `space`): the first
     * rank and entry that do not into *bad_rank, *bad_entry, *bad_index
     * (*bad_rank = P: none); the entries of every rank before it, in rank
     * order, into result. */
    igrad_status_t (*collect)(igrad__sar_t *w, void *stream, const unsigned char *blocks,
                              size_t block_nbytes, int P, const uint64_t *nkept,
                              const uint64_t *bounds,
                              igrad__sar_entry_t *result, int *bad_rank, uint64_t *bad_entry,
                              uint32_t *bad_index);
} igrad__sar_ops_t;

/* The host backend (sparse_allreduce.c). */
extern const igrad__sar_ops_t igrad__sar_host;
/* The CUDA backend (sparse_allreduce_cuda.cu; only in a build with CUDA). */
extern const igrad__sar_ops_t igrad__sar_cuda;

/* Entries each owner keeps: ceil(k / P) (0 for k = 0). */
size_t igrad__sar_kout(size_t k, int P);

/* The range and owner arithmetic is shared with the CUDA kernels. */
#ifdef __CUDACC__
#define IGRAD__SAR_HD static inline __host__ __device__
#else
#define IGRAD__SAR_HD static inline
#endif

/* The index range [*lo, *hi) that rank r of P owns: lo = floor(D·r/P).
 * Equal ranges (sizes differ by at most one; some are empty when D < P). */
IGRAD__SAR_HD void igrad__sar_range(uint64_t dense_count, int P, int r, uint64_t *lo,
                                    uint64_t *hi)
{
    /* dense_count <= 2^32 and r <= P < 2^31: the products fit in 64 bits */
    *lo = dense_count * (uint64_t)r / (uint64_t)P;
    *hi = dense_count * (uint64_t)(r + 1) / (uint64_t)P;
}

/* The rank whose range holds index i (< dense_count <= 2^32). */
IGRAD__SAR_HD int igrad__sar_owner(uint64_t dense_count, int P, uint64_t i)
{
    int r = (int)(i * (uint64_t)P / dense_count);
    uint64_t lo, hi;
    for (;;) {
        igrad__sar_range(dense_count, P, r, &lo, &hi);
        if (i < lo) r--;
        else if (i >= hi) r++;
        else return r;
    }
}

/* The rank whose range [bounds[r], bounds[r+1]) holds index i: the last
 * r with bounds[r] <= i (bounds non-decreasing, bounds[0] = 0, i <
 * bounds[P]; empty ranges are skipped). */
IGRAD__SAR_HD int igrad__sar_owner_of(const uint64_t *bounds, int P, uint64_t i)
{
    int lo = 0, hi = P - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (bounds[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The histogram part of index i in [lo, hi): floor((i - lo) H / (hi - lo)). */
IGRAD__SAR_HD int igrad__sar_hist_bin(uint64_t lo, uint64_t hi, uint64_t i)
{
    return (int)((i - lo) * IGRAD__SAR_HIST / (hi - lo));
}

/* The rank key of a sum: larger |sum| first (by the bits of |sum|, a
 * total order), then the lower index; the owner keeps the kout smallest. */
IGRAD__SAR_HD uint64_t igrad__sar_rank_key(uint32_t index, uint32_t value_bits)
{
    return (uint64_t)(0x7fffffffu - (value_bits & 0x7fffffffu)) << 32 | index;
}

/* Slot `slot` of the workspace with room for n items of `size` bytes (host
 * memory for the host slots, the backend's for the others; contents are
 * not kept when it grows), or NULL (out of memory, or n * size
 * overflows). */
void *igrad__sar_workspace(igrad__sar_t *w, int slot, size_t n, size_t size);

/* The collective: this rank's k entries `in` (indices < dense_count, finite
 * values, duplicates allowed: they add up in input order). k and
 * dense_count must be the same on every rank (checked: IGRAD_E_MISMATCH);
 * dense_count <= 2^32. Blocking; call it on every rank of `comm`. `in`, the
 * exchanges and w's result and remainder are in the memory of `ops`
 * (igrad__sar_allreduce: the host), on its queue `stream`; the comm must
 * take that memory in its alltoallv and iallgather.
 * @return IGRAD_OK with w->result / w->remainder set; IGRAD_E_INVALID for
 * NULL w, ops or comm (no exchange) or, on every rank, a rank's bad input;
 * IGRAD_E_UNSUPPORTED for a comm without alltoallv (custom without
 * ops->alltoallv) or one that does not take the backend's memory;
 * IGRAD_E_COMM on every rank when an owner received a count or index
 * outside its range, naming the ranks; IGRAD_E_COMM on this rank alone when
 * phase 3's bytes from a rank are inconsistent (as the gather route's
 * unpack); IGRAD_E_NOMEM; a backend's error on every rank (that rank's
 * own message on it); the comm's own errors (IGRAD_E_COMM,
 * IGRAD_E_TIMEOUT). On failure the result and remainder are empty. */
igrad_status_t igrad__sar_allreduce_on(igrad__sar_t *w, const igrad__sar_ops_t *ops,
                                       void *stream, igrad_comm_t *comm, uint64_t dense_count,
                                       size_t k, const igrad__sar_entry_t *in);
/* The same on the host backend. */
igrad_status_t igrad__sar_allreduce(igrad__sar_t *w, igrad_comm_t *comm, uint64_t dense_count,
                                    size_t k, const igrad__sar_entry_t *in);

/* The P + 1 equal split points: bounds[r] = floor(D r / P). */
void igrad__sar_equal_bounds(uint64_t dense_count, int P, uint64_t *bounds);

/* The next call's split points from this call's (`bounds`) and the P
 * owners' receive histograms (hist[r * IGRAD__SAR_HIST + j]: entries owner
 * r received in part j of its range): with N entries in all, split point
 * s (0 < s < P) is where the histogram's cumulative count reaches
 * floor(N s / P), read linearly inside the part that holds it, so each
 * owner would have received ~N / P (as balanced as whole parts and single
 * indices allow; the next call refines inside the parts). Hysteresis:
 * while the busiest owner has at most 1.05x the mean (or N = 0), `bounds`
 * are kept, so that good split points do not chase noise (Ok-Topk reuses
 * its boundaries over iterations). Integer arithmetic only: the same
 * bytes in, the same split points out, on every rank. next may not alias
 * bounds. */
void igrad__sar_next_bounds(const uint64_t *bounds, int P, const uint32_t *hist,
                            uint64_t *next);

/* Entry i (< IGRAD__SAR_MEMO) of the balanced split points w keeps for
 * its next calls: P + 1 points (host memory, valid until the next call)
 * for an index space of *dense_count and *key (space_key), stored at
 * *stamp; NULL (*dense_count = *key = *stamp = 0) when the entry is empty, w is not balanced, or it keeps
 * none for P ranks. A caller that saves its state keeps all of them, so
 * that a resumed run splits as the uninterrupted one would. */
const uint64_t *igrad__sar_memo_get(const igrad__sar_t *w, int P, int i, uint64_t *dense_count,
                                    uint64_t *key, uint64_t *stamp);
/* Room for P ranks' split points in w (the only allocation of
 * igrad__sar_memo_set): IGRAD_E_NOMEM, or IGRAD_OK. */
igrad_status_t igrad__sar_reserve_points(igrad__sar_t *w, int P);
/* Sets entry i as igrad__sar_memo_get gave it (points: P + 1 u64 in host
 * byte order at any alignment; NULL: empty), dropping what w kept for
 * another P. After igrad__sar_reserve_points(w, P) it cannot fail; the
 * points are taken as they are (the caller checks them: 0 first,
 * dense_count last, non-decreasing). */
void igrad__sar_memo_set(igrad__sar_t *w, int P, int i, uint64_t dense_count, uint64_t key,
                         uint64_t stamp, const void *points);

/* Frees the workspace; w is zeroed (ready for reuse). NULL is a no-op. */
void igrad__sar_clear(igrad__sar_t *w);

#endif /* IGRAD_SPARSE_ALLREDUCE_H */
