/*
 * mpi_sparse_allreduce.c — the sparse all-reduce (sparse_allreduce.c) and
 * the MPI alltoallv under mpirun (CTest: -np 2, 4 and 8): blocks of mixed
 * sizes with gaps, whole and cut into pieces, device buffers refused and a
 * stream ignored (host bytes only).
 *
 * Every rank draws every rank's input from (case, rank, position), so each
 * computes the brute-force reference alone: a dense sum in rank order over
 * the indices any rank sent, then per index range the top kout by |sum|
 * (a sort with a comparator; ties: lower index). Checked per case: result
 * and this rank's remainder bit for bit, the result the same on every rank,
 * conservation (each sent index's sum is in the result or in its owner's
 * remainder, exactly once), and the byte counts against the formula from
 * the inputs. Then failures: bad input on one rank, k differing, a
 * corrupted count and a corrupted index seen by one owner (the same error
 * on every rank) and a corrupted phase-3 block (that rank alone), each
 * followed by a clean call to show that no rank was left in a collective.
 * Corruption goes through a comm wrapped around the MPI comm's table.
 * Balanced split points (igrad__sar_t.balanced): a skewed index
 * distribution over several calls, each checked against the reference
 * on the split points the call used (read back from w->bounds and checked
 * to be those of a linear scan's ownership in the byte counts): equal
 * ranges on the first call, the same split points on every rank, the
 * busiest owner (w->balance, against the reference's counts) within 1.1x
 * the mean from the fourth call, while equal ranges on the same inputs
 * stay above 1.5x (the check fails without the balancing); then one rank
 * dropping its split points: every rank redoes phase 1 on equal ranges.
 * Last, a late rank: the alltoallv's timeout and the broken comm.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <mpi.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "igrad.h"
#include "mpi_util.h"
#include "comm/sparse_allreduce.h"

typedef enum input_kind {
    UNIFORM,   /* indices uniform over [0, D) */
    CLUSTERED, /* all in rank 0's range */
    EVEN,      /* only in the even ranks' ranges: the odd ones are empty */
    SAME,      /* every rank sends the same indices */
    TIES,      /* 16 indices, values in {-2..2}: cancellations and ties */
    TOP_EDGE,  /* D = 2^32, indices near both ends */
    SKEWED     /* 3/4 of the indices in the first 1/64 of [0, D), the rest uniform */
} input_kind_t;

typedef struct sar_case {
    const char *name;
    input_kind_t kind;
    uint64_t dense_count;
    size_t k;
} sar_case_t;

static const sar_case_t cases[] = {
    {"uniform", UNIFORM, 20000, 600},
    {"uniform, small k", UNIFORM, 1000, 3},
    {"clustered into one range", CLUSTERED, 5000, 200},
    {"empty ranges", EVEN, 4000, 150},
    {"same indices on every rank", SAME, 3000, 100},
    {"ties and cancellations", TIES, 64, 40},
    {"index space smaller than P", UNIFORM, 3, 5},
    {"2^32 index space", TOP_EDGE, UINT64_C(1) << 32, 64},
    {"k = 0", UNIFORM, 100, 0},
    {"skewed", SKEWED, 1u << 20, 4000},
};
enum { SKEWED_CASE = 9 };

/* Mixed into the inputs: the calls of the balanced test differ. */
static int salt = 0;

static float value_from(uint64_t h)
{
    /* [-4, 4) with 20 significant bits, never 0 */
    return ((float)(int64_t)(h >> 44) - 524288.0f) / 131072.0f + 1.0f / 1048576.0f;
}

static void make_input(const sar_case_t *c, int c_id, int rank, igrad__sar_entry_t *in)
{
    const uint64_t D = c->dense_count;
    for (size_t i = 0; i < c->k; i++) {
        uint64_t h = mix64(((uint64_t)(c_id + 64 * salt) << 48) ^ ((uint64_t)rank << 32) ^ i);
        uint64_t lo, hi, idx;
        switch (c->kind) {
        case CLUSTERED:
            igrad__sar_range(D, np, 0, &lo, &hi);
            idx = lo + h % (hi - lo);
            break;
        case EVEN: {
            int r = 2 * (int)(h % (uint64_t)((np + 1) / 2));
            igrad__sar_range(D, np, r, &lo, &hi);
            idx = lo + (h >> 8) % (hi - lo);
            break;
        }
        case SAME: idx = mix64(((uint64_t)c_id << 48) ^ i) % D; break;
        case TIES: idx = h % 16; break;
        case TOP_EDGE: idx = (h & 1) ? D - 1 - (h >> 1) % 1000 : (h >> 1) % 1000; break;
        case SKEWED: idx = (h & 3) ? (h >> 2) % (D / 64) : (h >> 2) % D; break;
        default: idx = h % D; break;
        }
        in[i].index = (uint32_t)idx;
        in[i].value = c->kind == TIES ? (float)((int)((h >> 20) % 5) - 2) : value_from(h);
    }
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The reference: every rank's input, summed in rank order. */
typedef struct reference {
    uint32_t *index; /* distinct indices sent by any rank, ascending */
    float *sum;      /* their sums: 0.0f, then each rank's values in order */
    size_t n;
    igrad__sar_entry_t *result, *remainder; /* expected */
    size_t result_count, remainder_count;
    uint64_t *count;                        /* count[from * np + to] */
} reference_t;

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static int by_magnitude(const void *a, const void *b)
{
    const igrad__sar_entry_t *x = a, *y = b;
    uint32_t mx = f32_bits(x->value) & 0x7fffffffu, my = f32_bits(y->value) & 0x7fffffffu;
    if (mx != my) return mx > my ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int by_index(const void *a, const void *b)
{
    const igrad__sar_entry_t *x = a, *y = b;
    return (x->index > y->index) - (x->index < y->index);
}

static size_t slot_of(const reference_t *ref, uint32_t index)
{
    const uint32_t *p = bsearch(&index, ref->index, ref->n, sizeof *p, cmp_u32);
    REQUIRE(p != NULL);
    return (size_t)(p - ref->index);
}

static int owner_in_test(const uint64_t *bounds, uint32_t index)
{
    for (int r = 0; r < np; r++)
        if (index >= bounds[r] && index < bounds[r + 1]) return r;
    REQUIRE(0);
    return -1;
}

/* The reference over the split points `bounds` (np + 1). */
static void reference_build(const sar_case_t *c, int c_id, const uint64_t *bounds,
                            reference_t *ref)
{
    const size_t k = c->k, kout = igrad__sar_kout(k, np);
    igrad__sar_entry_t *all = malloc((np * k + 1) * sizeof *all);
    uint32_t *idx = malloc((np * k + 1) * sizeof *idx);
    REQUIRE(all && idx);
    for (int r = 0; r < np; r++) make_input(c, c_id, r, all + (size_t)r * k);
    for (size_t i = 0; i < np * k; i++) idx[i] = all[i].index;
    qsort(idx, np * k, sizeof *idx, cmp_u32);
    size_t n = 0;
    for (size_t i = 0; i < np * k; i++)
        if (n == 0 || idx[i] != idx[n - 1]) idx[n++] = idx[i];
    ref->index = idx;
    ref->n = n;
    ref->sum = calloc(n + 1, sizeof *ref->sum);
    ref->count = calloc((size_t)np * np, sizeof *ref->count);
    REQUIRE(ref->sum && ref->count);
    for (int r = 0; r < np; r++)
        for (size_t i = 0; i < k; i++) {
            const igrad__sar_entry_t *e = &all[(size_t)r * k + i];
            ref->sum[slot_of(ref, e->index)] += e->value;
            ref->count[(size_t)r * np + owner_in_test(bounds, e->index)]++;
        }
    /* per range: its sent indices by |sum| desc, index asc; kout kept */
    ref->result = malloc((n + 1) * sizeof *ref->result);
    ref->remainder = malloc((n + 1) * sizeof *ref->remainder);
    igrad__sar_entry_t *cand = malloc((n + 1) * sizeof *cand);
    REQUIRE(ref->result && ref->remainder && cand);
    ref->result_count = ref->remainder_count = 0;
    for (int r = 0; r < np; r++) {
        const uint64_t lo = bounds[r], hi = bounds[r + 1];
        size_t m = 0;
        for (size_t s = 0; s < n; s++)
            if (ref->index[s] >= lo && ref->index[s] < hi)
                cand[m++] = (igrad__sar_entry_t){ref->index[s], ref->sum[s]};
        qsort(cand, m, sizeof *cand, by_magnitude);
        size_t keep = m < kout ? m : kout;
        qsort(cand, keep, sizeof *cand, by_index);
        memcpy(ref->result + ref->result_count, cand, keep * sizeof *cand);
        ref->result_count += keep;
        if (r == me) {
            qsort(cand + keep, m - keep, sizeof *cand, by_index);
            memcpy(ref->remainder, cand + keep, (m - keep) * sizeof *cand);
            ref->remainder_count = m - keep;
        }
    }
    free(cand);
    free(all);
}

static void reference_free(reference_t *ref)
{
    free(ref->index);
    free(ref->sum);
    free(ref->result);
    free(ref->remainder);
    free(ref->count);
}

static int same_entries(const igrad__sar_entry_t *a, const igrad__sar_entry_t *b, size_t n,
                        size_t *at)
{
    for (size_t i = 0; i < n; i++)
        if (a[i].index != b[i].index || f32_bits(a[i].value) != f32_bits(b[i].value)) {
            *at = i;
            return 0;
        }
    return 1;
}

/* The same bytes on every rank? */
static int same_everywhere(const void *data, size_t nbytes)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    const unsigned char *p = data;
    for (size_t i = 0; i < nbytes; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    uint64_t lo = h, hi = h;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

static void check_case(igrad_comm_t *comm, igrad__sar_t *w, int c_id, const char *label)
{
    const sar_case_t *c = &cases[c_id];
    const size_t k = c->k, kout = igrad__sar_kout(k, np);
    igrad__sar_entry_t *in = malloc((k + 1) * sizeof *in);
    REQUIRE(in);
    make_input(c, c_id, me, in);
    igrad_status_t st = igrad__sar_allreduce(w, comm, c->dense_count, k, in);
    CHECK(st == IGRAD_OK, "%s (%s): status %d: %s", c->name, label, (int)st,
          igrad_last_error());
    /* the split points the call used (equal ones where it failed); the
     * byte counts below check that the exchanges followed them */
    uint64_t *bounds = malloc(((size_t)np + 1) * sizeof *bounds);
    REQUIRE(bounds);
    igrad__sar_equal_bounds(c->dense_count, np, bounds);
    if (st == IGRAD_OK) {
        REQUIRE(w->bounds != NULL);
        memcpy(bounds, w->bounds, ((size_t)np + 1) * sizeof *bounds);
        CHECK(bounds[0] == 0 && bounds[np] == c->dense_count, "%s: split points [%" PRIu64
              ", %" PRIu64 "] do not cover [0, D)", c->name, bounds[0], bounds[np]);
        for (int r = 0; r < np; r++)
            CHECK(bounds[r] <= bounds[r + 1], "%s: split points descend at %d", c->name, r);
    }
    reference_t ref;
    reference_build(c, c_id, bounds, &ref);
    if (st == IGRAD_OK) {
        size_t at = 0;
        CHECK(w->result_count == ref.result_count, "%s: %zu result entries, expected %zu",
              c->name, w->result_count, ref.result_count);
        if (w->result_count == ref.result_count)
            CHECK(same_entries(w->result, ref.result, ref.result_count, &at),
                  "%s: result entry %zu is (%" PRIu32 ", %a), expected (%" PRIu32 ", %a)",
                  c->name, at, w->result[at].index, w->result[at].value,
                  ref.result[at].index, ref.result[at].value);
        CHECK(w->remainder_count == ref.remainder_count,
              "%s: %zu remainder entries, expected %zu", c->name, w->remainder_count,
              ref.remainder_count);
        if (w->remainder_count == ref.remainder_count)
            CHECK(same_entries(w->remainder, ref.remainder, ref.remainder_count, &at),
                  "%s: remainder entry %zu differs", c->name, at);
        CHECK(w->result_count <= (size_t)np * kout, "%s: %zu result entries > P*kout",
              c->name, w->result_count);
        CHECK(same_everywhere(w->result, w->result_count * sizeof *w->result),
              "%s: the result differs between ranks", c->name);

        /* conservation over this rank's range: each sent index once, with
         * its full sum, in the result or this rank's remainder */
        const uint64_t lo = bounds[me], hi = bounds[me + 1];
        unsigned char *seen = calloc(ref.n + 1, 1);
        REQUIRE(seen);
        int bad = 0;
        for (int part = 0; part < 2; part++) {
            const igrad__sar_entry_t *e = part ? w->remainder : w->result;
            size_t ne = part ? w->remainder_count : w->result_count;
            for (size_t i = 0; i < ne; i++) {
                if (e[i].index < lo || e[i].index >= hi) {
                    bad += part; /* a remainder outside the range is wrong */
                    continue;
                }
                size_t s = slot_of(&ref, e[i].index);
                bad += seen[s]++ != 0 || f32_bits(e[i].value) != f32_bits(ref.sum[s]);
            }
        }
        for (size_t s = 0; s < ref.n; s++)
            if (ref.index[s] >= lo && ref.index[s] < hi) bad += seen[s] != 1;
        CHECK(bad == 0, "%s: conservation broken at %d indices of [%" PRIu64 ", %" PRIu64 ")",
              c->name, bad, lo, hi);
        free(seen);

        /* bytes: the formula from every rank's inputs */
        uint64_t sent = 0, recvd = 0;
        for (int j = 0; j < np; j++) {
            if (j == me) continue;
            sent += 8 + 8 * ref.count[(size_t)me * np + j];
            recvd += 8 + 8 * ref.count[(size_t)j * np + me];
        }
        uint64_t gather = (uint64_t)(np - 1) * (64 + 8 * kout);
        /* phase 1 done twice (split points differed): its counts and
         * status exchanges once more */
        const uint64_t twice = (uint64_t)w->resplit;
        sent += twice * 8 * (uint64_t)(np - 1);
        recvd += twice * 8 * (uint64_t)(np - 1);
        CHECK(w->bytes.split_sent == sent && w->bytes.split_recv == recvd &&
                  w->bytes.status_recv == (uint64_t)(np - 1) * 40 * (1 + twice) &&
                  w->bytes.gather_recv == gather,
              "%s: bytes split %" PRIu64 "/%" PRIu64 " status %" PRIu64 " gather %" PRIu64
              ", expected %" PRIu64 "/%" PRIu64 " %d %" PRIu64,
              c->name, w->bytes.split_sent, w->bytes.split_recv, w->bytes.status_recv,
              w->bytes.gather_recv, sent, recvd, (np - 1) * 40, gather);
        if (me == 0 && c_id == 0 && strcmp(label, "plain") == 0) {
            uint64_t entries = w->bytes.split_sent - 8 * (uint64_t)(np - 1) +
                               8 * kout * (uint64_t)(np - 1);
            printf("%s, P %d, k %zu: rank 0 sends %" PRIu64 " entry bytes (phase 1 + phase 3),"
                   " ideal 2*8*k*(P-1)/P = %.0f; metadata %" PRIu64 " bytes\n",
                   c->name, np, k, entries, 16.0 * (double)k * (np - 1) / np,
                   8 * (uint64_t)(np - 1) + w->bytes.status_recv + 64 * (uint64_t)(np - 1));
        }

        /* the busiest receiver: each owner's entries from every rank */
        uint64_t most = 0, total = 0;
        int busiest = 0;
        for (int o = 0; o < np; o++) {
            uint64_t got = 0;
            for (int j = 0; j < np; j++) got += ref.count[(size_t)j * np + o];
            total += got;
            if (got > most) {
                most = got;
                busiest = o;
            }
        }
        CHECK(w->balance.recv_max == most && w->balance.recv_total == total &&
                  w->balance.busiest == busiest,
              "%s: busiest receiver %d with %" PRIu64 " of %" PRIu64 " entries, expected %d "
              "with %" PRIu64 " of %" PRIu64, c->name, w->balance.busiest, w->balance.recv_max,
              w->balance.recv_total, busiest, most, total);
    }
    reference_free(&ref);
    free(bounds);
    free(in);
}

/* ---- balanced split points ---------------------------------------------- */

static double max_over_mean(const igrad__sar_t *w)
{
    return w->balance.recv_total
               ? (double)w->balance.recv_max * np / (double)w->balance.recv_total
               : 0.0;
}

static void test_balanced(igrad_comm_t *comm)
{
    const sar_case_t *c = &cases[SKEWED_CASE];
    igrad__sar_t eq = {0}, bal = {0};
    bal.balanced = 1;
    uint64_t *equal = malloc(((size_t)np + 1) * sizeof *equal);
    REQUIRE(equal);
    igrad__sar_equal_bounds(c->dense_count, np, equal);
    for (int round = 0; round < 6; round++) {
        salt = round; /* new inputs from the same distribution */
        check_case(comm, &eq, SKEWED_CASE, "equal ranges");
        check_case(comm, &bal, SKEWED_CASE, "balanced");
        if (!bal.bounds || !eq.bounds) break;
        CHECK(memcmp(eq.bounds, equal, ((size_t)np + 1) * sizeof *equal) == 0,
              "round %d: equal ranges were not used without balancing", round);
        if (round == 0)
            CHECK(memcmp(bal.bounds, equal, ((size_t)np + 1) * sizeof *equal) == 0,
                  "the first balanced call did not use equal ranges");
        CHECK(same_everywhere(bal.bounds, ((size_t)np + 1) * sizeof *bal.bounds),
              "round %d: the split points differ between ranks", round);
        double r_eq = max_over_mean(&eq), r_bal = max_over_mean(&bal);
        if (me == 0)
            printf("skewed, P %d, call %d: busiest receiver / mean = %.3f with equal ranges, "
                   "%.3f balanced\n", np, round, r_eq, r_bal);
        if (np > 1) {
            CHECK(r_eq > 1.5, "round %d: equal ranges at %.3f x the mean, expected > 1.5 "
                  "(the skew of the test input)", round, r_eq);
            if (round >= 3)
                CHECK(r_bal <= 1.1, "round %d: balanced busiest receiver %.3f x the mean, "
                      "expected <= 1.1", round, r_bal);
        }
    }
    /* one rank drops its split points (as after a call that failed on it
     * alone): every rank does phase 1 again on equal ranges, and the call
     * is right */
    if (me == np - 1) bal.next_valid = 0;
    salt = 6;
    check_case(comm, &bal, SKEWED_CASE, "one rank back on equal ranges");
    CHECK(bal.resplit == (np > 1), "resplit %d after one rank dropped its split points",
          bal.resplit);
    if (bal.bounds)
        CHECK(memcmp(bal.bounds, equal, ((size_t)np + 1) * sizeof *equal) == 0,
              "the call after the split points differed did not use equal ranges");
    salt = 0;
    igrad__sar_clear(&eq);
    igrad__sar_clear(&bal);
    free(equal);
}

/* ---- failures ----------------------------------------------------------- */

/* A comm around the MPI comm's table that corrupts what this rank
 * receives in one chosen exchange. */
typedef enum corruption {
    CORRUPT_NONE,
    CORRUPT_COUNT,  /* the first alltoallv: a count from a peer */
    CORRUPT_INDEX,  /* the second alltoallv: an index from a peer */
    CORRUPT_BLOCK   /* the second allgather: a peer's phase-3 block */
} corruption_t;

typedef struct wrap {
    igrad_comm_t *inner;
    int victim;           /* the rank whose received bytes are changed */
    corruption_t what;
    size_t k;             /* for the corrupt count */
    int alltoallvs, allgathers;
    int done;             /* 1 once the bytes were changed */
} wrap_t;

static igrad_status_t wrap_allgather(igrad_comm_t *comm, const void *send, size_t nbytes,
                                     void *recv)
{
    wrap_t *wr = comm->impl;
    IGRAD_CHECK(wr->inner->vt->allgather(wr->inner, send, nbytes, recv));
    if (++wr->allgathers == 2 && wr->what == CORRUPT_BLOCK && comm->rank == wr->victim) {
        int peer = (comm->rank + 1) % comm->size;
        unsigned char *block = (unsigned char *)recv + (size_t)peer * nbytes;
        uint64_t nkept;
        memcpy(&nkept, block + 24, sizeof nkept); /* after the 24-byte report */
        nkept += 1000;
        memcpy(block + 24, &nkept, sizeof nkept);
        wr->done = 1;
    }
    return IGRAD_OK;
}

static igrad_status_t wrap_allreduce(igrad_comm_t *comm, const void *send, void *recv,
                                     size_t count, igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    wrap_t *wr = comm->impl;
    return wr->inner->vt->allreduce(wr->inner, send, recv, count, dtype, op);
}

static igrad_status_t wrap_bcast(igrad_comm_t *comm, void *buf, size_t nbytes, int root)
{
    wrap_t *wr = comm->impl;
    return wr->inner->vt->bcast(wr->inner, buf, nbytes, root);
}

static igrad_status_t wrap_barrier(igrad_comm_t *comm)
{
    wrap_t *wr = comm->impl;
    return wr->inner->vt->barrier(wr->inner);
}

static igrad_status_t wrap_alltoallv(igrad_comm_t *comm, const void *send,
                                     const size_t *send_nbytes, const size_t *send_displs,
                                     void *recv, const size_t *recv_nbytes,
                                     const size_t *recv_displs, void *stream)
{
    wrap_t *wr = comm->impl;
    IGRAD_CHECK(wr->inner->vt->alltoallv(wr->inner, send, send_nbytes, send_displs, recv,
                                         recv_nbytes, recv_displs, stream));
    ++wr->alltoallvs;
    if (comm->rank != wr->victim) return IGRAD_OK;
    int peer = (comm->rank + 1) % comm->size;
    if (wr->alltoallvs == 1 && wr->what == CORRUPT_COUNT) {
        uint64_t bad = wr->k + 7;
        memcpy((unsigned char *)recv + recv_displs[peer], &bad, sizeof bad);
        wr->done = 1;
    } else if (wr->alltoallvs == 2 && wr->what == CORRUPT_INDEX) {
        for (int s = 1; s < comm->size && !wr->done; s++) {
            int j = (comm->rank + s) % comm->size;
            if (recv_nbytes[j] == 0) continue;
            /* index 0 is outside every range but rank 0's */
            uint32_t bad = comm->rank == 0 ? UINT32_MAX : 0;
            memcpy((unsigned char *)recv + recv_displs[j], &bad, sizeof bad);
            wr->done = 1;
        }
    }
    return IGRAD_OK;
}

static const igrad__comm_vtable_t wrap_vtable = {
    .spaces = IGRAD__MEM_BIT(IGRAD__MEM_HOST),
    .allgather = wrap_allgather,
    .allreduce = wrap_allreduce,
    .bcast = wrap_bcast,
    .barrier = wrap_barrier,
    .alltoallv = wrap_alltoallv,
};

/* Every rank got `want` with the same message mentioning `text`. */
static void check_same_failure(igrad_status_t st, igrad_status_t want, const char *text,
                               const char *what)
{
    CHECK(st == want, "%s: status %d (%s), expected %d: %s", what, (int)st,
          igrad_status_str(st), (int)want, igrad_last_error());
    char msg[512] = {0};
    snprintf(msg, sizeof msg, "%s", igrad_last_error());
    CHECK(strstr(msg, text) != NULL, "%s: message \"%s\" does not mention \"%s\"", what, msg,
          text);
    CHECK(same_everywhere(msg, sizeof msg), "%s: the message differs between ranks: %s",
          what, msg);
}

static void test_failures(igrad_comm_t *mpi)
{
    igrad__sar_t w = {0};
    /* balanced: a call that fails on one rank alone (a corrupt phase-3
     * block) leaves that rank on equal ranges and the others on balanced
     * ones; the clean call after it must still succeed (phase 1 again) */
    w.balanced = 1;
    const int c_id = 0;
    const sar_case_t *c = &cases[c_id];
    igrad__sar_entry_t *in = malloc((c->k + 1) * sizeof *in);
    REQUIRE(in);
    char text[160];

    /* bad input on the last rank */
    make_input(c, c_id, me, in);
    if (me == np - 1) in[5].index = (uint32_t)c->dense_count;
    snprintf(text, sizeof text, "rank %d's input entry 5 has index %" PRIu64, np - 1,
             c->dense_count);
    check_same_failure(igrad__sar_allreduce(&w, mpi, c->dense_count, c->k, in),
                       IGRAD_E_INVALID, text, "bad input index");
    make_input(c, c_id, me, in);
    if (me == np - 1) in[3].value = NAN;
    check_same_failure(igrad__sar_allreduce(&w, mpi, c->dense_count, c->k, in),
                       IGRAD_E_INVALID, "input entry 3 has a non-finite value", "NaN input");
    CHECK(w.result == NULL && w.result_count == 0, "a failed call left a result");
    check_case(mpi, &w, c_id, "after bad input");

    /* k and D must agree */
    make_input(c, c_id, me, in);
    snprintf(text, sizeof text, "k differs: rank 0 has %zu, rank 1 has %zu", c->k - 1, c->k);
    check_same_failure(igrad__sar_allreduce(&w, mpi, c->dense_count, me == 0 ? c->k - 1 : c->k,
                                            in),
                       IGRAD_E_MISMATCH, text, "k differs");
    check_same_failure(igrad__sar_allreduce(&w, mpi, c->dense_count + (me == np - 1), c->k,
                                            in),
                       IGRAD_E_MISMATCH, "the index space differs", "D differs");
    check_case(mpi, &w, c_id, "after a mismatch");

    /* corrupted bytes, seen by the last rank */
    static const struct {
        corruption_t what;
        igrad_status_t every;  /* on every rank */
        const char *text;
    } corrupt[] = {
        {CORRUPT_COUNT, IGRAD_E_COMM, "received a count of"},
        {CORRUPT_INDEX, IGRAD_E_COMM, "outside its range"},
        {CORRUPT_BLOCK, IGRAD_OK, "reduced block says"},
    };
    for (size_t t = 0; t < sizeof corrupt / sizeof corrupt[0]; t++) {
        wrap_t wr = {mpi, np - 1, corrupt[t].what, c->k, 0, 0, 0};
        igrad_comm_t *comm = NULL;
        REQUIRE(igrad__comm_new(&wrap_vtable, "mpi-wrapped", me, np, &wr, &comm) == IGRAD_OK);
        make_input(c, c_id, me, in);
        igrad_status_t st = igrad__sar_allreduce(&w, comm, c->dense_count, c->k, in);
        CHECK(me != np - 1 || wr.done, "corruption %zu was not applied", t);
        if (corrupt[t].every != IGRAD_OK) {
            if (corrupt[t].what == CORRUPT_COUNT)
                snprintf(text, sizeof text,
                         "rank %d received a count of %zu entries from rank 0, more than k",
                         np - 1, c->k + 7);
            else
                snprintf(text, sizeof text, "rank %d received index 0 from rank 0, outside",
                         np - 1);
            check_same_failure(st, corrupt[t].every, text, corrupt[t].text);
        } else if (me == np - 1) {
            CHECK(st == IGRAD_E_COMM && strstr(igrad_last_error(), corrupt[t].text),
                  "corrupt block: status %d: %s", (int)st, igrad_last_error());
            CHECK(w.result == NULL && w.remainder == NULL, "a failed call left a result");
        } else {
            CHECK(st == IGRAD_OK, "corrupt block on rank %d: rank %d got %d: %s", np - 1, me,
                  (int)st, igrad_last_error());
        }
        igrad_comm_free(comm);
        check_case(mpi, &w, c_id, corrupt[t].text);
    }
    igrad__sar_clear(&w);
    free(in);
}

/* ---- the alltoallv itself ------------------------------------------------ */

/* Block sizes from (from, to), 0 included; max_count cuts them into pieces. */
static void test_alltoallv(igrad_comm_t *comm, size_t max_count)
{
    size_t *sn = calloc(4 * (size_t)np, sizeof *sn);
    REQUIRE(sn);
    size_t *sd = sn + np, *rn = sn + 2 * np, *rd = sn + 3 * np;
    size_t st = 0, rt = 0;
    for (int j = 0; j < np; j++) {
        sn[j] = mix64((uint64_t)me * 131 + (uint64_t)j) % 40;
        rn[j] = mix64((uint64_t)j * 131 + (uint64_t)me) % 40;
        sd[j] = st + 3; /* gaps between blocks */
        st += sn[j] + 3;
        rd[j] = rt;
        rt += rn[j];
    }
    unsigned char *send = malloc(st + 1), *recv = malloc(rt + 1);
    REQUIRE(send && recv);
    for (int j = 0; j < np; j++)
        for (size_t i = 0; i < sn[j]; i++) send[sd[j] + i] = (unsigned char)(me * 31 + j * 7 + i);
    REQUIRE(igrad__comm_mpi_set_max_count(comm, max_count) == IGRAD_OK);
    CHECK_OK(igrad__comm_alltoallv(comm, send, sn, sd, recv, rn, rd, IGRAD__MEM_HOST, NULL));
    int bad = 0;
    for (int j = 0; j < np; j++)
        for (size_t i = 0; i < rn[j]; i++)
            bad += recv[rd[j] + i] != (unsigned char)(j * 31 + me * 7 + i);
    CHECK(bad == 0, "alltoallv (pieces of %zu bytes): %d bytes wrong", max_count, bad);
    /* host bytes only: device buffers are refused on every rank alike,
     * before any message, so the comm stays matched; recv is untouched */
    memset(recv, 0xee, rt + 1);
    CHECK_STATUS(igrad__comm_alltoallv(comm, send, sn, sd, recv, rn, rd, IGRAD__MEM_DEVICE, NULL),
                 IGRAD_E_UNSUPPORTED);
    CHECK(strstr(igrad_last_error(),
                 "igrad__comm_alltoallv: communicator 'mpi' cannot take device buffers"),
          "message: %s", igrad_last_error());
    int touched = 0;
    for (size_t i = 0; i <= rt; i++) touched += recv[i] != 0xee;
    CHECK(touched == 0, "refused alltoallv wrote %d bytes", touched);
    /* a host backend ignores the stream: any value runs the same exchange */
    static char not_a_stream;
    CHECK_OK(igrad__comm_alltoallv(comm, send, sn, sd, recv, rn, rd, IGRAD__MEM_HOST,
                                   &not_a_stream));
    bad = 0;
    for (int j = 0; j < np; j++)
        for (size_t i = 0; i < rn[j]; i++)
            bad += recv[rd[j] + i] != (unsigned char)(j * 31 + me * 7 + i);
    CHECK(bad == 0, "alltoallv with a stream (pieces of %zu bytes): %d bytes wrong", max_count,
          bad);
    REQUIRE(igrad__comm_mpi_set_max_count(comm, INT_MAX) == IGRAD_OK);
    free(send);
    free(recv);
    free(sn);
}

/* Rank 0 comes late: the others' alltoallv ends with IGRAD_E_TIMEOUT
 * within the comm's limit and breaks their comm (the sparse all-reduce is
 * refused on it); rank 0's late call then matches what they left posted. */
static void test_alltoallv_timeout(void)
{
    const double limit_s = 1.0, late_s = 3.0;
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    uint64_t *buf = calloc(2 * (size_t)np, sizeof *buf);
    size_t *sizes = calloc(2 * (size_t)np, sizeof *sizes);
    REQUIRE(buf && sizes);
    for (int j = 0; j < np; j++) {
        buf[j] = 1000 * (uint64_t)me + (uint64_t)j;
        sizes[j] = sizeof *buf;
        sizes[np + j] = (size_t)j * sizeof *buf;
    }
    CHECK_OK(igrad_comm_set_timeout(comm, limit_s));
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (me == 0) {
        while (MPI_Wtime() - t0 < late_s) {
            struct timespec ts = {0, 10000000L};
            nanosleep(&ts, NULL);
        }
        CHECK_OK(igrad__comm_alltoallv(comm, buf, sizes, sizes + np, buf + np, sizes,
                                       sizes + np, IGRAD__MEM_HOST, NULL));
        for (int j = 0; j < np; j++)
            CHECK(buf[np + j] == 1000 * (uint64_t)j, "late alltoallv: block %d holds %" PRIu64,
                  j, buf[np + j]);
        igrad_comm_free(comm);
    } else {
        CHECK_STATUS(igrad__comm_alltoallv(comm, buf, sizes, sizes + np, buf + np, sizes,
                                           sizes + np, IGRAD__MEM_HOST, NULL),
                     IGRAD_E_TIMEOUT);
        double waited = MPI_Wtime() - t0;
        CHECK(waited >= limit_s && waited < late_s - 0.5, "timed out after %.3f s, limit %.1f s",
              waited, limit_s);
        CHECK(strstr(igrad_last_error(), "alltoallv did not complete within 1 s"),
              "message: %s", igrad_last_error());
        igrad__sar_t w = {0};
        igrad__sar_entry_t one = {0, 1.0f};
        CHECK_STATUS(igrad__sar_allreduce(&w, comm, 10, 1, &one), IGRAD_E_STATE);
        CHECK(strstr(igrad_last_error(), "unusable"), "message: %s", igrad_last_error());
        igrad__sar_clear(&w);
        igrad_comm_free(comm); /* broken: its MPI duplicate is left to MPI */
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(buf);
    free(sizes);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    /* a rank left behind in a collective fails the test instead of hanging */
    REQUIRE(igrad_comm_set_timeout(comm, 60.0) == IGRAD_OK);

    test_alltoallv(comm, INT_MAX);
    test_alltoallv(comm, 3);

    igrad__sar_t w = {0};
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++)
        check_case(comm, &w, c, "plain");
    /* entries cut into MPI pieces of 5 bytes, mid-entry */
    REQUIRE(igrad__comm_mpi_set_max_count(comm, 5) == IGRAD_OK);
    check_case(comm, &w, 0, "pieces of 5 bytes");
    check_case(comm, &w, 2, "pieces of 5 bytes");
    REQUIRE(igrad__comm_mpi_set_max_count(comm, INT_MAX) == IGRAD_OK);
    igrad__sar_clear(&w);
    test_balanced(comm);

    test_failures(comm);
    test_alltoallv_timeout();

    igrad_comm_free(comm);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("mpi_sparse_allreduce: %d ranks, %d failed checks\n", np, total);
    MPI_Finalize();
    return total ? 1 : 0;
}
