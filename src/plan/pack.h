/*
 * pack.h — internal API of bucket packing (DESIGN.md §3, "Packing"):
 * which bucket each block of a step's payload travels in.
 *
 * Lives here: blocks (a tensor's selection cut at block_entries), their
 * stable keys, the five policies (direct, sequential, greedy, risk,
 * contiguous), the direct policy's fixed map, the risk policy's size
 * history, grouping blocks by bucket, and load metrics. Does not live here:
 * which tensors are sent and with which budget (schedule.h), copying
 * entries into bucket buffers and the collectives (engine.c, comm*.c).
 *
 * How the engine uses it:
 *   setup, once:
 *     full[]  = blocks of ALL tensors at their per-step budget k
 *     igrad__pack_map_build(full, nfull, B, &map)        (policy direct)
 *     keys[]  = keys of every block any step can have (per tensor, enough
 *               blocks for max(k, k_rel) entries)
 *     igrad__pack_history_init(&hist, keys, nkeys)       (policy risk)
 *     scratch = malloc(igrad__pack_scratch_nbytes(nkeys, B))
 *   every step:
 *     blocks[] = for each sent tensor t (in a fixed order, identical on all
 *                ranks): igrad__pack_split(t, entries, block_entries,
 *                entry_nbytes, ready_t, blocks + m)
 *     igrad__pack_plan(&cfg, blocks, m, scratch, nbytes, bucket, loads)
 *     igrad__pack_bucket_order(bucket, m, B, start, order)  blocks by bucket
 *     igrad__pack_metrics(loads, B, &metrics)
 *     ... collectives; then igrad__pack_history_update(&hist, blocks, m)
 *
 * Empty buckets: a bucket whose load is 0 carries nothing and should issue
 * no collective (all ranks see the same loads, so they skip it together).
 * Fewer blocks than buckets always leaves B - nblocks buckets empty; the
 * sequential and direct policies can leave more. The metrics report them.
 *
 * Determinism: every policy orders blocks by a total order (cost or
 * readiness, then key, then position in the input) and breaks bucket ties
 * by the lower bucket index, so the plan is a pure function of the block
 * list (and, for risk, the history), identical on every rank. Only
 * setup-time calls allocate; igrad__pack_plan() allocates only when the
 * caller passes no scratch.
 */
#ifndef IGRAD_PACK_H
#define IGRAD_PACK_H

#include "core/internal.h"

/* Buckets above this are refused; the bound also keeps load * nbuckets
 * products of the sequential policy inside int64. */
#define IGRAD__PACK_MAX_BUCKETS 4096

/* A stable block key: (tensor index, block index within the tensor),
 * ordered by tensor, then block. */
static inline uint64_t igrad__pack_key(uint32_t tensor, uint32_t block)
{
    return ((uint64_t)tensor << 32) | (uint64_t)block;
}
static inline uint32_t igrad__pack_key_tensor(uint64_t key) { return (uint32_t)(key >> 32); }
static inline uint32_t igrad__pack_key_block(uint64_t key) { return (uint32_t)key; }

/* One block of a step's payload. */
typedef struct igrad__pack_block {
    uint64_t key;   /* igrad__pack_key(tensor, block) */
    int64_t nbytes; /* wire bytes this step: entries * (index + value bytes), >= 0 */
    int64_t ready;  /* backward readiness: smaller = gradient ready earlier
                       (the engine passes reverse layout order) */
    int64_t entries;/* entries in the block (informational; not used by policies) */
} igrad__pack_block_t;

/* @return the number of blocks a selection of `entries` splits into:
 * ceil(entries / block_entries); 0 for entries <= 0. block_entries <= 0
 * means "never cut" (one block). */
int64_t igrad__pack_split_count(int64_t entries, int64_t block_entries);

/* Writes the blocks of one tensor's selection into out[0 ..
 * igrad__pack_split_count(entries, block_entries)): block b holds entries
 * [b*block_entries, min(entries, (b+1)*block_entries)), costs that many *
 * entry_nbytes bytes, has key (tensor, b) and readiness `ready`.
 * For a row-wise selection the engine may round block_entries to a multiple
 * of the entries per row so blocks hold whole rows. @return blocks written. */
int64_t igrad__pack_split(uint32_t tensor, int64_t entries, int64_t block_entries,
                          int64_t entry_nbytes, int64_t ready, igrad__pack_block_t *out);

/* The direct policy's fixed assignment: keys ascending, each with a bucket.
 * Built once from the full layout; owns its arrays. */
typedef struct igrad__pack_map {
    size_t count;
    int nbuckets;     /* the B it was built for */
    uint64_t *key;    /* [count], ascending, unique */
    int *bucket;      /* [count] */
} igrad__pack_map_t;

/* Builds the direct map: the sequential policy applied to `full` (the blocks
 * of all tensors at their full budget), stored by key. Keys must be unique.
 * @return IGRAD_E_INVALID (bad nbuckets, duplicate key, negative size) or
 * IGRAD_E_NOMEM. On failure *map is left empty. */
igrad_status_t igrad__pack_map_build(const igrad__pack_block_t *full, size_t nfull,
                                     int nbuckets, igrad__pack_map_t *map);
/* Frees the arrays of a map (a zeroed map or NULL is a no-op). */
void igrad__pack_map_free(igrad__pack_map_t *map);
/* @return the bucket the map gives a key: its own entry, or, for a key the
 * full layout did not have (e.g. a release block past the tensor's full
 * budget), the entry of the nearest smaller key (normally the same
 * tensor's last block), or the first entry's bucket when there is none.
 * An empty map gives 0. O(log count). */
int igrad__pack_map_lookup(const igrad__pack_map_t *map, uint64_t key);
/* Chains the map into a hash (agreement check across ranks). */
uint64_t igrad__pack_map_hash(uint64_t h, const igrad__pack_map_t *map);

/* The risk policy's history: per key, Welford running mean and sum of
 * squared deviations of the block's size over the steps it was recorded.
 * Plain arrays, so the engine saves and restores them in its state file
 * (write count, then the four arrays; to restore, init with the keys and
 * copy n, mean, m2 back). Updated from byte counts only, so identical on
 * every rank. */
typedef struct igrad__pack_history {
    size_t count;
    uint64_t *key;  /* [count], ascending, unique */
    int64_t *n;     /* observations */
    double *mean;   /* running mean of nbytes */
    double *m2;     /* sum of squared deviations from the mean */
} igrad__pack_history_t;

/* Allocates a history for `count` keys (copied and sorted; duplicates are
 * refused with IGRAD_E_INVALID), all without observations. */
igrad_status_t igrad__pack_history_init(igrad__pack_history_t *hist, const uint64_t *keys,
                                        size_t count);
void igrad__pack_history_free(igrad__pack_history_t *hist);
/* @return the index of a key in the history, or -1. O(log count). */
int64_t igrad__pack_history_find(const igrad__pack_history_t *hist, uint64_t key);
/* Records one step: each block's nbytes is an observation of its key.
 * @return IGRAD_E_INVALID naming the first key the history does not have;
 * blocks before it were recorded (the engine sizes the key set so this
 * does not happen). */
igrad_status_t igrad__pack_history_update(igrad__pack_history_t *hist,
                                          const igrad__pack_block_t *blocks, size_t nblocks);
/* The risk policy's weight of the spread: a block costs mean + 1.0 * std
 * of its observed sizes (the one value the policy was measured with). */
#define IGRAD__PACK_RISK_LAMBDA 1.0

/* The risk cost of a block: mean + lambda * std (population std,
 * sqrt(m2 / n)) of its history, or `nbytes` when the key has no
 * observation (or hist is NULL). */
double igrad__pack_history_cost(const igrad__pack_history_t *hist, uint64_t key,
                                int64_t nbytes, double lambda);
/* Chains the history into a hash (agreement check across ranks). */
uint64_t igrad__pack_history_hash(uint64_t h, const igrad__pack_history_t *hist);

/* What igrad__pack_plan() needs besides the blocks. */
typedef struct igrad__pack_config {
    igrad_pack_policy_t policy;
    int nbuckets;                         /* B, 1..IGRAD__PACK_MAX_BUCKETS */
    const igrad__pack_history_t *history; /* risk: NULL = no history (= greedy) */
    const igrad__pack_map_t *map;         /* direct: required, built for nbuckets */
} igrad__pack_config_t;

/* Scratch bytes igrad__pack_plan() needs for up to max_blocks blocks. */
size_t igrad__pack_scratch_nbytes(size_t max_blocks, int nbuckets);

/* Assigns each of the nblocks blocks to a bucket in [0, nbuckets):
 *   direct      bucket = igrad__pack_map_lookup(map, key)
 *   sequential  blocks in readiness order (ready, then key); a block joins
 *               the current bucket, and once that bucket's load reaches
 *               total/B (load * B >= total) the next block opens the next
 *               bucket; the last bucket takes the rest. "Reaches" rather
 *               than "passes": a bucket filled exactly to its share is full
 *               (as in DDP's bucket_cap), else B equal blocks would pile
 *               two into the first bucket and leave the last one empty.
 *   greedy      LPT: blocks by decreasing nbytes (ties: lower key), each
 *               into the bucket with the least load so far (ties: lower
 *               bucket index).
 *   risk        as greedy, with cost igrad__pack_history_cost() in place of
 *               nbytes (the LPT loads are sums of those costs).
 *   contiguous  blocks in readiness order split into consecutive runs,
 *               bucket j holding run j, minimising the largest bucket
 *               (exact: binary search on the integer answer with a greedy
 *               feasibility test). Among optimal splits it ends bucket j
 *               where the running total is closest to (j+1)/B of the
 *               total (ties: the earlier cut), and never leaves a bucket empty
 *               when nblocks >= B. With fewer blocks, block i of the
 *               readiness order gets bucket i.
 * bucket[nblocks] receives the assignment (indexed like blocks). loads
 * (may be NULL) receives nbuckets sums of the actual nbytes.
 * scratch: at least igrad__pack_scratch_nbytes(nblocks, nbuckets) bytes,
 * 8-byte aligned; NULL makes the call allocate (not for per-step use).
 * O(n log n) (contiguous: O(n log total_bytes)); no allocation with scratch.
 * @return IGRAD_E_INVALID (bad policy or nbuckets, negative nbytes, total
 * too large, small scratch, direct without a map for nbuckets)
 * or IGRAD_E_NOMEM (only with scratch NULL). */
igrad_status_t igrad__pack_plan(const igrad__pack_config_t *cfg,
                                const igrad__pack_block_t *blocks, size_t nblocks,
                                void *scratch, size_t scratch_nbytes, int *bucket,
                                int64_t *loads);

/* Groups blocks by bucket (counting sort, stable: within a bucket, blocks
 * keep their input order). start[nbuckets + 1]: blocks of bucket j are
 * order[start[j] .. start[j+1]). order[nblocks] receives block indices.
 * Buckets outside [0, nbuckets) are refused with IGRAD_E_INVALID. O(n + B). */
igrad_status_t igrad__pack_bucket_order(const int *bucket, size_t nblocks, int nbuckets,
                                        size_t *start, size_t *order);

/* igrad_pack_metrics_compute() on integer loads (what igrad__pack_plan()
 * reports), without a conversion array. */
igrad_status_t igrad__pack_metrics(const int64_t *loads, int nbuckets,
                                   igrad_pack_metrics_t *out);

#endif /* IGRAD_PACK_H */
