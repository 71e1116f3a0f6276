/*
 * sparse_allreduce.c — the sparse all-reduce of sparse_allreduce.h: split
 * by index range (two alltoallv: counts, then entries), reduce and
 * re-sparsify at the range's owner, all-gather the reduced entries. The
 * algorithm, its volume and its sources are in docs/architecture.md §5.7a.
 * The protocol is written once here; its data steps go through a backend
 * row (igrad__sar_ops_t): the host's is the second half of this file, the
 * CUDA one is sparse_allreduce_cuda.cu.
 *
 * Split points: every rank keeps the same P + 1 of them in its workspace
 * (equal ranges first, then igrad__sar_next_bounds of the last call's
 * phase-3 headers, which every rank holds alike). Each status record
 * carries a hash of the ones the rank used; should they ever differ (a
 * call that failed on some ranks only, after which that rank starts from
 * equal ranges), every rank sees it alike and does phase 1 again on
 * equal ranges: one more counts exchange and status all-gather, in that
 * call only.
 *
 * Failure handling keeps every rank in the same collectives: everything
 * that can fail locally (the caller's input, memory, the received counts,
 * a backend's device error) is settled before a status all-gather that
 * follows the counts exchange, after which only exchanges and
 * computations remain; what is found later (an owner receiving an index
 * outside its range, a backend failing in the reduction) travels in the
 * header of that owner's phase-3 block. Every rank turns the lowest
 * reporting rank's record into the same message. Only running out of
 * memory for the O(P) count arrays before the first exchange returns at
 * once (the comm's timeout then ends the others' wait).
 *
 * Not here: the communicator ops (comm*.c), the engine's use of it.
 */
#include "comm/sparse_allreduce.h"

#include "comm/comm_internal.h"
#include "core/value16.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CTX "sparse all-reduce"
/* One owner sorts what it received with 32-bit positions. */
#define MAX_RECV_ENTRIES UINT32_MAX

/* The host backend's scratch slots. */
enum { WS_KEYS = IGRAD__SAR_SCRATCH, WS_SUMS, WS_HOST_END };
_Static_assert((int)WS_HOST_END <= (int)IGRAD__SAR_SLOTS, "igrad__sar_t has a slot per buffer");

/* One rank's record in the status all-gather. */
typedef struct sar_status {
    igrad__sar_report_t report;
    uint64_t k;
    uint64_t dense_count;
} sar_status_t;

void igrad__sar_equal_bounds(uint64_t dense_count, int P, uint64_t *bounds)
{
    for (int r = 0; r < P; r++) {
        uint64_t hi;
        igrad__sar_range(dense_count, P, r, &bounds[r], &hi);
    }
    bounds[P] = dense_count;
}

/* floor(N s / P) without overflow (N < 2^64, s <= P < 2^31). */
static uint64_t share_of(uint64_t N, int s, int P)
{
    uint64_t q = N / (uint64_t)P, r = N % (uint64_t)P;
    return q * (uint64_t)s + r * (uint64_t)s / (uint64_t)P;
}

void igrad__sar_next_bounds(const uint64_t *bounds, int P, const uint32_t *hist,
                            uint64_t *next)
{
    uint64_t N = 0, most = 0;
    for (int r = 0; r < P; r++) {
        uint64_t got = 0; /* one owner's: < 2^32 (MAX_RECV_ENTRIES) */
        for (int j = 0; j < IGRAD__SAR_HIST; j++) got += hist[(size_t)r * IGRAD__SAR_HIST + j];
        N += got;
        if (got > most) most = got;
    }
    memcpy(next, bounds, ((size_t)P + 1) * sizeof *next);
    if (N == 0 || P < 2) return;
    uint64_t mean = N / (uint64_t)P; /* most >= mean */
    if ((most - mean) * 20 <= mean) return; /* within 1.05x: keep them */
    uint64_t before = 0; /* entries in the parts passed */
    int s = 1;
    uint64_t target = share_of(N, s, P);
    for (int r = 0; r < P && s < P; r++) {
        uint64_t lo = bounds[r], hi = bounds[r + 1];
        for (int j = 0; j < IGRAD__SAR_HIST && s < P; j++) {
            uint64_t c = hist[(size_t)r * IGRAD__SAR_HIST + j];
            if (c == 0) continue;
            /* the part's indices: igrad__sar_hist_bin(lo, hi, i) == j */
            uint64_t a = lo + ((hi - lo) * (uint64_t)j + IGRAD__SAR_HIST - 1) / IGRAD__SAR_HIST;
            uint64_t b = lo + ((hi - lo) * (uint64_t)(j + 1) + IGRAD__SAR_HIST - 1) /
                                  IGRAD__SAR_HIST;
            /* (b - a) <= 2^32 and target - before <= c < 2^32: no overflow */
            while (s < P && target <= before + c) {
                next[s] = a + (b - a) * (target - before) / c;
                s++;
                target = share_of(N, s, P);
            }
            before += c;
        }
    }
    for (int t = 1; t < P; t++) /* non-decreasing, inside [0, D] */
        if (next[t] < next[t - 1]) next[t] = next[t - 1];
    next[0] = bounds[0];
    next[P] = bounds[P];
}

/* A 32-bit hash of the split points (FNV-1a over their bytes). */
static uint32_t bounds_hash(const uint64_t *bounds, int P)
{
    uint32_t h = 2166136261u;
    for (int r = 0; r <= P; r++)
        for (int byte = 0; byte < 8; byte++) {
            h ^= (uint32_t)(bounds[r] >> (8 * byte) & 0xffu);
            h *= 16777619u;
        }
    return h;
}

/* The host slot of the split points: this call's (P + 1), the next's
 * (P + 1), the owners' histograms (P IGRAD__SAR_HIST u32), then the
 * IGRAD__SAR_MEMO stored ones (P + 1 each; w->memo_*). Its contents stay
 * while P does (a host slot grows by realloc). */
static uint64_t *bounds_slot(igrad__sar_t *w, int P)
{
    const size_t Pz = (size_t)P;
    return igrad__sar_workspace(w, IGRAD__SAR_WS_BOUNDS,
                                (2 + IGRAD__SAR_MEMO) * (Pz + 1) + Pz * IGRAD__SAR_HIST / 2,
                                sizeof(uint64_t));
}

static uint64_t *memo_points(uint64_t *bounds, int P, int i)
{
    const size_t Pz = (size_t)P;
    return bounds + 2 * (Pz + 1) + Pz * IGRAD__SAR_HIST / 2 + (size_t)i * (Pz + 1);
}

/* The entry kept for dense_count and w->space_key over P ranks, or -1. */
static int memo_find(const igrad__sar_t *w, int P, uint64_t dense_count)
{
    if (!w->next_valid || w->next_ranks != P || dense_count == 0) return -1;
    for (int i = 0; i < IGRAD__SAR_MEMO; i++)
        if (w->memo_dense_count[i] == dense_count && w->memo_key[i] == w->space_key) return i;
    return -1;
}

/* Keeps `points` (the next call's over dense_count) in the entry of that
 * index space, else an empty one, else the least recently stored: the
 * same entries on every rank that made the same calls. */
static void memo_store(igrad__sar_t *w, int P, uint64_t dense_count, const uint64_t *points)
{
    if (dense_count == 0) return;
    if (!w->next_valid || w->next_ranks != P) {
        memset(w->memo_dense_count, 0, sizeof w->memo_dense_count);
        w->next_valid = 1;
        w->next_ranks = P;
    }
    int at = memo_find(w, P, dense_count);
    for (int i = 0; i < IGRAD__SAR_MEMO && at < 0; i++)
        if (w->memo_dense_count[i] == 0) at = i;
    if (at < 0) {
        at = 0;
        for (int i = 1; i < IGRAD__SAR_MEMO; i++)
            if (w->memo_stamp[i] < w->memo_stamp[at]) at = i;
    }
    uint64_t *bounds = w->buf[IGRAD__SAR_WS_BOUNDS];
    memmove(memo_points(bounds, P, at), points, ((size_t)P + 1) * sizeof *points);
    w->memo_dense_count[at] = dense_count;
    w->memo_key[at] = w->space_key;
    w->memo_stamp[at] = ++w->stores;
}

const uint64_t *igrad__sar_memo_get(const igrad__sar_t *w, int P, int i, uint64_t *dense_count,
                                    uint64_t *key, uint64_t *stamp)
{
    *dense_count = *key = *stamp = 0;
    if (!w || !w->balanced || !w->next_valid || w->next_ranks != P || P < 1 || i < 0 ||
        i >= IGRAD__SAR_MEMO || w->memo_dense_count[i] == 0)
        return NULL;
    *dense_count = w->memo_dense_count[i];
    *key = w->memo_key[i];
    *stamp = w->memo_stamp[i];
    return memo_points(w->buf[IGRAD__SAR_WS_BOUNDS], P, i);
}

igrad_status_t igrad__sar_reserve_points(igrad__sar_t *w, int P)
{
    IGRAD_FAIL_IF(!bounds_slot(w, P), IGRAD_E_NOMEM,
                  CTX ": out of memory for the split points of %d ranks", P);
    return IGRAD_OK;
}

void igrad__sar_memo_set(igrad__sar_t *w, int P, int i, uint64_t dense_count, uint64_t key,
                         uint64_t stamp, const void *points)
{
    uint64_t *bounds = bounds_slot(w, P); /* reserved: cannot fail */
    if (!bounds) {
        w->next_valid = 0;
        return;
    }
    if (!w->next_valid || w->next_ranks != P) {
        memset(w->memo_dense_count, 0, sizeof w->memo_dense_count);
        w->next_valid = 1;
        w->next_ranks = P;
    }
    if (points) w->balanced = 1; /* kept points are a balanced caller's */
    w->memo_dense_count[i] = points ? dense_count : 0;
    w->memo_key[i] = points ? key : 0;
    w->memo_stamp[i] = points ? stamp : 0;
    if (points) memcpy(memo_points(bounds, P, i), points, ((size_t)P + 1) * sizeof *bounds);
    if (stamp > w->stores) w->stores = stamp;
}

size_t igrad__sar_kout(size_t k, int P)
{
    return P < 1 ? k : k / (size_t)P + (k % (size_t)P != 0);
}

void *igrad__sar_workspace(igrad__sar_t *w, int slot, size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size) return NULL;
    size_t nbytes = n * size > 0 ? n * size : 1;
    if (w->cap[slot] >= nbytes) return w->buf[slot];
    void *p;
    if (slot < IGRAD__SAR_HOST_SLOTS) {
        p = realloc(w->buf[slot], nbytes);
    } else {
        w->ops->free(w->buf[slot]);
        w->buf[slot] = NULL;
        w->cap[slot] = 0;
        p = w->ops->alloc(nbytes);
    }
    if (!p) return NULL;
    w->buf[slot] = p;
    w->cap[slot] = nbytes;
    return p;
}

void igrad__sar_clear(igrad__sar_t *w)
{
    if (!w) return;
    for (int i = 0; i < IGRAD__SAR_SLOTS; i++) {
        if (i < IGRAD__SAR_HOST_SLOTS) free(w->buf[i]);
        else if (w->buf[i]) w->ops->free(w->buf[i]);
    }
    memset(w, 0, sizeof *w);
}

/* The same message on every rank, from rank `r`'s report. */
static igrad_status_t report_fail(const igrad__sar_report_t *rep, int r, uint64_t k,
                                  uint64_t dense_count, const uint64_t *bounds,
                                  const char *backend)
{
    uint64_t lo = bounds ? bounds[r] : 0, hi = bounds ? bounds[r + 1] : 0;
    switch ((igrad__sar_reason_t)rep->reason) {
    case IGRAD__SAR_NO_INPUT:
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           CTX ": rank %d has k = %" PRIu64 " entries but no input buffer; "
                           "every rank fails it", r, k);
    case IGRAD__SAR_INPUT_INDEX:
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           CTX ": rank %d's input entry %" PRIu64 " has index %" PRIu64
                           " outside [0, %" PRIu64 "); every rank fails it",
                           r, rep->where, rep->value, dense_count);
    case IGRAD__SAR_INPUT_VALUE:
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           CTX ": rank %d's input entry %" PRIu64 " has a non-finite value "
                           "(bits 0x%08" PRIx64 "); every rank fails it",
                           r, rep->where, rep->value);
    case IGRAD__SAR_DENSE_COUNT:
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           CTX ": rank %d's index space of %" PRIu64 " entries is larger "
                           "than 2^32 (indices are 32-bit); every rank fails it",
                           r, rep->value);
    case IGRAD__SAR_NOMEM:
        return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__,
                           CTX ": rank %d is out of memory (%" PRIu64 " bytes of workspace); "
                           "every rank fails it", r, rep->value);
    case IGRAD__SAR_RECV_COUNT:
        return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                           CTX ": rank %d received a count of %" PRIu64 " entries from rank %"
                           PRIu64 ", more than k = %" PRIu64 " (corrupt bytes); every rank "
                           "fails it", r, rep->value, rep->where, k);
    case IGRAD__SAR_RECV_TOTAL:
        return igrad__fail(IGRAD_E_UNSUPPORTED, __FILE__, __LINE__,
                           CTX ": rank %d would receive %" PRIu64 " entries, more than the %"
                           PRIu64 " one owner can sort; every rank fails it",
                           r, rep->value, (uint64_t)MAX_RECV_ENTRIES);
    case IGRAD__SAR_RECV_INDEX:
        return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                           CTX ": rank %d received index %" PRIu64 " from rank %" PRIu64
                           ", outside its range [%" PRIu64 ", %" PRIu64 ") (corrupt bytes); "
                           "every rank fails it", r, rep->value, rep->where, lo, hi);
    case IGRAD__SAR_BACKEND:
        return igrad__fail(rep->value >= IGRAD_E_INVALID && rep->value <= IGRAD_E_TIMEOUT
                               ? (igrad_status_t)rep->value
                                                             : IGRAD_E_STATE,
                           __FILE__, __LINE__,
                           CTX ": rank %d's %s data steps failed (%s, in phase %" PRIu64
                           "; that rank's error says why); every rank fails it",
                           r, backend, igrad_status_str((igrad_status_t)rep->value),
                           rep->where);
    case IGRAD__SAR_OK: break;
    }
    return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                       CTX ": rank %d reported failure %" PRIu32 ", which this library does "
                       "not know (corrupt bytes); every rank fails it", r, rep->reason);
}

/* A backend's failure `st` in phase `phase`, as a report for the others. */
static void backend_report(igrad__sar_report_t *rep, igrad_status_t st, int phase)
{
    rep->reason = IGRAD__SAR_BACKEND;
    rep->where = (uint64_t)phase;
    rep->value = (uint64_t)st;
}

/* Rank r's failure: its own recorded error on rank r when it was the
 * backend's (the message says why), the shared message everywhere else. */
static igrad_status_t rank_fail(const igrad__sar_report_t *rep, int r, int me,
                                igrad_status_t mine, uint64_t k, uint64_t dense_count,
                                const uint64_t *bounds, const char *backend)
{
    if (r == me && rep->reason == IGRAD__SAR_BACKEND && mine != IGRAD_OK) return mine;
    return report_fail(rep, r, k, dense_count, bounds, backend);
}

/* The counts exchange (phase 1a): host arrays; a device backend's go
 * through its own copy of them (slot DCOUNTS). */
static igrad_status_t exchange_counts(igrad__sar_t *w, void *stream, igrad_comm_t *comm,
                                      uint64_t *counts, size_t *sizes)
{
    const size_t P = (size_t)comm->size;
    const igrad__sar_ops_t *ops = w->ops;
    size_t *send_nbytes = sizes, *send_displs = sizes + P;
    size_t *recv_nbytes = sizes + 2 * P, *recv_displs = sizes + 3 * P;
    for (size_t j = 0; j < P; j++) {
        send_nbytes[j] = recv_nbytes[j] = sizeof(uint64_t);
        send_displs[j] = recv_displs[j] = j * sizeof(uint64_t);
    }
    uint64_t *c = counts;
    if (ops->space != IGRAD__MEM_HOST) {
        c = igrad__sar_workspace(w, IGRAD__SAR_WS_DCOUNTS, 2 * P, sizeof(uint64_t));
        IGRAD_FAIL_IF(!c, IGRAD_E_NOMEM, CTX ": out of %s memory for the counts of %zu ranks",
                      ops->name, P);
        IGRAD_CHECK(ops->copy_in(stream, c, counts, P * sizeof(uint64_t)));
    }
    IGRAD_CHECK(igrad__comm_alltoallv(comm, c, send_nbytes, send_displs, c + P, recv_nbytes,
                                      recv_displs, ops->space, stream));
    if (c != counts)
        IGRAD_CHECK(ops->copy_out(stream, counts + P, 0, c + P, 0, P * sizeof(uint64_t), 1));
    return IGRAD_OK;
}

/* The phase-3 all-gather of one block per rank, in place: blocking on the
 * host (as the status records), else issued on the backend's queue and
 * waited for. */
static igrad_status_t gather_blocks(const igrad__sar_t *w, void *stream, igrad_comm_t *comm,
                                    unsigned char *blocks, size_t block_nbytes)
{
    unsigned char *own = blocks + (size_t)comm->rank * block_nbytes;
    if (w->ops->space == IGRAD__MEM_HOST)
        return igrad_comm_allgather(comm, own, block_nbytes, blocks);
    igrad_comm_request_t *req = NULL;
    IGRAD_CHECK(igrad__comm_iallgather(comm, own, block_nbytes, blocks, w->ops->space, stream,
                                       &req));
    return igrad_comm_wait(comm, req);
}

/* Phase 3's blocks as this rank received them: a report stops every rank
 * alike; an inconsistent block is this rank's own finding. */
static igrad_status_t collect_result(igrad__sar_t *w, void *stream, const unsigned char *blocks,
                                     size_t block_nbytes, int P, int me, igrad_status_t mine,
                                     size_t k, size_t kout, uint64_t dense_count,
                                     uint64_t *bounds, const uint64_t *dbounds)
{
    const igrad__sar_ops_t *ops = w->ops;
    igrad__sar_header_t *heads = w->buf[IGRAD__SAR_WS_HEADS];
    IGRAD_CHECK(ops->copy_out(stream, heads, sizeof *heads, blocks, block_nbytes, sizeof *heads,
                              (size_t)P));
    for (int r = 0; r < P; r++)
        if (heads[r].report.reason != IGRAD__SAR_OK)
            return rank_fail(&heads[r].report, r, me, mine, k, dense_count, bounds, ops->name);
    /* the first block that claims too many entries; the ones before it
     * are checked entry by entry (nkept is read as the clamped count) */
    uint64_t *nkept = w->buf[IGRAD__SAR_WS_COUNTS]; /* the counts are spent by now */
    int over = P;
    for (int r = 0; r < P; r++) {
        nkept[r] = heads[r].nkept > kout ? kout : heads[r].nkept;
        if (heads[r].nkept > kout && over == P) over = r;
    }
    for (int r = over; r < P; r++) nkept[r] = 0;
    igrad__sar_entry_t *result = w->buf[IGRAD__SAR_WS_RESULT];
    int bad_rank = P;
    uint64_t bad_entry = 0;
    uint32_t bad_index = 0;
    IGRAD_CHECK(ops->collect(w, stream, blocks, block_nbytes, P, nkept, dbounds, result,
                             &bad_rank, &bad_entry, &bad_index));
    if (bad_rank < over) {
        uint64_t lo = bounds[bad_rank], hi = bounds[bad_rank + 1];
        return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                           CTX ": rank %d's reduced entry %" PRIu64 " has index %" PRIu32
                           ", not ascending inside its range [%" PRIu64 ", %" PRIu64
                           ") (corrupt bytes, seen by this rank)",
                           bad_rank, bad_entry, bad_index, lo, hi);
    }
    IGRAD_FAIL_IF(over < P, IGRAD_E_COMM,
                  CTX ": rank %d's reduced block says %" PRIu64 " entries, more than "
                  "kout = %zu (corrupt bytes, seen by this rank)",
                  over, heads[over].nkept, kout);
    size_t n = 0;
    for (int r = 0; r < P; r++) n += (size_t)nkept[r];
    w->result = result;
    w->result_count = n;
    /* the owners' load, and the next split points, from the same bytes
     * on every rank */
    uint32_t *hist = (uint32_t *)(void *)(bounds + 2 * ((size_t)P + 1)); /* the slot's tail */
    igrad__sar_balance_t bal = {0, 0, 0};
    for (int r = 0; r < P; r++) {
        uint64_t got = 0;
        for (int j = 0; j < IGRAD__SAR_HIST; j++) {
            hist[(size_t)r * IGRAD__SAR_HIST + j] = heads[r].hist[j];
            got += heads[r].hist[j];
        }
        bal.recv_total += got;
        if (got > bal.recv_max) {
            bal.recv_max = got;
            bal.busiest = r;
        }
    }
    w->balance = bal;
    if (w->balanced) {
        igrad__sar_next_bounds(bounds, P, hist, bounds + P + 1);
        memo_store(w, P, dense_count, bounds + P + 1);
    }
    return IGRAD_OK;
}

igrad_status_t igrad__sar_allreduce_on(igrad__sar_t *w, const igrad__sar_ops_t *ops,
                                       void *stream, igrad_comm_t *comm, uint64_t dense_count,
                                       size_t k, const igrad__sar_entry_t *in)
{
    IGRAD_FAIL_IF(!w || !ops || !comm, IGRAD_E_INVALID, "igrad__sar_allreduce: %s is NULL",
                  !w ? "w" : !ops ? "ops" : "comm");
    if (w->ops != ops) { /* a workspace of another backend */
        if (w->ops) igrad__sar_clear(w);
        w->ops = ops;
    }
    w->result = w->remainder = NULL;
    w->result_count = w->remainder_count = 0;
    memset(&w->bytes, 0, sizeof w->bytes);
    memset(&w->balance, 0, sizeof w->balance);
    w->bounds = NULL;
    IGRAD_FAIL_IF(!comm->vt->alltoallv, IGRAD_E_UNSUPPORTED,
                  CTX ": communicator '%s' has no variable all-to-all (the self, MPI, NCCL "
                  "and self_cuda communicators have one, a custom one with ops->alltoallv)",
                  comm->backend);
    IGRAD_CHECK(igrad__comm_check_space(comm, ops->space, CTX));
    const int P = comm->size, me = comm->rank;
    const size_t Pz = (size_t)P;

    /* What every rank needs to take part at all. */
    uint64_t *counts = igrad__sar_workspace(w, IGRAD__SAR_WS_COUNTS, 2 * Pz, sizeof(uint64_t));
    size_t *sizes = igrad__sar_workspace(w, IGRAD__SAR_WS_SIZES, 4 * Pz, sizeof(size_t));
    sar_status_t *records = igrad__sar_workspace(w, IGRAD__SAR_WS_RECORDS, Pz,
                                                 sizeof(sar_status_t));
    igrad__sar_header_t *heads = igrad__sar_workspace(w, IGRAD__SAR_WS_HEADS, Pz,
                                                      sizeof(igrad__sar_header_t));
    uint64_t *bounds = bounds_slot(w, P);
    IGRAD_FAIL_IF(!counts || !sizes || !records || !heads || !bounds, IGRAD_E_NOMEM,
                  CTX ": out of memory for the count arrays of %d ranks", P);
    /* the stored split points serve this call only if it succeeds on every
     * rank alike (they are taken out; a call that fails leaves equal
     * ranges for the next over this index space) */
    int hit = w->balanced ? memo_find(w, P, dense_count) : -1;
    if (hit >= 0) {
        memcpy(bounds, memo_points(bounds, P, hit), (Pz + 1) * sizeof *bounds);
        w->memo_dense_count[hit] = 0;
    } else {
        igrad__sar_equal_bounds(dense_count, P, bounds);
    }
    uint64_t *send_counts = counts, *recv_counts = counts + P;
    size_t *send_nbytes = sizes, *send_displs = sizes + P;
    size_t *recv_nbytes = sizes + 2 * Pz, *recv_displs = sizes + 3 * Pz;

    int retried = 0; /* phase 1 again, on equal ranges (split points differed) */
    w->resplit = 0;
again:;
    /* Phase 1, local: check and group this rank's entries. */
    igrad__sar_report_t rep = {0};
    igrad_status_t mine = IGRAD_OK; /* a backend's own error, kept for this rank */
    memset(send_counts, 0, Pz * sizeof *send_counts);
    igrad__sar_entry_t *send = NULL;
    if (dense_count > (UINT64_C(1) << 32)) {
        rep.reason = IGRAD__SAR_DENSE_COUNT;
        rep.value = dense_count;
    } else if (k > 0 && !in) {
        rep.reason = IGRAD__SAR_NO_INPUT;
    }
    const uint64_t *dbounds = bounds; /* in the backend's memory */
    if (rep.reason == IGRAD__SAR_OK && ops->space != IGRAD__MEM_HOST) {
        uint64_t *d = igrad__sar_workspace(w, IGRAD__SAR_WS_DBOUNDS, Pz + 1, sizeof(uint64_t));
        if (!d) {
            rep.reason = IGRAD__SAR_NOMEM;
            rep.value = (Pz + 1) * sizeof(uint64_t);
        } else if ((mine = ops->copy_in(stream, d, bounds, (Pz + 1) * sizeof *d)) !=
                   IGRAD_OK) {
            backend_report(&rep, mine, 1);
        }
        dbounds = d;
    }
    if (rep.reason == IGRAD__SAR_OK && k > 0) {
        mine = ops->split(w, stream, dense_count, P, dbounds, k, in, send_counts, &rep, &send);
        if (mine != IGRAD_OK) backend_report(&rep, mine, 1);
    }

    /* Phase 1a: the counts. */
    IGRAD_CHECK(exchange_counts(w, stream, comm, counts, sizes));
    uint64_t total = 0;
    for (int j = 0; j < P && rep.reason == IGRAD__SAR_OK; j++) {
        if (recv_counts[j] > (uint64_t)k) {
            rep.reason = IGRAD__SAR_RECV_COUNT;
            rep.where = (uint64_t)j;
            rep.value = recv_counts[j];
        } else if ((total += recv_counts[j]) > MAX_RECV_ENTRIES) {
            rep.reason = IGRAD__SAR_RECV_TOTAL;
            rep.value = total;
        }
    }

    /* Everything else this call needs, before the status exchange. */
    const size_t kout = igrad__sar_kout(k, P);
    const size_t block_nbytes = sizeof(igrad__sar_header_t) + kout * sizeof(igrad__sar_entry_t);
    igrad__sar_entry_t *recv = NULL, *rem = NULL;
    unsigned char *blocks = NULL;
    const size_t n = (size_t)total;
    if (rep.reason == IGRAD__SAR_OK) {
        recv = igrad__sar_workspace(w, IGRAD__SAR_WS_RECV, n, sizeof *recv);
        rem = igrad__sar_workspace(w, IGRAD__SAR_WS_REMAINDER, n, sizeof *rem);
        blocks = kout > (SIZE_MAX - sizeof(igrad__sar_header_t)) / sizeof(igrad__sar_entry_t)
                     ? NULL
                     : igrad__sar_workspace(w, IGRAD__SAR_WS_BLOCKS, Pz, block_nbytes);
        void *result = igrad__sar_workspace(w, IGRAD__SAR_WS_RESULT, Pz * kout,
                                            sizeof(igrad__sar_entry_t));
        uint64_t scratch = ops->reserve(w, n);
        if (!recv || !rem || !blocks || !result || scratch) {
            rep.reason = IGRAD__SAR_NOMEM;
            rep.value = (uint64_t)n * 16 + (uint64_t)Pz * (block_nbytes + 8 * kout) + scratch;
        }
    }

    /* Phase 1b: every rank's status; a problem anywhere stops every rank. */
    records[me].report = rep;
    records[me].report.check = bounds_hash(bounds, P);
    records[me].k = (uint64_t)k;
    records[me].dense_count = dense_count;
    IGRAD_CHECK(igrad_comm_allgather(comm, &records[me], sizeof *records, records));
    w->bytes.status_recv += (uint64_t)(P - 1) * sizeof *records;
    for (int r = 1; r < P; r++) {
        IGRAD_FAIL_IF(records[r].dense_count != records[0].dense_count, IGRAD_E_MISMATCH,
                      CTX ": the index space differs: rank 0 has %" PRIu64 " entries, rank %d "
                      "has %" PRIu64, records[0].dense_count, r, records[r].dense_count);
        IGRAD_FAIL_IF(records[r].k != records[0].k, IGRAD_E_MISMATCH,
                      CTX ": k differs: rank 0 has %" PRIu64 ", rank %d has %" PRIu64,
                      records[0].k, r, records[r].k);
    }
    for (int r = 0; r < P; r++)
        if (records[r].report.reason != IGRAD__SAR_OK)
            return rank_fail(&records[r].report, r, me, mine, records[r].k,
                             records[r].dense_count, bounds, ops->name);
    int agree = 1;
    for (int r = 1; r < P; r++) agree &= records[r].report.check == records[0].report.check;
    if (!agree) {
        /* an earlier call failed on some ranks only: every rank sees it
         * here alike and does phase 1 again on equal ranges */
        IGRAD_FAIL_IF(retried, IGRAD_E_STATE,
                      CTX ": the ranks' equal split points differ (hash 0x%08" PRIx32
                      " on rank 0); every rank fails it",
                      records[0].report.check);
        retried = w->resplit = 1;
        w->bytes.split_sent += (uint64_t)(P - 1) * sizeof(uint64_t);
        w->bytes.split_recv += (uint64_t)(P - 1) * sizeof(uint64_t);
        igrad__sar_equal_bounds(dense_count, P, bounds);
        goto again;
    }

    /* Phase 1c: the entries, to their owners. */
    size_t sat = 0, rat = 0;
    for (int j = 0; j < P; j++) {
        send_nbytes[j] = (size_t)send_counts[j] * sizeof *send;
        send_displs[j] = sat;
        sat += send_nbytes[j];
        recv_nbytes[j] = (size_t)recv_counts[j] * sizeof *recv;
        recv_displs[j] = rat;
        rat += recv_nbytes[j];
        if (j != me) {
            w->bytes.split_sent += sizeof(uint64_t) + send_nbytes[j];
            w->bytes.split_recv += sizeof(uint64_t) + recv_nbytes[j];
        }
    }
    IGRAD_CHECK(igrad__comm_alltoallv(comm, send, send_nbytes, send_displs, recv, recv_nbytes,
                                      recv_displs, ops->space, stream));

    /* Phase 2: check and reduce what this rank owns. */
    unsigned char *own = blocks + (size_t)me * block_nbytes;
    igrad__sar_header_t head;
    memset(&head, 0, sizeof head);
    const uint64_t lo = bounds[me], hi = bounds[me + 1];
    size_t nkept = 0, nrem = 0, bad = SIZE_MAX;
    mine = ops->reduce(w, stream, recv, n, lo, hi, kout,
                       (igrad__sar_entry_t *)(void *)(own + sizeof head), &nkept, rem, &nrem,
                       &bad, head.hist);
    if (mine != IGRAD_OK) {
        backend_report(&head.report, mine, 2);
        memset(head.hist, 0, sizeof head.hist);
        nkept = nrem = 0;
    } else if (bad != SIZE_MAX) {
        size_t from = 0;
        while (bad * sizeof *recv >= recv_displs[from] + recv_nbytes[from]) from++;
        igrad__sar_entry_t e = {0, 0.0f};
        mine = ops->copy_out(stream, &e, 0, recv + bad, 0, sizeof e, 1);
        if (mine != IGRAD_OK) {
            backend_report(&head.report, mine, 2);
        } else {
            head.report.reason = IGRAD__SAR_RECV_INDEX;
            head.report.where = (uint64_t)from;
            head.report.value = e.index;
        }
        memset(head.hist, 0, sizeof head.hist);
        nkept = nrem = 0;
    }
    head.nkept = nkept;
    igrad_status_t put = ops->copy_in(stream, own, &head, sizeof head);
    if (put != IGRAD_OK) return put; /* nothing can tell the others: their gather times out */

    /* Phase 3: every owner's kept entries to every rank. */
    IGRAD_CHECK(gather_blocks(w, stream, comm, blocks, block_nbytes));
    w->bytes.gather_recv = (uint64_t)(P - 1) * block_nbytes;
    IGRAD_CHECK(collect_result(w, stream, blocks, block_nbytes, P, me, mine, k, kout,
                               dense_count, bounds, dbounds));
    w->bounds = bounds;
    w->remainder = rem;
    w->remainder_count = nrem;
    return IGRAD_OK;
}

igrad_status_t igrad__sar_allreduce(igrad__sar_t *w, igrad_comm_t *comm, uint64_t dense_count,
                                    size_t k, const igrad__sar_entry_t *in)
{
    return igrad__sar_allreduce_on(w, &igrad__sar_host, NULL, comm, dense_count, k, in);
}

/* ---- the host backend ------------------------------------------------------ */

static void *host_alloc(size_t nbytes) { return malloc(nbytes ? nbytes : 1); }

static void host_free(void *p) { free(p); }

static igrad_status_t host_copy_in(void *stream, void *dst, const void *src, size_t nbytes)
{
    (void)stream;
    memcpy(dst, src, nbytes);
    return IGRAD_OK;
}

static igrad_status_t host_copy_out(void *stream, void *dst, size_t dpitch, const void *src,
                                    size_t spitch, size_t width, size_t height)
{
    (void)stream;
    for (size_t i = 0; i < height; i++)
        memcpy((unsigned char *)dst + i * dpitch, (const unsigned char *)src + i * spitch,
               width);
    return IGRAD_OK;
}

static igrad_status_t host_split(igrad__sar_t *w, void *stream, uint64_t dense_count, int P,
                                 const uint64_t *bounds, size_t k, const igrad__sar_entry_t *in,
                                 uint64_t *send_counts, igrad__sar_report_t *rep,
                                 igrad__sar_entry_t **sendp)
{
    (void)stream;
    for (size_t i = 0; i < k; i++) {
        if (in[i].index >= dense_count || !isfinite(in[i].value)) {
            int bad_index = in[i].index >= dense_count;
            rep->reason = bad_index ? IGRAD__SAR_INPUT_INDEX : IGRAD__SAR_INPUT_VALUE;
            rep->where = i;
            rep->value = bad_index ? in[i].index : igrad__f32_bits(in[i].value);
            return IGRAD_OK;
        }
    }
    igrad__sar_entry_t *send = igrad__sar_workspace(w, IGRAD__SAR_WS_SEND, k, sizeof *send);
    size_t *at = igrad__sar_workspace(w, IGRAD__SAR_WS_SIZES, 4 * (size_t)P, sizeof(size_t));
    if (!send) {
        rep->reason = IGRAD__SAR_NOMEM;
        rep->value = (uint64_t)k * sizeof *send;
        return IGRAD_OK;
    }
    /* group by owner, each group in input order (`at`: the sizes slot,
     * free until the counts exchange) */
    for (size_t i = 0; i < k; i++) send_counts[igrad__sar_owner_of(bounds, P, in[i].index)]++;
    size_t sum = 0;
    for (int j = 0; j < P; j++) {
        at[j] = sum;
        sum += (size_t)send_counts[j];
    }
    for (size_t i = 0; i < k; i++) send[at[igrad__sar_owner_of(bounds, P, in[i].index)]++] = in[i];
    *sendp = send;
    return IGRAD_OK;
}

static uint64_t host_reserve(igrad__sar_t *w, size_t n)
{
    void *keys = igrad__sar_workspace(w, WS_KEYS, n, sizeof(uint64_t));
    void *sums = igrad__sar_workspace(w, WS_SUMS, n, sizeof(igrad__sar_entry_t));
    return keys && sums ? 0 : (uint64_t)n * 16;
}

static int cmp_u64(const void *pa, const void *pb)
{
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return (a > b) - (a < b);
}

static uint64_t rank_key(igrad__sar_entry_t s)
{
    return igrad__sar_rank_key(s.index, igrad__f32_bits(s.value));
}

static igrad_status_t host_reduce(igrad__sar_t *w, void *stream, const igrad__sar_entry_t *recv,
                                  size_t n, uint64_t lo, uint64_t hi, size_t kout,
                                  igrad__sar_entry_t *kept, size_t *nkept,
                                  igrad__sar_entry_t *rem, size_t *nrem, size_t *bad,
                                  uint32_t *hist)
{
    (void)stream;
    *nkept = *nrem = 0;
    *bad = SIZE_MAX;
    memset(kept, 0, kout * sizeof *kept); /* the block's padding */
    memset(hist, 0, IGRAD__SAR_HIST * sizeof *hist);
    for (size_t p = 0; p < n; p++) {
        if (recv[p].index < lo || recv[p].index >= hi) {
            *bad = p;
            return IGRAD_OK;
        }
        hist[igrad__sar_hist_bin(lo, hi, recv[p].index)]++;
    }
    uint64_t *keys = w->buf[WS_KEYS];
    igrad__sar_entry_t *sums = w->buf[WS_SUMS];
    /* (index, position): unique keys, so the order is the stable one */
    for (size_t p = 0; p < n; p++) keys[p] = (uint64_t)recv[p].index << 32 | (uint64_t)p;
    qsort(keys, n, sizeof *keys, cmp_u64);
    size_t m = 0;
    for (size_t p = 0; p < n;) {
        uint32_t index = (uint32_t)(keys[p] >> 32);
        float sum = 0.0f;
        for (; p < n && (uint32_t)(keys[p] >> 32) == index; p++)
            sum += recv[keys[p] & 0xffffffffu].value;
        sums[m].index = index;
        sums[m].value = sum;
        m++;
    }
    uint64_t threshold = UINT64_MAX;
    if (m > kout) {
        for (size_t q = 0; q < m; q++) keys[q] = rank_key(sums[q]);
        qsort(keys, m, sizeof *keys, cmp_u64);
        threshold = kout > 0 ? keys[kout - 1] : 0;
    }
    for (size_t q = 0; q < m; q++) {
        if (kout > 0 && rank_key(sums[q]) <= threshold) kept[(*nkept)++] = sums[q];
        else rem[(*nrem)++] = sums[q];
    }
    return IGRAD_OK;
}

static igrad_status_t host_collect(igrad__sar_t *w, void *stream, const unsigned char *blocks,
                                   size_t block_nbytes, int P, const uint64_t *nkept,
                                   const uint64_t *bounds, igrad__sar_entry_t *result,
                                   int *bad_rank, uint64_t *bad_entry, uint32_t *bad_index)
{
    (void)w, (void)stream;
    size_t n = 0;
    *bad_rank = P;
    for (int r = 0; r < P; r++) {
        const unsigned char *b = blocks + (size_t)r * block_nbytes + sizeof(igrad__sar_header_t);
        const uint64_t lo = bounds[r], hi = bounds[r + 1];
        for (uint64_t q = 0; q < nkept[r]; q++) {
            igrad__sar_entry_t e;
            memcpy(&e, b + q * sizeof e, sizeof e);
            if (e.index < lo || e.index >= hi || (q > 0 && e.index <= result[n - 1].index)) {
                *bad_rank = r;
                *bad_entry = q;
                *bad_index = e.index;
                return IGRAD_OK;
            }
            result[n++] = e;
        }
    }
    return IGRAD_OK;
}

const igrad__sar_ops_t igrad__sar_host = {
    .name = "host",
    .space = IGRAD__MEM_HOST,
    .alloc = host_alloc,
    .free = host_free,
    .copy_in = host_copy_in,
    .copy_out = host_copy_out,
    .split = host_split,
    .reserve = host_reserve,
    .reduce = host_reduce,
    .collect = host_collect,
};
