/*
 * sparse_allreduce.c — the sparse all-reduce of sparse_allreduce.h: split
 * by index range (two alltoallv: counts, then entries), reduce and
 * re-sparsify at the range's owner, all-gather the reduced entries. The
 * algorithm, its volume and its sources are in docs/architecture.md §5.7a.
 *
 * Failure handling keeps every rank in the same collectives: everything
 * that can fail locally (the caller's input, memory, the received counts)
 * is settled before a status all-gather that follows the counts exchange,
 * after which only exchanges and computations that cannot fail remain; the
 * one thing found later, an owner receiving an index outside its range,
 * travels in the header of that owner's phase-3 block. Every rank turns the
 * lowest reporting rank's record into the same message. Only running out
 * of memory for the O(P) count arrays before the first exchange returns at
 * once (the comm's timeout then ends the others' wait).
 *
 * Not here: the communicator ops (comm*.c), the engine's use of it.
 */
#include "sparse_allreduce.h"

#include "comm_internal.h"
#include "value16.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CTX "sparse all-reduce"
/* One owner sorts what it received with 32-bit positions. */
#define MAX_RECV_ENTRIES UINT32_MAX

/* Workspace slots of igrad__sar_t.buf. */
enum {
    WS_COUNTS,    /* 2P u64: counts sent, counts received */
    WS_SIZES,     /* 4P size_t: the alltoallv's byte counts and displacements */
    WS_RECORDS,   /* P status records */
    WS_SEND,      /* k entries, grouped by owner */
    WS_RECV,      /* the entries received, in rank order */
    WS_KEYS,      /* sort keys (received total) */
    WS_SUMS,      /* distinct received indices and their sums */
    WS_REMAINDER, /* this rank's remainder */
    WS_BLOCKS,    /* P phase-3 blocks */
    WS_RESULT,    /* the reduced result */
    WS_COUNT
};
_Static_assert(WS_COUNT <= sizeof ((igrad__sar_t *)0)->buf / sizeof(void *),
               "igrad__sar_t has a slot per workspace buffer");

/* Why a rank cannot go on; travels in the status records and the phase-3
 * headers, so its numbers are fixed. */
typedef enum sar_reason {
    SAR_OK = 0,
    SAR_NO_INPUT = 1,    /* k > 0 but no input buffer */
    SAR_INPUT_INDEX = 2, /* where: input position, value: its index */
    SAR_INPUT_VALUE = 3, /* where: input position, value: the float's bits */
    SAR_DENSE_COUNT = 4, /* value: D, above 2^32 */
    SAR_NOMEM = 5,       /* value: bytes asked for */
    SAR_RECV_COUNT = 6,  /* where: the sending rank, value: its count */
    SAR_RECV_TOTAL = 7,  /* value: entries to receive, above MAX_RECV_ENTRIES */
    SAR_RECV_INDEX = 8   /* where: the sending rank, value: the index */
} sar_reason_t;

typedef struct sar_report {
    uint32_t reason; /* sar_reason_t */
    uint32_t pad;
    uint64_t where;
    uint64_t value;
} sar_report_t;

/* One rank's record in the status all-gather. */
typedef struct sar_status {
    sar_report_t report;
    uint64_t k;
    uint64_t dense_count;
} sar_status_t;

/* The head of a phase-3 block; kout entries follow. */
typedef struct sar_header {
    sar_report_t report;
    uint64_t nkept; /* real entries; the rest up to kout are zero padding */
} sar_header_t;

size_t igrad__sar_kout(size_t k, int P)
{
    return P < 1 ? k : k / (size_t)P + (k % (size_t)P != 0);
}

void igrad__sar_range(uint64_t dense_count, int P, int r, uint64_t *lo, uint64_t *hi)
{
    /* dense_count <= 2^32 and r <= P < 2^31: the products fit in 64 bits */
    *lo = dense_count * (uint64_t)r / (uint64_t)P;
    *hi = dense_count * (uint64_t)(r + 1) / (uint64_t)P;
}

/* The rank whose range holds index i (< dense_count). */
static int owner_of(uint64_t dense_count, int P, uint64_t i)
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

/* Slot `slot` of the workspace with room for n items of `size` bytes, or
 * NULL (out of memory, or n * size overflows). */
static void *workspace(igrad__sar_t *w, int slot, size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size) return NULL;
    size_t nbytes = n * size > 0 ? n * size : 1;
    if (w->cap[slot] >= nbytes) return w->buf[slot];
    void *p = realloc(w->buf[slot], nbytes);
    if (!p) return NULL;
    w->buf[slot] = p;
    w->cap[slot] = nbytes;
    return p;
}

void igrad__sar_clear(igrad__sar_t *w)
{
    if (!w) return;
    for (int i = 0; i < WS_COUNT; i++) free(w->buf[i]);
    memset(w, 0, sizeof *w);
}

/* The same message on every rank, from rank `r`'s report. */
static igrad_status_t report_fail(const sar_report_t *rep, int r, uint64_t k,
                                  uint64_t dense_count, int P)
{
    uint64_t lo = 0, hi = 0;
    if (dense_count <= (UINT64_C(1) << 32)) igrad__sar_range(dense_count, P, r, &lo, &hi);
    switch ((sar_reason_t)rep->reason) {
    case SAR_NO_INPUT:
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           CTX ": rank %d has k = %" PRIu64 " entries but no input buffer; "
                           "every rank fails it", r, k);
    case SAR_INPUT_INDEX:
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           CTX ": rank %d's input entry %" PRIu64 " has index %" PRIu64
                           " outside [0, %" PRIu64 "); every rank fails it",
                           r, rep->where, rep->value, dense_count);
    case SAR_INPUT_VALUE:
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           CTX ": rank %d's input entry %" PRIu64 " has a non-finite value "
                           "(bits 0x%08" PRIx64 "); every rank fails it",
                           r, rep->where, rep->value);
    case SAR_DENSE_COUNT:
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           CTX ": rank %d's index space of %" PRIu64 " entries is larger "
                           "than 2^32 (indices are 32-bit); every rank fails it",
                           r, rep->value);
    case SAR_NOMEM:
        return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__,
                           CTX ": rank %d is out of memory (%" PRIu64 " bytes of workspace); "
                           "every rank fails it", r, rep->value);
    case SAR_RECV_COUNT:
        return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                           CTX ": rank %d received a count of %" PRIu64 " entries from rank %"
                           PRIu64 ", more than k = %" PRIu64 " (corrupt bytes); every rank "
                           "fails it", r, rep->value, rep->where, k);
    case SAR_RECV_TOTAL:
        return igrad__fail(IGRAD_E_UNSUPPORTED, __FILE__, __LINE__,
                           CTX ": rank %d would receive %" PRIu64 " entries, more than the %"
                           PRIu64 " one owner can sort; every rank fails it",
                           r, rep->value, (uint64_t)MAX_RECV_ENTRIES);
    case SAR_RECV_INDEX:
        return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                           CTX ": rank %d received index %" PRIu64 " from rank %" PRIu64
                           ", outside its range [%" PRIu64 ", %" PRIu64 ") (corrupt bytes); "
                           "every rank fails it", r, rep->value, rep->where, lo, hi);
    case SAR_OK: break;
    }
    return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                       CTX ": rank %d reported failure %" PRIu32 ", which this library does "
                       "not know (corrupt bytes); every rank fails it", r, rep->reason);
}

/* The first problem of this rank's own input, if any. */
static sar_report_t check_input(uint64_t dense_count, size_t k, const igrad__sar_entry_t *in)
{
    sar_report_t rep = {0};
    if (dense_count > (UINT64_C(1) << 32)) {
        rep.reason = SAR_DENSE_COUNT;
        rep.value = dense_count;
    } else if (k > 0 && !in) {
        rep.reason = SAR_NO_INPUT;
    } else {
        for (size_t i = 0; i < k; i++) {
            if (in[i].index >= dense_count || !isfinite(in[i].value)) {
                int bad_index = in[i].index >= dense_count;
                rep.reason = bad_index ? SAR_INPUT_INDEX : SAR_INPUT_VALUE;
                rep.where = i;
                rep.value = bad_index ? in[i].index : igrad__f32_bits(in[i].value);
                break;
            }
        }
    }
    return rep;
}

static int cmp_u64(const void *pa, const void *pb)
{
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return (a > b) - (a < b);
}

/* Phase 2 at the owner: sums the n received entries per index in the
 * order received (rank order, then each sender's input order), from 0.0f;
 * keeps the kout largest |sum| (by the bits of |sum|, a total order; ties:
 * the lower index) in `kept` and the rest in `rem`, both ascending by
 * index. keys and sums hold n items. */
static void reduce_owned(const igrad__sar_entry_t *recv, size_t n, size_t kout, uint64_t *keys,
                         igrad__sar_entry_t *sums, igrad__sar_entry_t *kept, size_t *nkept,
                         igrad__sar_entry_t *rem, size_t *nrem)
{
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
    /* rank key: larger |sum| first, then the lower index */
    uint64_t threshold = UINT64_MAX;
    if (m > kout) {
        for (size_t q = 0; q < m; q++)
            keys[q] = (uint64_t)(0x7fffffffu - (igrad__f32_bits(sums[q].value) & 0x7fffffffu))
                          << 32 |
                      sums[q].index;
        qsort(keys, m, sizeof *keys, cmp_u64);
        threshold = kout > 0 ? keys[kout - 1] : 0;
    }
    *nkept = *nrem = 0;
    for (size_t q = 0; q < m; q++) {
        uint64_t key = (uint64_t)(0x7fffffffu - (igrad__f32_bits(sums[q].value) & 0x7fffffffu))
                           << 32 |
                       sums[q].index;
        if (kout > 0 && key <= threshold) kept[(*nkept)++] = sums[q];
        else rem[(*nrem)++] = sums[q];
    }
}

/* Phase 3's blocks as this rank received them: a report stops every rank
 * alike; an inconsistent block is this rank's own finding. */
static igrad_status_t collect_result(igrad__sar_t *w, const unsigned char *blocks,
                                     size_t block_nbytes, int P, size_t k, size_t kout,
                                     uint64_t dense_count, igrad__sar_entry_t *result)
{
    for (int r = 0; r < P; r++) {
        sar_header_t h;
        memcpy(&h, blocks + (size_t)r * block_nbytes, sizeof h);
        if (h.report.reason != SAR_OK) return report_fail(&h.report, r, k, dense_count, P);
    }
    size_t n = 0;
    for (int r = 0; r < P; r++) {
        const unsigned char *b = blocks + (size_t)r * block_nbytes;
        sar_header_t h;
        memcpy(&h, b, sizeof h);
        IGRAD_FAIL_IF(h.nkept > kout, IGRAD_E_COMM,
                      CTX ": rank %d's reduced block says %" PRIu64 " entries, more than "
                      "kout = %zu (corrupt bytes, seen by this rank)", r, h.nkept, kout);
        uint64_t lo, hi;
        igrad__sar_range(dense_count, P, r, &lo, &hi);
        for (uint64_t q = 0; q < h.nkept; q++) {
            igrad__sar_entry_t e;
            memcpy(&e, b + sizeof h + q * sizeof e, sizeof e);
            IGRAD_FAIL_IF(e.index < lo || e.index >= hi ||
                              (q > 0 && e.index <= result[n - 1].index),
                          IGRAD_E_COMM,
                          CTX ": rank %d's reduced entry %" PRIu64 " has index %" PRIu32
                          ", not ascending inside its range [%" PRIu64 ", %" PRIu64
                          ") (corrupt bytes, seen by this rank)", r, q, e.index, lo, hi);
            result[n++] = e;
        }
    }
    w->result = result;
    w->result_count = n;
    return IGRAD_OK;
}

igrad_status_t igrad__sar_allreduce(igrad__sar_t *w, igrad_comm_t *comm, uint64_t dense_count,
                                    size_t k, const igrad__sar_entry_t *in)
{
    IGRAD_FAIL_IF(!w || !comm, IGRAD_E_INVALID, "igrad__sar_allreduce: %s is NULL",
                  !w ? "w" : "comm");
    w->result = w->remainder = NULL;
    w->result_count = w->remainder_count = 0;
    memset(&w->bytes, 0, sizeof w->bytes);
    IGRAD_FAIL_IF(!comm->vt->alltoallv, IGRAD_E_UNSUPPORTED,
                  CTX ": communicator '%s' has no variable all-to-all (the self and MPI "
                  "communicators have one, a custom one with ops->alltoallv)", comm->backend);
    const int P = comm->size, me = comm->rank;
    const size_t Pz = (size_t)P;

    /* What every rank needs to take part at all. */
    uint64_t *counts = workspace(w, WS_COUNTS, 2 * Pz, sizeof(uint64_t));
    size_t *sizes = workspace(w, WS_SIZES, 4 * Pz, sizeof(size_t));
    sar_status_t *records = workspace(w, WS_RECORDS, Pz, sizeof(sar_status_t));
    IGRAD_FAIL_IF(!counts || !sizes || !records, IGRAD_E_NOMEM,
                  CTX ": out of memory for the count arrays of %d ranks", P);
    uint64_t *send_counts = counts, *recv_counts = counts + P;
    size_t *send_nbytes = sizes, *send_displs = sizes + P;
    size_t *recv_nbytes = sizes + 2 * Pz, *recv_displs = sizes + 3 * Pz;

    sar_report_t rep = check_input(dense_count, k, in);
    memset(send_counts, 0, Pz * sizeof *send_counts);
    igrad__sar_entry_t *send = NULL;
    if (rep.reason == SAR_OK && k > 0) {
        send = workspace(w, WS_SEND, k, sizeof *send);
        if (!send) {
            rep.reason = SAR_NOMEM;
            rep.value = (uint64_t)k * sizeof *send;
        } else {
            /* group by owner, each group in input order */
            for (size_t i = 0; i < k; i++) send_counts[owner_of(dense_count, P, in[i].index)]++;
            size_t at = 0;
            for (int j = 0; j < P; j++) {
                send_displs[j] = at; /* entries for now */
                at += (size_t)send_counts[j];
            }
            for (size_t i = 0; i < k; i++)
                send[send_displs[owner_of(dense_count, P, in[i].index)]++] = in[i];
        }
    }

    /* Phase 1a: the counts. */
    for (int j = 0; j < P; j++) {
        send_nbytes[j] = recv_nbytes[j] = sizeof(uint64_t);
        send_displs[j] = recv_displs[j] = (size_t)j * sizeof(uint64_t);
    }
    IGRAD_CHECK(igrad__comm_alltoallv(comm, send_counts, send_nbytes, send_displs, recv_counts,
                                      recv_nbytes, recv_displs, IGRAD__MEM_HOST, NULL));
    uint64_t total = 0;
    for (int j = 0; j < P && rep.reason == SAR_OK; j++) {
        if (recv_counts[j] > (uint64_t)k) {
            rep.reason = SAR_RECV_COUNT;
            rep.where = (uint64_t)j;
            rep.value = recv_counts[j];
        } else if ((total += recv_counts[j]) > MAX_RECV_ENTRIES) {
            rep.reason = SAR_RECV_TOTAL;
            rep.value = total;
        }
    }

    /* Everything else this call needs, before the status exchange. */
    const size_t kout = igrad__sar_kout(k, P);
    const size_t block_nbytes = sizeof(sar_header_t) + kout * sizeof(igrad__sar_entry_t);
    igrad__sar_entry_t *recv = NULL, *sums = NULL, *rem = NULL, *result = NULL;
    uint64_t *keys = NULL;
    unsigned char *blocks = NULL;
    if (rep.reason == SAR_OK) {
        size_t n = (size_t)total;
        recv = workspace(w, WS_RECV, n, sizeof *recv);
        keys = workspace(w, WS_KEYS, n, sizeof *keys);
        sums = workspace(w, WS_SUMS, n, sizeof *sums);
        rem = workspace(w, WS_REMAINDER, n, sizeof *rem);
        blocks = kout > (SIZE_MAX - sizeof(sar_header_t)) / sizeof(igrad__sar_entry_t)
                     ? NULL
                     : workspace(w, WS_BLOCKS, Pz, block_nbytes);
        result = workspace(w, WS_RESULT, Pz * kout, sizeof *result);
        if (!recv || !keys || !sums || !rem || !blocks || !result) {
            rep.reason = SAR_NOMEM;
            rep.value = (uint64_t)n * 32 + (uint64_t)Pz * (block_nbytes + 8 * kout);
        }
    }

    /* Phase 1b: every rank's status; a problem anywhere stops every rank. */
    records[me].report = rep;
    records[me].k = (uint64_t)k;
    records[me].dense_count = dense_count;
    IGRAD_CHECK(igrad_comm_allgather(comm, &records[me], sizeof *records, records));
    w->bytes.status_recv = (uint64_t)(P - 1) * sizeof *records;
    for (int r = 1; r < P; r++) {
        IGRAD_FAIL_IF(records[r].dense_count != records[0].dense_count, IGRAD_E_MISMATCH,
                      CTX ": the index space differs: rank 0 has %" PRIu64 " entries, rank %d "
                      "has %" PRIu64, records[0].dense_count, r, records[r].dense_count);
        IGRAD_FAIL_IF(records[r].k != records[0].k, IGRAD_E_MISMATCH,
                      CTX ": k differs: rank 0 has %" PRIu64 ", rank %d has %" PRIu64,
                      records[0].k, r, records[r].k);
    }
    for (int r = 0; r < P; r++)
        if (records[r].report.reason != SAR_OK)
            return report_fail(&records[r].report, r, records[r].k, records[r].dense_count, P);

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
                                      recv_displs, IGRAD__MEM_HOST, NULL));

    /* Phase 2: check and reduce what this rank owns. */
    unsigned char *own = blocks + (size_t)me * block_nbytes;
    memset(own, 0, block_nbytes);
    sar_header_t head = {{0}, 0};
    uint64_t lo, hi;
    igrad__sar_range(dense_count, P, me, &lo, &hi);
    const size_t n = (size_t)total;
    for (size_t p = 0, from = 0; p < n && head.report.reason == SAR_OK; p++) {
        while (p * sizeof *recv >= recv_displs[from] + recv_nbytes[from]) from++;
        if (recv[p].index < lo || recv[p].index >= hi) {
            head.report.reason = SAR_RECV_INDEX;
            head.report.where = (uint64_t)from;
            head.report.value = recv[p].index;
        }
    }
    size_t nkept = 0, nrem = 0;
    if (head.report.reason == SAR_OK)
        reduce_owned(recv, n, kout, keys, sums, (igrad__sar_entry_t *)(own + sizeof head),
                     &nkept, rem, &nrem);
    head.nkept = nkept;
    memcpy(own, &head, sizeof head);

    /* Phase 3: every owner's kept entries to every rank. */
    IGRAD_CHECK(igrad_comm_allgather(comm, own, block_nbytes, blocks));
    w->bytes.gather_recv = (uint64_t)(P - 1) * block_nbytes;
    IGRAD_CHECK(collect_result(w, blocks, block_nbytes, P, k, kout, dense_count, result));
    w->remainder = rem;
    w->remainder_count = nrem;
    return IGRAD_OK;
}
